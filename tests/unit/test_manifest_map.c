/* A big manifest is mapped and its pages let go behind each pass over it
 * (tps_text_open, tps_text_behind); a small one is read whole. Both paths
 * must read the same manifest the same way: the same result, and for a
 * broken one the same error. Here every manifest takes the mapped path
 * (tps_text_map_min = 1) and is compared with the read path. */
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "test.h"

static char dir[256];

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) b[n] = 0;
    *len = (size_t)n;
    return b;
}

static int spit(const char *path, const char *b, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    int ok = fwrite(b, 1, len, f) == len;
    return fclose(f) == 0 && ok;
}

/* check of out with the manifest read (map_min huge) or mapped (1):
 * its status, message and result. */
typedef struct {
    tps_err rc;
    char msg[512];
    tps_check_result r;
} outcome;

static outcome check_with(const char *out, size_t map_min)
{
    outcome o;
    memset(&o, 0, sizeof o);
    size_t keep = tps_text_map_min;
    tps_text_map_min = map_min;
    tps_ctx *ctx = tps_ctx_new();
    o.rc = tps_check_dir(ctx, out, &o.r);
    snprintf(o.msg, sizeof o.msg, "%s", o.rc ? tps_ctx_errmsg(ctx) : "");
    tps_ctx_free(ctx);
    tps_text_map_min = keep;
    return o;
}

static void same_both_ways(const char *out, const char *what, int want_ok)
{
    outcome a = check_with(out, (size_t)1 << 40), b = check_with(out, 1);
    CHECK_MSG(a.rc == b.rc && !strcmp(a.msg, b.msg), "%s: read %d '%s', mapped %d '%s'", what, (int)a.rc,
              a.msg, (int)b.rc, b.msg);
    CHECK_MSG(!memcmp(&a.r, &b.r, sizeof a.r), "%s: results differ", what);
    CHECK_MSG(want_ok ? a.rc == TPS_OK : a.rc != TPS_OK, "%s: rc %d '%s'", what, (int)a.rc, a.msg);
}

static void mapped_reads_the_same(void)
{
    char out[300], man[320];
    snprintf(out, sizeof out, "%s/out", dir);
    snprintf(man, sizeof man, "%s/tpshard.json", out);
    tps_ctx *ctx = tps_ctx_new();
    tps_ckpt *ck = NULL;
    tps_plan *plan = NULL;
    tps_layout *L = NULL;
    CHECK(tps_ckpt_open(ctx, "testdata/conformance/llama-tp4-uneven-vocab/model", &ck) == TPS_OK);
    CHECK(tps_plan_detect(ctx, ck, &plan) == TPS_OK);
    CHECK(tps_layout_new(ctx, ck, plan, 4, &L) == TPS_OK);
    tps_split_opts so = {.tp = 4, .out_dir = out, .map_source = 1};
    tps_split_result sr;
    CHECK_MSG(tps_split(ctx, ck, L, &so, &sr) == TPS_OK, "split: %s", tps_ctx_errmsg(ctx));
    tps_layout_free(L);
    tps_plan_free(plan);
    tps_ckpt_free(ck);
    tps_ctx_free(ctx);

    same_both_ways(out, "the split's manifest", 1);
    size_t len;
    char *orig = slurp(man, &len);
    CHECK(orig != NULL);
    if (!orig) return;
    /* Broken in the arrays (each read one element at a time), around them,
     * and cut short: the same error either way. */
    static const char *const edits[][2] = {
        {"\"crc32\": ", "\"crc32\": \"x\", \"y\": "}, /* a CRC that is not a number */
        {"}, {", "} {"},                             /* a missing comma between elements */
        {"\"rank_tensors\"", "\"rank_tensorz\""},
        {"\"tensors\": [", "\"tensors\": [[], "},
        {"\"format\": \"tpshard\"", "\"format\": \"tpshard\\u0000\""},
    };
    int applied = 0;
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        char *at = strstr(orig, edits[i][0]);
        if (!at) continue; /* this manifest has no such text */
        applied++;
        size_t a = (size_t)(at - orig), ol = strlen(edits[i][0]), nl = strlen(edits[i][1]);
        char *b = malloc(len + nl + 1);
        memcpy(b, orig, a);
        memcpy(b + a, edits[i][1], nl);
        memcpy(b + a + nl, orig + a + ol, len - a - ol);
        CHECK(spit(man, b, len - ol + nl));
        free(b);
        char what[128];
        snprintf(what, sizeof what, "manifest with '%s' made '%s'", edits[i][0], edits[i][1]);
        same_both_ways(out, what, 0);
    }
    CHECK_MSG(applied >= 4, "only %d of the edits found their text", applied);
    CHECK(spit(man, orig, len / 2));
    same_both_ways(out, "manifest cut in half", 0);
    CHECK(spit(man, orig, len));
    same_both_ways(out, "manifest put back", 1);
    free(orig);
}

static void cut_in_half(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) == 0 && truncate(path, sb.st_size / 2) != 0) perror(path);
}

/* Cut short by another process after it was mapped: a clear error naming
 * the manifest, not a SIGBUS; the same directory checks again once the
 * manifest is whole. */
static void cut_while_mapped(void)
{
    char out[300], man[320];
    snprintf(out, sizeof out, "%s/out", dir);
    snprintf(man, sizeof man, "%s/tpshard.json", out);
    size_t len;
    char *orig = slurp(man, &len);
    CHECK(orig != NULL);
    if (!orig) return;
    tps_text_mapped_hook = cut_in_half;
    outcome o = check_with(out, 1);
    tps_text_mapped_hook = NULL;
    CHECK_MSG(o.rc == TPS_E_IO && strstr(o.msg, "tpshard.json: changed while being read"), "rc %d '%s'",
              (int)o.rc, o.msg);
    CHECK(spit(man, orig, len));
    o = check_with(out, 1);
    CHECK_MSG(o.rc == TPS_OK, "after: rc %d '%s'", (int)o.rc, o.msg);
    free(orig);
}

int main(void)
{
    const char *tmp = getenv("TPS_TMP") ? getenv("TPS_TMP") : "/tmp";
    snprintf(dir, sizeof dir, "%s/manmap.XXXXXX", tmp);
    if (!mkdtemp(dir)) return 1;
    RUN(mapped_reads_the_same);
    RUN(cut_while_mapped);
    TEST_EXIT();
}
