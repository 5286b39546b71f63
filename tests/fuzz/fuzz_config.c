/* fuzz_config.c - the input is config.json beside a tiny LLaMA
 * model.safetensors. An accepted checkpoint goes on through plan detection
 * and layout (the plan's config checks, per-layer values) for tp 1..4; the
 * text also goes through --untie's rewrite of tie_word_embeddings. */
#include "fuzz_common.h"

static void setup(void)
{
    static int done;
    if (done) return;
    done = 1;
    fz_make_llama("m", NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup();
    fz_write(fz_path("m", "config.json"), data, size);
    /* --untie's rewrite of config.json, on any text (it is meant for parsed JSON). */
    free(tps_json_untie_text((const char *)data, size));
    tps_ctx *ctx = tps_ctx_new();
    tps_ckpt *ck = NULL;
    if (tps_ckpt_open(ctx, fz_path(NULL, "m"), &ck) == TPS_OK) {
        fz_walk_ckpt(ctx, ck);
        tps_plan *plan = NULL;
        if (tps_plan_detect(ctx, ck, &plan) == TPS_OK && plan) {
            for (int tp = 1; tp <= 4; tp++) {
                tps_layout *L = NULL;
                if (tps_layout_new(ctx, ck, plan, tp, &L) == TPS_OK) {
                    for (size_t i = 0; i < tps_layout_check_count(L); i++) {
                        tps_check_view v;
                        tps_layout_check(L, i, &v);
                    }
                    (void)tps_layout_rejected(L);
                    for (size_t i = 0; i < tps_layout_layer_count(L); i++) {
                        tps_layer_view lv;
                        tps_layout_layer(L, i, &lv);
                    }
                }
                tps_layout_free(L);
            }
        }
        tps_plan_free(plan);
    } else if (tps_ctx_errmsg(ctx)[0] == 0) {
        abort();
    }
    tps_ckpt_free(ck);
    tps_ctx_free(ctx);
    return 0;
}
