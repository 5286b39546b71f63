/* report.c - the JSON documents every front end prints (`tpshard <command>
 * --json`, the Python module's results), and the defaults the front ends
 * share. Made here so that the CLI and a binding cannot drift apart: they
 * print these strings, nothing of their own. */
#include "internal.h"

#include <libgen.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ the writer */

/* Compact JSON into a growable buffer: commas and nesting handled. Running
 * out of memory sets `sb.oom`; the document is then dropped at the end, so
 * the calls in between need no checks. */
typedef struct {
    tps_sbuf sb; /* the text; sb.oom: out of memory */
    int depth;
    int need_comma[32];
    char close[32];
    int after_key;
} jw;

static void jw_put(jw *w, const char *s, size_t n) { tps_sb_put(&w->sb, s, n); }

static void jw_puts(jw *w, const char *s) { jw_put(w, s, strlen(s)); }

static void jw_printf(jw *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void jw_printf(jw *w, const char *fmt, ...)
{
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp) w->sb.oom = 1;
    else jw_put(w, tmp, (size_t)n);
}

static void jw_sink(void *user, const char *p, size_t n) { jw_put(user, p, n); }

static void jw_escaped(jw *w, const char *s) { tps_json_quote(s, jw_sink, w); }

static void jw_pre(jw *w)
{
    if (w->after_key) {
        w->after_key = 0;
        return;
    }
    if (w->depth > 0 && w->need_comma[w->depth]) jw_put(w, ",", 1);
    if (w->depth > 0) w->need_comma[w->depth] = 1;
}

static void jw_open(jw *w, char open, char close)
{
    jw_pre(w);
    if (w->depth + 1 >= (int)(sizeof w->close)) {
        w->sb.oom = 1;
        return;
    }
    jw_put(w, &open, 1);
    w->need_comma[++w->depth] = 0;
    w->close[w->depth] = close;
}

static void jw_obj(jw *w) { jw_open(w, '{', '}'); }
static void jw_arr(jw *w) { jw_open(w, '[', ']'); }

static void jw_end(jw *w)
{
    if (w->depth > 0) jw_put(w, &w->close[w->depth--], 1);
}

static void jw_key(jw *w, const char *k)
{
    jw_pre(w);
    jw_escaped(w, k);
    jw_put(w, ":", 1);
    w->after_key = 1;
}

static void jw_str(jw *w, const char *s)
{
    jw_pre(w);
    if (s) jw_escaped(w, s);
    else jw_puts(w, "null");
}

static void jw_int(jw *w, int64_t v)
{
    jw_pre(w);
    jw_printf(w, "%lld", (long long)v);
}

static void jw_uint(jw *w, uint64_t v)
{
    jw_pre(w);
    jw_printf(w, "%llu", (unsigned long long)v);
}

static void jw_num(jw *w, double v)
{
    jw_pre(w);
    if (isfinite(v)) jw_printf(w, "%.9g", v);
    else jw_puts(w, "null");
}

static void jw_bool(jw *w, int v)
{
    jw_pre(w);
    jw_puts(w, v ? "true" : "false");
}

static void jw_null(jw *w)
{
    jw_pre(w);
    jw_puts(w, "null");
}

static void jw_raw(jw *w, const char *json)
{
    jw_pre(w);
    jw_puts(w, json);
}

static void jw_kstr(jw *w, const char *k, const char *v) { jw_key(w, k); jw_str(w, v); }
static void jw_kint(jw *w, const char *k, int64_t v) { jw_key(w, k); jw_int(w, v); }
static void jw_kuint(jw *w, const char *k, uint64_t v) { jw_key(w, k); jw_uint(w, v); }
static void jw_knum(jw *w, const char *k, double v) { jw_key(w, k); jw_num(w, v); }
static void jw_kbool(jw *w, const char *k, int v) { jw_key(w, k); jw_bool(w, v); }

/* Every document opens with these two keys. */
static void jw_begin(jw *w, int ok)
{
    jw_obj(w);
    jw_kbool(w, "ok", ok);
    jw_kint(w, "schema_version", TPS_JSON_SCHEMA_VERSION);
}

/* Closes the document and hands it over (*out owned by the caller). */
static tps_err jw_finish(tps_ctx *ctx, jw *w, char **out)
{
    while (w->depth > 0) jw_end(w);
    if (w->sb.oom || !w->sb.p) {
        free(w->sb.p);
        *out = NULL;
        return tps_fail(ctx, TPS_E_NOMEM, "out of memory for a JSON document");
    }
    *out = w->sb.p;
    return TPS_OK;
}

void tps_free(void *p) { free(p); }

/* ------------------------------------------------------------------ shared pieces */

static const char *const tp_config_fields[] = {
    "architectures", "model_type", "num_attention_heads", "num_key_value_heads",
    "num_global_key_value_heads", "head_dim", "hidden_size", "intermediate_size", "vocab_size",
    "num_hidden_layers", "tie_word_embeddings", "hidden_size_per_layer_input",
    "vocab_size_per_layer_input", "enable_moe_block", "torch_dtype", "num_experts",
    "moe_intermediate_size", NULL};

const char *const *tps_tp_config_fields(void) { return tp_config_fields; }

const char *tps_src_kind_name(tps_src_kind k)
{
    switch (k) {
    case TPS_SRC_FILE: return "file";
    case TPS_SRC_DIR: return "directory";
    case TPS_SRC_INDEX: return "index";
    case TPS_SRC_SHARDED: return "tpshard output";
    }
    return "?";
}

static void json_shape(jw *w, const char *key, const uint64_t *shape, int ndim)
{
    jw_key(w, key);
    jw_arr(w);
    for (int d = 0; d < ndim; d++) jw_uint(w, shape[d]);
    jw_end(w);
}

/* A "quantization" key: null when none (or on a failure, which inspect and
 * plan show elsewhere). */
static void json_quant(jw *w, tps_ctx *ctx, const tps_ckpt *ck)
{
    tps_quant_view q;
    jw_key(w, "quantization");
    if (tps_ckpt_quantization(ctx, ck, &q) || !q.method) {
        jw_null(w);
        return;
    }
    jw_obj(w);
    jw_kstr(w, "method", q.method);
    jw_kbool(w, "supported", q.supported);
    if (!q.supported) jw_kstr(w, "problem", q.problem);
    jw_key(w, "block_size");
    if (q.block_rows) {
        jw_arr(w);
        jw_uint(w, q.block_rows);
        jw_uint(w, q.block_cols);
        jw_end(w);
    } else {
        jw_null(w);
    }
    jw_kuint(w, "quantized_weights", q.weights);
    jw_key(w, "scales");
    jw_obj(w);
    jw_kuint(w, "block", q.block_scales);
    jw_kuint(w, "channel", q.channel_scales);
    jw_kuint(w, "tensor", q.tensor_scales);
    jw_end(w);
    jw_kuint(w, "input_scales", q.input_scales);
    jw_key(w, "bits");
    if (q.bits) jw_uint(w, (uint64_t)q.bits);
    else jw_null(w);
    jw_key(w, "group_size");
    if (q.bits) jw_int(w, q.group_size);
    else jw_null(w);
    jw_end(w);
}

/* ------------------------------------------------------------------ the documents */

tps_err tps_error_json(tps_ctx *ctx, const char *message, char **out)
{
    jw w = {0};
    jw_begin(&w, 0);
    jw_kstr(&w, "error", message ? message : "");
    return jw_finish(ctx, &w, out);
}

tps_err tps_inspect_json(tps_ctx *ctx, const tps_ckpt *ck, char **out)
{
    jw w = {0};
    tps_plan *plan = NULL;
    /* Family detection failing is information here, not an error. */
    const char *family = NULL;
    if (tps_ckpt_has_config(ck) && tps_plan_detect(ctx, ck, &plan) == TPS_OK)
        family = tps_plan_name(plan);
    size_t n = tps_ckpt_count(ck);
    uint64_t by_bytes[TPS_DTYPE_COUNT_] = {0}, by_n[TPS_DTYPE_COUNT_] = {0};
    for (size_t i = 0; i < n; i++) {
        tps_tensor_view v;
        tps_ckpt_tensor(ck, i, &v);
        by_bytes[v.dtype] += v.nbytes;
        by_n[v.dtype]++;
    }
    char buf[512];
    jw_begin(&w, 1);
    jw_kstr(&w, "model", tps_ckpt_path(ck));
    jw_kstr(&w, "kind", tps_src_kind_name(tps_ckpt_kind(ck)));
    jw_key(&w, "files");
    jw_arr(&w);
    for (size_t i = 0; i < tps_ckpt_file_count(ck); i++) jw_str(&w, tps_ckpt_file(ck, i));
    jw_end(&w);
    jw_kstr(&w, "family", family);
    jw_key(&w, "config");
    if (tps_ckpt_has_config(ck)) {
        jw_obj(&w);
        for (const char *const *f = tp_config_fields; *f; f++) {
            jw_key(&w, *f);
            if (tps_ckpt_config_value(ck, *f, buf, sizeof buf) == 0) jw_raw(&w, buf);
            else jw_null(&w);
        }
        jw_end(&w);
    } else {
        jw_null(&w);
    }
    json_quant(&w, ctx, ck);
    jw_kuint(&w, "tensor_count", n);
    jw_kuint(&w, "total_bytes", tps_ckpt_total_bytes(ck));
    jw_key(&w, "dtypes");
    jw_obj(&w);
    for (int d = 0; d < TPS_DTYPE_COUNT_; d++)
        if (by_n[d]) {
            jw_key(&w, tps_dtype_name((tps_dtype)d));
            jw_obj(&w);
            jw_kuint(&w, "tensors", by_n[d]);
            jw_kuint(&w, "bytes", by_bytes[d]);
            jw_end(&w);
        }
    jw_end(&w);
    jw_key(&w, "tensors");
    jw_arr(&w);
    for (size_t i = 0; i < n; i++) {
        tps_tensor_view v;
        tps_ckpt_tensor(ck, i, &v);
        jw_obj(&w);
        jw_kstr(&w, "name", v.name);
        jw_kstr(&w, "dtype", tps_dtype_name(v.dtype));
        json_shape(&w, "shape", v.shape, v.ndim);
        jw_kuint(&w, "bytes", v.nbytes);
        jw_kstr(&w, "file", v.file);
        jw_end(&w);
    }
    jw_end(&w);
    tps_plan_free(plan);
    return jw_finish(ctx, &w, out);
}

static void json_layers(jw *w, const tps_layout *L)
{
    jw_key(w, "layers");
    jw_arr(w);
    for (size_t i = 0; i < tps_layout_layer_count(L); i++) {
        tps_layer_view v;
        tps_layout_layer(L, i, &v);
        jw_obj(w);
        jw_kint(w, "layer", (int64_t)i);
        jw_kstr(w, "type", v.type);
        jw_key(w, "num_attention_heads");
        v.heads < 0 ? jw_null(w) : jw_int(w, v.heads);
        jw_key(w, "num_key_value_heads");
        v.kv_heads < 0 ? jw_null(w) : jw_int(w, v.kv_heads);
        jw_key(w, "head_dim");
        v.head_dim < 0 ? jw_null(w) : jw_int(w, v.head_dim);
        /* Where the fields that are not the config's own came from. */
        jw_key(w, "from");
        jw_obj(w);
        if (v.heads_from) jw_kstr(w, "num_attention_heads", v.heads_from);
        if (v.kv_heads_from) jw_kstr(w, "num_key_value_heads", v.kv_heads_from);
        if (v.head_dim_from) jw_kstr(w, "head_dim", v.head_dim_from);
        jw_end(w);
        jw_end(w);
    }
    jw_end(w);
}

/* The pipeline stages: each one's layers and ranks (one stage at pp 1). */
static void json_stages(jw *w, const tps_layout *L)
{
    jw_key(w, "stages");
    jw_arr(w);
    for (int s = 0; s < L->pp; s++) {
        int first, n;
        tps_layout_stage(L, s, &first, &n);
        jw_obj(w);
        jw_kint(w, "stage", s);
        jw_key(w, "layers");
        jw_arr(w);
        jw_int(w, first);
        jw_int(w, first + n);
        jw_end(w);
        jw_key(w, "ranks");
        jw_arr(w);
        jw_int(w, s * L->tp);
        jw_int(w, (s + 1) * L->tp);
        jw_end(w);
        jw_end(w);
    }
    jw_end(w);
}

/* A serving layout: every rank file's tensors and their pieces. */
static void json_rank_tensors(jw *w, const tps_layout *L)
{
    jw_key(w, "rank_tensors");
    jw_arr(w);
    for (int r = 0; r < L->nranks; r++)
        for (size_t k = 0; k < tps_layout_rank_tensor_count(L, r); k++) {
            tps_rank_tensor_view rv;
            tps_layout_rank_tensor(L, r, k, &rv);
            jw_obj(w);
            jw_kint(w, "rank", r);
            jw_kstr(w, "name", rv.name);
            jw_kstr(w, "dtype", tps_dtype_name(rv.dtype));
            json_shape(w, "shape", rv.shape, rv.ndim);
            jw_kuint(w, "nbytes", rv.nbytes);
            jw_kstr(w, "rule", rv.rule);
            jw_key(w, "pieces");
            jw_arr(w);
            for (size_t j = 0; j < rv.npieces; j++) {
                tps_piece_view p;
                tps_layout_rank_piece(L, r, k, j, &p);
                jw_obj(w);
                jw_kstr(w, "kind", p.kind);
                jw_kuint(w, "at", p.at);
                jw_kuint(w, "nbytes", p.nbytes);
                if (p.source) {
                    jw_kstr(w, "source", p.source);
                    jw_kint(w, "dim", p.dim);
                    if (p.dim >= 0) {
                        jw_kuint(w, "lo", p.lo);
                        jw_kuint(w, "hi", p.hi);
                    }
                    jw_kbool(w, "replica", p.replica);
                    if (p.transposed) jw_kbool(w, "transposed", 1);
                }
                if (!strcmp(p.kind, "constant")) jw_knum(w, "value", p.value);
                jw_end(w);
            }
            jw_end(w);
            jw_end(w);
        }
    jw_end(w);
}

tps_err tps_plan_json(tps_ctx *ctx, const tps_layout *L, char **out)
{
    const tps_ckpt *ck = L->ck;
    int tp = L->tp, nr = L->nranks;
    size_t n = tps_layout_count(L);
    uint64_t total = tps_ckpt_total_bytes(ck), sum = 0;
    for (int r = 0; r < nr; r++) sum += tps_layout_rank_bytes(L, r);
    double overhead = total && sum >= total ? (double)(sum - total) / (double)total : 0;
    const char *rej = tps_layout_rejected(L);
    const char *target = tps_layout_target(L);
    char b1[32];
    jw w = {0};
    jw_begin(&w, rej == NULL);
    jw_kstr(&w, "model", tps_ckpt_path(ck));
    jw_kstr(&w, "plan", L->plan ? tps_plan_name(L->plan) : NULL);
    jw_kstr(&w, "layout", tps_layout_name(L));
    jw_kstr(&w, "target", target);
    jw_kint(&w, "tp", tp);
    jw_kint(&w, "pp", L->pp);
    jw_kbool(&w, "ep", tps_layout_ep(L));
    json_stages(&w, L);
    {
        /* A ctx of its own: the caller's detail message and log stay as they were. */
        tps_ctx *qc = tps_ctx_new();
        if (qc) json_quant(&w, qc, ck);
        else w.sb.oom = 1;
        tps_ctx_free(qc);
    }
    jw_kstr(&w, "rejected", rej);
    {
        int ok[64], nok = 0;
        jw_key(&w, "working_tp");
        tps_layout_opts wo = {.ep = L->ep, .pp = 1, .pad = L->pad_mode, .moe_backend = L->moe};
        if (L->pp > 1 || tps_layout_working_tps_opts(ctx, ck, L->plan, L->spec, &wo, ok, &nok)) {
            jw_null(&w);
        } else {
            jw_arr(&w);
            for (int i = 0; i < nok; i++) jw_uint(&w, (uint64_t)ok[i]);
            jw_end(&w);
        }
    }
    jw_key(&w, "untie");
    if (tps_ckpt_untied_head(ck)) {
        jw_obj(&w);
        jw_kstr(&w, "head", tps_ckpt_untied_head(ck));
        jw_kstr(&w, "embedding", tps_ckpt_untied_embedding(ck));
        jw_end(&w);
    } else {
        jw_null(&w);
    }
    json_layers(&w, L);
    jw_key(&w, "checks");
    jw_arr(&w);
    for (size_t i = 0; i < tps_layout_check_count(L); i++) {
        tps_check_view c;
        tps_layout_check(L, i, &c);
        jw_obj(&w);
        jw_kstr(&w, "check", c.name);
        jw_kstr(&w, "verdict", c.ok == 1 ? "pass" : c.ok == 0 ? "fail" : "skipped");
        jw_kstr(&w, "detail", c.detail);
        jw_end(&w);
    }
    jw_end(&w);
    jw_key(&w, "tensors");
    jw_arr(&w);
    for (size_t i = 0; i < n; i++) {
        tps_placement_view v;
        if (tps_layout_dropped(L, i)) continue; /* under "dropped" */
        tps_layout_placement(L, i, &v);
        if (!rej) v.dim = tps_layout_dim(L, i);
        jw_obj(&w);
        jw_kstr(&w, "name", v.name);
        jw_kstr(&w, "dtype", tps_dtype_name(v.dtype));
        jw_kstr(&w, "style", tps_style_name(v.style));
        if (v.dim >= 0) snprintf(b1, sizeof b1, "Shard(%d)", v.dim);
        jw_kstr(&w, "placement", v.dim >= 0 ? b1 : "Replicate");
        jw_kstr(&w, "rule", v.rule);
        json_shape(&w, "shape", v.shape, v.ndim);
        /* the stages holding it; its local shapes on the first one's tp ranks */
        int base = -1;
        jw_key(&w, "stages");
        jw_arr(&w);
        for (int s = 0; s < L->pp; s++) {
            int held = rej != NULL && s == 0;
            for (int r = 0; r < tp && !held; r++) held = tps_layout_local_bytes(L, i, s * tp + r) > 0;
            if (!held) continue;
            if (base < 0) base = s * tp;
            jw_int(&w, s);
        }
        jw_end(&w);
        if (base < 0) base = 0;
        jw_key(&w, "local_shapes");
        jw_arr(&w);
        for (int r = 0; r < tp; r++) {
            uint64_t s, l;
            tps_layout_local(L, i, base + r, &s, &l);
            jw_arr(&w);
            for (int d = 0; d < v.ndim; d++) jw_uint(&w, d == v.dim ? l : v.shape[d]);
            jw_end(&w);
        }
        jw_end(&w);
        jw_end(&w);
    }
    jw_end(&w);
    /* source tensors the layout leaves out: the engine's load_weights skips them */
    jw_key(&w, "dropped");
    jw_arr(&w);
    for (size_t i = 0; i < n; i++) {
        const char *why = tps_layout_dropped(L, i);
        if (!why) continue;
        tps_placement_view v;
        tps_layout_placement(L, i, &v);
        jw_obj(&w);
        jw_kstr(&w, "name", v.name);
        jw_kstr(&w, "dtype", tps_dtype_name(v.dtype));
        json_shape(&w, "shape", v.shape, v.ndim);
        jw_kstr(&w, "reason", why);
        jw_end(&w);
    }
    jw_end(&w);
    jw_key(&w, "rank_bytes");
    jw_arr(&w);
    for (int r = 0; r < nr; r++) jw_uint(&w, tps_layout_rank_bytes(L, r));
    jw_end(&w);
    if (target) json_rank_tensors(&w, L);
    /* what a split shares where the output's file system shares blocks */
    uint64_t shared, copied;
    jw_key(&w, "sharing");
    if (!L->rejected && L->rank_rt &&
        tps_split_sharing(ctx, L->ck, L, 0, TPS_SHARE_BLOCK, &shared, &copied) == TPS_OK) {
        jw_obj(&w);
        jw_kuint(&w, "block_size", TPS_SHARE_BLOCK);
        jw_kuint(&w, "bytes_shared", shared);
        jw_kuint(&w, "bytes_copied", copied);
        jw_end(&w);
    } else {
        jw_null(&w);
    }
    jw_kuint(&w, "source_bytes", total);
    jw_knum(&w, "replication_overhead", overhead);
    return jw_finish(ctx, &w, out);
}

tps_err tps_plan_list_json(tps_ctx *ctx, char **out)
{
    jw w = {0};
    jw_begin(&w, 1);
    jw_key(&w, "plans");
    jw_arr(&w);
    for (size_t i = 0; i < tps_plan_builtin_count(); i++) {
        tps_plan *p = NULL;
        const char *name = tps_plan_builtin_name(i);
        jw_obj(&w);
        jw_kstr(&w, "name", name);
        jw_kstr(&w, "description",
                tps_plan_builtin(ctx, name, &p) == TPS_OK ? tps_plan_description(p) : "");
        jw_end(&w);
        tps_plan_free(p);
    }
    jw_end(&w);
    jw_key(&w, "layouts");
    jw_arr(&w);
    jw_obj(&w);
    jw_kstr(&w, "name", "dtensor");
    jw_kstr(&w, "target", NULL);
    jw_end(&w);
    for (size_t i = 0; i < tps_layout_spec_builtin_count(); i++) {
        tps_layout_spec *sp = NULL;
        const char *name = tps_layout_spec_builtin_name(i);
        tps_layout_spec_builtin(ctx, name, &sp);
        jw_obj(&w);
        jw_kstr(&w, "name", name);
        jw_kstr(&w, "target", tps_layout_spec_target(sp));
        jw_end(&w);
        tps_layout_spec_free(sp);
    }
    jw_end(&w);
    return jw_finish(ctx, &w, out);
}

tps_err tps_split_json(tps_ctx *ctx, const tps_layout *L, const tps_split_opts *o,
                       const tps_split_result *res, char **out)
{
    jw w = {0};
    jw_begin(&w, 1);
    jw_kstr(&w, "model", tps_ckpt_path(L->ck));
    jw_kstr(&w, "output", o->out_dir);
    jw_kstr(&w, "plan", L->plan ? tps_plan_name(L->plan) : NULL);
    jw_kstr(&w, "layout", tps_layout_name(L));
    jw_kstr(&w, "target", tps_layout_target(L));
    jw_kint(&w, "tp", L->tp);
    jw_kint(&w, "pp", L->pp);
    jw_kbool(&w, "ep", tps_layout_ep(L));
    json_stages(&w, L);
    jw_kint(&w, "ranks_written", res->ranks_written);
    jw_kint(&w, "files_written", res->files_written);
    jw_kuint(&w, "bytes_written", res->bytes_written);
    jw_kuint(&w, "bytes_shared", res->bytes_shared);
    jw_kuint(&w, "bytes_copied", res->bytes_written - res->bytes_shared);
    jw_kstr(&w, "copy", res->copy ? res->copy : "write");
    jw_key(&w, "rank_bytes");
    jw_arr(&w);
    for (int r = 0; r < L->nranks; r++)
        jw_uint(&w, o->ranks && !o->ranks[r] ? 0 : tps_layout_rank_bytes(L, r));
    jw_end(&w);
    return jw_finish(ctx, &w, out);
}

tps_err tps_check_json(tps_ctx *ctx, const char *dir, const tps_check_result *r, char **out)
{
    jw w = {0};
    jw_begin(&w, 1);
    jw_kstr(&w, "dir", dir);
    jw_kint(&w, "tp", r->tp);
    jw_kint(&w, "pp", r->pp);
    jw_kint(&w, "ranks_present", r->ranks_present);
    jw_kstr(&w, "missing_ranks", r->missing_ranks);
    jw_kbool(&w, "complete", r->complete);
    jw_kint(&w, "files_checked", r->files_checked);
    jw_kuint(&w, "tensors_checked", r->tensors_checked);
    jw_kuint(&w, "bytes_checked", r->bytes_checked);
    jw_kint(&w, "headers_checked", r->headers_checked);
    return jw_finish(ctx, &w, out);
}

tps_err tps_merge_json(tps_ctx *ctx, const char *dir, const tps_merge_opts *o, int files_written,
                       char **out)
{
    jw w = {0};
    jw_begin(&w, 1);
    jw_kstr(&w, "dir", dir);
    jw_kstr(&w, "output", o->out_dir);
    jw_kint(&w, "files_written", files_written);
    /* the source tensors the split's layout left out, which merge cannot give back */
    tps_ckpt *ck = NULL;
    tps_err rc = tps_ckpt_open(ctx, dir, &ck);
    if (rc) {
        free(w.sb.p);
        return rc;
    }
    jw_key(&w, "dropped");
    jw_arr(&w);
    for (const cJSON *d = ck->dropped ? ck->dropped->child : NULL; d; d = d->next) {
        jw_obj(&w);
        jw_kstr(&w, "name", cJSON_GetObjectItemCaseSensitive(d, "name")->valuestring);
        jw_kstr(&w, "reason", cJSON_GetObjectItemCaseSensitive(d, "reason")->valuestring);
        jw_end(&w);
    }
    jw_end(&w);
    tps_ckpt_free(ck);
    return jw_finish(ctx, &w, out);
}

tps_err tps_verify_json(tps_ctx *ctx, const tps_verify_opts *o, const tps_verify_report *R,
                        char **out)
{
    tps_verify_kind_count kinds[16];
    unsigned passed, failed;
    size_t nk = tps_verify_report_kinds(R, kinds, sizeof kinds / sizeof kinds[0], &passed, &failed);
    size_t n = tps_verify_report_count(R);
    double secs = tps_verify_report_seconds(R);
    uint64_t bytes = tps_verify_report_bytes(R);
    jw w = {0};
    jw_begin(&w, tps_verify_report_ok(R) && failed == 0);
    jw_kstr(&w, "dir", o->dir);
    jw_kstr(&w, "source", o->source);
    jw_kstr(&w, "backend", tps_verify_report_backend(R));
    jw_key(&w, "checks");
    jw_arr(&w);
    for (size_t i = 0; i < n; i++) {
        const tps_verify_row *r = tps_verify_report_row(R, i);
        jw_obj(&w);
        jw_kstr(&w, "check", r->check);
        jw_kstr(&w, "kind", r->kind);
        jw_knum(&w, "max_abs_err", r->max_abs_err);
        jw_knum(&w, "tolerance", r->tolerance);
        jw_kuint(&w, "wrong", r->wrong);
        jw_kuint(&w, "total", r->total);
        jw_kbool(&w, "ok", r->ok);
        jw_kstr(&w, "note", r->note);
        jw_end(&w);
    }
    jw_end(&w);
    jw_key(&w, "summary");
    jw_obj(&w);
    jw_kuint(&w, "passed", passed);
    jw_kuint(&w, "failed", failed);
    jw_kuint(&w, "bytes", bytes);
    jw_knum(&w, "seconds", secs);
    jw_knum(&w, "gb_per_s", secs > 0 ? (double)bytes / secs / 1e9 : 0);
    jw_knum(&w, "setup_seconds", tps_verify_report_setup_seconds(R));
    jw_kint(&w, "seed", (int64_t)o->seed);
    jw_kint(&w, "batch", o->batch);
    jw_key(&w, "kinds");
    jw_obj(&w);
    for (size_t k = 0; k < nk; k++) {
        jw_key(&w, kinds[k].kind);
        jw_obj(&w);
        jw_kuint(&w, "passed", kinds[k].passed);
        jw_kuint(&w, "failed", kinds[k].failed);
        jw_end(&w);
    }
    jw_end(&w);
    if (!o->source)
        jw_kstr(&w, "note", "numeric checks need --source MODEL: the shards were checked "
                            "against the manifest's CRC32s only");
    return jw_finish(ctx, &w, out);
}

/* ------------------------------------------------------------------ shared defaults */

tps_err tps_split_default_dir(tps_ctx *ctx, const tps_ckpt *ck, int tp, char **out)
{
    return tps_split_default_dir_pp(ctx, ck, tp, 1, out);
}

tps_err tps_split_default_dir_pp(tps_ctx *ctx, const tps_ckpt *ck, int tp, int pp, char **out)
{
    *out = NULL;
    char sfx[24] = "";
    if (pp > 1) snprintf(sfx, sizeof sfx, "-pp%d", pp);
    char *tmp = tps_strdup(tps_ckpt_path(ck));
    if (!tmp) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    size_t l = strlen(tmp);
    while (l > 1 && tmp[l - 1] == '/') tmp[--l] = 0;
    const char *parent = tps_ckpt_kind(ck) == TPS_SRC_FILE ? tps_ckpt_dir(ck) : dirname(tmp);
    /* Not into the Hugging Face cache: where the user is. */
    if (ck->hub) *out = tps_asprintf("%s-tp%d%s", tps_ckpt_stem(ck), tp, sfx);
    else *out = tps_asprintf("%s/%s-tp%d%s", parent, tps_ckpt_stem(ck), tp, sfx);
    free(tmp);
    return *out ? TPS_OK : tps_fail(ctx, TPS_E_NOMEM, "out of memory");
}

tps_err tps_layout_spec_open(tps_ctx *ctx, const char *layout, tps_layout_spec **out)
{
    *out = NULL;
    if (!layout || !strcmp(layout, "dtensor")) return TPS_OK;
    /* a name without a slash or .yaml is a built-in layout */
    return strchr(layout, '/') || strstr(layout, ".yaml") || strstr(layout, ".yml")
               ? tps_layout_spec_load(ctx, layout, out)
               : tps_layout_spec_builtin(ctx, layout, out);
}
