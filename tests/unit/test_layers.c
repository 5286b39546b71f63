/* test_layers.c - config values layer by layer (per_layer_config and the
 * older Gemma4 fields), the per-layer divisible checks, the plan keys
 * `heads` and `untie`, and the config.json rewrite of --untie. */
#include "internal.h"
#include "test.h"

static tps_ctx *ctx;

static cJSON *json(const char *s)
{
    cJSON *j = cJSON_Parse(s);
    CHECK_MSG(j != NULL, "bad test JSON: %s", s);
    return j;
}

static tps_plan *parse(const char *text)
{
    tps_plan *p = NULL;
    tps_err rc = tps_plan_parse(ctx, "t.yaml", text, strlen(text), &p);
    CHECK_MSG(rc == TPS_OK, "parse failed: %s", tps_ctx_errmsg(ctx));
    return p;
}

static void parse_fails(const char *text, const char *want)
{
    tps_plan *p = NULL;
    tps_err rc = tps_plan_parse(ctx, "t.yaml", text, strlen(text), &p);
    CHECK_MSG(rc == TPS_E_PLAN, "rc %d for:\n%s", rc, text);
    CHECK_MSG(strstr(tps_ctx_errmsg(ctx), want), "message '%s' lacks '%s'", tps_ctx_errmsg(ctx),
              want);
    tps_plan_free(p);
}

static const char *const kv_plan = "name: d\nrules: []\nchecks:\n"
                                   "  - divisible: num_attention_heads\n"
                                   "  - divisible: num_key_value_heads\n"
                                   "    reason: k_proj and v_proj rows must split on whole KV "
                                   "heads\n";

/* The checks of kv_plan on config at tp: outcome 1 (num_key_value_heads). */
static tps_err kv_check(const char *config, int tp, int *ok, char *detail, size_t len)
{
    tps_plan *p = parse(kv_plan);
    cJSON *cfg = json(config);
    tps_check_outcome *o = NULL;
    size_t n = 0;
    detail[0] = 0;
    *ok = -2;
    tps_err rc = p && cfg ? tps_plan_run_checks(ctx, p, cfg, tp, &o, &n) : TPS_E_ARG;
    if (!rc && n == 2) {
        *ok = o[1].ok;
        snprintf(detail, len, "%s", o[1].detail);
    }
    tps_check_outcomes_free(o, n);
    cJSON_Delete(cfg);
    tps_plan_free(p);
    return rc;
}

/* What transformers 5.x writes for a Gemma4 text model whose full-attention
 * layers have 2 KV heads of 32 (the example). */
static const char *const g4_new =
    "{\"architectures\": [\"Gemma4ForConditionalGeneration\"], \"text_config\": {"
    "\"layer_types\": [\"sliding_attention\", \"full_attention\", \"sliding_attention\", "
    "\"full_attention\"], \"num_hidden_layers\": 4, \"num_attention_heads\": 4, "
    "\"num_key_value_heads\": 4, \"head_dim\": 8, \"hidden_size\": 32, \"attention_k_eq_v\": true, "
    "\"per_layer_config\": {\"1\": {\"head_dim\": 32, \"num_key_value_heads\": 2}, "
    "\"3\": {\"head_dim\": 32, \"num_key_value_heads\": 2}}}}";

static void test_per_layer_divisible(void)
{
    char d[1024];
    int ok;
    CHECK(kv_check(g4_new, 4, &ok, d, sizeof d) == TPS_OK);
    CHECK(ok == 0);
    CHECK_MSG(!strcmp(d, "layer 1 (full_attention): num_key_value_heads = 2 (per_layer_config) is "
                         "not divisible by tp 4 (the same on layer 3; tp values that work for "
                         "every layer: 1, 2): k_proj and v_proj rows must split on whole KV heads"),
              "%s", d);
    CHECK(kv_check(g4_new, 2, &ok, d, sizeof d) == TPS_OK);
    CHECK(ok == 1);
    CHECK_MSG(!strcmp(d, "num_key_value_heads = 4 on layers 0, 2; 2 on layers 1, 3 "
                         "(per_layer_config): divisible by tp 2 on every layer"),
              "%s", d);

    /* Twelve layers: transformers zero-pads the keys. */
    const char *g12 =
        "{\"num_hidden_layers\": 12, \"num_attention_heads\": 8, \"num_key_value_heads\": 8, "
        "\"per_layer_config\": {\"05\": {\"num_key_value_heads\": 2}, \"11\": "
        "{\"num_key_value_heads\": 2}}}";
    CHECK(kv_check(g12, 4, &ok, d, sizeof d) == TPS_OK);
    CHECK_MSG(ok == 0 && strstr(d, "layer 5: num_key_value_heads = 2 (per_layer_config)") &&
                  strstr(d, "the same on layer 11;"),
              "%s", d);

    /* serialize_explicit_per_layer_config: every layer listed, the failing one named. */
    const char *ex = "{\"num_hidden_layers\": 3, \"num_attention_heads\": 6, "
                     "\"num_key_value_heads\": 6, \"per_layer_config\": {\"0\": "
                     "{\"num_key_value_heads\": 6}, \"1\": {\"num_key_value_heads\": 6}, \"2\": "
                     "{\"num_key_value_heads\": 3}}}";
    CHECK(kv_check(ex, 2, &ok, d, sizeof d) == TPS_OK);
    CHECK_MSG(ok == 0 && strstr(d, "layer 2: num_key_value_heads = 3 (per_layer_config) is not "
                                   "divisible by tp 2 (tp values that work for every layer: 1, 3)"),
              "%s", d);

    /* A per-layer value that is not a count. */
    const char *bad = "{\"num_hidden_layers\": 2, \"num_key_value_heads\": 2, "
                      "\"per_layer_config\": {\"1\": {\"num_key_value_heads\": \"two\"}}}";
    CHECK(kv_check(bad, 2, &ok, d, sizeof d) == TPS_OK);
    CHECK_MSG(ok == 0 && strstr(d, "layer 1: num_key_value_heads = \"two\" (per_layer_config) is "
                                   "not a count"),
              "%s", d);

    /* The uniform case keeps its message. */
    CHECK(kv_check("{\"num_hidden_layers\": 2, \"num_key_value_heads\": 4}", 8, &ok, d,
                   sizeof d) == TPS_OK);
    CHECK_MSG(ok == 0 && !strncmp(d, "num_key_value_heads = 4 is not divisible by tp 8", 48), "%s",
              d);
}

/* Released Gemma4 checkpoints: num_global_key_value_heads / global_head_dim. */
static void test_older_gemma4_fields(void)
{
    char d[1024];
    int ok;
    const char *old = "{\"text_config\": {\"layer_types\": [\"sliding_attention\", "
                      "\"full_attention\"], \"num_hidden_layers\": 2, \"num_attention_heads\": 8, "
                      "\"num_key_value_heads\": 8, \"num_global_key_value_heads\": 2, "
                      "\"head_dim\": 16, \"global_head_dim\": 32, \"attention_k_eq_v\": true}}";
    CHECK(kv_check(old, 4, &ok, d, sizeof d) == TPS_OK);
    CHECK_MSG(ok == 0 && strstr(d, "layer 1 (full_attention): num_key_value_heads = 2 (from "
                                   "num_global_key_value_heads) is not divisible by tp 4"),
              "%s", d);

    cJSON *cfg = json(old);
    tps_layers ly;
    CHECK(tps_layers_open(ctx, cfg, "c", &ly) == TPS_OK);
    int64_t h, kv, hd;
    const char *from[3];
    tps_layers_geometry(&ly, 0, &h, &kv, &hd, from);
    CHECK(h == 8 && kv == 8 && hd == 16 && !from[0] && !from[1] && !from[2]);
    tps_layers_geometry(&ly, 1, &h, &kv, &hd, from);
    CHECK(h == 8 && kv == 2 && hd == 32);
    CHECK(from[1] && !strcmp(from[1], "num_global_key_value_heads"));
    CHECK(from[2] && !strcmp(from[2], "global_head_dim"));
    tps_layers_close(&ly);
    cJSON_Delete(cfg);

    /* transformers applies the global KV heads only with attention_k_eq_v. */
    const char *noeqv = "{\"layer_types\": [\"sliding_attention\", \"full_attention\"], "
                        "\"num_hidden_layers\": 2, \"num_key_value_heads\": 8, "
                        "\"num_global_key_value_heads\": 2, \"global_head_dim\": 32, "
                        "\"attention_k_eq_v\": false}";
    CHECK(kv_check(noeqv, 4, &ok, d, sizeof d) == TPS_OK);
    CHECK_MSG(ok == 1 && !strcmp(d, "num_key_value_heads = 8: 2 per rank at tp 4"), "%s", d);

    /* Once per_layer_config is there (even {}), the older fields are not read. */
    const char *both = "{\"layer_types\": [\"sliding_attention\", \"full_attention\"], "
                       "\"num_hidden_layers\": 2, \"num_key_value_heads\": 8, "
                       "\"num_global_key_value_heads\": 2, \"attention_k_eq_v\": true, "
                       "\"per_layer_config\": {}}";
    CHECK(kv_check(both, 4, &ok, d, sizeof d) == TPS_OK);
    CHECK_MSG(ok == 1, "%s", d);
}

static void test_defaults(void)
{
    /* No head_dim: hidden_size / heads; no num_key_value_heads: one per head. */
    cJSON *cfg =
        json("{\"num_hidden_layers\": 1, \"hidden_size\": 64, \"num_attention_heads\": 4}");
    tps_layers ly;
    CHECK(tps_layers_open(ctx, cfg, "c", &ly) == TPS_OK);
    int64_t h, kv, hd;
    const char *from[3];
    tps_layers_geometry(&ly, 0, &h, &kv, &hd, from);
    CHECK(h == 4 && kv == 4 && hd == 16);
    CHECK(!tps_layers_vary(&ly, "num_key_value_heads"));
    tps_layers_close(&ly);
    cJSON_Delete(cfg);
}

static void config_fails(const char *config, const char *want)
{
    cJSON *cfg = json(config);
    tps_layers ly;
    tps_err rc = tps_layers_open(ctx, cfg, "m/config.json", &ly);
    CHECK_MSG(rc == TPS_E_CONFIG, "rc %d for %s", rc, config);
    CHECK_MSG(strstr(tps_ctx_errmsg(ctx), want), "message '%s' lacks '%s'", tps_ctx_errmsg(ctx),
              want);
    tps_layers_close(&ly);
    cJSON_Delete(cfg);
}

static void test_malformed_per_layer_config(void)
{
    config_fails("{\"per_layer_config\": [1]}",
                 "m/config.json: per_layer_config must be an object");
    config_fails("{\"text_config\": {\"per_layer_config\": {\"x\": {}}}}",
                 "m/config.json: text_config.per_layer_config: key \"x\" is not a layer index");
    config_fails("{\"per_layer_config\": {\"-1\": {}}}", "key \"-1\" is not a layer index");
    config_fails("{\"num_hidden_layers\": 4, \"per_layer_config\": {\"4\": {}}}",
                 "names layer 4, but the model has 4 layers");
    config_fails("{\"num_hidden_layers\": 4, \"per_layer_config\": {\"1\": {}, \"01\": {}}}",
                 "lists layer 1 twice");
    config_fails("{\"num_hidden_layers\": 4, \"per_layer_config\": {\"1\": 2}}",
                 "per_layer_config[\"1\"] must be an object");
    /* The checks report it as the config's error. */
    tps_plan *p = parse(kv_plan);
    cJSON *cfg = json("{\"per_layer_config\": {\"y\": {}}}");
    tps_check_outcome *o = NULL;
    size_t n = 0;
    CHECK(p && tps_plan_run_checks(ctx, p, cfg, 2, &o, &n) == TPS_E_CONFIG);
    CHECK(o == NULL);
    cJSON_Delete(cfg);
    tps_plan_free(p);
    /* Without num_hidden_layers the last listed layer bounds the model. */
    cfg = json("{\"num_key_value_heads\": 4, \"per_layer_config\": {\"2\": "
               "{\"num_key_value_heads\": 2}}}");
    tps_layers ly;
    CHECK(tps_layers_open(ctx, cfg, "c", &ly) == TPS_OK && ly.n == 3);
    tps_layers_close(&ly);
    cJSON_Delete(cfg);
}

static void test_plan_keys(void)
{
    tps_plan *p = parse("name: h\nrules:\n"
                        "  - match: model.layers.*.self_attn.k_proj\n    style: colwise\n"
                        "    heads: num_key_value_heads\n"
                        "checks: []\n"
                        "untie:\n"
                        "  - {embedding: model.embed_tokens, head: lm_head}\n"
                        "  - {embedding: x.embed, head: x.head}\n");
    if (p) {
        CHECK(p->rules[0].heads && !strcmp(p->rules[0].heads, "num_key_value_heads"));
        CHECK(p->nuntie == 2);
        CHECK(!strcmp(p->untie_embedding[1], "x.embed") && !strcmp(p->untie_head[1], "x.head"));
    }
    tps_plan_free(p);
    parse_fails("name: h\nrules:\n  - match: a.b\n    style: replicate\n    heads: n\n",
                "'heads' needs a sharding style");
    parse_fails("name: h\nrules:\n  - match: a.b\n    style: colwise\n    heads: a.b\n",
                "'heads: a.b' is not a config.json field name");
    parse_fails("name: h\nrules: []\nuntie: {embedding: a, head: b}\n", "'untie' must be a list");
    parse_fails("name: h\nrules: []\nuntie:\n  - {embedding: a.*}\n", "untie entry needs");
    parse_fails("name: h\nrules: []\nuntie:\n  - {embedding: a.*, head: b}\n",
                "'a.*' must name one module");
    parse_fails("name: h\nrules: []\nuntie:\n  - {embedding: a.weight, head: b}\n",
                "names a parameter");
    parse_fails("name: h\nrules: []\nuntie:\n  - {embedding: a, head: b, bias: c}\n",
                "unknown key 'bias' in untie entry");
}

static void untie_is(const char *in, const char *want)
{
    char *out = tps_json_untie_text(in, strlen(in));
    CHECK_MSG(out && !strcmp(out, want), "\n%s\n->\n%s\nwanted\n%s", in, out ? out : "(null)",
              want);
    free(out);
}

static void test_untie_text(void)
{
    /* Values replaced in place, the rest byte for byte. */
    untie_is("{\n  \"a\": 1.0,\n  \"tie_word_embeddings\": true,\n  \"text_config\": {\n    "
             "\"tie_word_embeddings\": true,\n    \"x\": \"}\\\"{\"\n  }\n}\n",
             "{\n  \"a\": 1.0,\n  \"tie_word_embeddings\": false,\n  \"text_config\": {\n    "
             "\"tie_word_embeddings\": false,\n    \"x\": \"}\\\"{\"\n  }\n}\n");
    /* Absent: inserted first, indented like the first member. */
    untie_is("{\n  \"model_type\": \"gemma3\",\n  \"text_config\": {\n    "
             "\"vocab_size\": 8\n  }\n}",
             "{\n  \"tie_word_embeddings\": false,\n  \"model_type\": \"gemma3\",\n  "
             "\"text_config\": {\n    \"tie_word_embeddings\": false,\n    \"vocab_size\": 8\n"
             "  }\n}");
    untie_is("{\"tie_word_embeddings\":null,\"text_config\":{}}",
             "{\"tie_word_embeddings\":false,\"text_config\":{\"tie_word_embeddings\": false}}");
    untie_is("{}", "{\"tie_word_embeddings\": false}");
    /* A text_config that is not an object is left alone. */
    untie_is("{\"text_config\": null}", "{\"tie_word_embeddings\": false,\"text_config\": null}");
    CHECK(tps_json_untie_text("[1]", 3) == NULL);
}

int main(void)
{
    ctx = tps_ctx_new();
    if (!ctx) return 1;
    RUN(test_per_layer_divisible);
    RUN(test_older_gemma4_fields);
    RUN(test_defaults);
    RUN(test_malformed_per_layer_config);
    RUN(test_plan_keys);
    RUN(test_untie_text);
    tps_ctx_free(ctx);
    TEST_EXIT();
}
