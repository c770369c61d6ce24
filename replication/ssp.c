/* SSP clock gates: see ssp.h. */
#include "ssp.h"

#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "core/array.h"

typedef struct parked {
    uint32_t range, worker;
    uint64_t clock;
    void *cookie;
} parked;

struct cps__ssp {
    /* clock[range * CPS_MAX_NODES + worker id] = highest step pushed; by node id, since a
     * replacement worker gets a new id and its own clock. */
    uint64_t *clock;
    uint32_t clock_ranges;
    parked *parked;
    size_t nparked, parked_cap;
    /* Room for every parked cookie, reserved when parking, so waking cannot fail. */
    void **released;
    size_t nreleased, released_cap;
    void (*drop)(void *ctx, void *cookie);
    void *ctx;
};

int cps__ssp_create(void (*drop)(void *ctx, void *cookie), void *ctx, cps__ssp **out)
{
    cps__ssp *g = calloc(1, sizeof *g);
    if (!g)
        return CPS_ENOMEM;
    g->drop = drop;
    g->ctx = ctx;
    *out = g;
    return 0;
}

void cps__ssp_destroy(cps__ssp *g)
{
    if (!g)
        return;
    for (size_t i = 0; g->drop && i < g->nparked; i++)
        g->drop(g->ctx, g->parked[i].cookie);
    free(g->clock);
    free(g->parked);
    free(g->released);
    free(g);
}

static uint64_t *clock_slot(cps__ssp *g, const cps__view *v, uint32_t range, uint32_t worker)
{
    if (!g->clock || g->clock_ranges != v->nranges) {
        free(g->clock);
        g->clock_ranges = v->nranges;
        g->clock = calloc((size_t)v->nranges * CPS_MAX_NODES, sizeof *g->clock);
        if (!g->clock)
            return NULL;
    }
    if (range >= v->nranges || worker >= CPS_MAX_NODES)
        return NULL;
    return &g->clock[(size_t)range * CPS_MAX_NODES + worker];
}

/* A worker holding the rank of a worker that died: it joins a running job. */
static int takes_dead_workers_place(const cps__view *v, uint32_t worker)
{
    const cps__node_info *me = cps__view_node(v, worker);
    if (!me)
        return 0;
    for (uint32_t i = 0; i < v->nnodes; i++) {
        const cps__node_info *n = &v->nodes[i];
        if (n->role == CPS_ROLE_WORKER && !n->alive && n->id != worker && n->rank == me->rank)
            return 1;
    }
    return 0;
}

/* The lowest clock in `range` of the live workers other than `except` (UINT64_MAX: none). A
 * replacement whose DECLARE has not been applied here yet has no clock: it does not count (two
 * replacements admitted together would otherwise each start at the other's 0). */
static uint64_t slowest_clock(cps__ssp *g, const cps__view *v, uint32_t range, uint32_t except)
{
    uint64_t m = UINT64_MAX;
    for (uint32_t i = 0; i < v->nnodes; i++) {
        const cps__node_info *n = &v->nodes[i];
        if (n->role != CPS_ROLE_WORKER || !n->alive || n->id == except)
            continue;
        uint64_t *c = clock_slot(g, v, range, n->id);
        uint64_t c0 = c ? *c : 0;
        if (c0 == 0 && takes_dead_workers_place(v, n->id))
            continue;
        if (c0 < m)
            m = c0;
    }
    return m;
}

/* The highest clock in `range` of any worker other than `except`, live, finished or dead: how
 * far the job got there (0: nowhere). */
static uint64_t furthest_clock(cps__ssp *g, const cps__view *v, uint32_t range, uint32_t except)
{
    uint64_t m = 0;
    for (uint32_t i = 0; i < v->nnodes; i++) {
        const cps__node_info *n = &v->nodes[i];
        uint64_t *c =
            n->role == CPS_ROLE_WORKER && n->id != except ? clock_slot(g, v, range, n->id) : NULL;
        if (c && *c > m)
            m = *c;
    }
    return m;
}

int cps__ssp_pushed(cps__ssp *g, const cps__view *v, uint32_t range, uint32_t worker, uint64_t step)
{
    uint64_t *c = clock_slot(g, v, range, worker);
    if (!c)
        return g->clock ? CPS_EINVAL : CPS_ENOMEM;
    if (step > *c)
        *c = step;
    return 0;
}

/* Every replica applies the DECLARE, so every replica sets the same clock. With no other worker
 * running (they finished while this one was being restarted) the replacement starts where the
 * job got to, as a sync joiner does, not at 0, which would run the whole job again on its shard
 * alone. */
void cps__ssp_declared(cps__ssp *g, const cps__view *v, uint32_t range, uint32_t worker)
{
    if (v->mode != CPS_MODE_SSP || !takes_dead_workers_place(v, worker))
        return;
    uint64_t *c = clock_slot(g, v, range, worker);
    uint64_t m = slowest_clock(g, v, range, worker);
    if (m == UINT64_MAX)
        m = furthest_clock(g, v, range, worker);
    if (c && *c == 0)
        *c = m;
}

int cps__ssp_applied(cps__ssp *g, const cps__view *v, uint32_t range, const cps__chain_update *u)
{
    int rc = 0;
    for (uint32_t i = 0; i < u->nreqs; i++) {
        const cps__chain_req *q = &u->reqs[i];
        if (q->type == CPS_MSG_DECLARE) {
            cps__ssp_declared(g, v, range, q->worker);
        } else if (q->type != CPS_MSG_PUT && !q->noagg) {
            int r = cps__ssp_pushed(g, v, range, q->worker, u->step);
            rc = rc ? rc : r;
        }
    }
    return rc;
}

uint64_t cps__ssp_declare_step(cps__ssp *g, const cps__view *v, uint32_t range, uint32_t worker)
{
    uint64_t *c = takes_dead_workers_place(v, worker) ? clock_slot(g, v, range, worker) : NULL;
    return c ? *c : 0;
}

void cps__ssp_forget_range(cps__ssp *g, uint32_t range)
{
    if (g->clock && range < g->clock_ranges)
        memset(&g->clock[(size_t)range * CPS_MAX_NODES], 0, CPS_MAX_NODES * sizeof *g->clock);
}

uint64_t cps__ssp_clock(cps__ssp *g, const cps__view *v, uint32_t range, uint32_t worker)
{
    uint64_t *c = clock_slot(g, v, range, worker);
    return c ? *c : 0;
}

/* The bound is on how far a worker runs ahead of the others, so its own clock is left out. */
int cps__ssp_may_proceed(cps__ssp *g, const cps__view *v, uint32_t range, uint64_t clock,
                         uint32_t worker)
{
    if (v->mode != CPS_MODE_SSP)
        return 1;
    uint64_t m = slowest_clock(g, v, range, worker);
    return m == UINT64_MAX || m + v->ssp_bound >= clock;
}

int cps__ssp_park(cps__ssp *g, uint32_t range, uint32_t worker, uint64_t clock, void *cookie)
{
    if (!cookie)
        return CPS_EINVAL;
    void *p = g->parked, *r = g->released;
    int rc = cps__array_reserve(&p, &g->parked_cap, g->nparked + 1, sizeof *g->parked, 16);
    g->parked = p;
    if (rc == 0)
        rc = cps__array_reserve(&r, &g->released_cap, g->nparked + 1, sizeof *g->released, 16);
    g->released = r;
    if (rc != 0)
        return rc;
    g->parked[g->nparked++] = (parked){range, worker, clock, cookie};
    return 0;
}

void cps__ssp_wake(cps__ssp *g, const cps__view *v)
{
    size_t kept = 0;
    g->nreleased = 0;
    for (size_t i = 0; i < g->nparked; i++) {
        parked *p = &g->parked[i];
        if (cps__ssp_may_proceed(g, v, p->range, p->clock, p->worker))
            g->released[g->nreleased++] = p->cookie;
        else
            g->parked[kept++] = *p;
    }
    g->nparked = kept;
}

size_t cps__ssp_released(cps__ssp *g, void *const **out)
{
    *out = g->released;
    return g->nreleased;
}

uint32_t cps__ssp_parked(const cps__ssp *g)
{
    return g ? (uint32_t)g->nparked : 0;
}
