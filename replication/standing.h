/* A server's standing with its scheduler, decided (src/server/server.c performs it): answering
 * the scheduler's probes, who may ask for a range's checksum, the drain conversation on SIGTERM,
 * when a scheduler gone for too long makes us leave, and whether a data directory belongs to
 * the job. Pure: no I/O, no clock, no store; the shell hands in what it read or was told.
 * (Separate from cps__replica, which holds the data path's protocol: none of these reads the
 * chain, and all of them are questions of the server's life in the job.) */
#ifndef CPS_REPLICATION_STANDING_H
#define CPS_REPLICATION_STANDING_H

#include <stdint.h>

#include "core/view.h"

/* 1 if a message of `type` from the scheduler (`from_sched`) is a PROBE to answer at once,
 * whatever our standing (recovery/suspect.h: a liveness question about the loop that serves
 * requests); 0 otherwise (it goes through the fence). */
int cps__standing_probe(uint8_t type, int from_sched);

/* 1 if the sender of a message whose payload we rejected is told (an ERROR): its header
 * decoded (type != 0), it is a request (not a reply: flags lack CPS_WF_REPLY), we are in the
 * job (`joined`) and it comes from one of the job's workers (`from_worker`). */
int cps__standing_tell_bad(uint8_t type, uint32_t flags, int joined, int from_worker);

/* 1 if a CHECKSUM request for `range` is served: we are in the job (`joined`) and the view has
 * that range. Else 0: dropped. */
int cps__standing_checksum(int joined, const cps__view *v, uint32_t range);

/* The drain conversation. States: NONE, ASKED (DRAIN sent, no answer yet), ACCEPTED. */
enum { CPS_DRAIN_NONE = 0, CPS_DRAIN_ASKED = 1, CPS_DRAIN_ACCEPTED = 2 };
/* What a stop signal leads to, this turn. */
enum {
    CPS_DRAIN_STOP = 0,  /* stop now */
    CPS_DRAIN_SERVE = 1, /* keep serving: the drain goes on */
    CPS_DRAIN_ASK = 2    /* send DRAIN to the scheduler, then keep serving (state ASKED) */
};
/* After a stop signal (`signals` of them so far). A second signal, not being in the job
 * (`joined` 0 or `fenced`), or holding no range (`held` 0) stops us; an accepted drain serves
 * until the scheduler ends us; an unanswered one serves for answer_ms after `asked_ms`. */
int cps__drain_decide(int state, int signals, int joined, int fenced, uint32_t held,
                      uint64_t asked_ms, uint64_t now, uint32_t answer_ms);
/* The answer_ms servers use: how long a DRAIN may go unanswered before a stop signal just stops
 * the server (the scheduler is gone, or ending the job itself). */
#define CPS_DRAIN_ANSWER_MS 3000u
/* Ranges whose chain names `self` under `v` (what a drain moves away). */
uint32_t cps__drain_held(const cps__view *v, uint32_t self);
/* The scheduler's answer of `type` (CPS_MSG_ACK, CPS_MSG_ERROR) in drain state `state`:
 * returns the new state, or -1 if we stop now (it refused). Only an answer to our DRAIN
 * (state ASKED) counts: otherwise the state is unchanged. */
int cps__drain_on_answer(int state, uint8_t type, int from_sched);

/* The scheduler-gone timer. *seen_ms is the last time it was heard of, refreshed while we are
 * connected to it (and reset if the clock went back). Returns 1 once it has been unreachable
 * for more than timeout_ms: leave the job. */
int cps__standing_sched_gone(int connected, uint64_t *seen_ms, uint64_t now, uint32_t timeout_ms);

/* The WELCOME's job id `job` against the one the data directory holds (`stored`, 0: none).
 * Returns 0 to go on (*store 1: write `job` to the directory), or CPS_EEXIST (another job's
 * directory: refused). job 0 (a scheduler from before job ids) goes on without storing. */
int cps__standing_job(uint64_t job, uint64_t stored, int *store);

#endif
