/* lspec.c - reading a layout file (plans/layouts/NAME.yaml, how an engine's
 * rank files differ from the plan's DTensor shards) into a tps_lspec:
 * overrides, fuse and experts entries, drops, keys, renames, checks,
 * scales, tied and vocabulary settings (tps_lspec_parse, tps_lspec_free). The YAML tree
 * and schema helpers are plan_yaml.c's. */
#include "plan_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
    if (!s[0] || strchr(s, '.') || tps_pl_has_glob(s, strlen(s)))
        return tps_pl_perr(pc, it->line, "'%.*s' must be one module name (no '.', no pattern)",
                           tps_pl_shown(s), s);
    return TPS_OK;
}

static tps_err parse_lrule(const pctx *pc, const ynode *m, tps_lrule *r)
{
    static const char *const known[] = {"match", "split", "when", "param", "refuse"};
    const ynode *v[5];
    TPS_TRY(tps_pl_map_fields(pc, m, "override", known, 5, v));
    r->line = m->line;
    if (!v[0] || (!v[1] == !v[4]))
        return tps_pl_perr(pc, m->line, "an override needs 'match' and one of 'split' or 'refuse'");
    TPS_TRY(tps_pl_get_str_list(pc, v[0], "match", tps_pl_check_pattern, &r->patterns, &r->npat));
    if (!r->npat) return tps_pl_perr(pc, v[0]->line, "'match' is an empty list");
    if (v[3]) TPS_TRY(tps_pl_get_str(pc, v[3], "param", &r->param));
    if (v[2]) {
        r->when = tps_xcalloc(1, sizeof *r->when);
        if (!r->when) return tps_pl_nomem(pc->ctx);
        TPS_TRY(tps_pl_parse_cond(pc, v[2], "when", r->when));
    }
    if (v[4]) {
        TPS_TRY(tps_pl_get_str(pc, v[4], "refuse", &r->refuse));
        return TPS_OK;
    }
    size_t k;
    for (k = 0; k < sizeof split_names / sizeof split_names[0]; k++)
        if (v[1]->type == YN_SCALAR && !strcmp(v[1]->s, split_names[k].name)) break;
    if (k == sizeof split_names / sizeof split_names[0])
        return tps_pl_perr(pc, v[1]->line, "unknown split '%.*s' (known: " SPLITS_KNOWN ")",
                           v[1]->type == YN_SCALAR ? tps_pl_shown(v[1]->s) : 1,
                           v[1]->type == YN_SCALAR ? v[1]->s : "?");
    r->split = split_names[k].split;
    return TPS_OK;
}

static tps_err parse_ldrop(const pctx *pc, const ynode *m, tps_ldrop *d)
{
    static const char *const known[] = {"contains", "model_types", "reason", "layers_past",
                                        "layers_extra", "only_last"};
    const ynode *v[6];
    TPS_TRY(tps_pl_map_fields(pc, m, "drop entry", known, 6, v));
    if (v[5]) {
        if (!v[0])
            return tps_pl_perr(pc, v[5]->line, "'only_last' limits 'contains' to the last layers");
        TPS_TRY(tps_pl_get_str(pc, v[5], "only_last", &d->only_last));
        TPS_TRY(tps_pl_check_field_name(pc, v[5], "only_last"));
    }
    if (v[4] && !v[3])
        return tps_pl_perr(pc, v[4]->line, "'layers_extra' counts layers after 'layers_past'");
    if (v[4]) {
        TPS_TRY(tps_pl_get_str(pc, v[4], "layers_extra", &d->layers_extra));
        TPS_TRY(tps_pl_check_field_name(pc, v[4], "layers_extra"));
    }
    d->line = m->line;
    if (!v[0] == !v[3] || !v[2])
        return tps_pl_perr(pc, m->line,
                           "a drop entry needs one of 'contains' (parts of the names the "
                           "engine's load_weights skips) or 'layers_past' (a config count of "
                           "layers), and 'reason'");
    if (v[3]) {
        TPS_TRY(tps_pl_get_str(pc, v[3], "layers_past", &d->layers_past));
        TPS_TRY(tps_pl_check_field_name(pc, v[3], "layers_past"));
        if (v[1]) TPS_TRY(tps_pl_get_str_list(pc, v[1], "model_types", NULL, &d->model_types, &d->nmt));
        return tps_pl_get_str(pc, v[2], "reason", &d->reason);
    }
    TPS_TRY(tps_pl_get_str_list(pc, v[0], "contains", NULL, &d->contains, &d->ncontains));
    for (size_t i = 0; i < d->ncontains; i++)
        if (!d->contains[i][0]) return tps_pl_perr(pc, v[0]->line,
                                                   "'contains' holds an empty string");
    if (!d->ncontains) return tps_pl_perr(pc, v[0]->line, "'contains' is an empty list");
    if (v[1]) TPS_TRY(tps_pl_get_str_list(pc, v[1], "model_types", NULL, &d->model_types, &d->nmt));
    return tps_pl_get_str(pc, v[2], "reason", &d->reason);
}

static tps_err parse_lkey(const pctx *pc, const ynode *m, tps_lkey *k)
{
    static const char *const known[] = {"match", "param", "model_types", "when"};
    const ynode *v[4];
    TPS_TRY(tps_pl_map_fields(pc, m, "keys entry", known, 4, v));
    k->line = m->line;
    if (!v[0]) return tps_pl_perr(pc, m->line, "a keys entry needs 'match' (module path patterns)");
    TPS_TRY(tps_pl_get_str_list(pc, v[0], "match", tps_pl_check_pattern, &k->patterns, &k->npat));
    if (!k->npat) return tps_pl_perr(pc, v[0]->line, "'match' is an empty list");
    if (v[1]) TPS_TRY(tps_pl_get_str_list(pc, v[1], "param", check_leaf, &k->params, &k->nparams));
    else {
        k->params = tps_xcalloc(1, sizeof *k->params);
        if (!k->params || !(k->params[0] = tps_strdup("weight"))) return tps_pl_nomem(pc->ctx);
        k->nparams = 1;
    }
    if (v[2]) TPS_TRY(tps_pl_get_str_list(pc, v[2], "model_types", NULL, &k->model_types, &k->nmt));
    if (v[3]) {
        k->when = tps_xcalloc(1, sizeof *k->when);
        if (!k->when) return tps_pl_nomem(pc->ctx);
        TPS_TRY(tps_pl_parse_cond(pc, v[3], "when", k->when));
    }
    return TPS_OK;
}

static tps_err parse_lcheck(const pctx *pc, const ynode *m, tps_lcheck *c)
{
    static const char *const known[] = {"name", "when", "reject_if", "quotient", "reason",
                                        "divisible"};
    static const char *const qknown[] = {"field", "of"};
    const ynode *v[6], *qv[2];
    TPS_TRY(tps_pl_map_fields(pc, m, "layout check", known, 6, v));
    c->line = m->line;
    if (!v[0] || !v[4] || (!!v[2] + !!v[3] + !!v[5]) != 1)
        return tps_pl_perr(pc, m->line, "a layout check needs 'name', 'reason' and one of "
                                        "'reject_if', 'quotient' or 'divisible'");
    TPS_TRY(tps_pl_get_str(pc, v[0], "name", &c->name));
    TPS_TRY(tps_pl_get_str(pc, v[4], "reason", &c->reason));
    if (v[1]) {
        c->when = tps_xcalloc(1, sizeof *c->when);
        if (!c->when) return tps_pl_nomem(pc->ctx);
        TPS_TRY(tps_pl_parse_cond(pc, v[1], "when", c->when));
    }
    if (v[2]) return tps_pl_parse_cond(pc, v[2], "reject_if", &c->cond);
    if (v[5]) {
        TPS_TRY(tps_pl_get_str(pc, v[5], "divisible", &c->divisible));
        return tps_pl_check_field_name(pc, v[5], "divisible");
    }
    c->is_quotient = 1;
    TPS_TRY(tps_pl_map_fields(pc, v[3], "quotient", qknown, 2, qv));
    if (!qv[0] || !qv[1] || qv[1]->type != YN_SEQ || qv[1]->n != 2 ||
        qv[1]->kid[0]->type != YN_SCALAR || qv[1]->kid[1]->type != YN_SCALAR)
        return tps_pl_perr(pc, v[3]->line,
                           "'quotient' needs field and of: [NUMERATOR, DENOMINATOR]");
    TPS_TRY(tps_pl_get_str(pc, qv[0], "field", &c->field));
    TPS_TRY(tps_pl_get_str(pc, qv[1]->kid[0], "of", &c->num));
    TPS_TRY(tps_pl_get_str(pc, qv[1]->kid[1], "of", &c->den));
    return TPS_OK;
}

/* A fuse entry's bias entry: {model_types, when, unless}, each optional. */
static tps_err parse_lbias(const pctx *pc, const ynode *m, tps_lbias *b)
{
    static const char *const known[] = {"model_types", "when", "unless"};
    const ynode *v[3];
    TPS_TRY(tps_pl_map_fields(pc, m, "bias entry", known, 3, v));
    b->line = m->line;
    if (v[0]) TPS_TRY(tps_pl_get_str_list(pc, v[0], "model_types", NULL, &b->model_types, &b->nmt));
    for (int k = 1; k <= 2; k++) {
        if (!v[k]) continue;
        tps_cond **c = k == 1 ? &b->when : &b->unless;
        if (!(*c = tps_xcalloc(1, sizeof **c))) return tps_pl_nomem(pc->ctx);
        TPS_TRY(tps_pl_parse_cond(pc, v[k], known[k], *c));
    }
    return TPS_OK;
}

/* Two conditions that never hold together: one field, truthy and falsy,
 * the same default. */
static int exclusive(const tps_cond *a, const tps_cond *b)
{
    if (!a || !b || strcmp(a->field, b->field)) return 0;
    if (!((a->op == TPS_COND_TRUTHY && b->op == TPS_COND_FALSY) ||
          (a->op == TPS_COND_FALSY && b->op == TPS_COND_TRUTHY)))
        return 0;
    if (!a->dflt || !b->dflt) return !a->dflt && !b->dflt;
    return cJSON_Compare(a->dflt, b->dflt, 1);
}

int tps_lfuse_applies(const tps_lfuse *f, const cJSON *config)
{
    return !f->when || tps_cond_eval(f->when, config);
}

static tps_err parse_lfuse(const pctx *pc, const ynode *m, tps_lfuse *f)
{
    static const char *const known[] = {"into", "parts", "extra", "bias", "split", "only_last",
                                        "except_last", "when"};
    static const char *const pknown[] = {"module", "heads", "replicate", "rows", "or", "or_when",
                                         "or_layer_type"};
    static const char *const eknown[] = {"name", "dtype", "value", "shape", "quant", "when",
                                         "unless"};
    const ynode *v[8];
    TPS_TRY(tps_pl_map_fields(pc, m, "fuse entry", known, 8, v));
    f->line = m->line;
    if (v[7]) {
        if (!(f->when = tps_xcalloc(1, sizeof *f->when))) return tps_pl_nomem(pc->ctx);
        TPS_TRY(tps_pl_parse_cond(pc, v[7], "when", f->when));
    }
    if (v[5] && v[6])
        return tps_pl_perr(pc, v[6]->line, "a fuse entry has 'only_last' or 'except_last'");
    if (v[5]) {
        TPS_TRY(tps_pl_get_str(pc, v[5], "only_last", &f->only_last));
        TPS_TRY(tps_pl_check_field_name(pc, v[5], "only_last"));
    }
    if (v[6]) {
        TPS_TRY(tps_pl_get_str(pc, v[6], "except_last", &f->except_last));
        TPS_TRY(tps_pl_check_field_name(pc, v[6], "except_last"));
    }
    if (!v[0] || !v[1]) return tps_pl_perr(pc, m->line, "a fuse entry needs 'into' and 'parts'");
    if (v[4]) {
        if (v[4]->type == YN_SCALAR && !strcmp(v[4]->s, "replicate")) f->whole = 1;
        else if (v[4]->type != YN_SCALAR || strcmp(v[4]->s, "rows"))
            return tps_pl_perr(pc, v[4]->line, "a fuse entry's 'split' is rows or replicate");
    }
    TPS_TRY(tps_pl_get_str(pc, v[0], "into", &f->into));
    TPS_TRY(check_leaf(pc, v[0]));
    /* one part: the module under its own name, with the engine's extras
     * (Gemma 4's KV-shared q_proj) */
    if (v[1]->type != YN_SEQ || v[1]->n < 1 || v[1]->n > LSPEC_MAX_PARTS ||
        (v[1]->n == 1 && (v[1]->kid[0]->type != YN_MAP)))
        return tps_pl_perr(pc, v[1]->line, "'parts' must be a list of 1 to %d parts",
                           LSPEC_MAX_PARTS);
    f->parts = tps_xcalloc(v[1]->n, sizeof *f->parts);
    if (!f->parts) return tps_pl_nomem(pc->ctx);
    for (size_t i = 0; i < v[1]->n; i++) {
        const ynode *pv[7];
        tps_lpart *p = &f->parts[f->nparts++];
        TPS_TRY(tps_pl_map_fields(pc, v[1]->kid[i], "part", pknown, 7, pv));
        if ((pv[5] || pv[6]) && !pv[4])
            return tps_pl_perr(pc, v[1]->kid[i]->line,
                               "'or_when' and 'or_layer_type' go with 'or'");
        if (pv[4]) {
            TPS_TRY(tps_pl_get_str(pc, pv[4], "or", &p->or_module));
            TPS_TRY(check_leaf(pc, pv[4]));
        }
        if (pv[5]) {
            p->or_when = tps_xcalloc(1, sizeof *p->or_when);
            if (!p->or_when) return tps_pl_nomem(pc->ctx);
            TPS_TRY(tps_pl_parse_cond(pc, pv[5], "or_when", p->or_when));
        }
        if (pv[6]) TPS_TRY(tps_pl_get_str(pc, pv[6], "or_layer_type", &p->or_layer_type));
        if (pv[3]) TPS_TRY(tps_pl_get_str(pc, pv[3], "rows", &p->rows));
        if (!pv[0]) return tps_pl_perr(pc, v[1]->kid[i]->line, "a part needs 'module'");
        TPS_TRY(tps_pl_get_str(pc, pv[0], "module", &p->module));
        TPS_TRY(check_leaf(pc, pv[0]));
        if (pv[1]) TPS_TRY(tps_pl_get_str(pc, pv[1], "heads", &p->heads));
        if (pv[2]) TPS_TRY(tps_pl_get_bool(pc, pv[2], "replicate", &p->replicate));
        if (f->whole && (p->heads || p->replicate))
            return tps_pl_perr(pc, v[1]->kid[i]->line,
                               "a fuse entry with split: replicate holds whole parts: no 'heads'");
        if (p->replicate && !p->heads)
            return tps_pl_perr(pc, pv[2]->line,
                               "'replicate' replicates whole heads: it needs 'heads'");
        for (size_t j = 0; j + 1 < f->nparts; j++)
            if (!strcmp(f->parts[j].module, p->module))
                return tps_pl_perr(pc, pv[0]->line, "part '%s' is listed twice", p->module);
    }
    if (v[2] && !tps_pl_y_is_null(v[2])) {
        if (v[2]->type != YN_SEQ || v[2]->n > 64)
            return tps_pl_perr(pc, v[2]->line, "'extra' must be a list of at most 64 tensors");
        f->extra = tps_xcalloc(v[2]->n ? v[2]->n : 1, sizeof *f->extra);
        if (!f->extra) return tps_pl_nomem(pc->ctx);
        for (size_t i = 0; i < v[2]->n; i++) {
            const ynode *ev[7];
            tps_lextra *e = &f->extra[f->nextra++];
            TPS_TRY(tps_pl_map_fields(pc, v[2]->kid[i], "extra tensor", eknown, 7, ev));
            if (!ev[0] || !ev[1] || !ev[2])
                return tps_pl_perr(pc, v[2]->kid[i]->line,
                                   "an extra tensor needs name, dtype and value");
            TPS_TRY(tps_pl_get_str(pc, ev[0], "name", &e->name));
            TPS_TRY(tps_pl_check_pattern(pc, ev[0]));
            if (tps_pl_has_glob(e->name, strlen(e->name)))
                return tps_pl_perr(pc, ev[0]->line, "extra tensor name '%.*s' is a pattern",
                                   tps_pl_shown(e->name), e->name);
            if (ev[1]->type == YN_SCALAR && !strcmp(ev[1]->s, "model"))
                e->model_dtype = 1;
            else if (ev[1]->type != YN_SCALAR || tps_dtype_from_name(ev[1]->s, &e->dtype) ||
                     (e->dtype != TPS_F32 && e->dtype != TPS_F16 && e->dtype != TPS_BF16))
                return tps_pl_perr(pc, ev[1]->line,
                                   "extra tensor dtype must be F32, F16, BF16 or model");
            if (tps_pl_y_number(ev[2], &e->value))
                return tps_pl_perr(pc, ev[2]->line, "extra tensor value must be a number");
            if (ev[3]) {
                double d;
                if (ev[3]->type != YN_SEQ || ev[3]->n > 1 ||
                    (ev[3]->n == 1 && (tps_pl_y_number(ev[3]->kid[0], &d) || d < 1 || d > 1024 ||
                                       d != floor(d))))
                    return tps_pl_perr(pc, ev[3]->line,
                                       "extra tensor shape must be [] or [n], n from 1 to 1024");
                e->ndim = (int)ev[3]->n;
                e->len = e->ndim ? (uint64_t)d : 0;
            }
            if (ev[4]) TPS_TRY(tps_pl_get_str(pc, ev[4], "quant", &e->quant));
            if (ev[5]) {
                e->when = tps_xcalloc(1, sizeof *e->when);
                if (!e->when) return tps_pl_nomem(pc->ctx);
                TPS_TRY(tps_pl_parse_cond(pc, ev[5], "when", e->when));
            }
            if (ev[6]) {
                e->unless = tps_xcalloc(1, sizeof *e->unless);
                if (!e->unless) return tps_pl_nomem(pc->ctx);
                TPS_TRY(tps_pl_parse_cond(pc, ev[6], "unless", e->unless));
            }
        }
    }
    if (f->nparts == 1 && strcmp(f->parts[0].module, f->into))
        return tps_pl_perr(pc, v[1]->line, "a fuse entry of one part keeps its name: 'into' "
                                           "must be '%s'", f->parts[0].module);
    for (size_t i = 0; i < f->nparts; i++) {
        const char *o = f->parts[i].or_module;
        size_t j = 0;
        while (o && j < f->nparts && strcmp(f->parts[j].module, o)) j++;
        if (o && (j == f->nparts || j == i))
            return tps_pl_perr(pc, v[1]->line, "part '%s': 'or' names another part of the "
                                               "entry, not '%s'", f->parts[i].module, o);
    }
    if (v[3]) { /* when the engine's fused module has a bias ([]: never) */
        if (v[3]->type != YN_SEQ || v[3]->n > 64)
            return tps_pl_perr(pc, v[3]->line,
                               "'bias' must be a list of at most 64 entries ([]: the "
                                        "engine's module never has a bias)");
        f->has_bias = 1;
        f->bias = tps_xcalloc(v[3]->n ? v[3]->n : 1, sizeof *f->bias);
        if (!f->bias) return tps_pl_nomem(pc->ctx);
        for (size_t i = 0; i < v[3]->n; i++) {
            f->nbias++;
            TPS_TRY(parse_lbias(pc, v[3]->kid[i], &f->bias[i]));
        }
    }
    return TPS_OK;
}

static tps_err parse_lexperts(const pctx *pc, const ynode *m, tps_lexperts *x)
{
    static const char *const known[] = {"match", "count", "rows", "into", "router", "stacks",
                                        "model_types", "fuse_shared", "stacked"};
    static const char *const rknown[] = {"module", "as"};
    static const char *const sknown[] = {"name",       "parts", "split", "halves",
                                         "interleaved", "transposed", "bias", "scale"};
    static const char *const bknown[] = {"part", "as", "ranks"};
    static const char *const fknown[] = {"module", "architectures", "counts", "shared"};
    const ynode *v[9], *rv[2], *fv[4];
    TPS_TRY(tps_pl_map_fields(pc, m, "experts entry", known, 9, v));
    if (v[8]) {
        if (v[8]->type != YN_SCALAR || (strcmp(v[8]->s, "true") && strcmp(v[8]->s, "false")))
            return tps_pl_perr(pc, v[8]->line, "'stacked' is true or false");
        x->stacked = !strcmp(v[8]->s, "true");
    }
    if (v[7]) {
        TPS_TRY(tps_pl_map_fields(pc, v[7], "fuse_shared", fknown, 4, fv));
        if (!fv[0] || !fv[1] || !fv[2] || !fv[3])
            return tps_pl_perr(pc, v[7]->line, "'fuse_shared' needs 'module', 'architectures', "
                                               "'counts' and 'shared'");
        TPS_TRY(tps_pl_get_str(pc, fv[0], "module", &x->shared));
        TPS_TRY(check_leaf(pc, fv[0]));
        TPS_TRY(tps_pl_get_str_list(pc, fv[1], "architectures", NULL, &x->shared_arch,
                                    &x->nshared_arch));
        if (fv[2]->type != YN_SEQ || fv[2]->n < 1 || fv[2]->n > 8)
            return tps_pl_perr(pc, fv[2]->line, "fuse_shared: 'counts' is a list of 1 to 8 counts");
        for (size_t i = 0; i < fv[2]->n; i++) {
            double d;
            if (tps_pl_y_number(fv[2]->kid[i], &d) || d < 1 || d > 65536 || d != (uint64_t)d)
                return tps_pl_perr(pc, fv[2]->line, "fuse_shared: a count is a positive integer");
            x->shared_counts[x->nshared_counts++] = (uint64_t)d;
        }
        TPS_TRY(tps_pl_get_str(pc, fv[3], "shared", &x->shared_field));
        TPS_TRY(tps_pl_check_field_name(pc, fv[3], "shared"));
    }
    if (v[6]) TPS_TRY(tps_pl_get_str_list(pc, v[6], "model_types", NULL, &x->model_types, &x->nmt));
    x->line = m->line;
    if (!v[0] || !v[1] || !v[5])
        return tps_pl_perr(pc, m->line, "an experts entry needs 'match', 'count' and 'stacks'");
    TPS_TRY(tps_pl_get_str_list(pc, v[0], "match", tps_pl_check_pattern, &x->patterns, &x->npat));
    TPS_TRY(tps_pl_get_str(pc, v[1], "count", &x->count));
    TPS_TRY(tps_pl_check_field_name(pc, v[1], "count"));
    if (v[2]) {
        TPS_TRY(tps_pl_get_str(pc, v[2], "rows", &x->rows));
        TPS_TRY(tps_pl_check_field_name(pc, v[2], "rows"));
    }
    if (v[3]) {
        TPS_TRY(tps_pl_get_str(pc, v[3], "into", &x->into));
        TPS_TRY(check_leaf(pc, v[3]));
    }
    if (v[4]) {
        TPS_TRY(tps_pl_map_fields(pc, v[4], "router", rknown, 2, rv));
        if (!rv[0] || !rv[1]) return tps_pl_perr(pc, v[4]->line,
                                                 "'router' needs 'module' and 'as'");
        TPS_TRY(tps_pl_get_str(pc, rv[0], "module", &x->router));
        TPS_TRY(check_leaf(pc, rv[0]));
        TPS_TRY(tps_pl_get_str(pc, rv[1], "as", &x->router_as));
        TPS_TRY(tps_pl_check_pattern(pc, rv[1]));
        if (tps_pl_has_glob(x->router_as, strlen(x->router_as)))
            return tps_pl_perr(pc, rv[1]->line, "router 'as' is a module path, not a pattern");
    }
    if (v[5]->type != YN_SEQ || v[5]->n < 1 || v[5]->n > 4)
        return tps_pl_perr(pc, v[5]->line, "'stacks' must be a list of 1 to 4 stacks");
    x->stacks = tps_xcalloc(v[5]->n, sizeof *x->stacks);
    if (!x->stacks) return tps_pl_nomem(pc->ctx);
    for (size_t i = 0; i < v[5]->n; i++) {
        const ynode *sv[8];
        tps_lstack *st = &x->stacks[x->nstacks++];
        TPS_TRY(tps_pl_map_fields(pc, v[5]->kid[i], "stack", sknown, 8, sv));
        st->halves = 1;
        if (sv[3]) {
            double d;
            if (tps_pl_y_number(sv[3], &d) || (d != 1 && d != 2) || !x->stacked)
                return tps_pl_perr(pc, sv[3]->line, "a stack's 'halves' is 1 or 2, in a stacked "
                                                    "experts entry");
            st->halves = (int)d;
        }
        if (!sv[0] || !sv[1] || !sv[2])
            return tps_pl_perr(pc, v[5]->kid[i]->line, "a stack needs 'name', 'parts' and 'split'");
        TPS_TRY(tps_pl_get_str(pc, sv[0], "name", &st->name));
        TPS_TRY(check_leaf(pc, sv[0]));
        TPS_TRY(tps_pl_get_str_list(pc, sv[1], "parts", NULL, &st->parts, &st->nparts));
        if (st->nparts < 1 || st->nparts > 4)
            return tps_pl_perr(pc, sv[1]->line, "a stack has 1 to 4 parts");
        if (sv[2]->type == YN_SCALAR && !strcmp(sv[2]->s, "rows")) st->dim = 0;
        else if (sv[2]->type == YN_SCALAR && !strcmp(sv[2]->s, "columns")) st->dim = 1;
        else return tps_pl_perr(pc, sv[2]->line, "a stack's 'split' is rows or columns");
        if (st->dim == 1 && st->nparts != 1)
            return tps_pl_perr(pc, sv[1]->line, "a stack split by columns has one part");
        /* gpt-oss's experts: one part of interleaved gate/up rows, stored
         * transposed unquantized, each with its bias and (MXFP4) its scales */
        for (int k = 4; k < 8; k++)
            if (sv[k] && (!x->stacked || st->nparts != 1))
                return tps_pl_perr(pc, sv[k]->line, "a stack's '%s' is for a stacked experts "
                                                    "entry's one-part stack", sknown[k]);
        if (sv[4]) TPS_TRY(tps_pl_get_bool(pc, sv[4], "interleaved", &st->interleaved));
        if (st->interleaved && (st->dim != 0 || st->halves != 1))
            return tps_pl_perr(pc, sv[4]->line, "an interleaved stack is split by rows, without "
                                                "'halves'");
        if (sv[5]) TPS_TRY(tps_pl_get_bool(pc, sv[5], "transposed", &st->transposed));
        if (sv[6]) {
            const ynode *bv[3];
            TPS_TRY(tps_pl_map_fields(pc, sv[6], "bias", bknown, 3, bv));
            if (!bv[0] || !bv[1])
                return tps_pl_perr(pc, sv[6]->line, "a stack's 'bias' needs 'part' and 'as'");
            TPS_TRY(tps_pl_get_str(pc, bv[0], "part", &st->bias_part));
            TPS_TRY(check_leaf(pc, bv[0]));
            TPS_TRY(tps_pl_get_str(pc, bv[1], "as", &st->bias_as));
            TPS_TRY(check_leaf(pc, bv[1]));
            if (bv[2]) {
                if (bv[2]->type != YN_SCALAR ||
                    (strcmp(bv[2]->s, "all") && strcmp(bv[2]->s, "first")))
                    return tps_pl_perr(pc, bv[2]->line, "a bias's 'ranks' is all or first");
                st->bias_first = !strcmp(bv[2]->s, "first");
                if (st->bias_first && st->dim != 1)
                    return tps_pl_perr(pc, bv[2]->line, "'ranks: first' is for the bias of a "
                                                        "stack split by columns");
            }
        }
        if (sv[7]) {
            TPS_TRY(tps_pl_get_str(pc, sv[7], "scale", &st->scale_as));
            TPS_TRY(check_leaf(pc, sv[7]));
        }
        for (size_t j = 0; j < i; j++)
            if (!strcmp(x->stacks[j].name, st->name))
                return tps_pl_perr(pc, sv[0]->line, "stack '%s' is listed twice", st->name);
    }
    return TPS_OK;
}

/* scales: {dtype, per_tensor_shape, refuse, reason, refine_expert_blocks, packed,
 * packed_reason}: how the engine wants a
 * quantized checkpoint's scales written, and the kinds it cannot load. */
static tps_err parse_lscales(const pctx *pc, const ynode *m, tps_lspec *s)
{
    static const char *const qknown[] = {"dtype", "per_tensor_shape", "refuse", "reason",
                                         "refine_expert_blocks", "packed", "packed_reason"};
    const ynode *qv[7];
    TPS_TRY(tps_pl_map_fields(pc, m, "scales", qknown, 7, qv));
    if (qv[5])
        TPS_TRY(tps_pl_get_str_list(pc, qv[5], "packed", NULL, &s->packed_methods,
                                    &s->npacked_methods));
    if (qv[6]) TPS_TRY(tps_pl_get_str(pc, qv[6], "packed_reason", &s->packed_reason));
    if (qv[4]) {
        if (qv[4]->type != YN_SCALAR || (strcmp(qv[4]->s, "true") && strcmp(qv[4]->s, "false")))
            return tps_pl_perr(pc, qv[4]->line, "scales: refine_expert_blocks is true or false");
        s->refine_moe_blocks = !strcmp(qv[4]->s, "true");
    }
    if (qv[0]) {
        if (qv[0]->type != YN_SCALAR || strcmp(qv[0]->s, "F32"))
            return tps_pl_perr(pc, qv[0]->line, "scales: dtype is F32 (or absent: as stored)");
        s->scale_f32 = 1;
    }
    if (qv[1]) {
        double d;
        if (qv[1]->type != YN_SEQ || qv[1]->n != 1 || tps_pl_y_number(qv[1]->kid[0], &d) || d != 1)
            return tps_pl_perr(pc, qv[1]->line,
                               "scales: per_tensor_shape is [1] (or absent: as stored)");
        s->scalar_as_1 = 1;
    }
    if (qv[2]) {
        char **kinds = NULL;
        size_t nk = 0;
        TPS_TRY(tps_pl_get_str_list(pc, qv[2], "refuse", NULL, &kinds, &nk));
        tps_err rc = TPS_OK;
        for (size_t i = 0; i < nk; i++) {
            int k = TPS_QS_KINDS;
            while (k-- > 0 && strcmp(kinds[i], tps_qscale_names[k])) {}
            if (k >= 0) s->refuse_scales |= 1u << k;
            else if (!rc) rc = tps_pl_perr(pc, qv[2]->line,
                                           "scales: refuse lists tensor, channel or block");
        }
        tps_pl_strv_free(kinds, nk);
        TPS_TRY(rc);
        if (!qv[3]) return tps_pl_perr(pc, qv[2]->line, "scales: refuse needs a 'reason'");
        TPS_TRY(tps_pl_get_str(pc, qv[3], "reason", &s->refuse_scales_reason));
    }
    return TPS_OK;
}

/* tied: {head, embedding, default_for}: the module paths of a tied head and
 * embedding, and the model_types whose config ties by default. */
static tps_err parse_ltied(const pctx *pc, const ynode *m, tps_lspec *s)
{
    static const char *const tknown[] = {"head", "embedding", "default_for", "embedding_also"};
    const ynode *tv[4];
    TPS_TRY(tps_pl_map_fields(pc, m, "tied", tknown, 4, tv));
    if (tv[3]) TPS_TRY(tps_pl_get_str_list(pc, tv[3], "embedding_also", tps_pl_check_pattern,
                                           &s->tied_also, &s->ntied_also));
    if (tv[2]) TPS_TRY(tps_pl_get_str_list(pc, tv[2], "default_for", NULL, &s->tied_default,
                                           &s->ntied_default));
    if (!tv[0] || !tv[1]) return tps_pl_perr(pc, m->line, "'tied' needs head and embedding");
    TPS_TRY(tps_pl_get_str(pc, tv[0], "head", &s->tied_head));
    TPS_TRY(tps_pl_check_pattern(pc, tv[0]));
    TPS_TRY(tps_pl_get_str(pc, tv[1], "embedding", &s->tied_embedding));
    TPS_TRY(tps_pl_check_pattern(pc, tv[1]));
    return TPS_OK;
}

/* rename: {match, as, model_types}: rank tensors under a matching module go
 * under its parent's `as` instead. */
static tps_err parse_lrename(const pctx *pc, const ynode *m, tps_lrename *r)
{
    static const char *const known[] = {"match", "as", "model_types", "only_last", "root"};
    const ynode *v[5];
    TPS_TRY(tps_pl_map_fields(pc, m, "rename entry", known, 5, v));
    if (v[4]) TPS_TRY(tps_pl_get_bool(pc, v[4], "root", &r->root));
    r->line = m->line;
    if (!v[0] || !v[1])
        return tps_pl_perr(pc, m->line, "a rename entry needs 'match' (module path patterns) "
                                        "and 'as' (the path under the module's parent)");
    TPS_TRY(tps_pl_get_str_list(pc, v[0], "match", tps_pl_check_pattern, &r->patterns, &r->npat));
    if (!r->npat) return tps_pl_perr(pc, v[0]->line, "'match' is an empty list");
    TPS_TRY(tps_pl_get_str(pc, v[1], "as", &r->as));
    TPS_TRY(tps_pl_check_pattern(pc, v[1]));
    if (tps_pl_has_glob(r->as, strlen(r->as)))
        return tps_pl_perr(pc, v[1]->line, "rename 'as' is a module path, not a pattern");
    if (v[2]) TPS_TRY(tps_pl_get_str_list(pc, v[2], "model_types", NULL, &r->model_types, &r->nmt));
    if (v[3]) {
        TPS_TRY(tps_pl_get_str(pc, v[3], "only_last", &r->only_last));
        TPS_TRY(tps_pl_check_field_name(pc, v[3], "only_last"));
        for (size_t q = 0; q < r->npat; q++) {
            size_t n = strlen(r->patterns[q]);
            if (n < 2 || strcmp(r->patterns[q] + n - 2, ".*"))
                return tps_pl_perr(pc, v[0]->line, "a rename with 'only_last' matches the layers "
                                                   "(PATH.*)");
        }
    }
    return TPS_OK;
}

/* pipeline: {layers, count, first, last, every_stage}: how the engine builds
 * one pipeline stage's model (see tps_lspec). */
static tps_err parse_lpipeline(const pctx *pc, const ynode *m, tps_lspec *s)
{
    static const char *const known[] = {"layers", "count", "first", "last", "every_stage",
                                        "kv_shared"};
    const ynode *v[6];
    TPS_TRY(tps_pl_map_fields(pc, m, "pipeline", known, 6, v));
    if (v[5]) {
        TPS_TRY(tps_pl_get_str(pc, v[5], "kv_shared", &s->pp_kv_shared));
        TPS_TRY(tps_pl_check_field_name(pc, v[5], "kv_shared"));
    }
    if (!v[0] || !v[1] || !v[3])
        return tps_pl_perr(pc, m->line,
                           "'pipeline' needs layers (the decoder layers' module path), count (the "
                           "config field counting them) and last (the modules of the last stage)");
    TPS_TRY(tps_pl_get_str(pc, v[0], "layers", &s->pp_layers));
    TPS_TRY(tps_pl_check_pattern(pc, v[0]));
    if (tps_pl_has_glob(s->pp_layers, strlen(s->pp_layers)))
        return tps_pl_perr(pc, v[0]->line, "pipeline 'layers' is a module path, not a pattern");
    TPS_TRY(tps_pl_get_str(pc, v[1], "count", &s->pp_count));
    if (v[2]) TPS_TRY(tps_pl_get_str_list(pc, v[2], "first", tps_pl_check_pattern, &s->pp_first,
                                          &s->npp_first));
    TPS_TRY(tps_pl_get_str_list(pc, v[3], "last", tps_pl_check_pattern, &s->pp_last, &s->npp_last));
    if (v[4]) TPS_TRY(tps_pl_get_str_list(pc, v[4], "every_stage", NULL, &s->pp_every,
                                          &s->npp_every));
    s->has_pipeline = 1;
    return TPS_OK;
}

static tps_err build_lspec(const pctx *pc, const ynode *root, tps_lspec *s)
{
    static const char *const known[] = {"name",  "target", "description", "serves", "split",
                                        "vocab_padding", "vocab", "tied", "overrides", "fuse",
                                        "vocab_padding_tp", "checks", "scales", "experts",
                                        "drop", "keys", "rename", "pipeline"};
    static const char *const sknown[] = {"architectures", "model_types"};
    enum { K_NAME, K_TARGET, K_DESC, K_SERVES, K_SPLIT, K_PAD, K_VOCAB, K_TIED, K_OVR, K_FUSE,
           K_PADTP, K_CHECKS, K_SCALES, K_EXPERTS, K_DROP, K_KEYS, K_RENAME, K_PIPE, K_N };
    const ynode *v[K_N], *sv[2];
    if (root->type != YN_MAP)
        return tps_pl_perr(pc, root->line,
                           "a layout must be a mapping with 'name' and 'target', not %s",
                           tps_pl_y_kind(root));
    TPS_TRY(tps_pl_map_fields(pc, root, "the layout", known, K_N, v));
    if (!v[K_NAME]) return tps_pl_perr(pc, root->line, "layout without 'name'");
    if (!v[K_TARGET])
        return tps_pl_perr(pc, root->line,
                           "layout without 'target' (the engine and version it writes for)");
    TPS_TRY(tps_pl_get_str(pc, v[K_NAME], "name", &s->name));
    TPS_TRY(tps_pl_check_plan_name(pc, v[K_NAME]));
    if (!strcmp(s->name, "dtensor"))
        return tps_pl_perr(pc, v[K_NAME]->line,
                           "'dtensor' is the plan's own layout: choose another name");
    TPS_TRY(tps_pl_get_str(pc, v[K_TARGET], "target", &s->target));
    if (v[K_DESC]) TPS_TRY(tps_pl_get_str(pc, v[K_DESC], "description", &s->description));
    if (v[K_SERVES]) {
        TPS_TRY(tps_pl_map_fields(pc, v[K_SERVES], "serves", sknown, 2, sv));
        if (sv[0]) TPS_TRY(tps_pl_get_str_list(pc, sv[0], "architectures", NULL, &s->architectures,
                                               &s->narch));
        if (sv[1]) TPS_TRY(tps_pl_get_str_list(pc, sv[1], "model_types", NULL, &s->model_types,
                                               &s->nmt));
    }
    s->exact = 1;
    if (v[K_SPLIT]) {
        if (v[K_SPLIT]->type == YN_SCALAR && !strcmp(v[K_SPLIT]->s, "exact")) s->exact = 1;
        else if (v[K_SPLIT]->type == YN_SCALAR && !strcmp(v[K_SPLIT]->s, "chunk")) s->exact = 0;
        else return tps_pl_perr(pc, v[K_SPLIT]->line, "'split' is exact or chunk");
    }
    if (v[K_PAD]) {
        double d;
        if (tps_pl_y_number(v[K_PAD], &d) || d < 1 || d > 1048576 || d != floor(d))
            return tps_pl_perr(pc, v[K_PAD]->line,
                               "'vocab_padding' must be a whole number from 1 to 1048576");
        s->vocab_pad = (uint64_t)d;
    }
    if (v[K_PADTP]) TPS_TRY(tps_pl_get_bool(pc, v[K_PADTP], "vocab_padding_tp", &s->vocab_pad_tp));
    if (v[K_VOCAB]) TPS_TRY(tps_pl_get_str_list(pc, v[K_VOCAB], "vocab", tps_pl_check_pattern,
                                                &s->vocab, &s->nvocab));
    if (v[K_CHECKS] && !tps_pl_y_is_null(v[K_CHECKS])) {
        if (v[K_CHECKS]->type != YN_SEQ || v[K_CHECKS]->n > PLAN_MAX_CHECKS)
            return tps_pl_perr(pc, v[K_CHECKS]->line,
                               "'checks' must be a list of at most %d checks", PLAN_MAX_CHECKS);
        s->checks = tps_xcalloc(v[K_CHECKS]->n ? v[K_CHECKS]->n : 1, sizeof *s->checks);
        if (!s->checks) return tps_pl_nomem(pc->ctx);
        for (size_t i = 0; i < v[K_CHECKS]->n; i++) {
            s->nchecks++;
            TPS_TRY(parse_lcheck(pc, v[K_CHECKS]->kid[i], &s->checks[i]));
        }
    }
    if (v[K_DROP] && !tps_pl_y_is_null(v[K_DROP])) {
        if (v[K_DROP]->type != YN_SEQ || v[K_DROP]->n > PLAN_MAX_RULES)
            return tps_pl_perr(pc, v[K_DROP]->line, "'drop' must be a list of at most %d entries",
                               PLAN_MAX_RULES);
        s->drops = tps_xcalloc(v[K_DROP]->n ? v[K_DROP]->n : 1, sizeof *s->drops);
        if (!s->drops) return tps_pl_nomem(pc->ctx);
        for (size_t i = 0; i < v[K_DROP]->n; i++) {
            s->ndrops++;
            TPS_TRY(parse_ldrop(pc, v[K_DROP]->kid[i], &s->drops[i]));
        }
    }
    if (v[K_KEYS]) {
        s->has_keys = 1;
        if (!tps_pl_y_is_null(v[K_KEYS]) &&
            (v[K_KEYS]->type != YN_SEQ || v[K_KEYS]->n > PLAN_MAX_RULES))
            return tps_pl_perr(pc, v[K_KEYS]->line, "'keys' must be a list of at most %d entries",
                               PLAN_MAX_RULES);
        size_t n = tps_pl_y_is_null(v[K_KEYS]) ? 0 : v[K_KEYS]->n;
        s->keys = tps_xcalloc(n ? n : 1, sizeof *s->keys);
        if (!s->keys) return tps_pl_nomem(pc->ctx);
        for (size_t i = 0; i < n; i++) {
            s->nkeys++;
            TPS_TRY(parse_lkey(pc, v[K_KEYS]->kid[i], &s->keys[i]));
        }
    }
    if (v[K_EXPERTS] && !tps_pl_y_is_null(v[K_EXPERTS])) {
        if (v[K_EXPERTS]->type != YN_SEQ || v[K_EXPERTS]->n > 16)
            return tps_pl_perr(pc, v[K_EXPERTS]->line,
                               "'experts' must be a list of at most 16 entries");
        s->experts = tps_xcalloc(v[K_EXPERTS]->n ? v[K_EXPERTS]->n : 1, sizeof *s->experts);
        if (!s->experts) return tps_pl_nomem(pc->ctx);
        for (size_t i = 0; i < v[K_EXPERTS]->n; i++) {
            s->nexperts++;
            TPS_TRY(parse_lexperts(pc, v[K_EXPERTS]->kid[i], &s->experts[i]));
        }
    }
    if (v[K_RENAME] && !tps_pl_y_is_null(v[K_RENAME])) {
        if (v[K_RENAME]->type != YN_SEQ || v[K_RENAME]->n > PLAN_MAX_RULES)
            return tps_pl_perr(pc, v[K_RENAME]->line,
                               "'rename' must be a list of at most %d entries", PLAN_MAX_RULES);
        s->renames = tps_xcalloc(v[K_RENAME]->n ? v[K_RENAME]->n : 1, sizeof *s->renames);
        if (!s->renames) return tps_pl_nomem(pc->ctx);
        for (size_t i = 0; i < v[K_RENAME]->n; i++) {
            s->nrenames++;
            TPS_TRY(parse_lrename(pc, v[K_RENAME]->kid[i], &s->renames[i]));
        }
    }
    if (v[K_SCALES]) TPS_TRY(parse_lscales(pc, v[K_SCALES], s));
    if (v[K_TIED]) TPS_TRY(parse_ltied(pc, v[K_TIED], s));
    if (v[K_PIPE] && !tps_pl_y_is_null(v[K_PIPE])) TPS_TRY(parse_lpipeline(pc, v[K_PIPE], s));
    if (v[K_OVR] && !tps_pl_y_is_null(v[K_OVR])) {
        if (v[K_OVR]->type != YN_SEQ || v[K_OVR]->n > PLAN_MAX_RULES)
            return tps_pl_perr(pc, v[K_OVR]->line,
                               "'overrides' must be a list of at most %d entries", PLAN_MAX_RULES);
        s->rules = tps_xcalloc(v[K_OVR]->n ? v[K_OVR]->n : 1, sizeof *s->rules);
        if (!s->rules) return tps_pl_nomem(pc->ctx);
        for (size_t i = 0; i < v[K_OVR]->n; i++) {
            s->nrules++;
            TPS_TRY(parse_lrule(pc, v[K_OVR]->kid[i], &s->rules[i]));
        }
    }
    if (v[K_FUSE] && !tps_pl_y_is_null(v[K_FUSE])) {
        if (v[K_FUSE]->type != YN_SEQ || v[K_FUSE]->n > LSPEC_MAX_FUSE)
            return tps_pl_perr(pc, v[K_FUSE]->line, "'fuse' must be a list of at most %d entries",
                               LSPEC_MAX_FUSE);
        s->fuse = tps_xcalloc(v[K_FUSE]->n ? v[K_FUSE]->n : 1, sizeof *s->fuse);
        if (!s->fuse) return tps_pl_nomem(pc->ctx);
        for (size_t i = 0; i < v[K_FUSE]->n; i++) {
            s->nfuse++;
            TPS_TRY(parse_lfuse(pc, v[K_FUSE]->kid[i], &s->fuse[i]));
            /* a module is a part of one fusion at most (in the same layers: an
             * entry for the last layers and one for the others share modules;
             * so do entries that never apply together: one `when` a field is
             * truthy, the other when it is falsy) */
            for (size_t j = 0; j < i; j++)
                if (!(s->fuse[i].only_last && s->fuse[j].except_last &&
                      !strcmp(s->fuse[i].only_last, s->fuse[j].except_last)) &&
                    !(s->fuse[j].only_last && s->fuse[i].except_last &&
                      !strcmp(s->fuse[j].only_last, s->fuse[i].except_last)) &&
                    !exclusive(s->fuse[i].when, s->fuse[j].when))
                for (size_t a = 0; a < s->fuse[i].nparts; a++)
                    for (size_t b = 0; b < s->fuse[j].nparts; b++)
                        if (!strcmp(s->fuse[i].parts[a].module, s->fuse[j].parts[b].module))
                            return tps_pl_perr(pc, s->fuse[i].line,
                                               "module '%s' is already fused at line %d",
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
    tps_pl_strv_free(s->architectures, s->narch);
    tps_pl_strv_free(s->model_types, s->nmt);
    tps_pl_strv_free(s->vocab, s->nvocab);
    free(s->tied_head);
    free(s->tied_embedding);
    tps_pl_strv_free(s->tied_also, s->ntied_also);
    free(s->pp_layers);
    free(s->pp_count);
    free(s->pp_kv_shared);
    tps_pl_strv_free(s->pp_first, s->npp_first);
    tps_pl_strv_free(s->pp_last, s->npp_last);
    tps_pl_strv_free(s->pp_every, s->npp_every);
    free(s->refuse_scales_reason);
    tps_pl_strv_free(s->packed_methods, s->npacked_methods);
    free(s->packed_reason);
    for (size_t i = 0; i < s->ndrops; i++) {
        tps_pl_strv_free(s->drops[i].contains, s->drops[i].ncontains);
        tps_pl_strv_free(s->drops[i].model_types, s->drops[i].nmt);
        free(s->drops[i].reason);
        free(s->drops[i].layers_past);
        free(s->drops[i].layers_extra);
        free(s->drops[i].only_last);
    }
    free(s->drops);
    for (size_t i = 0; i < s->nkeys; i++) {
        tps_lkey *k = &s->keys[i];
        tps_pl_strv_free(k->patterns, k->npat);
        tps_pl_strv_free(k->params, k->nparams);
        tps_pl_strv_free(k->model_types, k->nmt);
        if (k->when) {
            tps_pl_cond_clear(k->when);
            free(k->when);
        }
    }
    free(s->keys);
    for (size_t i = 0; i < s->nexperts; i++) {
        tps_lexperts *x = &s->experts[i];
        tps_pl_strv_free(x->patterns, x->npat);
        free(x->count);
        free(x->rows);
        free(x->into);
        free(x->router);
        free(x->router_as);
        tps_pl_strv_free(x->model_types, x->nmt);
        free(x->shared);
        tps_pl_strv_free(x->shared_arch, x->nshared_arch);
        free(x->shared_field);
        for (size_t j = 0; j < x->nstacks; j++) {
            free(x->stacks[j].name);
            tps_pl_strv_free(x->stacks[j].parts, x->stacks[j].nparts);
            free(x->stacks[j].bias_part);
            free(x->stacks[j].bias_as);
            free(x->stacks[j].scale_as);
        }
        free(x->stacks);
    }
    free(s->experts);
    tps_pl_strv_free(s->tied_default, s->ntied_default);
    for (size_t i = 0; i < s->nchecks; i++) {
        tps_lcheck *c = &s->checks[i];
        free(c->name);
        free(c->reason);
        if (c->when) {
            tps_pl_cond_clear(c->when);
            free(c->when);
        }
        tps_pl_cond_clear(&c->cond);
        free(c->field);
        free(c->num);
        free(c->den);
        free(c->divisible);
    }
    free(s->checks);
    for (size_t i = 0; i < s->nrules; i++) {
        free(s->rules[i].param);
        free(s->rules[i].refuse);
        tps_pl_strv_free(s->rules[i].patterns, s->rules[i].npat);
        if (s->rules[i].when) {
            tps_pl_cond_clear(s->rules[i].when);
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
            free(f->parts[j].or_module);
            free(f->parts[j].or_layer_type);
            if (f->parts[j].or_when) tps_pl_cond_clear(f->parts[j].or_when);
            free(f->parts[j].or_when);
        }
        free(f->only_last);
        free(f->except_last);
        if (f->when) tps_pl_cond_clear(f->when);
        free(f->when);
        free(f->parts);
        for (size_t j = 0; j < f->nextra; j++) {
            free(f->extra[j].name);
            free(f->extra[j].quant);
            if (f->extra[j].when) tps_pl_cond_clear(f->extra[j].when);
            if (f->extra[j].unless) tps_pl_cond_clear(f->extra[j].unless);
            free(f->extra[j].when);
            free(f->extra[j].unless);
        }
        free(f->extra);
        for (size_t j = 0; j < f->nbias; j++) {
            tps_pl_strv_free(f->bias[j].model_types, f->bias[j].nmt);
            if (f->bias[j].when) tps_pl_cond_clear(f->bias[j].when);
            if (f->bias[j].unless) tps_pl_cond_clear(f->bias[j].unless);
            free(f->bias[j].when);
            free(f->bias[j].unless);
        }
        free(f->bias);
    }
    free(s->fuse);
    for (size_t i = 0; i < s->nrenames; i++) {
        tps_pl_strv_free(s->renames[i].patterns, s->renames[i].npat);
        tps_pl_strv_free(s->renames[i].model_types, s->renames[i].nmt);
        free(s->renames[i].as);
        free(s->renames[i].only_last);
    }
    free(s->renames);
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
    TPS_CHECK(tps_pl_yaml_load(&pc, text ? text : "", len, &root));
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
    tps_pl_ynode_free(root);
    tps_lspec_free(s);
    return rc;
}
