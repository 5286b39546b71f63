/* verify.c - `tpshard verify`: prove a shard directory reproduces its source.
 *
 * Two layers (DESIGN.md section 6):
 *  - Reconstruction: every rank's shard of every tensor, put back at its
 *    place along the shard dim, equals the source bytes; replicated tensors
 *    equal the source on every rank. Without a source, each shard's CRC32 is
 *    checked against the manifest instead.
 *  - Numerics (with a source): seeded inputs through the sharded Linear
 *    layers (colwise: all-gather; rowwise: all-reduce, bias once), the
 *    vocab-sharded embeddings (all-reduce, exact), and per layer the MLP and
 *    attention blocks, whose rank-local intermediate must meet the matching
 *    shard of the rowwise half (the block's reference applies the unsharded
 *    rowwise weight to the gathered intermediate; see block_feed).
 *
 * Tolerance per output element: 2 gamma(n) sum|x_i w_i| (comm.h), n the
 * reduction length + tp (+ 1 with a bias): both sides are within gamma(n) of
 * the exact value whatever their summation order. Colwise products come out
 * bit-identical on the cpu backend (same kernel, same order); embeddings are
 * compared exactly.
 *
 * Streaming: every tensor is cut into tasks of a few MiB; a task reads its
 * source bytes and each rank's matching shard bytes once, compares them and
 * feeds the same bytes, converted row by row to f32, to the products. Tasks
 * run on OpenMP threads in one queue ordered by tensor; a tensor is
 * finalized (collective, comparison, report rows) in queue order as soon as
 * its last task ends, so memory stays bounded by the tasks in flight. The
 * second half of a block (down_proj, o_proj) is queued a few tensors after
 * its producers and waits for their activations; since every earlier task
 * has been taken by a running thread and producers never wait, the wait
 * always ends.
 */
#include <errno.h>
#include <fnmatch.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "verify_int.h"
#include "model/provenance.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* ------------------------------------------------------------------ jobs */

static void job_free(vctx *V, vjob *J)
{
    if (J && J->srank) {
        for (int r = 0; r < V->tp; r++) free(J->srank[r]);
        free(J->srank);
    }
    if (J) {
        free(J->sref);
        free(J->slo);
        free(J->sw);
    }
    if (!J) return;
    if (J->gj) tps_gpu_job_free(V->gpu, J->gj);
    if (J->xr) {
        for (int r = 0; r < V->tp; r++)
            if (J->xr[r] != J->xref) free(J->xr[r]);
        free(J->xr);
    }
    if (J->yloc) {
        for (int r = 0; r < V->tp; r++) free(J->yloc[r]);
        free(J->yloc);
    }
    free(J->xref);
    free(J->kr);
    free(J->yref);
    free(J->sabs);
    free(J->ysh);
    free(J->ids);
    free(J);
}

static tps_err read_f32(vctx *V, tps_ckpt *ck, size_t t, int piece, uint64_t nel, float *dst);

/* A piece of a tensor of V->ck as f32: the piece on `rank` (its own rows,
 * not a replica), whole. */
static tps_err read_piece_f32(vctx *V, size_t t, int rank, float **out, uint64_t *lo,
                              uint64_t *n)
{
    const tps_ctensor *ct = &V->ck->t[t];
    int p = -1;
    for (int k = 0; k < ct->npieces && p < 0; k++)
        if (ct->pieces[k].rank == rank) p = k;
    *out = NULL;
    if (p < 0) return TPS_OK;
    uint64_t nb = ct->pieces[p].nbytes, es = tps_dtype_bits(ct->dtype) / 8;
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
    *lo = ct->dim >= 0 ? ct->pieces[p].lo : 0;
    *n = nb / es;
    return TPS_OK;
}

/* Scales of an FP8 weight unit: the source's and every local rank's. */
static tps_err load_scales(vctx *V, vunit *u, vjob *J)
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
    TPS_TRY(read_f32(V, V->src, (size_t)ssi, -1, nsref, J->sref));
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
static void dequant_row(const vjob *J, int side, uint64_t j, uint64_t col0, float *w,
                        size_t width, int dim)
{
    const float *S = side < 0 ? J->sref : J->srank[side];
    if (!S) return;
    tps_qscales sc = {.kind = (tps_qscale)J->qkind, .bn = J->bn, .bk = J->bk, .s = S,
                      .lo = side < 0 ? 0 : J->slo[side], .width = side < 0 ? J->scols : J->sw[side],
                      .d = side < 0 ? -1 : dim};
    J->qm->dequant_row(&sc, j, col0, w, width);
}

static int gpu_native(tps_dtype d)
{
    return d == TPS_BF16 || d == TPS_F16 || d == TPS_F32;
}

static tps_err job_create(vctx *V, vunit *u)
{
    const tps_ctensor *ct = u->ct;
    int tp = V->tp, batch = V->batch;
    vblock *blk = u->cons_of;
    vjob *J = calloc(1, sizeof *J);
    if (!J) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    J->batch = batch;
    J->nb = blk ? 2 * batch : batch;
    J->dtype = ct->dtype;
    J->qkind = -1;
    tps_err qe = load_scales(V, u, J);
    if (qe) {
        job_free(V, J);
        return qe;
    }
    J->op = gpu_native(ct->dtype) ? ct->dtype : TPS_F32;
    J->embed = u->nk == NK_EMB_ROWS || u->nk == NK_EMB_COLS;
    J->matmul = !J->embed;
    J->gather = u->nk == NK_COL || u->nk == NK_EMB_COLS;
    /* out: output width; in: reference reduction width */
    if (u->nk == NK_COL || u->nk == NK_ROW) {
        J->out = ct->shape[0];
        J->in = ct->shape[1];
    } else {
        J->out = ct->shape[1];
        J->in = 0;
    }
    size_t nb = (size_t)J->nb, out = J->out, in = J->in;
    int ok = 1;
    J->yref = calloc(nb * out + 1, sizeof(float));
    J->sabs = calloc(nb * out + 1, sizeof(float));
    J->ysh = calloc(nb * out + 1, sizeof(float));
    ok &= J->yref && J->sabs && J->ysh;
    if (J->embed) {
        J->ids = malloc(sizeof(uint64_t) * (size_t)batch);
        J->yloc = calloc((size_t)tp, sizeof(float *));
        ok &= J->ids && J->yloc;
        for (int r = 0; ok && r < tp; r++) {
            if (!V->local[r]) continue;
            size_t w = J->gather ? u->len[r] : out;
            J->yloc[r] = calloc(nb * w + 1, sizeof(float));
            ok &= J->yloc[r] != NULL;
        }
        if (ok)
            for (int b = 0; b < batch; b++)
                J->ids[b] = tps_input_id(V->o->seed, (uint64_t)b, ct->shape[0]);
    } else {
        J->xref = malloc((nb * in + 1) * sizeof(float));
        J->xr = calloc((size_t)tp, sizeof(float *));
        J->kr = calloc((size_t)tp, sizeof(uint64_t));
        ok &= J->xref && J->xr && J->kr;
        if (ok) {
            for (size_t b = 0; b < (size_t)batch; b++)
                for (size_t i = 0; i < in; i++)
                    J->xref[b * in + i] = tps_input_value(V->o->seed, b, i);
            if (blk)
                memcpy(J->xref + (size_t)batch * in, blk->href, (size_t)batch * in * sizeof(float));
        }
        for (int r = 0; ok && r < tp; r++) {
            if (!V->local[r]) continue;
            if (J->gather) {
                J->xr[r] = J->xref;
                J->kr[r] = in;
            } else {
                uint64_t lo = u->lo[r], len = u->len[r];
                J->kr[r] = len;
                J->xr[r] = malloc((nb * len + 1) * sizeof(float));
                if (!(ok = J->xr[r] != NULL)) break;
                for (size_t b = 0; b < (size_t)batch; b++)
                    memcpy(J->xr[r] + b * len, J->xref + b * in + lo, len * sizeof(float));
                if (blk)
                    memcpy(J->xr[r] + (size_t)batch * len, blk->hr[r],
                           (size_t)batch * len * sizeof(float));
            }
        }
        if (ok && V->backend == TPS_BACKEND_CPU) {
            J->yloc = calloc((size_t)tp, sizeof(float *));
            ok &= J->yloc != NULL;
            for (int r = 0; ok && r < tp; r++) {
                size_t w = J->gather ? u->len[r] : out;
                J->yloc[r] = calloc(nb * w + 1, sizeof(float));
                ok &= J->yloc[r] != NULL;
            }
        }
    }
    if (!ok) {
        job_free(V, J);
        return tps_fail(V->ctx, TPS_E_NOMEM, "verify: %s: out of memory for the products",
                        ct->name);
    }
    if (V->gpu && J->matmul) {
        tps_gpu_job_desc d = {
            .gather = J->gather,
            .matmul = 1,
            .tp = tp,
            .dtype = J->op,
            .out = J->out,
            .in = J->in,
            .nb = J->nb,
            .xref = J->xref,
            .xr = (const float *const *)J->xr,
            .kr = J->kr,
            .lo = u->lo,
            .len = u->len,
            .want_ref = V->want_ref,
        };
        tps_err rc = tps_gpu_job_new(V->ctx, V->gpu, &d, &J->gj);
        if (rc) {
            job_free(V, J);
            return rc;
        }
    }
    u->job = J;
    return TPS_OK;
}

/* Job of a unit, made by the first task that needs it; a block's second half
 * first waits until the block's activations exist. */
static tps_err job_get(vctx *V, vunit *u, vjob **out)
{
    *out = NULL;
    int st = atomic_load_explicit(&u->job_state, memory_order_acquire);
    if (st == 1) {
        *out = u->job;
        return TPS_OK;
    }
    if (st < 0) return TPS_E_NOMEM;
    if (u->cons_of) {
        struct timespec ts = {0, 50000};
        int rd;
        while ((rd = atomic_load_explicit(&u->cons_of->ready, memory_order_acquire)) == 0) {
            if (atomic_load(&V->err)) return V->rc ? V->rc : TPS_E_INTERRUPTED;
            nanosleep(&ts, NULL);
        }
        if (rd < 0) return V->rc ? V->rc : TPS_E_NOMEM;
    }
    pthread_mutex_lock(&u->mu);
    tps_err rc = TPS_OK;
    st = atomic_load(&u->job_state);
    if (st == 0) {
        rc = job_create(V, u);
        atomic_store_explicit(&u->job_state, rc ? -1 : 1, memory_order_release);
    } else if (st < 0) {
        rc = TPS_E_NOMEM;
    }
    pthread_mutex_unlock(&u->mu);
    if (!rc) *out = u->job;
    return rc;
}

/* which: 0 source rows, 1 rank rows, 2 the compare step's rank rows */
static tps_err grow(vctx *V, tbuf *tb, int which, size_t need)
{
    unsigned char **p = which == 2 ? &tb->cmp : which ? &tb->sh : &tb->src;
    size_t *cap = which == 2 ? &tb->cmp_cap : which ? &tb->sh_cap : &tb->src_cap;
    if (*cap >= need) return TPS_OK;
    size_t n = need < (which == 2 ? STEP : CHUNK) ? (which == 2 ? STEP : CHUNK) : need;
    if (which == 0 ? tb->pin_src : which == 1 ? tb->pin_sh : 0) {
        tps_gpu_host_free(V->gpu, *p);
        *p = tps_gpu_host_alloc(V->gpu, n);
    } else {
        free(*p);
        *p = malloc(n);
    }
    *cap = *p ? n : 0;
    return *p ? TPS_OK
              : tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory for a %zu-byte buffer", n);
}
static float *fgrow(float **p, size_t *cap, size_t n)
{
    if (*cap >= n) return *p;
    float *q = realloc(*p, (n ? n : 1) * sizeof(float));
    if (!q) return NULL;
    *p = q;
    *cap = n;
    return q;
}

#define NOT_SAME UINT64_MAX

/* Rows [row0, row0 + n) of a numeric unit's weight, for side -1 (source) or
 * rank r, as they were just read. same_col0: for a rank's rows that were
 * just found byte-identical to the source rows read in this task, the column
 * where they start in those rows (a GPU backend then reuses the staged source
 * copy); NOT_SAME otherwise. */
static tps_err job_rows(vctx *V, vunit *u, tbuf *tb, int slot, int side, uint64_t row0, uint64_t n,
                        const unsigned char *bytes, uint64_t same_col0)
{
    if (u->nk == NK_NONE || !n) return TPS_OK;
    if (side < 0 && !V->want_ref) return TPS_OK;
    if (side >= 0 && !V->local[side]) return TPS_OK;
    vjob *J;
    TPS_TRY(job_get(V, u, &J));
    tps_dtype dt = u->ct->dtype;
    size_t es = tps_va_dt_bytes(dt);
    if (J->embed) {
        uint64_t width = (side < 0 || !J->gather) ? J->out : u->len[side];
        for (uint64_t i = 0; i < n; i++) {
            uint64_t j = row0 + i;
            for (int b = 0; b < J->batch; b++) {
                if (J->ids[b] != j) continue;
                float *dst =
                    side < 0 ? J->yref + (size_t)b * J->out : J->yloc[side] + (size_t)b * width;
                if (tps_vk_to_f32(dt, bytes + i * width * es, dst, width))
                    return tps_fail(V->ctx, TPS_E_FORMAT, "verify: %s: cannot convert %s to f32",
                                    u->ct->name, tps_dtype_name(dt));
            }
        }
        return TPS_OK;
    }
    uint64_t width = side < 0 ? J->in : J->kr[side];
    if (J->gj) {
        /* quantized: each side's own scales, so no staged copy is shared */
        if (side >= 0 && same_col0 != NOT_SAME && J->qkind < 0) {
            int done = 0;
            TPS_TRY(tps_gpu_job_rows_ref(V->ctx, V->gpu, J->gj, slot, side, row0, n, same_col0,
                                         &done));
            if (done) return TPS_OK;
        }
        const void *p = bytes;
        if (J->op != dt) {
            float *c = fgrow(&tb->conv, &tb->conv_cap, (size_t)(n * width));
            if (!c) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
            if (tps_vk_to_f32(dt, bytes, c, (size_t)(n * width)))
                return tps_fail(V->ctx, TPS_E_FORMAT, "verify: %s: cannot convert %s to f32",
                                u->ct->name, tps_dtype_name(dt));
            if (J->qkind >= 0)
                for (uint64_t i = 0; i < n; i++)
                    dequant_row(J, side, row0 + i, side >= 0 && u->dim == 1 ? u->lo[side] : 0,
                                c + i * width, (size_t)width, u->dim);
            p = c;
        }
        return tps_gpu_job_rows(V->ctx, V->gpu, J->gj, slot, side, row0, n, p);
    }
    float *w = fgrow(&tb->w, &tb->w_cap, (size_t)width);
    if (!w) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    const float *X = side < 0 ? J->xref : J->xr[side];
    void (*dot)(const void *, size_t, const float *, size_t, int, float *, size_t, float *) =
        tps_vk_dot_rows;
#ifdef HAVE_DOT_BF16
    if (dt == TPS_BF16) dot = tps_vk_dot_rows_bf16;
#endif
    for (uint64_t i = 0; i < n; i++) {
        uint64_t j = row0 + i;
        const void *row = bytes + i * width * es;
        if (dot == tps_vk_dot_rows && (dt != TPS_F32 || J->qkind >= 0)) {
            if (tps_vk_to_f32(dt, row, w, (size_t)width))
                return tps_fail(V->ctx, TPS_E_FORMAT, "verify: %s: cannot convert %s to f32",
                                u->ct->name, tps_dtype_name(dt));
            if (J->qkind >= 0)
                dequant_row(J, side, j, side >= 0 && u->dim == 1 ? u->lo[side] : 0, w,
                            (size_t)width, u->dim);
            row = w;
        }
        if (side < 0)
            dot(row, (size_t)width, X, (size_t)width, J->nb, J->yref + j, (size_t)J->out,
                J->sabs + j);
        else if (J->gather)
            dot(row, (size_t)width, X, (size_t)width, J->nb, J->yloc[side] + (j - u->lo[side]),
                (size_t)u->len[side], NULL);
        else
            dot(row, (size_t)width, X, (size_t)width, J->nb, J->yloc[side] + j, (size_t)J->out,
                NULL);
    }
    return TPS_OK;
}

/* GPU backends: rank r's rows [row0, row0 + n), columns from col0, found equal
 * to the source rows this task staged: *done = 1 when the backend multiplies
 * the staged copy (or there is nothing to multiply), 0 when the caller must
 * hand the bytes over itself. */
static tps_err rows_from_source(vctx *V, vunit *u, int slot, int r, uint64_t row0, uint64_t n,
                                uint64_t col0, int *done)
{
    *done = 1;
    if (u->nk == NK_NONE || !n || !V->local[r]) return TPS_OK;
    vjob *J;
    TPS_TRY(job_get(V, u, &J));
    *done = 0;
    if (!J->gj) return TPS_OK;
    return tps_gpu_job_rows_ref(V->ctx, V->gpu, J->gj, slot, r, row0, n, col0, done);
}

/* ------------------------------------------------------------------ tasks */

static void note_diff(vunit *u, int r, const unsigned char *a, const unsigned char *b, size_t n,
                      uint64_t shard_off)
{
    uint64_t cnt = 0, first = UINT64_MAX;
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) {
            if (first == UINT64_MAX) first = shard_off + i;
            cnt++;
        }
    atomic_fetch_add(&u->diff[r], cnt);
    pthread_mutex_lock(&u->mu);
    if (first < u->first[r]) u->first[r] = first;
    pthread_mutex_unlock(&u->mu);
}

static tps_err run_task(vctx *V, vunit *u, uint64_t idx, tbuf *tb, int slot)
{
    tps_ctx *ctx = V->ctx;
    const tps_ctensor *ct = u->ct;
    int tp = V->tp;
    uint64_t got = 0;
    switch (u->mode) {
    case MODE_NONE: return TPS_OK;
    case MODE_CRC: {
        int p = 0, np = ct->npieces + ct->nreplicas;
        while (p + 1 <= np && u->crcpre[p + 1] <= idx) p++;
        if (p >= np) return TPS_OK; /* the placeholder task of a tensor with no local piece */
        uint64_t c = idx - u->crcpre[p];
        uint64_t nb = (p < ct->npieces ? &ct->pieces[p] : &ct->replicas[p - ct->npieces])->nbytes;
        uint64_t off = c * CHUNK;
        size_t len = (size_t)(nb - off < CHUNK ? nb - off : CHUNK);
        if (nb == 0) len = 0;
        TPS_TRY(grow(V, tb, 1, len));
        if (len) TPS_TRY(tps_ckpt_read_piece(ctx, V->ck, u->t, p, off, tb->sh, len));
        u->crcs[idx] = tps_crc32(0, tb->sh, len);
        u->crclen[idx] = len;
        got = len;
        break;
    }
    case MODE_REP:
    case MODE_LOGICAL: {
        uint64_t off = idx * u->chunk;
        size_t len = (size_t)(ct->nbytes - off < u->chunk ? ct->nbytes - off : u->chunk);
        TPS_TRY(grow(V, tb, 0, len));
        TPS_TRY(grow(V, tb, 1, len));
        TPS_TRY(tps_ckpt_read(ctx, V->src, (size_t)u->si, off, tb->src, len));
        if (u->mode == MODE_LOGICAL) {
            TPS_TRY(tps_ckpt_read(ctx, V->ck, u->t, off, tb->sh, len));
            got = len;
            if (memcmp(tb->src, tb->sh, len)) note_diff(u, 0, tb->src, tb->sh, len, off);
            break;
        }
        for (int r = 0; r < tp; r++) {
            if (!V->local[r] || u->piece[r] < 0) continue;
            TPS_TRY(tps_ckpt_read_piece(ctx, V->ck, u->t, u->piece[r], off, tb->sh, len));
            got += len;
            if (memcmp(tb->src, tb->sh, len)) note_diff(u, r, tb->src, tb->sh, len, off);
        }
        break;
    }
    case MODE_A: {
        uint64_t o0 = idx * u->k, kk = u->outer - o0 < u->k ? u->outer - o0 : u->k;
        size_t slen = (size_t)(kk * u->W);
        TPS_TRY(grow(V, tb, 0, slen));
        if (u->dim == 0) { /* a small tensor split by rows: one task reads it all */
            TPS_TRY(grow(V, tb, 1, slen));
            TPS_TRY(tps_ckpt_read(ctx, V->src, (size_t)u->si, 0, tb->src, slen));
            TPS_TRY(job_rows(V, u, tb, slot, -1, 0, u->nd, tb->src, NOT_SAME));
            size_t at = 0;
            for (int r = 0; r < tp; r++) {
                uint64_t wr = u->len[r] * u->inner;
                if (!V->local[r] || u->piece[r] < 0 || !wr) continue;
                unsigned char *sh = tb->sh + at;
                TPS_TRY(tps_ckpt_read_piece(ctx, V->ck, u->t, u->piece[r], 0, sh, (size_t)wr));
                got += wr;
                at += wr;
                const unsigned char *a = tb->src + u->lo[r] * u->inner;
                int same = !memcmp(a, sh, (size_t)wr);
                if (!same) note_diff(u, r, a, sh, (size_t)wr, 0);
                TPS_TRY(job_rows(V, u, tb, slot, r, u->lo[r], u->len[r], sh, same ? 0 : NOT_SAME));
            }
            for (int r = tp; r < u->nslot; r++) { /* replicas: the same bytes, compared */
                uint64_t wr = u->len[r] * u->inner;
                if (!V->local[u->slot_rank[r]] || !wr) continue;
                TPS_TRY(grow(V, tb, 2, (size_t)wr));
                TPS_TRY(tps_ckpt_read_piece(ctx, V->ck, u->t, u->piece[r], 0, tb->cmp, (size_t)wr));
                got += wr;
                const unsigned char *a = tb->src + u->lo[r] * u->inner;
                if (memcmp(a, tb->cmp, (size_t)wr)) note_diff(u, r, a, tb->cmp, (size_t)wr, 0);
            }
            break;
        }
        /* rows [o0, o0 + kk), each W bytes of which rank r holds [lo, lo + len) */
        uint64_t rs = u->W >= STEP ? 1 : STEP / u->W;
        TPS_TRY(grow(V, tb, 2, (size_t)(rs * u->W)));
        memset(tb->same, 1, (size_t)tp);
        for (uint64_t os = 0; os < kk; os += rs) {
            uint64_t ns = kk - os < rs ? kk - os : rs;
            unsigned char *src = tb->src + os * u->W;
            TPS_TRY(tps_ckpt_read(ctx, V->src, (size_t)u->si, (o0 + os) * u->W, src,
                                  (size_t)(ns * u->W)));
            if (!V->gpu) TPS_TRY(job_rows(V, u, tb, slot, -1, o0 + os, ns, src, NOT_SAME));
            for (int r = 0; r < tp; r++) {
                uint64_t wr = u->len[r] * u->inner;
                if (!V->local[r] || u->piece[r] < 0 || !wr) continue;
                TPS_TRY(tps_ckpt_read_piece(ctx, V->ck, u->t, u->piece[r], (o0 + os) * wr, tb->cmp,
                                            (size_t)(ns * wr)));
                got += ns * wr;
                for (uint64_t o = 0; o < ns; o++) {
                    const unsigned char *a = src + o * u->W + u->lo[r] * u->inner,
                                        *b = tb->cmp + o * wr;
                    if (memcmp(a, b, (size_t)wr)) {
                        note_diff(u, r, a, b, (size_t)wr, (o0 + os + o) * wr);
                        tb->same[r] = 0;
                    }
                }
                if (!V->gpu) TPS_TRY(job_rows(V, u, tb, slot, r, o0 + os, ns, tb->cmp, NOT_SAME));
            }
        }
        if (!V->gpu) break;
        /* GPU: the task's rows in one go; a rank's rows that equal the source's
         * come from the staged source rows, the others from its own bytes */
        TPS_TRY(job_rows(V, u, tb, slot, -1, o0, kk, tb->src, NOT_SAME));
        size_t at = 0;
        for (int r = 0; r < tp; r++) {
            uint64_t wr = u->len[r] * u->inner;
            if (!V->local[r] || u->piece[r] < 0 || !wr) continue;
            if (tb->same[r]) {
                int done = 0;
                TPS_TRY(rows_from_source(V, u, slot, r, o0, kk, u->lo[r], &done));
                if (done) continue;
            }
            /* room for every rank's rows at once: bytes handed over stay put
             * until the task's end */
            if (at == 0) TPS_TRY(grow(V, tb, 1, slen));
            unsigned char *sh = tb->sh + at;
            if (tb->same[r]) /* pack the equal bytes: the same rows, contiguous */
                for (uint64_t o = 0; o < kk; o++)
                    memcpy(sh + o * wr, tb->src + o * u->W + u->lo[r] * u->inner, (size_t)wr);
            else
                TPS_TRY(tps_ckpt_read_piece(ctx, V->ck, u->t, u->piece[r], o0 * wr, sh,
                                            (size_t)(kk * wr)));
            at += kk * wr;
            TPS_TRY(job_rows(V, u, tb, slot, r, o0, kk, sh, NOT_SAME));
        }
        break;
    }
    case MODE_B: {
        uint64_t o = idx / u->per_o, c = idx % u->per_o;
        int r = 0;
        while (r < u->nslot && u->segc[r + 1] <= c) r++;
        if (r >= u->nslot) return TPS_OK;
        uint64_t wr = u->len[r] * u->inner, off = (c - u->segc[r]) * u->step;
        size_t len = (size_t)(wr - off < u->step ? wr - off : u->step);
        /* a replica slot: its bytes are compared, its rank's own rows are multiplied */
        int rep = r >= tp;
        int mine = V->local[u->slot_rank[r]] && u->piece[r] >= 0;
        int need_src = mine || (!rep && u->nk != NK_NONE && V->want_ref);
        if (!need_src) return TPS_OK;
        TPS_TRY(grow(V, tb, 0, len));
        uint64_t soff = (o * u->nd + u->lo[r]) * u->inner + off, shoff = o * wr + off;
        uint64_t p0 = u->lo[r] + off / u->inner, np = len / u->inner;
        if (!mine) {
            TPS_TRY(tps_ckpt_read(ctx, V->src, (size_t)u->si, soff, tb->src, len));
            TPS_TRY(job_rows(V, u, tb, slot, -1, p0, np, tb->src, NOT_SAME));
            break;
        }
        /* steps of whole rows (the cpu backend multiplies each step while it is
         * in cache); a row longer than a step is one step */
        size_t step = len;
        if (u->inner && u->inner <= STEP && len % u->inner == 0) step = STEP / u->inner * u->inner;
        TPS_TRY(grow(V, tb, 2, step < len ? step : len));
        int same = 1;
        for (size_t a = 0; a < len; a += step) {
            size_t n = len - a < step ? len - a : step;
            TPS_TRY(tps_ckpt_read(ctx, V->src, (size_t)u->si, soff + a, tb->src + a, n));
            TPS_TRY(tps_ckpt_read_piece(ctx, V->ck, u->t, u->piece[r], shoff + a, tb->cmp, n));
            if (memcmp(tb->src + a, tb->cmp, n)) {
                note_diff(u, r, tb->src + a, tb->cmp, n, shoff + a);
                same = 0;
            }
            if (!rep && !V->gpu && step < len) {
                uint64_t q0 = p0 + a / u->inner, nq = n / u->inner;
                TPS_TRY(job_rows(V, u, tb, slot, -1, q0, nq, tb->src + a, NOT_SAME));
                TPS_TRY(job_rows(V, u, tb, slot, r, q0, nq, tb->cmp, NOT_SAME));
            }
        }
        got = len;
        if (rep) break;
        if (!V->gpu) {
            if (step == len) { /* one step: its products now */
                TPS_TRY(job_rows(V, u, tb, slot, -1, p0, np, tb->src, NOT_SAME));
                TPS_TRY(job_rows(V, u, tb, slot, r, p0, np, tb->cmp, NOT_SAME));
            }
            break;
        }
        TPS_TRY(job_rows(V, u, tb, slot, -1, p0, np, tb->src, NOT_SAME));
        if (same) { /* the rank's bytes are the source's: staged already */
            TPS_TRY(job_rows(V, u, tb, slot, r, p0, np, tb->src, u->dim == 0 ? 0 : NOT_SAME));
        } else if (step < len) {
            TPS_TRY(grow(V, tb, 1, len));
            TPS_TRY(tps_ckpt_read_piece(ctx, V->ck, u->t, u->piece[r], shoff, tb->sh, len));
            TPS_TRY(job_rows(V, u, tb, slot, r, p0, np, tb->sh, NOT_SAME));
        } else {
            TPS_TRY(job_rows(V, u, tb, slot, r, p0, np, tb->cmp, NOT_SAME));
        }
        break;
    }
    }
    atomic_fetch_add(&V->bytes, got);
    return TPS_OK;
}

/* ------------------------------------------------------------------ finalize */

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

static tps_err read_f32(vctx *V, tps_ckpt *ck, size_t t, int piece, uint64_t nel, float *dst)
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
    TPS_CHECK(read_f32(V, V->src, (size_t)u->bias_si, -1, out, bref));
    if (b->dim == 0) {
        for (int p = 0; p < b->npieces; p++) {
            const tps_piece *pc = &b->pieces[p];
            TPS_CHECK(read_f32(V, V->ck, u->bias, p, pc->hi - pc->lo, bsh + pc->lo));
        }
    } else {
        int p0 = 0;
        for (int p = 0; p < b->npieces; p++)
            if (b->pieces[p].rank == 0) p0 = p;
        TPS_CHECK(read_f32(V, V->ck, u->bias, p0, out, bsh));
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

static void block_release(vctx *V, vblock *b)
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

static tps_err finalize(vctx *V, vunit *u)
{
    tps_err rc = TPS_OK;
    const tps_ctensor *ct = u->ct;
    vblock *blk = u->cons_of;
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
    TPS_TRY(job_get(V, u, &J)); /* a tensor whose tasks fed nothing (tp ranks elsewhere) */
    TPS_CHECK(collect(V, u, J));
    if (!bias_note && V->is_root) TPS_CHECK(add_bias(V, u, J));
    if (V->is_root) {
        int batch = J->batch;
        size_t out = (size_t)J->out;
        uint64_t terms = J->in + (u->bias >= 0 && !bias_note ? 1 : 0);
        cmp_t c = {0, 0, 0, 0};
        compare(&c, J->ysh, J->yref, J->embed ? NULL : J->sabs, (size_t)batch * out, 1, 1, terms,
                V->tp);
        int ok = c.wrong == 0 && !bias_note;
        char *note = bias_note ? bias_note : NULL;
        bias_note = NULL;
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
    }
    if (!rc && u->feeds) { /* hand the outputs to the block */
        vblock *b = u->feeds;
        b->keep_sh[u->feed_slot] = J->ysh;
        J->ysh = NULL;
        if (--b->pending == 0) {
            rc = block_feed(V, b);
            atomic_store_explicit(&b->ready, rc ? -1 : 1, memory_order_release);
        }
    }
out:
    free(bias_note);
    job_free(V, u->job);
    u->job = NULL;
    if (blk) block_release(V, blk);
    return rc;
}

/* Finalizes every finished tensor that is next in queue order. */
static void drain(vctx *V)
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

static vunit *unit_of_task(vctx *V, uint64_t t)
{
    size_t a = 0, b = V->nu;
    while (b - a > 1) {
        size_t m = a + (b - a) / 2;
        if (V->order[m]->task0 <= t)
            a = m;
        else
            b = m;
    }
    return V->order[a];
}

static void work(vctx *V)
{
    tbuf tb = {0};
    /* Source rows go to the GPU from pinned memory. On one GPU a rank's rows
     * that equal them are not uploaded again (tps_gpu_job_rows_ref), so its
     * buffer stays pageable (pinning costs); with NCCL every rank off the
     * reference GPU uploads its own. */
    tb.pin_src = V->gpu != NULL;
    tb.pin_sh = V->gpu != NULL && V->backend == TPS_BACKEND_NCCL;
    tb.same = malloc((size_t)V->tp);
    if (!tb.same) {
        tps_va_set_err(V, tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory"));
        return;
    }
    int slot = 0;
#ifdef _OPENMP
    slot = omp_get_thread_num();
#endif
    for (;;) {
        if (atomic_load(&V->err)) break;
        if (V->ctx->interrupted) {
            tps_va_set_err(V, tps_fail(V->ctx, TPS_E_INTERRUPTED, "verify: interrupted"));
            break;
        }
        uint64_t t = atomic_fetch_add(&V->next, 1);
        if (t >= V->ntasks) break;
        vunit *u = unit_of_task(V, t);
        tps_err rc = run_task(V, u, t - u->task0, &tb, slot);
        /* the task's GEMMs must be done before its unit can be finished */
        if (!rc && V->gpu) rc = tps_gpu_slot_sync(V->ctx, V->gpu, slot);
        if (rc) {
            tps_va_set_err(V, rc);
            break;
        }
        if (atomic_fetch_sub(&u->left, 1) == 1) {
            atomic_store(&u->done, 1);
            drain(V);
        }
        if (slot == 0 && V->ctx->progress)
            V->ctx->progress(V->ctx->progress_user, atomic_load(&V->bytes), V->total_bytes,
                             u->ct->name);
    }
    if (tb.pin_src)
        tps_gpu_host_free(V->gpu, tb.src);
    else
        free(tb.src);
    if (tb.pin_sh)
        tps_gpu_host_free(V->gpu, tb.sh);
    else
        free(tb.sh);
    free(tb.cmp);
    free(tb.same);
    free(tb.w);
    free(tb.conv);
}

/* ------------------------------------------------------------------ entry */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void vctx_free(vctx *V)
{
    for (size_t i = 0; i < V->nu; i++) {
        vunit *u = &V->u[i];
        job_free(V, u->job);
        free(u->segc);
        free(u->crcpre);
        free(u->piece);
        free(u->lo);
        free(u->len);
        free(u->diff);
        free(u->first);
        free(u->slot_rank);
        free(u->crcs);
        free(u->crclen);
        free(u->pre);
        free(u->nk_note);
        pthread_mutex_destroy(&u->mu);
    }
    for (size_t i = 0; i < V->nblk; i++) {
        block_release(V, &V->blk[i]);
        free(V->blk[i].name);
    }
    free(V->blk);
    free(V->u);
    free(V->unit_of);
    free(V->order);
    free(V->local);
    tps_comm_free(V->comm);
    if (V->gpu) {
        char st[512];
        tps_gpu_stats(V->gpu, st, sizeof st);
        tps_log(V->ctx, TPS_LOG_INFO, "verify: %s", st);
        tps_gpu_close(V->gpu);
    }
    tps_ckpt_free(V->src);
    if (!V->lay) tps_quant_free(V->q);
    tps_layout_free(V->lay);
    tps_plan_free(V->plan);
    tps_layout_spec_free(V->spec);
    free(V->lay_piece_rt);
    tps_ckpt_free(V->ck);
    pthread_mutex_destroy(&V->fin_mu);
    pthread_mutex_destroy(&V->err_mu);
}

/* A serving layout's directory: the layout compiled again from what the
 * manifest recorded (the layout file, each tensor's style) and the
 * directory's config.json, so that every piece can be checked against where
 * the layout puts it rather than against the manifest alone. */
static tps_err expect_layout(vctx *V)
{
    tps_ctx *ctx = V->ctx;
    const tps_ckpt *ck = V->ck;
    tps_err rc = TPS_OK;
    tps_style *st = tps_xcalloc(ck->n ? ck->n : 1, sizeof *st);
    if (!st) return tps_fail(ctx, TPS_E_NOMEM, "verify: out of memory");
    size_t nse = 0;
    style_ent *se = tps_va_style_index(ck, &nse);
    for (size_t i = 0; i < ck->n; i++) {
        const char *sn = tps_va_style_of(se, nse, ck->t[i].name);
        st[i] = TPS_STYLE_REPLICATE;
        if (sn && tps_style_lookup(sn, &st[i]))
            TPS_FAIL_IF(1, ctx, TPS_E_JSON, "%s: tensor '%s': unknown style '%s' in the manifest",
                        ck->path, ck->t[i].name, sn);
    }
    if (ck->layout_text)
        TPS_CHECK(tps_lspec_parse(ctx, "the layout recorded in tpshard.json", ck->layout_text,
                                  strlen(ck->layout_text), &V->spec));
    else
        TPS_CHECK(tps_layout_spec_builtin(ctx, ck->layout_name, &V->spec));
    TPS_FAIL_IF(strcmp(V->spec->name, ck->layout_name), ctx, TPS_E_MISMATCH,
                "%s: the manifest's layout is %s but its layout file is %s", ck->path,
                ck->layout_name, V->spec->name);
    if (ck->plan_text) /* packed tensors: their sections are the plan's */
        TPS_CHECK(tps_plan_parse(ctx, "the plan recorded in tpshard.json", ck->plan_text,
                                 strlen(ck->plan_text), &V->plan));
    TPS_CHECK(tps_layout_from_styles(ctx, ck, V->plan, V->spec, V->tp, ck->layout_ep, st, &V->lay));
    TPS_FAIL_IF(V->lay->rejected, ctx, TPS_E_MISMATCH,
                "%s: layout %s would not write this model at tp %d: %s", ck->path,
                V->spec->name, V->tp, V->lay->rejected);
    V->lay_piece_rt = tps_xmalloc((V->lay->npieces ? V->lay->npieces : 1) * sizeof(int));
    TPS_FAIL_IF(!V->lay_piece_rt, ctx, TPS_E_NOMEM, "verify: out of memory");
    for (size_t k = 0; k < V->lay->nrt; k++)
        for (size_t j = 0; j < V->lay->rt[k].npieces; j++)
            V->lay_piece_rt[V->lay->rt[k].piece0 + j] = (int)k;
out:
    free(se);
    free(st);
    return rc;
}


/* Is `name` a source tensor the split's layout left out (the manifest's
 * dropped: the engine's load_weights skips it)? */
static int dropped_by_layout(const tps_ckpt *ck, const char *name)
{
    for (const cJSON *d = ck->dropped ? ck->dropped->child : NULL; d; d = d->next) {
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(d, "name");
        if (cJSON_IsString(nm) && !strcmp(nm->valuestring, name)) return 1;
    }
    return 0;
}

/* Source bytes compared with the manifest's CRC32s before the checks start:
 * the smallest tensors (norms, biases, small projections), a read of well
 * under a second. */
#define SOURCE_SAMPLE (64u << 20)

/* A directory that split --ranks runs have not filled: one error naming the
 * missing ranks (TPS_E_PARTIAL, as check's exit status 3), not a failed row
 * per tensor. */
static tps_err refuse_partial(tps_ctx *ctx, const tps_ckpt *ck, const char *dir)
{
    char miss[256] = "";
    size_t ml = 0;
    int present = 0;
    for (int r = 0; r < ck->tp; r++) {
        if (ck->rank_present[r]) {
            present++;
            continue;
        }
        int w = snprintf(miss + ml, sizeof miss - ml, "%s%d", ml ? "," : "", r);
        if (w > 0 && ml + (size_t)w < sizeof miss) ml += (size_t)w;
    }
    if (present == ck->tp) return TPS_OK;
    return tps_fail(ctx, TPS_E_PARTIAL,
                    "%s: partial: rank%s %s %s not written here yet (split --ranks; %d of %d "
                    "ranks present): verify needs every rank",
                    dir, strchr(miss, ',') ? "s" : "", miss, strchr(miss, ',') ? "are" : "is",
                    present, ck->tp);
}

/* Shards that differ from the source although they hold exactly the bytes
 * the manifest's CRC32s record: the source is not the checkpoint that was
 * split (same names, shapes and sizes, other values: a fine-tune, another
 * revision). One error naming the first such tensor replaces the report. */
static tps_err blame_source(vctx *V)
{
    for (size_t i = 0; i < V->nu; i++) {
        const vunit *u = &V->u[i];
        int differs = 0;
        for (int s = 0; s < u->nslot && !differs; s++) differs = atomic_load(&u->diff[s]) != 0;
        if (!differs || u->pre) continue;
        int intact = 0;
        TPS_TRY(tps_prov_tensor_intact(V->ctx, V->ck, u->t, &intact));
        if (intact)
            return tps_fail(V->ctx, TPS_E_MISMATCH,
                            "verify: %s is not the checkpoint %s was split from (its manifest "
                            "records the source): tensor '%s' differs there from the bytes split "
                            "(the rank files hold what the manifest's CRC32s record)",
                            V->o->source, V->o->dir, u->ct->derived_from ? u->ct->derived_from
                                                                        : u->ct->name);
    }
    return TPS_OK;
}

tps_err tps_verify(tps_ctx *ctx, const tps_verify_opts *o, tps_verify_report **out)
{
    if (out) *out = NULL;
    if (!ctx || !o || !out || !o->dir)
        return tps_fail(ctx, TPS_E_ARG, "verify: no directory given");
    if (o->batch < 1 || o->batch > MAX_BATCH)
        return tps_fail(ctx, TPS_E_ARG, "verify: batch %d out of range 1..%d", o->batch, MAX_BATCH);
    if (o->backend != TPS_BACKEND_CPU && o->backend != TPS_BACKEND_CUDA &&
        o->backend != TPS_BACKEND_NCCL)
        return tps_fail(ctx, TPS_E_ARG, "verify: unknown backend %d", (int)o->backend);
    double t0 = now_s();
    vctx V0, *V = &V0;
    memset(V, 0, sizeof *V);
    V->ctx = ctx;
    V->o = o;
    V->backend = o->backend;
    V->batch = o->batch;
    pthread_mutex_init(&V->fin_mu, NULL);
    pthread_mutex_init(&V->err_mu, NULL);
    atomic_init(&V->next, 0);
    atomic_init(&V->bytes, 0);
    atomic_init(&V->err, 0);
    tps_err rc = TPS_OK;
    style_ent *se = NULL;
    size_t nse = 0;
    tps_verify_report *R = calloc(1, sizeof *R);
    if (!R) {
        rc = tps_fail(ctx, TPS_E_NOMEM, "verify: out of memory");
        goto out;
    }
    R->ok = 1;
    V->R = R;
    TPS_CHECK(tps_ckpt_open_path(ctx, o->dir, &V->ck));
    TPS_FAIL_IF(
        tps_ckpt_kind(V->ck) != TPS_SRC_SHARDED, ctx, TPS_E_ARG,
        "%s: not a tpshard output directory (no %s): verify takes what `tpshard split` wrote",
        o->dir, TPS_MANIFEST);
    V->tp = V->ck->tp;
    TPS_FAIL_IF(V->tp < 1, ctx, TPS_E_FORMAT, "%s: the manifest gives tp %d", o->dir, V->tp);
    TPS_CHECK(refuse_partial(ctx, V->ck, o->dir));
    if (V->ck->layout_target) TPS_CHECK(expect_layout(V));
    /* FP8 weights: the products dequantize them (the layout has read it already) */
    if (V->lay) V->q = V->lay->q;
    else TPS_CHECK(tps_quant_open(ctx, V->ck, &V->q));
    if (o->source) {
        TPS_CHECK(tps_ckpt_open(ctx, o->source, &V->src));
        /* another checkpoint than the one split: said first, not as a row per tensor */
        TPS_CHECK(tps_prov_source(ctx, V->ck, V->src));
        TPS_CHECK(tps_prov_source_sample(ctx, V->ck, V->src, SOURCE_SAMPLE));
    }
    int nth = tps_threads(ctx);
    if (nth < 1) nth = 1;
    V->local = malloc((size_t)V->tp);
    TPS_FAIL_IF(!V->local, ctx, TPS_E_NOMEM, "verify: out of memory");
    memset(V->local, 1, (size_t)V->tp);
    V->is_root = 1;
    if (o->backend == TPS_BACKEND_CPU) {
        V->comm = tps_comm_cpu_new(V->tp);
        TPS_FAIL_IF(!V->comm, ctx, TPS_E_NOMEM, "verify: out of memory");
        R->backend = tps_asprintf("cpu (%d thread%s)", nth, nth == 1 ? "" : "s");
    } else {
        double t1 = now_s();
        TPS_CHECK(tps_gpu_open(ctx, o->backend, V->tp, nth, o->nccl_id_file, &V->gpu));
        R->setup_seconds = now_s() - t1;
        tps_gpu_local_ranks(V->gpu, V->local);
        V->is_root = tps_gpu_is_root(V->gpu);
        R->backend = tps_strdup(tps_gpu_describe(V->gpu));
    }
    V->want_ref = V->is_root;
    TPS_FAIL_IF(!R->backend, ctx, TPS_E_NOMEM, "verify: out of memory");

    /* the tensors to check */
    size_t npacked = 0; /* packed tensors, checked on their own (verify_packed.c) */
    size_t nt = V->ck->n;
    V->u = calloc(nt ? nt : 1, sizeof *V->u);
    V->unit_of = malloc(sizeof(int) * (nt ? nt : 1));
    TPS_FAIL_IF(!V->u || !V->unit_of, ctx, TPS_E_NOMEM, "verify: out of memory");
    for (size_t i = 0; i < nt; i++) {
        V->unit_of[i] = -1;
        if (o->tensors_glob && fnmatch(o->tensors_glob, V->ck->t[i].name, 0) != 0) continue;
        if (tps_vp_is_packed(V, i)) {
            TPS_CHECK(tps_vp_check(V, i));
            npacked++;
            continue;
        }
        vunit *u = &V->u[V->nu];
        u->t = i;
        u->ct = &V->ck->t[i];
        V->unit_of[i] = (int)V->nu++;
        TPS_CHECK(tps_va_analyze_unit(V, u));
    }
    TPS_FAIL_IF(o->tensors_glob && V->nu == 0 && npacked == 0, ctx, TPS_E_ARG,
                "verify: --tensors '%s' matches no tensor in %s", o->tensors_glob, o->dir);
    se = tps_va_style_index(V->ck, &nse);
    for (size_t i = 0; i < V->nu; i++) tps_va_classify(V, &V->u[i], se, nse);
    TPS_CHECK(tps_va_find_blocks(V));
    TPS_CHECK(tps_va_build_order(V));
    for (size_t i = 0; i < V->nu; i++) {
        const vunit *u = &V->u[i];
        for (int r = 0; r < u->nslot; r++)
            if (V->local[u->slot_rank[r]] && u->piece[r] >= 0)
                V->total_bytes += tps_va_slot_piece(u, r)->nbytes;
    }
    if (!V->src)
        tps_log(ctx, TPS_LOG_INFO,
                "verify: no --source: checking CRC32s against the manifest; the "
                "numeric checks need --source MODEL");

    if (V->nu) {
        /* GPU slots are per thread: keep the team at the size given to the backend */
#ifdef _OPENMP
#pragma omp parallel num_threads(nth)
#endif
        work(V);
        drain(V);
    }
    if (atomic_load(&V->err)) {
        rc = V->rc ? V->rc : TPS_E_INTERRUPTED;
        goto out;
    }
    TPS_FAIL_IF(V->next_final != V->nu, ctx, TPS_E_IO, "verify: %zu tensors left unfinished",
                V->nu - V->next_final);
    /* a serving layout's other bytes: zero padding, the engine's constants */
    if (V->ck->nrts && !o->tensors_glob) {
        size_t nz = 0;
        for (size_t k = 0; k < V->ck->nrts; k++)
            for (size_t j = 0; j < V->ck->rts[k].nfills; j++)
                nz += V->ck->rts[k].fills[j].kind != TPS_FILL_SOURCE;
        tps_err fe = tps_check_fills(ctx, V->ck);
        TPS_FAIL_IF(fe && fe != TPS_E_MISMATCH, ctx, fe, "%s", tps_ctx_errmsg(ctx));
        TPS_FAIL_IF(tps_va_rep_add(R, "padding and constants", "padding", 0, 0, fe ? 1 : 0, nz, !fe,
                            fe ? tps_strdup(tps_ctx_errmsg(ctx)) : NULL),
                    ctx, TPS_E_NOMEM, "verify: out of memory");
    }
    /* source tensors the shards lack */
    if (V->src) {
        for (size_t i = 0; i < V->src->n; i++) {
            const char *nm = V->src->t[i].name;
            if (o->tensors_glob && fnmatch(o->tensors_glob, nm, 0) != 0) continue;
            if (tps_ckpt_find(V->ck, nm) >= 0 || dropped_by_layout(V->ck, nm)) continue;
            TPS_FAIL_IF(tps_va_rep_add(R, nm, "reconstruct", 0, 0, V->src->t[i].nbytes,
                                V->src->t[i].nbytes, 0,
                                tps_strdup("in the source but missing from the shards")),
                        ctx, TPS_E_NOMEM, "verify: out of memory");
        }
    }
    if (V->src && !R->ok) TPS_CHECK(blame_source(V));
    if (V->gpu) {
        uint64_t bad = R->ok ? 0 : 1;
        TPS_CHECK(tps_gpu_sum_u64(ctx, V->gpu, &bad));
        if (bad) R->ok = 0;
    }
    R->bytes = atomic_load(&V->bytes);
    R->seconds = now_s() - t0;
    *out = R;
    R = NULL;
out:
    free(se);
    vctx_free(V);
    tps_verify_report_free(R);
    return rc;
}
