/* A source file that shrinks or grows after it was opened: the split must
 * fail with an error naming the file, never SIGBUS or a wrong shard, and
 * leave no file under a final name. */
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "test.h"

static char dir[256];

static int copy(const char *src, const char *dst)
{
    char *buf;
    size_t len;
    tps_ctx *c = tps_ctx_new();
    int ok = tps_read_file(c, src, 1 << 24, &buf, &len) == TPS_OK &&
             tps_write_file_atomic(c, dst, buf, len) == TPS_OK;
    if (ok) free(buf);
    tps_ctx_free(c);
    return ok;
}

static int finals_in(const char *out)
{
    DIR *d = opendir(out);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)))
        if (de->d_name[0] != '.') n++;
    if (d) closedir(d);
    return n;
}

/* Open, change the file by `delta` bytes, split: must fail. */
static void split_after_change(long delta, const char *word)
{
    char model[300], out[300], cfg[300];
    snprintf(model, sizeof model, "%s/model.safetensors", dir);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    snprintf(out, sizeof out, "%s/out%ld", dir, delta);
    CHECK(copy("testdata/conformance/llama-tp4-uneven-vocab/model/model.safetensors", model));
    CHECK(copy("testdata/conformance/llama-tp4-uneven-vocab/model/config.json", cfg));
    tps_ctx *ctx = tps_ctx_new();
    tps_ckpt *ck = NULL;
    tps_plan *plan = NULL;
    tps_layout *L = NULL;
    CHECK(tps_ckpt_open(ctx, dir, &ck) == TPS_OK);
    CHECK(tps_plan_detect(ctx, ck, &plan) == TPS_OK);
    CHECK(tps_layout_new(ctx, ck, plan, 4, &L) == TPS_OK);
    struct stat sb;
    stat(model, &sb);
    CHECK(truncate(model, sb.st_size + delta) == 0);
    tps_split_opts o = {.tp = 4, .out_dir = out};
    tps_split_result r;
    tps_err e = tps_split(ctx, ck, L, &o, &r);
    CHECK_MSG(e == TPS_E_FORMAT, "got %d: %s", (int)e, tps_ctx_errmsg(ctx));
    CHECK_MSG(strstr(tps_ctx_errmsg(ctx), word) && strstr(tps_ctx_errmsg(ctx), "model.safetensors"),
              "message: %s", tps_ctx_errmsg(ctx));
    CHECK_MSG(finals_in(out) == 0, "%d files left under final names", finals_in(out));
    tps_layout_free(L);
    tps_plan_free(plan);
    tps_ckpt_free(ck);
    tps_ctx_free(ctx);
}

static void truncated_source(void) { split_after_change(-5000, "truncated"); }
static void grown_source(void) { split_after_change(+123, "changed size"); }

int main(void)
{
    const char *tmp = getenv("TPS_TMP") ? getenv("TPS_TMP") : "/tmp";
    snprintf(dir, sizeof dir, "%s/srcchange.XXXXXX", tmp);
    if (!mkdtemp(dir)) return 1;
    RUN(truncated_source);
    RUN(grown_source);
    TEST_EXIT();
}
