/* A checkpoint restore's loop as one pure state machine (restore.h). */
#include "recovery/restore.h"

#include <string.h>

#include "chainps/error.h"
#include "recovery/view_change.h"

static void emit(cps__rs_ready *o, int kind, uint32_t range, uint32_t to, uint64_t seq)
{
    /* A step emits at most 3 outputs; should one ever be dropped, the shells take the verdict
     * from m->rc, not from the outputs. */
    if (o->n < CPS_RS_OUT_MAX)
        o->out[o->n++] = (cps__rs_out){.kind = kind, .range = range, .to = to, .seq = seq};
}

static void fail(cps__restore *m, cps__rs_ready *o, int rc, int why, uint32_t range)
{
    m->phase = CPS_RS_END;
    m->rc = rc;
    m->why = why;
    m->bad = range;
    emit(o, CPS_RS_FAILED, range, 0, 0);
    o->out[o->n - 1].rc = rc;
    o->out[o->n - 1].why = why;
}

int cps__rs_init(cps__restore *m, const cps__rs_cfg *cfg, const cps__view *v, uint32_t nranges,
                 uint64_t now)
{
    if (!m)
        return CPS_EINVAL;
    memset(m, 0, sizeof *m);
    /* gap_max_ms 0 would make every gap 1 ms: a zeroed cfg, not a back-off. */
    if (!cfg || !v || v->nranges != nranges || cfg->gap_max_ms == 0)
        return CPS_EINVAL;
    int rc = cps__rr_book_init(&m->book, nranges);
    if (rc != 0)
        return rc;
    m->cfg = *cfg;
    m->v = v;
    m->epoch = v->epoch;
    m->now = now;
    m->next_look = now + cfg->refresh_ms;
    m->held = m->bad = CPS_RR_NONE;
    m->phase = CPS_RS_START;
    return 0;
}

void cps__rs_fini(cps__restore *m)
{
    if (m)
        cps__rr_book_fini(&m->book);
}

int cps__rs_open(const cps__restore *m, uint32_t r)
{
    return m->phase == CPS_RS_STREAMING && cps__rr_open(&m->book, r);
}

int cps__rs_held(const cps__restore *m)
{
    return m->held != CPS_RR_NONE && m->phase != CPS_RS_END;
}

int cps__rs_ended(const cps__restore *m)
{
    return m->phase == CPS_RS_END;
}

/* The view again every refresh_ms, and every look_ms while a chain member looks gone (its view
 * is about to change) or once an answer or a silence said the view may have moved (next_look 0). */
static int look_due(const cps__restore *m)
{
    return m->now >= m->next_look || (m->gone && m->now >= m->last_look + m->cfg.look_ms);
}

static void look(cps__restore *m, cps__rs_ready *o)
{
    m->looking = 1;
    m->last_look = m->now;
    m->next_look = m->now + (m->gone ? m->cfg.look_ms : m->cfg.refresh_ms);
    emit(o, CPS_RS_GET_VIEW, 0, 0, 0);
}

void cps__rs_cfg_defaults(cps__rs_cfg *cfg, uint64_t timeout_ms)
{
    *cfg = (cps__rs_cfg){.look_ms = 500,
                         .refresh_ms = 2000,
                         .silent_ms = 15000,
                         .timeout_ms = timeout_ms,
                         .gap_ms = 250,
                         .gap_max_ms = 2000,
                         .budget_ms = CPS_RS_BUDGET_MS,
                         .probe_ms = 1000,
                         .retry_ms = 20};
}

uint64_t cps__rs_gap(const cps__rs_cfg *cfg, uint32_t pass)
{
    uint64_t g = cfg->gap_ms ? cfg->gap_ms : 1;
    for (uint32_t k = 1; k < pass && g < cfg->gap_max_ms && g <= UINT64_MAX / 2; k++)
        g *= 2;
    return g < cfg->gap_max_ms ? g : cfg->gap_max_ms ? cfg->gap_max_ms : 1;
}

uint32_t cps__rs_pass_limit(const cps__rs_cfg *cfg)
{
    uint64_t left = cfg->budget_ms; /* what the gaps may still spend */
    uint32_t pass = 1;
    for (uint64_t g = cps__rs_gap(cfg, pass); g <= left; g = cps__rs_gap(cfg, pass)) {
        if (g == cps__rs_gap(cfg, pass + 1)) { /* the cap: the rest at once */
            uint64_t n = left / g;
            return n < UINT32_MAX - pass ? pass + (uint32_t)n : UINT32_MAX;
        }
        left -= g;
        pass++;
    }
    return pass;
}

/* Ranges not done whose chain has no live member in the view taken now: one that had one in the
 * last is a new stall, which the back-off waits out with its whole budget (end_pass). */
static void note_down(cps__restore *m)
{
    for (uint32_t r = 0; r < m->book.nranges; r++) {
        cps__rr_range *g = &m->book.g[r];
        unsigned char down = !g->skip && !cps__view_range_available(m->v, r);
        m->fresh += down && !g->down;
        g->down = down;
    }
}

static void begin_pass(cps__restore *m, cps__rs_ready *o)
{
    uint32_t again = cps__rr_pass_begin(&m->book, m->last_seq + 1, m->now);
    m->resent += again;
    m->run++;
    m->phase = CPS_RS_STREAMING;
    note_down(m);
    /* A chain of only dead members may come back (its server restarting on its data): the range
     * is not streamed now and waits for the back-off; an empty chain cannot come back. */
    for (uint32_t r = 0; r < m->book.nranges; r++) {
        if (!cps__rr_open(&m->book, r))
            continue;
        if (m->v->ranges[r].chain_len == 0) {
            fail(m, o, CPS_EUNAVAILABLE, CPS_RS_WHY_NO_REPLICA, r);
            return;
        }
        if (!cps__view_range_available(m->v, r))
            cps__rr_hold(&m->book, r);
    }
    emit(o, CPS_RS_STREAM, 0, 0, 0);
}

static void send_put(cps__restore *m, cps__rs_ready *o, uint32_t r, uint64_t seq)
{
    const cps__range *g = &m->v->ranges[r];
    uint32_t to = cps__rr_target(&m->book, r, g->chain_len ? g->chain[0] : CPS_RR_NONE);
    if (to == CPS_RR_NONE) {
        fail(m, o, CPS_EUNAVAILABLE, CPS_RS_WHY_NO_REPLICA, r);
        return;
    }
    cps__rr_sent(&m->book, r, seq, m->now);
    emit(o, CPS_RS_PUT, r, to, seq);
    o->out[o->n - 1].epoch = m->epoch;
}

static int drained(const cps__restore *m)
{
    for (uint32_t r = 0; r < m->book.nranges; r++)
        if (m->book.g[r].inflight)
            return 0;
    return 1;
}

static void end_pass(cps__restore *m, cps__rs_ready *o)
{
    uint32_t again = cps__rr_stopped(&m->book);
    if (again == 0) {
        m->phase = CPS_RS_END;
        emit(o, CPS_RS_DONE, 0, 0, 0);
        return;
    }
    /* A tail confirmed a range (the restore moved), or a range lost its last live replica (a new
     * stall): what stops the restore now is a new incident, which gets the whole budget (at most
     * once per range confirmed or per death: the restore still ends). */
    if ((m->confirmed || m->fresh) && m->run > 1) {
        m->run = 1;
        m->spent_ms = 0;
    }
    m->confirmed = m->fresh = 0;
    uint64_t gap = cps__rs_gap(&m->cfg, m->run);
    if (m->spent_ms + gap > m->cfg.budget_ms) { /* the next pass's gap would pass the budget */
        uint32_t r = CPS_RR_NONE;
        if (cps__rr_down(&m->book, m->v, &r))
            fail(m, o, CPS_EUNAVAILABLE, CPS_RS_WHY_NO_REPLICA, r);
        else
            fail(m, o, CPS_EUNAVAILABLE, CPS_RS_WHY_PASSES, CPS_RR_NONE);
        return;
    }
    m->spent_ms += gap;
    m->waited_ms += gap;
    m->gap = gap;
    m->phase = CPS_RS_PACING;
}

/* Waiting for the heads' answers (a READY held, or the pass's last PUTs out). */
static void wait_answers(cps__restore *m, cps__rs_ready *o)
{
    uint32_t stopped = 0, r = 0;
    /* A head silent too long has its range stopped: what the wait is for will not come. */
    if (cps__rr_overdue(&m->book, m->now, m->cfg.silent_ms, m->cfg.timeout_ms, &stopped, &r)) {
        fail(m, o, CPS_ETIMEDOUT, CPS_RS_WHY_SILENT, r);
        return;
    }
    if (stopped)
        m->next_look = 0;
    if (m->held != CPS_RR_NONE) {
        uint32_t h = m->held;
        if (!cps__rr_open(&m->book, h)) {
            m->held = CPS_RR_NONE;
            emit(o, CPS_RS_DISCARD, h, 0, 0);
        } else if (!cps__rr_full(&m->book, h)) {
            m->held = CPS_RR_NONE;
            send_put(m, o, h, m->held_seq);
        }
        if (m->held == CPS_RR_NONE)
            return;
    } else if (m->phase == CPS_RS_DRAINING && drained(m)) {
        m->phase = CPS_RS_TAILS;
        m->cursor = 0;
        m->probe_until = m->probe_again = 0;
        m->tails_deadline = m->now + m->cfg.timeout_ms;
        return;
    }
    if (m->now >= m->wait_deadline)
        fail(m, o, CPS_ETIMEDOUT, CPS_RS_WHY_DEADLINE, CPS_RR_NONE);
    else if (look_due(m))
        look(m, o);
}

/* Each open range's tail confirms, in range order, that it holds what its head took. */
static void tails(cps__restore *m, cps__rs_ready *o)
{
    while (m->cursor < m->book.nranges && !cps__rr_open(&m->book, m->cursor)) {
        m->cursor++;
        m->probe_until = m->probe_again = 0;
    }
    if (m->cursor >= m->book.nranges) {
        end_pass(m, o);
        return;
    }
    if (m->probe_until && m->now >= m->probe_until) { /* a miss */
        m->probe_until = 0;
        m->probe_again = m->now + m->cfg.retry_ms;
        if (m->now >= m->tails_deadline) {
            fail(m, o, CPS_ETIMEDOUT, CPS_RS_WHY_DEADLINE, m->cursor);
            return;
        }
        if (look_due(m)) {
            look(m, o);
            return;
        }
    }
    if (!m->probe_until && m->now >= m->probe_again) {
        const cps__range *g = &m->v->ranges[m->cursor];
        uint64_t until = m->now + m->cfg.probe_ms;
        m->probe_until = until < m->tails_deadline ? until : m->tails_deadline;
        if (m->probe_until <= m->now)
            m->probe_until = m->now + 1;
        m->probe_to = g->chain_len ? g->chain[g->chain_len - 1] : 0;
        emit(o, CPS_RS_PROBE_TAIL, m->cursor, m->probe_to, 0);
    }
}

/* What the machine does now, given its phase and time. */
static void advance(cps__restore *m, cps__rs_ready *o)
{
    for (int guard = 0; guard < 4 && !m->looking; guard++) {
        int phase = m->phase;
        switch (phase) {
        case CPS_RS_START:
            begin_pass(m, o);
            return;
        case CPS_RS_PACING:
            if (m->now >= cps__rr_pass_due(&m->book, m->gap)) {
                /* A pass after "not head", "busy" or a drop goes by the view as it is now. */
                m->look_pass = 1;
                look(m, o);
            }
            return;
        case CPS_RS_STREAMING:
        case CPS_RS_DRAINING:
            if (m->held == CPS_RR_NONE && phase == CPS_RS_STREAMING)
                return; /* the shell streams */
            wait_answers(m, o);
            break;
        case CPS_RS_TAILS:
            tails(m, o);
            break;
        default:
            return;
        }
        if (m->phase == phase)
            return;
    }
}

static void on_view(cps__restore *m, const cps__view *v, cps__rs_ready *o)
{
    m->looking = 0;
    if (v && v->epoch != m->epoch) {
        uint32_t stopped = 0, bad = 0;
        int rc = cps__rr_look(&m->book, v, &stopped, &bad);
        if (rc == CPS_EUNAVAILABLE) {
            fail(m, o, rc, CPS_RS_WHY_NO_REPLICA, bad);
            return;
        }
        if (rc != 0) {
            fail(m, o, rc, CPS_RS_WHY_NONE, CPS_RR_NONE);
            return;
        }
        m->v = v;
        m->epoch = v->epoch;
        note_down(m);
    }
    if (m->look_pass) {
        m->look_pass = 0;
        begin_pass(m, o);
    }
}

int cps__rs_step(cps__restore *m, const cps__rs_event *e, cps__rs_ready *out)
{
    if (!m || !e || !out)
        return CPS_EINVAL;
    out->n = 0;
    if (m->phase == CPS_RS_END)
        return 0;
    int view = e->kind == CPS_RS_VIEW || e->kind == CPS_RS_VIEW_NONE;
    if (m->looking != view || (e->kind == CPS_RS_VIEW && (!e->view || !e->view->ranges)) ||
        (e->kind == CPS_RS_READY &&
         (m->held != CPS_RR_NONE || m->phase != CPS_RS_STREAMING || e->range >= m->book.nranges)))
        return CPS_EINVAL;
    if (e->now > m->now)
        m->now = e->now;
    m->gone = e->gone;
    switch (e->kind) {
    case CPS_RS_VIEW:
    case CPS_RS_VIEW_NONE:
        on_view(m, e->kind == CPS_RS_VIEW ? e->view : NULL, out);
        break;
    case CPS_RS_ANSWER: {
        if (e->range >= m->book.nranges)
            break;
        int v = cps__rr_take(&m->book, e->range, &e->ans, e->seq, m->now, NULL);
        /* Only an answer that counts (not a stale, duplicate or foreign one) keeps the wait. */
        if (v == CPS_RR_TAKEN || v == CPS_RR_AGAIN)
            m->wait_deadline = m->now + m->cfg.timeout_ms;
        if (v == CPS_RR_FATAL)
            fail(m, out, e->ans.status ? e->ans.status : CPS_EPROTO, CPS_RS_WHY_FATAL, e->range);
        else if (v == CPS_RR_AGAIN)
            m->next_look = 0; /* the head moved, or is unsure: the view may say so */
        break;
    }
    case CPS_RS_PROBE:
        /* A late answer of a tail probed before a look moved the tail counts for nothing. */
        if (m->phase != CPS_RS_TAILS || e->range != m->cursor || !m->probe_until ||
            e->from != m->probe_to)
            break;
        m->probe_until = 0;
        if (e->epoch > m->epoch) {
            /* The tail the machine probed is not the tail any more, perhaps: a miss, and the
             * view before the next probe (sim_restore seed 5241: a joiner became
             * tail, then lost what the old tail confirmed when the head died). */
            m->probe_until = m->now ? m->now : 1;
            m->next_look = 0;
        } else if (e->ok && cps__rr_confirm(&m->book, e->range, e->seq)) {
            m->confirmed++;
            m->cursor++;
            m->probe_again = 0;
        } else {
            m->probe_until = m->now ? m->now : 1; /* a miss: judged as one (tails) */
        }
        break;
    case CPS_RS_READY:
        if (e->seq > m->last_seq)
            m->last_seq = e->seq;
        if (!cps__rr_open(&m->book, e->range)) {
            emit(out, CPS_RS_DISCARD, e->range, 0, 0);
        } else if (cps__rr_full(&m->book, e->range)) {
            m->held = e->range;
            m->held_seq = e->seq;
            m->wait_deadline = m->now + m->cfg.timeout_ms;
        } else {
            send_put(m, out, e->range, e->seq);
            return 0; /* streaming goes on: nothing to wait for */
        }
        break;
    case CPS_RS_STREAMED:
        if (m->phase == CPS_RS_STREAMING && m->held == CPS_RR_NONE) {
            m->phase = CPS_RS_DRAINING;
            m->wait_deadline = m->now + m->cfg.timeout_ms;
        }
        break;
    case CPS_RS_TICK:
        break;
    default:
        return CPS_EINVAL;
    }
    if (m->phase != CPS_RS_END)
        advance(m, out);
    return 0;
}

uint64_t cps__rs_deadline(const cps__restore *m)
{
    if (m->phase == CPS_RS_END || m->looking)
        return UINT64_MAX;
    if (m->phase == CPS_RS_START)
        return m->now;
    if (m->phase == CPS_RS_PACING)
        return cps__rr_pass_due(&m->book, m->gap);
    if (m->phase == CPS_RS_STREAMING && m->held == CPS_RR_NONE)
        return UINT64_MAX;
    uint64_t t = m->now + m->cfg.look_ms;
    if (m->phase == CPS_RS_TAILS) /* looks there follow a probe's miss only */
        return m->probe_until ? m->probe_until : m->probe_again;
    uint64_t l = m->gone && m->last_look + m->cfg.look_ms < m->next_look
                     ? m->last_look + m->cfg.look_ms
                     : m->next_look;
    if (l < t)
        t = l;
    return m->wait_deadline < t ? m->wait_deadline : t;
}
