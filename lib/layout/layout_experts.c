/* layout_experts.c - experts: a layout file's experts entries stack a
 * module's <module>.<e>.<part>.weight into the engine's 3-D parameters
 * (w13 / w2 stacks, rows or columns), each expert's rows split over the
 * ranks, or with --ep every expert whole on one rank; the router renamed
 * and replicated. A new expert format (another naming, another stacking) is
 * read here. */
#include "layout_int.h"

#include <stdlib.h>
#include <string.h>

/* Tensor i as <module>.<e>.<leaf>.<param> with module matching x: 1 and the
 * module's length, e, and the leaf's span. */
static int expert_name(const tps_lexperts *x, const char *nm, size_t *mlen, uint64_t *e,
                       const char **leaf, size_t *leaflen)
{
    size_t ml;
    if (!tps_lc_module_of(nm, &ml)) return 0;
    const char *dl = memrchr(nm, '.', ml); /* before <leaf> */
    if (!dl) return 0;
    const char *de = memrchr(nm, '.', (size_t)(dl - nm)); /* before <e> */
    if (!de || de + 1 == dl || dl - de > 8) return 0;
    uint64_t v = 0;
    for (const char *c = de + 1; c < dl; c++) {
        if (*c < '0' || *c > '9') return 0;
        v = v * 10 + (uint64_t)(*c - '0');
    }
    size_t pl = (size_t)(de - nm);
    int hit = 0;
    for (size_t k = 0; k < x->npat && !hit; k++) hit = tps_module_match(x->patterns[k], nm, pl);
    if (!hit) return 0;
    *mlen = pl;
    *e = v;
    *leaf = dl + 1;
    *leaflen = ml - (size_t)(dl + 1 - nm);
    return 1;
}

int tps_lc_is_expert(const cstate *C, const char *name)
{
    const tps_lspec *s = C->L->spec;
    size_t ml, ll;
    uint64_t e;
    const char *leaf;
    for (size_t xi = 0; s && xi < s->nexperts; xi++)
        if (tps_lc_type_listed(s->experts[xi].model_types, s->experts[xi].nmt, C->ck->config) &&
            expert_name(&s->experts[xi], name, &ml, &e, &leaf, &ll))
            return 1;
    return 0;
}

/* Every tensor under the module must be a stacked expert weight (of an
 * expert below E, plain, of a part the layout knows): 0 and a refusal when
 * one is not. */
static int expert_tensors_ok(cstate *C, const tps_lexperts *x, const char *module, size_t a,
                             size_t b, uint64_t E)
{
    tps_layout *L = C->L;
    const tps_ckpt *ck = C->ck;
    const char *lname = L->spec->name;
    for (size_t i = a; i < b; i++) {
        const char *nm = ck->t[i].name, *leaf;
        size_t ml, ll;
        uint64_t e;
        if (!expert_name(x, nm, &ml, &e, &leaf, &ll) || ml != strlen(module)) {
            refuse(C, "tensor '%s' lies under '%s', which layout %s stacks as experts "
                      "<e>.<module>.weight: it is not one",
                   nm, module, lname);
            return 0;
        }
        if (e >= E) {
            refuse(C, "tensor '%s' is expert %llu, but config.json says %s = %llu", nm,
                   (unsigned long long)e, x->count, (unsigned long long)E);
            return 0;
        }
        int role = L->q ? L->q->role[i] : TPS_QR_PLAIN;
        if (role != TPS_QR_PLAIN && role != TPS_QR_WEIGHT && role != TPS_QR_SCALE &&
            role != TPS_QR_INPUT_SCALE) {
            refuse(C, "tensor '%s' is a %s expert part: layout %s does not stack such experts",
                   nm, L->q->method_name, lname);
            return 0;
        }
        /* a scale beside its weight: placed with the weight's stack */
        if (role == TPS_QR_SCALE || role == TPS_QR_INPUT_SCALE) {
            size_t wl;
            uint64_t we;
            const char *wleaf;
            size_t wll;
            const char *wn = ck->t[L->q->partner[i]].name;
            if (!expert_name(x, wn, &wl, &we, &wleaf, &wll) || wl != ml || we != e) {
                refuse(C, "tensor '%s' lies under '%s', but the weight it scales, '%s', is not "
                          "that expert's",
                       nm, module, wn);
                return 0;
            }
            continue;
        }
        if (strcmp(tps_lc_param_of(nm), "weight")) {
            refuse(C, "tensor '%s': layout %s stacks expert weights; the engine has no place "
                      "for an expert's %s",
                   nm, lname, tps_lc_param_of(nm));
            return 0;
        }
        int known = 0;
        for (size_t s = 0; s < x->nstacks && !known; s++)
            for (size_t j = 0; j < x->stacks[s].nparts && !known; j++)
                known = strlen(x->stacks[s].parts[j]) == ll && !memcmp(x->stacks[s].parts[j], leaf, ll);
        if (!known) {
            refuse(C, "tensor '%s': layout %s does not know expert module '%.*s'", nm, lname,
                   (int)ll, leaf);
            return 0;
        }
    }
    return 1;
}

/* Each expert's parts, with one shape: rows stacks [I, H], columns [H, I].
 * idx[e * nidx + k] is expert e's part k (the stacks' parts in order); the
 * shape in *I_out, *H_out, the first part in *t0_out. A refusal in C->why
 * for a part missing or of another shape. */
static tps_err expert_parts(cstate *C, const tps_lexperts *x, const char *module, uint64_t E,
                            size_t nidx, size_t *idx, uint64_t *I_out, uint64_t *H_out,
                            const tps_ctensor **t0_out)
{
    const tps_ckpt *ck = C->ck;
    const char *lname = C->L->spec->name;
    uint64_t I = 0, H = 0;
    const tps_ctensor *t0 = NULL;
    for (uint64_t e = 0; e < E && !C->why[0]; e++) {
        size_t k = 0;
        for (size_t s = 0; s < x->nstacks && !C->why[0]; s++)
            for (size_t j = 0; j < x->stacks[s].nparts && !C->why[0]; j++, k++) {
                char *want = tps_asprintf("%s.%llu.%s.weight", module, (unsigned long long)e,
                                          x->stacks[s].parts[j]);
                if (!want) return nomem(C);
                int w = tps_ckpt_find(ck, want);
                if (w < 0) {
                    refuse(C, "config.json says %s = %llu, but the checkpoint lacks '%s'",
                           x->count, (unsigned long long)E, want);
                    free(want);
                    break;
                }
                free(want);
                const tps_ctensor *t = &ck->t[w];
                int d = x->stacks[s].dim;
                if (!t0) {
                    t0 = t;
                    I = t->ndim == 2 ? t->shape[d] : 0;
                    H = t->ndim == 2 ? t->shape[1 - d] : 0;
                }
                if (t->ndim != 2 || t->dtype != t0->dtype || t->shape[d] != I ||
                    t->shape[1 - d] != H) {
                    refuse(C, "expert tensor '%s' (%s, %d-D) does not match '%s' (%s, [%llu, "
                              "%llu] with its rows or columns the expert's intermediate size "
                              "%llu): layout %s stacks experts of one shape",
                           t->name, tps_dtype_name(t->dtype), t->ndim, t0->name,
                           tps_dtype_name(t0->dtype), (unsigned long long)t0->shape[0],
                           t0->ndim == 2 ? (unsigned long long)t0->shape[1] : 0ULL,
                           (unsigned long long)I, lname);
                    break;
                }
                idx[e * nidx + k] = (size_t)w;
            }
    }
    *I_out = I;
    *H_out = H;
    *t0_out = t0;
    return TPS_OK;
}

/* The experts' sizes against config.json and tp: the intermediate size I
 * (x->rows), and with --ep whole experts per rank, else every expert's rows
 * split evenly. 0 and a refusal when they do not fit. */
static int expert_sizes_ok(cstate *C, const tps_lexperts *x, const char *module, uint64_t E,
                           uint64_t Iconf, uint64_t I)
{
    tps_layout *L = C->L;
    const tps_ckpt *ck = C->ck;
    const char *lname = L->spec->name;
    uint64_t tp = (uint64_t)C->tp;
    int present;
    if (x->rows) {
        uint64_t want = tps_lc_config_count(ck->config, x->rows, &present);
        if (present && want != Iconf) {
            refuse(C, "%s = %llu in config.json, but the experts of '%s' have %llu", x->rows,
                   (unsigned long long)want, module, (unsigned long long)Iconf);
            return 0;
        }
    }
    const char *rows_name = x->rows ? x->rows : "the expert intermediate size";
    if (L->ep) {
        if (E % tp) {
            char works[300];
            tps_lc_works_list(works, sizeof works, E, 0, tps_lc_ok_divides);
            refuse(C, "%s = %llu is not divisible by the EP size %d (with --ep each rank holds the "
                      "same number of whole experts; tp values that work: %s)",
                   x->count, (unsigned long long)E, C->tp, works);
            return 0;
        }
    } else {
        if (tp > E) {
            refuse(C, "%s = %llu < tp %d: the engine refuses more ranks than experts (split with "
                      "--ep, or a smaller tp)",
                   x->count, (unsigned long long)E, C->tp);
            return 0;
        }
        if (I % tp) {
            char works[300];
            tps_lc_works_list(works, sizeof works, I, 0, tps_lc_ok_divides);
            refuse(C, "%s = %llu is not divisible by tp %d (layout %s splits every expert's rows "
                      "evenly; tp values that work: %s; or split with --ep)",
                   rows_name, (unsigned long long)I, C->tp, lname, works);
            return 0;
        }
    }
    return 1;
}

/* The stacks on every rank r: with --ep experts [r * E / tp, (r + 1) * E /
 * tp) whole, else every expert's rows (or columns) of rank r. */
static tps_err stack_experts(cstate *C, const tps_lexperts *x, const char *module,
                             const size_t *idx, size_t nidx, uint64_t E, uint64_t I, uint64_t H,
                             const tps_ctensor *t0, uint64_t Ireal)
{
    tps_layout *L = C->L;
    uint64_t tp = (uint64_t)C->tp;
    uint64_t Er = L->ep ? E / tp : E, Ir = L->ep ? I : I / tp;
    uint64_t es = tps_dtype_bits(t0->dtype) / 8;
    for (int r = 0; r < C->tp; r++) {
        uint64_t e0 = L->ep ? (uint64_t)r * Er : 0;
        size_t k0 = 0;
        for (size_t s = 0; s < x->nstacks; s++) {
            const tps_lstack *st = &x->stacks[s];
            char *name =
                tps_lc_own_name(C, x->into ? tps_asprintf("%s.%s.%s", module, x->into, st->name)
                                           : tps_asprintf("%s.%s", module, st->name));
            if (!name) return nomem(C);
            uint64_t shape[TPS_MAX_DIMS] = {Er, st->dim ? H : st->nparts * Ir, st->dim ? Ir : H};
            tps_rtensor *rt;
            TPS_TRY(tps_lc_new_rt(C, name, r, t0->dtype, 3, shape, "experts", &rt));
            uint64_t lo = L->ep ? 0 : (uint64_t)r * Ir, hi = L->ep ? 0 : lo + Ir;
            for (uint64_t k = 0; k < Er; k++)
                for (size_t j = 0; j < st->nparts; j++) {
                    size_t w = idx[(e0 + k) * nidx + k0 + j];
                    uint64_t at = (k * st->nparts + j) * Ir * H * es;
                    /* --pad-intermediate: features from Ireal on are zeros */
                    if (!L->ep && hi > Ireal)
                        TPS_TRY(tps_lc_padded_piece(C, rt, w, st->dim, lo, hi, Ireal, at, 0.0));
                    else
                        TPS_TRY(tps_lc_src_piece(C, rt, w, L->ep ? -1 : st->dim, lo, hi, at));
                    if (C->why[0]) return TPS_OK;
                }
            TPS_TRY(tps_lc_place_stack_scales(C, module, x->into, st, idx, nidx, k0, Er, I, r));
            if (C->why[0]) return TPS_OK;
            k0 += st->nparts;
        }
    }
    return TPS_OK;
}

/* Does the engine stack module's sibling x->shared as expert E (SGLang's
 * DeepSeek-V3 shared-experts fusion)? */
static int shared_fused(cstate *C, const tps_lexperts *x, uint64_t E)
{
    const cJSON *cfg = C->ck->config;
    if (!x->shared || C->L->ep) return 0;
    const cJSON *arch = cJSON_GetArrayItem(tps_config_get(cfg, "architectures"), 0);
    int listed = 0;
    for (size_t k = 0; k < x->nshared_arch && !listed; k++)
        listed = cJSON_IsString(arch) && !strcmp(arch->valuestring, x->shared_arch[k]);
    int counted = 0;
    for (size_t k = 0; k < x->nshared_counts && !counted; k++) counted = x->shared_counts[k] == E;
    int present;
    return listed && counted && tps_lc_config_count(cfg, x->shared_field, &present) == 1;
}

/* Expert E's parts from the shared module (<parent>.<shared>.<part>.weight),
 * of the routed experts' shape: idx[E * nidx + k]. */
static int shared_parts(cstate *C, const tps_lexperts *x, const char *module, uint64_t E,
                        size_t nidx, size_t *idx, uint64_t I, uint64_t H)
{
    const tps_ckpt *ck = C->ck;
    const char *dot = strrchr(module, '.');
    int pl = dot ? (int)(dot - module) : 0;
    size_t k = 0;
    for (size_t s = 0; s < x->nstacks; s++)
        for (size_t j = 0; j < x->stacks[s].nparts; j++, k++) {
            char *want = tps_asprintf("%.*s%s%s.%s.weight", pl, module, pl ? "." : "", x->shared,
                                      x->stacks[s].parts[j]);
            if (!want) return -1;
            int w = tps_ckpt_find(ck, want);
            int d = x->stacks[s].dim;
            if (w < 0 || ck->t[w].ndim != 2 || ck->t[w].shape[d] != I ||
                ck->t[w].shape[1 - d] != H) {
                refuse(C, "layout %s stacks the shared expert as expert %llu of '%s' (%s = 1, "
                          "as the engine fuses it), but '%s' %s",
                       C->L->spec->name, (unsigned long long)E, module, x->shared_field, want,
                       w < 0 ? "is not in the checkpoint"
                             : "does not have the routed experts' shape");
                free(want);
                return 0;
            }
            free(want);
            idx[E * nidx + k] = (size_t)w;
        }
    return 1;
}

static uint64_t gcd_u64(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* One experts module (tensors [a, b) of the checkpoint, all named
 * <module>.*): its stacks on every rank, and its router. */
static tps_err place_experts(cstate *C, const tps_lexperts *x, const char *module, size_t a,
                             size_t b)
{
    const tps_ckpt *ck = C->ck;
    const char *lname = C->L->spec->name;
    int present;
    uint64_t E = tps_lc_config_count(ck->config, x->count, &present);
    if (!E) {
        char *why = present ? NULL : tps_config_lacks(x->count);
        refuse(C, "layout %s stacks the experts of '%s', but config.json %s%s", lname, module,
               present ? "has no usable count in " : "", present ? x->count : why ? why : "lacks it");
        free(why);
        return TPS_OK;
    }
    if (E > 65536) {
        refuse(C, "%s = %llu experts: more than tpshard handles (65536)", x->count,
               (unsigned long long)E);
        return TPS_OK;
    }
    if (C->L->q && C->L->q->m->weight_suffix) /* packed codes: their own stacks */
        return tps_lc_packed_experts(C, x, module, E);
    if (!expert_tensors_ok(C, x, module, a, b, E)) return TPS_OK;
    /* Each expert's parts, with one shape: rows stacks [I, H], columns [H, I]. */
    size_t nidx = 0;
    for (size_t s = 0; s < x->nstacks; s++) nidx += x->stacks[s].nparts;
    int fused = shared_fused(C, x, E);
    size_t *idx = tps_xcalloc((size_t)(E + 1) * nidx, sizeof *idx);
    if (!idx) return nomem(C);
    uint64_t I = 0, H = 0;
    const tps_ctensor *t0 = NULL;
    tps_err rc = expert_parts(C, x, module, E, nidx, idx, &I, &H, &t0);
    if (!rc && !C->why[0] && fused) {
        int ok = shared_parts(C, x, module, E, nidx, idx, I, H);
        if (ok < 0) rc = nomem(C);
    }
    /* --pad-intermediate: the experts' intermediate size padded (FP8: to
     * whole blocks a rank) */
    uint64_t Ireal = I;
    if (!rc && !C->why[0] && C->L->pad_mode && !C->L->ep) {
        const tps_quant *q = C->L->q;
        uint64_t unit = q && q->bn ? q->bn / gcd_u64(q->bn, q->bk) * q->bk : 1;
        /* where vLLM's refined grid places the blocks, nothing needs padding */
        if (!(q && q->bn && tps_lc_refined_grid(C, I, H)))
            rc = tps_lc_expert_pad(C, x, I, unit, "FP8 blocks", &I);
    }
    if (!rc && !C->why[0] && expert_sizes_ok(C, x, module, E, Ireal, I) &&
        tps_lc_expert_scales_ok(C, module, idx[0], E, I, H))
        rc = stack_experts(C, x, module, idx, nidx, E + (uint64_t)fused, I, H, t0, Ireal);
    free(idx);
    return rc;
}

/* Every tensor <module>.<leaf> is placed by its stacks: 0, or a refusal
 * naming one that is not (the engine has no place for it). */
static tps_err module_all_used(cstate *C, const char *module)
{
    const tps_ckpt *ck = C->ck;
    size_t ml = strlen(module);
    for (size_t i = 0; i < ck->n; i++) {
        const char *nm = ck->t[i].name;
        if (C->used[i] || strncmp(nm, module, ml) || nm[ml] != '.' || strchr(nm + ml + 1, '.'))
            continue;
        refuse(C, "tensor '%s' lies under '%s', whose experts layout %s stacks, but none of its "
                  "stacks holds it",
               nm, module, C->L->spec->name);
        break;
    }
    return TPS_OK;
}

/* Experts held whole in 3-D tensors, <module>.<part> [E, halves x I, H]
 * (rows stacks) or [E, H, I] (columns): each stack on every rank, its
 * experts' rows (every half's) or columns of the rank, or with --ep its
 * experts whole. A rows stack of two halves (gate then up) puts each
 * expert's rank rows of both side by side: two pieces whose runs are an
 * expert apart (sdim 1). */
/* tp splits n features into whole blocks of b a rank. */
static int whole_blocks(uint64_t n, uint64_t b, int tp)
{
    return n % (uint64_t)tp == 0 && (n / (uint64_t)tp) % b == 0;
}

/* The block scales sc [E, rows / bn, cols / bk] of a stack held in one 3-D
 * tensor, on every rank as its weight's pieces go: w13 each expert's rank
 * block rows of each half side by side (runs an expert apart), w2 the rank's
 * block columns, with --ep whole experts. Named as the stack with its
 * trailing "weight" replaced by weight_scale_inv (w13_weight_scale_inv), as
 * vLLM's FusedMoE creates them; F32. */
static tps_err stacked_scales(cstate *C, const tps_lexperts *x, const char *module,
                              const tps_lstack *st, size_t sc, uint64_t E, uint64_t I,
                              uint64_t Er, uint64_t Ir)
{
    tps_layout *L = C->L;
    const tps_quant *q = L->q;
    const tps_ctensor *s = &C->ck->t[sc];
    size_t sl = strlen(st->name);
    if (sl >= 6 && !strcmp(st->name + sl - 6, "weight")) sl -= 6;
    char *name = tps_lc_own_name(C, x->into ? tps_asprintf("%s.%s.%.*sweight_scale_inv", module,
                                                           x->into, (int)sl, st->name)
                                            : tps_asprintf("%s.%.*sweight_scale_inv", module,
                                                           (int)sl, st->name));
    if (!name) return nomem(C);
    uint64_t es = tps_dtype_bits(s->dtype) / 8, b = st->dim ? q->bk : q->bn;
    uint64_t Ib = I / b, Irb = Ir / b; /* block rows (w13) or columns (w2) of one half */
    (void)E;
    for (int r = 0; r < C->tp; r++) {
        uint64_t shape[3] = {Er, st->dim ? s->shape[1] : (uint64_t)st->halves * Irb,
                             st->dim ? Irb : s->shape[2]};
        tps_rtensor *rt;
        TPS_TRY(tps_lc_new_rt(C, name, r, s->dtype, 3, shape, "expert scales", &rt));
        if (L->ep) {
            TPS_TRY(tps_lc_src_piece(C, rt, sc, 0, (uint64_t)r * Er, (uint64_t)(r + 1) * Er, 0));
            continue;
        }
        if (st->dim) {
            TPS_TRY(tps_lc_src_piece(C, rt, sc, 2, (uint64_t)r * Irb, (uint64_t)(r + 1) * Irb, 0));
            continue;
        }
        uint64_t rowb = s->shape[2] * es;
        for (int h = 0; h < st->halves; h++) {
            uint64_t lo = (uint64_t)h * Ib + (uint64_t)r * Irb;
            if (st->halves == 1)
                TPS_TRY(tps_lc_src_piece(C, rt, sc, 1, lo, lo + Irb, 0));
            else
                TPS_TRY(tps_lc_src_piece_stride(C, rt, sc, 1, lo, lo + Irb,
                                                (uint64_t)h * Irb * rowb, Irb * rowb, 1));
        }
    }
    C->used[sc] = 1;
    return TPS_OK;
}

static tps_err place_stacked(cstate *C, const tps_lexperts *x, const char *module)
{
    tps_layout *L = C->L;
    const tps_ckpt *ck = C->ck;
    const char *lname = L->spec->name;
    int present;
    uint64_t E = tps_lc_config_count(ck->config, x->count, &present);
    uint64_t I = x->rows ? tps_lc_config_count(ck->config, x->rows, &present) : 0;
    uint64_t H = tps_lc_config_count(ck->config, "hidden_size", &present);
    uint64_t tp = (uint64_t)C->tp;
    if (!E || !I || !H) {
        refuse(C, "layout %s stacks the experts of '%s', but config.json lacks a usable %s, %s "
                  "or hidden_size", lname, module, x->count, x->rows ? x->rows : "rows");
        return TPS_OK;
    }
    if (L->ep ? E % tp : I % tp) {
        char works[300];
        tps_lc_works_list(works, sizeof works, L->ep ? E : I, 0, tps_lc_ok_divides);
        refuse(C, "%s = %llu is not divisible by tp %d (layout %s %s; tp values that work: %s%s)",
               L->ep ? x->count : x->rows, (unsigned long long)(L->ep ? E : I), C->tp, lname,
               L->ep ? "holds whole experts on each rank" : "splits every expert evenly", works,
               L->pad_mode && !L->ep ? "; --pad-intermediate does not pad experts held in 3-D "
                                       "tensors"
                                     : "");
        return TPS_OK;
    }
    if (L->q && L->q->m == &tps_qm_mxfp4) { /* gpt-oss's MXFP4 experts: blocks, scales, bias */
        TPS_TRY(tps_lc_mxfp4_experts(C, x, module, E, I, H));
        return C->why[0] ? TPS_OK : module_all_used(C, module);
    }
    uint64_t Er = L->ep ? E / tp : E, Ir = L->ep ? I : I / tp;
    for (size_t si = 0; si < x->nstacks; si++) {
        const tps_lstack *st = &x->stacks[si];
        if (st->bias_part && !st->transposed) {
            refuse(C, "layout %s: stack '%s' of the experts of '%s' has a bias, which it writes "
                      "for MXFP4 experts only", lname, st->name, module);
            return TPS_OK;
        }
        if (st->transposed) { /* gpt-oss's BF16 experts */
            if (L->q) {
                refuse(C, "layout %s: the experts of '%s' are transposed per expert, which it "
                          "writes unquantized or MXFP4 only", lname, module);
                return TPS_OK;
            }
            TPS_TRY(tps_lc_transposed_experts(C, x, module, E, I, H));
            return C->why[0] ? TPS_OK : module_all_used(C, module);
        }
        char *sn = tps_asprintf("%s.%s", module, st->parts[0]);
        int t = sn ? tps_ckpt_find(ck, sn) : -1;
        if (!sn) return nomem(C);
        if (t < 0) {
            refuse(C, "layout %s stacks the experts of '%s', but the checkpoint lacks '%s'", lname,
                   module, sn);
            free(sn);
            return TPS_OK;
        }
        free(sn);
        const tps_ctensor *ct = &ck->t[t];
        uint64_t want1 = st->dim ? H : (uint64_t)st->halves * I, want2 = st->dim ? I : H;
        if (ct->ndim != 3 || ct->shape[0] != E || ct->shape[1] != want1 || ct->shape[2] != want2) {
            refuse(C, "tensor '%s' is %d-D [%llu, %llu, %llu], but config.json's %s = %llu, "
                      "%s = %llu and hidden_size = %llu make it [%llu, %llu, %llu]: the checkpoint "
                      "does not match its config.json",
                   ct->name, ct->ndim, (unsigned long long)(ct->ndim > 0 ? ct->shape[0] : 0),
                   (unsigned long long)(ct->ndim > 1 ? ct->shape[1] : 0),
                   (unsigned long long)(ct->ndim > 2 ? ct->shape[2] : 0), x->count,
                   (unsigned long long)E, x->rows, (unsigned long long)I, (unsigned long long)H,
                   (unsigned long long)E, (unsigned long long)want1, (unsigned long long)want2);
            return TPS_OK;
        }
        /* block FP8: the scales [E, rows / bn, cols / bk] follow the rank's rows
         * (w13: each half's) or columns (w2) in whole blocks */
        int sc = -1;
        if (L->q && L->q->role[t] != TPS_QR_PLAIN) {
            const tps_quant *q = L->q;
            sc = q->role[t] == TPS_QR_WEIGHT ? q->partner[t] : -1;
            if (sc < 0 || q->kind[sc] != TPS_QS_BLOCK || q->input[t] >= 0) {
                refuse(C, "tensor '%s' is quantized other than in FP8 blocks: layout %s stacks "
                          "experts held in 3-D tensors unquantized or block FP8 only",
                       ct->name, lname);
                return TPS_OK;
            }
            uint64_t b = st->dim ? q->bk : q->bn;
            if (!L->ep && Ir % b) {
                char works[300];
                tps_lc_works_list(works, sizeof works, I, b, whole_blocks);
                refuse(C, "the experts of '%s' are FP8 in blocks of %llu x %llu: at tp %d each rank "
                          "would hold %llu of their %llu %s, not whole blocks, which vLLM "
                          "refines or refuses; tpshard does not write %s's refined grid for "
                          "experts held in 3-D tensors (tp values that work: %s)",
                       module, (unsigned long long)q->bn, (unsigned long long)q->bk, C->tp,
                       (unsigned long long)Ir, (unsigned long long)I,
                       st->dim ? "columns" : "rows", lname, works);
                return TPS_OK;
            }
            if (C->ck->t[sc].dtype != TPS_F32 && L->spec->scale_f32) {
                refuse(C, "scale '%s' is %s: layout %s holds expert scales in F32, and a 3-D "
                          "expert scale's rank pieces are not widened (only F32 ones are split)",
                       C->ck->t[sc].name, tps_dtype_name(C->ck->t[sc].dtype), lname);
                return TPS_OK;
            }
        }
        char *name = tps_lc_own_name(C, x->into ? tps_asprintf("%s.%s.%s", module, x->into, st->name)
                                                : tps_asprintf("%s.%s", module, st->name));
        if (!name) return nomem(C);
        size_t es = tps_dtype_bits(ct->dtype) / 8;
        for (int r = 0; r < C->tp; r++) {
            uint64_t shape[3] = {Er, st->dim ? H : (uint64_t)st->halves * Ir, st->dim ? Ir : H};
            tps_rtensor *rt;
            TPS_TRY(tps_lc_new_rt(C, name, r, ct->dtype, 3, shape, "experts", &rt));
            if (L->ep) {
                TPS_TRY(tps_lc_src_piece(C, rt, (size_t)t, 0, (uint64_t)r * Er,
                                         (uint64_t)(r + 1) * Er, 0));
                continue;
            }
            if (st->dim) { /* the rank's columns of every expert: one run */
                TPS_TRY(tps_lc_src_piece(C, rt, (size_t)t, 2, (uint64_t)r * Ir,
                                         (uint64_t)(r + 1) * Ir, 0));
                continue;
            }
            for (int h = 0; h < st->halves; h++) {
                uint64_t lo = (uint64_t)h * I + (uint64_t)r * Ir;
                if (st->halves == 1)
                    TPS_TRY(tps_lc_src_piece(C, rt, (size_t)t, 1, lo, lo + Ir, 0));
                else
                    TPS_TRY(tps_lc_src_piece_stride(C, rt, (size_t)t, 1, lo, lo + Ir,
                                                    (uint64_t)h * Ir * H * es, Ir * H * es, 1));
            }
        }
        C->used[t] = 1;
        if (sc >= 0) TPS_TRY(stacked_scales(C, x, module, st, (size_t)sc, E, I, Er, Ir));
        if (C->why[0]) return TPS_OK;
    }
    return module_all_used(C, module);
}

/* Stacks the experts of every module the layout's experts entries match;
 * the routers they rename. */
tps_err tps_lc_compile_experts(cstate *C)
{
    const tps_lspec *s = C->L->spec;
    const tps_ckpt *ck = C->ck;
    int any = 0;
    for (size_t xi = 0; xi < s->nexperts && !C->why[0]; xi++) {
        const tps_lexperts *x = &s->experts[xi];
        if (!tps_lc_type_listed(x->model_types, x->nmt, ck->config)) continue;
        if (x->stacked) {
            /* <module>.<part>: the module is the name but its last component */
            for (size_t i = 0; i < ck->n && !C->why[0]; i++) {
                size_t ml;
                if (C->used[i] || !tps_lc_module_of(ck->t[i].name, &ml)) continue;
                const char *dot = memrchr(ck->t[i].name, '.', strlen(ck->t[i].name));
                size_t pl = dot ? (size_t)(dot - ck->t[i].name) : 0;
                int hit = 0;
                for (size_t k = 0; k < x->npat && !hit; k++)
                    hit = tps_module_match(x->patterns[k], ck->t[i].name, pl);
                if (!hit) continue;
                char *module = tps_xmalloc(pl + 1);
                if (!module) return nomem(C);
                memcpy(module, ck->t[i].name, pl);
                module[pl] = 0;
                any = 1;
                tps_err rc = place_stacked(C, x, module);
                free(module);
                TPS_TRY(rc);
            }
            continue;
        }
        for (size_t i = 0; i < ck->n && !C->why[0];) {
            size_t ml, ll;
            uint64_t e;
            const char *leaf;
            if (C->used[i] || !expert_name(x, ck->t[i].name, &ml, &e, &leaf, &ll)) {
                i++;
                continue;
            }
            /* names sort: every tensor under <module>. follows */
            size_t b = i + 1;
            while (b < ck->n && !strncmp(ck->t[b].name, ck->t[i].name, ml + 1)) b++;
            char *module = tps_xmalloc(ml + 1);
            if (!module) return nomem(C);
            memcpy(module, ck->t[i].name, ml);
            module[ml] = 0;
            any = 1;
            tps_err rc = place_experts(C, x, module, i, b);
            if (!rc && !C->why[0] && x->router) {
                const char *dot = strrchr(module, '.');
                size_t pl = dot ? (size_t)(dot - module) : 0;
                char *rn = tps_asprintf("%.*s%s%s.weight", (int)pl, module, pl ? "." : "", x->router);
                char *as = tps_asprintf("%.*s%s%s.weight", (int)pl, module, pl ? "." : "", x->router_as);
                int ri = rn ? tps_ckpt_find(ck, rn) : -1;
                if (!rn || !as) {
                    rc = nomem(C);
                } else if (ri < 0) {
                    refuse(C, "layout %s stacks the experts of '%s', but the checkpoint lacks their "
                              "router '%s'",
                           s->name, module, rn);
                } else if (!C->used[ri]) {
                    char *owned = tps_lc_own_name(C, as);
                    as = NULL;
                    rc = owned ? tps_lc_place_simple(C, (size_t)ri, owned, TPS_SPLIT_REPLICATE,
                                                     "router")
                               : nomem(C);
                }
                free(rn);
                free(as);
            }
            free(module);
            TPS_TRY(rc);
            i = b;
        }
    }
    if (C->L->ep && !any && !C->why[0])
        refuse(C, "--ep holds every expert whole on one rank, but layout %s finds no experts in "
                  "this checkpoint",
               s->name);
    return TPS_OK;
}

/* --ep holds experts whole, which only the serving layouts do: 0 and a
 * refusal for the DTensor layout. */
int tps_lc_ep_served(cstate *C)
{
    if (C->L->ep && !C->L->spec) {
        refuse(C, "--ep (expert parallelism) is for the serving layouts (--layout vllm or "
                  "sglang); the DTensor layout splits experts as the plan says");
        return 0;
    }
    return 1;
}
