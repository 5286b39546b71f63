/* verify.c - `tpshard verify`: prove a shard directory reproduces its source.
 *
 * Two layers (DESIGN.md section 6):
 *  - Reconstruction: every rank's shard of every tensor, put back at its
 *    place along the shard dim, equals the source bytes; replicated tensors
 *    equal the source on every rank. Without a source, each shard's CRC32 is
 *    checked against the manifest instead.
 *  - Numerics (with a source): seeded inputs through the sharded Linear
 *    layers (colwise: all-gather; rowwise: all-reduce, bias once), the
 *    vocab-sharded embeddings (all-reduce, exact), and per layer the MLP and
 *    attention blocks, whose rank-local intermediate must meet the matching
 *    shard of the rowwise half (the block's reference applies the unsharded
 *    rowwise weight to the gathered intermediate; see block_feed in
 *    verify_finalize.c).
 *
 * Tolerance per output element: 2 gamma(n) sum|x_i w_i| (comm.h), n the
 * reduction length + tp (+ 1 with a bias): both sides are within gamma(n) of
 * the exact value whatever their summation order. Colwise products come out
 * bit-identical on the cpu backend (same kernel, same order); embeddings are
 * compared exactly.
 *
 * Streaming: every tensor is cut into tasks of a few MiB; a task reads its
 * source bytes and each rank's matching shard bytes once, compares them and
 * feeds the same bytes, converted row by row to f32, to the products. Tasks
 * run on OpenMP threads in one queue ordered by tensor; a tensor is
 * finalized (collective, comparison, report rows) in queue order as soon as
 * its last task ends, so memory stays bounded by the tasks in flight. The
 * second half of a block (down_proj, o_proj) is queued a few tensors after
 * its producers and waits for their activations; since every earlier task
 * has been taken by a running thread and producers never wait, the wait
 * always ends.
 *
 * The parts: verify_analysis.c (what each tensor must hold, how it is
 * read), verify_packed.c (a serving layout's packed tensors),
 * verify_dequant.c (packed methods' codes, dequantized on both sides),
 * verify_mxfp4.c (gpt-oss's MXFP4 experts as the engine's tensors hold them),
 * verify_job.c and verify_scales.c (the products of a tensor),
 * verify_task.c (the task runner), verify_finalize.c (a tensor's end,
 * its report rows), verify_report.c (the report). This file: the driver,
 * opening the directory, its layout, the source and the backend, and the
 * checks of the whole directory after the tasks (padding and constants,
 * source tensors the shards lack, a source that is not the one split).
 */
#include <fnmatch.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "verify_int.h"
#include "model/provenance.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* This pass's units and blocks, let go when its tensors are finished. */
static void free_units(vctx *V)
{
    for (size_t i = 0; i < V->nu; i++) {
        vunit *u = &V->u[i];
        tps_vj_free(V, u->job);
        free(u->segc);
        free(u->crcpre);
        free(u->diff); /* and the unit's other per-slot arrays (unit_slots) */
        free(u->crcs);
        free(u->crclen);
        free(u->pre);
        free(u->nk_note);
        pthread_mutex_destroy(&u->mu);
        V->unit_of[u->t] = -1;
    }
    for (size_t i = 0; i < V->nblk; i++) {
        tps_vf_block_release(V, &V->blk[i]);
        free(V->blk[i].name);
    }
    free(V->blk);
    free(V->u);
    free(V->order);
    V->blk = NULL;
    V->u = NULL;
    V->order = NULL;
    V->nblk = V->blk_cap = V->nu = 0;
    V->ntasks = V->next_final = 0;
    atomic_store(&V->next, 0);
}

static void vctx_free(vctx *V)
{
    if (V->unit_of) free_units(V);
    free(V->unit_of);
    free(V->local);
    free(V->se);
    for (size_t i = 0; i < V->nhn; i++) free(V->hn[i].note);
    free(V->hn);
    tps_comm_free(V->comm);
    if (V->gpu) {
        char st[512];
        tps_gpu_stats(V->gpu, st, sizeof st);
        tps_log(V->ctx, TPS_LOG_INFO, "verify: %s", st);
        tps_gpu_close(V->gpu);
    }
    tps_ckpt_free(V->src);
    tps_quant_free(V->q);
    tps_plan_free(V->plan);
    tps_layout_spec_free(V->spec);
    for (size_t i = 0; V->lay_note && i < V->ck->n; i++) free(V->lay_note[i]);
    free(V->lay_note);
    free(V->lay_want);
    if (V->R && V->R->lender) { /* the rows name the directory's tensors with its strings */
        tps_ckpt_take_strings(V->ck, &V->R->lent);
        V->R->lender = NULL;
    }
    tps_ckpt_free(V->ck);
    pthread_mutex_destroy(&V->fin_mu);
    pthread_mutex_destroy(&V->err_mu);
}

/* A serving layout's directory: the layout compiled again from what the
 * manifest recorded (the layout file, each tensor's style) and the
 * directory's config.json, so that every piece can be checked against where
 * the layout puts it rather than against the manifest alone. */
static tps_err expect_layout(vctx *V)
{
    tps_ctx *ctx = V->ctx;
    const tps_ckpt *ck = V->ck;
    tps_err rc = TPS_OK;
    tps_layout *L = NULL;
    unsigned char *keep = NULL;
    tps_style *st = tps_xcalloc(ck->n ? ck->n : 1, sizeof *st);
    if (!st) return tps_fail(ctx, TPS_E_NOMEM, "verify: out of memory");
    size_t nse = 0;
    style_ent *se = tps_va_style_index(ck, &nse);
    for (size_t i = 0; i < ck->n; i++) {
        const char *sn = tps_va_style_of(se, nse, ck->t[i].name);
        st[i] = TPS_STYLE_REPLICATE;
        if (sn && tps_style_lookup(sn, &st[i]))
            TPS_FAIL_IF(1, ctx, TPS_E_JSON, "%s: tensor '%s': unknown style '%s' in the manifest",
                        ck->path, ck->t[i].name, sn);
    }
    if (ck->layout_text)
        TPS_CHECK(tps_lspec_parse(ctx, "the layout recorded in tpshard.json", ck->layout_text,
                                  strlen(ck->layout_text), &V->spec));
    else
        TPS_CHECK(tps_layout_spec_builtin(ctx, ck->layout_name, &V->spec));
    TPS_FAIL_IF(strcmp(V->spec->name, ck->layout_name), ctx, TPS_E_MISMATCH,
                "%s: the manifest's layout is %s but its layout file is %s", ck->path,
                ck->layout_name, V->spec->name);
    if (ck->plan_text) /* packed tensors: their sections are the plan's */
        TPS_CHECK(tps_plan_parse(ctx, "the plan recorded in tpshard.json", ck->plan_text,
                                 strlen(ck->plan_text), &V->plan));
    /* MXFP4 experts: their shapes are the backend's the split used (the
     * manifest reader made sure it is one tpshard knows) */
    const tps_moe_backend *moe = ck->layout_moe ? tps_moe_backend_find(ck->layout_moe) : NULL;
    /* compiled for a few ranks at a time, as split does (tps_split_passes):
     * every piece of the pass's ranks checked against it, then let go */
    int nr = ck->nranks, per = tps_split_ranks_per_pass(ck, nr, ck->pp, 0);
    V->serving = 1;
    V->lay_note = tps_xcalloc(ck->n ? ck->n : 1, sizeof *V->lay_note);
    V->lay_want = tps_xcalloc(ck->n ? ck->n : 1, sizeof *V->lay_want);
    keep = per < nr ? tps_xcalloc((size_t)nr, 1) : NULL;
    TPS_FAIL_IF(!V->lay_note || !V->lay_want || (per < nr && !keep), ctx, TPS_E_NOMEM,
                "verify: out of memory");
    for (int r0 = 0; r0 < nr; r0 += per) {
        if (keep)
            for (int r = 0; r < nr; r++) keep[r] = r >= r0 && r < r0 + per;
        TPS_CHECK(tps_layout_from_styles(ctx, ck, V->plan, V->spec, ck->tp, ck->layout_ep, ck->pp,
                                         ck->stage_layers, ck->pad_intermediate, moe, st, keep,
                                         &L));
        TPS_FAIL_IF(L->rejected, ctx, TPS_E_MISMATCH,
                    "%s: layout %s would not write this model at tp %d: %s", ck->path,
                    V->spec->name, V->tp, L->rejected);
        TPS_CHECK(tps_va_layout_pass(V, L));
        if (!V->q) { /* FP8 weights: the products dequantize them */
            V->q = L->q;
            L->q = NULL;
        }
        tps_layout_free(L);
        L = NULL;
    }
    if (per < nr)
        tps_log(ctx, TPS_LOG_INFO, "verify: layout %s compiled again in %d passes of %d rank%s",
                V->spec->name, (nr + per - 1) / per, per, per == 1 ? "" : "s");
out:
    tps_layout_free(L);
    free(keep);
    free(se);
    free(st);
    return rc;
}


/* Source bytes compared with the manifest's CRC32s before the checks start:
 * the smallest tensors (norms, biases, small projections), a read of well
 * under a second. */
#define SOURCE_SAMPLE (64u << 20)

/* A directory that split --ranks runs have not filled: one error naming the
 * missing ranks (TPS_E_PARTIAL, as check's exit status 3), not a failed row
 * per tensor. */
static tps_err refuse_partial(tps_ctx *ctx, const tps_ckpt *ck, const char *dir)
{
    char miss[256] = "";
    size_t ml = 0;
    int present = 0;
    for (int r = 0; r < ck->nranks; r++) {
        if (ck->rank_present[r]) {
            present++;
            continue;
        }
        int w = snprintf(miss + ml, sizeof miss - ml, "%s%d", ml ? "," : "", r);
        if (w > 0 && ml + (size_t)w < sizeof miss) ml += (size_t)w;
    }
    if (present == ck->nranks) return TPS_OK;
    return tps_fail(ctx, TPS_E_PARTIAL,
                    "%s: partial: rank%s %s %s not written here yet (split --ranks; %d of %d "
                    "ranks present): verify needs every rank",
                    dir, strchr(miss, ',') ? "s" : "", miss, strchr(miss, ',') ? "are" : "is",
                    present, ck->nranks);
}

/* Shards that differ from the source although they hold exactly the bytes
 * the manifest's CRC32s record: the source is not the checkpoint that was
 * split (same names, shapes and sizes, other values: a fine-tune, another
 * revision). One error naming the first such tensor replaces the report. */
static tps_err blame_source(vctx *V)
{
    for (size_t i = 0; i < V->nu; i++) {
        const vunit *u = &V->u[i];
        int differs = 0;
        for (int s = 0; s < u->nslot && !differs; s++) differs = atomic_load(&u->diff[s]) != 0;
        if (!differs || u->pre) continue;
        int intact = 0;
        TPS_TRY(tps_prov_tensor_intact(V->ctx, V->ck, u->t, &intact));
        if (intact)
            return tps_fail(V->ctx, TPS_E_MISMATCH,
                            "verify: %s is not the checkpoint %s was split from (its manifest "
                            "records the source): tensor '%s' differs there from the bytes split "
                            "(the rank files hold what the manifest's CRC32s record)",
                            V->o->source, V->o->dir, u->ct->derived_from ? u->ct->derived_from
                                                                        : u->ct->name);
    }
    return TPS_OK;
}

/* The directory, what it must hold (a serving layout, FP8 scales) and the
 * source, with its provenance checked first. */
static tps_err open_inputs(vctx *V)
{
    tps_ctx *ctx = V->ctx;
    const tps_verify_opts *o = V->o;
    tps_err rc = TPS_OK;
    TPS_CHECK(tps_ckpt_open_path(ctx, o->dir, &V->ck));
    TPS_FAIL_IF(
        tps_ckpt_kind(V->ck) != TPS_SRC_SHARDED, ctx, TPS_E_ARG,
        "%s: not a tpshard output directory (no %s): verify takes what `tpshard split` wrote",
        o->dir, TPS_MANIFEST);
    /* With pipeline stages the ranks are the workers, tp x pp: a stage's tensors
     * are on its tp ranks, and the ranks of the other stages hold none of them
     * (empty shards to the products, which then run on the stage's ranks). */
    V->tp = V->ck->nranks;
    TPS_FAIL_IF(V->tp < 1, ctx, TPS_E_FORMAT, "%s: the manifest gives tp %d", o->dir, V->tp);
    TPS_CHECK(refuse_partial(ctx, V->ck, o->dir));
    if (V->ck->layout_target) TPS_CHECK(expect_layout(V));
    /* FP8 weights: the products dequantize them (a serving layout has read it already) */
    if (!V->serving) TPS_CHECK(tps_quant_open(ctx, V->ck, &V->q));
    /* the rank files' tables checked and let go before the source's are read */
    TPS_CHECK(tps_va_header_notes(V));
    /* the source headers the manifest holds: their CRC32s are enough now */
    tps_ckpt_release_origin_headers(V->ck);
    if (o->source) {
        TPS_CHECK(tps_ckpt_open_lean(ctx, o->source, &V->src));
        /* another checkpoint than the one split: said first, not as a row per tensor */
        TPS_CHECK(tps_prov_source(ctx, V->ck, V->src));
        TPS_CHECK(tps_prov_source_sample(ctx, V->ck, V->src, SOURCE_SAMPLE));
        /* read by the provenance checks alone */
        tps_ckpt_release_origin_headers(V->src);
    }
out:
    return rc;
}

/* The backend: the cpu one's collectives, or the GPUs (and with NCCL, which
 * ranks are this process's). */
static tps_err open_backend(vctx *V, int nth)
{
    tps_ctx *ctx = V->ctx;
    const tps_verify_opts *o = V->o;
    tps_verify_report *R = V->R;
    tps_err rc = TPS_OK;
    V->local = malloc((size_t)V->tp);
    TPS_FAIL_IF(!V->local, ctx, TPS_E_NOMEM, "verify: out of memory");
    memset(V->local, 1, (size_t)V->tp);
    V->is_root = 1;
    if (o->backend == TPS_BACKEND_CPU) {
        V->comm = tps_comm_cpu_new(V->tp);
        TPS_FAIL_IF(!V->comm, ctx, TPS_E_NOMEM, "verify: out of memory");
        R->backend = tps_asprintf("cpu (%d thread%s)", nth, nth == 1 ? "" : "s");
    } else {
        double t1 = now_s();
        TPS_CHECK(tps_gpu_open(ctx, o->backend, V->tp, nth, o->nccl_id_file, &V->gpu));
        R->setup_seconds = now_s() - t1;
        tps_gpu_local_ranks(V->gpu, V->local);
        V->is_root = tps_gpu_is_root(V->gpu);
        R->backend = tps_strdup(tps_gpu_describe(V->gpu));
    }
    V->want_ref = V->is_root;
    TPS_FAIL_IF(!R->backend, ctx, TPS_E_NOMEM, "verify: out of memory");
out:
    return rc;
}

/* Tensors are checked in passes of about VERIFY_PASS_TENSORS in name order
 * (tps_verify_opts.tensors_per_pass): the units, their slots and blocks of
 * one pass at a time, not of every tensor (92k of them, 70 MB, at
 * DeepSeek-V3's size). */
#define VERIFY_PASS_TENSORS 2048

/* The text before name's first all-digit component ("model.layers." of
 * "model.layers.12.mlp..."), its length, and the component's, or 0 when it
 * has none. */
static size_t layer_key(const char *name, size_t *klen)
{
    const char *c = name;
    for (;;) {
        const char *e = strchr(c, '.');
        size_t n = e ? (size_t)(e - c) : strlen(c);
        size_t d = 0;
        while (d < n && c[d] >= '0' && c[d] <= '9') d++;
        if (n && d == n) {
            *klen = n;
            return (size_t)(c - name);
        }
        if (!e) return *klen = 0, 0;
        c = e + 1;
    }
}

/* The verdict on the last stack prefix cut_between looked at. */
typedef struct {
    const char *p;
    size_t len;
    int ok;
} cut_seen;

/* A cut between tensors b - 1 and b (adjacent in name order) keeps every
 * block whole: a block is the tensors of one prefix (verify_analysis.c),
 * which lie together in name order. It is allowed between two layers of one
 * stack ("model.layers.9." | "model.layers.10.") when no tensor of the
 * prefix the two share lacks a layer number ("model.layers.mlp.gate_proj.weight"
 * would share theirs and lie on either side). */
static int cut_between(const tps_ckpt *ck, size_t b, cut_seen *cs)
{
    const char *x = ck->t[b - 1].name, *y = ck->t[b].name;
    size_t kx, ky, px = layer_key(x, &kx), py = layer_key(y, &ky);
    if (!kx || !ky || px != py || strncmp(x, y, px)) return 0;
    if (kx == ky && !strncmp(x + px, y + py, kx)) return 0; /* the same layer */
    if (cs->p && cs->len == px && !strncmp(cs->p, x, px)) return cs->ok;
    /* the names with prefix x[0 .. px): a run around b in name order */
    size_t lo = b, hi = b;
    while (lo > 0 && !strncmp(ck->t[lo - 1].name, x, px)) lo--;
    while (hi < ck->n && !strncmp(ck->t[hi].name, x, px)) hi++;
    *cs = (cut_seen){x, px, 1};
    for (size_t i = lo; i < hi && cs->ok; i++) {
        size_t k;
        layer_key(ck->t[i].name, &k);
        cs->ok = k != 0;
    }
    return cs->ok;
}

/* Where the pass from tensor lo ends: at least want tensors on, at the
 * first cut (cut_between) there, or the end. */
static size_t pass_end(const tps_ckpt *ck, size_t lo, size_t want, cut_seen *cs)
{
    size_t b = lo + (want ? want : 1);
    while (b < ck->n && !cut_between(ck, b, cs)) b++;
    return b < ck->n ? b : ck->n;
}

/* Before the passes: what every pass shares (the manifest's styles, the
 * rank files' headers checked, each tensor's pass unit), and the bytes to
 * read for the progress line. */
static tps_err prepare_units(vctx *V)
{
    tps_ctx *ctx = V->ctx;
    size_t nt = V->ck->n;
    V->unit_of = malloc(sizeof(int) * (nt ? nt : 1));
    if (!V->unit_of) return tps_fail(ctx, TPS_E_NOMEM, "verify: out of memory");
    for (size_t i = 0; i < nt; i++) V->unit_of[i] = -1;
    V->se = tps_va_style_index(V->ck, &V->nse);
    if (!V->se) return tps_fail(ctx, TPS_E_NOMEM, "verify: out of memory");
    for (size_t i = 0; i < nt; i++) {
        const tps_ctensor *ct = &V->ck->t[i];
        if (V->o->tensors_glob && fnmatch(V->o->tensors_glob, ct->name, 0) != 0) continue;
        if (tps_vp_is_packed(V, i)) continue;
        for (int p = 0; p < ct->npieces + ct->nreplicas; p++) {
            const tps_piece *pc = p < ct->npieces ? &ct->pieces[p] : &ct->replicas[p - ct->npieces];
            if (pc->rank < V->tp && V->local[pc->rank]) V->total_bytes += pc->nbytes;
        }
    }
    return TPS_OK;
}

/* The pass's tensors [lo, hi): a unit for each (packed tensors are checked
 * on their own, now), classified, paired into blocks and queued. */
static tps_err build_units(vctx *V, size_t lo, size_t hi)
{
    tps_ctx *ctx = V->ctx;
    const tps_verify_opts *o = V->o;
    tps_err rc = TPS_OK;
    size_t nt = hi - lo;
    V->u = calloc(nt ? nt : 1, sizeof *V->u);
    TPS_FAIL_IF(!V->u, ctx, TPS_E_NOMEM, "verify: out of memory");
    for (size_t i = lo; i < hi; i++) {
        if (o->tensors_glob && fnmatch(o->tensors_glob, V->ck->t[i].name, 0) != 0) continue;
        if (tps_vp_is_packed(V, i)) {
            TPS_CHECK(tps_vp_check(V, i));
            V->npacked++;
            continue;
        }
        vunit *u = &V->u[V->nu];
        u->t = i;
        u->ct = &V->ck->t[i];
        V->unit_of[i] = (int)V->nu++;
        TPS_CHECK(tps_va_analyze_unit(V, u));
    }
    V->nu_all += V->nu;
    for (size_t i = 0; i < V->nu; i++) tps_va_classify(V, &V->u[i], V->se, V->nse);
    TPS_CHECK(tps_va_find_blocks(V));
    TPS_CHECK(tps_va_build_order(V));
out:
    return rc;
}

/* One pass: its units built, their tasks run on the threads and finished in
 * queue order, a source that is not the one split named, the units let go. */
static tps_err run_pass(vctx *V, size_t lo, size_t hi, int nth)
{
    tps_ctx *ctx = V->ctx;
    tps_err rc = TPS_OK;
    TPS_CHECK(build_units(V, lo, hi));
    if (V->nu) {
        /* GPU slots are per thread: keep the team at the size given to the backend */
#ifdef _OPENMP
#pragma omp parallel num_threads(nth)
#endif
        tps_vt_work(V);
        tps_vf_drain(V);
    }
    if (atomic_load(&V->err)) {
        rc = V->rc ? V->rc : TPS_E_INTERRUPTED;
        goto out;
    }
    TPS_FAIL_IF(V->next_final != V->nu, ctx, TPS_E_IO, "verify: %zu tensors left unfinished",
                V->nu - V->next_final);
    if (V->src && !V->R->ok) TPS_CHECK(blame_source(V));
out:
    free_units(V);
    return rc;
}

/* After the tasks, the rows of the directory as a whole: a serving
 * layout's other bytes (zero padding, the engine's constants) and the
 * source tensors the shards lack. */
static tps_err check_rest(vctx *V)
{
    tps_ctx *ctx = V->ctx;
    const tps_verify_opts *o = V->o;
    tps_verify_report *R = V->R;
    tps_err rc = TPS_OK;
    /* a serving layout's other bytes: zero padding, the engine's constants */
    if (V->ck->nrts && !o->tensors_glob) {
        size_t nz = 0;
        for (size_t k = 0; k < V->ck->nrts; k++)
            for (size_t j = 0; j < V->ck->rts[k].nxfills; j++)
                nz += V->ck->rts[k].xfills[j].kind != TPS_FILL_SOURCE;
        tps_err fe = tps_check_fills(ctx, V->ck);
        TPS_FAIL_IF(fe && fe != TPS_E_MISMATCH, ctx, fe, "%s", tps_ctx_errmsg(ctx));
        TPS_FAIL_IF(tps_va_rep_add(R, "padding and constants", "padding", 0, 0, fe ? 1 : 0, nz, !fe,
                            fe ? tps_strdup(tps_ctx_errmsg(ctx)) : NULL),
                    ctx, TPS_E_NOMEM, "verify: out of memory");
    }
    /* source tensors the shards lack */
    if (V->src) {
        for (size_t i = 0; i < V->src->n; i++) {
            const char *nm = V->src->t[i].name;
            if (o->tensors_glob && fnmatch(o->tensors_glob, nm, 0) != 0) continue;
            if (tps_ckpt_find(V->ck, nm) >= 0 || tps_ckpt_dropped(V->ck, nm)) continue;
            TPS_FAIL_IF(tps_va_rep_add(R, nm, "reconstruct", 0, 0, V->src->t[i].nbytes,
                                V->src->t[i].nbytes, 0,
                                tps_strdup("in the source but missing from the shards")),
                        ctx, TPS_E_NOMEM, "verify: out of memory");
        }
    }
out:
    return rc;
}

/* With pipeline stages: the whole (every layer's tensors on the ranks of the
 * one stage the manifest gives that layer), then a row per stage summing
 * the checks of its layers. */
static tps_err check_stages(vctx *V)
{
    const tps_ckpt *ck = V->ck;
    tps_verify_report *R = V->R;
    int tp = ck->tp, pp = ck->pp;
    if (pp <= 1) return TPS_OK;
    int nl = ck->stage_first[pp - 1] + ck->stage_layers[pp - 1];
    uint64_t n = 0, bad = 0;
    char *note = NULL;
    for (size_t i = 0; i < ck->n; i++) {
        const tps_ctensor *t = &ck->t[i];
        int layer = tps_layer_of_name(t->name);
        if (layer < 0 || (V->o->tensors_glob && fnmatch(V->o->tensors_glob, t->name, 0) != 0))
            continue;
        n++;
        int want = -1;
        for (int s = 0; s < pp && layer < nl; s++)
            if (layer >= ck->stage_first[s] && layer < ck->stage_first[s] + ck->stage_layers[s])
                want = s;
        for (int p = 0; p < t->npieces + t->nreplicas; p++) {
            const tps_piece *pc = p < t->npieces ? &t->pieces[p] : &t->replicas[p - t->npieces];
            if (pc->rank / tp == want) continue;
            bad++;
            if (!note)
                note = want < 0 ? tps_asprintf("%s: layer %d is in no stage (%d layers)", t->name,
                                               layer, nl)
                                : tps_asprintf("%s: layer %d is stage %d's, but rank %d (stage %d) "
                                               "holds it",
                                               t->name, layer, want, pc->rank, pc->rank / tp);
            break;
        }
    }
    if (tps_va_rep_add(R, "pipeline: every layer on its stage's ranks", "stage", 0, 0, bad, n,
                       !bad, note))
        return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    if (bad) R->ok = 0;
    size_t nrows = R->n;
    for (int s = 0; s < pp; s++) {
        uint64_t rows = 0, failed = 0;
        int lo = ck->stage_first[s], hi = lo + ck->stage_layers[s];
        for (size_t k = 0; k < nrows; k++) {
            int layer = tps_layer_of_name(tps_va_row(R, k)->check);
            if (layer < lo || layer >= hi) continue;
            rows++;
            failed += !tps_va_row(R, k)->ok;
        }
        char *name = tps_asprintf("stage %d: layers %d-%d on ranks %d-%d", s, lo, hi - 1, s * tp,
                                  s * tp + tp - 1);
        int e = !name || tps_va_rep_add(R, name, "stage", 0, 0, failed, rows, !failed,
                                        failed ? tps_asprintf("%llu of its checks failed",
                                                              (unsigned long long)failed)
                                               : NULL);
        free(name);
        if (e) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    }
    return TPS_OK;
}

tps_err tps_verify(tps_ctx *ctx, const tps_verify_opts *o, tps_verify_report **out)
{
    if (out) *out = NULL;
    if (!ctx || !o || !out || !o->dir)
        return tps_fail(ctx, TPS_E_ARG, "verify: no directory given");
    if (o->batch < 1 || o->batch > MAX_BATCH)
        return tps_fail(ctx, TPS_E_ARG, "verify: batch %d out of range 1..%d", o->batch, MAX_BATCH);
    if (o->backend != TPS_BACKEND_CPU && o->backend != TPS_BACKEND_CUDA &&
        o->backend != TPS_BACKEND_NCCL)
        return tps_fail(ctx, TPS_E_ARG, "verify: unknown backend %d", (int)o->backend);
    double t0 = now_s();
    vctx V0, *V = &V0;
    memset(V, 0, sizeof *V);
    V->ctx = ctx;
    V->o = o;
    V->backend = o->backend;
    V->batch = o->batch;
    pthread_mutex_init(&V->fin_mu, NULL);
    pthread_mutex_init(&V->err_mu, NULL);
    atomic_init(&V->next, 0);
    atomic_init(&V->bytes, 0);
    atomic_init(&V->err, 0);
    tps_err rc = TPS_OK;
    tps_verify_report *R = calloc(1, sizeof *R);
    if (!R) {
        rc = tps_fail(ctx, TPS_E_NOMEM, "verify: out of memory");
        goto out;
    }
    R->ok = 1;
    V->R = R;
    TPS_CHECK(open_inputs(V));
    if (V->ck->kind == TPS_SRC_SHARDED) R->lender = V->ck;
    int nth = tps_threads(ctx);
    if (nth < 1) nth = 1;
    TPS_CHECK(open_backend(V, nth));
    TPS_CHECK(prepare_units(V));
    if (!V->src)
        tps_log(ctx, TPS_LOG_INFO,
                "verify: no --source: checking CRC32s against the manifest; the "
                "numeric checks need --source MODEL");
    {
        cut_seen cs = {NULL, 0, 0};
        size_t want = o->tensors_per_pass ? o->tensors_per_pass : VERIFY_PASS_TENSORS;
        size_t npass = 0;
        for (size_t lo = 0, hi; lo < V->ck->n; lo = hi, npass++) {
            hi = pass_end(V->ck, lo, want, &cs);
            TPS_CHECK(run_pass(V, lo, hi, nth));
        }
        tps_log(ctx, TPS_LOG_INFO, "verify: %zu tensors in %zu pass%s", V->ck->n, npass,
                npass == 1 ? "" : "es");
    }
    TPS_FAIL_IF(o->tensors_glob && V->nu_all == 0 && V->npacked == 0, ctx, TPS_E_ARG,
                "verify: --tensors '%s' matches no tensor in %s", o->tensors_glob, o->dir);
    TPS_CHECK(check_rest(V));
    TPS_CHECK(tps_vd_check(V));
    TPS_CHECK(tps_vm_check(V));
    TPS_CHECK(check_stages(V));
    if (V->gpu) {
        uint64_t bad = R->ok ? 0 : 1;
        TPS_CHECK(tps_gpu_sum_u64(ctx, V->gpu, &bad));
        if (bad) R->ok = 0;
    }
    R->bytes = atomic_load(&V->bytes);
    R->seconds = now_s() - t0;
    *out = R;
    R = NULL;
out:
    vctx_free(V);
    tps_verify_report_free(R);
    return rc;
}
