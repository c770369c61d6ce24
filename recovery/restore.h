/* A checkpoint restore's loop as one pure state machine (issue 28).
 *
 * The restore tool (src/checkpoint/cluster_restore.c) and the restore simulator
 * (tests/sim/restore_tool.c) are shells around it: they read the checkpoint's records into
 * per-range PUTs, feed what happens as events (cps__rs_step) and perform the outputs in their
 * order; they decide nothing. The machine owns the passes and their pacing, where each PUT goes and
 * which answer counts (the restore book, recovery/restore_route.h), the silent-head rule, the
 * waits' hard limits, when to look at the view again and the tails' confirmation.
 *
 * A pass: the machine says STREAM; the shell fills each open range's PUTs from the records and
 * feeds READY for each full one (PUT: send it; DISCARD: drop it; neither: the range's window is
 * full, the shell waits feeding events until the machine names that range), then STREAMED. The
 * machine waits for the heads' answers, probes every open range's tail, and ends the pass: DONE,
 * FAILED, or, after its pacing, a look at the view and STREAM again for the ranges stopped.
 *
 * Pure: no I/O, no clock (every event carries the shell's time). */
#ifndef CPS_RECOVERY_RESTORE_H
#define CPS_RECOVERY_RESTORE_H

#include <stdint.h>

#include "core/view.h"
#include "recovery/restore_route.h"

/* The restore's timers and limits. */
typedef struct cps__rs_cfg {
    uint64_t look_ms; /* a wait without answers: views looked at and silences judged this often */
    uint64_t refresh_ms; /* the view again this often when no chain member looks gone */
    uint64_t silent_ms;  /* a head silent this long in a pass has its range streamed again */
    uint64_t timeout_ms; /* the restore's timeout: a wait's, a silence's, the tails' */
    uint64_t gap_ms;     /* pass 2 begins at least this long after pass 1 began; each later
                          * gap doubles (the back-off, cps__rs_gap) ... */
    uint64_t gap_max_ms; /* ... up to this (0: refused by cps__rs_init, not "no cap") */
    uint64_t budget_ms;  /* the gaps of one incident sum to at most this: the restore gives up
                          * rather than begin a pass past it (cps__rs_pass_limit). An incident
                          * ends with a pass in which a tail confirmed a range or a range lost
                          * its last live replica: the back-off starts again at gap_ms with the
                          * whole budget */
    uint64_t probe_ms;   /* a tail probe's answer is waited for this long */
    uint64_t retry_ms;   /* ... and a tail probed again this long after a miss */
} cps__rs_cfg;

/* The back-off's budget: how long ranges refused by "not head" or "busy" (a head whose view is
 * late, a scheduler slow to publish one, a paused head) are tried again before the restore
 * fails. Production's failure timeout is 2 s; this waits out a view published 13 s late. */
#define CPS_RS_BUDGET_MS 15000

/**
 * @brief The restore tool's timers and limits, the same for the tool and the simulator (which
 *        must run what production runs): look 500 ms, refresh 2 s, a head silent 15 s, pass 2
 *        at least 250 ms after pass 1 began and each later gap doubled up to 2 s, the gaps of
 *        an incident within CPS_RS_BUDGET_MS (10 passes, the 10th at least 13.75 s after the
 *        first; a pass in which a tail confirmed a range ends the incident), a
 *        tail probe answered within 1 s and retried 20 ms after a miss; timeout_ms: the
 *        caller's (the restore's --timeout).
 */
void cps__rs_cfg_defaults(cps__rs_cfg *cfg, uint64_t timeout_ms);

/**
 * @brief The back-off: how long after pass `pass` (1: the first) began pass + 1 may begin:
 *        gap_ms doubled pass - 1 times, at most gap_max_ms (at least 1 ms).
 *
 *        Why a back-off in time, not a pass count: a range stopped by "not head" or "busy" is
 *        refused again until the head installs the view (or resumes), and how long that takes
 *        is the scheduler's, not the restore's. Fixed 500 ms gaps and 8 passes gave up after
 *        3.5 s; doubling keeps the first retries quick (a head change the view already shows)
 *        and spaces the rest, so the budget waits out 15 s with 10 passes, each of which reads
 *        and streams its ranges again. Passes counted only when the view did not change would
 *        not help: a slow scheduler is a view that does not change.
 */
uint64_t cps__rs_gap(const cps__rs_cfg *cfg, uint32_t pass);

/* How many passes one incident's budget allows (each gap within it; 1 when even pass 2's is
 * not): the machine keeps a running total of its gaps instead, and stops when the next would
 * pass budget_ms; this says how many passes that makes. */
uint32_t cps__rs_pass_limit(const cps__rs_cfg *cfg);

/* Events (cps__rs_event.kind). */
enum {
    CPS_RS_TICK = 1,  /* time passed (the deadline came), nothing received */
    CPS_RS_VIEW,      /* the scheduler's view, answering GET_VIEW (view: the newest) */
    CPS_RS_VIEW_NONE, /* GET_VIEW unanswered: the scheduler is off the data path */
    CPS_RS_ANSWER,    /* a PUT's answer (range, ans, seq: the head's sequence number) */
    CPS_RS_PROBE, /* a tail probe's answer (range, from; ok 0: an ERROR; seq: the tail's number) */
    CPS_RS_READY, /* range's next PUT is full; seq: the req_seq it would carry */
    CPS_RS_STREAMED, /* every record of the pass was handed out (the last READYs fed) */
};

typedef struct cps__rs_event {
    int kind;
    uint64_t now;          /* the shell's clock, ms (every event) */
    int gone;              /* a chain member's process looks gone (every event) */
    const cps__view *view; /* VIEW: borrowed until the next VIEW (the shell keeps it alive) */
    uint32_t range;
    uint32_t from; /* PROBE: the node that answered (only the probed tail's answer counts) */
    int ok;
    cps__rr_answer ans;
    uint64_t seq;
    uint64_t epoch; /* PROBE: the answerer's view epoch (0: unknown). One newer than the
                     * machine's is no confirmation: the chain may have grown a tail since (a
                     * joiner that lacks what this one holds), so the view is looked at first */
} cps__rs_event;

/* Outputs, performed in order (cps__rs_out.kind). */
enum {
    CPS_RS_PUT = 1,  /* send range's full PUT to `to` with req_seq `seq` under view epoch `epoch` */
    CPS_RS_DISCARD,  /* drop range's full PUT: the range is not streamed now */
    CPS_RS_GET_VIEW, /* ask the scheduler for the view; feed VIEW or VIEW_NONE next, nothing else */
    CPS_RS_PROBE_TAIL, /* ask range's tail `to` for its sequence number (CUT_PROBE) */
    CPS_RS_STREAM,     /* a pass begins: stream the records of the open ranges (cps__rs_open) */
    CPS_RS_DONE,       /* restored */
    CPS_RS_FAILED,     /* failed: rc (CPS_E...), range (where one is named), why (CPS_RS_WHY_...) */
};

/* Why a restore failed. */
enum {
    CPS_RS_WHY_NONE = 0,
    CPS_RS_WHY_DEADLINE,   /* no answer at all for the timeout (CPS_ETIMEDOUT; a tail: range) */
    CPS_RS_WHY_FATAL,      /* a head refused the records (its status) */
    CPS_RS_WHY_SILENT,     /* range's head silent through every pass for the timeout */
    CPS_RS_WHY_PASSES,     /* ranges still to stream after the last pass (CPS_EUNAVAILABLE) */
    CPS_RS_WHY_NO_REPLICA, /* range, not done, has an empty chain (at once), or its chain's
                            * members stayed dead past the back-off's budget (CPS_EUNAVAILABLE) */
};

typedef struct cps__rs_out {
    int kind;
    uint32_t range, to;
    uint64_t seq, epoch;
    int rc, why;
} cps__rs_out;

#define CPS_RS_OUT_MAX 8

/* One step's outputs, in the order to perform them. */
typedef struct cps__rs_ready {
    cps__rs_out out[CPS_RS_OUT_MAX];
    uint32_t n;
} cps__rs_ready;

enum {
    CPS_RS_START = 0,
    CPS_RS_PACING,
    CPS_RS_STREAMING,
    CPS_RS_DRAINING,
    CPS_RS_TAILS,
    CPS_RS_END
};

typedef struct cps__restore {
    cps__rs_cfg cfg;
    cps__rr_book book;
    const cps__view *v; /* the view the restore goes by (the shell's) */
    uint64_t epoch;
    int phase;
    int looking;   /* GET_VIEW out: the next event is its answer */
    int look_pass; /* ... the forced look before a pass */
    uint64_t now;  /* the last event's time */
    uint64_t next_look, last_look;
    int gone;
    uint32_t held; /* range whose READY waits for room (CPS_RR_NONE: none) */
    uint64_t held_seq;
    uint64_t last_seq;       /* the highest req_seq a READY carried */
    uint64_t wait_deadline;  /* waiting for answers: fail with no answer by then */
    uint32_t cursor;         /* TAILS: the range being confirmed */
    uint64_t probe_until;    /* ... its probe's answer waited for until then (0: none out) */
    uint64_t probe_again;    /* ... probed again then */
    uint32_t probe_to;       /* ... the tail that probe went to */
    uint64_t tails_deadline; /* ... every tail confirmed by then */
    uint32_t run;            /* passes in this incident (1: the first pass, or the one that
                              * confirmed a range last) */
    uint32_t confirmed;      /* ranges a tail confirmed since the last pass ended */
    uint32_t fresh;          /* ranges that lost their last live replica since then */
    uint64_t spent_ms;       /* the gaps of this incident so far (within cfg.budget_ms) */
    uint64_t waited_ms;      /* the gaps of the whole restore */
    uint64_t gap;            /* the gap before the next pass (PACING) */
    uint32_t resent;         /* ranges streamed again, over all passes */
    int rc, why;             /* the end: 0, or the failure */
    uint32_t bad;            /* the range a failure names (CPS_RR_NONE: none) */
} cps__restore;

/**
 * @brief A restore of nranges ranges under view v (borrowed: the shell keeps it alive and feeds
 *        each newer one as a VIEW event), at time now. Free with cps__rs_fini (also after a
 *        failed init). Errors: CPS_EINVAL (NULL, v of another range count, or
 *        cfg->gap_max_ms 0), CPS_ENOMEM.
 */
int cps__rs_init(cps__restore *m, const cps__rs_cfg *cfg, const cps__view *v, uint32_t nranges,
                 uint64_t now);
void cps__rs_fini(cps__restore *m);

/**
 * @brief Feed one event; *out (the caller's) receives the outputs to perform, in order.
 * @return 0; CPS_EINVAL (NULL, or an event the machine does not take now: a READY while one is
 *         held, or an event other than VIEW / VIEW_NONE after GET_VIEW). Events after DONE or
 *         FAILED produce nothing.
 */
int cps__rs_step(cps__restore *m, const cps__rs_event *e, cps__rs_ready *out);

/* When the shell feeds a TICK if nothing comes first (UINT64_MAX: only a message can move it). */
uint64_t cps__rs_deadline(const cps__restore *m);
/* Range r is streamed in this pass and not stopped: its records are worth reading. */
int cps__rs_open(const cps__restore *m, uint32_t r);
/* A READY waits for room: the shell feeds events until the machine names its range. */
int cps__rs_held(const cps__restore *m);
/* The restore ended (DONE or FAILED given). */
int cps__rs_ended(const cps__restore *m);

#endif
