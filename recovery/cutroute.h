/* Where a checkpoint export reads each range's cut from, across view changes (issue 26).
 *
 * A sync job's cut is a step boundary T, and every replica of a range passes through the very
 * same state there: the replicas apply the same updates under the same sequence numbers, and no
 * replica applies step T + 1 before the tail has applied T (every worker needs its pull of T,
 * served by the tail, before it pushes T + 1). So the exporter asks every replica of a range to
 * open a read view at T, and any replica whose view opened at the range's sequence number serves
 * the range's reads. When the reader dies (kill -9 of the tail, or of a head that was serving),
 * another replica's view holds the same bytes: the export goes on under the new view instead of
 * waiting out its timeout, even though the job has moved past T meanwhile.
 *
 * Async and SSP cuts are "now" at the tail (the head's "now" holds updates not yet
 * acknowledged), which no other replica shares: with `all_replicas` 0 only the tail is asked, and
 * a reader that dies loses the range's cut (the export cuts again: a "now" can always be had).
 *
 * The exporter (src/checkpoint/cluster_cut.c) feeds it views and the replicas' answers and performs
 * the actions it returns. Pure: no I/O, no clock. Not thread-safe. */
#ifndef CPS_RECOVERY_CUTROUTE_H
#define CPS_RECOVERY_CUTROUTE_H

#include <stddef.h>
#include <stdint.h>

#include "core/view.h"

typedef struct cps__cutroute cps__cutroute;

enum cps__cr_kind {
    /* Send CUT_OPEN for `range` to server `node` (its inbox). */
    CPS_CR_ASK = 1,
    /* Read `range` from `node`'s read view (cps__cutroute_url) from now on: re-send the reads in
     * flight there (those sent to the previous reader are lost with it). */
    CPS_CR_READ_FROM,
    /* `node`'s read view of `range` is of no use (opened at another sequence number): close it. */
    CPS_CR_CLOSE,
    /* The range's cut cannot be had: `err` is CPS_EUNAVAILABLE (no live replica in the view),
     * CPS_EAGAIN (the replicas that held the cut are gone: cut again at a later step), or the
     * refusal of the last replica asked (e.g. CPS_EPAST, with `step` where it was). */
    CPS_CR_LOST,
};

typedef struct cps__cr_action {
    uint8_t kind; /* cps__cr_kind */
    uint32_t range;
    uint32_t node;
    int err;       /* CPS_CR_LOST */
    uint64_t step; /* CPS_CR_LOST with CPS_EPAST: the step the range reported */
} cps__cr_action;

/**
 * @brief A routing table for one cut.
 * @param[in] nranges the view's ranges
 * @param[in] need    need[r] 1 for the ranges holding keys to export (copied); the others are
 *                    neither asked nor waited for
 * @param[in] all_replicas 1: ask every replica (sync cuts at a step); 0: the tail only
 * @return 0, CPS_EINVAL, CPS_ENOMEM. The caller destroys *out.
 */
int cps__cutroute_create(uint32_t nranges, const unsigned char *need, int all_replicas,
                         cps__cutroute **out);
void cps__cutroute_destroy(cps__cutroute *cr);

/* Each of these returns the number of actions and points *act at them (owned by cr, valid
 * until the next call); negative: CPS_ENOMEM or CPS_EINVAL (a view of another range count). */

/** A view (the first, or a newer one): ask the replicas not yet asked, forget those that left
 * the chains, and move the reads of a range whose reader left. */
int cps__cutroute_view(cps__cutroute *cr, const cps__view *v, const cps__cr_action **act);
/** `node` opened its read view of `range` at sequence number `seq`, answering at `url`
 * (copied; at most CPS_ADDR_MAX - 1 characters). The first view to open sets the range's
 * sequence number. */
int cps__cutroute_opened(cps__cutroute *cr, uint32_t range, uint32_t node, uint64_t seq,
                         const char *url, const cps__cr_action **act);
/** `node` refused to open `range` with `err` (`step`: where it was, for CPS_EPAST). A refusal for
 * a stale view (CPS_ESTALE_EPOCH) only forgets the ask: the next view asks again. */
int cps__cutroute_refused(cps__cutroute *cr, uint32_t range, uint32_t node, int err, uint64_t step,
                          const cps__cr_action **act);
/** `node`'s read view of `range` closed (it told us, or its process is gone): another replica's
 * view serves the range, or the range is lost once none is left. */
int cps__cutroute_closed(cps__cutroute *cr, uint32_t range, uint32_t node,
                         const cps__cr_action **act);

/* The node reads of `range` go to now (0: none yet), and its read view's address (NULL: none). */
uint32_t cps__cutroute_reader(const cps__cutroute *cr, uint32_t range);
const char *cps__cutroute_url(const cps__cutroute *cr, uint32_t range, uint32_t node);
/* The range's sequence number at the cut (0 before a view opened). */
uint64_t cps__cutroute_seq(const cps__cutroute *cr, uint32_t range);
/* 1 when every needed range has a reader. */
int cps__cutroute_ready(const cps__cutroute *cr);
/* Every opened read view, for closing them: call fn for each (range, node). */
void cps__cutroute_each_open(const cps__cutroute *cr,
                             void (*fn)(void *ctx, uint32_t range, uint32_t node), void *ctx);

#endif
