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
 *    rowwise weight to the gathered intermediate; see block_feed).
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
 */
#include <errno.h>
#include <fnmatch.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "comm.h"
#include "internal.h"
#include "verify_cuda.h"

#ifdef _OPENMP
#include <omp.h>
#endif

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

/* ------------------------------------------------------------------ report */

struct tps_verify_report {
    tps_verify_row *rows;
    size_t n, cap;
    int ok;
    char *backend;
    double seconds;
    double setup_seconds; /* of `seconds`: opening the backend (GPU contexts, NCCL) */
    uint64_t bytes;
};

static void row_free(tps_verify_row *r)
{
    free((char *)r->check);
    free((char *)r->kind);
    free((char *)r->note);
}

void tps_verify_report_free(tps_verify_report *r)
{
    if (!r) return;
    for (size_t i = 0; i < r->n; i++) row_free(&r->rows[i]);
    free(r->rows);
    free(r->backend);
    free(r);
}
size_t tps_verify_report_count(const tps_verify_report *r)
{
    return r ? r->n : 0;
}
const tps_verify_row *tps_verify_report_row(const tps_verify_report *r, size_t i)
{
    return r && i < r->n ? &r->rows[i] : NULL;
}
int tps_verify_report_ok(const tps_verify_report *r)
{
    return r ? r->ok : 0;
}
const char *tps_verify_report_backend(const tps_verify_report *r)
{
    return r && r->backend ? r->backend : "";
}
double tps_verify_report_seconds(const tps_verify_report *r)
{
    return r ? r->seconds : 0;
}
double tps_verify_report_setup_seconds(const tps_verify_report *r)
{
    return r ? r->setup_seconds : 0;
}
uint64_t tps_verify_report_bytes(const tps_verify_report *r)
{
    return r ? r->bytes : 0;
}

const char *tps_backends_built(void)
{
#ifdef TPS_WITH_CUDA
    return "cpu cuda nccl";
#else
    return "cpu";
#endif
}

tps_err tps_backend_runtime_info(char *buf, size_t len)
{
    return tps_gpu_runtime_info(buf, len);
}

/* Takes ownership of note (may be NULL). 0 ok, -1 out of memory. */
static int rep_add(tps_verify_report *R, const char *check, const char *kind, double err,
                   double tol, uint64_t wrong, uint64_t total, int ok, char *note)
{
    if (R->n == R->cap) {
        size_t nc = R->cap ? R->cap * 2 : 64;
        tps_verify_row *nr = realloc(R->rows, nc * sizeof *nr);
        if (!nr) {
            free(note);
            return -1;
        }
        R->rows = nr;
        R->cap = nc;
    }
    tps_verify_row *r = &R->rows[R->n];
    r->check = tps_strdup(check);
    r->kind = tps_strdup(kind);
    r->max_abs_err = err;
    r->tolerance = tol;
    r->wrong = wrong;
    r->total = total;
    r->ok = ok;
    r->note = note;
    if (!r->check || !r->kind) {
        row_free(r);
        return -1;
    }
    R->n++;
    if (!ok) R->ok = 0;
    return 0;
}

/* ------------------------------------------------------------------ numeric kernels */

/* One weight row (f32) against nb input rows: y[b * ys] = sum_i X[b][i] w[i]
 * and, when s is given, s[b * ys] = sum_i |X[b][i] w[i]|. The summation order
 * depends only on n (8 lanes, a fixed tail placement and a fixed lane tree),
 * never on alignment or threads, so equal inputs give equal bits: a colwise
 * shard row and the same source row produce the same output. */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

#define hsum8(a) ((((a)[0] + (a)[1]) + ((a)[2] + (a)[3])) + (((a)[4] + (a)[5]) + ((a)[6] + (a)[7])))

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) &&                             \
    !defined(__SANITIZE_ADDRESS__)
#define TPS_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TPS_CLONES
#endif

/* The kernel, once for f32 rows and once for raw little-endian BF16 rows
 * widened in registers (exact), so BF16 weights are never stored as f32. */
#define LOAD8_F32(dst, w, i) memcpy(&(dst), (const float *)(w) + (i), 32)
#define LOAD1_F32(w, i) (((const float *)(w))[i])
typedef uint16_t v8u16 __attribute__((vector_size(16)));
typedef uint32_t v8u32 __attribute__((vector_size(32)));
#define LOAD8_BF16(dst, w, i)                                                                      \
    do {                                                                                           \
        v8u16 h_;                                                                                  \
        memcpy(&h_, (const unsigned char *)(w) + 2 * (i), 16);                                     \
        (dst) = (v8f)(__builtin_convertvector(h_, v8u32) << 16);                                   \
    } while (0)
static inline float load1_bf16(const void *w, size_t i)
{
    const unsigned char *p = (const unsigned char *)w + 2 * i;
    uint32_t u = ((uint32_t)p[0] | ((uint32_t)p[1] << 8)) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
#define LOAD1_BF16(w, i) load1_bf16((w), (i))

#define DEFINE_DOT(NAME, LOAD8, LOAD1)                                                             \
    TPS_CLONES                                                                                     \
    static void NAME(const void *w, size_t n, const float *X, size_t ldx, int nb, float *y,        \
                     size_t ys, float *s)                                                          \
    {                                                                                              \
        size_t n8 = n & ~(size_t)7;                                                                \
        const v8i mask = {0x7fffffff, 0x7fffffff, 0x7fffffff, 0x7fffffff,                          \
                          0x7fffffff, 0x7fffffff, 0x7fffffff, 0x7fffffff};                         \
        int b = 0;                                                                                 \
        for (; b + 4 <= nb; b += 4) {                                                              \
            const float *x0 = X + (size_t)b * ldx, *x1 = x0 + ldx, *x2 = x1 + ldx, *x3 = x2 + ldx; \
            v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};    \
            size_t i = 0;                                                                          \
            if (s) {                                                                               \
                for (; i < n8; i += 8) {                                                           \
                    v8f wv, xv, p;                                                                 \
                    LOAD8(wv, w, i);                                                               \
                    memcpy(&xv, x0 + i, 32);                                                       \
                    p = xv * wv;                                                                   \
                    a0 += p;                                                                       \
                    s0 += (v8f)((v8i)p & mask);                                                    \
                    memcpy(&xv, x1 + i, 32);                                                       \
                    p = xv * wv;                                                                   \
                    a1 += p;                                                                       \
                    s1 += (v8f)((v8i)p & mask);                                                    \
                    memcpy(&xv, x2 + i, 32);                                                       \
                    p = xv * wv;                                                                   \
                    a2 += p;                                                                       \
                    s2 += (v8f)((v8i)p & mask);                                                    \
                    memcpy(&xv, x3 + i, 32);                                                       \
                    p = xv * wv;                                                                   \
                    a3 += p;                                                                       \
                    s3 += (v8f)((v8i)p & mask);                                                    \
                }                                                                                  \
            } else {                                                                               \
                for (; i < n8; i += 8) {                                                           \
                    v8f wv, xv;                                                                    \
                    LOAD8(wv, w, i);                                                               \
                    memcpy(&xv, x0 + i, 32);                                                       \
                    a0 += xv * wv;                                                                 \
                    memcpy(&xv, x1 + i, 32);                                                       \
                    a1 += xv * wv;                                                                 \
                    memcpy(&xv, x2 + i, 32);                                                       \
                    a2 += xv * wv;                                                                 \
                    memcpy(&xv, x3 + i, 32);                                                       \
                    a3 += xv * wv;                                                                 \
                }                                                                                  \
            }                                                                                      \
            for (size_t k = 0; i < n; i++, k++) {                                                  \
                float wi = LOAD1(w, i);                                                            \
                float p0 = x0[i] * wi, p1 = x1[i] * wi, p2 = x2[i] * wi, p3 = x3[i] * wi;          \
                a0[k] += p0;                                                                       \
                a1[k] += p1;                                                                       \
                a2[k] += p2;                                                                       \
                a3[k] += p3;                                                                       \
                s0[k] += fabsf(p0);                                                                \
                s1[k] += fabsf(p1);                                                                \
                s2[k] += fabsf(p2);                                                                \
                s3[k] += fabsf(p3);                                                                \
            }                                                                                      \
            y[(size_t)b * ys] = hsum8(a0);                                                         \
            y[(size_t)(b + 1) * ys] = hsum8(a1);                                                   \
            y[(size_t)(b + 2) * ys] = hsum8(a2);                                                   \
            y[(size_t)(b + 3) * ys] = hsum8(a3);                                                   \
            if (s) {                                                                               \
                s[(size_t)b * ys] = hsum8(s0);                                                     \
                s[(size_t)(b + 1) * ys] = hsum8(s1);                                               \
                s[(size_t)(b + 2) * ys] = hsum8(s2);                                               \
                s[(size_t)(b + 3) * ys] = hsum8(s3);                                               \
            }                                                                                      \
        }                                                                                          \
        for (; b < nb; b++) {                                                                      \
            const float *x0 = X + (size_t)b * ldx;                                                 \
            v8f a0 = {0}, s0 = {0};                                                                \
            size_t i = 0;                                                                          \
            for (; i < n8; i += 8) {                                                               \
                v8f wv, xv, p;                                                                     \
                LOAD8(wv, w, i);                                                                   \
                memcpy(&xv, x0 + i, 32);                                                           \
                p = xv * wv;                                                                       \
                a0 += p;                                                                           \
                s0 += (v8f)((v8i)p & mask);                                                        \
            }                                                                                      \
            for (size_t k = 0; i < n; i++, k++) {                                                  \
                float p = x0[i] * LOAD1(w, i);                                                     \
                a0[k] += p;                                                                        \
                s0[k] += fabsf(p);                                                                 \
            }                                                                                      \
            y[(size_t)b * ys] = hsum8(a0);                                                         \
            if (s) s[(size_t)b * ys] = hsum8(s0);                                                  \
        }                                                                                          \
    }

DEFINE_DOT(dot_rows, LOAD8_F32, LOAD1_F32)
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
DEFINE_DOT(dot_rows_bf16, LOAD8_BF16, LOAD1_BF16)
#define HAVE_DOT_BF16 1
#endif

/* BF16 is the top half of an f32: widen 8 at a time (vectorizes). */
TPS_CLONES
static void bf16_to_f32(const unsigned char *p, float *dst, size_t n)
{
    size_t i = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    for (; i + 8 <= n; i += 8) {
        uint16_t h[8];
        uint32_t u[8];
        memcpy(h, p + 2 * i, 16);
        for (int k = 0; k < 8; k++) u[k] = (uint32_t)h[k] << 16;
        memcpy(dst + i, u, 32);
    }
#endif
    for (; i < n; i++) {
        uint32_t u = ((uint32_t)p[2 * i] | ((uint32_t)p[2 * i + 1] << 8)) << 16;
        memcpy(&dst[i], &u, 4);
    }
}

/* Exact conversion of n elements to f32; BF16 and F32 inline, the rest through
 * the dtype module. 0 ok, -1 not a float dtype. */
static int to_f32(tps_dtype d, const void *src, float *dst, size_t n)
{
    if (d == TPS_BF16) {
        bf16_to_f32(src, dst, n);
        return 0;
    }
    if (d == TPS_F32) {
        memcpy(dst, src, n * 4);
        return 0;
    }
    return tps_to_f32(d, src, dst, n);
}

/* Round to the operand dtype of a GEMM (round to nearest even), as an
 * inference kernel stores its activations; identity for other dtypes. */
static float round_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return f; /* inf, nan */
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}
static float round_f16(float f)
{
    if (!isfinite(f)) return f;
    float a = fabsf(f);
    if (a >= 65520.0f) return copysignf(INFINITY, f);
    if (a < 6.103515625e-05f) { /* subnormal f16: fixed step 2^-24 */
        float q = nearbyintf(a * 16777216.0f) / 16777216.0f;
        return copysignf(q, f);
    }
    int e;
    frexpf(a, &e); /* a = m 2^e, m in [0.5, 1) */
    float step = ldexpf(1.0f, e - 11);
    return copysignf(nearbyintf(a / step) * step, f);
}
static float round_to(tps_dtype d, float f)
{
    return d == TPS_BF16 ? round_bf16(f) : d == TPS_F16 ? round_f16(f) : f;
}
static float silu(float g)
{
    return g / (1.0f + expf(-g));
}

/* ------------------------------------------------------------------ state */

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
    tps_layout *lay;      /* a serving layout, compiled again from the manifest */
    tps_plan *plan;       /* its plan, as recorded */
    tps_layout_spec *spec;
    int *lay_piece_rt;    /* rank tensor of each of lay's pieces */
    unsigned char *local;
    int is_root, want_ref;
    int batch;
    vunit *u;
    size_t nu;
    int *unit_of; /* ck index -> unit or -1 */
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

static void set_err(vctx *V, tps_err rc)
{
    pthread_mutex_lock(&V->err_mu);
    if (!V->rc) V->rc = rc;
    atomic_store(&V->err, 1);
    pthread_mutex_unlock(&V->err_mu);
}

static unsigned dt_bytes(tps_dtype d)
{
    return tps_dtype_bits(d) / 8;
}
static int has_suffix(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}
/* Float dtype that tps_to_f32 converts, whole bytes per element. */
static int numeric_dtype(tps_dtype d)
{
    if (tps_dtype_bits(d) < 8 || !tps_dtype_is_float(d)) return 0;
    unsigned char z[8] = {0};
    float f;
    return to_f32(d, z, &f, 1) == 0;
}

static const tps_piece *slot_piece(const vunit *u, int s)
{
    int p = u->piece[s];
    if (p < 0) return NULL;
    return p < u->ct->npieces ? &u->ct->pieces[p] : &u->ct->replicas[p - u->ct->npieces];
}

static const char *rank_file(const vctx *V, const vunit *u, int s)
{
    const tps_piece *pc = slot_piece(u, s);
    return pc ? V->ck->files[pc->file].name : "?";
}

/* ------------------------------------------------------------------ manifest style */

typedef struct {
    const char *name;
    const cJSON *e;
} style_ent;
static int style_cmp(const void *a, const void *b)
{
    return strcmp(((const style_ent *)a)->name, ((const style_ent *)b)->name);
}

/* The plan's style recorded in the manifest's tensor entry, when there is one
 * ("tensors" as an object keyed by name or an array of {"name": ...}). */
static style_ent *style_index(const tps_ckpt *ck, size_t *n)
{
    *n = 0;
    const cJSON *ts =
        ck->manifest ? cJSON_GetObjectItemCaseSensitive(ck->manifest, "tensors") : NULL;
    if (!ts || !(cJSON_IsObject(ts) || cJSON_IsArray(ts))) return NULL;
    size_t cnt = (size_t)cJSON_GetArraySize(ts);
    style_ent *v = calloc(cnt ? cnt : 1, sizeof *v);
    if (!v) return NULL;
    size_t k = 0;
    for (const cJSON *e = ts->child; e; e = e->next) {
        const char *name = cJSON_IsObject(ts) ? e->string : NULL;
        if (!name) {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
            name = cJSON_IsString(nm) ? nm->valuestring : NULL;
        }
        if (name && k < cnt) v[k++] = (style_ent){name, e};
    }
    if (k > 1) qsort(v, k, sizeof *v, style_cmp);
    *n = k;
    return v;
}
static const char *style_of(const style_ent *v, size_t n, const char *name)
{
    if (!v) return NULL;
    style_ent key = {name, NULL};
    const style_ent *f = bsearch(&key, v, n, sizeof *v, style_cmp);
    if (!f || !cJSON_IsObject(f->e)) return NULL;
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(f->e, "style");
    return cJSON_IsString(s) ? s->valuestring : NULL;
}
static int style_is(const char *s, tps_style st, const char *alias1, const char *alias2)
{
    if (!s) return 0;
    const char *nm = tps_style_name(st);
    return (nm && !strcmp(s, nm)) || (alias1 && !strcmp(s, alias1)) ||
           (alias2 && !strcmp(s, alias2));
}

/* ------------------------------------------------------------------ analysis */

static char *placement_str(const vunit *u)
{
    if (u->ct->placement) return tps_strdup(u->ct->placement);
    return u->dim < 0 ? tps_strdup("Replicate") : tps_asprintf("Shard(%d)", u->dim);
}

/* The rank file's own header must hold the tensor where the manifest says,
 * with the manifest's dtype and the rank's local shape. NULL ok, else note. */
static char *check_piece_header(const vctx *V, const vunit *u, const tps_piece *pc)
{
    const tps_ctensor *ct = u->ct;
    const tps_cfile *f = &V->ck->files[pc->file];
    const tps_st *st = f->st;
    if (!st) return NULL;
    /* inside a fused or padded rank tensor: its name, dtype and room were
     * checked when the directory was opened */
    if ((pc->holder && strcmp(pc->holder, ct->name)) || V->lay) return NULL;
    uint64_t begin = pc->off - st->data_start;
    size_t a = 0, b = st->n;
    while (a < b) {
        size_t m = a + (b - a) / 2;
        if (st->t[m].begin < begin)
            a = m + 1;
        else
            b = m;
    }
    /* zero-size tensors share a begin: look at every entry there */
    for (size_t i = a; i < st->n && st->t[i].begin == begin; i++) {
        const tps_st_tensor_info *ti = &st->t[i];
        if (strcmp(ti->name, ct->name)) continue;
        if (ti->dtype != ct->dtype)
            return tps_asprintf("%s: dtype %s, the manifest says %s", f->name,
                                tps_dtype_name(ti->dtype), tps_dtype_name(ct->dtype));
        int shape_ok = ti->ndim == ct->ndim;
        for (int d = 0; shape_ok && d < ct->ndim; d++) {
            uint64_t want = (d == u->dim) ? pc->hi - pc->lo : ct->shape[d];
            if (ti->shape[d] != want) shape_ok = 0;
        }
        if (!shape_ok) return tps_asprintf("%s: local shape differs from the manifest", f->name);
        if (ti->end - ti->begin != pc->nbytes)
            return tps_asprintf("%s: %llu bytes, the manifest says %llu", f->name,
                                (unsigned long long)(ti->end - ti->begin),
                                (unsigned long long)pc->nbytes);
        return NULL;
    }
    return tps_asprintf("%s: no tensor at the manifest's offset", f->name);
}

/* A serving layout's unit: its pieces on the present ranks must be exactly
 * the ones the layout (compiled again from the manifest's layout file,
 * config.json and the tensors' styles) puts there: rank, rows, replica or
 * not, the rank tensor holding them and the byte they start at. NULL when
 * they are, else the first difference. */
static char *layout_mismatch(const vctx *V, const vunit *u)
{
    const tps_layout *L = V->lay;
    const tps_ctensor *ct = u->ct;
    size_t i = u->t, want = 0;
    for (size_t k = L->src_piece0[i]; k < L->src_piece0[i + 1]; k++) {
        size_t pi = L->src_pieces[k];
        const tps_lpiece *lp = &L->pieces[pi];
        const tps_region *g = &L->regions[lp->region];
        if (V->ck->rank_present && !V->ck->rank_present[lp->rank]) continue;
        want++;
        const char *holder = L->rt[V->lay_piece_rt[pi]].name;
        int rep = lp->replica && g->dim >= 0, found = 0;
        for (int p = 0; p < ct->npieces + ct->nreplicas && !found; p++) {
            const tps_piece *pc = p < ct->npieces ? &ct->pieces[p] : &ct->replicas[p - ct->npieces];
            found = pc->rank == lp->rank && (p >= ct->npieces) == rep && pc->at == lp->at &&
                    !strcmp(pc->holder, holder) &&
                    (g->dim < 0 || (pc->lo == g->lo && pc->hi == g->hi));
        }
        if (!found)
            return g->dim >= 0
                       ? tps_asprintf("layout %s puts rows [%llu, %llu) of it on rank %d%s, inside "
                                      "'%s' at byte %llu; the manifest does not",
                                      V->lay->spec->name, (unsigned long long)g->lo,
                                      (unsigned long long)g->hi, lp->rank, rep ? " (a replica)" : "",
                                      holder, (unsigned long long)lp->at)
                       : tps_asprintf("layout %s puts all of it on rank %d as '%s'; the manifest "
                                      "does not",
                                      V->lay->spec->name, lp->rank, holder);
    }
    if (want != (size_t)(ct->npieces + ct->nreplicas))
        return tps_asprintf("the manifest lists %d pieces of it on the ranks present, layout %s "
                            "puts %zu there",
                            ct->npieces + ct->nreplicas, V->lay->spec->name, want);
    return NULL;
}

static tps_err analyze_unit(vctx *V, vunit *u)
{
    const tps_ctensor *ct = u->ct;
    int tp = V->tp;
    u->dim = ct->dim;
    u->si = -1;
    u->bias = -1;
    u->bias_si = -1;
    pthread_mutex_init(&u->mu, NULL);
    int ns = tp + ct->nreplicas;
    u->nslot = ns;
    u->slot_rank = malloc(sizeof(int) * (size_t)ns);
    u->piece = malloc(sizeof(int) * (size_t)ns);
    u->lo = calloc((size_t)ns, sizeof(uint64_t));
    u->len = calloc((size_t)ns, sizeof(uint64_t));
    u->diff = calloc((size_t)ns, sizeof(*u->diff));
    u->first = malloc(sizeof(uint64_t) * (size_t)ns);
    if (!u->slot_rank || !u->piece || !u->lo || !u->len || !u->diff || !u->first)
        return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    for (int r = 0; r < ns; r++) {
        u->slot_rank[r] = r < tp ? r : ct->replicas[r - tp].rank;
        u->piece[r] = r < tp ? -1 : ct->npieces + (r - tp);
        u->first[r] = UINT64_MAX;
        atomic_init(&u->diff[r], 0);
        if (r >= tp) {
            u->lo[r] = ct->replicas[r - tp].lo;
            u->len[r] = ct->replicas[r - tp].hi - ct->replicas[r - tp].lo;
        }
    }
    char miss[256] = "";
    size_t ml = 0;
    if (u->dim >= ct->ndim) {
        u->pre = tps_asprintf("placement dim %d but the tensor has %d dims", u->dim, ct->ndim);
        return TPS_OK;
    }
    for (int p = 0; p < ct->npieces; p++) {
        const tps_piece *pc = &ct->pieces[p];
        if (pc->rank < 0 || pc->rank >= tp || u->piece[pc->rank] >= 0) {
            u->pre = tps_asprintf("manifest lists rank %d twice or out of range", pc->rank);
            return TPS_OK;
        }
        u->piece[pc->rank] = p;
    }
    if (V->lay) {
        /* a serving layout: the pieces must be where the layout puts them;
         * a rank's own rows are then its piece's */
        char *why = layout_mismatch(V, u);
        if (why) {
            u->pre = why;
            return TPS_OK;
        }
        if (ct->nreplicas && u->dim != 0) {
            u->pre = tps_asprintf("replicas along dim %d are not verified", u->dim);
            return TPS_OK;
        }
        uint64_t at = 0;
        for (int r = 0; r < tp; r++) {
            if (u->piece[r] < 0) continue;
            u->lo[r] = ct->pieces[u->piece[r]].lo;
            u->len[r] = ct->pieces[u->piece[r]].hi - u->lo[r];
            /* the collectives concatenate the ranks' rows in rank order */
            if (u->dim >= 0 && u->lo[r] != at) {
                u->pre = tps_asprintf("rank %d's rows start at %llu, not where the ranks before "
                                      "it end (%llu)",
                                      r, (unsigned long long)u->lo[r], (unsigned long long)at);
                return TPS_OK;
            }
            at = u->lo[r] + u->len[r];
        }
        for (int r = 0; r < tp; r++) {
            int held = u->piece[r] >= 0;
            for (int k = 0; k < ct->nreplicas && !held; k++) held = ct->replicas[k].rank == r;
            if (!held && V->ck->rank_present && !V->ck->rank_present[r] && ml < sizeof miss - 16)
                ml += (size_t)snprintf(miss + ml, sizeof miss - ml, "%s%d", ml ? "," : "", r);
        }
    } else {
        for (int r = 0; r < tp; r++) {
            if (u->dim >= 0) tps_chunk(ct->shape[u->dim], tp, r, &u->lo[r], &u->len[r]);
            if (u->piece[r] < 0 && ml < sizeof miss - 16)
                ml += (size_t)snprintf(miss + ml, sizeof miss - ml, "%s%d", ml ? "," : "", r);
        }
    }
    /* geometry: [outer, nd, inner] with inner in bytes */
    unsigned bits = tps_dtype_bits(ct->dtype);
    uint64_t outer = 1, nd = 1, inner_el = 1;
    int ovf = 0;
    if (u->dim >= 0) {
        for (int d = 0; d < u->dim; d++) ovf |= tps_mul_ovf(outer, ct->shape[d], &outer);
        nd = ct->shape[u->dim];
        for (int d = u->dim + 1; d < ct->ndim; d++)
            ovf |= tps_mul_ovf(inner_el, ct->shape[d], &inner_el);
    }
    int bytewise = 0;
    if (u->dim >= 0 && !ovf) {
        uint64_t ib;
        ovf |= tps_mul_ovf(inner_el, bits, &ib);
        if (ib % 8) bytewise = 1;
        u->inner = ib / 8;
        u->outer = outer;
        u->nd = nd;
        ovf |= tps_mul_ovf(nd, u->inner, &u->W);
    }
    /* every piece must hold what torch.chunk (or the layout) gives its rank */
    for (int r = 0; r < ns; r++) {
        int p = u->piece[r];
        if (p < 0) continue;
        const tps_piece *pc = slot_piece(u, r);
        uint64_t want = ct->nbytes;
        if (u->dim >= 0) {
            if (pc->lo != u->lo[r] || pc->hi != u->lo[r] + u->len[r]) {
                u->pre = tps_asprintf("rank %d holds [%llu, %llu) along dim %d, torch.chunk gives "
                                      "[%llu, %llu)",
                                      u->slot_rank[r], (unsigned long long)pc->lo,
                                      (unsigned long long)pc->hi,
                                      u->dim, (unsigned long long)u->lo[r],
                                      (unsigned long long)(u->lo[r] + u->len[r]));
                return TPS_OK;
            }
            if (!bytewise && !ovf) want = outer * u->len[r] * u->inner;
        }
        if (!bytewise && !ovf && pc->nbytes != want) {
            u->pre = tps_asprintf("rank %d's shard has %llu bytes, its shape needs %llu",
                                  u->slot_rank[r],
                                  (unsigned long long)pc->nbytes, (unsigned long long)want);
            return TPS_OK;
        }
        char *h = check_piece_header(V, u, pc);
        if (h) {
            u->pre = tps_asprintf("rank %d: %s", u->slot_rank[r], h);
            free(h);
            return TPS_OK;
        }
    }
    if (ovf && ct->nbytes) {
        u->pre = tps_strdup("shape overflows");
        return TPS_OK;
    }
    if (ml)
        u->pre = tps_asprintf("rank%s %s missing from the directory (was it split with --ranks?)",
                              strchr(miss, ',') ? "s" : "", miss);
    /* the source side */
    if (V->src) {
        /* An untied head (--untie) was written from its embedding: the tied
         * source has no head, and the embedding is what it must equal. */
        u->si = tps_ckpt_find(V->src, ct->derived_from ? ct->derived_from : ct->name);
        if (u->si < 0) {
            free(u->pre);
            u->pre = ct->derived_from
                         ? tps_asprintf("written from %s, which is not in the source checkpoint",
                                        ct->derived_from)
                         : tps_strdup("not in the source checkpoint");
            return TPS_OK;
        }
        const tps_ctensor *sc = &V->src->t[u->si];
        int same = sc->dtype == ct->dtype && sc->ndim == ct->ndim && sc->nbytes == ct->nbytes;
        for (int d = 0; same && d < ct->ndim; d++) same = sc->shape[d] == ct->shape[d];
        if (!same) {
            free(u->pre);
            u->pre = tps_asprintf("dtype or shape differs from the source (%s, %d dims)",
                                  tps_dtype_name(sc->dtype), sc->ndim);
            u->si = -1;
            return TPS_OK;
        }
    } else {
        u->si = -1;
    }
    /* the reading plan */
    if (!V->src) {
        u->mode = MODE_CRC;
        int np = ct->npieces + ct->nreplicas;
        u->crcpre = calloc((size_t)np + 1, sizeof(uint64_t));
        if (!u->crcpre) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
        for (int p = 0; p < np; p++) {
            const tps_piece *pc = p < ct->npieces ? &ct->pieces[p] : &ct->replicas[p - ct->npieces];
            uint64_t nb = pc->nbytes;
            uint64_t c = V->local[pc->rank] ? (nb ? (nb + CHUNK - 1) / CHUNK : 1) : 0;
            u->crcpre[p + 1] = u->crcpre[p] + c;
        }
        u->ntasks = u->crcpre[np];
        u->crcs = calloc(u->ntasks ? u->ntasks : 1, sizeof(uint32_t));
        u->crclen = calloc(u->ntasks ? u->ntasks : 1, sizeof(uint64_t));
        if (!u->crcs || !u->crclen) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
        if (!u->ntasks) u->ntasks = 1;
        return TPS_OK;
    }
    if (ct->nbytes == 0) {
        u->mode = MODE_NONE;
        u->ntasks = 1;
        return TPS_OK;
    }
    if (u->dim < 0) {
        u->mode = MODE_REP;
        u->chunk = CHUNK;
        u->ntasks = (ct->nbytes + CHUNK - 1) / CHUNK;
        return TPS_OK;
    }
    if (bytewise) {
        u->mode = MODE_LOGICAL;
        u->chunk = CHUNK;
        u->ntasks = (ct->nbytes + CHUNK - 1) / CHUNK;
        if (u->pre) u->mode = MODE_NONE, u->ntasks = 1; /* missing ranks: cannot gather */
        return TPS_OK;
    }
    uint64_t lim = CHUNK;
    if (u->W <= lim || (u->dim == ct->ndim - 1 && u->W <= ROW_MAX && ct->ndim == 2)) {
        if (u->W > lim) lim = u->W;
        u->mode = MODE_A;
        u->k = u->W ? lim / u->W : outer;
        if (u->k < 1) u->k = 1;
        u->ntasks = (outer + u->k - 1) / u->k;
    } else {
        u->mode = MODE_B;
        if (u->inner <= CHUNK)
            u->step = CHUNK / u->inner * u->inner;
        else if (u->inner <= ROW_MAX && ct->ndim == 2)
            u->step = u->inner;
        else
            u->step = CHUNK;
        u->segc = calloc((size_t)ns + 1, sizeof(uint64_t));
        if (!u->segc) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
        for (int r = 0; r < ns; r++) {
            uint64_t wr = u->len[r] * u->inner;
            u->segc[r + 1] = u->segc[r] + (wr + u->step - 1) / u->step;
        }
        u->per_o = u->segc[ns];
        u->ntasks = outer * u->per_o;
    }
    if (!u->ntasks) u->ntasks = 1;
    return TPS_OK;
}

/* Numeric kind of a 2-D float weight whose shards are complete. */
static void classify(vctx *V, vunit *u, const style_ent *se, size_t nse)
{
    const tps_ctensor *ct = u->ct;
    u->nk = NK_NONE;
    if (!V->src || u->si < 0 || u->pre || u->dim < 0 || ct->ndim != 2) return;
    if (!has_suffix(ct->name, ".weight")) return;
    if (!numeric_dtype(ct->dtype)) {
        u->nk_note =
            tps_asprintf("skipped: %s has no exact f32 conversion", tps_dtype_name(ct->dtype));
        return;
    }
    if (u->mode != MODE_A && !(u->mode == MODE_B && u->step % u->inner == 0 && u->dim == 0)) {
        u->nk_note = tps_strdup("skipped: rows too long to multiply in bounded memory");
        return;
    }
    const char *style = style_of(se, nse, ct->name);
    size_t n = strlen(ct->name) - strlen(".weight");
    int embed_name = (n >= 12 && !strncmp(ct->name + n - 12, "embed_tokens", 12)) ||
                     (n >= 22 && !strncmp(ct->name + n - 22, "embed_tokens_per_layer", 22));
    if (u->dim == 0) {
        int emb =
            style ? style_is(style, TPS_STYLE_EMBED_ROWWISE, "vocab", "embedding") : embed_name;
        u->nk = emb ? NK_EMB_ROWS : NK_COL;
    } else {
        int emb = style ? style_is(style, TPS_STYLE_EMBED_COLWISE, NULL, NULL) : embed_name;
        u->nk = emb ? NK_EMB_COLS : NK_ROW;
    }
    if (u->nk == NK_COL || u->nk == NK_ROW) {
        char *bname = tps_asprintf("%.*s.bias", (int)n, ct->name);
        if (!bname) return;
        int bi = tps_ckpt_find(V->ck, bname);
        free(bname);
        if (bi >= 0) u->bias = bi;
    }
}

/* Bias: must pair with the weight (colwise: Shard(0); rowwise: Replicate),
 * be complete and float. NULL ok, else the reason. */
static char *check_bias(vctx *V, vunit *u)
{
    if (u->bias < 0) return NULL;
    const tps_ctensor *b = &V->ck->t[u->bias];
    int want = u->nk == NK_COL ? 0 : -1;
    if (b->ndim != 1 || b->shape[0] != u->ct->shape[0])
        return tps_asprintf("bias %s has the wrong shape", b->name);
    if (b->dim != want)
        return tps_asprintf(
            "bias %s is %s but a %s weight needs it %s", b->name, b->placement ? b->placement : "?",
            u->nk == NK_COL ? "colwise" : "rowwise", want == 0 ? "Shard(0)" : "Replicate");
    if (!numeric_dtype(b->dtype)) return tps_asprintf("bias %s is not a float dtype", b->name);
    u->bias_si = tps_ckpt_find(V->src, b->name);
    if (u->bias_si < 0) return tps_asprintf("bias %s is not in the source", b->name);
    int has[256] = {0};
    for (int p = 0; p < b->npieces; p++)
        if (b->pieces[p].rank >= 0 && b->pieces[p].rank < 256) has[b->pieces[p].rank] = 1;
    for (int r = 0; r < V->tp && r < 256; r++)
        if (!has[r] && (want == 0 || r == 0))
            return tps_asprintf("bias %s lacks rank %d", b->name, r);
    return NULL;
}

/* V->blk is sized once by find_blocks (one block per unit at most) and never
 * moves: units keep pointers into it (feeds, cons_of). */
static vblock *add_block(vctx *V)
{
    if (V->nblk == V->blk_cap) return NULL;
    vblock *b = &V->blk[V->nblk++];
    memset(b, 0, sizeof *b);
    atomic_init(&b->ready, 0);
    return b;
}

static vunit *unit_by_name(vctx *V, const char *prefix, const char *suffix)
{
    char *nm = tps_asprintf("%s%s", prefix, suffix);
    if (!nm) return NULL;
    int i = tps_ckpt_find(V->ck, nm);
    free(nm);
    return i >= 0 && V->unit_of[i] >= 0 ? &V->u[V->unit_of[i]] : NULL;
}

static const char *short_name(const vunit *u)
{
    const char *s = strrchr(u->ct->name, '.');
    if (!s) return u->ct->name;
    /* "...mlp.gate_proj.weight" -> "gate_proj" */
    const char *e = s;
    const char *b = e;
    while (b > u->ct->name && b[-1] != '.') b--;
    static _Thread_local char buf[64];
    snprintf(buf, sizeof buf, "%.*s", (int)(e - b), b);
    return buf;
}

/* Finds the blocks and decides how each is checked. Rows for blocks that
 * cannot run numerically are added right away (structure only). */
static tps_err find_blocks(vctx *V)
{
    V->blk_cap = V->nu ? V->nu : 1;
    V->blk = calloc(V->blk_cap, sizeof *V->blk);
    if (!V->blk) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    for (size_t i = 0; i < V->nu; i++) {
        vunit *u = &V->u[i];
        const char *nm = u->ct->name;
        int kind;
        size_t n;
        if (has_suffix(nm, ".mlp.gate_proj.weight")) {
            kind = BLK_MLP;
            n = strlen(nm) - strlen(".mlp.gate_proj.weight");
        } else if (has_suffix(nm, ".self_attn.q_proj.weight")) {
            kind = BLK_ATTN;
            n = strlen(nm) - strlen(".self_attn.q_proj.weight");
        } else {
            continue;
        }
        char *prefix = tps_asprintf("%.*s", (int)n, nm);
        if (!prefix) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
        vunit *m[3] = {u, NULL, NULL};
        int nm_ = kind == BLK_MLP ? 3 : 2;
        if (kind == BLK_MLP) {
            m[1] = unit_by_name(V, prefix, ".mlp.up_proj.weight");
            m[2] = unit_by_name(V, prefix, ".mlp.down_proj.weight");
        } else {
            m[1] = unit_by_name(V, prefix, ".self_attn.o_proj.weight");
        }
        int complete = 1;
        for (int k = 0; k < nm_; k++) complete &= m[k] != NULL;
        if (!complete) {
            free(prefix);
            continue;
        }
        vblock *b = add_block(V);
        if (!b) {
            free(prefix);
            return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
        }
        b->kind = kind;
        b->name = tps_asprintf("%s%s", prefix, kind == BLK_MLP ? ".mlp" : ".self_attn");
        free(prefix);
        if (!b->name) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
        vunit *cons = m[nm_ - 1];
        b->nprod = nm_ - 1;
        for (int k = 0; k < b->nprod; k++) b->prod[k] = m[k];
        b->cons = cons;
        atomic_store(&b->ready, -1); /* until proven runnable */
        /* structure: producers colwise with equal ranges, consumer rowwise on them */
        char *why = NULL;
        int all_rep = 1, any_pre = 0;
        for (int k = 0; k < nm_; k++) {
            all_rep &= m[k]->dim < 0;
            any_pre |= m[k]->pre != NULL;
        }
        if (any_pre) continue; /* the tensor rows already fail; nothing to pair */
        if (all_rep) {
            if (rep_add(V->R, b->name, kind == BLK_MLP ? "mlp" : "attn", 0, 0, 0, 0, 1,
                        tps_strdup("replicated on every rank: nothing to pair")))
                return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
            continue;
        }
        int prod_ok = 1;
        for (int k = 0; k < b->nprod; k++) prod_ok &= m[k]->dim == 0 && m[k]->ct->ndim == 2;
        int cons_ok = cons->dim == 1 && cons->ct->ndim == 2;
        if (!prod_ok || !cons_ok) {
            char *pl[3] = {NULL, NULL, NULL};
            for (int k = 0; k < nm_; k++) pl[k] = placement_str(m[k]);
            if (kind == BLK_MLP)
                why =
                    tps_asprintf("placements do not pair: gate_proj %s, up_proj %s, down_proj %s; "
                                 "a tensor-parallel MLP needs gate_proj and up_proj Shard(0) "
                                 "(colwise) and down_proj Shard(1) (rowwise)",
                                 pl[0], pl[1], pl[2]);
            else
                why = tps_asprintf("placements do not pair: q_proj %s, o_proj %s; tensor-parallel "
                                   "attention needs q_proj Shard(0) (colwise) and o_proj Shard(1) "
                                   "(rowwise)",
                                   pl[0], pl[1]);
            for (int k = 0; k < 3; k++) free(pl[k]);
        }
        if (!why) {
            uint64_t inter = m[0]->ct->shape[0];
            b->inter = inter;
            for (int k = 1; k < b->nprod && !why; k++)
                if (m[k]->ct->shape[0] != inter || m[k]->ct->shape[1] != m[0]->ct->shape[1])
                    why = tps_asprintf("%s is [%llu, %llu] but %s is [%llu, %llu]",
                                       short_name(m[k]), (unsigned long long)m[k]->ct->shape[0],
                                       (unsigned long long)m[k]->ct->shape[1], "gate_proj",
                                       (unsigned long long)inter,
                                       (unsigned long long)m[0]->ct->shape[1]);
            if (!why && cons->ct->shape[1] != inter)
                why = tps_asprintf("%s takes %llu inputs but %s gives %llu",
                                   kind == BLK_MLP ? "down_proj" : "o_proj",
                                   (unsigned long long)cons->ct->shape[1],
                                   kind == BLK_MLP ? "gate_proj" : "q_proj",
                                   (unsigned long long)inter);
            for (int r = 0; r < V->tp && !why; r++)
                if (cons->lo[r] != m[0]->lo[r] || cons->len[r] != m[0]->len[r])
                    why = tps_asprintf(
                        "rank %d: %s columns [%llu, %llu) but %s rows [%llu, %llu)", r,
                        kind == BLK_MLP ? "down_proj" : "o_proj", (unsigned long long)cons->lo[r],
                        (unsigned long long)(cons->lo[r] + cons->len[r]),
                        kind == BLK_MLP ? "gate_proj" : "q_proj", (unsigned long long)m[0]->lo[r],
                        (unsigned long long)(m[0]->lo[r] + m[0]->len[r]));
        }
        if (why) {
            if (rep_add(V->R, b->name, kind == BLK_MLP ? "mlp" : "attn", 0, 0, 0, 0, 0, why))
                return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
            continue;
        }
        int numeric = V->src != NULL;
        for (int k = 0; k < nm_; k++)
            numeric &= (k < b->nprod ? m[k]->nk == NK_COL : m[k]->nk == NK_ROW);
        if (!numeric) {
            const char *skip = NULL;
            for (int k = 0; k < nm_ && !skip; k++)
                if (m[k]->nk_note) skip = m[k]->nk_note;
            char *note =
                V->src ? tps_asprintf("placements pair; numeric check %s", skip ? skip : "skipped")
                       : tps_strdup("placements pair (the numeric check needs --source)");
            if (rep_add(V->R, b->name, kind == BLK_MLP ? "mlp" : "attn", 0, 0, 0, 0, 1, note))
                return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
            continue;
        }
        atomic_store(&b->ready, 0);
        b->pending = b->nprod;
        for (int k = 0; k < b->nprod; k++) {
            m[k]->feeds = b;
            m[k]->feed_slot = k;
        }
        cons->cons_of = b;
        cons->stage2 = 1;
    }
    return TPS_OK;
}

/* Queue: tensors in name order; a block's second half STAGE2_LAG tensors
 * after its last producer. */
static tps_err build_order(vctx *V)
{
    V->order = calloc(V->nu ? V->nu : 1, sizeof *V->order);
    size_t *pos = calloc(V->nu ? V->nu : 1, sizeof *pos); /* stage-1 position per unit */
    if (!V->order || !pos) {
        free(pos);
        return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    }
    size_t n1 = 0;
    for (size_t i = 0; i < V->nu; i++)
        if (!V->u[i].stage2) pos[i] = n1++;
    /* stage-2 units keyed by their insertion point, in name order */
    size_t k = 0, s2 = 0;
    size_t *key = calloc(V->nu ? V->nu : 1, sizeof *key);
    size_t *s2u = calloc(V->nu ? V->nu : 1, sizeof *s2u);
    if (!key || !s2u) {
        free(pos), free(key), free(s2u);
        return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    }
    for (size_t i = 0; i < V->nu; i++) {
        if (!V->u[i].stage2) continue;
        vblock *b = V->u[i].cons_of;
        size_t last = 0;
        for (int p = 0; p < b->nprod; p++) {
            size_t pi = (size_t)(b->prod[p] - V->u);
            if (pos[pi] > last) last = pos[pi];
        }
        key[s2] = last + STAGE2_LAG;
        s2u[s2++] = i;
    }
    /* insertion sort of stage-2 entries by key (stable) */
    for (size_t a = 1; a < s2; a++)
        for (size_t b = a; b > 0 && key[b - 1] > key[b]; b--) {
            size_t t = key[b];
            key[b] = key[b - 1];
            key[b - 1] = t;
            t = s2u[b];
            s2u[b] = s2u[b - 1];
            s2u[b - 1] = t;
        }
    size_t j = 0, q = 0;
    for (size_t i = 0; i < V->nu; i++) {
        if (V->u[i].stage2) continue;
        V->order[k++] = &V->u[i];
        while (q < s2 && key[q] <= j) V->order[k++] = &V->u[s2u[q++]];
        j++;
    }
    while (q < s2) V->order[k++] = &V->u[s2u[q++]];
    free(pos), free(key), free(s2u);
    uint64_t t0 = 0;
    for (size_t i = 0; i < V->nu; i++) {
        vunit *u = V->order[i];
        if (!u->ntasks) u->ntasks = 1; /* structural failures: one empty task to finalize */
        u->task0 = t0;
        t0 += u->ntasks;
        atomic_init(&u->left, u->ntasks);
        atomic_init(&u->done, 0);
    }
    V->ntasks = t0;
    return TPS_OK;
}

/* ------------------------------------------------------------------ jobs */

static void job_free(vctx *V, vjob *J)
{
    if (J && J->srank) {
        for (int r = 0; r < V->tp; r++) free(J->srank[r]);
        free(J->srank);
    }
    if (J) {
        free(J->sref);
        free(J->slo);
        free(J->sw);
    }
    if (!J) return;
    if (J->gj) tps_gpu_job_free(V->gpu, J->gj);
    if (J->xr) {
        for (int r = 0; r < V->tp; r++)
            if (J->xr[r] != J->xref) free(J->xr[r]);
        free(J->xr);
    }
    if (J->yloc) {
        for (int r = 0; r < V->tp; r++) free(J->yloc[r]);
        free(J->yloc);
    }
    free(J->xref);
    free(J->kr);
    free(J->yref);
    free(J->sabs);
    free(J->ysh);
    free(J->ids);
    free(J);
}

static tps_err read_f32(vctx *V, tps_ckpt *ck, size_t t, int piece, uint64_t nel, float *dst);

/* A piece of a tensor of V->ck as f32: the piece on `rank` (its own rows,
 * not a replica), whole. */
static tps_err read_piece_f32(vctx *V, size_t t, int rank, float **out, uint64_t *lo,
                              uint64_t *n)
{
    const tps_ctensor *ct = &V->ck->t[t];
    int p = -1;
    for (int k = 0; k < ct->npieces && p < 0; k++)
        if (ct->pieces[k].rank == rank) p = k;
    *out = NULL;
    if (p < 0) return TPS_OK;
    uint64_t nb = ct->pieces[p].nbytes, es = tps_dtype_bits(ct->dtype) / 8;
    unsigned char *raw = malloc(nb + 1);
    float *f = malloc((nb / (es ? es : 1) + 1) * sizeof(float));
    tps_err rc = raw && f ? TPS_OK : tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    if (!rc) rc = tps_ckpt_read_piece(V->ctx, V->ck, t, p, 0, raw, (size_t)nb);
    if (!rc && to_f32(ct->dtype, raw, f, (size_t)(nb / es)))
        rc = tps_fail(V->ctx, TPS_E_FORMAT, "verify: scale %s: cannot convert %s to f32", ct->name,
                      tps_dtype_name(ct->dtype));
    free(raw);
    if (rc) {
        free(f);
        return rc;
    }
    *out = f;
    *lo = ct->dim >= 0 ? ct->pieces[p].lo : 0;
    *n = nb / es;
    return TPS_OK;
}

/* Scales of an FP8 weight unit: the source's and every local rank's. */
static tps_err load_scales(vctx *V, vunit *u, vjob *J)
{
    J->qkind = -1;
    if (!V->q || (size_t)u->t >= V->ck->n || V->q->role[u->t] != TPS_QR_WEIGHT) return TPS_OK;
    size_t s = (size_t)V->q->partner[u->t];
    const tps_ctensor *sc = &V->ck->t[s];
    int ssi = tps_ckpt_find(V->src, sc->name);
    if (ssi < 0)
        return tps_fail(V->ctx, TPS_E_MISMATCH, "verify: scale %s is not in the source", sc->name);
    J->qkind = V->q->kind[s];
    J->bn = V->q->bn;
    J->bk = V->q->bk;
    J->scols = sc->ndim == 2 ? sc->shape[1] : 1;
    uint64_t nsref = V->src->t[ssi].nbytes / (tps_dtype_bits(sc->dtype) / 8);
    J->sref = malloc((nsref + 1) * sizeof(float));
    J->srank = calloc((size_t)V->tp, sizeof(float *));
    J->slo = calloc((size_t)V->tp, sizeof(uint64_t));
    J->sw = calloc((size_t)V->tp, sizeof(uint64_t));
    if (!J->sref || !J->srank || !J->slo || !J->sw)
        return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    TPS_TRY(read_f32(V, V->src, (size_t)ssi, -1, nsref, J->sref));
    for (int r = 0; r < V->tp; r++) {
        if (!V->local[r]) continue;
        uint64_t lo = 0, n = 0;
        TPS_TRY(read_piece_f32(V, s, r, &J->srank[r], &lo, &n));
        /* along the weight's dim: block rows (colwise) or block columns
         * (rowwise) of the scale, channel rows, or the whole scale */
        J->slo[r] = sc->dim >= 0 ? lo : 0;
        J->sw[r] = sc->dim == 1 ? (n / (sc->shape[0] ? sc->shape[0] : 1)) : J->scols;
    }
    return TPS_OK;
}

/* Multiplies rank `side`'s (or the source's, side -1) weight row j (global)
 * of `width` f32 elements by its scales. col0: the global column of w[0]. */
static void dequant_row(const vjob *J, int side, uint64_t j, uint64_t col0, float *w,
                        size_t width, int dim)
{
    const float *S = side < 0 ? J->sref : J->srank[side];
    if (!S) return;
    uint64_t slo = side < 0 ? 0 : J->slo[side], sw = side < 0 ? J->scols : J->sw[side];
    if (J->qkind == TPS_QS_TENSOR) {
        for (size_t k = 0; k < width; k++) w[k] *= S[0];
        return;
    }
    if (J->qkind == TPS_QS_CHANNEL) {
        /* a colwise rank holds its rows' scales; a rowwise one every row's */
        float sj = S[side >= 0 && dim == 0 ? j - slo : j];
        for (size_t k = 0; k < width; k++) w[k] *= sj;
        return;
    }
    uint64_t br = j / J->bn;
    if (side >= 0 && dim == 0) br -= slo;
    for (size_t k = 0; k < width; k++) {
        uint64_t bc = (col0 + k) / J->bk;
        if (side >= 0 && dim == 1) bc -= slo;
        w[k] *= S[br * sw + bc];
    }
}

static int gpu_native(tps_dtype d)
{
    return d == TPS_BF16 || d == TPS_F16 || d == TPS_F32;
}

static tps_err job_create(vctx *V, vunit *u)
{
    const tps_ctensor *ct = u->ct;
    int tp = V->tp, batch = V->batch;
    vblock *blk = u->cons_of;
    vjob *J = calloc(1, sizeof *J);
    if (!J) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    J->batch = batch;
    J->nb = blk ? 2 * batch : batch;
    J->dtype = ct->dtype;
    J->qkind = -1;
    tps_err qe = load_scales(V, u, J);
    if (qe) {
        job_free(V, J);
        return qe;
    }
    J->op = gpu_native(ct->dtype) ? ct->dtype : TPS_F32;
    J->embed = u->nk == NK_EMB_ROWS || u->nk == NK_EMB_COLS;
    J->matmul = !J->embed;
    J->gather = u->nk == NK_COL || u->nk == NK_EMB_COLS;
    /* out: output width; in: reference reduction width */
    if (u->nk == NK_COL || u->nk == NK_ROW) {
        J->out = ct->shape[0];
        J->in = ct->shape[1];
    } else {
        J->out = ct->shape[1];
        J->in = 0;
    }
    size_t nb = (size_t)J->nb, out = J->out, in = J->in;
    int ok = 1;
    J->yref = calloc(nb * out + 1, sizeof(float));
    J->sabs = calloc(nb * out + 1, sizeof(float));
    J->ysh = calloc(nb * out + 1, sizeof(float));
    ok &= J->yref && J->sabs && J->ysh;
    if (J->embed) {
        J->ids = malloc(sizeof(uint64_t) * (size_t)batch);
        J->yloc = calloc((size_t)tp, sizeof(float *));
        ok &= J->ids && J->yloc;
        for (int r = 0; ok && r < tp; r++) {
            if (!V->local[r]) continue;
            size_t w = J->gather ? u->len[r] : out;
            J->yloc[r] = calloc(nb * w + 1, sizeof(float));
            ok &= J->yloc[r] != NULL;
        }
        if (ok)
            for (int b = 0; b < batch; b++)
                J->ids[b] = tps_input_id(V->o->seed, (uint64_t)b, ct->shape[0]);
    } else {
        J->xref = malloc((nb * in + 1) * sizeof(float));
        J->xr = calloc((size_t)tp, sizeof(float *));
        J->kr = calloc((size_t)tp, sizeof(uint64_t));
        ok &= J->xref && J->xr && J->kr;
        if (ok) {
            for (size_t b = 0; b < (size_t)batch; b++)
                for (size_t i = 0; i < in; i++)
                    J->xref[b * in + i] = tps_input_value(V->o->seed, b, i);
            if (blk)
                memcpy(J->xref + (size_t)batch * in, blk->href, (size_t)batch * in * sizeof(float));
        }
        for (int r = 0; ok && r < tp; r++) {
            if (!V->local[r]) continue;
            if (J->gather) {
                J->xr[r] = J->xref;
                J->kr[r] = in;
            } else {
                uint64_t lo = u->lo[r], len = u->len[r];
                J->kr[r] = len;
                J->xr[r] = malloc((nb * len + 1) * sizeof(float));
                if (!(ok = J->xr[r] != NULL)) break;
                for (size_t b = 0; b < (size_t)batch; b++)
                    memcpy(J->xr[r] + b * len, J->xref + b * in + lo, len * sizeof(float));
                if (blk)
                    memcpy(J->xr[r] + (size_t)batch * len, blk->hr[r],
                           (size_t)batch * len * sizeof(float));
            }
        }
        if (ok && V->backend == TPS_BACKEND_CPU) {
            J->yloc = calloc((size_t)tp, sizeof(float *));
            ok &= J->yloc != NULL;
            for (int r = 0; ok && r < tp; r++) {
                size_t w = J->gather ? u->len[r] : out;
                J->yloc[r] = calloc(nb * w + 1, sizeof(float));
                ok &= J->yloc[r] != NULL;
            }
        }
    }
    if (!ok) {
        job_free(V, J);
        return tps_fail(V->ctx, TPS_E_NOMEM, "verify: %s: out of memory for the products",
                        ct->name);
    }
    if (V->gpu && J->matmul) {
        tps_gpu_job_desc d = {
            .gather = J->gather,
            .matmul = 1,
            .tp = tp,
            .dtype = J->op,
            .out = J->out,
            .in = J->in,
            .nb = J->nb,
            .xref = J->xref,
            .xr = (const float *const *)J->xr,
            .kr = J->kr,
            .lo = u->lo,
            .len = u->len,
            .want_ref = V->want_ref,
        };
        tps_err rc = tps_gpu_job_new(V->ctx, V->gpu, &d, &J->gj);
        if (rc) {
            job_free(V, J);
            return rc;
        }
    }
    u->job = J;
    return TPS_OK;
}

/* Job of a unit, made by the first task that needs it; a block's second half
 * first waits until the block's activations exist. */
static tps_err job_get(vctx *V, vunit *u, vjob **out)
{
    *out = NULL;
    int st = atomic_load_explicit(&u->job_state, memory_order_acquire);
    if (st == 1) {
        *out = u->job;
        return TPS_OK;
    }
    if (st < 0) return TPS_E_NOMEM;
    if (u->cons_of) {
        struct timespec ts = {0, 50000};
        int rd;
        while ((rd = atomic_load_explicit(&u->cons_of->ready, memory_order_acquire)) == 0) {
            if (atomic_load(&V->err)) return V->rc ? V->rc : TPS_E_INTERRUPTED;
            nanosleep(&ts, NULL);
        }
        if (rd < 0) return V->rc ? V->rc : TPS_E_NOMEM;
    }
    pthread_mutex_lock(&u->mu);
    tps_err rc = TPS_OK;
    st = atomic_load(&u->job_state);
    if (st == 0) {
        rc = job_create(V, u);
        atomic_store_explicit(&u->job_state, rc ? -1 : 1, memory_order_release);
    } else if (st < 0) {
        rc = TPS_E_NOMEM;
    }
    pthread_mutex_unlock(&u->mu);
    if (!rc) *out = u->job;
    return rc;
}

/* which: 0 source rows, 1 rank rows, 2 the compare step's rank rows */
static tps_err grow(vctx *V, tbuf *tb, int which, size_t need)
{
    unsigned char **p = which == 2 ? &tb->cmp : which ? &tb->sh : &tb->src;
    size_t *cap = which == 2 ? &tb->cmp_cap : which ? &tb->sh_cap : &tb->src_cap;
    if (*cap >= need) return TPS_OK;
    size_t n = need < (which == 2 ? STEP : CHUNK) ? (which == 2 ? STEP : CHUNK) : need;
    if (which == 0 ? tb->pin_src : which == 1 ? tb->pin_sh : 0) {
        tps_gpu_host_free(V->gpu, *p);
        *p = tps_gpu_host_alloc(V->gpu, n);
    } else {
        free(*p);
        *p = malloc(n);
    }
    *cap = *p ? n : 0;
    return *p ? TPS_OK
              : tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory for a %zu-byte buffer", n);
}
static float *fgrow(float **p, size_t *cap, size_t n)
{
    if (*cap >= n) return *p;
    float *q = realloc(*p, (n ? n : 1) * sizeof(float));
    if (!q) return NULL;
    *p = q;
    *cap = n;
    return q;
}

#define NOT_SAME UINT64_MAX

/* Rows [row0, row0 + n) of a numeric unit's weight, for side -1 (source) or
 * rank r, as they were just read. same_col0: for a rank's rows that were
 * just found byte-identical to the source rows read in this task, the column
 * where they start in those rows (a GPU backend then reuses the staged source
 * copy); NOT_SAME otherwise. */
static tps_err job_rows(vctx *V, vunit *u, tbuf *tb, int slot, int side, uint64_t row0, uint64_t n,
                        const unsigned char *bytes, uint64_t same_col0)
{
    if (u->nk == NK_NONE || !n) return TPS_OK;
    if (side < 0 && !V->want_ref) return TPS_OK;
    if (side >= 0 && !V->local[side]) return TPS_OK;
    vjob *J;
    TPS_TRY(job_get(V, u, &J));
    tps_dtype dt = u->ct->dtype;
    size_t es = dt_bytes(dt);
    if (J->embed) {
        uint64_t width = (side < 0 || !J->gather) ? J->out : u->len[side];
        for (uint64_t i = 0; i < n; i++) {
            uint64_t j = row0 + i;
            for (int b = 0; b < J->batch; b++) {
                if (J->ids[b] != j) continue;
                float *dst =
                    side < 0 ? J->yref + (size_t)b * J->out : J->yloc[side] + (size_t)b * width;
                if (to_f32(dt, bytes + i * width * es, dst, width))
                    return tps_fail(V->ctx, TPS_E_FORMAT, "verify: %s: cannot convert %s to f32",
                                    u->ct->name, tps_dtype_name(dt));
            }
        }
        return TPS_OK;
    }
    uint64_t width = side < 0 ? J->in : J->kr[side];
    if (J->gj) {
        /* quantized: each side's own scales, so no staged copy is shared */
        if (side >= 0 && same_col0 != NOT_SAME && J->qkind < 0) {
            int done = 0;
            TPS_TRY(tps_gpu_job_rows_ref(V->ctx, V->gpu, J->gj, slot, side, row0, n, same_col0,
                                         &done));
            if (done) return TPS_OK;
        }
        const void *p = bytes;
        if (J->op != dt) {
            float *c = fgrow(&tb->conv, &tb->conv_cap, (size_t)(n * width));
            if (!c) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
            if (to_f32(dt, bytes, c, (size_t)(n * width)))
                return tps_fail(V->ctx, TPS_E_FORMAT, "verify: %s: cannot convert %s to f32",
                                u->ct->name, tps_dtype_name(dt));
            if (J->qkind >= 0)
                for (uint64_t i = 0; i < n; i++)
                    dequant_row(J, side, row0 + i, side >= 0 && u->dim == 1 ? u->lo[side] : 0,
                                c + i * width, (size_t)width, u->dim);
            p = c;
        }
        return tps_gpu_job_rows(V->ctx, V->gpu, J->gj, slot, side, row0, n, p);
    }
    float *w = fgrow(&tb->w, &tb->w_cap, (size_t)width);
    if (!w) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    const float *X = side < 0 ? J->xref : J->xr[side];
    void (*dot)(const void *, size_t, const float *, size_t, int, float *, size_t, float *) =
        dot_rows;
#ifdef HAVE_DOT_BF16
    if (dt == TPS_BF16) dot = dot_rows_bf16;
#endif
    for (uint64_t i = 0; i < n; i++) {
        uint64_t j = row0 + i;
        const void *row = bytes + i * width * es;
        if (dot == dot_rows && (dt != TPS_F32 || J->qkind >= 0)) {
            if (to_f32(dt, row, w, (size_t)width))
                return tps_fail(V->ctx, TPS_E_FORMAT, "verify: %s: cannot convert %s to f32",
                                u->ct->name, tps_dtype_name(dt));
            if (J->qkind >= 0)
                dequant_row(J, side, j, side >= 0 && u->dim == 1 ? u->lo[side] : 0, w,
                            (size_t)width, u->dim);
            row = w;
        }
        if (side < 0)
            dot(row, (size_t)width, X, (size_t)width, J->nb, J->yref + j, (size_t)J->out,
                J->sabs + j);
        else if (J->gather)
            dot(row, (size_t)width, X, (size_t)width, J->nb, J->yloc[side] + (j - u->lo[side]),
                (size_t)u->len[side], NULL);
        else
            dot(row, (size_t)width, X, (size_t)width, J->nb, J->yloc[side] + j, (size_t)J->out,
                NULL);
    }
    return TPS_OK;
}

/* GPU backends: rank r's rows [row0, row0 + n), columns from col0, found equal
 * to the source rows this task staged: *done = 1 when the backend multiplies
 * the staged copy (or there is nothing to multiply), 0 when the caller must
 * hand the bytes over itself. */
static tps_err rows_from_source(vctx *V, vunit *u, int slot, int r, uint64_t row0, uint64_t n,
                                uint64_t col0, int *done)
{
    *done = 1;
    if (u->nk == NK_NONE || !n || !V->local[r]) return TPS_OK;
    vjob *J;
    TPS_TRY(job_get(V, u, &J));
    *done = 0;
    if (!J->gj) return TPS_OK;
    return tps_gpu_job_rows_ref(V->ctx, V->gpu, J->gj, slot, r, row0, n, col0, done);
}

/* ------------------------------------------------------------------ tasks */

static void note_diff(vunit *u, int r, const unsigned char *a, const unsigned char *b, size_t n,
                      uint64_t shard_off)
{
    uint64_t cnt = 0, first = UINT64_MAX;
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) {
            if (first == UINT64_MAX) first = shard_off + i;
            cnt++;
        }
    atomic_fetch_add(&u->diff[r], cnt);
    pthread_mutex_lock(&u->mu);
    if (first < u->first[r]) u->first[r] = first;
    pthread_mutex_unlock(&u->mu);
}

static tps_err run_task(vctx *V, vunit *u, uint64_t idx, tbuf *tb, int slot)
{
    tps_ctx *ctx = V->ctx;
    const tps_ctensor *ct = u->ct;
    int tp = V->tp;
    uint64_t got = 0;
    switch (u->mode) {
    case MODE_NONE: return TPS_OK;
    case MODE_CRC: {
        int p = 0, np = ct->npieces + ct->nreplicas;
        while (p + 1 <= np && u->crcpre[p + 1] <= idx) p++;
        if (p >= np) return TPS_OK; /* the placeholder task of a tensor with no local piece */
        uint64_t c = idx - u->crcpre[p];
        uint64_t nb = (p < ct->npieces ? &ct->pieces[p] : &ct->replicas[p - ct->npieces])->nbytes;
        uint64_t off = c * CHUNK;
        size_t len = (size_t)(nb - off < CHUNK ? nb - off : CHUNK);
        if (nb == 0) len = 0;
        TPS_TRY(grow(V, tb, 1, len));
        if (len) TPS_TRY(tps_ckpt_read_piece(ctx, V->ck, u->t, p, off, tb->sh, len));
        u->crcs[idx] = tps_crc32(0, tb->sh, len);
        u->crclen[idx] = len;
        got = len;
        break;
    }
    case MODE_REP:
    case MODE_LOGICAL: {
        uint64_t off = idx * u->chunk;
        size_t len = (size_t)(ct->nbytes - off < u->chunk ? ct->nbytes - off : u->chunk);
        TPS_TRY(grow(V, tb, 0, len));
        TPS_TRY(grow(V, tb, 1, len));
        TPS_TRY(tps_ckpt_read(ctx, V->src, (size_t)u->si, off, tb->src, len));
        if (u->mode == MODE_LOGICAL) {
            TPS_TRY(tps_ckpt_read(ctx, V->ck, u->t, off, tb->sh, len));
            got = len;
            if (memcmp(tb->src, tb->sh, len)) note_diff(u, 0, tb->src, tb->sh, len, off);
            break;
        }
        for (int r = 0; r < tp; r++) {
            if (!V->local[r] || u->piece[r] < 0) continue;
            TPS_TRY(tps_ckpt_read_piece(ctx, V->ck, u->t, u->piece[r], off, tb->sh, len));
            got += len;
            if (memcmp(tb->src, tb->sh, len)) note_diff(u, r, tb->src, tb->sh, len, off);
        }
        break;
    }
    case MODE_A: {
        uint64_t o0 = idx * u->k, kk = u->outer - o0 < u->k ? u->outer - o0 : u->k;
        size_t slen = (size_t)(kk * u->W);
        TPS_TRY(grow(V, tb, 0, slen));
        if (u->dim == 0) { /* a small tensor split by rows: one task reads it all */
            TPS_TRY(grow(V, tb, 1, slen));
            TPS_TRY(tps_ckpt_read(ctx, V->src, (size_t)u->si, 0, tb->src, slen));
            TPS_TRY(job_rows(V, u, tb, slot, -1, 0, u->nd, tb->src, NOT_SAME));
            size_t at = 0;
            for (int r = 0; r < tp; r++) {
                uint64_t wr = u->len[r] * u->inner;
                if (!V->local[r] || u->piece[r] < 0 || !wr) continue;
                unsigned char *sh = tb->sh + at;
                TPS_TRY(tps_ckpt_read_piece(ctx, V->ck, u->t, u->piece[r], 0, sh, (size_t)wr));
                got += wr;
                at += wr;
                const unsigned char *a = tb->src + u->lo[r] * u->inner;
                int same = !memcmp(a, sh, (size_t)wr);
                if (!same) note_diff(u, r, a, sh, (size_t)wr, 0);
                TPS_TRY(job_rows(V, u, tb, slot, r, u->lo[r], u->len[r], sh, same ? 0 : NOT_SAME));
            }
            for (int r = tp; r < u->nslot; r++) { /* replicas: the same bytes, compared */
                uint64_t wr = u->len[r] * u->inner;
                if (!V->local[u->slot_rank[r]] || !wr) continue;
                TPS_TRY(grow(V, tb, 2, (size_t)wr));
                TPS_TRY(tps_ckpt_read_piece(ctx, V->ck, u->t, u->piece[r], 0, tb->cmp, (size_t)wr));
                got += wr;
                const unsigned char *a = tb->src + u->lo[r] * u->inner;
                if (memcmp(a, tb->cmp, (size_t)wr)) note_diff(u, r, a, tb->cmp, (size_t)wr, 0);
            }
            break;
        }
        /* rows [o0, o0 + kk), each W bytes of which rank r holds [lo, lo + len) */
        uint64_t rs = u->W >= STEP ? 1 : STEP / u->W;
        TPS_TRY(grow(V, tb, 2, (size_t)(rs * u->W)));
        memset(tb->same, 1, (size_t)tp);
        for (uint64_t os = 0; os < kk; os += rs) {
            uint64_t ns = kk - os < rs ? kk - os : rs;
            unsigned char *src = tb->src + os * u->W;
            TPS_TRY(tps_ckpt_read(ctx, V->src, (size_t)u->si, (o0 + os) * u->W, src,
                                  (size_t)(ns * u->W)));
            if (!V->gpu) TPS_TRY(job_rows(V, u, tb, slot, -1, o0 + os, ns, src, NOT_SAME));
            for (int r = 0; r < tp; r++) {
                uint64_t wr = u->len[r] * u->inner;
                if (!V->local[r] || u->piece[r] < 0 || !wr) continue;
                TPS_TRY(tps_ckpt_read_piece(ctx, V->ck, u->t, u->piece[r], (o0 + os) * wr, tb->cmp,
                                            (size_t)(ns * wr)));
                got += ns * wr;
                for (uint64_t o = 0; o < ns; o++) {
                    const unsigned char *a = src + o * u->W + u->lo[r] * u->inner,
                                        *b = tb->cmp + o * wr;
                    if (memcmp(a, b, (size_t)wr)) {
                        note_diff(u, r, a, b, (size_t)wr, (o0 + os + o) * wr);
                        tb->same[r] = 0;
                    }
                }
                if (!V->gpu) TPS_TRY(job_rows(V, u, tb, slot, r, o0 + os, ns, tb->cmp, NOT_SAME));
            }
        }
        if (!V->gpu) break;
        /* GPU: the task's rows in one go; a rank's rows that equal the source's
         * come from the staged source rows, the others from its own bytes */
        TPS_TRY(job_rows(V, u, tb, slot, -1, o0, kk, tb->src, NOT_SAME));
        size_t at = 0;
        for (int r = 0; r < tp; r++) {
            uint64_t wr = u->len[r] * u->inner;
            if (!V->local[r] || u->piece[r] < 0 || !wr) continue;
            if (tb->same[r]) {
                int done = 0;
                TPS_TRY(rows_from_source(V, u, slot, r, o0, kk, u->lo[r], &done));
                if (done) continue;
            }
            /* room for every rank's rows at once: bytes handed over stay put
             * until the task's end */
            if (at == 0) TPS_TRY(grow(V, tb, 1, slen));
            unsigned char *sh = tb->sh + at;
            if (tb->same[r]) /* pack the equal bytes: the same rows, contiguous */
                for (uint64_t o = 0; o < kk; o++)
                    memcpy(sh + o * wr, tb->src + o * u->W + u->lo[r] * u->inner, (size_t)wr);
            else
                TPS_TRY(tps_ckpt_read_piece(ctx, V->ck, u->t, u->piece[r], o0 * wr, sh,
                                            (size_t)(kk * wr)));
            at += kk * wr;
            TPS_TRY(job_rows(V, u, tb, slot, r, o0, kk, sh, NOT_SAME));
        }
        break;
    }
    case MODE_B: {
        uint64_t o = idx / u->per_o, c = idx % u->per_o;
        int r = 0;
        while (r < u->nslot && u->segc[r + 1] <= c) r++;
        if (r >= u->nslot) return TPS_OK;
        uint64_t wr = u->len[r] * u->inner, off = (c - u->segc[r]) * u->step;
        size_t len = (size_t)(wr - off < u->step ? wr - off : u->step);
        /* a replica slot: its bytes are compared, its rank's own rows are multiplied */
        int rep = r >= tp;
        int mine = V->local[u->slot_rank[r]] && u->piece[r] >= 0;
        int need_src = mine || (!rep && u->nk != NK_NONE && V->want_ref);
        if (!need_src) return TPS_OK;
        TPS_TRY(grow(V, tb, 0, len));
        uint64_t soff = (o * u->nd + u->lo[r]) * u->inner + off, shoff = o * wr + off;
        uint64_t p0 = u->lo[r] + off / u->inner, np = len / u->inner;
        if (!mine) {
            TPS_TRY(tps_ckpt_read(ctx, V->src, (size_t)u->si, soff, tb->src, len));
            TPS_TRY(job_rows(V, u, tb, slot, -1, p0, np, tb->src, NOT_SAME));
            break;
        }
        /* steps of whole rows (the cpu backend multiplies each step while it is
         * in cache); a row longer than a step is one step */
        size_t step = len;
        if (u->inner && u->inner <= STEP && len % u->inner == 0) step = STEP / u->inner * u->inner;
        TPS_TRY(grow(V, tb, 2, step < len ? step : len));
        int same = 1;
        for (size_t a = 0; a < len; a += step) {
            size_t n = len - a < step ? len - a : step;
            TPS_TRY(tps_ckpt_read(ctx, V->src, (size_t)u->si, soff + a, tb->src + a, n));
            TPS_TRY(tps_ckpt_read_piece(ctx, V->ck, u->t, u->piece[r], shoff + a, tb->cmp, n));
            if (memcmp(tb->src + a, tb->cmp, n)) {
                note_diff(u, r, tb->src + a, tb->cmp, n, shoff + a);
                same = 0;
            }
            if (!rep && !V->gpu && step < len) {
                uint64_t q0 = p0 + a / u->inner, nq = n / u->inner;
                TPS_TRY(job_rows(V, u, tb, slot, -1, q0, nq, tb->src + a, NOT_SAME));
                TPS_TRY(job_rows(V, u, tb, slot, r, q0, nq, tb->cmp, NOT_SAME));
            }
        }
        got = len;
        if (rep) break;
        if (!V->gpu) {
            if (step == len) { /* one step: its products now */
                TPS_TRY(job_rows(V, u, tb, slot, -1, p0, np, tb->src, NOT_SAME));
                TPS_TRY(job_rows(V, u, tb, slot, r, p0, np, tb->cmp, NOT_SAME));
            }
            break;
        }
        TPS_TRY(job_rows(V, u, tb, slot, -1, p0, np, tb->src, NOT_SAME));
        if (same) { /* the rank's bytes are the source's: staged already */
            TPS_TRY(job_rows(V, u, tb, slot, r, p0, np, tb->src, u->dim == 0 ? 0 : NOT_SAME));
        } else if (step < len) {
            TPS_TRY(grow(V, tb, 1, len));
            TPS_TRY(tps_ckpt_read_piece(ctx, V->ck, u->t, u->piece[r], shoff, tb->sh, len));
            TPS_TRY(job_rows(V, u, tb, slot, r, p0, np, tb->sh, NOT_SAME));
        } else {
            TPS_TRY(job_rows(V, u, tb, slot, r, p0, np, tb->cmp, NOT_SAME));
        }
        break;
    }
    }
    atomic_fetch_add(&V->bytes, got);
    return TPS_OK;
}

/* ------------------------------------------------------------------ finalize */

/* Worst element of one comparison. sabs NULL: exact. */
typedef struct {
    double err, tol;
    uint64_t wrong, total;
} cmp_t;

static void compare(cmp_t *c, const float *ysh, const float *yref, const float *sabs, size_t n,
                    size_t stride_sh, size_t stride_ref, uint64_t terms, int tp)
{
    for (size_t i = 0; i < n; i++) {
        float a = ysh[i * stride_sh], b = yref[i * stride_ref];
        double tol = sabs ? tps_tolerance(terms, tp, sabs[i * stride_ref]) : 0.0;
        double e;
        if (isnan(a) || isnan(b))
            e = (isnan(a) && isnan(b)) ? 0 : INFINITY;
        else if (a == b)
            e = 0;
        else
            e = fabs((double)a - (double)b);
        if (isnan(e)) e = INFINITY; /* inf - inf of opposite signs */
        if (e > c->err) c->err = e;
        if (tol > c->tol) c->tol = tol;
        if (e > tol) c->wrong++;
        c->total++;
    }
}

static tps_err read_f32(vctx *V, tps_ckpt *ck, size_t t, int piece, uint64_t nel, float *dst)
{
    const tps_ctensor *ct = &ck->t[t];
    size_t es = dt_bytes(ct->dtype);
    unsigned char *buf = malloc((size_t)(nel * es) + 1);
    if (!buf) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    tps_err rc = piece < 0 ? tps_ckpt_read(V->ctx, ck, t, 0, buf, (size_t)(nel * es))
                           : tps_ckpt_read_piece(V->ctx, ck, t, piece, 0, buf, (size_t)(nel * es));
    if (!rc && to_f32(ct->dtype, buf, dst, (size_t)nel))
        rc = tps_fail(V->ctx, TPS_E_FORMAT, "verify: %s: cannot convert to f32", ct->name);
    free(buf);
    return rc;
}

/* Adds the biases: the source's to the reference, each rank's shard to its
 * columns (colwise) or rank 0's copy once after the reduction (rowwise). */
static tps_err add_bias(vctx *V, vunit *u, vjob *J)
{
    if (u->bias < 0) return TPS_OK;
    const tps_ctensor *b = &V->ck->t[u->bias];
    uint64_t out = J->out;
    float *bref = malloc((out + 1) * sizeof(float)), *bsh = malloc((out + 1) * sizeof(float));
    tps_err rc = TPS_OK;
    if (!bref || !bsh) {
        rc = tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
        goto out;
    }
    TPS_CHECK(read_f32(V, V->src, (size_t)u->bias_si, -1, out, bref));
    if (b->dim == 0) {
        for (int p = 0; p < b->npieces; p++) {
            const tps_piece *pc = &b->pieces[p];
            TPS_CHECK(read_f32(V, V->ck, u->bias, p, pc->hi - pc->lo, bsh + pc->lo));
        }
    } else {
        int p0 = 0;
        for (int p = 0; p < b->npieces; p++)
            if (b->pieces[p].rank == 0) p0 = p;
        TPS_CHECK(read_f32(V, V->ck, u->bias, p0, out, bsh));
    }
    for (size_t i = 0; i < (size_t)J->nb; i++)
        for (size_t j = 0; j < out; j++) {
            J->yref[i * out + j] += bref[j];
            J->sabs[i * out + j] += fabsf(bref[j]);
            J->ysh[i * out + j] += bsh[j];
        }
out:
    free(bref);
    free(bsh);
    return rc;
}

static tps_err collect(vctx *V, vunit *u, vjob *J)
{
    int tp = V->tp;
    tps_err rc = TPS_OK;
    if (J->gj) {
        TPS_TRY(tps_gpu_job_finish(V->ctx, V->gpu, J->gj, V->want_ref ? J->yref : NULL,
                                   V->want_ref ? J->sabs : NULL, J->ysh));
        return TPS_OK;
    }
    if (V->gpu) { /* embedding on a GPU backend: the collective on the device */
        tps_gpu_job_desc d = {
            .gather = J->gather,
            .matmul = 0,
            .tp = tp,
            .dtype = TPS_F32,
            .out = J->out,
            .in = 0,
            .nb = J->nb,
            .lo = u->lo,
            .len = u->len,
            .want_ref = 0,
        };
        TPS_TRY(tps_gpu_job_new(V->ctx, V->gpu, &d, &J->gj));
        for (int r = 0; r < tp; r++)
            if (V->local[r]) TPS_TRY(tps_gpu_job_contrib(V->ctx, V->gpu, J->gj, r, J->yloc[r]));
        TPS_TRY(tps_gpu_job_finish(V->ctx, V->gpu, J->gj, NULL, NULL, J->ysh));
        return TPS_OK;
    }
    float **outs = malloc(sizeof(float *) * (size_t)tp);
    if (!outs) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    for (int r = 0; r < tp; r++) outs[r] = J->ysh;
    if (J->gather)
        rc = V->comm->allgather(V->comm, V->ctx, (const float *const *)J->yloc, u->len,
                                (uint64_t)J->nb, outs);
    else
        rc = V->comm->allreduce(V->comm, V->ctx, (const float *const *)J->yloc,
                                (uint64_t)J->nb * J->out, outs);
    free(outs);
    return rc;
}

static const char *nk_kind(int nk)
{
    switch (nk) {
    case NK_COL: return "colwise";
    case NK_ROW: return "rowwise";
    default: return "embedding";
    }
}

static tps_err block_feed(vctx *V, vblock *b)
{
    int tp = V->tp, batch = V->batch;
    uint64_t inter = b->inter;
    tps_dtype op = b->cons->ct->dtype;
    size_t n = (size_t)batch * inter;
    b->href = malloc((n + 1) * sizeof(float));
    b->hr = calloc((size_t)tp, sizeof(float *));
    if (!b->href || !b->hr) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    /* The reference half takes the activations the ranks made, gathered: the
     * check then isolates the pairing (rank r's slice meets rank r's columns
     * of the rowwise weight), the colwise rows having compared those
     * activations with the source's; and on a GPU, where the reference and
     * rank GEMMs may differ in the last bit, a BF16 rounding cannot flip
     * between the two sides. */
    for (size_t i = 0; i < n; i++) {
        float h = b->kind == BLK_MLP ? silu(b->keep_sh[0][i]) * b->keep_sh[1][i] : b->keep_sh[0][i];
        b->href[i] = round_to(op, h);
    }
    for (int r = 0; r < tp; r++) {
        if (!V->local[r]) continue;
        uint64_t lo = b->prod[0]->lo[r], len = b->prod[0]->len[r];
        b->hr[r] = malloc(((size_t)batch * len + 1) * sizeof(float));
        if (!b->hr[r]) return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
        /* rank r's local activations: its own columns of the gathered outputs */
        for (size_t bb = 0; bb < (size_t)batch; bb++)
            for (size_t c = 0; c < len; c++) {
                size_t at = bb * inter + lo + c;
                float h = b->kind == BLK_MLP ? silu(b->keep_sh[0][at]) * b->keep_sh[1][at]
                                             : b->keep_sh[0][at];
                b->hr[r][bb * len + c] = round_to(op, h);
            }
    }
    for (int k = 0; k < 2; k++) {
        free(b->keep_sh[k]);
        b->keep_sh[k] = NULL;
    }
    return TPS_OK;
}

static void block_release(vctx *V, vblock *b)
{
    free(b->href);
    b->href = NULL;
    if (b->hr)
        for (int r = 0; r < V->tp; r++) free(b->hr[r]);
    free(b->hr);
    b->hr = NULL;
    for (int k = 0; k < 2; k++) {
        free(b->keep_sh[k]);
        b->keep_sh[k] = NULL;
    }
}

/* ", in 'model.layers.0.self_attn.qkv_proj.weight' at byte 1024" for a piece
 * inside another rank tensor; "" otherwise. */
static const char *slot_where(const vunit *u, int s)
{
    static _Thread_local char buf[320];
    const tps_piece *pc = slot_piece(u, s);
    if (!pc || !pc->holder || !strcmp(pc->holder, u->ct->name)) return "";
    snprintf(buf, sizeof buf, ", in '%s' at byte %llu", pc->holder, (unsigned long long)pc->at);
    return buf;
}

static char *recon_note(vctx *V, vunit *u, uint64_t *wrong)
{
    char buf[1024];
    size_t n = 0;
    int shown = 0, more = 0;
    *wrong = 0;
    for (int r = 0; r < u->nslot; r++) {
        uint64_t d = atomic_load(&u->diff[r]);
        if (!d) continue;
        *wrong += d;
        if (shown == 3) {
            more++;
            continue;
        }
        shown++;
        if (n >= sizeof buf) continue;
        if (u->mode == MODE_LOGICAL)
            n += (size_t)snprintf(buf + n, sizeof buf - n,
                                  "%s%llu byte%s of the gathered tensor differ%s from the source, "
                                  "first at byte %llu",
                                  n ? "; " : "", (unsigned long long)d, d == 1 ? "" : "s",
                                  d == 1 ? "s" : "", (unsigned long long)u->first[r]);
        else
            n += (size_t)snprintf(buf + n, sizeof buf - n,
                                  "%srank %d (%s%s): %llu byte%s of the %s differ%s from the "
                                  "source, first at byte %llu",
                                  n ? "; " : "", u->slot_rank[r], rank_file(V, u, r),
                                  slot_where(u, r), (unsigned long long)d, d == 1 ? "" : "s",
                                  r >= V->tp ? "replica" : "shard", d == 1 ? "s" : "",
                                  (unsigned long long)u->first[r]);
    }
    if (!*wrong) return NULL;
    if (more && n < sizeof buf)
        snprintf(buf + n, sizeof buf - n, "; and %d more rank%s", more, more == 1 ? "" : "s");
    return tps_strdup(buf);
}

static tps_err crc_row(vctx *V, vunit *u)
{
    const tps_ctensor *ct = u->ct;
    uint64_t bad = 0, total = 0;
    char buf[1024];
    size_t n = 0;
    uint32_t ref = 0;
    int have_ref = 0, repl_differs = 0;
    for (int p = 0; p < ct->npieces + ct->nreplicas; p++) {
        const tps_piece *pc = p < ct->npieces ? &ct->pieces[p] : &ct->replicas[p - ct->npieces];
        if (u->dim < 0 && pc->has_crc) {
            if (!have_ref)
                ref = pc->crc, have_ref = 1;
            else if (pc->crc != ref)
                repl_differs = 1;
        }
        if (!V->local[pc->rank]) continue;
        uLong crc = crc32(0L, Z_NULL, 0);
        for (uint64_t k = u->crcpre[p]; k < u->crcpre[p + 1]; k++)
            crc = crc32_combine(crc, u->crcs[k], (z_off_t)u->crclen[k]);
        total++;
        if (!pc->has_crc || (uint32_t)crc != pc->crc) {
            bad++;
            if (n < sizeof buf) {
                if (pc->has_crc)
                    n += (size_t)snprintf(buf + n, sizeof buf - n,
                                          "%srank %d (%s): CRC32 %08x, the manifest says %08x",
                                          n ? "; " : "", pc->rank, V->ck->files[pc->file].name,
                                          (unsigned)crc, (unsigned)pc->crc);
                else
                    n += (size_t)snprintf(buf + n, sizeof buf - n,
                                          "%srank %d: the manifest has no CRC32", n ? "; " : "",
                                          pc->rank);
            }
        }
    }
    if (repl_differs && n < sizeof buf) {
        n += (size_t)snprintf(
            buf + n, sizeof buf - n,
            "%sthe manifest's CRC32s of this replicated tensor differ across ranks", n ? "; " : "");
        if (!bad) bad = 1;
    }
    if (rep_add(V->R, ct->name, "crc", 0, 0, bad, total, bad == 0 && !u->pre,
                u->pre ? tps_strdup(u->pre)
                : n    ? tps_strdup(buf)
                       : NULL))
        return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    return TPS_OK;
}

static tps_err finalize(vctx *V, vunit *u)
{
    tps_err rc = TPS_OK;
    const tps_ctensor *ct = u->ct;
    vblock *blk = u->cons_of;
    if (u->mode == MODE_CRC) {
        TPS_TRY(crc_row(V, u));
    } else {
        uint64_t wrong = 0, total = 0;
        char *note = u->pre ? tps_strdup(u->pre) : recon_note(V, u, &wrong);
        if (!note && ct->derived_from && V->src)
            note = tps_asprintf("compared with the source's %s (--untie wrote it from that)",
                                ct->derived_from);
        for (int r = 0; r < u->nslot; r++)
            if (V->local[u->slot_rank[r]] && u->piece[r] >= 0) total += slot_piece(u, r)->nbytes;
        if (u->mode == MODE_LOGICAL) total = ct->nbytes;
        if (rep_add(V->R, ct->name, u->dim < 0 ? "replicated" : "reconstruct", 0, 0, wrong, total,
                    !u->pre && !wrong, note))
            return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
    }
    if (u->nk == NK_NONE) {
        /* a Linear too wide to multiply is said; integer tensors are not Linear layers */
        if (u->nk_note && numeric_dtype(ct->dtype) && u->si >= 0 && !u->pre && ct->ndim == 2 &&
            u->dim >= 0)
            if (rep_add(V->R, ct->name, u->dim == 0 ? "colwise" : "rowwise", 0, 0, 0, 0, 1,
                        tps_strdup(u->nk_note)))
                return tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
        return TPS_OK;
    }
    char *bias_note = (u->nk == NK_COL || u->nk == NK_ROW) ? check_bias(V, u) : NULL;
    vjob *J;
    TPS_TRY(job_get(V, u, &J)); /* a tensor whose tasks fed nothing (tp ranks elsewhere) */
    TPS_CHECK(collect(V, u, J));
    if (!bias_note && V->is_root) TPS_CHECK(add_bias(V, u, J));
    if (V->is_root) {
        int batch = J->batch;
        size_t out = (size_t)J->out;
        uint64_t terms = J->in + (u->bias >= 0 && !bias_note ? 1 : 0);
        cmp_t c = {0, 0, 0, 0};
        compare(&c, J->ysh, J->yref, J->embed ? NULL : J->sabs, (size_t)batch * out, 1, 1, terms,
                V->tp);
        int ok = c.wrong == 0 && !bias_note;
        char *note = bias_note ? bias_note : NULL;
        bias_note = NULL;
        if (!note && c.wrong)
            note = tps_asprintf("%llu of %llu outputs off by more than the tolerance",
                                (unsigned long long)c.wrong, (unsigned long long)c.total);
        if (!note && ct->derived_from)
            note = tps_asprintf("reference weight: the source's %s", ct->derived_from);
        if (rep_add(V->R, ct->name, nk_kind(u->nk), c.err, c.tol, c.wrong, c.total, ok, note))
            rc = tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
        if (!rc && blk) {
            cmp_t cb = {0, 0, 0, 0};
            compare(&cb, J->ysh + (size_t)batch * out, J->yref + (size_t)batch * out,
                    J->sabs + (size_t)batch * out, (size_t)batch * out, 1, 1, terms, V->tp);
            char *bn =
                cb.wrong ? tps_asprintf("%llu of %llu outputs of the sharded block off by "
                                        "more than the tolerance",
                                        (unsigned long long)cb.wrong, (unsigned long long)cb.total)
                         : NULL;
            if (rep_add(V->R, blk->name, blk->kind == BLK_MLP ? "mlp" : "attn", cb.err, cb.tol,
                        cb.wrong, cb.total, cb.wrong == 0, bn))
                rc = tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory");
        }
    }
    if (!rc && u->feeds) { /* hand the outputs to the block */
        vblock *b = u->feeds;
        b->keep_sh[u->feed_slot] = J->ysh;
        J->ysh = NULL;
        if (--b->pending == 0) {
            rc = block_feed(V, b);
            atomic_store_explicit(&b->ready, rc ? -1 : 1, memory_order_release);
        }
    }
out:
    free(bias_note);
    job_free(V, u->job);
    u->job = NULL;
    if (blk) block_release(V, blk);
    return rc;
}

/* Finalizes every finished tensor that is next in queue order. */
static void drain(vctx *V)
{
    pthread_mutex_lock(&V->fin_mu);
    while (V->next_final < V->nu && atomic_load(&V->order[V->next_final]->done)) {
        if (atomic_load(&V->err)) break;
        tps_err rc = finalize(V, V->order[V->next_final]);
        if (rc) set_err(V, rc);
        V->next_final++;
    }
    pthread_mutex_unlock(&V->fin_mu);
}

static vunit *unit_of_task(vctx *V, uint64_t t)
{
    size_t a = 0, b = V->nu;
    while (b - a > 1) {
        size_t m = a + (b - a) / 2;
        if (V->order[m]->task0 <= t)
            a = m;
        else
            b = m;
    }
    return V->order[a];
}

static void work(vctx *V)
{
    tbuf tb = {0};
    /* Source rows go to the GPU from pinned memory. On one GPU a rank's rows
     * that equal them are not uploaded again (tps_gpu_job_rows_ref), so its
     * buffer stays pageable (pinning costs); with NCCL every rank off the
     * reference GPU uploads its own. */
    tb.pin_src = V->gpu != NULL;
    tb.pin_sh = V->gpu != NULL && V->backend == TPS_BACKEND_NCCL;
    tb.same = malloc((size_t)V->tp);
    if (!tb.same) {
        set_err(V, tps_fail(V->ctx, TPS_E_NOMEM, "verify: out of memory"));
        return;
    }
    int slot = 0;
#ifdef _OPENMP
    slot = omp_get_thread_num();
#endif
    for (;;) {
        if (atomic_load(&V->err)) break;
        if (V->ctx->interrupted) {
            set_err(V, tps_fail(V->ctx, TPS_E_INTERRUPTED, "verify: interrupted"));
            break;
        }
        uint64_t t = atomic_fetch_add(&V->next, 1);
        if (t >= V->ntasks) break;
        vunit *u = unit_of_task(V, t);
        tps_err rc = run_task(V, u, t - u->task0, &tb, slot);
        /* the task's GEMMs must be done before its unit can be finished */
        if (!rc && V->gpu) rc = tps_gpu_slot_sync(V->ctx, V->gpu, slot);
        if (rc) {
            set_err(V, rc);
            break;
        }
        if (atomic_fetch_sub(&u->left, 1) == 1) {
            atomic_store(&u->done, 1);
            drain(V);
        }
        if (slot == 0 && V->ctx->progress)
            V->ctx->progress(V->ctx->progress_user, atomic_load(&V->bytes), V->total_bytes,
                             u->ct->name);
    }
    if (tb.pin_src)
        tps_gpu_host_free(V->gpu, tb.src);
    else
        free(tb.src);
    if (tb.pin_sh)
        tps_gpu_host_free(V->gpu, tb.sh);
    else
        free(tb.sh);
    free(tb.cmp);
    free(tb.same);
    free(tb.w);
    free(tb.conv);
}

/* ------------------------------------------------------------------ entry */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void vctx_free(vctx *V)
{
    for (size_t i = 0; i < V->nu; i++) {
        vunit *u = &V->u[i];
        job_free(V, u->job);
        free(u->segc);
        free(u->crcpre);
        free(u->piece);
        free(u->lo);
        free(u->len);
        free(u->diff);
        free(u->first);
        free(u->slot_rank);
        free(u->crcs);
        free(u->crclen);
        free(u->pre);
        free(u->nk_note);
        pthread_mutex_destroy(&u->mu);
    }
    for (size_t i = 0; i < V->nblk; i++) {
        block_release(V, &V->blk[i]);
        free(V->blk[i].name);
    }
    free(V->blk);
    free(V->u);
    free(V->unit_of);
    free(V->order);
    free(V->local);
    tps_comm_free(V->comm);
    if (V->gpu) {
        char st[512];
        tps_gpu_stats(V->gpu, st, sizeof st);
        tps_log(V->ctx, TPS_LOG_INFO, "verify: %s", st);
        tps_gpu_close(V->gpu);
    }
    tps_ckpt_free(V->src);
    if (!V->lay) tps_quant_free(V->q);
    tps_layout_free(V->lay);
    tps_plan_free(V->plan);
    tps_layout_spec_free(V->spec);
    free(V->lay_piece_rt);
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
    tps_style *st = tps_xcalloc(ck->n ? ck->n : 1, sizeof *st);
    if (!st) return tps_fail(ctx, TPS_E_NOMEM, "verify: out of memory");
    size_t nse = 0;
    style_ent *se = style_index(ck, &nse);
    for (size_t i = 0; i < ck->n; i++) {
        const char *sn = style_of(se, nse, ck->t[i].name);
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
    TPS_CHECK(tps_layout_from_styles(ctx, ck, V->plan, V->spec, V->tp, st, &V->lay));
    TPS_FAIL_IF(V->lay->rejected, ctx, TPS_E_MISMATCH,
                "%s: layout %s would not write this model at tp %d: %s", ck->path,
                V->spec->name, V->tp, V->lay->rejected);
    V->lay_piece_rt = tps_xmalloc((V->lay->npieces ? V->lay->npieces : 1) * sizeof(int));
    TPS_FAIL_IF(!V->lay_piece_rt, ctx, TPS_E_NOMEM, "verify: out of memory");
    for (size_t k = 0; k < V->lay->nrt; k++)
        for (size_t j = 0; j < V->lay->rt[k].npieces; j++)
            V->lay_piece_rt[V->lay->rt[k].piece0 + j] = (int)k;
out:
    free(se);
    free(st);
    return rc;
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
    style_ent *se = NULL;
    size_t nse = 0;
    tps_verify_report *R = calloc(1, sizeof *R);
    if (!R) {
        rc = tps_fail(ctx, TPS_E_NOMEM, "verify: out of memory");
        goto out;
    }
    R->ok = 1;
    V->R = R;
    TPS_CHECK(tps_ckpt_open(ctx, o->dir, &V->ck));
    TPS_FAIL_IF(
        tps_ckpt_kind(V->ck) != TPS_SRC_SHARDED, ctx, TPS_E_ARG,
        "%s: not a tpshard output directory (no %s): verify takes what `tpshard split` wrote",
        o->dir, TPS_MANIFEST);
    V->tp = V->ck->tp;
    TPS_FAIL_IF(V->tp < 1, ctx, TPS_E_FORMAT, "%s: the manifest gives tp %d", o->dir, V->tp);
    if (V->ck->layout_target) TPS_CHECK(expect_layout(V));
    /* FP8 weights: the products dequantize them (the layout has read it already) */
    if (V->lay) V->q = V->lay->q;
    else TPS_CHECK(tps_quant_open(ctx, V->ck, &V->q));
    if (o->source) TPS_CHECK(tps_ckpt_open(ctx, o->source, &V->src));
    int nth = tps_threads(ctx);
    if (nth < 1) nth = 1;
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

    /* the tensors to check */
    size_t nt = V->ck->n;
    V->u = calloc(nt ? nt : 1, sizeof *V->u);
    V->unit_of = malloc(sizeof(int) * (nt ? nt : 1));
    TPS_FAIL_IF(!V->u || !V->unit_of, ctx, TPS_E_NOMEM, "verify: out of memory");
    for (size_t i = 0; i < nt; i++) {
        V->unit_of[i] = -1;
        if (o->tensors_glob && fnmatch(o->tensors_glob, V->ck->t[i].name, 0) != 0) continue;
        vunit *u = &V->u[V->nu];
        u->t = i;
        u->ct = &V->ck->t[i];
        V->unit_of[i] = (int)V->nu++;
        TPS_CHECK(analyze_unit(V, u));
    }
    TPS_FAIL_IF(o->tensors_glob && V->nu == 0, ctx, TPS_E_ARG,
                "verify: --tensors '%s' matches no tensor in %s", o->tensors_glob, o->dir);
    se = style_index(V->ck, &nse);
    for (size_t i = 0; i < V->nu; i++) classify(V, &V->u[i], se, nse);
    TPS_CHECK(find_blocks(V));
    TPS_CHECK(build_order(V));
    for (size_t i = 0; i < V->nu; i++) {
        const vunit *u = &V->u[i];
        for (int r = 0; r < u->nslot; r++)
            if (V->local[u->slot_rank[r]] && u->piece[r] >= 0)
                V->total_bytes += slot_piece(u, r)->nbytes;
    }
    if (!V->src)
        tps_log(ctx, TPS_LOG_INFO,
                "verify: no --source: checking CRC32s against the manifest; the "
                "numeric checks need --source MODEL");

    if (V->nu) {
        /* GPU slots are per thread: keep the team at the size given to the backend */
#ifdef _OPENMP
#pragma omp parallel num_threads(nth)
#endif
        work(V);
        drain(V);
    }
    if (atomic_load(&V->err)) {
        rc = V->rc ? V->rc : TPS_E_INTERRUPTED;
        goto out;
    }
    TPS_FAIL_IF(V->next_final != V->nu, ctx, TPS_E_IO, "verify: %zu tensors left unfinished",
                V->nu - V->next_final);
    /* a serving layout's other bytes: zero padding, the engine's constants */
    if (V->ck->nrts && !o->tensors_glob) {
        size_t nz = 0;
        for (size_t k = 0; k < V->ck->nrts; k++)
            for (size_t j = 0; j < V->ck->rts[k].nfills; j++)
                nz += V->ck->rts[k].fills[j].kind != TPS_FILL_SOURCE;
        tps_err fe = tps_check_fills(ctx, V->ck);
        TPS_FAIL_IF(fe && fe != TPS_E_MISMATCH, ctx, fe, "%s", tps_ctx_errmsg(ctx));
        TPS_FAIL_IF(rep_add(R, "padding and constants", "padding", 0, 0, fe ? 1 : 0, nz, !fe,
                            fe ? tps_strdup(tps_ctx_errmsg(ctx)) : NULL),
                    ctx, TPS_E_NOMEM, "verify: out of memory");
    }
    /* source tensors the shards lack */
    if (V->src) {
        for (size_t i = 0; i < V->src->n; i++) {
            const char *nm = V->src->t[i].name;
            if (o->tensors_glob && fnmatch(o->tensors_glob, nm, 0) != 0) continue;
            if (tps_ckpt_find(V->ck, nm) >= 0) continue;
            TPS_FAIL_IF(rep_add(R, nm, "reconstruct", 0, 0, V->src->t[i].nbytes,
                                V->src->t[i].nbytes, 0,
                                tps_strdup("in the source but missing from the shards")),
                        ctx, TPS_E_NOMEM, "verify: out of memory");
        }
    }
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
    free(se);
    vctx_free(V);
    tps_verify_report_free(R);
    return rc;
}
