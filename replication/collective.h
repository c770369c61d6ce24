/* AllReduce among the workers of a job, as a pure state machine: a ring of chunks.
 *
 * Lives in replication/ beside the sync aggregation (sync.h) because it is the same kind of
 * protocol: it orders and reduces the contributions of the live workers of a view, and the
 * purity check and the simulator cover this folder. Nothing here sends, sleeps or reads a clock:
 * the worker's shell (src/worker/collective.c) feeds messages, views and `now`, and performs the
 * ordered actions the object returns.
 *
 * Algorithm: a ring over the members of the view (the live workers, in rank order), reduce-scatter
 * then all-gather, 2(P-1) steps for P members. The n values are cut into P segments (segment s is
 * [s*n/P, (s+1)*n/P)), and each segment into C chunks of at most `chunk` values, so a member
 * forwards chunk c of step k+1 as soon as it has reduced chunk c of step k: sending, receiving
 * and adding overlap. Message index i = k*C + c; a member receives its predecessor's messages in
 * index order (one FIFO pipe per pair), so one counter says what comes next.
 *
 * Reduction order is fixed by the member list: segment s is summed as
 * ((x[s] + x[s+1]) + ...) + x[s-1] (member positions mod P), and its owner (position s-1)
 * divides by P for a mean before the all-gather. Every member copies the owner's bits, so all
 * hold the same bits, and a run with the same members gives the same bits again.
 *
 * Epochs. Every message carries the view epoch it was sent under and the collective's sequence
 * number (1, 2, ... per worker, the same on all workers since all call in the same order).
 * Messages of an older epoch are dropped (fencing); of a newer one, kept until the shell installs
 * that view (CPS_COLL_NEED_VIEW asks for it). A new view restarts the running collective from the
 * caller's untouched input among the new members, so a result never mixes two epochs' parts.
 * A member that already completed collective S under epoch E keeps S's result: a message of S
 * under a newer epoch (a member that had not completed S restarted it) makes it send that result
 * to every member (CPS_COLL_RESULT), which they take as theirs. The result is wholly epoch E's.
 *
 * A replacement worker is told the ring's next sequence number and the last collective's result
 * by the member it fetched the shared state from (cps__coll_set_next_seq, cps__coll_adopt_result).
 * One that fetched nothing (cps__coll_set_joining) takes the sequence number from the data
 * messages it receives, until its first collective completes; a view that re-forms the ring
 * meanwhile makes it wait for its new predecessor's first chunk and join that collective (its
 * seq may have come from a member now gone, ahead of the others).
 *
 * Not thread-safe. The view's member array and message payloads are borrowed for the call.
 */
#ifndef CPS_REPLICATION_COLLECTIVE_H
#define CPS_REPLICATION_COLLECTIVE_H

#include <stddef.h>
#include <stdint.h>

/* On the wire in the message header's `range` field (docs/wire.md, CPS_MSG_COLL). */
enum cps__coll_kind {
    CPS_COLL_DATA = 0,   /* a chunk of a ring step: index = step * C + chunk */
    CPS_COLL_RESULT = 1, /* a completed collective's whole result (index 0) */
    /* 2, 3 and 6 are the shell's (a replacement's state request, its answer in one message,
     * a part of its answer in parts: replication/ring_fetch.h). */
    CPS_COLL_ASK = 4,   /* "send your result of seq to all": from a member that cannot run it,
                         * or that lost a chunk of it (cps__coll_lost) */
    CPS_COLL_LISTEN = 5 /* a joiner re-formed by a view waits for its predecessor (seq: its own) */
};

enum cps__coll_op { CPS_COLL_SUM = 0, CPS_COLL_MEAN = 1 };

typedef struct cps__coll_msg {
    uint32_t from; /* sender node id (set by the shell from the header on receipt) */
    uint32_t kind; /* cps__coll_kind */
    uint64_t epoch;
    uint64_t seq;
    uint64_t index;
    uint64_t n;        /* values of the whole collective (a check: members must agree) */
    const float *vals; /* borrowed */
    uint64_t count;    /* values in vals */
} cps__coll_msg;

enum cps__coll_act_kind {
    CPS_COLL_SEND = 1,     /* send `msg` to node `to`: copy msg.vals before the next call */
    CPS_COLL_DONE = 2,     /* collective `seq` completed: the caller's buffer holds the result */
    CPS_COLL_FAILED = 3,   /* collective `seq` failed with `status`; the buffer is untouched */
    CPS_COLL_NEED_VIEW = 4 /* a message of epoch `epoch` arrived: fetch that view */
};

typedef struct cps__coll_act {
    int kind;
    uint32_t to;
    int status;
    uint64_t seq;
    uint64_t epoch;
    cps__coll_msg msg;
    /* SEND only: 1 when msg.vals is the payload that the out hook (cps__coll_set_out) gave for
     * this very message, already written: the shell sends that buffer as it is, no copy. */
    int built;
} cps__coll_act;

typedef struct cps__coll_stats {
    uint64_t completed, failed, restarts, results_sent, results_taken;
    uint64_t dropped_stale, dropped_bad, stashed, asks_sent, helped;
} cps__coll_stats;

typedef struct cps__coll cps__coll;

/* A collective endpoint for node `me`. `chunk`: values per message at most (0: 256 Ki).
 * `timeout_ms`: a running collective that makes no progress that long fails CPS_ETIMEDOUT.
 * Errors: CPS_EINVAL, CPS_ENOMEM. */
int cps__coll_create(uint32_t me, uint64_t chunk, uint64_t timeout_ms, cps__coll **out);
void cps__coll_destroy(cps__coll *c);

/* Where a forwarded chunk is written (optional). A member forwards every chunk it reduces or
 * gathers, except at the last step. Without a hook it writes the chunk into its own buffer and
 * the SEND action points there, for the shell to copy into a message. With one, it first asks
 * fn(ctx, to, m) for the payload of message m (every field set but vals; m->count floats,
 * 4-byte aligned, not overlapping anything the object holds) and writes the chunk there in the
 * same pass as its reduction (and, where the chunk is part of the result, into its own buffer
 * too): the SEND action then carries that payload with `built` set, and the shell must send or
 * give back that buffer. fn returning NULL (no memory) falls back to the copy for that chunk.
 * The values, and so the result's bits, are the same either way. */
typedef float *(*cps__coll_out_fn)(void *ctx, uint32_t to, const cps__coll_msg *m);
void cps__coll_set_out(cps__coll *c, cps__coll_out_fn fn, void *ctx);
/* Told (optional; ctx is the out hook's) as a payload from the out hook is written, piece by
 * piece of CPS_COLL_PIECE values: payload[0, done) is final and will not be written again, so
 * the shell can run the message's MAC over each piece while it is still in L1 (the transport's
 * cps__tp_fill) instead of in a pass of its own at send. Called with done rising to m->count. */
#define CPS_COLL_PIECE 4096u
typedef void (*cps__coll_written_fn)(void *ctx, float *payload, uint64_t done);
void cps__coll_set_written(cps__coll *c, cps__coll_written_fn fn);

/* Our node id, when it was not known at create (a worker still joining gets ring messages
 * before its id): before the first cps__coll_view. */
void cps__coll_set_me(cps__coll *c, uint32_t me);

/* Install view `epoch` whose collective members are `members` (node ids in a fixed order, the
 * same on every worker: worker rank order). An epoch not above the current one is ignored. With
 * `need_peers` (the job has more than one worker) a ring of us alone does not complete with our
 * own values: it waits for a view with a peer (a replacement) and fails CPS_ENOPEER at the
 * timeout. A running collective restarts among the new members (or
 * fails CPS_ESTALE_EPOCH if we are not one of them). Errors: CPS_ENOMEM (nothing changed). */
int cps__coll_view(cps__coll *c, uint64_t epoch, const uint32_t *members, uint32_t nmembers,
                   int need_peers, uint64_t now);

/* Start the next collective over `data[0..n)` (read as our contribution, then overwritten with
 * the result at CPS_COLL_DONE; the caller leaves it alone until DONE or FAILED). Its sequence
 * number is given back in *seq. Errors: CPS_EINVAL (n == 0 or too large, NULL), CPS_EBUSY (one is
 * running: the shell queues), CPS_ENOMEM. */
int cps__coll_start(cps__coll *c, float *data, uint64_t n, int op, uint64_t now, uint64_t *seq);

/* A message from the transport (authenticated already). Never fails: a bad one is counted. */
void cps__coll_step(cps__coll *c, const cps__coll_msg *m, uint64_t now);

/* Where the values of all-gather message m (every field set but vals, read from a header not
 * yet authenticated) would be copied if cps__coll_step got it now: the span of our working
 * buffer it fills, m->count floats. Only for the plain case (the running collective's next
 * chunk from our predecessor, in the all-gather phase, not helping or listening); NULL
 * otherwise. The shell may then check the message while copying its values there (one pass)
 * and, if the check passes, call cps__coll_step with m.vals = that pointer before anything else
 * changes this object: the ring skips its own copy. If the check fails the span holds bytes to
 * throw away: skip the step; the span is dead until the genuine chunk (which rewrites all of it)
 * is taken, since nothing reads it before (the result is copied out only when every chunk is
 * in, and a restart writes it afresh). */
float *cps__coll_place(cps__coll *c, const cps__coll_msg *m);

/* This endpoint is a replacement joining a running ring: until its first collective completes,
 * that collective takes the highest sequence number of the ring's data messages under the current
 * epoch (restarting under it), so it joins the collective the others are in; after a new view it
 * sends nothing until its predecessor's first data message, whose seq it takes (up or down). It
 * tells every member it listens (CPS_COLL_LISTEN); when every other member said so too (every
 * member is new), all take the highest seq named, or the seq of a member pinned there (below). No
 * timer: a predecessor merely slow sends its chunk later (a timer once let a joiner go on with its
 * own seq and mix two calls' inputs); a predecessor that never does leaves the collective to fail
 * CPS_ETIMEDOUT. Once it has reduced its own segment of a collective (its input may then be in a
 * peer's result), its call stays in that collective: it takes no higher seq from messages, and
 * after a view restarts it there. Used only when no fetch gave the sequence (cps__coll_set_next_seq
 * ends it). Never set it on a worker that started with the job: there a peer one collective ahead
 * is normal. */
void cps__coll_set_joining(cps__coll *c);

/* The next collective started gets sequence number `next` (>= 1): a replacement's, from the
 * member it fetched the shared state from (that member's cps__coll_seq when it shared it, + 1;
 * 0: an older sharer sent none). It ends joining (cps__coll_set_joining): the sequence is known,
 * not guessed. A member whose sequence was given this way and that gets a peer's chunk of an
 * earlier collective it never ran (the job's last one, restarted by a survivor under a view that
 * added us) asks every member for that collective's result (CPS_COLL_ASK), so the survivor
 * completes with it instead of waiting for our part. Messages kept meanwhile are looked at again:
 * perform the actions (cps__coll_actions).
 * `calls_queued`: the caller holds calls of this ring not finished yet (started or waiting to).
 * The sequence is then left as it is: those calls were ordered against the ring as it stood, and
 * an answer that comes late (a fetch given up, or the caller started calls first) must not
 * renumber them, or one member would run a call under another's sequence and mix two calls'
 * inputs. Errors: CPS_EBUSY (a collective runs, calls are queued, or next == 0: nothing changed,
 * no actions). */
int cps__coll_set_next_seq(cps__coll *c, uint64_t next, int calls_queued);

/* The running collective's sequence number, else the last started one's (0: none). */
uint64_t cps__coll_seq(const cps__coll *c);

/* The result of the last collective we completed, kept for members that restart it: 1 and its
 * seq, values (valid until the next call into the object) and length, or 0 when none is kept. */
int cps__coll_last_result(const cps__coll *c, uint64_t *seq, const float **vals, uint64_t *n);

/* (A member whose sequence was given that gets a peer's restart of a collective it skipped, with
 * no member holding its result, takes part in it with zeros, not its input: that input is its
 * own call's, and would count twice.) */

/* A replacement keeps the result of collective `seq` that the member it fetched from completed
 * (that member's cps__coll_last_result, sent with the shared state), after
 * cps__coll_set_next_seq(seq + 1): when survivors redo `seq` with us, after every member that
 * completed it died, we answer with it (CPS_COLL_RESULT) instead of leaving them waiting for a
 * part we never had. The values are copied. Errors: CPS_EINVAL (running, or seq is not the one
 * before our next), CPS_ENOMEM. Like cps__coll_set_next_seq, it leaves actions to perform. */
int cps__coll_adopt_result(cps__coll *c, uint64_t seq, const float *vals, uint64_t n);

/* A ring message for us was refused by the transport (it failed authentication: forged, or
 * damaged on the path) while our collective runs. Nothing re-sends it (its sender forwarded it and
 * keeps no copy of a reduction it forwarded), so the ring would wait out its timeout. A member that
 * completed this collective holds its result: ask every member for it (CPS_COLL_ASK), and again
 * every CPS_COLL_LOST_ASK_MS on tick until it completes; those that completed it send it to all,
 * who take it (the bits every member that completed holds, wholly of one epoch). Nothing when no
 * collective runs, or while listening or helping. When no member can complete it (a refused
 * reduce-scatter chunk holds up the whole ring), it still fails CPS_ETIMEDOUT at its timeout. */
#define CPS_COLL_LOST_ASK_MS 200u
void cps__coll_lost(cps__coll *c, uint64_t now);

/* Time passes: a collective without progress for timeout_ms fails CPS_ETIMEDOUT. */
void cps__coll_tick(cps__coll *c, uint64_t now);

/* The actions of the last call, in order; valid until the next call into the object. */
size_t cps__coll_actions(const cps__coll *c, const cps__coll_act **out);

/* 1 if a collective is running. */
int cps__coll_running(const cps__coll *c);
void cps__coll_stats_get(const cps__coll *c, cps__coll_stats *out);

/* Chunking arithmetic, exposed for tests: segment s of n values over p members is
 * [*lo, *hi); chunks per segment for n, p, chunk. */
void cps__coll_segment(uint64_t n, uint32_t p, uint32_t s, uint64_t *lo, uint64_t *hi);
uint64_t cps__coll_chunks(uint64_t n, uint32_t p, uint64_t chunk);

#endif
