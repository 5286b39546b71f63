/* fuzz_index.c - the input is model.safetensors.index.json in a model
 * directory that also holds config.json and two real part files:
 *   model-00001-of-00002.safetensors: model.embed_tokens.weight [8,4] F32...
 *   model-00002-of-00002.safetensors: model.norm.weight [4]
 * (the same tensors as testdata/bad/dir_*), so seeds taken from there reach
 * the consistency checks. */
#include "fuzz_common.h"

static void setup(void)
{
    static int done;
    if (done) return;
    done = 1;
    fz_mkdir("m");
    fz_write(fz_path("m", "config.json"), fz_llama_config, strlen(fz_llama_config));
    static const fz_tensor p1[] = {{"model.embed_tokens.weight", 2, {8, 4}}};
    static const fz_tensor p2[] = {{"model.norm.weight", 1, {4}}, {"model.extra", 1, {3}}};
    fz_write_st(fz_path("m", "model-00001-of-00002.safetensors"), p1, 1);
    fz_write_st(fz_path("m", "model-00002-of-00002.safetensors"), p2, 2);
    /* a file outside the model dir that a traversal would reach */
    fz_write_st(fz_path(NULL, "outside.safetensors"), p2, 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup();
    fz_write(fz_path("m", "model.safetensors.index.json"), data, size);
    tps_ctx *ctx = tps_ctx_new();
    tps_ckpt *ck = NULL;
    tps_err rc = tps_ckpt_open(ctx, fz_path(NULL, "m"), &ck);
    if (rc == TPS_OK) {
        /* whatever the index says, nothing outside the model dir is used */
        for (size_t i = 0; i < tps_ckpt_file_count(ck); i++)
            if (strstr(tps_ckpt_file(ck, i), "outside")) abort();
        fz_walk_ckpt(ctx, ck);
    } else if (tps_ctx_errmsg(ctx)[0] == 0) {
        abort();
    }
    tps_ckpt_free(ck);
    tps_ctx_free(ctx);
    return 0;
}
