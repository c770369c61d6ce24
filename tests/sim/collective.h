/* sim_collective's model (collective.c describes it): its state, and what its files share.
 *
 *   collective.c          the checks, a seed, main
 *   collective_events.c   rnd, the event queue, the pipes' delays, the inputs and reference sums
 *   collective_workers.c  each worker's shell around cps__coll: calls, actions, views, kills,
 *                         and the scheduler's views and replacements
 *   collective_fetch.c    a replacement's fetch of the shared state, in parts, over the network */
#ifndef CPS_SIM_COLLECTIVE_H
#define CPS_SIM_COLLECTIVE_H

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
#include "recovery/workers_end.h"

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
#define MAX_S        8 /* values of a worker's shared state (its parameters) */

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
    EV_FTICK, /* a fetching replacement's loop comes round (cps_allreduce_fetch's 50 ms wait) */
    EV_BARRIER, /* a worker past its last collective shares and enters cps_barrier */
    EV_BYE      /* a worker released from the barrier (or told the job ended) closes: goodbye */
};

/* Messages a worker's inbox holds while its program computes between two calls (the shell reads
 * them only inside a call): at most this many. */
#define MAX_HELD 256

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
    int settled; /* the scheduler's word: no worker rank awaits a replacement (workers_end.h) */
} view;

typedef struct worker {
    uint32_t id, rank;
    int exists, alive, done, repl;
    int bye;         /* it finished: released from cps_barrier (or its fetch said the job ended), it
                        said goodbye in cps_close and left */
    int ended;       /* a replacement whose fetch said the job has ended (CPS_ESHUTDOWN) */
    int fetched;     /* a replacement whose fetch brought a state */
    int ever_shared; /* it called cps_allreduce_share with a state at least once */
    int killed;      /* its results no longer count: the live ones need not agree with them */
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
    /* The program around the shell: it is inside a call (its loop reads the inbox) while a
     * collective runs, while it fetches, in cps_barrier after its last collective, and for
     * `tail_until` past a completion (the rest of that loop turn, before the program shares the
     * new state); between calls what arrives waits in `held`, read at the next call's start. */
    int in_barrier;
    uint64_t tail_until;
    int sharing;     /* it called cps_allreduce_share ... */
    uint64_t shared; /* ... last with the state of collective `shared` (0: before the first) */
    event *held;
    uint32_t nheld;
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
    /* The programs (a stream of their own): whether they share their first state before the
     * first collective (allreduce_app) or only after it (chainps.torch), and whether a
     * replacement shares what it fetched at once (allreduce_app) or after its first step. */
    uint64_t prng;
    int share_at_start, share_after_fetch;
    uint64_t compute_ms; /* a step's computing between calls takes up to this much more (0: none) */
    uint32_t held_msgs;  /* messages that waited for a call (printed) */
    uint32_t held_reqs;  /* of them, fetch requests */
    uint32_t tail_answers; /* answers given past a completion, before the share */
    /* --end-kills: one or two workers are killed in the job's last collective (the first
     * worker's start of it arms them), and every killed worker is replaced. */
    int end_kills, end_armed;
    uint32_t end_n; /* how many it kills */
    /* --end-kills also kills some replacements once they held the final state (its fetch
     * succeeded, or it completed the last collective), from the stream `erng` (the other draws
     * stay as they were until the first such kill); `owed`: kills whose replacement has not been
     * created yet, so that a replacement is only killed while a slot for its own remains. */
    uint64_t erng;
    uint32_t owed, repl_kills;
    uint32_t job_ends;      /* replacements told the job has ended (CPS_ESHUTDOWN) */
    uint32_t final_fetches; /* replacements that fetched the final state */
    uint32_t left;          /* workers released from the barrier that left */
    unsigned char held_scratch[MAX_W];
} model;

uint64_t rnd(model *m, uint64_t n);

void post(model *m, uint64_t at, event e);

int pop(model *m, event *out);

/* One pipe per ordered pair: a message never overtakes an earlier one of the same pair. */
uint64_t link_at(model *m, uint32_t from, uint32_t to);

/* Worker `id`'s contribution to collective `key`: values with varied exponents, so the order of
 * the additions shows in the bits, and a value from another worker or collective is noticed. */
float input_value(uint64_t seed, uint32_t id, uint64_t key, uint32_t j);

int worker_of(const model *m, uint32_t id);

/* The documented order: segment s is ((x[s] + x[s+1]) + ...) + x[s-1] over ring positions, the
 * last addition divided by P for a mean. 1 if view `v`'s reduction of `seq` is computable.
 * Member positions in `zmask` (replacements only) give zeros (input_of). */
int reference(const model *m, const view *v, uint64_t seq, uint32_t zmask, float *out);

void schedule_tick(model *m, uint32_t wi);

void perform(model *m, uint32_t wi);

void start_call(model *m, uint32_t wi);

void deliver_view(model *m, uint32_t wi, uint64_t epoch);

void on_kill(model *m, uint32_t wi);

/* The scheduler declares worker wi dead (`failed`: its program exited on an error, and is not
 * replaced) and publishes a view without it. */
void on_declare(model *m, uint32_t wi, int failed);

/* The scheduler publishes a view of the workers in m->in_view, with its word (settled). */
void publish_view(model *m);

/* --end-kills: the kills of the last collective, armed when the first worker starts it. */
void arm_end_kills(model *m);

/* --end-kills: replacement wi now holds the final state (it fetched one, or completed the last
 * collective): sometimes it is killed a little later, and replaced in turn. */
void maybe_kill_replacement(model *m, uint32_t wi);

void on_join(model *m, uint32_t ri);

/* Whether worker wi's program is inside a call now (its shell reads what arrives). */
int in_call(const model *m, uint32_t wi);

/* A ring message, a view or a fetch request reaches worker e->to: read now when its program is
 * inside a call, else held until the next call's start. Takes e->vals (NULL after). */
void deliver(model *m, event *e);

/* Worker wi's program enters a call: what waited in its inbox is read now, in order. */
void enter_call(model *m, uint32_t wi);

/* The program calls cps_allreduce_share with the state its completed collectives made. */
void share_now(model *m, uint32_t wi);

/* Some worker completed the job's last collective and finished (left through the barrier). A
 * replacement that learnt nothing from a fetch (it guesses, or every answer was a refusal) and
 * joins then has nothing to run: the program's own count of steps says so (the model stands in
 * for it by looking). */
int others_finished(const model *m);

/* Worker wi's program is past its last collective: it shares and enters cps_barrier. */
void enter_barrier(model *m, uint32_t wi);

/* The scheduler's barrier rule (recovery/workers_end.c) over the modelled workers: when it says
 * so, every worker waiting leaves (BARRIER_DONE, then cps_close's goodbye: EV_BYE). */
void barrier_check(model *m);

/* Worker wi said goodbye (cps_close): finished, out of the view. */
void on_bye(model *m, uint32_t wi);

/* cps_allreduce_fetch's loop: ask, wait, ask again, until the fetch ends. */
void fetch_drive(model *m, uint32_t wi);

/* The sharer (any live worker, done or not): its answer (replication/ring_fetch.c), over its
 * pipe to the asker, in parts; with --old-peers in one message, the result left out when the two
 * exceed a message. */
void fetch_serve(model *m, uint32_t si, uint32_t ri, uint64_t req, uint64_t from);

/* A part (or a whole answer) reaches the fetching replacement: the shell's copy. */
void fetch_receive(model *m, uint32_t ri, const event *e);

#endif
