/* The worker's whole protocol as one state machine, as replication/replica is the server's and
 * recovery/coordinator the scheduler's: the view it works under, its request table
 * (recovery/requests.h: re-send after a timeout or a new view, parking after a retryable
 * refusal, giving up a range without a replica), the numbering of its requests, the training
 * step of each tensor (where a worker joining a running job starts, which push is its first),
 * its calls to the scheduler (join, tensor registration, barrier, leave) and when the scheduler
 * counts as gone.
 *
 * Why recovery/ and not replication/: what it decides is how a worker rides through failures
 * (view changes, fencing by epoch, re-sends, give-up); what a server does with a push is
 * replication/'s. recovery/requests.c, which it composes, sits here for the same reason.
 *
 * The shell (src/worker/worker.c receives, src/worker/client.c performs) receives a message, hands
 * its header and payload to cps__sess_step, and performs the output in order; it starts the API's
 * operations with cps__sess_begin and cps__sess_add and the scheduler calls with cps__sess_call,
 * ticks it with cps__sess_tick, and blocks its caller until the operation is over. Every call that
 * takes `now` replaces the output of the one before (cps__sess_output), so the shell performs each
 * call's output before it makes the next. Pure: no I/O, no clock (time arrives as `now`, in
 * milliseconds of a monotonic clock), no memory of the caller's kept beyond what is documented.
 * Not thread-safe: the shell serialises calls (client.c: under the client's lock).
 */
#ifndef CPS_RECOVERY_SESSION_H
#define CPS_RECOVERY_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "core/view.h"
#include "core/wire.h"
#include "recovery/requests.h"

typedef struct cps__sess cps__sess;

typedef struct cps__sess_config {
    uint32_t request_timeout_ms;     /* a request unanswered this long goes out again */
    uint32_t unavailable_timeout_ms; /* a range without a replica this long: CPS_EUNAVAILABLE */
    uint32_t retry_ms;               /* after CPS_EAGAIN / CPS_ESTALE_EPOCH: re-send this late */
    uint32_t view_ask_min_ms;        /* at most one view request to the scheduler this often */
    uint32_t hello_retry_ms;         /* HELLO and BYE go out again this often */
    uint32_t join_timeout_ms;        /* no WELCOME this long: the join fails (CPS_ETIMEDOUT) */
    uint32_t bye_wait_ms;            /* BYE unanswered this long: leave all the same */
    uint32_t dead_after_ms; /* the scheduler's death timeout: sets the suspect evidence time */
} cps__sess_config;

/* The kinds of operation the API makes. */
enum cps__sess_op_kind { CPS_SS_DECLARE = 1, CPS_SS_PUSH, CPS_SS_PULL, CPS_SS_PUSH_PULL };

/* A tensor's (or a raw key set's) training step, kept by the session so that a worker joining
 * a running job can align every tensor it has not pushed yet (cps__sess_clock_add). Caller's
 * memory, registered with the session for as long as the session lives. */
typedef struct cps__sess_clock {
    uint64_t step; /* pushes so far: the sync step and the SSP clock */
    int pushed;    /* a push of it went out: the next ones carry no CPS_WF_FIRST */
    struct cps__sess_clock *next;
} cps__sess_clock;

/* One operation of the API: a request per part (one key range each). Caller's memory; the
 * session fills it in (cps__sess_begin) and updates it until `pending` is 0. */
typedef struct cps__sess_op {
    int kind; /* CPS_SS_* (cps__sess_op_kind) */
    uint32_t nparts;
    uint32_t pending;       /* parts not answered yet */
    int result;             /* the first error, or 0 */
    uint64_t step;          /* the step the op's requests carry (a declare: the step found) */
    cps__sess_clock *clock; /* a push's tensor: a late answer moves it on */
    int first;              /* the tensor's first push from this worker (CPS_WF_FIRST) */
    int noagg;              /* sparse rows: applied on arrival (CPS_WF_NOAGG) */
} cps__sess_op;

enum cps__sess_action_kind {
    /* Encode part `part` of `op` as a request of wire type `type` with id `seq` on `range`,
     * with `flags` and `step` in its header, and send it to server `to` under `epoch`; then
     * report the outcome with cps__sess_sent(index). `attempt` (0: its first send) and `why`
     * (CPS_RQ_WHY_*) as in recovery/requests.h. */
    CPS_SS_SEND = 1,
    /* Send `hdr` with payload (`payload`, `len`; borrowed from the call that started it, NULL
     * for a view request) to the scheduler. */
    CPS_SS_SCHED,
    /* Server `to` listens at `addr` (borrowed from the view: valid until the next view). */
    CPS_SS_PEER,
    /* View `epoch` was installed (`first`: the first one); `count` requests go out again. */
    CPS_SS_VIEW,
    /* Part `part` of `op` was answered (`type` CPS_MSG_ACK or CPS_MSG_VALUES) by `to`; a
     * VALUES answer's payload is (`payload`, `len`), borrowed from cps__sess_step: the shell
     * decodes it into the op's output, and reports a mismatch with cps__sess_op_fail before
     * it performs the next action. `late`: a sync push answered as late (dropped). */
    CPS_SS_ANSWER,
    /* Server `to` refused part `part` of `op` with `status`; its text is (`payload`, `len`). */
    CPS_SS_REFUSED,
    /* `op` is over: every part answered or given up. Its result is op->result. */
    CPS_SS_DONE,
    /* The range of `op`'s part has lost its last live replica: it waits up to the unavailable
     * timeout for one (for the log). */
    CPS_SS_WAIT_REPLICA,
    /* Part `part` of `op` is given up with CPS_EUNAVAILABLE (its range had no replica for the
     * unavailable timeout). With `detach` set it is a push the head still needs: the shell
     * keeps a copy of what it sends (the caller's buffers are gone once the op is over) and
     * hands it over with cps__sess_detach(index, copy, 0) before the next action. */
    CPS_SS_GIVE_UP,
    /* A detached copy (`op`, from cps__sess_detach) was answered at last: free it. `status`
     * is the server's refusal, if it refused. */
    CPS_SS_RELEASE,
    /* The scheduler refused this worker (`status`, its text in `payload`, `len`): the job is
     * over for it (cps__sess_shutdown). */
    CPS_SS_EXPELLED,
    /* Time to tell the scheduler which servers leave our requests unanswered: the shell calls
     * cps__msg_report_suspects with cps__sess_waiting and `evidence_ms`. */
    CPS_SS_SUSPECTS
};

typedef struct cps__sess_action {
    int kind; /* CPS_SS_* (cps__sess_action_kind) */
    int why;
    int status;
    uint32_t index;
    cps__sess_op *op;
    uint32_t part;
    uint8_t type;
    uint16_t flags;
    uint32_t range;
    uint64_t seq;
    uint64_t step;
    uint32_t to;
    uint64_t epoch;
    uint32_t attempt;
    uint32_t count;
    int detach;
    int first;
    int late;
    uint32_t evidence_ms;
    const char *addr;
    cps__msg_hdr hdr;
    const void *payload;
    size_t len;
} cps__sess_action;

/* Errors: CPS_EINVAL (cfg or out NULL), CPS_ENOMEM. *out is the caller's, to free with
 * cps__sess_destroy. */
int cps__sess_create(const cps__sess_config *cfg, cps__sess **out);
/* Requests still in flight are dropped; clocks and ops stay the caller's. NULL: no-op. */
void cps__sess_destroy(cps__sess *s);

/* A message arrived at `now`: its header (already checked by the wire decoder) and payload
 * (borrowed for this call and its output). Once the job is over for us (cps__sess_shutdown),
 * a server's answer is ignored: every op's call has returned, and neither the op nor its
 * buffers may be touched. Errors: CPS_ENOMEM (a first view that could not be
 * installed; the next one is tried again). */
int cps__sess_step(cps__sess *s, const cps__msg_hdr *h, const void *payload, size_t len,
                   uint64_t now);
/* A view from the scheduler that arrived decoded (borrowed; the session keeps a copy), as a
 * WELCOME naming us `welcome_id` if not 0: cps__sess_step of a VIEW or WELCOME without the
 * decoding. The simulator's network carries views this way. Errors: CPS_ENOMEM, CPS_EPROTO (a
 * view that changes the range count). */
int cps__sess_view_in(cps__sess *s, uint32_t welcome_id, const cps__view *v, uint64_t now);
/* Time passed: re-sends, give-ups, scheduler calls re-sent or failed, suspect reports. Once
 * the job is over for us, no request is re-sent or given up (their ops' calls have returned). */
void cps__sess_tick(cps__sess *s, uint64_t now);
/* The latest time the next cps__sess_tick is due (the shell blocks no longer than that). */
uint64_t cps__sess_deadline(const cps__sess *s, uint64_t now);

/* Start `op` (kind, nparts and noagg set by the caller) under `clock` (NULL for a raw pull or
 * declare): a push moves the clock on a step, and is flagged its tensor's first if `mark_first`
 * and the clock has not pushed yet. Then cps__sess_add each part, in order. No output. */
void cps__sess_begin(cps__sess *s, cps__sess_op *op, cps__sess_clock *clock, int mark_first);
/* Send part `part` of op (started by cps__sess_begin) on `range`; `keyset` is a hash of the
 * part's keys (a sync step's push must not overtake the worker's push of an earlier step of
 * the same keys: cps__reqs_add_ordered). Errors: CPS_ENOMEM: this part and the ones after it
 * are not sent, and count as answered with CPS_ENOMEM (op->pending drops accordingly; a
 * CPS_SS_DONE follows if nothing else is pending). */
int cps__sess_add(cps__sess *s, cps__sess_op *op, uint32_t part, uint32_t range, uint64_t keyset,
                  uint64_t now);
/* The id (header req_seq) the last successful cps__sess_add gave its request: for logs and the
 * simulator's checks. */
uint64_t cps__sess_added_seq(const cps__sess *s);
/* The shell performed the CPS_SS_SEND `index` of the last output at `now` with result rc. */
void cps__sess_sent(cps__sess *s, uint32_t index, int rc, uint64_t now);
/* The shell's copy of the push given up in CPS_SS_GIVE_UP `index` (NULL: out of memory, the
 * push leaves the table and later pushes on its range may stall). */
void cps__sess_detach(cps__sess *s, uint32_t index, cps__sess_op *copy, uint32_t part);
/* A CPS_SS_ANSWER that did not decode: op's result becomes err unless it has one. */
void cps__sess_op_fail(cps__sess_op *op, int err);

/* A declaration found the job at `declared` (its op's step): register `clock` (the tensor's)
 * at that step; every tensor not pushed yet starts at the highest step any declaration found
 * (see cps__sess_start_step). A raw key set's clock is registered with `declared` 0. */
void cps__sess_clock_add(cps__sess *s, cps__sess_clock *clock, uint64_t declared);
/* The highest step a declaration found: where a worker joining a running job starts. */
uint64_t cps__sess_start_step(const cps__sess *s);

/* Calls to the scheduler, one at a time (the API's calls that wait for one do not nest):
 * CPS_MSG_HELLO (join: over when a WELCOME and a view came; CPS_EPROTO if that view does not
 * list us as a worker; CPS_ETIMEDOUT after the join timeout), CPS_MSG_REGISTER (a tensor's
 * description: over when answered; CPS_EEXIST if registered otherwise), CPS_MSG_BARRIER (over when
 * released), CPS_MSG_BYE (over when acknowledged, or after bye_wait_ms with CPS_ETIMEDOUT).
 * Register and barrier fail with CPS_ESCHEDULER when the scheduler answered nothing, not even
 * views, for the longer of the unavailable timeout and three request timeouts; every call fails
 * with CPS_ESHUTDOWN once the job is over for us. The payload is borrowed until the call is over.
 * Output: the first send. Errors: CPS_EBUSY (a call is in progress), CPS_EINVAL (another type). */
int cps__sess_call(cps__sess *s, uint8_t type, const void *payload, size_t len, uint64_t now);
/* 1 and *result set if the call is over (it then ends), else 0. */
int cps__sess_call_done(cps__sess *s, int *result);

/* The actions of the last call taking `now`, in the order to perform them. Owned by s, valid
 * until the next such call. Returns their number. */
size_t cps__sess_output(const cps__sess *s, const cps__sess_action **out);

/* The op and part whose values a VALUES message with header `h` would deliver if stepped now (an
 * ANSWER of cps__sess_step): 1 and them, else 0. Pure (see cps__reqs_would_take): for planning
 * the copy of a reply not yet authenticated (transport.h, cps__tp_defer_check). Always 0 once
 * the job is over for us (cps__sess_shutdown): every op's call has returned by then. */
int cps__sess_values_target(const cps__sess *s, const cps__msg_hdr *h, cps__sess_op **op,
                            uint32_t *part);
/* The view we work under (empty until the first is installed). */
const cps__view *cps__sess_view(const cps__sess *s);
/* Our node id (0 until the scheduler welcomed us) and rank (from the view). */
uint32_t cps__sess_id(const cps__sess *s);
/* 1 once the job is over for us (the scheduler said so, or refused us). */
int cps__sess_shutdown(const cps__sess *s);
/* 1 when the view we hold came with the scheduler's word that no worker rank awaits a
 * replacement (CPS_VIEW_WORKERS_SETTLED, core/wire.h): workers not live in it finished. */
int cps__sess_workers_settled(const cps__sess *s);
/* Our rank, as the view names it (0 before the join). */
uint32_t cps__sess_rank(const cps__sess *s);
/* Requests in the table, and those of them given up yet still sent (detached). */
uint32_t cps__sess_pending(const cps__sess *s);
uint32_t cps__sess_detached(const cps__sess *s);
/* How long the scheduler may answer nothing before a register or barrier call fails with
 * CPS_ESCHEDULER: the longer of the unavailable timeout and three request timeouts (for the
 * log line of that failure). */
uint64_t cps__sess_sched_gone_ms(const cps__sess *s);
/* Whether the caller of `op` stops waiting: 1 with *result set when every part was answered or
 * given up (op->result), or when the job is over for us with parts still pending
 * (CPS_ESHUTDOWN: nothing will answer them); else 0. */
int cps__sess_op_over(const cps__sess *s, const cps__sess_op *op, int *result);
/* 1 when a leaving worker has nothing left to wait for before its BYE: no request in flight,
 * or the job is over for us. */
int cps__sess_settled(const cps__sess *s);
/* What leaving returns: CPS_ETIMEDOUT if requests of a call are still unanswered, else 0.
 * Detached pushes do not count: their calls have long returned. */
int cps__sess_leave_result(const cps__sess *s);
/* cps__waiting_fn for cps__msg_report_suspects (ctx: the session): when a request of ours
 * first waited at `node` (0: none), and when we last heard from it (*heard). */
uint64_t cps__sess_waiting(void *ctx, uint32_t node, uint64_t *heard);

#endif
