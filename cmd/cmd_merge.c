/* cmd_merge.c - tpshard merge DIR -o OUT [--force] [--json] */
#include <getopt.h>

#include "cli.h"

const char usage_merge[] =
    "usage: tpshard merge DIR -o OUT [--copy] [--force] [--json]\n"
    "\n"
    "Reassembles the full checkpoint from a tpshard output directory in Hugging\n"
    "Face layout: every tensor gathered along its placement, replicated tensors\n"
    "taken once after checking the ranks agree, the original file names and\n"
    "grouping restored (model.safetensors, or the parts and their index), config\n"
    "and tokenizer files copied.\n"
    "\n"
    "  -o, --output OUT  output directory\n"
    "  --copy, --no-reflink\n"
    "                    copy every byte through tpshard: no blocks shared with the\n"
    "                    rank files (XFS, btrfs), no copy_file_range\n"
    "  --force           replace existing files in OUT\n"
    "  --json            one JSON document on stdout\n"
    "  -q, -v            quieter, more verbose\n"
    "  -h, --help        this text\n";

int cmd_merge(int argc, char **argv)
{
    static const struct option opts[] = {{"output", required_argument, 0, 'o'}, {"force", no_argument, 0, 'F'},
                                         {"copy", no_argument, 0, 'C'},         {"no-reflink", no_argument, 0, 'C'},
                                         {"help", no_argument, 0, 'h'},         {"quiet", no_argument, 0, 'q'},
                                         {"verbose", no_argument, 0, 'v'},      {"json", no_argument, 0, 'j'},
                                         {0, 0, 0, 0}};
    const char *out = NULL;
    int force = 0, plain = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:hqv", opts, NULL)) != -1) {
        switch (c) {
        case 'o': out = optarg; break;
        case 'F': force = 1; break;
        case 'C': plain = 1; break;
        default: {
            int st = cli_common_option(c, usage_merge, argv);
            if (st >= 0) return st;
        }
        }
    }
    if (optind != argc - 1) return cli_usage_error(usage_merge, "merge: give exactly one DIR");
    if (!out) return cli_usage_error(usage_merge, "merge: -o OUT is required");
    tps_ctx *ctx = cli_ctx();
    tps_merge_opts mo = {.out_dir = out, .force = force, .plain_copy = plain};
    int files = 0;
    tps_err e = tps_merge(ctx, argv[optind], &mo, &files);
    int status = 0;
    if (e) {
        status = cli_lib_error(ctx, e);
    } else if (g_json) {
        char *doc = NULL;
        status = cli_print_doc(ctx, tps_merge_json(ctx, argv[optind], &mo, files, &doc), &doc);
    } else if (g_display >= 1) {
        printf("merged %s into %s (%d safetensors file%s)\n", argv[optind], out, files, files == 1 ? "" : "s");
    }
    tps_ctx_free(ctx);
    return status;
}
