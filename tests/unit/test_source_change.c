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
#include <sys/syscall.h>
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

/* What happens to the model when the task of tensor `after` is done. */
typedef enum { CUT = 0, REWRITE, CUT_AND_REGROW } change;

typedef struct {
    const char *model, *after;
    change how;
    int done;
} change_at;

static void change_progress(void *user, uint64_t done, uint64_t total, const char *what)
{
    change_at *c = user;
    (void)done;
    (void)total;
    if (c->done || !what || (c->after[0] && strcmp(what, c->after) != 0)) return;
    struct stat sb;
    int ok = stat(c->model, &sb) == 0;
    /* Timestamps move in clock ticks of a few ms: let one pass since the
     * model was opened, or a change could leave them as they were. */
    usleep(30000);
    if (c->how == REWRITE) {
        /* Same size, one byte in the data flipped. */
        int fd = open(c->model, O_RDWR);
        unsigned char b = 0;
        ok = ok && fd >= 0 && pread(fd, &b, 1, 5000) == 1;
        b ^= 0xff;
        ok = ok && pwrite(fd, &b, 1, 5000) == 1;
        if (fd >= 0) close(fd);
    } else {
        ok = ok && truncate(c->model, 4096) == 0;
        if (c->how == CUT_AND_REGROW) ok = ok && truncate(c->model, sb.st_size) == 0;
    }
    c->done = ok ? 1 : -1;
}

typedef struct {
    long delta;        /* before the split: change the size by this */
    const char *after; /* else: change it once this tensor is written ("" = the first task) */
    change how;
    int pread;         /* --no-mmap */
    int threads;       /* 0: 1 */
    const char *word;  /* expected in the message */
    const char *cased; /* a conformance case's model (default the uneven-vocab LLaMA) */
    const char *layout; /* a serving layout (default dtensor) */
    int tp;             /* 0: 4 */
} scenario;

/* Open, change the file, split: must fail, naming the file and the change,
 * and leave nothing under a final name. */
static void split_after_change(scenario sc)
{
    char model[300], out[300], cfg[300];
    static int seq;
    snprintf(model, sizeof model, "%s/model.safetensors", dir);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    snprintf(out, sizeof out, "%s/out%d", dir, seq++);
    const char *cs = sc.cased ? sc.cased : "llama-tp4-uneven-vocab";
    char from[300];
    snprintf(from, sizeof from, "testdata/conformance/%s/model/model.safetensors", cs);
    CHECK(copy(from, model));
    snprintf(from, sizeof from, "testdata/conformance/%s/model/config.json", cs);
    CHECK(copy(from, cfg));
    int tp = sc.tp ? sc.tp : 4;
    tps_layout_spec *spec = NULL;
    tps_ctx *ctx = tps_ctx_new();
    tps_ckpt *ck = NULL;
    tps_plan *plan = NULL;
    tps_layout *L = NULL;
    change_at ch = {.model = model, .after = sc.after, .how = sc.how};
    tps_ctx_set_threads(ctx, sc.threads ? sc.threads : 1); /* one: tasks run in tensor order */
    if (sc.layout) CHECK(tps_layout_spec_builtin(ctx, sc.layout, &spec) == TPS_OK);
    CHECK(tps_ckpt_open(ctx, dir, &ck) == TPS_OK);
    CHECK(tps_plan_detect(ctx, ck, &plan) == TPS_OK);
    CHECK_MSG(tps_layout_new_with(ctx, ck, plan, spec, tp, &L) == TPS_OK, "%s", tps_ctx_errmsg(ctx));
    if (sc.after) {
        tps_ctx_set_progress(ctx, change_progress, &ch);
    } else {
        struct stat sb;
        stat(model, &sb);
        CHECK(truncate(model, sb.st_size + sc.delta) == 0);
    }
    tps_split_opts o = {.tp = tp, .out_dir = out, .map_source = !sc.pread};
    tps_split_result r;
    tps_err e = tps_split(ctx, ck, L, &o, &r);
    if (sc.after) CHECK_MSG(ch.done == 1, "the progress callback never saw '%s'", sc.after);
    CHECK_MSG(e == TPS_E_FORMAT, "got %d: %s", (int)e, tps_ctx_errmsg(ctx));
    CHECK_MSG(strstr(tps_ctx_errmsg(ctx), sc.word) && strstr(tps_ctx_errmsg(ctx), "model.safetensors"),
              "message: %s", tps_ctx_errmsg(ctx));
    CHECK_MSG(finals_in(out) == 0, "%d files left under final names", finals_in(out));
    tps_layout_free(L);
    tps_layout_spec_free(spec);
    tps_plan_free(plan);
    tps_ckpt_free(ck);
    tps_ctx_free(ctx);
}

static void truncated_source(void) { split_after_change((scenario){.delta = -5000, .word = "truncated"}); }
static void truncated_source_pread(void)
{
    split_after_change((scenario){.delta = -5000, .pread = 1, .word = "truncated"});
}
static void grown_source(void) { split_after_change((scenario){.delta = 123, .word = "grown"}); }
static void grown_source_pread(void)
{
    split_after_change((scenario){.delta = 123, .pread = 1, .word = "grown"});
}

/* Cut while splitting. The next task after lm_head is embed_tokens, a
 * contiguous copy: its write from the mapping fails with EFAULT. After
 * input_layernorm comes down_proj, gathered row by row from the mapping:
 * that read raises SIGBUS, which the guard must catch. */
static void truncated_midway_write(void)
{
    split_after_change((scenario){.after = "lm_head.weight", .word = "truncated"});
}
static void truncated_midway_gather(void)
{
    split_after_change((scenario){.after = "model.layers.0.input_layernorm.weight", .word = "truncated"});
}

/* A program that handles signals in one thread blocks them in the others;
 * the split must still catch the fault, and give the mask back as it was. */
static void truncated_midway_sigbus_blocked(void)
{
    sigset_t bus, old, after;
    sigemptyset(&bus);
    sigaddset(&bus, SIGBUS);
    CHECK(pthread_sigmask(SIG_BLOCK, &bus, &old) == 0);
    split_after_change((scenario){.after = "model.layers.0.input_layernorm.weight", .word = "truncated"});
    CHECK(pthread_sigmask(SIG_SETMASK, &old, &after) == 0);
    CHECK_MSG(sigismember(&after, SIGBUS) == 1, "the split left SIGBUS unblocked");
    /* And one that did not block it finds it unblocked. */
    split_after_change((scenario){.after = "model.layers.0.input_layernorm.weight", .word = "truncated"});
    CHECK(pthread_sigmask(SIG_SETMASK, NULL, &after) == 0);
    CHECK_MSG(sigismember(&after, SIGBUS) == 0, "the split left SIGBUS blocked");
}

static void truncated_midway_pread(void)
{
    split_after_change(
        (scenario){.after = "model.layers.0.input_layernorm.weight", .pread = 1, .word = "truncated"});
}

/* Two threads, cut after whichever task ends first: whichever thread meets
 * the cut (or the final recheck) must report it. */
static void truncated_midway_two_threads(void)
{
    split_after_change((scenario){.after = "", .threads = 2, .word = "truncated"});
    split_after_change((scenario){.after = "", .threads = 2, .pread = 1, .word = "truncated"});
}

/* Same size at the end, but written to: only the timestamps can tell. */
/* A GPTQ checkpoint in the vLLM layout: its column-parallel qweights are
 * rows of strided runs, written by FUSED tasks straight from the sources'
 * mappings (gathered writes), or assembled where mappings are off. */
static void truncated_midway_fused(void)
{
    size_t was = tps_split_map_min;
    tps_split_map_min = 1; /* the small fixture's reads mapped, as a large model's */
    /* cut before the split starts: its first task is a FUSED one, which
     * reads past the end (a SIGBUS caught under its guard) */
    split_after_change((scenario){.delta = -400000, .cased = "vllm-llama-gptq-tp2", .layout = "vllm",
                                  .tp = 2, .word = "truncated"});
    split_after_change((scenario){.after = "", .cased = "vllm-llama-gptq-tp2", .layout = "vllm",
                                  .tp = 2, .word = "truncated"});
    split_after_change((scenario){.after = "", .cased = "vllm-llama-gptq-tp2", .layout = "vllm",
                                  .tp = 2, .threads = 2, .word = "truncated"});
    split_after_change((scenario){.after = "", .cased = "vllm-llama-gptq-tp2", .layout = "vllm",
                                  .tp = 2, .pread = 1, .word = "truncated"});
    tps_split_map_min = was;
}

static void rewritten_midway(void)
{
    split_after_change((scenario){.after = "lm_head.weight", .how = REWRITE, .word = "modified"});
    split_after_change((scenario){.after = "lm_head.weight", .how = REWRITE, .pread = 1, .word = "modified"});
}

static void cut_and_regrown_midway(void)
{
    split_after_change((scenario){.after = "lm_head.weight", .how = CUT_AND_REGROW, .word = "modified"});
    split_after_change(
        (scenario){.after = "lm_head.weight", .how = CUT_AND_REGROW, .pread = 1, .word = "modified"});
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
    long long reads[3] = {0, 0, 0};
    uint64_t total = 0;
    size_t floor = tps_split_map_min;
    for (int no_mmap = 0; no_mmap <= 2; no_mmap++) {
        char out[300];
        snprintf(out, sizeof out, "%s/reads%d", dir, no_mmap);
        /* 2: mapped, at the real floor, which every task here is under */
        tps_split_map_min = no_mmap == 2 ? 256u << 10 : floor;
        tps_ctx *ctx = tps_ctx_new();
        tps_ckpt *ck = NULL;
        tps_plan *plan = NULL;
        tps_layout *L = NULL;
        CHECK(tps_ckpt_open(ctx, dir, &ck) == TPS_OK);
        CHECK(tps_plan_detect(ctx, ck, &plan) == TPS_OK);
        CHECK(tps_layout_new(ctx, ck, plan, 4, &L) == TPS_OK);
        uint64_t data = 0;
        for (size_t i = 0; i < ck->n; i++) data += ck->t[i].nbytes;
        tps_split_opts o = {.tp = 4, .out_dir = out, .map_source = no_mmap != 1};
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
    tps_split_map_min = floor;
    CHECK_MSG(reads[2] >= (long long)total, "tasks under the floor were mapped: read %lld bytes of %llu",
              reads[2], (unsigned long long)total);
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

/* Runs body(arg) in a child process; its wait status. */
static int in_child(void (*body)(void *), void *arg)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        body(arg);
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return st;
}

/* A fault outside any guard, with the default action before the hold (a
 * sanitizer installs its own). */
static void unguarded_fault(void *p)
{
    signal(SIGBUS, SIG_DFL);
    tps_guard_hold();
    volatile char c = *(volatile char *)p;
    (void)c;
}

static volatile int plain_seen;
static void plain_handler(int sig)
{
    (void)sig;
    plain_seen++;
}

/* A one-shot handler sees the first SIGBUS; the second gets the default. */
static void one_shot_twice(void *unused)
{
    (void)unused;
    struct sigaction once;
    memset(&once, 0, sizeof once);
    sigemptyset(&once.sa_mask);
    once.sa_handler = plain_handler;
    once.sa_flags = SA_RESETHAND;
    sigaction(SIGBUS, &once, NULL);
    tps_guard_hold();
    plain_seen = 0;
    raise(SIGBUS);
    if (plain_seen != 1) _exit(3);
    raise(SIGBUS);
    _exit(4);
}

/* Outside a guard, SIGBUS kills as by default; with a handler installed
 * before, that handler gets it; and release puts that handler back. */
static void guard_hands_on_the_rest(void)
{
    size_t len, pg = (size_t)sysconf(_SC_PAGESIZE);
    char *m = cut_mapping(&len);
    CHECK(m != NULL);
    if (!m) return;
    int st = in_child(unguarded_fault, m + 2 * pg);
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

/* tps_ckpt_locate against tps_ckpt_read: on a shard directory (tensors
 * made of pieces in rank files), every range it places in one file must
 * hold the bytes a read of that range gives. */
static void locate_agrees_with_read(void)
{
    char model[300], cfg[300], out[300];
    snprintf(model, sizeof model, "%s/model.safetensors", dir);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    snprintf(out, sizeof out, "%s/tp3", dir);
    CHECK(copy("testdata/conformance/llama-tp3/model/model.safetensors", model));
    CHECK(copy("testdata/conformance/llama-tp3/model/config.json", cfg));
    tps_ctx *ctx = tps_ctx_new();
    tps_ckpt *ck = NULL, *sh = NULL;
    tps_plan *plan = NULL;
    tps_layout *L = NULL;
    CHECK(tps_ckpt_open(ctx, dir, &ck) == TPS_OK);
    CHECK(tps_plan_detect(ctx, ck, &plan) == TPS_OK);
    CHECK(tps_layout_new(ctx, ck, plan, 3, &L) == TPS_OK);
    tps_split_opts o = {.tp = 3, .out_dir = out};
    tps_split_result r;
    CHECK_MSG(tps_split(ctx, ck, L, &o, &r) == TPS_OK, "%s", tps_ctx_errmsg(ctx));
    CHECK_MSG(tps_ckpt_open(ctx, out, &sh) == TPS_OK, "%s", tps_ctx_errmsg(ctx));
    unsigned seed = 12345;
    int located = 0, bad = 0;
    char *a = malloc(1 << 16), *b = malloc(1 << 16);
    for (int k = 0; sh && a && b && k < 20000; k++) {
        size_t i = (seed = seed * 1103515245u + 12345u) % sh->n;
        uint64_t n = sh->t[i].nbytes;
        if (n == 0) continue;
        uint64_t off = (seed = seed * 1103515245u + 12345u) % n;
        uint64_t len = 1 + (seed = seed * 1103515245u + 12345u) % (n - off);
        if (len > (1 << 16)) len = 1 << 16;
        int file;
        uint64_t foff;
        if (!tps_ckpt_locate(sh, i, off, len, &file, &foff)) continue;
        located++;
        if (tps_ckpt_read(ctx, sh, i, off, a, (size_t)len) != TPS_OK ||
            pread(sh->files[file].fd, b, (size_t)len, (off_t)foff) != (ssize_t)len ||
            memcmp(a, b, (size_t)len) != 0)
            bad++;
    }
    CHECK_MSG(bad == 0, "%d of %d located ranges hold other bytes than a read gives", bad, located);
    CHECK_MSG(located > 1000, "only %d ranges located", located);
    free(a);
    free(b);
    tps_ckpt_free(sh);
    tps_layout_free(L);
    tps_plan_free(plan);
    tps_ckpt_free(ck);
    tps_ctx_free(ctx);
}

/* Installs `sa` for SIGBUS, holds the guard, sends SIGBUS (not a fault, so
 * not the guard's), releases; returns how the signal was handled through
 * the counters, and checks that `sa` is back afterwards. */
static void sent_while_held(struct sigaction *sa, const char *what)
{
    struct sigaction old, now;
    CHECK(sigaction(SIGBUS, sa, &old) == 0);
    CHECK(tps_guard_hold());
    raise(SIGBUS);
    tps_guard_release();
    CHECK(sigaction(SIGBUS, &old, &now) == 0);
    CHECK_MSG(now.sa_handler == sa->sa_handler, "%s: release did not put the action back", what);
}

/* Each kind of earlier action keeps its meaning while the guard is held:
 * ignored (with or without SA_SIGINFO, the two share storage), a plain
 * handler, a one-shot handler; and release leaves alone a handler someone
 * installed over ours meanwhile. */
static void guard_keeps_earlier_actions(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = SIG_IGN;
    sent_while_held(&sa, "SIG_IGN"); /* surviving it is the check */
    sa.sa_flags = SA_SIGINFO;
    sent_while_held(&sa, "SIG_IGN with SA_SIGINFO");

    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = plain_handler;
    plain_seen = 0;
    sent_while_held(&sa, "plain handler");
    CHECK_MSG(plain_seen == 1, "the plain handler saw %d signals", plain_seen);

    /* One-shot: the handler once, then the default, which kills. */
    int st = in_child(one_shot_twice, NULL);
    CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGBUS, "one-shot handler: child status %#x", st);

    /* Someone else's handler, installed while held, stays after release. */
    struct sigaction dfl, other, now;
    memset(&dfl, 0, sizeof dfl);
    sigemptyset(&dfl.sa_mask);
    dfl.sa_handler = SIG_DFL;
    CHECK(sigaction(SIGBUS, &dfl, NULL) == 0);
    CHECK(tps_guard_hold());
    memset(&other, 0, sizeof other);
    sigemptyset(&other.sa_mask);
    other.sa_handler = plain_handler;
    CHECK(sigaction(SIGBUS, &other, NULL) == 0);
    tps_guard_release();
    CHECK(sigaction(SIGBUS, &dfl, &now) == 0);
    CHECK_MSG(now.sa_handler == plain_handler, "release replaced a handler installed after the hold");
}

static volatile int info_seen;
static void info_handler(int sig, siginfo_t *si, void *uc)
{
    (void)sig;
    (void)uc;
    info_seen = si ? si->si_code : -1000;
}

/* While held: the old action's SA_ONSTACK and SA_RESTART carry over; a
 * SIGBUS that is a notice (BUS_MCEERR_AO), even for an address in a
 * guarded range, is not the guard's; a plain old handler runs with SIGBUS
 * blocked, as the kernel would run it. */
static void guard_filters_and_flags(void)
{
    struct sigaction sa, prev, now;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_sigaction = info_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    CHECK(sigaction(SIGBUS, &sa, &prev) == 0);
    CHECK(tps_guard_hold());
    CHECK(sigaction(SIGBUS, NULL, &now) == 0);
    CHECK_MSG((now.sa_flags & (SA_ONSTACK | SA_RESTART)) == (SA_ONSTACK | SA_RESTART),
              "flags while held: %#x", (unsigned)now.sa_flags);
#ifdef BUS_MCEERR_AO
    static char area[4096];
    volatile int jumped = 0;
    tps_guard g = {.lo = area, .hi = area + sizeof area};
    info_seen = 0;
    if (sigsetjmp(g.jb, 1)) {
        tps_guard_leave();
        jumped = 1;
    } else {
        tps_guard_enter(&g);
        siginfo_t si;
        memset(&si, 0, sizeof si);
        si.si_signo = SIGBUS;
        si.si_code = BUS_MCEERR_AO;
        si.si_addr = area + 10;
        syscall(SYS_rt_tgsigqueueinfo, getpid(), (pid_t)syscall(SYS_gettid), SIGBUS, &si);
        tps_guard_leave();
    }
    CHECK_MSG(!jumped, "the guard took a BUS_MCEERR_AO notice for a fault");
    CHECK_MSG(info_seen == BUS_MCEERR_AO, "the old handler saw si_code %d", info_seen);
#endif
    tps_guard_release();
    CHECK(sigaction(SIGBUS, &prev, NULL) == 0);
}

static volatile int blocked_inside = -1;
static void mask_probe(int sig)
{
    (void)sig;
    sigset_t m;
    sigprocmask(SIG_BLOCK, NULL, &m);
    blocked_inside = sigismember(&m, SIGBUS);
}

static void chained_plain_handler_masked(void)
{
    struct sigaction sa, prev;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = mask_probe;
    CHECK(sigaction(SIGBUS, &sa, &prev) == 0);
    CHECK(tps_guard_hold());
    blocked_inside = -1;
    raise(SIGBUS);
    tps_guard_release();
    CHECK(sigaction(SIGBUS, &prev, NULL) == 0);
    CHECK_MSG(blocked_inside == 1, "SIGBUS blocked in the chained handler: %d", blocked_inside);
}

/* An action installed over ours that chains to the one it replaced (ours),
 * then recorded as the old action by the next hold: a SIGBUS that is not
 * ours must end in the default action, not a loop. */
static struct sigaction x_prev;
static volatile int x_calls;
static void x_handler(int sig, siginfo_t *si, void *uc)
{
    if (++x_calls > 100) _exit(5);
    if ((x_prev.sa_flags & SA_SIGINFO) && x_prev.sa_sigaction) x_prev.sa_sigaction(sig, si, uc);
}

static void chain_loop(void *unused)
{
    (void)unused;
    signal(SIGBUS, SIG_DFL);
    tps_guard_hold();
    struct sigaction x;
    memset(&x, 0, sizeof x);
    sigemptyset(&x.sa_mask);
    x.sa_sigaction = x_handler;
    x.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigaction(SIGBUS, &x, &x_prev);
    tps_guard_release(); /* leaves x */
    tps_guard_hold();    /* records x as the old action */
    raise(SIGBUS);
    _exit(6);
}

static void guard_breaks_chain_loops(void)
{
    int st = in_child(chain_loop, NULL);
    CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGBUS, "child status %#x, wanted death by SIGBUS", st);
}

int main(void)
{
    const char *tmp = getenv("TPS_TMP") ? getenv("TPS_TMP") : "/tmp";
    snprintf(dir, sizeof dir, "%s/srcchange.XXXXXX", tmp);
    tps_split_map_min = 1; /* map every task of these tiny models */
    if (!mkdtemp(dir)) return 1;
    RUN(truncated_source);
    RUN(truncated_source_pread);
    RUN(grown_source);
    RUN(grown_source_pread);
    RUN(truncated_midway_write);
    RUN(truncated_midway_gather);
    RUN(truncated_midway_sigbus_blocked);
    RUN(truncated_midway_pread);
    RUN(truncated_midway_two_threads);
    RUN(truncated_midway_fused);
    RUN(rewritten_midway);
    RUN(cut_and_regrown_midway);
    RUN(mapped_reads_are_not_preads);
    RUN(locate_agrees_with_read);
    RUN(guard_catches_its_range);
    RUN(guard_hands_on_the_rest);
    RUN(guard_keeps_earlier_actions);
    RUN(guard_filters_and_flags);
    RUN(chained_plain_handler_masked);
    RUN(guard_breaks_chain_loops);
    TEST_EXIT();
}
