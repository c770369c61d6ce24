/* unit.replication_collective: epochs, and joiners: where they join, which seq they take. */
#include "fixture.h"

/* A fetch's answer names the ring's next collective; it is taken only while the shell holds no
 * call of the ring (started or waiting): a late answer must not renumber a call already ordered
 * against the ring, nor does an older sharer's answer without a sequence (0) change anything. */
void test_next_seq_waits_for_no_calls(void **state)
{
    (void)state;
    const cps__coll_act *a;
    uint64_t seq;
    float x[2] = {1, 2};
    uint32_t three[3] = {10, 9, 11};
    cps__coll *c = node9(1, three, 3, 1, 0);
    assert_int_equal(cps__coll_set_next_seq(c, 5, 1), CPS_EBUSY); /* a call is queued */
    assert_int_equal(cps__coll_actions(c, &a), 0);
    assert_int_equal(cps__coll_set_next_seq(c, 0, 0), CPS_EBUSY); /* none sent */
    assert_int_equal(cps__coll_seq(c), 0);
    /* Still joining: the call guesses its sequence from the predecessor, not from the answer. */
    assert_int_equal(cps__coll_start(c, x, 2, CPS_COLL_SUM, 0, &seq), 0);
    assert_int_equal(seq, 1);
    assert_int_equal(cps__coll_set_next_seq(c, 5, 0), CPS_EBUSY); /* it runs */
    assert_int_equal(cps__coll_seq(c), 1);
    cps__coll_destroy(c);
    /* No call held: taken, and the next call runs it. */
    c = node9(1, three, 3, 1, 0);
    assert_int_equal(cps__coll_set_next_seq(c, 5, 0), 0);
    assert_int_equal(cps__coll_start(c, x, 2, CPS_COLL_SUM, 0, &seq), 0);
    assert_int_equal(seq, 5);
    cps__coll_destroy(c);
}

/* Fencing: an old epoch's message is dropped; a newer one waits for its view. */
void test_epochs(void **state)
{
    (void)state;
    const cps__coll_act *a;
    uint64_t seq;
    float x[2] = {1, 2};
    uint32_t two[2] = {9, 10};
    cps__coll *c = node9(7, two, 2, 0, 0);
    assert_int_equal(cps__coll_start(c, x, 2, CPS_COLL_SUM, 0, &seq), 0);
    assert_int_equal(cps__coll_actions(c, &a), 1);
    assert_int_equal(a[0].to, 10);
    assert_int_equal(a[0].msg.count, 1);
    float one = 100;
    cps__coll_msg m = msg2(10, CPS_COLL_DATA, 6, 1, &one, 1);
    cps__coll_step(c, &m, 1);
    assert_int_equal(cps__coll_actions(c, &a), 0);
    cps__coll_stats st;
    cps__coll_stats_get(c, &st);
    assert_int_equal(st.dropped_stale, 1);
    /* From a node outside the ring, or of the wrong length: dropped, nothing sent. */
    m.epoch = 7;
    m.from = 11;
    cps__coll_step(c, &m, 1);
    assert_int_equal(cps__coll_actions(c, &a), 0);
    m.from = 10;
    m.count = 2;
    cps__coll_step(c, &m, 1);
    assert_int_equal(cps__coll_actions(c, &a), 0);
    m.count = 1;
    m.n = 3;
    cps__coll_step(c, &m, 1);
    assert_int_equal(cps__coll_actions(c, &a), 0);
    m.n = 2;
    cps__coll_stats_get(c, &st);
    assert_int_equal(st.dropped_bad, 3);
    assert_true(x[0] == 1 && x[1] == 2);
    m.epoch = 8;
    cps__coll_step(c, &m, 1);
    assert_int_equal(cps__coll_actions(c, &a), 1);
    assert_int_equal(a[0].kind, CPS_COLL_NEED_VIEW);
    assert_int_equal(a[0].epoch, 8);
    /* Our input is untouched so far; the view restarts us and the kept message completes step 0 */
    assert_true(x[0] == 1 && x[1] == 2);
    assert_int_equal(cps__coll_view(c, 8, two, 2, 1, 2), 0);
    assert_int_equal(cps__coll_actions(c, &a), 2); /* our step 0 again, then step 1 */
    assert_int_equal(a[0].msg.epoch, 8);
    assert_int_equal(a[0].msg.index, 0);
    assert_int_equal(a[1].msg.index, 1);
    assert_true(a[1].msg.vals[0] == 102.0f); /* member 10's 100 + our x[1] */
    cps__coll_destroy(c);
}

/* A joiner holding a future epoch's message of a later collective: the view restarts the running
 * collective, draining the stash, and that message moves the joiner to its seq, which restarts it
 * again. The restart inside the drain freed the held message a second time (sim_collective found
 * it: glibc aborted "double free"); now the message is taken once and the ring completes. */
void test_joiner_restart_in_drain(void **state)
{
    (void)state;
    const cps__coll_act *a;
    uint64_t seq;
    float x[2] = {1, 2};
    uint32_t two[2] = {9, 10};
    cps__coll *c = node9(1, two, 2, 1, 0);
    assert_int_equal(cps__coll_start(c, x, 2, CPS_COLL_SUM, 0, &seq), 0);
    assert_int_equal(seq, 1);
    float hundred = 100;
    cps__coll_msg m = msg2(10, CPS_COLL_DATA, 2, 3, &hundred, 1);
    cps__coll_step(c, &m, 1);
    assert_int_equal(cps__coll_actions(c, &a), 1);
    assert_int_equal(a[0].kind, CPS_COLL_NEED_VIEW);
    assert_int_equal(cps__coll_view(c, 2, two, 2, 1, 2), 0);
    size_t n = cps__coll_actions(c, &a);
    assert_true(n >= 2);
    /* The last two sends: seq 3's step 0 (our segment 0) and step 1 (segment 1 reduced). */
    assert_int_equal(a[n - 2].kind, CPS_COLL_SEND);
    assert_int_equal(a[n - 2].msg.seq, 3);
    assert_int_equal(a[n - 2].msg.index, 0);
    assert_int_equal(a[n - 1].msg.seq, 3);
    assert_int_equal(a[n - 1].msg.index, 1);
    assert_true(a[n - 1].msg.vals[0] == 102.0f);
    cps__coll_stats st;
    cps__coll_stats_get(c, &st);
    assert_int_equal(st.dropped_stale, 0); /* taken once, not dropped as a replay of itself */
    float seg0 = 7;
    m.index = 1;
    m.vals = &seg0;
    cps__coll_step(c, &m, 3);
    assert_int_equal(cps__coll_actions(c, &a), 1);
    assert_int_equal(a[0].kind, CPS_COLL_DONE);
    assert_int_equal(a[0].seq, 3);
    assert_true(x[0] == 7.0f && x[1] == 102.0f);
    cps__coll_destroy(c);
}

/* A joiner took seq 4 from a predecessor that then died; its new predecessor is still in 3. The
 * new view must not make it send seq 4's chunks (the peer would keep them, end 3 with us, and
 * reduce our first call's input into 4 beside our second call's: sim_collective, seed 4862): it
 * waits for its predecessor's seq and joins 3. */
void test_joiner_listens_after_view(void **state)
{
    (void)state;
    const cps__coll_act *a;
    uint64_t seq;
    float x[2] = {1, 2};
    uint32_t two[2] = {9, 11};
    cps__coll *c = joiner_started(x);
    float v = 5;
    cps__coll_msg m = msg2(10, CPS_COLL_DATA, 1, 4, &v, 1);
    cps__coll_step(c, &m, 1); /* from our predecessor: the ring is in 4 */
    size_t n = cps__coll_actions(c, &a);
    assert_true(n >= 1);
    assert_int_equal(a[0].msg.seq, 4);
    /* Node 10 dies: the ring is 9 -> 11 -> 9, and 11 is still in 3. */
    assert_int_equal(cps__coll_view(c, 2, two, 2, 1, 2), 0);
    /* No chunk: only that we listen, to the other member. */
    assert_int_equal(cps__coll_actions(c, &a), 1);
    assert_int_equal(a[0].msg.kind, CPS_COLL_LISTEN);
    assert_int_equal(a[0].to, 11);
    float hundred = 100;
    m = msg2(11, CPS_COLL_DATA, 2, 3, &hundred, 1);
    cps__coll_step(c, &m, 3);
    n = cps__coll_actions(c, &a);
    assert_int_equal(n, 2);
    assert_int_equal(a[0].msg.seq, 3);
    assert_int_equal(a[0].msg.index, 0);
    assert_true(a[0].msg.vals[0] == 1.0f); /* our segment 0 */
    assert_int_equal(a[1].msg.seq, 3);
    assert_int_equal(a[1].msg.index, 1);
    assert_true(a[1].msg.vals[0] == 102.0f);
    float seg0 = 7;
    m.index = 1;
    m.vals = &seg0;
    cps__coll_step(c, &m, 4);
    assert_int_equal(cps__coll_actions(c, &a), 1);
    assert_int_equal(a[0].kind, CPS_COLL_DONE);
    assert_int_equal(a[0].seq, 3);
    assert_true(x[0] == 7.0f && x[1] == 102.0f);
    /* Its next call is 4, with the ring. */
    assert_int_equal(cps__coll_start(c, x, 2, CPS_COLL_SUM, 5, &seq), 0);
    assert_int_equal(seq, 4);
    cps__coll_destroy(c);
}

/* A replacement told the ring's next seq (3) by its fetch gets a survivor's restart of 2, which it
 * never ran and holds no result of: it asks every member for that result, once per view (the old
 * code dropped the chunk and the survivor waited out the timeout). A result it then receives is
 * kept and given to a member restarting 2 under a later view. */
void test_given_seq_asks_and_keeps(void **state)
{
    (void)state;
    const cps__coll_act *a;
    uint32_t three[3] = {10, 9, 11};
    cps__coll *c = node9(1, three, 3, 0, 3);
    assert_int_equal(cps__coll_actions(c, &a), 0);
    float v = 5;
    cps__coll_msg m = msg2(10, CPS_COLL_DATA, 1, 2, &v, 1);
    cps__coll_step(c, &m, 1);
    assert_int_equal(cps__coll_actions(c, &a), 2);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(a[i].kind, CPS_COLL_SEND);
        assert_int_equal(a[i].msg.kind, CPS_COLL_ASK);
        assert_int_equal(a[i].msg.seq, 2);
    }
    assert_true((a[0].to == 10 && a[1].to == 11) || (a[0].to == 11 && a[1].to == 10));
    m.index = 1;
    cps__coll_step(c, &m, 2);
    assert_int_equal(cps__coll_actions(c, &a), 0); /* asked already in this view */
    float res[2] = {7, 8};
    cps__coll_msg r = msg2(11, CPS_COLL_RESULT, 1, 2, res, 2);
    cps__coll_step(c, &r, 3);
    assert_int_equal(cps__coll_actions(c, &a), 0);
    /* Node 11 dies; node 10 restarts 2 under view 2: it gets 11's result from us. */
    uint32_t two[2] = {10, 9};
    assert_int_equal(cps__coll_view(c, 2, two, 2, 1, 4), 0);
    m.epoch = 2;
    m.index = 0;
    cps__coll_step(c, &m, 5);
    assert_int_equal(cps__coll_actions(c, &a), 1);
    assert_int_equal(a[0].to, 10);
    assert_int_equal(a[0].msg.kind, CPS_COLL_RESULT);
    assert_int_equal(a[0].msg.seq, 2);
    assert_int_equal(a[0].msg.count, 2);
    assert_true(a[0].msg.vals[0] == 7.0f && a[0].msg.vals[1] == 8.0f);
    cps__coll_destroy(c);
}

/* The fetch also brought the result of the collective before ours (the sharer's): when every
 * member that completed it died, we answer the survivors' restart with it, to all at first, then
 * only to a member that asks again in the same view. */
void test_adopted_result_answers_restart(void **state)
{
    (void)state;
    const cps__coll_act *a;
    uint32_t three[3] = {10, 9, 11};
    float res[2] = {3, 4};
    cps__coll *c = node9(1, three, 3, 0, 5);
    assert_int_equal(cps__coll_adopt_result(c, 3, res, 2), CPS_EINVAL); /* not the one before 5 */
    assert_int_equal(cps__coll_adopt_result(c, 4, res, 2), 0);
    res[0] = 99; /* copied */
    float v = 5;
    cps__coll_msg m = msg2(10, CPS_COLL_DATA, 1, 4, &v, 1);
    cps__coll_step(c, &m, 1);
    assert_int_equal(cps__coll_actions(c, &a), 2);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(a[i].msg.kind, CPS_COLL_RESULT);
        assert_int_equal(a[i].msg.index, 0); /* a broadcast */
        assert_true(a[i].msg.vals[0] == 3.0f && a[i].msg.vals[1] == 4.0f);
    }
    m.from = 11;
    cps__coll_step(c, &m, 2);
    assert_int_equal(cps__coll_actions(c, &a), 1);
    assert_int_equal(a[0].to, 11);
    assert_int_equal(a[0].msg.index, 1); /* to it alone */
    cps__coll_destroy(c);
}

/* A replacement running its first call (3) gets its predecessor's restart of 2, which the member
 * it fetched from completed and which no member of this view holds: it takes part with zeros (its
 * input is its contribution to 3: given to 2 as well, it counted twice), keeps the result out of
 * the caller's buffer, then restarts 3 (the old code dropped the chunk: the survivor waited out
 * the timeout). */
void test_given_seq_helps_skipped(void **state)
{
    (void)state;
    const cps__coll_act *a;
    uint64_t seq;
    float x[2] = {1, 2};
    uint32_t two[2] = {10, 9};
    cps__coll *c = node9(1, two, 2, 0, 3);
    assert_int_equal(cps__coll_start(c, x, 2, CPS_COLL_SUM, 0, &seq), 0);
    assert_int_equal(seq, 3);
    float hundred = 100;
    cps__coll_msg m = msg2(10, CPS_COLL_DATA, 1, 2, &hundred, 1);
    cps__coll_step(c, &m, 1);
    size_t n = cps__coll_actions(c, &a);
    assert_int_equal(n, 2);
    assert_int_equal(a[0].msg.seq, 2); /* our segment 1 */
    assert_int_equal(a[0].msg.index, 0);
    assert_true(a[0].msg.vals[0] == 0.0f); /* zeros, not our 2 */
    assert_int_equal(a[1].msg.seq, 2);     /* segment 0 reduced: 100 + 0 */
    assert_int_equal(a[1].msg.index, 1);
    assert_true(a[1].msg.vals[0] == 100.0f);
    float seg1 = 7;
    m.index = 1;
    m.vals = &seg1;
    cps__coll_step(c, &m, 2);
    n = cps__coll_actions(c, &a);
    assert_int_equal(n, 1); /* no DONE: 3 restarts, its chunk again */
    assert_int_equal(a[0].kind, CPS_COLL_SEND);
    assert_int_equal(a[0].msg.seq, 3);
    assert_int_equal(a[0].msg.index, 0);
    assert_true(a[0].msg.vals[0] == 2.0f);     /* our own call: our input */
    assert_true(x[0] == 1.0f && x[1] == 2.0f); /* the caller's input untouched */
    assert_true(cps__coll_running(c));
    cps__coll_stats st;
    cps__coll_stats_get(c, &st);
    assert_int_equal(st.helped, 1);
    /* 2's result, kept for members that restart it: the survivor's values alone. */
    uint64_t rseq, rn;
    const float *rv;
    assert_int_equal(cps__coll_last_result(c, &rseq, &rv, &rn), 1);
    assert_int_equal(rseq, 2);
    assert_int_equal(rn, 2);
    assert_true(rv[0] == 100.0f && rv[1] == 7.0f);
    cps__coll_destroy(c);
}

/* A joiner reduced its segment of its collective (1): its input may be in 1's result at a peer
 * now. A peer's chunk of 2 (that peer completed 1) must not move its call to 2, where its
 * input would count a second time (sim_collective, seeds 2113 and 4422); neither may the next
 * view, where its new predecessor is in 2: it restarts 1, whose result that peer holds. */
void test_joiner_stays_where_its_input_went(void **state)
{
    (void)state;
    const cps__coll_act *a;
    float x[2] = {1, 2};
    cps__coll *c = joiner_started(x); /* seq 1 among 10, 9, 11 */
    cps__coll_msg m = {.from = 10, .kind = CPS_COLL_DATA, .epoch = 1, .seq = 1, .n = 2};
    cps__coll_step(c, &m, 1); /* step 0 from the predecessor (segment 0: empty) */
    assert_int_equal(cps__coll_actions(c, &a), 1);
    assert_int_equal(a[0].msg.seq, 1);
    assert_int_equal(a[0].msg.index, 1);
    /* Not yet pinned: no peer can complete 1 before we reduce our segment (the predecessor may
     * be a joiner that guessed 1 wrongly). Step 1 (P - 2) is that reduction. */
    float w = 3;
    m.index = 1;
    m.vals = &w;
    m.count = 1;
    cps__coll_step(c, &m, 1);
    assert_int_equal(cps__coll_actions(c, &a), 1);
    assert_int_equal(a[0].msg.index, 2); /* the all-gather: our segment's sum, 3 + 2 */
    assert_true(a[0].msg.vals[0] == 5.0f);
    float v = 5;
    cps__coll_msg ahead = {
        .from = 11, .kind = CPS_COLL_DATA, .epoch = 1, .seq = 2, .n = 2, .vals = &v, .count = 1};
    cps__coll_step(c, &ahead, 2);
    assert_int_equal(cps__coll_actions(c, &a), 0); /* kept, no restart */
    assert_int_equal(cps__coll_seq(c), 1);
    uint32_t two[2] = {9, 11};
    assert_int_equal(cps__coll_view(c, 2, two, 2, 1, 3), 0);
    /* Its listen names the pin: a ring of joiners all take 1 (test_listeners_follow_pin). */
    assert_int_equal(cps__coll_actions(c, &a), 1);
    assert_int_equal(a[0].msg.kind, CPS_COLL_LISTEN);
    assert_int_equal(a[0].msg.seq, 1);
    assert_int_equal(a[0].msg.index, 1);
    ahead.epoch = 2;
    ahead.index = 0;
    cps__coll_step(c, &ahead, 4);
    size_t n = cps__coll_actions(c, &a);
    assert_true(n >= 1);
    for (size_t i = 0; i < n; i++)
        if (a[i].kind == CPS_COLL_SEND && a[i].msg.kind == CPS_COLL_DATA)
            assert_int_equal(a[i].msg.seq, 1);
    assert_int_equal(cps__coll_seq(c), 1);
    assert_true(x[0] == 1.0f && x[1] == 2.0f);
    cps__coll_destroy(c);
}
