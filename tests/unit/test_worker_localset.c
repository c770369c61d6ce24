/* The local tensors' blob (src/worker/localset.h), as the exporter decodes what a worker sent:
 * a well-formed blob gives back its tensors, shapes and metadata; every truncation, trailing
 * byte and impossible length is refused before anything is read past the end. A blob sent in
 * chunks reassembles to the same bytes; a truncated, lost, repeated, out-of-order chunk or one of
 * another step is refused with its error. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "worker/localset.h"

/* Two tensors ("w" [2,3] and "optim/local/w/momentum_buffer" [6]) and one metadata entry,
 * laid out as localset.h describes. Returns the length. */
static size_t make_blob(unsigned char *b)
{
    unsigned char *p = b;
    cps__le32_put(p, 0x4C535043u);
    cps__le32_put(p + 4, 2);
    cps__le32_put(p + 8, 1);
    cps__le32_put(p + 12, 0);
    cps__le64_put(p + 16, 42);
    p += 24;
    const char *names[2] = {"w", "optim/local/w/momentum_buffer"};
    for (int t = 0; t < 2; t++) {
        size_t nlen = strlen(names[t]);
        uint32_t ndim = t == 0 ? 2 : 1;
        cps__le32_put(p, (uint32_t)nlen);
        cps__le32_put(p + 4, ndim);
        p += 8;
        if (t == 0) {
            cps__le64_put(p, 2);
            cps__le64_put(p + 8, 3);
        } else {
            cps__le64_put(p, 6);
        }
        p += 8 * ndim;
        memset(p, 0, (nlen + 3) & ~(size_t)3);
        memcpy(p, names[t], nlen);
        p += (nlen + 3) & ~(size_t)3;
        for (int i = 0; i < 6; i++) {
            float v = (float)(t * 10 + i) + 0.5f;
            memcpy(p, &v, 4);
            p += 4;
        }
    }
    cps__le32_put(p, 3);
    cps__le32_put(p + 4, 2);
    memcpy(p + 8, "key", 3);
    memcpy(p + 11, "[]", 2);
    p += 13;
    return (size_t)(p - b);
}

static void test_round_trip(void **state)
{
    (void)state;
    unsigned char b[512];
    size_t n = make_blob(b);
    cps__lset_blob blob;
    assert_int_equal(cps__lset_blob_decode(b, n, &blob), 0);
    assert_int_equal(blob.step, 42);
    assert_int_equal(blob.ntensors, 2);
    assert_string_equal(blob.tensors[0].name, "w");
    assert_int_equal(blob.tensors[0].ndim, 2);
    assert_int_equal(blob.tensors[0].dims[1], 3);
    assert_int_equal(blob.tensors[0].numel, 6);
    assert_string_equal(blob.tensors[1].name, "optim/local/w/momentum_buffer");
    float v;
    memcpy(&v, (const unsigned char *)blob.tensors[1].data + 4 * 5, 4);
    assert_true(v == 15.5f);
    assert_int_equal(blob.nmeta, 1);
    assert_string_equal(blob.keys[0], "key");
    assert_string_equal(blob.values[0], "[]");
    cps__lset_blob_fini(&blob);
}

static void test_every_truncation_and_trailer_refused(void **state)
{
    (void)state;
    unsigned char b[512];
    size_t n = make_blob(b);
    for (size_t cut = 0; cut < n; cut++) {
        unsigned char *copy = malloc(cut ? cut : 1); /* exact size: ASan sees any overread */
        assert_non_null(copy);
        memcpy(copy, b, cut);
        cps__lset_blob blob;
        assert_int_equal(cps__lset_blob_decode(copy, cut, &blob), CPS_EPROTO);
        cps__lset_blob_fini(&blob);
        free(copy);
    }
    cps__lset_blob blob;
    assert_int_equal(cps__lset_blob_decode(b, n + 1, &blob), CPS_EPROTO);
    cps__lset_blob_fini(&blob);
}

static void test_impossible_fields_refused(void **state)
{
    (void)state;
    unsigned char b[512];
    size_t n = make_blob(b);
    /* magic, tensor count, a name length, ndim, a zero dimension, a NUL in a name */
    const size_t at[] = {0, 4, 24, 28, 32, 48};
    const uint32_t val[] = {0x12345678u, 1000000u, 0, 9, 0, 0};
    for (size_t k = 0; k < sizeof at / sizeof *at; k++) {
        unsigned char c[512];
        memcpy(c, b, n);
        if (k == 5)
            c[48] = 0; /* "w" -> NUL */
        else
            cps__le32_put(c + at[k], val[k]);
        cps__lset_blob blob;
        assert_int_equal(cps__lset_blob_decode(c, n, &blob), CPS_EPROTO);
        cps__lset_blob_fini(&blob);
    }
}

/* One chunk as a worker sends it: u64 blob length, u64 offset, the bytes. Returns its length. */
static size_t make_chunk(unsigned char *out, const unsigned char *blob, uint64_t total,
                         uint64_t off, size_t len)
{
    cps__le64_put(out, total);
    cps__le64_put(out + 8, off);
    memcpy(out + CPS_LSET_CHUNK_HDR, blob + off, len);
    return CPS_LSET_CHUNK_HDR + len;
}

/* A blob sent in chunks of every size from 1 byte to the whole reassembles to the same bytes,
 * complete exactly at its last chunk, and decodes. */
static void test_chunks_reassemble(void **state)
{
    (void)state;
    unsigned char b[512], c[512 + CPS_LSET_CHUNK_HDR];
    size_t n = make_blob(b);
    for (size_t chunk = 1; chunk <= n; chunk++) {
        cps__lset_asm as = {0};
        for (size_t off = 0; off < n; off += chunk) {
            size_t len = n - off < chunk ? n - off : chunk;
            int rc = cps__lset_asm_put(&as, 42, c, make_chunk(c, b, n, off, len));
            assert_int_equal(rc, off + len == n);
        }
        assert_int_equal(as.total, n);
        assert_memory_equal(as.buf, b, n);
        cps__lset_blob blob;
        assert_int_equal(cps__lset_blob_decode(as.buf, (size_t)as.total, &blob), 0);
        assert_int_equal(blob.ntensors, 2);
        cps__lset_blob_fini(&blob);
        cps__lset_asm_fini(&as);
    }
}

/* Each bad chunk gets its named error, and the assembly is as it was (the exporter fails the
 * exchange, it does not guess). */
static void test_bad_chunks_refused(void **state)
{
    (void)state;
    unsigned char b[512], c[512 + CPS_LSET_CHUNK_HDR];
    size_t n = make_blob(b), half = n / 2;
    cps__lset_asm as = {0};
    /* truncated: shorter than the chunk's header, or no data */
    for (size_t len = 0; len <= CPS_LSET_CHUNK_HDR; len++) {
        make_chunk(c, b, n, 0, 0);
        assert_int_equal(cps__lset_asm_put(&as, 42, c, len), CPS_ESIZE);
    }
    /* an impossible blob length, data past the announced length */
    make_chunk(c, b, n, 0, half);
    cps__le64_put(c, CPS_LSET_BLOB_MAX + 1);
    assert_int_equal(cps__lset_asm_put(&as, 42, c, CPS_LSET_CHUNK_HDR + half), CPS_ESIZE);
    cps__le64_put(c, 8);
    assert_int_equal(cps__lset_asm_put(&as, 42, c, CPS_LSET_CHUNK_HDR + half), CPS_ESIZE);
    cps__le64_put(c, half - 1);
    assert_int_equal(cps__lset_asm_put(&as, 42, c, CPS_LSET_CHUNK_HDR + half), CPS_ESIZE);
    /* the first chunk missing */
    assert_int_equal(cps__lset_asm_put(&as, 42, c, make_chunk(c, b, n, half, n - half)),
                     CPS_EPROTO);
    assert_int_equal(as.got, 0);
    assert_int_equal(cps__lset_asm_put(&as, 42, c, make_chunk(c, b, n, 0, half)), 0);
    /* repeated, of another step, of another length */
    assert_int_equal(cps__lset_asm_put(&as, 42, c, make_chunk(c, b, n, 0, half)), CPS_EPROTO);
    assert_int_equal(cps__lset_asm_put(&as, 43, c, make_chunk(c, b, n, half, n - half)),
                     CPS_EPROTO);
    make_chunk(c, b, n, half, n - half);
    cps__le64_put(c, n + 1);
    assert_int_equal(cps__lset_asm_put(&as, 42, c, CPS_LSET_CHUNK_HDR + n - half), CPS_EPROTO);
    assert_int_equal(as.got, half);
    /* the right one still completes it */
    assert_int_equal(cps__lset_asm_put(&as, 42, c, make_chunk(c, b, n, half, n - half)), 1);
    assert_memory_equal(as.buf, b, n);
    cps__lset_asm_fini(&as);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_every_truncation_and_trailer_refused),
        cmocka_unit_test(test_impossible_fields_refused),
        cmocka_unit_test(test_chunks_reassemble),
        cmocka_unit_test(test_bad_chunks_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
