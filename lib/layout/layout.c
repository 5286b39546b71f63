/* layout.c - plan x checkpoint x tp (x layout file): every rank's tensors and
 * where each of their bytes comes from, validated before a byte is written
 * (plan first, write second). This file holds the IR and its queries:
 * tps_layout_new* places every source tensor as the plan says (style,
 * DTensor dim) and runs the plan's checks (head shapes, the plan fits the
 * model); the built-in layout files; the views split, the manifest, check,
 * merge and verify read (tps_layout_tp, _placement, _local, _rank_tensor...).
 *
 * tps_layout_compile then turns the placements into rank tensors made of
 * pieces: for the DTensor layout one piece per rank tensor (the torch.chunk
 * shard); for a serving layout (a layout file, see tpshard-plan(5)) fused
 * projections, whole KV heads replicated, a padded vocabulary, a tied head,
 * the engine's extra entries. It lives in the other files of lib/layout/,
 * one stage each (layout_int.h has the map). */
#include "layout_int.h"

#include <stdlib.h>
#include <string.h>

/* layouts_gen.c, made by tools/embed.sh from plans/layouts/ */
typedef struct {
    const char *name;
    const char *text;
    size_t len;
} builtin_layout;
extern const builtin_layout tps_builtin_layouts[];
extern const size_t tps_builtin_layouts_n;

/* The parameter of a tensor name: "weight" of "model.embed_tokens.weight". */
const char *tps_lc_param_of(const char *name)
{
    const char *dot = strrchr(name, '.');
    return dot ? dot + 1 : name;
}

/* Which dim a style shards for a parameter; -1 replicated. */
static int style_dim(tps_style s, const char *param)
{
    int is_w = strcmp(param, "weight") == 0, is_b = strcmp(param, "bias") == 0;
    switch (s) {
    case TPS_STYLE_COLWISE: return (is_w || is_b) ? 0 : -1;
    case TPS_STYLE_ROWWISE: return is_w ? 1 : -1;
    case TPS_STYLE_EMBED_ROWWISE: return is_w ? 0 : -1;
    case TPS_STYLE_EMBED_COLWISE: return is_w ? 1 : -1;
    case TPS_STYLE_REPLICATE:
    case TPS_STYLE_SEQPAR: return -1;
    }
    return -1;
}

/* The layer a tensor belongs to: the first all-digit component of its
 * module path ("model.layers.12.self_attn.k_proj.weight": 12), or -1. */
int tps_layer_of_name(const char *name)
{
    const char *end = strrchr(name, '.');
    for (const char *c = name; end && c < end;) {
        const char *d = memchr(c, '.', (size_t)(end - c));
        size_t n = d ? (size_t)(d - c) : (size_t)(end - c);
        int digits = n > 0 && n <= 9;
        long v = 0;
        for (size_t k = 0; digits && k < n; k++) {
            digits = c[k] >= '0' && c[k] <= '9';
            v = v * 10 + (c[k] - '0');
        }
        if (digits) return (int)v;
        if (!d) break;
        c = d + 1;
    }
    return -1;
}

/* What the shape check found: tensors checked, the layers they are in, the
 * first disagreement. */
typedef struct {
    uint64_t tensors;
    int layers_seen, last_layer;
    char *bad;
} head_state;

/* A rule with `heads: FIELD` says its sharded dim holds FIELD heads of
 * head_dim each, in the tensor's own layer: the divisibility checks promise
 * whole heads per rank only if that is so. */
static void head_shape(const tps_layout *L, const tps_layers *ly, size_t i, const tps_rule *r,
                       head_state *hs)
{
    const tps_ctensor *t = &L->ck->t[i];
    int d = L->p[i].dim, layer = tps_layer_of_name(t->name);
    if (hs->bad || layer < 0 || d < 0 || d >= t->ndim) return;
    int64_t heads, kv, hd, cnt;
    const char *from[3], *cfrom;
    tps_layers_geometry(ly, layer, &heads, &kv, &hd, from);
    if (!strcmp(r->heads, "num_attention_heads")) {
        cnt = heads;
        cfrom = from[0];
    } else if (!strcmp(r->heads, "num_key_value_heads")) {
        cnt = kv;
        cfrom = from[1];
    } else {
        const cJSON *v = tps_layers_get(ly, layer, r->heads, &cfrom);
        cnt = cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < 9e15 &&
                      v->valuedouble == (double)(int64_t)v->valuedouble
                  ? (int64_t)v->valuedouble
                  : -1;
    }
    uint64_t want;
    if (cnt < 0 || hd < 0 || tps_mul_ovf((uint64_t)cnt, (uint64_t)hd, &want)) return;
    hs->tensors++;
    if (layer != hs->last_layer) hs->layers_seen++, hs->last_layer = layer;
    uint64_t n = t->shape[d];
    const tps_quant *q = L->q;
    if (q && q->m->weight_suffix && q->role[i] == TPS_QR_WEIGHT) {
        /* a packed weight (NVFP4's X.weight): features, not words, along d */
        int in_axis = q->m->transposed ? 0 : 1;
        for (size_t j = 0; j < q->m->nparts; j++) {
            const tps_qpart *p = &q->m->parts[j];
            if (p->role != TPS_QR_WEIGHT) continue;
            uint64_t pf = (uint64_t)tps_dtype_bits(t->dtype) / (uint64_t)q->bits;
            if ((d == in_axis && p->in_by == 2) || (d != in_axis && p->out_packed)) n *= pf;
        }
    }
    if (n == want) return;
    const char *type = tps_layers_type(ly, layer);
    char tb[96] = "", fb[224] = "";
    if (type) snprintf(tb, sizeof tb, " (%.80s)", type);
    if (cfrom || from[2])
        snprintf(fb, sizeof fb, " (from %s)", cfrom && from[2] && strcmp(cfrom, from[2])
                                                  ? "per-layer fields"
                                                  : cfrom ? cfrom : from[2]);
    else if (tps_config_defaulted(ly->config, r->heads) && hd > 0 && t->shape[d] % (uint64_t)hd == 0)
        snprintf(fb, sizeof fb, " (config.json leaves %s to transformers' default for its "
                 "model type; the tensor holds %llu heads: add \"%s\": %llu to config.json if "
                 "that is what the model has)", r->heads,
                 (unsigned long long)(t->shape[d] / (uint64_t)hd), r->heads,
                 (unsigned long long)(t->shape[d] / (uint64_t)hd));
    else if (tps_config_defaulted(ly->config, r->heads) || tps_config_defaulted(ly->config, "head_dim"))
        snprintf(fb, sizeof fb, " (config.json leaves %s to transformers' default for its "
                 "model type)", tps_config_defaulted(ly->config, r->heads) ? r->heads : "head_dim");
    hs->bad = tps_asprintf("%s: tensor '%s' has %llu %s (dim %d), but config.json gives layer %d%s "
                           "%s %lld x head_dim %lld = %llu%s: the config does not describe this "
                           "tensor, so its shards cannot be promised to hold whole heads",
                           L->ck->path, t->name, (unsigned long long)t->shape[d],
                           d == 0 ? "rows" : "columns", d, layer, tb, r->heads, (long long)cnt,
                           (long long)hd, (unsigned long long)want, fb);
}

static int splits(tps_style s) { return s != TPS_STYLE_REPLICATE && s != TPS_STYLE_SEQPAR; }

/* A plan for another model (--family llama on a GPT-2) matches none of the
 * checkpoint's tensors and would replicate all of them, a split that looks
 * accepted and shards nothing. Refused when no split rule matches a tensor,
 * or when the plan's per-layer split rules (a '*' component) all match
 * nothing: a lone top-level match such as lm_head (GPT-J keeps one) does not
 * make a model of the plan's family. At every tp, tp 1 included, since the
 * manifest would record a plan that does not describe the model. A plan with
 * no split rule (everything replicated on purpose) is not refused. */
static tps_err plan_fits(tps_ctx *ctx, const tps_layout *L)
{
    const tps_plan *plan = L->plan;
    const tps_ckpt *ck = L->ck;
    const char *rule = NULL, *layered = NULL;
    for (size_t i = 0; i < plan->nrules; i++) {
        const tps_rule *r = &plan->rules[i];
        for (size_t j = 0; splits(r->style) && j < r->npat; j++) {
            if (!rule) rule = r->patterns[j];
            if (!layered && strchr(r->patterns[j], '*')) layered = r->patterns[j];
        }
    }
    if (!rule || !ck->n) return TPS_OK;
    for (size_t i = 0; i < ck->n; i++)
        if (splits(L->p[i].style) && (!layered || (L->p[i].rule && strchr(L->p[i].rule, '*'))))
            return TPS_OK;
    if (layered) rule = layered;
    /* A sample of the checkpoint's modules, layer indices as '*'. */
    char seen[4096] = "\n", mods[512] = "", one[160], key[164];
    size_t shown = 0, total = 0;
    for (size_t i = 0; i < ck->n; i++) {
        const char *n = ck->t[i].name, *dot = strrchr(n, '.');
        size_t ml = dot && dot != n ? (size_t)(dot - n) : strlen(n), o = 0;
        for (size_t j = 0; j < ml && o + 2 < sizeof one; j++) {
            size_t k = j;
            while (k < ml && n[k] != '.') k++;
            int digits = 1;
            for (size_t q = j; q < k; q++) digits &= n[q] >= '0' && n[q] <= '9';
            if (digits && k > j) one[o++] = '*';
            for (size_t q = j; !(digits && k > j) && q < k && o + 2 < sizeof one; q++) one[o++] = n[q];
            if (k < ml) one[o++] = '.';
            j = k;
        }
        one[o] = 0;
        snprintf(key, sizeof key, "\n%s\n", one);
        if (strstr(seen, key)) continue;
        if (strlen(seen) + strlen(key) < sizeof seen) strcat(seen, key + 1);
        total++;
        if (shown < 6 && strlen(mods) + strlen(one) + 3 < sizeof mods) {
            if (shown++) strcat(mods, ", ");
            strcat(mods, one);
        }
    }
    return tps_fail(ctx, TPS_E_REJECT,
                    "%s: plan %s matches no tensor of this checkpoint: none of its split rules "
                    "(e.g. '%s') names one of its modules (%s%s), so every tensor would be "
                    "replicated; this is not a %s model: give its plan with --plan FILE or "
                    "--family NAME (tpshard plan --list)",
                    ck->path, plan->name ? plan->name : "(unnamed)", rule, mods,
                    total > shown ? ", ..." : "", plan->name ? plan->name : "plan's");
}

/* Appends the outcome of the head shape check to L->checks. */
static tps_err add_head_outcome(tps_ctx *ctx, tps_layout *L, const head_state *hs)
{
    tps_check_outcome *o = realloc(L->checks, (L->nchecks + 1) * sizeof *o);
    if (!o) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    L->checks = o;
    o = &L->checks[L->nchecks++];
    memset(o, 0, sizeof *o);
    o->name = tps_strdup("head shapes");
    if (!L->ck->config) {
        o->ok = -1;
        o->detail = tps_strdup("no config.json: check skipped");
    } else if (L->tp == 1) {
        o->ok = 1;
        o->detail = tps_strdup("tp 1: nothing is sharded");
    } else if (hs->bad) {
        o->ok = 0;
        o->detail = tps_strdup(hs->bad);
    } else if (!hs->tensors) {
        o->ok = -1;
        o->detail = tps_strdup("config.json gives no head counts and sizes to check against");
    } else {
        o->ok = 1;
        o->detail = tps_asprintf("%llu sharded tensor%s in %d layer%s match heads x head_dim of "
                                 "their layer",
                                 (unsigned long long)hs->tensors, hs->tensors == 1 ? "" : "s",
                                 hs->layers_seen, hs->layers_seen == 1 ? "" : "s");
    }
    if (!o->name || !o->detail) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    return TPS_OK;
}

void tps_layout_free(tps_layout *L)
{
    if (!L) return;
    free(L->p);
    free(L->layers);
    tps_check_outcomes_free(L->checks, L->nchecks);
    free(L->rejected);
    free(L->rt);
    free(L->rank_rt);
    free(L->pieces);
    free(L->regions);
    free(L->xforms);
    free(L->src_pieces);
    free(L->src_piece0);
    free(L->dropped);
    free(L->stage_first);
    free(L->stage_layers);
    free(L->rank_bytes);
    for (size_t i = 0; i < L->nnames; i++) free(L->names[i]);
    free(L->names);
    tps_u64_chunks_free(&L->shapes);
    tps_quant_free(L->q);
    free(L);
}

void tps_layout_drop_tables(tps_layout *L)
{
    free(L->p); /* the tensors' places: what a pass's manifest entries say */
    L->p = NULL;
    free(L->rt);
    free(L->pieces);
    free(L->regions);
    free(L->xforms);
    free(L->src_pieces);
    L->rt = NULL;
    L->pieces = NULL;
    L->regions = NULL;
    L->xforms = NULL;
    L->src_pieces = NULL;
    L->nrt = L->npieces = L->cap_pieces = L->nregions = L->cap_regions = L->nxforms = 0;
    if (L->rank_rt) memset(L->rank_rt, 0, ((size_t)L->nranks + 1) * sizeof *L->rank_rt);
    if (L->src_piece0) memset(L->src_piece0, 0, (L->ck->n + 1) * sizeof *L->src_piece0);
    tps_u64_chunks_free(&L->shapes);
}

/* ------------------------------------------------------------------ layout files */

size_t tps_layout_spec_builtin_count(void)
{
    return tps_builtin_layouts_n;
}

const char *tps_layout_spec_builtin_name(size_t i)
{
    return i < tps_builtin_layouts_n ? tps_builtin_layouts[i].name : NULL;
}

tps_err tps_layout_spec_builtin(tps_ctx *ctx, const char *name, tps_layout_spec **out)
{
    *out = NULL;
    char list[256] = "dtensor";
    size_t off = strlen(list);
    for (size_t i = 0; i < tps_builtin_layouts_n; i++) {
        if (name && !strcmp(name, tps_builtin_layouts[i].name)) {
            char label[128];
            snprintf(label, sizeof label, "plans/layouts/%s.yaml", tps_builtin_layouts[i].name);
            return tps_lspec_parse(ctx, label, tps_builtin_layouts[i].text,
                                   tps_builtin_layouts[i].len, out);
        }
        if (off < sizeof list)
            off += (size_t)snprintf(list + off, sizeof list - off, ", %s",
                                    tps_builtin_layouts[i].name);
    }
    return tps_fail(ctx, TPS_E_ARG, "unknown layout '%s' (built in: %s; or a layout file)",
                    name ? name : "", list);
}

tps_err tps_layout_spec_load(tps_ctx *ctx, const char *path, tps_layout_spec **out)
{
    char *buf = NULL;
    size_t len = 0;
    *out = NULL;
    if (tps_is_dir(path)) return tps_fail(ctx, TPS_E_ARG, "%s: is a directory, not a layout file", path);
    TPS_TRY(tps_read_file(ctx, path, (size_t)1 << 20, &buf, &len));
    tps_err rc = tps_lspec_parse(ctx, path, buf, len, out);
    free(buf);
    return rc;
}

void tps_layout_spec_free(tps_layout_spec *s)
{
    tps_lspec_free(s);
}

const char *tps_layout_spec_name(const tps_layout_spec *s)
{
    return s ? s->name : "dtensor";
}

const char *tps_layout_spec_target(const tps_layout_spec *s)
{
    return s ? s->target : NULL;
}

/* ------------------------------------------------------------------ placements */

/* Every layer's heads, KV heads and head size, for `plan` to show. */
static tps_err layer_table(tps_ctx *ctx, tps_layout *L, const tps_layers *ly)
{
    if (ly->n <= 0) return TPS_OK;
    L->layers = tps_xcalloc((size_t)ly->n, sizeof *L->layers);
    if (!L->layers) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    L->nlayers = (size_t)ly->n;
    for (int i = 0; i < ly->n; i++) {
        tps_layer_view *v = &L->layers[i];
        const char *from[3];
        tps_layers_geometry(ly, i, &v->heads, &v->kv_heads, &v->head_dim, from);
        v->type = tps_layers_type(ly, i);
        v->heads_from = from[0];
        v->kv_heads_from = from[1];
        v->head_dim_from = from[2];
    }
    return TPS_OK;
}

tps_err tps_layout_new_with(tps_ctx *ctx, const tps_ckpt *ck, const tps_plan *plan,
                            const tps_layout_spec *spec, int tp, tps_layout **out)
{
    return tps_layout_new_ep(ctx, ck, plan, spec, tp, 0, out);
}

int tps_layout_ep(const tps_layout *L) { return L->ep; }
const tps_layout_spec *tps_layout_spec_of(const tps_layout *L) { return L->spec; }

/* A layout of ck's tensors, nothing placed yet. */
static tps_layout *layout_alloc(const tps_ckpt *ck, const tps_plan *plan, const tps_lspec *spec,
                                int tp, int ep)
{
    tps_layout *L = tps_xcalloc(1, sizeof *L);
    if (!L) return NULL;
    L->ck = ck;
    L->plan = plan;
    L->spec = spec;
    L->tp = tp;
    L->ep = ep;
    L->pp = 1;
    L->nranks = tp;
    L->n = ck->n;
    L->p = tps_xcalloc(ck->n ? ck->n : 1, sizeof *L->p);
    if (!L->p) {
        free(L);
        return NULL;
    }
    return L;
}

tps_err tps_layout_new_ep(tps_ctx *ctx, const tps_ckpt *ck, const tps_plan *plan,
                          const tps_layout_spec *spec, int tp, int ep, tps_layout **out)
{
    return tps_layout_new_pp(ctx, ck, plan, spec, tp, ep, 1, NULL, out);
}

tps_err tps_layout_new_pp(tps_ctx *ctx, const tps_ckpt *ck, const tps_plan *plan,
                          const tps_layout_spec *spec, int tp, int ep, int pp, const int *layers,
                          tps_layout **out)
{
    return tps_layout_new_padded(ctx, ck, plan, spec, tp, ep, pp, layers, 0, out);
}

int tps_layout_padding(const tps_layout *L, int k, const char **field, uint64_t *from,
                       uint64_t *to)
{
    const char *f = k ? L->epad_field : L->pad_used ? L->pad_field : NULL;
    uint64_t a = k ? L->epad_from : L->pad_from, b = k ? L->epad_to : L->pad_to;
    if (!f || b <= a) return 0;
    *field = f;
    *from = a;
    *to = b;
    return 1;
}

tps_err tps_layout_new_padded(tps_ctx *ctx, const tps_ckpt *ck, const tps_plan *plan,
                              const tps_layout_spec *spec, int tp, int ep, int pp,
                              const int *layers, int pad, tps_layout **out)
{
    tps_layout_opts o = {.ep = ep, .pp = pp, .layers = layers, .pad = pad};
    return tps_layout_new_opts(ctx, ck, plan, spec, tp, &o, out);
}

const tps_moe_backend *tps_layout_moe_backend(const tps_layout *L)
{
    return L->moe_used ? L->moe : NULL;
}

/* The backend asked for, or vLLM 0.33's own choice on a Hopper GPU. */
static const tps_moe_backend *moe_of(const tps_layout_opts *o)
{
    return o && o->moe_backend ? o->moe_backend : tps_moe_backend_find(TPS_MOE_BACKEND_DEFAULT);
}

tps_err tps_layout_new_opts(tps_ctx *ctx, const tps_ckpt *ck, const tps_plan *plan,
                            const tps_layout_spec *spec, int tp, const tps_layout_opts *o,
                            tps_layout **out)
{
    int ep = o ? o->ep : 0, pp = o && o->pp ? o->pp : 1, pad = o ? o->pad : 0;
    const int *layers = o ? o->layers : NULL;
    *out = NULL;
    if (tp < 1 || tp > 4096) return tps_fail(ctx, TPS_E_ARG, "tp must be between 1 and 4096, not %d", tp);
    if (pp < 1 || pp > 4096 || tp * pp > 65536)
        return tps_fail(ctx, TPS_E_ARG, "pp must be between 1 and 4096 (tp x pp at most 65536), "
                                        "not %d", pp);
    tps_err rc = TPS_OK;
    tps_layers ly = {0};
    head_state hs = {.last_layer = -1};
    tps_layout *L = layout_alloc(ck, plan, spec, tp, ep);
    if (!L) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    L->pad_mode = pad;
    L->moe = moe_of(o);
    L->keep = o ? o->keep : NULL;
    TPS_CHECK(tps_lc_pp_setup(ctx, L, pp, layers));
    /* Named after the file: a malformed per_layer_config is the config's fault. */
    char *cfg_label = tps_asprintf("%s/config.json", ck->dir ? ck->dir : ".");
    TPS_FAIL_IF(!cfg_label, ctx, TPS_E_NOMEM, "out of memory");
    rc = tps_layers_open(ctx, ck->config, cfg_label, &ly);
    free(cfg_label);
    if (rc) goto out;
    TPS_CHECK(layer_table(ctx, L, &ly));
    /* The plan's checks are NeMo's rules for the DTensor layout; a serving
     * layout has its own (the engine's), which compile runs. When the plan
     * rejects the model, its reason is what the user needs, not a shape
     * complaint about a tensor. */
    if (!spec) {
        TPS_CHECK(tps_plan_run_checks(ctx, plan, ck->config, tp, &L->checks, &L->nchecks));
        for (size_t i = 0; i < L->nchecks; i++)
            if (L->checks[i].ok == 0) {
                L->rejected = tps_asprintf("%s: %s", L->checks[i].name, L->checks[i].detail);
                break;
            }
    }
    /* The config must describe the head-split tensors (heads x head_dim, by
     * transformers' defaults where config.json is silent) in every layout:
     * the engines build their parameters from the same config. */
    int any_heads = 0;
    for (size_t i = 0; i < plan->nrules; i++) any_heads |= plan->rules[i].heads != NULL;
    /* the quantization first: a packed weight's dims are words of features */
    TPS_CHECK(tps_quant_open(ctx, ck, &L->q));
    for (size_t i = 0; i < ck->n; i++) {
        const tps_ctensor *t = &ck->t[i];
        tps_place *pl = &L->p[i];
        pl->t = i;
        const char *pat = NULL;
        const tps_rule *r = tps_plan_match(plan, t->name, ck->config, &pat);
        pl->style = r ? r->style : TPS_STYLE_REPLICATE;
        pl->rule = r ? pat : NULL;
        pl->dim = r ? style_dim(r->style, tps_lc_param_of(t->name)) : -1;
        if (any_heads && r && r->heads && tp > 1 && ck->config) head_shape(L, &ly, i, r, &hs);
        if (pl->dim < 0 || L->rejected) continue;
        TPS_FAIL_IF(pl->dim >= t->ndim, ctx, TPS_E_SHAPE,
                    "%s: tensor '%s' is %d-D, but style %s (rule '%s') shards dim %d", ck->path,
                    t->name, t->ndim, tps_style_name(pl->style), pat, pl->dim);
    }
    TPS_CHECK(plan_fits(ctx, L));
    if (any_heads) {
        TPS_CHECK(add_head_outcome(ctx, L, &hs));
        if (!L->rejected && L->checks[L->nchecks - 1].ok == 0)
            L->rejected = tps_asprintf("head shapes: %s", L->checks[L->nchecks - 1].detail);
    }
    TPS_CHECK(tps_layout_compile(ctx, L));
out:
    free(hs.bad);
    tps_layers_close(&ly);
    if (rc) {
        tps_layout_free(L);
        L = NULL;
    }
    *out = L;
    return rc;
}

tps_err tps_layout_from_styles(tps_ctx *ctx, const tps_ckpt *ck, const tps_plan *plan,
                               const tps_lspec *spec, int tp, int ep, int pp, const int *layers,
                               int pad, const tps_moe_backend *moe, const tps_style *styles,
                               const unsigned char *keep, tps_layout **out)
{
    *out = NULL;
    tps_err rc = TPS_OK;
    tps_layout *L = layout_alloc(ck, plan, spec, tp, ep);
    if (!L) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    L->pad_mode = pad;
    L->keep = keep;
    L->moe = moe ? moe : tps_moe_backend_find(TPS_MOE_BACKEND_DEFAULT);
    TPS_CHECK(tps_lc_pp_setup(ctx, L, pp, layers));
    for (size_t i = 0; i < ck->n; i++) {
        L->p[i].t = i;
        L->p[i].style = styles[i];
        L->p[i].dim = style_dim(styles[i], tps_lc_param_of(ck->t[i].name));
        if (L->p[i].dim >= ck->t[i].ndim) L->p[i].dim = -1;
    }
    TPS_CHECK(tps_quant_open(ctx, ck, &L->q));
    TPS_CHECK(tps_layout_compile(ctx, L));
out:
    if (rc) {
        tps_layout_free(L);
        L = NULL;
    }
    *out = L;
    return rc;
}

tps_err tps_layout_new(tps_ctx *ctx, const tps_ckpt *ck, const tps_plan *plan, int tp,
                       tps_layout **out)
{
    return tps_layout_new_with(ctx, ck, plan, NULL, tp, out);
}

/* ------------------------------------------------------------------ regions */

/* Bits of one step along dim d (the product of the dims after it). */
uint64_t tps_lc_inner_bits(const tps_ctensor *t, int d)
{
    uint64_t b = tps_dtype_bits(t->dtype);
    for (int k = d + 1; k < t->ndim; k++) b *= t->shape[k];
    return b;
}

void tps_region_geom(const tps_ckpt *ck, const tps_region *g, uint64_t *outer, uint64_t *row,
                     uint64_t *s, uint64_t *l)
{
    const tps_ctensor *t = &ck->t[g->src];
    if (g->dim < 0) {
        *outer = 1;
        *row = *l = t->nbytes;
        *s = 0;
        return;
    }
    uint64_t ib = tps_lc_inner_bits(t, g->dim);
    *outer = 1;
    for (int k = 0; k < g->dim; k++) *outer *= t->shape[k];
    *row = t->shape[g->dim] * ib / 8;
    *s = g->lo * ib / 8;
    *l = (g->hi - g->lo) * ib / 8;
}

/* ------------------------------------------------------------------ views */

int tps_layout_tp(const tps_layout *L) { return L->tp; }
int tps_layout_pp(const tps_layout *L) { return L->pp; }
int tps_layout_ranks(const tps_layout *L) { return L->nranks; }

void tps_layout_stage(const tps_layout *L, int s, int *first, int *n)
{
    if (L->pp > 1 && s >= 0 && s < L->pp) {
        *first = L->stage_first[s];
        *n = L->stage_layers[s];
        return;
    }
    *first = 0;
    *n = s == 0 ? (int)L->nlayers : 0;
}

int tps_layout_spec_has_pipeline(const tps_layout_spec *s) { return s && s->has_pipeline; }
size_t tps_layout_count(const tps_layout *L) { return L->n; }

void tps_layout_placement(const tps_layout *L, size_t i, tps_placement_view *v)
{
    const tps_ctensor *t = &L->ck->t[L->p[i].t];
    v->name = t->name;
    v->dtype = t->dtype;
    v->ndim = t->ndim;
    v->shape = t->shape;
    v->style = L->p[i].style;
    v->dim = L->p[i].dim;
    v->rule = L->p[i].rule;
}

void tps_layout_local(const tps_layout *L, size_t i, int rank, uint64_t *start, uint64_t *len)
{
    *start = *len = 0;
    if (L->src_piece0) { /* the compiled layout: rank's pieces of tensor i */
        int first = 1;
        for (size_t k = L->src_piece0[i]; k < L->src_piece0[i + 1]; k++) {
            const tps_lpiece *p = &L->pieces[L->src_pieces[k]];
            const tps_region *g = &L->regions[p->region];
            if (p->rank != rank || g->dim < 0) continue;
            /* a packed tensor's sections give a rank several row ranges: the
             * first one's start, all of their rows */
            if (first) *start = g->lo;
            first = 0;
            *len += g->hi - g->lo;
        }
        return;
    }
    const tps_ctensor *t = &L->ck->t[L->p[i].t];
    if (L->p[i].dim >= 0) tps_chunk(t->shape[L->p[i].dim], L->tp, rank, start, len);
}

int tps_layout_dim(const tps_layout *L, size_t i)
{
    if (!L->src_piece0) return L->p[i].dim;
    if (L->src_piece0[i] == L->src_piece0[i + 1]) return -1; /* dropped */
    return L->regions[L->pieces[L->src_pieces[L->src_piece0[i]]].region].dim;
}

/* Bytes of tensor i on rank r: its pieces there (the DTensor shard, or what
 * a serving layout puts on r, replicas included). */
uint64_t tps_layout_local_bytes(const tps_layout *L, size_t i, int rank)
{
    if (!L->src_piece0) return 0;
    uint64_t b = 0;
    for (size_t k = L->src_piece0[i]; k < L->src_piece0[i + 1]; k++) {
        const tps_lpiece *p = &L->pieces[L->src_pieces[k]];
        if (p->rank == rank) b += p->nbytes;
    }
    return b;
}

uint64_t tps_layout_rank_bytes(const tps_layout *L, int rank)
{
    uint64_t s = 0;
    if (L->rank_bytes && L->rank_rt) return rank >= 0 && rank < L->nranks ? L->rank_bytes[rank] : 0;
    if (!L->rank_rt && !L->spec) {
        /* a rejected DTensor plan is not laid out: its shards, as placed */
        for (size_t i = 0; i < L->n; i++) {
            const tps_ctensor *t = &L->ck->t[L->p[i].t];
            int d = L->p[i].dim;
            uint64_t lo, len;
            if (d < 0 || d >= t->ndim || !t->shape[d]) {
                s += t->nbytes;
                continue;
            }
            tps_chunk(t->shape[d], L->tp, rank, &lo, &len);
            s += t->nbytes / t->shape[d] * len;
        }
        return s;
    }
    if (!L->rank_rt) return 0;
    for (size_t k = L->rank_rt[rank]; k < L->rank_rt[rank + 1]; k++) s += L->rt[k].nbytes;
    return s;
}

size_t tps_layout_layer_count(const tps_layout *L) { return L->nlayers; }

void tps_layout_layer(const tps_layout *L, size_t i, tps_layer_view *v)
{
    *v = L->layers[i];
}

size_t tps_layout_check_count(const tps_layout *L) { return L->nchecks; }

void tps_layout_check(const tps_layout *L, size_t i, tps_check_view *v)
{
    v->name = L->checks[i].name;
    v->ok = L->checks[i].ok;
    v->detail = L->checks[i].detail;
}

const char *tps_layout_rejected(const tps_layout *L) { return L->rejected; }

const char *tps_layout_dropped(const tps_layout *L, size_t i)
{
    return L->dropped && !L->rejected ? L->dropped[i] : NULL;
}

const char *tps_layout_name(const tps_layout *L) { return tps_layout_spec_name(L->spec); }

const char *tps_layout_target(const tps_layout *L) { return L->spec ? L->spec->target : NULL; }

size_t tps_layout_rank_tensor_count(const tps_layout *L, int rank)
{
    if (!L->rank_rt || rank < 0 || rank >= L->nranks) return 0;
    return L->rank_rt[rank + 1] - L->rank_rt[rank];
}

void tps_layout_rank_tensor(const tps_layout *L, int rank, size_t i, tps_rank_tensor_view *v)
{
    const tps_rtensor *rt = &L->rt[L->rank_rt[rank] + i];
    v->name = rt->name;
    v->dtype = rt->dtype;
    v->ndim = rt->ndim;
    v->shape = rt->shape;
    v->nbytes = rt->nbytes;
    v->npieces = rt->npieces;
    v->rule = rt->rule;
}

void tps_layout_rank_piece(const tps_layout *L, int rank, size_t i, size_t k, tps_piece_view *v)
{
    const tps_rtensor *rt = &L->rt[L->rank_rt[rank] + i];
    const tps_lpiece *p = &L->pieces[rt->piece0 + k];
    memset(v, 0, sizeof *v);
    v->at = p->at;
    v->nbytes = p->nbytes;
    switch (p->kind) {
    case TPS_PK_SRC: {
        const tps_region *g = &L->regions[p->region];
        v->kind = "source";
        v->source = L->ck->t[g->src].name;
        v->dim = g->dim;
        v->lo = g->lo;
        v->hi = g->hi;
        v->replica = p->replica;
        v->transposed = tps_lpiece_tr(L, p);
        break;
    }
    case TPS_PK_ZERO: v->kind = "zeros"; v->dim = -1; break;
    case TPS_PK_CONST: v->kind = "constant"; v->dim = -1; v->value = p->value; break;
    }
}

tps_err tps_layout_working_tps(tps_ctx *ctx, const tps_ckpt *ck, const tps_plan *plan,
                               const tps_layout_spec *spec, int ep, int pp, const int *layers,
                               int *out, int *n)
{
    return tps_layout_working_tps_padded(ctx, ck, plan, spec, ep, pp, layers, 0, out, n);
}

tps_err tps_layout_working_tps_padded(tps_ctx *ctx, const tps_ckpt *ck, const tps_plan *plan,
                                      const tps_layout_spec *spec, int ep, int pp,
                                      const int *layers, int pad, int *out, int *n)
{
    tps_layout_opts o = {.ep = ep, .pp = pp, .layers = layers, .pad = pad};
    return tps_layout_working_tps_opts(ctx, ck, plan, spec, &o, out, n);
}

tps_err tps_layout_working_tps_opts(tps_ctx *ctx, const tps_ckpt *ck, const tps_plan *plan,
                                    const tps_layout_spec *spec, const tps_layout_opts *o,
                                    int *out, int *n)
{
    *n = 0;
    /* every family splits its attention heads: only their divisors can work */
    int present;
    uint64_t heads = tps_lc_config_count(ck->config, "num_attention_heads", &present);
    for (int tp = 1; tp <= 64; tp++) {
        if (heads && heads % (uint64_t)tp) continue;
        tps_layout *L = NULL;
        tps_err rc = tps_layout_new_opts(ctx, ck, plan, spec, tp, o, &L);
        if (rc == TPS_E_NOMEM) return rc;
        if (!rc && L && !L->rejected) out[(*n)++] = tp;
        tps_layout_free(L);
    }
    return TPS_OK;
}
