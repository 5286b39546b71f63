/* ckpt_index.c - opening a directory through its
 * model.safetensors.index.json: the weight_map read and checked (plain part
 * names, no tensor twice, every tensor in the part the map names and
 * nothing unmapped), each part opened once, and metadata.total_size
 * compared. */
#include "internal.h"
#include "model_int.h"

#include <stdlib.h>
#include <string.h>

static tps_err load_json_file(tps_ctx *ctx, const char *path, cJSON **out)
{
    char *buf = NULL;
    size_t len = 0;
    TPS_TRY(tps_read_file(ctx, path, MAX_JSON_FILE, &buf, &len));
    tps_err rc = tps_json_parse(ctx, path, buf, len, out);
    free(buf);
    return rc;
}

/* A weight_map entry, kept once the index's JSON is let go: the tensor's
 * name (in one block for all) and its part. */
typedef struct {
    const char *name;
    uint32_t part; /* into parts */
} ientry;

tps_err tps_ck_open_index(tps_ctx *ctx, tps_ckpt *ck, const char *ipath)
{
    tps_err rc = TPS_OK;
    cJSON *idx = NULL;
    ientry *ent = NULL;
    char *names = NULL;
    char **parts = NULL; /* the part names, in first-mention order */
    size_t nent = 0, nparts = 0;
    TPS_CHECK(load_json_file(ctx, ipath, &idx));
    TPS_FAIL_IF(!cJSON_IsObject(idx), ctx, TPS_E_INDEX, "%s: not a JSON object", ipath);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(idx, "weight_map");
    TPS_FAIL_IF(!cJSON_IsObject(wm), ctx, TPS_E_INDEX, "%s: weight_map is missing or not an object",
                ipath);
    const char *dup = tps_json_dup_key(wm);
    TPS_FAIL_IF(dup, ctx, TPS_E_INDEX, "%s: weight_map: tensor '%s' listed twice", ipath, dup);
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(idx, "metadata");
    if (cJSON_IsObject(meta)) ck->index_meta = cJSON_Duplicate(meta, 1);
    /* The map copied out (a DeepSeek-V3 index's JSON tree is 16 MB; its
     * names, 4), the tree let go before the parts' headers are read. */
    size_t nbytes = 0;
    for (const cJSON *e = wm->child; e; e = e->next) {
        TPS_FAIL_IF(!cJSON_IsString(e), ctx, TPS_E_INDEX,
                    "%s: weight_map['%s'] is not a file name string", ipath, e->string);
        TPS_FAIL_IF(!tps_ck_plain_name(e->valuestring), ctx, TPS_E_INDEX,
                    "%s: weight_map['%s'] names '%s': file names must be plain names inside the "
                    "model directory (no '/', '..' or absolute paths)",
                    ipath, e->string, e->valuestring);
        nbytes += strlen(e->string) + 1;
        nent++;
    }
    TPS_FAIL_IF(nent == 0, ctx, TPS_E_INDEX, "%s: weight_map is empty", ipath);
    ent = tps_xmalloc(nent * sizeof *ent);
    names = tps_xmalloc(nbytes ? nbytes : 1);
    TPS_FAIL_IF(!ent || !names, ctx, TPS_E_NOMEM, "%s: out of memory", ipath);
    {
        size_t k = 0, at = 0, last = 0;
        for (const cJSON *e = wm->child; e; e = e->next, k++) {
            size_t n = strlen(e->string) + 1;
            memcpy(names + at, e->string, n);
            ent[k].name = names + at;
            at += n;
            /* consecutive entries mostly name the same part: that one is tried first */
            size_t p = last;
            if (p >= nparts || strcmp(parts[p], e->valuestring) != 0)
                for (p = 0; p < nparts; p++)
                    if (strcmp(parts[p], e->valuestring) == 0) break;
            if (p == nparts) {
                char **np = realloc(parts, (nparts + 1) * sizeof *np);
                TPS_FAIL_IF(!np, ctx, TPS_E_NOMEM, "%s: out of memory", ipath);
                parts = np;
                TPS_FAIL_IF(!(parts[nparts++] = tps_strdup(e->valuestring)), ctx, TPS_E_NOMEM,
                            "%s: out of memory", ipath);
            }
            TPS_FAIL_IF(p > UINT32_MAX, ctx, TPS_E_INDEX, "%s: too many parts", ipath);
            ent[k].part = (uint32_t)p;
            last = p;
        }
    }
    const cJSON *ts = cJSON_IsObject(meta) ? cJSON_GetObjectItemCaseSensitive(meta, "total_size") : NULL;
    int has_total = cJSON_IsNumber(ts);
    double total = has_total ? ts->valuedouble : 0;
    cJSON_Delete(idx);
    idx = NULL;
    tps_heap_release();
    /* Open each named part once, in first-mention order. */
    for (size_t p = 0; p < nparts; p++) {
        char *pp = tps_path_join(ck->dir, parts[p]);
        int there = pp && tps_exists(pp);
        free(pp);
        if (!there) {
            size_t k = 0;
            while (k + 1 < nent && ent[k].part != p) k++;
            TPS_FAIL_IF(1, ctx, TPS_E_INDEX, "%s: part '%s' (holding '%s') is missing", ipath,
                        parts[p], ent[k].name);
        }
        size_t fi;
        TPS_CHECK(tps_ck_add_file(ctx, ck, parts[p], &fi));
        TPS_CHECK(tps_ck_add_file_tensors(ctx, ck, fi));
    }
    TPS_CHECK(tps_ck_sort_and_dedup(ctx, ck));
    /* Every tensor in the file the map names, and nothing unmapped: each map
     * entry found by bisection (the table is sorted now). */
    {
        int32_t *of = tps_xmalloc((ck->n ? ck->n : 1) * sizeof *of);
        TPS_FAIL_IF(!of, ctx, TPS_E_NOMEM, "%s: out of memory", ipath);
        for (size_t i = 0; i < ck->n; i++) of[i] = -1;
        size_t mapped = 0;
        for (size_t k = 0; k < nent; k++) {
            int i = tps_ckpt_find(ck, ent[k].name);
            if (i >= 0) of[i] = (int32_t)ent[k].part;
            mapped++;
        }
        for (size_t i = 0; i < ck->n && rc == TPS_OK; i++) {
            if (of[i] < 0)
                rc = tps_fail(ctx, TPS_E_INDEX,
                              "%s: tensor '%s' is in %s but not in the index's weight_map", ipath,
                              ck->t[i].name, ck->t[i].origin);
            else if (strcmp(parts[of[i]], ck->t[i].origin) != 0)
                rc = tps_fail(ctx, TPS_E_INDEX,
                              "%s: tensor '%s' is in %s but the index puts it in %s (tensor in "
                              "wrong part)",
                              ipath, ck->t[i].name, ck->t[i].origin, parts[of[i]]);
        }
        free(of);
        if (rc != TPS_OK) goto out;
        if (mapped != ck->n) {
            for (size_t k = 0; k < nent; k++)
                TPS_FAIL_IF(tps_ckpt_find(ck, ent[k].name) < 0, ctx, TPS_E_INDEX,
                            "%s: tensor '%s' is mapped to %s but that file does not hold it",
                            ipath, ent[k].name, parts[ent[k].part]);
        }
    }
    if (has_total) {
        uint64_t sum = 0;
        for (size_t i = 0; i < ck->n; i++) sum += ck->t[i].nbytes;
        if ((double)sum != total)
            tps_log(ctx, TPS_LOG_WARN, "%s: metadata.total_size is %.0f but the tensors hold %llu bytes",
                    ipath, total, (unsigned long long)sum);
    }
out:
    cJSON_Delete(idx);
    free(ent);
    free(names);
    for (size_t p = 0; p < nparts; p++) free(parts[p]);
    free(parts);
    return rc;
}
