/* checkmerge.c - prove a shard directory intact without the source (check),
 * and give back the full checkpoint in its original layout (merge). */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define CHUNK (8u << 20)

static tps_err open_sharded_dir(tps_ctx *ctx, const char *dir, tps_ckpt **ck)
{
    char *m = tps_path_join(dir, TPS_MANIFEST);
    int there = m && tps_exists(m);
    free(m);
    if (!there)
        return tps_fail(ctx, TPS_E_IO, "%s: not a tpshard output directory (no %s)", dir, TPS_MANIFEST);
    TPS_TRY(tps_ckpt_open_path(ctx, dir, ck));
    tps_ckpt_drop_file_tables(*ck); /* check and merge read the pieces alone */
    return TPS_OK;
}

/* "1,2,5": the ranks with no file here, into buf; returns how many are present. */
static int missing_ranks(const tps_ckpt *ck, char *buf, size_t len)
{
    size_t ml = 0;
    int present = 0;
    buf[0] = 0;
    for (int r = 0; r < ck->nranks; r++) {
        if (ck->rank_present[r]) {
            present++;
            continue;
        }
        int w = snprintf(buf + ml, len - ml, "%s%d", ml ? "," : "", r);
        if (w > 0 && ml + (size_t)w < len) ml += (size_t)w;
    }
    return present;
}

/* Pieces and replicas of a tensor, numbered together: p < npieces are the
 * pieces, the rest the replicas. */
static int all_pieces(const tps_ctensor *t)
{
    return t->npieces + t->nreplicas;
}
static const tps_piece *piece_n(const tps_ctensor *t, int p)
{
    return p < t->npieces ? &t->pieces[p] : &t->replicas[p - t->npieces];
}

/* A piece's bytes [off, off + len) (a chunk of a large piece, its CRC in
 * crc), or (group) pieces [piece, end) of a tensor whole, each smaller than
 * a chunk, their CRCs written to the pieces' own slots: a MoE's hundreds of
 * thousands of small pieces are a few thousand tasks. */
typedef struct {
    size_t t;
    int piece, end, group;
    uint64_t off, len;
    uint32_t crc;
} crc_task;

/* CRC32 of every piece, chunks in parallel, joined with crc32_combine. */
static tps_err crc_pieces(tps_ctx *ctx, const tps_ckpt *ck, uint32_t **out_crc, size_t **out_base,
                          uint64_t *bytes)
{
    size_t ntask = 0, npieces = 0;
    for (size_t i = 0; i < ck->n; i++)
        for (int p = 0; p < all_pieces(&ck->t[i]); p++) {
            uint64_t n = piece_n(&ck->t[i], p)->nbytes;
            ntask += n >= CHUNK ? n / CHUNK + 1 : 1; /* at most: groups are fewer */
            npieces++;
        }
    size_t *base = tps_xcalloc(ck->n + 1, sizeof *base);
    uint32_t *crc = tps_xcalloc(npieces, sizeof *crc);
    crc_task *T = NULL;
    size_t k = 0, pc = 0;
    /* two passes: count the tasks, then make them */
    for (int pass = 0; pass < 2; pass++) {
        if (pass) {
            T = tps_xcalloc(k ? k : 1, sizeof *T);
            if (!T || !base || !crc) {
                free(T);
                free(base);
                free(crc);
                return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
            }
        }
        size_t nk = 0;
        pc = 0;
        for (size_t i = 0; i < ck->n; i++) {
            if (pass) base[i] = pc;
            int np = all_pieces(&ck->t[i]);
            for (int p = 0; p < np;) {
                uint64_t n = piece_n(&ck->t[i], p)->nbytes;
                if (n >= CHUNK) {
                    for (uint64_t a = 0; a < n; a += CHUNK) {
                        uint64_t len = n - a < CHUNK ? n - a : CHUNK;
                        if (pass) T[nk] = (crc_task){.t = i, .piece = p, .end = p + 1, .off = a, .len = len};
                        nk++;
                    }
                    p++;
                    pc++;
                    continue;
                }
                int e = p;
                uint64_t sum = 0;
                while (e < np && piece_n(&ck->t[i], e)->nbytes < CHUNK && sum < CHUNK)
                    sum += piece_n(&ck->t[i], e++)->nbytes;
                if (pass) T[nk] = (crc_task){.t = i, .piece = p, .end = e, .group = 1, .len = sum};
                nk++;
                pc += (size_t)(e - p);
                p = e;
            }
        }
        k = nk;
    }
    (void)ntask;
    base[ck->n] = pc;
    volatile int failed = 0;
    tps_err err = TPS_OK;
    uint64_t total = 0;
#pragma omp parallel num_threads(tps_threads(ctx)) reduction(+ : total)
    {
        char *buf = tps_xmalloc(CHUNK);
#pragma omp for schedule(dynamic, 1)
        for (size_t j = 0; j < k; j++) {
            if (failed || !buf || ctx->interrupted) {
#pragma omp critical
                if (!failed) {
                    err = !buf ? tps_fail(ctx, TPS_E_NOMEM, "out of memory")
                               : tps_fail(ctx, TPS_E_INTERRUPTED, "interrupted");
                    failed = 1;
                }
                continue;
            }
            const tps_ctensor *t = &ck->t[T[j].t];
            tps_err rc = TPS_OK;
            for (int p = T[j].piece; !rc && p < T[j].end; p++) {
                const tps_piece *pp = piece_n(t, p);
                uint64_t len = T[j].group ? pp->nbytes : T[j].len;
                rc = tps_ckpt_read_piece_at(ctx, ck, t, pp, T[j].off, buf, (size_t)len);
                if (rc) break;
                uint32_t c = tps_crc32(0, buf, (size_t)len);
                if (T[j].group) crc[base[T[j].t] + (size_t)p] = c;
                else T[j].crc = c;
            }
            if (rc) {
#pragma omp critical
                if (!failed) {
                    err = rc;
                    failed = 1;
                }
                continue;
            }
            total += T[j].len;
        }
        free(buf);
    }
    /* a large piece's chunks joined in order */
    for (size_t j = 0; !failed && j < k;) {
        if (T[j].group) {
            j++;
            continue;
        }
        uint32_t c = 0;
        size_t t = T[j].t;
        int p = T[j].piece;
        do {
            c = (uint32_t)crc32_combine(c, T[j].crc, (z_off_t)T[j].len);
            j++;
        } while (j < k && !T[j].group && T[j].t == t && T[j].piece == p && T[j].off != 0);
        crc[base[t] + (size_t)p] = c;
    }
    free(T);
    if (failed) {
        free(base);
        free(crc);
        return err;
    }
    *out_crc = crc;
    *out_base = base;
    *bytes = total;
    return TPS_OK;
}

/* Bytes [a, a + len) of rank tensor rt are zero padding or the engine's
 * constant el (es bytes an element, counted from the tensor's start). */
static tps_err fill_bytes(tps_ctx *ctx, const tps_ckpt *ck, const tps_crtensor *rt,
                          const tps_fill *fl, const unsigned char *el, size_t es, uint64_t a0,
                          uint64_t n, char *buf)
{
    const tps_cfile *f = &ck->files[rt->file];
    for (uint64_t a = 0; a < n; a += CHUNK) {
        size_t len = (size_t)(n - a < CHUNK ? n - a : CHUNK);
        TPS_TRY(tps_pread_full(ctx, f->fd, f->path, buf, len, rt->off + a0 + a));
        for (size_t b = 0; b < len; b++) {
            unsigned char want = fl->kind == TPS_FILL_ZEROS ? 0 : el[(a0 + a + b) % es];
            if ((unsigned char)buf[b] != want)
                return tps_fail(ctx, TPS_E_MISMATCH,
                                "%s: tensor '%s': byte %llu is 0x%02x, but the manifest says it "
                                "is %s",
                                f->path, rt->name, (unsigned long long)(a0 + a + b),
                                (unsigned char)buf[b],
                                fl->kind == TPS_FILL_ZEROS ? "zero padding" : "the engine's constant");
        }
    }
    return TPS_OK;
}

/* A serving layout's rank tensors: every byte is a source piece the
 * manifest lists (CRC-checked above), zero padding, or the engine's constant
 * entries, each exactly once. Pieces follow each other, or (concatenated
 * along the last dim: strided) interleave their runs; then a map of the
 * tensor's bytes says which are accounted for. */
tps_err tps_check_fills(tps_ctx *ctx, const tps_ckpt *ck)
{
    char *buf = NULL;
    unsigned char *seen = NULL;
    tps_err rc = TPS_OK;
    for (size_t k = 0; k < ck->nrts; k++) {
        const tps_crtensor *rt = &ck->rts[k];
        if (rt->file < 0) continue;
        const char *fname = ck->files[rt->file].path;
        int strided = 0;
        for (size_t j = 0; j < rt->nfills; j++) {
            tps_fill f;
            tps_crt_fill(rt, j, &f);
            strided |= f.run != 0;
        }
        free(seen);
        seen = NULL;
        if (strided) {
            seen = tps_xcalloc((size_t)(rt->nbytes / 8 + 1), 1);
            TPS_FAIL_IF(!seen, ctx, TPS_E_NOMEM, "out of memory");
        }
        uint64_t at = 0;
        for (size_t j = 0; j < rt->nfills; j++) {
            tps_fill fv;
            /* a piece of the manifest's tensors stands for it: matched when read */
            const tps_piece *matched = tps_crt_fill(rt, j, &fv);
            const tps_fill *fl = &fv;
            uint64_t run = fl->run ? fl->run : fl->nbytes, stride = fl->run ? fl->stride : fl->nbytes;
            uint64_t nrun = run ? fl->nbytes / run : 0;
            if (!strided) {
                TPS_FAIL_IF(fl->at != at, ctx, TPS_E_MISMATCH,
                            "%s: tensor '%s': the manifest accounts for its bytes from %llu, not %llu",
                            fname, rt->name, (unsigned long long)fl->at, (unsigned long long)at);
                at += fl->nbytes;
                TPS_FAIL_IF(at > rt->nbytes, ctx, TPS_E_MISMATCH,
                            "%s: tensor '%s': the manifest accounts for more bytes than it has",
                            fname, rt->name);
            } else {
                TPS_FAIL_IF(nrun && (fl->at > rt->nbytes || (nrun - 1) * stride + run >
                                     rt->nbytes - fl->at),
                            ctx, TPS_E_MISMATCH,
                            "%s: tensor '%s': the manifest puts a piece past its end", fname,
                            rt->name);
                for (uint64_t r = 0; r < nrun; r++)
                    for (uint64_t b = fl->at + r * stride, e = b + run; b < e; b++) {
                        TPS_FAIL_IF(seen[b / 8] >> (b % 8) & 1, ctx, TPS_E_MISMATCH,
                                    "%s: tensor '%s': the manifest accounts for byte %llu twice",
                                    fname, rt->name, (unsigned long long)b);
                        seen[b / 8] |= (unsigned char)(1u << (b % 8));
                    }
                at += fl->nbytes;
            }
            if (fl->kind == TPS_FILL_SOURCE) {
                if (matched) continue;
                int i = tps_ckpt_find(ck, fl->source), found = 0;
                for (int p = 0; i >= 0 && p < all_pieces(&ck->t[i]) && !found; p++) {
                    const tps_piece *pc = piece_n(&ck->t[i], p);
                    uint64_t prun = pc->rep_n ? 0 : pc->run, pstr = pc->rep_n ? 0 : pc->stride;
                    found = pc->file == rt->file && !strcmp(pc->holder, rt->name) &&
                            pc->at == fl->at && pc->fbytes == fl->nbytes && prun == fl->run &&
                            (!prun || pstr == fl->stride);
                }
                TPS_FAIL_IF(!found, ctx, TPS_E_MISMATCH,
                            "%s: tensor '%s': bytes [%llu, %llu) should hold a piece of '%s', which "
                            "the manifest's tensors do not list there",
                            fname, rt->name, (unsigned long long)fl->at,
                            (unsigned long long)(fl->at + (nrun ? (nrun - 1) * stride + run : 0)),
                            fl->source);
                continue;
            }
            unsigned char el[8] = {0};
            size_t es = tps_dtype_bits(rt->dtype) / 8;
            if (fl->kind == TPS_FILL_VALUE) {
                TPS_FAIL_IF(!es || es > 8 || fl->nbytes % es || run % es || stride % es, ctx,
                            TPS_E_MISMATCH,
                            "%s: tensor '%s': a constant of %s does not fill whole elements", fname,
                            rt->name, tps_dtype_name(rt->dtype));
                tps_encode_value(rt->dtype, fl->value, el);
            }
            if (!buf) buf = tps_xmalloc(CHUNK);
            TPS_FAIL_IF(!buf, ctx, TPS_E_NOMEM, "out of memory");
            for (uint64_t r = 0; r < nrun; r++)
                TPS_CHECK(fill_bytes(ctx, ck, rt, fl, el, es ? es : 1, fl->at + r * stride, run, buf));
        }
        TPS_FAIL_IF(at != rt->nbytes, ctx, TPS_E_MISMATCH,
                    "%s: tensor '%s': the manifest accounts for %llu of its %llu bytes", fname,
                    rt->name, (unsigned long long)at, (unsigned long long)rt->nbytes);
    }
out:
    free(buf);
    free(seen);
    return rc;
}

/* An untied head holds its embedding's bytes: placed alike, every rank's
 * piece of the one has the CRC32 of its piece of the other (both CRCs were
 * just found to match the bytes). */
static tps_err check_untied(tps_ctx *ctx, const tps_ckpt *ck, const uint32_t *crc,
                            const size_t *base)
{
    for (size_t i = 0; i < ck->n; i++) {
        const tps_ctensor *h = &ck->t[i];
        if (!h->derived_from) continue;
        int e = tps_ckpt_find(ck, h->derived_from); /* the manifest reader made sure it is there */
        if (e < 0 || ck->t[e].dim != h->dim) continue;
        const tps_ctensor *et = &ck->t[e];
        for (int p = 0; p < h->npieces; p++)
            for (int q = 0; q < et->npieces; q++)
                if (et->pieces[q].rank == h->pieces[p].rank)
                    TPS_TRY(crc[base[i] + (size_t)p] != crc[base[e] + (size_t)q]
                                ? tps_fail(ctx, TPS_E_MISMATCH,
                                           "%s: tensor '%s' on rank %d differs from '%s', the "
                                           "embedding the manifest says it was written from",
                                           ck->files[h->pieces[p].file].path, h->name,
                                           h->pieces[p].rank, et->name)
                                : TPS_OK);
    }
    return TPS_OK;
}

tps_err tps_check_dir(tps_ctx *ctx, const char *dir, tps_check_result *res)
{
    memset(res, 0, sizeof *res);
    tps_ckpt *ck = NULL;
    uint32_t *crc = NULL;
    size_t *base = NULL;
    tps_err rc = TPS_OK;
    TPS_CHECK(open_sharded_dir(ctx, dir, &ck));
    res->tp = ck->tp;
    res->pp = ck->pp;
    res->ranks = ck->nranks;
    res->files_checked = (int)ck->nfiles;
    res->headers_checked = (int)ck->nfiles - ck->headers_unrecorded; /* at open */
    res->ranks_present = missing_ranks(ck, res->missing_ranks, sizeof res->missing_ranks);
    res->complete = res->ranks_present == ck->nranks;
    TPS_CHECK(crc_pieces(ctx, ck, &crc, &base, &res->bytes_checked));
    for (size_t i = 0; i < ck->n; i++) {
        const tps_ctensor *t = &ck->t[i];
        for (int p = 0; p < all_pieces(t); p++) {
            const tps_piece *pc = piece_n(t, p);
            const char *fname = ck->files[pc->file].path;
            char where[320] = "";
            if (strcmp(pc->holder, t->name))
                snprintf(where, sizeof where, " (inside '%s' at byte %llu)", pc->holder,
                         (unsigned long long)pc->at);
            TPS_FAIL_IF(!pc->has_crc, ctx, TPS_E_MISMATCH,
                        "%s: tensor '%s'%s: the manifest records no CRC32 for rank %d", fname,
                        t->name, where, pc->rank);
            TPS_FAIL_IF(crc[base[i] + (size_t)p] != pc->crc, ctx, TPS_E_MISMATCH,
                        "%s: tensor '%s'%s: CRC32 0x%08x does not match the manifest's 0x%08x (the "
                        "bytes changed)",
                        fname, t->name, where, crc[base[i] + (size_t)p], pc->crc);
            if (t->dim < 0 && p > 0)
                TPS_FAIL_IF(crc[base[i] + (size_t)p] != crc[base[i]], ctx, TPS_E_MISMATCH,
                            "%s: replicated tensor '%s' differs between rank %d and rank %d", dir,
                            t->name, t->pieces[0].rank, pc->rank);
            if (p < t->npieces && pc->rep_n && t->dim >= 0 && p > 0 &&
                t->pieces[p - 1].hi > pc->lo) /* a refined primary sharing rows */
                TPS_CHECK(tps_ckpt_refined_same(ctx, ck, i, pc, ""));
            if (p >= t->npieces) { /* a replica: the same bytes as the primary of its rows */
                int q = 0;
                while (q < t->npieces && (t->pieces[q].lo != pc->lo || t->pieces[q].hi != pc->hi)) q++;
                if (q == t->npieces && pc->rep_n) {
                    TPS_CHECK(tps_ckpt_refined_same(ctx, ck, i, pc, ""));
                    continue;
                }
                TPS_FAIL_IF(q == t->npieces, ctx, TPS_E_MISMATCH,
                            "%s: tensor '%s': rank %d holds a replica of rows [%llu, %llu) that no "
                            "rank holds as its own",
                            dir, t->name, pc->rank, (unsigned long long)pc->lo,
                            (unsigned long long)pc->hi);
                TPS_FAIL_IF(crc[base[i] + (size_t)p] != crc[base[i] + (size_t)q], ctx, TPS_E_MISMATCH,
                            "%s: tensor '%s': rows [%llu, %llu) differ between rank %d and its "
                            "replica on rank %d",
                            dir, t->name, (unsigned long long)pc->lo, (unsigned long long)pc->hi,
                            t->pieces[q].rank, pc->rank);
            }
        }
        res->tensors_checked++;
    }
    TPS_CHECK(tps_check_fills(ctx, ck));
    TPS_CHECK(check_untied(ctx, ck, crc, base));
out:
    free(crc);
    free(base);
    tps_ckpt_free(ck);
    return rc;
}

/* ------------------------------------------------------------------ merge */

static tps_err same_bytes(tps_ctx *ctx, const tps_ckpt *ck, size_t i, int p, char *a, char *b)
{
    const tps_ctensor *t = &ck->t[i];
    for (uint64_t off = 0; off < t->pieces[0].nbytes; off += CHUNK / 2) {
        size_t len = (size_t)(t->pieces[0].nbytes - off < CHUNK / 2 ? t->pieces[0].nbytes - off : CHUNK / 2);
        TPS_TRY(tps_ckpt_read_piece(ctx, ck, i, 0, off, a, len));
        TPS_TRY(tps_ckpt_read_piece(ctx, ck, i, p, off, b, len));
        if (memcmp(a, b, len) != 0)
            return tps_fail(ctx, TPS_E_MISMATCH,
                            "%s: replicated tensor '%s' differs between rank %d and rank %d; refusing "
                            "to merge",
                            ck->path, t->name, t->pieces[0].rank, t->pieces[p].rank);
    }
    return TPS_OK;
}

/* Replica p of tensor i holds the same bytes as the primary of its rows. */
static tps_err same_rows(tps_ctx *ctx, const tps_ckpt *ck, size_t i, int p, char *a, char *b)
{
    const tps_ctensor *t = &ck->t[i];
    const tps_piece *r = &t->replicas[p];
    int q = 0;
    while (q < t->npieces && (t->pieces[q].lo != r->lo || t->pieces[q].hi != r->hi)) q++;
    if (q == t->npieces && r->rep_n)
        return tps_ckpt_refined_same(ctx, ck, i, r, "; refusing to merge");
    if (q == t->npieces || t->pieces[q].nbytes != r->nbytes)
        return tps_fail(ctx, TPS_E_MISMATCH,
                        "%s: tensor '%s': rank %d's replica of rows [%llu, %llu) has no primary; "
                        "refusing to merge",
                        ck->path, t->name, r->rank, (unsigned long long)r->lo,
                        (unsigned long long)r->hi);
    for (uint64_t off = 0; off < r->nbytes; off += CHUNK / 2) {
        size_t len = (size_t)(r->nbytes - off < CHUNK / 2 ? r->nbytes - off : CHUNK / 2);
        TPS_TRY(tps_ckpt_read_piece_at(ctx, ck, t, &t->pieces[q], off, a, len));
        TPS_TRY(tps_ckpt_read_piece_at(ctx, ck, t, r, off, b, len));
        if (memcmp(a, b, len) != 0)
            return tps_fail(ctx, TPS_E_MISMATCH,
                            "%s: tensor '%s': rows [%llu, %llu) differ between rank %d and its "
                            "replica on rank %d; refusing to merge",
                            ck->path, t->name, (unsigned long long)r->lo,
                            (unsigned long long)r->hi, t->pieces[q].rank, r->rank);
    }
    return TPS_OK;
}

/* The source file's own header, validated against the tensors it must
 * describe; their offsets come from it, so the file returns byte for byte. */
static tps_err original_header(tps_ctx *ctx, const tps_ckpt *ck, const char *origin, const char *text,
                               tps_st_entry *ent, const size_t *map, size_t n, char **hdr, size_t *hlen)
{
    size_t len = strlen(text);
    uint64_t data = 0;
    for (size_t k = 0; k < n; k++) data += ent[k].nbytes;
    tps_st *st = NULL;
    char *label = tps_asprintf("%s: manifest header of %s", ck->path, origin);
    tps_err rc = label ? tps_st_parse_header(ctx, label, text, len, 8 + len + data, &st) : TPS_E_NOMEM;
    free(label);
    if (rc) return rc;
    if (st->n != n) rc = tps_fail(ctx, TPS_E_MISMATCH, "%s: the recorded header of %s lists %zu tensors, the manifest %zu",
                                  ck->path, origin, st->n, n);
    /* the header's tensors by name, each of the manifest's found by bisection
     * (a linear search each was 45% of merging a 94k-tensor checkpoint) */
    tps_cfile hf = {.st = st};
    if (!rc) rc = tps_cfile_index(ctx, &hf);
    for (size_t k = 0; !rc && k < n; k++) {
        const tps_ctensor *t = &ck->t[map[k]];
        const tps_st_tensor_info *hit = tps_cfile_find(&hf, t->name);
        size_t i = hit ? (size_t)(hit - st->t) : st->n;
        int same = i < st->n && st->t[i].dtype == t->dtype && st->t[i].ndim == t->ndim;
        for (int d = 0; same && d < t->ndim; d++) same = st->t[i].shape[d] == t->shape[d];
        if (!same)
            rc = tps_fail(ctx, TPS_E_MISMATCH, "%s: tensor '%s' disagrees with the recorded header of %s",
                          ck->path, t->name, origin);
        else
            ent[k].offset = st->t[i].begin;
    }
    free(hf.byname);
    tps_st_free(st);
    if (rc) return rc;
    *hdr = tps_xmalloc(8 + len);
    if (!*hdr) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    for (int b = 0; b < 8; b++) (*hdr)[b] = (char)(((uint64_t)len >> (8 * b)) & 0xFF);
    memcpy(*hdr + 8, text, len);
    *hlen = 8 + len;
    return TPS_OK;
}

/* Bytes [off, off + *len) of tensor k, at out_off of the merged file, by the
 * kernel where K allows (*done; *len cut to the run that lies in one rank
 * file, and where clones share blocks to end on a source block). */
static tps_err merge_kcopy(tps_ctx *ctx, const tps_ckpt *ck, tps_kcopy *K, size_t i, uint64_t off,
                           size_t *len, int fd, const char *final, uint64_t out_off, int *done)
{
    int file;
    uint64_t foff, run = tps_ckpt_run(ck, i, off, &file, &foff);
    *done = 0;
    /* a row's slice of a strided piece is copied with its neighbours below */
    if (run < (64u << 10) || K->mode == TPS_KC_USER) return TPS_OK;
    if (run < *len) *len = (size_t)run;
    if (K->mode == TPS_KC_CLONE && (foff + *len) % K->blk < *len) *len -= (foff + *len) % K->blk;
    return tps_kcopy_range(ctx, K, ck->files[file].fd, ck->files[file].path, foff, fd, final,
                           out_off, *len, done);
}

static tps_err merge_file(tps_ctx *ctx, const tps_ckpt *ck, const char *origin, const char *out_dir,
                          tps_kcopy *K)
{
    tps_err rc = TPS_OK;
    size_t n = 0;
    tps_st_entry *ent = tps_xcalloc(ck->n, sizeof *ent);
    size_t *map = tps_xcalloc(ck->n, sizeof *map);
    const char **mk = NULL, **mv = NULL;
    char *hdr = NULL, *final = tps_path_join(out_dir, origin), *tmp = NULL;
    int fd = -1;
    TPS_FAIL_IF(!ent || !map || !final, ctx, TPS_E_NOMEM, "out of memory");
    tmp = tps_tmp_name(final);
    for (size_t i = 0; i < ck->n; i++) {
        const tps_ctensor *t = &ck->t[i];
        if (strcmp(t->origin, origin) != 0 || t->derived_from) continue;
        map[n] = i;
        ent[n++] = (tps_st_entry){.name = t->name, .dtype = t->dtype, .ndim = t->ndim,
                                  .shape = t->shape, .nbytes = t->nbytes};
    }
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(ck->origin_meta, origin);
    size_t nm = md ? (size_t)cJSON_GetArraySize(md) : 0;
    mk = tps_xcalloc(nm, sizeof *mk);
    mv = tps_xcalloc(nm, sizeof *mv);
    TPS_FAIL_IF(!mk || !mv || !tmp, ctx, TPS_E_NOMEM, "out of memory");
    size_t j = 0;
    for (const cJSON *c = md ? md->child : NULL; c; c = c->next)
        if (cJSON_IsString(c)) {
            mk[j] = c->string;
            mv[j++] = c->valuestring;
        }
    size_t hlen;
    const cJSON *orig = cJSON_GetObjectItemCaseSensitive(ck->origin_header, origin);
    /* a file that lost tensors to the layout has a header of its own now */
    for (const cJSON *d = ck->dropped ? ck->dropped->child : NULL; d && orig; d = d->next) {
        const cJSON *sf = cJSON_GetObjectItemCaseSensitive(d, "source_file");
        if (!cJSON_IsString(sf) || !strcmp(sf->valuestring, origin)) orig = NULL;
    }
    if (cJSON_IsString(orig)) TPS_CHECK(original_header(ctx, ck, origin, orig->valuestring, ent, map, n, &hdr, &hlen));
    else TPS_CHECK(tps_st_build_header(ctx, ent, n, mk, mv, j, &hdr, &hlen));
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    TPS_FAIL_IF(fd < 0, ctx, TPS_E_IO, "%s: cannot create: %s", tmp, strerror(errno));
    TPS_CHECK(tps_pwrite_full(ctx, fd, final, hdr, hlen, 0));
    volatile int failed = 0;
    tps_err err = TPS_OK;
#pragma omp parallel num_threads(tps_threads(ctx))
    {
        char *buf = tps_xmalloc(CHUNK);
#pragma omp for schedule(dynamic, 1)
        for (size_t k = 0; k < n; k++) {
            if (failed) continue;
            tps_err e = buf ? TPS_OK : tps_fail(ctx, TPS_E_NOMEM, "out of memory");
            const tps_ctensor *t = &ck->t[map[k]];
            for (uint64_t off = 0; !e && off < t->nbytes;) {
                size_t len = (size_t)(t->nbytes - off < CHUNK ? t->nbytes - off : CHUNK);
                int done = 0;
                e = ctx->interrupted ? tps_fail(ctx, TPS_E_INTERRUPTED, "interrupted")
                                     : merge_kcopy(ctx, ck, K, map[k], off, &len, fd, final,
                                                   hlen + ent[k].offset + off, &done);
                if (!e && !done) e = tps_ckpt_read(ctx, ck, map[k], off, buf, len);
                if (!e && !done) e = tps_pwrite_full(ctx, fd, final, buf, len, hlen + ent[k].offset + off);
                off += len;
            }
            if (e) {
#pragma omp critical
                if (!failed) {
                    err = e;
                    failed = 1;
                }
            }
        }
        free(buf);
    }
    if (failed) {
        rc = err;
        goto out;
    }
    TPS_FAIL_IF(fsync(fd) != 0, ctx, errno == ENOSPC ? TPS_E_NOSPACE : TPS_E_IO, "%s: fsync: %s",
                final, strerror(errno));
    int cr = close(fd);
    fd = -1;
    TPS_FAIL_IF(cr != 0, ctx, TPS_E_IO, "%s: close: %s", final, strerror(errno));
    TPS_FAIL_IF(rename(tmp, final) != 0, ctx, TPS_E_IO, "%s: rename: %s", final, strerror(errno));
out:
    if (fd >= 0) close(fd);
    if (rc && tmp) unlink(tmp);
    free(ent);
    free(map);
    free(mk);
    free(mv);
    free(hdr);
    free(final);
    free(tmp);
    return rc;
}

/* The index, as cJSON_Print lays it out, its weight_map written entry by
 * entry: a tree of DeepSeek-V3's 92k entries took 20 MB more. */
struct index_fill {
    const tps_ckpt *ck;
    const char *head; /* cJSON's text of the index without its weight_map */
    size_t hl;
};

static const char empty_tail[] = "\n\t}\n}"; /* how cJSON_Print ends an empty last member */

static tps_err index_put(void *u, tps_sbuf *b)
{
    const struct index_fill *F = u;
    const tps_ckpt *ck = F->ck;
    tps_sb_put(b, F->head, F->hl);
    int first = 1;
    for (size_t i = 0; i < ck->n; i++) {
        if (ck->t[i].derived_from) continue;
        tps_sb_puts(b, first ? "\n\t\t" : ",\n\t\t");
        tps_json_quote(ck->t[i].name, tps_sb_sink, b);
        tps_sb_puts(b, ":\t");
        tps_json_quote(ck->t[i].origin, tps_sb_sink, b);
        first = 0;
    }
    tps_sb_puts(b, empty_tail);
    return TPS_OK;
}

/* The source's index as cJSON_Print lays it out (tabs), its weight_map
 * streamed to the file (7 MB of text at DeepSeek-V3's 92k tensors). */
static tps_err write_index(tps_ctx *ctx, const tps_ckpt *ck, const char *out_dir)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = ck->index_meta ? cJSON_Duplicate(ck->index_meta, 1) : cJSON_CreateObject();
    uint64_t total = 0;
    for (size_t i = 0; i < ck->n; i++)
        if (!ck->t[i].derived_from) total += ck->t[i].nbytes;
    cJSON_DeleteItemFromObjectCaseSensitive(meta, "total_size");
    cJSON_AddNumberToObject(meta, "total_size", (double)total);
    cJSON_AddItemToObject(root, "metadata", meta);
    cJSON_AddObjectToObject(root, "weight_map");
    char *head = cJSON_Print(root);
    cJSON_Delete(root);
    if (!head) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    size_t hl = strlen(head), tl = sizeof empty_tail - 1;
    if (hl < tl || strcmp(head + hl - tl, empty_tail)) {
        free(head);
        return tps_fail(ctx, TPS_E_JSON, "%s: the index's head is not laid out as expected", out_dir);
    }
    struct index_fill F = {ck, head, hl - tl};
    char *p = tps_path_join(out_dir, ck->index_name);
    tps_err rc = p ? tps_write_stream_atomic(ctx, p, index_put, &F)
                   : tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    free(p);
    free(head);
    return rc;
}

/* The source tensors merge cannot give back: the split's layout left them
 * out (the engine's load_weights skips them), named in one warning, then a
 * line per reason naming every tensor left out for it. */
static tps_err warn_dropped(tps_ctx *ctx, const tps_ckpt *ck, const char *dir)
{
    int n = ck->dropped ? cJSON_GetArraySize(ck->dropped) : 0;
    if (!n) return TPS_OK;
    tps_log(ctx, TPS_LOG_WARN,
            "%s: %d source tensor%s not given back: layout %s left %s out of the rank files:",
            dir, n, n == 1 ? " is" : "s are", ck->layout_name, n == 1 ? "it" : "them");
    for (const cJSON *d = ck->dropped->child; d; d = d->next) {
        const char *why = cJSON_GetObjectItemCaseSensitive(d, "reason")->valuestring;
        int first = 1;
        for (const cJSON *e = ck->dropped->child; e != d && first; e = e->next)
            first = strcmp(cJSON_GetObjectItemCaseSensitive(e, "reason")->valuestring, why) != 0;
        if (!first) continue; /* named with the first of its reason */
        size_t cap = strlen(why) + 16, len = 0;
        for (const cJSON *e = d; e; e = e->next)
            if (!strcmp(cJSON_GetObjectItemCaseSensitive(e, "reason")->valuestring, why))
                cap += strlen(cJSON_GetObjectItemCaseSensitive(e, "name")->valuestring) + 2;
        char *buf = tps_xmalloc(cap);
        if (!buf) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
        for (const cJSON *e = d; e; e = e->next)
            if (!strcmp(cJSON_GetObjectItemCaseSensitive(e, "reason")->valuestring, why))
                len += (size_t)snprintf(buf + len, cap - len, "%s%s", len ? ", " : "",
                                        cJSON_GetObjectItemCaseSensitive(e, "name")->valuestring);
        tps_log_long(ctx, TPS_LOG_WARN, "  %s: %s", why, buf);
        free(buf);
    }
    return TPS_OK;
}

/* How many of the files merge would write into out_dir are there already
 * (the safetensors files, the index, config and tokenizer files), named in
 * buf, comma-separated and cut short at len. */
static int existing_outputs(const tps_ckpt *ck, const char *out_dir, char *buf, size_t len)
{
    int n = 0;
    size_t used = 0;
    buf[0] = 0;
    size_t naux = 0;
    int w;
    while (tps_ckpt_aux_file(ck, ck->untie_config, naux, &w)) naux++;
    for (size_t i = 0; i < ck->norigins + 1 + naux; i++) {
        const char *name = i < ck->norigins ? ck->origins[i] : i == ck->norigins ? ck->index_name : NULL;
        if (i > ck->norigins) {
            name = tps_ckpt_aux_file(ck, ck->untie_config, i - ck->norigins - 1, &w);
            if (!w) continue;
        }
        if (!name) continue;
        char *p = tps_path_join(out_dir, name);
        int there = p && tps_exists(p);
        free(p);
        if (!there) continue;
        int k = snprintf(buf + used, len - used, "%s%s", n ? ", " : "", name);
        if (k > 0) used = used + (size_t)k < len ? used + (size_t)k : len - 1;
        n++;
    }
    return n;
}

tps_err tps_merge(tps_ctx *ctx, const char *dir, const tps_merge_opts *o, int *files_written)
{
    tps_ckpt *ck = NULL;
    char *a = NULL, *b = NULL, *bufa = NULL, *bufb = NULL;
    tps_err rc = TPS_OK;
    size_t merged = 0;
    int made_dir = 0;
    if (files_written) *files_written = 0;
    TPS_CHECK(open_sharded_dir(ctx, dir, &ck));
    char missing[256];
    TPS_FAIL_IF(missing_ranks(ck, missing, sizeof missing) < ck->nranks, ctx, TPS_E_MISMATCH,
                "%s: cannot merge: rank(s) %s are missing", dir, missing);
    /* Replicas must agree before one is taken. */
    bufa = tps_xmalloc(CHUNK / 2);
    bufb = tps_xmalloc(CHUNK / 2);
    TPS_FAIL_IF(!bufa || !bufb, ctx, TPS_E_NOMEM, "out of memory");
    for (size_t i = 0; i < ck->n; i++) {
        if (ck->t[i].dim < 0)
            for (int p = 1; p < ck->t[i].npieces; p++) TPS_CHECK(same_bytes(ctx, ck, i, p, bufa, bufb));
        for (int p = 0; p < ck->t[i].nreplicas; p++) TPS_CHECK(same_rows(ctx, ck, i, p, bufa, bufb));
    }
    /* Output directory. */
    if (tps_exists(o->out_dir)) {
        TPS_FAIL_IF(!tps_is_dir(o->out_dir), ctx, TPS_E_EXISTS, "%s: exists and is not a directory",
                    o->out_dir);
        a = realpath(o->out_dir, NULL);
        b = realpath(dir, NULL);
        TPS_FAIL_IF(a && b && strcmp(a, b) == 0, ctx, TPS_E_ARG,
                    "%s: merge output must not be the shard directory itself", o->out_dir);
        if (!o->force) {
            char names[512];
            int n = existing_outputs(ck, o->out_dir, names, sizeof names);
            TPS_FAIL_IF(n, ctx, TPS_E_EXISTS, "%s: %s already exist%s; pass --force to replace %s",
                        o->out_dir, names, n == 1 ? "s" : "", n == 1 ? "it" : "them");
        }
    } else {
        TPS_FAIL_IF(mkdir(o->out_dir, 0755) != 0, ctx, TPS_E_IO, "%s: cannot create: %s", o->out_dir,
                    strerror(errno));
        made_dir = 1;
    }
    /* Runs of the rank files go back as split wrote them: shared, or copied by the file system */
    tps_kcopy K;
    tps_kcopy_probe(ctx, &K, ck->nfiles ? ck->files[0].fd : -1, o->out_dir, o->plain_copy);
    for (size_t i = 0; i < ck->norigins; i++) {
        TPS_CHECK(merge_file(ctx, ck, ck->origins[i], o->out_dir, &K));
        merged = i + 1;
        if (files_written) (*files_written)++;
    }
    if (ck->index_name) TPS_CHECK(write_index(ctx, ck, o->out_dir));
    /* An untied split gives back the config.json of the tied original. */
    TPS_CHECK(tps_ckpt_copy_aux(ctx, ck, o->out_dir, ck->untie_config));
    TPS_CHECK(tps_fsync_dir(ctx, o->out_dir));
    TPS_CHECK(warn_dropped(ctx, ck, dir));
out:
    /* A failed merge leaves no part of a checkpoint behind: the files this
     * run wrote go (the ones --force was to replace are gone already), and
     * the directory when it made it. */
    if (rc && ck) {
        for (size_t i = 0; i < merged; i++) {
            char *p = tps_path_join(o->out_dir, ck->origins[i]);
            if (p) unlink(p);
            free(p);
        }
        if (made_dir) rmdir(o->out_dir);
    }
    free(a);
    free(b);
    free(bufa);
    free(bufb);
    tps_ckpt_free(ck);
    return rc;
}
