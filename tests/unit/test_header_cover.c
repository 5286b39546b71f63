/* Every byte of a rank file is covered by the manifest: one bit flipped
 * anywhere in a rank file's header (the 8-byte length, the JSON with its
 * __metadata__, the space padding) makes check fail, naming the file and
 * saying its header changed. Every bit of one rank file's header is tried,
 * for the DTensor layout and a serving layout. */
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "test.h"

static char dir[256];

static int split_to(const char *model, const char *layout, int tp, const char *out)
{
    tps_ctx *ctx = tps_ctx_new();
    tps_ckpt *ck = NULL;
    tps_plan *plan = NULL;
    tps_layout_spec *spec = NULL;
    tps_layout *L = NULL;
    tps_split_result r;
    tps_split_opts o = {.tp = tp, .out_dir = out};
    int ok = tps_ckpt_open(ctx, model, &ck) == TPS_OK && tps_plan_detect(ctx, ck, &plan) == TPS_OK &&
             (!layout || tps_layout_spec_builtin(ctx, layout, &spec) == TPS_OK) &&
             tps_layout_new_with(ctx, ck, plan, spec, tp, &L) == TPS_OK &&
             tps_split(ctx, ck, L, &o, &r) == TPS_OK;
    if (!ok) printf("#   split %s: %s\n", model, tps_ctx_errmsg(ctx));
    tps_layout_free(L);
    tps_layout_spec_free(spec);
    tps_plan_free(plan);
    tps_ckpt_free(ck);
    tps_ctx_free(ctx);
    return ok;
}

/* Flips every bit of the header of out/file in turn; check must fail each
 * time, its error naming the file and its header. */
static void sweep(const char *model, const char *layout, int tp, const char *file)
{
    char out[300], path[400];
    snprintf(out, sizeof out, "%s/%s-tp%d", dir, layout ? layout : "dtensor", tp);
    snprintf(path, sizeof path, "%s/%s", out, file);
    CHECK(split_to(model, layout, tp, out));
    tps_ctx *ctx = tps_ctx_new();
    tps_check_result res;
    tps_err e = tps_check_dir(ctx, out, &res);
    CHECK_MSG(e == TPS_OK && res.complete && res.headers_checked == res.files_checked,
              "fresh split: %d, %d of %d headers: %s", (int)e, res.headers_checked,
              res.files_checked, tps_ctx_errmsg(ctx));
    int fd = open(path, O_RDWR);
    unsigned char len[8] = {0};
    CHECK(fd >= 0 && pread(fd, len, 8, 0) == 8);
    uint64_t n = 8;
    for (int b = 0; b < 8; b++) n += (uint64_t)len[b] << (8 * b);
    CHECK(n > 8 && n % 8 == 0 && n < 1u << 20);
    uint64_t flips = 0, caught = 0, named = 0;
    for (uint64_t bit = 0; fd >= 0 && bit < 8 * n && n < 1u << 20; bit++) {
        unsigned char c, x;
        if (pread(fd, &c, 1, (off_t)(bit / 8)) != 1) break;
        x = c ^ (unsigned char)(1u << (bit % 8));
        if (pwrite(fd, &x, 1, (off_t)(bit / 8)) != 1) break;
        flips++;
        e = tps_check_dir(ctx, out, &res);
        if (e != TPS_OK) caught++;
        else if (caught + 1 == flips) /* the first miss: say which bit */
            printf("#   %s: bit %llu (byte %llu) flipped, check passed\n", file,
                   (unsigned long long)bit, (unsigned long long)(bit / 8));
        if (e == TPS_E_MISMATCH && strstr(tps_ctx_errmsg(ctx), path) &&
            strstr(tps_ctx_errmsg(ctx), "header changed"))
            named++;
        if (pwrite(fd, &c, 1, (off_t)(bit / 8)) != 1) break;
    }
    printf("#   %s %s: %llu of %llu header bit flips caught, %llu named the file's header\n",
           layout ? layout : "dtensor", file, (unsigned long long)caught,
           (unsigned long long)flips, (unsigned long long)named);
    CHECK(flips == 8 * n);
    CHECK(caught == flips);
    CHECK(named == flips);
    e = tps_check_dir(ctx, out, &res);
    CHECK_MSG(e == TPS_OK, "restored: %s", tps_ctx_errmsg(ctx));
    if (fd >= 0) close(fd);
    tps_ctx_free(ctx);
}

/* A LLaMA of five small tensors: its rank files' headers hold every kind of
 * __metadata__ value (tp_rank, placements with global shapes and offsets). */
static int tiny_llama(const char *mdir)
{
    static const uint64_t vocab[2] = {10, 4}, sq[2] = {4, 4}, vec[1] = {4};
    tps_st_entry e[] = {
        {.name = "lm_head.weight", .dtype = TPS_F32, .ndim = 2, .shape = vocab, .nbytes = 160},
        {.name = "model.embed_tokens.weight", .dtype = TPS_F32, .ndim = 2, .shape = vocab, .nbytes = 160},
        {.name = "model.layers.0.self_attn.q_proj.weight", .dtype = TPS_F32, .ndim = 2, .shape = sq, .nbytes = 64},
        {.name = "model.layers.0.self_attn.o_proj.weight", .dtype = TPS_F32, .ndim = 2, .shape = sq, .nbytes = 64},
        {.name = "model.norm.weight", .dtype = TPS_F32, .ndim = 1, .shape = vec, .nbytes = 16},
    };
    static const char config[] =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 4, "
        "\"num_attention_heads\": 2, \"num_key_value_heads\": 2, \"vocab_size\": 10, "
        "\"intermediate_size\": 8, \"num_hidden_layers\": 1, \"tie_word_embeddings\": false}\n";
    tps_ctx *ctx = tps_ctx_new();
    char *hdr = NULL, *buf = NULL, path[400];
    size_t hlen = 0, total = 0;
    int ok = mkdir(mdir, 0755) == 0 &&
             tps_st_build_header(ctx, e, sizeof e / sizeof e[0], NULL, NULL, 0, &hdr, &hlen) == TPS_OK;
    for (size_t i = 0; ok && i < sizeof e / sizeof e[0]; i++) total += e[i].nbytes;
    buf = ok ? malloc(hlen + total) : NULL;
    if (buf) {
        memcpy(buf, hdr, hlen);
        for (size_t i = 0; i < total; i++) buf[hlen + i] = (char)(i * 7 + 1);
        snprintf(path, sizeof path, "%s/model.safetensors", mdir);
        ok = tps_write_file_atomic(ctx, path, buf, hlen + total) == TPS_OK;
        snprintf(path, sizeof path, "%s/config.json", mdir);
        ok = ok && tps_write_file_atomic(ctx, path, config, strlen(config)) == TPS_OK;
    } else {
        ok = 0;
    }
    if (!ok) printf("#   tiny model: %s\n", tps_ctx_errmsg(ctx));
    free(hdr);
    free(buf);
    tps_ctx_free(ctx);
    return ok;
}

static void dtensor_header_bits(void)
{
    char m[300];
    snprintf(m, sizeof m, "%s/tiny", dir);
    CHECK(tiny_llama(m));
    sweep(m, NULL, 2, "model-rank-1-part-0.safetensors");
}

static void vllm_header_bits(void)
{
    sweep("testdata/conformance/qwen2-tp2-bias-sharded-input/model", "vllm", 2,
          "model-rank-0-part-0.safetensors");
}

int main(void)
{
    const char *tmp = getenv("TPS_TMP") ? getenv("TPS_TMP") : "/tmp";
    snprintf(dir, sizeof dir, "%s/hdrcover.XXXXXX", tmp);
    if (!mkdtemp(dir)) return 1;
    RUN(dtensor_header_bits);
    RUN(vllm_header_bits);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (!getenv("KEEP_TMP") && system(cmd) != 0) return 1;
    TEST_EXIT();
}
