/* The library's JSON documents: the error document escapes what JSON must,
 * every document is compact and opens with ok and schema_version, and the
 * shared defaults (default split output, --layout values) behave as the CLI
 * always did. */
#include "internal.h"
#include "test.h"

static void error_document_escapes(void)
{
    char *doc = NULL;
    CHECK(tps_error_json(NULL, "a \"b\"\\c\n\t\x01 é", &doc) == TPS_OK);
    CHECK_MSG(doc && !strcmp(doc, "{\"ok\":false,\"schema_version\":1,"
                                  "\"error\":\"a \\\"b\\\"\\\\c\\n\\t\\u0001 é\"}"),
              "%s", doc ? doc : "(null)");
    tps_free(doc);
    tps_free(NULL);
    /* A long message grows the buffer. */
    char big[20000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    CHECK(tps_error_json(NULL, big, &doc) == TPS_OK);
    size_t frame = strlen("{\"ok\":false,\"schema_version\":1,\"error\":\"\"}");
    CHECK(doc && strlen(doc) == sizeof big - 1 + frame);
    tps_free(doc);
}

static void plan_list_document(void)
{
    tps_ctx *ctx = tps_ctx_new();
    char *doc = NULL;
    CHECK(tps_plan_list_json(ctx, &doc) == TPS_OK);
    CHECK(doc && !strncmp(doc, "{\"ok\":true,\"schema_version\":1,\"plans\":[{\"name\":", 47));
    CHECK(doc && strstr(doc, "{\"name\":\"dtensor\",\"target\":null}"));
    CHECK(doc && !strchr(doc, '\n'));
    /* What the library parses back is the same document. */
    cJSON *j = NULL;
    CHECK(doc && tps_json_parse(ctx, "plan list", doc, strlen(doc), &j) == TPS_OK);
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(j, "plans")) == (int)tps_plan_builtin_count());
    cJSON_Delete(j);
    tps_free(doc);
    tps_ctx_free(ctx);
}

static void layout_values(void)
{
    tps_ctx *ctx = tps_ctx_new();
    tps_layout_spec *s = (tps_layout_spec *)1;
    CHECK(tps_layout_spec_open(ctx, NULL, &s) == TPS_OK && s == NULL);
    CHECK(tps_layout_spec_open(ctx, "dtensor", &s) == TPS_OK && s == NULL);
    CHECK(tps_layout_spec_open(ctx, "vllm", &s) == TPS_OK && s &&
          !strcmp(tps_layout_spec_name(s), "vllm"));
    tps_layout_spec_free(s);
    CHECK(tps_layout_spec_open(ctx, "nope", &s) != TPS_OK && s == NULL);
    /* a path is a file, even when it does not exist */
    CHECK(tps_layout_spec_open(ctx, "./vllm", &s) == TPS_E_IO && s == NULL);
    CHECK(strstr(tps_ctx_errmsg(ctx), "./vllm") != NULL);
    tps_ctx_free(ctx);
}

int main(void)
{
    RUN(error_document_escapes);
    RUN(plan_list_document);
    RUN(layout_values);
    TEST_EXIT();
}
