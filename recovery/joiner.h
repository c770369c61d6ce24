/* The joiner's side of state transfer, as a pure state machine: what a server does when the
 * scheduler orders it to copy a range (JOIN_RANGE), which snapshot chunks (SNAP) it takes, when
 * the copy is complete, when it reports CAUGHT_UP (once installed, again once it may serve reads),
 * when it re-asks for the snapshot or gives the join up, and what a new view does to a join under
 * way. The source's side (the tail streaming the snapshot) is src/server/transfer.c.
 *
 * The caller (src/server/transfer.c in production, tests/sim in the simulator) owns the chain
 * state machine, the store and the sockets: it feeds in events and performs the actions handed
 * back (cps__joiner_actions) in order. Three actions need an outcome before the join can go on:
 * BEGIN, INSTALL and READY. Each is the last action of its batch, and the caller reports how it
 * went with cps__joiner_result, which hands back the next batch. Pure: no I/O, no clock (time
 * arrives as `now`, in milliseconds of any monotonic clock). Not thread-safe: one event loop owns
 * a cps__joiner.
 *
 * Why the chunks carry a number (the header's req_worker, 0, 1, 2, ... within a stream): they
 * come from one snapshot thread over one connection, so in order, but nanomsg's tcp transport
 * reconnects by itself: a connection that breaks while a chunk is on the wire loses that chunk,
 * and the next goes over the new connection. Without numbers the joiner would take 0, 2, 3 (last),
 * install a snapshot lacking chunk 1's records, report CAUGHT_UP and serve as a replica missing
 * acknowledged updates. So only the next number is taken: a lower one is a repeat (ignored; it
 * would write the same records again), a higher one a gap, which gives the join up at once (the
 * scheduler orders another) rather than install. Number 0 after others starts over: a new stream
 * of the join (a new read, served for a repeated SNAP_REQ once the earlier stream was over)
 * writes the range again from its start. A chunk after the last one finds the join over and is
 * ignored. A chunk of another join (an earlier one, or from another source) is ignored by
 * its join id (the header's step) and sender.
 */
#ifndef CPS_RECOVERY_JOINER_H
#define CPS_RECOVERY_JOINER_H

#include <stddef.h>
#include <stdint.h>

#include "core/view.h"
#include "core/wire.h"

typedef struct cps__joiner cps__joiner;

typedef struct cps__joiner_config {
    uint32_t self;          /* this server's node id (sender of what it sends) */
    uint32_t nranges;       /* ranges of the job's view (fixed for the job) */
    uint32_t timeout_ms;    /* a join without its whole snapshot by then is given up (> 0) */
    uint32_t snap_retry_ms; /* SNAP_REQ goes out again this often until a chunk comes (> 0) */
    /* 1 if the scheduler's messages may overtake each other (the simulator's network): a
     * JOIN_RANGE whose join id is not above the last one seen for the range is then ignored (a
     * late duplicate), and one of an epoch above our view's asks for the view and is ignored (a
     * view sent before it may make us a member of the range meanwhile; the scheduler retries).
     * 0 over one in-order connection (production): only repeats of the join under way or of
     * the last one done are ignored. */
    int orders_may_reorder;
} cps__joiner_config;

enum cps__joiner_action_kind {
    /* Send header `hdr` (no payload) to node `to`: SNAP_REQ to the source, CAUGHT_UP to the
     * scheduler (node 0; aux 0 installed, 1 may serve reads, 2 gave up). */
    CPS_JA_SEND = 1,
    /* Ask the scheduler for the current view. */
    CPS_JA_ASK_VIEW,
    /* Forget our copy of `range`: cps__chain_begin_join(range, source), then clear the range in
     * the store. Report with cps__joiner_result (value unused). */
    CPS_JA_BEGIN,
    /* Write the SNAP chunk just given to cps__joiner_snap into the store (with the range's
     * sequence number when `last`). Report with cps__joiner_result, value: the snapshot's
     * sequence number when `last`. */
    CPS_JA_INSTALL,
    /* The whole snapshot at `seq` is in the store: load what depends on it (SSP clocks), then
     * cps__chain_join_ready(range, seq) and perform the chain's actions. Report with
     * cps__joiner_result, value: cps__chain_applied of the range. */
    CPS_JA_READY,
    /* The join of `range` is over unfinished: cps__chain_join_abort(range). `why` (static text,
     * NULL when a newer join replaces it: nothing to log) and `status` say why. */
    CPS_JA_ABORT
};

typedef struct cps__joiner_action {
    int kind; /* CPS_JA_* */
    uint32_t range;
    uint32_t source;  /* BEGIN */
    int last;         /* INSTALL */
    uint64_t seq;     /* READY: the snapshot's sequence number; BEGIN: the join id */
    int status;       /* ABORT: a CPS_E* code */
    const char *why;  /* ABORT */
    uint32_t to;      /* SEND */
    cps__msg_hdr hdr; /* SEND */
} cps__joiner_action;

/* Verdicts of cps__joiner_order and cps__joiner_snap. */
enum {
    CPS_JOINER_IGNORED = 0, /* stale, repeated or not ours: dropped (actions may ask a view) */
    CPS_JOINER_TAKEN = 1    /* acted on: perform the actions */
};

/* Errors: CPS_EINVAL (cfg or out NULL, a timer 0), CPS_ENOMEM. *out is the caller's, to free with
 * cps__joiner_destroy. */
int cps__joiner_create(const cps__joiner_config *cfg, cps__joiner **out);
/* NULL: no-op. */
void cps__joiner_destroy(cps__joiner *j);

/* View v (borrowed) was installed, after the chain's (cps__chain_set_view): its epoch goes on what
 * is sent from now on, and a join under way is given up (ABORT, CAUGHT_UP aux 2) when v already
 * counts us in the range's chain (a snapshot must not land in a store the chain serves from) or
 * its source left the chain or died (the scheduler abandoned that join: a new JOIN_RANGE names
 * the next source). Returns the number of actions; errors: CPS_EINVAL (another range count). */
int cps__joiner_view(cps__joiner *j, const cps__view *v, uint64_t now);

/* JOIN_RANGE from the scheduler: copy `range` from `source` for join `join_id`, sent under
 * `epoch`; v (borrowed) is our current view. A new join (ABORT of the one it replaces, then
 * BEGIN) or a verdict to drop it. Returns a verdict (>= 0). */
int cps__joiner_order(cps__joiner *j, const cps__view *v, uint32_t range, uint32_t source,
                      uint64_t join_id, uint64_t epoch, uint64_t now);

/* A SNAP chunk of `range` from `from` for join `join_id` (the header's step), number `num` in its
 * stream (the header's req_worker), of the read at sequence number `read_seq` (the header's
 * req_seq), `len` payload bytes, the last one when `last`.
 * `chain_joining` is cps__chain_joining(range): a view that made us a member, or took the range
 * away, ended the chain's join, and the chunk must not be written (ABORT). A number below the
 * next expected is a repeat (ignored), except 0, which starts a new stream of the join; one above
 * it means a chunk was lost: the join is given up (ABORT with status CPS_EPROTO, CAUGHT_UP aux 2),
 * nothing installed. Once a stream's chunk 0 is taken, a chunk 0 of a lower read_seq, or a later
 * chunk of another read_seq, belongs to an earlier stream cut short: ignored. Taken: one INSTALL.
 * Returns a verdict (>= 0). */
int cps__joiner_snap(cps__joiner *j, uint32_t from, uint32_t range, uint64_t join_id, uint32_t num,
                     uint64_t read_seq, int last, size_t len, int chain_joining, uint64_t now);

/* The outcome of the BEGIN, INSTALL or READY of `range` from the last call: rc 0 or a CPS_E*
 * code, and `value` as that action says. A failure gives the join up (ABORT, CAUGHT_UP aux 2,
 * so the scheduler retries without waiting out its deadline); success goes on: SNAP_REQ after
 * BEGIN, READY after the last INSTALL, CAUGHT_UP (aux 0, req_seq = value) after READY. Returns
 * the number of actions; CPS_EINVAL if no such outcome was awaited. */
int cps__joiner_result(cps__joiner *j, uint32_t range, int rc, uint64_t value, uint64_t now);

/* A timer tick at `now`: a join past its deadline is given up (ABORT, CAUGHT_UP aux 2); one
 * with no chunk yet re-sends SNAP_REQ every snap_retry_ms (lost, or the source had not seen our
 * view yet); a range installed and not yet confirmed reports CAUGHT_UP aux 1 once
 * can_serve(ctx, range) says it holds everything its predecessor acknowledged
 * (cps__chain_can_serve_pull). can_serve may be NULL (nothing confirmed). Returns the number of
 * actions. */
int cps__joiner_tick(cps__joiner *j, uint64_t now, int (*can_serve)(void *ctx, uint32_t range),
                     void *ctx);

/* 1 if a join of `range` is under way (ordered, snapshot not complete). */
int cps__joiner_active(const cps__joiner *j, uint32_t range);
/* The source of the join of `range` (0: none ever), and snapshot bytes taken by it so far. */
uint32_t cps__joiner_source(const cps__joiner *j, uint32_t range);
uint64_t cps__joiner_bytes(const cps__joiner *j, uint32_t range);

/* The actions of the last call, in the order to perform them. Valid until the next call into j;
 * owned by j. Returns their number. */
size_t cps__joiner_actions(const cps__joiner *j, const cps__joiner_action **out);

#endif
