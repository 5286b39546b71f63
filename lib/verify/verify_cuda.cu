/* verify_cuda.cu - the GPU backends of `tpshard verify` behind verify_cuda.h.
 *
 *  cuda: every rank on one GPU. Each rank's shard rows go through
 *        cublasGemmEx (BF16/F16 operands, F32 compute, CUBLAS_COMPUTE_32F;
 *        F32 as F32), into that rank's own output buffer; the all-gather is
 *        a 2-D device copy per rank and the all-reduce a kernel that adds
 *        the ranks' buffers in rank order.
 *  nccl: one rank per GPU. One process drives tp local GPUs (communicators
 *        made in one group), or one process per rank (RANK/WORLD_SIZE from
 *        the launcher, the unique id through a file); ncclAllGather (padded
 *        to equal counts, then unpacked) and ncclAllReduce (ncclFloat,
 *        ncclSum).
 *
 * The reference product X W^T and |X| |W|^T (the tolerance's sum |x w|)
 * run on the reference device from the source rows. Every CUDA, cuBLAS and
 * NCCL call is checked; a failure becomes TPS_E_DEVICE naming the call,
 * file:line and the library's error string. No wait is unbounded: streams
 * are polled against a deadline, NCCL communicators are non-blocking and
 * aborted when a deadline passes.
 *
 * Memory: cudaMalloc only (never managed memory), through a per-device cache
 * so that finishing one job does not synchronize the device for the next;
 * every allocation is checked against cudaMemGetInfo first. Host buffers for
 * the copies are pinned (cudaMallocHost) by the caller through
 * tps_gpu_host_alloc. */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <vector>

extern "C" {
#include "internal.h"
}
#include "comm.h"
#include "verify_cuda.h"

/* ------------------------------------------------------------------ errors */

#define WAIT_S 300.0      /* a stream or collective that takes longer is stuck */
#define INIT_WAIT_S 120.0 /* NCCL bootstrap and the unique-id file */

static int call_name_len(const char *call)
{
    return (int)strcspn(call, "(");
}

#define CUDA_TRY(ctx, call)                                                                        \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return tps_fail((ctx), TPS_E_DEVICE, "%.*s failed (%s:%d): %s: %s",                    \
                            call_name_len(#call), #call, __FILE__, __LINE__, cudaGetErrorName(e_), \
                            cudaGetErrorString(e_));                                               \
    } while (0)
#define CUBLAS_TRY(ctx, call)                                                                      \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                           \
            return tps_fail((ctx), TPS_E_DEVICE, "%.*s failed (%s:%d): %s", call_name_len(#call),  \
                            #call, __FILE__, __LINE__, cublasGetStatusString(s_));                 \
    } while (0)
/* NCCL calls on non-blocking communicators may answer ncclInProgress. */
#define NCCL_TRY(ctx, call)                                                                        \
    do {                                                                                           \
        ncclResult_t n_ = (call);                                                                  \
        if (n_ != ncclSuccess && n_ != ncclInProgress)                                             \
            return tps_fail((ctx), TPS_E_DEVICE, "%.*s failed (%s:%d): %s%s%s",                    \
                            call_name_len(#call), #call, __FILE__, __LINE__,                       \
                            ncclGetErrorString(n_), ncclGetLastError(NULL) ? ": " : "",            \
                            ncclGetLastError(NULL) ? ncclGetLastError(NULL) : "");                 \
    } while (0)
#define KERNEL_TRY(ctx, what)                                                                      \
    do {                                                                                           \
        cudaError_t e_ = cudaGetLastError();                                                       \
        if (e_ != cudaSuccess)                                                                     \
            return tps_fail((ctx), TPS_E_DEVICE, "kernel %s failed to launch (%s:%d): %s: %s",     \
                            (what), __FILE__, __LINE__, cudaGetErrorName(e_),                      \
                            cudaGetErrorString(e_));                                               \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
static void nap(int spins)
{
    if (spins < 200) {
        sched_yield();
    } else {
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
}

/* ------------------------------------------------------------------ state */

/* One worker thread's resources on one device. Weight rows are staged back
 * to back in dw (bump allocation) and their GEMMs queued on the slot's
 * stream; tps_gpu_slot_sync waits for them once per task. The reference rows
 * staged last (ref_*) can feed a rank's GEMM again when the caller has proven
 * the rank's bytes equal to them, so identical bytes cross PCIe once. */
struct slot_dev {
    int made;
    int pending; /* work queued since the last wait */
    /* waits: a host function queued behind the work bumps done_gen and wakes
     * the worker, which sleeps on wcv instead of polling the driver */
    pthread_mutex_t wmu;
    pthread_cond_t wcv;
    uint64_t want_gen, done_gen;
    cudaStream_t stream;
    cublasHandle_t blas;
    void *dw, *dwabs; /* staging for weight rows and their magnitudes */
    size_t dw_cap, used;
    const tps_gpu_job *ref_job; /* the reference rows staged last, or NULL */
    const unsigned char *ref_ptr;
    uint64_t ref_row0, ref_rows, ref_width;
    uint64_t n_h2d, n_reused, n_gemm, n_wait; /* bytes uploaded, bytes not re-uploaded, counts */
};

struct pool_ent {
    int dev;
    void *p;
    size_t n;
};

struct tps_gpu {
    tps_backend kind;
    int tp, nslots;
    int multiproc, world_rank, world_size;
    std::vector<int> devs;        /* distinct devices this process uses */
    std::vector<int> dev_of_rank; /* global rank -> device (-1: not local) */
    std::vector<int> local;       /* local ranks (global ids), ascending */
    int ref_dev;
    std::vector<slot_dev> slots;       /* [slot][device index] */
    std::vector<cudaStream_t> cstream; /* per device index: collectives and copies */
    std::vector<ncclComm_t> comms;     /* per local rank */
    std::vector<float *> send, recv;   /* nccl all-gather scratch per local rank */
    std::vector<size_t> send_cap, recv_cap;
    const float **dptrs;        /* cuda all-reduce: rank buffers, on the device */
    std::vector<pool_ent> pool;  /* free device blocks */
    std::vector<pool_ent> slabs; /* cudaMalloc'd slabs that small blocks are carved from */
    std::vector<size_t> slab_used;
    pthread_mutex_t mu;
    int aborted;
    int stuck; /* a wait timed out: never block on the device again */
    tps_comm comm;
    double open_s; /* tps_gpu_open: device discovery, contexts, NCCL bootstrap */
    char desc[512];
};

struct tps_gpu_job {
    int gather, matmul, tp, nb, want_ref;
    tps_dtype op;
    size_t es;
    uint64_t out, in;
    std::vector<uint64_t> lo, len, kr, ld;
    std::vector<void *> dx;    /* per global rank: [nb, kr] operand inputs */
    std::vector<float *> dy;   /* per global rank: local outputs */
    std::vector<float *> dres; /* per global rank: collective result [nb, out] */
    void *dxref, *dxabs;
    float *dyref, *dsabs;
    std::vector<pool_ent> held;
};

static int dev_index(const tps_gpu *g, int dev)
{
    for (size_t i = 0; i < g->devs.size(); i++)
        if (g->devs[i] == dev) return (int)i;
    return -1;
}

/* ------------------------------------------------------------------ device memory */

static size_t round_up(size_t n)
{
    size_t r = 256;
    while (r < n && r < ((size_t)1 << 62)) r <<= 1;
    return r;
}

/* Blocks up to SLAB_MAX bytes are carved from SLAB-byte slabs, so that the
 * thousands of small buffers a verify makes cost a handful of cudaMalloc
 * calls (each of which may synchronize the device). */
#define SLAB ((size_t)64 << 20)
#define SLAB_MAX ((size_t)4 << 20)

static int in_slab(const tps_gpu *g, int dev, const void *p)
{
    for (size_t i = 0; i < g->slabs.size(); i++)
        if (g->slabs[i].dev == dev && (const char *)p >= (const char *)g->slabs[i].p &&
            (const char *)p < (const char *)g->slabs[i].p + g->slabs[i].n)
            return 1;
    return 0;
}

/* Under g->mu: a block from a slab of dev with room, or NULL. */
static void *carve(tps_gpu *g, int dev, size_t want)
{
    for (size_t i = 0; i < g->slabs.size(); i++)
        if (g->slabs[i].dev == dev && g->slab_used[i] + want <= g->slabs[i].n) {
            void *p = (char *)g->slabs[i].p + g->slab_used[i];
            g->slab_used[i] += want;
            return p;
        }
    return NULL;
}

/* Checks that dev has room for n more bytes, giving the cache of whole
 * blocks back first when it has not. */
static tps_err dev_room(tps_ctx *ctx, tps_gpu *g, int dev, size_t want)
{
    CUDA_TRY(ctx, cudaSetDevice(dev));
    size_t fr = 0, total = 0;
    CUDA_TRY(ctx, cudaMemGetInfo(&fr, &total));
    if (want + ((size_t)64 << 20) <= fr) return TPS_OK;
    pthread_mutex_lock(&g->mu);
    for (size_t i = 0; i < g->pool.size();) {
        if (g->pool[i].dev == dev && !in_slab(g, dev, g->pool[i].p)) {
            cudaFree(g->pool[i].p);
            g->pool[i] = g->pool.back();
            g->pool.pop_back();
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&g->mu);
    CUDA_TRY(ctx, cudaMemGetInfo(&fr, &total));
    if (want + ((size_t)64 << 20) > fr)
        return tps_fail(ctx, TPS_E_DEVICE,
                        "GPU %d: out of device memory: %zu MiB needed, %zu MiB free of %zu MiB", dev,
                        want >> 20, fr >> 20, total >> 20);
    return TPS_OK;
}

/* A block of at least n bytes on dev: from the cache, a slab, or cudaMalloc
 * (after checking that the device has room). */
static tps_err dev_alloc(tps_ctx *ctx, tps_gpu *g, int dev, size_t n, void **out, size_t *cap)
{
    size_t want = round_up(n ? n : 1);
    if (cap) *cap = want;
    pthread_mutex_lock(&g->mu);
    for (size_t i = 0; i < g->pool.size(); i++)
        if (g->pool[i].dev == dev && g->pool[i].n == want) {
            *out = g->pool[i].p;
            g->pool[i] = g->pool.back();
            g->pool.pop_back();
            pthread_mutex_unlock(&g->mu);
            return TPS_OK;
        }
    void *p = want <= SLAB_MAX ? carve(g, dev, want) : NULL;
    pthread_mutex_unlock(&g->mu);
    if (p) {
        *out = p;
        return TPS_OK;
    }
    size_t get = want <= SLAB_MAX ? SLAB : want;
    TPS_TRY(dev_room(ctx, g, dev, get));
    CUDA_TRY(ctx, cudaMalloc(&p, get));
    if (get == want) {
        *out = p;
        return TPS_OK;
    }
    pthread_mutex_lock(&g->mu);
    g->slabs.push_back(pool_ent{dev, p, get});
    g->slab_used.push_back(want);
    pthread_mutex_unlock(&g->mu);
    *out = p;
    return TPS_OK;
}
static void dev_release(tps_gpu *g, int dev, void *p, size_t cap)
{
    if (!p) return;
    pthread_mutex_lock(&g->mu);
    g->pool.push_back(pool_ent{dev, p, cap});
    pthread_mutex_unlock(&g->mu);
}
static tps_err stream_wait(tps_ctx *ctx, tps_gpu *g, cudaStream_t s, const char *what);
static int dev_index(const tps_gpu *g, int dev);

/* Allocates for a job and remembers the block so that job_free returns it. */
static tps_err job_alloc(tps_ctx *ctx, tps_gpu *g, tps_gpu_job *j, int dev, size_t n, void **out)
{
    size_t cap = 0;
    TPS_TRY(dev_alloc(ctx, g, dev, n, out, &cap));
    j->held.push_back(pool_ent{dev, *out, cap});
    CUDA_TRY(ctx, cudaSetDevice(dev));
    /* on our own (non-blocking) stream, waited for: the legacy default
     * stream would not order it before the GEMMs on other streams */
    cudaStream_t s = g->cstream[(size_t)dev_index(g, dev)];
    CUDA_TRY(ctx, cudaMemsetAsync(*out, 0, n ? n : 1, s));
    return TPS_OK; /* tps_gpu_job_new waits once for all of them */
}

/* ------------------------------------------------------------------ waits */

static tps_err nccl_abort_all(tps_gpu *g)
{
    if (g->aborted) return TPS_OK;
    g->aborted = 1;
    for (size_t l = 0; l < g->comms.size(); l++)
        if (g->comms[l]) ncclCommAbort(g->comms[l]);
    return TPS_OK;
}

static tps_err stream_wait(tps_ctx *ctx, tps_gpu *g, cudaStream_t s, const char *what)
{
    double deadline = now_s() + WAIT_S;
    for (int spins = 0;; spins++) {
        cudaError_t e = cudaStreamQuery(s);
        if (e == cudaSuccess) return TPS_OK;
        /* cudaErrorNotReady is also left in the thread's last-error slot,
         * where the next KERNEL_TRY would report it: clear it */
        if (e == cudaErrorNotReady) (void)cudaGetLastError();
        if (e != cudaErrorNotReady)
            return tps_fail(ctx, TPS_E_DEVICE, "%s: cudaStreamQuery failed: %s: %s", what,
                            cudaGetErrorName(e), cudaGetErrorString(e));
        if (now_s() > deadline) {
            g->stuck = 1;
            nccl_abort_all(g);
            return tps_fail(ctx, TPS_E_DEVICE,
                            "%s: no progress in %.0f s (GPU hung or a peer rank "
                            "is gone); NCCL communicators aborted",
                            what, WAIT_S);
        }
        nap(spins);
    }
}

/* Non-blocking communicators: wait until every local one is out of
 * ncclInProgress, or fail (and abort) at the deadline. */
static tps_err nccl_settle(tps_ctx *ctx, tps_gpu *g, double limit, const char *what)
{
    double deadline = now_s() + limit;
    for (size_t l = 0; l < g->comms.size(); l++) {
        if (!g->comms[l]) continue;
        for (int spins = 0;; spins++) {
            ncclResult_t st = ncclInProgress;
            ncclResult_t r = ncclCommGetAsyncError(g->comms[l], &st);
            if (r != ncclSuccess) st = r;
            if (st == ncclSuccess) break;
            if (st != ncclInProgress) {
                const char *last = ncclGetLastError(g->comms[l]);
                nccl_abort_all(g);
                return tps_fail(ctx, TPS_E_DEVICE, "%s: NCCL rank %d: %s%s%s", what, g->local[l],
                                ncclGetErrorString(st), last && *last ? ": " : "",
                                last ? last : "");
            }
            if (now_s() > deadline) {
                g->stuck = 1;
                nccl_abort_all(g);
                return tps_fail(ctx, TPS_E_DEVICE,
                                "%s: NCCL rank %d made no progress in %.0f s "
                                "(a peer rank missing?); communicators aborted",
                                what, g->local[l], limit);
            }
            nap(spins);
        }
    }
    return TPS_OK;
}

static tps_err wait_collectives(tps_ctx *ctx, tps_gpu *g, const char *what)
{
    for (size_t i = 0; i < g->devs.size(); i++) {
        CUDA_TRY(ctx, cudaSetDevice(g->devs[i]));
        TPS_TRY(stream_wait(ctx, g, g->cstream[i], what));
    }
    return TPS_OK;
}

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
/* out = ((in[0] + in[1]) + in[2]) + ...: rank order, like the cpu backend. */
__global__ void k_sum_ranks(float *out, const float *const *in, int nr, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float s = in[0][i];
        for (int r = 1; r < nr; r++) s = __fadd_rn(s, in[r][i]);
        out[i] = s;
    }
}
static unsigned grid_for(size_t n)
{
    size_t b = (n + 255) / 256;
    return (unsigned)(b < 1 ? 1 : b > 8192 ? 8192 : b);
}

/* ------------------------------------------------------------------ communicators */

static tps_err cuda_allgather(tps_comm *c, tps_ctx *ctx, const float *const *in,
                              const uint64_t *cols, uint64_t rows, float *const *out)
{
    tps_gpu *g = (tps_gpu *)c->state;
    uint64_t total = 0;
    for (int r = 0; r < c->nranks; r++) total += cols[r];
    CUDA_TRY(ctx, cudaSetDevice(g->devs[0]));
    cudaStream_t s = g->cstream[0];
    uint64_t off = 0;
    for (int r = 0; r < c->nranks; r++) {
        if (cols[r] && rows)
            CUDA_TRY(ctx, cudaMemcpy2DAsync(out[0] + off, total * sizeof(float), in[r],
                                            cols[r] * sizeof(float), cols[r] * sizeof(float), rows,
                                            cudaMemcpyDeviceToDevice, s));
        off += cols[r];
    }
    for (int l = 1; l < c->nlocal; l++)
        if (out[l] && out[l] != out[0] && rows * total != 0)
            CUDA_TRY(ctx, cudaMemcpyAsync(out[l], out[0], rows * total * sizeof(float),
                                          cudaMemcpyDeviceToDevice, s));
    return stream_wait(ctx, g, s, "all-gather");
}

static tps_err cuda_allreduce(tps_comm *c, tps_ctx *ctx, const float *const *in, uint64_t n,
                              float *const *out)
{
    tps_gpu *g = (tps_gpu *)c->state;
    CUDA_TRY(ctx, cudaSetDevice(g->devs[0]));
    cudaStream_t s = g->cstream[0];
    if (!n) return TPS_OK;
    CUDA_TRY(ctx, cudaMemcpyAsync(g->dptrs, in, sizeof(float *) * (size_t)c->nranks,
                                  cudaMemcpyHostToDevice, s));
    (void)cudaGetLastError(); /* so that KERNEL_TRY sees this launch's error only */
    k_sum_ranks<<<grid_for(n), 256, 0, s>>>(out[0], g->dptrs, c->nranks, n);
    KERNEL_TRY(ctx, "k_sum_ranks");
    for (int l = 1; l < c->nlocal; l++)
        if (out[l] && out[l] != out[0])
            CUDA_TRY(ctx, cudaMemcpyAsync(out[l], out[0], n * sizeof(float),
                                          cudaMemcpyDeviceToDevice, s));
    /* the pointer array is read by the kernel: wait before it can change */
    return stream_wait(ctx, g, s, "all-reduce");
}

static tps_err grow_scratch(tps_ctx *ctx, tps_gpu *g, int dev, std::vector<float *> &v,
                            std::vector<size_t> &caps, size_t l, size_t bytes)
{
    if (caps[l] >= bytes) return TPS_OK;
    if (v[l]) dev_release(g, dev, v[l], caps[l]);
    v[l] = NULL;
    caps[l] = 0;
    void *p = NULL;
    size_t cap = 0;
    TPS_TRY(dev_alloc(ctx, g, dev, bytes, &p, &cap));
    v[l] = (float *)p;
    caps[l] = cap;
    return TPS_OK;
}

/* NCCL all-gather needs equal counts: each rank's [rows, cols[r]] goes out
 * padded to [rows, cmax]; the [tp][rows][cmax] received is unpacked. */
static tps_err nccl_allgather(tps_comm *c, tps_ctx *ctx, const float *const *in,
                              const uint64_t *cols, uint64_t rows, float *const *out)
{
    tps_gpu *g = (tps_gpu *)c->state;
    uint64_t cmax = 0, total = 0;
    for (int r = 0; r < c->nranks; r++) {
        cmax = cols[r] > cmax ? cols[r] : cmax;
        total += cols[r];
    }
    size_t count = (size_t)(rows * cmax);
    if (!count) return TPS_OK; /* every process sees the same cols: all skip */
    for (int l = 0; l < c->nlocal; l++) {
        int r = c->local[l], dev = g->dev_of_rank[r], di = dev_index(g, dev);
        TPS_TRY(grow_scratch(ctx, g, dev, g->send, g->send_cap, (size_t)l, count * sizeof(float)));
        TPS_TRY(grow_scratch(ctx, g, dev, g->recv, g->recv_cap, (size_t)l,
                             count * sizeof(float) * (size_t)c->nranks));
        CUDA_TRY(ctx, cudaSetDevice(dev));
        if (cols[r])
            CUDA_TRY(ctx, cudaMemcpy2DAsync(g->send[l], cmax * sizeof(float), in[l],
                                            cols[r] * sizeof(float), cols[r] * sizeof(float), rows,
                                            cudaMemcpyDeviceToDevice, g->cstream[di]));
    }
    NCCL_TRY(ctx, ncclGroupStart());
    for (int l = 0; l < c->nlocal; l++) {
        int di = dev_index(g, g->dev_of_rank[c->local[l]]);
        NCCL_TRY(ctx, ncclAllGather(g->send[l], g->recv[l], count, ncclFloat, g->comms[l],
                                    g->cstream[di]));
    }
    NCCL_TRY(ctx, ncclGroupEnd());
    TPS_TRY(nccl_settle(ctx, g, WAIT_S, "ncclAllGather"));
    for (int l = 0; l < c->nlocal; l++) {
        if (!out[l]) continue;
        int dev = g->dev_of_rank[c->local[l]], di = dev_index(g, dev);
        CUDA_TRY(ctx, cudaSetDevice(dev));
        uint64_t off = 0;
        for (int q = 0; q < c->nranks; q++) {
            if (cols[q])
                CUDA_TRY(ctx, cudaMemcpy2DAsync(out[l] + off, total * sizeof(float),
                                                g->recv[l] + (size_t)q * count,
                                                cmax * sizeof(float), cols[q] * sizeof(float), rows,
                                                cudaMemcpyDeviceToDevice, g->cstream[di]));
            off += cols[q];
        }
    }
    return wait_collectives(ctx, g, "ncclAllGather");
}

static tps_err nccl_allreduce(tps_comm *c, tps_ctx *ctx, const float *const *in, uint64_t n,
                              float *const *out)
{
    tps_gpu *g = (tps_gpu *)c->state;
    if (!n) return TPS_OK;
    for (int l = 0; l < c->nlocal; l++)
        if (!out[l])
            return tps_fail(ctx, TPS_E_ARG, "nccl all-reduce: rank %d has no output buffer",
                            c->local[l]);
    NCCL_TRY(ctx, ncclGroupStart());
    for (int l = 0; l < c->nlocal; l++) {
        int dev = g->dev_of_rank[c->local[l]];
        NCCL_TRY(ctx, ncclAllReduce(in[l], out[l], (size_t)n, ncclFloat, ncclSum, g->comms[l],
                                    g->cstream[dev_index(g, dev)]));
    }
    NCCL_TRY(ctx, ncclGroupEnd());
    TPS_TRY(nccl_settle(ctx, g, WAIT_S, "ncclAllReduce"));
    return wait_collectives(ctx, g, "ncclAllReduce");
}

static void comm_noop_destroy(tps_comm *c)
{
    (void)c;
}

/* ------------------------------------------------------------------ bootstrap */

static int env_int(const char *const *names, int *out)
{
    for (int i = 0; names[i]; i++) {
        const char *v = getenv(names[i]);
        if (!v || !*v) continue;
        char *end;
        errno = 0;
        long x = strtol(v, &end, 10);
        if (errno || *end || x < 0 || x > 1 << 24) continue;
        *out = (int)x;
        return 1;
    }
    return 0;
}

static tps_err write_id(tps_ctx *ctx, const char *path, const ncclUniqueId *id)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return tps_fail(ctx, TPS_E_IO, "%s: %s", tmp, strerror(errno));
    ssize_t w = write(fd, id, sizeof *id);
    int bad = w != (ssize_t)sizeof *id || fsync(fd) != 0;
    int err = errno;
    close(fd);
    if (bad || rename(tmp, path) != 0) {
        err = bad ? err : errno;
        unlink(tmp);
        return tps_fail(ctx, TPS_E_IO, "--nccl-id-file %s: %s", path, strerror(err));
    }
    return TPS_OK;
}

/* Waits for rank 0's id; files much older than this process are a previous
 * run's and are ignored. */
static tps_err read_id(tps_ctx *ctx, const char *path, ncclUniqueId *id)
{
    time_t started = time(NULL);
    double deadline = now_s() + INIT_WAIT_S;
    for (;;) {
        struct stat st;
        if (stat(path, &st) == 0 && st.st_size == (off_t)sizeof *id &&
            st.st_mtime + 300 >= started) {
            int fd = open(path, O_RDONLY);
            if (fd >= 0) {
                ssize_t r = read(fd, id, sizeof *id);
                close(fd);
                if (r == (ssize_t)sizeof *id) return TPS_OK;
            }
        }
        if (ctx->interrupted) return tps_fail(ctx, TPS_E_INTERRUPTED, "interrupted");
        if (now_s() > deadline)
            return tps_fail(ctx, TPS_E_DEVICE,
                            "--nccl-id-file %s: rank 0 did not write the NCCL "
                            "unique id within %.0f s (is rank 0 running, and is the path on a "
                            "filesystem every rank sees? a stale file from an earlier run must be "
                            "removed)",
                            path, INIT_WAIT_S);
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
    }
}

static tps_err open_nccl(tps_ctx *ctx, tps_gpu *g, int ndev, const char *id_file)
{
    static const char *const rank_env[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                                           "SLURM_PROCID", NULL};
    static const char *const size_env[] = {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                           "SLURM_NTASKS", NULL};
    static const char *const local_env[] = {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                            "MPI_LOCALRANKID", "SLURM_LOCALID", NULL};
    int world = 1, rank = 0, lrank = -1;
    env_int(size_env, &world);
    env_int(rank_env, &rank);
    env_int(local_env, &lrank);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclUniqueId id;
    /* --nccl-id-file asks for one rank per process, also for a world of one
     * (tp 1, or a launcher that started a single task) */
    if (world > 1 || id_file) {
        if (world != g->tp)
            return tps_fail(ctx, TPS_E_ARG,
                            "--backend nccl across processes runs one rank per "
                            "process: the launcher started %d processes but the directory is tp %d",
                            world, g->tp);
        if (rank >= world)
            return tps_fail(ctx, TPS_E_ARG, "--backend nccl: rank %d out of range for %d processes",
                            rank, world);
        if (!id_file)
            return tps_fail(
                ctx, TPS_E_ARG,
                "--backend nccl with %d processes needs --nccl-id-file "
                "PATH on a filesystem every rank sees (rank 0 writes the NCCL unique id "
                "there)",
                world);
        int dev = lrank >= 0 ? lrank : rank % ndev;
        /* the launcher gave each process only its own GPU (CUDA_VISIBLE_DEVICES
         * per rank, srun --gpus-per-task=1): that is device 0 here */
        if (dev >= ndev && ndev == 1) dev = 0;
        if (dev >= ndev)
            return tps_fail(ctx, TPS_E_DEVICE,
                            "--backend nccl: local rank %d needs GPU %d but only "
                            "%d are visible",
                            lrank, dev, ndev);
        g->multiproc = 1;
        g->world_rank = rank;
        g->world_size = world;
        g->devs.push_back(dev);
        g->dev_of_rank[rank] = dev;
        g->local.push_back(rank);
        g->ref_dev = dev;
        if (rank == 0) {
            NCCL_TRY(ctx, ncclGetUniqueId(&id));
            TPS_TRY(write_id(ctx, id_file, &id));
        } else {
            TPS_TRY(read_id(ctx, id_file, &id));
        }
        g->comms.assign(1, NULL);
        CUDA_TRY(ctx, cudaSetDevice(dev));
        NCCL_TRY(ctx, ncclCommInitRankConfig(&g->comms[0], world, id, rank, &cfg));
    } else {
        if (ndev < g->tp)
            return tps_fail(ctx, TPS_E_DEVICE,
                            "--backend nccl puts one rank on each GPU: tp %d "
                            "needs %d GPUs but %d %s visible; use --backend cuda to run every rank "
                            "on one GPU, or one process per rank (RANK/WORLD_SIZE and "
                            "--nccl-id-file)",
                            g->tp, g->tp, ndev, ndev == 1 ? "is" : "are");
        for (int r = 0; r < g->tp; r++) {
            g->devs.push_back(r);
            g->dev_of_rank[r] = r;
            g->local.push_back(r);
        }
        g->ref_dev = 0;
        NCCL_TRY(ctx, ncclGetUniqueId(&id));
        g->comms.assign((size_t)g->tp, NULL);
        NCCL_TRY(ctx, ncclGroupStart());
        for (int r = 0; r < g->tp; r++) {
            CUDA_TRY(ctx, cudaSetDevice(r));
            NCCL_TRY(ctx, ncclCommInitRankConfig(&g->comms[(size_t)r], g->tp, id, r, &cfg));
        }
        NCCL_TRY(ctx, ncclGroupEnd());
    }
    TPS_TRY(nccl_settle(ctx, g, INIT_WAIT_S, "NCCL communicator init"));
    /* every rank has joined, so every rank has read the id: remove it, so that
     * a later run's ranks cannot pick up this run's stale id */
    if (g->multiproc && g->world_rank == 0) unlink(id_file);
    return TPS_OK;
}

/* ------------------------------------------------------------------ open / close */

extern "C" void tps_gpu_close(tps_gpu *g)
{
    if (!g) return;
    if (g->stuck) {
        /* cudaFree synchronizes the device, which may never finish: leave it
         * all to process exit */
        for (size_t l = 0; l < g->comms.size(); l++)
            if (g->comms[l] && !g->aborted) ncclCommAbort(g->comms[l]);
        /* nor free g: a host function queued on a stuck stream may still
         * run and touch its slot */
        return;
    }
    for (size_t i = 0; i < g->slots.size(); i++) {
        slot_dev *s = &g->slots[i];
        if (!s->made) continue;
        cudaSetDevice(g->devs[i % g->devs.size()]);
        if (s->dw) cudaFree(s->dw);
        if (s->dwabs) cudaFree(s->dwabs);
        cublasDestroy(s->blas);
        cudaStreamDestroy(s->stream);
        pthread_mutex_destroy(&s->wmu);
        pthread_cond_destroy(&s->wcv);
    }
    for (size_t l = 0; l < g->comms.size(); l++) {
        if (!g->comms[l]) continue;
        if (!g->aborted) {
            /* finalize may answer ncclInProgress on a non-blocking comm: bounded wait */
            ncclCommFinalize(g->comms[l]);
            double deadline = now_s() + 30;
            ncclResult_t st = ncclInProgress;
            for (int spins = 0; now_s() < deadline; spins++) {
                if (ncclCommGetAsyncError(g->comms[l], &st) != ncclSuccess || st != ncclInProgress)
                    break;
                nap(spins);
            }
            if (st == ncclSuccess)
                ncclCommDestroy(g->comms[l]);
            else
                ncclCommAbort(g->comms[l]);
        } else {
            /* already aborted */
        }
    }
    for (size_t l = 0; l < g->send.size(); l++) {
        int dev = g->dev_of_rank[g->local[l]];
        cudaSetDevice(dev);
        if (g->send[l]) cudaFree(g->send[l]);
        if (g->recv[l]) cudaFree(g->recv[l]);
    }
    for (size_t i = 0; i < g->pool.size(); i++) {
        if (in_slab(g, g->pool[i].dev, g->pool[i].p)) continue;
        cudaSetDevice(g->pool[i].dev);
        cudaFree(g->pool[i].p);
    }
    for (size_t i = 0; i < g->slabs.size(); i++) {
        cudaSetDevice(g->slabs[i].dev);
        cudaFree(g->slabs[i].p);
    }
    for (size_t i = 0; i < g->cstream.size(); i++) {
        cudaSetDevice(g->devs[i]);
        if (g->cstream[i]) cudaStreamDestroy(g->cstream[i]);
    }
    if (g->dptrs) {
        cudaSetDevice(g->devs[0]);
        cudaFree((void *)g->dptrs);
    }
    pthread_mutex_destroy(&g->mu);
    delete g;
}

extern "C" tps_err tps_gpu_open(tps_ctx *ctx, tps_backend kind, int tp, int nslots,
                                const char *nccl_id_file, tps_gpu **out)
{
    *out = NULL;
    if (tp < 1 || nslots < 1) return tps_fail(ctx, TPS_E_ARG, "gpu backend: bad tp %d", tp);
    double t0 = now_s();
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    const char *bname = kind == TPS_BACKEND_NCCL ? "nccl" : "cuda";
    if (e != cudaSuccess)
        return tps_fail(ctx, TPS_E_DEVICE,
                        "--backend %s: no usable GPU: cudaGetDeviceCount: %s: %s", bname,
                        cudaGetErrorName(e), cudaGetErrorString(e));
    if (ndev < 1) return tps_fail(ctx, TPS_E_DEVICE, "--backend %s: no GPU visible", bname);
    tps_gpu *g = new tps_gpu();
    g->kind = kind;
    g->tp = tp;
    g->nslots = nslots;
    g->dev_of_rank.assign((size_t)tp, -1);
    g->dptrs = NULL;
    g->aborted = 0;
    g->stuck = 0;
    pthread_mutex_init(&g->mu, NULL);
    tps_err rc = TPS_OK;
    if (kind == TPS_BACKEND_NCCL) {
        rc = open_nccl(ctx, g, ndev, nccl_id_file);
    } else {
        g->devs.push_back(0);
        for (int r = 0; r < tp; r++) {
            g->dev_of_rank[(size_t)r] = 0;
            g->local.push_back(r);
        }
        g->ref_dev = 0;
    }
    if (!rc) {
        g->cstream.assign(g->devs.size(), (cudaStream_t)0);
        for (size_t i = 0; i < g->devs.size() && !rc; i++) {
            cudaError_t e2 = cudaSetDevice(g->devs[i]);
            if (e2 == cudaSuccess)
                e2 = cudaStreamCreateWithFlags(&g->cstream[i], cudaStreamNonBlocking);
            if (e2 != cudaSuccess)
                rc = tps_fail(ctx, TPS_E_DEVICE,
                              "cudaStreamCreateWithFlags failed on GPU %d: %s: %s", g->devs[i],
                              cudaGetErrorName(e2), cudaGetErrorString(e2));
        }
    }
    if (!rc && kind == TPS_BACKEND_CUDA) {
        cudaError_t e2 = cudaSetDevice(0);
        if (e2 == cudaSuccess) e2 = cudaMalloc((void **)&g->dptrs, sizeof(float *) * (size_t)tp);
        if (e2 != cudaSuccess)
            rc = tps_fail(ctx, TPS_E_DEVICE, "cudaMalloc failed (%s:%d): %s: %s", __FILE__,
                          __LINE__, cudaGetErrorName(e2), cudaGetErrorString(e2));
    }
    if (rc) {
        tps_gpu_close(g);
        return rc;
    }
    g->slots.assign((size_t)nslots * g->devs.size(), slot_dev());
    g->send.assign(g->local.size(), NULL);
    g->recv.assign(g->local.size(), NULL);
    g->send_cap.assign(g->local.size(), 0);
    g->recv_cap.assign(g->local.size(), 0);
    g->comm.name = kind == TPS_BACKEND_NCCL ? "nccl" : "cuda";
    g->comm.nranks = tp;
    g->comm.nlocal = (int)g->local.size();
    g->comm.local = g->local.data();
    g->comm.state = g;
    g->comm.allgather = kind == TPS_BACKEND_NCCL ? nccl_allgather : cuda_allgather;
    g->comm.allreduce = kind == TPS_BACKEND_NCCL ? nccl_allreduce : cuda_allreduce;
    g->comm.destroy = comm_noop_destroy;
    cudaDeviceProp prop;
    memset(&prop, 0, sizeof prop);
    cudaGetDeviceProperties(&prop, g->devs[0]);
    int rt = 0, nv = 0;
    cudaRuntimeGetVersion(&rt);
    ncclGetVersion(&nv);
    if (kind == TPS_BACKEND_CUDA)
        snprintf(g->desc, sizeof g->desc, "cuda (%s, %d rank%s on GPU 0, cuBLAS, CUDA %d.%d)",
                 prop.name, tp, tp == 1 ? "" : "s", rt / 1000, (rt % 1000) / 10);
    else if (g->multiproc)
        snprintf(g->desc, sizeof g->desc,
                 "nccl (rank %d of %d processes, %s GPU %d, NCCL %d.%d.%d)", g->world_rank,
                 g->world_size, prop.name, g->devs[0], nv / 10000, (nv / 100) % 100, nv % 100);
    else
        snprintf(g->desc, sizeof g->desc, "nccl (%d x %s, one rank per GPU, NCCL %d.%d.%d)", tp,
                 prop.name, nv / 10000, (nv / 100) % 100, nv % 100);
    g->open_s = now_s() - t0;
    *out = g;
    return TPS_OK;
}

extern "C" const char *tps_gpu_describe(const tps_gpu *g)
{
    return g ? g->desc : "none";
}

extern "C" void tps_gpu_local_ranks(const tps_gpu *g, unsigned char *mask)
{
    for (int r = 0; r < g->tp; r++) mask[r] = g->dev_of_rank[(size_t)r] >= 0;
}
extern "C" int tps_gpu_is_root(const tps_gpu *g)
{
    return !g->multiproc || g->world_rank == 0;
}

extern "C" void *tps_gpu_host_alloc(tps_gpu *g, size_t n)
{
    /* a worker thread has no current device yet: without this every process
     * of a multi-process run would make a context on GPU 0 */
    if (g && !g->devs.empty() && cudaSetDevice(g->devs[0]) != cudaSuccess) return NULL;
    void *p = NULL;
    if (cudaMallocHost(&p, n ? n : 1) != cudaSuccess) return NULL;
    return p;
}
extern "C" void tps_gpu_host_free(tps_gpu *g, void *p)
{
    (void)g;
    if (p) cudaFreeHost(p);
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
