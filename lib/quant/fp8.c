/* fp8.c - the FP8 methods: what their configs say, the tensors they store
 * beside a weight, and the dequantize kernel verify runs.
 *
 *   fp8                 (DeepSeek-V3, Qwen3-FP8: quantization_config
 *                        quant_method fp8) block FP8 with weight_block_size
 *                        [bn, bk]: X.weight F8 [out, in], X.weight_scale_inv
 *                        [ceil(out / bn), ceil(in / bk)]; without blocks
 *                        per-tensor FP8, X.weight_scale [] or [1]
 *   compressed-tensors  (float-quantized, 8 bits) X.weight_scale per tensor,
 *                        per channel [out, 1] or per block
 * Both may carry static activation scales, X.input_scale, one value each. */
#include "internal.h"

#include <string.h>

static int is_f8(tps_dtype d)
{
    return d == TPS_F8_E4M3 || d == TPS_F8_E5M2 || d == TPS_F8_E4M3FNUZ || d == TPS_F8_E5M2FNUZ;
}

/* w *= its scale: one per tensor, one per output row (channel), or one per
 * bn x bk block. A colwise rank (d 0) holds the scales of its rows only; a
 * rowwise one (d 1) those of its block columns. */
static void scaled_row(const tps_qscales *S, uint64_t j, uint64_t col0, float *w, size_t width)
{
    const float *s = S->s;
    if (S->kind == TPS_QS_TENSOR) {
        for (size_t k = 0; k < width; k++) w[k] *= s[0];
        return;
    }
    if (S->kind == TPS_QS_CHANNEL) {
        float sj = s[S->d == 0 ? j - S->lo : j];
        for (size_t k = 0; k < width; k++) w[k] *= sj;
        return;
    }
    uint64_t br = j / S->bn;
    if (S->d == 0) br -= S->lo;
    for (size_t k = 0; k < width; k++) {
        uint64_t bc = (col0 + k) / S->bk;
        if (S->d == 1) bc -= S->lo;
        w[k] *= s[br * S->width + bc];
    }
}

static tps_err fp8_config(tps_ctx *ctx, const tps_ckpt *ck, const cJSON *qc, tps_quant *q)
{
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(qc, "weight_block_size");
    if (b && !cJSON_IsNull(b))
        TPS_TRY(tps_quant_block_of(ctx, ck, "quantization_config.weight_block_size", b, &q->bn,
                                   &q->bk));
    return TPS_OK;
}

/* compressed-tensors: every config group must quantize weights to 8-bit
 * floats; the block structure, if any, must be one. */
static tps_err ct_config(tps_ctx *ctx, const tps_ckpt *ck, const cJSON *qc, tps_quant *q)
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
            TPS_TRY(tps_quant_block_of(ctx, ck, "quantization_config ... weights.block_structure",
                                       cJSON_GetObjectItemCaseSensitive(w, "block_structure"), &bn,
                                       &bk));
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

#define BIT(k) (1u << (k))

/* quant_method fp8 names block scales weight_scale_inv; AutoFP8's
 * per-tensor (and per-channel) ones are weight_scale. */
static const tps_qpart fp8_parts[] = {
    {.suffix = ".weight_scale_inv", .role = TPS_QR_SCALE, .kinds = TPS_QS_ALL},
    {.suffix = ".weight_scale", .role = TPS_QR_SCALE, .kinds = BIT(TPS_QS_TENSOR) | BIT(TPS_QS_CHANNEL)},
    {.suffix = ".input_scale", .role = TPS_QR_INPUT_SCALE, .kinds = BIT(TPS_QS_TENSOR)},
};

static const tps_qpart ct_parts[] = {
    {.suffix = ".weight_scale_inv", .role = TPS_QR_SCALE, .kinds = TPS_QS_ALL},
    {.suffix = ".weight_scale", .role = TPS_QR_SCALE, .kinds = TPS_QS_ALL},
    {.suffix = ".input_scale", .role = TPS_QR_INPUT_SCALE, .kinds = BIT(TPS_QS_TENSOR)},
};

const tps_qmethod tps_qm_fp8 = {
    .name = "fp8",
    .what = "FP8 weights with block or per-tensor scales",
    .read_config = fp8_config,
    .weight_dtype = is_f8,
    .parts = fp8_parts,
    .nparts = sizeof fp8_parts / sizeof fp8_parts[0],
    .dequant_row = scaled_row,
};

const tps_qmethod tps_qm_ct_fp8 = {
    .name = "compressed-tensors",
    .what = "8-bit float weights, float-quantized",
    .select = "format",
    .formats = "- float-quantized naive-quantized",
    .read_config = ct_config,
    .weight_dtype = is_f8,
    .parts = ct_parts,
    .nparts = sizeof ct_parts / sizeof ct_parts[0],
    .dequant_row = scaled_row,
};
