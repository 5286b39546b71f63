/* jsarr.c - a manifest's two long arrays (tensors, one entry a tensor with
 * one a rank; rank_tensors) read one element at a time from its text: as a
 * cJSON tree the manifest of a 128-expert, 48-layer MoE at tp 8 (18,867
 * tensors, 25 MB) took 250 MB, and a DeepSeek-V3-shaped one's (259 MB of
 * text) 1.7 GB. The rest of the manifest is parsed whole, with each of those
 * arrays' text replaced by []. The sharded checkpoint reader and a --ranks
 * run joining an output both read manifests this way. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

size_t tps_max_manifest_entries = TPS_MAX_MANIFEST_ENTRIES;

/* Elements between two tps_heap_release calls: a release walks the whole heap
 * (tens of ms at 100 MB), so a few a pass, not one a thousand elements. */
#define JS_RELEASE_EVERY 32768

static const char *js_ws(const char *p, const char *e)
{
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

/* Past one JSON value (NULL when malformed; the full parse then says why). */
static const char *js_skip(const char *p, const char *e)
{
    int depth = 0;
    do {
        tps_text_behind(p);
        p = js_ws(p, e);
        if (p >= e) return NULL;
        if (*p == '"') {
            for (p++; p < e && *p != '"'; p++)
                if (*p == '\\') p++;
            if (p >= e) return NULL;
            p++;
        } else if (*p == '[' || *p == '{') {
            depth++;
            p++;
        } else if (*p == ']' || *p == '}') {
            if (--depth < 0) return NULL;
            p++;
        } else if (*p == ',' || *p == ':') {
            if (!depth) return NULL;
            p++;
        } else {
            const char *q = p;
            while (p < e && *p && !strchr(" \t\r\n,:]}[{\"", *p)) p++;
            if (p == q) return NULL; /* a NUL byte: no JSON token starts there */
        }
    } while (depth > 0);
    return p;
}

/* Spans of the top-level members named keys[k]; -1 when the text is not an
 * object of members (the full parse reports it). */
static int js_members(const char *t, size_t len, const char *const *keys, size_t nk, tps_js_span *out)
{
    const char *p = js_ws(t, t + len), *e = t + len;
    for (size_t k = 0; k < nk; k++) out[k].b = out[k].e = NULL;
    if (p >= e || *p != '{') return -1;
    p = js_ws(p + 1, e);
    if (p < e && *p == '}') return 0;
    for (;;) {
        if (p >= e || *p != '"') return -1;
        const char *k0 = p + 1, *k1 = js_skip(p, e);
        if (!k1) return -1;
        size_t kl = (size_t)(k1 - 1 - k0);
        p = js_ws(k1, e);
        if (p >= e || *p != ':') return -1;
        const char *v = js_ws(p + 1, e), *ve = js_skip(v, e);
        if (!ve) return -1;
        for (size_t k = 0; k < nk; k++)
            if (strlen(keys[k]) == kl && !memcmp(keys[k], k0, kl) && v < e && *v == '[') {
                out[k].b = v;
                out[k].e = ve;
            }
        p = js_ws(ve, e);
        if (p < e && *p == ',') {
            p = js_ws(p + 1, e);
            continue;
        }
        return p < e && *p == '}' ? 0 : -1;
    }
}

/* The next element of an array span: *out NULL at its end. */
static tps_err js_next(tps_ctx *ctx, const char *mpath, const char *what, const char **pp,
                       const char *e, size_t i, cJSON **out)
{
    const char *p = js_ws(*pp, e);
    *out = NULL;
    if (p < e && *p == '[') p = js_ws(p + 1, e);
    else if (p < e && *p == ',') p = js_ws(p + 1, e);
    if (p < e && *p == ']') {
        *pp = p;
        return TPS_OK;
    }
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(p, (size_t)(e - p), &end, 0);
    if (!j)
        return tps_fail(ctx, TPS_E_JSON, "%s: %s[%zu] is not valid JSON", mpath, what, i);
    *pp = end;
    *out = j;
    tps_text_behind(end);
    return TPS_OK;
}

void tps_js_iter_start(tps_js_iter *it, const tps_js_span *sp, const cJSON *arr, const char *what)
{
    cJSON_Delete(it->el);
    *it = (tps_js_iter){.b = sp->b, .p = sp->b, .e = sp->e, .next = arr->child, .what = what};
}

tps_err tps_js_iter_next(tps_ctx *ctx, const char *mpath, tps_js_iter *it, const cJSON **out)
{
    cJSON_Delete(it->el);
    it->el = NULL;
    if (!it->b) {
        *out = it->next;
        if (it->next) it->next = it->next->next;
        return TPS_OK;
    }
    TPS_TRY(js_next(ctx, mpath, it->what, &it->p, it->e, it->i, &it->el));
    /* Each element's tree is freed between what the reader keeps of it: the
     * holes go back now and then, not at the end of the read (30 MB of a
     * DTensor manifest's at DeepSeek-V3's size). */
    if (++it->i % JS_RELEASE_EVERY == 0) tps_heap_release();
    *out = it->el;
    return TPS_OK;
}

void tps_js_iter_free(tps_js_iter *it)
{
    cJSON_Delete(it->el);
    it->el = NULL;
}

tps_err tps_js_parse_manifest(tps_ctx *ctx, const char *mpath, const char *tx_p, size_t tx_len,
                              cJSON **root, tps_js_span *sp)
{
    tps_err rc = TPS_OK;
    const char *text = tx_p;
    size_t tlen = tx_len;
    char *rest = NULL;
    static const char *const big[] = {"tensors", "rank_tensors"};
    if (tps_utf8_valid(text, tlen) && js_members(text, tlen, big, 2, sp) == 0 && sp[0].b) {
        /* the rest, with both arrays' text as [] (rank_tensors after tensors or before) */
        const tps_js_span *a = &sp[0], *b = sp[1].b ? &sp[1] : NULL;
        if (b && b->b < a->b) {
            const tps_js_span *x = a;
            a = b;
            b = x;
        }
        /* what is left of the text (a few MB of a 268 MB manifest), not its size */
        rest = malloc(tlen - (size_t)(a->e - a->b) - (b ? (size_t)(b->e - b->b) : 0) + 8);
        TPS_FAIL_IF(!rest, ctx, TPS_E_NOMEM, "out of memory");
        size_t o = 0;
        memcpy(rest + o, text, (size_t)(a->b - text));
        o += (size_t)(a->b - text);
        memcpy(rest + o, "[]", 2);
        o += 2;
        const char *from = a->e, *to = b ? b->b : text + tlen;
        memcpy(rest + o, from, (size_t)(to - from));
        o += (size_t)(to - from);
        if (b) {
            memcpy(rest + o, "[]", 2);
            o += 2;
            memcpy(rest + o, b->e, (size_t)(text + tlen - b->e));
            o += (size_t)(text + tlen - b->e);
        }
        rest[o] = 0;
        /* The copied text's pages (a DeepSeek-V3-sized source's headers: 12 MB)
         * are not read again: let go, or they stay for the whole read. */
        tps_text_release(text, a->b);
        tps_text_release(a->e, b ? b->b : text + tlen);
        if (b) tps_text_release(b->e, text + tlen);
        TPS_CHECK(tps_json_parse(ctx, mpath, rest, o, root));
        free(rest);
        rest = NULL;
        /* the arrays' own syntax: each element is parsed with cJSON below */
        const char *why = NULL;
        for (int k = 0; k < 2 && !why; k++)
            if (sp[k].b) why = tps_json_prescan_span(sp[k].b, (size_t)(sp[k].e - sp[k].b));
        TPS_FAIL_IF(why, ctx, TPS_E_JSON, "%s: not valid JSON: %s", mpath, why);
    } else {
        /* not the shape a manifest has: the full parse says what is wrong */
        TPS_CHECK(tps_json_parse(ctx, mpath, text, tlen, root));
        sp[0].b = sp[1].b = NULL;
    }
out:
    free(rest);
    return rc;
}
