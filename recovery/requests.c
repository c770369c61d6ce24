/* The worker's request table: see requests.h. */
#include "requests.h"

#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "core/array.h"
#include "core/wire.h"
#include "recovery/view_change.h"

typedef struct entry {
    void *ctx;
    uint32_t part;
    uint8_t type;
    uint32_t range;
    uint64_t seq;
    uint64_t sent_ms;
    uint64_t sent_epoch; /* the view epoch it was last sent under: only a reply produced under
                            that epoch answers it */
    uint32_t attempts;
    int fresh;                  /* its first send is being performed (see cps__reqs_sent) */
    uint64_t unavailable_since; /* first time its range had no live replica; 0 if it has */
    int detached;               /* completed for the caller, still sent (cps__reqs_detach) */
    int dropped;                /* detached with no context: leaves at the next call */
    uint64_t order;             /* 0, or its key set's: see cps__reqs_add_ordered */
    int held;                   /* waits for an earlier request of its (range, order) to leave */
    int queued;        /* its range has CPS_REQS_WINDOW requests out: waits for one to leave */
    int released;      /* that request left: send it (send_released) */
    uint64_t added;    /* when it was added, in adds: held ones leave in this order */
    uint32_t to;       /* the server it was last sent to */
    uint64_t to_since; /* when it first went out to `to` (0: not yet): cps__reqs_oldest_to */
} entry;

struct cps__reqs {
    cps__reqs_config cfg;
    entry *reqs;
    size_t nreqs, reqs_cap;
    size_t ndetached;
    uint64_t nadded;
    uint64_t seen_epoch; /* highest epoch any message carried */
    /* Room for two actions per request and one more, reserved as requests are added, so that
     * no call but cps__reqs_add needs memory. */
    cps__reqs_action *acts;
    size_t nacts, acts_cap;
    int asked_view; /* the last call already asks for a view */
};

int cps__reqs_create(const cps__reqs_config *cfg, cps__reqs **out)
{
    if (!cfg || !out)
        return CPS_EINVAL;
    cps__reqs *rq = calloc(1, sizeof *rq);
    if (!rq)
        return CPS_ENOMEM;
    rq->cfg = *cfg;
    *out = rq;
    return 0;
}

void cps__reqs_destroy(cps__reqs *rq)
{
    if (!rq)
        return;
    free(rq->reqs);
    free(rq->acts);
    free(rq);
}

/* Requests of (range, order) are held while an earlier one of theirs is detached or held: walk
 * them in adding order (the table is not in it: removal moves the last entry into the hole) and
 * let go those no longer behind one. A released one goes out at the next tick (sent_ms 0 makes
 * it overdue), or at once where the caller has a view (send_released). */
static void release_held(cps__reqs *rq, uint32_t range, uint64_t order)
{
    uint64_t after = 0;
    for (;;) {
        entry *next = NULL;
        for (uint32_t j = 0; j < rq->nreqs; j++) {
            entry *h = &rq->reqs[j];
            if (h->range == range && h->order == order && h->added > after &&
                (!next || h->added < next->added))
                next = h;
        }
        if (!next)
            return;
        if (next->held) {
            next->held = 0;
            next->released = 1;
            next->sent_ms = 0;
        }
        if (next->detached)
            return; /* what comes after it stays held */
        after = next->added;
    }
}

/* Requests of `range` out (sent or to be re-sent), the queued and held ones not counted. */
static uint32_t range_out(const cps__reqs *rq, uint32_t range)
{
    uint32_t n = 0;
    for (uint32_t j = 0; j < rq->nreqs; j++)
        n += rq->reqs[j].range == range && !rq->reqs[j].queued && !rq->reqs[j].held;
    return n;
}

/* Let the oldest queued requests of `range` go while the window has room. */
static void release_queued(cps__reqs *rq, uint32_t range)
{
    uint32_t out = range_out(rq, range);
    while (out < CPS_REQS_WINDOW) {
        entry *next = NULL;
        for (uint32_t j = 0; j < rq->nreqs; j++) {
            entry *q = &rq->reqs[j];
            if (q->queued && q->range == range && (!next || q->added < next->added))
                next = q;
        }
        if (!next)
            return;
        next->queued = 0;
        next->released = 1;
        next->sent_ms = 0;
        out++;
    }
}

static void remove_at(cps__reqs *rq, uint32_t i)
{
    entry *e = &rq->reqs[i];
    uint32_t range = e->range;
    uint64_t order = e->order;
    int was_out = !e->queued && !e->held;
    if (e->detached)
        rq->ndetached--;
    rq->reqs[i] = rq->reqs[--rq->nreqs];
    if (order)
        release_held(rq, range, order);
    if (was_out)
        release_queued(rq, range);
}

static void begin(cps__reqs *rq)
{
    rq->nacts = 0;
    rq->asked_view = 0;
    /* Removed only now: the indices of the last call's actions held until this call. */
    for (uint32_t i = 0; i < rq->nreqs; i++)
        if (rq->reqs[i].dropped)
            remove_at(rq, i--);
}

/* One view request per call is enough: the caller rate-limits them anyway. */
static void ask_view(cps__reqs *rq)
{
    if (rq->asked_view)
        return;
    rq->asked_view = 1;
    rq->acts[rq->nacts++] = (cps__reqs_action){.kind = CPS_RQ_ASK_VIEW};
}

static cps__reqs_action *push(cps__reqs *rq, int kind, uint32_t i)
{
    const entry *e = &rq->reqs[i];
    cps__reqs_action *a = &rq->acts[rq->nacts++];
    *a = (cps__reqs_action){.kind = kind,
                            .index = i,
                            .ctx = e->ctx,
                            .part = e->part,
                            .type = e->type,
                            .range = e->range,
                            .seq = e->seq};
    return a;
}

/* Send request i under v: to the head of its range's chain (updates) or its tail (reads).
 * Returns 0 if a send was handed out or the request waits for a view, CPS_EUNAVAILABLE if v
 * has no chain for its range. */
static int try_send(cps__reqs *rq, const cps__view *v, uint32_t i, int why)
{
    entry *e = &rq->reqs[i];
    if (e->held || e->queued)
        return 0; /* goes out when the request ahead of it leaves */
    if (e->range >= v->nranges || v->ranges[e->range].chain_len == 0)
        return CPS_EUNAVAILABLE;
    const cps__range *rg = &v->ranges[e->range];
    uint32_t to = e->type == CPS_MSG_PULL ? rg->chain[rg->chain_len - 1] : rg->chain[0];
    if (e->type == CPS_MSG_PULL && rq->seen_epoch > v->epoch) {
        /* A server already answered under a newer view: our tail may be a removed one that
         * has not seen our acknowledged writes. Read only once we have that view. */
        ask_view(rq);
        return 0;
    }
    e->sent_epoch = v->epoch;
    if (e->to != to || e->to_since == 0) {
        e->to = to;
        e->to_since = 0; /* set by the send's report (cps__reqs_sent), which has the time */
    }
    cps__reqs_action *a = push(rq, CPS_RQ_SEND, i);
    a->why = why;
    a->to = to;
    a->epoch = v->epoch;
    a->attempt = e->attempts;
    return 0;
}

/* Send the requests remove_at let go, under v. */
static void send_released(cps__reqs *rq, const cps__view *v, uint64_t now)
{
    /* In adding order: they go out on one connection, and the head sees them in that order. */
    for (;;) {
        uint32_t i = UINT32_MAX;
        for (uint32_t j = 0; j < rq->nreqs; j++)
            if (rq->reqs[j].released && (i == UINT32_MAX || rq->reqs[j].added < rq->reqs[i].added))
                i = j;
        if (i == UINT32_MAX)
            return;
        entry *e = &rq->reqs[i];
        e->released = 0;
        size_t before = rq->nacts;
        if (try_send(rq, v, i, CPS_RQ_WHY_NEW) == 0)
            e->sent_ms = now;
        e->fresh = rq->nacts > before && rq->acts[rq->nacts - 1].kind == CPS_RQ_SEND;
    }
}

/* Is e a push whose give-up must still reach the head (see cps__reqs_detach)? Every push is:
 * an async or SSP one, or a sparse-row one, holds a number in its worker's sequence that the head
 * waits for; a sync step's dense push is one of the step's contributions, and the step (and every
 * later step of its key set, which the head applies in step order) completes only once it came. */
static int is_push(const entry *e)
{
    return e->type == CPS_MSG_PUSH || e->type == CPS_MSG_PUSH_PULL;
}

void cps__reqs_epoch_seen(cps__reqs *rq, uint64_t epoch)
{
    if (epoch > rq->seen_epoch)
        rq->seen_epoch = epoch;
}

int cps__reqs_add(cps__reqs *rq, const cps__view *v, void *ctx, uint32_t part, uint8_t type,
                  uint32_t range, uint64_t seq, uint64_t now)
{
    return cps__reqs_add_ordered(rq, v, ctx, part, type, range, seq, 0, now);
}

int cps__reqs_add_ordered(cps__reqs *rq, const cps__view *v, void *ctx, uint32_t part, uint8_t type,
                          uint32_t range, uint64_t seq, uint64_t order, uint64_t now)
{
    begin(rq);
    void *items = rq->reqs;
    if (cps__array_reserve(&items, &rq->reqs_cap, rq->nreqs + 1, sizeof *rq->reqs, 64) != 0)
        return CPS_ENOMEM;
    rq->reqs = items;
    items = rq->acts;
    if (cps__array_reserve(&items, &rq->acts_cap, 2 * (rq->nreqs + 1) + 1, sizeof *rq->acts, 129) !=
        0)
        return CPS_ENOMEM;
    rq->acts = items;
    uint32_t i = (uint32_t)rq->nreqs++;
    entry *e = &rq->reqs[i];
    memset(e, 0, sizeof *e);
    e->ctx = ctx;
    e->part = part;
    e->type = type;
    e->range = range;
    e->seq = seq;
    e->order = order;
    e->added = ++rq->nadded;
    for (uint32_t j = 0; order && j < i; j++)
        if (rq->reqs[j].range == range && rq->reqs[j].order == order &&
            (rq->reqs[j].detached || rq->reqs[j].held))
            e->held = 1;
    /* A sync step's push is not queued: the step completes only once every worker's push of
     * it arrived, and workers may push their tensors in different orders. */
    if (!e->held && !order && range_out(rq, range) > CPS_REQS_WINDOW)
        e->queued = 1;
    if (e->held || e->queued) {
        e->sent_ms = now; /* not overdue: it leaves the queue through remove_at */
    } else if (try_send(rq, v, i, CPS_RQ_WHY_NEW) != 0) {
        /* Not sent now: the retry timer sends it again. */
        e->sent_ms = now;
        e->attempts = 1;
    } else if (rq->nacts > 0 && rq->acts[rq->nacts - 1].kind == CPS_RQ_SEND) {
        e->fresh = 1;
    }
    return 0;
}

void cps__reqs_sent(cps__reqs *rq, uint32_t index, int rc, uint64_t now)
{
    if (index >= rq->nreqs)
        return;
    entry *e = &rq->reqs[index];
    e->sent_ms = now;
    if (rc == 0 && e->to_since == 0)
        e->to_since = now ? now : 1;
    if (rc == 0)
        e->attempts++;
    else if (e->fresh)
        e->attempts = 1; /* a first send that failed counts as made: its retry is a retry */
    e->fresh = 0;
}

/* The one acceptance rule of an answer (range, req_seq) produced under `epoch`, for
 * cps__reqs_reply and cps__reqs_would_take: CPS_RQ_REPLY_UNKNOWN if no request is so numbered (a
 * duplicate answer to one already completed), _OTHER_EPOCH if it was produced under another
 * configuration than the request's last send, else _TAKEN; *at the request's index. An ERROR is
 * the request's whatever its epoch: cps__reqs_reply looks at it before the epoch. A dropped
 * request (detached, its caller kept no context) is no longer there: the next call's begin()
 * removes it before any answer is looked up, and a pure look-up must see the table as that call
 * will. */
static int lookup(const cps__reqs *rq, uint32_t range, uint64_t req_seq, uint64_t epoch,
                  uint32_t *at)
{
    for (uint32_t i = 0; i < rq->nreqs; i++) {
        const entry *e = &rq->reqs[i];
        if (e->range != range || e->seq != req_seq || e->dropped)
            continue;
        *at = i;
        return e->sent_epoch == epoch ? CPS_RQ_REPLY_TAKEN : CPS_RQ_REPLY_OTHER_EPOCH;
    }
    return CPS_RQ_REPLY_UNKNOWN;
}

int cps__reqs_reply(cps__reqs *rq, const cps__view *v, const cps__reqs_reply_in *in, uint64_t now,
                    cps__reqs_done *done)
{
    begin(rq);
    uint32_t i = 0;
    int verdict = lookup(rq, in->range, in->req_seq, in->epoch, &i);
    if (verdict == CPS_RQ_REPLY_UNKNOWN)
        return verdict;
    entry *e = &rq->reqs[i];
    if (done)
        *done = (cps__reqs_done){
            .ctx = e->ctx, .part = e->part, .sent_epoch = e->sent_epoch, .detached = e->detached};
    if (in->type == CPS_MSG_ERROR) {
        int err = in->status < 0 ? in->status : CPS_EPROTO;
        if (err == CPS_ESTALE_EPOCH || err == CPS_EAGAIN) {
            /* Not the caller's problem: the request is parked for retry_ms, and goes out at
             * once if the view asked for arrives in the meantime. A server with a newer view
             * refuses again until we have it, and a refusal of a send made under an older view
             * of ours is answered by the re-send under the view we have now. */
            e->sent_ms = now - rq->cfg.request_timeout_ms + rq->cfg.retry_ms;
            ask_view(rq);
            return CPS_RQ_REPLY_RETRY;
        }
        if (done)
            done->status = err;
        remove_at(rq, i);
        send_released(rq, v, now);
        return CPS_RQ_REPLY_FAILED;
    }
    if (verdict == CPS_RQ_REPLY_OTHER_EPOCH) {
        /* An answer produced under another configuration than the one the request entered:
         * not taken. The request is re-sent under the current view, where the chain answers
         * it again (exactly-once makes the repeat harmless). */
        if (in->epoch > v->epoch)
            ask_view(rq); /* installing the newer view re-sends it */
        else if (in->epoch > e->sent_epoch)
            e->sent_ms = now - rq->cfg.request_timeout_ms; /* re-send at the next tick */
        /* else: a late answer to an earlier send; the answer to the last one is coming */
        return CPS_RQ_REPLY_OTHER_EPOCH;
    }
    remove_at(rq, i);
    send_released(rq, v, now);
    return CPS_RQ_REPLY_TAKEN;
}

int cps__reqs_would_take(const cps__reqs *rq, uint32_t range, uint64_t req_seq, uint64_t epoch,
                         void **ctx, uint32_t *part)
{
    uint32_t i = 0;
    if (lookup(rq, range, req_seq, epoch, &i) != CPS_RQ_REPLY_TAKEN)
        return 0;
    /* Taken, but a detached request's caller has had its result long ago: no call waits for
     * values, so there is nowhere to copy them early. */
    const entry *e = &rq->reqs[i];
    if (e->detached)
        return 0;
    *ctx = e->ctx;
    *part = e->part;
    return 1;
}

void cps__reqs_view(cps__reqs *rq, const cps__view *v, uint64_t now)
{
    begin(rq);
    for (uint32_t i = 0; i < rq->nreqs; i++) {
        if (try_send(rq, v, i, CPS_RQ_WHY_VIEW) != 0)
            rq->reqs[i].sent_ms = now;
    }
}

void cps__reqs_tick(cps__reqs *rq, const cps__view *v, uint64_t now)
{
    begin(rq);
    for (uint32_t i = 0; i < rq->nreqs; i++) {
        entry *e = &rq->reqs[i];
        if (e->detached) {
            /* Over for the caller: it waits for a replica however long it takes. */
        } else if (e->range < v->nranges && !cps__view_range_available(v, e->range)) {
            /* Every replica of the range is gone: wait (one may come back), then give up. */
            if (!e->unavailable_since) {
                e->unavailable_since = now;
                push(rq, CPS_RQ_WAIT_REPLICA, i);
            } else if (now - e->unavailable_since > rq->cfg.unavailable_timeout_ms) {
                cps__reqs_action *a = push(rq, CPS_RQ_COMPLETE, i);
                a->status = CPS_EUNAVAILABLE;
                if (is_push(e)) {
                    /* Its number must still reach the head (see cps__reqs_detach); the caller
                     * hands it a context of its own before it goes out again. */
                    a->detach = 1;
                    e->detached = 1;
                    e->ctx = NULL;
                    rq->ndetached++;
                    continue;
                }
                /* The last request moves to i: actions so far name requests before i only. */
                remove_at(rq, i--);
                continue;
            }
        } else {
            e->unavailable_since = 0;
        }
        if (e->held || e->queued || now - e->sent_ms < rq->cfg.request_timeout_ms)
            continue;
        e->released = 0;
        /* Overdue, or waited for a view that has not come (its answer may be lost): ask again
         * and send under the view we have. */
        ask_view(rq);
        if (try_send(rq, v, i, CPS_RQ_WHY_TIMEOUT) != 0)
            e->sent_ms = now;
    }
}

void cps__reqs_detach(cps__reqs *rq, uint32_t index, void *ctx, uint32_t part)
{
    if (index >= rq->nreqs || !rq->reqs[index].detached || rq->reqs[index].ctx)
        return;
    if (ctx) {
        rq->reqs[index].ctx = ctx;
        rq->reqs[index].part = part;
    } else
        rq->reqs[index].dropped = 1;
}

uint64_t cps__reqs_oldest_to(const cps__reqs *rq, uint32_t node)
{
    uint64_t oldest = 0;
    for (size_t i = 0; rq && i < rq->nreqs; i++) {
        const entry *e = &rq->reqs[i];
        if (e->to == node && e->to_since && !e->held && !e->queued &&
            (!oldest || e->to_since < oldest))
            oldest = e->to_since;
    }
    return oldest;
}

uint32_t cps__reqs_count(const cps__reqs *rq)
{
    return rq ? (uint32_t)rq->nreqs : 0;
}

uint32_t cps__reqs_detached(const cps__reqs *rq)
{
    return rq ? (uint32_t)rq->ndetached : 0;
}

size_t cps__reqs_actions(const cps__reqs *rq, const cps__reqs_action **out)
{
    *out = rq->acts;
    return rq->nacts;
}
