/* Export: opening a cut on every range, probing and aiming a sync job's step, closing it
 * (cluster_int.h). */
#include "checkpoint/cluster_int.h"

static int match_open(const cps__rx *rx, const void *arg)
{
    const cut *c = arg;
    return (rx->hdr.flags & CPS_WF_REPLY) && rx->hdr.aux == c->id &&
           (rx->hdr.type == CPS_MSG_CUT_OPEN || rx->hdr.type == CPS_MSG_ERROR);
}

int cps__cl_is_probe_reply(const cps__rx *rx)
{
    return (rx->hdr.flags & CPS_WF_REPLY) &&
           (rx->hdr.type == CPS_MSG_CUT_PROBE || rx->hdr.type == CPS_MSG_ERROR);
}

/* A probe of the export's round *arg. */
static int match_probe(const cps__rx *rx, const void *arg)
{
    const uint32_t *round = arg;
    return cps__cl_is_probe_reply(rx) && rx->hdr.req_worker == *round;
}

static uint32_t tail_of(const link *l, uint32_t r)
{
    const cps__range *g = &l->view.ranges[r];
    return g->chain_len ? g->chain[g->chain_len - 1] : 0;
}

/* The view again, and what it changes for the cut (a replica gone, one to ask). CPS_ETIMEDOUT:
 * the scheduler did not answer (it may be restarting): the caller looks again later. */
int cps__cl_route_look(link *l, cut *c)
{
    int rc = cps__cl_link_refresh_view(l);
    if (rc != 0 || !c || !c->route)
        return rc;
    const cps__cr_action *a;
    int n = cps__cutroute_view(c->route, &l->view, &a);
    return cps__cl_route_do(l, c, a, n);
}

/* 1 if a server of the chains of the view looks gone (its connection refuses): the view will
 * change, so look at it again soon. */
int cps__cl_chain_gone(link *l)
{
    for (uint32_t r = 0; r < l->view.nranges; r++)
        for (uint32_t k = 0; k < l->view.ranges[r].chain_len; k++)
            if (cps__tp_peer_gone(l->tp, l->view.ranges[r].chain[k]))
                return 1;
    return 0;
}

static void send_close(link *l, cut *c, uint32_t peer, uint32_t r, const char *url)
{
    if (url) {
        peer = CLOSE_PEER + l->closes++;
        if (cps__tp_peer_set(l->tp, peer, url) != 0)
            return; /* the view closes itself when idle (CUT_IDLE_MS) */
    }
    cps__msg_hdr h = {.type = CPS_MSG_CUT_CLOSE, .sender = UINT32_MAX, .range = r, .aux = c->id};
    cps__msg_send(l->tp, peer, &h, NULL, 0);
}

/* Answers of range r's reader `node` still queued: they answered reads that go to the next reader
 * again (each read goes to one reader at a time). */
static void purge(link *l, uint32_t r, uint32_t node)
{
    size_t k = 0;
    for (size_t i = 0; i < l->nin; i++) {
        const cps__msg_hdr *h = &l->in[i].hdr;
        if ((h->flags & CPS_WF_REPLY) && h->range == r && h->sender == node &&
            (h->type == CPS_MSG_CUT_READ || h->type == CPS_MSG_ERROR))
            cps__rx_free(&l->in[i]);
        else
            l->in[k++] = l->in[i];
    }
    l->nin = k;
}

/* Perform what recovery/cutroute decided (n actions, or an error if n < 0). Returns c->lost once a
 * range's cut cannot be had. */
int cps__cl_route_do(link *l, cut *c, const cps__cr_action *a, int n)
{
    if (n < 0)
        return n;
    for (int i = 0; i < n; i++) {
        uint32_t r = a[i].range, node = a[i].node;
        if (a[i].kind == CPS_CR_ASK) {
            cps__msg_hdr h = {.type = CPS_MSG_CUT_OPEN,
                              .sender = UINT32_MAX,
                              .range = r,
                              .step = c->step,
                              .aux = c->id,
                              .req_seq = ++l->next_req};
            cps__msg_send(l->tp, node, &h, l->hello, l->hello_len);
        } else if (a[i].kind == CPS_CR_READ_FROM) {
            const char *url = cps__cutroute_url(c->route, r, node);
            int rc = url ? cps__tp_peer_set(l->tp, CUT_PEER_BASE + r, url) : CPS_EPROTO;
            if (rc != 0) {
                cps__log(CPS_LOG_ERROR, SUB, "range %u: cannot reach node %u's read view: %s", r,
                         node, cps_strerror(rc));
                return rc;
            }
            if (c->gen[r])
                cps__log(CPS_LOG_INFO, SUB,
                         "range %u: reading the cut from node %u's read view now (sequence "
                         "number %" PRIu64 ")",
                         r, node, cps__cutroute_seq(c->route, r));
            purge(l, r, c->node[r]);
            c->node[r] = node;
            c->open[r] = 1;
            c->gen[r]++;
            c->seq[r] = cps__cutroute_seq(c->route, r);
        } else if (a[i].kind == CPS_CR_LOST) {
            c->lost = a[i].err;
            c->lost_range = r;
            c->lost_step = a[i].step;
            if (a[i].err == CPS_EUNAVAILABLE)
                cps__log(CPS_LOG_ERROR, SUB,
                         "range %u has no live replica in view epoch %" PRIu64
                         ": its keys cannot be exported",
                         r, l->view.epoch);
            else if (a[i].err == CPS_EAGAIN)
                cps__log(CPS_LOG_WARN, SUB,
                         "range %u: every replica that held its read view at the cut is gone", r);
            return c->lost;
        }
    }
    return 0;
}

static void close_one(void *ctx, uint32_t r, uint32_t node)
{
    void **z = ctx;
    link *l = z[0];
    cut *c = z[1];
    if (c->open[r] && c->node[r] == node)
        send_close(l, c, CUT_PEER_BASE + r, r, NULL);
    else if (cps__view_node(&l->view, node) && !cps__tp_peer_gone(l->tp, node))
        /* A server gone from the view, or whose connection refuses, took its views along. */
        send_close(l, c, 0, r, cps__cutroute_url(c->route, r, node));
}

/* Close every read view of the cut (the readers' and the others'). */
void cps__cl_close_cut(link *l, cut *c)
{
    void *z[2] = {l, c};
    if (c->route)
        cps__cutroute_each_open(c->route, close_one, z);
    cps__cutroute_destroy(c->route);
    c->route = NULL;
    memset(c->open, 0, c->nranges * sizeof *c->open);
}

/* The highest step any range reports (sync jobs: the cut goes there or later). A range's tail that
 * dies before answering is asked again at the next tail, as soon as the view names it. */
static int probe_steps(link *l, uint64_t *hi_out)
{
    uint32_t n = l->view.nranges, got = 0, round = (uint32_t)++l->next_req;
    uint32_t *asked = calloc(n ? n : 1, sizeof *asked); /* the node, 0: to ask; UINT32_MAX: done */
    if (!asked)
        return CPS_ENOMEM;
    uint64_t hi = 0, now = cps__now_ms(), deadline = now + (uint64_t)l->timeout_ms,
             look = now + LOOK_MS;
    int rc = 0;
    while (got < n) {
        for (uint32_t r = 0; rc == 0 && r < n; r++) {
            if (asked[r] == UINT32_MAX || (asked[r] && asked[r] == tail_of(l, r)))
                continue;
            if (!tail_of(l, r)) {
                cps__log(CPS_LOG_ERROR, SUB, "range %u has no live replica in view epoch %" PRIu64,
                         r, l->view.epoch);
                rc = CPS_EUNAVAILABLE;
                break;
            }
            asked[r] = tail_of(l, r);
            cps__msg_hdr h = {
                .type = CPS_MSG_CUT_PROBE, .sender = UINT32_MAX, .range = r, .req_worker = round};
            cps__msg_send(l->tp, asked[r], &h, l->hello, l->hello_len);
        }
        if (rc != 0)
            break;
        now = cps__now_ms();
        if (now >= deadline) {
            cps__log(CPS_LOG_ERROR, SUB, "%u of %u ranges did not say where they are", n - got, n);
            rc = CPS_ETIMEDOUT;
            break;
        }
        cps__rx rx;
        rc = cps__cl_take(l, match_probe, &round,
                          now + GONE_MS < deadline ? now + GONE_MS : deadline, &rx);
        if (rc == CPS_ETIMEDOUT) {
            rc = 0;
            int gone = cps__cl_chain_gone(l);
            if (gone || cps__now_ms() >= look) {
                int vrc = cps__cl_route_look(l, NULL);
                if (vrc != 0 && vrc != CPS_ETIMEDOUT) {
                    rc = vrc;
                    break;
                }
                look = cps__now_ms() + (gone ? GONE_MS : LOOK_MS);
            }
            continue;
        }
        if (rc != 0)
            break;
        uint32_t r = rx.hdr.range;
        int err = rx.hdr.type == CPS_MSG_ERROR ? (rx.hdr.status ? rx.hdr.status : CPS_EPROTO) : 0;
        uint64_t at = rx.hdr.aux;
        cps__rx_free(&rx);
        if (r >= n || asked[r] == UINT32_MAX)
            continue; /* a repeat */
        if (err == CPS_ESTALE_EPOCH) {
            asked[r] = 0; /* not there any more: the view, then its tail */
            if ((rc = cps__cl_route_look(l, NULL)) == CPS_ETIMEDOUT)
                rc = 0;
            continue;
        }
        if (err != 0) {
            cps__log(CPS_LOG_ERROR, SUB, "range %u's probe refused: %s", r, cps_strerror(err));
            rc = err;
            break;
        }
        hi = at > hi ? at : hi;
        asked[r] = UINT32_MAX;
        got++;
    }
    free(asked);
    if (rc == 0)
        *hi_out = hi;
    return rc;
}

static int probe_timed(link *l, uint64_t *hi, double *rtt_ms)
{
    uint64_t t0 = cps__now_us();
    int rc = probe_steps(l, hi);
    *rtt_ms = (cps__now_us() - t0) / 1000.0;
    return rc;
}

int cps__cl_aim_measure(link *l, aim *a)
{
    uint64_t hi0;
    double rtt0;
    uint64_t t0 = cps__now_us();
    int rc = probe_timed(l, &hi0, &rtt0);
    /* Wait without a sleep: answers to anything else keep arriving. */
    for (uint64_t until = cps__now_ms() + AIM_GAP_MS; rc == 0 && cps__now_ms() < until;)
        cps__tp_poll(l->tp, (int)(until - cps__now_ms()), cps__cl_on_msg, l, 0);
    uint64_t t1 = cps__now_us();
    if (rc == 0)
        rc = probe_timed(l, &a->hi, &a->rtt_ms);
    if (rc != 0)
        return rc;
    /* Between the midpoints of the two probes. */
    double secs = ((t1 - t0) + (a->rtt_ms - rtt0) * 500.0) / 1e6;
    a->rate = a->hi > hi0 && secs > 0 ? (double)(a->hi - hi0) / secs : 0;
    /* An open travels like a probe; four round trips of slack, for a loaded host. */
    a->lead_ms = 4 * a->rtt_ms > AIM_MIN_MS ? 4 * a->rtt_ms : AIM_MIN_MS;
    return 0;
}

/* The step to cut at: the furthest range's step plus the steps the job makes in lead_ms, and
 * `least` steps ahead at least. A slow job's furthest range may be at that step's boundary
 * right now (its push done, its workers pulling): a cut there opens at once, where one step
 * further would wait for the whole next step. */
uint64_t cps__cl_aim_step(const aim *a, uint64_t least)
{
    uint64_t ahead = (uint64_t)(a->rate * a->lead_ms / 1000.0);
    return a->hi + (ahead > least ? ahead : least);
}

/* One answer to the cut's CUT_OPENs (consumed): a replica's read view opened, or its refusal. */
static int on_open_answer(link *l, cut *c, cps__rx *rx, uint64_t *past)
{
    uint32_t r = rx->hdr.range, node = rx->hdr.sender;
    const cps__cr_action *a = NULL;
    int nact = 0;
    if (r >= c->nranges) {
        /* not ours */
    } else if (rx->hdr.type == CPS_MSG_ERROR) {
        int err = rx->hdr.status ? rx->hdr.status : CPS_EPROTO;
        if (err == CPS_EPAST && rx->hdr.step > *past)
            *past = rx->hdr.step;
        nact = cps__cutroute_refused(c->route, r, node, err, rx->hdr.step, &a);
    } else {
        const char *url = rx->payload;
        if (rx->len < 2 || url[rx->len - 1] != 0 || rx->len > CPS_ADDR_MAX) {
            cps__log(CPS_LOG_WARN, SUB, "range %u: malformed read view address from node %u", r,
                     node);
            nact = cps__cutroute_refused(c->route, r, node, CPS_EPROTO, 0, &a);
        } else {
            nact = cps__cutroute_opened(c->route, r, node, rx->hdr.req_seq, url, &a);
            if (!c->at_step[r])
                c->at_step[r] = rx->hdr.step;
            for (int i = 0; i < nact; i++)
                if (a[i].kind == CPS_CR_CLOSE)
                    send_close(l, c, 0, r, url);
        }
    }
    int rc = nact ? cps__cl_route_do(l, c, a, nact) : 0;
    cps__rx_free(rx);
    return rc;
}

/* Open a read view on every range `need` marks at step `step` (0: now): in sync jobs on every
 * replica, which recovery/cutroute.h explains, in the others on the tail. A replica may wait for
 * the step for a long time; meanwhile a server whose connection refuses makes the exporter look at
 * the view at once (every GONE_MS until the view drops it), and the view is looked at every
 * REFRESH_MS anyway: replicas that joined the chains are asked, those that left are forgotten. A
 * range is lost at once when no replica can give it (c->lost; the export cuts again or says
 * why). *past receives the highest step reported by a range that is already past `step`
 * (CPS_EPAST). */
int cps__cl_open_cut(link *l, cut *c, uint64_t step, const unsigned char *need, int sync,
                     uint64_t *past)
{
    uint32_t n = l->view.nranges;
    cps__cl_close_cut(l, c);
    /* Servers take a second CUT_OPEN of one id as a repeat and answer it no more: two exports
     * started in the same millisecond (the clock and next_req alone) had the same ids, and the
     * second waited out its timeout. Our inbox's address sets them apart. */
    c->id = cps__splitmix64(cps__now_us() ^ cps__hash64(l->hello, l->hello_len) ^ ++l->next_req);
    c->step = step;
    c->lost = 0;
    memset(c->at_step, 0, n * sizeof *c->at_step);
    *past = 0;
    int rc = cps__cutroute_create(n, need, sync, &c->route);
    const cps__cr_action *a;
    if (rc == 0) {
        int nact = cps__cutroute_view(c->route, &l->view, &a);
        rc = cps__cl_route_do(l, c, a, nact);
    }
    uint64_t now = cps__now_ms(), deadline = now + (uint64_t)l->timeout_ms;
    uint64_t look = now + REFRESH_MS;
    int silent = 0;
    while (rc == 0 && !cps__cutroute_ready(c->route)) {
        now = cps__now_ms();
        if (now >= deadline) {
            uint32_t left = 0;
            for (uint32_t r = 0; r < n; r++)
                left += need[r] && !c->open[r];
            cps__log(CPS_LOG_ERROR, SUB,
                     "%u of %u ranges did not open a read view at step %" PRIu64 " within %.0f s",
                     left, n, step, l->timeout_ms / 1000.0);
            rc = CPS_ETIMEDOUT;
            break;
        }
        cps__rx rx;
        rc = cps__cl_take(l, match_open, c, now + GONE_MS < deadline ? now + GONE_MS : deadline,
                          &rx);
        if (rc == CPS_ETIMEDOUT) {
            rc = 0;
            int gone = cps__cl_chain_gone(l);
            if (!gone && cps__now_ms() < look)
                continue;
            int vrc = cps__cl_route_look(l, c);
            /* A job that ended (or whose scheduler is gone) answers nothing more: say so after a
             * few silent asks instead of waiting out the whole timeout. A restarted scheduler
             * answers again within about a second. */
            silent = vrc == CPS_ETIMEDOUT ? silent + 1 : 0;
            if (silent >= SILENT_REFRESHES) {
                cps__log(CPS_LOG_ERROR, SUB,
                         "the scheduler has not answered for %d s while the cut at step %" PRIu64
                         " was not open: the job has ended or its scheduler is down",
                         SILENT_REFRESHES * 2, step);
                rc = CPS_ESHUTDOWN;
                break;
            }
            rc = vrc == CPS_ETIMEDOUT ? 0 : vrc;
            look = cps__now_ms() + (gone ? GONE_MS : REFRESH_MS);
            continue;
        }
        if (rc != 0)
            break;
        if (rx.hdr.type == CPS_MSG_ERROR && rx.hdr.status == CPS_ESTALE_EPOCH)
            look = 0; /* the chain moved: the view, then its replicas */
        rc = on_open_answer(l, c, &rx, past);
    }
    return rc;
}

/* Answers to the cut's opens that came after it was open (the other replicas'): a reader that
 * dies hands its range to one of them. */
int cps__cl_absorb_opens(link *l, cut *c)
{
    cps__rx rx;
    uint64_t past = 0;
    int rc = 0;
    while (rc == 0 && cps__cl_take(l, match_open, c, 0, &rx) == 0)
        rc = on_open_answer(l, c, &rx, &past);
    return rc;
}
