/* One test per clause of chain replication (van Renesse & Schneider, OSDI 2004) against the
 * pure chain state machine: head, middle, tail, propagation, tail / head / middle crash, and a
 * new tail joining. Servers 1..4 each run a cps__chain over a fake store; a FIFO network carries
 * their SENDs, and a test may deliver selectively (to one node, out of order) or crash a node
 * (its queued messages vanish), also between a FWD it sends ahead of its APPLY and that APPLY
 * (forward before apply). The fake store refuses an APPLY out of sequence, so any update
 * applied twice or out of order fails the test where it happens. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "replication/chain.h"

#define NSERVERS 4
#define WORKER   9
#define MAXLOG   64
#define MAXQ     256
#define RESEND   200

typedef struct node {
    uint32_t id;
    int alive;
    cps__chain *c;
    /* The store: last applied seq, the worker's exactly-once record, and the sum of the pushed
     * deltas (the "parameter" a pull would read). */
    uint64_t seq;
    uint64_t dedup;
    uint64_t sum;
    uint64_t applied[MAXLOG]; /* seq of every APPLY, in order */
    uint32_t napplied;
    uint64_t replied[MAXLOG]; /* req_seq of every REPLY this node gave a worker */
    void *cookie[MAXLOG];
    uint32_t nreplied;
    /* The last call's actions: A(pply), S(end), R(eply), and each SEND's destination. */
    char acts[MAXLOG + 1];
    uint32_t to[MAXLOG];
} node;

typedef struct msg {
    uint32_t from, to;
    uint8_t *buf;
    size_t len;
} msg;

typedef struct world {
    node n[NSERVERS + 1]; /* by node id; [0] unused */
    msg q[MAXQ];
    size_t nq;
    cps__view v;
    uint64_t now;
    uint32_t stop_at_fwd; /* this node stops right after its next FWD goes out (take) */
} world;

static int store_seq(void *ctx, uint32_t range, uint64_t *seq)
{
    (void)range;
    *seq = ((node *)ctx)->seq;
    return 0;
}

static int store_dedup(void *ctx, uint32_t range, uint32_t worker, uint64_t *seq)
{
    (void)range;
    *seq = worker == WORKER ? ((node *)ctx)->dedup : 0;
    return 0;
}

static int store_agg(void *ctx, uint32_t range, uint64_t sig, uint64_t *step)
{
    (void)ctx;
    (void)range;
    (void)sig;
    *step = 0;
    return 0;
}

static const cps__chain_store_ops ops = {store_seq, store_dedup, store_agg, NULL};

static uint8_t msg_type(const void *buf, size_t len)
{
    cps__msg_hdr h;
    assert_int_equal(cps__wire_hdr_decode(buf, len, &h), 0);
    return h.type;
}

/* Perform the actions of node id's last call, as a server's event loop would; a node named by
 * w->stop_at_fwd stops right after a FWD it sends (it is on the wire), before anything else. */
static void take(world *w, uint32_t id)
{
    node *n = &w->n[id];
    const cps__chain_action *a;
    size_t na = cps__chain_actions(n->c, &a);
    assert_true(na <= MAXLOG);
    for (size_t i = 0; i < na; i++) {
        n->acts[i] = a[i].kind == CPS_CA_APPLY ? 'A' : a[i].kind == CPS_CA_SEND ? 'S' : 'R';
        n->to[i] = a[i].to;
        if (a[i].kind == CPS_CA_APPLY) {
            /* Persist before send: the store takes updates strictly in sequence. */
            assert_int_equal(a[i].seq, n->seq + 1);
            n->seq = a[i].seq;
            for (uint32_t j = 0; j < a[i].upd.nreqs; j++)
                if (a[i].upd.reqs[j].worker == WORKER)
                    n->dedup = a[i].upd.reqs[j].req_seq;
            uint64_t delta;
            assert_int_equal(a[i].upd.body_len, sizeof delta);
            memcpy(&delta, a[i].upd.body, sizeof delta);
            n->sum += delta;
            assert_true(n->napplied < MAXLOG);
            n->applied[n->napplied++] = a[i].seq;
        } else if (a[i].kind == CPS_CA_SEND) {
            assert_true(w->nq < MAXQ);
            msg *m = &w->q[w->nq++];
            m->from = id;
            m->to = a[i].to;
            m->len = a[i].len;
            m->buf = malloc(a[i].len);
            assert_non_null(m->buf);
            memcpy(m->buf, a[i].msg, a[i].len);
            if (w->stop_at_fwd == id && msg_type(a[i].msg, a[i].len) == CPS_MSG_FWD) {
                w->stop_at_fwd = 0;
                n->alive = 0;
                n->acts[i + 1] = 0;
                return;
            }
        } else {
            assert_int_equal(a[i].kind, CPS_CA_REPLY);
            assert_true(n->nreplied < MAXLOG);
            n->cookie[n->nreplied] = a[i].cookie;
            n->replied[n->nreplied++] = a[i].req.req_seq;
        }
    }
    n->acts[na] = 0;
}

static void set_chain(world *w, const uint32_t *chain, uint32_t len)
{
    w->v.ranges[0].chain_len = len;
    memcpy(w->v.ranges[0].chain, chain, len * sizeof *chain);
}

/* Servers 1..4 and the worker, all alive, one range on `chain`; every server has the view. */
static void world_init(world *w, const uint32_t *chain, uint32_t len)
{
    memset(w, 0, sizeof *w);
    cps__view *v = &w->v;
    cps__view_init(v);
    v->epoch = 1;
    v->nnodes = NSERVERS + 1;
    v->nodes = calloc(v->nnodes, sizeof *v->nodes);
    assert_non_null(v->nodes);
    for (uint32_t i = 0; i < v->nnodes; i++) {
        v->nodes[i].id = i < NSERVERS ? i + 1 : WORKER;
        v->nodes[i].role = i < NSERVERS ? CPS_ROLE_SERVER : CPS_ROLE_WORKER;
        v->nodes[i].alive = 1;
        v->nodes[i].rank = i < NSERVERS ? i : 0;
        snprintf(v->nodes[i].addr, sizeof v->nodes[i].addr, "tcp://127.0.0.1:%u", 3000 + i);
    }
    v->num_servers = NSERVERS;
    v->num_workers = 1;
    v->replicas = len;
    v->nranges = 1;
    v->ranges = calloc(1, sizeof *v->ranges);
    assert_non_null(v->ranges);
    v->ranges[0].hi = UINT64_MAX;
    set_chain(w, chain, len);
    for (uint32_t id = 1; id <= NSERVERS; id++) {
        node *n = &w->n[id];
        n->id = id;
        n->alive = 1;
        cps__chain_config cfg = {id, RESEND, 1024};
        assert_int_equal(cps__chain_create(&cfg, &ops, n, &n->c), 0);
        assert_int_equal(cps__chain_set_view(n->c, v, w->now), 0);
        take(w, id);
    }
}

static void world_fini(world *w)
{
    for (size_t i = 0; i < w->nq; i++)
        free(w->q[i].buf);
    for (uint32_t id = 1; id <= NSERVERS; id++)
        cps__chain_destroy(w->n[id].c);
    cps__view_fini(&w->v);
}

/* The scheduler's next view: `chain` for the range, and the nodes not alive marked dead. */
static void new_view(world *w, const uint32_t *chain, uint32_t len)
{
    w->v.epoch++;
    set_chain(w, chain, len);
    for (uint32_t id = 1; id <= NSERVERS; id++)
        w->v.nodes[id - 1].alive = (uint8_t)w->n[id].alive;
    for (uint32_t id = 1; id <= NSERVERS; id++) {
        if (!w->n[id].alive)
            continue;
        assert_int_equal(cps__chain_set_view(w->n[id].c, &w->v, w->now), 0);
        take(w, id);
    }
}

/* The node stops: what it had queued and what was on its way to it are lost. */
static void crash(world *w, uint32_t id)
{
    w->n[id].alive = 0;
    size_t kept = 0;
    for (size_t i = 0; i < w->nq; i++) {
        if (w->q[i].from == id || w->q[i].to == id)
            free(w->q[i].buf);
        else
            w->q[kept++] = w->q[i];
    }
    w->nq = kept;
}

static msg unqueue(world *w, size_t i)
{
    msg m = w->q[i];
    memmove(&w->q[i], &w->q[i + 1], (w->nq - i - 1) * sizeof *w->q);
    w->nq--;
    return m;
}

static void deliver_at(world *w, size_t i)
{
    msg m = unqueue(w, i);
    cps__msg_hdr h;
    assert_int_equal(cps__wire_hdr_decode(m.buf, m.len, &h), 0);
    node *n = &w->n[m.to];
    if (!n->alive) {
        free(m.buf); /* a stopped node hears nothing */
        return;
    }
    /* Refusals (a fenced epoch, a gap) are part of the protocol: what counts is the actions. */
    (void)cps__chain_on_message(n->c, &h, m.buf + CPS_WIRE_HDR_SIZE, m.len - CPS_WIRE_HDR_SIZE,
                                w->now);
    take(w, m.to);
    free(m.buf);
}

/* Deliver what is queued for node `to` now (not what that produces). */
static void deliver_to(world *w, uint32_t to)
{
    size_t n = 0;
    for (size_t i = 0; i < w->nq; i++)
        n += w->q[i].to == to;
    for (size_t i = 0; n > 0;) {
        if (w->q[i].to == to) {
            deliver_at(w, i);
            n--;
        } else {
            i++;
        }
    }
}

static void deliver_all(world *w)
{
    for (int guard = 0; w->nq > 0; guard++) {
        assert_true(guard < 10 * MAXQ);
        deliver_at(w, 0);
    }
}

/* Index of the queued message of `type` for `to` with this req_seq, or -1. */
static long find_msg(const world *w, uint32_t to, uint8_t type, uint64_t seq)
{
    for (size_t i = 0; i < w->nq; i++) {
        cps__msg_hdr h;
        if (w->q[i].to == to && cps__wire_hdr_decode(w->q[i].buf, w->q[i].len, &h) == 0 &&
            h.type == type && h.req_seq == seq)
            return (long)i;
    }
    return -1;
}

/* Deliver to node `to` the FWD of update `seq`, then the CHAIN_MARK that says its sender
 * applied it (forward before apply: the FWD alone is held). */
static void deliver_fwd(world *w, uint32_t to, uint64_t seq)
{
    long i = find_msg(w, to, CPS_MSG_FWD, seq);
    assert_true(i >= 0);
    deliver_at(w, (size_t)i);
    i = find_msg(w, to, CPS_MSG_CHAIN_MARK, seq);
    assert_true(i >= 0);
    deliver_at(w, (size_t)i);
}

/* The worker's push with request number `req` (its delta is `req` too) at node `head`. */
static int push_cookie(world *w, uint32_t head, uint64_t req, void *cookie)
{
    uint64_t body = req;
    cps__chain_req rq = {WORKER, CPS_MSG_PUSH, 0, req};
    cps__chain_update u = {CPS_UPD_PUSH, 0, 0, 1, &rq, &body, sizeof body};
    node *n = &w->n[head];
    int verdict = cps__chain_admit(n->c, 0, &rq, 0, 0, cookie);
    take(w, head);
    if (verdict == CPS_ADMIT_NEW) {
        assert_int_equal(cps__chain_submit(n->c, 0, &u, w->now), 0);
        take(w, head);
    }
    return verdict;
}

static void push(world *w, uint32_t head, uint64_t req)
{
    assert_int_equal(push_cookie(w, head, req, NULL), CPS_ADMIT_NEW);
}

static void tick(world *w, uint32_t id)
{
    assert_int_equal(cps__chain_tick(w->n[id].c, w->now), 0);
    take(w, id);
}

/* Node id applied exactly seqs 1..k, once each, in order. */
static void assert_applied_1_to(const world *w, uint32_t id, uint64_t k)
{
    const node *n = &w->n[id];
    assert_int_equal(n->napplied, k);
    for (uint32_t i = 0; i < k; i++)
        assert_int_equal(n->applied[i], i + 1);
    assert_int_equal(n->sum, k * (k + 1) / 2);
}

/* Node id answered exactly requests 1..k, once each, in order. */
static void assert_replied_1_to(const world *w, uint32_t id, uint64_t k)
{
    const node *n = &w->n[id];
    assert_int_equal(n->nreplied, k);
    for (uint32_t i = 0; i < k; i++)
        assert_int_equal(n->replied[i], i + 1);
}

/* Node id's range is committed up to `committed` and holds `unacked` FWDs not yet acknowledged. */
static void assert_held(const world *w, uint32_t id, uint64_t committed, uint32_t unacked)
{
    assert_int_equal(cps__chain_committed(w->n[id].c, 0), committed);
    assert_int_equal(cps__chain_unacked(w->n[id].c, 0), unacked);
}

static const uint32_t chain12[] = {1, 2};
static const uint32_t chain123[] = {1, 2, 3};

static int setup_world(void **state, const uint32_t *chain, uint32_t len)
{
    world *w = malloc(sizeof *w);
    if (!w)
        return -1;
    world_init(w, chain, len);
    *state = w;
    return 0;
}

static int setup_chain123(void **state)
{
    return setup_world(state, chain123, 3);
}

static int setup_chain12(void **state)
{
    return setup_world(state, chain12, 2);
}

static int teardown_world(void **state)
{
    world_fini(*state);
    free(*state);
    return 0;
}

/* The head numbers each update, forwards it ahead of applying it (the successor receives while
 * the head writes), says so once applied (CHAIN_MARK), and says nothing to the worker: only the
 * tail answers, once the update is on every replica. */
static void head_numbers_applies_and_forwards_and_does_not_answer(void **state)
{
    world *w = *state;
    push(w, 1, 1);
    assert_string_equal(w->n[1].acts, "SAS");
    assert_int_equal(w->n[1].to[0], 2);
    assert_int_equal(w->n[1].to[2], 2);
    push(w, 1, 2);
    assert_string_equal(w->n[1].acts, "SAS");
    assert_applied_1_to(w, 1, 2);
    assert_true(find_msg(w, 2, CPS_MSG_FWD, 1) >= 0);
    assert_true(find_msg(w, 2, CPS_MSG_FWD, 2) >= 0);
    assert_true(find_msg(w, 2, CPS_MSG_CHAIN_MARK, 2) >= 0);
    assert_int_equal(w->nq, 4);
    assert_int_equal(w->n[1].nreplied, 0);
    assert_held(w, 1, 0, 2);

    deliver_all(w);
    assert_int_equal(w->n[1].nreplied, 0);
    assert_int_equal(w->n[2].nreplied, 0);
    assert_replied_1_to(w, 3, 2);
    assert_int_equal(cps__chain_committed(w->n[1].c, 0), 2);
}

/* A middle replica applies FWDs strictly in sequence (a FWD past a gap waits for the re-send)
 * and only once its predecessor applied them (a FWD that came ahead of the head's write waits
 * for its MARK), forwards each, and keeps each as unacknowledged until the ack comes back up. */
static void middle_applies_in_order_forwards_and_holds_until_acked(void **state)
{
    world *w = *state;
    for (uint64_t r = 1; r <= 3; r++)
        push(w, 1, r);
    /* FWD 3 overtakes 1 and 2. */
    deliver_at(w, (size_t)find_msg(w, 2, CPS_MSG_FWD, 3));
    assert_string_equal(w->n[2].acts, "");
    assert_int_equal(cps__chain_applied(w->n[2].c, 0), 0);
    deliver_at(w, (size_t)find_msg(w, 2, CPS_MSG_FWD, 1));
    assert_string_equal(w->n[2].acts, ""); /* held: the head said nothing of its write yet */
    deliver_at(w, (size_t)find_msg(w, 2, CPS_MSG_CHAIN_MARK, 1));
    assert_string_equal(w->n[2].acts, "SAS");
    assert_int_equal(w->n[2].to[0], 3);
    deliver_fwd(w, 2, 2);
    assert_applied_1_to(w, 2, 2);
    assert_int_equal(w->n[2].nreplied, 0);
    assert_held(w, 2, 0, 2);

    deliver_to(w, 3);
    assert_applied_1_to(w, 3, 2);
    /* The tail's acks are on their way, not yet in: the middle still holds both. */
    assert_int_equal(cps__chain_unacked(w->n[2].c, 0), 2);
    deliver_to(w, 2);
    assert_held(w, 2, 2, 0);
    assert_true(find_msg(w, 1, CPS_MSG_CHAIN_ACK, 2) >= 0); /* passed up */

    /* The head re-sends what was not acknowledged; the middle takes it in order. */
    deliver_all(w);
    assert_int_equal(cps__chain_unacked(w->n[1].c, 0), 1);
    w->now += RESEND;
    tick(w, 1);
    tick(w, 2);
    assert_string_equal(w->n[2].acts, ""); /* it holds nothing: nothing to re-send */
    deliver_all(w);
    assert_applied_1_to(w, 2, 3);
    assert_applied_1_to(w, 3, 3);
    assert_int_equal(cps__chain_unacked(w->n[2].c, 0), 0);
}

/* The tail applies, answers the worker and acks up the chain at once. Reads are the tail's: a
 * value applied at the head or a middle is not committed and no one serves it yet. */
static void tail_applies_answers_acks_and_alone_serves_reads(void **state)
{
    world *w = *state;
    push(w, 1, 1);
    deliver_to(w, 2);
    assert_int_equal(w->n[2].sum, 1);
    assert_int_equal(w->n[3].sum, 0); /* what a pull reads: the update is not committed */
    assert_false(cps__chain_can_serve_pull(w->n[1].c, 0));
    assert_false(cps__chain_can_serve_pull(w->n[2].c, 0));
    assert_true(cps__chain_can_serve_pull(w->n[3].c, 0));
    assert_true(cps__chain_is_tail(w->n[3].c, 0));

    deliver_to(w, 3);
    assert_string_equal(w->n[3].acts, "ARS");
    assert_int_equal(w->n[3].to[2], 2);
    assert_replied_1_to(w, 3, 1);
    assert_held(w, 3, 1, 0); /* the tail holds nothing */
    assert_true(find_msg(w, 2, CPS_MSG_CHAIN_ACK, 1) >= 0);
    assert_int_equal(w->n[3].sum, 1);
}

/* Updates travel head -> middle -> tail, acks travel back, and every pending set drains:
 * afterwards all replicas hold the same updates, all committed. */
static void updates_propagate_down_and_acks_drain_every_pending_set(void **state)
{
    world *w = *state;
    for (uint64_t r = 1; r <= 5; r++) {
        push(w, 1, r);
        if (r % 2)
            deliver_at(w, 0); /* interleave deliveries with new pushes */
    }
    deliver_all(w);
    for (uint32_t id = 1; id <= 3; id++) {
        assert_applied_1_to(w, id, 5);
        assert_held(w, id, 5, 0);
    }
    assert_replied_1_to(w, 3, 5);
    assert_int_equal(w->n[1].nreplied + w->n[2].nreplied, 0);
}

/* The tail crashes: its predecessor becomes the tail, and what it held unacknowledged is on
 * every live replica, so it is committed and answered at once. */
static void tail_crash_the_predecessor_commits_and_answers_what_it_held(void **state)
{
    world *w = *state;
    push(w, 1, 1);
    deliver_all(w);
    push(w, 1, 2);
    push(w, 1, 3);
    deliver_to(w, 2);
    crash(w, 3);
    assert_held(w, 2, 1, 2);
    assert_int_equal(w->n[2].nreplied, 0);

    new_view(w, chain12, 2);
    assert_true(cps__chain_is_tail(w->n[2].c, 0));
    assert_int_equal(w->n[2].nreplied, 2);
    assert_int_equal(w->n[2].replied[0], 2);
    assert_int_equal(w->n[2].replied[1], 3);
    assert_held(w, 2, 3, 0);
    assert_true(cps__chain_can_serve_pull(w->n[2].c, 0));
    deliver_all(w);
    assert_held(w, 1, 3, 0);

    push(w, 1, 4); /* the shorter chain carries on */
    deliver_all(w);
    assert_applied_1_to(w, 2, 4);
    assert_int_equal(w->n[2].replied[w->n[2].nreplied - 1], 4);
}

/* The head crashes: its successor becomes the head and numbers on from what it applied. Nothing
 * acknowledged is lost, and the worker's re-send of a push the chain already has is answered,
 * never applied again. */
static void head_crash_the_successor_numbers_on_and_dedups_resends(void **state)
{
    world *w = *state;
    push(w, 1, 1);
    deliver_all(w);
    assert_replied_1_to(w, 3, 1); /* push 1 is acknowledged */
    push(w, 1, 2);
    deliver_to(w, 2); /* push 2 reached the middle only */
    push(w, 1, 3);    /* push 3 never left the head */
    crash(w, 1);

    static const uint32_t chain23[] = {2, 3};
    new_view(w, chain23, 2);
    assert_true(cps__chain_is_head(w->n[2].c, 0));
    /* The worker, unanswered, re-sends both pushes to the new head. */
    int cookie2, cookie3;
    assert_int_equal(push_cookie(w, 2, 2, &cookie2), CPS_ADMIT_DUP);
    assert_string_equal(w->n[2].acts, ""); /* answered when committed, not before */
    assert_int_equal(push_cookie(w, 2, 3, &cookie3), CPS_ADMIT_NEW);
    assert_int_equal(w->n[2].applied[w->n[2].napplied - 1], 3);

    deliver_all(w); /* the FWD of push 2 under the old epoch is fenced at 3 */
    w->now += RESEND;
    tick(w, 2);
    deliver_all(w);
    for (uint32_t id = 2; id <= 3; id++) {
        assert_applied_1_to(w, id, 3);
        assert_int_equal(cps__chain_unacked(w->n[id].c, 0), 0);
    }
    assert_replied_1_to(w, 3, 3);
    /* The duplicate got its answer from the head once push 2 committed. */
    assert_int_equal(w->n[2].nreplied, 1);
    assert_int_equal(w->n[2].replied[0], 2);
    assert_ptr_equal(w->n[2].cookie[0], &cookie2);
}

/* A middle replica crashes: the predecessor re-sends to its new successor, at once, every update
 * it has not seen acknowledged (the successor may lack any of them), and the successor applies
 * each one once. */
static void middle_crash_the_predecessor_resends_its_sent_list_once_each(void **state)
{
    world *w = *state;
    for (uint64_t r = 1; r <= 3; r++)
        push(w, 1, r);
    deliver_to(w, 2);
    deliver_fwd(w, 3, 1); /* only update 1 got past 2 */
    assert_applied_1_to(w, 3, 1);
    crash(w, 2);
    assert_int_equal(cps__chain_unacked(w->n[1].c, 0), 3);

    static const uint32_t chain13[] = {1, 3};
    new_view(w, chain13, 2);
    /* Re-sent with the view, not after a timer. */
    assert_true(find_msg(w, 3, CPS_MSG_FWD, 1) >= 0);
    assert_true(find_msg(w, 3, CPS_MSG_FWD, 2) >= 0);
    assert_true(find_msg(w, 3, CPS_MSG_FWD, 3) >= 0);
    deliver_all(w);
    assert_applied_1_to(w, 3, 3);
    assert_replied_1_to(w, 3, 3);
    assert_held(w, 1, 3, 0);
}

/* Forward before apply, and the head stops between its FWD and its APPLY: the FWD is on the
 * wire, but the successor holds it unapplied (the head never said it applied it), so nothing
 * is acknowledged and no replica holds what the head lacks. The new head takes the worker's
 * re-send as new and every replica applies it once. */
static void head_stopped_between_fwd_and_apply_loses_nothing_applies_once(void **state)
{
    world *w = *state;
    push(w, 1, 1);
    deliver_all(w);
    assert_replied_1_to(w, 3, 1);
    w->stop_at_fwd = 1;
    push(w, 1, 2);
    assert_string_equal(w->n[1].acts, "S");
    assert_applied_1_to(w, 1, 1); /* its store never got update 2 */
    deliver_all(w);
    assert_applied_1_to(w, 2, 1); /* held, not applied, not passed on */
    assert_applied_1_to(w, 3, 1);
    assert_replied_1_to(w, 3, 1); /* nothing acknowledged */
    crash(w, 1);

    static const uint32_t chain23[] = {2, 3};
    new_view(w, chain23, 2);
    assert_int_equal(push_cookie(w, 2, 2, NULL), CPS_ADMIT_NEW);
    deliver_all(w);
    assert_applied_1_to(w, 2, 2);
    assert_applied_1_to(w, 3, 2);
    assert_replied_1_to(w, 3, 2);
    assert_held(w, 2, 2, 0);
}

/* The same at a middle replica: its successor holds the FWD unapplied; the head, which applied
 * the update, re-sends it to its new successor with the view, which applies it once and answers;
 * the worker's re-send is then a duplicate. */
static void middle_stopped_between_fwd_and_apply_loses_nothing_applies_once(void **state)
{
    world *w = *state;
    push(w, 1, 1);
    deliver_all(w);
    push(w, 1, 2);
    w->stop_at_fwd = 2;
    deliver_fwd(w, 2, 2);
    assert_string_equal(w->n[2].acts, "S");
    assert_applied_1_to(w, 2, 1);
    deliver_all(w);
    assert_applied_1_to(w, 3, 1); /* held: the middle never said it applied update 2 */
    assert_replied_1_to(w, 3, 1);
    crash(w, 2);

    static const uint32_t chain13[] = {1, 3};
    new_view(w, chain13, 2);
    deliver_all(w);
    assert_applied_1_to(w, 3, 2);
    assert_replied_1_to(w, 3, 2);
    assert_held(w, 1, 2, 0);
    int cookie;
    assert_int_equal(push_cookie(w, 1, 2, &cookie), CPS_ADMIT_DUP);
    assert_applied_1_to(w, 1, 2);
    assert_applied_1_to(w, 3, 2);
}

/* Drop node `from`'s queued CHAIN_MARK(APPLIED)s to `to` below `keep` (the replica holds a
 * turn's MARKs and sends only the last: replication/replica_ready.c). */
static void drop_marks_below(world *w, uint32_t from, uint32_t to, uint64_t keep)
{
    for (size_t i = 0; i < w->nq;) {
        cps__msg_hdr h;
        assert_int_equal(cps__wire_hdr_decode(w->q[i].buf, w->q[i].len, &h), 0);
        if (w->q[i].from == from && w->q[i].to == to && h.type == CPS_MSG_CHAIN_MARK &&
            (h.aux & CPS_CHAIN_MARK_APPLIED) && h.req_seq < keep)
            free(unqueue(w, i).buf);
        else
            i++;
    }
}

/* Set the aux ("applied up to") of node `from`'s queued FWDs to 0, as if it had forwarded all of
 * them before any of its writes. */
static void fwds_say_nothing_applied(world *w, uint32_t from)
{
    for (size_t i = 0; i < w->nq; i++) {
        cps__msg_hdr h;
        assert_int_equal(cps__wire_hdr_decode(w->q[i].buf, w->q[i].len, &h), 0);
        if (w->q[i].from == from && h.type == CPS_MSG_FWD) {
            h.aux = 0;
            cps__wire_hdr_encode(w->q[i].buf, &h);
        }
    }
}

/* One MARK for a turn of updates: a MARK of seq N lets the successor apply every FWD of that
 * predecessor it holds up to N, in order, and pass them on. */
static void one_mark_of_n_applies_every_held_fwd_up_to_n_in_order(void **state)
{
    world *w = *state;
    push(w, 1, 1);
    push(w, 1, 2);
    push(w, 1, 3);
    drop_marks_below(w, 1, 2, 3);
    fwds_say_nothing_applied(w, 1);
    long mark = find_msg(w, 2, CPS_MSG_CHAIN_MARK, 3);
    assert_true(mark >= 0);
    msg m = unqueue(w, (size_t)mark);
    deliver_to(w, 2);                      /* the three FWDs */
    assert_int_equal(w->n[2].napplied, 0); /* held: nothing said applied */
    w->q[w->nq++] = m;
    deliver_to(w, 2);
    assert_applied_1_to(w, 2, 3);
    deliver_all(w);
    assert_applied_1_to(w, 3, 3);
    assert_replied_1_to(w, 3, 3);
    assert_held(w, 1, 3, 0);
}

/* A head stops after its WRITEs and before the turn's one MARK: its successor applied what an
 * earlier FWD's aux said the head had, holds the last update unapplied, and nothing it lacks is
 * acknowledged. The new head takes the worker's re-send of the last as new; every replica
 * applies each update once. */
static void head_stopped_before_its_turns_mark_loses_nothing_acknowledged(void **state)
{
    world *w = *state;
    push(w, 1, 1);
    push(w, 1, 2);
    push(w, 1, 3);
    assert_applied_1_to(w, 1, 3);
    drop_marks_below(w, 1, 2, UINT64_MAX); /* the turn's MARK never went */
    deliver_all(w);
    assert_applied_1_to(w, 2, 2); /* FWD 3 said the head had 2 */
    assert_applied_1_to(w, 3, 2);
    assert_replied_1_to(w, 3, 2); /* update 3 is not acknowledged */
    crash(w, 1);

    static const uint32_t chain23[] = {2, 3};
    new_view(w, chain23, 2);
    deliver_all(w);
    assert_int_equal(push_cookie(w, 2, 3, NULL), CPS_ADMIT_NEW);
    deliver_all(w);
    assert_applied_1_to(w, 2, 3);
    assert_applied_1_to(w, 3, 3);
    assert_replied_1_to(w, 3, 3);
    assert_held(w, 2, 3, 0);
}

/* Install into node `to` the store `s` held when the snapshot was taken. */
static void install_snapshot(world *w, const node *s, uint32_t to)
{
    node *d = &w->n[to];
    d->seq = s->seq;
    d->dedup = s->dedup;
    d->sum = s->sum;
    memcpy(d->applied, s->applied, sizeof d->applied);
    d->napplied = s->napplied;
}

/* A new replica extends the chain at the tail: it copies a snapshot from the tail while the tail
 * keeps applying and forwards it every later update (the shadow); it becomes the tail holding
 * every update, and serves reads only once it has all its predecessor acknowledged. */
static void a_new_tail_joins_by_state_transfer_and_misses_no_update(void **state)
{
    world *w = *state;
    push(w, 1, 1);
    push(w, 1, 2);
    deliver_all(w);

    assert_int_equal(cps__chain_begin_join(w->n[3].c, 0, 2), 0);
    take(w, 3);
    assert_int_equal(cps__chain_add_shadow(w->n[2].c, 0, 3, 1, w->now), 0);
    take(w, 2);
    node snap = w->n[2]; /* the tail's read transaction starts here */
    /* Updates during the transfer: committed and answered by the tail, held by the joiner. */
    push(w, 1, 3);
    push(w, 1, 4);
    deliver_all(w);
    assert_replied_1_to(w, 2, 4);
    assert_int_equal(w->n[3].napplied, 0);
    assert_int_equal(cps__chain_unacked(w->n[2].c, 0), 2); /* owed to the joiner */

    install_snapshot(w, &snap, 3);
    assert_int_equal(cps__chain_join_ready(w->n[3].c, 0, snap.seq, w->now), 0);
    take(w, 3);
    assert_applied_1_to(w, 3, 4);
    deliver_all(w);
    assert_int_equal(cps__chain_unacked(w->n[2].c, 0), 0);
    push(w, 1, 5);
    deliver_all(w);
    assert_applied_1_to(w, 3, 5);

    new_view(w, chain123, 3);
    assert_true(cps__chain_is_tail(w->n[3].c, 0));
    assert_false(cps__chain_is_tail(w->n[2].c, 0));
    /* Until its predecessor's MARK arrives it cannot know it holds all that was acknowledged. */
    assert_false(cps__chain_can_serve_pull(w->n[3].c, 0));
    deliver_all(w);
    assert_true(cps__chain_can_serve_pull(w->n[3].c, 0));

    push(w, 1, 6);
    deliver_all(w);
    for (uint32_t id = 1; id <= 3; id++)
        assert_applied_1_to(w, id, 6);
    assert_int_equal(w->n[3].nreplied, 1); /* the new tail answers now */
    assert_int_equal(w->n[3].replied[0], 6);
    assert_replied_1_to(w, 2, 5);
    for (uint32_t id = 1; id <= 2; id++)
        assert_int_equal(cps__chain_unacked(w->n[id].c, 0), 0);
}

/* Re-sends wait for a stall, not for the age of the oldest update: while acks come back, a
 * burst of FWDs (the chunks of one large push) is being worked through and none is re-sent; once
 * acks stop for the re-send time, everything unacknowledged goes again. */
static void the_head_re_sends_only_once_acks_stop(void **state)
{
    world *w = *state;
    for (uint64_t r = 1; r <= 3; r++)
        push(w, 1, r);
    /* The tail takes FWD 1 late, and its ack arrives just before the re-send time. */
    w->now = RESEND - 10;
    deliver_fwd(w, 2, 1);
    deliver_to(w, 1);
    assert_int_equal(cps__chain_unacked(w->n[1].c, 0), 2);
    w->now = RESEND + 5; /* FWDs 2 and 3 are older than the re-send time, but acks flow */
    tick(w, 1);
    assert_string_equal(w->n[1].acts, "");
    w->now = 2 * RESEND - 10; /* the re-send time since the last ack: both go again */
    tick(w, 1);
    assert_string_equal(w->n[1].acts, "SS");
    deliver_all(w);
    assert_applied_1_to(w, 2, 3);
    assert_int_equal(cps__chain_unacked(w->n[1].c, 0), 0);
}

/* Data-path evidence: the head's updates wait at the tail since the first unacknowledged one went
 * out; an ack that makes progress restarts the count, and nothing waits once all are acked.
 * Only the successor is ever waited on. */
static void waiting_at_the_successor_counts_from_the_last_progress(void **state)
{
    world *w = *state;
    w->now = 1000;
    assert_int_equal(cps__chain_waiting_since(w->n[1].c, 2), 0);
    push(w, 1, 1);
    w->now = 1100;
    push(w, 1, 2);
    assert_int_equal(cps__chain_waiting_since(w->n[1].c, 2), 1000);
    assert_int_equal(cps__chain_waiting_since(w->n[1].c, 3), 0);
    assert_int_equal(cps__chain_waiting_since(w->n[2].c, 1), 0); /* the tail waits on no one */
    w->now = 5000; /* re-sent, unanswered: the wait goes on from the first send */
    tick(w, 1);
    assert_int_equal(cps__chain_waiting_since(w->n[1].c, 2), 1000);
    w->now = 5100;
    deliver_fwd(w, 2, 1);
    deliver_to(w, 1); /* the ack of 1: progress */
    assert_int_equal(cps__chain_waiting_since(w->n[1].c, 2), 5100);
    deliver_all(w);
    assert_int_equal(cps__chain_waiting_since(w->n[1].c, 2), 0);
}

/* The scheduler's next view (`chain` for the range), installed at no node yet: a test gives it
 * to some nodes only (install_at), as a slow connection would. */
static void next_view(world *w, const uint32_t *chain, uint32_t len)
{
    w->v.epoch++;
    set_chain(w, chain, len);
}

static void install_at(world *w, uint32_t id)
{
    assert_int_equal(cps__chain_set_view(w->n[id].c, &w->v, w->now), 0);
    take(w, id);
}

/* Deliver the FWD of update `seq` alone (no CHAIN_MARK after it): node `to` took it (an APPLY
 * came out) or did not. */
static void deliver_fwd_alone(world *w, uint32_t to, uint64_t seq, int taken)
{
    long i = find_msg(w, to, CPS_MSG_FWD, seq);
    assert_true(i >= 0);
    uint64_t before = cps__chain_applied(w->n[to].c, 0);
    deliver_at(w, (size_t)i);
    assert_int_equal(cps__chain_applied(w->n[to].c, 0), taken ? seq : before);
}

static const uint32_t chain1[] = {1};

static int setup_chain1(void **state)
{
    return setup_world(state, chain1, 1);
}

/* Simulator seed 4517: a tail acknowledged an update and forwarded it to the replica copying
 * the range, which became the tail in a view the old tail had not got yet. Each of its re-sends
 * carried its own, older epoch; while views kept coming it stayed one behind, the new tail
 * dropped them all as fenced, and the old tail died holding an update it had acknowledged. A
 * FWD stamped with an older epoch is taken from the node we have taken the range from since
 * then (predecessor or join source). */
static void a_predecessor_behind_in_views_still_gets_its_fwds_through(void **state)
{
    world *w = *state;
    push(w, 1, 1);
    assert_replied_1_to(w, 1, 1);
    /* Node 2 copies the range from node 1 (the tail), under epoch 1. */
    assert_int_equal(cps__chain_begin_join(w->n[2].c, 0, 1), 0);
    take(w, 2);
    assert_int_equal(cps__chain_add_shadow(w->n[1].c, 0, 2, 1, w->now), 0);
    take(w, 1);
    install_snapshot(w, &w->n[1], 2);
    assert_int_equal(cps__chain_join_ready(w->n[2].c, 0, 1, w->now), 0);
    take(w, 2);
    deliver_all(w);

    push(w, 1, 2); /* acknowledged by node 1, the tail, and forwarded to node 2 under epoch 1 */
    assert_replied_1_to(w, 1, 2);
    next_view(w, chain12, 2); /* epoch 2: node 2 is the tail; node 1 does not have it yet */
    install_at(w, 2);
    deliver_fwd_alone(w, 2, 2, 1);
    next_view(w, chain12, 2); /* epoch 3 (another node's change): node 2 moves further ahead */
    install_at(w, 2);
    w->now += 10 * RESEND;
    push(w, 1, 3);
    deliver_fwd_alone(w, 2, 3, 1);
    /* Node 2's acks carry epoch 3: node 1 waits for that view, then holds nothing. */
    deliver_all(w);
    assert_int_equal(cps__chain_unacked(w->n[1].c, 0), 2);
    install_at(w, 1);
    deliver_all(w);
    w->now += 10 * RESEND;
    tick(w, 1);
    deliver_all(w);
    assert_applied_1_to(w, 2, 3);
    assert_held(w, 1, 3, 0);
    push(w, 1, 4);
    deliver_all(w);
    assert_applied_1_to(w, 2, 4);
    assert_int_equal(w->n[2].replied[w->n[2].nreplied - 1], 4);
}

/* The rule above keeps the fence: a head removed from the chain (declared dead while slow)
 * is nobody's predecessor in the newer view, and a FWD stamped before the epoch since which
 * the sender has been our predecessor (as far as our views show) is not taken either. */
static void older_fwds_of_a_removed_head_or_an_earlier_chain_stay_fenced(void **state)
{
    world *w = *state;
    push(w, 1, 1);
    deliver_all(w);
    push(w, 1, 2);
    long old = find_msg(w, 2, CPS_MSG_FWD, 2); /* epoch 1, node 1 -> node 2 */
    assert_true(old >= 0);
    msg stale = unqueue(w, (size_t)old);

    static const uint32_t chain13[] = {1, 3};
    next_view(w, chain13, 2); /* epoch 2: node 2 left; node 3 follows node 1 from now on */
    install_at(w, 2);
    install_at(w, 3);
    stale.to = 3; /* a FWD node 1 sent its successor of epoch 1 reaches node 3 */
    w->q[w->nq++] = stale;
    deliver_fwd_alone(w, 3, 2, 0);
    install_at(w, 1);
    deliver_all(w); /* the re-send under epoch 2 is taken */
    assert_applied_1_to(w, 3, 2);

    static const uint32_t chain3[] = {3};
    next_view(w, chain3, 1); /* epoch 3: node 1 removed; it has not heard */
    install_at(w, 3);
    push(w, 1, 3); /* node 1 still takes writes under epoch 2 */
    deliver_fwd_alone(w, 3, 3, 0);
    w->now += 10 * RESEND;
    tick(w, 1);
    deliver_fwd_alone(w, 3, 3, 0);
    assert_applied_1_to(w, 3, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(head_numbers_applies_and_forwards_and_does_not_answer,
                                        setup_chain123, teardown_world),
        cmocka_unit_test_setup_teardown(middle_applies_in_order_forwards_and_holds_until_acked,
                                        setup_chain123, teardown_world),
        cmocka_unit_test_setup_teardown(tail_applies_answers_acks_and_alone_serves_reads,
                                        setup_chain123, teardown_world),
        cmocka_unit_test_setup_teardown(updates_propagate_down_and_acks_drain_every_pending_set,
                                        setup_chain123, teardown_world),
        cmocka_unit_test_setup_teardown(tail_crash_the_predecessor_commits_and_answers_what_it_held,
                                        setup_chain123, teardown_world),
        cmocka_unit_test_setup_teardown(head_crash_the_successor_numbers_on_and_dedups_resends,
                                        setup_chain123, teardown_world),
        cmocka_unit_test_setup_teardown(
            middle_crash_the_predecessor_resends_its_sent_list_once_each, setup_chain123,
            teardown_world),
        cmocka_unit_test_setup_teardown(
            head_stopped_between_fwd_and_apply_loses_nothing_applies_once, setup_chain123,
            teardown_world),
        cmocka_unit_test_setup_teardown(
            middle_stopped_between_fwd_and_apply_loses_nothing_applies_once, setup_chain123,
            teardown_world),
        cmocka_unit_test_setup_teardown(one_mark_of_n_applies_every_held_fwd_up_to_n_in_order,
                                        setup_chain123, teardown_world),
        cmocka_unit_test_setup_teardown(
            head_stopped_before_its_turns_mark_loses_nothing_acknowledged, setup_chain123,
            teardown_world),
        cmocka_unit_test_setup_teardown(a_new_tail_joins_by_state_transfer_and_misses_no_update,
                                        setup_chain12, teardown_world),
        cmocka_unit_test_setup_teardown(the_head_re_sends_only_once_acks_stop, setup_chain12,
                                        teardown_world),
        cmocka_unit_test_setup_teardown(waiting_at_the_successor_counts_from_the_last_progress,
                                        setup_chain12, teardown_world),
        cmocka_unit_test_setup_teardown(a_predecessor_behind_in_views_still_gets_its_fwds_through,
                                        setup_chain1, teardown_world),
        cmocka_unit_test_setup_teardown(
            older_fwds_of_a_removed_head_or_an_earlier_chain_stay_fenced, setup_chain123,
            teardown_world),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
