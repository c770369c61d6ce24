/* sim_restore's restore tool: src/checkpoint/cluster.c's restore loop over the simulated network
 * (restore.c), every decision about a range the restore book's (recovery/restore_route.h). */
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

/* The first received message `match` takes, by `deadline` (cluster.c's take). */
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

/* link_refresh_view: the scheduler's current view. */
static int refresh_view(world *w)
{
    cps__msg_hdr g = {.type = CPS_MSG_GET_VIEW, .sender = UINT32_MAX};
    net_send(w, TOOL, 0, &g, NULL, 0, 1);
    msg *m;
    int rc = take(w, match_view, NULL, w->now + VIEW_WAIT_MS, &m);
    if (rc != 0)
        return rc;
    if (m->h.aux > w->tview->epoch)
        w->tview = &w->views[m->h.aux];
    msg_free(m);
    return 0;
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

/* restore_look */
static int look(world *w, int force)
{
    int gone = chain_gone(w);
    if (!force && !gone && w->now < w->next_look)
        return 0;
    w->next_look = w->now + (gone ? LOOK_MS : REFRESH_MS);
    uint64_t epoch = w->tview->epoch;
    int rc = refresh_view(w);
    if (rc == CPS_ETIMEDOUT)
        return 0;
    if (rc != 0 || w->tview->epoch == epoch)
        return rc;
    uint32_t stopped = 0, bad = 0;
    rc = cps__rr_look(&w->book, w->tview, &stopped, &bad);
    if (rc == CPS_EUNAVAILABLE) {
        w->no_replica = 1;
        w->bad = bad;
        w->failed_by = WHY_NO_REPLICA;
        trace(w, "tool: range %u has no live replica in view %" PRIu64, bad, w->tview->epoch);
    } else if (stopped) {
        trace(w, "tool: view %" PRIu64 ": %u range(s) go again", w->tview->epoch, stopped);
    }
    return rc;
}

static int overdue(world *w, uint32_t *stopped)
{
    uint32_t range = 0;
    int rc = cps__rr_overdue(&w->book, w->now, PUT_SILENT_MS, TIMEOUT_MS, stopped, &range);
    if (rc != 0) {
        w->failed_by = WHY_SILENT;
        trace(w, "tool: range %u's head silent for the whole timeout", range);
    }
    if (*stopped) {
        w->next_look = 0;
        trace(w, "tool: %u silent head(s): again", *stopped);
    }
    return rc;
}

static int match_put(const world *w, const msg *m, const void *arg)
{
    (void)arg;
    return (m->h.flags & CPS_WF_REPLY) &&
           (m->h.type == CPS_MSG_PUT ||
            (m->h.type == CPS_MSG_ERROR && m->h.req_seq >= w->book.seq0));
}

/* The answer the book took must be to the oldest unanswered PUT of this pass to that range, at
 * the node that answered. */
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

/* put_wait_one */
static int wait_one(world *w)
{
    uint64_t epoch = w->tview->epoch;
    int rc = look(w, 0);
    if (rc != 0 || w->tview->epoch != epoch)
        return rc;
    uint64_t deadline = w->now + TIMEOUT_MS;
    msg *m = NULL;
    for (;;) {
        uint64_t until = w->now + LOOK_MS;
        rc = take(w, match_put, NULL, until < deadline ? until : deadline, &m);
        if (rc != CPS_ETIMEDOUT)
            break;
        if (w->v.failed)
            return rc;
        if (w->now >= deadline) {
            w->failed_by = WHY_DEADLINE;
            return rc;
        }
        if ((rc = look(w, 0)) != 0 || w->tview->epoch != epoch)
            return rc;
        uint32_t stopped;
        if ((rc = overdue(w, &stopped)) != 0 || stopped)
            return rc; /* what it waited for will not come */
    }
    uint32_t r = m->h.range;
    int err = m->h.type == CPS_MSG_ERROR;
    cps__rr_answer a = {m->h.sender, err, m->h.status, err ? m->h.req_seq : m->h.aux};
    uint32_t lost = 0;
    switch (cps__rr_take(&w->book, r, &a, err ? 0 : m->h.req_seq, w->now, &lost)) {
    case CPS_RR_TAKEN:
        check_taken(w, r, &a);
        break;
    case CPS_RR_AGAIN:
        trace(w, "tool: range %u again (node %u: %s, %u dropped)", r, a.sender,
              err ? cps_err_name(a.status) : "a later PUT answered", lost);
        w->next_look = 0;
        break;
    case CPS_RR_FATAL:
        w->failed_by = WHY_FATAL;
        rc = a.status ? a.status : CPS_EPROTO;
        trace(w, "tool: range %u refused: %s", r, cps_err_name(rc));
        break;
    default:
        break;
    }
    msg_free(m);
    if (rc == 0) {
        uint32_t stopped;
        rc = overdue(w, &stopped);
    }
    return rc;
}

/* put_flush */
static int flush(world *w, uint32_t r)
{
    while (cps__rr_open(&w->book, r) && w->buffered[r] && cps__rr_full(&w->book, r)) {
        int rc = wait_one(w);
        if (rc != 0)
            return rc;
    }
    uint32_t n = w->buffered[r];
    w->buffered[r] = 0;
    if (!cps__rr_open(&w->book, r) || !n)
        return 0;
    const cps__range *g = &w->tview->ranges[r];
    uint32_t to = cps__rr_target(&w->book, r, g->chain_len ? g->chain[0] : CPS_RR_NONE);
    if (to == CPS_RR_NONE)
        return CPS_EUNAVAILABLE; /* the look that saw the empty chain failed already */
    cps__msg_hdr h = {.type = CPS_MSG_PUT,
                      .sender = UINT32_MAX,
                      .range = r,
                      .epoch = w->tview->epoch,
                      .req_seq = ++w->next_req};
    h.aux = h.req_seq;
    net_send(w, TOOL, to, &h, w->buf[r], n * 16, 1);
    if (w->nsent < MAX_SENT)
        w->sent[w->nsent++] = (sent_put){h.req_seq, r, w->pass, to, 0};
    w->puts_sent++;
    for (uint32_t i = 0; i < w->nfaults; i++)
        if (w->ftrigger[i] == w->puts_sent)
            ev_push(w, w->now + rnd(w, 20), EV_FAULT, 0, i, NULL);
    int rc = cps__rr_sent(&w->book, r, h.req_seq, w->now);
    tool_sleep(w, w->now + 1 + rnd(w, w->put_ms));
    return rc;
}

static int put_record(world *w, uint32_t r, int kind, uint32_t key, uint64_t val)
{
    if (w->buffered[r] >= w->per_put) {
        int rc = flush(w, r);
        if (rc != 0)
            return rc;
    }
    uint64_t *p = w->buf[r] + 2 * w->buffered[r]++;
    p[0] = ((uint64_t)kind << 56) | key;
    p[1] = val;
    return 0;
}

static int match_probe(const world *w, const msg *m, const void *arg)
{
    (void)w;
    const uint32_t *r = arg;
    return (m->h.flags & CPS_WF_REPLY) && m->h.range == *r &&
           (m->h.type == CPS_MSG_CUT_PROBE || (m->h.type == CPS_MSG_ERROR && m->h.req_seq == 0));
}

/* wait_tails */
static int wait_tails(world *w)
{
    uint64_t deadline = w->now + TIMEOUT_MS;
    for (uint32_t r = 0; r < w->nranges; r++) {
        while (cps__rr_open(&w->book, r)) {
            const cps__range *g = &w->tview->ranges[r];
            cps__msg_hdr h = {.type = CPS_MSG_CUT_PROBE, .sender = UINT32_MAX, .range = r};
            if (g->chain_len)
                net_send(w, TOOL, g->chain[g->chain_len - 1], &h, NULL, 0, 1);
            msg *m;
            uint64_t until = w->now + 1000;
            int rc = take(w, match_probe, &r, until < deadline ? until : deadline, &m);
            if (rc == 0) {
                int ok =
                    m->h.type == CPS_MSG_CUT_PROBE && cps__rr_confirm(&w->book, r, m->h.req_seq);
                if (ok && !m->whole)
                    sim_fail(&w->v,
                             "range %u marked done on node %u's word (seq %" PRIu64
                             "), which does not hold it whole",
                             r, m->h.sender, m->h.req_seq);
                if (ok)
                    trace(w, "tool: range %u confirmed by node %u", r, m->h.sender);
                msg_free(m);
                if (ok)
                    break;
            }
            if (w->v.failed)
                return CPS_ETIMEDOUT;
            if (w->now >= deadline) {
                w->failed_by = WHY_DEADLINE;
                return CPS_ETIMEDOUT;
            }
            if ((rc = look(w, 0)) != 0)
                return rc;
            tool_wait(w, w->now + 20);
        }
    }
    return 0;
}

/* restore_pass: creates first, then values, the ranges interleaved as a tensor's pieces are. */
static int restore_pass(world *w)
{
    int rc = 0;
    for (int kind = REC_CREATE; rc == 0 && kind <= REC_SLICE; kind++)
        for (uint32_t k = 0; rc == 0 && k < MAX_KEYS; k++)
            for (uint32_t r = 0; rc == 0 && r < w->nranges; r++)
                if (k < w->nkeys[r] && cps__rr_open(&w->book, r))
                    rc = put_record(w, r, kind, k,
                                    kind == REC_CREATE ? w->version[r][k] : w->value[r][k]);
    for (uint32_t r = 0; rc == 0 && r < w->nranges; r++)
        rc = flush(w, r);
    for (uint32_t r = 0; rc == 0 && r < w->nranges; r++)
        while (rc == 0 && cps__rr_open(&w->book, r) && w->book.g[r].inflight)
            rc = wait_one(w);
    if (rc == 0)
        rc = wait_tails(w);
    return rc;
}

static int restore(world *w)
{
    w->tview = &w->views[w->epoch];
    w->next_look = w->now + REFRESH_MS;
    int rc = cps__rr_book_init(&w->book, w->nranges);
    for (uint32_t pass = 0; rc == 0; pass++) {
        tool_sleep(w, cps__rr_pass_due(&w->book, PASS_GAP_MS));
        if (pass > 0 && (rc = look(w, 1)) != 0)
            break;
        w->resent += cps__rr_pass_begin(&w->book, w->next_req + 1, w->now);
        w->pass = pass + 1;
        memset(w->buffered, 0, sizeof w->buffered);
        rc = restore_pass(w);
        uint32_t again = cps__rr_stopped(&w->book);
        if (rc != 0 || again == 0)
            break;
        if (pass + 1 >= RESTORE_PASSES) {
            w->failed_by = WHY_PASSES;
            rc = CPS_EUNAVAILABLE;
            break;
        }
        trace(w, "tool: streaming %u range(s) again under view %" PRIu64, again, w->tview->epoch);
    }
    cps__rr_book_fini(&w->book);
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
