/* The scheduler's whole protocol as one state machine (etcd raft's Step/Tick/Ready shape).
 *
 * The coordinator admits nodes and assigns ids and ranks (HELLO), owns the view and its epoch,
 * declares deaths (heartbeat silence through recovery/detector.c, data-path evidence through
 * recovery/suspect.c, a new life of a server through recovery/incarnation.c), re-forms and
 * balances the chains (recovery/repair.c, joiners that catch up batched into one view), drains
 * servers, runs barriers, ends the job, and records the last checkpoint. It composes those pure
 * parts and is pure itself: no sockets, no store, no clock. Inputs carry `now`.
 *
 * Inputs: cps__coord_step (one message), cps__coord_tick (time passes), and a few calls for
 * what is not a message (cps__coord_stop, cps__coord_resume). Every input appends to one output,
 * cps__coord_ready, which the shell performs IN THIS ORDER:
 *   1. persist: if out->persist has CPS_CO_P_STATE, write the blobs of cps__coord_blobs in one
 *      transaction; with CPS_CO_P_CKPT, the checkpoint note. Then report the result with
 *      cps__coord_persisted: on failure the views of this output are withdrawn (no node may see
 *      a view a restarted scheduler could lose) and offered again once a retried save succeeds.
 *   2. the actions, in order: views and messages to send, peers to make or drop, log lines.
 *   3. cps__coord_done: the output is empty again.
 * The shell never sends a view the coordinator did not put in an output.
 *
 * Ownership: the coordinator owns its state and its output; pointers it returns stay valid until
 * the next input. Not thread-safe. */
#ifndef CPS_RECOVERY_COORDINATOR_H
#define CPS_RECOVERY_COORDINATOR_H

#include <stddef.h>
#include <stdint.h>

#include "core/config.h"
#include "core/view.h"
#include "core/wire.h"

typedef struct cps__coord cps__coord;

typedef struct cps__coord_config {
    const cps__config *cfg;   /* copied: num_servers/workers, replicas, ranges, mode, hold, ... */
    uint32_t repair_every_ms; /* periodic repair (and after a death) */
    uint32_t batch_ms;        /* joiners caught up within this long go out in one view */
    uint32_t join_give_up_ms; /* a join not caught up by then is retried */
    uint32_t save_retry_ms;   /* a failed save of the view is retried this often */
    uint32_t id_limit;        /* node ids stay below this (the shell's temporary peers above) */
    uint64_t now;             /* start time: the join timeout counts from it */
    int single_probe;         /* tests only: see cps__suspect_config (0 in production) */
} cps__coord_config;

/* A member as the coordinator keeps it; read-only for the shell (STATUS, /metrics). */
typedef struct cps__coord_node {
    cps__node_info info;
    uint64_t boot_id; /* the server life that said HELLO and was let in */
    uint64_t last_seen_ms;
    cps__node_stats stats;
    int done;       /* worker said BYE */
    int draining;   /* server: its ranges are being moved away */
    int left;       /* server: drained and told to exit; no longer a member */
    int in_barrier; /* worker waiting in the current barrier */
    uint64_t barrier_seq;
    uint64_t shutdown_sent_ms; /* superseded worker still talking: when we last told it to go */
    /* Server: kept out, as it said HELLO from an empty store while the only replica of a range
     * (cps__coord_stranded); the life (boot id) that did, and when we last logged it. */
    int empty_kept;
    uint64_t empty_boot;
    uint64_t empty_logged_ms;
} cps__coord_node;

/* Counters for the /metrics page. */
typedef struct cps__coord_counts {
    uint64_t deaths_server, deaths_worker, moves, drained;
    uint32_t workers_done;
} cps__coord_counts;

/* The job as the coordinator counts it, for the /metrics page (cps__coord_summary). */
typedef struct cps__coord_summary {
    int running;           /* every node joined, and the job has not ended */
    uint32_t live_servers; /* servers the view counts alive */
    uint32_t live_workers; /* workers alive and not finished */
    uint32_t draining;     /* servers whose ranges are being moved away */
    uint32_t stranded; /* ranges held unavailable by an empty last replica (cps__coord_stranded) */
    /* The servers' counters as their heartbeats last reported them, summed; and the highest
     * step any server applied (the job's step). */
    uint64_t push_raw_bytes, push_wire_bytes, pull_bytes, updates_applied, step;
} cps__coord_summary;

enum {
    CPS_CO_P_STATE = 1,   /* the view and the job's progress (cps__coord_blobs) */
    CPS_CO_P_CKPT = 2,    /* the last checkpoint's note (cps__coord_ckpt) */
    CPS_CO_P_REGISTRY = 4 /* the tensor registry (cps__coord_registry_blob); not protocol: a
                           * failed write is only logged, as no view depends on it */
};

enum cps__coord_action_kind {
    /* Send the view: hdr is complete but for aux (the shell's job id); the payload is view
     * encoding number `view` of the output (cps__coord_out.views). Withdrawn (kind 0) when the
     * save of this output failed. */
    CPS_CO_VIEW = 1,
    /* Send hdr (no payload) to `peer`; if it cannot be sent, tell cps__coord_unsent. */
    CPS_CO_MSG,
    /* Answer request hdr (its sender: the peer) with error `code` and `text`. */
    CPS_CO_ERROR,
    /* To a node that is no member (a refused HELLO, a superseded worker): reach `addr` at a
     * short-lived peer, then send hdr, or (code != 0) an error reply with `text`. */
    CPS_CO_TO_ADDR,
    /* Have a peer for node `peer` at `addr`: with `force`, replace the one known. */
    CPS_CO_PEER_SET,
    /* Drop the peer of node `peer` (a superseded worker). */
    CPS_CO_PEER_DROP,
    /* Log `text` at `level` (CPS_LOG_*). */
    CPS_CO_LOG,
    /* Answer a tool's request: send hdr (complete) to `peer` with payload number `view` of the
     * output (cps__coord_out.views: a STATUS_REPLY, a REGISTRY reply). A failed save does not
     * withdraw it: a tool is no member, and no node acts on the view a tool is shown. */
    CPS_CO_REPLY
};

typedef struct cps__coord_action {
    int kind; /* cps__coord_action_kind; 0: withdrawn, skip */
    uint32_t peer;
    uint32_t view;
    int code;
    int level;
    int force;
    cps__msg_hdr hdr;
    char addr[CPS_ADDR_MAX];
    char text[232]; /* a log line: a longer message is split over lines */
} cps__coord_action;

typedef struct cps__coord_blob {
    const void *data;
    size_t len;
} cps__coord_blob;

typedef struct cps__coord_out {
    unsigned persist; /* CPS_CO_P_* */
    cps__coord_action *a;
    size_t n, cap;
    cps__coord_blob *views; /* payloads the CPS_CO_VIEW (encoded views) and CPS_CO_REPLY name */
    size_t nviews, views_cap;
} cps__coord_out;

/* Errors: CPS_EINVAL, CPS_ENOMEM. *out is the caller's, to free with cps__coord_destroy. */
int cps__coord_create(const cps__coord_config *cfg, cps__coord **out);
void cps__coord_destroy(cps__coord *c); /* NULL: no-op */

/* Resume an unfinished job from the persisted blobs. `get` reads one blob by name (the names of
 * cps__coord_blobs, "sched/ckpt" and "sched/registry"; the registry is read even when there is
 * no job to resume, as a new job in the directory keeps it): 0 with *data and *len set (borrowed
 * for the call),
 * CPS_ENOTFOUND, or an error. Returns 1 resumed (a new epoch, to be persisted and sent: see the
 * output), 0 nothing to resume (none saved, or that job finished), or CPS_ECORRUPT,
 * CPS_ECONFIG (the directory holds another job's shape; logged in the output), CPS_ENOMEM. */
typedef int (*cps__coord_get_fn)(void *ctx, const char *name, const void **data, size_t *len);
int cps__coord_resume(cps__coord *c, cps__coord_get_fn get, void *ctx, uint64_t now);

/* Whether hdr is a tool's request to be answered at a peer its payload names (a hello naming
 * the tool's inbox; see node/temp_peers.h): STATUS and REGISTRY from anyone, DRAIN and RELEASE
 * from a sender of UINT32_MAX (a member's are answered at the member). The shell makes that peer
 * and passes it to cps__coord_step as reply_to; it decides nothing else about tools. */
int cps__coord_tool_request(const cps__msg_hdr *hdr);

/* One message. `payload` is hdr->raw_len bytes (len). `reply_to`: where a tool's request is
 * answered (the shell's temporary peer for it; 0: the request named none, so it is not
 * answered), else hdr->sender. Tool queries (STATUS, REGISTRY) are answered with CPS_CO_REPLY;
 * a member worker's REGISTER is taken into the tensor registry (CPS_CO_P_REGISTRY when it
 * changed) and answered. Returns 0 handled, or CPS_ENOTFOUND (a sender that is no member:
 * dropped, logged). */
int cps__coord_step(cps__coord *c, const cps__msg_hdr *hdr, const void *payload, size_t len,
                    uint32_t reply_to, uint64_t now);

/* The wall clock of this turn (ms since 1970): a STATUS reply gives the last checkpoint's age by
 * it, as checkpoint times are wall-clock times. Call before the step that may answer STATUS;
 * until then ages read 0. */
void cps__coord_set_wall(cps__coord *c, uint64_t wall_ms);

/* Time passes (call every few tens of ms): failure detection, data-path probes, periodic and
 * batched repairs, save retries, the join timeout. `gone` lists members whose connection closed
 * and whose address refuses connections, as the transport sees them (the shell checks every
 * member; the coordinator decides which count: a live server's or worker's process is gone, no
 * need to wait out its silence; a finished worker closed on purpose). */
void cps__coord_tick(cps__coord *c, uint64_t now, const uint32_t *gone, size_t ngone);

/* A stop was requested (signal, or the shell): every server is told to exit; the job ends. */
void cps__coord_stop(cps__coord *c);

/* The output so far; cps__coord_done empties it. */
cps__coord_out *cps__coord_ready(cps__coord *c);
/* The result of the persist the output asked for (0 or the store's error). On failure, views
 * are withdrawn from the output and the save is retried by cps__coord_tick; once it succeeds
 * the held view goes out to every node (appended to the output being performed). */
void cps__coord_persisted(cps__coord *c, int rc, uint64_t now);
void cps__coord_done(cps__coord *c);
/* The CPS_CO_MSG with header `hdr` could not be sent (with the transport's error). The
 * coordinator decides what that means: a JOIN_RANGE is retried at the next repair; anything else
 * is left to its own retry (a heartbeat, a probe round, a repeated request). Returns the level
 * (CPS_LOG_*) the shell logs the failure at: debug for a probe, whose silence is the evidence a
 * probe round looks for, else warn. */
int cps__coord_unsent(cps__coord *c, const cps__msg_hdr *hdr);

/* The blobs to persist under CPS_CO_P_STATE: sched/view, sched/state, sched/scale, sched/boots,
 * sched/former, sched/unconfirmed (names in names[i], bytes owned by the coordinator until the
 * next call). Returns how many (CPS_COORD_BLOBS), or CPS_ENOMEM. A store written before
 * sched/former existed loads as one without fallbacks; one written before sched/unconfirmed
 * loads with the tail of every chain of two or more taken for an unconfirmed joiner (each leaves
 * its chain after a probation and its range is copied again: see coordinator_dispatch.c). */
#define CPS_COORD_BLOBS 6
int cps__coord_blobs(cps__coord *c, const char *names[CPS_COORD_BLOBS],
                     cps__coord_blob blobs[CPS_COORD_BLOBS]);

/* The tensor registry to persist under CPS_CO_P_REGISTRY as "sched/registry": malloc'd, the
 * caller frees it; *len set. NULL when out of memory. */
unsigned char *cps__coord_registry_blob(const cps__coord *c, size_t *len);

/* The job's figures for /metrics. */
cps__coord_summary cps__coord_summarize(const cps__coord *c);
/* Whether member i (of cps__coord_nodes) has a training clock to show: a worker alive or
 * finished (a dead or superseded one's rank is someone else's now). */
int cps__coord_shows_clock(const cps__coord *c, uint32_t i);

/* Read-only views of the state, for /metrics. */
const cps__view *cps__coord_view(const cps__coord *c);
const cps__coord_node *cps__coord_nodes(const cps__coord *c, uint32_t *n);
const cps__ckpt_note *cps__coord_ckpt(const cps__coord *c);
cps__coord_counts cps__coord_counters(const cps__coord *c);
/* Joiner copying range r now (0: none), and its source. */
uint32_t cps__coord_joiner(const cps__coord *c, uint32_t r, uint32_t *source);
/* Range r is held unavailable because its only replica, this server (the id returned; 0: r is
 * not so), came back with an empty store and is kept out (docs/operations.md, "An empty disk
 * as a range's last replica"). *fallback (may be NULL) receives the server that left r last and
 * holds it as of *since_epoch (NULL allowed), the view epoch it left in; 0 when none does. */
uint32_t cps__coord_stranded(const cps__coord *c, uint32_t r, uint32_t *fallback,
                             uint64_t *since_epoch);
/* A joiner appended to range r that the repair has not confirmed yet (0: none). */
uint32_t cps__coord_unconfirmed(const cps__coord *c, uint32_t r);
int cps__coord_started(const cps__coord *c);
int cps__coord_finished(const cps__coord *c);
/* The join timeout passed before every node arrived: the shell stops; its result. 0: not so. */
int cps__coord_gave_up(const cps__coord *c);
uint64_t cps__coord_epoch(const cps__coord *c);

#endif
