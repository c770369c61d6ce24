/* The simulator's servers: each runs the production replica (replication/replica.h), built as
 * the server process builds it, over the sim's in-memory store (check.c), network and clock.
 * What is left here is a shell, as the server's is: receive, step, perform the ready list
 * (state transfer's and the standing's too: the replica runs recovery/joiner.c and
 * recovery/fence.c).
 *
 * A request's payload is a kv payload of one key (the range's first key; its second names a key
 * never declared, which the head must refuse) and one value, so the replica decodes, checks,
 * aggregates and forwards it as it does a worker's. The store reads a pull's values as the hash
 * of its log at the sequence number it holds, and an ACK carries the committed sequence number
 * in aux (the sim's, not production's): both let the checks see what a worker read. */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "core/log.h"
#include "replication/replica.h"

#include "sim.h"

/* ---- the store and memory the replica sees (cps__replica_env) ---- */

static int env_check_keys(void *ctx, const cps__kv *kv, const cps__param_spec *spec,
                          uint64_t *bad_key, uint32_t *have_len)
{
    sim_server *s = ctx;
    *bad_key = 0;
    *have_len = 1;
    if (spec)
        return 0; /* declares create their keys; the sim's never conflict */
    const cps__view *v = sim_cur_view(s->sm);
    for (uint32_t i = 0; i < kv->nkeys; i++) {
        const cps__range *rg = &v->ranges[cps__view_range_of(v, kv->keys[i])];
        if (kv->keys[i] == rg->lo + 1) {
            *bad_key = kv->keys[i];
            *have_len = 0;
            return CPS_ENOTFOUND;
        }
    }
    return 0;
}

/* The exactly-once records of a range that the replica reloads: the SSP clocks. */
static int env_scan_dedup(void *ctx, uint32_t range,
                          int (*fn)(void *arg, uint32_t id, uint64_t value), void *arg)
{
    sim_server *s = ctx;
    const sim *sm = s->sm;
    for (uint32_t k = 0; k < sm->p.workers; k++)
        if (s->rs[range].clock[k])
            fn(arg, (sm->p.servers + 1 + k) | CPS_DEDUP_CLOCK_BIT, s->rs[range].clock[k]);
    return 0;
}

static void env_add(void *ctx, float *acc, const float *x, size_t n)
{
    (void)ctx;
    for (size_t i = 0; i < n; i++)
        acc[i] += x[i];
}

static void env_release(void *ctx, void *owner)
{
    (void)ctx;
    free(owner);
}

static void *env_msg_alloc(void *ctx, uint32_t to, size_t len)
{
    (void)ctx;
    (void)to;
    return malloc(len);
}

static void replica_new(sim *sm, sim_server *s)
{
    cps__replica_destroy(s->rep);
    s->rep = NULL;
    s->chain = NULL;
    cps__replica_env env = {
        s,       sim_op_range_seq, sim_op_dedup, sim_op_agg_step, env_check_keys, env_scan_dedup,
        env_add, env_release,      env_msg_alloc};
    /* As the server configures it, the joins' timers scaled as sim.h says. */
    cps__replica_config cfg = {.self = s->id,
                               .resend_ms = sm->p.resend_ms,
                               .max_unacked = sm->p.max_unacked,
                               .join_timeout_ms = SIM_JOIN_TIMEOUT_MS,
                               .snap_retry_ms = SIM_SNAP_RETRY_MS,
                               .dead_after_ms = SIM_DEAD_AFTER_MS,
                               .start_ms = sm->now};
    if (cps__replica_create(&cfg, &env, &s->rep) != 0) {
        fprintf(stderr, "sim: cps__replica_create failed\n");
        exit(2);
    }
    s->chain = cps__replica_chain(s->rep);
    s->nparked = 0; /* parked pulls are lost with the process: their workers re-send */
    s->acks_at = 0;
}

/* ---- performing the ready list ---- */

static void reply_to_worker(sim *sm, sim_server *s, uint8_t type, uint32_t worker, uint32_t range,
                            uint64_t req_seq, int status, const void *pl, size_t plen, uint64_t aux,
                            uint16_t flags)
{
    cps__msg_hdr h = {0};
    h.type = type;
    h.flags = (uint16_t)(CPS_WF_REPLY | flags);
    h.status = status;
    h.epoch = s->epoch;
    h.req_worker = worker;
    h.range = range;
    h.req_seq = req_seq;
    h.aux = aux;
    sim_send_hdr(sm, s->id, worker, &h, pl, plen, 0);
}

static void ask_view(sim *sm, sim_server *s)
{
    cps__msg_hdr g = {.type = CPS_MSG_GET_VIEW, .epoch = s->epoch};
    sim_send_hdr(sm, s->id, 0, &g, NULL, 0, 0);
}

/* Forward before apply (replication/replica.h): the FWD of update n of a range that a replica
 * has not applied yet is the first send of a new update, and the next item is its WRITE. */
static int fwd_ahead(sim_server *s, const cps__replica_out *out, size_t n, size_t i)
{
    const cps__replica_out *o = &out[i];
    if (o->hdr.type != CPS_MSG_FWD || o->hdr.range >= s->sm->nranges ||
        o->hdr.req_seq <= s->rs[o->hdr.range].applied)
        return 0;
    const cps__replica_out *w = i + 1 < n ? &out[i + 1] : NULL;
    return !o->resend && w && w->kind == CPS_RO_WRITE && w->range == o->hdr.range &&
           w->seq == o->hdr.req_seq && o->hdr.req_seq == s->rs[o->hdr.range].applied + 1;
}

/* Persist before send: a replica forwards, acknowledges or says it applied only what it
 * applied, or forwards ahead of its WRITE (fwd_ahead). (A join's CHAIN_MARK is no data: a
 * replica still catching up passes on its own MARK.) */
static int check_persisted(sim *sm, sim_server *s, const cps__msg_hdr *h)
{
    int join_mark = h->type == CPS_MSG_CHAIN_MARK && !(h->aux & CPS_CHAIN_MARK_APPLIED);
    if (h->range < sm->nranges && (join_mark || h->req_seq <= s->rs[h->range].applied))
        return 0;
    sim_fail(sm, "persist before send",
             "server %u sent %s of range %u seq %" PRIu64 " having applied %" PRIu64, s->id,
             sim_msg_name(h->type), h->range, h->req_seq,
             h->range < sm->nranges ? s->rs[h->range].applied : 0);
    return -1;
}

/* Invariant 5 at a WRITE the head took (an update it gave a number: a head applies nothing
 * else): at most one server accepts writes for a range in one epoch. */
static void check_one_head(sim *sm, sim_server *s, uint32_t r)
{
    const cps__range *rg = s->view ? &s->view->ranges[r] : NULL;
    if (!rg || rg->chain_len == 0 || rg->chain[0] != s->id)
        return;
    uint32_t *head = &sm->heads[(size_t)r * (SIM_MAX_EPOCHS + 1) + s->epoch];
    if (*head && *head != s->id)
        sim_fail(sm, "(5) one head per range per epoch",
                 "range %u epoch %" PRIu64 ": servers %u and %u both accepted writes", r, s->epoch,
                 *head, s->id);
    *head = s->id;
    if (!sim_is_member(sm, r, s->id))
        sm->zombie_writes++; /* a removed head taking a write in its old epoch */
}

static void unpark(sim_server *s, uint32_t worker, uint64_t req_seq)
{
    for (uint32_t k = 0; k < s->nparked; k++)
        if (s->parked[k].worker == worker && s->parked[k].req_seq == req_seq) {
            s->parked[k] = s->parked[--s->nparked];
            return;
        }
}

/* A pull (or push-pull) the tail answers: it reads its applied sequence number and the hash of
 * its log there. */
static void answer_pull(sim *sm, sim_server *s, const cps__replica_out *o)
{
    uint32_t r = o->range;
    const cps__msg_hdr *q = &o->req;
    int pp = q->type == CPS_MSG_PUSH_PULL;
    if (pp) {
        /* Its push is acknowledged with the values: on every live replica (invariant 1). */
        cps__chain_req cq = {o->to, q->type, (q->flags & CPS_WF_NOAGG) ? 1 : 0, q->req_seq};
        sim_check_reply(sm, s, r, &cq);
        uint64_t at = sim_store_seq_of(s, r, &cq);
        if (at > sm->acked_seq[r])
            sm->acked_seq[r] = at;
    }
    uint64_t seq = s->rs[r].applied;
    uint64_t hash = seq ? s->rs[r].log[seq - 1] : 0;
    sim_check_read(sm, s, r, seq, hash);
    sim_check_fresh_read(sm, s, r, seq);
    /* A push-pull reads at its step, a pull at the clock it names (aux). */
    if (sm->p.mode == SIM_SSP && !sm->failed)
        sim_check_ssp_read(sm, s, r, o->to, pp ? q->step : q->aux);
    if (sm->failed)
        return;
    uint8_t b[8];
    cps__le64_put(b, hash);
    reply_to_worker(sm, s, CPS_MSG_VALUES, o->to, r, o->hdr.req_seq, 0, b, 8, seq, 0);
}

static void perform_reply(sim *sm, sim_server *s, const cps__replica_out *o)
{
    const cps__msg_hdr *q = &o->req;
    uint32_t r = o->range;
    unpark(s, o->to, q->req_seq);
    if (o->status < 0) {
        sim_trace(sm, "s%u reply ERROR %s r%u w%u req %" PRIx64 ": %s", s->id,
                  cps_err_name(o->status), r, o->to, q->req_seq, o->text);
        sm->gated += q->type == CPS_MSG_PULL && o->status == CPS_EAGAIN;
        reply_to_worker(sm, s, CPS_MSG_ERROR, o->to, r, q->req_seq, o->status, NULL, 0, 0, 0);
        return;
    }
    if (o->hdr.type == CPS_MSG_VALUES && !(o->hdr.flags & CPS_WF_LATE)) {
        answer_pull(sm, s, o);
        return;
    }
    if (o->hdr.flags & CPS_WF_LATE) {
        /* Dropped, never applied (an old copy of a finished push is not: answered at once,
         * without a claim); the worker moves on to the closed step. */
        if (o->dropped)
            sim_check_late(sm, s, r, o->to, q->req_seq);
        if (sm->failed)
            return;
        sim_trace(sm, "s%u reply late ACK r%u w%u req %" PRIx64 " (closed %" PRIu64 ")", s->id, r,
                  o->to, q->req_seq, o->hdr.aux);
        reply_to_worker(sm, s, o->hdr.type, o->to, r, q->req_seq, 0, NULL, 0, o->hdr.aux,
                        CPS_WF_LATE);
        return;
    }
    /* Invariant 1 when the answer leaves the server, not only when it arrives. */
    cps__chain_req cq = {o->to, q->type, (q->flags & CPS_WF_NOAGG) ? 1 : 0, q->req_seq};
    sim_check_reply(sm, s, r, &cq);
    if (sm->failed)
        return;
    uint64_t seq = sim_store_seq_of(s, r, &cq);
    sim_trace(sm, "s%u reply ACK r%u w%u req %" PRIx64 " at seq %" PRIu64, s->id, r, o->to,
              q->req_seq, seq);
    if (seq > sm->acked_seq[r])
        sm->acked_seq[r] = seq;
    /* aux: the committed sequence number the reply stands for (read-your-writes). */
    reply_to_worker(sm, s, CPS_MSG_ACK, o->to, r, q->req_seq, 0, NULL, 0, seq, 0);
}

/* A FWD sent ahead of its WRITE: the crash point between the two (sim_fwd_crash_point). The
 * FWD is on the wire when the server stops there: it arrives. 1 if the server crashed. */
static int send_ahead(sim *sm, sim_server *s, const cps__replica_out *o)
{
    const cps__range *rg = s->view ? &s->view->ranges[o->hdr.range] : NULL;
    int middle = rg && rg->chain_len > 0 && rg->chain[0] != s->id;
    sm->on_wire = 1;
    sim_net_send(sm, s->id, o->to, o->msg, o->len, 0);
    sm->on_wire = 0;
    return sim_fwd_crash_point(sm, s, middle);
}

/* A snapshot thread's progress, after the SNAP header in its EV_SNAPSHOT event's message. */
typedef struct snap_stream {
    uint64_t snap;  /* its read: index in sm->snaps; UINT64_MAX until it reads the store */
    uint32_t next;  /* the chunk it sends next */
    int broken;     /* its connection broke: what it still sends is lost */
    int gapped;     /* --snap-gaps: it lost one chunk already (one per stream) */
    uint64_t floor; /* when its last chunk sent arrives: the next one arrives no earlier */
} snap_stream;

/* The payload of a SNAP chunk: the read, the chunk's index and the stream's chunk count. */
#define SNAP_CHUNK_LEN 16
/* --snap-gaps: the chance, per chunk before a stream's last, that the stream loses it (at most
 * one per stream). */
#define SIM_SNAP_GAP_PER_MILLE 250

static uint64_t snap_rnd(sim *sm, uint64_t n)
{
    return sim_rng_next(&sm->snap_rng) % n;
}

/* SNAPSHOT at the tail: the snapshot thread reads the store a moment later (sim_snapshot_run). */
static void start_snapshot(sim *sm, sim_server *s, const cps__replica_out *o)
{
    if (o->req.epoch > s->epoch) {
        /* Invariant 18: a tail serves a join's SNAP_REQ only under a view as new as the join's.
         * Under an older one, a view it installs next may count the joiner dead (it died and
         * came back since) and drop the shadow with what it held for it, while this snapshot
         * still goes out: the joiner lacks those updates for good. The chain's later defences
         * (MARK gating, the probation) hide that damage, so the promise is checked here. */
        sim_fail(sm, "(18) a tail serves no SNAP_REQ of a newer view",
                 "server %u (epoch %" PRIu64 ") starts a snapshot of range %u for server %u's "
                 "join %" PRIu64 " of epoch %" PRIu64,
                 s->id, s->epoch, o->range, o->to, o->seq, o->req.epoch);
        return;
    }
    sim_msg *m = sim_xmalloc(sizeof *m + CPS_WIRE_HDR_SIZE + sizeof(snap_stream));
    m->from = s->id;
    m->to = o->to;
    m->inc = s->inc;
    m->wire = 0;
    m->stream = 0;
    m->len = CPS_WIRE_HDR_SIZE + sizeof(snap_stream);
    /* step: the join id of the request, echoed on every chunk. */
    cps__msg_hdr sh = {.type = CPS_MSG_SNAP,
                       .sender = s->id,
                       .epoch = s->epoch,
                       .range = o->range,
                       .step = o->seq};
    cps__wire_hdr_encode(m->buf, &sh);
    snap_stream st = {.snap = UINT64_MAX};
    memcpy(m->buf + CPS_WIRE_HDR_SIZE, &st, sizeof st);
    sim_ev_push(sm, sm->now + sim_rnd(sm, 40), EV_SNAPSHOT, s->id, m);
}

/* Key groups [lo, hi) of SIM_SNAP_GROUPS: what chunk i of n carries. */
static void chunk_groups(uint32_t i, uint32_t n, uint32_t *lo, uint32_t *hi)
{
    *lo = i * SIM_SNAP_GROUPS / n;
    *hi = (i + 1) * SIM_SNAP_GROUPS / n;
}

/* JOIN_INSTALL: one SNAP chunk into our store (its payload names the read and the chunk). The
 * chunk writes its key groups' values as the read found them; the last one also the read's
 * sequence number, exactly-once records and SSP clocks (here the whole log of the read stands
 * for the values, once every group is in: sim_check_snapshot checks that they are one read's). */
static int install_snapshot(sim *sm, sim_server *s, const cps__replica_out *o, uint64_t *value)
{
    uint32_t r = o->range;
    uint64_t k = o->upd.body_len == SNAP_CHUNK_LEN ? cps__le64_get(o->upd.body) : UINT64_MAX;
    uint32_t i = k < sm->nsnaps ? cps__le32_get(o->upd.body + 8) : 0;
    uint32_t n = k < sm->nsnaps ? cps__le32_get(o->upd.body + 12) : 0;
    if (k >= sm->nsnaps || n != sm->snaps[k]->chunks || i >= n || (i == n - 1) != (o->last != 0)) {
        sim_fail(sm, "api", "server %u: JOIN_INSTALL of r%u names no snapshot chunk", s->id, r);
        return CPS_EINVAL;
    }
    const sim_snap *sn = sm->snaps[k];
    uint32_t lo, hi;
    chunk_groups(i, n, &lo, &hi);
    for (uint32_t g = lo; g < hi; g++)
        s->groups[(size_t)r * SIM_SNAP_GROUPS + g] = (uint32_t)k + 1;
    s->copying[r] = 1;
    if (!o->last)
        return 0;
    sim_rstore_copy(&s->rs[r], &sn->st);
    sim_check_snapshot(sm, s, r);
    *value = sn->st.applied;
    return 0;
}

/* Perform the ready list of the last call, in order; a server that crashes part way through
 * (sim_fwd_crash_point) performs nothing more. A JOIN_CLEAR or JOIN_INSTALL ends it: 1 then,
 * with its outcome for cps__replica_join_result. */
static int perform_list(sim *sm, sim_server *s, uint32_t *range, int *rc, uint64_t *value)
{
    const cps__replica_out *out;
    size_t n = cps__replica_ready(s->rep, &out);
    int answer = 0;
    for (size_t i = 0; i < n; i++) {
        const cps__replica_out *o = &out[i];
        if (sm->failed || s->state == SRV_CRASHED) {
            if (o->kind == CPS_RO_SEND)
                free(o->msg);
            continue;
        }
        switch (o->kind) {
        case CPS_RO_WRITE:
            check_one_head(sm, s, o->range);
            if (!sm->failed)
                sim_store_write(sm, s, o);
            break;
        case CPS_RO_SEND:
            sim_trace(sm, "s%u send %s%s r%u seq %" PRIu64 " e%" PRIu64 " -> s%u", s->id,
                      o->msg ? "" : "held ", sim_msg_name(o->hdr.type), o->hdr.range,
                      o->hdr.req_seq, o->hdr.epoch, o->to);
            if (!o->msg) {
                /* A held CHAIN_ACK: persist-before-send was checked when the chain made it
                 * (holding is a network that delays acks; sim seed 1935). A held
                 * CHAIN_MARK(APPLIED) goes at the end of the turn: what it says is applied
                 * must be, then as now. */
                if (o->hdr.type != CPS_MSG_CHAIN_MARK || check_persisted(sm, s, &o->hdr) == 0)
                    sim_send_hdr(sm, s->id, o->to, &o->hdr, NULL, 0, 0);
                break;
            }
            if (o->hdr.type == CPS_MSG_FWD && fwd_ahead(s, out, n, i)) {
                send_ahead(sm, s, o);
            } else if (check_persisted(sm, s, &o->hdr) == 0) {
                sim_net_send(sm, s->id, o->to, o->msg, o->len, 0);
            }
            free(o->msg);
            break;
        case CPS_RO_REPLY:
            perform_reply(sm, s, o);
            break;
        case CPS_RO_ASK_VIEW:
            ask_view(sm, s);
            break;
        case CPS_RO_DROP_RANGE:
            /* Our copy of a range the view took from us is cleared. */
            sim_trace(sm, "s%u drops r%u (%s)", s->id, o->range, o->moved ? "moved" : "stale");
            sim_rstore_clear(&s->rs[o->range]);
            break;
        case CPS_RO_LOG:
            if (o->level <= CPS_LOG_WARN)
                sim_trace(sm, "s%u: %s", s->id, o->text);
            break;
        case CPS_RO_SNAPSHOT:
            start_snapshot(sm, s, o);
            break;
        case CPS_RO_JOIN_CLEAR:
            sim_rstore_clear(&s->rs[o->range]); /* the server's cps__server_clear_range */
            s->copying[o->range] = 0;
            memset(&s->groups[(size_t)o->range * SIM_SNAP_GROUPS], 0,
                   SIM_SNAP_GROUPS * sizeof *s->groups);
            *range = o->range;
            *rc = 0;
            answer = 1;
            break;
        case CPS_RO_JOIN_INSTALL:
            *range = o->range;
            *rc = install_snapshot(sm, s, o, value);
            answer = 1;
            break;
        default:
            sim_fail(sm, "action", "server %u: unknown ready item %d", s->id, o->kind);
        }
    }
    return answer && !sm->failed && s->state != SRV_CRASHED;
}

/* Perform the ready list, and answer the store's outcome of a join's step until none is owed;
 * a range whose join ended unfinished is no longer being copied. */
static void perform(sim *sm, sim_server *s)
{
    uint32_t range = 0;
    int rc = 0;
    uint64_t value = 0;
    while (perform_list(sm, s, &range, &rc, &value)) {
        cps__replica_join_result(s->rep, range, rc, value, sm->now);
        rc = 0;
        value = 0;
    }
    if (s->state == SRV_CRASHED)
        return;
    for (uint32_t r = 0; r < sm->nranges; r++)
        if (s->copying[r] && !cps__replica_joining(s->rep, r))
            s->copying[r] = 0;
    if (sm->p.mode == SIM_SSP && !sm->failed)
        sim_check_ssp_parked(sm, s);
    /* The first held ack schedules its own flush, as the server's loop sleeps no longer than
     * cps__replica_wait_ms. */
    int wait = cps__replica_wait_ms(s->rep, sm->now, INT_MAX);
    if (wait < INT_MAX && !s->acks_at) {
        s->acks_at = sm->now + (uint64_t)wait;
        sim_ev_push(sm, s->acks_at, EV_ACKS, s->id, NULL);
    }
}

/* Step the messages a view released, one at a time. */
static void run_held(sim *sm, sim_server *s)
{
    while (!sm->failed && s->state != SRV_CRASHED && cps__replica_next(s->rep, sm->now))
        perform(sm, s);
}

/* ---- (re)starting ---- */

/* --fence-faults: the WELCOME that let the previous life in reaches the new one, late (a copy
 * the network delayed, or one queued in a socket the new process inherits the address of): it
 * names chain positions whose state the new life may no longer hold (a wiped disk, or updates
 * acknowledged elsewhere since). Only the WELCOME answering this life's HELLO may let it in
 * (invariant 14). */
static void late_welcome(sim *sm, sim_server *s)
{
    cps__msg_hdr h = {
        .type = CPS_MSG_WELCOME, .epoch = s->welcome_epoch, .req_seq = s->welcome_life};
    sm->stale_welcomes++;
    sim_trace(sm, "s%u (life %u) will get the WELCOME of e%" PRIu64 " of its life %u late", s->id,
              s->boot, s->welcome_epoch, s->welcome_life);
    sim_send_hdr(sm, 0, s->id, &h, NULL, 0, sim_rnd(sm, 60));
}

void sim_server_reset(sim *sm, sim_server *s)
{
    /* A new replica, so a new fence (not joined); no joins: they went with the replica (the
     * process, or the fenced state). */
    replica_new(sm, s);
    memset(s->copying, 0, sm->nranges * sizeof *s->copying);
    s->nlingers = 0; /* their sockets went with the process, or the fenced replica */
    s->epoch = 0;
    s->view = NULL;
    s->state = SRV_HELLO;
    s->boot++;
    s->hello_at = 0;
    s->beat_at = 0;
    s->seen_view = 0;
    s->stop_signals = 0; /* a new process: no signal, no drain asked */
    s->drain = 0;
    if (sm->p.fence_faults && s->welcome_epoch && sim_chance(sm, 500))
        late_welcome(sm, s);
    if (!s->ticking) {
        s->ticking = 1;
        sim_ev_push(sm, sm->now + 1 + sim_rnd(sm, sm->p.tick_ms), EV_TICK, s->id, NULL);
    }
}

void sim_server_start(sim *sm, sim_server *s, const cps__view *v)
{
    s->sm = sm;
    s->rs = sim_xcalloc(sm->nranges, sizeof *s->rs);
    s->copying = sim_xcalloc(sm->nranges, sizeof *s->copying);
    s->groups = sim_xcalloc((size_t)sm->nranges * SIM_SNAP_GROUPS, sizeof *s->groups);
    replica_new(sm, s);
    s->ticking = 1;
    s->epoch = v->epoch; /* the replica (and its fence) install v as it is */
    s->view = v;
    /* The job's first view, known to count every server in: the fence joins with it. It
     * stands for the WELCOME of the first life (a late copy may reach the next one). */
    s->welcome_epoch = v->epoch;
    s->welcome_life = s->boot;
    cps__replica_set_view(s->rep, v, s->id, 1, 0);
    perform(sm, s);
}

void sim_server_free(sim *sm, sim_server *s)
{
    (void)sm;
    cps__replica_destroy(s->rep);
    s->rep = NULL;
    s->chain = NULL;
    free(s->parked);
    free(s->copying);
    free(s->groups);
    free(s->lingers);
    free(s->drain_held);
}

/* A view: the replica decides (replica_fence.c: confirmed, newer, fenced) and installs it. */
static void take_view(sim *sm, sim_server *s, uint64_t epoch)
{
    const cps__view *v = &sm->views[epoch];
    int verdict = cps__replica_view_news(s->rep, v, s->id, 0);
    perform(sm, s);
    if (verdict == CPS_RV_DONE || s->state == SRV_CRASHED)
        return;
    verdict = cps__replica_view(s->rep, v, s->id, sm->now);
    if (verdict == CPS_RV_FENCED) {
        /* Declared dead (paused, partitioned, slow): drop the chain state and rejoin as a fresh
         * replica (the server does it at its loop's next turn, serving nothing meanwhile); the
         * store stays, cleared range by range when joining. */
        perform(sm, s);
        sim_trace(sm, "s%u fenced by view e%" PRIu64 ": rejoins", s->id, epoch);
        sm->rejoins++;
        sim_server_reset(sm, s);
        return;
    }
    if (verdict != CPS_RV_INSTALLED) {
        perform(sm, s);
        return;
    }
    s->epoch = epoch;
    s->view = v;
    sim_trace(sm, "s%u installs view e%" PRIu64, s->id, epoch);
    perform(sm, s);
    if (s->state == SRV_CRASHED)
        return;
    run_held(sm, s);
}

/* One chunk onto the stream's connection (one per snapshot thread, production's socket of its
 * own): in order, each after a network delay; a partition or a drop breaks the connection, and
 * the thread, which cannot tell, sends the rest into nothing. Lost with its sender's process. */
static void stream_send(sim *sm, sim_server *s, uint32_t to, const cps__msg_hdr *h,
                        const uint8_t *pl, snap_stream *st)
{
    if (st->broken)
        return;
    if (sm->p.snap_gaps && !st->gapped && h->aux == 0 &&
        sim_rng_next(&sm->gap_rng) % 1000 < SIM_SNAP_GAP_PER_MILLE) {
        /* The connection broke with this chunk on the wire and nanomsg connected again: this
         * one is lost, the next goes out over the new connection. */
        st->gapped = 1;
        sm->snap_gaps++;
        sim_trace(sm, "s%u snapshot of r%u to s%u: chunk %u lost, the connection reconnected",
                  s->id, h->range, to, h->req_worker);
        return;
    }
    if ((sm->cut_active && sm->cut[s->id][to]) ||
        (sm->lossy && snap_rnd(sm, 1000) < sm->p.drop_per_mille)) {
        st->broken = 1;
        sm->drops++;
        sim_trace(sm, "s%u snapshot of r%u to s%u: connection broken", s->id, h->range, to);
        return;
    }
    size_t len = CPS_WIRE_HDR_SIZE + SNAP_CHUNK_LEN;
    sim_msg *c = sim_xmalloc(sizeof *c + len);
    c->from = s->id;
    c->to = to;
    c->inc = s->inc;
    c->wire = 0;
    c->stream = 1;
    c->len = len;
    cps__msg_hdr hh = *h;
    hh.payload_len = hh.raw_len = SNAP_CHUNK_LEN;
    cps__wire_hdr_encode(c->buf, &hh);
    memcpy(c->buf + CPS_WIRE_HDR_SIZE, pl, SNAP_CHUNK_LEN);
    /* As the network's delays: mostly a few ms, sometimes long. */
    uint64_t t = sm->now + (snap_rnd(sm, 1000) < sm->p.long_per_mille ? 20 + snap_rnd(sm, 800)
                                                                      : 1 + snap_rnd(sm, 12));
    if (t < st->floor)
        t = st->floor;
    st->floor = t;
    sim_ev_push(sm, t, EV_DELIVER, to, c);
    sm->sent++;
}

/* The snapshot thread: the first step reads the store (whatever the chain did since), every
 * step sends the next chunk of that read, 1-40 ms apart, so that a repeated SNAP_REQ of the join
 * can come while it streams. */
void sim_snapshot_run(sim *sm, sim_msg *m)
{
    sim_server *s = &sm->servers[m->from - 1];
    if (s->state == SRV_CRASHED || s->inc != m->inc) {
        free(m); /* the thread died with the process */
        return;
    }
    if (s->state == SRV_PAUSED) {
        sim_ev_push(sm, s->resume_at + 1, EV_SNAPSHOT, s->id, m);
        return;
    }
    cps__msg_hdr h;
    cps__wire_hdr_decode(m->buf, CPS_WIRE_HDR_SIZE, &h); /* the stream's state follows */
    snap_stream st;
    memcpy(&st, m->buf + CPS_WIRE_HDR_SIZE, sizeof st);
    if (st.snap == UINT64_MAX) {
        if (sm->nsnaps == sm->snaps_cap) {
            sm->snaps_cap = sm->snaps_cap ? 2 * sm->snaps_cap : 16;
            sm->snaps = realloc(sm->snaps, sm->snaps_cap * sizeof *sm->snaps);
            if (!sm->snaps) {
                fprintf(stderr, "sim: out of memory\n");
                exit(2);
            }
        }
        sim_check_copy_source(sm, s, h.range, m->to);
        sim_snap *sn = sim_xcalloc(1, sizeof *sn);
        sn->range = h.range;
        sn->source = s->id;
        sn->chunks = 1 + (uint32_t)snap_rnd(sm, 4);
        sim_rstore_copy(&sn->st, &s->rs[h.range]);
        st.snap = sm->nsnaps;
        sm->snaps[sm->nsnaps++] = sn;
        sim_trace(sm, "s%u snapshot %" PRIu64 " of r%u at seq %" PRIu64 " -> s%u (%u chunks)",
                  s->id, st.snap, h.range, sn->st.applied, m->to, sn->chunks);
    }
    const sim_snap *sn = sm->snaps[st.snap];
    uint32_t i = st.next++;
    h.req_seq = sn->st.applied;
    h.aux = i + 1 == sn->chunks; /* the last */
    h.req_worker = i;            /* its number in the stream, as production's job_flush */
    uint8_t pl[SNAP_CHUNK_LEN];
    cps__le64_put(pl, st.snap);
    cps__le32_put(pl + 8, i);
    cps__le32_put(pl + 12, sn->chunks);
    stream_send(sm, s, m->to, &h, pl, &st);
    if (st.next < sn->chunks) {
        memcpy(m->buf + CPS_WIRE_HDR_SIZE, &st, sizeof st);
        sim_ev_push(sm, sm->now + 1 + snap_rnd(sm, 40), EV_SNAPSHOT, s->id, m);
        return;
    }
    /* Sent, but its socket lingers until the replica lets it close (sim_reap_snapshots): the
     * joiner's requests of this join that come meanwhile are ignored, as in production. */
    if (s->nlingers == s->lingers_cap) {
        s->lingers_cap = s->lingers_cap ? 2 * s->lingers_cap : 4;
        s->lingers = realloc(s->lingers, s->lingers_cap * sizeof *s->lingers);
        if (!s->lingers) {
            fprintf(stderr, "sim: out of memory\n");
            exit(2);
        }
    }
    s->lingers[s->nlingers++] = (struct sim_linger){
        .range = h.range, .joiner = m->to, .join_id = h.step, .ended_ms = sm->now};
    free(m);
}

/* ---- receive, step, perform ---- */

/* Invariant 15: let in (started again, or rejoining after a fence), a server holds only the
 * ranges its view gives it: what it holds of the others is stale (they moved on meanwhile, new
 * updates were acknowledged elsewhere), and would be taken for a replica's state if it kept it. */
static void check_let_in_ranges(sim *sm, const sim_server *s)
{
    for (uint32_t r = 0; r < sm->nranges && !sm->failed; r++) {
        const sim_rstore *st = &s->rs[r];
        if (sim_in_chain(&s->view->ranges[r], s->id) || s->copying[r] ||
            (st->applied == 0 && st->set_n == 0))
            continue;
        sim_fail(sm, "(15) let in, a server holds only the ranges it serves",
                 "server %u let in at epoch %" PRIu64 " keeps range %u (applied %" PRIu64
                 "), which its view does not give it",
                 s->id, s->epoch, r, st->applied);
    }
}

/* Invariant 16: unsure of its standing (its loop stalled past the failure timeout, so it may
 * have been declared dead and replaced), a replica serves no worker's request until a view says
 * it is still in: nothing applied, nothing answered. The chain's epochs fence its forwards, but
 * not what it applies or answers itself. */
static void check_unsure_served(sim *sm, const sim_server *s, const cps__msg_hdr *h,
                                const cps__replica_out *out, size_t n)
{
    if ((h->type != CPS_MSG_PUSH && h->type != CPS_MSG_PUSH_PULL && h->type != CPS_MSG_PULL &&
         h->type != CPS_MSG_DECLARE) ||
        !cps__fence_unsure(cps__replica_fence(s->rep)))
        return;
    for (size_t i = 0; i < n; i++)
        if (out[i].kind == CPS_RO_WRITE || (out[i].kind == CPS_RO_REPLY && out[i].to == h->sender &&
                                            out[i].req.req_seq == h->req_seq)) {
            sim_fail(sm, "(16) an unsure replica serves nothing",
                     "server %u, unsure of its standing, %s worker %u's %s of range %u", s->id,
                     out[i].kind == CPS_RO_WRITE ? "applied" : "answered", h->sender,
                     sim_msg_name(h->type), h->range);
            return;
        }
}

/* A request or chain message into the replica (a copy it owns). A pull it neither answers nor
 * holds for a newer view is parked by the SSP gate: kept for invariant 11. */
static void step_data(sim *sm, sim_server *s, const cps__msg_hdr *h, const uint8_t *pl)
{
    if (h->epoch < s->epoch &&
        (h->type == CPS_MSG_FWD || h->type == CPS_MSG_CHAIN_ACK || h->type == CPS_MSG_CHAIN_MARK))
        sm->fenced++; /* the chain drops it: fenced by epoch */
    uint8_t *own = sim_xmalloc(h->payload_len ? h->payload_len : 1);
    memcpy(own, pl, h->payload_len);
    cps__replica_msg m = {*h, own, h->payload_len, own};
    uint32_t held = cps__replica_held(s->rep);
    cps__replica_step(s->rep, &m, sm->now);
    if (cps__replica_held(s->rep) > held)
        sim_trace(sm, "s%u holds %s of e%" PRIu64 " until it has that view", s->id,
                  sim_msg_name(h->type), h->epoch);
    int answered = 0;
    const cps__replica_out *out;
    size_t n = cps__replica_ready(s->rep, &out);
    for (size_t i = 0; i < n; i++)
        answered |= out[i].kind == CPS_RO_REPLY && out[i].to == h->sender &&
                    out[i].req.req_seq == h->req_seq;
    check_unsure_served(sm, s, h, out, n);
    /* Unsure of its standing now, the replica dropped the pull unanswered: not parked. */
    if (h->type == CPS_MSG_PULL && sm->p.mode == SIM_SSP && !answered &&
        cps__replica_held(s->rep) == held && !cps__fence_unsure(cps__replica_fence(s->rep))) {
        if (s->nparked == s->parked_cap) {
            s->parked_cap = s->parked_cap ? 2 * s->parked_cap : 16;
            s->parked = realloc(s->parked, s->parked_cap * sizeof *s->parked);
            if (!s->parked) {
                fprintf(stderr, "sim: out of memory\n");
                exit(2);
            }
        }
        s->parked[s->nparked++] = (sim_cookie){h->sender, h->range, h->req_seq, h->aux};
        sm->ssp_parked++;
        sim_trace(sm, "s%u parks pull r%u w%u at clock %" PRIu64, s->id, h->range, h->sender,
                  h->aux);
    }
    perform(sm, s);
}

void sim_server_deliver(sim *sm, sim_server *s, const sim_msg *m)
{
    cps__msg_hdr h;
    if (cps__wire_hdr_decode(m->buf, m->len, &h) != 0) {
        sim_fail(sm, "wire", "server %u got an undecodable message from %u", s->id, m->from);
        return;
    }
    const uint8_t *pl = m->buf + CPS_WIRE_HDR_SIZE;
    sim_trace(sm, "s%u(e%" PRIu64 ") <- %u %s r%u seq %" PRIx64 " e%" PRIu64, s->id, s->epoch,
              m->from, sim_msg_name(h.type), h.range, h.req_seq, h.epoch);
    /* The checker's own view of "our WELCOME" (it names this life, sent in our HELLO): the
     * replica decides from the boot id it is given, and invariant 14 holds it to this. */
    int ours = h.type == CPS_MSG_WELCOME && h.req_seq == s->boot;
    if (s->state == SRV_HELLO) {
        /* Not let in yet: the replica's fence lets only our WELCOME in. */
        int ok = h.type == CPS_MSG_WELCOME || h.type == CPS_MSG_VIEW;
        if (ok) {
            ok = cps__replica_admit(s->rep, &h, s->boot, sm->now) == CPS_FENCE_SERVE;
            perform(sm, s);
        }
        if (ok && !ours) {
            /* Invariant 14: a VIEW, or a WELCOME that answered an earlier life's HELLO (late,
             * or a copy), names chain positions the new life does not hold the state of. */
            sim_fail(sm, "(14) only this life's WELCOME lets a server in",
                     "server %u (life %u) let in by a %s of epoch %" PRIu64
                     " meant for life %" PRIu64,
                     s->id, s->boot, sim_msg_name(h.type), h.epoch, h.req_seq);
            return;
        }
        if (!ok) {
            if (m->from == 0 && h.type == CPS_MSG_VIEW && h.epoch > s->seen_view)
                s->seen_view = h.epoch; /* installed once let in, if newer than the welcome */
            return;
        }
        const cps__node_info *me = cps__view_node(&sm->views[h.epoch], s->id);
        if (!me || !me->alive)
            return; /* the server would install it; it only leads to another fence */
        s->state = SRV_UP;
        s->wiped = 0;
        s->epoch = 0;
        s->welcome_epoch = h.epoch;
        s->welcome_life = s->boot;
        sim_trace(sm, "s%u let in at e%" PRIu64, s->id, h.epoch);
        take_view(sm, s, h.epoch);
        if (s->state == SRV_UP && s->epoch == h.epoch)
            check_let_in_ranges(sm, s);
        if (s->state == SRV_UP && s->seen_view > s->epoch)
            take_view(sm, s, s->seen_view);
        return;
    }
    /* The replica admits what it steps itself; a view, the replica's admission first (a stall
     * the scheduler may have declared us dead in, then what our standing lets through). */
    switch (h.type) {
    case CPS_MSG_VIEW:
    case CPS_MSG_WELCOME: {
        int verdict = cps__replica_admit(s->rep, &h, s->boot, sm->now);
        perform(sm, s);
        if (verdict != CPS_FENCE_SERVE) {
            sim_trace(sm, "s%u drops %s: %s", s->id, sim_msg_name(h.type),
                      cps__fence_unsure(cps__replica_fence(s->rep)) ? "unsure of its standing"
                                                                    : "not for it now");
            break;
        }
        if (s->state != SRV_CRASHED)
            take_view(sm, s, h.epoch);
        break;
    }
    case CPS_MSG_FWD:
    case CPS_MSG_CHAIN_ACK:
    case CPS_MSG_CHAIN_MARK:
    case CPS_MSG_PUSH:
    case CPS_MSG_PUSH_PULL:
    case CPS_MSG_DECLARE:
    case CPS_MSG_PULL:
    case CPS_MSG_SNAP_REQ:
    case CPS_MSG_SNAP:
    case CPS_MSG_JOIN_RANGE:
        step_data(sm, s, &h, pl);
        break;
    default:
        sim_fail(sm, "wire", "server %u got unexpected message type %u", s->id, h.type);
    }
}

/* The server's timer (before its loop sleeps): standing, held acks and re-sends (the replica's
 * tick), joins, heartbeats. A server waiting for its WELCOME turns its loop too and tells the
 * replica at every turn, as production's does, so that a stall is measured from its last turn
 * (not from its start: let in after a long wait, it would be unsure at once), and runs nothing
 * else. */
/* As the server's shell reaps its snapshot threads at every turn: a sent snapshot's socket
 * closes once the replica says it may (the joiner in the chain, gone or dead, or the linger
 * over). */
static void reap_snapshots(sim *sm, sim_server *s)
{
    for (uint32_t i = 0; i < s->nlingers; i++) {
        const struct sim_linger *l = &s->lingers[i];
        if (!cps__replica_snapshot_may_close(s->rep, l->range, l->joiner, 0, l->ended_ms, sm->now))
            continue;
        sim_trace(sm, "s%u snapshot of r%u to s%u closed", s->id, l->range, l->joiner);
        cps__replica_snapshot_closed(s->rep, l->range, l->joiner, l->join_id);
        s->lingers[i--] = s->lingers[--s->nlingers];
    }
}

void sim_server_tick(sim *sm, sim_server *s)
{
    cps__replica_turned(s->rep, sm->now);
    perform(sm, s);
    if (s->state != SRV_CRASHED)
        reap_snapshots(sm, s);
    if (sm->failed || s->state != SRV_UP)
        return;
    cps__replica_tick(s->rep, sm->now, 0);
    perform(sm, s);
    if (!sm->failed && s->state != SRV_CRASHED) {
        cps__replica_join_tick(s->rep, sm->now);
        perform(sm, s);
    }
    if (!sm->failed && s->stop_signals)
        sim_drain_turn(sm, s);
}

/* Held acks are due (EV_ACKS); a paused server sends them at its next tick after resuming, a
 * crashed one lost them. */
void sim_server_acks_due(sim *sm, sim_server *s)
{
    s->acks_at = 0;
    if (s->state != SRV_UP)
        return;
    cps__replica_tick(s->rep, sm->now, 0);
    perform(sm, s);
}
