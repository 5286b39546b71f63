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
    for (size_t i = 0; i < st->n && !st->names_kept; i++) free(st->t[i].name);
    for (size_t i = 0; i < st->nmeta; i++) {
        free(st->mkeys[i]);
        free(st->mvals[i]);
    }
    free(st->t);
    free(st->mkeys);
    free(st->mvals);
    free(st->path);
    free(st->raw);
    tps_u64_chunks_free(&st->shapes);
}


void tps_st_drop_table(tps_st *st)
{
    for (size_t i = 0; i < st->n && !st->names_kept; i++) free(st->t[i].name);
    free(st->t);
    st->t = NULL;
    st->n = 0;
    tps_u64_chunks_free(&st->shapes);
}

void tps_st_free(tps_st *st)
{
    if (!st) return;
    st_free_fields(st);
    free(st);
}

/* ------------------------------------------------------------------ header parser
 *
 * A single pass over the header text straight into the compact tensor table:
 * no JSON tree, so memory stays near the header's own size (a million
 * tensors fit in about 100 MB, where a cJSON tree needed a gigabyte), and the
 * number rules are serde_json's for u64: "1.0", "1e3" and "-0" are not
 * counts. Text was checked as UTF-8 before it gets here. */

/* The shapes a header's tensors share, each kept once: a DTensor rank file of
 * DeepSeek-V3's size has 92k tensors of a few dozen shapes (12 MB of copies
 * for 8 ranks). Open addressing over (ndim, dims), during the parse only. */
typedef struct {
    const uint64_t *sh;
    int nd;
} shape_ent;
#define SHAPE_SET_MAX 65536 /* distinct shapes kept; past it each is its own */

typedef struct {
    const char *s;
    size_t n, i;
    tps_ctx *ctx;
    const char *label;
    shape_ent *set;
    size_t nset, cap_set;
} jp;

static uint64_t shape_hash(const uint64_t *sh, int nd)
{
    uint64_t h = 1469598103934665603ull ^ (uint64_t)nd;
    for (int d = 0; d < nd; d++) h = (h ^ sh[d]) * 1099511628211ull;
    return h;
}

/* shape[0 .. nd) kept in st, the copy an earlier tensor of the same shape has
 * when there is one; NULL out of memory. */
static const uint64_t *shape_keep(jp *p, tps_st *st, const uint64_t *shape, int nd)
{
    uint64_t h = shape_hash(shape, nd);
    if (p->cap_set) {
        for (size_t k = h & (p->cap_set - 1);; k = (k + 1) & (p->cap_set - 1)) {
            const shape_ent *e = &p->set[k];
            if (e->nd < 0) break; /* empty */
            if (e->nd == nd && !memcmp(e->sh, shape, sizeof(uint64_t) * (size_t)nd)) return e->sh;
        }
    }
    uint64_t *sh = tps_u64_take(&st->shapes, (size_t)nd);
    if (!sh) return NULL;
    memcpy(sh, shape, sizeof(uint64_t) * (size_t)nd);
    if (p->nset >= SHAPE_SET_MAX) return sh;
    if (2 * (p->nset + 1) > p->cap_set) {
        size_t cap = p->cap_set ? 2 * p->cap_set : 64;
        shape_ent *ns = malloc(cap * sizeof *ns);
        if (!ns) return sh; /* not shared: still kept */
        for (size_t k = 0; k < cap; k++) ns[k] = (shape_ent){NULL, -1};
        for (size_t j = 0; j < p->cap_set; j++) {
            if (p->set[j].nd < 0) continue;
            size_t k = shape_hash(p->set[j].sh, p->set[j].nd) & (cap - 1);
            while (ns[k].nd >= 0) k = (k + 1) & (cap - 1);
            ns[k] = p->set[j];
        }
        free(p->set);
        p->set = ns;
        p->cap_set = cap;
    }
    size_t k = h & (p->cap_set - 1);
    while (p->set[k].nd >= 0) k = (k + 1) & (p->cap_set - 1);
    p->set[k] = (shape_ent){sh, nd};
    p->nset++;
    return sh;
}

static void jws(jp *p)
{
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

static tps_err jbad(jp *p, const char *why)
{
    return tps_fail(p->ctx, TPS_E_FORMAT, "%s: header: not valid JSON at byte %zu: %s", p->label, p->i, why);
}

static int jpeek(jp *p) { return p->i < p->n ? (unsigned char)p->s[p->i] : -1; }

static tps_err jexpect(jp *p, char c, const char *why)
{
    jws(p);
    if (jpeek(p) != (unsigned char)c) return jbad(p, why);
    p->i++;
    return TPS_OK;
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int read_u4(jp *p, unsigned *v)
{
    if (p->i + 4 > p->n) return 0;
    *v = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexval((unsigned char)p->s[p->i + (size_t)k]);
        if (h < 0) return 0;
        *v = (*v << 4) | (unsigned)h;
    }
    p->i += 4;
    return 1;
}

/* A JSON string into a new NUL-terminated UTF-8 buffer (out may be NULL to skip). */
static tps_err jstring(jp *p, char **out)
{
    jws(p);
    if (jpeek(p) != '"') return jbad(p, "expected a string");
    p->i++;
    size_t start = p->i, esc = 0;
    while (p->i < p->n && p->s[p->i] != '"') {
        unsigned char c = (unsigned char)p->s[p->i];
        if (c < 0x20) return jbad(p, "a raw control character inside a string (a name or value; JSON requires escapes)");
        if (c == '\\') {
            esc = 1;
            p->i++;
        }
        p->i++;
    }
    if (p->i >= p->n) return jbad(p, "unterminated string");
    size_t end = p->i++;
    if (!out) {
        if (!esc) return TPS_OK;
    }
    char *o = tps_xmalloc(end - start + 1), *w = o;
    if (!o) return tps_fail(p->ctx, TPS_E_NOMEM, "out of memory");
    for (size_t k = start; k < end; k++) {
        char c = p->s[k];
        if (c != '\\') {
            *w++ = c;
            continue;
        }
        c = p->s[++k];
        switch (c) {
        case '"': *w++ = '"'; break;
        case '\\': *w++ = '\\'; break;
        case '/': *w++ = '/'; break;
        case 'b': *w++ = '\b'; break;
        case 'f': *w++ = '\f'; break;
        case 'n': *w++ = '\n'; break;
        case 'r': *w++ = '\r'; break;
        case 't': *w++ = '\t'; break;
        case 'u': {
            jp q = *p;
            q.i = k + 1;
            unsigned u, lo;
            if (!read_u4(&q, &u)) goto bad_escape;
            if (u >= 0xDC00 && u <= 0xDFFF) goto bad_escape;
            if (u >= 0xD800 && u <= 0xDBFF) {
                if (q.i + 2 > end || q.s[q.i] != '\\' || q.s[q.i + 1] != 'u') goto bad_escape;
                q.i += 2;
                if (!read_u4(&q, &lo) || lo < 0xDC00 || lo > 0xDFFF) goto bad_escape;
                u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
            }
            if (u == 0) {
                free(o);
                p->i = k;
                return jbad(p, "a \\u0000 (NUL) inside a string; names and values may not hold NUL");
            }
            if (u < 0x80) *w++ = (char)u;
            else if (u < 0x800) { *w++ = (char)(0xC0 | (u >> 6)); *w++ = (char)(0x80 | (u & 0x3F)); }
            else if (u < 0x10000) {
                *w++ = (char)(0xE0 | (u >> 12)); *w++ = (char)(0x80 | ((u >> 6) & 0x3F));
                *w++ = (char)(0x80 | (u & 0x3F));
            } else {
                *w++ = (char)(0xF0 | (u >> 18)); *w++ = (char)(0x80 | ((u >> 12) & 0x3F));
                *w++ = (char)(0x80 | ((u >> 6) & 0x3F)); *w++ = (char)(0x80 | (u & 0x3F));
            }
            k = q.i - 1;
            break;
        }
        default:
        bad_escape:
            free(o);
            p->i = k;
            return jbad(p, "a bad escape sequence in a string");
        }
    }
    *w = 0;
    if (out) *out = o;
    else free(o);
    return TPS_OK;
}

/* A JSON number; *is_uint says whether it is a plain non-negative integer
 * below 2^64 (its value in *v). */
static tps_err jnumber(jp *p, uint64_t *v, int *is_uint)
{
    jws(p);
    size_t st = p->i;
    int neg = 0, frac = 0, ovf = 0;
    uint64_t acc = 0;
    if (jpeek(p) == '-') { neg = 1; p->i++; }
    if (jpeek(p) < '0' || jpeek(p) > '9') return jbad(p, "expected a number");
    if (jpeek(p) == '0' && p->i + 1 < p->n && p->s[p->i + 1] >= '0' && p->s[p->i + 1] <= '9')
        return jbad(p, "a number with a leading zero");
    while (jpeek(p) >= '0' && jpeek(p) <= '9') {
        unsigned d = (unsigned)(p->s[p->i++] - '0');
        if (acc > (UINT64_MAX - d) / 10) ovf = 1;
        acc = acc * 10 + d;
    }
    if (jpeek(p) == '.') {
        frac = 1;
        p->i++;
        if (jpeek(p) < '0' || jpeek(p) > '9') return jbad(p, "a number with nothing after '.'");
        while (jpeek(p) >= '0' && jpeek(p) <= '9') p->i++;
    }
    if (jpeek(p) == 'e' || jpeek(p) == 'E') {
        frac = 1;
        p->i++;
        if (jpeek(p) == '+' || jpeek(p) == '-') p->i++;
        if (jpeek(p) < '0' || jpeek(p) > '9') return jbad(p, "a number with an empty exponent");
        while (jpeek(p) >= '0' && jpeek(p) <= '9') p->i++;
    }
    (void)st;
    *is_uint = !neg && !frac && !ovf;
    *v = acc;
    return TPS_OK;
}

static tps_err jskip(jp *p, int depth)
{
    if (depth > 64) return jbad(p, "JSON nested deeper than 64 levels");
    jws(p);
    int c = jpeek(p);
    uint64_t v;
    int u;
    if (c == '"') return jstring(p, NULL);
    if (c == '-' || (c >= '0' && c <= '9')) return jnumber(p, &v, &u);
    static const char *const lits[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t l = strlen(lits[k]);
        if (p->i + l <= p->n && memcmp(p->s + p->i, lits[k], l) == 0) {
            p->i += l;
            return TPS_OK;
        }
    }
    if (c != '{' && c != '[') return jbad(p, "expected a value");
    char close = c == '{' ? '}' : ']';
    p->i++;
    jws(p);
    if (jpeek(p) == close) {
        p->i++;
        return TPS_OK;
    }
    for (;;) {
        if (c == '{') {
            TPS_TRY(jstring(p, NULL));
            TPS_TRY(jexpect(p, ':', "expected ':'"));
        }
        TPS_TRY(jskip(p, depth + 1));
        jws(p);
        if (jpeek(p) == ',') { p->i++; continue; }
        if (jpeek(p) == close) { p->i++; return TPS_OK; }
        return jbad(p, "expected ',' or a closing bracket");
    }
}

/* [u, u, ...] of non-negative integers; field names the error. */
static tps_err juint_array(jp *p, const char *tname, const char *field, uint64_t *vals, int max, int *count)
{
    jws(p);
    if (jpeek(p) != '[')
        return tps_fail(p->ctx, TPS_E_FORMAT, "%s: tensor '%s': %s is not an array", p->label, tname, field);
    p->i++;
    *count = 0;
    jws(p);
    if (jpeek(p) == ']') {
        p->i++;
        return TPS_OK;
    }
    for (;;) {
        jws(p);
        int c = jpeek(p);
        if (c != '-' && (c < '0' || c > '9'))
            return tps_fail(p->ctx, TPS_E_FORMAT, "%s: tensor '%s': %s[%d] is not a non-negative integer",
                            p->label, tname, field, *count);
        uint64_t v;
        int isu;
        TPS_TRY(jnumber(p, &v, &isu));
        if (!isu)
            return tps_fail(p->ctx, TPS_E_FORMAT, "%s: tensor '%s': %s[%d] is not a non-negative integer",
                            p->label, tname, field, *count);
        if (*count >= max)
            return tps_fail(p->ctx, TPS_E_FORMAT, "%s: tensor '%s': %s has more than %d entries",
                            p->label, tname, field, max);
        vals[(*count)++] = v;
        jws(p);
        if (jpeek(p) == ',') { p->i++; continue; }
        if (jpeek(p) == ']') { p->i++; return TPS_OK; }
        return jbad(p, "expected ',' or ']'");
    }
}

static tps_err parse_metadata(jp *p, tps_st *st)
{
    jws(p);
    if (jpeek(p) < 0) return jbad(p, "the header ends in the middle of __metadata__");
    if (jpeek(p) != '{')
        return tps_fail(p->ctx, TPS_E_FORMAT, "%s: __metadata__ must be an object of strings", p->label);
    p->i++;
    jws(p);
    if (jpeek(p) == '}') {
        p->i++;
        return TPS_OK;
    }
    size_t cap = 0;
    for (;;) {
        char *k = NULL, *v = NULL;
        TPS_TRY(jstring(p, &k));
        tps_err rc = jexpect(p, ':', "expected ':'");
        jws(p);
        if (!rc && jpeek(p) != '"') {
            int reserved = !strcmp(k, "dtype") || !strcmp(k, "shape") || !strcmp(k, "data_offsets");
            rc = reserved ? tps_fail(p->ctx, TPS_E_FORMAT,
                                     "%s: a tensor may not be named __metadata__ (the name is reserved)", p->label)
                          : tps_fail(p->ctx, TPS_E_FORMAT,
                                     "%s: __metadata__ value for '%s' is not a string (metadata is "
                                     "string to string only)",
                                     p->label, k);
        }
        if (!rc) rc = jstring(p, &v);
        for (size_t j = 0; !rc && j < st->nmeta; j++)
            if (!strcmp(st->mkeys[j], k))
                rc = tps_fail(p->ctx, TPS_E_FORMAT, "%s: __metadata__: duplicate key '%s'", p->label, k);
        if (!rc && st->nmeta == cap) {
            cap = cap ? cap * 2 : 8;
            char **nk = realloc(st->mkeys, cap * sizeof *nk);
            if (nk) st->mkeys = nk;
            char **nv = realloc(st->mvals, cap * sizeof *nv);
            if (nv) st->mvals = nv;
            if (!nk || !nv) rc = tps_fail(p->ctx, TPS_E_NOMEM, "out of memory");
        }
        if (rc) {
            free(k);
            free(v);
            return rc;
        }
        st->mkeys[st->nmeta] = k;
        st->mvals[st->nmeta++] = v;
        jws(p);
        if (jpeek(p) == ',') { p->i++; continue; }
        if (jpeek(p) == '}') { p->i++; return TPS_OK; }
        return jbad(p, "expected ',' or '}' in __metadata__");
    }
}

static tps_err parse_tensor(jp *p, tps_st *st, const char *name, tps_st_tensor_info *t)
{
    const char *label = p->label;
    uint64_t shape[TPS_MAX_DIMS], end = 0;
    jws(p);
    if (jpeek(p) < 0) return jbad(p, "the header ends in the middle of an entry");
    if (jpeek(p) != '{')
        return tps_fail(p->ctx, TPS_E_FORMAT, "%s: tensor '%s': entry is not a JSON object", label, name);
    p->i++;
    int have_dt = 0, have_sh = 0, have_of = 0;
    jws(p);
    if (jpeek(p) == '}') p->i++;
    else
        for (;;) {
            char *k = NULL;
            TPS_TRY(jstring(p, &k));
            tps_err rc = jexpect(p, ':', "expected ':'");
            int *seen = !strcmp(k, "dtype") ? &have_dt : !strcmp(k, "shape") ? &have_sh
                      : !strcmp(k, "data_offsets") ? &have_of : NULL;
            if (!rc && seen && *seen)
                rc = tps_fail(p->ctx, TPS_E_FORMAT, "%s: tensor '%s': duplicate key '%s'", label, name, k);
            if (!rc && seen == &have_dt) {
                char *dt = NULL;
                jws(p);
                rc = jpeek(p) == '"' ? jstring(p, &dt)
                                     : tps_fail(p->ctx, TPS_E_FORMAT, "%s: tensor '%s': dtype is not a string",
                                                label, name);
                if (!rc && tps_dtype_from_name(dt, &t->dtype) != 0)
                    rc = tps_fail(p->ctx, TPS_E_FORMAT, "%s: tensor '%s': unknown dtype '%.64s'", label, name, dt);
                free(dt);
            } else if (!rc && seen == &have_sh) {
                rc = juint_array(p, name, "shape", shape, TPS_MAX_DIMS, &t->ndim);
            } else if (!rc && seen == &have_of) {
                uint64_t o[3];
                int cnt = 0;
                rc = juint_array(p, name, "data_offsets", o, 3, &cnt);
                if (!rc && cnt != 2)
                    rc = tps_fail(p->ctx, TPS_E_FORMAT,
                                  "%s: tensor '%s': data_offsets must be two non-negative integers [begin, end]",
                                  label, name);
                t->begin = o[0];
                end = o[1];
            } else if (!rc) {
                rc = jskip(p, 2); /* unknown keys are ignored, as the reference reader does */
            }
            free(k);
            if (rc) return rc;
            if (seen) *seen = 1;
            jws(p);
            if (jpeek(p) == ',') { p->i++; continue; }
            if (jpeek(p) == '}') { p->i++; break; }
            return jbad(p, "expected ',' or '}' in a tensor entry");
        }
    if (!have_dt) return tps_fail(p->ctx, TPS_E_FORMAT, "%s: tensor '%s': missing dtype", label, name);
    if (!have_sh) return tps_fail(p->ctx, TPS_E_FORMAT, "%s: tensor '%s': missing shape", label, name);
    if (!have_of) return tps_fail(p->ctx, TPS_E_FORMAT, "%s: tensor '%s': missing data_offsets", label, name);
    if (t->begin > end)
        return tps_fail(p->ctx, TPS_E_FORMAT, "%s: tensor '%s': data_offsets begin %llu > end %llu",
                        label, name, (unsigned long long)t->begin, (unsigned long long)end);
    const uint64_t *sh = shape_keep(p, st, shape, t->ndim);
    if (!sh) return tps_fail(p->ctx, TPS_E_NOMEM, "%s: out of memory", label);
    t->shape = sh;
    int ovf, mis;
    uint64_t nb = tps_nbytes(t->dtype, t->shape, t->ndim, &ovf, &mis);
    if (ovf)
        return tps_fail(p->ctx, TPS_E_FORMAT,
                        "%s: tensor '%s': size overflow computing bytes from shape and dtype", label, name);
    if (mis)
        return tps_fail(p->ctx, TPS_E_FORMAT,
                        "%s: tensor '%s': %s element count does not fill whole bytes (misaligned "
                        "sub-byte tensor)",
                        label, name, tps_dtype_name(t->dtype));
    if (end - t->begin != nb)
        return tps_fail(p->ctx, TPS_E_FORMAT,
                        "%s: tensor '%s': data_offsets span %llu bytes but shape and dtype %s need "
                        "%llu (size mismatch)",
                        label, name, (unsigned long long)(end - t->begin),
                        tps_dtype_name(t->dtype), (unsigned long long)nb);
    return TPS_OK;
}

static int cmp_name_ptr(const void *a, const void *b)
{
    return strcmp(**(char *const *const *)a, **(char *const *const *)b);
}

/* Walks the top-level object, filling st. */
static tps_err parse_top(jp *p, tps_st *st)
{
    jws(p);
    if (jpeek(p) != '{') {
        if (jpeek(p) == '[' || jpeek(p) == '"' || jpeek(p) == '-' || (jpeek(p) >= '0' && jpeek(p) <= '9') ||
            jpeek(p) == 't' || jpeek(p) == 'f' || jpeek(p) == 'n')
            return tps_fail(p->ctx, TPS_E_FORMAT, "%s: header is not a JSON object", p->label);
        return jbad(p, "expected '{'");
    }
    p->i++;
    size_t cap = 0;
    int have_meta = 0;
    jws(p);
    if (jpeek(p) == '}') p->i++;
    else
        for (;;) {
            char *name = NULL;
            TPS_TRY(jstring(p, &name));
            tps_err rc = jexpect(p, ':', "expected ':'");
            if (!rc && !strcmp(name, "__metadata__")) {
                rc = have_meta ? tps_fail(p->ctx, TPS_E_FORMAT, "%s: duplicate tensor name '__metadata__'", p->label)
                               : parse_metadata(p, st);
                have_meta = 1;
                free(name);
                name = NULL;
            } else if (!rc) {
                if (st->n == cap) {
                    cap = cap ? cap * 2 : 64;
                    tps_st_tensor_info *nt = realloc(st->t, cap * sizeof *nt);
                    if (!nt) rc = tps_fail(p->ctx, TPS_E_NOMEM, "%s: out of memory for %zu tensors", p->label, cap);
                    else st->t = nt;
                }
                if (!rc) {
                    tps_st_tensor_info *t = &st->t[st->n];
                    memset(t, 0, sizeof *t);
                    rc = parse_tensor(p, st, name, t);
                    if (!rc) {
                        t->name = name;
                        name = NULL;
                        st->n++;
                    }
                }
            }
            free(name);
            if (rc) return rc;
            jws(p);
            if (jpeek(p) == ',') { p->i++; continue; }
            if (jpeek(p) == '}') { p->i++; break; }
            return jbad(p, "expected ',' or '}' after a tensor entry");
        }
    jws(p);
    if (p->i != p->n) return jbad(p, "text after the header object");
    /* Duplicate names: sort pointers to them. */
    if (st->n > 1) {
        char **names = tps_xmalloc(st->n * sizeof *names);
        char ***ptrs = tps_xmalloc(st->n * sizeof *ptrs);
        if (!names || !ptrs) {
            free(names);
            free(ptrs);
            return tps_fail(p->ctx, TPS_E_NOMEM, "out of memory");
        }
        for (size_t i = 0; i < st->n; i++) {
            names[i] = st->t[i].name;
            ptrs[i] = &names[i];
        }
        qsort(ptrs, st->n, sizeof *ptrs, cmp_name_ptr);
        const char *dup = NULL;
        for (size_t i = 1; i < st->n && !dup; i++)
            if (!strcmp(*ptrs[i - 1], *ptrs[i])) dup = *ptrs[i];
        tps_err rc = dup ? tps_fail(p->ctx, TPS_E_FORMAT, "%s: duplicate tensor name '%s'", p->label, dup) : TPS_OK;
        free(names);
        free(ptrs);
        if (rc) return rc;
    }
    return TPS_OK;
}

static int cmp_by_offset(const void *a, const void *b)
{
    const tps_st_tensor_info *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    uint64_t xe = tps_st_info_end(x), ye = tps_st_info_end(y);
    if (xe != ye) return xe < ye ? -1 : 1;
    return strcmp(x->name, y->name);
}

tps_err tps_st_parse_header(tps_ctx *ctx, const char *label, const char *json, size_t n,
                            uint64_t file_size, tps_st **out)
{
    char *raw = tps_xmalloc(n + 1);
    if (!raw) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    memcpy(raw, json, n);
    raw[n] = 0;
    return tps_st_parse_header_owned(ctx, label, raw, n, file_size, out);
}

tps_err tps_st_parse_header_owned(tps_ctx *ctx, const char *label, char *raw, size_t n,
                                  uint64_t file_size, tps_st **out)
{
    tps_err rc = TPS_OK;
    const char *json = raw;
    tps_st *st = tps_xcalloc(1, sizeof *st);
    if (!st) {
        free(raw);
        return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    }
    st->raw = raw;
    st->raw_len = n;
    st->path = tps_strdup(label);
    st->file_size = file_size;
    TPS_FAIL_IF(!st->path, ctx, TPS_E_NOMEM, "out of memory");
    st->data_start = 8 + (uint64_t)n;
    TPS_FAIL_IF(!tps_utf8_valid(json, n), ctx, TPS_E_FORMAT, "%s: header is not valid UTF-8", label);
    jp p = {.s = json, .n = n, .i = 0, .ctx = ctx, .label = label};
    rc = parse_top(&p, st);
    free(p.set);
    TPS_CHECK(rc);
    if (st->n > 1) qsort(st->t, st->n, sizeof *st->t, cmp_by_offset);
    uint64_t pos = 0;
    for (size_t i = 0; i < st->n; i++) {
        const tps_st_tensor_info *t = &st->t[i];
        TPS_FAIL_IF(t->begin < pos, ctx, TPS_E_FORMAT,
                    "%s: tensor '%s': data_offsets [%llu, %llu] overlap the previous tensor '%s'",
                    label, t->name, (unsigned long long)t->begin,
                    (unsigned long long)tps_st_info_end(t), i ? st->t[i - 1].name : "");
        TPS_FAIL_IF(t->begin > pos, ctx, TPS_E_FORMAT,
                    "%s: tensor '%s': gap of %llu bytes before its data_offsets (offsets must be "
                    "contiguous from 0)",
                    label, t->name, (unsigned long long)(t->begin - pos));
        pos = tps_st_info_end(t);
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
    unsigned char lenbuf[16] = {0};
    uint64_t n = 0;
    char what[2048];
    TPS_FAIL_IF(fstat(fd, &sb) != 0, ctx, TPS_E_IO, "%s: stat: %s", path, strerror(errno));
    TPS_FAIL_IF(!S_ISREG(sb.st_mode), ctx, TPS_E_IO, "%s: not a regular file", path);
    size_t got = sb.st_size < 16 ? (size_t)sb.st_size : 16;
    if (got) TPS_CHECK(tps_pread_full(ctx, fd, path, lenbuf, got, 0));
    /* A PyTorch checkpoint or a JSON file named in place of safetensors. */
    TPS_FAIL_IF(tps_sniff(path, lenbuf, got, (uint64_t)sb.st_size, what, sizeof what), ctx,
                TPS_E_FORMAT, "%s", what);
    TPS_CHECK(check_prefix(ctx, path, lenbuf, (uint64_t)sb.st_size, &n));
    hdr = tps_xmalloc((size_t)n + 1);
    TPS_FAIL_IF(!hdr, ctx, TPS_E_NOMEM, "%s: out of memory for a %llu-byte header", path,
                (unsigned long long)n);
    TPS_CHECK(tps_pread_full(ctx, fd, path, hdr, (size_t)n, 8));
    hdr[n] = 0;
    /* The buffer becomes st->raw: a 100 MB header is held once, not twice. */
    rc = tps_st_parse_header_owned(ctx, path, hdr, (size_t)n, (uint64_t)sb.st_size, out);
    hdr = NULL;
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
    v->nbytes = tps_st_info_nbytes(t);
    const char *slash = strrchr(st->path, '/');
    v->file = slash ? slash + 1 : st->path;
    v->offset = t->begin;
}

size_t tps_st_meta_count(const tps_st *st) { return st->nmeta; }

void tps_st_drop_meta(tps_st *st)
{
    for (size_t i = 0; i < st->nmeta; i++) {
        free(st->mkeys[i]);
        free(st->mvals[i]);
    }
    free(st->mkeys);
    free(st->mvals);
    st->mkeys = st->mvals = NULL;
    st->nmeta = 0;
}

void tps_st_meta(const tps_st *st, size_t i, const char **key, const char **val)
{
    *key = st->mkeys[i];
    *val = st->mvals[i];
}

uint64_t tps_st_data_start(const tps_st *st) { return st->data_start; }

/* ------------------------------------------------------------------ writer */


static void sb_json_str(tps_sbuf *b, const char *s) { tps_json_quote(s, tps_sb_sink, b); }

static void sb_u64(tps_sbuf *b, uint64_t v)
{
    char t[24];
    snprintf(t, sizeof t, "%llu", (unsigned long long)v);
    tps_sb_puts(b, t);
}

static int cmp_entry_ref(const void *a, const void *b)
{
    const tps_st_entry *x = *(const tps_st_entry *const *)a, *y = *(const tps_st_entry *const *)b;
    if (x->dtype != y->dtype) return x->dtype > y->dtype ? -1 : 1; /* largest alignment first */
    return strcmp(x->name, y->name);
}

tps_err tps_st_emit_header(tps_ctx *ctx, tps_st_entry *e, size_t n, const char *const *mkeys,
                           const char *const *mvals, size_t nmeta,
                           void (*value)(void *u, tps_sbuf *b), void *u, size_t extra,
                           uint64_t N, tps_sbuf *b, size_t *hdr_len)
{
    tps_st_entry **ord = tps_xmalloc((n ? n : 1) * sizeof *ord);
    if (!ord) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) ord[i] = &e[i];
    qsort(ord, n, sizeof *ord, cmp_entry_ref);
    uint64_t start = b->total;
    char pre[8];
    for (int i = 0; i < 8; i++) pre[i] = (char)((N >> (8 * i)) & 0xFF);
    tps_sb_put(b, pre, 8);
    tps_sb_puts(b, "{");
    int first = 1;
    if (nmeta) {
        tps_sb_puts(b, "\"__metadata__\":{");
        for (size_t i = 0; i < nmeta; i++) {
            if (i) tps_sb_puts(b, ",");
            sb_json_str(b, mkeys[i]);
            tps_sb_puts(b, ":");
            if (mvals[i]) {
                sb_json_str(b, mvals[i]);
                continue;
            }
            tps_sb_puts(b, "\"");
            b->esc = 1;
            value(u, b);
            b->esc = 0;
            tps_sb_puts(b, "\"");
        }
        tps_sb_puts(b, "}");
        first = 0;
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        tps_st_entry *t = ord[i];
        t->offset = off;
        t->order = i;
        if (!first) tps_sb_puts(b, ",");
        first = 0;
        sb_json_str(b, t->name);
        tps_sb_puts(b, ":{\"dtype\":\"");
        tps_sb_puts(b, tps_dtype_name(t->dtype));
        tps_sb_puts(b, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            if (d) tps_sb_puts(b, ",");
            sb_u64(b, t->shape[d]);
        }
        tps_sb_puts(b, "],\"data_offsets\":[");
        sb_u64(b, off);
        tps_sb_puts(b, ",");
        off += t->nbytes;
        sb_u64(b, off);
        tps_sb_puts(b, "]}");
    }
    tps_sb_puts(b, "}");
    while ((b->total - start - 8) % 8) tps_sb_puts(b, " ");
    for (size_t i = 0; i < extra; i++) tps_sb_puts(b, " ");
    free(ord);
    if (b->oom) return tps_fail(ctx, TPS_E_NOMEM, "out of memory building a safetensors header");
    *hdr_len = (size_t)(b->total - start);
    if (*hdr_len - 8 > TPS_MAX_HEADER)
        return tps_fail(ctx, TPS_E_NOMEM, "safetensors header of %llu bytes is over the limit",
                        (unsigned long long)(*hdr_len - 8));
    return TPS_OK;
}

tps_err tps_st_build_header(tps_ctx *ctx, tps_st_entry *e, size_t n, const char *const *mkeys,
                            const char *const *mvals, size_t nmeta, char **hdr, size_t *hdr_len)
{
    tps_sbuf b = {0};
    tps_err rc = tps_st_emit_header(ctx, e, n, mkeys, mvals, nmeta, NULL, NULL, 0, 0, &b, hdr_len);
    if (rc) {
        free(b.p);
        return rc;
    }
    uint64_t N = *hdr_len - 8;
    for (int i = 0; i < 8; i++) b.p[i] = (char)((N >> (8 * i)) & 0xFF);
    *hdr = b.p;
    return TPS_OK;
}

tps_err tps_st_pad_header(tps_ctx *ctx, char **hdr, size_t *hdr_len, size_t extra)
{
    if (!extra) return TPS_OK;
    uint64_t N = *hdr_len - 8 + extra;
    if (N > TPS_MAX_HEADER)
        return tps_fail(ctx, TPS_E_NOMEM, "safetensors header of %llu bytes is over the limit",
                        (unsigned long long)N);
    char *p = realloc(*hdr, *hdr_len + extra + 1);
    if (!p) return tps_fail(ctx, TPS_E_NOMEM, "out of memory padding a safetensors header");
    memset(p + *hdr_len, ' ', extra);
    p[*hdr_len + extra] = 0;
    for (int i = 0; i < 8; i++) p[i] = (char)((N >> (8 * i)) & 0xFF);
    *hdr = p;
    *hdr_len += extra;
    return TPS_OK;
}
