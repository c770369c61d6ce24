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
 * worker `after` that left the ring has no successor here: callers begin a new pass instead. */
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

/* A pass begins again from the first member: what the last one learnt (who was asked, the
 * refusals counted, the parts taken) says nothing of the ring there is now. */
static void new_pass(cps__fetch *f)
{
    f->from = 0;
    f->sent = 0;
    f->has_id = 0;
    f->empties = 0;
    f->plain = 0;
}

static int done(cps__fetch *f, int outcome, int *result)
{
    f->active = 0;
    *result = outcome;
    return CPS_FETCH_DONE;
}

uint64_t cps__fetch_refusal_step(int status, int replacement, int ever_held)
{
    return status == CPS_ENOTFOUND && replacement && !ever_held ? CPS_FETCH_NEVER_HELD : 0;
}

static int is_member(const uint32_t *members, uint32_t n, uint32_t id)
{
    for (uint32_t i = 0; i < n; i++)
        if (members[i] == id)
            return 1;
    return 0;
}

/* Some worker rank of the job has no live worker in `v`. With the scheduler's word (every rank
 * is held by a live worker or by one that finished) that rank's worker finished. Two live
 * workers of one rank would hide a rank: counted so, the answer errs towards "none finished". */
static int some_rank_not_live(const cps__view *v)
{
    uint32_t live = 0;
    for (uint32_t i = 0; i < v->nnodes; i++)
        live += v->nodes[i].role == CPS_ROLE_WORKER && v->nodes[i].alive;
    return live < v->num_workers;
}

/* A pass is over and nobody gave the state: nobody live was left to ask, or only replacements
 * that never held one (a member that has shared nothing yet ended the fetch before). */
static int pass_over(cps__fetch *f, const cps__view *v, int settled, uint64_t now, int *result)
{
    if (settled) {
        /* Every rank is held by a live worker or by one that finished. With nobody live to ask,
         * the others finished: they completed the last all-reduce without the worker we
         * replace, passed the barrier and left, and the job's work is done (nobody will
         * all-reduce with us). With only empty replacements live, the same when some rank's
         * worker finished (it took the final state along, and nobody needs it: no rank has a
         * step left to run); when every rank is live, nobody holds the state any more. */
        if (f->empties == 0 || some_rank_not_live(v))
            return done(f, CPS_ESHUTDOWN, result);
        return done(f, CPS_ENOTFOUND, result);
    }
    /* A worker killed with the one we replace awaits its replacement: wait for it (or for the
     * word) rather than fail, and ask the live members again meanwhile. */
    if (!f->idle) {
        f->idle = 1;
        f->waited = 1;
        f->idle_ms = now;
    }
    new_pass(f);
    return CPS_FETCH_WAIT;
}

int cps__fetch_next(cps__fetch *f, const cps__view *v, const uint32_t *members, uint32_t n,
                    uint32_t me, int shutdown, int settled, uint64_t now, uint32_t *to,
                    uint64_t *req, int *result)
{
    if (!f->active)
        return done(f, CPS_EINVAL, result);
    int ended = 0;
    if (f->answered) {
        if (f->result != CPS_ENOTFOUND)
            return done(f, f->result, result);
        /* That one shares nothing (another replacement?): ask the next. */
        f->answered = 0;
        f->has_id = 0;
        if (f->empty) {
            f->empties++;
        } else {
            f->plain = 1;
            /* A member that will share answered: the deadline is no longer the awaited
             * replacement's (CPS_ENOPEER) but this pass's (CPS_ETIMEDOUT). */
            f->waited = 0;
        }
        if (!is_member(members, n, f->from)) {
            /* It left the ring (finished, or died) before we moved on: the ring changed under
             * this pass, so begin another over the members there are now. */
            new_pass(f);
            f->from = target(members, n, me, 0);
        } else {
            f->from = target(members, n, me, f->from);
        }
        if (!f->from) {
            if (f->plain)
                return done(f, CPS_ENOTFOUND, result);
            ended = 1;
        }
        f->sent = 0;
        f->req0 = f->req + 1;
    }
    if (shutdown)
        return done(f, CPS_ESHUTDOWN, result);
    if (now >= f->deadline)
        return done(f, f->waited ? CPS_ENOPEER : CPS_ETIMEDOUT, result);
    if (ended)
        return pass_over(f, v, settled, now, result);
    if (f->idle) {
        /* Ask again after a while (a replacement may have come, or fetched), and at once when
         * the word comes: every live member, from the first. */
        if (!settled && now - f->idle_ms < CPS_FETCH_RESEND_MS)
            return CPS_FETCH_WAIT;
        f->idle = 0;
        new_pass(f);
    }
    /* Re-sent after a silence (a part lost with a dead sharer, or the request itself), and at
     * once for the next window of an answer in parts (sent cleared). */
    if (f->sent && now - f->sent_ms < CPS_FETCH_RESEND_MS)
        return CPS_FETCH_WAIT;
    /* The one asked died since (or left the view): a new pass from the first live worker, as
     * when it leaves the ring after refusing; its predecessors' refusals may be stale (one
     * that refused plainly may have finished and left since). */
    const cps__node_info *w = f->from ? cps__view_node(v, f->from) : NULL;
    if (f->from && !(w && w->alive))
        new_pass(f);
    uint32_t t = f->from ? f->from : target(members, n, me, 0);
    if (!t)
        return pass_over(f, v, settled, now, result);
    if (t != f->from) {
        f->has_id = 0; /* another sharer's answer is another answer */
        f->req0 = f->req + 1;
    }
    if (!f->has_id)
        f->have = 0;
    f->ask = f->have;
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
        f->empty = status == CPS_ENOTFOUND && (step & CPS_FETCH_NEVER_HELD);
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

/* What a sharer may answer at all, and whether the result is the shared state's own. */
static int serve_check(uint64_t share_len, uint64_t want, uint64_t share_seq, int has_result,
                       uint64_t result_seq, int *own)
{
    *own = 0;
    if (share_len == 0)
        return CPS_ENOTFOUND;
    if (want != share_len)
        return CPS_ESIZE;
    /* The result that goes with the state: if every member that completed that collective dies
     * before the others got it, the replacement answers their restart with it. */
    *own = has_result && result_seq == share_seq;
    return 0;
}

int cps__fetch_serve(uint64_t share_len, uint64_t want, uint64_t share_seq, int has_result,
                     uint64_t result_seq, uint64_t result_len, int *with_result)
{
    int rc = serve_check(share_len, want, share_seq, has_result, result_seq, with_result);
    /* One message (an asker that predates parts): too large to go along, the result stays, and
     * the replacement asks the ring for it instead (the degraded help case, docs/collective.md). */
    if (rc == 0 && (share_len + result_len) * sizeof(float) > CPS_WIRE_MAX_PAYLOAD)
        *with_result = 0;
    return rc;
}

int cps__fetch_serve_parts(uint64_t share_len, uint64_t want, uint64_t share_seq, int has_result,
                           uint64_t result_seq, uint64_t result_len, uint64_t from_off,
                           uint64_t *total)
{
    int own;
    int rc = serve_check(share_len, want, share_seq, has_result, result_seq, &own);
    if (rc != 0)
        return rc;
    *total = share_len + (own ? result_len : 0);
    return from_off < *total ? 0 : CPS_EINVAL;
}

int cps__fetch_part_at(uint64_t from_off, uint64_t total, uint64_t part_values, uint32_t window,
                       uint32_t k, uint64_t *off, uint64_t *count, int *last)
{
    if (part_values == 0 || k >= window || from_off >= total ||
        k >= (total - from_off + part_values - 1) / part_values)
        return 0;
    *off = from_off + (uint64_t)k * part_values;
    *count = total - *off < part_values ? total - *off : part_values;
    *last = k + 1 == window || *off + *count == total;
    return 1;
}

#define PART_LAST 1u

void cps__fetch_part_encode(void *out, const cps__fetch_part *p)
{
    unsigned char *b = out;
    cps__le64_put(b, p->gen);
    cps__le64_put(b + 8, p->off);
    cps__le64_put(b + 16, p->total);
    cps__le32_put(b + 24, p->last ? PART_LAST : 0);
    cps__le32_put(b + 28, 0);
}

int cps__fetch_part_decode(const void *payload, size_t len, uint64_t step, uint64_t next,
                           cps__fetch_part *p, const float **vals)
{
    const unsigned char *b = payload;
    if (len < CPS_FETCH_PART_HDR || (len - CPS_FETCH_PART_HDR) % sizeof(float) != 0)
        return CPS_EPROTO;
    uint32_t flags = cps__le32_get(b + 24);
    if ((flags & ~PART_LAST) || cps__le32_get(b + 28) != 0)
        return CPS_EPROTO;
    cps__fetch_part q = {.gen = cps__le64_get(b),
                         .step = step,
                         .next = next,
                         .off = cps__le64_get(b + 8),
                         .count = (len - CPS_FETCH_PART_HDR) / sizeof(float),
                         .total = cps__le64_get(b + 16),
                         .last = (flags & PART_LAST) != 0};
    /* An empty part says nothing, and off + count must not wrap. */
    if (q.count == 0 || q.off > q.total || q.count > q.total - q.off)
        return CPS_EPROTO;
    *p = q;
    *vals = (const float *)(b + CPS_FETCH_PART_HDR);
    return 0;
}

void cps__fetch_part_split(uint64_t off, uint64_t count, uint64_t len, uint64_t *nstate,
                           uint64_t *res_off)
{
    uint64_t s_end = off < len && count > len - off ? len : off + count;
    *nstate = off < len ? s_end - off : 0;
    *res_off = *nstate < count ? off + *nstate - len : 0;
}

/* A part of one of the requests sent to `from` since it was chosen. */
static int of_ours(const cps__fetch *f, uint32_t from, uint64_t req_seq)
{
    return f->active && !f->answered && from == f->from && f->from != 0 && req_seq >= f->req0 &&
           req_seq <= f->req;
}

int cps__fetch_part_wanted(const cps__fetch *f, uint32_t from, uint64_t req_seq,
                           const cps__fetch_part *p)
{
    return of_ours(f, from, req_seq) && p->total >= f->len && p->total - f->len < (1ull << 32);
}

int cps__fetch_serve_again(const cps__fetch_served *s, uint32_t to, uint64_t gen, uint64_t from,
                           uint64_t now)
{
    for (uint32_t i = 0; i < CPS_FETCH_SERVED_ASKERS; i++)
        if (s[i].to == to && s[i].to != 0)
            return s[i].gen != gen || from < s[i].from || from >= s[i].end ||
                   now - s[i].at >= CPS_FETCH_SERVING_MS;
    return 1;
}

void cps__fetch_served_note(cps__fetch_served *s, uint32_t to, uint64_t gen, uint64_t from,
                            uint64_t end, uint64_t now)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < CPS_FETCH_SERVED_ASKERS; i++) {
        if (s[i].to == to) {
            k = i;
            break;
        }
        if (s[i].at < s[k].at)
            k = i;
    }
    s[k] = (cps__fetch_served){.to = to, .gen = gen, .from = from, .end = end, .at = now};
}

int cps__fetch_part_take(cps__fetch *f, uint32_t from, uint64_t req_seq, int status,
                         const cps__fetch_part *p, uint64_t now)
{
    if (!of_ours(f, from, req_seq))
        return 0;
    if (status < 0) {
        if (req_seq != f->req)
            return 0; /* the last request's answer decides */
        if (status == CPS_EINVAL && f->ask > 0) {
            /* We resumed past the end of a new, shorter answer: start it over from value 0, and
             * from the next request only: a late part of the dropped answer must not begin
             * another assembly of it. */
            f->has_id = 0;
            f->have = 0;
            f->sent = 0;
            f->req0 = f->req + 1;
            f->waited = 0; /* a sharer answered */
            return 0;
        }
        f->answered = 1;
        f->result = status;
        f->empty = status == CPS_ENOTFOUND && (p->step & CPS_FETCH_NEVER_HELD);
        return 0;
    }
    if (p->total < f->len) {
        f->answered = 1;
        f->result = CPS_ESIZE;
        return 0;
    }
    if (p->total - f->len >= (1ull << 32)) {
        f->answered = 1;
        f->result = CPS_EPROTO;
        return 0;
    }
    if (f->has_id && req_seq < f->id_req &&
        (p->gen != f->gen || p->step != f->step || p->next != f->next || p->total != f->total))
        return 0; /* a late part of the answer we dropped */
    if (f->has_id &&
        (p->gen != f->gen || p->step != f->step || p->next != f->next || p->total != f->total)) {
        /* The sharer shared again since the parts we hold: they are another answer's. Start
         * over; a part from value 0 begins the new answer, any other is asked again. Parts of
         * requests older than this one may be of the dropped answer: they count no more. */
        f->has_id = 0;
        f->have = 0;
        f->req0 = req_seq;
    }
    if (!f->has_id) {
        if (p->off != 0) {
            if (req_seq == f->req)
                f->sent = 0;
            return 0;
        }
        f->has_id = 1;
        f->id_req = req_seq;
        f->gen = p->gen;
        f->step = p->step;
        f->next = p->next;
        f->total = p->total;
    }
    if (p->off != f->have)
        return 0; /* a part already taken (a re-ask crossed it), or after a gap */
    f->have += p->count;
    f->sent_ms = now; /* progress: the re-send waits again */
    f->waited = 0;    /* a sharer answers: its silence from now on is CPS_ETIMEDOUT's */
    if (f->have == f->total) {
        f->answered = 1;
        f->result = 1;
    } else if (p->last && req_seq == f->req) {
        /* This window is complete: ask for the next at once. (The last part of an older
         * request's window says nothing of the window the last request asked for.) */
        f->sent = 0;
    }
    return 1;
}
