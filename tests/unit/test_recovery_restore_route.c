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
static cps__node_info nodes[4];

/* A view of 3 ranges; range r has the chain chains[r][0..lens[r]); nodes 1 to 4, alive. */
static cps__view view_of(const uint32_t chains[3][3], const uint32_t lens[3])
{
    cps__view v;
    memset(&v, 0, sizeof v);
    v.epoch = 2;
    v.nranges = 3;
    v.ranges = ranges;
    memset(nodes, 0, sizeof nodes);
    for (uint32_t i = 0; i < 4; i++)
        nodes[i].id = i + 1, nodes[i].alive = 1;
    v.nodes = nodes;
    v.nnodes = 4;
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
    assert_int_equal(cps__restore_route(&v, 3, sent, NULL, again, &bad), 0);
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
    assert_int_equal(cps__restore_route(&v, 3, sent, NULL, again, &bad), 0);
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
    assert_int_equal(cps__restore_route(&v, 3, sent, NULL, again, &bad), CPS_EUNAVAILABLE);
    assert_int_equal(bad, 1);
    assert_int_equal(again[0], 1); /* still judged: the head moved */
}

static void test_a_dead_last_replica_kept_in_its_chain_waits(void **state)
{
    (void)state;
    /* The coordinator keeps a range's last replica in its chain when it dies: the range comes
     * back if node 2 restarts on its data, so range 1 is down (not streamed), not lost. */
    const uint32_t chains[3][3] = {{1}, {2}, {3}};
    const uint32_t lens[3] = {1, 1, 1};
    cps__view v = view_of(chains, lens);
    nodes[1].alive = 0;
    const uint32_t sent[3] = {1, 2, 3};
    unsigned char again[3];
    uint32_t bad = 77;
    assert_int_equal(cps__restore_route(&v, 3, sent, NULL, again, &bad), 0);
    assert_int_equal(again[1], CPS_RR_DOWN);
    assert_int_equal(again[0], CPS_RR_KEEP);
    assert_int_equal(bad, 77);
    nodes[1].alive = 1; /* it came back */
    assert_int_equal(cps__restore_route(&v, 3, sent, NULL, again, &bad), 0);
    assert_int_equal(again[1], CPS_RR_KEEP);
}

static void test_a_range_done_is_not_judged(void **state)
{
    (void)state;
    /* Range 1 was confirmed by its tail: neither an empty chain nor a dead one fails or stops it
     * ("a range its tail confirmed is not streamed again, whatever the view does later"). */
    const uint32_t chains[3][3] = {{1}, {0}, {2}};
    const uint32_t lens[3] = {1, 0, 1};
    cps__view v = view_of(chains, lens);
    nodes[1].alive = 0;
    const uint32_t sent[3] = {1, 2, 3};
    const unsigned char done[3] = {0, 1, 1};
    unsigned char again[3];
    uint32_t bad = 77;
    assert_int_equal(cps__restore_route(&v, 3, sent, done, again, &bad), 0);
    assert_int_equal(again[1], CPS_RR_KEEP);
    assert_int_equal(again[2], CPS_RR_KEEP);
    assert_int_equal(bad, 77);
    assert_int_equal(cps__restore_route(&v, 3, sent, NULL, again, &bad), CPS_EUNAVAILABLE);
    assert_int_equal(bad, 1);
    assert_int_equal(again[2], CPS_RR_DOWN);
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
    assert_int_equal(cps__restore_route(&v, 2, sent, NULL, again, &bad), CPS_EINVAL);
    assert_int_equal(cps__restore_route(NULL, 3, sent, NULL, again, &bad), CPS_EINVAL);
    assert_int_equal(cps__restore_route(&v, 3, NULL, NULL, again, &bad), CPS_EINVAL);
    assert_int_equal(cps__restore_route(&v, 3, sent, NULL, NULL, &bad), CPS_EINVAL);
    assert_int_equal(cps__restore_route(&v, 3, sent, NULL, again, NULL), CPS_EINVAL);
}

/* Answers of node 4, head of a range whose pass began at req_seq 100; PUTs 105 and 109 are in
 * flight (105 the oldest). */
static int answer(int error, int status, uint64_t put_seq, uint32_t sender)
{
    cps__rr_answer a = {sender, error, status, put_seq};
    return cps__restore_answer(&a, 4, 100, 105, 2);
}

static void test_answers_in_order_are_taken_a_later_one_proves_a_drop(void **state)
{
    (void)state;
    assert_int_equal(answer(0, 0, 105, 4), CPS_RR_TAKEN);
    /* 109 answered while 105 is not: the head dropped 105, and does not answer it later. */
    assert_int_equal(answer(0, 0, 109, 4), CPS_RR_AGAIN);
}

static void test_an_error_after_a_drop_is_its_consequence(void **state)
{
    (void)state;
    /* The slice of a key whose create (in 105) the head dropped: not the records' fault. */
    assert_int_equal(answer(1, CPS_EPROTO, 109, 4), CPS_RR_AGAIN);
    /* The same error of the oldest PUT is a verdict on the records. */
    assert_int_equal(answer(1, CPS_EPROTO, 105, 4), CPS_RR_FATAL);
    assert_int_equal(answer(1, CPS_ENOTFOUND, 105, 4), CPS_RR_FATAL);
}

static void test_not_head_or_busy_streams_again(void **state)
{
    (void)state;
    assert_int_equal(answer(1, CPS_ESTALE_EPOCH, 105, 4), CPS_RR_AGAIN);
    assert_int_equal(answer(1, CPS_EAGAIN, 105, 4), CPS_RR_AGAIN);
}

static void test_stale_or_foreign_answers_are_ignored(void **state)
{
    (void)state;
    assert_int_equal(answer(1, CPS_EPROTO, 99, 4), CPS_RR_IGNORE); /* an earlier pass's PUT */
    assert_int_equal(answer(0, 0, 99, 4), CPS_RR_IGNORE);
    assert_int_equal(answer(1, CPS_EPROTO, 0, 4), CPS_RR_IGNORE);   /* a CUT_PROBE's error */
    assert_int_equal(answer(1, CPS_EPROTO, 105, 7), CPS_RR_IGNORE); /* not this pass's head */
    assert_int_equal(answer(0, 0, 103, 4), CPS_RR_IGNORE); /* this pass's, counted already */
    cps__rr_answer a = {4, 0, 0, 105};
    assert_int_equal(cps__restore_answer(&a, 4, 100, 105, 0), CPS_RR_IGNORE); /* none in flight */
    assert_int_equal(cps__restore_answer(NULL, 4, 100, 105, 2), CPS_RR_IGNORE);
}

/* A silent head: nothing before 15 s of this pass, then again; a new pass restarts the 15 s but
 * not the hard limit, which fails after the whole timeout of silence; nothing in flight: wait. */
static void test_a_silent_head_goes_again_then_times_out(void **state)
{
    (void)state;
    const uint64_t s = 15000, t = 120000;
    assert_int_equal(cps__restore_silence(1000 + s - 1, 1000, 1000, 3, s, t), CPS_RR_WAIT);
    assert_int_equal(cps__restore_silence(1000 + s, 1000, 1000, 3, s, t), CPS_RR_RESEND);
    assert_int_equal(cps__restore_silence(1000 + s, 1000, 1000, 0, s, t), CPS_RR_WAIT);
    /* pass 2 sent at 20 s: its 15 s run from there, the limit from 1 s */
    assert_int_equal(cps__restore_silence(30000, 20000, 1000, 3, s, t), CPS_RR_WAIT);
    assert_int_equal(cps__restore_silence(35000, 20000, 1000, 3, s, t), CPS_RR_RESEND);
    assert_int_equal(cps__restore_silence(1000 + t, 110000, 1000, 3, s, t), CPS_RR_TIMEOUT);
    /* an answer restarts both */
    assert_int_equal(cps__restore_silence(1000 + t, 110000, 110000, 3, s, t), CPS_RR_WAIT);
    /* a silence rule not shorter than the timeout never sends again */
    assert_int_equal(cps__restore_silence(1000 + s, 1000, 1000, 3, t, t), CPS_RR_WAIT);
}

/* The book: a pass's PUTs taken in order, a drop proven by order, the tail's confirmation. */
static void test_book_takes_in_order_and_confirms_at_the_tail(void **state)
{
    (void)state;
    cps__rr_book b;
    assert_int_equal(cps__rr_book_init(&b, 2), 0);
    assert_int_equal(cps__rr_pass_due(&b, 500), 0); /* the first pass: at once */
    assert_int_equal(cps__rr_pass_begin(&b, 10, 0), 0);
    assert_int_equal(cps__rr_target(&b, 0, 4), 4);
    assert_int_equal(cps__rr_target(&b, 0, 5), 4); /* the pass's head stays */
    assert_int_equal(cps__rr_sent(&b, 0, 10, 100), 0);
    assert_int_equal(cps__rr_sent(&b, 0, 11, 100), 0);
    cps__rr_answer a = {4, 0, 0, 10};
    assert_int_equal(cps__rr_take(&b, 0, &a, 7, 150, NULL), CPS_RR_TAKEN);
    assert_int_equal(b.g[0].inflight, 1);
    assert_int_equal(cps__rr_confirm(&b, 0, 7), 0); /* a PUT still in flight */
    a.put_seq = 11;
    assert_int_equal(cps__rr_take(&b, 0, &a, 8, 160, NULL), CPS_RR_TAKEN);
    assert_int_equal(cps__rr_confirm(&b, 0, 7), 0); /* the tail lacks seq 8 */
    assert_int_equal(cps__rr_confirm(&b, 0, 8), 1);
    assert_false(cps__rr_open(&b, 0));
    assert_int_equal(cps__rr_stopped(&b), 0);
    cps__rr_book_fini(&b);
}

/* A book of two ranges in its first pass, range 0's PUTs going to node 1, range 1's to node 2. */
static void two_ranges(cps__rr_book *b)
{
    assert_int_equal(cps__rr_book_init(b, 2), 0);
    cps__rr_pass_begin(b, 1, 0);
    cps__rr_target(b, 0, 1);
    cps__rr_target(b, 1, 2);
}

/* A drop proven by order stops the range; the next pass streams only it, at the view's new head,
 * and an answer of the earlier pass counts for nothing there. */
static void test_book_streams_a_stopped_range_again_and_ignores_the_old_pass(void **state)
{
    (void)state;
    cps__rr_book b;
    two_ranges(&b);
    for (uint64_t q = 1; q <= 3; q++)
        assert_int_equal(cps__rr_sent(&b, 0, q, 0), 0);
    assert_int_equal(cps__rr_sent(&b, 1, 4, 0), 0);
    cps__rr_answer a = {1, 0, 0, 3};
    uint32_t lost = 0;
    assert_int_equal(cps__rr_take(&b, 0, &a, 9, 5, &lost), CPS_RR_AGAIN);
    assert_int_equal(lost, 2);
    assert_false(cps__rr_open(&b, 0));
    cps__rr_answer a1 = {2, 0, 0, 4};
    assert_int_equal(cps__rr_take(&b, 1, &a1, 1, 5, NULL), CPS_RR_TAKEN);
    assert_int_equal(cps__rr_confirm(&b, 1, 1), 1);
    assert_int_equal(cps__rr_pass_due(&b, 500), 500); /* a pass 500 ms after the last began */
    assert_int_equal(cps__rr_pass_begin(&b, 5, 500), 1);
    assert_int_equal(cps__rr_pass_due(&b, 500), 1000);
    assert_true(cps__rr_open(&b, 0));
    assert_false(cps__rr_open(&b, 1)); /* done: not streamed again */
    assert_int_equal(cps__rr_target(&b, 0, 3), 3);
    assert_int_equal(cps__rr_sent(&b, 0, 5, 10), 0);
    cps__rr_answer old = {3, 0, 0, 1}; /* a PUT of the first pass, answered late */
    assert_int_equal(cps__rr_take(&b, 0, &old, 9, 11, NULL), CPS_RR_IGNORE);
    assert_int_equal(b.g[0].inflight, 1);
    assert_int_equal(b.g[0].acked_seq, 0);
    cps__rr_book_fini(&b);
}

/* Only a tail's confirmation marks a range done: a new pass after another range stopped leaves a
 * range neither stopped nor confirmed open (it was once marked done by being merely not stopped).
 */
static void test_only_a_confirmation_marks_a_range_done(void **state)
{
    (void)state;
    cps__rr_book b;
    two_ranges(&b);
    assert_int_equal(cps__rr_sent(&b, 0, 1, 0), 0);
    assert_int_equal(cps__rr_sent(&b, 1, 2, 0), 0);
    cps__rr_answer stale = {1, 1, CPS_ESTALE_EPOCH, 1}; /* range 0's head: "not head" */
    assert_int_equal(cps__rr_take(&b, 0, &stale, 9, 5, NULL), CPS_RR_AGAIN);
    cps__rr_answer a1 = {2, 0, 0, 2}; /* range 1 answered, its tail never confirmed */
    assert_int_equal(cps__rr_take(&b, 1, &a1, 1, 5, NULL), CPS_RR_TAKEN);
    assert_int_equal(cps__rr_pass_begin(&b, 3, 500), 1);
    assert_true(cps__rr_open(&b, 0));
    assert_true(cps__rr_open(&b, 1));
    cps__rr_book_fini(&b);
}

/* A view that moves a head stops its range; one without a replica names the range; a silent head
 * stops its range, then, silent across passes, times the restore out. */
static void test_book_looks_and_judges_silence(void **state)
{
    (void)state;
    cps__rr_book b;
    assert_int_equal(cps__rr_book_init(&b, 3), 0);
    cps__rr_pass_begin(&b, 1, 0);
    for (uint32_t r = 0; r < 3; r++) {
        cps__rr_target(&b, r, r + 1);
        cps__rr_sent(&b, r, r + 1, 0);
    }
    const uint32_t chains[3][3] = {{1}, {3}, {3}};
    const uint32_t lens[3] = {1, 1, 1};
    cps__view v = view_of(chains, lens);
    uint32_t stopped = 9, bad = 9, range = 9;
    assert_int_equal(cps__rr_look(&b, &v, &stopped, &bad), 0);
    assert_int_equal(stopped, 1); /* range 1: node 2 gone */
    assert_false(cps__rr_open(&b, 1));
    assert_true(cps__rr_open(&b, 2));
    assert_int_equal(cps__rr_overdue(&b, 14999, 15000, 120000, &stopped, &range), 0);
    assert_int_equal(stopped, 0);
    assert_int_equal(cps__rr_overdue(&b, 15000, 15000, 120000, &stopped, &range), 0);
    assert_int_equal(stopped, 2);
    cps__rr_pass_begin(&b, 10, 0);
    cps__rr_target(&b, 0, 1);
    cps__rr_sent(&b, 0, 10, 100000);
    assert_int_equal(cps__rr_overdue(&b, 119999, 15000, 120000, &stopped, &range), 0);
    assert_int_equal(stopped, 1); /* silent 15 s in this pass */
    cps__rr_pass_begin(&b, 20, 0);
    cps__rr_target(&b, 0, 1);
    cps__rr_sent(&b, 0, 20, 119999);
    assert_int_equal(cps__rr_overdue(&b, 120000, 15000, 120000, &stopped, &range), CPS_ETIMEDOUT);
    assert_int_equal(range, 0);
    const uint32_t none[3][3] = {{1}, {0}, {3}};
    const uint32_t nlens[3] = {1, 0, 1};
    v = view_of(none, nlens);
    assert_int_equal(cps__rr_look(&b, &v, &stopped, &bad), CPS_EUNAVAILABLE);
    assert_int_equal(bad, 1);
    assert_int_equal(stopped, 0);
    cps__rr_book_fini(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_dead_tail_keeps_the_stream_a_dead_head_restarts_it),
        cmocka_unit_test(test_a_range_not_streamed_yet_has_nothing_to_lose),
        cmocka_unit_test(test_no_live_replica_fails_naming_the_first_such_range),
        cmocka_unit_test(test_a_dead_last_replica_kept_in_its_chain_waits),
        cmocka_unit_test(test_a_range_done_is_not_judged),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_answers_in_order_are_taken_a_later_one_proves_a_drop),
        cmocka_unit_test(test_an_error_after_a_drop_is_its_consequence),
        cmocka_unit_test(test_not_head_or_busy_streams_again),
        cmocka_unit_test(test_stale_or_foreign_answers_are_ignored),
        cmocka_unit_test(test_a_silent_head_goes_again_then_times_out),
        cmocka_unit_test(test_book_takes_in_order_and_confirms_at_the_tail),
        cmocka_unit_test(test_book_streams_a_stopped_range_again_and_ignores_the_old_pass),
        cmocka_unit_test(test_book_looks_and_judges_silence),
        cmocka_unit_test(test_only_a_confirmation_marks_a_range_done),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
