/* plan.c - the plan API the rest of tpshard calls: the built-in plans
 * (plans/NAME.yaml embedded in lib/plans_gen.c) and their queries, a plan file
 * loaded from disk, family detection from config.json's architectures and
 * model_type, the plan's name and description, and tps_plan_free. Reading
 * the YAML is plan_yaml.c's; matching, conditions and checks plan_match.c's;
 * row-count expressions plan_expr.c's; layout files lspec.c's. */
#include "plan_int.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

/* The table tools/embed.sh generates into lib/plans_gen.c. Its struct is
 * untagged there; an untagged struct with the same members is compatible
 * across translation units (C11 6.2.7). */
typedef struct {
    const char *name;
    const char *text;
    size_t len;
} builtin_plan;
extern const builtin_plan tps_builtin_plans[];
extern const size_t tps_builtin_plans_n;

/* ------------------------------------------------------------------ plan API */

void tps_plan_free(tps_plan *p)
{
    if (!p) return;
    for (size_t i = 0; i < p->npacked; i++) {
        tps_pl_strv_free(p->packed[i].patterns, p->packed[i].npat);
        for (size_t j = 0; j < p->packed[i].nsec; j++) {
            free(p->packed[i].sec[j].name);
            free(p->packed[i].sec[j].rows);
        }
        free(p->packed[i].sec);
    }
    free(p->packed);
    for (size_t i = 0; i < p->nshapes; i++) {
        tps_pl_strv_free(p->shapes[i].patterns, p->shapes[i].npat);
        free(p->shapes[i].rows);
        free(p->shapes[i].cols);
    }
    free(p->shapes);
    tps_pl_strv_free(p->layers, p->nlayers);
    free(p->name);
    free(p->description);
    free(p->label);
    free(p->text);
    tps_pl_strv_free(p->architectures, p->narch);
    tps_pl_strv_free(p->model_types, p->nmt);
    for (size_t i = 0; i < p->nrules; i++) {
        tps_pl_strv_free(p->rules[i].patterns, p->rules[i].npat);
        if (p->rules[i].when) {
            tps_pl_cond_clear(p->rules[i].when);
            free(p->rules[i].when);
        }
        free(p->rules[i].heads);
    }
    tps_pl_strv_free(p->untie_embedding, p->nuntie);
    tps_pl_strv_free(p->untie_head, p->nuntie);
    free(p->rules);
    for (size_t i = 0; i < p->nchecks; i++) {
        free(p->checks[i].field);
        tps_pl_cond_clear(&p->checks[i].cond);
        free(p->checks[i].reason);
    }
    free(p->checks);
    free(p);
}

tps_err tps_plan_load(tps_ctx *ctx, const char *path, tps_plan **out)
{
    struct stat st;
    char *buf = NULL;
    size_t len = 0;
    tps_err rc;

    if (!out) return tps_fail(ctx, TPS_E_ARG, "tps_plan_load: out is NULL");
    *out = NULL;
    if (!path) return tps_fail(ctx, TPS_E_ARG, "tps_plan_load: path is NULL");
    /* Checked here so an oversized plan gets the plan limit's message rather
     * than a generic read error. */
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode))
            return tps_fail(ctx, TPS_E_ARG, "%s: is a directory, not a plan file", path);
        if (S_ISREG(st.st_mode) && (unsigned long long)st.st_size > PLAN_MAX_BYTES)
            return tps_fail(ctx, TPS_E_PLAN, "%s: plan is %lld bytes, more than the limit of 1 MiB",
                            path, (long long)st.st_size);
    }
    TPS_TRY(tps_read_file(ctx, path, PLAN_MAX_BYTES, &buf, &len));
    rc = tps_plan_parse(ctx, path, buf, len, out);
    free(buf);
    return rc;
}

const char *tps_plan_name(const tps_plan *p)
{
    return p && p->name ? p->name : "";
}

const char *tps_plan_description(const tps_plan *p)
{
    return p && p->description ? p->description : "";
}

size_t tps_plan_builtin_count(void)
{
    return tps_builtin_plans_n;
}

const char *tps_plan_builtin_name(size_t i)
{
    return i < tps_builtin_plans_n ? tps_builtin_plans[i].name : NULL;
}

const char *tps_plan_builtin_text(size_t i, size_t *len)
{
    if (i >= tps_builtin_plans_n) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = tps_builtin_plans[i].len;
    return tps_builtin_plans[i].text;
}

/* "gemma3, gemma4, llama, qwen2, qwen3" (owned), for error messages. */
static char *families_list(void)
{
    size_t n = 1;
    for (size_t i = 0; i < tps_builtin_plans_n; i++) n += strlen(tps_builtin_plans[i].name) + 2;
    char *s = tps_xmalloc(n), *w = s;
    if (!s) return NULL;
    *w = '\0';
    for (size_t i = 0; i < tps_builtin_plans_n; i++)
        w += sprintf(w, "%s%s", i ? ", " : "", tps_builtin_plans[i].name);
    return s;
}

static tps_err builtin_parse(tps_ctx *ctx, size_t i, tps_plan **out)
{
    char *label = tps_asprintf("plans/%s.yaml", tps_builtin_plans[i].name);
    if (!label) return tps_pl_nomem(ctx);
    tps_err rc = tps_plan_parse(ctx, label, tps_builtin_plans[i].text, tps_builtin_plans[i].len,
                                out);
    free(label);
    return rc;
}

tps_err tps_plan_builtin(tps_ctx *ctx, const char *family, tps_plan **out)
{
    if (!out) return tps_fail(ctx, TPS_E_ARG, "tps_plan_builtin: out is NULL");
    *out = NULL;
    for (size_t i = 0; family && i < tps_builtin_plans_n; i++)
        if (!strcasecmp(tps_builtin_plans[i].name, family)) return builtin_parse(ctx, i, out);
    char *fams = families_list();
    tps_err rc = tps_fail(ctx, TPS_E_ARG, "unknown family '%.*s' (known: %s)",
                          family ? tps_pl_shown(family) : 6, family ? family : "(null)",
                          fams ? fams : "?");
    free(fams);
    return rc;
}

int tps_plan_serves(const tps_plan *p, const cJSON *config)
{
    const cJSON *a, *mt, *it;
    if (!p || !config) return 0;
    a = tps_config_get(config, "architectures");
    if (cJSON_IsString(a)) {
        for (size_t j = 0; j < p->narch; j++)
            if (!strcmp(p->architectures[j], a->valuestring)) return 2;
    } else if (cJSON_IsArray(a)) {
        cJSON_ArrayForEach(it, a) {
            if (!cJSON_IsString(it)) continue;
            for (size_t j = 0; j < p->narch; j++)
                if (!strcmp(p->architectures[j], it->valuestring)) return 2;
        }
    }
    mt = tps_config_get(config, "model_type");
    if (cJSON_IsString(mt))
        for (size_t j = 0; j < p->nmt; j++)
            if (!strcmp(p->model_types[j], mt->valuestring)) return 1;
    return 0;
}

/* The architectures and model_type a config names, for "no plan serves it". */
static char *config_identity(const cJSON *config)
{
    const cJSON *a = tps_config_get(config, "architectures");
    const cJSON *mt = tps_config_get(config, "model_type");
    char *as = a ? cJSON_PrintUnformatted(a) : NULL;
    char *ms = mt ? cJSON_PrintUnformatted(mt) : NULL;
    char *s = tps_asprintf("architectures %.200s, model_type %.100s", as ? as : "(none)",
                           ms ? ms : "(none)");
    cJSON_free(as);
    cJSON_free(ms);
    return s;
}

tps_err tps_plan_detect(tps_ctx *ctx, const tps_ckpt *ck, tps_plan **out)
{
    tps_plan *best = NULL;
    int best_score = 0;
    tps_err rc = TPS_OK;
    char *fams = NULL, *who = NULL;

    if (!out) return tps_fail(ctx, TPS_E_ARG, "tps_plan_detect: out is NULL");
    *out = NULL;
    if (!ck) return tps_fail(ctx, TPS_E_ARG, "tps_plan_detect: no checkpoint");
    fams = families_list();
    TPS_FAIL_IF(!fams, ctx, TPS_E_NOMEM, "out of memory");
    TPS_FAIL_IF(!ck->config, ctx, TPS_E_CONFIG,
                "%s: no config.json: pass --family NAME or --plan FILE (families: %s)",
                ck->path ? ck->path : "model", fams);
    for (size_t i = 0; i < tps_builtin_plans_n; i++) {
        tps_plan *p = NULL;
        TPS_CHECK(builtin_parse(ctx, i, &p));
        int score = tps_plan_serves(p, ck->config);
        /* Ties keep the first plan in name order, so the choice is stable. */
        if (score > best_score) {
            tps_plan_free(best);
            best = p;
            best_score = score;
        } else {
            tps_plan_free(p);
        }
    }
    if (!best) {
        who = config_identity(ck->config);
        rc = tps_fail(ctx, TPS_E_CONFIG,
                      "%s/config.json: no built-in plan serves %s (families: %s): pass --family "
                      "NAME or --plan FILE",
                      ck->dir ? ck->dir : ".", who ? who : "this model", fams);
        goto out;
    }
    *out = best;
    best = NULL;
out:
    tps_plan_free(best);
    free(fams);
    free(who);
    return rc;
}
