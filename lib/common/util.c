/* util.c - ctx, errors, memory, file helpers, JSON helpers shared by lib/. */
#include "internal.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static pthread_mutex_t g_err_lock = PTHREAD_MUTEX_INITIALIZER;

const char *tps_version(void) { return TPS_VERSION_STRING; }

const char *tps_strerror(tps_err e)
{
    switch (e) {
    case TPS_OK: return "success";
    case TPS_E_IO: return "I/O error";
    case TPS_E_NOMEM: return "out of memory or over a resource bound";
    case TPS_E_FORMAT: return "malformed safetensors file";
    case TPS_E_JSON: return "malformed JSON";
    case TPS_E_INDEX: return "inconsistent checkpoint index";
    case TPS_E_CONFIG: return "bad or missing config.json value";
    case TPS_E_PLAN: return "malformed plan";
    case TPS_E_REJECT: return "tensor parallelism rejected for this model";
    case TPS_E_ARG: return "bad argument";
    case TPS_E_EXISTS: return "output exists";
    case TPS_E_MISMATCH: return "data mismatch";
    case TPS_E_UNSUPPORTED: return "not supported in this build";
    case TPS_E_INTERRUPTED: return "interrupted";
    case TPS_E_NOSPACE: return "no space left or file size limit reached";
    case TPS_E_DEVICE: return "GPU error";
    case TPS_E_SHAPE: return "tensor cannot be split as planned";
    case TPS_E_PARTIAL: return "ranks missing (a partial directory)";
    }
    return "unknown error";
}

tps_ctx *tps_ctx_new(void)
{
    tps_ctx *c = calloc(1, sizeof *c);
    return c;
}

void tps_ctx_free(tps_ctx *ctx) { free(ctx); }

void tps_ctx_set_log(tps_ctx *ctx, tps_log_fn fn, void *user)
{
    ctx->log = fn;
    ctx->log_user = user;
}

void tps_ctx_set_progress(tps_ctx *ctx, tps_progress_fn fn, void *user)
{
    ctx->progress = fn;
    ctx->progress_user = user;
}

void tps_ctx_set_threads(tps_ctx *ctx, int n) { ctx->threads = n; }

const char *tps_ctx_errmsg(const tps_ctx *ctx) { return ctx->msg; }

void tps_ctx_interrupt(tps_ctx *ctx) { ctx->interrupted = 1; }

int tps_threads(const tps_ctx *ctx)
{
    if (ctx && ctx->threads > 0) return ctx->threads;
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
#endif
}

tps_err tps_fail(tps_ctx *ctx, tps_err code, const char *fmt, ...)
{
    if (!ctx) return code;
    pthread_mutex_lock(&g_err_lock);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->msg, sizeof ctx->msg, fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&g_err_lock);
    return code;
}

void tps_log(tps_ctx *ctx, tps_log_level lvl, const char *fmt, ...)
{
    if (!ctx || !ctx->log) return;
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    ctx->log(ctx->log_user, lvl, buf);
}

void tps_log_long(tps_ctx *ctx, tps_log_level lvl, const char *fmt, ...)
{
    if (!ctx || !ctx->log) return;
    char *buf = NULL;
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&buf, fmt, ap) < 0) buf = NULL;
    va_end(ap);
    if (buf) ctx->log(ctx->log_user, lvl, buf);
    free(buf);
}

void *tps_xmalloc(size_t n) { return malloc(n ? n : 1); }
void *tps_xcalloc(size_t n, size_t m) { return calloc(n ? n : 1, m ? m : 1); }

char *tps_strdup(const char *s) { return s ? strdup(s) : NULL; }

char *tps_asprintf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *out = NULL;
    if (vasprintf(&out, fmt, ap) < 0) out = NULL;
    va_end(ap);
    return out;
}

int tps_mul_ovf(uint64_t a, uint64_t b, uint64_t *out) { return __builtin_mul_overflow(a, b, out); }

/* ------------------------------------------------------------------ numbers */

int tps_parse_size(const char *s, uint64_t *out)
{
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0) return -1;
    uint64_t mult = 1;
    switch (*end) {
    case 'k': case 'K': mult = 1ULL << 10; end++; break;
    case 'm': case 'M': mult = 1ULL << 20; end++; break;
    case 'g': case 'G': mult = 1ULL << 30; end++; break;
    case 't': case 'T': mult = 1ULL << 40; end++; break;
    default: break;
    }
    if (mult > 1 && (*end == 'i' || *end == 'I')) end++;
    if (mult > 1 && (*end == 'b' || *end == 'B')) end++;
    if (mult == 1 && (*end == 'b' || *end == 'B')) end++;
    if (*end) return -1;
    double r = v * (double)mult;
    if (r >= 18446744073709551615.0) return -1;
    *out = (uint64_t)r;
    return 0;
}

int tps_parse_ranks(const char *s, int tp, unsigned char *mask)
{
    if (!s || !*s || tp <= 0) return -1;
    memset(mask, 0, (size_t)tp);
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long a = strtol(p, &end, 10);
        if (end == p || errno || a < 0 || a >= tp) return -1;
        long b = a;
        p = end;
        if (*p == '-') {
            p++;
            b = strtol(p, &end, 10);
            if (end == p || errno || b < a || b >= tp) return -1;
            p = end;
        }
        for (long r = a; r <= b; r++) mask[r] = 1;
        if (*p == ',') {
            p++;
            if (!*p) return -1;
        } else if (*p) {
            return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ files */

tps_err tps_read_file(tps_ctx *ctx, const char *path, size_t max, char **buf, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tps_fail(ctx, TPS_E_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return tps_fail(ctx, TPS_E_IO, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > max) {
        close(fd);
        return tps_fail(ctx, TPS_E_NOMEM, "%s: %lld bytes is over the %zu-byte limit for this file",
                        path, (long long)st.st_size, max);
    }
    char *b = tps_xmalloc((size_t)st.st_size + 1);
    if (!b) {
        close(fd);
        return tps_fail(ctx, TPS_E_NOMEM, "%s: out of memory", path);
    }
    tps_err rc = tps_pread_full(ctx, fd, path, b, (size_t)st.st_size, 0);
    close(fd);
    if (rc) {
        free(b);
        return rc;
    }
    b[st.st_size] = 0;
    *buf = b;
    if (len) *len = (size_t)st.st_size;
    return TPS_OK;
}

size_t tps_text_map_min = 1u << 20;
void (*tps_text_mapped_hook)(const char *path); /* tests: change the file now */

#define TEXT_STEP (1u << 20) /* bytes scanned past the last let-go before the next */

/* The mapped text open on this thread, whose pages tps_text_behind lets go. */
static _Thread_local tps_text *text_cur;

tps_err tps_text_open(tps_ctx *ctx, const char *path, size_t max, tps_text *t)
{
    memset(t, 0, sizeof *t);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tps_fail(ctx, TPS_E_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    int big = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size <= max &&
              (uint64_t)st.st_size >= tps_text_map_min && st.st_size > 0;
    void *m = big ? mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
    close(fd);
    if (m == MAP_FAILED) return tps_read_file(ctx, path, max, &t->p, &t->len); /* its checks, its errors */
    t->p = m;
    t->len = (size_t)st.st_size;
    t->mapped = 1;
    t->done = t->p;
    text_cur = t;
    if (tps_text_mapped_hook) tps_text_mapped_hook(path);
    return TPS_OK;
}

void tps_text_close(tps_text *t)
{
    if (text_cur == t) text_cur = NULL;
    if (t->mapped) munmap(t->p, t->len);
    else free(t->p);
    memset(t, 0, sizeof *t);
}

void tps_text_behind(const char *p)
{
    tps_text *t = text_cur;
    if (!t || p < t->p || p > t->p + t->len) return; /* not the open text's */
    static size_t page;
    if (!page) {
        long ps = sysconf(_SC_PAGESIZE);
        page = ps > 0 ? (size_t)ps : 4096;
    }
    const char *to = t->p + ((size_t)(p - t->p) & ~(page - 1));
    if (to < t->done) { /* a new pass from further back */
        t->done = to;
        return;
    }
    if ((size_t)(to - t->done) < TEXT_STEP) return;
    madvise((void *)t->done, (size_t)(to - t->done), MADV_DONTNEED);
    t->done = to;
}

void tps_text_release(const char *b, const char *e)
{
    tps_text *t = text_cur;
    if (!t || !t->mapped || b < t->p || e > t->p + t->len || e <= b) return;
    long ps = sysconf(_SC_PAGESIZE);
    size_t page = ps > 0 ? (size_t)ps : 4096;
    const char *from = t->p + (((size_t)(b - t->p) + page - 1) & ~(page - 1));
    const char *to = t->p + ((size_t)(e - t->p) & ~(page - 1));
    if (to > from) madvise((void *)from, (size_t)(to - from), MADV_DONTNEED);
}

tps_err tps_pread_full(tps_ctx *ctx, int fd, const char *path, void *buf, size_t len, uint64_t off)
{
    char *p = buf;
    while (len) {
        ssize_t n = pread(fd, p, len, (off_t)off);
        if (n < 0) {
            if (errno == EINTR) continue;
            return tps_fail(ctx, TPS_E_IO, "%s: read at offset %llu: %s", path,
                            (unsigned long long)off, strerror(errno));
        }
        if (n == 0)
            return tps_fail(ctx, TPS_E_FORMAT,
                            "%s: file is shorter than expected (truncated or changed while "
                            "reading, at offset %llu)",
                            path, (unsigned long long)off);
        p += n;
        len -= (size_t)n;
        off += (uint64_t)n;
    }
    return TPS_OK;
}

static tps_err write_errno(tps_ctx *ctx, const char *path, int err)
{
    if (err == ENOSPC || err == EDQUOT)
        return tps_fail(ctx, TPS_E_NOSPACE, "%s: no space left on device", path);
    if (err == EFBIG)
        return tps_fail(ctx, TPS_E_NOSPACE, "%s: file size limit exceeded (EFBIG)", path);
    return tps_fail(ctx, TPS_E_IO, "%s: write failed: %s", path, strerror(err));
}

tps_err tps_pwrite_full(tps_ctx *ctx, int fd, const char *path, const void *buf, size_t len,
                        uint64_t off)
{
    const char *p = buf;
    while (len) {
        ssize_t n = pwrite(fd, p, len, (off_t)off);
        if (n < 0) {
            if (errno == EINTR) continue;
            /* errno survives for callers that tell causes apart (EFAULT) */
            int e = errno;
            tps_err rc = write_errno(ctx, path, e);
            errno = e;
            return rc;
        }
        if (n == 0) return write_errno(ctx, path, ENOSPC);
        p += n;
        len -= (size_t)n;
        off += (uint64_t)n;
    }
    return TPS_OK;
}

/* pwritev of iov[0 .. n) at off, every byte, short writes resumed (the
 * iovecs are advanced in place). */
tps_err tps_pwritev_full(tps_ctx *ctx, int fd, const char *path, struct iovec *iov, int n,
                         uint64_t off)
{
    while (n > 0) {
        ssize_t w = pwritev(fd, iov, n > IOV_MAX ? IOV_MAX : n, (off_t)off);
        if (w < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            tps_err rc = write_errno(ctx, path, e);
            errno = e;
            return rc;
        }
        if (w == 0) return write_errno(ctx, path, ENOSPC);
        off += (uint64_t)w;
        while (n > 0 && (size_t)w >= iov->iov_len) {
            w -= (ssize_t)iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0 && w) {
            iov->iov_base = (char *)iov->iov_base + w;
            iov->iov_len -= (size_t)w;
        }
    }
    return TPS_OK;
}

char *tps_path_join(const char *a, const char *b)
{
    size_t la = strlen(a);
    if (la && a[la - 1] == '/') return tps_asprintf("%s%s", a, b);
    return tps_asprintf("%s/%s", a, b);
}

int tps_is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int tps_exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* The host is in the name because split --ranks runs on several machines
 * write the same files (config.json) into one shared directory, and their
 * process ids may be the same. */
char *tps_tmp_name(const char *final_path)
{
    char host[65] = "";
    if (gethostname(host, sizeof host - 1) != 0) host[0] = 0;
    for (char *h = host; *h; h++)
        if (!((*h >= 'a' && *h <= 'z') || (*h >= 'A' && *h <= 'Z') || (*h >= '0' && *h <= '9') ||
              *h == '-' || *h == '.'))
            *h = '_';
    const char *slash = strrchr(final_path, '/'), *dot = *host ? "." : "";
    if (!slash) return tps_asprintf(".%s.tmp.%s%s%d", final_path, host, dot, (int)getpid());
    return tps_asprintf("%.*s/.%s.tmp.%s%s%d", (int)(slash - final_path), final_path, slash + 1,
                        host, dot, (int)getpid());
}

tps_err tps_fsync_dir(tps_ctx *ctx, const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return tps_fail(ctx, TPS_E_IO, "%s: cannot open directory: %s", dir, strerror(errno));
    fsync(fd); /* some filesystems refuse fsync on directories; that is not an error */
    close(fd);
    return TPS_OK;
}

int tps_fd_out_write(void *u, const char *p, size_t n)
{
    tps_fd_out *o = u;
    o->rc = tps_pwrite_full(o->ctx, o->fd, o->path, p, n, o->off);
    if (o->rc) return 1;
    o->crc = tps_crc32(o->crc, p, n);
    o->off += n;
    return 0;
}

tps_err tps_write_stream_atomic(tps_ctx *ctx, const char *path,
                                tps_err (*fill)(void *u, tps_sbuf *b), void *u)
{
    char *tmp = tps_tmp_name(path);
    if (!tmp) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    tps_err rc = TPS_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = tps_fail(ctx, TPS_E_IO, "%s: cannot create: %s", tmp, strerror(errno));
        goto out;
    }
    tps_fd_out o = {.ctx = ctx, .fd = fd, .path = path};
    tps_sbuf b = {.out = tps_fd_out_write, .out_u = &o};
    rc = fill(u, &b);
    if (!rc) tps_sb_flush(&b);
    if (!rc && b.oom) rc = tps_fail(ctx, TPS_E_NOMEM, "%s: out of memory", path);
    if (!rc && b.failed) rc = o.rc;
    free(b.p);
    if (!rc && fsync(fd) != 0) rc = write_errno(ctx, path, errno);
    if (close(fd) != 0 && !rc) rc = write_errno(ctx, path, errno);
    if (!rc && rename(tmp, path) != 0)
        rc = tps_fail(ctx, TPS_E_IO, "%s: rename failed: %s", path, strerror(errno));
    if (rc) unlink(tmp);
out:
    free(tmp);
    return rc;
}

struct whole {
    const void *buf;
    size_t len;
};

static tps_err put_whole(void *u, tps_sbuf *b)
{
    const struct whole *w = u;
    tps_sb_put(b, w->buf, w->len); /* a piece this large goes straight to the file */
    return TPS_OK;
}

tps_err tps_write_file_atomic(tps_ctx *ctx, const char *path, const void *buf, size_t len)
{
    struct whole w = {buf, len};
    return tps_write_stream_atomic(ctx, path, put_whole, &w);
}

tps_err tps_copy_file_atomic(tps_ctx *ctx, const char *src, const char *dst)
{
    char *buf = NULL;
    size_t len = 0;
    tps_err rc = tps_read_file(ctx, src, 1ULL << 30, &buf, &len);
    if (rc) return rc;
    rc = tps_write_file_atomic(ctx, dst, buf, len);
    free(buf);
    return rc;
}

/* ------------------------------------------------------------------ JSON */

int tps_utf8_valid(const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s, *e = p + len;
    const unsigned char *step = p;
    while (p < e) {
        if (p >= step) { /* a mapped text's pages behind may go */
            tps_text_behind((const char *)p);
            step = p + 65536;
        }
        unsigned c = *p;
        if (c < 0x80) { p++; continue; }
        int n;
        unsigned min;
        if ((c & 0xE0) == 0xC0) { n = 1; min = 0x80; c &= 0x1F; }
        else if ((c & 0xF0) == 0xE0) { n = 2; min = 0x800; c &= 0x0F; }
        else if ((c & 0xF8) == 0xF0) { n = 3; min = 0x10000; c &= 0x07; }
        else return 0;
        if (e - p <= n) return 0;
        for (int i = 1; i <= n; i++) {
            if ((p[i] & 0xC0) != 0x80) return 0;
            c = (c << 6) | (p[i] & 0x3F);
        }
        if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
        p += n + 1;
    }
    return 1;
}

/* One pass before cJSON sees the text: bound the nesting (cJSON recurses
 * per level, so a hostile file must not reach its stack), and refuse what
 * cJSON would let through but C strings cannot hold: raw control characters
 * in strings (JSON forbids them) and \u0000 (a name would be truncated). */
static const char *json_prescan(const char *s, size_t len, int max)
{
    int depth = 0, in_str = 0;
    for (size_t i = 0; i < len; i++) {
        if (!(i & 0xFFFF)) tps_text_behind(s + i);
        unsigned char c = (unsigned char)s[i];
        if (in_str) {
            if (c < 0x20) return "a raw control character inside a string (a name or value; JSON requires escapes)";
            if (c == '\\') {
                if (i + 5 < len && memcmp(s + i + 1, "u0000", 5) == 0)
                    return "a \\u0000 (NUL) inside a string; names and values may not hold NUL";
                i++;
            } else if (c == '"') {
                in_str = 0;
            }
            continue;
        }
        if (c == 0) return "a NUL byte outside any string";
        if (c == '"') in_str = 1;
        else if (c == '{' || c == '[') {
            if (++depth > max) return "JSON nested deeper than 64 levels";
        } else if (c == '}' || c == ']') depth--;
    }
    return NULL;
}

const char *tps_json_prescan_span(const char *text, size_t len)
{
    return json_prescan(text, len, 63); /* a member of the top-level object */
}

tps_err tps_json_parse(tps_ctx *ctx, const char *label, const char *text, size_t len, cJSON **out)
{
    if (!tps_utf8_valid(text, len))
        return tps_fail(ctx, TPS_E_JSON, "%s: not valid UTF-8", label);
    const char *why = json_prescan(text, len, 64);
    if (why) return tps_fail(ctx, TPS_E_JSON, "%s: not valid JSON: %s", label, why);
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!j) {
        size_t pos = end ? (size_t)(end - text) : 0;
        if (pos > len) pos = len;
        return tps_fail(ctx, TPS_E_JSON, "%s: not valid JSON (near byte %zu)", label, pos);
    }
    /* Only JSON whitespace may follow. */
    for (const char *p = end; p && p < text + len; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(j);
            return tps_fail(ctx, TPS_E_JSON, "%s: not valid JSON (trailing text at byte %zu)", label,
                            (size_t)(p - text));
        }
    }
    *out = j;
    return TPS_OK;
}

/* Duplicate detection in O(n log n): sort pointers to keys. */
static int cmp_strp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

const char *tps_json_dup_key(const cJSON *obj)
{
    size_t n = 0;
    for (const cJSON *c = obj->child; c; c = c->next) n++;
    if (n < 2) return NULL;
    const char **keys = tps_xmalloc(n * sizeof *keys);
    if (!keys) return NULL;
    size_t i = 0;
    for (const cJSON *c = obj->child; c; c = c->next) keys[i++] = c->string ? c->string : "";
    qsort(keys, n, sizeof *keys, cmp_strp);
    const char *dup = NULL;
    for (i = 1; i < n && !dup; i++)
        if (strcmp(keys[i - 1], keys[i]) == 0) dup = keys[i];
    free(keys);
    return dup;
}

uint64_t *tps_u64_take(tps_u64_chunks *c, size_t n)
{
    if (n > TPS_U64_CHUNK) return NULL;
    if (c->left < n || !c->n) {
        uint64_t **nc = realloc(c->chunk, (c->n + 1) * sizeof *nc);
        if (!nc) return NULL;
        c->chunk = nc;
        if (!(nc[c->n] = malloc(TPS_U64_CHUNK * sizeof(uint64_t)))) return NULL;
        c->n++;
        c->left = TPS_U64_CHUNK;
    }
    uint64_t *p = c->chunk[c->n - 1] + (TPS_U64_CHUNK - c->left);
    c->left -= n;
    return p;
}

void tps_u64_chunks_free(tps_u64_chunks *c)
{
    for (size_t i = 0; i < c->n; i++) free(c->chunk[i]);
    free(c->chunk);
    memset(c, 0, sizeof *c);
}

const char *tps_str_keep(tps_str_chunks *c, const char *s)
{
    size_t n = strlen(s) + 1;
    if (n > c->left) {
        size_t cap = n > TPS_STR_CHUNK ? n : TPS_STR_CHUNK;
        char **nc = realloc(c->chunk, (c->n + 1) * sizeof *nc);
        if (!nc) return NULL;
        c->chunk = nc;
        if (!(nc[c->n] = malloc(cap))) return NULL;
        c->next = nc[c->n++];
        c->left = cap;
    }
    char *d = c->next;
    memcpy(d, s, n);
    c->next += n;
    c->left -= n;
    return d;
}

int tps_str_chunks_has(const tps_str_chunks *c, const char *s)
{
    uintptr_t p = (uintptr_t)s;
    for (size_t i = c->n; i-- > 0;) {
        uintptr_t b = (uintptr_t)c->chunk[i];
        if (p >= b && p - b < TPS_STR_CHUNK) return 1;
    }
    return 0;
}

void tps_str_chunks_free(tps_str_chunks *c)
{
    for (size_t i = 0; i < c->n; i++) free(c->chunk[i]);
    free(c->chunk);
    memset(c, 0, sizeof *c);
}

void tps_heap_release(void)
{
#ifdef __GLIBC__
    malloc_trim(0);
#endif
}

static void sb_raw(tps_sbuf *b, const char *s, size_t n)
{
    if (b->oom || b->failed) return;
    b->total += n;
    if (b->out && b->len + n > TPS_SB_PIECE) {
        if (tps_sb_flush(b)) return;
        if (n >= TPS_SB_PIECE) {
            if (b->out(b->out_u, s, n)) b->failed = 1;
            return;
        }
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void sb_raw_sink(void *user, const char *p, size_t n) { sb_raw(user, p, n); }

void tps_sb_put(tps_sbuf *b, const char *s, size_t n)
{
    if (b->esc) tps_json_escape(s, n, sb_raw_sink, b);
    else sb_raw(b, s, n);
}

void tps_sb_puts(tps_sbuf *b, const char *s) { tps_sb_put(b, s, strlen(s)); }

void tps_sb_sink(void *user, const char *p, size_t n) { tps_sb_put(user, p, n); }

int tps_sb_flush(tps_sbuf *b)
{
    if (b->failed) return 1;
    if (!b->out || !b->len) return 0;
    if (b->out(b->out_u, b->p, b->len)) b->failed = 1;
    b->len = 0;
    if (b->p) b->p[0] = 0;
    return b->failed;
}

int tps_sb_discard(void *u, const char *p, size_t n)
{
    (void)u, (void)p, (void)n;
    return 0;
}

void tps_json_escape(const char *s, size_t n, void (*put)(void *user, const char *p, size_t n),
                     void *user)
{
    const char *run = s; /* bytes copied as they are, flushed in one call */
    for (const unsigned char *p = (const unsigned char *)s; p < (const unsigned char *)s + n; p++) {
        const char *esc = NULL;
        char u[8];
        switch (*p) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        default:
            if (*p < 0x20) {
                snprintf(u, sizeof u, "\\u%04x", *p);
                esc = u;
            }
        }
        if (!esc) continue;
        if ((const char *)p > run) put(user, run, (size_t)((const char *)p - run));
        put(user, esc, strlen(esc));
        run = (const char *)p + 1;
    }
    if (s + n > run) put(user, run, (size_t)(s + n - run));
}

void tps_json_quote(const char *s, void (*put)(void *user, const char *p, size_t n), void *user)
{
    put(user, "\"", 1);
    tps_json_escape(s, strlen(s), put, user);
    put(user, "\"", 1);
}

/* "a.b.c": each component an object key, from the top level of root. */
static const cJSON *config_path(const cJSON *root, const char *path)
{
    const cJSON *v = root;
    char key[128];
    while (v && *path) {
        const char *dot = strchr(path, '.');
        size_t n = dot ? (size_t)(dot - path) : strlen(path);
        if (n >= sizeof key || !cJSON_IsObject(v)) return NULL;
        memcpy(key, path, n);
        key[n] = 0;
        v = cJSON_GetObjectItemCaseSensitive(v, key);
        path += n + (dot ? 1 : 0);
    }
    return v && !cJSON_IsNull(v) ? v : NULL;
}

const cJSON *tps_config_get(const cJSON *config, const char *field)
{
    if (!config) return NULL;
    if (strchr(field, '.')) { /* a path, e.g. quantization_config.quant_method */
        const cJSON *v = config_path(config, field);
        return v ? v : config_path(cJSON_GetObjectItemCaseSensitive(config, "text_config"), field);
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(config, field);
    if (v && !cJSON_IsNull(v)) return v;
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(config, "text_config");
    if (cJSON_IsObject(tc)) {
        v = cJSON_GetObjectItemCaseSensitive(tc, field);
        if (v && !cJSON_IsNull(v)) return v;
    }
    return NULL;
}

void tps_chunk(uint64_t n, int tp, int r, uint64_t *start, uint64_t *len)
{
    uint64_t c = n ? (n + (uint64_t)tp - 1) / (uint64_t)tp : 0;
    uint64_t a = (uint64_t)r * c, b = (uint64_t)(r + 1) * c;
    if (a > n) a = n;
    if (b > n) b = n;
    *start = a;
    *len = b - a;
}
