/* layout_vocab.c - what a serving layout writes beyond the source
 * tensors' own splits, and which of them the engine takes: the vocabulary
 * padded to vocab_padding (the rows of zeros are placed in place_simple),
 * the tied head written from the embedding, the engine's extra entries
 * beside a fused module (constants), and the engine's key set (keys: the
 * parameters its model has; drop: what its load_weights skips). */
#include "layout_int.h"

#include <stdlib.h>
#include <string.h>

static int ok_vocab(uint64_t v, uint64_t pad, int tp)
{
    uint64_t p = pad ? (v + pad - 1) / pad * pad : v;
    return p % (uint64_t)tp == 0;
}

/* Rows per rank of vocabulary tensor t's n rows: padded to vocab_padding
 * (further, to a multiple of it times tp, where the engine pads so), split
 * evenly (*per), or 0: torch.chunk. 0 and a refusal when an even split does
 * not divide. */
int tps_lc_vocab_rows(cstate *C, const tps_ctensor *t, uint64_t n, uint64_t *per)
{
    const tps_layout *L = C->L;
    int exact = L->spec->exact;
    uint64_t pad = L->spec->vocab_pad;
    char works[300];
    uint64_t padded = pad ? (n + pad - 1) / pad * pad : n;
    if (padded % (uint64_t)C->tp && L->spec->vocab_pad_tp && pad) {
        uint64_t m = pad * (uint64_t)C->tp; /* the engine pads further */
        padded = (n + m - 1) / m * m;
    }
    if (exact && padded % (uint64_t)C->tp) {
        int present;
        int named = tps_lc_config_count(C->ck->config, "vocab_size", &present) == n;
        tps_lc_works_list(works, sizeof works, n, pad, ok_vocab);
        refuse(C, "%s%llu rows, padded to a multiple of %llu (%llu), are not divisible by tp %d "
                  "(layout %s splits tensor '%s' evenly; tp values that work: %s)",
               named ? "vocab_size: " : "the vocabulary's ", (unsigned long long)n,
               (unsigned long long)pad, (unsigned long long)padded, C->tp, L->spec->name,
               t->name, works);
        return 0;
    }
    *per = exact ? padded / (uint64_t)C->tp : 0;
    return 1;
}

/* Index of the source tensor whose module path is exactly `module` and
 * parameter `weight`, or -1. */
static int find_weight(const tps_ckpt *ck, const char *module)
{
    char *n = tps_asprintf("%s.weight", module);
    int k = n ? tps_ckpt_find(ck, n) : -1;
    free(n);
    return k;
}

/* tie_word_embeddings: 1 true, 0 false, -1 not said. */
static int tied_flag(const cJSON *config)
{
    const cJSON *v = tps_config_get(config, "tie_word_embeddings");
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
    return -1;
}

/* The tied head: a checkpoint without one is written with it from the
 * embedding (*emb_out, else -1), where config.json ties them; refused where
 * the config and the checkpoint disagree. */
tps_err tps_lc_tied_head(cstate *C, int *emb_out)
{
    const tps_lspec *s = C->L->spec;
    const tps_ckpt *ck = C->ck;
    int head = -1, emb = -1;
    *emb_out = -1;
    if (!s || !s->tied_head || !s->tied_embedding) return TPS_OK;
    head = find_weight(ck, s->tied_head);
    emb = find_weight(ck, s->tied_embedding);
    const char *embname = s->tied_embedding;
    for (size_t k = 0; emb < 0 && k < s->ntied_also; k++)
        if ((emb = find_weight(ck, s->tied_also[k])) >= 0) embname = s->tied_also[k];
    int flag = tied_flag(ck->config);
    if (flag < 0) { /* not said: the config class's default */
        const cJSON *mt = tps_config_get(ck->config, "model_type");
        flag = 0;
        for (size_t k = 0; k < s->ntied_default; k++)
            if (cJSON_IsString(mt) && !strcmp(mt->valuestring, s->tied_default[k])) flag = 1;
        if (head < 0 && emb >= 0 && !flag) {
            refuse(C, "config.json does not set tie_word_embeddings, which then defaults to "
                      "false for model_type %s, yet the checkpoint has no %s.weight: set "
                      "tie_word_embeddings to true if the head is tied to %s",
                   cJSON_IsString(mt) ? mt->valuestring : "(none)", s->tied_head,
                   embname);
            return TPS_OK;
        }
    }
    if (head < 0 && emb >= 0 && flag == 0) {
        refuse(C, "config.json says tie_word_embeddings is false, but the checkpoint has no "
                  "%s.weight (layout %s would have no head to write)",
               s->tied_head, s->name);
        return TPS_OK;
    }
    if (head >= 0 && emb >= 0 && flag == 1) {
        refuse(C, "config.json ties %s to %s (tie_word_embeddings: true) but the checkpoint "
                  "stores both; the engine keeps one parameter: remove %s.weight or set "
                  "tie_word_embeddings to false",
               s->tied_head, embname, s->tied_head);
        return TPS_OK;
    }
    if (head < 0 && emb >= 0) {
        char d[256];
        snprintf(d, sizeof d, "%s.weight is written from %s.weight, which it is tied to",
                 s->tied_head, embname);
        TPS_TRY(tps_lc_add_check(C, "tied head", 1, d));
    } else {
        emb = -1; /* untied: both are ordinary tensors */
    }
    *emb_out = emb;
    return TPS_OK;
}

/* Whether the engine makes extra entry x for this checkpoint: its
 * quantization method ("none": unquantized) and config conditions. */
static int extra_applies(const cstate *C, const tps_lextra *x)
{
    if (x->quant) {
        const tps_quant *q = C->L->q;
        if (!strcmp(x->quant, "none") ? q != NULL : !q || strcmp(q->method_name, x->quant))
            return 0;
    }
    if (x->when && !tps_cond_eval(x->when, C->ck->config)) return 0;
    if (x->unless && tps_cond_eval(x->unless, C->ck->config)) return 0;
    return 1;
}

/* The dtype an engine serves the model in (dtype "auto"): config.json's
 * torch_dtype (or dtype, or text_config's), float32 served as BF16, BF16 when
 * none is given. Its scalar parameters are created in it. */
tps_dtype tps_lc_serving_dtype(const cJSON *config)
{
    const cJSON *v = tps_config_get(config, "torch_dtype");
    if (!cJSON_IsString(v)) v = tps_config_get(config, "dtype");
    return cJSON_IsString(v) && !strcmp(v->valuestring, "float16") ? TPS_F16 : TPS_BF16;
}

/* The engine's own entries beside fused module parent (f's extra list) on
 * every rank: constants, in the serving dtype where they say so. */
tps_err tps_lc_place_extras(cstate *C, const tps_lfuse *f, const char *parent)
{
    const tps_ckpt *ck = C->ck;
    for (size_t e = 0; e < f->nextra; e++) {
        const tps_lextra *x = &f->extra[e];
        if (!extra_applies(C, x)) continue;
        char *xn = tps_lc_own_name(C, tps_asprintf("%s.%s", parent, x->name));
        if (!xn) return nomem(C);
        uint64_t xs[TPS_MAX_DIMS] = {x->len};
        tps_dtype xd = x->model_dtype ? tps_lc_serving_dtype(ck->config) : x->dtype;
        for (int r = 0; r < C->tp; r++) {
            tps_rtensor *rt;
            TPS_TRY(tps_lc_new_rt(C, xn, r, xd, x->ndim, xs, NULL, &rt));
            rt->rule = "extra";
            TPS_TRY(tps_lc_add_piece(C, rt, (tps_lpiece){.kind = TPS_PK_CONST, .at = 0,
                                                         .nbytes = rt->nbytes, .value = x->value}));
        }
    }
    return TPS_OK;
}

/* Why the engine never holds source tensor `name` (its load_weights skips
 * names holding one of a drop entry's strings), or NULL. */
static const char *drop_reason(const tps_lspec *s, const cJSON *config, const char *name)
{
    for (size_t k = 0; k < s->ndrops; k++) {
        const tps_ldrop *d = &s->drops[k];
        if (!tps_lc_type_listed(d->model_types, d->nmt, config)) continue;
        if (d->layers_past) {
            int present, layer = tps_layer_of_name(name);
            uint64_t n = tps_lc_config_count(config, d->layers_past, &present);
            if (present && layer >= 0 && (uint64_t)layer >= n) return d->reason;
            continue;
        }
        uint64_t first;
        if (d->only_last && !tps_lc_last_layers(config, d->only_last, tps_layer_of_name(name),
                                                &first))
            continue;
        for (size_t j = 0; j < d->ncontains; j++)
            if (strstr(name, d->contains[j])) return d->reason;
    }
    return NULL;
}

/* What the engine's load_weights skips (the layout's drop entries): no
 * rank file holds it, and L->dropped says why. */
tps_err tps_lc_drop(cstate *C)
{
    tps_layout *L = C->L;
    const tps_lspec *s = L->spec;
    const tps_ckpt *ck = C->ck;
    for (size_t i = 0; s && i < ck->n; i++) {
        int layer = tps_layer_of_name(ck->t[i].name);
        for (size_t k = 0; layer >= 0 && k < s->ndrops; k++) {
            const tps_ldrop *d = &s->drops[k];
            if (!d->layers_extra || !tps_lc_type_listed(d->model_types, d->nmt, ck->config))
                continue;
            int pp, pe;
            uint64_t past = tps_lc_config_count(ck->config, d->layers_past, &pp);
            uint64_t extra = tps_lc_config_count(ck->config, d->layers_extra, &pe);
            if (pp && (uint64_t)layer >= past + extra) {
                refuse(C, "tensor '%s' is in layer %d, but config.json's %s = %llu and %s = "
                          "%llu%s leave no such layer (layout %s): the checkpoint does not "
                          "match its config.json",
                       ck->t[i].name, layer, d->layers_past, (unsigned long long)past,
                       d->layers_extra, (unsigned long long)extra, pe ? "" : " (not set)",
                       s->name);
                return TPS_OK;
            }
        }
        const char *why = drop_reason(s, ck->config, ck->t[i].name);
        if (!why) continue;
        if (!L->dropped && !(L->dropped = tps_xcalloc(ck->n, sizeof *L->dropped)))
            return nomem(C);
        L->dropped[i] = why;
        C->used[i] = 1;
    }
    return TPS_OK;
}

/* Does a keys entry name `name` as a parameter of the engine's model? */
static int engine_key(const tps_lspec *s, const cJSON *config, const char *name)
{
    const char *param = tps_lc_param_of(name);
    size_t ml;
    if (!tps_lc_module_of(name, &ml)) return 0;
    for (size_t k = 0; k < s->nkeys; k++) {
        const tps_lkey *e = &s->keys[k];
        int p = 0;
        for (size_t j = 0; j < e->nparams && !p; j++) p = !strcmp(e->params[j], param);
        if (!p || !tps_lc_type_listed(e->model_types, e->nmt, config) ||
            !tps_cond_eval(e->when, config))
            continue;
        for (size_t j = 0; j < e->npat; j++)
            if (tps_module_match(e->patterns[j], name, ml)) return 1;
    }
    return 0;
}

int tps_lc_engine_key(const cstate *C, const char *name)
{
    const tps_lspec *s = C->L->spec;
    return !s->has_keys || engine_key(s, C->ck->config, name);
}

/* The config settings under which a keys entry would name the bias
 * `name`, in hint (empty: none would). */
static void key_hint(const tps_lspec *s, const cJSON *config, const char *name, char *hint,
                     size_t len)
{
    const char *param = tps_lc_param_of(name);
    size_t ml;
    hint[0] = 0;
    if (!tps_lc_module_of(name, &ml)) return;
    for (size_t k = 0; k < s->nkeys; k++) {
        const tps_lkey *e = &s->keys[k];
        int p = 0, m = 0;
        for (size_t j = 0; j < e->nparams && !p; j++) p = !strcmp(e->params[j], param);
        for (size_t j = 0; j < e->npat && !m; j++) m = tps_module_match(e->patterns[j], name, ml);
        if (p && m && e->when && tps_lc_type_listed(e->model_types, e->nmt, config))
            tps_lc_enable_hint(hint, len, e->when);
    }
}

/* A layout that lists the engine's keys writes exactly them: 1 and a
 * refusal when none names source tensor i (the vocabulary and the embedding
 * a tied head is written from, emb, are the engine's). */
int tps_lc_unkeyed(cstate *C, size_t i, int emb)
{
    const tps_lspec *s = C->L->spec;
    const tps_ckpt *ck = C->ck;
    const tps_ctensor *t = &ck->t[i];
    int vocab = !strcmp(tps_lc_param_of(t->name), "weight") &&
                tps_lc_matches_any(s->vocab, s->nvocab, t->name);
    if (!s->has_keys || (int)i == emb || vocab || engine_key(s, ck->config, t->name)) return 0;
    const cJSON *mt = tps_config_get(ck->config, "model_type");
    int bias = !strcmp(tps_lc_param_of(t->name), "bias");
    char hint[256];
    key_hint(s, ck->config, t->name, hint, sizeof hint);
    refuse(C, "tensor '%s': %s's model (model_type %s) has no such parameter%s (layout "
              "%s writes exactly the engine's keys; --layout dtensor keeps every tensor)"
              "%s%s%s",
           t->name, s->target, cJSON_IsString(mt) ? mt->valuestring : "not given",
           bias ? ": its load_weights would ignore this bias, and the model would compute "
                  "without it"
                : ", and its load_weights does not skip it",
           s->name, hint[0] ? ": set " : "", hint,
           hint[0] ? " in config.json if the model uses it" : "");
    return 1;
}
