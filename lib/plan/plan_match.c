/* plan_match.c - a plan applied to a checkpoint: module-path matching
 * (which rule, which packed entry a tensor takes; tps_module_match for the
 * layout files), conditions evaluated against config.json (tps_cond_eval),
 * and the plan's config checks (divisible-by-tp counts, per layer where
 * they vary; reject_if conditions). */
#include "plan_int.h"

#include <fnmatch.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ matching */

int tps_pl_has_glob(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] == '*' || s[i] == '?' || s[i] == '[' || s[i] == '\\') return 1;
    return 0;
}

/* One dotted component against one pattern component, fnmatch(3) flags 0 as
 * torch's parallelize_module does. Components are not NUL-terminated, so
 * glob components are copied out (stack for the usual short names). */
static int comp_match(const char *pat, size_t plen, const char *s, size_t slen)
{
    if (!tps_pl_has_glob(pat, plen)) return plen == slen && !memcmp(pat, s, plen);
    char pb[128], sb[128];
    char *pp = plen < sizeof pb ? pb : malloc(plen + 1);
    char *ss = slen < sizeof sb ? sb : malloc(slen + 1);
    int r = 0;
    if (pp && ss) {
        memcpy(pp, pat, plen);
        pp[plen] = '\0';
        memcpy(ss, s, slen);
        ss[slen] = '\0';
        r = fnmatch(pp, ss, 0) == 0;
    }
    if (pp != pb) free(pp);
    if (ss != sb) free(ss);
    return r;
}

/* Same number of dotted components, each matching. */
static int path_match(const char *pat, const char *mod, size_t mlen)
{
    const char *mend = mod + mlen;
    for (;;) {
        const char *pd = strchr(pat, '.');
        const char *md = memchr(mod, '.', (size_t)(mend - mod));
        size_t pl = pd ? (size_t)(pd - pat) : strlen(pat);
        size_t ml = md ? (size_t)(md - mod) : (size_t)(mend - mod);
        if (!comp_match(pat, pl, mod, ml)) return 0;
        if (!pd || !md) return !pd && !md;
        pat = pd + 1;
        mod = md + 1;
    }
}

const tps_rule *tps_plan_match(const tps_plan *p, const char *tensor_name, const cJSON *config,
                               const char **pattern)
{
    if (pattern) *pattern = NULL;
    if (!p || !tensor_name) return NULL;
    /* Module path: the name without its final component (.weight, .bias or
     * any other parameter name). A name without a dot has no module. */
    const char *dot = strrchr(tensor_name, '.');
    if (!dot || dot == tensor_name) return NULL;
    size_t mlen = (size_t)(dot - tensor_name);
    for (size_t i = 0; i < p->nrules; i++) {
        const tps_rule *r = &p->rules[i];
        for (size_t j = 0; j < r->npat; j++) {
            if (!path_match(r->patterns[j], tensor_name, mlen)) continue;
            if (r->when && !tps_cond_eval(r->when, config)) break;
            if (pattern) *pattern = r->patterns[j];
            return r;
        }
    }
    return NULL;
}

const tps_packed *tps_plan_packed(const tps_plan *p, const char *tensor_name)
{
    const char *dot = p ? strrchr(tensor_name, '.') : NULL;
    if (!dot) return NULL;
    size_t ml = (size_t)(dot - tensor_name);
    for (size_t i = 0; i < p->npacked; i++)
        for (size_t j = 0; j < p->packed[i].npat; j++)
            if (path_match(p->packed[i].patterns[j], tensor_name, ml)) return &p->packed[i];
    return NULL;
}

const tps_shape *tps_plan_shape(const tps_plan *p, const char *tensor_name)
{
    const char *dot = p ? strrchr(tensor_name, '.') : NULL;
    if (!dot) return NULL;
    size_t ml = (size_t)(dot - tensor_name);
    for (size_t i = 0; i < p->nshapes; i++)
        for (size_t j = 0; j < p->shapes[i].npat; j++)
            if (path_match(p->shapes[i].patterns[j], tensor_name, ml)) return &p->shapes[i];
    return NULL;
}

int tps_module_match(const char *pattern, const char *module, size_t mlen)
{
    return path_match(pattern, module, mlen);
}

/* ------------------------------------------------------------------ conditions */

/* Python truthiness of a config value, since config.json is written from
 * Python: null, false, 0, "", [] and {} are false. */
static int json_truthy(const cJSON *v)
{
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v)) return 0;
    if (cJSON_IsTrue(v)) return 1;
    if (cJSON_IsNumber(v)) return v->valuedouble != 0;
    if (cJSON_IsString(v)) return v->valuestring && v->valuestring[0];
    if (cJSON_IsArray(v) || cJSON_IsObject(v)) return v->child != NULL;
    return 1;
}

static int json_scalar_eq(const cJSON *a, const cJSON *b)
{
    if (!a || !b) return 0;
    if (cJSON_IsBool(a) && cJSON_IsBool(b)) return !!cJSON_IsTrue(a) == !!cJSON_IsTrue(b);
    if (cJSON_IsNumber(a) && cJSON_IsNumber(b)) return a->valuedouble == b->valuedouble;
    if (cJSON_IsString(a) && cJSON_IsString(b))
        return a->valuestring && b->valuestring && !strcmp(a->valuestring, b->valuestring);
    return 0;
}

int tps_cond_eval(const tps_cond *c, const cJSON *config)
{
    if (!c) return 1;
    const cJSON *v = config && c->field ? tps_config_get(config, c->field) : NULL;
    if (!v) v = c->dflt;
    switch (c->op) {
    case TPS_COND_TRUTHY: return json_truthy(v);
    case TPS_COND_FALSY: return !json_truthy(v);
    case TPS_COND_EQUALS: return json_scalar_eq(v, c->value);
    case TPS_COND_NOT_EQUALS: return !json_scalar_eq(v, c->value);
    }
    return 0;
}

/* ------------------------------------------------------------------ checks */

void tps_check_outcomes_free(tps_check_outcome *o, size_t n)
{
    if (!o) return;
    for (size_t i = 0; i < n; i++) {
        free(o[i].name);
        free(o[i].detail);
    }
    free(o);
}

/* Owned compact JSON text of v, cut to 100 bytes. */
static char *json_show(const cJSON *v)
{
    char *j = cJSON_PrintUnformatted(v);
    char *s = j ? tps_asprintf("%.100s%s", j, strlen(j) > 100 ? "..." : "") : NULL;
    cJSON_free(j);
    return s;
}

/* "1, 2, 4": the divisors of n up to 64, the tp values a count n allows. */
static void divisors(unsigned long long n, char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = '\0';
    for (unsigned long long k = 1; k <= 64 && k <= n && off < len; k++)
        if (n % k == 0) off += (size_t)snprintf(buf + off, len - off, "%s%llu", off ? ", " : "", k);
}

static unsigned long long gcd(unsigned long long a, unsigned long long b)
{
    while (b) {
        unsigned long long t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static char *divisible_detail(const tps_pcheck *c, const cJSON *v, int tp, int *ok)
{
    double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
    /* 2^53: every integer below it is exact in a double. */
    if (!cJSON_IsNumber(v) || d != floor(d) || d < 0 || d > 9007199254740992.0) {
        char *shown_v = json_show(v);
        char *s = tps_asprintf("%s = %s is not a count (a non-negative integer)", c->field,
                               shown_v ? shown_v : "?");
        free(shown_v);
        *ok = 0;
        return s;
    }
    unsigned long long n = (unsigned long long)d;
    if (n == 0) {
        /* Optional counts such as num_global_key_value_heads are 0 when unused. */
        *ok = c->optional ? -1 : 0;
        return c->optional ? tps_asprintf("%s = 0: not used", c->field)
                           : tps_asprintf("%s = 0 is not a usable count", c->field);
    }
    if (n % (unsigned long long)tp == 0) {
        *ok = 1;
        return tps_asprintf("%s = %llu: %llu per rank at tp %d", c->field, n,
                            n / (unsigned long long)tp, tp);
    }
    char works[400];
    divisors(n, works, sizeof works);
    *ok = 0;
    return tps_asprintf("%s = %llu is not divisible by tp %d (tp values that work: %s)%s%s",
                        c->field, n, tp, works, c->reason ? ": " : "", c->reason ? c->reason : "");
}

/* A layer's value of a count field: 1 a count (*n), 0 absent, -1 not a count. */
static int layer_count(const tps_layers *ly, int i, const char *field, unsigned long long *n,
                       const char **from, const cJSON **raw)
{
    const cJSON *v = tps_layers_get(ly, i, field, from);
    *raw = v;
    if (!v) return 0;
    double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
    if (!cJSON_IsNumber(v) || d != floor(d) || d < 0 || d > 9007199254740992.0) return -1;
    *n = (unsigned long long)d;
    return 1;
}

static int same_from(const char *a, const char *b) { return a == b || (a && b && !strcmp(a, b)); }

/* " (per_layer_config)", " (from num_global_key_value_heads)" or "". */
static const char *from_note(const char *from, char *buf, size_t len)
{
    if (!from) return "";
    snprintf(buf, len, !strcmp(from, "per_layer_config") ? " (%s)" : " (from %s)", from);
    return buf;
}

/* "1, 3, 5 and 4 more": the layers after `first` (and it too, with self) whose
 * value and origin equal layer first's. Returns how many it lists. */
static int same_layers(const tps_layers *ly, const char *field, int first, int self, char *buf,
                       size_t len)
{
    unsigned long long n0 = 0, n;
    const char *f0, *f;
    const cJSON *raw;
    int k0 = layer_count(ly, first, field, &n0, &f0, &raw), count = self, more = 0;
    size_t off = self ? (size_t)snprintf(buf, len, "%d", first) : 0;
    if (!self) buf[0] = '\0';
    for (int i = first + 1; i < ly->n; i++) {
        if (layer_count(ly, i, field, &n, &f, &raw) != k0 || (k0 == 1 && n != n0) ||
            !same_from(f, f0))
            continue;
        if (count++ < 8 && off < len)
            off += (size_t)snprintf(buf + off, len - off, "%s%d", off ? ", " : "", i);
        else
            more++;
    }
    if (more && off < len) snprintf(buf + off, len - off, " and %d more", more);
    return count;
}

/* The divisible check of a count that differs between layers: every layer's
 * own value must divide by tp, and a failure names the layer. */
static char *per_layer_detail(const tps_pcheck *c, const tps_layers *ly, int tp, int *ok)
{
    unsigned long long n, g = 0;
    const char *from;
    const cJSON *raw;
    char fb[64], works[400], list[160];
    int bad = -1, kind = 0, any = 0;
    for (int i = 0; i < ly->n; i++) {
        int k = layer_count(ly, i, c->field, &n, &from, &raw);
        if (k == 0 || (k == 1 && n == 0 && c->optional)) continue;
        any = 1;
        if (k == 1 && n) g = gcd(g, n);
        if (bad < 0 && (k < 0 || n == 0 || n % (unsigned long long)tp)) {
            bad = i;
            kind = k < 0 ? -1 : n == 0 ? 0 : 1;
        }
    }
    if (!any) {
        *ok = -1;
        return tps_strdup(c->optional ? "not set" : "not in config.json");
    }
    if (bad >= 0) {
        const char *t = tps_layers_type(ly, bad);
        char tb[96] = "";
        if (t) snprintf(tb, sizeof tb, " (%.80s)", t);
        layer_count(ly, bad, c->field, &n, &from, &raw);
        int also = same_layers(ly, c->field, bad, 0, list, sizeof list);
        char ab[200] = "";
        if (also) snprintf(ab, sizeof ab, "the same on layer%s %s; ", also > 1 ? "s" : "", list);
        *ok = 0;
        if (kind < 0) {
            char *j = json_show(raw);
            char *s = tps_asprintf("layer %d%s: %s = %s%s is not a count (a non-negative integer)",
                                   bad, tb, c->field, j ? j : "?", from_note(from, fb, sizeof fb));
            free(j);
            return s;
        }
        if (kind == 0)
            return tps_asprintf("layer %d%s: %s = 0%s is not a usable count", bad, tb, c->field,
                                from_note(from, fb, sizeof fb));
        divisors(g, works, sizeof works);
        return tps_asprintf("layer %d%s: %s = %llu%s is not divisible by tp %d (%stp values that "
                            "work for every layer: %s)%s%s",
                            bad, tb, c->field, n, from_note(from, fb, sizeof fb), tp, ab, works,
                            c->reason ? ": " : "", c->reason ? c->reason : "");
    }
    /* Passed: each distinct value once (up to 4), with the layers that have it. */
    char out[900];
    size_t off = (size_t)snprintf(out, sizeof out, "%s =", c->field);
    unsigned long long gv[4];
    const char *gf[4];
    int groups = 0;
    for (int i = 0; i < ly->n && off < sizeof out; i++) {
        int k = layer_count(ly, i, c->field, &n, &from, &raw), seen = 0;
        if (k != 1 || (n == 0 && c->optional)) continue;
        for (int j = 0; j < groups && !seen; j++) seen = gv[j] == n && same_from(gf[j], from);
        if (seen) continue;
        if (groups == 4) {
            off += (size_t)snprintf(out + off, sizeof out - off, "; ...");
            break;
        }
        gv[groups] = n;
        gf[groups++] = from;
        int cnt = same_layers(ly, c->field, i, 1, list, sizeof list);
        off += (size_t)snprintf(out + off, sizeof out - off, "%s %llu on layer%s %s%s",
                                groups > 1 ? ";" : "", n, cnt > 1 ? "s" : "", list,
                                from_note(from, fb, sizeof fb));
    }
    *ok = 1;
    return tps_asprintf("%s: divisible by tp %d on every layer", out, tp);
}

static char *reject_detail(const tps_pcheck *c, const cJSON *config, int tp, int *ok)
{
    if (tp == 1) {
        *ok = 1;
        return tps_strdup("tp 1: nothing is sharded");
    }
    if (tps_cond_eval(&c->cond, config)) {
        *ok = 0;
        return tps_strdup(c->reason ? c->reason : "rejected by the plan");
    }
    *ok = 1;
    const cJSON *v = tps_config_get(config, c->cond.field);
    char *shown_v = v ? json_show(v) : c->cond.dflt ? json_show(c->cond.dflt) : NULL;
    char *s = v ? tps_asprintf("%s = %s", c->cond.field, shown_v ? shown_v : "?")
              : shown_v ? tps_asprintf("%s not set (taken as %s)", c->cond.field, shown_v)
                        : tps_asprintf("%s not set", c->cond.field);
    free(shown_v);
    return s;
}

tps_err tps_plan_run_checks(tps_ctx *ctx, const tps_plan *p, const cJSON *config, int tp,
                            tps_check_outcome **out, size_t *n)
{
    tps_check_outcome *o = NULL;
    size_t k = 0;
    tps_err rc = TPS_OK;
    tps_layers ly = {0};

    if (!out || !n) return tps_fail(ctx, TPS_E_ARG, "tps_plan_run_checks: out is NULL");
    *out = NULL;
    *n = 0;
    if (!p) return tps_fail(ctx, TPS_E_ARG, "tps_plan_run_checks: no plan");
    if (tp < 1) return tps_fail(ctx, TPS_E_ARG, "tp must be at least 1, not %d", tp);
    if (!p->nchecks) return TPS_OK;
    TPS_TRY(tps_layers_open(ctx, config, "config.json", &ly));
    o = tps_xcalloc(p->nchecks, sizeof *o);
    TPS_FAIL_IF(!o, ctx, TPS_E_NOMEM, "out of memory");
    for (; k < p->nchecks; k++) {
        const tps_pcheck *c = &p->checks[k];
        tps_check_outcome *r = &o[k];
        r->name = c->kind == TPS_PCHECK_DIVISIBLE ? tps_asprintf("%s %% tp == 0", c->field)
                                                  : tps_strdup(c->field);
        if (!config) {
            r->ok = -1;
            r->detail = tps_strdup("no config.json: check skipped");
        } else if (c->kind == TPS_PCHECK_DIVISIBLE && ly.n > 0 && tps_layers_vary(&ly, c->field)) {
            r->detail = per_layer_detail(c, &ly, tp, &r->ok);
        } else if (c->kind == TPS_PCHECK_DIVISIBLE) {
            const cJSON *v = tps_config_get(config, c->field);
            if (!v) {
                r->ok = -1;
                r->detail = tps_strdup(c->optional ? "not set" : "not in config.json");
            } else {
                r->detail = divisible_detail(c, v, tp, &r->ok);
            }
        } else {
            r->detail = reject_detail(c, config, tp, &r->ok);
        }
        TPS_FAIL_IF(!r->name || !r->detail, ctx, TPS_E_NOMEM, "out of memory");
    }
    *out = o;
    *n = k;
    o = NULL;
out:
    tps_check_outcomes_free(o, o ? k + 1 : 0);
    tps_layers_close(&ly);
    return rc;
}
