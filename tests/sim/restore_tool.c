/* sim_restore's restore tool: a shell around the production restore machine (recovery/restore.h),
 * as src/checkpoint/cluster_restore.c is: it fills per-range PUTs with the checkpoint's records,
 * feeds what comes over the simulated network (restore.c) as events and performs the machine's
 * outputs. Every decision (passes, pacing, targets, answers, silences, looks, tails) is the
 * machine's. */
#include "restore.h"

/* ---- the tool: a coroutine that runs while the simulator waits ---- */

/* Hand the run to `who` (0: the simulator, 1: the tool) and wait until it hands it back. */
static void hand_to(world *w, int who)
{
    pthread_mutex_lock(&w->mu);
    w->turn = who;
    pthread_cond_broadcast(&w->cv);
    while (w->turn == who)
        pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
}

static void tool_yield(world *w)
{
    hand_to(w, 0);
}

void tool_resume(world *w)
{
    hand_to(w, 1);
}

/* Sleep until `until`, or until a message comes. */
static void tool_wait(world *w, uint64_t until)
{
    w->wake_at = until;
    ev_push(w, until, EV_TWAKE, TOOL, ++w->wake_gen, NULL);
    tool_yield(w);
}

/* Time passes for the tool alone (reading and encoding the checkpoint's next records). */
static void tool_sleep(world *w, uint64_t until)
{
    while (w->now < until && !w->v.failed)
        tool_wait(w, until);
}

typedef int (*match_fn)(const world *w, const msg *m, const void *arg);

/* The first received message `match` takes, by `deadline` (cluster_link.c's cps__cl_take). */
static int take(world *w, match_fn match, const void *arg, uint64_t deadline, msg **out)
{
    for (;;) {
        for (msg **pp = &w->inbox, *prev = NULL; *pp; prev = *pp, pp = &(*pp)->next)
            if (match(w, *pp, arg)) {
                msg *m = *pp;
                *pp = m->next;
                if (w->inbox_tail == m)
                    w->inbox_tail = prev;
                m->next = NULL;
                *out = m;
                return 0;
            }
        if (w->now >= deadline || w->v.failed)
            return CPS_ETIMEDOUT;
        tool_wait(w, deadline);
    }
}

static int match_view(const world *w, const msg *m, const void *arg)
{
    (void)w, (void)arg;
    return m->h.type == CPS_MSG_VIEW;
}

/* A server of the chains whose process is gone (its connection refuses). */
static int chain_gone(const world *w)
{
    const cps__view *v = w->tview;
    for (uint32_t r = 0; r < v->nranges; r++)
        for (uint32_t i = 0; i < v->ranges[r].chain_len; i++)
            if (w->srv[v->ranges[r].chain[i]].state == SRV_DEAD)
                return 1;
    return 0;
}

/* Every member of range r's chain in the tool's view is down now: killed or fenced, not
 * restarted on its store (one saying HELLO has restarted); *since: the last to go down, when. */
static int range_down(const world *w, uint32_t r, uint64_t *since)
{
    const cps__range *g = &w->tview->ranges[r];
    *since = 0;
    for (uint32_t i = 0; i < g->chain_len; i++) {
        const server *s = &w->srv[g->chain[i]];
        if (s->state != SRV_DEAD && s->state != SRV_FENCED)
            return 0;
        if (s->down_at > *since)
            *since = s->down_at;
    }
    return 1;
}

static cps__rs_event event_of(world *w, int kind)
{
    cps__rs_event e;
    memset(&e, 0, sizeof e);
    e.kind = kind;
    e.now = w->now;
    e.gone = chain_gone(w);
    return e;
}

/* GET_VIEW, as link_refresh_view: the view the scheduler answers with, or none in time. */
static cps__rs_event get_view(world *w)
{
    cps__msg_hdr g = {.type = CPS_MSG_GET_VIEW, .sender = UINT32_MAX};
    net_send(w, TOOL, 0, &g, NULL, 0, 1);
    msg *m;
    if (take(w, match_view, NULL, w->now + VIEW_WAIT_MS, &m) != 0)
        return event_of(w, CPS_RS_VIEW_NONE);
    if (m->h.aux > w->tview->epoch) {
        w->tview = &w->views[m->h.aux];
        trace(w, "tool: view %" PRIu64, w->tview->epoch);
    }
    msg_free(m);
    cps__rs_event e = event_of(w, CPS_RS_VIEW);
    e.view = w->tview;
    return e;
}

static void send_put(world *w, const cps__rs_out *o)
{
    uint32_t r = o->range;
    cps__msg_hdr h = {.type = CPS_MSG_PUT,
                      .sender = UINT32_MAX,
                      .range = r,
                      .epoch = o->epoch,
                      .req_seq = o->seq};
    h.aux = h.req_seq;
    net_send(w, TOOL, o->to, &h, w->buf[r], w->buffered[r] * 16, 1);
    w->buffered[r] = 0;
    if (w->nsent < MAX_SENT)
        w->sent[w->nsent++] = (sent_put){h.req_seq, r, w->pass, o->to, 0};
    w->puts_sent++;
    w->sent_now = 1;
    for (uint32_t i = 0; i < w->nfaults; i++)
        if (w->ftrigger[i] == w->puts_sent)
            ev_push(w, w->now + rnd(w, 20), EV_FAULT, 0, i, NULL);
}

/* Feed one event and perform the outputs; a GET_VIEW's answer is the next event. */
static void feed(world *w, cps__rs_event e)
{
    for (int more = 1; more && !w->v.failed;) {
        cps__rs_ready o;
        if (cps__rs_step(&w->m, &e, &o) != 0) {
            sim_fail(&w->v, "the restore machine refused event %d", e.kind);
            return;
        }
        more = 0;
        for (uint32_t i = 0; i < o.n; i++) {
            const cps__rs_out *x = &o.out[i];
            switch (x->kind) {
            case CPS_RS_PUT:
                send_put(w, x);
                break;
            case CPS_RS_DISCARD:
                w->buffered[x->range] = 0;
                break;
            case CPS_RS_GET_VIEW:
                e = get_view(w);
                more = 1;
                break;
            case CPS_RS_PROBE_TAIL: {
                cps__msg_hdr h = {
                    .type = CPS_MSG_CUT_PROBE, .sender = UINT32_MAX, .range = x->range};
                if (w->tview->ranges[x->range].chain_len)
                    net_send(w, TOOL, x->to, &h, NULL, 0, 1);
                break;
            }
            case CPS_RS_STREAM:
                w->stream = 1;
                break;
            case CPS_RS_DONE:
                w->rc = 0;
                break;
            case CPS_RS_FAILED:
                w->rc = x->rc;
                w->failed_by = x->why;
                w->bad = x->range;
                w->fail_epoch = w->tview->epoch;
                w->fail_at = w->now;
                w->bad_done = x->range < w->nranges && w->m.book.g[x->range].skip;
                if (x->range < w->nranges) {
                    w->bad_chain = w->tview->ranges[x->range].chain_len != 0;
                    w->bad_down = range_down(w, x->range, &w->bad_down_at);
                }
                trace(w, "tool: failed (%s, why %d, range %u)", cps_err_name(x->rc), x->why,
                      x->range);
                break;
            }
        }
    }
}

static int match_answer(const world *w, const msg *m, const void *arg)
{
    (void)arg;
    if (!(m->h.flags & CPS_WF_REPLY))
        return 0;
    if (m->h.type == CPS_MSG_PUT || m->h.type == CPS_MSG_CUT_PROBE)
        return 1;
    return m->h.type == CPS_MSG_ERROR && (m->h.req_seq == 0 || m->h.req_seq >= w->m.book.seq0);
}

/* The answer the machine took must be to the oldest unanswered PUT of this pass to that range,
 * at the node that answered. */
static void check_taken(world *w, uint32_t r, const cps__rr_answer *a)
{
    sent_put *oldest = NULL, *it = NULL;
    for (uint32_t i = 0; i < w->nsent; i++) {
        sent_put *p = &w->sent[i];
        if (p->range == r && p->pass == w->pass && !p->answered && !oldest)
            oldest = p;
        if (p->req_seq == a->put_seq)
            it = p;
    }
    if (!it || it->pass != w->pass || it->range != r || it != oldest || it->to != a->sender) {
        sim_fail(&w->v,
                 "an answer counted that is not this pass's oldest PUT of range %u: req %" PRIu64
                 " (pass %u, range %u) in pass %u",
                 r, a->put_seq, it ? it->pass : 0, it ? it->range : 0, w->pass);
        return;
    }
    it->answered = 1;
}

/* Wait for the machine's deadline or a message, and feed what came. */
static void wait_event(world *w)
{
    msg *m;
    if (take(w, match_answer, NULL, cps__rs_deadline(&w->m), &m) != 0) {
        if (!w->v.failed)
            feed(w, event_of(w, CPS_RS_TICK));
        return;
    }
    uint32_t r = m->h.range;
    const cps__rr_book *b = &w->m.book;
    if (m->h.type == CPS_MSG_CUT_PROBE || (m->h.type == CPS_MSG_ERROR && m->h.req_seq == 0)) {
        cps__rs_event e = event_of(w, CPS_RS_PROBE);
        e.range = r;
        e.from = m->h.sender;
        e.ok = m->h.type == CPS_MSG_CUT_PROBE;
        e.seq = m->h.req_seq;
        e.epoch = m->h.epoch;
        int was = r < w->nranges && cps__rr_open(b, r);
        feed(w, e);
        if (was && b->g[r].skip) {
            if (!m->whole)
                sim_fail(&w->v,
                         "range %u marked done on node %u's word (seq %" PRIu64
                         "), which does not hold it whole",
                         r, m->h.sender, m->h.req_seq);
            trace(w, "tool: range %u confirmed by node %u", r, m->h.sender);
        }
    } else {
        int err = m->h.type == CPS_MSG_ERROR;
        cps__rs_event e = event_of(w, CPS_RS_ANSWER);
        e.range = r;
        e.ans = (cps__rr_answer){m->h.sender, err, m->h.status, err ? m->h.req_seq : m->h.aux};
        e.seq = err ? 0 : m->h.req_seq;
        /* The check of what is counted: the same verdict the machine's book reaches. */
        int taken = r < w->nranges && cps__rr_open(b, r) &&
                    cps__restore_answer(&e.ans, b->g[r].head, b->seq0, b->g[r].fly[b->g[r].fly0],
                                        b->g[r].inflight) == CPS_RR_TAKEN;
        if (taken)
            check_taken(w, r, &e.ans);
        feed(w, e);
    }
    msg_free(m);
}

/* Range r's PUT is full (or the pass's records end): hand it to the machine. */
static void flush(world *w, uint32_t r)
{
    if (!w->buffered[r])
        return;
    cps__rs_event e = event_of(w, CPS_RS_READY);
    e.range = r;
    e.seq = ++w->next_req;
    w->sent_now = 0;
    feed(w, e);
    while (cps__rs_held(&w->m) && !w->v.failed)
        wait_event(w);
    if (w->sent_now) /* reading and encoding the next records */
        tool_sleep(w, w->now + 1 + rnd(w, w->put_ms));
}

static void put_record(world *w, uint32_t r, int kind, uint32_t key, uint64_t val)
{
    if (w->buffered[r] >= w->per_put)
        flush(w, r);
    uint64_t *p = w->buf[r] + 2 * w->buffered[r]++;
    p[0] = ((uint64_t)kind << 56) | key;
    p[1] = val;
}

/* One pass's records: creates first, then values, the ranges interleaved as a tensor's pieces
 * are; only the ranges the machine streams. */
static void stream_pass(world *w)
{
    memset(w->buffered, 0, sizeof w->buffered);
    for (int kind = REC_CREATE; kind <= REC_SLICE; kind++)
        for (uint32_t k = 0; k < MAX_KEYS; k++)
            for (uint32_t r = 0; r < w->nranges; r++)
                if (k < w->nkeys[r] && cps__rs_open(&w->m, r) && !w->v.failed)
                    put_record(w, r, kind, k,
                               kind == REC_CREATE ? w->version[r][k] : w->value[r][k]);
    for (uint32_t r = 0; r < w->nranges && !cps__rs_ended(&w->m) && !w->v.failed; r++)
        flush(w, r);
    if (!cps__rs_ended(&w->m) && !w->v.failed)
        feed(w, event_of(w, CPS_RS_STREAMED));
}

static int restore(world *w)
{
    w->tview = &w->views[w->epoch];
    cps__rs_cfg cfg; /* production's timers and limits, in simulated ms */
    cps__rs_cfg_defaults(&cfg, TIMEOUT_MS);
    int rc = cps__rs_init(&w->m, &cfg, w->tview, w->nranges, w->now);
    if (rc == 0)
        feed(w, event_of(w, CPS_RS_TICK));
    while (rc == 0 && !cps__rs_ended(&w->m) && !w->v.failed) {
        if (w->stream) {
            w->stream = 0;
            w->pass++;
            stream_pass(w);
        } else {
            wait_event(w);
        }
    }
    if (rc == 0)
        rc = cps__rs_ended(&w->m) ? w->m.rc : CPS_ETIMEDOUT;
    w->resent = w->m.resent;
    cps__rs_fini(&w->m);
    return rc;
}

void *tool_main(void *arg)
{
    world *w = arg;
    pthread_mutex_lock(&w->mu);
    while (w->turn != 1)
        pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    w->rc = restore(w);
    pthread_mutex_lock(&w->mu);
    w->done = 1;
    w->turn = 0;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return NULL;
}
