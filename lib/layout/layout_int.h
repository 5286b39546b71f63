/* layout_int.h - what the files of lib/layout/ share: the compile state
 * (cstate) every stage of tps_layout_compile works on, and the helpers the
 * stages call. Private to lib/layout/; the compiled layout itself
 * (tps_layout, tps_rtensor, tps_lpiece, tps_region) is in lib/internal.h.
 *
 * Where things are:
 *   layout.c          the IR and its queries: alloc/free, placements by the
 *                     plan and its checks, the built-in layout files, regions'
 *                     geometry, the views
 *   layout_compile.c  tps_layout_compile, the driver: its stages in order;
 *                     the state's helpers (refusals, rank tensors, pieces,
 *                     regions, splits, config counts), the layout's served and
 *                     acceptance checks, place_simple (one tensor, any split)
 *   layout_fuse.c     fused projections (q/k/v, gate/up), packed sections
 *                     (Phi-3's qkv_proj), when a fused module has a bias
 *   layout_experts.c  experts stacked per module, their routers, --ep
 *   layout_mxfp4.c    gpt-oss's MXFP4 experts: vLLM's uneven block cut, zero tails
 *   layout_scales.c   quantization scales: following their weight's split,
 *                     fused with it, widened to F32
 *   layout_vocab.c    the padded vocabulary, the tied head, the engine's extra
 *                     entries, the engine's key set (keys, drop)
 *   layout_pp.c       pipeline stages: the partition, the tp ranks' tensors put
 *                     on the workers of the stages that build them
 *   layout_finish.c   finishing: regions and rank tensors sorted, every source
 *                     tensor's pieces indexed; the checks list (add_check)
 * A quantization method: its table entry is in lib/quant/; how its scales
 * follow a split goes in layout_scales.c. An expert format: a layout file's
 * experts entry, read by layout_experts.c. A family: a plan and a layout file
 * (plans/), code only for a construct no stage has yet. */
#ifndef TPS_LAYOUT_INT_H
#define TPS_LAYOUT_INT_H

#include "internal.h"

/* One tps_layout_compile: the layout being filled, and what the stages
 * share while they fill it. */
typedef struct {
    tps_ctx *ctx;
    tps_layout *L;
    const tps_ckpt *ck;
    int tp;
    size_t cap_rt;
    unsigned char *used; /* per source tensor: placed */
    size_t *last, *next; /* per source tensor its newest region; per region the one before */
    char why[1024];      /* the first refusal */
    int epad_said;       /* the experts' padding is in the checks list */
    int in_experts;      /* placing experts (their padding is L->epad_*) */
    /* A compile for some ranks (L->keep): the other ranks' tensors are made in
     * scratch (a few at a time, never kept) and their regions are ghosts,
     * which keep only what tells a later piece whether it is a replica. */
    tps_rtensor scratch[4];
    uint64_t scratch_shape[4][TPS_MAX_DIMS];
    unsigned nscratch;
    struct tps_ghost *gh;
    size_t ngh, cap_gh;
    unsigned char *placed; /* per source tensor: a piece of it on some rank */
    size_t last_ghost;     /* the ghost the last piece made, or SIZE_MAX */
    size_t gh_none;        /* 1 + an unlinked ghost standing for regions no one keeps, or 0 */
    int last_replica;      /* the last piece added is a replica */
} cstate;

/* Is r a tensor of a rank the compile does not keep (made in C->scratch)? */
static inline int tps_lc_scratch(const cstate *C, const tps_rtensor *r)
{
    return r >= C->scratch && r < C->scratch + 4;
}

/* layout.c */
const char *tps_lc_param_of(const char *name); /* "weight" of "a.b.weight" */
/* Bits of one step along dim d (the product of the dims after it). */
uint64_t tps_lc_inner_bits(const tps_ctensor *t, int d);

/* Every stage refuses this way (what the layout cannot do for this
 * checkpoint): the first refusal's reason goes to C->why, and
 * tps_layout_compile records it as L->rejected and stops. Returns 1. Static
 * inline, like nomem, so that the stages' calls read as they always have. */
static inline int refuse(cstate *C, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline int refuse(cstate *C, const char *fmt, ...)
{
    if (!C->why[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(C->why, sizeof C->why, fmt, ap);
        va_end(ap);
    }
    return 1;
}

static inline tps_err nomem(cstate *C)
{
    return tps_fail(C->ctx, TPS_E_NOMEM, "out of memory");
}

/* layout_compile.c: the compile state's helpers */
/* A new rank tensor (its shape copied, no pieces yet). */
tps_err tps_lc_new_rt(cstate *C, const char *name, int rank, tps_dtype dt, int ndim,
                      const uint64_t *shape, const char *rule, tps_rtensor **out);
tps_err tps_lc_add_piece(cstate *C, tps_rtensor *r, tps_lpiece p);
/* Adds source piece [lo, hi) along dim of src to r at byte at. */
tps_err tps_lc_src_piece(cstate *C, tps_rtensor *r, size_t src, int dim, uint64_t lo,
                         uint64_t hi, uint64_t at);
/* The same, refined by x (a scale on vLLM's refined grid): nbytes stored. */
tps_err tps_lc_src_piece_x(cstate *C, tps_rtensor *r, size_t src, int dim, uint64_t lo,
                           uint64_t hi, uint64_t at, const tps_xform *x, uint64_t nbytes);
/* The same, transposed (tps_xform.tr): the region's last two dims swapped. */
tps_err tps_lc_src_piece_tr(cstate *C, tps_rtensor *r, size_t src, int dim, uint64_t lo,
                            uint64_t hi, uint64_t at);
/* The same, strided: its bytes in runs of `run` bytes, the rank tensor's
 * last-dim stride apart (a part concatenated along the last dim). */
tps_err tps_lc_src_piece_run(cstate *C, tps_rtensor *r, size_t src, int dim, uint64_t lo,
                             uint64_t hi, uint64_t at, uint64_t run);
/* The same, its runs a step of the rank tensor's dim sdim - 1 apart. */
tps_err tps_lc_src_piece_stride(cstate *C, tps_rtensor *r, size_t src, int dim, uint64_t lo,
                                uint64_t hi, uint64_t at, uint64_t run, int sdim);
/* Keeps made-up name s with the layout (NULL, s freed, on failure). */
char *tps_lc_own_name(cstate *C, char *s);
/* Rank r's rows of a fused part of n rows: on whole heads, or evenly. */
int tps_lc_part_rows(uint64_t n, uint64_t heads, int replicate, int tp, int r, int exact,
                     uint64_t *lo, uint64_t *len);
/* "1, 2, 4, 8" of the tp values up to 64 for which ok(n, n2, tp) holds. */
void tps_lc_works_list(char *buf, size_t len, uint64_t n, uint64_t n2,
                       int (*ok)(uint64_t, uint64_t, int));
int tps_lc_ok_divides(uint64_t n, uint64_t unused, int tp);
/* A config count (top level or text_config), or 0 when absent or not one. */
uint64_t tps_lc_config_count(const cJSON *config, const char *field, int *present);
/* Is layer one of the last config[field] of num_hidden_layers (field 0 or
 * absent: none)? *first: the first of them. */
int tps_lc_last_layers(const cJSON *config, const char *field, int layer, uint64_t *first);
int tps_lc_module_of(const char *name, size_t *mlen);
int tps_lc_matches_any(char **pats, size_t n, const char *name);
/* Is the checkpoint's model_type one of types (none listed: any)? */
int tps_lc_type_listed(char **types, size_t n, const cJSON *config);
/* Appends the config.json setting that makes condition c hold to buf. */
void tps_lc_enable_hint(char *buf, size_t len, const tps_cond *c);
/* A layout file's override for a tensor named so: 1 and its split in *k
 * (a refusal's reason in *why), or 0 when none matches. */
int tps_lc_spec_rule(const tps_layout *L, const char *name, tps_split_kind *k, const char **why);
/* The split a serving layout gives source tensor i; a refusal's reason in *why. */
tps_split_kind tps_lc_spec_split(const tps_layout *L, size_t i, const char **why);
/* Source tensor i under name on every rank, split as k says. */
tps_err tps_lc_place_simple(cstate *C, size_t i, const char *name, tps_split_kind k,
                            const char *rule);

/* layout_fuse.c */
/* Packed tensors hold the rows their config says: 0 and a refusal if not. */
int tps_lc_packed_fit(cstate *C);
tps_err tps_lc_compile_fused(cstate *C);

/* layout_experts.c */
/* Is name a tensor of an expert the layout's experts entries stack? */
int tps_lc_is_expert(const cstate *C, const char *name);
int tps_lc_ep_served(cstate *C); /* --ep: 0 and a refusal for the DTensor layout */
tps_err tps_lc_compile_experts(cstate *C);

/* layout_scales.c */
/* Weight w's scale (and input scale) on rank r, following its [lo, lo + len) along d. */
tps_err tps_lc_place_scales(cstate *C, size_t w, int r, int d, uint64_t lo, uint64_t len);
/* The same for a weight whose input features along d are padded from `real`
 * (--pad-intermediate): block scale columns past the source's are 1.0. */
/* --pad-intermediate of experts of intermediate size I: *Ip (layout_packed.c). */
tps_err tps_lc_expert_pad(cstate *C, const tps_lexperts *x, uint64_t I, uint64_t unit,
                          const char *what, uint64_t *Ip);
/* Source tensor src's [lo, hi) along dim d (0: rows, 1: columns of a 2-D
 * tensor) at `at` of rank tensor rt, of which the source holds [0, have):
 * the rest is --pad-intermediate's, zero bytes (value 0) or the constant
 * value, rows after the real ones or columns beside them (runs a row
 * apart). */
tps_err tps_lc_padded_piece(cstate *C, tps_rtensor *rt, size_t src, int d, uint64_t lo,
                            uint64_t hi, uint64_t have, uint64_t at, double value);
/* vLLM's refined grid for FP8 experts of I x H at this tp: g, or 0 (none). */
uint64_t tps_lc_refined_grid(const cstate *C, uint64_t I, uint64_t H);
tps_err tps_lc_place_scales_padded(cstate *C, size_t w, int r, int d, uint64_t lo, uint64_t len,
                                   uint64_t real);
/* A fused group's scales on rank r, in the parts' order. */
tps_err tps_lc_place_fused_scales(cstate *C, const tps_lfuse *f, const size_t *idx, int r,
                                  const uint64_t *lo, const uint64_t *len,
                                  const uint64_t *heads, const uint64_t *nrows_of,
                                  const char *scale_name, const char *input_name);

/* Experts' FP8 blocks whole on every rank (or a refusal with the tp values
 * that work): 0 when they are not; w0 is expert 0's first weight. */
int tps_lc_expert_scales_ok(cstate *C, const char *module, size_t w0, uint64_t E, uint64_t I,
                            uint64_t H);
/* The scales (and input scales) of stack st on rank r, beside its weights:
 * idx[e * nidx + k0 + j] is expert e's part j; Er experts on the rank. */
tps_err tps_lc_place_stack_scales(cstate *C, const char *module, const char *into,
                                  const tps_lstack *st, const size_t *idx, size_t nidx,
                                  size_t k0, uint64_t Er, uint64_t I, int r);

/* layout_vocab.c */
/* Rows per rank of a padded vocabulary of n rows: 0 and a refusal when an
 * even split does not divide. */
int tps_lc_vocab_rows(cstate *C, const tps_ctensor *t, uint64_t n, uint64_t *per);
/* The tied head: *emb the embedding it is written from, or -1. */
tps_err tps_lc_tied_head(cstate *C, int *emb);
/* The engine's own entries beside fused module parent. */
tps_err tps_lc_place_extras(cstate *C, const tps_lfuse *f, const char *parent);
tps_err tps_lc_drop(cstate *C); /* what the engine's load_weights skips */
/* 1 and a refusal when the engine's key set lacks source tensor i. */
int tps_lc_unkeyed(cstate *C, size_t i, int emb);
/* Does the layout's key set (none listed: any) name parameter `name`? */
int tps_lc_engine_key(const cstate *C, const char *name);
/* The dtype the engine serves the model in, and creates its parameters in. */
tps_dtype tps_lc_serving_dtype(const cJSON *config);

/* layout_packed.c */
/* Packed integer methods (GPTQ, AWQ): every quantized linear's tensors,
 * fused and cut as the engine loads them. */
tps_err tps_lc_compile_packed(cstate *C);
/* --pad-intermediate: the MLP's padded size at tp (L->pad_*), or a refusal. */
tps_err tps_lc_pad_setup(cstate *C);
/* The E experts of module (layout experts entry x) of a packed method:
 * each stack's every part stacked [E, ...] as the engine's fused MoE holds it. */
tps_err tps_lc_packed_experts(cstate *C, const tps_lexperts *x, const char *module, uint64_t E);

/* layout_mxfp4.c */
/* gpt-oss's MXFP4 experts of module (layout experts entry x, E experts of
 * intermediate size I, hidden size H): every stack's blocks, scales and
 * bias as vLLM's gpt-oss loader holds them for L->moe, or a refusal. */
tps_err tps_lc_mxfp4_experts(cstate *C, const tps_lexperts *x, const char *module, uint64_t E,
                             uint64_t I, uint64_t H);
/* gpt-oss's BF16 experts of module: each stack's weight transposed per
 * expert (w13 its rank's interleaved columns, w2 its rows) and its bias, as
 * vLLM's gpt-oss loader holds them, or a refusal. */
tps_err tps_lc_transposed_experts(cstate *C, const tps_lexperts *x, const char *module,
                                  uint64_t E, uint64_t I, uint64_t H);

/* layout_pp.c */
/* L's stages: pp and the partition (layers, or the engine's), checked. */
tps_err tps_lc_pp_setup(tps_ctx *ctx, tps_layout *L, int pp, const int *layers);
/* The tp ranks' tensors on the workers of the stages that build them. */
tps_err tps_lc_pipeline(cstate *C);

/* layout_finish.c */
tps_err tps_lc_add_check(cstate *C, const char *name, int ok, const char *detail);
tps_err tps_lc_finish(cstate *C);

#endif
