/* quant.c - quantized checkpoints, whatever the method: which tensors are
 * quantized weights, which are their scales, and how a scale's shape relates
 * to its weight's. What a method stores and means is its entry in the table
 * below (the entries live in one file per method family: fp8.c); this file
 * reads any of them the same way. Any other quant_method is refused:
 * splitting its packed integers or grouped scales as if they were plain
 * tensors would give shards that dequantize to garbage while every byte
 * checks out. */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int has_suffix(const char *s, const char *suf, size_t *stem)
{
    size_t a = strlen(s), b = strlen(suf);
    if (a <= b || strcmp(s + a - b, suf)) return 0;
    *stem = a - b;
    return 1;
}

const tps_qmethod *const tps_qmethods[] = {&tps_qm_fp8, &tps_qm_ct_fp8, &tps_qm_gptq, &tps_qm_awq,
                                            &tps_qm_ct_wna16, &tps_qm_nvfp4, &tps_qm_ct_nvfp4,
                                            &tps_qm_mxfp4};
const size_t tps_nqmethods = sizeof tps_qmethods / sizeof tps_qmethods[0];
const char *const tps_qscale_names[TPS_QS_KINDS] = {"tensor", "channel", "block", "group"};
const char *const tps_qscale_labels[TPS_QS_KINDS] = {"per-tensor", "per-channel", "block",
                                                     "per-group"};

/* Tensors of methods not in the table: a checkpoint holding them is refused
 * by name, whatever its config says. */
static const char *const foreign_parts[] = {".weight_zero_point", ".qweight", ".weight_packed"};

void tps_quant_free(tps_quant *q)
{
    if (!q) return;
    free(q->role);
    free(q->partner);
    free(q->input);
    free(q->kind);
    free(q->zeros);
    free(q);
}

tps_err tps_quant_block_of(tps_ctx *ctx, const tps_ckpt *ck, const char *where, const cJSON *b,
                           uint64_t *bn, uint64_t *bk)
{
    uint64_t v[2];
    int ok = cJSON_IsArray(b) && cJSON_GetArraySize(b) == 2;
    for (int i = 0; ok && i < 2; i++) {
        const cJSON *x = cJSON_GetArrayItem(b, i);
        ok = cJSON_IsNumber(x) && x->valuedouble >= 1 && x->valuedouble <= 1048576 &&
             x->valuedouble == floor(x->valuedouble);
        if (ok) v[i] = (uint64_t)x->valuedouble;
    }
    if (!ok) {
        char *shown = b ? cJSON_PrintUnformatted(b) : NULL;
        tps_err rc = tps_fail(ctx, TPS_E_CONFIG,
                              "%s: %s is %s, not two positive integers [rows, columns]",
                              ck->path, where, shown ? shown : "missing");
        free(shown);
        return rc;
    }
    *bn = v[0];
    *bk = v[1];
    return TPS_OK;
}

/* Expected scale shape of weight w for kind k. */
static int scale_fits(const tps_quant *q, const tps_ctensor *w, const tps_ctensor *s, tps_qscale *k)
{
    uint64_t n = 1;
    for (int d = 0; d < s->ndim; d++) n *= s->shape[d];
    if (n == 1 && s->ndim <= 1) {
        *k = TPS_QS_TENSOR;
        return 1;
    }
    /* experts held in one 3-D tensor [E, rows, cols] (Gemma 4's experts.gate_up_proj):
     * block scales [E, ceil(rows/bn), ceil(cols/bk)] */
    if (w->ndim == 3 && q->bn && s->ndim == 3 && s->shape[0] == w->shape[0] &&
        s->shape[1] == (w->shape[1] + q->bn - 1) / q->bn &&
        s->shape[2] == (w->shape[2] + q->bk - 1) / q->bk) {
        *k = TPS_QS_BLOCK;
        return 1;
    }
    if (w->ndim != 2) return 0;
    if ((s->ndim == 2 && s->shape[0] == w->shape[0] && s->shape[1] == 1) ||
        (s->ndim == 1 && s->shape[0] == w->shape[0])) {
        *k = TPS_QS_CHANNEL;
        return 1;
    }
    if (q->bn && s->ndim == 2 && s->shape[0] == (w->shape[0] + q->bn - 1) / q->bn &&
        s->shape[1] == (w->shape[1] + q->bk - 1) / q->bk) {
        *k = TPS_QS_BLOCK;
        return 1;
    }
    return 0;
}

/* The method config.json names, from the table; an unknown one is refused
 * with the list of those tpshard splits. */
static tps_err method_of(tps_ctx *ctx, const tps_ckpt *ck, const cJSON *qc, tps_quant *q)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(qc, "quant_method");
    if (!cJSON_IsString(m))
        return tps_fail(ctx, TPS_E_CONFIG, "%s: quantization_config has no quant_method", ck->path);
    q->method_name = m->valuestring;
    const char *sel_key = NULL, *sel_val = NULL;
    for (size_t i = 0; i < tps_nqmethods && !q->m; i++) {
        const tps_qmethod *e = tps_qmethods[i];
        if (strcmp(m->valuestring, e->name)) continue;
        if (!e->select) {
            q->m = e;
            break;
        }
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(qc, e->select);
        const char *val = cJSON_IsString(v) ? v->valuestring : "-";
        sel_key = e->select;
        sel_val = val;
        size_t n = strlen(val);
        for (const char *f = e->formats; f && *f;) {
            size_t l = strcspn(f, " ");
            if (l == n && !strncmp(f, val, n)) q->m = e;
            f += l + (f[l] == ' ');
        }
    }
    if (q->m) return q->m->read_config(ctx, ck, qc, q);
    if (sel_key) {
        char known[512];
        size_t o = 0;
        known[0] = 0;
        for (size_t i = 0; i < tps_nqmethods && o < sizeof known; i++)
            if (!strcmp(m->valuestring, tps_qmethods[i]->name))
                o += (size_t)snprintf(known + o, sizeof known - o, "%s%s (%s)", o ? "; " : "",
                                      tps_qmethods[i]->formats, tps_qmethods[i]->what);
        return tps_fail(ctx, TPS_E_REJECT,
                        "%s: quant_method '%s' with %s '%s' is not supported yet: tpshard splits "
                        "%s %s %s",
                        ck->path, m->valuestring, sel_key,
                        strcmp(sel_val, "-") ? sel_val : "(none)", sel_key, known,
                        "(\"-\": the field absent)");
    }
    char known[512];
    size_t o = 0;
    for (size_t i = 0; i < tps_nqmethods && o < sizeof known; i++)
        o += (size_t)snprintf(known + o, sizeof known - o, "%s%s (%s)",
                              i == 0 ? "" : i + 1 == tps_nqmethods ? " and " : ", ",
                              tps_qmethods[i]->name, tps_qmethods[i]->what);
    return tps_fail(ctx, TPS_E_REJECT,
                    "%s: quant_method '%s' is not supported yet: tpshard splits %s; it will not cut "
                    "packed or grouped quantized weights as if they were plain tensors",
                    ck->path, m->valuestring, known);
}

/* The part of method m (of any method, m NULL) that name ends with. */
static const tps_qpart *part_of(const tps_qmethod *m, const char *name, size_t *stem)
{
    for (size_t k = 0; k < (m ? 1 : tps_nqmethods); k++) {
        const tps_qmethod *mm = m ? m : tps_qmethods[k];
        for (size_t j = 0; j < mm->nparts; j++)
            /* of any method: the tensors beside a weight, not the weight
             * itself (NVFP4's is X.weight, as every unquantized one) */
            if ((m || mm->parts[j].role != TPS_QR_WEIGHT) &&
                has_suffix(name, mm->parts[j].suffix, stem))
                return &mm->parts[j];
    }
    return NULL;
}

static tps_err place_input(tps_ctx *ctx, const tps_ckpt *ck, tps_quant *q, size_t i, int w)
{
    const tps_ctensor *s = &ck->t[i];
    tps_qscale k;
    if (w < 0)
        return tps_fail(ctx, TPS_E_SHAPE, "%s: input scale '%s' has no weight beside it", ck->path,
                        s->name);
    if (!scale_fits(q, &ck->t[w], s, &k) || k != TPS_QS_TENSOR)
        return tps_fail(ctx, TPS_E_SHAPE, "%s: input scale '%s' must hold one value ([] or [1])",
                        ck->path, s->name);
    q->role[i] = TPS_QR_INPUT_SCALE;
    q->partner[i] = w;
    q->input[w] = (int)i;
    return TPS_OK;
}

/* Scale i of weight w, named with part p. */
static tps_err place_scale(tps_ctx *ctx, const tps_ckpt *ck, tps_quant *q, size_t i, int w,
                           size_t stem, const tps_qpart *p)
{
    const tps_ctensor *s = &ck->t[i];
    if (w < 0)
        return tps_fail(ctx, TPS_E_SHAPE, "%s: scale '%s' has no weight '%.*s.weight' beside it",
                        ck->path, s->name, (int)stem, s->name);
    const tps_ctensor *wt = &ck->t[w];
    if (!q->m->weight_dtype(wt->dtype))
        return tps_fail(ctx, TPS_E_SHAPE, "%s: scale '%s' belongs to '%s', which is %s, not an FP8 weight",
                        ck->path, s->name, wt->name, tps_dtype_name(wt->dtype));
    if (q->partner[w] >= 0)
        return tps_fail(ctx, TPS_E_SHAPE, "%s: weight '%s' has two scales", ck->path, wt->name);
    if (!tps_dtype_is_float(s->dtype) || tps_dtype_bits(s->dtype) < 8)
        return tps_fail(ctx, TPS_E_SHAPE, "%s: scale '%s' is %s, not a float dtype", ck->path,
                        s->name, tps_dtype_name(s->dtype));
    tps_qscale k;
    if (!scale_fits(q, wt, s, &k)) {
        char want[160];
        if (q->bn && wt->ndim == 3)
            snprintf(want, sizeof want, "[%llu, %llu, %llu] for blocks of %llu x %llu",
                     (unsigned long long)wt->shape[0],
                     (unsigned long long)((wt->shape[1] + q->bn - 1) / q->bn),
                     (unsigned long long)((wt->shape[2] + q->bk - 1) / q->bk),
                     (unsigned long long)q->bn, (unsigned long long)q->bk);
        else if (q->bn && wt->ndim == 2)
            snprintf(want, sizeof want, "[%llu, %llu] for blocks of %llu x %llu",
                     (unsigned long long)((wt->shape[0] + q->bn - 1) / q->bn),
                     (unsigned long long)((wt->shape[1] + q->bk - 1) / q->bk),
                     (unsigned long long)q->bn, (unsigned long long)q->bk);
        else
            snprintf(want, sizeof want, "[] or [1] (per tensor) or [%llu, 1] (per channel)",
                     wt->ndim ? (unsigned long long)wt->shape[0] : 0ULL);
        return tps_fail(ctx, TPS_E_SHAPE,
                        "%s: scale '%s' has shape of %d dims not matching its weight '%s' %s: "
                        "expected %s",
                        ck->path, s->name, s->ndim, wt->name,
                        wt->ndim == 2 ? "[out, in]" : wt->ndim == 3 ? "[experts, rows, columns]" : "",
                        want);
    }
    if (!(p->kinds >> k & 1u)) { /* the method names this kind otherwise */
        const char *named = "?";
        for (size_t j = q->m->nparts; j-- > 0;)
            if (q->m->parts[j].role == TPS_QR_SCALE && (q->m->parts[j].kinds >> k & 1u))
                named = q->m->parts[j].suffix + 1;
        return tps_fail(ctx, TPS_E_SHAPE, "%s: %s scale '%s': quant_method %s names them %s",
                        ck->path, tps_qscale_names[k], s->name, q->m->name, named);
    }
    q->role[i] = TPS_QR_SCALE;
    q->kind[i] = k;
    q->partner[i] = w;
    q->role[w] = TPS_QR_WEIGHT;
    q->partner[w] = (int)i;
    q->nquant++;
    return TPS_OK;
}

/* Codes of q->bits a word of dtype d holds. */
static uint64_t pack_of(const tps_quant *q, tps_dtype d)
{
    return (uint64_t)tps_dtype_bits(d) / (uint64_t)q->bits;
}

/* A packed method's part p of a weight of in x out features, its codes pf
 * to a word, should be [rows, cols]: as the part table says. */
static void packed_shape(const tps_quant *q, const tps_qpart *p, uint64_t in, uint64_t out,
                         uint64_t pf, uint64_t *rows, uint64_t *cols)
{
    uint64_t groups = q->group < 0 ? 1 : in / (uint64_t)q->group;
    uint64_t ni = p->in_by == 0 ? in : p->in_by == 1 ? groups : in / pf;
    uint64_t no = p->out_packed ? out / pf : out;
    *rows = q->m->transposed ? ni : no;
    *cols = q->m->transposed ? no : ni;
}

/* The input and output features a packed weight holds. */
static void packed_features(const tps_quant *q, const tps_qpart *wp, const tps_ctensor *wt,
                            uint64_t *in, uint64_t *out)
{
    uint64_t pf = pack_of(q, wt->dtype);
    uint64_t si = wt->shape[q->m->transposed ? 0 : 1], so = wt->shape[q->m->transposed ? 1 : 0];
    *in = si * (wp->in_by == 2 ? pf : 1);
    *out = so * (wp->out_packed ? pf : 1);
}

static const tps_qpart *weight_part(const tps_qmethod *m)
{
    for (size_t j = 0; j < m->nparts; j++)
        if (m->parts[j].role == TPS_QR_WEIGHT) return &m->parts[j];
    return NULL;
}

/* Every part method m stores beside weight w (stem: its name's length
 * without the weight suffix) is there, unless optional and the config says
 * none (symmetric codes); partner and zeros recorded. */
static tps_err bind_siblings(tps_ctx *ctx, const tps_ckpt *ck, tps_quant *q, size_t w, size_t stem)
{
    const tps_qmethod *m = q->m;
    const char *wn = ck->t[w].name;
    for (size_t j = 0; j < m->nparts; j++) {
        const tps_qpart *pj = &m->parts[j];
        if (pj->role == TPS_QR_WEIGHT) continue;
        char *pn = tps_asprintf("%.*s%s", (int)stem, wn, pj->suffix);
        if (!pn) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
        int k = tps_ckpt_find(ck, pn);
        tps_err rc = TPS_OK;
        /* a shard directory's source tensor its layout left out (listed) */
        int left_out = 0;
        for (const cJSON *d = ck->dropped ? ck->dropped->child : NULL; d && k < 0 && !left_out;
             d = d->next) {
            const cJSON *dn = cJSON_GetObjectItemCaseSensitive(d, "name");
            left_out = cJSON_IsString(dn) && !strcmp(dn->valuestring, pn);
        }
        if (k < 0 && !left_out && pj->role != TPS_QR_UNUSED && (!pj->optional || q->asym))
            rc = tps_fail(ctx, TPS_E_SHAPE, "%s: quantized weight '%s' has no '%s' beside it%s",
                          ck->path, wn, pn,
                          pj->optional ? ": the config says its codes are asymmetric"
                                       : ": it cannot be dequantized");
        else if (k >= 0 && pj->optional && !q->asym)
            rc = tps_fail(ctx, TPS_E_SHAPE,
                          "%s: tensor '%s': zero points beside codes the config says are "
                          "symmetric (quantization_config ... symmetric: true)",
                          ck->path, pn);
        free(pn);
        TPS_TRY(rc);
        if (k >= 0 && pj->role == TPS_QR_SCALE && !pj->per_tensor) q->partner[w] = k;
        if (k >= 0 && pj->role == TPS_QR_ZEROS) q->zeros[w] = k;
    }
    return TPS_OK;
}

/* The parts of a packed method (GPTQ, AWQ, compressed-tensors, NVFP4),
 * checked against its config: every X<weight_suffix> needs every part, each
 * of the shape and dtype the bits and the group size give; a part without
 * its weight is an error. */
static tps_err bind_packed(tps_ctx *ctx, const tps_ckpt *ck, tps_quant *q)
{
    const tps_qmethod *m = q->m;
    const tps_qpart *wp = weight_part(m);
    for (size_t i = 0; i < ck->n; i++) {
        const tps_ctensor *t = &ck->t[i];
        size_t stem;
        const tps_qpart *p = part_of(m, t->name, &stem);
        if (!p) {
            for (size_t j = 0; j < sizeof foreign_parts / sizeof foreign_parts[0]; j++)
                if (has_suffix(t->name, foreign_parts[j], &stem))
                    return tps_fail(ctx, TPS_E_REJECT,
                                    "%s: tensor '%s' is not a tensor of quant_method %s: a "
                                    "checkpoint of two methods is not supported",
                                    ck->path, t->name, m->name);
            continue;
        }
        char *wn = tps_asprintf("%.*s%s", (int)stem, t->name, m->weight_suffix);
        if (!wn) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
        int w = tps_ckpt_find(ck, wn);
        if (w < 0) {
            tps_err rc = tps_fail(ctx, TPS_E_SHAPE, "%s: tensor '%s' has no quantized weight "
                                  "'%s' beside it", ck->path, t->name, wn);
            free(wn);
            return rc;
        }
        free(wn);
        const tps_ctensor *wt = &ck->t[w];
        /* a method whose weight is X.weight (NVFP4): the unquantized ones are plain */
        if (p->role == TPS_QR_WEIGHT && !m->weight_dtype(t->dtype) && !strcmp(p->suffix, ".weight"))
            continue;
        if (wt->ndim != 2 || !m->weight_dtype(wt->dtype)) {
            const char *form = m->transposed ? (wp->in_by == 2 ? "[in / %llu, out]" : "[in, out / %llu]")
                                             : (wp->in_by == 2 ? "[out, in / %llu]" : "[out / %llu, in]");
            char shown[96];
            uint64_t pf = m->weight_dtype(wt->dtype) ? pack_of(q, wt->dtype) : 32u / (unsigned)q->bits;
            snprintf(shown, sizeof shown, form, (unsigned long long)pf);
            return tps_fail(ctx, TPS_E_SHAPE,
                            "%s: quantized weight '%s' is %s %d-D: quant_method %s stores it %s, "
                            "%d-bit codes packed in words",
                            ck->path, wt->name, tps_dtype_name(wt->dtype), wt->ndim, m->name,
                            shown, q->bits);
        }
        uint64_t in, out, pfw = pack_of(q, wt->dtype);
        packed_features(q, wp, wt, &in, &out);
        if (q->group > 0 && in % (uint64_t)q->group)
            return tps_fail(ctx, TPS_E_SHAPE,
                            "%s: quantized weight '%s' [%llu, %llu] holds %llu input features "
                            "(%llu output features, %d-bit codes, %llu to a word), which "
                            "quantization_config's group_size %lld does not divide",
                            ck->path, wt->name, (unsigned long long)wt->shape[0],
                            (unsigned long long)wt->shape[1], (unsigned long long)in,
                            (unsigned long long)out, q->bits, (unsigned long long)pfw,
                            (long long)q->group);
        if (p->role == TPS_QR_WEIGHT) {
            q->role[i] = TPS_QR_WEIGHT;
            q->nquant++;
            TPS_TRY(bind_siblings(ctx, ck, q, i, stem));
            continue;
        }
        /* the part's expected shape and dtype */
        int ok, dt_ok;
        char want[96];
        uint64_t pf = p->role == TPS_QR_ZEROS ? 32u / (unsigned)q->bits : pfw;
        if (p->role == TPS_QR_UNUSED) {
            ok = t->ndim == 1 && t->shape[0] == in;
            dt_ok = t->dtype == TPS_I32;
            snprintf(want, sizeof want, "I32 [%llu]", (unsigned long long)in);
        } else if (p->role == TPS_QR_SHAPE) {
            ok = t->ndim == 1 && t->shape[0] == 2;
            dt_ok = t->dtype == TPS_I64;
            snprintf(want, sizeof want, "I64 [2]");
        } else if (p->per_tensor) {
            ok = t->ndim <= 1 && (t->ndim == 0 || t->shape[0] == 1);
            dt_ok = t->dtype == TPS_F32;
            snprintf(want, sizeof want, "F32 [] or [1] (one value)");
        } else {
            uint64_t rows, cols;
            packed_shape(q, p, in, out, pf, &rows, &cols);
            ok = t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols &&
                 (!p->out_packed || out % pf == 0) && (p->in_by != 2 || in % pf == 0);
            dt_ok = p->role == TPS_QR_SCALE ? tps_dtype_is_float(t->dtype) : t->dtype == TPS_I32;
            snprintf(want, sizeof want, "%s [%llu, %llu]",
                     p->role == TPS_QR_SCALE ? "a float dtype" : "I32", (unsigned long long)rows,
                     (unsigned long long)cols);
        }
        if (!ok || !dt_ok) {
            char shown[96] = "";
            size_t o = 0;
            for (int d = 0; d < t->ndim && o < sizeof shown; d++)
                o += (size_t)snprintf(shown + o, sizeof shown - o, "%s%llu", d ? ", " : "",
                                      (unsigned long long)t->shape[d]);
            return tps_fail(ctx, TPS_E_SHAPE,
                            "%s: tensor '%s' is %s [%s], but its weight '%s' [%llu, %llu] holds "
                            "%llu x %llu features in %d-bit codes with group_size %lld, so it "
                            "must be %s",
                            ck->path, t->name, tps_dtype_name(t->dtype), shown, wt->name,
                            (unsigned long long)wt->shape[0], (unsigned long long)wt->shape[1],
                            (unsigned long long)out, (unsigned long long)in, q->bits,
                            (long long)q->group, want);
        }
        q->role[i] = p->role;
        q->partner[i] = w;
        if (p->role == TPS_QR_SCALE)
            q->kind[i] = p->per_tensor ? TPS_QS_TENSOR : q->group < 0 ? TPS_QS_CHANNEL : TPS_QS_GROUP;
    }
    return TPS_OK;
}

/* Every tensor that is a part of a quantized weight, given its role. */
static tps_err find_parts(tps_ctx *ctx, const tps_ckpt *ck, const cJSON *qc, tps_quant *q)
{
    for (size_t i = 0; i < ck->n; i++) {
        const tps_ctensor *s = &ck->t[i];
        size_t stem;
        const tps_qpart *p = part_of(q->m, s->name, &stem);
        if (!p && q->m && has_suffix(s->name, "_scale_inv", &stem)) {
            /* X_scale_inv beside a 3-D FP8 X (experts held whole: Gemma 4's
             * experts.gate_up_proj_scale_inv), the block scales' own part */
            char *xn = tps_asprintf("%.*s", (int)stem, s->name);
            if (!xn) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
            int x = tps_ckpt_find(ck, xn);
            free(xn);
            if (x >= 0 && ck->t[x].ndim == 3 && q->m->weight_dtype(ck->t[x].dtype)) {
                const tps_qpart *bp = NULL;
                for (size_t j = 0; j < q->m->nparts && !bp; j++)
                    if (q->m->parts[j].role == TPS_QR_SCALE &&
                        (q->m->parts[j].kinds >> TPS_QS_BLOCK & 1u))
                        bp = &q->m->parts[j];
                if (!qc)
                    return tps_fail(ctx, TPS_E_CONFIG,
                                    "%s: tensor '%s' is a quantization scale, but config.json has "
                                    "no quantization_config saying how it relates to its weight",
                                    ck->path, s->name);
                if (bp) {
                    TPS_TRY(place_scale(ctx, ck, q, i, x, stem, bp));
                    continue;
                }
            }
        }
        if (!p) {
            for (size_t j = 0; j < sizeof foreign_parts / sizeof foreign_parts[0]; j++)
                if (has_suffix(s->name, foreign_parts[j], &stem))
                    return tps_fail(ctx, TPS_E_REJECT,
                                    "%s: tensor '%s' is part of an integer-quantized layer: not "
                                    "supported yet (only FP8)",
                                    ck->path, s->name);
            continue;
        }
        if (!qc)
            return tps_fail(ctx, TPS_E_CONFIG,
                            "%s: tensor '%s' is a quantization scale, but config.json has no "
                            "quantization_config saying how it relates to its weight",
                            ck->path, s->name);
        char *wn = tps_asprintf("%.*s.weight", (int)stem, s->name);
        if (!wn) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
        int w = tps_ckpt_find(ck, wn);
        free(wn);
        if (p->role == TPS_QR_INPUT_SCALE) TPS_TRY(place_input(ctx, ck, q, i, w));
        else TPS_TRY(place_scale(ctx, ck, q, i, w, stem, p));
    }
    /* A quantized weight needs its scale (unquantized modules are not FP8). */
    for (size_t i = 0; qc && i < ck->n; i++) {
        size_t stem;
        if (q->m->weight_dtype(ck->t[i].dtype) && q->role[i] != TPS_QR_WEIGHT &&
            ck->t[i].ndim == 3 && !q->m->weight_suffix)
            return tps_fail(ctx, TPS_E_SHAPE,
                            "%s: FP8 expert tensor '%s' has no block scales beside it ('%s_scale_inv' "
                            "[experts, rows / %llu, columns / %llu]): it cannot be dequantized",
                            ck->path, ck->t[i].name, ck->t[i].name, (unsigned long long)q->bn,
                            (unsigned long long)q->bk);
        if (!q->m->weight_dtype(ck->t[i].dtype) || q->role[i] == TPS_QR_WEIGHT ||
            !has_suffix(ck->t[i].name, ".weight", &stem))
            continue;
        return tps_fail(ctx, TPS_E_SHAPE,
                        "%s: FP8 weight '%s' has no scale beside it ('%.*s.weight_scale_inv' or "
                        "'%.*s.weight_scale'): it cannot be dequantized",
                        ck->path, ck->t[i].name, (int)stem, ck->t[i].name, (int)stem, ck->t[i].name);
    }
    return TPS_OK;
}

tps_err tps_quant_open(tps_ctx *ctx, const tps_ckpt *ck, tps_quant **out)
{
    *out = NULL;
    tps_err rc = TPS_OK;
    const cJSON *qc = tps_config_get(ck->config, "quantization_config");
    tps_quant *q = tps_xcalloc(1, sizeof *q);
    if (!q) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    size_t n = ck->n ? ck->n : 1;
    q->role = tps_xcalloc(n, sizeof *q->role);
    q->partner = tps_xmalloc(n * sizeof *q->partner);
    q->input = tps_xmalloc(n * sizeof *q->input);
    q->kind = tps_xcalloc(n, sizeof *q->kind);
    q->zeros = tps_xmalloc(n * sizeof *q->zeros);
    TPS_FAIL_IF(!q->role || !q->partner || !q->input || !q->kind || !q->zeros, ctx, TPS_E_NOMEM,
                "out of memory");
    for (size_t i = 0; i < ck->n; i++) q->partner[i] = q->input[i] = q->zeros[i] = -1;
    if (qc) TPS_CHECK(method_of(ctx, ck, qc, q));
    if (q->m && q->m->bind) TPS_CHECK(q->m->bind(ctx, ck, q));
    else if (q->m && q->m->weight_suffix) TPS_CHECK(bind_packed(ctx, ck, q));
    else TPS_CHECK(find_parts(ctx, ck, qc, q));
    if (!qc) {
        tps_quant_free(q);
        q = NULL;
    }
out:
    if (rc) {
        tps_quant_free(q);
        q = NULL;
    }
    *out = q;
    return rc;
}

tps_err tps_ckpt_quantization(tps_ctx *ctx, const tps_ckpt *ck, tps_quant_view *v)
{
    memset(v, 0, sizeof *v);
    const cJSON *m =
        cJSON_GetObjectItemCaseSensitive(tps_config_get(ck->config, "quantization_config"),
                                         "quant_method");
    tps_quant *q = NULL;
    tps_err rc = tps_quant_open(ctx, ck, &q);
    if (rc == TPS_E_NOMEM) return rc;
    if (rc) { /* inspect shows what split would refuse, and why */
        v->method = cJSON_IsString(m) ? m->valuestring : "(unknown)";
        v->problem = tps_ctx_errmsg(ctx);
        return TPS_OK;
    }
    if (!q) return TPS_OK;
    v->method = q->method_name;
    if (q->m->weight_suffix) { /* packed: the serving layouts that load it write it */
        v->supported = 1;
        v->bits = q->bits;
        v->group_size = q->group;
        v->weights = q->nquant;
        for (size_t i = 0; i < ck->n; i++)
            if (q->role[i] == TPS_QR_SCALE) {
                if (q->kind[i] == TPS_QS_GROUP) v->group_scales++;
                else v->channel_scales++;
            }
        tps_quant_free(q);
        return TPS_OK;
    }
    v->supported = 1;
    v->block_rows = q->bn;
    v->block_cols = q->bk;
    v->weights = q->nquant;
    for (size_t i = 0; i < ck->n; i++) {
        if (q->role[i] == TPS_QR_INPUT_SCALE) v->input_scales++;
        if (q->role[i] != TPS_QR_SCALE) continue;
        if (q->kind[i] == TPS_QS_BLOCK) v->block_scales++;
        else if (q->kind[i] == TPS_QS_CHANNEL) v->channel_scales++;
        else v->tensor_scales++;
    }
    tps_quant_free(q);
    return TPS_OK;
}

const char *tps_quant_packed_reason(const tps_quant *q, const char *layout, const char *why)
{
    static _Thread_local char buf[512];
    if (layout)
        snprintf(buf, sizeof buf,
                 "quant_method %s (%d-bit codes packed in words, group_size %lld) is not "
                 "supported by layout %s: %s",
                 q->method_name, q->bits, (long long)q->group, layout,
                 why ? why : "the engine does not load it from files as the checkpoint stores it");
    else
        snprintf(buf, sizeof buf,
                 "quant_method %s (%d-bit codes packed in words, group_size %lld) is not "
                 "supported by layout dtensor: no DTensor consumer loads packed weights (split "
                 "with --layout vllm)",
                 q->method_name, q->bits, (long long)q->group);
    return buf;
}

tps_err tps_quant_serving_config(tps_ctx *ctx, const tps_ckpt *ck, const tps_quant *q,
                                 const char *text, char **out)
{
    *out = NULL;
    if (!q || (!q->m->module_list && !q->m->skip_list) || !text) return TPS_OK;
    cJSON *cfg = cJSON_Parse(text);
    cJSON *qc = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "quantization_config") : NULL;
    if (!cJSON_IsObject(qc)) {
        cJSON_Delete(cfg);
        return cfg ? TPS_OK : tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    }
    const char *key = q->m->module_list ? q->m->module_list : q->m->skip_list;
    const cJSON *have = cJSON_GetObjectItemCaseSensitive(qc, key);
    if (cJSON_IsArray(have) && cJSON_GetArraySize(have) > 0) {
        cJSON_Delete(cfg);
        return TPS_OK;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(qc, key);
    cJSON *list = cJSON_AddArrayToObject(qc, key);
    size_t sl = strlen(q->m->weight_suffix), stem;
    if (q->m->module_list) {
        for (size_t i = 0; list && i < ck->n; i++) {
            if (q->role[i] != TPS_QR_WEIGHT || !has_suffix(ck->t[i].name, q->m->weight_suffix, &stem))
                continue;
            char *m = tps_asprintf("%.*s", (int)(strlen(ck->t[i].name) - sl), ck->t[i].name);
            cJSON *x = m ? cJSON_CreateString(m) : NULL;
            free(m);
            if (!x || !cJSON_AddItemToArray(list, x)) {
                cJSON_Delete(x);
                list = NULL;
            }
        }
    } else {
        /* the modules (names but their last component, in name order) whose
         * every tensor is F16, BF16 or F32 */
        for (size_t i = 0; list && i < ck->n;) {
            const char *dot = strrchr(ck->t[i].name, '.');
            size_t ml = dot ? (size_t)(dot - ck->t[i].name) : strlen(ck->t[i].name);
            int floats = 1;
            size_t j = i;
            for (; j < ck->n && !strncmp(ck->t[j].name, ck->t[i].name, ml) &&
                   strrchr(ck->t[j].name, '.') == ck->t[j].name + ml;
                 j++) {
                tps_dtype d = ck->t[j].dtype;
                floats &= d == TPS_F16 || d == TPS_BF16 || d == TPS_F32;
            }
            if (j == i) j = i + 1;
            if (floats) {
                char *m = tps_asprintf("%.*s", (int)ml, ck->t[i].name);
                cJSON *x = m ? cJSON_CreateString(m) : NULL;
                free(m);
                if (!x || !cJSON_AddItemToArray(list, x)) {
                    cJSON_Delete(x);
                    list = NULL;
                }
            }
            i = j;
        }
    }
    *out = list ? cJSON_Print(cfg) : NULL;
    cJSON_Delete(cfg);
    if (!*out) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    char *nl = tps_asprintf("%s\n", *out);
    free(*out);
    *out = nl;
    return nl ? TPS_OK : tps_fail(ctx, TPS_E_NOMEM, "out of memory");
}
