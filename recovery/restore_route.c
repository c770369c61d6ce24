/* Where a checkpoint restore sends each range's records across view changes (restore_route.h). */
#include "recovery/restore_route.h"

#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "recovery/view_change.h"

int cps__restore_route(const cps__view *v, uint32_t nranges, const uint32_t *sent_head,
                       const unsigned char *done, unsigned char *resend, uint32_t *bad)
{
    if (!v || !sent_head || !resend || !bad || v->nranges != nranges || (nranges && !v->ranges))
        return CPS_EINVAL;
    /* Every range is judged before the verdict: a caller that fails still sees them all. */
    int rc = 0;
    for (uint32_t r = 0; r < nranges; r++) {
        const cps__range *g = &v->ranges[r];
        if (done && done[r]) { /* confirmed by its tail: the view no longer matters to it */
            resend[r] = CPS_RR_KEEP;
            continue;
        }
        if (g->chain_len == 0) {
            resend[r] = CPS_RR_KEEP;
            if (rc == 0)
                *bad = r;
            rc = CPS_EUNAVAILABLE;
            continue;
        }
        /* A dead last replica the coordinator keeps (recovery/view_change.h) may restart on its
         * data: the range waits for it rather than fail. */
        if (!cps__view_range_available(v, r))
            resend[r] = CPS_RR_DOWN;
        else
            resend[r] = sent_head[r] != CPS_RR_NONE && sent_head[r] != g->chain[0] ? CPS_RR_RESTART
                                                                                   : CPS_RR_KEEP;
    }
    return rc;
}

int cps__restore_answer(const cps__rr_answer *a, uint32_t head, uint64_t seq0, uint64_t oldest,
                        uint32_t inflight)
{
    if (!a || !inflight || a->sender != head || a->put_seq < seq0 || a->put_seq < oldest)
        return CPS_RR_IGNORE;
    if (a->put_seq > oldest)
        return CPS_RR_AGAIN;
    if (!a->error)
        return CPS_RR_TAKEN;
    if (a->status == CPS_ESTALE_EPOCH || a->status == CPS_EAGAIN)
        return CPS_RR_AGAIN;
    return CPS_RR_FATAL;
}

int cps__restore_silence(uint64_t now, uint64_t heard_ms, uint64_t quiet_since, uint32_t inflight,
                         uint64_t silent_ms, uint64_t timeout_ms)
{
    if (!inflight)
        return CPS_RR_WAIT;
    if (now >= quiet_since + timeout_ms)
        return CPS_RR_TIMEOUT;
    if (silent_ms < timeout_ms && now >= heard_ms + silent_ms)
        return CPS_RR_RESEND;
    return CPS_RR_WAIT;
}

/* ---- the book ---- */

int cps__rr_book_init(cps__rr_book *b, uint32_t nranges)
{
    if (!b)
        return CPS_EINVAL;
    memset(b, 0, sizeof *b);
    size_t n = nranges ? nranges : 1;
    b->g = calloc(n, sizeof *b->g);
    b->resend = calloc(n, 1);
    b->heads = calloc(n, sizeof *b->heads);
    b->done = calloc(n, 1);
    if (!b->g || !b->resend || !b->heads || !b->done)
        return CPS_ENOMEM;
    b->nranges = nranges;
    for (uint32_t r = 0; r < nranges; r++)
        b->g[r].head = b->g[r].quiet_head = CPS_RR_NONE;
    return 0;
}

void cps__rr_book_fini(cps__rr_book *b)
{
    if (!b)
        return;
    free(b->g);
    free(b->resend);
    free(b->heads);
    free(b->done);
    memset(b, 0, sizeof *b);
}

uint32_t cps__rr_stopped(const cps__rr_book *b)
{
    uint32_t n = 0;
    for (uint32_t r = 0; r < b->nranges; r++)
        n += b->g[r].again;
    return n;
}

uint64_t cps__rr_pass_due(const cps__rr_book *b, uint64_t gap_ms)
{
    return b->pass ? b->begun_ms + gap_ms : 0;
}

uint32_t cps__rr_pass_begin(cps__rr_book *b, uint64_t seq0, uint64_t now)
{
    uint32_t again = b->pass ? cps__rr_stopped(b) : 0;
    for (uint32_t r = 0; again && r < b->nranges; r++) {
        cps__rr_range *g = &b->g[r];
        /* Only a tail's confirmation (cps__rr_confirm) marks a range done: a range neither
         * stopped nor confirmed stays open (none is, when the caller confirmed every open one). */
        g->again = 0;
        g->head = CPS_RR_NONE;
        g->acked_seq = 0;
        g->inflight = g->fly0 = 0;
    }
    b->seq0 = seq0;
    b->begun_ms = now;
    b->pass++;
    return again;
}

int cps__rr_open(const cps__rr_book *b, uint32_t r)
{
    return r < b->nranges && !b->g[r].skip && !b->g[r].again;
}

/* Range r's stream stops here and starts again in the next pass (at the view's head then). */
static void stop(cps__rr_range *g)
{
    g->again = 1;
    g->inflight = 0;
    g->fly0 = 0;
}

int cps__rr_hold(cps__rr_book *b, uint32_t r)
{
    if (!cps__rr_open(b, r))
        return 0;
    stop(&b->g[r]);
    return 1;
}

uint32_t cps__rr_target(cps__rr_book *b, uint32_t r, uint32_t view_head)
{
    if (!cps__rr_open(b, r))
        return CPS_RR_NONE;
    if (b->g[r].head == CPS_RR_NONE)
        b->g[r].head = view_head;
    return b->g[r].head;
}

int cps__rr_full(const cps__rr_book *b, uint32_t r)
{
    return r < b->nranges && b->g[r].inflight >= CPS_RR_WINDOW;
}

int cps__rr_sent(cps__rr_book *b, uint32_t r, uint64_t req_seq, uint64_t now)
{
    if (!cps__rr_open(b, r) || cps__rr_full(b, r) || b->g[r].head == CPS_RR_NONE)
        return CPS_EINVAL;
    cps__rr_range *g = &b->g[r];
    if (g->inflight == 0)
        g->heard_ms = now;
    if (g->quiet_head != g->head) { /* a new head: its silence counts from its first PUT */
        g->quiet_head = g->head;
        g->quiet_since = now;
    }
    g->fly[(g->fly0 + g->inflight++) % CPS_RR_WINDOW] = req_seq;
    return 0;
}

int cps__rr_take(cps__rr_book *b, uint32_t r, const cps__rr_answer *a, uint64_t range_seq,
                 uint64_t now, uint32_t *lost)
{
    if (lost)
        *lost = 0;
    if (!cps__rr_open(b, r))
        return CPS_RR_IGNORE;
    cps__rr_range *g = &b->g[r];
    uint64_t oldest = g->fly[g->fly0];
    int v = cps__restore_answer(a, g->head, b->seq0, oldest, g->inflight);
    if (v == CPS_RR_TAKEN) {
        g->inflight--;
        g->fly0 = (g->fly0 + 1) % CPS_RR_WINDOW;
        g->heard_ms = g->quiet_since = now;
        if (range_seq > g->acked_seq)
            g->acked_seq = range_seq;
    } else if (v == CPS_RR_AGAIN) {
        uint32_t n = 0;
        while (a->put_seq > oldest && n < g->inflight &&
               g->fly[(g->fly0 + n) % CPS_RR_WINDOW] < a->put_seq)
            n++;
        if (lost)
            *lost = n;
        stop(g);
    }
    return v;
}

int cps__rr_look(cps__rr_book *b, const cps__view *v, uint32_t *stopped, uint32_t *bad)
{
    if (stopped)
        *stopped = 0;
    if (!v || !bad)
        return CPS_EINVAL;
    for (uint32_t r = 0; r < b->nranges; r++) {
        b->heads[r] = b->g[r].head;
        b->done[r] = b->g[r].skip;
    }
    int rc = cps__restore_route(v, b->nranges, b->heads, b->done, b->resend, bad);
    for (uint32_t r = 0; rc == 0 && r < b->nranges; r++)
        if (b->resend[r] != CPS_RR_KEEP && cps__rr_open(b, r)) {
            stop(&b->g[r]);
            if (stopped)
                (*stopped)++;
        }
    return rc;
}

int cps__rr_down(const cps__rr_book *b, const cps__view *v, uint32_t *range)
{
    for (uint32_t r = 0; r < b->nranges && r < v->nranges; r++)
        if (!b->g[r].skip && !cps__view_range_available(v, r)) {
            *range = r;
            return 1;
        }
    return 0;
}

int cps__rr_overdue(cps__rr_book *b, uint64_t now, uint64_t silent_ms, uint64_t timeout_ms,
                    uint32_t *stopped, uint32_t *range)
{
    *stopped = 0;
    for (uint32_t r = 0; r < b->nranges; r++) {
        cps__rr_range *g = &b->g[r];
        if (!cps__rr_open(b, r))
            continue;
        switch (cps__restore_silence(now, g->heard_ms, g->quiet_since, g->inflight, silent_ms,
                                     timeout_ms)) {
        case CPS_RR_RESEND:
            stop(g);
            (*stopped)++;
            break;
        case CPS_RR_TIMEOUT:
            *range = r;
            return CPS_ETIMEDOUT;
        default:
            break;
        }
    }
    return 0;
}

int cps__rr_confirm(cps__rr_book *b, uint32_t r, uint64_t tail_seq)
{
    if (!cps__rr_open(b, r) || b->g[r].inflight || tail_seq < b->g[r].acked_seq)
        return 0;
    b->g[r].skip = 1;
    return 1;
}
