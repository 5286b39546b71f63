/* The streamed text buffer (tps_sbuf with out) and the header writer on it:
 * a streamed buffer passes on exactly the bytes a kept one holds, in pieces,
 * never holding much more than one; escaping piece by piece is the escaping
 * of the whole; a rank file's header streamed with a value made as it goes
 * is byte for byte the header tps_st_build_header and tps_st_pad_header
 * make from the same value held whole, and reads back. Also: a checkpoint
 * tensor's kept shape reads zeros past its dims (TPS_SHAPE_PAD), as the
 * inline arrays it replaced did. */
#include <fcntl.h>
#include <unistd.h>

#include "internal.h"
#include "test.h"

/* out: appends to a kept tps_sbuf, counts the calls, fails at call fail_at */
struct sink {
    tps_sbuf got;
    size_t calls, biggest, fail_at;
};

static int sink_out(void *u, const char *p, size_t n)
{
    struct sink *s = u;
    if (++s->calls == s->fail_at) return 1;
    if (n > s->biggest) s->biggest = n;
    tps_sb_put(&s->got, p, n);
    return 0;
}

/* n bytes of text with every kind of byte the escaper treats apart */
static char *mixed_text(size_t n)
{
    static const char pick[] = "ab\"\\\n\t\x01\x1f\xc3\xa9{}:,0123456789";
    char *s = malloc(n + 1);
    for (size_t i = 0; i < n; i++) s[i] = pick[t_rand() % (sizeof pick - 1)];
    s[n] = 0;
    return s;
}

static void test_streamed_equals_kept(void)
{
    size_t n = (5u << 20) + 12345;
    char *text = mixed_text(n);
    tps_sbuf kept = {0};
    struct sink s = {0};
    tps_sbuf streamed = {.out = sink_out, .out_u = &s};
    size_t most_held = 0;
    for (size_t at = 0; at < n;) {
        /* pieces from one byte to two TPS_SB_PIECEs */
        size_t len = t_rand() % 8 ? t_rand() % 5000 + 1 : t_rand() % (2 * TPS_SB_PIECE) + 1;
        if (len > n - at) len = n - at;
        tps_sb_put(&kept, text + at, len);
        tps_sb_put(&streamed, text + at, len);
        if (streamed.len > most_held) most_held = streamed.len;
        at += len;
    }
    CHECK(tps_sb_flush(&streamed) == 0);
    CHECK(!streamed.failed && !streamed.oom && !kept.oom);
    CHECK(streamed.total == n && kept.total == n && kept.len == n);
    CHECK(s.got.len == n && !memcmp(s.got.p, kept.p, n));
    CHECK_MSG(most_held <= TPS_SB_PIECE, "held %zu bytes", most_held);
    CHECK(s.calls > 5);
    free(kept.p);
    free(streamed.p);
    free(s.got.p);
    free(text);
}

static void test_escaped_in_pieces(void)
{
    size_t n = (3u << 20) + 7;
    char *text = mixed_text(n);
    tps_sbuf whole = {0};
    tps_json_quote(text, tps_sb_sink, &whole);
    struct sink s = {0};
    tps_sbuf b = {.out = sink_out, .out_u = &s, .esc = 1};
    for (size_t at = 0; at < n;) {
        size_t len = t_rand() % 70000 + 1;
        if (len > n - at) len = n - at;
        tps_sb_put(&b, text + at, len);
        at += len;
    }
    CHECK(tps_sb_flush(&b) == 0);
    /* the whole quoted, less its two quotes */
    CHECK(s.got.len + 2 == whole.len);
    CHECK(s.got.len + 2 == whole.len && !memcmp(s.got.p, whole.p + 1, s.got.len));
    free(whole.p);
    free(b.p);
    free(s.got.p);
    free(text);
}

static void test_out_fails(void)
{
    struct sink s = {.fail_at = 2};
    tps_sbuf b = {.out = sink_out, .out_u = &s};
    char *big = mixed_text(TPS_SB_PIECE);
    tps_sb_put(&b, big, TPS_SB_PIECE / 2);
    tps_sb_put(&b, big, TPS_SB_PIECE);     /* first out: the half */
    tps_sb_put(&b, big, TPS_SB_PIECE);     /* second out fails */
    CHECK(b.failed);
    size_t calls = s.calls;
    tps_sb_put(&b, big, TPS_SB_PIECE);     /* dropped */
    CHECK(tps_sb_flush(&b) != 0);
    CHECK(s.calls == calls);
    free(b.p);
    free(s.got.p);
    free(big);
}

/* the placements-like value: made in many small puts */
struct val {
    size_t n;
};

static void value_put(void *u, tps_sbuf *b)
{
    const struct val *v = u;
    char part[64];
    tps_sb_puts(b, "{");
    for (size_t i = 0; i < v->n; i++) {
        snprintf(part, sizeof part, "%s\"t\\\"%zu\":{\"offset\":%zu}", i ? "," : "", i, i * 3);
        tps_sb_puts(b, part);
    }
    tps_sb_puts(b, "}");
}

static void test_header_streamed(void)
{
    tps_ctx *ctx = tps_ctx_new();
    struct val v = {60000}; /* a value of about 1.7 MB: the header is flushed in pieces */
    tps_sbuf whole = {.out = NULL};
    value_put(&v, &whole);
    uint64_t shape_a[2] = {4, 5}, shape_b[1] = {7};
    tps_st_entry e1[2] = {{.name = "b", .dtype = TPS_F32, .ndim = 1, .shape = shape_b, .nbytes = 28},
                          {.name = "a", .dtype = TPS_BF16, .ndim = 2, .shape = shape_a, .nbytes = 40}};
    tps_st_entry e2[2];
    memcpy(e2, e1, sizeof e1);
    const char *mk[] = {"format", "placements"};
    const char *mv_kept[] = {"pt", whole.p};
    const char *mv_made[] = {"pt", NULL};
    for (size_t extra = 0; extra <= 16; extra += 16) {
        char *hdr = NULL;
        size_t hlen = 0;
        CHECK(tps_st_build_header(ctx, e1, 2, mk, mv_kept, 2, &hdr, &hlen) == TPS_OK);
        CHECK(tps_st_pad_header(ctx, &hdr, &hlen, extra) == TPS_OK);
        /* counted, then written with the count's length */
        tps_sbuf cb = {.out = tps_sb_discard};
        size_t clen = 0, wlen = 0;
        CHECK(tps_st_emit_header(ctx, e2, 2, mk, mv_made, 2, value_put, &v, extra, 0, &cb,
                                 &clen) == TPS_OK);
        CHECK(clen == hlen);
        struct sink s = {0};
        tps_sbuf wb = {.out = sink_out, .out_u = &s};
        CHECK(tps_st_emit_header(ctx, e2, 2, mk, mv_made, 2, value_put, &v, extra, clen - 8, &wb,
                                 &wlen) == TPS_OK);
        CHECK(tps_sb_flush(&wb) == 0);
        CHECK(wlen == hlen && s.got.len == hlen && !memcmp(s.got.p, hdr, hlen));
        CHECK(s.calls > 1);
        CHECK(e2[0].offset == e1[0].offset && e2[1].offset == e1[1].offset &&
              e2[0].order == e1[0].order && e2[1].order == e1[1].order);
        /* and it reads back, the value whole */
        tps_st *st = NULL;
        CHECK(tps_st_parse_header(ctx, "streamed", s.got.p + 8, hlen - 8, hlen + 68, &st) == TPS_OK);
        int found = 0;
        for (size_t i = 0; st && i < st->nmeta; i++) {
            const char *k, *val;
            tps_st_meta(st, i, &k, &val);
            if (!strcmp(k, "placements")) found = !strcmp(val, whole.p);
        }
        CHECK(found);
        tps_st_free(st);
        free(hdr);
        free(cb.p);
        free(wb.p);
        free(s.got.p);
    }
    free(whole.p);
    tps_ctx_free(ctx);
}

static void test_shape_pad(void)
{
    char path[] = "/tmp/tps-sbuf-XXXXXX.safetensors";
    int fd = mkstemps(path, 12);
    CHECK(fd >= 0);
    if (fd < 0) return;
    const char *h = "{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
                    "\"v\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[4,16]},"
                    "\"m\":{\"dtype\":\"F32\",\"shape\":[1,2,2,1,1],\"data_offsets\":[16,32]}}";
    uint64_t n = strlen(h);
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)(n >> (8 * i));
    char data[32] = {0};
    CHECK(write(fd, len8, 8) == 8 && write(fd, h, n) == (ssize_t)n && write(fd, data, 32) == 32);
    close(fd);
    tps_ctx *ctx = tps_ctx_new();
    tps_ckpt *ck = NULL;
    CHECK(tps_ckpt_open(ctx, path, &ck) == TPS_OK);
    for (size_t i = 0; ck && i < ck->n; i++) {
        const tps_ctensor *t = &ck->t[i];
        if (!strcmp(t->name, "s")) CHECK(t->ndim == 0 && t->shape[0] == 0 && t->shape[3] == 0);
        if (!strcmp(t->name, "v")) CHECK(t->ndim == 1 && t->shape[0] == 3 && t->shape[1] == 0 &&
                                         t->shape[3] == 0);
        if (!strcmp(t->name, "m")) CHECK(t->ndim == 5 && t->shape[1] == 2 && t->shape[4] == 1);
        uint64_t sh[TPS_MAX_DIMS];
        tps_shape_get(sh, t);
        for (int d = t->ndim; d < TPS_MAX_DIMS; d++) CHECK(sh[d] == 0);
    }
    tps_ckpt_free(ck);
    tps_ctx_free(ctx);
    unlink(path);
}

int main(void)
{
    RUN(test_streamed_equals_kept);
    RUN(test_escaped_in_pieces);
    RUN(test_out_fails);
    RUN(test_header_streamed);
    RUN(test_shape_pad);
    TEST_EXIT();
}
