/* The worker's request table (recovery/requests.c) on its own: events in, actions out, no
 * sockets and no clock. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "core/wire.h"
#include "recovery/requests.h"

#define TIMEOUT_MS 5000
#define UNAVAIL_MS 30000
#define RETRY_MS   50
#define T0         1000000u /* far from 0, as a monotonic clock is */

/* Servers 1..3, one worker (9); range r's chain is chains[r] (0-terminated). */
static void make_view(cps__view *v, uint64_t epoch, uint32_t nranges,
                      const uint32_t chains[][CPS_MAX_REPLICAS + 1])
{
    cps__view_init(v);
    v->epoch = epoch;
    v->replicas = 3;
    v->num_servers = 3;
    v->num_workers = 1;
    v->nnodes = 4;
    v->nodes = calloc(v->nnodes, sizeof *v->nodes);
    assert_non_null(v->nodes);
    for (uint32_t i = 0; i < v->nnodes; i++) {
        cps__node_info *n = &v->nodes[i];
        n->id = i < 3 ? i + 1 : 9;
        n->role = i < 3 ? CPS_ROLE_SERVER : CPS_ROLE_WORKER;
        n->alive = 1;
        snprintf(n->addr, sizeof n->addr, "tcp://127.0.0.1:%u", 3000 + i);
    }
    v->nranges = nranges;
    v->ranges = calloc(nranges, sizeof *v->ranges);
    assert_non_null(v->ranges);
    for (uint32_t r = 0; r < nranges; r++)
        for (uint32_t j = 0; chains[r][j]; j++)
            v->ranges[r].chain[v->ranges[r].chain_len++] = chains[r][j];
}

static const uint32_t ONE_RANGE[][CPS_MAX_REPLICAS + 1] = {{1, 2, 3}};
static const uint32_t ONE_RANGE_MOVED[][CPS_MAX_REPLICAS + 1] = {{2, 3}};
static const uint32_t TWO_RANGES[][CPS_MAX_REPLICAS + 1] = {{1}, {2, 3}};

static cps__reqs *make_reqs(void)
{
    cps__reqs_config cfg = {TIMEOUT_MS, UNAVAIL_MS, RETRY_MS};
    cps__reqs *rq = NULL;
    assert_int_equal(cps__reqs_create(&cfg, &rq), 0);
    return rq;
}

static size_t actions(cps__reqs *rq, const cps__reqs_action **a)
{
    return cps__reqs_actions(rq, a);
}

/* The last call handed back exactly one SEND, of seq to node `to` under `epoch`, after
 * `attempt` earlier sends; it is reported sent at `now`. */
static void expect_send(cps__reqs *rq, uint64_t seq, uint32_t to, uint64_t epoch, uint32_t attempt,
                        int why, uint64_t now)
{
    const cps__reqs_action *a;
    size_t n = actions(rq, &a), k, sends = 0, at = 0;
    for (k = 0; k < n; k++)
        if (a[k].kind == CPS_RQ_SEND)
            sends++, at = k;
    assert_int_equal(sends, 1);
    assert_int_equal(a[at].seq, seq);
    assert_int_equal(a[at].to, to);
    assert_int_equal(a[at].epoch, epoch);
    assert_int_equal(a[at].attempt, attempt);
    assert_int_equal(a[at].why, why);
    cps__reqs_sent(rq, a[at].index, 0, now);
}

static int has_action(cps__reqs *rq, int kind)
{
    const cps__reqs_action *a;
    size_t n = actions(rq, &a);
    for (size_t k = 0; k < n; k++)
        if (a[k].kind == kind)
            return 1;
    return 0;
}

static int reply(cps__reqs *rq, const cps__view *v, uint8_t type, uint64_t seq, uint64_t epoch,
                 int status, uint64_t now, cps__reqs_done *d)
{
    cps__reqs_reply_in in = {type, 0, seq, epoch, status};
    return cps__reqs_reply(rq, v, &in, now, d);
}

static int ctx_a, ctx_b;

/* Most tests: view 5 with range 0 on 1 -> 2 -> 3, view 6 with it on 2 -> 3, an empty table. */
typedef struct fixture {
    cps__view v5, v6;
    cps__reqs *rq;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    make_view(&f->v5, 5, 1, ONE_RANGE);
    make_view(&f->v6, 6, 1, ONE_RANGE_MOVED);
    f->rq = make_reqs();
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    cps__reqs_destroy(f->rq);
    cps__view_fini(&f->v5);
    cps__view_fini(&f->v6);
    free(f);
    return 0;
}

static void config_is_checked(void **state)
{
    (void)state;
    cps__reqs *rq = NULL;
    cps__reqs_config cfg = {TIMEOUT_MS, UNAVAIL_MS, RETRY_MS};
    assert_int_equal(cps__reqs_create(NULL, &rq), CPS_EINVAL);
    assert_int_equal(cps__reqs_create(&cfg, NULL), CPS_EINVAL);
    assert_null(rq);
    cps__reqs_destroy(NULL);
    assert_int_equal(cps__reqs_count(NULL), 0);
}

/* Updates go to the head of the chain, reads to its tail, under the view's epoch. */
static void updates_go_to_the_head_reads_to_the_tail(void **state)
{
    fixture *f = *state;
    cps__reqs *rq = f->rq;
    const cps__view *v = &f->v5;
    assert_int_equal(cps__reqs_add(rq, v, &ctx_a, 0, CPS_MSG_PUSH, 0, 1, T0), 0);
    expect_send(rq, 1, 1, 5, 0, CPS_RQ_WHY_NEW, T0);
    assert_int_equal(cps__reqs_add(rq, v, &ctx_b, 3, CPS_MSG_PULL, 0, 2, T0), 0);
    expect_send(rq, 2, 3, 5, 0, CPS_RQ_WHY_NEW, T0);
    const cps__reqs_action *a;
    actions(rq, &a);
    assert_ptr_equal(a[0].ctx, &ctx_b);
    assert_int_equal(a[0].part, 3);
    assert_int_equal(cps__reqs_count(rq), 2);
}

/* A reply produced under another epoch than the request was last sent under is not taken: the
 * request went out again under the current view, and only that one's answer completes it. */
static void reply_of_another_epoch_is_dropped_and_resent_under_current_view(void **state)
{
    fixture *f = *state;
    cps__reqs *rq = f->rq;
    const cps__view *v5 = &f->v5, *v6 = &f->v6;
    assert_int_equal(cps__reqs_add(rq, v5, &ctx_a, 0, CPS_MSG_PUSH, 0, 1, T0), 0);
    expect_send(rq, 1, 1, 5, 0, CPS_RQ_WHY_NEW, T0);
    cps__reqs_view(rq, v6, T0 + 10);
    expect_send(rq, 1, 2, 6, 1, CPS_RQ_WHY_VIEW, T0 + 10);

    cps__reqs_done d;
    assert_int_equal(reply(rq, v6, CPS_MSG_ACK, 1, 5, 0, T0 + 20, &d), CPS_RQ_REPLY_OTHER_EPOCH);
    assert_int_equal(d.sent_epoch, 6);
    const cps__reqs_action *a;
    assert_int_equal(actions(rq, &a), 0); /* the answer to the send under 6 is coming */
    assert_int_equal(cps__reqs_count(rq), 1);
    assert_int_equal(reply(rq, v6, CPS_MSG_VALUES, 1, 5, 0, T0 + 21, &d), CPS_RQ_REPLY_OTHER_EPOCH);
    assert_int_equal(cps__reqs_count(rq), 1);

    assert_int_equal(reply(rq, v6, CPS_MSG_ACK, 1, 6, 0, T0 + 30, &d), CPS_RQ_REPLY_TAKEN);
    assert_ptr_equal(d.ctx, &ctx_a);
    assert_int_equal(d.part, 0);
    assert_int_equal(cps__reqs_count(rq), 0);
}

/* A reply under a newer epoch than ours is not taken either: we ask for that view, and
 * installing it sends the request again. */
static void newer_epoch_reply_asks_for_the_view(void **state)
{
    fixture *f = *state;
    cps__reqs *rq = f->rq;
    const cps__view *v5 = &f->v5, *v6 = &f->v6;
    assert_int_equal(cps__reqs_add(rq, v5, &ctx_a, 0, CPS_MSG_PULL, 0, 7, T0), 0);
    expect_send(rq, 7, 3, 5, 0, CPS_RQ_WHY_NEW, T0);
    assert_int_equal(reply(rq, v5, CPS_MSG_VALUES, 7, 6, 0, T0 + 5, NULL),
                     CPS_RQ_REPLY_OTHER_EPOCH);
    const cps__reqs_action *a;
    assert_int_equal(actions(rq, &a), 1);
    assert_int_equal(a[0].kind, CPS_RQ_ASK_VIEW);
    /* Nothing goes out before the view or the timeout. */
    cps__reqs_tick(rq, v5, T0 + 100);
    assert_int_equal(actions(rq, &a), 0);
    cps__reqs_view(rq, v6, T0 + 200);
    expect_send(rq, 7, 3, 6, 1, CPS_RQ_WHY_VIEW, T0 + 200);
    assert_int_equal(reply(rq, v6, CPS_MSG_VALUES, 7, 6, 0, T0 + 210, NULL), CPS_RQ_REPLY_TAKEN);
}

/* Once a server answered under a newer epoch, a pull is not sent to the tail of an older view
 * (a removed tail may lack acknowledged writes); a reply under that newer epoch to an earlier
 * send of it makes the next tick try again at once. */
static void pull_waits_for_a_view_as_new_as_any_seen(void **state)
{
    fixture *f = *state;
    cps__reqs *rq = f->rq;
    const cps__view *v5 = &f->v5, *v6 = &f->v6;
    cps__view v7;
    make_view(&v7, 7, 1, ONE_RANGE);
    assert_int_equal(cps__reqs_add(rq, v5, &ctx_a, 0, CPS_MSG_PULL, 0, 1, T0), 0);
    expect_send(rq, 1, 3, 5, 0, CPS_RQ_WHY_NEW, T0);
    cps__reqs_epoch_seen(rq, 7);
    cps__reqs_epoch_seen(rq, 4); /* the highest is kept */
    cps__reqs_view(rq, v6, T0 + 10);
    assert_false(has_action(rq, CPS_RQ_SEND));
    assert_true(has_action(rq, CPS_RQ_ASK_VIEW));
    /* A push is not held back: the head orders it under any epoch. */
    assert_int_equal(cps__reqs_add(rq, v6, &ctx_b, 0, CPS_MSG_PUSH, 0, 2, T0 + 10), 0);
    expect_send(rq, 2, 2, 6, 0, CPS_RQ_WHY_NEW, T0 + 10);

    assert_int_equal(reply(rq, v6, CPS_MSG_VALUES, 1, 6, 0, T0 + 20, NULL),
                     CPS_RQ_REPLY_OTHER_EPOCH);
    cps__reqs_tick(rq, v6, T0 + 20);
    assert_true(has_action(rq, CPS_RQ_ASK_VIEW));
    assert_false(has_action(rq, CPS_RQ_SEND)); /* still no view 7 */
    cps__reqs_view(rq, &v7, T0 + 30);
    const cps__reqs_action *a;
    assert_int_equal(actions(rq, &a), 2);
    assert_int_equal(a[0].kind, CPS_RQ_SEND);
    assert_int_equal(a[0].seq, 1);
    assert_int_equal(a[0].to, 3);
    assert_int_equal(a[0].epoch, 7);
    cps__view_fini(&v7);
}

/* CPS_ESTALE_EPOCH from a server with a newer view: the request is parked (no re-send), a view
 * is asked for, and the view's arrival sends it under that view. Left waiting, it is tried
 * again retry_ms later under the view we have. */
static void stale_epoch_parks_until_a_newer_view(void **state)
{
    fixture *f = *state;
    cps__reqs *rq = f->rq;
    const cps__view *v5 = &f->v5, *v6 = &f->v6;
    assert_int_equal(cps__reqs_add(rq, v5, &ctx_a, 0, CPS_MSG_PUSH, 0, 1, T0), 0);
    expect_send(rq, 1, 1, 5, 0, CPS_RQ_WHY_NEW, T0);
    assert_int_equal(reply(rq, v5, CPS_MSG_ERROR, 1, 6, CPS_ESTALE_EPOCH, T0 + 100, NULL),
                     CPS_RQ_REPLY_RETRY);
    const cps__reqs_action *a;
    assert_int_equal(actions(rq, &a), 1);
    assert_int_equal(a[0].kind, CPS_RQ_ASK_VIEW);
    assert_int_equal(cps__reqs_count(rq), 1);
    cps__reqs_tick(rq, v5, T0 + 100 + RETRY_MS - 1);
    assert_int_equal(actions(rq, &a), 0);
    cps__reqs_view(rq, v6, T0 + 120);
    expect_send(rq, 1, 2, 6, 1, CPS_RQ_WHY_VIEW, T0 + 120);
    assert_int_equal(reply(rq, v6, CPS_MSG_ACK, 1, 6, 0, T0 + 130, NULL), CPS_RQ_REPLY_TAKEN);

    /* No view comes: tried again after retry_ms, and refused again until one does. */
    assert_int_equal(cps__reqs_add(rq, v5, &ctx_a, 0, CPS_MSG_PUSH, 0, 2, T0), 0);
    expect_send(rq, 2, 1, 5, 0, CPS_RQ_WHY_NEW, T0);
    assert_int_equal(reply(rq, v5, CPS_MSG_ERROR, 2, 6, CPS_EAGAIN, T0 + 100, NULL),
                     CPS_RQ_REPLY_RETRY);
    cps__reqs_tick(rq, v5, T0 + 100 + RETRY_MS);
    assert_true(has_action(rq, CPS_RQ_ASK_VIEW));
    expect_send(rq, 2, 1, 5, 1, CPS_RQ_WHY_TIMEOUT, T0 + 100 + RETRY_MS);
}

/* An unanswered request asks for a view and goes out again after the request timeout, under
 * the view we have; a first send that failed is retried the same way. */
static void timeout_resends(void **state)
{
    fixture *f = *state;
    cps__reqs *rq = f->rq;
    const cps__view *v = &f->v5;
    assert_int_equal(cps__reqs_add(rq, v, &ctx_a, 0, CPS_MSG_PUSH, 0, 1, T0), 0);
    expect_send(rq, 1, 1, 5, 0, CPS_RQ_WHY_NEW, T0);
    const cps__reqs_action *a;
    cps__reqs_tick(rq, v, T0 + TIMEOUT_MS - 1);
    assert_int_equal(actions(rq, &a), 0);
    cps__reqs_tick(rq, v, T0 + TIMEOUT_MS);
    assert_int_equal(actions(rq, &a), 2);
    assert_int_equal(a[0].kind, CPS_RQ_ASK_VIEW);
    expect_send(rq, 1, 1, 5, 1, CPS_RQ_WHY_TIMEOUT, T0 + TIMEOUT_MS);
    cps__reqs_tick(rq, v, T0 + 2 * TIMEOUT_MS - 1);
    assert_int_equal(actions(rq, &a), 0);

    /* The first send failed (peer queue full): counted as made, retried after the timeout. */
    assert_int_equal(cps__reqs_add(rq, v, &ctx_b, 0, CPS_MSG_PULL, 0, 2, T0), 0);
    assert_int_equal(actions(rq, &a), 1);
    cps__reqs_sent(rq, a[0].index, CPS_EAGAIN, T0);
    cps__reqs_tick(rq, v, T0 + TIMEOUT_MS);
    expect_send(rq, 2, 3, 5, 1, CPS_RQ_WHY_TIMEOUT, T0 + TIMEOUT_MS);
}

/* Data-path evidence: the oldest request waiting at a server counts from its first send there; a
 * re-send to the same server keeps that time, a new view that moves it to another server starts
 * again, and an answered request no longer counts. */
static void oldest_request_per_server(void **state)
{
    fixture *f = *state;
    cps__reqs *rq = f->rq;
    cps__reqs_done d;
    assert_int_equal(cps__reqs_oldest_to(rq, 1), 0);
    assert_int_equal(cps__reqs_add(rq, &f->v5, &ctx_a, 0, CPS_MSG_PUSH, 0, 1, T0), 0);
    expect_send(rq, 1, 1, 5, 0, CPS_RQ_WHY_NEW, T0);
    assert_int_equal(cps__reqs_add(rq, &f->v5, &ctx_b, 0, CPS_MSG_PULL, 0, 2, T0 + 10), 0);
    expect_send(rq, 2, 3, 5, 0, CPS_RQ_WHY_NEW, T0 + 10);
    assert_int_equal(cps__reqs_oldest_to(rq, 1), T0);
    assert_int_equal(cps__reqs_oldest_to(rq, 3), T0 + 10);
    assert_int_equal(cps__reqs_oldest_to(rq, 2), 0);
    cps__reqs_tick(rq, &f->v5, T0 + TIMEOUT_MS);
    const cps__reqs_action *a;
    size_t n = actions(rq, &a);
    for (size_t k = 0; k < n; k++)
        if (a[k].kind == CPS_RQ_SEND)
            cps__reqs_sent(rq, a[k].index, 0, T0 + TIMEOUT_MS);
    assert_int_equal(cps__reqs_oldest_to(rq, 1), T0); /* re-sent to the same head */
    cps__reqs_view(rq, &f->v6, T0 + TIMEOUT_MS + 5);
    n = actions(rq, &a);
    for (size_t k = 0; k < n; k++)
        if (a[k].kind == CPS_RQ_SEND)
            cps__reqs_sent(rq, a[k].index, 0, T0 + TIMEOUT_MS + 5);
    assert_int_equal(cps__reqs_oldest_to(rq, 1), 0);
    assert_int_equal(cps__reqs_oldest_to(rq, 2), T0 + TIMEOUT_MS + 5); /* the new head */
    assert_int_equal(cps__reqs_oldest_to(rq, 3), T0 + 10);             /* the same tail */
    assert_int_equal(reply(rq, &f->v6, CPS_MSG_VALUES, 2, 6, 0, T0 + TIMEOUT_MS + 9, &d),
                     CPS_RQ_REPLY_TAKEN);
    assert_int_equal(cps__reqs_oldest_to(rq, 3), 0);
}

/* A range has at most CPS_REQS_WINDOW requests out: the others wait, are neither timed out nor
 * re-sent on a view, and go out oldest first as answers come back. Sync pushes (ordered) are
 * never held back by it. */
static void a_window_of_requests_per_range(void **state)
{
    fixture *f = *state;
    cps__reqs *rq = f->rq;
    const cps__view *v = &f->v5;
    const cps__reqs_action *a;
    uint64_t extra = 5, total = CPS_REQS_WINDOW + extra;
    for (uint64_t s = 1; s <= total; s++) {
        assert_int_equal(cps__reqs_add(rq, v, &ctx_a, 0, CPS_MSG_PUSH, 0, s, T0), 0);
        if (s <= CPS_REQS_WINDOW)
            expect_send(rq, s, 1, 5, 0, CPS_RQ_WHY_NEW, T0);
        else
            assert_int_equal(actions(rq, &a), 0);
    }
    /* A sync push (ordered) goes out past the window. */
    assert_int_equal(
        cps__reqs_add_ordered(rq, v, &ctx_b, 0, CPS_MSG_PUSH_PULL, 0, total + 1, 77, T0), 0);
    expect_send(rq, total + 1, 1, 5, 0, CPS_RQ_WHY_NEW, T0);
    /* The sync push counts against the window: an answer leaves it full. */
    assert_int_equal(reply(rq, v, CPS_MSG_ACK, 2, 5, 0, T0 + 1, NULL), CPS_RQ_REPLY_TAKEN);
    assert_int_equal(actions(rq, &a), 0);
    /* Then each answer lets the oldest waiting one go. */
    assert_int_equal(reply(rq, v, CPS_MSG_VALUES, total + 1, 5, 0, T0 + 2, NULL),
                     CPS_RQ_REPLY_TAKEN);
    expect_send(rq, CPS_REQS_WINDOW + 1, 1, 5, 0, CPS_RQ_WHY_NEW, T0 + 2);
    assert_int_equal(reply(rq, v, CPS_MSG_ACK, 1, 5, 0, T0 + 3, NULL), CPS_RQ_REPLY_TAKEN);
    expect_send(rq, CPS_REQS_WINDOW + 2, 1, 5, 0, CPS_RQ_WHY_NEW, T0 + 3);
    /* A view re-sends only what is out; a timeout likewise. */
    cps__reqs_view(rq, &f->v6, T0 + 4);
    size_t n = actions(rq, &a);
    assert_int_equal(n, CPS_REQS_WINDOW);
    for (size_t k = 0; k < n; k++)
        assert_true(a[k].kind == CPS_RQ_SEND && a[k].seq <= CPS_REQS_WINDOW + 2);
    cps__reqs_tick(rq, &f->v6, T0 + 4 + TIMEOUT_MS);
    n = actions(rq, &a);
    size_t sends = 0;
    for (size_t k = 0; k < n; k++)
        if (a[k].kind == CPS_RQ_SEND) {
            sends++;
            assert_true(a[k].seq <= CPS_REQS_WINDOW + 2);
        }
    assert_int_equal(sends, CPS_REQS_WINDOW);
    assert_int_equal(cps__reqs_count(rq), total - 2);
}

/* View 5 of TWO_RANGES in `mode`, with server 1 (range 0's only replica) dead. */
static void make_view_range0_down(cps__view *v, int mode)
{
    make_view(v, 5, 2, TWO_RANGES);
    v->mode = (uint32_t)mode;
    v->nodes[0].alive = 0;
}

/* A request whose range has no live replica waits up to the unavailable timeout for one, then
 * completes with CPS_EUNAVAILABLE; requests on other ranges carry on. */
static void gives_up_after_the_unavailable_timeout(void **state)
{
    (void)state;
    cps__view v;
    make_view_range0_down(&v, CPS_MODE_SYNC);
    cps__reqs *rq = make_reqs();
    /* A read: it leaves the table (a push stays, detached: see the next test). */
    assert_int_equal(cps__reqs_add(rq, &v, &ctx_a, 0, CPS_MSG_PULL, 0, 1, T0), 0);
    expect_send(rq, 1, 1, 5, 0, CPS_RQ_WHY_NEW, T0);
    assert_int_equal(cps__reqs_add(rq, &v, &ctx_b, 1, CPS_MSG_PUSH, 1, 1, T0), 0);
    expect_send(rq, 1, 2, 5, 0, CPS_RQ_WHY_NEW, T0);

    const cps__reqs_action *a;
    cps__reqs_tick(rq, &v, T0 + 1);
    assert_int_equal(actions(rq, &a), 1);
    assert_int_equal(a[0].kind, CPS_RQ_WAIT_REPLICA);
    assert_int_equal(a[0].range, 0);
    cps__reqs_tick(rq, &v, T0 + 1 + UNAVAIL_MS);
    assert_false(has_action(rq, CPS_RQ_COMPLETE));
    cps__reqs_tick(rq, &v, T0 + 2 + UNAVAIL_MS);
    size_t n = actions(rq, &a), done = 0;
    for (size_t k = 0; k < n; k++) {
        if (a[k].kind != CPS_RQ_COMPLETE)
            continue;
        done++;
        assert_ptr_equal(a[k].ctx, &ctx_a);
        assert_int_equal(a[k].status, CPS_EUNAVAILABLE);
        assert_false(a[k].detach);
    }
    assert_int_equal(done, 1);
    assert_int_equal(cps__reqs_count(rq), 1);
    cps__reqs_done d;
    assert_int_equal(reply(rq, &v, CPS_MSG_ACK, 1, 5, 0, T0 + 3 + UNAVAIL_MS, &d),
                     CPS_RQ_REPLY_UNKNOWN); /* range 0's request is gone */
    cps__reqs_reply_in in = {CPS_MSG_ACK, 1, 1, 5, 0};
    assert_int_equal(cps__reqs_reply(rq, &v, &in, T0 + 3 + UNAVAIL_MS, &d), CPS_RQ_REPLY_TAKEN);
    assert_ptr_equal(d.ctx, &ctx_b);

    /* A replica back in time resets the wait. */
    assert_int_equal(cps__reqs_add(rq, &v, &ctx_a, 0, CPS_MSG_PUSH, 0, 2, T0), 0);
    cps__reqs_tick(rq, &v, T0);
    assert_true(has_action(rq, CPS_RQ_WAIT_REPLICA));
    v.nodes[0].alive = 1;
    cps__reqs_tick(rq, &v, T0 + 10);
    v.nodes[0].alive = 0;
    cps__reqs_tick(rq, &v, T0 + 20);
    assert_true(has_action(rq, CPS_RQ_WAIT_REPLICA));
    cps__reqs_tick(rq, &v, T0 + 21 + UNAVAIL_MS - 10);
    assert_false(has_action(rq, CPS_RQ_COMPLETE));
    cps__reqs_destroy(rq);
    cps__view_fini(&v);
}

/* A push given up (CPS_EUNAVAILABLE) stays in the table under the caller's detached context and
 * goes on being sent until a server answers it: its number is one of the worker's sequence on
 * the range, and the head drops the worker's later pushes as a gap until it has it (simulator
 * seed 16 with --give-up: every later push of the worker on the range hung). */
static void given_up_push_is_detached_and_still_sent(void **state)
{
    (void)state;
    static int ctx_c;
    cps__view v;
    make_view_range0_down(&v, CPS_MODE_ASYNC);
    cps__reqs *rq = make_reqs();
    assert_int_equal(cps__reqs_add(rq, &v, &ctx_a, 0, CPS_MSG_PUSH, 0, 1, T0), 0);
    expect_send(rq, 1, 1, 5, 0, CPS_RQ_WHY_NEW, T0);
    assert_int_equal(cps__reqs_add(rq, &v, &ctx_b, 0, CPS_MSG_PULL, 0, 2, T0), 0);
    expect_send(rq, 2, 1, 5, 0, CPS_RQ_WHY_NEW, T0);
    cps__reqs_tick(rq, &v, T0 + 1);
    uint64_t t = T0 + 2 + UNAVAIL_MS;
    cps__reqs_tick(rq, &v, t);
    const cps__reqs_action *a;
    size_t n = actions(rq, &a), done = 0;
    for (size_t k = 0; k < n; k++) {
        assert_int_not_equal(a[k].kind, CPS_RQ_SEND); /* not before it has a context */
        if (a[k].kind != CPS_RQ_COMPLETE)
            continue;
        done++;
        assert_int_equal(a[k].status, CPS_EUNAVAILABLE);
        if (a[k].ctx == &ctx_a) {
            assert_true(a[k].detach);
            cps__reqs_detach(rq, a[k].index, &ctx_c, 7);
        } else {
            assert_ptr_equal(a[k].ctx, &ctx_b);
            assert_false(a[k].detach);
        }
    }
    assert_int_equal(done, 2);
    assert_int_equal(cps__reqs_count(rq), 1);
    assert_int_equal(cps__reqs_detached(rq), 1);

    /* Never completed again, however long the range stays without a replica; re-sent on every
     * timeout under the detached context. */
    cps__reqs_tick(rq, &v, t + 10 * UNAVAIL_MS);
    assert_false(has_action(rq, CPS_RQ_COMPLETE));
    n = actions(rq, &a);
    size_t sends = 0;
    for (size_t k = 0; k < n; k++)
        if (a[k].kind == CPS_RQ_SEND) {
            sends++;
            assert_ptr_equal(a[k].ctx, &ctx_c);
            assert_int_equal(a[k].part, 7);
            assert_int_equal(a[k].seq, 1);
            cps__reqs_sent(rq, a[k].index, 0, t + 10 * UNAVAIL_MS);
        }
    assert_int_equal(sends, 1);

    /* The replica is back: its answer ends the request, marked detached for the caller. */
    v.nodes[0].alive = 1;
    cps__reqs_done d;
    assert_int_equal(reply(rq, &v, CPS_MSG_ACK, 1, 5, 0, t + 10 * UNAVAIL_MS + 1, &d),
                     CPS_RQ_REPLY_TAKEN);
    assert_ptr_equal(d.ctx, &ctx_c);
    assert_int_equal(d.part, 7);
    assert_true(d.detached);
    assert_int_equal(cps__reqs_count(rq), 0);
    assert_int_equal(cps__reqs_detached(rq), 0);

    /* A caller with no context for it lets it go: it leaves at the next call. */
    v.nodes[0].alive = 0;
    assert_int_equal(cps__reqs_add(rq, &v, &ctx_a, 0, CPS_MSG_PUSH, 0, 2, t), 0);
    expect_send(rq, 2, 1, 5, 0, CPS_RQ_WHY_NEW, t);
    cps__reqs_tick(rq, &v, t + 1);
    cps__reqs_tick(rq, &v, t + 2 + UNAVAIL_MS);
    n = actions(rq, &a);
    for (size_t k = 0; k < n; k++)
        if (a[k].kind == CPS_RQ_COMPLETE)
            cps__reqs_detach(rq, a[k].index, NULL, 0);
    cps__reqs_tick(rq, &v, t + 3 + UNAVAIL_MS);
    assert_int_equal(cps__reqs_count(rq), 0);
    assert_int_equal(cps__reqs_detached(rq), 0);

    /* Sync: a step's dense push stays as well (its step completes only once it came), as does a
     * sparse-row one (in sequence). */
    v.mode = CPS_MODE_SYNC;
    t += 10 * UNAVAIL_MS;
    assert_int_equal(cps__reqs_add(rq, &v, &ctx_a, 0, CPS_MSG_PUSH, 0, 3, t), 0);
    expect_send(rq, 3, 1, 5, 0, CPS_RQ_WHY_NEW, t);
    assert_int_equal(cps__reqs_add(rq, &v, &ctx_b, 0, CPS_MSG_PUSH, 0, CPS_SEQ_SPARSE | 1, t), 0);
    expect_send(rq, CPS_SEQ_SPARSE | 1, 1, 5, 0, CPS_RQ_WHY_NEW, t);
    cps__reqs_tick(rq, &v, t + 1);
    cps__reqs_tick(rq, &v, t + 2 + UNAVAIL_MS);
    n = actions(rq, &a);
    done = 0;
    for (size_t k = 0; k < n; k++) {
        if (a[k].kind != CPS_RQ_COMPLETE)
            continue;
        done++;
        assert_true(a[k].detach);
        cps__reqs_detach(rq, a[k].index, &ctx_c, 7);
    }
    assert_int_equal(done, 2);
    assert_int_equal(cps__reqs_count(rq), 2);
    assert_int_equal(cps__reqs_detached(rq), 2);
    cps__reqs_destroy(rq); /* a detached request left in the table is dropped */
    cps__view_fini(&v);
}

/* Requests of one (range, order) in flight are not held (pipelining); one added behind a
 * detached (given-up) one is, and so is every later one, until no detached one is ahead; held
 * ones are let go in adding order whatever their places in the table. */
static void ordered_requests_wait_behind_a_given_up_one(void **state)
{
    (void)state;
    cps__view v;
    make_view_range0_down(&v, CPS_MODE_SYNC);
    cps__reqs *rq = make_reqs();
    static int s1, s2, s3, s4, other, c1;
    assert_int_equal(cps__reqs_add_ordered(rq, &v, &s1, 0, CPS_MSG_PUSH, 0, 1, 42, T0), 0);
    expect_send(rq, 1, 1, 5, 0, CPS_RQ_WHY_NEW, T0);
    /* In flight only: the next goes out at once. */
    assert_int_equal(cps__reqs_add_ordered(rq, &v, &s2, 0, CPS_MSG_PUSH, 0, 2, 42, T0), 0);
    expect_send(rq, 2, 1, 5, 0, CPS_RQ_WHY_NEW, T0);
    /* Range 0 has no replica: both are given up, and detached. */
    cps__reqs_tick(rq, &v, T0 + 1);
    cps__reqs_tick(rq, &v, T0 + 2 + UNAVAIL_MS);
    const cps__reqs_action *a;
    size_t n = actions(rq, &a), done = 0;
    for (size_t k = 0; k < n; k++)
        if (a[k].kind == CPS_RQ_COMPLETE) {
            assert_true(a[k].detach);
            cps__reqs_detach(rq, a[k].index, &c1, a[k].seq == 1 ? 1 : 2);
            done++;
        }
    assert_int_equal(done, 2);
    /* Behind detached ones: held, not sent, not re-sent on a view or a timeout. */
    uint64_t t = T0 + 3 + UNAVAIL_MS;
    assert_int_equal(cps__reqs_add_ordered(rq, &v, &s3, 0, CPS_MSG_PUSH, 0, 3, 42, t), 0);
    assert_false(has_action(rq, CPS_RQ_SEND));
    assert_int_equal(cps__reqs_add_ordered(rq, &v, &s4, 0, CPS_MSG_PUSH, 0, 4, 42, t), 0);
    assert_false(has_action(rq, CPS_RQ_SEND));
    /* Another key set is not held. */
    assert_int_equal(cps__reqs_add_ordered(rq, &v, &other, 0, CPS_MSG_PUSH, 0, 5, 43, t), 0);
    expect_send(rq, 5, 1, 5, 0, CPS_RQ_WHY_NEW, t);
    v.nodes[0].alive = 1;
    cps__reqs_view(rq, &v, t + 1);
    n = actions(rq, &a);
    for (size_t k = 0; k < n; k++)
        if (a[k].kind == CPS_RQ_SEND) {
            assert_true(a[k].seq == 1 || a[k].seq == 2 || a[k].seq == 5);
            cps__reqs_sent(rq, a[k].index, 0, t + 1);
        }
    /* The other key set's answer reorders the table; nothing of key 42 is let go by it. */
    assert_int_equal(reply(rq, &v, CPS_MSG_ACK, 5, 5, 0, t + 2, NULL), CPS_RQ_REPLY_TAKEN);
    assert_false(has_action(rq, CPS_RQ_SEND));
    /* The first given-up one answered: the second is still ahead, detached; both stay held. */
    assert_int_equal(reply(rq, &v, CPS_MSG_ACK, 1, 5, 0, t + 3, NULL), CPS_RQ_REPLY_TAKEN);
    assert_false(has_action(rq, CPS_RQ_SEND));
    /* The second answered: both held ones go, in adding order, at once. */
    assert_int_equal(reply(rq, &v, CPS_MSG_ACK, 2, 5, 0, t + 4, NULL), CPS_RQ_REPLY_TAKEN);
    n = actions(rq, &a);
    uint64_t sent[2];
    size_t ns = 0;
    for (size_t k = 0; k < n; k++)
        if (a[k].kind == CPS_RQ_SEND) {
            assert_true(ns < 2);
            sent[ns++] = a[k].seq;
            assert_int_equal(a[k].why, CPS_RQ_WHY_NEW);
        }
    assert_int_equal(ns, 2);
    assert_int_equal(sent[0], 3);
    assert_int_equal(sent[1], 4);
    cps__reqs_destroy(rq);
    cps__view_fini(&v);
}

/* A held request given up (detached) keeps its place: the ones behind it stay held until it is
 * answered, then go. */
static void held_request_is_given_up_and_keeps_its_place(void **state)
{
    (void)state;
    cps__view v;
    make_view_range0_down(&v, CPS_MODE_SYNC);
    cps__reqs *rq = make_reqs();
    static int s1, s2, s3, c1, c2;
    assert_int_equal(cps__reqs_add_ordered(rq, &v, &s1, 0, CPS_MSG_PUSH, 0, 1, 7, T0), 0);
    expect_send(rq, 1, 1, 5, 0, CPS_RQ_WHY_NEW, T0);
    cps__reqs_tick(rq, &v, T0 + 1);
    cps__reqs_tick(rq, &v, T0 + 2 + UNAVAIL_MS);
    const cps__reqs_action *a;
    size_t n = actions(rq, &a);
    for (size_t k = 0; k < n; k++)
        if (a[k].kind == CPS_RQ_COMPLETE)
            cps__reqs_detach(rq, a[k].index, &c1, 0);
    uint64_t t = T0 + 3 + UNAVAIL_MS;
    assert_int_equal(cps__reqs_add_ordered(rq, &v, &s2, 0, CPS_MSG_PUSH, 0, 2, 7, t), 0);
    assert_false(has_action(rq, CPS_RQ_SEND));
    cps__reqs_tick(rq, &v, t + 1);
    cps__reqs_tick(rq, &v, t + 2 + UNAVAIL_MS);
    n = actions(rq, &a);
    size_t done = 0;
    for (size_t k = 0; k < n; k++) {
        assert_false(a[k].kind == CPS_RQ_SEND && a[k].seq == 2);
        if (a[k].kind == CPS_RQ_COMPLETE && a[k].seq == 2) {
            assert_true(a[k].detach);
            cps__reqs_detach(rq, a[k].index, &c2, 0);
            done++;
        }
    }
    assert_int_equal(done, 1);
    t += 3 + UNAVAIL_MS;
    assert_int_equal(cps__reqs_add_ordered(rq, &v, &s3, 0, CPS_MSG_PUSH, 0, 3, 7, t), 0);
    assert_false(has_action(rq, CPS_RQ_SEND));
    /* The replica is back: only seq 1 goes out; its answer lets seq 2 go (detached, it keeps
     * seq 3 held); seq 2's answer lets seq 3 go. */
    v.nodes[0].alive = 1;
    cps__reqs_tick(rq, &v, t + TIMEOUT_MS);
    expect_send(rq, 1, 1, 5, 1, CPS_RQ_WHY_TIMEOUT, t + TIMEOUT_MS);
    cps__reqs_done d;
    assert_int_equal(reply(rq, &v, CPS_MSG_ACK, 1, 5, 0, t + TIMEOUT_MS + 1, &d),
                     CPS_RQ_REPLY_TAKEN);
    assert_ptr_equal(d.ctx, &c1);
    expect_send(rq, 2, 1, 5, 0, CPS_RQ_WHY_NEW, t + TIMEOUT_MS + 1);
    assert_int_equal(reply(rq, &v, CPS_MSG_ACK, 2, 5, 0, t + TIMEOUT_MS + 2, &d),
                     CPS_RQ_REPLY_TAKEN);
    assert_ptr_equal(d.ctx, &c2);
    expect_send(rq, 3, 1, 5, 0, CPS_RQ_WHY_NEW, t + TIMEOUT_MS + 2);
    cps__reqs_destroy(rq);
    cps__view_fini(&v);
}

/* A refusal completes the request with the server's error; answers to a completed request,
 * duplicates included, are not matched with anything. */
static void refusals_complete_and_duplicates_are_ignored(void **state)
{
    fixture *f = *state;
    cps__reqs *rq = f->rq;
    const cps__view *v = &f->v5;
    assert_int_equal(cps__reqs_add(rq, v, &ctx_a, 0, CPS_MSG_DECLARE, 0, 1, T0), 0);
    expect_send(rq, 1, 1, 5, 0, CPS_RQ_WHY_NEW, T0);
    assert_int_equal(cps__reqs_add(rq, v, &ctx_b, 0, CPS_MSG_PUSH, 0, 2, T0), 0);
    expect_send(rq, 2, 1, 5, 0, CPS_RQ_WHY_NEW, T0);
    cps__reqs_done d;
    assert_int_equal(reply(rq, v, CPS_MSG_ERROR, 1, 5, CPS_EINVAL, T0 + 1, &d),
                     CPS_RQ_REPLY_FAILED);
    assert_int_equal(d.status, CPS_EINVAL);
    assert_ptr_equal(d.ctx, &ctx_a);
    assert_int_equal(reply(rq, v, CPS_MSG_ERROR, 2, 5, 3, T0 + 1, &d), CPS_RQ_REPLY_FAILED);
    assert_int_equal(d.status, CPS_EPROTO); /* not an error code */
    assert_int_equal(cps__reqs_count(rq), 0);
    assert_int_equal(reply(rq, v, CPS_MSG_ACK, 1, 5, 0, T0 + 2, &d), CPS_RQ_REPLY_UNKNOWN);
    assert_int_equal(reply(rq, v, CPS_MSG_ERROR, 2, 5, CPS_EAGAIN, T0 + 2, &d),
                     CPS_RQ_REPLY_UNKNOWN);
    const cps__reqs_action *a;
    assert_int_equal(actions(rq, &a), 0);

    assert_int_equal(cps__reqs_add(rq, v, &ctx_a, 0, CPS_MSG_PUSH, 0, 3, T0), 0);
    expect_send(rq, 3, 1, 5, 0, CPS_RQ_WHY_NEW, T0);
    assert_int_equal(reply(rq, v, CPS_MSG_ACK, 3, 5, 0, T0 + 1, &d), CPS_RQ_REPLY_TAKEN);
    assert_int_equal(reply(rq, v, CPS_MSG_ACK, 3, 5, 0, T0 + 2, &d), CPS_RQ_REPLY_UNKNOWN);
}

/* A range the view has no chain for is not sent to; the timeout tries again. */
static void range_without_chain_waits_for_the_timeout(void **state)
{
    (void)state;
    static const uint32_t none[][CPS_MAX_REPLICAS + 1] = {{0}};
    cps__view v0, v5;
    make_view(&v0, 4, 1, none);
    make_view(&v5, 5, 1, ONE_RANGE);
    cps__reqs *rq = make_reqs();
    assert_int_equal(cps__reqs_add(rq, &v0, &ctx_a, 0, CPS_MSG_PUSH, 0, 1, T0), 0);
    const cps__reqs_action *a;
    assert_int_equal(actions(rq, &a), 0);
    cps__reqs_tick(rq, &v5, T0 + TIMEOUT_MS - 1);
    assert_false(has_action(rq, CPS_RQ_SEND));
    cps__reqs_tick(rq, &v5, T0 + TIMEOUT_MS);
    expect_send(rq, 1, 1, 5, 1, CPS_RQ_WHY_TIMEOUT, T0 + TIMEOUT_MS);
    cps__reqs_destroy(rq);
    cps__view_fini(&v0);
    cps__view_fini(&v5);
}

/* cps__reqs_would_take (the pure look-up that plans an early copy of values) says 1 exactly when
 * cps__reqs_reply would then take the answer for a caller still waiting: not for an unknown
 * number, nor an answer of another epoch, nor a detached request (taken, but its caller has its
 * result), nor a dropped one (gone from the table at the next call, so unknown to the reply). */
static void would_take_agrees_with_reply(void **state)
{
    (void)state;
    static int ctx_c;
    cps__view v;
    make_view_range0_down(&v, CPS_MODE_ASYNC);
    v.nodes[0].alive = 1;
    cps__reqs *rq = make_reqs();
    void *ctx = NULL;
    uint32_t part = 0;
    cps__reqs_done d;
    assert_int_equal(cps__reqs_add(rq, &v, &ctx_b, 3, CPS_MSG_PULL, 0, 1, T0), 0);
    expect_send(rq, 1, 1, 5, 0, CPS_RQ_WHY_NEW, T0);
    assert_int_equal(cps__reqs_would_take(rq, 0, 2, 5, &ctx, &part), 0);
    assert_int_equal(reply(rq, &v, CPS_MSG_VALUES, 2, 5, 0, T0 + 1, &d), CPS_RQ_REPLY_UNKNOWN);
    assert_int_equal(cps__reqs_would_take(rq, 0, 1, 4, &ctx, &part), 0);
    assert_int_equal(reply(rq, &v, CPS_MSG_VALUES, 1, 4, 0, T0 + 1, &d), CPS_RQ_REPLY_OTHER_EPOCH);
    assert_int_equal(cps__reqs_would_take(rq, 0, 1, 5, &ctx, &part), 1);
    assert_ptr_equal(ctx, &ctx_b);
    assert_int_equal(part, 3);
    assert_int_equal(reply(rq, &v, CPS_MSG_VALUES, 1, 5, 0, T0 + 1, &d), CPS_RQ_REPLY_TAKEN);
    assert_ptr_equal(d.ctx, &ctx_b);

    /* Two pushes given up: one detached under a context, one dropped. */
    v.nodes[0].alive = 0;
    assert_int_equal(cps__reqs_add(rq, &v, &ctx_a, 0, CPS_MSG_PUSH, 0, 2, T0), 0);
    expect_send(rq, 2, 1, 5, 0, CPS_RQ_WHY_NEW, T0);
    assert_int_equal(cps__reqs_add(rq, &v, &ctx_b, 0, CPS_MSG_PUSH, 0, 3, T0), 0);
    expect_send(rq, 3, 1, 5, 0, CPS_RQ_WHY_NEW, T0);
    cps__reqs_tick(rq, &v, T0 + 1);
    cps__reqs_tick(rq, &v, T0 + 2 + UNAVAIL_MS);
    const cps__reqs_action *a;
    size_t n = actions(rq, &a);
    for (size_t k = 0; k < n; k++)
        if (a[k].kind == CPS_RQ_COMPLETE)
            cps__reqs_detach(rq, a[k].index, a[k].seq == 2 ? &ctx_c : NULL, 0);
    v.nodes[0].alive = 1;
    assert_int_equal(cps__reqs_would_take(rq, 0, 2, 5, &ctx, &part), 0);
    assert_int_equal(cps__reqs_would_take(rq, 0, 3, 5, &ctx, &part), 0);
    assert_int_equal(reply(rq, &v, CPS_MSG_ACK, 3, 5, 0, T0 + 3 + UNAVAIL_MS, &d),
                     CPS_RQ_REPLY_UNKNOWN);
    assert_int_equal(reply(rq, &v, CPS_MSG_ACK, 2, 5, 0, T0 + 3 + UNAVAIL_MS, &d),
                     CPS_RQ_REPLY_TAKEN);
    assert_true(d.detached);
    assert_int_equal(cps__reqs_count(rq), 0);
    cps__reqs_destroy(rq);
    cps__view_fini(&v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(config_is_checked),
        cmocka_unit_test_setup_teardown(updates_go_to_the_head_reads_to_the_tail, setup, teardown),
        cmocka_unit_test_setup_teardown(
            reply_of_another_epoch_is_dropped_and_resent_under_current_view, setup, teardown),
        cmocka_unit_test_setup_teardown(newer_epoch_reply_asks_for_the_view, setup, teardown),
        cmocka_unit_test_setup_teardown(pull_waits_for_a_view_as_new_as_any_seen, setup, teardown),
        cmocka_unit_test_setup_teardown(stale_epoch_parks_until_a_newer_view, setup, teardown),
        cmocka_unit_test_setup_teardown(timeout_resends, setup, teardown),
        cmocka_unit_test_setup_teardown(oldest_request_per_server, setup, teardown),
        cmocka_unit_test_setup_teardown(a_window_of_requests_per_range, setup, teardown),
        cmocka_unit_test(gives_up_after_the_unavailable_timeout),
        cmocka_unit_test(given_up_push_is_detached_and_still_sent),
        cmocka_unit_test_setup_teardown(refusals_complete_and_duplicates_are_ignored, setup,
                                        teardown),
        cmocka_unit_test(range_without_chain_waits_for_the_timeout),
        cmocka_unit_test(ordered_requests_wait_behind_a_given_up_one),
        cmocka_unit_test(held_request_is_given_up_and_keeps_its_place),
        cmocka_unit_test(would_take_agrees_with_reply),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
