/* The coordinator's membership: the job's start, deaths and repairs, joiners becoming tails,
 * barriers, job end, drains and new lives. */
#include "fixture.h"

/* The job starts once every node arrived: the view (epoch 1) is persisted first, then every
 * node is WELCOMEd, a server by the life that said HELLO. */
void the_job_starts_with_a_persisted_view_then_welcomes(void **state)
{
    (void)state;
    cps__coord *c = make(4, 2);
    for (uint32_t i = 0; i < 4; i++)
        hello(c, CPS_ROLE_SERVER, 7000 + i, 100 + i, 0);
    hello(c, CPS_ROLE_WORKER, 8000, 0, 0);
    assert_false(cps__coord_started(c));
    assert_int_equal(count(c, CPS_CO_VIEW, 0), 0);
    assert_int_equal(cps__coord_ready(c)->persist, 0);
    hello(c, CPS_ROLE_WORKER, 8001, 0, 0);
    assert_true(cps__coord_started(c));
    assert_int_equal(cps__coord_epoch(c), 1);
    assert_true(cps__coord_ready(c)->persist & CPS_CO_P_STATE);
    assert_int_equal(count(c, CPS_CO_VIEW, CPS_MSG_WELCOME), 6);
    const cps__coord_action *w = find(c, CPS_CO_VIEW, CPS_MSG_WELCOME, 2);
    assert_non_null(w);
    assert_int_equal(w->hdr.req_seq, 101);
    const cps__view *v = cps__coord_view(c);
    assert_int_equal(v->nranges, 4);
    assert_int_equal(v->ranges[0].chain_len, 3);
    uint32_t nn;
    const cps__coord_node *nodes = cps__coord_nodes(c, &nn);
    assert_int_equal(nn, 6);
    assert_int_equal(nodes[5].info.rank, 1);
    /* A seventh node is refused: the job has its workers. */
    done(c);
    hello(c, CPS_ROLE_WORKER, 8002, 0, 0);
    const cps__coord_action *r = find(c, CPS_CO_TO_ADDR, 0, UINT32_MAX);
    assert_non_null(r);
    assert_int_equal(r->code, CPS_ECONFIG);
    cps__coord_destroy(c);
}

/* Persist before publish: a view whose save failed is withdrawn from the output, and sent to
 * every node only once a retried save succeeds; the log tells it in that order. */
void a_view_that_cannot_be_saved_is_held(void **state)
{
    (void)state;
    cps__coord *c = running(4, 2);
    silence_server_1(c);
    assert_int_equal(cps__coord_epoch(c), 2);
    assert_true(count(c, CPS_CO_VIEW, CPS_MSG_VIEW) > 0);
    cps__coord_persisted(c, CPS_ENOSPC, 1000);
    assert_int_equal(count(c, CPS_CO_VIEW, 0), 0); /* withdrawn */
    assert_true(logged(c, "held until saved"));
    assert_true(logged(c, "cannot save view epoch 2"));
    done(c);
    /* Asked for the view meanwhile: nothing goes out. */
    msg(c, CPS_MSG_GET_VIEW, 2, 1050);
    assert_int_equal(count(c, CPS_CO_VIEW, 0), 0);
    done(c);
    cps__coord_tick(c, 1100, NULL, 0); /* before the retry is due */
    assert_false(cps__coord_ready(c)->persist & CPS_CO_P_STATE);
    done(c);
    cps__coord_tick(c, 1220, NULL, 0);
    assert_true(cps__coord_ready(c)->persist & CPS_CO_P_STATE);
    cps__coord_persisted(c, 0, 1220);
    const cps__coord_out *o = cps__coord_ready(c);
    assert_true(o->n > 0);
    assert_int_equal(o->a[0].kind, CPS_CO_LOG);
    assert_non_null(strstr(o->a[0].text, "after 1 failed tries"));
    /* Every node but the dead one's record gets epoch 2 (the dead too: it learns it is out). */
    assert_true(count(c, CPS_CO_VIEW, CPS_MSG_VIEW) >= 5);
    assert_int_equal(find(c, CPS_CO_VIEW, CPS_MSG_VIEW, 3)->hdr.epoch, 2);
    done(c);
    cps__coord_destroy(c);
}

/* A silent server is declared dead: one new view without it in any chain, persisted, sent, and
 * the repair orders a live server to copy each range that lost a replica. */
void a_silent_server_leaves_every_chain_and_repairs_start(void **state)
{
    (void)state;
    cps__coord *c = running(4, 2);
    silence_server_1(c);
    assert_int_equal(cps__coord_epoch(c), 2);
    const cps__view *v = cps__coord_view(c);
    for (uint32_t r = 0; r < v->nranges; r++)
        for (uint32_t j = 0; j < v->ranges[r].chain_len; j++)
            assert_int_not_equal(v->ranges[r].chain[j], 1);
    assert_true(logged(c, "server 1 (rank 0) silent"));
    /* Ranges that held server 1 are copied by server 4 or another with room. */
    assert_true(count(c, CPS_CO_MSG, CPS_MSG_JOIN_RANGE) >= 1);
    const cps__coord_action *j = find(c, CPS_CO_MSG, CPS_MSG_JOIN_RANGE, UINT32_MAX);
    assert_int_not_equal(j->peer, 1);
    assert_int_not_equal(j->hdr.aux, 1);
    cps__coord_destroy(c);
}

/* Joiners that catch up within the batch window become tails in one view, not one each. */
void joiners_caught_up_together_go_out_in_one_view(void **state)
{
    (void)state;
    cps__coord *c = running(4, 2);
    cps__msg_hdr joins[8];
    uint32_t peers[8];
    joiners_become_tails(c, silence_server_1(c), joins, peers);
    cps__coord_destroy(c);
}

/* A joined tail that never confirms it holds what its predecessor acknowledged (it may lack
 * some; simulator seed 8085 without the second probe) leaves its chain once its probation
 * (join_give_up_ms) is over, in a new view, and the range is copied again; one that confirmed
 * stays. */
void a_tail_that_never_confirms_leaves_its_chain(void **state)
{
    (void)state;
    joined jt;
    cps__coord *c = first_joiner_confirmed(&jt);
    /* Their probation: join_give_up_ms (5000) from their reports (t + 10 k). */
    uint64_t epoch = cps__coord_epoch(c);
    int told = 0;
    for (uint64_t now = jt.t + 200; now <= jt.t + 6200; now += 100) {
        done(c);
        for (uint32_t id = 2; id <= 6; id++)
            msg(c, CPS_MSG_HEARTBEAT, id, now);
        cps__coord_tick(c, now, NULL, 0);
        told |= logged(c, "did not confirm in time");
        if (now <= jt.t + 5000)
            assert_int_equal(cps__coord_epoch(c), epoch);
    }
    assert_true(told);
    assert_true(cps__coord_epoch(c) > epoch);
    const cps__view *v = cps__coord_view(c);
    const cps__range *rg = &v->ranges[jt.joins[0].range];
    assert_int_equal(rg->chain[rg->chain_len - 1], jt.peers[0]); /* confirmed: stays */
    for (uint32_t k = 1; k < jt.nj; k++) {
        rg = &v->ranges[jt.joins[k].range];
        for (uint32_t j = 0; j < rg->chain_len; j++)
            assert_int_not_equal(rg->chain[j], jt.peers[k]);
    }
    cps__coord_destroy(c);
}

/* A barrier is released once every live worker waits in it; a dead worker does not hold it. */
void a_barrier_waits_for_every_live_worker(void **state)
{
    (void)state;
    cps__coord *c = running(3, 2);
    msg(c, CPS_MSG_BARRIER, 4, 10);
    assert_int_equal(count(c, CPS_CO_MSG, CPS_MSG_BARRIER_DONE), 0);
    msg(c, CPS_MSG_BARRIER, 5, 20);
    assert_int_equal(count(c, CPS_CO_MSG, CPS_MSG_BARRIER_DONE), 2);
    const cps__coord_action *d = find(c, CPS_CO_MSG, CPS_MSG_BARRIER_DONE, 4);
    assert_int_equal(d->hdr.req_seq, 9);
    assert_true(d->hdr.flags & CPS_WF_REPLY);
    done(c);
    /* Worker 5 finishes: worker 4 alone releases the next barrier. */
    msg(c, CPS_MSG_BYE, 5, 30);
    done(c);
    msg(c, CPS_MSG_BARRIER, 4, 40);
    assert_int_equal(count(c, CPS_CO_MSG, CPS_MSG_BARRIER_DONE), 1);
    cps__coord_destroy(c);
}

/* Issue 29: views say whether the workers they do not show live finished (CPS_VIEW_WORKERS_SETTLED
 * in the header's step). A worker killed in the last all-reduce: the views after its death lack
 * the word while its rank awaits a replacement, also after the others said goodbye; the
 * replacement's WELCOME has it (every other rank finished), so the replacement, alone, knows the
 * job's work is done. */
void views_say_whether_the_missing_workers_finished(void **state)
{
    (void)state;
    await_replacements = 1;
    cps__coord *c = running(3, 3); /* servers 1..3, workers 4..6 (ranks 0..2) */
    await_replacements = 0;
    msg(c, CPS_MSG_HEARTBEAT, 4, 5);
    const cps__coord_action *v = find(c, CPS_CO_VIEW, 0, UINT32_MAX);
    assert_null(v); /* nothing changed: no view */
    const uint32_t killed[] = {6};
    cps__coord_tick(c, 10, killed, 1);
    v = find(c, CPS_CO_VIEW, CPS_MSG_VIEW, 4);
    assert_non_null(v);
    assert_int_equal(v->hdr.step, 0);
    perform(c, 0, 10);
    done(c);
    for (uint32_t w = 4; w <= 5; w++) {
        msg(c, CPS_MSG_BYE, w, 10 * w);
        assert_false(cps__coord_finished(c)); /* open for rank 2's replacement */
        if (w == 4) {
            v = find(c, CPS_CO_VIEW, CPS_MSG_VIEW, 5);
            assert_non_null(v);
            assert_int_equal(v->hdr.step, 0);
        }
        perform(c, 0, 10 * w);
        done(c);
    }
    hello(c, CPS_ROLE_WORKER, 8003, 77, 100); /* the replacement takes rank 2 */
    perform(c, 0, 100);
    v = find(c, CPS_CO_VIEW, CPS_MSG_WELCOME, UINT32_MAX);
    assert_non_null(v);
    assert_int_equal(v->hdr.step, CPS_VIEW_WORKERS_SETTLED);
    uint32_t id = v->peer;
    done(c);
    /* It says goodbye at once: the job ends. */
    msg(c, CPS_MSG_BYE, id, 110);
    assert_true(cps__coord_finished(c));
    cps__coord_destroy(c);
}

/* The job ends when every worker said BYE: every server is told to exit, and the finished job
 * is persisted (a restarted scheduler does not resume it). */
void the_job_ends_when_every_worker_finished(void **state)
{
    (void)state;
    cps__coord *c = running(3, 2);
    msg(c, CPS_MSG_BYE, 4, 10);
    assert_false(cps__coord_finished(c));
    assert_int_equal(count(c, CPS_CO_MSG, CPS_MSG_ACK), 1);
    assert_int_equal(count(c, CPS_CO_MSG, CPS_MSG_SHUTDOWN), 0);
    done(c);
    msg(c, CPS_MSG_BYE, 5, 20);
    assert_true(cps__coord_finished(c));
    assert_int_equal(count(c, CPS_CO_MSG, CPS_MSG_SHUTDOWN), 3);
    assert_true(cps__coord_ready(c)->persist & CPS_CO_P_STATE);
    const char *names[CPS_COORD_BLOBS];
    cps__coord_blob b[CPS_COORD_BLOBS];
    assert_int_equal(cps__coord_blobs(c, names, b), CPS_COORD_BLOBS);
    assert_string_equal(names[1], "sched/state");
    assert_int_equal(((const unsigned char *)b[1].data)[4], 1); /* finished */
    cps__coord_destroy(c);
}

/* A drain from the tool: refused while the others cannot hold R replicas, else acknowledged,
 * the drained server's ranges move away, and it is told to exit once it holds none. */
void a_drain_needs_room_and_moves_the_ranges(void **state)
{
    (void)state;
    cps__coord *c = running(3, 1);
    cps__msg_hdr d = {.type = CPS_MSG_DRAIN, .sender = UINT32_MAX, .aux = 0, .req_seq = 4};
    cps__coord_step(c, &d, NULL, 0, 0x40000001u, 10);
    const cps__coord_action *e = find(c, CPS_CO_ERROR, 0, 0x40000001u);
    assert_non_null(e);
    assert_int_equal(e->code, CPS_ECONFIG);
    done(c);
    cps__coord_destroy(c);

    c = running(4, 1);
    d.aux = 3; /* rank 3: server 4 */
    cps__coord_step(c, &d, NULL, 0, 0x40000001u, 10);
    const cps__coord_action *ack = find(c, CPS_CO_MSG, CPS_MSG_ACK, 0x40000001u);
    assert_non_null(ack);
    assert_int_equal(ack->hdr.aux, 4);
    assert_true(cps__coord_ready(c)->persist & CPS_CO_P_STATE);
    /* Moves start: another server copies each range server 4 holds. */
    assert_true(count(c, CPS_CO_MSG, CPS_MSG_JOIN_RANGE) >= 1);
    assert_null(find(c, CPS_CO_MSG, CPS_MSG_JOIN_RANGE, 4));
    cps__coord_destroy(c);
}

/* Another life of a server counted alive (it restarted before it was declared dead) leaves
 * every chain, then comes back holding no range; the same life repeating its HELLO changes
 * nothing. */
void a_new_life_is_a_death_then_a_return(void **state)
{
    (void)state;
    cps__coord *c = running(4, 1);
    hello(c, CPS_ROLE_SERVER, 7001, 101, 10); /* the same life */
    assert_int_equal(cps__coord_epoch(c), 1);
    assert_int_equal(find(c, CPS_CO_VIEW, CPS_MSG_WELCOME, 2)->hdr.req_seq, 101);
    done(c);
    hello(c, CPS_ROLE_SERVER, 7001, 555, 20); /* a new one */
    assert_true(logged(c, "server 2 restarted before it was declared dead"));
    assert_true(cps__coord_epoch(c) >= 2);
    const cps__view *v = cps__coord_view(c);
    for (uint32_t r = 0; r < v->nranges; r++)
        for (uint32_t j = 0; j < v->ranges[r].chain_len; j++)
            assert_int_not_equal(v->ranges[r].chain[j], 2);
    assert_true(cps__view_node(v, 2)->alive);
    assert_int_equal(find(c, CPS_CO_VIEW, CPS_MSG_WELCOME, 2)->hdr.req_seq, 555);
    cps__coord_destroy(c);
}
