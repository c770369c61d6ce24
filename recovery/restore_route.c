/* Where a checkpoint restore sends each range's records across view changes (restore_route.h). */
#include "recovery/restore_route.h"

#include "chainps/error.h"

int cps__restore_route(const cps__view *v, uint32_t nranges, const uint32_t *sent_head,
                       unsigned char *resend, uint32_t *bad)
{
    if (!v || !sent_head || !resend || !bad || v->nranges != nranges || (nranges && !v->ranges))
        return CPS_EINVAL;
    /* Every range is judged before the verdict: a caller that fails still sees them all. */
    int rc = 0;
    for (uint32_t r = 0; r < nranges; r++) {
        const cps__range *g = &v->ranges[r];
        if (g->chain_len == 0) {
            resend[r] = 0;
            if (rc == 0)
                *bad = r;
            rc = CPS_EUNAVAILABLE;
            continue;
        }
        resend[r] = sent_head[r] != CPS_RR_NONE && sent_head[r] != g->chain[0];
    }
    return rc;
}

int cps__restore_answer(const cps__rr_answer *a, uint32_t head, uint64_t seq0, uint64_t oldest,
                        uint32_t inflight)
{
    if (!a || !inflight || a->sender != head || a->put_seq < seq0 || a->put_seq < oldest)
        return CPS_RR_IGNORE;
    if (a->put_seq > oldest)
        return CPS_RR_AGAIN;
    if (!a->error)
        return CPS_RR_TAKEN;
    if (a->status == CPS_ESTALE_EPOCH || a->status == CPS_EAGAIN)
        return CPS_RR_AGAIN;
    return CPS_RR_FATAL;
}

int cps__restore_silence(uint64_t now, uint64_t heard_ms, uint64_t quiet_since, uint32_t inflight,
                         uint64_t silent_ms, uint64_t timeout_ms)
{
    if (!inflight)
        return CPS_RR_WAIT;
    if (now >= quiet_since + timeout_ms)
        return CPS_RR_TIMEOUT;
    if (silent_ms < timeout_ms && now >= heard_ms + silent_ms)
        return CPS_RR_RESEND;
    return CPS_RR_WAIT;
}
