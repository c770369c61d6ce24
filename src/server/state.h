/* The state of a server process (cps__server), apart from the functions of its files
 * (server.h), so that every file of the server can hold it without depending on the loop. */
#ifndef CPS_SERVER_STATE_H
#define CPS_SERVER_STATE_H

#include <stdint.h>

#include "core/config.h"
#include "core/prom.h"
#include "core/view.h"
#include "node/heartbeat.h"
#include "node/loop.h"
#include "node/metrics.h"
#include "node/msg.h"
#include "node/temp_peers.h"
#include "recovery/fence.h"
#include "replication/chain.h"
#include "replication/cut_view.h"
#include "replication/replica.h"
#include "store/store.h"
#include "transport/transport.h"

struct snap_job;

/* What the /metrics page shows beyond the heartbeat's stats block (cps__node_stats). */
typedef struct cps__server_counters {
    uint64_t pushes;          /* PUSH and PUSH_PULL requests received */
    uint64_t pulls;           /* PULL and PUSH_PULL requests received */
    uint64_t forwards;        /* FWDs sent to a successor, first sends and re-sends */
    uint64_t forward_retries; /* of which re-sent (the successor had not acknowledged in time) */
    uint64_t late_gradients;  /* sync pushes dropped: their step closed without them (backup
                                 workers) */
    cps__prom_hist apply;     /* seconds each update's store transaction took */
} cps__server_counters;

typedef struct cps__server {
    cps__config cfg;
    cps__tp *tp;
    cps__store *store;
    uint32_t id;
    uint32_t rank;
    cps__view view;
    const cps__fence *fence; /* our standing, the replica's (cps__replica_fence); re-pointed
                                when the replica is re-created (a new one: not joined) */
    int shutdown;
    /* SIGTERM: we asked the scheduler to drain us (1), it accepted (2); see on_before_sleep. */
    int drain;
    uint64_t drain_asked_ms;
    cps__node_stats stats;
    cps__server_counters ctr;
    cps__metrics *metrics; /* --metrics-port; NULL when off */
    cps__prom page;        /* the page last rendered for it (buffer reused) */
    /* The data-path protocol (replication/replica.h): chain, sync, SSP, held acks, held
     * messages. Re-created when we rejoin. */
    cps__replica *replica;
    cps__replica_counters counted; /* its counters as last added to ours (update.c) */
    uint64_t suspects_checked_ms;  /* last look for successors that leave our FWDs unacked */
    int poisoned;                  /* a store write failed: state unknown, the server must leave */
    int disk_full;                 /* a store write failed with CPS_ENOSPC: leave, saying so */
    int refused;            /* our data directory belongs to another job: leave with this error */
    cps__temp_peers temps;  /* `chainps status --verify` and other non-members */
    uint64_t boot_id;       /* this process's incarnation, sent with HELLO */
    struct snap_job *snaps; /* snapshots being sent by threads */
    struct cut_job *cuts;   /* checkpoint read views, pending or served by threads (cut.c) */
    cps__cut_book cut_book; /* which cuts were asked for, and their deadlines (cut_view.h) */
    cps__heartbeat *beat;   /* the heartbeat thread (node/heartbeat.c) */
    /* Called after each applied update while checkpoint cuts are open (cut.c's
     * cps__server_cuts_after_apply, set by server.c): the data path does not call up into the
     * checkpoint code it serves. */
    void (*after_apply)(struct cps__server *s, uint32_t range);
    cps__loop *loop; /* the event loop (server.c): the inbox, timers, per-turn work */
    cps__loop_tp inbox;
    int result;      /* why the loop stopped, returned by cps__server_run */
    int join_failed; /* the scheduler never answered our HELLO */
    uint64_t join_start_ms;
    uint64_t sched_seen_ms;  /* last time the scheduler was connected or spoke to us */
    uint32_t saved_id;       /* the node id recorded in the store */
    char addr[CPS_ADDR_MAX]; /* our inbox, as the HELLO names it */
    char sched_url[CPS_ADDR_MAX + 16];
} cps__server;

#endif
