/* The worker's request table, as a pure state machine: which server each request in flight goes
 * to and under which view epoch, when it goes out again (a timeout, a new view, a refusal under a
 * stale epoch, a reply produced under another epoch) and when it is given up (its range had no
 * live replica for the unavailable timeout).
 *
 * The caller (src/worker/client.c) owns the view, the operations the requests belong to, the
 * encoding and the sockets: it feeds in events (a request added, a reply's header, a view
 * installed, a tick, any message's epoch) and performs the actions the calls hand back
 * (cps__reqs_actions), reporting each send's outcome with cps__reqs_sent. Pure: no I/O, no clock
 * (time arrives as `now`, in milliseconds of any monotonic clock). Not thread-safe: one worker's
 * loop owns a cps__reqs.
 *
 * Why a request is re-sent when a view is installed: a server that moved or took over a range
 * may never have seen it, and the servers recognise duplicates (exactly-once), so re-sending is
 * harmless. Why a reply must carry the epoch its request was sent under: a server that kept
 * running through a view change, or one paused and woken, may answer from a configuration that
 * is no longer the range's, e.g. values without acknowledged writes.
 */
#ifndef CPS_RECOVERY_REQUESTS_H
#define CPS_RECOVERY_REQUESTS_H

#include <stddef.h>
#include <stdint.h>

#include "core/view.h"

typedef struct cps__reqs cps__reqs;

/* Requests out at once per range; more wait in the table, in adding order, and go out as earlier
 * ones leave. A large tensor is hundreds of requests (src/worker/layout.c): sent at once, the
 * last of them waited behind all the others longer than the request timeout and went out again,
 * and a declaration's repeats (which keep no exactly-once record) piled up at the head. A sync
 * step's dense pushes are not held back (see cps__reqs_add_ordered). */
#define CPS_REQS_WINDOW 128u

typedef struct cps__reqs_config {
    uint32_t request_timeout_ms;     /* unanswered for this long: ask for a view and re-send */
    uint32_t unavailable_timeout_ms; /* range without a live replica this long: CPS_EUNAVAILABLE */
    uint32_t retry_ms; /* after CPS_EAGAIN / CPS_ESTALE_EPOCH: re-send this much later */
} cps__reqs_config;

enum cps__reqs_action_kind {
    /* Encode request `index` (ctx, part, type, range, seq) and send it to node `to` under view
     * epoch `epoch`; then report the outcome with cps__reqs_sent(index). `attempt` is how many
     * sends of it went out before (0: its first), `why` a CPS_RQ_WHY_*. */
    CPS_RQ_SEND = 1,
    /* Ask the scheduler for the current view (the caller may rate-limit these). */
    CPS_RQ_ASK_VIEW,
    /* Request (ctx, part) is over with `status` (CPS_EUNAVAILABLE: its range had no live
     * replica for the unavailable timeout); it has left the table, unless `detach` is set: see
     * cps__reqs_detach, which the caller then calls with `index`. */
    CPS_RQ_COMPLETE,
    /* The range of request `index` has just lost its last live replica: the request waits up to
     * the unavailable timeout for one to come back (for the log). */
    CPS_RQ_WAIT_REPLICA
};

enum cps__reqs_why {
    CPS_RQ_WHY_NEW = 1, /* the request was just added */
    CPS_RQ_WHY_VIEW,    /* a new view was installed */
    CPS_RQ_WHY_TIMEOUT  /* unanswered (or waited for a view) for the request timeout */
};

typedef struct cps__reqs_action {
    int kind; /* CPS_RQ_* */
    int why;  /* CPS_RQ_SEND: CPS_RQ_WHY_* */
    int status;
    uint32_t index; /* position in the table until the next call other than cps__reqs_sent
                       and cps__reqs_detach; for CPS_RQ_COMPLETE only with detach set (else
                       the request has left) */
    void *ctx;      /* the caller's, from cps__reqs_add */
    uint32_t part;
    uint8_t type;
    uint32_t range;
    uint64_t seq;
    uint32_t to;
    uint64_t epoch;
    uint32_t attempt;
    int detach; /* CPS_RQ_COMPLETE of a push in sequence: it stays (see cps__reqs_detach) */
} cps__reqs_action;

/* Verdicts of cps__reqs_reply: what the caller does with the reply. */
enum cps__reqs_verdict {
    CPS_RQ_REPLY_UNKNOWN = 0, /* no such request: a duplicate answer to one completed; drop */
    CPS_RQ_REPLY_RETRY,       /* CPS_EAGAIN / CPS_ESTALE_EPOCH: parked; drop (see _reply) */
    CPS_RQ_REPLY_OTHER_EPOCH, /* produced under another epoch than its send: drop */
    CPS_RQ_REPLY_FAILED,      /* the server refused it: complete it with done->status */
    CPS_RQ_REPLY_TAKEN        /* the answer: decode it and complete the request */
};

/* The request a reply was matched with (verdicts other than CPS_RQ_REPLY_UNKNOWN). */
typedef struct cps__reqs_done {
    void *ctx;
    uint32_t part;
    int status;          /* CPS_RQ_REPLY_FAILED: the error to complete it with */
    uint64_t sent_epoch; /* the epoch it was last sent under */
    int detached;        /* completed already (see cps__reqs_detach): ctx is the detached one */
} cps__reqs_done;

/* The header fields of a reply (ACK, VALUES or ERROR) that the table reads. */
typedef struct cps__reqs_reply_in {
    uint8_t type; /* CPS_MSG_ACK, CPS_MSG_VALUES or CPS_MSG_ERROR */
    uint32_t range;
    uint64_t req_seq;
    uint64_t epoch; /* the epoch the reply was produced under */
    int status; /* the header's status; for CPS_MSG_ERROR a negative CPS_E… (else CPS_EPROTO) */
} cps__reqs_reply_in;

/* Errors: CPS_EINVAL (cfg or out NULL), CPS_ENOMEM. *out is the caller's, to free with
 * cps__reqs_destroy. */
int cps__reqs_create(const cps__reqs_config *cfg, cps__reqs **out);
/* Requests still in the table are dropped. NULL: no-op. */
void cps__reqs_destroy(cps__reqs *rq);

/* A message of any kind arrived carrying `epoch`: the table remembers the highest, since a pull
 * must not go to a tail of an older view than a server already answered under. */
void cps__reqs_epoch_seen(cps__reqs *rq, uint64_t epoch);

/* Add request (ctx, part) of wire type `type` with id `seq` on `range` at `now`, and send it
 * under view v (borrowed): a CPS_RQ_SEND to the range's head (its tail for CPS_MSG_PULL), or,
 * for a pull while a newer epoch than v's has been seen, a CPS_RQ_ASK_VIEW (it goes out once
 * that view is installed, or after the request timeout). A range v has no chain for is not
 * sent now: the timeout re-sends it. ctx is borrowed and handed back in actions and verdicts.
 * Errors: CPS_ENOMEM (nothing added, no action). */
int cps__reqs_add(cps__reqs *rq, const cps__view *v, void *ctx, uint32_t part, uint8_t type,
                  uint32_t range, uint64_t seq, uint64_t now);

/* cps__reqs_add for a request that must not overtake an earlier one given up: with `order` not
 * 0, a request added while an earlier one of the same (range, order) is detached (given up, still
 * sent: cps__reqs_detach) or held is held, neither sent nor re-sent, until no detached one is
 * ahead of it; it then goes out (CPS_RQ_WHY_NEW) from the call that removed the one ahead, or from
 * the next tick. A held request is given up as any other when its range has no replica. Why: the
 * worker passes a sync push's key set, because the head applies a key set's steps as they
 * complete and takes a push of a step at or below the last applied as a duplicate; a worker's
 * next step reaching the head before the step it gave up would make that push be answered as
 * applied though it is in no update (simulator seed 351). Requests merely in flight are not
 * held: pipelined pushes of a tensor keep their throughput (holding them all halved 1 MB sync
 * push+pull in bench/run_bench.sh); one overtaking another that the network or a full queue
 * delayed is left to the head's step order (replication/sync.c). `order` 0 is cps__reqs_add.
 * Errors: as cps__reqs_add. */
int cps__reqs_add_ordered(cps__reqs *rq, const cps__view *v, void *ctx, uint32_t part, uint8_t type,
                          uint32_t range, uint64_t seq, uint64_t order, uint64_t now);

/* The caller performed the CPS_RQ_SEND of request `index` from the last call at `now`, with
 * result rc (0: sent). A failed send (peer queue full, no memory) waits the request timeout
 * before the next try; a failed first send counts as an attempt all the same (the next one's
 * `attempt` is 1). Hands back no actions and keeps the last call's. Bad index: no-op. */
void cps__reqs_sent(cps__reqs *rq, uint32_t index, int rc, uint64_t now);

/* A reply to (in->range, in->req_seq) arrived at `now`; v (borrowed) is the current view. See
 * cps__reqs_verdict. For CPS_RQ_REPLY_FAILED and _TAKEN the request has left the table; *done
 * (may be NULL) says which it was. A retryable refusal parks the request: it goes out again
 * retry_ms later (cps__reqs_tick) or at once when a view is installed (cps__reqs_view), and a view
 * is asked for. A reply of another epoch re-sends it at the next tick if produced under an epoch
 * newer than its send's but not v's, asks for the view if newer than v's, and does nothing if older
 * (the answer to the last send is coming). May hand back one CPS_RQ_ASK_VIEW. */
int cps__reqs_reply(cps__reqs *rq, const cps__view *v, const cps__reqs_reply_in *in, uint64_t now,
                    cps__reqs_done *done);

/* Which request a VALUES or ACK reply (range, req_seq, produced under `epoch`) would complete if
 * it arrived now (cps__reqs_reply's CPS_RQ_REPLY_TAKEN for a caller still waiting): 1 and its
 * ctx and part, else 0. Pure: changes nothing, so a shell may ask it of a message it has not
 * authenticated yet, to plan where that message's values would be copied. */
int cps__reqs_would_take(const cps__reqs *rq, uint32_t range, uint64_t req_seq, uint64_t epoch,
                         void **ctx, uint32_t *part);

/* View v (borrowed) was installed at `now`: every request goes out again under it
 * (CPS_RQ_WHY_VIEW), parked ones included. */
void cps__reqs_view(cps__reqs *rq, const cps__view *v, uint64_t now);

/* A tick at `now` under view v (borrowed): a request whose range has had no live replica for
 * more than the unavailable timeout completes with CPS_EUNAVAILABLE (CPS_RQ_COMPLETE, with detach
 * set for a push the head admits in sequence: an async or SSP push, or a sparse-row one; the first
 * tick that finds it so hands back CPS_RQ_WAIT_REPLICA); one unanswered
 * for the request timeout (a parked one: retry_ms) asks for a view and goes out again under v
 * (CPS_RQ_WHY_TIMEOUT), a pull that must wait for a newer view than v excepted. */
void cps__reqs_tick(cps__reqs *rq, const cps__view *v, uint64_t now);

/* The caller performed the CPS_RQ_COMPLETE (detach set) of push `index` from the last call: the
 * push is over for the caller's operation, yet it stays in the table, re-sent as any other under
 * (ctx, part) (the caller's own copy of what it sends, handed back in its actions and verdicts,
 * with cps__reqs_done.detached set) until a server answers it, however long its range stays without
 * a replica. Why: its number was taken from the worker's sequence on the range, and the head drops
 * a later push of the worker as a gap until every earlier number reached it, so a push given up
 * for good would stall every later push of the worker on that range for ever (simulator seed 16
 * with --give-up). A server applies it at most once, so the caller's CPS_EUNAVAILABLE means "not
 * known to be applied", as it always did: it may have been applied before its replicas failed.
 * ctx NULL: the push leaves the table after all (a caller out of memory). Bad index: no-op. */
void cps__reqs_detach(cps__reqs *rq, uint32_t index, void *ctx, uint32_t part);

/* Data-path evidence (recovery/suspect.h): the earliest time (the `now` of its cps__reqs_sent) at
 * which a request still in the table went out to `node`, counted from its first send there (a
 * re-send to the same server keeps it; one to another server starts again); 0 if no request
 * sent to `node` waits. The caller compares it with when it last heard from `node`: a server
 * that keeps answering some requests is slow, not cut off. */
uint64_t cps__reqs_oldest_to(const cps__reqs *rq, uint32_t node);

/* Requests in the table, detached ones included. */
uint32_t cps__reqs_count(const cps__reqs *rq);

/* Detached requests in the table (see cps__reqs_detach). */
uint32_t cps__reqs_detached(const cps__reqs *rq);

/* The actions of the last call other than cps__reqs_sent, in the order to perform them. Valid
 * until the next such call; owned by rq. Returns their number. */
size_t cps__reqs_actions(const cps__reqs *rq, const cps__reqs_action **out);

#endif
