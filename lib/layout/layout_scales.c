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
    tps_shape_get(shape, st);
    if (sd >= 0) shape[sd] = shi - slo;
    if (!scale_dtype(C, st, &dt)) return TPS_OK;
    tps_rtensor *rt;
    TPS_TRY(tps_lc_new_rt(C, st->name, r, dt, scalar_ndim(C, st, shape), shape, "scale", &rt));
    TPS_TRY(tps_lc_src_piece(C, rt, s, sd, slo, shi, 0));
    if (q->input[w] >= 0) {
        const tps_ctensor *it = &C->ck->t[q->input[w]];
        tps_shape_get(shape, it);
        if (!scale_dtype(C, it, &dt)) return TPS_OK;
        TPS_TRY(tps_lc_new_rt(C, it->name, r, dt, scalar_ndim(C, it, shape), shape, "input scale",
                              &rt));
        TPS_TRY(tps_lc_src_piece(C, rt, (size_t)q->input[w], -1, 0, 0, 0));
    }
    return TPS_OK;
}

tps_err tps_lc_padded_piece(cstate *C, tps_rtensor *rt, size_t src, int d, uint64_t lo,
                            uint64_t hi, uint64_t have, uint64_t at, double value)
{
    const tps_ctensor *t = &C->ck->t[src];
    uint64_t rhi = hi < have ? hi : have, rlo = lo < rhi ? lo : rhi, plo = lo > rhi ? lo : rhi;
    uint64_t es = tps_dtype_bits(rt->dtype) / 8;
    tps_lpiece pad = {.kind = value == 0.0 ? TPS_PK_ZERO : TPS_PK_CONST, .value = value};
    if (hi <= have) return tps_lc_src_piece(C, rt, src, d, lo, hi, at);
    C->L->pad_used = 1;
    if (d == 0) {
        uint64_t rowb = es * (t->ndim == 2 ? t->shape[1] : 1);
        if (rhi > rlo) TPS_TRY(tps_lc_src_piece(C, rt, src, 0, rlo, rhi, at));
        pad.at = at + (rhi - rlo) * rowb;
        pad.nbytes = (hi - plo) * rowb;
        return tps_lc_add_piece(C, rt, pad);
    }
    if (t->ndim != 2 || (rhi > rlo && rt->dtype != t->dtype)) {
        refuse(C, "--pad-intermediate: tensor '%s' (%s, %d-D) cannot be padded along its columns "
                  "as layout %s writes it (%s)",
               t->name, tps_dtype_name(t->dtype), t->ndim, C->L->spec->name,
               tps_dtype_name(rt->dtype));
        return TPS_OK;
    }
    uint64_t realb = (rhi - rlo) * es, padb = (hi - plo) * es;
    if (rhi > rlo) TPS_TRY(tps_lc_src_piece_run(C, rt, src, 1, rlo, rhi, at, realb));
    pad.at = at + realb;
    pad.nbytes = t->shape[0] * padb;
    pad.run = (uint32_t)padb;
    return tps_lc_add_piece(C, rt, pad);
}

/* tps_lc_place_scales for a weight whose input features along d = 1 are
 * padded (--pad-intermediate): its [lo, lo + len) of the padded features,
 * those from `real` on zero columns. Block scales: the real block columns
 * from the source, then columns of 1.0 (runs a row apart); channel and
 * tensor scales follow the output rows and stay whole. */
tps_err tps_lc_place_scales_padded(cstate *C, size_t w, int r, int d, uint64_t lo, uint64_t len,
                                   uint64_t real)
{
    const tps_quant *q = C->L->q;
    if (!q || q->role[w] != TPS_QR_WEIGHT) return TPS_OK;
    size_t s = (size_t)q->partner[w];
    if (d != 1 || q->kind[s] != TPS_QS_BLOCK) return tps_lc_place_scales(C, w, r, d, lo, len);
    const tps_ctensor *st = &C->ck->t[s], *wt = &C->ck->t[w];
    uint64_t b = q->bk;
    if (lo % b || len % b || real % b || st->ndim != 2) {
        refuse(C, "--pad-intermediate: tensor '%s' is FP8 in blocks of %llu x %llu, and a rank's "
                  "padded columns [%llu, %llu) are not whole blocks",
               wt->name, (unsigned long long)q->bn, (unsigned long long)b, (unsigned long long)lo,
               (unsigned long long)(lo + len));
        return TPS_OK;
    }
    tps_dtype dt;
    if (!scale_dtype(C, st, &dt)) return TPS_OK;
    uint64_t slo = lo / b, shi = (lo + len) / b, have = real / b;
    uint64_t rhi = shi < have ? shi : have, rlo = slo < rhi ? slo : rhi, es = tps_dtype_bits(dt) / 8;
    if (rhi > rlo && shi > rhi && dt != st->dtype) {
        refuse(C, "--pad-intermediate: scale '%s' is %s, and layout %s holds scales in %s: a "
                  "rank's scale columns cannot be both widened and padded",
               st->name, tps_dtype_name(st->dtype), C->L->spec->name, tps_dtype_name(dt));
        return TPS_OK;
    }
    uint64_t shape[TPS_MAX_DIMS];
    tps_shape_get(shape, st);
    shape[1] = shi - slo;
    tps_rtensor *rt;
    TPS_TRY(tps_lc_new_rt(C, st->name, r, dt, 2, shape, "scale", &rt));
    uint64_t realb = (rhi - rlo) * es, padb = (shi - (slo > rhi ? slo : rhi)) * es;
    if (rhi > rlo)
        TPS_TRY(padb ? tps_lc_src_piece_run(C, rt, s, 1, rlo, rhi, 0, realb)
                     : tps_lc_src_piece(C, rt, s, 1, rlo, rhi, 0));
    if (padb) {
        TPS_TRY(tps_lc_add_piece(C, rt, (tps_lpiece){.kind = TPS_PK_CONST, .at = realb,
                                                     .nbytes = st->shape[0] * padb,
                                                     .run = realb ? (uint32_t)padb : 0,
                                                     .value = 1.0}));
        C->L->pad_used = 1;
    }
    if (q->input[w] >= 0) {
        const tps_ctensor *it = &C->ck->t[q->input[w]];
        tps_shape_get(shape, it);
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
             * rows on a rank must be whole blocks, even at tp 1, but for a
             * partial last block of the last part (DeepSeek-V3's
             * kv_a_proj_with_mqa, 576 rows, in fused_qkv_a_proj), whose
             * scale row is then the fused grid's last. */
            int last_partial = kind == TPS_QS_BLOCK && j + 1 == f->nparts &&
                               lo[j] % q->bn == 0 && lo[j] + len[j] == nrows_of[j];
            if (kind == TPS_QS_BLOCK && len[j] % q->bn && !last_partial) {
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
        tps_shape_get(shape, s0);
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
            /* --pad-intermediate: scale rows past the source's are padding's,
             * 1.0 (its weight rows are zeros) */
            uint64_t have = sj->shape[0], rhi = shi[j] < have ? shi[j] : have;
            uint64_t rlo = slo[j] < rhi ? slo[j] : rhi;
            if (rhi > rlo || shi[j] == slo[j])
                TPS_TRY(tps_lc_src_piece(C, rt, (size_t)q->partner[idx[j]], 0, rlo, rhi, at));
            if (shi[j] > rhi) {
                uint64_t from = slo[j] > rhi ? slo[j] : rhi;
                TPS_TRY(tps_lc_add_piece(C, rt, (tps_lpiece){.kind = TPS_PK_CONST,
                                                             .at = at + (from - slo[j]) * rowb,
                                                             .nbytes = (shi[j] - from) * rowb,
                                                             .value = 1.0}));
                C->L->pad_used = 1;
            }
            at += (shi[j] - slo[j]) * rowb;
        }
    }
    if (input_name) TPS_TRY(fuse_scalars(C, f, idx, q->input, r, input_name, "input scales", "input scale"));
    return TPS_OK;
}

/* ------------------------------------------------------------------ expert stacks */

static uint64_t gcd64(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Does the engine's FP8 MoE take an expert width of I at MoE tp t (1 under
 * --ep) with blocks bn x bk, as is (vLLM 0.33 validate_fp8_block_shape_moe:
 * whole row blocks, and whole column blocks of down_proj when split)? */
static int expert_blocks_whole(uint64_t I, uint64_t t, uint64_t bn, uint64_t bk)
{
    if (I % t) return 0;
    uint64_t ip = I / t;
    return ip % bn == 0 && (t == 1 || ip % bk == 0);
}

/* "1, 2" of the tp values up to 64 at which E experts of I rows are whole
 * blocks on every rank (with --ep: E / tp whole experts a rank). */
static void expert_block_tps(char *buf, size_t len, uint64_t E, uint64_t I, uint64_t bn,
                             uint64_t bk, int ep)
{
    size_t o = 0;
    buf[0] = 0;
    for (int tp = 1; tp <= 64 && o < len; tp++) {
        int ok = ep ? E % (uint64_t)tp == 0 && expert_blocks_whole(I, 1, bn, bk)
                    : (uint64_t)tp <= E && expert_blocks_whole(I, (uint64_t)tp, bn, bk);
        if (ok) o += (size_t)snprintf(buf + o, len - o, "%s%d", o ? ", " : "", tp);
    }
    if (!o) snprintf(buf, len, "none up to 64");
}

/* The refined grid's g when the engine holds these experts' block scales
 * on one (vLLM 0.33 Fp8MoEMethod, moe_backend auto: g = gcd(bn, bk, I_p,
 * H) >= 32, quant_method fp8, the layout's refine_expert_blocks), else 0. */
static uint64_t refine_grid(const cstate *C, uint64_t I, uint64_t H)
{
    const tps_quant *q = C->L->q;
    uint64_t t = C->L->ep ? 1 : (uint64_t)C->tp;
    if (!C->L->spec || !C->L->spec->refine_moe_blocks || strcmp(q->m->name, "fp8") || I % t ||
        expert_blocks_whole(I, t, q->bn, q->bk))
        return 0;
    uint64_t g = gcd64(gcd64(q->bn, q->bk), gcd64(I / t, H));
    return g >= 32 ? g : 0;
}

uint64_t tps_lc_refined_grid(const cstate *C, uint64_t I, uint64_t H)
{
    return C->L->q && C->L->q->bn ? refine_grid(C, I, H) : 0;
}

int tps_lc_expert_scales_ok(cstate *C, const char *module, size_t w0, uint64_t E, uint64_t I,
                            uint64_t H)
{
    const tps_quant *q = C->L->q;
    if (!q || q->role[w0] != TPS_QR_WEIGHT) return 1;
    size_t s = (size_t)q->partner[w0];
    const char *lname = C->L->spec->name;
    if (q->kind[s] == TPS_QS_CHANNEL && C->ck->t[s].ndim != 2) {
        refuse(C, "scale '%s' is per channel with %d dims: the engine's fused MoE holds expert "
                  "channel scales as [rows, 1] (layout %s)",
               C->ck->t[s].name, C->ck->t[s].ndim, lname);
        return 0;
    }
    if (q->kind[s] != TPS_QS_BLOCK) return 1;
    uint64_t t = C->L->ep ? 1 : (uint64_t)C->tp;
    if (expert_blocks_whole(I, t, q->bn, q->bk)) return 1;
    char works[300];
    expert_block_tps(works, sizeof works, E, I, q->bn, q->bk, C->L->ep);
    uint64_t g = refine_grid(C, I, H);
    if (g) {
        /* layers/fused_moe/oracle/fp8.py refine_fp8_moe_block_shape: the
         * loader upsamples the checkpoint's scales (repeat_interleave) and
         * cuts them at (rows // tp) * rank, which lands on the rank's own
         * rows only when the experts are whole blocks. */
        if (I % q->bn || H % q->bn || I % q->bk || H % q->bk) {
            refuse(C, "the experts of '%s' are FP8 in blocks of %llu x %llu and %llu x %llu "
                      "(intermediate x hidden), not whole blocks: vLLM 0.33's refined %llu x "
                      "%llu grid at %s %d would cut their upsampled scales at other rows than "
                      "their weights' (tp values that work: %s)",
                   module, (unsigned long long)q->bn, (unsigned long long)q->bk,
                   (unsigned long long)I, (unsigned long long)H, (unsigned long long)g,
                   (unsigned long long)g, C->L->ep ? "EP size" : "tp", C->tp, works);
            return 0;
        }
        return 1;
    }
    refuse(C, "the experts of '%s' are FP8 in blocks of %llu x %llu: at %s %d each rank "
              "would hold %llu%s of their %llu rows, not whole blocks, which %s's fused MoE "
              "refuses (tp values that work: %s)",
           module, (unsigned long long)q->bn, (unsigned long long)q->bk,
           C->L->ep ? "EP size" : "tp", C->tp, (unsigned long long)(I / t),
           I % t ? " and a part" : "", (unsigned long long)I, lname, works);
    return 0;
}

/* The engine's name of a stack's scale: the stack's name (w13_weight) with
 * its trailing "weight" replaced by the source tensor's parameter name
 * (weight_scale_inv, input_scale). */
static char *stack_scale_name(cstate *C, const char *module, const char *into, const char *stack,
                              const char *param)
{
    size_t sl = strlen(stack);
    if (sl >= 6 && !strcmp(stack + sl - 6, "weight")) sl -= 6;
    return tps_lc_own_name(C, into ? tps_asprintf("%s.%s.%.*s%s", module, into, (int)sl, stack,
                                                  param)
                                   : tps_asprintf("%s.%.*s%s", module, (int)sl, stack, param));
}

/* A stack's block scales on vLLM's refined g x g grid, rank r: per expert
 * and part, the rank's P = I_p / g rows (rows stacks: w13) or columns (w2)
 * of the scale upsampled bn / g times along rows and bk / g along columns
 * (RoutedExperts.weight_loader repeat_interleave, then _load_w13 / _load_w2
 * narrow at (rows // tp) * rank): [E, parts x P, H / g] and [E, H / g, P]. */
static tps_err place_refined(cstate *C, const char *module, const char *into,
                             const tps_lstack *st, const size_t *idx, size_t nidx, size_t k0,
                             uint64_t Er, uint64_t I, int r)
{
    const tps_quant *q = C->L->q;
    const tps_ckpt *ck = C->ck;
    size_t w0 = idx[k0];
    const tps_ctensor *s0 = &ck->t[q->partner[w0]];
    uint64_t t = C->L->ep ? 1 : (uint64_t)C->tp, rank = C->L->ep ? 0 : (uint64_t)r;
    const tps_ctensor *wt = &ck->t[w0];
    uint64_t H = wt->shape[st->dim ? 0 : 1];
    uint64_t g = refine_grid(C, I, H);
    tps_xform x = {.rep_n = (uint32_t)(q->bn / g), .rep_k = (uint32_t)(q->bk / g)};
    uint64_t P = I / t / g, Hg = H / g;
    uint32_t f = st->dim ? x.rep_k : x.rep_n; /* along the cut dim */
    uint64_t a = rank * P / f, b = ((rank + 1) * P + f - 1) / f;
    x.skip = rank * P - a * f;
    x.out = P;
    size_t nparts = st->nparts;
    uint64_t per = P * Hg * 4; /* one part of one expert, F32 */
    uint64_t shape[TPS_MAX_DIMS] = {Er, st->dim ? Hg : nparts * P, st->dim ? P : Hg};
    char *name = stack_scale_name(C, module, into, st->name, tps_lc_param_of(s0->name));
    if (!name) return nomem(C);
    tps_rtensor *rt;
    TPS_TRY(tps_lc_new_rt(C, name, r, TPS_F32, 3, shape, "expert scales (refined grid)", &rt));
    uint64_t e0 = C->L->ep ? (uint64_t)r * Er : 0;
    for (uint64_t k = 0; k < Er; k++)
        for (size_t j = 0; j < nparts; j++)
            TPS_TRY(tps_lc_src_piece_x(C, rt, (size_t)q->partner[idx[(e0 + k) * nidx + k0 + j]],
                                       st->dim, a, b, (k * nparts + j) * per, &x, per));
    return TPS_OK;
}

tps_err tps_lc_place_stack_scales(cstate *C, const char *module, const char *into,
                                  const tps_lstack *st, const size_t *idx, size_t nidx,
                                  size_t k0, uint64_t Er, uint64_t I, int r)
{
    const tps_quant *q = C->L->q;
    const tps_ckpt *ck = C->ck;
#define W(e, j) idx[(e) * nidx + k0 + (j)]
    if (!q || q->role[W(0, 0)] != TPS_QR_WEIGHT) return TPS_OK;
    uint64_t t = C->L->ep ? 1 : (uint64_t)C->tp, Ir = I / t;
    size_t P = st->nparts;
    size_t w0 = W(0, 0);
    const tps_ctensor *s0 = &ck->t[q->partner[w0]];
    tps_qscale kind = q->kind[q->partner[w0]];
    uint64_t E = C->L->ep ? Er * (uint64_t)C->tp : Er;
    tps_dtype dt;
    if (!scale_dtype(C, s0, &dt)) return TPS_OK;
    uint64_t es = tps_dtype_bits(dt) / 8;
    for (uint64_t k = 0; k < E; k++)
        for (size_t j = 0; j < P; j++) {
            size_t wj = W(k, j);
            if (q->role[wj] != TPS_QR_WEIGHT || q->kind[q->partner[wj]] != kind ||
                ck->t[q->partner[wj]].dtype != s0->dtype ||
                (j + 1 == P && (q->input[wj] >= 0) != (q->input[W(0, P - 1)] >= 0))) {
                refuse(C, "expert tensor '%s' is not quantized like '%s' (its scale's kind or "
                          "dtype, or its input scale, differ): the engine stacks the experts' "
                          "scales into one parameter",
                       ck->t[wj].name, ck->t[w0].name);
                return TPS_OK;
            }
        }
    /* the rank's rows (rows stacks) or columns (columns stack) of one
     * expert's scale: block rows, channel rows, or the whole scale */
    uint64_t shape[TPS_MAX_DIMS] = {Er};
    int ndim = 1, sd = -1;
    uint64_t lo = 0, hi = 0, per = 1; /* elements of one part of one expert */
    if (kind == TPS_QS_TENSOR) {
        ndim = st->dim ? 1 : 2;
        shape[1] = P;
    } else if (kind == TPS_QS_CHANNEL) {
        ndim = 3;
        if (st->dim == 0) {
            shape[1] = P * Ir;
            shape[2] = 1;
            sd = C->L->ep ? -1 : 0;
            lo = (uint64_t)r * Ir;
            hi = lo + Ir;
            per = Ir;
        } else { /* RoutedExperts _load_per_channel_weight_scale: w2's whole */
            shape[1] = s0->shape[0];
            shape[2] = 1;
            per = s0->shape[0];
        }
    } else if (refine_grid(C, I, ck->t[w0].shape[st->dim ? 0 : 1])) {
        return place_refined(C, module, into, st, idx, nidx, k0, Er, I, r);
    } else { /* block */
        ndim = 3;
        uint64_t b = st->dim ? q->bk : q->bn;
        uint64_t n = st->dim ? (Ir + q->bk - 1) / q->bk : Ir / q->bn;
        if (C->L->ep || t == 1) {
            n = s0->shape[st->dim];
        } else {
            sd = st->dim;
            lo = (uint64_t)r * Ir / b;
            hi = lo + n;
        }
        shape[1] = st->dim ? s0->shape[0] : P * n;
        shape[2] = st->dim ? n : s0->shape[1];
        per = n * s0->shape[1 - st->dim];
    }
    char *name = stack_scale_name(C, module, into, st->name, tps_lc_param_of(s0->name));
    if (!name) return nomem(C);
    tps_rtensor *rt;
    TPS_TRY(tps_lc_new_rt(C, name, r, dt, ndim, shape, "expert scales", &rt));
    uint64_t e0 = C->L->ep ? (uint64_t)r * Er : 0;
    /* --pad-intermediate: block or channel rows (or block columns) past the
     * source's are the padding's, 1.0 */
    uint64_t have = sd >= 0 ? s0->shape[sd] : 0;
    for (uint64_t k = 0; k < Er; k++)
        for (size_t j = 0; j < P; j++) {
            size_t sj = (size_t)q->partner[W(e0 + k, j)];
            uint64_t at = (k * P + j) * per * es;
            if (sd >= 0 && hi > have)
                TPS_TRY(tps_lc_padded_piece(C, rt, sj, sd, lo, hi, have, at, 1.0));
            else
                TPS_TRY(tps_lc_src_piece(C, rt, sj, sd, lo, hi, at));
            if (C->why[0]) return TPS_OK;
        }
    if (q->input[W(0, P - 1)] < 0) return TPS_OK;
    /* RoutedExperts.weight_loader: one input scale per expert, w1's and w3's
     * both written to it, the last loaded (up_proj, w3) kept */
    const tps_ctensor *i0 = &ck->t[q->input[W(0, P - 1)]];
    if (!scale_dtype(C, i0, &dt)) return TPS_OK;
    name = stack_scale_name(C, module, into, st->name, tps_lc_param_of(i0->name));
    if (!name) return nomem(C);
    uint64_t ishape[TPS_MAX_DIMS] = {Er};
    TPS_TRY(tps_lc_new_rt(C, name, r, dt, 1, ishape, "expert input scales", &rt));
    for (uint64_t k = 0; k < Er; k++)
        TPS_TRY(tps_lc_src_piece(C, rt, (size_t)q->input[W(e0 + k, P - 1)], -1, 0, 0,
                                 k * (tps_dtype_bits(dt) / 8)));
    if (r || P < 2) return TPS_OK;
    tps_layout *L = C->L;
    if (!L->dropped && !(L->dropped = tps_xcalloc(ck->n, sizeof *L->dropped))) return nomem(C);
    for (uint64_t k = 0; k < E; k++)
        for (size_t j = 0; j + 1 < P; j++) {
            if (q->input[W(k, j)] < 0) continue; /* a split's dir: dropped already */
            size_t in = (size_t)q->input[W(k, j)];
            L->dropped[in] = "the engine's fused MoE holds one input scale per expert for the "
                             "stacked parts, the last one loaded";
            C->used[in] = 1;
        }
    return TPS_OK;
}
#undef W
