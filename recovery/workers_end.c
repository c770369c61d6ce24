/* The scheduler's rules for the end of a job's workers (recovery/workers_end.h). */
#include "recovery/workers_end.h"

#include <string.h>

int cps__workers_barrier_releases(uint32_t n, cps__worker_at at, const void *ctx)
{
    uint32_t waiting = 0, live = 0;
    for (uint32_t i = 0; i < n; i++) {
        cps__worker_mark w;
        if (!at(ctx, i, &w) || w.done || !w.alive)
            continue; /* finished or dead workers do not hold a barrier up */
        live++;
        waiting += w.in_barrier != 0;
    }
    return live > 0 && waiting == live;
}

uint32_t cps__workers_unfinished_dead_rank(uint32_t n, cps__worker_at at, const void *ctx,
                                           uint32_t num_workers, unsigned char *held)
{
    /* One pass over the records, then one over the ranks: every goodbye at the job's end sends a
     * view to each worker, so ranks x records here would cost the job's end W^2 N. */
    memset(held, 0, num_workers);
    for (uint32_t i = 0; i < n; i++) {
        cps__worker_mark w;
        if (at(ctx, i, &w) && w.rank < num_workers && (w.done || w.alive))
            held[w.rank] = 1;
    }
    for (uint32_t r = 0; r < num_workers; r++)
        if (!held[r])
            return r;
    return UINT32_MAX;
}
