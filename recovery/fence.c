#include "fence.h"

#include <stdlib.h>

#include "chainps/error.h"
#include "core/wire.h"

struct cps__fence {
    uint32_t dead_after_ms;
    int joined;
    int suspect;
    int fenced;
    uint64_t epoch;        /* of the view installed (0: none) */
    uint64_t last_turn_ms; /* a stall is measured from it */
    uint64_t dropped;      /* messages not served since we became unsure */
    uint64_t asked_ms;     /* unsure: when we last asked the scheduler for the view */
};

int cps__fence_create(uint32_t dead_after_ms, uint64_t now, cps__fence **out)
{
    if (!out)
        return CPS_EINVAL;
    cps__fence *f = calloc(1, sizeof *f);
    if (!f)
        return CPS_ENOMEM;
    f->dead_after_ms = dead_after_ms;
    f->last_turn_ms = now;
    *out = f;
    return 0;
}

void cps__fence_destroy(cps__fence *f)
{
    free(f);
}

/* Checked before every message, not only once per loop turn: after a pause the poll that was
 * waiting returns a batch of queued requests, and none of them may be answered under the view
 * we had before the pause. */
int cps__fence_check(cps__fence *f, uint64_t now)
{
    if (f->suspect) {
        /* The view we asked for may have been lost, and no other is coming if the scheduler
         * still counts us in: without asking again we would drop everything for good. */
        if (now - f->asked_ms <= f->dead_after_ms)
            return CPS_FENCE_CALM;
        f->asked_ms = now;
        return CPS_FENCE_ASK_AGAIN;
    }
    if (!f->joined || now - f->last_turn_ms <= f->dead_after_ms)
        return CPS_FENCE_CALM;
    f->suspect = 1;
    f->dropped = 0;
    f->asked_ms = now;
    return CPS_FENCE_STALLED;
}

int cps__fence_turned(cps__fence *f, uint64_t now)
{
    int became = cps__fence_check(f, now);
    f->last_turn_ms = now;
    return became;
}

/* Dropped unanswered while unsure: counted for the log. */
static int unsure(cps__fence *f)
{
    if (!f->suspect)
        return 0;
    f->dropped++;
    return 1;
}

int cps__fence_admit(cps__fence *f, uint8_t type, int origin)
{
    int from_sched = origin != CPS_FENCE_FROM_PEER;
    if (f->fenced && type != CPS_MSG_SHUTDOWN)
        return CPS_FENCE_DROP; /* declared dead: nothing more under the old view, until rejoined */
    switch (type) {
    case CPS_MSG_WELCOME:
    case CPS_MSG_VIEW:
        if (!f->joined)
            return origin == CPS_FENCE_OUR_WELCOME ? CPS_FENCE_SERVE : CPS_FENCE_DROP;
        return from_sched ? CPS_FENCE_SERVE : CPS_FENCE_DROP;
    case CPS_MSG_SHUTDOWN:
        return from_sched ? CPS_FENCE_SERVE : CPS_FENCE_DROP;
    case CPS_MSG_CUT_PROBE:
    case CPS_MSG_CUT_OPEN:
    case CPS_MSG_PUT:
    case CPS_MSG_FWD:
    case CPS_MSG_CHAIN_ACK:
    case CPS_MSG_CHAIN_MARK:
    case CPS_MSG_SNAP_REQ:
    case CPS_MSG_SNAP:
        if (!f->joined)
            return CPS_FENCE_DROP;
        return unsure(f) ? CPS_FENCE_UNSURE : CPS_FENCE_SERVE;
    case CPS_MSG_JOIN_RANGE:
        /* Not counted: the scheduler orders the join again if it still wants it. */
        return f->joined && !f->suspect && from_sched ? CPS_FENCE_SERVE : CPS_FENCE_DROP;
    case CPS_MSG_DECLARE:
    case CPS_MSG_PUSH:
    case CPS_MSG_PUSH_PULL:
    case CPS_MSG_PULL:
        if (unsure(f))
            return CPS_FENCE_UNSURE; /* not until the scheduler confirms we are still in */
        /* A worker can hear its WELCOME before we hear ours. */
        return f->joined ? CPS_FENCE_SERVE : CPS_FENCE_EARLY;
    default:
        return CPS_FENCE_SERVE; /* errors, checksums, and what the caller refuses itself */
    }
}

int cps__fence_future(const cps__fence *f, uint64_t epoch)
{
    return f->joined && epoch > f->epoch;
}

int cps__fence_view(cps__fence *f, uint64_t epoch, int in_view, int alive)
{
    if (!f->joined || epoch > f->epoch)
        return CPS_FENCE_V_NEWER;
    if (f->suspect && epoch == f->epoch && in_view && alive) {
        f->suspect = 0;
        return CPS_FENCE_V_CONFIRMED;
    }
    return CPS_FENCE_V_IGNORE;
}

int cps__fence_install(cps__fence *f, uint64_t epoch, int in_view, int alive)
{
    if (f->joined && in_view && !alive) {
        /* Declared dead (we were paused, partitioned or too slow): our chains have moved on
         * without us. The views queued while we were paused all say so: only the first counts. */
        if (f->fenced)
            return CPS_FENCE_V_IGNORE;
        f->fenced = 1;
        return CPS_FENCE_V_FENCED;
    }
    f->suspect = 0; /* we heard from the scheduler, and we are in its view */
    f->epoch = epoch;
    if (f->joined)
        return CPS_FENCE_V_INSTALL;
    f->joined = 1;
    return CPS_FENCE_V_JOINED;
}

void cps__fence_rejoin(cps__fence *f, uint64_t now)
{
    f->joined = 0;
    f->suspect = 0;
    f->fenced = 0;
    f->epoch = 0;
    f->last_turn_ms = now;
}

int cps__fence_joined(const cps__fence *f)
{
    return f->joined;
}

int cps__fence_unsure(const cps__fence *f)
{
    return f->suspect;
}

int cps__fence_fenced(const cps__fence *f)
{
    return f->fenced;
}

int cps__fence_beating(const cps__fence *f)
{
    return f->joined && !f->fenced;
}

uint64_t cps__fence_dropped(const cps__fence *f)
{
    return f->dropped;
}

uint64_t cps__fence_stalled_ms(const cps__fence *f, uint64_t now)
{
    return now - f->last_turn_ms;
}
