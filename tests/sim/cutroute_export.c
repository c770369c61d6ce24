/* sim_cutroute: the exporter (src/checkpoint/cluster_cut.c) over the production router
 * (recovery/cutroute.c) (cutroute.h). */
#include "cutroute.h"

/* ---- the exporter (src/checkpoint/cluster_cut.c) ---- */

static void url_of(char *buf, size_t len, uint32_t node, uint32_t inc)
{
    snprintf(buf, len, "tcp://n%u.i%u:1", node, inc);
}

static int url_parse(const char *url, uint32_t *node, uint32_t *inc)
{
    return url && sscanf(url, "tcp://n%u.i%u:1", node, inc) == 2 ? 0 : -1;
}

/* The connection to a process refuses once it has been dead a little while. */
static int refuses(const model *m, uint32_t node, uint32_t inc)
{
    const server *s = &m->s[node];
    return (s->inc != inc || !s->alive) && m->now >= s->died + 5;
}

static void x_fetch_view(model *m)
{
    const chains *c = now_chains(m);
    m->xview.epoch = m->epoch;
    for (uint32_t r = 0; r < m->nranges; r++) {
        m->xranges[r].chain_len = c->len[r];
        memcpy(m->xranges[r].chain, c->c[r], sizeof c->c[r]);
    }
}

static void x_end(model *m, int ok, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void x_end(model *m, int ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->outcome, sizeof m->outcome, fmt, ap);
    va_end(ap);
    m->phase = ok ? 3 : 4;
    if (m->verbose)
        printf("  t=%" PRIu64 " export %s: %s\n", m->now, ok ? "done" : "failed", m->outcome);
}

static void x_send_read(model *m, uint32_t i)
{
    read *q = &m->reads[i];
    uint32_t r = q->range;
    q->node = cps__cutroute_reader(m->cr, r);
    q->gen = m->gen[r];
    q->sent = m->now;
    q->inc = 0;
    if (!q->node)
        return; /* no reader until a standby answers: READ_FROM sends it */
    uint32_t node, inc;
    if (url_parse(cps__cutroute_url(m->cr, r, q->node), &node, &inc) != 0 || node != q->node) {
        sim_fail(&m->v, "range %u: the reader %u has no read view address", r, q->node);
        return;
    }
    q->inc = inc;
    post(m, net(m),
         (event){.type = EV_READ,
                 .node = node,
                 .inc = inc,
                 .range = r,
                 .attempt = m->attempt,
                 .idx = i,
                 .gen = q->gen});
}

static void x_issue_reads(model *m)
{
    for (uint32_t r = 0; r < m->nranges; r++) {
        uint32_t inflight = 0;
        for (uint32_t i = 0; i < m->nreads; i++)
            inflight += m->reads[i].live && m->reads[i].range == r;
        while (m->to_issue[r] && inflight < 2 && m->nreads < MAX_READS) {
            m->to_issue[r]--;
            inflight++;
            m->reads[m->nreads] = (read){.live = 1, .range = r};
            x_send_read(m, m->nreads++);
        }
    }
}

static void x_cut(model *m);

/* Perform cutroute's actions (route_do, and the CLOSE of on_open_answer). */
static void x_do(model *m, const cps__cr_action *a, int n)
{
    if (n < 0) {
        sim_fail(&m->v, "cutroute returned %d", n);
        return;
    }
    for (int i = 0; i < n && m->phase < 3; i++) {
        uint32_t r = a[i].range, node = a[i].node;
        switch (a[i].kind) {
        case CPS_CR_ASK:
            if (m->verbose)
                printf("  t=%" PRIu64 " ask node %u for range %u\n", m->now, node, r);
            post(m, fifo(m, node, 0),
                 (event){.type = EV_ASK, .node = node, .range = r, .attempt = m->attempt});
            break;
        case CPS_CR_READ_FROM: {
            uint32_t vn, vi;
            const char *url = cps__cutroute_url(m->cr, r, node);
            if (url_parse(url, &vn, &vi) != 0 || vn != node) {
                sim_fail(&m->v, "range %u: READ_FROM node %u without its address", r, node);
                return;
            }
            /* The check at the source: the view it reads from is the cut's (or died since). */
            const server *s = &m->s[node];
            const job *j = &s->jobs[r];
            if (s->inc == vi && s->alive &&
                (j->attempt != m->attempt || (j->state != J_OPEN && j->state != J_SHUT)))
                sim_fail(&m->v,
                         "range %u: reads go to node %u, which holds no read view of the cut", r,
                         node);
            else if (s->inc == vi && s->alive && j->seq != cps__cutroute_seq(m->cr, r))
                sim_fail(&m->v,
                         "range %u: reads go to node %u whose view is at sequence number %" PRIu64
                         ", the cut's is %" PRIu64,
                         r, node, j->seq, cps__cutroute_seq(m->cr, r));
            if (m->verbose)
                printf("  t=%" PRIu64 " range %u reads from node %u (seq %" PRIu64 ")\n", m->now, r,
                       node, cps__cutroute_seq(m->cr, r));
            m->gen[r]++;
            if (m->phase == 2)
                for (uint32_t k = 0; k < m->nreads; k++)
                    if (m->reads[k].live && m->reads[k].range == r)
                        x_send_read(m, k); /* the reads in flight at the old reader, again */
            break;
        }
        case CPS_CR_CLOSE: {
            job *j = &m->s[node].jobs[r];
            if (m->s[node].alive && j->attempt == m->attempt)
                j->state = J_DONE; /* CUT_CLOSE (its delay does not matter here) */
            break;
        }
        case CPS_CR_LOST:
            m->lost = a[i].err;
            m->lost_range = r;
            if (m->verbose)
                printf("  t=%" PRIu64 " range %u lost: %s\n", m->now, r, cps_err_name(a[i].err));
            x_cut(m);
            return;
        default:
            sim_fail(&m->v, "unknown cutroute action %u", a[i].kind);
            return;
        }
    }
}

static void x_look(model *m)
{
    x_fetch_view(m);
    const cps__cr_action *a;
    int n = cps__cutroute_view(m->cr, &m->xview, &a);
    x_do(m, a, n);
}

/* 1 if a chain member of the exporter's view refuses its connection (chain_gone). */
static int x_chain_gone(const model *m)
{
    for (uint32_t r = 0; r < m->nranges; r++)
        for (uint32_t k = 0; k < m->xranges[r].chain_len; k++) {
            uint32_t node = m->xranges[r].chain[k];
            if (!m->s[node].alive && m->now >= m->s[node].died + 5)
                return 1;
        }
    return 0;
}

/* Close every view of the cut that ends and, if the cut was lost, cut again (or give up). */
static void x_close_all(model *m)
{
    for (uint32_t n = 1; n <= m->nservers; n++)
        for (uint32_t r = 0; r < m->nranges; r++)
            if (m->s[n].jobs[r].attempt == m->attempt && m->s[n].jobs[r].state != J_PENDING)
                m->s[n].jobs[r].state = J_DONE; /* pending ones open later under an old id */
    cps__cutroute_destroy(m->cr);
    m->cr = NULL;
}

static void x_cut(model *m)
{
    int err = m->lost;
    uint32_t r = m->lost_range;
    x_close_all(m);
    if (err == CPS_EAGAIN && ++m->cut_tries < CUT_TRIES) {
        m->phase = 0;
        post(m, 0, (event){.type = EV_START});
        return;
    }
    if (err == CPS_EPAST && ++m->open_tries < OPEN_TRIES) {
        m->phase = 0;
        post(m, 0, (event){.type = EV_START});
        return;
    }
    x_end(m, 0, "range %u: %s", r, cps_err_name(err));
}

/* Probe the tails (an oracle: cluster_cut.c's probe_steps has its own tests) and open a cut a
 * little ahead of the furthest; async cuts are "now". */
void x_start(model *m)
{
    if (m->phase != 0)
        return;
    x_fetch_view(m);
    uint64_t hi = 0;
    for (uint32_t r = 0; r < m->nranges; r++) {
        uint32_t n = m->xranges[r].chain_len;
        if (m->need[r] && n) {
            uint64_t at = step_at(m, r, m->s[m->xranges[r].chain[n - 1]].applied[r]);
            hi = at > hi ? at : hi;
        }
    }
    m->attempt++;
    m->T = m->sync ? hi + rnd(m, 4) : 0;
    if (m->sync && m->T == 0)
        m->T = 1; /* the exporter aims at least a step ahead (aim_step): 0 would mean "now" */
    m->lost = 0;
    m->phase = 1;
    m->look = m->now + REFRESH_MS;
    m->deadline = m->now + 30000;
    memset(m->gen, 0, sizeof m->gen);
    memset(m->read_any, 0, sizeof m->read_any);
    m->nreads = 0;
    for (uint32_t r = 0; r < m->nranges; r++)
        m->to_issue[r] = m->need[r] ? 1 + (uint32_t)rnd(m, 5) : 0;
    if (m->verbose)
        printf("  t=%" PRIu64 " cut %u at step %" PRIu64 "\n", m->now, m->attempt, m->T);
    if (cps__cutroute_create(m->nranges, m->need, m->sync, &m->cr) != 0) {
        sim_fail(&m->v, "cps__cutroute_create failed");
        return;
    }
    const cps__cr_action *a;
    int n = cps__cutroute_view(m->cr, &m->xview, &a);
    x_do(m, a, n);
}

void x_maybe_read(model *m)
{
    if (m->phase == 1 && cps__cutroute_ready(m->cr)) {
        m->phase = 2;
        m->look = m->now + LOOK_MS;
        x_issue_reads(m);
        /* What the integration tests cannot aim at: a reader killed in the middle of its reads
         * (they last about 10 ms there), on half of the cuts. */
        if (m->kill_readers && rnd(m, 2)) {
            uint32_t r = (uint32_t)rnd(m, m->nranges);
            while (!m->need[r])
                r = (r + 1) % m->nranges;
            m->kill_readers--;
            post(m, rnd(m, 40), (event){.type = EV_KILL_READER, .range = r, .attempt = m->attempt});
        }
    }
}

void on_open_ans(model *m, const event *e)
{
    const server *s = &m->s[e->node];
    if (s->inc != e->inc || !s->alive)
        return; /* lost with the dead */
    if (e->attempt != m->attempt || m->phase < 1 || m->phase > 2)
        return; /* another cut's id */
    if (m->phase == 2 && m->no_absorb)
        return; /* before 3610ce3: nobody takes it */
    const cps__cr_action *a;
    int n;
    if (e->err) {
        n = cps__cutroute_refused(m->cr, e->range, e->node, e->err, e->step, &a);
    } else {
        char url[CPS_ADDR_MAX];
        url_of(url, sizeof url, e->node, e->inc);
        n = cps__cutroute_opened(m->cr, e->range, e->node, e->seq, url, &a);
    }
    x_do(m, a, n);
    if (e->err == CPS_ESTALE_EPOCH && m->phase == 1)
        m->look = m->now; /* the chain moved: the view, then its replicas */
    x_maybe_read(m);
}

void on_read_ans(model *m, const event *e)
{
    const server *s = &m->s[e->node];
    if (s->inc != e->inc || !s->alive)
        return; /* lost with the dead */
    if (e->attempt != m->attempt || m->phase != 2)
        return;
    if (e->idx == UINT32_MAX) {
        /* The view closed (CUT_READ error, req_seq UINT64_MAX): taken by a read waiting on it. */
        for (uint32_t k = 0; k < m->nreads; k++)
            if (m->reads[k].live && m->reads[k].range == e->range && m->reads[k].node == e->node) {
                const cps__cr_action *a;
                int n = cps__cutroute_closed(m->cr, e->range, e->node, &a);
                x_do(m, a, n);
                break;
            }
        return;
    }
    read *q = &m->reads[e->idx];
    uint32_t r = q->range;
    if (!q->live || q->gen != e->gen || q->node != e->node)
        return;   /* an answer of an earlier reader: purged */
    if (e->err) { /* the view closed: every read is answered so */
        const cps__cr_action *a;
        int n = cps__cutroute_closed(m->cr, r, e->node, &a);
        x_do(m, a, n);
        return;
    }
    uint64_t seq = cps__cutroute_seq(m->cr, r);
    if (m->sync && e->step != m->T)
        sim_fail(&m->v,
                 "range %u read from node %u's view at step %" PRIu64 ", the cut's is %" PRIu64, r,
                 e->node, e->step, m->T);
    if (e->seq != seq)
        sim_fail(&m->v,
                 "range %u read from node %u's view at sequence number %" PRIu64
                 ", the cut's is %" PRIu64,
                 r, e->node, e->seq, seq);
    if (m->read_any[r] && m->read_seq[r] != e->seq)
        sim_fail(&m->v, "range %u read at sequence numbers %" PRIu64 " and %" PRIu64, r,
                 m->read_seq[r], e->seq);
    m->read_any[r] = 1;
    m->read_seq[r] = e->seq;
    q->live = 0;
    x_issue_reads(m);
    int left = 0;
    for (uint32_t k = 0; k < m->nranges; k++)
        left += m->to_issue[k] != 0;
    for (uint32_t k = 0; k < m->nreads; k++)
        left += m->reads[k].live;
    if (!left) {
        x_close_all(m);
        x_end(m, 1, "step %" PRIu64 " after %u cut(s)", m->T, m->attempt);
    }
}

/* The exporter's poll timeout: open_cut's and read_take's looks. */
void on_xtick(model *m)
{
    if (m->phase == 1) {
        if (m->now >= m->deadline) {
            x_end(m, 0, "timeout opening the cut");
        } else {
            int gone = x_chain_gone(m);
            if (gone || m->now >= m->look) {
                x_look(m);
                m->look = m->now + (gone ? GONE_MS : REFRESH_MS);
                x_maybe_read(m);
            }
        }
    } else if (m->phase == 2) {
        /* read_take: the reader's view socket refuses, or the view is looked at again. */
        for (uint32_t k = 0; k < m->nreads && m->phase == 2; k++) {
            read *q = &m->reads[k];
            if (!q->live)
                continue;
            if (m->now >= q->sent + 30000) {
                x_end(m, 0, "range %u: no answer from its read view", q->range);
                break;
            }
            if (q->node && refuses(m, q->node, q->inc) &&
                cps__cutroute_reader(m->cr, q->range) == q->node) {
                const cps__cr_action *a;
                int n = cps__cutroute_closed(m->cr, q->range, q->node, &a);
                x_do(m, a, n);
            }
        }
        if (m->phase == 2 && m->now >= m->look) {
            x_look(m);
            m->look = m->now + LOOK_MS;
        }
    }
    if (m->phase < 3) /* a cut lost is cut again at once (phase 0): keep polling */
        post(m, GONE_MS, (event){.type = EV_XTICK});
}
