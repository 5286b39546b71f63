/* gen_llama - synthetic Llama-shaped bf16 safetensors checkpoints for bench/.
 *
 * Standalone (no dependencies): cc -O2 -o gen_llama bench/gen_llama.c
 *
 *   gen_llama OUTDIR --size SIZE [--hidden H] [--heads N] [--kv-heads N]
 *             [--head-dim D] [--intermediate I] [--vocab V] [--layers L]
 *             [--index PARTS] [--f32-norms] [--tied] [--seed S] [-q]
 *             [--fp8] [--experts E [--moe-intermediate I]]
 * (--gptq: linear weights GPTQ 4-bit codes, group 128, BF16 scales;
 * --fp8: linear weights F8_E4M3 with 128x128 block scales (--block N: N x N), quant_method fp8;
 *  --experts: Qwen3-MoE shaped, E experts a layer of intermediate size I)
 *
 * Writes OUTDIR/config.json (LlamaForCausalLM), OUTDIR/generation_config.json
 * and either OUTDIR/model.safetensors or, with --index PARTS,
 * OUTDIR/model-0000K-of-0000N.safetensors + model.safetensors.index.json.
 * num_hidden_layers is chosen so the checkpoint is as close to SIZE as
 * possible (SIZE takes K/M/G/T binary suffixes).  Defaults for hidden 2048
 * follow Llama 3.2 1B: 32 heads of 64, 8 KV heads (GQA 4:1, divisible by tp
 * 8), intermediate 8/3 x hidden rounded up to 256 (5632), vocab 32000.
 * The file layout is the one safetensors' save_file writes: 8-byte LE header
 * length, compact JSON header with "__metadata__":{"format":"pt"} first,
 * tensors sorted by dtype alignment (descending) then name, header padded
 * with spaces to a multiple of 8, data back to back.  Data: xorshift-driven
 * bf16 values of magnitude 2^-7..2^-3 (weights) and ~1.0 (norms); no NaN/Inf.
 *
 * Second mode, used by the bench scripts to measure a command:
 *
 *   gen_llama --measure [-o FILE] -- CMD [ARGS...]
 *
 * runs CMD (stdout/stderr inherited), then writes one line
 *   rc=R wall_s=S user_s=S sys_s=S maxrss_kib=K rchar=B read_bytes=B wchar=B write_bytes=B
 * to FILE (default stderr).  wall_s uses CLOCK_MONOTONIC; user/sys CPU
 * seconds and maxrss are the
 * child's rusage from wait4 (maxrss is what /usr/bin/time -f %M reports); the I/O
 * counters come from /proc/PID/io read while the child is a zombie (-1 when
 * unavailable).  Exit status: CMD's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *prog = "gen_llama";

static void die(const char *fmt, const char *arg) {
    fprintf(stderr, "%s: error: ", prog);
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
    exit(1);
}

/* ---------------------------------------------------------------- measure */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static long long io_field(const char *buf, const char *key) {
    const char *p = strstr(buf, key);
    if (!p) return -1;
    return strtoll(p + strlen(key), NULL, 10);
}

static int measure(int argc, char **argv) {
    const char *outfile = NULL;
    int i = 0;
    while (i < argc && strcmp(argv[i], "--") != 0) {
        if (strcmp(argv[i], "-o") == 0 && i + 1 < argc) { outfile = argv[i + 1]; i += 2; }
        else die("--measure: unknown option %s (usage: --measure [-o FILE] -- CMD...)", argv[i]);
    }
    if (i >= argc || i + 1 >= argc) die("--measure: %s", "missing -- CMD");
    char **cmd = argv + i + 1;

    double t0 = now_s();
    pid_t pid = fork();
    if (pid < 0) die("fork: %s", strerror(errno));
    if (pid == 0) {
        execvp(cmd[0], cmd);
        fprintf(stderr, "%s: error: exec %s: %s\n", prog, cmd[0], strerror(errno));
        _exit(127);
    }
    siginfo_t si;
    memset(&si, 0, sizeof si);
    while (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT) < 0) {
        if (errno != EINTR) die("waitid: %s", strerror(errno));
    }
    double t1 = now_s();
    /* The child is a zombie now: its I/O accounting is still readable. */
    long long rchar = -1, read_bytes = -1, wchar = -1, write_bytes = -1;
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/io", (int)pid);
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        ssize_t n = read(fd, buf, sizeof buf - 1);
        if (n > 0) {
            buf[n] = 0;
            rchar = io_field(buf, "rchar: ");
            wchar = io_field(buf, "wchar: ");
            read_bytes = io_field(buf, "\nread_bytes: ");
            write_bytes = io_field(buf, "\nwrite_bytes: ");
        }
        close(fd);
    }
    int status = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    while (wait4(pid, &status, 0, &ru) < 0) {
        if (errno != EINTR) die("wait4: %s", strerror(errno));
    }
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    FILE *out = stderr;
    if (outfile) {
        out = fopen(outfile, "w");
        if (!out) die("cannot open %s", outfile);
    }
    fprintf(out,
            "rc=%d wall_s=%.6f user_s=%.6f sys_s=%.6f maxrss_kib=%ld rchar=%lld read_bytes=%lld wchar=%lld "
            "write_bytes=%lld\n",
            rc, t1 - t0, (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6,
            (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6, ru.ru_maxrss, rchar,
            read_bytes, wchar, write_bytes);
    if (outfile) fclose(out);
    return rc;
}

/* -------------------------------------------------------------- generator */

typedef struct {
    char name[96];
    int f32;          /* 1: F32, 0: BF16 (or F8_E4M3 when f8) */
    int f8;           /* F8_E4M3 (--fp8): 1 byte an element */
    int i32;          /* I32 (--gptq's packed codes, zero points, g_idx) */
    int norm;         /* fill ~1.0 instead of small weights */
    int ndim;
    uint64_t shape[2];
    uint64_t nbytes;
    int part;         /* output file index (0-based) */
    uint64_t off;     /* offset inside its file's data section */
} tensor_t;

static tensor_t *T;
static int nT, capT;

static int g_fp8; /* --fp8: linear weights F8_E4M3 with 128x128 block scales */
static int g_gptq; /* --gptq: linear weights GPTQ 4-bit, group 128 (qweight, scales, qzeros, g_idx) */
static long g_block = 128; /* --block N: N x N blocks instead */

static tensor_t *add(const char *name, int ndim, uint64_t d0, uint64_t d1, int f32, int norm) {
    if (nT == capT) {
        capT = capT ? capT * 2 : 256;
        T = realloc(T, (size_t)capT * sizeof *T);
        if (!T) die("%s", "out of memory");
    }
    tensor_t *t = &T[nT++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->f32 = f32;
    t->norm = norm;
    t->nbytes = (ndim == 1 ? d0 : d0 * d1) * (f32 ? 4 : 2);
    return t;
}

/* A linear layer's weight: BF16, or with --fp8 F8_E4M3 and its block scales
 * weight_scale_inv [ceil(out/128), ceil(in/128)] F32 (DeepSeek/Qwen3-FP8 style). */
static tensor_t *add_i32(const char *name, int ndim, uint64_t d0, uint64_t d1) {
    tensor_t *t = add(name, ndim, d0, d1, 1, 0); /* 4 bytes an element */
    t->i32 = 1;
    return t;
}

static void add_linear(const char *name, uint64_t out, uint64_t in) {
    if (g_gptq) { /* X.qweight [in/8, out], X.scales BF16 [in/128, out], X.qzeros [in/128, out/8] */
        char stem[96], n[112];
        snprintf(stem, sizeof stem, "%.*s", (int)(strlen(name) - strlen(".weight")), name);
        snprintf(n, sizeof n, "%s.qweight", stem);
        add_i32(n, 2, in / 8, out);
        snprintf(n, sizeof n, "%s.scales", stem);
        add(n, 2, in / 128, out, 0, 1);
        snprintf(n, sizeof n, "%s.qzeros", stem);
        add_i32(n, 2, in / 128, out / 8);
        snprintf(n, sizeof n, "%s.g_idx", stem);
        add_i32(n, 1, in, 0);
        return;
    }
    tensor_t *t = add(name, 2, out, in, 0, 0);
    if (!g_fp8) return;
    t->f8 = 1;
    t->nbytes = out * in;
    char sn[112];
    snprintf(sn, sizeof sn, "%s_scale_inv", name);
    uint64_t b = (uint64_t)g_block;
    add(sn, 2, (out + b - 1) / b, (in + b - 1) / b, 1, 1);
}

static uint64_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || v <= 0) die("bad size: %s", s);
    uint64_t m = 1;
    switch (*end) {
    case 'k': case 'K': m = 1ull << 10; end++; break;
    case 'm': case 'M': m = 1ull << 20; end++; break;
    case 'g': case 'G': m = 1ull << 30; end++; break;
    case 't': case 'T': m = 1ull << 40; end++; break;
    case 0: break;
    default: die("bad size suffix: %s", s);
    }
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'b' || *end == 'B') end++;
    if (*end) die("bad size: %s", s);
    return (uint64_t)(v * (double)m);
}

static long parse_long(const char *opt, const char *s) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < 0) die("bad value for option: %s", opt);
    return v;
}

/* sort: dtype alignment descending (F32 before BF16), then name bytewise */
static int cmp_tensor(const void *a, const void *b) {
    const tensor_t *x = *(tensor_t *const *)a, *y = *(tensor_t *const *)b;
    int ax = x->f32 ? 4 : x->f8 ? 1 : 2, ay = y->f32 ? 4 : y->f8 ? 1 : 2;
    if (ax != ay) return ay - ax;
    return strcmp(x->name, y->name);
}

/* Data generation: 4 independent xorshift64 lanes; each 64-bit word gives
 * four bf16 values (sign random, exponent 120..123, mantissa random). */
typedef struct { uint64_t s[4]; } rng_t;

static inline uint64_t xs(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    return *s = x;
}

static void rng_seed(rng_t *r, uint64_t seed) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    for (int i = 0; i < 4; i++) {
        z += 0x9E3779B97F4A7C15ull;
        uint64_t w = z;
        w = (w ^ (w >> 30)) * 0xBF58476D1CE4E5B9ull;
        w = (w ^ (w >> 27)) * 0x94D049BB133111EBull;
        w ^= w >> 31;
        r->s[i] = w ? w : 0x1234567ull + (uint64_t)i;
    }
}

/* Fill n bytes (n multiple of 8 except at the very end of a tensor, handled
 * by the caller through a scratch word). */
static void fill_weights(rng_t *r, unsigned char *p, size_t n) {
    /* bf16 per 16-bit lane: sign 0x8000 | exponent (120 + 0..3) << 7 | mantissa */
    const uint64_t keep = 0x81FF81FF81FF81FFull;   /* sign, low exp bits 0..1 and mantissa */
    const uint64_t base = 0x3C003C003C003C00ull;   /* exponent 120 = 0x78 -> 0x78 << 7 = 0x3C00 */
    size_t words = n / 8, i = 0;
    for (; i + 4 <= words; i += 4) {
        uint64_t a = xs(&r->s[0]), b = xs(&r->s[1]), c = xs(&r->s[2]), d = xs(&r->s[3]);
        a = (a & keep) | base; b = (b & keep) | base;
        c = (c & keep) | base; d = (d & keep) | base;
        memcpy(p + 8 * i, &a, 8); memcpy(p + 8 * i + 8, &b, 8);
        memcpy(p + 8 * i + 16, &c, 8); memcpy(p + 8 * i + 24, &d, 8);
    }
    for (; i < words; i++) {
        uint64_t a = (xs(&r->s[0]) & keep) | base;
        memcpy(p + 8 * i, &a, 8);
    }
    if (n % 8) {
        uint64_t a = (xs(&r->s[0]) & keep) | base;
        memcpy(p + 8 * words, &a, n % 8);
    }
}

/* Norm weights ~1.0: bf16 0x3F80 with a few random low mantissa bits, or
 * f32 1.0f with random low mantissa bits. */
static void fill_norm(rng_t *r, unsigned char *p, size_t n, int f32) {
    if (f32) {
        for (size_t i = 0; i + 4 <= n; i += 4) {
            uint32_t v = 0x3F800000u | (uint32_t)(xs(&r->s[0]) & 0x7FFFFu);
            memcpy(p + i, &v, 4);
        }
    } else {
        for (size_t i = 0; i + 2 <= n; i += 2) {
            uint16_t v = (uint16_t)(0x3F80u | (xs(&r->s[0]) & 0x7u));
            memcpy(p + i, &v, 2);
        }
    }
}

static void write_all(int fd, const void *buf, size_t n, const char *path) {
    const unsigned char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            fprintf(stderr, "%s: error: write %s: %s\n", prog, path, strerror(errno));
            exit(1);
        }
        p += w;
        n -= (size_t)w;
    }
}

typedef struct { char *s; size_t n, cap; } sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) die("%s", "vsnprintf");
        if (b->s && b->n + (size_t)k < b->cap) { b->n += (size_t)k; return; }
        size_t nc = b->cap ? b->cap * 2 : 4096;
        while (nc < b->n + (size_t)k + 1) nc *= 2;
        b->s = realloc(b->s, nc);
        if (!b->s) die("%s", "out of memory");
        b->cap = nc;
    }
}

static void write_text(const char *dir, const char *name, const char *text) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) die("cannot create %s", path);
    write_all(fd, text, strlen(text), path);
    close(fd);
}

#define CHUNK (16u << 20)

/* Write one safetensors file with the tensors of part p. Returns file size. */
static uint64_t write_part(const char *path, int p, rng_t *rng, unsigned char *buf) {
    tensor_t **v = malloc((size_t)nT * sizeof *v);
    int k = 0;
    for (int i = 0; i < nT; i++)
        if (T[i].part == p) v[k++] = &T[i];
    qsort(v, (size_t)k, sizeof *v, cmp_tensor);
    uint64_t off = 0;
    sbuf h = {0};
    sb_printf(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < k; i++) {
        tensor_t *t = v[i];
        t->off = off;
        sb_printf(&h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t->name,
                  t->i32 ? "I32" : t->f32 ? "F32" : t->f8 ? "F8_E4M3" : "BF16");
        if (t->ndim == 1) sb_printf(&h, "%" PRIu64, t->shape[0]);
        else sb_printf(&h, "%" PRIu64 ",%" PRIu64, t->shape[0], t->shape[1]);
        sb_printf(&h, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", off, off + t->nbytes);
        off += t->nbytes;
    }
    sb_printf(&h, "}");
    while (h.n % 8) sb_printf(&h, " ");

    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) die("cannot create %s", tmp);
    uint64_t total = 8 + h.n + off;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)h.n >> (8 * i));
    /* header goes into the first chunk so small files take one write */
    size_t fill = 0;
    memcpy(buf, len8, 8);
    fill = 8;
    size_t hp = 0;
    while (hp < h.n) {
        size_t c = h.n - hp < CHUNK - fill ? h.n - hp : CHUNK - fill;
        memcpy(buf + fill, h.s + hp, c);
        fill += c;
        hp += c;
        if (fill == CHUNK) { write_all(fd, buf, fill, tmp); fill = 0; }
    }
    for (int i = 0; i < k; i++) {
        tensor_t *t = v[i];
        uint64_t left = t->nbytes;
        while (left) {
            size_t room = CHUNK - fill;
            size_t c = left < room ? (size_t)left : room;
            if (t->norm) fill_norm(rng, buf + fill, c, t->f32);
            else fill_weights(rng, buf + fill, c);
            if (t->f8) /* E4M3: the bytes of bf16 weights, less the two NaN codes */
                for (size_t j = 0; j < c; j++)
                    if ((buf[fill + j] & 0x7F) == 0x7F) buf[fill + j] ^= 0x01;
            fill += c;
            left -= c;
            if (fill == CHUNK) { write_all(fd, buf, fill, tmp); fill = 0; }
        }
    }
    if (fill) write_all(fd, buf, fill, tmp);
    if (ftruncate(fd, (off_t)total) != 0) die("ftruncate %s", tmp);
    if (close(fd) != 0) die("close %s", tmp);
    if (rename(tmp, path) != 0) die("rename %s", tmp);
    free(h.s);
    free(v);
    return total;
}

static void usage(FILE *f) {
    fprintf(f,
        "usage: gen_llama OUTDIR --size SIZE [--hidden H] [--heads N] [--kv-heads N]\n"
        "                 [--head-dim D] [--intermediate I] [--vocab V] [--layers L]\n"
        "                 [--index PARTS] [--f32-norms] [--tied] [--seed S] [-q]\n"
        "                 [--fp8 [--block N]] [--experts E [--moe-intermediate I]]\n"
        "       gen_llama --measure [-o FILE] -- CMD [ARGS...]\n");
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "--measure") == 0) return measure(argc - 2, argv + 2);
    if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        usage(stdout);
        return 0;
    }
    const char *outdir = NULL;
    uint64_t size = 0;
    long hidden = 2048, heads = 0, kv = 0, head_dim = 0, inter = 0, vocab = 32000, layers = -1;
    long parts = 0, seed = 1;
    int f32_norms = 0, tied = 0, quiet = 0, vocab_set = 0;
    long experts = 0, moe_inter = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
#define NEXT() (i + 1 < argc ? argv[++i] : (die("option %s needs a value", a), ""))
        if (strcmp(a, "--size") == 0) size = parse_size(NEXT());
        else if (strcmp(a, "--hidden") == 0) hidden = parse_long(a, NEXT());
        else if (strcmp(a, "--heads") == 0) heads = parse_long(a, NEXT());
        else if (strcmp(a, "--kv-heads") == 0) kv = parse_long(a, NEXT());
        else if (strcmp(a, "--head-dim") == 0) head_dim = parse_long(a, NEXT());
        else if (strcmp(a, "--intermediate") == 0) inter = parse_long(a, NEXT());
        else if (strcmp(a, "--vocab") == 0) { vocab = parse_long(a, NEXT()); vocab_set = 1; }
        else if (strcmp(a, "--layers") == 0) layers = parse_long(a, NEXT());
        else if (strcmp(a, "--index") == 0) parts = parse_long(a, NEXT());
        else if (strcmp(a, "--seed") == 0) seed = parse_long(a, NEXT());
        else if (strcmp(a, "--f32-norms") == 0) f32_norms = 1;
        else if (strcmp(a, "--tied") == 0) tied = 1;
        else if (strcmp(a, "--fp8") == 0) g_fp8 = 1;
        else if (strcmp(a, "--gptq") == 0) g_gptq = 1;
        else if (strcmp(a, "--block") == 0) g_block = parse_long(a, NEXT());
        else if (strcmp(a, "--experts") == 0) experts = parse_long(a, NEXT());
        else if (strcmp(a, "--moe-intermediate") == 0) moe_inter = parse_long(a, NEXT());
        else if (strcmp(a, "-q") == 0) quiet = 1;
        else if (a[0] == '-' && a[1]) { usage(stderr); die("unknown option %s", a); }
        else if (!outdir) outdir = a;
        else { usage(stderr); die("unexpected argument %s", a); }
#undef NEXT
    }
    if (!outdir || (!size && layers < 0)) { usage(stderr); return 2; }
    if (hidden < 2048) fprintf(stderr, "%s: warning: hidden %ld < 2048\n", prog, hidden);
    if (!head_dim) head_dim = hidden >= 4096 ? 128 : 64;
    if (!heads) heads = hidden / head_dim;
    if (!kv) kv = heads >= 32 ? 8 : (heads / 4 ? heads / 4 : 1);
    if (!inter) inter = ((hidden * 8 / 3) + 255) / 256 * 256;
    if (heads <= 0 || kv <= 0 || heads % kv) die("%s", "heads must be a multiple of kv-heads");
    if (experts && !moe_inter) moe_inter = inter / 4 > 0 ? inter / 4 : 1;

    uint64_t H = (uint64_t)hidden, I = (uint64_t)inter, D = (uint64_t)head_dim;
    uint64_t q_out = (uint64_t)heads * D, kv_out = (uint64_t)kv * D;
    uint64_t nb = f32_norms ? 4 : 2;
    uint64_t wb = g_fp8 ? 1 : 2; /* bytes a linear weight element */
    if (g_gptq) wb = 1; /* half a byte of codes, plus scales and zeros: about 0.55 */
    uint64_t mlp = experts ? (uint64_t)experts * 3 * (uint64_t)moe_inter * H * wb + (uint64_t)experts * H * 2
                           : 3 * I * H * wb;
    uint64_t per_layer = 2 * (q_out * H * wb + kv_out * H * wb) + mlp + 2 * H * nb +
                         (experts ? 2 * D * 2 : 0);
    uint64_t fixed_per_vocab = (tied ? 1 : 2) * H * 2;
    if (layers < 0) {
        uint64_t fixed = (uint64_t)vocab * fixed_per_vocab + H * nb;
        if (size < fixed + per_layer) {
            if (vocab_set)
                fprintf(stderr, "%s: warning: --size too small for vocab %ld; 1 layer\n", prog, vocab);
            else {
                /* shrink the vocabulary (multiple of 256) so one layer fits */
                uint64_t room = size > per_layer + H * nb ? size - per_layer - H * nb : 0;
                vocab = (long)(room / fixed_per_vocab / 256 * 256);
                if (vocab < 256) vocab = 256;
                if (!quiet)
                    fprintf(stderr, "%s: note: size below one layer + vocab 32000; vocab reduced to %ld\n",
                            prog, vocab);
            }
            layers = 1;
        } else {
            fixed = (uint64_t)vocab * fixed_per_vocab + H * nb;
            layers = (long)((size - fixed + per_layer / 2) / per_layer);
            if (layers < 1) layers = 1;
        }
    }
    uint64_t V = (uint64_t)vocab;

    char nm[96];
    add("model.embed_tokens.weight", 2, V, H, 0, 0);
    for (long l = 0; l < layers; l++) {
#define L(s) (snprintf(nm, sizeof nm, "model.layers.%ld.%s", l, s), nm)
        add(L("input_layernorm.weight"), 1, H, 0, f32_norms, 1);
        if (experts) { /* Qwen3-MoE: router and experts; q_norm/k_norm */
            uint64_t MI = (uint64_t)moe_inter;
            add(L("mlp.gate.weight"), 2, (uint64_t)experts, H, 0, 0);
            for (long e = 0; e < experts; e++) {
                char en[96];
                snprintf(en, sizeof en, "model.layers.%ld.mlp.experts.%ld.down_proj.weight", l, e);
                add_linear(en, H, MI);
                snprintf(en, sizeof en, "model.layers.%ld.mlp.experts.%ld.gate_proj.weight", l, e);
                add_linear(en, MI, H);
                snprintf(en, sizeof en, "model.layers.%ld.mlp.experts.%ld.up_proj.weight", l, e);
                add_linear(en, MI, H);
            }
            add(L("self_attn.q_norm.weight"), 1, D, 0, f32_norms, 1);
            add(L("self_attn.k_norm.weight"), 1, D, 0, f32_norms, 1);
        } else {
            add_linear(L("mlp.down_proj.weight"), H, I);
            add_linear(L("mlp.gate_proj.weight"), I, H);
            add_linear(L("mlp.up_proj.weight"), I, H);
        }
        add(L("post_attention_layernorm.weight"), 1, H, 0, f32_norms, 1);
        add_linear(L("self_attn.k_proj.weight"), kv_out, H);
        add_linear(L("self_attn.o_proj.weight"), H, q_out);
        add_linear(L("self_attn.q_proj.weight"), q_out, H);
        add_linear(L("self_attn.v_proj.weight"), kv_out, H);
#undef L
    }
    add("model.norm.weight", 1, H, 0, f32_norms, 1);
    if (!tied) add("lm_head.weight", 2, V, H, 0, 0);

    uint64_t total_tensor_bytes = 0;
    for (int i = 0; i < nT; i++) total_tensor_bytes += T[i].nbytes;
    if (parts < 0) parts = 0;
    if (parts > nT) parts = nT;
    /* assign parts in model order (embed, layers, norm, lm_head) by size */
    if (parts > 1) {
        /* greedy: move to the next part when this one is about full, and
         * always leave at least one tensor for every remaining part */
        uint64_t target = total_tensor_bytes / (uint64_t)parts, acc = 0;
        int p = 0;
        for (int i = 0; i < nT; i++) {
            int must = nT - i <= (int)parts - 1 - p;
            if (p < parts - 1 && acc > 0 && (must || acc + T[i].nbytes / 2 > target)) { p++; acc = 0; }
            T[i].part = p;
            acc += T[i].nbytes;
        }
    }

    if (mkdir(outdir, 0755) != 0 && errno != EEXIST) die("cannot create %s", outdir);

    char qcfg[256] = "";
    if (g_gptq)
        snprintf(qcfg, sizeof qcfg,
                 "  \"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4, "
                 "\"group_size\": 128, \"sym\": true, \"desc_act\": false},\n");
    if (g_fp8)
        snprintf(qcfg, sizeof qcfg,
                 "  \"quantization_config\": {\"quant_method\": \"fp8\", "
                 "\"activation_scheme\": \"dynamic\", \"fmt\": \"e4m3\", "
                 "\"weight_block_size\": [%ld, %ld]},\n", g_block, g_block);
    char moe_cfg[512] = "";
    if (experts)
        snprintf(moe_cfg, sizeof moe_cfg,
                 "  \"num_experts\": %ld,\n  \"moe_intermediate_size\": %ld,\n"
                 "  \"num_experts_per_tok\": 8,\n  \"decoder_sparse_step\": 1,\n"
                 "  \"mlp_only_layers\": [],\n  \"norm_topk_prob\": true,\n",
                 experts, moe_inter);
    sbuf c = {0};
    sb_printf(&c,
        "{\n"
        "  \"architectures\": [\n    \"%s\"\n  ],\n"
        "  \"attention_bias\": false,\n"
        "  \"attention_dropout\": 0.0,\n"
        "  \"bos_token_id\": 1,\n"
        "  \"eos_token_id\": 2,\n"
        "  \"head_dim\": %ld,\n"
        "  \"hidden_act\": \"silu\",\n"
        "  \"hidden_size\": %ld,\n"
        "  \"initializer_range\": 0.02,\n"
        "  \"intermediate_size\": %ld,\n"
        "  \"max_position_embeddings\": 4096,\n"
        "  \"mlp_bias\": false,\n"
        "  \"model_type\": \"%s\",\n"
        "  \"num_attention_heads\": %ld,\n"
        "  \"num_hidden_layers\": %ld,\n"
        "  \"num_key_value_heads\": %ld,\n"
        "  \"pretraining_tp\": 1,\n"
        "  \"rms_norm_eps\": 1e-05,\n"
        "  \"rope_scaling\": null,\n"
        "  \"rope_theta\": 500000.0,\n"
        "  \"tie_word_embeddings\": %s,\n"
        "  \"torch_dtype\": \"bfloat16\",\n"
        "  \"transformers_version\": \"4.44.2\",\n"
        "  \"use_cache\": true,\n"
        "%s%s"
        "  \"vocab_size\": %ld\n"
        "}\n",
        experts ? "Qwen3MoeForCausalLM" : "LlamaForCausalLM", head_dim, hidden, inter,
        experts ? "qwen3_moe" : "llama", heads, layers, kv, tied ? "true" : "false",
        moe_cfg, qcfg, vocab);
    write_text(outdir, "config.json", c.s);
    write_text(outdir, "generation_config.json",
               "{\n  \"_from_model_config\": true,\n  \"bos_token_id\": 1,\n  \"eos_token_id\": 2,\n"
               "  \"transformers_version\": \"4.44.2\"\n}\n");

    unsigned char *buf = NULL;
    if (posix_memalign((void **)&buf, 4096, CHUNK) != 0) die("%s", "out of memory");
    rng_t rng;
    rng_seed(&rng, (uint64_t)seed);
    double t0 = now_s();
    uint64_t file_bytes = 0;
    char path[4096];
    if (parts <= 1) {
        snprintf(path, sizeof path, "%s/model.safetensors", outdir);
        file_bytes += write_part(path, 0, &rng, buf);
    } else {
        sbuf ix = {0};
        for (int p = 0; p < parts; p++) {
            char fname[64];
            snprintf(fname, sizeof fname, "model-%05d-of-%05ld.safetensors", p + 1, parts);
            snprintf(path, sizeof path, "%s/%s", outdir, fname);
            file_bytes += write_part(path, p, &rng, buf);
        }
        /* weight_map sorted by name, as transformers writes it */
        tensor_t **v = malloc((size_t)nT * sizeof *v);
        for (int i = 0; i < nT; i++) v[i] = &T[i];
        for (int i = 1; i < nT; i++) {
            tensor_t *x = v[i];
            int j = i - 1;
            while (j >= 0 && strcmp(v[j]->name, x->name) > 0) { v[j + 1] = v[j]; j--; }
            v[j + 1] = x;
        }
        sb_printf(&ix, "{\n  \"metadata\": {\n    \"total_size\": %" PRIu64 "\n  },\n  \"weight_map\": {\n",
                  total_tensor_bytes);
        for (int i = 0; i < nT; i++)
            sb_printf(&ix, "    \"%s\": \"model-%05d-of-%05ld.safetensors\"%s\n", v[i]->name,
                      v[i]->part + 1, parts, i + 1 < nT ? "," : "");
        sb_printf(&ix, "  }\n}\n");
        write_text(outdir, "model.safetensors.index.json", ix.s);
        free(v);
        free(ix.s);
    }
    double t1 = now_s();
    if (!quiet)
        fprintf(stderr,
                "%s: %s: %ld layers, hidden %ld, heads %ld/%ld kv, head_dim %ld, intermediate %ld, "
                "vocab %ld, %d tensors, %" PRIu64 " bytes in %ld file(s), %.2f s (%.2f GB/s)\n",
                prog, outdir, layers, hidden, heads, kv, head_dim, inter, vocab, nT, file_bytes,
                parts > 1 ? parts : 1L, t1 - t0, (double)file_bytes / 1e9 / (t1 - t0 > 0 ? t1 - t0 : 1e-9));
    /* machine-readable summary on stdout */
    printf("%" PRIu64 "\n", file_bytes);
    free(buf);
    free(c.s);
    free(T);
    return 0;
}
