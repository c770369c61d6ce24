/* sim_restore (not --model): the server's side of a join, as src/server performs the replica's
 * join items (replication/replica_join.c decides; this only performs): JOIN_RANGE from the
 * coordinator -> JOIN_CLEAR (the copy cleared) -> SNAP_REQ to the range's tail -> the tail's
 * SNAPSHOT, a read of its store a moment later (the snapshot thread), sent as one SNAP over its
 * own connection -> JOIN_INSTALL at the joiner -> CAUGHT_UP to the coordinator, which appends the
 * joiner to the chain in its next view. A snapshot's socket lingers until the replica lets it
 * close. So a repair after a death copies ranges while the restore streams into them. */
#include "restore.h"

/* SNAPSHOT at the tail of o->range for joiner o->to (join o->seq): the thread reads the store a
 * moment later (rjoin_snapshot_run). */
void rjoin_snapshot(world *w, server *s, const cps__replica_out *o)
{
    if (s->view && o->req.epoch > s->view->epoch) {
        /* As sim.c's invariant 18: a tail serves a join's SNAP_REQ only under a view as new. */
        sim_fail(&w->v,
                 "server %u (epoch %" PRIu64 ") starts a snapshot of range %u for server %u's "
                 "join of epoch %" PRIu64,
                 s->id, s->view->epoch, o->range, o->to, o->req.epoch);
        return;
    }
    msg *m = calloc(1, sizeof *m);
    if (!m)
        abort();
    m->from = s->id;
    m->to = o->to;
    m->h = (cps__msg_hdr){.type = CPS_MSG_SNAP,
                          .sender = s->id,
                          .range = o->range,
                          .step = o->seq, /* the join id, echoed */
                          .aux = 1};      /* one chunk, the last */
    ev_push(w, w->now + 1 + rnd(w, 40), EV_SNAPSHOT, s->id, 0, m);
}

/* The snapshot thread: the range's store as it is now, to the joiner; then its socket lingers. */
void rjoin_snapshot_run(world *w, msg *m)
{
    server *s = &w->srv[m->from];
    if (s->state == SRV_DEAD || s->state == SRV_FENCED) {
        msg_free(m); /* the thread went with the process */
        return;
    }
    if (s->state == SRV_PAUSED) {
        ev_push(w, s->resume_at + 1, EV_SNAPSHOT, s->id, 0, m);
        return;
    }
    cps__msg_hdr h = m->h;
    const rstore *st = &s->rs[h.range];
    h.epoch = s->view ? s->view->epoch : 0;
    h.req_seq = st->applied;
    trace(w, "s%u snapshot of r%u at seq %" PRIu64 " -> s%u", s->id, h.range, h.req_seq, m->to);
    net_send(w, s->id, m->to, &h, st, sizeof *st, 1);
    if (s->nlingers < MAX_LINGERS)
        s->lingers[s->nlingers++] =
            (linger){.range = h.range, .joiner = m->to, .join_id = h.step, .ended_ms = w->now};
    else
        cps__replica_snapshot_closed(s->rep, h.range, m->to, h.step);
    msg_free(m);
}

/* JOIN_CLEAR or JOIN_INSTALL (the last item of a ready list): performed; *value for
 * cps__replica_join_result. Returns the store's status. */
int rjoin_take(world *w, server *s, const cps__replica_out *o, uint64_t *value)
{
    rstore *st = &s->rs[o->range];
    *value = 0;
    if (o->kind == CPS_RO_JOIN_CLEAR) {
        trace(w, "s%u copies r%u from s%u", s->id, o->range, o->to);
        memset(st, 0, sizeof *st);
        return 0;
    }
    if (o->upd.body_len != sizeof *st) {
        sim_fail(&w->v, "server %u: a snapshot of r%u of %zu bytes", s->id, o->range,
                 o->upd.body_len);
        return CPS_EPROTO;
    }
    memcpy(st, o->upd.body, sizeof *st);
    *value = st->applied;
    trace(w, "s%u installs r%u at seq %" PRIu64, s->id, o->range, st->applied);
    return 0;
}

/* At every turn of the server's loop: the snapshots' sockets the replica lets close. */
void rjoin_reap(world *w, server *s)
{
    for (uint32_t i = 0; i < s->nlingers; i++) {
        const linger *l = &s->lingers[i];
        if (!cps__replica_snapshot_may_close(s->rep, l->range, l->joiner, 0, l->ended_ms, w->now))
            continue;
        cps__replica_snapshot_closed(s->rep, l->range, l->joiner, l->join_id);
        s->lingers[i--] = s->lingers[--s->nlingers];
    }
}
