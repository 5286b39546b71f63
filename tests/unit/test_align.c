/* test_align.c - the data offset a rank file gets where its output shares
 * blocks with the source (split/align.c), and what a clone shares. */
#include "internal.h"
#include "test.h"

static void shareable_blocks(void)
{
    /* same residue: the whole blocks inside the run */
    CHECK(tps_kcopy_shareable(4096, 8192, 8192, 4096) == 8192);
    CHECK(tps_kcopy_shareable(100, 4196, 8192, 4096) == 4096); /* [4096, 8192) of [100, 8292) */
    CHECK(tps_kcopy_shareable(100, 4196, 4000, 4096) == 0);    /* no whole block */
    /* other residues share nothing */
    CHECK(tps_kcopy_shareable(100, 108, 1 << 20, 4096) == 0);
    CHECK(tps_kcopy_shareable(0, 0, 0, 4096) == 0);
}

static void lines_up_one_residue(void)
{
    /* every run at source offset = 1000 + its data offset: h = 1000 mod 4096 */
    tps_align_run r[3] = {{.src = 1000, .dst = 0, .len = 65536},
                          {.src = 1000 + 65536, .dst = 65536, .len = 4096 * 3},
                          {.src = 1000 + 200000, .dst = 200000, .len = 100000}};
    uint64_t sh, h = tps_align_data_offset(r, 3, 2384, 4096, 0, &sh);
    CHECK_MSG(h == 1000 + 4096, "h %llu", (unsigned long long)h);
    uint64_t want = 0;
    for (int i = 0; i < 3; i++) want += tps_kcopy_shareable(r[i].src, h + r[i].dst, r[i].len, 4096);
    CHECK_MSG(sh == want && sh > 0, "shared %llu, want %llu", (unsigned long long)sh,
              (unsigned long long)want);
    /* a header already at the residue gets no padding */
    h = tps_align_data_offset(r, 3, 1000, 4096, 0, &sh);
    CHECK(h == 1000);
    h = tps_align_data_offset(r, 3, 5096, 4096, 0, &sh);
    CHECK(h == 5096);
}

static void most_bytes_win(void)
{
    /* a small run wants 800, a large one 3000: 3000 */
    tps_align_run r[2] = {{.src = 800, .dst = 0, .len = 16384},
                          {.src = 3000 + 4096 * 10, .dst = 4096 * 10, .len = 1 << 20}};
    uint64_t sh, h = tps_align_data_offset(r, 2, 16, 4096, 0, &sh);
    CHECK_MSG(h == 3000, "h %llu", (unsigned long long)h);
    CHECK(sh == tps_kcopy_shareable(r[1].src, r[1].src, r[1].len, 4096));
    /* equal weights: the least padding (from 16, 800 comes before 3000) */
    r[0].len = r[1].len;
    h = tps_align_data_offset(r, 2, 16, 4096, 0, &sh);
    CHECK_MSG(h == 800, "h %llu", (unsigned long long)h);
    /* ... and from 1000, 3000 does (800 would wrap to 4896) */
    h = tps_align_data_offset(r, 2, 1000, 4096, 0, &sh);
    CHECK_MSG(h == 3000, "h %llu", (unsigned long long)h);
}

static void nothing_to_gain(void)
{
    uint64_t sh;
    CHECK(tps_align_data_offset(NULL, 0, 2384, 4096, 0, &sh) == 2384 && sh == 0);
    /* runs too short for a whole block, or at a residue no 8-aligned offset reaches */
    tps_align_run r[2] = {{.src = 1000, .dst = 0, .len = 3000},
                          {.src = 1003, .dst = 0, .len = 1 << 20}};
    CHECK(tps_align_data_offset(r, 2, 2384, 4096, 0, &sh) == 2384 && sh == 0);
    /* not a block size: left alone */
    r[1].src = 1000;
    CHECK(tps_align_data_offset(r, 2, 2384, 3000, 0, &sh) == 2384 && sh == 0);
    CHECK(tps_align_data_offset(r, 2, 2384, 0, 0, &sh) == 2384);
}

static void small_gains_keep_the_header(void)
{
    /* 176 KiB lined up by padding: kept at h_min under a 256 KiB threshold */
    tps_align_run r[3] = {{.src = 1000, .dst = 0, .len = 65536},
                          {.src = 1000 + 65536, .dst = 65536, .len = 4096 * 3},
                          {.src = 1000 + 200000, .dst = 200000, .len = 100000}};
    uint64_t sh, h = tps_align_data_offset(r, 3, 2384, 4096, 256 << 10, &sh);
    CHECK(h == 2384 && sh == 0);
    /* a run of two megabytes more is worth it */
    r[2].len = 2 << 20;
    h = tps_align_data_offset(r, 3, 2384, 4096, 256 << 10, &sh);
    CHECK_MSG(h == 5096 && sh > (2 << 20) - 8192, "h %llu", (unsigned long long)h);
    /* what h_min shares already counts: no gain, no padding */
    r[0] = (tps_align_run){.src = 2384, .dst = 0, .len = 4 << 20};
    r[1].len = r[2].len = 0;
    h = tps_align_data_offset(r, 3, 2384, 4096, 256 << 10, &sh);
    CHECK_MSG(h == 2384 && sh == tps_kcopy_shareable(2384, 2384, 4 << 20, 4096), "h %llu",
              (unsigned long long)h);
}

static void always_in_range(void)
{
    /* whatever the runs: h_min <= h < h_min + blk, 8-aligned, on several block sizes */
    uint64_t seed = 12345;
    for (int it = 0; it < 2000; it++) {
        tps_align_run r[4];
        for (int i = 0; i < 4; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            r[i] = (tps_align_run){.src = (seed >> 20) & ~7ull, .dst = (seed >> 40) & ~7ull,
                                   .len = (seed >> 8) & 0xFFFFF};
        }
        uint32_t blk = 512u << (it % 5);
        uint64_t h_min = 8 * (uint64_t)(it * 37 % 5000), sh;
        uint64_t h = tps_align_data_offset(r, 4, h_min, blk, 0, &sh);
        CHECK_MSG(h >= h_min && h < h_min + blk && h % 8 == 0, "h %llu from %llu, blk %u",
                  (unsigned long long)h, (unsigned long long)h_min, blk);
        uint64_t got = 0;
        for (int i = 0; i < 4; i++)
            got += tps_kcopy_shareable(r[i].src, h + r[i].dst, r[i].len, blk);
        CHECK_MSG(got >= sh, "said %llu shared, lines up %llu", (unsigned long long)sh,
                  (unsigned long long)got);
        if (t_cur_fail_) break;
    }
}

int main(void)
{
    RUN(shareable_blocks);
    RUN(lines_up_one_residue);
    RUN(most_bytes_win);
    RUN(nothing_to_gain);
    RUN(small_gains_keep_the_header);
    RUN(always_in_range);
    TEST_EXIT();
}
