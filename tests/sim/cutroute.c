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
 * (src/checkpoint/cluster_cut.c: open_cut looks at the view every REFRESH_MS, every GONE_MS while a
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

#include "cutroute.h"

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
    return sim_seed_end(&t, &a, "--no-absorb");
}
