/* nvfp4.c - NVFP4 (4-bit e2m1 floats, two to a byte, an F8_E4M3 scale per
 * 16 of them along the input and one F32 global scale per weight), as NVIDIA
 * ModelOpt and compressed-tensors store it:
 *
 *   modelopt (quant_algo NVFP4)       X.weight U8 [out, in / 2],
 *                                     X.weight_scale F8_E4M3 [out, in / 16],
 *                                     X.weight_scale_2 F32 [] (global),
 *                                     X.input_scale F32 [] (activations)
 *   compressed-tensors                X.weight_packed U8 [out, in / 2],
 *     (format nvfp4-pack-quantized)   X.weight_scale F8_E4M3 [out, in / 16],
 *                                     X.weight_global_scale F32 [1],
 *                                     X.input_global_scale F32 [1] (W4A4)
 *
 * vLLM 0.33 (quantization/modelopt.py KNvfp4Static/Dynamic,
 * compressed_tensors_w4a4_nvfp4.py) loads them as stored, the global and
 * input scales as PerTensorScaleParameters of one F32 slot per fused part. */
#include "internal.h"

#include <math.h>
#include <string.h>

static int is_u8(tps_dtype d) { return d == TPS_U8; }

#define BIT(k) (1u << (k))

static tps_err modelopt_config(tps_ctx *ctx, const tps_ckpt *ck, const cJSON *qc, tps_quant *q)
{
    const cJSON *gs = cJSON_GetObjectItemCaseSensitive(qc, "group_size");
    const cJSON *kv = cJSON_GetObjectItemCaseSensitive(qc, "kv_cache_quant_algo");
    if (gs && (!cJSON_IsNumber(gs) || gs->valuedouble != 16))
        return tps_fail(ctx, TPS_E_REJECT,
                        "%s: quantization_config.group_size must be 16 for NVFP4 (vLLM 0.33's "
                        "ModelOpt NVFP4 kernels use 16-element blocks)", ck->path);
    if (kv && !cJSON_IsNull(kv))
        return tps_fail(ctx, TPS_E_REJECT,
                        "%s: quantization_config.kv_cache_quant_algo is set: NVFP4 checkpoints "
                        "with KV cache scales are not supported yet", ck->path);
    q->bits = 4;
    q->group = 16;
    q->asym = 1; /* input_scale: W4A4 */
    return TPS_OK;
}

static tps_err ct_nvfp4_config(tps_ctx *ctx, const tps_ckpt *ck, const cJSON *qc, tps_quant *q)
{
    const cJSON *groups = cJSON_GetObjectItemCaseSensitive(qc, "config_groups");
    int seen = 0;
    for (const cJSON *g = cJSON_IsObject(groups) ? groups->child : NULL; g; g = g->next) {
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(g, "weights");
        if (!cJSON_IsObject(w)) continue;
        const cJSON *bits = cJSON_GetObjectItemCaseSensitive(w, "num_bits");
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(w, "type");
        const cJSON *gs = cJSON_GetObjectItemCaseSensitive(w, "group_size");
        const cJSON *ia = cJSON_GetObjectItemCaseSensitive(g, "input_activations");
        if (!cJSON_IsNumber(bits) || bits->valueint != 4 || !cJSON_IsString(type) ||
            strcmp(type->valuestring, "float") || !cJSON_IsNumber(gs) || gs->valuedouble != 16)
            return tps_fail(ctx, TPS_E_REJECT,
                            "%s: compressed-tensors group '%s' of format nvfp4-pack-quantized is "
                            "not 4-bit floats in groups of 16: not supported",
                            ck->path, g->string ? g->string : "?");
        int a4 = ia && cJSON_IsObject(ia);
        if (seen && a4 != q->asym)
            return tps_fail(ctx, TPS_E_REJECT,
                            "%s: compressed-tensors groups mix W4A4 and W4A16: not supported",
                            ck->path);
        q->asym = a4;
        seen = 1;
    }
    if (!seen)
        return tps_fail(ctx, TPS_E_CONFIG,
                        "%s: quantization_config.config_groups has no weights entry", ck->path);
    q->bits = 4;
    q->group = 16;
    return TPS_OK;
}

/* w = e2m1(code) x e4m3 scale x global (zero points: none). */
static float nvfp4_dequant(const tps_quant *q, unsigned code, double zero, float scale, float global)
{
    static const float mag[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    (void)q;
    (void)zero;
    float v = (code & 8) ? -mag[code & 7] : mag[code & 7];
    return v * scale * global;
}

/* compressed-tensors stores the global scale's inverse (weight_global_scale). */
static float ct_global(float g) { return g != 0 ? 1.0f / g : 0; }

static const tps_qpart modelopt_parts[] = {
    {.suffix = ".weight", .role = TPS_QR_WEIGHT, .in_by = 2},
    {.suffix = ".weight_scale", .role = TPS_QR_SCALE, .kinds = BIT(TPS_QS_GROUP), .in_by = 1},
    {.suffix = ".weight_scale_2", .role = TPS_QR_SCALE, .kinds = BIT(TPS_QS_TENSOR),
     .per_tensor = 1},
    {.suffix = ".input_scale", .role = TPS_QR_INPUT_SCALE, .kinds = BIT(TPS_QS_TENSOR),
     .per_tensor = 1, .optional = 1},
};

static const tps_qpart ct_nvfp4_parts[] = {
    {.suffix = ".weight_packed", .role = TPS_QR_WEIGHT, .in_by = 2},
    {.suffix = ".weight_scale", .role = TPS_QR_SCALE, .kinds = BIT(TPS_QS_GROUP), .in_by = 1},
    {.suffix = ".weight_global_scale", .role = TPS_QR_SCALE, .kinds = BIT(TPS_QS_TENSOR),
     .per_tensor = 1},
    {.suffix = ".input_global_scale", .role = TPS_QR_INPUT_SCALE, .kinds = BIT(TPS_QS_TENSOR),
     .per_tensor = 1, .optional = 1},
};

const tps_qmethod tps_qm_nvfp4 = {
    .name = "modelopt",
    .what = "NVFP4: e2m1 codes two to a byte, F8_E4M3 scales per 16, an F32 global scale",
    .read_config = modelopt_config,
    .weight_dtype = is_u8,
    .parts = modelopt_parts,
    .nparts = sizeof modelopt_parts / sizeof modelopt_parts[0],
    .weight_suffix = ".weight",
    .transposed = 0,
    .select = "quant_algo",
    .formats = "NVFP4",
    .dequant = nvfp4_dequant,
    .pad_word = tps_qk_pad_zero,
};

const tps_qmethod tps_qm_ct_nvfp4 = {
    .name = "compressed-tensors",
    .what = "NVFP4, nvfp4-pack-quantized",
    .read_config = ct_nvfp4_config,
    .weight_dtype = is_u8,
    .parts = ct_nvfp4_parts,
    .nparts = sizeof ct_nvfp4_parts / sizeof ct_nvfp4_parts[0],
    .weight_suffix = ".weight_packed",
    .transposed = 0,
    .select = "format",
    .formats = "nvfp4-pack-quantized",
    .dequant = nvfp4_dequant,
    .global_scale = ct_global,
    .pad_word = tps_qk_pad_zero,
};
