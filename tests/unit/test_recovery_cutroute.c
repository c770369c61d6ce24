/* recovery/cutroute: where an export reads each range's cut from across view changes (issue 26):
 * a dead reader's range moves to another replica's view at the same sequence number, a range
 * whose every view is gone is lost (cut again), a range without replicas fails at once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "recovery/cutroute.h"

/* A view of `n` ranges, each with the chain `chain[0..len)`. */
static cps__range ranges[4];
static cps__view view_of(uint32_t n, const uint32_t *chain, uint32_t len, uint64_t epoch)
{
    cps__view v;
    memset(&v, 0, sizeof v);
    v.epoch = epoch;
    v.nranges = n;
    v.ranges = ranges;
    for (uint32_t r = 0; r < n; r++) {
        memset(&ranges[r], 0, sizeof ranges[r]);
        ranges[r].chain_len = len;
        if (len) /* a range without replicas passes no chain */
            memcpy(ranges[r].chain, chain, len * sizeof *chain);
    }
    return v;
}

static int count(const cps__cr_action *a, int n, uint8_t kind, uint32_t range)
{
    int c = 0;
    for (int i = 0; i < n; i++)
        c += a[i].kind == kind && a[i].range == range;
    return c;
}

static const unsigned char need2[2] = {1, 1};

static void test_sync_asks_every_replica_and_reads_the_first_open(void **state)
{
    (void)state;
    cps__cutroute *cr;
    const cps__cr_action *a;
    assert_int_equal(cps__cutroute_create(2, need2, 1, &cr), 0);
    cps__view v = view_of(2, (uint32_t[]){1, 2, 3}, 3, 1);
    int n = cps__cutroute_view(cr, &v, &a);
    assert_int_equal(n, 6);
    assert_int_equal(count(a, n, CPS_CR_ASK, 0), 3);
    assert_int_equal(count(a, n, CPS_CR_ASK, 1), 3);
    assert_int_equal(cps__cutroute_ready(cr), 0);
    n = cps__cutroute_opened(cr, 0, 3, 10, "tcp://t:1", &a);
    assert_int_equal(n, 1);
    assert_int_equal(a[0].kind, CPS_CR_READ_FROM);
    assert_int_equal(a[0].node, 3);
    assert_string_equal(cps__cutroute_url(cr, 0, 3), "tcp://t:1");
    assert_int_equal(cps__cutroute_opened(cr, 0, 2, 10, "tcp://m:1", &a), 0);
    assert_int_equal(cps__cutroute_reader(cr, 0), 3);
    assert_int_equal(cps__cutroute_opened(cr, 1, 1, 10, "tcp://h:1", &a), 1);
    assert_int_equal(cps__cutroute_ready(cr), 1);
    assert_int_equal(cps__cutroute_seq(cr, 1), 10);
    cps__cutroute_destroy(cr);
}

static void test_dead_reader_moves_to_a_standby(void **state)
{
    (void)state;
    cps__cutroute *cr;
    const cps__cr_action *a;
    assert_int_equal(cps__cutroute_create(2, need2, 1, &cr), 0);
    cps__view v = view_of(2, (uint32_t[]){1, 2, 3}, 3, 1);
    cps__cutroute_view(cr, &v, &a);
    for (uint32_t r = 0; r < 2; r++)
        for (uint32_t node = 3; node >= 1; node--)
            cps__cutroute_opened(cr, r, node, 7, "tcp://x:1", &a);
    assert_int_equal(cps__cutroute_reader(cr, 0), 3);
    /* The tail dies: the chains become 1 -> 2; both ranges read from a view still there. */
    v = view_of(2, (uint32_t[]){1, 2}, 2, 2);
    int n = cps__cutroute_view(cr, &v, &a);
    assert_int_equal(n, 2);
    assert_int_equal(count(a, n, CPS_CR_READ_FROM, 0), 1);
    assert_int_equal(count(a, n, CPS_CR_ASK, 0), 0);
    uint32_t now = cps__cutroute_reader(cr, 0);
    assert_true(now == 1 || now == 2);
    assert_int_equal(cps__cutroute_ready(cr), 1);
    /* That reader's view closes (its server had to grow its store): the other one serves. */
    n = cps__cutroute_closed(cr, 0, now, &a);
    assert_int_equal(n, 1);
    assert_int_equal(a[0].kind, CPS_CR_READ_FROM);
    assert_int_not_equal(a[0].node, now);
    /* And when that one goes too, the range is lost: cut again. */
    n = cps__cutroute_closed(cr, 0, a[0].node, &a);
    assert_int_equal(n, 1);
    assert_int_equal(a[0].kind, CPS_CR_LOST);
    assert_int_equal(a[0].err, CPS_EAGAIN);
    assert_int_equal(cps__cutroute_ready(cr), 0);
    cps__cutroute_destroy(cr);
}

static void test_a_standby_still_asked_is_waited_for(void **state)
{
    (void)state;
    cps__cutroute *cr;
    const cps__cr_action *a;
    const unsigned char need[1] = {1};
    assert_int_equal(cps__cutroute_create(1, need, 1, &cr), 0);
    cps__view v = view_of(1, (uint32_t[]){1, 2, 3}, 3, 1);
    cps__cutroute_view(cr, &v, &a);
    assert_int_equal(cps__cutroute_opened(cr, 0, 3, 5, "tcp://t:1", &a), 1);
    v = view_of(1, (uint32_t[]){1, 2}, 2, 2);
    /* 1 and 2 have not answered yet: asked again under the newer view (a repeat to them). */
    int n = cps__cutroute_view(cr, &v, &a);
    assert_int_equal(n, 2);
    assert_int_equal(count(a, n, CPS_CR_ASK, 0), 2);
    assert_int_equal(cps__cutroute_view(cr, &v, &a), 0); /* the same view: nothing new */
    assert_int_equal(cps__cutroute_reader(cr, 0), 0);
    assert_int_equal(cps__cutroute_refused(cr, 0, 1, CPS_EPAST, 6, &a), 0);
    n = cps__cutroute_opened(cr, 0, 2, 5, "tcp://m:1", &a);
    assert_int_equal(n, 1);
    assert_int_equal(a[0].kind, CPS_CR_READ_FROM);
    assert_int_equal(a[0].node, 2);
    assert_string_equal(cps__cutroute_url(cr, 0, 2), "tcp://m:1");
    cps__cutroute_destroy(cr);
}

static void test_no_replica_fails_at_once(void **state)
{
    (void)state;
    cps__cutroute *cr;
    const cps__cr_action *a;
    const unsigned char need[2] = {0, 1};
    assert_int_equal(cps__cutroute_create(2, need, 1, &cr), 0);
    cps__view v = view_of(2, NULL, 0, 3);
    int n = cps__cutroute_view(cr, &v, &a);
    assert_int_equal(n, 1); /* range 0 holds nothing to export: not its business */
    assert_int_equal(a[0].kind, CPS_CR_LOST);
    assert_int_equal(a[0].range, 1);
    assert_int_equal(a[0].err, CPS_EUNAVAILABLE);
    /* A view of another shape is refused. */
    v = view_of(1, (uint32_t[]){1}, 1, 4);
    assert_int_equal(cps__cutroute_view(cr, &v, &a), CPS_EINVAL);
    cps__cutroute_destroy(cr);
}

static void test_every_refusal_loses_the_range_with_the_furthest_step(void **state)
{
    (void)state;
    cps__cutroute *cr;
    const cps__cr_action *a;
    const unsigned char need[1] = {1};
    assert_int_equal(cps__cutroute_create(1, need, 1, &cr), 0);
    cps__view v = view_of(1, (uint32_t[]){1, 2}, 2, 1);
    cps__cutroute_view(cr, &v, &a);
    assert_int_equal(cps__cutroute_refused(cr, 0, 2, CPS_EPAST, 40, &a), 0);
    int n = cps__cutroute_refused(cr, 0, 1, CPS_EPAST, 41, &a);
    assert_int_equal(n, 1);
    assert_int_equal(a[0].kind, CPS_CR_LOST);
    assert_int_equal(a[0].err, CPS_EPAST);
    assert_int_equal(a[0].step, 41);
    cps__cutroute_destroy(cr);
}

static void test_async_asks_the_tail_only_and_again_after_a_stale_refusal(void **state)
{
    (void)state;
    cps__cutroute *cr;
    const cps__cr_action *a;
    const unsigned char need[1] = {1};
    assert_int_equal(cps__cutroute_create(1, need, 0, &cr), 0);
    cps__view v = view_of(1, (uint32_t[]){1, 2, 3}, 3, 1);
    int n = cps__cutroute_view(cr, &v, &a);
    assert_int_equal(n, 1);
    assert_int_equal(a[0].kind, CPS_CR_ASK);
    assert_int_equal(a[0].node, 3);
    /* 3 had already left (our view was old): forgotten, and the new tail is asked. */
    assert_int_equal(cps__cutroute_refused(cr, 0, 3, CPS_ESTALE_EPOCH, 0, &a), 0);
    v = view_of(1, (uint32_t[]){1, 2}, 2, 2);
    n = cps__cutroute_view(cr, &v, &a);
    assert_int_equal(n, 1);
    assert_int_equal(a[0].kind, CPS_CR_ASK);
    assert_int_equal(a[0].node, 2);
    assert_int_equal(cps__cutroute_opened(cr, 0, 2, 9, "tcp://m:1", &a), 1);
    /* A view opened at another sequence number is closed, never read. */
    assert_int_equal(cps__cutroute_opened(cr, 0, 1, 8, "tcp://h:1", &a), 1);
    assert_int_equal(a[0].kind, CPS_CR_CLOSE);
    /* The reader dies: a "now" cut is not shared by the head, so the range is lost. */
    v = view_of(1, (uint32_t[]){1}, 1, 3);
    n = cps__cutroute_view(cr, &v, &a);
    assert_int_equal(n, 1);
    assert_int_equal(a[0].kind, CPS_CR_LOST);
    assert_int_equal(a[0].err, CPS_EAGAIN);
    cps__cutroute_destroy(cr);
}

/* sim_cutroute seed 423: 1 dies with its ask and comes back under its id (a restarted server
 * rejoins at the tail) after the view that dropped it; 2 dies too. 1 was never asked again and the
 * range waited for it until the export's timeout. */
static void test_a_replica_back_in_the_chain_is_asked_again(void **state)
{
    (void)state;
    cps__cutroute *cr;
    const cps__cr_action *a;
    const unsigned char need[1] = {1};
    assert_int_equal(cps__cutroute_create(1, need, 1, &cr), 0);
    cps__view v = view_of(1, (uint32_t[]){1, 2}, 2, 1);
    assert_int_equal(cps__cutroute_view(cr, &v, &a), 2);
    v = view_of(1, (uint32_t[]){2}, 1, 2);               /* 1 is gone */
    assert_int_equal(cps__cutroute_view(cr, &v, &a), 1); /* 2 asked again: a newer view */
    v = view_of(1, (uint32_t[]){2, 1}, 2, 3);            /* 1 is back */
    int n = cps__cutroute_view(cr, &v, &a);
    assert_int_equal(n, 2);
    assert_int_equal(count(a, n, CPS_CR_ASK, 0), 2);
    v = view_of(1, (uint32_t[]){1}, 1, 4); /* 2 is gone */
    n = cps__cutroute_view(cr, &v, &a);
    assert_int_equal(n, 1);
    assert_int_equal(a[0].kind, CPS_CR_ASK);
    assert_int_equal(a[0].node, 1);
    n = cps__cutroute_opened(cr, 0, 1, 9, "tcp://h:1", &a);
    assert_int_equal(n, 1);
    assert_int_equal(a[0].kind, CPS_CR_READ_FROM);
    assert_int_equal(a[0].node, 1);
    /* Once the range has its sequence number, a replica that comes back is not asked: its state
     * was copied after the cut. */
    v = view_of(1, (uint32_t[]){1, 3}, 2, 5);
    assert_int_equal(cps__cutroute_view(cr, &v, &a), 0);
    cps__cutroute_destroy(cr);
}

/* sim_cutroute seed 92: the tail's process died and came back within one look at the view, so
 * every view the exporter saw had it in the chain; its ask was gone with the old process. */
static void test_an_unanswered_ask_goes_again_with_a_newer_view(void **state)
{
    (void)state;
    cps__cutroute *cr;
    const cps__cr_action *a;
    const unsigned char need[1] = {1};
    assert_int_equal(cps__cutroute_create(1, need, 0, &cr), 0);
    cps__view v = view_of(1, (uint32_t[]){1, 2}, 2, 1);
    assert_int_equal(cps__cutroute_view(cr, &v, &a), 1);
    v = view_of(1, (uint32_t[]){1, 2}, 2, 3);
    int n = cps__cutroute_view(cr, &v, &a);
    assert_int_equal(n, 1);
    assert_int_equal(a[0].kind, CPS_CR_ASK);
    assert_int_equal(a[0].node, 2);
    /* Answered: never asked again. */
    assert_int_equal(cps__cutroute_opened(cr, 0, 2, 4, "tcp://t:1", &a), 1);
    v = view_of(1, (uint32_t[]){1, 2}, 2, 4);
    assert_int_equal(cps__cutroute_view(cr, &v, &a), 0);
    cps__cutroute_destroy(cr);
}

static void count_open(void *ctx, uint32_t range, uint32_t node)
{
    assert_true((range == 0 && node == 4) || (range == 1 && node == 5));
    ++*(int *)ctx;
}

static void test_each_open(void **state)
{
    (void)state;
    cps__cutroute *cr;
    const cps__cr_action *a;
    assert_int_equal(cps__cutroute_create(2, need2, 1, &cr), 0);
    cps__view v = view_of(2, (uint32_t[]){4, 5}, 2, 1);
    cps__cutroute_view(cr, &v, &a);
    cps__cutroute_opened(cr, 0, 4, 1, "tcp://a:1", &a);
    cps__cutroute_opened(cr, 1, 5, 1, "tcp://b:1", &a);
    cps__cutroute_refused(cr, 1, 4, CPS_EPAST, 2, &a);
    /* An answer from a replica never asked opens a view nobody reads: closed. */
    assert_int_equal(cps__cutroute_opened(cr, 0, 9, 1, "tcp://c:1", &a), 1);
    assert_int_equal(a[0].kind, CPS_CR_CLOSE);
    int seen = 0;
    cps__cutroute_each_open(cr, count_open, &seen);
    assert_int_equal(seen, 2);
    cps__cutroute_destroy(cr);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sync_asks_every_replica_and_reads_the_first_open),
        cmocka_unit_test(test_dead_reader_moves_to_a_standby),
        cmocka_unit_test(test_a_standby_still_asked_is_waited_for),
        cmocka_unit_test(test_no_replica_fails_at_once),
        cmocka_unit_test(test_every_refusal_loses_the_range_with_the_furthest_step),
        cmocka_unit_test(test_async_asks_the_tail_only_and_again_after_a_stale_refusal),
        cmocka_unit_test(test_a_replica_back_in_the_chain_is_asked_again),
        cmocka_unit_test(test_an_unanswered_ask_goes_again_with_a_newer_view),
        cmocka_unit_test(test_each_open),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
