/* verify_gpu_jobs.cu - the jobs of the GPU backends: a job's operands
 * uploaded (its input rows in the operand dtype, and their magnitudes for
 * the tolerance), every rank's weight rows staged and their cublasGemmEx
 * queued on a slot's stream, the reference product, the collectives that
 * finish a job, and the counters verify reports. */
#include "verify_gpu_int.h"

/* ------------------------------------------------------------------ kernels */

__global__ void k_abs16(uint16_t *dst, const uint16_t *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i] & 0x7fffu;
}
__global__ void k_abs32(uint32_t *dst, const uint32_t *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i] & 0x7fffffffu;
}

/* ------------------------------------------------------------------ jobs */

static cudaDataType_t cuda_type(tps_dtype d)
{
    return d == TPS_BF16 ? CUDA_R_16BF : d == TPS_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* A copy on the device's own stream, waited for with the deadline. */
static tps_err copy_wait(tps_ctx *ctx, tps_gpu *g, int dev, void *dst, const void *src, size_t n,
                         cudaMemcpyKind kind)
{
    if (!n) return TPS_OK;
    CUDA_TRY(ctx, cudaSetDevice(dev));
    cudaStream_t s = g->cstream[(size_t)dev_index(g, dev)];
    CUDA_TRY(ctx, cudaMemcpyAsync(dst, src, n, kind, s));
    return stream_wait(ctx, g, s, "cudaMemcpyAsync");
}

/* f32 host values (exact in the operand dtype) -> operand dtype, abs when asked. */
static void to_operand(tps_dtype op, const float *src, void *dst, size_t n, int absval)
{
    for (size_t i = 0; i < n; i++) {
        float v = absval ? fabsf(src[i]) : src[i];
        if (op == TPS_BF16)
            ((__nv_bfloat16 *)dst)[i] = __float2bfloat16_rn(v);
        else if (op == TPS_F16)
            ((__half *)dst)[i] = __float2half_rn(v);
        else
            ((float *)dst)[i] = v;
    }
}

static tps_err upload_operand(tps_ctx *ctx, tps_gpu *g, tps_gpu_job *j, int dev, tps_dtype op,
                              const float *src, size_t n, int absval, void **out)
{
    size_t es = op == TPS_F32 ? 4 : 2;
    TPS_TRY(job_alloc(ctx, g, j, dev, n * es, out));
    if (!n) return TPS_OK;
    std::vector<unsigned char> host(n * es);
    to_operand(op, src, host.data(), n, absval);
    /* from pageable memory the copy is staged before cudaMemcpyAsync returns,
     * so `host` may go; tps_gpu_job_new waits once for every upload */
    CUDA_TRY(ctx, cudaSetDevice(dev));
    CUDA_TRY(ctx, cudaMemcpyAsync(*out, host.data(), n * es, cudaMemcpyHostToDevice,
                                  g->cstream[(size_t)dev_index(g, dev)]));
    return TPS_OK;
}

extern "C" void tps_gpu_job_free(tps_gpu *g, tps_gpu_job *j)
{
    if (!j) return;
    for (size_t i = 0; i < j->held.size(); i++)
        dev_release(g, j->held[i].dev, j->held[i].p, j->held[i].n);
    delete j;
}

extern "C" tps_err tps_gpu_job_new(tps_ctx *ctx, tps_gpu *g, const tps_gpu_job_desc *d,
                                   tps_gpu_job **out)
{
    *out = NULL;
    if (d->tp != g->tp)
        return tps_fail(ctx, TPS_E_ARG, "gpu job: tp %d, backend tp %d", d->tp, g->tp);
    if (d->matmul && d->dtype != TPS_BF16 && d->dtype != TPS_F16 && d->dtype != TPS_F32)
        return tps_fail(ctx, TPS_E_ARG, "gpu job: operand dtype %s", tps_dtype_name(d->dtype));
    if (d->out > INT32_MAX || d->in > INT32_MAX || d->nb < 1)
        return tps_fail(ctx, TPS_E_ARG, "gpu job: %llu x %llu is beyond cuBLAS's int dimensions",
                        (unsigned long long)d->out, (unsigned long long)d->in);
    tps_gpu_job *j = new tps_gpu_job();
    j->gather = d->gather;
    j->matmul = d->matmul;
    j->tp = d->tp;
    j->nb = d->nb;
    j->want_ref = d->want_ref && d->matmul;
    j->op = d->dtype;
    j->es = d->dtype == TPS_F32 ? 4 : 2;
    j->out = d->out;
    j->in = d->in;
    size_t tp = (size_t)d->tp, nb = (size_t)d->nb;
    j->lo.assign(d->lo, d->lo + tp);
    j->len.assign(d->len, d->len + tp);
    j->kr.assign(tp, 0);
    if (d->kr) j->kr.assign(d->kr, d->kr + tp);
    j->ld.assign(tp, 0);
    j->dx.assign(tp, NULL);
    j->dy.assign(tp, NULL);
    j->dres.assign(tp, NULL);
    j->dxref = j->dxabs = NULL;
    j->dyref = j->dsabs = NULL;
    tps_err rc = TPS_OK;
    for (size_t l = 0; l < g->local.size() && !rc; l++) {
        int r = g->local[l], dev = g->dev_of_rank[(size_t)r];
        j->ld[(size_t)r] = j->gather ? j->len[(size_t)r] : j->out;
        void *p = NULL;
        rc = job_alloc(ctx, g, j, dev, nb * (size_t)j->ld[(size_t)r] * sizeof(float), &p);
        j->dy[(size_t)r] = (float *)p;
        /* NCCL delivers the result on every rank; on one GPU one copy does */
        if (!rc && (g->kind == TPS_BACKEND_NCCL || l == 0)) {
            rc = job_alloc(ctx, g, j, dev, nb * (size_t)j->out * sizeof(float), &p);
            j->dres[(size_t)r] = (float *)p;
        }
        if (!rc && d->matmul) {
            if (!d->xr || !d->xr[r])
                rc = tps_fail(ctx, TPS_E_ARG, "gpu job: no inputs for rank %d", r);
            else
                rc = upload_operand(ctx, g, j, dev, j->op, d->xr[r], nb * (size_t)j->kr[(size_t)r],
                                    0, &j->dx[(size_t)r]);
        }
    }
    if (!rc && j->want_ref) {
        void *p = NULL;
        rc =
            upload_operand(ctx, g, j, g->ref_dev, j->op, d->xref, nb * (size_t)j->in, 0, &j->dxref);
        if (!rc)
            rc = upload_operand(ctx, g, j, g->ref_dev, j->op, d->xref, nb * (size_t)j->in, 1,
                                &j->dxabs);
        if (!rc) rc = job_alloc(ctx, g, j, g->ref_dev, nb * (size_t)j->out * sizeof(float), &p);
        j->dyref = (float *)p;
        if (!rc) rc = job_alloc(ctx, g, j, g->ref_dev, nb * (size_t)j->out * sizeof(float), &p);
        j->dsabs = (float *)p;
    }
    /* the zeroing and the inputs of every block, before any GEMM on another stream */
    if (!rc) rc = wait_collectives(ctx, g, "cudaMemsetAsync");
    if (rc) {
        tps_gpu_job_free(g, j);
        return rc;
    }
    *out = j;
    return TPS_OK;
}

static tps_err get_slot(tps_ctx *ctx, tps_gpu *g, int slot, int dev, slot_dev **out)
{
    int di = dev_index(g, dev);
    if (slot < 0 || slot >= g->nslots || di < 0)
        return tps_fail(ctx, TPS_E_ARG, "gpu: slot %d / GPU %d out of range", slot, dev);
    slot_dev *s = &g->slots[(size_t)slot * g->devs.size() + (size_t)di];
    CUDA_TRY(ctx, cudaSetDevice(dev));
    if (!s->made) {
        CUDA_TRY(ctx, cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
        pthread_mutex_init(&s->wmu, NULL);
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&s->wcv, &ca);
        pthread_condattr_destroy(&ca);
        s->want_gen = s->done_gen = 0;
        cublasStatus_t st = cublasCreate(&s->blas);
        if (st != CUBLAS_STATUS_SUCCESS) {
            cudaStreamDestroy(s->stream);
            pthread_mutex_destroy(&s->wmu);
            pthread_cond_destroy(&s->wcv);
            return tps_fail(ctx, TPS_E_DEVICE, "cublasCreate failed (%s:%d): %s", __FILE__,
                            __LINE__, cublasGetStatusString(st));
        }
        s->made = 1;
        CUBLAS_TRY(ctx, cublasSetStream(s->blas, s->stream));
        /* keep the default math mode: CUBLAS_COMPUTE_32F never drops to TF32 */
    }
    *out = s;
    return TPS_OK;
}

static void CUDART_CB slot_done(void *arg)
{
    slot_dev *s = (slot_dev *)arg;
    pthread_mutex_lock(&s->wmu);
    s->done_gen++;
    pthread_cond_broadcast(&s->wcv);
    pthread_mutex_unlock(&s->wmu);
}

/* Waits for everything queued on the slot's stream, sleeping until a host
 * function behind it says so; every 10 ms the stream is asked for errors,
 * and past WAIT_S the device is declared stuck. */
static tps_err slot_wait(tps_ctx *ctx, tps_gpu *g, slot_dev *s, const char *what)
{
    uint64_t target = ++s->want_gen;
    CUDA_TRY(ctx, cudaLaunchHostFunc(s->stream, slot_done, s));
    double deadline = now_s() + WAIT_S;
    pthread_mutex_lock(&s->wmu);
    while (s->done_gen < target) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 10000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        if (pthread_cond_timedwait(&s->wcv, &s->wmu, &ts) != ETIMEDOUT) continue;
        pthread_mutex_unlock(&s->wmu);
        cudaError_t e = cudaStreamQuery(s->stream);
        if (e == cudaErrorNotReady) (void)cudaGetLastError();
        if (e != cudaSuccess && e != cudaErrorNotReady)
            return tps_fail(ctx, TPS_E_DEVICE, "%s: cudaStreamQuery failed: %s: %s", what,
                            cudaGetErrorName(e), cudaGetErrorString(e));
        if (now_s() > deadline) {
            g->stuck = 1; /* the host function may still run: the slot must stay */
            return tps_fail(ctx, TPS_E_DEVICE, "%s: no progress in %.0f s (GPU hung?)", what,
                            WAIT_S);
        }
        pthread_mutex_lock(&s->wmu);
    }
    pthread_mutex_unlock(&s->wmu);
    s->pending = 0;
    s->n_wait++;
    return TPS_OK;
}

/* Room for n more bytes in the slot's staging: after what is queued, or,
 * when it does not fit, after waiting for the queue (and growing). */
static tps_err slot_reserve(tps_ctx *ctx, tps_gpu *g, slot_dev *s, int dev, size_t n,
                            size_t *off)
{
    size_t at = (s->used + 255) & ~(size_t)255;
    if (at + n <= s->dw_cap) {
        *off = at;
        s->used = at + n;
        return TPS_OK;
    }
    if (s->pending) TPS_TRY(slot_wait(ctx, g, s, "staging"));
    s->used = 0;
    s->ref_job = NULL;
    if (n > s->dw_cap) {
        if (s->dw) cudaFree(s->dw);
        if (s->dwabs) cudaFree(s->dwabs);
        s->dw = s->dwabs = NULL;
        s->dw_cap = 0;
        /* a task stages its source rows and every rank's rows: room for both */
        size_t want = round_up(n < ((size_t)16 << 20) ? ((size_t)16 << 20) : 2 * n);
        size_t fr = 0, total = 0;
        CUDA_TRY(ctx, cudaMemGetInfo(&fr, &total));
        if (2 * want + ((size_t)64 << 20) > fr)
            return tps_fail(ctx, TPS_E_DEVICE,
                            "GPU %d: out of device memory for %zu MiB of staging "
                            "(%zu MiB free)",
                            dev, 2 * want >> 20, fr >> 20);
        CUDA_TRY(ctx, cudaMalloc(&s->dw, want));
        CUDA_TRY(ctx, cudaMalloc(&s->dwabs, want));
        s->dw_cap = want;
    }
    *off = 0;
    s->used = n;
    return TPS_OK;
}

/* Queues Y[:, rows] = X W[rows]^T for side's rows [row0, row0 + nrows), the
 * weight rows at A (device, `width` elements each, lda apart). */
static tps_err queue_gemm(tps_ctx *ctx, slot_dev *s, tps_gpu_job *j, int side, uint64_t row0,
                          uint64_t nrows, uint64_t width, const void *A, uint64_t lda)
{
    const float one = 1.0f, zero = 0.0f;
    cudaDataType_t t = cuda_type(j->op);
    /* Y[b, row0 + i] = sum_k W[row0 + i, k] X[b, k]: column-major C [rows, nb]
     * with ldc = the output row length, A = W^T (lda = the row stride), B = X^T. */
    float *C;
    int ldc;
    const void *X;
    if (side < 0) {
        C = j->dyref + row0;
        ldc = (int)j->out;
        X = j->dxref;
    } else if (j->gather) {
        uint64_t lo = j->lo[(size_t)side];
        if (row0 < lo || row0 + nrows > lo + j->len[(size_t)side])
            return tps_fail(ctx, TPS_E_ARG, "gpu job: rank %d rows [%llu, %llu) outside its shard",
                            side, (unsigned long long)row0, (unsigned long long)(row0 + nrows));
        C = j->dy[(size_t)side] + (row0 - lo);
        ldc = (int)j->ld[(size_t)side];
        X = j->dx[(size_t)side];
    } else {
        C = j->dy[(size_t)side] + row0;
        ldc = (int)j->out;
        X = j->dx[(size_t)side];
    }
    CUBLAS_TRY(ctx, cublasGemmEx(s->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nrows, j->nb, (int)width,
                                 &one, A, t, (int)lda, X, t, (int)width, &zero, C, CUDA_R_32F, ldc,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    s->n_gemm++;
    s->pending = 1;
    return TPS_OK;
}

static tps_err rows_check(tps_ctx *ctx, tps_gpu_job *j, int side, uint64_t nrows)
{
    if (side >= j->tp) return tps_fail(ctx, TPS_E_ARG, "gpu job: rank %d out of range", side);
    if (nrows > INT32_MAX)
        return tps_fail(ctx, TPS_E_ARG, "gpu job: %llu rows at once", (unsigned long long)nrows);
    return TPS_OK;
}

extern "C" tps_err tps_gpu_job_rows(tps_ctx *ctx, tps_gpu *g, tps_gpu_job *j, int slot, int side,
                                    uint64_t row0, uint64_t nrows, const void *bytes)
{
    if (!j->matmul || !nrows) return TPS_OK;
    if (side < 0 && !j->want_ref) return TPS_OK;
    TPS_TRY(rows_check(ctx, j, side, nrows));
    int dev = side < 0 ? g->ref_dev : g->dev_of_rank[(size_t)side];
    if (dev < 0) return TPS_OK; /* a rank another process drives */
    uint64_t width = side < 0 ? j->in : j->kr[(size_t)side];
    if (!width) return TPS_OK;
    slot_dev *s = NULL;
    TPS_TRY(get_slot(ctx, g, slot, dev, &s));
    size_t nbytes = (size_t)(nrows * width) * j->es, off = 0;
    TPS_TRY(slot_reserve(ctx, g, s, dev, nbytes, &off));
    unsigned char *dw = (unsigned char *)s->dw + off;
    CUDA_TRY(ctx, cudaMemcpyAsync(dw, bytes, nbytes, cudaMemcpyHostToDevice, s->stream));
    s->n_h2d += nbytes;
    s->pending = 1;
    TPS_TRY(queue_gemm(ctx, s, j, side, row0, nrows, width, dw, width));
    if (side < 0) {
        size_t n = (size_t)(nrows * width);
        unsigned char *da = (unsigned char *)s->dwabs + off;
        (void)cudaGetLastError(); /* so that KERNEL_TRY sees this launch's error only */
        if (j->es == 2)
            k_abs16<<<grid_for(n), 256, 0, s->stream>>>((uint16_t *)da, (const uint16_t *)dw, n);
        else
            k_abs32<<<grid_for(n), 256, 0, s->stream>>>((uint32_t *)da, (const uint32_t *)dw, n);
        KERNEL_TRY(ctx, "abs");
        const float one = 1.0f, zero = 0.0f;
        cudaDataType_t t = cuda_type(j->op);
        CUBLAS_TRY(ctx, cublasGemmEx(s->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nrows, j->nb,
                                     (int)width, &one, da, t, (int)width, j->dxabs, t, (int)width,
                                     &zero, j->dsabs + row0, CUDA_R_32F, (int)j->out,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        s->n_gemm++;
        s->ref_job = j;
        s->ref_ptr = dw;
        s->ref_row0 = row0;
        s->ref_rows = nrows;
        s->ref_width = width;
    }
    return TPS_OK;
}

extern "C" tps_err tps_gpu_job_rows_ref(tps_ctx *ctx, tps_gpu *g, tps_gpu_job *j, int slot,
                                        int side, uint64_t row0, uint64_t nrows, uint64_t col0,
                                        int *done)
{
    *done = 0;
    if (!j->matmul || !nrows || side < 0) return TPS_OK;
    TPS_TRY(rows_check(ctx, j, side, nrows));
    int dev = g->dev_of_rank[(size_t)side];
    if (dev < 0 || !j->kr[(size_t)side]) {
        *done = 1; /* nothing to compute here */
        return TPS_OK;
    }
    if (dev != g->ref_dev) return TPS_OK;
    slot_dev *s = NULL;
    TPS_TRY(get_slot(ctx, g, slot, dev, &s));
    uint64_t width = j->kr[(size_t)side];
    if (s->ref_job != j || row0 < s->ref_row0 || row0 + nrows > s->ref_row0 + s->ref_rows ||
        col0 + width > s->ref_width)
        return TPS_OK;
    const unsigned char *A =
        s->ref_ptr + ((row0 - s->ref_row0) * s->ref_width + col0) * (uint64_t)j->es;
    TPS_TRY(queue_gemm(ctx, s, j, side, row0, nrows, width, A, s->ref_width));
    s->n_reused += (uint64_t)(nrows * width) * j->es;
    *done = 1;
    return TPS_OK;
}

extern "C" tps_err tps_gpu_slot_sync(tps_ctx *ctx, tps_gpu *g, int slot)
{
    if (slot < 0 || slot >= g->nslots) return TPS_OK;
    for (size_t di = 0; di < g->devs.size(); di++) {
        slot_dev *s = &g->slots[(size_t)slot * g->devs.size() + di];
        if (!s->made) continue;
        if (s->pending) {
            CUDA_TRY(ctx, cudaSetDevice(g->devs[di]));
            TPS_TRY(slot_wait(ctx, g, s, "weight rows -> GEMM"));
        }
        s->used = 0;
        s->ref_job = NULL;
    }
    return TPS_OK;
}

extern "C" void tps_gpu_stats(const tps_gpu *g, char *buf, size_t len)
{
    uint64_t h2d = 0, reused = 0, gemm = 0, waits = 0;
    int handles = 0;
    for (size_t i = 0; i < g->slots.size(); i++) {
        const slot_dev *s = &g->slots[i];
        handles += s->made;
        h2d += s->n_h2d;
        reused += s->n_reused;
        gemm += s->n_gemm;
        waits += s->n_wait;
    }
    snprintf(buf, len,
             "%s: opened in %.3f s; %d cuBLAS handle%s; %.3f GB of weight rows uploaded, "
             "%.3f GB proven identical to staged reference rows and not uploaded again; "
             "%llu GEMMs, %llu stream waits",
             g->kind == TPS_BACKEND_NCCL ? "nccl" : "cuda", g->open_s, handles,
             handles == 1 ? "" : "s", (double)h2d / 1e9, (double)reused / 1e9,
             (unsigned long long)gemm, (unsigned long long)waits);
}

extern "C" tps_err tps_gpu_job_contrib(tps_ctx *ctx, tps_gpu *g, tps_gpu_job *j, int rank,
                                       const float *host)
{
    if (rank < 0 || rank >= j->tp)
        return tps_fail(ctx, TPS_E_ARG, "gpu job: rank %d out of range", rank);
    int dev = g->dev_of_rank[(size_t)rank];
    if (dev < 0) return TPS_OK;
    size_t n = (size_t)j->nb * (size_t)j->ld[(size_t)rank];
    if (!n) return TPS_OK;
    return copy_wait(ctx, g, dev, j->dy[(size_t)rank], host, n * sizeof(float),
                     cudaMemcpyHostToDevice);
}

extern "C" tps_err tps_gpu_job_finish(tps_ctx *ctx, tps_gpu *g, tps_gpu_job *j, float *yref,
                                      float *sabs, float *ysh)
{
    size_t n = (size_t)j->nb * (size_t)j->out;
    std::vector<const float *> in(g->local.size());
    std::vector<float *> res(g->local.size());
    for (size_t l = 0; l < g->local.size(); l++) {
        in[l] = j->dy[(size_t)g->local[l]];
        res[l] = j->dres[(size_t)g->local[l]];
    }
    if (j->gather)
        TPS_TRY(g->comm.allgather(&g->comm, ctx, in.data(), j->len.data(), (uint64_t)j->nb,
                                  res.data()));
    else
        TPS_TRY(g->comm.allreduce(&g->comm, ctx, in.data(), (uint64_t)n, res.data()));
    if (ysh)
        TPS_TRY(copy_wait(ctx, g, g->dev_of_rank[(size_t)g->local[0]], ysh, res[0],
                          n * sizeof(float), cudaMemcpyDeviceToHost));
    if (j->want_ref && yref)
        TPS_TRY(copy_wait(ctx, g, g->ref_dev, yref, j->dyref, n * sizeof(float),
                          cudaMemcpyDeviceToHost));
    if (j->want_ref && sabs)
        TPS_TRY(copy_wait(ctx, g, g->ref_dev, sabs, j->dsabs, n * sizeof(float),
                          cudaMemcpyDeviceToHost));
    return TPS_OK;
}

extern "C" tps_err tps_gpu_sum_u64(tps_ctx *ctx, tps_gpu *g, uint64_t *v)
{
    if (!g->multiproc) return TPS_OK;
    int dev = g->devs[0];
    void *d = NULL;
    size_t cap = 0;
    TPS_TRY(dev_alloc(ctx, g, dev, sizeof(uint64_t), &d, &cap));
    TPS_TRY(copy_wait(ctx, g, dev, d, v, sizeof *v, cudaMemcpyHostToDevice));
    NCCL_TRY(ctx, ncclAllReduce(d, d, 1, ncclUint64, ncclSum, g->comms[0], g->cstream[0]));
    TPS_TRY(nccl_settle(ctx, g, WAIT_S, "ncclAllReduce (verdict)"));
    TPS_TRY(stream_wait(ctx, g, g->cstream[0], "ncclAllReduce (verdict)"));
    TPS_TRY(copy_wait(ctx, g, dev, v, d, sizeof *v, cudaMemcpyDeviceToHost));
    dev_release(g, dev, d, cap);
    return TPS_OK;
}

extern "C" tps_err tps_gpu_runtime_info(char *buf, size_t len)
{
    if (!buf || !len) return TPS_E_ARG;
    int drv = 0, rt = 0, nv = 0, n = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    ncclGetVersion(&nv);
    size_t at = (size_t)snprintf(buf, len, "CUDA runtime %d.%d, ", rt / 1000, (rt % 1000) / 10);
    if (at < len) {
        if (drv)
            at += (size_t)snprintf(buf + at, len - at, "driver %d.%d, ", drv / 1000,
                                   (drv % 1000) / 10);
        else
            at += (size_t)snprintf(buf + at, len - at, "no CUDA driver, ");
    }
    if (at < len)
        at += (size_t)snprintf(buf + at, len - at, "NCCL %d.%d.%d, ", nv / 10000, (nv / 100) % 100,
                               nv % 100);
    cudaError_t e = cudaGetDeviceCount(&n);
    if (at >= len) return TPS_OK;
    if (e != cudaSuccess) {
        snprintf(buf + at, len - at, "no GPU (%s)", cudaGetErrorString(e));
        return TPS_OK;
    }
    cudaDeviceProp p;
    memset(&p, 0, sizeof p);
    if (n > 0) cudaGetDeviceProperties(&p, 0);
    snprintf(buf + at, len - at, "%d GPU%s%s%s", n, n == 1 ? "" : "s", n > 0 ? ": " : "",
             n > 0 ? p.name : "");
    return TPS_OK;
}
