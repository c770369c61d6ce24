/* Where a checkpoint restore sends each range's records across view changes.
 *
 * A restore (src/checkpoint/cluster.c) streams every range's records as PUTs to the range's head,
 * which applies each one, answers, and forwards it down the chain. A server that dies in the middle
 * of the restore is removed from the chains by the scheduler, and the restore goes on under the new
 * view instead of waiting out its timeout for answers that will never come:
 * - the range's head is the same: the chain itself re-sends to a new successor what it lacks
 *   (a middle or the tail died), so the records sent so far still count;
 * - the head changed (it died, or the scheduler moved it): the new head may lack any record of the
 *   range, even one the old head answered (a head answers before its successor has the update),
 *   so the range's stream starts again at the new head. Every record sets values (a create resets
 *   the key, a slice overwrites), so the stream sent again in its order leaves the same bytes;
 * - no live replica is left: the range cannot be restored; the restore fails at once, naming it.
 *
 * Pure: no I/O, no clock. */
#ifndef CPS_RECOVERY_RESTORE_ROUTE_H
#define CPS_RECOVERY_RESTORE_ROUTE_H

#include <stdint.h>

#include "core/view.h"

/* No PUT of the range went anywhere yet (cps__restore_route's sent_head). */
#define CPS_RR_NONE UINT32_MAX

/**
 * @brief Which ranges' streams must start again under view `v`.
 * @param[in]  v         the newest view
 * @param[in]  nranges   ranges of the restore (v->nranges must be the same)
 * @param[in]  sent_head per range, the node its PUTs of the current stream went to
 *                       (CPS_RR_NONE: none yet, nothing to lose)
 * @param[out] resend    per range (caller's array of nranges): 1 if its stream starts again at
 *                       v's head, 0 if what was sent still counts
 * @param[out] bad       the first range without a live replica (set only on CPS_EUNAVAILABLE)
 * @return 0; CPS_EUNAVAILABLE (a range's chain is empty in v); CPS_EINVAL (NULL argument, or a
 *         view of another range count).
 */
int cps__restore_route(const cps__view *v, uint32_t nranges, const uint32_t *sent_head,
                       unsigned char *resend, uint32_t *bad);

#endif
