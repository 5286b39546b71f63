/* Reads of a split checkpoint give the source's bytes back, whatever the
 * request: tps_ckpt_read of a tensor cut along a dim gathers whole rows a
 * piece at a time in batches (read_rows), the head and tail of a request
 * that starts or ends inside a row the old way. Every tensor of several
 * layouts (DTensor uneven at tp 3, vLLM's fused GPTQ runs, refined FP8
 * scale grids, transposed gpt-oss experts) is read at random offsets and
 * lengths, by rows, whole, and with batches of a few bytes so that a
 * request needs many, against the source checkpoint read as one plain file.
 * A missing rank still fails with the error naming it. Needs ./tpshard. */
#include "internal.h"
#include "test.h"

#include <unistd.h>

static const struct {
    const char *model, *opts;
} CASES[] = {
    {"testdata/conformance/llama-tp3/model", "--tp 3"},
    {"testdata/conformance/vllm-llama-gptq-tp2/model", "--tp 2 --layout vllm"},
    {"testdata/conformance/vllm-qwen3moe-fp8-block-refined-tp4/model", "--tp 4 --layout vllm"},
    {"testdata/conformance/vllm-gptoss-bf16-tp2/model", "--tp 2 --layout vllm"},
};

static char dir[256];

static int split(const char *model, const char *opts)
{
    const char *tmp = getenv("TPS_TMP") ? getenv("TPS_TMP") : "/tmp";
    snprintf(dir, sizeof dir, "%s/sharded-read.%d", tmp, (int)getpid());
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && ./tpshard split %s %s -o '%s' -q", dir, model, opts,
             dir);
    return system(cmd);
}

/* Every tensor with more than one piece, against the source: n_reads
 * requests each. Returns the number of wrong reads; *cut counts the tensors
 * cut along a dim with whole-row requests (the batched path). */
static int reads_match(const char *model, int *cut, int *tensors)
{
    tps_ctx *ctx = tps_ctx_new();
    tps_ckpt *ck = NULL, *src = NULL;
    int bad = 0;
    CHECK(tps_ckpt_open_path(ctx, dir, &ck) == TPS_OK);
    CHECK(tps_ckpt_open_path(ctx, model, &src) == TPS_OK);
    for (size_t i = 0; ck && src && i < ck->n; i++) {
        const tps_ctensor *t = &ck->t[i];
        if (t->npieces < 2 || t->dim < 0 || t->nbytes == 0) continue;
        int j = tps_ckpt_find(src, t->name);
        CHECK_MSG(j >= 0, "%s: no source tensor", t->name);
        if (j < 0) continue;
        uint64_t inner_bits = tps_dtype_bits(t->dtype);
        for (int d = t->dim + 1; d < t->ndim; d++) inner_bits *= t->shape[d];
        uint64_t row = t->shape[t->dim] * inner_bits / 8, nb = t->nbytes;
        char *ref = malloc(nb), *got = malloc(nb);
        CHECK(tps_ckpt_read(ctx, src, (size_t)j, 0, ref, (size_t)nb) == TPS_OK);
        (*tensors)++;
        if (row && nb / row >= 2) (*cut)++;
        for (int it = 0; it < 240; it++) {
            uint64_t off = 0, len = nb;
            switch (it % 6) {
            case 0: off = t_rand() % nb; len = 1 + t_rand() % (nb - off < 64 ? nb - off : 64); break;
            case 1: off = t_rand() % nb; len = 1 + t_rand() % (nb - off); break;
            case 2: /* whole rows */
                if (row && nb / row) {
                    uint64_t r0 = t_rand() % (nb / row), r1 = r0 + 1 + t_rand() % (nb / row - r0);
                    off = r0 * row;
                    len = (r1 - r0) * row;
                }
                break;
            case 3: /* from inside a row to inside another */
                if (row && nb / row >= 3) {
                    off = t_rand() % row + row * (t_rand() % (nb / row - 2));
                    len = nb - off - t_rand() % row;
                }
                break;
            case 4: off = 0; len = nb; break;
            default: /* batches of a few bytes: a request needs many */
                tps_read_rows_batch = 1 + t_rand() % 48;
                off = t_rand() % nb;
                len = 1 + t_rand() % (nb - off);
                break;
            }
            /* whole elements (a transposed piece reads no part of one) */
            uint64_t es = tps_dtype_bits(t->dtype) >= 8 ? tps_dtype_bits(t->dtype) / 8 : 1;
            off -= off % es;
            len += es - 1;
            len -= len % es;
            if (off + len > nb) len = (nb - off) / es * es;
            if (!len) len = es;
            memset(got, 0x5a, (size_t)len);
            tps_err rc = tps_ckpt_read(ctx, ck, i, off, got, (size_t)len);
            tps_read_rows_batch = 1u << 20;
            if (rc || memcmp(got, ref + off, (size_t)len)) {
                if (!bad)
                    printf("# %s: %s: read [%llu, +%llu) %s\n", dir, t->name,
                           (unsigned long long)off, (unsigned long long)len,
                           rc ? "failed" : "differs from the source");
                bad++;
            }
        }
        free(ref);
        free(got);
    }
    tps_ckpt_free(ck);
    tps_ckpt_free(src);
    tps_ctx_free(ctx);
    return bad;
}

static void every_layout_reads_back_the_source(void)
{
    for (size_t c = 0; c < sizeof CASES / sizeof CASES[0]; c++) {
        if (split(CASES[c].model, CASES[c].opts) != 0) {
            CHECK_MSG(0, "split %s %s", CASES[c].model, CASES[c].opts);
            continue;
        }
        int cut = 0, tensors = 0, bad = reads_match(CASES[c].model, &cut, &tensors);
        CHECK_MSG(bad == 0 && cut > 0, "%s %s: %d tensors (%d of several rows), %d reads wrong",
                  CASES[c].model, CASES[c].opts, tensors, cut, bad);
    }
}

/* A rank not written (split --ranks): reading across its columns fails,
 * naming the bytes that rank holds, as before the batched path. */
static void a_missing_rank_is_named(void)
{
    if (split("testdata/conformance/llama-tp3/model", "--tp 3 --ranks 0,2") != 0) {
        CHECK_MSG(0, "split llama-tp3");
        return;
    }
    tps_ctx *ctx = tps_ctx_new();
    tps_ckpt *ck = NULL;
    CHECK(tps_ckpt_open_path(ctx, dir, &ck) == TPS_OK);
    int i = ck ? tps_ckpt_find(ck, "model.layers.0.mlp.down_proj.weight") : -1;
    CHECK(i >= 0);
    if (i >= 0) {
        const tps_ctensor *t = &ck->t[i];
        char *buf = malloc(t->nbytes);
        tps_err rc = tps_ckpt_read(ctx, ck, (size_t)i, 0, buf, (size_t)t->nbytes);
        const char *msg = tps_ctx_errmsg(ctx);
        CHECK_MSG(rc == TPS_E_MISMATCH && msg && strstr(msg, "is not present"),
                  "rc %d: %s", (int)rc, msg ? msg : "(no message)");
        free(buf);
    }
    tps_ckpt_free(ck);
    tps_ctx_free(ctx);
}

int main(void)
{
    t_rng_ = 0xD1B54A32D192ED03ull;
    RUN(every_layout_reads_back_the_source);
    RUN(a_missing_rank_is_named);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (!getenv("KEEP_TMP") && system(cmd) != 0) return 1;
    TEST_EXIT();
}
