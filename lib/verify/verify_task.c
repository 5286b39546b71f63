/* verify_task.c - the task runner: each OpenMP thread takes the next task of
 * the queue, reads its source bytes and every local rank's matching shard
 * bytes, compares them (counting differing bytes) and hands the same bytes
 * to the unit's job; the last task of a tensor finalizes what is next in
 * queue order (verify_finalize.c). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "verify_int.h"

#ifdef _OPENMP
#include <omp.h>
#endif

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

/* MODE_CRC: one chunk of one piece (or replica), its CRC32 kept for
 * crc_row to combine. */
static tps_err task_crc(vctx *V, vunit *u, uint64_t idx, tbuf *tb, uint64_t *got)
{
    const tps_ctensor *ct = u->ct;
    int p = 0, np = ct->npieces + ct->nreplicas;
    while (p + 1 <= np && u->crcpre[p + 1] <= idx) p++;
    if (p >= np) return TPS_OK; /* the placeholder task of a tensor with no local piece */
    uint64_t c = idx - u->crcpre[p];
    uint64_t nb = (p < ct->npieces ? &ct->pieces[p] : &ct->replicas[p - ct->npieces])->nbytes;
    uint64_t off = c * CHUNK;
    size_t len = (size_t)(nb - off < CHUNK ? nb - off : CHUNK);
    if (nb == 0) len = 0;
    TPS_TRY(grow(V, tb, 1, len));
    if (len) TPS_TRY(tps_ckpt_read_piece(V->ctx, V->ck, u->t, p, off, tb->sh, len));
    u->crcs[idx] = tps_crc32(0, tb->sh, len);
    u->crclen[idx] = len;
    *got = len;
    return TPS_OK;
}

/* MODE_REP, MODE_LOGICAL: one chunk of a whole tensor, compared with the
 * source on every local rank that holds it (or, gathered, once). */
static tps_err task_whole(vctx *V, vunit *u, uint64_t idx, tbuf *tb, uint64_t *got)
{
    tps_ctx *ctx = V->ctx;
    const tps_ctensor *ct = u->ct;
    uint64_t off = idx * u->chunk;
    size_t len = (size_t)(ct->nbytes - off < u->chunk ? ct->nbytes - off : u->chunk);
    TPS_TRY(grow(V, tb, 0, len));
    TPS_TRY(grow(V, tb, 1, len));
    TPS_TRY(tps_ckpt_read(ctx, V->src, (size_t)u->si, off, tb->src, len));
    if (u->mode == MODE_LOGICAL) {
        TPS_TRY(tps_ckpt_read(ctx, V->ck, u->t, off, tb->sh, len));
        *got = len;
        if (memcmp(tb->src, tb->sh, len)) note_diff(u, 0, tb->src, tb->sh, len, off);
        return TPS_OK;
    }
    for (int r = 0; r < V->tp; r++) {
        if (!V->local[r] || u->piece[r] < 0) continue;
        TPS_TRY(tps_ckpt_read_piece(ctx, V->ck, u->t, u->piece[r], off, tb->sh, len));
        *got += len;
        if (memcmp(tb->src, tb->sh, len)) note_diff(u, r, tb->src, tb->sh, len, off);
    }
    return TPS_OK;
}

/* MODE_A, a small tensor split by rows: one task reads it all, the source
 * and every rank's rows, and compares the replicas too. */
static tps_err task_rows_all(vctx *V, vunit *u, tbuf *tb, int slot, size_t slen, uint64_t *got)
{
    tps_ctx *ctx = V->ctx;
    int tp = V->tp;
    TPS_TRY(grow(V, tb, 1, slen));
    TPS_TRY(tps_ckpt_read(ctx, V->src, (size_t)u->si, 0, tb->src, slen));
    TPS_TRY(tps_vj_rows(V, u, tb, slot, -1, 0, u->nd, tb->src, NOT_SAME));
    size_t at = 0;
    for (int r = 0; r < tp; r++) {
        uint64_t wr = u->len[r] * u->inner;
        if (!V->local[r] || u->piece[r] < 0 || !wr) continue;
        unsigned char *sh = tb->sh + at;
        TPS_TRY(tps_ckpt_read_piece(ctx, V->ck, u->t, u->piece[r], 0, sh, (size_t)wr));
        *got += wr;
        at += wr;
        const unsigned char *a = tb->src + u->lo[r] * u->inner;
        int same = !memcmp(a, sh, (size_t)wr);
        if (!same) note_diff(u, r, a, sh, (size_t)wr, 0);
        TPS_TRY(tps_vj_rows(V, u, tb, slot, r, u->lo[r], u->len[r], sh, same ? 0 : NOT_SAME));
    }
    for (int r = tp; r < u->nslot; r++) { /* replicas: the same bytes, compared */
        uint64_t wr = u->len[r] * u->inner;
        if (!V->local[u->slot_rank[r]] || !wr) continue;
        TPS_TRY(grow(V, tb, 2, (size_t)wr));
        TPS_TRY(tps_ckpt_read_piece(ctx, V->ck, u->t, u->piece[r], 0, tb->cmp, (size_t)wr));
        *got += wr;
        const unsigned char *a = tb->src + u->lo[r] * u->inner;
        if (memcmp(a, tb->cmp, (size_t)wr)) note_diff(u, r, a, tb->cmp, (size_t)wr, 0);
    }
    return TPS_OK;
}

/* MODE_A: rows [o0, o0 + kk), each W bytes of which rank r holds [lo, lo +
 * len), read and compared in cache-sized steps; the cpu backend multiplies
 * each step while it is in cache. tb->same[r]: rank r's rows all equal the
 * source's. */
static tps_err task_rows_steps(vctx *V, vunit *u, tbuf *tb, int slot, uint64_t o0, uint64_t kk,
                               uint64_t *got)
{
    tps_ctx *ctx = V->ctx;
    int tp = V->tp;
    uint64_t rs = u->W >= STEP ? 1 : STEP / u->W;
    TPS_TRY(grow(V, tb, 2, (size_t)(rs * u->W)));
    memset(tb->same, 1, (size_t)tp);
    for (uint64_t os = 0; os < kk; os += rs) {
        uint64_t ns = kk - os < rs ? kk - os : rs;
        unsigned char *src = tb->src + os * u->W;
        TPS_TRY(tps_ckpt_read(ctx, V->src, (size_t)u->si, (o0 + os) * u->W, src,
                              (size_t)(ns * u->W)));
        if (!V->gpu) TPS_TRY(tps_vj_rows(V, u, tb, slot, -1, o0 + os, ns, src, NOT_SAME));
        for (int r = 0; r < tp; r++) {
            uint64_t wr = u->len[r] * u->inner;
            if (!V->local[r] || u->piece[r] < 0 || !wr) continue;
            TPS_TRY(tps_ckpt_read_piece(ctx, V->ck, u->t, u->piece[r], (o0 + os) * wr, tb->cmp,
                                        (size_t)(ns * wr)));
            *got += ns * wr;
            for (uint64_t o = 0; o < ns; o++) {
                const unsigned char *a = src + o * u->W + u->lo[r] * u->inner,
                                    *b = tb->cmp + o * wr;
                if (memcmp(a, b, (size_t)wr)) {
                    note_diff(u, r, a, b, (size_t)wr, (o0 + os + o) * wr);
                    tb->same[r] = 0;
                }
            }
            if (!V->gpu) TPS_TRY(tps_vj_rows(V, u, tb, slot, r, o0 + os, ns, tb->cmp, NOT_SAME));
        }
    }
    return TPS_OK;
}

/* MODE_A on a GPU backend: the task's rows in one go; a rank's rows that
 * equal the source's come from the staged source rows, the others from its
 * own bytes. */
static tps_err task_rows_gpu(vctx *V, vunit *u, tbuf *tb, int slot, uint64_t o0, uint64_t kk,
                             size_t slen)
{
    TPS_TRY(tps_vj_rows(V, u, tb, slot, -1, o0, kk, tb->src, NOT_SAME));
    size_t at = 0;
    for (int r = 0; r < V->tp; r++) {
        uint64_t wr = u->len[r] * u->inner;
        if (!V->local[r] || u->piece[r] < 0 || !wr) continue;
        if (tb->same[r]) {
            int done = 0;
            TPS_TRY(tps_vj_rows_from_source(V, u, slot, r, o0, kk, u->lo[r], &done));
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
            TPS_TRY(tps_ckpt_read_piece(V->ctx, V->ck, u->t, u->piece[r], o0 * wr, sh,
                                        (size_t)(kk * wr)));
        at += kk * wr;
        TPS_TRY(tps_vj_rows(V, u, tb, slot, r, o0, kk, sh, NOT_SAME));
    }
    return TPS_OK;
}

/* MODE_A: task idx, k whole rows of the tensor (k W-byte rows of its outer
 * dims). */
static tps_err task_rows(vctx *V, vunit *u, uint64_t idx, tbuf *tb, int slot, uint64_t *got)
{
    uint64_t o0 = idx * u->k, kk = u->outer - o0 < u->k ? u->outer - o0 : u->k;
    size_t slen = (size_t)(kk * u->W);
    TPS_TRY(grow(V, tb, 0, slen));
    if (u->dim == 0) return task_rows_all(V, u, tb, slot, slen, got);
    TPS_TRY(task_rows_steps(V, u, tb, slot, o0, kk, got));
    if (!V->gpu) return TPS_OK;
    return task_rows_gpu(V, u, tb, slot, o0, kk, slen);
}

/* MODE_B: task idx, one step of one slot's rows within outer index o. */
static tps_err task_segment(vctx *V, vunit *u, uint64_t idx, tbuf *tb, int slot, uint64_t *got)
{
    tps_ctx *ctx = V->ctx;
    int tp = V->tp;
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
        TPS_TRY(tps_vj_rows(V, u, tb, slot, -1, p0, np, tb->src, NOT_SAME));
        return TPS_OK;
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
            TPS_TRY(tps_vj_rows(V, u, tb, slot, -1, q0, nq, tb->src + a, NOT_SAME));
            TPS_TRY(tps_vj_rows(V, u, tb, slot, r, q0, nq, tb->cmp, NOT_SAME));
        }
    }
    *got = len;
    if (rep) return TPS_OK;
    if (!V->gpu) {
        if (step == len) { /* one step: its products now */
            TPS_TRY(tps_vj_rows(V, u, tb, slot, -1, p0, np, tb->src, NOT_SAME));
            TPS_TRY(tps_vj_rows(V, u, tb, slot, r, p0, np, tb->cmp, NOT_SAME));
        }
        return TPS_OK;
    }
    TPS_TRY(tps_vj_rows(V, u, tb, slot, -1, p0, np, tb->src, NOT_SAME));
    if (same) { /* the rank's bytes are the source's: staged already */
        TPS_TRY(tps_vj_rows(V, u, tb, slot, r, p0, np, tb->src, u->dim == 0 ? 0 : NOT_SAME));
    } else if (step < len) {
        TPS_TRY(grow(V, tb, 1, len));
        TPS_TRY(tps_ckpt_read_piece(ctx, V->ck, u->t, u->piece[r], shoff, tb->sh, len));
        TPS_TRY(tps_vj_rows(V, u, tb, slot, r, p0, np, tb->sh, NOT_SAME));
    } else {
        TPS_TRY(tps_vj_rows(V, u, tb, slot, r, p0, np, tb->cmp, NOT_SAME));
    }
    return TPS_OK;
}

/* Task idx of unit u, by the unit's reading plan (verify_analysis.c). */
static tps_err run_task(vctx *V, vunit *u, uint64_t idx, tbuf *tb, int slot)
{
    uint64_t got = 0;
    switch (u->mode) {
    case MODE_NONE: return TPS_OK;
    case MODE_CRC: TPS_TRY(task_crc(V, u, idx, tb, &got)); break;
    case MODE_REP:
    case MODE_LOGICAL: TPS_TRY(task_whole(V, u, idx, tb, &got)); break;
    case MODE_A: TPS_TRY(task_rows(V, u, idx, tb, slot, &got)); break;
    case MODE_B: TPS_TRY(task_segment(V, u, idx, tb, slot, &got)); break;
    }
    atomic_fetch_add(&V->bytes, got);
    return TPS_OK;
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

void tps_vt_work(vctx *V)
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
            tps_vf_drain(V);
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
