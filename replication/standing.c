/* A server's standing with its scheduler (replication/standing.h). */
#include "replication/standing.h"

#include "chainps/error.h"
#include "core/wire.h"

int cps__standing_probe(uint8_t type, int from_sched)
{
    return type == CPS_MSG_PROBE && from_sched;
}

int cps__standing_tell_bad(uint8_t type, uint32_t flags, int joined, int from_worker)
{
    return type != 0 && !(flags & CPS_WF_REPLY) && joined && from_worker;
}

int cps__standing_checksum(int joined, const cps__view *v, uint32_t range)
{
    return joined && range < v->nranges;
}

uint32_t cps__drain_held(const cps__view *v, uint32_t self)
{
    uint32_t held = 0;
    for (uint32_t r = 0; r < v->nranges; r++) {
        const cps__range *rg = &v->ranges[r];
        for (uint32_t j = 0; j < rg->chain_len; j++)
            if (rg->chain[j] == self) {
                held++;
                break;
            }
    }
    return held;
}

int cps__drain_decide(int state, int signals, int joined, int fenced, uint32_t held,
                      uint64_t asked_ms, uint64_t now, uint32_t answer_ms)
{
    if (signals > 1 || !joined || fenced)
        return CPS_DRAIN_STOP;
    if (state == CPS_DRAIN_ACCEPTED)
        return CPS_DRAIN_SERVE;
    if (state == CPS_DRAIN_ASKED) /* the scheduler is gone, or ends the job itself */
        return now - asked_ms < answer_ms ? CPS_DRAIN_SERVE : CPS_DRAIN_STOP;
    return held ? CPS_DRAIN_ASK : CPS_DRAIN_STOP;
}

int cps__drain_on_answer(int state, uint8_t type, int from_sched)
{
    if (!from_sched || state != CPS_DRAIN_ASKED)
        return state;
    if (type == CPS_MSG_ERROR)
        return -1;
    if (type == CPS_MSG_ACK)
        return CPS_DRAIN_ACCEPTED;
    return state;
}

int cps__standing_sched_gone(int connected, uint64_t *seen_ms, uint64_t now, uint32_t timeout_ms)
{
    if (connected || *seen_ms > now)
        *seen_ms = now;
    return now - *seen_ms > timeout_ms;
}

int cps__standing_job(uint64_t job, uint64_t stored, int *store)
{
    *store = 0;
    if (!job)
        return 0; /* a scheduler from before job ids */
    if (stored && stored != job)
        return CPS_EEXIST;
    *store = stored == 0;
    return 0;
}
