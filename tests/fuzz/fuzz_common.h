/* fuzz_common.h - what the fuzz targets share: a scratch directory per
 * process, file writing, and a tiny LLaMA checkpoint written through the
 * library's own header builder. Static functions only: each target is one
 * translation unit (plus replay.c or libFuzzer's main). */
#ifndef TPS_FUZZ_COMMON_H
#define TPS_FUZZ_COMMON_H

#include "internal.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char fz_root[256];

static void fz_rm_rf(const char *path)
{
    struct stat sb;
    if (lstat(path, &sb) != 0) return;
    if (S_ISDIR(sb.st_mode)) {
        DIR *d = opendir(path);
        if (d) {
            struct dirent *e;
            while ((e = readdir(d))) {
                if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
                char sub[1024];
                snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
                fz_rm_rf(sub);
            }
            closedir(d);
        }
        rmdir(path);
    } else {
        unlink(path);
    }
}

static void fz_cleanup(void)
{
    if (fz_root[0]) fz_rm_rf(fz_root);
    fz_root[0] = 0;
}

/* The per-process scratch dir, made on first use and removed at exit. */
static inline const char *fz_dir(void)
{
    if (!fz_root[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(fz_root, sizeof fz_root, "%s/tpsfuzz.XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(fz_root)) {
            perror("mkdtemp");
            abort();
        }
        atexit(fz_cleanup);
    }
    return fz_root;
}

/* dir/name, static buffer (one at a time). */
static inline const char *fz_path(const char *sub, const char *name)
{
    static char p[1024];
    snprintf(p, sizeof p, "%s/%s%s%s", fz_dir(), sub ? sub : "", sub ? "/" : "", name);
    return p;
}

static inline void fz_mkdir(const char *sub)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", fz_dir(), sub);
    if (mkdir(p, 0755) != 0 && !tps_is_dir(p)) {
        perror(p);
        abort();
    }
}

static inline void fz_write(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f || (len && fwrite(data, 1, len, f) != len) || fclose(f) != 0) {
        perror(path);
        abort();
    }
}

/* A safetensors file of `n` tensors (BF16 unless dtypes given) with a
 * deterministic byte pattern, through tps_st_build_header. */
typedef struct {
    const char *name;
    int ndim;
    uint64_t shape[4];
} fz_tensor;

static inline void fz_write_st(const char *path, const fz_tensor *t, size_t n)
{
    tps_ctx *ctx = tps_ctx_new();
    tps_st_entry e[64];
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t nel = 1;
        for (int d = 0; d < t[i].ndim; d++) nel *= t[i].shape[d];
        e[i] = (tps_st_entry){.name = t[i].name, .dtype = TPS_BF16, .ndim = t[i].ndim,
                              .shape = t[i].shape, .nbytes = nel * 2};
        total += nel * 2;
    }
    const char *mk[] = {"format"}, *mv[] = {"pt"};
    char *hdr = NULL;
    size_t hlen = 0;
    if (tps_st_build_header(ctx, e, n, mk, mv, 1, &hdr, &hlen) != TPS_OK) {
        fprintf(stderr, "fuzz setup: %s\n", tps_ctx_errmsg(ctx));
        abort();
    }
    unsigned char *buf = malloc(hlen + total + 1);
    memcpy(buf, hdr, hlen);
    for (uint64_t i = 0; i < total; i++) buf[hlen + i] = (unsigned char)((i * 37 + 11) & 0x3f);
    fz_write(path, buf, hlen + total);
    free(buf);
    free(hdr);
    tps_ctx_free(ctx);
}

static const char fz_llama_config[] =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"hidden_size\":8,"
    "\"num_attention_heads\":2,\"num_key_value_heads\":2,\"head_dim\":4,"
    "\"intermediate_size\":12,\"vocab_size\":10,\"num_hidden_layers\":1,"
    "\"tie_word_embeddings\":false}\n";

/* The tiny LLaMA's tensors (vocab 10, hidden 8, inter 12, one layer). */
static const fz_tensor fz_llama[] = {
    {"model.embed_tokens.weight", 2, {10, 8}},
    {"model.layers.0.input_layernorm.weight", 1, {8}},
    {"model.layers.0.self_attn.q_proj.weight", 2, {8, 8}},
    {"model.layers.0.self_attn.k_proj.weight", 2, {8, 8}},
    {"model.layers.0.self_attn.v_proj.weight", 2, {8, 8}},
    {"model.layers.0.self_attn.o_proj.weight", 2, {8, 8}},
    {"model.layers.0.post_attention_layernorm.weight", 1, {8}},
    {"model.layers.0.mlp.gate_proj.weight", 2, {12, 8}},
    {"model.layers.0.mlp.up_proj.weight", 2, {12, 8}},
    {"model.layers.0.mlp.down_proj.weight", 2, {8, 12}},
    {"model.norm.weight", 1, {8}},
    {"lm_head.weight", 2, {10, 8}},
};
#define FZ_NLLAMA (sizeof fz_llama / sizeof fz_llama[0])

/* <root>/<sub>/: config.json (unless config is NULL) + model.safetensors. */
static inline void fz_make_llama(const char *sub, const char *config)
{
    fz_mkdir(sub);
    if (config) fz_write(fz_path(sub, "config.json"), config, strlen(config));
    fz_write_st(fz_path(sub, "model.safetensors"), fz_llama, FZ_NLLAMA);
}

/* Exercise what an opened checkpoint offers, reading every tensor's bytes. */
static inline void fz_walk_ckpt(tps_ctx *ctx, const tps_ckpt *ck)
{
    (void)tps_ckpt_kind(ck);
    (void)tps_ckpt_stem(ck);
    (void)tps_ckpt_total_bytes(ck);
    for (size_t i = 0; i < tps_ckpt_file_count(ck); i++) (void)tps_ckpt_file(ck, i);
    unsigned char buf[4096];
    for (size_t i = 0; i < tps_ckpt_count(ck); i++) {
        tps_tensor_view v;
        tps_ckpt_tensor(ck, i, &v);
        if (tps_ckpt_find(ck, v.name) != (int)i) abort(); /* names are unique and findable */
        uint64_t left = v.nbytes, off = 0;
        while (left) {
            size_t k = left < sizeof buf ? (size_t)left : sizeof buf;
            if (tps_ckpt_read(ctx, ck, i, off, buf, k) != TPS_OK) break;
            off += k;
            left -= k;
        }
    }
    /* The config accessor inspect uses, on the fields it prints. */
    static const char *const fields[] = {"architectures", "model_type", "num_attention_heads",
                                         "num_key_value_heads", "vocab_size", "tie_word_embeddings",
                                         "text_config", NULL};
    char val[256];
    for (const char *const *f = fields; *f; f++) (void)tps_ckpt_config_value(ck, *f, val, sizeof val);
}

#endif
