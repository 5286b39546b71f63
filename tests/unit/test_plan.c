/* test_plan.c - plan parsing, matching, conditions, checks and detection. */
#include "internal.h"
#include "test.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

static tps_ctx *ctx;

static tps_plan *parse(const char *text)
{
    tps_plan *p = NULL;
    tps_err rc = tps_plan_parse(ctx, "t.yaml", text, strlen(text), &p);
    CHECK_MSG(rc == TPS_OK, "parse failed: %s", tps_ctx_errmsg(ctx));
    return p;
}

/* Parses text expecting failure; the message must contain every want. */
static void parse_fails(const char *text, const char *want1, const char *want2)
{
    tps_plan *p = NULL;
    tps_err rc = tps_plan_parse(ctx, "t.yaml", text, strlen(text), &p);
    const char *m = tps_ctx_errmsg(ctx);
    CHECK_MSG(rc == TPS_E_PLAN, "rc %d for:\n%s", rc, text);
    CHECK(p == NULL);
    CHECK_MSG(!want1 || strstr(m, want1), "message '%s' lacks '%s'", m, want1);
    CHECK_MSG(!want2 || strstr(m, want2), "message '%s' lacks '%s'", m, want2);
    tps_plan_free(p);
}

static cJSON *json(const char *s)
{
    cJSON *j = cJSON_Parse(s);
    CHECK_MSG(j != NULL, "bad test JSON: %s", s);
    return j;
}

/* Style of the rule matching name, or -1 when none. */
static int style_of(const tps_plan *p, const char *name, const cJSON *config)
{
    const tps_rule *r = tps_plan_match(p, name, config, NULL);
    return r ? (int)r->style : -1;
}

static char *slurp(const char *path)
{
    char *buf = NULL;
    size_t len = 0;
    if (tps_read_file(ctx, path, 1 << 20, &buf, &len) != TPS_OK) return NULL;
    return buf;
}

/* ------------------------------------------------------------------ tests */

static void test_builtins_parse(void)
{
    CHECK(tps_plan_builtin_count() >= 5);
    for (size_t i = 0; i < tps_plan_builtin_count(); i++) {
        size_t len = 0;
        const char *name = tps_plan_builtin_name(i), *text = tps_plan_builtin_text(i, &len);
        tps_plan *p = NULL;
        CHECK(name && text && len == strlen(text));
        tps_err rc = tps_plan_builtin(ctx, name, &p);
        CHECK_MSG(rc == TPS_OK, "%s: %s", name, tps_ctx_errmsg(ctx));
        if (!p) continue;
        CHECK_MSG(!strcmp(tps_plan_name(p), name), "plan %s is named %s", name, tps_plan_name(p));
        CHECK(tps_plan_description(p)[0] != '\0');
        CHECK(p->nrules > 0 && p->narch > 0 && p->nmt > 0);
        /* phi3 follows transformers' plan, which gathers outputs, and gpt_oss
         * transformers' plan, which splits only the vocabulary (torch.chunk):
         * no count must divide */
        CHECK_MSG(p->nchecks > 0 || !strcmp(name, "phi3") || !strcmp(name, "gpt_oss"),
                  "%s has no checks", name);
        tps_plan_free(p);
    }
    CHECK(tps_plan_builtin_name(tps_plan_builtin_count()) == NULL);
    CHECK(tps_plan_builtin_text(tps_plan_builtin_count(), NULL) == NULL);
    const char *fams[] = {"llama", "qwen2", "qwen3", "gemma3", "gemma4", "LLaMA"};
    for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++) {
        tps_plan *p = NULL;
        CHECK_MSG(tps_plan_builtin(ctx, fams[i], &p) == TPS_OK, "%s", fams[i]);
        tps_plan_free(p);
    }
}

static void test_builtin_unknown(void)
{
    tps_plan *p = (tps_plan *)1;
    CHECK(tps_plan_builtin(ctx, "falcon", &p) == TPS_E_ARG);
    CHECK(p == NULL);
    CHECK(strstr(tps_ctx_errmsg(ctx), "falcon"));
    CHECK(strstr(tps_ctx_errmsg(ctx),
                 "deepseek_v3, gemma3, gemma4, gpt_oss, llama, mistral, mixtral, phi3, qwen2, qwen3, qwen3_moe"));
    tps_plan_free(NULL);
}

static void test_style_names(void)
{
    CHECK(!strcmp(tps_style_name(TPS_STYLE_REPLICATE), "replicate"));
    CHECK(!strcmp(tps_style_name(TPS_STYLE_COLWISE), "colwise"));
    CHECK(!strcmp(tps_style_name(TPS_STYLE_ROWWISE), "rowwise"));
    CHECK(!strcmp(tps_style_name(TPS_STYLE_EMBED_ROWWISE), "embedding_rowwise"));
    CHECK(!strcmp(tps_style_name(TPS_STYLE_EMBED_COLWISE), "embedding_colwise"));
    CHECK(!strcmp(tps_style_name(TPS_STYLE_SEQPAR), "sequence_parallel"));
    tps_plan *p = parse("name: s\nrules:\n"
                        "  - {match: a, style: colwise}\n  - {match: b, style: rowwise}\n"
                        "  - {match: c, style: embedding_rowwise}\n"
                        "  - {match: d, style: embedding_colwise}\n"
                        "  - {match: e, style: replicate}\n"
                        "  - {match: f, style: sequence_parallel}\n"
                        "  - {match: g, style: vocab}\n");
    if (!p) return;
    CHECK(p->rules[0].style == TPS_STYLE_COLWISE && p->rules[1].style == TPS_STYLE_ROWWISE);
    CHECK(p->rules[2].style == TPS_STYLE_EMBED_ROWWISE);
    CHECK(p->rules[3].style == TPS_STYLE_EMBED_COLWISE);
    CHECK(p->rules[4].style == TPS_STYLE_REPLICATE && p->rules[5].style == TPS_STYLE_SEQPAR);
    CHECK(p->rules[6].style == TPS_STYLE_EMBED_ROWWISE);
    CHECK(p->rules[0].line == 3 && p->rules[6].line == 9);
    tps_plan_free(p);
}

static void test_match_star_one_component(void)
{
    tps_plan *p = parse("name: m\nrules:\n  - match: model.layers.*.mlp\n    style: colwise\n");
    if (!p) return;
    CHECK(style_of(p, "model.layers.0.mlp.weight", NULL) == TPS_STYLE_COLWISE);
    CHECK(style_of(p, "model.layers.17.mlp.bias", NULL) == TPS_STYLE_COLWISE);
    CHECK(style_of(p, "model.layers.anything.mlp.weight", NULL) == TPS_STYLE_COLWISE);
    /* '*' never spans two components, nor matches zero. */
    CHECK(style_of(p, "model.layers.0.1.mlp.weight", NULL) == -1);
    CHECK(style_of(p, "model.layers.mlp.weight", NULL) == -1);
    /* The final component is the parameter, never part of the module path. */
    CHECK(style_of(p, "model.layers.0.mlp", NULL) == -1);
    CHECK(style_of(p, "model.layers.0.mlp.x.weight", NULL) == -1);
    CHECK(style_of(p, "xmodel.layers.0.mlp.weight", NULL) == -1);
    tps_plan_free(p);

    /* fnmatch inside a component: ?, [..], prefix* */
    p = parse("name: f\nrules:\n  - {match: 'l.1?.*_proj', style: rowwise}\n"
              "  - {match: 'l.[02].q', style: colwise}\n");
    if (!p) return;
    CHECK(style_of(p, "l.12.down_proj.weight", NULL) == TPS_STYLE_ROWWISE);
    CHECK(style_of(p, "l.1.down_proj.weight", NULL) == -1);
    CHECK(style_of(p, "l.12.down_projx.weight", NULL) == -1);
    CHECK(style_of(p, "l.2.q.weight", NULL) == TPS_STYLE_COLWISE);
    CHECK(style_of(p, "l.3.q.weight", NULL) == -1);
    tps_plan_free(p);
}

static void test_match_first_wins_and_module_path(void)
{
    tps_plan *p = parse("name: fw\nrules:\n"
                        "  - match: [x.y, model.layers.0.self_attn.q_proj]\n    style: replicate\n"
                        "  - match: model.layers.*.self_attn.q_proj\n    style: colwise\n"
                        "  - match: lm_head\n    style: colwise\n"
                        "  - match: model.layers.*.experts\n    style: rowwise\n");
    if (!p) return;
    const char *pat = NULL;
    const tps_rule *r = tps_plan_match(p, "model.layers.0.self_attn.q_proj.weight", NULL, &pat);
    CHECK(r == &p->rules[0] && pat && !strcmp(pat, "model.layers.0.self_attn.q_proj"));
    r = tps_plan_match(p, "model.layers.1.self_attn.q_proj.bias", NULL, &pat);
    CHECK(r == &p->rules[1] && pat && !strcmp(pat, "model.layers.*.self_attn.q_proj"));
    CHECK(style_of(p, "lm_head.weight", NULL) == TPS_STYLE_COLWISE);
    CHECK(style_of(p, "lm_head.bias", NULL) == TPS_STYLE_COLWISE);
    CHECK(style_of(p, "lm_head", NULL) == -1); /* no module path */
    CHECK(style_of(p, ".weight", NULL) == -1);
    /* Any final component is the parameter name, not only weight/bias. */
    CHECK(style_of(p, "model.layers.3.experts.gate_up_proj", NULL) == TPS_STYLE_ROWWISE);
    r = tps_plan_match(p, "model.norm.weight", NULL, &pat);
    CHECK(r == NULL && pat == NULL);
    tps_plan_free(p);
}

static void test_match_when(void)
{
    tps_plan *p = parse("name: w\nrules:\n"
                        "  - match: e\n    style: embedding_rowwise\n"
                        "    when: {field: ple, truthy: true}\n"
                        "  - match: e\n    style: replicate\n");
    if (!p) return;
    cJSON *on = json("{\"ple\": 256}"), *off = json("{\"ple\": null}");
    CHECK(style_of(p, "e.weight", on) == TPS_STYLE_EMBED_ROWWISE);
    CHECK(style_of(p, "e.weight", off) == TPS_STYLE_REPLICATE); /* falls through to rule 2 */
    CHECK(style_of(p, "e.weight", NULL) == TPS_STYLE_REPLICATE);
    cJSON_Delete(on);
    cJSON_Delete(off);
    tps_plan_free(p);
}

static void test_conditions(void)
{
    cJSON *cfg = json("{\"t\": true, \"f\": false, \"z\": 0, \"n\": 7, \"s\": \"abc\", \"e\": \"\","
                      " \"nul\": null, \"arr\": [], \"arr1\": [1], \"text_config\": {\"deep\": 4,"
                      " \"nul\": 3}}");
    struct {
        const char *when;
        int want, want_null_cfg;
    } cases[] = {
        {"{field: t, truthy: true}", 1, 0},
        {"{field: f, truthy: true}", 0, 0},
        {"{field: z, truthy: true}", 0, 0},
        {"{field: n, truthy: true}", 1, 0},
        {"{field: s, truthy: true}", 1, 0},
        {"{field: e, truthy: true}", 0, 0},
        {"{field: arr, truthy: true}", 0, 0},
        {"{field: arr1, truthy: true}", 1, 0},
        {"{field: missing, truthy: true}", 0, 0},
        {"{field: missing, falsy: true}", 1, 1},
        {"{field: t, truthy: false}", 0, 1},
        {"{field: f, falsy: true}", 1, 1},
        {"{field: deep, equals: 4}", 1, 0},   /* text_config lookup */
        {"{field: nul, equals: 3}", 1, 0},    /* top-level null is absent */
        {"{field: n, equals: 7}", 1, 0},
        {"{field: n, equals: '7'}", 0, 0},    /* quoted: a string */
        {"{field: s, equals: abc}", 1, 0},
        {"{field: s, equals: abd}", 0, 0},
        {"{field: t, equals: true}", 1, 0},
        {"{field: t, equals: false}", 0, 0},
        {"{field: f, equals: false}", 1, 0},
        {"{field: missing, equals: true, default: true}", 1, 1},
        {"{field: t, equals: false, default: false}", 0, 1},
        {"{field: missing, truthy: true, default: 1}", 1, 1},
        {"{field: missing, equals: true}", 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[256];
        snprintf(text, sizeof text, "name: c\nrules:\n  - {match: a, style: colwise, when: %s}\n",
                 cases[i].when);
        tps_plan *p = parse(text);
        if (!p) continue;
        int got = tps_cond_eval(p->rules[0].when, cfg);
        CHECK_MSG(got == cases[i].want, "%s: got %d", cases[i].when, got);
        got = tps_cond_eval(p->rules[0].when, NULL);
        CHECK_MSG(got == cases[i].want_null_cfg, "%s with no config: got %d", cases[i].when, got);
        tps_plan_free(p);
    }
    cJSON_Delete(cfg);
}

/* Runs p's checks on config JSON at tp; returns outcomes in *o. */
static size_t run(const tps_plan *p, const char *config, int tp, tps_check_outcome **o)
{
    cJSON *cfg = config ? json(config) : NULL;
    size_t n = 0;
    *o = NULL;
    CHECK(tps_plan_run_checks(ctx, p, cfg, tp, o, &n) == TPS_OK);
    cJSON_Delete(cfg);
    return n;
}

static void test_checks_divisible(void)
{
    tps_plan *p = parse("name: d\nrules: []\nchecks:\n"
                        "  - divisible: num_key_value_heads\n"
                        "  - divisible: num_global_key_value_heads\n    optional: true\n"
                        "    reason: full-attention layers use the global KV heads\n"
                        "  - divisible: vocab_size\n");
    if (!p) return;
    tps_check_outcome *o;
    size_t n = run(p, "{\"num_key_value_heads\": 4, \"text_config\": "
                      "{\"num_global_key_value_heads\": 2}}", 8, &o);
    CHECK(n == 3);
    if (n == 3) {
        CHECK(!strcmp(o[0].name, "num_key_value_heads % tp == 0"));
        CHECK(o[0].ok == 0);
        CHECK_MSG(!strcmp(o[0].detail, "num_key_value_heads = 4 is not divisible by tp 8 "
                                       "(tp values that work: 1, 2, 4)"), "%s", o[0].detail);
        CHECK(o[1].ok == 0);
        CHECK_MSG(!strcmp(o[1].detail, "num_global_key_value_heads = 2 is not divisible by tp 8 "
                                       "(tp values that work: 1, 2): full-attention layers use "
                                       "the global KV heads"), "%s", o[1].detail);
        CHECK(!strcmp(o[2].name, "vocab_size % tp == 0"));
        CHECK(o[2].ok == -1 && !strcmp(o[2].detail, "not in config.json"));
    }
    tps_check_outcomes_free(o, n);

    n = run(p, "{\"num_key_value_heads\": 8, \"num_global_key_value_heads\": null, "
               "\"vocab_size\": 128256}", 4, &o);
    if (n == 3) {
        CHECK(o[0].ok == 1 && strstr(o[0].detail, "2 per rank"));
        CHECK(o[1].ok == -1 && !strcmp(o[1].detail, "not set"));
        CHECK(o[2].ok == 1);
    }
    tps_check_outcomes_free(o, n);

    /* Divisors listed stop at 64; non-integers fail clearly. */
    n = run(p, "{\"num_key_value_heads\": 100, \"vocab_size\": 2.5}", 3, &o);
    if (n == 3) {
        CHECK_MSG(strstr(o[0].detail, "(tp values that work: 1, 2, 4, 5, 10, 20, 25, 50)"), "%s",
                  o[0].detail);
        CHECK(o[2].ok == 0 && strstr(o[2].detail, "vocab_size = 2.5"));
    }
    tps_check_outcomes_free(o, n);

    n = run(p, NULL, 2, &o);
    CHECK(n == 3);
    for (size_t i = 0; i < n; i++)
        CHECK(o[i].ok == -1 && !strcmp(o[i].detail, "no config.json: check skipped"));
    tps_check_outcomes_free(o, n);

    size_t m = 0;
    o = NULL;
    CHECK(tps_plan_run_checks(ctx, p, NULL, 0, &o, &m) == TPS_E_ARG);
    tps_plan_free(p);
}

static void test_checks_reject_if(void)
{
    tps_plan *p = parse("name: r\nrules: []\nchecks:\n"
                        "  - name: untied word embeddings\n"
                        "    reject_if: {field: tie_word_embeddings, equals: true, default: true}\n"
                        "    reason: tied embeddings cannot be split\n"
                        "  - reject_if: {field: enable_moe_block, truthy: true}\n"
                        "    reason: use expert parallelism\n");
    if (!p) return;
    tps_check_outcome *o;
    size_t n = run(p, "{\"tie_word_embeddings\": true, \"text_config\": "
                      "{\"enable_moe_block\": true}}", 2, &o);
    CHECK(n == 2);
    if (n == 2) {
        CHECK(!strcmp(o[0].name, "untied word embeddings"));
        CHECK(o[0].ok == 0 && !strcmp(o[0].detail, "tied embeddings cannot be split"));
        CHECK(!strcmp(o[1].name, "reject if enable_moe_block"));
        CHECK(o[1].ok == 0 && !strcmp(o[1].detail, "use expert parallelism"));
    }
    tps_check_outcomes_free(o, n);

    n = run(p, "{\"tie_word_embeddings\": true, \"enable_moe_block\": true}", 1, &o);
    for (size_t i = 0; i < n; i++)
        CHECK(o[i].ok == 1 && !strcmp(o[i].detail, "tp 1: nothing is sharded"));
    tps_check_outcomes_free(o, n);

    /* Absent field: the default applies (tied), and no default means falsy. */
    n = run(p, "{}", 4, &o);
    if (n == 2) {
        CHECK(o[0].ok == 0);
        CHECK(o[1].ok == 1 && !strcmp(o[1].detail, "enable_moe_block not set"));
    }
    tps_check_outcomes_free(o, n);

    n = run(p, "{\"tie_word_embeddings\": false, \"enable_moe_block\": false}", 4, &o);
    if (n == 2) {
        CHECK(o[0].ok == 1 && !strcmp(o[0].detail, "tie_word_embeddings = false"));
        CHECK(o[1].ok == 1);
    }
    tps_check_outcomes_free(o, n);

    n = run(p, NULL, 4, &o);
    for (size_t i = 0; i < n; i++) CHECK(o[i].ok == -1);
    tps_check_outcomes_free(o, n);
    tps_plan_free(p);
}

static void test_errors(void)
{
    parse_fails("name: x\nrules:\n  - match: a\n    style: colwise\n  - match: b\n    stlye: x\n",
                "t.yaml:6: unknown key 'stlye' in rule", "known: match, style, when");
    parse_fails("name: x\nrules:\n  - match: a\n    style: colwsie\n",
                "t.yaml:4: unknown style 'colwsie' (known: colwise, rowwise, embedding_rowwise, "
                "embedding_colwise, replicate, sequence_parallel)", NULL);
    parse_fails("name: x\nrules:\n  - match: [a\n    style: colwise\n", "t.yaml:", "bad YAML");
    parse_fails("name: x\nrules: [\n", "t.yaml:", "bad YAML");
    parse_fails("name: x\n  bad: indent\nrules: []\n", "t.yaml:2: bad YAML", NULL);
    parse_fails("name: x\nrules: colwise\n", "t.yaml:2: 'rules' must be a list", "a string");
    parse_fails("name: x\nrules:\n  - match: a\n    style: [colwise]\n",
                "t.yaml:4: 'style' must be a string, not a list", NULL);
    parse_fails("name: x\nrules:\n  - match: {a: b}\n    style: colwise\n",
                "t.yaml:3: 'match' must be a string or a list of strings", NULL);
    parse_fails("name: x\nrules: []\nchecks:\n  - divisible: h\n    optional: 'yes'\n",
                "t.yaml:5: 'optional' must be true or false, not a string", NULL);
    parse_fails("name: x\nrules:\n  - style: colwise\n", "t.yaml:3: rule without 'match'", NULL);
    parse_fails("name: x\nrules:\n  - match: a\n", "t.yaml:3: rule without 'style'", NULL);
    parse_fails("rules: []\n", "t.yaml:1: plan without 'name'", NULL);
    parse_fails("name: x\n", "plan without 'rules'", NULL);
    parse_fails("name: x\nrules: []\nrulez: []\n", "t.yaml:3: unknown key 'rulez' in the plan",
                NULL);
    parse_fails("name: x\nname: y\nrules: []\n", "t.yaml:2: duplicate key 'name'", NULL);
    parse_fails("name: 'a b'\nrules: []\n", "plan name", NULL);
    parse_fails("- a\n- b\n", "t.yaml:1: a plan must be a mapping", NULL);
    parse_fails("", "empty plan", NULL);
    parse_fails("# only a comment\n", "empty plan", NULL);
    parse_fails("name: x\nrules: []\n---\nname: y\n", "t.yaml:3: more than one YAML document",
                NULL);
    parse_fails("name: &n x\nrules: []\ndescription: *n\n", "t.yaml:3: YAML aliases", NULL);
    parse_fails("name: !!str x\nrules: []\n", "tags", NULL);
    parse_fails("name: x\nrules:\n  - {match: lm_head.weight, style: colwise}\n",
                "t.yaml:3: pattern 'lm_head.weight' names a parameter", NULL);
    parse_fails("name: x\nrules:\n  - {match: 'a..b', style: colwise}\n", "empty dotted", NULL);
    parse_fails("name: x\nrules:\n  - {match: [], style: colwise}\n", "empty list", NULL);
    parse_fails("name: x\nrules:\n  - {match: a, style: colwise, when: {truthy: true}}\n",
                "t.yaml:3: when without 'field'", NULL);
    parse_fails("name: x\nrules:\n  - {match: a, style: colwise, when: {field: f}}\n",
                "needs one of truthy, falsy, equals or not_equals", NULL);
    parse_fails("name: x\nrules:\n  - {match: a, style: colwise, when: {field: f, truthy: true,"
                " equals: 1}}\n", "only one of", NULL);
    parse_fails("name: x\nrules:\n  - {match: a, style: colwise, when: {field: f, equals: [1]}}\n",
                "'equals' must be true, false, a number or a string, not a list", NULL);
    parse_fails("name: x\nrules: []\nchecks:\n  - reject_if: {field: f, truthy: true}\n",
                "t.yaml:4: reject_if check without 'reason'", NULL);
    parse_fails("name: x\nrules: []\nchecks:\n  - {reason: r}\n",
                "check needs 'divisible: FIELD' or 'reject_if: CONDITION'", NULL);
    parse_fails("name: x\nrules: []\nchecks:\n  - {divisible: h, name: n}\n",
                "'name' is only for reject_if", NULL);
    parse_fails("name: x\nrules: []\nchecks:\n  - {divisible: h, reject_if: {field: f, "
                "truthy: true}, reason: r}\n", "not both", NULL);
    parse_fails("name: x\ndescription: \"a\\0b\"\nrules: []\n", "NUL", NULL);

    /* Packed sections: a malformed rows expression is refused when the plan
     * is read, wherever the error lies (after a field, too), not when a
     * checkpoint first uses it. */
    static const char *const bad_rows[][2] = {
        {"num_attention_heads * * head_dim", "syntax: expected a number, a field or '('"},
        {"(num_key_value_heads * head_dim", "syntax: missing ')'"},
        {"heads * 2 )", "syntax: unexpected ')'"},
        {"hidden_size % 2", "syntax: unexpected '% 2'"},
        {"2 +", "syntax: expected a number"},
    };
    for (size_t i = 0; i < sizeof bad_rows / sizeof bad_rows[0]; i++) {
        char text[512];
        snprintf(text, sizeof text,
                 "name: x\nrules: []\npacked:\n  - match: m.*.qkv_proj\n    sections:\n"
                 "      - {name: q_proj, rows: 'hidden_size'}\n      - {name: k_proj, rows: '%s'}\n",
                 bad_rows[i][0]);
        parse_fails(text, "t.yaml:7: section 'k_proj': rows", bad_rows[i][1]);
    }
    /* Well formed, with fields no config has yet: fine until used. */
    tps_plan *pk = parse("name: x\nrules: []\npacked:\n  - match: m.*.qkv_proj\n    sections:\n"
                         "      - {name: q_proj, rows: 'num_heads * head_dim'}\n"
                         "      - {name: k_proj, rows: '(kv + 1) * (d / 2) - 3'}\n");
    CHECK(pk != NULL);
    tps_plan_free(pk);

    /* Nesting: 64 levels are fine in the tree, 65 are not. */
    char deep[400];
    size_t k = 0;
    k += (size_t)snprintf(deep + k, sizeof deep - k, "name: x\nrules: []\ndescription: ");
    for (int i = 0; i < 70; i++) deep[k++] = '[';
    for (int i = 0; i < 70; i++) deep[k++] = ']';
    deep[k++] = '\n';
    deep[k] = '\0';
    parse_fails(deep, "deeper than 64", NULL);

    /* Oversized text. */
    size_t big = ((size_t)1 << 20) + 1;
    char *t = malloc(big + 1);
    if (t) {
        memset(t, '#', big);
        t[big] = '\0';
        parse_fails(t, "more than the limit of 1 MiB", NULL);
        free(t);
    }

    /* Loading from a missing file reports the path. */
    tps_plan *p = NULL;
    CHECK(tps_plan_load(ctx, "/nonexistent/plan.yaml", &p) != TPS_OK && p == NULL);
    CHECK(strstr(tps_ctx_errmsg(ctx), "/nonexistent/plan.yaml"));
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char *rules_text(int nrules)
{
    size_t cap = 64 + (size_t)nrules * 64, k = 0;
    char *t = malloc(cap);
    if (!t) return NULL;
    k += (size_t)snprintf(t + k, cap - k, "name: big\nrules:\n");
    for (int i = 0; i < nrules; i++)
        k += (size_t)snprintf(t + k, cap - k, "- {match: m.l%d.*.p, style: %s}\n", i,
                              i % 2 ? "rowwise" : "colwise");
    return t;
}

static void test_big_plan(void)
{
    char *t = rules_text(10000);
    if (!t) return;
    double t0 = now();
    tps_plan *p = parse(t);
    double dt = now() - t0;
    CHECK_MSG(dt < 1.0, "10,000 rules took %.3f s", dt);
    if (p) {
        CHECK(p->nrules == 10000);
        CHECK(style_of(p, "m.l9999.3.p.weight", NULL) == TPS_STYLE_ROWWISE);
        CHECK(p->rules[9999].line == 10002);
        tps_plan_free(p);
    }
    free(t);
    t = rules_text(10001);
    if (t) parse_fails(t, "10001 rules, more than the limit of 10000", NULL);
    free(t);
}

static void test_plan_load_file(void)
{
    char path[] = "/tmp/tps-plan-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    const char *text = "name: file\nrules:\n  - {match: a, style: colwise}\n";
    CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    close(fd);
    tps_plan *p = NULL;
    CHECK_MSG(tps_plan_load(ctx, path, &p) == TPS_OK, "%s", tps_ctx_errmsg(ctx));
    CHECK(p && !strcmp(tps_plan_name(p), "file") && !strcmp(tps_plan_description(p), ""));
    tps_plan_free(p);
    fd = open(path, O_WRONLY | O_TRUNC);
    CHECK(write(fd, "name: file\nrules: x\n", 20) == 20);
    close(fd);
    p = NULL;
    CHECK(tps_plan_load(ctx, path, &p) == TPS_E_PLAN);
    char want[64];
    snprintf(want, sizeof want, "%s:2:", path);
    CHECK_MSG(strstr(tps_ctx_errmsg(ctx), want), "%s", tps_ctx_errmsg(ctx));
    unlink(path);
}

static void test_family_rules(void)
{
    tps_plan *g3 = NULL, *g4 = NULL, *q2 = NULL;
    CHECK(tps_plan_builtin(ctx, "gemma3", &g3) == TPS_OK);
    CHECK(tps_plan_builtin(ctx, "gemma4", &g4) == TPS_OK);
    CHECK(tps_plan_builtin(ctx, "qwen2", &q2) == TPS_OK);
    if (!g3 || !g4 || !q2) goto out;

    /* Gemma3: three text prefixes; the vision tower stays replicated. */
    CHECK(style_of(g3, "language_model.model.layers.0.self_attn.q_proj.weight", NULL) ==
          TPS_STYLE_COLWISE);
    CHECK(style_of(g3, "model.language_model.layers.3.mlp.down_proj.weight", NULL) ==
          TPS_STYLE_ROWWISE);
    CHECK(style_of(g3, "model.layers.3.self_attn.o_proj.weight", NULL) == TPS_STYLE_ROWWISE);
    CHECK(style_of(g3, "language_model.model.embed_tokens.weight", NULL) ==
          TPS_STYLE_EMBED_ROWWISE);
    CHECK(style_of(g3, "vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.weight",
                   NULL) == -1);
    CHECK(style_of(g3, "model.vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.bias",
                   NULL) == -1);
    CHECK(style_of(g3, "multi_modal_projector.mm_input_projection_weight", NULL) == -1);
    CHECK(style_of(g3, "language_model.model.layers.0.self_attn.q_norm.weight", NULL) == -1);

    /* Gemma4: per-layer table and lm_head hinge on hidden_size_per_layer_input. */
    cJSON *e = json("{\"text_config\": {\"hidden_size_per_layer_input\": 256}}");
    cJSON *d = json("{\"text_config\": {\"hidden_size_per_layer_input\": null}}");
    const char *ple = "model.language_model.embed_tokens_per_layer.weight";
    CHECK(style_of(g4, ple, e) == TPS_STYLE_EMBED_ROWWISE);
    CHECK(style_of(g4, ple, d) == -1);
    CHECK(style_of(g4, "lm_head.weight", e) == -1);
    CHECK(style_of(g4, "lm_head.weight", d) == TPS_STYLE_COLWISE);
    CHECK(style_of(g4, "model.language_model.embed_tokens.weight", e) == TPS_STYLE_EMBED_ROWWISE);
    CHECK(style_of(g4, "model.language_model.layers.5.self_attn.o_proj.weight", e) ==
          TPS_STYLE_ROWWISE);
    CHECK(style_of(g4, "model.language_model.per_layer_model_projection.weight", e) == -1);
    CHECK(style_of(g4, "model.language_model.layers.0.per_layer_input_gate.weight", e) == -1);
    CHECK(style_of(g4, "model.vision_tower.encoder.layers.0.self_attn.q_proj.weight", e) == -1);
    cJSON_Delete(e);
    cJSON_Delete(d);

    /* Qwen2 biases follow colwise rows; o_proj rowwise. */
    CHECK(style_of(q2, "model.layers.0.self_attn.k_proj.bias", NULL) == TPS_STYLE_COLWISE);
    CHECK(style_of(q2, "model.layers.0.self_attn.o_proj.weight", NULL) == TPS_STYLE_ROWWISE);
    CHECK(style_of(q2, "model.embed_tokens.weight", NULL) == TPS_STYLE_EMBED_ROWWISE);
    CHECK(style_of(q2, "lm_head.weight", NULL) == TPS_STYLE_COLWISE);
    CHECK(style_of(q2, "model.norm.weight", NULL) == -1);
out:
    tps_plan_free(g3);
    tps_plan_free(g4);
    tps_plan_free(q2);
}

/* Every conformance case: detect picks case.json's family, and the plan's
 * checks accept or reject exactly as the case expects, naming its word. */
static void test_conformance_detect_and_checks(void)
{
    const char *cases[] = {
        "gemma3-tp1", "gemma3-tp2-tied-reject", "gemma4-dense-tp2",
        "gemma4-dense-tp4-global-kv-reject", "gemma4-e-tp2", "gemma4-e-tp4-kv-reject",
        "gemma4-moe-tp2-reject", "llama-tp3", "llama-tp4-uneven-vocab", "llama-tp8-empty-shard",
        "llama-tp8-gqa-reject", "qwen2-tp2-bias-sharded-input", "qwen3-tp2-tied",
    };
    const char *top = getenv("TOP");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/testdata/conformance/%s/case.json", top ? top : ".",
                 cases[i]);
        char *ct = slurp(path);
        snprintf(path, sizeof path, "%s/testdata/conformance/%s/model/config.json",
                 top ? top : ".", cases[i]);
        char *cf = slurp(path);
        CHECK_MSG(ct && cf, "%s: cannot read case files", cases[i]);
        cJSON *cs = ct ? cJSON_Parse(ct) : NULL, *cfg = cf ? cJSON_Parse(cf) : NULL;
        free(ct);
        free(cf);
        if (!cs || !cfg) {
            cJSON_Delete(cs);
            cJSON_Delete(cfg);
            continue;
        }
        const char *family = cJSON_GetObjectItem(cs, "family")->valuestring;
        int tp = cJSON_GetObjectItem(cs, "tp")->valueint;
        int reject = !strcmp(cJSON_GetObjectItem(cs, "expect")->valuestring, "reject");
        const cJSON *word = cJSON_GetObjectItem(cs, "error_mentions");

        struct tps_ckpt ck;
        memset(&ck, 0, sizeof ck);
        ck.path = path;
        ck.config = cfg;
        tps_plan *p = NULL;
        CHECK_MSG(tps_plan_detect(ctx, &ck, &p) == TPS_OK, "%s: %s", cases[i],
                  tps_ctx_errmsg(ctx));
        if (p) {
            CHECK_MSG(!strcmp(tps_plan_name(p), family), "%s: detected %s", cases[i],
                      tps_plan_name(p));
            CHECK(tps_plan_serves(p, cfg) == 2);
            tps_check_outcome *o = NULL;
            size_t n = 0;
            CHECK(tps_plan_run_checks(ctx, p, cfg, tp, &o, &n) == TPS_OK);
            const tps_check_outcome *first_fail = NULL;
            for (size_t j = 0; j < n; j++)
                if (o[j].ok == 0 && !first_fail) first_fail = &o[j];
            CHECK_MSG(!!first_fail == reject, "%s: %s", cases[i],
                      first_fail ? first_fail->detail : "accepted");
            if (first_fail && cJSON_IsString(word)) {
                char both[2048];
                snprintf(both, sizeof both, "%s: %s", first_fail->name, first_fail->detail);
                CHECK_MSG(strstr(both, word->valuestring), "%s: '%s' lacks '%s'", cases[i], both,
                          word->valuestring);
            }
            tps_check_outcomes_free(o, n);
            tps_plan_free(p);
        }
        cJSON_Delete(cs);
        cJSON_Delete(cfg);
    }
}

static void test_detect_errors(void)
{
    struct tps_ckpt ck;
    memset(&ck, 0, sizeof ck);
    ck.path = (char *)"/m/model.safetensors";
    ck.dir = (char *)"/m";
    tps_plan *p = NULL;
    CHECK(tps_plan_detect(ctx, &ck, &p) == TPS_E_CONFIG && p == NULL);
    CHECK_MSG(strstr(tps_ctx_errmsg(ctx), "no config.json: pass --family NAME or --plan FILE"),
              "%s", tps_ctx_errmsg(ctx));
    CHECK(strstr(tps_ctx_errmsg(ctx),
                 "deepseek_v3, gemma3, gemma4, gpt_oss, llama, mistral, mixtral, phi3, qwen2, qwen3, qwen3_moe"));

    ck.config = json("{\"architectures\": [\"FalconForCausalLM\"], \"model_type\": \"falcon\"}");
    CHECK(tps_plan_detect(ctx, &ck, &p) == TPS_E_CONFIG && p == NULL);
    CHECK_MSG(strstr(tps_ctx_errmsg(ctx), "FalconForCausalLM") &&
                  strstr(tps_ctx_errmsg(ctx), "falcon") && strstr(tps_ctx_errmsg(ctx), "llama"),
              "%s", tps_ctx_errmsg(ctx));
    cJSON_Delete(ck.config);

    /* model_type alone is enough (score 1); an architecture beats it. */
    ck.config = json("{\"model_type\": \"qwen3\"}");
    CHECK(tps_plan_detect(ctx, &ck, &p) == TPS_OK && p && !strcmp(tps_plan_name(p), "qwen3"));
    if (p) CHECK(tps_plan_serves(p, ck.config) == 1);
    tps_plan_free(p);
    p = NULL;
    cJSON_Delete(ck.config);
    ck.config = json("{\"architectures\": [\"Gemma3ForCausalLM\"], \"model_type\": \"llama\"}");
    CHECK(tps_plan_detect(ctx, &ck, &p) == TPS_OK && p && !strcmp(tps_plan_name(p), "gemma3"));
    tps_plan_free(p);
    cJSON_Delete(ck.config);
}

int main(void)
{
    ctx = tps_ctx_new();
    if (!ctx) return 1;
    RUN(test_builtins_parse);
    RUN(test_builtin_unknown);
    RUN(test_style_names);
    RUN(test_match_star_one_component);
    RUN(test_match_first_wins_and_module_path);
    RUN(test_match_when);
    RUN(test_conditions);
    RUN(test_checks_divisible);
    RUN(test_checks_reject_if);
    RUN(test_errors);
    RUN(test_big_plan);
    RUN(test_plan_load_file);
    RUN(test_family_rules);
    RUN(test_conformance_detect_and_checks);
    RUN(test_detect_errors);
    tps_ctx_free(ctx);
    TEST_EXIT();
}
