/* A replacement worker's fetch of a live worker's shared buffer (cps_allreduce_fetch), and the
 * sharer's answer to it: the decisions. Who is asked, when a request goes again, which answer
 * counts, when the fetch ends and with what; and what a sharer puts in its answer.
 * src/worker/collective.c sends the requests and answers, copies the values and drives the
 * client's loop between calls. Pure: no I/O, no clock (`now` comes in).
 *
 * Use: cps__fetch_start, then cps__fetch_next in a loop until it says CPS_FETCH_DONE, performing
 * each CPS_FETCH_SEND and running the client's loop on CPS_FETCH_WAIT; a part of an answer that
 * arrives meanwhile goes to cps__fetch_part_take (an answer in one message, from a sharer that
 * predates parts, to cps__fetch_answer). */
#ifndef CPS_REPLICATION_RING_FETCH_H
#define CPS_REPLICATION_RING_FETCH_H

#include <stdint.h>

#include "core/view.h"

/* A request not answered within this is sent again (to the first live worker if the one asked
 * died meanwhile). */
#define CPS_FETCH_RESEND_MS 300

typedef struct cps__fetch {
    int active;        /* between cps__fetch_start and its CPS_FETCH_DONE (or cps__fetch_stop) */
    uint64_t len;      /* values wanted */
    uint64_t deadline; /* CPS_ETIMEDOUT from then on */
    uint64_t req;      /* the last request's number; grows over every fetch of the worker, so
                          a late answer to an earlier fetch never counts */
    uint64_t req0;     /* the first request sent to `from` since it was chosen: parts answering
                          any of req0..req are of the same sharer, and a part of a window that
                          takes longer than the re-send delay to arrive still counts */
    int sent;          /* the request `req` went to `from` at `sent_ms` */
    uint64_t sent_ms;
    uint32_t from; /* the worker asked (0: none yet) */
    int answered;  /* an answer to `req` from `from` came, with `result` */
    int result;    /* 1: the values were taken; else the sharer's refusal (CPS_E...) */
    int empty;     /* that refusal was CPS_ENOTFOUND with CPS_FETCH_NEVER_HELD: a replacement
                      that never held a state, not a worker that has shared nothing yet */
    /* A pass asks the live members in ring order until one gives the state. So far in this
     * pass: `empties` replacements said they never held one, `plain` some member has shared
     * nothing yet. At a pass's end with only empty replacements asked (or nobody), the fetch
     * decides with the scheduler's word, or is `idle` since `idle_ms` until the word comes (a
     * worker rank awaits its replacement) and asks again. */
    uint32_t empties;
    int plain, idle;
    /* Some pass ended so, and no member answered since with anything but a never-held refusal
     * (a plain refusal, a part, or CPS_EINVAL to a resume): at the deadline, CPS_ENOPEER
     * rather than CPS_ETIMEDOUT. A member silent from its first request leaves it set: an
     * empty replacement slow to answer and a stalled sharer cannot be told apart. */
    int waited;
    uint64_t idle_ms;
    uint64_t step; /* with result 1: the sharer's step */
    /* An answer in parts (cps__fetch_part_take): the parts taken so far are the first `have`
     * values of one answer of worker `from`, the one named by (gen, step, next, total) */
    int has_id;
    uint64_t gen, next, total, have;
    uint64_t id_req; /* the request whose part began the assembly: an older request's part of
                        another answer is stale, not news */
    uint64_t ask;    /* on CPS_FETCH_SEND: the request asks for the answer from this value on */
} cps__fetch;

/* Begin fetching `len` values at `now`, giving up after `timeout_ms`. A zeroed struct is a
 * fetcher that never fetched. */
void cps__fetch_start(cps__fetch *f, uint64_t len, uint64_t now, uint64_t timeout_ms);

/* The fetch was abandoned by the shell (its loop failed): no answer counts any more. */
void cps__fetch_stop(cps__fetch *f);

enum { CPS_FETCH_WAIT = 0, CPS_FETCH_SEND = 1, CPS_FETCH_DONE = 2 };

/* A refusal CPS_ENOTFOUND whose header `step` has this bit says "I am a replacement that never
 * held a state" (it took a dead worker's rank and has neither fetched, shared nor completed a
 * collective), as opposed to "I have shared nothing yet" (step 0: a worker before its first
 * share). Askers that predate it ignore a refusal's `step`, and a sharer that predates it sends
 * 0, which reads as the latter: no new wire version. */
#define CPS_FETCH_NEVER_HELD 1ull

/* The sharer's side: the header `step` of its refusal `status` (0 or CPS_E...), given whether it
 * is a `replacement` and whether it `ever_held` a state (shared one, fetched one or completed a
 * collective): CPS_FETCH_NEVER_HELD for a replacement's CPS_ENOTFOUND that never held one, else
 * 0. */
uint64_t cps__fetch_refusal_step(int status, int replacement, int ever_held);

/* What to do now. The ring's `n` members in order (`members`, this worker `me` among them or
 * not) and the view `v` say who may be asked; `shutdown`: the job ended; `settled`: the
 * scheduler says no worker rank awaits a replacement, so a worker not live in `v` finished its
 * work and left rather than died (CPS_VIEW_WORKERS_SETTLED, core/wire.h).
 *  - CPS_FETCH_SEND: send request *req (asking for f->len values, in parts from value f->ask on)
 *    to worker *to now.
 *  - CPS_FETCH_WAIT: let the client's loop run a little (answers come through it), then ask
 *    again.
 *  - CPS_FETCH_DONE: the fetch is over with *result: 1 (the values were taken, f->step is the
 *    sharer's step), or CPS_ENOTFOUND (no live worker shares a buffer: one has shared nothing
 *    yet, or every worker rank is live and none ever held a state), CPS_ESIZE (the sharer
 *    holds another length), CPS_ENOPEER (at the deadline, after a pass found no live worker
 *    holding a state while some rank awaited its replacement, and no member answered since with
 *    a plain refusal or a part: the replacement did not come), CPS_ETIMEDOUT (at the deadline
 *    otherwise), CPS_ESHUTDOWN (the
 *    job ended; or, with `settled`, no live worker is left to ask, or every live one is a
 *    replacement that never held a state while some rank's worker finished: the job's work is
 *    done, nobody will all-reduce with us), or a sharer's other refusal.
 * A refusal CPS_ENOTFOUND moves on to the next member after the one that gave it, in ring
 * order; when the member asked died or left the ring, a new pass begins from the first member
 * (the refusals counted so far are dropped). When nobody is left to ask (or only replacements that
 * never held a state) and the word is absent, the fetch waits (CPS_FETCH_WAIT) and asks the live
 * members again every CPS_FETCH_RESEND_MS, and at once when the word comes: a worker killed with us
 * may still be replaced, and the word says when every rank is accounted for. */
int cps__fetch_next(cps__fetch *f, const cps__view *v, const uint32_t *members, uint32_t n,
                    uint32_t me, int shutdown, int settled, uint64_t now, uint32_t *to,
                    uint64_t *req, int *result);

/* An answer in one message (a sharer that predates parts, asked in parts; see cps__fetch_part)
 * to request `req_seq` from worker `from`: the sharer's `status` (0 or CPS_E...),
 * `count` values, its `step` (for a refusal, its word: CPS_FETCH_NEVER_HELD). 1 when the shell
 * takes the first f->len values of it (and may adopt the ring's next collective and the result that
 * follow them, collective.h); 0 when it is ignored (no fetch under way, another request's, or the
 * outcome is a refusal, kept for cps__fetch_next). */
int cps__fetch_answer(cps__fetch *f, uint32_t from, uint64_t req_seq, int status, uint64_t count,
                      uint64_t step);

/* The sharer's side: what it answers a request for `want` values when it shares `share_len`
 * values (0: nothing) holding what the ring's collectives up to `share_seq` made, and its ring
 * keeps the result of collective `result_seq` (`result_len` values; `has_result` 0: none).
 * Returns 0 (send the shared values; *with_result 1: then that result too, when it is the
 * shared state's own and both fit in one message), CPS_ENOTFOUND (nothing shared: the asker
 * tries the next worker) or CPS_ESIZE (another length). */
int cps__fetch_serve(uint64_t share_len, uint64_t want, uint64_t share_seq, int has_result,
                     uint64_t result_seq, uint64_t result_len, int *with_result);

/* ---- The answer in parts ----
 * A request whose header `step` has CPS_FETCH_IN_PARTS set asks for the answer in parts, from
 * value `step & ~CPS_FETCH_IN_PARTS` on (cps__fetch's `ask`). The answer is the shared values and
 * then, always, the result of the shared state's own collective when the sharer keeps it: so the
 * result travels whatever the size. A sharer that predates parts ignores `step` and answers in
 * one message (cps__fetch_answer); one asked without the bit (an older asker) answers so too
 * (cps__fetch_serve). Each part repeats the answer's identity, so parts of two answers (the
 * sharer shared again between two requests, or another sharer) never mix: the asker assembles
 * one answer's parts in order, re-asks from the first value it lacks after CPS_FETCH_RESEND_MS
 * without progress, and uses nothing before it holds all of it. */
#define CPS_FETCH_IN_PARTS (1ull << 63)
/* Values per part (4 MiB: ~34 ms over 1 GbE, well under CPS_FETCH_RESEND_MS, so a part arrives
 * before a silence re-asks) and parts per request: a request is answered with at most a window of
 * parts (the asker asks for the next window when the last part of one came). A sharer serves a
 * request whose first value lies in the window it is serving the same asker (same answer, less
 * than CPS_FETCH_SERVING_MS ago) with nothing (cps__fetch_serve_again), so it queues one window
 * (16 MiB) per asker, and another only when asked past it or after CPS_FETCH_SERVING_MS (a
 * window lost with a broken connection). */
#define CPS_FETCH_PART_VALUES (1ull << 20)
#define CPS_FETCH_WINDOW      4u
#define CPS_FETCH_SERVING_MS  (10u * CPS_FETCH_RESEND_MS)
/* Bytes of a part's payload before its values. */
#define CPS_FETCH_PART_HDR 32u

/* A part of an answer. On the wire (message kind 6): header req_seq = the request's number, step
 * = the sharer's step, aux = the collective that follows the shared state, status = 0 (a refusal
 * is status CPS_E... with an empty payload); payload = u64 gen, u64 off, u64 total, u32 flags
 * (bit 0: the last part of this request's window), u32 zero, then `count` float32 values. */
typedef struct cps__fetch_part {
    uint64_t gen;   /* the sharer's share generation: grows with every cps_allreduce_share */
    uint64_t step;  /* the sharer's step (header) */
    uint64_t next;  /* the collective that follows the shared state (header aux) */
    uint64_t off;   /* this part's first value in the answer */
    uint64_t count; /* values in this part */
    uint64_t total; /* values of the whole answer: the shared ones, then the result */
    int last;       /* the last part of its request's window */
} cps__fetch_part;

/* Writes the 32-byte prefix of `p` into `out` (p->step and p->next go in the header). */
void cps__fetch_part_encode(void *out, const cps__fetch_part *p);

/* Reads the prefix of a part's payload (`len` bytes, the values after it) into *p (step and next
 * from the header, as given) and points *vals at the values (borrowed from `payload`). 0, or
 * CPS_EPROTO (short, values not whole floats, off + count past total, unknown flags or a
 * non-zero reserved word): nothing of it may be used. */
int cps__fetch_part_decode(const void *payload, size_t len, uint64_t step, uint64_t next,
                           cps__fetch_part *p, const float **vals);

/* The sharer's side of a request in parts, from value `from_off` on: as cps__fetch_serve (0,
 * CPS_ENOTFOUND, CPS_ESIZE) but the result goes whenever it is the shared state's own; *total =
 * the answer's values. CPS_EINVAL when from_off is not below *total (a resume past the end of a
 * new, shorter answer: the asker starts over from value 0). */
int cps__fetch_serve_parts(uint64_t share_len, uint64_t want, uint64_t share_seq, int has_result,
                           uint64_t result_seq, uint64_t result_len, uint64_t from_off,
                           uint64_t *total);

/* The k-th part (from 0) of the answer to a request from `from_off` in an answer of `total`
 * values, parts of `part_values` values, `window` parts per request: 1 and *off, *count, *last,
 * or 0 when there is no such part. */
int cps__fetch_part_at(uint64_t from_off, uint64_t total, uint64_t part_values, uint32_t window,
                       uint32_t k, uint64_t *off, uint64_t *count, int *last);

/* The split of a part of `count` values from answer value `off` on, in an answer whose first
 * `len` values are the shared state: *nstate values go to the state (from value off), the other
 * count - *nstate to the result (from its value *res_off). Pure; callers hold off + count <=
 * total (cps__fetch_part_decode checks it). */
void cps__fetch_part_split(uint64_t off, uint64_t count, uint64_t len, uint64_t *nstate,
                           uint64_t *res_off);

/* Whether a part (status 0) of an answer to request `req_seq` from worker `from` would be looked
 * at by cps__fetch_part_take at all (a fetch under way, asked of `from` by one of its requests
 * req0..req), and its total is one the asker could hold (f->len <= total, total - f->len below
 * 2^32): the shell grows its result buffer only for such a part. Pure. */
int cps__fetch_part_wanted(const cps__fetch *f, uint32_t from, uint64_t req_seq,
                           const cps__fetch_part *p);

/* The sharer's memory of the windows it last served, one per asker, CPS_FETCH_SERVED_ASKERS
 * askers at a time, the oldest forgotten first; zeroed: none. Every replacement asks the same
 * sharer (the lowest live rank), so "one window on its way per asker" holds for up to that many
 * replacements fetching at once; past it a forgotten asker's re-ask is served again (more queued,
 * nothing lost). */
#define CPS_FETCH_SERVED_ASKERS 16u
typedef struct cps__fetch_served {
    uint32_t to;
    uint64_t gen, from, end, at;
} cps__fetch_served;

/* Whether the sharer serves asker `to`'s request from value `from` of the answer `gen` at `now`
 * (1), or skips it (0) because its first value lies in the window it is serving that asker
 * (sent less than CPS_FETCH_SERVING_MS ago: those parts are still on their way). `s` holds
 * CPS_FETCH_SERVED_ASKERS entries. */
int cps__fetch_serve_again(const cps__fetch_served *s, uint32_t to, uint64_t gen, uint64_t from,
                           uint64_t now);

/* Remember that values from..end of answer `gen` went to `to` at `now` (its entry, or the
 * oldest's). */
void cps__fetch_served_note(cps__fetch_served *s, uint32_t to, uint64_t gen, uint64_t from,
                            uint64_t end, uint64_t now);

/* A part `p` of an answer to request `req_seq` from worker `from`, with the sharer's `status`,
 * arrived at `now` (for a refusal, which has no payload, only p->step counts: the header's
 * `step`, the refusal's word CPS_FETCH_NEVER_HELD). Parts answering any request sent to `from`
 * since it was chosen count (their identity and offset say they carry the same values); a refusal
 * only the last request's, and a refusal CPS_EINVAL to a request from a value past the start (the
 * sharer's new answer is shorter than the old one we resumed) restarts the assembly from value 0
 * instead of ending the fetch. A total of 2^32 values or more past f->len is refused (CPS_EPROTO).
 * 1: take it (copy its values to the answer's value p->off on: the first f->len values are the
 * shared state, the rest the result); 0: ignored (no fetch under way, another request's or
 * worker's, a part out of order, a part of another answer, which restarts the assembly from value
 * 0, or a refusal, kept for cps__fetch_next). When the last part is taken, cps__fetch_next says
 * CPS_FETCH_DONE with result 1: f->step, f->next and f->total describe the whole answer (f->total -
 * f->len values of result, of collective f->next - 1). */
int cps__fetch_part_take(cps__fetch *f, uint32_t from, uint64_t req_seq, int status,
                         const cps__fetch_part *p, uint64_t now);

#endif
