/* verify_scales.c - reading small tensors whole as f32 (an FP8 weight's
 * scales, a Linear's bias) and the FP8 side of a job: each side's scales
 * (the source's, every local rank's piece of the scale tensor) and the
 * dequantization of a weight row with them. */
#include <stdlib.h>
#include <string.h>

#include "verify_int.h"

tps_err tps_vs_read_f32(vctx *V, tps_ckpt *ck, size_t t, int piece, uint64_t nel,
                        float *dst)
{
    const tps_ctensor *ct = &ck->t[t];
    size_t es = tps_va_dt_bytes(ct->dtype);
    unsigned char *buf = malloc((size_t)(nel * es) + 1);
    if (!buf) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    tps_err rc = piece < 0 ? tps_ckpt_read(V->ctx, ck, t, 0, buf, (size_t)(nel * es))
                           : tps_ckpt_read_piece(V->ctx, ck, t, piece, 0, buf, (size_t)(nel * es));
    if (!rc && tps_vk_to_f32(ct->dtype, buf, dst, (size_t)nel))
        rc = tps_fail(V->ctx, TPS_E_FORMAT, "verify: %s: cannot convert to f32", ct->name);
    free(buf);
    return rc;
}


/* A piece of a tensor of V->ck as f32: the piece on `rank` (its own rows,
 * not a replica), whole. */
static tps_err read_piece_f32(vctx *V, size_t t, int rank, float **out, uint64_t *lo,
                              uint64_t *n)
{
    const tps_ctensor *ct = &V->ck->t[t];
    int p = -1;
    for (int k = 0; k < ct->npieces && p < 0; k++)
        if (ct->pieces[k].rank == rank) p = k;
    /* a refined scale (vLLM's experts) may be held by a rank as a replica only */
    for (int k = 0; k < ct->nreplicas && p < 0; k++)
        if (ct->replicas[k].rank == rank && ct->replicas[k].rep_n) p = ct->npieces + k;
    *out = NULL;
    if (p < 0) return TPS_OK;
    const tps_piece *pc = p < ct->npieces ? &ct->pieces[p] : &ct->replicas[p - ct->npieces];
    uint64_t nb = pc->nbytes, es = tps_dtype_bits(ct->dtype) / 8;
    unsigned char *raw = malloc(nb + 1);
    float *f = malloc((nb / (es ? es : 1) + 1) * sizeof(float));
    tps_err rc = raw && f ? TPS_OK : tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    if (!rc) rc = tps_ckpt_read_piece(V->ctx, V->ck, t, p, 0, raw, (size_t)nb);
    if (!rc && tps_vk_to_f32(ct->dtype, raw, f, (size_t)(nb / es)))
        rc = tps_fail(V->ctx, TPS_E_FORMAT, "verify: scale %s: cannot convert %s to f32", ct->name,
                      tps_dtype_name(ct->dtype));
    free(raw);
    if (rc) {
        free(f);
        return rc;
    }
    *out = f;
    *lo = ct->dim >= 0 ? pc->lo : 0;
    *n = nb / es;
    return TPS_OK;
}

/* Scales of an FP8 weight unit: the source's and every local rank's. */
tps_err tps_vs_load_scales(vctx *V, vunit *u, vjob *J)
{
    J->qkind = -1;
    if (!V->q || (size_t)u->t >= V->ck->n || V->q->role[u->t] != TPS_QR_WEIGHT) return TPS_OK;
    size_t s = (size_t)V->q->partner[u->t];
    const tps_ctensor *sc = &V->ck->t[s];
    int ssi = tps_ckpt_find(V->src, sc->name);
    if (ssi < 0)
        return tps_fail(V->ctx, TPS_E_MISMATCH, "verify: scale %s is not in the source", sc->name);
    J->qkind = V->q->kind[s];
    J->qm = V->q->m;
    J->bn = V->q->bn;
    J->bk = V->q->bk;
    J->scols = sc->ndim == 2 ? sc->shape[1] : 1;
    uint64_t nsref = V->src->t[ssi].nbytes / (tps_dtype_bits(sc->dtype) / 8);
    J->sref = malloc((nsref + 1) * sizeof(float));
    J->srank = calloc((size_t)V->tp, sizeof(float *));
    J->slo = calloc((size_t)V->tp, sizeof(uint64_t));
    J->sw = calloc((size_t)V->tp, sizeof(uint64_t));
    if (!J->sref || !J->srank || !J->slo || !J->sw)
        return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    TPS_TRY(tps_vs_read_f32(V, V->src, (size_t)ssi, -1, nsref, J->sref));
    for (int r = 0; r < V->tp; r++) {
        if (!V->local[r]) continue;
        uint64_t lo = 0, n = 0;
        TPS_TRY(read_piece_f32(V, s, r, &J->srank[r], &lo, &n));
        /* along the weight's dim: block rows (colwise) or block columns
         * (rowwise) of the scale, channel rows, or the whole scale */
        J->slo[r] = sc->dim >= 0 ? lo : 0;
        J->sw[r] = sc->dim == 1 ? (n / (sc->shape[0] ? sc->shape[0] : 1)) : J->scols;
    }
    return TPS_OK;
}

/* Multiplies rank `side`'s (or the source's, side -1) weight row j (global)
 * of `width` f32 elements by its scales, with the method's kernel. col0:
 * the global column of w[0]; dim: the rank's split dim. */
void tps_vs_dequant_row(const vjob *J, int side, uint64_t j, uint64_t col0, float *w,
                        size_t width, int dim)
{
    const float *S = side < 0 ? J->sref : J->srank[side];
    if (!S) return;
    tps_qscales sc = {.kind = (tps_qscale)J->qkind, .bn = J->bn, .bk = J->bk, .s = S,
                      .lo = side < 0 ? 0 : J->slo[side], .width = side < 0 ? J->scols : J->sw[side],
                      .d = side < 0 ? -1 : dim};
    J->qm->dequant_row(&sc, j, col0, w, width);
}
