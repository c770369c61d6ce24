/* Chain replication of key ranges, as a pure state machine.
 *
 * One cps__chain per server holds the protocol state of every range the server replicates. It is
 * driven by calls (a worker request admitted at the head, an update submitted at the head, a
 * message from a neighbour, a timer tick, a new view) and answers with actions that the caller
 * performs in order: APPLY (write the update to the store, in one transaction with its sequence
 * number and exactly-once records), SEND (a complete wire message to a node), REPLY (answer a
 * worker's request). It never touches sockets, the store or the clock: time arrives as `now`
 * arguments, and the store is read only through cps__chain_store_ops.
 *
 * Order: persist before send, with one exception, forward before apply. A replica that is not
 * the tail emits the FWD of a new update to its successor immediately before that update's
 * APPLY, so that the successor receives it while this replica writes it; after the APPLY comes
 * a CHAIN_MARK with CPS_CHAIN_MARK_APPLIED (our applied seq). Every other SEND and every REPLY
 * comes after the APPLYs it depends on: CHAIN_ACKs, those MARKs, re-sent FWDs, the tail's
 * replies and the FWD to a joining shadow. The successor applies a FWD only once its
 * predecessor applied it: the FWD's aux says how far the sender had applied when it sent it
 * (seq - 1 when sent ahead, seq when re-sent), and a FWD that came ahead is held (in the
 * received message, or a copy) until the MARK or a re-send says more; a view with another
 * predecessor drops what is held (the new one's re-sends replace it). So
 * every replica still holds every update its successor holds, and a replica that stops between
 * the FWD and its APPLY leaves an update that no one applied and no one acknowledged (the
 * simulator's --fwd-crashes stops servers there). What overlaps is the transfer and the
 * successor's copy with the sender's write.
 *
 * Protocol (van Renesse & Schneider, OSDI 2004; the parameter-server layout of Li et al., OSDI
 * 2014): the head gives each update of a range the next sequence number, forwards it (FWD) to
 * its successor and applies it, keeping it until acknowledged. Every replica applies FWDs (once
 * its predecessor has) strictly in sequence order with the same code, so replicas are bitwise
 * identical at equal sequence numbers. The tail replies to the workers and sends CHAIN_ACK(seq) to
 * its predecessor; each replica drops what the ack covers and passes the ack up. Unacknowledged
 * FWDs are re-sent after `resend_ms`, and to a new successor at once when the view changes.
 *
 * Exactly once: each update carries the requests it contains (worker, request seq); every
 * replica records them with the update. A request the head already applied is never applied
 * again: it is answered once the update that contained it is committed (acknowledged by the
 * tail), which is at once if nothing is pending.
 *
 * Not thread-safe: one event loop owns a cps__chain.
 */
#ifndef CPS_REPLICATION_CHAIN_H
#define CPS_REPLICATION_CHAIN_H

#include <stddef.h>
#include <stdint.h>

#include "core/view.h"
#include "core/wire.h"

typedef struct cps__chain cps__chain;

/* aux of a CHAIN_MARK a replica sends its successor after the WRITE of updates it forwarded
 * ahead of it (forward before apply): it applied everything up to the MARK's req_seq. */
#define CPS_CHAIN_MARK_APPLIED 2u

/* Update kinds. PUSH: gradients (kv with values). DECLARE: create keys. SKIP: no data, only
 * the exactly-once record of a push the head refused (unknown key, wrong length), whose number
 * of the worker's sequence is used up all the same; the body is the error (8 bytes, little
 * endian), and the tail's reply for it is that error: answered only once every replica holds
 * the record, a refusal never leaves a new head taking the worker's next push for a gap. A
 * retry of the refused push is a duplicate; the caller knows it is refused (its keys) and
 * answers the duplicate's REPLY with the error. PUT: whole records (values and optimizer
 * state) that replace what the keys hold (checkpoint restore). */
enum { CPS_UPD_PUSH = 1, CPS_UPD_DECLARE = 2, CPS_UPD_SKIP = 3, CPS_UPD_PUT = 4 };

/* One worker request contained in an update. */
typedef struct cps__chain_req {
    uint32_t worker; /* node id of the worker */
    uint8_t type;    /* CPS_MSG_PUSH, CPS_MSG_PUSH_PULL or CPS_MSG_DECLARE */
    uint8_t noagg;   /* sparse-row push: its own sequence space */
    uint64_t req_seq;
} cps__chain_req;

typedef struct cps__chain_update {
    uint32_t kind; /* CPS_UPD_* */
    uint64_t step; /* training step (sync: the aggregated step) */
    uint64_t sig;  /* sync aggregate: key-set signature; 0 otherwise */
    uint32_t nreqs;
    const cps__chain_req *reqs;
    const void *body; /* kv payload with values (PUSH) or DECLARE payload; 8-byte aligned */
    size_t body_len;
} cps__chain_update;

enum cps__chain_action_kind { CPS_CA_APPLY = 1, CPS_CA_SEND, CPS_CA_REPLY };

typedef struct cps__chain_action {
    int kind;
    uint32_t range;
    uint64_t seq;          /* APPLY: the update's sequence number */
    cps__chain_update upd; /* APPLY; REPLY: the update the request was in (body may be NULL) */
    uint32_t to;           /* SEND: destination node */
    const void *msg;       /* SEND: whole wire message (header + payload) */
    size_t len;
    cps__chain_req req; /* REPLY */
    void *cookie;       /* REPLY: what the caller gave cps__chain_admit, or NULL */
} cps__chain_action;

/* Read access to what the store holds, used when a range is first touched. */
typedef struct cps__chain_store_ops {
    /* Sequence number of the last update applied to the range (0 if none). */
    int (*range_seq)(void *ctx, uint32_t range, uint64_t *seq);
    /* Last applied request seq of `worker` (with CPS_DEDUP_SPARSE_BIT for sparse pushes). */
    int (*dedup)(void *ctx, uint32_t range, uint32_t worker, uint64_t *seq);
    /* Last applied step of the sync aggregate with signature sig; 0 if none. */
    int (*agg_step)(void *ctx, uint32_t range, uint64_t sig, uint64_t *step);
    /* Release a cookie of cps__chain_admit that will never be answered (its range left this
     * server, or the chain is destroyed), or a message cps__chain_on_message_owned kept. May be
     * NULL (the chain then copies what it would keep). */
    void (*drop_cookie)(void *ctx, void *cookie);
} cps__chain_store_ops;

typedef struct cps__chain_config {
    uint32_t self;        /* this server's node id */
    uint32_t resend_ms;   /* re-send unacknowledged FWDs after this long (default 200) */
    uint32_t max_unacked; /* FWDs kept per range before admission pushes back (default 1024) */
} cps__chain_config;

/* Errors: CPS_EINVAL, CPS_ENOMEM. ops and ctx are borrowed for the chain's lifetime. */
int cps__chain_create(const cps__chain_config *cfg, const cps__chain_store_ops *ops, void *ctx,
                      cps__chain **out);
void cps__chain_destroy(cps__chain *c);

/* Install a view (a copy is kept). Ranges whose successor changed re-send their unacknowledged
 * updates to it; a replica that became tail commits (and replies to) everything it holds; a
 * range no longer served here is forgotten. Errors: CPS_ENOMEM, CPS_EINVAL (range count
 * changed). */
int cps__chain_set_view(cps__chain *c, const cps__view *v, uint64_t now);

/* Verdicts of cps__chain_admit. */
enum {
    CPS_ADMIT_NEW = 0,      /* not applied yet: aggregate / submit it */
    CPS_ADMIT_DUP = 1,      /* applied already: a REPLY action carries `cookie` (now or later) */
    CPS_ADMIT_GAP = 2,      /* an earlier request of this worker is missing: drop, it re-sends */
    CPS_ADMIT_NOT_HEAD = 3, /* this server is not the range's head in the current view */
    CPS_ADMIT_BUSY = 4      /* too many unacknowledged updates: drop, the worker re-sends */
};
/* Decide what to do with a worker's push or declare arriving at the head. `sig` is the key-set
 * signature in sync mode (0 in async mode or for sparse/declare requests); req->step must be
 * set for sync pushes. Returns a verdict (>= 0) or CPS_ENOMEM / CPS_ESTORE. */
int cps__chain_admit(cps__chain *c, uint32_t range, const cps__chain_req *req, uint64_t step,
                     uint64_t sig, void *cookie);

/* At the head: give update u the next sequence number of the range, and emit SEND (the FWD) to
 * the successor, APPLY, then SEND of the CHAIN_MARK that says it is applied (or APPLY, then
 * REPLY for every request when this server is also the tail). The body is
 * copied when it must be kept for re-sending. Errors: CPS_EINVAL (not head), CPS_ENOMEM. */
int cps__chain_submit(cps__chain *c, uint32_t range, const cps__chain_update *u, uint64_t now);

/* A FWD or CHAIN_ACK from another server. The caller has checked the header decodes; this
 * checks the epoch (older: dropped, fenced) and the payload. Errors: CPS_EPROTO (bad payload),
 * CPS_ESTALE_EPOCH (dropped), CPS_ENOMEM. */
int cps__chain_on_message(cps__chain *c, const cps__msg_hdr *h, const void *payload, size_t len,
                          uint64_t now);
/* The same, with `owner`, the caller's handle on the message (NULL: none). A FWD that came
 * ahead of its predecessor's write is then held in the message itself rather than copied: *kept
 * is set to 1, and the chain gives owner back through ops->drop_cookie once done with it (the
 * actions of that call may still point into it: the caller keeps it until its next call into
 * the chain). Without ops->drop_cookie the chain copies. */
int cps__chain_on_message_owned(cps__chain *c, const cps__msg_hdr *h, const void *payload,
                                size_t len, void *owner, int *kept, uint64_t now);

/* Re-send what waited longer than resend_ms. */
int cps__chain_tick(cps__chain *c, uint64_t now);

/* 1 if this server is the tail of `range` in the current view (it serves pulls). */
int cps__chain_is_tail(const cps__chain *c, uint32_t range);

/* 1 if this server is joining `range` (cps__chain_begin_join, and no view since made it a member
 * or took the range away): only then may a snapshot be installed into its store. */
int cps__chain_joining(const cps__chain *c, uint32_t range);
/* 1 if this server is the head of `range`. */
int cps__chain_is_head(const cps__chain *c, uint32_t range);
/* Applied and committed sequence numbers of a range (0 if unknown here). */
uint64_t cps__chain_applied(const cps__chain *c, uint32_t range);
uint64_t cps__chain_committed(const cps__chain *c, uint32_t range);
/* Number of unacknowledged updates held for a range. */
uint32_t cps__chain_unacked(const cps__chain *c, uint32_t range);

/* Data-path evidence (recovery/suspect.h): the earliest time since which an update we forwarded
 * to `node`, our successor in some range, has waited for its ack with no ack of that range
 * making progress (counted from when `node` became our successor at the latest); 0 if nothing
 * waits at `node`. A successor cut off from us acknowledges nothing. */
uint64_t cps__chain_waiting_since(const cps__chain *c, uint32_t node);

/* The actions produced by the last call, in order. The array and everything it points to stay
 * valid until the next call into this chain; an APPLY's body may point into the caller's
 * update (valid as long as the caller keeps it). */
size_t cps__chain_actions(cps__chain *c, const cps__chain_action **out);

/* ---- state transfer (a replica joining a range's chain) ----
 * At the range's tail: also forward every update applied from now on to `node`, which is
 * copying the range for the scheduler's join `join_id`; its acks are accepted but commit
 * nothing. Cleared when `node` becomes our successor or leaves the view, or when it answers a
 * FWD of this join saying it is not copying the range (it gave the join up, or restarted while
 * our views still showed it alive). Errors: CPS_EINVAL
 * (not the tail, or `node` is not alive in our view), CPS_ESTALE_EPOCH (`join_id` is below one
 * a shadow of the range was added for since we became its tail: a late request of an earlier
 * join, which must not displace the current one). */
int cps__chain_add_shadow(cps__chain *c, uint32_t range, uint32_t node, uint64_t join_id,
                          uint64_t now);
/* At the joiner (not in the range's chain): forget our state of the range and hold the FWDs
 * that `source` sends until cps__chain_join_ready. Errors: CPS_EINVAL. */
int cps__chain_begin_join(cps__chain *c, uint32_t range, uint32_t source);
/* The snapshot at `snap_seq` is in the store: apply the held FWDs after it in order (APPLY
 * actions) and acknowledge them to the source; later FWDs are applied as they come. */
int cps__chain_join_ready(cps__chain *c, uint32_t range, uint64_t snap_seq, uint64_t now);
/* Give up a join (held FWDs dropped). */
void cps__chain_join_abort(cps__chain *c, uint32_t range);
/* 1 if this server may answer pulls of `range`: it is the tail and, if it became the tail by
 * joining, it has applied everything its predecessor had acknowledged (CHAIN_MARK). */
int cps__chain_can_serve_pull(cps__chain *c, uint32_t range);

/* Bytes of FWD messages produced so far (replication traffic), and updates committed. */
uint64_t cps__chain_fwd_bytes(const cps__chain *c);

#endif
