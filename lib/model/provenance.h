/* provenance.h - what a manifest records about the bytes it did not copy
 * from the source: every rank file's header, and the source it was split
 * from. Not installed. */
#ifndef TPS_PROVENANCE_H
#define TPS_PROVENANCE_H

#include "internal.h"

/* The manifest's files[] entry of a rank file: the bytes of its header
 * (8-byte length, JSON, space padding) and their CRC32. */
#define TPS_PROV_HEADER_BYTES "header_bytes"
#define TPS_PROV_HEADER_CRC "header_crc32"
/* The manifest's source.files[] entry: the source file's size. */
#define TPS_PROV_SOURCE_BYTES "bytes"

/* Rank file `path` against its manifest files[] entry `fe` (mpath names the
 * manifest in errors): its first header_bytes bytes have header_crc32, and
 * the file has `bytes` bytes. TPS_E_MISMATCH naming the file and saying its
 * header changed; TPS_E_JSON for a malformed entry. *recorded is 0 when the
 * entry holds no header CRC (a manifest written before they were recorded):
 * nothing was checked then. */
tps_err tps_prov_rank_header(tps_ctx *ctx, const char *mpath, const char *path, const cJSON *fe,
                             int *recorded);

/* verify --source: src is the checkpoint the sharded directory ck records
 * in its manifest: the same source files (names, sizes where recorded), the
 * same headers, and every tensor the manifest lists there with its dtype,
 * shape and file. TPS_E_MISMATCH naming the first file or tensor that
 * differs. Reads no tensor bytes. */
tps_err tps_prov_source(tps_ctx *ctx, const tps_ckpt *ck, const tps_ckpt *src);

/* Then the bytes, sampled up front: the smallest tensors the manifest holds
 * whole or in row ranges (Replicate, Shard(0)), up to `budget` bytes of the
 * source, must have the CRC32s the manifest records. A source with the same
 * names and shapes but other values (a fine-tune, another revision) is
 * named here before verify reads the rest. */
tps_err tps_prov_source_sample(tps_ctx *ctx, const tps_ckpt *ck, const tps_ckpt *src,
                               uint64_t budget);

/* Whether tensor i of ck, a sharded directory, holds on every rank the bytes
 * the manifest's CRC32s record: *same is 1 when every piece and replica
 * matches. */
tps_err tps_prov_tensor_intact(tps_ctx *ctx, const tps_ckpt *ck, size_t i, int *same);

#endif
