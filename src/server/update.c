/* The server's data path: the I/O side of chain replication.
 *
 * A worker's declare or push arrives at the head of its range. It is validated against the
 * store, then the chain state machine (replication/chain.c) decides whether it is new, a retry
 * of something applied, or out of order. New async pushes are submitted at once; sync pushes
 * wait until every live worker's gradient for the step is here and are summed in rank order,
 * then submitted as one update. The state machine answers with actions that this file performs
 * in order: APPLY (one LMDB transaction with the values, the range's sequence number and the
 * exactly-once records), SEND (FWD / CHAIN_ACK to a neighbour), REPLY (ACK or values to a
 * worker). Pulls are served by the tail; in SSP mode they wait for the slowest worker. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chainps/error.h"
#include "core/gradcodec.h"
#include "core/log.h"
#include "optim/optim.h"
#include "entries.h"
#include "server.h"

/* ---- store access for the state machine ---- */

static void agg_meta_name(char *buf, size_t len, uint32_t range, uint64_t sig)
{
    snprintf(buf, len, "agg/%" PRIu32 "/%016" PRIx64, range, sig);
}

typedef struct meta_read {
    uint32_t range, worker;
    uint64_t sig;
    uint64_t value;
} meta_read;

static int read_range_seq(cps__txn *txn, void *arg)
{
    meta_read *m = arg;
    cps__range_meta rm;
    int rc = cps__store_range_get(txn, m->range, &rm);
    m->value = rc == 0 ? rm.seq : 0;
    return rc;
}

static int read_dedup(cps__txn *txn, void *arg)
{
    meta_read *m = arg;
    return cps__store_dedup_get(txn, m->range, m->worker, &m->value);
}

static int read_agg(cps__txn *txn, void *arg)
{
    meta_read *m = arg;
    char name[64];
    unsigned char b[8];
    size_t len = sizeof b;
    agg_meta_name(name, sizeof name, m->range, m->sig);
    int rc = cps__store_meta_get(txn, name, b, &len);
    m->value = (rc == 0 && len == 8) ? cps__le64_get(b) : 0;
    return rc == CPS_ENOTFOUND ? 0 : rc;
}

static int op_range_seq(void *ctx, uint32_t range, uint64_t *seq)
{
    meta_read m = {.range = range};
    int rc = cps__store_read(((cps__server *)ctx)->store, read_range_seq, &m);
    *seq = m.value;
    return rc;
}

static int op_dedup(void *ctx, uint32_t range, uint32_t worker, uint64_t *seq)
{
    meta_read m = {.range = range, .worker = worker};
    int rc = cps__store_read(((cps__server *)ctx)->store, read_dedup, &m);
    *seq = m.value;
    return rc;
}

static int op_agg_step(void *ctx, uint32_t range, uint64_t sig, uint64_t *step)
{
    meta_read m = {.range = range, .sig = sig};
    int rc = cps__store_read(((cps__server *)ctx)->store, read_agg, &m);
    *step = m.value;
    return rc;
}

static void op_drop_cookie(void *ctx, void *cookie)
{
    (void)ctx;
    cps__rx_free(cookie);
    free(cookie);
}

static const cps__chain_store_ops chain_store_ops = {op_range_seq, op_dedup, op_agg_step,
                                                     op_drop_cookie};

static void parked_pull_free(void *ctx, void *cookie);

typedef struct clock_load {
    cps__server *s;
    uint32_t range;
} clock_load;

static int load_clock(void *arg, uint32_t id, uint64_t value)
{
    clock_load *l = arg;
    if ((id & (CPS_DEDUP_CLOCK_BIT | CPS_DEDUP_SPARSE_BIT)) == CPS_DEDUP_CLOCK_BIT)
        cps__ssp_pushed(l->s->ssp, &l->s->view, l->range, id & ~CPS_DEDUP_CLOCK_BIT, value);
    return 0;
}

static int load_clocks(cps__txn *txn, void *arg)
{
    return cps__store_dedup_scan(txn, ((clock_load *)arg)->range, load_clock, arg);
}

static void wake_parked(cps__server *s);

/* Clocks that moved may release parked pulls, as an applied update does (simulator --mode ssp
 * seed 10250: a pull parked before the range was copied again waited for the next update). */
int cps__server_ssp_load(cps__server *s, uint32_t range)
{
    if (!s->ssp || s->view.mode != CPS_MODE_SSP)
        return 0;
    cps__ssp_forget_range(s->ssp, range);
    clock_load l = {s, range};
    int rc = cps__store_read(s->store, load_clocks, &l);
    if (cps__ssp_parked(s->ssp))
        wake_parked(s);
    return rc;
}

/* Created once our node id is known (at the first view), with the SSP gate of its ranges, whose
 * clocks start where the store has them (a restarted server holds the pushes it applied). */
int cps__server_chain_init(cps__server *s)
{
    cps__chain_config cc = {.self = s->id, .resend_ms = 200, .max_unacked = 1024};
    int rc = s->ssp ? 0 : cps__ssp_create(parked_pull_free, NULL, &s->ssp);
    for (uint32_t r = 0; rc == 0 && r < s->view.nranges; r++)
        rc = cps__server_ssp_load(s, r);
    return rc ? rc : cps__chain_create(&cc, &chain_store_ops, s, &s->chain);
}

/* ---- replies ---- */

typedef struct read_io {
    const cps__kv *kv;
    float *out;
} read_io;

static int read_values(cps__txn *txn, void *arg)
{
    read_io *r = arg;
    float *p = r->out;
    for (uint32_t i = 0; i < r->kv->nkeys; i++) {
        int rc = cps__store_param_read(txn, r->kv->keys[i], p, r->kv->lens[i]);
        if (rc != 0)
            return rc;
        p += r->kv->lens[i];
    }
    return 0;
}

static void reply_header(cps__server *s, cps__msg_hdr *h, uint8_t type, uint32_t worker,
                         uint64_t req_seq, uint32_t range, uint64_t step)
{
    memset(h, 0, sizeof *h);
    h->type = type;
    h->flags = CPS_WF_REPLY;
    h->sender = s->id;
    h->epoch = s->view.epoch;
    h->req_worker = worker;
    h->req_seq = req_seq;
    h->range = range;
    h->step = step;
}

/* Send `worker` the current values of kv's keys as the reply to its request. */
static void reply_values(cps__server *s, const cps__msg_hdr *rh, const cps__kv *kv)
{
    uint64_t nvals = 0;
    for (uint32_t i = 0; i < kv->nkeys; i++)
        nvals += kv->lens[i];
    size_t len = cps__wire_kv_size(kv->nkeys, nvals);
    cps__msg_hdr h = *rh;
    /* rh is our reply, sent by us: an error goes to the worker it was for. */
    cps__msg_hdr req = *rh;
    req.sender = rh->req_worker;
    void *buf = cps__msg_alloc(&h, len);
    if (!buf) {
        cps__server_reply_error(s, &req, CPS_ENOMEM, "no memory for a %zu-byte reply", len);
        return;
    }
    char *payload = (char *)buf + CPS_WIRE_HDR_SIZE;
    /* Keys and lens first; the values are read from LMDB straight into the message. */
    cps__wire_kv_encode(payload, len, kv->nkeys, kv->keys, kv->lens, NULL, 0);
    cps__le32_put(payload + 4, (uint32_t)nvals);
    read_io r = {kv, (float *)(void *)(payload + cps__wire_kv_size(kv->nkeys, 0))};
    int rc = cps__store_read(s->store, read_values, &r);
    if (rc != 0) {
        cps__tp_free(buf);
        cps__server_reply_error(s, &req, rc, "reading %u keys failed", kv->nkeys);
        return;
    }
    s->stats.pull_bytes += nvals * 4;
    rc = cps__tp_send(s->tp, rh->req_worker, buf, CPS_WIRE_HDR_SIZE + len);
    if (rc != 0) {
        cps__tp_free(buf);
        cps__log(CPS_LOG_WARN, "server", "reply to node %u failed: %s", rh->req_worker,
                 cps_strerror(rc));
    }
}

/* Answer one request: ACK (with `aux`), or the values of `kv` for a push-pull. */
static void reply_request_aux(cps__server *s, uint8_t type, uint32_t worker, uint64_t req_seq,
                              uint32_t range, uint64_t step, const cps__kv *kv, uint64_t aux)
{
    cps__msg_hdr h;
    if (type == CPS_MSG_PUSH_PULL && kv) {
        reply_header(s, &h, CPS_MSG_VALUES, worker, req_seq, range, step);
        reply_values(s, &h, kv);
        return;
    }
    reply_header(s, &h, CPS_MSG_ACK, worker, req_seq, range, step);
    h.aux = aux;
    int rc = cps__msg_send(s->tp, worker, &h, NULL, 0);
    if (rc != 0)
        cps__log(CPS_LOG_WARN, "server", "ack to node %u failed: %s", worker, cps_strerror(rc));
}

/* ---- SSP clocks and parked pulls (replication/ssp.c decides; this answers) ---- */

/* A pull waiting for the slowest worker, as the gate holds it: the received message. */
typedef struct parked_pull {
    cps__rx rx;
    cps__kv kv;
} parked_pull;

static void parked_pull_free(void *ctx, void *cookie)
{
    (void)ctx;
    parked_pull *p = cookie;
    cps__rx_free(&p->rx);
    free(p);
}

static int pull_may_proceed(cps__server *s, uint32_t range, uint64_t clock, uint32_t worker)
{
    return cps__ssp_may_proceed(s->ssp, &s->view, range, clock, worker);
}

static uint64_t keyset_sig(const cps__kv *kv);

/* The step a DECLARE answers with, where a worker joining a running job starts counting. Sync:
 * the last step applied to the key set, so its first push joins the step the others are on.
 * SSP: a replacement's clock in the range (cps__ssp_declared placed it), else 0. Async: 0. */
static uint64_t declare_step(cps__server *s, uint32_t range, uint32_t worker, const void *body,
                             size_t len)
{
    if (s->view.mode == CPS_MODE_SSP)
        return cps__ssp_declare_step(s->ssp, &s->view, range, worker);
    cps__kv kv;
    const uint64_t *offsets;
    cps__param_spec spec;
    if (!body || cps__wire_declare_decode(body, len, &kv, &offsets, &spec) != 0)
        return 0;
    uint64_t step = 0;
    op_agg_step(s, range, keyset_sig(&kv), &step);
    return step;
}

/* Answer the parked pulls the gate releases. A pull is answered only by the range's tail, with
 * what is committed: one parked while we were the tail may be released after a view made us
 * head or middle (a joiner appended after us), when our store holds updates the tail has not
 * applied, and reading them here would read uncommitted values (simulator, --mode ssp, seed 6).
 * Such a pull is refused with EAGAIN: the worker asks the tail of its view again. */
static void wake_parked(cps__server *s)
{
    void *const *released;
    cps__ssp_wake(s->ssp, &s->view);
    size_t n = cps__ssp_released(s->ssp, &released);
    for (size_t i = 0; i < n; i++) {
        parked_pull *p = released[i];
        uint32_t r = p->rx.hdr.range;
        if (!s->chain || !cps__chain_is_tail(s->chain, r) ||
            !cps__chain_can_serve_pull(s->chain, r)) {
            cps__server_reply_error(s, &p->rx.hdr, CPS_EAGAIN,
                                    "range %u: no longer its tail, or catching up", r);
            parked_pull_free(NULL, p);
            continue;
        }
        cps__msg_hdr h;
        reply_header(s, &h, CPS_MSG_VALUES, p->rx.hdr.sender, p->rx.hdr.req_seq, p->rx.hdr.range,
                     p->rx.hdr.step);
        reply_values(s, &h, &p->kv);
        parked_pull_free(NULL, p);
    }
}

/* Keep a pull (or the pull half of a push-pull) until the slowest worker catches up; takes rx.
 * Returns 0, or CPS_ENOMEM with rx still the caller's. */
static int park_pull(cps__server *s, cps__rx *rx, const cps__kv *kv, uint64_t clock)
{
    parked_pull *p = malloc(sizeof *p);
    if (!p)
        return CPS_ENOMEM;
    *p = (parked_pull){*rx, *kv};
    int rc = cps__ssp_park(s->ssp, rx->hdr.range, rx->hdr.sender, clock, p);
    if (rc != 0)
        free(p);
    return rc;
}

/* SSP: a push-pull's values wait like a pull's. Its push is applied; only the reply waits. */
static int pp_must_wait(cps__server *s, const cps__chain_req *q, uint32_t range, uint64_t step)
{
    return q->type == CPS_MSG_PUSH_PULL && !pull_may_proceed(s, range, step, q->worker);
}

/* ---- performing the state machine's actions ---- */

typedef struct apply_io {
    cps__server *server;
    const cps__chain_action *a;
    uint64_t bad_key;
} apply_io;

static int apply_txn(cps__txn *txn, void *arg)
{
    apply_io *io = arg;
    const cps__chain_action *a = io->a;
    const cps__chain_update *u = &a->upd;
    cps__kv kv;
    int rc = 0; /* CPS_UPD_SKIP: nothing but the records below */
    if (u->kind == CPS_UPD_DECLARE) {
        const uint64_t *offsets;
        cps__param_spec spec;
        rc = cps__wire_declare_decode(u->body, u->body_len, &kv, &offsets, &spec);
        for (uint32_t i = 0; rc == 0 && i < kv.nkeys; i++) {
            rc = cps__store_param_create(txn, kv.keys[i], kv.lens[i], offsets[i], &spec);
            if (rc == CPS_EEXIST)
                rc = 0; /* the head checked; a conflicting re-declare leaves the first */
            if (rc != 0)
                io->bad_key = kv.keys[i];
        }
    } else if (u->kind == CPS_UPD_PUT) {
        rc = cps__server_install_entries(txn, io->server, a->range, u->body, u->body_len, 0, NULL);
    } else if (u->kind == CPS_UPD_PUSH) {
        rc = cps__wire_kv_decode(u->body, u->body_len, 1, &kv);
        const float *g = kv.vals;
        for (uint32_t i = 0; rc == 0 && i < kv.nkeys; i++) {
            rc = cps__store_param_apply(txn, kv.keys[i], g, kv.lens[i]);
            if (rc != 0)
                io->bad_key = kv.keys[i];
            g += kv.lens[i];
        }
    }
    if (rc != 0)
        return rc;
    cps__range_meta m;
    if ((rc = cps__store_range_get(txn, a->range, &m)) != 0)
        return rc;
    m.seq = a->seq;
    if (u->step > m.step)
        m.step = u->step;
    rc = cps__store_range_put(txn, a->range, &m);
    for (uint32_t i = 0; rc == 0 && i < u->nreqs; i++) {
        const cps__chain_req *q = &u->reqs[i];
        if (q->type == CPS_MSG_DECLARE || q->type == CPS_MSG_PUT)
            continue;
        uint32_t id = q->noagg ? (q->worker | CPS_DEDUP_SPARSE_BIT) : q->worker;
        /* A SKIP may come late: a retry of a refused push, refused again after the worker's
         * next push was applied. Its record must not move the worker's number back, or a
         * re-sent later push would be applied twice. A push is admitted in sequence, so its
         * number is always the highest. */
        uint64_t have = 0;
        if (u->kind == CPS_UPD_SKIP && (rc = cps__store_dedup_get(txn, a->range, id, &have)) != 0)
            break;
        if (q->req_seq > have)
            rc = cps__store_dedup_put(txn, a->range, id, q->req_seq);
    }
    /* SSP: the clocks this update moved (do_apply moved them in memory first), in its own
     * transaction, so the store never holds an update without the clocks it implies. */
    for (uint32_t i = 0; rc == 0 && io->server->view.mode == CPS_MODE_SSP && i < u->nreqs; i++) {
        const cps__chain_req *q = &u->reqs[i];
        uint64_t c = cps__ssp_clock(io->server->ssp, &io->server->view, a->range, q->worker);
        if (q->type != CPS_MSG_PUT && !q->noagg && c)
            rc = cps__store_dedup_put(txn, a->range, q->worker | CPS_DEDUP_CLOCK_BIT, c);
    }
    if (rc == 0 && u->sig) {
        char name[64];
        unsigned char b[8];
        agg_meta_name(name, sizeof name, a->range, u->sig);
        cps__le64_put(b, u->step);
        rc = cps__store_meta_put(txn, name, b, sizeof b);
    }
    return rc;
}

/* Copies of a record the map must hold: every push rewrites a record whole (copy-on-write), and
 * LMDB reuses the pages a commit frees only two commits later (the other meta page still
 * points at them): the live copy and the two before it. */
#define COW_COPIES 3

/* A declare's records go in at once: grow the map to hold them (and the copies the pushes that
 * follow will make) before the write, rather than have the write hit MAP_FULL and initialise
 * every value again after each doubling (17-37 s for 100 M parameters). Should the growth fail,
 * the write finds out for itself (and reports the full disk). */
typedef struct declare_need {
    cps__kv kv;
    cps__param_spec spec;
    uint64_t bytes;
} declare_need;

/* Only the keys not there yet: every worker declares the same tensors, and only the first
 * declare creates them. */
static int declare_need_txn(cps__txn *txn, void *arg)
{
    declare_need *d = arg;
    for (uint32_t i = 0; i < d->kv.nkeys; i++) {
        cps__param_rec rec;
        if (cps__store_param_get(txn, d->kv.keys[i], &rec) == CPS_ENOTFOUND)
            d->bytes += cps__store_create_bytes(d->kv.lens[i], d->spec.opt_kind);
    }
    return 0;
}

static void reserve_declare(cps__server *s, const cps__chain_update *u)
{
    declare_need d = {0};
    const uint64_t *offsets;
    if (cps__wire_declare_decode(u->body, u->body_len, &d.kv, &offsets, &d.spec) != 0 ||
        cps__store_read(s->store, declare_need_txn, &d) != 0 || d.bytes == 0)
        return;
    uint64_t bytes = d.bytes;
    int rc = cps__store_reserve(s->store, bytes * COW_COPIES);
    if (rc != 0)
        cps__log(CPS_LOG_WARN, "server", "cannot grow the store for a declare of %.1f MB: %s",
                 bytes / 1e6, cps_strerror(rc));
}

static void do_apply(cps__server *s, const cps__chain_action *a)
{
    apply_io io = {s, a, 0};
    if (a->upd.kind == CPS_UPD_DECLARE)
        reserve_declare(s, &a->upd);
    /* Clocks first: apply_txn stores what they became. Should the write fail, the replica
     * leaves (poisoned below), so memory ahead of the store is never used. */
    cps__ssp_applied(s->ssp, &s->view, a->range, &a->upd);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = cps__store_write(s->store, apply_txn, &io);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    cps__prom_hist_observe(&s->ctr.apply,
                           (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
    if (rc != 0) {
        /* The chain has already counted this update as applied here: we cannot go on. */
        cps__log(CPS_LOG_ERROR, "server",
                 "range %u: applying update %llu failed at key "
                 "%016" PRIx64 ": %s",
                 a->range, (unsigned long long)a->seq, io.bad_key, cps_strerror(rc));
        /* Nothing of this update was committed (CPS_ENOSPC aborts the txn), but the chain
         * counts it as applied here and our successors and the worker's ack wait on it: the
         * replica leaves, and poisoned stops every later action (no forward, no ack). */
        s->poisoned = 1;
        s->disk_full = rc == CPS_ENOSPC;
        return;
    }
    s->stats.updates_applied++;
    if (a->upd.step > s->stats.step)
        s->stats.step = a->upd.step;
    if (s->cuts && s->after_apply)
        s->after_apply(s, a->range);
}

static void reply_late(cps__server *s, const cps__chain_action *a, cps__rx *rx, const cps__kv *kv);
static void send_late(cps__server *s, uint32_t worker, uint64_t req_seq, uint32_t range,
                      uint64_t step, uint64_t closed, const cps__kv *kv);

static void do_reply(cps__server *s, const cps__chain_action *a)
{
    const cps__chain_req *q = &a->req;
    if (q->type == CPS_MSG_PUT)
        return; /* the restore tool is no member: it polls the tail's sequence number */
    /* A refusal, committed (see cps__server_on_push): a SKIP update carries its error, a retry
     * of the refused push carries it in its copy's status. */
    int refused = 0;
    if (a->cookie)
        refused = ((cps__rx *)a->cookie)->hdr.status;
    else if (a->upd.kind == CPS_UPD_SKIP)
        refused = a->upd.body_len == 8 ? (int)(int64_t)cps__le64_get(a->upd.body) : CPS_EINVAL;
    if (refused < 0) {
        cps__msg_hdr h = {.type = q->type,
                          .sender = q->worker,
                          .req_worker = q->worker,
                          .req_seq = q->req_seq,
                          .range = a->range};
        cps__server_reply_error(s, &h, refused, "push refused by the head of range %u", a->range);
        if (a->cookie) {
            cps__rx_free(a->cookie);
            free(a->cookie);
        }
        return;
    }
    if (a->cookie) {
        /* A retry answered once its update is committed: reply from the retried request. */
        cps__rx *rx = a->cookie;
        cps__kv kv;
        int have_kv = rx->hdr.type == CPS_MSG_PUSH_PULL &&
                      cps__wire_kv_decode(rx->payload, rx->len, 1, &kv) == 0;
        if (rx->hdr.flags & CPS_WF_LATE) {
            reply_late(s, a, rx, have_kv ? &kv : NULL);
            cps__rx_free(rx);
            free(rx);
            return;
        }
        uint64_t aux = q->type == CPS_MSG_DECLARE
                           ? declare_step(s, a->range, q->worker, rx->payload, rx->len)
                           : 0;
        if (have_kv && pp_must_wait(s, q, a->range, rx->hdr.step) &&
            park_pull(s, rx, &kv, rx->hdr.step) == 0) {
            free(rx); /* its buffers now belong to the parked pull */
            return;
        }
        reply_request_aux(s, q->type, q->worker, q->req_seq, a->range, rx->hdr.step,
                          have_kv ? &kv : NULL, aux);
        cps__rx_free(rx);
        free(rx);
        return;
    }
    cps__kv kv;
    int have_kv = q->type == CPS_MSG_PUSH_PULL && a->upd.kind == CPS_UPD_PUSH && a->upd.body &&
                  cps__wire_kv_decode(a->upd.body, a->upd.body_len, 1, &kv) == 0;
    uint64_t aux = q->type == CPS_MSG_DECLARE && a->upd.kind == CPS_UPD_DECLARE
                       ? declare_step(s, a->range, q->worker, a->upd.body, a->upd.body_len)
                       : 0;
    if (have_kv && pp_must_wait(s, q, a->range, a->upd.step)) {
        /* The update's body belongs to the chain, and the reply needs only its keys: park a
         * pull's payload of them (no copy of the gradient). */
        cps__rx rx = {.len = cps__wire_kv_size(kv.nkeys, 0)};
        rx.owned = malloc(rx.len);
        cps__kv kept;
        if (rx.owned &&
            cps__wire_kv_encode(rx.owned, rx.len, kv.nkeys, kv.keys, kv.lens, NULL, 0) &&
            cps__wire_kv_decode(rx.owned, rx.len, 0, &kept) == 0) {
            rx.payload = rx.owned;
            /* As the request came in: wake_parked answers hdr.sender. */
            rx.hdr.type = CPS_MSG_PUSH_PULL;
            rx.hdr.sender = q->worker;
            rx.hdr.req_seq = q->req_seq;
            rx.hdr.range = a->range;
            rx.hdr.step = a->upd.step;
            if (park_pull(s, &rx, &kept, a->upd.step) == 0)
                return;
        }
        cps__rx_free(&rx);
        /* No memory to wait: answer now rather than not at all (staleness over a hang). */
    }
    reply_request_aux(s, q->type, q->worker, q->req_seq, a->range, a->upd.step,
                      have_kv ? &kv : NULL, aux);
}

/* ---- held CHAIN_ACKs (replication/ackhold.c decides when; this sends) ---- */

static void send_released_acks(cps__server *s)
{
    const cps__ackhold_send *out;
    size_t n = cps__ackhold_sends(s->acks, &out);
    for (size_t i = 0; i < n; i++) {
        cps__msg_hdr h = out[i].hdr; /* cps__msg_send fills in the header */
        int rc = cps__msg_send(s->tp, out[i].to, &h, NULL, 0);
        if (rc != 0)
            cps__log(CPS_LOG_DEBUG, "server", "chain ack to node %u not sent: %s", out[i].to,
                     cps_strerror(rc));
    }
}

/* Hold the CHAIN_ACK `h` to node `to`; 1 if held, 0 if the caller must send it now. */
static int hold_ack(cps__server *s, uint32_t to, const cps__msg_hdr *h)
{
    if (!s->acks && cps__ackhold_create(&s->acks) != 0)
        return 0;
    int held = cps__ackhold_offer(s->acks, s->view.nranges, to, h, cps__now_ms());
    send_released_acks(s);
    return held;
}

void cps__server_flush_acks(cps__server *s, uint64_t now, int force)
{
    if (!cps__ackhold_held(s->acks))
        return;
    cps__ackhold_due(s->acks, now, force);
    send_released_acks(s);
}

int cps__server_ack_wait_ms(const cps__server *s, uint64_t now, int max_ms)
{
    return cps__ackhold_wait_ms(s->acks, now, max_ms);
}

void cps__server_run_actions(cps__server *s)
{
    const cps__chain_action *acts;
    size_t n = cps__chain_actions(s->chain, &acts);
    int applied = 0;
    for (size_t i = 0; i < n && !s->poisoned; i++) {
        const cps__chain_action *a = &acts[i];
        switch (a->kind) {
        case CPS_CA_APPLY:
            do_apply(s, a);
            applied = 1;
            break;
        case CPS_CA_SEND: {
            cps__msg_hdr h;
            if (cps__wire_hdr_decode(a->msg, a->len, &h) != 0)
                break;
            if (h.type == CPS_MSG_CHAIN_ACK && hold_ack(s, a->to, &h))
                break;
            if (h.type == CPS_MSG_FWD) {
                s->ctr.forwards++;
                s->ctr.forward_retries += s->in_tick;
            }
            void *buf = cps__tp_alloc(a->len);
            if (!buf)
                break;
            memcpy(buf, a->msg, a->len);
            int rc = cps__tp_send(s->tp, a->to, buf, a->len);
            if (rc != 0) {
                cps__tp_free(buf);
                cps__log(CPS_LOG_DEBUG, "server", "chain message to node %u not sent: %s", a->to,
                         cps_strerror(rc));
            }
            break;
        }
        case CPS_CA_REPLY:
            do_reply(s, a);
            break;
        }
    }
    if (applied && cps__ssp_parked(s->ssp))
        wake_parked(s);
}

/* ---- requests ---- */

static int keys_in_range(const cps__server *s, uint32_t range, const cps__kv *kv)
{
    const cps__range *r = &s->view.ranges[range];
    /* Keys are sorted (the decoder checked), so the ends suffice. */
    return kv->keys[0] >= r->lo && kv->keys[kv->nkeys - 1] <= r->hi;
}

static uint64_t keyset_sig(const cps__kv *kv)
{
    return cps__keyset_sig(kv->keys, kv->lens, kv->nkeys);
}

/* Refuse before anything is applied: unknown keys, wrong lengths, conflicting re-declares. */
typedef struct check_io {
    const cps__kv *kv;
    const cps__param_spec *spec; /* declare: the requested definition */
    uint64_t bad_key;
    uint32_t have_len;
} check_io;

static int check_keys(cps__txn *txn, void *arg)
{
    check_io *c = arg;
    for (uint32_t i = 0; i < c->kv->nkeys; i++) {
        cps__param_rec rec;
        int rc = cps__store_param_get(txn, c->kv->keys[i], &rec);
        if (c->spec) {
            if (rc == CPS_ENOTFOUND)
                continue;
            if (rc == 0 && (rec.len != c->kv->lens[i]))
                rc = CPS_EEXIST;
        } else if (rc == 0 && rec.len != c->kv->lens[i]) {
            rc = CPS_ESIZE;
        }
        if (rc != 0) {
            c->bad_key = c->kv->keys[i];
            c->have_len = rc == CPS_ENOTFOUND ? 0 : rec.len;
            return rc;
        }
    }
    return 0;
}

/* Check kv against the store; on a refusal, say why in why[n] and return the error. `spec`: a
 * declare's definition, NULL for a push. */
static int bad_keys(cps__server *s, const cps__kv *kv, const cps__param_spec *spec, char *why,
                    size_t n)
{
    check_io c = {kv, spec, 0, 0};
    int rc = cps__store_read(s->store, check_keys, &c);
    if (rc == CPS_ENOTFOUND)
        snprintf(why, n, "key %016" PRIx64 " was never declared", c.bad_key);
    else if (rc == CPS_ESIZE)
        snprintf(why, n, "key %016" PRIx64 " holds %u values, not %u", c.bad_key, c.have_len,
                 kv->lens[0]);
    else if (rc == CPS_EEXIST)
        snprintf(why, n, "key %016" PRIx64 " exists with %u values", c.bad_key, c.have_len);
    else if (rc != 0)
        snprintf(why, n, "store read failed");
    return rc;
}

/* Refuse at once: for requests that hold no number of the worker's push sequence (declares,
 * sync pushes), so nothing must be replicated first. */
static int refuse_bad_keys(cps__server *s, const cps__msg_hdr *h, const cps__kv *kv,
                           const cps__param_spec *spec)
{
    char why[96];
    int rc = bad_keys(s, kv, spec, why, sizeof why);
    if (rc != 0)
        cps__server_reply_error(s, h, rc, "%s", why);
    return rc;
}

/* Hand the request to the state machine; returns 1 if it was taken (rx must not be freed).
 * `refused`: 0, or the error the head refuses this push with (its keys): a retry of it is then
 * answered with that error, not as applied (do_reply). */
static int admit(cps__server *s, cps__rx *rx, uint64_t sig, int refused, int *verdict)
{
    const cps__msg_hdr *h = &rx->hdr;
    cps__chain_req q = {h->sender, h->type, (h->flags & CPS_WF_NOAGG) ? 1 : 0, h->req_seq};
    /* A retry's answer may wait for a commit: the state machine keeps a heap copy of rx. */
    cps__rx *cookie = malloc(sizeof *cookie);
    if (!cookie) {
        cps__server_reply_error(s, h, CPS_ENOMEM, "no memory");
        *verdict = -1;
        return 0;
    }
    *cookie = *rx;
    /* A request's own status field is unused on the wire: it carries the refusal here. */
    cookie->hdr.status = refused;
    int v = cps__chain_admit(s->chain, h->range, &q, h->step, sig, cookie);
    *verdict = v;
    if (v == CPS_ADMIT_DUP) {
        cps__server_run_actions(s); /* may answer (and free) the cookie now */
        return 1;
    }
    free(cookie);
    if (v == CPS_ADMIT_NOT_HEAD)
        cps__server_reply_error(s, h, CPS_ESTALE_EPOCH, "not the head of range %u", h->range);
    else if (v == CPS_ADMIT_BUSY)
        cps__server_reply_error(s, h, CPS_EAGAIN, "range %u has too many updates in flight",
                                h->range);
    else if (v == CPS_ADMIT_GAP)
        cps__log(CPS_LOG_DEBUG, "server", "push %llu from node %u out of order: dropped",
                 (unsigned long long)h->req_seq, h->sender);
    else if (v < 0)
        cps__server_reply_error(s, h, v, "exactly-once record unreadable");
    return 0;
}

static void submit(cps__server *s, uint32_t range, const cps__chain_update *u)
{
    int rc = cps__chain_submit(s->chain, range, u, cps__now_ms());
    if (rc != 0) {
        cps__log(CPS_LOG_ERROR, "server", "range %u: submit failed: %s", range, cps_strerror(rc));
        return;
    }
    cps__server_run_actions(s);
}

void cps__server_on_declare(cps__server *s, cps__rx *rx)
{
    cps__kv kv;
    const uint64_t *offsets;
    cps__param_spec spec;
    int verdict = -1;
    int rc = cps__wire_declare_decode(rx->payload, rx->len, &kv, &offsets, &spec);
    if (rc != 0) {
        cps__server_reply_error(s, &rx->hdr, rc, "malformed DECLARE payload");
    } else if (!keys_in_range(s, rx->hdr.range, &kv)) {
        cps__server_reply_error(s, &rx->hdr, CPS_EINVAL, "keys outside range %u", rx->hdr.range);
    } else if (refuse_bad_keys(s, &rx->hdr, &kv, &spec) == 0 && !admit(s, rx, 0, 0, &verdict) &&
               verdict == CPS_ADMIT_NEW) {
        cps__chain_req q = {rx->hdr.sender, CPS_MSG_DECLARE, 0, rx->hdr.req_seq};
        cps__chain_update u = {CPS_UPD_DECLARE, 0, 0, 1, &q, rx->payload, rx->len};
        submit(s, rx->hdr.range, &u);
    } else if (verdict == CPS_ADMIT_DUP) {
        return; /* taken */
    }
    cps__rx_free(rx);
}

/* ---- sync aggregation (replication/sync.c decides; this performs) ---- */

/* A gathered push as the aggregator holds it: the received message, no copy. */
typedef struct sync_push {
    cps__rx rx;
    cps__kv kv;
} sync_push;

static void sync_push_free(void *ctx, void *cookie)
{
    (void)ctx;
    sync_push *p = cookie;
    cps__rx_free(&p->rx);
    free(p);
}

/* The sum runs in rank order, so every run computes the same bits; replicas apply the sum the
 * head sends them. The lowest rank's message is ours: the others are added into its values in
 * place, so the aggregate costs no copy, and its payload is the update's body as it stands. */
static void sync_submit(cps__server *s, const cps__sync_action *a)
{
    sync_push *p0 = NULL;
    cps__chain_req *reqs = calloc(a->count, sizeof *reqs);
    uint32_t nreq = 0;
    for (uint32_t r = 0; reqs && r < a->nranks; r++) {
        sync_push *p = a->by_rank[r].cookie;
        if (!p)
            continue;
        if (!p0)
            p0 = p;
        else
            cps__vec_add((float *)(uintptr_t)p0->kv.vals, p->kv.vals, p->kv.nvals);
        reqs[nreq++] =
            (cps__chain_req){a->by_rank[r].worker, a->by_rank[r].type, 0, a->by_rank[r].req_seq};
    }
    if (!reqs) {
        cps__log(CPS_LOG_ERROR, "server", "no memory to aggregate step %llu of range %u",
                 (unsigned long long)a->step, a->range);
    } else {
        cps__chain_update u = {CPS_UPD_PUSH, a->step,        a->sig,    nreq,
                               reqs,         p0->rx.payload, p0->rx.len};
        submit(s, a->range, &u);
        cps__log(CPS_LOG_DEBUG, "server", "range %u step %llu: aggregate of %u workers submitted",
                 a->range, (unsigned long long)a->step, nreq);
    }
    free(reqs);
    for (uint32_t r = 0; r < a->nranks; r++)
        if (a->by_rank[r].cookie)
            sync_push_free(NULL, a->by_rank[r].cookie);
}

/* A step that cannot complete is said out loud: the live workers it waits for have not pushed
 * this key set for this step. Either they are slow or stopped (they will be dropped once
 * declared dead), or they push other keys (ps-lite-style jobs), which sync mode never
 * completes. */
static void sync_report_stuck(cps__server *s, const cps__sync_action *a, uint64_t now)
{
    char waiting[256], have[256];
    size_t wo = 0, ho = 0;
    waiting[0] = have[0] = 0;
    for (uint32_t k = 0; k < s->view.nnodes; k++) {
        const cps__node_info *n = &s->view.nodes[k];
        if (n->role != CPS_ROLE_WORKER || !n->alive || n->rank >= a->nranks)
            continue;
        int got = a->by_rank[n->rank].cookie != NULL;
        char *b = got ? have : waiting;
        size_t *o = got ? &ho : &wo;
        if (*o < sizeof waiting - 12)
            *o += (size_t)snprintf(b + *o, sizeof waiting - *o, "%s%u", *o ? ", " : "", n->rank);
    }
    cps__log(CPS_LOG_WARN, "server",
             "range %u: sync step %llu has waited %.0f s for worker rank(s) %s (rank(s) %s "
             "pushed): they are slow or stopped, or push other keys; a sync step needs "
             "every live worker to push the same keys (workers that push different keys "
             "need --mode async)",
             a->range, (unsigned long long)a->step, (now - a->since_ms) / 1000.0,
             waiting[0] ? waiting : "none", have[0] ? have : "none");
}

static void run_sync_actions(cps__server *s, uint64_t now)
{
    const cps__sync_action *acts;
    size_t n = cps__sync_actions(s->sync, &acts);
    for (size_t i = 0; i < n; i++) {
        if (acts[i].kind == CPS_SA_SUBMIT)
            sync_submit(s, &acts[i]);
        else if (acts[i].kind == CPS_SA_STUCK)
            sync_report_stuck(s, &acts[i], now);
    }
}

/* Backup workers: is this push of a step that closed without it? Returns cps__sync_check's
 * verdict or CPS_ENOMEM. The record is what every replica stores with each aggregate (the key
 * set's last step, each included worker's last request), read from our store, so a head that
 * took over after a failover knows the steps the old one closed and who made them. A late push
 * is marked (CPS_WF_LATE and the closed step in aux, on our copy of the request only): the chain
 * takes it as the duplicate of a closed step it is, and its reply, once that step is committed,
 * says it was dropped (do_reply). */
static int sync_mark_late(cps__server *s, cps__rx *rx, uint64_t sig)
{
    cps__msg_hdr *h = &rx->hdr;
    if (!s->sync && cps__sync_create(sync_push_free, NULL, &s->sync) != 0)
        return CPS_ENOMEM;
    uint64_t closed = 0;
    cps__sync_member m = {h->sender, 0};
    op_agg_step(s, h->range, sig, &closed);
    op_dedup(s, h->range, h->sender, &m.req_seq);
    int rc = cps__sync_record(s->sync, h->range, sig, closed, 1, &m);
    if (rc != 0)
        return rc;
    rc = cps__sync_check(s->sync, h->range, sig, h->step, h->sender, h->req_seq, &closed);
    if (rc == CPS_SYNC_LATE || rc == CPS_SYNC_STALE) {
        h->flags |= CPS_WF_LATE;
        h->aux = closed;
    }
    return rc;
}

/* The reply to a late push: counted, logged, and answered as a normal ACK (or the current
 * values, for a push-pull) with CPS_WF_LATE and the step the key set is on, so the worker moves
 * on to the next step rather than fall further behind. */
static void send_late(cps__server *s, uint32_t worker, uint64_t req_seq, uint32_t range,
                      uint64_t step, uint64_t closed, const cps__kv *kv)
{
    cps__msg_hdr h;
    reply_header(s, &h, kv ? CPS_MSG_VALUES : CPS_MSG_ACK, worker, req_seq, range, step);
    h.flags |= CPS_WF_LATE;
    h.aux = closed;
    if (kv) {
        reply_values(s, &h, kv);
        return;
    }
    int rc = cps__msg_send(s->tp, worker, &h, NULL, 0);
    if (rc != 0)
        cps__log(CPS_LOG_WARN, "server", "ack to node %u failed: %s", worker, cps_strerror(rc));
}

static void reply_late(cps__server *s, const cps__chain_action *a, cps__rx *rx, const cps__kv *kv)
{
    const cps__chain_req *q = &a->req;
    s->ctr.late_gradients++;
    cps__log(CPS_LOG_DEBUG, "server",
             "range %u: push %llu of node %u for step %llu dropped: the step closed without it "
             "(the key set is at step %llu)",
             a->range, (unsigned long long)q->req_seq, q->worker, (unsigned long long)rx->hdr.step,
             (unsigned long long)rx->hdr.aux);
    send_late(s, q->worker, q->req_seq, a->range, rx->hdr.step, rx->hdr.aux, kv);
}

static void push_sync(cps__server *s, cps__rx *rx, const cps__kv *kv)
{
    const cps__msg_hdr *h = &rx->hdr;
    uint32_t rank = cps__server_worker_rank(s, h->sender);
    if (rank >= s->view.num_workers) {
        cps__server_reply_error(s, h, CPS_EUNKNOWN_NODE, "worker rank %u out of range", rank);
        cps__rx_free(rx);
        return;
    }
    uint64_t sig = keyset_sig(kv);
    int verdict;
    int late = s->view.backup_workers > 0 ? sync_mark_late(s, rx, sig) : CPS_SYNC_OPEN;
    if (late < 0 || late == CPS_SYNC_STALE) {
        /* STALE: an old copy of a push the worker has finished (a later one of its pushes is in
         * an aggregate): answered at once, without a claim and uncounted; only a worker that
         * gave it up still waits for an answer. */
        if (late < 0)
            cps__server_reply_error(s, h, late, "no memory for the step record");
        else
            send_late(s, h->sender, h->req_seq, h->range, h->step, h->aux, NULL);
        cps__rx_free(rx);
        return;
    }
    if (admit(s, rx, sig, 0, &verdict))
        return; /* a retry of an applied step, or a late push: answered by the state machine */
    if (verdict != CPS_ADMIT_NEW) {
        cps__rx_free(rx);
        return;
    }
    sync_push *p = malloc(sizeof *p);
    int v = CPS_ENOMEM;
    if (p && (s->sync || cps__sync_create(sync_push_free, NULL, &s->sync) == 0)) {
        *p = (sync_push){*rx, *kv};
        cps__sync_contrib c = {h->sender, h->type, h->req_seq,
                               kv->nvals, p,       (h->flags & CPS_WF_FIRST) != 0};
        v = cps__sync_push(s->sync, &s->view, h->range, sig, h->step, rank, &c, cps__now_ms());
    }
    if (v == CPS_SYNC_TAKEN) {
        run_sync_actions(s, 0);
        return;
    }
    free(p);
    if (v == CPS_SYNC_LATE || v == CPS_SYNC_APPLIED || v == CPS_SYNC_STALE) {
        /* Closed in our record though the chain admitted it: answer as the chain would. */
        cps__chain_action a = {.kind = CPS_CA_REPLY, .range = h->range};
        a.req = (cps__chain_req){h->sender, h->type, 0, h->req_seq};
        uint64_t closed = 0;
        cps__sync_check(s->sync, h->range, sig, h->step, h->sender, h->req_seq, &closed);
        rx->hdr.aux = closed;
        if (v == CPS_SYNC_LATE)
            reply_late(s, &a, rx, h->type == CPS_MSG_PUSH_PULL ? kv : NULL);
        else if (v == CPS_SYNC_STALE)
            send_late(s, h->sender, h->req_seq, h->range, h->step, closed, NULL);
        else
            reply_request_aux(s, h->type, h->sender, h->req_seq, h->range, h->step,
                              h->type == CPS_MSG_PUSH_PULL ? kv : NULL, 0);
    } else if (v == CPS_SYNC_SIZE)
        cps__server_reply_error(s, h, CPS_ESIZE,
                                "gradient length differs between workers for step %llu",
                                (unsigned long long)h->step);
    else if (v < 0)
        cps__server_reply_error(s, h, v, "no memory for an aggregation slot");
    /* CPS_SYNC_RETRY: a retry while the step is still being gathered; the reply comes when it
     * completes. */
    cps__rx_free(rx);
}

/* A lossy push (CPS_WF_LOSSY) becomes an ordinary one here, before anything else looks at it:
 * its codec block is decoded into float32 values in a plain kv payload that replaces rx's, so
 * admission, sync aggregation, the chain (FWD carries the update's body), the store and
 * checkpoints only see floats, and a retry, decoded again from the same bytes, is the same push.
 * A malformed block is refused with the decoder's error. raw_len then counts the float bytes,
 * so the servers' traffic figures show what the codec saved. */
static int unpack_lossy(cps__server *s, cps__rx *rx)
{
    cps__kv kv;
    const void *blk;
    size_t blen;
    int rc = cps__wire_kv_decode_lossy(rx->payload, rx->len, &kv, &blk, &blen);
    const char *what = rc ? "keys" : "codec block";
    size_t pre = rc ? 0 : cps__wire_kv_size(kv.nkeys, 0);
    size_t n = rc ? 0 : cps__wire_kv_size(kv.nkeys, kv.nvals);
    /* The decoded push must fit in a message: it is forwarded down the chain as it is. */
    if (rc == 0 && n > CPS_WIRE_MAX_PAYLOAD)
        rc = CPS_ESIZE;
    unsigned char *plain = NULL;
    if (rc == 0 && !(plain = aligned_alloc(16, (n + 15) & ~(size_t)15)))
        rc = CPS_ENOMEM;
    if (rc == 0) {
        cps__wire_kv_encode(plain, pre, kv.nkeys, kv.keys, kv.lens, NULL, 0);
        cps__le32_put(plain + 4, (uint32_t)kv.nvals);
        rc = cps__gradcodec_decode(blk, blen, kv.nvals, (float *)(void *)(plain + pre));
    }
    if (rc != 0) {
        free(plain);
        s->stats.msgs_bad++;
        cps__server_reply_error(s, &rx->hdr, rc,
                                "malformed lossy-compressed push (%s of a %zu-byte payload)", what,
                                rx->len);
        return rc;
    }
    cps__rx_free(rx);
    rx->owned = plain;
    rx->payload = plain;
    rx->len = n;
    rx->hdr.flags &= (uint16_t)~CPS_WF_LOSSY;
    rx->hdr.raw_len = (uint32_t)n;
    return 0;
}

void cps__server_on_push(cps__server *s, cps__rx *rx)
{
    s->ctr.pushes++;
    s->ctr.pulls += rx->hdr.type == CPS_MSG_PUSH_PULL;
    if ((rx->hdr.flags & CPS_WF_LOSSY) && unpack_lossy(s, rx) != 0) {
        cps__rx_free(rx);
        return;
    }
    cps__kv kv;
    int rc = cps__wire_kv_decode(rx->payload, rx->len, 1, &kv);
    if (rc != 0) {
        cps__server_reply_error(s, &rx->hdr, rc, "malformed push payload");
        cps__rx_free(rx);
        return;
    }
    if (!keys_in_range(s, rx->hdr.range, &kv)) {
        cps__server_reply_error(s, &rx->hdr, CPS_EINVAL, "keys outside range %u", rx->hdr.range);
        cps__rx_free(rx);
        return;
    }
    int sync = s->view.mode == CPS_MODE_SYNC && !(rx->hdr.flags & CPS_WF_NOAGG);
    if (sync && refuse_bad_keys(s, &rx->hdr, &kv, NULL) != 0) {
        cps__rx_free(rx);
        return;
    }
    s->stats.push_raw_bytes += rx->hdr.raw_len;
    s->stats.push_wire_bytes += rx->hdr.payload_len;
    if (sync) {
        push_sync(s, rx, &kv); /* takes rx */
        return;
    }
    /* A push refused here (unknown key, wrong length) still uses up its number of the worker's
     * sequence: the worker's later pushes follow it. The used-up number is replicated as a SKIP
     * update and the refusal answered only once that is committed (at the tail, as any reply):
     * answered before, a head failing right after would leave a new head that takes the worker's
     * next push for a gap for ever (simulator seeds 6 and 55 with --refusals). A retry is a
     * duplicate then, answered with the refusal once committed. */
    char why[96];
    int refused = bad_keys(s, &kv, NULL, why, sizeof why);
    int verdict;
    if (admit(s, rx, 0, refused, &verdict))
        return;
    if (verdict == CPS_ADMIT_NEW) {
        cps__chain_req q = {rx->hdr.sender, rx->hdr.type, (rx->hdr.flags & CPS_WF_NOAGG) ? 1 : 0,
                            rx->hdr.req_seq};
        if (refused) {
            cps__log(CPS_LOG_WARN, "server",
                     "push %llu of node %u on range %u refused: %s: %s (answered once replicated)",
                     (unsigned long long)rx->hdr.req_seq, rx->hdr.sender, rx->hdr.range,
                     cps_err_name(refused), why);
            uint64_t status; /* the body: 8-byte aligned, little-endian */
            cps__le64_put(&status, (uint64_t)(int64_t)refused);
            cps__chain_update u = {CPS_UPD_SKIP, rx->hdr.step, 0, 1, &q, &status, sizeof status};
            submit(s, rx->hdr.range, &u);
        } else {
            cps__chain_update u = {CPS_UPD_PUSH, rx->hdr.step, 0, 1, &q, rx->payload, rx->len};
            submit(s, rx->hdr.range, &u);
        }
    }
    cps__rx_free(rx);
}

void cps__server_on_pull(cps__server *s, cps__rx *rx)
{
    s->ctr.pulls++;
    cps__kv kv;
    int rc = cps__wire_kv_decode(rx->payload, rx->len, 0, &kv);
    if (rc != 0) {
        cps__server_reply_error(s, &rx->hdr, rc, "malformed pull payload");
    } else if (!keys_in_range(s, rx->hdr.range, &kv)) {
        cps__server_reply_error(s, &rx->hdr, CPS_EINVAL, "keys outside range %u", rx->hdr.range);
    } else if (!cps__chain_can_serve_pull(s->chain, rx->hdr.range)) {
        /* A new tail that has not yet applied everything its predecessor acknowledged. */
        cps__server_reply_error(s, &rx->hdr, CPS_EAGAIN, "range %u: new tail catching up",
                                rx->hdr.range);
    } else if (!pull_may_proceed(s, rx->hdr.range, rx->hdr.aux, rx->hdr.sender)) {
        if (park_pull(s, rx, &kv, rx->hdr.aux) == 0)
            return; /* kept */
        cps__server_reply_error(s, &rx->hdr, CPS_ENOMEM, "no memory to park a pull");
    } else {
        cps__msg_hdr h;
        reply_header(s, &h, CPS_MSG_VALUES, rx->hdr.sender, rx->hdr.req_seq, rx->hdr.range,
                     rx->hdr.step);
        reply_values(s, &h, &kv);
    }
    cps__rx_free(rx);
}

void cps__server_on_chain(cps__server *s, cps__rx *rx)
{
    int rc = cps__chain_on_message(s->chain, &rx->hdr, rx->payload, rx->len, cps__now_ms());
    if (rc == CPS_EAGAIN) {
        cps__server_ask_view(s);
    } else if (rc == CPS_ESTALE_EPOCH) {
        cps__log(CPS_LOG_DEBUG, "server", "chain message from node %u (epoch %llu) fenced",
                 rx->hdr.sender, (unsigned long long)rx->hdr.epoch);
    } else if (rc != 0) {
        s->stats.msgs_bad++;
        cps__log(CPS_LOG_ERROR, "server", "bad chain message from node %u dropped: %s",
                 rx->hdr.sender, cps_strerror(rc));
    }
    cps__server_run_actions(s); /* APPLY bodies point into rx: free it only afterwards */
    cps__rx_free(rx);
}

void cps__server_tick(cps__server *s, uint64_t now)
{
    if (cps__chain_tick(s->chain, now) == 0) {
        s->in_tick = 1; /* a tick only re-sends */
        cps__server_run_actions(s);
        s->in_tick = 0;
    }
    if (cps__sync_pending(s->sync) && cps__sync_tick(s->sync, now) == 0)
        run_sync_actions(s, now);
}

void cps__server_view_changed(cps__server *s)
{
    int rc = 0;
    if (!s->chain)
        rc = cps__server_chain_init(s);
    if (rc == 0)
        rc = cps__chain_set_view(s->chain, &s->view, cps__now_ms());
    if (rc != 0)
        cps__log(CPS_LOG_ERROR, "server", "chain view change failed: %s", cps_strerror(rc));
    cps__server_run_actions(s);
    if (s->sync && cps__sync_set_view(s->sync, &s->view) == 0)
        run_sync_actions(s, 0);
    if (cps__ssp_parked(s->ssp))
        wake_parked(s);
}

void cps__server_data_fini(cps__server *s)
{
    cps__sync_destroy(s->sync);
    cps__ssp_destroy(s->ssp);
    cps__joiner_destroy(s->joiner);
    /* Held acks are dropped: the chain state they came from is gone. */
    cps__ackhold_destroy(s->acks);
    s->acks = NULL;
    /* Counts too: a server that rejoins (fenced) keeps running on this state. */
    s->sync = NULL;
    s->ssp = NULL;
    s->joiner = NULL;
}
