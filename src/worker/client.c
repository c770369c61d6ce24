/* The worker client's core: turns push/pull calls into one request per key range, and blocks
 * each call until its operation is over. What to send where, when to send it again and when to
 * give up is the session's (recovery/session.h); this file steps the session and performs its
 * output: encoding, compression, sockets, logging. The all-reduce (collective.c) and the local
 * tensors (localset.c) run on it, and it names neither: worker.c opens the client, hands each
 * message to its part, and wires the all-reduce's timeouts in as c->on_turn. */
#include "client.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/codec.h"
#include "core/log.h"
#include "node/msg.h"

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
    cps__op *op = cps__op_of(a->op);
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

void cps__client_perform(cps_client *c)
{
    const cps__sess_action *acts;
    size_t n = cps__sess_output(c->sess, &acts);
    for (size_t k = 0; k < n; k++) {
        const cps__sess_action *a = &acts[k];
        cps__op *op = cps__op_of(a->op);
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
        cps__client_perform(c);
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
    cps__client_perform(c);
    if (c->on_turn)
        c->on_turn(c);
    return 0;
}

int cps__client_progress(cps_client *c, int timeout_ms)
{
    return progress(c, timeout_ms);
}

int cps__client_call(cps_client *c, uint8_t type, const void *payload, size_t n, int turn_ms)
{
    int rc = cps__sess_call(c->sess, type, payload, n, cps__now_ms());
    cps__client_perform(c);
    int result = 0;
    while (rc == 0 && !cps__sess_call_done(c->sess, &result))
        rc = progress(c, turn_ms);
    return rc < 0 ? rc : result;
}

/* ---- open / close ---- */

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

/* ---- close: what cps_close (worker.c) frees after the parts that run on this core ---- */

void cps__client_destroy(cps_client *c)
{
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
    int rc = cps__client_call(c, type, payload, n, 50);
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
