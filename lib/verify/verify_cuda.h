/* verify_cuda.h - the plain C seam between verify.c and the GPU backends
 * (lib/verify/verify_cuda.cu, verify_nccl.cu and verify_gpu_jobs.cu with `make CUDA=1`,
 * verify_cuda_stub.c without).
 *
 * verify.c owns the I/O, the reconstruction, the inputs, the biases, the
 * block activations and the comparison; a GPU backend owns the products and
 * the collectives. A "job" is one sharded Linear (or the collective of an
 * embedding lookup):
 *
 *   tps_gpu_job_new       uploads the inputs (reference [nb, in], per rank
 *                         [nb, kr[r]]) and sizes the device outputs;
 *   tps_gpu_job_rows      takes weight rows as they are read (reference rows
 *                         from the source, rank r's rows from its rank file)
 *                         and queues Y[:, rows] = X W[rows]^T with cuBLAS on
 *                         the calling slot's stream;
 *   tps_gpu_job_rows_ref  the same for rank rows that the caller has just
 *                         compared byte for byte with reference rows this
 *                         slot staged: the GEMM reads the staged copy, so
 *                         identical bytes cross PCIe once (rows that differ
 *                         go through tps_gpu_job_rows, so a corrupt shard's
 *                         own bytes feed its product);
 *   tps_gpu_slot_sync     waits for what the slot queued (once per task);
 *   tps_gpu_job_contrib   takes a rank's precomputed contribution instead
 *                         (embedding lookups);
 *   tps_gpu_job_finish    runs the all-gather (colwise) or all-reduce
 *                         (rowwise, embedding) on the device(s) in rank
 *                         order (cuda) or with NCCL (nccl), and copies the
 *                         results back.
 *
 * Threads: job_rows may be called concurrently for the same or different
 * jobs with distinct `slot`s (0 .. nslots-1, one per calling thread). The
 * bytes it takes must stay unchanged until the slot's next tps_gpu_slot_sync
 * (pinned buffers are copied asynchronously; pageable ones are staged before
 * it returns), and a job's products are complete only once every slot that
 * fed it has synced. job_new, job_contrib, job_finish and
 * job_free are called by one thread at a time, and job_finish in the same job
 * order on every process (NCCL needs the collectives in one order).
 * Every CUDA/cuBLAS/NCCL failure returns TPS_E_DEVICE with the call, file:line
 * and the library's error string in the ctx; no wait is unbounded.
 */
#ifndef TPS_VERIFY_CUDA_H
#define TPS_VERIFY_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "tpshard.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tps_gpu tps_gpu;
typedef struct tps_gpu_job tps_gpu_job;

typedef struct {
    int gather; /* 1: colwise (rank r owns output columns [lo, lo+len)), 0: partial sums */
    int matmul; /* 1: outputs from job_rows; 0: contributions from job_contrib */
    int tp;
    tps_dtype dtype;          /* row operand dtype: TPS_BF16, TPS_F16 or TPS_F32 */
    uint64_t out;             /* output columns (weight rows) */
    uint64_t in;              /* reference input width (weight columns) */
    int nb;                   /* input rows (tokens) */
    const float *xref;        /* [nb, in]; values exact in dtype */
    const float *const *xr;   /* per rank [nb, kr[r]]; NULL for ranks this process does not drive */
    const uint64_t *kr;       /* per rank input width */
    const uint64_t *lo, *len; /* per rank output columns (gather) */
    int want_ref;             /* compute the reference and |X| |W|^T on the device */
} tps_gpu_job_desc;

/* kind: TPS_BACKEND_CUDA (every rank on device 0) or TPS_BACKEND_NCCL (one
 * rank per GPU: one process driving tp local GPUs, or one process per rank
 * with RANK/WORLD_SIZE/LOCAL_RANK, OMPI_COMM_WORLD_* or SLURM_* in the
 * environment and the NCCL unique id passed through nccl_id_file). */
tps_err tps_gpu_open(tps_ctx *ctx, tps_backend kind, int tp, int nslots, const char *nccl_id_file,
                     tps_gpu **out);
void tps_gpu_close(tps_gpu *g);
const char *tps_gpu_describe(const tps_gpu *g);                  /* "cuda (NVIDIA H200, ...)" */
void tps_gpu_local_ranks(const tps_gpu *g, unsigned char *mask); /* tp entries */
int tps_gpu_is_root(const tps_gpu *g); /* this process compares and reports */

/* Pinned host memory (cudaMallocHost) for the read buffers. */
void *tps_gpu_host_alloc(tps_gpu *g, size_t n);
void tps_gpu_host_free(tps_gpu *g, void *p);

tps_err tps_gpu_job_new(tps_ctx *ctx, tps_gpu *g, const tps_gpu_job_desc *d, tps_gpu_job **out);
/* side -1: reference rows [row0, row0 + nrows) of the full weight, each `in`
 * elements; side r: rank r's rows (global row numbers), each kr[r] elements. */
tps_err tps_gpu_job_rows(tps_ctx *ctx, tps_gpu *g, tps_gpu_job *j, int slot, int side,
                         uint64_t row0, uint64_t nrows, const void *bytes);
/* Rank `side`'s rows [row0, row0 + nrows), columns [col0, col0 + kr[side]),
 * from the reference rows this slot staged last in this task (they start at
 * their own row0 and are `in` wide). *done = 1 when queued (or nothing to
 * do); 0 when those rows are not staged here (another device, another job,
 * no reference on this process): then call tps_gpu_job_rows. */
tps_err tps_gpu_job_rows_ref(tps_ctx *ctx, tps_gpu *g, tps_gpu_job *j, int slot, int side,
                             uint64_t row0, uint64_t nrows, uint64_t col0, int *done);
/* Waits for the slot's queued copies and GEMMs; the staging is free again. */
tps_err tps_gpu_slot_sync(tps_ctx *ctx, tps_gpu *g, int slot);
/* One line: open time, handles, bytes uploaded and reused, GEMMs, waits. */
void tps_gpu_stats(const tps_gpu *g, char *buf, size_t len);
/* Rank r's [nb, gather ? len[r] : out] f32 contribution. */
tps_err tps_gpu_job_contrib(tps_ctx *ctx, tps_gpu *g, tps_gpu_job *j, int rank, const float *host);
/* yref and sabs ([nb, out], only with want_ref; may be NULL) and ysh ([nb, out]). */
tps_err tps_gpu_job_finish(tps_ctx *ctx, tps_gpu *g, tps_gpu_job *j, float *yref, float *sabs,
                           float *ysh);
void tps_gpu_job_free(tps_gpu *g, tps_gpu_job *j);

/* Sums v over every process (nccl multi-process); unchanged otherwise. */
tps_err tps_gpu_sum_u64(tps_ctx *ctx, tps_gpu *g, uint64_t *v);

/* "CUDA driver 13.0, runtime 13.0, NCCL 2.27.7, 1 GPU: NVIDIA H200" or why not. */
tps_err tps_gpu_runtime_info(char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
