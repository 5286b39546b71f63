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
#include "verify_gpu_int.h"

/* ------------------------------------------------------------------ device memory */

size_t round_up(size_t n)
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
tps_err dev_alloc(tps_ctx *ctx, tps_gpu *g, int dev, size_t n, void **out, size_t *cap)
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
void dev_release(tps_gpu *g, int dev, void *p, size_t cap)
{
    if (!p) return;
    pthread_mutex_lock(&g->mu);
    g->pool.push_back(pool_ent{dev, p, cap});
    pthread_mutex_unlock(&g->mu);
}

/* Allocates for a job and remembers the block so that job_free returns it. */
tps_err job_alloc(tps_ctx *ctx, tps_gpu *g, tps_gpu_job *j, int dev, size_t n, void **out)
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

tps_err nccl_abort_all(tps_gpu *g)
{
    if (g->aborted) return TPS_OK;
    g->aborted = 1;
    for (size_t l = 0; l < g->comms.size(); l++)
        if (g->comms[l]) ncclCommAbort(g->comms[l]);
    return TPS_OK;
}

tps_err stream_wait(tps_ctx *ctx, tps_gpu *g, cudaStream_t s, const char *what)
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
tps_err nccl_settle(tps_ctx *ctx, tps_gpu *g, double limit, const char *what)
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

tps_err wait_collectives(tps_ctx *ctx, tps_gpu *g, const char *what)
{
    for (size_t i = 0; i < g->devs.size(); i++) {
        CUDA_TRY(ctx, cudaSetDevice(g->devs[i]));
        TPS_TRY(stream_wait(ctx, g, g->cstream[i], what));
    }
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
