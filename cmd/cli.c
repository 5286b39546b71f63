/* cli.c - display level, error printing, progress, checked parsers, --json output. */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int g_display = 1;
int g_json = 0;

static int progress_shown;

void cli_progress_done(void)
{
    if (progress_shown) {
        fputs("\r\033[K", stderr);
        progress_shown = 0;
    }
}

static int vmessage(const char *prefix, const char *fmt, va_list ap)
{
    char msg[4096];
    vsnprintf(msg, sizeof msg, fmt, ap);
    cli_progress_done();
    fprintf(stderr, "tpshard: %s%s\n", prefix, msg);
    if (g_json && strcmp(prefix, "error: ") == 0) {
        char *doc = NULL;
        if (tps_error_json(NULL, msg, &doc) == TPS_OK) {
            puts(doc);
            fflush(stdout);
        }
        tps_free(doc);
    }
    return 1;
}

int cli_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmessage("error: ", fmt, ap);
    va_end(ap);
    return 1;
}

int cli_lib_error(tps_ctx *ctx, tps_err e)
{
    const char *m = tps_ctx_errmsg(ctx);
    if (e == TPS_E_INTERRUPTED) {
        cli_error("interrupted; no partial file was left under a final name");
        return 130;
    }
    if (m && *m) return cli_error("%s", m);
    return cli_error("%s", tps_strerror(e));
}

/* "usage: tpshard split MODEL ..." -> "tpshard split" (*len bytes). */
static const char *usage_command(const char *usage, int *len)
{
    const char *c = strstr(usage, "tpshard ");
    if (!c) {
        *len = 7;
        return "tpshard";
    }
    *len = 8 + (int)strcspn(c + 8, " \n");
    return c;
}

int cli_usage_error(const char *usage, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "tpshard: error: %s\n", msg);
    const char *nl = strchr(usage, '\n');
    int clen;
    const char *cmd = usage_command(usage, &clen);
    fprintf(stderr, "%.*s\nTry '%.*s -h' for more.\n", nl ? (int)(nl - usage) : (int)strlen(usage),
            usage, clen, cmd);
    return 2;
}

void cli_warn(const char *fmt, ...)
{
    if (g_display < 1) return;
    va_list ap;
    va_start(ap, fmt);
    vmessage("warning: ", fmt, ap);
    va_end(ap);
}

void cli_info(const char *fmt, ...)
{
    if (g_display < 2) return;
    va_list ap;
    va_start(ap, fmt);
    vmessage("", fmt, ap);
    va_end(ap);
}

static void log_cb(void *user, tps_log_level lvl, const char *msg)
{
    (void)user;
    if (lvl == TPS_LOG_WARN) cli_warn("%s", msg);
    else if (lvl == TPS_LOG_INFO) cli_info("%s", msg);
    else if (lvl == TPS_LOG_DEBUG && g_display >= 3) cli_info("%s", msg);
    else if (lvl == TPS_LOG_ERROR) cli_error("%s", msg);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static double prog_start, prog_last;

/* On a terminal (or at -v): "42% 1.2 GiB/2.9 GiB 1.8 GiB/s ETA 1s  tensor". */
static void progress_cb(void *user, uint64_t done, uint64_t total, const char *what)
{
    (void)user;
    double t = now_s();
    if (prog_start == 0) prog_start = t;
    if (t - prog_last < 0.25 && done < total) return;
    prog_last = t;
    char a[32], b[32], r[32];
    double el = t - prog_start, rate = el > 0 ? done / el : 0;
    double eta = rate > 0 ? (total - done) / rate : 0;
    int tty = isatty(2);
    fprintf(stderr, "%s%5.1f%% %s/%s %s/s ETA %.0fs  %.60s%s", tty ? "\r\033[K" : "",
            total ? 100.0 * done / total : 100.0, cli_human(done, a, sizeof a),
            cli_human(total, b, sizeof b), cli_human((uint64_t)rate, r, sizeof r), eta,
            what ? what : "", tty ? "" : "\n");
    progress_shown = tty;
}

tps_ctx *cli_ctx(void)
{
    tps_ctx *ctx = tps_ctx_new();
    if (!ctx) {
        fprintf(stderr, "tpshard: error: out of memory\n");
        exit(1);
    }
    tps_ctx_set_log(ctx, log_cb, NULL);
    g_sig_ctx = ctx;
    if (!g_json && ((g_display >= 1 && isatty(2)) || g_display >= 2))
        tps_ctx_set_progress(ctx, progress_cb, NULL);
    return ctx;
}

int cli_common_option(int c, const char *usage, char **argv)
{
    switch (c) {
    case 'j': g_json = 1; return -1;
    case 'q': g_display = 0; return -1;
    case 'v': g_display++; return -1;
    case 'h': fputs(usage, stdout); return 0;
    }
    int clen;
    const char *cmd = usage_command(usage, &clen);
    if (clen > 8) { /* "split", without "tpshard " */
        cmd += 8;
        clen -= 8;
    }
    return cli_usage_error(usage, "%.*s: unknown option or missing value: '%s'", clen, cmd,
                           argv[optind - 1]);
}

int cli_parse_one_operand(int argc, char **argv, const char *usage, const char *missing,
                          const char **operand)
{
    static const struct option opts[] = {{"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'},
                                         {"quiet", no_argument, 0, 'q'}, {"verbose", no_argument, 0, 'v'},
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "hqvj", opts, NULL)) != -1) {
        int st = cli_common_option(c, usage, argv);
        if (st >= 0) return st;
    }
    if (optind != argc - 1) return cli_usage_error(usage, "%s", missing);
    *operand = argv[optind];
    return -1;
}

int cli_parse_int(const char *usage, const char *opt, const char *s, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max)
        return cli_usage_error(usage, "%s: '%s' is not a whole number from %ld to %ld", opt, s, min, max);
    *out = v;
    return 0;
}

int cli_parse_size(const char *usage, const char *opt, const char *s, uint64_t *out)
{
    if (tps_parse_size(s, out) != 0 || *out == 0)
        return cli_usage_error(usage, "%s: '%s' is not a size (e.g. 512M, 5G)", opt, s);
    return 0;
}

const char *cli_human(uint64_t v, char *buf, size_t len)
{
    static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double d = (double)v;
    int i = 0;
    while (d >= 1024 && i < 5) {
        d /= 1024;
        i++;
    }
    if (i == 0) snprintf(buf, len, "%llu B", (unsigned long long)v);
    else snprintf(buf, len, "%.2f %s", d, u[i]);
    return buf;
}

int cli_print_doc(tps_ctx *ctx, tps_err e, char **doc)
{
    if (e) return cli_lib_error(ctx, e);
    puts(*doc);
    fflush(stdout);
    tps_free(*doc);
    *doc = NULL;
    return 0;
}

int cli_pipeline(const char *usage, const char *cmd, long *pp, const char *pp_layers,
                 const tps_layout_spec *spec, int **layers)
{
    char why[160];
    int *given = NULL, *env = NULL;
    const char *ev = getenv("VLLM_PP_LAYER_PARTITION");
    int st = 0;
    *layers = NULL;
    if (pp_layers && !*pp) { /* the list's length is the stage count */
        *pp = 1;
        for (const char *c = pp_layers; *c; c++) *pp += *c == ',';
    }
    if (*pp <= 1 && !pp_layers) {
        if (ev && *ev)
            cli_info("%s: VLLM_PP_LAYER_PARTITION=%s is set, but there is one pipeline stage: "
                     "ignored", cmd, ev);
        return 0;
    }
    if (!tps_layout_spec_has_pipeline(spec)) {
        char list[256] = "";
        size_t o = 0;
        tps_ctx *c = tps_ctx_new();
        for (size_t i = 0; c && i < tps_layout_spec_builtin_count(); i++) {
            tps_layout_spec *s = NULL;
            if (tps_layout_spec_builtin(c, tps_layout_spec_builtin_name(i), &s) == TPS_OK &&
                tps_layout_spec_has_pipeline(s) && o < sizeof list)
                o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", o ? ", " : "",
                                      tps_layout_spec_name(s));
            tps_layout_spec_free(s);
        }
        tps_ctx_free(c);
        return cli_usage_error(usage,
                               "%s: --pp%s is for layouts with pipeline stages (--layout %s); "
                               "layout %s has none",
                               cmd, pp_layers ? "-layers" : "", o ? list : "none",
                               tps_layout_spec_name(spec));
    }
    given = pp_layers ? calloc((size_t)*pp, sizeof *given) : NULL;
    env = ev && *pp > 1 ? calloc((size_t)*pp, sizeof *env) : NULL;
    if ((pp_layers && !given) || (ev && *pp > 1 && !env)) {
        st = cli_error("out of memory");
        goto out;
    }
    if (given && tps_pp_parse_layers(pp_layers, (int)*pp, given, why, sizeof why)) {
        st = cli_usage_error(usage, "%s: --pp-layers '%s': %s", cmd, pp_layers, why);
        goto out;
    }
    if (env && tps_pp_parse_layers(ev, (int)*pp, env, why, sizeof why)) {
        st = cli_usage_error(usage, "%s: VLLM_PP_LAYER_PARTITION '%s': %s (vLLM reads the same "
                                    "variable and would refuse it)",
                             cmd, ev, why);
        goto out;
    }
    if (given && env && memcmp(given, env, sizeof *given * (size_t)*pp)) {
        st = cli_usage_error(usage,
                             "%s: --pp-layers %s and VLLM_PP_LAYER_PARTITION=%s disagree: vLLM "
                             "partitions the layers as the variable says; give one, or the same",
                             cmd, pp_layers, ev);
        goto out;
    }
    if (env) {
        cli_info("%s: layer partition %s from VLLM_PP_LAYER_PARTITION", cmd, ev);
        *layers = env;
        env = NULL;
    } else if (given) {
        *layers = given;
        given = NULL;
    }
out:
    free(given);
    free(env);
    return st;
}
