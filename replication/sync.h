/* Sync-mode aggregation at the head of a range, as a pure state machine.
 *
 * In sync mode a step of a key set is applied once, as the sum of every live worker's gradient.
 * The head gathers the workers' pushes of (range, key-set signature, step) in a slot indexed by
 * worker rank; the slot is complete when every worker the view says is alive has pushed (a
 * worker declared dead is no longer waited for; what it pushed before dying still counts). The
 * complete slot is handed back as a SUBMIT action listing the contributions by rank: the caller
 * sums them in that order, so every run and every arrival order computes the same bits, and
 * submits the sum as one chain update (replication/chain.h).
 *
 * Backup workers (Chen et al., "Revisiting Distributed Synchronous SGD", 2016): when the view's
 * backup_workers b is above 0, a slot is also complete once it holds max(1, W - b) pushes, W the
 * live workers, whoever they came from: the first W - b to arrive make the step. The step is then
 * closed for the key set: the aggregator keeps, per range and key set, the last closed step and,
 * per range and worker, the request sequence number of its last push included in an aggregate.
 * A push of a closed step from a worker not included is LATE: never held, never applied to a
 * later step. The record is only what the caller feeds with cps__sync_record: what applied
 * aggregates included, which is in the replicated update and in every replica's store, so a new
 * head after a failover knows which steps closed and who made them. A SUBMIT alone closes
 * nothing: its update may never be applied (the head lost its place meanwhile), and its step
 * must then be gathered again, not refused. With b = 0 none of this is consulted: a step waits
 * for every live worker, as before.
 *
 * Contributions are the caller's: the state machine keeps an opaque cookie for each (the
 * received message) and never looks inside it. A cookie it takes is handed back exactly once:
 * in a SUBMIT action, or to the drop callback when the state machine is destroyed.
 *
 * Pure: no I/O, no clock (time arrives as `now`), no store. Not thread-safe: one event loop
 * owns a cps__sync.
 */
#ifndef CPS_REPLICATION_SYNC_H
#define CPS_REPLICATION_SYNC_H

#include <stddef.h>
#include <stdint.h>

#include "core/view.h"

typedef struct cps__sync cps__sync;

/* One worker's push for a step. */
typedef struct cps__sync_contrib {
    uint32_t worker; /* node id */
    uint8_t type;    /* CPS_MSG_PUSH or CPS_MSG_PUSH_PULL */
    uint64_t req_seq;
    uint64_t nvals; /* gradient length: the pushes of one step must agree */
    void *cookie;   /* the caller's; NULL in a by_rank array: that rank has not pushed */
    int first;      /* the worker's first push of the key set since it joined (CPS_WF_FIRST):
                       it has no push of an earlier step to come, and open earlier steps stop
                       waiting for it */
} cps__sync_contrib;

enum cps__sync_action_kind {
    /* The slot is complete and released: its cookies are the caller's again. Sum by_rank in
     * index order, submit, then free every cookie. */
    CPS_SA_SUBMIT = 1,
    /* The slot has waited long (CPS_SYNC_STUCK_MS, repeated every CPS_SYNC_STUCK_REPEAT_MS):
     * say which live ranks it waits for. The slot and its cookies stay the state machine's. */
    CPS_SA_STUCK
};

/* A step that cannot complete is said out loud; only the head gathers, so only it reports. */
#define CPS_SYNC_STUCK_MS        5000
#define CPS_SYNC_STUCK_REPEAT_MS 10000

typedef struct cps__sync_action {
    int kind; /* CPS_SA_* */
    uint32_t range;
    uint64_t sig, step;
    uint64_t since_ms;                /* when the slot got its first push */
    uint32_t count;                   /* pushes held */
    uint32_t nranks;                  /* the view's num_workers when the slot was opened */
    const cps__sync_contrib *by_rank; /* nranks entries, index = worker rank */
} cps__sync_action;

/* Verdicts of cps__sync_push. */
enum {
    CPS_SYNC_TAKEN = 0, /* held (cookie now the state machine's); a SUBMIT may follow */
    CPS_SYNC_RETRY = 1, /* this rank's push of the step is held already: the reply comes when
                           the step completes; the cookie stays the caller's */
    CPS_SYNC_SIZE = 2,  /* gradient length differs from another rank's for this step: refuse
                           (CPS_ESIZE); the cookie stays the caller's */
    CPS_SYNC_LATE = 3   /* backup workers: the step is closed and this worker's push is not in
                           it: drop it (never applied); the cookie stays the caller's */
};

/* Verdicts of cps__sync_check (CPS_SYNC_LATE as above). */
enum {
    CPS_SYNC_OPEN = 0,    /* the step is not closed for the key set: aggregate the push */
    CPS_SYNC_APPLIED = 4, /* the step is closed and this request is in an applied aggregate */
    CPS_SYNC_STALE = 5    /* the step is closed and a later push of the worker is in an applied
                             aggregate: an old copy of a request the worker has finished (a
                             worker's pushes of a key set go one after the other), included or
                             late, which is no longer known: answer it without a claim */
};

/* One request included in an applied aggregate. */
typedef struct cps__sync_member {
    uint32_t worker; /* node id */
    uint64_t req_seq;
} cps__sync_member;

/* Create an empty aggregator. `drop` (may be NULL) releases cookies still held when the
 * aggregator is destroyed; `ctx` is passed to it. Errors: CPS_ENOMEM. */
int cps__sync_create(void (*drop)(void *ctx, void *cookie), void *ctx, cps__sync **out);
/* Free the aggregator, handing every held cookie to `drop`. NULL is a no-op. */
void cps__sync_destroy(cps__sync *a);

/* A push of worker rank `rank` (its node id and request in *c) for step `step` of the key set
 * `sig` in `range`, which the chain admitted as new (CPS_ADMIT_NEW). `v` (borrowed for the
 * call) says which workers are alive and how many ranks there are. Returns a verdict (>= 0)
 * or CPS_EINVAL (rank >= v->num_workers, NULL cookie), CPS_ENOMEM; on an error the cookie stays
 * the caller's. */
/* With backup workers (v->backup_workers > 0) a push of a closed step is not held: the verdict is
 * cps__sync_check's (CPS_SYNC_LATE, CPS_SYNC_STALE, or CPS_SYNC_APPLIED for a retry of an
 * included push, which the caller answers as the duplicate it is); and a slot completes at max(1,
 * live - b) pushes. */
int cps__sync_push(cps__sync *a, const cps__view *v, uint32_t range, uint64_t sig, uint64_t step,
                   uint32_t rank, const cps__sync_contrib *c, uint64_t now);

/* The replicated record of an applied aggregate: steps of (`range`, `sig`) up to `step` are
 * closed, and each member's pushes up to its req_seq are in aggregates. Records only move
 * forward (a lower value is ignored), so the caller may feed what its store holds at any time,
 * e.g. before each check (sig 0: only the members are recorded). Errors: CPS_ENOMEM. */
int cps__sync_record(cps__sync *a, uint32_t range, uint64_t sig, uint64_t step, uint32_t nmembers,
                     const cps__sync_member *members);

/* Classify a push of `step` of (`range`, `sig`) by `worker` (request `req_seq`) against the
 * record: CPS_SYNC_OPEN (step above the last closed one), CPS_SYNC_APPLIED (closed, and the
 * request is the worker's last included one: a retry), CPS_SYNC_LATE (closed, and the request
 * is newer than any included: it was not), CPS_SYNC_STALE (closed, and older than the last
 * included one). *closed (may be NULL)
 * receives the key set's last closed step. Pure read: no actions. */
int cps__sync_check(const cps__sync *a, uint32_t range, uint64_t sig, uint64_t step,
                    uint32_t worker, uint64_t req_seq, uint64_t *closed);

/* A new view: every slot that no longer waits for anyone (its missing workers were declared
 * dead) is complete (SUBMIT actions, in slot order). `v` is borrowed for the call. Errors:
 * CPS_ENOMEM (the slots stay and are tried again at the next view). */
int cps__sync_set_view(cps__sync *a, const cps__view *v);

/* We are no longer in `range`'s chain (it moved to another server): every slot of it is
 * dropped, its cookies handed to `drop`; the workers re-send those pushes to the new head.
 * NULL: no-op. */
void cps__sync_forget_range(cps__sync *a, uint32_t range);

/* Timer: a STUCK action for each slot that has waited CPS_SYNC_STUCK_MS and was not reported
 * in the last CPS_SYNC_STUCK_REPEAT_MS. Errors: CPS_ENOMEM. */
int cps__sync_tick(cps__sync *a, uint64_t now);

/* Slots being gathered. */
uint32_t cps__sync_pending(const cps__sync *a);

/* The actions produced by the last call, in order. The array and everything it points to stay
 * valid until the next call into this aggregator. */
size_t cps__sync_actions(cps__sync *a, const cps__sync_action **out);

#endif
