/* cmd_verify.c - tpshard verify DIR [--source MODEL] [--backend cpu|cuda|nccl] ... */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

const char usage_verify[] =
    "usage: tpshard verify DIR [--source MODEL] [--backend cpu|cuda|nccl] [--tensors GLOB] "
    "[--seed N] [--batch N] [--tensors-per-pass N] [--nccl-id-file PATH] [--threads N] [--json]\n"
    "\n"
    "Proves that a tpshard output directory reproduces its source checkpoint.\n"
    "Reconstruction: every tensor gathered from the ranks' shards equals the source\n"
    "byte for byte, and replicated tensors are identical on every rank (without\n"
    "--source: every shard's CRC32 is checked against the manifest instead).\n"
    "Numerics (with --source): seeded random tokens go through each sharded Linear\n"
    "(colwise: per-rank X W_r^T + b_r, all-gather; rowwise: per-rank X_r W_r^T,\n"
    "all-reduce, bias once), each vocab-sharded embedding (lookups, all-reduce,\n"
    "exact) and, per layer, the MLP (gate/up colwise -> SiLU(gate)*up -> down\n"
    "rowwise) and attention (q colwise -> o rowwise) blocks, in f32; results are\n"
    "compared with the unsharded products of the source. Tolerance per output:\n"
    "2 gamma(n) sum|x w| with gamma(n) = n u / (1 - n u), u = 2^-24, n = reduction\n"
    "length + tp; embeddings must match exactly.\n"
    "\n"
    "  --source MODEL       the checkpoint the directory was split from\n"
    "  --backend B          cpu (ranks as threads, default), cuda (every rank's GEMM\n"
    "                       with cuBLAS on one GPU) or nccl (one rank per GPU, NCCL\n"
    "                       collectives); cuda and nccl need `make CUDA=1`\n"
    "  --tensors GLOB       only tensors whose name matches GLOB (fnmatch); a block\n"
    "                       is checked when all its tensors match\n"
    "  --seed N             seed of the random inputs (default 0)\n"
    "  --batch N            tokens per check, 1..256 (default 4)\n"
    "  --tensors-per-pass N check about N tensors at a time, in name order, cut\n"
    "                       between layers (default 2048): memory for N tensors'\n"
    "                       checks, not every one's; the report is the same\n"
    "  --nccl-id-file PATH  nccl with one process per rank (RANK/WORLD_SIZE from the\n"
    "                       launcher): rank 0 writes the NCCL unique id there, the\n"
    "                       others wait for it (120 s)\n"
    "  --threads N          worker threads (default: all cores)\n"
    "  --json               one JSON document on stdout\n"
    "  -q, -v               only the verdict; every check row\n"
    "  -h, --help           this text\n"
    "\n"
    "Exit status: 0 when every check passes, 1 when one fails or on error (a rank\n"
    "file's header changed, or the source is not the checkpoint the manifest\n"
    "records), 2 on a usage error, 3 when the directory is partial (split --ranks\n"
    "runs have not written every rank).\n";

static void print_row(const tps_verify_row *r, int w)
{
    char err[32], tol[32];
    if (r->max_abs_err != r->max_abs_err || r->max_abs_err > 1e308)
        snprintf(err, sizeof err, "inf");
    else
        snprintf(err, sizeof err, "%.3g", r->max_abs_err);
    snprintf(tol, sizeof tol, "%.3g", r->tolerance);
    char wt[48];
    snprintf(wt, sizeof wt, "%llu/%llu", (unsigned long long)r->wrong,
             (unsigned long long)r->total);
    printf("%-*s  %-11s  %11s  %11s  %17s  %s\n", w, r->check, r->kind, err, tol, wt,
           r->ok ? "ok" : "FAIL");
    if (r->note && (!r->ok || g_display >= 2))
        printf("%*s  note: %s\n", w > 2 ? 2 : w, "", r->note);
}

int cmd_verify(int argc, char **argv)
{
    enum { O_SOURCE = 256, O_BACKEND, O_TENSORS, O_SEED, O_BATCH, O_NCCL_ID, O_THREADS, O_PASS };
    static const struct option opts[] = {
        {"source", required_argument, 0, O_SOURCE},
        {"backend", required_argument, 0, O_BACKEND},
        {"tensors", required_argument, 0, O_TENSORS},
        {"seed", required_argument, 0, O_SEED},
        {"batch", required_argument, 0, O_BATCH},
        {"nccl-id-file", required_argument, 0, O_NCCL_ID},
        {"tensors-per-pass", required_argument, 0, O_PASS},
        {"threads", required_argument, 0, O_THREADS},
        {"json", no_argument, 0, 'j'},
        {"quiet", no_argument, 0, 'q'},
        {"verbose", no_argument, 0, 'v'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    tps_verify_opts o;
    memset(&o, 0, sizeof o);
    o.backend = TPS_BACKEND_CPU;
    o.batch = 4;
    long threads = 0;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "hqvj", opts, NULL)) != -1) {
        long v;
        switch (c) {
        case O_SOURCE: o.source = optarg; break;
        case O_BACKEND:
            if (!strcmp(optarg, "cpu"))
                o.backend = TPS_BACKEND_CPU;
            else if (!strcmp(optarg, "cuda"))
                o.backend = TPS_BACKEND_CUDA;
            else if (!strcmp(optarg, "nccl"))
                o.backend = TPS_BACKEND_NCCL;
            else
                return cli_usage_error(usage_verify,
                                       "verify: --backend '%s': use cpu, cuda or nccl", optarg);
            break;
        case O_TENSORS: o.tensors_glob = optarg; break;
        case O_SEED:
            if (cli_parse_int(usage_verify, "--seed", optarg, 0, 0x7fffffffffffffffL, &v)) return 2;
            o.seed = (uint64_t)v;
            break;
        case O_BATCH:
            if (cli_parse_int(usage_verify, "--batch", optarg, 1, 256, &v)) return 2;
            o.batch = (int)v;
            break;
        case O_NCCL_ID: o.nccl_id_file = optarg; break;
        case O_PASS:
            if (cli_parse_int(usage_verify, "--tensors-per-pass", optarg, 1, 1L << 30, &v)) return 2;
            o.tensors_per_pass = (size_t)v;
            break;
        case O_THREADS:
            if (cli_parse_int(usage_verify, "--threads", optarg, 1, 4096, &threads)) return 2;
            break;
        default: {
            int st = cli_common_option(c, usage_verify, argv);
            if (st >= 0) return st;
        }
        }
    }
    if (optind != argc - 1) return cli_usage_error(usage_verify, "verify: give exactly one DIR");
    o.dir = argv[optind];
    if (o.nccl_id_file && o.backend != TPS_BACKEND_NCCL)
        return cli_usage_error(usage_verify, "verify: --nccl-id-file goes with --backend nccl");

    tps_ctx *ctx = cli_ctx();
    if (threads > 0) tps_ctx_set_threads(ctx, (int)threads);
    tps_verify_report *R = NULL;
    tps_err e = tps_verify(ctx, &o, &R);
    cli_progress_done();
    if (e) {
        /* a partial directory: exit 3, as check's */
        int st = cli_lib_error(ctx, e);
        if (e == TPS_E_PARTIAL) st = 3;
        tps_ctx_free(ctx);
        return st;
    }
    size_t n = tps_verify_report_count(R);
    tps_verify_kind_count kinds[16];
    unsigned passed, failed;
    size_t nk = tps_verify_report_kinds(R, kinds, sizeof kinds / sizeof kinds[0], &passed, &failed);
    int w = 5;
    for (size_t i = 0; i < n; i++) {
        const tps_verify_row *r = tps_verify_report_row(R, i);
        int l = (int)strlen(r->check);
        if ((!r->ok || g_display >= 2) && l > w) w = l;
    }
    if (w > 64) w = 64;
    int ok = tps_verify_report_ok(R) && failed == 0;
    double secs = tps_verify_report_seconds(R);
    uint64_t bytes = tps_verify_report_bytes(R);
    double gbs = secs > 0 ? (double)bytes / secs / 1e9 : 0;
    const char *note = o.source ? NULL
                                : "numeric checks need --source MODEL: the shards were checked "
                                  "against the manifest's CRC32s only";
    if (g_json) {
        char *doc = NULL;
        int st = cli_print_doc(ctx, tps_verify_json(ctx, &o, R, &doc), &doc);
        if (st) ok = 0;
    } else {
        if (g_display >= 1) {
            int header = 0;
            for (size_t i = 0; i < n; i++) {
                const tps_verify_row *r = tps_verify_report_row(R, i);
                if (r->ok && g_display < 2) continue;
                if (!header) {
                    printf("%-*s  %-11s  %11s  %11s  %17s  %s\n", w, "CHECK", "KIND", "MAX ABS ERR",
                           "TOLERANCE", "WRONG/TOTAL", "VERDICT");
                    header = 1;
                }
                print_row(r, w);
            }
            if (header) printf("\n");
            for (size_t k = 0; k < nk; k++)
                printf("%-12s %5u passed, %u failed\n", kinds[k].kind, kinds[k].passed,
                       kinds[k].failed);
            char hb[32];
            printf("checks: %u passed, %u failed\n", passed, failed);
            printf("shard bytes verified: %s in %.2f s (%.2f GB/s)\n",
                   cli_human(bytes, hb, sizeof hb), secs, gbs);
            if (tps_verify_report_setup_seconds(R) >= 0.005)
                printf("backend: %s (opened in %.2f s)\n", tps_verify_report_backend(R),
                       tps_verify_report_setup_seconds(R));
            else
                printf("backend: %s\n", tps_verify_report_backend(R));
            if (note) printf("note: %s\n", note);
        }
        printf("verify: %s\n", ok ? "PASS" : "FAIL");
    }
    tps_verify_report_free(R);
    tps_ctx_free(ctx);
    return ok ? 0 : 1;
}
