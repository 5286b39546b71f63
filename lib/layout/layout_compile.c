/* layout_compile.c - tps_layout_compile: the placements (and the layout
 * file) made rank tensors of pieces, stage by stage (the driver at the
 * end): the layout's served checks, the tied head, packed rows, --ep, what
 * the engine drops, experts, fused groups, everything else, the engine's
 * acceptance checks, the pipeline stages, then finish. Also the compile state's helpers every
 * stage uses (refusals, rank tensors, pieces and regions, splits, config
 * counts, the layout's split rule for a tensor) and place_simple, which
 * places one tensor replicated or split along a dim. A stage of its own goes
 * in its own file (layout_int.h has the map) and one call in the driver. */
#include "layout_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


tps_err tps_lc_new_rt(cstate *C, const char *name, int rank, tps_dtype dt, int ndim,
                      const uint64_t *shape, const char *rule, tps_rtensor **out)
{
    tps_layout *L = C->L;
    if (ndim < 0 || ndim > TPS_MAX_DIMS)
        return tps_fail(C->ctx, TPS_E_SHAPE, "%s: rank %d's tensor '%s' has %d dims", C->ck->path,
                        rank, name, ndim);
    int kept = !L->keep || (rank >= 0 && rank < L->nranks && L->keep[rank]);
    uint64_t *sh;
    tps_rtensor *r;
    if (kept) {
        if (L->nrt == C->cap_rt) {
            size_t cap = C->cap_rt ? C->cap_rt * 2 : 256;
            tps_rtensor *n = realloc(L->rt, cap * sizeof *n);
            if (!n) return nomem(C);
            L->rt = n;
            C->cap_rt = cap;
        }
        /* Shapes live in chunks that never move: a rank tensor is 48 bytes,
         * not the 176 a TPS_MAX_DIMS array would make it (736k of them for a
         * DTensor split at DeepSeek-V3's size). */
        sh = tps_u64_take(&L->shapes, (size_t)ndim);
        if (!sh) return nomem(C);
        r = &L->rt[L->nrt];
    } else {
        /* another rank's: made and checked as ours are, then forgotten */
        unsigned k = C->nscratch++ % 4;
        sh = C->scratch_shape[k];
        r = &C->scratch[k];
    }
    memcpy(sh, shape, sizeof(uint64_t) * (size_t)ndim);
    if (L->npieces > UINT32_MAX - 1)
        return tps_fail(C->ctx, TPS_E_NOMEM, "%s: over 2^32 rank tensor pieces", C->ck->path);
    if (kept) L->nrt++;
    memset(r, 0, sizeof *r);
    r->name = name;
    r->rank = rank;
    r->dtype = dt;
    r->ndim = ndim;
    r->shape = sh;
    int ovf = 0, mis = 0;
    r->nbytes = tps_nbytes(dt, r->shape, ndim, &ovf, &mis);
    if (ovf || mis)
        return tps_fail(C->ctx, TPS_E_SHAPE, "%s: rank %d's tensor '%s' has no whole byte size",
                        C->ck->path, rank, name);
    if (L->rank_bytes && rank >= 0 && rank < L->nranks) L->rank_bytes[rank] += r->nbytes;
    r->piece0 = L->npieces;
    r->rule = rule;
    *out = r;
    return TPS_OK;
}

tps_err tps_lc_add_piece(cstate *C, tps_rtensor *r, tps_lpiece p)
{
    tps_layout *L = C->L;
    if (!tps_lc_scratch(C, r) && L->npieces == L->cap_pieces) {
        size_t cap = L->cap_pieces ? L->cap_pieces * 2 : 256;
        tps_lpiece *n = realloc(L->pieces, cap * sizeof *n);
        if (!n) return nomem(C);
        L->pieces = n;
        L->cap_pieces = cap;
    }
    if (L->npieces >= UINT32_MAX || r->rank < 0 || r->rank > UINT16_MAX)
        return tps_fail(C->ctx, TPS_E_NOMEM, "%s: over 2^32 rank tensor pieces, or a rank past "
                        "65535", C->ck->path);
    if (tps_lc_scratch(C, r)) {
        r->npieces++;
        return TPS_OK;
    }
    p.rank = (uint16_t)r->rank;
    L->pieces[L->npieces++] = p;
    r->npieces++;
    return TPS_OK;
}

/* Another rank's region in a compile for some ranks: what a later piece of
 * the same rows needs to know (16 bytes, not a region's 32 and its piece's
 * 40). In the per-tensor chains (C->last, C->next) a ghost is GHOST | its
 * index; its own link is 32-bit (GH_END, or GH_BIT | a ghost, or a region). */
struct tps_ghost {
    uint32_t lo, hi;
    int16_t dim;
    uint8_t primary; /* its piece is no replica */
    uint8_t tr;      /* its piece is transposed */
    uint32_t next;
};
#define GHOST ((size_t)1 << (sizeof(size_t) * 8 - 1))
#define GH_BIT 0x80000000u
#define GH_END 0xffffffffu

static size_t gh_next(const cstate *C, size_t k)
{
    if (!(k & GHOST)) return C->next[k];
    uint32_t n = C->gh[k & ~GHOST].next;
    return n == GH_END ? SIZE_MAX : n & GH_BIT ? GHOST | (n & ~GH_BIT) : n;
}

/* The region (src, dim, [lo, hi)), made on first use; *fresh says so: 1 a
 * new region, 2 a new region of this compile whose rows another rank's
 * piece (a ghost) holds first (ours are replicas). A piece of a rank the
 * compile does not keep (ghost set) finds a region or a ghost, or makes a
 * ghost: *out is then GHOST | its index. */
static tps_err region_of(cstate *C, size_t src, int dim, uint64_t lo, uint64_t hi, int ghost,
                         size_t *out, int *fresh)
{
    tps_layout *L = C->L;
    int behind = 0; /* a ghost holds these rows */
    /* The tensor's regions so far, newest first (a chain through `next`).
     * Empty ones are never shared: an empty shard is nobody's replica. */
    for (size_t k = hi > lo || dim < 0 ? C->last[src] : SIZE_MAX; k != SIZE_MAX; k = gh_next(C, k)) {
        if (k & GHOST) {
            const struct tps_ghost *h = &C->gh[k & ~GHOST];
            if (h->dim == dim && h->lo == lo && h->hi == hi) {
                if (ghost) {
                    *out = k;
                    *fresh = 0;
                    return TPS_OK;
                }
                behind = 1;
                break;
            }
            continue;
        }
        const tps_region *g = &L->regions[k];
        if (g->dim == dim && g->lo == lo && g->hi == hi) {
            *out = k;
            *fresh = 0;
            return TPS_OK;
        }
    }
    /* Regions keep 32-bit bounds and indexes (32 bytes each, not 48). */
    if (hi > UINT32_MAX)
        return tps_fail(C->ctx, TPS_E_SHAPE,
                        "%s: tensor '%s' cannot be split along dim %d: it is %llu elements long, "
                        "and tpshard splits dims of under 2^32 elements",
                        C->ck->path, C->ck->t[src].name, dim,
                        (unsigned long long)C->ck->t[src].shape[dim]);
    if (src > UINT32_MAX || L->nregions >= UINT32_MAX || L->npieces >= UINT32_MAX ||
        (L->keep && (L->nregions >= GH_BIT - 1 || C->ngh >= GH_BIT - 1)))
        return tps_fail(C->ctx, TPS_E_NOMEM, "%s: over 2^32 tensor-rank pieces", C->ck->path);
    tps_region tmp = {.src = (uint32_t)src, .dim = dim, .lo = (uint32_t)lo, .hi = (uint32_t)hi};
    const tps_ctensor *t = &C->ck->t[src];
    if (dim >= 0) {
        uint64_t ib = tps_lc_inner_bits(t, dim);
        if ((lo * ib) % 8 || (hi * ib) % 8)
            return tps_fail(C->ctx, TPS_E_SHAPE,
                            "%s: tensor '%s' (%s) cannot be split at tp %d: a shard along dim %d "
                            "does not start and end on a byte boundary",
                            C->ck->path, t->name, tps_dtype_name(t->dtype), C->tp, dim);
    }
    uint64_t outer, row, s, l;
    tps_region_geom(C->ck, &tmp, &outer, &row, &s, &l);
    tmp.nbytes = outer * l;
    size_t prev = C->last[src];
    /* DTensor's rows along a dim are torch.chunk's: another rank's are never
     * ours (empty ones aside, which are never shared), so no ghost need keep
     * them; one unlinked ghost stands for them all (16 bytes a rank and tensor
     * were 10 MB a pass at DeepSeek-V3's size). A layout file's can be (KV
     * heads on several ranks) and keep theirs. */
    int unseen = ghost && dim >= 0 && !L->spec;
    if (unseen && C->gh_none) {
        *out = GHOST | (C->gh_none - 1);
        *fresh = 1;
        return TPS_OK;
    }
    if (ghost) {
        if (C->ngh == C->cap_gh) {
            size_t cap = C->cap_gh ? C->cap_gh * 2 : 256;
            struct tps_ghost *n = realloc(C->gh, cap * sizeof *n);
            if (!n) return nomem(C);
            C->gh = n;
            C->cap_gh = cap;
        }
        struct tps_ghost *h = &C->gh[C->ngh];
        *h = (struct tps_ghost){.lo = (uint32_t)lo, .hi = (uint32_t)hi, .dim = (int16_t)dim,
                                .primary = 1};
        if (unseen) { /* not in the tensor's chain */
            h->next = GH_END;
            C->gh_none = C->ngh + 1;
            *out = GHOST | C->ngh++;
            *fresh = 1;
            return TPS_OK;
        }
        h->next = prev == SIZE_MAX ? GH_END : prev & GHOST ? GH_BIT | (uint32_t)(prev & ~GHOST)
                                                          : (uint32_t)prev;
        C->last[src] = GHOST | C->ngh;
        *out = GHOST | C->ngh++;
        *fresh = 1;
        return TPS_OK;
    }
    if (L->nregions == L->cap_regions) {
        size_t cap = L->cap_regions ? L->cap_regions * 2 : 256;
        tps_region *n = realloc(L->regions, cap * sizeof *n);
        size_t *nx = realloc(C->next, cap * sizeof *nx);
        if (nx) C->next = nx;
        if (!n || !nx) {
            if (n) L->regions = n;
            return nomem(C);
        }
        L->regions = n;
        L->cap_regions = cap;
    }
    C->next[L->nregions] = prev;
    C->last[src] = L->nregions;
    L->regions[L->nregions] = tmp;
    *out = L->nregions++;
    *fresh = behind ? 2 : 1;
    return TPS_OK;
}

/* 1 + the index of transform x in L->xforms: the last one when it is the
 * same (a rank's pieces of one stack share theirs), else x appended; 0 out
 * of memory. */
static uint32_t xform_index(tps_layout *L, const tps_xform *x)
{
    if (!L->nxforms || memcmp(&L->xforms[L->nxforms - 1], x, sizeof *x)) {
        tps_xform *n = realloc(L->xforms, (L->nxforms + 1) * sizeof *n);
        if (!n) return 0;
        L->xforms = n;
        L->xforms[L->nxforms++] = *x;
    }
    return (uint32_t)L->nxforms;
}

/* Adds source piece [lo, hi) along dim of src to r at byte at; x: refined
 * (nbytes its grid's), else NULL (nbytes the region's, widened when r's
 * dtype is not src's: a scale the engine holds in F32, 4 bytes an element). */
static tps_err add_src_piece(cstate *C, tps_rtensor *r, size_t src, int dim, uint64_t lo,
                             uint64_t hi, uint64_t at, const tps_xform *x, uint64_t nbytes,
                             uint64_t run, int sdim)
{
    tps_layout *L = C->L;
    int ghost = tps_lc_scratch(C, r);
    /* Refined pieces of one scale overlap (ranks share a block row): each
     * that reaches past the rows placed so far is a primary (readers take a
     * shared row from the first, check makes sure the others agree), the
     * others are replicas. */
    uint64_t covered = 0;
    for (size_t k = x ? C->last[src] : SIZE_MAX; k != SIZE_MAX; k = gh_next(C, k)) {
        if (k & GHOST) {
            const struct tps_ghost *h = &C->gh[k & ~GHOST];
            if (h->dim == dim && h->primary && h->hi > covered) covered = h->hi;
            continue;
        }
        const tps_region *rg = &L->regions[k];
        if (rg->dim == dim && !L->pieces[rg->primary].replica && rg->hi > covered)
            covered = rg->hi;
    }
    if (x && lo > covered)
        return tps_fail(C->ctx, TPS_E_ARG, "tensor '%s': refined pieces leave rows [%llu, %llu) "
                        "to no rank", C->ck->t[src].name, (unsigned long long)covered,
                        (unsigned long long)lo);
    size_t g = 0;
    int fresh = 0;
    TPS_TRY(region_of(C, src, dim, lo, hi, ghost, &g, &fresh));
    /* the rows' first piece is transposed: no other piece may share them */
    int tr_first = 0;
    if (!fresh && (g & GHOST)) tr_first = C->gh[g & ~GHOST].tr;
    else if (!fresh) tr_first = tps_lpiece_tr(L, &L->pieces[L->regions[g].primary]);
    else if (fresh == 2) {
        for (size_t k = gh_next(C, g); k != SIZE_MAX; k = gh_next(C, k)) {
            if (!(k & GHOST)) continue;
            const struct tps_ghost *h = &C->gh[k & ~GHOST];
            if (h->dim == dim && h->lo == lo && h->hi == hi) {
                tr_first = h->tr;
                break;
            }
        }
    }
    if (tr_first)
        return tps_fail(C->ctx, TPS_E_ARG, "tensor '%s': rows [%llu, %llu) are a transposed "
                        "piece on one rank and would be another piece on rank %d",
                        C->ck->t[src].name, (unsigned long long)lo, (unsigned long long)hi,
                        r->rank);
    C->used[src] = 1;
    if (C->placed) C->placed[src] = 1;
    int replica = fresh != 1 || (x && hi <= covered);
    C->last_replica = replica;
    C->last_ghost = ghost && fresh ? g & ~GHOST : SIZE_MAX;
    if (ghost && fresh) C->gh[g & ~GHOST].primary = !replica;
    uint32_t xf = 0;
    if (x) {
        if (!ghost && !(xf = xform_index(L, x))) return nomem(C);
    } else {
        tps_dtype sd = C->ck->t[src].dtype;
        if (g & GHOST) {
            tps_region tmp = {.src = (uint32_t)src, .dim = dim, .lo = (uint32_t)lo,
                              .hi = (uint32_t)hi};
            uint64_t outer, row, s, l;
            tps_region_geom(C->ck, &tmp, &outer, &row, &s, &l);
            nbytes = outer * l;
        } else {
            nbytes = L->regions[g].nbytes;
        }
        if (r->dtype != sd) nbytes = nbytes / (tps_dtype_bits(sd) / 8) * (tps_dtype_bits(r->dtype) / 8);
    }
    if (run && (run > UINT32_MAX || nbytes % run || r->dtype != C->ck->t[src].dtype))
        return tps_fail(C->ctx, TPS_E_SHAPE,
                        "%s: rank %d's tensor '%s': a strided piece of '%s' must be whole runs "
                        "of under 4 GiB, in its own dtype",
                        C->ck->path, r->rank, r->name, C->ck->t[src].name);
    if (!ghost && fresh) L->regions[g].primary = L->npieces;
    return tps_lc_add_piece(C, r,
                            (tps_lpiece){.kind = TPS_PK_SRC, .region = ghost ? 0 : (uint32_t)g,
                                         .at = at, .nbytes = nbytes, .replica = replica,
                                         .xf = xf, .run = (uint32_t)run, .sdim = (uint8_t)sdim});
}

tps_err tps_lc_src_piece(cstate *C, tps_rtensor *r, size_t src, int dim, uint64_t lo, uint64_t hi,
                         uint64_t at)
{
    return add_src_piece(C, r, src, dim, lo, hi, at, NULL, 0, 0, 0);
}

tps_err tps_lc_src_piece_x(cstate *C, tps_rtensor *r, size_t src, int dim, uint64_t lo,
                           uint64_t hi, uint64_t at, const tps_xform *x, uint64_t nbytes)
{
    return add_src_piece(C, r, src, dim, lo, hi, at, x, nbytes, 0, 0);
}

tps_err tps_lc_src_piece_tr(cstate *C, tps_rtensor *r, size_t src, int dim, uint64_t lo,
                            uint64_t hi, uint64_t at)
{
    tps_layout *L = C->L;
    const tps_ctensor *t = &C->ck->t[src];
    if (t->ndim < 2 || r->dtype != t->dtype)
        return tps_fail(C->ctx, TPS_E_SHAPE,
                        "%s: rank %d's tensor '%s': a transposed piece of '%s' must be of a "
                        "tensor of 2 or more dims, in its own dtype",
                        C->ck->path, r->rank, r->name, t->name);
    TPS_TRY(add_src_piece(C, r, src, dim, lo, hi, at, NULL, 0, 0, 0));
    if (C->last_replica)
        return tps_fail(C->ctx, TPS_E_ARG, "tensor '%s': a transposed piece cannot be a replica",
                        t->name);
    if (tps_lc_scratch(C, r)) { /* another rank's: its ghost says so */
        if (C->last_ghost != SIZE_MAX) C->gh[C->last_ghost].tr = 1;
        return TPS_OK;
    }
    const tps_xform x = {.tr = 1};
    uint32_t xf = xform_index(L, &x);
    if (!xf) return nomem(C);
    L->pieces[L->npieces - 1].xf = xf;
    return TPS_OK;
}

tps_err tps_lc_src_piece_run(cstate *C, tps_rtensor *r, size_t src, int dim, uint64_t lo,
                             uint64_t hi, uint64_t at, uint64_t run)
{
    return add_src_piece(C, r, src, dim, lo, hi, at, NULL, 0, run, 0);
}

tps_err tps_lc_src_piece_stride(cstate *C, tps_rtensor *r, size_t src, int dim, uint64_t lo,
                                uint64_t hi, uint64_t at, uint64_t run, int sdim)
{
    return add_src_piece(C, r, src, dim, lo, hi, at, NULL, 0, run, sdim);
}

char *tps_lc_own_name(cstate *C, char *s)
{
    tps_layout *L = C->L;
    if (!s) return NULL;
    char **n = realloc(L->names, (L->nnames + 1) * sizeof *n);
    if (!n) {
        free(s);
        return NULL;
    }
    L->names = n;
    L->names[L->nnames++] = s;
    return s;
}

/* torch.chunk (exact 0) or an even split that must divide (exact 1): rank
 * r's [lo, lo + len) of n. Returns 0 when an exact split does not divide. */
static int split_range(uint64_t n, int tp, int r, int exact, uint64_t *lo, uint64_t *len)
{
    if (exact) {
        if (n % (uint64_t)tp) return 0;
        *len = n / (uint64_t)tp;
        *lo = (uint64_t)r * *len;
        return 1;
    }
    tps_chunk(n, tp, r, lo, len);
    return 1;
}

/* Rank r's rows [lo, lo + len) of a fused part of n rows: on whole heads
 * (heads > 0; with replicate, fewer heads than ranks each whole on
 * tp / heads ranks), else split_range. 0 when no such split exists. */
int tps_lc_part_rows(uint64_t n, uint64_t heads, int replicate, int tp, int r, int exact,
                     uint64_t *lo, uint64_t *len)
{
    if (!heads) return split_range(n, tp, r, exact, lo, len);
    if (heads % (uint64_t)tp == 0) {
        *len = n / (uint64_t)tp;
        *lo = (uint64_t)r * *len;
        return 1;
    }
    if (replicate && heads < (uint64_t)tp && (uint64_t)tp % heads == 0) {
        *len = n / heads;
        *lo = (uint64_t)r / ((uint64_t)tp / heads) * *len;
        return 1;
    }
    return 0;
}

/* "1, 2, 4, 8" of the tp values up to 64 for which ok(n, tp) holds. */
void tps_lc_works_list(char *buf, size_t len, uint64_t n, uint64_t n2,
                       int (*ok)(uint64_t, uint64_t, int))
{
    size_t o = 0;
    buf[0] = 0;
    for (int k = 1; k <= 64 && o < len; k++)
        if (ok(n, n2, k)) o += (size_t)snprintf(buf + o, len - o, "%s%d", o ? ", " : "", k);
    if (!o) snprintf(buf, len, "none up to 64");
}
int tps_lc_ok_divides(uint64_t n, uint64_t unused, int tp)
{
    (void)unused;
    return n % (uint64_t)tp == 0;
}

/* A config count (top level or text_config), or 0 when absent or not one. */
uint64_t tps_lc_config_count(const cJSON *config, const char *field, int *present)
{
    const cJSON *v = tps_config_get(config, field);
    *present = v != NULL;
    if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble != floor(v->valuedouble) ||
        v->valuedouble > 9007199254740992.0)
        return 0;
    return (uint64_t)v->valuedouble;
}

int tps_lc_last_layers(const cJSON *config, const char *field, int layer, uint64_t *first)
{
    int pn, pl;
    uint64_t n = tps_lc_config_count(config, "num_hidden_layers", &pn);
    uint64_t last = tps_lc_config_count(config, field, &pl);
    *first = n >= last ? n - last : 0;
    return layer >= 0 && last && n && (uint64_t)layer >= *first;
}

int tps_lc_module_of(const char *name, size_t *mlen)
{
    const char *dot = strrchr(name, '.');
    if (!dot || dot == name) return 0;
    *mlen = (size_t)(dot - name);
    return 1;
}

int tps_lc_matches_any(char **pats, size_t n, const char *name)
{
    size_t ml;
    if (!tps_lc_module_of(name, &ml)) return 0;
    for (size_t i = 0; i < n; i++)
        if (tps_module_match(pats[i], name, ml)) return 1;
    return 0;
}

/* Is the checkpoint's model_type one of types (none listed: any)? */
int tps_lc_type_listed(char **types, size_t n, const cJSON *config)
{
    if (!n) return 1;
    const cJSON *mt = tps_config_get(config, "model_type");
    for (size_t i = 0; i < n; i++)
        if (cJSON_IsString(mt) && !strcmp(mt->valuestring, types[i])) return 1;
    return 0;
}

/* Appends to buf, once per field, the setting of config.json that makes
 * condition c hold ("attention_bias: true"), joined by ", or ". */
void tps_lc_enable_hint(char *buf, size_t len, const tps_cond *c)
{
    size_t o = strlen(buf), fl = strlen(c->field);
    for (const char *at = buf; (at = strstr(at, c->field)); at += fl)
        if ((at == buf || at[-1] == ' ') && at[fl] == ':') return;
    char *v = c->value ? cJSON_PrintUnformatted(c->value) : NULL;
    const char *val = c->op == TPS_COND_TRUTHY ? "true" : c->op == TPS_COND_FALSY ? "false"
                                                                                  : v ? v : "?";
    if (o < len)
        snprintf(buf + o, len - o, "%s%s%s: %s", o ? ", or " : "",
                 c->op == TPS_COND_NOT_EQUALS ? "a value of " : "", c->field, val);
    if (c->op == TPS_COND_NOT_EQUALS && strlen(buf) < len)
        snprintf(buf + strlen(buf), len - strlen(buf), " changed");
    free(v);
}

/* The split a serving layout gives a source tensor; a refusal's reason in
 * *why. */
int tps_lc_spec_rule(const tps_layout *L, const char *name, tps_split_kind *k, const char **why)
{
    const tps_lspec *s = L->spec;
    const char *param = tps_lc_param_of(name);
    size_t ml;
    if (why) *why = NULL;
    if (tps_lc_module_of(name, &ml))
        for (size_t q = 0; q < s->nrules; q++) {
            const tps_lrule *r = &s->rules[q];
            if (r->param && strcmp(r->param, param)) continue;
            for (size_t j = 0; j < r->npat; j++) {
                if (!tps_module_match(r->patterns[j], name, ml)) continue;
                if (r->when && !tps_cond_eval(r->when, L->ck->config)) break;
                if (r->refuse) {
                    if (why) *why = r->refuse;
                    *k = TPS_SPLIT_REFUSE;
                    return 1;
                }
                *k = r->split;
                return 1;
            }
        }
    return 0;
}

tps_split_kind tps_lc_spec_split(const tps_layout *L, size_t i, const char **why)
{
    const tps_lspec *s = L->spec;
    const tps_ctensor *t = &L->ck->t[i];
    const char *param = tps_lc_param_of(t->name);
    tps_split_kind rk;
    if (tps_lc_spec_rule(L, t->name, &rk, why)) return rk;
    if (!strcmp(param, "weight") && tps_lc_matches_any(s->vocab, s->nvocab, t->name))
        return TPS_SPLIT_VOCAB;
    switch (L->p[i].style) {
    case TPS_STYLE_COLWISE:
        return L->p[i].dim == 0 ? TPS_SPLIT_ROWS : TPS_SPLIT_REPLICATE;
    case TPS_STYLE_ROWWISE:
        return L->p[i].dim == 1 ? TPS_SPLIT_COLUMNS : TPS_SPLIT_REPLICATE;
    case TPS_STYLE_EMBED_ROWWISE:
        return L->p[i].dim == 0 ? TPS_SPLIT_VOCAB : TPS_SPLIT_REPLICATE;
    case TPS_STYLE_EMBED_COLWISE:
        return L->p[i].dim == 1 ? TPS_SPLIT_COLUMNS : TPS_SPLIT_REPLICATE;
    default: return TPS_SPLIT_REPLICATE;
    }
}

/* Places source tensor i, whole or along dim d, under name on every rank:
 * d -1 replicated; exact/chunk splits; vocab: padded rows of zeros. */
tps_err tps_lc_place_simple(cstate *C, size_t i, const char *name, tps_split_kind k,
                            const char *rule)
{
    tps_layout *L = C->L;
    const tps_ctensor *t = &C->ck->t[i];
    int exact = L->spec ? L->spec->exact : 0;
    int d = k == TPS_SPLIT_ROWS || k == TPS_SPLIT_VOCAB ? 0 : k == TPS_SPLIT_COLUMNS ? 1 : -1;
    if (d >= t->ndim) {
        if (L->spec)
            refuse(C, "%s: tensor '%s' is %d-D, but layout %s splits it along dim %d", C->ck->path,
                   t->name, t->ndim, L->spec->name, d);
        else
            return tps_fail(C->ctx, TPS_E_SHAPE, "%s: tensor '%s' is %d-D but is split along dim %d",
                            C->ck->path, t->name, t->ndim, d);
        return TPS_OK;
    }
    uint64_t n = d >= 0 ? t->shape[d] : 0, per = 0, real = n;
    /* --pad-intermediate: down_proj's input features padded (zero columns) */
    if (d == 1 && t->ndim == 2 && L->pad_field && L->pad_to > L->pad_from && n == L->pad_from &&
        strstr(t->name, ".mlp."))
        n = L->pad_to;
    char works[300];
    if (k == TPS_SPLIT_VOCAB && L->spec) {
        if (!tps_lc_vocab_rows(C, t, n, &per)) return TPS_OK;
    } else if (d >= 0 && exact && n % (uint64_t)C->tp) {
        tps_lc_works_list(works, sizeof works, n, 0, tps_lc_ok_divides);
        refuse(C, "tensor '%s': dim %d of %llu does not divide by tp %d (layout %s splits it "
                  "evenly; tp values that work: %s)",
               t->name, d, (unsigned long long)n, C->tp, L->spec->name, works);
        return TPS_OK;
    }
    for (int r = 0; r < C->tp; r++) {
        uint64_t shape[TPS_MAX_DIMS], lo = 0, len = 0;
        tps_shape_get(shape, t);
        tps_rtensor *rt;
        if (d < 0) {
            TPS_TRY(tps_lc_new_rt(C, name, r, t->dtype, t->ndim, shape, rule, &rt));
            TPS_TRY(tps_lc_src_piece(C, rt, i, -1, 0, 0, 0));
            TPS_TRY(tps_lc_place_scales(C, i, r, -1, 0, 0));
            continue;
        }
        if (per) { /* padded vocabulary: real rows, then zeros */
            lo = (uint64_t)r * per < n ? (uint64_t)r * per : n;
            len = (uint64_t)(r + 1) * per < n ? (uint64_t)(r + 1) * per - lo : n - lo;
            shape[0] = per;
        } else {
            split_range(n, C->tp, r, exact, &lo, &len);
            shape[d] = len;
        }
        TPS_TRY(tps_lc_new_rt(C, name, r, t->dtype, t->ndim, shape, rule, &rt));
        uint64_t rowb = tps_lc_inner_bits(t, d) / 8;
        if (n != real) {
            /* the real columns, then zero columns: runs a row apart */
            uint64_t rl = lo >= real ? 0 : lo + len <= real ? len : real - lo;
            size_t es = tps_dtype_bits(t->dtype) / 8;
            if (rl == len) TPS_TRY(tps_lc_src_piece(C, rt, i, d, lo, lo + len, 0));
            else if (rl) TPS_TRY(tps_lc_src_piece_run(C, rt, i, d, lo, lo + rl, 0, rl * es));
            if (len > rl) L->pad_used = 1;
            if (len > rl)
                TPS_TRY(tps_lc_add_piece(C, rt, (tps_lpiece){.kind = TPS_PK_ZERO, .at = rl * es,
                                                             .nbytes = t->shape[0] * (len - rl) * es,
                                                             .run = (uint32_t)((len - rl) * es)}));
            if (C->why[0]) return TPS_OK;
            TPS_TRY(tps_lc_place_scales_padded(C, i, r, d, lo, len, real));
            if (C->why[0]) return TPS_OK;
            continue;
        }
        if (len || !per) TPS_TRY(tps_lc_src_piece(C, rt, i, d, lo, lo + len, 0));
        if (per > len)
            TPS_TRY(tps_lc_add_piece(C, rt, (tps_lpiece){.kind = TPS_PK_ZERO, .at = len * rowb,
                                                         .nbytes = (per - len) * rowb}));
        if (L->q && L->q->role[i] == TPS_QR_WEIGHT && per) {
            refuse(C, "tensor '%s' is quantized, and layout %s pads it as a vocabulary: not "
                      "supported yet",
                   t->name, L->spec->name);
            return TPS_OK;
        }
        TPS_TRY(tps_lc_place_scales(C, i, r, d, lo, len));
        if (C->why[0]) return TPS_OK;
    }
    return TPS_OK;
}

/* ------------------------------------------------------------------ stages */

/* Does layout s serve this checkpoint (its architectures or model types;
 * none listed: every one)? */
static int spec_serves(const tps_lspec *s, const cJSON *config)
{
    if (!s->narch && !s->nmt) return 1;
    const cJSON *a = tps_config_get(config, "architectures");
    for (const cJSON *x = cJSON_IsArray(a) ? a->child : NULL; x; x = x->next)
        for (size_t i = 0; i < s->narch; i++)
            if (cJSON_IsString(x) && !strcmp(x->valuestring, s->architectures[i])) return 1;
    const cJSON *mt = tps_config_get(config, "model_type");
    for (size_t i = 0; i < s->nmt; i++)
        if (cJSON_IsString(mt) && !strcmp(mt->valuestring, s->model_types[i])) return 1;
    return 0;
}

/* Is the checkpoint's architecture (or model type) one the layout covers? */
static tps_err check_architecture(cstate *C)
{
    const tps_lspec *s = C->L->spec;
    const tps_ckpt *ck = C->ck;
    char detail[512];
    if (!spec_serves(s, ck->config)) {
        const cJSON *a = tps_config_get(ck->config, "architectures");
        char *as = a ? cJSON_PrintUnformatted(a) : NULL;
        size_t o = (size_t)snprintf(detail, sizeof detail, "layout %s covers ", s->name);
        for (size_t i = 0; i < s->narch && o < sizeof detail; i++)
            o += (size_t)snprintf(detail + o, sizeof detail - o, "%s%s", i ? ", " : "",
                                  s->architectures[i]);
        if (o < sizeof detail)
            snprintf(detail + o, sizeof detail - o, "; this checkpoint's architectures are %s",
                     as ? as : ck->config ? "not given" : "unknown (no config.json)");
        free(as);
        TPS_TRY(tps_lc_add_check(C, "architecture served", 0, detail));
        refuse(C, "%s", detail);
        return TPS_OK;
    }
    return tps_lc_add_check(C, "architecture served", 1, "yes");
}

/* Scales of a kind the layout cannot write (its refuse_scales). */
static tps_err check_quant_served(cstate *C)
{
    const tps_layout *L = C->L;
    const tps_lspec *s = L->spec;
    const tps_ckpt *ck = C->ck;
    char detail[512];
    if (L->q && L->q->m->weight_suffix) { /* packed codes: the layouts that load them */
        int served = 0;
        for (size_t k = 0; s && k < s->npacked_methods; k++)
            served |= !strcmp(s->packed_methods[k], L->q->m->name);
        if (served)
            return tps_lc_add_check(C, "quantization served", 1, L->q->m->what);
        snprintf(detail, sizeof detail, "%s", tps_quant_packed_reason(L->q, s ? s->name : NULL,
                                                                      s ? s->packed_reason : NULL));
        TPS_TRY(tps_lc_add_check(C, "quantization served", 0, detail));
        refuse(C, "%s", detail);
        return TPS_OK;
    }
    if (L->q && s && s->refuse_scales) {
        for (size_t i = 0; i < ck->n; i++)
            if (L->q->role[i] == TPS_QR_SCALE && (s->refuse_scales >> L->q->kind[i] & 1u)) {
                snprintf(detail, sizeof detail,
                         "%s checkpoints with %s FP8 scales ('%s'): layout %s cannot write "
                         "them: %s",
                         L->q->method_name, tps_qscale_labels[L->q->kind[i]], ck->t[i].name, s->name,
                         s->refuse_scales_reason);
                TPS_TRY(tps_lc_add_check(C, "quantization served", 0, detail));
                refuse(C, "%s", detail);
                return TPS_OK;
            }
    }
    return TPS_OK;
}

/* The layout file's checks (reject_if, quotient, divisible), each an outcome plan shows. */
static tps_err run_layout_checks(cstate *C)
{
    const tps_lspec *s = C->L->spec;
    const tps_ckpt *ck = C->ck;
    char detail[512];
    for (size_t k = 0; k < s->nchecks; k++) {
        const tps_lcheck *c = &s->checks[k];
        if (c->when && !tps_cond_eval(c->when, ck->config)) continue;
        int bad = 0;
        if (c->divisible) {
            int pf;
            uint64_t f = tps_lc_config_count(ck->config, c->divisible, &pf);
            if (!pf || !f) {
                char *lack = pf ? NULL : tps_config_lacks(c->divisible);
                snprintf(detail, sizeof detail, "config.json %s%s: %s",
                         pf ? "has no usable count in " : "", pf ? c->divisible : lack ? lack :
                         "lacks it", c->reason);
                free(lack);
                bad = 1;
            } else if (f % (uint64_t)C->tp) {
                char works[300];
                tps_lc_works_list(works, sizeof works, f, 0, tps_lc_ok_divides);
                snprintf(detail, sizeof detail,
                         "%s = %llu is not divisible by tp %d (tp values that work: %s): %s",
                         c->divisible, (unsigned long long)f, C->tp, works, c->reason);
                bad = 1;
            }
        } else if (c->is_quotient) {
            int pf, pn, pd;
            uint64_t f = tps_lc_config_count(ck->config, c->field, &pf);
            uint64_t a = tps_lc_config_count(ck->config, c->num, &pn);
            uint64_t b = tps_lc_config_count(ck->config, c->den, &pd);
            if (pf && a && b && f != a / b) {
                snprintf(detail, sizeof detail, "%s = %llu, but %s / %s = %llu: %s", c->field,
                         (unsigned long long)f, c->num, c->den, (unsigned long long)(a / b),
                         c->reason);
                bad = 1;
            }
        } else if (tps_cond_eval(&c->cond, ck->config)) {
            snprintf(detail, sizeof detail, "%s", c->reason);
            bad = 1;
        }
        TPS_TRY(tps_lc_add_check(C, c->name, !bad, bad ? detail : "yes"));
        if (bad) {
            refuse(C, "%s", detail);
            return TPS_OK;
        }
    }
    return TPS_OK;
}

/* Every tensor no stage before placed, as the plan (DTensor) or the
 * layout's rules say; emb (the embedding a tied head is written from, or
 * -1) as the head. Scales go with their weights. */
static tps_err place_rest(cstate *C, int emb)
{
    tps_layout *L = C->L;
    const tps_ckpt *ck = C->ck;
    const tps_lspec *s = L->spec;
    for (size_t i = 0; i < ck->n && !C->why[0]; i++) {
        if (C->used[i] || (L->q && (L->q->role[i] == TPS_QR_SCALE ||
                                   L->q->role[i] == TPS_QR_INPUT_SCALE)))
            continue;
        const tps_ctensor *t = &ck->t[i];
        if (!s) {
            int d = L->p[i].dim;
            TPS_TRY(tps_lc_place_simple(C, i, t->name,
                                          d < 0 ? TPS_SPLIT_REPLICATE : d == 0 ? TPS_SPLIT_ROWS
                                                                                : TPS_SPLIT_COLUMNS,
                                          L->p[i].rule));
            continue;
        }
        const char *name = t->name;
        if ((int)i == emb) {
            name = tps_lc_own_name(C, tps_asprintf("%s.weight", s->tied_head));
            if (!name) return nomem(C);
        }
        const char *why = NULL;
        tps_split_kind sk = tps_lc_spec_split(L, i, &why);
        if (sk == TPS_SPLIT_REFUSE) {
            refuse(C, "tensor '%s': %s (layout %s)", t->name, why, s->name);
            break;
        }
        if (tps_lc_unkeyed(C, i, emb)) break;
        TPS_TRY(tps_lc_place_simple(C, i, name, sk, L->p[i].rule));
    }
    return TPS_OK;
}

/* The engine's own acceptance rules (heads per rank, even splits), as
 * outcomes plan shows. */
static tps_err acceptance_checks(cstate *C)
{
    const tps_layout *L = C->L;
    const tps_lspec *s = L->spec;
    const tps_ckpt *ck = C->ck;
    for (size_t fi = 0; fi < s->nfuse; fi++)
        for (size_t j = 0; j < s->fuse[fi].nparts; j++) {
            const tps_lpart *p = &s->fuse[fi].parts[j];
            int present, dup = 0;
            if (!p->heads || !tps_lfuse_applies(&s->fuse[fi], ck->config)) continue;
            for (size_t a = 0; a < fi && !dup; a++)
                for (size_t b = 0; b < s->fuse[a].nparts; b++)
                    dup |= s->fuse[a].parts[b].heads && !strcmp(s->fuse[a].parts[b].heads, p->heads);
            for (size_t b = 0; b < j; b++)
                dup |= s->fuse[fi].parts[b].heads && !strcmp(s->fuse[fi].parts[b].heads, p->heads);
            if (dup) continue;
            uint64_t h = tps_lc_config_count(ck->config, p->heads, &present);
            if (!h) continue;
            char nm[128], d[256];
            snprintf(nm, sizeof nm, p->replicate ? "%s %% tp == 0 or tp %% %s == 0" : "%s %% tp == 0",
                     p->heads, p->heads);
            if (h % (uint64_t)L->tp == 0)
                snprintf(d, sizeof d, "%s = %llu: %llu per rank at tp %d", p->heads,
                         (unsigned long long)h, (unsigned long long)(h / (uint64_t)L->tp), L->tp);
            else
                snprintf(d, sizeof d, "%s = %llu: each of them whole on %llu ranks at tp %d",
                         p->heads, (unsigned long long)h,
                         (unsigned long long)((uint64_t)L->tp / h), L->tp);
            TPS_TRY(tps_lc_add_check(C, nm, 1, d));
        }
    return tps_lc_add_check(C,
                            s->exact ? "every split divides evenly" : "splits follow torch.chunk",
                            1, s->exact ? "yes" : "uneven shards allowed");
}

/* ------------------------------------------------------------------ the driver */

/* The stages in order. Each places what it owns and marks it used, or
 * refuses (C.why): the first refusal ends the compile, as L->rejected. */
tps_err tps_layout_compile(tps_ctx *ctx, tps_layout *L)
{
    const tps_ckpt *ck = L->ck;
    const tps_lspec *s = L->spec;
    cstate C = {.ctx = ctx, .L = L, .ck = ck, .tp = L->tp};
    tps_err rc = TPS_OK;
    C.used = tps_xcalloc(ck->n ? ck->n : 1, 1);
    C.last = tps_xmalloc((ck->n ? ck->n : 1) * sizeof *C.last);
    if (L->keep) C.placed = tps_xcalloc(ck->n ? ck->n : 1, 1);
    if (L->keep && !L->rank_bytes) L->rank_bytes = tps_xcalloc((size_t)L->nranks, sizeof *L->rank_bytes);
    if (!C.used || !C.last || (L->keep && (!C.placed || !L->rank_bytes))) {
        free(C.used);
        free(C.last);
        free(C.placed);
        return nomem(&C);
    }
    if (L->keep && L->pp > 1) {
        free(C.used);
        free(C.last);
        free(C.placed);
        return tps_fail(ctx, TPS_E_ARG, "a layout of some ranks only is for pp 1");
    }
    for (size_t i = 0; i < ck->n; i++) C.last[i] = SIZE_MAX;
    if (L->rejected) goto out; /* the plan said no: nothing to lay out */
    if (s) {
        TPS_CHECK(check_architecture(&C));
        if (C.why[0]) goto out;
        TPS_CHECK(check_quant_served(&C));
        if (C.why[0]) goto out;
        TPS_CHECK(run_layout_checks(&C));
        if (C.why[0]) goto out;
    }
    if (!s) TPS_CHECK(check_quant_served(&C));
    if (C.why[0]) goto out;
    /* The tied head: a checkpoint without one writes it from the embedding. */
    int emb = -1;
    TPS_CHECK(tps_lc_tied_head(&C, &emb));
    if (C.why[0]) goto out;
    /* packed tensors must hold the rows their config says (any layout) */
    if (!tps_lc_packed_fit(&C)) goto out;
    if (!tps_lc_ep_served(&C)) goto out;
    /* what the engine's load_weights skips: no rank file holds it */
    TPS_CHECK(tps_lc_drop(&C));
    if (C.why[0]) goto out;
    if (L->pad_mode && !s) {
        refuse(&C, "--pad-intermediate pads the MLP in a serving layout (vllm, sglang); the "
                   "dtensor layout keeps the checkpoint's shapes");
        goto out;
    }
    if (L->pad_mode) {
        TPS_CHECK(tps_lc_pad_setup(&C));
        if (C.why[0]) goto out;
    }
    if (s) {
        TPS_CHECK(tps_lc_compile_packed(&C));
        if (C.why[0]) goto out;
        TPS_CHECK(tps_lc_compile_experts(&C));
        if (C.why[0]) goto out;
        TPS_CHECK(tps_lc_compile_fused(&C));
        if (C.why[0]) goto out;
    }
    TPS_CHECK(place_rest(&C, emb));
    if (s && !C.why[0]) TPS_CHECK(acceptance_checks(&C));
    /* the stages' workers: each tp rank's tensors on the stages that build them */
    if (!C.why[0]) TPS_CHECK(tps_lc_pipeline(&C));
out:
    if (!rc && C.why[0]) {
        int shown = 0;
        for (size_t k = 0; k < L->nchecks; k++) shown |= L->checks[k].ok == 0;
        /* plan's checks list shows why, as it does a check's refusal */
        if (!shown) tps_lc_add_check(&C, s ? "layout rules" : "plan rules", 0, C.why);
        free(L->rejected);
        L->rejected = tps_strdup(C.why);
        if (!L->rejected) rc = nomem(&C);
    }
    free(C.gh); /* the other ranks' regions: only the compile needed them */
    C.gh = NULL;
    if (!rc && !L->rejected) rc = tps_lc_finish(&C);
    free(C.used);
    free(C.last);
    free(C.next);
    free(C.placed);
    return rc;
}
