/* sim_replace: seeded model of a worker replaced in the middle of a sync job whose workers push
 * several tensors, each cut over every range (fmnist's six, the PyTorch example's four).
 *
 * Each range's head runs the production aggregator (replication/sync.c) over a simulated network
 * with random delays, and every head learns of the views (a worker dead, then its replacement
 * alive) at its own random moment, as production's heads do. The workers behave as
 * examples/fmnist does with libchainps: each step pushes every tensor to every range and waits
 * for all the answers before the next; the replacement declares every tensor (each range answers
 * with the last step it applied to it, once it holds the view with the replacement, as a server
 * holds a future epoch's messages), starts after the highest of those steps (cps_start_step)
 * and flags each tensor's first push (CPS_WF_FIRST): both rules are the production worker
 * session's (recovery/session.c: its tensor clocks), which every worker here runs. What the model
 * re-states of the shells is small and named: the head drops a push of a step at or below the
 * last it applied (the duplicate rule of admit() in replication/replica.c).
 *
 * Checked on every seed: every range closes a tensor's steps in order, one at a time; the
 * replacement is in a step's aggregate on every range or on none (issue 26: fmnist's replacement
 * was in step t on one range and waited for at t on another, a deadlock); and every worker ends
 * its steps: no range is left waiting. With --no-first the replacement neither aligns its
 * tensors nor flags its first pushes (the code before the fix), and seeds fail.
 *
 * usage: sim_replace [--seed N] [--seeds K] [--no-first] [-v]
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "seed_args.h"
#include "chainps/chainps.h"
#include "core/view.h"
#include "core/wire.h"
#include "recovery/session.h"
#include "replication/sync.h"

#define MAX_RANGES  4
#define MAX_TENSORS 6
#define MAX_WORKERS 3
#define MAX_STEPS   80
#define MAX_EVENTS  4096
#define REPL_ID     100u /* the replacement's node id; the others are 10 + rank */

enum { EV_PUSH, EV_ACK, EV_VIEW, EV_DECLARE, EV_DECLARED, EV_KILL, EV_START, EV_COMPUTE };

typedef struct event {
    uint64_t t, order;
    int type;
    uint32_t worker; /* index into workers[] */
    uint32_t range, tensor;
    uint64_t step;
    int first;
} event;

typedef struct head {
    cps__sync *sync;
    uint64_t epoch;               /* the view this head holds: 1, 2 or 3 */
    uint64_t closed[MAX_TENSORS]; /* last step applied per tensor */
    uint64_t req_seq[MAX_WORKERS + 1];
} head;

typedef struct worker {
    uint32_t id, rank;
    int alive, started, done;
    cps__sess *sess;                    /* the worker's protocol: here, its tensors' steps */
    cps__sess_clock clock[MAX_TENSORS]; /* per tensor: the last step pushed */
    uint64_t found[MAX_TENSORS];        /* the replacement: the highest step a declare found */
    uint32_t waiting;                   /* answers of the current step still to come */
    uint32_t declares;                  /* declare answers still to come */
    uint64_t start;
} worker;

typedef struct model {
    uint64_t rng;
    uint32_t nranges, ntensors, nworkers, steps;
    int no_first, verbose;
    sim_verdict v;
    cps__view views[4];
    cps__node_info nodes[4][MAX_WORKERS + 1];
    head heads[MAX_RANGES];
    worker workers[MAX_WORKERS + 1]; /* the last one is the replacement */
    uint32_t victim;
    /* Whether the replacement is in (tensor, step)'s aggregate: -1 no range closed it yet. */
    signed char repl_in[MAX_TENSORS][MAX_STEPS + 2];
    event ev[MAX_EVENTS];
    uint32_t nev;
    uint64_t order, now;
} model;

static uint64_t rnd(model *m, uint64_t n)
{
    return sim_draw(&m->rng, n);
}

static void post(model *m, uint64_t delay, event e)
{
    if (m->nev == MAX_EVENTS) {
        sim_fail(&m->v, "event queue full");
        return;
    }
    e.t = m->now + delay;
    e.order = m->order++;
    m->ev[m->nev++] = e;
}

static int pop(model *m, event *out)
{
    if (m->nev == 0)
        return 0;
    uint32_t best = 0;
    for (uint32_t i = 1; i < m->nev; i++)
        if (m->ev[i].t < m->ev[best].t ||
            (m->ev[i].t == m->ev[best].t && m->ev[i].order < m->ev[best].order))
            best = i;
    *out = m->ev[best];
    m->ev[best] = m->ev[--m->nev];
    return 1;
}

/* A link's delay: per (sender, range) messages keep their order, as over one TCP connection. */
static uint64_t link_last[MAX_WORKERS + 1][MAX_RANGES][2];

static uint64_t link_delay(model *m, uint32_t w, uint32_t r, int dir)
{
    uint64_t at = m->now + 1 + rnd(m, 20);
    if (at <= link_last[w][r][dir])
        at = link_last[w][r][dir] + 1;
    link_last[w][r][dir] = at;
    return at - m->now;
}

static void make_views(model *m)
{
    for (int e = 1; e <= 3; e++) {
        cps__view *v = &m->views[e];
        memset(v, 0, sizeof *v);
        v->epoch = (uint64_t)e;
        v->mode = CPS_MODE_SYNC;
        v->num_workers = m->nworkers;
        v->nodes = m->nodes[e];
        v->nnodes = m->nworkers + (e == 3);
        for (uint32_t r = 0; r < m->nworkers; r++)
            m->nodes[e][r] = (cps__node_info){.id = 10 + r,
                                              .role = CPS_ROLE_WORKER,
                                              .alive = e == 1 || r != m->victim,
                                              .rank = r};
        if (e == 3)
            m->nodes[e][m->nworkers] = (cps__node_info){
                .id = REPL_ID, .role = CPS_ROLE_WORKER, .alive = 1, .rank = m->victim};
    }
}

static void drop_cookie(void *ctx, void *cookie)
{
    (void)ctx;
    (void)cookie;
}

static void push_step(model *m, uint32_t wi);

/* The head of range r submitted (tensor, step): check it, answer its contributors. */
static void on_submit(model *m, uint32_t r, const cps__sync_action *a)
{
    head *h = &m->heads[r];
    uint32_t t = (uint32_t)(a->sig - 1);
    if (a->step != h->closed[t] + 1) {
        char why[160];
        snprintf(why, sizeof why, "range %u closed tensor %u's step %" PRIu64 " after %" PRIu64, r,
                 t, a->step, h->closed[t]);
        sim_fail(&m->v, "%s", why);
        return;
    }
    h->closed[t] = a->step;
    int in = 0;
    for (uint32_t k = 0; k < a->nranks; k++)
        if (a->by_rank[k].cookie && a->by_rank[k].worker == REPL_ID)
            in = 1;
    signed char *seen = &m->repl_in[t][a->step];
    if (*seen >= 0 && *seen != in) {
        char why[200];
        snprintf(why, sizeof why,
                 "tensor %u step %" PRIu64 ": the replacement is in range %u's aggregate %s", t,
                 a->step, r, in ? "but not in another's" : "but in another's");
        sim_fail(&m->v, "%s", why);
    }
    *seen = (signed char)in;
    if (m->verbose)
        printf("  t=%" PRIu64 " range %u closes tensor %u step %" PRIu64 " (%u pushes%s)\n", m->now,
               r, t, a->step, a->count, in ? ", replacement in" : "");
    for (uint32_t k = 0; k < a->nranks; k++) {
        const cps__sync_contrib *c = &a->by_rank[k];
        if (!c->cookie)
            continue;
        uint32_t wi = (uint32_t)(uintptr_t)c->cookie - 1;
        post(m, link_delay(m, wi, r, 1),
             (event){.type = EV_ACK, .worker = wi, .range = r, .tensor = t, .step = a->step});
    }
}

static void run_actions(model *m, uint32_t r)
{
    const cps__sync_action *acts;
    size_t n = cps__sync_actions(m->heads[r].sync, &acts);
    for (size_t i = 0; i < n; i++)
        if (acts[i].kind == CPS_SA_SUBMIT)
            on_submit(m, r, &acts[i]);
}

static void on_push(model *m, const event *e)
{
    head *h = &m->heads[e->range];
    worker *w = &m->workers[e->worker];
    /* admit(): a step at or below the last one applied is a duplicate (a dead worker's push of
     * a step that closed without it lands here too). */
    if (e->step <= h->closed[e->tensor])
        return;
    const cps__view *v = &m->views[h->epoch];
    if (!cps__view_node(v, w->id)) { /* a future epoch's message: held until the view comes */
        post(m, 1, *e);
        return;
    }
    cps__sync_contrib c = {
        w->id,   CPS_MSG_PUSH, ++h->req_seq[e->worker], 1, (void *)(uintptr_t)(e->worker + 1),
        e->first};
    int rc = cps__sync_push(h->sync, v, e->range, e->tensor + 1, e->step, w->rank, &c, m->now);
    if (rc < 0) {
        sim_fail(&m->v, "cps__sync_push failed");
        return;
    }
    run_actions(m, e->range);
}

/* The worker computes, then pushes every tensor of its next step (fmnist: layer by layer). */
static void push_step(model *m, uint32_t wi)
{
    worker *w = &m->workers[wi];
    if (!w->alive)
        return;
    if (w->clock[0].step >= m->steps) {
        w->done = 1;
        return;
    }
    w->waiting = m->ntensors * m->nranges;
    for (uint32_t t = 0; t < m->ntensors; t++) {
        /* The session moves the tensor on a step and flags its first push (not with
         * --no-first: the code before the fix). */
        cps__sess_op op = {.kind = CPS_SS_PUSH, .nparts = 1};
        cps__sess_begin(w->sess, &op, &w->clock[t], !m->no_first);
        for (uint32_t r = 0; r < m->nranges; r++)
            post(m, link_delay(m, wi, r, 0) + t,
                 (event){.type = EV_PUSH,
                         .worker = wi,
                         .range = r,
                         .tensor = t,
                         .step = op.step,
                         .first = op.first});
    }
}

static void on_ack(model *m, const event *e)
{
    worker *w = &m->workers[e->worker];
    if (!w->alive || w->waiting == 0)
        return;
    if (--w->waiting == 0)
        post(m, 5 + rnd(m, 30), (event){.type = EV_COMPUTE, .worker = e->worker});
}

static void on_view(model *m, const event *e)
{
    head *h = &m->heads[e->range];
    if (e->step <= h->epoch)
        return;
    h->epoch = e->step;
    if (cps__sync_set_view(h->sync, &m->views[h->epoch]) != 0)
        sim_fail(&m->v, "cps__sync_set_view failed");
    run_actions(m, e->range);
}

static void on_declare(model *m, const event *e)
{
    head *h = &m->heads[e->range];
    if (h->epoch < 3) { /* a future epoch's message: held until the view comes */
        post(m, 1, *e);
        return;
    }
    event d = *e;
    d.type = EV_DECLARED;
    d.step = h->closed[e->tensor];
    post(m, link_delay(m, e->worker, e->range, 1), d);
}

static void on_declared(model *m, const event *e)
{
    worker *w = &m->workers[e->worker];
    if (e->step > w->found[e->tensor])
        w->found[e->tensor] = e->step; /* a declare keeps the highest range's answer */
    if (--w->declares)
        return;
    uint64_t start = 0;
    for (uint32_t t = 0; t < m->ntensors; t++) {
        start = w->found[t] > start ? w->found[t] : start;
        if (m->no_first)
            w->clock[t].step = w->found[t]; /* each tensor where its declare found it */
        else
            cps__sess_clock_add(w->sess, &w->clock[t], w->found[t]); /* the session aligns */
    }
    if (!m->no_first && cps__sess_start_step(w->sess) != start)
        sim_fail(&m->v, "the session's start step is not the highest a declare found");
    w->start = start;
    if (m->verbose)
        printf("  t=%" PRIu64 " the replacement starts after step %" PRIu64 "\n", m->now, start);
    push_step(m, e->worker);
}

static void on_start(model *m)
{
    uint32_t wi = m->nworkers; /* the replacement */
    worker *w = &m->workers[wi];
    w->alive = 1;
    w->declares = m->ntensors * m->nranges;
    for (uint32_t t = 0; t < m->ntensors; t++)
        for (uint32_t r = 0; r < m->nranges; r++)
            post(m, link_delay(m, wi, r, 0),
                 (event){.type = EV_DECLARE, .worker = wi, .range = r, .tensor = t});
}

static int run_seed(uint64_t seed, int no_first, int verbose, char *why, size_t why_len)
{
    model *m = calloc(1, sizeof *m);
    if (!m)
        return -1;
    memset(link_last, 0, sizeof link_last);
    m->rng = seed * 0x2545f4914f6cdd1dull + 1;
    m->no_first = no_first;
    m->verbose = verbose;
    m->nranges = 2 + (uint32_t)rnd(m, MAX_RANGES - 1);
    m->ntensors = 2 + (uint32_t)rnd(m, MAX_TENSORS - 1);
    m->nworkers = 2 + (uint32_t)rnd(m, MAX_WORKERS - 1);
    m->steps = 30 + (uint32_t)rnd(m, MAX_STEPS - 30);
    m->victim = (uint32_t)rnd(m, m->nworkers);
    memset(m->repl_in, -1, sizeof m->repl_in);
    make_views(m);
    for (uint32_t r = 0; r < m->nranges; r++) {
        m->heads[r].epoch = 1;
        if (cps__sync_create(drop_cookie, NULL, &m->heads[r].sync) != 0) {
            free(m);
            return -1;
        }
    }
    for (uint32_t i = 0; i <= m->nworkers; i++) {
        m->workers[i].id = i < m->nworkers ? 10 + i : REPL_ID;
        m->workers[i].rank = i < m->nworkers ? i : m->victim;
        m->workers[i].alive = i < m->nworkers;
        cps__sess_config cfg = {.request_timeout_ms = 1000, .unavailable_timeout_ms = 30000};
        if (cps__sess_create(&cfg, &m->workers[i].sess) != 0) {
            fprintf(stderr, "sim_replace: out of memory\n");
            exit(2);
        }
        /* The workers of the job from its start: every tensor declared at step 0. */
        for (uint32_t t = 0; i < m->nworkers && t < m->ntensors; t++)
            cps__sess_clock_add(m->workers[i].sess, &m->workers[i].clock[t], 0);
    }
    if (verbose)
        printf("seed %" PRIu64 ": %u ranges, %u tensors, %u workers, %u steps, victim rank %u\n",
               seed, m->nranges, m->ntensors, m->nworkers, m->steps, m->victim);
    /* The kill comes at a random moment of the first half; the scheduler declares the worker
     * dead a while later (view 2), and the replacement joins later still (view 3), each view
     * reaching each head at its own moment. */
    uint64_t kill_at = 20 + rnd(m, m->steps * 25);
    uint64_t dead_at = kill_at + 20 + rnd(m, 200);
    uint64_t join_at = dead_at + rnd(m, 300);
    post(m, kill_at, (event){.type = EV_KILL});
    for (uint32_t r = 0; r < m->nranges; r++) {
        post(m, dead_at + rnd(m, 40), (event){.type = EV_VIEW, .range = r, .step = 2});
        post(m, join_at + rnd(m, 40), (event){.type = EV_VIEW, .range = r, .step = 3});
    }
    post(m, join_at + rnd(m, 40), (event){.type = EV_START});
    for (uint32_t i = 0; i < m->nworkers; i++)
        push_step(m, i);
    event e;
    while (!m->v.failed && pop(m, &e)) {
        m->now = e.t;
        switch (e.type) {
        case EV_PUSH:
            on_push(m, &e);
            break;
        case EV_ACK:
            on_ack(m, &e);
            break;
        case EV_COMPUTE:
            push_step(m, e.worker);
            break;
        case EV_VIEW:
            on_view(m, &e);
            break;
        case EV_DECLARE:
            on_declare(m, &e);
            break;
        case EV_DECLARED:
            on_declared(m, &e);
            break;
        case EV_KILL:
            m->workers[m->victim].alive = 0;
            break;
        case EV_START:
            on_start(m);
            break;
        }
    }
    /* The network is quiet: every live worker must have ended its steps. */
    for (uint32_t i = 0; i <= m->nworkers && !m->v.failed; i++) {
        const worker *w = &m->workers[i];
        if (i == m->victim || w->done)
            continue;
        char msg[200];
        uint32_t r0 = 0;
        snprintf(msg, sizeof msg,
                 "deadlock: worker %u (rank %u) stuck at step %" PRIu64
                 " (range %u closed tensor 0 up to %" PRIu64 ")",
                 w->id, w->rank, w->clock[0].step, r0, m->heads[r0].closed[0]);
        sim_fail(&m->v, "%s", msg);
    }
    int failed = m->v.failed;
    if (failed)
        snprintf(why, why_len, "%s", m->v.why);
    for (uint32_t r = 0; r < m->nranges; r++)
        cps__sync_destroy(m->heads[r].sync);
    for (uint32_t i = 0; i <= m->nworkers; i++)
        cps__sess_destroy(m->workers[i].sess);
    free(m);
    return failed;
}

int main(int argc, char **argv)
{
    sim_seed_args a;
    if (sim_seed_args_parse(argc, argv, "sim_replace", "--no-first", &a) != 0)
        return 2;
    sim_seed_tally t = {0, 0};
    for (uint64_t s = a.seed; s < a.seed + a.seeds; s++) {
        char why[512] = "";
        int rc = run_seed(s, a.variant, a.verbose, why, sizeof why);
        if (sim_seed_count(&t, "sim_replace", s, rc, why) < 0)
            return 1;
    }
    sim_seed_summary(&t, "sim_replace", &a, "--no-first");
    return sim_seed_end(&t, &a, "--no-first");
}
