/* Stale synchronous parallel (SSP) clock gates at the tail of a range, as a pure state machine.
 *
 * In SSP mode a worker may run at most `ssp_bound` steps ahead of the slowest live worker (Ho
 * et al., NIPS 2013). Each replica keeps, per range, the clock of every worker: the highest
 * step of its pushes applied to the range (every replica applies the same updates, so every
 * replica has the same clocks). They are state of the range like its values: the server stores
 * each clock an update moves in that update's transaction and a snapshot carries them
 * (CPS_DEDUP_CLOCK_BIT), so a restarted replica or a new tail loads them (cps__ssp_pushed) instead
 * of starting every worker at 0 and holding pulls until each pushes again. A pull carries the clock
 * it reads at; the tail serves it once the slowest clock of the other live workers is within the
 * bound, and parks it until then. A worker taking a dead worker's rank starts at the slowest clock
 * of the others, not at 0, where it would hold every other worker back until it had pushed its way
 * up alone.
 *
 * Parked pulls are the caller's opaque cookies. A cookie the gate takes is handed back exactly
 * once: in the released list of cps__ssp_wake, or to the drop callback at destroy.
 *
 * In modes other than SSP every pull proceeds and a DECLARE moves no clock.
 *
 * Pure: no I/O, no clock, no store. The view is borrowed for each call. Not thread-safe.
 */
#ifndef CPS_REPLICATION_SSP_H
#define CPS_REPLICATION_SSP_H

#include <stddef.h>
#include <stdint.h>

#include "core/view.h"
#include "replication/chain.h"

typedef struct cps__ssp cps__ssp;

/* Create a gate with no clocks and nothing parked. `drop` (may be NULL) releases cookies still
 * parked at destroy, with `ctx`. Errors: CPS_ENOMEM. */
int cps__ssp_create(void (*drop)(void *ctx, void *cookie), void *ctx, cps__ssp **out);
/* Free the gate, handing every parked cookie to `drop`. NULL is a no-op. */
void cps__ssp_destroy(cps__ssp *g);

/* An update holding `worker`'s push of `step` (dense, not a declare or restore) was applied to
 * `range`: its clock there is at least `step`. Clocks are kept for v->nranges ranges; a view
 * with another range count starts them again from 0. Errors: CPS_EINVAL (range or worker id
 * out of bounds), CPS_ENOMEM (the clock is not moved). */
int cps__ssp_pushed(cps__ssp *g, const cps__view *v, uint32_t range, uint32_t worker,
                    uint64_t step);

/* Update `u` was applied to `range`: each dense push or push-pull it holds moves its worker's
 * clock (cps__ssp_pushed), each DECLARE places a replacement (cps__ssp_declared); sparse pushes
 * and restores (PUT) are not steps and move nothing. Errors are those of cps__ssp_pushed; the
 * other requests are still counted. */
int cps__ssp_applied(cps__ssp *g, const cps__view *v, uint32_t range, const cps__chain_update *u);

/* `worker`'s DECLARE was applied to `range`. In SSP mode a worker taking a dead worker's rank
 * whose clock is still 0 starts at the slowest clock of the other live workers, or, with none
 * running, at the highest clock any other worker reached. */
void cps__ssp_declared(cps__ssp *g, const cps__view *v, uint32_t range, uint32_t worker);

/* The step a DECLARE of `worker` answers with in SSP mode: its clock in `range` if it takes a
 * dead worker's rank, else 0 (a worker starting with the job counts from 0). */
uint64_t cps__ssp_declare_step(cps__ssp *g, const cps__view *v, uint32_t range, uint32_t worker);

/* Forget every clock of `range` (its replica is copied again from another). */
void cps__ssp_forget_range(cps__ssp *g, uint32_t range);

/* `worker`'s clock in `range` (0 if unknown). */
uint64_t cps__ssp_clock(cps__ssp *g, const cps__view *v, uint32_t range, uint32_t worker);

/* 1 if a pull of `worker` reading at `clock` may be served now: not SSP mode, or the slowest
 * clock of the other live workers plus ssp_bound reaches `clock`. The worker's own clock never
 * holds back its pull (its push may still be on the way to this range). A replacement whose
 * DECLARE is not applied here yet has no clock and does not count. */
int cps__ssp_may_proceed(cps__ssp *g, const cps__view *v, uint32_t range, uint64_t clock,
                         uint32_t worker);

/* Keep `cookie` (a pull of `worker` in `range` reading at `clock`) until cps__ssp_wake releases
 * it. Errors: CPS_EINVAL (NULL cookie), CPS_ENOMEM (the cookie stays the caller's). */
int cps__ssp_park(cps__ssp *g, uint32_t range, uint32_t worker, uint64_t clock, void *cookie);

/* After updates were applied or the view changed: release every parked pull that may proceed
 * now, in the order they were parked; the others stay parked, in order. Never fails. */
void cps__ssp_wake(cps__ssp *g, const cps__view *v);

/* The cookies released by the last cps__ssp_wake, in order; they are the caller's again. The
 * array stays valid until the next call into this gate. */
size_t cps__ssp_released(cps__ssp *g, void *const **out);

/* Pulls parked. */
uint32_t cps__ssp_parked(const cps__ssp *g);

#endif
