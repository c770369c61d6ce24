/* View changes, as pure functions of a view: what the scheduler publishes when a node dies or
 * comes back. Every result has a higher epoch than its input. */
#ifndef CPS_RECOVERY_VIEW_CHANGE_H
#define CPS_RECOVERY_VIEW_CHANGE_H

#include <stdint.h>

#include "core/view.h"

/* out = in with server or worker `node` marked dead (alive = 0) and removed from every chain
 * it was in, epoch + 1. The order of the remaining replicas is kept, so a dead head's successor
 * becomes head, a dead tail's predecessor becomes tail, and a dead middle's predecessor links to
 * its successor. A node that is the last replica of a range stays in that chain (marked dead):
 * the range is unavailable, not lost, and comes back if that server restarts on its data.
 * *lost_ranges (may be NULL) receives how many ranges have no live replica in `out`.
 * out must be initialised (cps__view_init); its old content is replaced.
 * Errors: CPS_ENOTFOUND (no such node), CPS_ENOMEM. */
int cps__view_without(const cps__view *in, uint32_t node, cps__view *out, uint32_t *lost_ranges);

/* 1 if range r of v has at least one live replica. */
int cps__view_range_available(const cps__view *v, uint32_t r);

#endif
