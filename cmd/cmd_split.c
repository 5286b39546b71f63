/* cmd_split.c - tpshard split MODEL --tp N [-o DIR] ... */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

const char usage_split[] =
    "usage: tpshard split MODEL --tp N [-o DIR] [--plan FILE | --family NAME] [--layout NAME|FILE] "
    "[--ep] [--pad-intermediate] [--moe-backend NAME] [--pp N] [--pp-layers LIST] [--ranks LIST] [--ranks-per-pass N] [--untie] [--threads N] [--max-part-size SIZE] "
    "[--mmap | --no-mmap] [--copy] [--force] "
    "[--dry-run] [-q | -v] [--json]\n"
    "\n"
    "Writes one safetensors file per tensor-parallel rank holding exactly the local\n"
    "shard PyTorch DTensor gives that rank (or, with --layout vllm|sglang, the\n"
    "parameters that engine's sharded_state loader reads), then the manifest\n"
    "tpshard.json, and copies config.json and the tokenizer files. Nothing is\n"
    "written when the plan or the layout rejects the model.\n"
    "\n"
    "  --tp N               tensor-parallel size (1..4096)\n"
    "  -o, --output DIR     output directory; default <name>-tp<N> beside MODEL\n"
    "  --plan FILE          a YAML plan (see tpshard-plan(5))\n"
    "  --family NAME        a built-in plan by name; default: detected from config.json\n"
    "  --layout L           dtensor (default), vllm, sglang, or a layout file\n"
    "  --ep                 MoE checkpoints, serving layouts: expert parallelism, each\n"
    "                       expert whole on one rank (vLLM --enable-expert-parallel,\n"
    "                       SGLang --ep-size N); attention stays tensor parallel\n"
    "  --pad-intermediate   serving layouts: when the MLP's intermediate size does not\n"
    "                       split at N on whole groups and words (Qwen2-72B's 29568 at\n"
    "                       tp 8), pad it with zeros that dequantize to 0 to the next\n"
    "                       size that does (config.json says the new size)\n"
    "  --moe-backend NAME   MXFP4 experts (gpt-oss), --layout vllm: vLLM's MoE backend\n"
    "                       (its --moe-backend names: triton, marlin, flashinfer_trtllm,\n"
    "                       flashinfer_cutlass, cutlass, deep_gemm, cpu, ...), whose\n"
    "                       round-up sets the expert shapes; default triton, vLLM 0.33's\n"
    "                       choice on a Hopper GPU; ignored, with a note, elsewhere\n"
    "  --pp N               --layout vllm: N pipeline stages of --tp ranks each, files\n"
    "                       model-pp-{stage}-tp-{rank}-part-{p}.safetensors, each layer on\n"
    "                       the stage vLLM gives it (VLLM_PP_LAYER_PARTITION when set)\n"
    "  --pp-layers LIST     the layers of each stage, e.g. 15,15,16,15 (as\n"
    "                       VLLM_PP_LAYER_PARTITION says it; implies --pp)\n"
    "  --ranks LIST         write only these ranks (with --pp, workers stage x tp + rank,\n"
    "                       0..tp x pp - 1), e.g. 0,3-5; auto: this task's share,\n"
    "                       from RANK/WORLD_SIZE, OMPI_COMM_WORLD_RANK/_SIZE, PMI_RANK/\n"
    "                       PMI_SIZE, SLURM_PROCID/SLURM_NTASKS or SLURM_ARRAY_TASK_ID/\n"
    "                       SLURM_ARRAY_TASK_COUNT (the first set, with a count above 1)\n"
    "  --ranks-per-pass N   write N ranks at a time, the layout compiled for those ranks\n"
    "                       only: memory for N ranks' tables, not every rank's, for\n"
    "                       checkpoints of many tensors (default: all ranks in one pass\n"
    "                       up to 131072 tensor-rank pairs, fewer past that); the files\n"
    "                       are the same; not with --ranks or --pp\n"
    "  --untie              tied checkpoint: write lm_head from the embedding and set\n"
    "                       tie_word_embeddings false in the copied config.json\n"
    "  --threads N          worker threads; default: all cores\n"
    "  --max-part-size SIZE split each rank into parts of at most SIZE of data (e.g. 5G)\n"
    "  --mmap, --no-mmap    read the source through mappings even on NFS, FUSE, Lustre,\n"
    "                       CIFS (default: mapped elsewhere), or always with pread\n"
    "  --copy, --no-reflink copy every byte through tpshard: no blocks shared with the\n"
    "                       source (XFS, btrfs), no copy_file_range\n"
    "  --force              replace an existing output in DIR\n"
    "  --dry-run            print the plan (as 'tpshard plan') and write nothing\n"
    "  --json               one JSON document on stdout\n"
    "  -q, -v               quieter (errors only), more verbose (progress)\n"
    "  -h, --help           this text\n";

int cmd_split(int argc, char **argv)
{
    static const struct option opts[] = {
        {"tp", required_argument, 0, 't'},       {"output", required_argument, 0, 'o'},
        {"plan", required_argument, 0, 'p'},     {"family", required_argument, 0, 'f'},
        {"layout", required_argument, 0, 'L'},
        {"ranks", required_argument, 0, 'r'},    {"threads", required_argument, 0, 'T'},
        {"max-part-size", required_argument, 0, 'm'}, {"force", no_argument, 0, 'F'},
        {"no-mmap", no_argument, 0, 'M'},        {"mmap", no_argument, 0, 'A'},
        {"copy", no_argument, 0, 'C'},           {"no-reflink", no_argument, 0, 'C'},        {"dry-run", no_argument, 0, 'n'},        {"json", no_argument, 0, 'j'},
        {"untie", no_argument, 0, 'u'},         {"ep", no_argument, 0, 'E'},
        {"pad-intermediate", no_argument, 0, 'I'},
        {"pp", required_argument, 0, 'P'},       {"pp-layers", required_argument, 0, 'Y'},
        {"quiet", no_argument, 0, 'q'},          {"verbose", no_argument, 0, 'v'},
        {"help", no_argument, 0, 'h'},           {"moe-backend", required_argument, 0, 'B'},
        {"ranks-per-pass", required_argument, 0, 'R'},
        {0, 0, 0, 0}};
    long tp = 0, threads = 0, pp = 0, per_pass = 0;
    const char *out = NULL, *plan_file = NULL, *family = NULL, *ranks = NULL, *layout = NULL;
    const char *moe_backend = NULL;
    const char *pp_layers = NULL;
    int *stage_layers = NULL, pad = 0;
    uint64_t max_part = 0;
    int force = 0, dry = 0, map = 1, plain = 0, untie = 0, ep = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:hqvj", opts, NULL)) != -1) {
        switch (c) {
        case 't':
            if (cli_parse_int(usage_split, "--tp", optarg, 1, 4096, &tp)) return 2;
            break;
        case 'o': out = optarg; break;
        case 'p': plan_file = optarg; break;
        case 'f': family = optarg; break;
        case 'L': layout = optarg; break;
        case 'r': ranks = optarg; break;
        case 'T':
            if (cli_parse_int(usage_split, "--threads", optarg, 1, 1024, &threads)) return 2;
            break;
        case 'm':
            if (cli_parse_size(usage_split, "--max-part-size", optarg, &max_part)) return 2;
            break;
        case 'F': force = 1; break;
        case 'M': map = 0; break;
        case 'A': map = 2; break;
        case 'C': plain = 1; break;
        case 'n': dry = 1; break;
        case 'u': untie = 1; break;
        case 'E': ep = 1; break;
        case 'I': pad = 1; break;
        case 'P':
            if (cli_parse_int(usage_split, "--pp", optarg, 1, 4096, &pp)) return 2;
            break;
        case 'Y': pp_layers = optarg; break;
        case 'B': moe_backend = optarg; break;
        case 'R':
            if (cli_parse_int(usage_split, "--ranks-per-pass", optarg, 1, 65536, &per_pass)) return 2;
            break;
        default: {
            int st = cli_common_option(c, usage_split, argv);
            if (st >= 0) return st;
        }
        }
    }
    if (plan_file && family) return cli_usage_error(usage_split, "split: --plan and --family conflict; give one");
    if (per_pass && ranks)
        return cli_usage_error(usage_split, "split: --ranks-per-pass and --ranks conflict: a --ranks "
                                            "run writes its ranks in one pass");
    if (per_pass && (pp > 1 || pp_layers))
        return cli_usage_error(usage_split, "split: --ranks-per-pass is for pp 1: the pipeline's "
                                            "stages are made from every tp rank's tensors");
    if (optind != argc - 1) return cli_usage_error(usage_split, "split: give exactly one MODEL");
    if (!tp) return cli_usage_error(usage_split, "split: --tp N is required");
    if (cli_moe_backend(usage_split, "split", moe_backend, &g_moe_backend)) return 2;
    if (ep && (!layout || !strcmp(layout, "dtensor")))
        return cli_usage_error(usage_split, "split: --ep is for the serving layouts (--layout vllm or "
                                    "sglang); the dtensor layout splits experts as the plan says");
    /* The ranks --ranks counts are the workers: tp x pp of them. */
    if (!pp && pp_layers) {
        pp = 1;
        for (const char *p = pp_layers; *p; p++) pp += *p == ',';
    }
    long nw = tp * (pp ? pp : 1);
    if (nw > 65536)
        return cli_usage_error(usage_split, "split: --tp %ld x --pp %ld is over 65536 ranks", tp, pp);
    unsigned char *mask = NULL;
    tps_task task = {0};
    if (ranks && !strcmp(ranks, "auto")) {
        /* One of several launched tasks: its share, from the launcher. */
        tps_ctx *tc = tps_ctx_new();
        mask = calloc((size_t)nw, 1);
        tps_err te = tc && mask ? tps_task_from_env(tc, NULL, (int)nw, &task) : TPS_E_NOMEM;
        if (te) {
            int st = cli_usage_error(usage_split, "split: %s",
                                     tc ? tps_ctx_errmsg(tc) : "out of memory");
            tps_ctx_free(tc);
            free(mask);
            return st;
        }
        tps_ctx_free(tc);
        for (int r = task.first; r < task.first + task.nranks; r++) mask[r] = 1;
        if (g_display >= 1 && !dry) {
            if (task.nranks == 1)
                fprintf(stderr, "tpshard: task %d of %d (%s/%s): rank %d of %ld\n", task.index,
                        task.count, task.index_var, task.count_var, task.first, nw);
            else if (task.nranks)
                fprintf(stderr, "tpshard: task %d of %d (%s/%s): ranks %d-%d of %ld\n", task.index,
                        task.count, task.index_var, task.count_var, task.first,
                        task.first + task.nranks - 1, nw);
            else
                fprintf(stderr,
                        "tpshard: task %d of %d (%s/%s): no rank to write: %d tasks share %ld "
                        "ranks, one each to tasks 0-%ld\n",
                        task.index, task.count, task.index_var, task.count_var, task.count, nw,
                        nw - 1);
        }
    } else if (ranks) {
        mask = calloc((size_t)nw, 1);
        if (!mask || tps_parse_ranks(ranks, (int)nw, mask) != 0) {
            free(mask);
            return cli_usage_error(usage_split,
                                   "split: --ranks '%s' is not a list of ranks below %ld "
                                   "(e.g. 0,3-5) or auto%s",
                                   ranks, nw, pp > 1 ? " (with --pp, rank = stage x tp + tp rank)" : "");
        }
    }
    const char *model = argv[optind];
    tps_ctx *ctx = cli_ctx();
    if (threads) tps_ctx_set_threads(ctx, (int)threads);
    tps_ckpt *ck = NULL;
    tps_plan *plan = NULL;
    tps_layout *L = NULL;
    tps_layout_spec *spec = NULL;
    char *outbuf = NULL;
    unsigned char *keep0 = NULL;
    int status = cli_open_model_and_plan(ctx, model, plan_file, family, &ck, &plan);
    if (!status) status = cli_open_layout(ctx, layout, &spec);
    if (!status) status = cli_pipeline(usage_split, "split", &pp, pp_layers, spec, &stage_layers);
    if (!status && untie) status = cli_untie(ctx, ck, plan, spec, usage_split);
    if (status) goto done;
    cli_moe_backend_note(ctx, ck, layout, g_moe_backend, moe_backend != NULL);
    tps_layout_opts lo = {.ep = ep, .pp = pp ? (int)pp : 1, .layers = stage_layers, .pad = pad,
                          .moe_backend = g_moe_backend};
    /* Many tensors: the split goes in passes of fewer ranks, each compiled
     * for its ranks only (the first pass's layout made here answers for the
     * whole layout: its checks, refusals and rank sizes are every rank's). */
    int rpp = dry || mask ? (int)nw : tps_split_ranks_per_pass(ck, (int)nw, lo.pp, (int)per_pass);
    if (rpp < nw) {
        keep0 = calloc((size_t)nw, 1);
        if (!keep0) {
            status = cli_lib_error(ctx, TPS_E_NOMEM);
            goto done;
        }
        memset(keep0, 1, (size_t)rpp);
        lo.keep = keep0;
        tps_ckpt_release_headers(ck); /* only the manifest needs them: it reads them again */
    }
    tps_err e = tps_layout_new_opts(ctx, ck, plan, spec, (int)tp, &lo, &L);
    if (e) {
        status = cli_lib_error(ctx, e);
        goto done;
    }
    if (dry) {
        status = cli_print_plan(ctx, model, ck, plan, L);
        if (status && !g_json) cli_report_rejection(plan, L);
        goto done;
    }
    if (!out) {
        e = tps_split_default_dir_pp(ctx, ck, (int)tp, pp ? (int)pp : 1, &outbuf);
        if (e) {
            status = cli_lib_error(ctx, e);
            goto done;
        }
        out = outbuf;
    }
    tps_split_opts so = {.tp = (int)tp, .ranks = mask, .max_part_size = max_part, .force = force, .out_dir = out,
                          .map_source = map, .plain_copy = plain};
    tps_split_result res;
    lo.keep = NULL;
    e = keep0 ? tps_split_passes(ctx, ck, plan, spec, (int)tp, &lo, rpp, L, &so, &res)
              : tps_split(ctx, ck, L, &so, &res);
    cli_progress_done();
    if (e) {
        status = cli_lib_error(ctx, e);
        goto done;
    }
    char b1[32], b2[32];
    cli_info("%s of the %s written share blocks with the source, the rest copied (%s)",
             cli_human(res.bytes_shared, b1, sizeof b1), cli_human(res.bytes_written, b2, sizeof b2),
             res.copy);
    if (g_json) {
        char *doc = NULL;
        status = cli_print_doc(ctx, tps_split_json(ctx, L, &so, &res, &doc), &doc);
    } else if (g_display >= 1 && mask && !res.ranks_written) {
        printf("wrote nothing to %s: task %d of %d has no rank of %ld to write\n", out, task.index,
               task.count, nw);
    } else if (g_display >= 1) {
        if (tps_layout_target(L))
            printf("wrote %d file%s (%s) for %d of %ld ranks to %s (plan %s, layout %s for %s)\n",
                   res.files_written, res.files_written == 1 ? "" : "s",
                   cli_human(res.bytes_written, b1, sizeof b1), res.ranks_written, nw, out,
                   tps_plan_name(plan), tps_layout_name(L), tps_layout_target(L));
        else
            printf("wrote %d file%s (%s) for %d of %ld ranks to %s (plan %s)\n", res.files_written,
                   res.files_written == 1 ? "" : "s", cli_human(res.bytes_written, b1, sizeof b1),
                   res.ranks_written, nw, out, tps_plan_name(plan));
    }
done:
    free(stage_layers);
    free(mask);
    free(outbuf);
    tps_layout_free(L);
    free(keep0);
    tps_layout_spec_free(spec);
    tps_plan_free(plan);
    tps_ckpt_free(ck);
    tps_ctx_free(ctx);
    return status;
}
