/* The replica's standing (recovery/fence.h), decided here rather than in the shell: whether a
 * message may be served, when a stall makes us unsure and we ask for the view, what a view from
 * the scheduler means for us (confirmed, newer, let in, fenced), and which ranges it drops. The
 * shell performs the ready list and, fenced, rejoins as a new replica (a new fence). */
#include <inttypes.h>

#include "chainps/error.h"
#include "core/log.h"
#include "replication/replica_int.h"

/* The scheduler's node id: messages from it may change our standing. */
#define SCHED_NODE 0u

/* A stall the fence measured at `now` (turned: the loop turns, else a message comes): unsure,
 * we ask the scheduler for the view, and again while no answer comes. */
static void stall_check(cps__replica *r, uint64_t now, int turned)
{
    if (!r->cfg.dead_after_ms)
        return; /* no failure timeout: never unsure */
    uint64_t stalled = cps__fence_stalled_ms(r->fence, now);
    int verdict = turned ? cps__fence_turned(r->fence, now) : cps__fence_check(r->fence, now);
    if (verdict == CPS_FENCE_CALM)
        return;
    if (verdict == CPS_FENCE_STALLED)
        cps__rp_say(r, CPS_LOG_WARN,
                    "did not run for %" PRIu64 " ms (more than the %" PRIu32
                    " ms failure timeout): asking the scheduler whether we are still in before "
                    "serving anything",
                    stalled, r->cfg.dead_after_ms);
    cps__rp_ask_view(r);
}

int cps__rp_standing(cps__replica *r, const cps__msg_hdr *h, int our_welcome, uint64_t now)
{
    stall_check(r, now, 0);
    int origin = h->sender != SCHED_NODE                     ? CPS_FENCE_FROM_PEER
                 : our_welcome && h->type == CPS_MSG_WELCOME ? CPS_FENCE_OUR_WELCOME
                                                             : CPS_FENCE_FROM_SCHED;
    return cps__fence_admit(r->fence, h->type, origin);
}

int cps__replica_admit(cps__replica *r, const cps__msg_hdr *h, uint64_t boot_id, uint64_t now)
{
    cps__rp_begin(r);
    now = cps__rp_clock(r, now);
    /* The scheduler names in a WELCOME the incarnation whose HELLO it answers (0: none it
     * knows); one naming an earlier life of ours (late, or a copy) is not ours. */
    int our_welcome = h->type == CPS_MSG_WELCOME && boot_id != 0 && h->req_seq == boot_id;
    return cps__rp_standing(r, h, our_welcome, now);
}

int cps__replica_turned(cps__replica *r, uint64_t now)
{
    cps__rp_begin(r);
    now = cps__rp_clock(r, now);
    stall_check(r, now, 1);
    return 0;
}

int cps__replica_view_news(cps__replica *r, const cps__view *v, uint32_t self, int welcome)
{
    cps__rp_begin(r);
    const cps__node_info *me = cps__view_node(v, self);
    int verdict = cps__fence_view(r->fence, v->epoch, me != NULL, me && me->alive);
    if (verdict == CPS_FENCE_V_CONFIRMED)
        cps__rp_say(r, CPS_LOG_INFO,
                    "the scheduler still counts us in (epoch %" PRIu64 "): serving again; %" PRIu64
                    " messages that came while we were unsure were dropped unanswered",
                    v->epoch, cps__fence_dropped(r->fence));
    if (verdict != CPS_FENCE_V_NEWER)
        return CPS_RV_DONE;
    /* Let in (our WELCOME, or the first view since we (re)started): the shell checks the job and
     * takes the node id the welcome gives us before installing. */
    return welcome || !cps__fence_joined(r->fence) ? CPS_RV_LET_IN : CPS_RV_NEWER;
}

/* The log line of a view that lets us in: our place in its chains. */
static void say_joined(cps__replica *r, const cps__view *v, uint32_t self, uint32_t rank)
{
    uint32_t head = 0, mid = 0, tail = 0;
    for (uint32_t k = 0; k < v->nranges; k++) {
        const cps__range *rg = &v->ranges[k];
        for (uint32_t j = 0; j < rg->chain_len; j++) {
            if (rg->chain[j] != self)
                continue;
            if (j == 0)
                head++;
            else if (j + 1 == rg->chain_len)
                tail++;
            else
                mid++;
        }
    }
    cps__rp_say(r, CPS_LOG_INFO,
                "joined as node %" PRIu32 " (rank %" PRIu32 "), view epoch %" PRIu64
                ": head of %" PRIu32 ", middle of %" PRIu32 ", tail of %" PRIu32 " of %" PRIu32
                " ranges (%" PRIu32 " replicas)",
                self, rank, v->epoch, head, mid, tail, v->nranges, v->replicas);
}

int cps__rp_fence_install(cps__replica *r, const cps__view *v, uint32_t self, int *fresh)
{
    const cps__node_info *me = cps__view_node(v, self);
    int verdict = cps__fence_install(r->fence, v->epoch, me != NULL, me && me->alive);
    if (verdict == CPS_FENCE_V_FENCED) {
        cps__rp_say(r, CPS_LOG_WARN,
                    "declared dead by the scheduler (view epoch %" PRIu64
                    "): fenced; dropping our chain state and rejoining as a fresh replica",
                    v->epoch);
        return CPS_RV_FENCED;
    }
    if (verdict == CPS_FENCE_V_IGNORE)
        return CPS_RV_DONE; /* fenced already: the views queued meanwhile say so again */
    *fresh = verdict == CPS_FENCE_V_JOINED;
    if (*fresh)
        say_joined(r, v, self, me ? me->rank : 0);
    else
        cps__rp_say(r, CPS_LOG_INFO, "view epoch %" PRIu64 " installed", v->epoch);
    return CPS_RV_INSTALLED;
}

const cps__fence *cps__replica_fence(const cps__replica *r)
{
    return r->fence;
}
