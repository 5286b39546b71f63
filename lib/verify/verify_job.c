/* verify_job.c - a numeric unit's job: the state of its products (seeded
 * inputs, reference and rank outputs, the GPU job), made by the first task
 * that needs it, and the rows each task hands to it (tps_vj_rows: converted,
 * dequantized and multiplied on the cpu backend, uploaded on a GPU one). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "verify_int.h"

void tps_vj_free(vctx *V, vjob *J)
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

static int gpu_native(tps_dtype d)
{
    return d == TPS_BF16 || d == TPS_F16 || d == TPS_F32;
}

/* An embedding's buffers: the seeded token ids and each local rank's output
 * rows. 0: out of memory. */
static int job_embed_bufs(vctx *V, vunit *u, vjob *J)
{
    int tp = V->tp, batch = J->batch, ok = 1;
    size_t nb = (size_t)J->nb, out = J->out;
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
            J->ids[b] = tps_input_id(V->o->seed, (uint64_t)b, u->ct->shape[0]);
    return ok;
}

/* A Linear's inputs: the seeded rows (then, for a block's second half, the
 * block's activations), each local rank's columns of them (rowwise) or all
 * of them (colwise), and on the cpu backend every rank's outputs. 0: out of
 * memory. */
static int job_matmul_bufs(vctx *V, vunit *u, vjob *J)
{
    int tp = V->tp, batch = J->batch, ok = 1;
    vblock *blk = u->cons_of;
    size_t nb = (size_t)J->nb, out = J->out, in = J->in;
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
    return ok;
}

/* A Linear's GPU job, fed by the tasks' rows. */
static tps_err job_gpu(vctx *V, vunit *u, vjob *J)
{
    tps_gpu_job_desc d = {
        .gather = J->gather,
        .matmul = 1,
        .tp = V->tp,
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
    return tps_gpu_job_new(V->ctx, V->gpu, &d, &J->gj);
}

static tps_err job_create(vctx *V, vunit *u)
{
    const tps_ctensor *ct = u->ct;
    int batch = V->batch;
    vblock *blk = u->cons_of;
    vjob *J = calloc(1, sizeof *J);
    if (!J) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    J->batch = batch;
    J->nb = blk ? 2 * batch : batch;
    J->dtype = ct->dtype;
    J->qkind = -1;
    tps_err qe = tps_vs_load_scales(V, u, J);
    if (qe) {
        tps_vj_free(V, J);
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
    size_t nb = (size_t)J->nb, out = J->out;
    int ok = 1;
    J->yref = calloc(nb * out + 1, sizeof(float));
    J->sabs = calloc(nb * out + 1, sizeof(float));
    J->ysh = calloc(nb * out + 1, sizeof(float));
    ok &= J->yref && J->sabs && J->ysh;
    if (J->embed)
        ok = ok && job_embed_bufs(V, u, J);
    else
        ok = ok && job_matmul_bufs(V, u, J);
    if (!ok) {
        tps_vj_free(V, J);
        return tps_fail(V->ctx, TPS_E_NOMEM, "verify: %s: out of memory for the products",
                        ct->name);
    }
    if (V->gpu && J->matmul) {
        tps_err rc = job_gpu(V, u, J);
        if (rc) {
            tps_vj_free(V, J);
            return rc;
        }
    }
    u->job = J;
    return TPS_OK;
}

/* Job of a unit, made by the first task that needs it; a block's second half
 * first waits until the block's activations exist. */
tps_err tps_vj_get(vctx *V, vunit *u, vjob **out)
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

static float *fgrow(float **p, size_t *cap, size_t n)
{
    if (*cap >= n) return *p;
    float *q = realloc(*p, (n ? n : 1) * sizeof(float));
    if (!q) return NULL;
    *p = q;
    *cap = n;
    return q;
}


/* Rows [row0, row0 + n) of a numeric unit's weight, for side -1 (source) or
 * rank r, as they were just read. same_col0: for a rank's rows that were
 * just found byte-identical to the source rows read in this task, the column
 * where they start in those rows (a GPU backend then reuses the staged source
 * copy); NOT_SAME otherwise. */
tps_err tps_vj_rows(vctx *V, vunit *u, tbuf *tb, int slot, int side, uint64_t row0, uint64_t n,
                    const unsigned char *bytes, uint64_t same_col0)
{
    if (u->nk == NK_NONE || !n) return TPS_OK;
    if (side < 0 && !V->want_ref) return TPS_OK;
    if (side >= 0 && !V->local[side]) return TPS_OK;
    vjob *J;
    TPS_TRY(tps_vj_get(V, u, &J));
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
                    tps_vs_dequant_row(J, side, row0 + i,
                                       side >= 0 && u->dim == 1 ? u->lo[side] : 0, c + i * width,
                                       (size_t)width, u->dim);
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
                tps_vs_dequant_row(J, side, j, side >= 0 && u->dim == 1 ? u->lo[side] : 0, w,
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
tps_err tps_vj_rows_from_source(vctx *V, vunit *u, int slot, int r, uint64_t row0, uint64_t n,
                                uint64_t col0, int *done)
{
    *done = 1;
    if (u->nk == NK_NONE || !n || !V->local[r]) return TPS_OK;
    vjob *J;
    TPS_TRY(tps_vj_get(V, u, &J));
    *done = 0;
    if (!J->gj) return TPS_OK;
    return tps_gpu_job_rows_ref(V->ctx, V->gpu, J->gj, slot, r, row0, n, col0, done);
}
