/* layout_pp.c - pipeline parallelism: the stages' layers (the engine's own
 * partition, or one given), and the last step of a compile, which puts the
 * rank tensors of the tp ranks on the workers (stage, tp rank) that build
 * them. Rank w is stage w / tp, tensor-parallel rank w % tp, as the engine
 * numbers its workers.
 *
 * What a stage builds is the layout file's pipeline section: the layers of
 * its partition (under their global indices), the modules of the first or
 * the last stage, or, for the model types that build them everywhere, all
 * of those on every stage. A copy on another stage is a replica of the
 * same region: the bytes are read once and checked against one another. */
#include "layout_int.h"

#include <stdlib.h>
#include <string.h>

void tps_rank_file_name(int tp, int pp, int rank, int part, char *buf, size_t len)
{
    /* model_loader/sharded_state_loader.py: PP_AND_TP_PATTERN with a pipeline group
     * of more than one rank, else the TP-only pattern */
    if (pp > 1)
        snprintf(buf, len, "model-pp-%d-tp-%d-part-%d.safetensors", rank / tp, rank % tp, part);
    else
        snprintf(buf, len, "model-rank-%d-part-%d.safetensors", rank, part);
}

int tps_rank_file_parse(const char *name, int tp, int pp, int *rank, int *part)
{
    int a, b, c, n = 0;
    if (pp > 1) {
        if (sscanf(name, "model-pp-%d-tp-%d-part-%d%n", &a, &b, &c, &n) != 3 || a < 0 ||
            a >= pp || b < 0 || b >= tp || c < 0)
            return -1;
        *rank = a * tp + b;
    } else {
        if (sscanf(name, "model-rank-%d-part-%d%n", &a, &c, &n) != 2 || a < 0 || c < 0) return -1;
        *rank = a;
    }
    *part = c;
    return n;
}

void tps_pp_default_partition(int nlayers, int pp, int *out)
{
    /* distributed/utils.py get_pp_indices: nlayers // pp each, then the
     * remainder one each to stages pp-2, pp-3, ... (never the last, which
     * also holds the final norm and the head) */
    for (int s = 0; s < pp; s++) out[s] = nlayers / pp;
    int rem = nlayers % pp;
    for (int i = 2; i < rem + 2; i++) out[pp - i]++;
}

int tps_pp_parse_layers(const char *s, int pp, int *out, char *why, size_t whylen)
{
    int n = 0;
    const char *p = s;
    if (!s || !*s) return snprintf(why, whylen, "an empty list"), -1;
    for (;;) {
        char *end;
        if (*p < '0' || *p > '9')
            return snprintf(why, whylen, "'%s' is not a list of layer counts", s), -1;
        long v = strtol(p, &end, 10);
        if (v < 0 || v > 1000000)
            return snprintf(why, whylen, "'%s': a layer count out of range", s), -1;
        if (n < pp) out[n] = (int)v;
        n++;
        if (v == 0)
            return snprintf(why, whylen, "stage %d has no layer: every stage needs one", n - 1), -1;
        if (!*end) break;
        if (*end != ',')
            return snprintf(why, whylen, "'%s' is not a list of layer counts", s), -1;
        p = end + 1;
    }
    if (n != pp)
        return snprintf(why, whylen, "%d stage%s given for --pp %d", n, n == 1 ? "" : "s", pp), -1;
    return 0;
}

tps_err tps_lc_pp_setup(tps_ctx *ctx, tps_layout *L, int pp, const int *layers)
{
    const tps_ckpt *ck = L->ck;
    const tps_lspec *s = L->spec;
    L->pp = pp;
    L->nranks = L->tp * pp;
    if (pp == 1) return TPS_OK;
    if (!s || !s->has_pipeline)
        return tps_fail(ctx, TPS_E_ARG,
                        "layout %s has no pipeline stages: --pp is for layouts with a pipeline "
                        "section (built in: vllm)",
                        tps_layout_spec_name(s));
    int present = 0;
    uint64_t n = tps_lc_config_count(ck->config, s->pp_count, &present);
    if (!n)
        return tps_fail(ctx, TPS_E_CONFIG,
                        "%s: config.json lacks %s: pipeline stages need the layer count",
                        ck->path, s->pp_count);
    if ((uint64_t)pp > n)
        return tps_fail(ctx, TPS_E_REJECT,
                        "%s: --pp %d exceeds the model's %llu layers (%s): every stage needs a "
                        "layer",
                        ck->path, pp, (unsigned long long)n, s->pp_count);
    L->stage_first = tps_xcalloc((size_t)pp, sizeof *L->stage_first);
    L->stage_layers = tps_xcalloc((size_t)pp, sizeof *L->stage_layers);
    if (!L->stage_first || !L->stage_layers) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    if (layers) {
        uint64_t sum = 0;
        for (int k = 0; k < pp; k++) {
            if (layers[k] < 1)
                return tps_fail(ctx, TPS_E_ARG, "pipeline stage %d has no layer: every stage "
                                                "needs one", k);
            sum += (uint64_t)layers[k];
            L->stage_layers[k] = layers[k];
        }
        if (sum != n) {
            char list[256];
            size_t o = 0;
            for (int k = 0; k < pp && o < sizeof list; k++)
                o += (size_t)snprintf(list + o, sizeof list - o, "%s%d", k ? "," : "", layers[k]);
            return tps_fail(ctx, TPS_E_REJECT,
                            "%s: the pipeline partition %s holds %llu layers, the model has %llu "
                            "(%s): the stages' layers must add up to it",
                            ck->path, list, (unsigned long long)sum, (unsigned long long)n,
                            s->pp_count);
        }
    } else {
        tps_pp_default_partition((int)n, pp, L->stage_layers);
    }
    for (int k = 1; k < pp; k++) L->stage_first[k] = L->stage_first[k - 1] + L->stage_layers[k - 1];
    return TPS_OK;
}

int tps_layout_stage_of_layer(const tps_layout *L, int layer)
{
    if (L->pp <= 1) return 0;
    for (int k = 0; k < L->pp; k++)
        if (layer >= L->stage_first[k] && layer < L->stage_first[k] + L->stage_layers[k]) return k;
    return -1;
}

/* The layer index of a rank tensor under the layers' module path
 * ("model.layers.12.mlp..." under "model.layers": 12), -1 when it is not
 * under it, -2 when the component after it is not a number. */
static long layer_under(const char *name, const char *layers)
{
    size_t n = strlen(layers);
    if (strncmp(name, layers, n) || name[n] != '.') return -1;
    const char *p = name + n + 1;
    char *end;
    if (*p < '0' || *p > '9') return -2;
    long v = strtol(p, &end, 10);
    return *end == '.' ? v : -2;
}

/* A copy of rank tensor k on rank w (its source pieces replicas). */
static tps_err copy_rt(cstate *C, size_t k, int w, const char *name)
{
    tps_layout *L = C->L;
    tps_rtensor *nr;
    tps_rtensor src = L->rt[k]; /* tps_lc_new_rt may move L->rt */
    TPS_TRY(tps_lc_new_rt(C, name, w, src.dtype, src.ndim, src.shape, src.rule, &nr));
    for (size_t j = 0; j < src.npieces; j++) {
        tps_lpiece p = L->pieces[src.piece0 + j];
        if (p.kind == TPS_PK_SRC) p.replica = 1;
        /* tps_lc_add_piece appends to L->pieces: nr's pieces stay contiguous */
        TPS_TRY(tps_lc_add_piece(C, nr, p));
    }
    return TPS_OK;
}

/* Is rank tensor k the tied head, written from the embedding (the
 * checkpoint has the embedding and no head of its own)? By name: a rank
 * whose vocabulary rows are all padding holds no byte of the embedding. */
static int tied_head(const cstate *C, size_t k)
{
    const tps_lspec *s = C->L->spec;
    const char *nm = C->L->rt[k].name;
    if (!s->tied_head || !s->tied_embedding) return 0;
    size_t hl = strlen(s->tied_head);
    if (strncmp(nm, s->tied_head, hl) || strcmp(nm + hl, ".weight")) return 0;
    char emb[512];
    snprintf(emb, sizeof emb, "%s.weight", s->tied_embedding);
    return tps_ckpt_find(C->ck, nm) < 0 && tps_ckpt_find(C->ck, emb) >= 0;
}

static void move_rt(tps_layout *L, size_t k, int w)
{
    tps_rtensor *r = &L->rt[k];
    r->rank = w;
    for (size_t j = 0; j < r->npieces; j++) L->pieces[r->piece0 + j].rank = w;
}

/* Layers that read an earlier layer's KV cache (the last kv_shared layers,
 * each the last layer before them of its own layer type) must be on that
 * layer's stage: vLLM 0.33 refuses a KV-sharing target on another stage.
 * 0 and a refusal when one is not. */
static int kv_shared_stages(cstate *C)
{
    const tps_layout *L = C->L;
    const cJSON *config = C->ck->config;
    uint64_t first;
    const char *field = L->spec->pp_kv_shared;
    const cJSON *types = tps_config_get(config, "layer_types");
    int present, n = (int)tps_lc_config_count(config, "num_hidden_layers", &present);
    if (!field || !cJSON_IsArray(types) || !tps_lc_last_layers(config, field, n - 1, &first))
        return 1;
    for (int i = (int)first; i < n; i++) {
        const cJSON *ti = cJSON_GetArrayItem(types, i);
        int target = -1;
        for (int j = (int)first - 1; j >= 0 && target < 0 && cJSON_IsString(ti); j--) {
            const cJSON *tj = cJSON_GetArrayItem(types, j);
            if (cJSON_IsString(tj) && !strcmp(tj->valuestring, ti->valuestring)) target = j;
        }
        if (target < 0) continue; /* the engine's own error: no layer to share with */
        int si = tps_layout_stage_of_layer(L, i), st = tps_layout_stage_of_layer(L, target);
        if (si != st) {
            refuse(C, "layer %d, one of the last %s = %llu, reads the KV cache of layer %d "
                      "(the last earlier layer of its type), but pipeline stage %d holds layer "
                      "%d and stage %d layer %d; %s refuses a KV-sharing target on another "
                      "stage: use --pp 1, or a partition (--pp-layers) that keeps them on one "
                      "stage",
                   i, field, (unsigned long long)(n - (int)first), target, si, i, st, target,
                   L->spec->target);
            return 0;
        }
    }
    return 1;
}

tps_err tps_lc_pipeline(cstate *C)
{
    tps_layout *L = C->L;
    const tps_lspec *s = L->spec;
    const tps_ckpt *ck = C->ck;
    int tp = L->tp, pp = L->pp;
    if (pp <= 1) return TPS_OK;
    if (!kv_shared_stages(C)) return TPS_OK;
    int every = tps_lc_type_listed(s->pp_every, s->npp_every, ck->config) && s->npp_every;
    char *tied_emb = NULL;
    size_t n0 = L->nrt;
    for (size_t k = 0; k < n0; k++) {
        const char *name = L->rt[k].name;
        int r = L->rt[k].rank;
        long layer = layer_under(name, s->pp_layers);
        if (layer == -2 || layer >= L->stage_first[pp - 1] + L->stage_layers[pp - 1]) {
            refuse(C, "tensor '%s' is not in one of the %d layers the pipeline stages hold "
                      "(%s.N, %s)",
                   name, L->stage_first[pp - 1] + L->stage_layers[pp - 1], s->pp_layers,
                   s->pp_count);
            break;
        }
        if (layer >= 0) {
            move_rt(L, k, tps_layout_stage_of_layer(L, (int)layer) * tp + r);
            continue;
        }
        int first = tps_lc_matches_any(s->pp_first, s->npp_first, name);
        int last = tps_lc_matches_any(s->pp_last, s->npp_last, name);
        if (!first && !last) {
            refuse(C, "tensor '%s' is in no pipeline stage: layout %s builds %s on the first "
                      "stage and %s on the last, and nothing else outside %s",
                   name, s->name, s->npp_first ? s->pp_first[0] : "nothing",
                   s->pp_last[0], s->pp_layers);
            break;
        }
        if (every) {
            for (int st = 1; st < pp; st++) TPS_TRY(copy_rt(C, k, st * tp + r, L->rt[k].name));
            move_rt(L, k, r);
            continue;
        }
        /* The tied head written from the embedding: the last stage's
         * lm_head.weight, and on the first stage the embedding itself. */
        if (last && tied_head(C, k)) {
            if (!tied_emb) {
                tied_emb = tps_lc_own_name(C, tps_asprintf("%s.weight", s->tied_embedding));
                if (!tied_emb) return nomem(C);
            }
            TPS_TRY(copy_rt(C, k, r, tied_emb));
            move_rt(L, k, (pp - 1) * tp + r);
            continue;
        }
        move_rt(L, k, first ? r : (pp - 1) * tp + r);
    }
    return TPS_OK;
}
