#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "recovery/suspect.h"

/* Servers 1, 2, 3; workers 10, 11. Evidence 1500 ms, probes answered within 1000 ms. */
static cps__suspect *make(void)
{
    cps__suspect_config cfg = {1500, 1000, 0};
    cps__suspect *s = NULL;
    assert_int_equal(cps__suspect_create(&cfg, &s), 0);
    for (uint32_t n = 1; n <= 3; n++)
        assert_int_equal(cps__suspect_watch(s, n), 0);
    cps__suspect_epoch(s, 7);
    return s;
}

static int report(cps__suspect *s, uint32_t reporter, uint64_t epoch, uint32_t suspect,
                  uint32_t unanswered, uint64_t now)
{
    cps__suspect_report_in in = {reporter, 1, epoch, suspect, unanswered};
    return cps__suspect_report(s, &in, now);
}

/* The probes of the last call, one per server; returns the round's nonce. */
static uint64_t probes(cps__suspect *s, size_t want)
{
    const cps__suspect_action *a;
    size_t n = cps__suspect_actions(s, &a);
    assert_int_equal(n, want);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(a[i].kind, CPS_SUS_PROBE);
        assert_int_equal(a[i].nonce, a[0].nonce);
    }
    return n ? a[0].nonce : 0;
}

/* The last call asked `node` again, alone: returns the new probe's nonce. */
static uint64_t asked_again(cps__suspect *s, uint32_t node)
{
    const cps__suspect_action *a;
    assert_int_equal(cps__suspect_actions(s, &a), 1);
    assert_int_equal(a[0].kind, CPS_SUS_PROBE);
    assert_int_equal(a[0].node, node);
    return a[0].nonce;
}

static size_t deaths(cps__suspect *s, uint32_t *dead)
{
    const cps__suspect_action *a;
    size_t n = cps__suspect_actions(s, &a);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(a[i].kind, CPS_SUS_DEAD);
        dead[i] = a[i].node;
    }
    return n;
}

/* Regression (issue 26's soak): a tick whose `now` is earlier than the report that started the
 * round (the scheduler's loop reads its clock once a turn; the report's handler read it later)
 * is not a round that timed out: nobody is declared dead, and the round is judged later. */
static void a_tick_before_the_round_started_declares_nobody_dead(void **state)
{
    (void)state;
    cps__suspect *s = make();
    uint32_t dead[3];
    assert_int_equal(report(s, 10, 7, 1, 2000, 5000), CPS_SUS_PROBING);
    uint64_t nonce = probes(s, 3);
    cps__suspect_tick(s, 4999);
    assert_int_equal(deaths(s, dead), 0);
    assert_true(cps__suspect_probing(s));
    /* A second report in the same lagging turn starts no new round either. */
    assert_int_equal(report(s, 11, 7, 1, 2000, 4999), CPS_SUS_PROBING);
    assert_int_equal(probes(s, 0), 0);
    cps__suspect_answered(s, 2, nonce);
    cps__suspect_answered(s, 3, nonce);
    cps__suspect_tick(s, 5999);
    assert_int_equal(deaths(s, dead), 0);
    cps__suspect_tick(s, 6000);
    asked_again(s, 1);
    cps__suspect_tick(s, 6499);
    assert_int_equal(deaths(s, dead), 0);
    cps__suspect_tick(s, 6500);
    assert_int_equal(deaths(s, dead), 1);
    assert_int_equal(dead[0], 1);
    cps__suspect_destroy(s);
}

static void bad_config_is_refused(void **state)
{
    (void)state;
    cps__suspect *s = NULL;
    cps__suspect_config zero_ev = {0, 1000, 0}, zero_probe = {1500, 0, 0};
    assert_int_equal(cps__suspect_create(&zero_ev, &s), CPS_EINVAL);
    assert_int_equal(cps__suspect_create(&zero_probe, &s), CPS_EINVAL);
    assert_int_equal(cps__suspect_create(NULL, &s), CPS_EINVAL);
}

/* The one-way partition: server 2 gets nothing, so it answers neither the worker nor the probe;
 * the others answer. Server 2 alone is asked again probe_ms after the report, and declared dead
 * when it leaves that probe unanswered too, probe_ms / 2 later. */
static void unreachable_server_is_declared_dead(void **state)
{
    (void)state;
    cps__suspect *s = make();
    uint32_t dead[4];
    assert_int_equal(report(s, 10, 7, 2, 1600, 5000), CPS_SUS_PROBING);
    uint64_t nonce = probes(s, 3);
    assert_true(cps__suspect_probing(s));
    cps__suspect_answered(s, 1, nonce);
    cps__suspect_answered(s, 3, nonce);
    cps__suspect_tick(s, 5999);
    assert_int_equal(deaths(s, dead), 0); /* not yet probe_ms */
    /* A second reporter during the round starts no second one. */
    assert_int_equal(report(s, 11, 7, 2, 1700, 5500), CPS_SUS_PROBING);
    assert_int_equal(probes(s, 0), 0);
    cps__suspect_tick(s, 6000);
    uint64_t again = asked_again(s, 2);
    assert_true(again != nonce);
    assert_true(cps__suspect_probing(s));
    cps__suspect_tick(s, 6499);
    assert_int_equal(deaths(s, dead), 0);
    cps__suspect_tick(s, 6500);
    assert_int_equal(deaths(s, dead), 1);
    assert_int_equal(dead[0], 2);
    const cps__suspect_action *a;
    cps__suspect_actions(s, &a);
    assert_int_equal(a[0].silent_ms, 1500);
    assert_int_equal(a[0].reported_by, 10);
    assert_false(cps__suspect_probing(s));
    /* Reported once, then no longer watched: a later report about it is unknown. */
    cps__suspect_tick(s, 9000);
    assert_int_equal(deaths(s, dead), 0);
    assert_int_equal(report(s, 10, 7, 2, 5000, 9000), CPS_SUS_UNKNOWN);
    cps__suspect_destroy(s);
}

/* A slow server (or a head holding a sync step for the slowest worker) answers the probe, if
 * late: no death, however long the reporter waited. */
static void slow_but_answering_server_is_not_killed(void **state)
{
    (void)state;
    cps__suspect *s = make();
    uint32_t dead[4];
    assert_int_equal(report(s, 10, 7, 1, 9000, 100), CPS_SUS_PROBING);
    uint64_t nonce = probes(s, 3);
    for (uint32_t n = 1; n <= 3; n++)
        cps__suspect_answered(s, n, nonce);
    cps__suspect_tick(s, 1099); /* 999 ms late, still within the probe time */
    assert_int_equal(deaths(s, dead), 0);
    assert_false(cps__suspect_probing(s)); /* everyone answered: the round is over */
    cps__suspect_tick(s, 60000);
    assert_int_equal(deaths(s, dead), 0);
    cps__suspect_destroy(s);
}

/* An answer to an earlier round does not clear a node in the current one, whether it comes
 * before or after the node is asked again: only the probes of the current round count. */
static void old_probe_answer_does_not_count(void **state)
{
    (void)state;
    cps__suspect *s = make();
    uint32_t dead[4];
    report(s, 10, 7, 3, 2000, 0);
    uint64_t first = probes(s, 3);
    for (uint32_t n = 1; n <= 3; n++)
        cps__suspect_answered(s, n, first);
    cps__suspect_tick(s, 10);
    /* Too soon for another round (one per probe_ms). */
    assert_int_equal(report(s, 10, 7, 3, 2000, 500), CPS_SUS_PROBING);
    assert_int_equal(probes(s, 0), 0);
    assert_int_equal(report(s, 10, 7, 3, 2500, 1000), CPS_SUS_PROBING);
    uint64_t second = probes(s, 3);
    assert_true(second != first);
    cps__suspect_answered(s, 1, second);
    cps__suspect_answered(s, 2, second);
    cps__suspect_answered(s, 3, first); /* a duplicate of its old answer */
    cps__suspect_tick(s, 2000);
    uint64_t third = asked_again(s, 3);
    assert_true(third != second && third != first);
    cps__suspect_answered(s, 3, first);     /* the earlier round's, again */
    cps__suspect_answered(s, 3, third + 1); /* no probe of ours */
    cps__suspect_tick(s, 2500);
    assert_int_equal(deaths(s, dead), 1);
    assert_int_equal(dead[0], 3);
    cps__suspect_destroy(s);
}

/* A report made under an older view is fenced: it may be about a chain that is gone. So is one
 * from a node that is not a live member (declared dead: it may be the one cut off), one about
 * an unwatched node or the reporter itself, and one below the evidence time. None starts a
 * probe, so none can kill. */
static void reports_that_do_not_count(void **state)
{
    (void)state;
    cps__suspect *s = make();
    uint32_t dead[4];
    assert_int_equal(report(s, 10, 6, 2, 5000, 100), CPS_SUS_STALE_EPOCH);
    assert_int_equal(report(s, 10, 8, 2, 5000, 100), CPS_SUS_STALE_EPOCH);
    cps__suspect_report_in ghost = {11, 0, 7, 2, 5000};
    assert_int_equal(cps__suspect_report(s, &ghost, 100), CPS_SUS_REPORTER);
    assert_int_equal(report(s, 10, 7, 42, 5000, 100), CPS_SUS_UNKNOWN);
    assert_int_equal(report(s, 2, 7, 2, 5000, 100), CPS_SUS_UNKNOWN);
    assert_int_equal(report(s, 10, 7, 2, 1499, 100), CPS_SUS_WEAK);
    assert_int_equal(probes(s, 0), 0);
    assert_false(cps__suspect_probing(s));
    cps__suspect_tick(s, 100000);
    assert_int_equal(deaths(s, dead), 0);
    /* After a new view, reports of the old one no longer count; those of the new one do. */
    cps__suspect_epoch(s, 8);
    cps__suspect_epoch(s, 5); /* epochs never go back */
    assert_int_equal(report(s, 10, 7, 2, 5000, 100), CPS_SUS_STALE_EPOCH);
    assert_int_equal(report(s, 10, 8, 2, 5000, 100), CPS_SUS_PROBING);
    probes(s, 3);
    cps__suspect_destroy(s);
}

/* A report naming the head while the head answers and its successor does not (the head waits
 * for the successor's ack): the probe finds the successor, and the head lives. */
static void the_probe_finds_the_unreachable_server_not_the_named_one(void **state)
{
    (void)state;
    cps__suspect *s = make();
    uint32_t dead[4];
    report(s, 10, 7, 1, 1500, 0);
    uint64_t nonce = probes(s, 3);
    cps__suspect_answered(s, 1, nonce);
    /* The scheduler itself stalled: server 2's answer may still be queued; the round restarts
     * its clock rather than judge. */
    cps__suspect_refresh(s, 900);
    cps__suspect_tick(s, 1000);
    assert_int_equal(deaths(s, dead), 0);
    cps__suspect_answered(s, 2, nonce);
    cps__suspect_tick(s, 1900);
    asked_again(s, 3);
    cps__suspect_tick(s, 2400);
    assert_int_equal(deaths(s, dead), 1);
    assert_int_equal(dead[0], 3);
    cps__suspect_destroy(s);
}

/* A server forgotten during a round (declared dead by heartbeats meanwhile) is not declared
 * again; one watched during a round is judged only from the next. */
static void membership_changes_during_a_round(void **state)
{
    (void)state;
    cps__suspect *s = make();
    uint32_t dead[4];
    report(s, 10, 7, 2, 2000, 0);
    uint64_t nonce = probes(s, 3);
    cps__suspect_forget(s, 2);
    assert_int_equal(cps__suspect_watch(s, 4), 0);
    cps__suspect_answered(s, 1, nonce);
    cps__suspect_answered(s, 3, nonce);
    cps__suspect_answered(s, 4, nonce); /* it was not probed: no-op */
    cps__suspect_tick(s, 1000);
    assert_int_equal(deaths(s, dead), 0);
    assert_false(cps__suspect_probing(s));
    cps__suspect_destroy(s);
}

/* The reporters' list: only servers with a request waiting and silent for the evidence time,
 * sorted by node; hearing anything from a server restarts its silence. */
static void reporters_list_only_long_silences(void **state)
{
    (void)state;
    cps__suspect_entry e[CPS_SUSPECT_MAX];
    uint32_t n = 0;
    assert_int_equal(cps__suspect_list_add(e, &n, 5, 0, 0, 10000, 1500), 0); /* nothing waits */
    assert_int_equal(cps__suspect_list_add(e, &n, 5, 8501, 0, 10000, 1500), 0);
    assert_int_equal(cps__suspect_list_add(e, &n, 5, 8500, 0, 10000, 1500), 1);
    assert_int_equal(cps__suspect_list_add(e, &n, 3, 1000, 9000, 10000, 1500), 0); /* answers */
    assert_int_equal(cps__suspect_list_add(e, &n, 3, 1000, 7000, 10000, 1500), 1);
    assert_int_equal(n, 2);
    assert_int_equal(e[0].node, 3);
    assert_int_equal(e[0].unanswered_ms, 3000);
    assert_int_equal(e[1].node, 5);
    assert_int_equal(e[1].unanswered_ms, 1500);
    unsigned char b[8 + 8 * CPS_SUSPECT_MAX];
    cps__suspect_entry back[CPS_SUSPECT_MAX];
    uint32_t m = 0;
    size_t len = cps__wire_suspects_encode(b, sizeof b, e, n);
    assert_int_equal(cps__wire_suspects_decode(b, len, back, &m), 0);
    assert_int_equal(m, 2);
}

/* The scheduler starts a round at a report's arrival (a fresh clock read) and ticks with its
 * loop's time, which may be a few ms older: a tick "before" the round has waited 0 ms, not
 * 2^64 - 9 (issue 26: every server that had not answered yet was declared dead at once). */
static void a_tick_older_than_the_round_waits(void **state)
{
    (void)state;
    cps__suspect *s = make();
    uint32_t dead[4];
    assert_int_equal(report(s, 10, 7, 2, 1600, 5009), CPS_SUS_PROBING);
    uint64_t nonce = probes(s, 3);
    cps__suspect_tick(s, 5000);
    assert_int_equal(deaths(s, dead), 0);
    assert_true(cps__suspect_probing(s));
    /* Nor does a report with an older clock start a second round. */
    assert_int_equal(report(s, 11, 7, 2, 1700, 5001), CPS_SUS_PROBING);
    assert_int_equal(probes(s, 0), 0);
    cps__suspect_answered(s, 1, nonce);
    cps__suspect_answered(s, 3, nonce);
    cps__suspect_tick(s, 6008);
    assert_int_equal(deaths(s, dead), 0);
    cps__suspect_tick(s, 6009);
    asked_again(s, 2);
    cps__suspect_tick(s, 6509);
    assert_int_equal(deaths(s, dead), 1);
    assert_int_equal(dead[0], 2);
    const cps__suspect_action *a;
    cps__suspect_actions(s, &a);
    assert_int_equal(a[0].silent_ms, 1500);
    cps__suspect_destroy(s);
}

/* A round started at 0 by a report on server 2, which alone leaves the round's probe (*first)
 * unanswered: asked again (*again) at 1000, then answers probe `answer` (either) and lives: no
 * death, however long after, and the round is over. */
static cps__suspect *server_2_asked_again_answers(int answer_first, uint64_t *first,
                                                  uint64_t *again)
{
    cps__suspect *s = make();
    uint32_t dead[4];
    report(s, 10, 7, 2, 1600, 0);
    *first = probes(s, 3);
    cps__suspect_answered(s, 1, *first);
    cps__suspect_answered(s, 3, *first);
    cps__suspect_tick(s, 1000);
    *again = asked_again(s, 2);
    assert_true(*again != *first);
    assert_true(cps__suspect_probing(s));
    cps__suspect_answered(s, 2, answer_first ? *first : *again);
    cps__suspect_tick(s, 1500);
    assert_int_equal(deaths(s, dead), 0);
    assert_false(cps__suspect_probing(s));
    cps__suspect_answered(s, 2, answer_first ? *again : *first); /* the other one, later: no harm */
    cps__suspect_tick(s, 60000);
    assert_int_equal(deaths(s, dead), 0);
    return s;
}

/* Regression (seeds 8540 and 9471 of sim --faults scale): a live server whose probe, or its
 * answer, is held back once past probe_ms was declared dead on that one late message. It is
 * asked again, and answering that probe clears it; the round then ends. */
static void one_late_answer_is_asked_again_not_a_death(void **state)
{
    (void)state;
    uint64_t first, again;
    cps__suspect_destroy(server_2_asked_again_answers(0, &first, &again));
}

/* A slow server whose answer to the round's first probe arrives after it was asked again, and
 * whose answer to the second is slower still: the first answer proves it got our message in
 * this round, so it lives (judged by the second probe alone, it died on the shorter half-window
 * with its answer to the first in hand). */
static void a_late_answer_to_the_first_probe_still_counts(void **state)
{
    (void)state;
    uint64_t nonce, again;
    cps__suspect *s = server_2_asked_again_answers(1, &nonce, &again);
    uint32_t dead[4];
    /* The next round is judged afresh: its first probe's nonce is new, and the old round's
     * answers clear nobody. */
    assert_int_equal(report(s, 10, 7, 2, 1600, 60000), CPS_SUS_PROBING);
    uint64_t next = probes(s, 3);
    assert_true(next != nonce && next != again);
    cps__suspect_answered(s, 1, next);
    cps__suspect_answered(s, 3, next);
    cps__suspect_answered(s, 2, nonce);
    cps__suspect_answered(s, 2, again);
    cps__suspect_tick(s, 61000);
    asked_again(s, 2);
    cps__suspect_answered(s, 2, nonce);
    cps__suspect_tick(s, 61500);
    assert_int_equal(deaths(s, dead), 1);
    assert_int_equal(dead[0], 2);
    cps__suspect_destroy(s);
}

/* A restarted scheduler's probes have other nonces than its earlier life's (it starts at a newer
 * epoch): an answer to an old life's probe, still in flight, is no answer to the new one's. */
static void nonces_of_an_earlier_life_do_not_count(void **state)
{
    (void)state;
    cps__suspect *old = make();
    report(old, 10, 7, 2, 1600, 0);
    uint64_t old_nonce = probes(old, 3);
    cps__suspect_destroy(old);
    cps__suspect *s = make();
    cps__suspect_epoch(s, 8); /* the new life's first epoch */
    uint32_t dead[4];
    report(s, 10, 8, 2, 1600, 0);
    uint64_t nonce = probes(s, 3);
    assert_true(nonce > old_nonce);
    for (uint32_t n = 1; n <= 3; n++)
        cps__suspect_answered(s, n, n == 2 ? old_nonce : nonce);
    cps__suspect_tick(s, 1000);
    uint64_t again = asked_again(s, 2);
    assert_true(again > nonce);
    cps__suspect_tick(s, 1500);
    assert_int_equal(deaths(s, dead), 1);
    assert_int_equal(dead[0], 2);
    cps__suspect_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bad_config_is_refused),
        cmocka_unit_test(unreachable_server_is_declared_dead),
        cmocka_unit_test(slow_but_answering_server_is_not_killed),
        cmocka_unit_test(old_probe_answer_does_not_count),
        cmocka_unit_test(reports_that_do_not_count),
        cmocka_unit_test(the_probe_finds_the_unreachable_server_not_the_named_one),
        cmocka_unit_test(membership_changes_during_a_round),
        cmocka_unit_test(reporters_list_only_long_silences),
        cmocka_unit_test(a_tick_older_than_the_round_waits),
        cmocka_unit_test(a_tick_before_the_round_started_declares_nobody_dead),
        cmocka_unit_test(one_late_answer_is_asked_again_not_a_death),
        cmocka_unit_test(a_late_answer_to_the_first_probe_still_counts),
        cmocka_unit_test(nonces_of_an_earlier_life_do_not_count),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
