/* verify_finalize.c - a tensor's end, in queue order: its reconstruction or
 * CRC32 row, the collective of its products (all-gather, all-reduce, on the
 * host or the device), the bias, the comparison with the reference within
 * the tolerance, and for a block's halves the hand-over of the gathered
 * activations (block_feed) and the block's row. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "verify_int.h"

/* Worst element of one comparison. sabs NULL: exact. */
typedef struct {
    double err, tol;
    uint64_t wrong, total;
} cmp_t;

static void compare(cmp_t *c, const float *ysh, const float *yref, const float *sabs, size_t n,
                    size_t stride_sh, size_t stride_ref, uint64_t terms, int tp)
{
    for (size_t i = 0; i < n; i++) {
        float a = ysh[i * stride_sh], b = yref[i * stride_ref];
        double tol = sabs ? tps_tolerance(terms, tp, sabs[i * stride_ref]) : 0.0;
        double e;
        if (isnan(a) || isnan(b))
            e = (isnan(a) && isnan(b)) ? 0 : INFINITY;
        else if (a == b)
            e = 0;
        else
            e = fabs((double)a - (double)b);
        if (isnan(e)) e = INFINITY; /* inf - inf of opposite signs */
        if (e > c->err) c->err = e;
        if (tol > c->tol) c->tol = tol;
        if (e > tol) c->wrong++;
        c->total++;
    }
}

/* Adds the biases: the source's to the reference, each rank's shard to its
 * columns (colwise) or rank 0's copy once after the reduction (rowwise). */
static tps_err add_bias(vctx *V, vunit *u, vjob *J)
{
    if (u->bias < 0) return TPS_OK;
    const tps_ctensor *b = &V->ck->t[u->bias];
    uint64_t out = J->out;
    float *bref = malloc((out + 1) * sizeof(float)), *bsh = malloc((out + 1) * sizeof(float));
    tps_err rc = TPS_OK;
    if (!bref || !bsh) {
        rc = tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
        goto out;
    }
    TPS_CHECK(tps_vs_read_f32(V, V->src, (size_t)u->bias_si, -1, out, bref));
    if (b->dim == 0) {
        for (int p = 0; p < b->npieces; p++) {
            const tps_piece *pc = &b->pieces[p];
            TPS_CHECK(tps_vs_read_f32(V, V->ck, u->bias, p, pc->hi - pc->lo, bsh + pc->lo));
        }
    } else {
        int p0 = 0, tp = V->ck->tp > 0 ? V->ck->tp : 1; /* tp rank 0 of the stage holding it */
        for (int p = 0; p < b->npieces; p++)
            if (b->pieces[p].rank % tp == 0) p0 = p;
        TPS_CHECK(tps_vs_read_f32(V, V->ck, u->bias, p0, out, bsh));
    }
    for (size_t i = 0; i < (size_t)J->nb; i++)
        for (size_t j = 0; j < out; j++) {
            J->yref[i * out + j] += bref[j];
            J->sabs[i * out + j] += fabsf(bref[j]);
            J->ysh[i * out + j] += bsh[j];
        }
out:
    free(bref);
    free(bsh);
    return rc;
}

static tps_err collect(vctx *V, vunit *u, vjob *J)
{
    int tp = V->tp;
    tps_err rc = TPS_OK;
    if (J->gj) {
        TPS_TRY(tps_gpu_job_finish(V->ctx, V->gpu, J->gj, V->want_ref ? J->yref : NULL,
                                   V->want_ref ? J->sabs : NULL, J->ysh));
        return TPS_OK;
    }
    if (V->gpu) { /* embedding on a GPU backend: the collective on the device */
        tps_gpu_job_desc d = {
            .gather = J->gather,
            .matmul = 0,
            .tp = tp,
            .dtype = TPS_F32,
            .out = J->out,
            .in = 0,
            .nb = J->nb,
            .lo = u->lo,
            .len = u->len,
            .want_ref = 0,
        };
        TPS_TRY(tps_gpu_job_new(V->ctx, V->gpu, &d, &J->gj));
        for (int r = 0; r < tp; r++)
            if (V->local[r]) TPS_TRY(tps_gpu_job_contrib(V->ctx, V->gpu, J->gj, r, J->yloc[r]));
        TPS_TRY(tps_gpu_job_finish(V->ctx, V->gpu, J->gj, NULL, NULL, J->ysh));
        return TPS_OK;
    }
    float **outs = malloc(sizeof(float *) * (size_t)tp);
    if (!outs) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    for (int r = 0; r < tp; r++) outs[r] = J->ysh;
    if (J->gather)
        rc = V->comm->allgather(V->comm, V->ctx, (const float *const *)J->yloc, u->len,
                                (uint64_t)J->nb, outs);
    else
        rc = V->comm->allreduce(V->comm, V->ctx, (const float *const *)J->yloc,
                                (uint64_t)J->nb * J->out, outs);
    free(outs);
    return rc;
}

static const char *nk_kind(int nk)
{
    switch (nk) {
    case NK_COL: return "colwise";
    case NK_ROW: return "rowwise";
    default: return "embedding";
    }
}

static tps_err block_feed(vctx *V, vblock *b)
{
    int tp = V->tp, batch = V->batch;
    uint64_t inter = b->inter;
    tps_dtype op = b->cons->ct->dtype;
    size_t n = (size_t)batch * inter;
    b->href = malloc((n + 1) * sizeof(float));
    b->hr = calloc((size_t)tp, sizeof(float *));
    if (!b->href || !b->hr) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    /* The reference half takes the activations the ranks made, gathered: the
     * check then isolates the pairing (rank r's slice meets rank r's columns
     * of the rowwise weight), the colwise rows having compared those
     * activations with the source's; and on a GPU, where the reference and
     * rank GEMMs may differ in the last bit, a BF16 rounding cannot flip
     * between the two sides. */
    for (size_t i = 0; i < n; i++) {
        float h = b->kind == BLK_MLP ? tps_vk_silu(b->keep_sh[0][i]) * b->keep_sh[1][i] : b->keep_sh[0][i];
        b->href[i] = tps_vk_round_to(op, h);
    }
    for (int r = 0; r < tp; r++) {
        if (!V->local[r]) continue;
        uint64_t lo = b->prod[0]->lo[r], len = b->prod[0]->len[r];
        b->hr[r] = malloc(((size_t)batch * len + 1) * sizeof(float));
        if (!b->hr[r]) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
        /* rank r's local activations: its own columns of the gathered outputs */
        for (size_t bb = 0; bb < (size_t)batch; bb++)
            for (size_t c = 0; c < len; c++) {
                size_t at = bb * inter + lo + c;
                float h = b->kind == BLK_MLP ? tps_vk_silu(b->keep_sh[0][at]) * b->keep_sh[1][at]
                                             : b->keep_sh[0][at];
                b->hr[r][bb * len + c] = tps_vk_round_to(op, h);
            }
    }
    for (int k = 0; k < 2; k++) {
        free(b->keep_sh[k]);
        b->keep_sh[k] = NULL;
    }
    return TPS_OK;
}

void tps_vf_block_release(vctx *V, vblock *b)
{
    free(b->href);
    b->href = NULL;
    if (b->hr)
        for (int r = 0; r < V->tp; r++) free(b->hr[r]);
    free(b->hr);
    b->hr = NULL;
    for (int k = 0; k < 2; k++) {
        free(b->keep_sh[k]);
        b->keep_sh[k] = NULL;
    }
}

/* ", in 'model.layers.0.self_attn.qkv_proj.weight' at byte 1024" for a piece
 * inside another rank tensor; "" otherwise. */
static const char *slot_where(const vunit *u, int s)
{
    static _Thread_local char buf[320];
    const tps_piece *pc = tps_va_slot_piece(u, s);
    if (!pc || !pc->holder || !strcmp(pc->holder, u->ct->name)) return "";
    snprintf(buf, sizeof buf, ", in '%s' at byte %llu", pc->holder, (unsigned long long)pc->at);
    return buf;
}

static char *recon_note(vctx *V, vunit *u, uint64_t *wrong)
{
    char buf[1024];
    size_t n = 0;
    int shown = 0, more = 0;
    *wrong = 0;
    for (int r = 0; r < u->nslot; r++) {
        uint64_t d = atomic_load(&u->diff[r]);
        if (!d) continue;
        *wrong += d;
        if (shown == 3) {
            more++;
            continue;
        }
        shown++;
        if (n >= sizeof buf) continue;
        if (u->mode == MODE_LOGICAL)
            n += (size_t)snprintf(buf + n, sizeof buf - n,
                                  "%s%llu byte%s of the gathered tensor differ%s from the source, "
                                  "first at byte %llu",
                                  n ? "; " : "", (unsigned long long)d, d == 1 ? "" : "s",
                                  d == 1 ? "s" : "", (unsigned long long)u->first[r]);
        else
            n += (size_t)snprintf(buf + n, sizeof buf - n,
                                  "%srank %d (%s%s): %llu byte%s of the %s differ%s from the "
                                  "source, first at byte %llu",
                                  n ? "; " : "", u->slot_rank[r], tps_va_rank_file(V, u, r),
                                  slot_where(u, r), (unsigned long long)d, d == 1 ? "" : "s",
                                  r >= V->tp ? "replica" : "shard", d == 1 ? "s" : "",
                                  (unsigned long long)u->first[r]);
    }
    if (!*wrong) return NULL;
    if (more && n < sizeof buf)
        snprintf(buf + n, sizeof buf - n, "; and %d more rank%s", more, more == 1 ? "" : "s");
    return tps_strdup(buf);
}

static tps_err crc_row(vctx *V, vunit *u)
{
    const tps_ctensor *ct = u->ct;
    uint64_t bad = 0, total = 0;
    char buf[1024];
    size_t n = 0;
    uint32_t ref = 0;
    int have_ref = 0, repl_differs = 0;
    for (int p = 0; p < ct->npieces + ct->nreplicas; p++) {
        const tps_piece *pc = p < ct->npieces ? &ct->pieces[p] : &ct->replicas[p - ct->npieces];
        if (u->dim < 0 && pc->has_crc) {
            if (!have_ref)
                ref = pc->crc, have_ref = 1;
            else if (pc->crc != ref)
                repl_differs = 1;
        }
        if (!V->local[pc->rank]) continue;
        uLong crc = crc32(0L, Z_NULL, 0);
        for (uint64_t k = u->crcpre[p]; k < u->crcpre[p + 1]; k++)
            crc = crc32_combine(crc, u->crcs[k], (z_off_t)u->crclen[k]);
        total++;
        if (!pc->has_crc || (uint32_t)crc != pc->crc) {
            bad++;
            if (n < sizeof buf) {
                if (pc->has_crc)
                    n += (size_t)snprintf(buf + n, sizeof buf - n,
                                          "%srank %d (%s): CRC32 %08x, the manifest says %08x",
                                          n ? "; " : "", pc->rank, V->ck->files[pc->file].name,
                                          (unsigned)crc, (unsigned)pc->crc);
                else
                    n += (size_t)snprintf(buf + n, sizeof buf - n,
                                          "%srank %d: the manifest has no CRC32", n ? "; " : "",
                                          pc->rank);
            }
        }
    }
    if (repl_differs && n < sizeof buf) {
        n += (size_t)snprintf(
            buf + n, sizeof buf - n,
            "%sthe manifest's CRC32s of this replicated tensor differ across ranks", n ? "; " : "");
        if (!bad) bad = 1;
    }
    if (tps_va_rep_add(V->R, ct->name, "crc", 0, 0, bad, total, bad == 0 && !u->pre,
                u->pre ? tps_strdup(u->pre)
                : n    ? tps_strdup(buf)
                       : NULL))
        return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    return TPS_OK;
}

/* The tensor's byte row: its CRC32s against the manifest, or its pieces
 * against the source (reconstructed, whole, replicated). */
static tps_err finalize_bytes(vctx *V, vunit *u)
{
    const tps_ctensor *ct = u->ct;
    if (u->mode == MODE_CRC) {
        TPS_TRY(crc_row(V, u));
    } else {
        uint64_t wrong = 0, total = 0;
        char *note = u->pre ? tps_strdup(u->pre) : recon_note(V, u, &wrong);
        if (!note && ct->derived_from && V->src)
            note = tps_asprintf("compared with the source's %s (--untie wrote it from that)",
                                ct->derived_from);
        for (int r = 0; r < u->nslot; r++)
            if (V->local[u->slot_rank[r]] && u->piece[r] >= 0) total += tps_va_slot_piece(u, r)->nbytes;
        if (u->mode == MODE_LOGICAL) total = ct->nbytes;
        /* Whole, but on some ranks only (an expert under split --ep): not
         * a replica of anything, so not called one. */
        const char *kind = u->dim >= 0 ? "reconstruct" : ct->nlisted < V->tp ? "whole" : "replicated";
        if (tps_va_rep_add(V->R, ct->name, kind, 0, 0, wrong, total,
                    !u->pre && !wrong, note))
            return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    }
    return TPS_OK;
}

/* The root's rows of the products, compared with the reference: the
 * tensor's, then for a block's second half the block's. bias_note: why the
 * bias was not added (owned, handed to the row), or NULL. */
static tps_err report_products(vctx *V, vunit *u, vjob *J, char *bias_note)
{
    tps_err rc = TPS_OK;
    const tps_ctensor *ct = u->ct;
    vblock *blk = u->cons_of;
    int batch = J->batch;
    size_t out = (size_t)J->out;
    uint64_t terms = J->in + (u->bias >= 0 && !bias_note ? 1 : 0);
    cmp_t c = {0, 0, 0, 0};
    compare(&c, J->ysh, J->yref, J->embed ? NULL : J->sabs, (size_t)batch * out, 1, 1, terms,
            V->tp);
    int ok = c.wrong == 0 && !bias_note;
    char *note = bias_note;
    if (!note && c.wrong)
        note = tps_asprintf("%llu of %llu outputs off by more than the tolerance",
                            (unsigned long long)c.wrong, (unsigned long long)c.total);
    if (!note && ct->derived_from)
        note = tps_asprintf("reference weight: the source's %s", ct->derived_from);
    if (tps_va_rep_add(V->R, ct->name, nk_kind(u->nk), c.err, c.tol, c.wrong, c.total, ok, note))
        rc = tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    if (!rc && blk) {
        cmp_t cb = {0, 0, 0, 0};
        compare(&cb, J->ysh + (size_t)batch * out, J->yref + (size_t)batch * out,
                J->sabs + (size_t)batch * out, (size_t)batch * out, 1, 1, terms, V->tp);
        char *bn =
            cb.wrong ? tps_asprintf("%llu of %llu outputs of the sharded block off by "
                                    "more than the tolerance",
                                    (unsigned long long)cb.wrong, (unsigned long long)cb.total)
                     : NULL;
        if (tps_va_rep_add(V->R, blk->name, blk->kind == BLK_MLP ? "mlp" : "attn", cb.err, cb.tol,
                    cb.wrong, cb.total, cb.wrong == 0, bn))
            rc = tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    }
    return rc;
}

/* A block's first half: its gathered outputs go to the block, which is fed
 * when both halves' producers are in. */
static tps_err feed_block(vctx *V, vunit *u, vjob *J)
{
    tps_err rc = TPS_OK;
    vblock *b = u->feeds;
    b->keep_sh[u->feed_slot] = J->ysh;
    J->ysh = NULL;
    if (--b->pending == 0) {
        rc = block_feed(V, b);
        atomic_store_explicit(&b->ready, rc ? -1 : 1, memory_order_release);
    }
    return rc;
}

static tps_err finalize(vctx *V, vunit *u)
{
    tps_err rc = TPS_OK;
    const tps_ctensor *ct = u->ct;
    vblock *blk = u->cons_of;
    TPS_TRY(finalize_bytes(V, u));
    if (u->nk == NK_NONE) {
        /* a Linear too wide to multiply is said; integer tensors are not Linear layers */
        if (u->nk_note && tps_va_numeric_dtype(ct->dtype) && u->si >= 0 && !u->pre && ct->ndim == 2 &&
            u->dim >= 0)
            if (tps_va_rep_add(V->R, ct->name, u->dim == 0 ? "colwise" : "rowwise", 0, 0, 0, 0, 1,
                        tps_strdup(u->nk_note)))
                return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
        return TPS_OK;
    }
    char *bias_note = (u->nk == NK_COL || u->nk == NK_ROW) ? tps_va_check_bias(V, u) : NULL;
    vjob *J;
    TPS_TRY(tps_vj_get(V, u, &J)); /* a tensor whose tasks fed nothing (tp ranks elsewhere) */
    TPS_CHECK(collect(V, u, J));
    if (!bias_note && V->is_root) TPS_CHECK(add_bias(V, u, J));
    if (V->is_root) {
        rc = report_products(V, u, J, bias_note);
        bias_note = NULL;
    }
    if (!rc && u->feeds) rc = feed_block(V, u, J); /* hand the outputs to the block */
out:
    free(bias_note);
    tps_vj_free(V, u->job);
    u->job = NULL;
    if (blk) tps_vf_block_release(V, blk);
    return rc;
}

/* Finalizes every finished tensor that is next in queue order. */
void tps_vf_drain(vctx *V)
{
    pthread_mutex_lock(&V->fin_mu);
    while (V->next_final < V->nu && atomic_load(&V->order[V->next_final]->done)) {
        if (atomic_load(&V->err)) break;
        tps_err rc = finalize(V, V->order[V->next_final]);
        if (rc) tps_va_set_err(V, rc);
        V->next_final++;
    }
    pthread_mutex_unlock(&V->fin_mu);
}
