/* model_int.h - what the files of lib/model/ share about opening a
 * checkpoint (checkpoint.c, ckpt_index.c, ckpt_sharded.c, ckpt_untie.c);
 * nothing outside lib/model/ includes it. */
#ifndef TPS_MODEL_INT_H
#define TPS_MODEL_INT_H

#include "internal.h"

#define MAX_JSON_FILE (256u << 20)

/* checkpoint.c: the rank and source files, and the tensor table */
/* Opens file `name` of ck's directory as ck's next file (*idx). */
tps_err tps_ck_add_file(tps_ctx *ctx, tps_ckpt *ck, const char *name, size_t *idx);
/* n pieces from a new pool the checkpoint frees. */
tps_piece *tps_ck_new_pool(tps_ctx *ctx, tps_ckpt *ck, size_t n);
/* Room for `extra` more tensors, zeroed. */
/* A copy of shape[0 .. ndim) that lives as long as ck, zeros after it to
 * TPS_SHAPE_PAD dims; NULL out of memory. */
const uint64_t *tps_ck_keep_shape(tps_ckpt *ck, const uint64_t *shape, int ndim);
tps_err tps_ck_grow_tensors(tps_ctx *ctx, tps_ckpt *ck, size_t extra);
/* Every tensor of file fi becomes a one-piece tensor. */
tps_err tps_ck_add_file_tensors(tps_ctx *ctx, tps_ckpt *ck, size_t fi);
/* The table sorted by name, refused when a name is there twice. */
tps_err tps_ck_sort_and_dedup(tps_ctx *ctx, tps_ckpt *ck);
/* A file name the index or manifest gives must be a plain name inside the
 * model directory. */
int tps_ck_plain_name(const char *s);

/* ckpt_index.c: a directory through model.safetensors.index.json */
tps_err tps_ck_open_index(tps_ctx *ctx, tps_ckpt *ck, const char *ipath);

/* ckpt_sharded.c: a tpshard output directory through its manifest */
tps_err tps_ck_open_sharded(tps_ctx *ctx, tps_ckpt *ck, const char *mpath);

#endif
