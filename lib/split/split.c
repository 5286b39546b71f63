/* split.c - the copy engine: writes every rank's local tensors, streaming
 * from the source with bounded memory, and the manifest last.
 *
 * The whole output is laid out before the first byte is written, so every
 * (tensor, rank) slot has a known file and offset; work is then a flat list
 * of tasks that any thread can run with pread/pwrite (or from a mapping of
 * the source), and CRC32s of the pieces a tensor was cut into are joined
 * with crc32_combine. This file owns the layout of the rank files, the
 * tasks, reading, writing and CRCs, and tps_split's phases; the manifest is
 * manifest.c's, the output directory and --ranks joining join.c's. */
#include "internal.h"
#include "split_int.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>
#include <zlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define CHUNK (4u << 20) /* bytes a task moves; two buffers of it per thread */
#define SUB (256u << 10) /* bytes moved per read/CRC/write step of a contiguous task */
#define MULTI_MAX (1u << 20) /* regions smaller than this share tasks (MULTI) */
/* Tasks reading less than this use pread: below it the mmap and munmap cost
 * more than the copy they save (see run_task). Tests lower it to reach the
 * mapped path with tiny models. */
size_t tps_split_map_min = 256u << 10;

#ifndef MAP_POPULATE
#define MAP_POPULATE 0 /* not Linux: the pages fault in as they are read */
#endif

static tps_err add_task(engine *E, task tk, size_t ncrc)
{
    if (E->ntasks == E->cap) {
        size_t cap = E->cap ? E->cap * 2 : 1024;
        task *nt = realloc(E->tasks, cap * sizeof *nt);
        if (!nt) return tps_fail(E->ctx, TPS_E_NOMEM, "out of memory");
        E->tasks = nt;
        E->cap = cap;
    }
    if (E->ncrc + ncrc >= UINT32_MAX)
        return tps_fail(E->ctx, TPS_E_NOMEM, "%s: over 2^32 CRCs to take", E->ck->path);
    tk.crc0 = (uint32_t)E->ncrc;
    E->ncrc += ncrc;
    E->tasks[E->ntasks++] = tk;
    return TPS_OK;
}

/* Which written pieces each region feeds. */
static tps_err index_dests(engine *E)
{
    const tps_layout *L = E->L;
    E->piece_rt = tps_xcalloc(L->npieces ? L->npieces : 1, sizeof *E->piece_rt);
    E->dest0 = tps_xcalloc(L->nregions + 1, sizeof *E->dest0);
    E->dests = tps_xcalloc(L->npieces ? L->npieces : 1, sizeof *E->dests);
    E->region_crc = tps_xcalloc(L->nregions ? L->nregions : 1, sizeof *E->region_crc);
    if (!E->piece_rt || !E->dest0 || !E->dests || !E->region_crc)
        return tps_fail(E->ctx, TPS_E_NOMEM, "out of memory");
    for (size_t k = 0; k < L->nrt; k++)
        for (size_t j = 0; j < L->rt[k].npieces; j++) E->piece_rt[L->rt[k].piece0 + j] = (int)k;
    for (size_t pi = 0; pi < L->npieces; pi++) {
        const tps_lpiece *p = &L->pieces[pi];
        if (p->kind == TPS_PK_SRC && E->write[p->rank]) E->dest0[p->region + 1]++;
    }
    for (size_t g = 0; g < L->nregions; g++) E->dest0[g + 1] += E->dest0[g];
    size_t *fill = tps_xcalloc(L->nregions ? L->nregions : 1, sizeof *fill);
    if (!fill) return tps_fail(E->ctx, TPS_E_NOMEM, "out of memory");
    for (size_t pi = 0; pi < L->npieces; pi++) {
        const tps_lpiece *p = &L->pieces[pi];
        if (p->kind == TPS_PK_SRC && E->write[p->rank])
            E->dests[E->dest0[p->region] + fill[p->region]++] = (uint32_t)pi;
    }
    free(fill);
    return TPS_OK;
}

static int region_written(const engine *E, size_t g)
{
    return E->dest0[g + 1] > E->dest0[g] && !(E->fowned && E->fowned[g]);
}

/* ------------------------------------------------------------------ fused rank tensors */

/* Piece p of rank tensor rt as runs: its first row, its column byte and
 * the bytes of a run (a piece that is whole rows is one run a row). 0 when
 * it is none of the kinds FUSED tasks assemble. */
static int piece_runs(const engine *E, const tps_rtensor *rt, const tps_lpiece *p, uint64_t *r0,
                      uint64_t *c0, uint64_t *run, uint64_t *nr)
{
    uint64_t stride = tps_rt_stride(rt);
    if (!stride || p->xf || p->sdim) return 0;
    *run = p->run ? p->run : stride;
    if (!p->run && (p->at % stride || p->nbytes % stride)) return 0;
    if (p->kind == TPS_PK_SRC) {
        const tps_region *g = &E->L->regions[p->region];
        uint64_t outer, row, s, l;
        tps_region_geom(E->ck, g, &outer, &row, &s, &l);
        if (E->ck->t[g->src].dtype != rt->dtype || (outer > 1 && l != *run) || l * outer != p->nbytes)
            return 0;
    }
    *r0 = p->at / stride;
    *c0 = p->at % stride;
    *nr = *run ? p->nbytes / *run : 0;
    return 1;
}

static int cmp_rt_name(const void *a, const void *b, void *E_)
{
    const engine *E = E_;
    const tps_rtensor *x = &E->L->rt[*(const size_t *)a], *y = &E->L->rt[*(const size_t *)b];
    int c = strcmp(x->name, y->name);
    return c ? c : (x->rank > y->rank) - (x->rank < y->rank);
}

/* Where region run k of piece p's region lies in its source: the byte of
 * the first run a read of runs [k0, ...) starts at and the bytes a run
 * takes in that read (the source row, or the run itself). */
static void src_run(const engine *E, const tps_lpiece *p, uint64_t run, uint64_t k0,
                    uint64_t *off, uint64_t *step, uint64_t *inrow)
{
    uint64_t outer, row, s, l;
    tps_region_geom(E->ck, &E->L->regions[p->region], &outer, &row, &s, &l);
    if (outer > 1) {
        *off = k0 * row;
        *step = row;
        *inrow = s;
    } else {
        *off = s + k0 * run;
        *step = run;
        *inrow = 0;
    }
}

/* The groups of strided rank tensors, the regions only they write, and
 * their tasks. A group whose rank tensors or pieces do not fit the
 * assembly (a row beyond a task's buffers, a widened or refined piece)
 * stays with the tasks of its regions, which write runs one by one. */
static tps_err plan_fused(engine *E)
{
    const tps_layout *L = E->L;
    size_t *idx = tps_xmalloc((L->nrt ? L->nrt : 1) * sizeof *idx), n = 0;
    unsigned char *in_group = tps_xcalloc(L->npieces ? L->npieces : 1, 1);
    if (!idx || !in_group) {
        free(idx);
        free(in_group);
        return tps_fail(E->ctx, TPS_E_NOMEM, "out of memory");
    }
    for (size_t k = 0; k < L->nrt; k++) {
        const tps_rtensor *rt = &L->rt[k];
        if (!E->write[rt->rank] || E->slots[k].file < 0) continue;
        int strided = 0;
        for (size_t j = 0; j < rt->npieces && !strided; j++) strided = L->pieces[rt->piece0 + j].run != 0;
        if (strided) idx[n++] = k;
    }
    qsort_r(idx, n, sizeof *idx, cmp_rt_name, E);
    tps_err rc = TPS_OK;
    for (size_t a = 0; a < n && !rc;) {
        size_t b = a + 1;
        while (b < n && !strcmp(L->rt[idx[b]].name, L->rt[idx[a]].name)) b++;
        const tps_rtensor *r0t = &L->rt[idx[a]];
        uint64_t rows = tps_rt_stride(r0t) ? r0t->nbytes / tps_rt_stride(r0t) : 0, sout = 0, sin = 0;
        int ok = rows > 0;
        for (size_t i = a; i < b && ok; i++) {
            const tps_rtensor *rt = &L->rt[idx[i]];
            uint64_t st = tps_rt_stride(rt);
            ok = st && rt->nbytes / st == rows;
            sout += st;
            for (size_t j = 0; j < rt->npieces && ok; j++) {
                const tps_lpiece *p = &L->pieces[rt->piece0 + j];
                uint64_t pr0, pc0, run, nr, off, step, inrow;
                ok = piece_runs(E, rt, p, &pr0, &pc0, &run, &nr);
                if (ok && p->kind == TPS_PK_SRC) {
                    src_run(E, p, run, 0, &off, &step, &inrow);
                    if (step > sin) sin = step;
                }
            }
        }
        uint64_t per = ok ? CHUNK / (sout > sin ? sout : sin) : 0;
        if (!per) {
            a = b;
            continue;
        }
        fgroup *ng = realloc(E->fg, (E->nfg + 1) * sizeof *ng);
        if (!ng) {
            rc = tps_fail(E->ctx, TPS_E_NOMEM, "out of memory");
            break;
        }
        E->fg = ng;
        fgroup *G = &E->fg[E->nfg];
        G->n = b - a;
        G->rows = rows;
        G->rts = tps_xmalloc(G->n * sizeof *G->rts);
        if (!G->rts) {
            rc = tps_fail(E->ctx, TPS_E_NOMEM, "out of memory");
            break;
        }
        memcpy(G->rts, idx + a, G->n * sizeof *G->rts);
        E->nfg++;
        for (size_t i = 0; i < G->n; i++) {
            const tps_rtensor *rt = &L->rt[G->rts[i]];
            for (size_t j = 0; j < rt->npieces; j++) in_group[rt->piece0 + j] = 1;
        }
        a = b;
    }
    /* a region only grouped rank tensors hold is theirs alone */
    if (!rc && E->nfg) {
        E->fowned = tps_xcalloc(L->nregions ? L->nregions : 1, 1);
        if (!E->fowned) rc = tps_fail(E->ctx, TPS_E_NOMEM, "out of memory");
        for (size_t g = 0; !rc && g < L->nregions; g++) {
            int all = E->dest0[g + 1] > E->dest0[g];
            for (size_t d = E->dest0[g]; d < E->dest0[g + 1] && all; d++) all = in_group[E->dests[d]];
            E->fowned[g] = (unsigned char)all;
        }
    }
    /* the tasks: rows [a, b) of every rank tensor of the group */
    for (size_t gi = 0; !rc && gi < E->nfg; gi++) {
        const fgroup *G = &E->fg[gi];
        uint64_t sout = 0, sin = 0;
        for (size_t i = 0; i < G->n; i++) {
            const tps_rtensor *rt = &L->rt[G->rts[i]];
            sout += tps_rt_stride(rt);
            for (size_t j = 0; j < rt->npieces; j++) {
                const tps_lpiece *p = &L->pieces[rt->piece0 + j];
                uint64_t pr0, pc0, run, nr, off, step, inrow;
                if (p->kind != TPS_PK_SRC || !piece_runs(E, rt, p, &pr0, &pc0, &run, &nr)) continue;
                src_run(E, p, run, 0, &off, &step, &inrow);
                if (step > sin) sin = step;
            }
        }
        uint64_t per = CHUNK / (sout > sin ? sout : sin);
        for (uint64_t r = 0; !rc && r < G->rows; r += per) {
            uint64_t e = r + per < G->rows ? r + per : G->rows;
            size_t ncrc = 0;
            for (size_t i = 0; i < G->n; i++) {
                const tps_rtensor *rt = &L->rt[G->rts[i]];
                for (size_t j = 0; j < rt->npieces; j++) {
                    const tps_lpiece *p = &L->pieces[rt->piece0 + j];
                    uint64_t pr0, pc0, run, nr;
                    if (p->kind == TPS_PK_SRC && E->fowned[p->region] &&
                        L->regions[p->region].primary == rt->piece0 + j &&
                        piece_runs(E, rt, p, &pr0, &pc0, &run, &nr) && pr0 < e && pr0 + nr > r)
                        ncrc++;
                }
            }
            rc = add_task(E, (task){.kind = TASK_FUSED, .g0 = gi, .ng = ncrc, .a = r, .b = e}, ncrc);
            E->total += (e - r) * sout;
        }
    }
    free(idx);
    free(in_group);
    return rc;
}

typedef struct {
    size_t pi;      /* the piece */
    size_t j;       /* its rank tensor's place in the group */
    size_t src;     /* its source tensor (SIZE_MAX: zeros, a constant) */
    size_t key;     /* what one read serves: the region (outer == 1) or the tensor */
    size_t slot;    /* its CRC's place in the pool, or SIZE_MAX: not taken here */
} fpiece;

static int cmp_fpiece(const void *a, const void *b)
{
    const fpiece *x = a, *y = b;
    if (x->src != y->src) return x->src < y->src ? -1 : 1;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return x->pi < y->pi ? -1 : x->pi > y->pi;
}

/* Bytes [off, off + len) of source tensor t for a FUSED task: a read-only
 * mapping of them (under the split's mapping rules) or a pread into buf. A
 * mapping is used inside a SIGBUS guard; a fault sets bus. */
typedef struct {
    const char *src;
    char *map;
    size_t mlen;
    int bus;
} fsrc;

/* pwrite to a rank file, counted in its writers (run_fused writes idle
 * files first). */
static tps_err ofile_write(engine *E, ofile *f, const void *buf, size_t len, uint64_t off)
{
    __atomic_add_fetch(&f->writers, 1, __ATOMIC_RELAXED);
    tps_err rc = tps_pwrite_full(E->ctx, f->fd, f->final, buf, len, off);
    __atomic_sub_fetch(&f->writers, 1, __ATOMIC_RELAXED);
    return rc;
}

/* A read-only, prefaulted mapping of bytes [off, off + len) of source
 * tensor t in fs (1), or 0 where the split's mapping rules say pread (a
 * short read, a piece the checkpoint cannot locate in one file, mmap
 * refused). */
static int fused_map(engine *E, size_t t, uint64_t off, size_t len, fsrc *fs)
{
    int file;
    uint64_t foff;
    fs->map = NULL;
    fs->bus = 0;
    if (!E->map || len < tps_split_map_min || !tps_ckpt_locate(E->ck, t, off, len, &file, &foff))
        return 0;
    uint64_t base = foff & ~(uint64_t)(E->page - 1);
    size_t mlen = (size_t)(foff + len - base);
    char *m = mmap(NULL, mlen, PROT_READ, MAP_SHARED | MAP_POPULATE, E->ck->files[file].fd,
                   (off_t)base);
    if (m == MAP_FAILED) return 0;
    fs->map = m;
    fs->mlen = mlen;
    fs->src = m + (foff - base);
    return 1;
}

static tps_err fused_source(engine *E, size_t t, uint64_t off, size_t len, char *buf, fsrc *fs)
{
    if (fused_map(E, t, off, len, fs)) return TPS_OK;
    fs->src = buf;
    return tps_ckpt_read(E->ctx, E->ck, t, off, buf, len);
}

static void fused_source_done(fsrc *fs)
{
    if (fs->map) munmap(fs->map, fs->mlen);
    fs->map = NULL;
}

static tps_err fused_source_fault(engine *E, size_t t)
{
    tps_err rc = tps_ckpt_recheck(E->ctx, E->ck);
    if (rc) return rc;
    return tps_fail(E->ctx, TPS_E_IO, "%s: cannot read tensor '%s' (SIGBUS under its mapping)",
                    E->ck->path, E->ck->t[t].name);
}

/* Pieces P[k .. e) (one source read, at fs) copied into their rank
 * tensors' blocks of `out` (NULL: only read), their CRCs taken. */
static void fused_copy(engine *E, const fgroup *G, const fpiece *P, size_t k, size_t e,
                       uint64_t a, uint64_t b, uint64_t k0, const fsrc *fs, char *out,
                       const uint64_t *ob)
{
    const tps_layout *L = E->L;
    for (size_t m = k; m < e; m++) {
        const tps_lpiece *p = &L->pieces[P[m].pi];
        const tps_rtensor *rt = &L->rt[G->rts[P[m].j]];
        uint64_t st = tps_rt_stride(rt), off2, step2, inrow2, pr0, pc0, run, nr;
        piece_runs(E, rt, p, &pr0, &pc0, &run, &nr);
        src_run(E, p, run, k0, &off2, &step2, &inrow2);
        uint64_t i0 = pr0 > a ? pr0 : a, i1 = pr0 + nr < b ? pr0 + nr : b;
        uint32_t crc = 0;
        for (uint64_t i = i0; i < i1; i++) {
            const char *from = fs->src + (i - pr0 - k0) * step2 + inrow2;
            if (out) memcpy(out + ob[P[m].j] + (i - a) * st + pc0, from, (size_t)run);
            if (P[m].slot != SIZE_MAX) crc = (uint32_t)tps_crc32(crc, from, (size_t)run);
        }
        if (P[m].slot != SIZE_MAX) {
            E->crcs[P[m].slot] = crc;
            E->crclen[P[m].slot] = (i1 - i0) * run;
        }
    }
}

/* fused_copy reading a mapping inside a SIGBUS guard: 1 when a page of it
 * faulted (the source changed under it). */
static int fused_copy_guarded(engine *E, const fgroup *G, const fpiece *P, size_t k, size_t e,
                              uint64_t a, uint64_t b, uint64_t k0, const fsrc *fs, char *out,
                              const uint64_t *ob)
{
    if (!fs->map) {
        fused_copy(E, G, P, k, e, a, b, k0, fs, out, ob);
        return 0;
    }
    tps_guard gd = {.lo = fs->map, .hi = fs->map + fs->mlen};
    if (sigsetjmp(gd.jb, 1)) return 1;
    tps_guard_enter(&gd);
    fused_copy(E, G, P, k, e, a, b, k0, fs, out, ob);
    tps_guard_leave();
    return 0;
}

/* The rank tensors of group G written, rows [a, b) of each, one(u, i, f,
 * off) writing the i-th at off of file f: files no other thread is
 * writing first (writers of one file wait in turn on its lock: a kernel
 * spin on two cores). Each thread starts at another rank tensor (thread t
 * of T at t/T of the way round); a pass that finds every file busy writes
 * the next one anyway. */
typedef tps_err (*wb_fn)(engine *E, void *u, size_t i, ofile *f, uint64_t off);

static tps_err write_blocks(engine *E, const fgroup *G, uint64_t a, wb_fn one, void *u)
{
    const tps_layout *L = E->L;
    size_t first = 0, left = G->n;
#ifdef _OPENMP
    if (G->n && omp_get_num_threads() > 1)
        first = (size_t)omp_get_thread_num() * G->n / (size_t)omp_get_num_threads() % G->n;
#endif
    unsigned char *done = tps_xcalloc(G->n ? G->n : 1, 1);
    if (!done) return tps_fail(E->ctx, TPS_E_NOMEM, "out of memory");
    tps_err rc = TPS_OK;
    while (!rc && left) {
        /* a pass over the pending ones: the idle files' written, or, when
         * every pending file is busy, the first of them anyway */
        size_t wrote = 0, busy = SIZE_MAX;
        for (size_t w = 0; !rc && w <= G->n; w++) {
            size_t i = w < G->n ? (first + w) % G->n : busy;
            if (w == G->n && (wrote || busy == SIZE_MAX)) break;
            if (done[i]) continue;
            const tps_rtensor *rt = &L->rt[G->rts[i]];
            const oslot *so = &E->slots[G->rts[i]];
            ofile *f = &E->files[so->file];
            if (w < G->n && __atomic_load_n(&f->writers, __ATOMIC_RELAXED)) {
                if (busy == SIZE_MAX) busy = i;
                continue;
            }
            __atomic_add_fetch(&f->writers, 1, __ATOMIC_RELAXED);
            rc = one(E, u, i, f, so->off + a * tps_rt_stride(rt));
            __atomic_sub_fetch(&f->writers, 1, __ATOMIC_RELAXED);
            done[i] = 1;
            left--;
            wrote++;
        }
    }
    free(done);
    return rc;
}

/* The pieces P[k .. *e) of a FUSED task that one read of a source serves
 * (same source and key), the region runs [*k0, k1) they need of rows [a, b),
 * and where those lie in the source: off, len bytes. */
static void source_read(const engine *E, const fgroup *G, const fpiece *P, size_t n, size_t k,
                        uint64_t a, uint64_t b, size_t *e, uint64_t *k0, uint64_t *off,
                        size_t *len)
{
    const tps_layout *L = E->L;
    size_t m = k + 1;
    while (m < n && P[m].src == P[k].src && P[m].key == P[k].key) m++;
    *e = m;
    uint64_t lo = UINT64_MAX, hi = 0, pr0, pc0, run, nr;
    for (m = k; m < *e; m++) {
        piece_runs(E, &L->rt[G->rts[P[m].j]], &L->pieces[P[m].pi], &pr0, &pc0, &run, &nr);
        uint64_t i0 = (pr0 > a ? pr0 : a) - pr0, i1 = (pr0 + nr < b ? pr0 + nr : b) - pr0;
        if (i0 < lo) lo = i0;
        if (i1 > hi) hi = i1;
    }
    uint64_t step, inrow;
    piece_runs(E, &L->rt[G->rts[P[k].j]], &L->pieces[P[k].pi], &pr0, &pc0, &run, &nr);
    src_run(E, &L->pieces[P[k].pi], run, lo, off, &step, &inrow);
    *k0 = lo;
    *len = (size_t)((hi - lo) * step);
}

/* write_blocks from the assembly buffer: block i at out + ob[i]. */
struct wb_copy {
    const char *out;
    const uint64_t *ob;
};

static tps_err wb_copy_one(engine *E, void *u_, size_t i, ofile *f, uint64_t off)
{
    const struct wb_copy *u = u_;
    return tps_pwrite_full(E->ctx, f->fd, f->final, u->out + u->ob[i],
                           (size_t)(u->ob[i + 1] - u->ob[i]), off);
}

/* write_blocks straight from the sources' mappings: rank tensor i's rows,
 * each row its pieces in column order (zeros from a static block). */
static const char gather_zeros[64u << 10];

struct wb_gather {
    const fgroup *G;
    const fpiece *P;
    const size_t *order;   /* P's indices by rank tensor, then column */
    const size_t *first;   /* [G->n + 1] into order */
    const char *const *at; /* P[m]'s source bytes of row k0[m] */
    const uint64_t *step;  /* P[m]'s source step a row */
    const uint64_t *r0;    /* P[m]'s first row in its rank tensor */
    uint64_t a, b;
    const char *lo, *hi;   /* the span of the sources' mappings (one guard) */
    uint32_t *crc;         /* P[m]'s CRC so far */
    const uint64_t *pr0, *prun, *pnr; /* P[m]'s first row, run and rows (piece_runs) */
};

/* Rank tensor i's rows listed and written (inside wb_gather_one's guard). */
static tps_err gather_rows(engine *E, const struct wb_gather *u, size_t i, ofile *f, uint64_t off)
{
    const tps_layout *L = E->L;
    /* Few enough runs a write that the CRCs, taken as the rows are listed,
     * leave them in cache for the kernel's copy. */
    struct iovec iov[64];
    int n = 0;
    tps_err rc = TPS_OK;
    for (size_t q = u->first[i]; q < u->first[i + 1]; q++) u->crc[u->order[q]] = 0;
    for (uint64_t x = u->a; !rc && x < u->b; x++)
        for (size_t q = u->first[i]; !rc && q < u->first[i + 1]; q++) {
            size_t m = u->order[q];
            const tps_lpiece *p = &L->pieces[u->P[m].pi];
            uint64_t pr0 = u->pr0[m], run = u->prun[m], nr = u->pnr[m];
            if (x < pr0 || x >= pr0 + nr) continue;
            const char *from = p->kind == TPS_PK_ZERO ? NULL : u->at[m] + (x - u->r0[m]) * u->step[m];
            if (from && u->P[m].slot != SIZE_MAX)
                u->crc[m] = (uint32_t)tps_crc32(u->crc[m], from, (size_t)run);
            for (uint64_t done = 0; !rc && done < run;) {
                size_t k = !from && run - done > sizeof gather_zeros ? sizeof gather_zeros
                                                                     : (size_t)(run - done);
                iov[n].iov_base = from ? (void *)(from + done) : (void *)gather_zeros;
                iov[n].iov_len = k;
                done += k;
                if (++n == (int)(sizeof iov / sizeof iov[0])) {
                    uint64_t len = 0;
                    for (int v = 0; v < n; v++) len += iov[v].iov_len;
                    rc = tps_pwritev_full(E->ctx, f->fd, f->final, iov, n, off);
                    off += len;
                    n = 0;
                }
            }
        }
    if (!rc && n) rc = tps_pwritev_full(E->ctx, f->fd, f->final, iov, n, off);
    return rc;
}

static tps_err wb_gather_one(engine *E, void *u_, size_t i, ofile *f, uint64_t off)
{
    const struct wb_gather *u = u_;
    const tps_layout *L = E->L;
    const tps_rtensor *rt = &L->rt[u->G->rts[i]];
    tps_guard gd = {.lo = u->lo, .hi = u->hi};
    if (sigsetjmp(gd.jb, 1)) {
        tps_err r2 = tps_ckpt_recheck(E->ctx, E->ck);
        if (r2) return r2;
        return tps_fail(E->ctx, TPS_E_IO, "%s: cannot read the sources of '%s' (SIGBUS under their "
                                          "mappings)", E->ck->path, rt->name);
    }
    tps_guard_enter(&gd);
    errno = 0;
    tps_err rc = gather_rows(E, u, i, f, off);
    tps_guard_leave();
    if (rc && errno == EFAULT) {
        /* the kernel read a page of a source that is no longer there */
        tps_err r2 = tps_ckpt_recheck(E->ctx, E->ck);
        if (r2) return r2;
    }
    for (size_t q = u->first[i]; !rc && q < u->first[i + 1]; q++) {
        size_t m = u->order[q];
        if (u->P[m].slot == SIZE_MAX) continue;
        uint64_t pr0, pc0, run, nr;
        piece_runs(E, rt, &L->pieces[u->P[m].pi], &pr0, &pc0, &run, &nr);
        uint64_t i0 = pr0 > u->a ? pr0 : u->a, i1 = pr0 + nr < u->b ? pr0 + nr : u->b;
        E->crcs[u->P[m].slot] = u->crc[m];
        E->crclen[u->P[m].slot] = (i1 - i0) * run;
    }
    return rc;
}

static int cmp_col(const void *x, const void *y, void *u_)
{
    const uint64_t *c = u_;
    size_t a = *(const size_t *)x, b = *(const size_t *)y;
    return (c[a] > c[b]) - (c[a] < c[b]);
}

/* A FUSED task's gathered writes (see run_fused): *done 0 (nothing written,
 * no CRC taken) where a source is not mapped or a rank tensor's rows are
 * not tiled by its pieces; the caller then assembles. */
static tps_err fused_gathered(engine *E, const task *tk, const fgroup *G, fpiece *P, size_t n,
                              const uint64_t *ob, int *done)
{
    const tps_layout *L = E->L;
    uint64_t a = tk->a, b = tk->b;
    (void)ob;
    *done = 0;
    fsrc *fs = tps_xcalloc(n ? n : 1, sizeof *fs);
    size_t *grp = tps_xcalloc(n ? n : 1, sizeof *grp), *order = tps_xcalloc(n ? n : 1, sizeof *order);
    size_t *first = tps_xcalloc(G->n + 1, sizeof *first);
    const char **at = tps_xcalloc(n ? n : 1, sizeof *at);
    uint64_t *step = tps_xcalloc(n ? n : 1, sizeof *step), *r0 = tps_xcalloc(n ? n : 1, sizeof *r0),
             *col = tps_xcalloc(n ? n : 1, sizeof *col), *k0s = tps_xcalloc(n ? n : 1, sizeof *k0s);
    size_t nfs = 0;
    tps_err rc = fs && grp && order && first && at && step && r0 && col && k0s
                     ? TPS_OK
                     : tps_fail(E->ctx, TPS_E_NOMEM, "out of memory");
    int ok = !rc;
    /* each rank tensor's rows tiled by its pieces, in column order */
    for (size_t m = 0; ok && m < n; m++) {
        uint64_t pr0, pc0, run, nr;
        ok = piece_runs(E, &L->rt[G->rts[P[m].j]], &L->pieces[P[m].pi], &pr0, &pc0, &run, &nr);
        col[m] = pc0;
        first[P[m].j + 1]++;
    }
    for (size_t i = 0; ok && i < G->n; i++) first[i + 1] += first[i];
    if (ok) {
        size_t *fill = tps_xcalloc(G->n + 1, sizeof *fill);
        ok = fill != NULL;
        for (size_t m = 0; ok && m < n; m++) order[first[P[m].j] + fill[P[m].j]++] = m;
        free(fill);
    }
    for (size_t i = 0; ok && i < G->n; i++) {
        qsort_r(order + first[i], first[i + 1] - first[i], sizeof *order, cmp_col, col);
        const tps_rtensor *rt = &L->rt[G->rts[i]];
        uint64_t st = tps_rt_stride(rt);
        for (uint64_t x = a; ok && x < b; x++) {
            uint64_t c = 0;
            for (size_t q = first[i]; ok && q < first[i + 1]; q++) {
                size_t m = order[q];
                uint64_t pr0, pc0, run, nr;
                piece_runs(E, rt, &L->pieces[P[m].pi], &pr0, &pc0, &run, &nr);
                if (x < pr0 || x >= pr0 + nr) continue;
                ok = pc0 == c;
                c += run;
            }
            ok = ok && c == st;
        }
    }
    /* every source mapped, its pieces' CRCs taken from the mapping */
    for (size_t k = 0; ok && !rc && k < n;) {
        if (P[k].src == SIZE_MAX) {
            k++;
            continue;
        }
        size_t e, len;
        uint64_t k0, off, pr0, pc0, run, nr;
        source_read(E, G, P, n, k, a, b, &e, &k0, &off, &len);
        if (!fused_map(E, P[k].src, off, len, &fs[nfs])) {
            ok = 0;
            break;
        }
        for (size_t m = k; m < e; m++) {
            uint64_t o2, s2, in2;
            piece_runs(E, &L->rt[G->rts[P[m].j]], &L->pieces[P[m].pi], &pr0, &pc0, &run, &nr);
            src_run(E, &L->pieces[P[m].pi], run, k0, &o2, &s2, &in2);
            k0s[m] = k0;
            step[m] = s2;
            /* row pr0 + k0 of the piece lies at the mapping's start */
            at[m] = fs[nfs].src + in2;
            r0[m] = pr0 + k0;
        }
        grp[nfs++] = k;
        k = e;
    }
    if (ok && !rc) {
        const char *lo = NULL, *hi = NULL;
        for (size_t g = 0; g < nfs; g++) {
            if (!lo || fs[g].map < lo) lo = fs[g].map;
            if (!hi || fs[g].map + fs[g].mlen > hi) hi = fs[g].map + fs[g].mlen;
        }
        uint32_t *crc = tps_xcalloc(n ? n : 1, sizeof *crc);
        uint64_t *geo = tps_xcalloc(3 * (n ? n : 1), sizeof *geo);
        if (!crc || !geo) rc = tps_fail(E->ctx, TPS_E_NOMEM, "out of memory");
        for (size_t m = 0; !rc && m < n; m++) {
            uint64_t pc0;
            piece_runs(E, &L->rt[G->rts[P[m].j]], &L->pieces[P[m].pi], &geo[m], &pc0, &geo[n + m],
                       &geo[2 * n + m]);
        }
        struct wb_gather u = {G, P, order, first, at, step, r0, a, b, lo, hi, crc,
                              geo, geo + n, geo + 2 * n};
        if (!rc) rc = write_blocks(E, G, a, wb_gather_one, &u);
        free(crc);
        free(geo);
        *done = 1;
    }
    for (size_t g = 0; g < nfs; g++) fused_source_done(&fs[g]);
    free(fs);
    free(grp);
    free(order);
    free(first);
    free(at);
    free(step);
    free(r0);
    free(col);
    free(k0s);
    return rc;
}

/* A FUSED task: every rank tensor's rows [a, b) assembled in `out` (a
 * block a rank tensor, back to back), each source's rows read once into
 * `in`, then one write a rank tensor. */
static tps_err run_fused(engine *E, const task *tk, char *in, char *out)
{
    const tps_layout *L = E->L;
    const fgroup *G = &E->fg[tk->g0];
    uint64_t a = tk->a, b = tk->b;
    size_t np = 0;
    for (size_t i = 0; i < G->n; i++) np += L->rt[G->rts[i]].npieces;
    fpiece *P = tps_xmalloc((np ? np : 1) * sizeof *P);
    uint64_t *ob = tps_xmalloc((G->n + 1) * sizeof *ob);
    tps_err rc = P && ob ? TPS_OK : tps_fail(E->ctx, TPS_E_NOMEM, "out of memory");
    size_t n = 0, c = 0;
    if (ob) ob[0] = 0;
    for (size_t i = 0; !rc && i < G->n; i++) {
        const tps_rtensor *rt = &L->rt[G->rts[i]];
        ob[i + 1] = ob[i] + (b - a) * tps_rt_stride(rt);
        for (size_t j = 0; j < rt->npieces; j++) {
            size_t pi = rt->piece0 + j;
            const tps_lpiece *p = &L->pieces[pi];
            uint64_t pr0, pc0, run, nr;
            piece_runs(E, rt, p, &pr0, &pc0, &run, &nr);
            if (!(pr0 < b && pr0 + nr > a)) continue;
            fpiece f = {.pi = pi, .j = i, .src = SIZE_MAX, .key = 0, .slot = SIZE_MAX};
            if (p->kind == TPS_PK_SRC) {
                const tps_region *g = &L->regions[p->region];
                uint64_t outer, row, s, l;
                tps_region_geom(E->ck, g, &outer, &row, &s, &l);
                f.src = g->src;
                f.key = outer > 1 ? SIZE_MAX : p->region;
                /* the CRC's place, in the order plan_fused counted them */
                if (E->fowned[p->region] && g->primary == pi) f.slot = tk->crc0 + c++;
            }
            P[n++] = f;
        }
    }
    int zeros = 0;
    for (size_t k = 0; k < n; k++) zeros |= L->pieces[P[k].pi].kind == TPS_PK_ZERO;
    if (!rc) qsort(P, n, sizeof *P, cmp_fpiece);
    /* Every source mapped and no constants: each rank tensor's block goes
     * to its file straight from the mappings (gathered writes), without
     * the assembly below. */
    int consts = 0;
    for (size_t k = 0; k < n; k++) consts |= L->pieces[P[k].pi].kind == TPS_PK_CONST;
    if (!rc && E->map && !consts) {
        int done = 0;
        rc = fused_gathered(E, tk, G, P, n, ob, &done);
        if (rc || done) {
            free(P);
            free(ob);
            return rc;
        }
    }
    if (!rc && zeros) memset(out, 0, (size_t)ob[G->n]);
    /* constants (zeros are the memset's) */
    for (size_t k = 0; !rc && consts && k < n; k++) {
        const tps_lpiece *p = &L->pieces[P[k].pi];
        if (p->kind != TPS_PK_CONST) continue;
        const tps_rtensor *rt = &L->rt[G->rts[P[k].j]];
        uint64_t pr0, pc0, run, nr, st = tps_rt_stride(rt);
        piece_runs(E, rt, p, &pr0, &pc0, &run, &nr);
        unsigned char el[8];
        size_t es = tps_dtype_bits(rt->dtype) / 8;
        tps_encode_value(rt->dtype, p->value, el);
        uint64_t i0 = pr0 > a ? pr0 : a, i1 = pr0 + nr < b ? pr0 + nr : b;
        for (uint64_t i = i0; i < i1; i++)
            for (uint64_t x = 0; x < run; x++)
                out[ob[P[k].j] + (i - a) * st + pc0 + x] = (char)el[x % es];
    }
    /* the sources in turn, each one's rows read once for every piece it feeds */
    for (size_t k = 0; !rc && k < n;) {
        if (P[k].src == SIZE_MAX) {
            k++;
            continue;
        }
        size_t e, len;
        uint64_t k0, off;
        source_read(E, G, P, n, k, a, b, &e, &k0, &off, &len);
        fsrc fs = {.src = in};
        rc = fused_source(E, P[k].src, off, len, in, &fs);
        if (!rc) fs.bus = fused_copy_guarded(E, G, P, k, e, a, b, k0, &fs, out, ob);
        fused_source_done(&fs);
        if (fs.bus) rc = fused_source_fault(E, P[k].src);
        k = e;
    }
    struct wb_copy u = {out, ob};
    if (!rc) rc = write_blocks(E, G, a, wb_copy_one, &u);
    free(P);
    free(ob);
    return rc;
}

/* A unit MULTI can take at region g: one small region that is one run of
 * its source (*ng = 1), or every region of a small tensor split along a
 * dim other than the first (*ng of them, read whole and cut in memory: an
 * expert's down_proj by columns). Each is written to some rank, and the
 * unit's *len source bytes lie at *file, *foff. 0: none. */
static int multi_unit(const engine *E, size_t g, size_t *ng, uint64_t *len, int *file, uint64_t *foff)
{
    const tps_layout *L = E->L;
    const tps_region *rg = &L->regions[g];
    uint64_t outer, row, s, l;
    tps_region_geom(E->ck, rg, &outer, &row, &s, &l);
    if (outer == 1 || l == row) {
        *ng = 1;
        *len = rg->nbytes;
        return region_written(E, g) && rg->nbytes && rg->nbytes < MULTI_MAX &&
               tps_ckpt_locate(E->ck, rg->src, s, rg->nbytes, file, foff);
    }
    uint64_t whole = outer * row;
    if (whole >= MULTI_MAX || (g > 0 && L->regions[g - 1].src == rg->src)) return 0;
    size_t n = 0;
    while (g + n < L->nregions && L->regions[g + n].src == rg->src) {
        const tps_region *r2 = &L->regions[g + n];
        if (r2->dim != rg->dim || !region_written(E, g + n) || !r2->nbytes) return 0;
        n++;
    }
    *ng = n;
    *len = whole;
    return tps_ckpt_locate(E->ck, rg->src, 0, whole, file, foff);
}

/* Transposed region g (tps_xform.tr): TROWS tasks of whole rows, each
 * whole matrices (as many as fit a task's buffer) or a part of one. */
static tps_err plan_transposed(engine *E, size_t g)
{
    const tps_region *rg = &E->L->regions[g];
    const tps_ctensor *t = &E->ck->t[rg->src];
    uint64_t n, A, B;
    tps_tr_dims(t, rg->dim, rg->lo, rg->hi, &n, &A, &B);
    uint64_t rb = B * (tps_dtype_bits(t->dtype) / 8), total = n * A;
    if (!region_written(E, g) || !rb || !total) return TPS_OK;
    uint64_t sb = A * (tps_dtype_bits(t->dtype) / 8); /* a stored row: A elements */
    if (rb > CHUNK || sb > CHUNK)
        return tps_fail(E->ctx, TPS_E_ARG, "tensor '%s': a transposed piece's rows of %llu bytes "
                        "(stored: %llu) are more than a task moves (%u)", t->name,
                        (unsigned long long)rb, (unsigned long long)sb, CHUNK);
    uint64_t rows = CHUNK / rb;
    for (uint64_t k = 0; k < total;) {
        uint64_t e = rows >= A ? k + rows / A * A : k + rows;
        uint64_t end = rows >= A ? total : (k / A + 1) * A; /* a part stays in its matrix */
        if (e > end) e = end;
        TPS_TRY(add_task(E, (task){.kind = TASK_TROWS, .t = rg->src, .g0 = g, .ng = 1, .a = k,
                                   .b = e}, 1));
        E->total += (e - k) * rb;
        k = e;
    }
    return TPS_OK;
}

/* Where byte x of region g lies in its source tensor; *rb the bytes of a
 * row of its transposed matrices. */
static uint64_t region_src(const engine *E, size_t g, uint64_t x, uint64_t *rb)
{
    const tps_region *rg = &E->L->regions[g];
    const tps_ctensor *t = &E->ck->t[rg->src];
    uint64_t outer, row, s, l, n, A, B;
    tps_region_geom(E->ck, rg, &outer, &row, &s, &l);
    tps_tr_dims(t, rg->dim, rg->lo, rg->hi, &n, &A, &B);
    *rb = B * (tps_dtype_bits(t->dtype) / 8);
    return l ? x / l * row + s + x % l : s;
}

static tps_err plan_tasks(engine *E)
{
    const tps_layout *L = E->L;
    TPS_TRY(plan_fused(E));
    for (size_t g = 0; g < L->nregions;) {
        const tps_region *rg = &L->regions[g];
        uint64_t outer, row, s, l;
        tps_region_geom(E->ck, rg, &outer, &row, &s, &l);
        /* Small tensors back to back in one file: one task, one read (a
         * mapping or a pread each cost more than a small copy; a MoE's
         * experts are thousands of them). */
        size_t mg, un;
        uint64_t total, ul, fo0, fo2;
        int f0, f2;
        if (multi_unit(E, g, &mg, &total, &f0, &fo0)) {
            int strided = mg > 1;
            while (g + mg < L->nregions && multi_unit(E, g + mg, &un, &ul, &f2, &fo2) && f2 == f0 &&
                   fo2 == fo0 + total && total + ul <= CHUNK) {
                strided |= un > 1;
                total += ul;
                mg += un;
            }
            /* One tensor alone: the plain tasks below do the same. */
            if (mg > 1 && !(strided && L->regions[g + mg - 1].src == rg->src)) {
                TPS_TRY(add_task(E, (task){.kind = TASK_MULTI, .t = rg->src, .g0 = g, .ng = mg,
                                           .a = 0, .b = total, .src = fo0, .file = f0}, mg));
                E->total += total;
                g += mg;
                continue;
            }
        }
        if (tps_lpiece_tr(L, &L->pieces[rg->primary])) {
            TPS_TRY(plan_transposed(E, g));
            g++;
            continue;
        }
        if (outer == 1 || l == row) {
            /* One run of the source: [s, s + l) of the only row, or whole rows.
             * Where clones share blocks, tasks after the first start on a
             * source block, so no block is cut between two tasks. */
            uint64_t skew = 0, fo;
            int fl;
            if (E->kc.mode == TPS_KC_CLONE && tps_ckpt_run(E->ck, rg->src, s, &fl, &fo))
                skew = fo % E->kc.blk;
            if (region_written(E, g))
                for (uint64_t a = 0; a < rg->nbytes;) {
                    uint64_t b = a + CHUNK - (a ? 0 : skew);
                    if (b > rg->nbytes) b = rg->nbytes;
                    TPS_TRY(add_task(E, (task){.kind = TASK_CONTIG, .t = rg->src, .g0 = g, .ng = 1,
                                               .a = a, .b = b, .src = s + a, .run = 1}, 1));
                    E->total += b - a;
                    a = b;
                }
            g++;
            continue;
        }
        /* Strided: this tensor's regions along the same dim, in blocks of rows. */
        size_t ng = 1;
        while (g + ng < L->nregions && L->regions[g + ng].src == rg->src &&
               L->regions[g + ng].dim == rg->dim)
            ng++;
        uint64_t want = 0;
        for (size_t k = 0; k < ng; k++)
            if (region_written(E, g + k)) {
                uint64_t o2, r2, s2, l2;
                tps_region_geom(E->ck, &L->regions[g + k], &o2, &r2, &s2, &l2);
                want += l2;
            }
        if (want && row > CHUNK) {
            /* A row larger than a task's buffers: each region's slice of each
             * row is one run of the source, copied as CONTIG tasks of at most
             * CHUNK bytes, in the region's byte order. */
            for (size_t k = 0; k < ng; k++) {
                if (!region_written(E, g + k)) continue;
                uint64_t o2, r2, s2, l2;
                tps_region_geom(E->ck, &L->regions[g + k], &o2, &r2, &s2, &l2);
                for (uint64_t o = 0; o < o2; o++)
                    for (uint64_t a = 0; a < l2; a += CHUNK) {
                        uint64_t b = a + CHUNK < l2 ? a + CHUNK : l2;
                        TPS_TRY(add_task(E, (task){.kind = TASK_CONTIG, .t = rg->src, .g0 = g + k,
                                                   .ng = 1, .a = o * l2 + a, .b = o * l2 + b,
                                                   .src = o * r2 + s2 + a}, 1));
                        E->total += b - a;
                    }
            }
        } else if (want) {
            int full = want * 4 >= row; /* reading whole rows wastes little */
            uint64_t rows = CHUNK / row;
            for (uint64_t a = 0; a < outer; a += rows) {
                uint64_t b = a + rows < outer ? a + rows : outer;
                TPS_TRY(add_task(E, (task){.kind = TASK_ROWS, .t = rg->src, .g0 = g, .ng = ng,
                                           .a = a, .b = b, .full_rows = full}, ng));
                E->total += (b - a) * (full ? row : want);
            }
        }
        g += ng;
    }
    E->crcs = tps_xcalloc(E->ncrc ? E->ncrc : 1, sizeof *E->crcs);
    E->crclen = tps_xcalloc(E->ncrc ? E->ncrc : 1, sizeof *E->crclen);
    if (!E->crcs || !E->crclen) return tps_fail(E->ctx, TPS_E_NOMEM, "out of memory");
    return TPS_OK;
}

/* A refined piece (tps_xform): the whole region's len bytes, each element
 * widened to F32 and repeated rep_n x rep_k times, the region's dim cropped
 * to `out` repeated rows or columns from `skip`, in one write. */
static tps_err write_refined(engine *E, size_t pi, const void *buf, size_t len, uint64_t off,
                             int fd, const char *path, uint64_t at)
{
    const tps_layout *L = E->L;
    const tps_lpiece *p = &L->pieces[pi];
    const tps_region *g = &L->regions[p->region];
    const tps_ctensor *t = &E->ck->t[g->src];
    const tps_xform *x = &L->xforms[p->xf - 1];
    uint64_t rows = t->ndim == 2 ? t->shape[0] : 1, cols = t->ndim == 2 ? t->shape[1] : 1;
    if (g->dim == 0) rows = g->hi - g->lo;
    if (g->dim == 1) cols = g->hi - g->lo;
    size_t es = tps_dtype_bits(t->dtype) / 8;
    if (off || len != rows * cols * es || t->ndim != 2)
        return tps_fail(E->ctx, TPS_E_ARG,
                        "%s: tensor '%s': a refined scale piece must be written whole", path,
                        t->name);
    uint64_t orows, ocols, sr, sc;
    tps_xform_grid(x, g->dim, rows, cols, &orows, &ocols, &sr, &sc);
    float *o = tps_xmalloc((size_t)(orows * ocols) * sizeof *o + 1);
    if (!o) return tps_fail(E->ctx, TPS_E_NOMEM, "out of memory");
    const unsigned char *in = buf;
    for (uint64_t i = 0; i < orows; i++)
        for (uint64_t j = 0; j < ocols; j++) {
            uint64_t si = (i + sr) / x->rep_n, sj = (j + sc) / x->rep_k;
            tps_widen_f32(t->dtype, in + (si * cols + sj) * es, &o[i * ocols + j], 1);
        }
    tps_err rc = (orows * ocols * 4 == p->nbytes)
                     ? tps_pwrite_full(E->ctx, fd, path, o, (size_t)p->nbytes, at)
                     : tps_fail(E->ctx, TPS_E_ARG, "%s: tensor '%s': refined piece of %llu "
                                "bytes, %llu expected", path, t->name,
                                (unsigned long long)(orows * ocols * 4),
                                (unsigned long long)p->nbytes);
    free(o);
    return rc;
}

/* A transposed piece (tps_xform.tr): rows [k0, k1) of its region (a row is
 * the region's last dim), each matrix's rows written as its stored columns:
 * one write for a whole matrix, one a stored row for a part of one. The rows
 * are in buf back to back, or (map, buf NULL) in the source's mapping of
 * bytes from source byte `first` on, a matrix's rows `ist` bytes apart
 * (tr_stride). scratch: a task's buffer of (k1 - k0) rows, or NULL. */
static tps_err write_tr_rows(engine *E, size_t pi, const char *buf, const char *map,
                             uint64_t first, size_t ist, uint64_t k0, uint64_t k1, char *scratch,
                             uint32_t *crc, ofile *f, uint64_t at)
{
    const tps_layout *L = E->L;
    size_t g = L->pieces[pi].region;
    const tps_region *rg = &L->regions[g];
    const tps_ctensor *t = &E->ck->t[rg->src];
    uint64_t n, A, B;
    tps_tr_dims(t, rg->dim, rg->lo, rg->hi, &n, &A, &B);
    size_t es = tps_dtype_bits(t->dtype) / 8;
    uint64_t rb = B * es, mat = A * rb;
    if (k0 >= k1) return TPS_OK;
    char *o = scratch ? scratch : tps_xmalloc((size_t)((k1 - k0) * rb));
    if (!o) return tps_fail(E->ctx, TPS_E_NOMEM, "out of memory");
    tps_err rc = TPS_OK;
    for (uint64_t k = k0; !rc && k < k1;) {
        uint64_t m = k / A, a0 = k % A, a1 = A - a0 < k1 - k ? A : a0 + (k1 - k), na = a1 - a0;
        const char *rows;
        size_t step = (size_t)rb;
        if (map) {
            uint64_t unused;
            rows = map + (region_src(E, g, k * rb, &unused) - first);
            step = ist;
        } else {
            rows = buf + (k - k0) * rb;
        }
        /* 64 rows at a time: the CRC (crc: of the rows in order) reads them into
         * cache, the transpose finds them there */
        for (uint64_t r = 0; r < na; r += 64) {
            uint64_t nr = na - r < 64 ? na - r : 64;
            for (uint64_t q = 0; crc && q < nr; q++)
                *crc = tps_crc32(*crc, rows + (r + q) * step, (size_t)rb);
            tps_transpose(o + r * es, (size_t)(na * es), rows + r * step, step, nr, B, es);
        }
        if (na == A) {
            rc = ofile_write(E, f, o, (size_t)mat, at + m * mat);
        } else {
            for (uint64_t b = 0; !rc && b < B; b++)
                rc = ofile_write(E, f, o + b * na * es, (size_t)(na * es),
                                 at + m * mat + (b * A + a0) * es);
        }
        k = m * A + a1;
    }
    if (!scratch) free(o);
    return rc;
}

/* Region bytes [off, off + len) of transposed piece pi, back to back in buf:
 * whole rows (TROWS and MULTI tasks give them so). */
static tps_err write_transposed(engine *E, size_t pi, const void *buf, size_t len, uint64_t off,
                                ofile *f, uint64_t at)
{
    const tps_region *g = &E->L->regions[E->L->pieces[pi].region];
    const tps_ctensor *t = &E->ck->t[g->src];
    uint64_t rb;
    region_src(E, E->L->pieces[pi].region, 0, &rb);
    if (!len) return TPS_OK;
    if (!rb || off % rb || len % rb)
        return tps_fail(E->ctx, TPS_E_ARG, "%s: tensor '%s': a transposed piece must be written "
                        "in whole rows", f->final, t->name);
    return write_tr_rows(E, pi, buf, NULL, 0, 0, off / rb, (off + len) / rb, NULL, NULL, f, at);
}

/* The bytes between a matrix's consecutive rows in the source of transposed
 * region g: the source's row (a cut along the last dim: a region row each
 * source row) or the region row itself (a matrix's rows back to back within
 * one outer slice); 0 when neither holds (then rows are copied first). */
static size_t tr_stride(const engine *E, size_t g)
{
    const tps_region *rg = &E->L->regions[g];
    const tps_ctensor *t = &E->ck->t[rg->src];
    uint64_t outer, row, s, l, n, A, B, rb;
    tps_region_geom(E->ck, rg, &outer, &row, &s, &l);
    tps_tr_dims(t, rg->dim, rg->lo, rg->hi, &n, &A, &B);
    rb = B * (tps_dtype_bits(t->dtype) / 8);
    if (l == rb) return (size_t)row;
    if (A && rb && l % (A * rb) == 0) return (size_t)rb;
    return 0;
}

static void copy_runs(char *m, uint64_t base, uint64_t at, uint64_t run, uint64_t stride,
                      const char *in, uint64_t off, size_t len)
{
    for (uint64_t x = off; x < off + len;) {
        uint64_t k = x / run, w = x % run;
        size_t n = (size_t)(run - w < off + len - x ? run - w : off + len - x);
        memcpy(m + (at + k * stride + w - base), in, n);
        in += n;
        x += n;
    }
}

/* Bytes [off, off + len) of strided piece p (its rank tensor at file
 * offset slot_off) through a shared mapping of the span they land in;
 * *done 0 when it cannot be mapped. A page the file system cannot give
 * (full, quota) raises SIGBUS there: an error naming the file. */
static tps_err write_runs_mapped(engine *E, const ofile *f, const tps_rtensor *rt,
                                 const tps_lpiece *p, uint64_t stride, const char *in,
                                 uint64_t off, size_t len, uint64_t slot_off, int *done)
{
    uint64_t at = slot_off + p->at, e = off + len - 1;
    uint64_t d0 = at + (off / p->run) * stride + off % p->run;
    uint64_t d1 = at + (e / p->run) * stride + e % p->run + 1;
    uint64_t base = d0 & ~(uint64_t)(E->page - 1);
    size_t mlen = (size_t)(d1 - base);
    char *const m = mmap(NULL, mlen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, f->fd,
                         (off_t)base);
    *done = 0;
    if (m == MAP_FAILED) return TPS_OK;
    tps_guard gd = {.lo = m, .hi = m + mlen};
    if (sigsetjmp(gd.jb, 1)) {
        munmap(m, mlen);
        return tps_fail(E->ctx, TPS_E_IO, "%s: cannot write tensor '%s': no space for its pages "
                        "(SIGBUS under the output's mapping)", f->final, rt->name);
    }
    tps_guard_enter(&gd);
    copy_runs(m, base, at, p->run, stride, in, off, len);
    tps_guard_leave();
    munmap(m, mlen);
    *done = 1;
    return TPS_OK;
}

/* Writes len bytes that start `off` bytes into piece pi's region. */
static tps_err write_piece(engine *E, size_t pi, const void *buf, size_t len, uint64_t off)
{
    const tps_lpiece *p = &E->L->pieces[pi];
    const tps_rtensor *rt = &E->L->rt[E->piece_rt[pi]];
    const oslot *s = &E->slots[E->piece_rt[pi]];
    ofile *f = &E->files[s->file];
    tps_dtype sd = E->ck->t[E->L->regions[p->region].src].dtype;
    if (tps_lpiece_tr(E->L, p)) return write_transposed(E, pi, buf, len, off, f, s->off + p->at);
    if (p->xf) return write_refined(E, pi, buf, len, off, f->fd, f->final, s->off + p->at);
    if (p->run) {
        /* concatenated along the last dim: its runs `stride` apart */
        if (rt->dtype != sd)
            return tps_fail(E->ctx, TPS_E_ARG, "%s: tensor '%s': a strided piece cannot be widened",
                            f->final, rt->name);
        uint64_t stride = tps_piece_stride(rt, p);
        const char *in = buf;
        /* Many short runs: copied into a shared mapping of the rank file's
         * span, a sub-chunk at a time (a write per run costs a syscall per
         * 2 KiB of a fused GPTQ qweight; the threads' runs interleave but
         * never overlap, and the page cache is one). Under the SIGBUS guard
         * the source mappings hold (E->map). */
        while (len >= (64u << 10) && p->run < (16u << 10) && E->map) {
            size_t sub = len < SUB * 4 ? len : SUB * 4;
            int done = 0;
            TPS_TRY(write_runs_mapped(E, f, rt, p, stride, in, off, sub, s->off, &done));
            if (!done) break; /* the writes below do it */
            in += sub;
            off += sub;
            len -= sub;
        }
        while (len) {
            uint64_t k = off / p->run, w = off % p->run;
            size_t n = (size_t)(p->run - w < len ? p->run - w : len);
            TPS_TRY(tps_pwrite_full(E->ctx, f->fd, f->final, in, n, s->off + p->at + k * stride + w));
            in += n;
            off += n;
            len -= n;
        }
        return TPS_OK;
    }
    if (rt->dtype == sd) return ofile_write(E, f, buf, len, s->off + p->at + off);
    /* Widened to F32 (a scale): whole elements, as tasks cut them. */
    size_t es = tps_dtype_bits(sd) / 8;
    unsigned char wide[4096];
    const unsigned char *in = buf;
    for (size_t a = 0; a < len; a += sizeof wide / 4 * es) {
        size_t n = (len - a) / es < sizeof wide / 4 ? (len - a) / es : sizeof wide / 4;
        tps_widen_f32(sd, in + a, wide, n);
        TPS_TRY(tps_pwrite_full(E->ctx, f->fd, f->final, wide, n * 4,
                                s->off + p->at + (off + a) / es * 4));
    }
    return TPS_OK;
}

/* write_piece straight from the source's mapping (file src_path, tensor
 * t): EFAULT says the bytes to write could not be read, the source's fault,
 * not the output's. */
static tps_err write_mapped(engine *E, size_t pi, const char *p, size_t len, uint64_t off,
                            const char *src_path, size_t t)
{
    errno = 0;
    tps_err rc = write_piece(E, pi, p, len, off);
    if (rc && errno == EFAULT)
        return tps_fail(E->ctx, TPS_E_IO, "%s: cannot read tensor '%s' (EFAULT under its mapping)", src_path,
                        E->ck->t[t].name);
    return rc;
}

/* Bytes [off, off + len) of region g, lying at foff of source file `file`,
 * copied by the kernel into every rank file that holds the region (*done),
 * or left to the caller (*done 0: a piece is widened, or the kernel refused;
 * the caller then writes them all, over whatever was copied). */
static tps_err kcopy_region(engine *E, size_t g, int file, uint64_t foff, uint64_t len,
                            uint64_t off, int *done)
{
    const tps_layout *L = E->L;
    tps_dtype sd = E->ck->t[L->regions[g].src].dtype;
    const tps_cfile *sf = &E->ck->files[file];
    *done = 0;
    for (size_t d = E->dest0[g]; d < E->dest0[g + 1]; d++)
        if (L->rt[E->piece_rt[E->dests[d]]].dtype != sd || L->pieces[E->dests[d]].run ||
            L->pieces[E->dests[d]].xf)
            return TPS_OK;
    for (size_t d = E->dest0[g]; d < E->dest0[g + 1]; d++) {
        const tps_lpiece *p = &L->pieces[E->dests[d]];
        const oslot *s = &E->slots[E->piece_rt[E->dests[d]]];
        const ofile *f = &E->files[s->file];
        TPS_TRY(tps_kcopy_range(E->ctx, &E->kc, sf->fd, sf->path, foff, f->fd, f->final,
                                s->off + p->at + off, len, done));
        if (!*done) return TPS_OK;
    }
    return TPS_OK;
}

/* A CONTIG task through the kernel's copies (*done; else the caller copies
 * it as before). Its CRC is taken from the source bytes it copied, read
 * after the copy: a clone shares them and a kernel copy copied them, so they
 * are the bytes the rank file holds, unless the source changed in between,
 * and then the recheck at the end fails the split. copy_file_range goes in
 * sub-chunks, so the CRC finds in cache what the kernel just read; a clone
 * reads nothing and goes whole. */
static tps_err kcopy_contig(engine *E, const task *tk, const char *src, char *in, int *done)
{
    uint64_t len = tk->b - tk->a, step = E->kc.mode == TPS_KC_CLONE ? len : SUB;
    uint32_t crc = 0;
    *done = 0;
    for (uint64_t a = 0, n; a < len; a += n) {
        /* a run of a resharded source may lie in two rank files */
        uint64_t foff, run;
        int file;
        run = tps_ckpt_run(E->ck, tk->t, tk->src + a, &file, &foff);
        if (!run) return TPS_OK;
        n = len - a < step ? len - a : step;
        if (run < n) n = run;
        TPS_TRY(kcopy_region(E, tk->g0, file, foff, n, tk->a + a, done));
        if (!*done) return TPS_OK;
        if (src) {
            crc = tps_crc32(crc, src + a, (size_t)n);
            continue;
        }
        for (uint64_t b = 0; b < n; b += SUB) {
            size_t m = (size_t)(n - b < SUB ? n - b : SUB);
            TPS_TRY(tps_ckpt_read(E->ctx, E->ck, tk->t, tk->src + a + b, in, m));
            crc = tps_crc32(crc, in, m);
        }
    }
    E->crcs[tk->crc0] = crc;
    E->crclen[tk->crc0] = len;
    return TPS_OK;
}

/* Copies l bytes of each of n rows `row` bytes apart to out, back to back.
 * The slices of small rows (an expert's down_proj split by columns: 32
 * bytes a row at tp 8) are copied with moves of a size the compiler knows,
 * not a call to memcpy each. */
#define GATHER_FIXED(W)                                                        \
    case W:                                                                    \
        for (uint64_t o = 0; o < n; o++) memcpy(out + o * (W), in + o * row, W); \
        return;
static void gather(char *out, const char *in, uint64_t n, uint64_t row, uint64_t l)
{
    switch (l) {
        GATHER_FIXED(2)
        GATHER_FIXED(4)
        GATHER_FIXED(8)
        GATHER_FIXED(16)
        GATHER_FIXED(32)
        GATHER_FIXED(64)
        GATHER_FIXED(128)
    default:
        for (uint64_t o = 0; o < n; o++) memcpy(out + o * l, in + o * row, (size_t)l);
    }
}
#undef GATHER_FIXED

/* Runs a task from the source bytes at src (a mapping of exactly the bytes
 * the task reads, of the file src_path), or with preads into `in` when src
 * is NULL. */
static tps_err run_task_on(engine *E, const task *tk, const char *src, const char *src_path, char *in,
                           char *out)
{
    tps_ctx *ctx = E->ctx;
    const tps_ckpt *ck = E->ck;
    const tps_layout *L = E->L;
    if (tk->kind == TASK_MULTI) {
        const tps_cfile *sf = &ck->files[tk->file];
        const char *p = src;
        if (!p) {
            TPS_TRY(tps_pread_full(ctx, sf->fd, sf->path, in, (size_t)tk->b, tk->src));
            p = in;
        }
        const char *const base = p;
        for (size_t k = 0; k < tk->ng; k++) {
            size_t g = tk->g0 + k;
            const tps_region *rg = &L->regions[g];
            uint64_t outer, row, s, l;
            tps_region_geom(ck, rg, &outer, &row, &s, &l);
            size_t n = (size_t)rg->nbytes;
            E->crclen[tk->crc0 + k] = n;
            if (!(outer == 1 || l == row)) {
                /* A tensor split along a later dim, whole at p: each of its
                 * regions' slices gathered, then written. */
                gather(out, p + s, outer, row, l);
                E->crcs[tk->crc0 + k] = (uint32_t)tps_crc32(0, out, n);
                for (size_t d = E->dest0[g]; d < E->dest0[g + 1]; d++)
                    TPS_TRY(write_piece(E, E->dests[d], out, n, 0));
                if (k + 1 == tk->ng || L->regions[g + 1].src != rg->src) p += outer * row;
                continue;
            }
            if (E->kc.mode != TPS_KC_USER) {
                /* the CRC from the bytes read: those the kernel copied (see kcopy_contig) */
                int done;
                TPS_TRY(kcopy_region(E, g, tk->file, tk->src + (uint64_t)(p - base), n, 0, &done));
                if (done) {
                    E->crcs[tk->crc0 + k] = (uint32_t)tps_crc32(0, p, n);
                    p += n;
                    continue;
                }
            }
            if (src && E->dest0[g + 1] - E->dest0[g] == 1) {
                /* One rank from a mapping: the write first, as CONTIG does
                 * (the kernel's copy pulls the bytes in, the CRC finds them
                 * cached: 1.08 s against 1.33 s the other way round for
                 * 1 GiB in 64 KiB pieces). */
                TPS_TRY(write_mapped(E, E->dests[E->dest0[g]], p, n, 0, src_path, rg->src));
                E->crcs[tk->crc0 + k] = (uint32_t)tps_crc32(0, p, n);
            } else {
                E->crcs[tk->crc0 + k] = (uint32_t)tps_crc32(0, p, n);
                for (size_t d = E->dest0[g]; d < E->dest0[g + 1]; d++)
                    TPS_TRY(write_piece(E, E->dests[d], p, n, 0));
            }
            p += n;
        }
        return TPS_OK;
    }
    if (tk->kind == TASK_TROWS) {
        /* rows [a, b) of a transposed region in its own byte order (the CRC's),
         * then written transposed */
        size_t g = tk->g0;
        uint64_t rb, outer, row, s, l;
        region_src(E, g, 0, &rb);
        uint64_t x0 = tk->a * rb, x1 = tk->b * rb, first = region_src(E, g, x0, &rb);
        tps_region_geom(ck, &L->regions[g], &outer, &row, &s, &l);
        size_t ist = src ? tr_stride(E, g) : 0;
        if (ist) {
            /* from the mapping: the CRC over the rows in place, each rank's
             * transpose straight from them into `out` (no copy first) */
            uint32_t crc = 0;
            for (size_t d = E->dest0[g]; d < E->dest0[g + 1]; d++) {
                size_t pi = E->dests[d];
                const oslot *os = &E->slots[E->piece_rt[pi]];
                TPS_TRY(write_tr_rows(E, pi, NULL, src, first, ist, tk->a, tk->b, out,
                                      d == E->dest0[g] ? &crc : NULL, &E->files[os->file],
                                      os->off + L->pieces[pi].at));
            }
            E->crcs[tk->crc0] = crc;
            E->crclen[tk->crc0] = x1 - x0;
            return TPS_OK;
        }
        for (uint64_t x = x0; x < x1;) {
            uint64_t w = l ? x % l : 0, m = l && l - w < x1 - x ? l - w : x1 - x;
            uint64_t so = region_src(E, g, x, &rb);
            if (src)
                memcpy(in + (x - x0), src + (so - first), (size_t)m);
            else
                TPS_TRY(tps_ckpt_read(ctx, ck, tk->t, so, in + (x - x0), (size_t)m));
            x += m;
        }
        size_t n = (size_t)(x1 - x0);
        E->crcs[tk->crc0] = (uint32_t)tps_crc32(0, in, n);
        E->crclen[tk->crc0] = n;
        for (size_t d = E->dest0[g]; d < E->dest0[g + 1]; d++)
            TPS_TRY(write_piece(E, E->dests[d], in, n, x0));
        return TPS_OK;
    }
    if (tk->kind == TASK_CONTIG) {
        /* In sub-chunks that stay in L2, so each byte comes from memory once
         * and the CRC reads it cache-hot. From a mapping, the write comes
         * first: its copy pulls the bytes in, the CRC finds them there.
         * Bytes for several ranks go through the buffer even then, so every
         * rank and the CRC get the same bytes if the source changes
         * meanwhile (the final recheck then fails the split anyway). */
        size_t g = tk->g0, d0 = E->dest0[g], nd = E->dest0[g + 1] - d0;
        if (tk->run && E->kc.mode != TPS_KC_USER) {
            int done;
            TPS_TRY(kcopy_contig(E, tk, src, in, &done));
            if (done) return TPS_OK;
        }
        uint32_t crc = 0;
        for (uint64_t a = tk->a; a < tk->b; a += SUB) {
            size_t len = (size_t)(tk->b - a < SUB ? tk->b - a : SUB);
            if (src && nd == 1) {
                const char *p = src + (a - tk->a);
                TPS_TRY(write_mapped(E, E->dests[d0], p, len, a, src_path, tk->t));
                crc = tps_crc32(crc, p, len);
                continue;
            }
            if (src)
                memcpy(in, src + (a - tk->a), len);
            else
                TPS_TRY(tps_ckpt_read(ctx, ck, tk->t, tk->src + (a - tk->a), in, len));
            crc = tps_crc32(crc, in, len);
            for (size_t k = 0; k < nd; k++) TPS_TRY(write_piece(E, E->dests[d0 + k], in, len, a));
        }
        E->crcs[tk->crc0] = crc;
        E->crclen[tk->crc0] = tk->b - tk->a;
        return TPS_OK;
    }
    uint64_t nrows = tk->b - tk->a, outer, row, s, l;
    const char *rows = src ? src : in;
    tps_region_geom(ck, &L->regions[tk->g0], &outer, &row, &s, &l);
    if (tk->full_rows && !src)
        TPS_TRY(tps_ckpt_read(ctx, ck, tk->t, tk->a * row, in, (size_t)(nrows * row)));
    for (size_t k = 0; k < tk->ng; k++) {
        size_t g = tk->g0 + k;
        if (!region_written(E, g)) continue;
        tps_region_geom(ck, &L->regions[g], &outer, &row, &s, &l);
        if (l == 0) continue;
        size_t n = (size_t)(nrows * l);
        if (tk->full_rows)
            gather(out, rows + s, nrows, row, l);
        else
            for (uint64_t o = 0; o < nrows; o++)
                TPS_TRY(tps_ckpt_read(ctx, ck, tk->t, (tk->a + o) * row + s, out + o * l, (size_t)l));
        E->crcs[tk->crc0 + k] = (uint32_t)tps_crc32(0, out, n);
        E->crclen[tk->crc0 + k] = n;
        for (size_t d = E->dest0[g]; d < E->dest0[g + 1]; d++)
            TPS_TRY(write_piece(E, E->dests[d], out, n, tk->a * l));
    }
    return TPS_OK;
}

/* The source range a task reads in one run: CONTIG its bytes, whole-row
 * ROWS their rows; ROWS that read only some slices have none. */
static int task_range(const engine *E, const task *tk, uint64_t *off, uint64_t *len)
{
    if (tk->kind == TASK_CONTIG) {
        *off = tk->src;
        *len = tk->b - tk->a;
        return 1;
    }
    if (tk->kind == TASK_TROWS) {
        uint64_t rb;
        region_src(E, tk->g0, 0, &rb);
        *off = region_src(E, tk->g0, tk->a * rb, &rb);
        *len = region_src(E, tk->g0, tk->b * rb - 1, &rb) + 1 - *off;
        return 1;
    }
    if (!tk->full_rows) return 0;
    uint64_t outer, row, s, l;
    tps_region_geom(E->ck, &E->L->regions[tk->g0], &outer, &row, &s, &l);
    *off = tk->a * row;
    *len = (tk->b - tk->a) * row;
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
static tps_err run_task(engine *E, const task *tk, char *in, char *out)
{
    uint64_t off, len, foff;
    int file;
    if (tk->kind == TASK_FUSED) return run_fused(E, tk, in, out);
    if (tk->kind == TASK_MULTI) {
        file = tk->file;
        foff = tk->src;
        len = tk->b;
        if (!E->map || len < tps_split_map_min) return run_task_on(E, tk, NULL, NULL, in, out);
    } else if (!task_range(E, tk, &off, &len) || !E->map || len < tps_split_map_min ||
               !tps_ckpt_locate(E->ck, tk->t, off, len, &file, &foff)) {
        return run_task_on(E, tk, NULL, NULL, in, out);
    }
    uint64_t base = foff & ~(uint64_t)(E->page - 1);
    size_t mlen = (size_t)(foff + len - base);
    char *const m =
        mmap(NULL, mlen, PROT_READ, MAP_SHARED | MAP_POPULATE, E->ck->files[file].fd, (off_t)base);
    if (m == MAP_FAILED) return run_task_on(E, tk, NULL, NULL, in, out);
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
    tps_err rc = run_task_on(E, tk, m + (foff - base), E->ck->files[file].path, in, out);
    tps_guard_leave();
    munmap(m, mlen);
    if (rc && rc != TPS_E_INTERRUPTED) {
        tps_err rc2 = tps_ckpt_recheck(E->ctx, E->ck);
        if (rc2) return rc2;
    }
    return rc;
}

/* The one rank file task tk writes, or -1 (several: replicas, a tensor cut
 * along a later dim, a FUSED group, which picks idle files itself). */
static int task_file(const engine *E, const task *tk)
{
    if (tk->kind == TASK_FUSED || tk->kind == TASK_ROWS) return -1;
    int f = -1;
    for (size_t k = 0; k < tk->ng; k++) {
        size_t g = tk->g0 + k;
        for (size_t d = E->dest0[g]; d < E->dest0[g + 1]; d++) {
            int fd = E->slots[E->piece_rt[E->dests[d]]].file;
            if (fd < 0) continue;
            if (f >= 0 && fd != f) return -1;
            f = fd;
        }
    }
    return f;
}

/* The task at place k of the order the threads take n tasks in: from the
 * list's two halves in turn (neighbours in the list are often the chunks of
 * one region, written to one file). */
static size_t task_order(size_t k, size_t n) { return k % 2 ? (n + 1) / 2 + k / 2 : k / 2; }

/* The next task for a thread (its index, or SIZE_MAX: none left), taken
 * (taken[i] set) in task_order from *cursor on, but of the next PICK_AHEAD
 * the first that writes no file another thread's task writes: threads
 * writing one file at once wait on its lock (6% of a 2-thread GPTQ split
 * spinning on it). */
#define PICK_AHEAD 8
static size_t pick_task(engine *E, unsigned char *taken, const int *tfile, size_t *cursor)
{
    size_t n = E->ntasks;
#define ORDER(k) task_order((k), n)
    size_t c = __atomic_load_n(cursor, __ATOMIC_RELAXED);
    while (c < n && __atomic_load_n(&taken[ORDER(c)], __ATOMIC_RELAXED)) c++;
    for (int pass = 0; pass < 2; pass++)
        for (size_t k = c; k < n && (pass || k < c + PICK_AHEAD); k++) {
            size_t i = ORDER(k);
            if (__atomic_load_n(&taken[i], __ATOMIC_RELAXED)) continue;
            if (!pass && tfile[i] >= 0 &&
                __atomic_load_n(&E->files[tfile[i]].tasks, __ATOMIC_RELAXED))
                continue;
            if (__atomic_exchange_n(&taken[i], 1, __ATOMIC_ACQ_REL)) continue;
            size_t seen = __atomic_load_n(cursor, __ATOMIC_RELAXED);
            while (seen < c && !__atomic_compare_exchange_n(cursor, &seen, c, 1, __ATOMIC_RELAXED,
                                                            __ATOMIC_RELAXED)) {}
            return i;
        }
#undef ORDER
    return SIZE_MAX;
}

static void run_all(engine *E)
{
    /* each task's one file, and which are taken; without them, list order */
    unsigned char *taken = tps_xcalloc(E->ntasks ? E->ntasks : 1, 1);
    int *tfile = tps_xmalloc((E->ntasks ? E->ntasks : 1) * sizeof *tfile);
    for (size_t i = 0; tfile && i < E->ntasks; i++) tfile[i] = task_file(E, &E->tasks[i]);
    size_t cursor = 0;
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
        if (!in || !out) {
#pragma omp critical
            if (!E->failed) {
                E->err = tps_fail(E->ctx, TPS_E_NOMEM, "out of memory for copy buffers");
                E->failed = 1;
            }
        }
        /* In task_order, but pick_task passes over a task whose file another
         * thread is writing (without its tables, out of memory: in order). */
        int own = taken && tfile;
#pragma omp for schedule(dynamic, 1)
        for (size_t n = 0; n < E->ntasks; n++) {
            size_t i = own ? pick_task(E, taken, tfile, &cursor) : task_order(n, E->ntasks);
            if (i == SIZE_MAX || E->failed) continue;
            if (E->ctx->interrupted) {
#pragma omp critical
                if (!E->failed) {
                    E->err = tps_fail(E->ctx, TPS_E_INTERRUPTED, "interrupted");
                    E->failed = 1;
                }
                continue;
            }
            int tf = own ? tfile[i] : -1;
            if (tf >= 0) __atomic_add_fetch(&E->files[tf].tasks, 1, __ATOMIC_RELAXED);
            tps_err rc = run_task(E, &E->tasks[i], in, out);
            if (tf >= 0) __atomic_sub_fetch(&E->files[tf].tasks, 1, __ATOMIC_RELAXED);
            if (rc) {
#pragma omp critical
                if (!E->failed) {
                    E->err = rc;
                    E->failed = 1;
                }
                continue;
            }
            const task *tk = &E->tasks[i];
            /* a MULTI task says each of its tensors in turn */
            size_t nsay = tk->kind == TASK_MULTI ? tk->ng : 1;
            for (size_t k = 0; k < nsay; k++) {
                uint64_t moved = tk->kind == TASK_MULTI ? E->crclen[tk->crc0 + k]
                                 : tk->kind == TASK_CONTIG ? tk->b - tk->a : 0;
                if (tk->kind == TASK_ROWS || tk->kind == TASK_FUSED || tk->kind == TASK_TROWS)
                    for (size_t j = 0; j < tk->ng; j++) moved += E->crclen[tk->crc0 + j];
                size_t t = tk->kind == TASK_MULTI ? E->L->regions[tk->g0 + k].src : tk->t;
                uint64_t done = __atomic_add_fetch(&E->done, moved, __ATOMIC_RELAXED);
                /* One caller at a time, whichever thread is free. */
                if (E->ctx->progress && !__atomic_exchange_n(&E->reporting, 1, __ATOMIC_ACQUIRE)) {
                    E->ctx->progress(E->ctx->progress_user, E->done0 + done,
                                     E->total_all ? E->total_all : E->total, E->ck->t[t].name);
                    __atomic_store_n(&E->reporting, 0, __ATOMIC_RELEASE);
                }
            }
        }
        free(in);
        free(out);
        if (reblock) pthread_sigmask(SIG_BLOCK, &bus, NULL);
    }
    free(taken);
    free(tfile);
}

/* Joins the per-task CRCs of every region in byte order (tasks are made in
 * region order, each region's in order). */
static void combine_crcs(engine *E)
{
    const tps_layout *L = E->L;
    for (size_t k = 0; k < E->ntasks; k++) {
        const task *tk = &E->tasks[k];
        if (tk->kind == TASK_FUSED) {
            /* its CRCs in the order run_fused took them: the group's rank
             * tensors and pieces in turn, each primary of a region it owns */
            const fgroup *G = &E->fg[tk->g0];
            size_t c = tk->crc0;
            for (size_t i = 0; i < G->n; i++) {
                const tps_rtensor *rt = &L->rt[G->rts[i]];
                for (size_t j = 0; j < rt->npieces; j++) {
                    size_t pi = rt->piece0 + j;
                    const tps_lpiece *p = &L->pieces[pi];
                    uint64_t pr0, pc0, run, nr;
                    piece_runs(E, rt, p, &pr0, &pc0, &run, &nr);
                    if (p->kind != TPS_PK_SRC || !(pr0 < tk->b && pr0 + nr > tk->a) ||
                        !E->fowned[p->region] || L->regions[p->region].primary != pi)
                        continue;
                    E->region_crc[p->region] = (uint32_t)crc32_combine(
                        E->region_crc[p->region], E->crcs[c], (z_off_t)E->crclen[c]);
                    c++;
                }
            }
            continue;
        }
        for (size_t j = 0; j < tk->ng; j++) {
            size_t g = tk->g0 + j, c = tk->crc0 + j;
            if (tk->kind == TASK_ROWS && !region_written(E, g)) continue;
            E->region_crc[g] =
                (uint32_t)crc32_combine(E->region_crc[g], E->crcs[c], (z_off_t)E->crclen[c]);
        }
    }
}

/* The constant pieces (the engine's 0-dim entries): written whole here.
 * Zero pieces need nothing: the files are sized with ftruncate. */
static tps_err write_constants(engine *E)
{
    const tps_layout *L = E->L;
    for (size_t k = 0; k < L->nrt; k++) {
        const tps_rtensor *rt = &L->rt[k];
        if (!E->write[rt->rank]) continue;
        for (size_t j = 0; j < rt->npieces; j++) {
            const tps_lpiece *p = &L->pieces[rt->piece0 + j];
            if (p->kind != TPS_PK_CONST) continue;
            unsigned char el[8], pat[4096];
            size_t es = tps_dtype_bits(rt->dtype) / 8;
            tps_encode_value(rt->dtype, p->value, el);
            ofile *f = &E->files[E->slots[k].file];
            /* in runs `stride` apart (a pad piece beside other parts), or one */
            uint64_t run = p->run ? p->run : p->nbytes, stride = p->run ? tps_piece_stride(rt, p) : 0;
            /* the pattern as long as a write takes (most are one 0-dim scale) */
            size_t fill = run < sizeof pat ? (size_t)run : sizeof pat;
            for (size_t b = 0; b < fill; b += es) memcpy(pat + b, el, es);
            for (uint64_t r0 = 0; run && r0 < p->nbytes; r0 += run) {
                uint64_t at = E->slots[k].off + p->at + r0 / run * stride;
                for (uint64_t a = 0; a < run; a += sizeof pat) {
                    size_t n = (size_t)(run - a < sizeof pat ? run - a : sizeof pat);
                    TPS_TRY(tps_pwrite_full(E->ctx, f->fd, f->final, pat, n, at + a));
                }
            }
        }
    }
    return TPS_OK;
}

/* ------------------------------------------------------------------ output layout */

/* DTensor rank files say each sharded tensor's placement, global shape and
 * offset (the loading recipe wraps them in DTensors with it). Written as
 * text straight into the header being put out (tps_st_emit_header's value:
 * b escapes it as a string), neither a cJSON tree (for 18,867 tensors a rank
 * the tree was 9 MB of small blocks) nor a copy (10 MB a rank at
 * DeepSeek-V3's size). */
struct placements {
    const engine *E;
    int rank, part;
};

static void placements_put(void *u, tps_sbuf *b)
{
    const struct placements *P = u;
    const engine *E = P->E;
    const tps_layout *L = E->L;
    int first = 1;
    tps_sb_puts(b, "{");
    for (size_t k = L->rank_rt[P->rank]; k < L->rank_rt[P->rank + 1]; k++) {
        const tps_rtensor *rt = &L->rt[k];
        const tps_region *g = &L->regions[L->pieces[rt->piece0].region];
        if (!rt->simple || g->dim < 0 || E->slots[k].file < 0 ||
            E->files[E->slots[k].file].part != P->part)
            continue;
        const tps_ctensor *t = &E->ck->t[g->src];
        char num[32];
        if (!first) tps_sb_puts(b, ",");
        first = 0;
        tps_json_quote(t->name, tps_sb_sink, b);
        snprintf(num, sizeof num, "%d", g->dim);
        tps_sb_puts(b, ":{\"placement\":\"Shard(");
        tps_sb_puts(b, num);
        tps_sb_puts(b, ")\",\"global_shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            snprintf(num, sizeof num, "%s%llu", d ? "," : "", (unsigned long long)t->shape[d]);
            tps_sb_puts(b, num);
        }
        snprintf(num, sizeof num, "%llu", (unsigned long long)g->lo);
        tps_sb_puts(b, "],\"offset\":");
        tps_sb_puts(b, num);
        tps_sb_puts(b, "}");
    }
    tps_sb_puts(b, "}");
}

/* File fi's header: its tensors (its rank's, in name order, assigned to it),
 * the metadata, and, from its length, their offsets (slots) and the file's
 * size. Not kept (22 MB for a DTensor rank file at DeepSeek-V3's size):
 * counted (write 0: f->hdr_len set), or written to f->fd (write 1: the
 * length a count found, f->hdr_crc set). */
static tps_err file_header(engine *E, size_t fi, int write)
{
    tps_ctx *ctx = E->ctx;
    const tps_layout *L = E->L;
    ofile *f = &E->files[fi];
    int r = f->rank, p = f->part;
    size_t k0 = L->rank_rt[r], n = L->rank_rt[r + 1] - k0, m = 0, len = 0;
    tps_st_entry *pe = tps_xcalloc(n ? n : 1, sizeof *pe);
    size_t *map = tps_xcalloc(n ? n : 1, sizeof *map);
    /* streamed into the file from offset 0, its CRC as it goes */
    tps_fd_out h = {.ctx = ctx, .fd = f->fd, .path = f->final};
    tps_sbuf b = {.out = write ? tps_fd_out_write : tps_sb_discard, .out_u = &h};
    uint64_t N = write ? f->hdr_len - 8 : 0;
    tps_err rc = TPS_OK;
    TPS_FAIL_IF(!pe || !map, ctx, TPS_E_NOMEM, "out of memory");
    for (size_t k = 0; k < n; k++) {
        if (E->slots[k0 + k].file != (int)fi) continue;
        const tps_rtensor *rt = &L->rt[k0 + k];
        map[m] = k0 + k;
        pe[m++] = (tps_st_entry){.name = rt->name, .dtype = rt->dtype, .ndim = rt->ndim,
                                 .shape = rt->shape, .nbytes = rt->nbytes};
    }
    char rs[16], ts[16], ps[16], np[16], sr[16], ss[16];
    snprintf(rs, sizeof rs, "%d", r % L->tp);
    snprintf(ts, sizeof ts, "%d", L->tp);
    snprintf(sr, sizeof sr, "%d", r / L->tp);
    snprintf(ss, sizeof ss, "%d", L->pp);
    snprintf(ps, sizeof ps, "%d", p);
    snprintf(np, sizeof np, "%d", f->nparts);
    if (!L->spec) {
        struct placements P = {E, r, p};
        const char *mk[] = {"format", "tp_rank", "tp_size", "part", "parts", "plan", "tool",
                            "placements"};
        const char *mv[] = {"pt", rs, ts, ps, np, tps_plan_name(L->plan),
                            "tpshard " TPS_VERSION_STRING, NULL};
        rc = tps_st_emit_header(ctx, pe, m, mk, mv, 8, placements_put, &P, f->pad, N, &b, &len);
    } else {
        /* with pipeline stages, the worker's stage too (pp 1: as without) */
        const char *mk[] = {"format", "tp_rank", "tp_size", "part", "parts", "plan",
                            "tool", "layout", "target", "pp_rank", "pp_size"};
        const char *mv[] = {"pt", rs, ts, ps, np, tps_plan_name(L->plan),
                            "tpshard " TPS_VERSION_STRING, L->spec->name, L->spec->target, sr, ss};
        rc = tps_st_emit_header(ctx, pe, m, mk, mv, L->pp > 1 ? 11 : 9, NULL, NULL, f->pad, N,
                                &b, &len);
    }
    if (!rc) tps_sb_flush(&b);
    if (!rc && b.failed) rc = h.rc ? h.rc : tps_fail(ctx, TPS_E_IO, "%s: cannot write", f->tmp);
    if (!rc && write && len != f->hdr_len)
        rc = tps_fail(ctx, TPS_E_IO, "%s: header changed size", f->final);
    if (!rc) {
        f->hdr_len = len;
        f->hdr_crc = h.crc;
        f->size = f->hdr_len;
        for (size_t k = 0; k < m; k++) {
            E->slots[map[k]].off = f->hdr_len + pe[k].offset;
            f->size += pe[k].nbytes;
        }
    }
out:
    free(b.p);
    free(pe);
    free(map);
    return rc;
}

static tps_err build_files(engine *E, const tps_split_opts *o)
{
    tps_ctx *ctx = E->ctx;
    const tps_layout *L = E->L;
    size_t maxn = 0;
    for (int r = 0; r < E->nranks; r++)
        if (L->rank_rt[r + 1] - L->rank_rt[r] > maxn) maxn = L->rank_rt[r + 1] - L->rank_rt[r];
    tps_st_entry *ent = tps_xcalloc(maxn ? maxn : 1, sizeof *ent);
    int *fileof = tps_xcalloc(maxn ? maxn : 1, sizeof *fileof);
    tps_err rc = TPS_OK;
    TPS_FAIL_IF(!ent || !fileof, ctx, TPS_E_NOMEM, "out of memory");
    for (size_t i = 0; i < L->nrt; i++) E->slots[i].file = -1;
    for (int r = 0; r < E->nranks; r++) {
        if (!E->write[r]) continue;
        size_t k0 = L->rank_rt[r], n = L->rank_rt[r + 1] - k0;
        for (size_t k = 0; k < n; k++) {
            const tps_rtensor *rt = &L->rt[k0 + k];
            ent[k] = (tps_st_entry){.name = rt->name, .dtype = rt->dtype, .ndim = rt->ndim,
                                    .shape = rt->shape, .nbytes = rt->nbytes};
        }
        /* The file order to assign parts in (a header counted, not kept). */
        tps_sbuf cb = {.out = tps_sb_discard};
        size_t h0len;
        rc = tps_st_emit_header(ctx, ent, n, NULL, NULL, 0, NULL, NULL, 0, 0, &cb, &h0len);
        free(cb.p);
        TPS_CHECK(rc);
        size_t *ord = tps_xcalloc(n ? n : 1, sizeof *ord);
        TPS_FAIL_IF(!ord, ctx, TPS_E_NOMEM, "out of memory");
        for (size_t k = 0; k < n; k++) ord[ent[k].order] = k;
        int part = 0;
        uint64_t acc = 0;
        for (size_t j = 0; j < n; j++) {
            size_t k = ord[j];
            if (o->max_part_size && acc > 0 && acc + ent[k].nbytes > o->max_part_size) {
                part++;
                acc = 0;
            }
            acc += ent[k].nbytes;
            fileof[k] = part;
        }
        free(ord);
        for (int p = 0; p <= part; p++) {
            ofile *nf = realloc(E->files, (E->nfiles + 1) * sizeof *nf);
            TPS_FAIL_IF(!nf, ctx, TPS_E_NOMEM, "out of memory");
            E->files = nf;
            ofile *f = &E->files[E->nfiles];
            memset(f, 0, sizeof *f);
            f->fd = -1;
            f->rank = r;
            f->part = p;
            E->nfiles++;
            for (size_t k = 0; k < n; k++)
                if (fileof[k] == p) E->slots[k0 + k].file = (int)(E->nfiles - 1);
            char fname[96];
            tps_rank_file_name(L->tp, L->pp, r, p, fname, sizeof fname);
            f->final = tps_asprintf("%s/%s", o->out_dir, fname);
            f->tmp = f->final ? tps_tmp_name(f->final) : NULL;
            f->nparts = part + 1;
            /* The header's length places the tensors; the header itself is
             * made again when the file is written (every rank's at once was
             * 30 MB for an MoE of 18,867 tensors at tp 8). */
            TPS_FAIL_IF(!f->final || !f->tmp, ctx, TPS_E_NOMEM, "out of memory");
            TPS_CHECK(file_header(E, E->nfiles - 1, 0));
        }
    }
out:
    free(ent);
    free(fileof);
    return rc;
}

/* Where the output shares blocks with the source: each file's header padded
 * so that its runs of source bytes line up with the source's blocks
 * (align.c chooses), and its tensors placed again after it. */
static tps_err align_files(engine *E)
{
    TPS_TRY(tps_sp_align(E));
    for (size_t i = 0; i < E->nfiles; i++) {
        if (!E->files[i].pad) continue;
        TPS_TRY(file_header(E, i, 0));
    }
    return TPS_OK;
}

/* The rank files created under their temporary names, their headers
 * written, and sized. */
static tps_err write_headers(engine *E)
{
    tps_ctx *ctx = E->ctx;
    tps_err rc = TPS_OK;
    for (size_t i = 0; i < E->nfiles; i++) {
        ofile *f = &E->files[i];
        f->fd = open(f->tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        TPS_FAIL_IF(f->fd < 0, ctx, TPS_E_IO, "%s: cannot create: %s", f->tmp, strerror(errno));
        TPS_CHECK(file_header(E, i, 1));
        /* Size it now: a full disk or a size limit shows before the copy. */
        if (f->size > f->hdr_len && ftruncate(f->fd, (off_t)f->size) != 0) {
            int e = errno;
            TPS_FAIL_IF(e == EFBIG, ctx, TPS_E_NOSPACE, "%s: file size limit exceeded (EFBIG)", f->final);
            TPS_FAIL_IF(1, ctx, TPS_E_IO, "%s: cannot size the file: %s", f->final, strerror(e));
        }
    }
out:
    return rc;
}

static void engine_free(engine *E, int failed)
{
    for (size_t i = 0; i < E->nfiles; i++) {
        ofile *f = &E->files[i];
        if (f->fd >= 0) close(f->fd);
        if (failed && f->tmp && *f->tmp) unlink(f->tmp);
        free(f->final);
        free(f->tmp);
    }
    free(E->files);
    free(E->slots);
    free(E->dests);
    free(E->dest0);
    free(E->region_crc);
    free(E->piece_rt);
    free(E->tasks);
    free(E->crcs);
    free(E->crclen);
    free(E->config_written);
    for (size_t i = 0; i < E->nfg; i++) free(E->fg[i].rts);
    free(E->fg);
    free(E->fowned);
    tps_sp_prev_close(E);
}

/* The checks every split makes of its layout and options before it writes. */
static tps_err split_checks(tps_ctx *ctx, const tps_ckpt *ck, const tps_layout *L,
                            const tps_split_opts *o)
{
    if (L->rejected && L->spec)
        return tps_fail(ctx, TPS_E_REJECT, "layout %s rejects tp %d for %s: %s", L->spec->name,
                        L->tp, ck->path, L->rejected);
    if (L->rejected)
        return tps_fail(ctx, TPS_E_REJECT, "plan %s rejects tp %d for %s: %s", tps_plan_name(L->plan),
                        L->tp, ck->path, L->rejected);
    if (!L->rank_rt) return tps_fail(ctx, TPS_E_ARG, "split: the layout was not compiled");
    if (!o->out_dir) return tps_fail(ctx, TPS_E_ARG, "no output directory");
    if (o->tp && o->tp != L->tp)
        return tps_fail(ctx, TPS_E_ARG, "split options say tp %d but the layout was made for tp %d",
                        o->tp, L->tp);
    return TPS_OK;
}

/* A manifest lists every (tensor, rank) piece, and a serving layout's every
 * rank tensor: past this either list would outgrow what check, merge and
 * verify read back (about 360 bytes of text an entry). */
static tps_err entries_check(tps_ctx *ctx, const tps_ckpt *ck, int tp, size_t pieces, size_t rts)
{
    size_t most = pieces > rts ? pieces : rts;
    if (most > tps_max_manifest_entries)
        return tps_fail(ctx, TPS_E_NOMEM,
                        "%s: %zu tensors at tp %d make %zu tensor-rank entries, over the %zu a "
                        "manifest may hold (check, merge and verify could not read it back)",
                        ck->path, ck->n, tp, most, tps_max_manifest_entries);
    return TPS_OK;
}

/* E->L's ranks that E->write names: their rank files made under temporary
 * names, written, checked against the source, synced and closed. */
static tps_err write_pass(engine *E, const tps_split_opts *o)
{
    tps_ctx *ctx = E->ctx;
    const tps_ckpt *ck = E->ck;
    tps_err rc = TPS_OK;
    TPS_CHECK(build_files(E, o));
    TPS_CHECK(index_dests(E));
    if (E->kc.can_clone) TPS_CHECK(align_files(E));
    TPS_CHECK(plan_tasks(E));
    TPS_CHECK(tps_sp_space_check(ctx, E, o->out_dir));
    TPS_CHECK(write_headers(E));
    TPS_CHECK(write_constants(E));
    /* Mapped reads when asked for, the source's file system allows them
     * and the SIGBUS guard can be set. */
    long pg = sysconf(_SC_PAGESIZE);
    E->page = pg > 0 ? (size_t)pg : 4096;
    char fsn[32];
    const char *unm = NULL;
    for (size_t i = 0; o->map_source == 1 && !unm && i < ck->nfiles; i++)
        unm = tps_fs_unmappable(ck->files[i].fd, fsn, sizeof fsn);
    if (unm && !E->done0)
        tps_log(ctx, TPS_LOG_INFO, "%s (%s): reading with pread, not through mappings (unsafe or "
                "slow there; --mmap maps it anyway)", ck->path, unm);
    E->map = o->map_source && !unm && pg > 0 && tps_guard_hold();
    run_all(E);
    if (E->map) tps_guard_release();
    if (E->failed) {
        rc = E->err;
        goto out;
    }
    if (ctx->progress)
        ctx->progress(ctx->progress_user, E->done0 + E->done,
                      E->total_all ? E->total_all : E->total, NULL);
    TPS_CHECK(tps_ckpt_recheck(ctx, ck));
    combine_crcs(E);
    for (size_t i = 0; i < E->nfiles; i++) {
        ofile *f = &E->files[i];
        TPS_FAIL_IF(fsync(f->fd) != 0, ctx, errno == ENOSPC ? TPS_E_NOSPACE : TPS_E_IO,
                    "%s: fsync: %s", f->final, strerror(errno));
        int cr = close(f->fd);
        f->fd = -1;
        TPS_FAIL_IF(cr != 0, ctx, TPS_E_IO, "%s: close: %s", f->final, strerror(errno));
    }
    TPS_FAIL_IF(ctx->interrupted, ctx, TPS_E_INTERRUPTED, "interrupted");
out:
    return rc;
}

/* The rank files written (E->files): put in place, an older output's
 * leftovers removed, config.json and the other files beside them, and the
 * manifest recorded. */
static tps_err finish_split(engine *E, const tps_split_opts *o, tps_split_result *res)
{
    tps_ctx *ctx = E->ctx;
    const tps_ckpt *ck = E->ck;
    const tps_layout *L = E->L;
    tps_err rc = TPS_OK;
    if (!E->join) {
        /* The old manifest goes first, so no moment shows new rank files
         * under an old manifest. (A --ranks run's files are not the
         * manifest's until it records them.) */
        char *mp = tps_path_join(o->out_dir, TPS_MANIFEST);
        if (mp) unlink(mp);
        free(mp);
    }
    for (size_t i = 0; i < E->nfiles; i++) {
        TPS_FAIL_IF(rename(E->files[i].tmp, E->files[i].final) != 0, ctx, TPS_E_IO, "%s: rename: %s",
                    E->files[i].final, strerror(errno));
        free(E->files[i].tmp);
        E->files[i].tmp = tps_strdup("");
    }
    tps_sp_remove_stale(E, o->out_dir);
    /* a packed method's quantized modules by name, where the engine would
     * look for them in the files (tps_quant_serving_config) */
    if (L->spec)
        TPS_CHECK(tps_quant_serving_config(ctx, ck, L->q, ck->config_out ? ck->config_out
                                                                          : ck->config_text,
                                           &E->config_written));
    if (E->config_written)
        E->config_why = "quantization_config names the quantized modules, which the engine "
                        "cannot find in rank files (fused names)";
    const char *pf;
    uint64_t pfrom, pto;
    int named = E->config_written != NULL;
    for (int pk = 0; pk < 2; pk++) {
        if (!tps_layout_padding(L, pk, &pf, &pfrom, &pto)) continue;
        /* --pad-intermediate: the engine builds the padded model */
        const char *base = E->config_written ? E->config_written
                           : ck->config_out ? ck->config_out : ck->config_text;
        cJSON *cfg = base ? cJSON_Parse(base) : NULL;
        cJSON *where = cfg;
        if (cfg && !cJSON_GetObjectItemCaseSensitive(cfg, pf) &&
            cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(cfg, "text_config")))
            where = cJSON_GetObjectItemCaseSensitive(cfg, "text_config");
        char *text = NULL;
        if (where) {
            cJSON_DeleteItemFromObjectCaseSensitive(where, pf);
            cJSON_AddNumberToObject(where, pf, (double)pto);
            char *t = cJSON_Print(cfg);
            text = t ? tps_asprintf("%s\n", t) : NULL;
            free(t);
        }
        cJSON_Delete(cfg);
        TPS_FAIL_IF(!text, ctx, TPS_E_NOMEM, "out of memory");
        free(E->config_written);
        E->config_written = text;
        E->config_why = named ? "the quantized modules named, and --pad-intermediate's padded sizes"
                              : "--pad-intermediate: the padded sizes";
    }
    TPS_CHECK(tps_ckpt_copy_aux(ctx, ck, o->out_dir,
                                E->config_written ? E->config_written : ck->config_out));
    TPS_CHECK(tps_sp_record_manifest(E, o,
                                     L->plan->label ? L->plan->label : tps_plan_name(L->plan)));
    TPS_CHECK(tps_fsync_dir(ctx, o->out_dir));
    if (res) {
        for (size_t i = 0; i < E->nfiles; i++) res->bytes_written += E->files[i].size;
        res->bytes_read += E->done0 + E->done;
        res->files_written = (int)E->nfiles;
        res->bytes_shared += E->kc.shared;
        res->copy = tps_kcopy_mode_name(E->kc.mode);
        for (int r = 0; r < L->nranks; r++) res->ranks_written += E->write[r];
    }
out:
    return rc;
}

tps_err tps_split(tps_ctx *ctx, const tps_ckpt *ck, const tps_layout *L, const tps_split_opts *o,
                  tps_split_result *res)
{
    tps_err rc = TPS_OK;
    engine E = {.ctx = ctx, .ck = ck, .L = L, .nranks = L->nranks, .wfd = -1};
    unsigned char *all = NULL;
    if (res) memset(res, 0, sizeof *res);
    TPS_TRY(split_checks(ctx, ck, L, o));
    if (L->keep)
        return tps_fail(ctx, TPS_E_ARG, "split: a layout of some ranks only is tps_split_passes'");
    TPS_TRY(entries_check(ctx, ck, L->tp, L->npieces, L->nrt));
    all = tps_xcalloc((size_t)L->nranks, 1);
    E.slots = tps_xcalloc(L->nrt ? L->nrt : 1, sizeof *E.slots);
    TPS_FAIL_IF(!all || !E.slots, ctx, TPS_E_NOMEM, "out of memory");
    int any = 0;
    for (int r = 0; r < L->nranks; r++) any |= all[r] = o->ranks ? o->ranks[r] : 1;
    E.write = all;
    /* A --ranks run with no rank to write (split --ranks auto, more tasks than
     * ranks) leaves the directory to the others. */
    if (!any) goto out;
    E.join = o->ranks != NULL;
    TPS_CHECK(tps_sp_prepare_dir(&E, o));
    tps_kcopy_probe(ctx, &E.kc, ck->nfiles ? ck->files[0].fd : -1, o->out_dir, o->plain_copy);
    TPS_CHECK(write_pass(&E, o));
    TPS_CHECK(finish_split(&E, o, res));
out:
    engine_free(&E, rc != TPS_OK);
    free(all);
    tps_out_release(o->out_dir, E.wfd, E.join);
    return rc;
}

tps_err tps_split_sharing(tps_ctx *ctx, const tps_ckpt *ck, const tps_layout *L,
                          uint64_t max_part_size, uint32_t block, uint64_t *shared,
                          uint64_t *copied)
{
    tps_err rc = TPS_OK;
    engine E = {.ctx = ctx, .ck = ck, .L = L, .nranks = L->nranks, .wfd = -1};
    tps_split_opts o = {.out_dir = ".", .max_part_size = max_part_size};
    unsigned char *all = tps_xcalloc((size_t)L->nranks, 1);
    *shared = *copied = 0;
    TPS_FAIL_IF(!L->rank_rt || L->rejected, ctx, TPS_E_REJECT,
                "split: the layout rejects the model");
    E.slots = tps_xcalloc(L->nrt ? L->nrt : 1, sizeof *E.slots);
    TPS_FAIL_IF(!all || !E.slots, ctx, TPS_E_NOMEM, "out of memory");
    memset(all, 1, (size_t)L->nranks);
    E.write = all;
    E.kc = (tps_kcopy){.mode = TPS_KC_CLONE, .blk = block, .can_clone = 1};
    TPS_CHECK(build_files(&E, &o));
    TPS_CHECK(index_dests(&E));
    TPS_CHECK(align_files(&E));
    for (size_t i = 0; i < E.nfiles; i++) *copied += E.files[i].size;
    *shared = E.shareable;
    *copied -= E.shareable;
out:
    engine_free(&E, 0);
    free(all);
    return rc;
}

/* ------------------------------------------------------------------ a split in passes */

/* Past this many (tensor, rank) pairs a split goes in passes of fewer ranks:
 * the compiled layout and the copy engine's tables take about 100-160 bytes
 * a pair (92k tensors at tp 8, DeepSeek-V3's count, made 125 MiB of tables
 * in one pass). */
#define TPS_PASS_PAIRS 131072
#define TPS_MAX_PASSES 256 /* each pass's entries are a file open to the end */

int tps_split_ranks_per_pass(const tps_ckpt *ck, int nranks, int pp, int asked)
{
    if (nranks < 1) return 1;
    int least = (nranks + TPS_MAX_PASSES - 1) / TPS_MAX_PASSES;
    int n = asked;
    if (pp > 1) return nranks; /* the stages' copies are made from every tp rank's */
    if (n <= 0) {
        size_t per = ck->n ? TPS_PASS_PAIRS / ck->n : (size_t)nranks;
        n = per < 1 ? 1 : per > (size_t)nranks ? nranks : (int)per;
    }
    if (n < least) n = least;
    return n > nranks ? nranks : n;
}

/* An unlinked file in dir for a pass's entries (nothing left behind, even
 * when the run is killed). */
static FILE *pass_file(tps_ctx *ctx, const char *dir, int g, const char *what)
{
    char *mp = tps_path_join(dir, TPS_MANIFEST);
    char *tmp = mp ? tps_tmp_name(mp) : NULL;
    char *p = tmp ? tps_asprintf("%s.%s-%d", tmp, what, g) : NULL;
    FILE *f = NULL;
    if (p) {
        int fd = open(p, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd >= 0) {
            unlink(p);
            f = fdopen(fd, "w+");
            if (!f) close(fd);
        }
        if (!f) tps_fail(ctx, TPS_E_IO, "%s: cannot create: %s", p, strerror(errno));
    } else {
        tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    }
    free(p);
    free(tmp);
    free(mp);
    return f;
}

static void frags_free(tps_sp_frags *fr)
{
    for (int g = 0; g < fr->n; g++) {
        if (fr->tens && fr->tens[g]) fclose(fr->tens[g]);
        if (fr->rts && fr->rts[g]) fclose(fr->rts[g]);
    }
    free(fr->tens);
    free(fr->rts);
    free(fr->dims);
    free(fr->line);
    free(fr->none);
}

tps_err tps_split_passes(tps_ctx *ctx, tps_ckpt *ck, const tps_plan *plan,
                         const tps_layout_spec *spec, int tp, const tps_layout_opts *lo,
                         int ranks_per_pass, tps_layout *first, const tps_split_opts *o,
                         tps_split_result *res)
{
    tps_err rc = TPS_OK;
    int pp = lo && lo->pp ? lo->pp : 1;
    int nranks = tp * pp;
    int per = tps_split_ranks_per_pass(ck, nranks, pp, ranks_per_pass);
    if (res) memset(res, 0, sizeof *res);
    if (o->ranks) return tps_fail(ctx, TPS_E_ARG, "split: --ranks runs write their ranks in one pass");
    if (per >= nranks && !first) {
        tps_layout *L = NULL;
        TPS_TRY(tps_layout_new_opts(ctx, ck, plan, spec, tp, lo, &L));
        rc = tps_split(ctx, ck, L, o, res);
        tps_layout_free(L);
        return rc;
    }
    int npass = (nranks + per - 1) / per;
    unsigned char *all = tps_xcalloc((size_t)nranks, 1);
    unsigned char *keep = tps_xcalloc((size_t)nranks, npass); /* each pass's mask, kept
                                                                 * while its layout lives */
    tps_sp_frags fr = {.n = npass};
    fr.tens = tps_xcalloc((size_t)npass, sizeof *fr.tens);
    fr.rts = tps_xcalloc((size_t)npass, sizeof *fr.rts);
    fr.dims = tps_xmalloc(ck->n ? ck->n : 1);
    fr.none = tps_xcalloc((size_t)nranks, 1);
    /* F: the whole split's engine: the directory, every pass's files, the manifest */
    engine F = {.ctx = ctx, .ck = ck, .L = first, .nranks = nranks, .wfd = -1, .write = all};
    engine E = {0};
    tps_layout *L = NULL;
    size_t npieces = 0, nrts = 0;
    uint64_t done = 0, shared = 0;
    TPS_FAIL_IF(!all || !keep || !fr.tens || !fr.rts || !fr.dims || !fr.none, ctx, TPS_E_NOMEM,
                "out of memory");
    memset(all, 1, (size_t)nranks);
    memset(fr.dims, -2, ck->n ? ck->n : 1);
    for (int g = 0; g < npass; g++)
        for (int r = g * per; r < (g + 1) * per && r < nranks; r++) keep[(size_t)g * nranks + r] = 1;
    if (first && (!first->keep || memcmp(first->keep, keep, (size_t)nranks)))
        TPS_FAIL_IF(1, ctx, TPS_E_ARG, "split: the first pass's layout is not of its ranks");
    for (int g = 0; g < npass; g++) {
        if (g == 0 && first) {
            L = first;
        } else {
            tps_layout_opts lg = lo ? *lo : (tps_layout_opts){0};
            lg.keep = keep + (size_t)g * nranks;
            TPS_CHECK(tps_layout_new_opts(ctx, ck, plan, spec, tp, &lg, &L));
        }
        TPS_CHECK(split_checks(ctx, ck, L, o));
        npieces += L->npieces;
        nrts += L->nrt;
        TPS_CHECK(entries_check(ctx, ck, tp, npieces, nrts));
        if (g == 0) {
            F.L = L;
            tps_ckpt_release_headers(ck); /* the manifest reads them again */
            TPS_CHECK(tps_sp_prepare_dir(&F, o));
            tps_kcopy_probe(ctx, &F.kc, ck->nfiles ? ck->files[0].fd : -1, o->out_dir,
                            o->plain_copy);
        }
        E = (engine){.ctx = ctx, .ck = ck, .L = L, .nranks = nranks, .wfd = -1,
                     .write = keep + (size_t)g * nranks, .kc = F.kc, .done0 = done,
                     .passes_left = npass - g};
        E.kc.shared = 0;
        E.slots = tps_xcalloc(L->nrt ? L->nrt : 1, sizeof *E.slots);
        TPS_FAIL_IF(!E.slots, ctx, TPS_E_NOMEM, "out of memory");
        TPS_CHECK(write_pass(&E, o));
        if (!(fr.tens[g] = pass_file(ctx, o->out_dir, g, "tensors")) ||
            !(fr.rts[g] = pass_file(ctx, o->out_dir, g, "rank-tensors"))) {
            rc = TPS_E_IO;
            goto out;
        }
        TPS_CHECK(tps_sp_fragment(&E, &fr, g));
        done += E.done;
        shared += E.kc.shared;
        F.kc.mode = E.kc.mode; /* lowered where the kernel refused */
        /* its files join the whole split's: renamed with the others at the end */
        ofile *nf = realloc(F.files, (F.nfiles + E.nfiles) * sizeof *nf);
        TPS_FAIL_IF(!nf, ctx, TPS_E_NOMEM, "out of memory");
        F.files = nf;
        memcpy(F.files + F.nfiles, E.files, E.nfiles * sizeof *E.files);
        F.nfiles += E.nfiles;
        E.nfiles = 0;
        engine_free(&E, 0);
        memset(&E, 0, sizeof E);
        if (g + 1 < npass) { /* the last pass's layout writes the manifest's head */
            if (L != first) tps_layout_free(L);
            else tps_layout_drop_tables(first); /* the caller's: its sizes and names stay */
            L = NULL;
        }
        /* what the pass held goes back: the next pass's tables are as large,
         * and glibc would keep the freed pages resident, in holes between
         * the ones still in use */
        tps_heap_release();
    }
    /* The manifest: its head from the last pass's layout (the whole layout's
     * checks, plan and dropped tensors), its entries from every pass. */
    F.L = L;
    F.frags = &fr;
    F.done0 = done;
    F.kc.shared = shared;
    F.slots = NULL;
    TPS_CHECK(finish_split(&F, o, res));
out:
    if (E.ctx) engine_free(&E, 1);
    F.frags = NULL;
    engine_free(&F, rc != TPS_OK);
    if (L && L != first) tps_layout_free(L);
    frags_free(&fr);
    tps_out_release(o->out_dir, F.wfd, 0);
    free(all);
    free(keep);
    return rc;
}
