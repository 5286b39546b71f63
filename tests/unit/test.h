/* test.h - the tiny harness every C unit test uses. Each TEST prints one
 * "ok - name" or "not ok - name" line; tests/run.sh counts them. */
#ifndef TPS_TEST_H
#define TPS_TEST_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int t_fail_, t_cur_fail_;
#define CHECK(cond)                                                                 \
    do {                                                                            \
        if (!(cond)) {                                                              \
            t_cur_fail_++;                                                          \
            printf("#   %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);       \
        }                                                                           \
    } while (0)
#define CHECK_MSG(cond, ...)                                                        \
    do {                                                                            \
        if (!(cond)) {                                                              \
            t_cur_fail_++;                                                          \
            printf("#   %s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);       \
            printf(__VA_ARGS__);                                                    \
            printf("\n");                                                           \
        }                                                                           \
    } while (0)
#define RUN(fn)                                                                     \
    do {                                                                            \
        t_cur_fail_ = 0;                                                            \
        fn();                                                                       \
        printf("%s - %s\n", t_cur_fail_ ? "not ok" : "ok", #fn);                     \
        if (t_cur_fail_) t_fail_++;                                                 \
        fflush(stdout);                                                             \
    } while (0)
#define TEST_EXIT() return t_fail_ ? 1 : 0

/* xorshift64: the tests' reproducible random numbers (t_rng_ their seed). */
#include <stdint.h>
static uint64_t t_rng_ = 0x9E3779B97F4A7C15ull;
static inline uint64_t t_rand(void)
{
    t_rng_ ^= t_rng_ << 13;
    t_rng_ ^= t_rng_ >> 7;
    t_rng_ ^= t_rng_ << 17;
    return t_rng_;
}
#endif
