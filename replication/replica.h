/* The server's data-path protocol as one state machine: etcd raft's Node, for a chain replica.
 *
 * One cps__replica per server process composes the pure parts (replication/chain, sync, ssp,
 * ackhold) and holds the policies that decide what a replica stores and answers: which requests
 * it takes (epoch, role, keys), a refused push turned into a SKIP update, the exactly-once and
 * clock records each update writes, sync aggregation and late pushes, push-pull and pull parking
 * under SSP, held CHAIN_ACKs, messages of a view epoch not installed yet, the ranges a new
 * view takes away, and both sides of state transfer (replica_join.c: the tail's shadow and
 * snapshot order, the joiner's decisions of recovery/joiner.c). It never touches a socket, the
 * store or the clock: messages and `now` come in through the calls below, the store is read through
 * cps__replica_env, and everything to do comes out as one ordered list (cps__replica_ready).
 *
 * The shell (src/server) receives a message, calls cps__replica_step, and performs the ready
 * list in order; it does the same after cps__replica_tick and cps__replica_set_view, and then
 * calls cps__replica_next until it returns 0 (messages the replica held come out one at a time,
 * so that each is decided on a store holding everything before it).
 *
 * Order of the ready list (perform it front to back; never reorder):
 *  - WRITE: the write set of one update, to apply in one store transaction. Each WRITE comes
 *    before every SEND and REPLY that depends on it: messages go out only after the writes
 *    before them are as durable as the store's sync mode makes any commit. One exception,
 *    forward before apply: a replica that is not the tail of the update's range puts the FWD
 *    of a new update to its successor immediately before that update's WRITE (same range,
 *    hdr.req_seq == seq, resend 0), so the successor receives it while we write it.
 *  - SEND: a complete wire message to a server (FWD, CHAIN_ACK, CHAIN_MARK), after its WRITE
 *    (the FWD above: right before it). Acks, re-sent FWDs, the CHAIN_MARK that says the update
 *    is applied and everything the tail sends still follow their WRITEs. The successor applies
 *    the FWD only once that MARK (or a re-send) comes, so a server that stops between such a
 *    FWD and its WRITE leaves an update nobody applied (replication/chain.h).
 *  - REPLY: an answer to a worker (ACK, VALUES read from the store when performed, ERROR).
 *    Pulls released by the SSP gate come out as REPLY items too, after the writes that let them
 *    through.
 *  - ASK_VIEW: ask the scheduler for the current view.
 *  - DROP_RANGE: a new view took a range away: clear our copy of it from the store.
 *  - SNAPSHOT: we are the tail of `range` and node `to` copies it (join id `seq`; `req` is its
 *    SNAP_REQ): stream the range from one read transaction of the store to it, as SNAP chunks
 *    (the header's step: the join id; aux 1 on the last, whose req_seq is the range's sequence
 *    number). Every update we apply from now on also goes to it. Report its end with
 *    cps__replica_snapshot_closed: until then a repeated SNAP_REQ of the same join orders none.
 *  - JOIN_CLEAR: we begin to copy `range` (join `seq`, from node `to`): clear our copy of it
 *    from the store. Always the last item; answer with cps__replica_join_result (value 0).
 *  - JOIN_INSTALL: write the SNAP chunk `req` (payload upd.body, upd.body_len bytes) of `range`
 *    into the store in one transaction; `last`: the last chunk, whose range entry sets the
 *    range's sequence number. Always the last item; answer with cps__replica_join_result
 *    (value: the range's sequence number after the last chunk).
 *  - LOG: a line for the server's log (the replica has no log of its own).
 * Timers: cps__replica_wait_ms says when cps__replica_tick is due at the latest (held acks).
 * CHAIN_MARK(APPLIED)s are held too, one per range, and go out at the next cps__replica_tick
 * (the end of the loop turn) with the highest seq applied, or earlier, right before the first
 * item of other work (another range's FWD and WRITE, a VALUES reply): several updates of a
 * range in a row cost one MARK, and a MARK never waits for work that would not replace it.
 * Held acks and MARKs come out as SEND items without msg (hdr only).
 *
 * Not thread-safe: one event loop owns a cps__replica.
 */
#ifndef CPS_REPLICATION_REPLICA_H
#define CPS_REPLICATION_REPLICA_H

#include <stddef.h>
#include <stdint.h>

#include "core/view.h"
#include "core/wire.h"
#include "recovery/fence.h"
#include "replication/chain.h"

typedef struct cps__replica cps__replica;

/* A received message, header decoded and payload 8-byte aligned. The replica takes it in every
 * call that accepts one: it gives `owner` back through env->release once it no longer needs the
 * payload (at the latest when the replica is destroyed), never before the ready list of the call
 * is consumed (WRITE bodies and VALUES keys may point into it). */
typedef struct cps__replica_msg {
    cps__msg_hdr hdr;
    const void *payload;
    size_t len;
    void *owner;
} cps__replica_msg;

/* What the replica needs of its surroundings. Store reads see every WRITE performed so far. */
typedef struct cps__replica_env {
    void *ctx;
    /* Sequence number of the last update applied to the range (0 if none). */
    int (*range_seq)(void *ctx, uint32_t range, uint64_t *seq);
    /* Exactly-once record of dedup id `id` in `range` (0 if none). */
    int (*dedup)(void *ctx, uint32_t range, uint32_t id, uint64_t *seq);
    /* Last applied step of the sync aggregate of key set `sig` in `range` (0 if none). */
    int (*agg_step)(void *ctx, uint32_t range, uint64_t sig, uint64_t *step);
    /* Check keys against the store. spec == NULL (a push): CPS_ENOTFOUND for a key never
     * declared, CPS_ESIZE for one of another length. spec != NULL (a declare): CPS_EEXIST for a
     * key that exists with another length. Sets *bad_key and *have_len (0 when absent). */
    int (*check_keys)(void *ctx, const cps__kv *kv, const cps__param_spec *spec, uint64_t *bad_key,
                      uint32_t *have_len);
    /* Call fn for every exactly-once record of `range` (SSP clocks are among them). */
    int (*scan_dedup)(void *ctx, uint32_t range, int (*fn)(void *arg, uint32_t id, uint64_t value),
                      void *arg);
    /* acc[i] += x[i] for i < n, bit for bit the same on every run (the sync sum). */
    void (*add)(void *ctx, float *acc, const float *x, size_t n);
    /* A message's owner the replica is done with (see cps__replica_msg). */
    void (*release)(void *ctx, void *owner);
    /* A buffer for a SEND item's message to node `to` (a transport buffer, so that the shell
     * sends it as it is: the server reserves it in its same-host ring, cps__tp_reserve, so that
     * a forwarded update is copied there once); NULL when out of memory. Every SEND's buffer is
     * the shell's once the call returns, whether it performs the item or not. */
    void *(*msg_alloc)(void *ctx, uint32_t to, size_t len);
} cps__replica_env;

typedef struct cps__replica_config {
    uint32_t self;      /* this server's node id for good (the chain is made at once), or 0: set by
                           the first view (cps__replica_set_view) */
    uint32_t resend_ms; /* chain: re-send unacknowledged FWDs after this long (200) */
    uint32_t max_unacked; /* chain: FWDs kept per range before admission pushes back (1024) */
    uint32_t max_held;    /* messages of a future epoch (or before the first view) kept (1024) */
    uint32_t join_timeout_ms; /* a join without its whole snapshot by then is given up (120000) */
    uint32_t snap_retry_ms;   /* SNAP_REQ is re-sent this often until a chunk comes (1000) */
    /* The fence (replica_fence.c): the scheduler's failure timeout (0: never unsure of our
     * standing), and the clock at creation (a stall is measured from it until the first turn). */
    uint32_t dead_after_ms;
    uint64_t start_ms;
} cps__replica_config;

/* One exactly-once record a WRITE stores: dedup id (a worker, with CPS_DEDUP_SPARSE_BIT or
 * CPS_DEDUP_CLOCK_BIT) -> value. */
typedef struct cps__replica_record {
    uint32_t id;
    uint64_t value;
} cps__replica_record;

enum {
    CPS_RO_WRITE = 1,
    CPS_RO_SEND,
    CPS_RO_REPLY,
    CPS_RO_ASK_VIEW,
    CPS_RO_DROP_RANGE,
    CPS_RO_LOG,
    CPS_RO_SNAPSHOT,
    CPS_RO_JOIN_CLEAR,
    CPS_RO_JOIN_INSTALL
};

/* What a view means for us (cps__replica_view_news, cps__replica_view). */
enum {
    CPS_RV_DONE = 0,  /* nothing more to do with it: older, confirming our standing, or ignored */
    CPS_RV_NEWER,     /* news: newer, install it (cps__replica_view) */
    CPS_RV_LET_IN,    /* news: newer, and it lets us in: check the job and take our id first */
    CPS_RV_INSTALLED, /* view: installed; the shell keeps its copy and performs the ready list */
    CPS_RV_FENCED     /* view: it counts us dead: the shell rejoins as a fresh replica */
};

/* Log levels of LOG items: those of core/log.h. */
typedef struct cps__replica_out {
    int kind;
    uint32_t range;
    /* WRITE: in one transaction, the update's data (upd.kind: PUSH adds the gradient of each key
     * through the optimizer, DECLARE creates the keys it names that are not there yet, PUT
     * installs whole records, SKIP writes no data), the range's sequence number (`seq`) and step
     * (raised to upd.step), every record of recs[], and, when upd.sig != 0, the key set's last
     * step (upd.step under upd.sig). */
    uint64_t seq;
    cps__chain_update upd;
    const cps__replica_record *recs;
    uint32_t nrecs;
    /* SEND: the whole wire message `msg` (len bytes, from env->msg_alloc: the shell takes it and
     * sends or frees it) to node `to`, or, when msg is NULL, the header-only message `hdr` (a
     * held CHAIN_ACK); resend: a re-send by the chain timer. REPLY: the answer to node `to`. */
    uint32_t to;
    void *msg;
    size_t len;
    int resend;
    /* REPLY: req is the request it answers (type, sender, req_seq, range, CPS_WF_NOAGG; a
     * pull's aux is the clock it reads at). hdr is the reply's header (type CPS_MSG_ACK or
     * CPS_MSG_VALUES; the shell fills in sender and epoch). VALUES carries the current values of
     * kv's keys, read when performed. An ERROR reply has status < 0 and `text` says why. */
    cps__msg_hdr hdr;
    cps__kv kv;
    int status;
    cps__msg_hdr req;
    /* LOG, ERROR: the text (valid until the next call). LOG: level (core/log.h). */
    const char *text;
    int level;
    /* DROP_RANGE: the range moved to other servers (1), or what we hold of it is stale (0). */
    int moved;
    /* JOIN_INSTALL: the snapshot's last chunk. */
    int last;
    /* REPLY with CPS_WF_LATE: 1 if the push is dropped, never to be applied anywhere (its step
     * closed without it); 0 for an old copy of a push the worker finished (applied or not).
     * Nothing to perform: it is what a checker of the protocol needs to know. */
    int dropped;
} cps__replica_out;

/* Counters for the server's /metrics page and heartbeat stats. */
typedef struct cps__replica_counters {
    uint64_t pushes, pulls;  /* PUSH(+PUSH_PULL) and PULL(+PUSH_PULL) requests taken */
    uint64_t late_gradients; /* sync pushes dropped: their step closed without them */
    uint64_t msgs_bad;       /* malformed requests and chain messages */
    uint64_t push_raw_bytes, push_wire_bytes;
    /* Chain messages sent (FWD, CHAIN_ACK, CHAIN_MARK; held ones when they go), and of those the
     * CHAIN_MARK(APPLIED)s; marks_merged: MARKs a later one of the same loop turn replaced. */
    uint64_t chain_sends, marks_sent, marks_merged;
} cps__replica_counters;

/* Errors: CPS_EINVAL, CPS_ENOMEM. env is copied; env->ctx is borrowed for the replica's life. */
int cps__replica_create(const cps__replica_config *cfg, const cps__replica_env *env,
                        cps__replica **out);
/* Frees everything, releasing every message still held. NULL is a no-op. */
void cps__replica_destroy(cps__replica *r);

/* Install a view (copied) known to count us in, bypassing the fence's judgement (which it
 * brings along: joined at the view's epoch); the shell uses cps__replica_view instead. `self` is
 * our node id in it (the first view's counts for the replica's life). `fresh`: we were just let in
 * (started, or rejoining after a fence): ranges whose chain does not name us are stale here and
 * dropped; otherwise ranges whose chain named us and no longer does are dropped (moved), if the
 * range count is the same. Held acks go out first, under the view they were made in; messages held
 * for this epoch are queued for cps__replica_next. Errors: CPS_ENOMEM, CPS_EINVAL (range count
 * changed under a chain). */
int cps__replica_set_view(cps__replica *r, const cps__view *v, uint32_t self, int fresh,
                          uint64_t now);

/* A request or chain message (DECLARE, PUSH, PUSH_PULL, PULL, FWD, CHAIN_ACK, CHAIN_MARK) from
 * a peer, taken. Our standing admits it first (replica_fence.c): a stall measured now makes us
 * unsure; dropped if not joined, fenced or unsure (or, a JOIN_RANGE, not from the scheduler); a
 * request before we are let in is held as by cps__replica_defer. One of a newer epoch than our
 * view is held until the view comes (ASK_VIEW). Also state transfer's messages (JOIN_RANGE from
 * the scheduler, SNAP_REQ, SNAP chunks), never held. Returns 0 (what became of it is in the
 * ready list). */
int cps__replica_step(cps__replica *r, cps__replica_msg *m, uint64_t now);
/* A request that came before our first view: held, taken, stepped once a view is installed. */
void cps__replica_defer(cps__replica *r, cps__replica_msg *m);
/* Step the next message a view released (held for its epoch, or deferred): 1 if one was
 * stepped (perform the ready list, then call again), 0 if none is left. */
int cps__replica_next(cps__replica *r, uint64_t now);

/* The end of a loop turn, and timers: send the CHAIN_MARK(APPLIED)s held this turn (one per
 * range, the highest applied seq), re-send overdue FWDs, send held acks that are due (all when
 * `force`), report sync steps that wait too long. The shell calls it every turn, before it
 * sleeps. */
int cps__replica_tick(cps__replica *r, uint64_t now, int force_acks);
/* Milliseconds until the next held ack is due (0 while MARKs are held), at most max_ms. */
int cps__replica_wait_ms(const cps__replica *r, uint64_t now, int max_ms);

/* State transfer (replica_join.c). */
/* The outcome of the JOIN_CLEAR or JOIN_INSTALL that ended the last ready list: rc 0 or the
 * store's error, value as the item says. The join goes on (the next ready list). Errors:
 * CPS_EINVAL (no outcome was awaited). */
int cps__replica_join_result(cps__replica *r, uint32_t range, int rc, uint64_t value, uint64_t now);
/* The joins' timer: re-ask for snapshots, give up joins past their deadline, report a copied
 * range that may serve reads. Returns 0. */
int cps__replica_join_tick(cps__replica *r, uint64_t now);

/* Restore, at the head (src/server/cut.c). */
/* A checkpoint restore's PUT of `range` (entries, len bytes, 8-byte aligned; borrowed until
 * the ready list is consumed). Returns a chain admission verdict (CPS_ADMIT_NEW: submitted),
 * or an error. */
int cps__replica_put(cps__replica *r, uint32_t range, uint64_t req_seq, const void *entries,
                     size_t len, uint64_t now);
/* Would cps__replica_put take a PUT of `range` now? CPS_ADMIT_NEW, CPS_ADMIT_NOT_HEAD (no chain
 * yet, or not its head) or CPS_ADMIT_BUSY (its successors hold max_unacked updates). Read-only:
 * the shell asks it before checking the records, so that a node which is not the head answers
 * "not head" (the tool asks the view) rather than judge records its store may not hold. */
int cps__replica_put_verdict(const cps__replica *r, uint32_t range);

/* The output of the last call, in order; valid until the next call into the replica. */
size_t cps__replica_ready(const cps__replica *r, const cps__replica_out **out);
/* Questions: are we the tail of `range`; are we copying it (a join begun, not yet a member);
 * since when a successor `node` leaves our FWDs unacknowledged (cps__chain_waiting_since). */
int cps__replica_is_tail(const cps__replica *r, uint32_t range);
int cps__replica_joining(const cps__replica *r, uint32_t range);
uint64_t cps__replica_waiting_since(const cps__replica *r, uint32_t node);
/* How long a SNAPSHOT's sending socket must stay open once its thread ended: nanomsg drops what
 * has not left yet when a socket closes, and the last chunk may still be in its buffers. */
#define CPS_REPLICA_SNAP_LINGER_MS 30000
/* May the shell close the socket of a SNAPSHOT of `range` to node `joiner` whose thread ended at
 * `ended_ms` with `status` (0: all sent)? 1 when the socket holds nothing the joiner still needs:
 * the send failed (the joiner asks again), our view has the joiner in the range's chain (it had
 * the whole snapshot), the joiner is gone from the view or dead (nothing to wait for), or it
 * lingered CPS_REPLICA_SNAP_LINGER_MS; 0 while it should stay open. Never fails. */
int cps__replica_snapshot_may_close(const cps__replica *r, uint32_t range, uint32_t joiner,
                                    int status, uint64_t ended_ms, uint64_t now);
/* The SNAPSHOT of `range` to `joiner` for join `join_id` (the item's range, to and seq) is over:
 * its socket closed, or it could not start. The joiner's next request of that join (it asks
 * again while no snapshot comes) orders a new one. `r` may be NULL; an unknown snapshot is
 * ignored. Never fails. */
void cps__replica_snapshot_closed(cps__replica *r, uint32_t range, uint32_t joiner,
                                  uint64_t join_id);
/* The chain state machine, read-only, for a checker of the protocol (tests/sim); NULL before
 * the first view. The shell asks the questions above instead. */
const cps__chain *cps__replica_chain(const cps__replica *r);
const cps__replica_counters *cps__replica_counts(const cps__replica *r);
/* Number of messages held (future epoch or deferred). */
uint32_t cps__replica_held(const cps__replica *r);

/* Our standing (replica_fence.c): the replica owns the recovery/fence.h machine, asks it before
 * it serves a message (cps__replica_step, cps__replica_admit), when the loop turns and when a
 * view comes; the shell only performs the ready list, and rejoins (a new replica) when fenced. */
/* A message the shell serves itself (WELCOME, VIEW, SHUTDOWN, CUT_*, PUT, CHECKSUM, ERROR, ACK):
 * may it? `boot_id`: this incarnation's id (non-zero), the one its HELLO carried; a WELCOME
 * whose req_seq names it answers that HELLO, and only such a WELCOME lets a replica not yet in
 * (a fresh one, or one fenced) in. A stall measured now makes us unsure first (LOG, ASK_VIEW
 * items). Returns a CPS_FENCE_* admission verdict; anything but CPS_FENCE_SERVE: drop it
 * (CPS_FENCE_EARLY never comes for these types). */
int cps__replica_admit(cps__replica *r, const cps__msg_hdr *h, uint64_t boot_id, uint64_t now);
/* The event loop turned at `now`: a stall since the last turn makes us unsure (LOG, ASK_VIEW),
 * and an unanswered question is asked again. Returns 0. */
int cps__replica_turned(cps__replica *r, uint64_t now);
/* A view `v` came (a WELCOME when `welcome`); `self`: our node id so far. A CPS_RV_* verdict:
 * DONE (the ready list may hold a LOG), NEWER or LET_IN (then cps__replica_view). */
int cps__replica_view_news(cps__replica *r, const cps__view *v, uint32_t self, int welcome);
/* Install `v` (after cps__replica_view_news said so), `self` our node id in it: CPS_RV_DONE
 * (ignored: fenced already), CPS_RV_FENCED (the view counts us dead: nothing installed), or
 * CPS_RV_INSTALLED, the ready list saying what to perform (LOG, DROP_RANGE of the ranges the view
 * took, or, let in, of those it does not give us; released messages follow with
 * cps__replica_next). Errors: as cps__replica_set_view (the shell must leave: the fence says we
 * are in, the replica has not installed the view). */
int cps__replica_view(cps__replica *r, const cps__view *v, uint32_t self, uint64_t now);
/* The fence, read-only, for the shell's questions (cps__fence_joined, _unsure, _fenced,
 * _beating, _dropped); valid for the replica's life. */
const cps__fence *cps__replica_fence(const cps__replica *r);

#endif
