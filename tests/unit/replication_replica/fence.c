/* The fence, inside the replica (replica_fence.c): admission, doubt, death and dropped ranges. */
#include "fixture.h"

/* ---- the fence, inside the replica (replica_fence.c) ---- */

#define DEAD_AFTER 1000u

static cps__replica *new_fenced_replica(fake *f)
{
    cps__replica_env env = {f, f_seq, f_dedup, f_agg, f_check, f_scan, f_add, f_release, f_alloc};
    cps__replica_config cfg = {.self = SELF, .dead_after_ms = DEAD_AFTER, .start_ms = 0};
    cps__replica *r;
    assert_int_equal(cps__replica_create(&cfg, &env, &r), 0);
    return r;
}

/* A view from the scheduler as the shell hands it over: news first, then the install. Returns
 * cps__replica_view's verdict (or the news' when it says there is nothing to install). */
static int give_view(cps__replica *r, fake *f, uint64_t epoch, uint32_t nranges, int moved,
                     int self_alive, int welcome, uint64_t now)
{
    cps__view v;
    make_view(&v, epoch, CPS_MODE_ASYNC, nranges, moved);
    v.nodes[0].alive = self_alive;
    int rc = cps__replica_view_news(r, &v, SELF, welcome);
    perform(r, f);
    if (rc != CPS_RV_DONE)
        rc = cps__replica_view(r, &v, SELF, now);
    cps__view_fini(&v);
    return rc;
}

static cps__msg_hdr sched_hdr(uint8_t type, uint64_t epoch)
{
    cps__msg_hdr h = {.type = type, .sender = 0, .epoch = epoch};
    return h;
}

/* Not let in yet: only our own WELCOME comes through; a chain message is dropped, a worker's
 * request held until the view; the welcome's view drops the ranges it does not give us. */
void a_replica_not_let_in_takes_only_its_welcome(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_fenced_replica(&f);
    cps__msg_hdr h = sched_hdr(CPS_MSG_VIEW, 3);
    h.req_seq = 7;
    assert_int_equal(cps__replica_admit(r, &h, 7, 1), CPS_FENCE_DROP); /* only a WELCOME */
    h = sched_hdr(CPS_MSG_WELCOME, 3);
    h.req_seq = 6; /* the WELCOME of the life before ours (boot id 7), late */
    assert_int_equal(cps__replica_admit(r, &h, 7, 1), CPS_FENCE_DROP);
    h.req_seq = 0; /* the scheduler knew no HELLO of ours */
    assert_int_equal(cps__replica_admit(r, &h, 0, 1), CPS_FENCE_DROP);
    h.req_seq = 7;
    assert_int_equal(cps__replica_admit(r, &h, 7, 1), CPS_FENCE_SERVE);
    cps__replica_msg m = request(&f, CPS_MSG_FWD, 2, 3, 1, 0, 1, 2);
    cps__replica_step(r, &m, 2);
    assert_string_equal(perform(r, &f), "");
    assert_int_equal(cps__replica_held(r), 0);
    m = request(&f, CPS_MSG_PUSH, W1, 3, 1, 0, 1, 2);
    cps__replica_step(r, &m, 3);
    assert_int_equal(f.released, 1); /* the FWD was dropped (given back at the next call) */
    assert_int_equal(cps__replica_held(r), 1); /* a worker heard its WELCOME before we did */
    cps__view v;
    make_view(&v, 3, CPS_MODE_ASYNC, 2, 1);
    assert_int_equal(cps__replica_view_news(r, &v, SELF, 1), CPS_RV_LET_IN);
    assert_int_equal(cps__replica_view(r, &v, SELF, 4), CPS_RV_INSTALLED);
    cps__view_fini(&v);
    const cps__replica_out *d = item(r, CPS_RO_DROP_RANGE, 0);
    assert_int_equal(d->range, 1); /* range 1 is server 2's: stale here */
    assert_int_equal(d->moved, 0);
    assert_string_equal(perform(r, &f), "D");
    assert_int_equal(cps__fence_joined(cps__replica_fence(r)), 1);
    assert_int_equal(cps__replica_next(r, 5), 1);
    assert_string_equal(perform(r, &f), "WR");
    finish(r, &f);
}

/* A loop that did not turn for longer than the failure timeout: unsure, it asks for the view,
 * drops requests unanswered, asks again while no answer comes, and serves once the scheduler's
 * view says it is still in. */
void an_unsure_replica_asks_and_drops_until_confirmed(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_fenced_replica(&f);
    assert_int_equal(give_view(r, &f, 3, 1, 0, 1, 1, 0), CPS_RV_INSTALLED);
    cps__replica_turned(r, 500);
    assert_string_equal(perform(r, &f), "");
    cps__replica_msg m = request(&f, CPS_MSG_PUSH, W1, 3, 1, 0, 1, 2);
    cps__replica_step(r, &m, 500 + DEAD_AFTER + 1);
    assert_string_equal(perform(r, &f), "A"); /* dropped, and the view asked for */
    assert_int_equal(cps__fence_unsure(cps__replica_fence(r)), 1);
    m = request(&f, CPS_MSG_PUSH, W1, 3, 1, 0, 1, 2);
    cps__replica_step(r, &m, 1600);
    assert_string_equal(perform(r, &f), "");
    assert_int_equal(cps__fence_dropped(cps__replica_fence(r)), 2);
    cps__replica_turned(r, 1600 + DEAD_AFTER + 1);
    assert_string_equal(perform(r, &f), "A"); /* no answer: asked again */
    /* A newer view would install; the one we hold, counting us in, confirms. */
    assert_int_equal(give_view(r, &f, 3, 1, 0, 1, 0, 2700), CPS_RV_DONE);
    assert_int_equal(cps__fence_unsure(cps__replica_fence(r)), 0);
    m = request(&f, CPS_MSG_PUSH, W1, 3, 1, 0, 1, 2);
    cps__replica_step(r, &m, 2701);
    assert_string_equal(perform(r, &f), "WR");
    finish(r, &f);
}

/* A view counting us dead fences the replica: nothing installed, nothing served but the
 * scheduler's SHUTDOWN; an older view changes nothing. */
void a_view_counting_us_dead_fences_the_replica(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_fenced_replica(&f);
    assert_int_equal(give_view(r, &f, 3, 2, 0, 1, 1, 0), CPS_RV_INSTALLED);
    assert_int_equal(give_view(r, &f, 2, 2, 1, 1, 0, 1), CPS_RV_DONE); /* older */
    assert_int_equal(give_view(r, &f, 4, 2, 1, 0, 0, 2), CPS_RV_FENCED);
    assert_string_equal(perform(r, &f), ""); /* no DROP_RANGE: the view is not ours */
    assert_int_equal(cps__fence_fenced(cps__replica_fence(r)), 1);
    assert_int_equal(cps__fence_beating(cps__replica_fence(r)), 0);
    cps__replica_msg m = request(&f, CPS_MSG_PUSH, W1, 3, 1, 0, 1, 2);
    cps__replica_step(r, &m, 3);
    assert_string_equal(perform(r, &f), "");
    cps__msg_hdr h = sched_hdr(CPS_MSG_VIEW, 5);
    assert_int_equal(cps__replica_admit(r, &h, 7, 4), CPS_FENCE_DROP);
    h = sched_hdr(CPS_MSG_SHUTDOWN, 5);
    assert_int_equal(cps__replica_admit(r, &h, 7, 4), CPS_FENCE_SERVE);
    finish(r, &f);
}

/* Staying in, a view that takes a range from us yields its DROP_RANGE (moved); a JOIN_RANGE
 * from anyone but the scheduler is dropped. */
void a_view_taking_a_range_yields_its_drop(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_fenced_replica(&f);
    assert_int_equal(give_view(r, &f, 3, 2, 0, 1, 1, 0), CPS_RV_INSTALLED);
    cps__view v;
    make_view(&v, 4, CPS_MODE_ASYNC, 2, 1);
    assert_int_equal(cps__replica_view_news(r, &v, SELF, 0), CPS_RV_NEWER);
    assert_int_equal(cps__replica_view(r, &v, SELF, 1), CPS_RV_INSTALLED);
    cps__view_fini(&v);
    const cps__replica_out *d = item(r, CPS_RO_DROP_RANGE, 0);
    assert_int_equal(d->range, 1);
    assert_int_equal(d->moved, 1);
    assert_string_equal(perform(r, &f), "D");
    cps__replica_msg m = request(&f, CPS_MSG_JOIN_RANGE, 2, 4, 1, 0, 1, 2);
    cps__replica_step(r, &m, 2);
    assert_string_equal(perform(r, &f), "");
    assert_int_equal(cps__replica_joining(r, 1), 0);
    finish(r, &f);
}

/* A finished snapshot's socket goes once it holds nothing the joiner needs: the joiner is in the
 * range's chain, dead or gone, the send failed, or it lingered long enough; never earlier. */
void a_snapshot_socket_closes_only_when_the_joiner_needs_nothing_more(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_replica(&f);
    set_view(r, 3, CPS_MODE_ASYNC, 2, 1, 1); /* range 0: {SELF}; range 1: {2} */
    const uint64_t end = 5000, in_time = end + CPS_REPLICA_SNAP_LINGER_MS;
    /* Node 2 is alive and not in range 0's chain yet: the last chunk may still be queued. */
    assert_int_equal(cps__replica_snapshot_may_close(r, 0, 2, 0, end, end), 0);
    assert_int_equal(cps__replica_snapshot_may_close(r, 0, 2, 0, end, in_time), 0);
    assert_int_equal(cps__replica_snapshot_may_close(r, 0, 2, 0, end, in_time + 1), 1);
    assert_int_equal(cps__replica_snapshot_may_close(r, 0, 2, CPS_EIO, end, end), 1);
    /* A range we do not know: only failure or lingering end it. */
    assert_int_equal(cps__replica_snapshot_may_close(r, 7, 2, 0, end, end), 0);
    /* In the chain of range 1: it had everything. */
    assert_int_equal(cps__replica_snapshot_may_close(r, 1, 2, 0, end, end), 1);
    /* A node the view does not name: nobody to wait for. */
    assert_int_equal(cps__replica_snapshot_may_close(r, 0, 77, 0, end, end), 1);
    /* Node 2 counted dead. */
    cps__view v;
    make_view(&v, 4, CPS_MODE_ASYNC, 2, 0);
    v.nodes[1].alive = 0;
    assert_int_equal(cps__replica_set_view(r, &v, SELF, 0, 0), 0);
    cps__view_fini(&v);
    assert_int_equal(cps__replica_snapshot_may_close(r, 0, 2, 0, end, end), 1);
    finish(r, &f);
}
