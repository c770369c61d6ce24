/* Server internals shared by the event loop (server.c) and the data path (update.c). */
#ifndef CPS_SERVER_H
#define CPS_SERVER_H

#include <stdint.h>

#include "core/config.h"
#include "core/prom.h"
#include "replication/chain.h"
#include "replication/replica.h"
#include "core/view.h"
#include "node/heartbeat.h"
#include "node/loop.h"
#include "node/metrics.h"
#include "node/msg.h"
#include "node/temp_peers.h"
#include "recovery/fence.h"
#include "recovery/joiner.h"
#include "store/store.h"
#include "transport/transport.h"

struct snap_job;

/* A pending checkpoint cut's deadline (cut.c): n counts the cuts this process was asked for. */
#define CPS_SERVER_T_CUT(n) ((3ull << 32) | (uint32_t)(n))

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
    cps__fence *fence; /* our standing: joined, unsure, fenced (recovery/fence.h) */
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
    cps__joiner *joiner;    /* ranges we copy from their tails (recovery/joiner.h, transfer.c) */
    struct snap_job *snaps; /* snapshots being sent by threads */
    struct cut_job *cuts;   /* checkpoint read views, pending or served by threads (cut.c) */
    uint32_t cuts_made;     /* names each cut's deadline timer */
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

/* The chain state machine of the replica, for questions (NULL before the first view). */
static inline cps__chain *cps__server_chain(const cps__server *s)
{
    return s->replica ? cps__replica_chain(s->replica) : NULL;
}

/* Data path (update.c): receive, step the replica, perform its ready list. */
/* Create the replica (at start, and again when we rejoin). Errors: CPS_ENOMEM. */
int cps__server_replica_new(cps__server *s);
/* A request or chain message from a peer (takes rx). */
void cps__server_take(cps__server *s, cps__rx *rx);
/* A request that came before our own WELCOME: held by the replica until the first view (takes
 * rx). */
void cps__server_defer(cps__server *s, cps__rx *rx);
/* s->view was installed: the replica follows (fresh: we were just let in). */
void cps__server_view_changed(cps__server *s, int fresh);
/* Step the messages the last view released (held for its epoch, or deferred). */
void cps__server_run_held(cps__server *s);
/* Perform the replica's ready list (after any call into it). */
void cps__server_perform(cps__server *s);
/* Timers: re-sends, held acks that are due (all of them when force_acks), stuck sync steps. */
void cps__server_tick(cps__server *s, uint64_t now, int force_acks);
/* Milliseconds the event loop may sleep before held acks are due (`max_ms` if none). */
int cps__server_ack_wait_ms(const cps__server *s, uint64_t now, int max_ms);
/* Free the replica and the joiner. */
void cps__server_data_fini(cps__server *s);
/* State transfer (transfer.c). Each takes rx. */
void cps__server_on_snap_req(cps__server *s, cps__rx *rx);
void cps__server_on_join_range(cps__server *s, cps__rx *rx);
void cps__server_on_snap(cps__server *s, cps__rx *rx);
/* Join finished snapshot threads (all of them, waiting, when `wait`). */
void cps__server_reap_snapshots(cps__server *s, int wait);
/* A view was installed (after the chain's): joins under way it ends are given up. Creates the
 * joiner at the first view. */
void cps__server_joins_view(cps__server *s);
/* We are not in range r's chain (the replica's DROP_RANGE): the view took us out while we stay
 * in the job (moved = 1: it moved to another server), or we were just let in and it does not
 * name us (moved = 0: what we hold of it is stale). Drops our copy of its records. */
void cps__server_range_left(cps__server *s, uint32_t r, int moved);
/* Abandon joins that made no progress in time, re-ask for snapshots, confirm joins. */
void cps__server_check_joins(cps__server *s, uint64_t now);
/* Checkpoints (cut.c): requests from a checkpoint tool. on_put takes rx; the others do not. */
void cps__server_on_cut_probe(cps__server *s, cps__rx *rx);
void cps__server_on_cut_open(cps__server *s, cps__rx *rx);
void cps__server_on_put(cps__server *s, cps__rx *rx);
/* After an update of `range` is applied: open the cuts waiting for that range's step. */
void cps__server_cuts_after_apply(cps__server *s, uint32_t range);
/* The store must grow its map, which waits for every read transaction: end the open cuts now
 * (their exports fail and are tried again) rather than stall the event loop until they end.
 * ctx is the server. */
void cps__server_cuts_before_grow(void *ctx);
/* Timer: join finished cut threads, drop expired waits; stop_all ends every cut (waiting). */
void cps__server_cuts_tick(cps__server *s, uint64_t now, int stop_all);

/* Reply helpers (reply.c). */
void cps__server_reply_error(cps__server *s, const cps__msg_hdr *req, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Ask the scheduler for the current view (the answer arrives as a VIEW message). */
void cps__server_ask_view(cps__server *s);
/* Rank of worker node `id`, or UINT32_MAX if it is not a worker of the view. */
uint32_t cps__server_worker_rank(const cps__server *s, uint32_t id);

#endif
