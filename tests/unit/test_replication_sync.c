#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "core/wire.h"
#include "replication/sync.h"

/* Worker node ids are 10 + rank; one server (id 1) so roles other than workers are skipped. */
#define NW 4

static cps__node_info nodes[1 + NW];

static void make_view(cps__view *v, uint32_t workers)
{
    memset(v, 0, sizeof *v);
    memset(nodes, 0, sizeof nodes);
    v->epoch = 3;
    v->mode = CPS_MODE_SYNC;
    v->num_workers = workers;
    v->nnodes = 1 + workers;
    v->nodes = nodes;
    nodes[0] = (cps__node_info){.id = 1, .role = CPS_ROLE_SERVER, .alive = 1, .rank = 0};
    for (uint32_t r = 0; r < workers; r++)
        nodes[1 + r] =
            (cps__node_info){.id = 10 + r, .role = CPS_ROLE_WORKER, .alive = 1, .rank = r};
}

/* A cookie: one rank's gradient, and a count of the times the aggregator dropped it. */
typedef struct grad {
    uint32_t rank;
    float vals[3];
    int dropped;
} grad;

static void drop(void *ctx, void *cookie)
{
    int *n = ctx;
    ((grad *)cookie)->dropped++;
    (*n)++;
}

/* A view of `workers` live workers and an empty aggregator whose drops count in *dropped. */
static cps__sync *setup_sync(cps__view *v, uint32_t workers, int *dropped)
{
    make_view(v, workers);
    *dropped = 0;
    cps__sync *a;
    assert_int_equal(cps__sync_create(drop, dropped, &a), 0);
    return a;
}

static int push(cps__sync *a, const cps__view *v, uint64_t step, grad *g, uint64_t now)
{
    cps__sync_contrib c = {10 + g->rank, CPS_MSG_PUSH, 100 + step, 3, g, 0};
    return cps__sync_push(a, v, 0, 0xabc, step, g->rank, &c, now);
}

static const cps__sync_action *only_action(cps__sync *a, int kind)
{
    const cps__sync_action *acts;
    size_t n = cps__sync_actions(a, &acts);
    assert_int_equal(n, 1);
    assert_int_equal(acts[0].kind, kind);
    return &acts[0];
}

static void no_actions(cps__sync *a)
{
    const cps__sync_action *acts;
    assert_int_equal(cps__sync_actions(a, &acts), 0);
}

static void completes_exactly_when_every_live_worker_pushed(void **state)
{
    (void)state;
    cps__view v;
    int dropped;
    cps__sync *a = setup_sync(&v, 3, &dropped);
    grad g[3] = {{.rank = 0}, {.rank = 1}, {.rank = 2}};
    assert_int_equal(push(a, &v, 7, &g[1], 0), CPS_SYNC_TAKEN);
    no_actions(a);
    assert_int_equal(push(a, &v, 7, &g[0], 1), CPS_SYNC_TAKEN);
    no_actions(a);
    assert_int_equal(cps__sync_pending(a), 1);
    assert_int_equal(push(a, &v, 7, &g[2], 2), CPS_SYNC_TAKEN);
    const cps__sync_action *s = only_action(a, CPS_SA_SUBMIT);
    assert_int_equal(s->range, 0);
    assert_int_equal(s->sig, 0xabc);
    assert_int_equal(s->step, 7);
    assert_int_equal(s->count, 3);
    assert_int_equal(s->nranks, 3);
    for (uint32_t r = 0; r < 3; r++) {
        assert_ptr_equal(s->by_rank[r].cookie, &g[r]);
        assert_int_equal(s->by_rank[r].worker, 10 + r);
        assert_int_equal(s->by_rank[r].req_seq, 107);
    }
    assert_int_equal(cps__sync_pending(a), 0);
    /* A submitted step's cookies went back to the caller: destroy must not drop them. */
    cps__sync_destroy(a);
    assert_int_equal(dropped, 0);
}

/* Values whose float sum depends on the order they are added in. */
static const float vals[NW][3] = {
    {1e8f, 1.0f, 0.1f}, {1.0f, 1e8f, 0.2f}, {-1e8f, 3.0f, 0.3f}, {1.0f, -1e8f, 1e-8f}};

static void sum_by_rank(const cps__sync_action *s, float out[3])
{
    int first = 1;
    for (uint32_t r = 0; r < s->nranks; r++) {
        const grad *g = s->by_rank[r].cookie;
        if (!g)
            continue;
        for (int i = 0; i < 3; i++)
            out[i] = first ? g->vals[i] : out[i] + g->vals[i];
        first = 0;
    }
}

static void aggregate_is_bitwise_equal_in_every_arrival_order(void **state)
{
    (void)state;
    static const int perms[24][NW] = {
        {0, 1, 2, 3}, {0, 1, 3, 2}, {0, 2, 1, 3}, {0, 2, 3, 1}, {0, 3, 1, 2}, {0, 3, 2, 1},
        {1, 0, 2, 3}, {1, 0, 3, 2}, {1, 2, 0, 3}, {1, 2, 3, 0}, {1, 3, 0, 2}, {1, 3, 2, 0},
        {2, 0, 1, 3}, {2, 0, 3, 1}, {2, 1, 0, 3}, {2, 1, 3, 0}, {2, 3, 0, 1}, {2, 3, 1, 0},
        {3, 0, 1, 2}, {3, 0, 2, 1}, {3, 1, 0, 2}, {3, 1, 2, 0}, {3, 2, 0, 1}, {3, 2, 1, 0}};
    cps__view v;
    make_view(&v, NW);
    float ref[3];
    int arrival_order_differs = 0;
    for (int p = 0; p < 24; p++) {
        cps__sync *a;
        assert_int_equal(cps__sync_create(NULL, NULL, &a), 0);
        grad g[NW];
        float naive[3] = {0, 0, 0};
        for (int k = 0; k < NW; k++) {
            int r = perms[p][k];
            g[r] = (grad){.rank = (uint32_t)r};
            memcpy(g[r].vals, vals[r], sizeof g[r].vals);
            for (int i = 0; i < 3; i++)
                naive[i] = k ? naive[i] + vals[r][i] : vals[r][i];
            assert_int_equal(push(a, &v, 1, &g[r], (uint64_t)k), CPS_SYNC_TAKEN);
        }
        float sum[3];
        sum_by_rank(only_action(a, CPS_SA_SUBMIT), sum);
        if (p == 0)
            memcpy(ref, sum, sizeof ref);
        assert_memory_equal(sum, ref, sizeof ref);
        arrival_order_differs |= memcmp(naive, ref, sizeof ref) != 0;
        cps__sync_destroy(a);
    }
    /* The values are chosen so that summing as pushes arrive would not be reproducible. */
    assert_true(arrival_order_differs);
}

static void dead_worker_is_no_longer_waited_for(void **state)
{
    (void)state;
    cps__view v;
    int dropped;
    cps__sync *a = setup_sync(&v, 3, &dropped);
    grad g[3] = {{.rank = 0}, {.rank = 1}, {.rank = 2}};
    assert_int_equal(push(a, &v, 4, &g[0], 0), CPS_SYNC_TAKEN);
    assert_int_equal(push(a, &v, 4, &g[2], 0), CPS_SYNC_TAKEN);
    no_actions(a);
    /* The same view again completes nothing. */
    assert_int_equal(cps__sync_set_view(a, &v), 0);
    no_actions(a);
    nodes[1 + 1].alive = 0; /* rank 1 declared dead */
    v.epoch++;
    assert_int_equal(cps__sync_set_view(a, &v), 0);
    const cps__sync_action *s = only_action(a, CPS_SA_SUBMIT);
    assert_int_equal(s->count, 2);
    assert_ptr_equal(s->by_rank[0].cookie, &g[0]);
    assert_null(s->by_rank[1].cookie);
    assert_ptr_equal(s->by_rank[2].cookie, &g[2]);
    assert_int_equal(cps__sync_pending(a), 0);
    /* The next step completes with the two live workers alone. */
    assert_int_equal(push(a, &v, 5, &g[2], 0), CPS_SYNC_TAKEN);
    no_actions(a);
    assert_int_equal(push(a, &v, 5, &g[0], 0), CPS_SYNC_TAKEN);
    assert_int_equal(only_action(a, CPS_SA_SUBMIT)->count, 2);
    cps__sync_destroy(a);
    assert_int_equal(dropped, 0);
}

static void push_of_a_worker_that_then_died_still_counts(void **state)
{
    (void)state;
    cps__view v;
    int dropped;
    cps__sync *a = setup_sync(&v, 2, &dropped);
    grad g[2] = {{.rank = 0}, {.rank = 1}};
    assert_int_equal(push(a, &v, 9, &g[1], 0), CPS_SYNC_TAKEN);
    nodes[1 + 1].alive = 0;
    assert_int_equal(cps__sync_set_view(a, &v), 0);
    no_actions(a); /* rank 0 is alive and missing */
    assert_int_equal(push(a, &v, 9, &g[0], 0), CPS_SYNC_TAKEN);
    const cps__sync_action *s = only_action(a, CPS_SA_SUBMIT);
    assert_int_equal(s->count, 2);
    assert_ptr_equal(s->by_rank[1].cookie, &g[1]);
    cps__sync_destroy(a);
}

static void retry_and_size_mismatch_leave_the_cookie_with_the_caller(void **state)
{
    (void)state;
    cps__view v;
    int dropped;
    cps__sync *a = setup_sync(&v, 2, &dropped);
    grad g0 = {.rank = 0}, again = {.rank = 0}, longer = {.rank = 1};
    assert_int_equal(push(a, &v, 1, &g0, 0), CPS_SYNC_TAKEN);
    assert_int_equal(push(a, &v, 1, &again, 0), CPS_SYNC_RETRY);
    no_actions(a);
    cps__sync_contrib c = {11, CPS_MSG_PUSH, 5, 4, &longer, 0};
    assert_int_equal(cps__sync_push(a, &v, 0, 0xabc, 1, 1, &c, 0), CPS_SYNC_SIZE);
    no_actions(a);
    /* Out-of-range rank and a missing cookie are refused. */
    c.nvals = 3;
    assert_int_equal(cps__sync_push(a, &v, 0, 0xabc, 1, 2, &c, 0), CPS_EINVAL);
    c.cookie = NULL;
    assert_int_equal(cps__sync_push(a, &v, 0, 0xabc, 1, 1, &c, 0), CPS_EINVAL);
    assert_int_equal(cps__sync_pending(a), 1);
    /* Destroy drops what it holds, once each, and nothing it refused. */
    cps__sync_destroy(a);
    assert_int_equal(dropped, 1);
    assert_int_equal(g0.dropped, 1);
    assert_int_equal(again.dropped + longer.dropped, 0);
}

static void steps_key_sets_and_ranges_are_separate_slots(void **state)
{
    (void)state;
    cps__view v;
    int dropped;
    cps__sync *a = setup_sync(&v, 2, &dropped);
    grad g[6] = {{.rank = 0}, {.rank = 0}, {.rank = 0}, {.rank = 1}, {.rank = 1}, {.rank = 1}};
    cps__sync_contrib c = {10, CPS_MSG_PUSH, 1, 3, &g[0], 0};
    assert_int_equal(cps__sync_push(a, &v, 0, 1, 1, 0, &c, 0), CPS_SYNC_TAKEN);
    c.cookie = &g[1];
    assert_int_equal(cps__sync_push(a, &v, 0, 1, 2, 0, &c, 0), CPS_SYNC_TAKEN); /* step */
    c.cookie = &g[2];
    assert_int_equal(cps__sync_push(a, &v, 1, 1, 1, 0, &c, 0), CPS_SYNC_TAKEN); /* range */
    assert_int_equal(cps__sync_pending(a), 3);
    c = (cps__sync_contrib){11, CPS_MSG_PUSH_PULL, 1, 3, &g[3], 0};
    assert_int_equal(cps__sync_push(a, &v, 0, 2, 1, 1, &c, 0), CPS_SYNC_TAKEN); /* key set */
    no_actions(a);
    assert_int_equal(cps__sync_pending(a), 4);
    c.cookie = &g[4];
    assert_int_equal(cps__sync_push(a, &v, 1, 1, 1, 1, &c, 0), CPS_SYNC_TAKEN);
    const cps__sync_action *s = only_action(a, CPS_SA_SUBMIT);
    assert_int_equal(s->range, 1);
    assert_ptr_equal(s->by_rank[0].cookie, &g[2]);
    assert_ptr_equal(s->by_rank[1].cookie, &g[4]);
    assert_int_equal(s->by_rank[1].type, CPS_MSG_PUSH_PULL);
    assert_int_equal(cps__sync_pending(a), 3);
    cps__sync_destroy(a);
}

static void a_stuck_step_is_reported_then_repeated(void **state)
{
    (void)state;
    cps__view v;
    int dropped;
    cps__sync *a = setup_sync(&v, 2, &dropped);
    grad g = {.rank = 1};
    assert_int_equal(push(a, &v, 3, &g, 1000), CPS_SYNC_TAKEN);
    assert_int_equal(cps__sync_tick(a, 1000 + CPS_SYNC_STUCK_MS - 1), 0);
    no_actions(a);
    assert_int_equal(cps__sync_tick(a, 1000 + CPS_SYNC_STUCK_MS), 0);
    const cps__sync_action *s = only_action(a, CPS_SA_STUCK);
    assert_int_equal(s->since_ms, 1000);
    assert_int_equal(s->step, 3);
    assert_null(s->by_rank[0].cookie);
    assert_ptr_equal(s->by_rank[1].cookie, &g);
    uint64_t warned = 1000 + CPS_SYNC_STUCK_MS;
    assert_int_equal(cps__sync_tick(a, warned + CPS_SYNC_STUCK_REPEAT_MS - 1), 0);
    no_actions(a);
    assert_int_equal(cps__sync_tick(a, warned + CPS_SYNC_STUCK_REPEAT_MS), 0);
    only_action(a, CPS_SA_STUCK);
    /* Reporting does not release the slot. */
    assert_int_equal(cps__sync_pending(a), 1);
    cps__sync_destroy(a);
}

/* A tick whose clock was read a little before the push that opened the slot was stamped: the
 * slot has waited 0 ms, not 2^64 - 5 ms (the server logged "has waited 18446744073709552 s"). */
static void a_tick_earlier_than_the_push_does_not_report(void **state)
{
    (void)state;
    cps__view v;
    int dropped;
    cps__sync *a = setup_sync(&v, 2, &dropped);
    grad g = {.rank = 1};
    assert_int_equal(push(a, &v, 3, &g, 1000), CPS_SYNC_TAKEN);
    assert_int_equal(cps__sync_tick(a, 995), 0);
    no_actions(a);
    assert_int_equal(cps__sync_tick(a, 1000 + CPS_SYNC_STUCK_MS), 0);
    only_action(a, CPS_SA_STUCK);
    /* The same for the repeat: a tick read before the warning's time does not repeat it. */
    assert_int_equal(cps__sync_tick(a, 1000 + CPS_SYNC_STUCK_MS - 3), 0);
    no_actions(a);
    cps__sync_destroy(a);
}

/* A later step of a key set that completes first is held until the earlier open one is
 * submitted, then both go, in step order (the head takes a push at or below the last applied
 * step as a duplicate). Other key sets are not held; a step nobody pushed to does not hold. */
static void steps_of_a_key_set_are_submitted_in_order(void **state)
{
    (void)state;
    cps__view v;
    int dropped;
    cps__sync *a = setup_sync(&v, 2, &dropped);
    grad g[4] = {{.rank = 0}, {.rank = 0}, {.rank = 1}, {.rank = 1}};
    assert_int_equal(push(a, &v, 7, &g[0], 0), CPS_SYNC_TAKEN); /* step 7: rank 1 missing */
    assert_int_equal(push(a, &v, 8, &g[1], 0), CPS_SYNC_TAKEN);
    assert_int_equal(push(a, &v, 8, &g[2], 0), CPS_SYNC_TAKEN); /* step 8 complete: held */
    no_actions(a);
    assert_int_equal(cps__sync_pending(a), 2);
    /* A held slot is not reported stuck: the step it waits for is. */
    assert_int_equal(cps__sync_tick(a, CPS_SYNC_STUCK_MS), 0);
    assert_int_equal(only_action(a, CPS_SA_STUCK)->step, 7);
    /* Another key set completes on its own. */
    grad o = {.rank = 0}, o2 = {.rank = 1};
    cps__sync_contrib c = {10, CPS_MSG_PUSH, 1, 3, &o, 0};
    assert_int_equal(cps__sync_push(a, &v, 0, 0xdef, 9, 0, &c, 0), CPS_SYNC_TAKEN);
    c = (cps__sync_contrib){11, CPS_MSG_PUSH, 2, 3, &o2, 0};
    assert_int_equal(cps__sync_push(a, &v, 0, 0xdef, 9, 1, &c, 0), CPS_SYNC_TAKEN);
    assert_int_equal(only_action(a, CPS_SA_SUBMIT)->sig, 0xdef);

    assert_int_equal(push(a, &v, 7, &g[3], 0), CPS_SYNC_TAKEN);
    const cps__sync_action *acts;
    assert_int_equal(cps__sync_actions(a, &acts), 2);
    assert_int_equal(acts[0].kind, CPS_SA_SUBMIT);
    assert_int_equal(acts[0].step, 7);
    assert_ptr_equal(acts[0].by_rank[1].cookie, &g[3]);
    assert_int_equal(acts[1].kind, CPS_SA_SUBMIT);
    assert_int_equal(acts[1].step, 8);
    assert_ptr_equal(acts[1].by_rank[0].cookie, &g[1]);
    assert_int_equal(cps__sync_pending(a), 0);
    /* Both slots were released: the next step opens and completes on its own. */
    grad n0 = {.rank = 0}, n1 = {.rank = 1};
    assert_int_equal(push(a, &v, 9, &n0, 0), CPS_SYNC_TAKEN);
    assert_int_equal(push(a, &v, 9, &n1, 0), CPS_SYNC_TAKEN);
    assert_int_equal(only_action(a, CPS_SA_SUBMIT)->step, 9);
    assert_int_equal(dropped, 0);
    cps__sync_destroy(a);
}

static void a_released_slot_is_reused_for_the_next_step(void **state)
{
    (void)state;
    cps__view v;
    int dropped;
    cps__sync *a = setup_sync(&v, 1, &dropped);
    for (uint64_t step = 1; step <= 100; step++) {
        grad g = {.rank = 0};
        assert_int_equal(push(a, &v, step, &g, step), CPS_SYNC_TAKEN);
        const cps__sync_action *s = only_action(a, CPS_SA_SUBMIT);
        assert_int_equal(s->step, step);
        assert_int_equal(s->since_ms, step);
        assert_int_equal(cps__sync_pending(a), 0);
    }
    cps__sync_destroy(a);
    cps__sync_destroy(NULL);
}

/* ---- backup workers ---- */

/* What the server records once a SUBMIT's update is applied: the step and who made it. */
static void record_submit(cps__sync *a, const cps__sync_action *s)
{
    cps__sync_member m[NW];
    uint32_t n = 0;
    for (uint32_t r = 0; r < s->nranks; r++)
        if (s->by_rank[r].cookie)
            m[n++] = (cps__sync_member){s->by_rank[r].worker, s->by_rank[r].req_seq};
    assert_int_equal(cps__sync_record(a, s->range, s->sig, s->step, n, m), 0);
}

/* One push of rank g->rank for `step` with request number `seq`. */
static int push_seq(cps__sync *a, const cps__view *v, uint64_t step, uint64_t seq, grad *g)
{
    cps__sync_contrib c = {10 + g->rank, CPS_MSG_PUSH, seq, 3, g, 0};
    return cps__sync_push(a, v, 0, 0xabc, step, g->rank, &c, 0);
}

static void first_w_minus_b_close_the_step_and_the_last_is_late(void **state)
{
    (void)state;
    cps__view v;
    int dropped;
    cps__sync *a = setup_sync(&v, 3, &dropped);
    v.backup_workers = 1;
    grad g[3] = {{.rank = 0}, {.rank = 1}, {.rank = 2}};
    for (uint64_t step = 1; step <= 3; step++) {
        /* Rank 1 is the straggler: ranks 2 and 0 arrive first and make the step. */
        assert_int_equal(push_seq(a, &v, step, step, &g[2]), CPS_SYNC_TAKEN);
        no_actions(a);
        assert_int_equal(push_seq(a, &v, step, step, &g[0]), CPS_SYNC_TAKEN);
        const cps__sync_action *s = only_action(a, CPS_SA_SUBMIT);
        assert_int_equal(s->step, step);
        assert_int_equal(s->count, 2);
        assert_ptr_equal(s->by_rank[0].cookie, &g[0]);
        assert_null(s->by_rank[1].cookie);
        assert_ptr_equal(s->by_rank[2].cookie, &g[2]);
        assert_int_equal(cps__sync_pending(a), 0);
        /* Submitted is not applied: until the record says so the step is not closed. */
        assert_int_equal(cps__sync_check(a, 0, 0xabc, step, 11, step, NULL), CPS_SYNC_OPEN);
        record_submit(a, s);
        /* The straggler's push of the closed step: LATE, not held, no slot opened. */
        uint64_t closed = 0;
        assert_int_equal(cps__sync_check(a, 0, 0xabc, step, 11, step, &closed), CPS_SYNC_LATE);
        assert_int_equal(closed, step);
        assert_int_equal(push_seq(a, &v, step, step, &g[1]), CPS_SYNC_LATE);
        no_actions(a);
        assert_int_equal(cps__sync_pending(a), 0);
        /* A retry of an included push is no late one. */
        assert_int_equal(cps__sync_check(a, 0, 0xabc, step, 10, step, NULL), CPS_SYNC_APPLIED);
        assert_int_equal(push_seq(a, &v, step, step, &g[0]), CPS_SYNC_APPLIED);
        /* Other key sets and ranges are not closed by it. */
        assert_int_equal(cps__sync_check(a, 0, 0xdef, step, 11, step, NULL), CPS_SYNC_OPEN);
        assert_int_equal(cps__sync_check(a, 1, 0xabc, step, 11, step, NULL), CPS_SYNC_OPEN);
    }
    /* The straggler, caught up, makes the next step when it is among the first two. */
    assert_int_equal(push_seq(a, &v, 4, 4, &g[1]), CPS_SYNC_TAKEN);
    assert_int_equal(push_seq(a, &v, 4, 4, &g[2]), CPS_SYNC_TAKEN);
    const cps__sync_action *s = only_action(a, CPS_SA_SUBMIT);
    assert_null(s->by_rank[0].cookie);
    assert_ptr_equal(s->by_rank[1].cookie, &g[1]);
    cps__sync_destroy(a);
    assert_int_equal(dropped, 0);
}

/* A worker that joined a running job makes its first push (CPS_WF_FIRST) at a later step than
 * one the others are still gathering: it has no push of that step to come, so the step closes
 * without it (fmnist with a replaced worker deadlocked when one range closed step t without the
 * newcomer and another waited for it at t: issue 26). Whichever of the two pushes comes first. */
static void a_joiners_first_push_excuses_it_from_earlier_steps(void **state)
{
    (void)state;
    cps__view v;
    int dropped;
    cps__sync *a = setup_sync(&v, 2, &dropped);
    grad g[2] = {{.rank = 0, .vals = {1, 2, 3}}, {.rank = 1, .vals = {4, 5, 6}}};
    grad late0 = {.rank = 0};
    /* Rank 0 gathers step 455 alone; rank 1 (the newcomer) starts at 456. */
    assert_int_equal(push(a, &v, 455, &g[0], 0), CPS_SYNC_TAKEN);
    no_actions(a);
    cps__sync_contrib first = {11, CPS_MSG_PUSH, 1, 3, &g[1], 1};
    assert_int_equal(cps__sync_push(a, &v, 0, 0xabc, 456, 1, &first, 0), CPS_SYNC_TAKEN);
    const cps__sync_action *s = only_action(a, CPS_SA_SUBMIT);
    assert_int_equal(s->step, 455);
    assert_int_equal(s->count, 1);
    assert_ptr_equal(s->by_rank[0].cookie, &g[0]);
    assert_null(s->by_rank[1].cookie);
    /* From 456 on it is waited for like any worker. */
    assert_int_equal(push(a, &v, 456, &late0, 0), CPS_SYNC_TAKEN);
    s = only_action(a, CPS_SA_SUBMIT);
    assert_int_equal(s->step, 456);
    assert_int_equal(s->count, 2);
    /* The other order: the newcomer's first push reached this range before the others' push of
     * the step below it. */
    grad g2[2] = {{.rank = 0}, {.rank = 1}};
    first = (cps__sync_contrib){11, CPS_MSG_PUSH, 2, 3, &g2[1], 1};
    assert_int_equal(cps__sync_push(a, &v, 1, 0xabc, 458, 1, &first, 0), CPS_SYNC_TAKEN);
    no_actions(a);
    cps__sync_contrib c0 = {10, CPS_MSG_PUSH, 3, 3, &g2[0], 0};
    assert_int_equal(cps__sync_push(a, &v, 1, 0xabc, 457, 0, &c0, 0), CPS_SYNC_TAKEN);
    s = only_action(a, CPS_SA_SUBMIT);
    assert_int_equal(s->step, 457);
    assert_int_equal(s->count, 1);
    assert_int_equal(cps__sync_pending(a), 1); /* 458 waits for rank 0 */
    cps__sync_destroy(a);
    assert_int_equal(dropped, 1);
}

/* Only a first push excuses: a worker's later pushes may be pipelined, and one that overtook
 * the push before it on the way must not close that step without it. */
static void a_pipelined_later_push_does_not_excuse(void **state)
{
    (void)state;
    cps__view v;
    int dropped;
    cps__sync *a = setup_sync(&v, 2, &dropped);
    grad g[2] = {{.rank = 0}, {.rank = 1}};
    grad n1 = {.rank = 1};
    assert_int_equal(push(a, &v, 7, &g[0], 0), CPS_SYNC_TAKEN);
    assert_int_equal(push(a, &v, 8, &n1, 0), CPS_SYNC_TAKEN); /* rank 1's 8 overtook its 7 */
    no_actions(a);
    assert_int_equal(push(a, &v, 7, &g[1], 0), CPS_SYNC_TAKEN);
    const cps__sync_action *s = only_action(a, CPS_SA_SUBMIT);
    assert_int_equal(s->step, 7);
    assert_int_equal(s->count, 2);
    cps__sync_destroy(a);
    assert_int_equal(dropped, 1);
}

/* The replicated record of what an aggregate included, as a new head reads it from its store
 * after a failover: fed to an aggregator that never saw the step, the step stays closed. */
static void a_step_stays_closed_after_the_head_changes(void **state)
{
    (void)state;
    cps__view v;
    int dropped;
    cps__sync *old = setup_sync(&v, 3, &dropped);
    v.backup_workers = 1;
    grad g[3] = {{.rank = 0}, {.rank = 1}, {.rank = 2}};
    assert_int_equal(push_seq(old, &v, 9, 40, &g[1]), CPS_SYNC_TAKEN);
    assert_int_equal(push_seq(old, &v, 9, 41, &g[2]), CPS_SYNC_TAKEN);
    const cps__sync_action *s = only_action(old, CPS_SA_SUBMIT);
    record_submit(old, s);
    /* What the chain update carries: the step, and the requests included. */
    cps__sync_member members[3];
    uint32_t n = 0;
    for (uint32_t r = 0; r < s->nranks; r++)
        if (s->by_rank[r].cookie)
            members[n++] = (cps__sync_member){s->by_rank[r].worker, s->by_rank[r].req_seq};
    assert_int_equal(n, 2);
    uint64_t step = s->step;
    cps__sync_destroy(old); /* the head dies */

    cps__sync *head;
    assert_int_equal(cps__sync_create(drop, &dropped, &head), 0);
    /* Before the record: the new head would take the late push as new. */
    assert_int_equal(cps__sync_check(head, 0, 0xabc, 9, 10, 39, NULL), CPS_SYNC_OPEN);
    assert_int_equal(cps__sync_record(head, 0, 0xabc, step, n, members), 0);
    /* Records only move forward: an older one changes nothing. */
    assert_int_equal(cps__sync_record(head, 0, 0xabc, 3, n, members), 0);
    /* Rank 0's push of step 9, re-sent to the new head: still late. */
    assert_int_equal(push_seq(head, &v, 9, 39, &g[0]), CPS_SYNC_LATE);
    /* Ranks 1 and 2 re-send theirs: they are in the aggregate. */
    assert_int_equal(push_seq(head, &v, 9, 40, &g[1]), CPS_SYNC_APPLIED);
    assert_int_equal(push_seq(head, &v, 9, 41, &g[2]), CPS_SYNC_APPLIED);
    no_actions(head);
    assert_int_equal(cps__sync_pending(head), 0);
    /* Step 10 gathers as usual. */
    assert_int_equal(push_seq(head, &v, 10, 42, &g[0]), CPS_SYNC_TAKEN);
    assert_int_equal(push_seq(head, &v, 10, 43, &g[2]), CPS_SYNC_TAKEN);
    const cps__sync_action *s10 = only_action(head, CPS_SA_SUBMIT);
    assert_int_equal(s10->count, 2);
    record_submit(head, s10);
    /* Rank 0 made step 10: an old copy of its late step-9 push is stale now, neither applied
     * nor known to be late; its step-10 push is applied, rank 1's is late. */
    assert_int_equal(cps__sync_check(head, 0, 0xabc, 9, 10, 39, NULL), CPS_SYNC_STALE);
    assert_int_equal(push_seq(head, &v, 9, 39, &g[0]), CPS_SYNC_STALE);
    assert_int_equal(cps__sync_check(head, 0, 0xabc, 10, 10, 42, NULL), CPS_SYNC_APPLIED);
    assert_int_equal(cps__sync_check(head, 0, 0xabc, 10, 11, 44, NULL), CPS_SYNC_LATE);
    cps__sync_destroy(head);
    assert_int_equal(dropped, 0);
}

/* b = 0: a step waits for every live worker, and nothing is ever late (the chain answers a
 * closed step's pushes as duplicates, as before). */
static void no_backup_workers_waits_for_every_live_worker(void **state)
{
    (void)state;
    cps__view v;
    int dropped;
    cps__sync *a = setup_sync(&v, 3, &dropped);
    grad g[3] = {{.rank = 0}, {.rank = 1}, {.rank = 2}};
    assert_int_equal(push_seq(a, &v, 1, 1, &g[0]), CPS_SYNC_TAKEN);
    assert_int_equal(push_seq(a, &v, 1, 1, &g[2]), CPS_SYNC_TAKEN);
    no_actions(a);
    assert_int_equal(push_seq(a, &v, 1, 1, &g[1]), CPS_SYNC_TAKEN);
    const cps__sync_action *s = only_action(a, CPS_SA_SUBMIT);
    assert_int_equal(s->count, 3);
    record_submit(a, s);
    /* A closed step's push opens a slot, as it always did: b = 0 never answers LATE (the chain
     * answers it as a duplicate before it gets here). */
    assert_int_equal(push_seq(a, &v, 1, 2, &g[1]), CPS_SYNC_TAKEN);
    no_actions(a);
    cps__sync_destroy(a);
    assert_int_equal(dropped, 1);
}

/* W counts live workers, and a step needs at least one gradient whatever b is. */
static void backup_count_follows_the_live_workers_never_below_one(void **state)
{
    (void)state;
    cps__view v;
    int dropped;
    cps__sync *a = setup_sync(&v, 4, &dropped);
    v.backup_workers = 2;
    grad g[4] = {{.rank = 0}, {.rank = 1}, {.rank = 2}, {.rank = 3}};
    assert_int_equal(push_seq(a, &v, 1, 1, &g[3]), CPS_SYNC_TAKEN);
    no_actions(a);
    assert_int_equal(push_seq(a, &v, 1, 1, &g[1]), CPS_SYNC_TAKEN);
    const cps__sync_action *s1 = only_action(a, CPS_SA_SUBMIT);
    assert_int_equal(s1->count, 2);
    record_submit(a, s1);
    /* Two workers die: W = 2, b = 2, still one gradient is needed. */
    nodes[1 + 0].alive = 0;
    nodes[1 + 1].alive = 0;
    v.epoch++;
    assert_int_equal(cps__sync_set_view(a, &v), 0);
    no_actions(a);
    assert_int_equal(push_seq(a, &v, 2, 2, &g[2]), CPS_SYNC_TAKEN);
    const cps__sync_action *s = only_action(a, CPS_SA_SUBMIT);
    assert_int_equal(s->count, 1);
    assert_ptr_equal(s->by_rank[2].cookie, &g[2]);
    record_submit(a, s);
    assert_int_equal(push_seq(a, &v, 2, 2, &g[3]), CPS_SYNC_LATE);
    cps__sync_destroy(a);
    assert_int_equal(dropped, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(completes_exactly_when_every_live_worker_pushed),
        cmocka_unit_test(aggregate_is_bitwise_equal_in_every_arrival_order),
        cmocka_unit_test(dead_worker_is_no_longer_waited_for),
        cmocka_unit_test(push_of_a_worker_that_then_died_still_counts),
        cmocka_unit_test(retry_and_size_mismatch_leave_the_cookie_with_the_caller),
        cmocka_unit_test(steps_key_sets_and_ranges_are_separate_slots),
        cmocka_unit_test(a_stuck_step_is_reported_then_repeated),
        cmocka_unit_test(a_released_slot_is_reused_for_the_next_step),
        cmocka_unit_test(steps_of_a_key_set_are_submitted_in_order),
        cmocka_unit_test(first_w_minus_b_close_the_step_and_the_last_is_late),
        cmocka_unit_test(a_step_stays_closed_after_the_head_changes),
        cmocka_unit_test(a_joiners_first_push_excuses_it_from_earlier_steps),
        cmocka_unit_test(a_pipelined_later_push_does_not_excuse),
        cmocka_unit_test(a_tick_earlier_than_the_push_does_not_report),
        cmocka_unit_test(no_backup_workers_waits_for_every_live_worker),
        cmocka_unit_test(backup_count_follows_the_live_workers_never_below_one),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
