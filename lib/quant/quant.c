/* quant.c - quantized checkpoints, whatever the method: which tensors are
 * quantized weights, which are their scales, and how a scale's shape relates
 * to its weight's. What a method stores and means is its entry in the table
 * below (the entries live in one file per method family: fp8.c); this file
 * reads any of them the same way. Any other quant_method is refused:
 * splitting its packed integers or grouped scales as if they were plain
 * tensors would give shards that dequantize to garbage while every byte
 * checks out. */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int has_suffix(const char *s, const char *suf, size_t *stem)
{
    size_t a = strlen(s), b = strlen(suf);
    if (a <= b || strcmp(s + a - b, suf)) return 0;
    *stem = a - b;
    return 1;
}

const tps_qmethod *const tps_qmethods[] = {&tps_qm_fp8, &tps_qm_ct_fp8};
const size_t tps_nqmethods = sizeof tps_qmethods / sizeof tps_qmethods[0];
const char *const tps_qscale_names[TPS_QS_KINDS] = {"tensor", "channel", "block"};
const char *const tps_qscale_labels[TPS_QS_KINDS] = {"per-tensor", "per-channel", "block"};

/* Tensors of methods not in the table: a checkpoint holding them is refused
 * by name, whatever its config says. */
static const char *const foreign_parts[] = {".weight_zero_point", ".qweight", ".weight_packed"};

void tps_quant_free(tps_quant *q)
{
    if (!q) return;
    free(q->role);
    free(q->partner);
    free(q->input);
    free(q->kind);
    free(q);
}

tps_err tps_quant_block_of(tps_ctx *ctx, const tps_ckpt *ck, const char *where, const cJSON *b,
                           uint64_t *bn, uint64_t *bk)
{
    uint64_t v[2];
    int ok = cJSON_IsArray(b) && cJSON_GetArraySize(b) == 2;
    for (int i = 0; ok && i < 2; i++) {
        const cJSON *x = cJSON_GetArrayItem(b, i);
        ok = cJSON_IsNumber(x) && x->valuedouble >= 1 && x->valuedouble <= 1048576 &&
             x->valuedouble == floor(x->valuedouble);
        if (ok) v[i] = (uint64_t)x->valuedouble;
    }
    if (!ok) {
        char *shown = b ? cJSON_PrintUnformatted(b) : NULL;
        tps_err rc = tps_fail(ctx, TPS_E_CONFIG,
                              "%s: %s is %s, not two positive integers [rows, columns]",
                              ck->path, where, shown ? shown : "missing");
        free(shown);
        return rc;
    }
    *bn = v[0];
    *bk = v[1];
    return TPS_OK;
}

/* Expected scale shape of weight w for kind k. */
static int scale_fits(const tps_quant *q, const tps_ctensor *w, const tps_ctensor *s, tps_qscale *k)
{
    uint64_t n = 1;
    for (int d = 0; d < s->ndim; d++) n *= s->shape[d];
    if (n == 1 && s->ndim <= 1) {
        *k = TPS_QS_TENSOR;
        return 1;
    }
    if (w->ndim != 2) return 0;
    if ((s->ndim == 2 && s->shape[0] == w->shape[0] && s->shape[1] == 1) ||
        (s->ndim == 1 && s->shape[0] == w->shape[0])) {
        *k = TPS_QS_CHANNEL;
        return 1;
    }
    if (q->bn && s->ndim == 2 && s->shape[0] == (w->shape[0] + q->bn - 1) / q->bn &&
        s->shape[1] == (w->shape[1] + q->bk - 1) / q->bk) {
        *k = TPS_QS_BLOCK;
        return 1;
    }
    return 0;
}

/* The method config.json names, from the table; an unknown one is refused
 * with the list of those tpshard splits. */
static tps_err method_of(tps_ctx *ctx, const tps_ckpt *ck, const cJSON *qc, tps_quant *q)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(qc, "quant_method");
    if (!cJSON_IsString(m))
        return tps_fail(ctx, TPS_E_CONFIG, "%s: quantization_config has no quant_method", ck->path);
    q->method_name = m->valuestring;
    for (size_t i = 0; i < tps_nqmethods; i++)
        if (!strcmp(m->valuestring, tps_qmethods[i]->name)) q->m = tps_qmethods[i];
    if (q->m) return q->m->read_config(ctx, ck, qc, q);
    char known[512];
    size_t o = 0;
    for (size_t i = 0; i < tps_nqmethods && o < sizeof known; i++)
        o += (size_t)snprintf(known + o, sizeof known - o, "%s%s (%s)",
                              i == 0 ? "" : i + 1 == tps_nqmethods ? " and " : ", ",
                              tps_qmethods[i]->name, tps_qmethods[i]->what);
    return tps_fail(ctx, TPS_E_REJECT,
                    "%s: quant_method '%s' is not supported yet: tpshard splits %s; it will not cut "
                    "packed or grouped quantized weights as if they were plain tensors",
                    ck->path, m->valuestring, known);
}

/* The part of method m (of any method, m NULL) that name ends with. */
static const tps_qpart *part_of(const tps_qmethod *m, const char *name, size_t *stem)
{
    for (size_t k = 0; k < (m ? 1 : tps_nqmethods); k++) {
        const tps_qmethod *mm = m ? m : tps_qmethods[k];
        for (size_t j = 0; j < mm->nparts; j++)
            if (has_suffix(name, mm->parts[j].suffix, stem)) return &mm->parts[j];
    }
    return NULL;
}

static tps_err place_input(tps_ctx *ctx, const tps_ckpt *ck, tps_quant *q, size_t i, int w)
{
    const tps_ctensor *s = &ck->t[i];
    tps_qscale k;
    if (w < 0)
        return tps_fail(ctx, TPS_E_SHAPE, "%s: input scale '%s' has no weight beside it", ck->path,
                        s->name);
    if (!scale_fits(q, &ck->t[w], s, &k) || k != TPS_QS_TENSOR)
        return tps_fail(ctx, TPS_E_SHAPE, "%s: input scale '%s' must hold one value ([] or [1])",
                        ck->path, s->name);
    q->role[i] = TPS_QR_INPUT_SCALE;
    q->partner[i] = w;
    q->input[w] = (int)i;
    return TPS_OK;
}

/* Scale i of weight w, named with part p. */
static tps_err place_scale(tps_ctx *ctx, const tps_ckpt *ck, tps_quant *q, size_t i, int w,
                           size_t stem, const tps_qpart *p)
{
    const tps_ctensor *s = &ck->t[i];
    if (w < 0)
        return tps_fail(ctx, TPS_E_SHAPE, "%s: scale '%s' has no weight '%.*s.weight' beside it",
                        ck->path, s->name, (int)stem, s->name);
    const tps_ctensor *wt = &ck->t[w];
    if (!q->m->weight_dtype(wt->dtype))
        return tps_fail(ctx, TPS_E_SHAPE, "%s: scale '%s' belongs to '%s', which is %s, not an FP8 weight",
                        ck->path, s->name, wt->name, tps_dtype_name(wt->dtype));
    if (q->partner[w] >= 0)
        return tps_fail(ctx, TPS_E_SHAPE, "%s: weight '%s' has two scales", ck->path, wt->name);
    if (!tps_dtype_is_float(s->dtype) || tps_dtype_bits(s->dtype) < 8)
        return tps_fail(ctx, TPS_E_SHAPE, "%s: scale '%s' is %s, not a float dtype", ck->path,
                        s->name, tps_dtype_name(s->dtype));
    tps_qscale k;
    if (!scale_fits(q, wt, s, &k)) {
        char want[160];
        if (q->bn && wt->ndim == 2)
            snprintf(want, sizeof want, "[%llu, %llu] for blocks of %llu x %llu",
                     (unsigned long long)((wt->shape[0] + q->bn - 1) / q->bn),
                     (unsigned long long)((wt->shape[1] + q->bk - 1) / q->bk),
                     (unsigned long long)q->bn, (unsigned long long)q->bk);
        else
            snprintf(want, sizeof want, "[] or [1] (per tensor) or [%llu, 1] (per channel)",
                     wt->ndim ? (unsigned long long)wt->shape[0] : 0ULL);
        return tps_fail(ctx, TPS_E_SHAPE,
                        "%s: scale '%s' has shape of %d dims not matching its weight '%s' %s: "
                        "expected %s",
                        ck->path, s->name, s->ndim, wt->name, wt->ndim == 2 ? "[out, in]" : "", want);
    }
    if (!(p->kinds >> k & 1u)) { /* the method names this kind otherwise */
        const char *named = "?";
        for (size_t j = q->m->nparts; j-- > 0;)
            if (q->m->parts[j].role == TPS_QR_SCALE && (q->m->parts[j].kinds >> k & 1u))
                named = q->m->parts[j].suffix + 1;
        return tps_fail(ctx, TPS_E_SHAPE, "%s: %s scale '%s': quant_method %s names them %s",
                        ck->path, tps_qscale_names[k], s->name, q->m->name, named);
    }
    q->role[i] = TPS_QR_SCALE;
    q->kind[i] = k;
    q->partner[i] = w;
    q->role[w] = TPS_QR_WEIGHT;
    q->partner[w] = (int)i;
    q->nquant++;
    return TPS_OK;
}

/* Every tensor that is a part of a quantized weight, given its role. */
static tps_err find_parts(tps_ctx *ctx, const tps_ckpt *ck, const cJSON *qc, tps_quant *q)
{
    for (size_t i = 0; i < ck->n; i++) {
        const tps_ctensor *s = &ck->t[i];
        size_t stem;
        const tps_qpart *p = part_of(q->m, s->name, &stem);
        if (!p) {
            for (size_t j = 0; j < sizeof foreign_parts / sizeof foreign_parts[0]; j++)
                if (has_suffix(s->name, foreign_parts[j], &stem))
                    return tps_fail(ctx, TPS_E_REJECT,
                                    "%s: tensor '%s' is part of an integer-quantized layer: not "
                                    "supported yet (only FP8)",
                                    ck->path, s->name);
            continue;
        }
        if (!qc)
            return tps_fail(ctx, TPS_E_CONFIG,
                            "%s: tensor '%s' is a quantization scale, but config.json has no "
                            "quantization_config saying how it relates to its weight",
                            ck->path, s->name);
        char *wn = tps_asprintf("%.*s.weight", (int)stem, s->name);
        if (!wn) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
        int w = tps_ckpt_find(ck, wn);
        free(wn);
        if (p->role == TPS_QR_INPUT_SCALE) TPS_TRY(place_input(ctx, ck, q, i, w));
        else TPS_TRY(place_scale(ctx, ck, q, i, w, stem, p));
    }
    /* A quantized weight needs its scale (unquantized modules are not FP8). */
    for (size_t i = 0; qc && i < ck->n; i++) {
        size_t stem;
        if (!q->m->weight_dtype(ck->t[i].dtype) || q->role[i] == TPS_QR_WEIGHT ||
            !has_suffix(ck->t[i].name, ".weight", &stem))
            continue;
        return tps_fail(ctx, TPS_E_SHAPE,
                        "%s: FP8 weight '%s' has no scale beside it ('%.*s.weight_scale_inv' or "
                        "'%.*s.weight_scale'): it cannot be dequantized",
                        ck->path, ck->t[i].name, (int)stem, ck->t[i].name, (int)stem, ck->t[i].name);
    }
    return TPS_OK;
}

tps_err tps_quant_open(tps_ctx *ctx, const tps_ckpt *ck, tps_quant **out)
{
    *out = NULL;
    tps_err rc = TPS_OK;
    const cJSON *qc = tps_config_get(ck->config, "quantization_config");
    tps_quant *q = tps_xcalloc(1, sizeof *q);
    if (!q) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    size_t n = ck->n ? ck->n : 1;
    q->role = tps_xcalloc(n, sizeof *q->role);
    q->partner = tps_xmalloc(n * sizeof *q->partner);
    q->input = tps_xmalloc(n * sizeof *q->input);
    q->kind = tps_xcalloc(n, sizeof *q->kind);
    TPS_FAIL_IF(!q->role || !q->partner || !q->input || !q->kind, ctx, TPS_E_NOMEM,
                "out of memory");
    for (size_t i = 0; i < ck->n; i++) q->partner[i] = q->input[i] = -1;
    if (qc) TPS_CHECK(method_of(ctx, ck, qc, q));
    TPS_CHECK(find_parts(ctx, ck, qc, q));
    if (!qc) {
        tps_quant_free(q);
        q = NULL;
    }
out:
    if (rc) {
        tps_quant_free(q);
        q = NULL;
    }
    *out = q;
    return rc;
}

tps_err tps_ckpt_quantization(tps_ctx *ctx, const tps_ckpt *ck, tps_quant_view *v)
{
    memset(v, 0, sizeof *v);
    const cJSON *m =
        cJSON_GetObjectItemCaseSensitive(tps_config_get(ck->config, "quantization_config"),
                                         "quant_method");
    tps_quant *q = NULL;
    tps_err rc = tps_quant_open(ctx, ck, &q);
    if (rc == TPS_E_NOMEM) return rc;
    if (rc) { /* inspect shows what split would refuse, and why */
        v->method = cJSON_IsString(m) ? m->valuestring : "(unknown)";
        v->problem = tps_ctx_errmsg(ctx);
        return TPS_OK;
    }
    if (!q) return TPS_OK;
    v->method = q->method_name;
    v->supported = 1;
    v->block_rows = q->bn;
    v->block_cols = q->bk;
    v->weights = q->nquant;
    for (size_t i = 0; i < ck->n; i++) {
        if (q->role[i] == TPS_QR_INPUT_SCALE) v->input_scales++;
        if (q->role[i] != TPS_QR_SCALE) continue;
        if (q->kind[i] == TPS_QS_BLOCK) v->block_scales++;
        else if (q->kind[i] == TPS_QS_CHANNEL) v->channel_scales++;
        else v->tensor_scales++;
    }
    tps_quant_free(q);
    return TPS_OK;
}
