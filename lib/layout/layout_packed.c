/* layout_packed.c - packed integer methods in a serving layout (GPTQ, AWQ):
 * the tensors of each quantized linear (its codes, scales and zero points)
 * cut where the engine cuts the features they encode, and fused alike.
 *
 * A part of a linear (lib/quant/: the method's part table) holds the
 * linear's output features along one dim and its input features along the
 * other ([in, out] for GPTQ and AWQ, [out, in] for compressed-tensors), each
 * in units: one element per feature, per group of input features, or per
 * packed word (pack factor = the storage dtype's bits / the code bits). A
 * rank's range of features becomes a range of elements only when it starts
 * and ends on whole units; vLLM's PackedvLLMParameter would floor it and
 * mis-slice, so tpshard refuses instead, with the tp values that work.
 *
 *   column-parallel (q/k/v, gate/up: fused)  output features split, the
 *       parts concatenated along the output dim: rows for [out, in]
 *       storage, columns for [in, out], whose pieces are then strided
 *       (one run per row: tps_lpiece.run);
 *   row-parallel (o_proj, down_proj)  input features split; a part with
 *       one group (group_size -1, channelwise scales and zeros) whole on
 *       every rank, as vLLM's marlin_repeat_scales_on_all_ranks keeps it;
 *   replicated  every part whole.
 *
 * (models/ and layers/linear.py: QKVParallelLinear, MergedColumn-
 * ParallelLinear, RowParallelLinear; model_executor/parameter.py: the
 * _adjust_shard_indexes_for_packing of packed parameters.) */
#include "layout_int.h"

#include <stdlib.h>
#include <string.h>

#define MAXP 8

/* One quantized linear: its tensors by the method's part (SIZE_MAX when the
 * method's part is absent: an unused one, g_idx), its features. */
typedef struct {
    size_t t[MAXP];
    uint64_t in, out;
    uint64_t pout; /* out, padded (--pad-intermediate) */
    size_t stem;
} plinear;

static int has_suffix(const char *s, const char *suf, size_t *stem)
{
    size_t a = strlen(s), b = strlen(suf);
    if (a <= b || strcmp(s + a - b, suf)) return 0;
    *stem = a - b;
    return 1;
}

static uint64_t pack_factor(const tps_quant *q, const tps_ctensor *t)
{
    return (uint64_t)tps_dtype_bits(t->dtype) / (uint64_t)q->bits;
}

/* Part p's units of output and input features (*iu 0: one group, all of
 * them), and the dims they lie along. */
static void part_units(const tps_quant *q, const tps_qpart *p, const tps_ctensor *t, uint64_t *ou,
                       uint64_t *iu, int *oax, int *iax)
{
    uint64_t pf = pack_factor(q, t);
    *ou = p->out_packed ? pf : 1;
    *iu = p->in_by == 0 ? 1 : p->in_by == 2 ? pf : q->group < 0 ? 0 : (uint64_t)q->group;
    *oax = q->m->transposed ? 1 : 0;
    *iax = 1 - *oax;
}

/* The linear whose weight (the method's weight part) is source tensor w. */
static void linear_of(const cstate *C, size_t w, plinear *pl)
{
    const tps_quant *q = C->L->q;
    const tps_ckpt *ck = C->ck;
    const tps_qmethod *m = q->m;
    has_suffix(ck->t[w].name, m->weight_suffix, &pl->stem);
    const tps_qpart *wp = NULL;
    for (size_t j = 0; j < m->nparts && j < MAXP; j++) {
        pl->t[j] = SIZE_MAX;
        if (m->parts[j].role == TPS_QR_WEIGHT) {
            pl->t[j] = w;
            wp = &m->parts[j];
            continue;
        }
        char *pn = tps_asprintf("%.*s%s", (int)pl->stem, ck->t[w].name, m->parts[j].suffix);
        int k = pn ? tps_ckpt_find(ck, pn) : -1;
        free(pn);
        if (k >= 0 && m->parts[j].role != TPS_QR_UNUSED) pl->t[j] = (size_t)k;
    }
    const tps_ctensor *wt = &ck->t[w];
    uint64_t pf = pack_factor(q, wt);
    uint64_t si = wt->shape[m->transposed ? 0 : 1], so = wt->shape[m->transposed ? 1 : 0];
    pl->in = si * (wp->in_by == 2 ? pf : 1);
    pl->out = so * (wp->out_packed ? pf : 1);
}

/* Do rank r's features [lo, lo + len) start and end on whole units? */
static int on_units(uint64_t lo, uint64_t len, uint64_t u)
{
    return u == 0 || (lo % u == 0 && len % u == 0);
}

/* "1, 2, 4" of the tp values up to 64 at which n features (on whole heads
 * of them, replicated when fewer than ranks, or split evenly) give every
 * rank whole units of u. */
static void unit_tps(char *buf, size_t len, uint64_t n, uint64_t heads, int replicate, uint64_t u)
{
    size_t o = 0;
    buf[0] = 0;
    for (int tp = 1; tp <= 64 && o < len; tp++) {
        int ok = 1;
        for (int r = 0; r < tp && ok; r++) {
            uint64_t lo, l;
            ok = tps_lc_part_rows(n, heads, replicate, tp, r, 1, &lo, &l) && on_units(lo, l, u);
        }
        if (ok) o += (size_t)snprintf(buf + o, len - o, "%s%d", o ? ", " : "", tp);
    }
    if (!o) snprintf(buf, len, "none up to 64");
}

/* A refusal for tensor t, whose rank cut [lo, lo + len) of its linear's
 * `what` features is not whole units of u. */
static void refuse_units(cstate *C, const tps_ctensor *t, const char *what, uint64_t n, uint64_t lo,
                         uint64_t len, uint64_t u, uint64_t heads, int replicate, int is_group)
{
    char works[300];
    unit_tps(works, sizeof works, n, heads, replicate, u);
    refuse(C, "tensor '%s': layout %s gives a rank %s features [%llu, %llu) of %llu, which is "
              "not whole %s of %llu (quant_method %s, %d-bit codes); the engine would cut "
              "inside one (tp values that work: %s)",
           t->name, C->L->spec->name, what, (unsigned long long)lo, (unsigned long long)(lo + len),
           (unsigned long long)n, is_group ? "groups" : "packed words", (unsigned long long)u,
           C->L->q->method_name, C->L->q->bits, works);
}

/* ------------------------------------------------------------------ --pad-intermediate */

static uint64_t gcd_u(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static uint64_t lcm_u(uint64_t a, uint64_t b) { return a && b ? a / gcd_u(a, b) * b : a ? a : b; }

/* A word of codes that dequantize to exactly 0 for part p (the pad pieces'
 * value), as the method's table entry says (pad_word): GPTQ and symmetric
 * compressed-tensors codes are biased by 2^(bits-1) (uint4b8, uint8b128),
 * GPTQ's stored zero points are that minus one (AutoGPTQ's v1 format);
 * AWQ's and asymmetric codes with zero points of 0, NVFP4's +0, scales 0.0:
 * zero bytes. */
static uint32_t pad_word(const tps_quant *q, const tps_qpart *p)
{
    return q->m->pad_word ? q->m->pad_word(q, p->role) : 0;
}

/* The padded size of n features split at tp (pad_from: the unpadded), or n. */
static uint64_t padded(const cstate *C, uint64_t n)
{
    const tps_layout *L = C->L;
    return L->pad_to > L->pad_from && n == L->pad_from ? L->pad_to : n;
}

/* A pad piece of `units` elements along ax of part p in rank tensor rt at
 * byte at (strided by run when the rank tensor holds other parts beside it
 * along its last dim). */
static tps_err pad_piece(cstate *C, tps_rtensor *rt, const tps_qpart *p, uint64_t nbytes,
                         uint64_t at, uint64_t run)
{
    uint32_t w = pad_word(C->L->q, p);
    tps_lpiece pc = {.kind = w ? TPS_PK_CONST : TPS_PK_ZERO, .at = at, .nbytes = nbytes,
                     .run = (uint32_t)run, .value = (double)(int32_t)w};
    if (!nbytes) return TPS_OK;
    if (!C->in_experts) C->L->pad_used = 1;
    return tps_lc_add_piece(C, rt, pc);
}

/* The features an intermediate size must be a whole number of, for every
 * part of the method to cut on whole words and groups (1 unquantized). */
static uint64_t pad_unit(const tps_quant *q)
{
    uint64_t unit = 1;
    for (size_t j = 0; q && q->m->weight_suffix && j < q->m->nparts; j++) {
        const tps_qpart *p = &q->m->parts[j];
        if (p->role == TPS_QR_UNUSED || p->role == TPS_QR_SHAPE || p->per_tensor) continue;
        tps_dtype d = p->role == TPS_QR_ZEROS ? TPS_I32 : p->role == TPS_QR_SCALE ? TPS_F16
                      : q->m->weight_dtype(TPS_I32) ? TPS_I32 : TPS_U8;
        uint64_t pf = (uint64_t)tps_dtype_bits(d) / (uint64_t)q->bits;
        uint64_t ou = p->out_packed ? pf : 1;
        uint64_t iu = p->in_by == 0 ? 1 : p->in_by == 2 ? pf : q->group < 0 ? 1 : (uint64_t)q->group;
        unit = lcm_u(unit, lcm_u(ou, iu));
    }
    return unit;
}

/* --pad-intermediate of an experts module whose intermediate size is I:
 * *Ip the next multiple of unit x tp (I itself where it splits), recorded
 * as the layout's experts padding (L->epad_*, one size for every module);
 * a refusal when I is not whole units (what: what the units are). */
tps_err tps_lc_expert_pad(cstate *C, const tps_lexperts *x, uint64_t I, uint64_t unit,
                          const char *what, uint64_t *Ip)
{
    tps_layout *L = C->L;
    uint64_t tp = (uint64_t)C->tp, step = unit * tp;
    *Ip = I;
    if (I % unit) {
        refuse(C, "--pad-intermediate: the experts' %llu intermediate features are not whole "
                  "%s of %llu", (unsigned long long)I, what, (unsigned long long)unit);
        return TPS_OK;
    }
    uint64_t P = (I + step - 1) / step * step;
    if (P > I && (!L->epad_field || L->epad_from == I)) {
        L->epad_field = x->rows ? x->rows : "moe_intermediate_size";
        L->epad_from = I;
        L->epad_to = P;
        if (!C->epad_said) {
            char d[256];
            snprintf(d, sizeof d, "%s %llu padded to %llu: %llu features a rank, whole units of %llu",
                     L->epad_field, (unsigned long long)I, (unsigned long long)P,
                     (unsigned long long)(P / tp), (unsigned long long)unit);
            TPS_TRY(tps_lc_add_check(C, "--pad-intermediate (experts)", 1, d));
            C->epad_said = 1;
        }
    }
    *Ip = P;
    return TPS_OK;
}

tps_err tps_lc_pad_setup(cstate *C)
{
    tps_layout *L = C->L;
    const tps_ckpt *ck = C->ck;
    const tps_quant *q = L->q;
    if (!L->pad_mode) return TPS_OK;
    L->pad_field = "intermediate_size";
    int present;
    uint64_t I = tps_lc_config_count(ck->config, L->pad_field, &present);
    if (!I) {
        refuse(C, "--pad-intermediate: config.json has no usable intermediate_size to pad");
        return TPS_OK;
    }
    uint64_t unit = pad_unit(q);
    if (q && !q->m->weight_suffix) {
        if (q->m != &tps_qm_fp8 && q->m != &tps_qm_ct_fp8) {
            refuse(C, "--pad-intermediate: %s checkpoints are not padded (FP8, the packed methods "
                      "and unquantized ones are)",
                   q->method_name);
            return TPS_OK;
        }
        /* FP8: gate/up rows in whole blocks of bn, down columns of bk; the
         * padding's weights are zero bytes, its block or channel scales 1.0 */
        unit = q->bn ? lcm_u(q->bn, q->bk) : 1;
    }
    /* a dense MLP: a 2-D .mlp. tensor with I features, not an expert's or
     * a router's */
    int dense = 0;
    for (size_t i = 0; i < ck->n && !dense; i++) {
        const tps_ctensor *t = &ck->t[i];
        dense = t->ndim == 2 && strstr(t->name, ".mlp.") && !strstr(t->name, "expert") &&
                !strstr(t->name, ".mlp.gate.") && !strstr(t->name, "router") &&
                (t->shape[0] == I || t->shape[1] == I);
    }
    if (I % unit || !dense) {
        /* no dense MLP can hold it (an MoE's unused field), or the linears
         * refuse it themselves with their units */
        L->pad_from = L->pad_to = I;
        return TPS_OK;
    }
    uint64_t step = unit * (uint64_t)C->tp;
    L->pad_from = I;
    L->pad_to = (I + step - 1) / step * step;
    char d[256];
    if (L->pad_to > I)
        snprintf(d, sizeof d, "%s %llu padded to %llu: %llu features a rank, whole units of %llu",
                 L->pad_field, (unsigned long long)I, (unsigned long long)L->pad_to,
                 (unsigned long long)(L->pad_to / (uint64_t)C->tp), (unsigned long long)unit);
    else
        snprintf(d, sizeof d, "%s %llu splits at tp %d as it is: no padding", L->pad_field,
                 (unsigned long long)I, C->tp);
    return tps_lc_add_check(C, "--pad-intermediate", 1, d);
}

/* Scales in the model's dtype, as the engine creates them (params_dtype):
 * 0 and a refusal when the checkpoint's are another. */
static int scale_dtype_ok(cstate *C, const tps_ctensor *t)
{
    tps_dtype want = tps_lc_serving_dtype(C->ck->config);
    if (t->dtype == want) return 1;
    refuse(C, "tensor '%s' is %s, but %s creates %s scales in the model's dtype (%s, from "
              "config.json) and would convert these on load; tpshard writes a checkpoint's "
              "bytes as they are: requantize with %s scales or set config.json's torch_dtype",
           t->name, tps_dtype_name(t->dtype), C->L->spec->target, C->L->q->method_name,
           tps_dtype_name(want), tps_dtype_name(want));
    return 0;
}

/* An unfused linear on every rank: out (split 1), in (2) or whole (0). */
static tps_err place_linear(cstate *C, const plinear *pl, int how, const char *rule)
{
    int is_mlp = strstr(C->ck->t[pl->t[0] == SIZE_MAX ? 0 : pl->t[0]].name, ".mlp.") != NULL;
    const tps_quant *q = C->L->q;
    const tps_qmethod *m = q->m;
    const tps_ckpt *ck = C->ck;
    for (size_t j = 0; j < m->nparts && j < MAXP; j++) {
        if (pl->t[j] == SIZE_MAX) continue;
        const tps_ctensor *t = &ck->t[pl->t[j]];
        const tps_qpart *p = &m->parts[j];
        uint64_t ou, iu;
        int oax, iax;
        part_units(q, p, t, &ou, &iu, &oax, &iax);
        if (p->role == TPS_QR_SCALE && q->m->scales_model_dtype && !scale_dtype_ok(C, t))
            return TPS_OK;
        uint64_t n = how == 1 ? pl->out : pl->in, u = how == 1 ? ou : iu;
        int ax = how == 1 ? oax : iax;
        if (how == 2 && iu == 0 && C->tp > 1 && m->channel_rowwise_refusal) {
            refuse(C, "tensor '%s': a row-parallel layer with quantization_config.group_size "
                      "-1: %s (tp values that work: 1)",
                   t->name, m->channel_rowwise_refusal);
            return TPS_OK;
        }
        /* the MLP's intermediate features, padded (--pad-intermediate) */
        uint64_t real = n;
        if (how && is_mlp) n = padded(C, n);
        int whole = how == 0 || (how == 2 && iu == 0) || p->role == TPS_QR_SHAPE || p->per_tensor;
        for (int r = 0; r < C->tp && p->per_tensor; r++) {
            /* one slot: the engine's PerTensorScaleParameter of one part */
            uint64_t one[1] = {1};
            tps_rtensor *rt;
            TPS_TRY(tps_lc_new_rt(C, t->name, r, t->dtype, 1, one, rule, &rt));
            TPS_TRY(tps_lc_src_piece(C, rt, pl->t[j], -1, 0, 0, 0));
        }
        for (int r = 0; r < C->tp && !p->per_tensor; r++) {
            uint64_t shape[TPS_MAX_DIMS], lo = 0, len = 0;
            tps_shape_get(shape, t);
            uint64_t rl = 0;
            if (!whole) {
                tps_lc_part_rows(n, 0, 0, C->tp, r, 1, &lo, &len);
                rl = lo >= real ? 0 : lo + len <= real ? len : real - lo;
                if (n % (uint64_t)C->tp) {
                    char works[300];
                    tps_lc_works_list(works, sizeof works, n, 0, tps_lc_ok_divides);
                    refuse(C, "tensor '%s': its %llu %s features do not divide by tp %d (layout "
                              "%s splits them evenly; tp values that work: %s)",
                           t->name, (unsigned long long)n, how == 1 ? "output" : "input", C->tp,
                           C->L->spec->name, works);
                    return TPS_OK;
                }
                if (!on_units(lo, len, u)) {
                    refuse_units(C, t, how == 1 ? "output" : "input", n, lo, len, u, 0, 0,
                                 how == 2 && p->in_by == 1);
                    return TPS_OK;
                }
                shape[ax] = len / u;
            }
            tps_rtensor *rt;
            TPS_TRY(tps_lc_new_rt(C, t->name, r, t->dtype, t->ndim, shape, rule, &rt));
            if (whole) {
                TPS_TRY(tps_lc_src_piece(C, rt, pl->t[j], -1, 0, 0, 0));
            } else if (rl == len) {
                TPS_TRY(tps_lc_src_piece(C, rt, pl->t[j], ax, lo / u, (lo + len) / u, 0));
            } else {
                /* the real features, then zeros that dequantize to 0 */
                size_t es = tps_dtype_bits(t->dtype) / 8;
                uint64_t other = t->shape[1 - ax], ru = rl / u, pu = (len - rl) / u;
                if (ax == 0) {
                    uint64_t rowb = other * es;
                    if (ru) TPS_TRY(tps_lc_src_piece(C, rt, pl->t[j], 0, lo / u, lo / u + ru, 0));
                    TPS_TRY(pad_piece(C, rt, p, pu * rowb, ru * rowb, 0));
                } else {
                    if (ru) TPS_TRY(tps_lc_src_piece_run(C, rt, pl->t[j], 1, lo / u, lo / u + ru, 0, ru * es));
                    TPS_TRY(pad_piece(C, rt, p, other * pu * es, ru * es, pu * es));
                }
            }
        }
    }
    return TPS_OK;
}

/* Is the module of packed weight w part j of fuse entry f? Its parent's
 * length in *pl. */
static int fused_member(const tps_lfuse *f, const char *nm, size_t ml, size_t *which, size_t *pl)
{
    for (size_t j = 0; j < f->nparts; j++) {
        size_t lp = strlen(f->parts[j].module);
        if (ml > lp && nm[ml - lp - 1] == '.' && !memcmp(nm + ml - lp, f->parts[j].module, lp)) {
            *which = j;
            *pl = ml - lp - 1;
            return 1;
        }
    }
    return 0;
}

/* Part j of a fused group: its heads (0: split evenly), checked at tp. */
static int fused_heads(cstate *C, const tps_lfuse *f, size_t j, const tps_ctensor *w,
                       uint64_t out, uint64_t *heads)
{
    const tps_lpart *p = &f->parts[j];
    const tps_ckpt *ck = C->ck;
    char works[300];
    *heads = 0;
    if (f->whole) return 1;
    if (!p->heads) {
        if (out % (uint64_t)C->tp) {
            tps_lc_works_list(works, sizeof works, out, 0, tps_lc_ok_divides);
            refuse(C, "tensor '%s': its %llu output features%s%s do not divide by tp %d (layout "
                      "%s splits them evenly; tp values that work: %s)",
                   w->name, (unsigned long long)out, p->rows ? " = " : "", p->rows ? p->rows : "",
                   C->tp, C->L->spec->name, works);
            return 0;
        }
        return 1;
    }
    int present;
    uint64_t h = tps_lc_config_count(ck->config, p->heads, &present);
    if (!h || out % h) {
        refuse(C, "layout %s splits '%s' on whole heads, but %s", C->L->spec->name, w->name,
               !h ? "config.json has no usable count in the heads field"
                  : "its output features are not a whole number of heads");
        return 0;
    }
    int ok = h % (uint64_t)C->tp == 0 ||
             (p->replicate && h < (uint64_t)C->tp && (uint64_t)C->tp % h == 0);
    if (!ok) {
        size_t o = 0;
        works[0] = 0;
        for (int tp = 1; tp <= 64 && o < sizeof works; tp++)
            if (h % (uint64_t)tp == 0 || (p->replicate && h < (uint64_t)tp && tp % (int)h == 0))
                o += (size_t)snprintf(works + o, sizeof works - o, "%s%d", o ? ", " : "", tp);
        refuse(C, "%s = %llu: tp %d does not split it on whole heads (layout %s, tensor '%s'; tp "
                  "values that work: %s)",
               p->heads, (unsigned long long)h, C->tp, C->L->spec->name, w->name, works);
        return 0;
    }
    *heads = h;
    return 1;
}

/* Part pi of a fused group that is one value per part (NVFP4's global and
 * input scales: F32 [nparts], slot j part j's) or the weight's shape
 * (compressed-tensors' weight_shape: each part's load overwrites the fused
 * BasevLLMParameter, so it holds the last part read, safetensors' keys in
 * name order; the others are left out, and listed). */
static tps_err place_fused_whole(cstate *C, const tps_lfuse *f, const plinear *lin, size_t pi,
                                 const char *nm, size_t pl)
{
    tps_layout *L = C->L;
    const tps_qmethod *m = L->q->m;
    const tps_ckpt *ck = C->ck;
    const tps_qpart *p = &m->parts[pi];
    size_t last = SIZE_MAX;
    for (size_t j = 0; j < f->nparts; j++)
        if (lin[j].t[pi] != SIZE_MAX &&
            (last == SIZE_MAX || strcmp(ck->t[lin[j].t[pi]].name, ck->t[lin[last].t[pi]].name) > 0))
            last = j;
    const tps_ctensor *t0 = &ck->t[lin[last].t[pi]];
    char *name = tps_lc_own_name(C, tps_asprintf("%.*s.%s%s", (int)pl, nm, f->into, p->suffix));
    if (!name) return nomem(C);
    for (size_t j = 0; p->role == TPS_QR_SHAPE && j < f->nparts; j++) {
        if (j == last || lin[j].t[pi] == SIZE_MAX) continue;
        if (!L->dropped && !(L->dropped = tps_xcalloc(ck->n, sizeof *L->dropped))) return nomem(C);
        L->dropped[lin[j].t[pi]] =
            "the shape of one part of a fused module: vLLM 0.33 keeps one weight_shape for the "
            "fused module, the last part's (each part's load overwrites it)";
    }
    for (int r = 0; r < C->tp; r++) {
        uint64_t shape[1] = {p->per_tensor ? f->nparts : 2};
        tps_rtensor *rt;
        TPS_TRY(tps_lc_new_rt(C, name, r, t0->dtype, 1, shape, f->into, &rt));
        if (p->role == TPS_QR_SHAPE) {
            TPS_TRY(tps_lc_src_piece(C, rt, lin[last].t[pi], -1, 0, 0, 0));
            continue;
        }
        for (size_t j = 0; j < f->nparts; j++)
            TPS_TRY(tps_lc_src_piece(C, rt, lin[j].t[pi], -1, 0, 0, j * 4));
    }
    return TPS_OK;
}

/* Fused group f of parent (length pl of w's name): every part's tensors
 * under parent.<into><suffix>, the ranks' output features concatenated. */
static tps_err place_fused_packed(cstate *C, const tps_lfuse *f, const char *nm, size_t pl)
{
    const tps_quant *q = C->L->q;
    const tps_qmethod *m = q->m;
    const tps_ckpt *ck = C->ck;
    plinear lin[16];
    uint64_t heads[16];
    if (f->nparts > 16) return TPS_OK;
    for (size_t j = 0; j < f->nparts; j++) {
        char *wn = tps_asprintf("%.*s.%s%s", (int)pl, nm, f->parts[j].module, m->weight_suffix);
        int k = wn ? tps_ckpt_find(ck, wn) : -1;
        if (!wn) return nomem(C);
        if (k < 0 || q->role[k] != TPS_QR_WEIGHT) {
            refuse(C, "layout %s fuses %.*s.%s, but the checkpoint lacks the quantized '%s'",
                   C->L->spec->name, (int)pl, nm, f->into, wn);
            free(wn);
            return TPS_OK;
        }
        free(wn);
        linear_of(C, (size_t)k, &lin[j]);
        if (lin[j].in != lin[0].in) {
            refuse(C, "layout %s fuses '%s' and '%s', whose input features differ (%llu, %llu)",
                   C->L->spec->name, ck->t[lin[0].t[0]].name, ck->t[k].name,
                   (unsigned long long)lin[0].in, (unsigned long long)lin[j].in);
            return TPS_OK;
        }
        /* the MLP's intermediate features, padded (--pad-intermediate) */
        lin[j].pout = f->parts[j].rows && C->L->pad_field &&
                              !strcmp(f->parts[j].rows, C->L->pad_field)
                          ? padded(C, lin[j].out)
                          : lin[j].out;
        if (!fused_heads(C, f, j, &ck->t[k], lin[j].pout, &heads[j])) return TPS_OK;
    }
    for (size_t pi = 0; pi < m->nparts && pi < MAXP; pi++) {
        const tps_qpart *p = &m->parts[pi];
        if (p->role == TPS_QR_UNUSED) continue;
        size_t present = 0;
        for (size_t j = 0; j < f->nparts; j++) present += lin[j].t[pi] != SIZE_MAX;
        if (!present) continue;
        /* a shard directory lacks the parts' shapes its layout left out */
        if (present != f->nparts && !(p->role == TPS_QR_SHAPE && ck->dropped)) {
            refuse(C, "layout %s fuses %.*s.%s, but only some of its parts have '%s'",
                   C->L->spec->name, (int)pl, nm, f->into, p->suffix);
            return TPS_OK;
        }
        if (p->per_tensor || p->role == TPS_QR_SHAPE) {
            TPS_TRY(place_fused_whole(C, f, lin, pi, nm, pl));
            continue;
        }
        const tps_ctensor *t0 = &ck->t[lin[0].t[pi]];
        for (size_t j = 0; j < f->nparts; j++) {
            const tps_ctensor *t = &ck->t[lin[j].t[pi]];
            if (t->dtype != t0->dtype) {
                refuse(C, "layout %s fuses '%s' and '%s', which are of different dtypes",
                       C->L->spec->name, t0->name, t->name);
                return TPS_OK;
            }
            if (p->role == TPS_QR_SCALE && m->scales_model_dtype && !scale_dtype_ok(C, t))
                return TPS_OK;
        }
        uint64_t ou, iu;
        int oax, iax;
        part_units(q, p, t0, &ou, &iu, &oax, &iax);
        char *name = tps_lc_own_name(C, tps_asprintf("%.*s.%s%s", (int)pl, nm, f->into, p->suffix));
        if (!name) return nomem(C);
        size_t es = tps_dtype_bits(t0->dtype) / 8;
        for (int r = 0; r < C->tp; r++) {
            uint64_t lo[16], len[16], rl[16], total = 0;
            for (size_t j = 0; j < f->nparts; j++) {
                const tps_ctensor *t = &ck->t[lin[j].t[pi]];
                if (f->whole) {
                    lo[j] = 0;
                    len[j] = lin[j].out;
                } else {
                    tps_lc_part_rows(lin[j].pout, heads[j], f->parts[j].replicate, C->tp, r, 1,
                                     &lo[j], &len[j]);
                }
                uint64_t real = lin[j].out;
                rl[j] = lo[j] >= real ? 0 : lo[j] + len[j] <= real ? len[j] : real - lo[j];
                if (!on_units(lo[j], len[j], ou) || rl[j] % ou) {
                    refuse_units(C, t, "output", lin[j].pout, lo[j], len[j], ou, heads[j],
                                 f->parts[j].replicate, 0);
                    return TPS_OK;
                }
                total += len[j] / ou;
            }
            uint64_t shape[TPS_MAX_DIMS];
            tps_shape_get(shape, t0);
            shape[oax] = total;
            tps_rtensor *rt;
            TPS_TRY(tps_lc_new_rt(C, name, r, t0->dtype, t0->ndim, shape, f->into, &rt));
            uint64_t col = 0, rowb = tps_lc_inner_bits(t0, 0) / 8;
            for (size_t j = 0; j < f->nparts; j++) {
                size_t src = lin[j].t[pi];
                uint64_t a = lo[j] / ou, b = (lo[j] + rl[j]) / ou, pu = (len[j] - rl[j]) / ou;
                if (oax == 0) {
                    if (b > a || !pu) TPS_TRY(tps_lc_src_piece(C, rt, src, 0, a, b, col * rowb));
                    TPS_TRY(pad_piece(C, rt, p, pu * rowb, (col + b - a) * rowb, 0));
                } else if (b - a == total) {
                    TPS_TRY(tps_lc_src_piece(C, rt, src, 1, a, b, 0));
                } else {
                    if (b > a)
                        TPS_TRY(tps_lc_src_piece_run(C, rt, src, 1, a, b, col * es, (b - a) * es));
                    TPS_TRY(pad_piece(C, rt, p, t0->shape[0] * pu * es, (col + b - a) * es, pu * es));
                }
                col += b - a + pu;
            }
        }
    }
    for (size_t j = 0; j < f->nparts; j++)
        for (size_t pi = 0; pi < m->nparts && pi < MAXP; pi++)
            if (lin[j].t[pi] != SIZE_MAX) C->used[lin[j].t[pi]] = 1;
    char *parent = tps_xmalloc(pl + 1);
    if (!parent) return nomem(C);
    memcpy(parent, nm, pl);
    parent[pl] = 0;
    tps_err rc = tps_lc_place_extras(C, f, parent);
    free(parent);
    return rc;
}

tps_err tps_lc_compile_packed(cstate *C)
{
    tps_layout *L = C->L;
    const tps_quant *q = L->q;
    const tps_ckpt *ck = C->ck;
    const tps_lspec *s = L->spec;
    if (!q || !q->m->weight_suffix || !s) return TPS_OK;
    if (q->m->nparts > MAXP)
        return tps_fail(C->ctx, TPS_E_ARG, "quant_method %s: more parts than tpshard handles",
                        q->m->name);
    /* The tensors the method stores that no engine loads (g_idx). */
    for (size_t i = 0; i < ck->n; i++) {
        if (q->role[i] != TPS_QR_UNUSED) continue;
        const char *why = NULL;
        size_t stem;
        for (size_t j = 0; j < q->m->nparts && !why; j++)
            if (q->m->parts[j].role == TPS_QR_UNUSED && has_suffix(ck->t[i].name, q->m->parts[j].suffix, &stem))
                why = q->m->parts[j].why;
        if (!L->dropped && !(L->dropped = tps_xcalloc(ck->n, sizeof *L->dropped))) return nomem(C);
        L->dropped[i] = why ? why : "a tensor of the quantization method no engine loads";
        C->used[i] = 1;
    }
    for (size_t i = 0; i < ck->n && !C->why[0]; i++) {
        if (C->used[i] || q->role[i] != TPS_QR_WEIGHT || tps_lc_is_expert(C, ck->t[i].name))
            continue; /* experts: stacked by tps_lc_packed_experts */
        const char *nm = ck->t[i].name;
        size_t ml, which = 0, pl = 0;
        if (!tps_lc_module_of(nm, &ml)) continue;
        const tps_lfuse *f = NULL;
        for (size_t fi = 0; fi < s->nfuse && !f; fi++)
            if (tps_lfuse_applies(&s->fuse[fi], ck->config) &&
                fused_member(&s->fuse[fi], nm, ml, &which, &pl))
                f = &s->fuse[fi];
        if (f) {
            TPS_TRY(place_fused_packed(C, f, nm, pl));
            continue;
        }
        plinear lin;
        linear_of(C, i, &lin);
        /* the engine's parameter is the module's weight */
        char *wn = tps_asprintf("%.*sweight", (int)(lin.stem + 1), nm);
        if (!wn) return nomem(C);
        tps_split_kind sk = TPS_SPLIT_REPLICATE;
        const char *why = NULL;
        int ruled = tps_lc_spec_rule(L, wn, &sk, &why);
        int keyed = tps_lc_engine_key(C, wn) || tps_lc_matches_any(s->vocab, s->nvocab, wn);
        int vocab = tps_lc_matches_any(s->vocab, s->nvocab, wn);
        free(wn);
        if (ruled && sk == TPS_SPLIT_REFUSE) {
            refuse(C, "tensor '%s': %s (layout %s)", nm, why, s->name);
            break;
        }
        if (!keyed) {
            refuse(C, "tensor '%s': %s's model has no such quantized linear (layout %s writes "
                      "exactly the engine's keys)",
                   nm, s->target, s->name);
            break;
        }
        if (vocab) {
            refuse(C, "tensor '%s': a quantized vocabulary (embedding or head): not supported "
                      "(layout %s pads and splits it by rows)",
                   nm, s->name);
            break;
        }
        int how = 0;
        if (ruled) {
            how = sk == TPS_SPLIT_ROWS ? 1 : sk == TPS_SPLIT_COLUMNS ? 2 : 0;
        } else {
            tps_style st = L->p[i].style;
            how = st == TPS_STYLE_COLWISE ? 1 : st == TPS_STYLE_ROWWISE ? 2 : 0;
            if (st == TPS_STYLE_EMBED_ROWWISE || st == TPS_STYLE_EMBED_COLWISE) {
                refuse(C, "tensor '%s': a quantized embedding: not supported", nm);
                break;
            }
        }
        TPS_TRY(place_linear(C, &lin, how, L->p[i].rule));
        for (size_t j = 0; j < q->m->nparts && j < MAXP; j++)
            if (lin.t[j] != SIZE_MAX) C->used[lin.t[j]] = 1;
    }
    return TPS_OK;
}

/* ------------------------------------------------------------------ experts */

/* The engine's name of stack st's part p: "w13_weight" with the method's
 * suffix for "weight" (w13_qweight, w13_weight_packed, w13_scales,
 * w2_weight_scale_2, w13_input_scale). */
static char *stack_part_name(cstate *C, const tps_lexperts *x, const char *module,
                             const tps_lstack *st, const tps_qpart *p)
{
    const char *us = strchr(st->name, '_');
    int pre = us ? (int)(us - st->name) : (int)strlen(st->name);
    return tps_lc_own_name(C, x->into ? tps_asprintf("%s.%s.%.*s_%s", module, x->into, pre,
                                                      st->name, p->suffix + 1)
                                      : tps_asprintf("%s.%.*s_%s", module, pre, st->name,
                                                     p->suffix + 1));
}

/* Why each expert's weight_shape is not given back (vLLM keeps [E, 2] in
 * the model's dtype, rebuilt from them). */
static const char *const shape_left_out =
    "an expert's weight_shape: vLLM 0.33's MoE holds the experts' shapes as one [E, 2] tensor "
    "in the model's dtype (w13_weight_shape, w2_weight_shape), the last part's [out, in] per "
    "expert, written as such";

tps_err tps_lc_packed_experts(cstate *C, const tps_lexperts *x, const char *module, uint64_t E)
{
    tps_layout *L = C->L;
    const tps_quant *q = L->q;
    const tps_qmethod *m = q->m;
    const tps_ckpt *ck = C->ck;
    uint64_t tp = (uint64_t)C->tp;
    if (L->ep && E % tp) {
        char works[300];
        tps_lc_works_list(works, sizeof works, E, 0, tps_lc_ok_divides);
        refuse(C, "%s = %llu is not divisible by the EP size %d (tp values that work: %s)",
               x->count, (unsigned long long)E, C->tp, works);
        return TPS_OK;
    }
    if (!L->ep && tp > E) {
        refuse(C, "%s = %llu < tp %d: the engine refuses more ranks than experts", x->count,
               (unsigned long long)E, C->tp);
        return TPS_OK;
    }
    for (size_t pi = 0; L->ep && pi < m->nparts; pi++)
        if (m->parts[pi].role == TPS_QR_INPUT_SCALE && m->parts[pi].per_tensor) {
            refuse(C, "--ep with %s experts: vLLM 0.33's ModelOptNvFp4FusedMoE sizes the experts' "
                      "input scales by the local or the global expert count depending on the GPU "
                      "backend (use_global_sf), which the files cannot know; split without --ep",
                   m->name);
            return TPS_OK;
        }
    size_t nidx = 0;
    for (size_t s = 0; s < x->nstacks; s++) nidx += x->stacks[s].nparts;
    plinear *lin = tps_xcalloc((size_t)E * nidx, sizeof *lin);
    if (!lin) return nomem(C);
    tps_err rc = TPS_OK;
    uint64_t I = 0, H = 0;
    /* every expert's linears, of one shape: rows stacks [I out, H in], columns [H out, I in] */
    for (uint64_t e = 0; e < E && !C->why[0]; e++) {
        size_t k = 0;
        for (size_t s = 0; s < x->nstacks && !C->why[0]; s++)
            for (size_t j = 0; j < x->stacks[s].nparts && !C->why[0]; j++, k++) {
                char *wn = tps_asprintf("%s.%llu.%s%s", module, (unsigned long long)e,
                                        x->stacks[s].parts[j], m->weight_suffix);
                int w = wn ? tps_ckpt_find(ck, wn) : -1;
                if (!wn) {
                    rc = nomem(C);
                    goto out;
                }
                if (w < 0 || q->role[w] != TPS_QR_WEIGHT) {
                    refuse(C, "config.json says %s = %llu, but the checkpoint lacks the "
                              "quantized '%s'", x->count, (unsigned long long)E, wn);
                    free(wn);
                    goto out;
                }
                free(wn);
                plinear *pl = &lin[e * nidx + k];
                linear_of(C, (size_t)w, pl);
                uint64_t i_ = x->stacks[s].dim ? pl->in : pl->out, h_ = x->stacks[s].dim ? pl->out : pl->in;
                if (!I) {
                    I = i_;
                    H = h_;
                }
                if (i_ != I || h_ != H) {
                    refuse(C, "expert tensor '%s' holds %llu x %llu features, not the other "
                              "experts' (intermediate %llu, hidden %llu): layout %s stacks "
                              "experts of one shape",
                           ck->t[w].name, (unsigned long long)pl->out, (unsigned long long)pl->in,
                           (unsigned long long)I, (unsigned long long)H, L->spec->name);
                    goto out;
                }
            }
    }
    int present;
    uint64_t want = x->rows ? tps_lc_config_count(ck->config, x->rows, &present) : I;
    if (x->rows && present && want != I) {
        refuse(C, "%s = %llu in config.json, but the experts of '%s' have %llu", x->rows,
               (unsigned long long)want, module, (unsigned long long)I);
        goto out;
    }
    uint64_t Ireal = I;
    C->in_experts = 1;
    if (L->pad_mode && !L->ep) {
        /* --pad-intermediate: the experts' rows padded too (vLLM #49949: Nemotron's
         * 1856 at tp 8 cuts a 16-group) */
        TPS_CHECK(tps_lc_expert_pad(C, x, I, pad_unit(q), "groups and words", &I));
        if (C->why[0]) goto out;
    }
    if (!L->ep && I % tp) {
        char works[300];
        tps_lc_works_list(works, sizeof works, I, 0, tps_lc_ok_divides);
        refuse(C, "%s = %llu is not divisible by tp %d (tp values that work: %s; or split with "
                  "--ep)", x->rows ? x->rows : "the expert intermediate size",
               (unsigned long long)I, C->tp, works);
        goto out;
    }
    uint64_t Er = L->ep ? E / tp : E, Ir = L->ep ? I : I / tp;
    tps_dtype md = tps_lc_serving_dtype(ck->config);
    for (int r = 0; r < C->tp && !C->why[0]; r++) {
        uint64_t e0 = L->ep ? (uint64_t)r * Er : 0, lo = L->ep ? 0 : (uint64_t)r * Ir;
        size_t k0 = 0;
        for (size_t s = 0; s < x->nstacks && !C->why[0]; s++) {
            const tps_lstack *st = &x->stacks[s];
            int cols = st->dim == 1; /* the stack cuts input features (down_proj) */
            for (size_t pi = 0; pi < m->nparts && !C->why[0]; pi++) {
                const tps_qpart *p = &m->parts[pi];
                if (p->role == TPS_QR_UNUSED) continue;
                const plinear *l0 = &lin[e0 * nidx + k0];
                if (l0->t[pi] == SIZE_MAX) continue;
                const tps_ctensor *t0 = &ck->t[l0->t[pi]];
                char *name = stack_part_name(C, x, module, st, p);
                if (!name) {
                    rc = nomem(C);
                    goto out;
                }
                tps_rtensor *rt;
                if (p->role == TPS_QR_SHAPE) {
                    /* [E, 2] in the model's dtype: each expert's last part's [out, in] */
                    uint64_t sh[2] = {Er, 2};
                    TPS_CHECK(tps_lc_new_rt(C, name, r, md, 2, sh, "experts", &rt));
                    size_t es = tps_dtype_bits(md) / 8;
                    uint64_t o = cols ? H : I, in = cols ? I : H;
                    for (uint64_t k = 0; k < Er; k++) {
                        TPS_CHECK(tps_lc_add_piece(C, rt, (tps_lpiece){.kind = TPS_PK_CONST,
                                                   .at = k * 2 * es, .nbytes = es, .value = (double)o}));
                        TPS_CHECK(tps_lc_add_piece(C, rt, (tps_lpiece){.kind = TPS_PK_CONST,
                                                   .at = (k * 2 + 1) * es, .nbytes = es,
                                                   .value = (double)in}));
                    }
                    continue;
                }
                if (p->per_tensor) {
                    /* [E, nparts] (w13) or [E] (w2) F32 */
                    uint64_t sh[2] = {Er, st->nparts};
                    TPS_CHECK(tps_lc_new_rt(C, name, r, TPS_F32, st->nparts > 1 ? 2 : 1, sh,
                                            "experts", &rt));
                    for (uint64_t k = 0; k < Er; k++)
                        for (size_t j = 0; j < st->nparts; j++)
                            TPS_CHECK(tps_lc_src_piece(C, rt, lin[(e0 + k) * nidx + k0 + j].t[pi], -1,
                                                       0, 0, (k * st->nparts + j) * 4));
                    continue;
                }
                uint64_t ou, iu;
                int oax, iax;
                part_units(q, p, t0, &ou, &iu, &oax, &iax);
                uint64_t u = cols ? iu : ou;
                int ax = cols ? iax : oax, whole = L->ep || (cols && iu == 0);
                if (cols && iu == 0 && tp > 1 && !L->ep && m->channel_rowwise_refusal) {
                    refuse(C, "tensor '%s': experts with quantization_config.group_size -1: %s",
                           t0->name, m->channel_rowwise_refusal);
                    goto out;
                }
                uint64_t rl = whole ? 0 : lo >= Ireal ? 0 : lo + Ir <= Ireal ? Ir : Ireal - lo;
                if (!whole && (!on_units(lo, Ir, u) || rl % u)) {
                    refuse_units(C, t0, cols ? "input" : "output", I, lo, Ir, u, 0, 0,
                                 cols && p->in_by == 1);
                    goto out;
                }
                /* one expert's part j on this rank: [a, b) along ax of its tensor */
                uint64_t a = whole ? 0 : lo / u, b = whole ? t0->shape[ax] : (lo + Ir) / u;
                uint64_t sh3[3] = {Er, t0->shape[0], t0->shape[1]};
                sh3[1 + ax] = (b - a) * (cols ? 1 : st->nparts);
                TPS_CHECK(tps_lc_new_rt(C, name, r, t0->dtype, 3, sh3, "experts", &rt));
                size_t es = tps_dtype_bits(t0->dtype) / 8;
                uint64_t per_e = sh3[1] * sh3[2] * es;
                for (uint64_t k = 0; k < Er; k++)
                    for (size_t j = 0; j < st->nparts; j++) {
                        const plinear *pl = &lin[(e0 + k) * nidx + k0 + j];
                        size_t src = pl->t[pi];
                        if (src == SIZE_MAX || ck->t[src].dtype != t0->dtype ||
                            ck->t[src].shape[0] != t0->shape[0] || ck->t[src].shape[1] != t0->shape[1]) {
                            refuse(C, "expert tensor '%s' does not match '%s' in dtype or "
                                      "shape: layout %s stacks experts of one shape",
                                   src == SIZE_MAX ? m->parts[pi].suffix : ck->t[src].name,
                                   t0->name, L->spec->name);
                            goto out;
                        }
                        int d = whole ? -1 : ax;
                        uint64_t rb = whole ? b : a + rl / u, pu = whole ? 0 : b - rb;
                        if (pu) {
                            /* --pad-intermediate: the real features, then the pad's */
                            uint64_t rowb = tps_lc_inner_bits(&ck->t[src], 0) / 8;
                            if (ax == 0) {
                                uint64_t at = k * per_e + j * (b - a) * rowb;
                                if (rb > a) TPS_CHECK(tps_lc_src_piece(C, rt, src, 0, a, rb, at));
                                TPS_CHECK(pad_piece(C, rt, p, pu * rowb, at + (rb - a) * rowb, 0));
                            } else {
                                uint64_t at = k * per_e + (st->nparts > 1 ? j * (b - a) * es : 0);
                                if (rb > a)
                                    TPS_CHECK(tps_lc_src_piece_run(C, rt, src, 1, a, rb, at,
                                                                   (rb - a) * es));
                                TPS_CHECK(pad_piece(C, rt, p, t0->shape[0] * pu * es,
                                                    at + (rb - a) * es, pu * es));
                            }
                        } else if (ax == 0 || st->nparts == 1) {
                            /* rows (or the only part): one run at its place */
                            uint64_t rowb = tps_lc_inner_bits(&ck->t[src], 0) / 8;
                            uint64_t at = k * per_e + (ax == 0 ? j * (b - a) * rowb : 0);
                            TPS_CHECK(tps_lc_src_piece(C, rt, src, d, a, b, at));
                        } else {
                            /* the parts side by side along the last dim: strided */
                            TPS_CHECK(tps_lc_src_piece_run(C, rt, src, d, a, b,
                                                           k * per_e + j * (b - a) * es,
                                                           (b - a) * es));
                        }
                    }
            }
            if (m->weight_suffix && !strcmp(m->name, "gptq")) {
                /* AutoGPTQMoEMethod creates w13_bias [E, 2 I_p] and w2_bias [E, H],
                 * zeros, whether the checkpoint has biases or not */
                char *bn = tps_lc_own_name(C, x->into ? tps_asprintf("%s.%s.%.*s_bias", module, x->into,
                                                                    (int)strcspn(st->name, "_"), st->name)
                                                      : tps_asprintf("%s.%.*s_bias", module,
                                                                     (int)strcspn(st->name, "_"), st->name));
                if (!bn) {
                    rc = nomem(C);
                    goto out;
                }
                uint64_t sh[2] = {Er, cols ? H : st->nparts * Ir};
                tps_rtensor *rt;
                TPS_CHECK(tps_lc_new_rt(C, bn, r, md, 2, sh, "experts", &rt));
                TPS_CHECK(tps_lc_add_piece(C, rt, (tps_lpiece){.kind = TPS_PK_ZERO, .at = 0,
                                                               .nbytes = rt->nbytes}));
            }
            k0 += st->nparts;
        }
    }
    /* every expert tensor is placed (or, for weight_shape, rebuilt and listed) */
    for (uint64_t e = 0; e < E; e++)
        for (size_t k = 0; k < nidx; k++)
            for (size_t pi = 0; pi < m->nparts; pi++) {
                size_t t = lin[e * nidx + k].t[pi];
                if (t == SIZE_MAX) continue;
                C->used[t] = 1;
                if (m->parts[pi].role == TPS_QR_SHAPE) {
                    if (!L->dropped && !(L->dropped = tps_xcalloc(ck->n, sizeof *L->dropped))) {
                        rc = nomem(C);
                        goto out;
                    }
                    L->dropped[t] = shape_left_out;
                }
            }
out:
    C->in_experts = 0;
    free(lin);
    return rc;
}
