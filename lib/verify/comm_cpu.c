/* comm_cpu.c - the "cpu" communicator: ranks as threads over shared memory.
 *
 * allreduce is a reduce-scatter by rank threads: thread r owns a contiguous
 * slice of the output and sums every rank's buffer over that slice in rank
 * order, so each element is ((x0 + x1) + x2) + ... whatever the thread count:
 * bit-reproducible, and the same order the cuda backend's sum kernel uses.
 * The all-gather of the reduced slices is free because the ranks share the
 * output buffer. Small buffers are reduced by the calling thread: spawning
 * threads costs more than the adds. */
#include <stdlib.h>
#include <string.h>

#include "comm.h"

#ifdef _OPENMP
#include <omp.h>
#endif

typedef struct {
    tps_comm c;
    int *local;
} cpu_comm;

/* Below this many floats per call, one thread is faster than a team. */
#define CPU_PAR_MIN (1u << 16)

static void reduce_range(const float *const *in, int nranks, uint64_t a, uint64_t b, float *out)
{
    if (b <= a) return;
    /* r = 0 first, then add in rank order: out may alias in[0]. */
    if (out != in[0]) memcpy(out + a, in[0] + a, (size_t)(b - a) * sizeof(float));
    for (int r = 1; r < nranks; r++) {
        const float *x = in[r] + a;
        float *o = out + a;
        for (uint64_t i = 0; i < b - a; i++) o[i] += x[i];
    }
}

static void copy_out(float *const *out, int nlocal, const float *src, uint64_t n)
{
    for (int l = 1; l < nlocal; l++)
        if (out[l] && out[l] != src) memcpy(out[l], src, (size_t)n * sizeof(float));
}

static tps_err cpu_allreduce(tps_comm *c, tps_ctx *ctx, const float *const *in, uint64_t n,
                             float *const *out)
{
    (void)ctx;
    int nr = c->nranks;
    float *o = out[0];
    if (!o) return TPS_E_ARG;
    if (n < CPU_PAR_MIN || nr < 2) {
        reduce_range(in, nr, 0, n, o);
    } else {
#ifdef _OPENMP
#pragma omp parallel num_threads(nr)
        {
            int r = omp_get_thread_num(), nt = omp_get_num_threads();
            uint64_t a = n * (uint64_t)r / (uint64_t)nt, b = n * (uint64_t)(r + 1) / (uint64_t)nt;
            reduce_range(in, nr, a, b, o);
        }
#else
        reduce_range(in, nr, 0, n, o);
#endif
    }
    copy_out(out, c->nlocal, o, n);
    return TPS_OK;
}

static tps_err cpu_allgather(tps_comm *c, tps_ctx *ctx, const float *const *in,
                             const uint64_t *cols, uint64_t rows, float *const *out)
{
    (void)ctx;
    int nr = c->nranks;
    uint64_t total = 0;
    for (int r = 0; r < nr; r++) total += cols[r];
    float *o = out[0];
    if (!o) return TPS_E_ARG;
    uint64_t off = 0;
    for (int r = 0; r < nr; r++) {
        for (uint64_t b = 0; b < rows && cols[r]; b++)
            memcpy(o + b * total + off, in[r] + b * cols[r], (size_t)cols[r] * sizeof(float));
        off += cols[r];
    }
    copy_out(out, c->nlocal, o, rows * total);
    return TPS_OK;
}

static void cpu_destroy(tps_comm *c)
{
    cpu_comm *cc = (cpu_comm *)c;
    free(cc->local);
    free(cc);
}

tps_comm *tps_comm_cpu_new(int nranks)
{
    if (nranks < 1) return NULL;
    cpu_comm *cc = calloc(1, sizeof *cc);
    if (!cc) return NULL;
    cc->local = malloc(sizeof(int) * (size_t)nranks);
    if (!cc->local) {
        free(cc);
        return NULL;
    }
    for (int r = 0; r < nranks; r++) cc->local[r] = r;
    cc->c.name = "cpu";
    cc->c.nranks = nranks;
    cc->c.nlocal = nranks;
    cc->c.local = cc->local;
    cc->c.state = cc;
    cc->c.allgather = cpu_allgather;
    cc->c.allreduce = cpu_allreduce;
    cc->c.destroy = cpu_destroy;
    return &cc->c;
}
