/* The bound on a manifest's tensor-rank entries (tps_max_manifest_entries,
 * 16M: Kimi-K2 at tp 8 takes 1.12M), lowered here to the entries of a tiny
 * split: a split over it is refused before anything is written, naming the
 * count and the bound; a split at the bound is written, and its directory is
 * refused by the reader once the bound is one less. */
#include <sys/stat.h>

#include "internal.h"
#include "test.h"

static char dir[256];

static tps_err split_to(const char *out, size_t *entries, char *msg, size_t cap)
{
    tps_ctx *ctx = tps_ctx_new();
    tps_ckpt *ck = NULL;
    tps_plan *plan = NULL;
    tps_layout *L = NULL;
    tps_err rc = tps_ckpt_open(ctx, "testdata/conformance/llama-tp4-uneven-vocab/model", &ck);
    if (!rc) rc = tps_plan_detect(ctx, ck, &plan);
    if (!rc) rc = tps_layout_new(ctx, ck, plan, 4, &L);
    if (!rc) {
        *entries = L->npieces > L->nrt ? L->npieces : L->nrt;
        tps_split_opts so = {.tp = 4, .out_dir = out};
        tps_split_result sr;
        rc = tps_split(ctx, ck, L, &so, &sr);
    }
    snprintf(msg, cap, "%s", rc ? tps_ctx_errmsg(ctx) : "");
    tps_layout_free(L);
    tps_plan_free(plan);
    tps_ckpt_free(ck);
    tps_ctx_free(ctx);
    return rc;
}

static void bound_both_ways(void)
{
    char out[300], msg[1024], want[64];
    size_t entries = 0;
    struct stat sb;
    snprintf(out, sizeof out, "%s/over", dir);
    size_t keep = tps_max_manifest_entries;

    tps_max_manifest_entries = 1;
    CHECK(split_to(out, &entries, msg, sizeof msg) == TPS_E_NOMEM);
    CHECK(entries > 1);
    tps_max_manifest_entries = entries - 1;
    tps_err rc = split_to(out, &entries, msg, sizeof msg);
    snprintf(want, sizeof want, "make %zu tensor-rank entries, over the %zu", entries, entries - 1);
    CHECK_MSG(rc == TPS_E_NOMEM && strstr(msg, want), "over the bound: rc %d '%s'", (int)rc, msg);
    CHECK_MSG(stat(out, &sb) != 0, "a refused split left %s", out);

    snprintf(out, sizeof out, "%s/at", dir);
    tps_max_manifest_entries = entries;
    rc = split_to(out, &entries, msg, sizeof msg);
    CHECK_MSG(rc == TPS_OK, "at the bound: rc %d '%s'", (int)rc, msg);

    tps_ctx *ctx = tps_ctx_new();
    tps_ckpt *ck = NULL;
    CHECK(tps_ckpt_open_path(ctx, out, &ck) == TPS_OK);
    tps_ckpt_free(ck);
    ck = NULL;
    tps_max_manifest_entries = entries - 1;
    rc = tps_ckpt_open_path(ctx, out, &ck);
    snprintf(want, sizeof want, "more than the %zu a manifest may hold", entries - 1);
    CHECK_MSG(rc == TPS_E_JSON && strstr(tps_ctx_errmsg(ctx), want), "reader: rc %d '%s'", (int)rc,
              tps_ctx_errmsg(ctx));
    tps_ckpt_free(ck);
    tps_ctx_free(ctx);
    tps_max_manifest_entries = keep;
}

int main(void)
{
    const char *tmp = getenv("TPS_TMP") ? getenv("TPS_TMP") : "/tmp";
    snprintf(dir, sizeof dir, "%s/manbound.XXXXXX", tmp);
    if (!mkdtemp(dir)) return 1;
    RUN(bound_both_ways);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) return 1;
    TEST_EXIT();
}
