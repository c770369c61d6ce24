/* Where a checkpoint restore sends each range's records across view changes.
 *
 * A restore (src/checkpoint/cluster_restore.c) streams every range's records as PUTs to the range's
 * head, which applies each one, answers, and forwards it down the chain. A server that dies in the
 * middle of the restore is removed from the chains by the scheduler, and the restore goes on under
 * the new view instead of waiting out its timeout for answers that will never come:
 * - the range's head is the same: the chain itself re-sends to a new successor what it lacks
 *   (a middle or the tail died), so the records sent so far still count;
 * - the head changed (it died, or the scheduler moved it): the new head may lack any record of the
 *   range, even one the old head answered (a head answers before its successor has the update),
 *   so the range's stream starts again at the new head. Every record sets values (a create resets
 *   the key, a slice overwrites), so the stream sent again in its order leaves the same bytes;
 * - the chain is empty: the range cannot be restored; the restore fails at once, naming it;
 * - the chain holds only dead members (the last replica the coordinator keeps, recovery/
 *   view_change.h): the range comes back if that server restarts on its data, so it is not
 *   streamed now and waits, looked at again on each view and pass (the restore machine's
 *   back-off bounds the wait and then fails naming it, recovery/restore.h);
 * - a range its tail already confirmed is done whatever the view says later: none of this
 *   applies to it.
 *
 * Pure: no I/O, no clock. */
#ifndef CPS_RECOVERY_RESTORE_ROUTE_H
#define CPS_RECOVERY_RESTORE_ROUTE_H

#include <stdint.h>

#include "core/view.h"

/* No PUT of the range went anywhere yet (cps__restore_route's sent_head). */
#define CPS_RR_NONE UINT32_MAX

/* What a view means for a range's stream (cps__restore_route's resend). */
#define CPS_RR_KEEP    0 /* what was sent still counts */
#define CPS_RR_RESTART 1 /* the head changed: the stream starts again at v's head */
#define CPS_RR_DOWN    2 /* no member of the chain is alive: not streamed until one is */

/**
 * @brief Which ranges' streams must start again under view `v`.
 * @param[in]  v         the newest view
 * @param[in]  nranges   ranges of the restore (v->nranges must be the same)
 * @param[in]  sent_head per range, the node its PUTs of the current stream went to
 *                       (CPS_RR_NONE: none yet, nothing to lose)
 * @param[in]  done      per range, 1 if its tail confirmed it (not judged: CPS_RR_KEEP);
 *                       NULL: none is
 * @param[out] resend    per range (caller's array of nranges): CPS_RR_KEEP, CPS_RR_RESTART or
 *                       CPS_RR_DOWN (cps__view_range_available is 0: only dead members)
 * @param[out] bad       the first range not done with an empty chain (set only on
 *                       CPS_EUNAVAILABLE)
 * @return 0; CPS_EUNAVAILABLE (a range not done has an empty chain: nothing can come back);
 *         CPS_EINVAL (NULL argument, or a view of another range count).
 */
int cps__restore_route(const cps__view *v, uint32_t nranges, const uint32_t *sent_head,
                       const unsigned char *done, unsigned char *resend, uint32_t *bad);

/* What a restore makes of one answer of a range's head (cps__restore_answer). */
#define CPS_RR_IGNORE 0 /* no answer to this pass's PUTs in flight: drop it */
#define CPS_RR_TAKEN  1 /* the oldest PUT in flight was taken */
#define CPS_RR_AGAIN  2 /* the range's stream starts again, next pass, at the view's head */
#define CPS_RR_FATAL  3 /* the head refused the records themselves: the restore fails */

/* One answer, as the restore read it off the wire. */
typedef struct cps__rr_answer {
    uint32_t sender;  /* node that answered */
    int error;        /* 1: an ERROR; 0: the PUT's own reply */
    int status;       /* an ERROR's status (CPS_E...) */
    uint64_t put_seq; /* the PUT it answers: an ERROR's req_seq, a reply's aux (both echo the
                       * PUT's req_seq; a CUT_PROBE's ERROR carries 0) */
} cps__rr_answer;

/**
 * @brief Classify an answer for range r. A head answers a range's PUTs in the order they came,
 *        so an answer to a later PUT while an earlier one is unanswered proves the earlier one
 *        dropped (a head unsure of its view drops what comes meanwhile): the stream starts again
 *        at once, without waiting for a timeout; and an ERROR after such a drop (a slice of a key
 *        whose create was dropped) is its consequence, not a verdict on the records.
 * @param a        the answer (borrowed)
 * @param head     the node this pass's PUTs of r went to
 * @param seq0     the first req_seq of this pass: answers to earlier passes' PUTs are ignored
 * @param oldest   req_seq of r's oldest PUT in flight (ignored when inflight is 0)
 * @param inflight r's PUTs in flight, unanswered
 * @return CPS_RR_IGNORE (not from head, of an earlier pass, of no PUT in flight or of one already
 *         counted), CPS_RR_AGAIN (an earlier PUT dropped; or the head said "not head"
 *         CPS_ESTALE_EPOCH or "busy" CPS_EAGAIN), CPS_RR_TAKEN (the oldest PUT answered), or
 *         CPS_RR_FATAL (the oldest PUT refused with another error). Never fails; NULL a: ignore.
 */
int cps__restore_answer(const cps__rr_answer *a, uint32_t head, uint64_t seq0, uint64_t oldest,
                        uint32_t inflight);

/* What a restore does about a range whose head has PUTs in flight (cps__restore_silence). */
#define CPS_RR_WAIT    0 /* nothing yet */
#define CPS_RR_RESEND  1 /* silent too long in this pass: stream the range again */
#define CPS_RR_TIMEOUT 2 /* silent since quiet_since for the restore's whole timeout: fail */

/**
 * @brief Judge a range head's silence. Order proves a drop only when a later PUT is answered
 *        (cps__restore_answer); a head that dropped a range's last PUTs (unsure of its view, for
 *        less than the failure timeout, so the view does not move) answers nothing more. A slow
 *        head answers something within silent_ms (each answer restarts it), so a silent one has
 *        its range streamed again (records set values: that costs load, never bytes). The hard
 *        limit counts from quiet_since, which a new pass does not restart: a head silent through
 *        every pass fails the restore after timeout_ms, naming the range.
 * @param now         the caller's clock, ms
 * @param heard_ms    this pass: the head's last answer, or the send that found none in flight
 * @param quiet_since the head's last answer to any pass (or this head's first PUT)
 * @param inflight    the range's PUTs in flight; 0: CPS_RR_WAIT
 * @param silent_ms   silence that sends the range again (>= timeout_ms: never)
 * @param timeout_ms  the restore's timeout
 * @return CPS_RR_WAIT, CPS_RR_RESEND or CPS_RR_TIMEOUT. Never fails.
 */
int cps__restore_silence(uint64_t now, uint64_t heard_ms, uint64_t quiet_since, uint32_t inflight,
                         uint64_t silent_ms, uint64_t timeout_ms);

/* ---- the restore's book: per range, what went where and what came back ----
 *
 * A restore streams in passes and keeps, per range, the PUTs in flight, the head they went to,
 * the head's silence and whether the range is done. The book holds that state and applies the
 * verdicts above to it; the restore machine (recovery/restore.h) owns the book and the loop
 * around it, which src/checkpoint/cluster_restore.c and the restore simulator
 * (tests/sim/restore_tool.c) both drive. */

/* PUTs in flight per range before the tool waits for an answer. */
#define CPS_RR_WINDOW 16

typedef struct cps__rr_range {
    uint32_t head;           /* where this pass's PUTs went (CPS_RR_NONE: none yet) */
    unsigned char skip;      /* done: its tail confirmed an earlier pass (not streamed now) */
    unsigned char again;     /* stopped: streamed again, next pass, at the view's head */
    uint32_t inflight, fly0; /* PUTs in flight, unanswered; the oldest is fly[fly0] */
    uint64_t fly[CPS_RR_WINDOW];
    uint64_t acked_seq;   /* highest range sequence number the head reported this pass */
    uint64_t heard_ms;    /* the head's last answer (or the send that found none in flight) */
    uint64_t quiet_since; /* the head's last answer in any pass, or that head's first PUT */
    uint32_t quiet_head;  /* the head quiet_since is of (CPS_RR_NONE: none yet) */
    unsigned char down;   /* its chain had no live member in the last view the machine took */
} cps__rr_range;

typedef struct cps__rr_book {
    uint32_t nranges;
    cps__rr_range *g;      /* per range */
    unsigned char *resend; /* scratch for cps__restore_route */
    uint32_t *heads;       /* scratch: g[r].head, for cps__restore_route */
    unsigned char *done;   /* scratch: g[r].skip, for cps__restore_route */
    uint64_t seq0;         /* this pass's first req_seq: earlier numbers answer earlier passes */
    uint32_t pass;         /* passes begun (1 in the first) */
    uint64_t begun_ms;     /* when the last pass began */
} cps__rr_book;

/**
 * @brief A book for nranges ranges, none streamed. Errors: CPS_EINVAL (NULL), CPS_ENOMEM.
 *        Free with cps__rr_book_fini (also after a failed init).
 */
int cps__rr_book_init(cps__rr_book *b, uint32_t nranges);
void cps__rr_book_fini(cps__rr_book *b);

/**
 * @brief A pass begins; its PUTs' req_seqs are >= seq0 (req_seqs only grow). Ranges stopped in
 *        the last pass are streamed in this one, at the head the view names then; those not
 *        stopped are done (skip). Returns how many ranges this pass streams again (0 in the
 *        first pass; the caller's pass limit counts them).
 */
uint32_t cps__rr_pass_begin(cps__rr_book *b, uint64_t seq0, uint64_t now);

/**
 * @brief When the next pass may begin: gap_ms after the last one began (0 before the first;
 *        the machine's back-off chooses gap_ms, cps__rs_gap). A range stopped by "not head" from
 *        a new head that has not installed the view the tool reads already (or by "busy") would
 *        be refused again by a pass begun at once, and the passes spent in moments (sim_restore
 *        seeds 5471 and 9630, before the back-off: a view 300 ms late at the new head took all 8
 *        passes in 240 ms); a head change, a drop or a silence costs gap_ms more.
 */
uint64_t cps__rr_pass_due(const cps__rr_book *b, uint64_t gap_ms);

/* Range r is streamed in this pass and not stopped: its records go on. */
int cps__rr_open(const cps__rr_book *b, uint32_t r);
/* Ranges stopped in this pass (streamed again in the next). */
uint32_t cps__rr_stopped(const cps__rr_book *b);

/* Range r (open) is stopped before any PUT: not streamed in this pass, streamed again in the
 * next (its chain holds no live member now). Returns 1 if it stopped it, 0 if r was not open. */
int cps__rr_hold(cps__rr_book *b, uint32_t r);

/**
 * @brief Where range r's next PUT goes: the head of this pass's earlier PUTs, or, for its first,
 *        view_head (which it then is for the whole pass: a head change is the view's news,
 *        cps__rr_look). Returns CPS_RR_NONE when r is not open or view_head is CPS_RR_NONE.
 */
uint32_t cps__rr_target(cps__rr_book *b, uint32_t r, uint32_t view_head);

/**
 * @brief Range r's PUT req_seq went to its target at `now` (after cps__rr_target). Its window
 *        must have room (cps__rr_full): CPS_EINVAL otherwise, or if r is not open.
 */
int cps__rr_sent(cps__rr_book *b, uint32_t r, uint64_t req_seq, uint64_t now);
/* Range r has CPS_RR_WINDOW PUTs in flight: the caller waits for an answer first. */
int cps__rr_full(const cps__rr_book *b, uint32_t r);

/**
 * @brief One answer for range r (cps__restore_answer against this pass and r's oldest PUT in
 *        flight), applied: TAKEN pops the oldest PUT (range_seq, the head's sequence number in a
 *        reply, raises what the tail must confirm); AGAIN stops the range (streamed again next
 *        pass). *lost (may be NULL): on AGAIN by order, the earlier PUTs proven dropped.
 * @return the CPS_RR_* verdict (IGNORE for a range that is not open or out of range).
 */
int cps__rr_take(cps__rr_book *b, uint32_t r, const cps__rr_answer *a, uint64_t range_seq,
                 uint64_t now, uint32_t *lost);

/**
 * @brief A view came (the newest): ranges open whose head changed, or whose chain holds only
 *        dead members, stop (cps__restore_route; ranges already done are not judged).
 * @param[out] stopped how many it stopped (may be NULL)
 * @param[out] bad     on CPS_EUNAVAILABLE, the first range not done with an empty chain
 * @return 0, CPS_EUNAVAILABLE (nothing stopped then), CPS_EINVAL (another range count).
 */
int cps__rr_look(cps__rr_book *b, const cps__view *v, uint32_t *stopped, uint32_t *bad);

/* 1 with *range, the first range not done that has no live replica in v (an empty chain or only
 * dead members); 0 if there is none. */
int cps__rr_down(const cps__rr_book *b, const cps__view *v, uint32_t *range);

/**
 * @brief The silence of every open range's head at `now` (cps__restore_silence): silent ones
 *        stop. Returns 0 with *stopped (how many stopped: a caller waiting for answers stops
 *        waiting when it is not 0, they will not come), or CPS_ETIMEDOUT with *range, the first
 *        range whose head was silent for the whole timeout.
 */
int cps__rr_overdue(cps__rr_book *b, uint64_t now, uint64_t silent_ms, uint64_t timeout_ms,
                    uint32_t *stopped, uint32_t *range);

/**
 * @brief Range r's tail says it is at sequence number tail_seq: if that holds every PUT its head
 *        took this pass (tail_seq >= acked_seq), r is done for good (a later head change does
 *        not stream it again). Returns 1 if done now, 0 if not (or r not open with nothing in
 *        flight: CPS_EINVAL is never returned, a stale probe answer is just not enough).
 */
int cps__rr_confirm(cps__rr_book *b, uint32_t r, uint64_t tail_seq);

#endif
