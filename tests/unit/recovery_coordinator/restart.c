/* What the coordinator persists resumes it; --allow-rollback and fallbacks. */
#include "fixture.h"

/* The store as it is now: every blob, copied. */
static void snapshot(cps__coord *c, store *s)
{
    assert_int_equal(cps__coord_blobs(c, s->names, s->b), CPS_COORD_BLOBS);
    s->n = CPS_COORD_BLOBS;
    for (int i = 0; i < s->n; i++) {
        s->copy[i] = malloc(s->b[i].len ? s->b[i].len : 1);
        memcpy(s->copy[i], s->b[i].data, s->b[i].len);
    }
}

/* What the coordinator persists resumes it: same members, drains and lives, a newer epoch
 * sent to every node; a directory of another job's shape is refused. */
void a_restarted_coordinator_resumes_from_its_blobs(void **state)
{
    (void)state;
    cps__coord *c = running(4, 2);
    cps__msg_hdr d = {.type = CPS_MSG_DRAIN, .sender = 3};
    cps__coord_step(c, &d, NULL, 0, 3, 10); /* server 3 asks to leave */
    done(c);
    store s;
    snapshot(c, &s);
    uint64_t epoch = cps__coord_epoch(c);
    cps__coord_destroy(c);

    c = make(4, 2);
    assert_int_equal(cps__coord_resume(c, get, &s, 5000), 1);
    assert_true(cps__coord_started(c));
    assert_int_equal(cps__coord_epoch(c), epoch + 1);
    assert_true(cps__coord_ready(c)->persist & CPS_CO_P_STATE);
    assert_int_equal(count(c, CPS_CO_VIEW, CPS_MSG_VIEW), 6);
    uint32_t nn;
    const cps__coord_node *nodes = cps__coord_nodes(c, &nn);
    assert_int_equal(nn, 6);
    assert_true(nodes[2].draining);
    assert_int_equal(nodes[1].boot_id, 101);
    cps__coord_destroy(c);

    c = make(5, 2);
    assert_int_equal(cps__coord_resume(c, get, &s, 5000), CPS_ECONFIG);
    cps__coord_destroy(c);
    for (int i = 0; i < s.n; i++)
        free(s.copy[i]);
}

/* A scheduler of 2 servers and 1 worker resumed from `s` with --allow-rollback at 6000; server
 * 2 then says HELLO with an empty store. */
static cps__coord *resumed_with_rollback(store *s)
{
    allow_rollback = 1;
    cps__coord *c = make(2, 1);
    allow_rollback = 0;
    assert_int_equal(cps__coord_resume(c, get, s, 6000), 1);
    done(c);
    hello_flags(c, CPS_ROLE_SERVER, 7001, 777, CPS_HELLO_EMPTY, 6100);
    return c;
}

/* The fallback of a range is persisted with the view (sched/former): a scheduler restarted with
 * --allow-rollback (the operator's way to accept the rollback) still knows which server to give
 * the range to. A store of an earlier build, without sched/former, loads as one without
 * fallbacks: the empty last replica is kept out and nothing is rolled back. */
void a_restarted_coordinator_remembers_the_fallback(void **state)
{
    (void)state;
    cps__coord *c = two_servers_one_dead();
    uint64_t left = cps__coord_epoch(c);
    hello_flags(c, CPS_ROLE_SERVER, 7001, 777, CPS_HELLO_EMPTY, 5000); /* kept out */
    done(c);
    store s;
    snapshot(c, &s);
    assert_string_equal(s.names[4], "sched/former");
    cps__coord_destroy(c);

    c = resumed_with_rollback(&s);
    char want[96];
    snprintf(want, sizeof want, "server 1, which left the range at epoch %llu, takes it",
             (unsigned long long)left);
    assert_int_equal(logged_at(c, CPS_LOG_ERROR, want), 4);
    const cps__view *v = cps__coord_view(c);
    for (uint32_t r = 0; r < v->nranges; r++)
        assert_int_equal(v->ranges[r].chain[0], 1);
    cps__coord_destroy(c);

    /* The same store as an earlier build wrote it. */
    s.n = 4;
    c = resumed_with_rollback(&s);
    assert_int_equal(logged_at(c, CPS_LOG_ERROR, "no other server holds the range"), 4);
    v = cps__coord_view(c);
    for (uint32_t r = 0; r < v->nranges; r++) {
        assert_int_equal(v->ranges[r].chain[0], 2);
        assert_int_equal(cps__coord_stranded(c, r, NULL, NULL), 2);
    }
    cps__coord_destroy(c);
    /* A fallback naming no member is a corrupt store. */
    s.n = CPS_COORD_BLOBS;
    cps__le32_put(s.copy[4] + 8, 77);
    c = make(2, 1);
    assert_int_equal(cps__coord_resume(c, get, &s, 6000), CPS_ECORRUPT);
    cps__coord_destroy(c);
    for (int i = 0; i < CPS_COORD_BLOBS; i++)
        free(s.copy[i]);
}

/* A restart of the scheduler (with --allow-rollback or not) from what c persisted: c is
 * destroyed; the new coordinator has resumed, its output performed. */
static cps__coord *restarted(cps__coord *c, uint32_t servers, uint32_t workers, int flag,
                             uint64_t now)
{
    store s;
    assert_int_equal(cps__coord_blobs(c, s.names, s.b), CPS_COORD_BLOBS);
    s.n = CPS_COORD_BLOBS;
    for (int i = 0; i < s.n; i++) {
        s.copy[i] = malloc(s.b[i].len ? s.b[i].len : 1);
        memcpy(s.copy[i], s.b[i].data, s.b[i].len);
    }
    cps__coord_destroy(c);
    allow_rollback = flag;
    c = make(servers, workers);
    allow_rollback = 0;
    assert_int_equal(cps__coord_resume(c, get, &s, now), 1);
    perform(c, 0, now);
    for (int i = 0; i < s.n; i++)
        free(s.copy[i]);
    return c;
}

/* The rollback is the operator's decision, for the incident in front of them: a scheduler
 * restarted with --allow-rollback gives the ranges whose only replica was down with a fallback
 * as it resumed back to that fallback, which holds what was acknowledged until it left, said at
 * ERROR; server 2 is let in holding nothing (it copies them as a joiner). The flag on a
 * scheduler that stranded the range itself is no consent (issue 28: it stayed policy for every
 * later incident). */
void allow_rollback_gives_the_range_to_its_fallback_and_says_so(void **state)
{
    (void)state;
    allow_rollback = 1;
    cps__coord *c = two_servers_one_dead();
    allow_rollback = 0;
    uint64_t left = cps__coord_epoch(c);
    hello_flags(c, CPS_ROLE_SERVER, 7001, 777, CPS_HELLO_EMPTY, 5000);
    assert_false(logged(c, "ROLLED BACK (--allow-rollback)"));
    assert_int_equal(logged_at(c, CPS_LOG_ERROR, "is UNAVAILABLE: server 2"), 4);
    done(c);
    c = restarted(c, 2, 1, 1, 5100);
    assert_true(logged(c, "--allow-rollback: 4 range(s) (0, 1, 2, 3)"));
    done(c);
    hello_flags(c, CPS_ROLE_SERVER, 7001, 777, CPS_HELLO_EMPTY, 5200);
    char want[128];
    snprintf(want, sizeof want, "ROLLED BACK (--allow-rollback): server 2, its only replica");
    assert_int_equal(logged_at(c, CPS_LOG_ERROR, want), 4);
    snprintf(want, sizeof want, "server 1, which left the range at epoch %llu, takes it",
             (unsigned long long)left);
    assert_int_equal(logged_at(c, CPS_LOG_ERROR, want), 4);
    const cps__view *v = cps__coord_view(c);
    assert_true(cps__view_node(v, 2)->alive);
    for (uint32_t r = 0; r < v->nranges; r++) {
        assert_int_equal(v->ranges[r].chain_len, 1);
        assert_int_equal(v->ranges[r].chain[0], 1);
        assert_false(cps__view_range_available(v, r)); /* it waits for server 1 */
        assert_int_equal(cps__coord_stranded(c, r, NULL, NULL), 0);
    }
    done(c);
    hello(c, CPS_ROLE_SERVER, 7000, 888, 5300); /* server 1, on its store */
    v = cps__coord_view(c);
    assert_true(cps__view_node(v, 1)->alive);
    for (uint32_t r = 0; r < v->nranges; r++)
        assert_true(cps__view_range_available(v, r));
    cps__coord_destroy(c);
}

/* --allow-rollback holds for the ranges stranded as the scheduler resumed, not for an incident
 * of its life after (issue 28): resumed with the flag while every range had two live replicas,
 * server 1 dies, server 2 comes back empty: kept out, nothing rolled back. */
void allow_rollback_is_no_consent_for_a_later_incident(void **state)
{
    (void)state;
    cps__coord *c = running_in_pairs(2, 1);
    c = restarted(c, 2, 1, 1, 50);
    assert_true(logged(c, "--allow-rollback: no range's only replica is down"));
    done(c);
    hello(c, CPS_ROLE_SERVER, 7001, 101, 60); /* the servers say HELLO to the new scheduler */
    hello(c, CPS_ROLE_SERVER, 7000, 100, 60);
    done(c);
    uint64_t t;
    for (t = 100; t <= 3000 && cps__view_node(cps__coord_view(c), 1)->alive; t += 50) {
        msg(c, CPS_MSG_HEARTBEAT, 2, t);
        msg(c, CPS_MSG_HEARTBEAT, 3, t);
        cps__coord_tick(c, t, NULL, 0);
        perform(c, 0, t);
        done(c);
    }
    assert_false(cps__view_node(cps__coord_view(c), 1)->alive);
    hello_flags(c, CPS_ROLE_SERVER, 7001, 777, CPS_HELLO_EMPTY, t + 100);
    assert_false(logged(c, "ROLLED BACK (--allow-rollback)"));
    assert_int_equal(logged_at(c, CPS_LOG_ERROR, "is UNAVAILABLE: server 2"), 4);
    for (uint32_t r = 0; r < 4; r++) {
        uint32_t fb = 0;
        assert_int_equal(cps__coord_stranded(c, r, &fb, NULL), 2);
        assert_int_equal(fb, 1);
    }
    cps__coord_destroy(c);
}

/* Ticks from t with heartbeats from every live member but `id`, until `id` is declared dead;
 * returns the time after. */
static uint64_t silence(cps__coord *c, uint32_t id, uint64_t t)
{
    for (uint64_t end = t + 3000; t < end; t += 50) {
        uint32_t nn;
        const cps__coord_node *nodes = cps__coord_nodes(c, &nn);
        for (uint32_t i = 0; i < nn; i++)
            if (nodes[i].info.id != id && nodes[i].info.alive)
                msg(c, CPS_MSG_HEARTBEAT, nodes[i].info.id, t);
        cps__coord_tick(c, t, NULL, 0);
        perform(c, 0, t);
        done(c);
        if (!cps__view_node(cps__coord_view(c), id)->alive)
            return t + 50;
    }
    fail_msg("server %u was not declared dead", id);
    return t;
}

static int chain_is(const cps__range *rg, uint32_t a, uint32_t b)
{
    return rg->chain_len == 2 &&
           ((rg->chain[0] == a && rg->chain[1] == b) || (rg->chain[0] == b && rg->chain[1] == a));
}

/* Issue 28, review point 1: a fallback whose own store is gone is no fallback. Servers 1..3,
 * chains of 2: server 3 dies, then server 1, which leaves a range it shared with 3 waiting for
 * it, and is the fallback of a range it shared with 2. Server 1 comes back empty (kept out);
 * server 2 dies and comes back empty: its ERROR must not offer server 1, nor may a scheduler
 * restarted with --allow-rollback give server 1 the range (it would be lost). */
void an_empty_fallback_is_no_fallback(void **state)
{
    (void)state;
    cps__coord *c = running_in_pairs(3, 1);
    const cps__view *v = cps__coord_view(c);
    int r12 = -1, r13 = -1;
    for (uint32_t r = 0; r < v->nranges; r++) {
        if (chain_is(&v->ranges[r], 1, 2))
            r12 = (int)r;
        if (chain_is(&v->ranges[r], 1, 3))
            r13 = (int)r;
    }
    assert_true(r12 >= 0 && r13 >= 0); /* the placement the scenario needs */
    uint64_t t = silence(c, 3, 100);
    t = silence(c, 1, t);
    v = cps__coord_view(c);
    assert_int_equal(v->ranges[r12].chain_len, 1);
    assert_int_equal(v->ranges[r12].chain[0], 2);
    assert_int_equal(v->ranges[r13].chain[0], 1);
    hello_flags(c, CPS_ROLE_SERVER, 7000, 555, CPS_HELLO_EMPTY, t);
    assert_int_equal(cps__coord_stranded(c, (uint32_t)r13, NULL, NULL), 1); /* kept out */
    done(c);
    t = silence(c, 2, t + 50);
    hello_flags(c, CPS_ROLE_SERVER, 7001, 556, CPS_HELLO_EMPTY, t);
    uint32_t fb = 9;
    assert_int_equal(cps__coord_stranded(c, (uint32_t)r12, &fb, NULL), 2);
    assert_int_equal(fb, 0);
    assert_false(logged(c, "keep server 1 stopped"));
    done(c);
    c = restarted(c, 3, 1, 1, t + 100);
    done(c);
    hello_flags(c, CPS_ROLE_SERVER, 7001, 556, CPS_HELLO_EMPTY, t + 200);
    /* (A range server 2 shared with server 3 goes to 3, which left it on its disk.) */
    assert_false(logged(c, "server 1, which left the range"));
    v = cps__coord_view(c);
    assert_int_equal(v->ranges[r12].chain[0], 2);
    assert_int_equal(cps__coord_stranded(c, (uint32_t)r12, NULL, NULL), 2);
    cps__coord_destroy(c);
}

/* How many ranges have a fallback, as persisted (sched/former's count). */
static uint32_t fallbacks(cps__coord *c)
{
    const char *names[CPS_COORD_BLOBS];
    cps__coord_blob b[CPS_COORD_BLOBS];
    assert_int_equal(cps__coord_blobs(c, names, b), CPS_COORD_BLOBS);
    return cps__le32_get(b[4].data);
}

/* Every range on server 2 alone, server 1 its fallback; server 4 added copies each range and
 * joins as its tail, unconfirmed but for range 0. Returns the time. */
static uint64_t unconfirmed_tails_on_two(cps__coord **out)
{
    cps__coord *c = two_servers_one_dead();
    assert_int_equal(fallbacks(c), 4);
    hello(c, CPS_ROLE_SERVER, 7002, 300, 3000); /* a new server: id 4 */
    assert_true(cps__view_node(cps__coord_view(c), 4)->alive);
    uint64_t t = 3000;
    cps__msg_hdr joins[8];
    uint32_t nj = 0;
    for (; t < 5000 && nj < 4; t += 100) {
        msg(c, CPS_MSG_HEARTBEAT, 2, t);
        msg(c, CPS_MSG_HEARTBEAT, 3, t);
        msg(c, CPS_MSG_HEARTBEAT, 4, t);
        cps__coord_tick(c, t, NULL, 0);
        perform(c, 0, t);
        const cps__coord_out *o = cps__coord_ready(c);
        for (size_t i = 0; i < o->n && nj < 8; i++)
            if (o->a[i].kind == CPS_CO_MSG && o->a[i].hdr.type == CPS_MSG_JOIN_RANGE)
                joins[nj++] = o->a[i].hdr;
        done(c);
    }
    assert_int_equal(nj, 4);
    for (uint32_t k = 0; k < nj; k++) {
        cps__msg_hdr h = {.type = CPS_MSG_CAUGHT_UP,
                          .sender = 4,
                          .epoch = cps__coord_epoch(c),
                          .range = joins[k].range,
                          .step = joins[k].step};
        assert_int_equal(cps__coord_step(c, &h, NULL, 0, 4, t), 0);
    }
    t += 200;
    cps__coord_tick(c, t, NULL, 0);
    perform(c, 0, t);
    done(c);
    const cps__view *v = cps__coord_view(c);
    for (uint32_t r = 0; r < v->nranges; r++)
        assert_int_equal(v->ranges[r].chain_len, 2);
    /* Appended but not confirmed: server 1 is still the fallback (issue 28, review point 2). */
    assert_int_equal(fallbacks(c), 4);
    for (uint32_t k = 0; k < nj; k++)
        if (joins[k].range == 0) {
            cps__msg_hdr h = {.type = CPS_MSG_CAUGHT_UP,
                              .sender = 4,
                              .epoch = cps__coord_epoch(c),
                              .range = 0,
                              .step = joins[k].step,
                              .aux = 1};
            assert_int_equal(cps__coord_step(c, &h, NULL, 0, 4, t), 0);
        }
    assert_int_equal(fallbacks(c), 3); /* range 0: acknowledged by two from now on */
    done(c);
    *out = c;
    return t;
}

/* Issue 28, review point 2: the fallback is kept until the tail that joined confirms. Evicted
 * unconfirmed, or dead, the tail leaves the range with one holder again, and an empty restart
 * of that holder must still find the fallback. */
void the_fallback_stays_until_the_joiner_confirms(void **state)
{
    (void)state;
    for (int dies = 0; dies < 2; dies++) {
        cps__coord *c;
        uint64_t t = unconfirmed_tails_on_two(&c);
        if (dies) {
            t = silence(c, 4, t + 50);
        } else {
            for (uint64_t end = t + 6000; t < end; t += 100) {
                msg(c, CPS_MSG_HEARTBEAT, 2, t);
                msg(c, CPS_MSG_HEARTBEAT, 3, t);
                msg(c, CPS_MSG_HEARTBEAT, 4, t);
                cps__coord_tick(c, t, NULL, 0);
                perform(c, 0, t);
                done(c);
            }
        }
        const cps__view *v = cps__coord_view(c);
        for (uint32_t r = 1; r < v->nranges; r++)
            assert_int_equal(v->ranges[r].chain_len, 1);
        hello_flags(c, CPS_ROLE_SERVER, 7001, 777, CPS_HELLO_EMPTY, t);
        for (uint32_t r = 1; r < v->nranges; r++) {
            uint32_t fb = 0;
            assert_int_equal(cps__coord_stranded(c, r, &fb, NULL), 2);
            assert_int_equal(fb, 1);
        }
        cps__coord_destroy(c);
    }
}

/* Joined tails that have not confirmed they caught up stay unconfirmed across a scheduler
 * restart (sched/unconfirmed): taken for full replicas, one would be left the range's only
 * holder by its predecessor's death, without the acknowledged updates it lacks. A confirmation
 * after the restart (the join id of the earlier life) is taken; the others leave their chains
 * when their new probation ends. A store of an earlier build takes every tail of a chain of two
 * or more for unconfirmed; a malformed blob is a corrupt store. */
void a_restarted_coordinator_keeps_unconfirmed_tails(void **state)
{
    (void)state;
    joined jt;
    cps__coord *c = first_joiner_confirmed(&jt);
    assert_true(jt.nj >= 3);
    assert_true(cps__coord_ready(c)->persist & CPS_CO_P_STATE); /* the mark is gone: saved */
    done(c);
    store s;
    snapshot(c, &s);
    assert_string_equal(s.names[5], "sched/unconfirmed");
    cps__coord_destroy(c);

    c = make(4, 2);
    assert_int_equal(cps__coord_resume(c, get, &s, 10000), 1);
    done(c);
    assert_int_equal(cps__coord_unconfirmed(c, jt.joins[0].range), 0);
    for (uint32_t k = 1; k < jt.nj; k++)
        assert_int_equal(cps__coord_unconfirmed(c, jt.joins[k].range), jt.peers[k]);
    /* A confirmation sent after the restart, with its join's id, is taken. */
    confirm(c, jt.joins, jt.peers, 1, 10100);
    assert_int_equal(cps__coord_unconfirmed(c, jt.joins[1].range), 0);
    done(c);
    /* The predecessor of an unconfirmed tail dies: the tail leaves with it. */
    const cps__range *rg = &cps__coord_view(c)->ranges[jt.joins[2].range];
    uint32_t pred = rg->chain[rg->chain_len - 2];
    cps__coord_tick(c, 10200, &pred, 1);
    assert_true(logged(c, "had not caught up with server"));
    rg = &cps__coord_view(c)->ranges[jt.joins[2].range];
    for (uint32_t j = 0; j < rg->chain_len; j++)
        assert_int_not_equal(rg->chain[j], jt.peers[2]);
    cps__coord_destroy(c);

    /* The same store as an earlier build wrote it: every tail of two or more is unconfirmed. */
    s.n = CPS_COORD_BLOBS - 1;
    c = make(4, 2);
    assert_int_equal(cps__coord_resume(c, get, &s, 10000), 1);
    assert_true(logged(c, "the store predates sched/unconfirmed"));
    const cps__view *v = cps__coord_view(c);
    uint32_t marked = 0;
    for (uint32_t r = 0; r < v->nranges; r++) {
        rg = &v->ranges[r];
        if (rg->chain_len >= 2) {
            assert_int_equal(cps__coord_unconfirmed(c, r), rg->chain[rg->chain_len - 1]);
            marked++;
        }
    }
    assert_true(marked > jt.nj);
    cps__coord_destroy(c);

    /* Malformed: a length that is no whole number of entries; an entry naming no member. */
    s.n = CPS_COORD_BLOBS;
    s.b[5].len--;
    c = make(4, 2);
    assert_int_equal(cps__coord_resume(c, get, &s, 10000), CPS_ECORRUPT);
    cps__coord_destroy(c);
    s.b[5].len++;
    cps__le32_put(s.copy[5] + 8, 77);
    c = make(4, 2);
    assert_int_equal(cps__coord_resume(c, get, &s, 10000), CPS_ECORRUPT);
    cps__coord_destroy(c);
    for (int i = 0; i < CPS_COORD_BLOBS; i++)
        free(s.copy[i]);
}
