/* provenance.c - the bytes a manifest vouches for beyond the tensors: each
 * rank file's header (check, verify, merge and a reshard read their
 * DTensor placements and shapes from it), and the source the directory was
 * split from (verify --source). */
#include "provenance.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHUNK (4u << 20)

/* A JSON number that is a whole value in [lo, hi]. */
static int whole(const cJSON *v, double lo, double hi, uint64_t *out)
{
    if (!cJSON_IsNumber(v) || v->valuedouble < lo || v->valuedouble > hi ||
        v->valuedouble != (double)(uint64_t)v->valuedouble)
        return 0;
    *out = (uint64_t)v->valuedouble;
    return 1;
}

tps_err tps_prov_rank_header(tps_ctx *ctx, const char *mpath, const char *path, const cJSON *fe,
                             int *recorded)
{
    *recorded = 0;
    const cJSON *hb = cJSON_GetObjectItemCaseSensitive(fe, TPS_PROV_HEADER_BYTES);
    const cJSON *hc = cJSON_GetObjectItemCaseSensitive(fe, TPS_PROV_HEADER_CRC);
    const cJSON *by = cJSON_GetObjectItemCaseSensitive(fe, "bytes");
    if (!hb && !hc) return TPS_OK;
    uint64_t n, crc, size;
    if (!whole(hb, 8, 8.0 + 100000000.0, &n) || !whole(hc, 0, 4294967295.0, &crc) ||
        !whole(by, 0, 9007199254740992.0, &size))
        return tps_fail(ctx, TPS_E_JSON,
                        "%s: the files[] entry of %s needs %s (8 .. 8 + 100,000,000), %s (a "
                        "CRC32) and bytes, all whole numbers",
                        mpath, path, TPS_PROV_HEADER_BYTES, TPS_PROV_HEADER_CRC);
    *recorded = 1;
    tps_err rc = TPS_OK;
    char *buf = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    TPS_FAIL_IF(fd < 0, ctx, TPS_E_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    TPS_FAIL_IF(fstat(fd, &sb) != 0, ctx, TPS_E_IO, "%s: stat: %s", path, strerror(errno));
    TPS_FAIL_IF((uint64_t)sb.st_size < n, ctx, TPS_E_MISMATCH,
                "%s: the header changed: the file is %llu bytes, shorter than the %llu-byte "
                "header the manifest records",
                path, (unsigned long long)sb.st_size, (unsigned long long)n);
    buf = tps_xmalloc((size_t)n);
    TPS_FAIL_IF(!buf, ctx, TPS_E_NOMEM, "%s: out of memory for a %llu-byte header", path,
                (unsigned long long)n);
    TPS_CHECK(tps_pread_full(ctx, fd, path, buf, (size_t)n, 0));
    uint32_t got = tps_crc32(0, buf, (size_t)n);
    TPS_FAIL_IF(got != (uint32_t)crc, ctx, TPS_E_MISMATCH,
                "%s: the header changed: CRC32 0x%08x of its %llu header bytes (length, JSON "
                "with __metadata__, padding) does not match the manifest's 0x%08x",
                path, got, (unsigned long long)n, (unsigned)crc);
    TPS_FAIL_IF((uint64_t)sb.st_size != size, ctx, TPS_E_MISMATCH,
                "%s: the file is %llu bytes, the manifest records %llu (the file changed)", path,
                (unsigned long long)sb.st_size, (unsigned long long)size);
out:
    if (fd >= 0) close(fd);
    free(buf);
    return rc;
}

/* ------------------------------------------------------------------ the source */

/* The size of source file `name` as c knows it: its own file's, or (c a
 * sharded directory) what its manifest records. */
static int origin_size(const tps_ckpt *c, const char *name, uint64_t *size)
{
    if (c->kind != TPS_SRC_SHARDED) {
        for (size_t k = 0; k < c->nfiles; k++)
            if (!strcmp(c->files[k].name, name)) return *size = c->files[k].size, 1;
        return 0;
    }
    const cJSON *sf = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(c->manifest, "source"), "files");
    for (const cJSON *f = sf ? sf->child : NULL; f; f = f->next) {
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (cJSON_IsString(nm) && !strcmp(nm->valuestring, name))
            return whole(cJSON_GetObjectItemCaseSensitive(f, TPS_PROV_SOURCE_BYTES), 0,
                         9007199254740992.0, size);
    }
    return 0;
}

static int has_origin(const tps_ckpt *c, const char *name)
{
    for (size_t k = 0; k < c->norigins; k++)
        if (!strcmp(c->origins[k], name)) return 1;
    return 0;
}

static void shape_str(const tps_ctensor *t, char *buf, size_t len)
{
    size_t o = (size_t)snprintf(buf, len, "%s [", tps_dtype_name(t->dtype));
    for (int d = 0; d < t->ndim && o < len; d++)
        o += (size_t)snprintf(buf + o, len - o, "%s%llu", d ? ", " : "", (unsigned long long)t->shape[d]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

/* The header text of source file `name` as c holds it, as its CRC32 and
 * length (the text itself may be let go by now:
 * tps_ckpt_release_origin_headers); 0 when c has none. */
static int header_sum(const tps_ckpt *c, const char *name, struct tps_hsum *out)
{
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(c->origin_header, name);
    if (cJSON_IsString(h)) {
        size_t n = strlen(h->valuestring);
        *out = (struct tps_hsum){tps_crc32(0, h->valuestring, n), n, 1};
        return 1;
    }
    for (size_t k = 0; c->origin_hsum && k < c->norigins; k++)
        if (c->origin_hsum[k].gone && !strcmp(c->origins[k], name)) {
            *out = c->origin_hsum[k];
            return 1;
        }
    return 0;
}

tps_err tps_prov_source(tps_ctx *ctx, const tps_ckpt *ck, const tps_ckpt *src)
{
    /* One source file each side (split model.safetensors, verify a copy
     * under another name): the two are paired whatever their names. */
    int one = ck->norigins == 1 && src->norigins == 1;
#define NOT_SPLIT_FROM(...)                                                                         \
    do {                                                                                            \
        char why_[1024];                                                                            \
        snprintf(why_, sizeof why_, __VA_ARGS__);                                                   \
        return tps_fail(ctx, TPS_E_MISMATCH,                                                        \
                        "verify: %s is not the checkpoint %s was split from (its manifest records " \
                        "the source): %s",                                                          \
                        src->path, ck->path, why_);                                                 \
    } while (0)
    for (size_t k = 0; !one && k < ck->norigins; k++)
        if (!has_origin(src, ck->origins[k]))
            NOT_SPLIT_FROM("the source file %s is not there", ck->origins[k]);
    for (size_t k = 0; !one && k < src->norigins; k++)
        if (!has_origin(ck, src->origins[k]))
            NOT_SPLIT_FROM("it holds %s, which the manifest does not list among the %zu source "
                           "file%s",
                           src->origins[k], ck->norigins, ck->norigins == 1 ? "" : "s");
    /* Every tensor the directory holds from the source, as the source has it. */
    for (size_t i = 0; i < ck->n; i++) {
        const tps_ctensor *t = &ck->t[i];
        if (t->derived_from) continue; /* --untie: written from its embedding */
        int j = tps_ckpt_find(src, t->name);
        if (j < 0) NOT_SPLIT_FROM("tensor '%s' (in %s) is not there", t->name, t->origin);
        const tps_ctensor *s = &src->t[j];
        int same = s->dtype == t->dtype && s->ndim == t->ndim;
        for (int d = 0; same && d < t->ndim; d++) same = s->shape[d] == t->shape[d];
        if (!same) {
            char a[160], b[160];
            shape_str(t, a, sizeof a);
            shape_str(s, b, sizeof b);
            NOT_SPLIT_FROM("tensor '%s' is %s in the manifest, %s in %s", t->name, a, b,
                           s->origin ? s->origin : "the source");
        }
        if (!one && t->origin && s->origin && strcmp(t->origin, s->origin))
            NOT_SPLIT_FROM("tensor '%s' is in %s, the manifest says %s", t->name, s->origin,
                           t->origin);
    }
    /* Every source tensor is the manifest's, or one it records as left out. */
    for (size_t j = 0; j < src->n; j++) {
        if (tps_ckpt_find(ck, src->t[j].name) >= 0) continue;
        if (!tps_ckpt_dropped(ck, src->t[j].name))
            NOT_SPLIT_FROM("it holds tensor '%s' (in %s), which the manifest does not list",
                           src->t[j].name, src->t[j].origin ? src->t[j].origin : "the source");
    }
    /* Each file: its size (manifests record it since they record header
     * CRCs) and its header, which the manifest holds verbatim. */
    for (size_t k = 0; k < ck->norigins; k++) {
        const char *name = ck->origins[k], *sname = one ? src->origins[0] : name;
        uint64_t want, got;
        if (origin_size(ck, name, &want) && origin_size(src, sname, &got) && want != got)
            NOT_SPLIT_FROM("%s is %llu bytes, the manifest records %llu", sname,
                           (unsigned long long)got, (unsigned long long)want);
        struct tps_hsum a, b;
        if (header_sum(ck, name, &a) && header_sum(src, sname, &b) &&
            (a.len != b.len || a.crc != b.crc))
            NOT_SPLIT_FROM("the header of %s (its __metadata__ or tensor offsets) differs from the "
                           "one the manifest records",
                           sname);
    }
#undef NOT_SPLIT_FROM
    return TPS_OK;
}

typedef struct {
    size_t i;
    uint64_t nbytes;
} by_size;

static int by_size_cmp(const void *a, const void *b)
{
    const by_size *x = a, *y = b;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* The source bytes of a piece are one run of the source tensor: the whole
 * tensor (Replicate) or rows [lo, hi) of dim 0, in the tensor's own dtype. */
static int contiguous_piece(const tps_ctensor *t, const tps_piece *pc, uint64_t *off)
{
    if (!pc->has_crc || pc->stored != t->dtype || pc->fbytes != pc->nbytes || pc->rep_n ||
        pc->tr)
        return 0;
    if (t->dim < 0) return *off = 0, pc->nbytes == t->nbytes;
    if (t->dim != 0 || !t->ndim || !t->shape[0] || t->nbytes % t->shape[0]) return 0;
    uint64_t row = t->nbytes / t->shape[0];
    *off = pc->lo * row;
    return pc->hi >= pc->lo && pc->hi <= t->shape[0] && (pc->hi - pc->lo) * row == pc->nbytes;
}

tps_err tps_prov_source_sample(tps_ctx *ctx, const tps_ckpt *ck, const tps_ckpt *src,
                               uint64_t budget)
{
    tps_err rc = TPS_OK;
    by_size *ord = tps_xcalloc(ck->n ? ck->n : 1, sizeof *ord);
    char *buf = NULL;
    TPS_FAIL_IF(!ord, ctx, TPS_E_NOMEM, "out of memory");
    for (size_t i = 0; i < ck->n; i++) ord[i] = (by_size){i, ck->t[i].nbytes};
    qsort(ord, ck->n, sizeof *ord, by_size_cmp);
    uint64_t used = 0;
    for (size_t k = 0; k < ck->n && used < budget; k++) {
        const tps_ctensor *t = &ck->t[ord[k].i];
        int j = tps_ckpt_find(src, t->derived_from ? t->derived_from : t->name);
        if (j < 0 || src->t[j].nbytes != t->nbytes) continue; /* tps_prov_source said so */
        for (int p = 0; p < t->npieces && used < budget; p++) {
            const tps_piece *pc = &t->pieces[p];
            uint64_t off;
            if (!contiguous_piece(t, pc, &off)) continue;
            if (!buf) buf = tps_xmalloc(CHUNK);
            TPS_FAIL_IF(!buf, ctx, TPS_E_NOMEM, "out of memory");
            uint32_t c = 0;
            for (uint64_t a = 0; a < pc->nbytes; a += CHUNK) {
                size_t len = (size_t)(pc->nbytes - a < CHUNK ? pc->nbytes - a : CHUNK);
                TPS_CHECK(tps_ckpt_read(ctx, src, (size_t)j, off + a, buf, len));
                c = tps_crc32(c, buf, len);
            }
            used += pc->nbytes;
            char rows[96] = "";
            if (t->dim == 0)
                snprintf(rows, sizeof rows, " (rows [%llu, %llu), rank %d's shard)",
                         (unsigned long long)pc->lo, (unsigned long long)pc->hi, pc->rank);
            TPS_FAIL_IF(c != pc->crc, ctx, TPS_E_MISMATCH,
                        "verify: %s is not the checkpoint %s was split from (its manifest "
                        "records the source): tensor '%s' differs: its bytes%s have CRC32 "
                        "0x%08x there, the manifest records 0x%08x",
                        src->path, ck->path, src->t[j].name, rows, c, pc->crc);
            if (t->dim < 0) break; /* every rank holds the same bytes */
        }
    }
out:
    free(ord);
    free(buf);
    return rc;
}

tps_err tps_prov_tensor_intact(tps_ctx *ctx, const tps_ckpt *ck, size_t i, int *same)
{
    const tps_ctensor *t = &ck->t[i];
    *same = 1;
    char *buf = NULL;
    tps_err rc = TPS_OK;
    for (int p = 0; p < t->npieces + t->nreplicas && *same; p++) {
        const tps_piece *pc = p < t->npieces ? &t->pieces[p] : &t->replicas[p - t->npieces];
        if (!pc->has_crc) {
            *same = 0;
            break;
        }
        if (!buf) buf = tps_xmalloc(CHUNK);
        TPS_FAIL_IF(!buf, ctx, TPS_E_NOMEM, "out of memory");
        uint32_t c = 0;
        for (uint64_t off = 0; off < pc->nbytes; off += CHUNK) {
            size_t len = (size_t)(pc->nbytes - off < CHUNK ? pc->nbytes - off : CHUNK);
            TPS_CHECK(tps_ckpt_read_piece_at(ctx, ck, t, pc, off, buf, len));
            c = tps_crc32(c, buf, len);
        }
        *same = c == pc->crc;
    }
out:
    free(buf);
    return rc;
}
