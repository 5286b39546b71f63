/* cmd_plan.c - tpshard plan MODEL --tp N: the dry run, and the plan loading
 * and printing that split shares. */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static int g_pad; /* --pad-intermediate */

const char usage_plan[] =
    "usage: tpshard plan MODEL --tp N [--plan FILE | --family NAME] [--layout NAME|FILE] [--ep] "
    "[--pad-intermediate] [--pp N] [--pp-layers LIST] [--moe-backend NAME] [--untie] [--list] [--json]\n"
    "\n"
    "Shows, without writing anything, how the plan places every tensor at tensor-\n"
    "parallel size N: style, placement, global and local shapes, bytes per rank,\n"
    "the replication overhead, and every check against config.json with its verdict.\n"
    "With a serving layout, also every rank file's tensors and where each of their\n"
    "bytes comes from. Exits 1 when a check rejects the split.\n"
    "\n"
    "  --tp N          tensor-parallel size (1..4096)\n"
    "  --plan FILE     a YAML plan (see tpshard-plan(5))\n"
    "  --family NAME   a built-in plan by name; default: detected from config.json\n"
    "  --layout L      dtensor (default), vllm, sglang, or a layout file\n"
    "  --ep            MoE checkpoints: experts whole on one rank each, as split --ep\n"
    "  --pad-intermediate  plan the split as split --pad-intermediate pads it\n"
    "  --pp N          --layout vllm: N pipeline stages, as split --pp: the stage of\n"
    "                  every tensor and layer, the bytes of every rank (worker)\n"
    "  --pp-layers L   each stage's layers, as split --pp-layers\n"
    "  --moe-backend B MXFP4 experts (gpt-oss): the vLLM MoE backend whose round-up of\n"
    "                  the expert shapes to show, as split --moe-backend (default triton)\n"
    "  --untie         plan the split of a tied checkpoint as split --untie writes it\n"
    "  --list          list the built-in plans and layouts and exit\n"
    "  --json          one JSON document on stdout\n"
    "  -q, -v          quieter, more verbose\n"
    "  -h, --help      this text\n";

int cli_open_model_and_plan(tps_ctx *ctx, const char *model, const char *plan_file,
                            const char *family, tps_ckpt **ck, tps_plan **plan)
{
    tps_err e = tps_ckpt_open(ctx, model, ck);
    if (e) return cli_lib_error(ctx, e);
    if (plan_file) e = tps_plan_load(ctx, plan_file, plan);
    else if (family) e = tps_plan_builtin(ctx, family, plan);
    else e = tps_plan_detect(ctx, *ck, plan);
    if (e) return cli_lib_error(ctx, e);
    return 0;
}

int cli_untie(tps_ctx *ctx, tps_ckpt *ck, tps_plan *plan, const tps_layout_spec *spec,
              const char *usage)
{
    /* The serving layouts write tied checkpoints as the engines load them. */
    if (spec)
        return cli_usage_error(usage, "--untie is for the dtensor layout; layout %s writes tied "
                                      "checkpoints as its engine loads them",
                               tps_layout_spec_name(spec));
    tps_err e = tps_ckpt_untie(ctx, ck, plan);
    /* Not tied, no embedding, no config: --untie does not apply, a usage error. */
    if (e == TPS_E_ARG) return cli_usage_error(usage, "%s", tps_ctx_errmsg(ctx));
    return e ? cli_lib_error(ctx, e) : 0;
}

static int same_str(const char *a, const char *b) { return a == b || (a && b && !strcmp(a, b)); }

static int same_layer(const tps_layer_view *a, const tps_layer_view *b)
{
    return a->heads == b->heads && a->kv_heads == b->kv_heads && a->head_dim == b->head_dim &&
           same_str(a->type, b->type) && same_str(a->heads_from, b->heads_from) &&
           same_str(a->kv_heads_from, b->kv_heads_from) &&
           same_str(a->head_dim_from, b->head_dim_from);
}

static const char *count_str(int64_t v, char *buf, size_t len)
{
    if (v < 0) return "?";
    snprintf(buf, len, "%lld", (long long)v);
    return buf;
}

/* "per_layer_config", "global_head_dim, num_global_key_value_heads" or "". */
static void from_str(const tps_layer_view *v, char *buf, size_t len)
{
    const char *f[3] = {v->heads_from, v->kv_heads_from, v->head_dim_from};
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < 3; i++) {
        int dup = 0;
        for (int j = 0; j < i; j++) dup |= same_str(f[i], f[j]);
        if (f[i] && !dup && o < len)
            o += (size_t)snprintf(buf + o, len - o, "%s%s", o ? ", " : "", f[i]);
    }
}

/* The layers as groups of alike ones: "layers 0-4, 6 (sliding_attention): 8 heads, ...".
 * At most 32 groups; a config whose layers differ more is summed up. */
static void print_layers(const tps_layout *L)
{
    size_t n = tps_layout_layer_count(L), shown = 0;
    if (!n) return;
    printf("\nattention per layer (config.json):\n");
    size_t firsts[32];
    int ng = 0;
    for (size_t i = 0; i < n && ng < 32; i++) {
        tps_layer_view v, w;
        tps_layout_layer(L, i, &v);
        int seen = 0;
        for (int g = 0; g < ng && !seen; g++) {
            tps_layout_layer(L, firsts[g], &w);
            seen = same_layer(&v, &w);
        }
        if (seen) continue;
        firsts[ng++] = i;
        char list[160], b1[24], b2[24], b3[24], fb[128];
        size_t o = 0, count = 0;
        int more = 0;
        for (size_t j = i; j < n; j++) {
            tps_layout_layer(L, j, &w);
            if (!same_layer(&v, &w)) continue;
            size_t k = j;
            while (k + 1 < n && (tps_layout_layer(L, k + 1, &w), same_layer(&v, &w))) k++;
            count += k - j + 1;
            const char *sep = o ? ", " : "";
            if (o < sizeof list - 40)
                o += (size_t)(k > j ? snprintf(list + o, sizeof list - o, "%s%zu-%zu", sep, j, k)
                                    : snprintf(list + o, sizeof list - o, "%s%zu", sep, j));
            else
                more = 1;
            j = k;
        }
        if (more) snprintf(list + o, sizeof list - o, ", ...");
        shown += count;
        from_str(&v, fb, sizeof fb);
        printf("  layer%s %s%s%s%s: %s heads, %s KV heads, head_dim %s%s%s\n", count > 1 ? "s" : "",
               list, v.type ? " (" : "", v.type ? v.type : "", v.type ? ")" : "",
               count_str(v.heads, b1, sizeof b1), count_str(v.kv_heads, b2, sizeof b2),
               count_str(v.head_dim, b3, sizeof b3), fb[0] ? ", from " : "", fb);
    }
    if (shown < n) printf("  ... and %zu more layers with other values (see --json)\n", n - shown);
}

static void shape_into(const uint64_t *s, int n, int dim, uint64_t dimlen, char *buf, size_t len)
{
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < n && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%llu", i ? "," : "",
                              (unsigned long long)(i == dim ? dimlen : s[i]));
    if (o < len) snprintf(buf + o, len - o, "]");
}

const tps_moe_backend *g_moe_backend;

int cli_moe_backend(const char *usage, const char *cmd, const char *name,
                    const tps_moe_backend **out)
{
    *out = tps_moe_backend_find(name ? name : TPS_MOE_BACKEND_DEFAULT);
    if (*out) return 0;
    size_t n;
    const tps_moe_backend *b = tps_moe_backend_list(&n);
    char names[512];
    size_t o = 0;
    for (size_t i = 0; i < n && o < sizeof names; i++)
        o += (size_t)snprintf(names + o, sizeof names - o, "%s%s", i ? ", " : "", b[i].name);
    return cli_usage_error(usage, "%s: --moe-backend '%s' is not a vLLM MoE backend for MXFP4 "
                                  "experts tpshard knows (%s)",
                           cmd, name, names);
}

void cli_moe_backend_note(tps_ctx *ctx, const tps_ckpt *ck, const char *layout,
                          const tps_moe_backend *b, int given)
{
    tps_quant_view q;
    if (!given || g_display < 1) return;
    int mx = !tps_ckpt_quantization(ctx, ck, &q) && q.method && !strcmp(q.method, "mxfp4");
    if (!mx)
        fprintf(stderr, "tpshard: note: --moe-backend %s is ignored: this checkpoint has no MXFP4 "
                        "experts (%s), and no other expert format depends on vLLM's MoE "
                        "backend\n",
                b->name, q.method ? q.method : "not quantized");
    else if (!layout || !strcmp(layout, "dtensor"))
        fprintf(stderr, "tpshard: note: --moe-backend %s is ignored by the dtensor layout: "
                        "transformers' gpt-oss plan replicates the MXFP4 experts whole, unpadded\n",
                b->name);
}

/* MXFP4 experts: what they are, and what vLLM's backend would make of them. */
static void mxfp4_line(const tps_quant_view *q)
{
    const tps_moe_backend *b = g_moe_backend ? g_moe_backend
                                             : tps_moe_backend_find(TPS_MOE_BACKEND_DEFAULT);
    printf("quantization: mxfp4: %zu MXFP4 expert projections (U8 blocks of 32 e2m1 codes, "
           "E8M0 scales), the rest unquantized\n",
           q->weights);
    char h[48];
    if (b->hidden_align > 1) snprintf(h, sizeof h, "rounded up to a multiple of %u", b->hidden_align);
    else snprintf(h, sizeof h, "as is");
    printf("  vLLM MoE backend for --layout vllm: %s%s: hidden size %s, each rank's "
           "intermediate size rounded up to a multiple of %u\n",
           b->name,
           !strcmp(b->name, TPS_MOE_BACKEND_DEFAULT)
               ? " (the default: vLLM 0.33's own choice for MXFP4 on a Hopper GPU; "
                 "--moe-backend to change)"
               : "",
           h, b->inter_align);
}

void cli_quant_line(tps_ctx *ctx, const tps_ckpt *ck)
{
    tps_quant_view q;
    if (tps_ckpt_quantization(ctx, ck, &q) || !q.method) return;
    if (!q.supported) {
        printf("quantization: %s, not supported: %s\n", q.method, q.problem);
        return;
    }
    if (!strcmp(q.method, "mxfp4")) {
        mxfp4_line(&q);
        return;
    }
    if (q.bits) {
        printf("quantization: %s, %d-bit codes packed in words, group_size %lld: %zu quantized "
               "linears with their scales and zero points (%zu grouped, %zu of one group); "
               "layout vllm writes them as vLLM loads them, dtensor and sglang refuse them\n",
               q.method, q.bits, (long long)q.group_size, q.weights, q.group_scales,
               q.channel_scales);
        return;
    }
    printf("quantization: %s", q.method);
    if (q.block_rows)
        printf(", blocks of %llu x %llu", (unsigned long long)q.block_rows,
               (unsigned long long)q.block_cols);
    printf(": %zu FP8 weights with their scales (%zu block, %zu per channel, %zu per tensor)",
           q.weights, q.block_scales, q.channel_scales, q.tensor_scales);
    if (q.input_scales) printf(", %zu input scales", q.input_scales);
    printf("; scales follow their weights' rows or columns\n");
}

void cli_report_rejection(const tps_plan *plan, const tps_layout *L)
{
    if (tps_layout_target(L))
        fprintf(stderr, "tpshard: error: layout %s rejects tp %d: %s\n", tps_layout_name(L),
                tps_layout_tp(L), tps_layout_rejected(L));
    else
        fprintf(stderr, "tpshard: error: plan %s rejects tp %d: %s\n", tps_plan_name(plan),
                tps_layout_tp(L), tps_layout_rejected(L));
}

int cli_open_layout(tps_ctx *ctx, const char *layout, tps_layout_spec **spec)
{
    tps_err e = tps_layout_spec_open(ctx, layout, spec);
    return e ? cli_lib_error(ctx, e) : 0;
}

/* Where a rank tensor's bytes come from, e.g.
 * "q_proj.weight[0:64) + k_proj.weight[32:64) + v_proj.weight[32:64)". */
static void pieces_desc(const tps_layout *L, int r, size_t k, size_t npieces, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = 0;
    for (size_t j = 0; j < npieces && o < len; j++) {
        tps_piece_view p;
        tps_layout_rank_piece(L, r, k, j, &p);
        const char *sep = j ? " + " : "";
        if (!strcmp(p.kind, "source")) {
            if (p.dim < 0) {
                o += (size_t)snprintf(buf + o, len - o, "%s%s", sep, p.source);
            } else {
                /* [:] for each dim before the cut one */
                o += (size_t)snprintf(buf + o, len - o, "%s%s", sep, p.source);
                for (int d = 0; d < p.dim && o < len; d++)
                    o += (size_t)snprintf(buf + o, len - o, "[:]");
                if (o < len)
                    o += (size_t)snprintf(buf + o, len - o, "[%llu:%llu)", (unsigned long long)p.lo,
                                          (unsigned long long)p.hi);
            }
            if (p.transposed && o < len)
                o += (size_t)snprintf(buf + o, len - o, " transposed per matrix");
        } else if (!strcmp(p.kind, "zeros")) {
            char h[32];
            o += (size_t)snprintf(buf + o, len - o, "%szeros (%s)", sep, cli_human(p.nbytes, h, sizeof h));
        } else {
            o += (size_t)snprintf(buf + o, len - o, "%s%g", sep, p.value);
        }
    }
}

static void print_rank_tensors(const tps_layout *L, int r)
{
    size_t n = tps_layout_rank_tensor_count(L, r), w = 6;
    for (size_t k = 0; k < n; k++) {
        tps_rank_tensor_view v;
        tps_layout_rank_tensor(L, r, k, &v);
        if (strlen(v.name) > w) w = strlen(v.name);
    }
    int tp = tps_layout_tp(L);
    if (tps_layout_pp(L) > 1)
        printf("\nrank %d (stage %d, tp rank %d) holds:\n", r, r / tp, r % tp);
    else
        printf("\nrank %d holds:\n", r);
    char sh[128], src[2048];
    for (size_t k = 0; k < n; k++) {
        tps_rank_tensor_view v;
        tps_layout_rank_tensor(L, r, k, &v);
        shape_into(v.shape, v.ndim, -1, 0, sh, sizeof sh);
        pieces_desc(L, r, k, v.npieces, src, sizeof src);
        printf("  %-*s  %-5s %-14s <- %s\n", (int)w, v.name, tps_dtype_name(v.dtype), sh, src);
    }
}


/* "[63,64] x3, [61,64]" or "[32,64]" when even. */
static void local_desc(const tps_layout *L, size_t i, char *buf, size_t len)
{
    tps_placement_view v;
    tps_layout_placement(L, i, &v);
    v.dim = tps_layout_dim(L, i);
    if (v.dim < 0) {
        shape_into(v.shape, v.ndim, -1, 0, buf, len);
        return;
    }
    int tp = tps_layout_tp(L);
    /* with pipeline stages: the tp ranks of the first stage holding it */
    int base = 0;
    for (int w = 0; w < tps_layout_ranks(L); w++)
        if (tps_layout_local_bytes(L, i, w)) {
            base = w / tp * tp;
            break;
        }
    size_t o = 0;
    buf[0] = 0;
    for (int r = 0; r < tp && o < len;) {
        uint64_t s, l, s2, l2;
        tps_layout_local(L, i, base + r, &s, &l);
        int k = r + 1;
        while (k < tp && (tps_layout_local(L, i, base + k, &s2, &l2), l2 == l)) k++;
        char sh[128];
        shape_into(v.shape, v.ndim, v.dim, l, sh, sizeof sh);
        o += (size_t)snprintf(buf + o, len - o, "%s%s", o ? ", " : "", sh);
        if (k - r > 1 && o < len) o += (size_t)snprintf(buf + o, len - o, " x%d", k - r);
        r = k;
    }
}

/* "0", "1", "0,1" or "all": the pipeline stages holding tensor i. */
static void stages_desc(const tps_layout *L, size_t i, char *buf, size_t len)
{
    int tp = tps_layout_tp(L), pp = tps_layout_pp(L), n = 0;
    size_t o = 0;
    buf[0] = 0;
    for (int s = 0; s < pp; s++) {
        int held = 0;
        for (int r = 0; r < tp && !held; r++) held = tps_layout_local_bytes(L, i, s * tp + r) > 0;
        if (!held) continue;
        n++;
        if (o < len) o += (size_t)snprintf(buf + o, len - o, "%s%d", o ? "," : "", s);
    }
    if (n == pp && pp > 2) snprintf(buf, len, "all");
    if (!n) snprintf(buf, len, "-");
}

/* The stages' layers and their ranks' bytes. */
static void print_stages(const tps_layout *L)
{
    int tp = tps_layout_tp(L), pp = tps_layout_pp(L);
    char b1[32];
    printf("\npipeline stages (rank = stage x %d + tp rank; files model-pp-{stage}-tp-{rank}-part-"
           "{p}.safetensors):\n", tp);
    for (int s = 0; s < pp; s++) {
        int first, nl;
        tps_layout_stage(L, s, &first, &nl);
        printf("  stage %d: layers %d-%d (%d), ranks %d-%d:", s, first, first + nl - 1, nl, s * tp,
               s * tp + tp - 1);
        for (int r = 0; r < tp; r++)
            printf("%s %s", r ? "," : "", cli_human(tps_layout_rank_bytes(L, s * tp + r), b1,
                                                    sizeof b1));
        printf("\n");
    }
}

int cli_print_plan(tps_ctx *ctx, const char *model, tps_ckpt *ck, tps_plan *plan, tps_layout *L)
{
    int tp = tps_layout_ranks(L), pp = tps_layout_pp(L);
    size_t n = tps_layout_count(L);
    uint64_t total = tps_ckpt_total_bytes(ck), sum = 0, maxr = 0;
    char at[48];
    if (pp > 1) snprintf(at, sizeof at, "tp %d x pp %d", tps_layout_tp(L), pp);
    else snprintf(at, sizeof at, "tp %d", tps_layout_tp(L));
    for (int r = 0; r < tp; r++) {
        uint64_t b = tps_layout_rank_bytes(L, r);
        sum += b;
        if (b > maxr) maxr = b;
    }
    double overhead = total && sum >= total ? (double)(sum - total) / (double)total : 0;
    const char *rej = tps_layout_rejected(L);
    char buf[1024], b1[32], b2[32];
    const char *target = tps_layout_target(L);
    if (g_json) {
        char *doc = NULL;
        int st = cli_print_doc(ctx, tps_plan_json(ctx, L, &doc), &doc);
        return st ? st : rej ? 1 : 0;
    }
    if (target)
        printf("plan %s, layout %s (%s) for %s at %s\n\n", tps_plan_name(plan),
               tps_layout_name(L), target, model, at);
    else
        printf("plan %s for %s at %s\n\n", tps_plan_name(plan), model, at);
    if (tps_ckpt_untied_head(ck))
        printf("untie: %s is written from %s's bytes; the output's config.json says "
               "tie_word_embeddings false\n\n",
               tps_ckpt_untied_head(ck), tps_ckpt_untied_embedding(ck));
    size_t w = 6;
    for (size_t i = 0; i < n; i++) {
        tps_placement_view v;
        tps_layout_placement(L, i, &v);
        if (strlen(v.name) > w) w = strlen(v.name);
    }
    if (pp > 1)
        printf("  %-*s  %-5s  %-17s  %-9s  %-16s  %s\n", (int)w, "TENSOR", "STAGE", "STYLE",
               "PLACEMENT", "GLOBAL", "LOCAL (tp rank 0..)");
    else
        printf("  %-*s  %-17s  %-9s  %-16s  %s\n", (int)w, "TENSOR", "STYLE", "PLACEMENT",
               "GLOBAL", "LOCAL (rank 0..)");
    for (size_t i = 0; i < n; i++) {
        tps_placement_view v;
        tps_layout_placement(L, i, &v);
        if (!rej) v.dim = tps_layout_dim(L, i);
        char g[128];
        shape_into(v.shape, v.ndim, -1, 0, g, sizeof g);
        if (tps_layout_dropped(L, i)) {
            printf("  %-*s  %-17s  %-9s  %-16s  %s\n", (int)w, v.name, tps_style_name(v.style),
                   "dropped", g, "- (in no rank file)");
            continue;
        }
        local_desc(L, i, buf, sizeof buf);
        if (v.dim >= 0) snprintf(b1, sizeof b1, "Shard(%d)", v.dim);
        if (pp > 1) {
            char sd[64];
            stages_desc(L, i, sd, sizeof sd);
            printf("  %-*s  %-5s  %-17s  %-9s  %-16s  %s\n", (int)w, v.name, sd,
                   tps_style_name(v.style), v.dim >= 0 ? b1 : "Replicate", g, buf);
            continue;
        }
        printf("  %-*s  %-17s  %-9s  %-16s  %s\n", (int)w, v.name, tps_style_name(v.style),
               v.dim >= 0 ? b1 : "Replicate", g, buf);
    }
    for (size_t i = 0, first = 1; i < n && !rej; i++) {
        const char *why = tps_layout_dropped(L, i);
        if (!why) continue;
        tps_placement_view v;
        tps_layout_placement(L, i, &v);
        if (first)
            printf("\ndropped (left out of every rank file, listed in the manifest; merge names "
                   "them):\n");
        first = 0;
        printf("  %s: %s\n", v.name, why);
    }
    if (target && !rej) {
        /* rank 0 and the last rank (uneven vocabularies differ there); -v: every rank */
        for (int r = 0; r < tp; r++)
            if (g_display >= 2 || r == 0 || r == tp - 1) print_rank_tensors(L, r);
        if (tp > 2 && g_display < 2) printf("\n(ranks 1 to %d: tpshard plan -v)\n", tp - 2);
    }
    {
        tps_ctx *qc = tps_ctx_new();
        if (qc) {
            printf("\n");
            cli_quant_line(qc, ck);
        }
        tps_ctx_free(qc);
    }
    printf("\nbytes per rank:");
    for (int r = 0; r < tp; r++) printf("%s %d: %s", r ? "," : "", r, cli_human(tps_layout_rank_bytes(L, r), b1, sizeof b1));
    printf("\nsource %s; all ranks %s; replication overhead %.1f%%; largest rank %.1f%% of the source\n",
           cli_human(total, b1, sizeof b1), cli_human(sum, b2, sizeof b2), 100.0 * overhead,
           total ? 100.0 * (double)maxr / (double)total : 0.0);
    if (pp > 1 && !rej) print_stages(L);
    print_layers(L);
    printf("\nchecks:\n");
    for (size_t i = 0; i < tps_layout_check_count(L); i++) {
        tps_check_view c;
        tps_layout_check(L, i, &c);
        printf("  %-7s %s: %s\n", c.ok == 1 ? "pass" : c.ok == 0 ? "FAIL" : "skipped", c.name, c.detail);
    }
    int ok[64], nok = 0;
    tps_layout_opts wo = {.ep = tps_layout_ep(L), .pp = 1, .pad = g_pad,
                          .moe_backend = g_moe_backend};
    if (tps_layout_pp(L) == 1 &&
        !tps_layout_working_tps_opts(ctx, ck, plan, tps_layout_spec_of(L), &wo, ok, &nok)) {
        printf("\ntp values that work (every rule of this checkpoint together, up to 64%s): ",
               g_pad ? ", with --pad-intermediate" : "");
        for (int i = 0; i < nok; i++) printf("%s%d", i ? ", " : "", ok[i]);
        printf("%s\n", nok ? "" : "none");
    }
    if (rej && tps_layout_spec_of(L) && !g_pad) {
        /* would --pad-intermediate make this tp work? */
        tps_layout *P = NULL;
        const char *pf;
        uint64_t pfrom, pto;
        tps_layout_opts po = {.ep = tps_layout_ep(L), .pp = 1, .pad = 1,
                              .moe_backend = g_moe_backend};
        if (!tps_layout_new_opts(ctx, ck, plan, tps_layout_spec_of(L), tp, &po, &P) &&
            P && !tps_layout_rejected(P))
            for (int k = 0; k < 2; k++)
                if (tps_layout_padding(P, k, &pf, &pfrom, &pto))
                    printf("\nsuggestion: split --pad-intermediate pads %s %llu to %llu with codes "
                           "that dequantize to 0 (the %s computes the same), which tp %d "
                           "accepts\n", pf, (unsigned long long)pfrom, (unsigned long long)pto,
                           k ? "experts' MLP" : "MLP", tp);
        tps_layout_free(P);
    }
    if (rej) printf("\nverdict: rejected: %s\n", rej);
    else printf("\nverdict: accepted\n");
    return rej ? 1 : 0;
}

static int list_plans(void)
{
    tps_ctx *ctx = cli_ctx();
    if (g_json) {
        char *doc = NULL;
        int st = cli_print_doc(ctx, tps_plan_list_json(ctx, &doc), &doc);
        tps_ctx_free(ctx);
        return st;
    }
    for (size_t i = 0; i < tps_plan_builtin_count(); i++) {
        tps_plan *p = NULL;
        const char *name = tps_plan_builtin_name(i);
        const char *desc = tps_plan_builtin(ctx, name, &p) == TPS_OK ? tps_plan_description(p) : "";
        printf("  %-10s %s\n", name, desc ? desc : "");
        tps_plan_free(p);
    }
    printf("\nlayouts:\n  %-10s %s\n", "dtensor", "the plan's DTensor shards (default)");
    for (size_t i = 0; i < tps_layout_spec_builtin_count(); i++) {
        tps_layout_spec *sp = NULL;
        const char *name = tps_layout_spec_builtin_name(i);
        tps_layout_spec_builtin(ctx, name, &sp);
        printf("  %-10s rank files for %s\n", name, sp ? tps_layout_spec_target(sp) : "?");
        tps_layout_spec_free(sp);
    }
    tps_ctx_free(ctx);
    return 0;
}

int cmd_plan(int argc, char **argv)
{
    static const struct option opts[] = {
        {"tp", required_argument, 0, 't'},   {"plan", required_argument, 0, 'p'},
        {"family", required_argument, 0, 'f'}, {"list", no_argument, 0, 'l'},
        {"layout", required_argument, 0, 'L'},
        {"untie", no_argument, 0, 'u'},      {"ep", no_argument, 0, 'E'},
        {"pad-intermediate", no_argument, 0, 'I'},
        {"pp", required_argument, 0, 'P'},   {"pp-layers", required_argument, 0, 'Y'},
        {"json", no_argument, 0, 'j'},       {"help", no_argument, 0, 'h'},
        {"quiet", no_argument, 0, 'q'},      {"verbose", no_argument, 0, 'v'},
        {"moe-backend", required_argument, 0, 'B'},
        {0, 0, 0, 0}};
    long tp = 0, pp = 0;
    const char *plan_file = NULL, *family = NULL, *layout = NULL, *pp_layers = NULL;
    const char *moe_backend = NULL;
    int *stage_layers = NULL;
    int list = 0, untie = 0, ep = 0, pad = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "hqvj", opts, NULL)) != -1) {
        switch (c) {
        case 't':
            if (cli_parse_int(usage_plan, "--tp", optarg, 1, 4096, &tp)) return 2;
            break;
        case 'p': plan_file = optarg; break;
        case 'f': family = optarg; break;
        case 'l': list = 1; break;
        case 'L': layout = optarg; break;
        case 'u': untie = 1; break;
        case 'E': ep = 1; break;
        case 'I': pad = g_pad = 1; break;
        case 'P':
            if (cli_parse_int(usage_plan, "--pp", optarg, 1, 4096, &pp)) return 2;
            break;
        case 'Y': pp_layers = optarg; break;
        case 'B': moe_backend = optarg; break;
        default: {
            int st = cli_common_option(c, usage_plan, argv);
            if (st >= 0) return st;
        }
        }
    }
    if (list) return list_plans();
    if (plan_file && family) return cli_usage_error(usage_plan, "plan: --plan and --family conflict; give one");
    if (optind != argc - 1) return cli_usage_error(usage_plan, "plan: give exactly one MODEL");
    if (!tp) return cli_usage_error(usage_plan, "plan: --tp N is required");
    if (cli_moe_backend(usage_plan, "plan", moe_backend, &g_moe_backend)) return 2;
    if (ep && (!layout || !strcmp(layout, "dtensor")))
        return cli_usage_error(usage_plan, "plan: --ep is for the serving layouts (--layout vllm or "
                                    "sglang); the dtensor layout splits experts as the plan says");
    tps_ctx *ctx = cli_ctx();
    tps_ckpt *ck = NULL;
    tps_plan *plan = NULL;
    tps_layout *L = NULL;
    tps_layout_spec *spec = NULL;
    int status = cli_open_model_and_plan(ctx, argv[optind], plan_file, family, &ck, &plan);
    if (!status) status = cli_open_layout(ctx, layout, &spec);
    if (!status) status = cli_pipeline(usage_plan, "plan", &pp, pp_layers, spec, &stage_layers);
    if (!status && untie) status = cli_untie(ctx, ck, plan, spec, usage_plan);
    if (!status) cli_moe_backend_note(ctx, ck, layout, g_moe_backend, moe_backend != NULL);
    if (!status) {
        tps_layout_opts lo = {.ep = ep, .pp = pp ? (int)pp : 1, .layers = stage_layers,
                              .pad = pad, .moe_backend = g_moe_backend};
        tps_err e = tps_layout_new_opts(ctx, ck, plan, spec, (int)tp, &lo, &L);
        status = e ? cli_lib_error(ctx, e) : cli_print_plan(ctx, argv[optind], ck, plan, L);
        if (!g_json && status == 1 && L && tps_layout_rejected(L))
            cli_report_rejection(plan, L);
    }
    free(stage_layers);
    tps_layout_free(L);
    tps_layout_spec_free(spec);
    tps_plan_free(plan);
    tps_ckpt_free(ck);
    tps_ctx_free(ctx);
    return status;
}
