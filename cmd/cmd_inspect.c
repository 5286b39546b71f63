/* cmd_inspect.c - tpshard inspect MODEL [--json] */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

const char usage_inspect[] =
    "usage: tpshard inspect MODEL [--json]\n"
    "\n"
    "Lists every tensor (name, dtype, shape, bytes, file), totals by dtype, the\n"
    "config.json fields that matter for tensor parallelism, and the model family.\n"
    "MODEL is a directory (config.json + model.safetensors or an index with parts),\n"
    "one .safetensors file, or a tpshard output directory.\n"
    "\n"
    "  --json      one JSON document on stdout\n"
    "  -q, -v      quieter, more verbose\n"
    "  -h, --help  this text\n";

static void shape_str(const uint64_t *s, int n, char *buf, size_t len)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, len - o, "[");
    for (int i = 0; i < n && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%llu", i ? ", " : "", (unsigned long long)s[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

int cmd_inspect(int argc, char **argv)
{
    const char *path;
    int st = cli_parse_one_operand(argc, argv, usage_inspect, "inspect: give exactly one MODEL", &path);
    if (st >= 0) return st;
    tps_ctx *ctx = cli_ctx();
    tps_ckpt *ck = NULL;
    tps_plan *plan = NULL;
    int status = 0;
    tps_err e = tps_ckpt_open(ctx, path, &ck);
    if (e) {
        status = cli_lib_error(ctx, e);
        goto out;
    }
    if (g_json) {
        char *doc = NULL;
        status = cli_print_doc(ctx, tps_inspect_json(ctx, ck, &doc), &doc);
        goto out;
    }
    /* Family detection failing is information here, not an error. */
    const char *family = NULL;
    if (tps_ckpt_has_config(ck) && tps_plan_detect(ctx, ck, &plan) == TPS_OK) family = tps_plan_name(plan);
    size_t n = tps_ckpt_count(ck);
    uint64_t by_dtype_bytes[TPS_DTYPE_COUNT_] = {0}, by_dtype_n[TPS_DTYPE_COUNT_] = {0};
    for (size_t i = 0; i < n; i++) {
        tps_tensor_view v;
        tps_ckpt_tensor(ck, i, &v);
        by_dtype_bytes[v.dtype] += v.nbytes;
        by_dtype_n[v.dtype]++;
    }
    char buf[512], b2[64];
    const char *const *cfg_fields = tps_tp_config_fields();
    printf("model:   %s (%s, %zu file%s)\n", path, tps_src_kind_name(tps_ckpt_kind(ck)),
           tps_ckpt_file_count(ck), tps_ckpt_file_count(ck) == 1 ? "" : "s");
    if (tps_ckpt_has_config(ck)) {
        printf("family:  %s\n", family ? family : "(no built-in plan serves it; use --plan FILE)");
        printf("config:\n");
        for (const char *const *f = cfg_fields; *f; f++)
            if (tps_ckpt_config_value(ck, *f, buf, sizeof buf) == 0) printf("  %-28s %s\n", *f, buf);
    } else {
        printf("family:  unknown (no config.json; pass --family NAME or --plan FILE to plan/split)\n");
    }
    cli_quant_line(ctx, ck);
    printf("tensors: %zu, %s\n", n, cli_human(tps_ckpt_total_bytes(ck), b2, sizeof b2));
    size_t w = 4;
    for (size_t i = 0; i < n; i++) {
        tps_tensor_view v;
        tps_ckpt_tensor(ck, i, &v);
        if (strlen(v.name) > w) w = strlen(v.name);
    }
    printf("  %-*s  %-11s  %-20s  %14s  %s\n", (int)w, "NAME", "DTYPE", "SHAPE", "BYTES", "FILE");
    for (size_t i = 0; i < n; i++) {
        tps_tensor_view v;
        tps_ckpt_tensor(ck, i, &v);
        shape_str(v.shape, v.ndim, buf, sizeof buf);
        printf("  %-*s  %-11s  %-20s  %14llu  %s\n", (int)w, v.name, tps_dtype_name(v.dtype), buf,
               (unsigned long long)v.nbytes, v.file);
    }
    printf("by dtype:\n");
    for (int d = 0; d < TPS_DTYPE_COUNT_; d++)
        if (by_dtype_n[d])
            printf("  %-11s %6llu tensors  %s\n", tps_dtype_name((tps_dtype)d),
                   (unsigned long long)by_dtype_n[d], cli_human(by_dtype_bytes[d], b2, sizeof b2));
out:
    tps_plan_free(plan);
    tps_ckpt_free(ck);
    tps_ctx_free(ctx);
    return status;
}
