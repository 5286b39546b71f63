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

void tps_layout_free(tps_layout *L)
{
    if (!L) return;
    free(L->p);
    tps_check_outcomes_free(L->checks, L->nchecks);
    free(L->rejected);
    free(L);
}

tps_err tps_layout_new(tps_ctx *ctx, const tps_ckpt *ck, const tps_plan *plan, int tp,
                       tps_layout **out)
{
    *out = NULL;
    if (tp < 1 || tp > 4096) return tps_fail(ctx, TPS_E_ARG, "tp must be between 1 and 4096, not %d", tp);
    tps_err rc = TPS_OK;
    tps_layout *L = tps_xcalloc(1, sizeof *L);
    if (!L) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    L->ck = ck;
    L->plan = plan;
    L->tp = tp;
    L->n = ck->n;
    L->p = tps_xcalloc(ck->n, sizeof *L->p);
    TPS_FAIL_IF(!L->p, ctx, TPS_E_NOMEM, "out of memory");
    /* The plan's checks first: when it rejects the model, its reason is what
     * the user needs, not a shape complaint about a tensor. */
    TPS_CHECK(tps_plan_run_checks(ctx, plan, ck->config, tp, &L->checks, &L->nchecks));
    for (size_t i = 0; i < L->nchecks; i++)
        if (L->checks[i].ok == 0) {
            L->rejected = tps_asprintf("%s: %s", L->checks[i].name, L->checks[i].detail);
            break;
        }
    for (size_t i = 0; i < ck->n; i++) {
        const tps_ctensor *t = &ck->t[i];
        tps_place *pl = &L->p[i];
        pl->t = i;
        const char *pat = NULL;
        const tps_rule *r = tps_plan_match(plan, t->name, ck->config, &pat);
        pl->style = r ? r->style : TPS_STYLE_REPLICATE;
        pl->rule = r ? pat : NULL;
        pl->dim = r ? style_dim(r->style, param_of(t->name)) : -1;
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
out:
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

size_t tps_layout_check_count(const tps_layout *L) { return L->nchecks; }

void tps_layout_check(const tps_layout *L, size_t i, tps_check_view *v)
{
    v->name = L->checks[i].name;
    v->ok = L->checks[i].ok;
    v->detail = L->checks[i].detail;
}

const char *tps_layout_rejected(const tps_layout *L) { return L->rejected; }
