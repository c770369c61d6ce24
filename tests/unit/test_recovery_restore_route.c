/* recovery/restore_route: a restore under a view change. A range whose head is the same keeps
 * what was sent (the chain re-sends to a new successor itself), one whose head changed is
 * streamed again at the new head, one without a live replica fails the restore, by range. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "recovery/restore_route.h"

static cps__range ranges[3];

/* A view of 3 ranges; range r has the chain chains[r][0..lens[r]). */
static cps__view view_of(const uint32_t chains[3][3], const uint32_t lens[3])
{
    cps__view v;
    memset(&v, 0, sizeof v);
    v.epoch = 2;
    v.nranges = 3;
    v.ranges = ranges;
    for (uint32_t r = 0; r < 3; r++) {
        memset(&ranges[r], 0, sizeof ranges[r]);
        ranges[r].chain_len = lens[r];
        memcpy(ranges[r].chain, chains[r], lens[r] * sizeof *chains[r]);
    }
    return v;
}

static void test_a_dead_tail_keeps_the_stream_a_dead_head_restarts_it(void **state)
{
    (void)state;
    /* Chains were 1 -> 2 (range 0), 2 -> 3 (range 1), 3 -> 1 (range 2); node 2 died. */
    const uint32_t chains[3][3] = {{1}, {3}, {3, 1}};
    const uint32_t lens[3] = {1, 1, 2};
    cps__view v = view_of(chains, lens);
    const uint32_t sent[3] = {1, 2, 3};
    unsigned char again[3] = {9, 9, 9};
    uint32_t bad = 77;
    assert_int_equal(cps__restore_route(&v, 3, sent, again, &bad), 0);
    assert_int_equal(again[0], 0); /* its tail died: the head forwards to the new tail itself */
    assert_int_equal(again[1], 1); /* its head died: node 3 may lack any of its records */
    assert_int_equal(again[2], 0); /* untouched */
    assert_int_equal(bad, 77);
}

static void test_a_range_not_streamed_yet_has_nothing_to_lose(void **state)
{
    (void)state;
    const uint32_t chains[3][3] = {{3}, {3}, {3}};
    const uint32_t lens[3] = {1, 1, 1};
    cps__view v = view_of(chains, lens);
    const uint32_t sent[3] = {CPS_RR_NONE, 1, 3};
    unsigned char again[3];
    uint32_t bad;
    assert_int_equal(cps__restore_route(&v, 3, sent, again, &bad), 0);
    assert_int_equal(again[0], 0);
    assert_int_equal(again[1], 1); /* the head moved to another live node: again too */
    assert_int_equal(again[2], 0);
}

static void test_no_live_replica_fails_naming_the_first_such_range(void **state)
{
    (void)state;
    const uint32_t chains[3][3] = {{1}, {0}, {0}};
    const uint32_t lens[3] = {1, 0, 0};
    cps__view v = view_of(chains, lens);
    const uint32_t sent[3] = {2, 2, CPS_RR_NONE};
    unsigned char again[3];
    uint32_t bad = 77;
    assert_int_equal(cps__restore_route(&v, 3, sent, again, &bad), CPS_EUNAVAILABLE);
    assert_int_equal(bad, 1);
    assert_int_equal(again[0], 1); /* still judged: the head moved */
}

static void test_bad_arguments(void **state)
{
    (void)state;
    const uint32_t chains[3][3] = {{1}, {1}, {1}};
    const uint32_t lens[3] = {1, 1, 1};
    cps__view v = view_of(chains, lens);
    const uint32_t sent[3] = {1, 1, 1};
    unsigned char again[3];
    uint32_t bad;
    assert_int_equal(cps__restore_route(&v, 2, sent, again, &bad), CPS_EINVAL);
    assert_int_equal(cps__restore_route(NULL, 3, sent, again, &bad), CPS_EINVAL);
    assert_int_equal(cps__restore_route(&v, 3, NULL, again, &bad), CPS_EINVAL);
    assert_int_equal(cps__restore_route(&v, 3, sent, NULL, &bad), CPS_EINVAL);
    assert_int_equal(cps__restore_route(&v, 3, sent, again, NULL), CPS_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_dead_tail_keeps_the_stream_a_dead_head_restarts_it),
        cmocka_unit_test(test_a_range_not_streamed_yet_has_nothing_to_lose),
        cmocka_unit_test(test_no_live_replica_fails_naming_the_first_such_range),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
