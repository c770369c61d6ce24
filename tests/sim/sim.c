/* The cluster simulator: S servers' chain state machines (replication/chain.c) and W workers in
 * one process, over a simulated network that delays, drops, duplicates and reorders messages,
 * with servers crashing or pausing and the scheduler publishing new views, all driven by one
 * seed. Invariants are checked after every event; a failing seed prints one line to replay it.
 *
 * Nothing here reads a clock or sleeps: virtual time advances event by event (FoundationDB's
 * and TigerBeetle's deterministic simulation), so a seed is a reproducible run.
 *
 * What is modelled (see the report in the issue for what is not):
 *  - servers: a cps__chain each, an in-memory store behind cps__chain_store_ops that mirrors what
 *    src/server/update.c writes to LMDB, and the head-side glue of update.c (request checks,
 *    cps__chain_admit, sync aggregation in worker-rank order, submit, performing actions);
 *  - workers: dense per-(worker, range) push sequences, sparse pushes (CPS_SEQ_SPARSE), declares
 *    and pulls, several in flight, re-sent after a timeout and on every new view, replies matched
 *    by (range, req_seq), as src/worker/client.c does;
 *  - the scheduler: the production coordinator (recovery/coordinator.c, sim_sched.c): it admits
 *    every node and places the ranges, declares silent servers dead (heartbeats) and servers
 *    that leave its probes unanswered after the workers' reports (data-path suspicion), takes
 *    a new life of a server out of its chains, repairs and balances ranges by state transfer,
 *    batching joiners that catch up into one view, drains servers the operator names, runs the
 *    final barrier and ends the job; its views reach each node after a random delay; with
 *    --sched-restarts it also restarts, resuming from what it persisted;
 *  - restarts: a crashed server comes back on its store (kill -9 with LMDB on disk) or on an
 *    empty one (a replaced disk), with a fresh cps__chain, and asks to be let in (HELLO); a
 * cps__server told it was declared dead rejoins the same way (server.c's rejoin); whether a server
 * is fenced, unsure of its standing after a pause (it then drops what comes and asks for the view)
 * or may serve is recovery/fence.c's decision, as in server.c;
 *  - state transfer: the joiner's decisions are recovery/joiner.c's, performed as transfer.c
 *    performs them: JOIN_RANGE -> begin_join and clearing the copy -> SNAP_REQ (re-sent until
 *    the snapshot comes) -> add_shadow at the tail, then a snapshot of the tail's store a moment
 *    later -> SNAP over the network (one message) -> install, join_ready -> CAUGHT_UP -> a view
 *    with the joiner as the new tail, whose reads wait for CHAIN_MARK
 *    (cps__chain_can_serve_pull), and a second CAUGHT_UP (aux 1) once they may be served; a join
 *    given up (timeout, a view that ends it, a failed step) reports CAUGHT_UP aux 2;
 *  - partitions: servers cut off from the scheduler, their peers or the workers (both ways) for
 *    a while; the scheduler may declare them dead meanwhile, and they must be fenced;
 *  - SSP (--mode ssp:N): each server's gate is replication/ssp.c, moved at every APPLY, its
 *    clocks stored with the update and carried by snapshots and loaded at a restart and after
 *    a snapshot, as update.c and transfer.c do; pulls park and wake as in update.c. Workers
 *    run steps per range of a dense push, then a pull at that clock. Checked: every APPLY
 *    leaves the gate with the clocks the applied updates imply (9), no pull is answered beyond
 *    the bound (10), none stays parked once within it (11), and the run finishes.
 *  - backup workers (--backup-workers B, sync): a step closes with the first W-B pushes
 *    (replication/sync.c); the head marks a push of a closed step late from what its store
 *    holds, as update.c does, and the worker moves on to the closed step. The last worker is a
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
#include "recovery/requests.h"
#include "recovery/view_change.h"
#include "replication/chain.h"

#include "sim.h"

/* ---- PRNG: splitmix64 seeds xoshiro256** (Blackman & Vigna) ---- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void sim_rng_seed(sim_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t sim_rng_next(sim_rng *r)
{
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

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

/* ---- event queue: a binary heap ordered by (time, insertion number) ---- */

static int ev_less(const sim_event *a, const sim_event *b)
{
    return a->t < b->t || (a->t == b->t && a->n < b->n);
}

static void ev_push(sim *sm, uint64_t t, int type, uint32_t node, sim_msg *m)
{
    if (sm->nev == sm->ev_cap) {
        sm->ev_cap = sm->ev_cap ? sm->ev_cap * 2 : 1024;
        sm->ev = realloc(sm->ev, sm->ev_cap * sizeof *sm->ev);
        if (!sm->ev) {
            fprintf(stderr, "sim: out of memory\n");
            exit(2);
        }
    }
    sim_event e = {t, sm->ev_counter++, type, node, m};
    size_t i = sm->nev++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!ev_less(&e, &sm->ev[parent]))
            break;
        sm->ev[i] = sm->ev[parent];
        i = parent;
    }
    sm->ev[i] = e;
}

static sim_event ev_pop(sim *sm)
{
    sim_event top = sm->ev[0];
    sim_event last = sm->ev[--sm->nev];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const sim_event *best = &last;
        if (l < sm->nev && ev_less(&sm->ev[l], best))
            m = l, best = &sm->ev[l];
        if (r < sm->nev && ev_less(&sm->ev[r], best))
            m = r;
        if (m == i)
            break;
        sm->ev[i] = sm->ev[m];
        i = m;
    }
    if (sm->nev > 0)
        sm->ev[i] = last;
    return top;
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
        m->len = len;
        memcpy(m->buf, buf, len);
        ev_push(sm, sm->now + extra + net_delay(sm), EV_DELIVER, to, m);
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

/* For sim_sched.c: the run's randomness, the network, the fault injector's restarts. */
uint64_t sim_rnd(sim *sm, uint64_t n)
{
    return rnd(sm, n);
}

int sim_chance(sim *sm, uint32_t per_mille)
{
    return chance(sm, per_mille);
}

void sim_send_hdr(sim *sm, uint32_t from, uint32_t to, const cps__msg_hdr *h, const void *pl,
                  size_t plen, uint64_t extra)
{
    send_hdr(sm, from, to, h, pl, plen, extra);
}

/* A message a partition cuts but the network never drops, duplicates or holds back long: what a
 * TCP connection gives a small message with no retry behind it (the scheduler's probes and their
 * answers). With the long delays, a probe answered late declared a live server dead, and with a
 * replaced disk elsewhere that lost acknowledged updates (seeds 8540 and 9471 of --faults scale:
 * a question for recovery/suspect.c, which decides on one answer's lateness). */
void sim_send_reliable(sim *sm, uint32_t from, uint32_t to, const cps__msg_hdr *h)
{
    int lossy = sm->lossy;
    uint32_t long_pm = sm->p.long_per_mille;
    sm->lossy = 0;
    sm->p.long_per_mille = 0;
    send_hdr(sm, from, to, h, NULL, 0, 0);
    sm->lossy = lossy;
    sm->p.long_per_mille = long_pm;
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
    ev_push(sm, sm->now + after, EV_RESTART, id, NULL);
}

/* ---- small helpers ---- */

static int is_worker_id(const sim *sm, uint32_t id)
{
    return id > sm->p.servers && id <= sm->p.servers + sm->p.workers;
}

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

/* Key-set signature of a range's dense sync pushes: every worker pushes the same keys. */
static uint64_t range_sig(uint32_t r)
{
    uint64_t x = r;
    return splitmix64(&x) | 1;
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

/* ---- servers: (re)starting ---- */

static void ssp_drop(void *ctx, void *cookie)
{
    (void)ctx;
    free(cookie);
}

static void ssp_wake(sim *sm, sim_server *s);

/* update.c's cps__server_ssp_load: the gate's clocks of range r become those in the store, and
 * pulls they release are answered (or refused: we are not the tail while copying). */
static void ssp_load(sim *sm, sim_server *s, uint32_t r)
{
    cps__ssp_forget_range(s->ssp, r);
    for (uint32_t k = 0; k < sm->p.workers; k++)
        if (s->rs[r].clock[k] &&
            cps__ssp_pushed(s->ssp, sim_cur_view(sm), r, sm->p.servers + 1 + k, s->rs[r].clock[k]))
            sim_fail(sm, "api", "server %u: cps__ssp_pushed failed", s->id);
    if (cps__ssp_parked(s->ssp) && !sm->failed)
        ssp_wake(sm, s);
}

static void chain_new(sim *sm, sim_server *s)
{
    static const cps__chain_store_ops ops = {sim_op_range_seq, sim_op_dedup, sim_op_agg_step,
                                             sim_op_drop_cookie};
    cps__chain_config cc = {s->id, sm->p.resend_ms, sm->p.max_unacked};
    if (cps__chain_create(&cc, &ops, s, &s->chain) != 0) {
        fprintf(stderr, "sim: cps__chain_create failed\n");
        exit(2);
    }
    /* SSP: a fresh gate (parked pulls are lost with the process: their workers re-send) whose
     * clocks start where the store has them, as update.c's cps__server_chain_init. */
    s->nparked = 0; /* freed by ssp_drop */
    cps__ssp_destroy(s->ssp);
    s->ssp = NULL;
    if (sm->p.mode == SIM_SSP && cps__ssp_create(ssp_drop, NULL, &s->ssp) != 0) {
        fprintf(stderr, "sim: cps__ssp_create failed\n");
        exit(2);
    }
    for (uint32_t r = 0; s->ssp && r < sm->nranges; r++)
        ssp_load(sm, s, r);
}

static void joiner_new(sim *sm, sim_server *s);

/* A restarted process, or server.c's rejoin() after being fenced: a fresh chain state machine
 * (cps__chain_destroy releases the cookies of requests it was holding), no aggregation slots, no
 * joins, no view; the store stays as it is. It asks the scheduler to let it in (HELLO). */
static void server_reset(sim *sm, sim_server *s)
{
    cps__chain_destroy(s->chain);
    chain_new(sm, s);
    cps__sync_destroy(s->sync);
    s->sync = NULL;
    cps__ackhold_destroy(s->acks); /* held acks are lost with the chain state they came from */
    s->acks = NULL;
    joiner_new(sm, s); /* no joins: they went with the process (or the fenced state) */
    cps__fence_rejoin(s->fence, sm->now);
    memset(s->copying, 0, sm->nranges * sizeof *s->copying);
    s->epoch = 0;
    s->view = NULL;
    s->state = SRV_HELLO;
    s->boot++;
    s->hello_at = 0;
    s->beat_at = 0;
    s->seen_view = 0;
    if (!s->ticking) {
        s->ticking = 1;
        ev_push(sm, sm->now + 1 + rnd(sm, sm->p.tick_ms), EV_TICK, s->id, NULL);
    }
}

/* ---- servers: performing the state machine's actions ---- */

static void server_actions(sim *sm, sim_server *s);
static void send_late(sim *sm, sim_server *s, uint32_t worker, uint32_t range, uint64_t req_seq,
                      uint64_t closed);
static void run_joiner(sim *sm, sim_server *s, const sim_snap *sn);

static void reply_to_worker(sim *sm, sim_server *s, uint8_t type, uint32_t worker, uint32_t range,
                            uint64_t req_seq, int status, const void *pl, size_t plen, uint64_t aux)
{
    cps__msg_hdr h = {0};
    h.type = type;
    h.flags = CPS_WF_REPLY;
    h.status = status;
    h.epoch = s->epoch;
    h.req_worker = worker;
    h.range = range;
    h.req_seq = req_seq;
    h.aux = aux;
    send_hdr(sm, s->id, worker, &h, pl, plen, 0);
}

/* Persist before send: a replica forwards or acknowledges only what it applied. (A CHAIN_MARK
 * is no data: a replica still catching up passes on its own MARK.) */
static int check_persisted(sim *sm, sim_server *s, const cps__msg_hdr *h)
{
    if (h->range < sm->nranges &&
        (h->type == CPS_MSG_CHAIN_MARK || h->req_seq <= s->rs[h->range].applied))
        return 0;
    sim_fail(sm, "persist before send",
             "server %u sent %s of range %u seq %" PRIu64 " having applied %" PRIu64, s->id,
             msg_name(h->type), h->range, h->req_seq,
             h->range < sm->nranges ? s->rs[h->range].applied : 0);
    return -1;
}

/* Send the acks the hold released. Persist-before-send was checked when the chain made them:
 * holding is a network that delays acks, and what the ack covered may be gone by now (a joiner
 * that cleared its copy for a new JOIN_RANGE still sends the held shadow ack, which commits
 * nothing at the source; sim seed 1935 with the check here). */
static void send_released_acks(sim *sm, sim_server *s)
{
    const cps__ackhold_send *out;
    size_t n = s->acks ? cps__ackhold_sends(s->acks, &out) : 0;
    for (size_t i = 0; i < n && !sm->failed; i++) {
        sim_trace(sm, "s%u send held CHAIN_ACK r%u seq %" PRIu64 " e%" PRIu64 " -> s%u", s->id,
                  out[i].hdr.range, out[i].hdr.req_seq, out[i].hdr.epoch, out[i].to);
        send_hdr(sm, s->id, out[i].to, &out[i].hdr, NULL, 0, 0);
    }
}

/* update.c's hold_ack: 1 if held. The first held ack schedules its own flush, as the server's
 * loop sleeps no longer than cps__ackhold_wait_ms. */
static int hold_ack(sim *sm, sim_server *s, uint32_t to, const cps__msg_hdr *h)
{
    if (!s->acks && cps__ackhold_create(&s->acks) != 0) {
        fprintf(stderr, "sim: out of memory\n");
        exit(2);
    }
    uint32_t before = cps__ackhold_held(s->acks);
    int held = cps__ackhold_offer(s->acks, s->view ? s->view->nranges : 0, to, h, sm->now);
    send_released_acks(sm, s);
    if (held && before == 0)
        ev_push(sm, sm->now + CPS_ACK_HOLD_MS, EV_ACKS, s->id, NULL);
    return held;
}

/* update.c's cps__server_flush_acks. */
static void flush_acks(sim *sm, sim_server *s, int force)
{
    if (!cps__ackhold_held(s->acks))
        return;
    cps__ackhold_due(s->acks, sm->now, force);
    send_released_acks(sm, s);
}

/* A pull the tail answers: it reads its applied sequence number and the hash of its log there. */
static void answer_pull(sim *sm, sim_server *s, uint32_t r, uint32_t worker, uint64_t req_seq,
                        uint64_t clock)
{
    uint64_t seq = s->rs[r].applied;
    uint64_t hash = seq ? s->rs[r].log[seq - 1] : 0;
    sim_check_read(sm, s, r, seq, hash);
    sim_check_fresh_read(sm, s, r, seq);
    if (s->ssp && !sm->failed)
        sim_check_ssp_read(sm, s, r, worker, clock);
    if (sm->failed)
        return;
    uint8_t b[8];
    cps__le64_put(b, hash);
    reply_to_worker(sm, s, CPS_MSG_VALUES, worker, r, req_seq, 0, b, 8, seq);
}

/* update.c's wake_parked: answer every parked pull the gate releases now, if we are still the
 * range's tail and may serve reads (else EAGAIN: the worker asks its view's tail again). */
static void ssp_wake(sim *sm, sim_server *s)
{
    void *const *released;
    cps__ssp_wake(s->ssp, s->view);
    size_t n = cps__ssp_released(s->ssp, &released);
    for (size_t i = 0; i < n; i++) {
        sim_cookie *ck = released[i];
        for (uint32_t k = 0; k < s->nparked; k++)
            if (s->parked[k] == ck) {
                s->parked[k] = s->parked[--s->nparked];
                break;
            }
        sim_trace(sm, "s%u wakes pull r%u w%u at clock %" PRIu64, s->id, ck->range, ck->worker,
                  ck->clock);
        if (sm->failed) {
        } else if (!cps__chain_is_tail(s->chain, ck->range) ||
                   !cps__chain_can_serve_pull(s->chain, ck->range)) {
            reply_to_worker(sm, s, CPS_MSG_ERROR, ck->worker, ck->range, ck->req_seq, CPS_EAGAIN,
                            NULL, 0, 0);
        } else {
            answer_pull(sm, s, ck->range, ck->worker, ck->req_seq, ck->clock);
        }
        free(ck);
    }
    sim_check_ssp_parked(sm, s);
}

static void server_actions(sim *sm, sim_server *s)
{
    const cps__chain_action *acts;
    size_t n = cps__chain_actions(s->chain, &acts);
    int applied = 0;
    for (size_t i = 0; i < n && !sm->failed; i++) {
        const cps__chain_action *a = &acts[i];
        switch (a->kind) {
        case CPS_CA_APPLY:
            /* update.c's do_apply moves the clocks first; the store records what they became. */
            if (s->ssp && cps__ssp_applied(s->ssp, s->view ? s->view : sim_cur_view(sm), a->range,
                                           &a->upd) != 0)
                sim_fail(sm, "api", "server %u: cps__ssp_applied failed", s->id);
            sim_store_apply(sm, s, a);
            applied = 1;
            break;
        case CPS_CA_SEND: {
            cps__msg_hdr h;
            if (cps__wire_hdr_decode(a->msg, a->len, &h) != 0) {
                sim_fail(sm, "wire", "server %u produced an undecodable chain message", s->id);
                return;
            }
            sim_trace(sm, "s%u send %s r%u seq %" PRIu64 " e%" PRIu64 " -> s%u", s->id,
                      msg_name(h.type), h.range, h.req_seq, h.epoch, a->to);
            if (check_persisted(sm, s, &h) != 0)
                return;
            if (h.type == CPS_MSG_CHAIN_ACK && hold_ack(sm, s, a->to, &h))
                break;
            net_send(sm, s->id, a->to, a->msg, a->len, 0);
            break;
        }
        case CPS_CA_REPLY: {
            const cps__chain_req *q = &a->req;
            sim_cookie *ck = a->cookie;
            if (ck && (ck->worker != q->worker || ck->req_seq != q->req_seq)) {
                sim_fail(sm, "reply",
                         "server %u: reply cookie (w%u %" PRIx64
                         ") does not match its request (w%u %" PRIx64 ")",
                         s->id, ck->worker, ck->req_seq, q->worker, q->req_seq);
                free(ck);
                return;
            }
            int refused = ck ? ck->refused : 0;
            uint64_t late = ck ? ck->late : 0;
            if (!ck && a->upd.kind == CPS_UPD_SKIP)
                refused = (int)(int64_t)cps__le64_get(a->upd.body);
            free(ck);
            if (late) {
                /* update.c's reply_late: dropped, never applied; the worker moves on. */
                sim_check_late(sm, s, a->range, q->worker, q->req_seq);
                if (sm->failed)
                    return;
                sim_trace(sm, "s%u reply late ACK r%u w%u req %" PRIx64 " (closed %" PRIu64 ")",
                          s->id, a->range, q->worker, q->req_seq, late);
                send_late(sm, s, q->worker, a->range, q->req_seq, late);
                break;
            }
            if (refused) {
                sim_trace(sm, "s%u reply ERROR r%u w%u req %" PRIx64 " (refused) at seq %" PRIu64,
                          s->id, a->range, q->worker, q->req_seq, a->seq);
                reply_to_worker(sm, s, CPS_MSG_ERROR, q->worker, a->range, q->req_seq, refused,
                                NULL, 0, 0);
                break;
            }
            /* Invariant 1 when the answer leaves the server, not only when it arrives. */
            sim_check_reply(sm, s, a->range, q);
            if (sm->failed)
                return;
            sim_trace(sm, "s%u reply ACK r%u w%u req %" PRIx64 " at seq %" PRIu64, s->id, a->range,
                      q->worker, q->req_seq, a->seq);
            if (a->seq > sm->acked_seq[a->range])
                sm->acked_seq[a->range] = a->seq;
            /* aux: the committed sequence number the reply stands for (read-your-writes). */
            reply_to_worker(sm, s, CPS_MSG_ACK, q->worker, a->range, q->req_seq, 0, NULL, 0,
                            a->seq);
            break;
        }
        default:
            sim_fail(sm, "action", "server %u: unknown action kind %d", s->id, a->kind);
            return;
        }
    }
    if (applied && s->ssp && cps__ssp_parked(s->ssp) && !sm->failed)
        ssp_wake(sm, s);
}

/* A chain call failed in a way the simulation never provokes (no ENOMEM, no store errors). */
static int chain_rc(sim *sm, sim_server *s, const char *call, int rc)
{
    if (rc < 0)
        sim_fail(sm, "api", "server %u: %s returned %s", s->id, call, cps_err_name(rc));
    return rc;
}

static void submit(sim *sm, sim_server *s, uint32_t r, const cps__chain_update *u)
{
    /* Invariant 5: at most one server accepts writes for a range in one epoch. */
    uint32_t *head = &sm->heads[(size_t)r * (SIM_MAX_EPOCHS + 1) + s->epoch];
    if (*head && *head != s->id) {
        sim_fail(sm, "(5) one head per range per epoch",
                 "range %u epoch %" PRIu64 ": servers %u and %u both accepted writes", r, s->epoch,
                 *head, s->id);
        return;
    }
    *head = s->id;
    int rc = cps__chain_submit(s->chain, r, u, sm->now);
    if (chain_rc(sm, s, "cps__chain_submit", rc) == 0)
        server_actions(sm, s);
}

/* ---- servers: the head-side glue of src/server/update.c ---- */

/* A gathered push: the simulated gradient (the cookie of replication/sync.c). */
static void sim_grad_free(void *ctx, void *cookie)
{
    (void)ctx;
    free(cookie);
}

/* Perform the aggregator's SUBMITs: the sum in rank order, as update.c's sync_submit. */
static void sync_actions(sim *sm, sim_server *s)
{
    const cps__sync_action *acts;
    size_t n = cps__sync_actions(s->sync, &acts);
    for (size_t i = 0; i < n && !sm->failed; i++) {
        const cps__sync_action *a = &acts[i];
        if (a->kind != CPS_SA_SUBMIT)
            continue;
        cps__chain_req reqs[SIM_MAX_WORKERS];
        uint32_t nreq = 0;
        uint64_t body = 0;
        for (uint32_t k = 0; k < a->nranks && k < SIM_MAX_WORKERS; k++) {
            const cps__sync_contrib *c = &a->by_rank[k];
            if (!c->cookie)
                continue;
            reqs[nreq++] = (cps__chain_req){c->worker, c->type, 0, c->req_seq};
            body = body * 1000003u + *(uint64_t *)c->cookie; /* order-sensitive, like a float sum */
        }
        for (uint32_t k = 0; k < a->nranks; k++)
            free(a->by_rank[k].cookie);
        cps__chain_update u = {CPS_UPD_PUSH, a->step, a->sig, nreq, reqs, &body, sizeof body};
        if (!cps__chain_is_head(s->chain, a->range)) {
            /* update.c submits and logs the refusal: the head moved while the step was
             * gathered, and the workers re-send it to the new head. */
            sim_trace(sm, "s%u slot r%u step %" PRIu64 " complete but not head: dropped", s->id,
                      a->range, a->step);
            continue;
        }
        sim_trace(sm, "s%u submit aggregate r%u step %" PRIu64, s->id, a->range, a->step);
        submit(sm, s, a->range, &u);
    }
}

/* The request checks of cps__server_check_request: epoch, range, and the right role. */
static int check_request(sim *sm, sim_server *s, const cps__msg_hdr *h)
{
    if (h->epoch < s->epoch) {
        reply_to_worker(sm, s, CPS_MSG_ERROR, h->sender, h->range, h->req_seq, CPS_ESTALE_EPOCH,
                        NULL, 0, 0);
        return CPS_ESTALE_EPOCH;
    }
    if (h->epoch > s->epoch) {
        cps__msg_hdr g = {.type = CPS_MSG_GET_VIEW, .epoch = s->epoch};
        send_hdr(sm, s->id, 0, &g, NULL, 0, 0);
        reply_to_worker(sm, s, CPS_MSG_ERROR, h->sender, h->range, h->req_seq, CPS_EAGAIN, NULL, 0,
                        0);
        return CPS_EAGAIN;
    }
    const cps__range *rg = &s->view->ranges[h->range];
    uint32_t want = h->type == CPS_MSG_PULL ? rg->chain[rg->chain_len - 1] : rg->chain[0];
    if (want != s->id) {
        reply_to_worker(sm, s, CPS_MSG_ERROR, h->sender, h->range, h->req_seq, CPS_ESTALE_EPOCH,
                        NULL, 0, 0);
        return CPS_ESTALE_EPOCH;
    }
    return 0;
}

/* cps__chain_admit with a heap cookie, as update.c's admit(): returns the verdict. */
static int admit(sim *sm, sim_server *s, const cps__msg_hdr *h, uint64_t sig, int refused,
                 uint64_t late)
{
    cps__chain_req q = {h->sender, h->type, (h->flags & CPS_WF_NOAGG) ? 1 : 0, h->req_seq};
    sim_cookie *ck = xmalloc(sizeof *ck);
    *ck = (sim_cookie){h->sender, h->range, h->req_seq, 0, refused, late};
    int v = cps__chain_admit(s->chain, h->range, &q, h->step, sig, ck);
    sim_trace(sm, "s%u admit %s r%u w%u req %" PRIx64 " step %" PRIu64 ": verdict %d", s->id,
              msg_name(h->type), h->range, h->sender, h->req_seq, h->step, v);
    if (v == CPS_ADMIT_DUP) {
        server_actions(sm, s); /* may answer (and free) the cookie now */
        return v;
    }
    free(ck);
    if (v == CPS_ADMIT_NEW && !sim_is_member(sm, h->range, s->id))
        sm->zombie_writes++; /* a removed head taking a write in its old epoch */
    if (v == CPS_ADMIT_NOT_HEAD)
        reply_to_worker(sm, s, CPS_MSG_ERROR, h->sender, h->range, h->req_seq, CPS_ESTALE_EPOCH,
                        NULL, 0, 0);
    else if (v == CPS_ADMIT_BUSY)
        reply_to_worker(sm, s, CPS_MSG_ERROR, h->sender, h->range, h->req_seq, CPS_EAGAIN, NULL, 0,
                        0);
    else if (v < 0)
        chain_rc(sm, s, "cps__chain_admit", v);
    return v;
}

/* update.c's sync_mark_late: the record of what the store holds (the key set's last applied
 * step, the worker's last included request), then replication/sync.c's verdict, returned;
 * *closed receives the key set's closed step. */
static int mark_late(sim *sm, sim_server *s, const cps__msg_hdr *h, uint64_t sig, uint64_t *closed)
{
    if (!s->sync && cps__sync_create(sim_grad_free, NULL, &s->sync) != 0) {
        fprintf(stderr, "sim: out of memory\n");
        exit(2);
    }
    cps__sync_member m = {h->sender, 0};
    sim_op_agg_step(s, h->range, sig, closed);
    sim_op_dedup(s, h->range, h->sender, &m.req_seq);
    if (cps__sync_record(s->sync, h->range, sig, *closed, 1, &m) != 0) {
        fprintf(stderr, "sim: out of memory\n");
        exit(2);
    }
    int v = cps__sync_check(s->sync, h->range, sig, h->step, h->sender, h->req_seq, closed);
    if (v == CPS_SYNC_LATE || v == CPS_SYNC_STALE)
        sim_trace(sm, "s%u: push r%u w%u req %" PRIx64 " step %" PRIu64 " %s (closed %" PRIu64 ")",
                  s->id, h->range, h->sender, h->req_seq, h->step,
                  v == CPS_SYNC_LATE ? "late" : "stale", *closed);
    return v;
}

/* update.c's send_late: an ACK that says the push was dropped, and the step the key set is on. */
static void send_late(sim *sm, sim_server *s, uint32_t worker, uint32_t range, uint64_t req_seq,
                      uint64_t closed)
{
    cps__msg_hdr h = {0};
    h.type = CPS_MSG_ACK;
    h.flags = CPS_WF_REPLY | CPS_WF_LATE;
    h.epoch = s->epoch;
    h.req_worker = worker;
    h.range = range;
    h.req_seq = req_seq;
    h.aux = closed;
    send_hdr(sm, s->id, worker, &h, NULL, 0, 0);
}

static void on_request(sim *sm, sim_server *s, const cps__msg_hdr *h, const uint8_t *pl,
                       size_t plen)
{
    if (!is_worker_id(sm, h->sender) || h->range >= sm->nranges || plen != 8) {
        sim_fail(sm, "wire", "server %u got a malformed request", s->id);
        return;
    }
    if (check_request(sm, s, h) != 0)
        return;
    if (h->type == CPS_MSG_PULL) {
        if (!cps__chain_can_serve_pull(s->chain, h->range)) {
            /* update.c: a new tail that has not applied what its predecessor acknowledged. */
            sm->gated++;
            reply_to_worker(sm, s, CPS_MSG_ERROR, h->sender, h->range, h->req_seq, CPS_EAGAIN, NULL,
                            0, 0);
            return;
        }
        if (s->ssp && !cps__ssp_may_proceed(s->ssp, s->view, h->range, h->aux, h->sender)) {
            /* update.c's park_pull: answered when the slowest worker catches up. */
            sim_cookie *ck = xmalloc(sizeof *ck);
            *ck = (sim_cookie){h->sender, h->range, h->req_seq, h->aux, 0, 0};
            if (cps__ssp_park(s->ssp, h->range, h->sender, h->aux, ck) != 0) {
                free(ck);
                sim_fail(sm, "api", "server %u: cps__ssp_park failed", s->id);
                return;
            }
            sm->ssp_parked++;
            if (s->nparked == s->parked_cap) {
                s->parked_cap = s->parked_cap ? 2 * s->parked_cap : 16;
                s->parked = realloc(s->parked, s->parked_cap * sizeof *s->parked);
                if (!s->parked) {
                    fprintf(stderr, "sim: out of memory\n");
                    exit(2);
                }
            }
            s->parked[s->nparked++] = ck;
            sim_check_ssp_parked(sm, s);
            sim_trace(sm, "s%u parks pull r%u w%u at clock %" PRIu64, s->id, h->range, h->sender,
                      h->aux);
            return;
        }
        answer_pull(sm, s, h->range, h->sender, h->req_seq, h->aux);
        return;
    }
    uint64_t grad = cps__le64_get(pl);
    int sync = sm->p.mode == SIM_SYNC && h->type == CPS_MSG_PUSH && !(h->flags & CPS_WF_NOAGG);
    uint64_t sig = sync ? range_sig(h->range) : 0;
    /* update.c refuses a push naming an undeclared key before admission; the refusal still
     * uses up the push's number: it is replicated as a SKIP update carrying the error, which
     * the tail answers once committed, and a retry is a duplicate answered with the error. */
    int refused = !sync && h->aux == SIM_BAD_KEYS ? CPS_ENOTFOUND : 0;
    uint64_t closed = 0;
    int lv = sync && s->view->backup_workers ? mark_late(sm, s, h, sig, &closed) : CPS_SYNC_OPEN;
    if (lv == CPS_SYNC_STALE) {
        /* An old copy of a push the worker has finished: answered at once, without a claim. */
        send_late(sm, s, h->sender, h->range, h->req_seq, closed);
        return;
    }
    int v = admit(sm, s, h, sig, refused, lv == CPS_SYNC_LATE ? closed : 0);
    if (v != CPS_ADMIT_NEW || sm->failed)
        return;
    cps__chain_req q = {h->sender, h->type, (h->flags & CPS_WF_NOAGG) ? 1 : 0, h->req_seq};
    if (refused) {
        sim_trace(sm, "s%u refuses r%u w%u req %" PRIx64 " (unknown key)", s->id, h->range,
                  h->sender, h->req_seq);
        uint64_t status;
        cps__le64_put(&status, (uint64_t)(int64_t)refused);
        cps__chain_update u = {CPS_UPD_SKIP, h->step, 0, 1, &q, &status, sizeof status};
        submit(sm, s, h->range, &u);
        return;
    }
    if (!sync) {
        cps__chain_update u = {h->type == CPS_MSG_DECLARE ? CPS_UPD_DECLARE : CPS_UPD_PUSH,
                               h->step,
                               0,
                               1,
                               &q,
                               &grad,
                               sizeof grad};
        submit(sm, s, h->range, &u);
        return;
    }
    if (!s->sync && cps__sync_create(sim_grad_free, NULL, &s->sync) != 0) {
        fprintf(stderr, "sim: out of memory\n");
        exit(2);
    }
    uint64_t *g = xmalloc(sizeof *g);
    *g = grad;
    cps__sync_contrib c = {h->sender, h->type, h->req_seq, 1, g, (h->flags & CPS_WF_FIRST) != 0};
    int sv = cps__sync_push(s->sync, s->view, h->range, sig, h->step, worker_rank(sm, h->sender),
                            &c, sm->now);
    if (sv != CPS_SYNC_TAKEN) {
        /* CPS_SYNC_RETRY: a retry while the step is still being gathered; the reply comes when
         * it completes. The simulator's gradients all have one length. */
        free(g);
        /* CPS_SYNC_LATE / APPLIED: the chain admitted as new a step our store says is closed. */
        if (sv != CPS_SYNC_RETRY)
            sim_fail(sm, "api", "server %u: cps__sync_push returned %d", s->id, sv);
        return;
    }
    sync_actions(sm, s);
}

static void server_reset(sim *sm, sim_server *s);

/* server.c's check_stall: the server did not run for longer than the failure timeout (paused):
 * it serves nothing until a view says it is still in, and asks for one (again while no answer
 * comes). `turned`: its loop turns now (a tick), else a message arrives. */
static void server_check_stall(sim *sm, sim_server *s, int turned)
{
    int v = turned ? cps__fence_turned(s->fence, sm->now) : cps__fence_check(s->fence, sm->now);
    if (v == CPS_FENCE_CALM)
        return;
    if (v == CPS_FENCE_STALLED)
        sim_trace(sm, "s%u stalled: unsure of its standing, asks for the view", s->id);
    cps__msg_hdr g = {.type = CPS_MSG_GET_VIEW, .epoch = s->epoch};
    send_hdr(sm, s->id, 0, &g, NULL, 0, 0);
}

static int in_chain(const cps__range *rg, uint32_t id);

static void server_install_view(sim *sm, sim_server *s, uint64_t epoch)
{
    /* server.c: held acks go out under the view they were made in, as if sent at once. */
    flush_acks(sm, s, 1);
    /* recovery/fence.c decides, as in server.c's install_view. */
    const cps__node_info *me = cps__view_node(&sm->views[epoch], s->id);
    int verdict = cps__fence_view(s->fence, epoch, me != NULL, me && me->alive);
    if (verdict == CPS_FENCE_V_CONFIRMED)
        sim_trace(sm, "s%u still in at e%" PRIu64 ": serving again (%" PRIu64 " dropped)", s->id,
                  epoch, cps__fence_dropped(s->fence));
    if (verdict != CPS_FENCE_V_NEWER)
        return;
    verdict = cps__fence_install(s->fence, epoch, me != NULL, me && me->alive);
    if (verdict == CPS_FENCE_V_FENCED) {
        /* Declared dead (paused, partitioned, slow): drop the chain state and rejoin as a fresh
         * replica (server.c does it at its loop's next turn, serving nothing meanwhile); the
         * store stays, cleared range by range when joining. */
        sim_trace(sm, "s%u fenced by view e%" PRIu64 ": rejoins", s->id, epoch);
        sm->rejoins++;
        server_reset(sm, s);
        return;
    }
    if (verdict == CPS_FENCE_V_IGNORE)
        return;
    /* server.c: ranges we leave while staying in the job (moved away) drop their aggregation
     * slots and SSP clocks. */
    const cps__view *old = s->view;
    s->epoch = epoch;
    s->view = &sm->views[epoch];
    sim_trace(sm, "s%u installs view e%" PRIu64, s->id, epoch);
    for (uint32_t r = 0; old && r < sm->nranges; r++)
        if (in_chain(&old->ranges[r], s->id) && !in_chain(&s->view->ranges[r], s->id)) {
            cps__sync_forget_range(s->sync, r);
            if (s->ssp)
                cps__ssp_forget_range(s->ssp, r);
        }
    int rc = cps__chain_set_view(s->chain, s->view, sm->now);
    if (chain_rc(sm, s, "cps__chain_set_view", rc) != 0)
        return;
    server_actions(sm, s);
    for (uint32_t r = 0; r < sm->nranges; r++)
        if (s->copying[r] && sim_is_member(sm, r, s->id))
            s->copying[r] = 0;
    if (!sm->failed && cps__joiner_view(s->joiner, s->view, sm->now) > 0)
        run_joiner(sm, s, NULL);
    if (s->sync && !sm->failed &&
        chain_rc(sm, s, "cps__sync_set_view", cps__sync_set_view(s->sync, s->view)) == 0)
        sync_actions(sm, s);
    if (s->ssp && cps__ssp_parked(s->ssp) && !sm->failed)
        ssp_wake(sm, s);
}

/* ---- servers: the joiner's side of state transfer: recovery/joiner.c, run as transfer.c runs
 * it (the sim's store and snapshot stand in for LMDB and the SNAP chunks) ---- */

static int joiner_can_serve(void *ctx, uint32_t r)
{
    return cps__chain_can_serve_pull(((sim_server *)ctx)->chain, r);
}

static void joiner_new(sim *sm, sim_server *s)
{
    cps__joiner_destroy(s->joiner);
    s->joiner = NULL;
    /* As transfer.c configures it. */
    cps__joiner_config cfg = {.self = s->id,
                              .nranges = sm->nranges,
                              .timeout_ms = SIM_JOIN_TIMEOUT_MS,
                              .snap_retry_ms = SIM_SNAP_RETRY_MS,
                              .orders_may_reorder = 1};
    if (cps__joiner_create(&cfg, &s->joiner) != 0) {
        fprintf(stderr, "sim: cps__joiner_create failed\n");
        exit(2);
    }
}

/* Perform the joiner's actions, as transfer.c's run_joiner: BEGIN, INSTALL and READY end their
 * batch, and their outcome hands back the next one. sn: the snapshot just taken, or NULL. */
static void run_joiner(sim *sm, sim_server *s, const sim_snap *sn)
{
    const cps__joiner_action *a;
    size_t n = cps__joiner_actions(s->joiner, &a);
    for (size_t i = 0; i < n && !sm->failed; i++) {
        uint32_t r = a[i].range;
        int rc = 0;
        uint64_t value = 0;
        switch (a[i].kind) {
        case CPS_JA_SEND:
            send_hdr(sm, s->id, a[i].to, &a[i].hdr, NULL, 0, 0);
            continue;
        case CPS_JA_ASK_VIEW: {
            cps__msg_hdr g = {.type = CPS_MSG_GET_VIEW, .epoch = s->epoch};
            send_hdr(sm, s->id, 0, &g, NULL, 0, 0);
            continue;
        }
        case CPS_JA_ABORT:
            if (a[i].why)
                sim_trace(sm, "s%u join of r%u aborted: %s", s->id, r, a[i].why);
            cps__chain_join_abort(s->chain, r);
            server_actions(sm, s);
            s->copying[r] = 0;
            continue;
        case CPS_JA_BEGIN:
            rc = cps__chain_begin_join(s->chain, r, a[i].source);
            server_actions(sm, s);
            if (rc == 0) {
                sim_rstore_clear(&s->rs[r]); /* transfer.c's clear_txn */
                s->copying[r] = 0;
            }
            break;
        case CPS_JA_INSTALL:
            sim_rstore_copy(&s->rs[r], &sn->st);
            s->copying[r] = 1;
            sim_check_snapshot(sm, s, r);
            if (sm->failed)
                return;
            value = sn->st.applied;
            break;
        case CPS_JA_READY:
            /* transfer.c: the snapshot's SSP clocks, before the updates after it move them. */
            if (s->ssp)
                ssp_load(sm, s, r);
            rc = cps__chain_join_ready(s->chain, r, a[i].seq, sm->now);
            server_actions(sm, s);
            value = cps__chain_applied(s->chain, r);
            if (rc == 0)
                sim_trace(sm,
                          "s%u installed snapshot of r%u at seq %" PRIu64 ", caught up to %" PRIu64,
                          s->id, r, a[i].seq, value);
            break;
        default:
            continue;
        }
        if (sm->failed)
            return;
        cps__joiner_result(s->joiner, r, rc, value, sm->now);
        n = cps__joiner_actions(s->joiner, &a);
        i = (size_t)-1; /* the next batch, from its start */
    }
}

/* JOIN_RANGE from the scheduler. */
static void on_join_range(sim *sm, sim_server *s, const cps__msg_hdr *h)
{
    cps__joiner_order(s->joiner, s->view, h->range, (uint32_t)h->aux, h->step, h->epoch, sm->now);
    run_joiner(sm, s, NULL);
}

/* SNAP_REQ at the tail: shadow the joiner, and take the snapshot a moment later (a thread). */
static void on_snap_req(sim *sm, sim_server *s, const cps__msg_hdr *h)
{
    uint32_t r = h->range, joiner = h->sender;
    if (r >= sm->nranges || joiner < 1 || joiner > sm->p.servers ||
        !cps__chain_is_tail(s->chain, r))
        return;
    if (h->epoch > s->epoch) {
        /* transfer.c: the joiner runs a newer view than ours: an older one we install next may
         * count it dead and clear the shadow (with what we held for it), while its snapshot
         * still goes out and it reports CAUGHT_UP lacking those updates (seed 5596). Fetch the
         * view; the joiner asks again. */
        cps__msg_hdr g = {.type = CPS_MSG_GET_VIEW, .epoch = s->epoch};
        send_hdr(sm, s->id, 0, &g, NULL, 0, 0);
        return;
    }
    int rc = cps__chain_add_shadow(s->chain, r, joiner, h->step, sm->now);
    if (rc == CPS_EINVAL || rc == CPS_ESTALE_EPOCH)
        return; /* a joiner our view counts dead, or a late request of a replaced join:
                 * transfer.c logs and starts no snapshot */
    if (rc != 0) {
        chain_rc(sm, s, "cps__chain_add_shadow", rc);
        return;
    }
    server_actions(sm, s);
    sim_msg *m = xmalloc(sizeof *m + CPS_WIRE_HDR_SIZE);
    m->from = s->id;
    m->to = joiner;
    m->inc = s->inc;
    m->len = CPS_WIRE_HDR_SIZE;
    /* step: the join id of the request, echoed (transfer.c's SNAP does not name its request). */
    cps__msg_hdr sh = {
        .type = CPS_MSG_SNAP, .sender = s->id, .epoch = s->epoch, .range = r, .step = h->step};
    cps__wire_hdr_encode(m->buf, &sh);
    ev_push(sm, sm->now + rnd(sm, 40), EV_SNAPSHOT, s->id, m);
}

/* The snapshot thread reads the store (whatever the chain did since) and sends it. */
static void snapshot_run(sim *sm, sim_msg *m)
{
    sim_server *s = &sm->servers[m->from - 1];
    if (s->state == SRV_CRASHED || s->inc != m->inc) {
        free(m); /* the thread died with the process */
        return;
    }
    if (s->state == SRV_PAUSED) {
        ev_push(sm, s->resume_at + 1, EV_SNAPSHOT, s->id, m);
        return;
    }
    cps__msg_hdr h;
    cps__wire_hdr_decode(m->buf, m->len, &h);
    if (sm->nsnaps == sm->snaps_cap) {
        sm->snaps_cap = sm->snaps_cap ? 2 * sm->snaps_cap : 16;
        sm->snaps = realloc(sm->snaps, sm->snaps_cap * sizeof *sm->snaps);
        if (!sm->snaps) {
            fprintf(stderr, "sim: out of memory\n");
            exit(2);
        }
    }
    sim_snap *sn = xcalloc(1, sizeof *sn);
    sn->range = h.range;
    sn->source = s->id;
    sim_rstore_copy(&sn->st, &s->rs[h.range]);
    h.req_seq = sn->st.applied;
    h.aux = sm->nsnaps;
    sm->snaps[sm->nsnaps++] = sn;
    sim_trace(sm, "s%u snapshot of r%u at seq %" PRIu64 " -> s%u", s->id, h.range, h.req_seq,
              m->to);
    send_hdr(sm, s->id, m->to, &h, NULL, 0, 0);
    free(m);
}

/* SNAP at the joiner (the whole snapshot in one message, aux: its index in sm->snaps). */
static void on_snap(sim *sm, sim_server *s, const cps__msg_hdr *h)
{
    uint32_t r = h->range;
    if (r >= sm->nranges || h->aux >= sm->nsnaps)
        return;
    if (cps__joiner_snap(s->joiner, h->sender, r, h->step, 1, 0, cps__chain_joining(s->chain, r),
                         sm->now) == CPS_JOINER_TAKEN)
        run_joiner(sm, s, sm->snaps[h->aux]);
}

static void server_deliver(sim *sm, sim_server *s, const sim_msg *m)
{
    cps__msg_hdr h;
    if (cps__wire_hdr_decode(m->buf, m->len, &h) != 0) {
        sim_fail(sm, "wire", "server %u got an undecodable message from %u", s->id, m->from);
        return;
    }
    const uint8_t *pl = m->buf + CPS_WIRE_HDR_SIZE;
    sim_trace(sm, "s%u(e%" PRIu64 ") <- %u %s r%u seq %" PRIx64 " e%" PRIu64, s->id, s->epoch,
              m->from, msg_name(h.type), h.range, h.req_seq, h.epoch);
    /* server.c's origin of a message: our own WELCOME names our incarnation (the sim's in aux). */
    int origin = m->from != 0                                    ? CPS_FENCE_FROM_PEER
                 : h.type == CPS_MSG_WELCOME && h.aux == s->boot ? CPS_FENCE_OUR_WELCOME
                                                                 : CPS_FENCE_FROM_SCHED;
    if (s->state == SRV_HELLO) {
        /* Not let in yet: recovery/fence.c lets only our WELCOME in. */
        int ok = (h.type == CPS_MSG_WELCOME || h.type == CPS_MSG_VIEW) &&
                 cps__fence_admit(s->fence, h.type, origin) == CPS_FENCE_SERVE;
        if (!ok) {
            if (m->from == 0 && h.type == CPS_MSG_VIEW && h.epoch > s->seen_view)
                s->seen_view = h.epoch; /* installed once let in, if newer than the welcome */
            return;
        }
        const cps__node_info *me = cps__view_node(&sm->views[h.epoch], s->id);
        if (!me || !me->alive)
            return; /* server.c would install it; it only leads to another fence */
        s->state = SRV_UP;
        s->wiped = 0;
        s->epoch = 0;
        sim_trace(sm, "s%u let in at e%" PRIu64, s->id, h.epoch);
        server_install_view(sm, s, h.epoch);
        if (s->state == SRV_UP && s->seen_view > s->epoch)
            server_install_view(sm, s, s->seen_view);
        return;
    }
    /* server.c's handle_msg: a stall first (a pause the scheduler may have declared us dead
     * in), then what our standing lets through (recovery/fence.c). */
    server_check_stall(sm, s, 0);
    if (cps__fence_admit(s->fence, h.type, origin) != CPS_FENCE_SERVE) {
        sim_trace(sm, "s%u drops %s: %s", s->id, msg_name(h.type),
                  cps__fence_unsure(s->fence) ? "unsure of its standing" : "not for it now");
        return;
    }
    switch (h.type) {
    case CPS_MSG_VIEW:
    case CPS_MSG_WELCOME:
        server_install_view(sm, s, h.epoch);
        break;
    case CPS_MSG_FWD:
    case CPS_MSG_CHAIN_ACK:
    case CPS_MSG_CHAIN_MARK: {
        /* The chain copies what it keeps, and APPLY bodies are hashed before we return. */
        int rc = cps__chain_on_message(s->chain, &h, pl, h.payload_len, sm->now);
        if (rc == CPS_EAGAIN) {
            cps__msg_hdr g = {.type = CPS_MSG_GET_VIEW, .epoch = s->epoch};
            send_hdr(sm, s->id, 0, &g, NULL, 0, 0);
        } else if (rc == CPS_ESTALE_EPOCH) {
            sm->fenced++;
        } else if (rc != 0) {
            chain_rc(sm, s, "cps__chain_on_message", rc);
            return;
        }
        server_actions(sm, s);
        break;
    }
    case CPS_MSG_JOIN_RANGE:
        if (m->from == 0)
            on_join_range(sm, s, &h);
        break;
    case CPS_MSG_SNAP_REQ:
        on_snap_req(sm, s, &h);
        break;
    case CPS_MSG_SNAP:
        on_snap(sm, s, &h);
        break;
    case CPS_MSG_PUSH:
    case CPS_MSG_DECLARE:
    case CPS_MSG_PULL:
        on_request(sm, s, &h, pl, h.payload_len);
        break;
    default:
        sim_fail(sm, "wire", "server %u got unexpected message type %u", s->id, h.type);
    }
}

/* ---- workers: src/worker/client.c's shell around recovery/requests.c ---- */

static void ask_view(sim *sm, sim_worker *w)
{
    /* client.c's ask_view: at most one GET_VIEW per 200 ms (virtual time starts at 0, hence the
     * first-ask test). */
    if (w->view_asked && sm->now - w->view_asked < 200)
        return;
    w->view_asked = sm->now;
    cps__msg_hdr g = {.type = CPS_MSG_GET_VIEW, .epoch = w->epoch};
    send_hdr(sm, w->id, 0, &g, NULL, 0, 0);
}

/* client.c's req_send: encode the request of a CPS_RQ_SEND action and send it to a->to. The
 * network takes every message (a lost one is a drop), so the send always succeeds. */
static void req_send(sim *sm, sim_worker *w, const cps__reqs_action *a)
{
    const sim_req *q = a->ctx;
    cps__msg_hdr h = {0};
    h.type = a->type;
    h.epoch = a->epoch;
    h.req_worker = w->id;
    h.range = a->range;
    h.req_seq = a->seq;
    h.step = q->step;
    h.aux = q->bad ? SIM_BAD_KEYS : q->clock; /* client.c: a pull's aux is its SSP clock */
    if (q->noagg)
        h.flags |= CPS_WF_NOAGG;
    uint8_t b[8];
    cps__le64_put(b, q->grad);
    sim_trace(sm, "w%u send %s r%u req %" PRIx64 " step %" PRIu64 " e%" PRIu64 " -> s%u (#%u)",
              w->id, msg_name(a->type), a->range, a->seq, q->step, a->epoch, a->to, a->attempt);
    send_hdr(sm, w->id, a->to, &h, b, 8, 0);
}

/* The application's op is over (answered, refused or given up): a sync worker goes on to the
 * next step of the range; an SSP worker too once the step's pull is over, or at once when the
 * step's push was given up (answered, it is followed by the pull: worker_deliver). */
static void op_finish(sim *sm, sim_worker *w, const sim_req *q, int given_up)
{
    int step_push = q->type == CPS_MSG_PUSH && !q->noagg && sm->p.mode != SIM_ASYNC;
    if ((step_push && (sm->p.mode == SIM_SYNC || given_up)) || q->ssp_step)
        w->sync_busy[q->range] = 0;
}

/* The request has left the table (given_up: with CPS_EUNAVAILABLE). */
static void req_finish(sim *sm, sim_worker *w, sim_req *q, int given_up)
{
    if (!q->detached)
        op_finish(sm, w, q, given_up);
    if (q->prev)
        q->prev->next = q->next;
    else
        w->live = q->next;
    if (q->next)
        q->next->prev = q->prev;
    free(q);
}

/* client.c's perform: carry out what the last call into the request table decided. */
static void perform(sim *sm, sim_worker *w)
{
    const cps__reqs_action *acts;
    size_t n = cps__reqs_actions(w->rq, &acts);
    for (size_t k = 0; k < n && !sm->failed; k++) {
        const cps__reqs_action *a = &acts[k];
        switch (a->kind) {
        case CPS_RQ_SEND:
            req_send(sm, w, a);
            cps__reqs_sent(w->rq, a->index, 0, sm->now);
            break;
        case CPS_RQ_ASK_VIEW:
            ask_view(sm, w);
            break;
        case CPS_RQ_WAIT_REPLICA:
            sim_trace(sm, "w%u: r%u has no live replica; waiting", w->id, a->range);
            break;
        case CPS_RQ_COMPLETE: {
            sim_req *q = a->ctx;
            sim_trace(sm, "w%u gives up %s r%u req %" PRIx64 ": %s", w->id, msg_name(q->type),
                      q->range, q->seq, cps_err_name(a->status));
            if (a->status != CPS_EUNAVAILABLE)
                sim_fail(sm, "api", "worker %u: request completed with %s", w->id,
                         cps_err_name(a->status));
            w->unavailable++;
            if (!a->detach) {
                req_finish(sm, w, q, 1);
                break;
            }
            /* A push: client.c hands the table a copy of it; the sim's request is its own. */
            op_finish(sm, w, q, 1);
            q->detached = 1;
            cps__reqs_detach(w->rq, a->index, q, 0);
            break;
        }
        default:
            sim_fail(sm, "api", "worker %u: unknown request action %d", w->id, a->kind);
        }
    }
}

/* Start one new request of the given kind on range r (client.c's op_start for one part). */
static sim_req *worker_issue(sim *sm, sim_worker *w, int kind, uint32_t r)
{
    sim_req *q = xcalloc(1, sizeof *q);
    q->range = r;
    q->grad = sim_rng_next(&sm->rng) >> 8;
    switch (kind) {
    case REQ_DENSE:
        q->type = CPS_MSG_PUSH;
        q->seq = ++w->dense_seq[r];
        if (sm->p.mode != SIM_ASYNC) {
            q->step = ++w->step[r];
            w->sync_busy[r] = 1;
        } else {
            q->step = q->seq;
            q->bad = chance(sm, sm->p.bad_per_mille);
        }
        break;
    case REQ_SPARSE:
        q->type = CPS_MSG_PUSH;
        q->noagg = 1;
        q->seq = CPS_SEQ_SPARSE | ++w->sparse_seq[r];
        q->bad = chance(sm, sm->p.bad_per_mille);
        break;
    case REQ_DECLARE:
        q->type = CPS_MSG_DECLARE;
        q->seq = CPS_SEQ_OTHER | ++w->other_seq;
        break;
    default:
        q->type = CPS_MSG_PULL;
        q->seq = CPS_SEQ_OTHER | ++w->other_seq;
        /* The read must see at least what this worker saw before asking. */
        q->floor = w->read_seq[r];
        /* SSP: it reads at the worker's clock, as client.c's pull at the tensor's step. */
        q->clock = sm->p.mode == SIM_SSP ? w->step[r] : 0;
        break;
    }
    q->next = w->live;
    if (w->live)
        w->live->prev = q;
    w->live = q;
    w->issued++;
    /* client.c orders a sync push behind its key set's earlier ones; the sim's key set of a
     * range is one. */
    uint64_t order = sm->p.mode == SIM_SYNC && kind == REQ_DENSE ? 1 : 0;
    if (cps__reqs_add_ordered(w->rq, w->view, q, 0, q->type, r, q->seq, order, sm->now) != 0) {
        fprintf(stderr, "sim: out of memory\n");
        exit(2);
    }
    perform(sm, w);
    return q;
}

static int worker_may_issue(const sim *sm, const sim_worker *w)
{
    return sm->phase == PHASE_FAULTS && cps__reqs_count(w->rq) < sm->p.window;
}

static void worker_tick(sim *sm, sim_worker *w)
{
    /* New work. */
    if (sm->p.mode != SIM_ASYNC) {
        /* SSP: a step is a push, then a pull at its clock (a training loop's push_pull); the
         * next push waits for that pull, which the staleness bound may hold.
         * One step in flight per range (a sync worker pushes step t+1 after step t is acked);
         * after the fault phase every worker finishes the highest step any worker began, or
         * the barrier of that step would never fill. */
        for (uint32_t r = 0; r < sm->nranges && !sm->failed; r++) {
            if (w->sync_busy[r])
                continue;
            /* Backup workers: the last worker is a straggler. */
            uint32_t pace = sm->p.backup && w->id == sm->workers[sm->p.workers - 1].id ? 150 : 500;
            if (sm->phase == PHASE_FAULTS ? chance(sm, pace) : w->step[r] < sm->sync_target[r])
                worker_issue(sm, w, REQ_DENSE, r);
        }
    }
    while (!sm->failed && worker_may_issue(sm, w) && chance(sm, 600)) {
        uint32_t r = (uint32_t)rnd(sm, sm->nranges);
        uint64_t x = rnd(sm, 100);
        int kind = x < 8 ? REQ_DECLARE : x < 22 ? REQ_SPARSE : x < 34 ? REQ_PULL : REQ_DENSE;
        if (kind == REQ_DENSE && sm->p.mode != SIM_ASYNC)
            kind = REQ_SPARSE;
        worker_issue(sm, w, kind, r);
    }
    /* client.c's progress(): time-outs, parked requests, ranges without a replica. */
    cps__reqs_tick(w->rq, w->view, sm->now);
    perform(sm, w);
}

/* client.c's install_view. */
static void worker_install_view(sim *sm, sim_worker *w, uint64_t epoch)
{
    if (epoch <= w->epoch)
        return;
    w->epoch = epoch;
    w->view = &sm->views[epoch];
    sim_trace(sm, "w%u installs view e%" PRIu64 ", re-sending %u", w->id, epoch,
              cps__reqs_count(w->rq));
    cps__reqs_view(w->rq, w->view, sm->now);
    perform(sm, w);
}

/* A request's answer, taken by the table: check it as the application would see it. */
static void worker_answered(sim *sm, sim_worker *w, sim_req *q, const cps__msg_hdr *h,
                            uint32_t from)
{
    if (q->bad) {
        sim_fail(sm, "(1) acked is on every replica",
                 "worker %u: push %" PRIx64 " on range %u was refused by the head, yet "
                 "acknowledged by server %u",
                 w->id, q->seq, q->range, from);
        return;
    }
    if (q->type == CPS_MSG_PULL) {
        if (h->type != CPS_MSG_VALUES) {
            sim_fail(sm, "reply", "worker %u: pull answered by %s", w->id, msg_name(h->type));
            return;
        }
        /* Invariant 4: a worker never sees a range's sequence number go backwards: a pull
         * returns at least what the worker had read, or had acknowledged, before sending it
         * (pulls in flight together may return in either order). */
        if (h->aux < q->floor) {
            sim_fail(sm, "(4) monotonic reads",
                     "worker %u read range %u at seq %" PRIu64 " after seeing seq %" PRIu64
                     " (from %u)",
                     w->id, h->range, h->aux, q->floor, from);
            return;
        }
    } else {
        if (h->type != CPS_MSG_ACK) {
            sim_fail(sm, "reply", "worker %u: push answered by %s", w->id, msg_name(h->type));
            return;
        }
        if (h->flags & CPS_WF_LATE) {
            /* Dropped, not applied: client.c moves the tensor's step on to the closed one. */
            if (!sm->p.backup || q->type != CPS_MSG_PUSH || q->noagg || h->aux < q->step) {
                sim_fail(sm, "reply",
                         "worker %u: push %" PRIx64 " of step %" PRIu64
                         " answered late (closed %" PRIu64 ")",
                         w->id, q->seq, q->step, h->aux);
                return;
            }
            if (!q->detached && h->aux > w->step[q->range])
                w->step[q->range] = h->aux;
            w->late++;
            w->acked++;
            return;
        }
        sim_check_acked(sm, w, q);
    }
    /* A detached push's answer reaches no application: it raises no floor of later reads. */
    if (!q->detached && h->aux > w->read_seq[h->range])
        w->read_seq[h->range] = h->aux;
    w->acked++;
}

/* client.c's handle_msg and on_reply. */
static void worker_deliver(sim *sm, sim_worker *w, const sim_msg *m)
{
    cps__msg_hdr h;
    if (cps__wire_hdr_decode(m->buf, m->len, &h) != 0) {
        sim_fail(sm, "wire", "worker %u got an undecodable message from %u", w->id, m->from);
        return;
    }
    sim_trace(sm, "w%u <- %u %s r%u req %" PRIx64 " status %d e%" PRIu64, w->id, m->from,
              msg_name(h.type), h.range, h.req_seq, h.status, h.epoch);
    cps__reqs_epoch_seen(w->rq, h.epoch);
    if (h.type == CPS_MSG_VIEW) {
        worker_install_view(sm, w, h.epoch);
        return;
    }
    cps__reqs_reply_in in = {h.type, h.range, h.req_seq, h.epoch, h.status};
    cps__reqs_done d;
    int verdict = cps__reqs_reply(w->rq, w->view, &in, sm->now, &d);
    perform(sm, w);
    if (sm->failed || verdict == CPS_RQ_REPLY_UNKNOWN || verdict == CPS_RQ_REPLY_RETRY ||
        verdict == CPS_RQ_REPLY_OTHER_EPOCH)
        return;
    sim_req *q = d.ctx;
    if (verdict == CPS_RQ_REPLY_FAILED) {
        if (d.status != CPS_ENOTFOUND || !q->bad)
            sim_fail(sm, "reply", "worker %u: request %" PRIx64 " on range %u refused: %s", w->id,
                     q->seq, q->range, cps_err_name(d.status));
        /* else the expected refusal: the request is over, and applied nowhere. */
    } else {
        worker_answered(sm, w, q, &h, m->from);
    }
    /* SSP: the step's push answered, its pull at the step's clock follows (a given-up push's
     * step is over: op_finish). */
    int ssp_pull = verdict == CPS_RQ_REPLY_TAKEN && !q->detached && q->type == CPS_MSG_PUSH &&
                   !q->noagg && sm->p.mode == SIM_SSP;
    uint32_t r = q->range;
    req_finish(sm, w, q, 0);
    if (ssp_pull && !sm->failed)
        worker_issue(sm, w, REQ_PULL, r)->ssp_step = 1;
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
    ev_push(sm, sm->now + 50 + rnd(sm, 2500), EV_HEAL_CUT, 0, NULL);
    if (from_sched && !sm->pending_victim) {
        /* Silent to the scheduler: its detector may declare it dead before the partition heals. */
        sm->pending_victim = set[0];
        sm->nfaults++;
    }
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
        ev_push(sm, s->resume_at, EV_RESUME, s->id, NULL);
    } else {
        s->inc++; /* what it had in flight is lost with it */
        if (has_restarts(sm) &&
            (!sim_sched_removable(sm, s->id) || chance(sm, sm->p.restart_per_mille)))
            ev_push(sm, sm->now + 1 + rnd(sm, chance(sm, 500) ? 400 : 3000), EV_RESTART, s->id,
                    NULL);
    }
    /* The scheduler's detector notices its silence; until then the chain waits on it. */
    sm->pending_victim = s->id;
    sim_trace(sm, "server %u %s", s->id, kind == SRV_CRASHED ? "crashed" : "paused");
}

/* Is server `id` the last replica of some range of the current view? */
static int sole_replica(const sim *sm, uint32_t id)
{
    return !sim_sched_removable(sm, id);
}

/* Does every range `id` holds keep two other members that run (not paused, not crashed)? The
 * operator replaces a disk only then: with one other replica, the scheduler may declare that one
 * dead next (a pause, lost heartbeats) and let the empty disk back as the range's last replica,
 * which no scheduler can tell from a full one by its HELLO: acknowledged updates are lost (seed
 * 1882, invariant 1: a double fault, not a protocol bug). */
static int others_running(const sim *sm, uint32_t id)
{
    const cps__view *v = sim_cur_view(sm);
    for (uint32_t r = 0; r < v->nranges; r++) {
        const cps__range *rg = &v->ranges[r];
        if (!in_chain(rg, id))
            continue;
        uint32_t others = 0;
        for (uint32_t j = 0; j < rg->chain_len; j++)
            others += rg->chain[j] != id && node_alive(v, rg->chain[j]) &&
                      sm->servers[rg->chain[j] - 1].state == SRV_UP;
        if (others < 2)
            return 0;
    }
    return 1;
}

/* A crashed server comes back: on its store, or on an empty one (a replaced disk: never for the
 * last replica of a range, whose data would be gone), with a fresh chain state machine. */
static void restart(sim *sm, sim_server *s)
{
    s->restart_due = 0;
    if (s->state != SRV_CRASHED || sm->phase == PHASE_END)
        return; /* at the job's end nobody restarts a server */
    int wipe =
        chance(sm, sm->p.wipe_per_mille) && !sole_replica(sm, s->id) && others_running(sm, s->id);
    if (wipe) {
        for (uint32_t r = 0; r < sm->nranges; r++)
            sim_rstore_clear(&s->rs[r]);
        s->wiped = 1;
        sm->wipes++;
    }
    sm->restarts++;
    sim_trace(sm, "s%u restarts%s", s->id, wipe ? " on an empty store" : " on its store");
    server_reset(sm, s);
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
            ev_push(sm, sm->now + 1 + rnd(sm, 3000), EV_RESTART, id, NULL);
            return;
        }
}

/* ---- the run ---- */

/* A crashed server's messages in flight are lost with it. */
static int lost_with_sender(const sim *sm, const sim_msg *m)
{
    return m->from >= 1 && m->from <= sm->p.servers &&
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
        if (lost_with_sender(sm, m)) {
            /* lost */
        } else if (s->state == SRV_CRASHED) {
            sim_trace(sm, "message %u -> crashed s%u lost", m->from, s->id);
        } else if (s->state == SRV_PAUSED) {
            /* Held by its inbox until it runs again. */
            ev_push(sm, s->resume_at + 1 + rnd(sm, 20), EV_DELIVER, m->to, m);
            return;
        } else if (m->from != 0 || !sim_sched_to_server(sm, s, m)) {
            server_deliver(sm, s, m);
        }
    } else {
        sim_worker *w = &sm->workers[worker_rank(sm, m->to)];
        if (m->from >= 1 && m->from <= sm->p.servers)
            sm->worker_heard[worker_rank(sm, m->to)][m->from] = sm->now;
        if (m->from != 0 || !sim_sched_to_worker(sm, w, m))
            worker_deliver(sm, w, m);
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
            if (sm->workers[k].step[r] > t)
                t = sm->workers[k].step[r];
        sm->sync_target[r] = t;
    }
}

static int workers_done(const sim *sm)
{
    for (uint32_t k = 0; k < sm->p.workers; k++) {
        const sim_worker *w = &sm->workers[k];
        if (cps__reqs_count(w->rq))
            return 0;
        for (uint32_t r = 0; sm->p.mode != SIM_ASYNC && r < sm->nranges; r++)
            if (w->step[r] < sm->sync_target[r])
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
        s->sm = sm;
        s->id = i + 1;
        s->state = SRV_UP;
        s->rs = xcalloc(sm->nranges, sizeof *s->rs);
        s->copying = xcalloc(sm->nranges, sizeof *s->copying);
        chain_new(sm, s);
        joiner_new(sm, s);
        if (cps__fence_create(SIM_DEAD_AFTER_MS, 0, &s->fence) != 0 ||
            cps__fence_view(s->fence, v->epoch, 1, 1) != CPS_FENCE_V_NEWER ||
            cps__fence_install(s->fence, v->epoch, 1, 1) != CPS_FENCE_V_JOINED) {
            fprintf(stderr, "sim: cps__fence_create failed\n");
            exit(2);
        }
        s->ticking = 1;
        s->epoch = v->epoch;
        s->view = v;
        if (chain_rc(sm, s, "cps__chain_set_view", cps__chain_set_view(s->chain, v, 0)) == 0)
            server_actions(sm, s);
        cps__joiner_view(s->joiner, v, 0);
        ev_push(sm, rnd(sm, p->tick_ms), EV_TICK, s->id, NULL);
    }
    sm->workers = xcalloc(p->workers, sizeof *sm->workers);
    for (uint32_t k = 0; k < p->workers; k++) {
        sim_worker *w = &sm->workers[k];
        w->id = p->servers + 1 + k;
        w->epoch = v->epoch;
        w->view = v;
        w->dense_seq = xcalloc(sm->nranges, sizeof *w->dense_seq);
        w->sparse_seq = xcalloc(sm->nranges, sizeof *w->sparse_seq);
        w->step = xcalloc(sm->nranges, sizeof *w->step);
        w->sync_busy = xcalloc(sm->nranges, sizeof *w->sync_busy);
        w->read_seq = xcalloc(sm->nranges, sizeof *w->read_seq);
        /* client.c's: re-send after a refusal (CPS_EAGAIN, CPS_ESTALE_EPOCH) 50 ms later. */
        cps__reqs_config rc = {p->timeout_ms, p->unavailable_timeout_ms, 50};
        if (cps__reqs_create(&rc, &w->rq) != 0) {
            fprintf(stderr, "sim: out of memory\n");
            exit(2);
        }
        ev_push(sm, rnd(sm, SIM_WORKER_TICK_MS), EV_WTICK, w->id, NULL);
    }
    ev_push(sm, SIM_SCHED_TICK_MS, EV_REPAIR, 0, NULL);
}

static void teardown(sim *sm)
{
    for (size_t i = 0; i < sm->nev; i++)
        free(sm->ev[i].m);
    free(sm->ev);
    for (uint32_t i = 0; sm->servers && i < sm->p.servers; i++) {
        sim_server *s = &sm->servers[i];
        cps__chain_destroy(s->chain);
        sim_store_free(sm, s);
        cps__sync_destroy(s->sync);
        cps__ssp_destroy(s->ssp);
        free(s->parked);
        cps__ackhold_destroy(s->acks);
        cps__joiner_destroy(s->joiner);
        cps__fence_destroy(s->fence);
        free(s->copying);
    }
    free(sm->servers);
    for (uint32_t k = 0; sm->workers && k < sm->p.workers; k++) {
        sim_worker *w = &sm->workers[k];
        cps__reqs_destroy(w->rq);
        while (w->live) {
            sim_req *q = w->live;
            w->live = q->next;
            free(q);
        }
        free(w->dense_seq);
        free(w->sparse_seq);
        free(w->step);
        free(w->sync_busy);
        free(w->read_seq);
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
        if (s->state == SRV_UP) {
            server_check_stall(sm, s, 1);
            flush_acks(sm, s, 0);
            int rc = cps__chain_tick(s->chain, sm->now);
            if (chain_rc(sm, s, "cps__chain_tick", rc) == 0)
                server_actions(sm, s);
            if (!sm->failed && cps__joiner_tick(s->joiner, sm->now, joiner_can_serve, s) > 0)
                run_joiner(sm, s, NULL);
            if (sm->now - s->beat_at >= SIM_BEAT_MS) {
                s->beat_at = sm->now;
                cps__msg_hdr h = {.type = CPS_MSG_HEARTBEAT, .epoch = s->epoch};
                send_hdr(sm, s->id, 0, &h, NULL, 0, 0);
            }
        }
        ev_push(sm, sm->now + sm->p.tick_ms, EV_TICK, s->id, NULL);
        break;
    }
    case EV_WTICK: {
        sim_worker *w = &sm->workers[worker_rank(sm, e.node)];
        worker_tick(sm, w);
        ev_push(sm, sm->now + SIM_WORKER_TICK_MS, EV_WTICK, w->id, NULL);
        break;
    }
    case EV_RESTART:
        restart(sm, &sm->servers[e.node - 1]);
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
        ev_push(sm, sm->now + SIM_SCHED_TICK_MS, EV_REPAIR, 0, NULL);
        break;
    case EV_SNAPSHOT:
        snapshot_run(sm, e.m);
        break;
    case EV_ACKS: {
        /* Held acks due; a paused server sends them at its next tick after resuming, a crashed
         * one lost them. */
        sim_server *s = &sm->servers[e.node - 1];
        if (s->state == SRV_UP)
            flush_acks(sm, s, 0);
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
        sim_event e = ev_pop(sm);
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
                left += cps__reqs_count(sm->workers[k].rq);
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
                               !cps__chain_can_serve_pull(x->chain, r));
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
        out->partitions = sm->partitions;
        out->joins = sm->joins;
        out->rejoins = sm->rejoins;
        out->gated = sm->gated;
        out->ssp_parked = sm->ssp_parked;
        out->false_deaths = sm->false_deaths;
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
