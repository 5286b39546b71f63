/* internal.h - what the lib/ modules share. Not installed. */
#ifndef TPS_INTERNAL_H
#define TPS_INTERNAL_H

#include "tpshard.h"

#include <cJSON.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>

/* ------------------------------------------------------------------ ctx and errors */

struct tps_ctx {
    char msg[2048];
    tps_log_fn log;
    void *log_user;
    tps_progress_fn progress;
    void *progress_user;
    int threads;
    volatile sig_atomic_t interrupted;
};

/* Records "fmt..." as the ctx's detail and returns code. Thread-safe. */
tps_err tps_fail(tps_ctx *ctx, tps_err code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void tps_log(tps_ctx *ctx, tps_log_level lvl, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The same, of any length (a line naming many tensors). */
void tps_log_long(tps_ctx *ctx, tps_log_level lvl, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int tps_threads(const tps_ctx *ctx);

#define TPS_TRY(expr)                 \
    do {                              \
        tps_err e_ = (expr);          \
        if (e_ != TPS_OK) return e_;  \
    } while (0)
/* goto-out variant: needs `tps_err rc` and an `out:` label. */
#define TPS_CHECK(expr)               \
    do {                              \
        rc = (expr);                  \
        if (rc != TPS_OK) goto out;   \
    } while (0)
#define TPS_FAIL_IF(cond, ...)                      \
    do {                                            \
        if (cond) { rc = tps_fail(__VA_ARGS__); goto out; } \
    } while (0)

void *tps_xmalloc(size_t n);           /* NULL on failure (never aborts) */
void *tps_xcalloc(size_t n, size_t m);
char *tps_strdup(const char *s);
char *tps_asprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int tps_mul_ovf(uint64_t a, uint64_t b, uint64_t *out); /* 1 on overflow */

/* ------------------------------------------------------------------ files */

/* Whole small file into memory (NUL-terminated), bounded by max. */
tps_err tps_read_file(tps_ctx *ctx, const char *path, size_t max, char **buf, size_t *len);
/* A text file to scan front to back, perhaps more than once (a manifest of
 * 151k rank tensors is 25 MB). At tps_text_map_min bytes and more it is
 * mapped, and while it is open on this thread the scanners' calls to
 * tps_text_behind(p) let the pages behind p go from RSS (a private mapping
 * faults them back in from the file when read again); smaller files are
 * read whole. p is not NUL-terminated: use len. */
typedef struct {
    char *p;
    size_t len;
    int mapped;
    const char *done; /* mapped: the pages before it have been let go */
} tps_text;
extern size_t tps_text_map_min;
extern void (*tps_text_mapped_hook)(const char *path); /* tests: called once mapped */
tps_err tps_text_open(tps_ctx *ctx, const char *path, size_t max, tps_text *t);
void tps_text_close(tps_text *t);
void tps_text_behind(const char *p);
/* The whole pages of [b, e) of the open mapped text let go (read once and
 * not again soon: a manifest's head, copied out to be parsed). */
void tps_text_release(const char *b, const char *e);
/* pread loop; short file -> TPS_E_FORMAT "truncated". */
tps_err tps_pread_full(tps_ctx *ctx, int fd, const char *path, void *buf, size_t len, uint64_t off);
tps_err tps_pwrite_full(tps_ctx *ctx, int fd, const char *path, const void *buf, size_t len,
                        uint64_t off);
struct iovec;
tps_err tps_pwritev_full(tps_ctx *ctx, int fd, const char *path, struct iovec *iov, int n,
                         uint64_t off);
/* Writes text to dir/name atomically (tmp, fsync, rename). */
tps_err tps_write_file_atomic(tps_ctx *ctx, const char *path, const void *buf, size_t len);
tps_err tps_copy_file_atomic(tps_ctx *ctx, const char *src, const char *dst);
char *tps_path_join(const char *a, const char *b);
int tps_is_dir(const char *path);
int tps_exists(const char *path);
char *tps_tmp_name(const char *final_path); /* "<dir>/.<base>.tmp.<host>.<pid>" */
/* DIR/.tpshard.writing for a split's whole run (outlock.c): shared by --ranks
 * runs, else exclusive. Its descriptor, -1 unlocked (warned, or *rc set when
 * another split holds it: refused, naming it). */
int tps_out_claim(tps_ctx *ctx, const char *dir, int shared, tps_err *rc);
void tps_out_release(const char *dir, int fd, int shared);
tps_err tps_fsync_dir(tps_ctx *ctx, const char *dir);

/* ------------------------------------------------------------------ kernel copies (kcopy.c) */

/* How an output directory takes runs of a source file's bytes, best first. */
enum { TPS_KC_USER = 0, /* through user space: pwrite from a buffer or a mapping */
       TPS_KC_RANGE = 1, /* copy_file_range, where it is the file system's own copy */
       TPS_KC_CLONE = 2 /* FICLONERANGE for whole blocks, copy_file_range for the ends */ };
typedef struct {
    int mode;      /* TPS_KC_*: lowered, atomically, when the kernel refuses during a run */
    uint32_t blk;  /* the output file system's block size: what clones must be aligned to */
    char fs[32];   /* its name, for messages ("xfs") */
    uint64_t shared; /* bytes cloned (atomic) */
    int native;      /* copy_file_range is the file system's own copy (NFS 4.2, SMB, Ceph) */
    int can_clone;   /* the probe cloned: the output is laid out for shared blocks (also
                      * with --copy, so that --copy changes how bytes move, not which) */
} tps_kcopy;
/* Probes, with a temporary file in out_dir, whether it shares blocks with
 * the file src_fd or copies from it itself (NFS 4.2, SMB, Ceph); plain (--copy) sets
 * TPS_KC_USER. Says what it found at TPS_LOG_INFO (-v). Never fails: at
 * worst TPS_KC_USER. */
void tps_kcopy_probe(tps_ctx *ctx, tps_kcopy *K, int src_fd, const char *out_dir, int plain);
/* Copies len bytes at in_off of in_fd to out_off of out_fd as K->mode says;
 * *done 0 when K says user space or the kernel refused (K lowered): the
 * caller writes the bytes itself, perhaps over a part already copied. An
 * error of the copy (EIO, ENOSPC) names both files. */
tps_err tps_kcopy_range(tps_ctx *ctx, tps_kcopy *K, int in_fd, const char *in_path,
                        uint64_t in_off, int out_fd, const char *out_path, uint64_t out_off,
                        uint64_t len, int *done);
/* Bytes of [in_off, in_off + len) in whole blocks of blk, when out_off
 * stands at the same offset modulo blk (else 0): what a clone shares. */
uint64_t tps_kcopy_shareable(uint64_t in_off, uint64_t out_off, uint64_t len, uint32_t blk);
const char *tps_kcopy_mode_name(int mode); /* "reflink", "copy_file_range", "write" */
/* The file system's name when reading fd through a mapping is unsafe or
 * slow there (NFS, FUSE, Lustre, CIFS/SMB, Ceph, AFS, 9p: a page can vanish
 * or each fault is a round trip), written into name; NULL otherwise. */
const char *tps_fs_unmappable(int fd, char *name, size_t len);

/* ------------------------------------------------------------------ JSON helpers */

/* Parse with a nesting bound; errors name label and the byte position. */
tps_err tps_json_parse(tps_ctx *ctx, const char *label, const char *text, size_t len,
                       cJSON **out);
/* s as a JSON string literal, escaped as serde_json writes it, through put. */
/* Gives the heap's free pages back to the system (glibc: malloc_trim), for a
 * long pass that frees many small blocks between blocks it keeps: without it
 * the holes stay resident (reading a DTensor split's manifest at DeepSeek-V3's
 * size, 30 MB of them). Elsewhere a no-op. */
void tps_heap_release(void);

/* uint64 runs that never move (shapes a table's entries point at), taken
 * from chunks of TPS_U64_CHUNK: far fewer blocks than one a shape. */
#define TPS_U64_CHUNK 8192
typedef struct {
    uint64_t **chunk;
    size_t n, left;
} tps_u64_chunks;
/* n (<= TPS_U64_CHUNK) uninitialized uint64s; NULL out of memory. */
uint64_t *tps_u64_take(tps_u64_chunks *c, size_t n);
void tps_u64_chunks_free(tps_u64_chunks *c); /* and zeroes it */

/* Strings that never move, copied into chunks of TPS_STR_CHUNK (one of its
 * own for a longer string): a name a block is 32 to 64 bytes of malloc, a
 * DeepSeek-V3 checkpoint has 92k of them. */
#define TPS_STR_CHUNK 65536
typedef struct {
    char **chunk;
    size_t n, left;
    char *next;
} tps_str_chunks;
/* A copy of s; NULL out of memory. */
const char *tps_str_keep(tps_str_chunks *c, const char *s);
/* Does s lie in one of c's chunks (the first TPS_STR_CHUNK bytes of it)? */
int tps_str_chunks_has(const tps_str_chunks *c, const char *s);
void tps_str_chunks_free(tps_str_chunks *c); /* and zeroes it */

/* A growing NUL-terminated text; oom set (and nothing more kept) when an
 * allocation fails. Streamed (out set): the text goes to out in pieces of
 * about TPS_SB_PIECE bytes as it grows instead of all being kept (a DTensor
 * rank file's header is 22 MB at DeepSeek-V3's size); out returning nonzero
 * sets failed and drops the rest. total: every byte put so far (streamed
 * or not). esc: puts are escaped as inside a JSON string literal (a value
 * written into one piece by piece). */
#define TPS_SB_PIECE (1u << 20)
typedef struct {
    char *p;
    size_t len, cap;
    int oom;
    int (*out)(void *u, const char *p, size_t n);
    void *out_u;
    int failed;
    int esc;
    uint64_t total;
} tps_sbuf;
void tps_sb_put(tps_sbuf *b, const char *s, size_t n);
void tps_sb_puts(tps_sbuf *b, const char *s);
void tps_sb_sink(void *user, const char *p, size_t n); /* tps_json_quote's put */
/* Streamed: what is left goes to out (0, or out's nonzero). */
int tps_sb_flush(tps_sbuf *b);
/* A discarding out: a streamed tps_sbuf that only counts (total). */
int tps_sb_discard(void *u, const char *p, size_t n);
void tps_json_quote(const char *s, void (*put)(void *user, const char *p, size_t n), void *user);
/* A streamed tps_sbuf's out writing to fd from off on (path names it in
 * errors, rc keeps the first), the CRC32 of what it wrote in crc. */
typedef struct {
    tps_ctx *ctx;
    int fd;
    const char *path;
    uint64_t off;
    uint32_t crc;
    tps_err rc;
} tps_fd_out;
int tps_fd_out_write(void *u, const char *p, size_t n);
/* path written as tps_write_file_atomic writes it (a temporary name, fsync,
 * rename; nothing left under either name on failure), its text put by fill
 * into a streamed tps_sbuf: never held whole. */
tps_err tps_write_stream_atomic(tps_ctx *ctx, const char *path,
                                tps_err (*fill)(void *u, tps_sbuf *b), void *u);
/* s[0 .. n) escaped as tps_json_quote escapes it, without the quotes. */
void tps_json_escape(const char *s, size_t n, void (*put)(void *user, const char *p, size_t n),
                     void *user);
/* First duplicate key anywhere in an object's direct children, or NULL. */
const char *tps_json_dup_key(const cJSON *obj);
int tps_utf8_valid(const char *s, size_t len);
/* The checks tps_json_parse makes before cJSON sees a text (nesting, NULs,
 * raw control characters), on a member's text: NULL, or why not. */
const char *tps_json_prescan_span(const char *text, size_t len);
/* Config field: top level first, then under text_config. NULL = absent. JSON
 * null counts as absent. */
const cJSON *tps_config_get(const cJSON *config, const char *field);
/* config.c: fills, in place, the fields config.json lacks as transformers'
 * config class for its model type does (other names, then defaults). */
tps_err tps_config_resolve(tps_ctx *ctx, cJSON *config);
/* 1 when tps_config_resolve filled field from a default. */
int tps_config_defaulted(const cJSON *config, const char *field);
/* The other name transformers writes field under, or NULL. */
const char *tps_config_alias(const char *field);
/* Owned "lacks FIELD (... ALIAS): add it", for "config.json %s". */
char *tps_config_lacks(const char *field);

/* ------------------------------------------------------------------ layers (layers.c) */

/* A config read layer by layer: per_layer_config overrides, else the older
 * Gemma4 fields for full-attention layers, else the config's own fields. */
typedef struct {
    const cJSON *config;
    int n;                /* layers: num_hidden_layers, else layer_types' length; 0 unknown */
    const cJSON *types;   /* layer_types, or NULL */
    const cJSON **over;   /* [n]: layer i's per_layer_config entry, or NULL */
    int has_plc;          /* per_layer_config is present (the older fields then do not apply) */
    int old_hd, old_kv;   /* global_head_dim / num_global_key_value_heads apply */
} tps_layers;

/* Validates per_layer_config (TPS_E_CONFIG naming label and the key). Borrows config. */
tps_err tps_layers_open(tps_ctx *ctx, const cJSON *config, const char *label, tps_layers *ly);
void tps_layers_close(tps_layers *ly);
const char *tps_layers_type(const tps_layers *ly, int i); /* layer_types[i] or NULL */
/* field at layer i; *from: NULL for the config's own field, else "per_layer_config" or the
 * older field it came from. */
const cJSON *tps_layers_get(const tps_layers *ly, int i, const char *field, const char **from);
/* 1 when some layer takes field from somewhere other than the config's own field. */
int tps_layers_vary(const tps_layers *ly, const char *field);
/* Layer i's attention heads, KV heads and head size (-1 unknown), with transformers'
 * defaults; from[3]: where each came from, as tps_layers_get says. */
void tps_layers_geometry(const tps_layers *ly, int i, int64_t *heads, int64_t *kv, int64_t *hd,
                         const char **from);

/* ------------------------------------------------------------------ crc */

/* CRC32 as zlib's crc32_z computes it, faster where the CPU allows. */
uint32_t tps_crc32(uint32_t crc, const void *data, size_t len);
uint32_t tps_crc32_zlib(uint32_t crc, const void *data, size_t len); /* reference */
/* One implementation: 0 zlib, 1 PCLMULQDQ, 2 VPCLMULQDQ (tests). */
uint32_t tps_crc32_impl(int impl, uint32_t crc, const void *data, size_t len);

/* ------------------------------------------------------------------ guard */

/* Reads of a mapped file inside a guard turn the SIGBUS of a truncated (or
 * unreadable) page in [lo, hi) into a return from sigsetjmp(jb, 1) != 0:
 *
 *     tps_guard g = {.lo = p, .hi = p + n};
 *     if (sigsetjmp(g.jb, 1)) { tps_guard_leave(); ...the source changed... }
 *     tps_guard_enter(&g);
 *     ...read p[0..n)...
 *     tps_guard_leave();
 *
 * (savemask 1: an action installed over ours may call us with its own mask
 * in force.) The SIGBUS handler is installed while at least one hold is
 * taken; other SIGBUS signals are handled as the action it replaced would
 * have handled them. A thread must not have SIGBUS blocked while it reads:
 * a blocked fault kills whatever the handler. */
typedef struct tps_guard {
    sigjmp_buf jb;
    const void *lo, *hi;
    struct tps_guard *prev; /* the guard this one is inside (set by enter) */
} tps_guard;
int tps_guard_hold(void); /* 0 when the handler cannot be installed */
void tps_guard_release(void);
void tps_guard_enter(tps_guard *g);
void tps_guard_leave(void);

/* ------------------------------------------------------------------ dtype */

/* One element of value v in dtype d (F32, F16, BF16: round to nearest even)
 * into out (little-endian); others get zeros. */
void tps_encode_value(tps_dtype d, double v, unsigned char *out);
/* Converts n elements of dtype d at src (unaligned ok) to f32. 0 ok, -1 not a float dtype. */
int tps_to_f32(tps_dtype d, const void *src, float *dst, size_t n);
/* Serving layouts write some tensors (quantization scales) widened to F32,
 * as the engine holds them. tps_cast_ok: d widens to F32 and back exactly
 * (F32, BF16, F16, F8_E8M0). tps_widen_f32: n elements of d at src to F32
 * bytes (little-endian) at dst. tps_narrow_f32: back; -1 and the index of
 * the first element that is not a widened d in *bad (bytes that did not come
 * from a widening: a rank file changed after the split). */
int tps_cast_ok(tps_dtype d);
void tps_widen_f32(tps_dtype d, const void *src, void *dst, size_t n);
/* out = the transpose of in: in has `rows` rows of `cols` elements of es
 * bytes, `ist` bytes apart; out gets `cols` rows of `rows`, `ost` apart
 * (transposed pieces: gpt-oss's BF16 experts). 2-byte elements go in 8 x 8
 * SSE2 blocks where the machine has them. */
void tps_transpose(void *out, size_t ost, const void *in, size_t ist, uint64_t rows,
                   uint64_t cols, size_t es);
int tps_narrow_f32(tps_dtype d, const void *src, void *dst, size_t n, size_t *bad);

/* ------------------------------------------------------------------ safetensors */

typedef struct {
    char *name;
    tps_dtype dtype;
    int ndim;
    const uint64_t *shape; /* ndim of them, in the header's shape chunks */
    uint64_t begin;  /* relative to the data section; its end: tps_st_info_end (the
                      * parse refused data_offsets whose span its dtype and shape do not
                      * make, so nothing else need be kept) */
} tps_st_tensor_info; /* 32 bytes: a DTensor split's 8 rank files hold 736k at DeepSeek-V3's size */

struct tps_st {
    char *path;
    uint64_t file_size;
    uint64_t data_start;
    tps_st_tensor_info *t; /* sorted by begin */
    size_t n;
    char **mkeys, **mvals;
    size_t nmeta;
    char *raw;      /* the header's N bytes as they are in the file */
    size_t raw_len;
    tps_u64_chunks shapes; /* the tensors' shapes */
    int names_kept; /* the tensors' names are borrowed (a sharded checkpoint's string
                     * set holds them), not freed with it */
};

/* Parses a header buffer (the N bytes after the length). label names the file. */
tps_err tps_st_parse_header(tps_ctx *ctx, const char *label, const char *json, size_t n,
                            uint64_t file_size, tps_st **out);
/* The same, adopting raw (malloc'd, n + 1 bytes, NUL-terminated) as st->raw. */
tps_err tps_st_parse_header_owned(tps_ctx *ctx, const char *label, char *raw, size_t n,
                                  uint64_t file_size, tps_st **out);
uint64_t tps_nbytes(tps_dtype d, const uint64_t *shape, int ndim, int *ovf, int *misaligned);
/* A header tensor's bytes (its dtype and shape's, which its data_offsets span)
 * and the end of its data_offsets. */
static inline uint64_t tps_st_info_nbytes(const tps_st_tensor_info *t)
{
    int ovf, mis;
    return tps_nbytes(t->dtype, t->shape, t->ndim, &ovf, &mis);
}
static inline uint64_t tps_st_info_end(const tps_st_tensor_info *t)
{
    return t->begin + tps_st_info_nbytes(t);
}

/* Writer: describe the tensors, get the header bytes and every tensor's
 * offset in reference order (dtype by descending alignment, then name). */
typedef struct {
    const char *name;
    tps_dtype dtype;
    int ndim;
    const uint64_t *shape;
    uint64_t nbytes;
    uint64_t offset; /* out: relative to data section */
    size_t order;    /* out: position in file order */
} tps_st_entry;

/* Frees the header's tensor table (st->n becomes 0); the rest (data_start,
 * metadata, raw) stays. */
void tps_st_drop_table(tps_st *st);
/* Frees the header's __metadata__ (a rank file's: nothing reads it once the
 * file is part of a sharded checkpoint; DTensor placements are 2 MB a rank
 * for an MoE of 18,867 tensors). */
void tps_st_drop_meta(tps_st *st);

/* meta: NULL-terminated key/value pairs (keys[i], vals[i]), may be NULL.
 * Returns the full prefix (8-byte length + padded header) in *hdr. */
tps_err tps_st_build_header(tps_ctx *ctx, tps_st_entry *e, size_t n, const char *const *mkeys,
                            const char *const *mvals, size_t nmeta, char **hdr, size_t *hdr_len);
/* extra more trailing spaces in a header tps_st_build_header made (valid
 * safetensors: the JSON may end in spaces), its length prefix rewritten. */
tps_err tps_st_pad_header(tps_ctx *ctx, char **hdr, size_t *hdr_len, size_t extra);
/* The header tps_st_build_header then tps_st_pad_header(extra) make, put
 * through b (a streamed one: nothing held): its 8-byte length prefix says N
 * (the caller's, from a first run that counted), a metadata value NULL in
 * mvals is written by value(u, b) (b->esc set), and *hdr_len is its length,
 * prefix and padding included. Sets e's offset and order. b->oom or
 * b->failed: out of memory, or out failed (the caller says why). */
tps_err tps_st_emit_header(tps_ctx *ctx, tps_st_entry *e, size_t n, const char *const *mkeys,
                           const char *const *mvals, size_t nmeta,
                           void (*value)(void *u, tps_sbuf *b), void *u, size_t extra,
                           uint64_t N, tps_sbuf *b, size_t *hdr_len);

/* A refined scale grid (vLLM's FP8 experts, refine_fp8_moe_block_shape):
 * the region's elements written rep_n times along rows and rep_k times
 * along columns, F32, and along the region's dim only `out` of the
 * repeated rows (dim 0) or columns (dim 1) from the `skip`th. Readers undo
 * it (every copy must agree) and see the region's own bytes. */
typedef struct {
    uint32_t rep_n, rep_k;
    uint64_t skip, out;
    /* 1 (rep_n 0): a transposed piece instead. The region, read as its own
     * shape (the source's, its dim cut to [lo, hi)), is stored with its last
     * two dims swapped: [.., A, B] as [.., B, A], in the source's dtype
     * (vLLM's BF16 gpt-oss experts: each expert's rank slice transposed).
     * Readers undo it and see the region's own bytes. */
    uint64_t tr;
} tps_xform;

/* The F32 grid a refined piece of a rows x cols region (cut along dim)
 * holds: *orows x *ocols, its element (i, j) the region's
 * ((i + *sr) / rep_n, (j + *sc) / rep_k). */
static inline void tps_xform_grid(const tps_xform *x, int dim, uint64_t rows, uint64_t cols,
                                  uint64_t *orows, uint64_t *ocols, uint64_t *sr, uint64_t *sc)
{
    *orows = dim == 0 ? x->out : rows * x->rep_n;
    *ocols = dim == 1 ? x->out : cols * x->rep_k;
    *sr = dim == 0 ? x->skip : 0;
    *sc = dim == 1 ? x->skip : 0;
}

/* ------------------------------------------------------------------ checkpoint */

typedef struct {
    int file;         /* index into ck->files */
    uint32_t crc;     /* sharded dirs: manifest CRC32; else 0 */
    uint16_t rank;    /* sharded dirs: the rank it came from (tp x pp <= 65536); else 0 */
    /* a refined grid (tps_xform), F32, cut along the tensor's dim; reads
     * undo it. rep_n 0: none */
    uint16_t rep_n, rep_k;
    uint8_t stored;   /* the tps_dtype its bytes are in: the tensor's, or F32 when a
                       * serving layout widened it (scales); reads narrow it back */
    uint8_t has_crc : 1;
    uint8_t tr : 1;   /* transposed (tps_xform.tr): its region's last two dims swapped
                       * in the file; reads undo it */
    uint64_t off;     /* absolute offset of the piece's bytes in that file */
    uint32_t lo, hi;  /* range along the tensor's dim (dim >= 0; a dim is under 2^32
                       * elements: split refuses longer, the reader too) */
    uint64_t nbytes;
    const char *holder; /* sharded dirs: the rank tensor holding it (a serving
                         * layout's fused or padded tensor), or the tensor's own name */
    uint64_t at;        /* its byte offset in that rank tensor */
    uint64_t fbytes;    /* its bytes in the file: nbytes, or more when widened */
    union {
        struct {
            uint32_t xskip, xout; /* refined (rep_n) */
        };
        /* not refined: 0, or its bytes lie in runs of `run` bytes, `stride`
         * apart in the file from off on (a piece concatenated along its
         * rank tensor's last dim: vLLM's fused GPTQ qweight) */
        struct {
            uint32_t run, stride;
        };
    };
} tps_piece; /* 72 bytes: 723k of them for a DeepSeek-V3-shaped vllm split at tp 8 */

/* A serving layout's rank tensor that is not one piece of a source tensor
 * (manifest rank_tensors): what each of its bytes is. */
typedef enum { TPS_FILL_SOURCE = 0, TPS_FILL_ZEROS, TPS_FILL_VALUE } tps_fill_kind;
typedef struct {
    uint64_t at, nbytes;
    uint64_t run, stride; /* 0, or its bytes are runs of `run`, `stride` apart from at on */
    union {
        const char *source; /* SOURCE: the source tensor */
        double value;       /* VALUE */
    };
    tps_fill_kind kind;
} tps_fill;
/* A rank tensor's fill as kept: a source piece the manifest's tensors list at
 * that place in that rank tensor (the tps_piece itself, matched when the
 * manifest was read: 8 bytes for each of the 750k of a DeepSeek-V3-shaped
 * split at tp 8, not a 48-byte tps_fill), or (odd) 1 + 2 x its index in the
 * rank tensor's xfills: zeros, a constant, a source piece no tensor entry
 * matches (check says so) or one of an absent rank. */
typedef uintptr_t tps_fillref;
typedef struct {
    const char *name;
    int rank;
    int file;          /* index into ck->files, -1 when the rank is absent */
    tps_dtype dtype;
    uint64_t off;      /* absolute offset of its bytes in that file */
    uint64_t nbytes;
    tps_fillref *fills; /* in the manifest's order (by at, when well formed) */
    size_t nfills;
    tps_fill *xfills;   /* the fills no piece stands for */
    size_t nxfills;
} tps_crtensor;

/* Fill j of rank tensor rt: its piece (NULL: none), and as a tps_fill in
 * *out (a piece's: its at, file bytes, run and stride; source NULL). */
static inline const tps_piece *tps_crt_fill(const tps_crtensor *rt, size_t j, tps_fill *out)
{
    tps_fillref f = rt->fills[j];
    if (f & 1) {
        *out = rt->xfills[f >> 1];
        return NULL;
    }
    const tps_piece *pc = (const tps_piece *)f;
    uint64_t run = pc->rep_n ? 0 : pc->run;
    *out = (tps_fill){.at = pc->at, .nbytes = pc->fbytes, .run = run,
                      .stride = run ? pc->stride : 0, .source = NULL, .kind = TPS_FILL_SOURCE};
    return pc;
}

/* name and origin are borrowed from strings the checkpoint keeps anyway (the
 * file's header table, the manifest, the origins list); pieces come from the
 * checkpoint's pools. A million-tensor header needs no copy of either. */
typedef struct {
    const char *name;
    tps_dtype dtype;
    int ndim;
    /* ndim of them, in ck->shapes (an inline TPS_MAX_DIMS array was 128
     * of this struct's 216 bytes, 11 MB at DeepSeek-V3's 92k tensors) */
    const uint64_t *shape; /* zeros follow it to TPS_SHAPE_PAD dims */
    uint64_t nbytes;
    int dim;            /* pieces concatenated along dim; -1: each piece is the whole tensor */
    int npieces;
    tps_piece *pieces;  /* dim >= 0: sorted by lo; dim < 0: one per rank (piece 0 is read) */
    int nreplicas;      /* dim >= 0, serving layouts: copies of primary pieces on other ranks */
    int nlisted;        /* sharded dirs: the manifest's ranks[] entries, whether the rank is
                         * here or not (npieces counts the present ones) */
    tps_piece *replicas;
    const char *origin; /* the original file name it belongs to (merge) */
    const char *placement; /* sharded dirs: "Replicate", "Shard(0)"... (kept once by the
                            * checkpoint's string set), else NULL */
    /* An untied head (--untie): the embedding whose bytes it holds, or NULL.
     * Not part of the original files: merge leaves it out. */
    const char *derived_from;
    const char *style;  /* sharded dirs: the plan style the manifest records, or NULL */
} tps_ctensor;

/* A checkpoint tensor's kept shape is followed by zeros up to
 * this many dims, as the inline TPS_MAX_DIMS arrays they replace were: a
 * tensor's shape[1] reads 0 for a vector, shape[0] for a scalar. */
#define TPS_SHAPE_PAD 4

/* t's shape in a TPS_MAX_DIMS array (the dims past its ndim 0), to edit. */
static inline void tps_shape_get(uint64_t out[TPS_MAX_DIMS], const tps_ctensor *t)
{
    for (int d = 0; d < TPS_MAX_DIMS; d++) out[d] = d < t->ndim ? t->shape[d] : 0;
}

typedef struct {
    char *name;  /* basename */
    char *path;
    int fd;
    uint64_t size;
    int64_t mtime_s, mtime_ns; /* at open: tps_ckpt_recheck compares */
    uint32_t raw_crc; /* of st->raw while tps_ckpt_release_headers has let it go */
    struct tps_hsum { uint32_t crc; uint64_t len; int gone; } hsum; /* tps_ckpt_open_lean's */
    tps_st *st;
    int rank;    /* sharded dirs */
    uint32_t *byname; /* sharded dirs: st's tensors (indexes into st->t) sorted by name */
} tps_cfile;

struct tps_ckpt {
    tps_src_kind kind;
    uint64_t seq;    /* this open's number in the process (reads' caches key on it) */
    char *path, *dir, *stem;
    int hub;         /* from the Hugging Face cache: stem is the repo's name */
    tps_cfile *files;
    size_t nfiles;
    tps_ctensor *t; /* sorted by name */
    size_t n;
    cJSON *config;   /* NULL when no config.json */
    cJSON *manifest; /* sharded dirs */
    int tp;          /* sharded dirs */
    int pp;          /* sharded dirs: pipeline stages (1 without pp) */
    int nranks;      /* sharded dirs: tp * pp ranks (workers); rank w is stage w / tp */
    int *stage_first, *stage_layers; /* sharded dirs, pp > 1: the manifest's stages */
    int pad_intermediate; /* sharded dirs: split with --pad-intermediate */
    char **origins;  /* original file names, in order (sharded: from manifest) */
    size_t norigins;
    cJSON *origin_meta; /* {file: {__metadata__}} */
    cJSON *origin_header; /* {file: "the original header text"}: merge restores it verbatim */
    /* norigins of them, once tps_ckpt_release_origin_headers (or
     * tps_ckpt_release_headers) has let the texts go: each text's CRC32 and
     * length, for the provenance checks (gone 0: still in origin_header) */
    struct tps_hsum *origin_hsum;
    int lean; /* tps_ckpt_open_lean: the files' header texts let go as they are read */
    int names_owned; /* not sharded: the tensors' names are ck's (the files' tables let go) */
    char *index_name;   /* "model.safetensors.index.json" when the source had one */
    cJSON *index_meta;  /* the source index's "metadata" object (merge writes it back) */
    unsigned char *rank_present; /* sharded dirs: tp entries, rank file(s) found */
    unsigned char *rank_written; /* sharded dirs: tp entries, the manifest says written */
    int headers_unrecorded;      /* sharded dirs: rank files whose header CRC it lacks */
    char *plan_name;    /* sharded dirs: plan recorded in the manifest */
    const char *plan_text; /* sharded dirs (version 2): the plan's YAML, or NULL */
    const char *layout_name;   /* sharded dirs: "dtensor", "vllm"... (borrowed from the manifest) */
    const char *layout_target; /* NULL for dtensor */
    const char *layout_text;   /* the layout file the split used, or NULL */
    int layout_ep;             /* split --ep: experts whole on one rank each */
    const char *layout_moe;    /* the MoE backend its MXFP4 experts were laid out for, or NULL */
    tps_crtensor *rts;  /* sharded dirs: rank_tensors of the manifest */
    size_t nrts;
    tps_piece **pools;  /* every tensor's pieces live in these */
    size_t npools;
    tps_u64_chunks shapes; /* the tensors' shapes */
    tps_str_chunks strs; /* sharded dirs: the tensors' names and such, kept */
    /* the kept strings, each once (a manifest names a rank tensor or source
     * in every piece: 750k copies of 7k names at DeepSeek-V3's size):
     * open addressing, cap a power of two */
    const char **str_set;
    size_t nstr_set, cap_str_set;
    char *config_text;  /* config.json as read, or NULL */
    char *config_out;   /* untie: the config.json a split writes instead of copying it */
    /* untie (made here, or read from a sharded dir's manifest): the head tensor written from
     * the embedding, and the original config.json that merge restores */
    char *untie_head, *untie_embedding, *untie_config;
    /* sharded dirs: the source tensors the split's layout left out (the manifest's dropped) */
    const cJSON *dropped;
};

/* A sharded directory's rank file f: its tensor of that name, or NULL. */
/* f->byname: f->st's tensors sorted by name, for tps_cfile_find. */
tps_err tps_cfile_index(tps_ctx *ctx, tps_cfile *f);
const tps_st_tensor_info *tps_cfile_find(const tps_cfile *f, const char *name);

/* A sharded checkpoint's rank files' tensor tables and their by-name indexes
 * let go once it is read (the reader matched every piece against them):
 * check and merge work from the pieces alone; verify keeps them, to check
 * each piece against its file's header again. A DTensor split's rank files
 * list every tensor again: 26 MB at DeepSeek-V3's size (92k tensors, tp 8). */
void tps_ckpt_drop_file_tables(tps_ckpt *ck);
/* The original files' header texts let go once the provenance checks have
 * read them: a split directory's (the manifest's copies, which merge would
 * restore: not for merge) or a source's (tps_ckpt_release_headers). 12 MB
 * for DeepSeek-V3's 92k tensors. */
void tps_ckpt_release_origin_headers(tps_ckpt *ck);
/* A sharded checkpoint's kept strings (its tensors' names among them)
 * handed over to *out (to free with tps_str_chunks_free), ck's names then
 * dangling: for a caller about to free ck that keeps some of its names. */
void tps_ckpt_take_strings(tps_ckpt *ck, tps_str_chunks *out);
/* File i's header text read again after tps_ckpt_release_headers let it go
 * (*out malloc'd), refused when its bytes changed since the open. */
tps_err tps_ckpt_file_header(tps_ctx *ctx, const tps_ckpt *ck, size_t i, char **out);

/* Is name a source tensor the split's layout left out (the manifest's dropped[])? */
int tps_ckpt_dropped(const tps_ckpt *ck, const char *name);

/* tps_ckpt_open keeping of its files' header texts only their CRC32s and
 * lengths (struct tps_hsum), each let go once read: for the source verify
 * compares (provenance.c), not for a split or merge, which write them. */
tps_err tps_ckpt_open_lean(tps_ctx *ctx, const char *model, tps_ckpt **out);
/* tps_ckpt_open of a path as it is: no Hugging Face cache lookup (an output
 * directory, not a MODEL). */
tps_err tps_ckpt_open_path(tps_ctx *ctx, const char *path, tps_ckpt **out);
/* locate.c: MODEL as a path, a Hugging Face cache folder or a repo id in the
 * local cache: the path to open, and the repo's name when from the cache. */
tps_err tps_model_locate(tps_ctx *ctx, const char *arg, char **path, char **repo);
/* A file that is surely not safetensors (zip, pickle, JSON, GGUF): 1 and
 * what it is and what to do in msg. */
int tps_sniff(const char *path, const unsigned char *b, size_t got, uint64_t size, char *msg,
              size_t len);
/* The error for a directory with no model in it, naming what it holds. */
tps_err tps_no_model_here(tps_ctx *ctx, const char *dir);
/* The i-th file tps_ckpt_copy_aux may write (*writes: it would, with this
 * config_text); NULL past the last. */
const char *tps_ckpt_aux_file(const tps_ckpt *ck, const char *config_text, size_t i, int *writes);
/* Copies the config and tokenizer files of ck's directory into out_dir;
 * config_text, when not NULL, is written as config.json instead. */
tps_err tps_ckpt_copy_aux(tps_ctx *ctx, const tps_ckpt *ck, const char *out_dir,
                          const char *config_text);
/* config.json text with tie_word_embeddings set to false at the top level and
 * in text_config (inserted where absent), everything else byte for byte.
 * NULL when the text is not a JSON object. Owned. */
char *tps_json_untie_text(const char *text, size_t len);


/* Read from one piece of tensor i: bytes [off, off+len) of that piece. */
tps_err tps_ckpt_read_piece(tps_ctx *ctx, const tps_ckpt *ck, size_t i, int piece, uint64_t off,
                            void *buf, size_t len);
/* A refined replica's rows (vLLM's refined scale grid), read back, equal
 * tensor i's as its primaries hold them; else an error (what appended). */
tps_err tps_ckpt_refined_same(tps_ctx *ctx, const tps_ckpt *ck, size_t i, const tps_piece *pc,
                              const char *what);
/* The same for a piece (or replica) p of tensor t, narrowing widened bytes. */
tps_err tps_ckpt_read_piece_at(tps_ctx *ctx, const tps_ckpt *ck, const tps_ctensor *t,
                               const tps_piece *p, uint64_t off, void *buf, size_t len);
/* Re-checks that every source file still has the size and modification time
 * it had at open. */
tps_err tps_ckpt_recheck(tps_ctx *ctx, const tps_ckpt *ck);
/* split: copy tasks reading fewer bytes use pread even when the source is
 * mapped (256 KiB); tests lower it to reach the mapped path with tiny models. */
extern size_t tps_split_map_min;
/* tps_ckpt_read of whole rows of a tensor cut along a dim reads each
 * piece's slices of them in batches of at most this many bytes (1 MiB);
 * tests lower it to reach several batches with tiny models. */
extern size_t tps_read_rows_batch;

/* Where bytes [off, off+len) of tensor i lie when they are one run of one
 * file: 1 and *file, *foff set; 0 when they span pieces. */
/* How many bytes of tensor i from off on lie back to back in one file (0:
 * none, e.g. a widened piece), and where they start. */
uint64_t tps_ckpt_run(const tps_ckpt *ck, size_t i, uint64_t off, int *file, uint64_t *foff);
int tps_ckpt_locate(const tps_ckpt *ck, size_t i, uint64_t off, uint64_t len, int *file,
                    uint64_t *foff);

/* ------------------------------------------------------------------ plan (lib/plan/) */

typedef enum { TPS_COND_TRUTHY = 0, TPS_COND_FALSY, TPS_COND_EQUALS, TPS_COND_NOT_EQUALS } tps_cond_op;

typedef struct {
    char *field;
    tps_cond_op op;
    cJSON *value;   /* EQUALS: the value compared with (owned) */
    cJSON *dflt;    /* the value assumed when the field is absent, or NULL (owned) */
} tps_cond;

typedef struct {
    char **patterns; /* module paths with '*' components */
    size_t npat;
    tps_style style;
    tps_cond *when;  /* NULL = always */
    char *heads;     /* the per-layer count the sharded dim holds heads of, or NULL */
    int line;
} tps_rule;

typedef enum { TPS_PCHECK_DIVISIBLE = 0, TPS_PCHECK_REJECT_IF } tps_pcheck_kind;

typedef struct {
    tps_pcheck_kind kind;
    char *field;     /* DIVISIBLE: the config count */
    int optional;    /* DIVISIBLE: skip when absent */
    tps_cond cond;   /* REJECT_IF */
    char *reason;    /* why, in words */
    int line;
} tps_pcheck;

/* A tensor that packs several modules' rows (Phi-3's qkv_proj = [q; k; v]):
 * its sections, in order, each with a row count given by an expression of
 * config fields. */
typedef struct {
    char *name;  /* the module it stands for, e.g. "q_proj" */
    char *rows;  /* e.g. "num_key_value_heads * head_dim" */
} tps_section;

typedef struct {
    char **patterns;
    size_t npat;
    tps_section *sec;
    size_t nsec;
    int line;
} tps_packed;

/* A tensor whose dimensions the config fixes (MLA's kv_b_proj: rows
 * num_attention_heads * (qk_nope_head_dim + v_head_dim), columns
 * kv_lora_rank): an expression for its rows, its columns, or both (NULL:
 * not checked). */
typedef struct {
    char **patterns;
    size_t npat;
    char *rows, *cols;
    int line;
} tps_shape;

/* An integer expression of config fields: + - * / ( ), decimal integers and
 * field names (head_dim: config.json's, else hidden_size /
 * num_attention_heads). 0 ok; -1 with the reason in why. Division must be
 * exact. */
int tps_expr_eval(const char *expr, const cJSON *config, uint64_t *out, char *why, size_t whylen);

struct tps_plan {
    char *name, *description, *label;
    char *text; /* the YAML as parsed (a serving layout's manifest keeps it) */
    char **architectures; size_t narch;
    char **model_types; size_t nmt;
    tps_rule *rules; size_t nrules;
    tps_pcheck *checks; size_t nchecks;
    /* untie: module paths of a tied embedding and of the head it stands for */
    char **untie_embedding, **untie_head; size_t nuntie;
    tps_packed *packed; size_t npacked;
    tps_shape *shapes; size_t nshapes;
    /* layers: config count fields whose sum bounds every tensor's layer
     * index (num_hidden_layers, then DeepSeek's MTP layers) */
    char **layers; size_t nlayers;
};

/* The packed rule a tensor's module matches, or NULL. */
const tps_packed *tps_plan_packed(const tps_plan *p, const char *tensor_name);

/* The shapes entry a tensor's module matches, or NULL. */
const tps_shape *tps_plan_shape(const tps_plan *p, const char *tensor_name);

/* Module path of a tensor name: everything before the last '.'. */
/* First rule whose `when` holds and one of whose patterns matches the module
 * path; NULL when none. *pattern gets the pattern that matched. */
const tps_rule *tps_plan_match(const tps_plan *p, const char *tensor_name, const cJSON *config,
                               const char **pattern);
int tps_cond_eval(const tps_cond *c, const cJSON *config); /* 1 true, 0 false */
/* Score how well the plan serves this config: 2 architecture, 1 model_type, 0 no. */
int tps_plan_serves(const tps_plan *p, const cJSON *config);

typedef struct {
    char *name;    /* "num_key_value_heads divisible by tp" */
    int ok;        /* 1 pass, 0 fail, -1 skipped */
    char *detail;  /* "4 % 8 != 0; tp values that work: 1, 2, 4" */
} tps_check_outcome;

/* Runs the plan's checks for tp; config may be NULL (every check skipped,
 * detail says so). *out is an array the caller frees with tps_check_outcomes_free. */
tps_err tps_plan_run_checks(tps_ctx *ctx, const tps_plan *p, const cJSON *config, int tp,
                            tps_check_outcome **out, size_t *n);
void tps_check_outcomes_free(tps_check_outcome *o, size_t n);

/* ------------------------------------------------------------------ layout files (lib/plan/) */

/* How a serving layout splits a tensor (a plan style says it for DTensor). */
typedef enum {
    TPS_SPLIT_PLAN = 0, /* as the plan's style says, with the layout's split rule */
    TPS_SPLIT_REPLICATE,
    TPS_SPLIT_ROWS,     /* dim 0 */
    TPS_SPLIT_COLUMNS,  /* dim 1 */
    TPS_SPLIT_VOCAB,    /* dim 0, padded to the layout's vocab_padding, then evenly */
    TPS_SPLIT_REFUSE,   /* the engine has no place for it */
} tps_split_kind;

typedef struct {
    char *module;  /* leaf module name, e.g. "k_proj" */
    char *heads;   /* config field counting its heads, or NULL: split by rows */
    int replicate; /* fewer heads than ranks: whole heads replicated (else refused) */
    char *rows;    /* config field counting its rows (named in refusals), or NULL */
    /* or: a sibling whose rows stand in for this part when the checkpoint
     * lacks it, on layers of type or_layer_type (NULL: any) when or_when
     * holds (vLLM's Gemma 4 k_eq_v layers: k_proj in the V slot); there the
     * part itself is refused. NULL: none */
    char *or_module, *or_layer_type;
    tps_cond *or_when;
} tps_lpart;

typedef struct {
    char *name;    /* relative to the fused module's parent, e.g. "attn._k_scale" */
    tps_dtype dtype;
    int model_dtype;  /* dtype: model: the dtype the engine serves the model in */
    int ndim;         /* 0 (a scalar) or 1 */
    uint64_t len;     /* ndim 1: its length */
    double value;
    char *quant;      /* only for checkpoints of this quant_method ("none": unquantized) */
    tps_cond *when, *unless;
} tps_lextra;

/* When an engine's fused module has a bias: for the model types listed
 * (none: every one), when `when` holds and `unless` does not. */
typedef struct {
    char **model_types;
    size_t nmt;
    tps_cond *when, *unless;
    int line;
} tps_lbias;

typedef struct {
    char *into;    /* leaf name of the fused module, e.g. "qkv_proj" */
    tps_lpart *parts;
    size_t nparts;
    tps_lextra *extra;
    size_t nextra;
    /* given (has_bias): the parts' biases fuse only when one entry holds,
     * else they are refused; absent: whenever the checkpoint has them */
    tps_lbias *bias;
    size_t nbias;
    int has_bias;
    int whole;     /* split: replicate: every part whole on every rank (else by rows) */
    /* config counts of the last layers: only_last, the entry fuses only in the
     * layers numbered num_hidden_layers - config[only_last] and after;
     * except_last, only in the others (Gemma 4's KV-shared layers). NULL: all */
    char *only_last, *except_last;
    /* the entry applies only when this holds (DeepSeek's fused_qkv_a_proj: a
     * q LoRA); NULL: always. tps_lfuse_applies says. */
    tps_cond *when;
    int line;
} tps_lfuse;
int tps_lfuse_applies(const tps_lfuse *f, const cJSON *config);

typedef struct {
    char **patterns;
    size_t npat;
    char *param;   /* only this parameter ("bias"), or NULL: any */
    tps_cond *when;
    tps_split_kind split;
    char *refuse;  /* instead of a split: the engine cannot hold it, and why */
    int line;
} tps_lrule;

/* Source tensors the engine's load_weights skips: a name holding one of
 * `contains`, or (layers_past) a tensor of a layer numbered at or past the
 * config's count `layers_past` (the MTP layers after num_hidden_layers), for
 * the model types listed (none: every one). */
typedef struct {
    char **contains;
    size_t ncontains;
    char *layers_past; /* config field, or NULL */
    char *layers_extra; /* with layers_past: the config count of the layers after it that the
                         * checkpoint may hold (num_nextn_predict_layers); a tensor of a layer
                         * past both is refused */
    char **model_types;
    size_t nmt;
    char *reason;
    char *only_last; /* with contains: only in the last config[only_last] layers, or NULL */
    int line;
} tps_ldrop;

/* Parameters of the engine's model that a source tensor keeps under its own
 * name: modules matching `patterns`, parameters `params`, for the model
 * types listed (none: every one) when `when` holds. */
typedef struct {
    char **patterns;
    size_t npat;
    char **params;
    size_t nparams;
    char **model_types;
    size_t nmt;
    tps_cond *when;
    int line;
} tps_lkey;

/* Experts stacked the way an engine's fused MoE layer holds them: for each
 * module matching `patterns` (e.g. model.layers.*.mlp.experts) holding
 * experts <module>.<e>.<leaf>.weight, e < config[count], every stack is one
 * rank tensor <module>[.<into>].<name> of all the rank's experts: split rows,
 * [E, nparts * I / tp, H] (each expert's parts' rank rows in turn), or split
 * columns, [E, H, I / tp]. With expert parallelism (split --ep) rank r holds
 * experts [r E / tp, (r + 1) E / tp) whole instead. */
typedef struct {
    char *name;     /* e.g. "w13_weight" */
    char **parts;   /* expert leaf modules, e.g. gate_proj, up_proj */
    size_t nparts;
    int dim;        /* 0: rows, 1: columns */
    int halves;     /* stacked: sections of the part's rows (Gemma 4's gate_up_proj: 2), or 1 */
    /* stacked rows: the part's 2 x I rows are gate and up interleaved (row 2j
     * gate, 2j + 1 up), and a rank's rows are one run of whole pairs
     * (gpt-oss's gate_up_proj) */
    int interleaved;
    /* stacked, unquantized: the checkpoint stores the part with its last two
     * dims swapped ([E, H, rows], [E, I, H] for columns) and the engine holds
     * each expert's slice transposed (gpt-oss's BF16 experts) */
    int transposed;
    /* stacked: the part's bias <module>.<bias_part> [E, out] as the engine's
     * <module>[.<into>].<bias_as>, cut like the stack's rows (a columns
     * stack's: bias_first, whole on rank 0 and zeros on the others, the bias
     * of a row-parallel layer added once); NULL: none */
    char *bias_part, *bias_as;
    int bias_first;
    /* stacked, quantized (MXFP4): the engine's name for the stack's scales */
    char *scale_as;
} tps_lstack;

typedef struct {
    char **patterns;
    size_t npat;
    char *count;     /* config field: experts per layer */
    char *rows;      /* config field: an expert's intermediate size (named in refusals) */
    char *into;      /* path segment the stacks go under, or NULL */
    char *router;    /* the router, a sibling module of the experts module, or NULL */
    char *router_as; /* the name the engine gives it (relative to the same parent) */
    tps_lstack *stacks;
    size_t nstacks;
    char **model_types; /* only for these (none: every one) */
    size_t nmt;
    /* fuse_shared: the sibling module (e.g. shared_experts) whose parts the
     * engine stacks as one more expert, after the routed ones, when the
     * config's first architecture is listed, the count is one of counts and
     * config[shared_field] is 1; never under --ep. NULL: never. */
    char *shared;
    char **shared_arch;
    size_t nshared_arch;
    uint64_t shared_counts[8];
    size_t nshared_counts;
    char *shared_field;
    /* stacked: the module holds every expert in one 3-D tensor a part,
     * <module>.<part> [E, rows, H] or [E, H, rows] (Gemma 4's experts) */
    int stacked;
    int line;
} tps_lexperts;

/* A rank tensor under a module matching `patterns` (the first components of
 * its name) is written under the module's parent plus `as` instead: vLLM's
 * DeepSeek keeps o_proj as self_attn.mla_attn.o_proj. */
typedef struct {
    char **patterns;
    size_t npat;
    char *as;
    int root;      /* the matched module itself becomes `as` (not its parent + as) */
    char **model_types;
    size_t nmt;
    /* only_last: the pattern names the layers (PATH.*) and only the last
     * config[only_last] of num_hidden_layers are renamed, as AS.(N - first) */
    char *only_last;
    int line;
} tps_lrename;

/* A layout check: reject_if (a condition), or quotient (field == a / b when
 * the field is set). */
typedef struct {
    char *name, *reason;
    tps_cond *when;
    tps_cond cond;      /* reject_if */
    int is_quotient;
    char *field, *num, *den; /* quotient */
    char *divisible;    /* divisible: FIELD % tp == 0 */
    int line;
} tps_lcheck;

/* A layout file (plans/layouts/NAME.yaml): how an engine's rank files
 * differ from the DTensor shards of the plan. */
typedef struct tps_lspec {
    char *name, *target, *description, *label;
    char *text;        /* the file as read: the manifest keeps it */
    size_t text_len;
    char **architectures;
    size_t narch;
    char **model_types;
    size_t nmt;
    int exact;         /* splits must divide evenly (else torch.chunk) */
    uint64_t vocab_pad;
    int vocab_pad_tp;  /* padded vocab not divisible by tp: pad to vocab_pad x tp instead */
    char **vocab;      /* module paths whose dim 0 is the vocabulary */
    size_t nvocab;
    char *tied_head, *tied_embedding; /* module paths, or NULL */
    char **tied_default; /* model_types whose config ties by default */
    size_t ntied_default;
    char **tied_also;    /* embeddings tried in turn when tied_embedding is absent
                          * (a multimodal checkpoint's text model) */
    size_t ntied_also;
    tps_lcheck *checks;
    size_t nchecks;
    tps_lrule *rules;
    size_t nrules;
    tps_lfuse *fuse;
    size_t nfuse;
    tps_lexperts *experts;
    size_t nexperts;
    /* quantized checkpoints: scales as the engine holds them */
    int scale_f32;          /* every scale and input scale widened to F32 */
    int scalar_as_1;        /* 0-dim per-tensor scales written [1] */
    int refine_moe_blocks; /* scales: refine_expert_blocks: the engine refines FP8 expert blocks */
    unsigned refuse_scales; /* bit per tps_qscale kind the engine cannot load from files */
    char *refuse_scales_reason;
    /* scales: packed: the packed methods (quant_method names) the engine
     * loads from files as their checkpoints store them; packed_reason: why
     * it loads none (kernel-repacked weights) */
    char **packed_methods;
    size_t npacked_methods;
    char *packed_reason;
    tps_ldrop *drops;
    size_t ndrops;
    tps_lkey *keys;   /* given (has_keys): a tensor no rule places and no key names is refused */
    size_t nkeys;
    int has_keys;
    tps_lrename *renames;
    size_t nrenames;
    /* pipeline (has_pipeline): how the engine builds a stage's model. The layers
     * (modules under pp_layers, e.g. model.layers.N) split into stages by the
     * engine's partition; the modules outside them are built on the first
     * stage (pp_first), the last (pp_last), or, for the model types in
     * pp_every, on every stage. A tied head is on the last stage, and the
     * first holds it under the embedding's name, unless every stage has both. */
    int has_pipeline;
    char *pp_layers;      /* module path of the decoder layers' list, e.g. "model.layers" */
    char *pp_count;       /* config count of the layers, e.g. "num_hidden_layers" */
    char **pp_first, **pp_last, **pp_every;
    size_t npp_first, npp_last, npp_every;
    /* config count of the last layers that read an earlier layer's KV cache
     * (the last layer before them of the same layer_types entry), which the
     * engine needs on the same stage (Gemma 4's num_kv_shared_layers), or NULL */
    char *pp_kv_shared;
} tps_lspec;

tps_err tps_lspec_parse(tps_ctx *ctx, const char *label, const char *text, size_t len,
                        tps_lspec **out);
void tps_lspec_free(tps_lspec *s);
/* Module path patterns as plans match them ('*' one component). */
int tps_module_match(const char *pattern, const char *module, size_t mlen);

/* ------------------------------------------------------------------ quantized checkpoints (lib/quant/) */

/* How a scale follows its weight. */
typedef enum { TPS_QS_TENSOR = 0, TPS_QS_CHANNEL, TPS_QS_BLOCK, TPS_QS_GROUP, TPS_QS_KINDS } tps_qscale;
#define TPS_QS_ALL ((1u << TPS_QS_KINDS) - 1)
extern const char *const tps_qscale_names[TPS_QS_KINDS];   /* "tensor", "channel", "block", "group" */
extern const char *const tps_qscale_labels[TPS_QS_KINDS];  /* "per-tensor", "per-channel", "block", "per-group" */
/* ZEROS: a packed weight's zero points; UNUSED: a tensor the method stores
 * that no engine loads (GPTQ's g_idx). */
typedef enum {
    TPS_QR_PLAIN = 0,
    TPS_QR_WEIGHT,
    TPS_QR_SCALE,
    TPS_QR_INPUT_SCALE,
    TPS_QR_ZEROS,
    TPS_QR_UNUSED,
    TPS_QR_SHAPE  /* compressed-tensors' weight_shape: the weight's [out, in], I64 */
} tps_qrole;

typedef struct tps_quant tps_quant;

/* A tensor a method stores beside a quantized weight X.weight, named
 * X<suffix> (".weight_scale_inv"): a scale of the kinds it may hold, or a
 * static input scale (one value). Packed methods (bits 4, 8 in int32 words)
 * store X<weight_suffix> instead of X.weight and name every part, the
 * weight included. */
typedef struct {
    const char *suffix;
    tps_qrole role;   /* TPS_QR_WEIGHT, _SCALE, _INPUT_SCALE, _ZEROS or _UNUSED */
    unsigned kinds;   /* bit per tps_qscale */
    /* packed methods: how the part's [rows, columns] follow the weight's
     * [in, out] (the transposed storage of GPTQ): dim 0 holds input
     * features (in_div 1), groups of them (in_div: the group size) or
     * packed words of them (in_div: the pack factor); dim 1 output
     * features, or packed words of them (out_packed) */
    int in_by;        /* 0: in / 1, 1: in / group, 2: in / pack factor */
    int out_packed;
    const char *why;  /* UNUSED: why no engine loads it */
    int optional;     /* packed: absent when the config says so (zero points of
                       * symmetric codes: q->asym 0) */
    int per_tensor;   /* packed SCALE / INPUT_SCALE: one F32 value ([] or [1]), a
                       * slot per fused part in the engine (NVFP4's global scales) */
} tps_qpart;

/* One weight's scales as a dequantize kernel reads them, in f32: the
 * source's (whole) or one rank's local ones. lo: the first block row or
 * column (or channel row) they hold along the weight's split dim d (-1:
 * whole); width: scales per row of s. */
typedef struct {
    tps_qscale kind;
    uint64_t bn, bk;
    const float *s;
    uint64_t lo, width;
    int d;
} tps_qscales;

/* A quantization method: everything split, layout, verify, inspect and plan
 * know of it. Adding one is an entry in lib/quant/ (its config reader, the
 * tensors it adds beside a weight, its dequantize kernel) and its tests. */
typedef struct {
    const char *name;   /* quantization_config.quant_method */
    const char *what;   /* what of it tpshard splits, for messages */
    /* reads quantization_config into q (blocks, ...); refuses what it cannot split */
    tps_err (*read_config)(tps_ctx *ctx, const tps_ckpt *ck, const cJSON *qc, tps_quant *q);
    int (*weight_dtype)(tps_dtype d);  /* the quantized weight's storage */
    const tps_qpart *parts;
    size_t nparts;
    /* w[0..width) = weight row j (global) from global column col0, in f32,
     * times its scales */
    void (*dequant_row)(const tps_qscales *s, uint64_t j, uint64_t col0, float *w, size_t width);
    /* packed methods: the quantized weight's name (".qweight"), NULL for
     * X.weight; the weight codes' bits come from the config (q->bits) */
    const char *weight_suffix;
    /* packed methods: the parts store [in, out] (GPTQ, AWQ: 1) or [out, in]
     * (compressed-tensors, NVFP4: 0), in the part table's units */
    int transposed;
    /* packed methods: the grouped scales are in the model's dtype, as the
     * engine creates them (1), or in a dtype of their own (NVFP4's F8_E4M3) */
    int scales_model_dtype;
    /* entries sharing a name (compressed-tensors, modelopt): the config field
     * that tells them apart ("format", "quant_algo") and the values this one
     * reads, space separated, "-" for the field absent; NULL: any */
    const char *select;
    const char *formats;
    /* the quantization_config list naming the quantized modules that a
     * serving layout's config.json must carry ("modules_in_block_to_quantize"),
     * or NULL: vLLM 0.33 derives it from the files' dtypes, and in rank
     * files the fused modules' parts are not there to find */
    const char *module_list;
    /* the same for a method whose config lists the unquantized modules
     * instead ("modules_to_not_convert": AWQ), derived from the files' dtypes
     * as vLLM derives it from the source's */
    const char *skip_list;
    /* what vLLM's loader refuses of a row-parallel cut with one group
     * (group_size -1) when tp > 1, or NULL: it keeps the scales whole */
    const char *channel_rowwise_refusal;
    /* methods whose tensors are not X.weight beside its parts (MXFP4's
     * X_blocks, X_scales): checks them all and counts q->nquant, in place
     * of the part table */
    tps_err (*bind)(tps_ctx *ctx, const tps_ckpt *ck, tps_quant *q);
    /* packed methods: the dequantize kernel verify runs on both sides of a
     * rank's piece. A weight of code `code` (its place in the words: the
     * weight part's packed dim, code k of a word at bits bits x order[k]),
     * zero point `zero` (the stored one's code, or 2^(bits-1) where the
     * method stores none or the engine ignores them), its group's scale and
     * the linear's global scale (1 where none) */
    float (*dequant)(const tps_quant *q, unsigned code, double zero, float scale, float global);
    const int *code_order;  /* NULL: code k at bits x k, low bits first */
    int zeros_ignored;      /* stored zero points the engine does not read (GPTQ) */
    float (*global_scale)(float stored); /* as the kernel applies it; NULL: as stored */
    /* --pad-intermediate: the word (of the weight codes, or of the zero
     * points) whose codes dequantize to exactly 0 */
    uint32_t (*pad_word)(const tps_quant *q, tps_qrole role);
} tps_qmethod;

extern const tps_qmethod *const tps_qmethods[];
extern const size_t tps_nqmethods;
extern const tps_qmethod tps_qm_fp8, tps_qm_ct_fp8; /* lib/quant/fp8.c */
extern const tps_qmethod tps_qm_gptq, tps_qm_awq, tps_qm_ct_wna16; /* lib/quant/gptq.c */
extern const tps_qmethod tps_qm_nvfp4, tps_qm_ct_nvfp4; /* lib/quant/nvfp4.c */
extern const tps_qmethod tps_qm_mxfp4;               /* lib/quant/mxfp4.c */
/* MXFP4's tensors beside an experts module's projection P: P_blocks, P_scales */
#define TPS_MXFP4_BLOCKS "_blocks"
#define TPS_MXFP4_SCALES "_scales"

struct tps_quant {
    const tps_qmethod *m;
    const char *method_name; /* as config.json says (borrowed) */
    uint64_t bn, bk;         /* block rows and columns; 0: no blocks */
    int *role;               /* per source tensor: tps_qrole */
    int *partner;            /* WEIGHT: its scale; (INPUT_)SCALE: its weight; else -1 */
    int *input;              /* WEIGHT: its input scale, or -1 */
    tps_qscale *kind;        /* SCALE: per tensor, channel or block */
    int *zeros;              /* WEIGHT of a packed method: its zero points, or -1 */
    size_t nquant;           /* quantized weights */
    /* packed methods: code bits, input features per group (-1: one group),
     * whether the config says its optional parts are stored (zero points of
     * asymmetric codes, NVFP4 W4A4 input scales) */
    int bits;
    int64_t group;
    int asym; /* the optional parts are stored */
};

/* The quantization of ck: NULL (*out) when config.json has none. Refuses
 * (TPS_E_REJECT) what is not supported; a scale that does not fit its
 * weight, a weight without a scale or a scale without a weight is an error
 * naming the tensor. */
tps_err tps_quant_open(tps_ctx *ctx, const tps_ckpt *ck, tps_quant **out);
void tps_quant_free(tps_quant *q);
/* Why a packed method's checkpoint (q->m->weight_suffix) cannot be written
 * by a layout (NULL: the DTensor layout), the layout's reason `why` (or
 * NULL); a static buffer of this thread. */
const char *tps_quant_packed_reason(const tps_quant *q, const char *layout, const char *why);
/* The config.json text a serving layout writes for a packed method whose
 * quantized modules the engine must find by name (q->m->module_list), from
 * `text` (the config split would write); NULL in *out when none is needed
 * (the method has none, or the config lists them already). */
tps_err tps_quant_serving_config(tps_ctx *ctx, const tps_ckpt *ck, const tps_quant *q,
                                 const char *text, char **out);
/* [bn, bk] of a config: two positive integers, or an error naming where. */
tps_err tps_quant_block_of(tps_ctx *ctx, const tps_ckpt *ck, const char *where, const cJSON *b,
                           uint64_t *bn, uint64_t *bk);
/* The shared kernels of the packed methods' table entries (lib/quant/gptq.c):
 * (code - zero) x scale, and the pad word of codes 2^(bits-1) (the biased
 * zero) and, for stored zero points of GPTQ's v1 format, one less. */
float tps_qk_int(const tps_quant *q, unsigned code, double zero, float scale, float global);
uint32_t tps_qk_pad_biased(const tps_quant *q, tps_qrole role);
uint32_t tps_qk_pad_zero(const tps_quant *q, tps_qrole role);

/* ------------------------------------------------------------------ layout */

typedef struct {
    size_t t;         /* index into ck->t */
    tps_style style;
    int dim;          /* -1 replicated */
    const char *rule; /* borrowed from the plan */
} tps_place;

/* The compiled layout: every rank's tensors, each an ordered list of pieces.
 * A source piece is a region [lo, hi) along dim of a source tensor (dim -1:
 * the whole tensor), laid out in the rank tensor as the region's own
 * row-major bytes at byte `at`. Regions are numbered: the replicas of a
 * region (whole KV heads on several ranks, replicated tensors) share it. */
typedef enum { TPS_PK_SRC = 0, TPS_PK_ZERO, TPS_PK_CONST } tps_piece_kind;

typedef struct {
    uint8_t kind : 2;    /* tps_piece_kind */
    uint8_t replica : 1; /* SRC: another piece of the same region is the primary */
    uint8_t sdim : 5;    /* strided (run): 0, its runs a step of the dims before the rank
                          * tensor's last apart; d + 1: a step of dim d apart (Gemma 4's
                          * fused experts: gate and up rows of an expert side by side) */
    uint16_t rank;   /* its rank tensor's (tp x pp <= 65536) */
    uint32_t region; /* SRC */
    uint32_t xf;     /* SRC: 0, or 1 + its index in L->xforms (a refined scale grid,
                      * or a transposed piece: tps_xform.tr) */
    /* SRC, ZERO: 0, or the piece is concatenated along the rank tensor's
     * last dim with others: its bytes are runs of `run` bytes, one per step
     * of the dims before it, tps_rt_stride(rank tensor) bytes apart from
     * `at` on (vLLM's fused GPTQ qweight: [in / 8, q | k | v]) */
    uint32_t run;
    uint64_t at;     /* byte offset in the rank tensor */
    uint64_t nbytes;
    double value;    /* CONST: every element, in the rank tensor's dtype */
} tps_lpiece; /* 40 bytes: 723k of them for a DeepSeek-V3-shaped vllm split at tp 8 */

typedef struct {
    uint32_t src;     /* index into ck->t */
    int32_t dim;      /* -1: the whole tensor */
    uint32_t lo, hi;  /* along dim (a dim is under 2^32: tps_layout_compile refuses longer) */
    uint32_t primary; /* index of its primary piece in L->pieces */
    uint64_t nbytes;
} tps_region; /* 32 bytes (one a piece at DeepSeek-V3's size: 723k) */

typedef struct {
    const char *name; /* borrowed from the source tensor, or L->names */
    const uint64_t *shape; /* ndim of them, in L->shapes */
    uint64_t nbytes;
    const char *rule; /* what made it: a plan pattern or the layout's rule, or NULL */
    uint32_t piece0, npieces; /* L->pieces[piece0 .. piece0 + npieces), by `at` */
    int rank;
    uint8_t dtype;   /* tps_dtype */
    uint8_t ndim;
    uint8_t simple;  /* exactly one source piece under the source tensor's own name */
} tps_rtensor; /* 48 bytes: 736k of them for a DeepSeek-V3-shaped dtensor split at tp 8 */
#ifdef __cplusplus /* verify_cuda.cu includes this header */
static_assert(
#else
_Static_assert(
#endif
    sizeof(tps_lpiece) == 40 && sizeof(tps_region) == 32 &&
        (sizeof(void *) != 8 || sizeof(tps_rtensor) == 48),
    "the compiled layout's tables: one of each for every tensor-rank piece");

/* Bytes from one step of a rank tensor's dims before its last to the next:
 * how far apart a strided piece's runs lie. */
static inline uint64_t tps_rt_stride(const tps_rtensor *r)
{
    uint64_t outer = 1;
    for (int d = 0; d + 1 < r->ndim; d++) outer *= r->shape[d];
    return outer ? r->nbytes / outer : 0;
}

/* How far apart strided piece p's runs lie in rank tensor r. */
static inline uint64_t tps_piece_stride(const tps_rtensor *r, const tps_lpiece *p)
{
    if (!p->sdim) return tps_rt_stride(r);
    uint64_t outer = 1;
    for (int d = 0; d < p->sdim && d < r->ndim; d++) outer *= r->shape[d];
    return outer ? r->nbytes / outer : 0;
}

struct tps_layout {
    const tps_ckpt *ck;
    const tps_plan *plan;
    const tps_lspec *spec; /* NULL: the DTensor layout of the plan */
    tps_quant *q;          /* quantized checkpoints: scales follow their weights */
    int tp;
    int ep;                /* experts whole on one rank each (split --ep) */
    /* split --pad-intermediate: asked (pad_mode); pad_field (config.json's
     * intermediate_size) from pad_from to pad_to features when the split
     * needs it (pad_to > pad_from), the MLP's gate/up rows and down columns
     * beyond pad_from holding codes that dequantize to 0 */
    int pad_mode;
    const char *pad_field;
    uint64_t pad_from, pad_to;
    int pad_used;          /* some dense MLP tensor was padded */
    /* the same for the experts' intermediate size (moe_intermediate_size) */
    const char *epad_field;
    uint64_t epad_from, epad_to;
    /* vLLM's MoE backend for MXFP4 experts (split --moe-backend): the round-up
     * of their parameters' sizes; moe_used: some rank tensor's shape depends
     * on it (the manifest records it) */
    const tps_moe_backend *moe;
    int moe_used;
    /* pipeline parallelism (a layout with a pipeline section): pp stages of
     * tp ranks each; rank (worker) w is stage w / tp, tensor-parallel rank
     * w % tp, and nranks = tp * pp. Stage s holds layers
     * [stage_first[s], stage_first[s] + stage_layers[s]). */
    int pp, nranks;
    int *stage_first, *stage_layers;
    int pp_from_env;       /* the partition came from VLLM_PP_LAYER_PARTITION */
    tps_place *p;     /* same order as ck->t */
    size_t n;
    tps_check_outcome *checks;
    size_t nchecks;
    char *rejected;
    /* compiled (tps_layout_compile) */
    tps_rtensor *rt;  /* by rank, then name */
    size_t nrt;
    size_t *rank_rt;  /* rank r's tensors: rt[rank_rt[r] .. rank_rt[r + 1]) */
    tps_lpiece *pieces;
    size_t npieces, cap_pieces;
    tps_region *regions;
    size_t nregions, cap_regions;
    tps_xform *xforms; /* refined and transposed pieces' transforms (tps_lpiece.xf - 1) */
    size_t nxforms;
    uint32_t *src_pieces; /* the pieces of source tensor i: src_pieces[src_piece0[i] ..] */
    uint32_t *src_piece0;
    char **names;     /* made-up rank tensor names (owned) */
    size_t nnames;
    tps_u64_chunks shapes; /* the rank tensors' shapes */
    const char **dropped; /* per source tensor: why the layout leaves it out (the engine's
                           * load_weights skips it), or NULL: kept. NULL when none is. */
    tps_layer_view *layers; /* strings borrowed from the config and static text */
    size_t nlayers;
    /* compiled for some ranks only (tps_layout_opts.keep, borrowed for the
     * compile): keep[r] says which; rank_bytes[r], every rank's bytes */
    const unsigned char *keep;
    uint64_t *rank_bytes;
};

/* Is layout piece p transposed (tps_xform.tr)? */
static inline int tps_lpiece_tr(const tps_layout *L, const tps_lpiece *p)
{
    return p->xf && L->xforms[p->xf - 1].tr;
}

/* A transposed region of tensor t cut to [lo, hi) along dim (-1: whole):
 * *n matrices of *a rows of *b elements each (its last two dims), stored
 * as *n matrices of *b rows of *a. */
static inline void tps_tr_dims(const tps_ctensor *t, int dim, uint64_t lo, uint64_t hi,
                               uint64_t *n, uint64_t *a, uint64_t *b)
{
    uint64_t sh[TPS_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++) sh[d] = d == dim ? hi - lo : t->shape[d];
    *n = 1;
    for (int d = 0; d + 2 < t->ndim; d++) *n *= sh[d];
    *a = t->ndim >= 2 ? sh[t->ndim - 2] : 1;
    *b = t->ndim >= 1 ? sh[t->ndim - 1] : 1;
}

/* The layout of a directory split earlier: styles as its manifest recorded
 * them (no plan), the layout file it used, and the directory's config. */
tps_err tps_layout_from_styles(tps_ctx *ctx, const tps_ckpt *ck, const tps_plan *plan,
                               const tps_lspec *spec, int tp, int ep, int pp, const int *layers,
                               int pad, const tps_moe_backend *moe,
                               const tps_style *styles, const unsigned char *keep,
                               tps_layout **out);
/* A serving layout's rank tensors: padding reads as zeros, constants as
 * their values, every byte accounted for (check and verify). */
tps_err tps_check_fills(tps_ctx *ctx, const tps_ckpt *ck);
int tps_style_lookup(const char *name, tps_style *out); /* 0 ok, -1 unknown */

/* L's places, rank tensors, pieces and regions let go (every rank then holds none):
 * what stays is what the whole layout says (plan, spec, checks, dropped
 * tensors, padding, and a layout of some ranks' rank_bytes). */
void tps_layout_drop_tables(tps_layout *L);
/* Fills rt/pieces/regions for L's layout (the plan's placements, or the
 * spec). Refusals (head counts, divisibility, missing fused parts) set
 * L->rejected and return TPS_OK; malformed input returns an error. */
tps_err tps_layout_compile(tps_ctx *ctx, tps_layout *L);
/* Bytes of a region's element row geometry: [outer, n, inner]. */
void tps_region_geom(const tps_ckpt *ck, const tps_region *g, uint64_t *outer, uint64_t *row,
                     uint64_t *s, uint64_t *l);

/* The layer a tensor belongs to: the first all-digit component of its
 * module path ("model.layers.12.self_attn.k_proj.weight": 12), or -1. */
int tps_layer_of_name(const char *name);


/* torch.chunk / DTensor Shard: rank r's [start, start+len) of n over tp. */
void tps_chunk(uint64_t n, int tp, int r, uint64_t *start, uint64_t *len);

/* ------------------------------------------------------------------ alignment (split/align.c) */

/* A run of source bytes a rank file holds: at absolute offset src of its
 * source file, at offset dst of the rank file's data section. */
typedef struct {
    uint64_t src, dst, len;
} tps_align_run;
#define TPS_SHARE_BLOCK 4096 /* the block plan --json reports sharing for (XFS, btrfs) */
/* The data offset, at least h_min (a multiple of 8, as the result is) and
 * below h_min + blk, that puts the most bytes of the runs at their source
 * offset modulo blk (whole blocks, what clones share: *shared); of equals
 * the smallest; h_min itself unless another shares min_gain bytes more.
 * h_min when blk is not a power of two of 8 or more. */
uint64_t tps_align_data_offset(const tps_align_run *r, size_t n, uint64_t h_min, uint32_t blk,
                               uint64_t min_gain, uint64_t *shared);

/* ------------------------------------------------------------------ manifest arrays (common/jsarr.c) */

typedef struct {
    const char *b, *e; /* the array's text, [ to ] inclusive; b NULL: absent */
} tps_js_span;

/* The elements of one of those arrays: one at a time from its text (span
 * set), or from the tree (a manifest parsed whole). Each element lives until
 * the next call; js_iter_start again runs through them once more. */
typedef struct {
    const char *b, *p, *e; /* the array's text, or b NULL */
    const cJSON *next;     /* the tree's next element */
    cJSON *el;             /* the element parsed from the text */
    const char *what;
    size_t i;
} tps_js_iter;

void tps_js_iter_start(tps_js_iter *it, const tps_js_span *sp, const cJSON *arr, const char *what);
tps_err tps_js_iter_next(tps_ctx *ctx, const char *mpath, tps_js_iter *it, const cJSON **out);
void tps_js_iter_free(tps_js_iter *it);
/* A manifest's text (tx_p, tx_len; mpath names it) parsed: whole into *root
 * (sp[0].b, sp[1].b NULL), or (its usual shape) all but its tensors and
 * rank_tensors arrays, whose spans sp[0] and sp[1] get. */
tps_err tps_js_parse_manifest(tps_ctx *ctx, const char *mpath, const char *tx_p, size_t tx_len,
                              cJSON **root, tps_js_span *sp);

/* ------------------------------------------------------------------ manifest */

#define TPS_MANIFEST "tpshard.json"
#define TPS_MANIFEST_FORMAT 1        /* the DTensor layout */
#define TPS_MANIFEST_FORMAT_LAYOUT 2 /* a serving layout: pieces, rank_tensors */
/* tensor-rank entries (and rank tensors) a manifest may list: Kimi-K2's 142k
 * tensors at tp 8 are 1.1M in the vLLM layout; the pieces read back take 80
 * bytes each, the manifest's text about 360 */
#define TPS_MAX_MANIFEST_ENTRIES 16777216
extern size_t tps_max_manifest_entries; /* TPS_MAX_MANIFEST_ENTRIES; tests lower it */
/* A manifest is read a piece at a time (mapped, its pages let go behind),
 * so its size is bounded by its entries (TPS_MAX_MANIFEST_ENTRIES), not by
 * what a JSON tree may take: DeepSeek-V3's at tp 8 in the vLLM layout is
 * 259 MB, Kimi-K2's 400 MB. */
#define TPS_MAX_MANIFEST_FILE ((size_t)16 << 30)

#endif
