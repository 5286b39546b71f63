/* gptq.c - the int32-packed methods of AutoGPTQ/GPTQModel and AutoAWQ.
 *
 * GPTQ (quant_method gptq, as AutoGPTQ and GPTQModel write it):
 * what its config says, and the tensors it stores per linear X:
 *
 *   X.qweight  I32 [in / pf, out]       codes of `bits` bits, pf = 32 / bits
 *                                       of them per word along the input dim
 *   X.scales   float [groups, out]      groups = in / group_size (1 when -1)
 *   X.qzeros   I32 [groups, out / pf]   zero points, packed along the output dim
 *   X.g_idx    I32 [in]                 the group of each input feature: no
 *                                       engine loads it
 *
 * w[o][i] = (q[i][o] - z[g][o]) * s[g][o], g = i / group_size. Only what
 * vLLM 0.33 loads is accepted (layers/quantization/auto_gptq.py): symmetric
 * codes of 4 or 8 bits, group sizes -1, 32, 64 and 128 (the Marlin kernels'),
 * desc_act only without groups (utils/gptq_utils.py refuses it otherwise). */
#include "internal.h"

#include <math.h>
#include <string.h>

static int is_i32(tps_dtype d) { return d == TPS_I32; }

/* quantization_config's field `key`: a boolean (*v), or an error naming it. */
static tps_err flag(tps_ctx *ctx, const tps_ckpt *ck, const cJSON *qc, const char *key, int dflt,
                    int *v)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(qc, key);
    if (!x || cJSON_IsNull(x)) {
        *v = dflt;
        return TPS_OK;
    }
    if (!cJSON_IsBool(x))
        return tps_fail(ctx, TPS_E_CONFIG, "%s: quantization_config.%s must be true or false",
                        ck->path, key);
    *v = cJSON_IsTrue(x);
    return TPS_OK;
}

static tps_err gptq_config(tps_ctx *ctx, const tps_ckpt *ck, const cJSON *qc, tps_quant *q)
{
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(qc, "bits");
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(qc, "group_size");
    if (!cJSON_IsNumber(b) || b->valuedouble != floor(b->valuedouble))
        return tps_fail(ctx, TPS_E_CONFIG, "%s: quantization_config.bits is %s, not an integer",
                        ck->path, b ? "not a number" : "missing");
    if (b->valuedouble != 4 && b->valuedouble != 8)
        return tps_fail(ctx, TPS_E_REJECT,
                        "%s: quantization_config.bits = %g: GPTQ with %g-bit codes is not "
                        "supported (vLLM 0.33 loads 4 and 8 bits only)",
                        ck->path, b->valuedouble, b->valuedouble);
    if (!cJSON_IsNumber(g) || g->valuedouble != floor(g->valuedouble))
        return tps_fail(ctx, TPS_E_CONFIG,
                        "%s: quantization_config.group_size is %s, not an integer", ck->path,
                        g ? "not a number" : "missing");
    int64_t gs = (int64_t)g->valuedouble;
    if (gs != -1 && gs != 32 && gs != 64 && gs != 128)
        return tps_fail(ctx, TPS_E_REJECT,
                        "%s: quantization_config.group_size = %lld: not supported (vLLM 0.33's "
                        "GPTQ kernels take -1, 32, 64 and 128)",
                        ck->path, (long long)gs);
    int sym, desc;
    TPS_TRY(flag(ctx, ck, qc, "sym", 1, &sym));
    TPS_TRY(flag(ctx, ck, qc, "desc_act", 0, &desc));
    if (!sym)
        return tps_fail(ctx, TPS_E_REJECT,
                        "%s: quantization_config.sym = false: asymmetric GPTQ is not supported "
                        "(vLLM 0.33 refuses it: Unsupported quantization config)",
                        ck->path);
    if (desc && gs != -1)
        return tps_fail(ctx, TPS_E_REJECT,
                        "%s: quantization_config.desc_act = true with group_size %lld: GPTQ "
                        "group activation ordering is not supported (vLLM 0.33 refuses it)",
                        ck->path, (long long)gs);
    q->bits = (int)b->valuedouble;
    q->group = gs;
    return TPS_OK;
}

/* ------------------------------------------------------------------ kernels */

float tps_qk_int(const tps_quant *q, unsigned code, double zero, float scale, float global)
{
    (void)q;
    (void)global;
    return (float)(((double)code - zero) * scale);
}

static uint32_t repeat_code(const tps_quant *q, uint32_t code)
{
    uint32_t w = 0;
    for (int k = 0; k < 32; k += q->bits) w |= code << k;
    return w;
}

/* Codes 2^(bits-1), the zero of uint4b8 / uint8b128 (0x88888888); GPTQ's
 * stored zero points one less (AutoGPTQ's v1 format stores zero - 1). */
static uint32_t gptq_pad(const tps_quant *q, tps_qrole role)
{
    uint32_t code = 1u << (q->bits - 1);
    if (role == TPS_QR_ZEROS) return repeat_code(q, code - 1);
    return role == TPS_QR_WEIGHT ? repeat_code(q, code) : 0;
}

uint32_t tps_qk_pad_biased(const tps_quant *q, tps_qrole role)
{
    return role == TPS_QR_WEIGHT ? repeat_code(q, 1u << (q->bits - 1)) : 0;
}

/* Codes equal to their zero points of 0 (AWQ, asymmetric codes; NVFP4's +0). */
uint32_t tps_qk_pad_zero(const tps_quant *q, tps_qrole role)
{
    (void)q;
    (void)role;
    return 0;
}

/* compressed-tensors: symmetric codes are biased, asymmetric ones pad with
 * zero points of 0. */
static uint32_t ct_wna16_pad(const tps_quant *q, tps_qrole role)
{
    return q->asym ? 0 : tps_qk_pad_biased(q, role);
}

/* AutoAWQ's order of the eight nibbles in a word: code k at nibble order[k]. */
static const int awq_order[8] = {0, 4, 1, 5, 2, 6, 3, 7};

#define BIT(k) (1u << (k))

static const tps_qpart gptq_parts[] = {
    {.suffix = ".qweight", .role = TPS_QR_WEIGHT, .in_by = 2},
    {.suffix = ".scales", .role = TPS_QR_SCALE, .kinds = BIT(TPS_QS_GROUP) | BIT(TPS_QS_CHANNEL),
     .in_by = 1},
    {.suffix = ".qzeros", .role = TPS_QR_ZEROS, .in_by = 1, .out_packed = 1},
    {.suffix = ".g_idx", .role = TPS_QR_UNUSED,
     .why = "GPTQ's input feature groups: vLLM 0.33 discards it (QuantizationConfig's weight "
            "mapper maps .g_idx to None)"},
};

const tps_qmethod tps_qm_gptq = {
    .name = "gptq",
    .what = "GPTQ 4- and 8-bit symmetric codes packed in int32 words",
    .read_config = gptq_config,
    .weight_dtype = is_i32,
    .parts = gptq_parts,
    .nparts = sizeof gptq_parts / sizeof gptq_parts[0],
    .weight_suffix = ".qweight",
    .transposed = 1,
    .scales_model_dtype = 1,
    /* auto_gptq.py AutoGPTQConfig.maybe_update_config: without the list, the
     * modules whose files hold non-float tensors are the quantized ones, and
     * is_layer_gptq_quantized looks for a fused module's parts (q_proj, not
     * qkv_proj): in rank files it finds none and builds the fused modules
     * unquantized, so that its own sharded_state loader raises KeyError */
    .module_list = "modules_in_block_to_quantize",
    .dequant = tps_qk_int,
    .zeros_ignored = 1, /* uint4b8 / uint8b128: vLLM reads no qzeros */
    .pad_word = gptq_pad,
};

/* An integer field of quantization_config under the first of two names. */
static tps_err int_field(tps_ctx *ctx, const tps_ckpt *ck, const cJSON *qc, const char *a,
                         const char *b, int64_t *v)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(qc, a);
    if (!x) x = cJSON_GetObjectItemCaseSensitive(qc, b);
    if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble))
        return tps_fail(ctx, TPS_E_CONFIG, "%s: quantization_config.%s (or %s) is %s, not an integer",
                        ck->path, a, b, x ? "not a number" : "missing");
    *v = (int64_t)x->valuedouble;
    return TPS_OK;
}

/* AWQ (layers/quantization/auto_awq.py AutoAWQConfig.from_config): bits
 * from w_bit or bits, the group from q_group_size or group_size, zero
 * points always stored; TYPE_MAP holds 4 bits only. */
static tps_err awq_config(tps_ctx *ctx, const tps_ckpt *ck, const cJSON *qc, tps_quant *q)
{
    int64_t bits, gs;
    TPS_TRY(int_field(ctx, ck, qc, "w_bit", "bits", &bits));
    TPS_TRY(int_field(ctx, ck, qc, "q_group_size", "group_size", &gs));
    if (bits != 4)
        return tps_fail(ctx, TPS_E_REJECT,
                        "%s: quantization_config.bits = %lld: AWQ with %lld-bit codes is not "
                        "supported (vLLM 0.33's AutoAWQConfig takes 4 bits only)",
                        ck->path, (long long)bits, (long long)bits);
    if (gs != -1 && gs != 32 && gs != 64 && gs != 128)
        return tps_fail(ctx, TPS_E_REJECT,
                        "%s: quantization_config.group_size = %lld: not supported (vLLM 0.33's "
                        "AWQ kernels take -1, 32, 64 and 128)",
                        ck->path, (long long)gs);
    int zp;
    TPS_TRY(flag(ctx, ck, qc, "zero_point", 1, &zp));
    if (!zp)
        return tps_fail(ctx, TPS_E_REJECT,
                        "%s: quantization_config.zero_point = false: AWQ without zero points is "
                        "not supported (vLLM 0.33's AWQ kernels read qzeros)",
                        ck->path);
    q->bits = 4;
    q->group = gs;
    return TPS_OK;
}

/* AutoAWQ's X.qweight I32 [in, out / 8] (packed along the output, nibbles
 * in the order 0 2 4 6 1 3 5 7 inside a word, which whole-word cuts keep),
 * X.qzeros I32 [in / group, out / 8], X.scales [in / group, out]. */
static const tps_qpart awq_parts[] = {
    {.suffix = ".qweight", .role = TPS_QR_WEIGHT, .out_packed = 1},
    {.suffix = ".scales", .role = TPS_QR_SCALE, .kinds = BIT(TPS_QS_GROUP) | BIT(TPS_QS_CHANNEL),
     .in_by = 1},
    {.suffix = ".qzeros", .role = TPS_QR_ZEROS, .in_by = 1, .out_packed = 1},
};

const tps_qmethod tps_qm_awq = {
    .name = "awq",
    .what = "AWQ 4-bit codes with zero points packed in int32 words along the output",
    .read_config = awq_config,
    .weight_dtype = is_i32,
    .parts = awq_parts,
    .nparts = sizeof awq_parts / sizeof awq_parts[0],
    .weight_suffix = ".qweight",
    .transposed = 1,
    .scales_model_dtype = 1,
    /* auto_awq.py AutoAWQConfig.maybe_update_config: without the list, the
     * modules of the files whose tensors are all floats; in rank files the
     * fused modules' names and a MoE's router (mlp.experts.gate) are not the
     * source's, so the router would be built quantized */
    .skip_list = "modules_to_not_convert",
    /* BaseAWQLinearMethod.create_weights: group_size -1 means input_size */
    .channel_rowwise_refusal = "vLLM 0.33's AWQ treats group_size -1 as one group of all "
                               "input features, which a row-parallel rank cannot hold (\"The "
                               "input size is not aligned with the quantized weight shape\")",
    .dequant = tps_qk_int,
    .code_order = awq_order,
    .pad_word = tps_qk_pad_zero,
};

/* ------------------------------------------------------------------ compressed-tensors WNA16 */

/* compressed-tensors pack-quantized (compressed_tensors_wNa16.py): every
 * config group's weights the same int codes, symmetric or with zero points,
 * by group or channel, without activation ordering (compressed_tensors.py
 * refuses actorder). Codes of bits that do not divide 32 straddle words:
 * vLLM packs ceil(in * bits / 32) words, tpshard does not cut them. */
static tps_err ct_wna16_config(tps_ctx *ctx, const tps_ckpt *ck, const cJSON *qc, tps_quant *q)
{
    const cJSON *groups = cJSON_GetObjectItemCaseSensitive(qc, "config_groups");
    int seen = 0;
    for (const cJSON *g = cJSON_IsObject(groups) ? groups->child : NULL; g; g = g->next) {
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(g, "weights");
        if (!cJSON_IsObject(w)) continue;
        const char *gn = g->string ? g->string : "?";
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(w, "type");
        const cJSON *bits = cJSON_GetObjectItemCaseSensitive(w, "num_bits");
        const cJSON *strat = cJSON_GetObjectItemCaseSensitive(w, "strategy");
        const cJSON *gs = cJSON_GetObjectItemCaseSensitive(w, "group_size");
        const cJSON *sym = cJSON_GetObjectItemCaseSensitive(w, "symmetric");
        const cJSON *act = cJSON_GetObjectItemCaseSensitive(w, "actorder");
        const cJSON *ia = cJSON_GetObjectItemCaseSensitive(g, "input_activations");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "int") || !cJSON_IsNumber(bits))
            return tps_fail(ctx, TPS_E_REJECT,
                            "%s: compressed-tensors group '%s' of format pack-quantized holds "
                            "weights that are not int codes: not supported", ck->path, gn);
        int b = bits->valueint;
        if (b != 2 && b != 4 && b != 8)
            return tps_fail(ctx, TPS_E_REJECT,
                            "%s: compressed-tensors group '%s': num_bits %d: not supported (tpshard "
                            "cuts whole int32 words: 2, 4 or 8 bits)", ck->path, gn, b);
        if (ia && !cJSON_IsNull(ia))
            return tps_fail(ctx, TPS_E_REJECT,
                            "%s: compressed-tensors group '%s' quantizes input activations: "
                            "only weight-only (WNA16) pack-quantized checkpoints are supported",
                            ck->path, gn);
        if (act && !cJSON_IsNull(act) && !(cJSON_IsString(act) && !strcmp(act->valuestring, "static")) &&
            !cJSON_IsFalse(act))
            return tps_fail(ctx, TPS_E_REJECT,
                            "%s: compressed-tensors group '%s': actorder: activation ordering "
                            "(g_idx) is not supported (vLLM 0.33 refuses it: no longer supported)",
                            ck->path, gn);
        int64_t group;
        if (cJSON_IsString(strat) && !strcmp(strat->valuestring, "channel")) {
            group = -1;
        } else if (cJSON_IsString(strat) && !strcmp(strat->valuestring, "group")) {
            if (!cJSON_IsNumber(gs) || gs->valuedouble < 1 || gs->valuedouble != floor(gs->valuedouble))
                return tps_fail(ctx, TPS_E_CONFIG,
                                "%s: compressed-tensors group '%s': strategy group needs a "
                                "positive integer group_size", ck->path, gn);
            group = (int64_t)gs->valuedouble;
        } else {
            return tps_fail(ctx, TPS_E_REJECT,
                            "%s: compressed-tensors group '%s': weight strategy %s: not supported "
                            "(vLLM 0.33's WNA16 takes group and channel)",
                            ck->path, gn, cJSON_IsString(strat) ? strat->valuestring : "(none)");
        }
        int asym = cJSON_IsFalse(sym);
        if (seen && (q->bits != b || q->group != group || q->asym != asym))
            return tps_fail(ctx, TPS_E_REJECT,
                            "%s: compressed-tensors groups quantize with different bits, groups or "
                            "symmetry: not supported", ck->path);
        q->bits = b;
        q->group = group;
        q->asym = asym;
        seen = 1;
    }
    if (!seen)
        return tps_fail(ctx, TPS_E_CONFIG,
                        "%s: quantization_config.config_groups has no weights entry", ck->path);
    return TPS_OK;
}

/* weight_packed I32 [out, in / pf] (pack_to_int32 along the input),
 * weight_scale [out, groups], weight_zero_point I32 [out / pf, groups]
 * (asymmetric), weight_shape I64 [2] = the weight's [out, in]. */
static const tps_qpart ct_wna16_parts[] = {
    {.suffix = ".weight_packed", .role = TPS_QR_WEIGHT, .in_by = 2},
    {.suffix = ".weight_scale", .role = TPS_QR_SCALE, .kinds = BIT(TPS_QS_GROUP) | BIT(TPS_QS_CHANNEL),
     .in_by = 1},
    {.suffix = ".weight_zero_point", .role = TPS_QR_ZEROS, .in_by = 1, .out_packed = 1,
     .optional = 1},
    {.suffix = ".weight_shape", .role = TPS_QR_SHAPE},
};

const tps_qmethod tps_qm_ct_wna16 = {
    .name = "compressed-tensors",
    .what = "int codes packed in int32 words, pack-quantized (WNA16)",
    .read_config = ct_wna16_config,
    .weight_dtype = is_i32,
    .parts = ct_wna16_parts,
    .nparts = sizeof ct_wna16_parts / sizeof ct_wna16_parts[0],
    .weight_suffix = ".weight_packed",
    .transposed = 0,
    .scales_model_dtype = 1,
    .select = "format",
    .formats = "pack-quantized",
    .dequant = tps_qk_int,
    .pad_word = ct_wna16_pad,
};
