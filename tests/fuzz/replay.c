/* replay.c - runs a fuzz target's corpus as a plain test (no libFuzzer).
 *
 *   build/tests/replay_fuzz_header [FILE|DIR]...
 *
 * The target name comes from argv[0] ("replay_fuzz_header" -> "header"), or
 * from -DFUZZ_TARGET="header". Without arguments it replays every file of
 * testdata/fuzz/<target>/ (relative to the current directory, the repo root
 * under tests/run.sh; TPS_FUZZ_CORPUS overrides the folder). Each input runs
 * in a child process with a 20 s alarm, so a crash, a sanitizer report, a leak
 * report at exit or a hang is pinned on the file that caused it. Prints one
 * line: "ok - replay <target> <n> inputs" or "not ok - ..." after "#" lines
 * naming each failing input. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

typedef struct {
    char **v;
    size_t n, cap;
} list;

static void add(list *l, const char *s)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->v = realloc(l->v, l->cap * sizeof *l->v);
        if (!l->v) abort();
    }
    l->v[l->n++] = strdup(s);
}

/* Regular files of a dir (not recursive), or the path itself. */
static int collect(list *l, const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0) return -1;
    if (!S_ISDIR(sb.st_mode)) {
        add(l, path);
        return 0;
    }
    DIR *d = opendir(path);
    if (!d) return -1;
    struct dirent *e;
    size_t first = l->n;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        if (stat(p, &sb) == 0 && S_ISREG(sb.st_mode)) add(l, p);
    }
    closedir(d);
    qsort(l->v + first, l->n - first, sizeof *l->v, cmp_str);
    return 0;
}

static int run_one(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t cap = 1 << 16, len = 0;
    uint8_t *buf = malloc(cap);
    size_t k;
    while (buf && (k = fread(buf + len, 1, cap - len, f)) > 0) {
        len += k;
        if (len == cap) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
    }
    fclose(f);
    if (!buf) return -1;
    /* exact-size copy so ASan catches a read one past the end */
    uint8_t *exact = malloc(len ? len : 1);
    memcpy(exact, buf, len);
    free(buf);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    return 0;
}

int main(int argc, char **argv)
{
#ifdef FUZZ_TARGET
    const char *target = FUZZ_TARGET;
#else
    const char *base = strrchr(argv[0], '/');
    base = base ? base + 1 : argv[0];
    const char *target = strncmp(base, "replay_fuzz_", 12) == 0 ? base + 12 : base;
#endif
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    list l = {0};
    char dir[4096];
    if (argc > 1) {
        for (int i = 1; i < argc; i++)
            if (collect(&l, argv[i]) != 0) {
                printf("not ok - replay %s: cannot read %s: %s\n", target, argv[i], strerror(errno));
                return 1;
            }
    } else {
        const char *c = getenv("TPS_FUZZ_CORPUS");
        if (c && *c)
            snprintf(dir, sizeof dir, "%s", c);
        else
            snprintf(dir, sizeof dir, "testdata/fuzz/%s", target);
        if (collect(&l, dir) != 0) {
            printf("not ok - replay %s: no corpus at %s: %s\n", target, dir, strerror(errno));
            return 1;
        }
    }
    if (l.n == 0) {
        printf("not ok - replay %s: empty corpus\n", target);
        return 1;
    }
    size_t bad = 0;
    for (size_t i = 0; i < l.n; i++) {
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 1;
        }
        if (pid == 0) {
            alarm(20);
            int rc = run_one(l.v[i]);
            exit(rc == 0 ? 0 : 3); /* exit(): sanitizers' leak check runs */
        }
        int st = 0;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
        if (WIFSIGNALED(st)) {
            printf("#   %s: killed by signal %d%s\n", l.v[i], WTERMSIG(st),
                   WTERMSIG(st) == SIGALRM ? " (hang: over 20 s)" : "");
            bad++;
        } else if (WEXITSTATUS(st) != 0) {
            printf("#   %s: exit %d%s\n", l.v[i], WEXITSTATUS(st),
                   WEXITSTATUS(st) == 3 ? " (unreadable)" : " (sanitizer report or abort)");
            bad++;
        }
    }
    if (bad)
        printf("not ok - replay %s: %zu of %zu inputs failed\n", target, bad, l.n);
    else
        printf("ok - replay %s %zu inputs\n", target, l.n);
    for (size_t i = 0; i < l.n; i++) free(l.v[i]);
    free(l.v);
    return bad ? 1 : 0;
}
