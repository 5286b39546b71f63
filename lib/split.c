/* split.c - the copy engine: writes every rank's local tensors, streaming
 * from the source with bounded memory, and the manifest last.
 *
 * The whole output is laid out before the first byte is written, so every
 * (tensor, rank) slot has a known file and offset; work is then a flat list
 * of tasks that any thread can run with pread/pwrite, and CRC32s of the
 * pieces a tensor was cut into are joined with crc32_combine. */
#include "internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <zlib.h>

#define CHUNK (4u << 20) /* bytes a task moves; two buffers of it per thread */
#define SUB (256u << 10) /* bytes moved per read/CRC/write step of a contiguous task */
/* Tasks reading less than this use pread: below it the mmap and munmap cost
 * more than the copy they save (see run_task). Tests lower it to reach the
 * mapped path with tiny models. */
size_t tps_split_map_min = 256u << 10;

#ifndef MAP_POPULATE
#define MAP_POPULATE 0 /* not Linux: the pages fault in as they are read */
#endif

typedef struct {
    int rank, part;
    char *final, *tmp;
    int fd;
    char *hdr;
    size_t hdr_len;
    uint64_t size;
} ofile;

typedef struct {
    int file;        /* index into files, -1 when the rank is not written */
    uint64_t off;    /* absolute offset in that file */
    uint64_t nbytes;
    uint32_t crc;
} oslot;

typedef enum { TASK_CONTIG = 0, TASK_ROWS = 1 } task_kind;

typedef struct {
    size_t t;
    task_kind kind;
    int rank;        /* CONTIG: the rank, or -1 = every written rank (replicated) */
    uint64_t a, b;   /* CONTIG: logical byte range; ROWS: outer rows [a, b) */
    uint64_t dst;    /* CONTIG: offset inside the slot */
    int full_rows;   /* ROWS: read whole rows once (else each rank's slices) */
    size_t crc0;     /* index of its first CRC in the pool (ROWS: tp of them) */
} task;

typedef struct {
    tps_ctx *ctx;
    const tps_ckpt *ck;
    const tps_layout *L;
    const unsigned char *write;
    int tp;
    ofile *files;
    size_t nfiles;
    oslot *slots;    /* [tensor * tp + rank] */
    task *tasks;
    size_t ntasks, cap;
    uint32_t *crcs;
    uint64_t *crclen;
    size_t ncrc;
    uint64_t total, done;
    volatile int failed;
    tps_err err;
    int reporting;   /* a thread is in the progress callback */
    cJSON *prev;     /* joining: the manifest of the --ranks runs already here */
    int map;         /* read the source through per-task mappings */
    size_t page;
} engine;

static oslot *slot(engine *E, size_t t, int r) { return &E->slots[t * (size_t)E->tp + (size_t)r]; }

static tps_err add_task(engine *E, task tk, size_t ncrc)
{
    if (E->ntasks == E->cap) {
        size_t cap = E->cap ? E->cap * 2 : 1024;
        task *nt = realloc(E->tasks, cap * sizeof *nt);
        if (!nt) return tps_fail(E->ctx, TPS_E_NOMEM, "out of memory");
        E->tasks = nt;
        E->cap = cap;
    }
    tk.crc0 = E->ncrc;
    E->ncrc += ncrc;
    E->tasks[E->ntasks++] = tk;
    return TPS_OK;
}

/* Geometry of tensor t cut along dim d: [outer, n, inner] with a row of
 * `row` bytes and each rank's slice of a row being [s_r, s_r + l_r) in bytes. */
typedef struct {
    uint64_t outer, row, s[4096], l[4096];
} geom;

static void geometry(const engine *E, size_t ti, geom *g)
{
    const tps_ctensor *t = &E->ck->t[ti];
    int d = E->L->p[ti].dim;
    uint64_t inner_bits = tps_dtype_bits(t->dtype);
    for (int k = d + 1; k < t->ndim; k++) inner_bits *= t->shape[k];
    g->outer = 1;
    for (int k = 0; k < d; k++) g->outer *= t->shape[k];
    g->row = t->shape[d] * inner_bits / 8;
    for (int r = 0; r < E->tp; r++) {
        uint64_t s, l;
        tps_chunk(t->shape[d], E->tp, r, &s, &l);
        g->s[r] = s * inner_bits / 8;
        g->l[r] = l * inner_bits / 8;
    }
}

static tps_err plan_tasks(engine *E)
{
    /* Two tables of 4096 ranks: on the heap, not static, so splits running
     * in different threads share nothing. */
    tps_err rc = TPS_OK;
    geom *g = tps_xmalloc(sizeof *g);
    if (!g) return tps_fail(E->ctx, TPS_E_NOMEM, "out of memory");
    for (size_t ti = 0; ti < E->ck->n; ti++) {
        const tps_ctensor *t = &E->ck->t[ti];
        int d = E->L->p[ti].dim;
        if (d < 0) {
            for (uint64_t a = 0; a < t->nbytes; a += CHUNK) {
                uint64_t b = a + CHUNK < t->nbytes ? a + CHUNK : t->nbytes;
                TPS_CHECK(add_task(E, (task){.t = ti, .kind = TASK_CONTIG, .rank = -1, .a = a, .b = b,
                                           .dst = a}, 1));
                E->total += b - a;
            }
            continue;
        }
        geometry(E, ti, g);
        if (g->outer == 1 || g->row > CHUNK) {
            /* Each rank's bytes are one contiguous run per outer row. */
            for (int r = 0; r < E->tp; r++) {
                if (!E->write[r]) continue;
                for (uint64_t o = 0; o < g->outer; o++)
                    for (uint64_t a = 0; a < g->l[r]; a += CHUNK) {
                        uint64_t len = g->l[r] - a < CHUNK ? g->l[r] - a : CHUNK;
                        uint64_t src = o * g->row + g->s[r] + a;
                        TPS_CHECK(add_task(E, (task){.t = ti, .kind = TASK_CONTIG, .rank = r, .a = src,
                                                   .b = src + len, .dst = o * g->l[r] + a}, 1));
                        E->total += len;
                    }
            }
            continue;
        }
        /* Strided: blocks of whole rows, scattered to every written rank. */
        uint64_t want = 0;
        for (int r = 0; r < E->tp; r++)
            if (E->write[r]) want += g->l[r];
        int full = want * 4 >= g->row; /* reading whole rows wastes little */
        uint64_t rows = CHUNK / g->row;
        if (rows == 0) rows = 1;
        for (uint64_t a = 0; a < g->outer; a += rows) {
            uint64_t b = a + rows < g->outer ? a + rows : g->outer;
            TPS_CHECK(add_task(E, (task){.t = ti, .kind = TASK_ROWS, .rank = -1, .a = a, .b = b,
                                       .full_rows = full}, (size_t)E->tp));
            E->total += (b - a) * (full ? g->row : want);
        }
    }
    E->crcs = tps_xcalloc(E->ncrc, sizeof *E->crcs);
    E->crclen = tps_xcalloc(E->ncrc, sizeof *E->crclen);
    TPS_FAIL_IF(!E->crcs || !E->crclen, E->ctx, TPS_E_NOMEM, "out of memory");
out:
    free(g);
    return rc;
}

static tps_err write_to(engine *E, size_t ti, int r, const void *buf, size_t len, uint64_t dst)
{
    oslot *s = slot(E, ti, r);
    ofile *f = &E->files[s->file];
    return tps_pwrite_full(E->ctx, f->fd, f->final, buf, len, s->off + dst);
}

/* Runs a task from the source bytes at src (a mapping of exactly the bytes
 * the task reads, of the file src_path), or with preads into `in` when src
 * is NULL. ROWS tasks expect g to hold the tensor's geometry. */
static tps_err run_task_on(engine *E, const task *tk, const char *src, const char *src_path, char *in,
                           char *out, geom *g)
{
    tps_ctx *ctx = E->ctx;
    const tps_ckpt *ck = E->ck;
    if (tk->kind == TASK_CONTIG) {
        /* In sub-chunks that stay in L2, so each byte comes from memory once
         * and the CRC reads it cache-hot. From a mapping, the write comes
         * first: its copy pulls the bytes in, the CRC finds them there.
         * Replicated bytes go through the buffer even then, so every rank
         * and the CRC get the same bytes if the source changes meanwhile
         * (the final recheck then fails the split anyway). */
        uint32_t crc = 0;
        for (uint64_t a = tk->a; a < tk->b; a += SUB) {
            size_t len = (size_t)(tk->b - a < SUB ? tk->b - a : SUB);
            uint64_t dst = tk->dst + (a - tk->a);
            if (src && tk->rank >= 0) {
                const char *p = src + (a - tk->a);
                errno = 0;
                tps_err rc = write_to(E, tk->t, tk->rank, p, len, dst);
                /* EFAULT: the bytes to write could not be read: the source's
                 * fault, not this output's. */
                if (rc && errno == EFAULT)
                    return tps_fail(ctx, TPS_E_IO, "%s: cannot read tensor '%s' (EFAULT under its mapping)",
                                    src_path, ck->t[tk->t].name);
                TPS_TRY(rc);
                crc = tps_crc32(crc, p, len);
                continue;
            }
            if (src)
                memcpy(in, src + (a - tk->a), len);
            else
                TPS_TRY(tps_ckpt_read(ctx, ck, tk->t, a, in, len));
            crc = tps_crc32(crc, in, len);
            if (tk->rank >= 0) {
                TPS_TRY(write_to(E, tk->t, tk->rank, in, len, dst));
                continue;
            }
            for (int r = 0; r < E->tp; r++)
                if (E->write[r]) TPS_TRY(write_to(E, tk->t, r, in, len, dst));
        }
        E->crcs[tk->crc0] = crc;
        E->crclen[tk->crc0] = tk->b - tk->a;
        return TPS_OK;
    }
    uint64_t nrows = tk->b - tk->a;
    const char *rows = src ? src : in;
    if (tk->full_rows && !src)
        TPS_TRY(tps_ckpt_read(ctx, ck, tk->t, tk->a * g->row, in, (size_t)(nrows * g->row)));
    for (int r = 0; r < E->tp; r++) {
        if (!E->write[r] || g->l[r] == 0) continue;
        size_t n = 0;
        for (uint64_t o = 0; o < nrows; o++) {
            if (tk->full_rows)
                memcpy(out + n, rows + o * g->row + g->s[r], (size_t)g->l[r]);
            else
                TPS_TRY(tps_ckpt_read(ctx, ck, tk->t, (tk->a + o) * g->row + g->s[r], out + n,
                                      (size_t)g->l[r]));
            n += (size_t)g->l[r];
        }
        E->crcs[tk->crc0 + (size_t)r] = (uint32_t)tps_crc32(0, out, n);
        E->crclen[tk->crc0 + (size_t)r] = n;
        TPS_TRY(write_to(E, tk->t, r, out, n, tk->a * g->l[r]));
    }
    return TPS_OK;
}

/* The source range a task reads in one run: CONTIG [a, b), whole-row ROWS
 * their rows; ROWS that read only some ranks' slices have none. Fills g
 * for ROWS tasks. */
static int task_range(const engine *E, const task *tk, geom *g, uint64_t *off, uint64_t *len)
{
    if (tk->kind == TASK_CONTIG) {
        *off = tk->a;
        *len = tk->b - tk->a;
        return 1;
    }
    geometry(E, tk->t, g);
    if (!tk->full_rows) return 0;
    *off = tk->a * g->row;
    *len = (tk->b - tk->a) * g->row;
    return 1;
}

/* Runs a task from a read-only mapping of just the bytes it reads, when the
 * split maps its source, the task reads at least tps_split_map_min bytes
 * and they lie in one file; else with preads.
 *
 * Why: pwrite from the mapping copies each byte once, page cache to page
 * cache, as cp's copy_file_range does; pread into a buffer and pwrite from
 * it copies it twice (split --threads 1 of 1 GiB at tp 8: 0.38 s mapped,
 * 0.46 s with preads). A mapping per task keeps the pages this process has
 * mapped, hence its RSS, to a task's worth. MAP_POPULATE maps them in one
 * walk instead of a fault every 16 pages (0.41 s faulting). Small tasks
 * (a checkpoint of 13,500 tensors of 8 KiB) ran 1.4x slower mapped: an mmap
 * and munmap cost more than the copy they save, hence tps_split_map_min.
 *
 * A page cut off by another process truncating the source raises SIGBUS
 * (reading it) or EFAULT (a write from it): both end in the source being
 * rechecked and reported as changed. */
static tps_err run_task(engine *E, const task *tk, char *in, char *out, geom *g)
{
    uint64_t off, len, foff;
    int file;
    if (!task_range(E, tk, g, &off, &len) || !E->map || len < tps_split_map_min ||
        !tps_ckpt_locate(E->ck, tk->t, off, len, &file, &foff))
        return run_task_on(E, tk, NULL, NULL, in, out, g);
    uint64_t base = foff & ~(uint64_t)(E->page - 1);
    size_t mlen = (size_t)(foff + len - base);
    char *const m =
        mmap(NULL, mlen, PROT_READ, MAP_SHARED | MAP_POPULATE, E->ck->files[file].fd, (off_t)base);
    if (m == MAP_FAILED) return run_task_on(E, tk, NULL, NULL, in, out, g);
    tps_guard gd = {.lo = m, .hi = m + mlen};
    if (sigsetjmp(gd.jb, 1)) {
        tps_guard_leave();
        munmap(m, mlen);
        tps_err rc = tps_ckpt_recheck(E->ctx, E->ck);
        if (rc) return rc;
        return tps_fail(E->ctx, TPS_E_IO, "%s: cannot read tensor '%s' (SIGBUS under its mapping)",
                        E->ck->files[file].path, E->ck->t[tk->t].name);
    }
    tps_guard_enter(&gd);
    tps_err rc = run_task_on(E, tk, m + (foff - base), E->ck->files[file].path, in, out, g);
    tps_guard_leave();
    munmap(m, mlen);
    if (rc && rc != TPS_E_INTERRUPTED) {
        tps_err rc2 = tps_ckpt_recheck(E->ctx, E->ck);
        if (rc2) return rc2;
    }
    return rc;
}

static void run_all(engine *E)
{
#pragma omp parallel num_threads(tps_threads(E->ctx))
    {
        /* A SIGBUS raised while blocked kills the process whatever handler
         * is set, and a program that leaves signals to one thread blocks
         * them in the others: unblock it here while mapped reads run, and
         * block it again after. */
        sigset_t bus, mask;
        sigemptyset(&bus);
        sigaddset(&bus, SIGBUS);
        int reblock = E->map && pthread_sigmask(SIG_UNBLOCK, &bus, &mask) == 0 &&
                      sigismember(&mask, SIGBUS) == 1;
        char *in = tps_xmalloc(CHUNK), *out = tps_xmalloc(CHUNK);
        geom *g = tps_xmalloc(sizeof *g);
        if (!in || !out || !g) {
#pragma omp critical
            if (!E->failed) {
                E->err = tps_fail(E->ctx, TPS_E_NOMEM, "out of memory for copy buffers");
                E->failed = 1;
            }
        }
#pragma omp for schedule(dynamic, 1)
        for (size_t i = 0; i < E->ntasks; i++) {
            if (E->failed) continue;
            if (E->ctx->interrupted) {
#pragma omp critical
                if (!E->failed) {
                    E->err = tps_fail(E->ctx, TPS_E_INTERRUPTED, "interrupted");
                    E->failed = 1;
                }
                continue;
            }
            tps_err rc = run_task(E, &E->tasks[i], in, out, g);
            if (rc) {
#pragma omp critical
                if (!E->failed) {
                    E->err = rc;
                    E->failed = 1;
                }
                continue;
            }
            const task *tk = &E->tasks[i];
            uint64_t moved = tk->kind == TASK_CONTIG ? tk->b - tk->a : 0;
            if (tk->kind == TASK_ROWS)
                for (int r = 0; r < E->tp; r++) moved += E->crclen[tk->crc0 + (size_t)r];
            uint64_t done = __atomic_add_fetch(&E->done, moved, __ATOMIC_RELAXED);
            /* One caller at a time, whichever thread is free. */
            if (E->ctx->progress && !__atomic_exchange_n(&E->reporting, 1, __ATOMIC_ACQUIRE)) {
                E->ctx->progress(E->ctx->progress_user, done, E->total, E->ck->t[tk->t].name);
                __atomic_store_n(&E->reporting, 0, __ATOMIC_RELEASE);
            }
        }
        free(in);
        free(out);
        free(g);
        if (reblock) pthread_sigmask(SIG_BLOCK, &bus, NULL);
    }
}

/* Joins the per-task CRCs of every slot in file order. */
static void combine_crcs(engine *E)
{
    for (size_t i = 0; i < E->ck->n * (size_t)E->tp; i++) E->slots[i].crc = 0;
    for (size_t k = 0; k < E->ntasks; k++) {
        const task *tk = &E->tasks[k];
        for (int r = 0; r < E->tp; r++) {
            if (!E->write[r]) continue;
            size_t c;
            if (tk->kind == TASK_CONTIG) {
                if (tk->rank >= 0 && tk->rank != r) continue;
                c = tk->crc0;
            } else {
                c = tk->crc0 + (size_t)r;
            }
            oslot *s = slot(E, tk->t, r);
            s->crc = (uint32_t)crc32_combine(s->crc, E->crcs[c], (z_off_t)E->crclen[c]);
        }
    }
}

/* ------------------------------------------------------------------ output layout */

static char *placements_json(const engine *E, int rank, int part, const char *plan)
{
    (void)plan;
    cJSON *o = cJSON_CreateObject();
    for (size_t ti = 0; ti < E->ck->n; ti++) {
        const oslot *s = &E->slots[ti * (size_t)E->tp + (size_t)rank];
        if (E->L->p[ti].dim < 0 || s->file < 0 || E->files[s->file].part != part) continue;
        const tps_ctensor *t = &E->ck->t[ti];
        uint64_t st, ln;
        tps_chunk(t->shape[E->L->p[ti].dim], E->tp, rank, &st, &ln);
        cJSON *e = cJSON_CreateObject();
        char pl[32];
        snprintf(pl, sizeof pl, "Shard(%d)", E->L->p[ti].dim);
        cJSON_AddStringToObject(e, "placement", pl);
        cJSON *gs = cJSON_AddArrayToObject(e, "global_shape");
        for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(gs, cJSON_CreateNumber((double)t->shape[d]));
        cJSON_AddNumberToObject(e, "offset", (double)st);
        cJSON_AddItemToObject(o, t->name, e);
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static tps_err build_files(engine *E, const tps_split_opts *o)
{
    tps_ctx *ctx = E->ctx;
    const tps_ckpt *ck = E->ck;
    size_t n = ck->n;
    tps_st_entry *ent = tps_xcalloc(n, sizeof *ent);
    uint64_t(*lshape)[TPS_MAX_DIMS] = tps_xcalloc(n, sizeof *lshape);
    int *fileof = tps_xcalloc(n, sizeof *fileof);
    tps_err rc = TPS_OK;
    TPS_FAIL_IF(!ent || !lshape || !fileof, ctx, TPS_E_NOMEM, "out of memory");
    for (size_t i = 0; i < n * (size_t)E->tp; i++) E->slots[i].file = -1;
    for (int r = 0; r < E->tp; r++) {
        if (!E->write[r]) continue;
        /* Local shapes, and the file order to assign parts in. */
        for (size_t ti = 0; ti < n; ti++) {
            const tps_ctensor *t = &ck->t[ti];
            memcpy(lshape[ti], t->shape, sizeof lshape[ti]);
            int d = E->L->p[ti].dim;
            if (d >= 0) {
                uint64_t s;
                tps_chunk(t->shape[d], E->tp, r, &s, &lshape[ti][d]);
            }
            ent[ti] = (tps_st_entry){.name = t->name, .dtype = t->dtype, .ndim = t->ndim,
                                     .shape = lshape[ti], .nbytes = tps_layout_local_bytes(E->L, ti, r)};
        }
        char *h0;
        size_t h0len;
        TPS_CHECK(tps_st_build_header(ctx, ent, n, NULL, NULL, 0, &h0, &h0len));
        free(h0);
        size_t *ord = tps_xcalloc(n, sizeof *ord);
        TPS_FAIL_IF(!ord, ctx, TPS_E_NOMEM, "out of memory");
        for (size_t ti = 0; ti < n; ti++) ord[ent[ti].order] = ti;
        int part = 0;
        uint64_t acc = 0;
        for (size_t k = 0; k < n; k++) {
            size_t ti = ord[k];
            if (o->max_part_size && acc > 0 && acc + ent[ti].nbytes > o->max_part_size) {
                part++;
                acc = 0;
            }
            acc += ent[ti].nbytes;
            fileof[ti] = part;
        }
        free(ord);
        for (int p = 0; p <= part; p++) {
            /* Entries of this part, header with metadata, slot offsets. */
            tps_st_entry *pe = tps_xcalloc(n, sizeof *pe);
            size_t *map = tps_xcalloc(n, sizeof *map);
            ofile *nf = realloc(E->files, (E->nfiles + 1) * sizeof *nf);
            if (!pe || !map || !nf) {
                free(pe);
                free(map);
                if (nf) E->files = nf;
                TPS_FAIL_IF(1, ctx, TPS_E_NOMEM, "out of memory");
            }
            E->files = nf;
            ofile *f = &E->files[E->nfiles];
            memset(f, 0, sizeof *f);
            f->fd = -1;
            f->rank = r;
            f->part = p;
            E->nfiles++;
            size_t m = 0;
            for (size_t ti = 0; ti < n; ti++)
                if (fileof[ti] == p) {
                    map[m] = ti;
                    pe[m++] = ent[ti];
                }
            char rs[16], ts[16], ps[16], np[16];
            snprintf(rs, sizeof rs, "%d", r);
            snprintf(ts, sizeof ts, "%d", E->tp);
            snprintf(ps, sizeof ps, "%d", p);
            snprintf(np, sizeof np, "%d", part + 1);
            char *pj;
            f->final = tps_asprintf("%s/model-rank-%d-part-%d.safetensors", o->out_dir, r, p);
            f->tmp = f->final ? tps_tmp_name(f->final) : NULL;
            /* Slots first (placements_json needs them), then the header. */
            for (size_t k = 0; k < m; k++) {
                oslot *s = slot(E, map[k], r);
                s->file = (int)(E->nfiles - 1);
                s->nbytes = pe[k].nbytes;
            }
            pj = placements_json(E, r, p, NULL);
            const char *mk[] = {"format", "tp_rank", "tp_size", "part", "parts", "plan", "tool",
                                "placements"};
            const char *mv[] = {"pt", rs, ts, ps, np, tps_plan_name(E->L->plan),
                                "tpshard " TPS_VERSION_STRING, pj ? pj : "{}"};
            tps_err hrc = tps_st_build_header(ctx, pe, m, mk, mv, 8, &f->hdr, &f->hdr_len);
            free(pj);
            if (!hrc) {
                f->size = f->hdr_len;
                for (size_t k = 0; k < m; k++) {
                    oslot *s = slot(E, map[k], r);
                    s->off = f->hdr_len + pe[k].offset;
                    f->size += pe[k].nbytes;
                }
            }
            free(pe);
            free(map);
            TPS_FAIL_IF(!f->final || !f->tmp, ctx, TPS_E_NOMEM, "out of memory");
            TPS_CHECK(hrc);
        }
    }
out:
    free(ent);
    free(lshape);
    free(fileof);
    return rc;
}

/* ------------------------------------------------------------------ manifest */

/* The manifest is streamed, one tensor a line: a tree of every (tensor,
 * rank) entry grew with tensors x tp (4.4 GB for a million tensors at tp 2). */
static void file_sink(void *user, const char *p, size_t n) { fwrite(p, 1, n, user); }

static void mw_str(FILE *f, const char *s) { tps_json_quote(s, file_sink, f); }

static void mw_json(FILE *f, const cJSON *item)
{
    char *t = item ? cJSON_PrintUnformatted(item) : NULL;
    fputs(t ? t : "{}", f);
    free(t);
}

static void mw_shape(FILE *f, const uint64_t *v, int n)
{
    fputc('[', f);
    for (int i = 0; i < n; i++) fprintf(f, "%s%llu", i ? "," : "", (unsigned long long)v[i]);
    fputc(']', f);
}

static const char *base_name(const char *p)
{
    const char *b = strrchr(p, '/');
    return b ? b + 1 : p;
}

static void mw_body(engine *E, FILE *f, const char *plan_source, const unsigned char *theirs)
{
    const tps_ckpt *ck = E->ck;
    static const char *const kinds[] = {"file", "dir", "index", "sharded"};
    fprintf(f, "{\n\"format\": \"tpshard\",\n\"version\": %d,\n\"tool\": \"tpshard " TPS_VERSION_STRING
               "\",\n\"tp\": %d,\n\"plan\": {\"name\": ",
            TPS_MANIFEST_FORMAT, E->tp);
    mw_str(f, tps_plan_name(E->L->plan));
    fputs(", \"source\": ", f);
    mw_str(f, plan_source);
    fputs("},\n\"source\": {\"kind\": ", f);
    mw_str(f, kinds[ck->kind]);
    fputs(", \"stem\": ", f);
    mw_str(f, ck->stem);
    if (ck->index_name) {
        fputs(", \"index\": ", f);
        mw_str(f, ck->index_name);
    }
    if (ck->index_meta) {
        fputs(", \"index_metadata\": ", f);
        mw_json(f, ck->index_meta);
    }
    fputs(", \"files\": [", f);
    for (size_t i = 0; i < ck->norigins; i++) {
        fputs(i ? ",\n  {\"name\": " : "\n  {\"name\": ", f);
        mw_str(f, ck->origins[i]);
        fputs(", \"metadata\": ", f);
        mw_json(f, cJSON_GetObjectItemCaseSensitive(ck->origin_meta, ck->origins[i]));
        /* The original header, so merge gives back the file byte for byte
         * even when it was not written in the reference layout. */
        const cJSON *hd = cJSON_GetObjectItemCaseSensitive(ck->origin_header, ck->origins[i]);
        if (cJSON_IsString(hd)) {
            fputs(", \"header\": ", f);
            mw_str(f, hd->valuestring);
        }
        fputc('}', f);
    }
    fputs("]},\n", f);
    if (ck->untie_head) {
        /* --untie: the head is the embedding's bytes, and config.json was
         * rewritten; merge gives back this original config.json. */
        fputs("\"untie\": {\"head\": ", f);
        mw_str(f, ck->untie_head);
        fputs(", \"embedding\": ", f);
        mw_str(f, ck->untie_embedding);
        fputs(", \"config\": ", f);
        mw_str(f, ck->untie_config ? ck->untie_config : "");
        fputs("},\n", f);
    }
    fputs("\"ranks_written\": [", f);
    int first = 1;
    for (int r = 0; r < E->tp; r++)
        if (E->write[r] || theirs[r]) {
            fprintf(f, "%s%d", first ? "" : ", ", r);
            first = 0;
        }
    /* Every planned rank file, written or not, so a directory filled by
     * several --ranks runs can be checked for what is missing. */
    fputs("],\n\"files\": [", f);
    first = 1;
    for (size_t i = 0; i < E->nfiles; i++) {
        fputs(first ? "\n  {\"name\": " : ",\n  {\"name\": ", f);
        first = 0;
        mw_str(f, base_name(E->files[i].final));
        fprintf(f, ", \"rank\": %d, \"part\": %d, \"bytes\": %llu}", E->files[i].rank,
                E->files[i].part, (unsigned long long)E->files[i].size);
    }
    const cJSON *pfiles = cJSON_GetObjectItemCaseSensitive(E->prev, "files");
    for (const cJSON *pf = pfiles ? pfiles->child : NULL; pf; pf = pf->next) {
        const cJSON *rk = cJSON_GetObjectItemCaseSensitive(pf, "rank");
        if (!cJSON_IsNumber(rk) || rk->valueint < 0 || rk->valueint >= E->tp || !theirs[rk->valueint])
            continue;
        fputs(first ? "\n  " : ",\n  ", f);
        first = 0;
        mw_json(f, pf);
    }
    fputs("],\n\"tensors\": [", f);
    const cJSON *ptensors = cJSON_GetObjectItemCaseSensitive(E->prev, "tensors");
    const cJSON *pt = ptensors ? ptensors->child : NULL;
    for (size_t ti = 0; ti < ck->n; ti++) {
        const tps_ctensor *t = &ck->t[ti];
        int d = E->L->p[ti].dim;
        fputs(ti ? ",\n  {\"name\": " : "\n  {\"name\": ", f);
        mw_str(f, t->name);
        fprintf(f, ", \"dtype\": \"%s\", \"shape\": ", tps_dtype_name(t->dtype));
        mw_shape(f, t->shape, t->ndim);
        fprintf(f, ", \"style\": \"%s\", \"placement\": ", tps_style_name(E->L->p[ti].style));
        if (d >= 0) fprintf(f, "\"Shard(%d)\"", d);
        else fputs("\"Replicate\"", f);
        fprintf(f, ", \"dim\": %d", d);
        if (E->L->p[ti].rule) {
            fputs(", \"rule\": ", f);
            mw_str(f, E->L->p[ti].rule);
        }
        fputs(", \"source_file\": ", f);
        mw_str(f, t->origin);
        if (t->derived_from) {
            fputs(", \"derived_from\": ", f);
            mw_str(f, t->derived_from);
        }
        fputs(", \"ranks\": [", f);
        const cJSON *pranks = cJSON_GetObjectItemCaseSensitive(pt, "ranks"); /* same order: joinable() */
        if (pt) pt = pt->next;
        for (int r = 0; r < E->tp; r++) {
            if (r) fputs(", ", f);
            if (theirs[r] && cJSON_GetArraySize(pranks) == E->tp) {
                mw_json(f, cJSON_GetArrayItem(pranks, r));
                continue;
            }
            uint64_t s0 = 0, l = 0, ls[TPS_MAX_DIMS];
            memcpy(ls, t->shape, sizeof ls);
            if (d >= 0) {
                tps_chunk(t->shape[d], E->tp, r, &s0, &l);
                ls[d] = l;
            }
            const oslot *so = &E->slots[ti * (size_t)E->tp + (size_t)r];
            fprintf(f, "{\"rank\": %d, \"file\": ", r);
            if (so->file >= 0) {
                mw_str(f, base_name(E->files[so->file].final));
            } else {
                /* Unwritten ranks still get the name their part 0 would have. */
                fprintf(f, "\"model-rank-%d-part-0.safetensors\"", r);
            }
            fputs(", \"shape\": ", f);
            mw_shape(f, ls, t->ndim);
            fprintf(f, ", \"offset\": %llu, \"nbytes\": %llu", (unsigned long long)s0,
                    (unsigned long long)tps_layout_local_bytes(E->L, ti, r));
            if (so->file >= 0) fprintf(f, ", \"crc32\": %u", (unsigned)so->crc);
            fputc('}', f);
        }
        fputs("]}", f);
    }
    fputs("\n]\n}\n", f);
}

static tps_err write_manifest(engine *E, const tps_split_opts *o, const char *plan_source)
{
    tps_ctx *ctx = E->ctx;
    tps_err rc = TPS_OK;
    /* Ranks earlier --ranks runs wrote here (joining): their entries stay. */
    unsigned char *theirs = tps_xcalloc((size_t)E->tp, 1);
    char *path = tps_path_join(o->out_dir, TPS_MANIFEST);
    char *tmp = path ? tps_tmp_name(path) : NULL;
    FILE *f = NULL;
    TPS_FAIL_IF(!theirs || !path || !tmp, ctx, TPS_E_NOMEM, "out of memory");
    const cJSON *pw = cJSON_GetObjectItemCaseSensitive(E->prev, "ranks_written");
    for (const cJSON *r = pw ? pw->child : NULL; r; r = r->next)
        if (cJSON_IsNumber(r) && r->valueint >= 0 && r->valueint < E->tp && !E->write[r->valueint])
            theirs[r->valueint] = 1;
    f = fopen(tmp, "we");
    TPS_FAIL_IF(!f, ctx, TPS_E_IO, "%s: cannot create: %s", tmp, strerror(errno));
    setvbuf(f, NULL, _IOFBF, 1 << 20);
    mw_body(E, f, plan_source, theirs);
    int werr = ferror(f) || fflush(f) != 0 ? errno : 0;
    if (!werr && fsync(fileno(f)) != 0) werr = errno;
    if (fclose(f) != 0 && !werr) werr = errno;
    f = NULL;
    if (werr) {
        rc = tps_fail(ctx, werr == ENOSPC || werr == EFBIG ? TPS_E_NOSPACE : TPS_E_IO,
                      "%s: writing the manifest failed: %s", path, strerror(werr ? werr : EIO));
        goto out;
    }
    TPS_FAIL_IF(rename(tmp, path) != 0, ctx, TPS_E_IO, "%s: rename: %s", path, strerror(errno));
out:
    if (f) fclose(f);
    if (rc && tmp) unlink(tmp);
    free(theirs);
    free(path);
    free(tmp);
    return rc;
}

/* ------------------------------------------------------------------ output directory */

static int is_ours(const char *name)
{
    int r, p, n = 0;
    if (strcmp(name, TPS_MANIFEST) == 0) return 1;
    if (sscanf(name, "model-rank-%d-part-%d.safetensors%n", &r, &p, &n) == 2 && name[n] == 0) return 1;
    /* Temporaries a killed run left behind. */
    if (name[0] == '.' && strstr(name, ".tmp.") &&
        (strncmp(name + 1, "model-rank-", 11) == 0 || strncmp(name + 1, TPS_MANIFEST, 12) == 0))
        return 2;
    return 0;
}

/* Rank of a rank file or of its temporary, -1 when the name is neither. */
static int rank_of(const char *name)
{
    int r, p;
    if (name[0] == '.') name++;
    return sscanf(name, "model-rank-%d-part-%d", &r, &p) == 2 ? r : -1;
}

static tps_err load_manifest(tps_ctx *ctx, const char *dir, cJSON **out)
{
    *out = NULL;
    char *p = tps_path_join(dir, TPS_MANIFEST), *buf = NULL;
    size_t len;
    tps_err rc = p ? TPS_OK : TPS_E_NOMEM;
    if (p && tps_exists(p)) {
        rc = tps_read_file(ctx, p, 1u << 30, &buf, &len);
        if (!rc) rc = tps_json_parse(ctx, p, buf, len, out);
    }
    free(p);
    free(buf);
    return rc;
}

/* A manifest that --ranks runs can add to: same source, plan, tp, tensors. */
static int joinable(const engine *E, const cJSON *m)
{
    const tps_ckpt *ck = E->ck;
    const cJSON *tp = cJSON_GetObjectItemCaseSensitive(m, "tp");
    const cJSON *pn = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(m, "plan"), "name");
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(m, "source"), "stem");
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(m, "tensors");
    if (!cJSON_IsNumber(tp) || tp->valueint != E->tp || !cJSON_IsString(pn) ||
        strcmp(pn->valuestring, tps_plan_name(E->L->plan)) || !cJSON_IsString(st) ||
        strcmp(st->valuestring, ck->stem) || !cJSON_IsArray(ts) || (size_t)cJSON_GetArraySize(ts) != ck->n)
        return 0;
    size_t i = 0;
    for (const cJSON *t = ts->child; t; t = t->next, i++) {
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(t, "name");
        if (!cJSON_IsString(nm) || strcmp(nm->valuestring, ck->t[i].name)) return 0;
    }
    return 1;
}

static tps_err prepare_dir(engine *E, const tps_split_opts *o)
{
    tps_ctx *ctx = E->ctx;
    const tps_ckpt *ck = E->ck;
    const char *dir = o->out_dir;
    if (!tps_exists(dir)) {
        /* mkdir -p */
        char *p = tps_strdup(dir);
        if (!p) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
        for (char *s = p + 1; *s; s++)
            if (*s == '/') {
                *s = 0;
                mkdir(p, 0755);
                *s = '/';
            }
        int ok = mkdir(p, 0755) == 0 || errno == EEXIST;
        int e = errno;
        free(p);
        if (!ok) return tps_fail(ctx, TPS_E_IO, "%s: cannot create the output directory: %s", dir, strerror(e));
        return TPS_OK;
    }
    if (!tps_is_dir(dir)) return tps_fail(ctx, TPS_E_EXISTS, "%s: exists and is not a directory", dir);
    char *a = realpath(dir, NULL), *b = realpath(ck->dir, NULL);
    int same = a && b && strcmp(a, b) == 0;
    free(a);
    free(b);
    if (same)
        return tps_fail(ctx, TPS_E_ARG,
                        "%s: the output directory is the model directory itself; choose another -o",
                        dir);
    /* --ranks into a directory other --ranks runs of the same split filled:
     * add to it, and leave their ranks alone. */
    if (o->ranks) {
        cJSON *m = NULL;
        if (load_manifest(ctx, dir, &m) == TPS_OK && m && joinable(E, m)) E->prev = m;
        else cJSON_Delete(m);
    }
    DIR *d = opendir(dir);
    if (!d) return tps_fail(ctx, TPS_E_IO, "%s: %s", dir, strerror(errno));
    int found = 0, clash = -1;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (is_ours(de->d_name) != 1) continue;
        found = 1;
        int r = rank_of(de->d_name);
        if (r >= 0 && r < E->tp && E->write[r]) clash = r;
    }
    closedir(d);
    if (E->prev && clash >= 0 && !o->force)
        return tps_fail(ctx, TPS_E_EXISTS,
                        "%s: rank %d is already written here; pass --force to rewrite the ranks "
                        "you name",
                        dir, clash);
    if (!E->prev && found && !o->force)
        return tps_fail(ctx, TPS_E_EXISTS,
                        "%s: already holds a tpshard output; pass --force to replace it", dir);
    return TPS_OK;
}

/* After the new files are in place: remove rank files of an older output
 * that the new one does not have, and stale temporaries of killed runs. */
static void remove_stale(engine *E, const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        int kind = is_ours(de->d_name);
        if (!kind || strcmp(de->d_name, TPS_MANIFEST) == 0) continue;
        char *p = tps_path_join(dir, de->d_name);
        int keep = 0, r = rank_of(de->d_name);
        /* Joining: other runs' ranks and temporaries are theirs. */
        if (E->prev && (r < 0 || r >= E->tp || !E->write[r])) keep = 1;
        for (size_t i = 0; p && i < E->nfiles && !keep; i++)
            keep = strcmp(E->files[i].final, p) == 0 || strcmp(E->files[i].tmp, p) == 0;
        if (p && !keep) unlink(p);
        free(p);
    }
    closedir(d);
}

static tps_err space_check(tps_ctx *ctx, const engine *E, const char *dir)
{
    struct statvfs sv;
    if (statvfs(dir, &sv) != 0) return TPS_OK;
    uint64_t need = 0, replaced = 0;
    for (size_t i = 0; i < E->nfiles; i++) {
        need += E->files[i].size;
        struct stat sb;
        if (stat(E->files[i].final, &sb) == 0) replaced += (uint64_t)sb.st_size;
    }
    uint64_t avail = (uint64_t)sv.f_bavail * sv.f_frsize + replaced;
    if (need > avail)
        return tps_fail(ctx, TPS_E_NOSPACE,
                        "%s: not enough free space: the split needs %.2f GiB, %.2f GiB are free", dir,
                        need / 1073741824.0, avail / 1073741824.0);
    return TPS_OK;
}

tps_err tps_split(tps_ctx *ctx, const tps_ckpt *ck, const tps_layout *L, const tps_split_opts *o,
                  tps_split_result *res)
{
    tps_err rc = TPS_OK;
    engine E = {.ctx = ctx, .ck = ck, .L = L, .tp = L->tp};
    unsigned char *all = NULL;
    if (res) memset(res, 0, sizeof *res);
    if (L->rejected)
        return tps_fail(ctx, TPS_E_REJECT, "plan %s rejects tp %d for %s: %s", tps_plan_name(L->plan),
                        L->tp, ck->path, L->rejected);
    if (!o->out_dir) return tps_fail(ctx, TPS_E_ARG, "no output directory");
    if (o->tp && o->tp != L->tp)
        return tps_fail(ctx, TPS_E_ARG, "split options say tp %d but the layout was made for tp %d",
                        o->tp, L->tp);
    /* A manifest lists every (tensor, rank): past this it would outgrow what
     * check, merge and verify read back (about 235 bytes an entry). */
    if ((uint64_t)ck->n * (uint64_t)L->tp > TPS_MAX_MANIFEST_ENTRIES)
        return tps_fail(ctx, TPS_E_NOMEM,
                        "%s: %zu tensors at tp %d make %llu tensor-rank entries, over the %d a "
                        "manifest may hold (check, merge and verify could not read it back)",
                        ck->path, ck->n, L->tp, (unsigned long long)ck->n * (unsigned long long)L->tp,
                        TPS_MAX_MANIFEST_ENTRIES);
    all = tps_xcalloc((size_t)L->tp, 1);
    E.slots = tps_xcalloc(ck->n * (size_t)L->tp, sizeof *E.slots);
    TPS_FAIL_IF(!all || !E.slots, ctx, TPS_E_NOMEM, "out of memory");
    for (int r = 0; r < L->tp; r++) all[r] = o->ranks ? o->ranks[r] : 1;
    E.write = all;
    TPS_CHECK(prepare_dir(&E, o));
    TPS_CHECK(build_files(&E, o));
    TPS_CHECK(plan_tasks(&E));
    TPS_CHECK(space_check(ctx, &E, o->out_dir));
    for (size_t i = 0; i < E.nfiles; i++) {
        ofile *f = &E.files[i];
        f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        TPS_FAIL_IF(f->fd < 0, ctx, TPS_E_IO, "%s: cannot create: %s", f->tmp, strerror(errno));
        TPS_CHECK(tps_pwrite_full(ctx, f->fd, f->final, f->hdr, f->hdr_len, 0));
        /* Size it now: a full disk or a size limit shows before the copy. */
        if (f->size > f->hdr_len && ftruncate(f->fd, (off_t)f->size) != 0) {
            int e = errno;
            TPS_FAIL_IF(e == EFBIG, ctx, TPS_E_NOSPACE, "%s: file size limit exceeded (EFBIG)", f->final);
            TPS_FAIL_IF(1, ctx, TPS_E_IO, "%s: cannot size the file: %s", f->final, strerror(e));
        }
    }
    /* Mapped reads when asked for and the SIGBUS guard can be set. */
    long pg = sysconf(_SC_PAGESIZE);
    E.page = pg > 0 ? (size_t)pg : 4096;
    E.map = o->map_source && pg > 0 && tps_guard_hold();
    run_all(&E);
    if (E.map) tps_guard_release();
    if (E.failed) {
        rc = E.err;
        goto out;
    }
    if (ctx->progress) ctx->progress(ctx->progress_user, E.done, E.total, NULL);
    TPS_CHECK(tps_ckpt_recheck(ctx, ck));
    combine_crcs(&E);
    for (size_t i = 0; i < E.nfiles; i++) {
        ofile *f = &E.files[i];
        TPS_FAIL_IF(fsync(f->fd) != 0, ctx, errno == ENOSPC ? TPS_E_NOSPACE : TPS_E_IO,
                    "%s: fsync: %s", f->final, strerror(errno));
        int cr = close(f->fd);
        f->fd = -1;
        TPS_FAIL_IF(cr != 0, ctx, TPS_E_IO, "%s: close: %s", f->final, strerror(errno));
    }
    TPS_FAIL_IF(ctx->interrupted, ctx, TPS_E_INTERRUPTED, "interrupted");
    if (!E.prev) {
        /* The old manifest goes first, so no moment shows new rank files
         * under an old manifest. */
        char *mp = tps_path_join(o->out_dir, TPS_MANIFEST);
        if (mp) unlink(mp);
        free(mp);
    }
    for (size_t i = 0; i < E.nfiles; i++) {
        TPS_FAIL_IF(rename(E.files[i].tmp, E.files[i].final) != 0, ctx, TPS_E_IO, "%s: rename: %s",
                    E.files[i].final, strerror(errno));
        free(E.files[i].tmp);
        E.files[i].tmp = tps_strdup("");
    }
    remove_stale(&E, o->out_dir);
    TPS_CHECK(tps_ckpt_copy_aux(ctx, ck, o->out_dir, ck->config_out));
    {
        /* Runs on other machines may write the manifest too: take the lock,
         * re-read theirs, add ours. */
        char *lp = o->ranks ? tps_path_join(o->out_dir, ".tpshard.lock") : NULL;
        int lfd = lp ? open(lp, O_RDWR | O_CREAT | O_CLOEXEC, 0644) : -1;
        free(lp);
        if (lfd >= 0) flock(lfd, LOCK_EX);
        if (E.prev) {
            cJSON *m = NULL;
            if (load_manifest(ctx, o->out_dir, &m) == TPS_OK && m && joinable(&E, m)) {
                cJSON_Delete(E.prev);
                E.prev = m;
            } else {
                cJSON_Delete(m);
            }
        }
        rc = write_manifest(&E, o, L->plan->label ? L->plan->label : tps_plan_name(L->plan));
        if (lfd >= 0) close(lfd);
        if (rc) goto out;
    }
    TPS_CHECK(tps_fsync_dir(ctx, o->out_dir));
    if (res) {
        for (size_t i = 0; i < E.nfiles; i++) res->bytes_written += E.files[i].size;
        res->bytes_read = E.done;
        res->files_written = (int)E.nfiles;
        for (int r = 0; r < L->tp; r++) res->ranks_written += all[r];
    }
out:
    for (size_t i = 0; i < E.nfiles; i++) {
        ofile *f = &E.files[i];
        if (f->fd >= 0) close(f->fd);
        if (rc && f->tmp && *f->tmp) unlink(f->tmp);
        free(f->final);
        free(f->tmp);
        free(f->hdr);
    }
    free(E.files);
    free(E.slots);
    free(E.tasks);
    free(E.crcs);
    free(E.crclen);
    cJSON_Delete(E.prev);
    free(all);
    return rc;
}
