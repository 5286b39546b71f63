/* cmd_check.c - tpshard check DIR [--json] */

#include "cli.h"

const char usage_check[] =
    "usage: tpshard check DIR [--json]\n"
    "\n"
    "Verifies a tpshard output directory against its manifest, without the source:\n"
    "every rank file parses, every rank file's header (__metadata__, tensor table,\n"
    "padding) and every tensor has the manifest's CRC32, dtype and shape, shards\n"
    "cover each tensor's dims exactly once, replicas agree. A directory that\n"
    "split --ranks runs have not filled yet is partial: the ranks it holds are\n"
    "checked, the others named, and the exit status is 3.\n"
    "\n"
    "  --json      one JSON document on stdout\n"
    "  -q, -v      quieter, more verbose\n"
    "  -h, --help  this text\n"
    "\n"
    "Exit status: 0 complete and intact, 1 a mismatch or error, 2 a usage error,\n"
    "3 partial (ranks missing; those present are intact).\n";

int cmd_check(int argc, char **argv)
{
    const char *dir;
    int st = cli_parse_one_operand(argc, argv, usage_check, "check: give exactly one DIR", &dir);
    if (st >= 0) return st;
    tps_ctx *ctx = cli_ctx();
    tps_check_result r;
    tps_err e = tps_check_dir(ctx, dir, &r);
    cli_progress_done();
    int status = 0;
    char b[32];
    if (e) {
        status = cli_lib_error(ctx, e);
    } else if (g_json) {
        char *doc = NULL;
        status = cli_print_doc(ctx, tps_check_json(ctx, dir, &r, &doc), &doc);
    } else if (g_display >= 1) {
        char shape[48];
        if (r.pp > 1) snprintf(shape, sizeof shape, "tp %d x pp %d", r.tp, r.pp);
        else snprintf(shape, sizeof shape, "tp %d", r.tp);
        printf("%s: %s: %d file%s, %llu tensors, %s checked against the manifest (%s)\n",
               r.complete ? "ok" : "partial", dir, r.files_checked, r.files_checked == 1 ? "" : "s",
               (unsigned long long)r.tensors_checked, cli_human(r.bytes_checked, b, sizeof b), shape);
        if (r.headers_checked < r.files_checked)
            printf("unchecked: the headers of %d file%s: the manifest records no header CRC32 "
                   "(split again to cover every byte)\n",
                   r.files_checked - r.headers_checked,
                   r.files_checked - r.headers_checked == 1 ? "" : "s");
        if (!r.complete)
            printf("partial: rank(s) %s are not written here yet (split --ranks); %d of %d ranks "
                   "present\n",
                   r.missing_ranks, r.ranks_present, r.ranks);
    }
    /* Partial is not complete, whatever is printed: a pipeline that checks
     * the exit status never takes a directory still being filled. */
    if (!e && !r.complete) status = 3;
    tps_ctx_free(ctx);
    return status;
}
