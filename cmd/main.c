/* main.c - the subcommand table (after git's commands[]), --version, -h, and
 * the signal handlers that turn SIGINT/SIGTERM into a clean stop. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "cli.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *usage;
    const char *what;
} commands[] = {
    {"inspect", cmd_inspect, usage_inspect, "list a checkpoint's tensors, dtypes and TP-relevant config"},
    {"plan", cmd_plan, usage_plan, "show how a plan places every tensor at a tp size (writes nothing)"},
    {"split", cmd_split, usage_split, "write one safetensors file per TP rank"},
    {"check", cmd_check, usage_check, "verify a shard directory against its manifest"},
    {"merge", cmd_merge, usage_merge, "reassemble the full checkpoint from a shard directory"},
    {"verify", cmd_verify, usage_verify, "prove the sharded matmuls reproduce the unsharded ones"},
};
#define NCMD (sizeof commands / sizeof commands[0])

tps_ctx *g_sig_ctx;

static void on_signal(int sig)
{
    (void)sig;
    if (g_sig_ctx) tps_ctx_interrupt(g_sig_ctx);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: tpshard <command> [options]\n       tpshard --version | -h\n\ncommands:\n");
    for (size_t i = 0; i < NCMD; i++) fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].what);
    fprintf(f, "\n'tpshard <command> -h' shows a command's options; man tpshard-<command> its manual.\n");
}

static int version(void)
{
    char info[512];
    printf("tpshard %s\n", tps_version());
    printf("backends: %s\n", tps_backends_built());
    printf("features: %s\n", tps_build_features());
    if (tps_backend_runtime_info(info, sizeof info) == TPS_OK) printf("runtime: %s\n", info);
    printf("built-in plans:");
    for (size_t i = 0; i < tps_plan_builtin_count(); i++) printf(" %s", tps_plan_builtin_name(i));
    printf("\n");
    return 0;
}

int main(int argc, char **argv)
{
#ifdef __GLIBC__
    /* Allocations of 1 MiB and more get pages of their own, given back when
     * freed. glibc's default raises that threshold to the largest block freed
     * so far (up to 32 MiB), after which the tables a split, check or verify
     * grows and frees stay resident in the heap between the ones still used:
     * 97 -> 80 MiB for a DeepSeek-V3-sized split in passes. */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
#endif
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *c = argv[1];
    if (!strcmp(c, "-h") || !strcmp(c, "--help") || !strcmp(c, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(c, "--version") || !strcmp(c, "-V") || !strcmp(c, "version")) return version();
    opterr = 0; /* the subcommands report bad options themselves, with the usage */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    /* A file-size limit must come back as EFBIG from write(), not kill us. */
    signal(SIGXFSZ, SIG_IGN);
    for (size_t i = 0; i < NCMD; i++)
        if (!strcmp(c, commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "tpshard: '%s' is not a command\n", c);
    usage(stderr);
    return 2;
}
