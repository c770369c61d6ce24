/* Who is in the workers' all-reduce ring under a view, and whether this worker is a replacement:
 * the part of the collective's protocol that reads the scheduler's view (docs/collective.md).
 * replication/collective.h runs the ring over the member list this gives; src/worker/collective.c
 * only hands the view over and performs. Pure: no I/O, no clock. */
#ifndef CPS_REPLICATION_RING_VIEW_H
#define CPS_REPLICATION_RING_VIEW_H

#include <stdint.h>

#include "core/view.h"

/* The ring's members under `v`: the live workers no other node supersedes, in rank order (ties,
 * which a view should not hold, by id), written to members[0..cap). Returns their count (at most
 * v->nnodes; the caller gives cap >= v->nnodes, else the list is cut at cap). */
uint32_t cps__ring_members(const cps__view *v, uint32_t *members, uint32_t cap);

/* 1 if worker `me` took the rank of another worker of `v` that it supersedes (a replacement: it
 * fetches the shared state before its first collective and joins the ring as a newcomer), else 0
 * (also when `me` is not in the view). Decided once, at the first view that names us. */
int cps__ring_replacement(const cps__view *v, uint32_t me);

/* 1 if the transport's peer of worker `w` is of no more use under `v`: `w` is not us and is dead
 * or superseded (its queued chunks go nowhere). */
int cps__ring_gone(const cps__view *v, const cps__node_info *w, uint32_t me);

#endif
