/* Exporters' requests for a worker's local tensors (replication/local_queue.h). */
#include "replication/local_queue.h"

#include "chainps/error.h"

void cps__lq_init(cps__lq *q)
{
    *q = (cps__lq){.last = CPS_LQ_NO_STEP};
}

static cps__lq_act status_of(int slot, uint64_t req_seq, int status, uint64_t step)
{
    return (cps__lq_act){
        .kind = CPS_LQ_STATUS, .slot = slot, .req_seq = req_seq, .status = status, .step = step};
}

size_t cps__lq_request(cps__lq *q, uint64_t req_seq, uint64_t want, int any, size_t ntensors,
                       cps__lq_act acts[2])
{
    uint64_t last = q->last == CPS_LQ_NO_STEP ? 0 : q->last;
    if (ntensors == 0 || (!any && q->last != CPS_LQ_NO_STEP && want <= q->last)) {
        acts[0] = status_of(-1, req_seq, ntensors == 0 ? CPS_ENOTFOUND : CPS_EPAST, last);
        return 1;
    }
    int slot = -1;
    for (int i = 0; i < CPS_LQ_SLOTS && slot < 0; i++)
        if (q->q[i].state == CPS_LQ_FREE)
            slot = i;
    int evict = slot < 0;
    for (int i = 0; evict && i < CPS_LQ_SLOTS; i++)
        if (q->q[i].state == CPS_LQ_WAITING && (slot < 0 || q->q[i].arrival < q->q[slot].arrival))
            slot = i;
    if (slot < 0) { /* every slot is being answered right now */
        acts[0] = status_of(-1, req_seq, CPS_EAGAIN, last);
        return 1;
    }
    size_t n = 0;
    if (evict) {
        acts[n] = status_of(slot, q->q[slot].req_seq, CPS_EAGAIN, last);
        acts[n++].want = q->q[slot].want;
    }
    q->q[slot] = (cps__lq_slot){.state = CPS_LQ_WAITING,
                                .any = any,
                                .want = want,
                                .req_seq = req_seq,
                                .arrival = ++q->arrivals};
    acts[n++] = (cps__lq_act){.kind = CPS_LQ_HOLD, .slot = slot, .req_seq = req_seq};
    return n;
}

size_t cps__lq_commit(cps__lq *q, uint64_t step, cps__lq_act acts[CPS_LQ_SLOTS])
{
    size_t n = 0;
    for (int i = 0; i < CPS_LQ_SLOTS; i++) {
        cps__lq_slot *r = &q->q[i];
        if (r->state != CPS_LQ_WAITING)
            continue;
        if (r->any || step == r->want) {
            r->state = CPS_LQ_SENDING;
            acts[n++] =
                (cps__lq_act){.kind = CPS_LQ_BLOB, .slot = i, .req_seq = r->req_seq, .step = step};
        } else if (step > r->want) {
            acts[n] = status_of(i, r->req_seq, CPS_EPAST, step);
            acts[n++].want = r->want;
            r->state = CPS_LQ_FREE;
        }
    }
    q->last = step;
    return n;
}

void cps__lq_sent(cps__lq *q, int slot)
{
    if (slot >= 0 && slot < CPS_LQ_SLOTS)
        q->q[slot].state = CPS_LQ_FREE;
}
