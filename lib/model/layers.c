/* layers.c - a config's values layer by layer.
 *
 * Head counts and head sizes may differ between the layers of one model.
 * transformers 5 writes the layers that differ from the config's own fields
 * into per_layer_config, a map from layer index (a string, zero-padded to a
 * common width: "05", "11") to the fields that layer overrides:
 *
 *     "num_key_value_heads": 4,
 *     "per_layer_config": {"1": {"head_dim": 32, "num_key_value_heads": 2}}
 *
 * Overrides equal to the config's own value are dropped, an empty {} means
 * every layer is alike, and with serialize_explicit_per_layer_config every
 * layer lists every per-layer field. Gemma4 configs written before that
 * carry the full-attention layers' values in global_head_dim and
 * num_global_key_value_heads instead; transformers converts them as
 * Gemma4TextConfig.__post_init__ does here (the KV heads only when
 * attention_k_eq_v is set), and ignores them once per_layer_config is there. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* Bound on the layers a config may declare: far above any model, low enough
 * that a hostile num_hidden_layers cannot make the per-layer table huge. */
#define MAX_LAYERS (1 << 20)

static int json_count(const cJSON *v, int64_t *out)
{
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9007199254740992.0 ||
        v->valuedouble != (double)(int64_t)v->valuedouble)
        return 0;
    *out = (int64_t)v->valuedouble;
    return 1;
}

/* Python truthiness, as transformers tests attention_k_eq_v. */
static int truthy(const cJSON *v)
{
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v)) return 0;
    if (cJSON_IsNumber(v)) return v->valuedouble != 0;
    if (cJSON_IsString(v)) return v->valuestring && v->valuestring[0];
    if (cJSON_IsArray(v) || cJSON_IsObject(v)) return v->child != NULL;
    return 1;
}

/* Where field lives in config: "" at the top level, "text_config." under it. */
static const char *where(const cJSON *config, const char *field)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(config, field);
    return v && !cJSON_IsNull(v) ? "" : "text_config.";
}

void tps_layers_close(tps_layers *ly)
{
    if (!ly) return;
    free(ly->over);
    memset(ly, 0, sizeof *ly);
}

tps_err tps_layers_open(tps_ctx *ctx, const cJSON *config, const char *label, tps_layers *ly)
{
    memset(ly, 0, sizeof *ly);
    ly->config = config;
    if (!config) return TPS_OK;
    if (!label) label = "config.json";
    const cJSON *types = tps_config_get(config, "layer_types");
    if (cJSON_IsArray(types)) ly->types = types;
    int64_t n = 0;
    const cJSON *nl = tps_config_get(config, "num_hidden_layers");
    if (!json_count(nl, &n) || n > MAX_LAYERS) n = ly->types ? cJSON_GetArraySize(ly->types) : 0;
    if (n > MAX_LAYERS) n = MAX_LAYERS;
    const cJSON *plc = tps_config_get(config, "per_layer_config");
    const char *at = plc ? where(config, "per_layer_config") : "";
    if (plc && !cJSON_IsObject(plc))
        return tps_fail(ctx, TPS_E_CONFIG,
                        "%s: %sper_layer_config must be an object from layer index to overrides",
                        label, at);
    if (plc) {
        ly->has_plc = 1;
        /* Layer indices first: a config without num_hidden_layers still
         * reaches its last overridden layer. */
        int64_t top = -1;
        for (const cJSON *e = plc->child; e; e = e->next) {
            const char *k = e->string;
            size_t kl = k ? strlen(k) : 0;
            int64_t idx = 0;
            int digits = kl > 0 && kl <= 10;
            for (size_t j = 0; digits && j < kl; j++) {
                digits = k[j] >= '0' && k[j] <= '9';
                if (digits) idx = idx * 10 + (k[j] - '0');
            }
            if (!digits || idx >= MAX_LAYERS)
                return tps_fail(ctx, TPS_E_CONFIG,
                                "%s: %sper_layer_config: key \"%.40s\" is not a layer index", label,
                                at, k ? k : "");
            if (n > 0 && idx >= n)
                return tps_fail(ctx, TPS_E_CONFIG,
                                "%s: %sper_layer_config names layer %lld, but the model has %lld "
                                "layers (num_hidden_layers)",
                                label, at, (long long)idx, (long long)n);
            if (!cJSON_IsObject(e))
                return tps_fail(ctx, TPS_E_CONFIG,
                                "%s: %sper_layer_config[\"%s\"] must be an object of the fields "
                                "layer %lld overrides",
                                label, at, k, (long long)idx);
            if (idx > top) top = idx;
        }
        if (n == 0) n = top + 1;
    }
    ly->n = (int)n;
    if (ly->has_plc && n > 0) {
        ly->over = tps_xcalloc((size_t)n, sizeof *ly->over);
        if (!ly->over) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
        for (const cJSON *e = plc->child; e; e = e->next) {
            int64_t idx = strtoll(e->string, NULL, 10);
            if (ly->over[idx]) {
                tps_err rc = tps_fail(ctx, TPS_E_CONFIG,
                                      "%s: %sper_layer_config lists layer %lld twice", label, at,
                                      (long long)idx);
                tps_layers_close(ly);
                return rc;
            }
            ly->over[idx] = e;
        }
    }
    if (!ly->has_plc && ly->types) {
        const cJSON *g = tps_config_get(config, "num_global_key_value_heads");
        ly->old_hd = tps_config_get(config, "global_head_dim") != NULL;
        ly->old_kv = g && !(cJSON_IsNumber(g) && g->valuedouble == 0) &&
                     truthy(tps_config_get(config, "attention_k_eq_v"));
    }
    return TPS_OK;
}

const char *tps_layers_type(const tps_layers *ly, int i)
{
    const cJSON *t = ly->types ? cJSON_GetArrayItem(ly->types, i) : NULL;
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

const cJSON *tps_layers_get(const tps_layers *ly, int i, const char *field, const char **from)
{
    if (from) *from = NULL;
    if (!ly->config) return NULL;
    if (i >= 0 && i < ly->n && ly->over && ly->over[i]) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(ly->over[i], field);
        if (v && !cJSON_IsNull(v)) {
            if (from) *from = "per_layer_config";
            return v;
        }
    }
    if ((ly->old_hd || ly->old_kv) && i >= 0 && i < ly->n) {
        const char *t = tps_layers_type(ly, i);
        if (t && !strcmp(t, "full_attention")) {
            const char *old = ly->old_hd && !strcmp(field, "head_dim") ? "global_head_dim"
                              : ly->old_kv && !strcmp(field, "num_key_value_heads")
                                  ? "num_global_key_value_heads"
                                  : NULL;
            if (old) {
                if (from) *from = old;
                return tps_config_get(ly->config, old);
            }
        }
    }
    return tps_config_get(ly->config, field);
}

int tps_layers_vary(const tps_layers *ly, const char *field)
{
    for (int i = 0; i < ly->n; i++) {
        const char *from;
        tps_layers_get(ly, i, field, &from);
        if (from) return 1;
    }
    return 0;
}

void tps_layers_geometry(const tps_layers *ly, int i, int64_t *heads, int64_t *kv, int64_t *hd,
                         const char **from)
{
    int64_t hs;
    from[0] = from[1] = from[2] = NULL;
    if (!json_count(tps_layers_get(ly, i, "num_attention_heads", &from[0]), heads)) *heads = -1;
    const cJSON *k = tps_layers_get(ly, i, "num_key_value_heads", &from[1]);
    if (!k) *kv = *heads; /* transformers: without num_key_value_heads, one KV head per head */
    else if (!json_count(k, kv)) *kv = -1;
    const cJSON *d = tps_layers_get(ly, i, "head_dim", &from[2]);
    if (d) {
        if (!json_count(d, hd)) *hd = -1;
    } else if (*heads > 0 && json_count(tps_config_get(ly->config, "hidden_size"), &hs) &&
               hs % *heads == 0) {
        *hd = hs / *heads; /* transformers' default head size */
    } else {
        *hd = -1;
    }
}
