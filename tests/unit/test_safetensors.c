/* Reader, writer and the small helpers of lib/: the format to the letter. */
#include <unistd.h>

#include "internal.h"
#include "test.h"

static tps_ctx *ctx;

/* Builds a whole file image: 8-byte length, header text, data bytes. */
static size_t image(char *out, const char *hdr, size_t data)
{
    size_t n = strlen(hdr);
    for (int i = 0; i < 8; i++) out[i] = (char)((n >> (8 * i)) & 0xFF);
    memcpy(out + 8, hdr, n);
    memset(out + 8 + n, 0x5A, data);
    return 8 + n + data;
}

static tps_err parse(const char *hdr, size_t data)
{
    static char buf[1 << 16];
    size_t len = image(buf, hdr, data);
    return tps_st_parse_buffer(ctx, "t.safetensors", buf, len, len);
}

static void reader_accepts_legal_files(void)
{
    CHECK(parse("{}", 0) == TPS_OK);
    CHECK(parse("{\"__metadata__\":{}}", 0) == TPS_OK);
    CHECK(parse("{\"a\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4) == TPS_OK);
    CHECK(parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[0,7],\"data_offsets\":[0,0]}}", 0) == TPS_OK);
    /* Leading and trailing JSON whitespace (safetensors PR #686). */
    CHECK(parse("\t\n{}\r ", 0) == TPS_OK);
    /* Odd offsets: inputs may be unaligned. */
    CHECK(parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[3,7]}}", 7) == TPS_OK);
    /* Header order is irrelevant; offsets decide. */
    CHECK(parse("{\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]},"
                "\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 4) == TPS_OK);
    CHECK(parse("{\"a\":{\"dtype\":\"F4\",\"shape\":[4],\"data_offsets\":[0,2]}}", 2) == TPS_OK);
}

static void reader_names_the_rule(void)
{
    struct { const char *hdr; size_t data; const char *word; } bad[] = {
        {"{\"a\":{\"dtype\":\"X9\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "unknown dtype"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 1, "shape[0]"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}", 1, "non-negative integer"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,1]}}", 1, "size mismatch"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 2, "trailing"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2, "gap"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
         "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]}}", 3, "overlap"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
         "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2, "duplicate"},
        {"{\"__metadata__\":{\"k\":1}}", 0, "not a string"},
        {"{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2, "whole bytes"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,1]}}", 1, "overflow"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, "missing data_offsets"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,0]}}", 1, "begin"},
        {"[1,2]", 0, "not a JSON object"},
        {"{\"a\":", 0, "not valid JSON"},
        {"{\"__metadata__\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "reserved"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}\001", 1, "JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tps_err e = parse(bad[i].hdr, bad[i].data);
        CHECK_MSG(e == TPS_E_FORMAT, "case %zu: got %d", i, (int)e);
        CHECK_MSG(strstr(tps_ctx_errmsg(ctx), bad[i].word) != NULL, "case %zu: '%s' lacks '%s'", i,
                  tps_ctx_errmsg(ctx), bad[i].word);
    }
    /* The 8-byte length itself. */
    char b[16] = {0};
    CHECK(tps_st_parse_buffer(ctx, "t", b, 4, 4) == TPS_E_FORMAT);
    CHECK(strstr(tps_ctx_errmsg(ctx), "too small") != NULL);
    uint64_t huge = 100000001ULL;
    memcpy(b, &huge, 8);
    CHECK(tps_st_parse_buffer(ctx, "t", b, 16, 16) == TPS_E_FORMAT);
    CHECK(strstr(tps_ctx_errmsg(ctx), "100,000,000") != NULL);
    uint64_t past = 100;
    memcpy(b, &past, 8);
    CHECK(tps_st_parse_buffer(ctx, "t", b, 16, 16) == TPS_E_FORMAT);
    CHECK(strstr(tps_ctx_errmsg(ctx), "past the end") != NULL);
    /* Bad UTF-8 in a name. */
    CHECK(parse("{\"\xff\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1) == TPS_E_FORMAT);
    CHECK(strstr(tps_ctx_errmsg(ctx), "UTF-8") != NULL);
}

static void writer_matches_reference_layout(void)
{
    uint64_t s1[] = {2, 3}, s2[] = {5}, s3[] = {1};
    tps_st_entry e[] = {
        {.name = "b", .dtype = TPS_BF16, .ndim = 2, .shape = s1, .nbytes = 12},
        {.name = "a", .dtype = TPS_U8, .ndim = 1, .shape = s2, .nbytes = 5},
        {.name = "c", .dtype = TPS_F32, .ndim = 1, .shape = s3, .nbytes = 4},
        {.name = "a2", .dtype = TPS_BF16, .ndim = 0, .shape = s3, .nbytes = 2},
    };
    const char *mk[] = {"format"}, *mv[] = {"pt"};
    char *h;
    size_t hl;
    CHECK(tps_st_build_header(ctx, e, 4, mk, mv, 1, &h, &hl) == TPS_OK);
    const char *want = "{\"__metadata__\":{\"format\":\"pt\"},"
                       "\"c\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                       "\"a2\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[4,6]},"
                       "\"b\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[6,18]},"
                       "\"a\":{\"dtype\":\"U8\",\"shape\":[5],\"data_offsets\":[18,23]}}";
    CHECK((hl - 8) % 8 == 0);
    CHECK_MSG(strncmp(h + 8, want, strlen(want)) == 0, "got %.*s", (int)(hl - 8), h + 8);
    for (size_t i = 8 + strlen(want); i < hl; i++) CHECK(h[i] == ' ');
    uint64_t n = 0;
    memcpy(&n, h, 8);
    CHECK(n == hl - 8);
    CHECK(e[2].offset == 0 && e[3].offset == 4 && e[0].offset == 6 && e[1].offset == 18);
    /* It parses back. */
    CHECK(tps_st_parse_buffer(ctx, "w", h, hl, hl + 23) == TPS_OK);
    free(h);
    /* Empty file, as save_file writes it: "{}" and six spaces. */
    CHECK(tps_st_build_header(ctx, NULL, 0, NULL, NULL, 0, &h, &hl) == TPS_OK);
    CHECK(hl == 16 && memcmp(h + 8, "{}      ", 8) == 0);
    free(h);
}

static void chunk_follows_torch(void)
{
    uint64_t s, l, want250[] = {63, 63, 63, 61}, want20[] = {3, 3, 3, 3, 3, 3, 2, 0};
    int ok = 1;
    for (int r = 0; r < 4; r++) {
        tps_chunk(250, 4, r, &s, &l);
        ok &= l == want250[r] && s == (uint64_t)r * 63;
    }
    CHECK(ok);
    uint64_t at = 0;
    for (int r = 0; r < 8; r++) {
        tps_chunk(20, 8, r, &s, &l);
        CHECK(l == want20[r] && s == (at < 20 ? at : 20));
        at += l;
    }
    tps_chunk(0, 3, 1, &s, &l);
    CHECK(l == 0);
}

static void parsers(void)
{
    uint64_t v;
    CHECK(tps_parse_size("5G", &v) == 0 && v == 5ULL << 30);
    CHECK(tps_parse_size("512M", &v) == 0 && v == 512ULL << 20);
    CHECK(tps_parse_size("1.5GiB", &v) == 0 && v == 3ULL << 29);
    CHECK(tps_parse_size("4096", &v) == 0 && v == 4096);
    CHECK(tps_parse_size("5Q", &v) != 0 && tps_parse_size("", &v) != 0 && tps_parse_size("-1", &v) != 0);
    unsigned char m[8];
    CHECK(tps_parse_ranks("0,3-5", 8, m) == 0 && m[0] && !m[1] && !m[2] && m[3] && m[4] && m[5] && !m[6]);
    CHECK(tps_parse_ranks("8", 8, m) != 0 && tps_parse_ranks("3-1", 8, m) != 0 &&
          tps_parse_ranks("1,", 8, m) != 0 && tps_parse_ranks("x", 8, m) != 0);
    CHECK(tps_utf8_valid("h\xc3\xa9", 3) && !tps_utf8_valid("\xc3", 1) && !tps_utf8_valid("\xed\xa0\x80", 3));
}

static void dtype_conversions(void)
{
    const unsigned char bf[] = {0x80, 0x3f}, h[] = {0x00, 0x3c}, e4[] = {0x38}, e5[] = {0x3c};
    const unsigned char e8[] = {127}, fnuz[] = {0x80};
    float f;
    CHECK(tps_to_f32(TPS_BF16, bf, &f, 1) == 0 && f == 1.0f);
    CHECK(tps_to_f32(TPS_F16, h, &f, 1) == 0 && f == 1.0f);
    CHECK(tps_to_f32(TPS_F8_E4M3, e4, &f, 1) == 0 && f == 1.0f);
    CHECK(tps_to_f32(TPS_F8_E5M2, e5, &f, 1) == 0 && f == 1.0f);
    CHECK(tps_to_f32(TPS_F8_E8M0, e8, &f, 1) == 0 && f == 1.0f);
    CHECK(tps_to_f32(TPS_F8_E4M3FNUZ, fnuz, &f, 1) == 0 && f != f);
    CHECK(tps_to_f32(TPS_I32, bf, &f, 1) != 0);
    tps_dtype d;
    CHECK(tps_dtype_from_name("F8_E4M3FNUZ", &d) == 0 && d == TPS_F8_E4M3FNUZ && tps_dtype_bits(TPS_F4) == 4);
}

int main(void)
{
    ctx = tps_ctx_new();
    RUN(reader_accepts_legal_files);
    RUN(reader_names_the_rule);
    RUN(writer_matches_reference_layout);
    RUN(chunk_follows_torch);
    RUN(parsers);
    RUN(dtype_conversions);
    tps_ctx_free(ctx);
    TEST_EXIT();
}
