/* manifest.c - the manifest a split writes, DIR/tpshard.json: its head
 * (format, plan, layout), the source, the untie record, the ranks written,
 * every planned rank file, every (tensor, rank) entry, the dropped tensors
 * and a serving layout's other rank tensors. A --ranks run that joins a
 * directory writes the entries of the ranks other runs wrote from their
 * manifest (E->prev), in the same order, so the directory ends with the
 * manifest one split would have written. */
#include "internal.h"
#include "split_int.h"
#include "model/provenance.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The manifest is streamed, one tensor a line: a tree of every (tensor,
 * rank) entry grew with tensors x tp (4.4 GB for a million tensors at tp 2). */
static void file_sink(void *user, const char *p, size_t n) { fwrite(p, 1, n, user); }

static void mw_str(FILE *f, const char *s) { tps_json_quote(s, file_sink, f); }

static void mw_json(FILE *f, const cJSON *item)
{
    char *t = item ? cJSON_PrintUnformatted(item) : NULL;
    fputs(t ? t : "{}", f);
    free(t);
}

static void mw_shape(FILE *f, const uint64_t *v, int n)
{
    fputc('[', f);
    for (int i = 0; i < n; i++) fprintf(f, "%s%llu", i ? "," : "", (unsigned long long)v[i]);
    fputc(']', f);
}

static const char *base_name(const char *p)
{
    const char *b = strrchr(p, '/');
    return b ? b + 1 : p;
}

/* Entries of ranks an earlier --ranks run wrote come from its manifest, but
 * are printed by the same code as ours, in the same order: a directory
 * filled by several runs gets the manifest one split would write. */

/* Name of rank r's file holding rank tensor k: its own when written here,
 * the earlier run's (prev, an entry with "file") for its ranks, else part
 * 0's name. */
static void mw_rank_file(const engine *E, FILE *f, size_t k, int r, const cJSON *prev)
{
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(prev, "file");
    if (E->slots[k].file >= 0)
        mw_str(f, base_name(E->files[E->slots[k].file].final));
    else if (cJSON_IsString(fn))
        mw_str(f, fn->valuestring);
    else {
        char nm[96];
        tps_rank_file_name(E->L->tp, E->L->pp, r, 0, nm, sizeof nm);
        mw_str(f, nm);
    }
}

typedef struct {
    const char *name;
    int rank, part;
    uint64_t bytes;
    int has_hdr;       /* an earlier --ranks run's entry may predate header CRCs */
    uint64_t hdr_bytes;
    uint32_t hdr_crc;
} fent;

static int fent_cmp(const void *a, const void *b)
{
    const fent *x = a, *y = b;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return x->part < y->part ? -1 : x->part > y->part;
}

/* The source tensors no rank file holds: those the layout left out (the
 * engine's load_weights skips them), after those a directory resharded here
 * had left out already, so merge names every tensor of the original source
 * it cannot give back. */
static void mw_dropped(const engine *E, FILE *f)
{
    const tps_ckpt *ck = E->ck;
    const tps_layout *L = E->L;
    int first = 1;
    for (const cJSON *e = ck->dropped ? ck->dropped->child : NULL; e; e = e->next) {
        fputs(first ? ",\n\"dropped\": [\n  " : ",\n  ", f);
        first = 0;
        mw_json(f, e);
    }
    for (size_t i = 0; i < ck->n; i++) {
        const char *why = tps_layout_dropped(L, i);
        if (!why) continue;
        const tps_ctensor *t = &ck->t[i];
        fputs(first ? ",\n\"dropped\": [\n  {\"name\": " : ",\n  {\"name\": ", f);
        first = 0;
        mw_str(f, t->name);
        fprintf(f, ", \"dtype\": \"%s\", \"shape\": ", tps_dtype_name(t->dtype));
        mw_shape(f, t->shape, t->ndim);
        fputs(", \"source_file\": ", f);
        mw_str(f, t->origin);
        fputs(", \"layout\": ", f);
        mw_str(f, tps_layout_name(L));
        fputs(", \"reason\": ", f);
        mw_str(f, why);
        fputc('}', f);
    }
    if (!first) fputs("\n]", f);
}
/* The size of source file `name`: its own, or (a reshard) what the source
 * directory's manifest records, so verify --source can tell another
 * checkpoint before it reads a byte. */
static int origin_bytes(const tps_ckpt *ck, const char *name, uint64_t *size)
{
    if (ck->kind != TPS_SRC_SHARDED) {
        for (size_t k = 0; k < ck->nfiles; k++)
            if (!strcmp(ck->files[k].name, name)) return *size = ck->files[k].size, 1;
        return 0;
    }
    const cJSON *sf = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(ck->manifest, "source"), "files");
    for (const cJSON *e = sf ? sf->child : NULL; e; e = e->next) {
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
        const cJSON *by = cJSON_GetObjectItemCaseSensitive(e, TPS_PROV_SOURCE_BYTES);
        if (cJSON_IsString(nm) && !strcmp(nm->valuestring, name) && cJSON_IsNumber(by) &&
            by->valuedouble >= 0)
            return *size = (uint64_t)by->valuedouble, 1;
    }
    return 0;
}

/* Format, version, tool, tp, the plan and a serving layout. */
static void mw_head(const engine *E, FILE *f, const char *plan_source)
{
    const tps_layout *L = E->L;
    fprintf(f, "{\n\"format\": \"tpshard\",\n\"version\": %d,\n\"tool\": \"tpshard " TPS_VERSION_STRING
               "\",\n\"tp\": %d,\n",
            L->spec ? TPS_MANIFEST_FORMAT_LAYOUT : TPS_MANIFEST_FORMAT, L->tp);
    if (L->pp > 1) {
        /* pipeline stages: rank w is stage w / tp; each stage's layers */
        fprintf(f, "\"pp\": %d,\n\"stages\": [", L->pp);
        for (int s = 0; s < L->pp; s++)
            fprintf(f, "%s{\"stage\": %d, \"layers\": [%d, %d], \"ranks\": [%d, %d]}",
                    s ? ", " : "", s, L->stage_first[s], L->stage_first[s] + L->stage_layers[s],
                    s * L->tp, (s + 1) * L->tp);
        fputs("],\n", f);
    }
    fputs("\"plan\": {\"name\": ", f);
    mw_str(f, tps_plan_name(L->plan));
    fputs(", \"source\": ", f);
    mw_str(f, plan_source);
    if (L->spec && L->plan && L->plan->text) { /* verify lays a serving layout out again */
        fputs(", \"text\": ", f);
        mw_str(f, L->plan->text);
    }
    fputs("},\n", f);
    if (L->spec) {
        fputs("\"layout\": {\"name\": ", f);
        mw_str(f, L->spec->name);
        fputs(", \"target\": ", f);
        mw_str(f, L->spec->target);
        fputs(", \"source\": ", f);
        mw_str(f, L->spec->label);
        fputs(", \"text\": ", f);
        mw_str(f, L->spec->text);
        if (L->ep) fputs(", \"ep\": true", f);
        /* the MXFP4 experts' shapes are this backend's (verify lays them out again) */
        const tps_moe_backend *mb = tps_layout_moe_backend(L);
        if (mb) {
            fputs(", \"moe_backend\": ", f);
            mw_str(f, mb->name);
        }
        fputs("},\n", f);
    }
}

/* The source: its kind, stem, index and files (metadata, header). */
static void mw_source(engine *E, FILE *f)
{
    const tps_ckpt *ck = E->ck;
    static const char *const kinds[] = {"file", "dir", "index", "sharded"};
    fputs("\"source\": {\"kind\": ", f);
    mw_str(f, kinds[ck->kind]);
    fputs(", \"stem\": ", f);
    mw_str(f, ck->stem);
    if (ck->index_name) {
        fputs(", \"index\": ", f);
        mw_str(f, ck->index_name);
    }
    if (ck->index_meta) {
        fputs(", \"index_metadata\": ", f);
        mw_json(f, ck->index_meta);
    }
    fputs(", \"files\": [", f);
    for (size_t i = 0; i < ck->norigins; i++) {
        fputs(i ? ",\n  {\"name\": " : "\n  {\"name\": ", f);
        mw_str(f, ck->origins[i]);
        uint64_t osz;
        if (origin_bytes(ck, ck->origins[i], &osz))
            fprintf(f, ", \"" TPS_PROV_SOURCE_BYTES "\": %llu", (unsigned long long)osz);
        fputs(", \"metadata\": ", f);
        mw_json(f, cJSON_GetObjectItemCaseSensitive(ck->origin_meta, ck->origins[i]));
        /* The original header, so merge gives back the file byte for byte
         * even when it was not written in the reference layout. */
        const cJSON *hd = cJSON_GetObjectItemCaseSensitive(ck->origin_header, ck->origins[i]);
        if (cJSON_IsString(hd)) {
            fputs(", \"header\": ", f);
            mw_str(f, hd->valuestring);
        }
        for (size_t k = 0; !hd && ck->kind != TPS_SRC_SHARDED && k < ck->nfiles; k++) {
            /* let go (tps_ckpt_release_headers): read again from the file */
            if (strcmp(ck->files[k].name, ck->origins[i]) || ck->files[k].st->raw) continue;
            char *raw = NULL;
            tps_err rc = tps_ckpt_file_header(E->ctx, ck, k, &raw);
            if (rc && !E->mw_rc) E->mw_rc = rc;
            if (raw) {
                fputs(", \"header\": ", f);
                mw_str(f, raw);
            }
            free(raw);
            break;
        }
        fputc('}', f);
    }
    fputs("]},\n", f);
}

static void mw_untie(const engine *E, FILE *f)
{
    const tps_ckpt *ck = E->ck;
    if (E->config_written && !ck->untie_head && ck->config_text) {
        /* the config.json beside the rank files is not the source's: merge
         * gives back this one */
        fputs("\"config_rewritten\": ", f);
        mw_str(f, E->config_why);
        fputs(",\n\"source_config\": ", f);
        mw_str(f, ck->config_text);
        fputs(",\n", f);
    }
    const char *pf;
    uint64_t pfrom, pto;
    int any = 0;
    for (int k = 0; k < 2; k++) {
        if (!tps_layout_padding(E->L, k, &pf, &pfrom, &pto)) continue;
        fprintf(f, "%s\"%s\": {\"field\": \"%s\", \"from\": %llu, \"to\": %llu}",
                any ? ", " : "\"pad_intermediate\": {", k ? "experts" : "mlp", pf,
                (unsigned long long)pfrom, (unsigned long long)pto);
        any = 1;
    }
    if (any) fputs("},\n", f);
    if (ck->untie_head) {
        /* --untie: the head is the embedding's bytes, and config.json was
         * rewritten; merge gives back this original config.json. */
        fputs("\"untie\": {\"head\": ", f);
        mw_str(f, ck->untie_head);
        fputs(", \"embedding\": ", f);
        mw_str(f, ck->untie_embedding);
        fputs(", \"config\": ", f);
        mw_str(f, ck->untie_config ? ck->untie_config : "");
        fputs("},\n", f);
    }
}

static void mw_ranks_written(const engine *E, FILE *f, const unsigned char *theirs)
{
    fputs("\"ranks_written\": [", f);
    int first = 1;
    for (int r = 0; r < E->nranks; r++)
        if (E->write[r] || theirs[r]) {
            fprintf(f, "%s%d", first ? "" : ", ", r);
            first = 0;
        }
    fputs("],\n", f);
}

/* Every planned rank file, written or not, so a directory filled by
 * several --ranks runs can be checked for what is missing. */
static void mw_files(const engine *E, FILE *f, const unsigned char *theirs)
{
    fputs("\"files\": [", f);
    const cJSON *pfiles = cJSON_GetObjectItemCaseSensitive(E->prev, "files");
    size_t nf = E->nfiles + (size_t)cJSON_GetArraySize(pfiles);
    fent *fe = tps_xcalloc(nf ? nf : 1, sizeof *fe);
    size_t m = 0;
    for (size_t i = 0; fe && i < E->nfiles; i++)
        fe[m++] = (fent){base_name(E->files[i].final), E->files[i].rank, E->files[i].part,
                         E->files[i].size, 1, E->files[i].hdr_len, E->files[i].hdr_crc};
    for (const cJSON *pf = pfiles ? pfiles->child : NULL; fe && pf; pf = pf->next) {
        const cJSON *rk = cJSON_GetObjectItemCaseSensitive(pf, "rank");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(pf, "name");
        const cJSON *pt = cJSON_GetObjectItemCaseSensitive(pf, "part");
        const cJSON *by = cJSON_GetObjectItemCaseSensitive(pf, "bytes");
        if (!cJSON_IsNumber(rk) || rk->valueint < 0 || rk->valueint >= E->nranks || !theirs[rk->valueint] ||
            !cJSON_IsString(nm) || !cJSON_IsNumber(pt) || !cJSON_IsNumber(by))
            continue;
        const cJSON *hb = cJSON_GetObjectItemCaseSensitive(pf, TPS_PROV_HEADER_BYTES);
        const cJSON *hc = cJSON_GetObjectItemCaseSensitive(pf, TPS_PROV_HEADER_CRC);
        int hh = cJSON_IsNumber(hb) && cJSON_IsNumber(hc);
        fe[m++] = (fent){nm->valuestring, rk->valueint, pt->valueint, (uint64_t)by->valuedouble, hh,
                         hh ? (uint64_t)hb->valuedouble : 0, hh ? (uint32_t)hc->valuedouble : 0};
    }
    if (fe) qsort(fe, m, sizeof *fe, fent_cmp);
    for (size_t i = 0; i < m; i++) {
        fputs(i ? ",\n  {\"name\": " : "\n  {\"name\": ", f);
        mw_str(f, fe[i].name);
        fprintf(f, ", \"rank\": %d, \"part\": %d, \"bytes\": %llu", fe[i].rank, fe[i].part,
                (unsigned long long)fe[i].bytes);
        if (E->L->pp > 1) { /* the worker's stage, tp rank and layers */
            int s = fe[i].rank / E->L->tp;
            fprintf(f, ", \"stage\": %d, \"tp_rank\": %d, \"layers\": [%d, %d]", s,
                    fe[i].rank % E->L->tp, E->L->stage_first[s],
                    E->L->stage_first[s] + E->L->stage_layers[s]);
        }
        if (fe[i].has_hdr)
            fprintf(f, ", \"" TPS_PROV_HEADER_BYTES "\": %llu, \"" TPS_PROV_HEADER_CRC "\": %u",
                    (unsigned long long)fe[i].hdr_bytes, (unsigned)fe[i].hdr_crc);
        fputc('}', f);
    }
    free(fe);
    fputs("],\n", f);
}

/* Piece pi of tensor t: its ranks[] entry (first: the array's first). */
static void mw_tensor_rank(const engine *E, FILE *f, const tps_ctensor *t, size_t pi,
                           const cJSON *pranks, const unsigned char *theirs, int first)
{
    const tps_layout *L = E->L;
    const tps_lpiece *p = &L->pieces[pi];
    const tps_region *g = &L->regions[p->region];
    size_t rk = (size_t)E->piece_rt[pi];
    const tps_rtensor *rt = &L->rt[rk];
    /* an earlier run's entry of this piece: same rank, rows and place */
    const cJSON *pe = NULL;
    for (const cJSON *e = theirs[p->rank] && pranks ? pranks->child : NULL; e && !pe;
         e = e->next) {
        const cJSON *er = cJSON_GetObjectItemCaseSensitive(e, "rank");
        const cJSON *eo = cJSON_GetObjectItemCaseSensitive(e, "offset");
        const cJSON *ea = cJSON_GetObjectItemCaseSensitive(e, "at");
        if (cJSON_IsNumber(er) && er->valueint == p->rank && cJSON_IsNumber(eo) &&
            (uint64_t)eo->valuedouble == g->lo &&
            (ea ? cJSON_IsNumber(ea) && (uint64_t)ea->valuedouble == p->at : p->at == 0))
            pe = e;
    }
    uint64_t ls[TPS_MAX_DIMS];
    tps_shape_get(ls, t);
    if (g->dim >= 0) ls[g->dim] = g->hi - g->lo;
    fprintf(f, "%s{\"rank\": %d, \"file\": ", first ? "" : ", ", p->rank);
    mw_rank_file(E, f, rk, p->rank, pe);
    if (strcmp(rt->name, t->name)) {
        fputs(", \"tensor\": ", f);
        mw_str(f, rt->name);
    }
    if (p->at) fprintf(f, ", \"at\": %llu", (unsigned long long)p->at);
    if (p->run)
        fprintf(f, ", \"run\": %u, \"stride\": %llu", (unsigned)p->run,
                (unsigned long long)tps_piece_stride(rt, p));
    if (rt->dtype != t->dtype) fprintf(f, ", \"dtype\": \"%s\"", tps_dtype_name(rt->dtype));
    fputs(", \"shape\": ", f);
    mw_shape(f, ls, t->ndim);
    fprintf(f, ", \"offset\": %llu, \"nbytes\": %llu", (unsigned long long)g->lo,
            (unsigned long long)p->nbytes);
    /* dim -1: every piece is the whole tensor, copies by definition */
    if (p->replica && g->dim >= 0) fputs(", \"replica\": true", f);
    if (p->xf && L->xforms[p->xf - 1].tr) {
        fputs(", \"transpose\": true", f);
    } else if (p->xf) {
        const tps_xform *x = &L->xforms[p->xf - 1];
        fprintf(f, ", \"refine\": [%u, %u, %llu, %llu]", x->rep_n, x->rep_k,
                (unsigned long long)x->skip, (unsigned long long)x->out);
    }
    const cJSON *pc = cJSON_GetObjectItemCaseSensitive(pe, "crc32");
    if (E->slots[rk].file >= 0)
        fprintf(f, ", \"crc32\": %u", (unsigned)E->region_crc[p->region]);
    else if (cJSON_IsNumber(pc))
        fprintf(f, ", \"crc32\": %.0f", pc->valuedouble);
    fputc('}', f);
}

/* Tensor ti's entry up to its ranks[] (d: its placement's dim). */
static void mw_tensor_head(const engine *E, FILE *f, size_t ti, int d, int first)
{
    const tps_ctensor *t = &E->ck->t[ti];
    const tps_layout *L = E->L;
    fputs(first ? "\n  {\"name\": " : ",\n  {\"name\": ", f);
    mw_str(f, t->name);
    fprintf(f, ", \"dtype\": \"%s\", \"shape\": ", tps_dtype_name(t->dtype));
    mw_shape(f, t->shape, t->ndim);
    fprintf(f, ", \"style\": \"%s\", \"placement\": ", tps_style_name(L->p[ti].style));
    if (d >= 0) fprintf(f, "\"Shard(%d)\"", d);
    else fputs("\"Replicate\"", f);
    fprintf(f, ", \"dim\": %d", d);
    if (L->p[ti].rule) {
        fputs(", \"rule\": ", f);
        mw_str(f, L->p[ti].rule);
    }
    fputs(", \"source_file\": ", f);
    mw_str(f, t->origin);
    if (t->derived_from) {
        fputs(", \"derived_from\": ", f);
        mw_str(f, t->derived_from);
    }
    fputs(", \"ranks\": [", f);
}

/* The passes' lines, one from each in turn (tps_sp_fragment wrote them):
 * sep between those that are not empty; 0, or -1 when one ended early. */
static int mw_pass_lines(tps_sp_frags *fr, FILE *f, const char *sep, const char *sep0,
                         int *first)
{
    for (int g = 0; g < fr->n; g++) {
        ssize_t n = getline(&fr->line, &fr->cap, fr->tens[g]);
        if (n <= 0 || fr->line[n - 1] != '\n') return -1;
        if (n == 1) continue;
        fputs(*first ? sep0 : sep, f);
        fwrite(fr->line, 1, (size_t)n - 1, f);
        *first = 0;
    }
    return 0;
}

static void mw_tensors(const engine *E, FILE *f, const unsigned char *theirs)
{
    const tps_ckpt *ck = E->ck;
    const tps_layout *L = E->L;
    fputs("\"tensors\": [", f);
    if (E->frags) { /* a split in passes: each tensor's entries from every pass */
        tps_sp_frags *fr = E->frags;
        for (int g = 0; g < fr->n; g++) rewind(fr->tens[g]);
        int firstt = 1;
        for (size_t ti = 0; ti < ck->n; ti++) {
            if (tps_layout_dropped(L, ti)) continue;
            mw_tensor_head(E, f, ti, fr->dims[ti], firstt);
            firstt = 0;
            int firstp = 1;
            if (mw_pass_lines(fr, f, ", ", "", &firstp)) fr->bad = 1;
            fputs("]}", f);
        }
        fputs("\n]", f);
        return;
    }
    /* the earlier runs' tensors, one at a time from the text, in the same order
     * (joinable() made sure) */
    const cJSON *ptensors = cJSON_GetObjectItemCaseSensitive(E->prev, "tensors");
    tps_js_iter it = {0};
    if (ptensors) tps_js_iter_start(&it, &E->prev_sp[0], ptensors, "tensors");
    int firstt = 1;
    for (size_t ti = 0; ti < ck->n; ti++) {
        const tps_ctensor *t = &ck->t[ti];
        if (tps_layout_dropped(L, ti)) continue; /* listed under "dropped" below */
        size_t p0 = L->src_piece0[ti], p1 = L->src_piece0[ti + 1];
        int d = L->regions[L->pieces[L->src_pieces[p0]].region].dim;
        mw_tensor_head(E, f, ti, d, firstt);
        firstt = 0;
        const cJSON *pt = NULL;
        if (ptensors && tps_js_iter_next(E->ctx, TPS_MANIFEST, &it, &pt) != TPS_OK) pt = NULL;
        const cJSON *pranks = cJSON_GetObjectItemCaseSensitive(pt, "ranks");
        int firstp = 1;
        for (size_t k = p0; k < p1; k++) {
            mw_tensor_rank(E, f, t, L->src_pieces[k], pranks, theirs, firstp);
            firstp = 0;
        }
        fputs("]}", f);
    }
    tps_js_iter_free(&it);
    fputs("\n]", f);
}

static int rt_entry_is(const cJSON *e, int r, const char *name)
{
    const cJSON *rk = cJSON_GetObjectItemCaseSensitive(e, "rank");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, "name");
    return cJSON_IsNumber(rk) && rk->valueint == r && cJSON_IsString(v) && !strcmp(v->valuestring, name);
}

/* The earlier runs' rank_tensors entry (it: over prts, their text) for rank
 * r's rank tensor `name`, the next in rank_tensors order: every rank tensor
 * takes one step, and one of theirs (want) takes the element there, or, out
 * of step, the one found from the start. Lives until the next call. */
static const cJSON *prev_rank_tensor(const engine *E, tps_js_iter *it, const cJSON *prts, int r,
                                     const char *name, int want)
{
    const cJSON *e = NULL;
    if (!prts) return NULL;
    if (tps_js_iter_next(E->ctx, TPS_MANIFEST, it, &e) != TPS_OK) e = NULL;
    if (!want) return NULL;
    if (e && rt_entry_is(e, r, name)) return e;
    tps_js_iter_start(it, &E->prev_sp[1], prts, "rank_tensors");
    for (;;) {
        if (tps_js_iter_next(E->ctx, TPS_MANIFEST, it, &e) != TPS_OK || !e) return NULL;
        if (rt_entry_is(e, r, name)) return e;
    }
}

/* Rank tensor k of rank r: its rank_tensors entry from its "rank" on. */
static void mw_rank_tensor(const engine *E, FILE *f, size_t k, int r, const cJSON *prev)
{
    const tps_ckpt *ck = E->ck;
    const tps_layout *L = E->L;
    const tps_rtensor *rt = &L->rt[k];
    fprintf(f, "{\"rank\": %d, \"name\": ", r);
    mw_str(f, rt->name);
    fputs(", \"file\": ", f);
    mw_rank_file(E, f, k, r, prev);
    fprintf(f, ", \"dtype\": \"%s\", \"shape\": ", tps_dtype_name(rt->dtype));
    mw_shape(f, rt->shape, rt->ndim);
    fprintf(f, ", \"nbytes\": %llu, \"pieces\": [", (unsigned long long)rt->nbytes);
    for (size_t j = 0; j < rt->npieces; j++) {
        const tps_lpiece *p = &L->pieces[rt->piece0 + j];
        fprintf(f, "%s{\"at\": %llu, \"nbytes\": %llu, ", j ? ", " : "",
                (unsigned long long)p->at, (unsigned long long)p->nbytes);
        if (p->run)
            fprintf(f, "\"run\": %u, \"stride\": %llu, ", (unsigned)p->run,
                    (unsigned long long)tps_piece_stride(rt, p));
        if (p->kind == TPS_PK_SRC) {
            fputs("\"source\": ", f);
            mw_str(f, ck->t[L->regions[p->region].src].name);
        } else if (p->kind == TPS_PK_ZERO) {
            fputs("\"zeros\": true", f);
        } else {
            fprintf(f, "\"value\": %.17g", p->value);
        }
        fputc('}', f);
    }
    fputs("]}", f);
}

static void mw_rank_tensors(const engine *E, FILE *f, const unsigned char *theirs)
{
    const tps_layout *L = E->L;
    if (!L->spec) return;
    /* Rank tensors that are not one source tensor's piece under its own
     * name: what each of their bytes is, so check can account for all. */
    fputs(",\n\"rank_tensors\": [", f);
    int first = 1;
    if (E->frags) { /* a split in passes: each pass's, in rank order */
        tps_sp_frags *fr = E->frags;
        for (int g = 0; g < fr->n; g++) {
            rewind(fr->rts[g]);
            ssize_t n;
            while ((n = getline(&fr->line, &fr->cap, fr->rts[g])) > 0) {
                if (fr->line[n - 1] != '\n') {
                    fr->bad = 1;
                    break;
                }
                fputs(first ? "\n  " : ",\n  ", f);
                first = 0;
                fwrite(fr->line, 1, (size_t)n - 1, f);
            }
            if (ferror(fr->rts[g])) fr->bad = 1;
        }
        fputs("\n]", f);
        return;
    }
    const cJSON *prts = cJSON_GetObjectItemCaseSensitive(E->prev, "rank_tensors");
    tps_js_iter it = {0};
    if (prts) tps_js_iter_start(&it, &E->prev_sp[1], prts, "rank_tensors");
    for (int r = 0; r < E->nranks; r++) {
        for (size_t k = L->rank_rt[r]; k < L->rank_rt[r + 1]; k++) {
            if (L->rt[k].simple) continue;
            fputs(first ? "\n  " : ",\n  ", f);
            first = 0;
            mw_rank_tensor(E, f, k, r, prev_rank_tensor(E, &it, prts, r, L->rt[k].name, theirs[r]));
        }
    }
    tps_js_iter_free(&it);
    fputs("\n]", f);
}

/* One pass of a split in passes (E: its engine, its ranks' layout): pass
 * g's line of entries for every tensor the manifest lists (empty where its
 * ranks hold none), its ranks' rank_tensors entries, and each tensor's dim
 * from the first pass that places it. */
tps_err tps_sp_fragment(engine *E, tps_sp_frags *fr, int g)
{
    const tps_ckpt *ck = E->ck;
    const tps_layout *L = E->L;
    const unsigned char *none = fr->none;
    FILE *tf = fr->tens[g], *rf = fr->rts[g];
    for (size_t ti = 0; ti < ck->n; ti++) {
        if (tps_layout_dropped(L, ti)) continue;
        size_t p0 = L->src_piece0[ti], p1 = L->src_piece0[ti + 1];
        if (p1 > p0 && fr->dims[ti] == -2)
            fr->dims[ti] = (signed char)L->regions[L->pieces[L->src_pieces[p0]].region].dim;
        for (size_t k = p0; k < p1; k++)
            mw_tensor_rank(E, tf, &ck->t[ti], L->src_pieces[k], NULL, none, k == p0);
        fputc('\n', tf);
    }
    for (int r = 0; L->spec && r < E->nranks; r++)
        for (size_t k = L->rank_rt[r]; k < L->rank_rt[r + 1]; k++) {
            if (L->rt[k].simple) continue;
            mw_rank_tensor(E, rf, k, r, NULL);
            fputc('\n', rf);
        }
    if (ferror(tf) || ferror(rf) || fflush(tf) || fflush(rf))
        return tps_fail(E->ctx, errno == ENOSPC ? TPS_E_NOSPACE : TPS_E_IO,
                        "%s: writing the manifest's entries failed: %s", E->files ? E->files[0].final : "output",
                        strerror(errno ? errno : EIO));
    return TPS_OK;
}

static void mw_body(engine *E, FILE *f, const char *plan_source, const unsigned char *theirs)
{
    mw_head(E, f, plan_source);
    mw_source(E, f);
    mw_untie(E, f);
    mw_ranks_written(E, f, theirs);
    mw_files(E, f, theirs);
    mw_tensors(E, f, theirs);
    mw_dropped(E, f);
    mw_rank_tensors(E, f, theirs);
    fputs("\n}\n", f);
}

tps_err tps_sp_write_manifest(engine *E, const tps_split_opts *o, const char *plan_source)
{
    tps_ctx *ctx = E->ctx;
    tps_err rc = TPS_OK;
    /* Ranks earlier --ranks runs wrote here (joining): their entries stay. */
    unsigned char *theirs = tps_xcalloc((size_t)E->nranks, 1);
    char *path = tps_path_join(o->out_dir, TPS_MANIFEST);
    char *tmp = path ? tps_tmp_name(path) : NULL;
    FILE *f = NULL;
    TPS_FAIL_IF(!theirs || !path || !tmp, ctx, TPS_E_NOMEM, "out of memory");
    const cJSON *pw = cJSON_GetObjectItemCaseSensitive(E->prev, "ranks_written");
    for (const cJSON *r = pw ? pw->child : NULL; r; r = r->next)
        if (cJSON_IsNumber(r) && r->valueint >= 0 && r->valueint < E->nranks && !E->write[r->valueint])
            theirs[r->valueint] = 1;
    f = fopen(tmp, "we");
    TPS_FAIL_IF(!f, ctx, TPS_E_IO, "%s: cannot create: %s", tmp, strerror(errno));
    setvbuf(f, NULL, _IOFBF, 1 << 20);
    mw_body(E, f, plan_source, theirs);
    int werr = ferror(f) || fflush(f) != 0 ? errno : 0;
    if (!werr && E->frags && E->frags->bad) werr = EIO; /* a pass's entries did not read back */
    if (E->mw_rc) { /* a source header that changed: its message says */
        rc = E->mw_rc;
        goto out;
    }
    if (!werr && fsync(fileno(f)) != 0) werr = errno;
    if (fclose(f) != 0 && !werr) werr = errno;
    f = NULL;
    if (werr) {
        rc = tps_fail(ctx, werr == ENOSPC || werr == EFBIG ? TPS_E_NOSPACE : TPS_E_IO,
                      "%s: writing the manifest failed: %s", path, strerror(werr ? werr : EIO));
        goto out;
    }
    TPS_FAIL_IF(rename(tmp, path) != 0, ctx, TPS_E_IO, "%s: rename: %s", path, strerror(errno));
out:
    if (f) fclose(f);
    if (rc && tmp) unlink(tmp);
    free(theirs);
    free(path);
    free(tmp);
    return rc;
}
