/* layout.c - plan x checkpoint x tp (x layout file): every rank's tensors and
 * where each of their bytes comes from, validated before a byte is written
 * (plan first, write second).
 *
 * Two steps. tps_layout_new places every source tensor as the plan says
 * (style, DTensor dim) and runs the plan's checks. tps_layout_compile turns
 * that into rank tensors made of pieces: for the DTensor layout one piece per
 * rank tensor (the torch.chunk shard); for a serving layout (a layout file,
 * see tpshard-plan(5)) fused projections, whole KV heads replicated, a padded
 * vocabulary, a tied head, the engine's extra entries. Split, the manifest,
 * check, merge and verify all read this one description. */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* layouts_gen.c, made by tools/embed.sh from plans/layouts/ */
typedef struct {
    const char *name;
    const char *text;
    size_t len;
} builtin_layout;
extern const builtin_layout tps_builtin_layouts[];
extern const size_t tps_builtin_layouts_n;

static const char *param_of(const char *name)
{
    const char *dot = strrchr(name, '.');
    return dot ? dot + 1 : name;
}

/* Which dim a style shards for a parameter; -1 replicated. */
static int style_dim(tps_style s, const char *param)
{
    int is_w = strcmp(param, "weight") == 0, is_b = strcmp(param, "bias") == 0;
    switch (s) {
    case TPS_STYLE_COLWISE: return (is_w || is_b) ? 0 : -1;
    case TPS_STYLE_ROWWISE: return is_w ? 1 : -1;
    case TPS_STYLE_EMBED_ROWWISE: return is_w ? 0 : -1;
    case TPS_STYLE_EMBED_COLWISE: return is_w ? 1 : -1;
    case TPS_STYLE_REPLICATE:
    case TPS_STYLE_SEQPAR: return -1;
    }
    return -1;
}

/* The layer a tensor belongs to: the first all-digit component of its
 * module path ("model.layers.12.self_attn.k_proj.weight": 12), or -1. */
static int layer_of(const char *name)
{
    const char *end = strrchr(name, '.');
    for (const char *c = name; end && c < end;) {
        const char *d = memchr(c, '.', (size_t)(end - c));
        size_t n = d ? (size_t)(d - c) : (size_t)(end - c);
        int digits = n > 0 && n <= 9;
        long v = 0;
        for (size_t k = 0; digits && k < n; k++) {
            digits = c[k] >= '0' && c[k] <= '9';
            v = v * 10 + (c[k] - '0');
        }
        if (digits) return (int)v;
        if (!d) break;
        c = d + 1;
    }
    return -1;
}

/* What the shape check found: tensors checked, the layers they are in, the
 * first disagreement. */
typedef struct {
    uint64_t tensors;
    int layers_seen, last_layer;
    char *bad;
} head_state;

/* A rule with `heads: FIELD` says its sharded dim holds FIELD heads of
 * head_dim each, in the tensor's own layer: the divisibility checks promise
 * whole heads per rank only if that is so. */
static void head_shape(const tps_layout *L, const tps_layers *ly, size_t i, const tps_rule *r,
                       head_state *hs)
{
    const tps_ctensor *t = &L->ck->t[i];
    int d = L->p[i].dim, layer = layer_of(t->name);
    if (hs->bad || layer < 0 || d < 0 || d >= t->ndim) return;
    int64_t heads, kv, hd, cnt;
    const char *from[3], *cfrom;
    tps_layers_geometry(ly, layer, &heads, &kv, &hd, from);
    if (!strcmp(r->heads, "num_attention_heads")) {
        cnt = heads;
        cfrom = from[0];
    } else if (!strcmp(r->heads, "num_key_value_heads")) {
        cnt = kv;
        cfrom = from[1];
    } else {
        const cJSON *v = tps_layers_get(ly, layer, r->heads, &cfrom);
        cnt = cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < 9e15 &&
                      v->valuedouble == (double)(int64_t)v->valuedouble
                  ? (int64_t)v->valuedouble
                  : -1;
    }
    uint64_t want;
    if (cnt < 0 || hd < 0 || tps_mul_ovf((uint64_t)cnt, (uint64_t)hd, &want)) return;
    hs->tensors++;
    if (layer != hs->last_layer) hs->layers_seen++, hs->last_layer = layer;
    if (t->shape[d] == want) return;
    const char *type = tps_layers_type(ly, layer);
    char tb[96] = "", fb[224] = "";
    if (type) snprintf(tb, sizeof tb, " (%.80s)", type);
    if (cfrom || from[2])
        snprintf(fb, sizeof fb, " (from %s)", cfrom && from[2] && strcmp(cfrom, from[2])
                                                  ? "per-layer fields"
                                                  : cfrom ? cfrom : from[2]);
    else if (tps_config_defaulted(ly->config, r->heads) && hd > 0 && t->shape[d] % (uint64_t)hd == 0)
        snprintf(fb, sizeof fb, " (config.json leaves %s to transformers' default for its "
                 "model type; the tensor holds %llu heads: add \"%s\": %llu to config.json if "
                 "that is what the model has)", r->heads,
                 (unsigned long long)(t->shape[d] / (uint64_t)hd), r->heads,
                 (unsigned long long)(t->shape[d] / (uint64_t)hd));
    else if (tps_config_defaulted(ly->config, r->heads) || tps_config_defaulted(ly->config, "head_dim"))
        snprintf(fb, sizeof fb, " (config.json leaves %s to transformers' default for its "
                 "model type)", tps_config_defaulted(ly->config, r->heads) ? r->heads : "head_dim");
    hs->bad = tps_asprintf("%s: tensor '%s' has %llu %s (dim %d), but config.json gives layer %d%s "
                           "%s %lld x head_dim %lld = %llu%s: the config does not describe this "
                           "tensor, so its shards cannot be promised to hold whole heads",
                           L->ck->path, t->name, (unsigned long long)t->shape[d],
                           d == 0 ? "rows" : "columns", d, layer, tb, r->heads, (long long)cnt,
                           (long long)hd, (unsigned long long)want, fb);
}

static int splits(tps_style s) { return s != TPS_STYLE_REPLICATE && s != TPS_STYLE_SEQPAR; }

/* A plan for another model (--family llama on a GPT-2) matches none of the
 * checkpoint's tensors and would replicate all of them, a split that looks
 * accepted and shards nothing. Refused when no split rule matches a tensor,
 * or when the plan's per-layer split rules (a '*' component) all match
 * nothing: a lone top-level match such as lm_head (GPT-J keeps one) does not
 * make a model of the plan's family. At every tp, tp 1 included, since the
 * manifest would record a plan that does not describe the model. A plan with
 * no split rule (everything replicated on purpose) is not refused. */
static tps_err plan_fits(tps_ctx *ctx, const tps_layout *L)
{
    const tps_plan *plan = L->plan;
    const tps_ckpt *ck = L->ck;
    const char *rule = NULL, *layered = NULL;
    for (size_t i = 0; i < plan->nrules; i++) {
        const tps_rule *r = &plan->rules[i];
        for (size_t j = 0; splits(r->style) && j < r->npat; j++) {
            if (!rule) rule = r->patterns[j];
            if (!layered && strchr(r->patterns[j], '*')) layered = r->patterns[j];
        }
    }
    if (!rule || !ck->n) return TPS_OK;
    for (size_t i = 0; i < ck->n; i++)
        if (splits(L->p[i].style) && (!layered || (L->p[i].rule && strchr(L->p[i].rule, '*'))))
            return TPS_OK;
    if (layered) rule = layered;
    /* A sample of the checkpoint's modules, layer indices as '*'. */
    char seen[4096] = "\n", mods[512] = "", one[160], key[164];
    size_t shown = 0, total = 0;
    for (size_t i = 0; i < ck->n; i++) {
        const char *n = ck->t[i].name, *dot = strrchr(n, '.');
        size_t ml = dot && dot != n ? (size_t)(dot - n) : strlen(n), o = 0;
        for (size_t j = 0; j < ml && o + 2 < sizeof one; j++) {
            size_t k = j;
            while (k < ml && n[k] != '.') k++;
            int digits = 1;
            for (size_t q = j; q < k; q++) digits &= n[q] >= '0' && n[q] <= '9';
            if (digits && k > j) one[o++] = '*';
            for (size_t q = j; !(digits && k > j) && q < k && o + 2 < sizeof one; q++) one[o++] = n[q];
            if (k < ml) one[o++] = '.';
            j = k;
        }
        one[o] = 0;
        snprintf(key, sizeof key, "\n%s\n", one);
        if (strstr(seen, key)) continue;
        if (strlen(seen) + strlen(key) < sizeof seen) strcat(seen, key + 1);
        total++;
        if (shown < 6 && strlen(mods) + strlen(one) + 3 < sizeof mods) {
            if (shown++) strcat(mods, ", ");
            strcat(mods, one);
        }
    }
    return tps_fail(ctx, TPS_E_REJECT,
                    "%s: plan %s matches no tensor of this checkpoint: none of its split rules "
                    "(e.g. '%s') names one of its modules (%s%s), so every tensor would be "
                    "replicated; this is not a %s model: give its plan with --plan FILE or "
                    "--family NAME (tpshard plan --list)",
                    ck->path, plan->name ? plan->name : "(unnamed)", rule, mods,
                    total > shown ? ", ..." : "", plan->name ? plan->name : "plan's");
}

/* Appends the outcome of the head shape check to L->checks. */
static tps_err add_head_outcome(tps_ctx *ctx, tps_layout *L, const head_state *hs)
{
    tps_check_outcome *o = realloc(L->checks, (L->nchecks + 1) * sizeof *o);
    if (!o) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    L->checks = o;
    o = &L->checks[L->nchecks++];
    memset(o, 0, sizeof *o);
    o->name = tps_strdup("head shapes");
    if (!L->ck->config) {
        o->ok = -1;
        o->detail = tps_strdup("no config.json: check skipped");
    } else if (L->tp == 1) {
        o->ok = 1;
        o->detail = tps_strdup("tp 1: nothing is sharded");
    } else if (hs->bad) {
        o->ok = 0;
        o->detail = tps_strdup(hs->bad);
    } else if (!hs->tensors) {
        o->ok = -1;
        o->detail = tps_strdup("config.json gives no head counts and sizes to check against");
    } else {
        o->ok = 1;
        o->detail = tps_asprintf("%llu sharded tensor%s in %d layer%s match heads x head_dim of "
                                 "their layer",
                                 (unsigned long long)hs->tensors, hs->tensors == 1 ? "" : "s",
                                 hs->layers_seen, hs->layers_seen == 1 ? "" : "s");
    }
    if (!o->name || !o->detail) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    return TPS_OK;
}

void tps_layout_free(tps_layout *L)
{
    if (!L) return;
    free(L->p);
    free(L->layers);
    tps_check_outcomes_free(L->checks, L->nchecks);
    free(L->rejected);
    free(L->rt);
    free(L->rank_rt);
    free(L->pieces);
    free(L->regions);
    free(L->src_pieces);
    free(L->src_piece0);
    free(L->dropped);
    for (size_t i = 0; i < L->nnames; i++) free(L->names[i]);
    free(L->names);
    for (size_t i = 0; i < L->nshape_chunks; i++) free(L->shape_chunks[i]);
    free(L->shape_chunks);
    tps_quant_free(L->q);
    free(L);
}

/* ------------------------------------------------------------------ layout files */

size_t tps_layout_spec_builtin_count(void)
{
    return tps_builtin_layouts_n;
}

const char *tps_layout_spec_builtin_name(size_t i)
{
    return i < tps_builtin_layouts_n ? tps_builtin_layouts[i].name : NULL;
}

tps_err tps_layout_spec_builtin(tps_ctx *ctx, const char *name, tps_layout_spec **out)
{
    *out = NULL;
    char list[256] = "dtensor";
    size_t off = strlen(list);
    for (size_t i = 0; i < tps_builtin_layouts_n; i++) {
        if (name && !strcmp(name, tps_builtin_layouts[i].name)) {
            char label[128];
            snprintf(label, sizeof label, "plans/layouts/%s.yaml", tps_builtin_layouts[i].name);
            return tps_lspec_parse(ctx, label, tps_builtin_layouts[i].text,
                                   tps_builtin_layouts[i].len, out);
        }
        if (off < sizeof list)
            off += (size_t)snprintf(list + off, sizeof list - off, ", %s",
                                    tps_builtin_layouts[i].name);
    }
    return tps_fail(ctx, TPS_E_ARG, "unknown layout '%s' (built in: %s; or a layout file)",
                    name ? name : "", list);
}

tps_err tps_layout_spec_load(tps_ctx *ctx, const char *path, tps_layout_spec **out)
{
    char *buf = NULL;
    size_t len = 0;
    *out = NULL;
    if (tps_is_dir(path)) return tps_fail(ctx, TPS_E_ARG, "%s: is a directory, not a layout file", path);
    TPS_TRY(tps_read_file(ctx, path, (size_t)1 << 20, &buf, &len));
    tps_err rc = tps_lspec_parse(ctx, path, buf, len, out);
    free(buf);
    return rc;
}

void tps_layout_spec_free(tps_layout_spec *s)
{
    tps_lspec_free(s);
}

const char *tps_layout_spec_name(const tps_layout_spec *s)
{
    return s ? s->name : "dtensor";
}

const char *tps_layout_spec_target(const tps_layout_spec *s)
{
    return s ? s->target : NULL;
}

/* ------------------------------------------------------------------ placements */

/* Every layer's heads, KV heads and head size, for `plan` to show. */
static tps_err layer_table(tps_ctx *ctx, tps_layout *L, const tps_layers *ly)
{
    if (ly->n <= 0) return TPS_OK;
    L->layers = tps_xcalloc((size_t)ly->n, sizeof *L->layers);
    if (!L->layers) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    L->nlayers = (size_t)ly->n;
    for (int i = 0; i < ly->n; i++) {
        tps_layer_view *v = &L->layers[i];
        const char *from[3];
        tps_layers_geometry(ly, i, &v->heads, &v->kv_heads, &v->head_dim, from);
        v->type = tps_layers_type(ly, i);
        v->heads_from = from[0];
        v->kv_heads_from = from[1];
        v->head_dim_from = from[2];
    }
    return TPS_OK;
}

tps_err tps_layout_new_with(tps_ctx *ctx, const tps_ckpt *ck, const tps_plan *plan,
                            const tps_layout_spec *spec, int tp, tps_layout **out)
{
    return tps_layout_new_ep(ctx, ck, plan, spec, tp, 0, out);
}

int tps_layout_ep(const tps_layout *L) { return L->ep; }

/* A layout of ck's tensors, nothing placed yet. */
static tps_layout *layout_alloc(const tps_ckpt *ck, const tps_plan *plan, const tps_lspec *spec,
                                int tp, int ep)
{
    tps_layout *L = tps_xcalloc(1, sizeof *L);
    if (!L) return NULL;
    L->ck = ck;
    L->plan = plan;
    L->spec = spec;
    L->tp = tp;
    L->ep = ep;
    L->n = ck->n;
    L->p = tps_xcalloc(ck->n ? ck->n : 1, sizeof *L->p);
    if (!L->p) {
        free(L);
        return NULL;
    }
    return L;
}

tps_err tps_layout_new_ep(tps_ctx *ctx, const tps_ckpt *ck, const tps_plan *plan,
                          const tps_layout_spec *spec, int tp, int ep, tps_layout **out)
{
    *out = NULL;
    if (tp < 1 || tp > 4096) return tps_fail(ctx, TPS_E_ARG, "tp must be between 1 and 4096, not %d", tp);
    tps_err rc = TPS_OK;
    tps_layers ly = {0};
    head_state hs = {.last_layer = -1};
    tps_layout *L = layout_alloc(ck, plan, spec, tp, ep);
    if (!L) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    /* Named after the file: a malformed per_layer_config is the config's fault. */
    char *cfg_label = tps_asprintf("%s/config.json", ck->dir ? ck->dir : ".");
    TPS_FAIL_IF(!cfg_label, ctx, TPS_E_NOMEM, "out of memory");
    rc = tps_layers_open(ctx, ck->config, cfg_label, &ly);
    free(cfg_label);
    if (rc) goto out;
    TPS_CHECK(layer_table(ctx, L, &ly));
    /* The plan's checks are NeMo's rules for the DTensor layout; a serving
     * layout has its own (the engine's), which compile runs. When the plan
     * rejects the model, its reason is what the user needs, not a shape
     * complaint about a tensor. */
    if (!spec) {
        TPS_CHECK(tps_plan_run_checks(ctx, plan, ck->config, tp, &L->checks, &L->nchecks));
        for (size_t i = 0; i < L->nchecks; i++)
            if (L->checks[i].ok == 0) {
                L->rejected = tps_asprintf("%s: %s", L->checks[i].name, L->checks[i].detail);
                break;
            }
    }
    /* The config must describe the head-split tensors (heads x head_dim, by
     * transformers' defaults where config.json is silent) in every layout:
     * the engines build their parameters from the same config. */
    int any_heads = 0;
    for (size_t i = 0; i < plan->nrules; i++) any_heads |= plan->rules[i].heads != NULL;
    for (size_t i = 0; i < ck->n; i++) {
        const tps_ctensor *t = &ck->t[i];
        tps_place *pl = &L->p[i];
        pl->t = i;
        const char *pat = NULL;
        const tps_rule *r = tps_plan_match(plan, t->name, ck->config, &pat);
        pl->style = r ? r->style : TPS_STYLE_REPLICATE;
        pl->rule = r ? pat : NULL;
        pl->dim = r ? style_dim(r->style, param_of(t->name)) : -1;
        if (any_heads && r && r->heads && tp > 1 && ck->config) head_shape(L, &ly, i, r, &hs);
        if (pl->dim < 0 || L->rejected) continue;
        TPS_FAIL_IF(pl->dim >= t->ndim, ctx, TPS_E_SHAPE,
                    "%s: tensor '%s' is %d-D, but style %s (rule '%s') shards dim %d", ck->path,
                    t->name, t->ndim, tps_style_name(pl->style), pat, pl->dim);
    }
    TPS_CHECK(plan_fits(ctx, L));
    if (any_heads) {
        TPS_CHECK(add_head_outcome(ctx, L, &hs));
        if (!L->rejected && L->checks[L->nchecks - 1].ok == 0)
            L->rejected = tps_asprintf("head shapes: %s", L->checks[L->nchecks - 1].detail);
    }
    TPS_CHECK(tps_quant_open(ctx, ck, &L->q));
    TPS_CHECK(tps_layout_compile(ctx, L));
out:
    free(hs.bad);
    tps_layers_close(&ly);
    if (rc) {
        tps_layout_free(L);
        L = NULL;
    }
    *out = L;
    return rc;
}

tps_err tps_layout_from_styles(tps_ctx *ctx, const tps_ckpt *ck, const tps_plan *plan,
                               const tps_lspec *spec, int tp, int ep, const tps_style *styles,
                               tps_layout **out)
{
    *out = NULL;
    tps_err rc = TPS_OK;
    tps_layout *L = layout_alloc(ck, plan, spec, tp, ep);
    if (!L) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    for (size_t i = 0; i < ck->n; i++) {
        L->p[i].t = i;
        L->p[i].style = styles[i];
        L->p[i].dim = style_dim(styles[i], param_of(ck->t[i].name));
        if (L->p[i].dim >= ck->t[i].ndim) L->p[i].dim = -1;
    }
    TPS_CHECK(tps_quant_open(ctx, ck, &L->q));
    TPS_CHECK(tps_layout_compile(ctx, L));
out:
    if (rc) {
        tps_layout_free(L);
        L = NULL;
    }
    *out = L;
    return rc;
}

tps_err tps_layout_new(tps_ctx *ctx, const tps_ckpt *ck, const tps_plan *plan, int tp,
                       tps_layout **out)
{
    return tps_layout_new_with(ctx, ck, plan, NULL, tp, out);
}

/* ------------------------------------------------------------------ compile */

/* Bits of one step along dim d (the product of the dims after it). */
static uint64_t inner_bits(const tps_ctensor *t, int d)
{
    uint64_t b = tps_dtype_bits(t->dtype);
    for (int k = d + 1; k < t->ndim; k++) b *= t->shape[k];
    return b;
}

void tps_region_geom(const tps_ckpt *ck, const tps_region *g, uint64_t *outer, uint64_t *row,
                     uint64_t *s, uint64_t *l)
{
    const tps_ctensor *t = &ck->t[g->src];
    if (g->dim < 0) {
        *outer = 1;
        *row = *l = t->nbytes;
        *s = 0;
        return;
    }
    uint64_t ib = inner_bits(t, g->dim);
    *outer = 1;
    for (int k = 0; k < g->dim; k++) *outer *= t->shape[k];
    *row = t->shape[g->dim] * ib / 8;
    *s = g->lo * ib / 8;
    *l = (g->hi - g->lo) * ib / 8;
}

typedef struct {
    tps_ctx *ctx;
    tps_layout *L;
    const tps_ckpt *ck;
    int tp;
    size_t cap_rt;
    unsigned char *used; /* per source tensor: placed */
    size_t *last, *next; /* per source tensor its newest region; per region the one before */
    char why[1024];      /* the first refusal */
} cstate;

static int refuse(cstate *C, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int refuse(cstate *C, const char *fmt, ...)
{
    if (!C->why[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(C->why, sizeof C->why, fmt, ap);
        va_end(ap);
    }
    return 1;
}

static tps_err nomem(cstate *C)
{
    return tps_fail(C->ctx, TPS_E_NOMEM, "out of memory");
}

#define SHAPE_CHUNK 16384 /* uint64s */

static tps_err new_rt(cstate *C, const char *name, int rank, tps_dtype dt, int ndim,
                      const uint64_t *shape, const char *rule, tps_rtensor **out)
{
    tps_layout *L = C->L;
    if (L->nrt == C->cap_rt) {
        size_t cap = C->cap_rt ? C->cap_rt * 2 : 256;
        tps_rtensor *n = realloc(L->rt, cap * sizeof *n);
        if (!n) return nomem(C);
        L->rt = n;
        C->cap_rt = cap;
    }
    /* Shapes live in chunks that never move: a rank tensor is 70 bytes, not
     * the 200 a TPS_MAX_DIMS array would make it (151k of them for an MoE at tp 8). */
    if (L->shape_left < (size_t)ndim) {
        uint64_t **nc = realloc(L->shape_chunks, (L->nshape_chunks + 1) * sizeof *nc);
        if (!nc) return nomem(C);
        L->shape_chunks = nc;
        nc[L->nshape_chunks] = malloc(SHAPE_CHUNK * sizeof(uint64_t));
        if (!nc[L->nshape_chunks]) return nomem(C);
        L->nshape_chunks++;
        L->shape_left = SHAPE_CHUNK;
    }
    uint64_t *sh = L->shape_chunks[L->nshape_chunks - 1] + (SHAPE_CHUNK - L->shape_left);
    L->shape_left -= (size_t)ndim;
    memcpy(sh, shape, sizeof(uint64_t) * (size_t)ndim);
    tps_rtensor *r = &L->rt[L->nrt++];
    memset(r, 0, sizeof *r);
    r->name = name;
    r->rank = rank;
    r->dtype = dt;
    r->ndim = ndim;
    r->shape = sh;
    int ovf = 0, mis = 0;
    r->nbytes = tps_nbytes(dt, r->shape, ndim, &ovf, &mis);
    if (ovf || mis)
        return tps_fail(C->ctx, TPS_E_SHAPE, "%s: rank %d's tensor '%s' has no whole byte size",
                        C->ck->path, rank, name);
    r->piece0 = L->npieces;
    r->rule = rule;
    *out = r;
    return TPS_OK;
}

static tps_err add_piece(cstate *C, tps_rtensor *r, tps_lpiece p)
{
    tps_layout *L = C->L;
    if (L->npieces == L->cap_pieces) {
        size_t cap = L->cap_pieces ? L->cap_pieces * 2 : 256;
        tps_lpiece *n = realloc(L->pieces, cap * sizeof *n);
        if (!n) return nomem(C);
        L->pieces = n;
        L->cap_pieces = cap;
    }
    p.rank = r->rank;
    L->pieces[L->npieces++] = p;
    r->npieces++;
    return TPS_OK;
}

/* The region (src, dim, [lo, hi)), made on first use; *fresh says so. */
static tps_err region_of(cstate *C, size_t src, int dim, uint64_t lo, uint64_t hi, size_t *out,
                         int *fresh)
{
    tps_layout *L = C->L;
    /* The tensor's regions so far, newest first (a chain through `next`).
     * Empty ones are never shared: an empty shard is nobody's replica. */
    for (size_t k = hi > lo || dim < 0 ? C->last[src] : SIZE_MAX; k != SIZE_MAX; k = C->next[k]) {
        const tps_region *g = &L->regions[k];
        if (g->dim == dim && g->lo == lo && g->hi == hi) {
            *out = k;
            *fresh = 0;
            return TPS_OK;
        }
    }
    if (L->nregions == L->cap_regions) {
        size_t cap = L->cap_regions ? L->cap_regions * 2 : 256;
        tps_region *n = realloc(L->regions, cap * sizeof *n);
        size_t *nx = realloc(C->next, cap * sizeof *nx);
        if (nx) C->next = nx;
        if (!n || !nx) {
            if (n) L->regions = n;
            return nomem(C);
        }
        L->regions = n;
        L->cap_regions = cap;
    }
    C->next[L->nregions] = C->last[src];
    C->last[src] = L->nregions;
    tps_region *g = &L->regions[L->nregions];
    *g = (tps_region){.src = src, .dim = dim, .lo = lo, .hi = hi};
    uint64_t outer, row, s, l;
    tps_region_geom(C->ck, g, &outer, &row, &s, &l);
    const tps_ctensor *t = &C->ck->t[src];
    if (dim >= 0) {
        uint64_t ib = inner_bits(t, dim);
        if ((lo * ib) % 8 || (hi * ib) % 8)
            return tps_fail(C->ctx, TPS_E_SHAPE,
                            "%s: tensor '%s' (%s) cannot be split at tp %d: a shard along dim %d "
                            "does not start and end on a byte boundary",
                            C->ck->path, t->name, tps_dtype_name(t->dtype), C->tp, dim);
    }
    g->nbytes = outer * l;
    *out = L->nregions++;
    *fresh = 1;
    return TPS_OK;
}

/* Adds source piece [lo, hi) along dim of src to r at byte at. */
static tps_err src_piece(cstate *C, tps_rtensor *r, size_t src, int dim, uint64_t lo, uint64_t hi,
                         uint64_t at)
{
    size_t g = 0;
    int fresh = 0;
    TPS_TRY(region_of(C, src, dim, lo, hi, &g, &fresh));
    if (fresh) C->L->regions[g].primary = C->L->npieces;
    C->used[src] = 1;
    /* A widened piece (a scale the engine holds in F32): 4 bytes an element. */
    uint64_t nb = C->L->regions[g].nbytes;
    tps_dtype sd = C->ck->t[src].dtype;
    if (r->dtype != sd) nb = nb / (tps_dtype_bits(sd) / 8) * (tps_dtype_bits(r->dtype) / 8);
    return add_piece(C, r, (tps_lpiece){.kind = TPS_PK_SRC, .region = g, .at = at, .nbytes = nb,
                                        .replica = !fresh});
}

static char *own_name(cstate *C, char *s)
{
    tps_layout *L = C->L;
    if (!s) return NULL;
    char **n = realloc(L->names, (L->nnames + 1) * sizeof *n);
    if (!n) {
        free(s);
        return NULL;
    }
    L->names = n;
    L->names[L->nnames++] = s;
    return s;
}

/* torch.chunk (exact 0) or an even split that must divide (exact 1): rank
 * r's [lo, lo + len) of n. Returns 0 when an exact split does not divide. */
static int split_range(uint64_t n, int tp, int r, int exact, uint64_t *lo, uint64_t *len)
{
    if (exact) {
        if (n % (uint64_t)tp) return 0;
        *len = n / (uint64_t)tp;
        *lo = (uint64_t)r * *len;
        return 1;
    }
    tps_chunk(n, tp, r, lo, len);
    return 1;
}

/* Rank r's rows [lo, lo + len) of a fused part of n rows: on whole heads
 * (heads > 0; with replicate, fewer heads than ranks each whole on
 * tp / heads ranks), else split_range. 0 when no such split exists. */
static int part_rows(uint64_t n, uint64_t heads, int replicate, int tp, int r, int exact,
                     uint64_t *lo, uint64_t *len)
{
    if (!heads) return split_range(n, tp, r, exact, lo, len);
    if (heads % (uint64_t)tp == 0) {
        *len = n / (uint64_t)tp;
        *lo = (uint64_t)r * *len;
        return 1;
    }
    if (replicate && heads < (uint64_t)tp && (uint64_t)tp % heads == 0) {
        *len = n / heads;
        *lo = (uint64_t)r / ((uint64_t)tp / heads) * *len;
        return 1;
    }
    return 0;
}

/* "1, 2, 4, 8" of the tp values up to 64 for which ok(n, tp) holds. */
static void works_list(char *buf, size_t len, uint64_t n, uint64_t n2,
                       int (*ok)(uint64_t, uint64_t, int))
{
    size_t o = 0;
    buf[0] = 0;
    for (int k = 1; k <= 64 && o < len; k++)
        if (ok(n, n2, k)) o += (size_t)snprintf(buf + o, len - o, "%s%d", o ? ", " : "", k);
    if (!o) snprintf(buf, len, "none up to 64");
}
static int ok_divides(uint64_t n, uint64_t unused, int tp)
{
    (void)unused;
    return n % (uint64_t)tp == 0;
}
static int ok_heads_rep(uint64_t n, uint64_t unused, int tp)
{
    (void)unused;
    return n % (uint64_t)tp == 0 || (n < (uint64_t)tp && (uint64_t)tp % n == 0);
}
static int ok_vocab(uint64_t v, uint64_t pad, int tp)
{
    uint64_t p = pad ? (v + pad - 1) / pad * pad : v;
    return p % (uint64_t)tp == 0;
}

/* A config count (top level or text_config), or 0 when absent or not one. */
static uint64_t config_count(const cJSON *config, const char *field, int *present)
{
    const cJSON *v = tps_config_get(config, field);
    *present = v != NULL;
    if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble != floor(v->valuedouble) ||
        v->valuedouble > 9007199254740992.0)
        return 0;
    return (uint64_t)v->valuedouble;
}

static int module_of(const char *name, size_t *mlen)
{
    const char *dot = strrchr(name, '.');
    if (!dot || dot == name) return 0;
    *mlen = (size_t)(dot - name);
    return 1;
}

static int matches_any(char **pats, size_t n, const char *name)
{
    size_t ml;
    if (!module_of(name, &ml)) return 0;
    for (size_t i = 0; i < n; i++)
        if (tps_module_match(pats[i], name, ml)) return 1;
    return 0;
}

/* Is the checkpoint's model_type one of types (none listed: any)? */
static int type_listed(char **types, size_t n, const cJSON *config)
{
    if (!n) return 1;
    const cJSON *mt = tps_config_get(config, "model_type");
    for (size_t i = 0; i < n; i++)
        if (cJSON_IsString(mt) && !strcmp(mt->valuestring, types[i])) return 1;
    return 0;
}

/* Why the engine never holds source tensor `name` (its load_weights skips
 * names holding one of a drop entry's strings), or NULL. */
static const char *drop_reason(const tps_lspec *s, const cJSON *config, const char *name)
{
    for (size_t k = 0; k < s->ndrops; k++) {
        const tps_ldrop *d = &s->drops[k];
        if (!type_listed(d->model_types, d->nmt, config)) continue;
        for (size_t j = 0; j < d->ncontains; j++)
            if (strstr(name, d->contains[j])) return d->reason;
    }
    return NULL;
}

/* Does a keys entry name `name` as a parameter of the engine's model? */
static int engine_key(const tps_lspec *s, const cJSON *config, const char *name)
{
    const char *param = param_of(name);
    size_t ml;
    if (!module_of(name, &ml)) return 0;
    for (size_t k = 0; k < s->nkeys; k++) {
        const tps_lkey *e = &s->keys[k];
        int p = 0;
        for (size_t j = 0; j < e->nparams && !p; j++) p = !strcmp(e->params[j], param);
        if (!p || !type_listed(e->model_types, e->nmt, config) || !tps_cond_eval(e->when, config))
            continue;
        for (size_t j = 0; j < e->npat; j++)
            if (tps_module_match(e->patterns[j], name, ml)) return 1;
    }
    return 0;
}

/* Appends to buf, once per field, the setting of config.json that makes
 * condition c hold ("attention_bias: true"), joined by ", or ". */
static void enable_hint(char *buf, size_t len, const tps_cond *c)
{
    size_t o = strlen(buf), fl = strlen(c->field);
    for (const char *at = buf; (at = strstr(at, c->field)); at += fl)
        if ((at == buf || at[-1] == ' ') && at[fl] == ':') return;
    char *v = c->value ? cJSON_PrintUnformatted(c->value) : NULL;
    const char *val = c->op == TPS_COND_TRUTHY ? "true" : c->op == TPS_COND_FALSY ? "false"
                                                                                  : v ? v : "?";
    if (o < len)
        snprintf(buf + o, len - o, "%s%s%s: %s", o ? ", or " : "",
                 c->op == TPS_COND_NOT_EQUALS ? "a value of " : "", c->field, val);
    if (c->op == TPS_COND_NOT_EQUALS && strlen(buf) < len)
        snprintf(buf + strlen(buf), len - strlen(buf), " changed");
    free(v);
}

/* Does the engine's fused module of f have a bias for this config? The
 * config settings that would give it one, when it has none, in hint. */
static int fused_bias(const tps_lfuse *f, const cJSON *config, char *hint, size_t len)
{
    hint[0] = 0;
    if (!f->has_bias) return 1;
    for (size_t k = 0; k < f->nbias; k++) {
        const tps_lbias *b = &f->bias[k];
        if (!type_listed(b->model_types, b->nmt, config)) continue;
        if (b->unless && tps_cond_eval(b->unless, config)) continue;
        if (!b->when || tps_cond_eval(b->when, config)) return 1;
        enable_hint(hint, len, b->when);
    }
    return 0;
}

/* The config settings under which a keys entry would name the bias
 * `name`, in hint (empty: none would). */
static void key_hint(const tps_lspec *s, const cJSON *config, const char *name, char *hint,
                     size_t len)
{
    const char *param = param_of(name);
    size_t ml;
    hint[0] = 0;
    if (!module_of(name, &ml)) return;
    for (size_t k = 0; k < s->nkeys; k++) {
        const tps_lkey *e = &s->keys[k];
        int p = 0, m = 0;
        for (size_t j = 0; j < e->nparams && !p; j++) p = !strcmp(e->params[j], param);
        for (size_t j = 0; j < e->npat && !m; j++) m = tps_module_match(e->patterns[j], name, ml);
        if (p && m && e->when && type_listed(e->model_types, e->nmt, config))
            enable_hint(hint, len, e->when);
    }
}

/* The split a serving layout gives a source tensor; a refusal's reason in
 * *why. */
static tps_split_kind spec_split(const tps_layout *L, size_t i, const char **why)
{
    const tps_lspec *s = L->spec;
    const tps_ctensor *t = &L->ck->t[i];
    const char *param = param_of(t->name);
    size_t ml;
    if (why) *why = NULL;
    if (module_of(t->name, &ml))
        for (size_t k = 0; k < s->nrules; k++) {
            const tps_lrule *r = &s->rules[k];
            if (r->param && strcmp(r->param, param)) continue;
            for (size_t j = 0; j < r->npat; j++) {
                if (!tps_module_match(r->patterns[j], t->name, ml)) continue;
                if (r->when && !tps_cond_eval(r->when, L->ck->config)) break;
                if (r->refuse) {
                    if (why) *why = r->refuse;
                    return TPS_SPLIT_REFUSE;
                }
                return r->split;
            }
        }
    if (!strcmp(param, "weight") && matches_any(s->vocab, s->nvocab, t->name)) return TPS_SPLIT_VOCAB;
    switch (L->p[i].style) {
    case TPS_STYLE_COLWISE:
        return L->p[i].dim == 0 ? TPS_SPLIT_ROWS : TPS_SPLIT_REPLICATE;
    case TPS_STYLE_ROWWISE:
        return L->p[i].dim == 1 ? TPS_SPLIT_COLUMNS : TPS_SPLIT_REPLICATE;
    case TPS_STYLE_EMBED_ROWWISE:
        return L->p[i].dim == 0 ? TPS_SPLIT_VOCAB : TPS_SPLIT_REPLICATE;
    case TPS_STYLE_EMBED_COLWISE:
        return L->p[i].dim == 1 ? TPS_SPLIT_COLUMNS : TPS_SPLIT_REPLICATE;
    default: return TPS_SPLIT_REPLICATE;
    }
}

/* ------------------------------------------------------------------ quantized weights */

/* Rank r's [lo, lo + len) of n along a dim, blocks of b: does it start and
 * end on a block boundary (the end of the dim counts as one)? */
static int block_aligned(uint64_t n, uint64_t lo, uint64_t len, uint64_t b)
{
    return lo % b == 0 && ((lo + len) % b == 0 || lo + len == n);
}

/* "1, 2" of the tp values up to 64 whose split of n (torch.chunk or exact;
 * or on whole heads, replicated when fewer than ranks) cuts n only on
 * multiples of b. */
static void block_tps(char *buf, size_t len, uint64_t n, uint64_t b, int exact, uint64_t heads,
                      int replicate)
{
    size_t o = 0;
    buf[0] = 0;
    for (int tp = 1; tp <= 64 && o < len; tp++) {
        int ok = 1;
        for (int r = 0; r < tp && ok; r++) {
            uint64_t lo, l;
            ok = part_rows(n, heads, replicate, tp, r, exact, &lo, &l) && block_aligned(n, lo, l, b);
        }
        if (ok) o += (size_t)snprintf(buf + o, len - o, "%s%d", o ? ", " : "", tp);
    }
    if (!o) snprintf(buf, len, "none up to 64");
}

/* "1, 2" of the tp values up to 64 at which every part of fused group f
 * (rows nrows[j], split on whole heads or evenly) gives each rank whole
 * blocks of b rows: the engines concatenate the parts' scale blocks. */
static void fused_block_tps(char *buf, size_t len, const tps_lfuse *f, const uint64_t *nrows,
                            const uint64_t *heads, uint64_t b)
{
    size_t o = 0;
    buf[0] = 0;
    for (int tp = 1; tp <= 64 && o < len; tp++) {
        int ok = 1;
        for (size_t j = 0; j < f->nparts && ok; j++) {
            uint64_t lo, l; /* every rank's rows are as many as rank 0's */
            ok = part_rows(nrows[j], heads[j], f->parts[j].replicate, tp, 0, 1, &lo, &l) &&
                 l % b == 0;
        }
        if (ok) o += (size_t)snprintf(buf + o, len - o, "%s%d", o ? ", " : "", tp);
    }
    if (!o) snprintf(buf, len, "none up to 64");
}

/* The region of weight w's scale that follows the weight's rows or columns
 * [lo, lo + len) along d (d -1: the whole weight): block rows or columns,
 * channel rows, or the whole scale. 0 (and a refusal) for a cut inside a
 * block. */
static int scale_region(cstate *C, size_t w, int d, uint64_t lo, uint64_t len, int *sd,
                        uint64_t *slo, uint64_t *shi, uint64_t heads, int replicate)
{
    const tps_quant *q = C->L->q;
    const tps_ctensor *wt = &C->ck->t[w];
    size_t s = (size_t)q->partner[w];
    *sd = -1;
    *slo = *shi = 0;
    if (d < 0) return 1;
    if (q->kind[s] == TPS_QS_TENSOR) return 1;
    if (q->kind[s] == TPS_QS_CHANNEL) {
        if (d != 0) return 1; /* input features: every rank needs every row's scale */
        *sd = 0;
        *slo = lo;
        *shi = lo + len;
        return 1;
    }
    uint64_t b = d == 0 ? q->bn : q->bk, n = wt->shape[d];
    if (!block_aligned(n, lo, len, b)) {
        char works[300];
        block_tps(works, sizeof works, n, b, C->L->spec ? C->L->spec->exact : 0, heads, replicate);
        refuse(C, "tensor '%s' is FP8 in blocks of %llu x %llu: a rank's %s [%llu, %llu) would "
                  "cut a block at tp %d, and its scales could not follow (tp values that work: %s)",
               wt->name, (unsigned long long)q->bn, (unsigned long long)q->bk,
               d == 0 ? "rows" : "columns", (unsigned long long)lo, (unsigned long long)(lo + len),
               C->tp, works);
        return 0;
    }
    *sd = d;
    *slo = len ? lo / b : (lo + b - 1) / b;
    *shi = len ? (lo + len + b - 1) / b : *slo;
    return 1;
}

/* The dtype a scale is written in: the layout's (F32), else as stored. 0
 * and a refusal when it cannot be widened exactly. */
static int scale_dtype(cstate *C, const tps_ctensor *st, tps_dtype *out)
{
    const tps_lspec *sp = C->L->spec;
    *out = st->dtype;
    if (!sp || !sp->scale_f32) return 1;
    if (!tps_cast_ok(st->dtype)) {
        refuse(C, "scale '%s' is %s: layout %s holds scales in F32, and %s does not widen to F32 "
                  "exactly",
               st->name, tps_dtype_name(st->dtype), sp->name, tps_dtype_name(st->dtype));
        return 0;
    }
    *out = TPS_F32;
    return 1;
}

/* A per-tensor scale's shape as the layout writes it: [] as [1] when it says so. */
static int scalar_ndim(const cstate *C, const tps_ctensor *st, uint64_t *shape)
{
    if (st->ndim == 0 && C->L->spec && C->L->spec->scalar_as_1) {
        shape[0] = 1;
        return 1;
    }
    return st->ndim;
}

/* Weight w's scale (and input scale) on rank r, as their own rank tensors:
 * the scale's region following the weight's [lo, lo + len) along d. */
static tps_err place_scales(cstate *C, size_t w, int r, int d, uint64_t lo, uint64_t len)
{
    const tps_quant *q = C->L->q;
    if (!q || q->role[w] != TPS_QR_WEIGHT) return TPS_OK;
    size_t s = (size_t)q->partner[w];
    const tps_ctensor *st = &C->ck->t[s];
    int sd;
    uint64_t slo, shi;
    if (!scale_region(C, w, d, lo, len, &sd, &slo, &shi, 0, 0)) return TPS_OK;
    uint64_t shape[TPS_MAX_DIMS];
    tps_dtype dt;
    memcpy(shape, st->shape, sizeof shape);
    if (sd >= 0) shape[sd] = shi - slo;
    if (!scale_dtype(C, st, &dt)) return TPS_OK;
    tps_rtensor *rt;
    TPS_TRY(new_rt(C, st->name, r, dt, scalar_ndim(C, st, shape), shape, "scale", &rt));
    TPS_TRY(src_piece(C, rt, s, sd, slo, shi, 0));
    if (q->input[w] >= 0) {
        const tps_ctensor *it = &C->ck->t[q->input[w]];
        memcpy(shape, it->shape, sizeof shape);
        if (!scale_dtype(C, it, &dt)) return TPS_OK;
        TPS_TRY(new_rt(C, it->name, r, dt, scalar_ndim(C, it, shape), shape, "input scale", &rt));
        TPS_TRY(src_piece(C, rt, (size_t)q->input[w], -1, 0, 0, 0));
    }
    return TPS_OK;
}

/* Places source tensor i, whole or along dim d, under name on every rank:
 * d -1 replicated; exact/chunk splits; vocab: padded rows of zeros. */
static tps_err place_simple(cstate *C, size_t i, const char *name, tps_split_kind k,
                            const char *rule)
{
    tps_layout *L = C->L;
    const tps_ctensor *t = &C->ck->t[i];
    int exact = L->spec ? L->spec->exact : 0;
    int d = k == TPS_SPLIT_ROWS || k == TPS_SPLIT_VOCAB ? 0 : k == TPS_SPLIT_COLUMNS ? 1 : -1;
    if (d >= t->ndim) {
        if (L->spec)
            refuse(C, "%s: tensor '%s' is %d-D, but layout %s splits it along dim %d", C->ck->path,
                   t->name, t->ndim, L->spec->name, d);
        else
            return tps_fail(C->ctx, TPS_E_SHAPE, "%s: tensor '%s' is %d-D but is split along dim %d",
                            C->ck->path, t->name, t->ndim, d);
        return TPS_OK;
    }
    uint64_t n = d >= 0 ? t->shape[d] : 0, per = 0, pad = L->spec ? L->spec->vocab_pad : 0;
    char works[300];
    if (k == TPS_SPLIT_VOCAB && L->spec) {
        uint64_t padded = pad ? (n + pad - 1) / pad * pad : n;
        if (padded % (uint64_t)C->tp && L->spec->vocab_pad_tp && pad) {
            uint64_t m = pad * (uint64_t)C->tp; /* the engine pads further */
            padded = (n + m - 1) / m * m;
        }
        if (exact && padded % (uint64_t)C->tp) {
            int present;
            int named = config_count(C->ck->config, "vocab_size", &present) == n;
            works_list(works, sizeof works, n, pad, ok_vocab);
            refuse(C, "%s%llu rows, padded to a multiple of %llu (%llu), are not divisible by tp %d "
                      "(layout %s splits tensor '%s' evenly; tp values that work: %s)",
                   named ? "vocab_size: " : "the vocabulary's ", (unsigned long long)n,
                   (unsigned long long)pad, (unsigned long long)padded, C->tp, L->spec->name,
                   t->name, works);
            return TPS_OK;
        }
        per = exact ? padded / (uint64_t)C->tp : 0;
    } else if (d >= 0 && exact && n % (uint64_t)C->tp) {
        works_list(works, sizeof works, n, 0, ok_divides);
        refuse(C, "tensor '%s': dim %d of %llu does not divide by tp %d (layout %s splits it "
                  "evenly; tp values that work: %s)",
               t->name, d, (unsigned long long)n, C->tp, L->spec->name, works);
        return TPS_OK;
    }
    for (int r = 0; r < C->tp; r++) {
        uint64_t shape[TPS_MAX_DIMS], lo = 0, len = 0;
        memcpy(shape, t->shape, sizeof shape);
        tps_rtensor *rt;
        if (d < 0) {
            TPS_TRY(new_rt(C, name, r, t->dtype, t->ndim, shape, rule, &rt));
            TPS_TRY(src_piece(C, rt, i, -1, 0, 0, 0));
            TPS_TRY(place_scales(C, i, r, -1, 0, 0));
            continue;
        }
        if (per) { /* padded vocabulary: real rows, then zeros */
            lo = (uint64_t)r * per < n ? (uint64_t)r * per : n;
            len = (uint64_t)(r + 1) * per < n ? (uint64_t)(r + 1) * per - lo : n - lo;
            shape[0] = per;
        } else {
            split_range(n, C->tp, r, exact, &lo, &len);
            shape[d] = len;
        }
        TPS_TRY(new_rt(C, name, r, t->dtype, t->ndim, shape, rule, &rt));
        uint64_t rowb = inner_bits(t, d) / 8;
        if (len || !per) TPS_TRY(src_piece(C, rt, i, d, lo, lo + len, 0));
        if (per > len)
            TPS_TRY(add_piece(C, rt, (tps_lpiece){.kind = TPS_PK_ZERO, .at = len * rowb,
                                                  .nbytes = (per - len) * rowb}));
        if (L->q && L->q->role[i] == TPS_QR_WEIGHT && per) {
            refuse(C, "tensor '%s' is quantized, and layout %s pads it as a vocabulary: not "
                      "supported yet",
                   t->name, L->spec->name);
            return TPS_OK;
        }
        TPS_TRY(place_scales(C, i, r, d, lo, len));
        if (C->why[0]) return TPS_OK;
    }
    return TPS_OK;
}

/* A fused group's scales on rank r: block rows or channel rows of every
 * part's scale, in the parts' order (a rank's rows of each part must be
 * whole blocks), or, per tensor, one value per part; input scales one per
 * part. */
/* One value per part, in the parts' order: the rank tensor `name` of the
 * tensors of[idx[j]] (the weights' per-tensor scales or their input scales),
 * `what` naming them in a refusal. */
static tps_err fuse_scalars(cstate *C, const tps_lfuse *f, const size_t *idx, const int *of, int r,
                            const char *name, const char *what, const char *rule)
{
    const tps_ctensor *t0 = &C->ck->t[of[idx[0]]];
    tps_dtype dt;
    if (!scale_dtype(C, t0, &dt)) return TPS_OK;
    uint64_t shape[TPS_MAX_DIMS] = {f->nparts};
    tps_rtensor *rt;
    TPS_TRY(new_rt(C, name, r, dt, 1, shape, rule, &rt));
    for (size_t j = 0; j < f->nparts; j++) {
        if (C->ck->t[of[idx[j]]].dtype != t0->dtype) {
            refuse(C, "the %s fused into '%s' are of different dtypes", what, name);
            return TPS_OK;
        }
        TPS_TRY(src_piece(C, rt, (size_t)of[idx[j]], -1, 0, 0, j * (tps_dtype_bits(dt) / 8)));
    }
    return TPS_OK;
}

static tps_err place_fused_scales(cstate *C, const tps_lfuse *f,
                                  const size_t *idx, int r, const uint64_t *lo, const uint64_t *len,
                                  const uint64_t *heads, const uint64_t *nrows_of,
                                  const char *scale_name, const char *input_name)
{
    const tps_quant *q = C->L->q;
    const tps_ckpt *ck = C->ck;
    const tps_ctensor *s0 = &ck->t[q->partner[idx[0]]];
    tps_qscale kind = q->kind[q->partner[idx[0]]];
    uint64_t shape[TPS_MAX_DIMS] = {0};
    tps_rtensor *rt;
    tps_dtype dt;
    if (!scale_dtype(C, s0, &dt)) return TPS_OK;
    uint64_t es = tps_dtype_bits(dt) / 8; /* bytes an element, as written */
    if (kind == TPS_QS_TENSOR) {
        int refused = C->why[0] != 0;
        TPS_TRY(fuse_scalars(C, f, idx, q->partner, r, scale_name, "scales", "scale"));
        if (!refused && C->why[0]) return TPS_OK;
    } else {
        uint64_t slo[16], shi[16], rows = 0;
        int sd = 0;
        for (size_t j = 0; j < f->nparts; j++) {
            /* An engine concatenates the parts' scale blocks: each part's
             * rows on a rank must be whole blocks, even at tp 1. */
            if (kind == TPS_QS_BLOCK && len[j] % q->bn) {
                const tps_ctensor *wt = &ck->t[idx[j]];
                char works[300];
                fused_block_tps(works, sizeof works, f, nrows_of, heads, q->bn);
                refuse(C, "tensor '%s' is FP8 in blocks of %llu x %llu: layout %s fuses it into "
                          "'%s', and a rank's %llu rows of it at tp %d are not whole blocks, so "
                          "the engine would pair scale blocks with the wrong rows (tp values "
                          "that work: %s)",
                       wt->name, (unsigned long long)q->bn, (unsigned long long)q->bk,
                       C->L->spec->name, scale_name, (unsigned long long)len[j], C->tp, works);
                return TPS_OK;
            }
            if (!scale_region(C, idx[j], 0, lo[j], len[j], &sd, &slo[j], &shi[j], heads[j],
                              f->parts[j].replicate))
                return TPS_OK;
            rows += shi[j] - slo[j];
        }
        memcpy(shape, s0->shape, sizeof shape);
        shape[0] = rows;
        TPS_TRY(new_rt(C, scale_name, r, dt, s0->ndim, shape, "scale", &rt));
        uint64_t at = 0, rowb = es * (s0->ndim == 2 ? s0->shape[1] : 1);
        for (size_t j = 0; j < f->nparts; j++) {
            const tps_ctensor *sj = &ck->t[q->partner[idx[j]]];
            if (sj->dtype != s0->dtype || sj->ndim != s0->ndim ||
                (sj->ndim == 2 && sj->shape[1] != s0->shape[1])) {
                refuse(C, "the scales fused into '%s' differ in dtype or width", scale_name);
                return TPS_OK;
            }
            TPS_TRY(src_piece(C, rt, (size_t)q->partner[idx[j]], 0, slo[j], shi[j], at));
            at += (shi[j] - slo[j]) * rowb;
        }
    }
    if (input_name) TPS_TRY(fuse_scalars(C, f, idx, q->input, r, input_name, "input scales", "input scale"));
    return TPS_OK;
}

/* Whether the engine makes extra entry x for this checkpoint: its
 * quantization method ("none": unquantized) and config conditions. */
static int extra_applies(const cstate *C, const tps_lextra *x)
{
    if (x->quant) {
        const tps_quant *q = C->L->q;
        if (!strcmp(x->quant, "none") ? q != NULL : !q || strcmp(q->method_name, x->quant))
            return 0;
    }
    if (x->when && !tps_cond_eval(x->when, C->ck->config)) return 0;
    if (x->unless && tps_cond_eval(x->unless, C->ck->config)) return 0;
    return 1;
}

/* The dtype an engine serves the model in (dtype "auto"): config.json's
 * torch_dtype (or dtype, or text_config's), float32 served as BF16, BF16 when
 * none is given. Its scalar parameters are created in it. */
static tps_dtype serving_dtype(const cJSON *config)
{
    const cJSON *v = tps_config_get(config, "torch_dtype");
    if (!cJSON_IsString(v)) v = tps_config_get(config, "dtype");
    return cJSON_IsString(v) && !strcmp(v->valuestring, "float16") ? TPS_F16 : TPS_BF16;
}

/* One fused group: parent.<part>.<param> for every part, written as
 * parent.<into>.<param>. idx[j] is part j's source tensor. */
static tps_err place_fused(cstate *C, const tps_lfuse *f, const char *parent, const char *param,
                           const size_t *idx, const uint64_t *base, const uint64_t *nrows)
{
    tps_layout *L = C->L;
    const tps_ckpt *ck = C->ck;
    const tps_ctensor *t0 = &ck->t[idx[0]];
    char works[300];
    uint64_t heads[16];
    for (size_t j = 0; j < f->nparts; j++) {
        const tps_ctensor *t = &ck->t[idx[j]];
        const tps_lpart *p = &f->parts[j];
        int same = t->dtype == t0->dtype && t->ndim == t0->ndim && t->ndim >= 1;
        for (int d = 1; same && d < t->ndim; d++) same = t->shape[d] == t0->shape[d];
        if (!same) {
            refuse(C, "layout %s fuses %s.{...}.%s into %s.%s.%s, but '%s' (%s, %d-D) does not "
                      "match '%s' (%s, %d-D) in dtype or in its dims after the first",
                   L->spec->name, parent, param, parent, f->into, param, t->name,
                   tps_dtype_name(t->dtype), t->ndim, t0->name, tps_dtype_name(t0->dtype), t0->ndim);
            return TPS_OK;
        }
        const char *why = NULL;
        tps_split_kind sk = spec_split(L, idx[j], &why);
        if (sk == TPS_SPLIT_REFUSE) {
            refuse(C, "tensor '%s': %s (layout %s)", t->name, why, L->spec->name);
            return TPS_OK;
        }
        if (sk != TPS_SPLIT_ROWS) {
            refuse(C, "layout %s fuses '%s' into %s.%s, but the plan does not split it by rows "
                      "(style %s)",
                   L->spec->name, t->name, parent, f->into, tps_style_name(L->p[idx[j]].style));
            return TPS_OK;
        }
        uint64_t rows = nrows[j];
        if (p->heads) {
            int present;
            uint64_t h = config_count(ck->config, p->heads, &present);
            if (!ck->config || !h) {
                char *lack = present ? NULL : tps_config_lacks(p->heads);
                refuse(C, "layout %s splits '%s' on whole heads, but config.json %s%s",
                       L->spec->name, t->name, present ? "has no usable count in " : "",
                       present ? p->heads : lack ? lack : "lacks it");
                free(lack);
                return TPS_OK;
            }
            if (rows % h) {
                refuse(C, "tensor '%s' has %llu rows, not a whole number of its %llu heads (%s)",
                       t->name, (unsigned long long)rows, (unsigned long long)h, p->heads);
                return TPS_OK;
            }
            int ok = h % (uint64_t)C->tp == 0 ||
                     (p->replicate && h < (uint64_t)C->tp && (uint64_t)C->tp % h == 0);
            if (!ok) {
                works_list(works, sizeof works, h, 0, p->replicate ? ok_heads_rep : ok_divides);
                if (p->replicate)
                    refuse(C, "%s = %llu: tp %d neither divides it nor is a multiple of it (layout "
                              "%s splits '%s' into whole heads, each on tp / %s ranks when there "
                              "are fewer than ranks; tp values that work: %s)",
                           p->heads, (unsigned long long)h, C->tp, L->spec->name, t->name, p->heads,
                           works);
                else
                    refuse(C, "%s = %llu is not divisible by tp %d (layout %s splits '%s' into "
                              "whole heads; tp values that work: %s)",
                           p->heads, (unsigned long long)h, C->tp, L->spec->name, t->name, works);
                return TPS_OK;
            }
            heads[j] = h;
        } else {
            if (L->spec->exact && rows % (uint64_t)C->tp) {
                works_list(works, sizeof works, rows, 0, ok_divides);
                if (p->rows)
                    refuse(C, "%s = %llu is not divisible by tp %d (layout %s splits '%s' evenly; "
                              "tp values that work: %s)",
                           p->rows, (unsigned long long)rows, C->tp, L->spec->name, t->name, works);
                else
                    refuse(C, "tensor '%s': %llu rows do not divide by tp %d (layout %s splits "
                              "them evenly; tp values that work: %s)",
                           t->name, (unsigned long long)rows, C->tp, L->spec->name, works);
                return TPS_OK;
            }
            heads[j] = 0;
        }
    }
    char *name = own_name(C, tps_asprintf("%s.%s.%s", parent, f->into, param));
    if (!name) return nomem(C);
    uint64_t rowb = inner_bits(t0, 0) / 8;
    /* Quantized parts: all of them, with scales of one kind, fused alike. */
    int quant = 0;
    const char *scale_name = NULL, *input_name = NULL;
    if (L->q) {
        size_t nq = 0, ni = 0;
        for (size_t j = 0; j < f->nparts; j++) {
            nq += L->q->role[idx[j]] == TPS_QR_WEIGHT;
            ni += L->q->role[idx[j]] == TPS_QR_WEIGHT && L->q->input[idx[j]] >= 0;
        }
        if (nq && (nq != f->nparts || (ni && ni != f->nparts))) {
            refuse(C, "layout %s fuses %s.%s, but only some of its parts are quantized (or have "
                      "input scales): not supported",
                   L->spec->name, parent, f->into);
            return TPS_OK;
        }
        for (size_t j = 1; nq && j < f->nparts; j++)
            if (L->q->kind[L->q->partner[idx[j]]] != L->q->kind[L->q->partner[idx[0]]]) {
                refuse(C, "layout %s fuses %s.%s, but its parts' scales are of different kinds",
                       L->spec->name, parent, f->into);
                return TPS_OK;
            }
        if (nq && idx[0] == idx[f->nparts - 1]) {
            refuse(C, "tensor '%s' is quantized and packed: not supported yet", ck->t[idx[0]].name);
            return TPS_OK;
        }
        if (nq) {
            quant = 1;
            const char *sn = ck->t[L->q->partner[idx[0]]].name;
            size_t pl = strlen(ck->t[idx[0]].name) - strlen("weight");
            scale_name = own_name(C, tps_asprintf("%s.%s.%s", parent, f->into, sn + pl));
            if (!scale_name) return nomem(C);
            if (ni) {
                input_name = own_name(C, tps_asprintf("%s.%s.input_scale", parent, f->into));
                if (!input_name) return nomem(C);
            }
        }
    }
    for (int r = 0; r < C->tp; r++) {
        uint64_t lo[16], len[16], total = 0;
        for (size_t j = 0; j < f->nparts; j++) {
            /* checked above: every part splits at this tp */
            part_rows(nrows[j], heads[j], f->parts[j].replicate, C->tp, r, L->spec->exact, &lo[j],
                      &len[j]);
            total += len[j];
        }
        uint64_t shape[TPS_MAX_DIMS];
        memcpy(shape, t0->shape, sizeof shape);
        shape[0] = total;
        tps_rtensor *rt;
        TPS_TRY(new_rt(C, name, r, t0->dtype, t0->ndim, shape, f->into, &rt));
        uint64_t at = 0;
        for (size_t j = 0; j < f->nparts; j++) {
            TPS_TRY(src_piece(C, rt, idx[j], 0, base[j] + lo[j], base[j] + lo[j] + len[j], at));
            at += len[j] * rowb;
        }
        if (quant) TPS_TRY(place_fused_scales(C, f, idx, r, lo, len, heads, nrows,
                                              scale_name, input_name));
        if (C->why[0]) return TPS_OK;
    }
    /* The engine's own entries beside the fused module (once, with the weight). */
    if (strcmp(param, "weight")) return TPS_OK;
    for (size_t e = 0; e < f->nextra; e++) {
        const tps_lextra *x = &f->extra[e];
        if (!extra_applies(C, x)) continue;
        char *xn = own_name(C, tps_asprintf("%s.%s", parent, x->name));
        if (!xn) return nomem(C);
        uint64_t xs[TPS_MAX_DIMS] = {x->len};
        tps_dtype xd = x->model_dtype ? serving_dtype(ck->config) : x->dtype;
        for (int r = 0; r < C->tp; r++) {
            tps_rtensor *rt;
            TPS_TRY(new_rt(C, xn, r, xd, x->ndim, xs, NULL, &rt));
            rt->rule = "extra";
            TPS_TRY(add_piece(C, rt, (tps_lpiece){.kind = TPS_PK_CONST, .at = 0,
                                                  .nbytes = rt->nbytes, .value = x->value}));
        }
    }
    return TPS_OK;
}

/* The sections of a packed tensor of the plan, by row: their offsets and
 * counts from config.json. 0 with C->why set when they do not add up to the
 * tensor's rows. */
static int packed_rows(cstate *C, const tps_packed *k, size_t i, uint64_t *base, uint64_t *rows)
{
    const tps_ctensor *t = &C->ck->t[i];
    uint64_t at = 0;
    char why[256], list[512];
    size_t o = 0;
    list[0] = 0;
    for (size_t j = 0; j < k->nsec; j++) {
        if (tps_expr_eval(k->sec[j].rows, C->ck->config, &rows[j], why, sizeof why)) {
            refuse(C, "tensor '%s' packs %s, whose rows (%s) config.json cannot give: %s",
                   t->name, k->sec[j].name, k->sec[j].rows, why);
            return 0;
        }
        base[j] = at;
        at += rows[j];
        if (o < sizeof list)
            o += (size_t)snprintf(list + o, sizeof list - o, "%s%s %llu (%s)", j ? " + " : "",
                                  k->sec[j].name, (unsigned long long)rows[j], k->sec[j].rows);
    }
    if (t->ndim < 1 || at != t->shape[0]) {
        refuse(C, "tensor '%s' has %llu rows, but the plan packs %s = %llu rows into it: the "
                  "checkpoint does not match its config.json",
               t->name, t->ndim ? (unsigned long long)t->shape[0] : 0ULL, list,
               (unsigned long long)at);
        return 0;
    }
    return 1;
}

/* Fusion f's parts as sections of one packed tensor parent.X.param of the
 * plan (each part a section by name), if there is one. */
static tps_err packed_parts(cstate *C, const tps_lfuse *f, const char *parent, const char *param,
                            size_t *idx, uint64_t *base, uint64_t *nrows, int *found)
{
    const tps_ckpt *ck = C->ck;
    const tps_plan *plan = C->L->plan;
    *found = 0;
    for (size_t kk = 0; plan && kk < plan->npacked; kk++) {
        const tps_packed *k = &plan->packed[kk];
        /* a tensor parent.<leaf>.param matching the rule */
        for (size_t i = 0; i < ck->n; i++) {
            const char *nm = ck->t[i].name;
            size_t pl = strlen(parent), ml;
            if (strncmp(nm, parent, pl) || nm[pl] != '.' || !module_of(nm, &ml) ||
                strcmp(nm + ml + 1, param) || memchr(nm + pl + 1, '.', ml - pl - 1) ||
                tps_plan_packed(plan, nm) != k)
                continue;
            uint64_t sb[16], sr[16];
            if (!packed_rows(C, k, i, sb, sr)) return TPS_OK;
            size_t hit = 0;
            for (size_t j = 0; j < f->nparts; j++)
                for (size_t q = 0; q < k->nsec; q++)
                    if (!strcmp(k->sec[q].name, f->parts[j].module)) {
                        idx[j] = i;
                        base[j] = sb[q];
                        nrows[j] = sr[q];
                        hit++;
                    }
            if (hit == f->nparts) {
                *found = 1;
                return TPS_OK;
            }
        }
    }
    return TPS_OK;
}

/* ------------------------------------------------------------------ experts */

/* Tensor i as <module>.<e>.<leaf>.<param> with module matching x: 1 and the
 * module's length, e, and the leaf's span. */
static int expert_name(const tps_lexperts *x, const char *nm, size_t *mlen, uint64_t *e,
                       const char **leaf, size_t *leaflen)
{
    size_t ml;
    if (!module_of(nm, &ml)) return 0;
    const char *dl = memrchr(nm, '.', ml); /* before <leaf> */
    if (!dl) return 0;
    const char *de = memrchr(nm, '.', (size_t)(dl - nm)); /* before <e> */
    if (!de || de + 1 == dl || dl - de > 8) return 0;
    uint64_t v = 0;
    for (const char *c = de + 1; c < dl; c++) {
        if (*c < '0' || *c > '9') return 0;
        v = v * 10 + (uint64_t)(*c - '0');
    }
    size_t pl = (size_t)(de - nm);
    int hit = 0;
    for (size_t k = 0; k < x->npat && !hit; k++) hit = tps_module_match(x->patterns[k], nm, pl);
    if (!hit) return 0;
    *mlen = pl;
    *e = v;
    *leaf = dl + 1;
    *leaflen = ml - (size_t)(dl + 1 - nm);
    return 1;
}

/* One experts module (tensors [a, b) of the checkpoint, all named
 * <module>.*): its stacks on every rank, and its router. */
static tps_err place_experts(cstate *C, const tps_lexperts *x, const char *module, size_t a,
                             size_t b)
{
    tps_layout *L = C->L;
    const tps_ckpt *ck = C->ck;
    const char *lname = L->spec->name;
    int present;
    uint64_t E = config_count(ck->config, x->count, &present), tp = (uint64_t)C->tp;
    if (!E) {
        char *why = present ? NULL : tps_config_lacks(x->count);
        refuse(C, "layout %s stacks the experts of '%s', but config.json %s%s", lname, module,
               present ? "has no usable count in " : "", present ? x->count : why ? why : "lacks it");
        free(why);
        return TPS_OK;
    }
    if (E > 65536) {
        refuse(C, "%s = %llu experts: more than tpshard handles (65536)", x->count,
               (unsigned long long)E);
        return TPS_OK;
    }
    /* Every tensor under the module must be a stacked expert weight. */
    for (size_t i = a; i < b; i++) {
        const char *nm = ck->t[i].name, *leaf;
        size_t ml, ll;
        uint64_t e;
        if (!expert_name(x, nm, &ml, &e, &leaf, &ll) || ml != strlen(module)) {
            refuse(C, "tensor '%s' lies under '%s', which layout %s stacks as experts "
                      "<e>.<module>.weight: it is not one",
                   nm, module, lname);
            return TPS_OK;
        }
        if (e >= E) {
            refuse(C, "tensor '%s' is expert %llu, but config.json says %s = %llu", nm,
                   (unsigned long long)e, x->count, (unsigned long long)E);
            return TPS_OK;
        }
        if (L->q && L->q->role[i] != TPS_QR_PLAIN) {
            refuse(C, "tensor '%s' is a quantized expert: layout %s does not stack quantized "
                      "experts yet",
                   nm, lname);
            return TPS_OK;
        }
        if (strcmp(param_of(nm), "weight")) {
            refuse(C, "tensor '%s': layout %s stacks expert weights; the engine has no place "
                      "for an expert's %s",
                   nm, lname, param_of(nm));
            return TPS_OK;
        }
        int known = 0;
        for (size_t s = 0; s < x->nstacks && !known; s++)
            for (size_t j = 0; j < x->stacks[s].nparts && !known; j++)
                known = strlen(x->stacks[s].parts[j]) == ll && !memcmp(x->stacks[s].parts[j], leaf, ll);
        if (!known) {
            refuse(C, "tensor '%s': layout %s does not know expert module '%.*s'", nm, lname,
                   (int)ll, leaf);
            return TPS_OK;
        }
    }
    /* Each expert's parts, with one shape: rows stacks [I, H], columns [H, I]. */
    size_t nidx = 0;
    for (size_t s = 0; s < x->nstacks; s++) nidx += x->stacks[s].nparts;
    size_t *idx = tps_xcalloc((size_t)E * nidx, sizeof *idx);
    if (!idx) return nomem(C);
    tps_err rc = TPS_OK;
    uint64_t I = 0, H = 0;
    const tps_ctensor *t0 = NULL;
    for (uint64_t e = 0; e < E && !C->why[0]; e++) {
        size_t k = 0;
        for (size_t s = 0; s < x->nstacks && !C->why[0]; s++)
            for (size_t j = 0; j < x->stacks[s].nparts && !C->why[0]; j++, k++) {
                char *want = tps_asprintf("%s.%llu.%s.weight", module, (unsigned long long)e,
                                          x->stacks[s].parts[j]);
                if (!want) {
                    free(idx);
                    return nomem(C);
                }
                int w = tps_ckpt_find(ck, want);
                if (w < 0) {
                    refuse(C, "config.json says %s = %llu, but the checkpoint lacks '%s'",
                           x->count, (unsigned long long)E, want);
                    free(want);
                    break;
                }
                free(want);
                const tps_ctensor *t = &ck->t[w];
                int d = x->stacks[s].dim;
                if (!t0) {
                    t0 = t;
                    I = t->ndim == 2 ? t->shape[d] : 0;
                    H = t->ndim == 2 ? t->shape[1 - d] : 0;
                }
                if (t->ndim != 2 || t->dtype != t0->dtype || t->shape[d] != I ||
                    t->shape[1 - d] != H) {
                    refuse(C, "expert tensor '%s' (%s, %d-D) does not match '%s' (%s, [%llu, "
                              "%llu] with its rows or columns the expert's intermediate size "
                              "%llu): layout %s stacks experts of one shape",
                           t->name, tps_dtype_name(t->dtype), t->ndim, t0->name,
                           tps_dtype_name(t0->dtype), (unsigned long long)t0->shape[0],
                           t0->ndim == 2 ? (unsigned long long)t0->shape[1] : 0ULL,
                           (unsigned long long)I, lname);
                    break;
                }
                idx[e * nidx + k] = (size_t)w;
            }
    }
    if (C->why[0]) goto done;
    if (x->rows) {
        uint64_t want = config_count(ck->config, x->rows, &present);
        if (present && want != I) {
            refuse(C, "%s = %llu in config.json, but the experts of '%s' have %llu", x->rows,
                   (unsigned long long)want, module, (unsigned long long)I);
            goto done;
        }
    }
    const char *rows_name = x->rows ? x->rows : "the expert intermediate size";
    if (L->ep) {
        if (E % tp) {
            char works[300];
            works_list(works, sizeof works, E, 0, ok_divides);
            refuse(C, "%s = %llu is not divisible by the EP size %d (with --ep each rank holds the "
                      "same number of whole experts; tp values that work: %s)",
                   x->count, (unsigned long long)E, C->tp, works);
            goto done;
        }
    } else {
        if (tp > E) {
            refuse(C, "%s = %llu < tp %d: the engine refuses more ranks than experts (split with "
                      "--ep, or a smaller tp)",
                   x->count, (unsigned long long)E, C->tp);
            goto done;
        }
        if (I % tp) {
            char works[300];
            works_list(works, sizeof works, I, 0, ok_divides);
            refuse(C, "%s = %llu is not divisible by tp %d (layout %s splits every expert's rows "
                      "evenly; tp values that work: %s; or split with --ep)",
                   rows_name, (unsigned long long)I, C->tp, lname, works);
            goto done;
        }
    }
    uint64_t Er = L->ep ? E / tp : E, Ir = L->ep ? I : I / tp;
    uint64_t es = tps_dtype_bits(t0->dtype) / 8;
    for (int r = 0; r < C->tp; r++) {
        uint64_t e0 = L->ep ? (uint64_t)r * Er : 0;
        size_t k0 = 0;
        for (size_t s = 0; s < x->nstacks; s++) {
            const tps_lstack *st = &x->stacks[s];
            char *name = own_name(C, x->into ? tps_asprintf("%s.%s.%s", module, x->into, st->name)
                                             : tps_asprintf("%s.%s", module, st->name));
            if (!name) {
                rc = nomem(C);
                goto done;
            }
            uint64_t shape[TPS_MAX_DIMS] = {Er, st->dim ? H : st->nparts * Ir, st->dim ? Ir : H};
            tps_rtensor *rt;
            if ((rc = new_rt(C, name, r, t0->dtype, 3, shape, "experts", &rt))) goto done;
            uint64_t lo = L->ep ? 0 : (uint64_t)r * Ir, hi = L->ep ? 0 : lo + Ir;
            for (uint64_t k = 0; k < Er; k++)
                for (size_t j = 0; j < st->nparts; j++) {
                    size_t w = idx[(e0 + k) * nidx + k0 + j];
                    uint64_t at = (k * st->nparts + j) * Ir * H * es;
                    if ((rc = src_piece(C, rt, w, L->ep ? -1 : st->dim, lo, hi, at))) goto done;
                }
            k0 += st->nparts;
        }
    }
done:
    free(idx);
    return rc;
}

/* Stacks the experts of every module the layout's experts entries match;
 * the routers they rename. */
static tps_err compile_experts(cstate *C)
{
    const tps_lspec *s = C->L->spec;
    const tps_ckpt *ck = C->ck;
    int any = 0;
    for (size_t xi = 0; xi < s->nexperts && !C->why[0]; xi++) {
        const tps_lexperts *x = &s->experts[xi];
        for (size_t i = 0; i < ck->n && !C->why[0];) {
            size_t ml, ll;
            uint64_t e;
            const char *leaf;
            if (C->used[i] || !expert_name(x, ck->t[i].name, &ml, &e, &leaf, &ll)) {
                i++;
                continue;
            }
            /* names sort: every tensor under <module>. follows */
            size_t b = i + 1;
            while (b < ck->n && !strncmp(ck->t[b].name, ck->t[i].name, ml + 1)) b++;
            char *module = tps_xmalloc(ml + 1);
            if (!module) return nomem(C);
            memcpy(module, ck->t[i].name, ml);
            module[ml] = 0;
            any = 1;
            tps_err rc = place_experts(C, x, module, i, b);
            if (!rc && !C->why[0] && x->router) {
                const char *dot = strrchr(module, '.');
                size_t pl = dot ? (size_t)(dot - module) : 0;
                char *rn = tps_asprintf("%.*s%s%s.weight", (int)pl, module, pl ? "." : "", x->router);
                char *as = tps_asprintf("%.*s%s%s.weight", (int)pl, module, pl ? "." : "", x->router_as);
                int ri = rn ? tps_ckpt_find(ck, rn) : -1;
                if (!rn || !as) {
                    rc = nomem(C);
                } else if (ri < 0) {
                    refuse(C, "layout %s stacks the experts of '%s', but the checkpoint lacks their "
                              "router '%s'",
                           s->name, module, rn);
                } else if (!C->used[ri]) {
                    char *owned = own_name(C, as);
                    as = NULL;
                    rc = owned ? place_simple(C, (size_t)ri, owned, TPS_SPLIT_REPLICATE, "router")
                               : nomem(C);
                }
                free(rn);
                free(as);
            }
            free(module);
            TPS_TRY(rc);
            i = b;
        }
    }
    if (C->L->ep && !any && !C->why[0])
        refuse(C, "--ep holds every expert whole on one rank, but layout %s finds no experts in "
                  "this checkpoint",
               s->name);
    return TPS_OK;
}

/* Finds fused groups: for each tensor that is the first part of a fusion,
 * its siblings. */
static tps_err compile_fused(cstate *C)
{
    const tps_lspec *s = C->L->spec;
    const tps_ckpt *ck = C->ck;
    for (size_t fi = 0; fi < s->nfuse; fi++) {
        const tps_lfuse *f = &s->fuse[fi];
        for (size_t i = 0; i < ck->n; i++) {
            const char *nm = ck->t[i].name;
            size_t ml;
            if (C->used[i] || !module_of(nm, &ml)) continue;
            const char *param = nm + ml + 1;
            /* scales go with their weights (place_fused) */
            if (strcmp(param, "weight") && strcmp(param, "bias")) continue;
            /* parent.<part>.param for each part: is nm one of them? */
            size_t which = f->nparts;
            size_t pl = 0;
            for (size_t j = 0; j < f->nparts && which == f->nparts; j++) {
                size_t lp = strlen(f->parts[j].module);
                if (ml > lp && nm[ml - lp - 1] == '.' && !memcmp(nm + ml - lp, f->parts[j].module, lp)) {
                    which = j;
                    pl = ml - lp - 1;
                }
            }
            const tps_packed *pk = which == f->nparts ? tps_plan_packed(C->L->plan, nm) : NULL;
            if (pk) { /* a packed tensor whose sections are f's parts (Phi-3's qkv_proj) */
                size_t hit = 0;
                for (size_t j = 0; j < f->nparts; j++)
                    for (size_t q = 0; q < pk->nsec; q++) hit += !strcmp(pk->sec[q].name, f->parts[j].module);
                if (hit == f->nparts) {
                    const char *dot = memrchr(nm, '.', ml);
                    if (dot) {
                        which = 0;
                        pl = (size_t)(dot - nm);
                    }
                }
            }
            if (which == f->nparts) continue;
            char *parent = tps_xmalloc(pl + 1);
            if (!parent) return nomem(C);
            memcpy(parent, nm, pl);
            parent[pl] = 0;
            char hint[256];
            int has_bias = fused_bias(f, ck->config, hint, sizeof hint);
            if (!has_bias && !strcmp(param, "bias")) {
                const cJSON *mt = tps_config_get(ck->config, "model_type");
                refuse(C, "tensor '%s': layout %s would fuse it into %s.%s.bias, but %s's model "
                          "(model_type %s) builds %s.%s without a bias%s%s%s",
                       nm, s->name, parent, f->into, s->target,
                       cJSON_IsString(mt) ? mt->valuestring : "not given", parent, f->into,
                       hint[0] ? ", so its loader would refuse the key: set " : ", whatever "
                       "config.json says, so its loader would refuse the key (--layout dtensor "
                       "keeps every tensor)", hint, hint[0] ? " in config.json if the model uses it" : "");
                free(parent);
                return TPS_OK;
            }
            size_t idx[16] = {0};
            char missing[256] = "";
            for (size_t j = 0; j < f->nparts; j++) {
                char *want = tps_asprintf("%s.%s.%s", parent, f->parts[j].module, param);
                int k = want ? tps_ckpt_find(ck, want) : -1;
                if (!want) {
                    free(parent);
                    return nomem(C);
                }
                if (k < 0 && !missing[0]) snprintf(missing, sizeof missing, "%s", want);
                idx[j] = k < 0 ? 0 : (size_t)k;
                free(want);
            }
            uint64_t base[16] = {0}, nrows[16] = {0};
            for (size_t j = 0; j < f->nparts && !missing[0]; j++) nrows[j] = ck->t[idx[j]].shape[0];
            if (missing[0]) {
                /* the parts may be sections of one packed sibling (Phi-3) */
                int found = 0;
                TPS_TRY(packed_parts(C, f, parent, param, idx, base, nrows, &found));
                if (C->why[0]) {
                    free(parent);
                    return TPS_OK;
                }
                if (found) missing[0] = 0;
            }
            if (missing[0]) {
                refuse(C, "layout %s fuses %s.{", s->name, parent);
                size_t o = strlen(C->why);
                for (size_t j = 0; j < f->nparts && o < sizeof C->why; j++)
                    o += (size_t)snprintf(C->why + o, sizeof C->why - o, "%s%s", j ? "," : "",
                                          f->parts[j].module);
                if (o < sizeof C->why)
                    snprintf(C->why + o, sizeof C->why - o,
                             "}.%s into %s.%s.%s, but the checkpoint lacks '%s'", param, parent,
                             f->into, param, missing);
                free(parent);
                return TPS_OK;
            }
            for (size_t j = 0; f->has_bias && has_bias && !strcmp(param, "weight") && j < f->nparts;
                 j++) {
                /* the engine's module has a bias: the files must hold it */
                const char *w = ck->t[idx[j]].name;
                char *bn = tps_asprintf("%.*sbias", (int)(strlen(w) - strlen("weight")), w);
                if (!bn) {
                    free(parent);
                    return nomem(C);
                }
                if (tps_ckpt_find(ck, bn) < 0) {
                    const cJSON *mt = tps_config_get(ck->config, "model_type");
                    refuse(C, "layout %s fuses '%s' into %s.%s, and %s's model (model_type %s) "
                              "builds %s.%s with a bias for this config.json, but the checkpoint "
                              "lacks '%s' (the engine's loader would report the key missing)",
                           s->name, w, parent, f->into, s->target,
                           cJSON_IsString(mt) ? mt->valuestring : "not given", parent, f->into, bn);
                }
                free(bn);
                if (C->why[0]) {
                    free(parent);
                    return TPS_OK;
                }
            }
            tps_err rc = place_fused(C, f, parent, param, idx, base, nrows);
            free(parent);
            TPS_TRY(rc);
            if (C->why[0]) return TPS_OK;
        }
    }
    return TPS_OK;
}

static int spec_serves(const tps_lspec *s, const cJSON *config)
{
    if (!s->narch && !s->nmt) return 1;
    const cJSON *a = tps_config_get(config, "architectures");
    for (const cJSON *x = cJSON_IsArray(a) ? a->child : NULL; x; x = x->next)
        for (size_t i = 0; i < s->narch; i++)
            if (cJSON_IsString(x) && !strcmp(x->valuestring, s->architectures[i])) return 1;
    const cJSON *mt = tps_config_get(config, "model_type");
    for (size_t i = 0; i < s->nmt; i++)
        if (cJSON_IsString(mt) && !strcmp(mt->valuestring, s->model_types[i])) return 1;
    return 0;
}

static int rt_cmp(const void *a, const void *b)
{
    const tps_rtensor *x = a, *y = b;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Index of the source tensor whose module path is exactly `module` and
 * parameter `weight`, or -1. */
static int find_weight(const tps_ckpt *ck, const char *module)
{
    char *n = tps_asprintf("%s.weight", module);
    int k = n ? tps_ckpt_find(ck, n) : -1;
    free(n);
    return k;
}

/* tie_word_embeddings: 1 true, 0 false, -1 not said. */
static int tied_flag(const cJSON *config)
{
    const cJSON *v = tps_config_get(config, "tie_word_embeddings");
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
    return -1;
}

static int region_cmp(const void *a, const void *b, void *arg)
{
    const tps_region *R = arg;
    const tps_region *x = &R[*(const size_t *)a], *y = &R[*(const size_t *)b];
    if (x->src != y->src) return x->src < y->src ? -1 : 1;
    if (x->lo != y->lo) return x->lo < y->lo ? -1 : 1;
    return 0;
}

/* Regions in source order (tensor, then rows): a tensor's regions are then
 * consecutive, as the copy engine wants for strided reads. */
static tps_err sort_regions(cstate *C)
{
    tps_layout *L = C->L;
    size_t n = L->nregions;
    size_t *ord = tps_xmalloc((n ? n : 1) * sizeof *ord), *pos = tps_xmalloc((n ? n : 1) * sizeof *pos);
    if (!ord || !pos) {
        free(ord);
        free(pos);
        return nomem(C);
    }
    for (size_t k = 0; k < n; k++) ord[k] = k;
    qsort_r(ord, n, sizeof *ord, region_cmp, L->regions);
    for (size_t k = 0; k < n; k++) pos[ord[k]] = k;
    free(ord);
    for (size_t pi = 0; pi < L->npieces; pi++)
        if (L->pieces[pi].kind == TPS_PK_SRC) L->pieces[pi].region = pos[L->pieces[pi].region];
    /* Moved in place along the permutation's cycles (a sorted copy was
     * 7 MB more at the peak for an MoE of 151k regions). */
    for (size_t k = 0; k < n; k++)
        while (pos[k] != k) {
            size_t j = pos[k];
            tps_region t = L->regions[j];
            L->regions[j] = L->regions[k];
            L->regions[k] = t;
            pos[k] = pos[j];
            pos[j] = j;
        }
    free(pos);
    return TPS_OK;
}

static tps_err finish(cstate *C)
{
    tps_layout *L = C->L;
    const tps_ckpt *ck = C->ck;
    TPS_TRY(sort_regions(C));
    /* Rank tensors sorted by rank, then name; pieces stay where they are
     * (each tensor keeps its piece0/npieces). */
    qsort(L->rt, L->nrt, sizeof *L->rt, rt_cmp);
    L->rank_rt = tps_xcalloc((size_t)C->tp + 1, sizeof *L->rank_rt);
    if (!L->rank_rt) return nomem(C);
    for (size_t k = 0; k < L->nrt; k++) L->rank_rt[L->rt[k].rank + 1]++;
    for (int r = 0; r < C->tp; r++) L->rank_rt[r + 1] += L->rank_rt[r];
    for (int r = 0; r < C->tp; r++)
        for (size_t k = L->rank_rt[r] + 1; k < L->rank_rt[r + 1]; k++)
            if (!strcmp(L->rt[k].name, L->rt[k - 1].name))
                return tps_fail(C->ctx, TPS_E_SHAPE,
                                "%s: layout %s makes two tensors named '%s' on rank %d",
                                ck->path, tps_layout_spec_name(L->spec), L->rt[k].name, r);
    for (size_t k = 0; k < L->nrt; k++) {
        tps_rtensor *rt = &L->rt[k];
        const tps_lpiece *p = &L->pieces[rt->piece0];
        const tps_ctensor *st = p->kind == TPS_PK_SRC ? &ck->t[L->regions[p->region].src] : NULL;
        rt->simple = rt->npieces == 1 && st && p->nbytes == rt->nbytes && !strcmp(rt->name, st->name) &&
                     rt->dtype == st->dtype && rt->ndim == st->ndim;
    }
    /* Each source tensor's pieces, by rank then position. */
    L->src_piece0 = tps_xcalloc(ck->n + 1, sizeof *L->src_piece0);
    L->src_pieces = tps_xcalloc(L->npieces ? L->npieces : 1, sizeof *L->src_pieces);
    if (!L->src_piece0 || !L->src_pieces) return nomem(C);
    for (size_t k = 0; k < L->nrt; k++)
        for (size_t j = 0; j < L->rt[k].npieces; j++) {
            const tps_lpiece *p = &L->pieces[L->rt[k].piece0 + j];
            if (p->kind == TPS_PK_SRC) L->src_piece0[L->regions[p->region].src + 1]++;
        }
    for (size_t i = 0; i < ck->n; i++) L->src_piece0[i + 1] += L->src_piece0[i];
    size_t *fill = tps_xcalloc(ck->n ? ck->n : 1, sizeof *fill);
    if (!fill) return nomem(C);
    for (size_t k = 0; k < L->nrt; k++)
        for (size_t j = 0; j < L->rt[k].npieces; j++) {
            size_t pi = L->rt[k].piece0 + j;
            const tps_lpiece *p = &L->pieces[pi];
            if (p->kind != TPS_PK_SRC) continue;
            size_t s = L->regions[p->region].src;
            L->src_pieces[L->src_piece0[s] + fill[s]++] = pi;
        }
    free(fill);
    for (size_t i = 0; i < ck->n; i++)
        if (L->src_piece0[i] == L->src_piece0[i + 1] && !(L->dropped && L->dropped[i]))
            return tps_fail(C->ctx, TPS_E_SHAPE,
                            "%s: layout %s places no byte of tensor '%s' (every source byte must "
                            "land in some rank file)",
                            ck->path, tps_layout_spec_name(L->spec), ck->t[i].name);
    return TPS_OK;
}

static tps_err add_check(cstate *C, const char *name, int ok, const char *detail)
{
    tps_layout *L = C->L;
    tps_check_outcome *n = realloc(L->checks, (L->nchecks + 1) * sizeof *n);
    if (!n) return nomem(C);
    L->checks = n;
    tps_check_outcome *o = &L->checks[L->nchecks++];
    o->name = tps_strdup(name);
    o->detail = tps_strdup(detail);
    o->ok = ok;
    return o->name && o->detail ? TPS_OK : nomem(C);
}

tps_err tps_layout_compile(tps_ctx *ctx, tps_layout *L)
{
    const tps_ckpt *ck = L->ck;
    const tps_lspec *s = L->spec;
    cstate C = {.ctx = ctx, .L = L, .ck = ck, .tp = L->tp};
    tps_err rc = TPS_OK;
    C.used = tps_xcalloc(ck->n ? ck->n : 1, 1);
    C.last = tps_xmalloc((ck->n ? ck->n : 1) * sizeof *C.last);
    if (!C.used || !C.last) {
        free(C.used);
        free(C.last);
        return nomem(&C);
    }
    for (size_t i = 0; i < ck->n; i++) C.last[i] = SIZE_MAX;
    if (L->rejected) goto out; /* the plan said no: nothing to lay out */
    if (s) {
        char detail[512];
        if (!spec_serves(s, ck->config)) {
            const cJSON *a = tps_config_get(ck->config, "architectures");
            char *as = a ? cJSON_PrintUnformatted(a) : NULL;
            size_t o = (size_t)snprintf(detail, sizeof detail, "layout %s covers ", s->name);
            for (size_t i = 0; i < s->narch && o < sizeof detail; i++)
                o += (size_t)snprintf(detail + o, sizeof detail - o, "%s%s", i ? ", " : "",
                                      s->architectures[i]);
            if (o < sizeof detail)
                snprintf(detail + o, sizeof detail - o, "; this checkpoint's architectures are %s",
                         as ? as : ck->config ? "not given" : "unknown (no config.json)");
            free(as);
            TPS_CHECK(add_check(&C, "architecture served", 0, detail));
            refuse(&C, "%s", detail);
            goto out;
        }
        TPS_CHECK(add_check(&C, "architecture served", 1, "yes"));
        if (L->q && s->refuse_scales) {
            for (size_t i = 0; i < ck->n; i++)
                if (L->q->role[i] == TPS_QR_SCALE && (s->refuse_scales >> L->q->kind[i] & 1u)) {
                    snprintf(detail, sizeof detail,
                             "%s checkpoints with %s FP8 scales ('%s'): layout %s cannot write "
                             "them: %s",
                             L->q->method_name, tps_qscale_labels[L->q->kind[i]], ck->t[i].name, s->name,
                             s->refuse_scales_reason);
                    TPS_CHECK(add_check(&C, "quantization served", 0, detail));
                    refuse(&C, "%s", detail);
                    goto out;
                }
        }
        for (size_t k = 0; k < s->nchecks; k++) {
            const tps_lcheck *c = &s->checks[k];
            if (c->when && !tps_cond_eval(c->when, ck->config)) continue;
            int bad = 0;
            if (c->is_quotient) {
                int pf, pn, pd;
                uint64_t f = config_count(ck->config, c->field, &pf);
                uint64_t a = config_count(ck->config, c->num, &pn);
                uint64_t b = config_count(ck->config, c->den, &pd);
                if (pf && a && b && f != a / b) {
                    snprintf(detail, sizeof detail, "%s = %llu, but %s / %s = %llu: %s", c->field,
                             (unsigned long long)f, c->num, c->den, (unsigned long long)(a / b),
                             c->reason);
                    bad = 1;
                }
            } else if (tps_cond_eval(&c->cond, ck->config)) {
                snprintf(detail, sizeof detail, "%s", c->reason);
                bad = 1;
            }
            TPS_CHECK(add_check(&C, c->name, !bad, bad ? detail : "yes"));
            if (bad) {
                refuse(&C, "%s", detail);
                goto out;
            }
        }
    }
    /* The tied head: a checkpoint without one writes it from the embedding. */
    int head = -1, emb = -1;
    if (s && s->tied_head && s->tied_embedding) {
        head = find_weight(ck, s->tied_head);
        emb = find_weight(ck, s->tied_embedding);
        int flag = tied_flag(ck->config);
        if (flag < 0) { /* not said: the config class's default */
            const cJSON *mt = tps_config_get(ck->config, "model_type");
            flag = 0;
            for (size_t k = 0; k < s->ntied_default; k++)
                if (cJSON_IsString(mt) && !strcmp(mt->valuestring, s->tied_default[k])) flag = 1;
            if (head < 0 && emb >= 0 && !flag) {
                refuse(&C, "config.json does not set tie_word_embeddings, which then defaults to "
                           "false for model_type %s, yet the checkpoint has no %s.weight: set "
                           "tie_word_embeddings to true if the head is tied to %s",
                       cJSON_IsString(mt) ? mt->valuestring : "(none)", s->tied_head,
                       s->tied_embedding);
                goto out;
            }
        }
        if (head < 0 && emb >= 0 && flag == 0) {
            refuse(&C, "config.json says tie_word_embeddings is false, but the checkpoint has no "
                       "%s.weight (layout %s would have no head to write)",
                   s->tied_head, s->name);
            goto out;
        }
        if (head >= 0 && emb >= 0 && flag == 1) {
            refuse(&C, "config.json ties %s to %s (tie_word_embeddings: true) but the checkpoint "
                       "stores both; the engine keeps one parameter: remove %s.weight or set "
                       "tie_word_embeddings to false",
                   s->tied_head, s->tied_embedding, s->tied_head);
            goto out;
        }
        if (head < 0 && emb >= 0) {
            char d[256];
            snprintf(d, sizeof d, "%s.weight is written from %s.weight, which it is tied to",
                     s->tied_head, s->tied_embedding);
            TPS_CHECK(add_check(&C, "tied head", 1, d));
        } else {
            emb = -1; /* untied: both are ordinary tensors */
        }
    }
    /* packed tensors must hold the rows their config says (any layout) */
    for (size_t i = 0; L->plan && i < ck->n && ck->config; i++) {
        const tps_packed *k = tps_plan_packed(L->plan, ck->t[i].name);
        uint64_t b[16], r[16];
        if (k && !packed_rows(&C, k, i, b, r)) goto out;
    }
    if (L->ep && !s) {
        refuse(&C, "--ep (expert parallelism) is for the serving layouts (--layout vllm or "
                   "sglang); the DTensor layout splits experts as the plan says");
        goto out;
    }
    /* what the engine's load_weights skips: no rank file holds it */
    for (size_t i = 0; s && i < ck->n; i++) {
        const char *why = drop_reason(s, ck->config, ck->t[i].name);
        if (!why) continue;
        if (!L->dropped && !(L->dropped = tps_xcalloc(ck->n, sizeof *L->dropped))) {
            rc = nomem(&C);
            goto out;
        }
        L->dropped[i] = why;
        C.used[i] = 1;
    }
    if (s) {
        TPS_CHECK(compile_experts(&C));
        if (C.why[0]) goto out;
        TPS_CHECK(compile_fused(&C));
        if (C.why[0]) goto out;
    }
    for (size_t i = 0; i < ck->n && !C.why[0]; i++) {
        if (C.used[i] || (L->q && (L->q->role[i] == TPS_QR_SCALE ||
                                   L->q->role[i] == TPS_QR_INPUT_SCALE)))
            continue;
        const tps_ctensor *t = &ck->t[i];
        if (!s) {
            int d = L->p[i].dim;
            TPS_CHECK(place_simple(&C, i, t->name,
                                   d < 0 ? TPS_SPLIT_REPLICATE : d == 0 ? TPS_SPLIT_ROWS
                                                                         : TPS_SPLIT_COLUMNS,
                                   L->p[i].rule));
            continue;
        }
        const char *name = t->name;
        if ((int)i == emb) {
            name = own_name(&C, tps_asprintf("%s.weight", s->tied_head));
            if (!name) {
                rc = nomem(&C);
                goto out;
            }
        }
        const char *why = NULL;
        tps_split_kind sk = spec_split(L, i, &why);
        if (sk == TPS_SPLIT_REFUSE) {
            refuse(&C, "tensor '%s': %s (layout %s)", t->name, why, s->name);
            break;
        }
        int vocab = !strcmp(param_of(t->name), "weight") && matches_any(s->vocab, s->nvocab, t->name);
        if (s->has_keys && (int)i != emb && !vocab && !engine_key(s, ck->config, t->name)) {
            const cJSON *mt = tps_config_get(ck->config, "model_type");
            int bias = !strcmp(param_of(t->name), "bias");
            char hint[256];
            key_hint(s, ck->config, t->name, hint, sizeof hint);
            refuse(&C, "tensor '%s': %s's model (model_type %s) has no such parameter%s (layout "
                       "%s writes exactly the engine's keys; --layout dtensor keeps every tensor)"
                       "%s%s%s",
                   t->name, s->target, cJSON_IsString(mt) ? mt->valuestring : "not given",
                   bias ? ": its load_weights would ignore this bias, and the model would compute "
                          "without it"
                        : ", and its load_weights does not skip it",
                   s->name, hint[0] ? ": set " : "", hint,
                   hint[0] ? " in config.json if the model uses it" : "");
            break;
        }
        TPS_CHECK(place_simple(&C, i, name, sk, L->p[i].rule));
    }
    if (s && !C.why[0]) {
        /* the engine's own acceptance rules, shown by plan */
        for (size_t fi = 0; fi < s->nfuse; fi++)
            for (size_t j = 0; j < s->fuse[fi].nparts; j++) {
                const tps_lpart *p = &s->fuse[fi].parts[j];
                int present, dup = 0;
                if (!p->heads) continue;
                for (size_t a = 0; a < fi && !dup; a++)
                    for (size_t b = 0; b < s->fuse[a].nparts; b++)
                        dup |= s->fuse[a].parts[b].heads && !strcmp(s->fuse[a].parts[b].heads, p->heads);
                for (size_t b = 0; b < j; b++)
                    dup |= s->fuse[fi].parts[b].heads && !strcmp(s->fuse[fi].parts[b].heads, p->heads);
                if (dup) continue;
                uint64_t h = config_count(ck->config, p->heads, &present);
                if (!h) continue;
                char nm[128], d[256];
                snprintf(nm, sizeof nm, p->replicate ? "%s %% tp == 0 or tp %% %s == 0" : "%s %% tp == 0",
                         p->heads, p->heads);
                if (h % (uint64_t)L->tp == 0)
                    snprintf(d, sizeof d, "%s = %llu: %llu per rank at tp %d", p->heads,
                             (unsigned long long)h, (unsigned long long)(h / (uint64_t)L->tp), L->tp);
                else
                    snprintf(d, sizeof d, "%s = %llu: each of them whole on %llu ranks at tp %d",
                             p->heads, (unsigned long long)h,
                             (unsigned long long)((uint64_t)L->tp / h), L->tp);
                TPS_CHECK(add_check(&C, nm, 1, d));
            }
        TPS_CHECK(add_check(&C, s->exact ? "every split divides evenly" : "splits follow torch.chunk", 1,
                            s->exact ? "yes" : "uneven shards allowed"));
    }
out:
    if (!rc && C.why[0]) {
        int shown = 0;
        for (size_t k = 0; k < L->nchecks; k++) shown |= L->checks[k].ok == 0;
        /* plan's checks list shows why, as it does a check's refusal */
        if (!shown) add_check(&C, s ? "layout rules" : "plan rules", 0, C.why);
        free(L->rejected);
        L->rejected = tps_strdup(C.why);
        if (!L->rejected) rc = nomem(&C);
    }
    if (!rc && !L->rejected) rc = finish(&C);
    free(C.used);
    free(C.last);
    free(C.next);
    return rc;
}

/* ------------------------------------------------------------------ views */

int tps_layout_tp(const tps_layout *L) { return L->tp; }
size_t tps_layout_count(const tps_layout *L) { return L->n; }

void tps_layout_placement(const tps_layout *L, size_t i, tps_placement_view *v)
{
    const tps_ctensor *t = &L->ck->t[L->p[i].t];
    v->name = t->name;
    v->dtype = t->dtype;
    v->ndim = t->ndim;
    v->shape = t->shape;
    v->style = L->p[i].style;
    v->dim = L->p[i].dim;
    v->rule = L->p[i].rule;
}

void tps_layout_local(const tps_layout *L, size_t i, int rank, uint64_t *start, uint64_t *len)
{
    *start = *len = 0;
    if (L->src_piece0) { /* the compiled layout: rank's pieces of tensor i */
        int first = 1;
        for (size_t k = L->src_piece0[i]; k < L->src_piece0[i + 1]; k++) {
            const tps_lpiece *p = &L->pieces[L->src_pieces[k]];
            const tps_region *g = &L->regions[p->region];
            if (p->rank != rank || g->dim < 0) continue;
            /* a packed tensor's sections give a rank several row ranges: the
             * first one's start, all of their rows */
            if (first) *start = g->lo;
            first = 0;
            *len += g->hi - g->lo;
        }
        return;
    }
    const tps_ctensor *t = &L->ck->t[L->p[i].t];
    if (L->p[i].dim >= 0) tps_chunk(t->shape[L->p[i].dim], L->tp, rank, start, len);
}

int tps_layout_dim(const tps_layout *L, size_t i)
{
    if (!L->src_piece0) return L->p[i].dim;
    if (L->src_piece0[i] == L->src_piece0[i + 1]) return -1; /* dropped */
    return L->regions[L->pieces[L->src_pieces[L->src_piece0[i]]].region].dim;
}

/* Bytes of tensor i on rank r: its pieces there (the DTensor shard, or what
 * a serving layout puts on r, replicas included). */
uint64_t tps_layout_local_bytes(const tps_layout *L, size_t i, int rank)
{
    if (!L->src_piece0) return 0;
    uint64_t b = 0;
    for (size_t k = L->src_piece0[i]; k < L->src_piece0[i + 1]; k++) {
        const tps_lpiece *p = &L->pieces[L->src_pieces[k]];
        if (p->rank == rank) b += p->nbytes;
    }
    return b;
}

uint64_t tps_layout_rank_bytes(const tps_layout *L, int rank)
{
    uint64_t s = 0;
    if (!L->rank_rt && !L->spec) {
        /* a rejected DTensor plan is not laid out: its shards, as placed */
        for (size_t i = 0; i < L->n; i++) {
            const tps_ctensor *t = &L->ck->t[L->p[i].t];
            int d = L->p[i].dim;
            uint64_t lo, len;
            if (d < 0 || d >= t->ndim || !t->shape[d]) {
                s += t->nbytes;
                continue;
            }
            tps_chunk(t->shape[d], L->tp, rank, &lo, &len);
            s += t->nbytes / t->shape[d] * len;
        }
        return s;
    }
    if (!L->rank_rt) return 0;
    for (size_t k = L->rank_rt[rank]; k < L->rank_rt[rank + 1]; k++) s += L->rt[k].nbytes;
    return s;
}

size_t tps_layout_layer_count(const tps_layout *L) { return L->nlayers; }

void tps_layout_layer(const tps_layout *L, size_t i, tps_layer_view *v)
{
    *v = L->layers[i];
}

size_t tps_layout_check_count(const tps_layout *L) { return L->nchecks; }

void tps_layout_check(const tps_layout *L, size_t i, tps_check_view *v)
{
    v->name = L->checks[i].name;
    v->ok = L->checks[i].ok;
    v->detail = L->checks[i].detail;
}

const char *tps_layout_rejected(const tps_layout *L) { return L->rejected; }

const char *tps_layout_dropped(const tps_layout *L, size_t i)
{
    return L->dropped && !L->rejected ? L->dropped[i] : NULL;
}

const char *tps_layout_name(const tps_layout *L) { return tps_layout_spec_name(L->spec); }

const char *tps_layout_target(const tps_layout *L) { return L->spec ? L->spec->target : NULL; }

size_t tps_layout_rank_tensor_count(const tps_layout *L, int rank)
{
    if (!L->rank_rt || rank < 0 || rank >= L->tp) return 0;
    return L->rank_rt[rank + 1] - L->rank_rt[rank];
}

void tps_layout_rank_tensor(const tps_layout *L, int rank, size_t i, tps_rank_tensor_view *v)
{
    const tps_rtensor *rt = &L->rt[L->rank_rt[rank] + i];
    v->name = rt->name;
    v->dtype = rt->dtype;
    v->ndim = rt->ndim;
    v->shape = rt->shape;
    v->nbytes = rt->nbytes;
    v->npieces = rt->npieces;
    v->rule = rt->rule;
}

void tps_layout_rank_piece(const tps_layout *L, int rank, size_t i, size_t k, tps_piece_view *v)
{
    const tps_rtensor *rt = &L->rt[L->rank_rt[rank] + i];
    const tps_lpiece *p = &L->pieces[rt->piece0 + k];
    memset(v, 0, sizeof *v);
    v->at = p->at;
    v->nbytes = p->nbytes;
    switch (p->kind) {
    case TPS_PK_SRC: {
        const tps_region *g = &L->regions[p->region];
        v->kind = "source";
        v->source = L->ck->t[g->src].name;
        v->dim = g->dim;
        v->lo = g->lo;
        v->hi = g->hi;
        v->replica = p->replica;
        break;
    }
    case TPS_PK_ZERO: v->kind = "zeros"; v->dim = -1; break;
    case TPS_PK_CONST: v->kind = "constant"; v->dim = -1; v->value = p->value; break;
    }
}
