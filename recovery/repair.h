/* The scheduler's repair policy, as a pure state machine: what a view becomes when a node is
 * declared dead, which range is copied by whom from whom when it has fewer live replicas than
 * the view's R, and when a server that copied a range (state transfer) joins its chain as the
 * tail. It keeps the joins under way (one per range) and nothing else; the caller owns the view,
 * publishes it (a new epoch), sends the JOIN_RANGE orders and logs. It never reads the clock:
 * time arrives as `now`.
 *
 * A joiner reports CAUGHT_UP twice: once its snapshot is installed (it becomes the tail), and
 * again once it holds everything its predecessor acknowledged (cps__chain_can_serve_pull). In
 * between it is "unconfirmed": if that predecessor dies, the joiner may lack acknowledged updates
 * nobody can re-send, so it leaves the chain with it and the range is copied afresh. It is never
 * copied from, and it is on probation for join_give_up_ms: one that has not confirmed by then
 * leaves the chain too (it may never have caught up; its confirmation, sent once, may have been
 * lost: either way only its predecessor is known to hold everything acknowledged).
 *
 * Not thread-safe: one event loop owns a cps__repair. */
#ifndef CPS_RECOVERY_REPAIR_H
#define CPS_RECOVERY_REPAIR_H

#include <stddef.h>
#include <stdint.h>

#include "core/view.h"

typedef struct cps__repair cps__repair;

typedef struct cps__repair_config {
    uint32_t nranges;         /* ranges of the job's view (fixed for the job) */
    uint32_t join_give_up_ms; /* a join not caught up by then is abandoned and retried (> 0) */
    /* Join ids handed out start above this. They must keep growing across scheduler restarts:
     * a range's tail refuses a snapshot request whose join id is below one it served (a late
     * request of a replaced join), so a restarted scheduler passes a floor above its earlier
     * lives' ids. */
    uint64_t first_join_id;
    /* 1: also move ranges for balance and drains (cps__repair_tick); 0: repairs only. */
    int balance;
} cps__repair_config;

enum cps__repair_action_kind {
    /* Order `node` to copy `range` from `source` (the range's live tail): JOIN_RANGE with
     * step = join_id, which its CAUGHT_UP reports echo. `live` replicas are left. */
    CPS_RA_JOIN = 1,
    /* The join of `range` by `node` did not catch up before its deadline: abandoned. */
    CPS_RA_TIMED_OUT,
    /* `node` had joined `range` but not caught up with `source`, which died: it left the chain
     * too and the range will be copied again (cps__repair_declare_dead). Of cps__repair_tick:
     * `node` did not confirm within join_give_up_ms that it caught up with `source`: the caller
     * takes it out of the chain in the next view, and the range will be copied again. */
    CPS_RA_EVICTED,
    /* `range` has more live replicas than R, all confirmed (a move's joiner caught up): take
     * `node` out of its chain in the next view (it stays alive and drops the range). */
    CPS_RA_TRIM
};

/* Moves (rebalancing after a server joins, draining) under way at once: each is a state
 * transfer, so they are paced rather than all started together. */
#define CPS_REPAIR_MAX_MOVES 4

typedef struct cps__repair_action {
    int kind; /* CPS_RA_* */
    uint32_t range;
    uint32_t node;
    uint32_t source;
    uint32_t live;
    uint64_t join_id;
    /* CPS_RA_JOIN of a move: the member that leaves once `node` is a confirmed replica (a
     * CPS_RA_TRIM follows); 0 for a repair. */
    uint32_t leaving;
} cps__repair_action;

/* Verdicts of cps__repair_caught_up. */
enum {
    CPS_REPAIR_IGNORED = 0,   /* stale (an earlier join), or from a joiner given up on */
    CPS_REPAIR_APPEND = 1,    /* append `node` to the range's chain as its tail and publish */
    CPS_REPAIR_CONFIRMED = 2, /* the joined tail now holds everything: a full replica */
    CPS_REPAIR_RETRY = 3      /* the joiner could not copy the range: the next tick retries */
};

/* Errors: CPS_EINVAL (cfg or out NULL, join_give_up_ms 0), CPS_ENOMEM. *out is the
 * caller's, to free with cps__repair_destroy. */
int cps__repair_create(const cps__repair_config *cfg, cps__repair **out);
/* NULL: no-op. */
void cps__repair_destroy(cps__repair *rp);

/* Node `node` is declared dead: out = in without it (cps__view_without: kept order, the last
 * replica of a range stays, marked dead), and an unconfirmed joiner whose predecessor it was
 * leaves that chain too (CPS_RA_EVICTED); were it the only one left, the dead node stays in its
 * place instead (the range waits for it, rather than serve what may lack acknowledged updates).
 * out->epoch is in->epoch + 1. Joins that `node` copied or served are abandoned (no action: they
 * will not finish). *lost_ranges (may be NULL) receives how many ranges have no live replica. in is
 * borrowed; out must be initialised (cps__view_init), its content is replaced and stays the
 * caller's. Errors: CPS_EINVAL (in has another range count), CPS_ENOTFOUND (no such node),
 * CPS_ENOMEM; the join table is unchanged on error. */
int cps__repair_declare_dead(cps__repair *rp, const cps__view *in, uint32_t node, cps__view *out,
                             uint32_t *lost_ranges);

/* Mark server `node` as draining (on = 1) or not: it is picked to copy nothing, and every range
 * it is in is moved off it (below). Errors: CPS_EINVAL (node 0). */
int cps__repair_set_draining(cps__repair *rp, uint32_t node, int on);
/* 1 if `node` is being drained. */
int cps__repair_draining(const cps__repair *rp, uint32_t node);
/* Ranges `node` is in, is copying, or is the source of a copy of, in v (a drained server is done
 * when this is 0). */
uint32_t cps__repair_load(const cps__repair *rp, const cps__view *v, uint32_t node);

/* A repair round at `now` over view v (borrowed): joins past their deadline are abandoned
 * (CPS_RA_TIMED_OUT), an unconfirmed tail past its probation (join_give_up_ms after it joined)
 * is evicted (CPS_RA_EVICTED; the range waits for the next view), and every range with at least
 * one but fewer than v->replicas live replicas, no join under way and no unconfirmed tail gets
 * one (CPS_RA_JOIN): the live server not in its chain that holds or is copying the fewest ranges
 * (the lowest position in v->nodes on a tie; never a draining one) copies it from the range's
 * live tail. No spare server: no join.
 *
 * Then balance, for ranges with exactly R live replicas, nothing under way and nothing
 * unconfirmed, at most CPS_REPAIR_MAX_MOVES at once: a range with a draining member, or whose
 * most loaded member holds 2 more ranges than the least loaded active server outside its chain,
 * is moved: that server copies it (CPS_RA_JOIN with `leaving` set) and joins as its tail; once
 * confirmed, the range has R + 1 replicas and the next round takes the leaving member out
 * (CPS_RA_TRIM). Load counts ranges held or being copied. Returns the number of actions
 * (cps__repair_actions); errors: CPS_EINVAL (v has another range count), CPS_ENOMEM. */
int cps__repair_tick(cps__repair *rp, const cps__view *v, uint64_t now);

/* The caller could not send the JOIN_RANGE of action `join_id` for `range`: forget that join
 * (the next tick tries again). Unknown join: no-op. */
void cps__repair_join_unsent(cps__repair *rp, uint32_t range, uint64_t join_id);

/* CAUGHT_UP from server `node` for `range` at `now`, with the join id it echoes (step) and its
 * kind (the header's aux: 0 snapshot installed, 1 holds everything its predecessor acknowledged,
 * 2 gave up). v (borrowed) is the current view. Returns a CPS_REPAIR_* verdict; only for
 * CPS_REPAIR_APPEND must the caller append `node` as range's tail in the next view it
 * publishes (the predecessor it must catch up with is v's tail of the range). */
int cps__repair_caught_up(cps__repair *rp, const cps__view *v, uint32_t node, uint32_t range,
                          uint64_t join_id, uint64_t kind, uint64_t now);

/* The actions of the last cps__repair_tick or cps__repair_declare_dead, in order. Valid until the
 * next call into rp; owned by rp. Returns their number. */
size_t cps__repair_actions(const cps__repair *rp, const cps__repair_action **out);

/* The server copying `range` now (0: none), and (if source is not NULL) the tail it copies
 * from. Out of range: 0. */
uint32_t cps__repair_joiner(const cps__repair *rp, uint32_t range, uint32_t *source);

/* The joined tail of `range` not yet confirmed (0: none). Out of range: 0. */
uint32_t cps__repair_unconfirmed(const cps__repair *rp, uint32_t range);
/* The same, with (when not NULL) the predecessor it must catch up with and the join id its
 * confirmation echoes: what a scheduler persists so that a restarted one does not take the
 * tail for a full replica (cps__repair_restore_unconfirmed). */
uint32_t cps__repair_unconfirmed_of(const cps__repair *rp, uint32_t range, uint32_t *pred,
                                    uint64_t *join_id);
/* A restarted scheduler puts back the mark of an earlier life: `node`, the tail of `range`,
 * has not confirmed it holds everything `pred` acknowledged; its confirmation echoes `join_id`
 * (0: unknown, so none is accepted and it leaves the chain when its probation ends). The
 * probation starts again at `now` (join_give_up_ms): its confirmation may be on the way. It is
 * never copied from meanwhile, and `pred`'s death evicts it, as for a mark set here. Errors:
 * CPS_EINVAL (range out of bounds, node 0). */
int cps__repair_restore_unconfirmed(cps__repair *rp, uint32_t range, uint32_t node, uint32_t pred,
                                    uint64_t join_id, uint64_t now);

#endif
