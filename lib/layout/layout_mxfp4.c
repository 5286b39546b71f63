/* layout_mxfp4.c - gpt-oss's experts in a serving layout, as vLLM
 * 0.33's gpt-oss loader holds them before process_weights_after_loading
 * (models/gpt_oss.py GptOssModel._load_weights_mxfp4, GptOssRoutedExperts,
 * quantization/mxfp4.py GptOssMxfp4MoEMethod.create_weights):
 *
 *   - every parameter is created zero, of the MoE backend's rounded-up
 *     sizes (layers/fused_moe/oracle/mxfp4.py
 *     mxfp4_round_up_hidden_size_and_intermediate_size): H' = H rounded up
 *     to the backend's hidden multiple, I' = I / tp rounded up to its
 *     intermediate multiple (tps_moe_backend);
 *   - rank r's rows of the intermediate size are [r p, min((r + 1) p, I))
 *     with p = cdiv(I / 32, tp) * 32, whole MX blocks: the last ranks may
 *     hold fewer real rows than the others, or none;
 *   - the real rows (columns for down_proj) are copied into the start of
 *     each expert's slot, zeros after them up to I';
 *   - w13: gate_up_proj's interleaved rows [2 r p, 2 min(...)) as they are
 *     (blocks, scales and bias alike), w2: down_proj's MX blocks of those
 *     features (a byte holds two codes, a scale a block of 32), w2_bias
 *     the real bias on rank 0 and zeros on every other rank.
 *
 * BF16 experts (GptOssModel._load_weights_other): no round-up, no uneven
 * cut (MLPBlock asserts I % tp == 0): w13_weight [E, 2 I / tp, H] is
 * gate_up_proj[:, :, 2 r I / tp : 2 (r + 1) I / tp] with each expert's
 * matrix transposed (permute(0, 2, 1)), w2_weight [E, H, I / tp] is
 * down_proj[:, r I / tp : (r + 1) I / tp, :] transposed likewise; the
 * biases as for MXFP4. One transposed piece each (tps_xform.tr).
 *
 * As pieces: each expert's real rows are one run and its zero tail another,
 * their runs an expert apart (sdim 1); down_proj's real and zero columns
 * are runs a row apart. A backend that pads the hidden size too would need
 * each row of each expert padded inside the expert's run (two strides at
 * once), which pieces cannot say: refused, naming the backends that work. */
#include "layout_int.h"

#include <stdlib.h>
#include <string.h>

#define MX_BLOCK 32 /* OCP MX: codes per scale (vLLM's OCP_MX_BLOCK_SIZE) */

static uint64_t round_up(uint64_t x, uint64_t m) { return m ? (x + m - 1) / m * m : x; }

/* "triton, triton_unfused, cpu, emulation": the backends that leave H as is. */
static void backends_keeping(uint64_t H, char *buf, size_t len)
{
    size_t n, o = 0;
    const tps_moe_backend *b = tps_moe_backend_list(&n);
    buf[0] = 0;
    for (size_t i = 0; i < n && o < len; i++)
        if (round_up(H, b[i].hidden_align) == H)
            o += (size_t)snprintf(buf + o, len - o, "%s%s", o ? ", " : "", b[i].name);
}

/* Rank tensor rt of E experts, each `slot` bytes: source src's [lo, hi)
 * along dim (each expert's `real` bytes) at the start of every slot, zeros
 * after them. rows: the runs are whole experts (sdim 1); else each expert's
 * runs are rows of `slot` bytes (the rank tensor's last dim, sdim 0). */
static tps_err real_then_zeros(cstate *C, tps_rtensor *rt, size_t src, int dim, uint64_t lo,
                               uint64_t hi, uint64_t real, uint64_t slot)
{
    int sdim = dim == 1 ? 1 : 0;
    if (!real)
        return tps_lc_add_piece(C, rt, (tps_lpiece){.kind = TPS_PK_ZERO, .nbytes = rt->nbytes});
    if (real == slot) return tps_lc_src_piece(C, rt, src, dim, lo, hi, 0);
    TPS_TRY(tps_lc_src_piece_stride(C, rt, src, dim, lo, hi, 0, real, sdim));
    uint64_t runs = rt->nbytes / slot;
    return tps_lc_add_piece(C, rt, (tps_lpiece){.kind = TPS_PK_ZERO, .at = real,
                                                .nbytes = runs * (slot - real),
                                                .run = (uint32_t)(slot - real),
                                                .sdim = (uint8_t)sdim});
}

/* <module>.<leaf><suffix>: its index, or -1 and a refusal (-2: out of memory). */
static int find_part(cstate *C, const char *module, const char *leaf, const char *suffix)
{
    char *n = tps_asprintf("%s.%s%s", module, leaf, suffix);
    if (!n) return -2;
    int t = tps_ckpt_find(C->ck, n);
    if (t < 0)
        refuse(C, "layout %s stacks the experts of '%s', but the checkpoint lacks '%s'",
               C->L->spec->name, module, n);
    free(n);
    return t;
}

/* A stack's bias, [E, out] in the serving dtype: its index, or -1 and a
 * refusal (-2: out of memory). */
static int find_bias(cstate *C, const char *module, const tps_lstack *st, uint64_t E,
                     uint64_t out)
{
    int b = find_part(C, module, st->bias_part, "");
    if (b < 0) return b;
    const tps_ctensor *t = &C->ck->t[b];
    tps_dtype sd = tps_lc_serving_dtype(C->ck->config);
    if (t->ndim != 2 || t->shape[0] != E || t->shape[1] != out || t->dtype != sd) {
        char got[80] = "";
        for (int d = 0, o = 0; d < t->ndim && o < (int)sizeof got; d++)
            o += snprintf(got + o, sizeof got - (size_t)o, "%s%llu", d ? ", " : "",
                          (unsigned long long)t->shape[d]);
        refuse(C, "tensor '%s' must be %s [%llu, %llu] (the experts' bias, in the dtype vLLM "
                  "0.33 serves this model in, config.json's torch_dtype), but it is %s [%s]",
               t->name, tps_dtype_name(sd), (unsigned long long)E, (unsigned long long)out,
               tps_dtype_name(t->dtype), got);
        return -1;
    }
    return b;
}

/* <module>[.<pre>].<leaf>, kept with the layout (NULL: out of memory). */
static char *stack_name(cstate *C, const char *module, const char *pre, const char *leaf)
{
    return tps_lc_own_name(C, pre ? tps_asprintf("%s.%s.%s", module, pre, leaf)
                                  : tps_asprintf("%s.%s", module, leaf));
}

/* A columns stack's bias [E, H] (bias_first: whole on rank 0 and zeros on
 * the others, added once after the reduction; else whole on every rank) on
 * rank r as bn. */
static tps_err down_bias(cstate *C, const char *bn, int r, size_t bi, const tps_lstack *st)
{
    const tps_ctensor *bt = &C->ck->t[bi];
    tps_rtensor *rt;
    TPS_TRY(tps_lc_new_rt(C, bn, r, bt->dtype, 2, bt->shape, "experts", &rt));
    if (r == 0 || !st->bias_first) return tps_lc_src_piece(C, rt, bi, -1, 0, 0, 0);
    return tps_lc_add_piece(C, rt, (tps_lpiece){.kind = TPS_PK_ZERO, .nbytes = rt->nbytes});
}

tps_err tps_lc_mxfp4_experts(cstate *C, const tps_lexperts *x, const char *module, uint64_t E,
                             uint64_t I, uint64_t H)
{
    tps_layout *L = C->L;
    const char *lname = L->spec->name;
    const tps_moe_backend *mb = L->moe;
    uint64_t tp = (uint64_t)C->tp;
    if (L->ep) {
        refuse(C, "--ep: layout %s does not hold gpt-oss's MXFP4 experts whole on one rank each "
                  "yet; split them without --ep", lname);
        return TPS_OK;
    }
    uint64_t Hp = round_up(H, mb->hidden_align);
    if (Hp != H) {
        char ok[200];
        backends_keeping(H, ok, sizeof ok);
        refuse(C, "--moe-backend %s rounds hidden_size %llu up to %llu: vLLM 0.33 then holds "
                  "every row of every MXFP4 expert padded with zeros inside the expert "
                  "(mxfp4_round_up_hidden_size_and_intermediate_size), which layout %s cannot "
                  "write yet; MoE backends that keep hidden_size %llu: %s",
               mb->name, (unsigned long long)H, (unsigned long long)Hp, lname,
               (unsigned long long)H, ok[0] ? ok : "none");
        return TPS_OK;
    }
    /* the layout's checks refuse I % tp first (MLPBlock's assert); mxfp4.c
     * made I and H whole MX blocks */
    if (I % tp || I % MX_BLOCK || H % MX_BLOCK) {
        refuse(C, "%s = %llu does not split into whole MX blocks over tp %d (layout %s)",
               x->rows ? x->rows : "intermediate_size", (unsigned long long)I, C->tp, lname);
        return TPS_OK;
    }
    uint64_t Ip = round_up(I / tp, mb->inter_align);
    uint64_t per = (I / MX_BLOCK + tp - 1) / tp * MX_BLOCK; /* GptOssModel: cdiv(I / 32, tp) * 32 */
    L->moe_used = 1;
    for (size_t si = 0; si < x->nstacks; si++) {
        const tps_lstack *st = &x->stacks[si];
        int cols = st->dim == 1;
        if (!st->scale_as || !st->bias_part || (!cols && !st->interleaved)) {
            refuse(C, "layout %s: stack '%s' of MXFP4 experts needs its scale's and bias's "
                      "names%s",
                   lname, st->name, cols ? "" : " and interleaved gate/up rows");
            return TPS_OK;
        }
        int wb = find_part(C, module, st->parts[0], TPS_MXFP4_BLOCKS);
        int ws = wb < 0 ? wb : find_part(C, module, st->parts[0], TPS_MXFP4_SCALES);
        int bi = ws < 0 ? ws : find_bias(C, module, st, E, cols ? H : 2 * I);
        if (bi == -2) return nomem(C);
        if (bi < 0) return TPS_OK;
        const char *pre = x->into ? x->into : NULL;
        char *wn = stack_name(C, module, pre, st->name);
        char *sn = stack_name(C, module, pre, st->scale_as);
        char *bn = stack_name(C, module, pre, st->bias_as);
        if (!wn || !sn || !bn) return nomem(C);
        const tps_ctensor *bt = &C->ck->t[bi];
        uint64_t bes = tps_dtype_bits(bt->dtype) / 8;
        for (int r = 0; r < C->tp; r++) {
            uint64_t lo = (uint64_t)r * per < I ? (uint64_t)r * per : I;
            uint64_t hi = lo + per < I ? lo + per : I, n = hi - lo;
            tps_rtensor *rt;
            if (!cols) {
                /* [E, 2 I', H / 2] codes, [E, 2 I', H / 32] scales, [E, 2 I'] bias:
                 * each expert's 2 n interleaved rows, then zero rows */
                uint64_t ws_[3] = {E, 2 * Ip, H / 2}, ss[3] = {E, 2 * Ip, H / MX_BLOCK};
                uint64_t bs[2] = {E, 2 * Ip};
                TPS_TRY(tps_lc_new_rt(C, wn, r, TPS_U8, 3, ws_, "experts", &rt));
                TPS_TRY(real_then_zeros(C, rt, (size_t)wb, 1, 2 * lo, 2 * hi, 2 * n * (H / 2),
                                        2 * Ip * (H / 2)));
                TPS_TRY(tps_lc_new_rt(C, sn, r, TPS_U8, 3, ss, "experts", &rt));
                TPS_TRY(real_then_zeros(C, rt, (size_t)ws, 1, 2 * lo, 2 * hi,
                                        2 * n * (H / MX_BLOCK), 2 * Ip * (H / MX_BLOCK)));
                TPS_TRY(tps_lc_new_rt(C, bn, r, bt->dtype, 2, bs, "experts", &rt));
                TPS_TRY(real_then_zeros(C, rt, (size_t)bi, 1, 2 * lo, 2 * hi, 2 * n * bes,
                                        2 * Ip * bes));
            } else {
                /* [E, H, I' / 2] codes, [E, H, I' / 32] scales: each row's blocks of
                 * the rank's n features, then zero columns; [E, H] bias */
                uint64_t ws_[3] = {E, H, Ip / 2}, ss[3] = {E, H, Ip / MX_BLOCK};
                TPS_TRY(tps_lc_new_rt(C, wn, r, TPS_U8, 3, ws_, "experts", &rt));
                TPS_TRY(real_then_zeros(C, rt, (size_t)wb, 2, lo / MX_BLOCK, hi / MX_BLOCK,
                                        n / 2, Ip / 2));
                TPS_TRY(tps_lc_new_rt(C, sn, r, TPS_U8, 3, ss, "experts", &rt));
                TPS_TRY(real_then_zeros(C, rt, (size_t)ws, 2, lo / MX_BLOCK, hi / MX_BLOCK,
                                        n / MX_BLOCK, Ip / MX_BLOCK));
                TPS_TRY(down_bias(C, bn, r, (size_t)bi, st));
            }
        }
        C->used[wb] = C->used[ws] = C->used[bi] = 1;
    }
    return TPS_OK;
}

tps_err tps_lc_transposed_experts(cstate *C, const tps_lexperts *x, const char *module,
                                  uint64_t E, uint64_t I, uint64_t H)
{
    tps_layout *L = C->L;
    const char *lname = L->spec->name;
    uint64_t tp = (uint64_t)C->tp;
    if (L->ep) {
        refuse(C, "--ep: layout %s does not hold gpt-oss's experts whole on one rank each yet; "
                  "split them without --ep", lname);
        return TPS_OK;
    }
    if (I % tp) { /* the layout's checks refuse it first (MLPBlock's assert) */
        refuse(C, "%s = %llu is not divisible by tp %d (layout %s)",
               x->rows ? x->rows : "intermediate_size", (unsigned long long)I, C->tp, lname);
        return TPS_OK;
    }
    uint64_t Ir = I / tp;
    tps_dtype sd = tps_lc_serving_dtype(C->ck->config);
    const char *pre = x->into ? x->into : NULL;
    for (size_t si = 0; si < x->nstacks; si++) {
        const tps_lstack *st = &x->stacks[si];
        int cols = st->dim == 1; /* w2: down_proj [E, I, H], cut along I */
        if (!st->bias_part || (!cols && !st->interleaved)) {
            refuse(C, "layout %s: stack '%s' of transposed experts needs its bias's name%s",
                   lname, st->name, cols ? "" : " and interleaved gate/up columns");
            return TPS_OK;
        }
        int w = find_part(C, module, st->parts[0], "");
        int bi = w < 0 ? w : find_bias(C, module, st, E, cols ? H : 2 * I);
        if (bi == -2) return nomem(C);
        if (bi < 0) return TPS_OK;
        const tps_ctensor *wt = &C->ck->t[w];
        uint64_t d1 = cols ? I : H, d2 = cols ? H : 2 * I;
        if (wt->ndim != 3 || wt->shape[0] != E || wt->shape[1] != d1 || wt->shape[2] != d2 ||
            wt->dtype != sd) {
            refuse(C, "tensor '%s' must be %s [%llu, %llu, %llu] (config.json's %s, %s and "
                      "hidden_size; the dtype vLLM 0.33 serves this model in), but it is %s "
                      "%d-D [%llu, %llu, %llu]",
                   wt->name, tps_dtype_name(sd), (unsigned long long)E, (unsigned long long)d1,
                   (unsigned long long)d2, x->count, x->rows ? x->rows : "intermediate_size",
                   tps_dtype_name(wt->dtype), wt->ndim,
                   (unsigned long long)(wt->ndim > 0 ? wt->shape[0] : 0),
                   (unsigned long long)(wt->ndim > 1 ? wt->shape[1] : 0),
                   (unsigned long long)(wt->ndim > 2 ? wt->shape[2] : 0));
            return TPS_OK;
        }
        char *wn = stack_name(C, module, pre, st->name);
        char *bn = stack_name(C, module, pre, st->bias_as);
        if (!wn || !bn) return nomem(C);
        const tps_ctensor *bt = &C->ck->t[bi];
        for (int r = 0; r < C->tp; r++) {
            uint64_t lo = (uint64_t)r * Ir, hi = lo + Ir;
            tps_rtensor *rt;
            if (!cols) {
                uint64_t ws[3] = {E, 2 * Ir, H}, bs[2] = {E, 2 * Ir};
                TPS_TRY(tps_lc_new_rt(C, wn, r, wt->dtype, 3, ws, "experts", &rt));
                TPS_TRY(tps_lc_src_piece_tr(C, rt, (size_t)w, 2, 2 * lo, 2 * hi, 0));
                TPS_TRY(tps_lc_new_rt(C, bn, r, bt->dtype, 2, bs, "experts", &rt));
                TPS_TRY(tps_lc_src_piece(C, rt, (size_t)bi, 1, 2 * lo, 2 * hi, 0));
            } else {
                uint64_t ws[3] = {E, H, Ir};
                TPS_TRY(tps_lc_new_rt(C, wn, r, wt->dtype, 3, ws, "experts", &rt));
                TPS_TRY(tps_lc_src_piece_tr(C, rt, (size_t)w, 1, lo, hi, 0));
                TPS_TRY(down_bias(C, bn, r, (size_t)bi, st));
            }
        }
        C->used[w] = C->used[bi] = 1;
    }
    return TPS_OK;
}
