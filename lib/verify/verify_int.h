/* verify_int.h - what the parts of verify share: its state (units,
 * blocks, jobs), the numeric kernels, the analysis of a shard directory,
 * the jobs and scales, the task runner, the finalization and the report.
 * Private to lib/verify*.c. */
#ifndef TPS_VERIFY_INT_H
#define TPS_VERIFY_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "internal.h"
#include "verify_cuda.h"

/* Source bytes per task; a row longer than this gets a task of its own, up to
 * ROW_MAX (longer rows are compared but not multiplied). */
#define CHUNK ((uint64_t)4 << 20)
/* Within a task, source and rank rows are read and compared in steps of
 * about this many bytes, so that the compare (and the cpu backend's
 * products) find both in cache: reading each byte from memory once is what
 * bounds a verify on a machine whose page cache holds the model. */
#define STEP ((uint64_t)256 << 10)
#define ROW_MAX ((uint64_t)256 << 20)
#define MAX_BATCH 256
/* How many tensors after its producers a block's second half is queued. */
#define STAGE2_LAG 4
/* tps_vj_rows' same_col0 when a rank's rows are not known to equal the
 * source rows just staged */
#define NOT_SAME UINT64_MAX

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define HAVE_DOT_BF16 1
#endif

/* Rows in blocks of ROWS_BLK (a DeepSeek-V3-sized verify has 190k: no
 * doubling array), their check names and kinds in the report's own string
 * store, a name once for the rows of one tensor that follow each other, a
 * kind once. */
#define ROWS_BLK 1024
struct tps_verify_report {
    tps_verify_row **blk;
    size_t n, nblk, cap_blk;
    tps_str_chunks strs;
    const char *kinds[32];
    size_t nkinds;
    /* verify's directory, while it is open: rows name its tensors with its
     * own strings, which the report takes over when it closes (lent) */
    const tps_ckpt *lender;
    tps_str_chunks lent;
    int ok;
    char *backend;
    double seconds;
    double setup_seconds; /* of `seconds`: opening the backend (GPU contexts, NCCL) */
    uint64_t bytes;
};

enum { MODE_NONE, MODE_REP, MODE_A, MODE_B, MODE_LOGICAL, MODE_CRC };
enum { NK_NONE, NK_COL, NK_ROW, NK_EMB_ROWS, NK_EMB_COLS };
enum { BLK_MLP, BLK_ATTN };

typedef struct vunit vunit;
typedef struct vblock vblock;

typedef struct {
    int gather, matmul, embed;
    uint64_t out, in;
    int nb, batch;
    tps_dtype dtype; /* the weight's dtype */
    tps_dtype op;    /* GPU operand dtype */
    float *xref;
    float **xr;
    uint64_t *kr;
    float *yref, *sabs, *ysh;
    float **yloc; /* host per-rank locals (cpu backend, embeddings) */
    uint64_t *ids;
    tps_gpu_job *gj;
    /* An FP8 weight: each side dequantizes its rows with its own scales
     * (the source's, and every rank's piece of the scale tensor), so a
     * scale paired with the wrong rows shows in the products. */
    int qkind;          /* -1 unquantized, else tps_qscale */
    const tps_qmethod *qm; /* its method: the dequantize kernel */
    uint64_t bn, bk;
    float *sref;        /* the source scale, row-major */
    uint64_t scols;     /* its width (block columns; 1 per channel or tensor) */
    float **srank;      /* per rank: its piece of the scale */
    uint64_t *slo, *sw; /* per rank: where the piece starts along the weight's dim, its width */
} vjob;

struct vblock {
    int kind;
    char *name; /* "<prefix>.mlp" or "<prefix>.self_attn" */
    vunit *prod[2];
    int nprod, pending;
    vunit *cons;
    uint64_t inter;                  /* width of the intermediate */
    float *keep_sh[2]; /* producers' gathered outputs until the block is fed */
    float *href;                     /* [batch, inter] */
    float **hr;                      /* per rank [batch, len] */
    atomic_int ready;                /* 1 fed, -1 will never be */
};

struct vunit {
    size_t t;
    const tps_ctensor *ct;
    int si; /* source tensor, or -1 */
    int dim;
    int mode;
    uint64_t outer, nd, inner, W, k, step, per_o, chunk;
    uint64_t *segc;   /* MODE_B: chunk prefix per rank (tp + 1) */
    uint64_t *crcpre; /* MODE_CRC: task prefix per piece (npieces + 1) */
    /* Slots: 0 .. tp-1 are the ranks (their own rows: piece, lo, len), then
     * one per replica (a serving layout's KV heads on several ranks), whose
     * bytes are compared with the source but not multiplied. */
    int nslot;
    int *slot_rank;
    int *piece;       /* per slot piece index (replicas: npieces + k), -1 absent */
    uint64_t *lo, *len;
    uint64_t ntasks, task0;
    atomic_uint_fast64_t left;
    atomic_int done;
    pthread_mutex_t mu;
    atomic_uint_fast64_t *diff; /* per slot bytes differing */
    uint64_t *first;            /* per slot first differing byte (under mu) */
    uint32_t *crcs;             /* MODE_CRC: per task */
    uint64_t *crclen;
    uint64_t compared; /* bytes compared */
    char *pre;         /* structural failure */
    int nk;
    char *nk_note; /* why numerics are skipped */
    int bias;      /* ck index of the bias, or -1 */
    int bias_si;
    vjob *job;
    atomic_int job_state; /* 0 none, 1 ready, -1 failed */
    vblock *feeds;
    int feed_slot;
    vblock *cons_of; /* stage 2: the block whose second half this is */
    int stage2;
};

typedef struct {
    const char *name;
    const char *style;
} style_ent;

typedef struct {
    unsigned char *src, *sh, *cmp; /* cmp: a rank's rows of one cache-sized step */
    size_t src_cap, sh_cap, cmp_cap;
    char *same; /* per rank: its rows in this task equal the source's */
    float *w, *conv;
    size_t w_cap, conv_cap;
    int pin_src, pin_sh; /* GPU backends: buffers in pinned memory (cudaMallocHost) */
} tbuf;

typedef struct {
    tps_ctx *ctx;
    const tps_verify_opts *o;
    tps_ckpt *ck, *src;
    int tp;
    tps_backend backend;
    tps_comm *comm;
    tps_gpu *gpu;
    tps_quant *q;         /* the directory's quantization, or NULL */
    /* A serving layout, compiled again from the manifest in passes of ranks
     * (expect_layout): for each tensor, why its pieces are not where the
     * layout puts them (NULL: they are), and how many the layout puts on the
     * ranks present */
    int serving;
    char **lay_note;
    uint32_t *lay_want;
    tps_plan *plan;       /* its plan, as recorded */
    tps_layout_spec *spec;
    unsigned char *local;
    int is_root, want_ref;
    int batch;
    vunit *u;     /* this pass's units (verify.c's run_pass) */
    size_t nu;
    size_t nu_all, npacked; /* units and packed tensors of every pass so far */
    int *unit_of; /* ck index -> unit of this pass or -1 */
    /* the rank files' headers checked once for every piece (tps_va_header_notes)
     * before their tables are let go: the pieces whose entry is wrong, why */
    struct vhnote { const tps_piece *pc; char *note; } *hn;
    size_t nhn;
    style_ent *se; /* the manifest's styles by name (tps_va_style_index) */
    size_t nse;
    vunit **order;
    vblock *blk;
    size_t nblk, blk_cap;
    uint64_t ntasks;
    atomic_uint_fast64_t next;
    atomic_uint_fast64_t bytes;
    uint64_t total_bytes;
    pthread_mutex_t fin_mu;
    size_t next_final;
    atomic_int err;
    tps_err rc;
    pthread_mutex_t err_mu;
    tps_verify_report *R;
} vctx;


/* ------------------------------------------------------------------ functions */

/* Row i of R (i < R->n). */
static inline tps_verify_row *tps_va_row(const tps_verify_report *R, size_t i)
{
    return &R->blk[i / ROWS_BLK][i % ROWS_BLK];
}
/* verify_scales.c: small tensors read whole as f32, an FP8 weight's scales */
tps_err tps_vs_read_f32(vctx *V, tps_ckpt *ck, size_t t, int piece, uint64_t nel,
                        float *dst);
tps_err tps_vs_load_scales(vctx *V, vunit *u, vjob *J);
void tps_vs_dequant_row(const vjob *J, int side, uint64_t j, uint64_t col0, float *w,
                        size_t width, int dim);
/* verify_job.c: a unit's job (its products) and the rows fed to it */
void tps_vj_free(vctx *V, vjob *J);
tps_err tps_vj_get(vctx *V, vunit *u, vjob **out);
tps_err tps_vj_rows(vctx *V, vunit *u, tbuf *tb, int slot, int side, uint64_t row0, uint64_t n,
                    const unsigned char *bytes, uint64_t same_col0);
tps_err tps_vj_rows_from_source(vctx *V, vunit *u, int slot, int r, uint64_t row0, uint64_t n,
                                uint64_t col0, int *done);
/* verify_task.c: one OpenMP thread's loop over the task queue */
void tps_vt_work(vctx *V);
/* verify_finalize.c: finished tensors, in queue order */
void tps_vf_drain(vctx *V);
void tps_vf_block_release(vctx *V, vblock *b);
/* verify_packed.c: a serving layout's packed tensors, several row ranges a rank */
int tps_vp_is_packed(const vctx *V, size_t i);
tps_err tps_vp_check(vctx *V, size_t i);
/* verify_dequant.c: packed methods' pieces dequantized against the source's */
tps_err tps_vd_check(vctx *V);
/* verify_mxfp4.c: gpt-oss's MXFP4 experts as each rank's engine tensors hold
 * them, dequantized against the source's */
tps_err tps_vm_check(vctx *V);
int tps_va_rep_add(tps_verify_report *R, const char *check, const char *kind, double err,
                   double tol, uint64_t wrong, uint64_t total, int ok, char *note);
void tps_va_set_err(vctx *V, tps_err rc);
unsigned tps_va_dt_bytes(tps_dtype d);
int tps_va_has_suffix(const char *s, const char *suf);
int tps_va_numeric_dtype(tps_dtype d);
const tps_piece *tps_va_slot_piece(const vunit *u, int s);
const char *tps_va_rank_file(const vctx *V, const vunit *u, int s);
style_ent *tps_va_style_index(const tps_ckpt *ck, size_t *n);
const char *tps_va_style_of(const style_ent *v, size_t n, const char *name);
int tps_va_style_is(const char *s, tps_style st, const char *alias1, const char *alias2);
char *tps_va_placement_str(const vunit *u);
char *tps_va_check_piece_header(const vctx *V, const tps_piece *pc);
tps_err tps_va_header_notes(vctx *V);
tps_err tps_va_layout_pass(vctx *V, const tps_layout *L);
char *tps_va_layout_note(const vctx *V, const vunit *u);
tps_err tps_va_analyze_unit(vctx *V, vunit *u);
void tps_va_classify(vctx *V, vunit *u, const style_ent *se, size_t nse);
char *tps_va_check_bias(vctx *V, vunit *u);
/* Does worker `rank` hold what its stage holds of tensor `name` (always
 * without pipeline stages; a layer's tensor only on its stage's ranks)? */
int tps_va_serves(const tps_ckpt *ck, int rank, const char *name);
vblock *tps_va_add_block(vctx *V);
vunit *tps_va_unit_by_name(vctx *V, const char *prefix, const char *suffix);
const char *tps_va_short_name(const vunit *u);
tps_err tps_va_find_blocks(vctx *V);
tps_err tps_va_build_order(vctx *V);
void tps_vk_dot_rows(const void *w, size_t ws, const float *x, size_t xs, int nb, float *y,
                     size_t ys, float *s);
#ifdef HAVE_DOT_BF16
void tps_vk_dot_rows_bf16(const void *w, size_t ws, const float *x, size_t xs, int nb, float *y,
                          size_t ys, float *s);
#endif
void tps_vk_bf16_to_f32(const unsigned char *p, float *dst, size_t n);
int tps_vk_to_f32(tps_dtype d, const void *src, float *dst, size_t n);
float tps_vk_round_bf16(float f);
float tps_vk_round_f16(float f);
float tps_vk_round_to(tps_dtype d, float f);
float tps_vk_silu(float g);

#endif
