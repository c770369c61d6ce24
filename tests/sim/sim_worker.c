/* The simulator's workers: each one is the production worker protocol (recovery/session.c, the
 * very object the worker library drives) fed the simulated network's messages and clock. What
 * this file adds is what the application and the library's I/O do: choose the requests (a training
 * loop's pushes and pulls, sync and SSP steps one at a time per range), encode them (the sim's
 * payload: one number standing for the gradient), and check every answer against the invariants. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "chainps/error.h"
#include "core/wire.h"
#include "sim.h"

static sim_req *req_of(cps__sess_op *op)
{
    return (sim_req *)(void *)op; /* so is sim_req's first member */
}

/* The shell's req_send: encode the request of a CPS_SS_SEND action and send it to a->to. The
 * network takes every message (a lost one is a drop), so the send always succeeds. */
static void req_send(sim *sm, sim_worker *w, const cps__sess_action *a)
{
    const sim_req *q = req_of(a->op);
    cps__msg_hdr h = {0};
    h.type = a->type;
    h.flags = a->flags;
    h.epoch = a->epoch;
    h.req_worker = w->id;
    h.range = a->range;
    h.req_seq = a->seq;
    h.step = q->step;
    h.aux = q->clock; /* a pull's aux is its SSP clock */
    /* As the library's: one key of the range (its second: a key never declared, which the head
     * refuses), with one value for a push, a spec for a declare. */
    const cps__range *rg = &sim_cur_view(sm)->ranges[a->range];
    uint64_t key = rg->lo + (q->bad ? 1 : 0), offset = 0;
    uint32_t len = 1;
    float val = (float)(q->grad % 1024);
    cps__param_spec spec = {.opt_kind = CPS_W_OPT_SGD, .lr = 0.5f};
    _Alignas(8) uint8_t buf[CPS_WIRE_HDR_SIZE + 192];
    uint8_t *pl = buf + CPS_WIRE_HDR_SIZE;
    size_t n = a->type == CPS_MSG_DECLARE
                   ? cps__wire_declare_encode(pl, 192, 1, &key, &len, &offset, &spec)
               : a->type == CPS_MSG_PULL ? cps__wire_kv_encode(pl, 192, 1, &key, &len, NULL, 0)
                                         : cps__wire_kv_encode(pl, 192, 1, &key, &len, &val, 1);
    h.payload_len = h.raw_len = (uint32_t)n;
    h.sender = w->id;
    cps__wire_hdr_encode(buf, &h);
    sim_trace(sm, "w%u send %s r%u req %" PRIx64 " step %" PRIu64 " e%" PRIu64 " -> s%u (#%u)",
              w->id, sim_msg_name(a->type), a->range, a->seq, q->step, a->epoch, a->to, a->attempt);
    sim_net_send(sm, w->id, a->to, buf, CPS_WIRE_HDR_SIZE + n, 0);
}

/* The application's op is over (answered, refused or given up): a sync worker goes on to the
 * next step of the range; an SSP worker too once the step's pull is over, or at once when the
 * step's push was given up (answered, it is followed by the pull: sim_worker_deliver). */
static void op_finish(sim *sm, sim_worker *w, const sim_req *q, int given_up)
{
    int step_push = (q->type == CPS_MSG_PUSH || q->type == CPS_MSG_PUSH_PULL) && !q->noagg &&
                    sm->p.mode != SIM_ASYNC;
    if ((step_push && (sm->p.mode == SIM_SYNC || given_up)) || q->ssp_step)
        w->sync_busy[q->range] = 0;
}

static void req_free(sim_worker *w, sim_req *q)
{
    if (q->prev)
        q->prev->next = q->next;
    else
        w->live = q->next;
    if (q->next)
        q->next->prev = q->prev;
    free(q);
}

/* A request's answer: check it as the application would see it. */
static void answered(sim *sm, sim_worker *w, sim_req *q, const cps__msg_hdr *h, uint32_t from)
{
    if (q->bad) {
        sim_fail(sm, "(1) acked is on every replica",
                 "worker %u: push %" PRIx64 " on range %u was refused by the head, yet "
                 "acknowledged by server %u",
                 w->id, q->seq, q->range, from);
        return;
    }
    int pp = q->type == CPS_MSG_PUSH_PULL;
    if (q->type == CPS_MSG_PULL || (pp && !(h->flags & CPS_WF_LATE))) {
        if (h->type != CPS_MSG_VALUES) {
            sim_fail(sm, "reply", "worker %u: %s answered by %s", w->id, sim_msg_name(q->type),
                     sim_msg_name(h->type));
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
        if (pp)
            sim_check_acked(sm, w, q);
    } else {
        if (h->type != (pp ? CPS_MSG_VALUES : CPS_MSG_ACK)) {
            sim_fail(sm, "reply", "worker %u: push answered by %s", w->id, sim_msg_name(h->type));
            return;
        }
        if (h->flags & CPS_WF_LATE) {
            /* Dropped, not applied (the session moved the range's step on to the closed one). */
            if (!sm->p.backup || q->type == CPS_MSG_DECLARE || q->noagg || h->aux < q->step) {
                sim_fail(sm, "reply",
                         "worker %u: push %" PRIx64 " of step %" PRIu64
                         " answered late (closed %" PRIu64 ")",
                         w->id, q->seq, q->step, h->aux);
                return;
            }
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

/* A refusal: only the expected one (a push naming an undeclared key) is not a violation. */
static void refused(sim *sm, sim_worker *w, const sim_req *q, int status)
{
    if (status != CPS_ENOTFOUND || !q->bad)
        sim_fail(sm, "reply", "worker %u: request %" PRIx64 " on range %u refused: %s", w->id,
                 q->seq, q->range, cps_err_name(status));
}

/* Carry out the session's last output, as the library does. h and from: the message that call
 * stepped (answers come only from one). *ssp_pull: the range whose SSP step push was answered,
 * whose pull follows once the output is performed. */
static void perform(sim *sm, sim_worker *w, const cps__msg_hdr *h, uint32_t from,
                    uint32_t *ssp_pull)
{
    const cps__sess_action *acts;
    size_t n = cps__sess_output(w->sess, &acts);
    for (size_t k = 0; k < n && !sm->failed; k++) {
        const cps__sess_action *a = &acts[k];
        sim_req *q = a->op ? req_of(a->op) : NULL;
        switch (a->kind) {
        case CPS_SS_SEND:
            req_send(sm, w, a);
            cps__sess_sent(w->sess, a->index, 0, sm->now);
            break;
        case CPS_SS_SCHED: /* a view request: the only call to the scheduler a sim worker makes */
            sim_send_hdr(sm, w->id, 0, &a->hdr, NULL, 0, 0);
            break;
        case CPS_SS_VIEW:
            sim_trace(sm, "w%u installs view e%" PRIu64 ", re-sending %u", w->id, a->epoch,
                      a->count);
            break;
        case CPS_SS_PEER:
        case CPS_SS_SUSPECTS: /* reported by sim_sched.c with the heartbeats, from cps__sess_waiting
                               */
            break;
        case CPS_SS_WAIT_REPLICA:
            sim_trace(sm, "w%u: r%u has no live replica; waiting", w->id, a->range);
            break;
        case CPS_SS_GIVE_UP:
            sim_trace(sm, "w%u gives up %s r%u req %" PRIx64 ": %s", w->id, sim_msg_name(q->type),
                      q->range, q->seq, cps_err_name(a->status));
            if (a->status != CPS_EUNAVAILABLE)
                sim_fail(sm, "api", "worker %u: request completed with %s", w->id,
                         cps_err_name(a->status));
            w->unavailable++;
            if (a->detach) {
                /* The library hands the session a copy of the push; the sim's request is
                 * its own. */
                q->detached = 1;
                cps__sess_detach(w->sess, a->index, &q->so, 0);
            }
            break;
        case CPS_SS_ANSWER:
            answered(sm, w, q, h, from);
            if (!q->detached && q->type == CPS_MSG_PUSH && !q->noagg && sm->p.mode == SIM_SSP)
                *ssp_pull = q->range;
            break;
        case CPS_SS_REFUSED:
            refused(sm, w, q, a->status);
            break;
        case CPS_SS_DONE:
            op_finish(sm, w, q, q->so.result == CPS_EUNAVAILABLE);
            if (!q->detached)
                req_free(w, q);
            break;
        case CPS_SS_RELEASE:
            if (a->status != 0)
                refused(sm, w, q, a->status);
            else
                answered(sm, w, q, h, from);
            req_free(w, q);
            break;
        default:
            sim_fail(sm, "api", "worker %u: unexpected session action %d", w->id, a->kind);
        }
    }
}

/* Start one new request of the given kind on range r (an operation of one part). */
static sim_req *issue(sim *sm, sim_worker *w, int kind, uint32_t r)
{
    sim_req *q = sim_xcalloc(1, sizeof *q);
    q->range = r;
    q->grad = sim_rng_next(&sm->rng) >> 8;
    q->so.nparts = 1;
    cps__sess_clock *clock = NULL;
    switch (kind) {
    case REQ_DENSE:
        q->type = CPS_MSG_PUSH;
        q->so.kind = CPS_SS_PUSH;
        if (sm->p.mode != SIM_ASYNC) {
            clock = &w->clocks[r]; /* the session moves it on a step */
            w->sync_busy[r] = 1;
        } else {
            q->bad = sim_chance(sm, sm->p.bad_per_mille);
        }
        if (sm->p.push_pull && (sm->p.mode != SIM_ASYNC || sim_chance(sm, 300))) {
            /* --push-pull: the push returns the values (a training loop's push_pull); SSP:
             * read at its step, which it ends (no pull follows). */
            q->type = CPS_MSG_PUSH_PULL;
            q->so.kind = CPS_SS_PUSH_PULL;
            q->floor = w->read_seq[r];
            q->ssp_step = sm->p.mode == SIM_SSP;
        }
        break;
    case REQ_SPARSE:
        q->type = CPS_MSG_PUSH;
        q->so.kind = CPS_SS_PUSH;
        q->noagg = 1;
        q->so.noagg = 1;
        q->bad = sim_chance(sm, sm->p.bad_per_mille);
        break;
    case REQ_DECLARE:
        q->type = CPS_MSG_DECLARE;
        q->so.kind = CPS_SS_DECLARE;
        break;
    default:
        q->type = CPS_MSG_PULL;
        q->so.kind = CPS_SS_PULL;
        /* The read must see at least what this worker saw before asking. */
        q->floor = w->read_seq[r];
        /* SSP: it reads at the worker's clock, as the library's pull at the tensor's step. */
        q->clock = sm->p.mode == SIM_SSP ? w->clocks[r].step : 0;
        break;
    }
    q->next = w->live;
    if (w->live)
        w->live->prev = q;
    w->live = q;
    w->issued++;
    /* As the library: a tensor's (here: a range's) first push is flagged (CPS_WF_FIRST). */
    cps__sess_begin(w->sess, &q->so, clock, 1);
    q->step = q->so.step;
    if (q->type == CPS_MSG_PUSH_PULL && sm->p.mode == SIM_SSP)
        q->clock = q->step;
    /* The sim's key set of a range is one: a sync push waits behind the range's earlier ones. */
    if (cps__sess_add(w->sess, &q->so, 0, r, 1, sm->now) != 0) {
        fprintf(stderr, "sim: out of memory\n");
        exit(2);
    }
    q->seq = cps__sess_added_seq(w->sess);
    if (kind == REQ_DENSE && sm->p.mode == SIM_ASYNC)
        q->step = q->seq; /* only read by the sim's own checks */
    uint32_t ssp_pull = UINT32_MAX;
    perform(sm, w, NULL, 0, &ssp_pull);
    return q;
}

static int may_issue(const sim *sm, const sim_worker *w)
{
    return sm->phase == PHASE_FAULTS && cps__sess_pending(w->sess) < sm->p.window;
}

void sim_worker_init(sim *sm, sim_worker *w, uint32_t id, const cps__view *v)
{
    w->id = id;
    w->clocks = sim_xcalloc(sm->nranges, sizeof *w->clocks);
    w->sync_busy = sim_xcalloc(sm->nranges, sizeof *w->sync_busy);
    w->read_seq = sim_xcalloc(sm->nranges, sizeof *w->read_seq);
    /* The library's settings: re-send after a refusal (CPS_EAGAIN, CPS_ESTALE_EPOCH) 50 ms later,
     * at most one view request per 200 ms. */
    cps__sess_config cfg = {.request_timeout_ms = sm->p.timeout_ms,
                            .unavailable_timeout_ms = sm->p.unavailable_timeout_ms,
                            .retry_ms = 50,
                            .view_ask_min_ms = 200,
                            .hello_retry_ms = 500,
                            .join_timeout_ms = 60000,
                            .bye_wait_ms = 2000,
                            .dead_after_ms = SIM_DEAD_AFTER_MS};
    if (cps__sess_create(&cfg, &w->sess) != 0 || cps__sess_view_in(w->sess, id, v, 0) != 0) {
        fprintf(stderr, "sim: out of memory\n");
        exit(2);
    }
    for (uint32_t r = 0; r < sm->nranges; r++)
        cps__sess_clock_add(w->sess, &w->clocks[r], 0);
}

void sim_worker_fini(sim_worker *w)
{
    cps__sess_destroy(w->sess);
    w->sess = NULL;
    while (w->live) {
        sim_req *q = w->live;
        w->live = q->next;
        free(q);
    }
    free(w->clocks);
    free(w->sync_busy);
    free(w->read_seq);
}

uint32_t sim_worker_pending(const sim_worker *w)
{
    return cps__sess_pending(w->sess);
}

uint64_t sim_worker_step(const sim_worker *w, uint32_t r)
{
    return w->clocks[r].step;
}

void sim_worker_tick(sim *sm, sim_worker *w)
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
            if (sm->phase == PHASE_FAULTS ? sim_chance(sm, pace)
                                          : w->clocks[r].step < sm->sync_target[r])
                issue(sm, w, REQ_DENSE, r);
        }
    }
    while (!sm->failed && may_issue(sm, w) && sim_chance(sm, 600)) {
        uint32_t r = (uint32_t)sim_rnd(sm, sm->nranges);
        uint64_t x = sim_rnd(sm, 100);
        int kind = x < 8 ? REQ_DECLARE : x < 22 ? REQ_SPARSE : x < 34 ? REQ_PULL : REQ_DENSE;
        if (kind == REQ_DENSE && sm->p.mode != SIM_ASYNC)
            kind = REQ_SPARSE;
        issue(sm, w, kind, r);
    }
    /* The session's time: time-outs, parked requests, ranges without a replica. */
    cps__sess_tick(w->sess, sm->now);
    uint32_t ssp_pull = UINT32_MAX;
    perform(sm, w, NULL, 0, &ssp_pull);
}

/* A message arrived: step the session with the message, perform its output. The sim's
 * network carries a view as its epoch: the session gets that view decoded. */
void sim_worker_deliver(sim *sm, sim_worker *w, const sim_msg *m)
{
    cps__msg_hdr h;
    if (cps__wire_hdr_decode(m->buf, m->len, &h) != 0) {
        sim_fail(sm, "wire", "worker %u got an undecodable message from %u", w->id, m->from);
        return;
    }
    sim_trace(sm, "w%u <- %u %s r%u req %" PRIx64 " status %d e%" PRIu64, w->id, m->from,
              sim_msg_name(h.type), h.range, h.req_seq, h.status, h.epoch);
    int rc;
    if (h.type == CPS_MSG_VIEW)
        rc = cps__sess_view_in(w->sess, 0, &sm->views[h.epoch], sm->now);
    else
        rc = cps__sess_step(w->sess, &h, m->buf + CPS_WIRE_HDR_SIZE, m->len - CPS_WIRE_HDR_SIZE,
                            sm->now);
    if (rc != 0) {
        sim_fail(sm, "wire", "worker %u: %s from %u refused by the session: %s", w->id,
                 sim_msg_name(h.type), m->from, cps_err_name(rc));
        return;
    }
    uint32_t ssp_pull = UINT32_MAX;
    perform(sm, w, &h, m->from, &ssp_pull);
    /* SSP: the step's push answered, its pull at the step's clock follows (a given-up push's
     * step is over: op_finish). */
    if (ssp_pull != UINT32_MAX && !sm->failed)
        issue(sm, w, REQ_PULL, ssp_pull)->ssp_step = 1;
}
