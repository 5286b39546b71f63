/* test_tasks.c - split --ranks auto: shares of the ranks, and the launcher
 * variables they come from (tps_task_ranks, tps_task_from_env). */
#include <string.h>

#include "test.h"
#include "tpshard.h"

/* Every task count from 1 to 3 tp: the shares are contiguous, cover 0..tp-1
 * once in task order, differ by at most one, larger first. */
static void shares_tile_the_ranks(void)
{
    for (int tp = 1; tp <= 17; tp++)
        for (int n = 1; n <= 3 * tp; n++) {
            int next = 0, prev = tp + 1;
            for (int i = 0; i < n; i++) {
                int first, k;
                tps_task_ranks(i, n, tp, &first, &k);
                CHECK_MSG(first == next, "tp %d, %d tasks, task %d starts at %d, not %d", tp, n, i,
                          first, next);
                CHECK_MSG(k <= prev && k >= 0, "tp %d, %d tasks, task %d: %d ranks after %d", tp, n,
                          i, k, prev);
                CHECK_MSG(k == tp / n || k == tp / n + 1, "tp %d, %d tasks, task %d: %d ranks", tp,
                          n, i, k);
                next = first + k;
                prev = k;
            }
            CHECK_MSG(next == tp, "tp %d, %d tasks cover %d ranks", tp, n, next);
        }
}

static int task_of(char *const *env, int tp, tps_task *t)
{
    tps_ctx *ctx = tps_ctx_new();
    tps_err e = tps_task_from_env(ctx, env, tp, t);
    tps_ctx_free(ctx);
    return e;
}

static void launchers_in_order(void)
{
    tps_task t;
    char *both[] = {"SLURM_PROCID=1", "SLURM_NTASKS=2", "RANK=5", "WORLD_SIZE=8", NULL};
    CHECK(task_of(both, 8, &t) == TPS_OK && t.index == 5 && t.count == 8 &&
          !strcmp(t.index_var, "RANK"));
    CHECK(t.first == 5 && t.nranks == 1);
    char *batch[] = {"SLURM_PROCID=0",           "SLURM_NTASKS=1",         "SLURM_ARRAY_TASK_ID=7",
                     "SLURM_ARRAY_TASK_COUNT=4", "SLURM_ARRAY_TASK_MIN=4", NULL};
    CHECK(task_of(batch, 8, &t) == TPS_OK && t.index == 3 && t.count == 4 &&
          !strcmp(t.count_var, "SLURM_ARRAY_TASK_COUNT") && t.first == 6 && t.nranks == 2);
    char *alone[] = {"SLURM_PROCID=0", "SLURM_NTASKS=1", NULL};
    CHECK(task_of(alone, 4, &t) == TPS_OK && t.index == 0 && t.count == 1 && t.first == 0 &&
          t.nranks == 4);
    char *extra[] = {"OMPI_COMM_WORLD_RANK=6", "OMPI_COMM_WORLD_SIZE=7", NULL};
    CHECK(task_of(extra, 4, &t) == TPS_OK && t.nranks == 0);
}

static void bad_environments(void)
{
    tps_task t;
    char *none[] = {"PATH=/bin", NULL};
    CHECK(task_of(none, 4, &t) == TPS_E_ARG);
    char *half[] = {"WORLD_SIZE=4", NULL};
    CHECK(task_of(half, 4, &t) == TPS_E_ARG);
    char *past[] = {"PMI_RANK=4", "PMI_SIZE=4", NULL};
    CHECK(task_of(past, 4, &t) == TPS_E_ARG);
    char *word[] = {"RANK=1x", "WORLD_SIZE=4", NULL};
    CHECK(task_of(word, 4, &t) == TPS_E_ARG);
    char *zero[] = {"RANK=0", "WORLD_SIZE=0", NULL};
    CHECK(task_of(zero, 4, &t) == TPS_E_ARG);
    char *huge[] = {"RANK=1", "WORLD_SIZE=99999999999999999999", NULL};
    CHECK(task_of(huge, 4, &t) == TPS_E_ARG);
    char *step[] = {"SLURM_ARRAY_TASK_ID=3", "SLURM_ARRAY_TASK_COUNT=4", "SLURM_ARRAY_TASK_STEP=2",
                    NULL};
    CHECK(task_of(step, 4, &t) == TPS_E_ARG);
    char *below[] = {"SLURM_ARRAY_TASK_ID=0", "SLURM_ARRAY_TASK_COUNT=4", "SLURM_ARRAY_TASK_MIN=1",
                     NULL};
    CHECK(task_of(below, 4, &t) == TPS_E_ARG);
}

int main(void)
{
    RUN(shares_tile_the_ranks);
    RUN(launchers_in_order);
    RUN(bad_environments);
    TEST_EXIT();
}
