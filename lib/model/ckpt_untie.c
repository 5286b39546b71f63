/* ckpt_untie.c - --untie: a tied checkpoint's head made from its embedding
 * (the embedding's pieces under the head's name), and its config.json
 * rewritten to say tie_word_embeddings false, with the edits made in the
 * text so everything else in it stays as it was. */
#include "internal.h"
#include "model_int.h"

#include <stdlib.h>
#include <string.h>

const char *tps_ckpt_untied_head(const tps_ckpt *ck) { return ck ? ck->untie_head : NULL; }
const char *tps_ckpt_untied_embedding(const tps_ckpt *ck)
{
    return ck ? ck->untie_embedding : NULL;
}

tps_err tps_ckpt_untie(tps_ctx *ctx, tps_ckpt *ck, const tps_plan *plan)
{
    tps_err rc = TPS_OK;
    char *emb = NULL, *head = NULL, *text = NULL, *cfg_path = NULL;
    cJSON *cfg = NULL;
    if (!ck || !plan) return tps_fail(ctx, TPS_E_ARG, "tps_ckpt_untie: no checkpoint or plan");
    TPS_FAIL_IF(ck->untie_head, ctx, TPS_E_ARG,
                "%s: --untie: already untied (its %s was written from %s)", ck->path,
                ck->untie_head, ck->untie_embedding);
    /* Tied or not is the checkpoint's, whatever the plan knows of untying. */
    const cJSON *tied = tps_config_get(ck->config, "tie_word_embeddings");
    TPS_FAIL_IF(cJSON_IsFalse(tied), ctx, TPS_E_ARG,
                "%s: --untie: not a tied checkpoint: %s; --untie is for checkpoints whose "
                "head is the embedding",
                ck->path, tps_config_defaulted(ck->config, "tie_word_embeddings")
                              ? "config.json leaves tie_word_embeddings to its model type's "
                                "default, false"
                              : "config.json says tie_word_embeddings false");
    for (size_t j = 0; j < ck->n; j++) {
        const char *n = ck->t[j].name;
        size_t l = strlen(n);
        TPS_FAIL_IF(!strcmp(n, "lm_head.weight") ||
                        (l > 15 && !strcmp(n + l - 15, ".lm_head.weight")),
                    ctx, TPS_E_ARG,
                    "%s: --untie: not a tied checkpoint: it has its own %s", ck->path, n);
    }
    TPS_FAIL_IF(!plan->nuntie, ctx, TPS_E_ARG,
                "--untie: plan %s names no tied embedding to untie (it has no 'untie' entries; "
                "see tpshard-plan(5))",
                plan->name);
    int e = -1;
    size_t k;
    for (k = 0; k < plan->nuntie && e < 0; k++) {
        free(emb);
        emb = tps_asprintf("%s.weight", plan->untie_embedding[k]);
        TPS_FAIL_IF(!emb, ctx, TPS_E_NOMEM, "out of memory");
        e = tps_ckpt_find(ck, emb);
    }
    if (e < 0) {
        char list[512];
        size_t off = 0;
        list[0] = '\0';
        for (size_t j = 0; j < plan->nuntie && off < sizeof list; j++)
            off += (size_t)snprintf(list + off, sizeof list - off, "%s%s.weight", j ? ", " : "",
                                    plan->untie_embedding[j]);
        rc = tps_fail(ctx, TPS_E_ARG,
                      "%s: --untie: no embedding to untie: the checkpoint has none of %s (plan %s)",
                      ck->path, list, plan->name);
        goto out;
    }
    head = tps_asprintf("%s.weight", plan->untie_head[k - 1]);
    TPS_FAIL_IF(!head, ctx, TPS_E_NOMEM, "out of memory");
    /* Any head of the plan's entries present means the checkpoint has its own. */
    for (size_t j = 0; j < plan->nuntie; j++) {
        char *h = tps_asprintf("%s.weight", plan->untie_head[j]);
        TPS_FAIL_IF(!h, ctx, TPS_E_NOMEM, "out of memory");
        int there = tps_ckpt_find(ck, h) >= 0;
        if (there)
            rc = tps_fail(ctx, TPS_E_ARG,
                          "%s: --untie: not a tied checkpoint: it has its own %s", ck->path, h);
        free(h);
        if (rc) goto out;
    }
    cfg_path = tps_path_join(ck->dir, "config.json");
    TPS_FAIL_IF(!cfg_path, ctx, TPS_E_NOMEM, "out of memory");
    TPS_FAIL_IF(!ck->config || !ck->config_text, ctx, TPS_E_ARG,
                "%s: --untie needs config.json (the output's config.json must say "
                "tie_word_embeddings false)",
                ck->path);
    const cJSON *tie = tps_config_get(ck->config, "tie_word_embeddings");
    TPS_FAIL_IF(cJSON_IsFalse(tie), ctx, TPS_E_ARG,
                "%s: --untie: not a tied checkpoint: tie_word_embeddings is false (and it has no "
                "%s: a head is missing rather than tied)",
                cfg_path, head);
    const tps_ctensor *et = &ck->t[e];
    TPS_FAIL_IF(et->ndim != 2, ctx, TPS_E_SHAPE,
                "%s: --untie: embedding '%s' is %d-D; a head's weight is 2-D [vocab, hidden]",
                ck->path, et->name, et->ndim);
    text = tps_json_untie_text(ck->config_text, strlen(ck->config_text));
    TPS_FAIL_IF(!text, ctx, TPS_E_CONFIG, "%s: --untie: cannot set tie_word_embeddings in it",
                cfg_path);
    TPS_CHECK(tps_json_parse(ctx, cfg_path, text, strlen(text), &cfg));
    TPS_CHECK(tps_config_resolve(ctx, cfg));
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(cfg, "text_config");
    TPS_FAIL_IF(!cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(cfg, "tie_word_embeddings")) ||
                    (cJSON_IsObject(tc) &&
                     !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(tc, "tie_word_embeddings"))),
                ctx, TPS_E_CONFIG,
                "%s: --untie: cannot set tie_word_embeddings to false in it (a key written with "
                "escapes?)",
                cfg_path);
    /* The head: the embedding's pieces under a new name. */
    TPS_CHECK(tps_ck_grow_tensors(ctx, ck, 1));
    tps_ctensor *ht = &ck->t[ck->n];
    *ht = ck->t[e];
    ht->name = head;
    ht->derived_from = ck->t[e].name;
    /* placement: the embedding's, borrowed as it is (the checkpoint keeps it) */
    ck->n++;
    ck->untie_head = head;
    head = NULL;
    ck->untie_embedding = tps_strdup(ck->t[e].name);
    ck->untie_config = tps_strdup(ck->config_text);
    TPS_FAIL_IF(!ck->untie_embedding || !ck->untie_config, ctx, TPS_E_NOMEM, "out of memory");
    TPS_CHECK(tps_ck_sort_and_dedup(ctx, ck));
    cJSON_Delete(ck->config);
    ck->config = cfg;
    cfg = NULL;
    ck->config_out = text;
    text = NULL;
out:
    free(emb);
    free(head);
    free(text);
    free(cfg_path);
    cJSON_Delete(cfg);
    return rc;
}

/* ------------------------------------------------------------------ config text */

/* Just enough JSON scanning to find spans in text cJSON already accepted. */
static size_t skip_ws(const char *s, size_t n, size_t i)
{
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
    return i;
}

static size_t skip_string(const char *s, size_t n, size_t i) /* at '"' */
{
    for (i++; i < n && s[i] != '"'; i++)
        if (s[i] == '\\') i++;
    return i < n ? i + 1 : n;
}

static size_t skip_value(const char *s, size_t n, size_t i)
{
    if (i >= n) return n;
    if (s[i] == '"') return skip_string(s, n, i);
    if (s[i] == '{' || s[i] == '[') {
        size_t depth = 0;
        while (i < n) {
            if (s[i] == '"') {
                i = skip_string(s, n, i);
                continue;
            }
            if (s[i] == '{' || s[i] == '[') depth++;
            else if ((s[i] == '}' || s[i] == ']') && --depth == 0) return i + 1;
            i++;
        }
        return n;
    }
    while (i < n && !strchr(",}] \t\r\n", s[i])) i++;
    return i;
}

typedef struct {
    size_t at, end; /* replace [at, end) (end == at: insert) */
    const char *with;
    char *owned;
} edit;

/* The edits that make the object starting at s[i] == '{' say
 * tie_word_embeddings false; *tc gets the span of its text_config object
 * value when it has one (else 0). Returns the edits added to ed. */
static size_t object_edits(const char *s, size_t n, size_t i, edit *ed, size_t max, size_t *tc)
{
    static const char key[] = "\"tie_word_embeddings\"";
    size_t ne = 0, open = i, members = 0;
    if (tc) *tc = 0;
    i = skip_ws(s, n, i + 1);
    while (i < n && s[i] == '"') {
        size_t k0 = i;
        i = skip_string(s, n, i);
        size_t klen = i - k0;
        i = skip_ws(s, n, i);
        if (i < n && s[i] == ':') i = skip_ws(s, n, i + 1);
        size_t v0 = i;
        i = skip_value(s, n, i);
        members++;
        if (klen == sizeof key - 1 && !memcmp(s + k0, key, klen) && ne < max)
            ed[ne++] = (edit){.at = v0, .end = i, .with = "false"};
        if (tc && klen == 13 && !memcmp(s + k0, "\"text_config\"", 13) && v0 < n && s[v0] == '{')
            *tc = v0;
        i = skip_ws(s, n, i);
        if (i < n && s[i] == ',') i = skip_ws(s, n, i + 1);
    }
    if (ne == 0 && ne < max) {
        /* Inserted first, indented as the object's first member is. */
        size_t w = skip_ws(s, n, open + 1);
        const char *nl = memchr(s + open + 1, '\n', w - open - 1);
        int indent = nl ? (int)(s + w - nl - 1) : 0;
        char *t = tps_asprintf("%s%*s\"tie_word_embeddings\": false%s", nl ? "\n" : "", indent, "",
                               members ? "," : "");
        ed[ne++] = (edit){.at = open + 1, .end = open + 1, .with = t, .owned = t};
    }
    return ne;
}

static int edit_cmp(const void *a, const void *b)
{
    const edit *x = a, *y = b;
    return x->at < y->at ? -1 : x->at > y->at;
}

char *tps_json_untie_text(const char *text, size_t len)
{
    edit ed[64];
    size_t ne = 0, tc = 0, i = skip_ws(text, len, 0);
    if (i >= len || text[i] != '{') return NULL;
    ne = object_edits(text, len, i, ed, 32, &tc);
    if (tc) ne += object_edits(text, len, tc, ed + ne, 32, NULL);
    qsort(ed, ne, sizeof *ed, edit_cmp);
    size_t cap = len + 1, o = 0, at = 0;
    for (size_t k = 0; k < ne; k++) cap += ed[k].with ? strlen(ed[k].with) : 0;
    char *out = tps_xmalloc(cap);
    for (size_t k = 0; k < ne; k++) {
        if (!out || !ed[k].with || ed[k].at < at) {
            free(out);
            out = NULL;
            break;
        }
        memcpy(out + o, text + at, ed[k].at - at);
        o += ed[k].at - at;
        memcpy(out + o, ed[k].with, strlen(ed[k].with));
        o += strlen(ed[k].with);
        at = ed[k].end;
    }
    if (out) {
        memcpy(out + o, text + at, len - at);
        out[o + len - at] = '\0';
    }
    for (size_t k = 0; k < ne; k++) free(ed[k].owned);
    return out;
}
