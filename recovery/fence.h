/* A server's standing in the job, as a pure state machine: whether it may serve, which messages
 * it drops meanwhile, when it asks the scheduler for the view, what a view from the scheduler
 * means for it, and when it starts over as a fresh replica.
 *
 * Standings: not joined (waiting for the scheduler to let it in: worker requests are held, the
 * rest dropped); joined; unsure ("suspect": the event loop did not turn for longer than the
 * failure timeout — SIGSTOP, a VM pause, a starved CPU — so the scheduler may have declared it
 * dead and moved its chains on: it serves nothing until a view says it is still in); fenced (a
 * view counts it dead: it must drop its chain state and rejoin as a fresh replica, since serving
 * anything under its old view could only do harm). Correctness rests on epochs, never on the
 * failure detector being right: a server declared dead while alive learns it from the next view.
 *
 * The caller (src/server/server.c) owns the view, the chain state and the sockets; it asks this
 * machine before it serves a message or installs a view, and performs what the verdicts say.
 * Pure: no I/O, no clock (time arrives as `now`). Not thread-safe: one event loop owns it. */
#ifndef CPS_RECOVERY_FENCE_H
#define CPS_RECOVERY_FENCE_H

#include <stdint.h>

typedef struct cps__fence cps__fence;

/* Verdicts of cps__fence_admit: what to do with a message of a given type. */
enum {
    CPS_FENCE_SERVE = 0, /* handle it */
    CPS_FENCE_DROP,      /* not for us now (not joined, or not from whom it must come) */
    CPS_FENCE_UNSURE,    /* dropped unanswered while unsure of our standing (counted) */
    CPS_FENCE_EARLY      /* a worker request before we are let in: hold it until then */
};

/* Verdicts of cps__fence_view and cps__fence_install. */
enum {
    CPS_FENCE_V_IGNORE = 0, /* an older view, or one more saying we are fenced: drop it */
    CPS_FENCE_V_CONFIRMED,  /* the view we hold counts us in: no longer unsure; drop it */
    CPS_FENCE_V_NEWER,      /* newer: (welcome: check it names us), then cps__fence_install */
    CPS_FENCE_V_FENCED,     /* we were declared dead: drop the view, rejoin (cps__fence_rejoin) */
    CPS_FENCE_V_INSTALL,    /* install it: we are in */
    CPS_FENCE_V_JOINED      /* install it: the first view since we (re)started, we are let in */
};

/* dead_after_ms: the scheduler's failure timeout; `now`: the loop's start. Errors: CPS_EINVAL (out
 * NULL), CPS_ENOMEM. *out is the caller's, to free with cps__fence_destroy. */
int cps__fence_create(uint32_t dead_after_ms, uint64_t now, cps__fence **out);
/* NULL: no-op. */
void cps__fence_destroy(cps__fence *f);

/* Verdicts of cps__fence_check and cps__fence_turned. */
enum {
    CPS_FENCE_CALM = 0, /* nothing to do */
    CPS_FENCE_STALLED,  /* we just became unsure: log, and ask the scheduler for the view */
    CPS_FENCE_ASK_AGAIN /* still unsure after dead_after_ms: ask for the view again */
};

/* Before a message is handled at `now`: if the loop has not turned for longer than the failure
 * timeout, we become unsure, and stay so until a view says whether we are still in (its answer
 * decides). A CPS_FENCE_* verdict above. */
int cps__fence_check(cps__fence *f, uint64_t now);
/* The event loop turned at `now`: cps__fence_check, then the stall is measured from now. */
int cps__fence_turned(cps__fence *f, uint64_t now);

/* Where a message comes from, for cps__fence_admit. */
enum {
    CPS_FENCE_FROM_PEER = 0,  /* a server, a worker or a tool */
    CPS_FENCE_FROM_SCHED = 1, /* the scheduler */
    CPS_FENCE_OUR_WELCOME = 2 /* the scheduler's WELCOME answering this incarnation's HELLO */
};

/* A message of wire type `type` from `origin` (a CPS_FENCE_FROM_* / _OUR_WELCOME): a
 * CPS_FENCE_* verdict. Not joined, only our WELCOME lets us in: a VIEW (broadcast before the
 * scheduler handled our HELLO, or sent to our previous life) or another incarnation's WELCOME
 * would have a fresh replica take the chain positions its old state held, and answer for updates
 * it does not have (simulator seeds 917 and 845). A message dropped while unsure is counted
 * (cps__fence_dropped). */
int cps__fence_admit(cps__fence *f, uint8_t type, int origin);

/* 1 if a message of `epoch` must wait for a view we have not installed yet (joined, and newer
 * than our view): the caller holds it and asks for the view. */
int cps__fence_future(const cps__fence *f, uint64_t epoch);

/* A view of `epoch` came from the scheduler; `in_view` and `alive` say whether it lists us (by
 * the id we have) and counts us alive. A CPS_FENCE_V_* verdict: IGNORE, CONFIRMED or NEWER. */
int cps__fence_view(cps__fence *f, uint64_t epoch, int in_view, int alive);
/* After CPS_FENCE_V_NEWER (and, for a welcome, once the caller knows its id): install the view
 * of `epoch`, or not. IGNORE (fenced already), FENCED (now fenced), JOINED or INSTALL. */
int cps__fence_install(cps__fence *f, uint64_t epoch, int in_view, int alive);

/* Start over as a fresh replica at `now` (fenced): not joined, sure, no epoch. */
void cps__fence_rejoin(cps__fence *f, uint64_t now);

int cps__fence_joined(const cps__fence *f);
int cps__fence_unsure(const cps__fence *f);
int cps__fence_fenced(const cps__fence *f);
/* 1 if the heartbeat may tell the scheduler we are alive: joined and not fenced (a beat from a
 * server the view lists as dead earns it a VIEW that a rejoin would take for its WELCOME). */
int cps__fence_beating(const cps__fence *f);
/* Messages dropped since we last became unsure. */
uint64_t cps__fence_dropped(const cps__fence *f);
/* How long the loop did not turn, as of `now` (for the log). */
uint64_t cps__fence_stalled_ms(const cps__fence *f, uint64_t now);

#endif
