/* mxfp4.c - MXFP4 (quant_method mxfp4, gpt-oss): OCP microscaling FP4
 * experts, the rest of the model unquantized. Per experts module X
 * (model.layers.N.mlp.experts) and projection P (gate_up_proj, down_proj):
 *
 *   X.P_blocks  U8 [E, rows, cols / 32, 16]  32 e2m1 codes per block, two
 *                                            to a byte, low nibble first
 *   X.P_scales  U8 [E, rows, cols / 32]      one E8M0 exponent per block
 *   X.P_bias    BF16 [E, rows]               (plain)
 *
 * gate_up_proj: rows 2 * intermediate_size (gate and up rows interleaved,
 * row 2j gate, 2j + 1 up), cols hidden_size; down_proj: rows hidden_size,
 * cols intermediate_size; E = num_local_experts. A value is
 * e2m1(code) * 2^(scale - 127). vLLM 0.33 (quantization/mxfp4.py
 * GptOssMxfp4Config) takes quant_method mxfp4 for model_type gpt_oss only.
 *
 * What this entry holds: the config reader, the shape rules every blocks
 * and scales pair must meet against config.json (a mismatch is an error
 * naming the tensor and the field), and the MoE backends' round-ups of
 * vLLM's MXFP4 expert parameters. The tensors keep the plain role: the
 * DTensor layout replicates them whole (transformers' GptOss TP plan leaves
 * the experts out), and vLLM's layout places them as its gpt-oss loader
 * does (lib/layout/layout_mxfp4.c). */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int is_u8(tps_dtype d) { return d == TPS_U8; }

static tps_err mxfp4_config(tps_ctx *ctx, const tps_ckpt *ck, const cJSON *qc, tps_quant *q)
{
    (void)qc;
    const cJSON *mt = tps_config_get(ck->config, "model_type");
    if (!cJSON_IsString(mt) || strcmp(mt->valuestring, "gpt_oss"))
        return tps_fail(ctx, TPS_E_REJECT,
                        "%s: quant_method mxfp4 on model_type %s: MXFP4 is split for gpt-oss "
                        "only (vLLM 0.33's GptOssMxfp4Config takes it for model_type gpt_oss "
                        "only)",
                        ck->path, cJSON_IsString(mt) ? mt->valuestring : "(none)");
    q->bits = 4;
    q->group = 32;
    return TPS_OK;
}

/* A positive integer of config.json, or an error naming it. */
static tps_err count(tps_ctx *ctx, const tps_ckpt *ck, const char *field, const char *alias,
                     uint64_t *v)
{
    const cJSON *x = tps_config_get(ck->config, field);
    if (!x && alias) x = tps_config_get(ck->config, alias);
    if (!cJSON_IsNumber(x) || x->valuedouble < 1 || x->valuedouble > 1e12 ||
        x->valuedouble != floor(x->valuedouble))
        return tps_fail(ctx, TPS_E_CONFIG,
                        "%s: config.json's %s is %s: MXFP4 experts need it (a positive integer) "
                        "to check their blocks and scales",
                        ck->path, field, x ? "not a positive integer" : "missing");
    *v = (uint64_t)x->valuedouble;
    return TPS_OK;
}

static int has_suffix(const char *s, const char *suf, size_t *stem)
{
    size_t a = strlen(s), b = strlen(suf);
    if (a <= b || strcmp(s + a - b, suf)) return 0;
    *stem = a - b;
    return 1;
}

/* The [rows, cols] projection `leaf` of the experts holds, from config.json. */
static int proj_shape(const char *leaf, size_t len, uint64_t H, uint64_t I, uint64_t *rows,
                      uint64_t *cols, const char **rows_is, const char **cols_is)
{
    if (len == 12 && !memcmp(leaf, "gate_up_proj", 12)) {
        *rows = 2 * I, *cols = H;
        *rows_is = "2 x intermediate_size", *cols_is = "hidden_size";
        return 1;
    }
    if (len == 9 && !memcmp(leaf, "down_proj", 9)) {
        *rows = H, *cols = I;
        *rows_is = "hidden_size", *cols_is = "intermediate_size";
        return 1;
    }
    return 0;
}

static void shape_str(const tps_ctensor *t, char *buf, size_t len)
{
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < t->ndim && o < len; d++)
        o += (size_t)snprintf(buf + o, len - o, "%s%llu", d ? ", " : "",
                              (unsigned long long)t->shape[d]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

/* Every X.P_blocks with its X.P_scales, both of the shapes config.json
 * gives; a scales tensor without its blocks is an error. */
static tps_err mxfp4_bind(tps_ctx *ctx, const tps_ckpt *ck, tps_quant *q)
{
    uint64_t H, I, E;
    int any = 0;
    for (size_t i = 0; i < ck->n && !any; i++) {
        size_t stem;
        any = has_suffix(ck->t[i].name, TPS_MXFP4_BLOCKS, &stem) ||
              has_suffix(ck->t[i].name, TPS_MXFP4_SCALES, &stem);
    }
    if (!any) return TPS_OK; /* nothing quantized: the plain tensors say the rest */
    TPS_TRY(count(ctx, ck, "hidden_size", NULL, &H));
    TPS_TRY(count(ctx, ck, "intermediate_size", NULL, &I));
    TPS_TRY(count(ctx, ck, "num_local_experts", "num_experts", &E));
    if (H % 32 || I % 32)
        return tps_fail(ctx, TPS_E_CONFIG,
                        "%s: config.json's %s = %llu is not a multiple of 32, the MXFP4 block",
                        ck->path, H % 32 ? "hidden_size" : "intermediate_size",
                        (unsigned long long)(H % 32 ? H : I));
    for (size_t i = 0; i < ck->n; i++) {
        const tps_ctensor *t = &ck->t[i];
        size_t stem;
        int blocks = has_suffix(t->name, TPS_MXFP4_BLOCKS, &stem);
        if (!blocks && !has_suffix(t->name, TPS_MXFP4_SCALES, &stem)) continue;
        const char *dot = memrchr(t->name, '.', stem);
        const char *leaf = dot ? dot + 1 : t->name;
        size_t ll = stem - (size_t)(leaf - t->name);
        uint64_t rows, cols;
        const char *rows_is, *cols_is;
        if (!proj_shape(leaf, ll, H, I, &rows, &cols, &rows_is, &cols_is))
            return tps_fail(ctx, TPS_E_SHAPE,
                            "%s: tensor '%s': quant_method mxfp4 stores gpt-oss's experts "
                            "gate_up_proj and down_proj; '%.*s' is not one of them",
                            ck->path, t->name, (int)ll, leaf);
        char *pn = tps_asprintf("%.*s%s", (int)stem, t->name,
                                blocks ? TPS_MXFP4_SCALES : TPS_MXFP4_BLOCKS);
        if (!pn) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
        int k = tps_ckpt_find(ck, pn);
        if (k < 0) {
            tps_err rc = tps_fail(ctx, TPS_E_SHAPE,
                                  "%s: MXFP4 tensor '%s' has no '%s' beside it: %s",
                                  ck->path, t->name, pn,
                                  blocks ? "its codes cannot be dequantized"
                                         : "a scale without its codes");
            free(pn);
            return rc;
        }
        free(pn);
        uint64_t want[4] = {E, rows, cols / 32, 16};
        int nd = blocks ? 4 : 3, ok = t->ndim == nd && is_u8(t->dtype);
        for (int d = 0; ok && d < nd; d++) ok = t->shape[d] == want[d];
        if (!ok) {
            char got[96];
            shape_str(t, got, sizeof got);
            return tps_fail(ctx, TPS_E_SHAPE,
                            "%s: MXFP4 tensor '%s' is %s %s, but config.json says it must be U8 "
                            "[%llu, %llu, %llu%s] (num_local_experts, %s, %s / 32%s)",
                            ck->path, t->name, tps_dtype_name(t->dtype), got,
                            (unsigned long long)E, (unsigned long long)rows,
                            (unsigned long long)(cols / 32), blocks ? ", 16" : "", rows_is,
                            cols_is, blocks ? ", 16 bytes of 32 codes" : "");
        }
        if (blocks) q->nquant++;
    }
    return TPS_OK;
}

/* vLLM 0.33 layers/fused_moe/oracle/mxfp4.py
 * mxfp4_round_up_hidden_size_and_intermediate_size, by the --moe-backend
 * name that selects each (map_mxfp4_backend); a CUDA platform. */
static const tps_moe_backend backends[] = {
    {"triton", 1, 64, "Triton (OAI triton_kernels): intermediate x64, hidden as is"},
    {"triton_unfused", 1, 64, "Triton unfused: intermediate x64, hidden as is"},
    {"marlin", 256, 128, "Marlin: intermediate x128, hidden x256"},
    {"flashinfer_trtllm", 256, 128, "FlashInfer TRT-LLM: intermediate x128, hidden x256"},
    {"flashinfer_cutlass", 128, 128, "FlashInfer CUTLASS: both x128"},
    {"cutlass", 128, 128, "CUTLASS MXFP4 x MXFP4: both x128"},
    {"deep_gemm", 128, 128, "DeepGEMM: both x128"},
    {"deepgemm", 128, 128, "DeepGEMM (vLLM's deep_gemm): both x128"},
    {"cpu", 32, 32, "CPU (AMX, BLOCK_N 32): both x32"},
    {"emulation", 32, 32, "emulation: both x32 (the MX block)"},
};

const tps_moe_backend *tps_moe_backend_find(const char *name)
{
    for (size_t i = 0; name && i < sizeof backends / sizeof backends[0]; i++)
        if (!strcmp(name, backends[i].name)) return &backends[i];
    return NULL;
}

const tps_moe_backend *tps_moe_backend_list(size_t *n)
{
    *n = sizeof backends / sizeof backends[0];
    return backends;
}

/* One weight: e2m1(code) x scale, the scale an E8M0 exponent as f32
 * (2^(e - 127)). e2m1 (OCP MX): a sign bit, then +/- {0, 0.5, 1, 1.5, 2, 3,
 * 4, 6}; codes two to a byte, low nibble first. */
static float mxfp4_dequant(const tps_quant *q, unsigned code, double zero, float scale,
                           float global)
{
    (void)q, (void)zero, (void)global;
    static const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = e2m1[code & 7u] * scale;
    return code & 8u ? -v : v;
}

const tps_qmethod tps_qm_mxfp4 = {
    .name = "mxfp4",
    .what = "gpt-oss's MXFP4 experts (U8 blocks of 32 e2m1 codes, E8M0 scales)",
    .read_config = mxfp4_config,
    .weight_dtype = is_u8,
    .parts = NULL,
    .nparts = 0,
    .bind = mxfp4_bind,
    .dequant = mxfp4_dequant,
};
