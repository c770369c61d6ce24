/* What a message becomes in the replica, and in which order the ready list says it: writes,
 * forwards, marks, epochs, sync steps, push-pull replies, transfers and joins. */
#include "fixture.h"

void a_push_is_written_before_it_is_acknowledged(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_replica(&f);
    set_view(r, 3, CPS_MODE_ASYNC, 1, 0, 1);
    perform(r, &f);
    cps__replica_msg m = request(&f, CPS_MSG_PUSH, W1, 3, 1, 0, 1, 2);
    cps__replica_step(r, &m, 10);
    const cps__replica_out *w = item(r, CPS_RO_WRITE, 0);
    assert_int_equal(w->upd.kind, CPS_UPD_PUSH);
    assert_int_equal(w->seq, 1);
    assert_int_equal(w->nrecs, 1);
    assert_int_equal(w->recs[0].id, W1);
    assert_int_equal(w->recs[0].value, 1);
    const cps__replica_out *a = item(r, CPS_RO_REPLY, 0);
    assert_int_equal(a->hdr.type, CPS_MSG_ACK);
    assert_int_equal(a->to, W1);
    assert_string_equal(perform(r, &f), "WR");
    /* The same push again: a duplicate, acknowledged and never written twice. */
    m = request(&f, CPS_MSG_PUSH, W1, 3, 1, 0, 1, 2);
    cps__replica_step(r, &m, 11);
    assert_string_equal(perform(r, &f), "R");
    finish(r, &f);
}

/* Forward before apply: the head of a chain of two puts the FWD right before the update's
 * WRITE (the successor receives while the head writes), and at the end of the loop turn (the
 * tick) the CHAIN_MARK that says it is applied, header only; it answers nothing (the tail
 * does). */
void the_head_forwards_before_it_writes_and_then_says_it_applied(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_replica(&f);
    cps__view v;
    make_view(&v, 3, CPS_MODE_ASYNC, 1, 0);
    v.ranges[0].chain_len = 2;
    v.ranges[0].chain[1] = 2;
    assert_int_equal(cps__replica_set_view(r, &v, SELF, 1, 0), 0);
    cps__view_fini(&v);
    perform(r, &f);
    cps__replica_msg m = request(&f, CPS_MSG_PUSH, W1, 3, 1, 0, 1, 2);
    cps__replica_step(r, &m, 10);
    const cps__replica_out *fwd = item(r, CPS_RO_SEND, 0);
    assert_int_equal(fwd->hdr.type, CPS_MSG_FWD);
    assert_int_equal(fwd->to, 2);
    assert_int_equal(fwd->hdr.req_seq, 1);
    assert_int_equal(fwd->hdr.aux, 0); /* sent before its own write: applied up to 0 */
    assert_int_equal(fwd->resend, 0);
    assert_int_equal(item(r, CPS_RO_WRITE, 0)->seq, 1);
    assert_string_equal(perform(r, &f), "SW");
    assert_int_equal(cps__replica_wait_ms(r, 10, 1000), 0); /* a MARK waits for the tick */
    cps__replica_tick(r, 10, 0);
    const cps__replica_out *mark = item(r, CPS_RO_SEND, 0);
    assert_int_equal(mark->hdr.type, CPS_MSG_CHAIN_MARK);
    assert_int_equal(mark->hdr.aux, CPS_CHAIN_MARK_APPLIED);
    assert_int_equal(mark->hdr.req_seq, 1);
    assert_int_equal(mark->to, 2);
    assert_null(mark->msg);
    assert_string_equal(perform(r, &f), "S");
    assert_int_equal(cps__replica_wait_ms(r, 10, 1000), 1000);
    finish(r, &f);
}

/* An async view of epoch `epoch` with ranges 0 and 1 both on the chain 1 -> 2. */
static void two_chains_view(cps__view *v, uint64_t epoch)
{
    make_view(v, epoch, CPS_MODE_ASYNC, 2, 0);
    for (uint32_t k = 0; k < 2; k++) {
        v->ranges[k].chain_len = 2;
        v->ranges[k].chain[1] = 2;
    }
}

/* A replica at the head of both ranges of two_chains_view (epoch 3). */
static cps__replica *head_of_two_ranges(fake *f)
{
    cps__replica *r = new_replica(f);
    cps__view v;
    two_chains_view(&v, 3);
    assert_int_equal(cps__replica_set_view(r, &v, SELF, 1, 0), 0);
    cps__view_fini(&v);
    perform(r, f);
    return r;
}

/* Several updates of a range in one loop turn: one CHAIN_MARK at its end, with the highest
 * seq (the successor applies every FWD it holds up to it). Its counters: three FWDs and one MARK
 * sent, two MARKs merged. */
void a_turn_of_updates_sends_one_mark_per_range_with_the_highest_seq(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = head_of_two_ranges(&f);
    cps__view v;
    for (uint64_t q = 1; q <= 3; q++) {
        cps__replica_msg m = request(&f, CPS_MSG_PUSH, W1, 3, q, 0, 1, 2);
        cps__replica_step(r, &m, 10);
        assert_string_equal(perform(r, &f), "SW");
        assert_int_equal(item(r, CPS_RO_WRITE, 0)->seq, q);
    }
    cps__replica_tick(r, 10, 0);
    const cps__replica_out *mark = item(r, CPS_RO_SEND, 0);
    assert_int_equal(mark->hdr.type, CPS_MSG_CHAIN_MARK);
    assert_int_equal(mark->hdr.range, 0);
    assert_int_equal(mark->hdr.req_seq, 3);
    assert_int_equal(mark->hdr.aux, CPS_CHAIN_MARK_APPLIED);
    assert_string_equal(perform(r, &f), "S");
    const cps__replica_counters *c = cps__replica_counts(r);
    assert_int_equal(c->chain_sends, 4);
    assert_int_equal(c->marks_sent, 1);
    assert_int_equal(c->marks_merged, 2);
    /* The next turn starts afresh: nothing held, nothing sent again. */
    cps__replica_tick(r, 11, 0);
    assert_string_equal(perform(r, &f), "");
    /* A view change sends the held MARK first, under the view it was made in. */
    cps__replica_msg m = request(&f, CPS_MSG_PUSH, W1, 3, 4, 0, 1, 2);
    cps__replica_step(r, &m, 12);
    perform(r, &f);
    two_chains_view(&v, 4);
    assert_int_equal(cps__replica_set_view(r, &v, SELF, 0, 12), 0);
    cps__view_fini(&v);
    mark = item(r, CPS_RO_SEND, 0);
    assert_int_equal(mark->hdr.type, CPS_MSG_CHAIN_MARK);
    assert_int_equal(mark->hdr.req_seq, 4);
    assert_int_equal(mark->hdr.epoch, 3);
    perform(r, &f);
    finish(r, &f);
}

/* A held MARK waits only for updates of its own range: the FWD and write of another range's
 * update come after it (a sync step's MARK waited at the end of the turn for the other range's
 * write), while a second update of the range replaces it. */
void a_held_mark_goes_before_another_ranges_update(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = head_of_two_ranges(&f);
    cps__replica_msg m = request(&f, CPS_MSG_PUSH, W1, 3, 1, 0, 1, 2);
    cps__replica_step(r, &m, 10);
    assert_string_equal(perform(r, &f), "SW"); /* range 0's MARK held */
    m = request_of(&f, CPS_MSG_PUSH, W2, 3, 1, 0, 1, 2, 1005, 1);
    cps__replica_step(r, &m, 10);
    const cps__replica_out *mark = item(r, CPS_RO_SEND, 0);
    assert_int_equal(mark->hdr.type, CPS_MSG_CHAIN_MARK);
    assert_int_equal(mark->hdr.range, 0);
    assert_int_equal(mark->hdr.req_seq, 1);
    assert_int_equal(mark->hdr.aux, CPS_CHAIN_MARK_APPLIED);
    assert_int_equal(item(r, CPS_RO_SEND, 1)->hdr.type, CPS_MSG_FWD);
    assert_int_equal(item(r, CPS_RO_WRITE, 0)->range, 1);
    assert_string_equal(perform(r, &f), "SSW");
    m = request_of(&f, CPS_MSG_PUSH, W2, 3, 2, 0, 1, 2, 1005, 1);
    cps__replica_step(r, &m, 10);
    assert_string_equal(perform(r, &f), "SW"); /* range 1's MARK replaced, not sent */
    cps__replica_tick(r, 10, 0);
    mark = item(r, CPS_RO_SEND, 0);
    assert_int_equal(mark->hdr.type, CPS_MSG_CHAIN_MARK);
    assert_int_equal(mark->hdr.range, 1);
    assert_int_equal(mark->hdr.req_seq, 2);
    assert_string_equal(perform(r, &f), "S");
    const cps__replica_counters *c = cps__replica_counts(r);
    assert_int_equal(c->marks_sent, 2);
    assert_int_equal(c->marks_merged, 1);
    finish(r, &f);
}

/* A refused push still uses up its number: replicated as a SKIP, answered with its error once
 * written, and its record never moves the worker's number back. */
void an_undeclared_key_becomes_a_skip_answered_with_its_error(void **state)
{
    (void)state;
    fake f = {0};
    cps__replica *r = new_replica(&f);
    set_view(r, 3, CPS_MODE_ASYNC, 1, 0, 1);
    perform(r, &f);
    cps__replica_msg m = request(&f, CPS_MSG_PUSH, W1, 3, 1, 0, 1, 2);
    cps__replica_step(r, &m, 10);
    const cps__replica_out *w = item(r, CPS_RO_WRITE, 0);
    assert_int_equal(w->upd.kind, CPS_UPD_SKIP);
    assert_int_equal(w->nrecs, 1);
    assert_int_equal(w->recs[0].value, 1);
    assert_int_equal(item(r, CPS_RO_REPLY, 0)->status, CPS_ENOTFOUND);
    assert_string_equal(perform(r, &f), "WR");
    finish(r, &f);
}

void a_message_of_a_future_epoch_waits_for_its_view(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_replica(&f);
    set_view(r, 3, CPS_MODE_ASYNC, 1, 0, 1);
    perform(r, &f);
    cps__replica_msg m = request(&f, CPS_MSG_PUSH, W1, 4, 1, 0, 1, 2);
    cps__replica_step(r, &m, 10);
    assert_string_equal(perform(r, &f), "A");
    assert_int_equal(cps__replica_held(r), 1);
    set_view(r, 4, CPS_MODE_ASYNC, 1, 0, 0);
    assert_string_equal(perform(r, &f), "");
    assert_int_equal(cps__replica_next(r, 20), 1);
    assert_string_equal(perform(r, &f), "WR");
    assert_int_equal(cps__replica_next(r, 20), 0);
    assert_int_equal(cps__replica_held(r), 0);
    finish(r, &f);
}

/* Requests that came before our first view are stepped once it is here, in order. */
void deferred_requests_are_stepped_after_the_first_view(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_replica(&f);
    cps__replica_msg m = request(&f, CPS_MSG_PUSH, W1, 3, 1, 0, 1, 2);
    cps__replica_defer(r, &m);
    m = request(&f, CPS_MSG_PUSH, W1, 3, 2, 0, 1, 2);
    cps__replica_defer(r, &m);
    assert_string_equal(perform(r, &f), "");
    set_view(r, 3, CPS_MODE_ASYNC, 1, 0, 1);
    perform(r, &f);
    assert_int_equal(cps__replica_next(r, 20), 1);
    assert_string_equal(perform(r, &f), "WR");
    assert_int_equal(cps__replica_next(r, 20), 1);
    assert_int_equal(item(r, CPS_RO_WRITE, 0)->recs[0].value, 2);
    perform(r, &f);
    assert_int_equal(cps__replica_next(r, 20), 0);
    finish(r, &f);
}

/* Sync: one update per step, the sum in rank order, both workers' records in it. */
void a_sync_step_is_written_once_with_the_sum(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_replica(&f);
    set_view(r, 3, CPS_MODE_SYNC, 1, 0, 1);
    perform(r, &f);
    cps__replica_msg m = request(&f, CPS_MSG_PUSH, W2, 3, 1, 1, 10, 20);
    cps__replica_step(r, &m, 10);
    assert_string_equal(perform(r, &f), "");
    m = request(&f, CPS_MSG_PUSH, W1, 3, 1, 1, 1, 2);
    cps__replica_step(r, &m, 11);
    const cps__replica_out *w = item(r, CPS_RO_WRITE, 0);
    assert_int_equal(w->upd.nreqs, 2);
    assert_int_equal(w->upd.reqs[0].worker, W1); /* rank 0 first */
    assert_true(w->upd.sig != 0);
    cps__kv kv;
    assert_int_equal(cps__wire_kv_decode(w->upd.body, w->upd.body_len, 1, &kv), 0);
    assert_true(kv.vals[0] == 11.0f && kv.vals[1] == 22.0f);
    assert_string_equal(perform(r, &f), "WRR");
    assert_int_equal(f.agg_step[0], 1);
    finish(r, &f);
}

/* SSP, bound 0: a push-pull's push is written at once, its values wait for the other worker. */
void a_push_pull_reply_waits_for_the_slowest_worker(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_replica(&f);
    set_view(r, 3, CPS_MODE_SSP, 1, 0, 1);
    perform(r, &f);
    cps__replica_msg m = request(&f, CPS_MSG_PUSH_PULL, W1, 3, 1, 1, 1, 2);
    cps__replica_step(r, &m, 10);
    assert_string_equal(perform(r, &f), "W");
    const uint64_t *clock = rec(&f, 0, W1 | CPS_DEDUP_CLOCK_BIT, 0); /* the clock, written */
    assert_non_null(clock);
    assert_int_equal(*clock, 1);
    m = request(&f, CPS_MSG_PUSH, W2, 3, 1, 1, 1, 2);
    cps__replica_step(r, &m, 11);
    const cps__replica_out *v = item(r, CPS_RO_REPLY, 1);
    assert_int_equal(v->hdr.type, CPS_MSG_VALUES);
    assert_int_equal(v->to, W1);
    assert_int_equal(v->kv.nkeys, 1);
    assert_string_equal(perform(r, &f), "WRR");
    finish(r, &f);
}

/* A header-only CHAIN_ACK of range 0 up to `seq` from server 2, owned by the replica. */
static cps__replica_msg chain_ack(fake *f, uint64_t epoch, uint64_t seq)
{
    cps__replica_msg m = {.owner = malloc(1)};
    m.hdr.type = CPS_MSG_CHAIN_ACK;
    m.hdr.sender = 2;
    m.hdr.epoch = epoch;
    m.hdr.req_seq = seq;
    f->owners++;
    return m;
}

/* A replica at the head of range 0's chain 1 -> 2, async, its view performed. */
static cps__replica *head_of_two(fake *f)
{
    cps__replica *r = new_replica(f);
    cps__view v;
    make_view(&v, 3, CPS_MODE_ASYNC, 1, 0);
    v.replicas = 2;
    v.ranges[0].chain_len = 2;
    v.ranges[0].chain[1] = 2;
    assert_int_equal(cps__replica_set_view(r, &v, SELF, 1, 0), 0);
    cps__view_fini(&v);
    perform(r, f);
    return r;
}

/* Async, range 0 on the chain 1 -> 2 (we are its head). A retried push-pull is a duplicate the
 * head answers itself, with values read from its store: not before that store holds committed
 * updates only (simulator --push-pull, seed 4). Answered at its own update's commit point, it
 * read W2's push, which the tail had not applied. */
void a_retried_push_pull_is_not_answered_before_commit(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = head_of_two(&f);
    cps__replica_msg m = request(&f, CPS_MSG_PUSH_PULL, W1, 3, 1, 1, 1, 2);
    cps__replica_step(r, &m, 10);
    assert_string_equal(perform(r, &f), "SW"); /* forwarded, applied; the tail answers */
    m = request(&f, CPS_MSG_PUSH_PULL, W1, 3, 1, 1, 1, 2); /* the worker's retry */
    cps__replica_step(r, &m, 11);
    assert_string_equal(perform(r, &f), ""); /* a duplicate: waits for seq 1 to commit */
    m = request(&f, CPS_MSG_PUSH, W2, 3, 1, 1, 3, 4);
    cps__replica_step(r, &m, 12);
    assert_string_equal(perform(r, &f), "SW"); /* seq 2: the store now holds W2's push */
    m = chain_ack(&f, 3, 1);
    cps__replica_step(r, &m, 13);
    /* Seq 1 is committed, but the store holds seq 2, which is not: no answer. */
    assert_string_equal(perform(r, &f), "");
    /* Meanwhile new updates of the range wait: the store must stop moving for the answer. */
    m = request(&f, CPS_MSG_PUSH, W2, 3, 2, 2, 5, 6);
    cps__replica_step(r, &m, 14);
    assert_int_equal(item(r, CPS_RO_REPLY, 0)->status, CPS_EAGAIN);
    assert_string_equal(perform(r, &f), "R");
    m = chain_ack(&f, 3, 2);
    cps__replica_step(r, &m, 15);
    const cps__replica_out *o = item(r, CPS_RO_REPLY, 0);
    assert_int_equal(o->hdr.type, CPS_MSG_VALUES);
    assert_int_equal(o->to, W1);
    assert_int_equal(o->hdr.req_seq, 1);
    assert_int_equal(o->kv.nkeys, 1);
    assert_int_equal(o->kv.keys[0], KEY);
    /* The MARK of seq 2, held since its write (no tick here), goes before the values' read. */
    assert_int_equal(item(r, CPS_RO_SEND, 0)->hdr.type, CPS_MSG_CHAIN_MARK);
    assert_int_equal(item(r, CPS_RO_SEND, 0)->hdr.req_seq, 2);
    assert_string_equal(perform(r, &f), "SR");
    assert_int_equal(f.seq[0], 2);
    /* Committed again: W2's re-sent push is taken. */
    m = request(&f, CPS_MSG_PUSH, W2, 3, 2, 2, 5, 6);
    cps__replica_step(r, &m, 16);
    assert_string_equal(perform(r, &f), "SW");
    finish(r, &f);
}

/* A tick whose clock was read before the step it follows was stamped (a shell reads its clock
 * once per loop turn) does not take the forwarded update for one waiting 2^64 ms: no re-send.
 * The chain's re-send comes when the real wait is over. */
void a_tick_with_an_earlier_clock_does_not_resend(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = head_of_two(&f);
    cps__replica_msg m = request(&f, CPS_MSG_PUSH, W1, 3, 1, 1, 1, 2);
    cps__replica_step(r, &m, 1000);
    assert_string_equal(perform(r, &f), "SW");
    cps__replica_tick(r, 995, 0);
    assert_int_equal(item(r, CPS_RO_SEND, 0)->hdr.type, CPS_MSG_CHAIN_MARK); /* the turn's MARK */
    assert_string_equal(perform(r, &f), "S");
    cps__replica_tick(r, 1000 + 60000, 0);
    assert_true(strchr(perform(r, &f), 'S') != NULL); /* unacknowledged: re-sent in time */
    finish(r, &f);
}

/* A view that moves a range to another server drops our copy of it; the others stay. */
void a_range_moved_away_is_dropped(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_replica(&f);
    set_view(r, 3, CPS_MODE_ASYNC, 2, 0, 1);
    assert_string_equal(perform(r, &f), "");
    set_view(r, 4, CPS_MODE_ASYNC, 2, 1, 0);
    const cps__replica_out *d = item(r, CPS_RO_DROP_RANGE, 0);
    assert_int_equal(d->range, 1);
    assert_int_equal(d->moved, 1);
    assert_string_equal(perform(r, &f), "D");
    /* Let in afresh by a view that does not give us range 1: what we hold of it is stale. */
    cps__replica_destroy(r);
    r = new_replica(&f);
    set_view(r, 5, CPS_MODE_ASYNC, 2, 1, 1);
    assert_int_equal(item(r, CPS_RO_DROP_RANGE, 0)->moved, 0);
    finish(r, &f);
}

/* A restore's PUT is judged "not head" before its records are: a node that no longer heads the
 * range (or has no view yet) must say so, whatever its store holds. The question changes
 * nothing. */
void a_put_verdict_says_not_head_before_any_record_is_read(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_replica(&f);
    assert_int_equal(cps__replica_put_verdict(r, 0), CPS_ADMIT_NOT_HEAD); /* no view yet */
    set_view(r, 3, CPS_MODE_ASYNC, 2, 1, 1);
    perform(r, &f);
    const cps__replica_out *o;
    size_t ready = cps__replica_ready(r, &o);
    assert_int_equal(cps__replica_put_verdict(r, 0), CPS_ADMIT_NEW);
    assert_int_equal(cps__replica_put_verdict(r, 1), CPS_ADMIT_NOT_HEAD); /* server 2 heads it */
    assert_int_equal(cps__replica_put_verdict(r, 7), CPS_ADMIT_NOT_HEAD); /* no such range */
    assert_int_equal(cps__replica_ready(r, &o), ready); /* the ready list is untouched */
    finish(r, &f);
}

void a_request_for_a_stale_epoch_or_another_head_is_refused(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_replica(&f);
    set_view(r, 3, CPS_MODE_ASYNC, 2, 1, 1);
    perform(r, &f);
    cps__replica_msg m = request(&f, CPS_MSG_PUSH, W1, 2, 1, 0, 1, 2);
    cps__replica_step(r, &m, 10);
    assert_int_equal(item(r, CPS_RO_REPLY, 0)->status, CPS_ESTALE_EPOCH);
    assert_string_equal(perform(r, &f), "R");
    m = request(&f, CPS_MSG_PUSH, W1, 3, 1, 0, 1, 2);
    m.hdr.range = 1; /* served by server 2 */
    cps__replica_step(r, &m, 10);
    assert_int_equal(item(r, CPS_RO_REPLY, 0)->status, CPS_ESTALE_EPOCH);
    m = request(&f, CPS_MSG_PUSH, 77, 3, 1, 0, 1, 2); /* no such worker: ask for the view */
    cps__replica_step(r, &m, 10);
    assert_string_equal(perform(r, &f), "A");
    assert_int_equal(cps__replica_counts(r)->msgs_bad, 1);
    finish(r, &f);
}

/* A header-only message of state transfer (payload: `len` zero bytes), owned by the replica. */
static cps__replica_msg transfer_msg(fake *f, uint8_t type, uint32_t from, uint64_t epoch,
                                     uint32_t range, uint64_t step, uint64_t aux, size_t len)
{
    cps__replica_msg m = {.len = len};
    m.owner = calloc(1, len ? len : 1);
    m.payload = m.owner;
    m.hdr.type = type;
    m.hdr.sender = from;
    m.hdr.epoch = epoch;
    m.hdr.range = range;
    m.hdr.step = step;
    m.hdr.aux = aux;
    f->owners++;
    return m;
}

/* The SEND item of message type `type` in the ready list, or NULL. */
static const cps__replica_out *sent(cps__replica *r, uint8_t type)
{
    const cps__replica_out *o;
    size_t n = cps__replica_ready(r, &o);
    for (size_t i = 0; i < n; i++)
        if (o[i].kind == CPS_RO_SEND && o[i].hdr.type == type)
            return &o[i];
    return NULL;
}

/* Out of memory for the FWD's ready-list item: no message buffer is taken from msg_alloc
 * without an item that hands it to the shell (a buffer may be a reserved ring slot the transport
 * must get back), and the chain re-sends the FWD later as if it had been lost. */
void a_send_without_room_in_the_ready_list_takes_no_buffer(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = head_of_two(&f);
    int before = f.msgs;
    fail_next_item = 1;
    cps__replica_msg m = request(&f, CPS_MSG_PUSH, W1, 3, 1, 1, 1, 2);
    cps__replica_step(r, &m, 1000);
    assert_int_equal(fail_next_item, 0); /* the FWD's item was the one refused */
    assert_int_equal(f.msgs, before);
    assert_string_equal(perform(r, &f), "W");
    assert_int_equal(f.msgs_freed, f.msgs); /* nothing of msg_alloc is left unowned */
    cps__replica_tick(r, 1000 + 60000, 0);
    const cps__replica_out *fwd = sent(r, CPS_MSG_FWD);
    assert_non_null(fwd);
    assert_int_equal(fwd->hdr.req_seq, 1);
    assert_int_equal(fwd->to, 2);
    perform(r, &f);
    assert_int_equal(f.msgs_freed, f.msgs);
    finish(r, &f);
}

/* The chunks' numbers travel in the header's req_worker: a stream that lost chunk 1 (nanomsg
 * reconnected under it) has its last chunk refused, the join given up and the scheduler told at
 * once (CAUGHT_UP aux 2), so it orders another. */
void a_snapshot_stream_with_a_gap_is_not_installed(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_replica(&f);
    set_view(r, 3, CPS_MODE_ASYNC, 2, 1, 1);
    perform(r, &f);
    cps__replica_msg m = transfer_msg(&f, CPS_MSG_JOIN_RANGE, 0, 3, 1, 7, 2, 0);
    cps__replica_step(r, &m, 10);
    assert_string_equal(perform(r, &f), "C");
    assert_int_equal(cps__replica_join_result(r, 1, 0, 0, 10), 0);
    assert_string_equal(perform(r, &f), "S");              /* SNAP_REQ */
    m = transfer_msg(&f, CPS_MSG_SNAP, 2, 3, 1, 7, 0, 16); /* chunk 0 */
    cps__replica_step(r, &m, 20);
    assert_string_equal(perform(r, &f), "I");
    assert_false(item(r, CPS_RO_JOIN_INSTALL, 0)->last);
    assert_int_equal(cps__replica_join_result(r, 1, 0, 0, 20), 0);
    perform(r, &f);
    m = transfer_msg(&f, CPS_MSG_SNAP, 2, 3, 1, 7, 1, 16); /* chunk 2, the last */
    m.hdr.req_worker = 2;
    cps__replica_step(r, &m, 22);
    const cps__replica_out *up = sent(r, CPS_MSG_CAUGHT_UP);
    assert_non_null(up);
    assert_int_equal(up->hdr.aux, 2);
    assert_int_equal(up->hdr.step, 7);
    assert_string_equal(perform(r, &f), "S"); /* no INSTALL */
    assert_false(cps__replica_joining(r, 1));
    assert_int_equal(cps__replica_join_result(r, 1, 0, 0, 22), CPS_EINVAL);
    cps__replica_tick(r, 30, 1);
    finish(r, &f);
}

/* Both sides of state transfer are the replica's: the shell only clears, writes and streams.
 * Range 1 is server 2's (we copy it); range 0 is ours alone (we are its tail). */
void a_join_is_decided_by_the_replica_and_performed_by_the_shell(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_replica(&f);
    set_view(r, 3, CPS_MODE_ASYNC, 2, 1, 1);
    assert_string_equal(perform(r, &f), "D"); /* range 1 is not ours: what we hold is stale */
    /* JOIN_RANGE (source 2, join 7): our copy is cleared first, and the shell answers. */
    cps__replica_msg m = transfer_msg(&f, CPS_MSG_JOIN_RANGE, 0, 3, 1, 7, 2, 0);
    cps__replica_step(r, &m, 10);
    assert_string_equal(perform(r, &f), "C");
    const cps__replica_out *c = item(r, CPS_RO_JOIN_CLEAR, 0);
    assert_int_equal(c->range, 1);
    assert_int_equal(c->to, 2);
    assert_int_equal(c->seq, 7);
    assert_true(cps__replica_joining(r, 1));
    assert_int_equal(cps__replica_join_result(r, 1, 0, 0, 10), 0);
    const cps__replica_out *q = sent(r, CPS_MSG_SNAP_REQ);
    assert_non_null(q);
    assert_int_equal(q->to, 2);
    assert_int_equal(q->hdr.step, 7);
    assert_null(q->msg); /* header only: the shell's send fills in the rest */
    assert_string_equal(perform(r, &f), "S");
    /* No outcome is owed now. */
    assert_int_equal(cps__replica_join_result(r, 1, 0, 0, 10), CPS_EINVAL);
    /* The snapshot's one chunk: the shell writes it (the store is at seq 5 after), then the
     * replica reports CAUGHT_UP to the scheduler at that seq. */
    m = transfer_msg(&f, CPS_MSG_SNAP, 2, 3, 1, 7, 1, 16);
    const void *chunk = m.payload;
    cps__replica_step(r, &m, 20);
    assert_string_equal(perform(r, &f), "I");
    const cps__replica_out *in = item(r, CPS_RO_JOIN_INSTALL, 0);
    assert_ptr_equal(in->upd.body, chunk);
    assert_int_equal(in->upd.body_len, 16);
    assert_true(in->last);
    int released = f.released;
    f.seq[1] = 5;
    assert_int_equal(cps__replica_join_result(r, 1, 0, 5, 20), 0);
    const cps__replica_out *up = sent(r, CPS_MSG_CAUGHT_UP);
    assert_non_null(up);
    assert_int_equal(up->to, 0);
    assert_int_equal(up->hdr.req_seq, 5);
    assert_int_equal(up->hdr.aux, 0);
    perform(r, &f);
    cps__replica_tick(r, 30, 1); /* the next call gives the chunk back */
    assert_int_equal(f.released, released + 1);
    /* At the tail of range 0: a SNAP_REQ makes a SNAPSHOT order, unless it names a view we
     * lack (we ask for it; the joiner asks again) or a range we are not the tail of. */
    m = transfer_msg(&f, CPS_MSG_SNAP_REQ, 2, 3, 0, 9, 0, 0);
    cps__replica_step(r, &m, 40);
    const cps__replica_out *p = item(r, CPS_RO_SNAPSHOT, 0);
    assert_int_equal(p->range, 0);
    assert_int_equal(p->to, 2);
    assert_int_equal(p->seq, 9);
    assert_string_equal(perform(r, &f), "P");
    /* Asked again (or doubled by the network) while it is under way: no second snapshot, also
     * after another join's ended; once the shell reports this one over, the next request orders
     * another. */
    for (uint64_t closed = 0; closed <= 9; closed += 8) {
        m = transfer_msg(&f, CPS_MSG_SNAP_REQ, 2, 3, 0, 9, 0, 0);
        cps__replica_step(r, &m, 41);
        assert_string_equal(perform(r, &f), "");
        cps__replica_snapshot_closed(r, 0, 2, closed);
    }
    cps__replica_snapshot_closed(r, 0, 2, 9);
    m = transfer_msg(&f, CPS_MSG_SNAP_REQ, 2, 3, 0, 9, 0, 0);
    cps__replica_step(r, &m, 42);
    assert_int_equal(item(r, CPS_RO_SNAPSHOT, 0)->seq, 9);
    assert_string_equal(perform(r, &f), "P");
    m = transfer_msg(&f, CPS_MSG_SNAP_REQ, 2, 4, 0, 10, 0, 0);
    cps__replica_step(r, &m, 40);
    assert_string_equal(perform(r, &f), "A");
    m = transfer_msg(&f, CPS_MSG_SNAP_REQ, 2, 3, 1, 10, 0, 0);
    cps__replica_step(r, &m, 40);
    assert_string_equal(perform(r, &f), "");
    finish(r, &f);
}
