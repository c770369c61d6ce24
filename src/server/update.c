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

#include "chainps/error.h"
#include "core/log.h"
#include "optim/optim.h"
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

static int read_range_seq(cps_txn *txn, void *arg)
{
    meta_read *m = arg;
    cps_range_meta rm;
    int rc = cps__store_range_get(txn, m->range, &rm);
    m->value = rc == 0 ? rm.seq : 0;
    return rc;
}

static int read_dedup(cps_txn *txn, void *arg)
{
    meta_read *m = arg;
    return cps__store_dedup_get(txn, m->range, m->worker, &m->value);
}

static int read_agg(cps_txn *txn, void *arg)
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
    int rc = cps__store_read(((server *)ctx)->store, read_range_seq, &m);
    *seq = m.value;
    return rc;
}

static int op_dedup(void *ctx, uint32_t range, uint32_t worker, uint64_t *seq)
{
    meta_read m = {.range = range, .worker = worker};
    int rc = cps__store_read(((server *)ctx)->store, read_dedup, &m);
    *seq = m.value;
    return rc;
}

static int op_agg_step(void *ctx, uint32_t range, uint64_t sig, uint64_t *step)
{
    meta_read m = {.range = range, .sig = sig};
    int rc = cps__store_read(((server *)ctx)->store, read_agg, &m);
    *step = m.value;
    return rc;
}

static void op_drop_cookie(void *ctx, void *cookie)
{
    (void)ctx;
    cps__rx_free(cookie);
    free(cookie);
}

static const cps_chain_store_ops chain_store_ops = {op_range_seq, op_dedup, op_agg_step,
                                                    op_drop_cookie};

/* Created once our node id is known (at the first view). */
int cps__server_chain_init(server *s)
{
    cps_chain_config cc = {.self = s->id, .resend_ms = 200, .max_unacked = 1024};
    return cps_chain_create(&cc, &chain_store_ops, s, &s->chain);
}

/* ---- replies ---- */

typedef struct read_io {
    const cps_kv *kv;
    float *out;
} read_io;

static int read_values(cps_txn *txn, void *arg)
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

static void reply_header(server *s, cps_msg_hdr *h, uint8_t type, uint32_t worker, uint64_t req_seq,
                         uint32_t range, uint64_t step)
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
static void reply_values(server *s, const cps_msg_hdr *rh, const cps_kv *kv)
{
    uint64_t nvals = 0;
    for (uint32_t i = 0; i < kv->nkeys; i++)
        nvals += kv->lens[i];
    size_t len = cps__wire_kv_size(kv->nkeys, nvals);
    cps_msg_hdr h = *rh;
    /* rh is our reply, sent by us: an error goes to the worker it was for. */
    cps_msg_hdr req = *rh;
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
        cps_log(CPS_LOG_WARN, "server", "reply to node %u failed: %s", rh->req_worker,
                cps_strerror(rc));
    }
}

/* Answer one request: ACK (with `aux`), or the values of `kv` for a push-pull. */
static void reply_request_aux(server *s, uint8_t type, uint32_t worker, uint64_t req_seq,
                              uint32_t range, uint64_t step, const cps_kv *kv, uint64_t aux)
{
    cps_msg_hdr h;
    if (type == CPS_MSG_PUSH_PULL && kv) {
        reply_header(s, &h, CPS_MSG_VALUES, worker, req_seq, range, step);
        reply_values(s, &h, kv);
        return;
    }
    reply_header(s, &h, CPS_MSG_ACK, worker, req_seq, range, step);
    h.aux = aux;
    int rc = cps__msg_send(s->tp, worker, &h, NULL, 0);
    if (rc != 0)
        cps_log(CPS_LOG_WARN, "server", "ack to node %u failed: %s", worker, cps_strerror(rc));
}

/* ---- SSP clocks and parked pulls ---- */

static uint64_t *clock_slot(server *s, uint32_t range, uint32_t worker)
{
    if (!s->clock || s->clock_ranges != s->view.nranges) {
        free(s->clock);
        s->clock_ranges = s->view.nranges;
        s->clock = calloc((size_t)s->view.nranges * CPS_MAX_NODES, sizeof *s->clock);
        if (!s->clock)
            return NULL;
    }
    if (range >= s->view.nranges || worker >= CPS_MAX_NODES)
        return NULL;
    return &s->clock[(size_t)range * CPS_MAX_NODES + worker];
}

/* A worker holding the rank of a worker that died: it joins a running job. */
static int takes_dead_workers_place(const server *s, uint32_t worker)
{
    const cps_node_info *me = cps__view_node(&s->view, worker);
    if (!me)
        return 0;
    for (uint32_t i = 0; i < s->view.nnodes; i++) {
        const cps_node_info *n = &s->view.nodes[i];
        if (n->role == CPS_ROLE_WORKER && !n->alive && n->id != worker && n->rank == me->rank)
            return 1;
    }
    return 0;
}

/* The lowest clock in `range` of the live workers other than `except` (UINT64_MAX: none). A
 * replacement whose DECLARE has not been applied here yet has no clock: it does not count (two
 * replacements admitted together would otherwise each start at the other's 0). */
static uint64_t slowest_clock(server *s, uint32_t range, uint32_t except)
{
    uint64_t m = UINT64_MAX;
    for (uint32_t i = 0; i < s->view.nnodes; i++) {
        const cps_node_info *n = &s->view.nodes[i];
        if (n->role != CPS_ROLE_WORKER || !n->alive || n->id == except)
            continue;
        uint64_t *c = clock_slot(s, range, n->id);
        uint64_t v = c ? *c : 0;
        if (v == 0 && takes_dead_workers_place(s, n->id))
            continue;
        if (v < m)
            m = v;
    }
    return m;
}

/* The bound is on how far a worker runs ahead of the others: its own clock never holds back its
 * pull (it may lag its pull's clock while its own push is still on the way to this range, or
 * while it has just taken a dead worker's place). */
static int pull_may_proceed(server *s, uint32_t range, uint64_t clock, uint32_t worker)
{
    if (s->view.mode != CPS_MODE_SSP)
        return 1;
    uint64_t m = slowest_clock(s, range, worker);
    return m == UINT64_MAX || m + s->view.ssp_bound >= clock;
}

/* The highest clock in `range` of any worker other than `except`, live, finished or dead: how
 * far the job got there (0: nowhere). */
static uint64_t furthest_clock(server *s, uint32_t range, uint32_t except)
{
    uint64_t m = 0;
    for (uint32_t i = 0; i < s->view.nnodes; i++) {
        const cps_node_info *n = &s->view.nodes[i];
        uint64_t *c =
            n->role == CPS_ROLE_WORKER && n->id != except ? clock_slot(s, range, n->id) : NULL;
        if (c && *c > m)
            m = *c;
    }
    return m;
}

/* An SSP worker taking a dead worker's place starts at the slowest clock of the others: at 0 it
 * would hold every other worker's pulls back until it had pushed its way up from the first step
 * on its own. With no other worker running (they finished while it was being restarted), it
 * starts where the job got to, as a sync joiner does, not at 0, which would run the whole job
 * again on its shard alone. Every replica applies the DECLARE, so every replica sets the same
 * clock. */
static void ssp_place_joiner(server *s, uint32_t range, uint32_t worker)
{
    if (s->view.mode != CPS_MODE_SSP || !takes_dead_workers_place(s, worker))
        return;
    uint64_t *c = clock_slot(s, range, worker);
    uint64_t m = slowest_clock(s, range, worker);
    if (m == UINT64_MAX)
        m = furthest_clock(s, range, worker);
    if (c && *c == 0)
        *c = m;
}

static uint64_t keyset_sig(const cps_kv *kv);

/* The step a DECLARE answers with, where a worker joining a running job starts counting. Sync:
 * the last step applied to the key set, so its first push joins the step the others are on.
 * SSP: a replacement's clock in the range (ssp_place_joiner), else 0. Async: 0. */
static uint64_t declare_step(server *s, uint32_t range, uint32_t worker, const void *body,
                             size_t len)
{
    if (s->view.mode == CPS_MODE_SSP) {
        uint64_t *c = takes_dead_workers_place(s, worker) ? clock_slot(s, range, worker) : NULL;
        return c ? *c : 0;
    }
    cps_kv kv;
    const uint64_t *offsets;
    cps_param_spec spec;
    if (!body || cps__wire_declare_decode(body, len, &kv, &offsets, &spec) != 0)
        return 0;
    uint64_t step = 0;
    op_agg_step(s, range, keyset_sig(&kv), &step);
    return step;
}

static void wake_parked(server *s)
{
    uint32_t kept = 0;
    for (uint32_t i = 0; i < s->nparked; i++) {
        parked_pull *p = &s->parked[i];
        if (pull_may_proceed(s, p->rx.hdr.range, p->clock, p->rx.hdr.sender)) {
            cps_msg_hdr h;
            reply_header(s, &h, CPS_MSG_VALUES, p->rx.hdr.sender, p->rx.hdr.req_seq,
                         p->rx.hdr.range, p->rx.hdr.step);
            reply_values(s, &h, &p->kv);
            cps__rx_free(&p->rx);
        } else {
            s->parked[kept++] = *p;
        }
    }
    s->nparked = kept;
}

/* Keep a pull (or the pull half of a push-pull) until the slowest worker catches up; takes rx.
 * Returns 0, or CPS_ENOMEM with rx still the caller's. */
static int park_pull(server *s, cps_rx *rx, const cps_kv *kv, uint64_t clock)
{
    if (s->nparked == s->parked_cap) {
        uint32_t cap = s->parked_cap ? s->parked_cap * 2 : 16;
        parked_pull *grown = realloc(s->parked, cap * sizeof *grown);
        if (!grown)
            return CPS_ENOMEM;
        s->parked = grown;
        s->parked_cap = cap;
    }
    s->parked[s->nparked++] = (parked_pull){*rx, *kv, clock};
    return 0;
}

/* SSP: a push-pull's values wait like a pull's. Its push is applied; only the reply waits. */
static int pp_must_wait(server *s, const cps_chain_req *q, uint32_t range, uint64_t step)
{
    return q->type == CPS_MSG_PUSH_PULL && !pull_may_proceed(s, range, step, q->worker);
}

/* ---- performing the state machine's actions ---- */

typedef struct apply_io {
    server *server;
    const cps_chain_action *a;
    uint64_t bad_key;
} apply_io;

static int apply_txn(cps_txn *txn, void *arg)
{
    apply_io *io = arg;
    const cps_chain_action *a = io->a;
    const cps_chain_update *u = &a->upd;
    cps_kv kv;
    int rc = 0; /* CPS_UPD_SKIP: nothing but the records below */
    if (u->kind == CPS_UPD_DECLARE) {
        const uint64_t *offsets;
        cps_param_spec spec;
        rc = cps__wire_declare_decode(u->body, u->body_len, &kv, &offsets, &spec);
        for (uint32_t i = 0; rc == 0 && i < kv.nkeys; i++) {
            rc = cps__store_param_create(txn, kv.keys[i], kv.lens[i], offsets[i], &spec);
            if (rc == CPS_EEXIST)
                rc = 0; /* the head checked; a conflicting re-declare leaves the first */
            if (rc != 0)
                io->bad_key = kv.keys[i];
        }
    } else if (u->kind == CPS_UPD_PUT) {
        rc = cps__server_install_entries(txn, io->server, a->range, u->body, u->body_len, 0);
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
    cps_range_meta m;
    if ((rc = cps__store_range_get(txn, a->range, &m)) != 0)
        return rc;
    m.seq = a->seq;
    if (u->step > m.step)
        m.step = u->step;
    rc = cps__store_range_put(txn, a->range, &m);
    for (uint32_t i = 0; rc == 0 && i < u->nreqs; i++) {
        const cps_chain_req *q = &u->reqs[i];
        if (q->type != CPS_MSG_DECLARE && q->type != CPS_MSG_PUT)
            rc = cps__store_dedup_put(txn, a->range,
                                      q->noagg ? (q->worker | CPS_DEDUP_SPARSE_BIT) : q->worker,
                                      q->req_seq);
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

static void do_apply(server *s, const cps_chain_action *a)
{
    apply_io io = {s, a, 0};
    int rc = cps__store_write(s->store, apply_txn, &io);
    if (rc != 0) {
        /* The chain has already counted this update as applied here: we cannot go on. */
        cps_log(CPS_LOG_ERROR, "server",
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
    if (s->cuts)
        cps__server_cuts_after_apply(s, a->range);
    for (uint32_t i = 0; i < a->upd.nreqs; i++) {
        const cps_chain_req *q = &a->upd.reqs[i];
        if (q->type == CPS_MSG_DECLARE)
            ssp_place_joiner(s, a->range, q->worker);
        if (q->type == CPS_MSG_DECLARE || q->type == CPS_MSG_PUT || q->noagg)
            continue;
        uint64_t *c = clock_slot(s, a->range, q->worker);
        if (c && a->upd.step > *c)
            *c = a->upd.step;
    }
}

static void do_reply(server *s, const cps_chain_action *a)
{
    const cps_chain_req *q = &a->req;
    if (q->type == CPS_MSG_PUT)
        return; /* the restore tool is no member: it polls the tail's sequence number */
    if (a->cookie) {
        /* A retry answered once its update is committed: reply from the retried request. */
        cps_rx *rx = a->cookie;
        cps_kv kv;
        int have_kv = rx->hdr.type == CPS_MSG_PUSH_PULL &&
                      cps__wire_kv_decode(rx->payload, rx->len, 1, &kv) == 0;
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
    cps_kv kv;
    int have_kv = q->type == CPS_MSG_PUSH_PULL && a->upd.kind == CPS_UPD_PUSH && a->upd.body &&
                  cps__wire_kv_decode(a->upd.body, a->upd.body_len, 1, &kv) == 0;
    uint64_t aux = q->type == CPS_MSG_DECLARE && a->upd.kind == CPS_UPD_DECLARE
                       ? declare_step(s, a->range, q->worker, a->upd.body, a->upd.body_len)
                       : 0;
    if (have_kv && pp_must_wait(s, q, a->range, a->upd.step)) {
        /* The update's body belongs to the chain, and the reply needs only its keys: park a
         * pull's payload of them (no copy of the gradient). */
        cps_rx rx = {.len = cps__wire_kv_size(kv.nkeys, 0)};
        rx.owned = malloc(rx.len);
        cps_kv kept;
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

/* ---- held CHAIN_ACKs ----
 *
 * A tail (or a middle replica passing an ack up) acknowledges every update to its predecessor.
 * Sent at once, that ack is one more message per update (one in four of a push with 2 replicas),
 * and for small updates its send, wake-ups and receive are a good part of what the update itself
 * costs the two servers. The acks only let the predecessors drop what they keep for
 * re-sending (and answer retried requests once they are committed), so each is held for up to
 * ACK_HOLD_MS, and a later ack of the same range replaces it: CHAIN_ACK(seq) covers every update
 * up to seq (bench_ps, 4 KB pushes, 2 servers: +30% pushes per second). For the protocol this is a
 * network that delays acks a little and loses the superseded ones, which it tolerates (the
 * simulator's network does both); ACK_HOLD_MS is far below the FWD re-send time (200 ms). Acks
 * with a flag (the answer to a MARK) and everything else go out at once. */
#define ACK_HOLD_MS 2

static void send_held_ack(server *s, held_ack *a)
{
    int rc = cps__msg_send(s->tp, a->to, &a->hdr, NULL, 0);
    if (rc != 0)
        cps_log(CPS_LOG_DEBUG, "server", "chain ack to node %u not sent: %s", a->to,
                cps_strerror(rc));
    a->used = 0;
    s->nacks_held--;
}

/* Hold the CHAIN_ACK `h` to node `to`; 1 if held, 0 if the caller must send it now. */
static int hold_ack(server *s, uint32_t to, const cps_msg_hdr *h)
{
    if (h->aux != 0 || h->payload_len != 0 || h->range >= s->view.nranges)
        return 0;
    if (s->acks_ranges != s->view.nranges) {
        cps__server_flush_acks(s, 0, 1);
        held_ack *grown = realloc(s->acks, s->view.nranges * sizeof *grown);
        if (!grown)
            return 0;
        memset(grown, 0, s->view.nranges * sizeof *grown);
        s->acks = grown;
        s->acks_ranges = s->view.nranges;
    }
    held_ack *a = &s->acks[h->range];
    /* Only a later ack on the same link and epoch covers the held one. */
    if (a->used && (a->to != to || a->hdr.epoch != h->epoch || a->hdr.req_seq > h->req_seq))
        send_held_ack(s, a);
    if (!a->used) {
        if (s->nacks_held++ == 0)
            s->acks_since = cps__now_ms();
    }
    a->used = 1;
    a->to = to;
    a->hdr = *h;
    return 1;
}

void cps__server_flush_acks(server *s, uint64_t now, int force)
{
    if (s->nacks_held == 0 || (!force && now - s->acks_since < ACK_HOLD_MS))
        return;
    for (uint32_t r = 0; r < s->acks_ranges && s->nacks_held; r++)
        if (s->acks[r].used)
            send_held_ack(s, &s->acks[r]);
}

int cps__server_ack_wait_ms(const server *s, uint64_t now, int max_ms)
{
    if (s->nacks_held == 0)
        return max_ms;
    uint64_t due = s->acks_since + ACK_HOLD_MS;
    int wait = now >= due ? 0 : (int)(due - now);
    return wait < max_ms ? wait : max_ms;
}

void cps__server_run_actions(server *s)
{
    const cps_chain_action *acts;
    size_t n = cps_chain_actions(s->chain, &acts);
    int applied = 0;
    for (size_t i = 0; i < n && !s->poisoned; i++) {
        const cps_chain_action *a = &acts[i];
        switch (a->kind) {
        case CPS_CA_APPLY:
            do_apply(s, a);
            applied = 1;
            break;
        case CPS_CA_SEND: {
            cps_msg_hdr h;
            if (cps__wire_hdr_decode(a->msg, a->len, &h) != 0)
                break;
            if (h.type == CPS_MSG_CHAIN_ACK && hold_ack(s, a->to, &h))
                break;
            void *buf = cps__tp_alloc(a->len);
            if (!buf)
                break;
            memcpy(buf, a->msg, a->len);
            int rc = cps__tp_send(s->tp, a->to, buf, a->len);
            if (rc != 0) {
                cps__tp_free(buf);
                cps_log(CPS_LOG_DEBUG, "server", "chain message to node %u not sent: %s", a->to,
                        cps_strerror(rc));
            }
            break;
        }
        case CPS_CA_REPLY:
            do_reply(s, a);
            break;
        }
    }
    if (applied && s->nparked)
        wake_parked(s);
}

/* ---- requests ---- */

static int keys_in_range(const server *s, uint32_t range, const cps_kv *kv)
{
    const cps_range *r = &s->view.ranges[range];
    /* Keys are sorted (the decoder checked), so the ends suffice. */
    return kv->keys[0] >= r->lo && kv->keys[kv->nkeys - 1] <= r->hi;
}

static uint64_t keyset_sig(const cps_kv *kv)
{
    return cps__keyset_sig(kv->keys, kv->lens, kv->nkeys);
}

/* Refuse before anything is applied: unknown keys, wrong lengths, conflicting re-declares. */
typedef struct check_io {
    const cps_kv *kv;
    const cps_param_spec *spec; /* declare: the requested definition */
    uint64_t bad_key;
    uint32_t have_len;
} check_io;

static int check_keys(cps_txn *txn, void *arg)
{
    check_io *c = arg;
    for (uint32_t i = 0; i < c->kv->nkeys; i++) {
        cps_param_rec rec;
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

static int refuse_bad_keys(server *s, const cps_msg_hdr *h, const cps_kv *kv,
                           const cps_param_spec *spec)
{
    check_io c = {kv, spec, 0, 0};
    int rc = cps__store_read(s->store, check_keys, &c);
    if (rc == 0)
        return 0;
    if (rc == CPS_ENOTFOUND)
        cps__server_reply_error(s, h, rc, "key %016" PRIx64 " was never declared", c.bad_key);
    else if (rc == CPS_ESIZE)
        cps__server_reply_error(s, h, rc, "key %016" PRIx64 " holds %u values, not %u", c.bad_key,
                                c.have_len, kv->lens[0]);
    else if (rc == CPS_EEXIST)
        cps__server_reply_error(s, h, rc, "key %016" PRIx64 " exists with %u values", c.bad_key,
                                c.have_len);
    else
        cps__server_reply_error(s, h, rc, "store read failed");
    return rc;
}

/* Hand the request to the state machine; returns 1 if it was taken (rx must not be freed). */
static int admit(server *s, cps_rx *rx, uint64_t sig, int *verdict)
{
    const cps_msg_hdr *h = &rx->hdr;
    cps_chain_req q = {h->sender, h->type, (h->flags & CPS_WF_NOAGG) ? 1 : 0, h->req_seq};
    /* A retry's answer may wait for a commit: the state machine keeps a heap copy of rx. */
    cps_rx *cookie = malloc(sizeof *cookie);
    if (!cookie) {
        cps__server_reply_error(s, h, CPS_ENOMEM, "no memory");
        *verdict = -1;
        return 0;
    }
    *cookie = *rx;
    int v = cps_chain_admit(s->chain, h->range, &q, h->step, sig, cookie);
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
        cps_log(CPS_LOG_DEBUG, "server", "push %llu from node %u out of order: dropped",
                (unsigned long long)h->req_seq, h->sender);
    else if (v < 0)
        cps__server_reply_error(s, h, v, "exactly-once record unreadable");
    return 0;
}

static void submit(server *s, uint32_t range, const cps_chain_update *u)
{
    int rc = cps_chain_submit(s->chain, range, u, cps__now_ms());
    if (rc != 0) {
        cps_log(CPS_LOG_ERROR, "server", "range %u: submit failed: %s", range, cps_strerror(rc));
        return;
    }
    cps__server_run_actions(s);
}

void cps__server_on_declare(server *s, cps_rx *rx)
{
    cps_kv kv;
    const uint64_t *offsets;
    cps_param_spec spec;
    int verdict = -1;
    int rc = cps__wire_declare_decode(rx->payload, rx->len, &kv, &offsets, &spec);
    if (rc != 0) {
        cps__server_reply_error(s, &rx->hdr, rc, "malformed DECLARE payload");
    } else if (!keys_in_range(s, rx->hdr.range, &kv)) {
        cps__server_reply_error(s, &rx->hdr, CPS_EINVAL, "keys outside range %u", rx->hdr.range);
    } else if (refuse_bad_keys(s, &rx->hdr, &kv, &spec) == 0 && !admit(s, rx, 0, &verdict) &&
               verdict == CPS_ADMIT_NEW) {
        cps_chain_req q = {rx->hdr.sender, CPS_MSG_DECLARE, 0, rx->hdr.req_seq};
        cps_chain_update u = {CPS_UPD_DECLARE, 0, 0, 1, &q, rx->payload, rx->len};
        submit(s, rx->hdr.range, &u);
    } else if (verdict == CPS_ADMIT_DUP) {
        return; /* taken */
    }
    cps__rx_free(rx);
}

/* ---- sync aggregation ---- */

static agg_slot *find_slot(server *s, uint32_t range, uint64_t sig, uint64_t step)
{
    agg_slot *free_slot = NULL;
    for (uint32_t i = 0; i < s->nslots; i++) {
        agg_slot *a = &s->slots[i];
        if (a->used && a->range == range && a->sig == sig && a->step == step)
            return a;
        if (!a->used && !free_slot)
            free_slot = a;
    }
    uint32_t W = s->view.num_workers;
    if (!free_slot) {
        agg_slot *grown = realloc(s->slots, (s->nslots + 8) * sizeof *grown);
        if (!grown)
            return NULL;
        memset(grown + s->nslots, 0, 8 * sizeof *grown);
        s->slots = grown;
        free_slot = &s->slots[s->nslots];
        s->nslots += 8;
    }
    free_slot->by_rank = calloc(W, sizeof *free_slot->by_rank);
    free_slot->kv_by_rank = calloc(W, sizeof *free_slot->kv_by_rank);
    if (!free_slot->by_rank || !free_slot->kv_by_rank) {
        free(free_slot->by_rank);
        free(free_slot->kv_by_rank);
        return NULL;
    }
    free_slot->used = 1;
    free_slot->range = range;
    free_slot->sig = sig;
    free_slot->step = step;
    free_slot->count = 0;
    free_slot->since_ms = cps__now_ms();
    free_slot->warned_ms = 0;
    return free_slot;
}

static void slot_release(server *s, agg_slot *a)
{
    for (uint32_t r = 0; r < s->view.num_workers; r++)
        if (a->by_rank[r].buf)
            cps__rx_free(&a->by_rank[r]);
    free(a->by_rank);
    free(a->kv_by_rank);
    memset(a, 0, sizeof *a);
}

/* Submit the step's aggregate once every live worker has contributed. The sum runs in rank
 * order, so every run computes the same bits; replicas apply the sum the head sends them. */
static void slot_try_complete(server *s, agg_slot *a)
{
    uint32_t W = s->view.num_workers;
    for (uint32_t i = 0; i < s->view.nnodes; i++) {
        const cps_node_info *n = &s->view.nodes[i];
        if (n->role == CPS_ROLE_WORKER && n->alive && n->rank < W && !a->by_rank[n->rank].buf)
            return;
    }
    if (a->count == 0)
        return;
    /* The lowest rank's message is ours: the others are added into its values in place, so
     * the aggregate costs no copy, and its payload is the update's body as it stands. */
    const cps_kv *kv0 = NULL;
    const cps_rx *rx0 = NULL;
    cps_chain_req *reqs = calloc(a->count, sizeof *reqs);
    uint32_t nreq = 0;
    for (uint32_t r = 0; reqs && r < W; r++) {
        if (!a->by_rank[r].buf)
            continue;
        const cps_kv *kv = &a->kv_by_rank[r];
        const cps_msg_hdr *h = &a->by_rank[r].hdr;
        if (!kv0) {
            kv0 = kv;
            rx0 = &a->by_rank[r];
        } else {
            cps__vec_add((float *)(uintptr_t)kv0->vals, kv->vals, kv->nvals);
        }
        reqs[nreq++] = (cps_chain_req){h->sender, h->type, 0, h->req_seq};
    }
    if (!reqs) {
        cps_log(CPS_LOG_ERROR, "server", "no memory to aggregate step %llu of range %u",
                (unsigned long long)a->step, a->range);
    } else {
        cps_chain_update u = {CPS_UPD_PUSH, a->step, a->sig, nreq, reqs, rx0->payload, rx0->len};
        uint32_t range = a->range;
        uint64_t step = a->step;
        submit(s, range, &u);
        cps_log(CPS_LOG_DEBUG, "server", "range %u step %llu: aggregate of %u workers submitted",
                range, (unsigned long long)step, nreq);
    }
    free(reqs);
    slot_release(s, a);
}

static void push_sync(server *s, cps_rx *rx, const cps_kv *kv)
{
    const cps_msg_hdr *h = &rx->hdr;
    uint32_t rank = cps__server_worker_rank(s, h->sender);
    if (rank >= s->view.num_workers) {
        cps__server_reply_error(s, h, CPS_EUNKNOWN_NODE, "worker rank %u out of range", rank);
        cps__rx_free(rx);
        return;
    }
    uint64_t sig = keyset_sig(kv);
    int verdict;
    if (admit(s, rx, sig, &verdict))
        return; /* a retry of an applied step: answered by the state machine */
    if (verdict != CPS_ADMIT_NEW) {
        cps__rx_free(rx);
        return;
    }
    agg_slot *a = find_slot(s, h->range, sig, h->step);
    if (!a) {
        cps__server_reply_error(s, h, CPS_ENOMEM, "no memory for an aggregation slot");
        cps__rx_free(rx);
        return;
    }
    if (a->by_rank[rank].buf) {
        /* A retry while the step is still being gathered: the reply comes when it completes. */
        cps__rx_free(rx);
        return;
    }
    for (uint32_t r = 0; r < s->view.num_workers; r++) {
        if (a->by_rank[r].buf && a->kv_by_rank[r].nvals != kv->nvals) {
            cps__server_reply_error(s, h, CPS_ESIZE,
                                    "gradient length differs between workers "
                                    "for step %llu",
                                    (unsigned long long)h->step);
            cps__rx_free(rx);
            return;
        }
    }
    a->by_rank[rank] = *rx;
    a->kv_by_rank[rank] = *kv;
    a->count++;
    slot_try_complete(s, a);
}

void cps__server_on_push(server *s, cps_rx *rx)
{
    cps_kv kv;
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
    int verdict;
    if (admit(s, rx, 0, &verdict))
        return;
    if (verdict == CPS_ADMIT_NEW) {
        cps_chain_req q = {rx->hdr.sender, rx->hdr.type, (rx->hdr.flags & CPS_WF_NOAGG) ? 1 : 0,
                           rx->hdr.req_seq};
        /* Refused after admission, in sequence order: the refusal uses up the request's number
         * (the worker never re-sends it; its next push must not look like a gap). */
        if (refuse_bad_keys(s, &rx->hdr, &kv, NULL) != 0) {
            /* Record the used-up number on every replica, not only here: a new head must not
             * take the worker's next push for a gap. */
            cps_chain_skip(s->chain, rx->hdr.range, &q);
            cps_chain_update u = {CPS_UPD_SKIP, rx->hdr.step, 0, 1, &q, NULL, 0};
            submit(s, rx->hdr.range, &u);
        } else {
            cps_chain_update u = {CPS_UPD_PUSH, rx->hdr.step, 0, 1, &q, rx->payload, rx->len};
            submit(s, rx->hdr.range, &u);
        }
    }
    cps__rx_free(rx);
}

void cps__server_on_pull(server *s, cps_rx *rx)
{
    cps_kv kv;
    int rc = cps__wire_kv_decode(rx->payload, rx->len, 0, &kv);
    if (rc != 0) {
        cps__server_reply_error(s, &rx->hdr, rc, "malformed pull payload");
    } else if (!keys_in_range(s, rx->hdr.range, &kv)) {
        cps__server_reply_error(s, &rx->hdr, CPS_EINVAL, "keys outside range %u", rx->hdr.range);
    } else if (!cps_chain_can_serve_pull(s->chain, rx->hdr.range)) {
        /* A new tail that has not yet applied everything its predecessor acknowledged. */
        cps__server_reply_error(s, &rx->hdr, CPS_EAGAIN, "range %u: new tail catching up",
                                rx->hdr.range);
    } else if (!pull_may_proceed(s, rx->hdr.range, rx->hdr.aux, rx->hdr.sender)) {
        if (park_pull(s, rx, &kv, rx->hdr.aux) == 0)
            return; /* kept */
        cps__server_reply_error(s, &rx->hdr, CPS_ENOMEM, "no memory to park a pull");
    } else {
        cps_msg_hdr h;
        reply_header(s, &h, CPS_MSG_VALUES, rx->hdr.sender, rx->hdr.req_seq, rx->hdr.range,
                     rx->hdr.step);
        reply_values(s, &h, &kv);
    }
    cps__rx_free(rx);
}

void cps__server_on_chain(server *s, cps_rx *rx)
{
    int rc = cps_chain_on_message(s->chain, &rx->hdr, rx->payload, rx->len, cps__now_ms());
    if (rc == CPS_EAGAIN) {
        cps__server_ask_view(s);
    } else if (rc == CPS_ESTALE_EPOCH) {
        cps_log(CPS_LOG_DEBUG, "server", "chain message from node %u (epoch %llu) fenced",
                rx->hdr.sender, (unsigned long long)rx->hdr.epoch);
    } else if (rc != 0) {
        s->stats.msgs_bad++;
        cps_log(CPS_LOG_ERROR, "server", "bad chain message from node %u dropped: %s",
                rx->hdr.sender, cps_strerror(rc));
    }
    cps__server_run_actions(s); /* APPLY bodies point into rx: free it only afterwards */
    cps__rx_free(rx);
}

/* A sync step that cannot complete is said out loud: the live workers it waits for have not
 * pushed this key set for this step. Either they are slow or stopped (they will be dropped once
 * declared dead), or they push other keys (ps-lite-style jobs), which sync mode never
 * completes. Only the head gathers, so only it reports; at most every STUCK_REPEAT_MS. */
#define STUCK_WARN_MS   5000
#define STUCK_REPEAT_MS 10000

static void report_stuck_slots(server *s, uint64_t now)
{
    uint32_t W = s->view.num_workers;
    for (uint32_t i = 0; i < s->nslots; i++) {
        agg_slot *a = &s->slots[i];
        if (!a->used || now - a->since_ms < STUCK_WARN_MS ||
            (a->warned_ms && now - a->warned_ms < STUCK_REPEAT_MS))
            continue;
        char waiting[256], have[256];
        size_t wo = 0, ho = 0;
        waiting[0] = have[0] = 0;
        for (uint32_t k = 0; k < s->view.nnodes; k++) {
            const cps_node_info *n = &s->view.nodes[k];
            if (n->role != CPS_ROLE_WORKER || !n->alive || n->rank >= W)
                continue;
            int got = a->by_rank[n->rank].buf != NULL;
            char *b = got ? have : waiting;
            size_t *o = got ? &ho : &wo;
            if (*o < sizeof waiting - 12)
                *o +=
                    (size_t)snprintf(b + *o, sizeof waiting - *o, "%s%u", *o ? ", " : "", n->rank);
        }
        a->warned_ms = now;
        cps_log(CPS_LOG_WARN, "server",
                "range %u: sync step %llu has waited %.0f s for worker rank(s) %s (rank(s) %s "
                "pushed): they are slow or stopped, or push other keys; a sync step needs "
                "every live worker to push the same keys (workers that push different keys "
                "need --mode async)",
                a->range, (unsigned long long)a->step, (now - a->since_ms) / 1000.0,
                waiting[0] ? waiting : "none", have[0] ? have : "none");
    }
}

void cps__server_tick(server *s, uint64_t now)
{
    if (cps_chain_tick(s->chain, now) == 0)
        cps__server_run_actions(s);
    if (s->nslots)
        report_stuck_slots(s, now);
}

void cps__server_view_changed(server *s)
{
    int rc = 0;
    if (!s->chain)
        rc = cps__server_chain_init(s);
    if (rc == 0)
        rc = cps_chain_set_view(s->chain, &s->view, cps__now_ms());
    if (rc == 0 && !s->joins) {
        s->joins = calloc(s->view.nranges ? s->view.nranges : 1, sizeof *s->joins);
        if (!s->joins)
            rc = CPS_ENOMEM;
    }
    if (rc != 0)
        cps_log(CPS_LOG_ERROR, "server", "chain view change failed: %s", cps_strerror(rc));
    cps__server_run_actions(s);
    for (uint32_t i = 0; i < s->nslots; i++)
        if (s->slots[i].used)
            slot_try_complete(s, &s->slots[i]);
    if (s->nparked)
        wake_parked(s);
}

void cps__server_data_fini(server *s)
{
    for (uint32_t i = 0; i < s->nslots; i++)
        if (s->slots[i].used)
            slot_release(s, &s->slots[i]);
    free(s->slots);
    for (uint32_t i = 0; i < s->nparked; i++)
        cps__rx_free(&s->parked[i].rx);
    free(s->parked);
    free(s->clock);
    free(s->joins);
    /* Held acks are dropped: the chain state they came from is gone. */
    free(s->acks);
    s->acks = NULL;
    s->acks_ranges = s->nacks_held = 0;
    /* Counts too: a server that rejoins (fenced) keeps running on this state. */
    s->slots = NULL;
    s->nslots = 0;
    s->parked = NULL;
    s->nparked = s->parked_cap = 0;
    s->clock = NULL;
    s->clock_ranges = 0;
    s->joins = NULL;
}
