/* A source file that shrinks or grows after it was opened, before or in the
 * middle of a split, read through mappings or with pread: the split must fail
 * with an error naming the file, never die of SIGBUS or write a wrong shard,
 * and leave no file under a final name. Also the SIGBUS guard on its own:
 * it catches faults in its range and hands every other SIGBUS on. */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
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

/* Truncates the model when the task of tensor `after` has been written. */
typedef struct {
    const char *model, *after;
    int done;
} cut_at;

static void cut_progress(void *user, uint64_t done, uint64_t total, const char *what)
{
    cut_at *c = user;
    (void)done;
    (void)total;
    if (!c->done && what && strcmp(what, c->after) == 0) {
        c->done = truncate(c->model, 4096) == 0 ? 1 : -1;
    }
}

/* Open, change the file by `delta` bytes (before the split, or to 4096
 * bytes once tensor `after` is written), split: must fail. */
static void split_after_change(long delta, const char *after, int no_mmap, const char *word)
{
    char model[300], out[300], cfg[300];
    static int seq;
    snprintf(model, sizeof model, "%s/model.safetensors", dir);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    snprintf(out, sizeof out, "%s/out%d", dir, seq++);
    CHECK(copy("testdata/conformance/llama-tp4-uneven-vocab/model/model.safetensors", model));
    CHECK(copy("testdata/conformance/llama-tp4-uneven-vocab/model/config.json", cfg));
    tps_ctx *ctx = tps_ctx_new();
    tps_ckpt *ck = NULL;
    tps_plan *plan = NULL;
    tps_layout *L = NULL;
    cut_at cut = {.model = model, .after = after};
    tps_ctx_set_threads(ctx, 1); /* tasks run in tensor order */
    CHECK(tps_ckpt_open(ctx, dir, &ck) == TPS_OK);
    CHECK(tps_plan_detect(ctx, ck, &plan) == TPS_OK);
    CHECK(tps_layout_new(ctx, ck, plan, 4, &L) == TPS_OK);
    if (after) {
        tps_ctx_set_progress(ctx, cut_progress, &cut);
    } else {
        struct stat sb;
        stat(model, &sb);
        CHECK(truncate(model, sb.st_size + delta) == 0);
    }
    tps_split_opts o = {.tp = 4, .out_dir = out, .no_mmap = no_mmap};
    tps_split_result r;
    tps_err e = tps_split(ctx, ck, L, &o, &r);
    if (after) CHECK_MSG(cut.done == 1, "the progress callback never saw '%s'", after);
    CHECK_MSG(e == TPS_E_FORMAT, "got %d: %s", (int)e, tps_ctx_errmsg(ctx));
    CHECK_MSG(strstr(tps_ctx_errmsg(ctx), word) && strstr(tps_ctx_errmsg(ctx), "model.safetensors"),
              "message: %s", tps_ctx_errmsg(ctx));
    CHECK_MSG(finals_in(out) == 0, "%d files left under final names", finals_in(out));
    tps_layout_free(L);
    tps_plan_free(plan);
    tps_ckpt_free(ck);
    tps_ctx_free(ctx);
}

static void truncated_source(void) { split_after_change(-5000, NULL, 0, "truncated"); }
static void truncated_source_pread(void) { split_after_change(-5000, NULL, 1, "truncated"); }
static void grown_source(void) { split_after_change(+123, NULL, 0, "changed size"); }
static void grown_source_pread(void) { split_after_change(+123, NULL, 1, "changed size"); }

/* Cut while splitting. The next task after lm_head is embed_tokens, a
 * contiguous copy: its write from the mapping fails with EFAULT. After
 * input_layernorm comes down_proj, gathered row by row from the mapping:
 * that read raises SIGBUS, which the guard must catch. */
static void truncated_midway_write(void) { split_after_change(0, "lm_head.weight", 0, "truncated"); }
static void truncated_midway_gather(void)
{
    split_after_change(0, "model.layers.0.input_layernorm.weight", 0, "truncated");
}
/* A program that handles signals in one thread blocks them in the others;
 * the split must still catch the fault, and give the mask back as it was. */
static void truncated_midway_sigbus_blocked(void)
{
    sigset_t bus, old, after;
    sigemptyset(&bus);
    sigaddset(&bus, SIGBUS);
    CHECK(pthread_sigmask(SIG_BLOCK, &bus, &old) == 0);
    split_after_change(0, "model.layers.0.input_layernorm.weight", 0, "truncated");
    CHECK(pthread_sigmask(SIG_SETMASK, &old, &after) == 0);
    CHECK_MSG(sigismember(&after, SIGBUS) == 1, "the split left SIGBUS unblocked");
}

static void truncated_midway_pread(void)
{
    split_after_change(0, "model.layers.0.input_layernorm.weight", 1, "truncated");
}

/* rchar of /proc/self/io: bytes this process got from read(2) and pread(2),
 * not pages it read through a mapping. -1 when the kernel does not say. */
static long long rchar(void)
{
    FILE *f = fopen("/proc/self/io", "r");
    char line[128];
    long long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "rchar: %lld", &v) == 1) break;
    if (f) fclose(f);
    return v;
}

/* The default split reads tensor bytes through mappings (rchar grows by
 * little more than the config), --no-mmap with pread (by at least every
 * tensor byte); so the mapped path is the one the other tests exercise. */
static void mapped_reads_are_not_preads(void)
{
    char model[300], cfg[300];
    snprintf(model, sizeof model, "%s/model.safetensors", dir);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    CHECK(copy("testdata/conformance/llama-tp4-uneven-vocab/model/model.safetensors", model));
    CHECK(copy("testdata/conformance/llama-tp4-uneven-vocab/model/config.json", cfg));
    if (rchar() < 0) {
        printf("# no /proc/self/io: skipped\n");
        return;
    }
    long long reads[2] = {0, 0};
    uint64_t total = 0;
    for (int no_mmap = 0; no_mmap <= 1; no_mmap++) {
        char out[300];
        snprintf(out, sizeof out, "%s/reads%d", dir, no_mmap);
        tps_ctx *ctx = tps_ctx_new();
        tps_ckpt *ck = NULL;
        tps_plan *plan = NULL;
        tps_layout *L = NULL;
        CHECK(tps_ckpt_open(ctx, dir, &ck) == TPS_OK);
        CHECK(tps_plan_detect(ctx, ck, &plan) == TPS_OK);
        CHECK(tps_layout_new(ctx, ck, plan, 4, &L) == TPS_OK);
        uint64_t data = 0;
        for (size_t i = 0; i < ck->n; i++) data += ck->t[i].nbytes;
        tps_split_opts o = {.tp = 4, .out_dir = out, .no_mmap = no_mmap};
        tps_split_result r;
        long long before = rchar();
        CHECK_MSG(tps_split(ctx, ck, L, &o, &r) == TPS_OK, "%s", tps_ctx_errmsg(ctx));
        long long read = rchar() - before;
        reads[no_mmap] = read;
        total = data;
        tps_layout_free(L);
        tps_plan_free(plan);
        tps_ckpt_free(ck);
        tps_ctx_free(ctx);
    }
    /* Compared with each other, so reads by anything else in the process
     * (valgrind's, say) do not count. */
    CHECK_MSG(reads[1] >= (long long)total, "--no-mmap read %lld bytes of %llu", reads[1],
              (unsigned long long)total);
    CHECK_MSG(reads[0] + (long long)total / 2 < reads[1],
              "the mapped split read %lld bytes, --no-mmap %lld, of %llu", reads[0], reads[1],
              (unsigned long long)total);
}

/* ------------------------------------------------------------------ the guard alone */

static char map_path[300];

/* A three-page file mapped, then cut to one page: pages 1 and 2 raise SIGBUS. */
static char *cut_mapping(size_t *len)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    snprintf(map_path, sizeof map_path, "%s/mapped", dir);
    int fd = open(map_path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ftruncate(fd, (off_t)(3 * pg)) != 0) return NULL;
    char *m = mmap(NULL, 3 * pg, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED || truncate(map_path, (off_t)pg) != 0) return NULL;
    *len = 3 * pg;
    return m;
}

static volatile int other_seen;
static void other_handler(int sig, siginfo_t *si, void *uc)
{
    (void)sig;
    (void)si;
    (void)uc;
    other_seen++;
}

static void guard_catches_its_range(void)
{
    size_t len, pg = (size_t)sysconf(_SC_PAGESIZE);
    char *m = cut_mapping(&len);
    CHECK(m != NULL);
    if (!m) return;
    CHECK(tps_guard_hold());
    volatile int caught = 0, sum = 0;
    tps_guard g = {.lo = m, .hi = m + len};
    if (sigsetjmp(g.jb, 1)) {
        tps_guard_leave();
        caught = 1;
    } else {
        tps_guard_enter(&g);
        sum += m[0];      /* inside the file: fine */
        sum += m[2 * pg]; /* past its end: SIGBUS */
        tps_guard_leave();
    }
    CHECK_MSG(caught == 1, "a read past the end was not caught");
    /* The mask was restored: a second fault is caught too. */
    caught = 0;
    if (sigsetjmp(g.jb, 1)) {
        tps_guard_leave();
        caught = 1;
    } else {
        tps_guard_enter(&g);
        sum += m[pg];
        tps_guard_leave();
    }
    CHECK_MSG(caught == 1, "a second fault was not caught");
    tps_guard_release();
    (void)sum;
    munmap(m, len);
}

/* Outside a guard, SIGBUS kills as by default; with a handler installed
 * before, that handler gets it; and release puts that handler back. */
static void guard_hands_on_the_rest(void)
{
    size_t len, pg = (size_t)sysconf(_SC_PAGESIZE);
    char *m = cut_mapping(&len);
    CHECK(m != NULL);
    if (!m) return;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGBUS, SIG_DFL); /* what was there before: the default (a sanitizer has its own) */
        tps_guard_hold();
        volatile char c = m[2 * pg]; /* no guard entered */
        (void)c;
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGBUS, "child status %#x, wanted death by SIGBUS", st);

    struct sigaction sa, old, now;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = other_handler;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    CHECK(sigaction(SIGBUS, &sa, &old) == 0);
    CHECK(tps_guard_hold());
    other_seen = 0;
    raise(SIGBUS); /* sent, not a fault: not the guard's */
    CHECK_MSG(other_seen == 1, "the earlier handler saw %d signals", other_seen);
    tps_guard_release();
    CHECK(sigaction(SIGBUS, &old, &now) == 0);
    CHECK_MSG(now.sa_sigaction == other_handler, "release did not restore the earlier handler");
    munmap(m, len);
}

int main(void)
{
    const char *tmp = getenv("TPS_TMP") ? getenv("TPS_TMP") : "/tmp";
    snprintf(dir, sizeof dir, "%s/srcchange.XXXXXX", tmp);
    if (!mkdtemp(dir)) return 1;
    RUN(truncated_source);
    RUN(truncated_source_pread);
    RUN(grown_source);
    RUN(grown_source_pread);
    RUN(truncated_midway_write);
    RUN(truncated_midway_gather);
    RUN(truncated_midway_sigbus_blocked);
    RUN(truncated_midway_pread);
    RUN(mapped_reads_are_not_preads);
    RUN(guard_catches_its_range);
    RUN(guard_hands_on_the_rest);
    TEST_EXIT();
}
