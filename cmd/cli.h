/* cli.h - what the subcommands share: display level, errors, the --json
 * documents, checked number parsing. cmd/ includes only lib/tpshard.h. */
#ifndef TPS_CLI_H
#define TPS_CLI_H
#include <stdint.h>
#include <stdio.h>

#include "tpshard.h"

/* 0 = -q (errors only), 1 = default (results + warnings), 2 = -v (progress, info), 3 = -vv. */
extern int g_display;
/* Set by --json: errors are printed as a JSON document on stdout too. */
extern int g_json;

/* "tpshard: error: <msg>" on stderr (and {"ok":false,"error":...} on stdout
 * in --json mode). Returns 1, the failure exit status. */
int cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prints the library's error detail for e; returns 1. */
int cli_lib_error(tps_ctx *ctx, tps_err e);
/* Usage error: prints "tpshard: <msg>" and the usage text on stderr; returns 2. */
int cli_usage_error(const char *usage, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cli_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void cli_info(const char *fmt, ...) __attribute__((format(printf, 1, 2))); /* shown at -v */

/* The ctx signal handlers interrupt (set by cli_ctx). */
extern tps_ctx *g_sig_ctx;
/* A ctx wired to stderr by display level, with progress on a terminal. */
tps_ctx *cli_ctx(void);
/* Progress line helpers (used by cli_ctx's callback). */
void cli_progress_done(void);

/* The options every subcommand takes (-q, -v, --json, -h) and the error for
 * any other: returns -1 to go on parsing, else the exit status to return. */
int cli_common_option(int c, const char *usage, char **argv);

/* Whole parsing for a command that takes only the common options and one
 * operand (inspect, check): sets *operand; -1 to go on, else the exit
 * status to return. `missing` is the error when there is not exactly one. */
int cli_parse_one_operand(int argc, char **argv, const char *usage, const char *missing,
                          const char **operand);

/* Checked parsers: 0 ok, else prints a usage error and returns 2. */
int cli_parse_int(const char *usage, const char *opt, const char *s, long min, long max, long *out);
int cli_parse_size(const char *usage, const char *opt, const char *s, uint64_t *out);

/* Human sizes: "1.50 GiB" into buf. */
const char *cli_human(uint64_t bytes, char *buf, size_t len);

/* --json: prints the library's document *doc (tps_*_json made it, or failed
 * with e) and a newline on stdout, and frees it; on e, prints the error
 * instead. Returns 0 or the exit status. */
int cli_print_doc(tps_ctx *ctx, tps_err e, char **doc);

/* Shared by plan and split: open MODEL and pick the plan (--plan, --family,
 * or detected). Returns 0 or the exit status after printing the error. */
int cli_open_model_and_plan(tps_ctx *ctx, const char *model, const char *plan_file,
                            const char *family, tps_ckpt **ck, tps_plan **plan);
int cli_print_plan(tps_ctx *ctx, const char *model, tps_ckpt *ck, tps_plan *plan, tps_layout *L);
/* The checkpoint's quantization: a "quantization: ..." line; nothing
 * printed when none. */
void cli_quant_line(tps_ctx *ctx, const tps_ckpt *ck);
/* --layout NAME|FILE: NULL for dtensor. Returns 0 or the exit status after
 * printing the error. */
int cli_open_layout(tps_ctx *ctx, const char *layout, tps_layout_spec **spec);
/* "tpshard: error: plan|layout X rejects tp N: why" on stderr. */
void cli_report_rejection(const tps_plan *plan, const tps_layout *L);
/* --untie: unties ck by the plan (dtensor layout only, spec NULL); 0, 2 when it
 * does not apply (usage), else 1. */
int cli_untie(tps_ctx *ctx, tps_ckpt *ck, tps_plan *plan, const tps_layout_spec *spec,
              const char *usage);

/* --pp and --pp-layers (plan, split): *pp from the list's length when only
 * --pp-layers is given; a usage error (2) for a layout without pipeline
 * stages, a bad list, or a list that VLLM_PP_LAYER_PARTITION (honoured when
 * set, and said at -v) contradicts. *layers: the partition to use (malloc'd),
 * or NULL for the engine's own. 0 to go on, else the exit status. */
int cli_pipeline(const char *usage, const char *cmd, long *pp, const char *pp_layers,
                 const tps_layout_spec *spec, int **layers);

/* --moe-backend NAME (plan, split): vLLM's MoE backend for MXFP4 experts
 * (tps_moe_backend_find); NULL: TPS_MOE_BACKEND_DEFAULT. An unknown name is a
 * usage error: 2 after printing it and the names, else 0 and *out. */
int cli_moe_backend(const char *usage, const char *cmd, const char *name,
                    const tps_moe_backend **out);
/* What --moe-backend (given: named by the user) does for ck under the layout
 * (NULL: dtensor): a note on stderr when it is ignored. */
void cli_moe_backend_note(tps_ctx *ctx, const tps_ckpt *ck, const char *layout,
                          const tps_moe_backend *b, int given);
/* The backend plan's and inspect's quantization line shows for MXFP4 experts. */
extern const tps_moe_backend *g_moe_backend;

/* Subcommands: each returns the exit status. */
int cmd_inspect(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_split(int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_merge(int argc, char **argv);
int cmd_verify(int argc, char **argv);

/* Usage texts: the first line of each is the synopsis the man page repeats. */
extern const char usage_inspect[], usage_plan[], usage_split[], usage_check[], usage_merge[],
    usage_verify[];
#endif
