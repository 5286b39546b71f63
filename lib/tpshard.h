/*
 * tpshard.h - public API of libtpshard: tensor-parallel resharding of
 * safetensors checkpoints.
 *
 * Ownership, once for the whole header (after jq's jv.h):
 *  - Every handle made by tps_X_open/new is freed by tps_X_free; every
 *    tps_X_free(NULL) is a no-op.
 *  - Strings and arrays returned through accessors are BORROWED: they live as
 *    long as the handle they came from and must not be freed.
 *  - Strings returned through `char **out` parameters are OWNED by the caller,
 *    who frees them with free().
 *  - A tps_ctx carries the error detail of the last failed call, the log
 *    callback and the thread count. Use one ctx per thread of the caller.
 *
 * The library never prints and never exits: it reports through the ctx's log
 * callback and the returned tps_err.
 */
#ifndef TPSHARD_H
#define TPSHARD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TPS_VERSION_STRING "0.1.0"

/* Stable error numbers: never renumber, only append. */
typedef enum {
    TPS_OK = 0,
    TPS_E_IO = 1,          /* open/read/write/fsync/rename failed (errno in detail) */
    TPS_E_NOMEM = 2,       /* allocation failed or a resource bound was hit */
    TPS_E_FORMAT = 3,      /* malformed safetensors file */
    TPS_E_JSON = 4,        /* malformed JSON (config.json, index, manifest) */
    TPS_E_INDEX = 5,       /* inconsistent model.safetensors.index.json */
    TPS_E_CONFIG = 6,      /* config.json lacks or has a bad value */
    TPS_E_PLAN = 7,        /* malformed plan file */
    TPS_E_REJECT = 8,      /* the plan rejects tensor parallelism for this model */
    TPS_E_ARG = 9,         /* bad argument from the caller */
    TPS_E_EXISTS = 10,     /* output exists and overwrite was not allowed */
    TPS_E_MISMATCH = 11,   /* check/verify found data that disagrees */
    TPS_E_UNSUPPORTED = 12,/* feature not built in (e.g. CUDA backend) */
    TPS_E_INTERRUPTED = 13,/* stopped by a signal */
    TPS_E_NOSPACE = 14,    /* not enough free space or file size limit */
    TPS_E_DEVICE = 15,     /* CUDA, cuBLAS or NCCL error */
    TPS_E_SHAPE = 16,      /* a tensor cannot be split as the plan asks */
    TPS_E_PARTIAL = 17,    /* ranks missing: split --ranks runs have not filled the directory */
} tps_err;

const char *tps_strerror(tps_err e);
const char *tps_version(void);

/* ------------------------------------------------------------------ ctx */

typedef enum { TPS_LOG_ERROR = 0, TPS_LOG_WARN = 1, TPS_LOG_INFO = 2, TPS_LOG_DEBUG = 3 } tps_log_level;
typedef void (*tps_log_fn)(void *user, tps_log_level level, const char *msg);
/* Progress: bytes done of total, and the tensor being worked on (may be NULL). */
typedef void (*tps_progress_fn)(void *user, uint64_t done, uint64_t total, const char *what);

typedef struct tps_ctx tps_ctx;
tps_ctx *tps_ctx_new(void);
void tps_ctx_free(tps_ctx *ctx);
void tps_ctx_set_log(tps_ctx *ctx, tps_log_fn fn, void *user);
void tps_ctx_set_progress(tps_ctx *ctx, tps_progress_fn fn, void *user);
void tps_ctx_set_threads(tps_ctx *ctx, int nthreads); /* <= 0: all cores */
/* Detail of the last error: "<file>: <tensor>: <rule>" style, never NULL. */
const char *tps_ctx_errmsg(const tps_ctx *ctx);
/* Ask running work to stop (async-signal-safe: sets a flag). */
void tps_ctx_interrupt(tps_ctx *ctx);

/* ------------------------------------------------------------------ dtype */

typedef enum {
    TPS_BOOL = 0, TPS_F4, TPS_F6_E2M3, TPS_F6_E3M2, TPS_U8, TPS_I8,
    TPS_F8_E5M2, TPS_F8_E4M3, TPS_F8_E8M0, TPS_F8_E4M3FNUZ, TPS_F8_E5M2FNUZ,
    TPS_I16, TPS_U16, TPS_F16, TPS_BF16, TPS_I32, TPS_U32, TPS_F32,
    TPS_C64, TPS_F64, TPS_I64, TPS_U64,
    TPS_DTYPE_COUNT_ /* internal */
} tps_dtype;

const char *tps_dtype_name(tps_dtype d);
int tps_dtype_from_name(const char *name, tps_dtype *out); /* 0 ok, -1 unknown */
unsigned tps_dtype_bits(tps_dtype d);
int tps_dtype_is_float(tps_dtype d); /* converts to f32 for verify */

/* ------------------------------------------------------------------ sizes */

/* "5G", "512M", "1.5G", "4096": K/M/G/T binary multiples. 0 ok, -1 bad. */
int tps_parse_size(const char *s, uint64_t *out);
/* "0,3-5" -> mask of ranks < tp. 0 ok, -1 bad. mask has tp entries. */
int tps_parse_ranks(const char *s, int tp, unsigned char *mask);

/* ------------------------------------------------------------------ views */

#define TPS_MAX_DIMS 16

/* A borrowed view of one tensor of a file or a checkpoint. */
typedef struct {
    const char *name;
    tps_dtype dtype;
    int ndim;
    const uint64_t *shape;
    uint64_t nbytes;
    const char *file;   /* basename of the file holding it (checkpoint: first piece) */
    uint64_t offset;    /* data offset inside that file's data section */
} tps_tensor_view;

/* ------------------------------------------------------------------ safetensors file */

typedef struct tps_st tps_st;
/* Opens and validates one file read-only; reads only the header. */
tps_err tps_st_open(tps_ctx *ctx, const char *path, tps_st **out);
void tps_st_free(tps_st *st);
size_t tps_st_count(const tps_st *st);
void tps_st_tensor(const tps_st *st, size_t i, tps_tensor_view *v); /* header order sorted by offset */
size_t tps_st_meta_count(const tps_st *st);
void tps_st_meta(const tps_st *st, size_t i, const char **key, const char **val);
uint64_t tps_st_data_start(const tps_st *st); /* 8 + N */
/* Validate a header held in memory (for fuzzing and tests). */
tps_err tps_st_parse_buffer(tps_ctx *ctx, const char *label, const void *buf, size_t len,
                            uint64_t file_size);

/* ------------------------------------------------------------------ checkpoint */

typedef struct tps_ckpt tps_ckpt;
typedef enum { TPS_SRC_FILE = 0, TPS_SRC_DIR = 1, TPS_SRC_INDEX = 2, TPS_SRC_SHARDED = 3 } tps_src_kind;

/* MODEL: a directory (config.json + model.safetensors or index + parts), one
 * .safetensors file, or a tpshard output directory (read through tpshard.json
 * as if it were the full checkpoint). */
tps_err tps_ckpt_open(tps_ctx *ctx, const char *path, tps_ckpt **out);
void tps_ckpt_free(tps_ckpt *ck);
tps_src_kind tps_ckpt_kind(const tps_ckpt *ck);
const char *tps_ckpt_path(const tps_ckpt *ck);
const char *tps_ckpt_dir(const tps_ckpt *ck);      /* directory holding it */
const char *tps_ckpt_stem(const tps_ckpt *ck);     /* dir name or file stem */
size_t tps_ckpt_count(const tps_ckpt *ck);
void tps_ckpt_tensor(const tps_ckpt *ck, size_t i, tps_tensor_view *v); /* sorted by name */
int tps_ckpt_find(const tps_ckpt *ck, const char *name); /* index or -1 */
size_t tps_ckpt_file_count(const tps_ckpt *ck);
const char *tps_ckpt_file(const tps_ckpt *ck, size_t i);
uint64_t tps_ckpt_total_bytes(const tps_ckpt *ck);
int tps_ckpt_has_config(const tps_ckpt *ck);
/* A config.json value (top level, then text_config) as JSON text into buf:
 * 0 found, -1 absent (or no config). */
int tps_ckpt_config_value(const tps_ckpt *ck, const char *field, char *buf, size_t len);
/* Reads bytes [off, off+len) of tensor i as its row-major bytes. */
tps_err tps_ckpt_read(tps_ctx *ctx, const tps_ckpt *ck, size_t i, uint64_t off, void *buf,
                      size_t len);

/* ------------------------------------------------------------------ quantization */

typedef struct {
    const char *method;       /* quant_method ("fp8", "compressed-tensors"); NULL: none */
    int supported;            /* 0: split refuses it, problem says why */
    const char *problem;      /* borrowed from the ctx until its next call, or NULL */
    uint64_t block_rows, block_cols; /* 0: no blocks */
    size_t weights;           /* quantized (FP8) weights */
    size_t block_scales, channel_scales, tensor_scales, input_scales;
    /* packed integer methods (GPTQ, AWQ): code bits, input features per
     * group (-1: one group), 0 bits otherwise; group_scales counts their
     * grouped scales (channel_scales the one-group ones) */
    int bits;
    int64_t group_size;
    size_t group_scales;
} tps_quant_view;

/* The quantization of ck's tensors, as split reads it: every FP8 weight, its
 * scale and how the scale follows it. Not quantized: v->method NULL. */
tps_err tps_ckpt_quantization(tps_ctx *ctx, const tps_ckpt *ck, tps_quant_view *v);

/* ------------------------------------------------------------------ plan */

typedef struct tps_plan tps_plan;
typedef enum {
    TPS_STYLE_REPLICATE = 0, TPS_STYLE_COLWISE, TPS_STYLE_ROWWISE,
    TPS_STYLE_EMBED_ROWWISE, TPS_STYLE_EMBED_COLWISE, TPS_STYLE_SEQPAR,
} tps_style;
const char *tps_style_name(tps_style s);

/* Load from YAML text; label names it in errors ("plans/llama.yaml"). */
tps_err tps_plan_parse(tps_ctx *ctx, const char *label, const char *text, size_t len,
                       tps_plan **out);
tps_err tps_plan_load(tps_ctx *ctx, const char *path, tps_plan **out);
/* Built-in plans (compiled in from plans/). */
size_t tps_plan_builtin_count(void);
const char *tps_plan_builtin_name(size_t i);
const char *tps_plan_builtin_text(size_t i, size_t *len);
tps_err tps_plan_builtin(tps_ctx *ctx, const char *family, tps_plan **out);
/* Pick the built-in plan whose `serves` matches the checkpoint's config. */
tps_err tps_plan_detect(tps_ctx *ctx, const tps_ckpt *ck, tps_plan **out);
void tps_plan_free(tps_plan *p);
const char *tps_plan_name(const tps_plan *p);
const char *tps_plan_description(const tps_plan *p);

/* Unties a tied checkpoint in this handle (split --untie): the plan's first
 * `untie` entry whose embedding is in the checkpoint gives the head, which
 * becomes one more tensor holding the embedding's bytes, and the config
 * (what the checks read, and the config.json a split writes) says
 * tie_word_embeddings false. A split records both in its manifest, so check,
 * verify and merge know the head is derived (merge gives back the tied
 * original). TPS_E_ARG when the checkpoint is not tied, has no such
 * embedding, lacks config.json or the plan names no untie entry. Call it
 * before tps_layout_new. */
tps_err tps_ckpt_untie(tps_ctx *ctx, tps_ckpt *ck, const tps_plan *plan);
/* The untied head and the embedding it was written from; NULL when none. */
const char *tps_ckpt_untied_head(const tps_ckpt *ck);
const char *tps_ckpt_untied_embedding(const tps_ckpt *ck);

/* ------------------------------------------------------------------ layout (plan x checkpoint x tp) */

typedef struct tps_layout tps_layout;

typedef struct {
    const char *name;      /* check name, e.g. "num_key_value_heads % tp == 0" */
    int ok;                /* 1 pass, 0 fail, -1 skipped */
    const char *detail;    /* verdict in words */
} tps_check_view;

typedef struct {
    const char *name;
    tps_dtype dtype;
    int ndim;
    const uint64_t *shape;  /* global */
    tps_style style;
    int dim;                /* shard dim, -1 = replicated */
    const char *rule;       /* the pattern that matched, or NULL */
} tps_placement_view;

/* Layout files: how an engine's rank files differ from the plan's DTensor
 * shards (fused projections, replicated KV heads, a padded vocabulary...);
 * see tpshard-plan(5), LAYOUT FILES. NULL stands for the DTensor layout
 * ("dtensor") wherever a spec is taken. Built in: "vllm", "sglang". */
typedef struct tps_lspec tps_layout_spec;
size_t tps_layout_spec_builtin_count(void);
const char *tps_layout_spec_builtin_name(size_t i);
tps_err tps_layout_spec_builtin(tps_ctx *ctx, const char *name, tps_layout_spec **out);
tps_err tps_layout_spec_load(tps_ctx *ctx, const char *path, tps_layout_spec **out);
void tps_layout_spec_free(tps_layout_spec *s);
const char *tps_layout_spec_name(const tps_layout_spec *s);   /* "dtensor" for NULL */
const char *tps_layout_spec_target(const tps_layout_spec *s); /* "vllm 0.33.0"; NULL for dtensor */
const tps_layout_spec *tps_layout_spec_of(const tps_layout *L); /* NULL: dtensor */

/* Resolves every tensor's placement, runs the plan's checks (the DTensor
 * layout) or the layout's own rules (a spec), and lays out every rank's
 * tensors. Returns TPS_OK even when a check refuses; tps_layout_rejected()
 * says so. The layout borrows ck, plan and spec: free it first. */
tps_err tps_layout_new_with(tps_ctx *ctx, const tps_ckpt *ck, const tps_plan *plan,
                            const tps_layout_spec *spec, int tp, tps_layout **out);
/* The same with expert parallelism (split --ep): a serving layout that
 * stacks experts puts each expert whole on one rank, rank r holding experts
 * [r E / tp, (r + 1) E / tp); refused for the DTensor layout. */
tps_err tps_layout_new_ep(tps_ctx *ctx, const tps_ckpt *ck, const tps_plan *plan,
                          const tps_layout_spec *spec, int tp, int ep, tps_layout **out);
int tps_layout_ep(const tps_layout *L);
/* Pipeline parallelism (a layout with a pipeline section: vllm): pp stages
 * of tp ranks each, rank w = stage w / tp, tensor-parallel rank w % tp.
 * layers: pp layer counts (each >= 1, summing to the model's layers), or
 * NULL for the engine's own partition (tps_pp_default_partition). pp 1 is
 * tps_layout_new_ep. A layout without pipeline stages is TPS_E_ARG; more
 * stages than layers, or a partition of another count, TPS_E_REJECT. */
tps_err tps_layout_new_pp(tps_ctx *ctx, const tps_ckpt *ck, const tps_plan *plan,
                          const tps_layout_spec *spec, int tp, int ep, int pp, const int *layers,
                          tps_layout **out);
/* The tp values up to 64 at which every rule of the checkpoint together
 * (the plan's or the layout's: heads, KV heads, vocabulary, FP8 blocks,
 * packed words and groups, experts, --ep, pp) accepts it, ascending, in
 * out[0 .. *n): each one compiled, as split would. */
tps_err tps_layout_working_tps(tps_ctx *ctx, const tps_ckpt *ck, const tps_plan *plan,
                               const tps_layout_spec *spec, int ep, int pp, const int *layers,
                               int *out, int *n);
/* The same with split --pad-intermediate's padding (pad 1). */
tps_err tps_layout_working_tps_padded(tps_ctx *ctx, const tps_ckpt *ck, const tps_plan *plan,
                                      const tps_layout_spec *spec, int ep, int pp,
                                      const int *layers, int pad, int *out, int *n);
/* tps_layout_new_pp, with split --pad-intermediate (pad 1): where the MLP's
 * intermediate size does not split at tp on whole groups and words, it is
 * zero-padded to the next size that does (tps_layout_padding says to what). */
tps_err tps_layout_new_padded(tps_ctx *ctx, const tps_ckpt *ck, const tps_plan *plan,
                              const tps_layout_spec *spec, int tp, int ep, int pp,
                              const int *layers, int pad, tps_layout **out);
/* The padding a layout made: 1 and config.json's field, the size it had
 * and the size the rank files hold (k 0: the dense MLP's, 1: the experts');
 * 0 when none. */
int tps_layout_padding(const tps_layout *L, int k, const char **field, uint64_t *from,
                       uint64_t *to);
int tps_layout_pp(const tps_layout *L);     /* 1 without pipeline parallelism */

/* vLLM's MoE backends for MXFP4 experts (split --moe-backend, vLLM's own
 * --moe-backend names): the multiples vLLM 0.33 rounds an MXFP4 expert's
 * hidden size and per-rank intermediate size up to when it creates the
 * parameters (mxfp4_round_up_hidden_size_and_intermediate_size), on a CUDA
 * platform. Static data: nothing to free. */
typedef struct {
    const char *name;
    unsigned hidden_align, inter_align;
    const char *what;
} tps_moe_backend;
/* The default, vLLM 0.33's automatic MXFP4 choice on a Hopper GPU. */
#define TPS_MOE_BACKEND_DEFAULT "triton"
const tps_moe_backend *tps_moe_backend_find(const char *name); /* NULL: unknown */
const tps_moe_backend *tps_moe_backend_list(size_t *n);

/* Everything tps_layout_new_padded takes beside tp, and vLLM's MoE backend
 * for MXFP4 experts (NULL: TPS_MOE_BACKEND_DEFAULT), whose round-up gives
 * the shapes of gpt-oss's experts in vLLM's layout. Zeroed: pp 1, nothing
 * else asked for. */
typedef struct {
    int ep, pp;                   /* pp 0 counts as 1 */
    const int *layers;            /* pp layer counts, or NULL: the engine's partition */
    int pad;                      /* --pad-intermediate */
    const tps_moe_backend *moe_backend;
    /* [tp]: the ranks whose tensors the compile keeps, or NULL: all. A layout
     * compiled so (split's passes, tps_split_passes) is for tps_split with
     * those ranks only; its checks and refusals are the whole layout's, and
     * tps_layout_rank_bytes still counts every rank. pp 1 only. */
    const unsigned char *keep;
} tps_layout_opts;
tps_err tps_layout_new_opts(tps_ctx *ctx, const tps_ckpt *ck, const tps_plan *plan,
                            const tps_layout_spec *spec, int tp, const tps_layout_opts *o,
                            tps_layout **out);
/* tps_layout_working_tps with these options: o->pad as
 * tps_layout_working_tps_padded's, the MoE backend the layouts' own. */
tps_err tps_layout_working_tps_opts(tps_ctx *ctx, const tps_ckpt *ck, const tps_plan *plan,
                                    const tps_layout_spec *spec, const tps_layout_opts *o,
                                    int *out, int *n);
/* The MoE backend the layout laid MXFP4 experts out for; NULL when no rank
 * tensor depends on one (no MXFP4 experts, or the dtensor layout). */
const tps_moe_backend *tps_layout_moe_backend(const tps_layout *L);
int tps_layout_ranks(const tps_layout *L);  /* tp * pp: the ranks (workers) with rank files */
/* Stage s's layers: [*first, *first + *n); the whole model at pp 1 (n 0 without a count). */
void tps_layout_stage(const tps_layout *L, int s, int *first, int *n);
int tps_layout_stage_of_layer(const tps_layout *L, int layer); /* -1: no stage holds it */
int tps_layout_spec_has_pipeline(const tps_layout_spec *s);   /* 0 for dtensor (NULL) */
/* vLLM's get_pp_indices without VLLM_PP_LAYER_PARTITION: nlayers / pp a
 * stage, the remainder one each to stages pp-2, pp-3, ... */
void tps_pp_default_partition(int nlayers, int pp, int *out);
/* "15,15,16,15" (--pp-layers, VLLM_PP_LAYER_PARTITION) into pp counts: 0, or
 * -1 with why (a count of stages other than pp, a stage of 0, not numbers). */
int tps_pp_parse_layers(const char *s, int pp, int *out, char *why, size_t whylen);
/* Rank w's part p file name: model-rank-{w}-part-{p}.safetensors, or with
 * pp > 1 vLLM's model-pp-{w / tp}-tp-{w % tp}-part-{p}.safetensors. */
void tps_rank_file_name(int tp, int pp, int rank, int part, char *buf, size_t len);
/* The reverse: the characters of name it used (the rest is the suffix), or -1. */
int tps_rank_file_parse(const char *name, int tp, int pp, int *rank, int *part);
/* The DTensor layout: tps_layout_new_with(..., NULL, ...). */
tps_err tps_layout_new(tps_ctx *ctx, const tps_ckpt *ck, const tps_plan *plan, int tp,
                       tps_layout **out);
void tps_layout_free(tps_layout *L);
int tps_layout_tp(const tps_layout *L);
size_t tps_layout_count(const tps_layout *L);
void tps_layout_placement(const tps_layout *L, size_t i, tps_placement_view *v);
/* Local extent of tensor i on rank r along its shard dim: [start, start+len)
 * (a serving layout: the rank's first piece of it). */
void tps_layout_local(const tps_layout *L, size_t i, int rank, uint64_t *start, uint64_t *len);
/* The dim tensor i is cut along in the rank files (-1: whole on every rank);
 * a serving layout may differ from the plan's placement (replicate overrides). */
int tps_layout_dim(const tps_layout *L, size_t i);
/* Why a serving layout leaves source tensor i out of every rank file (the
 * engine's load_weights skips it; the manifest lists it as dropped), or NULL. */
const char *tps_layout_dropped(const tps_layout *L, size_t i);
uint64_t tps_layout_rank_bytes(const tps_layout *L, int rank);
/* Bytes of tensor i on rank r under the layout (replicas included). */
uint64_t tps_layout_local_bytes(const tps_layout *L, size_t i, int rank);
size_t tps_layout_check_count(const tps_layout *L);
void tps_layout_check(const tps_layout *L, size_t i, tps_check_view *v);
/* NULL when accepted, else the first failed check's reason. */
const char *tps_layout_rejected(const tps_layout *L);
const char *tps_layout_name(const tps_layout *L);   /* "dtensor", "vllm", ... */
const char *tps_layout_target(const tps_layout *L); /* NULL for dtensor */

/* What each rank file holds: rank tensors (by name), each made of pieces. */
typedef struct {
    const char *name;
    tps_dtype dtype;
    int ndim;
    const uint64_t *shape;
    uint64_t nbytes;
    size_t npieces;
    const char *rule; /* the plan pattern or layout rule that made it, or NULL */
} tps_rank_tensor_view;

typedef struct {
    const char *kind;   /* "source", "zeros" or "constant" */
    uint64_t at;        /* byte offset in the rank tensor */
    uint64_t nbytes;
    const char *source; /* source: the source tensor */
    int dim;            /* source: rows [lo, hi) along dim; -1 the whole tensor */
    uint64_t lo, hi;
    int replica;        /* source: a copy of bytes another rank holds as well */
    double value;       /* constant: every element */
    int transposed;     /* source: held with the region's last two dims swapped */
} tps_piece_view;

size_t tps_layout_rank_tensor_count(const tps_layout *L, int rank);
void tps_layout_rank_tensor(const tps_layout *L, int rank, size_t i, tps_rank_tensor_view *v);
void tps_layout_rank_piece(const tps_layout *L, int rank, size_t i, size_t k, tps_piece_view *v);

/* The attention geometry of every layer as config.json gives it, read layer
 * by layer: transformers' per_layer_config, or for full-attention layers the
 * older Gemma4 fields global_head_dim and num_global_key_value_heads. */
typedef struct {
    const char *type;                    /* layer_types entry, or NULL */
    int64_t heads, kv_heads, head_dim;   /* -1: config.json does not say */
    /* NULL: the config's own field; else "per_layer_config" or the older field it came from */
    const char *heads_from, *kv_heads_from, *head_dim_from;
} tps_layer_view;
/* 0 without config.json or a layer count (num_hidden_layers, layer_types). */
size_t tps_layout_layer_count(const tps_layout *L);
void tps_layout_layer(const tps_layout *L, size_t i, tps_layer_view *v);

/* ------------------------------------------------------------------ split */

typedef struct {
    int tp;                     /* must equal the layout's tp (0: take the layout's) */
    const unsigned char *ranks; /* NULL = all; else tps_layout_ranks(L) entries (tp x pp
                                   workers), 1 = write (all 0: writes
                                   nothing); see tps_split on sharing a directory */
    uint64_t max_part_size;     /* 0 = one part per rank */
    int force;                  /* replace an existing output */
    const char *out_dir;
    int map_source;             /* 0: pread; 1: mappings where the source's file system
                                   allows them safely (see below); 2: mappings anywhere */
    int plain_copy;             /* every byte through this process (no clone, no
                                   copy_file_range): split --copy */
} tps_split_opts;

typedef struct {
    uint64_t bytes_written;
    uint64_t bytes_read;
    int files_written;
    int ranks_written;
    uint64_t bytes_shared;      /* of bytes_written, in blocks shared with the source */
    const char *copy;           /* how runs of the source were written: "reflink",
                                   "copy_file_range" or "write" (static) */
} tps_split_result;

/* split --ranks auto: this process's share of the ranks, from the variables
 * its launcher set. The launcher closest to the process wins, in this order:
 * RANK/WORLD_SIZE (torchrun), OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE
 * (Open MPI), PMI_RANK/PMI_SIZE (MPICH, Intel MPI), SLURM_PROCID/SLURM_NTASKS
 * (srun), SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT (a job array, counted
 * from SLURM_ARRAY_TASK_MIN in steps of SLURM_ARRAY_TASK_STEP). A pair with a
 * count of 1 is passed over for the next one that counts more. Task i of n
 * gets contiguous ranks, the first tp % n tasks one more than the others;
 * when tasks outnumber ranks the last ones get none (nranks 0). */
typedef struct {
    int index, count;      /* this process is task `index` of `count` */
    const char *index_var; /* where they came from, e.g. "SLURM_ARRAY_TASK_ID" (static) */
    const char *count_var;
    int first, nranks;     /* its ranks: [first, first + nranks) */
} tps_task;

/* env: NULL for the process's environment, else "NAME=value" strings ending
 * with NULL. TPS_E_ARG, naming the variable, when no launcher variable is
 * set, one of a pair is missing, or a value is not a task number below the
 * count. */
tps_err tps_task_from_env(tps_ctx *ctx, char *const *env, int tp, tps_task *t);
/* The share of task index of count over tp ranks, as above. */
void tps_task_ranks(int index, int count, int tp, int *first, int *nranks);

/* Writes every selected rank's files and the manifest under o->out_dir.
 *
 * Runs of source bytes (whole tensors, row ranges) go to the rank files
 * the best way the output directory's file system takes them, decided once
 * by a probe there (unless o->plain_copy): FICLONERANGE shares their whole
 * blocks with the source where the file system shares blocks (XFS, btrfs;
 * each rank file's header is then padded with spaces so that its tensors lie
 * at their source offsets modulo the block size), copy_file_range copies
 * them where it is the file system's own copy (NFS 4.2, SMB, Ceph: on the
 * server), and the copies below elsewhere (ext4, tmpfs: their
 * copy_file_range is the kernel's generic copy, slower than one copy from a
 * mapping). CRCs are of the source bytes copied, read after the copy.
 * Strided pieces are always copied below.
 *
 * By default source bytes are read with pread into buffers. With
 * o->map_source (what the tpshard command does unless --no-mmap), copy
 * tasks of 256 KiB or more read through short-lived read-only mappings of
 * their range instead, so each byte is copied once from the page cache to
 * the output; 1 keeps pread for a source on NFS, FUSE, Lustre, CIFS/SMB,
 * Ceph, AFS or 9p, where a mapping is unsafe or slow (said at
 * TPS_LOG_INFO), 2 maps there too. While such a split runs, a SIGBUS handler is installed and
 * the copy threads have SIGBUS unblocked: a source truncated by another
 * process then fails the split with TPS_E_FORMAT instead of killing the
 * program, and any other SIGBUS is handled as the action it replaced would
 * have (that action is put back on return). Either way, a source whose
 * size or modification time moved since it was opened fails the split.
 *
 * With o->ranks, runs of one split (same source, plan, layout and tp) may
 * write into one directory at the same time, from one machine or several
 * sharing a file system: each adds its ranks to the manifest under an flock
 * of DIR/.tpshard.lock and leaves the other runs' files alone, and the
 * directory ends with the bytes and the manifest one split of every rank
 * writes. Until a run has recorded its ranks in the manifest they count as
 * missing (tps_check_dir). A rank the manifest records is rewritten only
 * with o->force; an output of another split is replaced only with o->force,
 * by the first run to get the lock. Any other split into a directory that a
 * split is writing (DIR/.tpshard.writing held: exclusively by a split without
 * o->ranks, shared by --ranks runs) fails at once with TPS_E_EXISTS, naming
 * the writer's pid. */
tps_err tps_split(tps_ctx *ctx, const tps_ckpt *ck, const tps_layout *L, const tps_split_opts *o,
                  tps_split_result *res);

/* The source files' header texts let go: split's manifest, which alone
 * needs them (merge gives each file back byte for byte from it), reads them
 * from the files again, one at a time, and refuses one that changed. 11.5 MB
 * for DeepSeek-V3's 92k tensors. Safetensors sources; nothing for a split
 * directory as the source. */
void tps_ckpt_release_headers(tps_ckpt *ck);

/* tps_split of the layout tps_layout_new_opts(ctx, ck, plan, spec, tp, lo)
 * would make, in passes of ranks_per_pass ranks (0: as
 * tps_split_ranks_per_pass chooses): each pass compiles the layout for its
 * ranks only (tps_layout_opts.keep) and writes their rank files, so a split
 * holds one pass's share of the layout, not every rank's. The rank files
 * and the manifest are tps_split's, byte for byte. first: the first pass's
 * layout, already compiled with its ranks' keep mask (the caller frees it),
 * or NULL. Not for --ranks runs (o->ranks) or pipelines. It lets go of the
 * source's header texts (tps_ckpt_release_headers). */
tps_err tps_split_passes(tps_ctx *ctx, tps_ckpt *ck, const tps_plan *plan,
                         const tps_layout_spec *spec, int tp, const tps_layout_opts *lo,
                         int ranks_per_pass, tps_layout *first, const tps_split_opts *o,
                         tps_split_result *res);
/* The ranks a pass of tps_split_passes writes: asked (> 0), or for the
 * checkpoint's tensor count; every rank (one pass) for a pipeline. */
int tps_split_ranks_per_pass(const tps_ckpt *ck, int nranks, int pp, int asked);

/* What a split of L into a directory whose file system shares blocks with
 * the source (XFS with reflink, btrfs), block bytes to a block, would share
 * (*shared) and copy (*copied: the rest of the rank files, headers
 * included), with the header padding tps_split would choose there. Writes
 * nothing. TPS_E_REJECT when the layout rejects the model. */
tps_err tps_split_sharing(tps_ctx *ctx, const tps_ckpt *ck, const tps_layout *L,
                          uint64_t max_part_size, uint32_t block, uint64_t *shared,
                          uint64_t *copied);

/* ------------------------------------------------------------------ check / merge */

typedef struct {
    int tp;
    int ranks_present;
    int files_checked;
    uint64_t tensors_checked;
    uint64_t bytes_checked;
    char missing_ranks[256]; /* e.g. "1,2,5" or "" */
    int complete;            /* every rank is written and recorded in the manifest */
    int headers_checked;     /* files whose header (length, JSON, padding) has the manifest's
                              * CRC32; fewer than files_checked when the manifest predates
                              * header CRCs (a warning says so) */
    int pp;                  /* pipeline stages (1 without) */
    int ranks;               /* tp x pp ranks (workers); missing_ranks counts these */
} tps_check_result;

/* Verifies DIR against its manifest. TPS_E_MISMATCH on any disagreement.
 * A directory that --ranks runs have not finished filling is checked for the
 * ranks its manifest records, and is not complete: rank files that the
 * manifest does not record as written (a run still writing, or killed before
 * it recorded them) count as missing. */
tps_err tps_check_dir(tps_ctx *ctx, const char *dir, tps_check_result *res);

typedef struct {
    const char *out_dir;
    int force;
    int plain_copy; /* every byte through this process (merge --copy); else as tps_split */
} tps_merge_opts;
tps_err tps_merge(tps_ctx *ctx, const char *dir, const tps_merge_opts *o, int *files_written);

/* ------------------------------------------------------------------ verify */

typedef enum { TPS_BACKEND_CPU = 0, TPS_BACKEND_CUDA = 1, TPS_BACKEND_NCCL = 2 } tps_backend;

typedef struct {
    const char *dir;          /* the tpshard output directory */
    const char *source;       /* the source checkpoint, or NULL */
    tps_backend backend;
    const char *tensors_glob; /* NULL = all */
    uint64_t seed;
    int batch;                /* tokens per check, > 0 */
    const char *nccl_id_file; /* nccl multi-process bootstrap, or NULL */
    /* tensors checked a pass at a time, in name order, cut between layers
     * (0: 2048): the memory of that many tensors' checks, not every one's */
    size_t tensors_per_pass;
} tps_verify_opts;

typedef struct {
    const char *check;   /* tensor or block name */
    const char *kind;    /* "reconstruct", "colwise", "rowwise", "embedding", "mlp", "attn", ... */
    double max_abs_err;
    double tolerance;
    uint64_t wrong;      /* elements over tolerance (or bytes differing) */
    uint64_t total;      /* elements compared */
    int ok;
    const char *note;    /* NULL or a sentence */
} tps_verify_row;

typedef struct tps_verify_report tps_verify_report;
tps_err tps_verify(tps_ctx *ctx, const tps_verify_opts *o, tps_verify_report **out);
void tps_verify_report_free(tps_verify_report *r);
size_t tps_verify_report_count(const tps_verify_report *r);
const tps_verify_row *tps_verify_report_row(const tps_verify_report *r, size_t i);
int tps_verify_report_ok(const tps_verify_report *r);
/* The checks counted by kind ("reconstruct", "colwise", ...): the usual kinds
 * in a fixed order, others after, up to cap of them in out; returns how many,
 * and the totals over every check in *passed and *failed. */
typedef struct {
    const char *kind;
    unsigned passed, failed;
} tps_verify_kind_count;
size_t tps_verify_report_kinds(const tps_verify_report *r, tps_verify_kind_count *out, size_t cap,
                               unsigned *passed, unsigned *failed);
const char *tps_verify_report_backend(const tps_verify_report *r); /* "cpu", "cuda (H200...)" */
double tps_verify_report_seconds(const tps_verify_report *r);
/* Of tps_verify_report_seconds: opening the backend (GPU contexts, NCCL bootstrap). */
double tps_verify_report_setup_seconds(const tps_verify_report *r);
uint64_t tps_verify_report_bytes(const tps_verify_report *r);   /* shard bytes verified */

/* ------------------------------------------------------------------ JSON documents */

/* What `tpshard <command> --json` prints, made here so that every front end
 * (the CLI, the Python module) gives the same document. Each is one object
 * in compact JSON, without a trailing newline; its first keys are "ok" and
 * "schema_version" (TPS_JSON_SCHEMA_VERSION). Within a schema version keys
 * are only ever added, never renamed or removed. *out is OWNED by the
 * caller: free() or tps_free(). On failure (TPS_E_NOMEM) *out is NULL. */
#define TPS_JSON_SCHEMA_VERSION 1

/* free() for the strings this library hands out (bindings that cannot call
 * the C library's free directly). NULL is a no-op. */
void tps_free(void *p);

/* {"ok": false, "schema_version": 1, "error": message}: a failed command.
 * ctx may be NULL. */
tps_err tps_error_json(tps_ctx *ctx, const char *message, char **out);
/* inspect: files, family, the TP config fields, quantization, tensors, dtypes. */
tps_err tps_inspect_json(tps_ctx *ctx, const tps_ckpt *ck, char **out);
/* plan (and split --dry-run): L as tps_layout_new_with made it. "ok" is
 * false, and "rejected" says why, when the layout refuses the split. */
tps_err tps_plan_json(tps_ctx *ctx, const tps_layout *L, char **out);
/* plan --list: the built-in plans and layouts. */
tps_err tps_plan_list_json(tps_ctx *ctx, char **out);
/* split: what tps_split(ctx, ck, L, o, res) wrote. */
tps_err tps_split_json(tps_ctx *ctx, const tps_layout *L, const tps_split_opts *o,
                       const tps_split_result *res, char **out);
/* check: what tps_check_dir(ctx, dir, r) found. */
tps_err tps_check_json(tps_ctx *ctx, const char *dir, const tps_check_result *r, char **out);
/* merge: what tps_merge(ctx, dir, o, &files_written) wrote. */
tps_err tps_merge_json(tps_ctx *ctx, const char *dir, const tps_merge_opts *o, int files_written,
                       char **out);
/* verify: every check row and the summary; "ok" is the verdict. */
tps_err tps_verify_json(tps_ctx *ctx, const tps_verify_opts *o, const tps_verify_report *R,
                        char **out);

/* ------------------------------------------------------------------ what the front ends share */

/* The config.json fields that matter for tensor parallelism, in the order
 * inspect shows them; NULL-terminated, static. */
const char *const *tps_tp_config_fields(void);
/* "file", "directory", "index", "tpshard output". */
const char *tps_src_kind_name(tps_src_kind k);
/* Where split writes without an output directory: <name>-tp<N> beside the
 * input (name: the model directory's name, or the file's stem). *out OWNED. */
tps_err tps_split_default_dir(tps_ctx *ctx, const tps_ckpt *ck, int tp, char **out);
/* The same with pipeline stages: <name>-tp<N>-pp<P> (pp 1: as above). */
tps_err tps_split_default_dir_pp(tps_ctx *ctx, const tps_ckpt *ck, int tp, int pp, char **out);
/* A --layout value: NULL or "dtensor" (*out NULL), a built-in name ("vllm"),
 * or a layout file (a path with a '/' or ending in .yaml/.yml). */
tps_err tps_layout_spec_open(tps_ctx *ctx, const char *layout, tps_layout_spec **out);

/* Which backends were built in, and runtime versions when available. */
const char *tps_backends_built(void);
/* Optional features compiled in, e.g. "openmp pclmul-crc32". */
const char *tps_build_features(void);                  /* e.g. "cpu" or "cpu cuda nccl" */
tps_err tps_backend_runtime_info(char *buf, size_t len); /* driver/runtime/NCCL versions */

#ifdef __cplusplus
}
#endif
#endif
