/* ckpt_sharded.c - opening a tpshard output directory as the checkpoint it
 * was split from, through its manifest: the manifest read (its two long
 * arrays one element at a time), its head, source description and rank
 * files checked, every (tensor, rank) entry made a piece of its tensor and
 * checked against the rank file holding it, a serving layout's other rank
 * tensors, the untie record, and no rank-file tensor the manifest does not
 * account for. */
#include "internal.h"
#include "model_int.h"
#include "provenance.h"

#include <stdlib.h>
#include <string.h>

static int json_u64(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= 9007199254740992.0 ||
        v->valuedouble != (double)(uint64_t)v->valuedouble)
        return 0;
    *out = (uint64_t)v->valuedouble;
    return 1;
}

static int json_shape(const cJSON *a, uint64_t *shape, int *ndim)
{
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) > TPS_MAX_DIMS) return 0;
    int n = 0;
    for (const cJSON *d = a->child; d; d = d->next)
        if (!json_u64(d, &shape[n++])) return 0;
    *ndim = n;
    return 1;
}

static int cmp_info_name(const void *a, const void *b, void *st_)
{
    const tps_st *st = st_;
    return strcmp(st->t[*(const uint32_t *)a].name, st->t[*(const uint32_t *)b].name);
}

/* Rank files are searched once per (tensor, rank): by name, in log time. */
tps_err tps_cfile_index(tps_ctx *ctx, tps_cfile *f)
{
    if (f->st->n > UINT32_MAX) return tps_fail(ctx, TPS_E_FORMAT, "%s: over 2^32 tensors", f->st->path);
    f->byname = tps_xmalloc((f->st->n ? f->st->n : 1) * sizeof *f->byname);
    if (!f->byname) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    for (size_t k = 0; k < f->st->n; k++) f->byname[k] = (uint32_t)k;
    if (f->st->n > 1) qsort_r(f->byname, f->st->n, sizeof *f->byname, cmp_info_name, f->st);
    return TPS_OK;
}

const tps_st_tensor_info *tps_cfile_find(const tps_cfile *f, const char *name)
{
    size_t lo = 0, hi = f->st->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const tps_st_tensor_info *si = &f->st->t[f->byname[mid]];
        int c = strcmp(si->name, name);
        if (c == 0) return si;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* The manifest's untie record and the head it names: the head is derived
 * from an embedding of the same dtype and shape, and nothing else is. */
static tps_err read_untie(tps_ctx *ctx, tps_ckpt *ck, const char *mpath)
{
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(ck->manifest, "untie");
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(u, "head");
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(u, "embedding");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(u, "config");
    if (u && (!cJSON_IsObject(u) || !cJSON_IsString(h) || !cJSON_IsString(e) ||
              !cJSON_IsString(c)))
        return tps_fail(ctx, TPS_E_JSON,
                        "%s: untie must be {\"head\", \"embedding\", \"config\"} strings", mpath);
    for (size_t i = 0; i < ck->n; i++) {
        const tps_ctensor *t = &ck->t[i];
        if (!t->derived_from) continue;
        if (!u || strcmp(t->name, h->valuestring) || strcmp(t->derived_from, e->valuestring))
            return tps_fail(ctx, TPS_E_JSON,
                            "%s: tensor '%s' is derived from '%s' but the untie record does not "
                            "say so",
                            mpath, t->name, t->derived_from);
    }
    if (!u) {
        /* a config.json rewritten for the engine: merge gives back the source's */
        const cJSON *sc = cJSON_GetObjectItemCaseSensitive(ck->manifest, "source_config");
        if (sc && !cJSON_IsString(sc))
            return tps_fail(ctx, TPS_E_JSON, "%s: source_config must be a string", mpath);
        if (sc && !(ck->untie_config = tps_strdup(sc->valuestring)))
            return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
        /* --pad-intermediate: the source tensors are the unpadded model's,
         * which the source's config describes */
        const cJSON *pad = cJSON_GetObjectItemCaseSensitive(ck->manifest, "pad_intermediate");
        if (pad) {
            if (!cJSON_IsObject(pad) || !sc)
                return tps_fail(ctx, TPS_E_JSON, "%s: pad_intermediate needs an object and the "
                                "source_config", mpath);
            ck->pad_intermediate = 1; /* tps_ckpt_open reads the source_config */
        }
        return TPS_OK;
    }
    int hi = tps_ckpt_find(ck, h->valuestring), ei = tps_ckpt_find(ck, e->valuestring);
    if (hi < 0 || ei < 0 || !ck->t[hi].derived_from)
        return tps_fail(ctx, TPS_E_JSON,
                        "%s: untie names head '%s' and embedding '%s', but the tensors do not "
                        "match (both listed, the head with derived_from)",
                        mpath, h->valuestring, e->valuestring);
    const tps_ctensor *ht = &ck->t[hi], *et = &ck->t[ei];
    int same = ht->dtype == et->dtype && ht->ndim == et->ndim;
    for (int d = 0; same && d < ht->ndim; d++) same = ht->shape[d] == et->shape[d];
    if (!same)
        return tps_fail(ctx, TPS_E_MISMATCH,
                        "%s: untied head '%s' differs in dtype or shape from '%s', the embedding "
                        "it was written from",
                        mpath, ht->name, et->name);
    ck->untie_head = tps_strdup(h->valuestring);
    ck->untie_embedding = tps_strdup(e->valuestring);
    ck->untie_config = tps_strdup(c->valuestring);
    if (!ck->untie_head || !ck->untie_embedding || !ck->untie_config)
        return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    return TPS_OK;
}

static uint64_t str_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* Where s is, or goes, in ck's set of kept strings. */
static const char **str_slot(const char **set, size_t cap, const char *s, uint64_t h)
{
    for (size_t i = (size_t)h & (cap - 1);; i = (i + 1) & (cap - 1))
        if (!set[i] || !strcmp(set[i], s)) return &set[i];
}

/* A copy of s that lives as long as ck: one copy of each string, however
 * often the manifest repeats it (the tree of each manifest element read is
 * freed before the next, tps_js_iter_next). */
static const char *ck_keep(tps_ckpt *ck, const char *s)
{
    if (!s) return NULL;
    uint64_t h = str_hash(s);
    if (ck->cap_str_set) {
        const char **at = str_slot(ck->str_set, ck->cap_str_set, s, h);
        if (*at) return *at;
    }
    if (2 * (ck->nstr_set + 1) > ck->cap_str_set) {
        size_t cap = ck->cap_str_set ? 2 * ck->cap_str_set : 1024;
        const char **set = calloc(cap, sizeof *set);
        if (!set) return NULL;
        for (size_t i = 0; i < ck->cap_str_set; i++)
            if (ck->str_set[i]) *str_slot(set, cap, ck->str_set[i], str_hash(ck->str_set[i])) = ck->str_set[i];
        free(ck->str_set);
        ck->str_set = set;
        ck->cap_str_set = cap;
    }
    const char *d = tps_str_keep(&ck->strs, s);
    if (!d) return NULL;
    *str_slot(ck->str_set, ck->cap_str_set, d, h) = d;
    ck->nstr_set++;
    return d;
}

/* A rank file's tensor names, each kept once in ck's string set: every rank
 * file of a DeepSeek-V3-shaped dtensor split names the same 92k tensors
 * (39 MB of copies for 8 ranks). On failure the names not kept yet go, and
 * the table still borrows them all ("" for those). */
static tps_err keep_names(tps_ctx *ctx, tps_ckpt *ck, tps_st *st)
{
    tps_err rc = TPS_OK;
    st->names_kept = 1;
    for (size_t k = 0; k < st->n; k++) {
        const char *kept = rc ? NULL : ck_keep(ck, st->t[k].name);
        if (!kept && !rc) rc = tps_fail(ctx, TPS_E_NOMEM, "out of memory");
        free(st->t[k].name);
        st->t[k].name = (char *)(kept ? kept : "");
    }
    return rc;
}

/* What reading one manifest keeps from one part to the next. */
typedef struct {
    const char *mpath;
    int v2;          /* a version 2 manifest: a serving layout's */
    tps_js_span sp[2]; /* the text of tensors and rank_tensors (b NULL: read from the tree) */
    tps_js_iter it;
    /* The files of each rank, so a lookup scans only that rank's parts:
     * rank r's are rank_files[rank_start[r] .. rank_start[r + 1]). */
    size_t *rank_files, *rank_start;
    unsigned char **seen; /* [file][tensor]: the manifest accounts for it */
    tps_fill *tmp;        /* one rank tensor's fills as read, before they are matched */
    size_t cap_tmp;
} shard_rd;

/* pp (absent: 1, as every manifest before pipeline stages) and, with pp > 1,
 * the stages' layers: consecutive from layer 0, none empty. */
static tps_err read_stages(tps_ctx *ctx, tps_ckpt *ck, const char *mpath)
{
    const cJSON *m = ck->manifest;
    tps_err rc = TPS_OK;
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(m, "pp");
    ck->pp = 1;
    if (pp) {
        TPS_FAIL_IF(!cJSON_IsNumber(pp) || pp->valuedouble < 1 || pp->valuedouble > 4096 ||
                        pp->valuedouble != (double)pp->valueint ||
                        (int64_t)ck->tp * pp->valueint > 65536,
                    ctx, TPS_E_JSON, "%s: pp is not a stage count from 1 to 4096 (tp x pp at most "
                                     "65536)", mpath);
        ck->pp = pp->valueint;
    }
    ck->nranks = ck->tp * ck->pp;
    if (ck->pp == 1) return TPS_OK;
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(m, "stages");
    TPS_FAIL_IF(!cJSON_IsArray(st) || cJSON_GetArraySize(st) != ck->pp, ctx, TPS_E_JSON,
                "%s: pp %d needs stages, an array of %d entries", mpath, ck->pp, ck->pp);
    ck->stage_first = tps_xcalloc((size_t)ck->pp, sizeof *ck->stage_first);
    ck->stage_layers = tps_xcalloc((size_t)ck->pp, sizeof *ck->stage_layers);
    TPS_FAIL_IF(!ck->stage_first || !ck->stage_layers, ctx, TPS_E_NOMEM, "out of memory");
    int s = 0, next = 0;
    for (const cJSON *e = st->child; e; e = e->next, s++) {
        const cJSON *sn = cJSON_GetObjectItemCaseSensitive(e, "stage");
        const cJSON *ly = cJSON_GetObjectItemCaseSensitive(e, "layers");
        const cJSON *a = cJSON_IsArray(ly) && cJSON_GetArraySize(ly) == 2 ? ly->child : NULL;
        TPS_FAIL_IF(!cJSON_IsNumber(sn) || sn->valueint != s || !a || !cJSON_IsNumber(a) ||
                        !cJSON_IsNumber(a->next) || a->valueint != next ||
                        a->next->valueint <= a->valueint || a->next->valuedouble > 1e7,
                    ctx, TPS_E_JSON,
                    "%s: stages[%d] must be {\"stage\": %d, \"layers\": [%d, END]} with END "
                    "past %d (the stages hold consecutive layers, none empty)",
                    mpath, s, s, next, next);
        ck->stage_first[s] = a->valueint;
        ck->stage_layers[s] = a->next->valueint - a->valueint;
        next = a->next->valueint;
    }
out:
    return rc;
}

/* The manifest's head: format and version, the layout, the dropped tensors,
 * tp, the plan and the ranks written. */
static tps_err read_head(tps_ctx *ctx, tps_ckpt *ck, shard_rd *S)
{
    const char *mpath = S->mpath;
    tps_err rc = TPS_OK;
    const cJSON *m = ck->manifest;
    TPS_FAIL_IF(!cJSON_IsObject(m), ctx, TPS_E_JSON, "%s: not a JSON object", mpath);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(m, "format");
    TPS_FAIL_IF(!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "tpshard"), ctx, TPS_E_JSON,
                "%s: not a tpshard manifest (format is not \"tpshard\")", mpath);
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(m, "version");
    TPS_FAIL_IF(!cJSON_IsNumber(ver) || (ver->valueint != TPS_MANIFEST_FORMAT &&
                                         ver->valueint != TPS_MANIFEST_FORMAT_LAYOUT),
                ctx, TPS_E_JSON, "%s: manifest version is not %d or %d", mpath,
                TPS_MANIFEST_FORMAT, TPS_MANIFEST_FORMAT_LAYOUT);
    int v2 = ver->valueint == TPS_MANIFEST_FORMAT_LAYOUT;
    S->v2 = v2;
    ck->layout_name = "dtensor";
    if (v2) {
        const cJSON *lay = cJSON_GetObjectItemCaseSensitive(m, "layout");
        const cJSON *ln = cJSON_GetObjectItemCaseSensitive(lay, "name");
        const cJSON *lt = cJSON_GetObjectItemCaseSensitive(lay, "target");
        const cJSON *lx = cJSON_GetObjectItemCaseSensitive(lay, "text");
        TPS_FAIL_IF(!cJSON_IsString(ln) || !cJSON_IsString(lt), ctx, TPS_E_JSON,
                    "%s: a version %d manifest needs layout.name and layout.target", mpath,
                    TPS_MANIFEST_FORMAT_LAYOUT);
        ck->layout_name = ln->valuestring;
        ck->layout_target = lt->valuestring;
        ck->layout_text = cJSON_IsString(lx) ? lx->valuestring : NULL;
        ck->layout_ep = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(lay, "ep"));
        const cJSON *mb = cJSON_GetObjectItemCaseSensitive(lay, "moe_backend");
        TPS_FAIL_IF(mb && (!cJSON_IsString(mb) || !tps_moe_backend_find(mb->valuestring)), ctx,
                    TPS_E_JSON, "%s: layout.moe_backend is not a vLLM MoE backend tpshard knows",
                    mpath);
        ck->layout_moe = mb ? mb->valuestring : NULL;
    }
    /* source tensors the layout left out: merge names them, verify does not miss them */
    const cJSON *dropped = cJSON_GetObjectItemCaseSensitive(m, "dropped");
    for (const cJSON *d = cJSON_IsArray(dropped) ? dropped->child : NULL; d; d = d->next)
        TPS_FAIL_IF(!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(d, "name")) ||
                        !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(d, "reason")),
                    ctx, TPS_E_JSON, "%s: a dropped[] entry needs a name and a reason", mpath);
    TPS_FAIL_IF(dropped && !cJSON_IsArray(dropped), ctx, TPS_E_JSON, "%s: dropped is not an array",
                mpath);
    ck->dropped = dropped;
    const cJSON *tp = cJSON_GetObjectItemCaseSensitive(m, "tp");
    TPS_FAIL_IF(!cJSON_IsNumber(tp) || tp->valuedouble < 1 || tp->valuedouble > 4096, ctx,
                TPS_E_JSON, "%s: tp is missing or out of range", mpath);
    ck->tp = tp->valueint;
    TPS_CHECK(read_stages(ctx, ck, mpath));
    ck->rank_present = tps_xcalloc((size_t)ck->nranks, 1);
    ck->rank_written = tps_xcalloc((size_t)ck->nranks, 1);
    TPS_FAIL_IF(!ck->rank_present || !ck->rank_written, ctx, TPS_E_NOMEM, "out of memory");
    const cJSON *plan = cJSON_GetObjectItemCaseSensitive(m, "plan");
    const cJSON *pname = cJSON_GetObjectItemCaseSensitive(plan, "name");
    if (cJSON_IsString(pname)) ck->plan_name = tps_strdup(pname->valuestring);
    const cJSON *ptext = cJSON_GetObjectItemCaseSensitive(plan, "text");
    if (cJSON_IsString(ptext)) ck->plan_text = ptext->valuestring;
    const cJSON *written = cJSON_GetObjectItemCaseSensitive(m, "ranks_written");
    TPS_FAIL_IF(!cJSON_IsArray(written), ctx, TPS_E_JSON, "%s: ranks_written is not an array", mpath);
    for (const cJSON *r = written->child; r; r = r->next) {
        TPS_FAIL_IF(!cJSON_IsNumber(r) || r->valueint < 0 || r->valueint >= ck->nranks, ctx, TPS_E_JSON,
                    "%s: ranks_written holds a rank outside 0..%d", mpath, ck->nranks - 1);
        ck->rank_written[r->valueint] = 1;
    }
out:
    return rc;
}

/* Source description for merge. */
static tps_err read_source(tps_ctx *ctx, tps_ckpt *ck, const char *mpath)
{
    const cJSON *m = ck->manifest;
    tps_err rc = TPS_OK;
    const cJSON *src = cJSON_GetObjectItemCaseSensitive(m, "source");
    const cJSON *sfiles = cJSON_GetObjectItemCaseSensitive(src, "files");
    TPS_FAIL_IF(!cJSON_IsArray(sfiles), ctx, TPS_E_JSON, "%s: source.files is not an array", mpath);
    ck->norigins = (size_t)cJSON_GetArraySize(sfiles);
    ck->origins = tps_xcalloc(ck->norigins, sizeof(char *));
    ck->origin_meta = cJSON_CreateObject();
    ck->origin_header = cJSON_CreateObject();
    TPS_FAIL_IF(!ck->origins || !ck->origin_meta || !ck->origin_header, ctx, TPS_E_NOMEM,
                "out of memory");
    size_t oi = 0;
    for (const cJSON *f = sfiles->child; f; f = f->next, oi++) {
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name");
        TPS_FAIL_IF(!cJSON_IsString(nm) || !tps_ck_plain_name(nm->valuestring), ctx, TPS_E_JSON,
                    "%s: source.files[%zu].name is not a plain file name", mpath, oi);
        ck->origins[oi] = tps_strdup(nm->valuestring);
        const cJSON *md = cJSON_GetObjectItemCaseSensitive(f, "metadata");
        if (cJSON_IsObject(md))
            cJSON_AddItemToObject(ck->origin_meta, nm->valuestring, cJSON_Duplicate(md, 1));
        const cJSON *hd = cJSON_GetObjectItemCaseSensitive(f, "header");
        /* a reference into the manifest, which lives as long as ck (a copy
         * was 12 MB for a DeepSeek-V3-sized header) */
        if (cJSON_IsString(hd))
            cJSON_AddItemToObject(ck->origin_header, nm->valuestring,
                                  cJSON_CreateStringReference(hd->valuestring));
    }
    const cJSON *iname = cJSON_GetObjectItemCaseSensitive(src, "index");
    if (cJSON_IsString(iname)) {
        TPS_FAIL_IF(!tps_ck_plain_name(iname->valuestring), ctx, TPS_E_JSON,
                    "%s: source.index is not a plain file name", mpath);
        ck->index_name = tps_strdup(iname->valuestring);
    }
    const cJSON *imeta = cJSON_GetObjectItemCaseSensitive(src, "index_metadata");
    if (cJSON_IsObject(imeta)) ck->index_meta = cJSON_Duplicate(imeta, 1);
out:
    return rc;
}

/* Rank files: open those that exist. */
static tps_err open_rank_files(tps_ctx *ctx, tps_ckpt *ck, const char *mpath)
{
    const cJSON *m = ck->manifest;
    tps_err rc = TPS_OK;
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(m, "files");
    TPS_FAIL_IF(!cJSON_IsArray(files), ctx, TPS_E_JSON, "%s: files is not an array", mpath);
    for (const cJSON *f = files->child; f; f = f->next) {
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name");
        const cJSON *rk = cJSON_GetObjectItemCaseSensitive(f, "rank");
        TPS_FAIL_IF(!cJSON_IsString(nm) || !tps_ck_plain_name(nm->valuestring) || !cJSON_IsNumber(rk) ||
                        rk->valueint < 0 || rk->valueint >= ck->nranks,
                    ctx, TPS_E_JSON, "%s: files[] entry needs a plain name and a rank < tp x pp",
                    mpath);
        char *p = tps_path_join(ck->dir, nm->valuestring);
        int there = p && tps_exists(p);
        free(p);
        if (!there) {
            TPS_FAIL_IF(ck->rank_written[rk->valueint], ctx, TPS_E_MISMATCH,
                        "%s: rank %d's file %s is missing", ck->dir, rk->valueint, nm->valuestring);
            continue;
        }
        /* A rank the manifest does not record as written: its file is a
         * --ranks run's that is still writing, or was killed before it
         * recorded its ranks. Not the manifest's: the rank is missing. */
        if (!ck->rank_written[rk->valueint]) continue;
        /* Its header first: the placements and shapes read below come from it. */
        int recorded;
        char *rp = tps_path_join(ck->dir, nm->valuestring);
        TPS_FAIL_IF(!rp, ctx, TPS_E_NOMEM, "out of memory");
        rc = tps_prov_rank_header(ctx, mpath, rp, f, &recorded);
        free(rp);
        if (rc) goto out;
        ck->headers_unrecorded += !recorded;
        size_t fi;
        TPS_CHECK(tps_ck_add_file(ctx, ck, nm->valuestring, &fi));
        ck->files[fi].rank = rk->valueint;
        ck->rank_present[rk->valueint] = 1;
        TPS_CHECK(tps_cfile_index(ctx, &ck->files[fi]));
        /* A rank file's header text and metadata are not needed once
         * parsed (a source file's are: merge gives them back); 4 MB and
         * 2 MB a rank for 18,867 tensors. */
        free(ck->files[fi].st->raw);
        ck->files[fi].st->raw = NULL;
        tps_st_drop_meta(ck->files[fi].st);
        TPS_CHECK(keep_names(ctx, ck, ck->files[fi].st));
    }
    if (ck->headers_unrecorded)
        tps_log(ctx, TPS_LOG_WARN,
                "%s: the manifest records no CRC32 of the rank files' headers (a tpshard older "
                "than header coverage wrote it): the headers of %d file%s (__metadata__, tensor "
                "table) are not checked; split again to cover every byte",
                mpath, ck->headers_unrecorded, ck->headers_unrecorded == 1 ? "" : "s");
out:
    return rc;
}

/* Each rank's files (S->rank_start, S->rank_files), and S->seen, none of
 * their tensors seen yet. */
static tps_err index_rank_files(tps_ctx *ctx, tps_ckpt *ck, shard_rd *S)
{
    tps_err rc = TPS_OK;
    S->rank_start = tps_xcalloc((size_t)ck->nranks + 1, sizeof *S->rank_start);
    S->rank_files = tps_xcalloc(ck->nfiles, sizeof *S->rank_files);
    TPS_FAIL_IF(!S->rank_start || !S->rank_files, ctx, TPS_E_NOMEM, "out of memory");
    for (size_t fi = 0; fi < ck->nfiles; fi++) S->rank_start[ck->files[fi].rank + 1]++;
    for (int r = 0; r < ck->nranks; r++) S->rank_start[r + 1] += S->rank_start[r];
    {
        size_t *fill = tps_xcalloc((size_t)ck->nranks, sizeof *fill);
        TPS_FAIL_IF(!fill, ctx, TPS_E_NOMEM, "out of memory");
        for (size_t fi = 0; fi < ck->nfiles; fi++) {
            int r = ck->files[fi].rank;
            S->rank_files[S->rank_start[r] + fill[r]++] = fi;
        }
        free(fill);
    }
    S->seen = tps_xcalloc(ck->nfiles ? ck->nfiles : 1, sizeof *S->seen);
    TPS_FAIL_IF(!S->seen, ctx, TPS_E_NOMEM, "out of memory");
    for (size_t fi = 0; fi < ck->nfiles; fi++) {
        S->seen[fi] = tps_xcalloc(ck->files[fi].st->n ? ck->files[fi].st->n : 1, 1);
        TPS_FAIL_IF(!S->seen[fi], ctx, TPS_E_NOMEM, "out of memory");
    }
out:
    return rc;
}

/* One ranks[] entry of tensor t: a piece (a replica: *reps, from the end
 * of t's share, back) when its rank is present, checked against the rank
 * file holding it. *expect_lo: where a version 1 manifest's next shard
 * along t's dim starts. */
static tps_err read_rank_entry(tps_ctx *ctx, tps_ckpt *ck, shard_rd *S, tps_ctensor *t,
                               const cJSON *r, tps_piece **reps, uint64_t *expect_lo)
{
    const char *mpath = S->mpath;
    int v2 = S->v2;
    size_t *rank_files = S->rank_files, *rank_start = S->rank_start;
    unsigned char **seen = S->seen;
    tps_err rc = TPS_OK;
    int ovf, mis;
    const cJSON *rr = cJSON_GetObjectItemCaseSensitive(r, "rank");
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(r, "file");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(r, "offset");
    const cJSON *crc = cJSON_GetObjectItemCaseSensitive(r, "crc32");
    const cJSON *hold = cJSON_GetObjectItemCaseSensitive(r, "tensor");
    const cJSON *atj = cJSON_GetObjectItemCaseSensitive(r, "at");
    const cJSON *sdt = cJSON_GetObjectItemCaseSensitive(r, "dtype");
    tps_dtype stored = t->dtype;
    int replica = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "replica"));
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(r, "refine");
    tps_xform xf = {0};
    uint64_t xv[4] = {0};
    if (rf) {
        int ok = v2 && cJSON_IsArray(rf) && cJSON_GetArraySize(rf) == 4 && t->ndim == 2 &&
                 t->dim >= 0;
        for (int k = 0; ok && k < 4; k++) ok = json_u64(cJSON_GetArrayItem(rf, k), &xv[k]);
        TPS_FAIL_IF(!ok || !xv[0] || !xv[1] || xv[0] > 1024 || xv[1] > 1024 || !xv[3] ||
                        xv[3] > (1u << 30) || xv[2] > (1u << 30) || xv[2] >= (t->dim ? xv[1] : xv[0]),
                    ctx, TPS_E_JSON, "%s: tensor '%s': malformed refine [rep_n, rep_k, skip, out]",
                    mpath, t->name);
        xf = (tps_xform){(uint32_t)xv[0], (uint32_t)xv[1], xv[2], xv[3], 0};
    }
    /* a transposed piece (tps_xform.tr): its region's last two dims swapped */
    const cJSON *trj = cJSON_GetObjectItemCaseSensitive(r, "transpose");
    TPS_FAIL_IF(trj && (!v2 || !cJSON_IsTrue(trj) || rf || replica || t->ndim < 2), ctx,
                TPS_E_JSON, "%s: tensor '%s': malformed transpose of a ranks[] entry (true, for "
                "a piece of a tensor of 2 or more dims, neither refined nor a replica)",
                mpath, t->name);
    int tr = trj != NULL;
    uint64_t lshape[TPS_MAX_DIMS], at = 0, run = 0, stride = 0;
    int lnd = 0;
    uint64_t lo = 0;
    const cJSON *runj = cJSON_GetObjectItemCaseSensitive(r, "run");
    const cJSON *strj = cJSON_GetObjectItemCaseSensitive(r, "stride");
    TPS_FAIL_IF((runj || strj) && (!v2 || rf || tr || !json_u64(runj, &run) || !json_u64(strj, &stride) ||
                                   !run || run > stride || stride > 0xFFFFFFFFu),
                ctx, TPS_E_JSON, "%s: tensor '%s': malformed run and stride of a ranks[] entry",
                mpath, t->name);
    TPS_FAIL_IF(!cJSON_IsNumber(rr) || rr->valueint < 0 || rr->valueint >= ck->nranks ||
                    !cJSON_IsString(fn) ||
                    !json_shape(cJSON_GetObjectItemCaseSensitive(r, "shape"), lshape, &lnd) ||
                    lnd != t->ndim || !json_u64(off, &lo) ||
                    (hold && (!v2 || !cJSON_IsString(hold))) ||
                    (atj && (!v2 || !json_u64(atj, &at))) || (replica && (!v2 || t->dim < 0)) ||
                    (sdt && (!v2 || !cJSON_IsString(sdt) ||
                             tps_dtype_from_name(sdt->valuestring, &stored))),
                ctx, TPS_E_JSON, "%s: tensor '%s': malformed ranks[] entry", mpath, t->name);
    int rank = rr->valueint;
    const char *holder = hold ? ck_keep(ck, hold->valuestring) : t->name;
    TPS_FAIL_IF(!holder, ctx, TPS_E_NOMEM, "out of memory");
    TPS_FAIL_IF(stored != t->dtype && (stored != TPS_F32 || !tps_cast_ok(t->dtype)), ctx,
                TPS_E_MISMATCH,
                "%s: tensor '%s': rank %d's piece is stored as %s, but a %s tensor can "
                "only be stored as itself or widened to F32 (a scale the layout widened)",
                mpath, t->name, rank, tps_dtype_name(stored), tps_dtype_name(t->dtype));
    /* Local shape must be the global one but along dim. */
    for (int d = 0; d < t->ndim; d++)
        TPS_FAIL_IF(d != t->dim && lshape[d] != t->shape[d], ctx, TPS_E_MISMATCH,
                    "%s: tensor '%s': rank %d's shape disagrees with the global shape",
                    mpath, t->name, rank);
    TPS_FAIL_IF(t->dim >= 0 && (lo > t->shape[t->dim] || lshape[t->dim] > t->shape[t->dim] - lo),
                ctx, TPS_E_MISMATCH, "%s: tensor '%s': rank %d's rows run past the tensor",
                mpath, t->name, rank);
    if (t->dim >= 0 && !v2) {
        TPS_FAIL_IF(lo != *expect_lo, ctx, TPS_E_MISMATCH,
                    "%s: tensor '%s': rank %d starts at %llu along dim %d, expected %llu "
                    "(shards must cover the dim exactly once, in rank order)",
                    mpath, t->name, rank, (unsigned long long)lo, t->dim,
                    (unsigned long long)*expect_lo);
        *expect_lo += lshape[t->dim];
    }
    if (!ck->rank_present[rank]) return TPS_OK;
    /* Find the rank file holding it. */
    size_t fi = ck->nfiles;
    for (size_t j = rank_start[rank]; j < rank_start[rank + 1]; j++)
        if (strcmp(ck->files[rank_files[j]].name, fn->valuestring) == 0) fi = rank_files[j];
    TPS_FAIL_IF(fi == ck->nfiles, ctx, TPS_E_MISMATCH,
                "%s: tensor '%s': rank %d's file %s is not among the rank files", mpath,
                t->name, rank, fn->valuestring);
    const tps_st *st = ck->files[fi].st;
    const tps_st_tensor_info *si = tps_cfile_find(&ck->files[fi], holder);
    TPS_FAIL_IF(!si, ctx, TPS_E_MISMATCH, "%s: tensor '%s' is missing from this file",
                ck->files[fi].path, holder);
    seen[fi][si - st->t] = 1;
    TPS_FAIL_IF(si->dtype != stored, ctx, TPS_E_MISMATCH,
                "%s: tensor '%s' is %s but the manifest says %s", ck->files[fi].path,
                holder, tps_dtype_name(si->dtype), tps_dtype_name(stored));
    uint64_t lbytes = tps_nbytes(t->dtype, lshape, lnd, &ovf, &mis);
    uint64_t pbytes = tps_nbytes(stored, lshape, lnd, &ovf, &mis);
    TPS_FAIL_IF(tr && stored != t->dtype, ctx, TPS_E_MISMATCH,
                "%s: tensor '%s': rank %d's transposed piece is stored as %s, not as itself",
                mpath, t->name, rank, tps_dtype_name(stored));
    if (xf.rep_n) {
        /* a refined grid: out rows (or columns) along the dim, the other repeated */
        uint64_t nr = lshape[0], nc = lshape[1], orows, ocols, sr, sc;
        tps_xform_grid(&xf, t->dim, nr, nc, &orows, &ocols, &sr, &sc);
        uint64_t along = t->dim == 0 ? nr * xf.rep_n : nc * xf.rep_k;
        TPS_FAIL_IF(stored != TPS_F32 || xf.skip + xf.out > along ||
                        along - (xf.skip + xf.out) >= (t->dim == 0 ? xf.rep_n : xf.rep_k),
                    ctx, TPS_E_MISMATCH,
                    "%s: tensor '%s': rank %d's refined piece does not cover its rows", mpath,
                    t->name, rank);
        pbytes = orows * ocols * 4;
    }
    if (!hold && !at) {
        int same = si->ndim == lnd;
        for (int d = 0; same && d < lnd; d++) same = si->shape[d] == lshape[d];
        TPS_FAIL_IF(!same && !v2, ctx, TPS_E_MISMATCH,
                    "%s: tensor '%s' has a shape other than the manifest's for rank %d",
                    ck->files[fi].path, t->name, rank);
    }
    if (run) {
        /* runs of `run` bytes, stride apart: the last one's end must fit */
        TPS_FAIL_IF(stored != t->dtype || pbytes % run, ctx, TPS_E_MISMATCH,
                    "%s: tensor '%s': rank %d's strided piece of %llu bytes is not whole runs "
                    "of %llu bytes", mpath, t->name, rank, (unsigned long long)pbytes,
                    (unsigned long long)run);
        if (pbytes) pbytes = (pbytes / run - 1) * stride + run;
    }
    TPS_FAIL_IF(ovf || mis || at > tps_st_info_nbytes(si) || pbytes > tps_st_info_nbytes(si) - at,
                ctx, TPS_E_MISMATCH,
                "%s: tensor '%s': rank %d's piece of %llu bytes at %llu does not fit in "
                "'%s' (%llu bytes)",
                ck->files[fi].path, t->name, rank, (unsigned long long)pbytes,
                (unsigned long long)at, holder, (unsigned long long)(tps_st_info_nbytes(si)));
    tps_piece *pc = replica ? --*reps : &t->pieces[t->npieces++];
    if (replica) t->nreplicas++;
    pc->file = (int)fi;
    pc->rank = rank;
    pc->off = st->data_start + si->begin + at;
    pc->nbytes = lbytes;
    pc->fbytes = run ? lbytes : pbytes;
    pc->stored = stored;
    pc->rep_n = (uint16_t)xf.rep_n;
    pc->rep_k = (uint16_t)xf.rep_k;
    pc->tr = (uint8_t)tr;
    if (xf.rep_n) {
        pc->xskip = (uint32_t)xf.skip;
        pc->xout = (uint32_t)xf.out;
    } else {
        pc->run = (uint32_t)run;
        pc->stride = (uint32_t)stride;
    }
    uint64_t hi = lo + (t->dim >= 0 ? lshape[t->dim] : 0);
    TPS_FAIL_IF(hi < lo || hi > UINT32_MAX, ctx, TPS_E_JSON,
                "%s: tensor '%s': rank %d's piece [%llu, %llu) along dim %d reaches past 2^32 "
                "elements (split writes none such)",
                S->mpath, t->name, rank, (unsigned long long)lo, (unsigned long long)hi, t->dim);
    pc->lo = (uint32_t)lo;
    pc->hi = (uint32_t)hi;
    pc->holder = holder;
    pc->at = at;
    uint64_t c;
    if (json_u64(crc, &c) && c <= 0xFFFFFFFFu) {
        pc->crc = (uint32_t)c;
        pc->has_crc = 1;
    }
out:
    return rc;
}

/* Tensor t's primaries along its dim cover it exactly once (a version 2
 * manifest's in any rank order, sorted here), all its ranks present. */
static tps_err check_cover(tps_ctx *ctx, const tps_ckpt *ck, const shard_rd *S, tps_ctensor *t,
                           const cJSON *rs, uint64_t expect_lo)
{
    const char *mpath = S->mpath;
    int v2 = S->v2;
    tps_err rc = TPS_OK;
    if (t->dim >= 0 && v2) {
        /* Primaries tile the dim exactly once (in any rank order). */
        for (int a = 1; a < t->npieces; a++)
            for (int b = a; b > 0 && t->pieces[b - 1].lo > t->pieces[b].lo; b--) {
                tps_piece tmp = t->pieces[b];
                t->pieces[b] = t->pieces[b - 1];
                t->pieces[b - 1] = tmp;
            }
        int complete = 1;
        for (const cJSON *r = rs->child; r; r = r->next) {
            const cJSON *rr = cJSON_GetObjectItemCaseSensitive(r, "rank");
            if (!ck->rank_present[rr->valueint]) complete = 0;
        }
        for (int a = 0; complete && a < t->npieces; a++) {
            /* a refined scale's pieces (vLLM's experts) may share a block
             * row or column with the one before; check makes sure they agree */
            const tps_piece *pa = &t->pieces[a];
            int ok = pa->rep_n ? pa->lo <= expect_lo && pa->hi > expect_lo
                                  : pa->lo == expect_lo;
            TPS_FAIL_IF(!ok, ctx, TPS_E_MISMATCH,
                        "%s: tensor '%s': its pieces along dim %d leave a gap or overlap at %llu "
                        "(each row must be held once, replicas aside)",
                        mpath, t->name, t->dim, (unsigned long long)expect_lo);
            expect_lo = pa->hi;
        }
        if (!complete) expect_lo = t->shape[t->dim];
    }
    if (t->dim >= 0)
        TPS_FAIL_IF(expect_lo != t->shape[t->dim], ctx, TPS_E_MISMATCH,
                    "%s: tensor '%s': shards cover %llu of %llu along dim %d", mpath, t->name,
                    (unsigned long long)expect_lo, (unsigned long long)t->shape[t->dim], t->dim);
out:
    return rc;
}

/* Tensor entry e: the next tensor of ck, its pieces from pool (*used of it
 * taken). */
static tps_err read_tensor(tps_ctx *ctx, tps_ckpt *ck, shard_rd *S, const cJSON *e, tps_piece *pool,
                           size_t *used)
{
    const char *mpath = S->mpath;
    int v2 = S->v2;
    tps_err rc = TPS_OK;
    tps_ctensor *t = &ck->t[ck->n++];
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *pl = cJSON_GetObjectItemCaseSensitive(e, "placement");
    const cJSON *dm = cJSON_GetObjectItemCaseSensitive(e, "dim");
    const cJSON *sf = cJSON_GetObjectItemCaseSensitive(e, "source_file");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(e, "ranks");
    TPS_FAIL_IF(!cJSON_IsString(nm), ctx, TPS_E_JSON, "%s: a tensor entry has no name", mpath);
    t->name = ck_keep(ck, nm->valuestring);
    TPS_FAIL_IF(!t->name, ctx, TPS_E_NOMEM, "out of memory");
    const cJSON *df = cJSON_GetObjectItemCaseSensitive(e, "derived_from");
    TPS_FAIL_IF(df && !cJSON_IsString(df), ctx, TPS_E_JSON,
                "%s: tensor '%s': derived_from is not a tensor name", mpath, t->name);
    t->derived_from = df ? ck_keep(ck, df->valuestring) : NULL;
    const cJSON *sty = cJSON_GetObjectItemCaseSensitive(e, "style");
    t->style = cJSON_IsString(sty) ? ck_keep(ck, sty->valuestring) : NULL;
    TPS_FAIL_IF((df && !t->derived_from) || (cJSON_IsString(sty) && !t->style), ctx,
                TPS_E_NOMEM, "out of memory");
    TPS_FAIL_IF(!cJSON_IsString(dt) || tps_dtype_from_name(dt->valuestring, &t->dtype), ctx,
                TPS_E_JSON, "%s: tensor '%s': bad dtype", mpath, t->name);
    uint64_t shape[TPS_MAX_DIMS];
    TPS_FAIL_IF(!json_shape(cJSON_GetObjectItemCaseSensitive(e, "shape"), shape, &t->ndim),
                ctx, TPS_E_JSON, "%s: tensor '%s': bad shape", mpath, t->name);
    TPS_FAIL_IF(!(t->shape = tps_ck_keep_shape(ck, shape, t->ndim)), ctx, TPS_E_NOMEM, "out of memory");
    TPS_FAIL_IF(!cJSON_IsNumber(dm) || dm->valueint < -1 || dm->valueint >= t->ndim, ctx,
                TPS_E_JSON, "%s: tensor '%s': bad dim", mpath, t->name);
    t->dim = dm->valueint;
    t->placement = ck_keep(ck, cJSON_IsString(pl) ? pl->valuestring : "?");
    t->origin = NULL;
    for (size_t k = 0; k < ck->norigins && !t->origin; k++)
        if (cJSON_IsString(sf) && !strcmp(ck->origins[k], sf->valuestring)) t->origin = ck->origins[k];
    TPS_FAIL_IF(!t->origin, ctx, TPS_E_JSON,
                "%s: tensor '%s' names a source_file that source.files does not list", mpath, t->name);
    int ovf, mis;
    t->nbytes = tps_nbytes(t->dtype, t->shape, t->ndim, &ovf, &mis);
    TPS_FAIL_IF(ovf || mis, ctx, TPS_E_JSON, "%s: tensor '%s': bad size", mpath, t->name);
    TPS_FAIL_IF(!cJSON_IsArray(rs) || (!v2 && cJSON_GetArraySize(rs) != ck->tp), ctx, TPS_E_JSON,
                "%s: tensor '%s': ranks must list all %d ranks", mpath, t->name, ck->tp);
    TPS_FAIL_IF(!t->placement, ctx, TPS_E_NOMEM, "out of memory");
    size_t nr = (size_t)cJSON_GetArraySize(rs);
    t->nlisted = (int)nr;
    t->pieces = pool + *used;
    *used += nr;
    /* primaries first, replicas at the end of this tensor's share */
    tps_piece *reps = t->pieces + nr;
    uint64_t expect_lo = 0;
    for (const cJSON *r = rs->child; r; r = r->next) {
        TPS_CHECK(read_rank_entry(ctx, ck, S, t, r, &reps, &expect_lo));
    }
    t->replicas = reps;
    TPS_CHECK(check_cover(ctx, ck, S, t, rs, expect_lo));
out:
    return rc;
}

/* Tensors. */
static tps_err read_tensors(tps_ctx *ctx, tps_ckpt *ck, shard_rd *S)
{
    const char *mpath = S->mpath;
    const cJSON *m = ck->manifest;
    tps_err rc = TPS_OK;
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(m, "tensors");
    TPS_FAIL_IF(!cJSON_IsArray(ts), ctx, TPS_E_JSON, "%s: tensors is not an array", mpath);
    size_t nt = 0, nent = 0;
    /* A first pass counts them. */
    tps_js_iter_start(&S->it, &S->sp[0], ts, "tensors");
    for (const cJSON *e;;) {
        TPS_CHECK(tps_js_iter_next(ctx, mpath, &S->it, &e));
        if (!e) break;
        const cJSON *rs = cJSON_GetObjectItemCaseSensitive(e, "ranks");
        nent += cJSON_IsArray(rs) ? (size_t)cJSON_GetArraySize(rs) : 0;
        nt++;
    }
    tps_js_iter_start(&S->it, &S->sp[0], ts, "tensors");
    TPS_FAIL_IF(nent > tps_max_manifest_entries, ctx, TPS_E_JSON,
                "%s: %zu tensor-rank entries, more than the %zu a manifest may hold", mpath, nent,
                tps_max_manifest_entries);
    TPS_CHECK(tps_ck_grow_tensors(ctx, ck, nt));
    tps_piece *pool = tps_ck_new_pool(ctx, ck, nent ? nent : 1);
    TPS_FAIL_IF(!pool, ctx, TPS_E_NOMEM, "out of memory");
    size_t used = 0;
    for (const cJSON *e;;) {
        TPS_CHECK(tps_js_iter_next(ctx, mpath, &S->it, &e));
        if (!e) break;
        TPS_CHECK(read_tensor(ctx, ck, S, e, pool, &used));
    }
out:
    return rc;
}

/* Rank tensor rt's fills as read (tmp, rt->nfills of them) kept: each source
 * fill that a piece of the manifest's tensors stands for (the same rank
 * file, rank tensor, place, bytes, run and stride) as that piece, the rest
 * (zeros, constants, unmatched sources, an absent rank's) in rt->xfills.
 * The tensors are read and sorted by now. */
static tps_err keep_fills(tps_ctx *ctx, tps_ckpt *ck, tps_crtensor *rt, const tps_fill *tmp)
{
    size_t nx = 0;
    for (size_t j = 0; j < rt->nfills; j++) {
        const tps_fill *fl = &tmp[j];
        const tps_piece *hit = NULL;
        int i = rt->file >= 0 && fl->kind == TPS_FILL_SOURCE ? tps_ckpt_find(ck, fl->source) : -1;
        const tps_ctensor *t = i >= 0 ? &ck->t[i] : NULL;
        for (int p = 0; t && p < t->npieces + t->nreplicas && !hit; p++) {
            const tps_piece *pc = p < t->npieces ? &t->pieces[p] : &t->replicas[p - t->npieces];
            uint64_t prun = pc->rep_n ? 0 : pc->run, pstr = pc->rep_n ? 0 : pc->stride;
            if (pc->file == rt->file && !strcmp(pc->holder, rt->name) && pc->at == fl->at &&
                pc->fbytes == fl->nbytes && prun == fl->run && (!prun || pstr == fl->stride))
                hit = pc;
        }
        rt->fills[j] = hit ? (tps_fillref)hit : (tps_fillref)(1 + 2 * nx++);
    }
    if (!nx) return TPS_OK;
    rt->xfills = tps_xmalloc(nx * sizeof *rt->xfills);
    if (!rt->xfills) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    for (size_t j = 0; j < rt->nfills; j++)
        if (rt->fills[j] & 1) rt->xfills[rt->nxfills++] = tmp[j];
    return TPS_OK;
}

/* Rank tensor entry e: the next of ck->rts, its fills, and (its rank
 * present) the rank file holding it. */
static tps_err read_rank_tensor(tps_ctx *ctx, tps_ckpt *ck, shard_rd *S, const cJSON *e)
{
    const char *mpath = S->mpath;
    size_t *rank_files = S->rank_files, *rank_start = S->rank_start;
    unsigned char **seen = S->seen;
    tps_err rc = TPS_OK;
    tps_crtensor *rt = &ck->rts[ck->nrts++];
    const cJSON *rk = cJSON_GetObjectItemCaseSensitive(e, "rank");
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(e, "file");
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(e, "pieces");
    uint64_t shape[TPS_MAX_DIMS];
    int nd = 0, ovf = 0, mis = 0;
    rt->file = -1;
    TPS_FAIL_IF(!cJSON_IsNumber(rk) || rk->valueint < 0 || rk->valueint >= ck->nranks ||
                    !cJSON_IsString(nm) || !cJSON_IsString(fn) || !cJSON_IsString(dt) ||
                    tps_dtype_from_name(dt->valuestring, &rt->dtype) ||
                    !json_shape(cJSON_GetObjectItemCaseSensitive(e, "shape"), shape, &nd) ||
                    !cJSON_IsArray(ps),
                ctx, TPS_E_JSON, "%s: malformed rank_tensors entry", mpath);
    rt->name = ck_keep(ck, nm->valuestring);
    TPS_FAIL_IF(!rt->name, ctx, TPS_E_NOMEM, "out of memory");
    rt->rank = rk->valueint;
    rt->nbytes = tps_nbytes(rt->dtype, shape, nd, &ovf, &mis);
    TPS_FAIL_IF(ovf || mis, ctx, TPS_E_JSON, "%s: rank tensor '%s': bad size", mpath, rt->name);
    rt->nfills = (size_t)cJSON_GetArraySize(ps);
    rt->fills = tps_xcalloc(rt->nfills ? rt->nfills : 1, sizeof *rt->fills);
    TPS_FAIL_IF(!rt->fills, ctx, TPS_E_NOMEM, "out of memory");
    if (rt->nfills > S->cap_tmp) {
        free(S->tmp);
        S->cap_tmp = rt->nfills;
        S->tmp = tps_xmalloc(S->cap_tmp * sizeof *S->tmp);
        if (!S->tmp) S->cap_tmp = 0;
        TPS_FAIL_IF(!S->tmp, ctx, TPS_E_NOMEM, "out of memory");
    }
    size_t k = 0;
    for (const cJSON *p = ps->child; p; p = p->next, k++) {
        tps_fill *fl = &S->tmp[k];
        memset(fl, 0, sizeof *fl);
        const cJSON *sj = cJSON_GetObjectItemCaseSensitive(p, "source");
        const cJSON *val = cJSON_GetObjectItemCaseSensitive(p, "value");
        TPS_FAIL_IF(!json_u64(cJSON_GetObjectItemCaseSensitive(p, "at"), &fl->at) ||
                        !json_u64(cJSON_GetObjectItemCaseSensitive(p, "nbytes"), &fl->nbytes),
                    ctx, TPS_E_JSON, "%s: rank tensor '%s': malformed piece", mpath, rt->name);
        const cJSON *runj = cJSON_GetObjectItemCaseSensitive(p, "run");
        const cJSON *strj = cJSON_GetObjectItemCaseSensitive(p, "stride");
        TPS_FAIL_IF((runj || strj) && (!json_u64(runj, &fl->run) || !json_u64(strj, &fl->stride) ||
                                       !fl->run || fl->run > fl->stride || fl->nbytes % fl->run),
                    ctx, TPS_E_JSON, "%s: rank tensor '%s': malformed run and stride of a piece",
                    mpath, rt->name);
        if (cJSON_IsString(sj)) {
            fl->kind = TPS_FILL_SOURCE;
            fl->source = ck_keep(ck, sj->valuestring);
            TPS_FAIL_IF(!fl->source, ctx, TPS_E_NOMEM, "out of memory");
        } else if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "zeros"))) {
            fl->kind = TPS_FILL_ZEROS;
        } else {
            TPS_FAIL_IF(!cJSON_IsNumber(val), ctx, TPS_E_JSON,
                        "%s: rank tensor '%s': a piece is neither source, zeros nor value",
                        mpath, rt->name);
            fl->kind = TPS_FILL_VALUE;
            fl->value = val->valuedouble;
        }
    }
    if (!ck->rank_present[rt->rank]) return keep_fills(ctx, ck, rt, S->tmp);
    size_t fi = ck->nfiles;
    for (size_t j = rank_start[rt->rank]; j < rank_start[rt->rank + 1]; j++)
        if (strcmp(ck->files[rank_files[j]].name, fn->valuestring) == 0) fi = rank_files[j];
    TPS_FAIL_IF(fi == ck->nfiles, ctx, TPS_E_MISMATCH,
                "%s: rank tensor '%s': rank %d's file %s is not among the rank files", mpath,
                rt->name, rt->rank, fn->valuestring);
    const tps_st_tensor_info *si = tps_cfile_find(&ck->files[fi], rt->name);
    TPS_FAIL_IF(!si, ctx, TPS_E_MISMATCH, "%s: tensor '%s' is missing from this file",
                ck->files[fi].path, rt->name);
    seen[fi][si - ck->files[fi].st->t] = 1;
    int same = si->dtype == rt->dtype && si->ndim == nd;
    for (int d = 0; same && d < nd; d++) same = si->shape[d] == shape[d];
    TPS_FAIL_IF(!same, ctx, TPS_E_MISMATCH,
                "%s: tensor '%s' has a dtype or shape other than the manifest's",
                ck->files[fi].path, rt->name);
    rt->file = (int)fi;
    rt->off = ck->files[fi].st->data_start + si->begin;
    rc = keep_fills(ctx, ck, rt, S->tmp);
out:
    return rc;
}

/* A serving layout's other rank tensors: fused, padded, constant. */
static tps_err read_rank_tensors(tps_ctx *ctx, tps_ckpt *ck, shard_rd *S)
{
    const char *mpath = S->mpath;
    const cJSON *m = ck->manifest;
    int v2 = S->v2;
    tps_err rc = TPS_OK;
    const cJSON *rts = cJSON_GetObjectItemCaseSensitive(m, "rank_tensors");
    if (v2 && cJSON_IsArray(rts)) {
        size_t nrt = 0;
        tps_js_iter_start(&S->it, &S->sp[1], rts, "rank_tensors");
        for (const cJSON *e;;) {
            TPS_CHECK(tps_js_iter_next(ctx, mpath, &S->it, &e));
            if (!e) break;
            nrt++;
        }
        tps_js_iter_start(&S->it, &S->sp[1], rts, "rank_tensors");
        TPS_FAIL_IF(nrt > tps_max_manifest_entries, ctx, TPS_E_JSON,
                    "%s: %zu rank_tensors, more than the %zu a manifest may hold", mpath, nrt,
                    tps_max_manifest_entries);
        ck->rts = tps_xcalloc(nrt ? nrt : 1, sizeof *ck->rts);
        TPS_FAIL_IF(!ck->rts, ctx, TPS_E_NOMEM, "out of memory");
        for (const cJSON *e;;) {
            TPS_CHECK(tps_js_iter_next(ctx, mpath, &S->it, &e));
            if (!e) break;
            TPS_CHECK(read_rank_tensor(ctx, ck, S, e));
        }
    }
out:
    return rc;
}

/* A rank file must hold nothing the manifest does not know: every one of
 * its tensors holds a piece of a source tensor or is one of its rank's
 * rank_tensors (marked in `seen` as they were found). */
static tps_err check_seen(tps_ctx *ctx, const tps_ckpt *ck, const shard_rd *S)
{
    unsigned char **seen = S->seen;
    tps_err rc = TPS_OK;
    for (size_t fi = 0; fi < ck->nfiles; fi++) {
        const tps_st *st = ck->files[fi].st;
        for (size_t k = 0; k < st->n; k++)
            TPS_FAIL_IF(!seen[fi][k], ctx, TPS_E_MISMATCH, "%s: tensor '%s' is not in the manifest",
                        ck->files[fi].path, st->t[k].name);
    }
out:
    return rc;
}

static tps_err open_sharded_text(tps_ctx *ctx, tps_ckpt *ck, const char *mpath, const tps_text *tx)
{
    shard_rd S = {.mpath = mpath};
    tps_err rc = TPS_OK;
    /* whole, or (its usual shape) all but its two long arrays, whose spans S.sp gets */
    TPS_CHECK(tps_js_parse_manifest(ctx, mpath, tx->p, tx->len, &ck->manifest, S.sp));
    TPS_CHECK(read_head(ctx, ck, &S));
    TPS_CHECK(read_source(ctx, ck, mpath));
    TPS_CHECK(open_rank_files(ctx, ck, mpath));
    TPS_CHECK(index_rank_files(ctx, ck, &S));
    TPS_CHECK(read_tensors(ctx, ck, &S));
    /* sorted before the rank tensors: their fills are matched to the pieces by name */
    TPS_CHECK(tps_ck_sort_and_dedup(ctx, ck));
    TPS_CHECK(read_rank_tensors(ctx, ck, &S));
    TPS_CHECK(read_untie(ctx, ck, mpath));
    TPS_CHECK(check_seen(ctx, ck, &S));
out:
    /* the set that kept each string once: only the reading needed it */
    free(ck->str_set);
    ck->str_set = NULL;
    ck->nstr_set = ck->cap_str_set = 0;
    tps_js_iter_free(&S.it);
    for (size_t fi = 0; S.seen && fi < ck->nfiles; fi++) free(S.seen[fi]);
    free(S.seen);
    free(S.tmp);
    free(S.rank_files);
    free(S.rank_start);
    return rc;
}

/* The manifest mapped when big, its pages let go behind each pass over it
 * (25 MB of text for 151k rank tensors), read inside a SIGBUS guard: a
 * manifest cut short by another process while being read fails the open
 * instead of killing the process (what open_sharded_text had allocated then
 * is lost: a leak on that error only). */
tps_err tps_ck_open_sharded(tps_ctx *ctx, tps_ckpt *ck, const char *mpath)
{
    /* on the heap: the scans change it after the sigsetjmp below */
    tps_text *tx = tps_xcalloc(1, sizeof *tx);
    if (!tx) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
    tps_err rc = tps_text_open(ctx, mpath, TPS_MAX_MANIFEST_FILE, tx);
    if (rc) {
        free(tx);
        return rc;
    }
    int guarded = tx->mapped && tps_guard_hold();
    tps_guard gd = {.lo = tx->p, .hi = tx->p + tx->len};
    if (guarded) {
        if (sigsetjmp(gd.jb, 1)) {
            tps_guard_leave();
            tps_guard_release();
            tps_text_close(tx);
            free(tx);
            return tps_fail(ctx, TPS_E_IO, "%s: changed while being read (cut short under its mapping)",
                            mpath);
        }
        tps_guard_enter(&gd);
    }
    rc = open_sharded_text(ctx, ck, mpath, tx);
    if (guarded) {
        tps_guard_leave();
        tps_guard_release();
    }
    tps_text_close(tx);
    free(tx);
    return rc;
}

int tps_ckpt_dropped(const tps_ckpt *ck, const char *name)
{
    for (const cJSON *d = ck->dropped ? ck->dropped->child : NULL; d; d = d->next)
        if (!strcmp(cJSON_GetObjectItemCaseSensitive(d, "name")->valuestring, name)) return 1;
    return 0;
}
