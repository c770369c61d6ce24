/* The worker client: joins the job, turns push/pull calls into one request per key range, and
 * drives them to completion — re-sending after a timeout or a view change, so the caller sees
 * a result rather than a transient failure. */
#include "client.h"
#include "collective.h"

#include <cblas.h>
#include <errno.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "core/codec.h"
#include "core/log.h"
#include "node/msg.h"
#include "node/roles.h"
#include "recovery/suspect.h"

#define SCHED_PEER         0u
#define CPS_REG_WORKER_TAG 0x52454749u /* "REGI" */
#define HELLO_RETRY_MS     500
#define VIEW_ASK_MIN_MS    200
#define EAGAIN_RETRY_MS    50
#define BYE_WAIT_MS        2000
/* Compression is tried on a sample first: float gradients rarely compress, and compressing a
 * whole megabyte to learn that costs more than sending it. */
#define PROBE_BYTES 4096
/* Even the sample costs: on dense float gradients (noise to snappy) it was 4-5% of a training
 * worker's CPU (examples/fmnist, bench/run_fmnist_scale.sh), the whole-payload attempts that
 * follow a lucky sample included. So a part whose attempt saved nothing is sent as it is for the
 * next 2, 4, ... ZIP_SKIP_MAX pushes before the next attempt: dense gradients stop paying within
 * a few steps, and gradients that turn sparse (or a part that always compresses, which never
 * backs off) are compressed again within ZIP_SKIP_MAX pushes. */
#define ZIP_SKIP_MAX 64u

static int progress(cps_client *c, int timeout_ms);
static void ask_view(cps_client *c);

/* ---- requests: recovery/requests.c decides, this part encodes, sends and completes ---- */

static uint8_t wire_type(int kind)
{
    switch (kind) {
    case OP_DECLARE:
        return CPS_MSG_DECLARE;
    case OP_PUSH:
        return CPS_MSG_PUSH;
    case OP_PULL:
        return CPS_MSG_PULL;
    default:
        return CPS_MSG_PUSH_PULL;
    }
}

/* 1 if part p's payload should be offered to snappy now (see ZIP_SKIP_MAX). */
static int zip_try(cps__part *p)
{
    if (p->zip_skip == 0)
        return 1;
    p->zip_skip--;
    return 0;
}

/* An attempt on part p saved at least 10% (shrank) or not: back off, or start over. */
static void zip_note(cps__part *p, int shrank)
{
    if (shrank) {
        p->zip_fails = 0;
        return;
    }
    if ((2u << p->zip_fails) <= ZIP_SKIP_MAX)
        p->zip_fails++;
    p->zip_skip = 1u << p->zip_fails;
}

/* Encode the request of a CPS_RQ_SEND action and send it to a->to under a->epoch. */
static int req_send(cps_client *c, const cps__reqs_action *a)
{
    cps__op *op = a->ctx;
    cps__part *p = &op->parts[a->part];
    int has_vals = a->type == CPS_MSG_PUSH || a->type == CPS_MSG_PUSH_PULL;
    const cps__enc *enc = has_vals && op->enc ? &op->enc[a->part] : NULL;
    size_t len = a->type == CPS_MSG_DECLARE ? cps__wire_declare_size(p->nkeys)
                 : enc                      ? cps__wire_kv_size(p->nkeys, 0) + enc->len
                                            : cps__wire_kv_size(p->nkeys, has_vals ? p->nvals : 0);
    cps__msg_hdr h = {0};
    h.type = a->type;
    h.sender = c->id;
    h.epoch = a->epoch;
    h.req_worker = c->id;
    h.req_seq = a->seq;
    h.range = a->range;
    h.step = op->step;
    h.aux = op->step; /* the SSP clock of a pull */
    if (op->noagg)
        h.flags |= CPS_WF_NOAGG;
    if (enc)
        h.flags |= CPS_WF_LOSSY;
    if (op->first && has_vals)
        h.flags |= CPS_WF_FIRST;
    void *buf = cps__msg_alloc(&h, len);
    if (!buf)
        return CPS_ENOMEM;
    char *payload = (char *)buf + CPS_WIRE_HDR_SIZE;
    if (a->type == CPS_MSG_DECLARE) {
        cps__wire_declare_encode(payload, len, p->nkeys, p->keys, p->lens, p->init_off, op->spec);
    } else {
        cps__wire_kv_encode(payload, len, p->nkeys, p->keys, p->lens, NULL, 0);
        if (has_vals)
            cps__le32_put(payload + 4, (uint32_t)p->nvals);
        if (enc) {
            memcpy(payload + cps__wire_kv_size(p->nkeys, 0), enc->buf, enc->len);
        } else if (has_vals) {
            float *dst = (float *)(void *)(payload + cps__wire_kv_size(p->nkeys, 0));
            for (uint32_t j = 0; j < p->nkeys; j++) {
                memcpy(dst, op->grad + p->src_off[j], (size_t)p->lens[j] * sizeof(float));
                dst += p->lens[j];
            }
        }
    }
    size_t wire_len = len;
    if (has_vals && c->cfg.compress && len >= CPS_CODEC_MIN_BYTES && zip_try(p)) {
        size_t probe = len < PROBE_BYTES ? len : PROBE_BYTES;
        size_t bound = cps__codec_bound(len);
        if (c->pack_cap < bound) {
            void *grown = realloc(c->pack, bound);
            if (grown) {
                c->pack = grown;
                c->pack_cap = bound;
            }
        }
        size_t pz = c->pack_cap >= bound
                        ? cps__codec_compress(payload + len - probe, probe, c->pack, c->pack_cap)
                        : 0;
        /* A payload no bigger than the probe was compressed whole by the probe itself. */
        size_t z = probe == len ? pz
                   : pz         ? cps__codec_compress(payload, len, c->pack, c->pack_cap)
                                : 0;
        zip_note(p, z != 0);
        if (z) {
            cps__msg_hdr zh = h;
            zh.flags |= CPS_WF_SNAPPY;
            zh.raw_len = (uint32_t)len;
            void *zbuf = cps__msg_alloc(&zh, z);
            if (zbuf) {
                memcpy((char *)zbuf + CPS_WIRE_HDR_SIZE, c->pack, z);
                cps__tp_free(buf);
                buf = zbuf;
                wire_len = z;
            }
        }
    }
    if (has_vals && a->attempt == 0) {
        /* Before compression: the float bytes, whichever codecs then shrank them. */
        c->stats.push_raw_bytes += cps__wire_kv_size(p->nkeys, p->nvals);
        c->stats.push_wire_bytes += wire_len;
    }
    int rc = cps__tp_send(c->tp, a->to, buf, CPS_WIRE_HDR_SIZE + wire_len);
    if (rc != 0) {
        cps__tp_free(buf);
        return rc;
    }
    if (a->attempt > 0)
        c->stats.retries++;
    return 0;
}

static void op_finish_req(cps__op *op, int err)
{
    if (err != 0 && op->result == 0) {
        op->result = err;
        /* Logged just before, by whichever thread's call runs the loop now. */
        snprintf(op->why, sizeof op->why, "%s", cps__why_latest());
    }
    op->pending--;
}

/* A push given up with CPS_EUNAVAILABLE whose number the head still needs (cps__reqs_detach):
 * a copy of the one part it sends, since the caller's operation (and gradient) is gone once
 * it returns. */
typedef struct detached_push {
    cps__op op;
    cps__part part;
    float *vals;
    cps__enc enc; /* a lossy push: its encoded bytes, sent as they were (op.enc points here) */
    struct detached_push *next;
} detached_push;

static void detached_free(detached_push *d)
{
    free(d->part.keys);
    free(d->part.lens);
    free(d->part.src_off);
    free(d->vals);
    free(d->enc.buf);
    free(d);
}

/* Copy part i of op; NULL if out of memory. */
static detached_push *detach_copy(cps_client *c, const cps__op *op, uint32_t i)
{
    const cps__part *p = &op->parts[i];
    detached_push *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->part.range = p->range;
    d->part.nkeys = p->nkeys;
    d->part.nvals = p->nvals;
    d->part.keys = malloc((p->nkeys ? p->nkeys : 1) * sizeof *d->part.keys);
    d->part.lens = malloc((p->nkeys ? p->nkeys : 1) * sizeof *d->part.lens);
    d->part.src_off = malloc((p->nkeys ? p->nkeys : 1) * sizeof *d->part.src_off);
    /* A lossy push keeps its encoded bytes, not the gradient: re-encoding would differ. */
    if (op->enc) {
        d->enc.len = op->enc[i].len;
        d->enc.buf = malloc(d->enc.len);
        if (d->enc.buf)
            memcpy(d->enc.buf, op->enc[i].buf, d->enc.len);
        d->op.enc = &d->enc;
    } else {
        d->vals = malloc((p->nvals ? p->nvals : 1) * sizeof *d->vals);
    }
    if (!d->part.keys || !d->part.lens || !d->part.src_off || (op->enc ? !d->enc.buf : !d->vals)) {
        detached_free(d);
        return NULL;
    }
    uint64_t off = 0;
    for (uint32_t j = 0; j < p->nkeys; j++) {
        d->part.keys[j] = p->keys[j];
        d->part.lens[j] = p->lens[j];
        d->part.src_off[j] = off;
        if (d->vals)
            memcpy(d->vals + off, op->grad + p->src_off[j], (size_t)p->lens[j] * sizeof(float));
        off += p->lens[j];
    }
    d->op.kind = op->kind;
    d->op.grad = d->vals;
    d->op.step = op->step;
    d->op.noagg = op->noagg;
    d->op.parts = &d->part;
    d->op.nparts = 1;
    d->op.client = c;
    d->next = c->detached;
    c->detached = d;
    return d;
}

/* A detached push was answered: it is over. */
static void detached_done(cps_client *c, cps__op *op)
{
    for (detached_push **pp = &c->detached; *pp; pp = &(*pp)->next) {
        if (&(*pp)->op == op) {
            detached_push *d = *pp;
            *pp = d->next;
            detached_free(d);
            return;
        }
    }
}

/* Perform what the last call into the request table decided. */
static void perform(cps_client *c)
{
    const cps__reqs_action *acts;
    size_t n = cps__reqs_actions(c->rq, &acts);
    for (size_t k = 0; k < n; k++) {
        const cps__reqs_action *a = &acts[k];
        switch (a->kind) {
        case CPS_RQ_SEND: {
            if (a->why == CPS_RQ_WHY_TIMEOUT)
                cps__log(CPS_LOG_DEBUG, "worker",
                         "request %llu on range %u unanswered after %u ms; re-sending",
                         (unsigned long long)a->seq, a->range, c->cfg.request_timeout_ms);
            int rc = req_send(c, a);
            if (rc != 0 && a->why == CPS_RQ_WHY_NEW)
                /* Not sent now (peer queue full, ...): the retry timer sends it again. */
                cps__log(CPS_LOG_DEBUG, "worker", "request to range %u deferred: %s", a->range,
                         cps_strerror(rc));
            cps__reqs_sent(c->rq, a->index, rc, cps__now_ms());
            break;
        }
        case CPS_RQ_ASK_VIEW:
            ask_view(c);
            break;
        case CPS_RQ_WAIT_REPLICA:
            cps__log(CPS_LOG_WARN, "worker",
                     "range %u has no live replica; waiting up to %u ms for one", a->range,
                     c->cfg.unavailable_timeout_ms);
            break;
        case CPS_RQ_COMPLETE:
            cps__log(CPS_LOG_ERROR, "worker", "range %u unavailable for %u ms: failing the request",
                     a->range, c->cfg.unavailable_timeout_ms);
            if (a->detach) {
                /* Its number must still reach the head, or it drops our later pushes on the
                 * range as a gap (see cps__reqs_detach): keep sending a copy. */
                detached_push *d = detach_copy(c, a->ctx, a->part);
                if (!d)
                    cps__log(
                        CPS_LOG_ERROR, "worker",
                        "no memory to keep push %llu on range %u: later pushes on it may stall",
                        (unsigned long long)a->seq, a->range);
                cps__reqs_detach(c->rq, a->index, d ? &d->op : NULL, 0);
            }
            op_finish_req(a->ctx, a->status);
            break;
        }
    }
}

/* Start every request of op. On failure the requests already sent stay in flight and complete
 * normally; the op records the error. */
static int op_start(cps_client *c, cps__op *op)
{
    op->client = c;
    op->result = 0;
    op->why[0] = '\0';
    op->pending = op->nparts;
    for (uint32_t i = 0; i < op->nparts; i++) {
        uint8_t type = wire_type(op->kind);
        uint32_t range = op->parts[i].range;
        /* Pushes carry a dense per-range sequence (the servers' exactly-once record relies on
         * it); other requests take ids from a separate space so they never leave a gap. The
         * counter moves only once the request is in the table, for the same reason. */
        uint64_t *last, space;
        if (op->noagg)
            last = &c->sparse_seq[range], space = CPS_SEQ_SPARSE;
        else if (type == CPS_MSG_PUSH || type == CPS_MSG_PUSH_PULL)
            last = &c->range_seq[range], space = 0;
        else
            last = &c->other_seq, space = CPS_SEQ_OTHER;
        /* A sync step's push must not overtake the worker's push of an earlier step of its key
         * set (see cps__reqs_add_ordered): ordered by a hash of the part's keys. */
        uint64_t order = 0;
        if (c->view.mode == CPS_MODE_SYNC && !op->noagg && space == 0 && op->parts[i].nkeys)
            order = cps__hash64(op->parts[i].keys, op->parts[i].nkeys * 8) | 1;
        int rc = cps__reqs_add_ordered(c->rq, &c->view, op, i, type, range, space | (*last + 1),
                                       order, cps__now_ms());
        if (rc != 0) {
            op->pending -= op->nparts - i;
            if (op->result == 0)
                op->result = CPS_ENOMEM;
            return CPS_ENOMEM;
        }
        ++*last;
        perform(c);
    }
    return 0;
}

/* Run the loop until op completes or the deadline passes. */
static int op_wait(cps_client *c, cps__op *op, int timeout_ms)
{
    uint64_t deadline = timeout_ms < 0 ? UINT64_MAX : cps__now_ms() + (uint64_t)timeout_ms;
    while (op->pending > 0) {
        uint64_t now = cps__now_ms();
        if (now >= deadline)
            return CPS_ETIMEDOUT;
        uint64_t left = deadline - now;
        int rc = progress(c, left > 50 ? 50 : (int)left);
        if (rc < 0)
            return rc;
        if (c->shutdown && op->pending > 0) {
            /* The job ended under us; nothing will answer. */
            return CPS_ESHUTDOWN;
        }
    }
    return op->result;
}

static void ask_view(cps_client *c)
{
    uint64_t now = cps__now_ms();
    if (now - c->view_asked_ms < VIEW_ASK_MIN_MS)
        return;
    c->view_asked_ms = now;
    cps__msg_hdr h = {.type = CPS_MSG_GET_VIEW, .sender = c->id, .epoch = c->view.epoch};
    cps__msg_send(c->tp, SCHED_PEER, &h, NULL, 0);
}

/* Deliver a reply (ACK / VALUES / ERROR) to its request. */
static void on_reply(cps_client *c, const cps__rx *rx)
{
    const cps__msg_hdr *h = &rx->hdr;
    cps__reqs_reply_in in = {.type = h->type,
                             .range = h->range,
                             .req_seq = h->req_seq,
                             .epoch = h->epoch,
                             .status = h->status};
    cps__reqs_done d;
    int verdict = cps__reqs_reply(c->rq, &c->view, &in, cps__now_ms(), &d);
    perform(c);
    if (verdict == CPS_RQ_REPLY_UNKNOWN || verdict == CPS_RQ_REPLY_RETRY)
        return;
    if (verdict == CPS_RQ_REPLY_OTHER_EPOCH) {
        cps__log(CPS_LOG_DEBUG, "worker",
                 "reply from server %u under epoch %llu to a request sent under %llu: ignored",
                 h->sender, (unsigned long long)h->epoch, (unsigned long long)d.sent_epoch);
        return;
    }
    cps__op *op = d.ctx;
    if (d.detached) {
        /* A push given up earlier, answered at last: its caller has long had its error. */
        if (verdict == CPS_RQ_REPLY_FAILED)
            cps__log(CPS_LOG_WARN, "worker", "server %u refused push %llu given up on range %u: %s",
                     h->sender, (unsigned long long)h->req_seq, h->range, cps_strerror(d.status));
        detached_done(c, op);
        return;
    }
    if (verdict == CPS_RQ_REPLY_FAILED) {
        char text[200] = "";
        size_t n = rx->len < sizeof text - 1 ? rx->len : sizeof text - 1;
        memcpy(text, rx->payload, n);
        text[n] = 0;
        cps__log(CPS_LOG_ERROR, "worker", "server %u refused a request on range %u: %s (%s)",
                 h->sender, h->range, cps_strerror(d.status), text);
        op_finish_req(op, d.status);
        return;
    }
    int err = 0;
    if (h->type == CPS_MSG_VALUES) {
        const cps__part *p = &op->parts[d.part];
        cps__kv kv;
        err = cps__wire_kv_decode(rx->payload, rx->len, 1, &kv);
        if (err == 0 && (kv.nkeys != p->nkeys || kv.nvals != p->nvals))
            err = CPS_EPROTO;
        for (uint32_t j = 0; err == 0 && j < p->nkeys; j++)
            if (kv.keys[j] != p->keys[j] || kv.lens[j] != p->lens[j])
                err = CPS_EPROTO;
        if (err == 0 && op->out) {
            const float *src = kv.vals;
            for (uint32_t j = 0; j < p->nkeys; j++) {
                memcpy(op->out + p->src_off[j], src, (size_t)p->lens[j] * sizeof(float));
                src += p->lens[j];
            }
            c->stats.pull_bytes += kv.nvals * sizeof(float);
        }
        if (err != 0)
            cps__log(CPS_LOG_ERROR, "worker", "reply from server %u does not match the request",
                     h->sender);
    }
    /* A declare's answer carries the last sync step the servers applied to the key set: a
     * worker joining a running job continues from there (its first push is the next step). */
    if (h->type == CPS_MSG_ACK && op->kind == OP_DECLARE && h->aux > op->step)
        op->step = h->aux;
    /* A sync push that came after its step closed (backup workers) was dropped; the reply names
     * the step the key set is on, and the worker's next push is the one after it, so a slow
     * worker keeps up with the job instead of falling further behind. */
    if (h->flags & CPS_WF_LATE) {
        c->stats.late_pushes++;
        if (op->step_of && h->aux > *op->step_of)
            *op->step_of = h->aux;
    }
    op_finish_req(op, err);
}

static void install_view(cps_client *c, const cps__rx *rx)
{
    cps__view v;
    cps__view_init(&v);
    int rc = cps__view_decode(rx->payload, rx->len, &v);
    if (rc != 0) {
        cps__log(CPS_LOG_ERROR, "worker", "bad view from the scheduler dropped: %s",
                 cps_strerror(rc));
        cps__view_fini(&v);
        return;
    }
    if (c->view.nranges && v.epoch <= c->view.epoch) {
        cps__view_fini(&v);
        return;
    }
    if (c->view.nranges && v.nranges != c->view.nranges) {
        cps__log(CPS_LOG_ERROR, "worker", "view epoch %llu changes the range count; ignored",
                 (unsigned long long)v.epoch);
        cps__view_fini(&v);
        return;
    }
    for (uint32_t i = 0; i < v.nnodes; i++) {
        if (v.nodes[i].id == c->id || v.nodes[i].role != CPS_ROLE_SERVER)
            continue;
        rc = cps__tp_peer_set(c->tp, v.nodes[i].id, v.nodes[i].addr);
        if (rc != 0)
            cps__log(CPS_LOG_WARN, "worker", "cannot reach server %u at %s: %s", v.nodes[i].id,
                     v.nodes[i].addr, cps_strerror(rc));
    }
    int first = c->view.nranges == 0;
    cps__view_fini(&c->view);
    c->view = v;
    if (!first)
        cps__log(CPS_LOG_INFO, "worker", "view epoch %llu installed; re-sending %u requests",
                 (unsigned long long)v.epoch, cps__reqs_count(c->rq));
    /* Every request in flight goes out again under the new view: a server that moved or took
     * over a range may never have seen it, and servers recognise duplicates. */
    cps__reqs_view(c->rq, &c->view, cps__now_ms());
    perform(c);
    cps__ar_on_view(c);
}

/* ---- data-path evidence: servers that leave our requests unanswered (recovery/suspect.h) ---- */

static void heard_from(cps_client *c, uint32_t node, uint64_t now)
{
    uint32_t oldest = 0;
    for (uint32_t i = 0; i < c->nheard; i++) {
        if (c->heard[i].node == node) {
            c->heard[i].ms = now;
            return;
        }
        if (c->heard[i].ms < c->heard[oldest].ms)
            oldest = i;
    }
    uint32_t at = c->nheard < CPS_SUSPECT_MAX ? c->nheard++ : oldest;
    c->heard[at].node = node;
    c->heard[at].ms = now;
}

static uint64_t heard_at(const cps_client *c, uint32_t node)
{
    for (uint32_t i = 0; i < c->nheard; i++)
        if (c->heard[i].node == node)
            return c->heard[i].ms;
    return 0;
}

static uint64_t waiting_at(void *ctx, uint32_t node, uint64_t *heard)
{
    cps_client *c = ctx;
    *heard = heard_at(c, node);
    return cps__reqs_oldest_to(c->rq, node);
}

/* Every CPS_SUSPECT_REPORT_MS: tell the scheduler which servers have had a request of ours
 * for the evidence time without our hearing anything from them. Only the scheduler's probe
 * decides (a head may hold our push for a slow worker's gradient); we only say where we wait. */
static void report_suspects(cps_client *c, uint64_t now)
{
    if (now - c->suspects_checked_ms < CPS_SUSPECT_REPORT_MS || c->shutdown)
        return;
    c->suspects_checked_ms = now;
    cps__msg_report_suspects(c->tp, c->id, &c->view, cps__suspect_evidence_ms(c->cfg.dead_after_ms),
                             waiting_at, c, now);
}

static void handle_msg(void *ctx, void *buf, size_t len)
{
    cps_client *c = ctx;
    cps__rx rx;
    int rc = cps__rx_parse(&rx, buf, len);
    if (rc != 0) {
        cps__log(CPS_LOG_ERROR, "worker", "bad message (%zu bytes) dropped: %s", len,
                 cps_strerror(rc));
        return;
    }
    cps__reqs_epoch_seen(c->rq, rx.hdr.epoch);
    if (rx.hdr.sender == SCHED_PEER)
        c->sched_heard_ms = cps__now_ms();
    else
        heard_from(c, rx.hdr.sender, cps__now_ms());
    switch (rx.hdr.type) {
    case CPS_MSG_WELCOME:
    case CPS_MSG_VIEW:
        if (rx.hdr.sender == SCHED_PEER) {
            if (rx.hdr.type == CPS_MSG_WELCOME && c->id == 0)
                c->id = rx.hdr.req_worker;
            install_view(c, &rx);
        }
        break;
    case CPS_MSG_ACK:
        if (rx.hdr.sender == SCHED_PEER)
            c->bye_acked = 1;
        else
            on_reply(c, &rx);
        break;
    case CPS_MSG_VALUES:
    case CPS_MSG_ERROR:
        if (rx.hdr.sender == SCHED_PEER && rx.hdr.type == CPS_MSG_ERROR && c->reg_seq &&
            rx.hdr.req_seq == c->reg_seq && (rx.hdr.flags & CPS_WF_REPLY) &&
            rx.hdr.req_worker == CPS_REG_WORKER_TAG) {
            c->reg_done = 1;
            c->reg_result = rx.hdr.status;
        } else if (rx.hdr.sender == SCHED_PEER && rx.hdr.type == CPS_MSG_ERROR) {
            /* Its text says why ("job is full", "the job has ended"). */
            int tl = rx.len > 200 ? 200 : (int)rx.len;
            cps__log(CPS_LOG_ERROR, "worker", "the scheduler refused us: %s%s%.*s%s",
                     cps_strerror(rx.hdr.status), tl ? " (" : "", tl,
                     tl ? (const char *)rx.payload : "", tl ? ")" : "");
            c->shutdown = 1;
        } else {
            on_reply(c, &rx);
        }
        break;
    case CPS_MSG_REGISTER:
        if (rx.hdr.sender == SCHED_PEER && rx.hdr.req_seq == c->reg_seq) {
            c->reg_done = 1;
            c->reg_result = 0;
        }
        break;
    case CPS_MSG_BARRIER_DONE:
        if (rx.hdr.req_seq == c->barrier_seq)
            c->barrier_done = 1;
        break;
    case CPS_MSG_SHUTDOWN:
        c->shutdown = 1;
        break;
    case CPS_MSG_COLL:
        cps__ar_on_msg(c, &rx);
        break;
    default:
        cps__log(CPS_LOG_WARN, "worker", "unexpected message type %u from node %u", rx.hdr.type,
                 rx.hdr.sender);
    }
    cps__rx_free(&rx);
}

/* One turn of the loop: receive what has arrived (waiting up to timeout_ms, or less if a timer
 * is due sooner), then re-send requests that timed out. */
static int progress(cps_client *c, int timeout_ms)
{
    int n = cps__loop_run_once(c->loop, timeout_ms);
    if (n < 0)
        return n;
    cps__reqs_tick(c->rq, &c->view, cps__now_ms());
    perform(c);
    report_suspects(c, cps__now_ms());
    cps__ar_tick(c);
    return 0;
}

int cps__client_progress(cps_client *c, int timeout_ms)
{
    return progress(c, timeout_ms);
}

void cps__client_ask_view(cps_client *c)
{
    ask_view(c);
}

/* A message to the scheduler, sent at once and then every `every_ms` by a loop timer while a
 * blocking call waits for its answer (HELLO, BYE, BARRIER, REGISTER). */
typedef struct resend {
    cps_client *c;
    cps__msg_hdr *h;
    const void *payload;
    size_t n;
    int stamp_epoch; /* send under the view epoch of the moment */
    int ask_view;    /* ask for the view too: its answer is proof the scheduler lives */
} resend;

enum { T_RESEND = 1 }; /* the one timer: blocking calls do not nest */

static int on_resend(cps__loop *l, uint64_t id, void *ctx, uint64_t now)
{
    (void)l, (void)id, (void)now;
    resend *r = ctx;
    if (r->stamp_epoch)
        r->h->epoch = r->c->view.epoch;
    cps__msg_send(r->c->tp, SCHED_PEER, r->h, r->payload, r->n);
    if (r->ask_view)
        ask_view(r->c);
    return 0;
}

/* ---- open / close ---- */

static int join(cps_client *c)
{
    char payload[16 + CPS_ADDR_MAX];
    size_t n = cps__hello_encode(payload, sizeof payload, CPS_ROLE_WORKER, c->cfg.rank, 0, c->addr);
    uint64_t start = cps__now_ms();
    cps__msg_hdr h = {.type = CPS_MSG_HELLO, .sender = UINT32_MAX};
    resend hello = {c, &h, payload, n, 0, 0};
    int rc = cps__loop_timer_add(c->loop, T_RESEND, 0, HELLO_RETRY_MS, on_resend, &hello);
    /* Wait for our WELCOME, not just any view: a worker joining a running job is in the view the
     * scheduler publishes to everyone as it admits it, which can arrive first. */
    while (rc == 0 && (c->view.nranges == 0 || c->id == 0)) {
        if (c->shutdown) {
            rc = CPS_ESHUTDOWN;
        } else if (cps__now_ms() - start > c->cfg.join_timeout_ms) {
            cps__log(CPS_LOG_ERROR, "worker",
                     "the job did not start within %.1f s (scheduler %s:%u unreachable, or not "
                     "every server and worker arrived)",
                     c->cfg.join_timeout_ms / 1000.0, c->cfg.sched_host, c->cfg.sched_port);
            rc = CPS_ETIMEDOUT;
        } else {
            rc = progress(c, 100);
        }
    }
    cps__loop_timer_del(c->loop, T_RESEND);
    if (rc < 0)
        return rc;
    const cps__node_info *me = cps__view_node(&c->view, c->id);
    if (!me || me->role != CPS_ROLE_WORKER) {
        cps__log(CPS_LOG_ERROR, "worker", "the view does not list us as a worker");
        return CPS_EPROTO;
    }
    c->rank = me->rank;
    c->range_seq = calloc(c->view.nranges, sizeof *c->range_seq);
    c->sparse_seq = calloc(c->view.nranges, sizeof *c->sparse_seq);
    return c->range_seq && c->sparse_seq ? 0 : CPS_ENOMEM;
}

static void client_free(cps_client *c)
{
    cps__heartbeat_stop(c->hb);
    cps__ar_free(c);
    cps__loop_tp_detach(&c->inbox);
    cps__loop_destroy(c->loop);
    cps_tensor *t = c->tensors;
    while (t) {
        cps_tensor *next = t->next;
        cps__parts_free(t->parts, t->nparts);
        free(t);
        t = next;
    }
    cps__tp_destroy(c->tp);
    cps__view_fini(&c->view);
    free(c->range_seq);
    free(c->sparse_seq);
    cps__reqs_destroy(c->rq);
    while (c->detached) {
        detached_push *d = c->detached;
        c->detached = d->next;
        detached_free(d);
    }
    free(c->pack);
    free(c->gc_scratch);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

int cps_open(cps_client **out)
{
    cps__why_clear();
    if (!out)
        return CPS_EINVAL;
    *out = NULL;
    cps__config cfg;
    char err[512];
    cps__config_defaults(&cfg);
    if (cps__config_from_env(&cfg, err, sizeof err) != 0) {
        cps__log(CPS_LOG_ERROR, "config", "%s", err);
        return CPS_ECONFIG;
    }
    if (cfg.role == CPS_ROLE_SCHEDULER || cfg.role == CPS_ROLE_SERVER) {
        cps__role_install_signals();
        int rc = cfg.role == CPS_ROLE_SCHEDULER ? cps__scheduler_run(&cfg) : cps__server_run(&cfg);
        exit(rc == 0 ? 0 : 1);
    }
    cps__config_finalize(&cfg, CPS_ROLE_WORKER);
    cps__tune_malloc();
    /* Workers share the cores with each other: one BLAS thread each unless the user said. */
    if (!getenv("OPENBLAS_NUM_THREADS"))
        openblas_set_num_threads(1);
    cps_client *c = calloc(1, sizeof *c);
    if (!c)
        return CPS_ENOMEM;
    pthread_mutex_init(&c->lock, NULL);
    c->cfg = cfg;
    cps__view_init(&c->view);
    uint16_t port = 0;
    cps__reqs_config rcfg = {.request_timeout_ms = cfg.request_timeout_ms,
                             .unavailable_timeout_ms = cfg.unavailable_timeout_ms,
                             .retry_ms = EAGAIN_RETRY_MS};
    int rc = cps__reqs_create(&rcfg, &c->rq);
    if (rc == 0)
        rc = cps__node_load_secret(&c->cfg, "worker");
    if (rc == 0)
        rc = cps__tp_create(cps__node_key(&c->cfg), &c->tp);
    if (rc == 0)
        rc = cps__tp_bind(c->tp, cfg.bind_host, cfg.port, &port);
    if (rc == 0)
        rc = cps__loop_create(&c->loop);
    if (rc == 0)
        rc = cps__loop_tp_attach(&c->inbox, c->loop, c->tp, handle_msg, c, 0);
    char url[CPS_ADDR_MAX + 16];
    snprintf(url, sizeof url, "tcp://%s:%u", cfg.sched_host, cfg.sched_port);
    if (rc == 0)
        rc = cps__tp_peer_set(c->tp, SCHED_PEER, url);
    if (rc == 0)
        rc = cps__make_url(c->addr, cfg.advertise_host, port);
    if (rc == 0)
        rc = join(c);
    if (rc != 0) {
        client_free(c);
        return rc;
    }
    /* No stall limit: a worker may compute for as long as it likes between two calls. */
    if (cps__heartbeat_start(url, cps__node_key(&c->cfg), cfg.heartbeat_ms, 0, "worker", &c->hb) ==
        0)
        cps__heartbeat_publish(c->hb, 1, c->id, 0, NULL, cps__now_ms());
    else
        cps__log(CPS_LOG_WARN, "worker", "no heartbeat thread: a long step may look like a death");
    char tag[32];
    snprintf(tag, sizeof tag, "worker %u", c->rank);
    cps__log_set_tag(tag);
    cps__log(CPS_LOG_INFO, "worker",
             "joined as node %u, rank %u of %u, %u servers, view epoch %llu", c->id, c->rank,
             c->view.num_workers, c->view.num_servers, (unsigned long long)c->view.epoch);
    *out = c;
    return 0;
}

int cps_close(cps_client *c)
{
    cps__why_clear();
    if (!c)
        return 0;
    pthread_mutex_lock(&c->lock);
    int result = 0;
    uint64_t deadline = cps__now_ms() + c->cfg.request_timeout_ms;
    while (cps__reqs_count(c->rq) > 0 && !c->shutdown && cps__now_ms() < deadline)
        progress(c, 50);
    /* Pushes given up (detached) are no call's any more: they may go unanswered. */
    if (cps__reqs_count(c->rq) > cps__reqs_detached(c->rq))
        result = CPS_ETIMEDOUT;
    unsigned char stats[CPS_STATS_SIZE];
    cps__node_stats ns = {0};
    ns.push_raw_bytes = c->stats.push_raw_bytes;
    ns.push_wire_bytes = c->stats.push_wire_bytes;
    ns.pull_bytes = c->stats.pull_bytes;
    cps__stats_encode(stats, &ns);
    deadline = cps__now_ms() + BYE_WAIT_MS;
    cps__msg_hdr h = {.type = CPS_MSG_BYE, .sender = c->id};
    resend bye = {c, &h, stats, sizeof stats, 1, 0};
    if (cps__loop_timer_add(c->loop, T_RESEND, 0, HELLO_RETRY_MS, on_resend, &bye) == 0)
        while (!c->bye_acked && !c->shutdown && cps__now_ms() < deadline)
            progress(c, 50);
    cps__loop_timer_del(c->loop, T_RESEND);
    pthread_mutex_unlock(&c->lock);
    client_free(c);
    return result;
}

int cps_rank(const cps_client *c)
{
    return c ? (int)c->rank : -1;
}

int cps_num_workers(const cps_client *c)
{
    return c ? (int)c->view.num_workers : 0;
}

int cps_num_servers(const cps_client *c)
{
    return c ? (int)c->view.num_servers : 0;
}

int cps_mode_get(const cps_client *c, cps_mode *mode, uint32_t *staleness)
{
    cps__why_clear();
    if (!c || !mode)
        return CPS_EINVAL;
    *mode = (cps_mode)c->view.mode;
    if (staleness)
        *staleness = c->view.mode == CPS_MODE_SSP ? c->view.ssp_bound : 0;
    return 0;
}

void cps_client_stats_get(const cps_client *c, cps_client_stats *out)
{
    if (c && out)
        *out = c->stats;
}

/* ---- shared by api.c ---- */

void cps__op_enc_free(cps__op *op)
{
    if (!op->enc)
        return;
    for (uint32_t i = 0; i < op->nparts; i++)
        free(op->enc[i].buf);
    free(op->enc);
    op->enc = NULL;
}

int cps__op_encode(cps_client *c, cps_tensor *t, cps__op *op)
{
    const cps__gradcodec *gc = &t->codec;
    uint64_t most = 0;
    op->enc = calloc(t->nparts ? t->nparts : 1, sizeof *op->enc);
    int rc = op->enc ? 0 : CPS_ENOMEM;
    /* Everything that can fail first: blocks, residuals, top-k's scratch. */
    for (uint32_t i = 0; rc == 0 && i < t->nparts; i++) {
        cps__part *p = &t->parts[i];
        op->enc[i].len = cps__gradcodec_size(gc, p->nvals);
        if (!op->enc[i].len || !(op->enc[i].buf = malloc(op->enc[i].len)))
            rc = op->enc[i].len ? CPS_ENOMEM : CPS_EINVAL;
        if (rc == 0 && !p->resid && !(p->resid = calloc(p->nvals, sizeof *p->resid)))
            rc = CPS_ENOMEM;
        if (p->nvals > most)
            most = p->nvals;
    }
    if (rc == 0 && gc->kind == CPS_GC_TOPK && c->gc_scratch_n < most) {
        uint32_t *grown = realloc(c->gc_scratch, most * sizeof *grown);
        if (grown) {
            c->gc_scratch = grown;
            c->gc_scratch_n = most;
        } else {
            rc = CPS_ENOMEM;
        }
    }
    if (rc != 0) {
        cps__op_enc_free(op);
        return rc;
    }
    for (uint32_t i = 0; i < t->nparts; i++) {
        cps__part *p = &t->parts[i];
        /* The residual becomes this step's gradient plus what earlier steps did not send; the
         * encoder leaves in it what this one does not. */
        float *acc = p->resid;
        for (uint32_t j = 0; j < p->nkeys; j++) {
            const float *g = op->grad + p->src_off[j];
            for (uint32_t e = 0; e < p->lens[j]; e++)
                acc[e] += g[e];
            acc += p->lens[j];
        }
        /* Cannot fail: arguments checked and sized above, scratch lent. */
        cps__gradcodec_encode(gc, p->resid, p->nvals, op->enc[i].buf, op->enc[i].len,
                              &op->enc[i].len, c->gc_scratch);
    }
    return 0;
}

int cps__client_run(cps_client *c, cps__op *op, int wait)
{
    int rc = op_start(c, op);
    if (rc != 0 && op->pending == 0)
        return rc;
    if (!wait)
        return 0;
    return op_wait(c, op, -1);
}

int cps__client_wait(cps_client *c, cps__op *op, int timeout_ms)
{
    return op_wait(c, op, timeout_ms);
}

/* Send a request to the scheduler until *done is set (by handle_msg), re-sending it every
 * request timeout. */
static int ask_scheduler(cps_client *c, cps__msg_hdr *h, const void *payload, size_t n,
                         const volatile int *done)
{
    uint64_t start = cps__now_ms();
    /* At least three view requests go unanswered before the scheduler counts as gone. */
    uint64_t gone_ms = c->cfg.unavailable_timeout_ms > 3 * (uint64_t)c->cfg.request_timeout_ms
                           ? c->cfg.unavailable_timeout_ms
                           : 3 * (uint64_t)c->cfg.request_timeout_ms;
    if (c->sched_heard_ms < start)
        c->sched_heard_ms = start;
    /* The view request is answered even while the barrier waits: proof of life. */
    resend req = {c, h, payload, n, 1, 1};
    int rc = cps__loop_timer_add(c->loop, T_RESEND, 0, c->cfg.request_timeout_ms, on_resend, &req);
    while (rc == 0 && !*done) {
        uint64_t now = cps__now_ms();
        if (c->shutdown) {
            rc = CPS_ESHUTDOWN;
        } else if (now - c->sched_heard_ms > gone_ms) {
            /* A barrier may rightly wait for slow workers for ever, but not for a scheduler
             * that answers nothing (not even the views we ask for): it is gone. */
            cps__log(CPS_LOG_ERROR, "worker",
                     "the scheduler has not answered for %.1f s (CHAINPS_UNAVAILABLE_TIMEOUT_MS, "
                     "at least 3 request timeouts): giving up",
                     (now - c->sched_heard_ms) / 1000.0);
            /* Not CPS_EUNAVAILABLE, which says a range has no replica: the servers may be fine,
             * and the caller should know it is the scheduler that is missing. */
            rc = CPS_ESCHEDULER;
        } else {
            rc = progress(c, 50);
        }
    }
    cps__loop_timer_del(c->loop, T_RESEND);
    return rc < 0 ? rc : 0;
}

int cps__client_register(cps_client *c, const cps__tensor_desc *d)
{
    unsigned char payload[512];
    size_t n = cps__wire_tensor_desc_encode(payload, sizeof payload, d);
    if (n == 0)
        return CPS_EINVAL;
    c->reg_seq++;
    c->reg_done = 0;
    /* req_worker tags the request so an error reply is told apart from a refusal of the whole
     * worker (which has req_worker 0). */
    cps__msg_hdr h = {.type = CPS_MSG_REGISTER,
                      .sender = c->id,
                      .req_worker = CPS_REG_WORKER_TAG,
                      .req_seq = c->reg_seq};
    int rc = ask_scheduler(c, &h, payload, n, &c->reg_done);
    return rc ? rc : c->reg_result;
}

int cps__client_barrier(cps_client *c)
{
    c->barrier_seq++;
    c->barrier_done = 0;
    cps__msg_hdr h = {
        .type = CPS_MSG_BARRIER, .sender = c->id, .req_worker = c->id, .req_seq = c->barrier_seq};
    return ask_scheduler(c, &h, NULL, 0, &c->barrier_done);
}

void cps__client_publish_step(cps_client *c, uint64_t step)
{
    if (step > c->clock)
        c->clock = step;
    cps__node_stats ns = {0};
    ns.push_raw_bytes = c->stats.push_raw_bytes;
    ns.push_wire_bytes = c->stats.push_wire_bytes;
    ns.pull_bytes = c->stats.pull_bytes;
    ns.step = c->clock;
    cps__heartbeat_publish(c->hb, 1, c->id, c->view.epoch, &ns, cps__now_ms());
}
