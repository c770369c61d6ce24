#include "repair.h"

#include <stdlib.h>

#include "chainps/error.h"
#include "view_change.h"

/* A server copying a range to join its chain. */
typedef struct pending_join {
    uint32_t joiner; /* 0: none */
    uint32_t source;
    uint64_t deadline_ms;
    uint64_t id; /* CAUGHT_UP must echo it: a late one of an earlier join is ignored */
    /* Appended as tail, not yet holding all its predecessor acknowledged (see repair.h). */
    uint32_t unconfirmed;
    uint32_t unconfirmed_pred;
    uint64_t unconfirmed_until; /* its probation: it confirms by then, or leaves the chain */
    /* A move (rebalance or drain): the member that leaves the chain once the joiner is a
     * confirmed replica; 0 for a repair. */
    uint32_t leaving;
    int move_confirmed; /* the move's joiner confirmed: `leaving` may go */
    /* The last tail evicted from the range: the next copy goes elsewhere while another server
     * can take it, or a server that cannot confirm would copy, join and be evicted forever. */
    uint32_t evicted;
} pending_join;

struct cps__repair {
    cps__repair_config cfg;
    pending_join *joins; /* cfg.nranges */
    uint64_t next_join_id;
    /* At most two per range per call (a timeout, then a new join or an eviction). */
    cps__repair_action *actions;
    size_t nactions;
    uint32_t draining[CPS_MAX_NODES]; /* servers being drained (0: free slot) */
    uint32_t *load;                   /* tick scratch: per v->nodes position */
    uint32_t load_cap;
};

int cps__repair_create(const cps__repair_config *cfg, cps__repair **out)
{
    if (!cfg || !out || cfg->join_give_up_ms == 0)
        return CPS_EINVAL;
    cps__repair *rp = calloc(1, sizeof *rp);
    if (!rp)
        return CPS_ENOMEM;
    rp->cfg = *cfg;
    rp->next_join_id = cfg->first_join_id;
    size_t n = cfg->nranges ? cfg->nranges : 1;
    rp->joins = calloc(n, sizeof *rp->joins);
    rp->actions = calloc(2 * n, sizeof *rp->actions);
    if (!rp->joins || !rp->actions) {
        cps__repair_destroy(rp);
        return CPS_ENOMEM;
    }
    *out = rp;
    return 0;
}

void cps__repair_destroy(cps__repair *rp)
{
    if (rp) {
        free(rp->load);
        free(rp->joins);
        free(rp->actions);
        free(rp);
    }
}

static int in_chain(const cps__range *rg, uint32_t id)
{
    for (uint32_t j = 0; j < rg->chain_len; j++)
        if (rg->chain[j] == id)
            return 1;
    return 0;
}

static int node_alive(const cps__view *v, uint32_t id)
{
    const cps__node_info *n = cps__view_node(v, id);
    return n && n->alive;
}

static void act(cps__repair *rp, int kind, uint32_t range, uint32_t node, uint32_t source,
                uint32_t live, uint64_t join_id)
{
    rp->actions[rp->nactions++] = (cps__repair_action){kind, range, node, source, live, join_id, 0};
}

int cps__repair_draining(const cps__repair *rp, uint32_t node)
{
    for (uint32_t i = 0; node && i < CPS_MAX_NODES; i++)
        if (rp->draining[i] == node)
            return 1;
    return 0;
}

int cps__repair_set_draining(cps__repair *rp, uint32_t node, int on)
{
    if (!rp || !node)
        return CPS_EINVAL;
    for (uint32_t i = 0; i < CPS_MAX_NODES; i++)
        if (rp->draining[i] == node) {
            if (!on)
                rp->draining[i] = 0;
            return 0;
        }
    if (!on)
        return 0;
    for (uint32_t i = 0; i < CPS_MAX_NODES; i++)
        if (!rp->draining[i]) {
            rp->draining[i] = node;
            return 0;
        }
    return CPS_EINVAL; /* more than CPS_MAX_NODES: cannot be */
}

uint32_t cps__repair_load(const cps__repair *rp, const cps__view *v, uint32_t node)
{
    uint32_t load = 0;
    for (uint32_t q = 0; q < v->nranges && q < rp->cfg.nranges; q++)
        load += in_chain(&v->ranges[q], node) || rp->joins[q].joiner == node ||
                (rp->joins[q].joiner && rp->joins[q].source == node);
    return load;
}

int cps__repair_declare_dead(cps__repair *rp, const cps__view *in, uint32_t node, cps__view *out,
                             uint32_t *lost_ranges)
{
    rp->nactions = 0;
    if (in->nranges != rp->cfg.nranges)
        return CPS_EINVAL;
    int rc = cps__view_without(in, node, out, NULL);
    if (rc != 0)
        return rc;
    for (uint32_t r = 0; r < out->nranges; r++) {
        pending_join *pj = &rp->joins[r];
        if (!pj->unconfirmed)
            continue;
        if (pj->unconfirmed == node) {
            pj->unconfirmed = 0;
        } else if (pj->unconfirmed_pred == node) {
            /* The replicas before it hold every acknowledged update; it may not. */
            cps__range *rg = &out->ranges[r];
            uint32_t k = 0;
            for (uint32_t j = 0; j < rg->chain_len; j++)
                if (rg->chain[j] != pj->unconfirmed)
                    rg->chain[k++] = rg->chain[j];
            if (k == 0)
                rg->chain[k++] = node; /* the dead one has it all: the range waits for it */
            rg->chain_len = k;
            act(rp, CPS_RA_EVICTED, r, pj->unconfirmed, node, 0, pj->id);
            pj->evicted = pj->unconfirmed;
            /* A copy being made from it lacks what it lacks: abandoned too, or the copy joins a
             * chain it cannot catch up with (simulator seed 8334: its predecessor came back as
             * head without the updates between). No copy starts from an unconfirmed tail any
             * more (it leaves the chain when its probation ends), so this only guards. */
            if (pj->joiner && pj->source == pj->unconfirmed)
                pj->joiner = 0;
            pj->unconfirmed = 0;
        }
    }
    for (uint32_t r = 0; r < rp->cfg.nranges; r++)
        if (rp->joins[r].joiner == node || rp->joins[r].source == node)
            rp->joins[r].joiner = 0; /* that copy will not finish */
    if (lost_ranges) {
        *lost_ranges = 0;
        for (uint32_t r = 0; r < out->nranges; r++)
            *lost_ranges += !cps__view_range_available(out, r);
    }
    return 0;
}

/* The live server outside rg's chain holding or copying the fewest ranges, 0 if none. A
 * draining server only when no other can: R replicas come before a drain, which then waits
 * for a server to be added (or to come back). `avoid` (the range's last evicted tail) only when
 * no other can either. */
static uint32_t least_loaded(const cps__repair *rp, const cps__view *v, const cps__range *rg,
                             uint32_t avoid)
{
    uint32_t best = 0;
    uint64_t best_key = UINT64_MAX;
    for (uint32_t i = 0; i < v->nnodes; i++) {
        const cps__node_info *n = &v->nodes[i];
        if (n->role != CPS_ROLE_SERVER || !n->alive || in_chain(rg, n->id))
            continue;
        uint64_t load = 0;
        for (uint32_t q = 0; q < v->nranges; q++)
            load += in_chain(&v->ranges[q], n->id) || rp->joins[q].joiner == n->id;
        uint64_t key = (uint64_t)cps__repair_draining(rp, n->id) << 41 |
                       (uint64_t)(n->id == avoid) << 40 | load;
        if (key < best_key) {
            best = n->id;
            best_key = key;
        }
    }
    return best;
}

/* Per-node load for a tick: slots held or being copied, less the moves planned away. */
static int loads_compute(cps__repair *rp, const cps__view *v)
{
    if (rp->load_cap < v->nnodes) {
        uint32_t *l = realloc(rp->load, sizeof *l * v->nnodes);
        if (!l)
            return CPS_ENOMEM;
        rp->load = l;
        rp->load_cap = v->nnodes;
    }
    for (uint32_t i = 0; i < v->nnodes; i++) {
        rp->load[i] = 0;
        for (uint32_t q = 0; q < v->nranges; q++) {
            const pending_join *pj = &rp->joins[q];
            int holds = in_chain(&v->ranges[q], v->nodes[i].id);
            rp->load[i] += (holds && pj->leaving != v->nodes[i].id) || pj->joiner == v->nodes[i].id;
        }
    }
    return 0;
}

static uint32_t node_pos(const cps__view *v, uint32_t id)
{
    for (uint32_t i = 0; i < v->nnodes; i++)
        if (v->nodes[i].id == id)
            return i;
    return UINT32_MAX;
}

/* A range with more live replicas than R (a move's joiner confirmed): which member leaves. The
 * move's planned one; without that knowledge (a restarted scheduler, a confirmation lost) the
 * tail, the only member that may lack acknowledged updates, and the balance plans again. */
static uint32_t trim_victim(const pending_join *pj, const cps__view *v, const cps__range *rg)
{
    if (pj->leaving && pj->move_confirmed && in_chain(rg, pj->leaving) &&
        node_alive(v, pj->leaving))
        return pj->leaving;
    return rg->chain[rg->chain_len - 1];
}

/* A move for a fully replicated range: the member to leave (a draining one first, else the
 * most loaded, the later in the chain on a tie, so heads move least) and the active server
 * outside the chain with the least load to take its place; 0 when nothing is worth moving. */
static void plan_move(const cps__repair *rp, const cps__view *v, const cps__range *rg,
                      uint32_t *from, uint32_t *to)
{
    *from = *to = 0;
    uint32_t src = 0, src_load = 0;
    int src_draining = 0;
    for (uint32_t j = 0; j < rg->chain_len; j++) {
        uint32_t id = rg->chain[j], pos = node_pos(v, id);
        if (pos == UINT32_MAX)
            return;
        int dr = cps__repair_draining(rp, id);
        if (!src || dr > src_draining || (dr == src_draining && rp->load[pos] >= src_load)) {
            src = id;
            src_load = rp->load[pos];
            src_draining = dr;
        }
    }
    uint32_t dst = 0, dst_load = UINT32_MAX;
    for (uint32_t i = 0; i < v->nnodes; i++) {
        const cps__node_info *n = &v->nodes[i];
        if (n->role != CPS_ROLE_SERVER || !n->alive || in_chain(rg, n->id) ||
            cps__repair_draining(rp, n->id) || rp->load[i] >= dst_load)
            continue;
        dst = n->id;
        dst_load = rp->load[i];
    }
    if (!src || !dst || (!src_draining && src_load < dst_load + 2))
        return;
    *from = src;
    *to = dst;
}

int cps__repair_tick(cps__repair *rp, const cps__view *v, uint64_t now)
{
    rp->nactions = 0;
    if (v->nranges != rp->cfg.nranges)
        return CPS_EINVAL;
    int rc = loads_compute(rp, v);
    if (rc != 0)
        return rc;
    uint32_t moving = 0;
    for (uint32_t r = 0; r < v->nranges; r++)
        moving += rp->joins[r].leaving && (rp->joins[r].joiner || rp->joins[r].unconfirmed);
    for (uint32_t r = 0; r < v->nranges; r++) {
        pending_join *pj = &rp->joins[r];
        if (pj->joiner && now > pj->deadline_ms) {
            act(rp, CPS_RA_TIMED_OUT, r, pj->joiner, pj->source, 0, pj->id);
            pj->joiner = 0;
        }
        const cps__range *rg = &v->ranges[r];
        uint32_t live = 0, tail = 0;
        for (uint32_t j = 0; j < rg->chain_len; j++)
            if (node_alive(v, rg->chain[j])) {
                live++;
                tail = rg->chain[j];
            }
        /* A tail still unconfirmed may lack acknowledged updates: a copy of it would too, and
         * the copy's own unconfirmed mark would replace its (one per range). */
        int held = pj->unconfirmed && now <= pj->unconfirmed_until;
        if (pj->joiner || held || live == 0)
            continue;
        if (pj->unconfirmed && !in_chain(rg, pj->unconfirmed))
            pj->unconfirmed = 0; /* gone from the chain some other way (an empty store) */
        if (live > v->replicas && live == rg->chain_len) {
            /* A move's joiner is a confirmed replica: the member it replaces leaves. */
            uint32_t victim = trim_victim(pj, v, rg);
            pj->leaving = 0;
            pj->move_confirmed = 0;
            pj->unconfirmed = 0;
            act(rp, CPS_RA_TRIM, r, victim, 0, live, 0);
            continue;
        }
        if (pj->unconfirmed) {
            /* Its probation is over and it never said it holds what its predecessor
             * acknowledged: it may still lack some (the predecessor's re-sends never reached it,
             * or its confirmation was lost; it cannot tell us which). Taken for a full replica,
             * it would be copied from, its copy's mark would replace its own, and its
             * predecessor's death would leave the two of them holding the range without an
             * acknowledged update (simulator seed 8085 with one probe: a balance move copied
             * such a tail). It leaves the chain like a join that did not catch up in time, and
             * the range is copied afresh from the members before it: a lost confirmation costs a
             * copy, never an update. */
            act(rp, CPS_RA_EVICTED, r, pj->unconfirmed, pj->unconfirmed_pred, live - 1, pj->id);
            pj->evicted = pj->unconfirmed;
            pj->unconfirmed = 0;
            continue;
        }
        pj->leaving = 0;
        pj->move_confirmed = 0;
        uint32_t best = 0, from = 0;
        if (live < v->replicas) {
            best = least_loaded(rp, v, rg, pj->evicted);
        } else if (rp->cfg.balance && live == v->replicas && live == rg->chain_len &&
                   moving < CPS_REPAIR_MAX_MOVES) {
            plan_move(rp, v, rg, &from, &best);
            if (best) {
                moving++;
                rp->load[node_pos(v, from)]--;
                rp->load[node_pos(v, best)]++;
            }
        }
        if (!best)
            continue;
        uint64_t id = ++rp->next_join_id;
        pj->joiner = best;
        pj->source = tail;
        pj->leaving = from;
        pj->deadline_ms = now + rp->cfg.join_give_up_ms;
        pj->id = id;
        act(rp, CPS_RA_JOIN, r, best, tail, live, id);
        rp->actions[rp->nactions - 1].leaving = from;
    }
    return (int)rp->nactions;
}

void cps__repair_join_unsent(cps__repair *rp, uint32_t range, uint64_t join_id)
{
    if (range < rp->cfg.nranges && rp->joins[range].joiner && rp->joins[range].id == join_id)
        rp->joins[range].joiner = 0;
}

int cps__repair_caught_up(cps__repair *rp, const cps__view *v, uint32_t node, uint32_t range,
                          uint64_t join_id, uint64_t kind, uint64_t now)
{
    if (range >= rp->cfg.nranges || range >= v->nranges)
        return CPS_REPAIR_IGNORED;
    pending_join *pj = &rp->joins[range];
    if (kind == 1) {
        if (pj->unconfirmed != node || join_id != pj->id)
            return CPS_REPAIR_IGNORED;
        pj->unconfirmed = 0;
        pj->move_confirmed = pj->leaving != 0;
        return CPS_REPAIR_CONFIRMED;
    }
    if (kind == 2) {
        if (pj->joiner != node || join_id != pj->id)
            return CPS_REPAIR_IGNORED;
        pj->joiner = 0;
        return CPS_REPAIR_RETRY;
    }
    if (pj->joiner != node || join_id != pj->id || !node_alive(v, node))
        return CPS_REPAIR_IGNORED; /* from an earlier join, or a joiner given up on */
    pj->joiner = 0;
    const cps__range *rg = &v->ranges[range];
    if (in_chain(rg, node) || rg->chain_len >= CPS_MAX_REPLICAS || rg->chain_len == 0)
        return CPS_REPAIR_IGNORED;
    pj->unconfirmed = node;
    pj->unconfirmed_pred = rg->chain[rg->chain_len - 1];
    pj->unconfirmed_until = now + rp->cfg.join_give_up_ms;
    return CPS_REPAIR_APPEND;
}

size_t cps__repair_actions(const cps__repair *rp, const cps__repair_action **out)
{
    *out = rp->actions;
    return rp->nactions;
}

uint32_t cps__repair_joiner(const cps__repair *rp, uint32_t range, uint32_t *source)
{
    if (range >= rp->cfg.nranges)
        return 0;
    if (source)
        *source = rp->joins[range].source;
    return rp->joins[range].joiner;
}

uint32_t cps__repair_unconfirmed(const cps__repair *rp, uint32_t range)
{
    if (range >= rp->cfg.nranges)
        return 0;
    return rp->joins[range].unconfirmed;
}
