/* plan.c - TP plans: YAML parsing, module-path matching, conditions and
 * config checks. The format is documented in man/tpshard-plan.5.
 *
 * Parsing is two passes: libyaml's event stream is turned into a small node
 * tree (bounded in depth and size), then the tree is walked against the plan
 * schema. Going through a tree keeps every schema error on one code path that
 * knows the line of the offending node, and the walk stays linear in the
 * number of rules (no per-key search over large mappings). */
#include "internal.h"

#include <fnmatch.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <yaml.h>

/* Bounds on hostile plans (fuzzed): text, rules, checks, nesting and nodes. */
#define PLAN_MAX_BYTES ((size_t)1 << 20)
#define PLAN_MAX_RULES 10000
#define PLAN_MAX_CHECKS 1000
#define PLAN_MAX_DEPTH 64
#define PLAN_MAX_NODES 500000
#define PLAN_MAX_NAME 64
/* A scalar quoted in an error message is cut to this many bytes. */
#define SHOW 80

/* The table tools/embed.sh generates into lib/plans_gen.c. Its struct is
 * untagged there; an untagged struct with the same members is compatible
 * across translation units (C11 6.2.7). */
typedef struct {
    const char *name;
    const char *text;
    size_t len;
} builtin_plan;
extern const builtin_plan tps_builtin_plans[];
extern const size_t tps_builtin_plans_n;

/* ------------------------------------------------------------------ styles */

static const struct {
    const char *name;
    tps_style style;
} style_names[] = {
    {"colwise", TPS_STYLE_COLWISE},
    {"rowwise", TPS_STYLE_ROWWISE},
    {"embedding_rowwise", TPS_STYLE_EMBED_ROWWISE},
    {"embedding_colwise", TPS_STYLE_EMBED_COLWISE},
    {"replicate", TPS_STYLE_REPLICATE},
    {"sequence_parallel", TPS_STYLE_SEQPAR},
    /* Alias accepted on input, never printed: DESIGN §5 calls the vocab-parallel
     * embedding "vocab" (NeMo's VocabParallelEmbedding). */
    {"vocab", TPS_STYLE_EMBED_ROWWISE},
};
#define STYLES_LISTED 6
#define STYLES_KNOWN "colwise, rowwise, embedding_rowwise, embedding_colwise, replicate, " \
                     "sequence_parallel"

const char *tps_style_name(tps_style s)
{
    switch (s) {
    case TPS_STYLE_REPLICATE: return "replicate";
    case TPS_STYLE_COLWISE: return "colwise";
    case TPS_STYLE_ROWWISE: return "rowwise";
    case TPS_STYLE_EMBED_ROWWISE: return "embedding_rowwise";
    case TPS_STYLE_EMBED_COLWISE: return "embedding_colwise";
    case TPS_STYLE_SEQPAR: return "sequence_parallel";
    }
    return "unknown";
}

int tps_style_lookup(const char *s, tps_style *out)
{
    for (size_t i = 0; i < sizeof style_names / sizeof style_names[0]; i++)
        if (strcmp(style_names[i].name, s) == 0) {
            *out = style_names[i].style;
            return 0;
        }
    return -1;
}

/* ------------------------------------------------------------------ errors */

typedef struct {
    tps_ctx *ctx;
    const char *label;
} pctx;

static tps_err perr(const pctx *pc, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static tps_err perr(const pctx *pc, int line, const char *fmt, ...)
{
    char buf[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return tps_fail(pc->ctx, TPS_E_PLAN, "%s:%d: %s", pc->label, line, buf);
}

static tps_err nomem(tps_ctx *ctx)
{
    return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
}

/* Length to print of a user string in a message, so a 1 MiB scalar does not
 * flood the error. */
static int shown(const char *s)
{
    size_t n = strnlen(s, SHOW + 1);
    return (int)(n > SHOW ? SHOW : n);
}

/* ------------------------------------------------------------------ YAML tree */

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

static void ynode_free(ynode *y)
{
    if (!y) return;
    /* Depth is bounded by PLAN_MAX_DEPTH, so recursion is safe. */
    for (size_t i = 0; i < y->n; i++) ynode_free(y->kid[i]);
    free(y->kid);
    free(y->s);
    free(y);
}

static int ynode_add(ynode *parent, ynode *kid)
{
    if (parent->n == parent->cap) {
        size_t cap = parent->cap ? parent->cap * 2 : 4;
        ynode **k = realloc(parent->kid, cap * sizeof *k);
        if (!k) return -1;
        parent->kid = k;
        parent->cap = cap;
    }
    parent->kid[parent->n++] = kid;
    return 0;
}

typedef struct {
    ynode *root;
    ynode *stack[PLAN_MAX_DEPTH];
    int depth;
    size_t nodes;
} ybuild;

/* Makes the node for a scalar / sequence start / mapping start event and
 * hangs it under the open container (or as the root). */
static tps_err ybuild_open(const pctx *pc, ybuild *b, const yaml_event_t *ev)
{
    int line = (int)ev->start_mark.line + 1;
    int is_scalar = ev->type == YAML_SCALAR_EVENT;
    const yaml_char_t *tag = is_scalar ? ev->data.scalar.tag
                             : ev->type == YAML_SEQUENCE_START_EVENT ? ev->data.sequence_start.tag
                                                                     : ev->data.mapping_start.tag;
    /* Tags would let a plan retype values behind the schema's back. */
    if (tag) return perr(pc, line, "YAML tags (%s) are not supported in plans", (const char *)tag);
    if (!is_scalar && b->depth == PLAN_MAX_DEPTH)
        return perr(pc, line, "plan nests deeper than %d levels", PLAN_MAX_DEPTH);
    if (++b->nodes > PLAN_MAX_NODES)
        return perr(pc, line, "plan has more than %d YAML nodes", PLAN_MAX_NODES);

    ynode *y = tps_xcalloc(1, sizeof *y);
    if (!y) return nomem(pc->ctx);
    y->line = line;
    if (is_scalar) {
        size_t len = ev->data.scalar.length;
        y->type = YN_SCALAR;
        y->plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
        y->s = tps_xmalloc(len + 1);
        if (!y->s) {
            free(y);
            return nomem(pc->ctx);
        }
        memcpy(y->s, ev->data.scalar.value, len);
        y->s[len] = '\0';
        if (memchr(y->s, '\0', len)) {
            ynode_free(y);
            return perr(pc, line, "string holds a NUL character");
        }
    } else {
        y->type = ev->type == YAML_SEQUENCE_START_EVENT ? YN_SEQ : YN_MAP;
    }
    if (b->depth == 0) {
        b->root = y; /* one document, so exactly one root */
    } else if (ynode_add(b->stack[b->depth - 1], y)) {
        ynode_free(y);
        return nomem(pc->ctx);
    }
    if (!is_scalar) b->stack[b->depth++] = y;
    return TPS_OK;
}

static tps_err yaml_load(const pctx *pc, const char *text, size_t len, ynode **out)
{
    yaml_parser_t ps;
    yaml_event_t ev;
    ybuild b;
    int ndocs = 0, done = 0;
    tps_err rc = TPS_OK;

    memset(&b, 0, sizeof b);
    *out = NULL;
    if (!yaml_parser_initialize(&ps)) return nomem(pc->ctx);
    yaml_parser_set_input_string(&ps, (const unsigned char *)text, len);
    while (!done) {
        if (!yaml_parser_parse(&ps, &ev)) {
            if (ps.error == YAML_MEMORY_ERROR) {
                rc = nomem(pc->ctx);
            } else if (ps.context) {
                rc = perr(pc, (int)ps.problem_mark.line + 1, "bad YAML: %s (%s at line %d)",
                          ps.problem ? ps.problem : "syntax error", ps.context,
                          (int)ps.context_mark.line + 1);
            } else {
                rc = perr(pc, (int)ps.problem_mark.line + 1, "bad YAML: %s",
                          ps.problem ? ps.problem : "syntax error");
            }
            goto out;
        }
        int line = (int)ev.start_mark.line + 1;
        switch (ev.type) {
        case YAML_STREAM_END_EVENT:
            done = 1;
            break;
        case YAML_DOCUMENT_START_EVENT:
            if (++ndocs > 1)
                rc = perr(pc, line, "more than one YAML document (a plan is one document)");
            break;
        case YAML_ALIAS_EVENT:
            /* Aliases are how YAML bombs multiply; plans have no use for them. */
            rc = perr(pc, line, "YAML aliases (*%s) are not supported in plans",
                      (const char *)ev.data.alias.anchor);
            break;
        case YAML_SCALAR_EVENT:
        case YAML_SEQUENCE_START_EVENT:
        case YAML_MAPPING_START_EVENT:
            rc = ybuild_open(pc, &b, &ev);
            break;
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT:
            if (b.depth > 0) b.depth--;
            break;
        default:
            break;
        }
        yaml_event_delete(&ev);
        if (rc != TPS_OK) goto out;
    }
    if (!b.root) {
        rc = perr(pc, 1, "empty plan (expected a mapping with 'name' and 'rules')");
        goto out;
    }
    *out = b.root;
    b.root = NULL;
out:
    ynode_free(b.root);
    yaml_parser_delete(&ps);
    return rc;
}

/* ------------------------------------------------------------------ scalars */

static int y_is_null(const ynode *y)
{
    return y->type == YN_SCALAR && y->plain &&
           (!y->s[0] || !strcmp(y->s, "~") || !strcmp(y->s, "null") || !strcmp(y->s, "Null") ||
            !strcmp(y->s, "NULL"));
}

static int y_bool(const ynode *y, int *b)
{
    if (y->type != YN_SCALAR || !y->plain) return -1;
    if (!strcmp(y->s, "true") || !strcmp(y->s, "True") || !strcmp(y->s, "TRUE")) {
        *b = 1;
        return 0;
    }
    if (!strcmp(y->s, "false") || !strcmp(y->s, "False") || !strcmp(y->s, "FALSE")) {
        *b = 0;
        return 0;
    }
    return -1;
}

/* YAML 1.2 core-schema decimal numbers only: [-+]digits[.digits][e[-+]digits]. */
static int y_number(const ynode *y, double *d)
{
    const char *s = y->s;
    int digits = 0;
    if (y->type != YN_SCALAR || !y->plain) return -1;
    if (*s == '-' || *s == '+') s++;
    while (*s >= '0' && *s <= '9') s++, digits++;
    if (*s == '.') {
        s++;
        while (*s >= '0' && *s <= '9') s++, digits++;
    }
    if (!digits) return -1;
    if (*s == 'e' || *s == 'E') {
        s++;
        if (*s == '-' || *s == '+') s++;
        if (!(*s >= '0' && *s <= '9')) return -1;
        while (*s >= '0' && *s <= '9') s++;
    }
    if (*s) return -1;
    *d = strtod(y->s, NULL);
    return 0;
}

static const char *y_kind(const ynode *y)
{
    int b;
    double d;
    if (y->type == YN_SEQ) return "a list";
    if (y->type == YN_MAP) return "a mapping";
    if (y_is_null(y)) return "empty";
    if (!y_bool(y, &b)) return "a boolean";
    if (!y_number(y, &d)) return "a number";
    return "a string";
}

/* ------------------------------------------------------------------ schema helpers */

/* Splits mapping m into the values of its known keys (vals[i] for known[i],
 * NULL when absent); unknown and duplicate keys are errors. Linear in the
 * mapping's size. */
static tps_err map_fields(const pctx *pc, const ynode *m, const char *what,
                          const char *const *known, size_t nk, const ynode **vals)
{
    for (size_t j = 0; j < nk; j++) vals[j] = NULL;
    if (m->type != YN_MAP)
        return perr(pc, m->line, "%s must be a mapping, not %s", what, y_kind(m));
    for (size_t i = 0; i + 1 < m->n; i += 2) {
        const ynode *k = m->kid[i];
        size_t j;
        if (k->type != YN_SCALAR)
            return perr(pc, k->line, "%s: a key must be a plain word, not %s", what, y_kind(k));
        for (j = 0; j < nk; j++)
            if (!strcmp(known[j], k->s)) break;
        if (j == nk) {
            char list[256];
            size_t off = 0;
            list[0] = '\0';
            for (size_t x = 0; x < nk && off < sizeof list; x++)
                off += (size_t)snprintf(list + off, sizeof list - off, "%s%s", x ? ", " : "",
                                        known[x]);
            return perr(pc, k->line, "unknown key '%.*s' in %s (known: %s)", shown(k->s), k->s,
                        what, list);
        }
        if (vals[j]) return perr(pc, k->line, "duplicate key '%s' in %s", known[j], what);
        vals[j] = m->kid[i + 1];
    }
    return TPS_OK;
}

/* Any non-empty scalar reads as a string (YAML would type `name: 3` as a
 * number; a plan author means the text). */
static tps_err get_str(const pctx *pc, const ynode *v, const char *key, char **out)
{
    if (v->type != YN_SCALAR)
        return perr(pc, v->line, "'%s' must be a string, not %s", key, y_kind(v));
    if (y_is_null(v) || !v->s[0]) return perr(pc, v->line, "'%s' needs a value", key);
    *out = tps_strdup(v->s);
    return *out ? TPS_OK : nomem(pc->ctx);
}

static tps_err get_bool(const pctx *pc, const ynode *v, const char *key, int *out)
{
    if (y_bool(v, out))
        return perr(pc, v->line, "'%s' must be true or false, not %s", key, y_kind(v));
    return TPS_OK;
}

typedef tps_err (*item_check)(const pctx *pc, const ynode *item);

/* A string or a list of strings, e.g. `match: a.b` or `match: [a.b, c.d]`. */
static tps_err get_str_list(const pctx *pc, const ynode *v, const char *key, item_check chk,
                            char ***out, size_t *n)
{
    const ynode *const *items;
    size_t cnt;
    if (v->type == YN_MAP)
        return perr(pc, v->line, "'%s' must be a string or a list of strings, not a mapping", key);
    if (v->type == YN_SCALAR) {
        items = (const ynode *const *)&v;
        cnt = 1;
    } else {
        items = (const ynode *const *)v->kid;
        cnt = v->n;
    }
    *out = tps_xcalloc(cnt ? cnt : 1, sizeof **out);
    if (!*out) return nomem(pc->ctx);
    for (size_t i = 0; i < cnt; i++) {
        const ynode *it = items[i];
        if (it->type != YN_SCALAR)
            return perr(pc, it->line, "'%s' items must be strings, not %s", key, y_kind(it));
        TPS_TRY(get_str(pc, it, key, &(*out)[i]));
        (*n)++;
        if (chk) TPS_TRY(chk(pc, it));
    }
    return TPS_OK;
}

static tps_err check_pattern(const pctx *pc, const ynode *it)
{
    const char *s = it->s;
    size_t n = strlen(s);
    if (s[0] == '.' || s[n - 1] == '.' || strstr(s, ".."))
        return perr(pc, it->line, "pattern '%.*s' has an empty dotted component", shown(s), s);
    for (const char *c = s; *c; c++)
        if (*c == ' ' || *c == '\t' || *c == '\n' || *c == '\r')
            return perr(pc, it->line, "pattern '%.*s' contains white space", shown(s), s);
    /* Patterns name modules; a parameter suffix would never match and would
     * silently leave the tensor replicated. */
    if ((n > 7 && !strcmp(s + n - 7, ".weight")) || (n > 5 && !strcmp(s + n - 5, ".bias")))
        return perr(pc, it->line,
                    "pattern '%.*s' names a parameter: patterns are module paths, without the "
                    "final .weight or .bias",
                    shown(s), s);
    return TPS_OK;
}

static tps_err check_plan_name(const pctx *pc, const ynode *it)
{
    const char *s = it->s;
    if (strlen(s) > PLAN_MAX_NAME)
        return perr(pc, it->line, "plan name is longer than %d characters", PLAN_MAX_NAME);
    for (const char *c = s; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '_' || *c == '-' || *c == '.'))
            return perr(pc, it->line,
                        "plan name '%.*s' may only hold letters, digits, '_', '-' and '.'",
                        shown(s), s);
    return TPS_OK;
}

/* A YAML scalar as the JSON value it is compared with: true/false, a number,
 * or a string (quoted scalars are always strings). */
static tps_err get_json_scalar(const pctx *pc, const ynode *v, const char *key, int allow_null,
                               cJSON **out)
{
    int b;
    double d;
    *out = NULL;
    if (v->type != YN_SCALAR)
        return perr(pc, v->line, "'%s' must be true, false, a number or a string, not %s", key,
                    y_kind(v));
    if (y_is_null(v)) {
        if (allow_null) return TPS_OK;
        return perr(pc, v->line, "'%s' needs a value (true, false, a number or a string)", key);
    }
    if (!y_bool(v, &b))
        *out = cJSON_CreateBool(b);
    else if (!y_number(v, &d))
        *out = cJSON_CreateNumber(d);
    else
        *out = cJSON_CreateString(v->s);
    return *out ? TPS_OK : nomem(pc->ctx);
}

static void cond_clear(tps_cond *c)
{
    free(c->field);
    cJSON_Delete(c->value);
    cJSON_Delete(c->dflt);
    memset(c, 0, sizeof *c);
}

static tps_err parse_cond(const pctx *pc, const ynode *m, const char *what, tps_cond *c)
{
    static const char *const known[] = {"field", "truthy", "falsy", "equals", "default",
                                        "not_equals"};
    const ynode *v[6];
    int b, nops;
    TPS_TRY(map_fields(pc, m, what, known, 6, v));
    if (!v[0])
        return perr(pc, m->line, "%s without 'field' (the config.json field it tests)", what);
    TPS_TRY(get_str(pc, v[0], "field", &c->field));
    nops = !!v[1] + !!v[2] + !!v[3] + !!v[5];
    if (nops == 0)
        return perr(pc, m->line, "%s needs one of truthy, falsy, equals or not_equals", what);
    if (nops > 1)
        return perr(pc, m->line, "%s takes only one of truthy, falsy, equals or not_equals", what);
    if (v[5]) {
        c->op = TPS_COND_NOT_EQUALS;
        TPS_TRY(get_json_scalar(pc, v[5], "not_equals", 0, &c->value));
    } else
    if (v[1]) {
        TPS_TRY(get_bool(pc, v[1], "truthy", &b));
        c->op = b ? TPS_COND_TRUTHY : TPS_COND_FALSY;
    } else if (v[2]) {
        TPS_TRY(get_bool(pc, v[2], "falsy", &b));
        c->op = b ? TPS_COND_FALSY : TPS_COND_TRUTHY;
    } else {
        c->op = TPS_COND_EQUALS;
        TPS_TRY(get_json_scalar(pc, v[3], "equals", 0, &c->value));
    }
    if (v[4]) TPS_TRY(get_json_scalar(pc, v[4], "default", 1, &c->dflt));
    return TPS_OK;
}

static tps_err check_field_name(const pctx *pc, const ynode *it, const char *key)
{
    for (const char *c = it->s; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '_'))
            return perr(pc, it->line, "'%s: %.*s' is not a config.json field name", key,
                        shown(it->s), it->s);
    return TPS_OK;
}

static tps_err parse_rule(const pctx *pc, const ynode *m, tps_rule *r)
{
    static const char *const known[] = {"match", "style", "when", "heads"};
    const ynode *v[4];
    TPS_TRY(map_fields(pc, m, "rule", known, 4, v));
    r->line = m->line;
    if (!v[0])
        return perr(pc, m->line, "rule without 'match' (the module path patterns it covers)");
    if (!v[1]) return perr(pc, m->line, "rule without 'style' (known: " STYLES_KNOWN ")");
    TPS_TRY(get_str_list(pc, v[0], "match", check_pattern, &r->patterns, &r->npat));
    if (!r->npat) return perr(pc, v[0]->line, "'match' is an empty list");
    if (v[1]->type != YN_SCALAR || y_is_null(v[1]))
        return perr(pc, v[1]->line, "'style' must be a string, not %s", y_kind(v[1]));
    if (tps_style_lookup(v[1]->s, &r->style))
        return perr(pc, v[1]->line, "unknown style '%.*s' (known: " STYLES_KNOWN ")",
                    shown(v[1]->s), v[1]->s);
    if (v[2]) {
        r->when = tps_xcalloc(1, sizeof *r->when);
        if (!r->when) return nomem(pc->ctx);
        TPS_TRY(parse_cond(pc, v[2], "when", r->when));
    }
    if (v[3]) {
        TPS_TRY(get_str(pc, v[3], "heads", &r->heads));
        TPS_TRY(check_field_name(pc, v[3], "heads"));
        if (r->style == TPS_STYLE_REPLICATE || r->style == TPS_STYLE_SEQPAR)
            return perr(pc, v[3]->line, "'heads' needs a sharding style: %s replicates",
                        tps_style_name(r->style));
    }
    return TPS_OK;
}

static int has_glob(const char *s, size_t n);

/* A literal module path (untie entries name one module each, no pattern). */
static tps_err check_module_path(const pctx *pc, const ynode *it)
{
    TPS_TRY(check_pattern(pc, it));
    if (has_glob(it->s, strlen(it->s)))
        return perr(pc, it->line, "'%.*s' must name one module: no '*', '?' or '['",
                    shown(it->s), it->s);
    return TPS_OK;
}

static tps_err parse_untie(const pctx *pc, const ynode *list, tps_plan *p)
{
    static const char *const known[] = {"embedding", "head"};
    if (list->type != YN_SEQ)
        return perr(pc, list->line,
                    "'untie' must be a list of {embedding: PATH, head: PATH}, not %s",
                    y_kind(list));
    if (list->n > PLAN_MAX_RULES)
        return perr(pc, list->line, "plan has %zu untie entries, more than the limit of %d",
                    list->n, PLAN_MAX_RULES);
    size_t cnt = list->n ? list->n : 1;
    p->untie_embedding = tps_xcalloc(cnt, sizeof *p->untie_embedding);
    p->untie_head = tps_xcalloc(cnt, sizeof *p->untie_head);
    if (!p->untie_embedding || !p->untie_head) return nomem(pc->ctx);
    for (size_t i = 0; i < list->n; i++) {
        const ynode *v[2];
        p->nuntie++;
        TPS_TRY(map_fields(pc, list->kid[i], "untie entry", known, 2, v));
        if (!v[0] || !v[1])
            return perr(pc, list->kid[i]->line,
                        "untie entry needs 'embedding' (the embedding module) and 'head' (the "
                        "module of the output projection tied to it)");
        TPS_TRY(get_str(pc, v[0], "embedding", &p->untie_embedding[i]));
        TPS_TRY(check_module_path(pc, v[0]));
        TPS_TRY(get_str(pc, v[1], "head", &p->untie_head[i]));
        TPS_TRY(check_module_path(pc, v[1]));
    }
    return TPS_OK;
}

/* For a REJECT_IF check, tps_pcheck.field (unused by that kind otherwise)
 * holds the check's display name: the struct has no name member. */
static tps_err parse_check(const pctx *pc, const ynode *m, tps_pcheck *ck)
{
    static const char *const known[] = {"name", "divisible", "optional", "reason", "reject_if"};
    const ynode *v[5];
    TPS_TRY(map_fields(pc, m, "check", known, 5, v));
    ck->line = m->line;
    if (!v[1] && !v[4])
        return perr(pc, m->line, "check needs 'divisible: FIELD' or 'reject_if: CONDITION'");
    if (v[1] && v[4])
        return perr(pc, m->line, "a check is either 'divisible' or 'reject_if', not both");
    if (v[3]) TPS_TRY(get_str(pc, v[3], "reason", &ck->reason));
    if (v[1]) {
        ck->kind = TPS_PCHECK_DIVISIBLE;
        if (v[0])
            return perr(pc, v[0]->line,
                        "'name' is only for reject_if checks (a divisible check is named "
                        "'FIELD %% tp == 0')");
        TPS_TRY(get_str(pc, v[1], "divisible", &ck->field));
        if (v[2]) TPS_TRY(get_bool(pc, v[2], "optional", &ck->optional));
        return TPS_OK;
    }
    ck->kind = TPS_PCHECK_REJECT_IF;
    if (v[2]) return perr(pc, v[2]->line, "'optional' is only for divisible checks");
    TPS_TRY(parse_cond(pc, v[4], "reject_if", &ck->cond));
    if (!ck->reason)
        return perr(pc, m->line, "reject_if check without 'reason' (the message shown when it "
                                 "rejects)");
    if (v[0]) {
        TPS_TRY(get_str(pc, v[0], "name", &ck->field));
    } else {
        ck->field = tps_asprintf("reject if %s", ck->cond.field);
        if (!ck->field) return nomem(pc->ctx);
    }
    return TPS_OK;
}

static int expr_syntax(const char *expr, char *why, size_t whylen);

/* packed: [{match: PATTERN(S), sections: [{name: LEAF, rows: EXPR}, ...]}] */
static tps_err parse_packed(const pctx *pc, const ynode *v, tps_plan *p)
{
    static const char *const known[] = {"match", "sections"};
    static const char *const sknown[] = {"name", "rows"};
    if (v->type != YN_SEQ || v->n > PLAN_MAX_RULES)
        return perr(pc, v->line, "'packed' must be a list of at most %d entries", PLAN_MAX_RULES);
    p->packed = tps_xcalloc(v->n ? v->n : 1, sizeof *p->packed);
    if (!p->packed) return nomem(pc->ctx);
    for (size_t i = 0; i < v->n; i++) {
        const ynode *f[2];
        tps_packed *k = &p->packed[p->npacked++];
        k->line = v->kid[i]->line;
        TPS_TRY(map_fields(pc, v->kid[i], "packed entry", known, 2, f));
        if (!f[0] || !f[1]) return perr(pc, k->line, "a packed entry needs 'match' and 'sections'");
        TPS_TRY(get_str_list(pc, f[0], "match", check_pattern, &k->patterns, &k->npat));
        if (f[1]->type != YN_SEQ || f[1]->n < 2 || f[1]->n > 16)
            return perr(pc, f[1]->line, "'sections' must be a list of 2 to 16 sections");
        k->sec = tps_xcalloc(f[1]->n, sizeof *k->sec);
        if (!k->sec) return nomem(pc->ctx);
        for (size_t j = 0; j < f[1]->n; j++) {
            const ynode *sv[2];
            tps_section *sec = &k->sec[k->nsec++];
            TPS_TRY(map_fields(pc, f[1]->kid[j], "section", sknown, 2, sv));
            if (!sv[0] || !sv[1])
                return perr(pc, f[1]->kid[j]->line, "a section needs 'name' and 'rows'");
            TPS_TRY(get_str(pc, sv[0], "name", &sec->name));
            TPS_TRY(get_str(pc, sv[1], "rows", &sec->rows));
            /* the expression's syntax now; its fields when a config is at hand */
            char why[256];
            if (expr_syntax(sec->rows, why, sizeof why))
                return perr(pc, sv[1]->line, "section '%s': rows '%s': %s", sec->name, sec->rows, why);
        }
    }
    return TPS_OK;
}

static tps_err build_plan(const pctx *pc, const ynode *root, tps_plan *p)
{
    static const char *const known[] = {"name",   "description", "serves",
                                        "rules",  "checks",      "untie", "packed"};
    static const char *const sknown[] = {"architectures", "model_types"};
    const ynode *v[7], *sv[2];

    if (root->type != YN_MAP)
        return perr(pc, root->line, "a plan must be a mapping with 'name' and 'rules', not %s",
                    y_kind(root));
    TPS_TRY(map_fields(pc, root, "the plan", known, 7, v));
    if (v[6] && !y_is_null(v[6])) TPS_TRY(parse_packed(pc, v[6], p));
    if (!v[0]) return perr(pc, root->line, "plan without 'name'");
    if (!v[3]) return perr(pc, root->line, "plan without 'rules'");
    TPS_TRY(get_str(pc, v[0], "name", &p->name));
    TPS_TRY(check_plan_name(pc, v[0]));
    if (v[1]) TPS_TRY(get_str(pc, v[1], "description", &p->description));

    if (v[2]) {
        TPS_TRY(map_fields(pc, v[2], "serves", sknown, 2, sv));
        if (sv[0]) TPS_TRY(get_str_list(pc, sv[0], "architectures", NULL, &p->architectures,
                                        &p->narch));
        if (sv[1]) TPS_TRY(get_str_list(pc, sv[1], "model_types", NULL, &p->model_types,
                                        &p->nmt));
    }

    const ynode *rules = v[3];
    if (y_is_null(rules)) return perr(pc, rules->line, "'rules' needs a list (may be [])");
    if (rules->type != YN_SEQ)
        return perr(pc, rules->line, "'rules' must be a list of rules, not %s", y_kind(rules));
    if (rules->n > PLAN_MAX_RULES)
        return perr(pc, rules->line, "plan has %zu rules, more than the limit of %d", rules->n,
                    PLAN_MAX_RULES);
    p->rules = tps_xcalloc(rules->n ? rules->n : 1, sizeof *p->rules);
    if (!p->rules) return nomem(pc->ctx);
    for (size_t i = 0; i < rules->n; i++) {
        p->nrules++; /* counted first so a half-parsed rule is freed */
        TPS_TRY(parse_rule(pc, rules->kid[i], &p->rules[i]));
    }

    const ynode *checks = v[4];
    if (checks && !y_is_null(checks)) {
        if (checks->type != YN_SEQ)
            return perr(pc, checks->line, "'checks' must be a list of checks, not %s",
                        y_kind(checks));
        if (checks->n > PLAN_MAX_CHECKS)
            return perr(pc, checks->line, "plan has %zu checks, more than the limit of %d",
                        checks->n, PLAN_MAX_CHECKS);
        p->checks = tps_xcalloc(checks->n ? checks->n : 1, sizeof *p->checks);
        if (!p->checks) return nomem(pc->ctx);
        for (size_t i = 0; i < checks->n; i++) {
            p->nchecks++;
            TPS_TRY(parse_check(pc, checks->kid[i], &p->checks[i]));
        }
    }
    if (v[5] && !y_is_null(v[5])) TPS_TRY(parse_untie(pc, v[5], p));
    return TPS_OK;
}

/* ------------------------------------------------------------------ plan API */

static void strv_free(char **v, size_t n)
{
    if (!v) return;
    for (size_t i = 0; i < n; i++) free(v[i]);
    free(v);
}

void tps_plan_free(tps_plan *p)
{
    if (!p) return;
    for (size_t i = 0; i < p->npacked; i++) {
        strv_free(p->packed[i].patterns, p->packed[i].npat);
        for (size_t j = 0; j < p->packed[i].nsec; j++) {
            free(p->packed[i].sec[j].name);
            free(p->packed[i].sec[j].rows);
        }
        free(p->packed[i].sec);
    }
    free(p->packed);
    free(p->name);
    free(p->description);
    free(p->label);
    free(p->text);
    strv_free(p->architectures, p->narch);
    strv_free(p->model_types, p->nmt);
    for (size_t i = 0; i < p->nrules; i++) {
        strv_free(p->rules[i].patterns, p->rules[i].npat);
        if (p->rules[i].when) {
            cond_clear(p->rules[i].when);
            free(p->rules[i].when);
        }
        free(p->rules[i].heads);
    }
    strv_free(p->untie_embedding, p->nuntie);
    strv_free(p->untie_head, p->nuntie);
    free(p->rules);
    for (size_t i = 0; i < p->nchecks; i++) {
        free(p->checks[i].field);
        cond_clear(&p->checks[i].cond);
        free(p->checks[i].reason);
    }
    free(p->checks);
    free(p);
}

tps_err tps_plan_parse(tps_ctx *ctx, const char *label, const char *text, size_t len,
                       tps_plan **out)
{
    pctx pc = {ctx, label ? label : "plan"};
    ynode *root = NULL;
    tps_plan *p = NULL;
    tps_err rc = TPS_OK;

    if (!out) return tps_fail(ctx, TPS_E_ARG, "tps_plan_parse: out is NULL");
    *out = NULL;
    if (!text && len) return tps_fail(ctx, TPS_E_ARG, "tps_plan_parse: text is NULL");
    if (len > PLAN_MAX_BYTES)
        return tps_fail(ctx, TPS_E_PLAN, "%s: plan is %zu bytes, more than the limit of 1 MiB",
                        pc.label, len);
    TPS_CHECK(yaml_load(&pc, text ? text : "", len, &root));
    p = tps_xcalloc(1, sizeof *p);
    TPS_FAIL_IF(!p, ctx, TPS_E_NOMEM, "out of memory");
    p->label = tps_strdup(pc.label);
    p->text = tps_xmalloc(len + 1);
    if (p->text) {
        memcpy(p->text, text ? text : "", len);
        p->text[len] = 0;
    }
    TPS_FAIL_IF(!p->label, ctx, TPS_E_NOMEM, "out of memory");
    TPS_CHECK(build_plan(&pc, root, p));
    *out = p;
    p = NULL;
out:
    ynode_free(root);
    tps_plan_free(p);
    return rc;
}

tps_err tps_plan_load(tps_ctx *ctx, const char *path, tps_plan **out)
{
    struct stat st;
    char *buf = NULL;
    size_t len = 0;
    tps_err rc;

    if (!out) return tps_fail(ctx, TPS_E_ARG, "tps_plan_load: out is NULL");
    *out = NULL;
    if (!path) return tps_fail(ctx, TPS_E_ARG, "tps_plan_load: path is NULL");
    /* Checked here so an oversized plan gets the plan limit's message rather
     * than a generic read error. */
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode))
            return tps_fail(ctx, TPS_E_ARG, "%s: is a directory, not a plan file", path);
        if (S_ISREG(st.st_mode) && (unsigned long long)st.st_size > PLAN_MAX_BYTES)
            return tps_fail(ctx, TPS_E_PLAN, "%s: plan is %lld bytes, more than the limit of 1 MiB",
                            path, (long long)st.st_size);
    }
    TPS_TRY(tps_read_file(ctx, path, PLAN_MAX_BYTES, &buf, &len));
    rc = tps_plan_parse(ctx, path, buf, len, out);
    free(buf);
    return rc;
}

const char *tps_plan_name(const tps_plan *p)
{
    return p && p->name ? p->name : "";
}

const char *tps_plan_description(const tps_plan *p)
{
    return p && p->description ? p->description : "";
}

size_t tps_plan_builtin_count(void)
{
    return tps_builtin_plans_n;
}

const char *tps_plan_builtin_name(size_t i)
{
    return i < tps_builtin_plans_n ? tps_builtin_plans[i].name : NULL;
}

const char *tps_plan_builtin_text(size_t i, size_t *len)
{
    if (i >= tps_builtin_plans_n) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = tps_builtin_plans[i].len;
    return tps_builtin_plans[i].text;
}

/* "gemma3, gemma4, llama, qwen2, qwen3" (owned), for error messages. */
static char *families_list(void)
{
    size_t n = 1;
    for (size_t i = 0; i < tps_builtin_plans_n; i++) n += strlen(tps_builtin_plans[i].name) + 2;
    char *s = tps_xmalloc(n), *w = s;
    if (!s) return NULL;
    *w = '\0';
    for (size_t i = 0; i < tps_builtin_plans_n; i++)
        w += sprintf(w, "%s%s", i ? ", " : "", tps_builtin_plans[i].name);
    return s;
}

static tps_err builtin_parse(tps_ctx *ctx, size_t i, tps_plan **out)
{
    char *label = tps_asprintf("plans/%s.yaml", tps_builtin_plans[i].name);
    if (!label) return nomem(ctx);
    tps_err rc = tps_plan_parse(ctx, label, tps_builtin_plans[i].text, tps_builtin_plans[i].len,
                                out);
    free(label);
    return rc;
}

tps_err tps_plan_builtin(tps_ctx *ctx, const char *family, tps_plan **out)
{
    if (!out) return tps_fail(ctx, TPS_E_ARG, "tps_plan_builtin: out is NULL");
    *out = NULL;
    for (size_t i = 0; family && i < tps_builtin_plans_n; i++)
        if (!strcasecmp(tps_builtin_plans[i].name, family)) return builtin_parse(ctx, i, out);
    char *fams = families_list();
    tps_err rc = tps_fail(ctx, TPS_E_ARG, "unknown family '%.*s' (known: %s)",
                          family ? shown(family) : 6, family ? family : "(null)",
                          fams ? fams : "?");
    free(fams);
    return rc;
}

int tps_plan_serves(const tps_plan *p, const cJSON *config)
{
    const cJSON *a, *mt, *it;
    if (!p || !config) return 0;
    a = tps_config_get(config, "architectures");
    if (cJSON_IsString(a)) {
        for (size_t j = 0; j < p->narch; j++)
            if (!strcmp(p->architectures[j], a->valuestring)) return 2;
    } else if (cJSON_IsArray(a)) {
        cJSON_ArrayForEach(it, a) {
            if (!cJSON_IsString(it)) continue;
            for (size_t j = 0; j < p->narch; j++)
                if (!strcmp(p->architectures[j], it->valuestring)) return 2;
        }
    }
    mt = tps_config_get(config, "model_type");
    if (cJSON_IsString(mt))
        for (size_t j = 0; j < p->nmt; j++)
            if (!strcmp(p->model_types[j], mt->valuestring)) return 1;
    return 0;
}

/* The architectures and model_type a config names, for "no plan serves it". */
static char *config_identity(const cJSON *config)
{
    const cJSON *a = tps_config_get(config, "architectures");
    const cJSON *mt = tps_config_get(config, "model_type");
    char *as = a ? cJSON_PrintUnformatted(a) : NULL;
    char *ms = mt ? cJSON_PrintUnformatted(mt) : NULL;
    char *s = tps_asprintf("architectures %.200s, model_type %.100s", as ? as : "(none)",
                           ms ? ms : "(none)");
    cJSON_free(as);
    cJSON_free(ms);
    return s;
}

tps_err tps_plan_detect(tps_ctx *ctx, const tps_ckpt *ck, tps_plan **out)
{
    tps_plan *best = NULL;
    int best_score = 0;
    tps_err rc = TPS_OK;
    char *fams = NULL, *who = NULL;

    if (!out) return tps_fail(ctx, TPS_E_ARG, "tps_plan_detect: out is NULL");
    *out = NULL;
    if (!ck) return tps_fail(ctx, TPS_E_ARG, "tps_plan_detect: no checkpoint");
    fams = families_list();
    TPS_FAIL_IF(!fams, ctx, TPS_E_NOMEM, "out of memory");
    TPS_FAIL_IF(!ck->config, ctx, TPS_E_CONFIG,
                "%s: no config.json: pass --family NAME or --plan FILE (families: %s)",
                ck->path ? ck->path : "model", fams);
    for (size_t i = 0; i < tps_builtin_plans_n; i++) {
        tps_plan *p = NULL;
        TPS_CHECK(builtin_parse(ctx, i, &p));
        int score = tps_plan_serves(p, ck->config);
        /* Ties keep the first plan in name order, so the choice is stable. */
        if (score > best_score) {
            tps_plan_free(best);
            best = p;
            best_score = score;
        } else {
            tps_plan_free(p);
        }
    }
    if (!best) {
        who = config_identity(ck->config);
        rc = tps_fail(ctx, TPS_E_CONFIG,
                      "%s/config.json: no built-in plan serves %s (families: %s): pass --family "
                      "NAME or --plan FILE",
                      ck->dir ? ck->dir : ".", who ? who : "this model", fams);
        goto out;
    }
    *out = best;
    best = NULL;
out:
    tps_plan_free(best);
    free(fams);
    free(who);
    return rc;
}

/* ------------------------------------------------------------------ matching */

static int has_glob(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] == '*' || s[i] == '?' || s[i] == '[' || s[i] == '\\') return 1;
    return 0;
}

/* One dotted component against one pattern component, fnmatch(3) flags 0 as
 * torch's parallelize_module does. Components are not NUL-terminated, so
 * glob components are copied out (stack for the usual short names). */
static int comp_match(const char *pat, size_t plen, const char *s, size_t slen)
{
    if (!has_glob(pat, plen)) return plen == slen && !memcmp(pat, s, plen);
    char pb[128], sb[128];
    char *pp = plen < sizeof pb ? pb : malloc(plen + 1);
    char *ss = slen < sizeof sb ? sb : malloc(slen + 1);
    int r = 0;
    if (pp && ss) {
        memcpy(pp, pat, plen);
        pp[plen] = '\0';
        memcpy(ss, s, slen);
        ss[slen] = '\0';
        r = fnmatch(pp, ss, 0) == 0;
    }
    if (pp != pb) free(pp);
    if (ss != sb) free(ss);
    return r;
}

/* Same number of dotted components, each matching. */
static int path_match(const char *pat, const char *mod, size_t mlen)
{
    const char *mend = mod + mlen;
    for (;;) {
        const char *pd = strchr(pat, '.');
        const char *md = memchr(mod, '.', (size_t)(mend - mod));
        size_t pl = pd ? (size_t)(pd - pat) : strlen(pat);
        size_t ml = md ? (size_t)(md - mod) : (size_t)(mend - mod);
        if (!comp_match(pat, pl, mod, ml)) return 0;
        if (!pd || !md) return !pd && !md;
        pat = pd + 1;
        mod = md + 1;
    }
}

const tps_rule *tps_plan_match(const tps_plan *p, const char *tensor_name, const cJSON *config,
                               const char **pattern)
{
    if (pattern) *pattern = NULL;
    if (!p || !tensor_name) return NULL;
    /* Module path: the name without its final component (.weight, .bias or
     * any other parameter name). A name without a dot has no module. */
    const char *dot = strrchr(tensor_name, '.');
    if (!dot || dot == tensor_name) return NULL;
    size_t mlen = (size_t)(dot - tensor_name);
    for (size_t i = 0; i < p->nrules; i++) {
        const tps_rule *r = &p->rules[i];
        for (size_t j = 0; j < r->npat; j++) {
            if (!path_match(r->patterns[j], tensor_name, mlen)) continue;
            if (r->when && !tps_cond_eval(r->when, config)) break;
            if (pattern) *pattern = r->patterns[j];
            return r;
        }
    }
    return NULL;
}

/* ------------------------------------------------------------------ conditions */

/* Python truthiness of a config value, since config.json is written from
 * Python: null, false, 0, "", [] and {} are false. */
static int json_truthy(const cJSON *v)
{
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v)) return 0;
    if (cJSON_IsTrue(v)) return 1;
    if (cJSON_IsNumber(v)) return v->valuedouble != 0;
    if (cJSON_IsString(v)) return v->valuestring && v->valuestring[0];
    if (cJSON_IsArray(v) || cJSON_IsObject(v)) return v->child != NULL;
    return 1;
}

static int json_scalar_eq(const cJSON *a, const cJSON *b)
{
    if (!a || !b) return 0;
    if (cJSON_IsBool(a) && cJSON_IsBool(b)) return !!cJSON_IsTrue(a) == !!cJSON_IsTrue(b);
    if (cJSON_IsNumber(a) && cJSON_IsNumber(b)) return a->valuedouble == b->valuedouble;
    if (cJSON_IsString(a) && cJSON_IsString(b))
        return a->valuestring && b->valuestring && !strcmp(a->valuestring, b->valuestring);
    return 0;
}

int tps_cond_eval(const tps_cond *c, const cJSON *config)
{
    if (!c) return 1;
    const cJSON *v = config && c->field ? tps_config_get(config, c->field) : NULL;
    if (!v) v = c->dflt;
    switch (c->op) {
    case TPS_COND_TRUTHY: return json_truthy(v);
    case TPS_COND_FALSY: return !json_truthy(v);
    case TPS_COND_EQUALS: return json_scalar_eq(v, c->value);
    case TPS_COND_NOT_EQUALS: return !json_scalar_eq(v, c->value);
    }
    return 0;
}

/* ------------------------------------------------------------------ checks */

void tps_check_outcomes_free(tps_check_outcome *o, size_t n)
{
    if (!o) return;
    for (size_t i = 0; i < n; i++) {
        free(o[i].name);
        free(o[i].detail);
    }
    free(o);
}

/* Owned compact JSON text of v, cut to 100 bytes. */
static char *json_show(const cJSON *v)
{
    char *j = cJSON_PrintUnformatted(v);
    char *s = j ? tps_asprintf("%.100s%s", j, strlen(j) > 100 ? "..." : "") : NULL;
    cJSON_free(j);
    return s;
}

/* "1, 2, 4": the divisors of n up to 64, the tp values a count n allows. */
static void divisors(unsigned long long n, char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = '\0';
    for (unsigned long long k = 1; k <= 64 && k <= n && off < len; k++)
        if (n % k == 0) off += (size_t)snprintf(buf + off, len - off, "%s%llu", off ? ", " : "", k);
}

static unsigned long long gcd(unsigned long long a, unsigned long long b)
{
    while (b) {
        unsigned long long t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static char *divisible_detail(const tps_pcheck *c, const cJSON *v, int tp, int *ok)
{
    double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
    /* 2^53: every integer below it is exact in a double. */
    if (!cJSON_IsNumber(v) || d != floor(d) || d < 0 || d > 9007199254740992.0) {
        char *shown_v = json_show(v);
        char *s = tps_asprintf("%s = %s is not a count (a non-negative integer)", c->field,
                               shown_v ? shown_v : "?");
        free(shown_v);
        *ok = 0;
        return s;
    }
    unsigned long long n = (unsigned long long)d;
    if (n == 0) {
        /* Optional counts such as num_global_key_value_heads are 0 when unused. */
        *ok = c->optional ? -1 : 0;
        return c->optional ? tps_asprintf("%s = 0: not used", c->field)
                           : tps_asprintf("%s = 0 is not a usable count", c->field);
    }
    if (n % (unsigned long long)tp == 0) {
        *ok = 1;
        return tps_asprintf("%s = %llu: %llu per rank at tp %d", c->field, n,
                            n / (unsigned long long)tp, tp);
    }
    char works[400];
    divisors(n, works, sizeof works);
    *ok = 0;
    return tps_asprintf("%s = %llu is not divisible by tp %d (tp values that work: %s)%s%s",
                        c->field, n, tp, works, c->reason ? ": " : "", c->reason ? c->reason : "");
}

/* A layer's value of a count field: 1 a count (*n), 0 absent, -1 not a count. */
static int layer_count(const tps_layers *ly, int i, const char *field, unsigned long long *n,
                       const char **from, const cJSON **raw)
{
    const cJSON *v = tps_layers_get(ly, i, field, from);
    *raw = v;
    if (!v) return 0;
    double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
    if (!cJSON_IsNumber(v) || d != floor(d) || d < 0 || d > 9007199254740992.0) return -1;
    *n = (unsigned long long)d;
    return 1;
}

static int same_from(const char *a, const char *b) { return a == b || (a && b && !strcmp(a, b)); }

/* " (per_layer_config)", " (from num_global_key_value_heads)" or "". */
static const char *from_note(const char *from, char *buf, size_t len)
{
    if (!from) return "";
    snprintf(buf, len, !strcmp(from, "per_layer_config") ? " (%s)" : " (from %s)", from);
    return buf;
}

/* "1, 3, 5 and 4 more": the layers after `first` (and it too, with self) whose
 * value and origin equal layer first's. Returns how many it lists. */
static int same_layers(const tps_layers *ly, const char *field, int first, int self, char *buf,
                       size_t len)
{
    unsigned long long n0 = 0, n;
    const char *f0, *f;
    const cJSON *raw;
    int k0 = layer_count(ly, first, field, &n0, &f0, &raw), count = self, more = 0;
    size_t off = self ? (size_t)snprintf(buf, len, "%d", first) : 0;
    if (!self) buf[0] = '\0';
    for (int i = first + 1; i < ly->n; i++) {
        if (layer_count(ly, i, field, &n, &f, &raw) != k0 || (k0 == 1 && n != n0) ||
            !same_from(f, f0))
            continue;
        if (count++ < 8 && off < len)
            off += (size_t)snprintf(buf + off, len - off, "%s%d", off ? ", " : "", i);
        else
            more++;
    }
    if (more && off < len) snprintf(buf + off, len - off, " and %d more", more);
    return count;
}

/* The divisible check of a count that differs between layers: every layer's
 * own value must divide by tp, and a failure names the layer. */
static char *per_layer_detail(const tps_pcheck *c, const tps_layers *ly, int tp, int *ok)
{
    unsigned long long n, g = 0;
    const char *from;
    const cJSON *raw;
    char fb[64], works[400], list[160];
    int bad = -1, kind = 0, any = 0;
    for (int i = 0; i < ly->n; i++) {
        int k = layer_count(ly, i, c->field, &n, &from, &raw);
        if (k == 0 || (k == 1 && n == 0 && c->optional)) continue;
        any = 1;
        if (k == 1 && n) g = gcd(g, n);
        if (bad < 0 && (k < 0 || n == 0 || n % (unsigned long long)tp)) {
            bad = i;
            kind = k < 0 ? -1 : n == 0 ? 0 : 1;
        }
    }
    if (!any) {
        *ok = -1;
        return tps_strdup(c->optional ? "not set" : "not in config.json");
    }
    if (bad >= 0) {
        const char *t = tps_layers_type(ly, bad);
        char tb[96] = "";
        if (t) snprintf(tb, sizeof tb, " (%.80s)", t);
        layer_count(ly, bad, c->field, &n, &from, &raw);
        int also = same_layers(ly, c->field, bad, 0, list, sizeof list);
        char ab[200] = "";
        if (also) snprintf(ab, sizeof ab, "the same on layer%s %s; ", also > 1 ? "s" : "", list);
        *ok = 0;
        if (kind < 0) {
            char *j = json_show(raw);
            char *s = tps_asprintf("layer %d%s: %s = %s%s is not a count (a non-negative integer)",
                                   bad, tb, c->field, j ? j : "?", from_note(from, fb, sizeof fb));
            free(j);
            return s;
        }
        if (kind == 0)
            return tps_asprintf("layer %d%s: %s = 0%s is not a usable count", bad, tb, c->field,
                                from_note(from, fb, sizeof fb));
        divisors(g, works, sizeof works);
        return tps_asprintf("layer %d%s: %s = %llu%s is not divisible by tp %d (%stp values that "
                            "work for every layer: %s)%s%s",
                            bad, tb, c->field, n, from_note(from, fb, sizeof fb), tp, ab, works,
                            c->reason ? ": " : "", c->reason ? c->reason : "");
    }
    /* Passed: each distinct value once (up to 4), with the layers that have it. */
    char out[900];
    size_t off = (size_t)snprintf(out, sizeof out, "%s =", c->field);
    unsigned long long gv[4];
    const char *gf[4];
    int groups = 0;
    for (int i = 0; i < ly->n && off < sizeof out; i++) {
        int k = layer_count(ly, i, c->field, &n, &from, &raw), seen = 0;
        if (k != 1 || (n == 0 && c->optional)) continue;
        for (int j = 0; j < groups && !seen; j++) seen = gv[j] == n && same_from(gf[j], from);
        if (seen) continue;
        if (groups == 4) {
            off += (size_t)snprintf(out + off, sizeof out - off, "; ...");
            break;
        }
        gv[groups] = n;
        gf[groups++] = from;
        int cnt = same_layers(ly, c->field, i, 1, list, sizeof list);
        off += (size_t)snprintf(out + off, sizeof out - off, "%s %llu on layer%s %s%s",
                                groups > 1 ? ";" : "", n, cnt > 1 ? "s" : "", list,
                                from_note(from, fb, sizeof fb));
    }
    *ok = 1;
    return tps_asprintf("%s: divisible by tp %d on every layer", out, tp);
}

static char *reject_detail(const tps_pcheck *c, const cJSON *config, int tp, int *ok)
{
    if (tp == 1) {
        *ok = 1;
        return tps_strdup("tp 1: nothing is sharded");
    }
    if (tps_cond_eval(&c->cond, config)) {
        *ok = 0;
        return tps_strdup(c->reason ? c->reason : "rejected by the plan");
    }
    *ok = 1;
    const cJSON *v = tps_config_get(config, c->cond.field);
    char *shown_v = v ? json_show(v) : c->cond.dflt ? json_show(c->cond.dflt) : NULL;
    char *s = v ? tps_asprintf("%s = %s", c->cond.field, shown_v ? shown_v : "?")
              : shown_v ? tps_asprintf("%s not set (taken as %s)", c->cond.field, shown_v)
                        : tps_asprintf("%s not set", c->cond.field);
    free(shown_v);
    return s;
}

tps_err tps_plan_run_checks(tps_ctx *ctx, const tps_plan *p, const cJSON *config, int tp,
                            tps_check_outcome **out, size_t *n)
{
    tps_check_outcome *o = NULL;
    size_t k = 0;
    tps_err rc = TPS_OK;
    tps_layers ly = {0};

    if (!out || !n) return tps_fail(ctx, TPS_E_ARG, "tps_plan_run_checks: out is NULL");
    *out = NULL;
    *n = 0;
    if (!p) return tps_fail(ctx, TPS_E_ARG, "tps_plan_run_checks: no plan");
    if (tp < 1) return tps_fail(ctx, TPS_E_ARG, "tp must be at least 1, not %d", tp);
    if (!p->nchecks) return TPS_OK;
    TPS_TRY(tps_layers_open(ctx, config, "config.json", &ly));
    o = tps_xcalloc(p->nchecks, sizeof *o);
    TPS_FAIL_IF(!o, ctx, TPS_E_NOMEM, "out of memory");
    for (; k < p->nchecks; k++) {
        const tps_pcheck *c = &p->checks[k];
        tps_check_outcome *r = &o[k];
        r->name = c->kind == TPS_PCHECK_DIVISIBLE ? tps_asprintf("%s %% tp == 0", c->field)
                                                  : tps_strdup(c->field);
        if (!config) {
            r->ok = -1;
            r->detail = tps_strdup("no config.json: check skipped");
        } else if (c->kind == TPS_PCHECK_DIVISIBLE && ly.n > 0 && tps_layers_vary(&ly, c->field)) {
            r->detail = per_layer_detail(c, &ly, tp, &r->ok);
        } else if (c->kind == TPS_PCHECK_DIVISIBLE) {
            const cJSON *v = tps_config_get(config, c->field);
            if (!v) {
                r->ok = -1;
                r->detail = tps_strdup(c->optional ? "not set" : "not in config.json");
            } else {
                r->detail = divisible_detail(c, v, tp, &r->ok);
            }
        } else {
            r->detail = reject_detail(c, config, tp, &r->ok);
        }
        TPS_FAIL_IF(!r->name || !r->detail, ctx, TPS_E_NOMEM, "out of memory");
    }
    *out = o;
    *n = k;
    o = NULL;
out:
    tps_check_outcomes_free(o, o ? k + 1 : 0);
    tps_layers_close(&ly);
    return rc;
}

/* ------------------------------------------------------------------ layout files */

int tps_module_match(const char *pattern, const char *module, size_t mlen)
{
    return path_match(pattern, module, mlen);
}

#define LSPEC_MAX_FUSE 256
#define LSPEC_MAX_PARTS 16

static const struct {
    const char *name;
    tps_split_kind split;
} split_names[] = {
    {"replicate", TPS_SPLIT_REPLICATE},
    {"rows", TPS_SPLIT_ROWS},
    {"columns", TPS_SPLIT_COLUMNS},
    {"vocab", TPS_SPLIT_VOCAB},
};
#define SPLITS_KNOWN "replicate, rows, columns, vocab"

/* A leaf module name: one component, no pattern characters. */
static tps_err check_leaf(const pctx *pc, const ynode *it)
{
    const char *s = it->s;
    if (!s[0] || strchr(s, '.') || has_glob(s, strlen(s)))
        return perr(pc, it->line, "'%.*s' must be one module name (no '.', no pattern)", shown(s),
                    s);
    return TPS_OK;
}

static tps_err parse_lrule(const pctx *pc, const ynode *m, tps_lrule *r)
{
    static const char *const known[] = {"match", "split", "when", "param", "refuse"};
    const ynode *v[5];
    TPS_TRY(map_fields(pc, m, "override", known, 5, v));
    r->line = m->line;
    if (!v[0] || (!v[1] == !v[4]))
        return perr(pc, m->line, "an override needs 'match' and one of 'split' or 'refuse'");
    TPS_TRY(get_str_list(pc, v[0], "match", check_pattern, &r->patterns, &r->npat));
    if (!r->npat) return perr(pc, v[0]->line, "'match' is an empty list");
    if (v[3]) TPS_TRY(get_str(pc, v[3], "param", &r->param));
    if (v[2]) {
        r->when = tps_xcalloc(1, sizeof *r->when);
        if (!r->when) return nomem(pc->ctx);
        TPS_TRY(parse_cond(pc, v[2], "when", r->when));
    }
    if (v[4]) {
        TPS_TRY(get_str(pc, v[4], "refuse", &r->refuse));
        return TPS_OK;
    }
    size_t k;
    for (k = 0; k < sizeof split_names / sizeof split_names[0]; k++)
        if (v[1]->type == YN_SCALAR && !strcmp(v[1]->s, split_names[k].name)) break;
    if (k == sizeof split_names / sizeof split_names[0])
        return perr(pc, v[1]->line, "unknown split '%.*s' (known: " SPLITS_KNOWN ")",
                    v[1]->type == YN_SCALAR ? shown(v[1]->s) : 1,
                    v[1]->type == YN_SCALAR ? v[1]->s : "?");
    r->split = split_names[k].split;
    return TPS_OK;
}

static tps_err parse_ldrop(const pctx *pc, const ynode *m, tps_ldrop *d)
{
    static const char *const known[] = {"contains", "model_types", "reason"};
    const ynode *v[3];
    TPS_TRY(map_fields(pc, m, "drop entry", known, 3, v));
    d->line = m->line;
    if (!v[0] || !v[2])
        return perr(pc, m->line, "a drop entry needs 'contains' (parts of the names the engine's "
                                 "load_weights skips) and 'reason'");
    TPS_TRY(get_str_list(pc, v[0], "contains", NULL, &d->contains, &d->ncontains));
    for (size_t i = 0; i < d->ncontains; i++)
        if (!d->contains[i][0]) return perr(pc, v[0]->line, "'contains' holds an empty string");
    if (!d->ncontains) return perr(pc, v[0]->line, "'contains' is an empty list");
    if (v[1]) TPS_TRY(get_str_list(pc, v[1], "model_types", NULL, &d->model_types, &d->nmt));
    return get_str(pc, v[2], "reason", &d->reason);
}

static tps_err parse_lkey(const pctx *pc, const ynode *m, tps_lkey *k)
{
    static const char *const known[] = {"match", "param", "model_types", "when"};
    const ynode *v[4];
    TPS_TRY(map_fields(pc, m, "keys entry", known, 4, v));
    k->line = m->line;
    if (!v[0]) return perr(pc, m->line, "a keys entry needs 'match' (module path patterns)");
    TPS_TRY(get_str_list(pc, v[0], "match", check_pattern, &k->patterns, &k->npat));
    if (!k->npat) return perr(pc, v[0]->line, "'match' is an empty list");
    if (v[1]) TPS_TRY(get_str_list(pc, v[1], "param", check_leaf, &k->params, &k->nparams));
    else {
        k->params = tps_xcalloc(1, sizeof *k->params);
        if (!k->params || !(k->params[0] = tps_strdup("weight"))) return nomem(pc->ctx);
        k->nparams = 1;
    }
    if (v[2]) TPS_TRY(get_str_list(pc, v[2], "model_types", NULL, &k->model_types, &k->nmt));
    if (v[3]) {
        k->when = tps_xcalloc(1, sizeof *k->when);
        if (!k->when) return nomem(pc->ctx);
        TPS_TRY(parse_cond(pc, v[3], "when", k->when));
    }
    return TPS_OK;
}

static tps_err parse_lcheck(const pctx *pc, const ynode *m, tps_lcheck *c)
{
    static const char *const known[] = {"name", "when", "reject_if", "quotient", "reason"};
    static const char *const qknown[] = {"field", "of"};
    const ynode *v[5], *qv[2];
    TPS_TRY(map_fields(pc, m, "layout check", known, 5, v));
    c->line = m->line;
    if (!v[0] || !v[4] || (!v[2] == !v[3]))
        return perr(pc, m->line,
                    "a layout check needs 'name', 'reason' and one of 'reject_if' or 'quotient'");
    TPS_TRY(get_str(pc, v[0], "name", &c->name));
    TPS_TRY(get_str(pc, v[4], "reason", &c->reason));
    if (v[1]) {
        c->when = tps_xcalloc(1, sizeof *c->when);
        if (!c->when) return nomem(pc->ctx);
        TPS_TRY(parse_cond(pc, v[1], "when", c->when));
    }
    if (v[2]) return parse_cond(pc, v[2], "reject_if", &c->cond);
    c->is_quotient = 1;
    TPS_TRY(map_fields(pc, v[3], "quotient", qknown, 2, qv));
    if (!qv[0] || !qv[1] || qv[1]->type != YN_SEQ || qv[1]->n != 2 ||
        qv[1]->kid[0]->type != YN_SCALAR || qv[1]->kid[1]->type != YN_SCALAR)
        return perr(pc, v[3]->line, "'quotient' needs field and of: [NUMERATOR, DENOMINATOR]");
    TPS_TRY(get_str(pc, qv[0], "field", &c->field));
    TPS_TRY(get_str(pc, qv[1]->kid[0], "of", &c->num));
    TPS_TRY(get_str(pc, qv[1]->kid[1], "of", &c->den));
    return TPS_OK;
}

/* A fuse entry's bias entry: {model_types, when, unless}, each optional. */
static tps_err parse_lbias(const pctx *pc, const ynode *m, tps_lbias *b)
{
    static const char *const known[] = {"model_types", "when", "unless"};
    const ynode *v[3];
    TPS_TRY(map_fields(pc, m, "bias entry", known, 3, v));
    b->line = m->line;
    if (v[0]) TPS_TRY(get_str_list(pc, v[0], "model_types", NULL, &b->model_types, &b->nmt));
    for (int k = 1; k <= 2; k++) {
        if (!v[k]) continue;
        tps_cond **c = k == 1 ? &b->when : &b->unless;
        if (!(*c = tps_xcalloc(1, sizeof **c))) return nomem(pc->ctx);
        TPS_TRY(parse_cond(pc, v[k], known[k], *c));
    }
    return TPS_OK;
}

static tps_err parse_lfuse(const pctx *pc, const ynode *m, tps_lfuse *f)
{
    static const char *const known[] = {"into", "parts", "extra", "bias"};
    static const char *const pknown[] = {"module", "heads", "replicate", "rows"};
    static const char *const eknown[] = {"name", "dtype", "value", "shape", "quant", "when",
                                         "unless"};
    const ynode *v[4];
    TPS_TRY(map_fields(pc, m, "fuse entry", known, 4, v));
    f->line = m->line;
    if (!v[0] || !v[1]) return perr(pc, m->line, "a fuse entry needs 'into' and 'parts'");
    TPS_TRY(get_str(pc, v[0], "into", &f->into));
    TPS_TRY(check_leaf(pc, v[0]));
    if (v[1]->type != YN_SEQ || v[1]->n < 2 || v[1]->n > LSPEC_MAX_PARTS)
        return perr(pc, v[1]->line, "'parts' must be a list of 2 to %d parts", LSPEC_MAX_PARTS);
    f->parts = tps_xcalloc(v[1]->n, sizeof *f->parts);
    if (!f->parts) return nomem(pc->ctx);
    for (size_t i = 0; i < v[1]->n; i++) {
        const ynode *pv[4];
        tps_lpart *p = &f->parts[f->nparts++];
        TPS_TRY(map_fields(pc, v[1]->kid[i], "part", pknown, 4, pv));
        if (pv[3]) TPS_TRY(get_str(pc, pv[3], "rows", &p->rows));
        if (!pv[0]) return perr(pc, v[1]->kid[i]->line, "a part needs 'module'");
        TPS_TRY(get_str(pc, pv[0], "module", &p->module));
        TPS_TRY(check_leaf(pc, pv[0]));
        if (pv[1]) TPS_TRY(get_str(pc, pv[1], "heads", &p->heads));
        if (pv[2]) TPS_TRY(get_bool(pc, pv[2], "replicate", &p->replicate));
        if (p->replicate && !p->heads)
            return perr(pc, pv[2]->line, "'replicate' replicates whole heads: it needs 'heads'");
        for (size_t j = 0; j + 1 < f->nparts; j++)
            if (!strcmp(f->parts[j].module, p->module))
                return perr(pc, pv[0]->line, "part '%s' is listed twice", p->module);
    }
    if (v[2] && !y_is_null(v[2])) {
        if (v[2]->type != YN_SEQ || v[2]->n > 64)
            return perr(pc, v[2]->line, "'extra' must be a list of at most 64 tensors");
        f->extra = tps_xcalloc(v[2]->n ? v[2]->n : 1, sizeof *f->extra);
        if (!f->extra) return nomem(pc->ctx);
        for (size_t i = 0; i < v[2]->n; i++) {
            const ynode *ev[7];
            tps_lextra *e = &f->extra[f->nextra++];
            TPS_TRY(map_fields(pc, v[2]->kid[i], "extra tensor", eknown, 7, ev));
            if (!ev[0] || !ev[1] || !ev[2])
                return perr(pc, v[2]->kid[i]->line, "an extra tensor needs name, dtype and value");
            TPS_TRY(get_str(pc, ev[0], "name", &e->name));
            TPS_TRY(check_pattern(pc, ev[0]));
            if (has_glob(e->name, strlen(e->name)))
                return perr(pc, ev[0]->line, "extra tensor name '%.*s' is a pattern",
                            shown(e->name), e->name);
            if (ev[1]->type == YN_SCALAR && !strcmp(ev[1]->s, "model"))
                e->model_dtype = 1;
            else if (ev[1]->type != YN_SCALAR || tps_dtype_from_name(ev[1]->s, &e->dtype) ||
                     (e->dtype != TPS_F32 && e->dtype != TPS_F16 && e->dtype != TPS_BF16))
                return perr(pc, ev[1]->line, "extra tensor dtype must be F32, F16, BF16 or model");
            if (y_number(ev[2], &e->value))
                return perr(pc, ev[2]->line, "extra tensor value must be a number");
            if (ev[3]) {
                double d;
                if (ev[3]->type != YN_SEQ || ev[3]->n > 1 ||
                    (ev[3]->n == 1 && (y_number(ev[3]->kid[0], &d) || d < 1 || d > 1024 ||
                                       d != floor(d))))
                    return perr(pc, ev[3]->line,
                                "extra tensor shape must be [] or [n], n from 1 to 1024");
                e->ndim = (int)ev[3]->n;
                e->len = e->ndim ? (uint64_t)d : 0;
            }
            if (ev[4]) TPS_TRY(get_str(pc, ev[4], "quant", &e->quant));
            if (ev[5]) {
                e->when = tps_xcalloc(1, sizeof *e->when);
                if (!e->when) return nomem(pc->ctx);
                TPS_TRY(parse_cond(pc, ev[5], "when", e->when));
            }
            if (ev[6]) {
                e->unless = tps_xcalloc(1, sizeof *e->unless);
                if (!e->unless) return nomem(pc->ctx);
                TPS_TRY(parse_cond(pc, ev[6], "unless", e->unless));
            }
        }
    }
    if (v[3]) { /* when the engine's fused module has a bias ([]: never) */
        if (v[3]->type != YN_SEQ || v[3]->n > 64)
            return perr(pc, v[3]->line, "'bias' must be a list of at most 64 entries ([]: the "
                                        "engine's module never has a bias)");
        f->has_bias = 1;
        f->bias = tps_xcalloc(v[3]->n ? v[3]->n : 1, sizeof *f->bias);
        if (!f->bias) return nomem(pc->ctx);
        for (size_t i = 0; i < v[3]->n; i++) {
            f->nbias++;
            TPS_TRY(parse_lbias(pc, v[3]->kid[i], &f->bias[i]));
        }
    }
    return TPS_OK;
}

static tps_err parse_lexperts(const pctx *pc, const ynode *m, tps_lexperts *x)
{
    static const char *const known[] = {"match", "count", "rows", "into", "router", "stacks"};
    static const char *const rknown[] = {"module", "as"};
    static const char *const sknown[] = {"name", "parts", "split"};
    const ynode *v[6], *rv[2];
    TPS_TRY(map_fields(pc, m, "experts entry", known, 6, v));
    x->line = m->line;
    if (!v[0] || !v[1] || !v[5])
        return perr(pc, m->line, "an experts entry needs 'match', 'count' and 'stacks'");
    TPS_TRY(get_str_list(pc, v[0], "match", check_pattern, &x->patterns, &x->npat));
    TPS_TRY(get_str(pc, v[1], "count", &x->count));
    TPS_TRY(check_field_name(pc, v[1], "count"));
    if (v[2]) {
        TPS_TRY(get_str(pc, v[2], "rows", &x->rows));
        TPS_TRY(check_field_name(pc, v[2], "rows"));
    }
    if (v[3]) {
        TPS_TRY(get_str(pc, v[3], "into", &x->into));
        TPS_TRY(check_leaf(pc, v[3]));
    }
    if (v[4]) {
        TPS_TRY(map_fields(pc, v[4], "router", rknown, 2, rv));
        if (!rv[0] || !rv[1]) return perr(pc, v[4]->line, "'router' needs 'module' and 'as'");
        TPS_TRY(get_str(pc, rv[0], "module", &x->router));
        TPS_TRY(check_leaf(pc, rv[0]));
        TPS_TRY(get_str(pc, rv[1], "as", &x->router_as));
        TPS_TRY(check_pattern(pc, rv[1]));
        if (has_glob(x->router_as, strlen(x->router_as)))
            return perr(pc, rv[1]->line, "router 'as' is a module path, not a pattern");
    }
    if (v[5]->type != YN_SEQ || v[5]->n < 1 || v[5]->n > 4)
        return perr(pc, v[5]->line, "'stacks' must be a list of 1 to 4 stacks");
    x->stacks = tps_xcalloc(v[5]->n, sizeof *x->stacks);
    if (!x->stacks) return nomem(pc->ctx);
    for (size_t i = 0; i < v[5]->n; i++) {
        const ynode *sv[3];
        tps_lstack *st = &x->stacks[x->nstacks++];
        TPS_TRY(map_fields(pc, v[5]->kid[i], "stack", sknown, 3, sv));
        if (!sv[0] || !sv[1] || !sv[2])
            return perr(pc, v[5]->kid[i]->line, "a stack needs 'name', 'parts' and 'split'");
        TPS_TRY(get_str(pc, sv[0], "name", &st->name));
        TPS_TRY(check_leaf(pc, sv[0]));
        TPS_TRY(get_str_list(pc, sv[1], "parts", NULL, &st->parts, &st->nparts));
        if (st->nparts < 1 || st->nparts > 4)
            return perr(pc, sv[1]->line, "a stack has 1 to 4 parts");
        if (sv[2]->type == YN_SCALAR && !strcmp(sv[2]->s, "rows")) st->dim = 0;
        else if (sv[2]->type == YN_SCALAR && !strcmp(sv[2]->s, "columns")) st->dim = 1;
        else return perr(pc, sv[2]->line, "a stack's 'split' is rows or columns");
        if (st->dim == 1 && st->nparts != 1)
            return perr(pc, sv[1]->line, "a stack split by columns has one part");
        for (size_t j = 0; j < i; j++)
            if (!strcmp(x->stacks[j].name, st->name))
                return perr(pc, sv[0]->line, "stack '%s' is listed twice", st->name);
    }
    return TPS_OK;
}

static tps_err build_lspec(const pctx *pc, const ynode *root, tps_lspec *s)
{
    static const char *const known[] = {"name",  "target", "description", "serves", "split",
                                        "vocab_padding", "vocab", "tied", "overrides", "fuse",
                                        "vocab_padding_tp", "checks", "scales", "experts",
                                        "drop", "keys"};
    static const char *const qknown[] = {"dtype", "per_tensor_shape", "refuse", "reason"};
    static const char *const sknown[] = {"architectures", "model_types"};
    static const char *const tknown[] = {"head", "embedding", "default_for"};
    enum { K_NAME, K_TARGET, K_DESC, K_SERVES, K_SPLIT, K_PAD, K_VOCAB, K_TIED, K_OVR, K_FUSE,
           K_PADTP, K_CHECKS, K_SCALES, K_EXPERTS, K_DROP, K_KEYS, K_N };
    const ynode *v[K_N], *sv[2], *tv[3], *qv[4];
    if (root->type != YN_MAP)
        return perr(pc, root->line, "a layout must be a mapping with 'name' and 'target', not %s",
                    y_kind(root));
    TPS_TRY(map_fields(pc, root, "the layout", known, K_N, v));
    if (!v[K_NAME]) return perr(pc, root->line, "layout without 'name'");
    if (!v[K_TARGET])
        return perr(pc, root->line, "layout without 'target' (the engine and version it writes for)");
    TPS_TRY(get_str(pc, v[K_NAME], "name", &s->name));
    TPS_TRY(check_plan_name(pc, v[K_NAME]));
    if (!strcmp(s->name, "dtensor"))
        return perr(pc, v[K_NAME]->line, "'dtensor' is the plan's own layout: choose another name");
    TPS_TRY(get_str(pc, v[K_TARGET], "target", &s->target));
    if (v[K_DESC]) TPS_TRY(get_str(pc, v[K_DESC], "description", &s->description));
    if (v[K_SERVES]) {
        TPS_TRY(map_fields(pc, v[K_SERVES], "serves", sknown, 2, sv));
        if (sv[0]) TPS_TRY(get_str_list(pc, sv[0], "architectures", NULL, &s->architectures, &s->narch));
        if (sv[1]) TPS_TRY(get_str_list(pc, sv[1], "model_types", NULL, &s->model_types, &s->nmt));
    }
    s->exact = 1;
    if (v[K_SPLIT]) {
        if (v[K_SPLIT]->type == YN_SCALAR && !strcmp(v[K_SPLIT]->s, "exact")) s->exact = 1;
        else if (v[K_SPLIT]->type == YN_SCALAR && !strcmp(v[K_SPLIT]->s, "chunk")) s->exact = 0;
        else return perr(pc, v[K_SPLIT]->line, "'split' is exact or chunk");
    }
    if (v[K_PAD]) {
        double d;
        if (y_number(v[K_PAD], &d) || d < 1 || d > 1048576 || d != floor(d))
            return perr(pc, v[K_PAD]->line, "'vocab_padding' must be a whole number from 1 to 1048576");
        s->vocab_pad = (uint64_t)d;
    }
    if (v[K_PADTP]) TPS_TRY(get_bool(pc, v[K_PADTP], "vocab_padding_tp", &s->vocab_pad_tp));
    if (v[K_VOCAB]) TPS_TRY(get_str_list(pc, v[K_VOCAB], "vocab", check_pattern, &s->vocab, &s->nvocab));
    if (v[K_CHECKS] && !y_is_null(v[K_CHECKS])) {
        if (v[K_CHECKS]->type != YN_SEQ || v[K_CHECKS]->n > PLAN_MAX_CHECKS)
            return perr(pc, v[K_CHECKS]->line, "'checks' must be a list of at most %d checks",
                        PLAN_MAX_CHECKS);
        s->checks = tps_xcalloc(v[K_CHECKS]->n ? v[K_CHECKS]->n : 1, sizeof *s->checks);
        if (!s->checks) return nomem(pc->ctx);
        for (size_t i = 0; i < v[K_CHECKS]->n; i++) {
            s->nchecks++;
            TPS_TRY(parse_lcheck(pc, v[K_CHECKS]->kid[i], &s->checks[i]));
        }
    }
    if (v[K_DROP] && !y_is_null(v[K_DROP])) {
        if (v[K_DROP]->type != YN_SEQ || v[K_DROP]->n > PLAN_MAX_RULES)
            return perr(pc, v[K_DROP]->line, "'drop' must be a list of at most %d entries",
                        PLAN_MAX_RULES);
        s->drops = tps_xcalloc(v[K_DROP]->n ? v[K_DROP]->n : 1, sizeof *s->drops);
        if (!s->drops) return nomem(pc->ctx);
        for (size_t i = 0; i < v[K_DROP]->n; i++) {
            s->ndrops++;
            TPS_TRY(parse_ldrop(pc, v[K_DROP]->kid[i], &s->drops[i]));
        }
    }
    if (v[K_KEYS]) {
        s->has_keys = 1;
        if (!y_is_null(v[K_KEYS]) && (v[K_KEYS]->type != YN_SEQ || v[K_KEYS]->n > PLAN_MAX_RULES))
            return perr(pc, v[K_KEYS]->line, "'keys' must be a list of at most %d entries",
                        PLAN_MAX_RULES);
        size_t n = y_is_null(v[K_KEYS]) ? 0 : v[K_KEYS]->n;
        s->keys = tps_xcalloc(n ? n : 1, sizeof *s->keys);
        if (!s->keys) return nomem(pc->ctx);
        for (size_t i = 0; i < n; i++) {
            s->nkeys++;
            TPS_TRY(parse_lkey(pc, v[K_KEYS]->kid[i], &s->keys[i]));
        }
    }
    if (v[K_EXPERTS] && !y_is_null(v[K_EXPERTS])) {
        if (v[K_EXPERTS]->type != YN_SEQ || v[K_EXPERTS]->n > 16)
            return perr(pc, v[K_EXPERTS]->line, "'experts' must be a list of at most 16 entries");
        s->experts = tps_xcalloc(v[K_EXPERTS]->n ? v[K_EXPERTS]->n : 1, sizeof *s->experts);
        if (!s->experts) return nomem(pc->ctx);
        for (size_t i = 0; i < v[K_EXPERTS]->n; i++) {
            s->nexperts++;
            TPS_TRY(parse_lexperts(pc, v[K_EXPERTS]->kid[i], &s->experts[i]));
        }
    }
    if (v[K_SCALES]) {
        TPS_TRY(map_fields(pc, v[K_SCALES], "scales", qknown, 4, qv));
        if (qv[0]) {
            if (qv[0]->type != YN_SCALAR || strcmp(qv[0]->s, "F32"))
                return perr(pc, qv[0]->line, "scales: dtype is F32 (or absent: as stored)");
            s->scale_f32 = 1;
        }
        if (qv[1]) {
            double d;
            if (qv[1]->type != YN_SEQ || qv[1]->n != 1 || y_number(qv[1]->kid[0], &d) || d != 1)
                return perr(pc, qv[1]->line, "scales: per_tensor_shape is [1] (or absent: as stored)");
            s->scalar_as_1 = 1;
        }
        if (qv[2]) {
            char **kinds = NULL;
            size_t nk = 0;
            TPS_TRY(get_str_list(pc, qv[2], "refuse", NULL, &kinds, &nk));
            tps_err rc = TPS_OK;
            for (size_t i = 0; i < nk; i++) {
                int k = TPS_QS_KINDS;
                while (k-- > 0 && strcmp(kinds[i], tps_qscale_names[k])) {}
                if (k >= 0) s->refuse_scales |= 1u << k;
                else if (!rc) rc = perr(pc, qv[2]->line, "scales: refuse lists tensor, channel or block");
            }
            strv_free(kinds, nk);
            TPS_TRY(rc);
            if (!qv[3]) return perr(pc, qv[2]->line, "scales: refuse needs a 'reason'");
            TPS_TRY(get_str(pc, qv[3], "reason", &s->refuse_scales_reason));
        }
    }
    if (v[K_TIED]) {
        TPS_TRY(map_fields(pc, v[K_TIED], "tied", tknown, 3, tv));
        if (tv[2]) TPS_TRY(get_str_list(pc, tv[2], "default_for", NULL, &s->tied_default,
                                        &s->ntied_default));
        if (!tv[0] || !tv[1]) return perr(pc, v[K_TIED]->line, "'tied' needs head and embedding");
        TPS_TRY(get_str(pc, tv[0], "head", &s->tied_head));
        TPS_TRY(check_pattern(pc, tv[0]));
        TPS_TRY(get_str(pc, tv[1], "embedding", &s->tied_embedding));
        TPS_TRY(check_pattern(pc, tv[1]));
    }
    if (v[K_OVR] && !y_is_null(v[K_OVR])) {
        if (v[K_OVR]->type != YN_SEQ || v[K_OVR]->n > PLAN_MAX_RULES)
            return perr(pc, v[K_OVR]->line, "'overrides' must be a list of at most %d entries",
                        PLAN_MAX_RULES);
        s->rules = tps_xcalloc(v[K_OVR]->n ? v[K_OVR]->n : 1, sizeof *s->rules);
        if (!s->rules) return nomem(pc->ctx);
        for (size_t i = 0; i < v[K_OVR]->n; i++) {
            s->nrules++;
            TPS_TRY(parse_lrule(pc, v[K_OVR]->kid[i], &s->rules[i]));
        }
    }
    if (v[K_FUSE] && !y_is_null(v[K_FUSE])) {
        if (v[K_FUSE]->type != YN_SEQ || v[K_FUSE]->n > LSPEC_MAX_FUSE)
            return perr(pc, v[K_FUSE]->line, "'fuse' must be a list of at most %d entries",
                        LSPEC_MAX_FUSE);
        s->fuse = tps_xcalloc(v[K_FUSE]->n ? v[K_FUSE]->n : 1, sizeof *s->fuse);
        if (!s->fuse) return nomem(pc->ctx);
        for (size_t i = 0; i < v[K_FUSE]->n; i++) {
            s->nfuse++;
            TPS_TRY(parse_lfuse(pc, v[K_FUSE]->kid[i], &s->fuse[i]));
            /* a module is a part of one fusion at most */
            for (size_t j = 0; j < i; j++)
                for (size_t a = 0; a < s->fuse[i].nparts; a++)
                    for (size_t b = 0; b < s->fuse[j].nparts; b++)
                        if (!strcmp(s->fuse[i].parts[a].module, s->fuse[j].parts[b].module))
                            return perr(pc, s->fuse[i].line, "module '%s' is already fused at line %d",
                                        s->fuse[i].parts[a].module, s->fuse[j].line);
        }
    }
    return TPS_OK;
}

void tps_lspec_free(tps_lspec *s)
{
    if (!s) return;
    free(s->name);
    free(s->target);
    free(s->description);
    free(s->label);
    free(s->text);
    strv_free(s->architectures, s->narch);
    strv_free(s->model_types, s->nmt);
    strv_free(s->vocab, s->nvocab);
    free(s->tied_head);
    free(s->tied_embedding);
    free(s->refuse_scales_reason);
    for (size_t i = 0; i < s->ndrops; i++) {
        strv_free(s->drops[i].contains, s->drops[i].ncontains);
        strv_free(s->drops[i].model_types, s->drops[i].nmt);
        free(s->drops[i].reason);
    }
    free(s->drops);
    for (size_t i = 0; i < s->nkeys; i++) {
        tps_lkey *k = &s->keys[i];
        strv_free(k->patterns, k->npat);
        strv_free(k->params, k->nparams);
        strv_free(k->model_types, k->nmt);
        if (k->when) {
            cond_clear(k->when);
            free(k->when);
        }
    }
    free(s->keys);
    for (size_t i = 0; i < s->nexperts; i++) {
        tps_lexperts *x = &s->experts[i];
        strv_free(x->patterns, x->npat);
        free(x->count);
        free(x->rows);
        free(x->into);
        free(x->router);
        free(x->router_as);
        for (size_t j = 0; j < x->nstacks; j++) {
            free(x->stacks[j].name);
            strv_free(x->stacks[j].parts, x->stacks[j].nparts);
        }
        free(x->stacks);
    }
    free(s->experts);
    strv_free(s->tied_default, s->ntied_default);
    for (size_t i = 0; i < s->nchecks; i++) {
        tps_lcheck *c = &s->checks[i];
        free(c->name);
        free(c->reason);
        if (c->when) {
            cond_clear(c->when);
            free(c->when);
        }
        cond_clear(&c->cond);
        free(c->field);
        free(c->num);
        free(c->den);
    }
    free(s->checks);
    for (size_t i = 0; i < s->nrules; i++) {
        free(s->rules[i].param);
        free(s->rules[i].refuse);
        strv_free(s->rules[i].patterns, s->rules[i].npat);
        if (s->rules[i].when) {
            cond_clear(s->rules[i].when);
            free(s->rules[i].when);
        }
    }
    free(s->rules);
    for (size_t i = 0; i < s->nfuse; i++) {
        tps_lfuse *f = &s->fuse[i];
        free(f->into);
        for (size_t j = 0; j < f->nparts; j++) {
            free(f->parts[j].module);
            free(f->parts[j].heads);
            free(f->parts[j].rows);
        }
        free(f->parts);
        for (size_t j = 0; j < f->nextra; j++) {
            free(f->extra[j].name);
            free(f->extra[j].quant);
            if (f->extra[j].when) cond_clear(f->extra[j].when);
            if (f->extra[j].unless) cond_clear(f->extra[j].unless);
            free(f->extra[j].when);
            free(f->extra[j].unless);
        }
        free(f->extra);
        for (size_t j = 0; j < f->nbias; j++) {
            strv_free(f->bias[j].model_types, f->bias[j].nmt);
            if (f->bias[j].when) cond_clear(f->bias[j].when);
            if (f->bias[j].unless) cond_clear(f->bias[j].unless);
            free(f->bias[j].when);
            free(f->bias[j].unless);
        }
        free(f->bias);
    }
    free(s->fuse);
    free(s);
}

tps_err tps_lspec_parse(tps_ctx *ctx, const char *label, const char *text, size_t len,
                        tps_lspec **out)
{
    pctx pc = {ctx, label ? label : "layout"};
    ynode *root = NULL;
    tps_lspec *s = NULL;
    tps_err rc = TPS_OK;
    *out = NULL;
    if (len > PLAN_MAX_BYTES)
        return tps_fail(ctx, TPS_E_PLAN, "%s: layout is %zu bytes, more than the limit of 1 MiB",
                        pc.label, len);
    TPS_CHECK(yaml_load(&pc, text ? text : "", len, &root));
    s = tps_xcalloc(1, sizeof *s);
    TPS_FAIL_IF(!s, ctx, TPS_E_NOMEM, "out of memory");
    s->label = tps_strdup(pc.label);
    s->text = tps_xmalloc(len + 1);
    TPS_FAIL_IF(!s->label || !s->text, ctx, TPS_E_NOMEM, "out of memory");
    memcpy(s->text, text ? text : "", len);
    s->text[len] = 0;
    s->text_len = len;
    TPS_CHECK(build_lspec(&pc, root, s));
    *out = s;
    s = NULL;
out:
    ynode_free(root);
    tps_lspec_free(s);
    return rc;
}

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
static int expr_syntax(const char *expr, char *why, size_t whylen)
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

const tps_packed *tps_plan_packed(const tps_plan *p, const char *tensor_name)
{
    const char *dot = p ? strrchr(tensor_name, '.') : NULL;
    if (!dot) return NULL;
    size_t ml = (size_t)(dot - tensor_name);
    for (size_t i = 0; i < p->npacked; i++)
        for (size_t j = 0; j < p->packed[i].npat; j++)
            if (path_match(p->packed[i].patterns[j], tensor_name, ml)) return &p->packed[i];
    return NULL;
}
