/* layout_fuse.c - fused projections: a layout file's fuse entries
 * (q/k/v into qkv_proj, gate/up into gate_up_proj) found in the checkpoint,
 * each part split on whole heads or evenly and the ranks' parts
 * concatenated, or (split: replicate, DeepSeek's fused_qkv_a_proj) every
 * part whole on every rank; the parts as sections of one packed tensor of the plan
 * (Phi-3's qkv_proj); whether the engine's fused module has a bias for this
 * config (the fuse-bias conditions). Scales of fused weights are in
 * layout_scales.c, the engine's extra entries beside a fused module in
 * layout_vocab.c. */
#include "layout_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int ok_heads_rep(uint64_t n, uint64_t unused, int tp)
{
    (void)unused;
    return n % (uint64_t)tp == 0 || (n < (uint64_t)tp && (uint64_t)tp % n == 0);
}

/* Does the engine's fused module of f have a bias for this config? The
 * config settings that would give it one, when it has none, in hint. */
static int fused_bias(const tps_lfuse *f, const cJSON *config, char *hint, size_t len)
{
    hint[0] = 0;
    if (!f->has_bias) return 1;
    for (size_t k = 0; k < f->nbias; k++) {
        const tps_lbias *b = &f->bias[k];
        if (!tps_lc_type_listed(b->model_types, b->nmt, config)) continue;
        if (b->unless && tps_cond_eval(b->unless, config)) continue;
        if (!b->when || tps_cond_eval(b->when, config)) return 1;
        tps_lc_enable_hint(hint, len, b->when);
    }
    return 0;
}

/* Part j of fused group f (source tensor idx[j], nrows[j] rows): of part
 * 0's dtype and dims after the first, split by rows, its rows splitting at
 * tp on whole heads (their count in *heads) or evenly (*heads 0). 0 and a
 * refusal when not. */
static int fused_part(cstate *C, const tps_lfuse *f, const char *parent, const char *param,
                      const size_t *idx, const uint64_t *nrows, size_t j, uint64_t *heads,
                      const tps_layers *ly)
{
    tps_layout *L = C->L;
    const tps_ckpt *ck = C->ck;
    const tps_ctensor *t0 = &ck->t[idx[0]];
    char works[300];
    const tps_ctensor *t = &ck->t[idx[j]];
    const tps_lpart *p = &f->parts[j];
    int same = t->dtype == t0->dtype && t->ndim == t0->ndim && t->ndim >= 1;
    for (int d = 1; same && d < t->ndim; d++) same = t->shape[d] == t0->shape[d];
    if (!same) {
        refuse(C, "layout %s fuses %s.{...}.%s into %s.%s.%s, but '%s' (%s, %d-D) does not "
                  "match '%s' (%s, %d-D) in dtype or in its dims after the first",
               L->spec->name, parent, param, parent, f->into, param, t->name,
               tps_dtype_name(t->dtype), t->ndim, t0->name, tps_dtype_name(t0->dtype), t0->ndim);
        return 0;
    }
    const char *why = NULL;
    tps_split_kind sk = tps_lc_spec_split(L, idx[j], &why);
    if (sk == TPS_SPLIT_REFUSE) {
        refuse(C, "tensor '%s': %s (layout %s)", t->name, why, L->spec->name);
        return 0;
    }
    if (f->whole) { /* every rank holds the whole part, whatever the plan's style */
        *heads = 0;
        return 1;
    }
    if (sk != TPS_SPLIT_ROWS) {
        refuse(C, "layout %s fuses '%s' into %s.%s, but the plan does not split it by rows "
                  "(style %s)",
               L->spec->name, t->name, parent, f->into, tps_style_name(L->p[idx[j]].style));
        return 0;
    }
    uint64_t rows = nrows[j];
    if (p->heads) {
        int present;
        uint64_t h = tps_lc_config_count(ck->config, p->heads, &present);
        /* a layer's own count (Gemma 4's per_layer_config, global KV heads) */
        char lname[160] = "";
        int layer = tps_layer_of_name(t->name);
        const char *from = NULL;
        const cJSON *lv = layer >= 0 && layer < ly->n ? tps_layers_get(ly, layer, p->heads, &from)
                                                      : NULL;
        if (lv && from && strcmp(from, p->heads)) {
            present = 1;
            h = cJSON_IsNumber(lv) && lv->valuedouble >= 1 && lv->valuedouble <= 1e15 &&
                        lv->valuedouble == floor(lv->valuedouble)
                    ? (uint64_t)lv->valuedouble
                    : 0;
            snprintf(lname, sizeof lname, " (layer %d, from %s)", layer, from);
        }
        if (!ck->config || !h) {
            char *lack = present ? NULL : tps_config_lacks(p->heads);
            refuse(C, "layout %s splits '%s' on whole heads, but config.json %s%s",
                   L->spec->name, t->name, present ? "has no usable count in " : "",
                   present ? p->heads : lack ? lack : "lacks it");
            free(lack);
            return 0;
        }
        if (rows % h) {
            refuse(C, "tensor '%s' has %llu rows, not a whole number of its %llu heads (%s%s)",
                   t->name, (unsigned long long)rows, (unsigned long long)h, p->heads, lname);
            return 0;
        }
        /* Layers of their own sizes (Gemma 4): each part holds its layer's heads
         * of its layer's head size, or config.json does not describe it. */
        const char *dfrom = NULL;
        const cJSON *hd =
            layer >= 0 && layer < ly->n ? tps_layers_get(ly, layer, "head_dim", &dfrom) : NULL;
        if ((tps_layers_vary(ly, "head_dim") || tps_layers_vary(ly, "num_key_value_heads")) &&
            cJSON_IsNumber(hd) && hd->valuedouble >= 1 && hd->valuedouble <= 1e9 &&
            rows != h * (uint64_t)hd->valuedouble) {
            refuse(C, "tensor '%s' has %llu rows, but layer %d has %s = %llu%s heads of head_dim "
                      "= %llu%s%s%s (%llu rows): the checkpoint does not match its config.json",
                   t->name, (unsigned long long)rows, layer, p->heads, (unsigned long long)h,
                   lname, (unsigned long long)hd->valuedouble, dfrom ? " (from " : "",
                   dfrom ? dfrom : "", dfrom ? ")" : "",
                   (unsigned long long)(h * (uint64_t)hd->valuedouble));
            return 0;
        }
        int ok = h % (uint64_t)C->tp == 0 ||
                 (p->replicate && h < (uint64_t)C->tp && (uint64_t)C->tp % h == 0);
        if (!ok) {
            tps_lc_works_list(works, sizeof works, h, 0,
                              p->replicate ? ok_heads_rep : tps_lc_ok_divides);
            if (p->replicate)
                refuse(C, "%s%s = %llu: tp %d neither divides it nor is a multiple of it (layout "
                          "%s splits '%s' into whole heads, each on tp / %s ranks when there "
                          "are fewer than ranks; tp values that work: %s)",
                       p->heads, lname, (unsigned long long)h, C->tp, L->spec->name, t->name,
                       p->heads, works);
            else
                refuse(C, "%s%s = %llu is not divisible by tp %d (layout %s splits '%s' into "
                          "whole heads; tp values that work: %s)",
                       p->heads, lname, (unsigned long long)h, C->tp, L->spec->name, t->name,
                       works);
            return 0;
        }
        *heads = h;
    } else {
        if (L->spec->exact && rows % (uint64_t)C->tp) {
            tps_lc_works_list(works, sizeof works, rows, 0, tps_lc_ok_divides);
            if (p->rows)
                refuse(C, "%s = %llu is not divisible by tp %d (layout %s splits '%s' evenly; "
                          "tp values that work: %s)",
                       p->rows, (unsigned long long)rows, C->tp, L->spec->name, t->name, works);
            else
                refuse(C, "tensor '%s': %llu rows do not divide by tp %d (layout %s splits "
                          "them evenly; tp values that work: %s)",
                       t->name, (unsigned long long)rows, C->tp, L->spec->name, works);
            return 0;
        }
        *heads = 0;
    }
    return 1;
}

/* Quantized parts: all of them, with scales of one kind, fused alike
 * (*quant 1); the fused scale's name in *scale_name, the fused input
 * scale's (when the parts have them) in *input_name. A refusal in C->why
 * when only some parts are quantized, the kinds differ or the tensor is
 * packed. */
static tps_err fused_quant(cstate *C, const tps_lfuse *f, const char *parent, const size_t *idx,
                           int *quant, const char **scale_name, const char **input_name)
{
    tps_layout *L = C->L;
    const tps_ckpt *ck = C->ck;
    if (!L->q) return TPS_OK;
    size_t nq = 0, ni = 0;
    for (size_t j = 0; j < f->nparts; j++) {
        nq += L->q->role[idx[j]] == TPS_QR_WEIGHT;
        ni += L->q->role[idx[j]] == TPS_QR_WEIGHT && L->q->input[idx[j]] >= 0;
    }
    if (nq && (nq != f->nparts || (ni && ni != f->nparts))) {
        refuse(C, "layout %s fuses %s.%s, but only some of its parts are quantized (or have "
                  "input scales): not supported",
               L->spec->name, parent, f->into);
        return TPS_OK;
    }
    for (size_t j = 1; nq && j < f->nparts; j++)
        if (L->q->kind[L->q->partner[idx[j]]] != L->q->kind[L->q->partner[idx[0]]]) {
            refuse(C, "layout %s fuses %s.%s, but its parts' scales are of different kinds",
                   L->spec->name, parent, f->into);
            return TPS_OK;
        }
    if (nq && f->nparts > 1 && idx[0] == idx[f->nparts - 1]) {
        refuse(C, "tensor '%s' is quantized and packed: not supported yet", ck->t[idx[0]].name);
        return TPS_OK;
    }
    if (nq) {
        *quant = 1;
        const char *sn = ck->t[L->q->partner[idx[0]]].name;
        size_t pl = strlen(ck->t[idx[0]].name) - strlen("weight");
        *scale_name = tps_lc_own_name(C, tps_asprintf("%s.%s.%s", parent, f->into, sn + pl));
        if (!*scale_name) return nomem(C);
        if (ni) {
            *input_name = tps_lc_own_name(C, tps_asprintf("%s.%s.input_scale", parent, f->into));
            if (!*input_name) return nomem(C);
        }
    }
    return TPS_OK;
}

/* One fused group: parent.<part>.<param> for every part, written as
 * parent.<into>.<param>. idx[j] is part j's source tensor. */
static tps_err place_fused(cstate *C, const tps_lfuse *f, const char *parent, const char *param,
                           const size_t *idx, const uint64_t *base, const uint64_t *nrows,
                           const tps_layers *ly)
{
    tps_layout *L = C->L;
    const tps_ckpt *ck = C->ck;
    const tps_ctensor *t0 = &ck->t[idx[0]];
    uint64_t heads[16], pn[16];
    /* --pad-intermediate: the MLP's parts padded (zero rows after the real ones) */
    for (size_t j = 0; j < f->nparts && j < 16; j++)
        pn[j] = f->parts[j].rows && L->pad_field && !strcmp(f->parts[j].rows, L->pad_field) &&
                        !base[j] && nrows[j] == L->pad_from && L->pad_to > L->pad_from
                    ? L->pad_to
                    : nrows[j];
    for (size_t j = 0; j < f->nparts; j++)
        if (!fused_part(C, f, parent, param, idx, pn, j, &heads[j], ly)) return TPS_OK;
    char *name = tps_lc_own_name(C, tps_asprintf("%s.%s.%s", parent, f->into, param));
    if (!name) return nomem(C);
    uint64_t rowb = tps_lc_inner_bits(t0, 0) / 8;
    /* Quantized parts: all of them, with scales of one kind, fused alike. */
    int quant = 0;
    const char *scale_name = NULL, *input_name = NULL;
    TPS_TRY(fused_quant(C, f, parent, idx, &quant, &scale_name, &input_name));
    if (C->why[0]) return TPS_OK;
    for (int r = 0; r < C->tp; r++) {
        uint64_t lo[16], len[16], total = 0;
        for (size_t j = 0; j < f->nparts; j++) {
            /* checked above: every part splits at this tp */
            if (f->whole) {
                lo[j] = 0;
                len[j] = nrows[j];
            } else {
                tps_lc_part_rows(pn[j], heads[j], f->parts[j].replicate, C->tp, r,
                                 L->spec->exact, &lo[j], &len[j]);
            }
            total += len[j];
        }
        uint64_t shape[TPS_MAX_DIMS];
        tps_shape_get(shape, t0);
        shape[0] = total;
        tps_rtensor *rt;
        TPS_TRY(tps_lc_new_rt(C, name, r, t0->dtype, t0->ndim, shape, f->into, &rt));
        uint64_t at = 0;
        for (size_t j = 0; j < f->nparts; j++) {
            /* the real rows, then the padding's zeros */
            uint64_t rl = lo[j] >= nrows[j] ? 0 : lo[j] + len[j] <= nrows[j] ? len[j] : nrows[j] - lo[j];
            if (rl || len[j] == 0)
                TPS_TRY(tps_lc_src_piece(C, rt, idx[j], 0, base[j] + lo[j], base[j] + lo[j] + rl, at));
            if (len[j] > rl) {
                TPS_TRY(tps_lc_add_piece(C, rt, (tps_lpiece){.kind = TPS_PK_ZERO, .at = at + rl * rowb,
                                                             .nbytes = (len[j] - rl) * rowb}));
                L->pad_used = 1;
            }
            at += len[j] * rowb;
        }
        if (quant) TPS_TRY(tps_lc_place_fused_scales(C, f, idx, r, lo, len, heads, nrows,
                                                     scale_name, input_name));
        if (C->why[0]) return TPS_OK;
    }
    /* The engine's own entries beside the fused module (once, with the weight). */
    if (strcmp(param, "weight")) return TPS_OK;
    return tps_lc_place_extras(C, f, parent);
}

/* The sections of a packed tensor of the plan, by row: their offsets and
 * counts from config.json. 0 with C->why set when they do not add up to the
 * tensor's rows. */
static int packed_rows(cstate *C, const tps_packed *k, size_t i, uint64_t *base, uint64_t *rows)
{
    const tps_ctensor *t = &C->ck->t[i];
    uint64_t at = 0;
    char why[256], list[512];
    size_t o = 0;
    list[0] = 0;
    for (size_t j = 0; j < k->nsec; j++) {
        if (tps_expr_eval(k->sec[j].rows, C->ck->config, &rows[j], why, sizeof why)) {
            refuse(C, "tensor '%s' packs %s, whose rows (%s) config.json cannot give: %s",
                   t->name, k->sec[j].name, k->sec[j].rows, why);
            return 0;
        }
        base[j] = at;
        at += rows[j];
        if (o < sizeof list)
            o += (size_t)snprintf(list + o, sizeof list - o, "%s%s %llu (%s)", j ? " + " : "",
                                  k->sec[j].name, (unsigned long long)rows[j], k->sec[j].rows);
    }
    if (t->ndim < 1 || at != t->shape[0]) {
        refuse(C, "tensor '%s' has %llu rows, but the plan packs %s = %llu rows into it: the "
                  "checkpoint does not match its config.json",
               t->name, t->ndim ? (unsigned long long)t->shape[0] : 0ULL, list,
               (unsigned long long)at);
        return 0;
    }
    return 1;
}

/* Fusion f's parts as sections of one packed tensor parent.X.param of the
 * plan (each part a section by name), if there is one. */
static tps_err packed_parts(cstate *C, const tps_lfuse *f, const char *parent, const char *param,
                            size_t *idx, uint64_t *base, uint64_t *nrows, int *found)
{
    const tps_ckpt *ck = C->ck;
    const tps_plan *plan = C->L->plan;
    *found = 0;
    for (size_t kk = 0; plan && kk < plan->npacked; kk++) {
        const tps_packed *k = &plan->packed[kk];
        /* a tensor parent.<leaf>.param matching the rule */
        for (size_t i = 0; i < ck->n; i++) {
            const char *nm = ck->t[i].name;
            size_t pl = strlen(parent), ml;
            if (strncmp(nm, parent, pl) || nm[pl] != '.' || !tps_lc_module_of(nm, &ml) ||
                strcmp(nm + ml + 1, param) || memchr(nm + pl + 1, '.', ml - pl - 1) ||
                tps_plan_packed(plan, nm) != k)
                continue;
            uint64_t sb[16], sr[16];
            if (!packed_rows(C, k, i, sb, sr)) return TPS_OK;
            size_t hit = 0;
            for (size_t j = 0; j < f->nparts; j++)
                for (size_t q = 0; q < k->nsec; q++)
                    if (!strcmp(k->sec[q].name, f->parts[j].module)) {
                        idx[j] = i;
                        base[j] = sb[q];
                        nrows[j] = sr[q];
                        hit++;
                    }
            if (hit == f->nparts) {
                *found = 1;
                return TPS_OK;
            }
        }
    }
    return TPS_OK;
}

/* A weight of a plan's shapes entry must have the rows and columns its
 * expressions give: 0 and a refusal when it does not, or when config.json
 * cannot give them. Only .weight is checked: a quantized method's other
 * tensors (scales, packed codes) have shapes of their own. */
static int shape_fits(cstate *C, size_t i)
{
    const tps_ctensor *t = &C->ck->t[i];
    const tps_shape *k = tps_plan_shape(C->L->plan, t->name);
    const char *dot = strrchr(t->name, '.');
    if (!k || !dot || strcmp(dot + 1, "weight")) return 1;
    const char *expr[2] = {k->rows, k->cols}, *what[2] = {"rows", "columns"};
    for (int d = 0; d < 2; d++) {
        if (!expr[d]) continue;
        uint64_t want;
        char why[256];
        if (tps_expr_eval(expr[d], C->ck->config, &want, why, sizeof why)) {
            refuse(C, "tensor '%s': its %s (%s) config.json cannot give: %s", t->name, what[d],
                   expr[d], why);
            return 0;
        }
        if (t->ndim != 2 || t->shape[d] != want) {
            if (t->ndim != 2)
                refuse(C, "tensor '%s' is %d-D, but the plan gives it %s %s = %llu: the "
                          "checkpoint does not match its config.json",
                       t->name, t->ndim, what[d], expr[d], (unsigned long long)want);
            else
                refuse(C, "tensor '%s' has %llu %s, but the plan gives it %s = %llu: the "
                          "checkpoint does not match its config.json",
                       t->name, (unsigned long long)t->shape[d], what[d], expr[d],
                       (unsigned long long)want);
            return 0;
        }
    }
    return 1;
}

/* Every tensor's layer is below the sum of the plan's layers fields (the
 * first one present in config.json, or nothing is checked): 0 and a refusal
 * naming the tensor and the fields when one is not. */
static int layers_fit(cstate *C)
{
    const tps_plan *p = C->L->plan;
    const tps_ckpt *ck = C->ck;
    if (!p || !p->nlayers || !ck->config) return 1;
    int present;
    uint64_t sum = tps_lc_config_count(ck->config, p->layers[0], &present);
    if (!present) return 1;
    char list[512];
    size_t o = 0;
    list[0] = 0;
    for (size_t j = 0; j < p->nlayers; j++) {
        int pj;
        uint64_t n = tps_lc_config_count(ck->config, p->layers[j], &pj);
        if (j) sum += n;
        if (o < sizeof list)
            o += (size_t)snprintf(list + o, sizeof list - o, "%s%s = %llu%s",
                                  !j ? "" : j + 1 < p->nlayers ? ", " : " and ", p->layers[j],
                                  (unsigned long long)n, pj ? "" : " (not set)");
    }
    for (size_t i = 0; i < ck->n; i++) {
        int layer = tps_layer_of_name(ck->t[i].name);
        if (layer >= 0 && (uint64_t)layer >= sum) {
            refuse(C, "tensor '%s' is in layer %d, but config.json's %s leave no such layer "
                      "(plan %s): the checkpoint does not match its config.json",
                   ck->t[i].name, layer, list, p->name);
            return 0;
        }
    }
    return 1;
}

/* Packed tensors must hold the rows their config says (any layout): 0 and
 * a refusal when one does not. */
int tps_lc_packed_fit(cstate *C)
{
    const tps_layout *L = C->L;
    const tps_ckpt *ck = C->ck;
    for (size_t i = 0; L->plan && i < ck->n && ck->config; i++) {
        const tps_packed *k = tps_plan_packed(L->plan, ck->t[i].name);
        uint64_t b[16], r[16];
        if (k && !packed_rows(C, k, i, b, r)) return 0;
    }
    for (size_t i = 0; L->plan && i < ck->n && ck->config; i++)
        if (!shape_fits(C, i)) return 0;
    return layers_fit(C);
}

/* Finds fused groups: for each tensor that is the first part of a fusion,
 * its siblings. */
static tps_err compile_fused(cstate *C, const tps_layers *ly);

tps_err tps_lc_compile_fused(cstate *C)
{
    const tps_ckpt *ck = C->ck;
    /* the layers' own head counts (config.json was read and checked when the
     * layout was made: this reads it again) */
    tps_layers ly = {0};
    tps_err rc = tps_layers_open(C->ctx, ck->config, "config.json", &ly);
    if (!rc) rc = compile_fused(C, &ly);
    tps_layers_close(&ly);
    return rc;
}

/* Part j of f stands in by its `or` sibling in this tensor's layer: 1 when
 * the layer is one where the engine loads the sibling's rows into it. */
static int part_or(cstate *C, const tps_lpart *p, const tps_layers *ly, const char *name)
{
    if (!p->or_module) return 0;
    if (p->or_when && !tps_cond_eval(p->or_when, C->ck->config)) return 0;
    if (!p->or_layer_type) return 1;
    const char *t = tps_layers_type(ly, tps_layer_of_name(name));
    return t && !strcmp(t, p->or_layer_type);
}

static tps_err compile_fused(cstate *C, const tps_layers *ly)
{
    const tps_lspec *s = C->L->spec;
    const tps_ckpt *ck = C->ck;
    for (size_t fi = 0; fi < s->nfuse; fi++) {
        const tps_lfuse *f = &s->fuse[fi];
        if (!tps_lfuse_applies(f, ck->config)) continue;
        for (size_t i = 0; i < ck->n; i++) {
            const char *nm = ck->t[i].name;
            size_t ml;
            if (C->used[i] || !tps_lc_module_of(nm, &ml)) continue;
            uint64_t first;
            if (f->only_last &&
                !tps_lc_last_layers(ck->config, f->only_last, tps_layer_of_name(nm), &first))
                continue;
            if (f->except_last &&
                tps_lc_last_layers(ck->config, f->except_last, tps_layer_of_name(nm), &first))
                continue;
            const char *param = nm + ml + 1;
            /* scales go with their weights (place_fused) */
            if (strcmp(param, "weight") && strcmp(param, "bias")) continue;
            /* parent.<part>.param for each part: is nm one of them? */
            size_t which = f->nparts;
            size_t pl = 0;
            for (size_t j = 0; j < f->nparts && which == f->nparts; j++) {
                size_t lp = strlen(f->parts[j].module);
                if (ml > lp && nm[ml - lp - 1] == '.' && !memcmp(nm + ml - lp, f->parts[j].module, lp)) {
                    which = j;
                    pl = ml - lp - 1;
                }
            }
            const tps_packed *pk = which == f->nparts ? tps_plan_packed(C->L->plan, nm) : NULL;
            if (pk) { /* a packed tensor whose sections are f's parts (Phi-3's qkv_proj) */
                size_t hit = 0;
                for (size_t j = 0; j < f->nparts; j++)
                    for (size_t q = 0; q < pk->nsec; q++) hit += !strcmp(pk->sec[q].name, f->parts[j].module);
                if (hit == f->nparts) {
                    const char *dot = memrchr(nm, '.', ml);
                    if (dot) {
                        which = 0;
                        pl = (size_t)(dot - nm);
                    }
                }
            }
            if (which == f->nparts) continue;
            char *parent = tps_xmalloc(pl + 1);
            if (!parent) return nomem(C);
            memcpy(parent, nm, pl);
            parent[pl] = 0;
            char hint[256];
            int has_bias = fused_bias(f, ck->config, hint, sizeof hint);
            if (!has_bias && !strcmp(param, "bias")) {
                const cJSON *mt = tps_config_get(ck->config, "model_type");
                refuse(C, "tensor '%s': layout %s would fuse it into %s.%s.bias, but %s's model "
                          "(model_type %s) builds %s.%s without a bias%s%s%s",
                       nm, s->name, parent, f->into, s->target,
                       cJSON_IsString(mt) ? mt->valuestring : "not given", parent, f->into,
                       hint[0] ? ", so its loader would refuse the key: set " : ", whatever "
                       "config.json says, so its loader would refuse the key (--layout dtensor "
                       "keeps every tensor)", hint, hint[0] ? " in config.json if the model uses it" : "");
                free(parent);
                return TPS_OK;
            }
            size_t idx[16] = {0};
            char missing[256] = "";
            for (size_t j = 0; j < f->nparts; j++) {
                const tps_lpart *pj = &f->parts[j];
                int stand_in = part_or(C, pj, ly, nm);
                char *want = tps_asprintf("%s.%s.%s", parent, pj->module, param);
                int k = want ? tps_ckpt_find(ck, want) : -1;
                if (!want) {
                    free(parent);
                    return nomem(C);
                }
                if (stand_in && k >= 0) {
                    char cond[160] = "";
                    if (pj->or_when) tps_lc_enable_hint(cond, sizeof cond, pj->or_when);
                    refuse(C, "tensor '%s': on this layer (%s%s%s) %s loads %s.%s.%s into the "
                              "%s rows of %s.%s and has no place for it: remove it from the "
                              "checkpoint, or check config.json",
                           want, pj->or_layer_type ? pj->or_layer_type : "any layer type",
                           cond[0] ? ", config.json's " : "", cond, s->target, parent,
                           pj->or_module, param, pj->module, parent, f->into);
                    free(want);
                    free(parent);
                    return TPS_OK;
                }
                if (stand_in) { /* the sibling's rows, loaded twice */
                    free(want);
                    want = tps_asprintf("%s.%s.%s", parent, pj->or_module, param);
                    k = want ? tps_ckpt_find(ck, want) : -1;
                    if (!want) {
                        free(parent);
                        return nomem(C);
                    }
                }
                if (k < 0 && !missing[0]) snprintf(missing, sizeof missing, "%s", want);
                idx[j] = k < 0 ? 0 : (size_t)k;
                free(want);
            }
            uint64_t base[16] = {0}, nrows[16] = {0};
            for (size_t j = 0; j < f->nparts && !missing[0]; j++) nrows[j] = ck->t[idx[j]].shape[0];
            if (missing[0]) {
                /* the parts may be sections of one packed sibling (Phi-3) */
                int found = 0;
                TPS_TRY(packed_parts(C, f, parent, param, idx, base, nrows, &found));
                if (C->why[0]) {
                    free(parent);
                    return TPS_OK;
                }
                if (found) missing[0] = 0;
            }
            if (missing[0]) {
                refuse(C, "layout %s fuses %s.{", s->name, parent);
                size_t o = strlen(C->why);
                for (size_t j = 0; j < f->nparts && o < sizeof C->why; j++)
                    o += (size_t)snprintf(C->why + o, sizeof C->why - o, "%s%s", j ? "," : "",
                                          f->parts[j].module);
                if (o < sizeof C->why)
                    snprintf(C->why + o, sizeof C->why - o,
                             "}.%s into %s.%s.%s, but the checkpoint lacks '%s'", param, parent,
                             f->into, param, missing);
                free(parent);
                return TPS_OK;
            }
            for (size_t j = 0; f->has_bias && has_bias && !strcmp(param, "weight") && j < f->nparts;
                 j++) {
                /* the engine's module has a bias: the files must hold it */
                const char *w = ck->t[idx[j]].name;
                char *bn = tps_asprintf("%.*sbias", (int)(strlen(w) - strlen("weight")), w);
                if (!bn) {
                    free(parent);
                    return nomem(C);
                }
                if (tps_ckpt_find(ck, bn) < 0) {
                    const cJSON *mt = tps_config_get(ck->config, "model_type");
                    refuse(C, "layout %s fuses '%s' into %s.%s, and %s's model (model_type %s) "
                              "builds %s.%s with a bias for this config.json, but the checkpoint "
                              "lacks '%s' (the engine's loader would report the key missing)",
                           s->name, w, parent, f->into, s->target,
                           cJSON_IsString(mt) ? mt->valuestring : "not given", parent, f->into, bn);
                }
                free(bn);
                if (C->why[0]) {
                    free(parent);
                    return TPS_OK;
                }
            }
            tps_err rc = place_fused(C, f, parent, param, idx, base, nrows, ly);
            free(parent);
            TPS_TRY(rc);
            if (C->why[0]) return TPS_OK;
        }
    }
    return TPS_OK;
}
