/* layout_scales.c - quantization scales (lib/quant/ says which tensor is
 * whose scale, of what kind): a weight's scale follows the weight's split
 * (block rows or columns, channel rows, or whole), refused where a rank's
 * cut falls inside a block; fused weights' scales fused alike, in the parts'
 * order; scales widened to F32 and [] written as [1] where the layout says
 * so. A new scale kind is placed here. */
#include "layout_int.h"

#include <stdlib.h>
#include <string.h>

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
            ok = tps_lc_part_rows(n, heads, replicate, tp, r, exact, &lo, &l) &&
                 block_aligned(n, lo, l, b);
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
            ok = tps_lc_part_rows(nrows[j], heads[j], f->parts[j].replicate, tp, 0, 1, &lo, &l) &&
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
tps_err tps_lc_place_scales(cstate *C, size_t w, int r, int d, uint64_t lo, uint64_t len)
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
    TPS_TRY(tps_lc_new_rt(C, st->name, r, dt, scalar_ndim(C, st, shape), shape, "scale", &rt));
    TPS_TRY(tps_lc_src_piece(C, rt, s, sd, slo, shi, 0));
    if (q->input[w] >= 0) {
        const tps_ctensor *it = &C->ck->t[q->input[w]];
        memcpy(shape, it->shape, sizeof shape);
        if (!scale_dtype(C, it, &dt)) return TPS_OK;
        TPS_TRY(tps_lc_new_rt(C, it->name, r, dt, scalar_ndim(C, it, shape), shape, "input scale",
                              &rt));
        TPS_TRY(tps_lc_src_piece(C, rt, (size_t)q->input[w], -1, 0, 0, 0));
    }
    return TPS_OK;
}

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
    TPS_TRY(tps_lc_new_rt(C, name, r, dt, 1, shape, rule, &rt));
    for (size_t j = 0; j < f->nparts; j++) {
        if (C->ck->t[of[idx[j]]].dtype != t0->dtype) {
            refuse(C, "the %s fused into '%s' are of different dtypes", what, name);
            return TPS_OK;
        }
        TPS_TRY(
            tps_lc_src_piece(C, rt, (size_t)of[idx[j]], -1, 0, 0, j * (tps_dtype_bits(dt) / 8)));
    }
    return TPS_OK;
}

/* A fused group's scales on rank r: block rows or channel rows of every
 * part's scale, in the parts' order (a rank's rows of each part must be
 * whole blocks), or, per tensor, one value per part; input scales one per
 * part. */
tps_err tps_lc_place_fused_scales(cstate *C, const tps_lfuse *f,
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
        TPS_TRY(tps_lc_new_rt(C, scale_name, r, dt, s0->ndim, shape, "scale", &rt));
        uint64_t at = 0, rowb = es * (s0->ndim == 2 ? s0->shape[1] : 1);
        for (size_t j = 0; j < f->nparts; j++) {
            const tps_ctensor *sj = &ck->t[q->partner[idx[j]]];
            if (sj->dtype != s0->dtype || sj->ndim != s0->ndim ||
                (sj->ndim == 2 && sj->shape[1] != s0->shape[1])) {
                refuse(C, "the scales fused into '%s' differ in dtype or width", scale_name);
                return TPS_OK;
            }
            TPS_TRY(tps_lc_src_piece(C, rt, (size_t)q->partner[idx[j]], 0, slo[j], shi[j], at));
            at += (shi[j] - slo[j]) * rowb;
        }
    }
    if (input_name) TPS_TRY(fuse_scalars(C, f, idx, q->input, r, input_name, "input scales", "input scale"));
    return TPS_OK;
}
