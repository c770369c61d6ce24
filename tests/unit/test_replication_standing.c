/* A server's standing with its scheduler (replication/standing.c): probes, checksums, the
 * drain conversation, the scheduler-gone timer and the data directory's job id. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "core/wire.h"
#include "replication/standing.h"

static void probes_from_the_scheduler_only(void **state)
{
    (void)state;
    assert_true(cps__standing_probe(CPS_MSG_PROBE, 1));
    assert_false(cps__standing_probe(CPS_MSG_PROBE, 0));
    assert_false(cps__standing_probe(CPS_MSG_VIEW, 1));
}

static void bad_payload_told_to_workers_only(void **state)
{
    (void)state;
    assert_true(cps__standing_tell_bad(CPS_MSG_PUSH, 0, 1, 1));
    assert_false(cps__standing_tell_bad(0, 0, 1, 1)); /* header did not decode */
    assert_false(cps__standing_tell_bad(CPS_MSG_PUSH, CPS_WF_REPLY, 1, 1)); /* a reply */
    assert_false(cps__standing_tell_bad(CPS_MSG_PUSH, 0, 0, 1));            /* not in the job */
    assert_false(cps__standing_tell_bad(CPS_MSG_FWD, 0, 1, 0));             /* a server's */
}

static void checksum_needs_the_job_and_the_range(void **state)
{
    (void)state;
    cps__range rg[2];
    memset(rg, 0, sizeof rg);
    cps__view v;
    cps__view_init(&v);
    v.nranges = 2;
    v.ranges = rg;
    assert_true(cps__standing_checksum(1, &v, 1));
    assert_false(cps__standing_checksum(0, &v, 1));
    assert_false(cps__standing_checksum(1, &v, 2));
}

static void drain_held_counts_our_ranges(void **state)
{
    (void)state;
    cps__range rg[3];
    memset(rg, 0, sizeof rg);
    rg[0].chain_len = 2, rg[0].chain[0] = 1, rg[0].chain[1] = 2;
    rg[1].chain_len = 2, rg[1].chain[0] = 3, rg[1].chain[1] = 1;
    rg[2].chain_len = 1, rg[2].chain[0] = 3;
    cps__view v;
    cps__view_init(&v);
    v.nranges = 3;
    v.ranges = rg;
    assert_int_equal(cps__drain_held(&v, 1), 2);
    assert_int_equal(cps__drain_held(&v, 3), 2);
    assert_int_equal(cps__drain_held(&v, 2), 1);
    assert_int_equal(cps__drain_held(&v, 9), 0);
}

static void drain_decisions(void **state)
{
    (void)state;
    /* First signal, in the job, holding ranges: ask. */
    assert_int_equal(cps__drain_decide(CPS_DRAIN_NONE, 1, 1, 0, 2, 0, 100, 3000), CPS_DRAIN_ASK);
    /* Nothing to move, a second signal, not in the job, fenced: stop. */
    assert_int_equal(cps__drain_decide(CPS_DRAIN_NONE, 1, 1, 0, 0, 0, 100, 3000), CPS_DRAIN_STOP);
    assert_int_equal(cps__drain_decide(CPS_DRAIN_NONE, 2, 1, 0, 2, 0, 100, 3000), CPS_DRAIN_STOP);
    assert_int_equal(cps__drain_decide(CPS_DRAIN_NONE, 1, 0, 0, 2, 0, 100, 3000), CPS_DRAIN_STOP);
    assert_int_equal(cps__drain_decide(CPS_DRAIN_NONE, 1, 1, 1, 2, 0, 100, 3000), CPS_DRAIN_STOP);
    assert_int_equal(cps__drain_decide(CPS_DRAIN_ACCEPTED, 2, 1, 0, 2, 0, 100, 3000),
                     CPS_DRAIN_STOP);
    /* Asked: serve while the answer may still come, never ask twice. */
    assert_int_equal(cps__drain_decide(CPS_DRAIN_ASKED, 1, 1, 0, 2, 1000, 3999, 3000),
                     CPS_DRAIN_SERVE);
    assert_int_equal(cps__drain_decide(CPS_DRAIN_ASKED, 1, 1, 0, 2, 1000, 4000, 3000),
                     CPS_DRAIN_STOP);
    /* Accepted: serve until the scheduler ends us, even once our ranges are gone. */
    assert_int_equal(cps__drain_decide(CPS_DRAIN_ACCEPTED, 1, 1, 0, 0, 1000, 99000, 3000),
                     CPS_DRAIN_SERVE);
}

static void drain_answers(void **state)
{
    (void)state;
    assert_int_equal(cps__drain_on_answer(CPS_DRAIN_ASKED, CPS_MSG_ACK, 1), CPS_DRAIN_ACCEPTED);
    assert_int_equal(cps__drain_on_answer(CPS_DRAIN_ASKED, CPS_MSG_ERROR, 1), -1);
    /* Not an answer to our DRAIN: a worker's, or one before we asked or after it was taken. */
    assert_int_equal(cps__drain_on_answer(CPS_DRAIN_ASKED, CPS_MSG_ERROR, 0), CPS_DRAIN_ASKED);
    assert_int_equal(cps__drain_on_answer(CPS_DRAIN_NONE, CPS_MSG_ERROR, 1), CPS_DRAIN_NONE);
    assert_int_equal(cps__drain_on_answer(CPS_DRAIN_NONE, CPS_MSG_ACK, 1), CPS_DRAIN_NONE);
    assert_int_equal(cps__drain_on_answer(CPS_DRAIN_ACCEPTED, CPS_MSG_ERROR, 1),
                     CPS_DRAIN_ACCEPTED);
    assert_int_equal(cps__drain_on_answer(CPS_DRAIN_ASKED, CPS_MSG_VIEW, 1), CPS_DRAIN_ASKED);
}

static void scheduler_gone_after_the_timeout(void **state)
{
    (void)state;
    uint64_t seen = 1000;
    assert_false(cps__standing_sched_gone(0, &seen, 6000, 5000));
    assert_true(cps__standing_sched_gone(0, &seen, 6001, 5000));
    assert_int_equal(seen, 1000);
    /* A connection is proof of life. */
    assert_false(cps__standing_sched_gone(1, &seen, 7000, 5000));
    assert_int_equal(seen, 7000);
    assert_false(cps__standing_sched_gone(0, &seen, 12000, 5000));
    /* The clock went back: start over rather than wrap. */
    seen = 9000;
    assert_false(cps__standing_sched_gone(0, &seen, 500, 5000));
    assert_int_equal(seen, 500);
}

static void job_of_the_directory(void **state)
{
    (void)state;
    int store = -1;
    assert_int_equal(cps__standing_job(0x77, 0, &store), 0);
    assert_int_equal(store, 1);
    assert_int_equal(cps__standing_job(0x77, 0x77, &store), 0);
    assert_int_equal(store, 0);
    assert_int_equal(cps__standing_job(0x77, 0x78, &store), CPS_EEXIST);
    assert_int_equal(store, 0);
    assert_int_equal(cps__standing_job(0, 0x78, &store), 0); /* a scheduler before job ids */
    assert_int_equal(store, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(probes_from_the_scheduler_only),
        cmocka_unit_test(bad_payload_told_to_workers_only),
        cmocka_unit_test(checksum_needs_the_job_and_the_range),
        cmocka_unit_test(drain_held_counts_our_ranges),
        cmocka_unit_test(drain_decisions),
        cmocka_unit_test(drain_answers),
        cmocka_unit_test(scheduler_gone_after_the_timeout),
        cmocka_unit_test(job_of_the_directory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
