/* verify_nccl.cu - the communicators of the GPU backends (tps_comm, comm.h):
 * cuda (every rank on one GPU: the all-gather a 2-D device copy per rank,
 * the all-reduce a kernel adding the ranks' buffers in rank order) and nccl
 * (one rank per GPU: ncclAllGather padded to equal counts then unpacked,
 * ncclAllReduce), and the NCCL bootstrap (one process driving its local
 * GPUs, or one process per rank with the unique id passed through a file). */
#include "verify_gpu_int.h"

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

/* ------------------------------------------------------------------ communicators */

tps_err cuda_allgather(tps_comm *c, tps_ctx *ctx, const float *const *in,
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

tps_err cuda_allreduce(tps_comm *c, tps_ctx *ctx, const float *const *in, uint64_t n,
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
tps_err nccl_allgather(tps_comm *c, tps_ctx *ctx, const float *const *in,
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

tps_err nccl_allreduce(tps_comm *c, tps_ctx *ctx, const float *const *in, uint64_t n,
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

void comm_noop_destroy(tps_comm *c)
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

tps_err open_nccl(tps_ctx *ctx, tps_gpu *g, int ndev, const char *id_file)
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
