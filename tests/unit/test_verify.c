/* test_verify.c - the cpu communicator (uneven all-gather, rank-order
 * all-reduce) and the numeric contract (tolerance, shared inputs). */
#include <math.h>
#include <stdint.h>

#include "verify/comm.h"
#include "test.h"

static float frand(uint64_t *s)
{
    *s = tps_splitmix64(*s);
    return (float)((double)(*s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Uneven blocks, an empty one included: rank r's [rows, cols[r]] lands at its
 * column offset of the [rows, sum] result, whatever the sizes. */
static void allgather_uneven(void)
{
    static const uint64_t shapes[][8] = {
        {63, 63, 63, 61}, {3, 3, 3, 3, 3, 3, 2, 0}, {0, 5}, {7}, {1, 0, 0, 2},
    };
    static const int nr[] = {4, 8, 2, 1, 4};
    for (size_t s = 0; s < sizeof nr / sizeof nr[0]; s++) {
        int n = nr[s];
        tps_comm *c = tps_comm_cpu_new(n);
        CHECK(c != NULL);
        if (!c) return;
        CHECK(c->nranks == n && c->nlocal == n);
        for (uint64_t rows = 1; rows <= 5; rows += 2) {
            uint64_t total = 0;
            for (int r = 0; r < n; r++) total += shapes[s][r];
            float *in[8], *out = calloc(rows * total + 1, sizeof(float));
            float *outs[8];
            for (int r = 0; r < n; r++) {
                in[r] = malloc((rows * shapes[s][r] + 1) * sizeof(float));
                for (uint64_t b = 0; b < rows; b++)
                    for (uint64_t j = 0; j < shapes[s][r]; j++)
                        in[r][b * shapes[s][r] + j] = (float)(r * 100000 + b * 1000 + j);
                outs[r] = out;
            }
            CHECK(c->allgather(c, NULL, (const float *const *)in, shapes[s], rows, outs) == TPS_OK);
            int bad = 0;
            for (uint64_t b = 0; b < rows; b++) {
                uint64_t col = 0;
                for (int r = 0; r < n; r++)
                    for (uint64_t j = 0; j < shapes[s][r]; j++, col++)
                        if (out[b * total + col] != (float)(r * 100000 + b * 1000 + j)) bad++;
            }
            CHECK_MSG(bad == 0, "set %zu rows %llu: %d misplaced", s, (unsigned long long)rows,
                      bad);
            for (int r = 0; r < n; r++) free(in[r]);
            free(out);
        }
        tps_comm_free(c);
    }
}

/* Distinct output buffers per rank each get the whole result. */
static void allgather_every_rank(void)
{
    uint64_t cols[3] = {2, 0, 3};
    float a[4] = {1, 2, 3, 4}, b[1] = {0}, d[6] = {5, 6, 7, 8, 9, 10};
    float o0[10], o1[10], o2[10];
    const float *in[3] = {a, b, d};
    float *outs[3] = {o0, o1, o2};
    tps_comm *c = tps_comm_cpu_new(3);
    CHECK(c->allgather(c, NULL, in, cols, 2, outs) == TPS_OK);
    const float want[10] = {1, 2, 5, 6, 7, 3, 4, 8, 9, 10};
    for (int i = 0; i < 10; i++) CHECK(o0[i] == want[i] && o1[i] == want[i] && o2[i] == want[i]);
    tps_comm_free(c);
}

/* Sums in rank order: ((x0 + x1) + x2) + x3 bit for bit, on the small
 * (calling thread) and the large (one thread per rank) path alike, and the
 * same bits on every call. Values are chosen so other orders differ. */
static void allreduce_rank_order(void)
{
    for (int big = 0; big < 2; big++) {
        uint64_t n = big ? (1u << 18) + 3 : 1000;
        int nr = 4;
        tps_comm *c = tps_comm_cpu_new(nr);
        float *in[4], *out = malloc(n * sizeof(float)), *out2 = malloc(n * sizeof(float));
        float *outs[4] = {out, out, out, out}, *outs2[4] = {out2, NULL, NULL, NULL};
        uint64_t seed = 42 + (uint64_t)big;
        for (int r = 0; r < nr; r++) {
            in[r] = malloc(n * sizeof(float));
            for (uint64_t i = 0; i < n; i++) {
                float v = frand(&seed);
                in[r][i] = (r == 0 || r == 2) ? v * 1e8f : v; /* cancellation makes order visible */
            }
        }
        CHECK(c->allreduce(c, NULL, (const float *const *)in, n, outs) == TPS_OK);
        CHECK(c->allreduce(c, NULL, (const float *const *)in, n, outs2) == TPS_OK);
        uint64_t bad = 0, differ = 0;
        for (uint64_t i = 0; i < n; i++) {
            float want = ((in[0][i] + in[1][i]) + in[2][i]) + in[3][i];
            float other = ((in[0][i] + in[2][i]) + in[1][i]) + in[3][i];
            if (memcmp(&out[i], &want, 4)) bad++;
            if (memcmp(&out[i], &out2[i], 4)) bad++;
            if (want != other) differ++;
        }
        CHECK_MSG(bad == 0, "%s path: %llu elements not in rank order", big ? "threaded" : "serial",
                  (unsigned long long)bad);
        CHECK_MSG(differ > 0, "the test values do not distinguish summation orders");
        for (int r = 0; r < nr; r++) free(in[r]);
        free(out);
        free(out2);
        tps_comm_free(c);
    }
}

/* In place: out may be rank 0's buffer, as NCCL allows. */
static void allreduce_in_place(void)
{
    float a[3] = {1, 2, 3}, b[3] = {10, 20, 30};
    const float *in[2] = {a, b};
    float *outs[2] = {a, a};
    tps_comm *c = tps_comm_cpu_new(2);
    CHECK(c->allreduce(c, NULL, in, 3, outs) == TPS_OK);
    CHECK(a[0] == 11 && a[1] == 22 && a[2] == 33);
    tps_comm_free(c);
    CHECK(tps_comm_cpu_new(0) == NULL);
}

static void gamma_values(void)
{
    CHECK(tps_gamma(0) == 0);
    double u = ldexp(1.0, -24);
    CHECK(fabs(tps_gamma(1) - u / (1 - u)) < 1e-30);
    CHECK(fabs(tps_gamma(1000) - 1000 * u / (1 - 1000 * u)) < 1e-20);
    CHECK(tps_gamma(1000) < tps_gamma(1001));
    CHECK(isinf(tps_gamma(1u << 24)) && isinf(tps_gamma(UINT64_C(1) << 40)));
    CHECK(tps_tolerance(100, 8, 0) == 0);
    CHECK(tps_tolerance(100, 8, 1.0) > 2 * tps_gamma(108));
    CHECK(tps_tolerance(100, 8, 1.0) < 2.001 * tps_gamma(108));
    CHECK(tps_tolerance(100, 8, 2.0) > tps_tolerance(100, 8, 1.0));
}

/* The bound holds for what it promises: a dot product split over tp ranks in
 * f32, partials summed in rank order, against the one-pass f32 dot, for
 * lengths and tp that make the orders differ; and it is not vacuous: one
 * weight's exponent bit flipped (1.0 -> 3.0) in a 4096-long product is out.
 * (Low mantissa bits are below any rigorous bound: reconstruction catches
 * those, byte for byte.) */
static void tolerance_covers_sharded_sums(void)
{
    uint64_t seed = 7, fails = 0, trials = 0, exact = 0;
    static const int lens[] = {1, 7, 64, 1000, 4096, 14336};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        int n = lens[li];
        float *x = malloc(sizeof(float) * (size_t)n), *w = malloc(sizeof(float) * (size_t)n);
        for (int tp = 1; tp <= 8; tp++)
            for (int rep = 0; rep < 20; rep++) {
                for (int i = 0; i < n; i++) {
                    x[i] = tps_input_value(seed, (uint64_t)rep, (uint64_t)i);
                    w[i] = frand(&seed) * (rep % 2 ? 1e3f : 1e-3f);
                }
                float ref = 0, s = 0;
                for (int i = 0; i < n; i++) {
                    ref += x[i] * w[i];
                    s += fabsf(x[i] * w[i]);
                }
                float sh = 0;
                int c = (n + tp - 1) / tp;
                for (int r = 0; r < tp; r++) {
                    float part = 0;
                    int a = r * c < n ? r * c : n, b = (r + 1) * c < n ? (r + 1) * c : n;
                    for (int i = b - 1; i >= a; i--) part += x[i] * w[i]; /* another order */
                    sh += part;
                }
                double err = fabs((double)sh - (double)ref);
                if (err > tps_tolerance((uint64_t)n, tp, s)) fails++;
                if (err == 0) exact++;
                trials++;
            }
        free(x);
        free(w);
    }
    CHECK_MSG(fails == 0, "%llu of %llu sharded sums outside the bound", (unsigned long long)fails,
              (unsigned long long)trials);
    CHECK(exact < trials); /* the orders really differed */
    /* not vacuous */
    float x[4096], w[4096];
    for (int i = 0; i < 4096; i++) {
        x[i] = tps_input_value(1, 0, (uint64_t)i);
        w[i] = frand(&seed);
    }
    float ref = 0, s = 0, bad = 0;
    for (int i = 0; i < 4096; i++) ref += x[i] * w[i], s += fabsf(x[i] * w[i]);
    x[0] = 1.0f;
    w[0] = 1.0f;
    ref = 0;
    s = 0;
    for (int i = 0; i < 4096; i++) ref += x[i] * w[i], s += fabsf(x[i] * w[i]);
    w[0] = 3.0f;
    for (int i = 0; i < 4096; i++) bad += x[i] * w[i];
    CHECK_MSG(fabs((double)bad - ref) > tps_tolerance(4096, 8, s), "tolerance %g too loose for %g",
              tps_tolerance(4096, 8, s), fabs((double)bad - ref));
}

/* Shared inputs: in [-1, 1), multiples of 2^-8 (exact in BF16 and F16),
 * deterministic, and spread over both signs. */
static void inputs_exact_in_bf16(void)
{
    int neg = 0, pos = 0, bad = 0;
    for (uint64_t b = 0; b < 8; b++)
        for (uint64_t i = 0; i < 2000; i++) {
            float v = tps_input_value(123, b, i);
            if (!(v >= -1.0f && v < 1.0f)) bad++;
            if (v * 256.0f != floorf(v * 256.0f)) bad++;
            uint32_t u;
            memcpy(&u, &v, 4);
            if (u & 0xffff) bad++; /* low half zero: a BF16 value */
            if (v != tps_input_value(123, b, i)) bad++;
            neg += v < 0;
            pos += v > 0;
        }
    CHECK(bad == 0);
    CHECK(neg > 7000 && pos > 7000);
    CHECK(tps_input_value(1, 0, 0) != tps_input_value(2, 0, 0) ||
          tps_input_value(1, 0, 1) != tps_input_value(2, 0, 1));
    int inrange = 1;
    for (uint64_t b = 0; b < 100; b++) inrange &= tps_input_id(9, b, 250) < 250;
    CHECK(inrange);
    CHECK(tps_input_id(9, 0, 0) == 0);
}

int main(void)
{
    RUN(allgather_uneven);
    RUN(allgather_every_rank);
    RUN(allreduce_rank_order);
    RUN(allreduce_in_place);
    RUN(gamma_values);
    RUN(tolerance_covers_sharded_sums);
    RUN(inputs_exact_in_bf16);
    TEST_EXIT();
}
