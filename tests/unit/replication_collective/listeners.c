/* unit.replication_collective: joiners that listen for their predecessor's seq or result. */
#include "fixture.h"

/* Two joiners re-formed by a view, each waiting for its predecessor: neither sends a chunk; when
 * each has heard the other listen, both take the higher seq (no timer: waiting long changes
 * nothing). */
void test_listeners_agree(void **state)
{
    (void)state;
    const cps__coll_act *a;
    float x[2] = {1, 2};
    uint32_t two[2] = {9, 11};
    cps__coll *c = joiner_started(x);
    assert_int_equal(cps__coll_view(c, 2, two, 2, 1, 1), 0);
    assert_int_equal(cps__coll_actions(c, &a), 1);
    assert_int_equal(a[0].msg.kind, CPS_COLL_LISTEN);
    cps__coll_tick(c, 800); /* past half the timeout: still nothing */
    assert_int_equal(cps__coll_actions(c, &a), 0);
    cps__coll_msg m = {.from = 11, .kind = CPS_COLL_LISTEN, .epoch = 2, .seq = 4};
    cps__coll_step(c, &m, 801);
    size_t n = cps__coll_actions(c, &a);
    assert_true(n >= 1);
    assert_int_equal(a[0].kind, CPS_COLL_SEND);
    assert_int_equal(a[0].msg.kind, CPS_COLL_DATA);
    assert_int_equal(a[0].msg.seq, 4);
    cps__coll_destroy(c);
}

/* A ring of joiners only, one of them (11) pinned at 3, another (12) guessing 5: the pinned one
 * stays in 3 whatever it hears, so every other member must take 3 too, not the highest seq named
 * (the ring split, each waiting for the other's chunks until the timeout: sim_collective
 * --guess-seq). */
void test_listeners_follow_pin(void **state)
{
    (void)state;
    const cps__coll_act *a;
    float x[2] = {1, 2};
    uint32_t three[3] = {9, 11, 12};
    cps__coll *c = joiner_started(x);
    assert_int_equal(cps__coll_view(c, 2, three, 3, 1, 1), 0);
    assert_int_equal(cps__coll_actions(c, &a), 2);
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(a[i].msg.kind, CPS_COLL_LISTEN);
        assert_int_equal(a[i].msg.index, 0); /* not pinned: nothing reduced yet */
    }
    cps__coll_msg pin = {.from = 11, .kind = CPS_COLL_LISTEN, .epoch = 2, .seq = 3, .index = 1};
    cps__coll_msg guess = {.from = 12, .kind = CPS_COLL_LISTEN, .epoch = 2, .seq = 5};
    cps__coll_step(c, &guess, 2);
    assert_int_equal(cps__coll_actions(c, &a), 0); /* 11 not heard yet */
    cps__coll_step(c, &pin, 3);
    size_t n = cps__coll_actions(c, &a);
    assert_true(n >= 1);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(a[i].kind, CPS_COLL_SEND);
        assert_int_equal(a[i].msg.kind, CPS_COLL_DATA);
        assert_int_equal(a[i].msg.seq, 3);
    }
    assert_int_equal(cps__coll_seq(c), 3);
    cps__coll_destroy(c);
}

/* A joiner that guesses its sequence and runs nothing yet gets its predecessor's chunk of 6: the
 * others may have completed 6 under an older view, the sender restarting it after the fence
 * dropped its last chunk, with us its only successor; if our program never calls again (the job
 * ended), only an ask gets the restarter the result (sim_collective --guess-seq, seed 280). It
 * asks every member once, and the chunk stays for the call that may still come, which joins 6. */
void test_idle_joiner_asks_for_a_restart(void **state)
{
    (void)state;
    const cps__coll_act *a;
    uint32_t three[3] = {10, 9, 11};
    cps__coll *c = node9(3, three, 3, 1, 0);
    assert_int_equal(cps__coll_actions(c, &a), 0);
    cps__coll_msg m = msg2(10, CPS_COLL_DATA, 3, 6, NULL, 0); /* segment 0 of 2 values: empty */
    cps__coll_step(c, &m, 1);
    assert_int_equal(cps__coll_actions(c, &a), 2);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(a[i].kind, CPS_COLL_SEND);
        assert_int_equal(a[i].msg.kind, CPS_COLL_ASK);
        assert_int_equal(a[i].msg.seq, 6);
        assert_int_equal(a[i].msg.epoch, 3);
    }
    assert_true((a[0].to == 10 && a[1].to == 11) || (a[0].to == 11 && a[1].to == 10));
    cps__coll_step(c, &m, 2); /* the same again: asked already in this view */
    assert_int_equal(cps__coll_actions(c, &a), 0);
    /* Our call comes after all: it joins 6 by the kept chunk, with our input. */
    float x[2] = {1, 2};
    uint64_t seq;
    assert_int_equal(cps__coll_start(c, x, 2, CPS_COLL_SUM, 3, &seq), 0);
    assert_true(cps__coll_running(c));
    assert_int_equal(cps__coll_seq(c), 6);
    size_t n = cps__coll_actions(c, &a);
    int sent6 = 0;
    for (size_t i = 0; i < n; i++)
        sent6 |= a[i].kind == CPS_COLL_SEND && a[i].msg.kind == CPS_COLL_DATA && a[i].msg.seq == 6;
    assert_true(sent6);
    cps__coll_destroy(c);
    /* A member whose sequence was given does not ask for a collective ahead of it. */
    c = node9(3, three, 3, 0, 3);
    m.seq = 6;
    cps__coll_step(c, &m, 1);
    assert_int_equal(cps__coll_actions(c, &a), 0);
    cps__coll_destroy(c);
}

/* A listening joiner (re-formed by a view, waiting for its predecessor's chunk) whose peers all
 * completed the ring's last collective gets no chunk ever: only that collective's result,
 * broadcast to answer a restart (sim_collective --guess-seq, seed 3514). Not pinned, it takes it
 * as its call's result, as it would have after a chunk of that collective. */
void test_listening_joiner_takes_a_result(void **state)
{
    (void)state;
    const cps__coll_act *a;
    uint32_t two[2] = {9, 11};
    float x[2] = {1, 2};
    cps__coll *c = joiner_started(x);
    assert_int_equal(cps__coll_view(c, 2, two, 2, 1, 1), 0);
    assert_int_equal(cps__coll_actions(c, &a), 1);
    assert_int_equal(a[0].msg.kind, CPS_COLL_LISTEN);
    float res[2] = {7, 8};
    cps__coll_msg r = msg2(11, CPS_COLL_RESULT, 2, 6, res, 2);
    cps__coll_step(c, &r, 2);
    /* Its call moved to 6 (its first chunk goes, as after a predecessor's chunk: the peer that
     * completed 6 answers it with the result again) and completed with the result. */
    size_t n = cps__coll_actions(c, &a);
    assert_int_equal(n, 2);
    assert_int_equal(a[0].kind, CPS_COLL_SEND);
    assert_int_equal(a[0].msg.seq, 6);
    assert_int_equal(a[1].kind, CPS_COLL_DONE);
    assert_int_equal(a[1].seq, 6);
    assert_true(x[0] == 7.0f && x[1] == 8.0f);
    cps__coll_destroy(c);
}

/* A listening joiner that is not pinned never moves its guess backwards on a result: one below
 * its seq is an older collective's, re-sent to answer someone's restart. Here the joiner took 4
 * from its predecessor's chunk; after a view it listens, and 11's result of 3 must not complete
 * its call as 3 (its input would count in no collective the ring runs next). */
void test_listener_ignores_an_older_result(void **state)
{
    (void)state;
    const cps__coll_act *a;
    uint32_t two[2] = {9, 11};
    float x[2] = {1, 2};
    cps__coll *c = joiner_started(x);
    float v = 5;
    cps__coll_msg m = msg2(10, CPS_COLL_DATA, 1, 4, &v, 1);
    cps__coll_step(c, &m, 1);
    size_t n = cps__coll_actions(c, &a);
    assert_true(n >= 1);
    assert_int_equal(a[0].msg.seq, 4);
    assert_int_equal(cps__coll_view(c, 2, two, 2, 1, 2), 0);
    assert_int_equal(cps__coll_actions(c, &a), 1);
    assert_int_equal(a[0].msg.kind, CPS_COLL_LISTEN);
    float res[2] = {7, 8};
    cps__coll_msg r = msg2(11, CPS_COLL_RESULT, 2, 3, res, 2);
    cps__coll_step(c, &r, 3);
    n = cps__coll_actions(c, &a);
    for (size_t i = 0; i < n; i++)
        assert_false(a[i].kind == CPS_COLL_DONE);
    assert_true(x[0] == 1.0f && x[1] == 2.0f);
    /* Its own collective's result (4) is taken. */
    r.seq = 4;
    cps__coll_step(c, &r, 4);
    n = cps__coll_actions(c, &a);
    assert_true(n >= 1);
    assert_int_equal(a[n - 1].kind, CPS_COLL_DONE);
    assert_int_equal(a[n - 1].seq, 4);
    assert_true(x[0] == 7.0f && x[1] == 8.0f);
    cps__coll_destroy(c);
}

/* A listener pinned in collective 1, which we completed and it did not (the fence dropped its last
 * chunk), waits for its predecessor; if that is us, or every member is past 1, no chunk comes
 * (sim_collective --guess-seq, seed 1997). Its LISTEN gets our result, to every member. */
void test_listen_in_a_completed_collective_gets_the_result(void **state)
{
    (void)state;
    const cps__coll_act *a;
    uint64_t seq;
    float x[2] = {1, 2};
    uint32_t two[2] = {10, 9}, three[3] = {10, 9, 11};
    cps__coll *c = node9(1, two, 2, 0, 0);
    assert_int_equal(cps__coll_start(c, x, 2, CPS_COLL_SUM, 0, &seq), 0);
    assert_int_equal(seq, 1);
    float hundred = 100, seg1 = 7;
    cps__coll_msg m = msg2(10, CPS_COLL_DATA, 1, 1, &hundred, 1);
    cps__coll_step(c, &m, 1);
    m.index = 1;
    m.vals = &seg1;
    cps__coll_step(c, &m, 2);
    size_t n = cps__coll_actions(c, &a);
    assert_int_equal(a[n - 1].kind, CPS_COLL_DONE);
    assert_int_equal(cps__coll_view(c, 2, three, 3, 1, 3), 0);
    cps__coll_actions(c, &a);
    cps__coll_msg l = {.from = 11, .kind = CPS_COLL_LISTEN, .epoch = 2, .seq = 1, .index = 1};
    cps__coll_step(c, &l, 4);
    n = cps__coll_actions(c, &a);
    int to11 = 0;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(a[i].kind, CPS_COLL_SEND);
        assert_int_equal(a[i].msg.kind, CPS_COLL_RESULT);
        assert_int_equal(a[i].msg.seq, 1);
        assert_int_equal(a[i].msg.count, 2);
        assert_true(a[i].msg.vals[0] == x[0] && a[i].msg.vals[1] == x[1]); /* what we completed */
        to11 |= a[i].to == 11;
    }
    assert_true(to11);
    /* A LISTEN naming another collective gets nothing. */
    l.seq = 2;
    l.from = 10;
    cps__coll_step(c, &l, 5);
    assert_int_equal(cps__coll_actions(c, &a), 0);
    cps__coll_destroy(c);
}
