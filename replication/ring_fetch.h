/* A replacement worker's fetch of a live worker's shared buffer (cps_allreduce_fetch), and the
 * sharer's answer to it: the decisions. Who is asked, when a request goes again, which answer
 * counts, when the fetch ends and with what; and what a sharer puts in its answer.
 * src/worker/collective.c sends the requests and answers, copies the values and drives the
 * client's loop between calls. Pure: no I/O, no clock (`now` comes in).
 *
 * Use: cps__fetch_start, then cps__fetch_next in a loop until it says CPS_FETCH_DONE, performing
 * each CPS_FETCH_SEND and running the client's loop on CPS_FETCH_WAIT; an answer that arrives
 * meanwhile goes to cps__fetch_answer. */
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
    int sent;          /* the request `req` went to `from` at `sent_ms` */
    uint64_t sent_ms;
    uint32_t from; /* the worker asked (0: none yet) */
    int answered;  /* an answer to `req` from `from` came, with `result` */
    int result;    /* 1: the values were taken; else the sharer's refusal (CPS_E...) */
    uint64_t step; /* with result 1: the sharer's step */
} cps__fetch;

/* Begin fetching `len` values at `now`, giving up after `timeout_ms`. A zeroed struct is a
 * fetcher that never fetched. */
void cps__fetch_start(cps__fetch *f, uint64_t len, uint64_t now, uint64_t timeout_ms);

/* The fetch was abandoned by the shell (its loop failed): no answer counts any more. */
void cps__fetch_stop(cps__fetch *f);

enum { CPS_FETCH_WAIT = 0, CPS_FETCH_SEND = 1, CPS_FETCH_DONE = 2 };

/* What to do now. The ring's `n` members in order (`members`, this worker `me` among them or
 * not) and the view `v` say who may be asked; `shutdown`: the job ended.
 *  - CPS_FETCH_SEND: send request *req (asking for f->len values) to worker *to now.
 *  - CPS_FETCH_WAIT: let the client's loop run a little (answers come through it), then ask
 *    again.
 *  - CPS_FETCH_DONE: the fetch is over with *result: 1 (the values were taken, f->step is the
 *    sharer's step), or CPS_ENOTFOUND (no live worker shares a buffer), CPS_ESIZE (the sharer
 *    holds another length), CPS_ENOPEER (no live worker to ask), CPS_ETIMEDOUT, CPS_ESHUTDOWN,
 *    or a sharer's other refusal. A refusal CPS_ENOTFOUND moves on to the next member after the
 *    one that gave it, in ring order. */
int cps__fetch_next(cps__fetch *f, const cps__view *v, const uint32_t *members, uint32_t n,
                    uint32_t me, int shutdown, uint64_t now, uint32_t *to, uint64_t *req,
                    int *result);

/* An answer to request `req_seq` from worker `from`: the sharer's `status` (0 or CPS_E...),
 * `count` values, its `step`. 1 when the shell takes the first f->len values of it (and may
 * adopt the ring's next collective and the result that follow them, collective.h); 0 when it
 * is ignored (no fetch under way, another request's, or the outcome is a refusal, kept for
 * cps__fetch_next). */
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

#endif
