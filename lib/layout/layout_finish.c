/* layout_finish.c - finishing a compiled layout: regions sorted into
 * source order, rank tensors renamed as the layout's rename entries say,
 * then sorted by rank and name (two of one name on a rank
 * refused), which rank tensors are simple copies, every source tensor's
 * pieces indexed (each source byte must land in some rank file); and the
 * checks list the stages append to (add_check). */
#include "layout_int.h"

#include <stdlib.h>
#include <string.h>

static int rt_cmp(const void *a, const void *b)
{
    const tps_rtensor *x = a, *y = b;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int region_cmp(const void *a, const void *b, void *arg)
{
    const tps_region *R = arg;
    const tps_region *x = &R[*(const size_t *)a], *y = &R[*(const size_t *)b];
    if (x->src != y->src) return x->src < y->src ? -1 : 1;
    if (x->lo != y->lo) return x->lo < y->lo ? -1 : 1;
    return 0;
}

/* Regions in source order (tensor, then rows): a tensor's regions are then
 * consecutive, as the copy engine wants for strided reads. */
static tps_err sort_regions(cstate *C)
{
    tps_layout *L = C->L;
    size_t n = L->nregions;
    size_t *ord = tps_xmalloc((n ? n : 1) * sizeof *ord), *pos = tps_xmalloc((n ? n : 1) * sizeof *pos);
    if (!ord || !pos) {
        free(ord);
        free(pos);
        return nomem(C);
    }
    for (size_t k = 0; k < n; k++) ord[k] = k;
    qsort_r(ord, n, sizeof *ord, region_cmp, L->regions);
    for (size_t k = 0; k < n; k++) pos[ord[k]] = k;
    free(ord);
    for (size_t pi = 0; pi < L->npieces; pi++)
        if (L->pieces[pi].kind == TPS_PK_SRC) L->pieces[pi].region = pos[L->pieces[pi].region];
    /* Moved in place along the permutation's cycles (a sorted copy was
     * 7 MB more at the peak for an MoE of 151k regions). */
    for (size_t k = 0; k < n; k++)
        while (pos[k] != k) {
            size_t j = pos[k];
            tps_region t = L->regions[j];
            L->regions[j] = L->regions[k];
            L->regions[k] = t;
            pos[k] = pos[j];
            pos[j] = j;
        }
    free(pos);
    return TPS_OK;
}

/* The layout's rename entries: a rank tensor under a module matching one
 * (its name's first components) goes under that module's parent + `as`
 * (vLLM's DeepSeek: self_attn.o_proj as self_attn.mla_attn.o_proj). */
static tps_err rename_rts(cstate *C)
{
    const tps_lspec *s = C->L->spec;
    tps_layout *L = C->L;
    for (size_t k = 0; s && s->nrenames && k < L->nrt; k++) {
        const char *nm = L->rt[k].name;
        for (size_t e = 0; e < s->nrenames; e++) {
            const tps_lrename *rn = &s->renames[e];
            if (!tps_lc_type_listed(rn->model_types, rn->nmt, C->ck->config)) continue;
            const char *hit = NULL;
            size_t pos = 0;
            for (size_t q = 0; q < rn->npat && !hit; q++) {
                size_t comps = 1;
                for (const char *c = rn->patterns[q]; *c; c++) comps += *c == '.';
                const char *d = nm;
                for (size_t n = 0; d && n < comps; n++) d = strchr(n ? d + 1 : d, '.');
                if (!d) continue;
                if (tps_module_match(rn->patterns[q], nm, (size_t)(d - nm))) {
                    hit = rn->patterns[q];
                    pos = (size_t)(d - nm);
                }
            }
            if (!hit) continue;
            if (rn->only_last) { /* the last layers, renumbered from their first */
                uint64_t first;
                int layer = tps_layer_of_name(nm);
                if (!tps_lc_last_layers(C->ck->config, rn->only_last, layer, &first)) continue;
                char *nn = tps_lc_own_name(C, tps_asprintf("%s.%llu%s", rn->as,
                                                           (unsigned long long)layer - first,
                                                           nm + pos));
                if (!nn) return nomem(C);
                L->rt[k].name = nn;
                break;
            }
            const char *par = rn->root ? NULL : memrchr(nm, '.', pos);
            size_t pl = par ? (size_t)(par - nm) : 0;
            char *nn = tps_lc_own_name(C, tps_asprintf("%.*s%s%s%s", (int)pl, nm, pl ? "." : "",
                                                       rn->as, nm + pos));
            if (!nn) return nomem(C);
            L->rt[k].name = nn;
            break;
        }
    }
    return TPS_OK;
}

tps_err tps_lc_finish(cstate *C)
{
    tps_layout *L = C->L;
    const tps_ckpt *ck = C->ck;
    TPS_TRY(sort_regions(C));
    TPS_TRY(rename_rts(C));
    /* Rank tensors sorted by rank, then name; pieces stay where they are
     * (each tensor keeps its piece0/npieces). */
    qsort(L->rt, L->nrt, sizeof *L->rt, rt_cmp);
    L->rank_rt = tps_xcalloc((size_t)L->nranks + 1, sizeof *L->rank_rt);
    if (!L->rank_rt) return nomem(C);
    for (size_t k = 0; k < L->nrt; k++) L->rank_rt[L->rt[k].rank + 1]++;
    for (int r = 0; r < L->nranks; r++) L->rank_rt[r + 1] += L->rank_rt[r];
    for (int r = 0; r < L->nranks; r++)
        for (size_t k = L->rank_rt[r] + 1; k < L->rank_rt[r + 1]; k++)
            if (!strcmp(L->rt[k].name, L->rt[k - 1].name))
                return tps_fail(C->ctx, TPS_E_SHAPE,
                                "%s: layout %s makes two tensors named '%s' on rank %d",
                                ck->path, tps_layout_spec_name(L->spec), L->rt[k].name, r);
    for (size_t k = 0; k < L->nrt; k++) {
        tps_rtensor *rt = &L->rt[k];
        const tps_lpiece *p = &L->pieces[rt->piece0];
        const tps_ctensor *st = p->kind == TPS_PK_SRC ? &ck->t[L->regions[p->region].src] : NULL;
        rt->simple = rt->npieces == 1 && st && p->nbytes == rt->nbytes && !strcmp(rt->name, st->name) &&
                     rt->dtype == st->dtype && rt->ndim == st->ndim;
    }
    /* Each source tensor's pieces, by rank then position. */
    L->src_piece0 = tps_xcalloc(ck->n + 1, sizeof *L->src_piece0);
    L->src_pieces = tps_xcalloc(L->npieces ? L->npieces : 1, sizeof *L->src_pieces);
    if (!L->src_piece0 || !L->src_pieces) return nomem(C);
    for (size_t k = 0; k < L->nrt; k++)
        for (size_t j = 0; j < L->rt[k].npieces; j++) {
            const tps_lpiece *p = &L->pieces[L->rt[k].piece0 + j];
            if (p->kind == TPS_PK_SRC) L->src_piece0[L->regions[p->region].src + 1]++;
        }
    for (size_t i = 0; i < ck->n; i++) L->src_piece0[i + 1] += L->src_piece0[i];
    size_t *fill = tps_xcalloc(ck->n ? ck->n : 1, sizeof *fill);
    if (!fill) return nomem(C);
    for (size_t k = 0; k < L->nrt; k++)
        for (size_t j = 0; j < L->rt[k].npieces; j++) {
            size_t pi = L->rt[k].piece0 + j;
            const tps_lpiece *p = &L->pieces[pi];
            if (p->kind != TPS_PK_SRC) continue;
            size_t s = L->regions[p->region].src;
            L->src_pieces[L->src_piece0[s] + fill[s]++] = (uint32_t)pi;
        }
    free(fill);
    for (size_t i = 0; i < ck->n; i++)
        if (L->src_piece0[i] == L->src_piece0[i + 1] && !(L->dropped && L->dropped[i]) &&
            !(C->placed && C->placed[i])) /* some ranks' layout: on another rank */
            return tps_fail(C->ctx, TPS_E_SHAPE,
                            "%s: layout %s places no byte of tensor '%s' (every source byte must "
                            "land in some rank file)",
                            ck->path, tps_layout_spec_name(L->spec), ck->t[i].name);
    return TPS_OK;
}

tps_err tps_lc_add_check(cstate *C, const char *name, int ok, const char *detail)
{
    tps_layout *L = C->L;
    tps_check_outcome *n = realloc(L->checks, (L->nchecks + 1) * sizeof *n);
    if (!n) return nomem(C);
    L->checks = n;
    tps_check_outcome *o = &L->checks[L->nchecks++];
    o->name = tps_strdup(name);
    o->detail = tps_strdup(detail);
    o->ok = ok;
    return o->name && o->detail ? TPS_OK : nomem(C);
}
