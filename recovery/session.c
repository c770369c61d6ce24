/* The worker's protocol as one state machine: see session.h. */
#include "session.h"

#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "core/array.h"
#include "recovery/suspect.h"

#define SCHED_PEER 0u
/* Tags a registration so that the scheduler's error reply to it is told apart from a refusal
 * of the whole worker (which has req_worker 0). */
#define REG_WORKER_TAG 0x52454749u /* "REGI" */

struct cps__sess {
    cps__sess_config cfg;
    cps__reqs *rq;
    cps__view view;
    uint32_t id;
    /* Request ids: pushes carry a dense per-range sequence (the servers' exactly-once record
     * relies on it), sparse-row pushes one of their own, every other request a third space so
     * that none leaves a gap in a push sequence. Allocated with the first view. */
    uint64_t *range_seq;
    uint64_t *sparse_seq;
    uint32_t nseq;
    uint64_t other_seq;
    uint64_t added_seq; /* the id of the request the last cps__sess_add added */
    cps__sess_clock *clocks;
    uint64_t start_step;
    int shutdown;
    int settled; /* the views of epoch settled_epoch say CPS_VIEW_WORKERS_SETTLED (core/wire.h) */
    uint64_t settled_epoch;
    int view_asked;
    uint64_t view_asked_ms;
    uint64_t sched_heard_ms;
    /* Data-path evidence (recovery/suspect.h): when we last heard from each server (the most
     * recent CPS_SUSPECT_MAX of them), and when we last reported the silent ones. */
    struct {
        uint32_t node;
        uint64_t ms;
    } heard[CPS_SUSPECT_MAX];
    uint32_t nheard;
    uint64_t suspects_checked_ms;
    /* The call to the scheduler in progress (cps__sess_call). */
    struct {
        int active;
        int done;
        int result;
        int stamp_epoch; /* sent under the view epoch of the moment */
        cps__msg_hdr h;
        const void *payload;
        size_t len;
        uint64_t started, sent;
    } call;
    uint64_t reg_seq;
    uint64_t barrier_seq;
    cps__sess_action *out;
    size_t nout, out_cap;
};

int cps__sess_create(const cps__sess_config *cfg, cps__sess **out)
{
    if (!cfg || !out)
        return CPS_EINVAL;
    *out = NULL;
    cps__sess *s = calloc(1, sizeof *s);
    if (!s)
        return CPS_ENOMEM;
    s->cfg = *cfg;
    cps__view_init(&s->view);
    cps__reqs_config rc = {.request_timeout_ms = cfg->request_timeout_ms,
                           .unavailable_timeout_ms = cfg->unavailable_timeout_ms,
                           .retry_ms = cfg->retry_ms};
    if (cps__reqs_create(&rc, &s->rq) != 0) {
        free(s);
        return CPS_ENOMEM;
    }
    *out = s;
    return 0;
}

void cps__sess_destroy(cps__sess *s)
{
    if (!s)
        return;
    cps__reqs_destroy(s->rq);
    cps__view_fini(&s->view);
    free(s->range_seq);
    free(s->sparse_seq);
    free(s->out);
    free(s);
}

/* ---- output ---- */

/* Room for the actions a call may hand out, taken before it changes anything where it can
 * report a failure: a request makes at most three (give-up, done, a released send), a view one
 * per node. */
static int reserve(cps__sess *s, size_t more)
{
    void *items = s->out;
    size_t need = s->nout + more + 3 * (size_t)(cps__reqs_count(s->rq) + 1) + s->view.nnodes + 8;
    if (cps__array_reserve(&items, &s->out_cap, need, sizeof *s->out, 64) != 0)
        return CPS_ENOMEM;
    s->out = items;
    return 0;
}

/* Out of memory where no call can fail, the action is lost; the request table re-sends what
 * was not sent, and the shell checks `pending` rather than waiting for CPS_SS_DONE. */
static cps__sess_action *emit(cps__sess *s, int kind)
{
    if (s->nout == s->out_cap && reserve(s, 1) != 0)
        return NULL;
    cps__sess_action *a = &s->out[s->nout++];
    memset(a, 0, sizeof *a);
    a->kind = kind;
    return a;
}

static void start(cps__sess *s)
{
    s->nout = 0;
}

static void part_done(cps__sess *s, cps__sess_op *op, int err)
{
    if (err != 0 && op->result == 0)
        op->result = err;
    if (op->pending > 0 && --op->pending == 0) {
        cps__sess_action *a = emit(s, CPS_SS_DONE);
        if (a) {
            a->op = op;
            a->status = op->result;
        }
    }
}

static void ask_view(cps__sess *s, uint64_t now)
{
    if (s->view_asked && now - s->view_asked_ms < s->cfg.view_ask_min_ms)
        return;
    s->view_asked = 1;
    s->view_asked_ms = now;
    cps__sess_action *a = emit(s, CPS_SS_SCHED);
    if (a)
        a->hdr = (cps__msg_hdr){.type = CPS_MSG_GET_VIEW, .sender = s->id, .epoch = s->view.epoch};
}

static int has_values(uint8_t type)
{
    return type == CPS_MSG_PUSH || type == CPS_MSG_PUSH_PULL;
}

/* Hand out what the last call into the request table decided, as the session's actions. */
static void drain(cps__sess *s, uint64_t now)
{
    const cps__reqs_action *acts;
    size_t n = cps__reqs_actions(s->rq, &acts);
    for (size_t k = 0; k < n; k++) {
        const cps__reqs_action *ra = &acts[k];
        cps__sess_op *op = ra->ctx;
        if (ra->kind == CPS_RQ_ASK_VIEW) {
            ask_view(s, now);
            continue;
        }
        int kind = ra->kind == CPS_RQ_SEND           ? CPS_SS_SEND
                   : ra->kind == CPS_RQ_WAIT_REPLICA ? CPS_SS_WAIT_REPLICA
                                                     : CPS_SS_GIVE_UP;
        cps__sess_action *a = emit(s, kind);
        if (a) {
            a->why = ra->why;
            a->status = ra->status;
            a->index = ra->index;
            a->op = op;
            a->part = ra->part;
            a->type = ra->type;
            a->range = ra->range;
            a->seq = ra->seq;
            a->to = ra->to;
            a->epoch = ra->epoch;
            a->attempt = ra->attempt;
            a->detach = ra->detach;
            if (kind == CPS_SS_SEND && op) {
                a->step = op->step;
                if (op->noagg)
                    a->flags |= CPS_WF_NOAGG;
                if (op->first && has_values(ra->type))
                    a->flags |= CPS_WF_FIRST;
            }
        }
        if (ra->kind == CPS_RQ_COMPLETE && op)
            part_done(s, op, ra->status);
    }
}

/* ---- the API's operations ---- */

static uint8_t wire_type(int kind)
{
    switch (kind) {
    case CPS_SS_DECLARE:
        return CPS_MSG_DECLARE;
    case CPS_SS_PUSH:
        return CPS_MSG_PUSH;
    case CPS_SS_PULL:
        return CPS_MSG_PULL;
    default:
        return CPS_MSG_PUSH_PULL;
    }
}

void cps__sess_begin(cps__sess *s, cps__sess_op *op, cps__sess_clock *clock, int mark_first)
{
    (void)s;
    op->pending = op->nparts;
    op->result = 0;
    op->first = 0;
    op->clock = NULL;
    if (op->kind == CPS_SS_PUSH || op->kind == CPS_SS_PUSH_PULL) {
        op->step = 0;
        if (clock) {
            /* A push is the tensor's next step; a late answer may move the tensor further on
             * (cps__sess_step), to the step the job is on. */
            op->step = ++clock->step;
            op->clock = clock;
            if (mark_first) {
                op->first = !clock->pushed;
                clock->pushed = 1;
            }
        }
    } else if (clock) {
        op->step = clock->step; /* a pull's SSP clock */
    }
}

int cps__sess_add(cps__sess *s, cps__sess_op *op, uint32_t part, uint32_t range, uint64_t keyset,
                  uint64_t now)
{
    start(s);
    uint8_t type = wire_type(op->kind);
    /* After the job's end nothing is sent: an entry added now would outlive its call. */
    int rc = s->shutdown ? CPS_ESHUTDOWN : range < s->nseq ? reserve(s, 4) : CPS_EINVAL;
    uint64_t *last = NULL, space = 0;
    if (rc == 0) {
        if (op->noagg)
            last = &s->sparse_seq[range], space = CPS_SEQ_SPARSE;
        else if (has_values(type))
            last = &s->range_seq[range], space = 0;
        else
            last = &s->other_seq, space = CPS_SEQ_OTHER;
        /* A sync step's push must not overtake the worker's push of an earlier step of its key
         * set (see cps__reqs_add_ordered). */
        uint64_t order =
            s->view.mode == CPS_MODE_SYNC && !op->noagg && space == 0 && keyset ? keyset | 1 : 0;
        /* The counter moves only once the request is in the table: no gap. */
        rc = cps__reqs_add_ordered(s->rq, &s->view, op, part, type, range, space | (*last + 1),
                                   order, now);
    }
    if (rc != 0) {
        uint32_t left = op->nparts > part ? op->nparts - part : 0;
        if (op->result == 0)
            op->result = rc;
        if (left >= op->pending) {
            op->pending = 1;
            part_done(s, op, rc);
        } else {
            op->pending -= left;
        }
        return rc;
    }
    s->added_seq = space | ++*last;
    drain(s, now);
    return 0;
}

uint64_t cps__sess_added_seq(const cps__sess *s)
{
    return s->added_seq;
}

void cps__sess_sent(cps__sess *s, uint32_t index, int rc, uint64_t now)
{
    cps__reqs_sent(s->rq, index, rc, now);
}

void cps__sess_detach(cps__sess *s, uint32_t index, cps__sess_op *copy, uint32_t part)
{
    cps__reqs_detach(s->rq, index, copy, part);
}

void cps__sess_op_fail(cps__sess_op *op, int err)
{
    if (op && err != 0 && op->result == 0)
        op->result = err;
}

/* Every clock not pushed yet starts at the highest step any declaration found. A worker joining
 * a running job (a replacement) learns each tensor's step from the ranges that hold it, and the
 * ranges of one tensor, or two tensors, can differ by a step: the heads learnt of the new worker
 * at different moments relative to the other workers' pushes. Started together after the
 * highest, with each tensor's first push flagged (CPS_WF_FIRST), every range closes the steps
 * below without this worker and waits for it from there on, so a training loop that pushes
 * every tensor once per step stays in step with the job (issue 26). */
static void align_start(cps__sess *s)
{
    for (cps__sess_clock *k = s->clocks; k; k = k->next)
        if (!k->pushed && k->step < s->start_step)
            k->step = s->start_step;
}

void cps__sess_clock_add(cps__sess *s, cps__sess_clock *clock, uint64_t declared)
{
    clock->step = declared;
    clock->pushed = 0;
    clock->next = s->clocks;
    s->clocks = clock;
    if (declared > s->start_step)
        s->start_step = declared;
    align_start(s);
}

uint64_t cps__sess_start_step(const cps__sess *s)
{
    return s->start_step;
}

/* ---- messages ---- */

static void heard_from(cps__sess *s, uint32_t node, uint64_t now)
{
    uint32_t oldest = 0;
    for (uint32_t i = 0; i < s->nheard; i++) {
        if (s->heard[i].node == node) {
            s->heard[i].ms = now;
            return;
        }
        if (s->heard[i].ms < s->heard[oldest].ms)
            oldest = i;
    }
    uint32_t at = s->nheard < CPS_SUSPECT_MAX ? s->nheard++ : oldest;
    s->heard[at].node = node;
    s->heard[at].ms = now;
}

static void call_finish(cps__sess *s, int result)
{
    if (!s->call.active || s->call.done)
        return;
    s->call.done = 1;
    s->call.result = result;
}

/* The join is over once a WELCOME named us and a view came: ours only if it lists us as a
 * worker (a view of another job, or one that took our id for a server, is no place to train). */
static void hello_check(cps__sess *s)
{
    if (s->call.h.type != CPS_MSG_HELLO || s->id == 0 || s->view.nranges == 0)
        return;
    const cps__node_info *me = cps__view_node(&s->view, s->id);
    call_finish(s, me && me->role == CPS_ROLE_WORKER ? 0 : CPS_EPROTO);
}

/* Install view v (taken: moved into the session, or freed). */
static int install_view(cps__sess *s, cps__view *v, uint64_t now)
{
    int rc = 0;
    int first = s->view.nranges == 0;
    if (!first && v->epoch <= s->view.epoch) {
        cps__view_fini(v);
        return 0; /* one we have, or an older one */
    }
    if (!first && v->nranges != s->view.nranges)
        rc = CPS_EPROTO; /* the key-range map is fixed for a job's life */
    if (rc == 0 && first) {
        s->range_seq = calloc(v->nranges ? v->nranges : 1, sizeof *s->range_seq);
        s->sparse_seq = calloc(v->nranges ? v->nranges : 1, sizeof *s->sparse_seq);
        if (!s->range_seq || !s->sparse_seq) {
            free(s->range_seq);
            free(s->sparse_seq);
            s->range_seq = s->sparse_seq = NULL;
            rc = CPS_ENOMEM;
        } else {
            s->nseq = v->nranges;
        }
    }
    if (rc == 0 && reserve(s, v->nnodes + 1) != 0)
        rc = CPS_ENOMEM;
    if (rc != 0) {
        cps__view_fini(v);
        return rc;
    }
    cps__view_fini(&s->view);
    s->view = *v;
    cps__view_init(v);
    const cps__view *cur = &s->view;
    for (uint32_t i = 0; i < cur->nnodes; i++) {
        if (cur->nodes[i].id == s->id || cur->nodes[i].role != CPS_ROLE_SERVER)
            continue;
        cps__sess_action *a = emit(s, CPS_SS_PEER);
        if (a) {
            a->to = cur->nodes[i].id;
            a->addr = cur->nodes[i].addr;
        }
    }
    cps__sess_action *a = emit(s, CPS_SS_VIEW);
    if (a) {
        a->epoch = cur->epoch;
        a->first = first;
        a->count = cps__reqs_count(s->rq);
    }
    /* Every request in flight goes out again under the new view: a server that moved or took
     * over a range may never have seen it, and servers recognise duplicates. Not once the job is
     * over: those requests' calls returned CPS_ESHUTDOWN, and re-sending reads their buffers. */
    if (!s->shutdown) {
        cps__reqs_view(s->rq, cur, now);
        drain(s, now);
    }
    return 0;
}

/* The scheduler's word on a view it sent: taken from a view of the epoch we now hold. Within
 * one epoch it only goes from 0 to 1 (a replacement joining, a worker finishing, both publish;
 * only a death, which publishes a new epoch, takes it back), so the copies of one epoch,
 * in whatever order, may only add it. */
static void settled_in(cps__sess *s, const cps__msg_hdr *h)
{
    if (h->epoch != s->view.epoch)
        return; /* an older view's (or one that was not installed) */
    int word = (h->step & CPS_VIEW_WORKERS_SETTLED) != 0;
    s->settled = s->settled_epoch == h->epoch ? s->settled | word : word;
    s->settled_epoch = h->epoch;
}

static int view_msg(cps__sess *s, const void *payload, size_t len, uint64_t now)
{
    cps__view v;
    cps__view_init(&v);
    int rc = cps__view_decode(payload, len, &v);
    if (rc != 0) {
        cps__view_fini(&v);
        return rc;
    }
    return install_view(s, &v, now);
}

int cps__sess_view_in(cps__sess *s, uint32_t welcome_id, const cps__view *v, uint64_t now)
{
    start(s);
    cps__reqs_epoch_seen(s->rq, v->epoch);
    s->sched_heard_ms = now;
    if (welcome_id && s->id == 0)
        s->id = welcome_id;
    cps__view copy;
    cps__view_init(&copy);
    int rc = cps__view_copy(&copy, v);
    if (rc != 0) {
        cps__view_fini(&copy);
        return rc;
    }
    rc = install_view(s, &copy, now);
    hello_check(s);
    return rc;
}

/* A reply (ACK / VALUES / ERROR) from a server to one of our requests. */
static void on_reply(cps__sess *s, const cps__msg_hdr *h, const void *payload, size_t len,
                     uint64_t now)
{
    cps__reqs_reply_in in = {.type = h->type,
                             .range = h->range,
                             .req_seq = h->req_seq,
                             .epoch = h->epoch,
                             .status = h->status};
    /* Every op's call has returned CPS_ESHUTDOWN (cps__sess_op_over): the op and its buffers
     * are its caller's again, maybe freed. A late answer must touch neither. */
    if (s->shutdown)
        return;
    cps__reqs_done d;
    int verdict = cps__reqs_reply(s->rq, &s->view, &in, now, &d);
    drain(s, now);
    if (verdict != CPS_RQ_REPLY_FAILED && verdict != CPS_RQ_REPLY_TAKEN)
        return; /* a duplicate, a parked request, or an answer of another configuration */
    cps__sess_op *op = d.ctx;
    if (d.detached) {
        /* A push given up earlier, answered at last: its caller has long had its error. */
        cps__sess_action *a = emit(s, CPS_SS_RELEASE);
        if (a) {
            a->op = op;
            a->to = h->sender;
            a->range = h->range;
            a->seq = h->req_seq;
            a->status = verdict == CPS_RQ_REPLY_FAILED ? d.status : 0;
        }
        return;
    }
    cps__sess_action *a = emit(s, verdict == CPS_RQ_REPLY_FAILED ? CPS_SS_REFUSED : CPS_SS_ANSWER);
    if (a) {
        a->op = op;
        a->part = d.part;
        a->to = h->sender;
        a->range = h->range;
        a->seq = h->req_seq;
        a->type = h->type;
        a->status = verdict == CPS_RQ_REPLY_FAILED ? d.status : 0;
        a->late = (h->flags & CPS_WF_LATE) != 0;
        a->payload = payload;
        a->len = len;
    }
    if (verdict == CPS_RQ_REPLY_FAILED) {
        part_done(s, op, d.status);
        return;
    }
    /* A declaration's answer carries the last sync step the servers applied to the key set:
     * a worker joining a running job continues from there (its first push is the next step). */
    if (h->type == CPS_MSG_ACK && op->kind == CPS_SS_DECLARE && h->aux > op->step)
        op->step = h->aux;
    /* A sync push that came after its step closed (backup workers) was dropped; the reply names
     * the step the key set is on, and the worker's next push is the one after it, so a slow
     * worker keeps up with the job instead of falling further behind. */
    if ((h->flags & CPS_WF_LATE) && op->clock && h->aux > op->clock->step)
        op->clock->step = h->aux;
    part_done(s, op, 0);
}

int cps__sess_values_target(const cps__sess *s, const cps__msg_hdr *h, cps__sess_op **op,
                            uint32_t *part)
{
    void *ctx;
    if (s->shutdown || h->type != CPS_MSG_VALUES || h->sender == SCHED_PEER ||
        !cps__reqs_would_take(s->rq, h->range, h->req_seq, h->epoch, &ctx, part))
        return 0;
    *op = ctx;
    return 1;
}

int cps__sess_step(cps__sess *s, const cps__msg_hdr *h, const void *payload, size_t len,
                   uint64_t now)
{
    start(s);
    int rc = 0;
    cps__reqs_epoch_seen(s->rq, h->epoch);
    if (h->sender == SCHED_PEER)
        s->sched_heard_ms = now;
    else
        heard_from(s, h->sender, now);
    int from_sched = h->sender == SCHED_PEER;
    switch (h->type) {
    case CPS_MSG_WELCOME:
    case CPS_MSG_VIEW:
        if (from_sched) {
            if (h->type == CPS_MSG_WELCOME && s->id == 0)
                s->id = h->req_worker;
            rc = view_msg(s, payload, len, now);
            settled_in(s, h);
        }
        break;
    case CPS_MSG_ACK:
        if (from_sched) {
            if (s->call.h.type == CPS_MSG_BYE)
                call_finish(s, 0);
        } else {
            on_reply(s, h, payload, len, now);
        }
        break;
    case CPS_MSG_VALUES:
    case CPS_MSG_ERROR:
        if (from_sched && h->type == CPS_MSG_ERROR && s->reg_seq && h->req_seq == s->reg_seq &&
            (h->flags & CPS_WF_REPLY) && h->req_worker == REG_WORKER_TAG) {
            if (s->call.h.type == CPS_MSG_REGISTER)
                call_finish(s, h->status);
        } else if (from_sched && h->type == CPS_MSG_ERROR) {
            /* Its text says why ("job is full", "the job has ended"). */
            cps__sess_action *a = emit(s, CPS_SS_EXPELLED);
            if (a) {
                a->status = h->status;
                a->payload = payload;
                a->len = len;
            }
            s->shutdown = 1;
        } else if (!from_sched) {
            on_reply(s, h, payload, len, now);
        }
        break;
    case CPS_MSG_REGISTER:
        if (from_sched && h->req_seq == s->reg_seq && s->call.h.type == CPS_MSG_REGISTER)
            call_finish(s, 0);
        break;
    case CPS_MSG_BARRIER_DONE:
        if (h->req_seq == s->barrier_seq && s->call.h.type == CPS_MSG_BARRIER)
            call_finish(s, 0);
        break;
    case CPS_MSG_SHUTDOWN:
        s->shutdown = 1;
        break;
    default:
        rc = CPS_EPROTO;
    }
    hello_check(s);
    if (s->shutdown)
        call_finish(s, CPS_ESHUTDOWN);
    return rc;
}

/* ---- time ---- */

static void call_send(cps__sess *s, uint64_t now)
{
    s->call.sent = now;
    if (s->call.stamp_epoch)
        s->call.h.epoch = s->view.epoch;
    cps__sess_action *a = emit(s, CPS_SS_SCHED);
    if (a) {
        a->hdr = s->call.h;
        a->payload = s->call.payload;
        a->len = s->call.len;
    }
    /* Waiting on the scheduler for the others (a barrier, a registration): the view request is
     * answered even meanwhile, proof that the scheduler lives. */
    if (s->call.h.type == CPS_MSG_REGISTER || s->call.h.type == CPS_MSG_BARRIER)
        ask_view(s, now);
}

/* How long the scheduler may answer nothing before a call that waits on it fails: at least
 * three view requests go unanswered first. */
static uint64_t gone_ms(const cps__sess *s)
{
    uint64_t three = 3 * (uint64_t)s->cfg.request_timeout_ms;
    return s->cfg.unavailable_timeout_ms > three ? s->cfg.unavailable_timeout_ms : three;
}

static uint64_t call_period(const cps__sess *s)
{
    uint8_t t = s->call.h.type;
    return t == CPS_MSG_HELLO || t == CPS_MSG_BYE ? s->cfg.hello_retry_ms
                                                  : s->cfg.request_timeout_ms;
}

static void call_tick(cps__sess *s, uint64_t now)
{
    if (!s->call.active || s->call.done)
        return;
    uint8_t t = s->call.h.type;
    if (s->shutdown) {
        call_finish(s, CPS_ESHUTDOWN);
    } else if (t == CPS_MSG_HELLO && now - s->call.started > s->cfg.join_timeout_ms) {
        call_finish(s, CPS_ETIMEDOUT);
    } else if (t == CPS_MSG_BYE && now - s->call.started >= s->cfg.bye_wait_ms) {
        call_finish(s, CPS_ETIMEDOUT);
    } else if ((t == CPS_MSG_REGISTER || t == CPS_MSG_BARRIER) &&
               now - s->sched_heard_ms > gone_ms(s)) {
        /* A barrier may rightly wait for slow workers for ever, but not for a scheduler that
         * answers nothing (not even the views we ask for). Not CPS_EUNAVAILABLE, which says a
         * range has no replica: the servers may be fine. */
        call_finish(s, CPS_ESCHEDULER);
    } else if (now - s->call.sent >= call_period(s)) {
        call_send(s, now);
    }
}

void cps__sess_tick(cps__sess *s, uint64_t now)
{
    start(s);
    /* Not once the job is over: a re-send reads the op's buffers, a give-up writes the op, and
     * their calls have returned (see on_reply). */
    if (!s->shutdown) {
        cps__reqs_tick(s->rq, &s->view, now);
        drain(s, now);
    }
    call_tick(s, now);
    if (now - s->suspects_checked_ms >= CPS_SUSPECT_REPORT_MS && !s->shutdown) {
        s->suspects_checked_ms = now;
        cps__sess_action *a = emit(s, CPS_SS_SUSPECTS);
        if (a)
            a->evidence_ms = cps__suspect_evidence_ms(s->cfg.dead_after_ms);
    }
}

uint64_t cps__sess_deadline(const cps__sess *s, uint64_t now)
{
    uint64_t due = s->suspects_checked_ms + CPS_SUSPECT_REPORT_MS;
    if (s->call.active && !s->call.done && s->call.sent + call_period(s) < due)
        due = s->call.sent + call_period(s);
    /* The request table's timers run at its retry granularity. */
    if (cps__reqs_count(s->rq) > 0 && now + s->cfg.retry_ms < due)
        due = now + s->cfg.retry_ms;
    return due < now ? now : due;
}

/* ---- calls to the scheduler ---- */

int cps__sess_call(cps__sess *s, uint8_t type, const void *payload, size_t len, uint64_t now)
{
    start(s);
    if (s->call.active && !s->call.done)
        return CPS_EBUSY;
    cps__msg_hdr h = {.type = type, .sender = s->id};
    int stamp = 1;
    switch (type) {
    case CPS_MSG_HELLO:
        h.sender = UINT32_MAX; /* no id yet */
        stamp = 0;
        break;
    case CPS_MSG_REGISTER:
        h.req_worker = REG_WORKER_TAG;
        h.req_seq = ++s->reg_seq;
        break;
    case CPS_MSG_BARRIER:
        h.req_worker = s->id;
        h.req_seq = ++s->barrier_seq;
        break;
    case CPS_MSG_BYE:
        break;
    default:
        return CPS_EINVAL;
    }
    memset(&s->call, 0, sizeof s->call);
    s->call.active = 1;
    s->call.h = h;
    s->call.stamp_epoch = stamp;
    s->call.payload = payload;
    s->call.len = len;
    s->call.started = now;
    if (s->sched_heard_ms < now)
        s->sched_heard_ms = now; /* the silence counts from the call's start */
    if (s->shutdown)
        call_finish(s, CPS_ESHUTDOWN);
    else
        call_send(s, now);
    return 0;
}

int cps__sess_call_done(cps__sess *s, int *result)
{
    if (!s->call.active || !s->call.done)
        return 0;
    if (result)
        *result = s->call.result;
    s->call.active = 0;
    s->call.h.type = 0;
    return 1;
}

/* ---- queries ---- */

size_t cps__sess_output(const cps__sess *s, const cps__sess_action **out)
{
    *out = s->out;
    return s->nout;
}

const cps__view *cps__sess_view(const cps__sess *s)
{
    return &s->view;
}

uint32_t cps__sess_id(const cps__sess *s)
{
    return s->id;
}

int cps__sess_shutdown(const cps__sess *s)
{
    return s->shutdown;
}

int cps__sess_workers_settled(const cps__sess *s)
{
    /* cps__sess_view_in installs views without their header: an older epoch's word is not the
     * held view's. */
    return s->settled && s->settled_epoch == s->view.epoch;
}

uint32_t cps__sess_pending(const cps__sess *s)
{
    return cps__reqs_count(s->rq);
}

uint32_t cps__sess_detached(const cps__sess *s)
{
    return cps__reqs_detached(s->rq);
}

uint32_t cps__sess_rank(const cps__sess *s)
{
    const cps__node_info *me = cps__view_node(&s->view, s->id);
    return me ? me->rank : 0;
}

uint64_t cps__sess_sched_gone_ms(const cps__sess *s)
{
    return gone_ms(s);
}

int cps__sess_op_over(const cps__sess *s, const cps__sess_op *op, int *result)
{
    if (op->pending == 0) {
        *result = op->result;
        return 1;
    }
    if (s->shutdown) {
        *result = CPS_ESHUTDOWN; /* the job ended under us; nothing will answer */
        return 1;
    }
    return 0;
}

int cps__sess_settled(const cps__sess *s)
{
    return cps__reqs_count(s->rq) == 0 || s->shutdown;
}

int cps__sess_leave_result(const cps__sess *s)
{
    /* Pushes given up (detached) are no call's any more: they may go unanswered. */
    return cps__reqs_count(s->rq) > cps__reqs_detached(s->rq) ? CPS_ETIMEDOUT : 0;
}

uint64_t cps__sess_waiting(void *ctx, uint32_t node, uint64_t *heard)
{
    const cps__sess *s = ctx;
    *heard = 0;
    for (uint32_t i = 0; i < s->nheard; i++)
        if (s->heard[i].node == node)
            *heard = s->heard[i].ms;
    return cps__reqs_oldest_to(s->rq, node);
}
