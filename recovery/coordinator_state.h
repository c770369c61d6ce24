/* The coordinator's state (struct cps__coord) and the lookups of its members that every part
 * uses; coordinator_state.c also defines the read-only views of coordinator.h. The lowest file of
 * recovery/coordinator*.c: the output (coordinator_out.c), the policies (coordinator_membership.c,
 * coordinator_tools.c) and the dispatch (coordinator_dispatch.c) stand on it, and it calls none
 * of them. Private to recovery/coordinator*.c. */
#ifndef CPS_RECOVERY_COORDINATOR_STATE_H
#define CPS_RECOVERY_COORDINATOR_STATE_H

#include "recovery/coordinator.h"
#include "recovery/detector.h"
#include "recovery/registry.h"
#include "recovery/repair.h"
#include "recovery/suspect.h"
#include "recovery/workers_end.h"

#define CPS_COORD_SELF 0u /* the scheduler's node id */

struct cps__coord {
    cps__config cfg;
    uint32_t repair_every_ms, batch_ms, join_give_up_ms, save_retry_ms, id_limit;
    cps__coord_node *nodes;
    uint32_t nnodes;
    uint32_t next_id;
    cps__view view;
    int started, finished;
    int ending_held; /* every worker is done, but cfg.hold keeps the servers up */
    uint32_t workers_done;
    cps__detector *detector;
    cps__suspect *suspect; /* data-path evidence: reports of unanswered requests, probes */
    cps__repair *repair;   /* joins under way; made when the job runs */
    uint64_t last_detect_ms;
    uint64_t next_repair_at; /* periodic repair; 0: at the next tick */
    uint64_t batch_at;       /* joiners or moves wait for the view of this moment; 0: none */
    uint64_t join_deadline;  /* not every node arrived by then: give up */
    int gave_up;             /* the result once given up (CPS_ETIMEDOUT) */
    /* The view in memory is newer than the saved one: no node is sent it until it is saved
     * (persist before publish), so a restarted scheduler never resumes an epoch older than one
     * some node has seen. */
    int unsaved;
    uint8_t held_type; /* what the held view goes out as once saved: WELCOME or VIEW */
    uint32_t failed_saves;
    uint64_t save_retry_at;
    cps__coord_counts counts;
    cps__ckpt_note ckpt; /* the last checkpoint a tool reported complete; id 0: none */
    /* Joiners appended as tails in the next view (CPS_REPAIR_APPEND verdicts since the last
     * one): the view in memory stays the one published until then. */
    struct {
        uint32_t range, node;
    } appends[64];
    uint32_t nappends;
    /* Per range (CPS_MAX_RANGES): the member a death took out of it when that left one member,
     * and which has not been let in since (a server let in drops the ranges whose chain does
     * not name it). It holds what was acknowledged until then: the range's fallback, should the
     * one left come back with an empty store: only by the operator's choice (cfg.allow_rollback),
     * as the updates the one left acknowledged alone since are not on it. 0: none. former_epoch:
     * the view epoch it left in. Persisted (sched/former): a restarted scheduler still knows. */
    uint32_t *former;
    uint64_t *former_epoch;
    /* Per range: --allow-rollback holds for it in this life. The operator's consent is for the
     * incident in front of them: only ranges whose only replica was down with a fallback when
     * this life resumed (cps__coord_resume); each is cleared once rolled back or once that
     * replica is let in, and nothing later sets it. Not persisted. */
    unsigned char *rollback_ok;
    /* cps__co_unfinished_dead_rank's scratch: one byte a worker rank (cfg.num_workers). */
    unsigned char *rank_held;
    cps__registry reg; /* the tensors workers declared (REGISTER), for checkpoints (REGISTRY) */
    uint64_t wall_ms;  /* this turn's wall clock (cps__coord_set_wall), for STATUS's ages */
    cps__coord_out out;
    unsigned char *blob_buf; /* cps__coord_blobs' bytes */
    size_t blob_cap;
};

cps__coord_node *cps__co_find(cps__coord *c, uint32_t id);
/* A dead (or finished) worker whose rank another worker took (cps__node_supersedes): it is
 * kept as a member, but nobody sends it anything. */
int cps__co_superseded(const cps__coord *c, const cps__coord_node *n);
uint32_t cps__co_count_role(const cps__coord *c, int role);
const char *cps__co_role(int role);
/* Node i of the coordinator (ctx) as the workers' end rules read it (a cps__worker_at). */
int cps__co_worker_at(const void *ctx, uint32_t i, cps__worker_mark *out);
/* A worker rank that no live worker holds and none finished (its worker died and no other took
 * its place yet), or UINT32_MAX. */
uint32_t cps__co_unfinished_dead_rank(const cps__coord *c);
/* 1 once the job started and no rank is left unfinished by a dead worker: then the views sent
 * to workers (not those to servers) say CPS_VIEW_WORKERS_SETTLED. Computed once per round of
 * views (it costs ranks + nodes), and passed to each cps__co_send_view. */
int cps__co_workers_settled(const cps__coord *c);

#endif
