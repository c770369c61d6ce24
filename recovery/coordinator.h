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
} cps__coord_node;

/* Counters for the /metrics page. */
typedef struct cps__coord_counts {
    uint64_t deaths_server, deaths_worker, moves, drained;
    uint32_t workers_done;
} cps__coord_counts;

enum {
    CPS_CO_P_STATE = 1, /* the view and the job's progress (cps__coord_blobs) */
    CPS_CO_P_CKPT = 2   /* the last checkpoint's note (cps__coord_ckpt) */
};

enum cps__coord_action_kind {
    /* Send the view: hdr is complete but for aux (the shell's job id); the payload is view
     * encoding number `view` of the output (cps__coord_out.views). Withdrawn (kind 0) when the
     * save of this output failed. */
    CPS_CO_VIEW = 1,
    /* Send hdr (no payload) to `peer`. Of kind JOIN_RANGE: if it cannot be sent, tell
     * cps__coord_join_unsent. */
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
    CPS_CO_LOG
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
    char text[232];
} cps__coord_action;

typedef struct cps__coord_blob {
    const void *data;
    size_t len;
} cps__coord_blob;

typedef struct cps__coord_out {
    unsigned persist; /* CPS_CO_P_* */
    cps__coord_action *a;
    size_t n, cap;
    cps__coord_blob *views; /* encoded views the CPS_CO_VIEW actions name */
    size_t nviews, views_cap;
} cps__coord_out;

/* Errors: CPS_EINVAL, CPS_ENOMEM. *out is the caller's, to free with cps__coord_destroy. */
int cps__coord_create(const cps__coord_config *cfg, cps__coord **out);
void cps__coord_destroy(cps__coord *c); /* NULL: no-op */

/* Resume an unfinished job from the persisted blobs. `get` reads one blob by name (the names of
 * cps__coord_blobs, and "sched/ckpt"): 0 with *data and *len set (borrowed for the call),
 * CPS_ENOTFOUND, or an error. Returns 1 resumed (a new epoch, to be persisted and sent: see the
 * output), 0 nothing to resume (none saved, or that job finished), or CPS_ECORRUPT,
 * CPS_ECONFIG (the directory holds another job's shape; logged in the output), CPS_ENOMEM. */
typedef int (*cps__coord_get_fn)(void *ctx, const char *name, const void **data, size_t *len);
int cps__coord_resume(cps__coord *c, cps__coord_get_fn get, void *ctx, uint64_t now);

/* One message. `payload` is hdr->raw_len bytes (len). `reply_to`: where a tool's request is
 * answered (the shell's temporary peer for it), else hdr->sender. Returns 0 handled, 1 handled
 * and the shell must also act on it (REGISTER of a member worker: the tensor registry is the
 * shell's), or CPS_ENOTFOUND (a sender that is no member: dropped, logged). */
int cps__coord_step(cps__coord *c, const cps__msg_hdr *hdr, const void *payload, size_t len,
                    uint32_t reply_to, uint64_t now);

/* Time passes (call every few tens of ms): failure detection, data-path probes, periodic and
 * batched repairs, save retries, the join timeout. `gone` lists servers whose connection closed
 * and whose address refuses connections (their process is gone: no need to wait out their
 * silence). */
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
/* A JOIN_RANGE of the output could not be sent: the join is retried at the next repair. */
void cps__coord_join_unsent(cps__coord *c, const cps__msg_hdr *join);

/* The blobs to persist under CPS_CO_P_STATE: sched/view, sched/state, sched/scale, sched/boots
 * (names in names[i], bytes owned by the coordinator until the next call). Returns how many, or
 * CPS_ENOMEM. */
int cps__coord_blobs(cps__coord *c, const char *names[4], cps__coord_blob blobs[4]);

/* Read-only views of the state, for STATUS and /metrics. */
const cps__view *cps__coord_view(const cps__coord *c);
const cps__coord_node *cps__coord_nodes(const cps__coord *c, uint32_t *n);
const cps__ckpt_note *cps__coord_ckpt(const cps__coord *c);
cps__coord_counts cps__coord_counters(const cps__coord *c);
/* Joiner copying range r now (0: none), and its source. */
uint32_t cps__coord_joiner(const cps__coord *c, uint32_t r, uint32_t *source);
/* A joiner appended to range r that the repair has not confirmed yet (0: none). */
uint32_t cps__coord_unconfirmed(const cps__coord *c, uint32_t r);
int cps__coord_started(const cps__coord *c);
int cps__coord_finished(const cps__coord *c);
/* The join timeout passed before every node arrived: the shell stops; its result. 0: not so. */
int cps__coord_gave_up(const cps__coord *c);
uint64_t cps__coord_epoch(const cps__coord *c);

#endif
