/* The worker client's shell: joins the job, turns push/pull calls into one request per key
 * range, and blocks each call until its operation is over. What to send where, when to send it
 * again and when to give up is the session's (recovery/session.h); this file receives, steps
 * the session, and performs its output: encoding, compression, sockets, logging. */
#include "client.h"
#include "collective.h"
#include "localset.h"

#include <cblas.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/codec.h"
#include "core/log.h"
#include "node/msg.h"
#include "node/roles.h"

#define SCHED_PEER      0u
#define HELLO_RETRY_MS  500
#define VIEW_ASK_MIN_MS 200
#define EAGAIN_RETRY_MS 50
#define BYE_WAIT_MS     2000
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

/* ---- requests: recovery/session.c decides, this part encodes, sends and completes ---- */

static cps__op *op_of(cps__sess_op *so)
{
    return so ? (cps__op *)(void *)((char *)so - offsetof(cps__op, so)) : NULL;
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

/* Put n bytes of values at buf[off] (a reserved message): MACed on the way, or (zip: the payload
 * may go compressed instead) plainly. */
static int values_put(cps_client *c, int zip, void *buf, size_t off, const void *src, size_t n)
{
    if (!zip)
        return cps__tp_fill(c->tp, buf, off, src, n);
    memcpy((char *)buf + off, src, n);
    return 0;
}

/* Encode the request of a CPS_SS_SEND action and send it to a->to under a->epoch. */
static int req_send(cps_client *c, const cps__sess_action *a)
{
    cps__op *op = op_of(a->op);
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
    h.step = a->step;
    h.aux = a->step; /* the SSP clock of a pull */
    h.flags = a->flags;
    if (enc)
        h.flags |= CPS_WF_LOSSY;
    /* Reserved for a->to: to a same-host server a large payload is built in the ring, so the
     * gradient is copied once (cps__tp_reserve). */
    void *buf = cps__msg_reserve(c->tp, a->to, &h, len);
    if (!buf)
        return CPS_ENOMEM;
    char *payload = (char *)buf + CPS_WIRE_HDR_SIZE;
    /* Values that go as they are, to a tcp:// server with a key, are MACed as they are copied in
     * (cps__tp_fill, after the header and keys are written); a payload that may be compressed is
     * copied plainly, as the compressed message is sealed on its own. */
    int zip = has_vals && c->cfg.compress && len >= CPS_CODEC_MIN_BYTES && zip_try(p);
    int rc = 0;
    if (a->type == CPS_MSG_DECLARE) {
        cps__wire_declare_encode(payload, len, p->nkeys, p->keys, p->lens, p->init_off, op->spec);
    } else {
        cps__wire_kv_encode(payload, len, p->nkeys, p->keys, p->lens, NULL, 0);
        if (has_vals)
            cps__le32_put(payload + 4, (uint32_t)p->nvals);
        size_t off = CPS_WIRE_HDR_SIZE + cps__wire_kv_size(p->nkeys, 0);
        if (enc) {
            rc = values_put(c, zip, buf, off, enc->buf, enc->len);
        } else if (has_vals) {
            for (uint32_t j = 0; j < p->nkeys && rc == 0; j++) {
                size_t n = (size_t)p->lens[j] * sizeof(float);
                rc = values_put(c, zip, buf, off, op->grad + p->src_off[j], n);
                off += n;
            }
        }
    }
    if (rc != 0) {
        cps__tp_unreserve(c->tp, buf);
        return rc;
    }
    size_t wire_len = len;
    if (zip) {
        size_t probe = len < PROBE_BYTES ? len : PROBE_BYTES;
        size_t bound = cps__codec_bound(len), pbound = cps__codec_bound(probe);
        /* c->pack holds the probe's output only: the whole payload is compressed straight into
         * the message below. */
        if (c->pack_cap < pbound) {
            void *grown = realloc(c->pack, pbound);
            if (grown) {
                c->pack = grown;
                c->pack_cap = pbound;
            }
        }
        size_t pz = c->pack_cap >= pbound
                        ? cps__codec_compress(payload + len - probe, probe, c->pack, c->pack_cap)
                        : 0;
        size_t z = 0;
        void *zbuf = NULL;
        cps__msg_hdr zh = h;
        zh.flags |= CPS_WF_SNAPPY;
        zh.raw_len = (uint32_t)len;
        if (probe == len && pz) {
            /* A payload no bigger than the probe was compressed whole by the probe itself. */
            zbuf = cps__msg_reserve(c->tp, a->to, &zh, pz);
            if (zbuf) {
                memcpy((char *)zbuf + CPS_WIRE_HDR_SIZE, c->pack, pz);
                z = pz;
            }
        } else if (pz && bound <= CPS_WIRE_MAX_PAYLOAD) {
            /* Compressed straight into the message to send, reserved at the bound and sent
             * at the length it came to: a ring slot to a same-host server, else a buffer the
             * transport cuts to that length in place (no copy either way). */
            zbuf = cps__msg_reserve(c->tp, a->to, &zh, bound);
            z = zbuf ? cps__codec_compress(payload, len, (char *)zbuf + CPS_WIRE_HDR_SIZE, bound)
                     : 0;
        }
        zip_note(p, z != 0);
        if (z) {
            zh.payload_len = (uint32_t)z;
            cps__wire_hdr_encode(zbuf, &zh);
            cps__tp_unreserve(c->tp, buf);
            buf = zbuf;
            wire_len = z;
        } else if (zbuf) {
            cps__tp_unreserve(c->tp, zbuf);
        }
    }
    if (has_vals && a->attempt == 0) {
        /* Before compression: the float bytes, whichever codecs then shrank them. */
        c->stats.push_raw_bytes += cps__wire_kv_size(p->nkeys, p->nvals);
        c->stats.push_wire_bytes += wire_len;
    }
    rc = cps__tp_send(c->tp, a->to, buf, CPS_WIRE_HDR_SIZE + wire_len);
    if (rc != 0) {
        cps__tp_unreserve(c->tp, buf);
        return rc;
    }
    if (a->attempt > 0)
        c->stats.retries++;
    return 0;
}

/* op has just failed, or failed before: keep the first failure's ERROR line, logged just
 * before by whichever thread's call runs the loop now, for its caller (cps_wait). */
static void note_why(cps__op *op)
{
    if (op->so.result != 0 && op->why[0] == '\0')
        snprintf(op->why, sizeof op->why, "%s", cps__why_latest());
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
    d->op.so.kind = op->so.kind;
    d->op.so.step = op->so.step;
    d->op.so.noagg = op->so.noagg;
    d->op.so.nparts = 1;
    d->op.grad = d->vals;
    d->op.parts = &d->part;
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

/* Decode a VALUES answer to part `part` of op into the caller's buffer. */
static int take_values(cps_client *c, cps__op *op, uint32_t part, const cps__sess_action *a)
{
    const cps__part *p = &op->parts[part];
    cps__kv kv;
    int err = cps__wire_kv_decode(a->payload, a->len, 1, &kv);
    if (err == 0 && (kv.nkeys != p->nkeys || kv.nvals != p->nvals))
        err = CPS_EPROTO;
    for (uint32_t j = 0; err == 0 && j < p->nkeys; j++)
        if (kv.keys[j] != p->keys[j] || kv.lens[j] != p->lens[j])
            err = CPS_EPROTO;
    /* Copied already, by the check that let the reply in (take_checked_values). */
    int placed = c->placed_op == op && c->placed_part == part;
    if (err == 0 && op->out && placed)
        c->stats.pull_bytes += kv.nvals * sizeof(float);
    if (err == 0 && op->out && !placed) {
        const float *src = kv.vals;
        for (uint32_t j = 0; j < p->nkeys; j++) {
            memcpy(op->out + p->src_off[j], src, (size_t)p->lens[j] * sizeof(float));
            src += p->lens[j];
        }
        c->stats.pull_bytes += kv.nvals * sizeof(float);
    }
    if (err != 0)
        cps__log(CPS_LOG_ERROR, "worker", "reply from server %u does not match the request", a->to);
    return err;
}

/* A payload's text (an error reply's, a refusal's) for the log: at most 199 bytes. */
static void text_of(const cps__sess_action *a, char *text, size_t cap)
{
    size_t n = a->len < cap - 1 ? a->len : cap - 1;
    if (n)
        memcpy(text, a->payload, n);
    text[n] = 0;
}

/* Perform what the last call into the session decided, in its order. */
static void perform(cps_client *c)
{
    const cps__sess_action *acts;
    size_t n = cps__sess_output(c->sess, &acts);
    for (size_t k = 0; k < n; k++) {
        const cps__sess_action *a = &acts[k];
        cps__op *op = op_of(a->op);
        char text[200];
        switch (a->kind) {
        case CPS_SS_SEND: {
            if (a->why == CPS_RQ_WHY_TIMEOUT)
                cps__log(CPS_LOG_DEBUG, "worker",
                         "request %llu on range %u unanswered after %u ms; re-sending",
                         (unsigned long long)a->seq, a->range, c->cfg.request_timeout_ms);
            int rc = req_send(c, a);
            if (rc != 0 && a->why == CPS_RQ_WHY_NEW)
                /* Not sent now (peer queue full, ...): the retry timer sends it again. */
                cps__log(CPS_LOG_DEBUG, "worker", "request to range %u deferred: %s", a->range,
                         cps_strerror(rc));
            cps__sess_sent(c->sess, a->index, rc, cps__now_ms());
            break;
        }
        case CPS_SS_SCHED: {
            cps__msg_hdr h = a->hdr;
            cps__msg_send(c->tp, SCHED_PEER, &h, a->payload, a->len);
            break;
        }
        case CPS_SS_PEER: {
            int rc = cps__tp_peer_set(c->tp, a->to, a->addr);
            if (rc != 0)
                cps__log(CPS_LOG_WARN, "worker", "cannot reach server %u at %s: %s", a->to, a->addr,
                         cps_strerror(rc));
            break;
        }
        case CPS_SS_VIEW:
            if (!a->first)
                cps__log(CPS_LOG_INFO, "worker",
                         "view epoch %llu installed; re-sending %u requests",
                         (unsigned long long)a->epoch, a->count);
            break;
        case CPS_SS_ANSWER:
            if (a->type == CPS_MSG_VALUES) {
                int err = take_values(c, op, a->part, a);
                if (err != 0) {
                    cps__sess_op_fail(&op->so, err);
                    note_why(op);
                }
            }
            if (a->late)
                c->stats.late_pushes++;
            break;
        case CPS_SS_REFUSED:
            text_of(a, text, sizeof text);
            cps__log(CPS_LOG_ERROR, "worker", "server %u refused a request on range %u: %s (%s)",
                     a->to, a->range, cps_strerror(a->status), text);
            note_why(op);
            break;
        case CPS_SS_DONE:
            break; /* its caller sees so.pending at 0 */
        case CPS_SS_WAIT_REPLICA:
            cps__log(CPS_LOG_WARN, "worker",
                     "range %u has no live replica; waiting up to %u ms for one", a->range,
                     c->cfg.unavailable_timeout_ms);
            break;
        case CPS_SS_GIVE_UP:
            cps__log(CPS_LOG_ERROR, "worker", "range %u unavailable for %u ms: failing the request",
                     a->range, c->cfg.unavailable_timeout_ms);
            note_why(op);
            if (a->detach) {
                /* Its number must still reach the head, or it drops our later pushes on the
                 * range as a gap (see cps__reqs_detach): keep sending a copy. */
                detached_push *d = detach_copy(c, op, a->part);
                if (!d)
                    cps__log(
                        CPS_LOG_ERROR, "worker",
                        "no memory to keep push %llu on range %u: later pushes on it may stall",
                        (unsigned long long)a->seq, a->range);
                cps__sess_detach(c->sess, a->index, d ? &d->op.so : NULL, 0);
            }
            break;
        case CPS_SS_RELEASE:
            /* A push given up earlier, answered at last: its caller has long had its error. */
            if (a->status != 0)
                cps__log(CPS_LOG_WARN, "worker",
                         "server %u refused push %llu given up on range %u: %s", a->to,
                         (unsigned long long)a->seq, a->range, cps_strerror(a->status));
            detached_done(c, op);
            break;
        case CPS_SS_EXPELLED:
            /* Its text says why ("job is full", "the job has ended"). */
            text_of(a, text, sizeof text);
            cps__log(CPS_LOG_ERROR, "worker", "the scheduler refused us: %s%s%s%s",
                     cps_strerror(a->status), text[0] ? " (" : "", text, text[0] ? ")" : "");
            break;
        case CPS_SS_SUSPECTS:
            /* Only the scheduler's probe decides (a head may hold our push for a slow worker's
             * gradient); we only say where we wait. */
            cps__msg_report_suspects(c->tp, c->id, c->view, a->evidence_ms, cps__sess_waiting,
                                     c->sess, cps__now_ms());
            break;
        }
    }
}

/* Start every request of op. On failure the requests already sent stay in flight and complete
 * normally; the op records the error. */
static int op_start(cps_client *c, cps__op *op, cps__sess_clock *clock, int mark_first)
{
    op->client = c;
    op->why[0] = '\0';
    cps__sess_begin(c->sess, &op->so, clock, mark_first);
    for (uint32_t i = 0; i < op->so.nparts; i++) {
        const cps__part *p = &op->parts[i];
        /* The key set's name: in sync mode a step's push of it must not overtake the push of
         * an earlier step (cps__reqs_add_ordered). */
        uint64_t keyset = p->nkeys ? cps__hash64(p->keys, p->nkeys * 8) | 1 : 0;
        int rc = cps__sess_add(c->sess, &op->so, i, p->range, keyset, cps__now_ms());
        perform(c);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Run the loop until op completes or the deadline passes. */
static int op_wait(cps_client *c, cps__op *op, int timeout_ms)
{
    uint64_t deadline = timeout_ms < 0 ? UINT64_MAX : cps__now_ms() + (uint64_t)timeout_ms;
    int result = 0;
    while (!cps__sess_op_over(c->sess, &op->so, &result)) {
        uint64_t now = cps__now_ms();
        if (now >= deadline)
            return CPS_ETIMEDOUT;
        uint64_t left = deadline - now;
        int rc = progress(c, left > 50 ? 50 : (int)left);
        if (rc < 0)
            return rc;
    }
    return result;
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
    if (rx.hdr.type == CPS_MSG_COLL) {
        /* Worker to worker (collective.c): no part of the session's protocol. */
        cps__ar_on_msg(c, &rx);
        cps__rx_free(&rx);
        return;
    }
    if (rx.hdr.type == CPS_MSG_LOCAL) {
        /* An exporter asks for the local tensors (localset.c). */
        cps__lset_on_msg(c, &rx);
        cps__rx_free(&rx);
        return;
    }
    rc = cps__sess_step(c->sess, &rx.hdr, rx.payload, rx.len, cps__now_ms());
    if (rc != 0)
        cps__log(CPS_LOG_WARN, "worker", "message type %u from node %u dropped: %s", rx.hdr.type,
                 rx.hdr.sender, cps_strerror(rc));
    c->id = cps__sess_id(c->sess);
    perform(c); /* before rx is freed: answers borrow its payload */
    cps__rx_free(&rx);
    cps__ar_on_view(c); /* a new view re-forms the all-reduce ring (no-op otherwise) */
}

/* Where the values of a reply to part p lie in its payload (`pl`, `plen` bytes, not yet
 * authenticated) and whether they go to the caller's buffer in one piece: 0 and the span
 * (*at, *n bytes) when the payload is exactly the kv payload p asked for (its keys and lengths)
 * and p's keys are contiguous in the caller's buffer; -1 otherwise. */
static int values_span(const cps__part *p, const unsigned char *pl, size_t plen, size_t *at,
                       size_t *n)
{
    size_t pre = cps__wire_kv_size(p->nkeys, 0);
    if (p->nkeys == 0 || plen != cps__wire_kv_size(p->nkeys, p->nvals) ||
        cps__le32_get(pl) != p->nkeys || cps__le32_get(pl + 4) != p->nvals)
        return -1;
    for (uint32_t j = 0; j < p->nkeys; j++) {
        if (cps__le64_get(pl + 8 + 8 * (size_t)j) != p->keys[j] ||
            cps__le32_get(pl + 8 + 8 * (size_t)p->nkeys + 4 * (size_t)j) != p->lens[j])
            return -1;
        if (j && p->src_off[j] != p->src_off[j - 1] + p->lens[j - 1])
            return -1;
    }
    *at = pre;
    *n = (size_t)p->nvals * sizeof(float);
    return 0;
}

/* A VALUES reply over tcp (transport.h, cps__tp_defer_check): its MAC is checked while its
 * values are copied into the caller's buffer, one pass over them instead of the transport's
 * check and then take_values' copy. Nothing but where the copy goes is read before the check:
 * the session is asked (purely) which part the reply would answer, and the payload must be
 * exactly that part's. A reply that is not such a one is declined (the transport checks it and
 * it goes through handle_msg as any message). A refused one is dropped like a lost reply: the
 * session never saw it, so the request is re-sent at its timeout. Its bytes may by then be in
 * the caller's buffer (cps_pull says so): the answer that completes the part writes it all. */
static void take_checked_values(void *ctx, cps__tp_pending *m)
{
    cps_client *c = ctx;
    size_t len;
    const unsigned char *b = cps__tp_pending_peek(m, &len);
    cps__msg_hdr h;
    cps__sess_op *so;
    uint32_t part;
    size_t at, n;
    if (cps__wire_hdr_decode(b, len, &h) != 0 || (h.flags & CPS_WF_SNAPPY) ||
        !cps__sess_values_target(c->sess, &h, &so, &part))
        return;
    cps__op *op = op_of(so);
    const cps__part *p = &op->parts[part];
    if (!op->out || values_span(p, b + CPS_WIRE_HDR_SIZE, h.payload_len, &at, &n) != 0)
        return;
    int rc = cps__tp_pending_open_copy(m, CPS_WIRE_HDR_SIZE + at, op->out + p->src_off[0], n);
    if (rc != 0) {
        /* CPS_EINVAL (cannot be: the span is inside the message): copied nothing, declined. */
        c->stats.values_refused += rc == CPS_EPROTO;
        return;
    }
    void *buf;
    if (cps__tp_pending_take(m, &buf, &len) != 0)
        return;
    c->placed_op = op;
    c->placed_part = part;
    handle_msg(c, buf, len);
    c->placed_op = NULL;
}

/* One turn of the loop: receive what has arrived (waiting up to timeout_ms, or less if the
 * session's next timer is due sooner), then let the session act on the time. */
static int progress(cps_client *c, int timeout_ms)
{
    uint64_t now = cps__now_ms();
    uint64_t due = cps__sess_deadline(c->sess, now);
    if (due - now < (uint64_t)timeout_ms)
        timeout_ms = (int)(due - now);
    int n = cps__loop_run_once(c->loop, timeout_ms);
    if (n < 0)
        return n;
    cps__sess_tick(c->sess, cps__now_ms());
    perform(c);
    cps__ar_tick(c);
    return 0;
}

int cps__client_progress(cps_client *c, int timeout_ms)
{
    return progress(c, timeout_ms);
}

/* Make a call to the scheduler (recovery/session.h: cps__sess_call) and run the loop until it
 * is over, `turn_ms` at a time. Returns its result, or the loop's error. */
static int sched_call(cps_client *c, uint8_t type, const void *payload, size_t n, int turn_ms)
{
    int rc = cps__sess_call(c->sess, type, payload, n, cps__now_ms());
    perform(c);
    int result = 0;
    while (rc == 0 && !cps__sess_call_done(c->sess, &result))
        rc = progress(c, turn_ms);
    return rc < 0 ? rc : result;
}

/* ---- open / close ---- */

static int join(cps_client *c)
{
    char payload[16 + CPS_ADDR_MAX];
    size_t n = cps__hello_encode(payload, sizeof payload, CPS_ROLE_WORKER, c->cfg.rank, 0, c->addr);
    /* Over with our WELCOME, not just any view: a worker joining a running job is in the view
     * the scheduler publishes to everyone as it admits it, which can arrive first. */
    int rc = sched_call(c, CPS_MSG_HELLO, payload, n, 100);
    if (rc == CPS_ETIMEDOUT)
        cps__log(CPS_LOG_ERROR, "worker",
                 "the job did not start within %.1f s (scheduler %s:%u unreachable, or not "
                 "every server and worker arrived)",
                 c->cfg.join_timeout_ms / 1000.0, c->cfg.sched_host, c->cfg.sched_port);
    if (rc == CPS_EPROTO)
        cps__log(CPS_LOG_ERROR, "worker", "the view does not list us as a worker");
    if (rc < 0)
        return rc;
    c->rank = cps__sess_rank(c->sess);
    return 0;
}

static void client_free(cps_client *c)
{
    cps__heartbeat_stop(c->hb);
    cps__ar_free(c);
    cps__lset_free(c);
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
    cps__sess_destroy(c->sess);
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
    uint16_t port = 0;
    cps__sess_config scfg = {.request_timeout_ms = cfg.request_timeout_ms,
                             .unavailable_timeout_ms = cfg.unavailable_timeout_ms,
                             .retry_ms = EAGAIN_RETRY_MS,
                             .view_ask_min_ms = VIEW_ASK_MIN_MS,
                             .hello_retry_ms = HELLO_RETRY_MS,
                             .join_timeout_ms = cfg.join_timeout_ms,
                             .bye_wait_ms = BYE_WAIT_MS,
                             .dead_after_ms = cfg.dead_after_ms};
    int rc = cps__sess_create(&scfg, &c->sess);
    if (rc != 0) {
        pthread_mutex_destroy(&c->lock);
        free(c);
        return rc;
    }
    c->view = cps__sess_view(c->sess);
    if (rc == 0)
        rc = cps__node_load_secret(&c->cfg, "worker");
    if (rc == 0)
        rc = cps__tp_create(cps__node_key(&c->cfg), &c->tp);
    if (rc == 0)
        rc = cps__tp_bind(c->tp, cfg.bind_host, cfg.port, &port);
    if (rc == 0)
        rc = cps__loop_create(&c->loop);
    if (rc == 0)
        cps__tp_defer_check(c->tp, CPS_MSG_VALUES, take_checked_values, c);
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
             c->view->num_workers, c->view->num_servers, (unsigned long long)c->view->epoch);
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
    while (!cps__sess_settled(c->sess) && cps__now_ms() < deadline)
        progress(c, 50);
    result = cps__sess_leave_result(c->sess);
    unsigned char stats[CPS_STATS_SIZE];
    cps__node_stats ns = {0};
    ns.push_raw_bytes = c->stats.push_raw_bytes;
    ns.push_wire_bytes = c->stats.push_wire_bytes;
    ns.pull_bytes = c->stats.pull_bytes;
    cps__stats_encode(stats, &ns);
    /* Unanswered within BYE_WAIT_MS, or the job over: we leave all the same. */
    sched_call(c, CPS_MSG_BYE, stats, sizeof stats, 50);
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
    return c ? (int)c->view->num_workers : 0;
}

int cps_num_servers(const cps_client *c)
{
    return c ? (int)c->view->num_servers : 0;
}

int cps_mode_get(const cps_client *c, cps_mode *mode, uint32_t *staleness)
{
    cps__why_clear();
    if (!c || !mode)
        return CPS_EINVAL;
    *mode = (cps_mode)c->view->mode;
    if (staleness)
        *staleness = c->view->mode == CPS_MODE_SSP ? c->view->ssp_bound : 0;
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
    for (uint32_t i = 0; i < op->so.nparts; i++)
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

int cps__client_run(cps_client *c, cps__op *op, cps__sess_clock *clock, int mark_first, int wait)
{
    int rc = op_start(c, op, clock, mark_first);
    if (rc != 0 && op->so.pending == 0)
        return rc;
    if (!wait)
        return 0;
    return op_wait(c, op, -1);
}

int cps__client_wait(cps_client *c, cps__op *op, int timeout_ms)
{
    return op_wait(c, op, timeout_ms);
}

/* A call to the scheduler that waits on the others (a registration, a barrier). */
static int ask_scheduler(cps_client *c, uint8_t type, const void *payload, size_t n)
{
    int rc = sched_call(c, type, payload, n, 50);
    if (rc == CPS_ESCHEDULER)
        cps__log(CPS_LOG_ERROR, "worker",
                 "the scheduler has not answered for %.1f s (CHAINPS_UNAVAILABLE_TIMEOUT_MS, "
                 "at least 3 request timeouts): giving up",
                 cps__sess_sched_gone_ms(c->sess) / 1000.0);
    return rc;
}

int cps__client_register(cps_client *c, const cps__tensor_desc *d)
{
    unsigned char payload[512];
    size_t n = cps__wire_tensor_desc_encode(payload, sizeof payload, d);
    if (n == 0)
        return CPS_EINVAL;
    return ask_scheduler(c, CPS_MSG_REGISTER, payload, n);
}

int cps__client_barrier(cps_client *c)
{
    return ask_scheduler(c, CPS_MSG_BARRIER, NULL, 0);
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
    cps__heartbeat_publish(c->hb, 1, c->id, c->view->epoch, &ns, cps__now_ms());
}
