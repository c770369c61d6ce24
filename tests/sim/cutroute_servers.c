/* sim_cutroute: the chains, the job's steps and views, and each server's read views
 * (src/server/cut.c) (cutroute.h). */
#include "cutroute.h"

/* ---- the chains and the job ---- */

const chains *now_chains(const model *m)
{
    return &m->views[m->epoch];
}

int in_chain(const chains *c, uint32_t r, uint32_t node, uint32_t *pos)
{
    for (uint32_t k = 0; k < c->len[r]; k++)
        if (c->c[r][k] == node) {
            if (pos)
                *pos = k;
            return 1;
        }
    return 0;
}

uint64_t step_at(const model *m, uint32_t r, uint64_t seq)
{
    return m->log_step[r][seq];
}

void try_cut(model *m, uint32_t node, uint32_t r);

void publish(model *m, const chains *c)
{
    if (m->epoch == MAX_EPOCHS) {
        sim_fail(&m->v, "too many views");
        return;
    }
    m->views[++m->epoch] = *c;
    for (uint32_t n = 1; n <= m->nservers; n++)
        post(m, 1 + rnd(m, 60), (event){.type = EV_SVIEW, .node = n, .epoch = m->epoch});
    if (m->verbose) {
        printf("  t=%" PRIu64 " view %" PRIu64 ":", m->now, m->epoch);
        for (uint32_t r = 0; r < m->nranges; r++) {
            printf(" [");
            for (uint32_t k = 0; k < c->len[r]; k++)
                printf("%s%u", k ? " " : "", c->c[r][k]);
            printf("]");
        }
        printf("\n");
    }
}

/* One hop per tick: each replica takes its predecessor's next update, if that one is alive. The
 * head is the log; the job steps once every needed range's tail applied the step (and its tail is
 * alive: the workers pull there). */
void on_tick(model *m)
{
    const chains *c = now_chains(m);
    for (uint32_t r = 0; r < m->nranges; r++) {
        if (!m->need[r] || c->len[r] == 0)
            continue;
        for (uint32_t k = c->len[r] - 1; k >= 1; k--) {
            server *p = &m->s[c->c[r][k - 1]], *s = &m->s[c->c[r][k]];
            if (p->alive && s->alive && s->applied[r] < p->applied[r] && rnd(m, 3)) {
                s->applied[r]++;
                try_cut(m, c->c[r][k], r);
            }
        }
        server *h = &m->s[c->c[r][0]];
        if (h->alive && m->log_len[r] < MAX_LOG && rnd(m, 6) == 0) { /* a sparse push */
            m->log_len[r]++;
            m->log_step[r][m->log_len[r]] = m->log_step[r][m->log_len[r] - 1];
            h->applied[r] = m->log_len[r];
            try_cut(m, c->c[r][0], r);
        }
    }
    int all = 1;
    for (uint32_t r = 0; r < m->nranges; r++) {
        if (!m->need[r])
            continue;
        uint32_t n = c->len[r];
        const server *t = n ? &m->s[c->c[r][n - 1]] : NULL;
        all &= t && t->alive && step_at(m, r, t->applied[r]) >= m->step;
    }
    if (all && rnd(m, 2)) {
        m->step++;
        for (uint32_t r = 0; r < m->nranges; r++) {
            if (!m->need[r] || m->log_len[r] >= MAX_LOG)
                continue;
            server *h = &m->s[c->c[r][0]];
            m->log_step[r][++m->log_len[r]] = m->step;
            h->applied[r] = m->log_len[r];
            try_cut(m, c->c[r][0], r);
        }
    }
    /* Heads that died before forwarding: the job re-pushes the steps they took along. */
    for (uint32_t r = 0; r < m->nranges; r++) {
        if (!m->need[r] || c->len[r] == 0)
            continue;
        server *h = &m->s[c->c[r][0]];
        if (h->alive && step_at(m, r, m->log_len[r]) < m->step && m->log_len[r] < MAX_LOG) {
            m->log_step[r][++m->log_len[r]] = m->step;
            h->applied[r] = m->log_len[r];
            try_cut(m, c->c[r][0], r);
        }
    }
    post(m, 2, (event){.type = EV_TICK});
}

/* ---- a server's read views (src/server/cut.c) ---- */

static void answer_open(model *m, uint32_t node, uint32_t r, int err, uint64_t seq, uint64_t step)
{
    const server *s = &m->s[node];
    post(m, fifo(m, node, 1),
         (event){.type = EV_OPEN_ANS,
                 .node = node,
                 .inc = s->inc,
                 .range = r,
                 .attempt = s->jobs[r].attempt,
                 .err = err,
                 .seq = seq,
                 .step = step});
}

/* The server's own decision (replication/cut_view.c): at the boundary of the step (or "now"):
 * open; past it: CPS_EPAST. Every key set of a modelled range is at the same step. */
void try_cut(model *m, uint32_t node, uint32_t r)
{
    server *s = &m->s[node];
    job *j = &s->jobs[r];
    if (j->state != J_PENDING)
        return;
    uint64_t at = step_at(m, r, s->applied[r]);
    cps__cut_span sp = {.lo = at, .hi = at, .n = 1, .seq = s->applied[r], .step = at};
    int ready = cps__cut_ready(m->sync ? m->T : 0, &sp);
    if (ready == 0)
        return;
    if (ready == CPS_EPAST) {
        answer_open(m, node, r, CPS_EPAST, 0, at);
        j->state = J_DONE;
        return;
    }
    j->state = J_OPEN;
    j->seq = sp.seq;
    j->step = cps__cut_at_step(&sp);
    /* A "now" view holds only what is acknowledged: nothing its tail (in the server's own view)
     * has not applied. A middle's or a head's "now" may hold updates lost with it. */
    const chains *v = &m->views[s->epoch];
    uint32_t tail = v->len[r] ? v->c[r][v->len[r] - 1] : 0;
    if (!m->sync && tail && j->seq > m->s[tail].applied[r])
        sim_fail(&m->v,
                 "range %u: node %u opened a \"now\" view at sequence number %" PRIu64
                 ", past its tail's (node %u) %" PRIu64,
                 r, node, j->seq, tail, m->s[tail].applied[r]);
    answer_open(m, node, r, 0, j->seq, at);
}

/* A step cut on any replica the server's view lists, a "now" cut on its tail. */
static int may_cut(const model *m, const chains *v, uint32_t node, uint32_t r)
{
    cps__range rg[MAX_RANGES];
    memset(rg, 0, sizeof rg);
    for (uint32_t i = 0; i < m->nranges; i++) {
        rg[i].chain_len = v->len[i];
        memcpy(rg[i].chain, v->c[i], v->len[i] * sizeof *v->c[i]);
    }
    cps__view view;
    cps__view_init(&view);
    view.nranges = m->nranges;
    view.ranges = rg;
    uint32_t pos;
    int tail = in_chain(v, r, node, &pos) && pos + 1 == v->len[r];
    return cps__cut_may_open(&view, node, tail, r, m->sync ? m->T : 0);
}

void on_ask(model *m, const event *e)
{
    server *s = &m->s[e->node];
    if (!s->alive)
        return; /* lost with the dead */
    job *j = &s->jobs[e->range];
    const chains *v = &m->views[s->epoch];
    /* The server's own decision (replication/cut_view.c), on the server's own view. */
    if (!may_cut(m, v, e->node, e->range)) {
        post(m, fifo(m, e->node, 1),
             (event){.type = EV_OPEN_ANS,
                     .node = e->node,
                     .inc = s->inc,
                     .range = e->range,
                     .attempt = e->attempt,
                     .err = CPS_ESTALE_EPOCH});
        return;
    }
    if (cps__cut_book_ask(&s->book, e->attempt, e->range, m->now) != CPS_CUT_NEW)
        return; /* the server's own rule (cut_view.c): a repeat of a pending or answered one */
    if (j->attempt)
        cps__cut_book_forget(&s->book, j->attempt, e->range); /* its one slot is taken over */
    *j = (job){.attempt = e->attempt, .state = J_PENDING};
    try_cut(m, e->node, e->range);
}

void on_read(model *m, const event *e)
{
    server *s = &m->s[e->node];
    if (!s->alive || s->inc != e->inc)
        return; /* the view went with its process */
    const job *j = &s->jobs[e->range];
    if (j->attempt != e->attempt || (j->state != J_OPEN && j->state != J_SHUT))
        return; /* closed on the exporter's word, or never opened: nobody answers */
    post(m, net(m) + rnd(m, 30),
         (event){.type = EV_READ_ANS,
                 .node = e->node,
                 .inc = e->inc,
                 .range = e->range,
                 .attempt = e->attempt,
                 .idx = e->idx,
                 .gen = e->gen,
                 .seq = j->seq,
                 .step = j->step,
                 .err = j->state == J_SHUT ? CPS_EAGAIN : 0});
}
