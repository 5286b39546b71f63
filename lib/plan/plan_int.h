/* plan_int.h - what the files of lib/plan/ share: the bounds on hostile
 * plans and layouts, the parser context, the YAML node tree, and the schema
 * helpers both readers (plan_yaml.c for plans, lspec.c for layout files)
 * use. Private to lib/plan/; the API the rest calls is in internal.h. */
#ifndef TPS_PLAN_INT_H
#define TPS_PLAN_INT_H

#include "internal.h"

/* Bounds on hostile plans (fuzzed): text, rules, checks, nesting and nodes. */
#define PLAN_MAX_BYTES ((size_t)1 << 20)
#define PLAN_MAX_RULES 10000
#define PLAN_MAX_CHECKS 1000
#define PLAN_MAX_DEPTH 64
#define PLAN_MAX_NODES 500000
#define PLAN_MAX_NAME 64
/* A scalar quoted in an error message is cut to this many bytes. */
#define SHOW 80

/* ------------------------------------------------------------------ errors (plan_yaml.c) */

typedef struct {
    tps_ctx *ctx;
    const char *label;
} pctx;

tps_err tps_pl_perr(const pctx *pc, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
tps_err tps_pl_nomem(tps_ctx *ctx);
/* Length to print of a user string in a message, so a 1 MiB scalar does not
 * flood the error. */
int tps_pl_shown(const char *s);

/* ------------------------------------------------------------------ YAML tree (plan_yaml.c) */

enum { YN_SCALAR, YN_SEQ, YN_MAP };

typedef struct ynode ynode;
struct ynode {
    int type;
    int line;   /* 1-based */
    int plain;  /* scalar written without quotes: may be null/bool/number */
    char *s;    /* scalar text, NUL-terminated */
    ynode **kid; /* sequence items; mapping keys and values alternating */
    size_t n, cap;
};

/* One YAML document (no tags, no aliases, bounded depth and nodes) as a tree
 * the caller frees with tps_pl_ynode_free. */
tps_err tps_pl_yaml_load(const pctx *pc, const char *text, size_t len, ynode **out);
void tps_pl_ynode_free(ynode *y);

/* Scalars as YAML 1.2's core schema types them (plain ones only). */
int tps_pl_y_is_null(const ynode *y);
int tps_pl_y_number(const ynode *y, double *d); /* 0 ok, -1 not a decimal number */
const char *tps_pl_y_kind(const ynode *y);     /* "a list", "a number", ... for messages */

/* ------------------------------------------------------------------ schema helpers (plan_yaml.c) */

/* Splits mapping m into the values of its known keys (vals[i] for known[i],
 * NULL when absent); unknown and duplicate keys are errors. */
tps_err tps_pl_map_fields(const pctx *pc, const ynode *m, const char *what,
                          const char *const *known, size_t nk, const ynode **vals);
tps_err tps_pl_get_str(const pctx *pc, const ynode *v, const char *key, char **out);
tps_err tps_pl_get_bool(const pctx *pc, const ynode *v, const char *key, int *out);

typedef tps_err (*item_check)(const pctx *pc, const ynode *item);

/* A string or a list of strings, each checked with chk when given; *out is
 * freed with tps_pl_strv_free(*out, *n). */
tps_err tps_pl_get_str_list(const pctx *pc, const ynode *v, const char *key, item_check chk,
                            char ***out, size_t *n);
void tps_pl_strv_free(char **v, size_t n);

/* A module path pattern (dotted, no white space, no .weight/.bias). */
tps_err tps_pl_check_pattern(const pctx *pc, const ynode *it);
/* A plan or layout name: letters, digits, '_', '-', '.', at most PLAN_MAX_NAME. */
tps_err tps_pl_check_plan_name(const pctx *pc, const ynode *it);
/* A config.json field name. */
tps_err tps_pl_check_field_name(const pctx *pc, const ynode *it, const char *key);

/* A condition ({field, truthy|falsy|equals|not_equals, default}) as parsed;
 * tps_pl_cond_clear frees what it holds. */
tps_err tps_pl_parse_cond(const pctx *pc, const ynode *m, const char *what, tps_cond *c);
void tps_pl_cond_clear(tps_cond *c);

/* ------------------------------------------------------------------ matching (plan_match.c) */

/* 1 when s[0..n) holds a pattern character ('*', '?', '[' or '\\'). */
int tps_pl_has_glob(const char *s, size_t n);

/* ------------------------------------------------------------------ expressions (plan_expr.c) */

/* 0 when expr parses (fields and numbers under + - * / and parentheses),
 * else -1 with why. */
int tps_pl_expr_syntax(const char *expr, char *why, size_t whylen);

#endif
