/* A replacement's fetch of a shared buffer, and the sharer's answer (replication/ring_fetch.h). */
#include "replication/ring_fetch.h"

#include "chainps/error.h"
#include "core/wire.h"

void cps__fetch_start(cps__fetch *f, uint64_t len, uint64_t now, uint64_t timeout_ms)
{
    uint64_t req = f->req; /* numbers keep growing across fetches */
    *f = (cps__fetch){.active = 1, .len = len, .deadline = now + timeout_ms, .req = req};
}

void cps__fetch_stop(cps__fetch *f)
{
    f->active = 0;
}

/* The member to ask after `after` in ring order (0: from the start), not us; 0 if none. A
 * worker `after` that left the ring has no successor here: the fetch ends. */
static uint32_t target(const uint32_t *members, uint32_t n, uint32_t me, uint32_t after)
{
    int past = after == 0;
    for (uint32_t i = 0; i < n; i++) {
        if (members[i] == after) {
            past = 1;
            continue;
        }
        if (past && members[i] != me)
            return members[i];
    }
    return 0;
}

static int done(cps__fetch *f, int outcome, int *result)
{
    f->active = 0;
    *result = outcome;
    return CPS_FETCH_DONE;
}

int cps__fetch_next(cps__fetch *f, const cps__view *v, const uint32_t *members, uint32_t n,
                    uint32_t me, int shutdown, uint64_t now, uint32_t *to, uint64_t *req,
                    int *result)
{
    if (!f->active)
        return done(f, CPS_EINVAL, result);
    if (f->answered) {
        if (f->result != CPS_ENOTFOUND)
            return done(f, f->result, result);
        /* That one shares nothing (another replacement?): ask the next. */
        f->answered = 0;
        f->from = target(members, n, me, f->from);
        if (!f->from)
            return done(f, CPS_ENOTFOUND, result);
        f->sent = 0;
    }
    if (shutdown)
        return done(f, CPS_ESHUTDOWN, result);
    if (now >= f->deadline)
        return done(f, CPS_ETIMEDOUT, result);
    if (f->sent && now - f->sent_ms < CPS_FETCH_RESEND_MS)
        return CPS_FETCH_WAIT;
    /* (Again) to the first live worker: the one asked may have died since. */
    const cps__node_info *w = f->from ? cps__view_node(v, f->from) : NULL;
    uint32_t t = w && w->alive ? f->from : target(members, n, me, 0);
    if (!t)
        return done(f, CPS_ENOPEER, result);
    f->from = t;
    f->sent = 1;
    f->sent_ms = now;
    *to = t;
    *req = ++f->req;
    return CPS_FETCH_SEND;
}

int cps__fetch_answer(cps__fetch *f, uint32_t from, uint64_t req_seq, int status, uint64_t count,
                      uint64_t step)
{
    if (!f->active || f->answered || req_seq != f->req || from != f->from)
        return 0;
    f->answered = 1;
    if (status < 0) {
        f->result = status;
        return 0;
    }
    if (count < f->len) {
        f->result = CPS_ESIZE;
        return 0;
    }
    f->result = 1;
    f->step = step;
    return 1;
}

int cps__fetch_serve(uint64_t share_len, uint64_t want, uint64_t share_seq, int has_result,
                     uint64_t result_seq, uint64_t result_len, int *with_result)
{
    *with_result = 0;
    if (share_len == 0)
        return CPS_ENOTFOUND;
    if (want != share_len)
        return CPS_ESIZE;
    /* The result that goes with the state: if every member that completed that collective dies
     * before the others got it, the replacement answers their restart with it. Too large to go
     * along, the replacement asks the ring instead. */
    *with_result = has_result && result_seq == share_seq &&
                   (share_len + result_len) * sizeof(float) <= CPS_WIRE_MAX_PAYLOAD;
    return 0;
}
