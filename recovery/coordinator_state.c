/* The coordinator's state as every part reads it: its members, and the read-only views the
 * shell shows (coordinator.h). Pure lookups: nothing here changes the state (beyond a lookup's
 * own scratch, rank_held) or calls another file of the coordinator. */
#include "recovery/coordinator_state.h"

/* ---- members ---- */

const char *cps__co_role(int role)
{
    return cps__config_role_str(role);
}

uint32_t cps__co_count_role(const cps__coord *c, int role)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < c->nnodes; i++)
        n += c->nodes[i].info.role == role;
    return n;
}

cps__coord_node *cps__co_find(cps__coord *c, uint32_t id)
{
    for (uint32_t i = 0; i < c->nnodes; i++)
        if (c->nodes[i].info.id == id)
            return &c->nodes[i];
    return NULL;
}

int cps__co_superseded(const cps__coord *c, const cps__coord_node *n)
{
    for (uint32_t i = 0; i < c->nnodes; i++)
        if (cps__node_supersedes(&c->nodes[i].info, &n->info))
            return 1;
    return 0;
}

/* ---- read-only views ---- */

const cps__view *cps__coord_view(const cps__coord *c)
{
    return &c->view;
}

const cps__coord_node *cps__coord_nodes(const cps__coord *c, uint32_t *n)
{
    *n = c->nnodes;
    return c->nodes;
}

const cps__ckpt_note *cps__coord_ckpt(const cps__coord *c)
{
    return &c->ckpt;
}

cps__coord_counts cps__coord_counters(const cps__coord *c)
{
    return c->counts;
}

uint32_t cps__coord_joiner(const cps__coord *c, uint32_t r, uint32_t *source)
{
    uint32_t src = 0, j = c->repair ? cps__repair_joiner(c->repair, r, &src) : 0;
    if (source)
        *source = j ? src : 0;
    return j;
}

uint32_t cps__coord_stranded(const cps__coord *c, uint32_t r, uint32_t *fallback,
                             uint64_t *since_epoch)
{
    uint32_t id = 0;
    if (r < c->view.nranges && c->view.ranges[r].chain_len == 1) {
        for (uint32_t i = 0; i < c->nnodes && !id; i++) {
            const cps__coord_node *n = &c->nodes[i];
            if (n->info.id == c->view.ranges[r].chain[0] && n->empty_kept && !n->info.alive)
                id = n->info.id;
        }
    }
    if (fallback)
        *fallback = id ? c->former[r] : 0;
    if (since_epoch)
        *since_epoch = id ? c->former_epoch[r] : 0;
    return id;
}

uint32_t cps__coord_unconfirmed(const cps__coord *c, uint32_t r)
{
    return c->repair ? cps__repair_unconfirmed(c->repair, r) : 0;
}

int cps__coord_started(const cps__coord *c)
{
    return c->started;
}

int cps__coord_finished(const cps__coord *c)
{
    return c->finished;
}

int cps__coord_gave_up(const cps__coord *c)
{
    return c->gave_up;
}

uint64_t cps__coord_epoch(const cps__coord *c)
{
    return c->view.epoch;
}

/* ---- the workers' ranks ---- */

/* The coordinator's nodes as the workers' end rules read them (recovery/workers_end.h). */
int cps__co_worker_at(const void *ctx, uint32_t i, cps__worker_mark *out)
{
    const cps__coord_node *n = &((const cps__coord *)ctx)->nodes[i];
    if (n->info.role != CPS_ROLE_WORKER)
        return 0;
    *out = (cps__worker_mark){
        .rank = n->info.rank, .alive = n->info.alive, .done = n->done, .in_barrier = n->in_barrier};
    return 1;
}

uint32_t cps__co_unfinished_dead_rank(const cps__coord *c)
{
    return cps__workers_unfinished_dead_rank(c->nnodes, cps__co_worker_at, c, c->cfg.num_workers,
                                             c->rank_held);
}

int cps__co_workers_settled(const cps__coord *c)
{
    return c->started && cps__co_unfinished_dead_rank(c) == UINT32_MAX;
}
