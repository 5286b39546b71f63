/* split_int.h - what the files of the split stage's copy engine share:
 * split.c (the engine and tps_split), manifest.c (the manifest it writes)
 * and join.c (the output directory and the --ranks runs that share it).
 * Nothing outside lib/split/ includes it. */
#ifndef TPS_SPLIT_INT_H
#define TPS_SPLIT_INT_H

#include "internal.h"

typedef struct {
    int rank, part;
    char *final, *tmp;
    int fd;
    int nparts;      /* of its rank */
    size_t hdr_len;
    uint32_t hdr_crc; /* of the hdr_len bytes written: the manifest covers them */
    size_t pad;      /* spaces after the header's JSON that align its tensors (align.c) */
    uint64_t size;
    int writers;     /* threads in a write to it now (split.c's ofile_write) */
    int tasks;       /* threads in a task that writes only to it (run_all) */
} ofile;

/* Where a rank tensor lands: its file and the absolute offset of its bytes. */
typedef struct {
    int file;        /* index into files, -1 when the rank is not written */
    uint64_t off;
} oslot;

typedef enum { TASK_CONTIG = 0, TASK_ROWS = 1, TASK_MULTI = 2, TASK_FUSED = 3, TASK_TROWS = 4 } task_kind;

/* Rank tensors of one name whose pieces are strided (concatenated along
 * their last dim: vLLM's fused GPTQ qweight), every rank's: written by
 * FUSED tasks, rows [a, b) of all of them at a time, each assembled in
 * memory from its parts' source rows (read once for every rank) and
 * written in one run. */
typedef struct {
    size_t *rts;     /* rank tensors, by rank */
    size_t n;
    uint64_t rows;   /* rows of each (bytes / its stride) */
} fgroup;

/* FUSED: rows [a, b) of the rank tensors of group g0 (ng CRCs: those of
 * the primary pieces of regions only it writes, in the group's order).
 * CONTIG: bytes [a, b) of one region, which are one run of its source
 * tensor starting at byte `src`. ROWS: outer rows [a, b) of a source tensor
 * whose regions g0 .. g0 + ng (consecutive, same tensor and dim) are strided
 * slices of each row. MULTI: regions g0 .. g0 + ng of small tensors lying
 * back to back in source file `file` from byte `src` on, b bytes in all,
 * read in one go (a MoE's experts): each region one run of its tensor, or
 * all the regions of a tensor split along a later dim, cut from its bytes.
 * TROWS: rows [a, b) of transposed region g0 (tps_xform.tr; a row is its
 * last dim), read in the region's order, whole matrices or part of one. */
typedef struct {
    uint32_t t;      /* source tensor */
    uint32_t g0, ng; /* regions (32-bit, as the layout's: tps_layout_compile) */
    uint32_t crc0;   /* its first CRC in the pool (ROWS: ng of them) */
    uint8_t kind;    /* task_kind */
    uint8_t full_rows; /* ROWS: read whole rows once (else each region's slices) */
    uint8_t run;     /* CONTIG: the region is one run of its source: the kernel may copy it */
    int32_t file;    /* MULTI: the source file */
    uint64_t a, b;
    uint64_t src;    /* CONTIG: source byte of a */
} task; /* 48 bytes: a pass of a DeepSeek-V3-sized split plans 100k of them */

/* A split in passes: each pass's manifest entries, in a file of its own
 * (unlinked, in the output directory) until the manifest is written. */
typedef struct {
    int n;              /* passes */
    FILE **tens, **rts; /* [n]: a line a tensor; a line a rank tensor entry */
    signed char *dims;  /* per source tensor, the dim of its placement (-2: not yet seen) */
    char *line;         /* getline's */
    size_t cap;
    int bad;            /* a file did not read back */
    unsigned char *none; /* [ranks], zeros: no earlier --ranks run's */
} tps_sp_frags;

typedef struct {
    tps_ctx *ctx;
    const tps_ckpt *ck;
    const tps_layout *L;
    const unsigned char *write; /* [nranks] */
    int nranks;      /* the layout's ranks (workers): tp, or tp x pp */
    ofile *files;
    size_t nfiles;
    oslot *slots;    /* [rank tensor] */
    uint32_t *dests; /* written pieces of each region: dests[dest0[g] .. dest0[g + 1]) (piece
                      * and region indexes are 32-bit: tps_layout_compile) */
    uint32_t *dest0;
    task *tasks;
    size_t ntasks, cap;
    uint32_t *crcs;
    uint64_t *crclen;
    size_t ncrc;
    uint32_t *region_crc;
    int *piece_rt;   /* rank tensor of each piece */
    uint64_t total, done;
    uint64_t done0, total_all; /* a split in passes: bytes of the passes before, and about all */
    volatile int failed;
    tps_err err;
    int reporting;   /* a thread is in the progress callback */
    int join;        /* a --ranks run: other runs may be writing into the same directory */
    int wfd;         /* DIR/.tpshard.writing, held for the whole run (-1: not held) */
    cJSON *prev;     /* joining: the manifest of the --ranks runs already here, all but
                      * its tensors and rank_tensors (prev_sp: their text in prev_text) */
    tps_text prev_text;
    tps_js_span prev_sp[2];
    int map;         /* read the source through per-task mappings */
    size_t page;
    tps_kcopy kc;    /* how the output takes runs of the source (kcopy.c) */
    uint64_t shareable; /* bytes the alignment lets the rank files share (CLONE) */
    /* the config.json written beside the rank files when it is not the
     * source's (--untie, a packed method's module list), or NULL */
    char *config_written;
    const char *config_why; /* why, for the manifest */
    fgroup *fg;      /* FUSED tasks' groups */
    size_t nfg;
    unsigned char *fowned; /* [region]: only FUSED tasks write it (and take its CRC) */
    tps_sp_frags *frags;   /* the manifest of a split in passes: its entries from these */
    int passes_left;       /* a split in passes: this one and those after it */
    tps_err mw_rc;         /* the manifest could not be made (its message set) */
} engine;

/* manifest.c: DIR/tpshard.json, written whole under a temporary name and
 * renamed into place; a --ranks run's holds the entries of E->prev's ranks. */
tps_err tps_sp_write_manifest(engine *E, const tps_split_opts *o, const char *plan_source);

/* One pass's entries (E: the pass's engine) into fr's files for pass g. */
tps_err tps_sp_fragment(engine *E, tps_sp_frags *fr, int g);

/* align.c: every file's pad, for E->kc.blk, and E->shareable. */
tps_err tps_sp_align(engine *E);

/* join.c: the output directory */
/* Made when missing, claimed, and refused (or, --force, replaced) when it
 * holds another output; a --ranks run joins the manifest of its split. */
tps_err tps_sp_prepare_dir(engine *E, const tps_split_opts *o);
/* The free space the rank files need, counting those they replace. */
tps_err tps_sp_space_check(tps_ctx *ctx, const engine *E, const char *dir);
/* After the new files are in place: an older output's leftovers removed. */
void tps_sp_remove_stale(engine *E, const char *dir);
/* The manifest written: a --ranks run's under the directory's lock, with
 * the entries other runs recorded in the meantime. */
tps_err tps_sp_record_manifest(engine *E, const tps_split_opts *o, const char *plan_source);
/* The joined manifest (E->prev, its text) let go. */
void tps_sp_prev_close(engine *E);

#endif
