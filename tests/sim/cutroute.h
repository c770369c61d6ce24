/* sim_cutroute's model (cutroute.c describes it): its state, and what its files share.
 *
 *   cutroute.c          faults, a seed, main
 *   cutroute_events.c   rnd, the event queue (a binary heap on (t, order)) and the network's delays
 *   cutroute_servers.c  the chains, the job's steps and views, and each server's read views
 * (src/server/cut.c) cutroute_export.c   the exporter (src/checkpoint/cluster_cut.c) over the
 * production router (recovery/cutroute.c) */
#ifndef CPS_SIM_CUTROUTE_H
#define CPS_SIM_CUTROUTE_H

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
/* The exporter's timers (src/checkpoint/cluster_int.h), in simulated ms. */
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

/* cutroute_events.c */
/* Per node and direction, the last delivery time: each link keeps its order (cutroute_events.c). */
extern uint64_t fifo_last[MAX_SERVERS + 1][2];
uint64_t rnd(model *m, uint64_t n);
void post(model *m, uint64_t delay, event e);
int pop(model *m, event *out);
uint64_t net(model *m);
uint64_t fifo(model *m, uint32_t node, int dir);
/* cutroute_servers.c */
const chains *now_chains(const model *m);
int in_chain(const chains *c, uint32_t r, uint32_t node, uint32_t *pos);
uint64_t step_at(const model *m, uint32_t r, uint64_t seq);
void publish(model *m, const chains *c);
void on_tick(model *m);
void try_cut(model *m, uint32_t node, uint32_t r);
void on_ask(model *m, const event *e);
void on_read(model *m, const event *e);
/* cutroute_export.c */
void x_start(model *m);
void x_maybe_read(model *m);
void on_open_ans(model *m, const event *e);
void on_read_ans(model *m, const event *e);
void on_xtick(model *m);

#endif
