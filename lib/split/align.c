/* align.c - where a rank file's tensors start, so that its largest runs of
 * source bytes can share the source's blocks.
 *
 * A clone (FICLONERANGE) shares whole blocks only: a run of source bytes at
 * source offset S can share its blocks with the rank file only if it lands
 * at an offset D with D = S modulo the block size. Tensors in a safetensors
 * file lie back to back from the data offset on (no holes), so within one
 * file only the data offset is free, in steps of 8 (the data stays 8-aligned
 * as every tpshard file's is): trailing spaces after the header's JSON move
 * every tensor by the same amount. One offset serves every run whose source
 * and rank-file offsets differ by the same residue; in a checkpoint whose
 * tensors are whole blocks long (those of any real model are), that is all
 * of them. The order of tensors is left as the reference writer makes it:
 * with every size a block multiple no order lines up more, and other tools
 * compare the order.
 *
 * Only an output that shares blocks gets padding, and only when it shares
 * ALIGN_MIN_GAIN more: elsewhere the rank files stay byte for byte what they
 * always were. */
#include "internal.h"
#include "split_int.h"

#include <stdlib.h>
#include <string.h>

/* Padding that shares less than this more than none is not worth a file
 * that differs from the usual one: small files keep their usual bytes (and a
 * reshard of them equals a direct split), real checkpoints, whose tensors
 * are megabytes, are padded. */
#define ALIGN_MIN_GAIN (256u << 10)

uint64_t tps_align_data_offset(const tps_align_run *r, size_t n, uint64_t h_min, uint32_t blk,
                               uint64_t min_gain, uint64_t *shared)
{
    *shared = 0;
    if (blk < 8 || (blk & (blk - 1)) || h_min % 8) return h_min;
    uint64_t *w = calloc(blk / 8, sizeof *w);
    if (!w) return h_min;
    for (size_t i = 0; i < n; i++) {
        uint64_t res = (r[i].src - r[i].dst) & (blk - 1); /* the data offset it wants, mod blk */
        if (res % 8) continue; /* a source whose data is not 8-aligned: none reachable */
        w[res / 8] += tps_kcopy_shareable(r[i].src, r[i].src, r[i].len, blk);
    }
    /* The most bytes shared; of equals, the least padding. */
    uint64_t best = h_min & (blk - 1), bw = w[best / 8];
    for (uint64_t k = 1; k < blk / 8; k++) {
        uint64_t res = ((h_min & (blk - 1)) + 8 * k) & (blk - 1);
        if (w[res / 8] > bw) {
            bw = w[res / 8];
            best = res;
        }
    }
    uint64_t w0 = w[(h_min & (blk - 1)) / 8];
    free(w);
    if (bw < w0 + min_gain) {
        *shared = w0;
        return h_min;
    }
    *shared = bw;
    return h_min + ((best - h_min) & (blk - 1));
}

typedef struct {
    tps_align_run *v;
    size_t n, cap;
} runs;

static int add_run(runs *R, tps_align_run r)
{
    if (R->n == R->cap) {
        size_t cap = R->cap ? 2 * R->cap : 256;
        tps_align_run *v = realloc(R->v, cap * sizeof *v);
        if (!v) return -1;
        R->v = v;
        R->cap = cap;
    }
    R->v[R->n++] = r;
    return 0;
}

/* The runs of file fi: every piece written there that is one run of its
 * source tensor, in the source's dtype, cut where its bytes move from one
 * source file to the next (a resharded directory's rank files). */
static int file_runs(const engine *E, size_t fi, runs *R)
{
    const tps_layout *L = E->L;
    const ofile *f = &E->files[fi];
    R->n = 0;
    for (size_t k = L->rank_rt[f->rank]; k < L->rank_rt[f->rank + 1]; k++) {
        if (E->slots[k].file != (int)fi) continue;
        const tps_rtensor *rt = &L->rt[k];
        for (size_t j = 0; j < rt->npieces; j++) {
            const tps_lpiece *p = &L->pieces[rt->piece0 + j];
            if (p->kind != TPS_PK_SRC || !p->nbytes || p->run || p->xf) continue;
            const tps_region *rg = &L->regions[p->region];
            uint64_t outer, row, s, l, foff, run;
            int file;
            tps_region_geom(E->ck, rg, &outer, &row, &s, &l);
            if (!(outer == 1 || l == row) || E->ck->t[rg->src].dtype != rt->dtype) continue;
            for (uint64_t x = 0; x < rg->nbytes; x += run) {
                run = tps_ckpt_run(E->ck, rg->src, s + x, &file, &foff);
                if (!run) break;
                if (run > rg->nbytes - x) run = rg->nbytes - x;
                if (add_run(R, (tps_align_run){.src = foff,
                                               .dst = E->slots[k].off - f->hdr_len + p->at + x,
                                               .len = run}))
                    return -1;
            }
        }
    }
    return 0;
}

tps_err tps_sp_align(engine *E)
{
    runs R = {0};
    E->shareable = 0;
    for (size_t fi = 0; fi < E->nfiles; fi++) {
        ofile *f = &E->files[fi];
        uint64_t sh;
        if (file_runs(E, fi, &R)) {
            free(R.v);
            return tps_fail(E->ctx, TPS_E_NOMEM, "out of memory");
        }
        uint64_t h = tps_align_data_offset(R.v, R.n, f->hdr_len, E->kc.blk, ALIGN_MIN_GAIN, &sh);
        f->pad = (size_t)(h - f->hdr_len);
        E->shareable += sh;
    }
    free(R.v);
    return TPS_OK;
}
