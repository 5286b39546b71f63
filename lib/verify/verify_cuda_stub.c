/* verify_cuda_stub.c - the GPU seam when tpshard is built without CUDA: every
 * entry point says how to get the backend. */
#include <stdio.h>

#include "internal.h"
#include "verify_cuda.h"

#define NOT_BUILT                                                                                  \
    "the cuda backend is not built in: rebuild with `make CUDA=1` (needs the CUDA toolkit "        \
    "with cuBLAS and NCCL)"

tps_err tps_gpu_open(tps_ctx *ctx, tps_backend kind, int tp, int nslots, const char *nccl_id_file,
                     tps_gpu **out)
{
    (void)tp, (void)nslots, (void)nccl_id_file;
    if (out) *out = NULL;
    return tps_fail(ctx, TPS_E_UNSUPPORTED, "--backend %s: %s",
                    kind == TPS_BACKEND_NCCL ? "nccl" : "cuda", NOT_BUILT);
}
void tps_gpu_close(tps_gpu *g)
{
    (void)g;
}
const char *tps_gpu_describe(const tps_gpu *g)
{
    (void)g;
    return "none";
}
void tps_gpu_local_ranks(const tps_gpu *g, unsigned char *mask)
{
    (void)g, (void)mask;
}
int tps_gpu_is_root(const tps_gpu *g)
{
    (void)g;
    return 1;
}
void *tps_gpu_host_alloc(tps_gpu *g, size_t n)
{
    (void)g, (void)n;
    return NULL;
}
void tps_gpu_host_free(tps_gpu *g, void *p)
{
    (void)g, (void)p;
}
tps_err tps_gpu_job_new(tps_ctx *ctx, tps_gpu *g, const tps_gpu_job_desc *d, tps_gpu_job **out)
{
    (void)g, (void)d;
    if (out) *out = NULL;
    return tps_fail(ctx, TPS_E_UNSUPPORTED, "%s", NOT_BUILT);
}
tps_err tps_gpu_job_rows(tps_ctx *ctx, tps_gpu *g, tps_gpu_job *j, int slot, int side,
                         uint64_t row0, uint64_t nrows, const void *bytes)
{
    (void)g, (void)j, (void)slot, (void)side, (void)row0, (void)nrows, (void)bytes;
    return tps_fail(ctx, TPS_E_UNSUPPORTED, "%s", NOT_BUILT);
}
tps_err tps_gpu_job_rows_ref(tps_ctx *ctx, tps_gpu *g, tps_gpu_job *j, int slot, int side,
                             uint64_t row0, uint64_t nrows, uint64_t col0, int *done)
{
    (void)g, (void)j, (void)slot, (void)side, (void)row0, (void)nrows, (void)col0;
    *done = 0;
    return tps_fail(ctx, TPS_E_UNSUPPORTED, "%s", NOT_BUILT);
}
tps_err tps_gpu_slot_sync(tps_ctx *ctx, tps_gpu *g, int slot)
{
    (void)ctx, (void)g, (void)slot;
    return TPS_OK;
}
void tps_gpu_stats(const tps_gpu *g, char *buf, size_t len)
{
    (void)g;
    if (len) buf[0] = 0;
}
tps_err tps_gpu_job_contrib(tps_ctx *ctx, tps_gpu *g, tps_gpu_job *j, int rank, const float *host)
{
    (void)g, (void)j, (void)rank, (void)host;
    return tps_fail(ctx, TPS_E_UNSUPPORTED, "%s", NOT_BUILT);
}
tps_err tps_gpu_job_finish(tps_ctx *ctx, tps_gpu *g, tps_gpu_job *j, float *yref, float *sabs,
                           float *ysh)
{
    (void)g, (void)j, (void)yref, (void)sabs, (void)ysh;
    return tps_fail(ctx, TPS_E_UNSUPPORTED, "%s", NOT_BUILT);
}
void tps_gpu_job_free(tps_gpu *g, tps_gpu_job *j)
{
    (void)g, (void)j;
}
tps_err tps_gpu_sum_u64(tps_ctx *ctx, tps_gpu *g, uint64_t *v)
{
    (void)ctx, (void)g, (void)v;
    return TPS_OK;
}
tps_err tps_gpu_runtime_info(char *buf, size_t len)
{
    /* informational: `tpshard --version` prints it */
    if (buf && len) snprintf(buf, len, "CUDA not built in (make CUDA=1)");
    return TPS_OK;
}
