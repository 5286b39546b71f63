/* tasks.c - split --ranks auto: the share of the ranks a launched process
 * writes, from the variables its launcher set.
 *
 * The launcher closest to the process wins: torchrun's workers also carry
 * the SLURM_PROCID of the srun that started torchrun on their node, and
 * mpirun's processes the SLURM_NTASKS of the batch job they run in, and
 * only the inner pair tells the processes apart. A pair whose count is 1
 * (a batch script's SLURM_PROCID=0/SLURM_NTASKS=1) started only this
 * process: it says nothing about the others, so the next pair is asked. */
#include "internal.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *index, *count;
} launchers[] = {
    {"RANK", "WORLD_SIZE"},                            /* torchrun, torch.distributed */
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},  /* Open MPI's mpirun */
    {"PMI_RANK", "PMI_SIZE"},                          /* MPICH and Intel MPI (Hydra) */
    {"SLURM_PROCID", "SLURM_NTASKS"},                  /* srun */
    {"SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT"}, /* a Slurm job array */
};
#define NLAUNCHERS (sizeof launchers / sizeof launchers[0])

static const char *env_get(char *const *env, const char *name)
{
    if (!env) return getenv(name);
    size_t n = strlen(name);
    for (; *env; env++)
        if (!strncmp(*env, name, n) && (*env)[n] == '=') return *env + n + 1;
    return NULL;
}

/* A whole number 0..INT_MAX, or -1. */
static long env_num(const char *s)
{
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < 0 || v > INT_MAX) return -1;
    return v;
}

void tps_task_ranks(int index, int count, int tp, int *first, int *nranks)
{
    /* Contiguous groups, the first tp % count tasks one rank larger. */
    int base = count > 0 ? tp / count : 0, extra = count > 0 ? tp % count : 0;
    *first = index * base + (index < extra ? index : extra);
    *nranks = base + (index < extra);
    if (*first > tp) *first = tp;
}

tps_err tps_task_from_env(tps_ctx *ctx, char *const *env, int tp, tps_task *t)
{
    memset(t, 0, sizeof *t);
    int found = -1; /* the first pair set, even with a count of 1 */
    long found_i = 0, found_n = 1;
    for (size_t k = 0; k < NLAUNCHERS; k++) {
        const char *si = env_get(env, launchers[k].index), *sn = env_get(env, launchers[k].count);
        if (!si && !sn) continue;
        if (!si || !sn)
            return tps_fail(ctx, TPS_E_ARG, "--ranks auto: %s is set but %s is not",
                            si ? launchers[k].index : launchers[k].count,
                            si ? launchers[k].count : launchers[k].index);
        long i = env_num(si), n = env_num(sn);
        if (i < 0)
            return tps_fail(ctx, TPS_E_ARG, "--ranks auto: %s='%s' is not a task number",
                            launchers[k].index, si);
        if (n < 1)
            return tps_fail(ctx, TPS_E_ARG, "--ranks auto: %s='%s' is not a task count",
                            launchers[k].count, sn);
        if (k == NLAUNCHERS - 1) {
            /* Array task ids run from SLURM_ARRAY_TASK_MIN in steps of
             * SLURM_ARRAY_TASK_STEP (--array=1-8, --array=0-15:4). */
            long lo = env_num(env_get(env, "SLURM_ARRAY_TASK_MIN"));
            long step = env_num(env_get(env, "SLURM_ARRAY_TASK_STEP"));
            if (lo < 0) lo = 0;
            if (step < 1) step = 1;
            if (i < lo || (i - lo) % step)
                return tps_fail(ctx, TPS_E_ARG,
                                "--ranks auto: SLURM_ARRAY_TASK_ID=%ld is not in a range from "
                                "SLURM_ARRAY_TASK_MIN=%ld in steps of %ld (give the array as a "
                                "range, e.g. --array=0-%ld)",
                                i, lo, step, n - 1);
            i = (i - lo) / step;
        }
        if (i >= n)
            return tps_fail(ctx, TPS_E_ARG, "--ranks auto: task %ld (%s) is not below %s=%ld", i,
                            launchers[k].index, launchers[k].count, n);
        if (found < 0 || (found_n == 1 && n > 1)) {
            found = (int)k;
            found_i = i;
            found_n = n;
        }
        if (n > 1) break;
    }
    if (found < 0)
        return tps_fail(ctx, TPS_E_ARG,
                        "--ranks auto: no launcher told this process its task: set RANK and "
                        "WORLD_SIZE, or run under srun, a Slurm job array, mpirun or torchrun");
    t->index = (int)found_i;
    t->count = (int)found_n;
    t->index_var = launchers[found].index;
    t->count_var = launchers[found].count;
    tps_task_ranks(t->index, t->count, tp, &t->first, &t->nranks);
    return TPS_OK;
}
