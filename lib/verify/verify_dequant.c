/* verify_dequant.c - packed methods' numbers (GPTQ, AWQ, compressed-tensors
 * WNA16, NVFP4): every rank's piece of a quantized linear, read with the
 * rank's own pieces of its scales and zero points and dequantized as the
 * engine reads them (groups counted from the rank's first input feature,
 * zero points and scales by the rank's own columns), times seeded inputs,
 * against the source's same features dequantized with the source's scales.
 * A scale, zero point or code block on the wrong rows or columns of a rank
 * makes the products differ, even where every piece's bytes are the source's
 * bytes its manifest entry names.
 *
 *   GPTQ   w = (q - 2^(bits-1)) s           uint4b8 / uint8b128, symmetric:
 *                                           vLLM ignores the stored zeros
 *   AWQ    w = (q - z) s                    nibbles in AutoAWQ's order
 *   WNA16  w = (q - 2^(bits-1)) s, or (q - z) s with zero points
 *   NVFP4  w = e2m1(q) e4m3(s) g            g: weight_scale_2 (ModelOpt), or
 *                                           1 / weight_global_scale
 *
 * Each is its method's table entry (lib/quant/): its dequant kernel, the
 * order of codes in a word, whether stored zero points are read, how the
 * global scale applies; this file only walks the words and groups.
 *
 * Inputs are streamed in blocks of storage rows, so memory stays a few MiB
 * whatever the layer. Both sides add the same products in the same order,
 * in double: the comparison is exact (but for 1e-12 of the magnitudes). */
#include "verify_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NX 2              /* seeded input vectors */
#define BLOCK (4u << 20)  /* bytes of f32 weights dequantized at a time */

/* One side of a comparison: a tensor of ck, whole (piece -1) or one piece. */
typedef struct {
    tps_ckpt *ck;
    size_t t;
    int piece;
    uint64_t rows, cols; /* its shape, as held (a piece's local shape) */
} view;

typedef struct {
    const tps_quant *q;
    view w, s, z, g;      /* codes, scales, zero points (t SIZE_MAX: none), global scale */
    int has_z, has_g;
    uint64_t in, out;     /* features the views hold */
    uint64_t in0;         /* the global input feature of the first (for x) */
} qlin;

static tps_err view_rows(tps_ctx *ctx, const view *v, uint64_t r0, uint64_t r1, void *buf)
{
    const tps_ctensor *t = &v->ck->t[v->t];
    size_t es = tps_dtype_bits(t->dtype) / 8;
    uint64_t rowb = v->cols * es;
    if (v->piece < 0) return tps_ckpt_read(ctx, v->ck, v->t, r0 * rowb, buf, (size_t)((r1 - r0) * rowb));
    return tps_ckpt_read_piece(ctx, v->ck, v->t, v->piece, r0 * rowb, buf, (size_t)((r1 - r0) * rowb));
}

/* Where a packed method's codes run: along the input features (GPTQ's
 * qweight rows, compressed-tensors' columns) or the output (AWQ), from its
 * weight part in the method's table. */
static int packs_output(const tps_qmethod *m)
{
    for (size_t j = 0; j < m->nparts; j++)
        if (m->parts[j].role == TPS_QR_WEIGHT) return m->parts[j].out_packed;
    return 0;
}

/* Code k of a word: its bits in the method's order. */
static unsigned code_of(const tps_qmethod *m, uint64_t word, uint64_t k, int bits, uint64_t mask)
{
    int at = m->code_order ? m->code_order[k] : (int)k;
    return (unsigned)((word >> (bits * at)) & mask);
}

/* f32 of n values of dtype d. */
static tps_err to_f32(tps_ctx *ctx, const tps_ctensor *t, const void *src, float *dst, size_t n)
{
    if (tps_vk_to_f32(t->dtype, src, dst, n))
        return tps_fail(ctx, TPS_E_ARG, "verify: tensor '%s': %s has no f32 conversion", t->name,
                        tps_dtype_name(t->dtype));
    return TPS_OK;
}

/* y[NX][o - o_lo] += x[NX][in0 + i] * W[o][i] over the window [i_lo, i_hi)
 * x [o_lo, o_hi) of the linear's features, the weights dequantized a block
 * of storage rows at a time; mag takes the sums of |x w|. */
static tps_err product(tps_ctx *ctx, const qlin *L, const float *x, uint64_t xin, uint64_t i_lo,
                       uint64_t i_hi, uint64_t o_lo, uint64_t o_hi, double *y, double *mag)
{
    uint64_t yw = o_hi - o_lo;
    const tps_quant *q = L->q;
    const tps_qmethod *m = q->m;
    int tr = m->transposed, bits = q->bits;
    const tps_ctensor *wt = &L->w.ck->t[L->w.t];
    uint64_t pf = (uint64_t)tps_dtype_bits(wt->dtype) / (uint64_t)bits;
    uint64_t zpf = 32u / (unsigned)bits, mask = (1u << bits) - 1;
    int awq = packs_output(m); /* codes along the output: AWQ */
    /* features a storage row holds along its dim, and the rows a block takes */
    uint64_t frow = tr ? (awq ? 1 : pf) : 1;
    uint64_t width = tr ? L->out : L->in;
    uint64_t wf = width * frow, per = BLOCK / 4 / (wf ? wf : 1);
    if (!per) per = 1;
    size_t ws = tps_dtype_bits(wt->dtype) / 8;
    const tps_ctensor *st = &L->s.ck->t[L->s.t];
    unsigned char *wb = tps_xmalloc((size_t)(per * L->w.cols * ws) + 1);
    float *sb = tps_xmalloc((size_t)(L->s.rows * L->s.cols) * sizeof(float) + 1);
    unsigned char *sraw = tps_xmalloc((size_t)(L->s.rows * L->s.cols * (tps_dtype_bits(st->dtype) / 8)) + 1);
    uint32_t *zb = NULL;
    float gsc = 1;
    tps_err rc = wb && sb && sraw ? TPS_OK : tps_fail(ctx, TPS_E_NOMEM, "verify: out of memory");
    /* the scales whole: [groups, out] or [out, groups], small beside the codes */
    if (!rc) rc = view_rows(ctx, &L->s, 0, L->s.rows, sraw);
    if (!rc) rc = to_f32(ctx, st, sraw, sb, (size_t)(L->s.rows * L->s.cols));
    if (!rc && L->has_z) {
        zb = tps_xmalloc((size_t)(L->z.rows * L->z.cols) * 4 + 1);
        rc = zb ? view_rows(ctx, &L->z, 0, L->z.rows, zb) : tps_fail(ctx, TPS_E_NOMEM, "verify: out of memory");
    }
    if (!rc && L->has_g) {
        float g;
        rc = view_rows(ctx, &L->g, 0, 1, &g);
        gsc = m->global_scale ? m->global_scale(g) : g;
    }
    uint64_t group = q->group < 0 ? (tr ? L->in : L->in) : (uint64_t)q->group;
    /* the storage rows and columns the window needs */
    uint64_t ra, rb, ca, cb;
    if (tr) {
        ra = i_lo / frow;
        rb = (i_hi + frow - 1) / frow;
        uint64_t cpf = awq ? pf : 1;
        ca = o_lo / cpf;
        cb = (o_hi + cpf - 1) / cpf;
    } else {
        ra = o_lo;
        rb = o_hi;
        ca = i_lo / pf;
        cb = (i_hi + pf - 1) / pf;
    }
    if (rb > L->w.rows) rb = L->w.rows;
    if (cb > L->w.cols) cb = L->w.cols;
    for (uint64_t r0 = ra; !rc && r0 < rb; r0 += per) {
        uint64_t r1 = r0 + per < rb ? r0 + per : rb;
        rc = view_rows(ctx, &L->w, r0, r1, wb);
        for (uint64_t r = r0; !rc && r < r1; r++) {
            const unsigned char *row = wb + (r - r0) * L->w.cols * ws;
            for (uint64_t c = ca; c < cb; c++) {
                uint64_t word = 0;
                memcpy(&word, row + c * ws, ws);
                for (uint64_t k = 0; k < pf; k++) {
                    /* which (input, output) feature code k of this word is */
                    uint64_t i, o;
                    unsigned code;
                    if (tr && !awq) { /* GPTQ: packed along the input */
                        i = r * pf + k;
                        o = c;
                    } else if (tr) { /* AWQ: packed along the output */
                        i = r;
                        o = c * pf + k;
                    } else { /* [out, in], packed along the input */
                        i = c * pf + k;
                        o = r;
                    }
                    code = code_of(m, word, k, bits, mask);
                    if (i < i_lo || i >= i_hi || o < o_lo || o >= o_hi) continue;
                    uint64_t gi = i / group;
                    float s = tr ? sb[(L->s.rows == 1 ? 0 : gi) * L->s.cols + o]
                                 : sb[o * L->s.cols + (L->s.cols == 1 ? 0 : gi)];
                    double zero = (double)(1u << (bits - 1));
                    if (L->has_z) {
                        uint32_t zw;
                        if (tr) /* qzeros [groups, out / pf] */
                            zw = zb[(L->z.rows == 1 ? 0 : gi) * L->z.cols + o / zpf];
                        else /* [out / pf, groups] */
                            zw = zb[(o / zpf) * L->z.cols + (L->z.cols == 1 ? 0 : gi)];
                        zero = code_of(m, zw, o % zpf, bits, mask);
                    }
                    /* the method's own kernel, from its table entry */
                    float w = m->dequant(q, code, zero, s, gsc);
                    for (int v = 0; v < NX; v++) {
                        double xv = x[v * xin + L->in0 + i];
                        y[v * yw + o - o_lo] += xv * w;
                        mag[v * yw + o - o_lo] += fabs(xv * w);
                    }
                }
            }
        }
    }
    free(wb);
    free(sb);
    free(sraw);
    free(zb);
    return rc;
}

/* The view of tensor t: the piece of rank r (pieces, then replicas), or
 * whole; -1 piece and 0 when the rank holds none. */
static int rank_view(tps_ckpt *ck, size_t t, int r, view *v)
{
    const tps_ctensor *ct = &ck->t[t];
    v->ck = ck;
    v->t = t;
    v->piece = -1;
    for (int p = 0; p < ct->npieces + ct->nreplicas && v->piece < 0; p++) {
        const tps_piece *pc = p < ct->npieces ? &ct->pieces[p] : &ct->replicas[p - ct->npieces];
        if (pc->rank == r) v->piece = p;
    }
    if (v->piece < 0) return 0;
    const tps_piece *pc = v->piece < ct->npieces ? &ct->pieces[v->piece]
                                                 : &ct->replicas[v->piece - ct->npieces];
    v->rows = ct->ndim ? ct->shape[0] : 1;
    v->cols = ct->ndim > 1 ? ct->shape[1] : 1;
    if (ct->dim == 0) v->rows = pc->hi - pc->lo;
    if (ct->dim == 1) v->cols = pc->hi - pc->lo;
    return 1;
}

static void whole_view(tps_ckpt *ck, size_t t, view *v)
{
    const tps_ctensor *ct = &ck->t[t];
    v->ck = ck;
    v->t = t;
    v->piece = -1;
    v->rows = ct->ndim ? ct->shape[0] : 1;
    v->cols = ct->ndim > 1 ? ct->shape[1] : 1;
}

static int find_part(const tps_quant *q, const tps_ckpt *ck, const char *wname, tps_qrole role,
                     int per_tensor)
{
    const tps_qmethod *m = q->m;
    size_t wl = strlen(wname), sl = strlen(m->weight_suffix);
    for (size_t j = 0; j < m->nparts; j++) {
        const tps_qpart *p = &m->parts[j];
        if (p->role != role || p->per_tensor != per_tensor) continue;
        char *n = tps_asprintf("%.*s%s", (int)(wl - sl), wname, p->suffix);
        int k = n ? tps_ckpt_find(ck, n) : -1;
        free(n);
        if (k >= 0) return k;
    }
    return -1;
}

/* Features a view of a packed part holds along its in and out dims. */
static void view_features(const tps_quant *q, const view *w, uint64_t *in, uint64_t *out)
{
    const tps_qmethod *m = q->m;
    const tps_ctensor *t = &w->ck->t[w->t];
    uint64_t pf = (uint64_t)tps_dtype_bits(t->dtype) / (uint64_t)q->bits;
    int awq = packs_output(m);
    if (m->transposed) {
        *in = w->rows * (awq ? 1 : pf);
        *out = w->cols * (awq ? pf : 1);
    } else {
        *in = w->cols * pf;
        *out = w->rows;
    }
}

tps_err tps_vd_check(vctx *V)
{
    tps_ctx *ctx = V->ctx;
    const tps_quant *q = V->q;
    if (!V->src || !q || !q->m->weight_suffix || !q->m->dequant) return TPS_OK;
    tps_err rc = TPS_OK;
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; !rc && i < V->ck->n; i++) {
        if (q->role[i] != TPS_QR_WEIGHT || q->partner[i] < 0) continue;
        const char *wn = V->ck->t[i].name;
        int sw = tps_ckpt_find(V->src, wn), ss = -1, sz = -1, sg = -1;
        int ks = q->partner[i], kz = q->zeros[i];
        int kg = find_part(q, V->ck, wn, TPS_QR_SCALE, 1);
        if (sw < 0) continue; /* the source check says so */
        ss = tps_ckpt_find(V->src, V->ck->t[ks].name);
        if (kz >= 0) sz = tps_ckpt_find(V->src, V->ck->t[kz].name);
        if (kg >= 0) sg = tps_ckpt_find(V->src, V->ck->t[kg].name);
        if (ss < 0 || (kz >= 0 && sz < 0) || (kg >= 0 && sg < 0)) continue;
        /* seeded inputs over the whole linear */
        qlin S = {.q = q, .has_z = kz >= 0 && !q->m->zeros_ignored, .has_g = kg >= 0};
        whole_view(V->src, (size_t)sw, &S.w);
        whole_view(V->src, (size_t)ss, &S.s);
        if (S.has_z) whole_view(V->src, (size_t)sz, &S.z);
        if (S.has_g) whole_view(V->src, (size_t)sg, &S.g);
        view_features(q, &S.w, &S.in, &S.out);
        float *x = tps_xmalloc((size_t)(NX * S.in) * sizeof *x + 1);
        if (!x) return tps_fail(ctx, TPS_E_NOMEM, "verify: out of memory");
        for (uint64_t k = 0; k < NX * S.in; k++) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            x[k] = (float)((double)(seed >> 11) / 9007199254740992.0 * 2 - 1);
        }
        const tps_ctensor *ct = &V->ck->t[i];
        uint64_t wrong = 0, total = 0;
        double worst = 0;
        char *note = NULL;
        for (int r = 0; !rc && r < V->tp; r++) {
            if (V->local && !V->local[r]) continue;
            qlin R = {.q = q, .has_z = S.has_z, .has_g = S.has_g};
            if (!rank_view(V->ck, i, r, &R.w) || !rank_view(V->ck, (size_t)ks, r, &R.s) ||
                (R.has_z && !rank_view(V->ck, (size_t)kz, r, &R.z)) ||
                (R.has_g && !rank_view(V->ck, (size_t)kg, r, &R.g)))
                continue;
            view_features(q, &R.w, &R.in, &R.out);
            /* where the rank's features lie: its piece's place along the cut dim */
            const tps_piece *pc = R.w.piece < ct->npieces ? &ct->pieces[R.w.piece]
                                                          : &ct->replicas[R.w.piece - ct->npieces];
            int in_axis = q->m->transposed ? 0 : 1, cut_in = ct->dim == in_axis;
            uint64_t f0 = 0;
            if (ct->dim >= 0) {
                uint64_t dimlen = ct->dim == 0 ? R.w.rows : R.w.cols;
                f0 = pc->lo * ((cut_in ? R.in : R.out) / (dimlen ? dimlen : 1));
            }
            R.in0 = cut_in ? f0 : 0;
            uint64_t i_lo = cut_in ? f0 : 0, i_hi = cut_in ? f0 + R.in : S.in;
            uint64_t o_lo = cut_in ? 0 : f0, o_hi = cut_in ? S.out : f0 + R.out;
            double *yr = tps_xcalloc((size_t)(NX * R.out) + 1, sizeof *yr);
            double *mr = tps_xcalloc((size_t)(NX * R.out) + 1, sizeof *mr);
            double *ys = tps_xcalloc((size_t)(NX * (o_hi - o_lo)) + 1, sizeof *ys);
            double *ms = tps_xcalloc((size_t)(NX * (o_hi - o_lo)) + 1, sizeof *ms);
            if (!yr || !mr || !ys || !ms) rc = tps_fail(ctx, TPS_E_NOMEM, "verify: out of memory");
            /* the rank's own features, its groups counted from its first input */
            if (!rc) rc = product(ctx, &R, x, S.in, 0, R.in, 0, R.out, yr, mr);
            /* the source's same features, with its own scales */
            if (!rc) rc = product(ctx, &S, x, S.in, i_lo, i_hi, o_lo, o_hi, ys, ms);
            for (int v = 0; !rc && v < NX; v++)
                for (uint64_t o = 0; o < R.out; o++) {
                    double a = yr[v * R.out + o], b = ys[v * (o_hi - o_lo) + o];
                    /* both sides add the same products in the same order (inputs
                     * ascending, in double): equal unless a value differs */
                    double tol = 1e-12 * (mr[v * R.out + o] + ms[v * (o_hi - o_lo) + o]);
                    double err = fabs(a - b);
                    if (err > worst) worst = err;
                    total++;
                    if (!(err <= tol)) wrong++;
                }
            free(yr);
            free(mr);
            free(ys);
            free(ms);
        }
        free(x);
        if (!rc && total) {
            if (wrong)
                note = tps_asprintf("the ranks' codes, dequantized with their own scales%s, do "
                                    "not give the source's products",
                                    S.has_z ? " and zero points" : "");
            if (tps_va_rep_add(V->R, wn, "dequant", worst, 0, wrong, total, wrong == 0, note))
                return tps_fail(ctx, TPS_E_NOMEM, "verify: out of memory");
        } else {
            free(note);
        }
    }
    return rc;
}
