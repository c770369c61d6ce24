/* sim_cutroute: seeded model of checkpoint exports during view changes (issue 26), over the
 * production routing state machine (recovery/cutroute.c).
 *
 * A sync job (or, on a quarter of the seeds, an async one, whose cut is "now" at the tail) runs on
 * chains of 1 to 3 replicas; each range's head appends one update per step (its aggregate) and now
 * and then an update of no step (a sparse push), so replicas at one step boundary may sit at
 * different sequence numbers; updates travel down the chain one hop at a time, and step t + 1
 * starts once every range's tail applied step t (the workers pull from the tails). An export
 * probes the tails' steps, cuts a little ahead, and reads every range from the replica
 * cutroute names. Meanwhile servers die (heads, middles, tails, every replica of a range, a reader
 * in the middle of its reads), come back under their id and rejoin at the tail after a state
 * transfer, or close their read views (a store that had to grow); the scheduler declares the dead
 * after a random delay and publishes views that each server and the exporter learn at their own
 * moments (the exporter may miss a view altogether); asks, answers and reads travel with random
 * delays, and those of a dead process are lost.
 *
 * The server's decisions who may open a cut and when it opens are the production ones
 * (replication/cut_view.c: cps__cut_may_open, cps__cut_ready). What the model re-states of the
 * shells is small and named: the server's repeat rule (src/server/cut.c), and the exporter's loop
 * (src/checkpoint/cluster.c: open_cut looks at the view every REFRESH_MS, every GONE_MS while a
 * chain member's connection refuses, at once after a stale-epoch refusal; read_take hands a range
 * on when its reader's view socket refuses or the view closed, looks every LOOK_MS, absorb_opens
 * feeds the late answers; cuts lost with every replica are cut again CUT_TRIES times, cuts refused
 * as past OPEN_TRIES times).
 *
 * Checked on every seed: a read is only ever answered from a view opened at the cut's step and at
 * the range's sequence number (cps__cutroute_seq), and every range is read at one sequence number;
 * a "now" view (async) holds nothing its tail has not applied;
 * the export either completes with every range read, or fails with a reason naming a range; and it
 * never waits past HANG_MS after the last fault (the real exporter would wait out its timeout for
 * an answer that cannot come). With --no-absorb the exporter ignores the answers that come after
 * the cut is open (the code before 3610ce3): a reader that dies while its standbys' answers are
 * still on their way leaves the range waiting, and seeds fail.
 *
 * usage: sim_cutroute [--seed N] [--seeds K] [--no-absorb] [-v]
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "seed_args.h"
#include "chainps/error.h"
#include "core/view.h"
#include "recovery/cutroute.h"
#include "replication/cut_view.h"

#define MAX_SERVERS   7
#define MAX_RANGES    4
#define MAX_REPL      3
#define MAX_EPOCHS    64
#define MAX_LOG       8192
#define MAX_READS     64
#define MAX_EVENTS    65536
#define MAX_STEPS_RUN 400000 /* events per seed: a runaway loop fails the seed */
/* The exporter's timers (src/checkpoint/cluster.c), in simulated ms. */
#define GONE_MS    100
#define LOOK_MS    500
#define REFRESH_MS 2000
#define CUT_TRIES  4
#define OPEN_TRIES 8
/* An export still waiting this long after the last fault (and its view) waits for nothing. */
#define HANG_MS 10000

enum {
    EV_TICK = 1,    /* the chains move one hop, the job one step when it may */
    EV_XTICK,       /* the exporter's poll timeout (GONE_MS) */
    EV_START,       /* the export starts (or cuts again) */
    EV_ASK,         /* CUT_OPEN reaches a server */
    EV_OPEN_ANS,    /* its answer reaches the exporter */
    EV_READ,        /* CUT_READ reaches a read view */
    EV_READ_ANS,    /* its answer reaches the exporter */
    EV_KILL,        /* kill -9 of a server */
    EV_DECLARE,     /* the scheduler declares it dead: a view without it */
    EV_RESTART,     /* it comes back under its id; rejoins at the tails once admitted */
    EV_GROW,        /* a server closes its read views (its store had to grow) */
    EV_SVIEW,       /* a server learns a view */
    EV_KILL_READER, /* kill -9 of whichever server reads a range now (mid-read) */
};

typedef struct event {
    uint64_t t, order;
    int type;
    uint32_t node, inc, range, attempt, idx, gen;
    int err;
    uint64_t seq, step, epoch;
} event;

/* A server's cut of one range: pending (waits for its step), open (a read view), shut (closed
 * because the store had to grow: reads are answered with an error), or done with (refused, or
 * closed on the exporter's word). */
enum { J_NONE, J_PENDING, J_OPEN, J_SHUT, J_DONE };

typedef struct job {
    uint32_t attempt; /* the export's cut it belongs to */
    int state;
    uint64_t seq, step;
} job;

typedef struct server {
    int alive, declared;
    uint32_t inc;  /* incarnation: a restart is a new process, its views and jobs are gone */
    uint64_t died; /* when it was last killed */
    uint64_t epoch;
    uint64_t applied[MAX_RANGES];
    job jobs[MAX_RANGES];
    cps__cut_book book; /* the server's own record of the cuts asked for (cut_view.c) */
} server;

typedef struct chains {
    uint32_t len[MAX_RANGES];
    uint32_t c[MAX_RANGES][MAX_REPL + 1];
} chains;

typedef struct read {
    int live;
    uint32_t range, node, inc, gen;
    uint64_t sent;
} read;

typedef struct model {
    uint64_t rng;
    int no_absorb, verbose;
    sim_verdict v;
    uint32_t nservers, nranges, repl;
    int sync;
    unsigned char need[MAX_RANGES];
    server s[MAX_SERVERS + 1]; /* by node id, 1.. */
    /* the job */
    uint64_t step;                              /* the step the job is at */
    uint64_t log_step[MAX_RANGES][MAX_LOG + 1]; /* log_step[r][seq]: the step after seq */
    uint64_t log_len[MAX_RANGES];
    /* the scheduler */
    chains views[MAX_EPOCHS + 1];
    uint64_t epoch;
    uint64_t last_fault;
    /* the exporter */
    int phase; /* 0 probing, 1 opening, 2 reading, 3 done, 4 failed */
    uint32_t attempt, cut_tries, open_tries;
    uint32_t kill_readers; /* readers still to kill mid-read */
    uint64_t T, started, look, deadline;
    cps__cutroute *cr;
    cps__view xview;
    cps__range xranges[MAX_RANGES];
    uint32_t gen[MAX_RANGES];
    uint32_t to_issue[MAX_RANGES];
    uint64_t read_seq[MAX_RANGES]; /* the sequence number the range's reads came from */
    int read_any[MAX_RANGES];
    read reads[MAX_READS];
    uint32_t nreads;
    int lost;
    uint32_t lost_range;
    char outcome[160];
    /* events */
    event ev[MAX_EVENTS];
    uint32_t nev;
    uint64_t order, now, nsteps;
} model;

static uint64_t rnd(model *m, uint64_t n)
{
    return sim_draw(&m->rng, n);
}

/* ---- the event queue: a binary heap on (t, order) ---- */

static int ev_less(const event *a, const event *b)
{
    return a->t < b->t || (a->t == b->t && a->order < b->order);
}

static void post(model *m, uint64_t delay, event e)
{
    if (m->nev == MAX_EVENTS) {
        sim_fail(&m->v, "event queue full");
        return;
    }
    e.t = m->now + delay;
    e.order = m->order++;
    uint32_t i = m->nev++;
    while (i > 0 && ev_less(&e, &m->ev[(i - 1) / 2])) {
        m->ev[i] = m->ev[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    m->ev[i] = e;
}

static int pop(model *m, event *out)
{
    if (m->nev == 0)
        return 0;
    *out = m->ev[0];
    event last = m->ev[--m->nev];
    uint32_t i = 0;
    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= m->nev)
            break;
        if (c + 1 < m->nev && ev_less(&m->ev[c + 1], &m->ev[c]))
            c++;
        if (!ev_less(&m->ev[c], &last))
            break;
        m->ev[i] = m->ev[c];
        i = c;
    }
    if (m->nev)
        m->ev[i] = last;
    return 1;
}

static uint64_t net(model *m)
{
    return 1 + rnd(m, 8);
}

/* Between the exporter and one server messages keep their order (one TCP connection each way). */
static uint64_t fifo_last[MAX_SERVERS + 1][2];

static uint64_t fifo(model *m, uint32_t node, int dir)
{
    uint64_t at = m->now + net(m);
    if (at <= fifo_last[node][dir])
        at = fifo_last[node][dir] + 1;
    fifo_last[node][dir] = at;
    return at - m->now;
}

/* ---- the chains and the job ---- */

static const chains *now_chains(const model *m)
{
    return &m->views[m->epoch];
}

static int in_chain(const chains *c, uint32_t r, uint32_t node, uint32_t *pos)
{
    for (uint32_t k = 0; k < c->len[r]; k++)
        if (c->c[r][k] == node) {
            if (pos)
                *pos = k;
            return 1;
        }
    return 0;
}

static uint64_t step_at(const model *m, uint32_t r, uint64_t seq)
{
    return m->log_step[r][seq];
}

static void try_cut(model *m, uint32_t node, uint32_t r);

static void publish(model *m, const chains *c)
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
static void on_tick(model *m)
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
static void try_cut(model *m, uint32_t node, uint32_t r)
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

static void on_ask(model *m, const event *e)
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

static void on_read(model *m, const event *e)
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

/* ---- the exporter (src/checkpoint/cluster.c) ---- */

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

/* Probe the tails (an oracle: cluster.c's probe_steps has its own tests) and open a cut a little
 * ahead of the furthest; async cuts are "now". */
static void x_start(model *m)
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

static void x_maybe_read(model *m)
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

static void on_open_ans(model *m, const event *e)
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

static void on_read_ans(model *m, const event *e)
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
static void on_xtick(model *m)
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

/* ---- faults ---- */

static void on_kill(model *m, uint32_t node)
{
    server *s = &m->s[node];
    if (!s->alive)
        return;
    s->alive = 0;
    s->died = m->now;
    memset(s->jobs, 0, sizeof s->jobs);
    cps__cut_book_fini(&s->book);
    m->last_fault = m->now;
    if (m->verbose)
        printf("  t=%" PRIu64 " kill -9 node %u\n", m->now, node);
    post(m, 50 + rnd(m, 1500), (event){.type = EV_DECLARE, .node = node, .inc = s->inc});
}

static void on_declare(model *m, const event *e)
{
    server *s = &m->s[e->node];
    if (s->inc != e->inc || s->declared)
        return;
    s->declared = 1;
    chains c = *now_chains(m);
    for (uint32_t r = 0; r < m->nranges; r++) {
        uint32_t k = 0;
        for (uint32_t i = 0; i < c.len[r]; i++)
            if (c.c[r][i] != e->node)
                c.c[r][k++] = c.c[r][i];
        /* A head that died took the updates it did not forward along. */
        if (k && c.c[r][0] != now_chains(m)->c[r][0])
            m->log_len[r] = m->s[c.c[r][0]].applied[r];
        c.len[r] = k;
    }
    publish(m, &c);
    m->last_fault = m->now;
}

/* Back under its id, once the scheduler declared it dead: it rejoins at the tail of every range
 * it held that still has a replica, with a copy of the tail's state. */
static void on_restart(model *m, const event *e)
{
    server *s = &m->s[e->node];
    if (s->alive)
        return;
    if (!s->declared) {
        post(m, 50, *e);
        return;
    }
    s->alive = 1;
    s->declared = 0;
    s->inc++;
    s->epoch = m->epoch;
    memset(s->jobs, 0, sizeof s->jobs);
    chains c = *now_chains(m);
    for (uint32_t r = 0; r < m->nranges; r++) {
        if (!(e->range & (1u << r)) || c.len[r] == 0 || c.len[r] >= MAX_REPL + 1)
            continue;
        s->applied[r] = m->s[c.c[r][c.len[r] - 1]].applied[r];
        c.c[r][c.len[r]++] = e->node;
    }
    if (m->verbose)
        printf("  t=%" PRIu64 " node %u is back\n", m->now, e->node);
    publish(m, &c);
    m->last_fault = m->now;
}

static void on_grow(model *m, uint32_t node)
{
    server *s = &m->s[node];
    if (!s->alive)
        return;
    for (uint32_t r = 0; r < m->nranges; r++)
        if (s->jobs[r].state == J_OPEN) {
            s->jobs[r].state = J_SHUT;
            post(m, net(m),
                 (event){.type = EV_READ_ANS,
                         .node = node,
                         .inc = s->inc,
                         .range = r,
                         .attempt = s->jobs[r].attempt,
                         .idx = UINT32_MAX,
                         .err = CPS_EAGAIN});
        }
    if (m->verbose)
        printf("  t=%" PRIu64 " node %u closes its read views\n", m->now, node);
    m->last_fault = m->now;
}

/* A member of range r's chain by role: 0 head, 1 middle, 2 tail. */
static uint32_t pick(model *m, uint32_t r, int role)
{
    const chains *c = &m->views[1];
    uint32_t n = c->len[r];
    uint32_t k = role == 0 ? 0 : role == 2 ? n - 1 : (n > 2 ? 1 : (uint32_t)rnd(m, n));
    return c->c[r][k];
}

static void plan_faults(model *m, uint64_t x0)
{
    uint32_t nf = (uint32_t)rnd(m, 4);
    for (uint32_t f = 0; f < nf; f++) {
        uint32_t r = (uint32_t)rnd(m, m->nranges);
        while (!m->need[r])
            r = (r + 1) % m->nranges;
        uint32_t node = pick(m, r, (int)rnd(m, 3));
        uint64_t at = x0 + rnd(m, 400); /* before the cut opens, while it opens, while reading */
        uint32_t kind = (uint32_t)rnd(m, 10);
        if (kind < 5) {
            post(m, at - m->now, (event){.type = EV_KILL, .node = node});
        } else if (kind < 7) {
            post(m, at - m->now, (event){.type = EV_KILL, .node = node});
            uint32_t held = 0;
            for (uint32_t q = 0; q < m->nranges; q++)
                held |= in_chain(&m->views[1], q, node, NULL) ? 1u << q : 0;
            post(m, at - m->now + 100 + rnd(m, 1500),
                 (event){.type = EV_RESTART, .node = node, .range = held});
        } else if (kind < 9) {
            post(m, at - m->now, (event){.type = EV_GROW, .node = node});
        } else { /* the whole chain, within a few ms */
            for (uint32_t k = 0; k < m->views[1].len[r]; k++)
                post(m, at - m->now + rnd(m, 20),
                     (event){.type = EV_KILL, .node = m->views[1].c[r][k]});
        }
    }
}

/* ---- a seed ---- */

static void describe_wait(model *m, char *buf, size_t len)
{
    size_t o = (size_t)snprintf(buf, len, "phase %s, view %" PRIu64 " (scheduler %" PRIu64 ")",
                                m->phase == 1 ? "opening" : "reading", m->xview.epoch, m->epoch);
    for (uint32_t r = 0; r < m->nranges && o < len; r++) {
        if (!m->need[r])
            continue;
        o += (size_t)snprintf(buf + o, len - o, "; range %u reader %u chain [", r,
                              cps__cutroute_reader(m->cr, r));
        for (uint32_t k = 0; k < m->xranges[r].chain_len && o < len; k++) {
            uint32_t n = m->xranges[r].chain[k];
            o += (size_t)snprintf(buf + o, len - o, "%s%u%s%s", k ? " " : "", n,
                                  m->s[n].alive ? "" : "(dead)",
                                  m->s[n].jobs[r].state == J_OPEN ? "(open)" : "");
        }
        if (o < len)
            o += (size_t)snprintf(buf + o, len - o, "]");
    }
}

static int run_seed(uint64_t seed, int no_absorb, int verbose, char *why, size_t why_len,
                    char *outcome, size_t out_len)
{
    model *m = calloc(1, sizeof *m);
    if (!m)
        return -1;
    m->rng = seed * 0x2545f4914f6cdd1dull + 7;
    memset(fifo_last, 0, sizeof fifo_last);
    m->no_absorb = no_absorb;
    m->verbose = verbose;
    m->nservers = 2 + (uint32_t)rnd(m, MAX_SERVERS - 1);
    m->nranges = 1 + (uint32_t)rnd(m, MAX_RANGES);
    m->repl = 1 + (uint32_t)rnd(m, MAX_REPL);
    if (m->repl > m->nservers)
        m->repl = m->nservers;
    m->sync = rnd(m, 4) != 0;
    uint32_t needed = 0;
    for (uint32_t r = 0; r < m->nranges; r++)
        needed += m->need[r] = rnd(m, 5) != 0;
    if (!needed)
        m->need[rnd(m, m->nranges)] = 1;
    chains c0;
    memset(&c0, 0, sizeof c0);
    for (uint32_t r = 0; r < m->nranges; r++) {
        c0.len[r] = m->repl;
        for (uint32_t k = 0; k < m->repl; k++)
            c0.c[r][k] = 1 + (r + k) % m->nservers; /* cps__view_place_ranges' ring */
    }
    m->views[1] = c0;
    m->epoch = 1;
    for (uint32_t n = 1; n <= m->nservers; n++)
        m->s[n] = (server){.alive = 1, .epoch = 1};
    cps__view_init(&m->xview);
    m->xview.nranges = m->nranges;
    m->xview.ranges = m->xranges;
    if (verbose)
        printf("seed %" PRIu64 ": %u servers, %u ranges, chains of %u, %s\n", seed, m->nservers,
               m->nranges, m->repl, m->sync ? "sync" : "async");
    /* The job warms up; the export starts at x0; faults come around it. */
    uint64_t x0 = 100 + rnd(m, 200);
    m->started = x0;
    m->kill_readers = (uint32_t)rnd(m, 3);
    post(m, 0, (event){.type = EV_TICK});
    post(m, x0, (event){.type = EV_START});
    post(m, x0 + GONE_MS, (event){.type = EV_XTICK});
    plan_faults(m, x0 > 50 ? x0 - 50 : 0);
    event e;
    while (!m->v.failed && m->phase < 3 && pop(m, &e)) {
        m->now = e.t;
        if (++m->nsteps > MAX_STEPS_RUN) {
            sim_fail(&m->v, "runaway: %d events", MAX_STEPS_RUN);
            break;
        }
        switch (e.type) {
        case EV_TICK:
            on_tick(m);
            break;
        case EV_XTICK:
            on_xtick(m);
            break;
        case EV_START:
            x_start(m);
            if (m->phase == 1 && m->cr)
                x_maybe_read(m);
            break;
        case EV_ASK:
            on_ask(m, &e);
            break;
        case EV_OPEN_ANS:
            on_open_ans(m, &e);
            break;
        case EV_READ:
            on_read(m, &e);
            break;
        case EV_READ_ANS:
            on_read_ans(m, &e);
            break;
        case EV_KILL:
            on_kill(m, e.node);
            break;
        case EV_DECLARE:
            on_declare(m, &e);
            break;
        case EV_RESTART:
            on_restart(m, &e);
            break;
        case EV_GROW:
            on_grow(m, e.node);
            break;
        case EV_KILL_READER:
            if (m->phase == 2 && e.attempt == m->attempt && cps__cutroute_reader(m->cr, e.range)) {
                uint32_t node = cps__cutroute_reader(m->cr, e.range);
                if (m->verbose)
                    printf("  t=%" PRIu64 " the reader of range %u dies\n", m->now, e.range);
                on_kill(m, node);
                if (rnd(m, 3) == 0) { /* and comes back */
                    uint32_t held = 0;
                    for (uint32_t q = 0; q < m->nranges; q++)
                        held |= in_chain(now_chains(m), q, node, NULL) ? 1u << q : 0;
                    post(m, 100 + rnd(m, 1500),
                         (event){.type = EV_RESTART, .node = node, .range = held});
                }
            }
            break;
        case EV_SVIEW:
            if (e.epoch > m->s[e.node].epoch) {
                m->s[e.node].epoch = e.epoch;
                for (uint32_t r = 0; r < m->nranges; r++)
                    try_cut(m, e.node, r);
            }
            break;
        }
        if (!m->v.failed && m->phase < 3 && m->now > m->last_fault + HANG_MS &&
            m->now > m->started + HANG_MS) {
            char w[400];
            describe_wait(m, w, sizeof w);
            sim_fail(&m->v, "hang: the export waits %d ms after the last fault: %s", HANG_MS, w);
        }
    }
    if (!m->v.failed && m->phase < 3)
        sim_fail(&m->v, "the export neither ended nor has anything left to wait for");
    int failed = m->v.failed;
    if (failed)
        snprintf(why, why_len, "%s", m->v.why);
    snprintf(outcome, out_len, "%s%s", m->phase == 3 ? "done " : "failed ", m->outcome);
    cps__cutroute_destroy(m->cr);
    for (uint32_t n = 1; n <= MAX_SERVERS; n++)
        cps__cut_book_fini(&m->s[n].book);
    free(m);
    return failed;
}

int main(int argc, char **argv)
{
    sim_seed_args a;
    if (sim_seed_args_parse(argc, argv, "sim_cutroute", "--no-absorb", &a) != 0)
        return 2;
    sim_seed_tally t = {0, 0};
    uint64_t done = 0, lost[4] = {0};
    for (uint64_t s = a.seed; s < a.seed + a.seeds; s++) {
        char why[512] = "", outcome[200] = "";
        int rc = run_seed(s, a.variant, a.verbose, why, sizeof why, outcome, sizeof outcome);
        if (rc >= 0 && a.verbose)
            printf("seed %" PRIu64 ": %s\n", s, outcome);
        if (!strncmp(outcome, "done", 4))
            done++;
        else if (strstr(outcome, "EAGAIN"))
            lost[0]++;
        else if (strstr(outcome, "EPAST"))
            lost[1]++;
        else if (strstr(outcome, "EUNAVAILABLE"))
            lost[2]++;
        else
            lost[3]++;
        if (sim_seed_count(&t, "sim_cutroute", s, rc, why) < 0)
            return 1;
    }
    sim_seed_summary(&t, "sim_cutroute", &a, "--no-absorb");
    printf("; exports: %" PRIu64 " complete, failed by name: %" PRIu64 " EAGAIN, %" PRIu64
           " EPAST, %" PRIu64 " EUNAVAILABLE, %" PRIu64 " other",
           done, lost[0], lost[1], lost[2], lost[3]);
    return sim_seed_end(&t);
}
