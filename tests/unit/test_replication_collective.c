#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "replication/collective.h"

/* ---- an in-memory ring: N endpoints, one FIFO pipe per ordered pair, random interleaving,
 * kills and late views, all from one seed ---- */

#define MAXN   6
#define MAXSEQ 4

typedef struct qmsg {
    uint32_t from, to;
    cps__coll_msg m;
    float *vals;
} qmsg;

typedef struct node {
    cps__coll *c;
    uint32_t id;
    int alive;
    uint64_t view_epoch;
    float *data[MAXSEQ]; /* input, then result, of each collective */
    int status[MAXSEQ];  /* 1 running, 0 done, < 0 failed, 2 not started */
    uint64_t seqno[MAXSEQ];
    int next; /* collectives started */
} node;

/* The out hook (cps__coll_set_out) the shell installs, as a test double: 0 none (the ring copies
 * from its own buffer), 1 every forwarded chunk gets a payload of its own, 2 one in three asks
 * finds no memory (the copy path for that chunk). Payloads start as NaNs: a value the ring did
 * not write shows in the result. */
static int hook_mode;
static long hook_out;             /* payloads given and not yet sent or dropped */
static uint64_t kill_seeds = 400; /* test_kill_any_phase's seeds (fewer with the hook: time) */

static float *hook_payload(void *ctx, uint32_t to, const cps__coll_msg *m)
{
    uint64_t *rng = ctx;
    (void)to;
    assert_null(m->vals);
    assert_true(m->count > 0);
    *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
    if (hook_mode == 2 && (*rng >> 33) % 3 == 0)
        return NULL;
    float *p = malloc(m->count * sizeof *p);
    assert_non_null(p);
    for (uint64_t j = 0; j < m->count; j++)
        p[j] = __builtin_nanf("");
    hook_out++;
    return p;
}

typedef struct net {
    node nodes[MAXN];
    uint32_t n;
    qmsg *q;
    size_t nq, capq;
    uint64_t rng;
    uint64_t now;
    uint64_t epoch;
    uint32_t members[MAXN];
    uint32_t nmembers;
    uint64_t len; /* values per collective */
    uint32_t chunk;
    int op;
    uint64_t hook_rng;
} net;

static uint64_t rnd(net *t)
{
    /* splitmix64 */
    uint64_t z = (t->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static node *by_id(net *t, uint32_t id)
{
    for (uint32_t i = 0; i < t->n; i++)
        if (t->nodes[i].id == id)
            return &t->nodes[i];
    return NULL;
}

static void perform(net *t, node *nd)
{
    const cps__coll_act *a;
    size_t na = cps__coll_actions(nd->c, &a);
    for (size_t i = 0; i < na; i++) {
        if (a[i].kind == CPS_COLL_SEND) {
            node *to = by_id(t, a[i].to);
            assert_non_null(to);
            /* A built payload is the shell's to send or give back, whatever happens. */
            float *built = a[i].built ? (float *)(uintptr_t)a[i].msg.vals : NULL;
            assert_true(!built || hook_mode);
            if (!to->alive || !nd->alive) {
                if (built) {
                    free(built);
                    hook_out--;
                }
                continue;
            }
            if (t->nq == t->capq) {
                t->capq = t->capq ? 2 * t->capq : 64;
                t->q = realloc(t->q, t->capq * sizeof *t->q);
                assert_non_null(t->q);
            }
            qmsg *q = &t->q[t->nq++];
            q->from = nd->id;
            q->to = a[i].to;
            q->m = a[i].msg;
            q->vals = malloc((a[i].msg.count + 1) * sizeof(float));
            if (a[i].msg.count)
                memcpy(q->vals, a[i].msg.vals, a[i].msg.count * sizeof(float));
            q->m.vals = q->vals;
            if (built) {
                free(built);
                hook_out--;
            }
        } else if (a[i].kind == CPS_COLL_DONE || a[i].kind == CPS_COLL_FAILED) {
            int k;
            for (k = 0; k < nd->next; k++)
                if (nd->status[k] == 1)
                    break;
            assert_true(k < nd->next);
            nd->status[k] = a[i].kind == CPS_COLL_DONE ? 0 : a[i].status;
            nd->seqno[k] = a[i].seq;
        }
    }
}

static void net_init(net *t, uint32_t n, uint64_t len, uint32_t chunk, int op, uint64_t seed)
{
    memset(t, 0, sizeof *t);
    t->n = n;
    t->rng = seed;
    t->len = len;
    t->chunk = chunk;
    t->op = op;
    t->epoch = 5;
    t->nmembers = n;
    t->hook_rng = seed;
    for (uint32_t i = 0; i < n; i++) {
        node *nd = &t->nodes[i];
        nd->id = 100 + 7 * i; /* ids unrelated to positions */
        nd->alive = 1;
        t->members[i] = nd->id;
        assert_int_equal(cps__coll_create(nd->id, chunk, 10000, &nd->c), 0);
        if (hook_mode)
            cps__coll_set_out(nd->c, hook_payload, &t->hook_rng);
        for (int k = 0; k < MAXSEQ; k++) {
            nd->data[k] = malloc(len * sizeof(float));
            nd->status[k] = 2;
        }
    }
    for (uint32_t i = 0; i < n; i++) {
        node *nd = &t->nodes[i];
        assert_int_equal(cps__coll_view(nd->c, t->epoch, t->members, n, 1, 0), 0);
        nd->view_epoch = t->epoch;
    }
}

static void net_fini(net *t)
{
    for (uint32_t i = 0; i < t->n; i++) {
        cps__coll_destroy(t->nodes[i].c);
        for (int k = 0; k < MAXSEQ; k++)
            free(t->nodes[i].data[k]);
    }
    for (size_t i = 0; i < t->nq; i++)
        free(t->q[i].vals);
    free(t->q);
    assert_int_equal(hook_out, 0); /* every payload the ring asked for was sent */
}

static void start(net *t, node *nd, int k)
{
    uint64_t seq;
    nd->status[k] = 1;
    nd->next = k + 1;
    assert_int_equal(cps__coll_start(nd->c, nd->data[k], t->len, t->op, t->now, &seq), 0);
    perform(t, nd);
}

/* Deliver one message: a random one among those at the head of their pipe. 0 if none. */
static int deliver_one(net *t)
{
    if (t->nq == 0)
        return 0;
    size_t pick = rnd(t) % t->nq;
    /* The first message of the picked one's pipe. */
    for (size_t i = 0; i < pick; i++)
        if (t->q[i].from == t->q[pick].from && t->q[i].to == t->q[pick].to) {
            pick = i;
            break;
        }
    qmsg q = t->q[pick];
    memmove(&t->q[pick], &t->q[pick + 1], (t->nq - pick - 1) * sizeof *t->q);
    t->nq--;
    node *to = by_id(t, q.to);
    if (to->alive) {
        q.m.from = q.from;
        cps__coll_step(to->c, &q.m, t->now);
        perform(t, to);
    }
    free(q.vals);
    return 1;
}

static void kill_node(net *t, node *nd)
{
    nd->alive = 0;
    for (size_t i = 0; i < t->nq;) {
        if (t->q[i].from == nd->id || t->q[i].to == nd->id) {
            free(t->q[i].vals);
            memmove(&t->q[i], &t->q[i + 1], (t->nq - i - 1) * sizeof *t->q);
            t->nq--;
        } else {
            i++;
        }
    }
    uint32_t m = 0;
    for (uint32_t i = 0; i < t->nmembers; i++)
        if (t->members[i] != nd->id)
            t->members[m++] = t->members[i];
    t->nmembers = m;
    t->epoch++;
}

static void fill_inputs(net *t, int exact)
{
    for (uint32_t i = 0; i < t->n; i++)
        for (int k = 0; k < MAXSEQ; k++)
            for (uint64_t j = 0; j < t->len; j++) {
                if (exact) /* the sum names who contributed: bit i per worker */
                    t->nodes[i].data[k][j] = (float)(1u << i);
                else
                    t->nodes[i].data[k][j] =
                        (float)((double)(rnd(t) % 2000001) / 1000.0 - 1000.0) * 1.37f;
            }
}

/* The sum in the ring's order over members[0..p) (positions), as collective.h states. */
static void reference(net *t, float **inputs, uint32_t p, float *out)
{
    for (uint32_t s = 0; s < p; s++) {
        uint64_t lo, hi;
        cps__coll_segment(t->len, p, s, &lo, &hi);
        for (uint64_t j = lo; j < hi; j++) {
            float acc = inputs[s][j];
            for (uint32_t d = 1; d < p; d++)
                acc = acc + inputs[(s + d) % p][j];
            if (t->op == CPS_COLL_MEAN)
                acc = acc / (float)p;
            out[j] = acc;
        }
    }
}

static void test_chunking(void **state)
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
static void test_ring_bits(void **state)
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
static void test_ring_bits_built(void **state)
{
    hook_mode = 2;
    test_ring_bits(state);
}

/* A failed test leaves the hook off for the next. */
static int hook_off(void **state)
{
    (void)state;
    hook_mode = 0;
    hook_out = 0;
    kill_seeds = 400;
    return 0;
}

/* Members starting at different moments (one still idle while others send) still agree. */
static void test_late_starter_and_sequence(void **state)
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
static void test_kill_any_phase(void **state)
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
static void test_kill_any_phase_built(void **state)
{
    hook_mode = 2;
    kill_seeds = 60;
    test_kill_any_phase(state);
}

/* A replacement joins a ring that is at its third collective: its first one takes the ring's
 * sequence number, whenever it starts, and every member ends with the same bits. */
static void test_replacement_joins(void **state)
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

static void test_alone_and_errors(void **state)
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

/* Node 9 (chunks of any size, a 1000 ms timeout) in view `epoch` of `members`: a joiner when
 * `joining` (it fetched nothing), told the ring's next seq when `next_seq` is not 0. */
static cps__coll *node9(uint64_t epoch, const uint32_t *members, uint32_t n, int joining,
                        uint64_t next_seq)
{
    cps__coll *c;
    assert_int_equal(cps__coll_create(9, 0, 1000, &c), 0);
    if (joining)
        cps__coll_set_joining(c);
    assert_int_equal(cps__coll_view(c, epoch, members, n, 1, 0), 0);
    if (next_seq)
        assert_int_equal(cps__coll_set_next_seq(c, next_seq, 0), 0);
    return c;
}

/* A fetch's answer names the ring's next collective; it is taken only while the shell holds no
 * call of the ring (started or waiting): a late answer must not renumber a call already ordered
 * against the ring, nor does an older sharer's answer without a sequence (0) change anything. */
static void test_next_seq_waits_for_no_calls(void **state)
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

/* A message of a 2-value collective from `from`, chunk 0, carrying `count` values at `vals`. */
static cps__coll_msg msg2(uint32_t from, uint32_t kind, uint64_t epoch, uint64_t seq,
                          const float *vals, uint64_t count)
{
    return (cps__coll_msg){.from = from,
                           .kind = kind,
                           .epoch = epoch,
                           .seq = seq,
                           .index = 0,
                           .n = 2,
                           .vals = vals,
                           .count = count};
}

/* Fencing: an old epoch's message is dropped; a newer one waits for its view. */
static void test_epochs(void **state)
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
static void test_joiner_restart_in_drain(void **state)
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

/* Node 9, a joiner, running its first call over x[0..2) in the ring 10 -> 9 -> 11 (view 1). */
static cps__coll *joiner_started(float *x)
{
    uint64_t seq;
    uint32_t three[3] = {10, 9, 11};
    cps__coll *c = node9(1, three, 3, 1, 0);
    assert_int_equal(cps__coll_start(c, x, 2, CPS_COLL_SUM, 0, &seq), 0);
    return c;
}

/* A joiner took seq 4 from a predecessor that then died; its new predecessor is still in 3. The
 * new view must not make it send seq 4's chunks (the peer would keep them, end 3 with us, and
 * reduce our first call's input into 4 beside our second call's: sim_collective, seed 4862): it
 * waits for its predecessor's seq and joins 3. */
static void test_joiner_listens_after_view(void **state)
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
static void test_given_seq_asks_and_keeps(void **state)
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
static void test_adopted_result_answers_restart(void **state)
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
static void test_given_seq_helps_skipped(void **state)
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
static void test_joiner_stays_where_its_input_went(void **state)
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

/* Two joiners re-formed by a view, each waiting for its predecessor: neither sends a chunk; when
 * each has heard the other listen, both take the higher seq (no timer: waiting long changes
 * nothing). */
static void test_listeners_agree(void **state)
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
static void test_listeners_follow_pin(void **state)
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
static void test_idle_joiner_asks_for_a_restart(void **state)
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
static void test_listening_joiner_takes_a_result(void **state)
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
static void test_listener_ignores_an_older_result(void **state)
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
static void test_listen_in_a_completed_collective_gets_the_result(void **state)
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunking),
        cmocka_unit_test(test_ring_bits),
        cmocka_unit_test_teardown(test_ring_bits_built, hook_off),
        cmocka_unit_test(test_late_starter_and_sequence),
        cmocka_unit_test(test_kill_any_phase),
        cmocka_unit_test_teardown(test_kill_any_phase_built, hook_off),
        cmocka_unit_test(test_replacement_joins),
        cmocka_unit_test(test_alone_and_errors),
        cmocka_unit_test(test_epochs),
        cmocka_unit_test(test_joiner_restart_in_drain),
        cmocka_unit_test(test_joiner_listens_after_view),
        cmocka_unit_test(test_given_seq_asks_and_keeps),
        cmocka_unit_test(test_next_seq_waits_for_no_calls),
        cmocka_unit_test(test_adopted_result_answers_restart),
        cmocka_unit_test(test_given_seq_helps_skipped),
        cmocka_unit_test(test_joiner_stays_where_its_input_went),
        cmocka_unit_test(test_listeners_agree),
        cmocka_unit_test(test_listeners_follow_pin),
        cmocka_unit_test(test_idle_joiner_asks_for_a_restart),
        cmocka_unit_test(test_listening_joiner_takes_a_result),
        cmocka_unit_test(test_listener_ignores_an_older_result),
        cmocka_unit_test(test_listen_in_a_completed_collective_gets_the_result),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
