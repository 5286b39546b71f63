/* verify_packed.c - a serving layout's packed source tensors (Phi-3's
 * qkv_proj = [q; k; v], gate_up_proj = [gate; up]): the engine cuts them into
 * their sections and splits each on its own heads, so every rank holds
 * several row ranges of one source tensor (and, with KV replication, copies
 * of some). The per-rank machinery of verify.c assumes one row range per
 * rank; these are checked here instead, piece by piece, on the CPU:
 *
 *   reconstruct  every piece (replicas too) holds the source's rows it names,
 *                and the primary pieces tile the tensor;
 *   colwise      each piece's rows times the seeded inputs equal the same
 *                rows of the source times them (the products the engine's
 *                fused layer computes on that rank), within the tolerance.
 *
 * Without --source the pieces' CRC32s are checked against the manifest. */
#include "verify_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* Does the serving layout put more than one row range of tensor i on some
 * rank? (Replicas aside: those are other ranks' copies.) */
int tps_vp_is_packed(const vctx *V, size_t i)
{
    const tps_ctensor *ct = &V->ck->t[i];
    if (!V->serving || ct->dim < 0 || ct->npieces < 2) return 0;
    for (int a = 0; a < ct->npieces; a++)
        for (int b = a + 1; b < ct->npieces; b++)
            if (ct->pieces[a].rank == ct->pieces[b].rank) return 1;
    return 0;
}

/* What the pieces of a packed tensor showed: differing bytes (the first
 * said in note), and with the products, the outputs off by more than the
 * tolerance. */
typedef struct {
    char *note;
    uint64_t wrong, total, outs, bad_out;
    double err, tolmax;
} vp_tally;

/* Without --source: every piece's CRC32 against the manifest's, one row. */
static tps_err vp_check_crc(vctx *V, const tps_ctensor *ct)
{
    tps_ctx *ctx = V->ctx;
    int np = ct->npieces + ct->nreplicas;
    char *note = NULL;
    uint64_t wrong = 0, total = 0;
    unsigned char *buf = malloc(1 << 20);
    if (!buf) return tps_fail(ctx, TPS_E_NOMEM, "verify: out of memory");
    for (int p = 0; p < np; p++) {
        const tps_piece *pc = p < ct->npieces ? &ct->pieces[p] : &ct->replicas[p - ct->npieces];
        uint32_t crc = 0;
        for (uint64_t a = 0; a < pc->nbytes; a += 1 << 20) {
            size_t n = (size_t)(pc->nbytes - a < (1 << 20) ? pc->nbytes - a : (1 << 20));
            tps_err rc = tps_ckpt_read_piece_at(ctx, V->ck, ct, pc, a, buf, n);
            if (rc) {
                free(buf);
                return rc;
            }
            crc = tps_crc32(crc, buf, n);
        }
        total += pc->nbytes;
        atomic_fetch_add(&V->bytes, pc->nbytes);
        if (pc->has_crc && crc != pc->crc) {
            wrong += pc->nbytes;
            if (!note)
                note = tps_asprintf("rank %d's rows [%llu, %llu): CRC32 %08x, the manifest says "
                                    "%08x",
                                    pc->rank, (unsigned long long)pc->lo,
                                    (unsigned long long)pc->hi, crc, pc->crc);
        }
    }
    free(buf);
    if (tps_va_rep_add(V->R, ct->name, "crc", 0, 0, wrong, total, !wrong, note))
        return tps_fail(ctx, TPS_E_NOMEM, "verify: out of memory");
    return TPS_OK;
}

/* n rows of piece p from row r0, a the piece's bytes and b the source's:
 * the differing bytes counted, the first said. */
static void vp_compare_rows(const tps_ctensor *ct, int p, const tps_piece *pc, uint64_t r0,
                            const unsigned char *a, const unsigned char *b, size_t n,
                            uint64_t rowb, vp_tally *t)
{
    if (!memcmp(a, b, n * rowb)) return;
    uint64_t k = 0;
    while (k < n * rowb && a[k] == b[k]) k++;
    uint64_t w = 0;
    for (uint64_t j = 0; j < n * rowb; j++) w += a[j] != b[j];
    t->wrong += w;
    if (!t->note)
        t->note = tps_asprintf("rank %d's%s row %llu differs from the source's (first at "
                               "byte %llu of the row)",
                               pc->rank, p >= ct->npieces ? " replica" : "",
                               (unsigned long long)(r0 + k / rowb),
                               (unsigned long long)(k % rowb));
}

/* n rows of the piece (wa) and of the source (wb) times the seeded inputs
 * x: each output within the tolerance of the source's. */
static void vp_products(const float *wa, const float *wb, const float *x, size_t n, int batch,
                        uint64_t cols, vp_tally *t)
{
    for (size_t j = 0; j < n; j++)
        for (int bb = 0; bb < batch; bb++) {
            double ys = 0, yr = 0, sabs = 0;
            const float *xb = x + (size_t)bb * cols;
            for (uint64_t c = 0; c < cols; c++) {
                float ps = wa[j * cols + c] * xb[c], pr = wb[j * cols + c] * xb[c];
                ys += ps;
                yr += pr;
                sabs += fabs(pr);
            }
            double tol = tps_tolerance(cols, 1, sabs), d = fabs(ys - yr);
            if (!(d <= tol)) t->bad_out++;
            if (d > t->err) t->err = d;
            if (tol > t->tolmax) t->tolmax = tol;
            t->outs++;
        }
}

/* Every piece (replicas too) against source tensor si, in steps of about
 * 1 MiB of rows; numeric: their products too, with batch inputs. */
static tps_err vp_compare_source(vctx *V, const tps_ctensor *ct, int si, int numeric, int batch,
                                 vp_tally *t)
{
    tps_ctx *ctx = V->ctx;
    int np = ct->npieces + ct->nreplicas;
    uint64_t cols = ct->ndim == 2 ? ct->shape[1] : 0, rowb = ct->nbytes / (ct->shape[0] ? ct->shape[0] : 1);
    size_t rows_per = (size_t)(rowb && rowb < (1u << 20) ? (1u << 20) / rowb : 1);
    unsigned char *a = malloc(rows_per * rowb + 1), *b = malloc(rows_per * rowb + 1);
    float *wa = numeric ? malloc((rows_per * cols + 1) * sizeof(float)) : NULL;
    float *wb = numeric ? malloc((rows_per * cols + 1) * sizeof(float)) : NULL;
    float *x = numeric ? malloc(((size_t)batch * cols + 1) * sizeof(float)) : NULL;
    tps_err rc = TPS_OK;
    if (!a || !b || (numeric && (!wa || !wb || !x))) {
        rc = tps_fail(ctx, TPS_E_NOMEM, "verify: out of memory");
        goto out;
    }
    if (ct->dim > 0) {
        /* pieces along a later dim (Gemma 4's stacked experts: each expert's
         * gate and up rows): every outer step's slice against the source's */
        uint64_t inner = tps_dtype_bits(ct->dtype) / 8, outer = 1;
        for (int d = ct->dim + 1; d < ct->ndim; d++) inner *= ct->shape[d];
        for (int d = 0; d < ct->dim; d++) outer *= ct->shape[d];
        uint64_t row = ct->shape[ct->dim] * inner, cap = rows_per * rowb;
        for (int p = 0; p < np && !rc; p++) {
            const tps_piece *pc = p < ct->npieces ? &ct->pieces[p] : &ct->replicas[p - ct->npieces];
            uint64_t sb = pc->lo * inner, l = (pc->hi - pc->lo) * inner;
            for (uint64_t o = 0; o < outer && !rc; o++)
                for (uint64_t c = 0; c < l && !rc; c += cap) {
                    size_t n = (size_t)(l - c < cap ? l - c : cap);
                    if ((rc = tps_ckpt_read_piece_at(ctx, V->ck, ct, pc, o * l + c, a, n))) break;
                    if ((rc = tps_ckpt_read(ctx, V->src, (size_t)si, o * row + sb + c, b, n))) break;
                    atomic_fetch_add(&V->bytes, n);
                    t->total += n;
                    vp_compare_rows(ct, p, pc, pc->lo, a, b, 1, n, t);
                }
        }
        goto out;
    }
    for (int bb = 0; numeric && bb < batch; bb++)
        for (uint64_t c = 0; c < cols; c++)
            x[(size_t)bb * cols + c] = tps_input_value(V->o->seed, (uint64_t)bb, c);
    for (int p = 0; p < np; p++) {
        const tps_piece *pc = p < ct->npieces ? &ct->pieces[p] : &ct->replicas[p - ct->npieces];
        for (uint64_t r0 = pc->lo; r0 < pc->hi; r0 += rows_per) {
            size_t n = (size_t)(pc->hi - r0 < rows_per ? pc->hi - r0 : rows_per);
            uint64_t poff = (r0 - pc->lo) * rowb;
            if ((rc = tps_ckpt_read_piece_at(ctx, V->ck, ct, pc, poff, a, n * rowb))) goto out;
            if ((rc = tps_ckpt_read(ctx, V->src, (size_t)si, r0 * rowb, b, n * rowb))) goto out;
            atomic_fetch_add(&V->bytes, n * rowb);
            t->total += n * rowb;
            vp_compare_rows(ct, p, pc, r0, a, b, n, rowb, t);
            if (!numeric) continue;
            if ((rc = tps_to_f32(ct->dtype, a, wa, n * cols) ? TPS_E_FORMAT : TPS_OK) ||
                (rc = tps_to_f32(ct->dtype, b, wb, n * cols) ? TPS_E_FORMAT : TPS_OK)) {
                rc = tps_fail(ctx, rc, "verify: %s: cannot convert %s to f32", ct->name,
                              tps_dtype_name(ct->dtype));
                goto out;
            }
            vp_products(wa, wb, x, n, batch, cols, t);
        }
    }
out:
    free(a);
    free(b);
    free(wa);
    free(wb);
    free(x);
    return rc;
}

/* The rows of a packed tensor compared with its source: reconstruct, and
 * with the products, colwise. */
static tps_err vp_report(vctx *V, const tps_ctensor *ct, int numeric, vp_tally *t)
{
    char *rn = t->note ? t->note
                       : tps_asprintf("packed: %d row ranges on %d ranks (%d replicas), each "
                                      "against the source's rows",
                                      ct->npieces, V->tp, ct->nreplicas);
    t->note = NULL;
    if (tps_va_rep_add(V->R, ct->name, "reconstruct", 0, 0, t->wrong, t->total, !t->wrong, rn))
        return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    if (numeric &&
        tps_va_rep_add(V->R, ct->name, "colwise", t->err, t->tolmax, t->bad_out, t->outs,
                       !t->bad_out,
                       t->bad_out ? tps_asprintf("%llu of %llu outputs of the packed rows off by "
                                                 "more than the tolerance",
                                                 (unsigned long long)t->bad_out,
                                                 (unsigned long long)t->outs)
                                  : NULL))
        return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    return TPS_OK;
}

tps_err tps_vp_check(vctx *V, size_t i)
{
    tps_ctx *ctx = V->ctx;
    const tps_ctensor *ct = &V->ck->t[i];
    int np = ct->npieces + ct->nreplicas;
    char *note = NULL;
    int absent = 0;
    vunit tmp = {.t = i, .ct = ct};
    char *why = tps_va_layout_note(V, &tmp);
    if (why) {
        if (tps_va_rep_add(V->R, ct->name, "reconstruct", 0, 0, ct->nbytes, ct->nbytes, 0, why))
            return tps_fail(ctx, TPS_E_NOMEM, "verify: out of memory");
        return TPS_OK;
    }
    /* One process checks it (the root, with NCCL), reading every rank's
     * file: a rank file missing from the directory is a failure, as for any
     * tensor. */
    if (!V->is_root) return TPS_OK;
    for (int p = 0; p < np; p++) {
        const tps_piece *pc = p < ct->npieces ? &ct->pieces[p] : &ct->replicas[p - ct->npieces];
        if (V->ck->rank_present && !V->ck->rank_present[pc->rank]) absent = 1;
    }
    if (absent) {
        note = tps_strdup("a packed tensor: the files of some of its ranks are missing from the "
                          "directory (was it split with --ranks?)");
        if (tps_va_rep_add(V->R, ct->name, "reconstruct", 0, 0, ct->nbytes, ct->nbytes, 0, note))
            return tps_fail(ctx, TPS_E_NOMEM, "verify: out of memory");
        return TPS_OK;
    }
    int si = V->src ? tps_ckpt_find(V->src, ct->name) : -1;
    if (!V->src) return vp_check_crc(V, ct); /* the manifest's CRC32s */
    if (si < 0) return TPS_OK; /* reported as missing from the source by the caller */
    const tps_ctensor *st = &V->src->t[si];
    if (st->dtype != ct->dtype || st->ndim != ct->ndim || st->nbytes != ct->nbytes) {
        note = tps_asprintf("the source's %s is %s of %llu bytes, the manifest says %s of %llu",
                            ct->name, tps_dtype_name(st->dtype), (unsigned long long)st->nbytes,
                            tps_dtype_name(ct->dtype), (unsigned long long)ct->nbytes);
        if (tps_va_rep_add(V->R, ct->name, "reconstruct", 0, 0, ct->nbytes, ct->nbytes, 0, note))
            return tps_fail(ctx, TPS_E_NOMEM, "verify: out of memory");
        return TPS_OK;
    }
    int numeric = ct->ndim == 2 && ct->dim == 0 && tps_va_numeric_dtype(ct->dtype) && V->q == NULL;
    int batch = V->batch < 4 ? V->batch : 4;
    vp_tally t = {0};
    tps_err rc = vp_compare_source(V, ct, si, numeric, batch, &t);
    if (!rc) rc = vp_report(V, ct, numeric, &t);
    free(t.note);
    return rc;
}
