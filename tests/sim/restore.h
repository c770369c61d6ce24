/* sim_restore's world, shared by the simulator (restore.c), its servers (restore_servers.c) and
 * the restore tool it runs (restore_tool.c): see restore.c for what it models. */
#ifndef CPS_TESTS_SIM_RESTORE_H
#define CPS_TESTS_SIM_RESTORE_H

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "seed_args.h"
#include "chainps/error.h"
#include "core/view.h"
#include "core/wire.h"
#include "recovery/restore.h"
#include "replication/cut_view.h"
#include "replication/replica.h"

#define MAX_SERVERS 5
#define MAX_RANGES  4
#define MAX_KEYS    12
#define MAX_EPOCHS  64
#define MAX_FAULTS  3
#define MAX_SENT    4096
#define TOOL        (MAX_SERVERS + 1) /* the restore tool's node in the simulator */
#define TICK_MS     10
#define DEAD_AFTER  600 /* the scheduler's failure timeout, and the fence's (scaled down) */
#define RESEND_MS   200
/* The tool's: its --timeout default; its other timers are production's (cps__rs_cfg_defaults). */
#define TIMEOUT_MS   120000
#define VIEW_WAIT_MS 1000
#define MAX_EVENTS   2000000 /* a runaway seed fails */

enum { REC_CREATE = 1, REC_SLICE = 2 };
/* SRV_HELLO (not --model): restarted, saying HELLO until its WELCOME lets it in. */
enum { SRV_UP = 0, SRV_PAUSED, SRV_DEAD, SRV_FENCED, SRV_HELLO };
enum {
    EV_MSG = 1,
    EV_TICK,
    EV_RESUME,
    EV_FAULT,
    EV_DECLARE,
    EV_TWAKE,
    EV_STICK,
    EV_SNAPSHOT,
    EV_RESTART
};
enum { F_KILL_HEAD = 0, F_KILL_MIDDLE, F_KILL_TAIL, F_KILL_ANY, F_PAUSE_HEAD, F_KINDS };

typedef struct msg {
    uint32_t from, to;
    cps__msg_hdr h;
    void *pl; /* payload (malloc), or NULL */
    size_t len;
    int whole; /* a CUT_PROBE answer: the tail held the range whole when it answered (sim only) */
    struct msg *next;
} msg;

typedef struct event {
    uint64_t t, n;
    int type;
    uint32_t node;
    uint64_t arg;
    msg *m;
} event;

typedef struct rstore {
    uint64_t applied;
    uint8_t exists[MAX_KEYS];
    uint64_t version[MAX_KEYS], value[MAX_KEYS];
} rstore;

/* A sent snapshot whose socket stays open until the replica lets it close (restore_join.c). */
typedef struct linger {
    uint32_t range, joiner;
    uint64_t join_id, ended_ms;
} linger;
#define MAX_LINGERS 8

typedef struct server {
    uint32_t id;
    int state;
    cps__replica *rep;
    const cps__view *view;
    rstore rs[MAX_RANGES];
    msg *pend, *pend_tail; /* came while paused, in order */
    int hb_stalled;        /* paused with its heartbeat thread: may be declared dead */
    uint64_t resume_at;
    uint64_t beat_at;  /* not --model: its heartbeat thread's next beat */
    int gone;          /* not --model: killed, and its connection refuses (the scheduler sees) */
    uint32_t boot;     /* its process's life (1 at the start; a restart adds one) */
    uint64_t hello_at; /* SRV_HELLO: its next HELLO */
    uint64_t down_at;  /* when it was last killed or fenced */
    linger lingers[MAX_LINGERS];
    uint32_t nlingers;
} server;

typedef struct sent_put {
    uint64_t req_seq;
    uint32_t range, pass, to;
    int answered;
} sent_put;

typedef struct world {
    uint64_t rng, now, evn, nevents;
    int coord_on;             /* the production coordinator (restore_sched.c); 0: --model */
    struct cps__coord *coord; /* ... it */
    sim_verdict v;
    int verbose;
    uint32_t nservers, nranges, replicas, per_put;
    uint32_t drop_pm;
    uint32_t put_ms;  /* the tool reads and encodes a PUT in up to this long */
    uint32_t view_ms; /* a new view reaches a server up to this late */
    uint32_t nkeys[MAX_RANGES];
    uint64_t version[MAX_RANGES][MAX_KEYS], value[MAX_RANGES][MAX_KEYS];
    cps__view views[MAX_EPOCHS + 1];
    cps__range vranges[MAX_EPOCHS + 1][MAX_RANGES];
    cps__node_info vnodes[MAX_EPOCHS + 1][MAX_SERVERS];
    uint64_t epoch;
    server srv[MAX_SERVERS + 1];
    event *ev;
    size_t nev, evcap;
    uint64_t fifo[MAX_SERVERS + 2][MAX_SERVERS + 2]; /* per link: the last delivery (TCP order) */
    /* faults */
    uint32_t nfaults, fired;
    int fkind[MAX_FAULTS];
    uint64_t ftrigger[MAX_FAULTS]; /* after this many PUTs sent */
    uint64_t fdur[MAX_FAULTS];
    int fstall[MAX_FAULTS];
    /* the tool */
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int turn; /* 0: the simulator runs, 1: the tool runs */
    int done, rc, failed_by;
    uint64_t wake_at, wake_gen;
    msg *inbox, *inbox_tail;
    const cps__view *tview; /* the tool's view */
    cps__restore m;         /* the production restore machine (recovery/restore.h) */
    uint64_t next_req, puts_sent;
    uint32_t pass, bad, resent;
    uint64_t fail_epoch;  /* the tool's view when it failed */
    uint64_t fail_at;     /* ... and when */
    int bad_done;         /* the range the failure names was confirmed by its tail */
    int bad_chain;        /* ... its chain (in the tool's view then) was not empty */
    int bad_down;         /* ... its chain's members were all down then (not restarted) */
    uint64_t bad_down_at; /* ... since then (the last of them to go down) */
    int stream, sent_now; /* the machine said STREAM; a PUT went out in the last feed */
    uint32_t buffered[MAX_RANGES];
    uint64_t buf[MAX_RANGES][2 * 3]; /* one PUT's records being filled: (word0, word1) pairs */
    sent_put sent[MAX_SENT];
    uint32_t nsent;
} world;

/* failed_by: the machine's CPS_RS_WHY_... */
enum {
    WHY_NONE = CPS_RS_WHY_NONE,
    WHY_DEADLINE = CPS_RS_WHY_DEADLINE,
    WHY_FATAL = CPS_RS_WHY_FATAL,
    WHY_SILENT = CPS_RS_WHY_SILENT,
    WHY_PASSES = CPS_RS_WHY_PASSES,
    WHY_NO_REPLICA = CPS_RS_WHY_NO_REPLICA
};

/* restore.c: the seeded draws, the log, the events and the network, for the tool too. */
uint64_t rnd(world *w, uint64_t n);
void trace(world *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ev_push(world *w, uint64_t t, int type, uint32_t node, uint64_t arg, msg *m);
void msg_free(msg *m);
/* A message from -> to (fifo: a TCP connection; else a chain link, lossy and reordered); the
 * message queued, or NULL if lost. */
msg *net_send(world *w, uint32_t from, uint32_t to, const cps__msg_hdr *h, const void *pl,
              size_t len, int fifo);

/* A view message to server `to` naming view `epoch` (late: up to view_ms on the way). */
void view_post(world *w, uint32_t to, const cps__msg_hdr *h, int late);

/* restore_servers.c: the servers, the production replica behind src/server's shell. */
void rsrv_new(world *w, server *s);             /* s's replica, made at w->now (exits on failure) */
void rsrv_perform(world *w, server *s);         /* its ready list, and the join outcomes it owes */
void rsrv_perform_all(world *w, server *s);     /* ... and its replica's due work, while it is up */
void rsrv_deliver(world *w, server *s, msg *m); /* m reaches s, up or saying HELLO */
void rsrv_tick(world *w, server *s);            /* its loop turns (EV_TICK, EV_RESUME) */
/* Not --model: killed or fenced, s starts again on its store in a new life. */
void rsrv_restart(world *w, server *s);
/* Store st holds range r exactly as the checkpoint has it. */
int rsrv_holds_whole(const world *w, const rstore *st, uint32_t r);

/* restore_sched.c: the production coordinator as the scheduler (not --model). */
void rsched_setup(world *w); /* the servers' HELLOs; its first view is w->views[1] */
void rsched_teardown(world *w);
void rsched_deliver(world *w, msg *m); /* a message to the scheduler (node 0) */
void rsched_tick(world *w);            /* EV_STICK */
void rsched_beat(world *w, server *s); /* at the server's tick: its heartbeat (or HELLO) */

/* restore_join.c: the server's side of a join (not --model). */
void rjoin_snapshot(world *w, server *s, const cps__replica_out *o);
void rjoin_snapshot_run(world *w, msg *m); /* EV_SNAPSHOT */
int rjoin_take(world *w, server *s, const cps__replica_out *o, uint64_t *value);
void rjoin_reap(world *w, server *s);

/* restore_tool.c: the restore tool, a thread that runs only while the simulator waits for it. */
void *tool_main(void *arg);
/* Run the tool until it waits again (for a message or a time) or ends. */
void tool_resume(world *w);

#endif
