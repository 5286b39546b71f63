/* dtype.c - the safetensors dtype table and exact conversions to f32. */
#include "internal.h"

#include <math.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* Order is the safetensors enum order, which is also increasing alignment. */
static const struct {
    const char *name;
    unsigned bits;
    int is_float;
} dtypes[TPS_DTYPE_COUNT_] = {
    [TPS_BOOL] = {"BOOL", 8, 0},           [TPS_F4] = {"F4", 4, 0},
    [TPS_F6_E2M3] = {"F6_E2M3", 6, 0},     [TPS_F6_E3M2] = {"F6_E3M2", 6, 0},
    [TPS_U8] = {"U8", 8, 0},               [TPS_I8] = {"I8", 8, 0},
    [TPS_F8_E5M2] = {"F8_E5M2", 8, 1},     [TPS_F8_E4M3] = {"F8_E4M3", 8, 1},
    [TPS_F8_E8M0] = {"F8_E8M0", 8, 1},     [TPS_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8, 1},
    [TPS_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8, 1},
    [TPS_I16] = {"I16", 16, 0},            [TPS_U16] = {"U16", 16, 0},
    [TPS_F16] = {"F16", 16, 1},            [TPS_BF16] = {"BF16", 16, 1},
    [TPS_I32] = {"I32", 32, 0},            [TPS_U32] = {"U32", 32, 0},
    [TPS_F32] = {"F32", 32, 1},            [TPS_C64] = {"C64", 64, 0},
    [TPS_F64] = {"F64", 64, 1},            [TPS_I64] = {"I64", 64, 0},
    [TPS_U64] = {"U64", 64, 0},
};

const char *tps_dtype_name(tps_dtype d)
{
    return (unsigned)d < TPS_DTYPE_COUNT_ ? dtypes[d].name : "?";
}

int tps_dtype_from_name(const char *name, tps_dtype *out)
{
    for (int i = 0; i < TPS_DTYPE_COUNT_; i++)
        if (strcmp(dtypes[i].name, name) == 0) {
            *out = (tps_dtype)i;
            return 0;
        }
    return -1;
}

unsigned tps_dtype_bits(tps_dtype d) { return (unsigned)d < TPS_DTYPE_COUNT_ ? dtypes[d].bits : 0; }

int tps_dtype_is_float(tps_dtype d) { return (unsigned)d < TPS_DTYPE_COUNT_ && dtypes[d].is_float; }

static float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float half_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
    if (exp == 0) {
        float v = ldexpf((float)man, -24);
        return sign ? -v : v;
    }
    if (exp == 31) return f32_from_bits(sign | 0x7F800000u | (man << 13));
    return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

/* Generic minifloat decoder for the 8-bit formats. */
static float f8_decode(uint8_t b, int ebits, int mbits, int bias, int fnuz, int has_inf)
{
    if (fnuz && b == 0x80) return NAN;
    int sign = b >> 7;
    int e = (b >> mbits) & ((1 << ebits) - 1);
    int m = b & ((1 << mbits) - 1);
    if (!fnuz && has_inf && e == (1 << ebits) - 1) return m ? NAN : (sign ? -INFINITY : INFINITY);
    if (!fnuz && !has_inf && e == (1 << ebits) - 1 && m == (1 << mbits) - 1) return NAN; /* E4M3FN */
    float v = e ? ldexpf(1.0f + (float)m / (float)(1 << mbits), e - bias)
                : ldexpf((float)m / (float)(1 << mbits), 1 - bias);
    return sign ? -v : v;
}

static float lut[5][256];
static int lut_ready;

static void lut_init(void)
{
    /* Benign race: every thread computes identical tables. */
    for (int i = 0; i < 256; i++) {
        lut[0][i] = f8_decode((uint8_t)i, 5, 2, 15, 0, 1); /* E5M2 */
        lut[1][i] = f8_decode((uint8_t)i, 4, 3, 7, 0, 0);  /* E4M3 (FN) */
        lut[2][i] = i == 255 ? NAN : ldexpf(1.0f, i - 127); /* E8M0 */
        lut[3][i] = f8_decode((uint8_t)i, 4, 3, 8, 1, 0);  /* E4M3FNUZ */
        lut[4][i] = f8_decode((uint8_t)i, 5, 2, 16, 1, 0); /* E5M2FNUZ */
    }
    __atomic_store_n(&lut_ready, 1, __ATOMIC_RELEASE);
}

int tps_to_f32(tps_dtype d, const void *src, float *dst, size_t n)
{
    const unsigned char *s = src;
    int t = -1;
    switch (d) {
    case TPS_F32: memcpy(dst, s, n * 4); return 0;
    case TPS_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = f32_from_bits((uint32_t)h << 16);
        }
        return 0;
    case TPS_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = half_to_f32(h);
        }
        return 0;
    case TPS_F64:
        for (size_t i = 0; i < n; i++) {
            double v;
            memcpy(&v, s + 8 * i, 8);
            dst[i] = (float)v;
        }
        return 0;
    case TPS_F8_E5M2: t = 0; break;
    case TPS_F8_E4M3: t = 1; break;
    case TPS_F8_E8M0: t = 2; break;
    case TPS_F8_E4M3FNUZ: t = 3; break;
    case TPS_F8_E5M2FNUZ: t = 4; break;
    default: return -1;
    }
    if (!__atomic_load_n(&lut_ready, __ATOMIC_ACQUIRE)) lut_init();
    for (size_t i = 0; i < n; i++) dst[i] = lut[t][s[i]];
    return 0;
}

/* f32 bits -> bf16, round to nearest even (NaN stays NaN). */
static uint16_t bf16_from_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* f32 -> IEEE half, round to nearest even. */
static uint16_t half_from_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow -> inf */
    if (a < 0x38800000u) {                                    /* subnormal or zero */
        float m;
        memcpy(&m, &a, 4);
        m *= 16777216.0f; /* 2^24: half subnormals are multiples of 2^-24 */
        return (uint16_t)(sign | (uint32_t)lrintf(m));
    }
    uint32_t r = a - 0x38000000u; /* rebias 127 -> 15 */
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

void tps_encode_value(tps_dtype d, double v, unsigned char *out)
{
    float f = (float)v;
    memset(out, 0, 8);
    if (d == TPS_F32) {
        memcpy(out, &f, 4);
    } else if (d == TPS_BF16) {
        uint16_t h = bf16_from_f32(f);
        memcpy(out, &h, 2);
    } else if (d == TPS_F16) {
        uint16_t h = half_from_f32(f);
        memcpy(out, &h, 2);
    } else if (d == TPS_F64) {
        memcpy(out, &v, 8);
    } else if (d == TPS_I32 || d == TPS_U32) {
        /* a word pattern (a pad piece's codes): its 32 bits, however signed */
        uint32_t w = v < 0 ? (uint32_t)(int32_t)v : (uint32_t)v;
        memcpy(out, &w, 4);
    } else if (d == TPS_I64) {
        int64_t w = (int64_t)v;
        memcpy(out, &w, 8);
    } else if (d == TPS_U8 || d == TPS_I8) {
        out[0] = (unsigned char)(int)v;
    }
}

/* ------------------------------------------------------------------ widening to F32 */

int tps_cast_ok(tps_dtype d)
{
    return d == TPS_F32 || d == TPS_BF16 || d == TPS_F16 || d == TPS_F8_E8M0;
}

/* E8M0 is an exponent alone: 2^(e - 127), 0xFF NaN; e = 0 is an F32 subnormal. */
static uint32_t e8m0_widen(uint8_t e)
{
    return e == 0xFF ? 0x7FC00000u : e == 0 ? 0x00400000u : (uint32_t)e << 23;
}

static uint32_t half_widen(uint16_t h)
{
    float f = half_to_f32(h);
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

void tps_widen_f32(tps_dtype d, const void *src, void *dst, size_t n)
{
    const unsigned char *s = src;
    unsigned char *o = dst;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        switch (d) {
        case TPS_BF16: u = ((uint32_t)s[2 * i] | (uint32_t)s[2 * i + 1] << 8) << 16; break;
        case TPS_F16: u = half_widen((uint16_t)(s[2 * i] | s[2 * i + 1] << 8)); break;
        case TPS_F8_E8M0: u = e8m0_widen(s[i]); break;
        default:
            u = (uint32_t)s[4 * i] | (uint32_t)s[4 * i + 1] << 8 | (uint32_t)s[4 * i + 2] << 16 |
                (uint32_t)s[4 * i + 3] << 24;
        }
        o[4 * i] = (unsigned char)u;
        o[4 * i + 1] = (unsigned char)(u >> 8);
        o[4 * i + 2] = (unsigned char)(u >> 16);
        o[4 * i + 3] = (unsigned char)(u >> 24);
    }
}

int tps_narrow_f32(tps_dtype d, const void *src, void *dst, size_t n, size_t *bad)
{
    const unsigned char *s = src;
    unsigned char *o = dst;
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)s[4 * i] | (uint32_t)s[4 * i + 1] << 8 |
                     (uint32_t)s[4 * i + 2] << 16 | (uint32_t)s[4 * i + 3] << 24;
        int ok = 1;
        switch (d) {
        case TPS_BF16:
            ok = (u & 0xFFFFu) == 0;
            o[2 * i] = (unsigned char)(u >> 16);
            o[2 * i + 1] = (unsigned char)(u >> 24);
            break;
        case TPS_F16: {
            uint16_t h;
            if ((u & 0x7F800000u) == 0x7F800000u) { /* inf, NaN: keep the payload */
                h = (uint16_t)(((u >> 16) & 0x8000u) | 0x7C00u | ((u & 0x7FFFFFu) >> 13));
            } else {
                float f;
                memcpy(&f, &u, 4);
                h = half_from_f32(f);
            }
            ok = half_widen(h) == u;
            o[2 * i] = (unsigned char)h;
            o[2 * i + 1] = (unsigned char)(h >> 8);
            break;
        }
        case TPS_F8_E8M0: {
            uint8_t e = u == 0x7FC00000u ? 0xFF : u == 0x00400000u ? 0 : (uint8_t)(u >> 23);
            ok = e8m0_widen(e) == u;
            o[i] = e;
            break;
        }
        default: memcpy(o + 4 * i, s + 4 * i, 4);
        }
        if (!ok) {
            if (bad) *bad = i;
            return -1;
        }
    }
    return 0;
}

/* One element at a time, in 32 x 32 blocks (rows of in and of out both
 * stay in cache across a block). */
static void transpose_scalar(char *out, size_t ost, const char *in, size_t ist, uint64_t r0,
                             uint64_t r1, uint64_t c0, uint64_t c1, size_t es)
{
    enum { T = 32 };
    for (uint64_t a0 = r0; a0 < r1; a0 += T)
        for (uint64_t b0 = c0; b0 < c1; b0 += T) {
            uint64_t a1 = a0 + T < r1 ? a0 + T : r1, b1 = b0 + T < c1 ? b0 + T : c1;
            for (uint64_t a = a0; a < a1; a++)
                for (uint64_t b = b0; b < b1; b++) {
                    const char *x = in + a * ist + b * es;
                    char *y = out + b * ost + a * es;
                    switch (es) {
                    case 1: *y = *x; break;
                    case 2: memcpy(y, x, 2); break;
                    case 4: memcpy(y, x, 4); break;
                    default: memcpy(y, x, es);
                    }
                }
        }
}

#ifdef __SSE2__
/* rows a..a+7 of in (8 x 16 bytes) as columns of out */
static inline void tr8x8_u16(char *out, size_t ost, const char *in, size_t ist)
{
    __m128i r0 = _mm_loadu_si128((const __m128i *)(const void *)(in + 0 * ist));
    __m128i r1 = _mm_loadu_si128((const __m128i *)(const void *)(in + 1 * ist));
    __m128i r2 = _mm_loadu_si128((const __m128i *)(const void *)(in + 2 * ist));
    __m128i r3 = _mm_loadu_si128((const __m128i *)(const void *)(in + 3 * ist));
    __m128i r4 = _mm_loadu_si128((const __m128i *)(const void *)(in + 4 * ist));
    __m128i r5 = _mm_loadu_si128((const __m128i *)(const void *)(in + 5 * ist));
    __m128i r6 = _mm_loadu_si128((const __m128i *)(const void *)(in + 6 * ist));
    __m128i r7 = _mm_loadu_si128((const __m128i *)(const void *)(in + 7 * ist));
    __m128i t0 = _mm_unpacklo_epi16(r0, r1), t1 = _mm_unpackhi_epi16(r0, r1);
    __m128i t2 = _mm_unpacklo_epi16(r2, r3), t3 = _mm_unpackhi_epi16(r2, r3);
    __m128i t4 = _mm_unpacklo_epi16(r4, r5), t5 = _mm_unpackhi_epi16(r4, r5);
    __m128i t6 = _mm_unpacklo_epi16(r6, r7), t7 = _mm_unpackhi_epi16(r6, r7);
    __m128i u0 = _mm_unpacklo_epi32(t0, t2), u1 = _mm_unpackhi_epi32(t0, t2);
    __m128i u2 = _mm_unpacklo_epi32(t1, t3), u3 = _mm_unpackhi_epi32(t1, t3);
    __m128i u4 = _mm_unpacklo_epi32(t4, t6), u5 = _mm_unpackhi_epi32(t4, t6);
    __m128i u6 = _mm_unpacklo_epi32(t5, t7), u7 = _mm_unpackhi_epi32(t5, t7);
    _mm_storeu_si128((__m128i *)(void *)(out + 0 * ost), _mm_unpacklo_epi64(u0, u4));
    _mm_storeu_si128((__m128i *)(void *)(out + 1 * ost), _mm_unpackhi_epi64(u0, u4));
    _mm_storeu_si128((__m128i *)(void *)(out + 2 * ost), _mm_unpacklo_epi64(u1, u5));
    _mm_storeu_si128((__m128i *)(void *)(out + 3 * ost), _mm_unpackhi_epi64(u1, u5));
    _mm_storeu_si128((__m128i *)(void *)(out + 4 * ost), _mm_unpacklo_epi64(u2, u6));
    _mm_storeu_si128((__m128i *)(void *)(out + 5 * ost), _mm_unpackhi_epi64(u2, u6));
    _mm_storeu_si128((__m128i *)(void *)(out + 6 * ost), _mm_unpacklo_epi64(u3, u7));
    _mm_storeu_si128((__m128i *)(void *)(out + 7 * ost), _mm_unpackhi_epi64(u3, u7));
}
#endif

void tps_transpose(void *out_, size_t ost, const void *in_, size_t ist, uint64_t rows,
                   uint64_t cols, size_t es)
{
    char *out = out_;
    const char *in = in_;
#ifdef __SSE2__
    if (es == 2 && rows >= 8 && cols >= 8) {
        enum { T = 64 }; /* 64 x 64 blocks of 8 x 8 ones */
        uint64_t r8 = rows / 8 * 8, c8 = cols / 8 * 8;
        for (uint64_t a0 = 0; a0 < r8; a0 += T)
            for (uint64_t b0 = 0; b0 < c8; b0 += T) {
                uint64_t a1 = a0 + T < r8 ? a0 + T : r8, b1 = b0 + T < c8 ? b0 + T : c8;
                for (uint64_t a = a0; a < a1; a += 8)
                    for (uint64_t b = b0; b < b1; b += 8)
                        tr8x8_u16(out + b * ost + a * 2, ost, in + a * ist + b * 2, ist);
            }
        transpose_scalar(out, ost, in, ist, r8, rows, 0, cols, es); /* the last rows */
        transpose_scalar(out, ost, in, ist, 0, r8, c8, cols, es);   /* the last columns */
        return;
    }
#endif
    transpose_scalar(out, ost, in, ist, 0, rows, 0, cols, es);
}
