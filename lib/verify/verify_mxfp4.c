/* verify_mxfp4.c - gpt-oss's MXFP4 experts in a serving layout, their
 * numbers: every rank's expert tensors as the engine reads them (w13_weight
 * with the w13_weight_scale and w13_bias rows beside it, w2_weight with
 * w2_weight_scale and w2_bias), dequantized through the method's kernel
 * (lib/quant/mxfp4.c: e2m1(code) x 2^(e - 127)) and multiplied by seeded
 * inputs, against the source's experts dequantized the same way:
 *
 *   gate/up (column-parallel): a rank's row j of expert e plus its bias
 *     equals the source's row 2 f0 + j plus its bias (f0: the rank's first
 *     intermediate feature), and a row of the zero tail gives exactly 0;
 *   down (row-parallel): the ranks' products over their own features, each
 *     plus its own bias (the real one on rank 0, zeros elsewhere), add up to
 *     the source's; the zero tail's columns are multiplied by inputs of
 *     their own, so that a code there would show.
 *
 * A scale or a bias beside the wrong rows, a tail that is not zero, or a
 * bias held on two ranks makes the products differ, even where every
 * piece's bytes are the source's bytes its manifest entry names. Both sides
 * add the same products in the same order, in double (the down sums but
 * for the additions across ranks): the comparison is to 1e-12 of the
 * magnitudes. Rows are read a block at a time. */
#include "verify_int.h"

#include <fnmatch.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NX 2             /* seeded input vectors */
#define BLOCK (4u << 20) /* bytes of codes read at a time */
#define MXB 32           /* codes a scale */

/* A rank tensor's bytes: where they lie in its rank's files. */
typedef struct {
    int file;
    uint64_t off, nbytes;
} held;

static int find_held(const tps_ckpt *ck, int r, const char *name, held *h)
{
    for (size_t f = 0; name && f < ck->nfiles; f++) {
        if (ck->files[f].rank != r || !ck->files[f].byname) continue;
        const tps_st_tensor_info *si = tps_cfile_find(&ck->files[f], name);
        if (!si) continue;
        *h = (held){.file = (int)f, .off = ck->files[f].st->data_start + si->begin,
                    .nbytes = tps_st_info_nbytes(si)};
        return 1;
    }
    return 0;
}

static tps_err read_held(tps_ctx *ctx, const tps_ckpt *ck, const held *h, uint64_t off, void *buf,
                         size_t len)
{
    const tps_cfile *f = &ck->files[h->file];
    return tps_pread_full(ctx, f->fd, f->path, buf, len, h->off + off);
}

/* One projection's tensors on each side: codes, scales and bias. */
typedef struct {
    int w, s, b;        /* source (V->src) indices */
    int cw, cs, cb;     /* the directory's (V->ck) */
    const char *hw, *hs, *hb; /* the rank tensors holding them */
} proj;

/* The rank tensor holding tensor i's pieces (the same name on every rank). */
static const char *holder_of(const tps_ckpt *ck, int i)
{
    const tps_ctensor *t = &ck->t[i];
    return t->npieces ? t->pieces[0].holder : t->nreplicas ? t->replicas[0].holder : NULL;
}

/* Rank r's features of tensor i along its cut dim ([lo, hi) of its piece), or 0. */
static int rank_cut(const tps_ckpt *ck, int i, int r, uint64_t *lo, uint64_t *hi)
{
    const tps_ctensor *t = &ck->t[i];
    for (int p = 0; p < t->npieces + t->nreplicas; p++) {
        const tps_piece *pc = p < t->npieces ? &t->pieces[p] : &t->replicas[p - t->npieces];
        if (pc->rank != r) continue;
        *lo = t->dim >= 0 ? pc->lo : 0;
        *hi = t->dim >= 0 ? pc->hi : t->ndim ? t->shape[0] : 1;
        return 1;
    }
    return 0;
}

static int bind_proj(const vctx *V, const char *x, const char *leaf, proj *P)
{
    char *n[3] = {tps_asprintf("%s.%s" TPS_MXFP4_BLOCKS, x, leaf),
                  tps_asprintf("%s.%s" TPS_MXFP4_SCALES, x, leaf),
                  tps_asprintf("%s.%s_bias", x, leaf)};
    int ok = n[0] && n[1] && n[2];
    int *src[3] = {&P->w, &P->s, &P->b}, *dir[3] = {&P->cw, &P->cs, &P->cb};
    for (int k = 0; ok && k < 3; k++) {
        *src[k] = tps_ckpt_find(V->src, n[k]);
        *dir[k] = tps_ckpt_find(V->ck, n[k]);
        ok = *src[k] >= 0 && *dir[k] >= 0;
    }
    for (int k = 0; k < 3; k++) free(n[k]);
    if (!ok) return 0;
    P->hw = holder_of(V->ck, P->cw);
    P->hs = holder_of(V->ck, P->cs);
    P->hb = holder_of(V->ck, P->cb);
    return P->hw && P->hs && P->hb;
}

/* y[v] += sum over nblk MX blocks of a row: w x[v * xs + k], mag the |w x|. */
static void row_dot(const tps_quant *q, const unsigned char *codes, const float *sc,
                    uint64_t nblk, const float *x, uint64_t xs, double *y, double *mag)
{
    for (uint64_t b = 0; b < nblk; b++)
        for (unsigned k = 0; k < MXB; k++) {
            unsigned byte = codes[b * (MXB / 2) + k / 2], code = k & 1 ? byte >> 4 : byte & 15u;
            double w = q->m->dequant(q, code, 0, sc[b], 1.0f);
            for (int v = 0; v < NX; v++) {
                double p = w * x[v * xs + b * MXB + k];
                y[v] += p;
                mag[v] += fabs(p);
            }
        }
}

/* Rows [r0, r1) of one side's expert: codes, their scales in f32, the bias. */
typedef struct {
    const vctx *V;
    tps_ckpt *ck;       /* the source, or NULL: a rank tensor (held) */
    int w, s, b;        /* source indices */
    held hw, hs, hb;
    uint64_t rows, nblk; /* of an expert; MX blocks a row */
    tps_dtype bdt;
} side;

static tps_err side_rows(tps_ctx *ctx, const side *S, uint64_t e, uint64_t r0, uint64_t r1,
                         unsigned char *codes, unsigned char *sraw, float *sc, float *bias)
{
    uint64_t cb = S->nblk * (MXB / 2), n = r1 - r0, at = e * S->rows + r0;
    size_t bes = tps_dtype_bits(S->bdt) / 8;
    unsigned char braw[8192];
    if (S->ck) {
        TPS_TRY(tps_ckpt_read(ctx, S->ck, (size_t)S->w, at * cb, codes, (size_t)(n * cb)));
        TPS_TRY(tps_ckpt_read(ctx, S->ck, (size_t)S->s, at * S->nblk, sraw, (size_t)(n * S->nblk)));
    } else {
        TPS_TRY(read_held(ctx, S->V->ck, &S->hw, at * cb, codes, (size_t)(n * cb)));
        TPS_TRY(read_held(ctx, S->V->ck, &S->hs, at * S->nblk, sraw, (size_t)(n * S->nblk)));
    }
    tps_to_f32(TPS_F8_E8M0, sraw, sc, (size_t)(n * S->nblk));
    for (uint64_t a = 0; a < n;) {
        uint64_t k = n - a < sizeof braw / bes ? n - a : sizeof braw / bes;
        if (S->ck)
            TPS_TRY(tps_ckpt_read(ctx, S->ck, (size_t)S->b, (at + a) * bes, braw, (size_t)(k * bes)));
        else
            TPS_TRY(read_held(ctx, S->V->ck, &S->hb, (at + a) * bes, braw, (size_t)(k * bes)));
        if (tps_vk_to_f32(S->bdt, braw, bias + a, (size_t)k))
            return tps_fail(ctx, TPS_E_ARG, "verify: an MXFP4 expert bias of %s has no f32 "
                            "conversion", tps_dtype_name(S->bdt));
        a += k;
    }
    return TPS_OK;
}

typedef struct {
    unsigned char *codes, *sraw;
    float *sc, *bias;
    uint64_t per; /* rows a block */
} bufs;

static int bufs_get(bufs *B, uint64_t nblk)
{
    uint64_t cb = nblk * (MXB / 2);
    B->per = BLOCK / (cb ? cb : 1);
    if (!B->per) B->per = 1;
    B->codes = tps_xmalloc((size_t)(B->per * cb) + 1);
    B->sraw = tps_xmalloc((size_t)(B->per * nblk) + 1);
    B->sc = tps_xmalloc((size_t)(B->per * nblk) * sizeof(float) + 1);
    B->bias = tps_xmalloc((size_t)B->per * sizeof(float) + 1);
    return B->codes && B->sraw && B->sc && B->bias;
}

static void bufs_free(bufs *B)
{
    free(B->codes);
    free(B->sraw);
    free(B->sc);
    free(B->bias);
}

/* Products of rows [r0, r1) of expert e over their MX blocks [b0, b1) (x:
 * those blocks' inputs), plus their biases when bias is set, into
 * y[(row - r0) * NX + v]. */
static tps_err side_products(tps_ctx *ctx, const side *S, bufs *B, uint64_t e, uint64_t r0,
                             uint64_t r1, uint64_t b0, uint64_t b1, const float *x, uint64_t xs,
                             int bias, double *y, double *mag)
{
    const tps_quant *q = S->V->q;
    for (uint64_t a = r0; a < r1; a += B->per) {
        uint64_t b = a + B->per < r1 ? a + B->per : r1;
        TPS_TRY(side_rows(ctx, S, e, a, b, B->codes, B->sraw, B->sc, B->bias));
        for (uint64_t j = a; j < b; j++) {
            double *yj = y + (j - r0) * NX, *mj = mag + (j - r0) * NX;
            row_dot(q, B->codes + ((j - a) * S->nblk + b0) * (MXB / 2),
                    B->sc + (j - a) * S->nblk + b0, b1 - b0, x, xs, yj, mj);
            for (int v = 0; bias && v < NX; v++) {
                yj[v] += B->bias[j - a];
                mj[v] += fabs((double)B->bias[j - a]);
            }
        }
    }
    return TPS_OK;
}

static void seeded(uint64_t *seed, float *x, uint64_t n)
{
    for (uint64_t k = 0; k < n; k++) {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        x[k] = (float)((double)(*seed >> 11) / 9007199254740992.0 * 2 - 1);
    }
}

/* One comparison's tally. */
typedef struct {
    uint64_t wrong, total;
    double worst;
} tally;

static void compare(tally *T, double a, double b, double ma, double mb)
{
    double err = fabs(a - b);
    if (err > T->worst) T->worst = err;
    T->total++;
    if (!(err <= 1e-12 * (ma + mb)) && !(isnan(a) && isnan(b))) T->wrong++;
}

/* The rank holds rows of `rows` a side: its rank tensors' sizes must say so. */
static char *sizes_wrong(const side *R, uint64_t E, int r)
{
    size_t bes = tps_dtype_bits(R->bdt) / 8;
    uint64_t n = E * R->rows;
    if (R->hw.nbytes == n * R->nblk * (MXB / 2) && R->hs.nbytes == n * R->nblk &&
        R->hb.nbytes == n * bes)
        return NULL;
    return tps_asprintf("rank %d's expert tensors do not hold %llu rows of %llu MX blocks and "
                        "their bias for each of %llu experts", r, (unsigned long long)R->rows,
                        (unsigned long long)R->nblk, (unsigned long long)E);
}

/* Does this process check rank r's share of the experts of tensor `name`
 * (its rank, and its layer's stage)? */
static int rank_checked(const vctx *V, int r, const char *name)
{
    return !(V->local && !V->local[r]) && tps_va_serves(V->ck, r, name);
}

/* Rank r's side of projection P (S: the source's): its rank tensors
 * (weight, scales, bias), or a note saying it lacks one. */
static char *rank_side(const vctx *V, const proj *P, const side *S, int r, side *R)
{
    *R = *S;
    R->ck = NULL;
    if (find_held(V->ck, r, P->hw, &R->hw) && find_held(V->ck, r, P->hs, &R->hs) &&
        find_held(V->ck, r, P->hb, &R->hb))
        return NULL;
    return tps_asprintf("rank %d lacks '%s', '%s' or '%s'", r, P->hw, P->hs, P->hb);
}

/* gate_up_proj: each rank's rows against the source's. */
static tps_err check_gate_up(vctx *V, const proj *P, uint64_t *seed)
{
    tps_ctx *ctx = V->ctx;
    const tps_ctensor *sw = &V->src->t[P->w];
    uint64_t E = sw->shape[0], R2 = sw->shape[1], nblk = sw->shape[2];
    float *x = tps_xmalloc((size_t)(NX * nblk * MXB) * sizeof *x + 1);
    if (!x) return tps_fail(ctx, TPS_E_NOMEM, "verify: out of memory");
    seeded(seed, x, NX * nblk * MXB);
    side S = {.V = V, .ck = V->src, .w = P->w, .s = P->s, .b = P->b, .rows = R2, .nblk = nblk,
              .bdt = V->src->t[P->b].dtype};
    tally T = {0};
    char *note = NULL;
    bufs BR = {0}, BS = {0};
    double *yr = NULL, *mr = NULL, *ys = NULL, *ms = NULL;
    tps_err rc = bufs_get(&BR, nblk) && bufs_get(&BS, nblk) ? TPS_OK
                 : tps_fail(ctx, TPS_E_NOMEM, "verify: out of memory");
    for (int r = 0; !rc && !note && r < V->tp; r++) {
        if (!rank_checked(V, r, sw->name)) continue;
        side R;
        if ((note = rank_side(V, P, &S, r, &R))) break;
        uint64_t lo = 0, hi = 0;
        rank_cut(V->ck, P->cw, r, &lo, &hi); /* none: the rank's rows are all tail */
        uint64_t row_all = E * nblk * (MXB / 2); /* codes of one row of every expert */
        R.rows = row_all ? R.hw.nbytes / row_all : 0;
        if ((note = sizes_wrong(&R, E, r))) break;
        uint64_t real = hi - lo, per = BR.per;
        free(yr), free(mr), free(ys), free(ms);
        yr = tps_xcalloc((size_t)(per * NX), sizeof *yr);
        mr = tps_xcalloc((size_t)(per * NX), sizeof *mr);
        ys = tps_xcalloc((size_t)(per * NX), sizeof *ys);
        ms = tps_xcalloc((size_t)(per * NX), sizeof *ms);
        if (!yr || !mr || !ys || !ms) rc = tps_fail(ctx, TPS_E_NOMEM, "verify: out of memory");
        for (uint64_t e = 0; !rc && e < E; e++)
            for (uint64_t a = 0; !rc && a < R.rows; a += per) {
                uint64_t b = a + per < R.rows ? a + per : R.rows;
                memset(yr, 0, (size_t)(per * NX) * sizeof *yr);
                memset(mr, 0, (size_t)(per * NX) * sizeof *mr);
                memset(ys, 0, (size_t)(per * NX) * sizeof *ys);
                memset(ms, 0, (size_t)(per * NX) * sizeof *ms);
                rc = side_products(ctx, &R, &BR, e, a, b, 0, nblk, x, nblk * MXB, 1, yr, mr);
                /* the source's rows lo + j; past the rank's real rows, zeros */
                uint64_t sb = b < real ? b : real;
                if (!rc && a < sb)
                    rc = side_products(ctx, &S, &BS, e, lo + a, lo + sb, 0, nblk, x, nblk * MXB,
                                       1, ys, ms);
                for (uint64_t j = 0; !rc && j < b - a; j++)
                    for (int v = 0; v < NX; v++)
                        compare(&T, yr[j * NX + v], ys[j * NX + v], mr[j * NX + v],
                                ms[j * NX + v]);
            }
    }
    free(yr), free(mr), free(ys), free(ms);
    bufs_free(&BR);
    bufs_free(&BS);
    free(x);
    if (rc) {
        free(note);
        return rc;
    }
    if (!note && T.wrong)
        note = tps_strdup("the ranks' MXFP4 rows, dequantized with the scales and biases beside "
                          "them, do not give the source's products (zero tails give 0)");
    if (tps_va_rep_add(V->R, sw->name, "dequant", T.worst, 0, T.wrong, T.total,
                       !note && !T.wrong, note))
        return tps_fail(ctx, TPS_E_NOMEM, "verify: out of memory");
    return TPS_OK;
}

/* down_proj, row-parallel: on each rank, the products over its real
 * features equal the source's over the same features, its zero tail
 * contributes exactly 0 (inputs of its own), and its bias is the source's on
 * rank 0 and exactly zero on the others (the engine adds every rank's). */
static tps_err check_down(vctx *V, const proj *P, uint64_t *seed)
{
    tps_ctx *ctx = V->ctx;
    const tps_ctensor *sw = &V->src->t[P->w];
    uint64_t E = sw->shape[0], H = sw->shape[1], nblk = sw->shape[2], I = nblk * MXB;
    side S = {.V = V, .ck = V->src, .w = P->w, .s = P->s, .b = P->b, .rows = H, .nblk = nblk,
              .bdt = V->src->t[P->b].dtype};
    tally T = {0};
    char *note = NULL;
    bufs BS = {0}, BR = {0};
    float *z = tps_xmalloc((size_t)(NX * I) * sizeof *z + 1), *zt = NULL;
    double *y[6] = {0}; /* rank real, source real, rank tail, its magnitudes... */
    for (int k = 0; k < 6; k++) y[k] = tps_xcalloc((size_t)(H * NX) + 1, sizeof(double));
    double *yr = y[0], *ys = y[1], *yt = y[2], *mr = y[3], *ms = y[4], *mt = y[5];
    tps_err rc = z && yr && ys && yt && mr && ms && mt && bufs_get(&BS, nblk)
                     ? TPS_OK
                     : tps_fail(ctx, TPS_E_NOMEM, "verify: out of memory");
    if (!rc) seeded(seed, z, NX * I);
    for (int r = 0; !rc && !note && r < V->tp; r++) {
        if (!rank_checked(V, r, sw->name)) continue;
        side R;
        if ((note = rank_side(V, P, &S, r, &R))) break;
        uint64_t lo = 0, hi = 0; /* the MX blocks of the rank's features */
        rank_cut(V->ck, P->cw, r, &lo, &hi);
        uint64_t blk_all = E * H * (MXB / 2); /* codes of one MX block of every row */
        R.nblk = blk_all ? R.hw.nbytes / blk_all : 0;
        if ((note = sizes_wrong(&R, E, r))) break;
        if (hi - lo > R.nblk) {
            note = tps_asprintf("rank %d's '%s' holds fewer features than its piece", r, P->hw);
            break;
        }
        uint64_t real = hi - lo, tail = R.nblk - real;
        free(zt);
        bufs_free(&BR);
        zt = tps_xmalloc((size_t)(NX * tail * MXB) * sizeof *zt + 1);
        if (!zt || !bufs_get(&BR, R.nblk)) {
            rc = tps_fail(ctx, TPS_E_NOMEM, "verify: out of memory");
            break;
        }
        seeded(seed, zt, NX * tail * MXB);
        for (uint64_t e = 0; !rc && e < E; e++) {
            for (int k = 0; k < 6; k++) memset(y[k], 0, (size_t)(H * NX) * sizeof(double));
            rc = side_products(ctx, &R, &BR, e, 0, H, 0, real, z + lo * MXB, I, 0, yr, mr);
            if (!rc)
                rc = side_products(ctx, &S, &BS, e, 0, H, lo, hi, z + lo * MXB, I, 0, ys, ms);
            if (!rc)
                rc = side_products(ctx, &R, &BR, e, 0, H, real, R.nblk, zt, tail * MXB, 0, yt, mt);
            for (uint64_t k = 0; !rc && k < H * NX; k++) {
                compare(&T, yr[k], ys[k], mr[k], ms[k]);
                compare(&T, yt[k], 0, 0, 0);
            }
            /* the biases alone: no blocks, the bias added */
            for (int k = 0; !rc && k < 6; k++) memset(y[k], 0, (size_t)(H * NX) * sizeof(double));
            if (!rc) rc = side_products(ctx, &R, &BR, e, 0, H, 0, 0, NULL, 0, 1, yr, mr);
            if (!rc && r % (V->ck->tp > 0 ? V->ck->tp : 1) == 0) /* its stage's tp rank 0 */
                rc = side_products(ctx, &S, &BS, e, 0, H, 0, 0, NULL, 0, 1, ys, ms);
            for (uint64_t k = 0; !rc && k < H * NX; k += NX) compare(&T, yr[k], ys[k], 0, 0);
        }
    }
    bufs_free(&BS);
    bufs_free(&BR);
    free(z);
    free(zt);
    for (int k = 0; k < 6; k++) free(y[k]);
    if (rc) {
        free(note);
        return rc;
    }
    if (!note && T.wrong)
        note = tps_strdup("a rank's MXFP4 products over its features do not give the source's, "
                          "its zero tail does not give 0, or its bias is not the source's on "
                          "rank 0 and zeros on the others");
    if (tps_va_rep_add(V->R, sw->name, "dequant", T.worst, 0, T.wrong, T.total,
                       !note && !T.wrong, note))
        return tps_fail(ctx, TPS_E_NOMEM, "verify: out of memory");
    return TPS_OK;
}

tps_err tps_vm_check(vctx *V)
{
    const tps_quant *q = V->q;
    if (!V->src || !V->serving || !q || q->m != &tps_qm_mxfp4) return TPS_OK;
    uint64_t seed = 0x2545F4914F6CDD1Dull;
    static const char leaf[] = "gate_up_proj" TPS_MXFP4_BLOCKS;
    for (size_t i = 0; i < V->ck->n; i++) {
        const char *nm = V->ck->t[i].name;
        size_t n = strlen(nm), ll = sizeof leaf - 1;
        if (n <= ll + 1 || strcmp(nm + n - ll, leaf) || nm[n - ll - 1] != '.') continue;
        if (V->o->tensors_glob && fnmatch(V->o->tensors_glob, nm, 0) != 0) continue;
        char *x = tps_asprintf("%.*s", (int)(n - ll - 1), nm);
        if (!x) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
        proj gu, dn;
        int ok_gu = bind_proj(V, x, "gate_up_proj", &gu), ok_dn = bind_proj(V, x, "down_proj", &dn);
        free(x);
        /* a missing tensor is the source check's to name */
        if (ok_gu) TPS_TRY(check_gate_up(V, &gu, &seed));
        if (ok_dn) TPS_TRY(check_down(V, &dn, &seed));
    }
    return TPS_OK;
}
