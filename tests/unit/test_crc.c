/* The fast CRC32 must equal zlib's for every length and alignment. */
#include "internal.h"
#include "test.h"

static void crc_matches_zlib(void)
{
    static unsigned char buf[1 << 16];
    uint64_t s = 88172645463325252ULL;
    for (size_t i = 0; i < sizeof buf; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        buf[i] = (unsigned char)s;
    }
    /* Every implementation on its own, then the dispatcher. */
    for (int impl = 1; impl <= 2; impl++) {
        int bad = 0;
        for (size_t off = 0; off < 17; off++)
            for (size_t len = 0; len < 700; len++)
                if (tps_crc32_impl(impl, 0, buf + off, len) != tps_crc32_zlib(0, buf + off, len)) bad++;
        CHECK_MSG(bad == 0, "impl %d: %d mismatches on short lengths", impl, bad);
        size_t lens[] = {1000, 4096, 65536 - 3, 65536 - 17};
        for (size_t k = 0; k < 4; k++) {
            uint32_t a = tps_crc32_impl(impl, 0x12345678, buf + 3, lens[k]);
            uint32_t b = tps_crc32_zlib(0x12345678, buf + 3, lens[k]);
            CHECK_MSG(a == b, "impl %d len %zu: %08x vs %08x", impl, lens[k], a, b);
        }
    }
    /* Incremental: two halves equal the whole. */
    uint32_t h = tps_crc32(tps_crc32(0, buf, 777), buf + 777, 30000);
    /* the dispatcher on both sides of its wide-fold threshold */
    for (size_t len = 400; len < 700; len += 3)
        CHECK_MSG(tps_crc32(0, buf + 1, len) == tps_crc32_zlib(0, buf + 1, len), "len %zu", len);
    CHECK(h == tps_crc32_zlib(0, buf, 30777));
}

int main(void)
{
    RUN(crc_matches_zlib);
    TEST_EXIT();
}
