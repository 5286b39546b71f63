/* Widening scales to F32 (serving layouts) must be exact and reversible for
 * every value of every dtype it applies to, and narrowing must refuse F32
 * bytes no widening could have made: a changed rank file must not narrow to
 * plausible source bytes and pass its CRC. */
#include "internal.h"
#include "test.h"

static void widen_narrow_roundtrip_every_value(void)
{
    static const tps_dtype ds[] = {TPS_BF16, TPS_F16, TPS_F8_E8M0};
    for (size_t k = 0; k < 3; k++) {
        tps_dtype d = ds[k];
        size_t es = tps_dtype_bits(d) / 8, n = es == 2 ? 65536 : 256;
        unsigned char *src = malloc(n * es), *wide = malloc(n * 4), *back = malloc(n * es);
        float *ref = malloc(n * sizeof *ref), *got = malloc(n * sizeof *got);
        for (size_t i = 0; i < n; i++) {
            src[i * es] = (unsigned char)i;
            if (es == 2) src[i * es + 1] = (unsigned char)(i >> 8);
        }
        tps_widen_f32(d, src, wide, n);
        size_t bad = 0;
        CHECK_MSG(tps_narrow_f32(d, wide, back, n, &bad) == 0, "%s: element %zu", tps_dtype_name(d), bad);
        CHECK_MSG(memcmp(src, back, n * es) == 0, "%s: bytes differ after the round trip",
                  tps_dtype_name(d));
        /* the widened values are the values tps_to_f32 reads (NaNs aside) */
        CHECK(tps_to_f32(d, src, ref, n) == 0);
        memcpy(got, wide, n * 4);
        size_t diff = 0;
        for (size_t i = 0; i < n; i++)
            if (!(ref[i] != ref[i] && got[i] != got[i]) && memcmp(&ref[i], &got[i], 4)) diff++;
        CHECK_MSG(diff == 0, "%s: %zu values differ from tps_to_f32", tps_dtype_name(d), diff);
        free(src);
        free(wide);
        free(back);
        free(ref);
        free(got);
    }
}

static void narrow_refuses_what_no_widening_makes(void)
{
    unsigned char w[4], o[2];
    size_t bad = 99;
    float f = 1.0f + 1.0f / 1024; /* not a BF16, not an E8M0; an F16 (10 mantissa bits) */
    memcpy(w, &f, 4);
    CHECK(tps_narrow_f32(TPS_BF16, w, o, 1, &bad) == -1 && bad == 0);
    CHECK(tps_narrow_f32(TPS_F8_E8M0, w, o, 1, &bad) == -1);
    CHECK(tps_narrow_f32(TPS_F16, w, o, 1, &bad) == 0);
    f = 1.0f + 1.0f / 4096; /* F16 cannot hold it */
    memcpy(w, &f, 4);
    CHECK(tps_narrow_f32(TPS_F16, w, o, 1, &bad) == -1);
    f = -2.0f; /* E8M0 has no sign */
    memcpy(w, &f, 4);
    CHECK(tps_narrow_f32(TPS_F8_E8M0, w, o, 1, &bad) == -1);
    f = 1e30f; /* beyond F16: would narrow to inf */
    memcpy(w, &f, 4);
    CHECK(tps_narrow_f32(TPS_F16, w, o, 1, &bad) == -1);
    CHECK(tps_cast_ok(TPS_BF16) && tps_cast_ok(TPS_F8_E8M0) && !tps_cast_ok(TPS_F8_E4M3) &&
          !tps_cast_ok(TPS_F64) && !tps_cast_ok(TPS_I32));
}

/* tps_transpose against the definition, element by element: every element
 * size, shapes on and off the 8 x 8 blocks (2-byte elements take them),
 * strides wider than a row (a matrix inside a larger one), and the bytes
 * around the output left alone. */
static void transpose_matches_the_definition(void)
{
    static const uint64_t dims[] = {1, 3, 7, 8, 9, 16, 63, 64, 65, 130};
    static const size_t sizes[] = {1, 2, 4, 8};
    int bad = 0;
    for (size_t si = 0; si < 4; si++)
        for (size_t i = 0; i < 10; i++)
            for (size_t j = 0; j < 10; j++) {
                size_t es = sizes[si];
                uint64_t R = dims[i], Cn = dims[j];
                size_t ist = (size_t)(Cn + 5) * es, ost = (size_t)(R + 3) * es;
                unsigned char *in = malloc(R * ist), *out = malloc(Cn * ost + 16);
                for (size_t k = 0; k < R * ist; k++) in[k] = (unsigned char)(k * 131 + 7);
                memset(out, 0xAB, Cn * ost + 16);
                tps_transpose(out, ost, in, ist, R, Cn, es);
                for (uint64_t c = 0; c < Cn; c++)
                    for (uint64_t r = 0; r < R; r++)
                        bad |= memcmp(out + c * ost + r * es, in + r * ist + c * es, es) != 0;
                for (uint64_t c = 0; c < Cn; c++) /* each out row's padding is untouched */
                    for (size_t b = (size_t)R * es; b < ost; b++) bad |= out[c * ost + b] != 0xAB;
                for (size_t b = Cn * ost; b < Cn * ost + 16; b++) bad |= out[b] != 0xAB;
                free(in);
                free(out);
            }
    CHECK(!bad);
}

int main(void)
{
    RUN(transpose_matches_the_definition);
    RUN(widen_narrow_roundtrip_every_value);
    RUN(narrow_refuses_what_no_widening_makes);
    TEST_EXIT();
}
