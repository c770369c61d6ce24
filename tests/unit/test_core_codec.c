#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <snappy-c.h>

#include "chainps/error.h"
#include "core/codec.h"

/* xorshift64*: reproducible "incompressible" bytes. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

static void fill_random(unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(rnd() >> 56);
}

/* `zero_pct` percent zeros followed by random bytes: compressibility on a dial. */
static unsigned char *make_input(size_t n, unsigned zero_pct)
{
    unsigned char *p = malloc(n);
    assert_non_null(p);
    size_t z = n * zero_pct / 100;
    memset(p, 0, z);
    fill_random(p + z, n - z);
    return p;
}

static void bound_covers_worst_case(void **state)
{
    (void)state;
    for (size_t n = 0; n < 100000; n = n * 3 + 1)
        assert_true(cps__codec_bound(n) >= n);
}

static void round_trip_compressible(void **state)
{
    (void)state;
    size_t n = 64 * 1024;
    float *in = malloc(n);
    assert_non_null(in);
    for (size_t i = 0; i < n / 4; i++)
        in[i] = (float)(i % 16) * 0.5f; /* gradient-like, repetitive */
    size_t cap = cps__codec_bound(n);
    unsigned char *c = malloc(cap);
    unsigned char *out = malloc(n);
    size_t clen = cps__codec_compress(in, n, c, cap);
    assert_true(clen > 0 && clen * 100 <= n * CPS_CODEC_KEEP_PCT);
    assert_int_equal(cps__codec_decompress(c, clen, out, n), 0);
    assert_memory_equal(in, out, n);
    free(in);
    free(c);
    free(out);
}

static void small_or_incompressible_is_sent_raw(void **state)
{
    (void)state;
    unsigned char *zeros = calloc(1, CPS_CODEC_MIN_BYTES);
    unsigned char out[1024];
    /* compresses superbly, but below the size where it pays */
    assert_int_equal(cps__codec_compress(zeros, CPS_CODEC_MIN_BYTES - 1, out, sizeof out), 0);
    assert_true(cps__codec_compress(zeros, CPS_CODEC_MIN_BYTES, out, sizeof out) > 0);
    free(zeros);

    unsigned char *rand = make_input(8192, 0);
    size_t cap = cps__codec_bound(8192);
    unsigned char *c = malloc(cap);
    assert_int_equal(cps__codec_compress(rand, 8192, c, cap), 0);
    /* too small an output buffer is "send raw", never an overflow */
    unsigned char *half = make_input(8192, 90);
    assert_int_equal(cps__codec_compress(half, 8192, c, cap - 1), 0);
    assert_int_equal(cps__codec_compress(NULL, 8192, c, cap), 0);
    free(rand);
    free(half);
    free(c);
}

static void keeps_only_ten_percent_savings(void **state)
{
    (void)state;
    size_t n = 16384, cap = cps__codec_bound(n);
    char *c = malloc(cap);
    int kept = 0, dropped = 0;
    for (unsigned pct = 0; pct <= 30; pct++) {
        unsigned char *in = make_input(n, pct);
        size_t direct = cap;
        assert_int_equal(snappy_compress((const char *)in, n, c, &direct), SNAPPY_OK);
        size_t got = cps__codec_compress(in, n, c, cap);
        if (direct * 100 <= n * CPS_CODEC_KEEP_PCT) {
            assert_int_equal(got, direct);
            kept++;
        } else {
            assert_int_equal(got, 0);
            dropped++;
        }
        free(in);
    }
    assert_true(kept > 0 && dropped > 0); /* the dial crosses the threshold */
    free(c);
}

static size_t compress_some(unsigned char **c, size_t *n)
{
    *n = 4096;
    unsigned char *in = make_input(*n, 50);
    *c = malloc(cps__codec_bound(*n));
    size_t clen = cps__codec_compress(in, *n, *c, cps__codec_bound(*n));
    assert_true(clen > 0);
    free(in);
    return clen;
}

static void raw_len_lies(void **state)
{
    (void)state;
    unsigned char *c;
    size_t n, clen = compress_some(&c, &n);
    unsigned char *out = malloc(n + 1);
    assert_int_equal(cps__codec_decompress(c, clen, out, n), 0);
    assert_int_equal(cps__codec_decompress(c, clen, out, n - 1), CPS_ECORRUPT);
    assert_int_equal(cps__codec_decompress(c, clen, out, n + 1), CPS_ECORRUPT);
    assert_int_equal(cps__codec_decompress(c, clen, out, 0), CPS_ECORRUPT);
    free(out);
    free(c);
}

static void corrupt_streams(void **state)
{
    (void)state;
    unsigned char *c;
    size_t n, clen = compress_some(&c, &n);
    unsigned char *out = malloc(n);

    for (size_t cut = 0; cut < clen; cut += 1 + cut / 8) /* truncated */
        assert_int_equal(cps__codec_decompress(c, cut, out, n), CPS_ECORRUPT);

    /* preamble 10, then a 2-byte-offset copy reaching before the start of the output */
    const unsigned char bad_offset[] = {0x0a, 0x0e, 0xff, 0xff};
    assert_int_equal(cps__codec_decompress(bad_offset, sizeof bad_offset, out, 10), CPS_ECORRUPT);
    /* an unterminated length varint */
    const unsigned char bad_varint[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    assert_int_equal(cps__codec_decompress(bad_varint, sizeof bad_varint, out, 10), CPS_ECORRUPT);
    /* preamble says 10, literal of 4: the stream ends short */
    const unsigned char short_lit[] = {0x0a, 0x0c, 'a', 'b', 'c', 'd'};
    assert_int_equal(cps__codec_decompress(short_lit, sizeof short_lit, out, 10), CPS_ECORRUPT);
    /* and the same shape, consistent, decodes */
    const unsigned char ok_lit[] = {0x04, 0x0c, 'a', 'b', 'c', 'd'};
    assert_int_equal(cps__codec_decompress(ok_lit, sizeof ok_lit, out, 4), 0);
    assert_memory_equal(out, "abcd", 4);

    /* random damage: an error or a correct-size result, never a write past `out` (ASan) */
    unsigned char *dam = malloc(clen);
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(dam, c, clen);
        for (int k = 0; k < 1 + iter % 4; k++)
            dam[rnd() % clen] ^= (unsigned char)(1u << (rnd() % 8));
        unsigned char *exact = malloc(n);
        int rc = cps__codec_decompress(dam, clen, exact, n);
        assert_true(rc == 0 || rc == CPS_ECORRUPT);
        free(exact);
    }
    assert_int_equal(cps__codec_decompress(NULL, 4, out, n), CPS_EINVAL);
    assert_int_equal(cps__codec_decompress(c, clen, NULL, n), CPS_EINVAL);
    free(dam);
    free(out);
    free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bound_covers_worst_case),
        cmocka_unit_test(round_trip_compressible),
        cmocka_unit_test(small_or_incompressible_is_sent_raw),
        cmocka_unit_test(keeps_only_ten_percent_savings),
        cmocka_unit_test(raw_len_lies),
        cmocka_unit_test(corrupt_streams),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
