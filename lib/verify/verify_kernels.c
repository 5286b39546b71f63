/* verify_kernels.c - the numeric kernels of verify: f32 conversions, the
 * dot products of weight rows against input rows, rounding. */
#include "verify_int.h"

#include <errno.h>
#include <fnmatch.h>
#include <math.h>

/* ------------------------------------------------------------------ numeric kernels */

/* One weight row (f32) against nb input rows: y[b * ys] = sum_i X[b][i] w[i]
 * and, when s is given, s[b * ys] = sum_i |X[b][i] w[i]|. The summation order
 * depends only on n (8 lanes, a fixed tail placement and a fixed lane tree),
 * never on alignment or threads, so equal inputs give equal bits: a colwise
 * shard row and the same source row produce the same output. */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

#define hsum8(a) ((((a)[0] + (a)[1]) + ((a)[2] + (a)[3])) + (((a)[4] + (a)[5]) + ((a)[6] + (a)[7])))

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) &&                             \
    !defined(__SANITIZE_ADDRESS__)
#define TPS_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TPS_CLONES
#endif

/* The kernel, once for f32 rows and once for raw little-endian BF16 rows
 * widened in registers (exact), so BF16 weights are never stored as f32. */
#define LOAD8_F32(dst, w, i) memcpy(&(dst), (const float *)(w) + (i), 32)
#define LOAD1_F32(w, i) (((const float *)(w))[i])
typedef uint16_t v8u16 __attribute__((vector_size(16)));
typedef uint32_t v8u32 __attribute__((vector_size(32)));
#define LOAD8_BF16(dst, w, i)                                                                      \
    do {                                                                                           \
        v8u16 h_;                                                                                  \
        memcpy(&h_, (const unsigned char *)(w) + 2 * (i), 16);                                     \
        (dst) = (v8f)(__builtin_convertvector(h_, v8u32) << 16);                                   \
    } while (0)
static inline float load1_bf16(const void *w, size_t i)
{
    const unsigned char *p = (const unsigned char *)w + 2 * i;
    uint32_t u = ((uint32_t)p[0] | ((uint32_t)p[1] << 8)) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
#define LOAD1_BF16(w, i) load1_bf16((w), (i))

#define DEFINE_DOT(NAME, LOAD8, LOAD1)                                                             \
    TPS_CLONES                                                                                     \
    void NAME(const void *w, size_t n, const float *X, size_t ldx, int nb, float *y,        \
                     size_t ys, float *s)                                                          \
    {                                                                                              \
        size_t n8 = n & ~(size_t)7;                                                                \
        const v8i mask = {0x7fffffff, 0x7fffffff, 0x7fffffff, 0x7fffffff,                          \
                          0x7fffffff, 0x7fffffff, 0x7fffffff, 0x7fffffff};                         \
        int b = 0;                                                                                 \
        for (; b + 4 <= nb; b += 4) {                                                              \
            const float *x0 = X + (size_t)b * ldx, *x1 = x0 + ldx, *x2 = x1 + ldx, *x3 = x2 + ldx; \
            v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};    \
            size_t i = 0;                                                                          \
            if (s) {                                                                               \
                for (; i < n8; i += 8) {                                                           \
                    v8f wv, xv, p;                                                                 \
                    LOAD8(wv, w, i);                                                               \
                    memcpy(&xv, x0 + i, 32);                                                       \
                    p = xv * wv;                                                                   \
                    a0 += p;                                                                       \
                    s0 += (v8f)((v8i)p & mask);                                                    \
                    memcpy(&xv, x1 + i, 32);                                                       \
                    p = xv * wv;                                                                   \
                    a1 += p;                                                                       \
                    s1 += (v8f)((v8i)p & mask);                                                    \
                    memcpy(&xv, x2 + i, 32);                                                       \
                    p = xv * wv;                                                                   \
                    a2 += p;                                                                       \
                    s2 += (v8f)((v8i)p & mask);                                                    \
                    memcpy(&xv, x3 + i, 32);                                                       \
                    p = xv * wv;                                                                   \
                    a3 += p;                                                                       \
                    s3 += (v8f)((v8i)p & mask);                                                    \
                }                                                                                  \
            } else {                                                                               \
                for (; i < n8; i += 8) {                                                           \
                    v8f wv, xv;                                                                    \
                    LOAD8(wv, w, i);                                                               \
                    memcpy(&xv, x0 + i, 32);                                                       \
                    a0 += xv * wv;                                                                 \
                    memcpy(&xv, x1 + i, 32);                                                       \
                    a1 += xv * wv;                                                                 \
                    memcpy(&xv, x2 + i, 32);                                                       \
                    a2 += xv * wv;                                                                 \
                    memcpy(&xv, x3 + i, 32);                                                       \
                    a3 += xv * wv;                                                                 \
                }                                                                                  \
            }                                                                                      \
            for (size_t k = 0; i < n; i++, k++) {                                                  \
                float wi = LOAD1(w, i);                                                            \
                float p0 = x0[i] * wi, p1 = x1[i] * wi, p2 = x2[i] * wi, p3 = x3[i] * wi;          \
                a0[k] += p0;                                                                       \
                a1[k] += p1;                                                                       \
                a2[k] += p2;                                                                       \
                a3[k] += p3;                                                                       \
                s0[k] += fabsf(p0);                                                                \
                s1[k] += fabsf(p1);                                                                \
                s2[k] += fabsf(p2);                                                                \
                s3[k] += fabsf(p3);                                                                \
            }                                                                                      \
            y[(size_t)b * ys] = hsum8(a0);                                                         \
            y[(size_t)(b + 1) * ys] = hsum8(a1);                                                   \
            y[(size_t)(b + 2) * ys] = hsum8(a2);                                                   \
            y[(size_t)(b + 3) * ys] = hsum8(a3);                                                   \
            if (s) {                                                                               \
                s[(size_t)b * ys] = hsum8(s0);                                                     \
                s[(size_t)(b + 1) * ys] = hsum8(s1);                                               \
                s[(size_t)(b + 2) * ys] = hsum8(s2);                                               \
                s[(size_t)(b + 3) * ys] = hsum8(s3);                                               \
            }                                                                                      \
        }                                                                                          \
        for (; b < nb; b++) {                                                                      \
            const float *x0 = X + (size_t)b * ldx;                                                 \
            v8f a0 = {0}, s0 = {0};                                                                \
            size_t i = 0;                                                                          \
            for (; i < n8; i += 8) {                                                               \
                v8f wv, xv, p;                                                                     \
                LOAD8(wv, w, i);                                                                   \
                memcpy(&xv, x0 + i, 32);                                                           \
                p = xv * wv;                                                                       \
                a0 += p;                                                                           \
                s0 += (v8f)((v8i)p & mask);                                                        \
            }                                                                                      \
            for (size_t k = 0; i < n; i++, k++) {                                                  \
                float p = x0[i] * LOAD1(w, i);                                                     \
                a0[k] += p;                                                                        \
                s0[k] += fabsf(p);                                                                 \
            }                                                                                      \
            y[(size_t)b * ys] = hsum8(a0);                                                         \
            if (s) s[(size_t)b * ys] = hsum8(s0);                                                  \
        }                                                                                          \
    }

DEFINE_DOT(tps_vk_dot_rows, LOAD8_F32, LOAD1_F32)
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
DEFINE_DOT(tps_vk_dot_rows_bf16, LOAD8_BF16, LOAD1_BF16)
#endif

/* BF16 is the top half of an f32: widen 8 at a time (vectorizes). */
TPS_CLONES
void tps_vk_bf16_to_f32(const unsigned char *p, float *dst, size_t n)
{
    size_t i = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    for (; i + 8 <= n; i += 8) {
        uint16_t h[8];
        uint32_t u[8];
        memcpy(h, p + 2 * i, 16);
        for (int k = 0; k < 8; k++) u[k] = (uint32_t)h[k] << 16;
        memcpy(dst + i, u, 32);
    }
#endif
    for (; i < n; i++) {
        uint32_t u = ((uint32_t)p[2 * i] | ((uint32_t)p[2 * i + 1] << 8)) << 16;
        memcpy(&dst[i], &u, 4);
    }
}

/* Exact conversion of n elements to f32; BF16 and F32 inline, the rest through
 * the dtype module. 0 ok, -1 not a float dtype. */
int tps_vk_to_f32(tps_dtype d, const void *src, float *dst, size_t n)
{
    if (d == TPS_BF16) {
        tps_vk_bf16_to_f32(src, dst, n);
        return 0;
    }
    if (d == TPS_F32) {
        memcpy(dst, src, n * 4);
        return 0;
    }
    return tps_to_f32(d, src, dst, n);
}

/* Round to the operand dtype of a GEMM (round to nearest even), as an
 * inference kernel stores its activations; identity for other dtypes. */
float tps_vk_round_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return f; /* inf, nan */
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}
float tps_vk_round_f16(float f)
{
    if (!isfinite(f)) return f;
    float a = fabsf(f);
    if (a >= 65520.0f) return copysignf(INFINITY, f);
    if (a < 6.103515625e-05f) { /* subnormal f16: fixed step 2^-24 */
        float q = nearbyintf(a * 16777216.0f) / 16777216.0f;
        return copysignf(q, f);
    }
    int e;
    frexpf(a, &e); /* a = m 2^e, m in [0.5, 1) */
    float step = ldexpf(1.0f, e - 11);
    return copysignf(nearbyintf(a / step) * step, f);
}
float tps_vk_round_to(tps_dtype d, float f)
{
    return d == TPS_BF16 ? tps_vk_round_bf16(f) : d == TPS_F16 ? tps_vk_round_f16(f) : f;
}
float tps_vk_silu(float g)
{
    return g / (1.0f + expf(-g));
}
