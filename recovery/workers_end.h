/* The scheduler's rules for the end of a job's workers, over any list of worker records: when a
 * barrier releases, and whether every worker rank is accounted for (no rank awaits the
 * replacement of a worker that died). The coordinator (recovery/coordinator_membership.c) applies
 * them to its nodes; tests/sim/collective* applies the same functions to its modelled workers.
 * Pure: no I/O, no clock. */
#ifndef CPS_RECOVERY_WORKERS_END_H
#define CPS_RECOVERY_WORKERS_END_H

#include <stdint.h>

/* What the rules read of one worker record. */
typedef struct cps__worker_mark {
    uint32_t rank;
    int alive;      /* the scheduler believes it lives (not declared dead, not left) */
    int done;       /* it finished: said goodbye in cps_close */
    int in_barrier; /* it waits in cps_barrier */
} cps__worker_mark;

/* Record `i` of `ctx`'s list: 1 and *out when it is a worker's, 0 when it is another node's. */
typedef int (*cps__worker_at)(const void *ctx, uint32_t i, cps__worker_mark *out);

/* 1 when a barrier releases: some live unfinished worker waits and every one does (finished or
 * dead workers do not hold it up, a dead one not yet replaced included), over records 0..n-1. */
int cps__workers_barrier_releases(uint32_t n, cps__worker_at at, const void *ctx);

/* The lowest worker rank below `num_workers` held by no live worker and no finished one (its
 * worker died and no replacement took it yet), or UINT32_MAX when every rank is held: the
 * scheduler's word CPS_VIEW_WORKERS_SETTLED. `held` is scratch of num_workers bytes. */
uint32_t cps__workers_unfinished_dead_rank(uint32_t n, cps__worker_at at, const void *ctx,
                                           uint32_t num_workers, unsigned char *held);

#endif
