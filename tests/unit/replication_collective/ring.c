/* unit.replication_collective: the ring itself: chunks, its bits, late starters, kills at any
 * phase, replacements, errors. */
#include "fixture.h"

void test_chunking(void **state)
{
    (void)state;
    uint64_t ns[] = {1, 2, 3, 7, 100, 1001, 65537};
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (uint32_t p = 1; p <= 5; p++) {
            uint64_t prev = 0;
            for (uint32_t s = 0; s < p; s++) {
                uint64_t lo, hi;
                cps__coll_segment(ns[a], p, s, &lo, &hi);
                assert_int_equal(lo, prev);
                assert_true(hi >= lo && hi - lo <= (ns[a] + p - 1) / p);
                prev = hi;
            }
            assert_int_equal(prev, ns[a]);
            uint64_t c = cps__coll_chunks(ns[a], p, 16);
            assert_true(c >= 1 && c * 16 >= (ns[a] + p - 1) / p && (c - 1) * 16 < ns[a]);
        }
}

/* Every member ends with the reference's bits, for many shapes, both ops, any interleaving. */
void test_ring_bits(void **state)
{
    (void)state;
    uint64_t lens[] = {1, 3, 8, 101, 4096};
    uint32_t chunks[] = {1, 5, 1024};
    for (uint32_t p = 2; p <= 5; p++)
        for (size_t a = 0; a < 5; a++)
            for (size_t b = 0; b < 3; b++)
                for (int op = 0; op < 2; op++) {
                    /* With the hook: not the shapes of thousands of one-value chunks (time). */
                    if (hook_mode && lens[a] / chunks[b] > 1000)
                        continue;
                    net t;
                    net_init(&t, p, lens[a], chunks[b], op, 1000 * p + 10 * a + b);
                    fill_inputs(&t, 0);
                    float *inputs[MAXN];
                    for (uint32_t i = 0; i < p; i++) {
                        inputs[i] = malloc(t.len * sizeof(float));
                        memcpy(inputs[i], t.nodes[i].data[0], t.len * sizeof(float));
                    }
                    float *ref = malloc(t.len * sizeof(float));
                    reference(&t, inputs, p, ref);
                    for (uint32_t i = 0; i < p; i++)
                        start(&t, &t.nodes[i], 0);
                    while (deliver_one(&t))
                        ;
                    for (uint32_t i = 0; i < p; i++) {
                        assert_int_equal(t.nodes[i].status[0], 0);
                        assert_memory_equal(t.nodes[i].data[0], ref, t.len * sizeof(float));
                    }
                    for (uint32_t i = 0; i < p; i++)
                        free(inputs[i]);
                    free(ref);
                    net_fini(&t);
                }
}

/* The same with the shell's out hook: chunks reduced or gathered straight into their messages
 * (and, one time in three, no memory for one: copied instead) give the same bits, and every
 * payload the ring asks for goes out in a SEND marked built. (Mode 2 takes both paths.) */
void test_ring_bits_built(void **state)
{
    hook_mode = 2;
    test_ring_bits(state);
}

/* Members starting at different moments (one still idle while others send) still agree. */
void test_late_starter_and_sequence(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 50; seed++) {
        net t;
        net_init(&t, 4, 37, 4, CPS_COLL_SUM, seed);
        fill_inputs(&t, 0);
        int total = 3;
        while (1) {
            /* Start collectives at random moments, in order, on random nodes. */
            int all = 1;
            for (uint32_t i = 0; i < t.n; i++) {
                node *nd = &t.nodes[i];
                if (nd->next < total && (nd->next == 0 || nd->status[nd->next - 1] == 0) &&
                    rnd(&t) % 3 == 0)
                    start(&t, nd, nd->next);
                if (nd->next < total || nd->status[total - 1] != 0)
                    all = 0;
            }
            if (all)
                break;
            deliver_one(&t);
        }
        for (int k = 0; k < total; k++)
            for (uint32_t i = 1; i < t.n; i++) {
                assert_int_equal(t.nodes[i].seqno[k], (uint64_t)k + 1);
                assert_memory_equal(t.nodes[i].data[k], t.nodes[0].data[k], t.len * sizeof(float));
            }
        net_fini(&t);
    }
}

/* A member killed at any point of a collective: the others get the new view at different
 * moments, complete, hold the same bits, and every value comes from one epoch's members. */
void test_kill_any_phase(void **state)
{
    (void)state;
    uint64_t taken = 0, restarts = 0;
    for (uint64_t seed = 1; seed <= kill_seeds; seed++) {
        net t;
        uint32_t p = 3 + (uint32_t)(seed % 3);
        net_init(&t, p, 1 + seed % 29, 1 + (uint32_t)(seed % 4), CPS_COLL_SUM, seed * 7919);
        fill_inputs(&t, 1);
        int total = 3;
        uint64_t kill_at = rnd(&t) % (60 * p);
        node *victim = &t.nodes[rnd(&t) % p];
        uint64_t steps = 0;
        for (;; steps++) {
            if (steps >= 1000000) {
                print_message("seed %llu p %u victim %u kill_at %llu nq %zu\n",
                              (unsigned long long)seed, p, victim->id, (unsigned long long)kill_at,
                              t.nq);
                for (uint32_t i = 0; i < t.n; i++) {
                    cps__coll_stats st;
                    cps__coll_stats_get(t.nodes[i].c, &st);
                    print_message(
                        "node %u alive %d next %d st %d %d %d run %d done %llu "
                        "res_sent %llu taken %llu restarts %llu stale %llu bad %llu\n",
                        t.nodes[i].id, t.nodes[i].alive, t.nodes[i].next, t.nodes[i].status[0],
                        t.nodes[i].status[1], t.nodes[i].status[2], cps__coll_running(t.nodes[i].c),
                        (unsigned long long)st.completed, (unsigned long long)st.results_sent,
                        (unsigned long long)st.results_taken, (unsigned long long)st.restarts,
                        (unsigned long long)st.dropped_stale, (unsigned long long)st.dropped_bad);
                }
                fail();
            }
            if (steps == kill_at)
                kill_node(&t, victim);
            int all = 1;
            for (uint32_t i = 0; i < t.n; i++) {
                node *nd = &t.nodes[i];
                if (!nd->alive)
                    continue;
                /* Views reach each survivor at its own moment. */
                if (nd->view_epoch < t.epoch && rnd(&t) % 4 == 0) {
                    assert_int_equal(
                        cps__coll_view(nd->c, t.epoch, t.members, t.nmembers, 1, t.now), 0);
                    nd->view_epoch = t.epoch;
                    perform(&t, nd);
                }
                if (nd->next < total && (nd->next == 0 || nd->status[nd->next - 1] == 0) &&
                    rnd(&t) % 3 == 0)
                    start(&t, nd, nd->next);
                if (nd->next < total || nd->status[total - 1] != 0)
                    all = 0;
            }
            if (all && steps > kill_at)
                break;
            deliver_one(&t);
        }
        uint32_t full = (1u << p) - 1, live = 0;
        for (uint32_t i = 0; i < p; i++)
            if (t.nodes[i].alive)
                live |= 1u << i;
        node *ref = NULL;
        for (uint32_t i = 0; i < p; i++) {
            node *nd = &t.nodes[i];
            if (!nd->alive)
                continue;
            for (int k = 0; k < total; k++) {
                assert_int_equal(nd->status[k], 0);
                assert_int_equal(nd->seqno[k], (uint64_t)k + 1);
                uint32_t set = (uint32_t)nd->data[k][0];
                assert_true(set == full || set == live);
                for (uint64_t j = 0; j < t.len; j++)
                    assert_int_equal((uint32_t)nd->data[k][j], set); /* one epoch's members */
                if (ref)
                    assert_memory_equal(nd->data[k], ref->data[k], t.len * sizeof(float));
            }
            ref = nd;
            cps__coll_stats st;
            cps__coll_stats_get(nd->c, &st);
            taken += st.results_taken;
            restarts += st.restarts;
        }
        net_fini(&t);
    }
    /* The seeds reach both ways of finishing after a kill: redone, and a result handed on. */
    assert_true(taken > 0);
    assert_true(restarts > 0);
}

/* Kills at any phase with the out hook (some asks finding no memory): the same guarantees. */
void test_kill_any_phase_built(void **state)
{
    hook_mode = 2;
    kill_seeds = 60;
    test_kill_any_phase(state);
}

/* A replacement joins a ring that is at its third collective: its first one takes the ring's
 * sequence number, whenever it starts, and every member ends with the same bits. */
void test_replacement_joins(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 100; seed++) {
        net t;
        net_init(&t, 4, 1 + seed % 50, 1 + (uint32_t)(seed % 3), CPS_COLL_SUM, seed * 31);
        fill_inputs(&t, 0);
        /* Node 3 is the replacement: the ring starts with nodes 0..2 only. */
        t.nmembers = 3;
        t.epoch++;
        for (uint32_t i = 0; i < 3; i++) {
            assert_int_equal(cps__coll_view(t.nodes[i].c, t.epoch, t.members, 3, 1, 0), 0);
            t.nodes[i].view_epoch = t.epoch;
        }
        for (int k = 0; k < 2; k++) {
            for (uint32_t i = 0; i < 3; i++)
                start(&t, &t.nodes[i], k);
            while (deliver_one(&t))
                ;
        }
        node *j = &t.nodes[3];
        cps__coll_set_joining(j->c);
        t.nmembers = 4;
        t.epoch++;
        uint64_t steps = 0;
        while (1) {
            assert_true(++steps < 100000);
            int all = 1;
            for (uint32_t i = 0; i < 4; i++) {
                node *nd = &t.nodes[i];
                if (nd->view_epoch < t.epoch && rnd(&t) % 3 == 0) {
                    assert_int_equal(cps__coll_view(nd->c, t.epoch, t.members, 4, 1, t.now), 0);
                    nd->view_epoch = t.epoch;
                    perform(&t, nd);
                }
                int k = nd == j ? 0 : 2;
                if (nd->view_epoch == t.epoch && nd->next == k && rnd(&t) % 3 == 0)
                    start(&t, nd, k);
                if (nd->next != k + 1 || nd->status[k] != 0)
                    all = 0;
            }
            if (all)
                break;
            deliver_one(&t);
        }
        assert_int_equal(j->seqno[0], 3);
        for (uint32_t i = 0; i < 3; i++) {
            assert_int_equal(t.nodes[i].seqno[2], 3);
            assert_memory_equal(t.nodes[i].data[2], j->data[0], t.len * sizeof(float));
        }
        net_fini(&t);
    }
}

void test_alone_and_errors(void **state)
{
    (void)state;
    cps__coll *c;
    const cps__coll_act *a;
    uint64_t seq;
    float x[3] = {1, 2, 3};
    uint32_t me = 9, two[2] = {9, 10};
    assert_int_equal(cps__coll_create(me, 0, 100, &c), 0);
    assert_int_equal(cps__coll_start(c, x, 3, CPS_COLL_SUM, 0, &seq), CPS_EINVAL); /* no view */
    /* A job of one worker: the result is the input. */
    assert_int_equal(cps__coll_view(c, 1, &me, 1, 0, 0), 0);
    assert_int_equal(cps__coll_start(c, x, 3, CPS_COLL_MEAN, 0, &seq), 0);
    assert_int_equal(cps__coll_actions(c, &a), 1);
    assert_int_equal(a[0].kind, CPS_COLL_DONE);
    assert_true(x[2] == 3.0f);
    /* Every peer gone: it waits for a replacement, then fails with a named error. */
    assert_int_equal(cps__coll_view(c, 2, two, 2, 1, 0), 0);
    assert_int_equal(cps__coll_start(c, x, 3, CPS_COLL_SUM, 0, &seq), 0);
    assert_int_equal(cps__coll_start(c, x, 3, CPS_COLL_SUM, 0, &seq), CPS_EBUSY);
    assert_int_equal(cps__coll_view(c, 3, &me, 1, 1, 5), 0);
    assert_int_equal(cps__coll_actions(c, &a), 0);
    cps__coll_tick(c, 104);
    assert_int_equal(cps__coll_actions(c, &a), 0);
    cps__coll_tick(c, 105);
    assert_int_equal(cps__coll_actions(c, &a), 1);
    assert_int_equal(a[0].kind, CPS_COLL_FAILED);
    assert_int_equal(a[0].status, CPS_ENOPEER);
    /* No progress: a timeout, never a hang. */
    assert_int_equal(cps__coll_view(c, 4, two, 2, 1, 0), 0);
    assert_int_equal(cps__coll_start(c, x, 3, CPS_COLL_SUM, 1000, &seq), 0);
    cps__coll_tick(c, 1099);
    assert_int_equal(cps__coll_actions(c, &a), 0);
    cps__coll_tick(c, 1100);
    assert_int_equal(cps__coll_actions(c, &a), 1);
    assert_int_equal(a[0].status, CPS_ETIMEDOUT);
    /* Dropped from the view: fenced. */
    uint32_t other = 10;
    assert_int_equal(cps__coll_start(c, x, 3, CPS_COLL_SUM, 0, &seq), 0);
    assert_int_equal(cps__coll_view(c, 5, &other, 1, 1, 0), 0);
    assert_int_equal(cps__coll_actions(c, &a), 1);
    assert_int_equal(a[0].status, CPS_ESTALE_EPOCH);
    cps__coll_destroy(c);
}
