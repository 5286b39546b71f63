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

tps_err tps_ck_open_index(tps_ctx *ctx, tps_ckpt *ck, const char *ipath)
{
    tps_err rc = TPS_OK;
    cJSON *idx = NULL;
    TPS_CHECK(load_json_file(ctx, ipath, &idx));
    TPS_FAIL_IF(!cJSON_IsObject(idx), ctx, TPS_E_INDEX, "%s: not a JSON object", ipath);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(idx, "weight_map");
    TPS_FAIL_IF(!cJSON_IsObject(wm), ctx, TPS_E_INDEX, "%s: weight_map is missing or not an object",
                ipath);
    const char *dup = tps_json_dup_key(wm);
    TPS_FAIL_IF(dup, ctx, TPS_E_INDEX, "%s: weight_map: tensor '%s' listed twice", ipath, dup);
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(idx, "metadata");
    if (cJSON_IsObject(meta)) ck->index_meta = cJSON_Duplicate(meta, 1);
    /* Open each named part once, in first-mention order (consecutive entries
     * mostly name the same part: that one is tried first). */
    size_t last = 0;
    for (const cJSON *e = wm->child; e; e = e->next) {
        TPS_FAIL_IF(!cJSON_IsString(e), ctx, TPS_E_INDEX,
                    "%s: weight_map['%s'] is not a file name string", ipath, e->string);
        const char *fn = e->valuestring;
        TPS_FAIL_IF(!tps_ck_plain_name(fn), ctx, TPS_E_INDEX,
                    "%s: weight_map['%s'] names '%s': file names must be plain names inside the "
                    "model directory (no '/', '..' or absolute paths)",
                    ipath, e->string, fn);
        size_t k = last;
        if (k >= ck->nfiles || strcmp(ck->files[k].name, fn) != 0)
            for (k = 0; k < ck->nfiles; k++)
                if (strcmp(ck->files[k].name, fn) == 0) break;
        last = k;
        if (k == ck->nfiles) {
            char *pp = tps_path_join(ck->dir, fn);
            int there = pp && tps_exists(pp);
            free(pp);
            TPS_FAIL_IF(!there, ctx, TPS_E_INDEX, "%s: part '%s' (holding '%s') is missing", ipath, fn,
                        e->string);
            size_t fi;
            TPS_CHECK(tps_ck_add_file(ctx, ck, fn, &fi));
            TPS_CHECK(tps_ck_add_file_tensors(ctx, ck, fi));
        }
    }
    TPS_FAIL_IF(ck->nfiles == 0, ctx, TPS_E_INDEX, "%s: weight_map is empty", ipath);
    TPS_CHECK(tps_ck_sort_and_dedup(ctx, ck));
    /* Every tensor in the file the map names, and nothing unmapped: each map
     * entry found by bisection (the table is sorted now), not each tensor
     * looked up in the map, which cJSON searches linearly (quadratic at
     * DeepSeek-V3's 92k tensors: 40 s). */
    const cJSON **of = tps_xcalloc(ck->n ? ck->n : 1, sizeof *of);
    TPS_FAIL_IF(!of, ctx, TPS_E_NOMEM, "%s: out of memory", ipath);
    size_t mapped = 0;
    for (const cJSON *e = wm->child; e; e = e->next) {
        int i = tps_ckpt_find(ck, e->string);
        if (i >= 0) of[i] = e;
        mapped++;
    }
    for (size_t i = 0; i < ck->n && rc == TPS_OK; i++) {
        const cJSON *e = of[i];
        if (!e)
            rc = tps_fail(ctx, TPS_E_INDEX, "%s: tensor '%s' is in %s but not in the index's weight_map",
                          ipath, ck->t[i].name, ck->t[i].origin);
        else if (strcmp(e->valuestring, ck->t[i].origin) != 0)
            rc = tps_fail(ctx, TPS_E_INDEX,
                          "%s: tensor '%s' is in %s but the index puts it in %s (tensor in wrong part)",
                          ipath, ck->t[i].name, ck->t[i].origin, e->valuestring);
    }
    free(of);
    if (rc != TPS_OK) goto out;
    if (mapped != ck->n) {
        for (const cJSON *e = wm->child; e; e = e->next)
            TPS_FAIL_IF(tps_ckpt_find(ck, e->string) < 0, ctx, TPS_E_INDEX,
                        "%s: tensor '%s' is mapped to %s but that file does not hold it", ipath,
                        e->string, e->valuestring);
    }
    const cJSON *ts = cJSON_IsObject(meta) ? cJSON_GetObjectItemCaseSensitive(meta, "total_size") : NULL;
    if (cJSON_IsNumber(ts)) {
        uint64_t sum = 0;
        for (size_t i = 0; i < ck->n; i++) sum += ck->t[i].nbytes;
        if ((double)sum != ts->valuedouble)
            tps_log(ctx, TPS_LOG_WARN, "%s: metadata.total_size is %.0f but the tensors hold %llu bytes",
                    ipath, ts->valuedouble, (unsigned long long)sum);
    }
out:
    cJSON_Delete(idx);
    return rc;
}
