/* plan_yaml.c - reading a plan: its YAML text through libyaml into a small
 * node tree, and the tree into the tps_plan rules (styles, conditions as
 * parsed, checks, untie entries, packed sections). Also the schema helpers
 * the layout reader (lspec.c) shares: parse errors, scalar typing, keyed
 * mappings, strings and lists, patterns and names. The format is documented
 * in man/tpshard-plan.5.
 *
 * Parsing is two passes: libyaml's event stream is turned into a small node
 * tree (bounded in depth and size), then the tree is walked against the plan
 * schema. Going through a tree keeps every schema error on one code path that
 * knows the line of the offending node, and the walk stays linear in the
 * number of rules (no per-key search over large mappings). */
#include "plan_int.h"

#include <stdlib.h>
#include <string.h>
#include <yaml.h>

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

tps_err tps_pl_perr(const pctx *pc, int line, const char *fmt, ...)
{
    char buf[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return tps_fail(pc->ctx, TPS_E_PLAN, "%s:%d: %s", pc->label, line, buf);
}

tps_err tps_pl_nomem(tps_ctx *ctx)
{
    return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
}

/* Length to print of a user string in a message, so a 1 MiB scalar does not
 * flood the error. */
int tps_pl_shown(const char *s)
{
    size_t n = strnlen(s, SHOW + 1);
    return (int)(n > SHOW ? SHOW : n);
}

/* ------------------------------------------------------------------ YAML tree */

void tps_pl_ynode_free(ynode *y)
{
    if (!y) return;
    /* Depth is bounded by PLAN_MAX_DEPTH, so recursion is safe. */
    for (size_t i = 0; i < y->n; i++) tps_pl_ynode_free(y->kid[i]);
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
    if (tag) return tps_pl_perr(pc, line, "YAML tags (%s) are not supported in plans",
                                (const char *)tag);
    if (!is_scalar && b->depth == PLAN_MAX_DEPTH)
        return tps_pl_perr(pc, line, "plan nests deeper than %d levels", PLAN_MAX_DEPTH);
    if (++b->nodes > PLAN_MAX_NODES)
        return tps_pl_perr(pc, line, "plan has more than %d YAML nodes", PLAN_MAX_NODES);

    ynode *y = tps_xcalloc(1, sizeof *y);
    if (!y) return tps_pl_nomem(pc->ctx);
    y->line = line;
    if (is_scalar) {
        size_t len = ev->data.scalar.length;
        y->type = YN_SCALAR;
        y->plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
        y->s = tps_xmalloc(len + 1);
        if (!y->s) {
            free(y);
            return tps_pl_nomem(pc->ctx);
        }
        memcpy(y->s, ev->data.scalar.value, len);
        y->s[len] = '\0';
        if (memchr(y->s, '\0', len)) {
            tps_pl_ynode_free(y);
            return tps_pl_perr(pc, line, "string holds a NUL character");
        }
    } else {
        y->type = ev->type == YAML_SEQUENCE_START_EVENT ? YN_SEQ : YN_MAP;
    }
    if (b->depth == 0) {
        b->root = y; /* one document, so exactly one root */
    } else if (ynode_add(b->stack[b->depth - 1], y)) {
        tps_pl_ynode_free(y);
        return tps_pl_nomem(pc->ctx);
    }
    if (!is_scalar) b->stack[b->depth++] = y;
    return TPS_OK;
}

tps_err tps_pl_yaml_load(const pctx *pc, const char *text, size_t len, ynode **out)
{
    yaml_parser_t ps;
    yaml_event_t ev;
    ybuild b;
    int ndocs = 0, done = 0;
    tps_err rc = TPS_OK;

    memset(&b, 0, sizeof b);
    *out = NULL;
    if (!yaml_parser_initialize(&ps)) return tps_pl_nomem(pc->ctx);
    yaml_parser_set_input_string(&ps, (const unsigned char *)text, len);
    while (!done) {
        if (!yaml_parser_parse(&ps, &ev)) {
            if (ps.error == YAML_MEMORY_ERROR) {
                rc = tps_pl_nomem(pc->ctx);
            } else if (ps.context) {
                rc = tps_pl_perr(pc, (int)ps.problem_mark.line + 1, "bad YAML: %s (%s at line %d)",
                                 ps.problem ? ps.problem : "syntax error", ps.context,
                                 (int)ps.context_mark.line + 1);
            } else {
                rc = tps_pl_perr(pc, (int)ps.problem_mark.line + 1, "bad YAML: %s",
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
                rc = tps_pl_perr(pc, line, "more than one YAML document (a plan is one document)");
            break;
        case YAML_ALIAS_EVENT:
            /* Aliases are how YAML bombs multiply; plans have no use for them. */
            rc = tps_pl_perr(pc, line, "YAML aliases (*%s) are not supported in plans",
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
        rc = tps_pl_perr(pc, 1, "empty plan (expected a mapping with 'name' and 'rules')");
        goto out;
    }
    *out = b.root;
    b.root = NULL;
out:
    tps_pl_ynode_free(b.root);
    yaml_parser_delete(&ps);
    return rc;
}

/* ------------------------------------------------------------------ scalars */

int tps_pl_y_is_null(const ynode *y)
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
int tps_pl_y_number(const ynode *y, double *d)
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

const char *tps_pl_y_kind(const ynode *y)
{
    int b;
    double d;
    if (y->type == YN_SEQ) return "a list";
    if (y->type == YN_MAP) return "a mapping";
    if (tps_pl_y_is_null(y)) return "empty";
    if (!y_bool(y, &b)) return "a boolean";
    if (!tps_pl_y_number(y, &d)) return "a number";
    return "a string";
}

/* ------------------------------------------------------------------ schema helpers */

/* Splits mapping m into the values of its known keys (vals[i] for known[i],
 * NULL when absent); unknown and duplicate keys are errors. Linear in the
 * mapping's size. */
tps_err tps_pl_map_fields(const pctx *pc, const ynode *m, const char *what,
                          const char *const *known, size_t nk, const ynode **vals)
{
    for (size_t j = 0; j < nk; j++) vals[j] = NULL;
    if (m->type != YN_MAP)
        return tps_pl_perr(pc, m->line, "%s must be a mapping, not %s", what, tps_pl_y_kind(m));
    for (size_t i = 0; i + 1 < m->n; i += 2) {
        const ynode *k = m->kid[i];
        size_t j;
        if (k->type != YN_SCALAR)
            return tps_pl_perr(pc, k->line, "%s: a key must be a plain word, not %s", what,
                               tps_pl_y_kind(k));
        for (j = 0; j < nk; j++)
            if (!strcmp(known[j], k->s)) break;
        if (j == nk) {
            char list[256];
            size_t off = 0;
            list[0] = '\0';
            for (size_t x = 0; x < nk && off < sizeof list; x++)
                off += (size_t)snprintf(list + off, sizeof list - off, "%s%s", x ? ", " : "",
                                        known[x]);
            return tps_pl_perr(pc, k->line, "unknown key '%.*s' in %s (known: %s)",
                               tps_pl_shown(k->s), k->s, what, list);
        }
        if (vals[j]) return tps_pl_perr(pc, k->line, "duplicate key '%s' in %s", known[j], what);
        vals[j] = m->kid[i + 1];
    }
    return TPS_OK;
}

/* Any non-empty scalar reads as a string (YAML would type `name: 3` as a
 * number; a plan author means the text). */
tps_err tps_pl_get_str(const pctx *pc, const ynode *v, const char *key, char **out)
{
    if (v->type != YN_SCALAR)
        return tps_pl_perr(pc, v->line, "'%s' must be a string, not %s", key, tps_pl_y_kind(v));
    if (tps_pl_y_is_null(v) || !v->s[0]) return tps_pl_perr(pc, v->line, "'%s' needs a value", key);
    *out = tps_strdup(v->s);
    return *out ? TPS_OK : tps_pl_nomem(pc->ctx);
}

tps_err tps_pl_get_bool(const pctx *pc, const ynode *v, const char *key, int *out)
{
    if (y_bool(v, out))
        return tps_pl_perr(pc, v->line, "'%s' must be true or false, not %s", key,
                           tps_pl_y_kind(v));
    return TPS_OK;
}

/* A string or a list of strings, e.g. `match: a.b` or `match: [a.b, c.d]`. */
tps_err tps_pl_get_str_list(const pctx *pc, const ynode *v, const char *key, item_check chk,
                            char ***out, size_t *n)
{
    const ynode *const *items;
    size_t cnt;
    if (v->type == YN_MAP)
        return tps_pl_perr(pc, v->line, "'%s' must be a string or a list of strings, not a mapping",
                           key);
    if (v->type == YN_SCALAR) {
        items = (const ynode *const *)&v;
        cnt = 1;
    } else {
        items = (const ynode *const *)v->kid;
        cnt = v->n;
    }
    *out = tps_xcalloc(cnt ? cnt : 1, sizeof **out);
    if (!*out) return tps_pl_nomem(pc->ctx);
    for (size_t i = 0; i < cnt; i++) {
        const ynode *it = items[i];
        if (it->type != YN_SCALAR)
            return tps_pl_perr(pc, it->line, "'%s' items must be strings, not %s", key,
                               tps_pl_y_kind(it));
        TPS_TRY(tps_pl_get_str(pc, it, key, &(*out)[i]));
        (*n)++;
        if (chk) TPS_TRY(chk(pc, it));
    }
    return TPS_OK;
}

void tps_pl_strv_free(char **v, size_t n)
{
    if (!v) return;
    for (size_t i = 0; i < n; i++) free(v[i]);
    free(v);
}

tps_err tps_pl_check_pattern(const pctx *pc, const ynode *it)
{
    const char *s = it->s;
    size_t n = strlen(s);
    if (s[0] == '.' || s[n - 1] == '.' || strstr(s, ".."))
        return tps_pl_perr(pc, it->line, "pattern '%.*s' has an empty dotted component",
                           tps_pl_shown(s), s);
    for (const char *c = s; *c; c++)
        if (*c == ' ' || *c == '\t' || *c == '\n' || *c == '\r')
            return tps_pl_perr(pc, it->line, "pattern '%.*s' contains white space", tps_pl_shown(s),
                               s);
    /* Patterns name modules; a parameter suffix would never match and would
     * silently leave the tensor replicated. */
    if ((n > 7 && !strcmp(s + n - 7, ".weight")) || (n > 5 && !strcmp(s + n - 5, ".bias")))
        return tps_pl_perr(pc, it->line,
                           "pattern '%.*s' names a parameter: patterns are module paths, without the "
                           "final .weight or .bias",
                           tps_pl_shown(s), s);
    return TPS_OK;
}

tps_err tps_pl_check_plan_name(const pctx *pc, const ynode *it)
{
    const char *s = it->s;
    if (strlen(s) > PLAN_MAX_NAME)
        return tps_pl_perr(pc, it->line, "plan name is longer than %d characters", PLAN_MAX_NAME);
    for (const char *c = s; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '_' || *c == '-' || *c == '.'))
            return tps_pl_perr(pc, it->line,
                               "plan name '%.*s' may only hold letters, digits, '_', '-' and '.'",
                               tps_pl_shown(s), s);
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
        return tps_pl_perr(pc, v->line, "'%s' must be true, false, a number or a string, not %s",
                           key, tps_pl_y_kind(v));
    if (tps_pl_y_is_null(v)) {
        if (allow_null) return TPS_OK;
        return tps_pl_perr(pc, v->line, "'%s' needs a value (true, false, a number or a string)",
                           key);
    }
    if (!y_bool(v, &b))
        *out = cJSON_CreateBool(b);
    else if (!tps_pl_y_number(v, &d))
        *out = cJSON_CreateNumber(d);
    else
        *out = cJSON_CreateString(v->s);
    return *out ? TPS_OK : tps_pl_nomem(pc->ctx);
}

void tps_pl_cond_clear(tps_cond *c)
{
    free(c->field);
    cJSON_Delete(c->value);
    cJSON_Delete(c->dflt);
    memset(c, 0, sizeof *c);
}

tps_err tps_pl_parse_cond(const pctx *pc, const ynode *m, const char *what, tps_cond *c)
{
    static const char *const known[] = {"field", "truthy", "falsy", "equals", "default",
                                        "not_equals"};
    const ynode *v[6];
    int b, nops;
    TPS_TRY(tps_pl_map_fields(pc, m, what, known, 6, v));
    if (!v[0])
        return tps_pl_perr(pc, m->line, "%s without 'field' (the config.json field it tests)",
                           what);
    TPS_TRY(tps_pl_get_str(pc, v[0], "field", &c->field));
    nops = !!v[1] + !!v[2] + !!v[3] + !!v[5];
    if (nops == 0)
        return tps_pl_perr(pc, m->line, "%s needs one of truthy, falsy, equals or not_equals",
                           what);
    if (nops > 1)
        return tps_pl_perr(pc, m->line, "%s takes only one of truthy, falsy, equals or not_equals",
                           what);
    if (v[5]) {
        c->op = TPS_COND_NOT_EQUALS;
        TPS_TRY(get_json_scalar(pc, v[5], "not_equals", 0, &c->value));
    } else
    if (v[1]) {
        TPS_TRY(tps_pl_get_bool(pc, v[1], "truthy", &b));
        c->op = b ? TPS_COND_TRUTHY : TPS_COND_FALSY;
    } else if (v[2]) {
        TPS_TRY(tps_pl_get_bool(pc, v[2], "falsy", &b));
        c->op = b ? TPS_COND_FALSY : TPS_COND_TRUTHY;
    } else {
        c->op = TPS_COND_EQUALS;
        TPS_TRY(get_json_scalar(pc, v[3], "equals", 0, &c->value));
    }
    if (v[4]) TPS_TRY(get_json_scalar(pc, v[4], "default", 1, &c->dflt));
    return TPS_OK;
}

tps_err tps_pl_check_field_name(const pctx *pc, const ynode *it, const char *key)
{
    for (const char *c = it->s; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '_'))
            return tps_pl_perr(pc, it->line, "'%s: %.*s' is not a config.json field name", key,
                               tps_pl_shown(it->s), it->s);
    return TPS_OK;
}

static tps_err parse_rule(const pctx *pc, const ynode *m, tps_rule *r)
{
    static const char *const known[] = {"match", "style", "when", "heads"};
    const ynode *v[4];
    TPS_TRY(tps_pl_map_fields(pc, m, "rule", known, 4, v));
    r->line = m->line;
    if (!v[0])
        return tps_pl_perr(pc, m->line,
                           "rule without 'match' (the module path patterns it covers)");
    if (!v[1]) return tps_pl_perr(pc, m->line, "rule without 'style' (known: " STYLES_KNOWN ")");
    TPS_TRY(tps_pl_get_str_list(pc, v[0], "match", tps_pl_check_pattern, &r->patterns, &r->npat));
    if (!r->npat) return tps_pl_perr(pc, v[0]->line, "'match' is an empty list");
    if (v[1]->type != YN_SCALAR || tps_pl_y_is_null(v[1]))
        return tps_pl_perr(pc, v[1]->line, "'style' must be a string, not %s", tps_pl_y_kind(v[1]));
    if (tps_style_lookup(v[1]->s, &r->style))
        return tps_pl_perr(pc, v[1]->line, "unknown style '%.*s' (known: " STYLES_KNOWN ")",
                           tps_pl_shown(v[1]->s), v[1]->s);
    if (v[2]) {
        r->when = tps_xcalloc(1, sizeof *r->when);
        if (!r->when) return tps_pl_nomem(pc->ctx);
        TPS_TRY(tps_pl_parse_cond(pc, v[2], "when", r->when));
    }
    if (v[3]) {
        TPS_TRY(tps_pl_get_str(pc, v[3], "heads", &r->heads));
        TPS_TRY(tps_pl_check_field_name(pc, v[3], "heads"));
        if (r->style == TPS_STYLE_REPLICATE || r->style == TPS_STYLE_SEQPAR)
            return tps_pl_perr(pc, v[3]->line, "'heads' needs a sharding style: %s replicates",
                               tps_style_name(r->style));
    }
    return TPS_OK;
}

/* A literal module path (untie entries name one module each, no pattern). */
static tps_err check_module_path(const pctx *pc, const ynode *it)
{
    TPS_TRY(tps_pl_check_pattern(pc, it));
    if (tps_pl_has_glob(it->s, strlen(it->s)))
        return tps_pl_perr(pc, it->line, "'%.*s' must name one module: no '*', '?' or '['",
                           tps_pl_shown(it->s), it->s);
    return TPS_OK;
}

static tps_err parse_untie(const pctx *pc, const ynode *list, tps_plan *p)
{
    static const char *const known[] = {"embedding", "head"};
    if (list->type != YN_SEQ)
        return tps_pl_perr(pc, list->line,
                           "'untie' must be a list of {embedding: PATH, head: PATH}, not %s",
                           tps_pl_y_kind(list));
    if (list->n > PLAN_MAX_RULES)
        return tps_pl_perr(pc, list->line, "plan has %zu untie entries, more than the limit of %d",
                           list->n, PLAN_MAX_RULES);
    size_t cnt = list->n ? list->n : 1;
    p->untie_embedding = tps_xcalloc(cnt, sizeof *p->untie_embedding);
    p->untie_head = tps_xcalloc(cnt, sizeof *p->untie_head);
    if (!p->untie_embedding || !p->untie_head) return tps_pl_nomem(pc->ctx);
    for (size_t i = 0; i < list->n; i++) {
        const ynode *v[2];
        p->nuntie++;
        TPS_TRY(tps_pl_map_fields(pc, list->kid[i], "untie entry", known, 2, v));
        if (!v[0] || !v[1])
            return tps_pl_perr(pc, list->kid[i]->line,
                               "untie entry needs 'embedding' (the embedding module) and 'head' (the "
                               "module of the output projection tied to it)");
        TPS_TRY(tps_pl_get_str(pc, v[0], "embedding", &p->untie_embedding[i]));
        TPS_TRY(check_module_path(pc, v[0]));
        TPS_TRY(tps_pl_get_str(pc, v[1], "head", &p->untie_head[i]));
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
    TPS_TRY(tps_pl_map_fields(pc, m, "check", known, 5, v));
    ck->line = m->line;
    if (!v[1] && !v[4])
        return tps_pl_perr(pc, m->line, "check needs 'divisible: FIELD' or 'reject_if: CONDITION'");
    if (v[1] && v[4])
        return tps_pl_perr(pc, m->line, "a check is either 'divisible' or 'reject_if', not both");
    if (v[3]) TPS_TRY(tps_pl_get_str(pc, v[3], "reason", &ck->reason));
    if (v[1]) {
        ck->kind = TPS_PCHECK_DIVISIBLE;
        if (v[0])
            return tps_pl_perr(pc, v[0]->line,
                               "'name' is only for reject_if checks (a divisible check is named "
                               "'FIELD %% tp == 0')");
        TPS_TRY(tps_pl_get_str(pc, v[1], "divisible", &ck->field));
        if (v[2]) TPS_TRY(tps_pl_get_bool(pc, v[2], "optional", &ck->optional));
        return TPS_OK;
    }
    ck->kind = TPS_PCHECK_REJECT_IF;
    if (v[2]) return tps_pl_perr(pc, v[2]->line, "'optional' is only for divisible checks");
    TPS_TRY(tps_pl_parse_cond(pc, v[4], "reject_if", &ck->cond));
    if (!ck->reason)
        return tps_pl_perr(pc, m->line,
                           "reject_if check without 'reason' (the message shown when it "
                                 "rejects)");
    if (v[0]) {
        TPS_TRY(tps_pl_get_str(pc, v[0], "name", &ck->field));
    } else {
        ck->field = tps_asprintf("reject if %s", ck->cond.field);
        if (!ck->field) return tps_pl_nomem(pc->ctx);
    }
    return TPS_OK;
}

/* packed: [{match: PATTERN(S), sections: [{name: LEAF, rows: EXPR}, ...]}] */
static tps_err parse_packed(const pctx *pc, const ynode *v, tps_plan *p)
{
    static const char *const known[] = {"match", "sections"};
    static const char *const sknown[] = {"name", "rows"};
    if (v->type != YN_SEQ || v->n > PLAN_MAX_RULES)
        return tps_pl_perr(pc, v->line, "'packed' must be a list of at most %d entries",
                           PLAN_MAX_RULES);
    p->packed = tps_xcalloc(v->n ? v->n : 1, sizeof *p->packed);
    if (!p->packed) return tps_pl_nomem(pc->ctx);
    for (size_t i = 0; i < v->n; i++) {
        const ynode *f[2];
        tps_packed *k = &p->packed[p->npacked++];
        k->line = v->kid[i]->line;
        TPS_TRY(tps_pl_map_fields(pc, v->kid[i], "packed entry", known, 2, f));
        if (!f[0] || !f[1]) return tps_pl_perr(pc, k->line,
                                               "a packed entry needs 'match' and 'sections'");
        TPS_TRY(tps_pl_get_str_list(pc, f[0], "match", tps_pl_check_pattern, &k->patterns,
                                    &k->npat));
        if (f[1]->type != YN_SEQ || f[1]->n < 2 || f[1]->n > 16)
            return tps_pl_perr(pc, f[1]->line, "'sections' must be a list of 2 to 16 sections");
        k->sec = tps_xcalloc(f[1]->n, sizeof *k->sec);
        if (!k->sec) return tps_pl_nomem(pc->ctx);
        for (size_t j = 0; j < f[1]->n; j++) {
            const ynode *sv[2];
            tps_section *sec = &k->sec[k->nsec++];
            TPS_TRY(tps_pl_map_fields(pc, f[1]->kid[j], "section", sknown, 2, sv));
            if (!sv[0] || !sv[1])
                return tps_pl_perr(pc, f[1]->kid[j]->line, "a section needs 'name' and 'rows'");
            TPS_TRY(tps_pl_get_str(pc, sv[0], "name", &sec->name));
            TPS_TRY(tps_pl_get_str(pc, sv[1], "rows", &sec->rows));
            /* the expression's syntax now; its fields when a config is at hand */
            char why[256];
            if (tps_pl_expr_syntax(sec->rows, why, sizeof why))
                return tps_pl_perr(pc, sv[1]->line, "section '%s': rows '%s': %s", sec->name,
                                   sec->rows, why);
        }
    }
    return TPS_OK;
}

/* shapes: [{match: PATTERN(S), rows: EXPR, cols: EXPR}] (one of rows, cols at least) */
static tps_err parse_shapes(const pctx *pc, const ynode *v, tps_plan *p)
{
    static const char *const known[] = {"match", "rows", "cols"};
    if (v->type != YN_SEQ || v->n > PLAN_MAX_RULES)
        return tps_pl_perr(pc, v->line, "'shapes' must be a list of at most %d entries",
                           PLAN_MAX_RULES);
    p->shapes = tps_xcalloc(v->n ? v->n : 1, sizeof *p->shapes);
    if (!p->shapes) return tps_pl_nomem(pc->ctx);
    for (size_t i = 0; i < v->n; i++) {
        const ynode *f[3];
        tps_shape *k = &p->shapes[p->nshapes++];
        k->line = v->kid[i]->line;
        TPS_TRY(tps_pl_map_fields(pc, v->kid[i], "shapes entry", known, 3, f));
        if (!f[0] || (!f[1] && !f[2]))
            return tps_pl_perr(pc, k->line, "a shapes entry needs 'match' and 'rows' or 'cols'");
        TPS_TRY(tps_pl_get_str_list(pc, f[0], "match", tps_pl_check_pattern, &k->patterns,
                                    &k->npat));
        char why[256];
        if (f[1]) {
            TPS_TRY(tps_pl_get_str(pc, f[1], "rows", &k->rows));
            if (tps_pl_expr_syntax(k->rows, why, sizeof why))
                return tps_pl_perr(pc, f[1]->line, "shapes: rows '%s': %s", k->rows, why);
        }
        if (f[2]) {
            TPS_TRY(tps_pl_get_str(pc, f[2], "cols", &k->cols));
            if (tps_pl_expr_syntax(k->cols, why, sizeof why))
                return tps_pl_perr(pc, f[2]->line, "shapes: cols '%s': %s", k->cols, why);
        }
    }
    return TPS_OK;
}

static tps_err build_plan(const pctx *pc, const ynode *root, tps_plan *p)
{
    static const char *const known[] = {"name",   "description", "serves",
                                        "rules",  "checks",      "untie", "packed",
                                        "shapes", "layers"};
    static const char *const sknown[] = {"architectures", "model_types"};
    const ynode *v[9], *sv[2];

    if (root->type != YN_MAP)
        return tps_pl_perr(pc, root->line,
                           "a plan must be a mapping with 'name' and 'rules', not %s",
                           tps_pl_y_kind(root));
    TPS_TRY(tps_pl_map_fields(pc, root, "the plan", known, 9, v));
    if (v[6] && !tps_pl_y_is_null(v[6])) TPS_TRY(parse_packed(pc, v[6], p));
    if (v[7] && !tps_pl_y_is_null(v[7])) TPS_TRY(parse_shapes(pc, v[7], p));
    if (v[8] && !tps_pl_y_is_null(v[8]))
        TPS_TRY(tps_pl_get_str_list(pc, v[8], "layers", NULL, &p->layers, &p->nlayers));
    if (!v[0]) return tps_pl_perr(pc, root->line, "plan without 'name'");
    if (!v[3]) return tps_pl_perr(pc, root->line, "plan without 'rules'");
    TPS_TRY(tps_pl_get_str(pc, v[0], "name", &p->name));
    TPS_TRY(tps_pl_check_plan_name(pc, v[0]));
    if (v[1]) TPS_TRY(tps_pl_get_str(pc, v[1], "description", &p->description));

    if (v[2]) {
        TPS_TRY(tps_pl_map_fields(pc, v[2], "serves", sknown, 2, sv));
        if (sv[0]) TPS_TRY(tps_pl_get_str_list(pc, sv[0], "architectures", NULL, &p->architectures,
                                               &p->narch));
        if (sv[1]) TPS_TRY(tps_pl_get_str_list(pc, sv[1], "model_types", NULL, &p->model_types,
                                               &p->nmt));
    }

    const ynode *rules = v[3];
    if (tps_pl_y_is_null(rules)) return tps_pl_perr(pc, rules->line,
                                                    "'rules' needs a list (may be [])");
    if (rules->type != YN_SEQ)
        return tps_pl_perr(pc, rules->line, "'rules' must be a list of rules, not %s",
                           tps_pl_y_kind(rules));
    if (rules->n > PLAN_MAX_RULES)
        return tps_pl_perr(pc, rules->line, "plan has %zu rules, more than the limit of %d",
                           rules->n, PLAN_MAX_RULES);
    p->rules = tps_xcalloc(rules->n ? rules->n : 1, sizeof *p->rules);
    if (!p->rules) return tps_pl_nomem(pc->ctx);
    for (size_t i = 0; i < rules->n; i++) {
        p->nrules++; /* counted first so a half-parsed rule is freed */
        TPS_TRY(parse_rule(pc, rules->kid[i], &p->rules[i]));
    }

    const ynode *checks = v[4];
    if (checks && !tps_pl_y_is_null(checks)) {
        if (checks->type != YN_SEQ)
            return tps_pl_perr(pc, checks->line, "'checks' must be a list of checks, not %s",
                               tps_pl_y_kind(checks));
        if (checks->n > PLAN_MAX_CHECKS)
            return tps_pl_perr(pc, checks->line, "plan has %zu checks, more than the limit of %d",
                               checks->n, PLAN_MAX_CHECKS);
        p->checks = tps_xcalloc(checks->n ? checks->n : 1, sizeof *p->checks);
        if (!p->checks) return tps_pl_nomem(pc->ctx);
        for (size_t i = 0; i < checks->n; i++) {
            p->nchecks++;
            TPS_TRY(parse_check(pc, checks->kid[i], &p->checks[i]));
        }
    }
    if (v[5] && !tps_pl_y_is_null(v[5])) TPS_TRY(parse_untie(pc, v[5], p));
    return TPS_OK;
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
    TPS_CHECK(tps_pl_yaml_load(&pc, text ? text : "", len, &root));
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
    tps_pl_ynode_free(root);
    tps_plan_free(p);
    return rc;
}
