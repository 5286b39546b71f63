/* quant.c - quantized checkpoints: which tensors are FP8 weights, which are
 * their scales, and how a scale's shape relates to its weight's.
 *
 * Supported: block FP8 (quantization_config quant_method "fp8" with
 * weight_block_size [bn, bk]: X.weight F8 [out, in], X.weight_scale_inv
 * [ceil(out / bn), ceil(in / bk)]), per-tensor FP8 (quant_method "fp8"
 * without blocks: X.weight_scale [] or [1]), and compressed-tensors FP8
 * (float-quantized, 8 bits: X.weight_scale per tensor, per channel [out, 1]
 * or per block). Static activation scales (X.input_scale) are per tensor.
 * Any other quant_method is refused: splitting its packed integers or
 * grouped scales as if they were plain tensors would give shards that
 * dequantize to garbage while every byte checks out. */
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

static int is_f8(tps_dtype d)
{
    return d == TPS_F8_E4M3 || d == TPS_F8_E5M2 || d == TPS_F8_E4M3FNUZ || d == TPS_F8_E5M2FNUZ;
}

void tps_quant_free(tps_quant *q)
{
    if (!q) return;
    free(q->role);
    free(q->partner);
    free(q->input);
    free(q->kind);
    free(q);
}

/* [bn, bk]: two positive integers, or an error naming where. */
static tps_err block_of(tps_ctx *ctx, const tps_ckpt *ck, const char *where, const cJSON *b,
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

/* compressed-tensors: every config group must quantize weights to 8-bit
 * floats; the block structure, if any, must be one. */
static tps_err ct_groups(tps_ctx *ctx, const tps_ckpt *ck, const cJSON *qc, tps_quant *q)
{
    const cJSON *groups = cJSON_GetObjectItemCaseSensitive(qc, "config_groups");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(qc, "format");
    if (cJSON_IsString(fmt) && strcmp(fmt->valuestring, "float-quantized") &&
        strcmp(fmt->valuestring, "naive-quantized"))
        return tps_fail(ctx, TPS_E_REJECT,
                        "%s: compressed-tensors format '%s' is not supported yet (only FP8: "
                        "float-quantized)",
                        ck->path, fmt->valuestring);
    for (const cJSON *g = cJSON_IsObject(groups) ? groups->child : NULL; g; g = g->next) {
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(g, "weights");
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(w, "type");
        const cJSON *bits = cJSON_GetObjectItemCaseSensitive(w, "num_bits");
        const cJSON *strat = cJSON_GetObjectItemCaseSensitive(w, "strategy");
        if (!cJSON_IsObject(w)) continue;
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "float") || !cJSON_IsNumber(bits) ||
            bits->valueint != 8)
            return tps_fail(ctx, TPS_E_REJECT,
                            "%s: compressed-tensors group '%s' quantizes weights to %s%s%d bits: "
                            "not supported yet (only 8-bit floats, FP8)",
                            ck->path, g->string ? g->string : "?",
                            cJSON_IsString(type) ? type->valuestring : "?",
                            cJSON_IsString(type) ? " " : "", cJSON_IsNumber(bits) ? bits->valueint : 0);
        if (cJSON_IsString(strat) && !strcmp(strat->valuestring, "block")) {
            uint64_t bn, bk;
            TPS_TRY(block_of(ctx, ck, "quantization_config ... weights.block_structure",
                             cJSON_GetObjectItemCaseSensitive(w, "block_structure"), &bn, &bk));
            if (q->bn && (q->bn != bn || q->bk != bk))
                return tps_fail(ctx, TPS_E_REJECT,
                                "%s: compressed-tensors groups use two block sizes: not supported yet",
                                ck->path);
            q->bn = bn;
            q->bk = bk;
        } else if (cJSON_IsString(strat) && strcmp(strat->valuestring, "tensor") &&
                   strcmp(strat->valuestring, "channel")) {
            return tps_fail(ctx, TPS_E_REJECT,
                            "%s: compressed-tensors weight strategy '%s' is not supported yet "
                            "(only tensor, channel and block)",
                            ck->path, strat->valuestring);
        }
    }
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

tps_err tps_quant_open(tps_ctx *ctx, const tps_ckpt *ck, tps_quant **out)
{
    *out = NULL;
    tps_err rc = TPS_OK;
    const cJSON *qc = tps_config_get(ck->config, "quantization_config");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(qc, "quant_method");
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
    if (qc) {
        TPS_FAIL_IF(!cJSON_IsString(m), ctx, TPS_E_CONFIG,
                    "%s: quantization_config has no quant_method", ck->path);
        q->method_name = m->valuestring;
        if (!strcmp(m->valuestring, "fp8")) {
            q->method = TPS_QM_FP8;
            const cJSON *b = cJSON_GetObjectItemCaseSensitive(qc, "weight_block_size");
            if (b && !cJSON_IsNull(b))
                TPS_CHECK(block_of(ctx, ck, "quantization_config.weight_block_size", b, &q->bn, &q->bk));
        } else if (!strcmp(m->valuestring, "compressed-tensors")) {
            q->method = TPS_QM_CT;
            TPS_CHECK(ct_groups(ctx, ck, qc, q));
        } else {
            TPS_FAIL_IF(1, ctx, TPS_E_REJECT,
                        "%s: quant_method '%s' is not supported yet: tpshard splits FP8 "
                        "checkpoints (quant_method fp8, or compressed-tensors with 8-bit float "
                        "weights); it will not cut packed or grouped quantized weights as if they "
                        "were plain tensors",
                        ck->path, m->valuestring);
        }
    }
    /* Scales and their weights. */
    static const char *const scale_suffix[] = {".weight_scale_inv", ".weight_scale"};
    for (size_t i = 0; i < ck->n; i++) {
        const tps_ctensor *s = &ck->t[i];
        size_t stem;
        int which = -1;
        for (int k = 0; k < 2 && which < 0; k++)
            if (has_suffix(s->name, scale_suffix[k], &stem)) which = k;
        int input = which < 0 && has_suffix(s->name, ".input_scale", &stem);
        if (which < 0 && !input) {
            size_t st2;
            TPS_FAIL_IF(has_suffix(s->name, ".weight_zero_point", &st2) ||
                            has_suffix(s->name, ".qweight", &st2) ||
                            has_suffix(s->name, ".weight_packed", &st2),
                        ctx, TPS_E_REJECT,
                        "%s: tensor '%s' is part of an integer-quantized layer: not supported yet "
                        "(only FP8)",
                        ck->path, s->name);
            continue;
        }
        TPS_FAIL_IF(!qc, ctx, TPS_E_CONFIG,
                    "%s: tensor '%s' is a quantization scale, but config.json has no "
                    "quantization_config saying how it relates to its weight",
                    ck->path, s->name);
        char *wn = tps_asprintf("%.*s.weight", (int)stem, s->name);
        TPS_FAIL_IF(!wn, ctx, TPS_E_NOMEM, "out of memory");
        int w = tps_ckpt_find(ck, wn);
        free(wn);
        if (input) {
            tps_qscale k;
            TPS_FAIL_IF(w < 0, ctx, TPS_E_SHAPE, "%s: input scale '%s' has no weight beside it",
                        ck->path, s->name);
            TPS_FAIL_IF(!scale_fits(q, &ck->t[w], s, &k) || k != TPS_QS_TENSOR, ctx, TPS_E_SHAPE,
                        "%s: input scale '%s' must hold one value ([] or [1])", ck->path, s->name);
            q->role[i] = TPS_QR_INPUT_SCALE;
            q->partner[i] = w;
            q->input[w] = (int)i;
            continue;
        }
        TPS_FAIL_IF(w < 0, ctx, TPS_E_SHAPE,
                    "%s: scale '%s' has no weight '%.*s.weight' beside it", ck->path, s->name,
                    (int)stem, s->name);
        const tps_ctensor *wt = &ck->t[w];
        TPS_FAIL_IF(!is_f8(wt->dtype), ctx, TPS_E_SHAPE,
                    "%s: scale '%s' belongs to '%s', which is %s, not an FP8 weight", ck->path,
                    s->name, wt->name, tps_dtype_name(wt->dtype));
        TPS_FAIL_IF(q->partner[w] >= 0, ctx, TPS_E_SHAPE, "%s: weight '%s' has two scales",
                    ck->path, wt->name);
        TPS_FAIL_IF(!tps_dtype_is_float(s->dtype) || tps_dtype_bits(s->dtype) < 8, ctx, TPS_E_SHAPE,
                    "%s: scale '%s' is %s, not a float dtype", ck->path, s->name,
                    tps_dtype_name(s->dtype));
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
            TPS_FAIL_IF(1, ctx, TPS_E_SHAPE,
                        "%s: scale '%s' has shape of %d dims not matching its weight '%s' %s: "
                        "expected %s",
                        ck->path, s->name, s->ndim, wt->name,
                        wt->ndim == 2 ? "[out, in]" : "", want);
        }
        TPS_FAIL_IF(k == TPS_QS_BLOCK && q->method == TPS_QM_FP8 && which != 0, ctx, TPS_E_SHAPE,
                    "%s: block scale '%s': quant_method fp8 names them weight_scale_inv", ck->path,
                    s->name);
        q->role[i] = TPS_QR_SCALE;
        q->kind[i] = k;
        q->partner[i] = w;
        q->role[w] = TPS_QR_WEIGHT;
        q->partner[w] = (int)i;
        q->nquant++;
    }
    /* An FP8 weight needs its scale (unquantized modules are not FP8). */
    for (size_t i = 0; qc && i < ck->n; i++) {
        size_t stem;
        if (!is_f8(ck->t[i].dtype) || q->role[i] == TPS_QR_WEIGHT ||
            !has_suffix(ck->t[i].name, ".weight", &stem))
            continue;
        TPS_FAIL_IF(1, ctx, TPS_E_SHAPE,
                    "%s: FP8 weight '%s' has no scale beside it ('%.*s.weight_scale_inv' or "
                    "'%.*s.weight_scale'): it cannot be dequantized",
                    ck->path, ck->t[i].name, (int)stem, ck->t[i].name, (int)stem, ck->t[i].name);
    }
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
