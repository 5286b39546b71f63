/* fuzz_header.c - the input is a whole safetensors file image.
 * Oracle beyond "no crash": a header the reader accepts is rebuilt with the
 * writer (tps_st_build_header) and the rebuilt header must be accepted too,
 * with the same tensors (name, dtype, shape, size) and metadata. */
#include "fuzz_common.h"

static uint64_t le64(const uint8_t *b)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}

static const tps_st_tensor_info *find(const tps_st *st, const char *name)
{
    for (size_t i = 0; i < st->n; i++)
        if (strcmp(st->t[i].name, name) == 0) return &st->t[i];
    return NULL;
}

static void roundtrip(tps_ctx *ctx, const tps_st *st)
{
    tps_st_entry *e = calloc(st->n + 1, sizeof *e);
    uint64_t data = 0;
    for (size_t i = 0; i < st->n; i++) {
        const tps_st_tensor_info *t = &st->t[i];
        e[i] = (tps_st_entry){.name = t->name, .dtype = t->dtype, .ndim = t->ndim,
                              .shape = t->shape, .nbytes = tps_st_info_nbytes(t)};
        data += tps_st_info_nbytes(t);
    }
    char *hdr = NULL;
    size_t hlen = 0;
    tps_err rc = tps_st_build_header(ctx, e, st->n, (const char *const *)st->mkeys,
                                     (const char *const *)st->mvals, st->nmeta, &hdr, &hlen);
    if (rc == TPS_OK) {
        if (hlen < 8 || (hlen - 8) % 8 || le64((const uint8_t *)hdr) != hlen - 8) abort();
        tps_st *back = NULL;
        if (tps_st_parse_header(ctx, "rebuilt", hdr + 8, hlen - 8, hlen + data, &back) != TPS_OK) {
            fprintf(stderr, "rebuilt header rejected: %s\n", tps_ctx_errmsg(ctx));
            abort();
        }
        if (back->n != st->n || back->nmeta != st->nmeta) abort();
        for (size_t i = 0; i < st->n; i++) {
            const tps_st_tensor_info *a = &st->t[i], *b = find(back, a->name);
            if (!b || b->dtype != a->dtype || b->ndim != a->ndim ||
                tps_st_info_nbytes(b) != tps_st_info_nbytes(a) ||
                memcmp(a->shape, b->shape, sizeof(uint64_t) * (size_t)a->ndim) != 0)
                abort();
        }
        for (size_t i = 0; i < st->nmeta; i++)
            if (strcmp(st->mkeys[i], back->mkeys[i]) || strcmp(st->mvals[i], back->mvals[i]))
                abort();
        tps_st_free(back);
    }
    free(hdr);
    free(e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tps_ctx *ctx = tps_ctx_new();
    /* The public entry point, on the exact-size buffer (ASan sees overreads). */
    tps_err rc = tps_st_parse_buffer(ctx, "fuzz.safetensors", data, size, size);
    if (rc == TPS_OK && size >= 8) {
        uint64_t n = le64(data);
        tps_st *st = NULL;
        if (n <= size - 8 &&
            tps_st_parse_header(ctx, "fuzz.safetensors", (const char *)data + 8, (size_t)n, size,
                                &st) == TPS_OK)
            roundtrip(ctx, st);
        else
            abort(); /* parse_buffer accepted what parse_header rejects */
        tps_st_free(st);
    }
    if (rc != TPS_OK && tps_ctx_errmsg(ctx)[0] == 0) abort(); /* every error says why */
    tps_ctx_free(ctx);
    return 0;
}
