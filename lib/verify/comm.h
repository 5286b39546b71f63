/* comm.h - the communicator the verify backends share, and the numeric
 * contract (inputs, tolerance) every backend follows.
 *
 * A communicator runs the two collectives tensor parallelism needs over
 * `nranks` ranks, NCCL-style: one call carries the buffers of every rank this
 * process drives (`nlocal` of them, global ids in `local[]`), the way one
 * thread drives several GPUs inside ncclGroupStart/End.
 *
 *  - allgather: rank r contributes a row-major [rows, cols[r]] f32 block; every
 *    rank receives the row-major [rows, sum(cols)] matrix with rank r's block
 *    at column offset cols[0] + ... + cols[r-1] (the all-gather along the last
 *    dim of a colwise Linear). cols may differ per rank and may be 0
 *    (torch.chunk gives uneven and empty shards).
 *  - allreduce: every rank contributes n f32; every rank receives the
 *    element-wise sum. The cpu and cuda implementations add in rank order
 *    ((r0 + r1) + r2) + ..., so results are bit-reproducible; NCCL sums in its
 *    own (fixed) order, which the tolerance covers.
 *
 * Buffers are host memory for "cpu", device memory for "cuda" (all on one
 * device) and "nccl" (local rank l's buffers on its own device). out[l] is
 * local rank l's result; backends whose ranks share one memory (cpu, cuda)
 * accept the same pointer for every l, and NULL entries are skipped.
 * Calls on one communicator must not run concurrently.
 */
#ifndef TPS_COMM_H
#define TPS_COMM_H

#include <math.h>
#include <stdint.h>

#include "tpshard.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tps_comm tps_comm;
struct tps_comm {
    const char *name; /* "cpu", "cuda", "nccl" */
    int nranks;       /* tp */
    int nlocal;       /* ranks driven by this process */
    const int *local; /* their global ids, ascending */
    void *state;
    tps_err (*allgather)(tps_comm *c, tps_ctx *ctx, const float *const *in, const uint64_t *cols,
                         uint64_t rows, float *const *out);
    tps_err (*allreduce)(tps_comm *c, tps_ctx *ctx, const float *const *in, uint64_t n,
                         float *const *out);
    void (*destroy)(tps_comm *c);
};

/* Ranks as threads: one OpenMP thread per rank reduces its 1/nranks slice of
 * the buffer over all ranks in rank order (reduce-scatter), and the shared
 * memory makes the all-gather of the slices free. NULL on allocation failure. */
tps_comm *tps_comm_cpu_new(int nranks);
static inline void tps_comm_free(tps_comm *c)
{
    if (c) c->destroy(c);
}

/* ------------------------------------------------------------------ numeric contract */

/* Unit roundoff of f32 (round to nearest). */
#define TPS_U32F 5.9604644775390625e-08 /* 2^-24 */

/* gamma(n) = n u / (1 - n u) (Higham, Accuracy and Stability, 3.1): any
 * evaluation order of an n-term f32 dot product is within gamma(n) * sum|x_i
 * w_i| of the exact value. Infinity when n u >= 1. */
static inline double tps_gamma(uint64_t n)
{
    double nu = (double)n * TPS_U32F;
    return nu >= 1.0 ? INFINITY : nu / (1.0 - nu);
}

/* Tolerance on |y_sharded - y_reference| for one output element whose
 * reference sums `terms` products (reduction length, + 1 for a bias) split
 * over tp ranks, with abs_sum = sum |x_i w_i| (+ |b|). Both sides carry up to
 * gamma(terms + tp) of error from the exact value, so their difference is
 * bounded by twice that; the abs sum is itself rounded (f32, up to gamma of
 * relative error), hence the last factor. */
static inline double tps_tolerance(uint64_t terms, int tp, double abs_sum)
{
    double g = tps_gamma(terms + (uint64_t)tp);
    return 2.0 * g * abs_sum * (1.0 + g);
}

/* Seeded inputs every backend shares: splitmix64 of (seed, stream, index),
 * mapped to k/256 with k uniform in [-256, 256), i.e. uniform on [-1, 1) in
 * steps of 2^-8. Values with 8 significant bits are exact in BF16 and F16, so
 * a GPU GEMM on BF16/F16 operands sees exactly the inputs the CPU uses. */
static inline uint64_t tps_splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}
static inline float tps_input_value(uint64_t seed, uint64_t row, uint64_t col)
{
    uint64_t h =
        tps_splitmix64(seed ^ tps_splitmix64(row * 0x100000001B3ull + 0x5851F42D4C957F2Dull) ^
                       (col * 0xD6E8FEB86659FD93ull));
    return (float)((int64_t)(h >> 55) - 256) / 256.0f; /* h >> 55 in [0, 512) */
}
/* Token id b of a batch for a table of `vocab` rows. */
static inline uint64_t tps_input_id(uint64_t seed, uint64_t b, uint64_t vocab)
{
    return vocab ? tps_splitmix64(seed ^ 0xE7037ED1A0B428DBull ^ tps_splitmix64(b)) % vocab : 0;
}

#ifdef __cplusplus
}
#endif
#endif
