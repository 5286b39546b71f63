/* verify_report.c - the report verify returns: one row per check. */
#include "verify_int.h"

#include <errno.h>
#include <fnmatch.h>
#include <math.h>

/* ------------------------------------------------------------------ report */


void tps_verify_report_free(tps_verify_report *r)
{
    if (!r) return;
    for (size_t i = 0; i < r->n; i++) free((char *)tps_va_row(r, i)->note);
    for (size_t b = 0; b < r->nblk; b++) free(r->blk[b]);
    free(r->blk);
    tps_str_chunks_free(&r->strs);
    for (size_t k = 0; k < r->nkinds; k++) free((char *)r->kinds[k]);
    tps_str_chunks_free(&r->lent);
    free(r->backend);
    free(r);
}
size_t tps_verify_report_count(const tps_verify_report *r)
{
    return r ? r->n : 0;
}
const tps_verify_row *tps_verify_report_row(const tps_verify_report *r, size_t i)
{
    return r && i < r->n ? tps_va_row(r, i) : NULL;
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
int tps_va_rep_add(tps_verify_report *R, const char *check, const char *kind, double err,
                   double tol, uint64_t wrong, uint64_t total, int ok, char *note)
{
    if (R->n == R->nblk * ROWS_BLK) {
        if (R->nblk == R->cap_blk) {
            size_t nc = R->cap_blk ? R->cap_blk * 2 : 16;
            tps_verify_row **nb = realloc(R->blk, nc * sizeof *nb);
            if (!nb) {
                free(note);
                return -1;
            }
            R->blk = nb;
            R->cap_blk = nc;
        }
        if (!(R->blk[R->nblk] = malloc(ROWS_BLK * sizeof(tps_verify_row)))) {
            free(note);
            return -1;
        }
        R->nblk++;
    }
    const char *ck = NULL, *kd = NULL;
    if (R->n && !strcmp(tps_va_row(R, R->n - 1)->check, check))
        ck = tps_va_row(R, R->n - 1)->check; /* the tensor's rows, one after another */
    else if (R->lender && tps_str_chunks_has(&R->lender->strs, check))
        ck = check; /* the directory's: the report takes its strings over (verify.c) */
    else
        ck = tps_str_keep(&R->strs, check);
    for (size_t k = 0; k < R->nkinds && !kd; k++)
        if (!strcmp(R->kinds[k], kind)) kd = R->kinds[k];
    if (!kd && R->nkinds < sizeof R->kinds / sizeof R->kinds[0] && (kd = tps_strdup(kind)))
        R->kinds[R->nkinds++] = kd;
    if (!kd) kd = tps_str_keep(&R->strs, kind);
    if (!ck || !kd) {
        free(note);
        return -1;
    }
    tps_verify_row *r = tps_va_row(R, R->n);
    r->check = ck;
    r->kind = kd;
    r->max_abs_err = err;
    r->tolerance = tol;
    r->wrong = wrong;
    r->total = total;
    r->ok = ok;
    r->note = note;
    R->n++;
    if (!ok) R->ok = 0;
    return 0;
}

size_t tps_verify_report_kinds(const tps_verify_report *R, tps_verify_kind_count *kinds, size_t cap,
                               unsigned *passed, unsigned *failed)
{
    size_t nk = 0;
    *passed = *failed = 0;
    for (size_t i = 0; i < R->n; i++) {
        const tps_verify_row *r = tps_va_row(R, i);
        if (r->ok) ++*passed;
        else ++*failed;
        size_t k;
        for (k = 0; k < nk; k++)
            if (!strcmp(kinds[k].kind, r->kind)) break;
        if (k == nk && nk < cap) kinds[nk++] = (tps_verify_kind_count){r->kind, 0, 0};
        if (k < nk) {
            if (r->ok) kinds[k].passed++;
            else kinds[k].failed++;
        }
    }
    /* kinds in a fixed order, unknown ones after */
    static const char *const order[] = {"reconstruct", "replicated", "whole", "crc", "colwise",
                                        "rowwise",     "embedding",  "mlp",   "attn"};
    size_t placed = 0;
    for (size_t oi = 0; oi < sizeof order / sizeof order[0]; oi++)
        for (size_t k = placed; k < nk; k++)
            if (!strcmp(kinds[k].kind, order[oi])) {
                tps_verify_kind_count t = kinds[placed];
                kinds[placed++] = kinds[k];
                kinds[k] = t;
                break;
            }
    return nk;
}
