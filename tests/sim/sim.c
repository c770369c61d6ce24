/* The cluster simulator: S servers' replicas (replication/replica.h) and W workers in
 * one process, over a simulated network that delays, drops, duplicates and reorders messages,
 * with servers crashing or pausing and the scheduler publishing new views, all driven by one
 * seed. Invariants are checked after every event; a failing seed prints one line to replay it.
 *
 * Nothing here reads a clock or sleeps: virtual time advances event by event (FoundationDB's
 * and TigerBeetle's deterministic simulation), so a seed is a reproducible run.
 *
 * What is modelled (see the report in the issue for what is not):
 *  - servers: the production replica each (replication/replica.h: request checks, the chain,
 *    sync aggregation in worker-rank order, SSP parking, held acks, messages held for a newer
 *    view), over an in-memory store that takes its WRITE items as LMDB does; sim_replica.c is
 *    the shell that performs its ready list;
 *  - workers: dense per-(worker, range) push sequences, sparse pushes (CPS_SEQ_SPARSE), declares
 *    and pulls, several in flight, re-sent after a timeout and on every new view, replies matched
 *    by (range, req_seq): the production worker session (recovery/session.c, sim_worker.c);
 *  - the scheduler: the production coordinator (recovery/coordinator.h, sim_sched.c): it admits
 *    every node and places the ranges, declares silent servers dead (heartbeats) and servers
 *    that leave its probes unanswered after the workers' reports (data-path suspicion), takes
 *    a new life of a server out of its chains, repairs and balances ranges by state transfer,
 *    batching joiners that catch up into one view, drains servers the operator names, runs the
 *    final barrier and ends the job; its views reach each node after a random delay; with
 *    --sched-restarts it also restarts, resuming from what it persisted;
 *  - restarts: a crashed server comes back on its store (kill -9 with LMDB on disk) or on an
 *    empty one (a replaced disk), with a fresh cps__chain, and asks to be let in (HELLO); a
 * server told it was declared dead rejoins the same way (a fresh replica); whether a server
 * is fenced, unsure of its standing after a pause (it then drops what comes and asks for the view)
 * or may serve is recovery/fence.c's decision;
 *  - state transfer: both sides are the replica's (replication/replica_join.c, running
 *    recovery/joiner.c); the sim performs its ready items as the server does: JOIN_RANGE ->
 *    JOIN_CLEAR (clearing the copy) -> SNAP_REQ (re-sent until the snapshot comes) -> the
 *    tail's shadow and SNAPSHOT, one read of the tail's store a moment later -> 1-4 SNAP chunks
 *    of that read, 1-40 ms apart, on a connection of their own (in order; it dies with the
 *    tail's process, and a partition or a drop breaks it for the rest of the stream; with
 *    --snap-gaps nanomsg reconnects under it: one chunk is lost, the later ones still arrive,
 *    and the joiner must give the join up at the gap in the chunks' numbers) -> a
 *    JOIN_INSTALL per chunk (each writes its key groups; the last the read's sequence number and
 *    records, and invariant 3 checks every group is that read's), then the replica's READY ->
 *    CAUGHT_UP -> a view
 *    with the joiner as the new tail, whose reads wait for CHAIN_MARK
 *    (cps__chain_can_serve_pull), and a second CAUGHT_UP (aux 1) once they may be served; a join
 *    given up (timeout, a view that ends it, a failed step) reports CAUGHT_UP aux 2;
 *  - partitions: servers cut off from the scheduler, their peers or the workers (both ways) for
 *    a while; the scheduler may declare them dead meanwhile, and they must be fenced;
 *  - the fence's own promises, which the chain's epochs would hide the breach of: only the
 *    WELCOME answering a server's present life lets it in (14), let in it holds only the ranges
 *    its view gives it (15), unsure of its standing it applies and answers no worker's request
 *    (16); with --fence-faults a new life also gets a late copy of its previous life's WELCOME;
 *  - SSP (--mode ssp:N): each replica's gate is replication/ssp.c, moved at every WRITE, its
 *    clocks stored with the update and carried by snapshots and loaded at a restart and after
 *    a snapshot; pulls park and wake in the replica. Workers
 *    run steps per range of a dense push, then a pull at that clock. Checked: every APPLY
 *    leaves the gate with the clocks the applied updates imply (9), no pull is answered beyond
 *    the bound (10), none stays parked once within it (11), and the run finishes.
 *  - backup workers (--backup-workers B, sync): a step closes with the first W-B pushes
 *    (replication/sync.c); the replica at the head marks a push of a closed step late from what
 *    its store holds, and the worker moves on to the closed step. The last worker is a
 *    straggler (it starts its steps less often). Checked: a late push is never applied on any
 *    replica (13), and once a step's aggregate is committed (applied by a tail) every replica
 *    that applies that step applies the same requests (12), through head failovers. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "core/view.h"
#include "core/wire.h"
#include "recovery/coordinator.h"
#include "recovery/fence.h"
#include "recovery/joiner.h"
#include "recovery/view_change.h"
#include "replication/chain.h"

#include "sim.h"

/* Uniform in [0, n); n > 0. The modulo bias is irrelevant for a test's choices. */
static uint64_t rnd(sim *sm, uint64_t n)
{
    return sim_rng_next(&sm->rng) % n;
}

/* 1 with probability per_mille / 1000. */
static int chance(sim *sm, uint32_t per_mille)
{
    return rnd(sm, 1000) < per_mille;
}

/* ---- failure reporting ---- */

void sim_trace(sim *sm, const char *fmt, ...)
{
    char *line = sm->trace[sm->trace_pos % SIM_TRACE_LINES];
    int n = snprintf(line, SIM_TRACE_LEN, "#%" PRIu64 " t=%" PRIu64 " ", sm->nevents, sm->now);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && n < SIM_TRACE_LEN)
        vsnprintf(line + n, SIM_TRACE_LEN - (size_t)n, fmt, ap);
    va_end(ap);
    sm->trace_pos++;
    if (sm->p.verbose)
        printf("  %s\n", line);
}

void sim_fail(sim *sm, const char *inv, const char *fmt, ...)
{
    if (sm->failed)
        return;
    sm->failed = 1;
    printf("VIOLATION seed=%" PRIu64 " event=%" PRIu64 " t=%" PRIu64 "ms invariant=%s: ",
           sm->p.seed, sm->nevents, sm->now, inv);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n  last events:\n");
    uint64_t first = sm->trace_pos > SIM_TRACE_LINES ? sm->trace_pos - SIM_TRACE_LINES : 0;
    for (uint64_t i = first; i < sm->trace_pos; i++)
        printf("    %s\n", sm->trace[i % SIM_TRACE_LINES]);
}

/* ---- the network ---- */

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "sim: out of memory\n");
        exit(2);
    }
    return p;
}

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "sim: out of memory\n");
        exit(2);
    }
    return p;
}

static uint64_t net_delay(sim *sm)
{
    /* Mostly a few ms; sometimes much longer, so messages overtake each other. */
    if (chance(sm, sm->p.long_per_mille))
        return 20 + rnd(sm, 800);
    return 1 + rnd(sm, 12);
}

/* Send a whole message (header + payload, copied) from `from` to `to`, after `extra` ms plus a
 * network delay; the network may drop or duplicate it. */
static void net_send(sim *sm, uint32_t from, uint32_t to, const void *buf, size_t len,
                     uint64_t extra)
{
    if (sm->cut_active && from < SIM_MAX_NODES && to < SIM_MAX_NODES && sm->cut[from][to]) {
        sm->drops++; /* a partition */
        return;
    }
    if (sm->lossy && chance(sm, sm->p.drop_per_mille)) {
        sm->drops++;
        return;
    }
    int copies = sm->lossy && chance(sm, sm->p.dup_per_mille) ? 2 : 1;
    for (int i = 0; i < copies; i++) {
        sim_msg *m = xmalloc(sizeof *m + len);
        m->from = from;
        m->to = to;
        m->inc = from >= 1 && from <= sm->p.servers ? sm->servers[from - 1].inc : 0;
        m->wire = sm->on_wire;
        m->stream = 0;
        m->len = len;
        memcpy(m->buf, buf, len);
        uint64_t t = sm->now + extra + net_delay(sm);
        if (t < sm->net_floor)
            t = sm->net_floor; /* sim_sched.c: one connection's messages stay in order */
        sm->net_last_due = t;
        sim_ev_push(sm, t, EV_DELIVER, to, m);
    }
    sm->sent++;
}

static void send_hdr(sim *sm, uint32_t from, uint32_t to, const cps__msg_hdr *h, const void *pl,
                     size_t plen, uint64_t extra)
{
    uint8_t buf[CPS_WIRE_HDR_SIZE + 64];
    cps__msg_hdr hh = *h;
    hh.payload_len = hh.raw_len = (uint32_t)plen;
    hh.sender = from;
    cps__wire_hdr_encode(buf, &hh);
    if (plen)
        memcpy(buf + CPS_WIRE_HDR_SIZE, pl, plen);
    net_send(sm, from, to, buf, CPS_WIRE_HDR_SIZE + plen, extra);
}

/* ---- small helpers ---- */

static uint32_t worker_rank(const sim *sm, uint32_t id)
{
    return id - sm->p.servers - 1;
}

const cps__view *sim_cur_view(const sim *sm)
{
    return &sm->views[sm->epoch];
}

/* 1 if server id is in range r's chain in the scheduler's current view: a live replica. */
int sim_is_member(const sim *sm, uint32_t r, uint32_t id)
{
    const cps__range *rg = &sim_cur_view(sm)->ranges[r];
    for (uint32_t i = 0; i < rg->chain_len; i++)
        if (rg->chain[i] == id)
            return 1;
    return 0;
}

static const char *msg_name(uint8_t type)
{
    switch (type) {
    case CPS_MSG_VIEW:
        return "VIEW";
    case CPS_MSG_GET_VIEW:
        return "GET_VIEW";
    case CPS_MSG_DECLARE:
        return "DECLARE";
    case CPS_MSG_PUSH:
        return "PUSH";
    case CPS_MSG_PUSH_PULL:
        return "PUSH_PULL";
    case CPS_MSG_PULL:
        return "PULL";
    case CPS_MSG_ACK:
        return "ACK";
    case CPS_MSG_VALUES:
        return "VALUES";
    case CPS_MSG_ERROR:
        return "ERROR";
    case CPS_MSG_FWD:
        return "FWD";
    case CPS_MSG_CHAIN_ACK:
        return "CHAIN_ACK";
    case CPS_MSG_CHAIN_MARK:
        return "CHAIN_MARK";
    case CPS_MSG_HELLO:
        return "HELLO";
    case CPS_MSG_WELCOME:
        return "WELCOME";
    case CPS_MSG_HEARTBEAT:
        return "HEARTBEAT";
    case CPS_MSG_JOIN_RANGE:
        return "JOIN_RANGE";
    case CPS_MSG_SNAP_REQ:
        return "SNAP_REQ";
    case CPS_MSG_SNAP:
        return "SNAP";
    case CPS_MSG_CAUGHT_UP:
        return "CAUGHT_UP";
    default:
        return "?";
    }
}

/* For sim_replica.c and sim_worker.c (sim.h). */
uint64_t sim_rnd(sim *sm, uint64_t n)
{
    return rnd(sm, n);
}

void sim_net_send(sim *sm, uint32_t from, uint32_t to, const void *buf, size_t len, uint64_t extra)
{
    net_send(sm, from, to, buf, len, extra);
}

void sim_send_hdr(sim *sm, uint32_t from, uint32_t to, const cps__msg_hdr *h, const void *pl,
                  size_t plen, uint64_t extra)
{
    send_hdr(sm, from, to, h, pl, plen, extra);
}

void *sim_xmalloc(size_t n)
{
    return xmalloc(n);
}

void *sim_xcalloc(size_t n, size_t size)
{
    return xcalloc(n, size);
}

const char *sim_msg_name(uint8_t type)
{
    return msg_name(type);
}

int sim_chance(sim *sm, uint32_t per_mille)
{
    return chance(sm, per_mille);
}

/* A message the network delays (long, sometimes) and a partition cuts, but never drops or
 * duplicates: what a TCP connection gives a message with no retry behind it (the scheduler's
 * probes and their answers). A probe answered late once is asked again (recovery/suspect.c:
 * seeds 8540 and 9471 of --faults scale declared a live server dead on one late answer). */
void sim_send_reliable(sim *sm, uint32_t from, uint32_t to, const cps__msg_hdr *h)
{
    int lossy = sm->lossy;
    sm->lossy = 0;
    send_hdr(sm, from, to, h, NULL, 0, 0);
    sm->lossy = lossy;
}

static int node_alive(const cps__view *v, uint32_t id);
static int in_chain(const cps__range *rg, uint32_t id);

int sim_node_alive(const cps__view *v, uint32_t id)
{
    return node_alive(v, id);
}

int sim_in_chain(const cps__range *rg, uint32_t id)
{
    return in_chain(rg, id);
}

void sim_push_restart(sim *sm, uint32_t id, uint64_t after)
{
    sim_ev_push(sm, sm->now + after, EV_RESTART, id, NULL);
}

/* ---- faults (the scheduler itself is the production coordinator: sim_sched.c) ---- */

static int node_alive(const cps__view *v, uint32_t id)
{
    const cps__node_info *n = cps__view_node(v, id);
    return n && n->alive;
}

static int in_chain(const cps__range *rg, uint32_t id)
{
    for (uint32_t j = 0; j < rg->chain_len; j++)
        if (rg->chain[j] == id)
            return 1;
    return 0;
}

static int has_restarts(const sim *sm)
{
    return sm->p.restart_per_mille > 0;
}

/* A partition: servers cut off (both ways) from the scheduler, from the other servers and/or
 * from the workers, healed after a while. */
static void partition(sim *sm)
{
    uint32_t cand[SIM_MAX_SERVERS], nc = 0;
    for (uint32_t i = 0; i < sm->p.servers; i++)
        if (sm->servers[i].state != SRV_CRASHED)
            cand[nc++] = sm->servers[i].id;
    if (nc == 0)
        return;
    uint32_t set[2], n = 1 + (nc > 2 && chance(sm, 300));
    set[0] = cand[rnd(sm, nc)];
    set[1] = set[0];
    while (n == 2 && set[1] == set[0])
        set[1] = cand[rnd(sm, nc)];
    int from_sched = chance(sm, 600), from_peers = chance(sm, 600), from_workers = chance(sm, 300);
    if (!from_sched && !from_peers && !from_workers)
        from_sched = 1;
    memset(sm->cut, 0, sizeof sm->cut);
    for (uint32_t k = 0; k < n; k++) {
        uint32_t a = set[k];
        for (uint32_t b = 0; b <= sm->p.servers + sm->p.workers; b++) {
            int in_set = b == set[0] || b == set[1];
            int c = b == 0 ? from_sched
                           : (b <= sm->p.servers ? from_peers && !in_set && chance(sm, 800)
                                                 : from_workers);
            if (c)
                sm->cut[a][b] = sm->cut[b][a] = 1;
        }
    }
    sm->cut_active = 1;
    sm->partitions++;
    sim_trace(sm, "partition: s%u%s%s cut from%s%s%s", set[0], n == 2 ? " and another" : "", "",
              from_sched ? " scheduler" : "", from_peers ? " peers" : "",
              from_workers ? " workers" : "");
    sim_ev_push(sm, sm->now + 50 + rnd(sm, 2500), EV_HEAL_CUT, 0, NULL);
    if (from_sched && !sm->pending_victim) {
        /* Silent to the scheduler: its detector may declare it dead before the partition heals. */
        sm->pending_victim = set[0];
        sm->nfaults++;
    }
}

/* Server s stopped (its state says how): what it had in flight is lost with it, except what
 * was on the wire already; it may come back. */
static void crash(sim *sm, sim_server *s)
{
    s->inc++;
    if (has_restarts(sm) &&
        (!sim_sched_removable(sm, s->id) || chance(sm, sm->p.restart_per_mille)))
        sim_ev_push(sm, sm->now + 1 + rnd(sm, chance(sm, 500) ? 400 : 3000), EV_RESTART, s->id,
                    NULL);
}

static void fault(sim *sm)
{
    if (sm->epoch >= SIM_FAULT_EPOCHS || sm->pending_victim)
        return;
    if (!sm->cut_active && chance(sm, sm->p.partition_per_mille)) {
        partition(sm);
        return;
    }
    if (sm->p.faults == SIM_F_SCALE && chance(sm, 400)) {
        sim_sched_drain(sm);
        return;
    }
    if (sm->p.drains && chance(sm, 300)) {
        sim_drain_sigterm(sm);
        return;
    }
    int kinds[3], nk = 0;
    if (sm->p.faults == SIM_F_CRASH || sm->p.faults == SIM_F_ALL || sm->p.faults == SIM_F_RESTART ||
        sm->p.faults == SIM_F_JOIN || sm->p.faults == SIM_F_SCALE)
        kinds[nk++] = SRV_CRASHED;
    if (sm->p.faults == SIM_F_PAUSE || sm->p.faults == SIM_F_ALL)
        kinds[nk++] = SRV_PAUSED;
    kinds[nk++] = SRV_UP; /* an epoch change with the same chains: the scheduler restarts */
    int kind = kinds[rnd(sm, (uint64_t)nk)];
    /* Without restarts, the last replica of a range never crashes (the range would be gone). */
    int any = kind == SRV_CRASHED && has_restarts(sm);
    uint32_t cand[SIM_MAX_SERVERS], nc = 0;
    for (uint32_t i = 0; kind != SRV_UP && i < sm->p.servers; i++)
        if (sm->servers[i].state == SRV_UP && (any || sim_sched_removable(sm, sm->servers[i].id)))
            cand[nc++] = sm->servers[i].id;
    if (kind == SRV_UP || nc == 0) {
        if (chance(sm, sm->p.sched_restart_per_mille))
            sim_sched_restart(sm);
        return;
    }
    sim_server *s = &sm->servers[cand[rnd(sm, nc)] - 1];
    s->state = kind;
    sm->nfaults++;
    if (kind == SRV_PAUSED) {
        /* Sometimes shorter than the failure detector's delay: a node declared dead that was
         * only slow, and goes on in its old epoch. */
        s->resume_at = sm->now + (chance(sm, 400) ? 1 + rnd(sm, 400) : 100 + rnd(sm, 3000));
        sim_ev_push(sm, s->resume_at, EV_RESUME, s->id, NULL);
    } else {
        crash(sm, s);
    }
    /* The scheduler's detector notices its silence; until then the chain waits on it. */
    sm->pending_victim = s->id;
    sim_trace(sm, "server %u %s", s->id, kind == SRV_CRASHED ? "crashed" : "paused");
}

/* Crash faults are drawn in this run (fault()'s kinds). */
static int crashes_drawn(const sim *sm)
{
    int f = sm->p.faults;
    return f == SIM_F_CRASH || f == SIM_F_ALL || f == SIM_F_RESTART || f == SIM_F_JOIN ||
           f == SIM_F_SCALE;
}

int sim_fwd_crash_point(sim *sm, sim_server *s, int middle)
{
    if (!sm->p.fwd_crash_per_mille || sm->phase != PHASE_FAULTS || !crashes_drawn(sm) ||
        sm->epoch >= SIM_FAULT_EPOCHS || sm->pending_victim || s->state != SRV_UP ||
        !(has_restarts(sm) || sim_sched_removable(sm, s->id)) ||
        !chance(sm, sm->p.fwd_crash_per_mille))
        return 0;
    s->state = SRV_CRASHED;
    sm->nfaults++;
    sm->fwd_crashes[middle ? 1 : 0]++;
    crash(sm, s);
    sm->pending_victim = s->id;
    sim_trace(sm, "server %u crashed between a FWD and its WRITE (%s)", s->id,
              middle ? "middle" : "head");
    return 1;
}

/* Is server `id` the last replica of some range of the current view? */
static int sole_replica(const sim *sm, uint32_t id)
{
    return !sim_sched_removable(sm, id);
}

/* A crashed server comes back: on its store, or on an empty one (a replaced disk: never for the
 * last replica of a range, whose data would be gone), with a fresh chain state machine. */
static void restart(sim *sm, sim_server *s)
{
    s->restart_due = 0;
    if (s->state != SRV_CRASHED || (sm->phase == PHASE_END && !s->disk_back))
        return; /* at the job's end nobody restarts a server (but to save a range) */
    if (s->disk_back) {
        for (uint32_t r = 0; r < sm->nranges; r++) {
            sim_rstore_clear(&s->rs[r]);
            s->rs[r] = s->old_rs[r];
            memset(&s->old_rs[r], 0, sizeof s->old_rs[r]);
        }
        s->disk_back = 0;
        s->wiped = 0;
        sm->restarts++;
        sim_trace(sm, "s%u restarts on its old disk", s->id);
        sim_server_reset(sm, s);
        return;
    }
    /* With one other replica, the scheduler may declare that one dead next (a pause, lost
     * heartbeats) and find the empty disk the range's last replica: it says it is empty in its
     * HELLO, and the coordinator never lets it be the range's holder (seed 1882), nor, unless
     * told to (--allow-rollback), give the range to the server that left it last. */
    int wipe = chance(sm, sm->p.wipe_per_mille) && (sm->p.wipe_sole || !sole_replica(sm, s->id));
    if (wipe) {
        /* The replaced disk goes on the shelf: the operator may need it back. */
        if (!s->old_rs)
            s->old_rs = sim_xcalloc(sm->nranges, sizeof *s->old_rs);
        for (uint32_t r = 0; r < sm->nranges; r++) {
            sim_rstore_clear(&s->old_rs[r]);
            s->old_rs[r] = s->rs[r];
            memset(&s->rs[r], 0, sizeof s->rs[r]);
        }
        s->wiped = 1;
        sm->wipes++;
    }
    sm->restarts++;
    sim_trace(sm, "s%u restarts%s", s->id, wipe ? " on an empty store" : " on its store");
    sim_server_reset(sm, s);
}

/* The coordinator keeps server `id` out because its empty store is the only replica of a range
 * (cps__coord_stranded): the range is unavailable until the operator, reading the scheduler's
 * ERROR, stops it and starts it on its old disk, which holds every update it acknowledged. The
 * other way out, a checkpoint, is no part of the sim. */
void sim_old_disk_back(sim *sm, uint32_t id)
{
    sim_server *s = &sm->servers[id - 1];
    if (s->state != SRV_HELLO || !s->wiped || s->disk_back || !s->old_rs)
        return;
    s->state = SRV_CRASHED;
    s->inc++;
    s->disk_back = 1;
    sm->disks_back++;
    sim_trace(sm,
              "s%u kept out: its empty store is a range's only replica; the operator puts "
              "its old disk back",
              id);
    sim_ev_push(sm, sm->now + 1 + rnd(sm, 3000), EV_RESTART, id, NULL);
}

/* With --allow-rollback, the operator answers a range stranded with a fallback as the ERROR
 * says: the scheduler is restarted with the flag (which holds for the ranges stranded as it
 * resumes), and the empty server's next HELLO rolls the range back. */
void sim_rollback_restart(sim *sm)
{
    if (sm->rollback_due)
        return;
    sm->rollback_due = 1;
    sim_trace(sm, "operator: restarts the scheduler with --allow-rollback");
    sim_ev_push(sm, sm->now + 1 + rnd(sm, 1000), EV_SCHED_RESTART, 0, NULL);
}

/* A crashed server the view keeps as the last replica of a range (repair.c leaves a dead last
 * replica in place) holds the only copy: the operator restarts it, on its store, even in a run
 * without restarts. Its crash was allowed while others held the range; the detector taking live
 * replicas for dead ones (drops, delays) can leave it the last. */
void sim_restart_last_replica(sim *sm, uint32_t id)
{
    sim_server *s = &sm->servers[id - 1];
    if (s->state != SRV_CRASHED || s->restart_due)
        return;
    const cps__view *v = sim_cur_view(sm);
    for (uint32_t r = 0; r < v->nranges; r++)
        if (in_chain(&v->ranges[r], id)) {
            s->restart_due = 1;
            sim_trace(sm, "s%u, crashed, is the last replica of r%u: the operator restarts it", id,
                      r);
            sim_ev_push(sm, sm->now + 1 + rnd(sm, 3000), EV_RESTART, id, NULL);
            return;
        }
}

/* ---- the run ---- */

/* A crashed server's messages in flight are lost with it. */
static int lost_with_sender(const sim *sm, const sim_msg *m)
{
    return !m->wire && m->from >= 1 && m->from <= sm->p.servers &&
           (sm->servers[m->from - 1].state == SRV_CRASHED ||
            sm->servers[m->from - 1].inc != m->inc);
}

static void deliver(sim *sm, sim_msg *m)
{
    if (m->to == 0) {
        /* Also to the scheduler: a HELLO sent just before a crash would revive a dead cps__server
         * (seed 11362 hung with a crashed server counted alive); the coordinator's detector
         * watches a revived server from its HELLO and declares it dead again (seeds 29572,
         * 72473). */
        if (!lost_with_sender(sm, m))
            sim_sched_deliver(sm, m);
    } else if (m->to <= sm->p.servers) {
        sim_server *s = &sm->servers[m->to - 1];
        int was_held = m->stream == 2;
        if (was_held) {
            s->held_chunks--;
            m->stream = 1;
        }
        if (lost_with_sender(sm, m)) {
            /* lost */
        } else if (s->state == SRV_CRASHED) {
            sim_trace(sm, "message %u -> crashed s%u lost", m->from, s->id);
        } else if (m->stream && (s->state == SRV_PAUSED || (!was_held && s->held_chunks))) {
            /* A snapshot's chunks stay in their connection's order: held behind the ones its
             * inbox holds already. */
            uint64_t t = s->state == SRV_PAUSED ? s->resume_at + 1 : sm->now + 1;
            if (t < s->held_until)
                t = s->held_until;
            if (t <= sm->now)
                t = sm->now + 1;
            s->held_until = t;
            m->stream = 2;
            s->held_chunks++;
            sim_ev_push(sm, t, EV_DELIVER, m->to, m);
            return;
        } else if (s->state == SRV_PAUSED) {
            /* Held by its inbox until it runs again. */
            sim_ev_push(sm, s->resume_at + 1 + rnd(sm, 20), EV_DELIVER, m->to, m);
            return;
        } else if (m->from != 0 || !sim_sched_to_server(sm, s, m)) {
            sim_server_deliver(sm, s, m);
        }
    } else {
        sim_worker *w = &sm->workers[worker_rank(sm, m->to)];
        if (m->from != 0 || !sim_sched_to_worker(sm, w, m))
            sim_worker_deliver(sm, w, m);
    }
    free(m);
}

static void heal(sim *sm)
{
    sm->phase = PHASE_HEAL;
    sm->lossy = 0;
    sm->cut_active = 0;
    memset(sm->cut, 0, sizeof sm->cut);
    sim_trace(sm, "network heals; paused servers resume");
    for (uint32_t id = 1; id <= sm->p.servers; id++)
        if (!node_alive(sim_cur_view(sm), id))
            sim_restart_last_replica(sm, id);
    for (uint32_t i = 0; i < sm->p.servers; i++) {
        sim_server *s = &sm->servers[i];
        if (s->state == SRV_PAUSED) {
            s->resume_at = sm->now;
            s->state = SRV_UP;
        }
    }
    for (uint32_t r = 0; r < sm->nranges; r++) {
        uint64_t t = 0;
        for (uint32_t k = 0; k < sm->p.workers; k++)
            if (sim_worker_step(&sm->workers[k], r) > t)
                t = sim_worker_step(&sm->workers[k], r);
        sm->sync_target[r] = t;
    }
}

static int workers_done(const sim *sm)
{
    for (uint32_t k = 0; k < sm->p.workers; k++) {
        const sim_worker *w = &sm->workers[k];
        if (sim_worker_pending(w))
            return 0;
        for (uint32_t r = 0; sm->p.mode != SIM_ASYNC && r < sm->nranges; r++)
            if (sim_worker_step(w, r) < sm->sync_target[r])
                return 0;
    }
    return 1;
}

/* Every server that runs is let in, every range is back to R live replicas (or as many as
 * there are live servers), every live replica holds every update and nothing is left
 * unacknowledged. */
static int chains_drained(const sim *sm)
{
    const cps__view *v = sim_cur_view(sm);
    uint32_t alive = 0;
    for (uint32_t i = 0; i < sm->p.servers; i++) {
        const sim_server *s = &sm->servers[i];
        if (s->state == SRV_HELLO || (s->state == SRV_UP && !node_alive(v, s->id)))
            return 0;
        alive += node_alive(v, s->id);
    }
    uint32_t want = v->replicas < alive ? v->replicas : alive;
    for (uint32_t r = 0; r < v->nranges; r++) {
        const cps__range *rg = &v->ranges[r];
        if (sim_sched_joiner(sm, r, NULL) || sm->lag[r].node || rg->chain_len < want)
            return 0;
        const sim_server *head = &sm->servers[rg->chain[0] - 1];
        for (uint32_t i = 0; i < rg->chain_len; i++) {
            const sim_server *s = &sm->servers[rg->chain[i] - 1];
            if (s->epoch != sm->epoch || cps__chain_unacked(s->chain, r) != 0 ||
                s->rs[r].applied != head->rs[r].applied)
                return 0;
        }
    }
    return 1;
}

static void setup(sim *sm)
{
    const sim_params *p = &sm->p;
    sim_rng_seed(&sm->rng, p->seed ^ 0x5eed5eed5eed5eedull);
    sim_rng_seed(&sm->snap_rng, p->seed ^ 0x5a995a995a995a99ull);
    sim_rng_seed(&sm->gap_rng, p->seed ^ 0x6a9c6a9c6a9c6a9cull);
    sm->nranges = p->ranges;
    sm->lossy = p->faults == SIM_F_DROPS || p->faults == SIM_F_ALL;
    sm->phase = PHASE_FAULTS;
    sm->views = xcalloc(SIM_MAX_EPOCHS + 2, sizeof *sm->views);
    sm->heads = xcalloc((size_t)sm->nranges * (SIM_MAX_EPOCHS + 1), sizeof *sm->heads);
    sm->sync_target = xcalloc(sm->nranges, sizeof *sm->sync_target);
    sm->lag = xcalloc(sm->nranges, sizeof *sm->lag);
    sm->acked_seq = xcalloc(sm->nranges, sizeof *sm->acked_seq);

    /* The production coordinator admits every node and places the ranges (view 1; a spare
     * server, let in once the job runs, holds none: view 2). */
    sim_sched_setup(sm);
    const cps__view *v = sim_cur_view(sm);

    sm->servers = xcalloc(p->servers, sizeof *sm->servers);
    for (uint32_t i = 0; i < p->servers; i++) {
        sim_server *s = &sm->servers[i];
        s->id = i + 1;
        s->state = SRV_UP;
        sim_server_start(sm, s, v);
        sim_ev_push(sm, rnd(sm, p->tick_ms), EV_TICK, s->id, NULL);
    }
    sm->workers = xcalloc(p->workers, sizeof *sm->workers);
    for (uint32_t k = 0; k < p->workers; k++) {
        sim_worker *w = &sm->workers[k];
        sim_worker_init(sm, w, p->servers + 1 + k, v);
        sim_ev_push(sm, rnd(sm, SIM_WORKER_TICK_MS), EV_WTICK, w->id, NULL);
    }
    sim_ev_push(sm, SIM_SCHED_TICK_MS, EV_REPAIR, 0, NULL);
}

static void teardown(sim *sm)
{
    for (size_t i = 0; i < sm->nev; i++)
        free(sm->ev[i].m);
    free(sm->ev);
    for (uint32_t i = 0; sm->servers && i < sm->p.servers; i++) {
        sim_server *s = &sm->servers[i];
        sim_store_free(sm, s);
        sim_server_free(sm, s);
    }
    free(sm->servers);
    for (uint32_t k = 0; sm->workers && k < sm->p.workers; k++) {
        sim_worker_fini(&sm->workers[k]);
    }
    free(sm->workers);
    for (uint64_t e = 1; sm->views && e <= sm->epoch; e++)
        cps__view_fini(&sm->views[e]);
    free(sm->views);
    free(sm->heads);
    free(sm->sync_target);
    free(sm->acked);
    free(sm->lates);
    free(sm->step_sets);
    sim_sched_teardown(sm);
    free(sm->lag);
    free(sm->acked_seq);
    for (uint32_t i = 0; i < sm->nsnaps; i++) {
        sim_rstore_clear(&sm->snaps[i]->st);
        free(sm->snaps[i]);
    }
    free(sm->snaps);
}

static void step(sim *sm, sim_event e)
{
    switch (e.type) {
    case EV_DELIVER:
        deliver(sm, e.m);
        break;
    case EV_TICK: {
        sim_server *s = &sm->servers[e.node - 1];
        if (s->state == SRV_CRASHED) {
            s->ticking = 0; /* a restart starts the ticks again */
            break;
        }
        if (s->state == SRV_HELLO && sm->now - s->hello_at >= SIM_HELLO_MS) {
            s->hello_at = sm->now;
            cps__msg_hdr h = {.type = CPS_MSG_HELLO, .aux = s->boot};
            send_hdr(sm, s->id, 0, &h, NULL, 0, 0);
        }
        if (s->state == SRV_HELLO || s->state == SRV_UP)
            sim_server_tick(sm, s); /* the loop turns whether or not it is let in */
        if (s->state == SRV_UP) {
            if (sm->now - s->beat_at >= SIM_BEAT_MS) {
                s->beat_at = sm->now;
                cps__msg_hdr h = {.type = CPS_MSG_HEARTBEAT, .epoch = s->epoch};
                send_hdr(sm, s->id, 0, &h, NULL, 0, 0);
            }
        }
        sim_ev_push(sm, sm->now + sm->p.tick_ms, EV_TICK, s->id, NULL);
        break;
    }
    case EV_WTICK: {
        sim_worker *w = &sm->workers[worker_rank(sm, e.node)];
        sim_worker_tick(sm, w);
        sim_ev_push(sm, sm->now + SIM_WORKER_TICK_MS, EV_WTICK, w->id, NULL);
        break;
    }
    case EV_RESTART:
        restart(sm, &sm->servers[e.node - 1]);
        break;
    case EV_SCHED_RESTART:
        sm->rollback_due = 0;
        sim_sched_restart(sm);
        break;
    case EV_HEAL_CUT:
        if (sm->cut_active)
            sim_trace(sm, "partition heals");
        sm->cut_active = 0;
        memset(sm->cut, 0, sizeof sm->cut);
        if (sm->pending_victim && sm->servers[sm->pending_victim - 1].state == SRV_UP)
            sm->pending_victim = 0; /* partitioned, not failed: its beats are heard again */
        break;
    case EV_REPAIR:
        sim_sched_tick(sm);
        sim_ev_push(sm, sm->now + SIM_SCHED_TICK_MS, EV_REPAIR, 0, NULL);
        break;
    case EV_SNAPSHOT:
        sim_snapshot_run(sm, e.m);
        break;
    case EV_ACKS: {
        /* Held acks due; a paused server sends them at its next tick after resuming, a crashed
         * one lost them. */
        sim_server_acks_due(sm, &sm->servers[e.node - 1]);
        break;
    }
    case EV_RESUME: {
        sim_server *s = &sm->servers[e.node - 1];
        if (s->state == SRV_PAUSED && s->resume_at == sm->now) {
            s->state = SRV_UP;
            if (sm->pending_victim == s->id)
                sm->pending_victim = 0;
            sim_trace(sm, "s%u resumes at e%" PRIu64, s->id, s->epoch);
        }
        break;
    }
    }
}

int sim_run(const sim_params *p, sim_summary *out)
{
    sim *sm = xcalloc(1, sizeof *sm);
    sm->p = *p;
    setup(sm);
    /* Expected number of view changes over the fault phase. */
    uint32_t fault_per_million =
        p->faults == SIM_F_NONE || p->faults == SIM_F_DROPS
            ? 0
            : (uint32_t)(1000000ull * (1 + p->servers) / (p->events ? p->events : 1));
    uint64_t heal_at = 0;
    while (!sm->failed && sm->nev > 0) {
        sim_event e = sim_ev_pop(sm);
        sm->now = e.t;
        sm->nevents++;
        if (sm->phase == PHASE_FAULTS && sm->nevents >= p->events) {
            heal(sm);
            heal_at = sm->nevents;
        }
        if (sm->phase == PHASE_FAULTS && fault_per_million && rnd(sm, 1000000) < fault_per_million)
            fault(sm);
        step(sm, e);
        if (!sm->failed)
            sim_check_event(sm);
        if (sm->phase == PHASE_HEAL && workers_done(sm))
            sm->phase = PHASE_DRAIN;
        if (sm->phase == PHASE_DRAIN && chains_drained(sm)) {
            sm->phase = PHASE_END;
            sim_sched_end(sm);
        }
        if (sm->phase == PHASE_END && sim_sched_ended(sm))
            break;
        if (sm->phase != PHASE_FAULTS && sm->nevents - heal_at > SIM_HEAL_EVENTS) {
            uint32_t left = 0;
            for (uint32_t k = 0; k < p->workers; k++)
                left += sim_worker_pending(&sm->workers[k]);
            const cps__view *cv = sim_cur_view(sm);
            for (uint32_t i = 0; i < p->servers; i++)
                printf("  s%u: state %d epoch %" PRIu64 " alive %d boot %u\n", i + 1,
                       sm->servers[i].state, sm->servers[i].epoch, node_alive(cv, i + 1),
                       sm->servers[i].boot);
            for (uint32_t r = 0; r < sm->nranges; r++) {
                const cps__range *rg = &cv->ranges[r];
                uint32_t src = 0, joiner = sim_sched_joiner(sm, r, &src);
                printf("  r%u: pj %u<-%u unconfirmed %u lag %u chain", r, joiner, src,
                       cps__coord_unconfirmed(sm->coord, r), sm->lag[r].node);
                for (uint32_t j = 0; j < rg->chain_len; j++) {
                    const sim_server *x = &sm->servers[rg->chain[j] - 1];
                    printf(" s%u(applied %" PRIu64 " unacked %u gated %d)", x->id, x->rs[r].applied,
                           cps__chain_unacked(x->chain, r),
                           cps__chain_is_tail(x->chain, r) &&
                               /* after the run failed: the gate's lazy clearing is moot */
                               !cps__chain_can_serve_pull((cps__chain *)x->chain, r));
                }
                printf("\n");
            }
            sim_fail(sm, "liveness",
                     "%s not finished %u events after the network healed (%u requests "
                     "unanswered)",
                     sm->phase == PHASE_HEAL    ? "workers"
                     : sm->phase == PHASE_DRAIN ? "replication"
                                                : "the job's end",
                     SIM_HEAL_EVENTS, left);
        }
    }
    if (!sm->failed)
        sim_check_final(sm);
    if (!sm->failed && sm->p.drains)
        sim_drain_check_end(sm);
    if (out) {
        out->events = sm->nevents;
        out->acked = sm->nacked;
        out->views = sm->epoch;
        out->faults = sm->nfaults;
        out->drops = sm->drops;
        out->virt_ms = sm->now;
        out->fenced = sm->fenced;
        out->zombie_writes = sm->zombie_writes;
        out->restarts = sm->restarts;
        out->moves = sm->moves;
        out->drains = sm->drains;
        out->wipes = sm->wipes;
        out->disks_back = sm->disks_back;
        out->partitions = sm->partitions;
        out->joins = sm->joins;
        out->rejoins = sm->rejoins;
        out->stale_welcomes = sm->stale_welcomes;
        out->sigterms = sm->sigterms;
        out->snap_gaps = sm->snap_gaps;
        out->gated = sm->gated;
        out->ssp_parked = sm->ssp_parked;
        out->false_deaths = sm->false_deaths;
        out->fwd_crashes[0] = sm->fwd_crashes[0];
        out->fwd_crashes[1] = sm->fwd_crashes[1];
        out->late = 0;
        for (uint32_t k = 0; k < p->workers; k++)
            out->late += sm->workers[k].late;
        out->unavailable = 0;
        for (uint32_t k = 0; k < p->workers; k++)
            out->unavailable += sm->workers[k].unavailable;
    }
    int failed = sm->failed;
    teardown(sm);
    free(sm);
    return failed;
}
