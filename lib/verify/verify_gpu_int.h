/* verify_gpu_int.h - what the GPU backend's files share (C++, nvcc only):
 * the checked-call macros, the backend's state (devices, slots, jobs) and
 * the helpers each file lends the others.
 *   verify_cuda.cu      errors, device memory, waits, open and close
 *   verify_nccl.cu      the communicators (cuda, nccl) and the NCCL bootstrap
 *   verify_gpu_jobs.cu  jobs: operands uploaded, GEMMs queued, results
 * Private to lib/verify/. */
#ifndef TPS_VERIFY_GPU_INT_H
#define TPS_VERIFY_GPU_INT_H

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

static inline int call_name_len(const char *call)
{
    return (int)strcspn(call, "(");
}

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void nap(int spins)
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

static inline int dev_index(const tps_gpu *g, int dev)
{
    for (size_t i = 0; i < g->devs.size(); i++)
        if (g->devs[i] == dev) return (int)i;
    return -1;
}

static inline unsigned grid_for(size_t n)
{
    size_t b = (n + 255) / 256;
    return (unsigned)(b < 1 ? 1 : b > 8192 ? 8192 : b);
}

/* verify_cuda.cu */
tps_err dev_alloc(tps_ctx *ctx, tps_gpu *g, int dev, size_t n, void **out, size_t *cap);
void dev_release(tps_gpu *g, int dev, void *p, size_t cap);
tps_err job_alloc(tps_ctx *ctx, tps_gpu *g, tps_gpu_job *j, int dev, size_t n, void **out);
tps_err nccl_settle(tps_ctx *ctx, tps_gpu *g, double limit, const char *what);
size_t round_up(size_t n);
tps_err stream_wait(tps_ctx *ctx, tps_gpu *g, cudaStream_t s, const char *what);
tps_err wait_collectives(tps_ctx *ctx, tps_gpu *g, const char *what);
tps_err nccl_abort_all(tps_gpu *g);

/* verify_nccl.cu */
void comm_noop_destroy(tps_comm *c);
tps_err cuda_allgather(tps_comm *c, tps_ctx *ctx, const float *const *in, const uint64_t *cols, uint64_t rows, float *const *out);
tps_err cuda_allreduce(tps_comm *c, tps_ctx *ctx, const float *const *in, uint64_t n, float *const *out);
tps_err nccl_allgather(tps_comm *c, tps_ctx *ctx, const float *const *in, const uint64_t *cols, uint64_t rows, float *const *out);
tps_err nccl_allreduce(tps_comm *c, tps_ctx *ctx, const float *const *in, uint64_t n, float *const *out);
tps_err open_nccl(tps_ctx *ctx, tps_gpu *g, int ndev, const char *id_file);

#endif
