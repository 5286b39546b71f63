/* checkpoint.c - a model as a set of named tensors: one file, a directory
 * with model.safetensors or an index with parts, or a tpshard output
 * directory read through its manifest as if it were the full checkpoint.
 * Every tensor is a list of pieces concatenated along one dim, so reading a
 * logical byte range works the same for all of them. */
#include "internal.h"
#include "provenance.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_JSON_FILE (256u << 20)

static const char *const aux_files[] = {
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "tokenizer.model", "special_tokens_map.json", "vocab.json", "merges.txt", "added_tokens.json",
    "chat_template.json", "chat_template.jinja", "preprocessor_config.json",
    "processor_config.json", NULL,
};

void tps_ckpt_free(tps_ckpt *ck)
{
    if (!ck) return;
    for (size_t i = 0; i < ck->nfiles; i++) {
        if (ck->files[i].fd >= 0) close(ck->files[i].fd);
        free(ck->files[i].name);
        free(ck->files[i].path);
        tps_st_free(ck->files[i].st);
        free(ck->files[i].byname);
    }
    for (size_t i = 0; i < ck->n; i++) {
        free(ck->t[i].placement);
    }
    for (size_t i = 0; i < ck->nrts; i++) free(ck->rts[i].fills);
    free(ck->rts);
    for (size_t i = 0; i < ck->npools; i++) free(ck->pools[i]);
    free(ck->pools);
    for (size_t i = 0; i < ck->nstr_chunks; i++) free(ck->str_chunks[i]);
    free(ck->str_chunks);
    for (size_t i = 0; i < ck->norigins; i++) free(ck->origins[i]);
    free(ck->origins);
    free(ck->files);
    free(ck->t);
    free(ck->path);
    free(ck->dir);
    free(ck->stem);
    free(ck->index_name);
    free(ck->rank_present);
    free(ck->rank_written);
    free(ck->plan_name);
    free(ck->config_text);
    free(ck->config_out);
    free(ck->untie_head);
    free(ck->untie_embedding);
    free(ck->untie_config);
    cJSON_Delete(ck->config);
    cJSON_Delete(ck->manifest);
    cJSON_Delete(ck->origin_meta);
    cJSON_Delete(ck->origin_header);
    cJSON_Delete(ck->index_meta);
    free(ck);
}

static tps_err add_file(tps_ctx *ctx, tps_ckpt *ck, const char *name, size_t *idx)
{
    tps_cfile *nf = realloc(ck->files, (ck->nfiles + 1) * sizeof *nf);
    if (!nf) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    ck->files = nf;
    tps_cfile *f = &ck->files[ck->nfiles];
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->name = tps_strdup(name);
    f->path = tps_path_join(ck->dir, name);
    ck->nfiles++;
    if (!f->name || !f->path) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    TPS_TRY(tps_st_open(ctx, f->path, &f->st));
    f->fd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) return tps_fail(ctx, TPS_E_IO, "%s: cannot open: %s", f->path, strerror(errno));
    struct stat sb;
    if (fstat(f->fd, &sb) != 0) return tps_fail(ctx, TPS_E_IO, "%s: stat: %s", f->path, strerror(errno));
    f->size = (uint64_t)sb.st_size;
    f->mtime_s = (int64_t)sb.st_mtim.tv_sec;
    f->mtime_ns = (int64_t)sb.st_mtim.tv_nsec;
    if (f->size != f->st->file_size)
        return tps_fail(ctx, TPS_E_FORMAT, "%s: file changed size while being opened", f->path);
    posix_fadvise(f->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    *idx = ck->nfiles - 1;
    return TPS_OK;
}

/* n pieces from a new pool the checkpoint frees. */
static tps_piece *new_pool(tps_ctx *ctx, tps_ckpt *ck, size_t n)
{
    tps_piece **np = realloc(ck->pools, (ck->npools + 1) * sizeof *np);
    if (!np) return tps_fail(ctx, TPS_E_NOMEM, "out of memory"), NULL;
    ck->pools = np;
    tps_piece *p = tps_xcalloc(n, sizeof *p);
    if (!p) return tps_fail(ctx, TPS_E_NOMEM, "out of memory"), NULL;
    ck->pools[ck->npools++] = p;
    return p;
}

static tps_err grow_tensors(tps_ctx *ctx, tps_ckpt *ck, size_t extra)
{
    tps_ctensor *nt = realloc(ck->t, (ck->n + extra) * sizeof *nt);
    if (!nt) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    ck->t = nt;
    memset(ck->t + ck->n, 0, extra * sizeof *nt);
    return TPS_OK;
}

/* Every tensor of file fi becomes a one-piece tensor. */
static tps_err add_file_tensors(tps_ctx *ctx, tps_ckpt *ck, size_t fi)
{
    tps_cfile *f = &ck->files[fi];
    TPS_TRY(grow_tensors(ctx, ck, f->st->n));
    tps_piece *pool = new_pool(ctx, ck, f->st->n);
    if (!pool) return TPS_E_NOMEM;
    for (size_t i = 0; i < f->st->n; i++) {
        const tps_st_tensor_info *s = &f->st->t[i];
        tps_ctensor *t = &ck->t[ck->n++];
        t->name = s->name;
        t->dtype = s->dtype;
        t->ndim = s->ndim;
        memset(t->shape, 0, sizeof t->shape);
        memcpy(t->shape, s->shape, sizeof(uint64_t) * (size_t)s->ndim);
        t->nbytes = s->end - s->begin;
        t->dim = -1;
        t->npieces = 1;
        t->pieces = &pool[i];
        t->origin = f->name;
        t->pieces[0].file = (int)fi;
        t->pieces[0].off = f->st->data_start + s->begin;
        t->pieces[0].nbytes = t->pieces[0].fbytes = t->nbytes;
        t->pieces[0].stored = t->dtype;
    }
    return TPS_OK;
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp(((const tps_ctensor *)a)->name, ((const tps_ctensor *)b)->name);
}

static tps_err sort_and_dedup(tps_ctx *ctx, tps_ckpt *ck)
{
    if (ck->n > 1) qsort(ck->t, ck->n, sizeof *ck->t, cmp_tensor_name);
    for (size_t i = 1; i < ck->n; i++)
        if (strcmp(ck->t[i - 1].name, ck->t[i].name) == 0)
            return tps_fail(ctx, TPS_E_INDEX, "%s: tensor '%s' is in both %s and %s", ck->path,
                            ck->t[i].name, ck->t[i - 1].origin, ck->t[i].origin);
    return TPS_OK;
}

static tps_err load_json_file(tps_ctx *ctx, const char *path, cJSON **out)
{
    char *buf = NULL;
    size_t len = 0;
    TPS_TRY(tps_read_file(ctx, path, MAX_JSON_FILE, &buf, &len));
    tps_err rc = tps_json_parse(ctx, path, buf, len, out);
    free(buf);
    return rc;
}

static tps_err load_config(tps_ctx *ctx, tps_ckpt *ck)
{
    char *p = tps_path_join(ck->dir, "config.json");
    if (!p) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    tps_err rc = TPS_OK;
    if (tps_exists(p)) {
        size_t len = 0;
        /* The text is kept: --untie rewrites one field of it and merge gives it back. */
        rc = tps_read_file(ctx, p, MAX_JSON_FILE, &ck->config_text, &len);
        if (!rc) rc = tps_json_parse(ctx, p, ck->config_text, len, &ck->config);
        if (!rc && !cJSON_IsObject(ck->config))
            rc = tps_fail(ctx, TPS_E_CONFIG, "%s: not a JSON object", p);
        if (rc == TPS_E_JSON) rc = TPS_E_CONFIG;
        if (!rc) rc = tps_config_resolve(ctx, ck->config);
    }
    free(p);
    return rc;
}

/* A weight_map file name must be a plain name inside the model directory. */
static int plain_name(const char *s)
{
    return *s && !strchr(s, '/') && !strchr(s, '\\') && strcmp(s, ".") && strcmp(s, "..");
}

static tps_err open_index(tps_ctx *ctx, tps_ckpt *ck, const char *ipath)
{
    tps_err rc = TPS_OK;
    cJSON *idx = NULL;
    TPS_CHECK(load_json_file(ctx, ipath, &idx));
    TPS_FAIL_IF(!cJSON_IsObject(idx), ctx, TPS_E_INDEX, "%s: not a JSON object", ipath);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(idx, "weight_map");
    TPS_FAIL_IF(!cJSON_IsObject(wm), ctx, TPS_E_INDEX, "%s: weight_map is missing or not an object",
                ipath);
    const char *dup = tps_json_dup_key(wm);
    TPS_FAIL_IF(dup, ctx, TPS_E_INDEX, "%s: weight_map: tensor '%s' listed twice", ipath, dup);
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(idx, "metadata");
    if (cJSON_IsObject(meta)) ck->index_meta = cJSON_Duplicate(meta, 1);
    /* Open each named part once, in first-mention order. */
    for (const cJSON *e = wm->child; e; e = e->next) {
        TPS_FAIL_IF(!cJSON_IsString(e), ctx, TPS_E_INDEX,
                    "%s: weight_map['%s'] is not a file name string", ipath, e->string);
        const char *fn = e->valuestring;
        TPS_FAIL_IF(!plain_name(fn), ctx, TPS_E_INDEX,
                    "%s: weight_map['%s'] names '%s': file names must be plain names inside the "
                    "model directory (no '/', '..' or absolute paths)",
                    ipath, e->string, fn);
        size_t k;
        for (k = 0; k < ck->nfiles; k++)
            if (strcmp(ck->files[k].name, fn) == 0) break;
        if (k == ck->nfiles) {
            char *pp = tps_path_join(ck->dir, fn);
            int there = pp && tps_exists(pp);
            free(pp);
            TPS_FAIL_IF(!there, ctx, TPS_E_INDEX, "%s: part '%s' (holding '%s') is missing", ipath, fn,
                        e->string);
            size_t fi;
            TPS_CHECK(add_file(ctx, ck, fn, &fi));
            TPS_CHECK(add_file_tensors(ctx, ck, fi));
        }
    }
    TPS_FAIL_IF(ck->nfiles == 0, ctx, TPS_E_INDEX, "%s: weight_map is empty", ipath);
    TPS_CHECK(sort_and_dedup(ctx, ck));
    /* Every tensor in the file the map names, and nothing unmapped. */
    for (size_t i = 0; i < ck->n; i++) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(wm, ck->t[i].name);
        TPS_FAIL_IF(!e, ctx, TPS_E_INDEX, "%s: tensor '%s' is in %s but not in the index's weight_map",
                    ipath, ck->t[i].name, ck->t[i].origin);
        TPS_FAIL_IF(strcmp(e->valuestring, ck->t[i].origin) != 0, ctx, TPS_E_INDEX,
                    "%s: tensor '%s' is in %s but the index puts it in %s (tensor in wrong part)",
                    ipath, ck->t[i].name, ck->t[i].origin, e->valuestring);
    }
    if ((size_t)cJSON_GetArraySize(wm) != ck->n) {
        for (const cJSON *e = wm->child; e; e = e->next)
            TPS_FAIL_IF(tps_ckpt_find(ck, e->string) < 0, ctx, TPS_E_INDEX,
                        "%s: tensor '%s' is mapped to %s but that file does not hold it", ipath,
                        e->string, e->valuestring);
    }
    const cJSON *ts = cJSON_IsObject(meta) ? cJSON_GetObjectItemCaseSensitive(meta, "total_size") : NULL;
    if (cJSON_IsNumber(ts)) {
        uint64_t sum = 0;
        for (size_t i = 0; i < ck->n; i++) sum += ck->t[i].nbytes;
        if ((double)sum != ts->valuedouble)
            tps_log(ctx, TPS_LOG_WARN, "%s: metadata.total_size is %.0f but the tensors hold %llu bytes",
                    ipath, ts->valuedouble, (unsigned long long)sum);
    }
out:
    cJSON_Delete(idx);
    return rc;
}

/* ------------------------------------------------------------------ sharded dirs */

static int json_u64(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= 9007199254740992.0 ||
        v->valuedouble != (double)(uint64_t)v->valuedouble)
        return 0;
    *out = (uint64_t)v->valuedouble;
    return 1;
}

static int json_shape(const cJSON *a, uint64_t *shape, int *ndim)
{
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) > TPS_MAX_DIMS) return 0;
    int n = 0;
    for (const cJSON *d = a->child; d; d = d->next)
        if (!json_u64(d, &shape[n++])) return 0;
    *ndim = n;
    return 1;
}

static int cmp_info_name(const void *a, const void *b)
{
    return strcmp((*(const tps_st_tensor_info *const *)a)->name,
                  (*(const tps_st_tensor_info *const *)b)->name);
}

/* Rank files are searched once per (tensor, rank): by name, in log time. */
static tps_err index_by_name(tps_ctx *ctx, tps_cfile *f)
{
    f->byname = tps_xmalloc(f->st->n * sizeof *f->byname);
    if (!f->byname) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    for (size_t k = 0; k < f->st->n; k++) f->byname[k] = &f->st->t[k];
    if (f->st->n > 1) qsort(f->byname, f->st->n, sizeof *f->byname, cmp_info_name);
    return TPS_OK;
}

static const tps_st_tensor_info *find_in_file(const tps_cfile *f, const char *name)
{
    size_t lo = 0, hi = f->st->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->byname[mid]->name, name);
        if (c == 0) return f->byname[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* The manifest's untie record and the head it names: the head is derived
 * from an embedding of the same dtype and shape, and nothing else is. */
static tps_err read_untie(tps_ctx *ctx, tps_ckpt *ck, const char *mpath)
{
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(ck->manifest, "untie");
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(u, "head");
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(u, "embedding");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(u, "config");
    if (u && (!cJSON_IsObject(u) || !cJSON_IsString(h) || !cJSON_IsString(e) ||
              !cJSON_IsString(c)))
        return tps_fail(ctx, TPS_E_JSON,
                        "%s: untie must be {\"head\", \"embedding\", \"config\"} strings", mpath);
    for (size_t i = 0; i < ck->n; i++) {
        const tps_ctensor *t = &ck->t[i];
        if (!t->derived_from) continue;
        if (!u || strcmp(t->name, h->valuestring) || strcmp(t->derived_from, e->valuestring))
            return tps_fail(ctx, TPS_E_JSON,
                            "%s: tensor '%s' is derived from '%s' but the untie record does not "
                            "say so",
                            mpath, t->name, t->derived_from);
    }
    if (!u) return TPS_OK;
    int hi = tps_ckpt_find(ck, h->valuestring), ei = tps_ckpt_find(ck, e->valuestring);
    if (hi < 0 || ei < 0 || !ck->t[hi].derived_from)
        return tps_fail(ctx, TPS_E_JSON,
                        "%s: untie names head '%s' and embedding '%s', but the tensors do not "
                        "match (both listed, the head with derived_from)",
                        mpath, h->valuestring, e->valuestring);
    const tps_ctensor *ht = &ck->t[hi], *et = &ck->t[ei];
    int same = ht->dtype == et->dtype && ht->ndim == et->ndim;
    for (int d = 0; same && d < ht->ndim; d++) same = ht->shape[d] == et->shape[d];
    if (!same)
        return tps_fail(ctx, TPS_E_MISMATCH,
                        "%s: untied head '%s' differs in dtype or shape from '%s', the embedding "
                        "it was written from",
                        mpath, ht->name, et->name);
    ck->untie_head = tps_strdup(h->valuestring);
    ck->untie_embedding = tps_strdup(e->valuestring);
    ck->untie_config = tps_strdup(c->valuestring);
    if (!ck->untie_head || !ck->untie_embedding || !ck->untie_config)
        return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    return TPS_OK;
}

/* ------------------------------------------------------------------ streamed manifest arrays */

/* The manifest's two long arrays (tensors, one entry a tensor with one a
 * rank; rank_tensors) are read one element at a time: as a cJSON tree the
 * manifest of a 128-expert, 48-layer MoE at tp 8 (18,867 tensors, 25 MB)
 * took 250 MB. The rest of the manifest is parsed whole, with each of those
 * arrays' text replaced by []. Strings the tensors keep are copied into
 * ck's own string chunks, since each element's tree is freed. */

static const char *js_ws(const char *p, const char *e)
{
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

/* Past one JSON value (NULL when malformed; the full parse then says why). */
static const char *js_skip(const char *p, const char *e)
{
    int depth = 0;
    do {
        tps_text_behind(p);
        p = js_ws(p, e);
        if (p >= e) return NULL;
        if (*p == '"') {
            for (p++; p < e && *p != '"'; p++)
                if (*p == '\\') p++;
            if (p >= e) return NULL;
            p++;
        } else if (*p == '[' || *p == '{') {
            depth++;
            p++;
        } else if (*p == ']' || *p == '}') {
            if (--depth < 0) return NULL;
            p++;
        } else if (*p == ',' || *p == ':') {
            if (!depth) return NULL;
            p++;
        } else {
            const char *q = p;
            while (p < e && *p && !strchr(" \t\r\n,:]}[{\"", *p)) p++;
            if (p == q) return NULL; /* a NUL byte: no JSON token starts there */
        }
    } while (depth > 0);
    return p;
}

typedef struct {
    const char *b, *e; /* the array's text, [ to ] inclusive; b NULL: absent */
} js_span;

/* Spans of the top-level members named keys[k]; -1 when the text is not an
 * object of members (the full parse reports it). */
static int js_members(const char *t, size_t len, const char *const *keys, size_t nk, js_span *out)
{
    const char *p = js_ws(t, t + len), *e = t + len;
    for (size_t k = 0; k < nk; k++) out[k].b = out[k].e = NULL;
    if (p >= e || *p != '{') return -1;
    p = js_ws(p + 1, e);
    if (p < e && *p == '}') return 0;
    for (;;) {
        if (p >= e || *p != '"') return -1;
        const char *k0 = p + 1, *k1 = js_skip(p, e);
        if (!k1) return -1;
        size_t kl = (size_t)(k1 - 1 - k0);
        p = js_ws(k1, e);
        if (p >= e || *p != ':') return -1;
        const char *v = js_ws(p + 1, e), *ve = js_skip(v, e);
        if (!ve) return -1;
        for (size_t k = 0; k < nk; k++)
            if (strlen(keys[k]) == kl && !memcmp(keys[k], k0, kl) && v < e && *v == '[') {
                out[k].b = v;
                out[k].e = ve;
            }
        p = js_ws(ve, e);
        if (p < e && *p == ',') {
            p = js_ws(p + 1, e);
            continue;
        }
        return p < e && *p == '}' ? 0 : -1;
    }
}

/* The next element of an array span: *out NULL at its end. */
static tps_err js_next(tps_ctx *ctx, const char *mpath, const char *what, const char **pp,
                       const char *e, size_t i, cJSON **out)
{
    const char *p = js_ws(*pp, e);
    *out = NULL;
    if (p < e && *p == '[') p = js_ws(p + 1, e);
    else if (p < e && *p == ',') p = js_ws(p + 1, e);
    if (p < e && *p == ']') {
        *pp = p;
        return TPS_OK;
    }
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(p, (size_t)(e - p), &end, 0);
    if (!j)
        return tps_fail(ctx, TPS_E_JSON, "%s: %s[%zu] is not valid JSON", mpath, what, i);
    *pp = end;
    *out = j;
    tps_text_behind(end);
    return TPS_OK;
}

/* The elements of one of those arrays: one at a time from its text (span
 * set), or from the tree (a manifest parsed whole). Each element lives until
 * the next call; js_iter_start again runs through them once more. */
typedef struct {
    const char *b, *p, *e; /* the array's text, or b NULL */
    const cJSON *next;     /* the tree's next element */
    cJSON *el;             /* the element parsed from the text */
    const char *what;
    size_t i;
} js_iter;

static void js_iter_start(js_iter *it, const js_span *sp, const cJSON *arr, const char *what)
{
    cJSON_Delete(it->el);
    *it = (js_iter){.b = sp->b, .p = sp->b, .e = sp->e, .next = arr->child, .what = what};
}

static tps_err js_iter_next(tps_ctx *ctx, const char *mpath, js_iter *it, const cJSON **out)
{
    cJSON_Delete(it->el);
    it->el = NULL;
    if (!it->b) {
        *out = it->next;
        if (it->next) it->next = it->next->next;
        return TPS_OK;
    }
    TPS_TRY(js_next(ctx, mpath, it->what, &it->p, it->e, it->i, &it->el));
    it->i++;
    *out = it->el;
    return TPS_OK;
}

/* A copy of s that lives as long as ck. */
static const char *ck_keep(tps_ckpt *ck, const char *s)
{
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    if (n > ck->str_left) {
        size_t cap = n > 65536 ? n : 65536;
        char **nc = realloc(ck->str_chunks, (ck->nstr_chunks + 1) * sizeof *nc);
        if (!nc) return NULL;
        ck->str_chunks = nc;
        if (!(nc[ck->nstr_chunks] = malloc(cap))) return NULL;
        ck->str_next = nc[ck->nstr_chunks++];
        ck->str_left = cap;
    }
    char *d = ck->str_next;
    memcpy(d, s, n);
    ck->str_next += n;
    ck->str_left -= n;
    return d;
}

static tps_err open_sharded_text(tps_ctx *ctx, tps_ckpt *ck, const char *mpath, const tps_text *tx)
{
    size_t *rank_files = NULL, *rank_start = NULL;
    unsigned char **seen = NULL;
    tps_err rc = TPS_OK;
    char *text = NULL, *rest = NULL;
    size_t tlen = 0;
    static const char *const big[] = {"tensors", "rank_tensors"};
    js_span sp[2];
    js_iter it = {0};
    text = tx->p;
    tlen = tx->len;
    if (tps_utf8_valid(text, tlen) && js_members(text, tlen, big, 2, sp) == 0 && sp[0].b) {
        /* the rest, with both arrays' text as [] (rank_tensors after tensors or before) */
        rest = malloc(tlen + 8);
        TPS_FAIL_IF(!rest, ctx, TPS_E_NOMEM, "out of memory");
        const js_span *a = &sp[0], *b = sp[1].b ? &sp[1] : NULL;
        if (b && b->b < a->b) {
            const js_span *x = a;
            a = b;
            b = x;
        }
        size_t o = 0;
        memcpy(rest + o, text, (size_t)(a->b - text));
        o += (size_t)(a->b - text);
        memcpy(rest + o, "[]", 2);
        o += 2;
        const char *from = a->e, *to = b ? b->b : text + tlen;
        memcpy(rest + o, from, (size_t)(to - from));
        o += (size_t)(to - from);
        if (b) {
            memcpy(rest + o, "[]", 2);
            o += 2;
            memcpy(rest + o, b->e, (size_t)(text + tlen - b->e));
            o += (size_t)(text + tlen - b->e);
        }
        rest[o] = 0;
        TPS_CHECK(tps_json_parse(ctx, mpath, rest, o, &ck->manifest));
        free(rest);
        rest = NULL;
        /* the arrays' own syntax: each element is parsed with cJSON below */
        const char *why = NULL;
        for (int k = 0; k < 2 && !why; k++)
            if (sp[k].b) why = tps_json_prescan_span(sp[k].b, (size_t)(sp[k].e - sp[k].b));
        TPS_FAIL_IF(why, ctx, TPS_E_JSON, "%s: not valid JSON: %s", mpath, why);
    } else {
        /* not the shape a manifest has: the full parse says what is wrong */
        TPS_CHECK(tps_json_parse(ctx, mpath, text, tlen, &ck->manifest));
        sp[0].b = sp[1].b = NULL;
    }
    const cJSON *m = ck->manifest;
    TPS_FAIL_IF(!cJSON_IsObject(m), ctx, TPS_E_JSON, "%s: not a JSON object", mpath);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(m, "format");
    TPS_FAIL_IF(!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "tpshard"), ctx, TPS_E_JSON,
                "%s: not a tpshard manifest (format is not \"tpshard\")", mpath);
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(m, "version");
    TPS_FAIL_IF(!cJSON_IsNumber(ver) || (ver->valueint != TPS_MANIFEST_FORMAT &&
                                         ver->valueint != TPS_MANIFEST_FORMAT_LAYOUT),
                ctx, TPS_E_JSON, "%s: manifest version is not %d or %d", mpath,
                TPS_MANIFEST_FORMAT, TPS_MANIFEST_FORMAT_LAYOUT);
    int v2 = ver->valueint == TPS_MANIFEST_FORMAT_LAYOUT;
    ck->layout_name = "dtensor";
    if (v2) {
        const cJSON *lay = cJSON_GetObjectItemCaseSensitive(m, "layout");
        const cJSON *ln = cJSON_GetObjectItemCaseSensitive(lay, "name");
        const cJSON *lt = cJSON_GetObjectItemCaseSensitive(lay, "target");
        const cJSON *lx = cJSON_GetObjectItemCaseSensitive(lay, "text");
        TPS_FAIL_IF(!cJSON_IsString(ln) || !cJSON_IsString(lt), ctx, TPS_E_JSON,
                    "%s: a version %d manifest needs layout.name and layout.target", mpath,
                    TPS_MANIFEST_FORMAT_LAYOUT);
        ck->layout_name = ln->valuestring;
        ck->layout_target = lt->valuestring;
        ck->layout_text = cJSON_IsString(lx) ? lx->valuestring : NULL;
        ck->layout_ep = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(lay, "ep"));
    }
    /* source tensors the layout left out: merge names them, verify does not miss them */
    const cJSON *dropped = cJSON_GetObjectItemCaseSensitive(m, "dropped");
    for (const cJSON *d = cJSON_IsArray(dropped) ? dropped->child : NULL; d; d = d->next)
        TPS_FAIL_IF(!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(d, "name")) ||
                        !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(d, "reason")),
                    ctx, TPS_E_JSON, "%s: a dropped[] entry needs a name and a reason", mpath);
    TPS_FAIL_IF(dropped && !cJSON_IsArray(dropped), ctx, TPS_E_JSON, "%s: dropped is not an array",
                mpath);
    ck->dropped = dropped;
    const cJSON *tp = cJSON_GetObjectItemCaseSensitive(m, "tp");
    TPS_FAIL_IF(!cJSON_IsNumber(tp) || tp->valuedouble < 1 || tp->valuedouble > 4096, ctx,
                TPS_E_JSON, "%s: tp is missing or out of range", mpath);
    ck->tp = tp->valueint;
    ck->rank_present = tps_xcalloc((size_t)ck->tp, 1);
    ck->rank_written = tps_xcalloc((size_t)ck->tp, 1);
    TPS_FAIL_IF(!ck->rank_present || !ck->rank_written, ctx, TPS_E_NOMEM, "out of memory");
    const cJSON *plan = cJSON_GetObjectItemCaseSensitive(m, "plan");
    const cJSON *pname = cJSON_GetObjectItemCaseSensitive(plan, "name");
    if (cJSON_IsString(pname)) ck->plan_name = tps_strdup(pname->valuestring);
    const cJSON *ptext = cJSON_GetObjectItemCaseSensitive(plan, "text");
    if (cJSON_IsString(ptext)) ck->plan_text = ptext->valuestring;
    const cJSON *written = cJSON_GetObjectItemCaseSensitive(m, "ranks_written");
    TPS_FAIL_IF(!cJSON_IsArray(written), ctx, TPS_E_JSON, "%s: ranks_written is not an array", mpath);
    for (const cJSON *r = written->child; r; r = r->next) {
        TPS_FAIL_IF(!cJSON_IsNumber(r) || r->valueint < 0 || r->valueint >= ck->tp, ctx, TPS_E_JSON,
                    "%s: ranks_written holds a rank outside 0..%d", mpath, ck->tp - 1);
        ck->rank_written[r->valueint] = 1;
    }
    /* Source description for merge. */
    const cJSON *src = cJSON_GetObjectItemCaseSensitive(m, "source");
    const cJSON *sfiles = cJSON_GetObjectItemCaseSensitive(src, "files");
    TPS_FAIL_IF(!cJSON_IsArray(sfiles), ctx, TPS_E_JSON, "%s: source.files is not an array", mpath);
    ck->norigins = (size_t)cJSON_GetArraySize(sfiles);
    ck->origins = tps_xcalloc(ck->norigins, sizeof(char *));
    ck->origin_meta = cJSON_CreateObject();
    ck->origin_header = cJSON_CreateObject();
    TPS_FAIL_IF(!ck->origins || !ck->origin_meta || !ck->origin_header, ctx, TPS_E_NOMEM,
                "out of memory");
    size_t oi = 0;
    for (const cJSON *f = sfiles->child; f; f = f->next, oi++) {
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name");
        TPS_FAIL_IF(!cJSON_IsString(nm) || !plain_name(nm->valuestring), ctx, TPS_E_JSON,
                    "%s: source.files[%zu].name is not a plain file name", mpath, oi);
        ck->origins[oi] = tps_strdup(nm->valuestring);
        const cJSON *md = cJSON_GetObjectItemCaseSensitive(f, "metadata");
        if (cJSON_IsObject(md))
            cJSON_AddItemToObject(ck->origin_meta, nm->valuestring, cJSON_Duplicate(md, 1));
        const cJSON *hd = cJSON_GetObjectItemCaseSensitive(f, "header");
        if (cJSON_IsString(hd))
            cJSON_AddStringToObject(ck->origin_header, nm->valuestring, hd->valuestring);
    }
    const cJSON *iname = cJSON_GetObjectItemCaseSensitive(src, "index");
    if (cJSON_IsString(iname)) {
        TPS_FAIL_IF(!plain_name(iname->valuestring), ctx, TPS_E_JSON,
                    "%s: source.index is not a plain file name", mpath);
        ck->index_name = tps_strdup(iname->valuestring);
    }
    const cJSON *imeta = cJSON_GetObjectItemCaseSensitive(src, "index_metadata");
    if (cJSON_IsObject(imeta)) ck->index_meta = cJSON_Duplicate(imeta, 1);

    /* Rank files: open those that exist. */
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(m, "files");
    TPS_FAIL_IF(!cJSON_IsArray(files), ctx, TPS_E_JSON, "%s: files is not an array", mpath);
    for (const cJSON *f = files->child; f; f = f->next) {
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name");
        const cJSON *rk = cJSON_GetObjectItemCaseSensitive(f, "rank");
        TPS_FAIL_IF(!cJSON_IsString(nm) || !plain_name(nm->valuestring) || !cJSON_IsNumber(rk) ||
                        rk->valueint < 0 || rk->valueint >= ck->tp,
                    ctx, TPS_E_JSON, "%s: files[] entry needs a plain name and a rank < tp", mpath);
        char *p = tps_path_join(ck->dir, nm->valuestring);
        int there = p && tps_exists(p);
        free(p);
        if (!there) {
            TPS_FAIL_IF(ck->rank_written[rk->valueint], ctx, TPS_E_MISMATCH,
                        "%s: rank %d's file %s is missing", ck->dir, rk->valueint, nm->valuestring);
            continue;
        }
        /* A rank the manifest does not record as written: its file is a
         * --ranks run's that is still writing, or was killed before it
         * recorded its ranks. Not the manifest's: the rank is missing. */
        if (!ck->rank_written[rk->valueint]) continue;
        /* Its header first: the placements and shapes read below come from it. */
        int recorded;
        char *rp = tps_path_join(ck->dir, nm->valuestring);
        TPS_FAIL_IF(!rp, ctx, TPS_E_NOMEM, "out of memory");
        rc = tps_prov_rank_header(ctx, mpath, rp, f, &recorded);
        free(rp);
        if (rc) goto out;
        ck->headers_unrecorded += !recorded;
        size_t fi;
        TPS_CHECK(add_file(ctx, ck, nm->valuestring, &fi));
        ck->files[fi].rank = rk->valueint;
        ck->rank_present[rk->valueint] = 1;
        TPS_CHECK(index_by_name(ctx, &ck->files[fi]));
        /* A rank file's header text and metadata are not needed once
         * parsed (a source file's are: merge gives them back); 4 MB and
         * 2 MB a rank for 18,867 tensors. */
        free(ck->files[fi].st->raw);
        ck->files[fi].st->raw = NULL;
        tps_st_drop_meta(ck->files[fi].st);
    }
    if (ck->headers_unrecorded)
        tps_log(ctx, TPS_LOG_WARN,
                "%s: the manifest records no CRC32 of the rank files' headers (a tpshard older "
                "than header coverage wrote it): the headers of %d file%s (__metadata__, tensor "
                "table) are not checked; split again to cover every byte",
                mpath, ck->headers_unrecorded, ck->headers_unrecorded == 1 ? "" : "s");
    /* The files of each rank, so a lookup scans only that rank's parts:
     * rank r's are rank_files[rank_start[r] .. rank_start[r + 1]). */
    rank_start = tps_xcalloc((size_t)ck->tp + 1, sizeof *rank_start);
    rank_files = tps_xcalloc(ck->nfiles, sizeof *rank_files);
    TPS_FAIL_IF(!rank_start || !rank_files, ctx, TPS_E_NOMEM, "out of memory");
    for (size_t fi = 0; fi < ck->nfiles; fi++) rank_start[ck->files[fi].rank + 1]++;
    for (int r = 0; r < ck->tp; r++) rank_start[r + 1] += rank_start[r];
    {
        size_t *fill = tps_xcalloc((size_t)ck->tp, sizeof *fill);
        TPS_FAIL_IF(!fill, ctx, TPS_E_NOMEM, "out of memory");
        for (size_t fi = 0; fi < ck->nfiles; fi++) {
            int r = ck->files[fi].rank;
            rank_files[rank_start[r] + fill[r]++] = fi;
        }
        free(fill);
    }
    seen = tps_xcalloc(ck->nfiles ? ck->nfiles : 1, sizeof *seen);
    TPS_FAIL_IF(!seen, ctx, TPS_E_NOMEM, "out of memory");
    for (size_t fi = 0; fi < ck->nfiles; fi++) {
        seen[fi] = tps_xcalloc(ck->files[fi].st->n ? ck->files[fi].st->n : 1, 1);
        TPS_FAIL_IF(!seen[fi], ctx, TPS_E_NOMEM, "out of memory");
    }
    /* Tensors. */
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(m, "tensors");
    TPS_FAIL_IF(!cJSON_IsArray(ts), ctx, TPS_E_JSON, "%s: tensors is not an array", mpath);
    size_t nt = 0, nent = 0;
    /* A first pass counts them. */
    js_iter_start(&it, &sp[0], ts, "tensors");
    for (const cJSON *e;;) {
        TPS_CHECK(js_iter_next(ctx, mpath, &it, &e));
        if (!e) break;
        const cJSON *rs = cJSON_GetObjectItemCaseSensitive(e, "ranks");
        nent += cJSON_IsArray(rs) ? (size_t)cJSON_GetArraySize(rs) : 0;
        nt++;
    }
    js_iter_start(&it, &sp[0], ts, "tensors");
    TPS_FAIL_IF(nent > TPS_MAX_MANIFEST_ENTRIES, ctx, TPS_E_JSON,
                "%s: %zu tensor-rank entries, more than the %d a manifest may hold", mpath, nent,
                TPS_MAX_MANIFEST_ENTRIES);
    TPS_CHECK(grow_tensors(ctx, ck, nt));
    tps_piece *pool = new_pool(ctx, ck, nent ? nent : 1);
    TPS_FAIL_IF(!pool, ctx, TPS_E_NOMEM, "out of memory");
    size_t used = 0;
    for (const cJSON *e;;) {
        TPS_CHECK(js_iter_next(ctx, mpath, &it, &e));
        if (!e) break;
        tps_ctensor *t = &ck->t[ck->n++];
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        const cJSON *pl = cJSON_GetObjectItemCaseSensitive(e, "placement");
        const cJSON *dm = cJSON_GetObjectItemCaseSensitive(e, "dim");
        const cJSON *sf = cJSON_GetObjectItemCaseSensitive(e, "source_file");
        const cJSON *rs = cJSON_GetObjectItemCaseSensitive(e, "ranks");
        TPS_FAIL_IF(!cJSON_IsString(nm), ctx, TPS_E_JSON, "%s: a tensor entry has no name", mpath);
        t->name = ck_keep(ck, nm->valuestring);
        TPS_FAIL_IF(!t->name, ctx, TPS_E_NOMEM, "out of memory");
        const cJSON *df = cJSON_GetObjectItemCaseSensitive(e, "derived_from");
        TPS_FAIL_IF(df && !cJSON_IsString(df), ctx, TPS_E_JSON,
                    "%s: tensor '%s': derived_from is not a tensor name", mpath, t->name);
        t->derived_from = df ? ck_keep(ck, df->valuestring) : NULL;
        const cJSON *sty = cJSON_GetObjectItemCaseSensitive(e, "style");
        t->style = cJSON_IsString(sty) ? ck_keep(ck, sty->valuestring) : NULL;
        TPS_FAIL_IF((df && !t->derived_from) || (cJSON_IsString(sty) && !t->style), ctx,
                    TPS_E_NOMEM, "out of memory");
        TPS_FAIL_IF(!cJSON_IsString(dt) || tps_dtype_from_name(dt->valuestring, &t->dtype), ctx,
                    TPS_E_JSON, "%s: tensor '%s': bad dtype", mpath, t->name);
        TPS_FAIL_IF(!json_shape(cJSON_GetObjectItemCaseSensitive(e, "shape"), t->shape, &t->ndim),
                    ctx, TPS_E_JSON, "%s: tensor '%s': bad shape", mpath, t->name);
        TPS_FAIL_IF(!cJSON_IsNumber(dm) || dm->valueint < -1 || dm->valueint >= t->ndim, ctx,
                    TPS_E_JSON, "%s: tensor '%s': bad dim", mpath, t->name);
        t->dim = dm->valueint;
        t->placement = tps_strdup(cJSON_IsString(pl) ? pl->valuestring : "?");
        t->origin = NULL;
        for (size_t k = 0; k < ck->norigins && !t->origin; k++)
            if (cJSON_IsString(sf) && !strcmp(ck->origins[k], sf->valuestring)) t->origin = ck->origins[k];
        TPS_FAIL_IF(!t->origin, ctx, TPS_E_JSON,
                    "%s: tensor '%s' names a source_file that source.files does not list", mpath, t->name);
        int ovf, mis;
        t->nbytes = tps_nbytes(t->dtype, t->shape, t->ndim, &ovf, &mis);
        TPS_FAIL_IF(ovf || mis, ctx, TPS_E_JSON, "%s: tensor '%s': bad size", mpath, t->name);
        TPS_FAIL_IF(!cJSON_IsArray(rs) || (!v2 && cJSON_GetArraySize(rs) != ck->tp), ctx, TPS_E_JSON,
                    "%s: tensor '%s': ranks must list all %d ranks", mpath, t->name, ck->tp);
        TPS_FAIL_IF(!t->placement, ctx, TPS_E_NOMEM, "out of memory");
        size_t nr = (size_t)cJSON_GetArraySize(rs);
        t->nlisted = (int)nr;
        t->pieces = pool + used;
        used += nr;
        /* primaries first, replicas at the end of this tensor's share */
        tps_piece *reps = t->pieces + nr;
        uint64_t expect_lo = 0;
        for (const cJSON *r = rs->child; r; r = r->next) {
            const cJSON *rr = cJSON_GetObjectItemCaseSensitive(r, "rank");
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(r, "file");
            const cJSON *off = cJSON_GetObjectItemCaseSensitive(r, "offset");
            const cJSON *crc = cJSON_GetObjectItemCaseSensitive(r, "crc32");
            const cJSON *hold = cJSON_GetObjectItemCaseSensitive(r, "tensor");
            const cJSON *atj = cJSON_GetObjectItemCaseSensitive(r, "at");
            const cJSON *sdt = cJSON_GetObjectItemCaseSensitive(r, "dtype");
            tps_dtype stored = t->dtype;
            int replica = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "replica"));
            uint64_t lshape[TPS_MAX_DIMS], at = 0;
            int lnd = 0;
            uint64_t lo = 0;
            TPS_FAIL_IF(!cJSON_IsNumber(rr) || rr->valueint < 0 || rr->valueint >= ck->tp ||
                            !cJSON_IsString(fn) ||
                            !json_shape(cJSON_GetObjectItemCaseSensitive(r, "shape"), lshape, &lnd) ||
                            lnd != t->ndim || !json_u64(off, &lo) ||
                            (hold && (!v2 || !cJSON_IsString(hold))) ||
                            (atj && (!v2 || !json_u64(atj, &at))) || (replica && (!v2 || t->dim < 0)) ||
                            (sdt && (!v2 || !cJSON_IsString(sdt) ||
                                     tps_dtype_from_name(sdt->valuestring, &stored))),
                        ctx, TPS_E_JSON, "%s: tensor '%s': malformed ranks[] entry", mpath, t->name);
            int rank = rr->valueint;
            const char *holder = hold ? ck_keep(ck, hold->valuestring) : t->name;
            TPS_FAIL_IF(!holder, ctx, TPS_E_NOMEM, "out of memory");
            TPS_FAIL_IF(stored != t->dtype && (stored != TPS_F32 || !tps_cast_ok(t->dtype)), ctx,
                        TPS_E_MISMATCH,
                        "%s: tensor '%s': rank %d's piece is stored as %s, but a %s tensor can "
                        "only be stored as itself or widened to F32 (a scale the layout widened)",
                        mpath, t->name, rank, tps_dtype_name(stored), tps_dtype_name(t->dtype));
            /* Local shape must be the global one but along dim. */
            for (int d = 0; d < t->ndim; d++)
                TPS_FAIL_IF(d != t->dim && lshape[d] != t->shape[d], ctx, TPS_E_MISMATCH,
                            "%s: tensor '%s': rank %d's shape disagrees with the global shape",
                            mpath, t->name, rank);
            TPS_FAIL_IF(t->dim >= 0 && (lo > t->shape[t->dim] || lshape[t->dim] > t->shape[t->dim] - lo),
                        ctx, TPS_E_MISMATCH, "%s: tensor '%s': rank %d's rows run past the tensor",
                        mpath, t->name, rank);
            if (t->dim >= 0 && !v2) {
                TPS_FAIL_IF(lo != expect_lo, ctx, TPS_E_MISMATCH,
                            "%s: tensor '%s': rank %d starts at %llu along dim %d, expected %llu "
                            "(shards must cover the dim exactly once, in rank order)",
                            mpath, t->name, rank, (unsigned long long)lo, t->dim,
                            (unsigned long long)expect_lo);
                expect_lo += lshape[t->dim];
            }
            if (!ck->rank_present[rank]) continue;
            /* Find the rank file holding it. */
            size_t fi = ck->nfiles;
            for (size_t j = rank_start[rank]; j < rank_start[rank + 1]; j++)
                if (strcmp(ck->files[rank_files[j]].name, fn->valuestring) == 0) fi = rank_files[j];
            TPS_FAIL_IF(fi == ck->nfiles, ctx, TPS_E_MISMATCH,
                        "%s: tensor '%s': rank %d's file %s is not among the rank files", mpath,
                        t->name, rank, fn->valuestring);
            const tps_st *st = ck->files[fi].st;
            const tps_st_tensor_info *si = find_in_file(&ck->files[fi], holder);
            TPS_FAIL_IF(!si, ctx, TPS_E_MISMATCH, "%s: tensor '%s' is missing from this file",
                        ck->files[fi].path, holder);
            seen[fi][si - st->t] = 1;
            TPS_FAIL_IF(si->dtype != stored, ctx, TPS_E_MISMATCH,
                        "%s: tensor '%s' is %s but the manifest says %s", ck->files[fi].path,
                        holder, tps_dtype_name(si->dtype), tps_dtype_name(stored));
            uint64_t lbytes = tps_nbytes(t->dtype, lshape, lnd, &ovf, &mis);
            uint64_t pbytes = tps_nbytes(stored, lshape, lnd, &ovf, &mis);
            if (!hold && !at) {
                int same = si->ndim == lnd;
                for (int d = 0; same && d < lnd; d++) same = si->shape[d] == lshape[d];
                TPS_FAIL_IF(!same && !v2, ctx, TPS_E_MISMATCH,
                            "%s: tensor '%s' has a shape other than the manifest's for rank %d",
                            ck->files[fi].path, t->name, rank);
            }
            TPS_FAIL_IF(ovf || mis || at > si->end - si->begin || pbytes > si->end - si->begin - at,
                        ctx, TPS_E_MISMATCH,
                        "%s: tensor '%s': rank %d's piece of %llu bytes at %llu does not fit in "
                        "'%s' (%llu bytes)",
                        ck->files[fi].path, t->name, rank, (unsigned long long)pbytes,
                        (unsigned long long)at, holder, (unsigned long long)(si->end - si->begin));
            tps_piece *pc = replica ? --reps : &t->pieces[t->npieces++];
            if (replica) t->nreplicas++;
            pc->file = (int)fi;
            pc->rank = rank;
            pc->off = st->data_start + si->begin + at;
            pc->nbytes = lbytes;
            pc->fbytes = pbytes;
            pc->stored = stored;
            pc->lo = lo;
            pc->hi = lo + (t->dim >= 0 ? lshape[t->dim] : 0);
            pc->holder = holder;
            pc->at = at;
            uint64_t c;
            if (json_u64(crc, &c) && c <= 0xFFFFFFFFu) {
                pc->crc = (uint32_t)c;
                pc->has_crc = 1;
            }
        }
        t->replicas = reps;
        if (t->dim >= 0 && v2) {
            /* Primaries tile the dim exactly once (in any rank order). */
            for (int a = 1; a < t->npieces; a++)
                for (int b = a; b > 0 && t->pieces[b - 1].lo > t->pieces[b].lo; b--) {
                    tps_piece tmp = t->pieces[b];
                    t->pieces[b] = t->pieces[b - 1];
                    t->pieces[b - 1] = tmp;
                }
            int complete = 1;
            for (const cJSON *r = rs->child; r; r = r->next) {
                const cJSON *rr = cJSON_GetObjectItemCaseSensitive(r, "rank");
                if (!ck->rank_present[rr->valueint]) complete = 0;
            }
            for (int a = 0; complete && a < t->npieces; a++) {
                TPS_FAIL_IF(t->pieces[a].lo != expect_lo, ctx, TPS_E_MISMATCH,
                            "%s: tensor '%s': its pieces along dim %d leave a gap or overlap at %llu "
                            "(each row must be held once, replicas aside)",
                            mpath, t->name, t->dim, (unsigned long long)expect_lo);
                expect_lo = t->pieces[a].hi;
            }
            if (!complete) expect_lo = t->shape[t->dim];
        }
        if (t->dim >= 0)
            TPS_FAIL_IF(expect_lo != t->shape[t->dim], ctx, TPS_E_MISMATCH,
                        "%s: tensor '%s': shards cover %llu of %llu along dim %d", mpath, t->name,
                        (unsigned long long)expect_lo, (unsigned long long)t->shape[t->dim], t->dim);
    }
    /* A serving layout's other rank tensors: fused, padded, constant. */
    const cJSON *rts = cJSON_GetObjectItemCaseSensitive(m, "rank_tensors");
    if (v2 && cJSON_IsArray(rts)) {
        size_t nrt = 0;
        js_iter_start(&it, &sp[1], rts, "rank_tensors");
        for (const cJSON *e;;) {
            TPS_CHECK(js_iter_next(ctx, mpath, &it, &e));
            if (!e) break;
            nrt++;
        }
        js_iter_start(&it, &sp[1], rts, "rank_tensors");
        TPS_FAIL_IF(nrt > TPS_MAX_MANIFEST_ENTRIES, ctx, TPS_E_JSON, "%s: too many rank_tensors", mpath);
        ck->rts = tps_xcalloc(nrt ? nrt : 1, sizeof *ck->rts);
        TPS_FAIL_IF(!ck->rts, ctx, TPS_E_NOMEM, "out of memory");
        for (const cJSON *e;;) {
            TPS_CHECK(js_iter_next(ctx, mpath, &it, &e));
            if (!e) break;
            tps_crtensor *rt = &ck->rts[ck->nrts++];
            const cJSON *rk = cJSON_GetObjectItemCaseSensitive(e, "rank");
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(e, "file");
            const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
            const cJSON *ps = cJSON_GetObjectItemCaseSensitive(e, "pieces");
            uint64_t shape[TPS_MAX_DIMS];
            int nd = 0, ovf = 0, mis = 0;
            rt->file = -1;
            TPS_FAIL_IF(!cJSON_IsNumber(rk) || rk->valueint < 0 || rk->valueint >= ck->tp ||
                            !cJSON_IsString(nm) || !cJSON_IsString(fn) || !cJSON_IsString(dt) ||
                            tps_dtype_from_name(dt->valuestring, &rt->dtype) ||
                            !json_shape(cJSON_GetObjectItemCaseSensitive(e, "shape"), shape, &nd) ||
                            !cJSON_IsArray(ps),
                        ctx, TPS_E_JSON, "%s: malformed rank_tensors entry", mpath);
            rt->name = ck_keep(ck, nm->valuestring);
            TPS_FAIL_IF(!rt->name, ctx, TPS_E_NOMEM, "out of memory");
            rt->rank = rk->valueint;
            rt->nbytes = tps_nbytes(rt->dtype, shape, nd, &ovf, &mis);
            TPS_FAIL_IF(ovf || mis, ctx, TPS_E_JSON, "%s: rank tensor '%s': bad size", mpath, rt->name);
            rt->nfills = (size_t)cJSON_GetArraySize(ps);
            rt->fills = tps_xcalloc(rt->nfills ? rt->nfills : 1, sizeof *rt->fills);
            TPS_FAIL_IF(!rt->fills, ctx, TPS_E_NOMEM, "out of memory");
            size_t k = 0;
            for (const cJSON *p = ps->child; p; p = p->next, k++) {
                tps_fill *fl = &rt->fills[k];
                const cJSON *sj = cJSON_GetObjectItemCaseSensitive(p, "source");
                const cJSON *val = cJSON_GetObjectItemCaseSensitive(p, "value");
                TPS_FAIL_IF(!json_u64(cJSON_GetObjectItemCaseSensitive(p, "at"), &fl->at) ||
                                !json_u64(cJSON_GetObjectItemCaseSensitive(p, "nbytes"), &fl->nbytes),
                            ctx, TPS_E_JSON, "%s: rank tensor '%s': malformed piece", mpath, rt->name);
                if (cJSON_IsString(sj)) {
                    fl->kind = TPS_FILL_SOURCE;
                    fl->source = ck_keep(ck, sj->valuestring);
                    TPS_FAIL_IF(!fl->source, ctx, TPS_E_NOMEM, "out of memory");
                } else if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "zeros"))) {
                    fl->kind = TPS_FILL_ZEROS;
                } else {
                    TPS_FAIL_IF(!cJSON_IsNumber(val), ctx, TPS_E_JSON,
                                "%s: rank tensor '%s': a piece is neither source, zeros nor value",
                                mpath, rt->name);
                    fl->kind = TPS_FILL_VALUE;
                    fl->value = val->valuedouble;
                }
            }
            if (!ck->rank_present[rt->rank]) continue;
            size_t fi = ck->nfiles;
            for (size_t j = rank_start[rt->rank]; j < rank_start[rt->rank + 1]; j++)
                if (strcmp(ck->files[rank_files[j]].name, fn->valuestring) == 0) fi = rank_files[j];
            TPS_FAIL_IF(fi == ck->nfiles, ctx, TPS_E_MISMATCH,
                        "%s: rank tensor '%s': rank %d's file %s is not among the rank files", mpath,
                        rt->name, rt->rank, fn->valuestring);
            const tps_st_tensor_info *si = find_in_file(&ck->files[fi], rt->name);
            TPS_FAIL_IF(!si, ctx, TPS_E_MISMATCH, "%s: tensor '%s' is missing from this file",
                        ck->files[fi].path, rt->name);
            seen[fi][si - ck->files[fi].st->t] = 1;
            int same = si->dtype == rt->dtype && si->ndim == nd;
            for (int d = 0; same && d < nd; d++) same = si->shape[d] == shape[d];
            TPS_FAIL_IF(!same, ctx, TPS_E_MISMATCH,
                        "%s: tensor '%s' has a dtype or shape other than the manifest's",
                        ck->files[fi].path, rt->name);
            rt->file = (int)fi;
            rt->off = ck->files[fi].st->data_start + si->begin;
        }
    }
    TPS_CHECK(sort_and_dedup(ctx, ck));
    TPS_CHECK(read_untie(ctx, ck, mpath));
    /* A rank file must hold nothing the manifest does not know: every one of
     * its tensors holds a piece of a source tensor or is one of its rank's
     * rank_tensors (marked in `seen` as they were found). */
    for (size_t fi = 0; fi < ck->nfiles; fi++) {
        const tps_st *st = ck->files[fi].st;
        for (size_t k = 0; k < st->n; k++)
            TPS_FAIL_IF(!seen[fi][k], ctx, TPS_E_MISMATCH, "%s: tensor '%s' is not in the manifest",
                        ck->files[fi].path, st->t[k].name);
    }
out:
    cJSON_Delete(it.el);
    free(rest);
    for (size_t fi = 0; seen && fi < ck->nfiles; fi++) free(seen[fi]);
    free(seen);
    free(rank_files);
    free(rank_start);
    return rc;
}

/* The manifest mapped when big, its pages let go behind each pass over it
 * (25 MB of text for 151k rank tensors), read inside a SIGBUS guard: a
 * manifest cut short by another process while being read fails the open
 * instead of killing the process (what open_sharded_text had allocated then
 * is lost: a leak on that error only). */
static tps_err open_sharded(tps_ctx *ctx, tps_ckpt *ck, const char *mpath)
{
    /* on the heap: the scans change it after the sigsetjmp below */
    tps_text *tx = tps_xcalloc(1, sizeof *tx);
    if (!tx) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    tps_err rc = tps_text_open(ctx, mpath, MAX_JSON_FILE, tx);
    if (rc) {
        free(tx);
        return rc;
    }
    int guarded = tx->mapped && tps_guard_hold();
    tps_guard gd = {.lo = tx->p, .hi = tx->p + tx->len};
    if (guarded) {
        if (sigsetjmp(gd.jb, 1)) {
            tps_guard_leave();
            tps_guard_release();
            tps_text_close(tx);
            free(tx);
            return tps_fail(ctx, TPS_E_IO, "%s: changed while being read (cut short under its mapping)",
                            mpath);
        }
        tps_guard_enter(&gd);
    }
    rc = open_sharded_text(ctx, ck, mpath, tx);
    if (guarded) {
        tps_guard_leave();
        tps_guard_release();
    }
    tps_text_close(tx);
    free(tx);
    return rc;
}

/* ------------------------------------------------------------------ open */

static tps_err ckpt_open(tps_ctx *ctx, const char *path, const char *repo, tps_ckpt **out);

tps_err tps_ckpt_open(tps_ctx *ctx, const char *model, tps_ckpt **out)
{
    *out = NULL;
    char *path = NULL, *repo = NULL;
    tps_err rc = tps_model_locate(ctx, model, &path, &repo);
    if (!rc) rc = ckpt_open(ctx, path, repo, out);
    free(path);
    free(repo);
    return rc;
}

tps_err tps_ckpt_open_path(tps_ctx *ctx, const char *path, tps_ckpt **out)
{
    return ckpt_open(ctx, path, NULL, out);
}

static tps_err ckpt_open(tps_ctx *ctx, const char *path, const char *repo, tps_ckpt **out)
{
    *out = NULL;
    tps_err rc = TPS_OK;
    tps_ckpt *ck = tps_xcalloc(1, sizeof *ck);
    char *tmp = NULL, *p = NULL;
    if (!ck) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    struct stat sb;
    TPS_FAIL_IF(stat(path, &sb) != 0, ctx, TPS_E_IO, "%s: %s", path, strerror(errno));
    ck->path = tps_strdup(path);
    if (S_ISDIR(sb.st_mode)) {
        ck->dir = tps_strdup(path);
        tmp = tps_strdup(path);
        size_t l = strlen(tmp);
        while (l > 1 && tmp[l - 1] == '/') tmp[--l] = 0;
        ck->stem = tps_strdup(basename(tmp));
        if ((p = tps_path_join(path, TPS_MANIFEST)) && tps_exists(p)) {
            ck->kind = TPS_SRC_SHARDED;
            TPS_CHECK(open_sharded(ctx, ck, p));
        } else if ((free(p), p = tps_path_join(path, "model.safetensors.index.json")) && tps_exists(p)) {
            ck->kind = TPS_SRC_INDEX;
            ck->index_name = tps_strdup("model.safetensors.index.json");
            TPS_CHECK(open_index(ctx, ck, p));
        } else if ((free(p), p = tps_path_join(path, "model.safetensors")) && tps_exists(p)) {
            ck->kind = TPS_SRC_DIR;
            size_t fi;
            TPS_CHECK(add_file(ctx, ck, "model.safetensors", &fi));
            TPS_CHECK(add_file_tensors(ctx, ck, fi));
            TPS_CHECK(sort_and_dedup(ctx, ck));
        } else {
            TPS_CHECK(tps_no_model_here(ctx, path));
        }
    } else if (S_ISREG(sb.st_mode)) {
        ck->kind = TPS_SRC_FILE;
        tmp = tps_strdup(path);
        ck->dir = tps_strdup(dirname(tmp));
        free(tmp);
        tmp = tps_strdup(path);
        char *base = basename(tmp);
        size_t bl = strlen(base);
        if (bl > 12 && strcmp(base + bl - 12, ".safetensors") == 0) base[bl - 12] = 0;
        ck->stem = tps_strdup(base);
        free(tmp);
        tmp = tps_strdup(path);
        size_t fi;
        TPS_CHECK(add_file(ctx, ck, basename(tmp), &fi));
        TPS_CHECK(add_file_tensors(ctx, ck, fi));
        TPS_CHECK(sort_and_dedup(ctx, ck));
    } else {
        TPS_FAIL_IF(1, ctx, TPS_E_IO, "%s: not a file or directory", path);
    }
    if (repo) {
        /* Named after the repo, not the revision hash it sits under. */
        free(ck->stem);
        ck->stem = tps_strdup(repo);
        ck->hub = 1;
        TPS_FAIL_IF(!ck->stem, ctx, TPS_E_NOMEM, "out of memory");
    }
    if (ck->kind != TPS_SRC_SHARDED) {
        ck->norigins = ck->nfiles;
        ck->origins = tps_xcalloc(ck->nfiles, sizeof(char *));
        ck->origin_meta = cJSON_CreateObject();
        ck->origin_header = cJSON_CreateObject();
        TPS_FAIL_IF(!ck->origins || !ck->origin_meta || !ck->origin_header, ctx, TPS_E_NOMEM,
                    "out of memory");
        for (size_t i = 0; i < ck->nfiles; i++) {
            ck->origins[i] = tps_strdup(ck->files[i].name);
            /* A reference: the header text is not copied again. */
            cJSON_AddItemToObject(ck->origin_header, ck->files[i].name,
                                  cJSON_CreateStringReference(ck->files[i].st->raw));
            cJSON *md = cJSON_CreateObject();
            for (size_t k = 0; k < ck->files[i].st->nmeta; k++)
                cJSON_AddStringToObject(md, ck->files[i].st->mkeys[k], ck->files[i].st->mvals[k]);
            cJSON_AddItemToObject(ck->origin_meta, ck->files[i].name, md);
        }
    }
    TPS_CHECK(load_config(ctx, ck));
out:
    free(tmp);
    free(p);
    if (rc) {
        tps_ckpt_free(ck);
        ck = NULL;
    }
    *out = ck;
    return rc;
}

/* ------------------------------------------------------------------ accessors */

tps_src_kind tps_ckpt_kind(const tps_ckpt *ck) { return ck->kind; }
const char *tps_ckpt_path(const tps_ckpt *ck) { return ck->path; }
const char *tps_ckpt_dir(const tps_ckpt *ck) { return ck->dir; }
const char *tps_ckpt_stem(const tps_ckpt *ck) { return ck->stem; }
size_t tps_ckpt_count(const tps_ckpt *ck) { return ck->n; }
size_t tps_ckpt_file_count(const tps_ckpt *ck) { return ck->nfiles; }
const char *tps_ckpt_file(const tps_ckpt *ck, size_t i) { return ck->files[i].name; }
int tps_ckpt_has_config(const tps_ckpt *ck) { return ck->config != NULL; }

void tps_ckpt_tensor(const tps_ckpt *ck, size_t i, tps_tensor_view *v)
{
    const tps_ctensor *t = &ck->t[i];
    v->name = t->name;
    v->dtype = t->dtype;
    v->ndim = t->ndim;
    v->shape = t->shape;
    v->nbytes = t->nbytes;
    v->file = t->npieces ? ck->files[t->pieces[0].file].name : "";
    v->offset = t->npieces ? t->pieces[0].off - ck->files[t->pieces[0].file].st->data_start : 0;
}

int tps_ckpt_find(const tps_ckpt *ck, const char *name)
{
    size_t lo = 0, hi = ck->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(ck->t[mid].name, name);
        if (c == 0) return (int)mid;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

uint64_t tps_ckpt_total_bytes(const tps_ckpt *ck)
{
    uint64_t s = 0;
    for (size_t i = 0; i < ck->n; i++) s += ck->t[i].nbytes;
    return s;
}

/* ------------------------------------------------------------------ reads */

tps_err tps_ckpt_read_piece(tps_ctx *ctx, const tps_ckpt *ck, size_t i, int piece, uint64_t off,
                            void *buf, size_t len)
{
    const tps_ctensor *t = &ck->t[i];
    /* pieces, then replicas: piece npieces + k is replica k */
    const tps_piece *p = piece >= 0 && piece < t->npieces ? &t->pieces[piece]
                         : piece >= t->npieces && piece < t->npieces + t->nreplicas
                             ? &t->replicas[piece - t->npieces]
                             : NULL;
    if (!p || off + len > p->nbytes || off + len < off)
        return tps_fail(ctx, TPS_E_ARG, "tensor '%s': read outside piece %d", t->name, piece);
    return tps_ckpt_read_piece_at(ctx, ck, t, p, off, buf, len);
}

tps_err tps_ckpt_read_piece_at(tps_ctx *ctx, const tps_ckpt *ck, const tps_ctensor *t,
                               const tps_piece *p, uint64_t off, void *buf, size_t len)
{
    const tps_cfile *f = &ck->files[p->file];
    if (p->stored == t->dtype || p->fbytes == p->nbytes || p->stored != TPS_F32)
        return tps_pread_full(ctx, f->fd, f->path, buf, len, p->off + off);
    /* Widened to F32: read whole elements, narrow them back exactly. */
    size_t es = tps_dtype_bits(t->dtype) / 8, ratio = 4 / es;
    unsigned char wide[4096], narrow[1024];
    uint64_t e = off / es, end = (off + len + es - 1) / es;
    char *out = buf;
    while (e < end) {
        size_t n = (size_t)(end - e < sizeof wide / 4 ? end - e : sizeof wide / 4), bad = 0;
        TPS_TRY(tps_pread_full(ctx, f->fd, f->path, wide, n * 4, p->off + e * es * ratio));
        if (tps_narrow_f32(t->dtype, wide, narrow, n, &bad))
            return tps_fail(ctx, TPS_E_MISMATCH,
                            "%s: tensor '%s': element %llu of rank %d's piece is not a %s value "
                            "widened to F32 (the file changed after the split)",
                            f->path, p->holder ? p->holder : t->name,
                            (unsigned long long)(p->at / 4 + e + bad), p->rank,
                            tps_dtype_name(t->dtype));
        /* the part of these elements' bytes inside [off, off + len) */
        uint64_t b0 = e * es, b1 = (e + n) * es;
        uint64_t lo = b0 > off ? b0 : off, hi = b1 < off + len ? b1 : off + len;
        memcpy(out + (lo - off), narrow + (lo - b0), (size_t)(hi - lo));
        e += n;
    }
    return TPS_OK;
}

/* Pieces of a tensor cut along dim are concatenated along it: view the
 * tensor as [outer, shape[dim], inner]. For byte `off`, the piece holding it
 * (-1 when absent), the offset inside that piece, and how many bytes from
 * there on are contiguous in the piece. */
static int find_piece(const tps_ctensor *t, uint64_t off, uint64_t *poff, uint64_t *run)
{
    if (t->dim < 0) {
        *poff = off;
        *run = t->pieces[0].nbytes - off;
        return 0;
    }
    uint64_t inner_bits = tps_dtype_bits(t->dtype);
    for (int d = t->dim + 1; d < t->ndim; d++) inner_bits *= t->shape[d];
    uint64_t row = t->shape[t->dim] * inner_bits / 8;
    uint64_t o = off / row, w = off % row;
    for (int p = 0; p < t->npieces; p++) {
        uint64_t plo = t->pieces[p].lo * inner_bits / 8, phi = t->pieces[p].hi * inner_bits / 8;
        if (w >= plo && w < phi) {
            *poff = o * (phi - plo) + (w - plo);
            /* A piece covering whole rows runs on to its end. */
            *run = plo == 0 && phi == row ? t->pieces[p].nbytes - *poff : phi - w;
            return p;
        }
    }
    return -1;
}

tps_err tps_ckpt_read(tps_ctx *ctx, const tps_ckpt *ck, size_t i, uint64_t off, void *buf, size_t len)
{
    const tps_ctensor *t = &ck->t[i];
    if (off + len > t->nbytes || off + len < off)
        return tps_fail(ctx, TPS_E_ARG, "tensor '%s': read past its end", t->name);
    if (len == 0) return TPS_OK;
    if (t->npieces == 0)
        return tps_fail(ctx, TPS_E_MISMATCH, "%s: tensor '%s': no rank file holding it is present",
                        ck->path, t->name);
    char *out = buf;
    while (len) {
        uint64_t poff, run;
        int p = find_piece(t, off, &poff, &run);
        if (p < 0)
            return tps_fail(ctx, TPS_E_MISMATCH,
                            "%s: tensor '%s': the rank holding rows at byte %llu is not present",
                            ck->path, t->name, (unsigned long long)off);
        if (run > len) run = len;
        TPS_TRY(tps_ckpt_read_piece(ctx, ck, i, p, poff, out, (size_t)run));
        out += run;
        off += run;
        len -= (size_t)run;
    }
    return TPS_OK;
}

int tps_ckpt_locate(const tps_ckpt *ck, size_t i, uint64_t off, uint64_t len, int *file,
                    uint64_t *foff)
{
    const tps_ctensor *t = &ck->t[i];
    uint64_t poff, run;
    if (t->npieces == 0 || off + len > t->nbytes || off + len < off || len == 0) return 0;
    int p = find_piece(t, off, &poff, &run);
    if (p < 0 || run < len || t->pieces[p].fbytes != t->pieces[p].nbytes) return 0;
    *file = t->pieces[p].file;
    *foff = t->pieces[p].off + poff;
    return 1;
}

tps_err tps_ckpt_recheck(tps_ctx *ctx, const tps_ckpt *ck)
{
    for (size_t i = 0; i < ck->nfiles; i++) {
        const tps_cfile *f = &ck->files[i];
        struct stat sb;
        if (fstat(f->fd, &sb) != 0) return tps_fail(ctx, TPS_E_IO, "%s: %s", f->path, strerror(errno));
        if ((uint64_t)sb.st_size != f->size)
            return tps_fail(ctx, TPS_E_FORMAT,
                            "%s: the file changed size while being read (was %llu bytes, now %lld): "
                            "%s by another process",
                            f->path, (unsigned long long)f->size, (long long)sb.st_size,
                            (uint64_t)sb.st_size < f->size ? "truncated" : "grown");
        /* Same size, but written to, or truncated and grown back: both move
         * the modification time. (Not the change time: chmod, a rename, a
         * link or an xattr move it too, with the bytes unchanged.) */
        if ((int64_t)sb.st_mtim.tv_sec != f->mtime_s || (int64_t)sb.st_mtim.tv_nsec != f->mtime_ns)
            return tps_fail(ctx, TPS_E_FORMAT,
                            "%s: the file was modified while being read (its modification time "
                            "moved): written by another process",
                            f->path);
    }
    return TPS_OK;
}

const char *tps_ckpt_aux_file(const tps_ckpt *ck, const char *config_text, size_t i, int *writes)
{
    if (i >= sizeof aux_files / sizeof *aux_files - 1) return NULL;
    const char *a = aux_files[i];
    char *src = tps_path_join(ck->dir, a);
    *writes = (config_text && !strcmp(a, "config.json")) || (src && tps_exists(src));
    free(src);
    return a;
}

tps_err tps_ckpt_copy_aux(tps_ctx *ctx, const tps_ckpt *ck, const char *out_dir,
                          const char *config_text)
{
    for (const char *const *a = aux_files; *a; a++) {
        char *src = tps_path_join(ck->dir, *a), *dst = tps_path_join(out_dir, *a);
        tps_err rc = TPS_OK;
        if (!src || !dst) rc = tps_fail(ctx, TPS_E_NOMEM, "out of memory");
        else if (config_text && !strcmp(*a, "config.json"))
            rc = tps_write_file_atomic(ctx, dst, config_text, strlen(config_text));
        else if (tps_exists(src)) rc = tps_copy_file_atomic(ctx, src, dst);
        free(src);
        free(dst);
        if (rc) return rc;
    }
    return TPS_OK;
}

int tps_ckpt_config_value(const tps_ckpt *ck, const char *field, char *buf, size_t len)
{
    const cJSON *v = tps_config_get(ck->config, field);
    if (!v) return -1;
    char *t = cJSON_PrintUnformatted(v);
    if (!t) return -1;
    snprintf(buf, len, "%s", t);
    free(t);
    return 0;
}

/* ------------------------------------------------------------------ untie */

const char *tps_ckpt_untied_head(const tps_ckpt *ck) { return ck ? ck->untie_head : NULL; }
const char *tps_ckpt_untied_embedding(const tps_ckpt *ck)
{
    return ck ? ck->untie_embedding : NULL;
}

tps_err tps_ckpt_untie(tps_ctx *ctx, tps_ckpt *ck, const tps_plan *plan)
{
    tps_err rc = TPS_OK;
    char *emb = NULL, *head = NULL, *text = NULL, *cfg_path = NULL;
    cJSON *cfg = NULL;
    if (!ck || !plan) return tps_fail(ctx, TPS_E_ARG, "tps_ckpt_untie: no checkpoint or plan");
    TPS_FAIL_IF(ck->untie_head, ctx, TPS_E_ARG,
                "%s: --untie: already untied (its %s was written from %s)", ck->path,
                ck->untie_head, ck->untie_embedding);
    /* Tied or not is the checkpoint's, whatever the plan knows of untying. */
    const cJSON *tied = tps_config_get(ck->config, "tie_word_embeddings");
    TPS_FAIL_IF(cJSON_IsFalse(tied), ctx, TPS_E_ARG,
                "%s: --untie: not a tied checkpoint: %s; --untie is for checkpoints whose "
                "head is the embedding",
                ck->path, tps_config_defaulted(ck->config, "tie_word_embeddings")
                              ? "config.json leaves tie_word_embeddings to its model type's "
                                "default, false"
                              : "config.json says tie_word_embeddings false");
    for (size_t j = 0; j < ck->n; j++) {
        const char *n = ck->t[j].name;
        size_t l = strlen(n);
        TPS_FAIL_IF(!strcmp(n, "lm_head.weight") ||
                        (l > 15 && !strcmp(n + l - 15, ".lm_head.weight")),
                    ctx, TPS_E_ARG,
                    "%s: --untie: not a tied checkpoint: it has its own %s", ck->path, n);
    }
    TPS_FAIL_IF(!plan->nuntie, ctx, TPS_E_ARG,
                "--untie: plan %s names no tied embedding to untie (it has no 'untie' entries; "
                "see tpshard-plan(5))",
                plan->name);
    int e = -1;
    size_t k;
    for (k = 0; k < plan->nuntie && e < 0; k++) {
        free(emb);
        emb = tps_asprintf("%s.weight", plan->untie_embedding[k]);
        TPS_FAIL_IF(!emb, ctx, TPS_E_NOMEM, "out of memory");
        e = tps_ckpt_find(ck, emb);
    }
    if (e < 0) {
        char list[512];
        size_t off = 0;
        list[0] = '\0';
        for (size_t j = 0; j < plan->nuntie && off < sizeof list; j++)
            off += (size_t)snprintf(list + off, sizeof list - off, "%s%s.weight", j ? ", " : "",
                                    plan->untie_embedding[j]);
        rc = tps_fail(ctx, TPS_E_ARG,
                      "%s: --untie: no embedding to untie: the checkpoint has none of %s (plan %s)",
                      ck->path, list, plan->name);
        goto out;
    }
    head = tps_asprintf("%s.weight", plan->untie_head[k - 1]);
    TPS_FAIL_IF(!head, ctx, TPS_E_NOMEM, "out of memory");
    /* Any head of the plan's entries present means the checkpoint has its own. */
    for (size_t j = 0; j < plan->nuntie; j++) {
        char *h = tps_asprintf("%s.weight", plan->untie_head[j]);
        TPS_FAIL_IF(!h, ctx, TPS_E_NOMEM, "out of memory");
        int there = tps_ckpt_find(ck, h) >= 0;
        if (there)
            rc = tps_fail(ctx, TPS_E_ARG,
                          "%s: --untie: not a tied checkpoint: it has its own %s", ck->path, h);
        free(h);
        if (rc) goto out;
    }
    cfg_path = tps_path_join(ck->dir, "config.json");
    TPS_FAIL_IF(!cfg_path, ctx, TPS_E_NOMEM, "out of memory");
    TPS_FAIL_IF(!ck->config || !ck->config_text, ctx, TPS_E_ARG,
                "%s: --untie needs config.json (the output's config.json must say "
                "tie_word_embeddings false)",
                ck->path);
    const cJSON *tie = tps_config_get(ck->config, "tie_word_embeddings");
    TPS_FAIL_IF(cJSON_IsFalse(tie), ctx, TPS_E_ARG,
                "%s: --untie: not a tied checkpoint: tie_word_embeddings is false (and it has no "
                "%s: a head is missing rather than tied)",
                cfg_path, head);
    const tps_ctensor *et = &ck->t[e];
    TPS_FAIL_IF(et->ndim != 2, ctx, TPS_E_SHAPE,
                "%s: --untie: embedding '%s' is %d-D; a head's weight is 2-D [vocab, hidden]",
                ck->path, et->name, et->ndim);
    text = tps_json_untie_text(ck->config_text, strlen(ck->config_text));
    TPS_FAIL_IF(!text, ctx, TPS_E_CONFIG, "%s: --untie: cannot set tie_word_embeddings in it",
                cfg_path);
    TPS_CHECK(tps_json_parse(ctx, cfg_path, text, strlen(text), &cfg));
    TPS_CHECK(tps_config_resolve(ctx, cfg));
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(cfg, "text_config");
    TPS_FAIL_IF(!cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(cfg, "tie_word_embeddings")) ||
                    (cJSON_IsObject(tc) &&
                     !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(tc, "tie_word_embeddings"))),
                ctx, TPS_E_CONFIG,
                "%s: --untie: cannot set tie_word_embeddings to false in it (a key written with "
                "escapes?)",
                cfg_path);
    /* The head: the embedding's pieces under a new name. */
    TPS_CHECK(grow_tensors(ctx, ck, 1));
    tps_ctensor *ht = &ck->t[ck->n];
    *ht = ck->t[e];
    ht->name = head;
    ht->derived_from = ck->t[e].name;
    if (ck->t[e].placement) {
        ht->placement = tps_strdup(ck->t[e].placement);
        TPS_FAIL_IF(!ht->placement, ctx, TPS_E_NOMEM, "out of memory");
    }
    ck->n++;
    ck->untie_head = head;
    head = NULL;
    ck->untie_embedding = tps_strdup(ck->t[e].name);
    ck->untie_config = tps_strdup(ck->config_text);
    TPS_FAIL_IF(!ck->untie_embedding || !ck->untie_config, ctx, TPS_E_NOMEM, "out of memory");
    TPS_CHECK(sort_and_dedup(ctx, ck));
    cJSON_Delete(ck->config);
    ck->config = cfg;
    cfg = NULL;
    ck->config_out = text;
    text = NULL;
out:
    free(emb);
    free(head);
    free(text);
    free(cfg_path);
    cJSON_Delete(cfg);
    return rc;
}

/* ------------------------------------------------------------------ config text */

/* Just enough JSON scanning to find spans in text cJSON already accepted. */
static size_t skip_ws(const char *s, size_t n, size_t i)
{
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
    return i;
}

static size_t skip_string(const char *s, size_t n, size_t i) /* at '"' */
{
    for (i++; i < n && s[i] != '"'; i++)
        if (s[i] == '\\') i++;
    return i < n ? i + 1 : n;
}

static size_t skip_value(const char *s, size_t n, size_t i)
{
    if (i >= n) return n;
    if (s[i] == '"') return skip_string(s, n, i);
    if (s[i] == '{' || s[i] == '[') {
        size_t depth = 0;
        while (i < n) {
            if (s[i] == '"') {
                i = skip_string(s, n, i);
                continue;
            }
            if (s[i] == '{' || s[i] == '[') depth++;
            else if ((s[i] == '}' || s[i] == ']') && --depth == 0) return i + 1;
            i++;
        }
        return n;
    }
    while (i < n && !strchr(",}] \t\r\n", s[i])) i++;
    return i;
}

typedef struct {
    size_t at, end; /* replace [at, end) (end == at: insert) */
    const char *with;
    char *owned;
} edit;

/* The edits that make the object starting at s[i] == '{' say
 * tie_word_embeddings false; *tc gets the span of its text_config object
 * value when it has one (else 0). Returns the edits added to ed. */
static size_t object_edits(const char *s, size_t n, size_t i, edit *ed, size_t max, size_t *tc)
{
    static const char key[] = "\"tie_word_embeddings\"";
    size_t ne = 0, open = i, members = 0;
    if (tc) *tc = 0;
    i = skip_ws(s, n, i + 1);
    while (i < n && s[i] == '"') {
        size_t k0 = i;
        i = skip_string(s, n, i);
        size_t klen = i - k0;
        i = skip_ws(s, n, i);
        if (i < n && s[i] == ':') i = skip_ws(s, n, i + 1);
        size_t v0 = i;
        i = skip_value(s, n, i);
        members++;
        if (klen == sizeof key - 1 && !memcmp(s + k0, key, klen) && ne < max)
            ed[ne++] = (edit){.at = v0, .end = i, .with = "false"};
        if (tc && klen == 13 && !memcmp(s + k0, "\"text_config\"", 13) && v0 < n && s[v0] == '{')
            *tc = v0;
        i = skip_ws(s, n, i);
        if (i < n && s[i] == ',') i = skip_ws(s, n, i + 1);
    }
    if (ne == 0 && ne < max) {
        /* Inserted first, indented as the object's first member is. */
        size_t w = skip_ws(s, n, open + 1);
        const char *nl = memchr(s + open + 1, '\n', w - open - 1);
        int indent = nl ? (int)(s + w - nl - 1) : 0;
        char *t = tps_asprintf("%s%*s\"tie_word_embeddings\": false%s", nl ? "\n" : "", indent, "",
                               members ? "," : "");
        ed[ne++] = (edit){.at = open + 1, .end = open + 1, .with = t, .owned = t};
    }
    return ne;
}

static int edit_cmp(const void *a, const void *b)
{
    const edit *x = a, *y = b;
    return x->at < y->at ? -1 : x->at > y->at;
}

char *tps_json_untie_text(const char *text, size_t len)
{
    edit ed[64];
    size_t ne = 0, tc = 0, i = skip_ws(text, len, 0);
    if (i >= len || text[i] != '{') return NULL;
    ne = object_edits(text, len, i, ed, 32, &tc);
    if (tc) ne += object_edits(text, len, tc, ed + ne, 32, NULL);
    qsort(ed, ne, sizeof *ed, edit_cmp);
    size_t cap = len + 1, o = 0, at = 0;
    for (size_t k = 0; k < ne; k++) cap += ed[k].with ? strlen(ed[k].with) : 0;
    char *out = tps_xmalloc(cap);
    for (size_t k = 0; k < ne; k++) {
        if (!out || !ed[k].with || ed[k].at < at) {
            free(out);
            out = NULL;
            break;
        }
        memcpy(out + o, text + at, ed[k].at - at);
        o += ed[k].at - at;
        memcpy(out + o, ed[k].with, strlen(ed[k].with));
        o += strlen(ed[k].with);
        at = ed[k].end;
    }
    if (out) {
        memcpy(out + o, text + at, len - at);
        out[o + len - at] = '\0';
    }
    for (size_t k = 0; k < ne; k++) free(ed[k].owned);
    return out;
}
