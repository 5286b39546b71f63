/* fuzz_plan.c - the input is a YAML plan (tps_plan_parse). An accepted plan
 * is applied to a tiny LLaMA checkpoint for tp 1..3: every placement must be
 * a dim the tensor has, and the local extents must tile the dim exactly. */
#include "fuzz_common.h"

static tps_ckpt *ck;
static tps_ctx *setup_ctx;

static void setup(void)
{
    if (setup_ctx) return;
    setup_ctx = tps_ctx_new();
    fz_make_llama("m", fz_llama_config);
    if (tps_ckpt_open(setup_ctx, fz_path(NULL, "m"), &ck) != TPS_OK) {
        fprintf(stderr, "fuzz setup: %s\n", tps_ctx_errmsg(setup_ctx));
        abort();
    }
}

static void cleanup(void)
{
    tps_ckpt_free(ck);
    tps_ctx_free(setup_ctx);
    ck = NULL;
    setup_ctx = NULL;
}

static void apply(tps_ctx *ctx, const tps_plan *plan, int tp)
{
    tps_layout *L = NULL;
    if (tps_layout_new(ctx, ck, plan, tp, &L) != TPS_OK) return;
    for (size_t i = 0; i < tps_layout_count(L); i++) {
        tps_placement_view v;
        tps_layout_placement(L, i, &v);
        if (v.dim < -1 || v.dim >= v.ndim) abort();
        if (v.dim < 0) continue;
        uint64_t next = 0;
        for (int r = 0; r < tp; r++) {
            uint64_t s, n;
            tps_layout_local(L, i, r, &s, &n);
            if (s != next && n) abort();
            if (n) next = s + n;
        }
        if (next != v.shape[v.dim] && v.shape[v.dim]) abort();
    }
    for (int r = 0; r < tp; r++) (void)tps_layout_rank_bytes(L, r);
    (void)tps_layout_rejected(L);
    tps_layout_free(L);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int registered;
    if (!registered) {
        registered = 1;
        atexit(cleanup);
    }
    setup();
    tps_ctx *ctx = tps_ctx_new();
    tps_plan *plan = NULL;
    tps_err rc = tps_plan_parse(ctx, "fuzz.yaml", (const char *)data, size, &plan);
    if (rc == TPS_OK) {
        (void)tps_plan_name(plan);
        (void)tps_plan_description(plan);
        for (int tp = 1; tp <= 3; tp++) apply(ctx, plan, tp);
    } else if (tps_ctx_errmsg(ctx)[0] == 0) {
        abort();
    }
    tps_plan_free(plan);
    tps_ctx_free(ctx);
    return 0;
}
