/* The replica's ready list (replica.h): how the chain's actions become WRITE, SEND and REPLY
 * items, with the records each update writes, the answers to committed requests, SSP parking and
 * held CHAIN_ACKs. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "chainps/error.h"
#include "core/array.h"
#include "core/log.h"
#include "replication/replica_int.h"

/* ---- memory of one call ---- */

int cps__rp_rlist_push(rlist *l, rmsg *m)
{
    void *v = l->v;
    if (cps__array_reserve(&v, &l->cap, l->n + 1, sizeof *l->v, 16) != 0)
        return CPS_ENOMEM;
    l->v = v;
    l->v[l->n++] = m;
    return 0;
}

void cps__rp_rmsg_free(cps__replica *r, rmsg *m)
{
    if (!m)
        return;
    if (m->m.owner)
        r->env.release(r->env.ctx, m->m.owner);
    free(m->own);
    free(m);
}

/* Done with m: the ready list may still point into it, so it goes at the next call. */
void cps__rp_rmsg_done(cps__replica *r, rmsg *m)
{
    if (!m)
        return;
    if (r->destroying || cps__rp_rlist_push(&r->dispose, m) != 0)
        cps__rp_rmsg_free(r, m);
}

void *cps__rp_scratch(cps__replica *r, size_t n)
{
    void *v = r->scratch;
    if (cps__array_reserve(&v, &r->scratch_cap, r->nscratch + 1, sizeof *r->scratch, 32) != 0)
        return NULL;
    r->scratch = v;
    void *p = malloc(n ? n : 1);
    if (p)
        r->scratch[r->nscratch++] = p;
    return p;
}

void cps__rp_begin(cps__replica *r)
{
    for (size_t i = 0; i < r->nscratch; i++)
        free(r->scratch[i]);
    r->nscratch = 0;
    for (uint32_t i = 0; i < r->dispose.n; i++)
        cps__rp_rmsg_free(r, r->dispose.v[i]);
    r->dispose.n = 0;
    r->nout = 0;
}

/* The replica's clock: never earlier than one an earlier call brought. A shell reads its clock
 * once per loop turn and may stamp the steps of that turn later than the tick that follows;
 * every "now - since" of the parts below (chain re-sends, held acks, sync slots) would wrap
 * and fire at once. */
uint64_t cps__rp_clock(cps__replica *r, uint64_t now)
{
    if (now > r->now_max)
        r->now_max = now;
    return r->now_max;
}

cps__replica_out *cps__rp_emit(cps__replica *r, int kind, uint32_t range)
{
    void *v = r->out;
    if (cps__array_reserve(&v, &r->out_cap, r->nout + 1, sizeof *r->out, 32) != 0)
        return NULL;
    r->out = v;
    cps__replica_out *o = &r->out[r->nout++];
    memset(o, 0, sizeof *o);
    o->kind = kind;
    o->range = range;
    return o;
}

static const char *vtext(cps__replica *r, const char *fmt, va_list ap)
{
    char *t = cps__rp_scratch(r, 256);
    if (t)
        vsnprintf(t, 256, fmt, ap);
    return t ? t : "";
}

void cps__rp_say(cps__replica *r, int level, const char *fmt, ...)
{
    if (level > cps__log_level)
        return; /* not even formatted, as cps__log */
    cps__replica_out *o = cps__rp_emit(r, CPS_RO_LOG, 0);
    if (!o)
        return;
    va_list ap;
    va_start(ap, fmt);
    o->text = vtext(r, fmt, ap);
    va_end(ap);
    o->level = level;
}

void cps__rp_ask_view(cps__replica *r)
{
    cps__rp_emit(r, CPS_RO_ASK_VIEW, 0);
}

/* ---- replies ---- */

void cps__rp_reply_error(cps__replica *r, const cps__msg_hdr *req, int err, const char *fmt, ...)
{
    cps__replica_out *o = cps__rp_emit(r, CPS_RO_REPLY, req->range);
    if (!o)
        return;
    va_list ap;
    va_start(ap, fmt);
    o->text = vtext(r, fmt, ap);
    va_end(ap);
    o->to = req->sender;
    o->status = err;
    o->req = *req;
}

/* An ACK, or with kv the values of kv's keys (VALUES), to `worker`'s request. */
void cps__rp_reply(cps__replica *r, const cps__msg_hdr *req, uint64_t step, const cps__kv *kv,
                   uint64_t aux, uint16_t flags)
{
    if (kv && r->marks_held)
        cps__rp_release_marks(r, UINT32_MAX); /* the values are read when it is performed */
    cps__replica_out *o = cps__rp_emit(r, CPS_RO_REPLY, req->range);
    if (!o)
        return;
    o->to = req->sender;
    o->req = *req;
    o->hdr.type = kv ? CPS_MSG_VALUES : CPS_MSG_ACK;
    o->hdr.flags = (uint16_t)(CPS_WF_REPLY | flags);
    o->hdr.req_worker = req->sender;
    o->hdr.req_seq = req->req_seq;
    o->hdr.range = req->range;
    o->hdr.step = step;
    o->hdr.aux = aux;
    if (kv)
        o->kv = *kv;
}

cps__msg_hdr cps__rp_req_hdr(const cps__chain_req *q, uint32_t range)
{
    cps__msg_hdr h = {.type = q->type,
                      .flags = q->noagg ? CPS_WF_NOAGG : 0,
                      .sender = q->worker,
                      .req_worker = q->worker,
                      .req_seq = q->req_seq,
                      .range = range};
    return h;
}

/* ---- store access for the chain ---- */

static int op_range_seq(void *ctx, uint32_t range, uint64_t *seq)
{
    cps__replica *r = ctx;
    return r->env.range_seq(r->env.ctx, range, seq);
}

static int op_dedup(void *ctx, uint32_t range, uint32_t worker, uint64_t *seq)
{
    cps__replica *r = ctx;
    return r->env.dedup(r->env.ctx, range, worker, seq);
}

/* The key set's last step as the store will hold it once the WRITEs of this call are performed:
 * the replica decides before the shell writes. */
int cps__rp_agg_step_now(cps__replica *r, uint32_t range, uint64_t sig, uint64_t *step)
{
    for (size_t i = r->nout; i-- > 0;) {
        const cps__replica_out *o = &r->out[i];
        if (o->kind == CPS_RO_WRITE && o->range == range && o->upd.sig == sig) {
            *step = o->upd.step;
            return 0;
        }
    }
    *step = 0;
    return r->env.agg_step(r->env.ctx, range, sig, step);
}

static int op_agg_step(void *ctx, uint32_t range, uint64_t sig, uint64_t *step)
{
    return cps__rp_agg_step_now(ctx, range, sig, step);
}

static void op_drop_cookie(void *ctx, void *cookie)
{
    cps__rp_rmsg_done(ctx, cookie);
}

const cps__chain_store_ops cps__rp_chain_ops = {op_range_seq, op_dedup, op_agg_step,
                                                op_drop_cookie};

void cps__rp_drop_cookie(void *ctx, void *cookie)
{
    cps__rp_rmsg_done(ctx, cookie);
}

uint64_t cps__rp_keyset_sig(const cps__kv *kv)
{
    /* As cps__keyset_sig (src/node/msg.c): the keys' hash seeds the lengths'. */
    uint64_t h = XXH3_64bits_withSeed(kv->lens, (size_t)kv->nkeys * 4,
                                      XXH3_64bits(kv->keys, (size_t)kv->nkeys * 8));
    return h ? h : 1;
}

/* ---- SSP clocks and parked pulls (ssp.c decides; this answers) ---- */

typedef struct clock_load {
    cps__replica *r;
    uint32_t range;
} clock_load;

static int load_clock(void *arg, uint32_t id, uint64_t value)
{
    clock_load *l = arg;
    if ((id & (CPS_DEDUP_CLOCK_BIT | CPS_DEDUP_SPARSE_BIT)) == CPS_DEDUP_CLOCK_BIT)
        cps__ssp_pushed(l->r->ssp, &l->r->view, l->range, id & ~CPS_DEDUP_CLOCK_BIT, value);
    return 0;
}

/* Clocks that moved may release parked pulls, as an applied update does (simulator --mode ssp
 * seed 10250: a pull parked before the range was copied again waited for the next update). */
int cps__rp_ssp_load(cps__replica *r, uint32_t range)
{
    if (!r->ssp || r->view.mode != CPS_MODE_SSP)
        return 0;
    cps__ssp_forget_range(r->ssp, range);
    clock_load l = {r, range};
    int rc = r->env.scan_dedup(r->env.ctx, range, load_clock, &l);
    if (cps__ssp_parked(r->ssp))
        cps__rp_wake_parked(r);
    return rc;
}

/* Answer the parked pulls the gate releases. A pull is answered only by the range's tail, with
 * what is committed: one parked while we were the tail may be released after a view made us
 * head or middle (a joiner appended after us), when our store holds updates the tail has not
 * applied, and reading them here would read uncommitted values (simulator, --mode ssp, seed 6).
 * Such a pull is refused with EAGAIN: the worker asks the tail of its view again. */
void cps__rp_wake_parked(cps__replica *r)
{
    void *const *released;
    cps__ssp_wake(r->ssp, &r->view);
    size_t n = cps__ssp_released(r->ssp, &released);
    for (size_t i = 0; i < n; i++) {
        rmsg *p = released[i];
        const cps__msg_hdr *h = &p->m.hdr;
        if (!r->chain || !cps__chain_is_tail(r->chain, h->range) ||
            !cps__chain_can_serve_pull(r->chain, h->range))
            cps__rp_reply_error(r, h, CPS_EAGAIN, "range %u: no longer its tail, or catching up",
                                h->range);
        else
            cps__rp_reply(r, h, h->step, &p->kv, 0, 0);
        cps__rp_rmsg_done(r, p);
    }
}

/* Keep a pull (or the pull half of a push-pull) until the slowest worker catches up. Returns 0
 * (taken), or CPS_ENOMEM with p still the caller's. */
int cps__rp_park_pull(cps__replica *r, rmsg *p, uint64_t clock)
{
    return cps__ssp_park(r->ssp, p->m.hdr.range, p->m.hdr.sender, clock, p);
}

int cps__rp_pull_may_proceed(cps__replica *r, uint32_t range, uint64_t clock, uint32_t worker)
{
    return cps__ssp_may_proceed(r->ssp, &r->view, range, clock, worker);
}

/* ---- push-pull values read from committed updates only ---- */

/* A push-pull's values are read from the store when its reply is performed. Two stores hold
 * more, or less, than is committed:
 *  - the head's holds every update it applied, committed or not: a retried push-pull (or a sync
 *    push-pull of a closed step) answered at the commit point of its own update read the later,
 *    uncommitted ones too, which a head failing next takes away (simulator --push-pull, seed 4).
 *    The head cannot read its store as of an earlier sequence number, so the answer waits until
 *    the commit point reaches what it applied, and admit (replica.c) holds new updates of the
 *    range back meanwhile: else, under a steady flow of pushes, the commit point might trail the
 *    head for ever;
 *  - a tail that joined and has not caught up with what its predecessor acknowledged (its MARK)
 *    answers the push-pulls of the re-sent updates it applies with values older than
 *    acknowledged ones (seed 66): it waits, as its pulls are refused, until it has caught up. */
static int store_readable(cps__replica *r, uint32_t range)
{
    return cps__chain_committed(r->chain, range) >= cps__chain_applied(r->chain, range) &&
           (!cps__chain_is_tail(r->chain, range) || cps__chain_can_serve_pull(r->chain, range));
}

static void answer_values(cps__replica *r, rmsg *p)
{
    const cps__msg_hdr *h = &p->m.hdr;
    if (h->flags & CPS_WF_LATE)
        cps__rp_reply_late(r, h, &p->kv);
    else
        cps__rp_reply(r, h, h->step, &p->kv, 0, 0);
    cps__rp_rmsg_done(r, p);
}

void cps__rp_answer_values(cps__replica *r, rmsg *p)
{
    if (store_readable(r, p->m.hdr.range)) {
        answer_values(r, p);
    } else if (cps__rp_rlist_push(&r->values, p) != 0) {
        /* Its push is applied: a re-send is a duplicate, answered then. */
        cps__rp_reply_error(r, &p->m.hdr, CPS_EAGAIN, "range %u: no memory to wait for commit",
                            p->m.hdr.range);
        cps__rp_rmsg_done(r, p);
    }
}

void cps__rp_wake_values(cps__replica *r)
{
    uint32_t kept = 0;
    for (uint32_t i = 0; i < r->values.n; i++) {
        rmsg *p = r->values.v[i];
        uint32_t range = p->m.hdr.range;
        if (!cps__chain_is_head(r->chain, range) && !cps__chain_is_tail(r->chain, range)) {
            /* A new view took the range (or its end) from us: the worker asks the head of its
             * view, for which its push is a duplicate. */
            cps__rp_reply_error(r, &p->m.hdr, CPS_EAGAIN, "range %u: no longer its head or tail",
                                range);
            cps__rp_rmsg_done(r, p);
        } else if (store_readable(r, range)) {
            answer_values(r, p);
        } else {
            r->values.v[kept++] = p;
        }
    }
    r->values.n = kept;
}

int cps__rp_values_wait(const cps__replica *r, uint32_t range)
{
    for (uint32_t i = 0; i < r->values.n; i++)
        if (r->values.v[i]->m.hdr.range == range)
            return 1;
    return 0;
}

/* SSP: a push-pull's values wait like a pull's. Its push is applied; only the reply waits. */
static int pp_must_wait(cps__replica *r, const cps__chain_req *q, uint32_t range, uint64_t step)
{
    return q->type == CPS_MSG_PUSH_PULL && !cps__rp_pull_may_proceed(r, range, step, q->worker);
}

/* ---- the write set of an update ---- */

/* What an update writes beside its data: each request's exactly-once record and, in SSP mode,
 * the clocks the update moved (moved in memory first, so the store never holds an update without
 * the clocks it implies). */
static void write_update(cps__replica *r, const cps__chain_action *a)
{
    const cps__chain_update *u = &a->upd;
    cps__ssp_applied(r->ssp, &r->view, a->range, u);
    cps__replica_out *o = cps__rp_emit(r, CPS_RO_WRITE, a->range);
    cps__replica_record *recs = cps__rp_scratch(r, 2 * (size_t)u->nreqs * sizeof *recs);
    cps__chain_req *reqs = cps__rp_scratch(r, (size_t)u->nreqs * sizeof *reqs);
    if (!o || !recs || !reqs) {
        if (o)
            o->kind = CPS_RO_LOG, o->level = CPS_LOG_ERROR, o->text = "no memory for a write set";
        return;
    }
    memcpy(reqs, u->reqs, (size_t)u->nreqs * sizeof *reqs);
    o->seq = a->seq;
    o->upd = *u;
    o->upd.reqs = reqs;
    uint32_t n = 0;
    for (uint32_t i = 0; i < u->nreqs; i++) {
        const cps__chain_req *q = &u->reqs[i];
        if (q->type == CPS_MSG_DECLARE || q->type == CPS_MSG_PUT)
            continue;
        uint32_t id = q->noagg ? (q->worker | CPS_DEDUP_SPARSE_BIT) : q->worker;
        /* A SKIP may come late: a retry of a refused push, refused again after the worker's
         * next push was applied. Its record must not move the worker's number back, or a
         * re-sent later push would be applied twice. A push is admitted in sequence, so its
         * number is always the highest. */
        uint64_t have = 0;
        if (u->kind == CPS_UPD_SKIP)
            r->env.dedup(r->env.ctx, a->range, id, &have);
        if (q->req_seq > have)
            recs[n++] = (cps__replica_record){id, q->req_seq};
    }
    for (uint32_t i = 0; r->view.mode == CPS_MODE_SSP && i < u->nreqs; i++) {
        const cps__chain_req *q = &u->reqs[i];
        uint64_t c = cps__ssp_clock(r->ssp, &r->view, a->range, q->worker);
        if (q->type != CPS_MSG_PUT && !q->noagg && c)
            recs[n++] = (cps__replica_record){q->worker | CPS_DEDUP_CLOCK_BIT, c};
    }
    o->recs = recs;
    o->nrecs = n;
}

/* ---- answering a committed request ---- */

/* The step a DECLARE answers with, where a worker joining a running job starts counting. Sync:
 * the last step applied to the key set, so its first push joins the step the others are on.
 * SSP: a replacement's clock in the range (cps__ssp_declared placed it), else 0. Async: 0. */
static uint64_t declare_step(cps__replica *r, uint32_t range, uint32_t worker, const void *body,
                             size_t len)
{
    if (r->view.mode == CPS_MODE_SSP)
        return cps__ssp_declare_step(r->ssp, &r->view, range, worker);
    cps__kv kv;
    const uint64_t *offsets;
    cps__param_spec spec;
    if (!body || cps__wire_declare_decode(body, len, &kv, &offsets, &spec) != 0)
        return 0;
    uint64_t step = 0;
    cps__rp_agg_step_now(r, range, cps__rp_keyset_sig(&kv), &step);
    return step;
}

/* The reply to a late push: counted, logged, and answered as a normal ACK (or the current
 * values, for a push-pull) with CPS_WF_LATE and the step the key set is on, so the worker moves
 * on to the next step rather than fall further behind. */
void cps__rp_reply_late(cps__replica *r, const cps__msg_hdr *h, const cps__kv *kv)
{
    r->ctr.late_gradients++;
    cps__rp_say(
        r, CPS_LOG_DEBUG,
        "range %u: push %llu of node %u for step %llu dropped: the step closed without it (the "
        "key set is at step %llu)",
        h->range, (unsigned long long)h->req_seq, h->sender, (unsigned long long)h->step,
        (unsigned long long)h->aux);
    cps__rp_reply(r, h, h->step, kv, h->aux, CPS_WF_LATE);
    if (r->nout && r->out[r->nout - 1].kind == CPS_RO_REPLY)
        r->out[r->nout - 1].dropped = 1;
}

/* A retry answered once its update is committed: reply from the retried request. */
static void reply_retry(cps__replica *r, const cps__chain_action *a, rmsg *p)
{
    const cps__chain_req *q = &a->req;
    const cps__msg_hdr *h = &p->m.hdr;
    cps__kv kv;
    int have_kv =
        h->type == CPS_MSG_PUSH_PULL && cps__wire_kv_decode(p->m.payload, p->m.len, 1, &kv) == 0;
    if (have_kv) {
        p->kv = kv;
        /* SSP: the values wait for the slowest worker (a late push's do not: it counts for no
         * clock); no memory to wait: answer rather than not at all. */
        if (!(h->flags & CPS_WF_LATE) && pp_must_wait(r, q, a->range, h->step) &&
            cps__rp_park_pull(r, p, h->step) == 0)
            return;
        cps__rp_answer_values(r, p);
        return;
    }
    if (h->flags & CPS_WF_LATE) {
        cps__rp_reply_late(r, h, NULL);
        cps__rp_rmsg_done(r, p);
        return;
    }
    uint64_t aux = q->type == CPS_MSG_DECLARE
                       ? declare_step(r, a->range, q->worker, p->m.payload, p->m.len)
                       : 0;
    cps__rp_reply(r, h, h->step, NULL, aux, 0);
    cps__rp_rmsg_done(r, p);
}

/* A push-pull whose reply waits needs only its keys: a copy of them (no copy of the gradient,
 * which belongs to the chain), in a message as the request came in. NULL: no memory. */
static rmsg *keys_copy(const cps__chain_req *q, uint32_t range, uint64_t step, const cps__kv *kv)
{
    rmsg *p = calloc(1, sizeof *p);
    size_t len = cps__wire_kv_size(kv->nkeys, 0);
    void *buf = p ? malloc(len) : NULL;
    if (!buf || !cps__wire_kv_encode(buf, len, kv->nkeys, kv->keys, kv->lens, NULL, 0) ||
        cps__wire_kv_decode(buf, len, 0, &p->kv) != 0) {
        free(buf);
        free(p);
        return NULL;
    }
    p->own = buf;
    p->m.payload = buf;
    p->m.len = len;
    p->m.hdr = cps__rp_req_hdr(q, range);
    p->m.hdr.step = step;
    return p;
}

static void do_reply(cps__replica *r, const cps__chain_action *a)
{
    const cps__chain_req *q = &a->req;
    rmsg *p = a->cookie;
    if (q->type == CPS_MSG_PUT) {
        cps__rp_rmsg_done(r, p);
        return; /* the restore tool is no member: it polls the tail's sequence number */
    }
    /* A refusal, committed (see on_push): a SKIP update carries its error, a retry of the
     * refused push carries it in its copy. */
    int refused = 0;
    if (p)
        refused = p->refused;
    else if (a->upd.kind == CPS_UPD_SKIP)
        refused = a->upd.body_len == 8 ? (int)(int64_t)cps__le64_get(a->upd.body) : CPS_EINVAL;
    if (refused < 0) {
        cps__msg_hdr h = cps__rp_req_hdr(q, a->range);
        cps__rp_reply_error(r, &h, refused, "push refused by the head of range %u", a->range);
        cps__rp_rmsg_done(r, p);
        return;
    }
    if (p) {
        reply_retry(r, a, p);
        return;
    }
    cps__kv kv;
    int have_kv = q->type == CPS_MSG_PUSH_PULL && a->upd.kind == CPS_UPD_PUSH && a->upd.body &&
                  cps__wire_kv_decode(a->upd.body, a->upd.body_len, 1, &kv) == 0;
    uint64_t aux = q->type == CPS_MSG_DECLARE && a->upd.kind == CPS_UPD_DECLARE
                       ? declare_step(r, a->range, q->worker, a->upd.body, a->upd.body_len)
                       : 0;
    int ssp = have_kv && pp_must_wait(r, q, a->range, a->upd.step);
    if (ssp || (have_kv && !store_readable(r, a->range))) {
        rmsg *k = keys_copy(q, a->range, a->upd.step, &kv);
        if (k && !ssp) {
            cps__rp_answer_values(r, k);
            return;
        }
        if (k && cps__rp_park_pull(r, k, a->upd.step) == 0)
            return;
        cps__rp_rmsg_free(r, k);
        /* No memory to wait: answer now rather than not at all (staleness over a hang). */
    }
    cps__msg_hdr rq = cps__rp_req_hdr(q, a->range);
    cps__rp_reply(r, &rq, a->upd.step, have_kv ? &kv : NULL, aux, 0);
}

/* ---- held CHAIN_ACKs (ackhold.c decides when) ---- */

static void send_released_acks(cps__replica *r)
{
    const cps__ackhold_send *out;
    size_t n = cps__ackhold_sends(r->acks, &out);
    for (size_t i = 0; i < n; i++) {
        cps__replica_out *o = cps__rp_emit(r, CPS_RO_SEND, out[i].hdr.range);
        if (o) {
            o->to = out[i].to;
            o->hdr = out[i].hdr;
            r->ctr.chain_sends++;
        }
    }
}

/* Hold the CHAIN_ACK `h` to node `to`; 1 if held, 0 if it must go now. */
static int hold_ack(cps__replica *r, uint32_t to, const cps__msg_hdr *h, uint64_t now)
{
    if (!r->acks && cps__ackhold_create(&r->acks) != 0)
        return 0;
    int held = cps__ackhold_offer(r->acks, r->view.nranges, to, h, now);
    send_released_acks(r);
    return held;
}

void cps__rp_flush_acks(cps__replica *r, uint64_t now, int force)
{
    if (!cps__ackhold_held(r->acks))
        return;
    cps__ackhold_due(r->acks, now, force);
    send_released_acks(r);
}

/* ---- held CHAIN_MARK(APPLIED)s: one per range per loop turn ---- */

/* Forward before apply costs a header-only MARK per update and hop; the successor only needs
 * the last of a turn (a MARK of seq N lets it apply every held FWD up to N). Held, the MARK is
 * a message the network delays: the successor holds the FWDs a little longer, and a server
 * that stops first leaves them unapplied, as when it stops before the MARK is sent.
 * It waits only for updates of its own range, which would replace it: another range's write or
 * a reply with values (a store read) goes after it (cps__rp_release_marks). Held to the end of
 * the turn, the MARK of a sync step waited there for the other range's write and the pulls
 * (2 workers, 2 servers, 1 MB over tcp: 50-200 us more from FWD to MARK than to the end of the
 * write, on the step's critical path; the successor waits for it to apply). */
struct held_mark {
    int used;
    uint32_t to;
    cps__msg_hdr hdr;
};

static void release_mark(cps__replica *r, struct held_mark *m)
{
    cps__replica_out *o = cps__rp_emit(r, CPS_RO_SEND, m->hdr.range);
    if (o) {
        o->to = m->to;
        o->hdr = m->hdr;
        r->ctr.chain_sends++;
        r->ctr.marks_sent++;
    }
    m->used = 0;
    r->marks_held--;
}

void cps__rp_flush_marks(cps__replica *r)
{
    cps__rp_release_marks(r, UINT32_MAX);
}

void cps__rp_release_marks(cps__replica *r, uint32_t keep)
{
    for (uint32_t k = 0; k < r->nmarks && r->marks_held; k++)
        if (r->marks[k].used && k != keep)
            release_mark(r, &r->marks[k]);
}

/* Hold the CHAIN_MARK(APPLIED) `h` to node `to`; 1 if held, 0 if it must go now. */
static int hold_mark(cps__replica *r, uint32_t to, const cps__msg_hdr *h)
{
    if (h->payload_len != 0 || h->range >= r->view.nranges)
        return 0;
    if (r->nmarks != r->view.nranges) {
        struct held_mark *v = calloc(r->view.nranges, sizeof *v);
        if (!v)
            return 0;
        cps__rp_flush_marks(r);
        free(r->marks);
        r->marks = v;
        r->nmarks = r->view.nranges;
    }
    struct held_mark *m = &r->marks[h->range];
    if (m->used && m->to == to && m->hdr.epoch == h->epoch && m->hdr.req_seq <= h->req_seq) {
        r->ctr.marks_merged++;
        m->hdr = *h;
        return 1;
    }
    if (m->used)
        release_mark(r, m); /* another link or epoch: it says something of its own */
    *m = (struct held_mark){1, to, *h};
    r->marks_held++;
    return 1;
}

/* ---- the chain's actions become the ready list ---- */

void cps__rp_run_chain(cps__replica *r, uint64_t now)
{
    const cps__chain_action *acts;
    size_t n = cps__chain_actions(r->chain, &acts);
    int applied = 0;
    /* Before the FWD and write of another range's update, the MARKs held for other ranges: one
     * scan of the marks. A range's own MARK stays held only when every APPLY is of that range
     * (its APPLY's MARK will replace it); with APPLYs of two ranges, each one's is another's. */
    if (r->marks_held) {
        uint32_t keep = UINT32_MAX;
        int any = 0;
        for (size_t i = 0; i < n; i++) {
            if (acts[i].kind != CPS_CA_APPLY)
                continue;
            if (!any)
                keep = acts[i].range;
            else if (acts[i].range != keep)
                keep = UINT32_MAX;
            any = 1;
        }
        if (any)
            cps__rp_release_marks(r, keep);
    }
    for (size_t i = 0; i < n; i++) {
        const cps__chain_action *a = &acts[i];
        if (a->kind == CPS_CA_APPLY) {
            write_update(r, a);
            applied = 1;
        } else if (a->kind == CPS_CA_REPLY) {
            do_reply(r, a);
        } else if (a->kind == CPS_CA_SEND) {
            cps__msg_hdr h;
            if (cps__wire_hdr_decode(a->msg, a->len, &h) != 0)
                continue;
            if (h.type == CPS_MSG_CHAIN_ACK && hold_ack(r, a->to, &h, now))
                continue;
            if (h.type == CPS_MSG_CHAIN_MARK && (h.aux & CPS_CHAIN_MARK_APPLIED) &&
                hold_mark(r, a->to, &h))
                continue;
            /* The item first: a buffer that has one is the shell's (a transport may have reserved
             * it in a ring that must get it back), so none is made without one. */
            cps__replica_out *o = cps__rp_emit(r, CPS_RO_SEND, a->range);
            void *buf = o ? r->env.msg_alloc(r->env.ctx, a->to, a->len) : NULL;
            if (!buf) {
                if (o)
                    r->nout--; /* the last item, just made */
                cps__rp_say(r, CPS_LOG_DEBUG, "chain message to node %u not sent: no memory",
                            a->to);
                continue; /* the chain re-sends it */
            }
            memcpy(buf, a->msg, a->len);
            o->to = a->to;
            o->msg = buf;
            o->len = a->len;
            o->hdr = h;
            o->resend = r->in_tick;
            r->ctr.chain_sends++;
        }
    }
    if (applied && cps__ssp_parked(r->ssp))
        cps__rp_wake_parked(r);
    if (r->values.n)
        cps__rp_wake_values(r);
}

void cps__rp_submit(cps__replica *r, uint32_t range, const cps__chain_update *u, uint64_t now)
{
    int rc = cps__chain_submit(r->chain, range, u, now);
    if (rc != 0) {
        cps__rp_say(r, CPS_LOG_ERROR, "range %u: submit failed: %s", range, cps_strerror(rc));
        return;
    }
    cps__rp_run_chain(r, now);
}
