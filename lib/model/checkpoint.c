/* checkpoint.c - a model as a set of named tensors, whatever it was opened
 * from: one .safetensors file or a directory with model.safetensors (opened
 * here), an index with parts (ckpt_index.c), or a tpshard output directory
 * read through its manifest as if it were the full checkpoint
 * (ckpt_sharded.c). This file owns what they share: opening a path and
 * telling which of those it is, the rank and source files, the tensor table
 * (sorted, each name once, tps_ckpt_find), config.json, reading a logical
 * byte range, the auxiliary files, and freeing it all. Every tensor is a
 * list of pieces concatenated along one dim, so reading a logical byte range
 * works the same for all of them. --untie is ckpt_untie.c's. */
#include "internal.h"
#include "model_int.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
    for (size_t i = 0; i < ck->nrts; i++) {
        free(ck->rts[i].fills);
        free(ck->rts[i].xfills);
    }
    free(ck->rts);
    for (size_t i = 0; i < ck->npools; i++) free(ck->pools[i]);
    free(ck->pools);
    tps_u64_chunks_free(&ck->shapes);
    tps_str_chunks_free(&ck->strs);
    free(ck->str_set);
    for (size_t i = 0; i < ck->norigins; i++) free(ck->origins[i]);
    free(ck->origins);
    free(ck->files);
    for (size_t i = 0; ck->names_owned && i < ck->n; i++)
        if (!ck->t[i].derived_from) free((char *)ck->t[i].name); /* not --untie's head */
    free(ck->t);
    free(ck->path);
    free(ck->dir);
    free(ck->stem);
    free(ck->index_name);
    free(ck->rank_present);
    free(ck->rank_written);
    free(ck->stage_first);
    free(ck->stage_layers);
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
    free(ck->origin_hsum);
    cJSON_Delete(ck->index_meta);
    free(ck);
}

tps_err tps_ck_add_file(tps_ctx *ctx, tps_ckpt *ck, const char *name, size_t *idx)
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
    if (ck->lean && f->st->raw) { /* tps_ckpt_open_lean: only the header's sums are kept */
        size_t n = strlen(f->st->raw);
        f->raw_crc = tps_crc32(0, f->st->raw, f->st->raw_len);
        f->hsum = (struct tps_hsum){tps_crc32(0, f->st->raw, n), n, 1};
        free(f->st->raw);
        f->st->raw = NULL;
    }
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

/* A copy of shape[0 .. ndim) in ck->shapes, zeros after it to TPS_SHAPE_PAD
 * dims; NULL out of memory. */
const uint64_t *tps_ck_keep_shape(tps_ckpt *ck, const uint64_t *shape, int ndim)
{
    int kept = ndim < TPS_SHAPE_PAD ? TPS_SHAPE_PAD : ndim;
    uint64_t *d = tps_u64_take(&ck->shapes, (size_t)kept);
    if (!d) return NULL;
    memset(d, 0, sizeof(uint64_t) * (size_t)kept);
    memcpy(d, shape, sizeof(uint64_t) * (size_t)ndim);
    return d;
}

void tps_ckpt_drop_file_tables(tps_ckpt *ck)
{
    if (ck->kind != TPS_SRC_SHARDED) return;
    for (size_t i = 0; i < ck->nfiles; i++) {
        free(ck->files[i].byname);
        ck->files[i].byname = NULL;
        if (ck->files[i].st) tps_st_drop_table(ck->files[i].st);
    }
    tps_heap_release();
}

void tps_ckpt_take_strings(tps_ckpt *ck, tps_str_chunks *out)
{
    *out = ck->strs;
    memset(&ck->strs, 0, sizeof ck->strs);
}

/* origin k's header text h is let go: its sum kept (NULL h: nothing). */
static void keep_hsum(tps_ckpt *ck, const char *name, const char *h)
{
    if (!h || !ck->norigins) return;
    if (!ck->origin_hsum && !(ck->origin_hsum = tps_xcalloc(ck->norigins, sizeof *ck->origin_hsum)))
        return;
    for (size_t k = 0; k < ck->norigins; k++)
        if (ck->origins[k] && !strcmp(ck->origins[k], name)) {
            size_t n = strlen(h);
            ck->origin_hsum[k] = (struct tps_hsum){tps_crc32(0, h, n), n, 1};
        }
}

void tps_ckpt_release_headers(tps_ckpt *ck)
{
    if (ck->kind == TPS_SRC_SHARDED) return;
    for (size_t i = 0; i < ck->nfiles; i++) {
        tps_cfile *f = &ck->files[i];
        if (!f->st || !f->st->raw) continue;
        f->raw_crc = tps_crc32(0, f->st->raw, f->st->raw_len);
        keep_hsum(ck, f->name, f->st->raw);
        cJSON_DeleteItemFromObjectCaseSensitive(ck->origin_header, f->name);
        free(f->st->raw);
        f->st->raw = NULL;
    }
    tps_heap_release();
}

void tps_ckpt_release_origin_headers(tps_ckpt *ck)
{
    if (ck->kind != TPS_SRC_SHARDED) {
        tps_ckpt_release_headers(ck);
        return;
    }
    /* origin_header refers to the manifest's strings: it goes first */
    cJSON *empty = cJSON_CreateObject();
    if (!empty) return;
    for (const cJSON *h = ck->origin_header ? ck->origin_header->child : NULL; h; h = h->next)
        if (cJSON_IsString(h)) keep_hsum(ck, h->string, h->valuestring);
    cJSON_Delete(ck->origin_header);
    ck->origin_header = empty;
    const cJSON *sf = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(ck->manifest, "source"), "files");
    for (cJSON *f = sf ? sf->child : NULL; f; f = f->next)
        cJSON_DeleteItemFromObjectCaseSensitive(f, "header");
    tps_heap_release();
}

tps_err tps_ckpt_file_header(tps_ctx *ctx, const tps_ckpt *ck, size_t i, char **out)
{
    const tps_cfile *f = &ck->files[i];
    *out = NULL;
    size_t n = f->st ? f->st->raw_len : 0;
    char *raw = tps_xmalloc(n + 1);
    if (!raw) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    tps_err rc = n ? tps_pread_full(ctx, f->fd, f->path, raw, n, 8) : TPS_OK;
    if (rc) {
        free(raw);
        return rc;
    }
    raw[n] = 0;
    if (tps_crc32(0, raw, n) != f->raw_crc) {
        free(raw);
        return tps_fail(ctx, TPS_E_FORMAT,
                        "%s: the header changed while the file was being read: written by "
                        "another process",
                        f->path);
    }
    *out = raw;
    return TPS_OK;
}

/* n pieces from a new pool the checkpoint frees. */
tps_piece *tps_ck_new_pool(tps_ctx *ctx, tps_ckpt *ck, size_t n)
{
    tps_piece **np = realloc(ck->pools, (ck->npools + 1) * sizeof *np);
    if (!np) return tps_fail(ctx, TPS_E_NOMEM, "out of memory"), NULL;
    ck->pools = np;
    tps_piece *p = tps_xcalloc(n, sizeof *p);
    if (!p) return tps_fail(ctx, TPS_E_NOMEM, "out of memory"), NULL;
    ck->pools[ck->npools++] = p;
    return p;
}

tps_err tps_ck_grow_tensors(tps_ctx *ctx, tps_ckpt *ck, size_t extra)
{
    tps_ctensor *nt = realloc(ck->t, (ck->n + extra) * sizeof *nt);
    if (!nt) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    ck->t = nt;
    memset(ck->t + ck->n, 0, extra * sizeof *nt);
    return TPS_OK;
}

/* Every tensor of file fi becomes a one-piece tensor. */
tps_err tps_ck_add_file_tensors(tps_ctx *ctx, tps_ckpt *ck, size_t fi)
{
    tps_cfile *f = &ck->files[fi];
    TPS_TRY(tps_ck_grow_tensors(ctx, ck, f->st->n));
    tps_piece *pool = tps_ck_new_pool(ctx, ck, f->st->n);
    if (!pool) return TPS_E_NOMEM;
    for (size_t i = 0; i < f->st->n; i++) {
        const tps_st_tensor_info *s = &f->st->t[i];
        tps_ctensor *t = &ck->t[ck->n++];
        t->name = s->name;
        t->dtype = s->dtype;
        t->ndim = s->ndim;
        if (!(t->shape = tps_ck_keep_shape(ck, s->shape, s->ndim)))
            return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
        t->nbytes = tps_st_info_nbytes(s);
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

tps_err tps_ck_sort_and_dedup(tps_ctx *ctx, tps_ckpt *ck)
{
    if (ck->n > 1) qsort(ck->t, ck->n, sizeof *ck->t, cmp_tensor_name);
    for (size_t i = 1; i < ck->n; i++)
        if (strcmp(ck->t[i - 1].name, ck->t[i].name) == 0)
            return tps_fail(ctx, TPS_E_INDEX, "%s: tensor '%s' is in both %s and %s", ck->path,
                            ck->t[i].name, ck->t[i - 1].origin, ck->t[i].origin);
    return TPS_OK;
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
int tps_ck_plain_name(const char *s)
{
    return *s && !strchr(s, '/') && !strchr(s, '\\') && strcmp(s, ".") && strcmp(s, "..");
}

/* ------------------------------------------------------------------ open */

static tps_err ckpt_open(tps_ctx *ctx, const char *path, const char *repo, tps_ckpt **out,
                         int lean);

/* model located (a path, or a Hugging Face cache entry) and opened. */
static tps_err locate_open(tps_ctx *ctx, const char *model, tps_ckpt **out, int lean)
{
    *out = NULL;
    char *path = NULL, *repo = NULL;
    tps_err rc = tps_model_locate(ctx, model, &path, &repo);
    if (!rc) rc = ckpt_open(ctx, path, repo, out, lean);
    free(path);
    free(repo);
    return rc;
}

tps_err tps_ckpt_open(tps_ctx *ctx, const char *model, tps_ckpt **out)
{
    return locate_open(ctx, model, out, 0);
}

tps_err tps_ckpt_open_lean(tps_ctx *ctx, const char *model, tps_ckpt **out)
{
    return locate_open(ctx, model, out, 1);
}

tps_err tps_ckpt_open_path(tps_ctx *ctx, const char *path, tps_ckpt **out)
{
    return ckpt_open(ctx, path, NULL, out, 0);
}

static tps_err ckpt_open(tps_ctx *ctx, const char *path, const char *repo, tps_ckpt **out,
                         int lean)
{
    *out = NULL;
    tps_err rc = TPS_OK;
    static uint64_t opens;
    tps_ckpt *ck = tps_xcalloc(1, sizeof *ck);
    char *tmp = NULL, *p = NULL;
    if (!ck) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    ck->lean = lean;
    ck->seq = __atomic_add_fetch(&opens, 1, __ATOMIC_RELAXED);
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
            TPS_CHECK(tps_ck_open_sharded(ctx, ck, p));
        } else if ((free(p), p = tps_path_join(path, "model.safetensors.index.json")) && tps_exists(p)) {
            ck->kind = TPS_SRC_INDEX;
            ck->index_name = tps_strdup("model.safetensors.index.json");
            TPS_CHECK(tps_ck_open_index(ctx, ck, p));
        } else if ((free(p), p = tps_path_join(path, "model.safetensors")) && tps_exists(p)) {
            ck->kind = TPS_SRC_DIR;
            size_t fi;
            TPS_CHECK(tps_ck_add_file(ctx, ck, "model.safetensors", &fi));
            TPS_CHECK(tps_ck_add_file_tensors(ctx, ck, fi));
            TPS_CHECK(tps_ck_sort_and_dedup(ctx, ck));
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
        TPS_CHECK(tps_ck_add_file(ctx, ck, basename(tmp), &fi));
        TPS_CHECK(tps_ck_add_file_tensors(ctx, ck, fi));
        TPS_CHECK(tps_ck_sort_and_dedup(ctx, ck));
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
            if (ck->files[i].st->raw)
                cJSON_AddItemToObject(ck->origin_header, ck->files[i].name,
                                      cJSON_CreateStringReference(ck->files[i].st->raw));
            else if (ck->files[i].hsum.gone) {
                if (!ck->origin_hsum)
                    ck->origin_hsum = tps_xcalloc(ck->nfiles, sizeof *ck->origin_hsum);
                TPS_FAIL_IF(!ck->origin_hsum, ctx, TPS_E_NOMEM, "out of memory");
                ck->origin_hsum[i] = ck->files[i].hsum;
            }
            cJSON *md = cJSON_CreateObject();
            for (size_t k = 0; k < ck->files[i].st->nmeta; k++)
                cJSON_AddStringToObject(md, ck->files[i].st->mkeys[k], ck->files[i].st->mvals[k]);
            cJSON_AddItemToObject(ck->origin_meta, ck->files[i].name, md);
        }
    }
    if (ck->kind != TPS_SRC_SHARDED) {
        /* The files' tensor tables were read into ck->t; their names are
         * the tensors' now, the rest goes (7 MB at DeepSeek-V3's 92k). */
        for (size_t i = 0; i < ck->nfiles; i++) {
            ck->files[i].st->names_kept = 1;
            tps_st_drop_table(ck->files[i].st);
        }
        ck->names_owned = 1;
    }
    TPS_CHECK(load_config(ctx, ck));
    if (ck->pad_intermediate && ck->untie_config) {
        /* the source tensors are the unpadded model's: the source's config describes them */
        cJSON *cfg = cJSON_Parse(ck->untie_config);
        TPS_FAIL_IF(!cfg, ctx, TPS_E_JSON, "%s: the manifest's source_config is not JSON", ck->path);
        cJSON_Delete(ck->config);
        ck->config = cfg;
    }
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

/* A refined piece (tps_xform): its F32 grid read whole, every element's
 * copies compared and narrowed back to the region's own bytes. */
static tps_err read_refined(tps_ctx *ctx, const tps_ckpt *ck, const tps_ctensor *t,
                            const tps_piece *p, uint64_t off, void *buf, size_t len)
{
    const tps_cfile *f = &ck->files[p->file];
    const tps_xform xf = {p->rep_n, p->rep_k, p->xskip, p->xout, 0}, *x = &xf;
    uint64_t rows = t->dim == 0 ? p->hi - p->lo : t->shape[0];
    uint64_t cols = t->dim == 1 ? p->hi - p->lo : t->shape[1];
    uint64_t orows, ocols, sr, sc;
    tps_xform_grid(x, t->dim, rows, cols, &orows, &ocols, &sr, &sc);
    size_t es = tps_dtype_bits(t->dtype) / 8;
    float *g = tps_xmalloc((size_t)p->fbytes + 1);
    unsigned char *own = tps_xmalloc((size_t)(rows * cols * es) + 1);
    unsigned char *seen = tps_xcalloc((size_t)(rows * cols) + 1, 1);
    uint32_t *first = tps_xmalloc((size_t)(rows * cols) * 4 + 1);
    tps_err rc = g && own && seen && first ? TPS_OK
                                           : tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    if (!rc) rc = tps_pread_full(ctx, f->fd, f->path, g, (size_t)p->fbytes, p->off);
    for (uint64_t i = 0; !rc && i < orows; i++)
        for (uint64_t j = 0; !rc && j < ocols; j++) {
            uint64_t e = ((i + sr) / x->rep_n) * cols + (j + sc) / x->rep_k;
            uint32_t u;
            memcpy(&u, &g[i * ocols + j], 4);
            size_t bad = 0;
            if (!seen[e]) {
                seen[e] = 1;
                first[e] = u;
                if (tps_narrow_f32(t->dtype, &u, own + e * es, 1, &bad))
                    rc = tps_fail(ctx, TPS_E_MISMATCH,
                                  "%s: tensor '%s': element %llu of rank %d's refined piece is "
                                  "not a %s value widened to F32 (the file changed after the "
                                  "split)",
                                  f->path, p->holder ? p->holder : t->name,
                                  (unsigned long long)(p->at / 4 + i * ocols + j), p->rank,
                                  tps_dtype_name(t->dtype));
            } else if (first[e] != u) {
                rc = tps_fail(ctx, TPS_E_MISMATCH,
                              "%s: tensor '%s': element %llu of rank %d's refined piece differs "
                              "from the other copies of its scale (the file changed after the "
                              "split)",
                              f->path, p->holder ? p->holder : t->name,
                              (unsigned long long)(p->at / 4 + i * ocols + j), p->rank);
            }
        }
    for (uint64_t e = 0; !rc && e < rows * cols; e++)
        if (!seen[e])
            rc = tps_fail(ctx, TPS_E_MISMATCH, "%s: tensor '%s': rank %d's refined piece lacks "
                          "element %llu of its region", f->path, t->name, p->rank,
                          (unsigned long long)e);
    if (!rc) memcpy(buf, own + off, len);
    free(g);
    free(own);
    free(seen);
    free(first);
    return rc;
}

/* Region elements [e, end) of matrix m of transposed piece p (A rows of B
 * elements of es bytes; stored as B rows of A) into dst: the stored rows a
 * batch at a time (tmp: TR_BATCH bytes), each request's stored columns
 * only when they are few, whole stored rows when they are most of one. */
#define TR_BATCH (4u << 20)
static tps_err tr_segment(tps_ctx *ctx, const tps_cfile *f, const tps_ctensor *t,
                          const tps_piece *p, uint64_t A, uint64_t B, size_t es, uint64_t m,
                          uint64_t e, uint64_t end, char *dst, char *tmp)
{
    uint64_t in = e - m * A * B, ra0 = in / B, ra1 = (end - 1 - m * A * B) / B + 1;
    uint64_t na = ra1 - ra0, colb = na * es, base = p->off + m * A * B * es;
    int whole = colb * 2 >= A * es;
    uint64_t span = whole ? A * es : colb, per = TR_BATCH / span ? TR_BATCH / span : 1;
    if (span > TR_BATCH)
        return tps_fail(ctx, TPS_E_ARG, "%s: tensor '%s': a transposed piece's stored rows of "
                        "%llu bytes are more than a read takes", f->path, t->name,
                        (unsigned long long)span);
    /* rows a whole in [e, end): their columns of each batch in one transpose;
     * a partial first or last row element by element */
    uint64_t f0 = (in + B - 1) / B, f1 = (end - m * A * B) / B;
    if (f0 < ra0) f0 = ra0;
    if (f1 > ra1) f1 = ra1;
    for (uint64_t b0 = 0; b0 < B; b0 += per) {
        uint64_t b1 = b0 + per < B ? b0 + per : B;
        if (whole)
            TPS_TRY(tps_pread_full(ctx, f->fd, f->path, tmp, (size_t)((b1 - b0) * span),
                                   base + b0 * A * es));
        else
            for (uint64_t b = b0; b < b1; b++)
                TPS_TRY(tps_pread_full(ctx, f->fd, f->path, tmp + (b - b0) * span, (size_t)span,
                                       base + (b * A + ra0) * es));
        if (f0 < f1)
            tps_transpose(dst + ((f0 * B + b0) - in) * es, (size_t)(B * es),
                          tmp + (whole ? f0 : f0 - ra0) * es, (size_t)span, b1 - b0, f1 - f0, es);
        for (uint64_t a = ra0; a < ra1; a++) {
            if (a >= f0 && a < f1) continue;
            for (uint64_t b = b0; b < b1; b++) {
                uint64_t x = a * B + b;
                if (x < in || x >= end - m * A * B) continue;
                memcpy(dst + (x - in) * es, tmp + ((b - b0) * span + (whole ? a : a - ra0) * es),
                       es);
            }
        }
    }
    return TPS_OK;
}

/* A band of a transposed matrix in the region's order: the rows [a0, a1)
 * of the matrix at byte `base` of file `file` of the checkpoint opened as
 * `seq` (tps_ckpt.seq: a later open, of the same files rewritten or not,
 * never finds it). Reads of a few rows at a time (merge and reshard read a tensor cut
 * along its last dim a row at a time, each rank's piece of the row in turn)
 * would each read a stored column, an element from every stored row; a band
 * of TR_BAND bytes is read once and serves the rows after it. A thread keeps
 * TR_SLOTS of them, one per piece a row's reads go round (tp of them),
 * replaced in turn. */
#define TR_BAND (1u << 20)
#define TR_SLOTS 16
typedef struct {
    uint64_t seq; /* 0: empty */
    int file;
    uint64_t base, a0, a1;
    char *buf;
    size_t cap;
} tr_band;
typedef struct {
    tr_band b[TR_SLOTS];
    unsigned next;
} tr_cache;

static pthread_key_t tr_key;
static pthread_once_t tr_once = PTHREAD_ONCE_INIT;
static void tr_cache_free(void *v)
{
    tr_cache *c = v;
    if (!c) return;
    for (int k = 0; k < TR_SLOTS; k++) free(c->b[k].buf);
    free(c);
}
static void tr_key_make(void) { (void)pthread_key_create(&tr_key, tr_cache_free); }

static tr_cache *tr_cache_get(void)
{
    if (pthread_once(&tr_once, tr_key_make)) return NULL;
    tr_cache *c = pthread_getspecific(tr_key);
    if (!c && (c = calloc(1, sizeof *c)) && pthread_setspecific(tr_key, c)) {
        free(c);
        c = NULL;
    }
    return c;
}

/* The thread's band holding rows [ra0, ra1) of the matrix at `base` of
 * file `file` of ck, or NULL. */
static tr_band *tr_band_find(tr_cache *cc, const tps_ckpt *ck, int file, uint64_t base,
                             uint64_t ra0, uint64_t ra1)
{
    for (int k = 0; k < TR_SLOTS; k++) {
        tr_band *c = &cc->b[k];
        if (c->seq && c->seq == ck->seq && c->file == file && c->base == base && c->a0 <= ra0 &&
            ra1 <= c->a1)
            return c;
    }
    return NULL;
}

/* A transposed piece (tps_xform.tr): bytes [off, off + len) of its region
 * in the region's own order, matrix by matrix (tr_segment), small reads
 * through the thread's band. */
static tps_err read_transposed(tps_ctx *ctx, const tps_ckpt *ck, const tps_ctensor *t,
                               const tps_piece *p, uint64_t off, void *buf, size_t len)
{
    const tps_cfile *f = &ck->files[p->file];
    uint64_t n, A, B;
    tps_tr_dims(t, t->dim, p->lo, p->hi, &n, &A, &B);
    size_t es = tps_dtype_bits(t->dtype) / 8;
    uint64_t mat = A * B * es, rowb = B * es;
    if (!len) return TPS_OK;
    if (!es || off % es || len % es || !mat)
        return tps_fail(ctx, TPS_E_ARG, "%s: tensor '%s': a read of a transposed piece must be "
                        "whole elements", f->path, t->name);
    char *tmp = NULL; /* TR_BATCH bytes, once a read needs it */
    tps_err rc = TPS_OK;
    char *out = buf;
    uint64_t band = rowb <= TR_BAND ? TR_BAND / rowb : 1; /* rows a band holds */
    if (band > A) band = A;
    for (uint64_t e = off / es, e1 = (off + len) / es; !rc && e < e1;) {
        uint64_t m = e / (A * B);
        uint64_t end = (m + 1) * A * B < e1 ? (m + 1) * A * B : e1; /* this matrix's share */
        uint64_t ra0 = (e - m * A * B) / B, ra1 = (end - 1 - m * A * B) / B + 1;
        char *dst = out + (e - off / es) * es;
        tr_cache *cc = (ra1 - ra0) * 4 < band ? tr_cache_get() : NULL;
        uint64_t base = p->off + m * mat;
        tr_band *c = cc ? tr_band_find(cc, ck, p->file, base, ra0, ra1) : NULL;
        if (!c && !tmp && !(tmp = tps_xmalloc(TR_BATCH))) { /* a read is needed */
            rc = tps_fail(ctx, TPS_E_NOMEM, "out of memory");
            break;
        }
        if (!cc) {
            rc = tr_segment(ctx, f, t, p, A, B, es, m, e, end, dst, tmp);
            e = end;
            continue;
        }
        if (!c) {
            c = &cc->b[cc->next++ % TR_SLOTS];
            uint64_t a0 = ra0, a1 = ra0 + band < A ? ra0 + band : A;
            size_t need = (size_t)((a1 - a0) * rowb);
            c->seq = 0; /* empty until filled */
            if (c->cap < need) {
                free(c->buf);
                c->buf = tps_xmalloc(need);
                c->cap = c->buf ? need : 0;
            }
            rc = c->buf ? tr_segment(ctx, f, t, p, A, B, es, m, m * A * B + a0 * B,
                                     m * A * B + a1 * B, c->buf, tmp)
                        : tps_fail(ctx, TPS_E_NOMEM, "out of memory");
            if (rc) break;
            *c = (tr_band){ck->seq, p->file, base, a0, a1, c->buf, c->cap};
        }
        memcpy(dst, c->buf + (e - m * A * B - c->a0 * B) * es, (size_t)((end - e) * es));
        e = end;
    }
    free(tmp);
    return rc;
}

tps_err tps_ckpt_read_piece_at(tps_ctx *ctx, const tps_ckpt *ck, const tps_ctensor *t,
                               const tps_piece *p, uint64_t off, void *buf, size_t len)
{
    const tps_cfile *f = &ck->files[p->file];
    if (p->tr) return read_transposed(ctx, ck, t, p, off, buf, len);
    if (p->rep_n) return read_refined(ctx, ck, t, p, off, buf, len);
    if (p->run) {
        /* runs `stride` apart in the file (concatenated along the last dim) */
        char *out = buf;
        while (len) {
            uint64_t k = off / p->run, w = off % p->run;
            size_t n = (size_t)(p->run - w < len ? p->run - w : len);
            TPS_TRY(tps_pread_full(ctx, f->fd, f->path, out, n, p->off + k * p->stride + w));
            out += n;
            off += n;
            len -= n;
        }
        return TPS_OK;
    }
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

/* A refined replica (a scale piece on vLLM's refined grid overlapping the
 * primaries' rows): its rows, read back, equal the tensor's as the
 * primaries hold them; else an error naming the file, the tensor and the
 * rank (what: appended to it). */
tps_err tps_ckpt_refined_same(tps_ctx *ctx, const tps_ckpt *ck, size_t i, const tps_piece *pc,
                              const char *what)
{
    const tps_ctensor *t = &ck->t[i];
    size_t es = tps_dtype_bits(t->dtype) / 8;
    uint64_t rows = t->dim == 0 ? pc->hi - pc->lo : t->shape[0];
    uint64_t cols = t->dim == 1 ? pc->hi - pc->lo : t->shape[1], n = rows * cols * es;
    unsigned char *a = tps_xmalloc((size_t)n + 1), *b = tps_xmalloc((size_t)n + 1);
    tps_err rc = a && b ? TPS_OK : tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    if (!rc) rc = tps_ckpt_read_piece_at(ctx, ck, t, pc, 0, a, (size_t)n);
    if (!rc && t->dim == 0)
        rc = tps_ckpt_read(ctx, ck, i, pc->lo * t->shape[1] * es, b, (size_t)n);
    for (uint64_t r = 0; !rc && t->dim == 1 && r < rows; r++)
        rc = tps_ckpt_read(ctx, ck, i, (r * t->shape[1] + pc->lo) * es, b + r * cols * es,
                           (size_t)(cols * es));
    if (!rc && memcmp(a, b, (size_t)n))
        rc = tps_fail(ctx, TPS_E_MISMATCH,
                      "%s: tensor '%s': rows [%llu, %llu) of rank %d's refined scale differ from "
                      "the ranks that hold them as their own%s",
                      ck->files[pc->file].path, t->name, (unsigned long long)pc->lo,
                      (unsigned long long)pc->hi, pc->rank, what);
    free(a);
    free(b);
    return rc;
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

/* Whole rows [o0, o1) of a tensor cut along a dim with more than one piece
 * across a row (the view of find_piece): each piece's slices of those rows
 * are consecutive bytes of the piece, read in batches and scattered to
 * their columns, where one read a row and piece was 34M preads to merge a
 * DeepSeek-V3-shaped checkpoint's experts (their down_proj cut by columns).
 * A batch is at most tps_read_rows_batch bytes of a piece (one row at least).
 * *done 0: the row is not tiled by pieces (the caller's loop says which
 * rank is missing). */
size_t tps_read_rows_batch = 1u << 20;

static tps_err read_rows(tps_ctx *ctx, const tps_ckpt *ck, size_t i, uint64_t row, uint64_t o0,
                         uint64_t o1, uint64_t inner_bits, char *out, int *done)
{
    const tps_ctensor *t = &ck->t[i];
    *done = 0;
    uint64_t w, most = 0;
    for (w = 0; w < row;) {
        uint64_t poff, run;
        int p = find_piece(t, o0 * row + w, &poff, &run);
        if (p < 0 || run == 0) return TPS_OK;
        uint64_t pw = t->pieces[p].hi * inner_bits / 8 - t->pieces[p].lo * inner_bits / 8;
        if (pw > most) most = pw;
        w += run > row - w ? row - w : run;
    }
    /* rows a batch: as many as tps_read_rows_batch holds, one at least */
    uint64_t per = most >= tps_read_rows_batch ? 1 : tps_read_rows_batch / most;
    if (per > o1 - o0) per = o1 - o0;
    char *tmp = tps_xmalloc((size_t)(per * most));
    if (!tmp) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    tps_err rc = TPS_OK;
    for (w = 0; !rc && w < row;) {
        uint64_t poff, run;
        int p = find_piece(t, o0 * row + w, &poff, &run);
        if (run > row - w) run = row - w;
        /* the piece's row o is [o * pw, (o + 1) * pw) of it; the bytes wanted
         * from it start `skip` in (pieces of a refined grid may overlap, the
         * first one holding a byte serves it, as find_piece says) */
        uint64_t plo = t->pieces[p].lo * inner_bits / 8;
        uint64_t pw = t->pieces[p].hi * inner_bits / 8 - plo, skip = w - plo;
        for (uint64_t a = o0; !rc && a < o1; a += per) {
            uint64_t b = a + per < o1 ? a + per : o1;
            rc = tps_ckpt_read_piece(ctx, ck, i, p, a * pw, tmp, (size_t)((b - a) * pw));
            for (uint64_t o = a; !rc && o < b; o++)
                memcpy(out + (o - o0) * row + w, tmp + (o - a) * pw + skip, (size_t)run);
        }
        w += run;
    }
    free(tmp);
    if (!rc) *done = 1;
    return rc;
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
    if (t->dim >= 0 && t->npieces > 1) {
        uint64_t inner_bits = tps_dtype_bits(t->dtype);
        for (int d = t->dim + 1; d < t->ndim; d++) inner_bits *= t->shape[d];
        uint64_t row = t->shape[t->dim] * inner_bits / 8;
        uint64_t o0 = row ? (off + row - 1) / row : 0, o1 = row ? (off + len) / row : 0;
        if (row && o1 >= o0 + 2) {
            /* the head of a row first, then whole rows in batches, the tail below */
            uint64_t head = o0 * row - off;
            if (head) TPS_TRY(tps_ckpt_read(ctx, ck, i, off, out, (size_t)head));
            int done;
            TPS_TRY(read_rows(ctx, ck, i, row, o0, o1, inner_bits, out + head, &done));
            if (done) {
                uint64_t mid = head + (o1 - o0) * row;
                out += mid;
                off += mid;
                len -= (size_t)mid;
            } else if (head) {
                out += head;
                off += head;
                len -= (size_t)head;
            }
        }
    }
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

uint64_t tps_ckpt_run(const tps_ckpt *ck, size_t i, uint64_t off, int *file, uint64_t *foff)
{
    const tps_ctensor *t = &ck->t[i];
    uint64_t poff, run;
    if (t->npieces == 0 || off >= t->nbytes) return 0;
    int p = find_piece(t, off, &poff, &run);
    if (p < 0 || t->pieces[p].fbytes != t->pieces[p].nbytes || t->pieces[p].tr ||
        (!t->pieces[p].rep_n && t->pieces[p].run))
        return 0;
    *file = t->pieces[p].file;
    *foff = t->pieces[p].off + poff;
    return run;
}

int tps_ckpt_locate(const tps_ckpt *ck, size_t i, uint64_t off, uint64_t len, int *file,
                    uint64_t *foff)
{
    const tps_ctensor *t = &ck->t[i];
    uint64_t poff, run;
    if (t->npieces == 0 || off + len > t->nbytes || off + len < off || len == 0) return 0;
    int p = find_piece(t, off, &poff, &run);
    if (p < 0 || run < len || t->pieces[p].fbytes != t->pieces[p].nbytes || t->pieces[p].rep_n ||
        t->pieces[p].run || t->pieces[p].tr)
        return 0;
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
