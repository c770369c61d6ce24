/* Where a tensor's values go (src/worker/layout.c): every value in exactly one key, keys distinct
 * and inside their part's range, no chunk or request over its bound, and the first request of
 * every range before any range's second (so a large push keeps every server busy from its
 * start and pipelines within each). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "core/view.h"
#include "worker/client.h"

/* The bounds layout.c promises (values): a chunk, and one request's share of a range. */
#define CHUNK_BOUND 131072u
#define SMALL_WHOLE 16384u

static void make_view(cps__view *v, uint32_t nranges)
{
    uint32_t ids[8] = {10, 11, 12, 13, 14, 15, 16, 17};
    cps__view_init(v);
    v->epoch = 1;
    v->num_servers = 8;
    v->nnodes = 8;
    v->nodes = calloc(8, sizeof *v->nodes);
    assert_non_null(v->nodes);
    for (uint32_t i = 0; i < 8; i++) {
        v->nodes[i].id = ids[i];
        v->nodes[i].role = CPS_ROLE_SERVER;
        v->nodes[i].alive = 1;
        v->nodes[i].rank = i;
        snprintf(v->nodes[i].addr, CPS_ADDR_MAX, "tcp://127.0.0.1:%u", 20000 + i);
    }
    assert_int_equal(cps__view_place_ranges(v, nranges, ids, 8, 1), 0);
}

typedef struct span {
    uint64_t off, len, key;
} span;

static int by_off(const void *a, const void *b)
{
    const span *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

static int by_key(const void *a, const void *b)
{
    const span *x = a, *y = b;
    return x->key < y->key ? -1 : x->key > y->key;
}

/* Lay out a dense tensor of `length` values (or a rows x cols table) on `nranges` ranges and
 * check every rule; returns the number of parts. */
static uint32_t check_layout(uint64_t length, uint64_t rows, uint32_t cols, uint32_t nranges,
                             uint64_t hash)
{
    cps__view v;
    make_view(&v, nranges);
    cps_tensor t;
    memset(&t, 0, sizeof t);
    t.rows = rows;
    t.cols = cols;
    t.length = rows ? rows * cols : length;
    t.hash = hash;
    assert_int_equal(cps__layout_tensor(&t, &v), 0);
    assert_true(t.nparts >= 1);

    uint64_t nkeys = 0;
    for (uint32_t p = 0; p < t.nparts; p++)
        nkeys += t.parts[p].nkeys;
    span *s = calloc(nkeys, sizeof *s);
    assert_non_null(s);
    uint64_t k = 0, total = 0;
    uint32_t first_ranges = 0;
    uint8_t *seen = calloc(nranges, 1);
    assert_non_null(seen);
    int second_started = 0;
    for (uint32_t p = 0; p < t.nparts; p++) {
        const cps__part *pt = &t.parts[p];
        assert_true(pt->nkeys >= 1);
        uint64_t sum = 0;
        for (uint32_t j = 0; j < pt->nkeys; j++) {
            assert_int_equal(cps__view_range_of(&v, pt->keys[j]), pt->range);
            if (!rows)
                assert_true(pt->lens[j] <= CHUNK_BOUND);
            else
                assert_int_equal(pt->lens[j], cols);
            assert_true(pt->src_off[j] == pt->init_off[j]);
            if (j > 0)
                assert_true(pt->keys[j] > pt->keys[j - 1]);
            s[k++] = (span){pt->src_off[j], pt->lens[j], pt->keys[j]};
            sum += pt->lens[j];
        }
        assert_true(sum == pt->nvals);
        /* One request carries at most a chunk's worth, unless a single row is longer. */
        assert_true(pt->nvals <= CHUNK_BOUND || pt->nkeys == 1);
        total += pt->nvals;
        /* Segment-major: a range's second request only after every used range had its first. */
        if (!seen[pt->range]) {
            assert_false(second_started);
            seen[pt->range] = 1;
            first_ranges++;
        } else {
            second_started = 1;
        }
    }
    assert_true(total == t.length);
    /* Every value exactly once: the spans tile 0..length. */
    qsort(s, nkeys, sizeof *s, by_off);
    uint64_t at = 0;
    for (uint64_t i = 0; i < nkeys; i++) {
        assert_true(s[i].off == at);
        at += s[i].len;
    }
    assert_true(at == t.length);
    /* Keys distinct. */
    qsort(s, nkeys, sizeof *s, by_key);
    for (uint64_t i = 1; i < nkeys; i++)
        assert_true(s[i].key != s[i - 1].key);
    /* Large tensors use every range; small dense ones stay whole. */
    if (!rows && length <= SMALL_WHOLE)
        assert_int_equal(t.nparts, 1);
    if (!rows && length >= (uint64_t)nranges * SMALL_WHOLE)
        assert_int_equal(first_ranges, nranges);

    uint32_t n = t.nparts;
    /* The same tensor on the same view: the same keys (every worker computes it alone). */
    cps_tensor u = t;
    u.parts = NULL;
    assert_int_equal(cps__layout_tensor(&u, &v), 0);
    assert_int_equal(u.nparts, t.nparts);
    for (uint32_t p = 0; p < t.nparts; p++) {
        assert_int_equal(u.parts[p].nkeys, t.parts[p].nkeys);
        assert_memory_equal(u.parts[p].keys, t.parts[p].keys, t.parts[p].nkeys * 8);
    }
    cps__parts_free(u.parts, u.nparts);
    cps__parts_free(t.parts, t.nparts);
    free(seen);
    free(s);
    cps__view_fini(&v);
    return n;
}

static void test_small_tensors_whole(void **state)
{
    (void)state;
    for (uint32_t r = 1; r <= 8; r *= 2) {
        assert_int_equal(check_layout(1, 0, 0, r, 7), 1);
        assert_int_equal(check_layout(100, 0, 0, r, 7), 1);
        assert_int_equal(check_layout(SMALL_WHOLE, 0, 0, r, 99), 1);
    }
}

static void test_medium_tensors_one_part_per_range(void **state)
{
    (void)state;
    /* Up to a chunk per range: one request per range, as before chunks were bounded. */
    assert_int_equal(check_layout(3 * SMALL_WHOLE, 0, 0, 4, 1), 3);
    assert_int_equal(check_layout(4 * CHUNK_BOUND, 0, 0, 4, 1), 4);
    assert_int_equal(check_layout(CHUNK_BOUND, 0, 0, 1, 5), 1);
}

static void test_large_tensors_pipelined(void **state)
{
    (void)state;
    /* 1 MB and 16 MB of floats on one range: 2 and 32 requests of 512 KB. */
    assert_int_equal(check_layout(262144, 0, 0, 1, 3), 2);
    assert_int_equal(check_layout(4194304, 0, 0, 1, 3), 32);
    /* Ragged ends and several ranges. */
    assert_true(check_layout(4194304 + 7, 0, 0, 3, 11) >= 33);
    assert_true(check_layout(10000019, 0, 0, 8, 12345) >= 77);
    assert_true(check_layout(CHUNK_BOUND + 1, 0, 0, 1, 2) == 2);
}

static void test_tables_by_rows(void **state)
{
    (void)state;
    /* Short rows group into requests of at most a chunk's values; a long row goes alone. */
    assert_int_equal(check_layout(0, 1000, 64, 1, 9), 1);
    assert_int_equal(check_layout(0, 4096, 64, 1, 9), 2);
    assert_int_equal(check_layout(0, 10, 100000, 2, 9), 10);
    check_layout(0, 100003, 17, 4, 77);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_tensors_whole),
        cmocka_unit_test(test_medium_tensors_one_part_per_range),
        cmocka_unit_test(test_large_tensors_pipelined),
        cmocka_unit_test(test_tables_by_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
