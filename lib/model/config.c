/* config.c - config.json as transformers reads it.
 *
 * A config.json holds what save_pretrained chose to write: transformers 4.x
 * wrote sub-configs as a diff against the class defaults (Gemma3's
 * text_config often lacks num_attention_heads, num_key_value_heads and
 * head_dim), hand-made or converted configs leave fields out, and 4.x and 5.x
 * name some fields differently (Qwen3-MoE: num_experts in 4.x,
 * num_local_experts in 5.x, each an attribute_map alias of the other).
 * transformers, and the engines that load configs through it, fill every gap
 * from the config class of the model type. tpshard does the same once, when
 * it reads config.json, so that every plan, layout, check and report reads
 * one set of values.
 *
 * The two tables below are that knowledge. Sources: transformers 5.24.0
 * models/<type>/configuration_<type>.py (dataclass field defaults and
 * __post_init__), the same classes' __init__ defaults in 4.5x, which agree,
 * and their attribute_map. */
#include "internal.h"

#include <string.h>

/* Names that one field is written under. Each pair is read both ways. */
static const struct {
    const char *a, *b;
} aliases[] = {
    /* Qwen3MoeConfig: 4.x field num_experts, 5.x field num_local_experts with
     * attribute_map {"num_experts": "num_local_experts"}; MixtralConfig has
     * had num_local_experts and the same map in both. */
    {"num_experts", "num_local_experts"},
    /* PretrainedConfig: 5.x writes dtype, 4.x torch_dtype. */
    {"torch_dtype", "dtype"},
};

typedef enum {
    DF_INT,      /* n */
    DF_BOOL,     /* n != 0 */
    DF_FIELD,    /* the value of field a (after a's own default) */
    DF_QUOTIENT, /* a // b, only when it divides (the classes reject the rest) */
} df_kind;

typedef struct {
    const char *field;
    const char *types; /* the model types whose config class says so, space separated */
    df_kind kind;
    double n;
    const char *a, *b;
} cdefault;

#define DENSE "llama mistral qwen2 qwen3 phi3 qwen3_moe mixtral"
#define GEMMA "gemma3_text gemma4_text"

/* In dependency order: head counts and sizes before what derives from them. */
static const cdefault defaults[] = {
    {"hidden_size", "llama mistral qwen2 qwen3 mixtral", DF_INT, 4096, 0, 0},
    {"hidden_size", "phi3", DF_INT, 3072, 0, 0},
    {"hidden_size", "qwen3_moe", DF_INT, 2048, 0, 0},
    {"hidden_size", GEMMA, DF_INT, 2304, 0, 0},
    {"num_attention_heads", DENSE, DF_INT, 32, 0, 0},
    {"num_attention_heads", GEMMA, DF_INT, 8, 0, 0},
    /* num_key_value_heads: None -> num_attention_heads only where None is the
     * default; Qwen2 and Qwen3 default to 32 whatever the head count. */
    {"num_key_value_heads", "llama phi3", DF_FIELD, 0, "num_attention_heads", 0},
    {"num_key_value_heads", "mistral mixtral", DF_INT, 8, 0, 0},
    {"num_key_value_heads", "qwen2 qwen3", DF_INT, 32, 0, 0},
    {"num_key_value_heads", "qwen3_moe " GEMMA, DF_INT, 4, 0, 0},
    /* head_dim: a field with a constant default, or None/absent, which the
     * model code reads as hidden_size // num_attention_heads. */
    {"head_dim", "llama mistral qwen2 phi3 qwen3_moe mixtral", DF_QUOTIENT, 0, "hidden_size",
     "num_attention_heads"},
    {"head_dim", "qwen3", DF_INT, 128, 0, 0},
    {"head_dim", GEMMA, DF_INT, 256, 0, 0},
    {"intermediate_size", "llama", DF_INT, 11008, 0, 0},
    {"intermediate_size", "mistral mixtral", DF_INT, 14336, 0, 0},
    {"intermediate_size", "qwen2 qwen3", DF_INT, 22016, 0, 0},
    {"intermediate_size", "phi3", DF_INT, 8192, 0, 0},
    {"intermediate_size", "qwen3_moe", DF_INT, 6144, 0, 0},
    {"intermediate_size", GEMMA, DF_INT, 9216, 0, 0},
    {"vocab_size", "llama mistral mixtral", DF_INT, 32000, 0, 0},
    {"vocab_size", "qwen2 qwen3 qwen3_moe", DF_INT, 151936, 0, 0},
    {"vocab_size", "phi3", DF_INT, 32064, 0, 0},
    {"vocab_size", "gemma3_text", DF_INT, 262208, 0, 0},
    {"vocab_size", "gemma4_text", DF_INT, 262144, 0, 0},
    {"num_hidden_layers", "llama mistral qwen2 qwen3 phi3 mixtral", DF_INT, 32, 0, 0},
    {"num_hidden_layers", "qwen3_moe", DF_INT, 24, 0, 0},
    {"num_hidden_layers", "gemma3_text", DF_INT, 26, 0, 0},
    {"num_hidden_layers", "gemma4_text", DF_INT, 30, 0, 0},
    {"tie_word_embeddings", DENSE, DF_BOOL, 0, 0, 0},
    {"tie_word_embeddings", GEMMA, DF_BOOL, 1, 0, 0},
    {"num_experts", "qwen3_moe", DF_INT, 128, 0, 0},
    {"num_experts", "mixtral", DF_INT, 8, 0, 0},
    {"moe_intermediate_size", "qwen3_moe", DF_INT, 768, 0, 0},
    {"decoder_sparse_step", "qwen3_moe", DF_INT, 1, 0, 0},
    {"hidden_size_per_layer_input", "gemma4_text", DF_INT, 256, 0, 0},
    {"vocab_size_per_layer_input", "gemma4_text", DF_INT, 262144, 0, 0},
    {"enable_moe_block", "gemma4_text", DF_BOOL, 0, 0, 0},
    {"attention_k_eq_v", "gemma4_text", DF_BOOL, 0, 0, 0},
};

static int listed(const char *types, const char *mt)
{
    size_t n = strlen(mt);
    for (const char *p = types; (p = strstr(p, mt)) != NULL; p += n)
        if ((p == types || p[-1] == ' ') && (p[n] == ' ' || p[n] == 0)) return 1;
    return 0;
}

/* Sets key in obj to v (replacing a JSON null), taking v. */
static int put(cJSON *obj, const char *key, cJSON *v)
{
    if (!v) return 0;
    if (cJSON_GetObjectItemCaseSensitive(obj, key))
        return cJSON_ReplaceItemInObjectCaseSensitive(obj, key, v) ? 1 : (cJSON_Delete(v), 0);
    return cJSON_AddItemToObject(obj, key, v) ? 1 : (cJSON_Delete(v), 0);
}

/* The fields filled from defaults, under a key no config class has, so that
 * messages can say where a value came from. */
#define DEFAULTED "tpshard:defaulted"

static int note_default(cJSON *config, const char *field)
{
    cJSON *a = cJSON_GetObjectItemCaseSensitive(config, DEFAULTED);
    if (!a && !(a = cJSON_AddArrayToObject(config, DEFAULTED))) return 0;
    cJSON *s = cJSON_CreateString(field);
    return s && cJSON_AddItemToArray(a, s) ? 1 : (cJSON_Delete(s), 0);
}

int tps_config_defaulted(const cJSON *config, const char *field)
{
    const cJSON *a = config ? cJSON_GetObjectItemCaseSensitive(config, DEFAULTED) : NULL, *e;
    cJSON_ArrayForEach(e, a) if (cJSON_IsString(e) && !strcmp(e->valuestring, field)) return 1;
    return 0;
}

static int whole(const cJSON *v, double *out)
{
    if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble != (double)(int64_t)v->valuedouble)
        return 0;
    *out = v->valuedouble;
    return 1;
}

/* The model type whose class reads the text model's fields: text_config's,
 * else the top level's, composite types named after their text config. */
static const char *text_model_type(const cJSON *config, const cJSON *text)
{
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(text, "model_type");
    if (!cJSON_IsString(mt)) mt = cJSON_GetObjectItemCaseSensitive(config, "model_type");
    if (!cJSON_IsString(mt) || !mt->valuestring) return NULL;
    if (!strcmp(mt->valuestring, "gemma3")) return "gemma3_text";
    if (!strcmp(mt->valuestring, "gemma4")) return "gemma4_text";
    return mt->valuestring;
}

tps_err tps_config_resolve(tps_ctx *ctx, cJSON *config)
{
    if (!cJSON_IsObject(config)) return TPS_OK;
    cJSON *tc = cJSON_GetObjectItemCaseSensitive(config, "text_config");
    cJSON *text = cJSON_IsObject(tc) ? tc : config;
    int ok = 1;
    for (size_t i = 0; i < sizeof aliases / sizeof *aliases; i++)
        for (int way = 0; way < 2; way++) {
            const char *f = way ? aliases[i].b : aliases[i].a, *g = way ? aliases[i].a : aliases[i].b;
            const cJSON *v = tps_config_get(config, g);
            if (!tps_config_get(config, f) && v) ok &= put(text, f, cJSON_Duplicate(v, 1));
        }
    const char *mt = text_model_type(config, text);
    for (size_t i = 0; mt && i < sizeof defaults / sizeof *defaults; i++) {
        const cdefault *d = &defaults[i];
        if (tps_config_get(config, d->field) || !listed(d->types, mt)) continue;
        double a, b;
        cJSON *v = NULL;
        switch (d->kind) {
        case DF_INT: v = cJSON_CreateNumber(d->n); break;
        case DF_BOOL: v = cJSON_CreateBool(d->n != 0); break;
        case DF_FIELD: {
            const cJSON *s = tps_config_get(config, d->a);
            if (s) v = cJSON_Duplicate(s, 1);
            break;
        }
        case DF_QUOTIENT:
            if (whole(tps_config_get(config, d->a), &a) && whole(tps_config_get(config, d->b), &b) &&
                (int64_t)a % (int64_t)b == 0)
                v = cJSON_CreateNumber(a / b);
            break;
        }
        if (v) ok &= put(text, d->field, v) && note_default(config, d->field);
        /* the alias too: a layout may read the field under either name */
        for (size_t k = 0; v && k < sizeof aliases / sizeof *aliases; k++) {
            const char *o = !strcmp(aliases[k].a, d->field)   ? aliases[k].b
                            : !strcmp(aliases[k].b, d->field) ? aliases[k].a
                                                              : NULL;
            if (o && !tps_config_get(config, o)) ok &= put(text, o, cJSON_Duplicate(v, 1));
        }
    }
    return ok ? TPS_OK : tps_fail(ctx, TPS_E_NOMEM, "config.json: out of memory");
}

const char *tps_config_alias(const char *field)
{
    for (size_t i = 0; field && i < sizeof aliases / sizeof *aliases; i++) {
        if (!strcmp(aliases[i].a, field)) return aliases[i].b;
        if (!strcmp(aliases[i].b, field)) return aliases[i].a;
    }
    return NULL;
}

char *tps_config_lacks(const char *field)
{
    const char *al = tps_config_alias(field);
    return al ? tps_asprintf("lacks %s (transformers also writes it as %s): add it", field, al)
              : tps_asprintf("lacks %s: add it", field);
}
