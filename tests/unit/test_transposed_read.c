/* Reads of transposed pieces (gpt-oss's BF16 experts in the vLLM layout:
 * each expert's rank slice stored with its last two dims swapped) give the
 * checkpoint's bytes back, whatever the request: single elements, parts of
 * rows, rows one at a time as merge reads a tensor cut along its last dim
 * (through each thread's cache of bands), whole pieces. The reference is the
 * source checkpoint itself, read as plain tensors. And a rank file rewritten
 * between two opens in one process is read anew: no band of the first open
 * is served to the second. Needs ./tpshard (built before the tests run). */
#include "internal.h"
#include "test.h"

#include <unistd.h>

static const char *MODEL = "testdata/conformance/vllm-gptoss-bf16-tp2/model";
static char dir[256];

static int split_once(void)
{
    const char *tmp = getenv("TPS_TMP") ? getenv("TPS_TMP") : "/tmp";
    snprintf(dir, sizeof dir, "%s/transposed-read.%d", tmp, (int)getpid());
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && ./tpshard split %s --tp 2 --layout vllm -o '%s' -q",
             dir, MODEL, dir);
    return system(cmd);
}

/* Every transposed piece against the source's bytes of its region: random
 * requests of every size, rows in turn, the whole piece. */
static void random_reads_match_the_source(void)
{
    tps_ctx *ctx = tps_ctx_new();
    tps_ckpt *ck = NULL, *src = NULL;
    CHECK(tps_ckpt_open_path(ctx, dir, &ck) == TPS_OK);
    CHECK(tps_ckpt_open_path(ctx, MODEL, &src) == TPS_OK);
    if (!ck || !src) return;
    int ntr = 0, bad = 0;
    for (size_t i = 0; i < ck->n; i++) {
        const tps_ctensor *t = &ck->t[i];
        for (int p = 0; p < t->npieces; p++) {
            const tps_piece *pc = &t->pieces[p];
            if (!pc->tr) continue;
            ntr++;
            int j = tps_ckpt_find(src, t->name);
            size_t es = tps_dtype_bits(t->dtype) / 8;
            uint64_t inner = es, outer = 1;
            for (int d = t->dim + 1; d < t->ndim; d++) inner *= t->shape[d];
            for (int d = 0; d < t->dim; d++) outer *= t->shape[d];
            uint64_t row = t->shape[t->dim] * inner, l = (pc->hi - pc->lo) * inner;
            char *ref = malloc(pc->nbytes), *got = malloc(pc->nbytes);
            for (uint64_t o = 0; j >= 0 && o < outer; o++)
                CHECK(tps_ckpt_read(ctx, src, (size_t)j, o * row + pc->lo * inner, ref + o * l,
                                    (size_t)l) == TPS_OK);
            uint64_t ne = pc->nbytes / es, B = t->shape[t->ndim - 1];
            if (t->dim == t->ndim - 1) B = pc->hi - pc->lo;
            for (int it = 0; it < 600; it++) {
                uint64_t e0 = 0, n = ne;
                switch (it % 5) {
                case 0: e0 = t_rand() % ne; n = 1 + t_rand() % (ne - e0 < 16 ? ne - e0 : 16); break;
                case 1: e0 = t_rand() % ne; n = 1 + t_rand() % (ne - e0 < 3000 ? ne - e0 : 3000); break;
                case 2: e0 = t_rand() % ne; n = 1 + t_rand() % (ne - e0); break;
                case 3: e0 = (uint64_t)(it / 5) % (ne / B) * B; n = B; break; /* a row */
                default: break; /* the whole piece */
                }
                memset(got, 0x5a, (size_t)(n * es));
                if (tps_ckpt_read_piece_at(ctx, ck, t, pc, e0 * es, got, (size_t)(n * es)) ||
                    memcmp(got, ref + e0 * es, (size_t)(n * es)))
                    bad++;
            }
            free(ref);
            free(got);
        }
    }
    CHECK_MSG(ntr == 8 && bad == 0, "%d transposed pieces, %d reads wrong", ntr, bad);
    tps_ckpt_free(ck);
    tps_ckpt_free(src);
    tps_ctx_free(ctx);
}

/* gate_up_proj read a row at a time, as merge does. */
static char *rows_of(tps_ctx *ctx, size_t *n)
{
    tps_ckpt *ck = NULL;
    if (tps_ckpt_open_path(ctx, dir, &ck)) return NULL;
    int i = tps_ckpt_find(ck, "model.layers.0.mlp.experts.gate_up_proj");
    char *out = i >= 0 ? malloc(ck->t[i].nbytes) : NULL;
    if (out) {
        const tps_ctensor *t = &ck->t[i];
        uint64_t row = t->shape[t->ndim - 1] * (tps_dtype_bits(t->dtype) / 8);
        *n = (size_t)t->nbytes;
        for (uint64_t o = 0; o < t->nbytes; o += row)
            if (tps_ckpt_read(ctx, ck, (size_t)i, o, out + o, (size_t)row)) {
                free(out);
                out = NULL;
                break;
            }
    }
    tps_ckpt_free(ck);
    return out;
}

static void a_rewritten_file_is_read_anew(void)
{
    tps_ctx *ctx = tps_ctx_new();
    size_t na = 0, nb = 0;
    char *a = rows_of(ctx, &na);
    char cmd[1024];
    /* flip a byte in the middle of rank 1's w13_weight (python3: the tests have it) */
    snprintf(cmd, sizeof cmd,
             "python3 -c \"import json,sys; f=sys.argv[1]; r=bytearray(open(f,'rb').read()); "
             "n=int.from_bytes(r[:8],'little'); b,e=json.loads(r[8:8+n])"
             "['model.layers.0.mlp.experts.routed_experts.w13_weight']['data_offsets']; "
             "r[8+n+(b+e)//2]^=16; open(f,'wb').write(r)\" '%s/model-rank-1-part-0.safetensors'",
             dir);
    CHECK(system(cmd) == 0);
    char *b = rows_of(ctx, &nb);
    CHECK(a && b && na == nb);
    if (a && b && na == nb) {
        size_t diff = 0;
        for (size_t k = 0; k < na; k++) diff += a[k] != b[k];
        CHECK_MSG(diff == 1, "%zu bytes differ after one was flipped", diff);
    }
    free(a);
    free(b);
    tps_ctx_free(ctx);
}

int main(void)
{
    if (split_once() != 0) {
        printf("not ok - split %s (is ./tpshard built?)\n", MODEL);
        return 1;
    }
    RUN(random_reads_match_the_source);
    RUN(a_rewritten_file_is_read_anew);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (!getenv("KEEP_TMP") && system(cmd) != 0) return 1;
    TEST_EXIT();
}
