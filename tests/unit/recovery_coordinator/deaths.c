/* Deaths the coordinator is told of (probes), and an empty last replica kept out. */
#include "fixture.h"

/* Worker 5 reports server 2 at 100: the nonce of the probe round it starts. */
static uint64_t report_server_2(cps__coord *c)
{
    cps__suspect_entry e = {2, 5 * DEAD_MS};
    unsigned char pl[64];
    size_t len = cps__wire_suspects_encode(pl, sizeof pl, &e, 1);
    cps__msg_hdr h = {.type = CPS_MSG_SUSPECT, .sender = 5, .epoch = 1};
    cps__coord_step(c, &h, pl, len, 5, 100);
    assert_true(count(c, CPS_CO_MSG, CPS_MSG_PROBE) >= 1);
    const cps__coord_action *p = find(c, CPS_CO_MSG, CPS_MSG_PROBE, 2);
    assert_non_null(p);
    uint64_t nonce = p->hdr.req_seq;
    done(c);
    return nonce;
}

static void answer_probe(cps__coord *c, uint32_t id, uint64_t nonce, uint64_t now)
{
    cps__msg_hdr a = {
        .type = CPS_MSG_PROBE, .flags = CPS_WF_REPLY, .sender = id, .epoch = 1, .req_seq = nonce};
    cps__coord_step(c, &a, NULL, 0, id, now);
}

/* Nodes 1..5 (servers 1..4, worker 5) beat at t, then time passes. */
static void beat_and_tick(cps__coord *c, uint64_t t)
{
    for (uint32_t id = 1; id <= 5; id++)
        msg(c, CPS_MSG_HEARTBEAT, id, t);
    cps__coord_tick(c, t, NULL, 0);
}

/* Data-path evidence: a report of unanswered requests starts a probe round; a server that
 * leaves its probe unanswered is declared dead though its heartbeats flow. */
void an_unanswered_probe_is_a_death(void **state)
{
    (void)state;
    cps__coord *c = running(4, 1);
    uint64_t nonce = report_server_2(c);
    /* Everyone beats; all but server 2 answer their probe. */
    for (uint32_t id = 1; id <= 4; id++)
        if (id != 2)
            answer_probe(c, id, nonce, 110);
    for (uint64_t t = 120; t <= 120 + 4 * DEAD_MS && cps__coord_epoch(c) == 1; t += 20)
        beat_and_tick(c, t);
    assert_int_equal(cps__coord_epoch(c), 2);
    assert_true(logged(c, "server 2 (rank 1) left our probe unanswered"));
    assert_false(cps__view_node(cps__coord_view(c), 2)->alive);
    cps__coord_destroy(c);
}

/* Regression (seeds 8540 and 9471 of sim --faults scale): a server whose probe answer is late
 * once is asked again with a probe of its own, which alone counts; answering it keeps the server
 * in the view, and a late answer to the first probe neither clears nor kills it. */
void a_late_probe_answer_is_asked_again_not_a_death(void **state)
{
    (void)state;
    cps__coord *c = running(4, 1);
    uint64_t first = report_server_2(c);
    for (uint32_t id = 1; id <= 4; id++)
        if (id != 2)
            answer_probe(c, id, first, 110);
    uint64_t again = 0, t;
    for (t = 120; t <= 120 + 4 * DEAD_MS && !again; t += 20) {
        beat_and_tick(c, t);
        const cps__coord_action *p = find(c, CPS_CO_MSG, CPS_MSG_PROBE, 2);
        again = p ? p->hdr.req_seq : 0;
        done(c);
    }
    assert_true(again != 0 && again != first);
    assert_int_equal(cps__coord_epoch(c), 1);
    /* The first probe's answer comes now, then the second's. */
    answer_probe(c, 2, first, t);
    answer_probe(c, 2, again, t + 10);
    for (t += 20; t <= 120 + 10 * DEAD_MS; t += 20)
        beat_and_tick(c, t);
    assert_int_equal(cps__coord_epoch(c), 1);
    assert_false(logged(c, "left our probe unanswered for"));
    assert_true(cps__view_node(cps__coord_view(c), 2)->alive);
    cps__coord_destroy(c);
}

/* Regression (seed 1882 of sim --faults all), and issue 28's review: server 2, the last replica
 * of every range after server 1's (false) death, restarts on an empty disk; its HELLO says so.
 * It must not be let back as the ranges' holder; nor may server 1, which the death took out,
 * take them on its own: server 2 acknowledged updates alone since, and they would be lost
 * unseen. By default the ranges stay unavailable and server 2 is kept out, with one ERROR per
 * range naming the range, both servers, the epoch and the ways out; it is visible through
 * cps__coord_stranded. */
void an_empty_last_replica_is_kept_out_not_rolled_back(void **state)
{
    (void)state;
    cps__coord *c = two_servers_one_dead();
    uint64_t left = cps__coord_epoch(c);
    hello_flags(c, CPS_ROLE_SERVER, 7001, 777, CPS_HELLO_EMPTY, 5000);
    assert_int_equal(logged_at(c, CPS_LOG_ERROR, "is UNAVAILABLE: server 2, its only replica"), 4);
    char want[320];
    snprintf(want, sizeof want, "since epoch %llu are on no other server",
             (unsigned long long)left);
    assert_int_equal(logged_at(c, CPS_LOG_ERROR, want), 4);
    /* The ways out, a line of their own: the fallback must stay stopped until the rollback, or
     * it is let in and drops its copy (issue 28). */
    assert_int_equal(logged_at(c, CPS_LOG_ERROR,
                               "ways out: start server 2 on its old disk, or restore a "
                               "checkpoint, or (losing those updates) keep server 1 stopped, "
                               "restart the scheduler with --allow-rollback, then start server 1 "
                               "once 'ROLLED BACK' is logged"),
                     4);
    assert_false(logged(c, "ROLLED BACK (--allow-rollback)"));
    const cps__view *v = cps__coord_view(c);
    assert_false(cps__view_node(v, 2)->alive);
    assert_null(find(c, CPS_CO_VIEW, CPS_MSG_WELCOME, 2));
    for (uint32_t r = 0; r < v->nranges; r++) {
        assert_int_equal(v->ranges[r].chain_len, 1);
        assert_int_equal(v->ranges[r].chain[0], 2);
        assert_false(cps__view_range_available(v, r));
        uint32_t fb = 0;
        uint64_t since = 0;
        assert_int_equal(cps__coord_stranded(c, r, &fb, &since), 2);
        assert_int_equal(fb, 1);
        assert_int_equal(since, left);
    }
    done(c);
    /* Server 2 on its old disk: let in as the ranges' holder; nothing is stranded any more. */
    hello(c, CPS_ROLE_SERVER, 7001, 778, 5200);
    v = cps__coord_view(c);
    assert_true(cps__view_node(v, 2)->alive);
    for (uint32_t r = 0; r < v->nranges; r++) {
        assert_int_equal(v->ranges[r].chain[0], 2);
        assert_true(cps__view_range_available(v, r));
        assert_int_equal(cps__coord_stranded(c, r, NULL, NULL), 0);
    }
    cps__coord_destroy(c);
}

/* A kept-out server asks again every half second: its refusal is logged once per life, and
 * again only after minutes; a new life (another boot id) is told at once. */
void a_kept_out_empty_server_is_not_logged_on_every_retry(void **state)
{
    (void)state;
    cps__coord *c = two_servers_one_dead();
    hello_flags(c, CPS_ROLE_SERVER, 7001, 777, CPS_HELLO_EMPTY, 5000);
    assert_int_equal(logged_at(c, CPS_LOG_ERROR, "is UNAVAILABLE"), 4);
    done(c);
    int lines = 0;
    for (uint64_t t = 5500; t < 5000 + 300000; t += 500) {
        hello_flags(c, CPS_ROLE_SERVER, 7001, 777, CPS_HELLO_EMPTY, t);
        lines += logged_at(c, -1, "UNAVAILABLE");
        done(c);
    }
    assert_int_equal(lines, 0);
    hello_flags(c, CPS_ROLE_SERVER, 7001, 777, CPS_HELLO_EMPTY, 5000 + 600000);
    assert_int_equal(logged_at(c, CPS_LOG_ERROR, "is UNAVAILABLE"), 4); /* a reminder */
    done(c);
    hello_flags(c, CPS_ROLE_SERVER, 7001, 777, CPS_HELLO_EMPTY, 5000 + 600500);
    assert_int_equal(logged_at(c, -1, "UNAVAILABLE"), 0);
    done(c);
    hello_flags(c, CPS_ROLE_SERVER, 7001, 779, CPS_HELLO_EMPTY, 5000 + 601000); /* new life */
    assert_int_equal(logged_at(c, CPS_LOG_ERROR, "is UNAVAILABLE"), 4);
    cps__coord_destroy(c);
}

/* The same restart with no server to fall back on: server 1 came back and was let in (so it
 * dropped the ranges it was no longer in) before server 2 restarted empty. Server 2 is kept
 * out, and the ranges wait, rather than be served from nothing. A server that is no member of
 * any chain says it is empty to no effect. */
void an_empty_last_replica_with_no_fallback_is_kept_out(void **state)
{
    (void)state;
    cps__coord *c = two_servers_one_dead();
    hello(c, CPS_ROLE_SERVER, 7000, 888, 5000); /* server 1 back: a joiner at most */
    assert_true(cps__view_node(cps__coord_view(c), 1)->alive);
    done(c);
    hello_flags(c, CPS_ROLE_SERVER, 7001, 777, CPS_HELLO_EMPTY, 5100);
    assert_true(logged(c, "its only replica, came back with an empty store"));
    /* Server 1 dropped its copy when let in (issue 28's point 2: see emptied()'s caller): the
     * ERROR offers only the old disk and a checkpoint. */
    assert_int_equal(logged_at(c, CPS_LOG_ERROR, "no other server holds the range"), 4);
    assert_false(logged(c, "--allow-rollback"));
    const cps__view *v = cps__coord_view(c);
    assert_false(cps__view_node(v, 2)->alive);
    for (uint32_t r = 0; r < v->nranges; r++) {
        assert_int_equal(v->ranges[r].chain[0], 2);
        assert_false(cps__view_range_available(v, r));
        uint32_t fb = 9;
        assert_int_equal(cps__coord_stranded(c, r, &fb, NULL), 2);
        assert_int_equal(fb, 0);
    }
    assert_null(find(c, CPS_CO_VIEW, CPS_MSG_WELCOME, 2));
    cps__coord_destroy(c);

    c = running(4, 1);
    hello_flags(c, CPS_ROLE_SERVER, 7003, 999, CPS_HELLO_EMPTY, 10); /* a new life of server 4 */
    v = cps__coord_view(c);
    assert_true(cps__view_node(v, 4)->alive);
    for (uint32_t r = 0; r < v->nranges; r++) {
        assert_true(cps__view_range_available(v, r));
        for (uint32_t j = 0; j < v->ranges[r].chain_len; j++)
            assert_int_not_equal(v->ranges[r].chain[j], 4);
    }
    cps__coord_destroy(c);
}
