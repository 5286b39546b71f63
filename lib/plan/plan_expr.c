/* plan_expr.c - integer expressions of config.json fields (+ - * / and
 * parentheses), as packed sections give their row counts: the syntax check
 * a plan gets when it is read (tps_pl_expr_syntax) and the evaluation
 * against a config (tps_expr_eval). */
#include "plan_int.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------------ expressions */

typedef struct {
    const char *s;
    const cJSON *config;
    char *why;
    size_t whylen;
    int err;
    int syntax; /* only the syntax: every field reads as 1, no arithmetic refusals */
} ex;

static void ex_fail(ex *e, const char *fmt, const char *arg)
{
    if (!e->err) snprintf(e->why, e->whylen, fmt, arg);
    e->err = 1;
}

static void ex_space(ex *e)
{
    while (*e->s == ' ' || *e->s == '\t') e->s++;
}

static uint64_t ex_sum(ex *e);

static uint64_t ex_field(ex *e, const char *name)
{
    if (e->syntax) return 1;
    const cJSON *v = tps_config_get(e->config, name);
    if (!v && !strcmp(name, "head_dim")) {
        /* transformers' default: hidden_size / num_attention_heads */
        const cJSON *h = tps_config_get(e->config, "hidden_size");
        const cJSON *a = tps_config_get(e->config, "num_attention_heads");
        if (cJSON_IsNumber(h) && cJSON_IsNumber(a) && a->valuedouble >= 1)
            return (uint64_t)h->valuedouble / (uint64_t)a->valuedouble;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble) ||
        v->valuedouble > 9007199254740992.0) {
        ex_fail(e, e->config ? "config.json has no count '%s'" : "field '%s' needs a config", name);
        return 0;
    }
    return (uint64_t)v->valuedouble;
}

static uint64_t ex_atom(ex *e)
{
    ex_space(e);
    if (*e->s == '(') {
        e->s++;
        uint64_t v = ex_sum(e);
        ex_space(e);
        if (*e->s != ')') ex_fail(e, "syntax: missing ')' in '%s'", e->s);
        else e->s++;
        return v;
    }
    if (*e->s >= '0' && *e->s <= '9') {
        uint64_t v = 0;
        while (*e->s >= '0' && *e->s <= '9') {
            if (v > UINT64_MAX / 10) ex_fail(e, "syntax: number too large at '%s'", e->s);
            v = v * 10 + (uint64_t)(*e->s++ - '0');
        }
        return v;
    }
    char name[64];
    size_t n = 0;
    while ((*e->s >= 'a' && *e->s <= 'z') || (*e->s >= 'A' && *e->s <= 'Z') ||
           (*e->s >= '0' && *e->s <= '9') || *e->s == '_' || *e->s == '.') {
        if (n + 1 < sizeof name) name[n++] = *e->s;
        e->s++;
    }
    name[n] = 0;
    if (!n) {
        ex_fail(e, "syntax: expected a number, a field or '(' at '%s'", e->s);
        return 0;
    }
    return ex_field(e, name);
}

static uint64_t ex_prod(ex *e)
{
    uint64_t v = ex_atom(e);
    for (;;) {
        ex_space(e);
        char op = *e->s;
        if (op != '*' && op != '/') return v;
        e->s++;
        uint64_t w = ex_atom(e);
        if (e->err) return 0;
        if (e->syntax) {
            v = 1;
        } else if (op == '*') {
            if (tps_mul_ovf(v, w, &v)) ex_fail(e, "%s", "product overflows");
        } else if (!w || v % w) {
            char b[64];
            snprintf(b, sizeof b, "%llu / %llu", (unsigned long long)v, (unsigned long long)w);
            ex_fail(e, "%s is not a whole number", b);
        } else {
            v /= w;
        }
    }
}

static uint64_t ex_sum(ex *e)
{
    uint64_t v = ex_prod(e);
    for (;;) {
        ex_space(e);
        char op = *e->s;
        if (op != '+' && op != '-') return v;
        e->s++;
        uint64_t w = ex_prod(e);
        if (e->syntax) v = 1;
        else if (op == '+') v += w;
        else if (w > v) ex_fail(e, "%s", "difference is negative");
        else v -= w;
    }
}

/* 0 when expr parses (fields and numbers under + - * / and parentheses),
 * else -1 with why. */
int tps_pl_expr_syntax(const char *expr, char *why, size_t whylen)
{
    ex e = {.s = expr, .why = why, .whylen = whylen, .syntax = 1};
    if (whylen) why[0] = 0;
    ex_sum(&e);
    ex_space(&e);
    if (!e.err && *e.s) ex_fail(&e, "syntax: unexpected '%s'", e.s);
    return e.err ? -1 : 0;
}

int tps_expr_eval(const char *expr, const cJSON *config, uint64_t *out, char *why, size_t whylen)
{
    ex e = {.s = expr, .config = config, .why = why, .whylen = whylen};
    if (whylen) why[0] = 0;
    uint64_t v = ex_sum(&e);
    ex_space(&e);
    if (!e.err && *e.s) ex_fail(&e, "syntax: unexpected '%s'", e.s);
    if (e.err) return -1;
    *out = v;
    return 0;
}
