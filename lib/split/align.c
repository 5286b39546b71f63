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
 * Only an output that shares blocks gets padding: elsewhere the rank files
 * stay byte for byte what they always were. */
#include "internal.h"
#include "split_int.h"

#include <stdlib.h>
#include <string.h>

uint64_t tps_align_data_offset(const tps_align_run *r, size_t n, uint64_t h_min, uint32_t blk,
                               uint64_t *shared)
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
    free(w);
    *shared = bw;
    return h_min + ((best - h_min) & (blk - 1));
}

/* The runs of file fi: every piece written there that is one run of its
 * source tensor, lying whole in one source file, in the source's dtype. */
static size_t file_runs(const engine *E, size_t fi, tps_align_run *out)
{
    const tps_layout *L = E->L;
    const ofile *f = &E->files[fi];
    size_t n = 0;
    for (size_t k = L->rank_rt[f->rank]; k < L->rank_rt[f->rank + 1]; k++) {
        if (E->slots[k].file != (int)fi) continue;
        const tps_rtensor *rt = &L->rt[k];
        for (size_t j = 0; j < rt->npieces; j++) {
            const tps_lpiece *p = &L->pieces[rt->piece0 + j];
            if (p->kind != TPS_PK_SRC || !p->nbytes) continue;
            const tps_region *rg = &L->regions[p->region];
            uint64_t outer, row, s, l, foff;
            int file;
            tps_region_geom(E->ck, rg, &outer, &row, &s, &l);
            if (!(outer == 1 || l == row) || E->ck->t[rg->src].dtype != rt->dtype ||
                !tps_ckpt_locate(E->ck, rg->src, s, rg->nbytes, &file, &foff))
                continue;
            out[n++] = (tps_align_run){.src = foff, .dst = E->slots[k].off - f->hdr_len + p->at,
                                       .len = rg->nbytes};
        }
    }
    return n;
}

tps_err tps_sp_align(engine *E)
{
    const tps_layout *L = E->L;
    size_t maxp = 0;
    for (int r = 0; r < E->tp; r++) {
        size_t np = 0;
        for (size_t k = L->rank_rt[r]; k < L->rank_rt[r + 1]; k++) np += L->rt[k].npieces;
        if (np > maxp) maxp = np;
    }
    tps_align_run *runs = tps_xcalloc(maxp ? maxp : 1, sizeof *runs);
    if (!runs) return tps_fail(E->ctx, TPS_E_NOMEM, "out of memory");
    E->shareable = 0;
    for (size_t fi = 0; fi < E->nfiles; fi++) {
        ofile *f = &E->files[fi];
        uint64_t sh;
        size_t n = file_runs(E, fi, runs);
        f->pad = (size_t)(tps_align_data_offset(runs, n, f->hdr_len, E->kc.blk, &sh) - f->hdr_len);
        E->shareable += sh;
    }
    free(runs);
    return TPS_OK;
}
