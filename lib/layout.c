/* layout.c - plan x checkpoint x tp: every tensor's placement, validated
 * before a byte is written (plan first, write second). */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

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
    char tb[96] = "", fb[96] = "";
    if (type) snprintf(tb, sizeof tb, " (%.80s)", type);
    if (cfrom || from[2])
        snprintf(fb, sizeof fb, " (from %s)", cfrom && from[2] && strcmp(cfrom, from[2])
                                                  ? "per-layer fields"
                                                  : cfrom ? cfrom : from[2]);
    hs->bad = tps_asprintf("%s: tensor '%s' has %llu %s (dim %d), but config.json gives layer %d%s "
                           "%s %lld x head_dim %lld = %llu%s: the config does not describe this "
                           "tensor, so its shards cannot be promised to hold whole heads",
                           L->ck->path, t->name, (unsigned long long)t->shape[d],
                           d == 0 ? "rows" : "columns", d, layer, tb, r->heads, (long long)cnt,
                           (long long)hd, (unsigned long long)want, fb);
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
    free(L);
}

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

tps_err tps_layout_new(tps_ctx *ctx, const tps_ckpt *ck, const tps_plan *plan, int tp,
                       tps_layout **out)
{
    *out = NULL;
    if (tp < 1 || tp > 4096) return tps_fail(ctx, TPS_E_ARG, "tp must be between 1 and 4096, not %d", tp);
    tps_err rc = TPS_OK;
    tps_layers ly = {0};
    head_state hs = {.last_layer = -1};
    tps_layout *L = tps_xcalloc(1, sizeof *L);
    if (!L) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    L->ck = ck;
    L->plan = plan;
    L->tp = tp;
    L->n = ck->n;
    L->p = tps_xcalloc(ck->n, sizeof *L->p);
    TPS_FAIL_IF(!L->p, ctx, TPS_E_NOMEM, "out of memory");
    /* Named after the file: a malformed per_layer_config is the config's fault. */
    char *cfg_label = tps_asprintf("%s/config.json", ck->dir ? ck->dir : ".");
    TPS_FAIL_IF(!cfg_label, ctx, TPS_E_NOMEM, "out of memory");
    rc = tps_layers_open(ctx, ck->config, cfg_label, &ly);
    free(cfg_label);
    if (rc) goto out;
    TPS_CHECK(layer_table(ctx, L, &ly));
    /* The plan's checks first: when it rejects the model, its reason is what
     * the user needs, not a shape complaint about a tensor. */
    TPS_CHECK(tps_plan_run_checks(ctx, plan, ck->config, tp, &L->checks, &L->nchecks));
    for (size_t i = 0; i < L->nchecks; i++)
        if (L->checks[i].ok == 0) {
            L->rejected = tps_asprintf("%s: %s", L->checks[i].name, L->checks[i].detail);
            break;
        }
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
        if (r && r->heads && tp > 1 && ck->config) head_shape(L, &ly, i, r, &hs);
        if (pl->dim < 0 || L->rejected) continue;
        TPS_FAIL_IF(pl->dim >= t->ndim, ctx, TPS_E_SHAPE,
                    "%s: tensor '%s' is %d-D, but style %s (rule '%s') shards dim %d", ck->path,
                    t->name, t->ndim, tps_style_name(pl->style), pat, pl->dim);
        /* Sub-byte dtypes: every cut must fall on a byte boundary. */
        uint64_t inner_bits = tps_dtype_bits(t->dtype);
        for (int d = pl->dim + 1; d < t->ndim; d++) inner_bits *= t->shape[d];
        for (int r2 = 0; r2 < tp; r2++) {
            uint64_t s, l;
            tps_chunk(t->shape[pl->dim], tp, r2, &s, &l);
            TPS_FAIL_IF((s * inner_bits) % 8 || (l * inner_bits) % 8 ||
                            (t->shape[pl->dim] * inner_bits) % 8,
                        ctx, TPS_E_SHAPE,
                        "%s: tensor '%s' (%s) cannot be split at tp %d: rank %d's shard along dim %d "
                        "does not start and end on a byte boundary",
                        ck->path, t->name, tps_dtype_name(t->dtype), tp, r2, pl->dim);
        }
    }
    if (any_heads) {
        TPS_CHECK(add_head_outcome(ctx, L, &hs));
        if (!L->rejected && L->checks[L->nchecks - 1].ok == 0)
            L->rejected = tps_asprintf("head shapes: %s", L->checks[L->nchecks - 1].detail);
    }
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
    const tps_ctensor *t = &L->ck->t[L->p[i].t];
    if (L->p[i].dim < 0) {
        *start = 0;
        *len = 0;
        return;
    }
    tps_chunk(t->shape[L->p[i].dim], L->tp, rank, start, len);
}

/* Bytes of tensor i on rank r. */
uint64_t tps_layout_local_bytes(const tps_layout *L, size_t i, int rank)
{
    const tps_ctensor *t = &L->ck->t[L->p[i].t];
    int d = L->p[i].dim;
    if (d < 0) return t->nbytes;
    uint64_t s, l, bits = tps_dtype_bits(t->dtype);
    tps_chunk(t->shape[d], L->tp, rank, &s, &l);
    for (int k = 0; k < t->ndim; k++) bits *= k == d ? l : t->shape[k];
    return bits / 8;
}

uint64_t tps_layout_rank_bytes(const tps_layout *L, int rank)
{
    uint64_t s = 0;
    for (size_t i = 0; i < L->n; i++) s += tps_layout_local_bytes(L, i, rank);
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
