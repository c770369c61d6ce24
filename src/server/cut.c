/* Checkpoints on the server side: consistent read views ("cuts") for export, and PUT for restore.
 *
 * Export. A checkpoint tool asks each range's tail (in sync jobs: every replica, see may_cut) for
 * a cut (CUT_OPEN) at a training step T: the replica opens an LMDB read transaction at the moment
 * the range holds exactly the state after
 * step T — every sync key set of the range applied T and none applied T + 1 — which is at once
 * if the range is there, or right after the commit that brings it there (checked after every
 * applied update, on the event loop, so no later update can slip in between). T = 0 means now
 * (async and SSP jobs: the cut is the range's current sequence number). A range already past T
 * answers CPS_EPAST with its step, and the tool tries a later step.
 *
 * The transaction is handed to a thread of its own, with its own socket, which answers the
 * tool's CUT_READs until CUT_CLOSE (or an idle timeout): training goes on meanwhile, and the
 * event loop never waits for the tool. While a cut is open LMDB cannot reuse the pages that
 * updates free, so a probe first grows the map to leave room (cps__store_ensure_room).
 *
 * CUT_READ payload: u64 key_lo, u64 key_hi, u32 slot (0: values, 1..k: optimizer state slot
 * k-1), u32 0, u64 first, u64 count. Reads elements first..first+count-1 of `slot` of every key
 * key_lo..key_hi (each must exist). Reply (CUT_READ | REPLY): u32 nkeys, u32 0,
 * u64 opt_step[nkeys], u32 len[nkeys], zero pad to 8, f32 values[nkeys * count].
 *
 * Restore. PUT carries records (create + slices, src/server/transfer.c) for one range to its
 * head, which checks them against the store without writing, then replicates them through the chain
 * as one CPS_UPD_PUT update and answers with the range's sequence number: once the tail reports
 * that number (CUT_PROBE), every replica holds the records.
 * PUT payload: u32 hello_len, u32 0, hello (the tool's inbox), zero pad to 8, entries. */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "core/log.h"
#include "node/roles.h"
#include "optim/optim.h"
#include "replication/cut_view.h"
#include "entries.h"
#include "server.h"

#define CUT_IDLE_MS   60000        /* an open cut nobody reads is closed after this */
#define CUT_READ_MAX  (256u << 20) /* bytes of values in one reply */
#define CUT_READ_KEYS (1u << 20)
#define TOOL_PEER     1u

typedef struct cut_job {
    struct cut_job *next;
    uint64_t id;
    uint32_t range;
    uint64_t step;    /* the wanted boundary; 0: now */
    uint64_t req_seq; /* the tool's request number, echoed */
    char tool[CPS_ADDR_MAX];
    int open; /* the thread runs */
    /* thread side */
    pthread_t thread;
    atomic_int stop, done; /* set by one thread, read by the other */
    cps__txn *txn;
    uint64_t seq, at_step;
    uint32_t self;
    uint64_t epoch;
    char bind_host[CPS_ADDR_MAX], advertise_host[CPS_ADDR_MAX];
    unsigned char key[32]; /* the job's, for the thread's own transport */
    int keyed;
} cut_job;

/* ---- the steps of a range's sync key sets ---- */

static int agg_one(void *arg, const char *name, const void *val, size_t len)
{
    (void)name;
    cps__cut_span *a = arg;
    if (len != 8)
        return 0;
    uint64_t v = cps__le64_get(val);
    a->lo = a->n == 0 || v < a->lo ? v : a->lo;
    a->hi = a->n == 0 || v > a->hi ? v : a->hi;
    a->n++;
    return 0;
}

typedef struct span_io {
    uint32_t range;
    cps__cut_span span;
} span_io;

static int span_txn(cps__txn *txn, void *arg)
{
    span_io *io = arg;
    char prefix[32];
    snprintf(prefix, sizeof prefix, "agg/%" PRIu32 "/", io->range);
    int rc = cps__store_meta_scan(txn, prefix, agg_one, &io->span);
    cps__range_meta meta;
    if (rc == 0 && (rc = cps__store_range_get(txn, io->range, &meta)) == 0) {
        io->span.seq = meta.seq;
        io->span.step = meta.step;
    }
    return rc;
}

/* The range as the store holds it, in one read transaction (replication/cut_view.h). */
static int range_span(cps__server *s, uint32_t range, cps__cut_span *sp)
{
    span_io io;
    memset(&io, 0, sizeof io);
    io.range = range;
    int rc = cps__store_read(s->store, span_txn, &io);
    *sp = io.span;
    return rc;
}

/* ---- replies from the event loop ---- */

/* The temporary peer id to answer a tool's request at (the hello, hlen bytes, names its
 * inbox), or 0 (logged) if the request is malformed. */
static uint32_t tool_peer(cps__server *s, const cps__rx *rx, const void *hello, size_t hlen,
                          char addr[CPS_ADDR_MAX])
{
    uint32_t peer;
    if (cps__temp_peer_from_hello(&s->temps, s->tp, hello, hlen, cps__now_ms(), &peer, addr) != 0)
        cps__log(CPS_LOG_WARN, "server", "malformed checkpoint request (type %u) dropped",
                 rx->hdr.type);
    return peer;
}

static void tool_reply(cps__server *s, uint32_t peer, const cps__msg_hdr *req, int status,
                       uint64_t step, uint64_t seq, uint64_t aux, const char *text)
{
    cps__msg_hdr h = {0};
    h.type = status ? CPS_MSG_ERROR : req->type;
    h.flags = CPS_WF_REPLY;
    h.sender = s->id;
    h.status = status;
    h.epoch = s->view.epoch;
    h.range = req->range;
    h.req_worker = req->req_worker;
    h.req_seq = status ? req->req_seq : seq;
    h.step = step;
    h.aux = aux;
    if (status) {
        /* An error names the request by its number; the step and aux say where the range is. */
        cps__log(CPS_LOG_INFO, "server", "checkpoint request (type %u, range %u) refused: %s%s%s",
                 req->type, req->range, cps_strerror(status), text ? ": " : "", text ? text : "");
    }
    cps__msg_send(s->tp, peer, &h, text, text ? strlen(text) : 0);
}

static int is_tail(const cps__server *s, uint32_t range)
{
    return s->replica && cps__replica_is_tail(s->replica, range);
}

/* Who opens a cut: replication/cut_view.h (any replica at a step boundary, recovery/cutroute.h;
 * the tail only for "now"). */
static int may_cut(const cps__server *s, uint32_t range, uint64_t step)
{
    return cps__cut_may_open(&s->view, s->id, is_tail(s, range), range, step);
}

static int cuts_open(const cps__server *s)
{
    for (const cut_job *j = s->cuts; j; j = j->next)
        if (j->open && !j->done)
            return 1;
    return 0;
}

/* Grow the map now, while no cut of ours pins it: a writer that had to grow it while a cut is
 * open would wait for the cut to close, and the event loop with it. */
static void make_room(cps__server *s)
{
    if (cuts_open(s))
        return;
    int rc = cps__store_ensure_room(s->store);
    if (rc != 0)
        cps__log(CPS_LOG_WARN, "server", "cannot grow the store ahead of a checkpoint: %s",
                 cps_strerror(rc));
}

/* ---- CUT_PROBE ---- */

void cps__server_on_cut_probe(cps__server *s, cps__rx *rx)
{
    char addr[CPS_ADDR_MAX];
    uint32_t peer = tool_peer(s, rx, rx->payload, rx->len, addr);
    if (!peer)
        return;
    const cps__msg_hdr *h = &rx->hdr;
    if (!cps__cut_holds(&s->view, s->id, h->range)) {
        tool_reply(s, peer, h, CPS_ESTALE_EPOCH, 0, 0, 0, "this server does not hold the range");
        return;
    }
    make_room(s);
    cps__cut_span sp;
    int rc = range_span(s, h->range, &sp);
    if (rc != 0) {
        tool_reply(s, peer, h, rc, 0, 0, 0, "store read failed");
        return;
    }
    tool_reply(s, peer, h, 0, sp.lo, sp.seq, sp.hi, NULL);
}

/* ---- the cut thread ---- */

static void thread_reply(cps__tp *tp, cut_job *j, const cps__msg_hdr *req, int type, int status,
                         void *payload_buf, size_t len)
{
    cps__msg_hdr h = {0};
    h.type = (uint8_t)(status ? CPS_MSG_ERROR : type);
    h.flags = CPS_WF_REPLY;
    h.sender = j->self;
    h.status = status;
    h.epoch = j->epoch;
    h.range = j->range;
    h.req_seq = req->req_seq;
    h.step = j->at_step;
    h.aux = j->id;
    if (payload_buf) {
        /* payload_buf came from cps__msg_alloc with this header's room in front */
        h.payload_len = (uint32_t)len;
        h.raw_len = (uint32_t)len;
        cps__wire_hdr_encode(payload_buf, &h);
        if (cps__tp_send(tp, TOOL_PEER, payload_buf, CPS_WIRE_HDR_SIZE + len) != 0)
            cps__tp_free(payload_buf);
        return;
    }
    cps__msg_send(tp, TOOL_PEER, &h, NULL, 0);
}

static void serve_read(cps__tp *tp, cut_job *j, const cps__rx *rx)
{
    cps__cut_read q;
    int bad = cps__cut_read_parse(rx->payload, rx->len, CUT_READ_MAX, CUT_READ_KEYS, &q);
    if (bad != 0) {
        thread_reply(tp, j, &rx->hdr, 0, bad, NULL, 0);
        return;
    }
    uint64_t nkeys = q.hi - q.lo + 1;
    size_t head = 8 + cps__pad8(nkeys * 12);
    size_t len = head + nkeys * q.count * sizeof(float);
    cps__msg_hdr h = {0};
    unsigned char *buf = cps__msg_alloc(&h, len);
    if (!buf) {
        thread_reply(tp, j, &rx->hdr, 0, CPS_ENOMEM, NULL, 0);
        return;
    }
    unsigned char *out = buf + CPS_WIRE_HDR_SIZE;
    memset(out, 0, head);
    cps__le32_put(out, (uint32_t)nkeys);
    float *vals = (float *)(void *)(out + head);
    int rc = 0;
    for (uint64_t i = 0; i < nkeys && rc == 0; i++) {
        cps__param_rec rec;
        rc = cps__store_param_get(j->txn, q.lo + i, &rec);
        if (rc != 0)
            break;
        uint32_t slots = (uint32_t)cps__optim_state_slots(rec.spec.opt_kind);
        if ((rc = cps__cut_read_fits(&q, slots, rec.len)) != 0)
            break;
        cps__le64_put(out + 8 + i * 8, rec.opt_step);
        cps__le32_put(out + 8 + nkeys * 8 + i * 4, rec.len);
        const float *src = q.slot == 0 ? rec.vals : rec.state + (size_t)(q.slot - 1) * rec.len;
        memcpy(vals + i * q.count, src + q.first, q.count * sizeof(float));
    }
    if (rc != 0) {
        cps__tp_free(buf);
        thread_reply(tp, j, &rx->hdr, 0, rc, NULL, 0);
        return;
    }
    thread_reply(tp, j, &rx->hdr, CPS_MSG_CUT_READ, 0, buf, len);
}

typedef struct thread_ctx {
    cut_job *job;
    cps__tp *tp;
    int closed, tool_gone;
    uint64_t last_ms;
} thread_ctx;

static void on_thread_msg(void *ctx, void *buf, size_t len)
{
    thread_ctx *t = ctx;
    cps__rx rx;
    if (cps__rx_parse(&rx, buf, len) != 0)
        return;
    int what = cps__cut_view_msg(rx.hdr.type, rx.hdr.aux, rx.hdr.range, t->job->id, t->job->range);
    if (what != CPS_CUT_IGNORE)
        t->last_ms = cps__now_ms();
    if (what == CPS_CUT_READ)
        serve_read(t->tp, t->job, &rx);
    else if (what == CPS_CUT_CLOSE)
        t->closed = 1;
    cps__rx_free(&rx);
}

static void *cut_thread(void *arg)
{
    cut_job *j = arg;
    thread_ctx t = {j, NULL, 0, 0, cps__now_ms()};
    uint16_t port = 0;
    char url[CPS_ADDR_MAX];
    int rc = cps__tp_create(j->keyed ? j->key : NULL, &t.tp);
    if (rc == 0)
        rc = cps__tp_bind(t.tp, j->bind_host, 0, &port);
    if (rc == 0)
        rc = cps__tp_peer_set(t.tp, TOOL_PEER, j->tool);
    if (rc == 0)
        rc = cps__make_url(url, j->advertise_host, port);
    if (t.tp) {
        /* The answer to CUT_OPEN: where to send the reads. */
        cps__msg_hdr req = {.type = CPS_MSG_CUT_OPEN, .req_seq = j->seq};
        size_t n = strlen(url) + 1;
        cps__msg_hdr h = {0};
        void *buf = rc == 0 ? cps__msg_alloc(&h, n) : NULL;
        if (buf)
            memcpy((char *)buf + CPS_WIRE_HDR_SIZE, url, n);
        thread_reply(t.tp, j, &req, CPS_MSG_CUT_OPEN, rc ? rc : (buf ? 0 : CPS_ENOMEM), buf, n);
        /* A view lives no longer than its exporter: a CUT_CLOSE can be lost (the exporter gives
         * a slow connection CLOSE_GRACE_MS at its exit, an answer can come after it closed the
         * cut, it can crash), and until the view ends the store cannot reuse the pages updates
         * free (a soak's views held on for 8 s after their export had finished). */
        while (rc == 0 && !t.closed && !j->stop && cps__now_ms() - t.last_ms < CUT_IDLE_MS &&
               !(t.tool_gone = cps__tp_peer_gone(t.tp, TOOL_PEER)))
            cps__tp_poll(t.tp, 20, on_thread_msg, &t, 0);
    }
    /* The read transaction first: a writer may be waiting for it (to grow the map). */
    cps__store_snapshot_end(j->txn);
    j->txn = NULL;
    if (t.tp) {
        if (j->stop && rc == 0) {
            /* Tell the exporter at once (req_seq UINT64_MAX: no request of its own). */
            cps__msg_hdr gone = {.type = CPS_MSG_CUT_READ, .req_seq = UINT64_MAX};
            thread_reply(t.tp, j, &gone, 0, CPS_EAGAIN, NULL, 0);
        }
        /* Let the last answers leave; briefly if the event loop is waiting for us. */
        uint64_t drain = cps__now_ms() + (j->stop ? 50 : 2000);
        while (cps__tp_queued(t.tp) > 0 && cps__now_ms() < drain)
            cps__tp_poll(t.tp, 20, NULL, NULL, 0);
        cps__tp_destroy(t.tp);
    }
    if (t.tool_gone)
        cps__log(CPS_LOG_INFO, "server",
                 "checkpoint read view %" PRIu64 " of range %u closed: its exporter (%s) is gone",
                 j->id, j->range, j->tool);
    else if (!t.closed && !j->stop)
        cps__log(CPS_LOG_WARN, "server",
                 "checkpoint read view %" PRIu64 " of range %u closed "
                 "after %d s without a request",
                 j->id, j->range, CUT_IDLE_MS / 1000);
    j->done = 1;
    return NULL;
}

static int open_cut(cps__server *s, cut_job *j, const cps__cut_span *sp)
{
    int rc = cps__store_snapshot_begin(s->store, &j->txn);
    if (rc != 0)
        return rc;
    j->seq = sp->seq;
    j->at_step = cps__cut_at_step(sp);
    j->self = s->id;
    j->epoch = s->view.epoch;
    snprintf(j->bind_host, sizeof j->bind_host, "%s", s->cfg.bind_host);
    j->keyed = s->cfg.secret_loaded;
    memcpy(j->key, s->cfg.secret_key, sizeof j->key);
    snprintf(j->advertise_host, sizeof j->advertise_host, "%s", s->cfg.advertise_host);
    if (pthread_create(&j->thread, NULL, cut_thread, j) != 0) {
        cps__store_snapshot_end(j->txn);
        j->txn = NULL;
        return CPS_ENOMEM;
    }
    j->open = 1;
    cps__cut_book_opened(&s->cut_book, j->id, j->range);
    cps__log(CPS_LOG_INFO, "server",
             "range %u: checkpoint read view %" PRIu64 " opened at step %" PRIu64
             ", sequence number %" PRIu64,
             j->range, j->id, j->at_step, j->seq);
    return 0;
}

static void drop_job(cps__server *s, cut_job *j)
{
    cps__cut_book_forget(&s->cut_book, j->id, j->range);
    for (cut_job **pp = &s->cuts; *pp; pp = &(*pp)->next)
        if (*pp == j) {
            *pp = j->next;
            break;
        }
    free(j);
}

/* Try to open pending cut j now. Returns 1 if it is settled (opened or refused). */
static int try_cut(cps__server *s, cut_job *j)
{
    cps__cut_span sp;
    int rc = range_span(s, j->range, &sp);
    int ready = rc ? rc : cps__cut_ready(j->step, &sp);
    if (ready == 0)
        return 0;
    if (ready == 1 && (rc = open_cut(s, j, &sp)) == 0)
        return 1;
    char addr[CPS_ADDR_MAX];
    snprintf(addr, sizeof addr, "%s", j->tool);
    uint32_t peer = cps__temp_peer_add(&s->temps, s->tp, addr, cps__now_ms());
    cps__msg_hdr req = {.type = CPS_MSG_CUT_OPEN, .range = j->range, .req_seq = j->req_seq};
    int err = ready == 1 ? rc : ready;
    if (peer)
        tool_reply(s, peer, &req, err, sp.hi, 0, j->id,
                   err == CPS_EPAST ? "the range is past that step" : "cannot open a read view");
    drop_job(s, j);
    return 1;
}

void cps__server_on_cut_open(cps__server *s, cps__rx *rx)
{
    char addr[CPS_ADDR_MAX];
    uint32_t peer = tool_peer(s, rx, rx->payload, rx->len, addr);
    if (!peer)
        return;
    const cps__msg_hdr *h = &rx->hdr;
    if (!may_cut(s, h->range, h->step)) {
        tool_reply(s, peer, h, CPS_ESTALE_EPOCH, 0, 0, h->aux,
                   h->step ? "this server does not hold the range" : "not the tail of the range");
        return;
    }
    int asked = cps__cut_book_ask(&s->cut_book, h->aux, h->range, cps__now_ms());
    if (asked == CPS_CUT_REPEAT)
        return;
    make_room(s);
    cut_job *j = asked == CPS_CUT_NEW ? calloc(1, sizeof *j) : NULL;
    if (!j) {
        if (asked == CPS_CUT_NEW)
            cps__cut_book_forget(&s->cut_book, h->aux, h->range);
        tool_reply(s, peer, h, CPS_ENOMEM, 0, 0, h->aux, "no memory");
        return;
    }
    j->id = h->aux;
    j->range = h->range;
    j->step = h->step;
    j->req_seq = h->req_seq;
    snprintf(j->tool, sizeof j->tool, "%s", addr);
    j->next = s->cuts;
    s->cuts = j;
    try_cut(s, j);
}

void cps__server_cuts_after_apply(cps__server *s, uint32_t range)
{
    for (cut_job *j = s->cuts, *next; j; j = next) {
        next = j->next;
        if (!j->open && j->range == range)
            try_cut(s, j);
    }
}

int cps__server_cuts_before_grow(void *ctx)
{
    cps__server *s = ctx;
    int n = 0;
    for (cut_job *j = s->cuts, *next; j; j = next) {
        next = j->next;
        if (!j->open)
            continue;
        j->stop = 1;
        pthread_join(j->thread, NULL);
        drop_job(s, j);
        n++;
    }
    /* INFO: this is the store's bound on what a view may pin (cps__store_room_target), working
     * as meant. Mostly the views closed are standbys whose replica is not being read; an export
     * that loses its reader reads from another replica or cuts again, and says so itself. */
    if (n)
        cps__log(CPS_LOG_INFO, "server",
                 "closed %d checkpoint read view(s): updates filled the store's room while "
                 "they were open (the export reads from another replica or is tried again)",
                 n);
    return n;
}

void cps__server_cuts_tick(cps__server *s, uint64_t now, int stop_all)
{
    /* A pending cut whose step did not come in time (the book says which): the tool asks
     * again. */
    uint64_t id;
    uint32_t range;
    while (cps__cut_book_expired(&s->cut_book, now, &id, &range))
        for (cut_job *j = s->cuts; j; j = j->next)
            if (j->id == id && j->range == range && !j->open) {
                drop_job(s, j);
                break;
            }
    for (cut_job *j = s->cuts, *next; j; j = next) {
        next = j->next;
        if (j->open) {
            if (stop_all)
                j->stop = 1;
            if (j->done || stop_all) {
                pthread_join(j->thread, NULL);
                drop_job(s, j);
            }
        } else if (cps__cut_pending_drop(&s->view, s->id, is_tail(s, j->range), j->range, j->step,
                                         stop_all)) {
            /* The tool asks again (at the new tail, if that moved). */
            drop_job(s, j);
        }
    }
}

/* ---- PUT ---- */

void cps__server_on_put(cps__server *s, cps__rx *rx)
{
    char addr[CPS_ADDR_MAX];
    size_t hlen, off;
    uint32_t peer = 0;
    if (cps__cut_put_hello(rx->payload, rx->len, &hlen) != 0)
        cps__log(CPS_LOG_WARN, "server", "malformed PUT dropped");
    else
        peer = tool_peer(s, rx, (const char *)rx->payload + 8, hlen, addr);
    if (!peer) {
        cps__rx_free(rx);
        return;
    }
    const cps__msg_hdr *h = &rx->hdr;
    if (cps__cut_put_entries(rx->len, hlen, h->range, s->view.nranges, &off) != 0) {
        tool_reply(s, peer, h, CPS_EPROTO, 0, 0, 0, "PUT without records");
        cps__rx_free(rx);
        return;
    }
    const unsigned char *entries = (const unsigned char *)rx->payload + off;
    size_t elen = rx->len - off;
    /* May we take it at all, first: a node no longer the head (or back with a wiped store)
     * would find a slice's key missing and refuse the records, where the tool must hear "not
     * head" / "busy" and stream the range again under the new view. */
    int v = cps__replica_put_verdict(s->replica, h->range);
    if (v != CPS_ADMIT_NEW) {
        tool_reply(s, peer, h, cps__cut_put_status(v), 0, 0, 0, "not admitted");
        cps__rx_free(rx);
        return;
    }
    /* Check every record before the chain counts the update as applied: a failure while
     * applying it would leave the replica poisoned. */
    char why[200];
    int rc = cps__server_check_put(s, h->range, entries, elen, why, sizeof why);
    if (rc != 0) {
        tool_reply(s, peer, h, rc, 0, 0, 0, why);
        cps__rx_free(rx);
        return;
    }
    /* The body must be 8-byte aligned: the entries start at an 8-byte offset of the payload. */
    v = cps__replica_put(s->replica, h->range, h->req_seq, entries, elen, cps__now_ms());
    cps__server_perform(s);
    if (v != CPS_ADMIT_NEW) {
        tool_reply(s, peer, h, cps__cut_put_status(v), 0, 0, 0, "not admitted");
        cps__rx_free(rx);
        return;
    }
    cps__cut_span sp;
    if (rc == 0)
        rc = range_span(s, h->range, &sp);
    if (rc != 0)
        tool_reply(s, peer, h, rc, 0, 0, 0, "submit failed");
    else
        tool_reply(s, peer, h, 0, 0, sp.seq, h->aux, NULL);
    cps__rx_free(rx);
}
