/* verify_analysis.c - what verify checks and how: every tensor of the
 * directory as a unit (its pieces, geometry, reading plan and numeric
 * kind), the blocks that pair producers with consumers, the queue order. */
#include "verify_int.h"

#include <errno.h>
#include <fnmatch.h>
#include <math.h>

void tps_va_set_err(vctx *V, tps_err rc)
{
    pthread_mutex_lock(&V->err_mu);
    if (!V->rc) V->rc = rc;
    atomic_store(&V->err, 1);
    pthread_mutex_unlock(&V->err_mu);
}

unsigned tps_va_dt_bytes(tps_dtype d)
{
    return tps_dtype_bits(d) / 8;
}
int tps_va_has_suffix(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}
/* Float dtype that tps_to_f32 converts, whole bytes per element. */
int tps_va_numeric_dtype(tps_dtype d)
{
    if (tps_dtype_bits(d) < 8 || !tps_dtype_is_float(d)) return 0;
    unsigned char z[8] = {0};
    float f;
    return tps_vk_to_f32(d, z, &f, 1) == 0;
}

const tps_piece *tps_va_slot_piece(const vunit *u, int s)
{
    int p = u->piece[s];
    if (p < 0) return NULL;
    return p < u->ct->npieces ? &u->ct->pieces[p] : &u->ct->replicas[p - u->ct->npieces];
}

const char *tps_va_rank_file(const vctx *V, const vunit *u, int s)
{
    const tps_piece *pc = tps_va_slot_piece(u, s);
    return pc ? V->ck->files[pc->file].name : "?";
}

/* ------------------------------------------------------------------ manifest style */

static int style_cmp(const void *a, const void *b)
{
    return strcmp(((const style_ent *)a)->name, ((const style_ent *)b)->name);
}

/* The plan's style the manifest records for each tensor, by name. */
style_ent *tps_va_style_index(const tps_ckpt *ck, size_t *n)
{
    *n = 0;
    style_ent *v = calloc(ck->n ? ck->n : 1, sizeof *v);
    if (!v) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < ck->n; i++)
        if (ck->t[i].style) v[k++] = (style_ent){ck->t[i].name, ck->t[i].style};
    if (k > 1) qsort(v, k, sizeof *v, style_cmp);
    *n = k;
    return v;
}
const char *tps_va_style_of(const style_ent *v, size_t n, const char *name)
{
    if (!v) return NULL;
    style_ent key = {name, NULL};
    const style_ent *f = bsearch(&key, v, n, sizeof *v, style_cmp);
    return f ? f->style : NULL;
}
int tps_va_style_is(const char *s, tps_style st, const char *alias1, const char *alias2)
{
    if (!s) return 0;
    const char *nm = tps_style_name(st);
    return (nm && !strcmp(s, nm)) || (alias1 && !strcmp(s, alias1)) ||
           (alias2 && !strcmp(s, alias2));
}

/* ------------------------------------------------------------------ analysis */

char *tps_va_placement_str(const vunit *u)
{
    if (u->ct->placement) return tps_strdup(u->ct->placement);
    return u->dim < 0 ? tps_strdup("Replicate") : tps_asprintf("Shard(%d)", u->dim);
}

/* The rank file's own header must hold the tensor where the manifest says,
 * with the manifest's dtype and the rank's local shape. NULL ok, else note. */
static char *piece_header_note(const vctx *V, const tps_ctensor *ct, const tps_piece *pc)
{
    const tps_cfile *f = &V->ck->files[pc->file];
    const tps_st *st = f->st;
    if (!st) return NULL;
    /* inside a fused or padded rank tensor: its name, dtype and room were
     * checked when the directory was opened */
    if ((pc->holder && strcmp(pc->holder, ct->name)) || V->serving) return NULL;
    uint64_t begin = pc->off - st->data_start;
    size_t a = 0, b = st->n;
    while (a < b) {
        size_t m = a + (b - a) / 2;
        if (st->t[m].begin < begin)
            a = m + 1;
        else
            b = m;
    }
    /* zero-size tensors share a begin: look at every entry there */
    for (size_t i = a; i < st->n && st->t[i].begin == begin; i++) {
        const tps_st_tensor_info *ti = &st->t[i];
        if (strcmp(ti->name, ct->name)) continue;
        if (ti->dtype != ct->dtype)
            return tps_asprintf("%s: dtype %s, the manifest says %s", f->name,
                                tps_dtype_name(ti->dtype), tps_dtype_name(ct->dtype));
        int shape_ok = ti->ndim == ct->ndim;
        for (int d = 0; shape_ok && d < ct->ndim; d++) {
            uint64_t want = (d == ct->dim) ? pc->hi - pc->lo : ct->shape[d];
            if (ti->shape[d] != want) shape_ok = 0;
        }
        if (!shape_ok) return tps_asprintf("%s: local shape differs from the manifest", f->name);
        if (tps_st_info_nbytes(ti) != pc->nbytes)
            return tps_asprintf("%s: %llu bytes, the manifest says %llu", f->name,
                                (unsigned long long)(tps_st_info_nbytes(ti)),
                                (unsigned long long)pc->nbytes);
        return NULL;
    }
    return tps_asprintf("%s: no tensor at the manifest's offset", f->name);
}

static int hn_cmp(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)((const struct vhnote *)a)->pc;
    uintptr_t y = (uintptr_t)((const struct vhnote *)b)->pc;
    return x < y ? -1 : x > y;
}

char *tps_va_check_piece_header(const vctx *V, const tps_piece *pc)
{
    /* every piece's note was taken before the passes (tps_va_header_notes) */
    struct vhnote key = {pc, NULL};
    const struct vhnote *h = V->nhn ? bsearch(&key, V->hn, V->nhn, sizeof key, hn_cmp) : NULL;
    return h ? tps_strdup(h->note) : NULL;
}

/* Every piece of every tensor verify will read checked against its rank
 * file's header now, the wrong ones kept with why, so that the files'
 * tensor tables (a DTensor split's list every tensor on every rank: 37 MB
 * at DeepSeek-V3's size) can go before the passes; gpt-oss's MXFP4 experts
 * look their tensors up in them later and keep them. */
tps_err tps_va_header_notes(vctx *V)
{
    const tps_ckpt *ck = V->ck;
    size_t cap = 0;
    for (size_t i = 0; i < ck->n; i++) {
        const tps_ctensor *ct = &ck->t[i];
        if (V->o->tensors_glob && fnmatch(V->o->tensors_glob, ct->name, 0) != 0) continue;
        for (int p = 0; p < ct->npieces + ct->nreplicas; p++) {
            const tps_piece *pc = p < ct->npieces ? &ct->pieces[p] : &ct->replicas[p - ct->npieces];
            char *why = piece_header_note(V, ct, pc);
            if (!why) continue;
            if (V->nhn == cap) {
                size_t nc = cap ? 2 * cap : 16;
                struct vhnote *nh = realloc(V->hn, nc * sizeof *nh);
                if (!nh) {
                    free(why);
                    return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
                }
                V->hn = nh;
                cap = nc;
            }
            V->hn[V->nhn++] = (struct vhnote){pc, why};
        }
    }
    if (V->nhn > 1) qsort(V->hn, V->nhn, sizeof *V->hn, hn_cmp);
    int mxfp4 = V->o->source && V->serving && V->q && V->q->m == &tps_qm_mxfp4;
    if (!mxfp4) tps_ckpt_drop_file_tables(V->ck);
    return TPS_OK;
}

/* A serving layout's tensors: their pieces on the present ranks must be
 * exactly the ones the layout (compiled again from the manifest's layout
 * file, config.json and the tensors' styles) puts there: rank, rows, replica
 * or not, the rank tensor holding them and the byte they start at. L is
 * compiled for some ranks (its keep mask: verify.c's expect_layout, a pass
 * of ranks at a time) and holds their pieces only; each tensor's first
 * difference is kept in V->lay_note, the pieces L puts on the present ranks
 * counted in V->lay_want (tps_va_layout_note compares the count). */
static char *layout_mismatch(vctx *V, const tps_layout *L, const int *prt, size_t i)
{
    const tps_ctensor *ct = &V->ck->t[i];
    for (size_t k = L->src_piece0[i]; k < L->src_piece0[i + 1]; k++) {
        size_t pi = L->src_pieces[k];
        const tps_lpiece *lp = &L->pieces[pi];
        const tps_region *g = &L->regions[lp->region];
        if (V->ck->rank_present && !V->ck->rank_present[lp->rank]) continue;
        V->lay_want[i]++;
        const tps_rtensor *lrt = &L->rt[prt[pi]];
        const char *holder = lrt->name;
        int rep = lp->replica && g->dim >= 0, found = 0;
        /* a strided piece's runs too: the holder's shape (an MXFP4 expert's
         * zero tail, the backend's round-up) decides where they lie */
        uint64_t lrun = lp->xf ? 0 : lp->run, lstride = lrun ? tps_piece_stride(lrt, lp) : 0;
        int ltr = tps_lpiece_tr(L, lp);
        for (int p = 0; p < ct->npieces + ct->nreplicas && !found; p++) {
            const tps_piece *pc = p < ct->npieces ? &ct->pieces[p] : &ct->replicas[p - ct->npieces];
            uint64_t prun = pc->rep_n ? 0 : pc->run, pstride = prun ? pc->stride : 0;
            found = pc->rank == lp->rank && (p >= ct->npieces) == rep && pc->at == lp->at &&
                    !strcmp(pc->holder, holder) && prun == lrun && pstride == lstride &&
                    pc->tr == ltr &&
                    (g->dim < 0 || (pc->lo == g->lo && pc->hi == g->hi));
        }
        if (!found)
            return g->dim >= 0
                       ? tps_asprintf("layout %s puts rows [%llu, %llu) of it on rank %d%s, inside "
                                      "'%s' at byte %llu%s; the manifest does not",
                                      V->spec->name, (unsigned long long)g->lo,
                                      (unsigned long long)g->hi, lp->rank, rep ? " (a replica)" : "",
                                      holder, (unsigned long long)lp->at,
                                      lrun ? " in runs of its bytes"
                                           : ltr ? " transposed" : "")
                       : tps_asprintf("layout %s puts all of it on rank %d as '%s'; the manifest "
                                      "does not",
                                      V->spec->name, lp->rank, holder);
    }
    return NULL;
}

tps_err tps_va_layout_pass(vctx *V, const tps_layout *L)
{
    int *prt = tps_xmalloc((L->npieces ? L->npieces : 1) * sizeof *prt);
    if (!prt) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    for (size_t k = 0; k < L->nrt; k++)
        for (size_t j = 0; j < L->rt[k].npieces; j++) prt[L->rt[k].piece0 + j] = (int)k;
    for (size_t i = 0; i < V->ck->n; i++) {
        if (V->lay_note[i]) continue; /* an earlier pass's ranks differ already */
        V->lay_note[i] = layout_mismatch(V, L, prt, i);
    }
    free(prt);
    return TPS_OK;
}

/* Unit u's difference from the layout (V->lay_note, a copy), or NULL. */
char *tps_va_layout_note(const vctx *V, const vunit *u)
{
    const tps_ctensor *ct = u->ct;
    if (V->lay_note[u->t]) return tps_strdup(V->lay_note[u->t]);
    if (V->lay_want[u->t] != (uint32_t)(ct->npieces + ct->nreplicas))
        return tps_asprintf("the manifest lists %d pieces of it on the ranks present, layout %s "
                            "puts %u there",
                            ct->npieces + ct->nreplicas, V->spec->name, V->lay_want[u->t]);
    return NULL;
}

/* The unit's slots: ranks 0 .. tp-1 (their own rows, placed later), then
 * one per replica, which holds its rows already. */
static tps_err unit_slots(vctx *V, vunit *u)
{
    const tps_ctensor *ct = u->ct;
    int tp = V->tp;
    int ns = tp + ct->nreplicas;
    u->nslot = ns;
    /* One block a unit for its six per-slot arrays (u->diff owns it): six
     * allocations were 11 MB more at DeepSeek-V3's 92k units. */
    size_t n = (size_t)ns;
    _Static_assert(sizeof(*u->diff) == sizeof(uint64_t), "the block's arrays are 8-byte aligned");
    char *blk = calloc(1, n * (4 * sizeof(uint64_t) + 2 * sizeof(int)));
    if (!blk) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    u->diff = (atomic_uint_fast64_t *)blk;
    u->lo = (uint64_t *)(blk + n * sizeof(uint64_t));
    u->len = u->lo + n;
    u->first = u->len + n;
    u->slot_rank = (int *)(u->first + n);
    u->piece = u->slot_rank + n;
    for (int r = 0; r < ns; r++) {
        u->slot_rank[r] = r < tp ? r : ct->replicas[r - tp].rank;
        u->piece[r] = r < tp ? -1 : ct->npieces + (r - tp);
        u->first[r] = UINT64_MAX;
        atomic_init(&u->diff[r], 0);
        if (r >= tp) {
            u->lo[r] = ct->replicas[r - tp].lo;
            u->len[r] = ct->replicas[r - tp].hi - ct->replicas[r - tp].lo;
        }
    }
    return TPS_OK;
}

/* Each rank's piece and its rows: where the serving layout puts them, or
 * torch.chunk's. miss (msz bytes, *ml used): the ranks whose pieces are
 * missing from the directory. 1: u->pre says why the unit is not read. */
static int unit_placement(vctx *V, vunit *u, char *miss, size_t msz, size_t *ml)
{
    const tps_ctensor *ct = u->ct;
    int tp = V->tp;
    if (u->dim >= ct->ndim) {
        u->pre = tps_asprintf("placement dim %d but the tensor has %d dims", u->dim, ct->ndim);
        return 1;
    }
    for (int p = 0; p < ct->npieces; p++) {
        const tps_piece *pc = &ct->pieces[p];
        if (pc->rank >= tp || u->piece[pc->rank] >= 0) {
            u->pre = tps_asprintf("manifest lists rank %d twice or out of range", pc->rank);
            return 1;
        }
        u->piece[pc->rank] = p;
    }
    if (V->serving) {
        /* a serving layout: the pieces must be where the layout puts them;
         * a rank's own rows are then its piece's */
        char *why = tps_va_layout_note(V, u);
        if (why) {
            u->pre = why;
            return 1;
        }
        if (ct->nreplicas && u->dim != 0) {
            /* vLLM's refined scale grid: replicas of block columns that
             * overlap the primaries' are compared with them here (the
             * primaries with the source below), then left out of the slots */
            /* so are the copies of whole KV heads cut along dim 1 ([in, out]
             * GPTQ/AWQ k_proj): each must hold the primaries' bytes of its
             * rows, which the primaries' own checks tie to the source */
            if (ct->ndim != 2) {
                u->pre = tps_asprintf("replicas along dim %d of a %d-D tensor are not verified",
                                      u->dim, ct->ndim);
                return 1;
            }
            for (int k = 0; k < ct->nreplicas; k++) {
                if (!V->local[ct->replicas[k].rank]) continue;
                if (tps_ckpt_refined_same(V->ctx, V->ck, u->t, &ct->replicas[k], "")) {
                    u->pre = tps_strdup(tps_ctx_errmsg(V->ctx));
                    return 1;
                }
                u->len[tp + k] = 0;
            }
        }
        uint64_t at = 0;
        for (int r = 0; r < tp; r++) {
            if (u->piece[r] < 0) continue;
            u->lo[r] = ct->pieces[u->piece[r]].lo;
            u->len[r] = ct->pieces[u->piece[r]].hi - u->lo[r];
            /* the collectives concatenate the ranks' rows in rank order (a
             * refined scale's ranks may share a block row: compared below) */
            const tps_piece *pr = &ct->pieces[u->piece[r]];
            if (u->dim >= 0 && pr->rep_n && u->lo[r] < at && u->lo[r] + u->len[r] > at) {
                if (tps_ckpt_refined_same(V->ctx, V->ck, u->t, pr, "")) {
                    u->pre = tps_strdup(tps_ctx_errmsg(V->ctx));
                    return 1;
                }
            } else if (u->dim >= 0 && u->lo[r] != at) {
                u->pre = tps_asprintf("rank %d's rows start at %llu, not where the ranks before "
                                      "it end (%llu)",
                                      r, (unsigned long long)u->lo[r], (unsigned long long)at);
                return 1;
            }
            at = u->lo[r] + u->len[r];
        }
        for (int r = 0; r < tp; r++) {
            int held = u->piece[r] >= 0;
            for (int k = 0; k < ct->nreplicas && !held; k++) held = ct->replicas[k].rank == r;
            if (!held && V->ck->rank_present && !V->ck->rank_present[r] && *ml < msz - 16)
                *ml += (size_t)snprintf(miss + *ml, msz - *ml, "%s%d", *ml ? "," : "", r);
        }
    } else {
        for (int r = 0; r < tp; r++) {
            if (u->dim >= 0) tps_chunk(ct->shape[u->dim], tp, r, &u->lo[r], &u->len[r]);
            if (u->piece[r] < 0 && *ml < msz - 16)
                *ml += (size_t)snprintf(miss + *ml, msz - *ml, "%s%d", *ml ? "," : "", r);
        }
    }
    return 0;
}

/* A unit's geometry along its dim: [outer, nd, inner] with inner in bytes
 * (u->outer, u->nd, u->inner, u->W; outer also here, whatever ovf). */
typedef struct {
    uint64_t outer;
    int ovf;      /* a product of the shape overflows */
    int bytewise; /* a row is not a whole number of bytes */
} ugeom;

static ugeom unit_geometry(vunit *u)
{
    const tps_ctensor *ct = u->ct;
    unsigned bits = tps_dtype_bits(ct->dtype);
    uint64_t outer = 1, nd = 1, inner_el = 1;
    int ovf = 0;
    if (u->dim >= 0) {
        for (int d = 0; d < u->dim; d++) ovf |= tps_mul_ovf(outer, ct->shape[d], &outer);
        nd = ct->shape[u->dim];
        for (int d = u->dim + 1; d < ct->ndim; d++)
            ovf |= tps_mul_ovf(inner_el, ct->shape[d], &inner_el);
    }
    int bytewise = 0;
    if (u->dim >= 0 && !ovf) {
        uint64_t ib;
        ovf |= tps_mul_ovf(inner_el, bits, &ib);
        if (ib % 8) bytewise = 1;
        u->inner = ib / 8;
        u->outer = outer;
        u->nd = nd;
        ovf |= tps_mul_ovf(nd, u->inner, &u->W);
    }
    return (ugeom){outer, ovf, bytewise};
}

/* Every piece must hold what torch.chunk (or the layout) gives its rank,
 * in bytes and in its file's header. 1: u->pre says why not. */
static int unit_check_pieces(const vctx *V, vunit *u, const ugeom *g)
{
    const tps_ctensor *ct = u->ct;
    for (int r = 0; r < u->nslot; r++) {
        int p = u->piece[r];
        if (p < 0) continue;
        const tps_piece *pc = tps_va_slot_piece(u, r);
        uint64_t want = ct->nbytes;
        if (r >= V->tp && u->dim != 0) continue; /* replicas along dim 1: compared in placement */
        if (u->dim >= 0) {
            if (pc->lo != u->lo[r] || pc->hi != u->lo[r] + u->len[r]) {
                u->pre = tps_asprintf("rank %d holds [%llu, %llu) along dim %d, torch.chunk gives "
                                      "[%llu, %llu)",
                                      u->slot_rank[r], (unsigned long long)pc->lo,
                                      (unsigned long long)pc->hi,
                                      u->dim, (unsigned long long)u->lo[r],
                                      (unsigned long long)(u->lo[r] + u->len[r]));
                return 1;
            }
            if (!g->bytewise && !g->ovf) want = g->outer * u->len[r] * u->inner;
        }
        if (!g->bytewise && !g->ovf && pc->nbytes != want) {
            u->pre = tps_asprintf("rank %d's shard has %llu bytes, its shape needs %llu",
                                  u->slot_rank[r],
                                  (unsigned long long)pc->nbytes, (unsigned long long)want);
            return 1;
        }
        char *h = tps_va_check_piece_header(V, pc);
        if (h) {
            u->pre = tps_asprintf("rank %d: %s", u->slot_rank[r], h);
            free(h);
            return 1;
        }
    }
    return 0;
}

/* The source side: the source tensor the unit must equal (an untied head's
 * embedding), with the same dtype and shape. 1: u->pre says why not. */
static int unit_source(vctx *V, vunit *u)
{
    const tps_ctensor *ct = u->ct;
    if (!V->src) {
        u->si = -1;
        return 0;
    }
    /* An untied head (--untie) was written from its embedding: the tied
     * source has no head, and the embedding is what it must equal. */
    u->si = tps_ckpt_find(V->src, ct->derived_from ? ct->derived_from : ct->name);
    if (u->si < 0) {
        free(u->pre);
        u->pre = ct->derived_from
                     ? tps_asprintf("written from %s, which is not in the source checkpoint",
                                    ct->derived_from)
                     : tps_strdup("not in the source checkpoint");
        return 1;
    }
    const tps_ctensor *sc = &V->src->t[u->si];
    int same = sc->dtype == ct->dtype && sc->ndim == ct->ndim && sc->nbytes == ct->nbytes;
    for (int d = 0; same && d < ct->ndim; d++) same = sc->shape[d] == ct->shape[d];
    if (!same) {
        free(u->pre);
        u->pre = tps_asprintf("dtype or shape differs from the source (%s, %d dims)",
                              tps_dtype_name(sc->dtype), sc->ndim);
        u->si = -1;
        return 1;
    }
    return 0;
}

/* Without a source: a task per chunk of every local piece, for its CRC32. */
static tps_err unit_plan_crc(vctx *V, vunit *u)
{
    const tps_ctensor *ct = u->ct;
    u->mode = MODE_CRC;
    int np = ct->npieces + ct->nreplicas;
    u->crcpre = calloc((size_t)np + 1, sizeof(uint64_t));
    if (!u->crcpre) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    for (int p = 0; p < np; p++) {
        const tps_piece *pc = p < ct->npieces ? &ct->pieces[p] : &ct->replicas[p - ct->npieces];
        uint64_t nb = pc->nbytes;
        uint64_t c = V->local[pc->rank] ? (nb ? (nb + CHUNK - 1) / CHUNK : 1) : 0;
        u->crcpre[p + 1] = u->crcpre[p] + c;
    }
    u->ntasks = u->crcpre[np];
    u->crcs = calloc(u->ntasks ? u->ntasks : 1, sizeof(uint32_t));
    u->crclen = calloc(u->ntasks ? u->ntasks : 1, sizeof(uint64_t));
    if (!u->crcs || !u->crclen) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    if (!u->ntasks) u->ntasks = 1;
    return TPS_OK;
}

/* The reading plan: how the unit is cut into tasks (the modes of
 * verify_task.c). */
static tps_err unit_plan(vctx *V, vunit *u, const ugeom *g)
{
    const tps_ctensor *ct = u->ct;
    int ns = u->nslot;
    uint64_t outer = g->outer;
    if (!V->src) return unit_plan_crc(V, u);
    if (ct->nbytes == 0) {
        u->mode = MODE_NONE;
        u->ntasks = 1;
        return TPS_OK;
    }
    if (u->dim < 0) {
        u->mode = MODE_REP;
        u->chunk = CHUNK;
        u->ntasks = (ct->nbytes + CHUNK - 1) / CHUNK;
        return TPS_OK;
    }
    if (g->bytewise) {
        u->mode = MODE_LOGICAL;
        u->chunk = CHUNK;
        u->ntasks = (ct->nbytes + CHUNK - 1) / CHUNK;
        if (u->pre) u->mode = MODE_NONE, u->ntasks = 1; /* missing ranks: cannot gather */
        return TPS_OK;
    }
    uint64_t lim = CHUNK;
    if (u->W <= lim || (u->dim == ct->ndim - 1 && u->W <= ROW_MAX && ct->ndim == 2)) {
        if (u->W > lim) lim = u->W;
        u->mode = MODE_A;
        u->k = u->W ? lim / u->W : outer;
        if (u->k < 1) u->k = 1;
        u->ntasks = (outer + u->k - 1) / u->k;
    } else {
        u->mode = MODE_B;
        if (u->inner <= CHUNK)
            u->step = CHUNK / u->inner * u->inner;
        else if (u->inner <= ROW_MAX && ct->ndim == 2)
            u->step = u->inner;
        else
            u->step = CHUNK;
        u->segc = calloc((size_t)ns + 1, sizeof(uint64_t));
        if (!u->segc) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
        for (int r = 0; r < ns; r++) {
            uint64_t wr = u->len[r] * u->inner;
            u->segc[r + 1] = u->segc[r] + (wr + u->step - 1) / u->step;
        }
        u->per_o = u->segc[ns];
        u->ntasks = outer * u->per_o;
    }
    if (!u->ntasks) u->ntasks = 1;
    return TPS_OK;
}

/* What unit u must hold and how it is read: its slots and their rows, the
 * structural checks (u->pre: why its bytes cannot be compared), its source
 * tensor and its reading plan. */
tps_err tps_va_analyze_unit(vctx *V, vunit *u)
{
    const tps_ctensor *ct = u->ct;
    u->dim = ct->dim;
    u->si = -1;
    u->bias = -1;
    u->bias_si = -1;
    pthread_mutex_init(&u->mu, NULL);
    TPS_TRY(unit_slots(V, u));
    char miss[256] = "";
    size_t ml = 0;
    if (unit_placement(V, u, miss, sizeof miss, &ml)) return TPS_OK;
    ugeom g = unit_geometry(u);
    if (unit_check_pieces(V, u, &g)) return TPS_OK;
    if (g.ovf && ct->nbytes) {
        u->pre = tps_strdup("shape overflows");
        return TPS_OK;
    }
    if (ml)
        u->pre = tps_asprintf("rank%s %s missing from the directory (was it split with --ranks?)",
                              strchr(miss, ',') ? "s" : "", miss);
    if (unit_source(V, u)) return TPS_OK;
    return unit_plan(V, u, &g);
}

/* Numeric kind of a 2-D float weight whose shards are complete. */
void tps_va_classify(vctx *V, vunit *u, const style_ent *se, size_t nse)
{
    const tps_ctensor *ct = u->ct;
    u->nk = NK_NONE;
    if (!V->src || u->si < 0 || u->pre || u->dim < 0 || ct->ndim != 2) return;
    if (!tps_va_has_suffix(ct->name, ".weight")) return;
    if (!tps_va_numeric_dtype(ct->dtype)) {
        u->nk_note =
            tps_asprintf("skipped: %s has no exact f32 conversion", tps_dtype_name(ct->dtype));
        return;
    }
    if (u->mode != MODE_A && !(u->mode == MODE_B && u->step % u->inner == 0 && u->dim == 0)) {
        u->nk_note = tps_strdup("skipped: rows too long to multiply in bounded memory");
        return;
    }
    const char *style = tps_va_style_of(se, nse, ct->name);
    size_t n = strlen(ct->name) - strlen(".weight");
    int embed_name = (n >= 12 && !strncmp(ct->name + n - 12, "embed_tokens", 12)) ||
                     (n >= 22 && !strncmp(ct->name + n - 22, "embed_tokens_per_layer", 22));
    if (u->dim == 0) {
        int emb =
            style ? tps_va_style_is(style, TPS_STYLE_EMBED_ROWWISE, "vocab", "embedding") : embed_name;
        u->nk = emb ? NK_EMB_ROWS : NK_COL;
    } else {
        int emb = style ? tps_va_style_is(style, TPS_STYLE_EMBED_COLWISE, NULL, NULL) : embed_name;
        u->nk = emb ? NK_EMB_COLS : NK_ROW;
    }
    if (u->nk == NK_COL || u->nk == NK_ROW) {
        char *bname = tps_asprintf("%.*s.bias", (int)n, ct->name);
        if (!bname) return;
        int bi = tps_ckpt_find(V->ck, bname);
        free(bname);
        if (bi >= 0) u->bias = bi;
    }
}

int tps_va_serves(const tps_ckpt *ck, int rank, const char *name)
{
    int layer = tps_layer_of_name(name);
    if (ck->pp <= 1 || layer < 0 || ck->tp <= 0) return 1;
    int s = rank / ck->tp;
    return s < ck->pp && layer >= ck->stage_first[s] &&
           layer < ck->stage_first[s] + ck->stage_layers[s];
}

/* Bias: must pair with the weight (colwise: Shard(0); rowwise: Replicate),
 * be complete and float. NULL ok, else the reason. */
char *tps_va_check_bias(vctx *V, vunit *u)
{
    if (u->bias < 0) return NULL;
    const tps_ctensor *b = &V->ck->t[u->bias];
    int want = u->nk == NK_COL ? 0 : -1;
    if (b->ndim != 1 || b->shape[0] != u->ct->shape[0])
        return tps_asprintf("bias %s has the wrong shape", b->name);
    if (b->dim != want)
        return tps_asprintf(
            "bias %s is %s but a %s weight needs it %s", b->name, b->placement ? b->placement : "?",
            u->nk == NK_COL ? "colwise" : "rowwise", want == 0 ? "Shard(0)" : "Replicate");
    if (!tps_va_numeric_dtype(b->dtype)) return tps_asprintf("bias %s is not a float dtype", b->name);
    u->bias_si = tps_ckpt_find(V->src, b->name);
    if (u->bias_si < 0) return tps_asprintf("bias %s is not in the source", b->name);
    if (want < 0) { /* rowwise: tp rank 0's copy (its stage's) is added once after the reduction */
        int tp = V->ck->tp > 0 ? V->ck->tp : 1;
        for (int p = 0; p < b->npieces; p++)
            if (b->pieces[p].rank % tp == 0) return NULL;
        return tps_asprintf("bias %s lacks rank 0", b->name);
    }
    /* colwise: every rank holds the bias rows of its weight rows, as its own
     * piece or, where a serving layout replicates KV heads over more ranks
     * than there are heads, as a replica of another rank's rows */
    for (int s = 0; s < u->nslot; s++) {
        if (u->piece[s] < 0) continue;
        int r = u->slot_rank[s], held = 0;
        uint64_t lo = u->lo[s], hi = u->lo[s] + u->len[s];
        for (int p = 0; p < b->npieces + b->nreplicas && !held; p++) {
            const tps_piece *pc = p < b->npieces ? &b->pieces[p] : &b->replicas[p - b->npieces];
            held = pc->rank == r && pc->lo == lo && pc->hi == hi;
        }
        if (!held)
            return tps_asprintf("bias %s lacks rank %d's rows [%llu, %llu)", b->name, r,
                                (unsigned long long)lo, (unsigned long long)hi);
    }
    return NULL;
}

/* V->blk is sized once by tps_va_find_blocks (one block per unit at most) and never
 * moves: units keep pointers into it (feeds, cons_of). */
vblock *tps_va_add_block(vctx *V)
{
    if (V->nblk == V->blk_cap) return NULL;
    vblock *b = &V->blk[V->nblk++];
    memset(b, 0, sizeof *b);
    atomic_init(&b->ready, 0);
    return b;
}

vunit *tps_va_unit_by_name(vctx *V, const char *prefix, const char *suffix)
{
    char *nm = tps_asprintf("%s%s", prefix, suffix);
    if (!nm) return NULL;
    int i = tps_ckpt_find(V->ck, nm);
    free(nm);
    return i >= 0 && V->unit_of[i] >= 0 ? &V->u[V->unit_of[i]] : NULL;
}

const char *tps_va_short_name(const vunit *u)
{
    const char *s = strrchr(u->ct->name, '.');
    if (!s) return u->ct->name;
    /* "...mlp.gate_proj.weight" -> "gate_proj" */
    const char *e = s;
    const char *b = e;
    while (b > u->ct->name && b[-1] != '.') b--;
    static _Thread_local char buf[64];
    snprintf(buf, sizeof buf, "%.*s", (int)(e - b), b);
    return buf;
}

/* Finds the blocks and decides how each is checked. Rows for blocks that
 * cannot run numerically are added right away (structure only). */
/* Why block b's tensors m[0 .. nm_) do not pair (producers colwise with
 * equal ranges, the consumer rowwise on them), or NULL; sets b->inter. */
static char *block_mismatch(vctx *V, vblock *b, vunit *const *m, int nm_)
{
    int kind = b->kind;
    vunit *cons = b->cons;
    char *why = NULL;
    int prod_ok = 1;
    for (int k = 0; k < b->nprod; k++) prod_ok &= m[k]->dim == 0 && m[k]->ct->ndim == 2;
    int cons_ok = cons->dim == 1 && cons->ct->ndim == 2;
    if (!prod_ok || !cons_ok) {
        char *pl[3] = {NULL, NULL, NULL};
        for (int k = 0; k < nm_; k++) pl[k] = tps_va_placement_str(m[k]);
        if (kind == BLK_MLP)
            why =
                tps_asprintf("placements do not pair: gate_proj %s, up_proj %s, down_proj %s; "
                             "a tensor-parallel MLP needs gate_proj and up_proj Shard(0) "
                             "(colwise) and down_proj Shard(1) (rowwise)",
                             pl[0], pl[1], pl[2]);
        else
            why = tps_asprintf("placements do not pair: q_proj %s, o_proj %s; tensor-parallel "
                               "attention needs q_proj Shard(0) (colwise) and o_proj Shard(1) "
                               "(rowwise)",
                               pl[0], pl[1]);
        for (int k = 0; k < 3; k++) free(pl[k]);
    }
    if (!why) {
        uint64_t inter = m[0]->ct->shape[0];
        b->inter = inter;
        for (int k = 1; k < b->nprod && !why; k++)
            if (m[k]->ct->shape[0] != inter || m[k]->ct->shape[1] != m[0]->ct->shape[1])
                why = tps_asprintf("%s is [%llu, %llu] but %s is [%llu, %llu]",
                                   tps_va_short_name(m[k]), (unsigned long long)m[k]->ct->shape[0],
                                   (unsigned long long)m[k]->ct->shape[1], "gate_proj",
                                   (unsigned long long)inter,
                                   (unsigned long long)m[0]->ct->shape[1]);
        if (!why && cons->ct->shape[1] != inter)
            why = tps_asprintf("%s takes %llu inputs but %s gives %llu",
                               kind == BLK_MLP ? "down_proj" : "o_proj",
                               (unsigned long long)cons->ct->shape[1],
                               kind == BLK_MLP ? "gate_proj" : "q_proj",
                               (unsigned long long)inter);
        for (int r = 0; r < V->tp && !why; r++)
            if (cons->lo[r] != m[0]->lo[r] || cons->len[r] != m[0]->len[r])
                why = tps_asprintf(
                    "rank %d: %s columns [%llu, %llu) but %s rows [%llu, %llu)", r,
                    kind == BLK_MLP ? "down_proj" : "o_proj", (unsigned long long)cons->lo[r],
                    (unsigned long long)(cons->lo[r] + cons->len[r]),
                    kind == BLK_MLP ? "gate_proj" : "q_proj", (unsigned long long)m[0]->lo[r],
                    (unsigned long long)(m[0]->lo[r] + m[0]->len[r]));
    }
    return why;
}

tps_err tps_va_find_blocks(vctx *V)
{
    V->blk_cap = V->nu ? V->nu : 1;
    V->blk = calloc(V->blk_cap, sizeof *V->blk);
    if (!V->blk) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    for (size_t i = 0; i < V->nu; i++) {
        vunit *u = &V->u[i];
        const char *nm = u->ct->name;
        /* The block a tensor opens: a dense MLP, an expert's MLP (Qwen3-MoE
         * experts.<e>.{gate,up,down}_proj, Mixtral experts.<e>.{w1,w3,w2}:
         * the block is the expert), an attention. */
        static const struct {
            const char *first, *second, *third, *name;
            int experts, kind;
        } opens[] = {
            {".mlp.gate_proj.weight", ".mlp.up_proj.weight", ".mlp.down_proj.weight", ".mlp", 0, BLK_MLP},
            {".gate_proj.weight", ".up_proj.weight", ".down_proj.weight", "", 1, BLK_MLP},
            {".w1.weight", ".w3.weight", ".w2.weight", "", 1, BLK_MLP},
            {".self_attn.q_proj.weight", ".self_attn.o_proj.weight", NULL, ".self_attn", 0, BLK_ATTN},
        };
        size_t o = 0, no = sizeof opens / sizeof opens[0];
        while (o < no && !((!opens[o].experts || strstr(nm, ".experts.")) &&
                           tps_va_has_suffix(nm, opens[o].first)))
            o++;
        if (o == no) continue;
        int kind = opens[o].kind;
        char *prefix = tps_asprintf("%.*s", (int)(strlen(nm) - strlen(opens[o].first)), nm);
        if (!prefix) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
        vunit *m[3] = {u, tps_va_unit_by_name(V, prefix, opens[o].second),
                       opens[o].third ? tps_va_unit_by_name(V, prefix, opens[o].third) : NULL};
        int nm_ = opens[o].third ? 3 : 2;
        int complete = 1;
        for (int k = 0; k < nm_; k++) complete &= m[k] != NULL;
        /* MLA (DeepSeek-V2-Lite's q_proj, no q LoRA): q's heads are nope + rope
         * wide, o_proj's v_head_dim; they do not pair as an attention's q and o
         * do. Each is checked alone, as DeepSeek-V3's q_b_proj is. */
        if (complete && kind == BLK_ATTN) {
            char *kvb = tps_asprintf("%s.self_attn.kv_b_proj.weight", prefix);
            if (!kvb) {
                free(prefix);
                return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
            }
            complete = tps_ckpt_find(V->ck, kvb) < 0;
            free(kvb);
        }
        if (!complete) {
            free(prefix);
            continue;
        }
        vblock *b = tps_va_add_block(V);
        if (!b) {
            free(prefix);
            return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
        }
        b->kind = kind;
        b->name = tps_asprintf("%s%s", prefix, opens[o].name);
        free(prefix);
        if (!b->name) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
        vunit *cons = m[nm_ - 1];
        b->nprod = nm_ - 1;
        for (int k = 0; k < b->nprod; k++) b->prod[k] = m[k];
        b->cons = cons;
        atomic_store(&b->ready, -1); /* until proven runnable */
        /* structure: producers colwise with equal ranges, consumer rowwise on them */
        int all_rep = 1, any_pre = 0;
        for (int k = 0; k < nm_; k++) {
            all_rep &= m[k]->dim < 0;
            any_pre |= m[k]->pre != NULL;
        }
        if (any_pre) continue; /* the tensor rows already fail; nothing to pair */
        if (all_rep) {
            if (tps_va_rep_add(V->R, b->name, kind == BLK_MLP ? "mlp" : "attn", 0, 0, 0, 0, 1,
                        tps_strdup("whole on every rank that holds it: nothing to pair")))
                return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
            continue;
        }
        /* packed codes (NVFP4's X.weight): their words are not the features
         * the block multiplies; their bytes are checked above */
        int packed = 0;
        for (int k = 0; k < nm_; k++)
            packed |= V->q && V->q->m->weight_suffix && (size_t)m[k]->t < V->ck->n &&
                      V->q->role[m[k]->t] == TPS_QR_WEIGHT;
        if (packed) {
            if (tps_va_rep_add(V->R, b->name, kind == BLK_MLP ? "mlp" : "attn", 0, 0, 0, 0, 1,
                               tps_asprintf("packed %s codes: every piece reconstructed byte for "
                                            "byte; the numeric check skipped (not dequantized)",
                                            V->q->m->name)))
                return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
            continue;
        }
        char *why = block_mismatch(V, b, m, nm_);
        if (why) {
            if (tps_va_rep_add(V->R, b->name, kind == BLK_MLP ? "mlp" : "attn", 0, 0, 0, 0, 0, why))
                return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
            continue;
        }
        int numeric = V->src != NULL;
        for (int k = 0; k < nm_; k++)
            numeric &= (k < b->nprod ? m[k]->nk == NK_COL : m[k]->nk == NK_ROW);
        if (!numeric) {
            const char *skip = NULL;
            for (int k = 0; k < nm_ && !skip; k++)
                if (m[k]->nk_note) skip = m[k]->nk_note;
            char *note =
                V->src ? tps_asprintf("placements pair; numeric check %s", skip ? skip : "skipped")
                       : tps_strdup("placements pair (the numeric check needs --source)");
            if (tps_va_rep_add(V->R, b->name, kind == BLK_MLP ? "mlp" : "attn", 0, 0, 0, 0, 1, note))
                return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
            continue;
        }
        atomic_store(&b->ready, 0);
        b->pending = b->nprod;
        for (int k = 0; k < b->nprod; k++) {
            m[k]->feeds = b;
            m[k]->feed_slot = k;
        }
        cons->cons_of = b;
        cons->stage2 = 1;
    }
    return TPS_OK;
}

/* Queue: tensors in name order; a block's second half STAGE2_LAG tensors
 * after its last producer. */
tps_err tps_va_build_order(vctx *V)
{
    V->order = calloc(V->nu ? V->nu : 1, sizeof *V->order);
    size_t *pos = calloc(V->nu ? V->nu : 1, sizeof *pos); /* stage-1 position per unit */
    if (!V->order || !pos) {
        free(pos);
        return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    }
    size_t n1 = 0;
    for (size_t i = 0; i < V->nu; i++)
        if (!V->u[i].stage2) pos[i] = n1++;
    /* stage-2 units keyed by their insertion point, in name order */
    size_t k = 0, s2 = 0;
    size_t *key = calloc(V->nu ? V->nu : 1, sizeof *key);
    size_t *s2u = calloc(V->nu ? V->nu : 1, sizeof *s2u);
    if (!key || !s2u) {
        free(pos), free(key), free(s2u);
        return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    }
    for (size_t i = 0; i < V->nu; i++) {
        if (!V->u[i].stage2) continue;
        vblock *b = V->u[i].cons_of;
        size_t last = 0;
        for (int p = 0; p < b->nprod; p++) {
            size_t pi = (size_t)(b->prod[p] - V->u);
            if (pos[pi] > last) last = pos[pi];
        }
        key[s2] = last + STAGE2_LAG;
        s2u[s2++] = i;
    }
    /* insertion sort of stage-2 entries by key (stable) */
    for (size_t a = 1; a < s2; a++)
        for (size_t b = a; b > 0 && key[b - 1] > key[b]; b--) {
            size_t t = key[b];
            key[b] = key[b - 1];
            key[b - 1] = t;
            t = s2u[b];
            s2u[b] = s2u[b - 1];
            s2u[b - 1] = t;
        }
    size_t j = 0, q = 0;
    for (size_t i = 0; i < V->nu; i++) {
        if (V->u[i].stage2) continue;
        V->order[k++] = &V->u[i];
        while (q < s2 && key[q] <= j) V->order[k++] = &V->u[s2u[q++]];
        j++;
    }
    while (q < s2) V->order[k++] = &V->u[s2u[q++]];
    free(pos), free(key), free(s2u);
    uint64_t t0 = 0;
    for (size_t i = 0; i < V->nu; i++) {
        vunit *u = V->order[i];
        if (!u->ntasks) u->ntasks = 1; /* structural failures: one empty task to finalize */
        u->task0 = t0;
        t0 += u->ntasks;
        atomic_init(&u->left, u->ntasks);
        atomic_init(&u->done, 0);
    }
    V->ntasks = t0;
    return TPS_OK;
}
