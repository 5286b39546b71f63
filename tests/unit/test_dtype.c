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

int main(void)
{
    RUN(widen_narrow_roundtrip_every_value);
    RUN(narrow_refuses_what_no_widening_makes);
    TEST_EXIT();
}
