/* A ring chunk refused on its way (forged, or damaged on the path: the shell's check fails and
 * nothing re-sends it), cps__coll_lost. */
#include "fixture.h"

/* Deliver one message as deliver_one does, except that the first all-gather chunk of index
 * `drop` for node `victim` is lost (as a refused copy leaves it: never stepped), and the victim
 * told so. 0 when nothing was queued; *dropped counts the losses. */
static int deliver_or_lose(net *t, uint32_t victim, uint64_t drop, int *dropped)
{
    if (t->nq == 0)
        return 0;
    qmsg q = take_next(t);
    node *to = by_id(t, q.to);
    q.m.from = q.from;
    if (!*dropped && q.to == victim && q.m.kind == CPS_COLL_DATA && q.m.index == drop) {
        (*dropped)++;
        cps__coll_lost(to->c, t->now);
    } else {
        cps__coll_step(to->c, &q.m, t->now);
    }
    perform(t, to);
    free(q.vals);
    return 1;
}

/* Rings of 2 to 5 members, one to three chunks a segment: whichever all-gather chunk a member
 * loses, it asks for the result, and every member ends with the reference's bits (the member
 * before it always completes: it needs nothing the victim would have forwarded). A lost
 * reduce-scatter chunk holds up every member: the collective fails CPS_ETIMEDOUT at its timeout,
 * never completing with other bits. */
void test_lost_chunk_taken_from_a_result(void **state)
{
    (void)state;
    for (uint32_t p = 2; p <= 5; p++)
        for (uint32_t chunk = 4; chunk <= 12; chunk += 4) {
            uint64_t len = 12 * p + 1;
            uint64_t nch = cps__coll_chunks(len, p, chunk), total = 2 * (uint64_t)(p - 1) * nch;
            for (uint64_t drop = 0; drop < total; drop++)
                for (int op = 0; op < 2; op++) {
                    net t;
                    net_init(&t, p, len, chunk, op, 7000 * p + 100 * chunk + 2 * drop + op);
                    fill_inputs(&t, 0);
                    float *inputs[MAXN];
                    for (uint32_t i = 0; i < p; i++) {
                        inputs[i] = malloc(len * sizeof(float));
                        memcpy(inputs[i], t.nodes[i].data[0], len * sizeof(float));
                    }
                    float *ref = malloc(len * sizeof(float));
                    reference(&t, inputs, p, ref);
                    uint32_t victim = t.nodes[drop % p].id;
                    for (uint32_t i = 0; i < p; i++)
                        start(&t, &t.nodes[i], 0);
                    int dropped = 0, running = 1;
                    /* Time passes in steps of the re-ask interval, up to the timeout (10 s). */
                    for (int round = 0; running && round < 60; round++) {
                        while (deliver_or_lose(&t, victim, drop, &dropped))
                            ;
                        running = 0;
                        for (uint32_t i = 0; i < p; i++)
                            running |= t.nodes[i].status[0] == 1;
                        t.now += CPS_COLL_LOST_ASK_MS;
                        for (uint32_t i = 0; i < p; i++) {
                            cps__coll_tick(t.nodes[i].c, t.now);
                            perform(&t, &t.nodes[i]);
                        }
                    }
                    assert_int_equal(dropped, 1);
                    int gather = drop / nch >= p - 1;
                    for (uint32_t i = 0; i < p; i++) {
                        if (gather) {
                            assert_int_equal(t.nodes[i].status[0], 0);
                            assert_memory_equal(t.nodes[i].data[0], ref, len * sizeof(float));
                        } else {
                            /* Nobody completes; whoever fails leaves its input untouched. */
                            assert_int_not_equal(t.nodes[i].status[0], 0);
                            if (t.nodes[i].status[0] != 1) {
                                assert_int_equal(t.nodes[i].status[0], CPS_ETIMEDOUT);
                                assert_memory_equal(t.nodes[i].data[0], inputs[i],
                                                    len * sizeof(float));
                            }
                        }
                    }
                    for (uint32_t i = 0; i < p; i++)
                        free(inputs[i]);
                    free(ref);
                    net_fini(&t);
                }
        }
}

/* Told of a loss when nothing runs, or after its collective completed: nothing is asked. */
void test_lost_when_idle_asks_nothing(void **state)
{
    (void)state;
    const cps__coll_act *a;
    uint32_t three[3] = {10, 9, 11};
    cps__coll *c = node9(1, three, 3, 0, 0);
    cps__coll_lost(c, 5);
    assert_int_equal(cps__coll_actions(c, &a), 0);
    float x[2] = {1, 2};
    uint64_t seq;
    assert_int_equal(cps__coll_start(c, x, 2, CPS_COLL_SUM, 10, &seq), 0);
    cps__coll_lost(c, 10);
    size_t n = cps__coll_actions(c, &a);
    assert_int_equal(n, 2);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(a[i].msg.kind, CPS_COLL_ASK);
        assert_int_equal(a[i].msg.seq, seq);
    }
    cps__coll_tick(c, 10 + CPS_COLL_LOST_ASK_MS - 1);
    assert_int_equal(cps__coll_actions(c, &a), 0); /* not yet */
    cps__coll_tick(c, 10 + CPS_COLL_LOST_ASK_MS);
    assert_int_equal(cps__coll_actions(c, &a), 2); /* again */
    /* Its result from node 11 completes it; no more asks after. */
    float res[2] = {7, 8};
    cps__coll_msg r = msg2(11, CPS_COLL_RESULT, 1, seq, res, 2);
    cps__coll_step(c, &r, 20);
    assert_int_equal(cps__coll_actions(c, &a), 1);
    assert_int_equal(a[0].kind, CPS_COLL_DONE);
    assert_true(x[0] == 7.0f && x[1] == 8.0f);
    cps__coll_tick(c, 10 + 5 * CPS_COLL_LOST_ASK_MS);
    assert_int_equal(cps__coll_actions(c, &a), 0);
    cps__coll_lost(c, 1000);
    assert_int_equal(cps__coll_actions(c, &a), 0);
    cps__coll_destroy(c);
}
