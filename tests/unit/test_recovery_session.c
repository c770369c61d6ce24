/* The worker's protocol (recovery/session.c) on its own: messages and ticks in, one ordered
 * output out, no sockets and no clock. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "core/wire.h"
#include "recovery/session.h"

#define TIMEOUT_MS 5000
#define UNAVAIL_MS 30000
#define RETRY_MS   50
#define JOIN_MS    60000
#define T0         1000000u /* far from 0, as a monotonic clock is */
#define ME         9u       /* our node id */

static const uint32_t HEAD_1[][CPS_MAX_REPLICAS + 1] = {{1, 2, 3}};
static const uint32_t HEAD_2[][CPS_MAX_REPLICAS + 1] = {{2, 3}};
/* Range 0 on server 1 alone, which the view says is dead (see view_bytes). */
static const uint32_t NO_REPLICA[][CPS_MAX_REPLICAS + 1] = {{1}};

/* The encoded view of epoch `epoch`: servers 1..3 and us; range 0 (every key) is on
 * chains[0]. The chain NO_REPLICA has server 1 dead in it. */
static size_t view_bytes(void *buf, size_t cap, uint64_t epoch, uint32_t mode,
                         const uint32_t chains[][CPS_MAX_REPLICAS + 1])
{
    cps__view v;
    cps__view_init(&v);
    v.epoch = epoch;
    v.mode = mode;
    v.replicas = 3;
    v.num_servers = 3;
    v.num_workers = 1;
    v.nnodes = 4;
    v.nodes = calloc(v.nnodes, sizeof *v.nodes);
    assert_non_null(v.nodes);
    for (uint32_t i = 0; i < v.nnodes; i++) {
        cps__node_info *n = &v.nodes[i];
        n->id = i < 3 ? i + 1 : ME;
        n->role = i < 3 ? CPS_ROLE_SERVER : CPS_ROLE_WORKER;
        n->alive = !(chains == NO_REPLICA && n->id == 1);
        snprintf(n->addr, sizeof n->addr, "tcp://127.0.0.1:%u", 3000 + i);
    }
    v.nranges = 1;
    v.ranges = calloc(1, sizeof *v.ranges);
    assert_non_null(v.ranges);
    v.ranges[0].hi = UINT64_MAX;
    for (uint32_t j = 0; chains[0][j]; j++)
        v.ranges[0].chain[v.ranges[0].chain_len++] = chains[0][j];
    size_t n = cps__view_encode(&v, buf, cap);
    assert_true(n > 0);
    cps__view_fini(&v);
    return n;
}

static cps__sess *make_sess(void)
{
    cps__sess_config cfg = {.request_timeout_ms = TIMEOUT_MS,
                            .unavailable_timeout_ms = UNAVAIL_MS,
                            .retry_ms = RETRY_MS,
                            .view_ask_min_ms = 200,
                            .hello_retry_ms = 500,
                            .join_timeout_ms = JOIN_MS,
                            .bye_wait_ms = 2000,
                            .dead_after_ms = 2000};
    cps__sess *s = NULL;
    assert_int_equal(cps__sess_create(&cfg, &s), 0);
    return s;
}

/* Actions of `kind` in the last output; *first (may be NULL) the first of them. */
static size_t count(const cps__sess *s, int kind, const cps__sess_action **first)
{
    const cps__sess_action *a = NULL;
    size_t n = cps__sess_output(s, &a), found = 0;
    for (size_t k = 0; k < n; k++) {
        if (a[k].kind != kind)
            continue;
        if (found++ == 0 && first)
            *first = &a[k];
    }
    return found;
}

/* The scheduler sends view `epoch` (a WELCOME naming us if `welcome`). */
static int view_in(cps__sess *s, uint64_t epoch, uint32_t mode,
                   const uint32_t chains[][CPS_MAX_REPLICAS + 1], int welcome, uint64_t now)
{
    char buf[4096];
    size_t n = view_bytes(buf, sizeof buf, epoch, mode, chains);
    cps__msg_hdr h = {.type = welcome ? CPS_MSG_WELCOME : CPS_MSG_VIEW,
                      .sender = 0,
                      .epoch = epoch,
                      .req_worker = welcome ? ME : 0};
    return cps__sess_step(s, &h, buf, n, now);
}

/* View `epoch` (HEAD_1's chains) with the scheduler's header `step`. */
static void view_step_in(cps__sess *s, uint64_t epoch, uint64_t step, uint64_t now)
{
    char buf[4096];
    size_t n = view_bytes(buf, sizeof buf, epoch, CPS_MODE_SYNC, HEAD_1);
    cps__msg_hdr h = {.type = CPS_MSG_VIEW, .sender = 0, .epoch = epoch, .step = step};
    assert_int_equal(cps__sess_step(s, &h, buf, n, now), 0);
}

/* A session that joined: HELLO out, WELCOME in. */
static cps__sess *joined(uint32_t mode, const uint32_t chains[][CPS_MAX_REPLICAS + 1])
{
    cps__sess *s = make_sess();
    const cps__sess_action *a = NULL;
    assert_int_equal(cps__sess_call(s, CPS_MSG_HELLO, "hi", 2, T0), 0);
    assert_int_equal(count(s, CPS_SS_SCHED, &a), 1);
    assert_int_equal(a->hdr.type, CPS_MSG_HELLO);
    int result = 1;
    assert_int_equal(cps__sess_call_done(s, &result), 0);
    assert_int_equal(view_in(s, 1, mode, chains, 1, T0 + 1), 0);
    assert_int_equal(cps__sess_id(s), ME);
    assert_int_equal(count(s, CPS_SS_PEER, NULL), 3); /* the servers, not us */
    assert_int_equal(cps__sess_call_done(s, &result), 1);
    assert_int_equal(result, 0);
    return s;
}

/* The last output holds exactly one SEND: check it and report it sent at `now`. */
static const cps__sess_action *expect_send(cps__sess *s, uint32_t to, uint64_t epoch, int why,
                                           uint64_t now)
{
    const cps__sess_action *a = NULL;
    assert_int_equal(count(s, CPS_SS_SEND, &a), 1);
    assert_int_equal(a->to, to);
    assert_int_equal(a->epoch, epoch);
    assert_int_equal(a->why, why);
    cps__sess_sent(s, a->index, 0, now);
    return a;
}

/* Report every SEND of the last output as sent at `now`; returns how many there were. */
static size_t sent_all(cps__sess *s, uint64_t now)
{
    const cps__sess_action *a;
    size_t n = cps__sess_output(s, &a), sends = 0;
    for (size_t k = 0; k < n; k++)
        if (a[k].kind == CPS_SS_SEND) {
            cps__sess_sent(s, a[k].index, 0, now);
            sends++;
        }
    return sends;
}

static int reply(cps__sess *s, uint8_t type, uint32_t from, uint64_t epoch, uint64_t seq,
                 int status, uint16_t flags, uint64_t aux, uint64_t now)
{
    cps__msg_hdr h = {.type = type,
                      .flags = (uint16_t)(flags | CPS_WF_REPLY),
                      .sender = from,
                      .status = status,
                      .epoch = epoch,
                      .req_worker = ME,
                      .range = 0,
                      .req_seq = seq,
                      .aux = aux};
    return cps__sess_step(s, &h, "no", type == CPS_MSG_ERROR ? 2 : 0, now);
}

static void start_op(cps__sess *s, cps__sess_op *op, int kind, cps__sess_clock *clock, uint64_t now)
{
    memset(op, 0, sizeof *op);
    op->kind = kind;
    op->nparts = 1;
    cps__sess_begin(s, op, clock, 1);
    assert_int_equal(cps__sess_add(s, op, 0, 0, 0x1234, now), 0);
}

/* A push sent under view 1 goes out again to the new head when view 2 moves the range; the
 * old head's answer (produced under epoch 1) is not taken, the new head's is; a duplicate of it
 * afterwards changes nothing. */
static void test_resend_after_view_change(void **state)
{
    (void)state;
    cps__sess *s = joined(CPS_MODE_ASYNC, HEAD_1);
    cps__sess_op op;
    start_op(s, &op, CPS_SS_PUSH, NULL, T0 + 10);
    const cps__sess_action *a = expect_send(s, 1, 1, CPS_RQ_WHY_NEW, T0 + 10);
    uint64_t seq = a->seq;
    assert_int_equal(seq, 1); /* the first push on the range */
    assert_int_equal(op.pending, 1);

    assert_int_equal(view_in(s, 2, CPS_MODE_ASYNC, HEAD_2, 0, T0 + 20), 0);
    assert_int_equal(count(s, CPS_SS_VIEW, &a), 1);
    assert_int_equal(a->epoch, 2);
    assert_int_equal(a->count, 1);
    a = expect_send(s, 2, 2, CPS_RQ_WHY_VIEW, T0 + 20);
    assert_int_equal(a->seq, seq);

    /* The old head answers from the configuration the request left: dropped. */
    assert_int_equal(reply(s, CPS_MSG_ACK, 1, 1, seq, 0, 0, 0, T0 + 30), 0);
    assert_int_equal(count(s, CPS_SS_ANSWER, NULL), 0);
    assert_int_equal(op.pending, 1);

    assert_int_equal(reply(s, CPS_MSG_ACK, 2, 2, seq, 0, 0, 0, T0 + 40), 0);
    assert_int_equal(count(s, CPS_SS_ANSWER, &a), 1);
    assert_ptr_equal(a->op, &op);
    assert_int_equal(count(s, CPS_SS_DONE, NULL), 1);
    assert_int_equal(op.pending, 0);
    assert_int_equal(op.result, 0);
    assert_int_equal(cps__sess_pending(s), 0);

    /* A duplicate, late answer: nothing to do, nothing changes. */
    assert_int_equal(reply(s, CPS_MSG_ACK, 2, 2, seq, 0, 0, 0, T0 + 50), 0);
    const cps__sess_action *all;
    assert_int_equal(cps__sess_output(s, &all), 0);
    assert_int_equal(op.pending, 0);
    cps__sess_destroy(s);
}

/* A refusal for a stale epoch parks the request and asks for the view: it goes out again
 * retry_ms later, or at once when the view comes. */
static void test_parking_and_release(void **state)
{
    (void)state;
    cps__sess *s = joined(CPS_MODE_ASYNC, HEAD_1);
    cps__sess_op op;
    start_op(s, &op, CPS_SS_PULL, NULL, T0 + 10);
    const cps__sess_action *a = expect_send(s, 3, 1, CPS_RQ_WHY_NEW, T0 + 10); /* the tail */
    uint64_t seq = a->seq;
    assert_true(seq & CPS_SEQ_OTHER);

    assert_int_equal(reply(s, CPS_MSG_ERROR, 3, 1, seq, CPS_ESTALE_EPOCH, 0, 0, T0 + 20), 0);
    assert_int_equal(count(s, CPS_SS_ANSWER, NULL) + count(s, CPS_SS_REFUSED, NULL), 0);
    assert_int_equal(count(s, CPS_SS_SCHED, &a), 1);
    assert_int_equal(a->hdr.type, CPS_MSG_GET_VIEW);
    assert_int_equal(op.pending, 1);

    /* Parked: not before retry_ms... */
    cps__sess_tick(s, T0 + 20 + RETRY_MS - 1);
    assert_int_equal(count(s, CPS_SS_SEND, NULL), 0);
    /* ...then out again under the view we have. */
    cps__sess_tick(s, T0 + 20 + RETRY_MS);
    expect_send(s, 3, 1, CPS_RQ_WHY_TIMEOUT, T0 + 20 + RETRY_MS);

    /* Refused again; this time the view comes first and releases it at once. */
    assert_int_equal(reply(s, CPS_MSG_ERROR, 3, 1, seq, CPS_EAGAIN, 0, 0, T0 + 100), 0);
    assert_int_equal(view_in(s, 2, CPS_MODE_ASYNC, HEAD_2, 0, T0 + 101), 0);
    expect_send(s, 3, 2, CPS_RQ_WHY_VIEW, T0 + 101);
    assert_int_equal(reply(s, CPS_MSG_VALUES, 3, 2, seq, 0, 0, 0, T0 + 110), 0);
    assert_int_equal(count(s, CPS_SS_ANSWER, &a), 1);
    assert_int_equal(a->type, CPS_MSG_VALUES);
    assert_int_equal(op.pending, 0);
    cps__sess_destroy(s);
}

/* While no view names a replica for the range, requests wait; a view that names a head
 * releases them. */
static void test_parked_without_head_released_by_view(void **state)
{
    (void)state;
    cps__sess *s = joined(CPS_MODE_ASYNC, NO_REPLICA);
    cps__sess_op op;
    start_op(s, &op, CPS_SS_PUSH, NULL, T0 + 10);
    expect_send(s, 1, 1, CPS_RQ_WHY_NEW, T0 + 10); /* the dead head: all the view names */
    cps__sess_tick(s, T0 + 20);
    assert_int_equal(count(s, CPS_SS_WAIT_REPLICA, NULL), 1);
    assert_int_equal(count(s, CPS_SS_SEND, NULL), 0);
    assert_int_equal(view_in(s, 2, CPS_MODE_ASYNC, HEAD_2, 0, T0 + 30), 0);
    expect_send(s, 2, 2, CPS_RQ_WHY_VIEW, T0 + 30);
    assert_int_equal(op.pending, 1);
    cps__sess_destroy(s);
}

/* A range without a replica for the unavailable timeout: a pull fails with CPS_EUNAVAILABLE;
 * a push does too, yet is detached (its number must still reach the head) and its copy is
 * answered and released once a head comes back. */
static void test_give_up(void **state)
{
    (void)state;
    cps__sess *s = joined(CPS_MODE_ASYNC, NO_REPLICA);
    cps__sess_op pull, push, copy;
    start_op(s, &pull, CPS_SS_PULL, NULL, T0 + 10);
    assert_int_equal(sent_all(s, T0 + 10), 1);
    start_op(s, &push, CPS_SS_PUSH, NULL, T0 + 10);
    assert_int_equal(sent_all(s, T0 + 10), 1);
    cps__sess_tick(s, T0 + 20);
    assert_int_equal(count(s, CPS_SS_WAIT_REPLICA, NULL), 2);
    cps__sess_tick(s, T0 + 20 + UNAVAIL_MS);
    assert_int_equal(count(s, CPS_SS_GIVE_UP, NULL), 0); /* not more than the timeout yet */
    sent_all(s, T0 + 20 + UNAVAIL_MS);                   /* re-sent, to the dead head */
    cps__sess_tick(s, T0 + 21 + UNAVAIL_MS);
    const cps__sess_action *acts;
    size_t n = cps__sess_output(s, &acts);
    size_t gave = 0, done = 0;
    for (size_t k = 0; k < n; k++) {
        if (acts[k].kind == CPS_SS_GIVE_UP) {
            gave++;
            assert_int_equal(acts[k].status, CPS_EUNAVAILABLE);
            assert_int_equal(acts[k].detach, acts[k].op == &push);
            if (acts[k].detach) {
                memset(&copy, 0, sizeof copy);
                copy.kind = CPS_SS_PUSH;
                copy.nparts = 1;
                cps__sess_detach(s, acts[k].index, &copy, 0);
            }
        } else if (acts[k].kind == CPS_SS_DONE) {
            done++;
            assert_int_equal(acts[k].status, CPS_EUNAVAILABLE);
        }
    }
    assert_int_equal(gave, 2);
    assert_int_equal(done, 2);
    assert_int_equal(pull.pending, 0);
    assert_int_equal(pull.result, CPS_EUNAVAILABLE);
    assert_int_equal(push.result, CPS_EUNAVAILABLE);
    assert_int_equal(cps__sess_pending(s), 1);
    assert_int_equal(cps__sess_detached(s), 1);
    /* A leaving worker still gives the detached push its chance, but no call waits on it. */
    assert_false(cps__sess_settled(s));
    assert_int_equal(cps__sess_leave_result(s), 0);

    assert_int_equal(view_in(s, 2, CPS_MODE_ASYNC, HEAD_2, 0, T0 + 40000), 0);
    const cps__sess_action *a = expect_send(s, 2, 2, CPS_RQ_WHY_VIEW, T0 + 40000);
    assert_ptr_equal(a->op, &copy);
    assert_int_equal(reply(s, CPS_MSG_ACK, 2, 2, a->seq, 0, 0, 0, T0 + 40010), 0);
    assert_int_equal(count(s, CPS_SS_RELEASE, &a), 1);
    assert_ptr_equal(a->op, &copy);
    assert_int_equal(count(s, CPS_SS_DONE, NULL), 0); /* its caller had its answer */
    assert_int_equal(cps__sess_pending(s), 0);
    cps__sess_destroy(s);
}

/* A barrier waits for the others as long as the scheduler shows it lives; silent for the
 * longer of the unavailable timeout and three request timeouts, it is gone: CPS_ESCHEDULER. */
static void test_scheduler_gone(void **state)
{
    (void)state;
    cps__sess *s = joined(CPS_MODE_SYNC, HEAD_1);
    assert_int_equal(cps__sess_sched_gone_ms(s), UNAVAIL_MS); /* longer than 3 x TIMEOUT_MS */
    uint64_t t = T0 + 100;
    assert_int_equal(cps__sess_call(s, CPS_MSG_BARRIER, NULL, 0, t), 0);
    const cps__sess_action *a = NULL;
    assert_int_equal(count(s, CPS_SS_SCHED, &a), 2); /* the barrier, and a view request */
    assert_int_equal(a->hdr.type, CPS_MSG_BARRIER);
    assert_int_equal(a->hdr.epoch, 1);
    uint64_t barrier = a->hdr.req_seq;
    int result = 1;
    /* A view now and then keeps it waiting. */
    for (uint64_t at = t + 10000; at < t + 100000; at += 10000) {
        assert_int_equal(view_in(s, 1, CPS_MODE_SYNC, HEAD_1, 0, at), 0);
        cps__sess_tick(s, at);
        assert_int_equal(cps__sess_call_done(s, &result), 0);
    }
    /* Then nothing. */
    t += 90000;
    cps__sess_tick(s, t + UNAVAIL_MS);
    assert_int_equal(cps__sess_call_done(s, &result), 0);
    cps__sess_tick(s, t + UNAVAIL_MS + 1);
    assert_int_equal(cps__sess_call_done(s, &result), 1);
    assert_int_equal(result, CPS_ESCHEDULER);

    /* A barrier answered is over with 0; a stale release of an earlier one is not taken. */
    t += UNAVAIL_MS + 10;
    assert_int_equal(cps__sess_call(s, CPS_MSG_BARRIER, NULL, 0, t), 0);
    cps__msg_hdr h = {.type = CPS_MSG_BARRIER_DONE, .sender = 0, .epoch = 1, .req_seq = barrier};
    assert_int_equal(cps__sess_step(s, &h, NULL, 0, t + 1), 0);
    assert_int_equal(cps__sess_call_done(s, &result), 0);
    h.req_seq = barrier + 1;
    assert_int_equal(cps__sess_step(s, &h, NULL, 0, t + 2), 0);
    assert_int_equal(cps__sess_call_done(s, &result), 1);
    assert_int_equal(result, 0);
    cps__sess_destroy(s);
}

/* A replacement worker: its declarations find the job at steps 7 and 5; every tensor starts
 * after the highest, and each tensor's first push is flagged CPS_WF_FIRST, the next not. A push
 * answered late moves its tensor on to the step the job is on. */
static void test_replacement_first_push(void **state)
{
    (void)state;
    cps__sess *s = joined(CPS_MODE_SYNC, HEAD_1);
    cps__sess_clock ka, kb;
    uint64_t found[2] = {7, 5};
    cps__sess_clock *clocks[2] = {&ka, &kb};
    for (int i = 0; i < 2; i++) {
        cps__sess_op decl;
        start_op(s, &decl, CPS_SS_DECLARE, NULL, T0 + 10);
        const cps__sess_action *a = expect_send(s, 1, 1, CPS_RQ_WHY_NEW, T0 + 10);
        assert_int_equal(a->flags & CPS_WF_FIRST, 0);
        assert_int_equal(reply(s, CPS_MSG_ACK, 3, 1, a->seq, 0, 0, found[i], T0 + 20), 0);
        assert_int_equal(decl.pending, 0);
        assert_int_equal(decl.step, found[i]);
        cps__sess_clock_add(s, clocks[i], decl.step);
    }
    assert_int_equal(cps__sess_start_step(s), 7);
    assert_int_equal(ka.step, 7);
    assert_int_equal(kb.step, 7); /* aligned with the highest */

    cps__sess_op push;
    start_op(s, &push, CPS_SS_PUSH, &kb, T0 + 30);
    const cps__sess_action *a = expect_send(s, 1, 1, CPS_RQ_WHY_NEW, T0 + 30);
    assert_int_equal(a->step, 8);
    assert_true(a->flags & CPS_WF_FIRST);
    uint64_t seq = a->seq;
    /* Its re-send carries the flag too: the head must learn it whichever send arrives. */
    assert_int_equal(view_in(s, 2, CPS_MODE_SYNC, HEAD_2, 0, T0 + 40), 0);
    a = expect_send(s, 2, 2, CPS_RQ_WHY_VIEW, T0 + 40);
    assert_true(a->flags & CPS_WF_FIRST);
    assert_int_equal(reply(s, CPS_MSG_ACK, 3, 2, seq, 0, CPS_WF_LATE, 12, T0 + 50), 0);
    assert_int_equal(count(s, CPS_SS_ANSWER, &a), 1);
    assert_true(a->late);
    assert_int_equal(kb.step, 12);

    start_op(s, &push, CPS_SS_PUSH, &kb, T0 + 60);
    a = expect_send(s, 2, 2, CPS_RQ_WHY_NEW, T0 + 60);
    assert_int_equal(a->step, 13);
    assert_int_equal(a->flags & CPS_WF_FIRST, 0);
    assert_int_equal(a->seq, seq + 1); /* dense per range */
    cps__sess_destroy(s);
}

/* The scheduler's word that the workers not live in a view finished (CPS_VIEW_WORKERS_SETTLED):
 * taken with the view it came on; a copy of the same epoch without it (sent before a worker's
 * goodbye, arriving late) does not take it back, a newer view does; an older view's is
 * ignored. Without the bit (a scheduler that predates it) it is never set. */
static void test_workers_settled_comes_with_the_view(void **state)
{
    (void)state;
    cps__sess *s = joined(CPS_MODE_SYNC, HEAD_1);
    assert_int_equal(cps__sess_workers_settled(s), 0); /* the WELCOME had no word */
    view_step_in(s, 2, CPS_VIEW_WORKERS_SETTLED, T0 + 10);
    assert_int_equal(cps__sess_workers_settled(s), 1);
    view_step_in(s, 2, 0, T0 + 20);
    assert_int_equal(cps__sess_workers_settled(s), 1);
    view_step_in(s, 1, 0, T0 + 30);
    assert_int_equal(cps__sess_workers_settled(s), 1);
    view_step_in(s, 3, 0, T0 + 40); /* a death: a rank awaits its replacement */
    assert_int_equal(cps__sess_workers_settled(s), 0);
    view_step_in(s, 2, CPS_VIEW_WORKERS_SETTLED, T0 + 50); /* older: not ours */
    assert_int_equal(cps__sess_workers_settled(s), 0);
    view_step_in(s, 3, CPS_VIEW_WORKERS_SETTLED, T0 + 60); /* the goodbye, same epoch */
    assert_int_equal(cps__sess_workers_settled(s), 1);
    cps__sess_destroy(s);
}

/* A view installed without its header (cps__sess_view_in: the shell's, from a peer's copy) has
 * no settled word: the word of the older epoch held before it says nothing about it. */
static void test_workers_settled_not_kept_by_a_newer_view(void **state)
{
    (void)state;
    cps__sess *s = joined(CPS_MODE_SYNC, HEAD_1);
    view_step_in(s, 2, CPS_VIEW_WORKERS_SETTLED, T0 + 10);
    assert_int_equal(cps__sess_workers_settled(s), 1);
    char buf[4096];
    size_t n = view_bytes(buf, sizeof buf, 3, CPS_MODE_SYNC, HEAD_1);
    cps__view v;
    cps__view_init(&v);
    assert_int_equal(cps__view_decode(buf, n, &v), 0);
    assert_int_equal(cps__sess_view_in(s, 0, &v, T0 + 20), 0);
    cps__view_fini(&v);
    assert_int_equal(cps__sess_view(s)->epoch, 3);
    assert_int_equal(cps__sess_workers_settled(s), 0);
    /* The scheduler's own copy of epoch 3 brings the word back. */
    view_step_in(s, 3, CPS_VIEW_WORKERS_SETTLED, T0 + 30);
    assert_int_equal(cps__sess_workers_settled(s), 1);
    cps__sess_destroy(s);
}

/* A server's refusal fails the part with its error; the scheduler's untagged refusal ends the
 * job for us, and the call in progress with it. */
static void test_refused_and_expelled(void **state)
{
    (void)state;
    cps__sess *s = joined(CPS_MODE_ASYNC, HEAD_1);
    cps__sess_op op;
    start_op(s, &op, CPS_SS_PUSH, NULL, T0 + 10);
    const cps__sess_action *a = expect_send(s, 1, 1, CPS_RQ_WHY_NEW, T0 + 10);
    assert_int_equal(reply(s, CPS_MSG_ERROR, 1, 1, a->seq, CPS_ESIZE, 0, 0, T0 + 20), 0);
    assert_int_equal(count(s, CPS_SS_REFUSED, &a), 1);
    assert_int_equal(a->status, CPS_ESIZE);
    assert_int_equal(a->len, 2);
    assert_int_equal(count(s, CPS_SS_DONE, NULL), 1);
    assert_int_equal(op.result, CPS_ESIZE);

    assert_int_equal(cps__sess_call(s, CPS_MSG_REGISTER, "d", 1, T0 + 30), 0);
    cps__msg_hdr h = {.type = CPS_MSG_ERROR, .sender = 0, .status = CPS_ESHUTDOWN};
    assert_int_equal(cps__sess_step(s, &h, "the job has ended", 17, T0 + 40), 0);
    assert_int_equal(count(s, CPS_SS_EXPELLED, NULL), 1);
    assert_true(cps__sess_shutdown(s));
    int result = 0;
    assert_int_equal(cps__sess_call_done(s, &result), 1);
    assert_int_equal(result, CPS_ESHUTDOWN);
    cps__sess_destroy(s);
}

/* Joining: HELLO goes out again every hello_retry_ms; without a WELCOME for the join timeout
 * the call fails with CPS_ETIMEDOUT. A view that is not our WELCOME does not end it. */
static void test_join_timeout(void **state)
{
    (void)state;
    cps__sess *s = make_sess();
    assert_int_equal(cps__sess_call(s, CPS_MSG_HELLO, "hi", 2, T0), 0);
    assert_int_equal(cps__sess_call(s, CPS_MSG_BARRIER, NULL, 0, T0), CPS_EBUSY);
    cps__sess_tick(s, T0 + 499);
    assert_int_equal(count(s, CPS_SS_SCHED, NULL), 0);
    cps__sess_tick(s, T0 + 500);
    assert_int_equal(count(s, CPS_SS_SCHED, NULL), 1);
    assert_int_equal(view_in(s, 1, CPS_MODE_ASYNC, HEAD_1, 0, T0 + 600), 0);
    int result = 0;
    assert_int_equal(cps__sess_call_done(s, &result), 0);
    cps__sess_tick(s, T0 + JOIN_MS + 1);
    assert_int_equal(cps__sess_call_done(s, &result), 1);
    assert_int_equal(result, CPS_ETIMEDOUT);
    cps__sess_destroy(s);
}

/* The join ends with our WELCOME only if its view lists us as a worker: a WELCOME naming an id
 * the view gives a server (or does not hold) is a protocol error, not a place to train. */
static void test_welcome_must_list_us_as_a_worker(void **state)
{
    (void)state;
    const uint32_t ids[] = {2, 77};
    for (int i = 0; i < 2; i++) {
        cps__sess *s = make_sess();
        assert_int_equal(cps__sess_call(s, CPS_MSG_HELLO, "hi", 2, T0), 0);
        char buf[4096];
        size_t n = view_bytes(buf, sizeof buf, 1, CPS_MODE_ASYNC, HEAD_1);
        cps__msg_hdr h = {.type = CPS_MSG_WELCOME, .sender = 0, .epoch = 1, .req_worker = ids[i]};
        assert_int_equal(cps__sess_step(s, &h, buf, n, T0 + 1), 0);
        int result = 0;
        assert_int_equal(cps__sess_call_done(s, &result), 1);
        assert_int_equal(result, CPS_EPROTO);
        cps__sess_destroy(s);
    }
    cps__sess *s = joined(CPS_MODE_ASYNC, HEAD_1);
    assert_int_equal(cps__sess_rank(s), 0);
    cps__sess_destroy(s);
}

/* A caller waits until its op is answered, or until the job is over for us (then nothing will
 * answer: CPS_ESHUTDOWN); a leaving worker waits for requests in flight until the job ends, and
 * leaves with CPS_ETIMEDOUT if a call's request is still unanswered. */
static void test_waiting_ends_on_answer_or_shutdown(void **state)
{
    (void)state;
    cps__sess *s = joined(CPS_MODE_ASYNC, HEAD_1);
    assert_true(cps__sess_settled(s));
    assert_int_equal(cps__sess_leave_result(s), 0);
    cps__sess_op a, b;
    start_op(s, &a, CPS_SS_PUSH, NULL, T0 + 10);
    const cps__sess_action *sa = expect_send(s, 1, 1, CPS_RQ_WHY_NEW, T0 + 10);
    uint64_t seq_a = sa->seq;
    start_op(s, &b, CPS_SS_PUSH, NULL, T0 + 10);
    expect_send(s, 1, 1, CPS_RQ_WHY_NEW, T0 + 10);
    int result = 1;
    assert_int_equal(cps__sess_op_over(s, &a, &result), 0);
    assert_false(cps__sess_settled(s));
    assert_int_equal(cps__sess_leave_result(s), CPS_ETIMEDOUT);
    assert_int_equal(reply(s, CPS_MSG_ACK, 1, 1, seq_a, 0, 0, 0, T0 + 20), 0);
    assert_int_equal(cps__sess_op_over(s, &a, &result), 1);
    assert_int_equal(result, 0);
    assert_int_equal(cps__sess_op_over(s, &b, &result), 0);
    cps__msg_hdr h = {.type = CPS_MSG_SHUTDOWN, .sender = 0, .epoch = 1};
    assert_int_equal(cps__sess_step(s, &h, NULL, 0, T0 + 30), 0);
    assert_int_equal(cps__sess_op_over(s, &b, &result), 1);
    assert_int_equal(result, CPS_ESHUTDOWN);
    assert_true(cps__sess_settled(s));
    assert_int_equal(cps__sess_leave_result(s), CPS_ETIMEDOUT); /* b's request never answered */
    /* An answered op keeps its own result even after the end. */
    assert_int_equal(cps__sess_op_over(s, &a, &result), 1);
    assert_int_equal(result, 0);
    cps__sess_destroy(s);
}

/* The job ends while a pull is in the table: its call returns CPS_ESHUTDOWN, and its buffer
 * and the op are the caller's again. A VALUES answer arriving afterwards (cps_close still runs
 * the loop) is no copy's target and no ANSWER, and no timer re-sends or gives up the request. */
static void test_no_answer_after_shutdown(void **state)
{
    (void)state;
    cps__sess *s = joined(CPS_MODE_ASYNC, HEAD_1);
    cps__sess_op op;
    start_op(s, &op, CPS_SS_PULL, NULL, T0 + 10);
    const cps__sess_action *a = expect_send(s, 3, 1, CPS_RQ_WHY_NEW, T0 + 10); /* the tail */
    uint64_t seq = a->seq;
    cps__msg_hdr vh = {.type = CPS_MSG_VALUES,
                       .flags = CPS_WF_REPLY,
                       .sender = 3,
                       .epoch = 1,
                       .req_worker = ME,
                       .range = 0,
                       .req_seq = seq};
    cps__sess_op *target = NULL;
    uint32_t part = 9;
    assert_int_equal(cps__sess_values_target(s, &vh, &target, &part), 1);
    assert_ptr_equal(target, &op);
    assert_int_equal(part, 0);

    cps__msg_hdr h = {.type = CPS_MSG_SHUTDOWN, .sender = 0, .epoch = 1};
    assert_int_equal(cps__sess_step(s, &h, NULL, 0, T0 + 20), 0);
    int result = 0;
    assert_int_equal(cps__sess_op_over(s, &op, &result), 1);
    assert_int_equal(result, CPS_ESHUTDOWN);

    assert_int_equal(cps__sess_values_target(s, &vh, &target, &part), 0);
    assert_int_equal(cps__sess_step(s, &vh, NULL, 0, T0 + 30), 0);
    assert_int_equal(count(s, CPS_SS_ANSWER, NULL), 0);
    assert_int_equal(count(s, CPS_SS_DONE, NULL), 0);
    assert_int_equal(op.pending, 1); /* the op was not touched */
    cps__sess_tick(s, T0 + 30 + UNAVAIL_MS + 10 * TIMEOUT_MS);
    assert_int_equal(count(s, CPS_SS_SEND, NULL), 0);
    assert_int_equal(count(s, CPS_SS_GIVE_UP, NULL), 0);
    /* A view after the end (the others leaving) sends nothing again, and nothing new is added. */
    assert_int_equal(view_in(s, 2, CPS_MODE_ASYNC, HEAD_2, 0, T0 + 40), 0);
    assert_int_equal(count(s, CPS_SS_SEND, NULL), 0);
    cps__sess_op late;
    memset(&late, 0, sizeof late);
    late.kind = CPS_SS_PUSH;
    late.nparts = 1;
    cps__sess_begin(s, &late, NULL, 1);
    assert_int_equal(cps__sess_add(s, &late, 0, 0, 0x1234, T0 + 50), CPS_ESHUTDOWN);
    assert_int_equal(count(s, CPS_SS_SEND, NULL), 0);
    cps__sess_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resend_after_view_change),
        cmocka_unit_test(test_parking_and_release),
        cmocka_unit_test(test_parked_without_head_released_by_view),
        cmocka_unit_test(test_give_up),
        cmocka_unit_test(test_scheduler_gone),
        cmocka_unit_test(test_replacement_first_push),
        cmocka_unit_test(test_refused_and_expelled),
        cmocka_unit_test(test_join_timeout),
        cmocka_unit_test(test_welcome_must_list_us_as_a_worker),
        cmocka_unit_test(test_waiting_ends_on_answer_or_shutdown),
        cmocka_unit_test(test_no_answer_after_shutdown),
        cmocka_unit_test(test_workers_settled_comes_with_the_view),
        cmocka_unit_test(test_workers_settled_not_kept_by_a_newer_view),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
