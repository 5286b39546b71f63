/* safetensors.c - the format to the letter: a hostile-input reader that
 * enforces every rule of DESIGN §4 and a header builder that reproduces the
 * reference save_file layout byte for byte. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TPS_MAX_HEADER 100000000ULL
#define TPS_MAX_SHAPE_DIM 9007199254740992.0 /* 2^53: beyond it a JSON double is inexact */

uint64_t tps_nbytes(tps_dtype d, const uint64_t *shape, int ndim, int *ovf, int *misaligned)
{
    uint64_t n = 1;
    *ovf = 0;
    *misaligned = 0;
    for (int i = 0; i < ndim; i++)
        if (tps_mul_ovf(n, shape[i], &n)) {
            *ovf = 1;
            return 0;
        }
    uint64_t bits;
    if (tps_mul_ovf(n, tps_dtype_bits(d), &bits)) {
        *ovf = 1;
        return 0;
    }
    if (bits % 8) *misaligned = 1;
    return bits / 8;
}

static void st_free_fields(tps_st *st)
{
    for (size_t i = 0; i < st->n; i++) free(st->t[i].name);
    for (size_t i = 0; i < st->nmeta; i++) {
        free(st->mkeys[i]);
        free(st->mvals[i]);
    }
    free(st->t);
    free(st->mkeys);
    free(st->mvals);
    free(st->path);
    free(st->raw);
}

void tps_st_free(tps_st *st)
{
    if (!st) return;
    st_free_fields(st);
    free(st);
}

/* A JSON number that is a non-negative integer exactly representable. */
static int json_uint(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= 0) || d >= TPS_MAX_SHAPE_DIM || d != (double)(uint64_t)d) return 0;
    *out = (uint64_t)d;
    return 1;
}

static int cmp_by_offset(const void *a, const void *b)
{
    const tps_st_tensor_info *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

static tps_err parse_metadata(tps_ctx *ctx, const char *label, const cJSON *m, tps_st *st)
{
    if (!cJSON_IsObject(m))
        return tps_fail(ctx, TPS_E_FORMAT, "%s: __metadata__ must be an object of strings", label);
    if (cJSON_GetObjectItemCaseSensitive(m, "data_offsets") ||
        (cJSON_GetObjectItemCaseSensitive(m, "dtype") && cJSON_GetObjectItemCaseSensitive(m, "shape")))
        return tps_fail(ctx, TPS_E_FORMAT,
                        "%s: a tensor may not be named __metadata__ (the name is reserved)", label);
    const char *dup = tps_json_dup_key(m);
    if (dup) return tps_fail(ctx, TPS_E_FORMAT, "%s: __metadata__: duplicate key '%s'", label, dup);
    size_t n = (size_t)cJSON_GetArraySize(m);
    st->mkeys = tps_xcalloc(n, sizeof(char *));
    st->mvals = tps_xcalloc(n, sizeof(char *));
    if (!st->mkeys || !st->mvals) return tps_fail(ctx, TPS_E_NOMEM, "%s: out of memory", label);
    for (const cJSON *c = m->child; c; c = c->next) {
        if (!cJSON_IsString(c))
            return tps_fail(ctx, TPS_E_FORMAT,
                            "%s: __metadata__ value for '%s' is not a string (metadata is "
                            "string to string only)",
                            label, c->string);
        st->mkeys[st->nmeta] = tps_strdup(c->string);
        st->mvals[st->nmeta] = tps_strdup(c->valuestring);
        st->nmeta++;
    }
    return TPS_OK;
}

static tps_err parse_tensor(tps_ctx *ctx, const char *label, const cJSON *c, tps_st_tensor_info *t)
{
    const char *name = c->string;
    if (!cJSON_IsObject(c))
        return tps_fail(ctx, TPS_E_FORMAT, "%s: tensor '%s': entry is not a JSON object", label, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(c, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(c, "shape");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(c, "data_offsets");
    if (!dt) return tps_fail(ctx, TPS_E_FORMAT, "%s: tensor '%s': missing dtype", label, name);
    if (!sh) return tps_fail(ctx, TPS_E_FORMAT, "%s: tensor '%s': missing shape", label, name);
    if (!of) return tps_fail(ctx, TPS_E_FORMAT, "%s: tensor '%s': missing data_offsets", label, name);
    if (!cJSON_IsString(dt))
        return tps_fail(ctx, TPS_E_FORMAT, "%s: tensor '%s': dtype is not a string", label, name);
    if (tps_dtype_from_name(dt->valuestring, &t->dtype) != 0)
        return tps_fail(ctx, TPS_E_FORMAT, "%s: tensor '%s': unknown dtype '%.64s'", label, name,
                        dt->valuestring);
    if (!cJSON_IsArray(sh))
        return tps_fail(ctx, TPS_E_FORMAT, "%s: tensor '%s': shape is not an array", label, name);
    int nd = cJSON_GetArraySize(sh);
    if (nd > TPS_MAX_DIMS)
        return tps_fail(ctx, TPS_E_FORMAT, "%s: tensor '%s': %d dimensions, more than the %d supported",
                        label, name, nd, TPS_MAX_DIMS);
    t->ndim = 0;
    for (const cJSON *d = sh->child; d; d = d->next) {
        if (!json_uint(d, &t->shape[t->ndim]))
            return tps_fail(ctx, TPS_E_FORMAT,
                            "%s: tensor '%s': shape[%d] is not a non-negative integer", label, name,
                            t->ndim);
        t->ndim++;
    }
    if (!cJSON_IsArray(of) || cJSON_GetArraySize(of) != 2 || !json_uint(of->child, &t->begin) ||
        !json_uint(of->child->next, &t->end))
        return tps_fail(ctx, TPS_E_FORMAT,
                        "%s: tensor '%s': data_offsets must be two non-negative integers [begin, end]",
                        label, name);
    if (t->begin > t->end)
        return tps_fail(ctx, TPS_E_FORMAT, "%s: tensor '%s': data_offsets begin %llu > end %llu",
                        label, name, (unsigned long long)t->begin, (unsigned long long)t->end);
    int ovf, mis;
    uint64_t nb = tps_nbytes(t->dtype, t->shape, t->ndim, &ovf, &mis);
    if (ovf)
        return tps_fail(ctx, TPS_E_FORMAT,
                        "%s: tensor '%s': size overflow computing bytes from shape and dtype", label,
                        name);
    if (mis)
        return tps_fail(ctx, TPS_E_FORMAT,
                        "%s: tensor '%s': %s element count does not fill whole bytes (misaligned "
                        "sub-byte tensor)",
                        label, name, tps_dtype_name(t->dtype));
    if (t->end - t->begin != nb)
        return tps_fail(ctx, TPS_E_FORMAT,
                        "%s: tensor '%s': data_offsets span %llu bytes but shape and dtype %s need "
                        "%llu (size mismatch)",
                        label, name, (unsigned long long)(t->end - t->begin),
                        tps_dtype_name(t->dtype), (unsigned long long)nb);
    t->name = tps_strdup(name);
    return t->name ? TPS_OK : tps_fail(ctx, TPS_E_NOMEM, "out of memory");
}

tps_err tps_st_parse_header(tps_ctx *ctx, const char *label, const char *json, size_t n,
                            uint64_t file_size, tps_st **out)
{
    tps_err rc = TPS_OK;
    cJSON *root = NULL;
    tps_st *st = tps_xcalloc(1, sizeof *st);
    char *jlabel = tps_asprintf("%s: header", label);
    if (!st || !jlabel) {
        rc = tps_fail(ctx, TPS_E_NOMEM, "out of memory");
        goto out;
    }
    st->path = tps_strdup(label);
    st->file_size = file_size;
    st->raw = tps_xmalloc(n + 1);
    if (!st->raw) {
        rc = tps_fail(ctx, TPS_E_NOMEM, "out of memory");
        goto out;
    }
    memcpy(st->raw, json, n);
    st->raw[n] = 0;
    st->raw_len = n;
    st->data_start = 8 + (uint64_t)n;
    if (!tps_utf8_valid(json, n)) {
        rc = tps_fail(ctx, TPS_E_FORMAT, "%s: header is not valid UTF-8", label);
        goto out;
    }
    rc = tps_json_parse(ctx, jlabel, json, n, &root);
    if (rc) {
        rc = TPS_E_FORMAT;
        goto out;
    }
    TPS_FAIL_IF(!cJSON_IsObject(root), ctx, TPS_E_FORMAT, "%s: header is not a JSON object", label);
    const char *dup = tps_json_dup_key(root);
    TPS_FAIL_IF(dup, ctx, TPS_E_FORMAT, "%s: duplicate tensor name '%s'", label, dup);
    size_t cnt = (size_t)cJSON_GetArraySize(root);
    st->t = tps_xcalloc(cnt, sizeof *st->t);
    TPS_FAIL_IF(!st->t, ctx, TPS_E_NOMEM, "%s: out of memory for %zu tensors", label, cnt);
    for (const cJSON *c = root->child; c; c = c->next) {
        if (strcmp(c->string, "__metadata__") == 0) {
            TPS_CHECK(parse_metadata(ctx, label, c, st));
            continue;
        }
        TPS_CHECK(parse_tensor(ctx, label, c, &st->t[st->n]));
        st->n++;
    }
    qsort(st->t, st->n, sizeof *st->t, cmp_by_offset);
    uint64_t pos = 0;
    for (size_t i = 0; i < st->n; i++) {
        const tps_st_tensor_info *t = &st->t[i];
        if (t->begin < pos)
            TPS_FAIL_IF(1, ctx, TPS_E_FORMAT,
                        "%s: tensor '%s': data_offsets [%llu, %llu] overlap the previous tensor '%s'",
                        label, t->name, (unsigned long long)t->begin, (unsigned long long)t->end,
                        st->t[i - 1].name);
        TPS_FAIL_IF(t->begin > pos, ctx, TPS_E_FORMAT,
                    "%s: tensor '%s': gap of %llu bytes before its data_offsets (offsets must be "
                    "contiguous from 0)",
                    label, t->name, (unsigned long long)(t->begin - pos));
        pos = t->end;
    }
    uint64_t end = st->data_start + pos;
    TPS_FAIL_IF(end < st->data_start, ctx, TPS_E_FORMAT, "%s: offsets overflow", label);
    TPS_FAIL_IF(end > file_size, ctx, TPS_E_FORMAT,
                "%s: data section needs %llu bytes but the file ends after %llu (truncated file)",
                label, (unsigned long long)pos,
                (unsigned long long)(file_size > st->data_start ? file_size - st->data_start : 0));
    TPS_FAIL_IF(end < file_size, ctx, TPS_E_FORMAT,
                "%s: %llu trailing bytes after the last tensor (file not fully covered by "
                "data_offsets)",
                label, (unsigned long long)(file_size - end));
out:
    cJSON_Delete(root);
    free(jlabel);
    if (rc) {
        tps_st_free(st);
        st = NULL;
    }
    *out = st;
    return rc;
}

static uint64_t le64(const unsigned char *b)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}

static tps_err check_prefix(tps_ctx *ctx, const char *label, const unsigned char *b, uint64_t size,
                            uint64_t *n)
{
    if (size < 8)
        return tps_fail(ctx, TPS_E_FORMAT,
                        "%s: file is %llu bytes, too small for the 8-byte header length", label,
                        (unsigned long long)size);
    *n = le64(b);
    if (*n > TPS_MAX_HEADER)
        return tps_fail(ctx, TPS_E_FORMAT,
                        "%s: header length %llu exceeds the 100,000,000-byte limit (header too "
                        "large)",
                        label, (unsigned long long)*n);
    if (8 + *n > size)
        return tps_fail(ctx, TPS_E_FORMAT,
                        "%s: header length %llu runs past the end of the %llu-byte file (invalid "
                        "header length)",
                        label, (unsigned long long)*n, (unsigned long long)size);
    return TPS_OK;
}

tps_err tps_st_parse_buffer(tps_ctx *ctx, const char *label, const void *buf, size_t len,
                            uint64_t file_size)
{
    uint64_t n;
    TPS_TRY(check_prefix(ctx, label, buf, len < file_size ? len : file_size, &n));
    tps_st *st = NULL;
    tps_err rc = tps_st_parse_header(ctx, label, (const char *)buf + 8, (size_t)n, file_size, &st);
    tps_st_free(st);
    return rc;
}

tps_err tps_st_open(tps_ctx *ctx, const char *path, tps_st **out)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tps_fail(ctx, TPS_E_IO, "%s: cannot open: %s", path, strerror(errno));
    tps_err rc = TPS_OK;
    char *hdr = NULL;
    struct stat sb;
    unsigned char lenbuf[8] = {0};
    uint64_t n = 0;
    TPS_FAIL_IF(fstat(fd, &sb) != 0, ctx, TPS_E_IO, "%s: stat: %s", path, strerror(errno));
    TPS_FAIL_IF(!S_ISREG(sb.st_mode), ctx, TPS_E_IO, "%s: not a regular file", path);
    if (sb.st_size >= 8) TPS_CHECK(tps_pread_full(ctx, fd, path, lenbuf, 8, 0));
    TPS_CHECK(check_prefix(ctx, path, lenbuf, (uint64_t)sb.st_size, &n));
    hdr = tps_xmalloc((size_t)n + 1);
    TPS_FAIL_IF(!hdr, ctx, TPS_E_NOMEM, "%s: out of memory for a %llu-byte header", path,
                (unsigned long long)n);
    TPS_CHECK(tps_pread_full(ctx, fd, path, hdr, (size_t)n, 8));
    hdr[n] = 0;
    TPS_CHECK(tps_st_parse_header(ctx, path, hdr, (size_t)n, (uint64_t)sb.st_size, out));
out:
    free(hdr);
    close(fd);
    return rc;
}

size_t tps_st_count(const tps_st *st) { return st->n; }

void tps_st_tensor(const tps_st *st, size_t i, tps_tensor_view *v)
{
    const tps_st_tensor_info *t = &st->t[i];
    v->name = t->name;
    v->dtype = t->dtype;
    v->ndim = t->ndim;
    v->shape = t->shape;
    v->nbytes = t->end - t->begin;
    const char *slash = strrchr(st->path, '/');
    v->file = slash ? slash + 1 : st->path;
    v->offset = t->begin;
}

size_t tps_st_meta_count(const tps_st *st) { return st->nmeta; }

void tps_st_meta(const tps_st *st, size_t i, const char **key, const char **val)
{
    *key = st->mkeys[i];
    *val = st->mvals[i];
}

uint64_t tps_st_data_start(const tps_st *st) { return st->data_start; }

/* ------------------------------------------------------------------ writer */

typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
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

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* JSON string escaping as serde_json writes it. */
static void sb_json_str(sbuf *b, const char *s)
{
    sb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        switch (*p) {
        case '"': sb_put(b, "\\\"", 2); break;
        case '\\': sb_put(b, "\\\\", 2); break;
        case '\b': sb_put(b, "\\b", 2); break;
        case '\f': sb_put(b, "\\f", 2); break;
        case '\n': sb_put(b, "\\n", 2); break;
        case '\r': sb_put(b, "\\r", 2); break;
        case '\t': sb_put(b, "\\t", 2); break;
        default:
            if (*p < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", *p);
                sb_str(b, esc);
            } else {
                sb_put(b, (const char *)p, 1);
            }
        }
    }
    sb_put(b, "\"", 1);
}

static void sb_u64(sbuf *b, uint64_t v)
{
    char t[24];
    snprintf(t, sizeof t, "%llu", (unsigned long long)v);
    sb_str(b, t);
}

static int cmp_entry_ref(const void *a, const void *b)
{
    const tps_st_entry *x = *(const tps_st_entry *const *)a, *y = *(const tps_st_entry *const *)b;
    if (x->dtype != y->dtype) return x->dtype > y->dtype ? -1 : 1; /* largest alignment first */
    return strcmp(x->name, y->name);
}

tps_err tps_st_build_header(tps_ctx *ctx, tps_st_entry *e, size_t n, const char *const *mkeys,
                            const char *const *mvals, size_t nmeta, char **hdr, size_t *hdr_len)
{
    tps_st_entry **ord = tps_xmalloc(n * sizeof *ord);
    if (!ord) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) ord[i] = &e[i];
    qsort(ord, n, sizeof *ord, cmp_entry_ref);
    sbuf b = {0};
    sb_put(&b, "\0\0\0\0\0\0\0\0", 8);
    sb_str(&b, "{");
    int first = 1;
    if (nmeta) {
        sb_str(&b, "\"__metadata__\":{");
        for (size_t i = 0; i < nmeta; i++) {
            if (i) sb_str(&b, ",");
            sb_json_str(&b, mkeys[i]);
            sb_str(&b, ":");
            sb_json_str(&b, mvals[i]);
        }
        sb_str(&b, "}");
        first = 0;
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        tps_st_entry *t = ord[i];
        t->offset = off;
        t->order = i;
        if (!first) sb_str(&b, ",");
        first = 0;
        sb_json_str(&b, t->name);
        sb_str(&b, ":{\"dtype\":\"");
        sb_str(&b, tps_dtype_name(t->dtype));
        sb_str(&b, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            if (d) sb_str(&b, ",");
            sb_u64(&b, t->shape[d]);
        }
        sb_str(&b, "],\"data_offsets\":[");
        sb_u64(&b, off);
        sb_str(&b, ",");
        off += t->nbytes;
        sb_u64(&b, off);
        sb_str(&b, "]}");
    }
    sb_str(&b, "}");
    while ((b.len - 8) % 8) sb_str(&b, " ");
    free(ord);
    if (b.oom) {
        free(b.p);
        return tps_fail(ctx, TPS_E_NOMEM, "out of memory building a safetensors header");
    }
    uint64_t N = b.len - 8;
    if (N > TPS_MAX_HEADER) {
        free(b.p);
        return tps_fail(ctx, TPS_E_NOMEM, "safetensors header of %llu bytes is over the limit",
                        (unsigned long long)N);
    }
    for (int i = 0; i < 8; i++) b.p[i] = (char)((N >> (8 * i)) & 0xFF);
    *hdr = b.p;
    *hdr_len = b.len;
    return TPS_OK;
}
