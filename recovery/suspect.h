/* Failure detection through the data path, as a pure state machine (the scheduler's side).
 *
 * Heartbeats say a process runs; they do not say it can be reached. A server whose inbound
 * traffic is dropped (a one-way partition: its heartbeats still arrive) answers nobody, and the
 * job freezes while the heartbeat detector sees nothing wrong. Workers and chain neighbours see
 * it: their requests to it go unanswered. They report it (CPS_MSG_SUSPECT: node, how long
 * unanswered), and this machine decides.
 *
 * The rule: a report is never a verdict on its own. A report that counts makes the scheduler
 * look for itself: it probes every watched server (CPS_MSG_PROBE, sent to each server's inbox,
 * the same way the reporters' requests go, and answered by the server's event loop). A server
 * that leaves the probe unanswered for probe_ms is asked again, and is declared dead when it
 * leaves both of them unanswered for probe_ms / 2 more: one message held back (the simulator's
 * long delays, seeds 8540 and 9471 of --faults scale) is not a death. Every probe has its own
 * nonce, which the answer echoes: an answer counts for the round of the probe it answers, either
 * of its two probes (a late answer to the first still proves the server got our message in this
 * round), and never for a later round or across the scheduler's restarts. Why not "unanswered for
 * long enough" or "two reporters": a reporter cannot tell an unreachable server from one that holds
 * its request on purpose (a sync step waits for the slowest worker; an SSP pull waits for the
 * clocks), from one slow to answer, or from a break in its own link; two workers waiting on the
 * same step see the same silence. The probe asks the one question that matters -- does traffic
 * to that server get served -- and it asks it of every server, so a report that names the head
 * while the break is further down the chain (the head waits for its successor's ack) still finds
 * the right server.
 *
 * A report counts when: it carries the current view epoch (an older one is fenced: it may be
 * about a chain that no longer exists); its reporter is a live member of the view (a node
 * declared dead is cut off, and its view of others proves nothing); the suspect is a watched
 * server other than the reporter; and its requests went unanswered for at least evidence_ms. A
 * probe round starts at most once per probe_ms; a server answering either of the round's probes
 * clears it for that round.
 *
 * Lost heartbeats play no part here, and a lost probe is re-sent by TCP: on a lossy link a probe
 * is late by a retransmission timeout or two (hundreds of ms), not by probe_ms.
 *
 * Pure: no I/O, no clock; `now` is milliseconds of any monotonic clock. Not thread-safe. */
#ifndef CPS_RECOVERY_SUSPECT_H
#define CPS_RECOVERY_SUSPECT_H

#include <stddef.h>
#include <stdint.h>

#include "core/wire.h" /* cps__suspect_entry */

typedef struct cps__suspect cps__suspect;

/* The timings, from the heartbeat timeout (CHAINPS_DEAD_AFTER_MS, 2000 by default): a reporter
 * reports a server it has had requests out to and heard nothing from for 0.6 of it (1200 ms),
 * every CPS_SUSPECT_REPORT_MS while that lasts; a probed server is dead after 0.4 of it (800 ms:
 * a lost probe's TCP retransmissions, 200 then 400 ms, fit in it), and asked again, after 0.2
 * more (400 ms). A one-way partition is failed over within the heartbeat timeout plus 0.2 of it
 * and a tick or two (~2.5 s by default), and a node that only ever loses heartbeats is never
 * probed. */
#define CPS_SUSPECT_REPORT_MS 200u
static inline uint32_t cps__suspect_evidence_ms(uint32_t dead_after_ms)
{
    return dead_after_ms / 10 * 6 > 0 ? dead_after_ms / 10 * 6 : 1;
}
static inline uint32_t cps__suspect_probe_ms(uint32_t dead_after_ms)
{
    return dead_after_ms / 10 * 4 > 0 ? dead_after_ms / 10 * 4 : 1;
}

/* The reporters' side (workers: recovery/requests.c's cps__reqs_oldest_to; servers: the
 * chain's cps__chain_waiting_since): add `node` to the list e[0..*n) (kept sorted by node, as
 * the wire wants; at most CPS_SUSPECT_MAX) if a request of ours has waited there since
 * `waiting_since` (0: none waits) and we have heard nothing from it since, last `heard`, for at
 * least evidence_ms by `now`. A server that answers anything is slow, not cut off. Returns 1 if
 * added. */
int cps__suspect_list_add(cps__suspect_entry *e, uint32_t *n, uint32_t node, uint64_t waiting_since,
                          uint64_t heard, uint64_t now, uint32_t evidence_ms);

typedef struct cps__suspect_config {
    uint32_t evidence_ms; /* a report counts when unanswered this long (> 0) */
    uint32_t probe_ms;    /* a probed server silent this long is asked again (> 0) */
    /* Tests only (the simulator's --single-probe): a server that leaves the round's probe
     * unanswered for probe_ms is dead, without being asked again. False deaths of slow servers
     * become common, which the protocol must survive (correctness never rests on the detector);
     * the second probe only makes them rare. 0 in production. */
    int single_probe;
} cps__suspect_config;

/* Verdicts of cps__suspect_report. */
enum cps__suspect_verdict {
    CPS_SUS_STALE_EPOCH = 1, /* not the current epoch: fenced */
    CPS_SUS_REPORTER,        /* the reporter is not a live member */
    CPS_SUS_UNKNOWN,         /* the suspect is not watched, or is the reporter */
    CPS_SUS_WEAK,            /* unanswered for less than evidence_ms */
    CPS_SUS_PROBING          /* counts: a probe round is started or under way */
};

typedef struct cps__suspect_report_in {
    uint32_t reporter;
    int reporter_live; /* a live member of the current view */
    uint64_t epoch;    /* the view epoch the report was made under */
    uint32_t suspect;
    uint32_t unanswered_ms;
} cps__suspect_report_in;

enum cps__suspect_action_kind {
    CPS_SUS_PROBE = 1, /* send CPS_MSG_PROBE with req_seq `nonce` to `node` */
    CPS_SUS_DEAD       /* declare `node` dead: it left its probes unanswered `silent_ms` */
};

typedef struct cps__suspect_action {
    int kind;
    uint32_t node;
    uint64_t nonce;
    uint64_t silent_ms;   /* CPS_SUS_DEAD: since the round's first probe went out */
    uint32_t reported_by; /* the reporter that started the round */
} cps__suspect_action;

/* Errors: CPS_EINVAL (a zero in cfg, NULL), CPS_ENOMEM. */
int cps__suspect_create(const cps__suspect_config *cfg, cps__suspect **out);
void cps__suspect_destroy(cps__suspect *s);

/* Servers that may be probed and declared dead. Watch: CPS_ENOMEM. Forget: unknown is a no-op
 * (a server declared dead or gone leaves the round it was in). */
int cps__suspect_watch(cps__suspect *s, uint32_t node);
void cps__suspect_forget(cps__suspect *s, uint32_t node);

/* The scheduler published view `epoch`: reports made under older ones no longer count. */
void cps__suspect_epoch(cps__suspect *s, uint64_t epoch);

/* A report arrived at `now`. Returns a CPS_SUS_* verdict; CPS_SUS_PROBING may have started a
 * round (see cps__suspect_actions). */
int cps__suspect_report(cps__suspect *s, const cps__suspect_report_in *in, uint64_t now);

/* `node` answered probe `nonce`. Either probe of the current round counts (the round's first
 * one, answered late, or the one it was asked again); an answer to a probe of an earlier round
 * or of an earlier life of the scheduler, and an unknown node, are no-ops. */
void cps__suspect_answered(cps__suspect *s, uint32_t node, uint64_t nonce);

/* Time passes: a server that left the round's probe unanswered for probe_ms is probed again
 * (CPS_SUS_PROBE, a new nonce); one that left both unanswered for probe_ms / 2 more becomes a
 * CPS_SUS_DEAD action (once; it is no longer watched). */
void cps__suspect_tick(cps__suspect *s, uint64_t now);

/* We (the scheduler) did not run for a while: a round under way counts its probe time from
 * `now`, so answers that queued up while we were away are read before anyone is judged. */
void cps__suspect_refresh(cps__suspect *s, uint64_t now);

/* The actions of the last cps__suspect_report or cps__suspect_tick, owned by s, valid until
 * the next call. Returns their number. */
size_t cps__suspect_actions(const cps__suspect *s, const cps__suspect_action **out);

/* Whether a probe round is under way (for logs and tests). */
int cps__suspect_probing(const cps__suspect *s);

#endif
