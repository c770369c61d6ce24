/* sim_collective: seeded model of the ring all-reduce (replication/collective.c) among 2..6
 * workers while workers are killed -9 and replaced.
 *
 * Every worker runs the production state machine (cps__coll); the model fakes only what its shell
 * (src/worker/collective.c) and the rest of the job provide: the network, the clock, and the
 * scheduler's views.
 * - Network: the real transport keeps one NN_PUSH pipe per ordered pair of nodes (transport.h),
 *   so messages from one node to another arrive in the order they were sent, after a random delay;
 *   messages of different pairs interleave freely. Nothing is lost while both ends live. A node
 *   killed -9 loses what its pipes had not delivered yet: the model delivers a random prefix of
 *   each of its pipes and drops the rest; messages to a dead node go nowhere.
 * - Scheduler: it declares a killed worker dead a random while after the kill (its connection
 *   closed) and publishes a view without it; with some seeds it then adds a replacement of the
 *   same rank (--restart-workers), which the shell marks as joining. Each worker receives each
 *   view at its own moment (one pipe from the scheduler, in order), and a worker whose ring saw a
 *   newer epoch asks for the latest view (CPS_COLL_NEED_VIEW), as the shell does.
 * - Clock: simulated milliseconds; every running worker ticks every TICK_MS.
 *
 * Checked on every seed: all live workers that complete collective k hold bitwise the same
 * result; that result is bitwise the fixed-order reduction of the inputs of exactly the members of
 * one view epoch (inputs differ per worker and per collective, so a mix of two epochs matches no
 * epoch); every worker's input counts in one collective at most (a replacement may give zeros
 * instead, to a collective it skipped: cps__coll helps the ring through it so); a collective
 * completes, or fails CPS_ENOPEER when the failing worker's view holds no
 * peer (CPS_ETIMEDOUT, a hang, is a failure of the seed); and a second run of the seed gives the
 * same results and the same event count (determinism). Nothing else is accepted: a replacement
 * gets the ring's next sequence number and the last result from the worker it fetches from, as
 * cps_allreduce_fetch does, so the job's end racing a replacement must complete too.
 *
 * The fetch goes over the network like the ring's messages: requests, and answers in parts
 * (replication/ring_fetch.c) of at most half the shared state, 1 to 3 parts per request, so
 * every fetch takes several parts and a sharer that completes a collective between two requests
 * answers with another identity; parts lost with a killed sharer are asked again. An assembled
 * state must be one collective's throughout.
 * --guess-seq: replacements fetch nothing and guess the ring's sequence (cps__coll_set_joining);
 * the job's end can then still race them (11 seeds of 20,000 hang: known, documented).
 * --no-adopt: the state and the result exceed one message; in parts the result travels anyway.
 * --old-peers: answers in one message, as between workers that predate parts; with --no-adopt the
 * result then stays behind and replacements help with zeros (sim.collective_oldpeers).
 * --slow-parts: a part's time on its pipe grows with its values, a whole part's up to three
 * times CPS_FETCH_RESEND_MS (a large part over a slow link), so parts arrive after their request
 * was sent again and must still count (sim.collective_slowparts).
 * The sharer sends a window once per asker (cps__fetch_serve_again), as the shell does. It
 * answers whenever it is alive, where the shell answers only inside a call after a share: not
 * modelled.
 * --slow: one worker stalls once (its messages leave late, none is lost) for up to 90% of the
 * timeout, moved onto the predecessor of a replacement that a view made listen when there is
 * one; the same checks hold (sim.collective_slow).
 *
 * With --mix-epochs the shell's fencing is undone: a message of an older epoch than the
 * receiver's is relabelled with the receiver's epoch before delivery. Seeds must then fail.
 *
 * usage: sim_collective [--seed N] [--seeds K] [--mix-epochs] [--guess-seq] [--no-adopt]
 * [--old-peers] [--slow] [--slow-parts]
 * [-v]   (-v with SIM_TRACE=1 in the environment also prints every message delivered)
 */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "seed_args.h"
#include "chainps/error.h"
#include "replication/collective.h"
#include "replication/ring_fetch.h"

#define MAX_ORIG     6
#define MAX_REPL     2
#define MAX_W        (MAX_ORIG + MAX_REPL)
#define SCHED        MAX_W /* the scheduler's link index */
#define MAX_VIEWS    16
#define MAX_SEQ      6
#define MAX_N        48
#define MAX_RECORDS  (MAX_W * (MAX_SEQ + 2))
#define TIMEOUT_MS   30000 /* CHAINPS_UNAVAILABLE_TIMEOUT_MS's default */
#define TICK_MS      500
#define TIME_LIMIT   (20 * TIMEOUT_MS)
#define REPL_ID_BASE 100u

#define MAX_S 8 /* values of a worker's shared state (its parameters) */
enum {
    EV_MSG,
    EV_VIEW,
    EV_GETVIEW,
    EV_START,
    EV_TICK,
    EV_KILL,
    EV_DECLARE,
    EV_JOIN,
    EV_FREQ,  /* a replacement's request for a shared state (m.seq = its number, m.index = from) */
    EV_FPART, /* a part of the answer (part, status; whole: an answer in one message) */
    EV_FTICK  /* a fetching replacement's loop comes round (cps_allreduce_fetch's 50 ms wait) */
};

typedef struct event {
    uint64_t t, order;
    int type;
    uint32_t from, to; /* worker indices (SCHED for the scheduler) */
    uint64_t epoch;
    cps__coll_msg m;
    float *vals; /* owned copy of m.vals */
    int status, whole;
    cps__fetch_part part;
} event;

typedef struct view {
    uint32_t members[MAX_W]; /* node ids in rank order */
    uint32_t n;
} view;

typedef struct worker {
    uint32_t id, rank;
    int exists, alive, done, repl;
    int killed; /* its results no longer count: the live ones need not agree with them */
    cps__coll *c;
    uint64_t epoch;     /* the last view installed */
    uint64_t calls;     /* collectives started */
    uint64_t completed; /* the seq of the last completed collective */
    int running, tick_pending;
    float in[MAX_N], buf[MAX_N];
    float repl_in[MAX_SEQ + 1][MAX_N]; /* a replacement: its input, by the seq it completed */
    int repl_known[MAX_SEQ + 1];
    uint64_t repl_call[MAX_SEQ + 1]; /* which of its calls that input was (w->calls then) */
    /* a replacement's cps_allreduce_fetch (replication/ring_fetch.c decides) */
    cps__fetch fetch;
    int fetching, ftick_pending;
    uint64_t fetched_next; /* an answer in one message: its header's aux */
    float fstate[MAX_S], fres[MAX_N];
    cps__fetch_served served[CPS_FETCH_SERVED_ASKERS]; /* as a sharer (ring_fetch.h) */
} worker;

typedef struct record {
    uint32_t w;
    uint64_t seq;
    float out[MAX_N];
} record;

typedef struct model {
    uint64_t rng, seed;
    uint32_t norig, nw, n, chunk, seqs;
    int op, mix, verbose;
    sim_verdict v;
    worker w[MAX_W];
    int in_view[MAX_W]; /* the scheduler's membership */
    view views[MAX_VIEWS + 1];
    uint32_t nviews;
    uint64_t link_last[MAX_W + 1][MAX_W + 1];
    event *heap;
    size_t nheap, capheap;
    uint64_t order, now, events;
    record rec[MAX_RECORDS];
    uint32_t nrec;
    uint64_t hash;
    uint32_t restarts, results_taken, enopeer;
    int guess;     /* --guess-seq: replacements fetch nothing and guess the ring's seq */
    int no_adopt;  /* --no-adopt: the state and the result exceed one message */
    int old_peers; /* --old-peers: answers in one message, the result left out when too big */
    uint32_t slen; /* values of the shared state */
    uint32_t part, window; /* values per part, parts per request */
    uint32_t msg_limit;    /* values one message holds (CPS_WIRE_MAX_PAYLOAD, scaled down) */
    uint32_t fetch_parts;  /* parts taken by replacements (printed) */
    uint32_t fetches;      /* fetches that brought a state */
    int slow;              /* --slow: a worker stalls (its messages wait) for a while */
    uint32_t slow_w;       /* which */
    uint64_t slow_from, slow_until;
    uint32_t slow_delayed; /* messages the stall held back */
    int slow_aimed;        /* the stall was moved onto a listening replacement's predecessor */
    uint64_t part_ms;      /* --slow-parts: a whole part's time on the pipe (0: none) */
} model;

static uint64_t total_slowed;               /* over all seeds (printed with --slow) */
static uint64_t total_fetches, total_parts; /* replacements' fetches done, parts they took */

static uint64_t rnd(model *m, uint64_t n)
{
    return sim_draw(&m->rng, n);
}

/* ---- the event queue: a binary heap on (t, order) ---- */

static int ev_less(const event *a, const event *b)
{
    return a->t < b->t || (a->t == b->t && a->order < b->order);
}

static void post(model *m, uint64_t at, event e)
{
    if (m->nheap == m->capheap) {
        size_t cap = m->capheap ? 2 * m->capheap : 256;
        event *h = realloc(m->heap, cap * sizeof *h);
        if (!h) {
            fprintf(stderr, "sim_collective: out of memory\n");
            exit(2);
        }
        m->heap = h;
        m->capheap = cap;
    }
    e.t = at;
    e.order = m->order++;
    size_t i = m->nheap++;
    while (i > 0 && ev_less(&e, &m->heap[(i - 1) / 2])) {
        m->heap[i] = m->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    m->heap[i] = e;
}

static int pop(model *m, event *out)
{
    if (m->nheap == 0)
        return 0;
    *out = m->heap[0];
    event last = m->heap[--m->nheap];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, best = i;
        const event *b = &last;
        if (l < m->nheap && ev_less(&m->heap[l], b))
            best = l, b = &m->heap[l];
        if (l + 1 < m->nheap && ev_less(&m->heap[l + 1], b))
            best = l + 1;
        if (best == i)
            break;
        m->heap[i] = m->heap[best];
        i = best;
    }
    if (m->nheap)
        m->heap[i] = last;
    return 1;
}

/* One pipe per ordered pair: a message never overtakes an earlier one of the same pair. */
static uint64_t link_at(model *m, uint32_t from, uint32_t to)
{
    uint64_t at = m->now + 1 + rnd(m, 20);
    /* --slow: what a stalled worker sends leaves when the stall ends (descheduled, swapping, a
     * long GC pause): late, never lost; the pipe stays in order. */
    if (m->slow && from == m->slow_w && m->now >= m->slow_from && m->now < m->slow_until) {
        at = m->slow_until + rnd(m, 20);
        m->slow_delayed++;
    }
    if (at <= m->link_last[from][to])
        at = m->link_last[from][to] + rnd(m, 2);
    m->link_last[from][to] = at;
    return at;
}

/* ---- inputs and the reference reduction ---- */

/* Worker `id`'s contribution to collective `key`: values with varied exponents, so the order of
 * the additions shows in the bits, and a value from another worker or collective is noticed. */
static float input_value(uint64_t seed, uint32_t id, uint64_t key, uint32_t j)
{
    uint64_t h =
        sim_mix64(seed * 0x9e3779b97f4a7c15ull ^ sim_mix64(((uint64_t)id << 40) ^ (key << 20) ^ j));
    int32_t mant = (int32_t)(h & 0xffffff) - 0x800000;
    return ldexpf((float)mant, -(int)((h >> 32) % 24));
}

static int worker_of(const model *m, uint32_t id)
{
    for (uint32_t i = 0; i < m->nw; i++)
        if (m->w[i].id == id)
            return (int)i;
    return -1;
}

/* The input of node `id` to collective `seq`, or NULL if unknown (a replacement that never
 * completed `seq`: its buffer's identity with that seq is not known). A replacement with
 * `zero` gives zeros: it helps the ring through a collective it skipped (its state came from a
 * member that completed it), and its buffer belongs to its own call. */
static const float *input_of(const model *m, uint32_t id, uint64_t seq, int zero, float *tmp)
{
    int wi = worker_of(m, id);
    if (wi < 0)
        return NULL;
    const worker *w = &m->w[wi];
    if (w->repl && zero) {
        memset(tmp, 0, m->n * sizeof(float));
        return tmp;
    }
    if (w->repl)
        return seq <= MAX_SEQ && w->repl_known[seq] ? w->repl_in[seq] : NULL;
    for (uint32_t j = 0; j < m->n; j++)
        tmp[j] = input_value(m->seed, id, seq, j);
    return tmp;
}

/* The documented order: segment s is ((x[s] + x[s+1]) + ...) + x[s-1] over ring positions, the
 * last addition divided by P for a mean. 1 if view `v`'s reduction of `seq` is computable.
 * Member positions in `zmask` (replacements only) give zeros (input_of). */
static int reference(const model *m, const view *v, uint64_t seq, uint32_t zmask, float *out)
{
    static float in[MAX_W][MAX_N];
    uint32_t p = v->n;
    if (p < 2)
        return 0;
    for (uint32_t i = 0; i < p; i++) {
        const float *x = input_of(m, v->members[i], seq, (zmask >> i) & 1, in[i]);
        if (!x)
            return 0;
        if (x != in[i])
            memcpy(in[i], x, m->n * sizeof(float));
    }
    for (uint32_t s = 0; s < p; s++) {
        uint64_t lo, hi;
        cps__coll_segment(m->n, p, s, &lo, &hi);
        for (uint64_t j = lo; j < hi; j++) {
            float acc = in[s][j];
            for (uint32_t k = 1; k < p; k++) {
                float own = in[(s + k) % p][j];
                if (k == p - 1 && m->op == CPS_COLL_MEAN)
                    acc = (acc + own) / (float)p;
                else
                    acc = acc + own;
            }
            out[j] = acc;
        }
    }
    return 1;
}

/* ---- the workers' shell ---- */

static void schedule_tick(model *m, uint32_t wi)
{
    if (m->w[wi].tick_pending)
        return;
    m->w[wi].tick_pending = 1;
    post(m, m->now + TICK_MS, (event){.type = EV_TICK, .to = wi});
}

static void on_finish(model *m, uint32_t wi, const cps__coll_act *a)
{
    worker *w = &m->w[wi];
    w->running = 0;
    if (a->kind == CPS_COLL_FAILED) {
        const view *v = &m->views[w->epoch];
        if (a->status == CPS_ENOPEER && v->n == 1) {
            m->enopeer++; /* every peer gone: the documented error; the program ends */
        } else {
            /* Among them the job's end racing a replacement (a survivor restarting the last
             * collective with a replacement that ran none of it, or a replacement starting one
             * after the others ended): once accepted, now a failure (cps__coll_set_next_seq,
             * CPS_COLL_ASK). */
            sim_fail(&m->v,
                     "worker %u's collective %" PRIu64 " failed %s under epoch %" PRIu64
                     " (%u members)%s",
                     w->id, a->seq, cps_strerror(a->status), w->epoch, v->n,
                     a->status == CPS_ETIMEDOUT ? ": it hung" : "");
        }
        w->done = 1;
        w->alive = 0;
        return;
    }
    if (!w->repl && a->seq != w->calls) {
        sim_fail(&m->v,
                 "worker %u completed collective %" PRIu64 " while running its call %" PRIu64,
                 w->id, a->seq, w->calls);
        return;
    }
    if (a->seq > m->seqs || m->nrec == MAX_RECORDS) {
        sim_fail(&m->v, "worker %u completed collective %" PRIu64 " (the job runs %u)", w->id,
                 a->seq, m->seqs);
        return;
    }
    if (w->repl) {
        memcpy(w->repl_in[a->seq], w->in, m->n * sizeof(float));
        w->repl_known[a->seq] = 1;
        w->repl_call[a->seq] = w->calls;
    }
    record *r = &m->rec[m->nrec++];
    r->w = wi;
    r->seq = a->seq;
    memcpy(r->out, w->buf, m->n * sizeof(float));
    for (uint32_t j = 0; j < m->n; j++) {
        uint32_t bits;
        memcpy(&bits, &w->buf[j], sizeof bits);
        m->hash = sim_mix64(m->hash ^ bits ^ (a->seq << 32) ^ ((uint64_t)w->id << 48));
    }
    m->hash = sim_mix64(m->hash ^ m->now);
    w->completed = a->seq;
    if (m->verbose)
        printf("  t=%" PRIu64 " worker %u completes collective %" PRIu64 " under epoch %" PRIu64
               "\n",
               m->now, w->id, a->seq, a->epoch);
    if (a->seq >= m->seqs) {
        w->done = 1;
        return;
    }
    post(m, m->now + rnd(m, 30), (event){.type = EV_START, .to = wi}); /* compute, then call */
}

static void perform(model *m, uint32_t wi)
{
    worker *w = &m->w[wi];
    const cps__coll_act *acts;
    size_t n = cps__coll_actions(w->c, &acts);
    for (size_t i = 0; i < n && !m->v.failed; i++) {
        const cps__coll_act *a = &acts[i];
        switch (a->kind) {
        case CPS_COLL_SEND: {
            int to = worker_of(m, a->to);
            if (to < 0) {
                sim_fail(&m->v, "worker %u sends to unknown node %u", w->id, a->to);
                break;
            }
            event e = {.type = EV_MSG, .from = wi, .to = (uint32_t)to, .m = a->msg};
            e.vals = malloc((a->msg.count ? a->msg.count : 1) * sizeof(float));
            if (!e.vals) {
                fprintf(stderr, "sim_collective: out of memory\n");
                exit(2);
            }
            if (a->msg.count)
                memcpy(e.vals, a->msg.vals, a->msg.count * sizeof(float));
            /* A joining replacement moves its call to the ring's seq: what it sends says which
             * collective its input went into. */
            if (w->repl && a->msg.kind == CPS_COLL_DATA && a->msg.seq <= MAX_SEQ) {
                memcpy(w->repl_in[a->msg.seq], w->in, m->n * sizeof(float));
                w->repl_known[a->msg.seq] = 1;
                w->repl_call[a->msg.seq] = w->calls;
            }
            e.m.vals = e.vals;
            post(m, link_at(m, wi, (uint32_t)to), e);
            break;
        }
        case CPS_COLL_NEED_VIEW:
            post(m, link_at(m, wi, SCHED), (event){.type = EV_GETVIEW, .from = wi});
            break;
        case CPS_COLL_DONE:
        case CPS_COLL_FAILED:
            on_finish(m, wi, a);
            break;
        }
    }
}

static void start_call(model *m, uint32_t wi)
{
    worker *w = &m->w[wi];
    if (!w->alive || w->done || w->running)
        return;
    w->calls++;
    for (uint32_t j = 0; j < m->n; j++)
        w->in[j] = input_value(m->seed, w->id, w->repl ? 1000 + w->calls : w->calls, j);
    memcpy(w->buf, w->in, m->n * sizeof(float));
    uint64_t seq;
    w->running = 1;
    int rc = cps__coll_start(w->c, w->buf, m->n, m->op, m->now, &seq);
    if (rc != 0) {
        sim_fail(&m->v, "worker %u: cps__coll_start: %s", w->id, cps_strerror(rc));
        return;
    }
    schedule_tick(m, wi);
    perform(m, wi);
}

/* The shared state of a worker that completed collective `k`: its parameters, the same on every
 * worker that completed k. An assembled fetch holds one k's values throughout, or it mixed. */
static float state_value(uint64_t seed, uint64_t k, uint32_t j)
{
    return input_value(seed, 999, 5000 + k, j);
}

static void fetch_done(model *m, uint32_t wi, int result)
{
    worker *w = &m->w[wi];
    w->fetching = 0;
    uint64_t at = 0, rn = 0;
    if (result == 1) {
        m->fetches++;
        uint64_t next = w->fetched_next ? w->fetched_next : w->fetch.next;
        rn = w->fetch.total - m->slen;
        at = next - 1;
        for (uint32_t j = 0; j < m->slen; j++)
            if (w->fstate[j] != state_value(m->seed, at, j)) {
                sim_fail(&m->v,
                         "replacement %u fetched a state that is not collective %" PRIu64
                         "'s (value %u): parts of two answers mixed",
                         w->id, at, j);
                return;
            }
        if (cps__coll_set_next_seq(w->c, next, w->running) != 0) {
            sim_fail(&m->v, "replacement %u: cps__coll_set_next_seq failed", w->id);
            return;
        }
        perform(m, wi);
        if (rn && cps__coll_adopt_result(w->c, at, w->fres, rn) != 0) {
            sim_fail(&m->v, "replacement %u: cps__coll_adopt_result failed", w->id);
            return;
        }
        perform(m, wi);
    } else if (result == CPS_ETIMEDOUT) {
        sim_fail(&m->v, "replacement %u's fetch hung", w->id);
        return;
    }
    /* Otherwise nobody shares anything (CPS_ENOTFOUND, CPS_ENOPEER): the sequence is guessed. */
    if (m->verbose)
        printf("  t=%" PRIu64 " replacement %u fetched (%s): next collective %" PRIu64 ", %" PRIu64
               " values of result\n",
               m->now, w->id, result == 1 ? "ok" : cps_strerror(result), at + 1, rn);
    if (at >= m->seqs)
        w->done = 1;
    else
        post(m, m->now + 1 + rnd(m, 20), (event){.type = EV_START, .to = wi});
}

/* cps_allreduce_fetch's loop: ask, wait, ask again, until the fetch ends. */
static void fetch_drive(model *m, uint32_t wi)
{
    worker *w = &m->w[wi];
    if (!w->alive || !w->fetching)
        return;
    const view *v = &m->views[w->epoch];
    cps__node_info nodes[MAX_W];
    for (uint32_t i = 0; i < v->n; i++)
        nodes[i] = (cps__node_info){.id = v->members[i], .role = CPS_ROLE_WORKER, .alive = 1};
    cps__view cv = {.epoch = w->epoch, .nnodes = v->n, .nodes = nodes};
    for (;;) {
        uint32_t to;
        uint64_t req;
        int result;
        int what =
            cps__fetch_next(&w->fetch, &cv, v->members, v->n, w->id, 0, m->now, &to, &req, &result);
        if (what == CPS_FETCH_DONE) {
            fetch_done(m, wi, result);
            return;
        }
        if (what == CPS_FETCH_WAIT)
            break;
        int ti = worker_of(m, to);
        if (ti < 0) {
            sim_fail(&m->v, "replacement %u asks unknown node %u", w->id, to);
            return;
        }
        event e = {.type = EV_FREQ, .from = wi, .to = (uint32_t)ti};
        if (m->verbose > 1)
            printf("  t=%" PRIu64 " %u -> %u: fetch request %" PRIu64 " from value %" PRIu64 "\n",
                   m->now, w->id, to, req, w->fetch.ask);
        e.m.seq = req;
        e.m.index = w->fetch.ask;
        post(m, link_at(m, wi, (uint32_t)ti), e);
    }
    if (!w->ftick_pending) {
        w->ftick_pending = 1;
        post(m, m->now + 50, (event){.type = EV_FTICK, .to = wi});
    }
}

/* The sharer (any live worker, done or not): its answer (replication/ring_fetch.c), over its
 * pipe to the asker, in parts; with --old-peers in one message, the result left out when the two
 * exceed a message. */
static void fetch_serve(model *m, uint32_t si, uint32_t ri, uint64_t req, uint64_t from)
{
    worker *s = &m->w[si];
    uint64_t rseq = 0, rn = 0, total = 0;
    const float *rvals = NULL;
    int has = cps__coll_last_result(s->c, &rseq, &rvals, &rn);
    uint64_t k = s->completed, share = k > 0 ? m->slen : 0;
    event e = {.type = EV_FPART, .from = si, .to = ri};
    e.m.seq = req;
    if (!m->old_peers && !cps__fetch_serve_again(s->served, m->w[ri].id, k, from, m->now))
        return; /* that window is still on its way: the shell sends nothing again */
    float vals[MAX_S + MAX_N];
    for (uint32_t j = 0; j < m->slen; j++)
        vals[j] = state_value(m->seed, k, j);
    if (has)
        memcpy(vals + m->slen, rvals, rn * sizeof(float));
    e.part = (cps__fetch_part){.gen = k, .step = k, .next = k + 1};
    if (m->old_peers) {
        int with = 0;
        e.whole = 1;
        e.status = cps__fetch_serve(share, m->slen, k, has, rseq, rn, &with);
        with = with && m->slen + rn <= m->msg_limit;
        e.part.count = e.status == 0 ? m->slen + (with ? rn : 0) : 0;
    } else {
        e.status = cps__fetch_serve_parts(share, m->slen, k, has, rseq, rn, from, &total);
    }
    if (e.status != 0 || e.whole) {
        e.vals = malloc((e.part.count + 1) * sizeof(float));
        if (!e.vals) {
            fprintf(stderr, "sim_collective: out of memory\n");
            exit(2);
        }
        memcpy(e.vals, vals, e.part.count * sizeof(float));
        post(m, link_at(m, si, ri), e);
        return;
    }
    e.part.total = total;
    for (uint32_t i = 0; cps__fetch_part_at(from, total, m->part, m->window, i, &e.part.off,
                                            &e.part.count, &e.part.last);
         i++) {
        event p = e;
        p.vals = malloc(p.part.count * sizeof(float));
        if (!p.vals) {
            fprintf(stderr, "sim_collective: out of memory\n");
            exit(2);
        }
        memcpy(p.vals, vals + p.part.off, p.part.count * sizeof(float));
        uint64_t at = link_at(m, si, ri);
        if (m->part_ms) {
            /* --slow-parts: the part's bytes take their time on the pipe, and the next part
             * leaves after them. */
            at += m->part_ms * p.part.count / m->part;
            m->link_last[si][ri] = at;
        }
        if (m->verbose > 1)
            printf("  t=%" PRIu64 " %u -> %u: part %" PRIu64 "+%" PRIu64 " of %" PRIu64
                   " (request %" PRIu64 ") arrives at t=%" PRIu64 "\n",
                   m->now, s->id, m->w[ri].id, p.part.off, p.part.count, total, req, at);
        post(m, at, p);
        cps__fetch_served_note(s->served, m->w[ri].id, k, from, p.part.off + p.part.count, m->now);
    }
}

/* A part (or a whole answer) reaches the fetching replacement: the shell's copy. */
static void fetch_receive(model *m, uint32_t ri, const event *e)
{
    worker *w = &m->w[ri];
    if (!w->alive || !w->fetching)
        return;
    uint32_t from = m->w[e->from].id;
    const cps__fetch_part *p = &e->part;
    if (e->whole) {
        if (cps__fetch_answer(&w->fetch, from, e->m.seq, e->status, p->count, p->step)) {
            memcpy(w->fstate, e->vals, m->slen * sizeof(float));
            memcpy(w->fres, e->vals + m->slen, (p->count - m->slen) * sizeof(float));
            w->fetched_next = p->next;
            w->fetch.total = p->count; /* past slen: the result */
        }
    } else if (cps__fetch_part_take(&w->fetch, from, e->m.seq, e->status, p, m->now)) {
        m->fetch_parts++;
        uint64_t nstate, roff;
        cps__fetch_part_split(p->off, p->count, m->slen, &nstate, &roff);
        memcpy(w->fstate + p->off, e->vals, nstate * sizeof(float));
        memcpy(w->fres + roff, e->vals + nstate, (p->count - nstate) * sizeof(float));
    }
    fetch_drive(m, ri);
}

static void deliver_view(model *m, uint32_t wi, uint64_t epoch)
{
    worker *w = &m->w[wi];
    if (!w->alive || epoch <= w->epoch)
        return;
    const view *v = &m->views[epoch];
    int first = w->epoch == 0;
    if (cps__coll_view(w->c, epoch, v->members, v->n, 1, m->now) != 0) {
        sim_fail(&m->v, "worker %u: cps__coll_view failed", w->id);
        return;
    }
    w->epoch = epoch;
    if (cps__coll_running(w->c))
        m->restarts++;
    if (m->slow && w->repl && !first && cps__coll_running(w->c) && v->n > 1 && !m->slow_aimed) {
        /* --slow, aimed: a running replacement re-formed by a view waits for its predecessor;
         * that predecessor now stalls past half the timeout (a timer there once let the
         * replacement go on with a seq of its own). */
        for (uint32_t i = 0; i < v->n; i++)
            if (v->members[i] == w->id) {
                int p = worker_of(m, v->members[(i + v->n - 1) % v->n]);
                if (p >= 0) {
                    m->slow_aimed = 1;
                    m->slow_w = (uint32_t)p;
                    m->slow_from = m->now;
                    m->slow_until = m->now + TIMEOUT_MS / 2 + rnd(m, TIMEOUT_MS * 3 / 10);
                    if (m->verbose)
                        printf("  t=%" PRIu64 " worker %u stalls until t=%" PRIu64 "\n", m->now,
                               m->w[p].id, m->slow_until);
                }
                break;
            }
    }
    perform(m, wi);
    if (first && w->repl && !m->guess) {
        /* cps_allreduce_fetch, over the network: the first live member that shares something
         * (it completed a collective) answers in parts with its state, the sequence number of
         * the collective that follows it and that collective's predecessor's result. A
         * replacement that arrives after the last collective has nothing to run, but keeps
         * answering the ring (it sits in cps_barrier). With --guess-seq the replacement fetches
         * nothing and guesses the ring's sequence (cps__coll_set_joining). */
        cps__fetch_start(&w->fetch, m->slen, m->now, TIMEOUT_MS);
        w->fetching = 1;
        fetch_drive(m, wi);
    } else if (first && w->repl) {
        /* A program that guesses still ends when the job's collectives are over: one that
         * arrives after the last has nothing to run (it sits in cps_barrier). */
        uint64_t at = 0;
        for (uint32_t rank = 0; rank < m->norig && !at; rank++)
            for (uint32_t i = 0; i < m->nw && !at; i++)
                if (i != wi && m->w[i].alive && m->in_view[i] && m->w[i].rank == rank)
                    at = m->w[i].completed;
        if (at >= m->seqs)
            w->done = 1;
        else
            post(m, m->now + 1 + rnd(m, 20), (event){.type = EV_START, .to = wi});
    }
}

/* ---- the scheduler ---- */

static void publish(model *m)
{
    if (m->nviews == MAX_VIEWS) {
        sim_fail(&m->v, "too many views");
        return;
    }
    view *v = &m->views[++m->nviews];
    v->n = 0;
    /* Live workers in rank order; a replacement sorts where its dead predecessor stood. */
    for (uint32_t rank = 0; rank < m->norig; rank++)
        for (uint32_t i = 0; i < m->nw; i++)
            if (m->in_view[i] && m->w[i].rank == rank)
                v->members[v->n++] = m->w[i].id;
    if (m->verbose) {
        printf("  t=%" PRIu64 " view %u:", m->now, m->nviews);
        for (uint32_t i = 0; i < v->n; i++)
            printf(" %u", v->members[i]);
        printf("\n");
    }
    for (uint32_t i = 0; i < m->nw; i++)
        if (m->in_view[i])
            post(m, link_at(m, SCHED, i), (event){.type = EV_VIEW, .to = i, .epoch = m->nviews});
}

static void on_kill(model *m, uint32_t wi)
{
    worker *w = &m->w[wi];
    if (!w->alive)
        return;
    w->alive = 0;
    w->killed = 1;
    if (m->verbose)
        printf("  t=%" PRIu64 " worker %u killed -9 (running collective %" PRIu64 ": %d)\n", m->now,
               w->id, w->calls, w->running);
    /* Its pipes deliver a random prefix of what they hold; the rest dies with the process. */
    uint64_t cut[MAX_W];
    for (uint32_t i = 0; i < MAX_W; i++)
        cut[i] = m->now + rnd(m, 10);
    for (size_t i = 0; i < m->nheap; i++) {
        event *e = &m->heap[i];
        if ((e->type == EV_MSG || e->type == EV_FREQ || e->type == EV_FPART) && e->from == wi &&
            e->t > cut[e->to])
            e->type = -1 - e->type; /* dropped: left in the heap, ignored when popped */
    }
    /* The scheduler sees the connection close and declares it dead a while later. */
    post(m, m->now + 5 + rnd(m, 300), (event){.type = EV_DECLARE, .to = wi});
}

static void on_declare(model *m, uint32_t wi)
{
    m->in_view[wi] = 0;
    publish(m);
    /* --restart-workers: sometimes a replacement of the same rank comes. */
    if (m->nw < MAX_W && rnd(m, 2) == 0) {
        uint32_t ri = m->nw++;
        worker *r = &m->w[ri];
        memset(r, 0, sizeof *r);
        r->id = REPL_ID_BASE + ri;
        r->rank = m->w[wi].rank;
        r->repl = 1;
        post(m, m->now + 20 + rnd(m, 500), (event){.type = EV_JOIN, .to = ri});
    }
}

static void on_join(model *m, uint32_t ri)
{
    worker *r = &m->w[ri];
    if (cps__coll_create(r->id, m->chunk, TIMEOUT_MS, &r->c) != 0) {
        fprintf(stderr, "sim_collective: out of memory\n");
        exit(2);
    }
    cps__coll_set_joining(r->c);
    r->exists = r->alive = 1;
    m->in_view[ri] = 1;
    if (m->verbose)
        printf("  t=%" PRIu64 " replacement %u of rank %u joins\n", m->now, r->id, r->rank);
    publish(m);
}

/* ---- the checks at the end of a seed ---- */

/* Replacement members of view `v`, as a mask of positions. */
static uint32_t repl_positions(const model *m, const view *v)
{
    uint32_t mask = 0;
    for (uint32_t i = 0; i < v->n; i++) {
        int wi = worker_of(m, v->members[i]);
        if (wi >= 0 && m->w[wi].repl)
            mask |= 1u << i;
    }
    return mask;
}

static void check(model *m)
{
    float ref[MAX_N];
    /* The collective each replacement call's input counted in (0: none yet), by worker and call:
     * one contribution per member, so a call's input may count in one collective only. */
    static uint64_t counted_in[MAX_W][MAX_SEQ + 2];
    memset(counted_in, 0, sizeof counted_in);
    for (uint32_t i = 0; i < m->nrec && !m->v.failed; i++) {
        const record *r = &m->rec[i];
        for (uint32_t k = 0; k < i && !m->w[r->w].killed; k++)
            if (m->rec[k].seq == r->seq && !m->w[m->rec[k].w].killed) {
                if (memcmp(m->rec[k].out, r->out, m->n * sizeof(float)) != 0)
                    sim_fail(&m->v, "collective %" PRIu64 ": workers %u and %u hold different bits",
                             r->seq, m->w[m->rec[k].w].id, m->w[r->w].id);
                break;
            }
        /* Which views' reductions match, with which replacements giving zeros. The workers
         * (by index) whose input of their call counts in every match: their input surely went
         * into this result (a tiny input lost in rounding can match both ways: not counted). */
        int found = 0;
        uint32_t surely = ~0u; /* worker indices, as bits */
        for (uint32_t e = 1; e <= m->nviews; e++) {
            const view *v = &m->views[e];
            uint32_t rp = repl_positions(m, v);
            for (uint32_t z = 0; z <= rp; z++) {
                if ((z & ~rp) || !reference(m, v, r->seq, z, ref) ||
                    memcmp(ref, r->out, m->n * sizeof(float)) != 0)
                    continue;
                found = 1;
                uint32_t used = 0;
                for (uint32_t p = 0; p < v->n; p++)
                    if (((rp & ~z) >> p) & 1)
                        used |= 1u << worker_of(m, v->members[p]);
                surely &= used;
            }
        }
        if (!found && !m->v.failed) {
            sim_fail(&m->v,
                     "worker %u's result of collective %" PRIu64
                     " is no epoch's reduction of its members' inputs",
                     m->w[r->w].id, r->seq);
            break;
        }
        for (uint32_t wi = 0; wi < m->nw && !m->v.failed; wi++) {
            if (!((surely >> wi) & 1) || r->seq > MAX_SEQ)
                continue;
            uint64_t call = m->w[wi].repl_call[r->seq];
            if (call > MAX_SEQ + 1)
                continue;
            if (counted_in[wi][call] && counted_in[wi][call] != r->seq)
                sim_fail(&m->v,
                         "replacement %u's input of its call %" PRIu64
                         " counts in collectives %" PRIu64 " and %" PRIu64 " (twice)",
                         m->w[wi].id, call, counted_in[wi][call], r->seq);
            counted_in[wi][call] = r->seq;
        }
    }
    for (uint32_t i = 0; i < m->nw && !m->v.failed; i++) {
        const worker *w = &m->w[i];
        if (w->exists && w->alive && !w->done)
            sim_fail(&m->v, "worker %u never ended collective %" PRIu64 " (t=%" PRIu64 ")", w->id,
                     w->calls, m->now);
    }
}

static int no_adopt, old_peers, slow_parts;

static int run_seed(uint64_t seed, int mix, int guess, int slow, int verbose, uint64_t *hash,
                    char *why, size_t why_len)
{
    model *m = calloc(1, sizeof *m);
    if (!m)
        return -1;
    m->seed = seed;
    m->rng = seed * 0x2545f4914f6cdd1dull + 7;
    m->mix = mix;
    m->guess = guess;
    m->no_adopt = no_adopt;
    m->old_peers = old_peers;
    m->verbose = verbose;
    m->norig = m->nw = 2 + (uint32_t)rnd(m, MAX_ORIG - 1);
    m->n = 1 + (uint32_t)rnd(m, MAX_N);
    m->chunk = 1 + (uint32_t)rnd(m, rnd(m, 2) ? 4 : MAX_N);
    m->seqs = 2 + (uint32_t)rnd(m, MAX_SEQ - 1);
    m->op = rnd(m, 2) ? CPS_COLL_SUM : CPS_COLL_MEAN;
    uint32_t kills = (uint32_t)rnd(m, m->norig);
    /* The shared state and its answer: parts of at most half the state, so every fetch comes in
     * several parts, and windows of 1 to 3 parts. Drawn from a stream of their own, so the seeds
     * of --guess-seq (no fetch) run as they did before the fetch was modelled. */
    uint64_t frng = sim_mix64(seed ^ 0xfe7c4ull);
    m->slen = 2 + (uint32_t)sim_draw(&frng, MAX_S - 1);
    m->part = 1 + (uint32_t)sim_draw(&frng, m->slen / 2);
    m->window = 1 + (uint32_t)sim_draw(&frng, 3);
    m->msg_limit = no_adopt ? m->slen + (uint32_t)sim_draw(&frng, m->n) : MAX_S + MAX_N;
    if (slow_parts) {
        /* A whole part's time on the pipe: up to 3 re-send delays (a 64 MiB part over 1 GbE
         * takes ~0.54 s), so a part often arrives after its request was sent again. A stream
         * of its own, so the other draws stay as they were. */
        uint64_t prng = sim_mix64(seed ^ 0x5a7f5ull);
        m->part_ms = 1 + sim_draw(&prng, 3 * CPS_FETCH_RESEND_MS);
        /* ... but the whole answer within a third of the fetch's timeout. */
        uint64_t parts = (m->slen + m->n + m->part - 1) / m->part;
        if (m->part_ms * parts > TIMEOUT_MS / 3)
            m->part_ms = TIMEOUT_MS / 3 / parts;
    }
    if (verbose)
        printf("seed %" PRIu64 ": %u workers, %u values, chunk %u, %u collectives, %s, %u kills\n",
               seed, m->norig, m->n, m->chunk, m->seqs, m->op == CPS_COLL_SUM ? "sum" : "mean",
               kills);
    for (uint32_t i = 0; i < m->norig; i++) {
        worker *w = &m->w[i];
        w->id = 10 + i;
        w->rank = i;
        w->exists = w->alive = 1;
        m->in_view[i] = 1;
        if (cps__coll_create(w->id, m->chunk, TIMEOUT_MS, &w->c) != 0) {
            free(m);
            return -1;
        }
    }
    /* View 1, known to all at the start, as the job's first view is. */
    m->nviews = 1;
    m->views[1].n = m->norig;
    for (uint32_t i = 0; i < m->norig; i++)
        m->views[1].members[i] = m->w[i].id;
    for (uint32_t i = 0; i < m->norig; i++) {
        deliver_view(m, i, 1);
        post(m, rnd(m, 30), (event){.type = EV_START, .to = i});
    }
    /* Kills fall anywhere in the job: before, inside (any ring step, any chunk) or between
     * collectives. A ring step takes about 11 ms here. */
    uint64_t span = (uint64_t)m->seqs * 2 * m->norig * 12 * (1 + m->n / (m->chunk * m->norig));
    uint32_t order[MAX_ORIG];
    for (uint32_t i = 0; i < m->norig; i++)
        order[i] = i;
    for (uint32_t i = m->norig - 1; i > 0; i--) {
        uint32_t j = (uint32_t)rnd(m, i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (uint32_t k = 0; k < kills; k++)
        post(m, rnd(m, span), (event){.type = EV_KILL, .to = order[k]});
    if (slow) {
        /* One worker (an original, or the first replacement) stalls once, anywhere in the
         * job, for up to 90% of the ring's timeout: slow, not dead, so every collective must
         * still end with one epoch's inputs. Long stalls cross the joiner's half-timeout. */
        m->slow = 1;
        m->slow_w = (uint32_t)rnd(m, m->norig + 1);
        m->slow_from = rnd(m, span + 2000);
        m->slow_until = m->slow_from + rnd(m, TIMEOUT_MS * 9 / 10);
        if (verbose)
            printf("  worker index %u stalls from t=%" PRIu64 " to t=%" PRIu64 "\n", m->slow_w,
                   m->slow_from, m->slow_until);
    }
    event e;
    while (!m->v.failed && pop(m, &e)) {
        if (e.t > TIME_LIMIT) {
            sim_fail(&m->v, "simulated time passed %d ms", TIME_LIMIT);
            free(e.vals);
            break;
        }
        m->now = e.t;
        m->events++;
        worker *w = e.type >= 0 && e.to < MAX_W ? &m->w[e.to] : NULL;
        switch (e.type) {
        case EV_MSG:
            if (w->alive) {
                /* --mix-epochs: the fencing undone, an old epoch's message taken as current. */
                if (m->mix && e.m.epoch < w->epoch)
                    e.m.epoch = w->epoch;
                if (m->verbose > 1)
                    printf("  t=%" PRIu64 " %u -> %u: kind %u epoch %" PRIu64 " seq %" PRIu64
                           " index %" PRIu64 "\n",
                           m->now, e.m.from, w->id, e.m.kind, e.m.epoch, e.m.seq, e.m.index);
                cps__coll_step(w->c, &e.m, m->now);
                perform(m, e.to);
            }
            break;
        case EV_VIEW:
            deliver_view(m, e.to, e.epoch);
            break;
        case EV_GETVIEW:
            if (m->in_view[e.from])
                post(m, link_at(m, SCHED, e.from),
                     (event){.type = EV_VIEW, .to = e.from, .epoch = m->nviews});
            break;
        case EV_START:
            start_call(m, e.to);
            break;
        case EV_TICK:
            w->tick_pending = 0;
            if (w->alive && w->running) {
                cps__coll_tick(w->c, m->now);
                perform(m, e.to);
                if (w->running)
                    schedule_tick(m, e.to);
            }
            break;
        case EV_KILL:
            on_kill(m, e.to);
            break;
        case EV_DECLARE:
            on_declare(m, e.to);
            break;
        case EV_JOIN:
            on_join(m, e.to);
            break;
        case EV_FREQ:
            if (w->alive)
                fetch_serve(m, e.to, e.from, e.m.seq, e.m.index);
            break;
        case EV_FPART:
            fetch_receive(m, e.to, &e);
            break;
        case EV_FTICK:
            w->ftick_pending = 0;
            fetch_drive(m, e.to);
            break;
        default:
            break; /* a message that died with its sender */
        }
        free(e.vals);
    }
    while (pop(m, &e))
        free(e.vals);
    if (!m->v.failed)
        check(m);
    for (uint32_t i = 0; i < m->nw; i++) {
        cps__coll_stats st = {0};
        if (m->w[i].c) {
            cps__coll_stats_get(m->w[i].c, &st);
            m->results_taken += (uint32_t)st.results_taken;
            cps__coll_destroy(m->w[i].c);
        }
    }
    if (verbose)
        printf("  %" PRIu64 " events, %u views, %u results taken from a peer, %u ENOPEER, %u"
               " messages held by a stall\n",
               m->events, m->nviews, m->results_taken, m->enopeer, m->slow_delayed);
    *hash = sim_mix64(m->hash ^ m->events);
    total_slowed += m->slow_delayed;
    total_parts += m->fetch_parts;
    total_fetches += m->fetches;
    int failed = m->v.failed;
    if (failed)
        snprintf(why, why_len, "%s", m->v.why);
    free(m->heap);
    free(m);
    return failed;
}

int main(int argc, char **argv)
{
    /* This model's own switches beside the shared command line's variant (--mix-epochs). */
    int guess = 0, slow = 0, kept = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--guess-seq"))
            guess = 1;
        else if (!strcmp(argv[i], "--slow"))
            slow = 1;
        else if (!strcmp(argv[i], "--no-adopt"))
            no_adopt = 1;
        else if (!strcmp(argv[i], "--old-peers"))
            old_peers = 1;
        else if (!strcmp(argv[i], "--slow-parts"))
            slow_parts = 1;
        else
            argv[kept++] = argv[i];
    }
    argc = kept;
    sim_seed_args a;
    if (sim_seed_args_parse(argc, argv, "sim_collective", "--mix-epochs", &a) != 0) {
        fprintf(stderr,
                "  sim_collective also takes --guess-seq, --no-adopt, --old-peers, --slow and\n"
                "  --slow-parts\n");
        return 2;
    }
    sim_seed_tally t = {0, 0};
    for (uint64_t s = a.seed; s < a.seed + a.seeds; s++) {
        char why[512] = "";
        uint64_t h1 = 0, h2 = 0;
        int rc = run_seed(s, a.variant, guess, slow, a.verbose + (a.verbose && getenv("SIM_TRACE")),
                          &h1, why, sizeof why);
        if (rc == 0) {
            /* Determinism: the same seed again gives the same bits at the same moments. */
            rc = run_seed(s, a.variant, guess, slow, 0, &h2, why, sizeof why);
            if (rc == 0 && h1 != h2) {
                snprintf(why, sizeof why,
                         "a second run gave other results (%016" PRIx64 " then %016" PRIx64 ")", h1,
                         h2);
                rc = 1;
            }
        }
        if (sim_seed_count(&t, "sim_collective", s, rc, why) < 0)
            return 1;
    }
    sim_seed_summary(&t, "sim_collective", &a, "--mix-epochs");
    if (slow)
        printf("; %" PRIu64 " messages held back by stalls (both runs)", total_slowed);
    if (!guess)
        printf("; %" PRIu64 " fetches brought a state, in %" PRIu64 " parts (both runs)",
               total_fetches, total_parts);
    return sim_seed_end(&t);
}
