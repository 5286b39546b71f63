/* fuzz_manifest.c - the input is tpshard.json in a real split output
 * directory: at start-up a tiny LLaMA is split --tp 2 by the library itself,
 * then each input replaces the manifest and the directory is opened as a
 * checkpoint (what merge and verify read) and checked (tps_check_dir).
 * TPS_FUZZ_DUMP=FILE copies the genuine manifest there (seed making). */
#include "fuzz_common.h"

static void setup(void)
{
    static int done;
    if (done) return;
    done = 1;
    tps_ctx *ctx = tps_ctx_new();
    tps_ckpt *src = NULL;
    tps_plan *plan = NULL;
    tps_layout *L = NULL;
    fz_make_llama("m", fz_llama_config);
    const char *out = strdup(fz_path(NULL, "out"));
    tps_split_opts o = {.tp = 2, .out_dir = out};
    tps_split_result res;
    if (tps_ckpt_open(ctx, fz_path(NULL, "m"), &src) != TPS_OK ||
        tps_plan_detect(ctx, src, &plan) != TPS_OK ||
        tps_layout_new(ctx, src, plan, 2, &L) != TPS_OK ||
        tps_split(ctx, src, L, &o, &res) != TPS_OK) {
        fprintf(stderr, "fuzz setup (split): %s\n", tps_ctx_errmsg(ctx));
        abort();
    }
    const char *dump = getenv("TPS_FUZZ_DUMP");
    if (dump && *dump) {
        char *buf = NULL;
        size_t len = 0;
        if (tps_read_file(ctx, fz_path("out", TPS_MANIFEST), 1 << 24, &buf, &len) == TPS_OK)
            fz_write(dump, buf, len);
        free(buf);
    }
    tps_layout_free(L);
    tps_plan_free(plan);
    tps_ckpt_free(src);
    tps_ctx_free(ctx);
    free((void *)out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup();
    fz_write(fz_path("out", TPS_MANIFEST), data, size);
    tps_ctx *ctx = tps_ctx_new();
    tps_ckpt *ck = NULL;
    if (tps_ckpt_open(ctx, fz_path(NULL, "out"), &ck) == TPS_OK)
        fz_walk_ckpt(ctx, ck);
    else if (tps_ctx_errmsg(ctx)[0] == 0)
        abort();
    tps_ckpt_free(ck);
    tps_check_result cr;
    memset(&cr, 0, sizeof cr);
    (void)tps_check_dir(ctx, fz_path(NULL, "out"), &cr);
    tps_ctx_free(ctx);
    return 0;
}
