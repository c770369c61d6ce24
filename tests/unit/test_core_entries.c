/* core/entries: the one encoding of range entries (SNAP and restore PUT payloads). Every writer
 * round-trips through the decoder, and every cut short, padded or mistyped entry is refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "core/entries.h"

static _Alignas(8) unsigned char buf[4096];

static cps__param_spec adam_spec(void)
{
    cps__param_spec s = {0};
    s.opt_kind = CPS_W_OPT_ADAM;
    s.lr = 0.01f;
    s.beta1 = 0.9f;
    s.beta2 = 0.999f;
    s.eps = 1e-8f;
    return s;
}

/* One of each entry, written back to back as a SNAP chunk or a restore would be. */
static size_t write_all(unsigned char *p)
{
    cps__param_spec spec = adam_spec();
    float vals[3] = {1.5f, -2.0f, 3.25f}, state[6] = {1, 2, 3, 4, 5, 6};
    unsigned char value[8] = {9, 8, 7, 6, 5, 4, 3, 2};
    size_t n = cps__ent_put_param(p, 0x40, 3, 17, &spec, 2, vals, state);
    n += cps__ent_put_dedup(p + n, 5, 123);
    n += cps__ent_put_named(p + n, "agg/1/abc", 9, value, 8);
    n += cps__ent_put_create(p + n, 0x41, 5, 4, &spec);
    n += cps__ent_put_slice(p + n, 2, 0x41, 1, 3, vals);
    n += cps__ent_put_range(p + n, 99, 7);
    return n;
}

static void every_writer_round_trips(void **state)
{
    (void)state;
    size_t len = write_all(buf), off = 0;
    cps__ent e;
    uint32_t tags[6];
    int k = 0;
    while (off < len) {
        assert_int_equal(cps__ent_next(buf + off, len - off, &e), 0);
        assert_true(k < 6);
        tags[k] = e.tag;
        assert_int_equal(e.size % 8, 0);
        switch (k++) {
        case 0:
            assert_int_equal(e.key, 0x40);
            assert_int_equal(e.len, 3);
            assert_int_equal(e.opt_step, 17);
            assert_int_equal(e.slots, 2);
            assert_int_equal(e.spec.opt_kind, CPS_W_OPT_ADAM);
            assert_true(e.vals[1] == -2.0f && e.vals[3 + 5] == 6.0f);
            assert_int_equal(e.size, cps__ent_param_size(3, 2));
            break;
        case 1:
            assert_int_equal(e.worker, 5);
            assert_int_equal(e.seq, 123);
            break;
        case 2:
            assert_int_equal(e.name_len, 9);
            assert_memory_equal(e.name, "agg/1/abc", 9);
            assert_int_equal(e.value_len, 8);
            assert_int_equal(((const unsigned char *)e.value)[0], 9);
            break;
        case 3:
            assert_int_equal(e.key, 0x41);
            assert_int_equal(e.len, 5);
            assert_int_equal(e.opt_step, 4);
            break;
        case 4:
            assert_int_equal(e.slot, 2);
            assert_int_equal(e.first, 1);
            assert_int_equal(e.n, 3);
            assert_true(e.vals[2] == 3.25f);
            break;
        case 5:
            assert_int_equal(e.seq, 99);
            assert_int_equal(e.step, 7);
            break;
        }
        off += e.size;
    }
    assert_int_equal(k, 6);
    uint32_t want[6] = {CPS_ENT_PARAM,  CPS_ENT_DEDUP, CPS_ENT_NAMED,
                        CPS_ENT_CREATE, CPS_ENT_SLICE, CPS_ENT_RANGE};
    assert_memory_equal(tags, want, sizeof want);
}

static void a_cut_short_entry_is_refused(void **state)
{
    (void)state;
    size_t len = write_all(buf), off = 0;
    cps__ent e;
    while (off < len) {
        assert_int_equal(cps__ent_next(buf + off, len - off, &e), 0);
        size_t size = e.size;
        for (size_t cut = 0; cut < size; cut++)
            assert_int_equal(cps__ent_next(buf + off, cut, &e), CPS_EPROTO);
        off += size;
    }
}

static void padding_and_reserved_words_must_be_zero(void **state)
{
    (void)state;
    cps__ent e;
    cps__param_spec spec = adam_spec();
    float v[3] = {1, 2, 3};
    /* A slice of 3 floats has 4 bytes of padding; a named value of 9 + 8 bytes has 7. */
    size_t n = cps__ent_put_slice(buf, 0, 1, 0, 3, v);
    buf[n - 1] = 1;
    assert_int_equal(cps__ent_next(buf, n, &e), CPS_EPROTO);
    n = cps__ent_put_named(buf, "agg/1/abc", 9, v, 8);
    buf[16 + 9] = 'x';
    assert_int_equal(cps__ent_next(buf, n, &e), CPS_EPROTO);
    n = cps__ent_put_create(buf, 1, 3, 0, &spec);
    buf[24] = 1;
    assert_int_equal(cps__ent_next(buf, n, &e), CPS_EPROTO);
    n = cps__ent_put_range(buf, 1, 2);
    buf[4] = 1;
    assert_int_equal(cps__ent_next(buf, n, &e), CPS_EPROTO);
}

static void bad_tags_lengths_and_specs_are_refused(void **state)
{
    (void)state;
    cps__ent e;
    cps__param_spec spec = adam_spec();
    float v[3] = {1, 2, 3};
    memset(buf, 0, 64);
    cps__le32_put(buf, 7);
    assert_int_equal(cps__ent_next(buf, 64, &e), CPS_EPROTO);
    cps__le32_put(buf, 0);
    assert_int_equal(cps__ent_next(buf, 64, &e), CPS_EPROTO);
    /* A record of length 0, and one whose spec does not decode (lr 0). */
    size_t n = cps__ent_put_create(buf, 1, 0, 0, &spec);
    assert_int_equal(cps__ent_next(buf, n, &e), CPS_EPROTO);
    spec.lr = 0;
    n = cps__ent_put_create(buf, 1, 3, 0, &spec);
    assert_int_equal(cps__ent_next(buf, n, &e), CPS_EPROTO);
    /* A slice claiming more floats than the buffer holds, up to the largest u64. */
    n = cps__ent_put_slice(buf, 0, 1, 0, 3, v);
    cps__le64_put(buf + 24, UINT64_MAX);
    assert_int_equal(cps__ent_next(buf, n, &e), CPS_EPROTO);
    /* A named value longer than the buffer. */
    n = cps__ent_put_named(buf, "agg/1/abc", 9, v, 8);
    cps__le32_put(buf + 8, 0xfffffff0u);
    assert_int_equal(cps__ent_next(buf, n, &e), CPS_EPROTO);
    /* A param entry whose length times its slots overflows nothing and still does not fit. */
    spec = adam_spec();
    n = cps__ent_put_param(buf, 1, 3, 0, &spec, 0, v, NULL);
    cps__le32_put(buf + 4, UINT32_MAX);
    assert_int_equal(cps__ent_next(buf, n, &e), CPS_EPROTO);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_writer_round_trips),
        cmocka_unit_test(a_cut_short_entry_is_refused),
        cmocka_unit_test(padding_and_reserved_words_must_be_zero),
        cmocka_unit_test(bad_tags_lengths_and_specs_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
