/* crc.c - CRC32 (the zlib/gzip polynomial) at memory speed. zlib's table
 * CRC runs near 2 GB/s, slower than the copy it guards; on x86-64 with
 * PCLMULQDQ this folds 64 bytes per step with carry-less multiplies (the
 * method of Intel's "Fast CRC Computation for Generic Polynomials Using
 * PCLMULQDQ", as in Chromium's zlib), then hands the tail to zlib. Results
 * are identical to zlib's crc32_z; tests/unit/test_crc.c checks that. */
#include "internal.h"

#include <zlib.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

/* Both folds end the same way: 64 bytes of state (x1..x4, consecutive
 * 16-byte blocks) folded to 128 bits, the remaining 16-byte blocks folded in,
 * then 128 -> 64 -> 32 bits by Barrett reduction. len < 256, a multiple of 16. */
static inline __attribute__((always_inline, target("pclmul,sse4.1"))) uint32_t fold_finish(__m128i x1, __m128i x2,
                                                                      __m128i x3, __m128i x4,
                                                                      const unsigned char *buf,
                                                                      size_t len)
{
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009e, 0x01751997d0);
    const __m128i k5k0 = _mm_set_epi64x(0, 0x0163cd6124);
    const __m128i poly = _mm_set_epi64x(0x01f7011641, 0x01db710641);
    __m128i x0, x5;
    /* Fold 512 bits into 128. */
    x0 = k3k4;
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);
    while (len >= 16) {
        x2 = _mm_loadu_si128((const __m128i *)buf);
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
        buf += 16;
        len -= 16;
    }
    /* 128 -> 64 bits. */
    x2 = _mm_clmulepi64_si128(x1, x0, 0x10);
    x3 = _mm_setr_epi32(~0, 0, ~0, 0);
    x1 = _mm_srli_si128(x1, 8);
    x1 = _mm_xor_si128(x1, x2);
    x0 = k5k0;
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, x3);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    /* Barrett reduction to 32 bits. */
    x0 = poly;
    x2 = _mm_and_si128(x1, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x10);
    x2 = _mm_and_si128(x2, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}

__attribute__((target("pclmul,sse4.1"))) static uint32_t crc_fold(const unsigned char *buf, size_t len,
                                                                   uint32_t crc)
{
    /* len >= 64 and a multiple of 16; crc is the pre-inverted state. */
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596, 0x0154442bd4);
    __m128i x0, x1, x2, x3, x4, x5, x6, x7, x8, y5, y6, y7, y8;

    x1 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
    x2 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
    x3 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
    x4 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    x0 = k1k2;
    buf += 64;
    len -= 64;
    while (len >= 64) {
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x6 = _mm_clmulepi64_si128(x2, x0, 0x00);
        x7 = _mm_clmulepi64_si128(x3, x0, 0x00);
        x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x2 = _mm_clmulepi64_si128(x2, x0, 0x11);
        x3 = _mm_clmulepi64_si128(x3, x0, 0x11);
        x4 = _mm_clmulepi64_si128(x4, x0, 0x11);
        y5 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
        y6 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
        y7 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
        y8 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), y5);
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), y6);
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), y7);
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), y8);
        buf += 64;
        len -= 64;
    }
    return fold_finish(x1, x2, x3, x4, buf, len);
}

/* The same fold four times wider: four zmm registers hold 256 bytes, each
 * 128-bit lane folds across 2048 bits (constants x^(2048+32) and x^(2048-32)
 * mod P, bit-reflected and shifted, derived as the 512-bit ones above), then
 * the four are folded into one 64-byte state and handed to the 128-bit code
 * path below as its x1..x4. len >= 256 and a multiple of 16. */
__attribute__((target("avx512f,avx512vl,vpclmulqdq,pclmul,sse4.1"))) static uint32_t
crc_fold512(const unsigned char *buf, size_t len, uint32_t crc)
{
    const __m512i k2048 = _mm512_broadcast_i32x4(_mm_set_epi64x(0x1322d1430, 0x11542778a));
    const __m512i k512 = _mm512_broadcast_i32x4(_mm_set_epi64x(0x01c6e41596, 0x0154442bd4));
    __m512i z0 = _mm512_loadu_si512((const void *)(buf + 0x00));
    __m512i z1 = _mm512_loadu_si512((const void *)(buf + 0x40));
    __m512i z2 = _mm512_loadu_si512((const void *)(buf + 0x80));
    __m512i z3 = _mm512_loadu_si512((const void *)(buf + 0xC0));
    z0 = _mm512_xor_si512(z0, _mm512_zextsi128_si512(_mm_cvtsi32_si128((int)crc)));
    buf += 256;
    len -= 256;
#define FOLD512(z, k, next)                                                                  \
    _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(z, k, 0x00),                          \
                              _mm512_clmulepi64_epi128(z, k, 0x11), next, 0x96)
    while (len >= 256) {
        z0 = FOLD512(z0, k2048, _mm512_loadu_si512((const void *)(buf + 0x00)));
        z1 = FOLD512(z1, k2048, _mm512_loadu_si512((const void *)(buf + 0x40)));
        z2 = FOLD512(z2, k2048, _mm512_loadu_si512((const void *)(buf + 0x80)));
        z3 = FOLD512(z3, k2048, _mm512_loadu_si512((const void *)(buf + 0xC0)));
        buf += 256;
        len -= 256;
    }
    z1 = FOLD512(z0, k512, z1);
    z2 = FOLD512(z1, k512, z2);
    z3 = FOLD512(z2, k512, z3);
#undef FOLD512
    __m128i x1, x2, x3, x4;
    x1 = _mm512_extracti32x4_epi32(z3, 0);
    x2 = _mm512_extracti32x4_epi32(z3, 1);
    x3 = _mm512_extracti32x4_epi32(z3, 2);
    x4 = _mm512_extracti32x4_epi32(z3, 3);
    return fold_finish(x1, x2, x3, x4, buf, len);
}

static int have_vpclmul(void)
{
    static int v = -1;
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
            __builtin_cpu_supports("vpclmulqdq") && __builtin_cpu_supports("pclmul");
    }
    return v;
}

static int have_clmul(void)
{
    static int v = -1;
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    }
    return v;
}
#endif

/* The shortest buffer the 512-bit fold takes: below it the 128-bit fold is
 * as fast (the wide fold's fixed cost: folding 256 bytes of state down to
 * 64). Strided splits take a CRC a row run (GPTQ's [in/8, out] cut along
 * out: runs of 256 B to 3 KiB). fold_finish is inlined into each fold so
 * that it is VEX-encoded after the 512-bit loop: called as a legacy-SSE
 * function with the zmm state dirty, it cost ~200 ns a call (1 GB/s on
 * 256-byte buffers, 2.9 GB/s on 1 KiB; inlined 5 and 8.4 GB/s). */
#define WIDE_MIN 512u

/* impl: 0 zlib, 1 PCLMULQDQ, 2 VPCLMULQDQ; one the CPU lacks falls back to
 * the next simpler one. Tests check each against zlib. */
uint32_t tps_crc32_impl(int impl, uint32_t crc, const void *data, size_t len)
{
    const unsigned char *buf = data;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (impl >= 2 && len >= 256 && have_vpclmul()) {
        size_t n = len & ~(size_t)15;
        crc = ~crc_fold512(buf, n, ~crc);
        buf += n;
        len -= n;
    } else if (impl >= 1 && len >= 64 && have_clmul()) {
        size_t n = len & ~(size_t)15;
        crc = ~crc_fold(buf, n, ~crc);
        buf += n;
        len -= n;
    }
#else
    (void)impl;
#endif
    return (uint32_t)crc32_z(crc, buf, len);
}

uint32_t tps_crc32(uint32_t crc, const void *data, size_t len)
{
    return tps_crc32_impl(len >= WIDE_MIN ? 2 : 1, crc, data, len);
}

uint32_t tps_crc32_zlib(uint32_t crc, const void *data, size_t len)
{
    return (uint32_t)crc32_z(crc, (const unsigned char *)data, len);
}

const char *tps_build_features(void)
{
#ifdef _OPENMP
#define TPS_F_OMP "openmp"
#else
#define TPS_F_OMP "no-openmp"
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    return have_vpclmul() ? TPS_F_OMP " crc32-vpclmul" : have_clmul() ? TPS_F_OMP " crc32-pclmul" : TPS_F_OMP " crc32-zlib";
#else
    return TPS_F_OMP " crc32-zlib";
#endif
}
