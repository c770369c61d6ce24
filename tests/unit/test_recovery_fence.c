#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "core/wire.h"
#include "recovery/fence.h"

#define DEAD_AFTER 1000

static int setup(void **state)
{
    cps__fence *f = NULL;
    assert_int_equal(cps__fence_create(DEAD_AFTER, 0, &f), 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    cps__fence_destroy(*state);
    return 0;
}

/* Let the server in with view `epoch`. */
static void let_in(cps__fence *f, uint64_t epoch)
{
    assert_int_equal(cps__fence_view(f, epoch, 1, 1), CPS_FENCE_V_NEWER);
    assert_int_equal(cps__fence_install(f, epoch, 1, 1), CPS_FENCE_V_JOINED);
    assert_int_equal(cps__fence_joined(f), 1);
    assert_int_equal(cps__fence_beating(f), 1);
}

static void test_before_joining(void **state)
{
    cps__fence *f = *state;
    assert_int_equal(cps__fence_beating(f), 0);
    /* Worker requests are held for our WELCOME, chain messages are not ours yet. */
    assert_int_equal(cps__fence_admit(f, CPS_MSG_PUSH, 0), CPS_FENCE_EARLY);
    assert_int_equal(cps__fence_admit(f, CPS_MSG_PULL, 0), CPS_FENCE_EARLY);
    assert_int_equal(cps__fence_admit(f, CPS_MSG_FWD, 0), CPS_FENCE_DROP);
    assert_int_equal(cps__fence_admit(f, CPS_MSG_SNAP, 0), CPS_FENCE_DROP);
    assert_int_equal(cps__fence_admit(f, CPS_MSG_JOIN_RANGE, 1), CPS_FENCE_DROP);
    /* Not joined, only the scheduler's WELCOME answering this incarnation's HELLO lets us in:
     * not a VIEW (broadcast before our HELLO was handled, or to our previous life), not a
     * WELCOME of another incarnation (simulator seeds 917, 845). */
    assert_int_equal(cps__fence_admit(f, CPS_MSG_WELCOME, CPS_FENCE_OUR_WELCOME), CPS_FENCE_SERVE);
    assert_int_equal(cps__fence_admit(f, CPS_MSG_WELCOME, CPS_FENCE_FROM_SCHED), CPS_FENCE_DROP);
    assert_int_equal(cps__fence_admit(f, CPS_MSG_VIEW, CPS_FENCE_FROM_SCHED), CPS_FENCE_DROP);
    assert_int_equal(cps__fence_admit(f, CPS_MSG_VIEW, CPS_FENCE_FROM_PEER), CPS_FENCE_DROP);
    assert_int_equal(cps__fence_admit(f, CPS_MSG_SHUTDOWN, CPS_FENCE_FROM_SCHED), CPS_FENCE_SERVE);
    /* No stall before we are in: a slow start is not a pause. */
    assert_int_equal(cps__fence_check(f, 10 * DEAD_AFTER), 0);
    assert_int_equal(cps__fence_future(f, 99), 0);
    let_in(f, 3);
    /* In: views come from the scheduler only, any of them. */
    assert_int_equal(cps__fence_admit(f, CPS_MSG_VIEW, CPS_FENCE_FROM_SCHED), CPS_FENCE_SERVE);
    assert_int_equal(cps__fence_admit(f, CPS_MSG_WELCOME, CPS_FENCE_FROM_SCHED), CPS_FENCE_SERVE);
    assert_int_equal(cps__fence_admit(f, CPS_MSG_VIEW, CPS_FENCE_FROM_PEER), CPS_FENCE_DROP);
    assert_int_equal(cps__fence_admit(f, CPS_MSG_PUSH, 0), CPS_FENCE_SERVE);
    assert_int_equal(cps__fence_admit(f, CPS_MSG_JOIN_RANGE, 0), CPS_FENCE_DROP);
    assert_int_equal(cps__fence_admit(f, CPS_MSG_JOIN_RANGE, 1), CPS_FENCE_SERVE);
    assert_int_equal(cps__fence_future(f, 3), 0);
    assert_int_equal(cps__fence_future(f, 4), 1);
}

static void test_views(void **state)
{
    cps__fence *f = *state;
    let_in(f, 3);
    /* Older and equal views are dropped; a newer one is installed. */
    assert_int_equal(cps__fence_view(f, 2, 1, 1), CPS_FENCE_V_IGNORE);
    assert_int_equal(cps__fence_view(f, 3, 1, 1), CPS_FENCE_V_IGNORE);
    assert_int_equal(cps__fence_view(f, 4, 1, 1), CPS_FENCE_V_NEWER);
    assert_int_equal(cps__fence_install(f, 4, 1, 1), CPS_FENCE_V_INSTALL);
    assert_int_equal(cps__fence_view(f, 4, 1, 1), CPS_FENCE_V_IGNORE);
    /* A view that does not list us at all is installed (only one counting us dead fences). */
    assert_int_equal(cps__fence_view(f, 5, 0, 0), CPS_FENCE_V_NEWER);
    assert_int_equal(cps__fence_install(f, 5, 0, 0), CPS_FENCE_V_INSTALL);
}

static void test_stall_and_confirmation(void **state)
{
    cps__fence *f = *state;
    let_in(f, 3);
    assert_int_equal(cps__fence_turned(f, 100), 0);
    assert_int_equal(cps__fence_check(f, 100 + DEAD_AFTER), 0);
    /* Paused past the failure timeout: unsure, once. */
    assert_int_equal(cps__fence_check(f, 101 + DEAD_AFTER), CPS_FENCE_STALLED);
    assert_int_equal(cps__fence_check(f, 200 + DEAD_AFTER), CPS_FENCE_CALM);
    /* No answer (the request or the view was lost): ask again, every DEAD_AFTER. */
    assert_int_equal(cps__fence_check(f, 101 + 2 * DEAD_AFTER), CPS_FENCE_CALM);
    assert_int_equal(cps__fence_check(f, 102 + 2 * DEAD_AFTER), CPS_FENCE_ASK_AGAIN);
    assert_int_equal(cps__fence_check(f, 103 + 2 * DEAD_AFTER), CPS_FENCE_CALM);
    assert_int_equal(cps__fence_unsure(f), 1);
    /* Nothing is served meanwhile, and what is dropped is counted; JOIN_RANGE is not. */
    assert_int_equal(cps__fence_admit(f, CPS_MSG_PUSH, 0), CPS_FENCE_UNSURE);
    assert_int_equal(cps__fence_admit(f, CPS_MSG_FWD, 0), CPS_FENCE_UNSURE);
    assert_int_equal(cps__fence_admit(f, CPS_MSG_SNAP_REQ, 0), CPS_FENCE_UNSURE);
    assert_int_equal(cps__fence_admit(f, CPS_MSG_JOIN_RANGE, 1), CPS_FENCE_DROP);
    assert_int_equal(cps__fence_admit(f, CPS_MSG_VIEW, 1), CPS_FENCE_SERVE);
    assert_int_equal(cps__fence_dropped(f), 3);
    /* An older view says nothing about now; the view we hold, still counting us in, does. */
    assert_int_equal(cps__fence_view(f, 2, 1, 1), CPS_FENCE_V_IGNORE);
    assert_int_equal(cps__fence_unsure(f), 1);
    assert_int_equal(cps__fence_view(f, 3, 1, 1), CPS_FENCE_V_CONFIRMED);
    assert_int_equal(cps__fence_unsure(f), 0);
    assert_int_equal(cps__fence_admit(f, CPS_MSG_PUSH, 0), CPS_FENCE_SERVE);
    /* Unsure again; this time a newer view counting us in ends it too. */
    assert_int_equal(cps__fence_turned(f, 5000), CPS_FENCE_STALLED);
    assert_int_equal(cps__fence_view(f, 4, 1, 1), CPS_FENCE_V_NEWER);
    assert_int_equal(cps__fence_install(f, 4, 1, 1), CPS_FENCE_V_INSTALL);
    assert_int_equal(cps__fence_unsure(f), 0);
    /* The stall is measured from the last turn. */
    assert_int_equal(cps__fence_turned(f, 5000 + DEAD_AFTER), 0);
    assert_int_equal(cps__fence_stalled_ms(f, 5010 + DEAD_AFTER), 10);
}

static void test_fenced_and_rejoin(void **state)
{
    cps__fence *f = *state;
    let_in(f, 3);
    assert_int_equal(cps__fence_turned(f, 5000), CPS_FENCE_STALLED);
    /* The scheduler declared us dead: fenced once, the later views saying so are dropped. */
    assert_int_equal(cps__fence_view(f, 4, 1, 0), CPS_FENCE_V_NEWER);
    assert_int_equal(cps__fence_install(f, 4, 1, 0), CPS_FENCE_V_FENCED);
    assert_int_equal(cps__fence_fenced(f), 1);
    assert_int_equal(cps__fence_beating(f), 0);
    assert_int_equal(cps__fence_view(f, 5, 1, 0), CPS_FENCE_V_NEWER);
    assert_int_equal(cps__fence_install(f, 5, 1, 0), CPS_FENCE_V_IGNORE);
    /* Until the rejoin, nothing more is served under the old view (the rest of a batch). */
    assert_int_equal(cps__fence_admit(f, CPS_MSG_PUSH, 0), CPS_FENCE_DROP);
    assert_int_equal(cps__fence_admit(f, CPS_MSG_FWD, 0), CPS_FENCE_DROP);
    assert_int_equal(cps__fence_admit(f, CPS_MSG_SHUTDOWN, 1), CPS_FENCE_SERVE);
    /* Starting over: not joined, sure, no epoch; the next WELCOME lets us in afresh. */
    cps__fence_rejoin(f, 6000);
    assert_int_equal(cps__fence_fenced(f), 0);
    assert_int_equal(cps__fence_joined(f), 0);
    assert_int_equal(cps__fence_unsure(f), 0);
    assert_int_equal(cps__fence_admit(f, CPS_MSG_FWD, 0), CPS_FENCE_DROP);
    let_in(f, 6);
    assert_int_equal(cps__fence_check(f, 6000 + DEAD_AFTER), 0);
}

static void test_bad_args(void **state)
{
    (void)state;
    assert_int_equal(cps__fence_create(DEAD_AFTER, 0, NULL), CPS_EINVAL);
    cps__fence_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_before_joining, setup, teardown),
        cmocka_unit_test_setup_teardown(test_views, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stall_and_confirmation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fenced_and_rejoin, setup, teardown),
        cmocka_unit_test(test_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
