/* cps_allreduce: the worker's shell around the ring state machine (replication/collective.h).
 *
 * Wire (CPS_MSG_COLL, docs/collective.md): header epoch = the view epoch the ring was formed
 * under, req_seq = the collective's sequence number, step = message index (ring step * chunks +
 * chunk), range = kind (0 data, 1 result, 4 ask, 5 listen: collective.h), aux = the length,
 * req_worker = the sender; payload = the chunk's float32 values, little-endian, never compressed
 * (gradients do not compress, and the ring's latency is its cost). The transport has checked the
 * MAC already, except for an all-gather chunk over tcp:// with a key, whose MAC is checked as
 * its values are copied into the ring's buffer (cps__ar_on_pending). */
#include "worker/collective.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/allreduce.h"
#include "client.h"
#include "core/config.h"
#include "core/log.h"
#include "replication/collective.h"
#include "replication/ring_fetch.h"
#include "replication/ring_view.h"

struct cps_allreduce_handle {
    cps_client *c;
    float *buf;
    uint64_t len;
    int op;
    int started;
    int done;
    int result;
    char why[CPS__WHY_MAX];
    struct cps_allreduce_handle *next;
};

/* Kinds beside the ring's (header `range`): a replacement asks a live worker for the buffer it
 * shares (aux = the length wanted, req_seq = the request's number), and the answer (the values,
 * step = the sharer's step, aux = the sequence number of the collective that follows the shared
 * state, status = CPS_ENOTFOUND / CPS_ESIZE when it cannot). The shell answers
 * them itself: they are no part of a collective. */
#define KIND_STATE_REQ 2u
#define KIND_STATE     3u
/* A part of the answer to a request in parts (header step has CPS_FETCH_IN_PARTS; the part's
 * layout is replication/ring_fetch.h's): what this shell asks for, so the result always travels. */
#define KIND_STATE_PART 6u

struct cps__ar {
    cps__coll *coll;
    uint32_t nmembers;
    int joiner;  /* this worker took the rank of a dead one (decided at the first view) */
    int fetched; /* a fetch of ours brought a state */
    const float *share_buf;
    uint64_t share_len, share_step;
    uint64_t share_seq;   /* the ring's last collective when the buffer was shared */
    uint64_t share_gen;   /* grows with every share: names the answer's parts (ring_fetch.h) */
    uint64_t part_values; /* values per part of our answers (CHAINPS_FETCH_PART) */
    cps__fetch_served served[CPS_FETCH_SERVED_ASKERS]; /* the windows last sent to askers */
    /* a fetch (replication/ring_fetch.h decides; fetch_buf receives the values, fetch_res the
     * result that follows them in an answer in parts) */
    cps__fetch fetch;
    float *fetch_buf, *fetch_res;
    uint64_t fetch_res_cap;
    uint64_t epoch_fed; /* the view epoch given to the ring */
    cps_allreduce_handle *head, *tail;
    uint64_t bytes_sent;
    uint32_t *members;
    uint32_t cap;
    uint64_t view_asked_ms;
    /* Ring chunks refused on the check-while-copying path: logged at most once a second (an
     * outsider's forgeries must not flood the log), with how many went unlogged. */
    uint64_t lost_logged_ms, lost_unlogged;
};

static float *out_payload(void *ctx, uint32_t to, const cps__coll_msg *m);
static void out_written(void *ctx, float *payload, uint64_t done);

static int ar_get(cps_client *c, cps__ar **out)
{
    if (!c->ar) {
        cps__ar *a = calloc(1, sizeof *a);
        if (!a)
            return CPS_ENOMEM;
        /* No progress for the unavailable timeout: a worker's death is declared well before. */
        uint64_t timeout = c->cfg.unavailable_timeout_ms ? c->cfg.unavailable_timeout_ms : 30000;
        /* Values per message (default 256 Ki: 1 MiB), a tuning knob for benchmarks. A bad value
         * fails the call naming it rather than falling back to a default unnoticed. */
        const char *env = getenv("CHAINPS_ALLREDUCE_CHUNK");
        uint32_t chunk = 0;
        char err[160];
        int rc = 0;
        if (env && *env &&
            (rc = cps__config_parse_u32("CHAINPS_ALLREDUCE_CHUNK", env, 256, 1u << 26, &chunk, err,
                                        sizeof err)) != 0) {
            cps__log(CPS_LOG_ERROR, "allreduce", "%s", err);
            free(a);
            return rc;
        }
        /* Values per part of a fetch answer: small values make every fetch come in parts (the
         * tests' knob); the default keeps a part at 4 MiB. */
        uint32_t part = 0;
        env = getenv("CHAINPS_FETCH_PART");
        if (env && *env &&
            (rc = cps__config_parse_u32("CHAINPS_FETCH_PART", env, 1, CPS_FETCH_PART_VALUES, &part,
                                        err, sizeof err)) != 0) {
            cps__log(CPS_LOG_ERROR, "allreduce", "%s", err);
            free(a);
            return rc;
        }
        a->part_values = part ? part : CPS_FETCH_PART_VALUES;
        rc = cps__coll_create(c->id, chunk, timeout, &a->coll);
        if (rc != 0) {
            free(a);
            return rc;
        }
        cps__coll_set_out(a->coll, out_payload, c);
        cps__coll_set_written(a->coll, out_written);
        c->ar = a;
        cps__ar_on_view(c);
    }
    *out = c->ar;
    return 0;
}

static void start_next(cps_client *c);

/* A peer is under a newer view than ours: ask the scheduler (node 0) for it, at most every
 * VIEW_ASK_MS (the session asks too when its requests are refused as stale). */
#define VIEW_ASK_MS 100
static void ask_view(cps_client *c)
{
    uint64_t now = cps__now_ms();
    if (now - c->ar->view_asked_ms < VIEW_ASK_MS)
        return;
    c->ar->view_asked_ms = now;
    cps__msg_hdr h = {.type = CPS_MSG_GET_VIEW, .sender = c->id, .epoch = c->view->epoch};
    cps__msg_send(c->tp, 0, &h, NULL, 0);
}

/* The ring's message m to `to`, reserved for it (header written, payload not): a chunk to a
 * same-host worker is then written once, into its shared-memory ring slot. NULL: no memory. */
static void *msg_reserve(cps_client *c, uint32_t to, const cps__coll_msg *m)
{
    cps__msg_hdr h = {.type = CPS_MSG_COLL,
                      .sender = c->id,
                      .epoch = m->epoch,
                      .req_worker = c->id,
                      .range = m->kind,
                      .req_seq = m->seq,
                      .step = m->index,
                      .aux = m->n};
    return cps__msg_reserve(c->tp, to, &h, m->count * sizeof(float));
}

/* The ring's out hook (cps__coll_set_out): a forwarded chunk is reduced or gathered straight
 * into its message's payload. The payload sits CPS_WIRE_HDR_SIZE (64) bytes into the buffer,
 * so it is float-aligned. */
static float *out_payload(void *ctx, uint32_t to, const cps__coll_msg *m)
{
    char *buf = msg_reserve(ctx, to, m);
    return buf ? (float *)(void *)(buf + CPS_WIRE_HDR_SIZE) : NULL;
}

/* The ring's written hook (cps__coll_set_written): payload[0, done) of out_payload's message is
 * final. cps__tp_fill of no bytes at its end MACs the bytes written since the last piece (the
 * header too, the first time) while the reduction has them in L1, where the message will be
 * sealed whole (tcp://, with a key); cps__tp_send then only finishes the tag. Elsewhere (ipc://,
 * --insecure) it does nothing. */
static void out_written(void *ctx, float *payload, uint64_t done)
{
    cps_client *c = ctx;
    cps__tp_fill(c->tp, (char *)payload - CPS_WIRE_HDR_SIZE,
                 CPS_WIRE_HDR_SIZE + done * sizeof(float), NULL, 0);
}

static void send_msg(cps_client *c, uint32_t to, const cps__coll_msg *m, int built)
{
    size_t bytes = m->count * sizeof(float);
    void *buf;
    if (built) {
        buf = (char *)(uintptr_t)m->vals - CPS_WIRE_HDR_SIZE; /* out_payload's buffer */
    } else if (!(buf = msg_reserve(c, to, m))) {
        cps__log(CPS_LOG_ERROR, "allreduce", "out of memory for a %zu-byte message", bytes);
        return; /* the collective times out rather than reducing without the chunk */
    } else if (bytes) {
        /* The copy carries the MAC where the message is sealed whole (cps__tp_fill). */
        if (cps__tp_fill(c->tp, buf, CPS_WIRE_HDR_SIZE, m->vals, bytes) != 0)
            memcpy((char *)buf + CPS_WIRE_HDR_SIZE, m->vals, bytes);
    }
    int rc = cps__tp_send(c->tp, to, buf, CPS_WIRE_HDR_SIZE + bytes);
    if (rc != 0) {
        cps__tp_unreserve(c->tp, buf);
        cps__log(CPS_LOG_WARN, "allreduce", "cannot send to worker %u: %s", to, cps_strerror(rc));
        return;
    }
    c->ar->bytes_sent += bytes;
}

static void perform(cps_client *c)
{
    cps__ar *a = c->ar;
    const cps__coll_act *act;
    size_t n = cps__coll_actions(a->coll, &act);
    int finished = 0;
    for (size_t i = 0; i < n; i++) {
        switch (act[i].kind) {
        case CPS_COLL_SEND:
            send_msg(c, act[i].to, &act[i].msg, act[i].built);
            break;
        case CPS_COLL_NEED_VIEW:
            ask_view(c);
            break;
        case CPS_COLL_DONE:
        case CPS_COLL_FAILED: {
            cps_allreduce_handle *h = a->head;
            if (!h || !h->started)
                break;
            a->head = h->next;
            if (!a->head)
                a->tail = NULL;
            h->done = 1;
            h->result = act[i].kind == CPS_COLL_DONE ? 0 : act[i].status;
            if (h->result != 0) {
                cps__log(CPS_LOG_ERROR, "allreduce",
                         "all-reduce %llu of %llu values failed under view epoch %llu: %s",
                         (unsigned long long)act[i].seq, (unsigned long long)h->len,
                         (unsigned long long)act[i].epoch, cps_strerror(h->result));
                snprintf(h->why, sizeof h->why, "%s", cps__why_latest());
            }
            finished = 1;
            break;
        }
        }
    }
    if (finished)
        start_next(c);
}

static void start_next(cps_client *c)
{
    cps__ar *a = c->ar;
    cps_allreduce_handle *h = a->head;
    if (!h || h->started)
        return;
    h->started = 1;
    uint64_t seq;
    int rc = cps__coll_start(a->coll, h->buf, h->len, h->op, cps__now_ms(), &seq);
    if (rc != 0) {
        a->head = h->next;
        if (!a->head)
            a->tail = NULL;
        h->done = 1;
        h->result = rc;
        start_next(c);
        return;
    }
    perform(c);
}

void cps__ar_on_view(cps_client *c)
{
    cps__ar *a = c->ar;
    const cps__view *v = c->view;
    /* A worker still joining may hear from the ring before its WELCOME names it: its ring then
     * waits (the pure object keeps the messages) until the id is known. */
    if (!a || c->id == 0 || v->epoch <= a->epoch_fed)
        return;
    cps__coll_set_me(a->coll, c->id);
    if (a->epoch_fed == 0 && cps__ring_replacement(v, c->id)) {
        /* A replacement: another worker held our rank and died. */
        a->joiner = 1;
        cps__coll_set_joining(a->coll);
    }
    if (a->cap < v->nnodes) {
        uint32_t *m = realloc(a->members, v->nnodes * sizeof *m);
        if (!m)
            return; /* the next view tries again; the ring waits on its timeout meanwhile */
        a->members = m;
        a->cap = v->nnodes;
    }
    uint32_t n = cps__ring_members(v, a->members, a->cap);
    for (uint32_t i = 0; i < n; i++) {
        const cps__node_info *w = cps__view_node(v, a->members[i]);
        if (w->id != c->id) {
            int rc = cps__tp_peer_set(c->tp, w->id, w->addr);
            if (rc != 0)
                cps__log(CPS_LOG_WARN, "allreduce", "cannot reach worker %u at %s: %s", w->id,
                         w->addr, cps_strerror(rc));
        }
    }
    for (uint32_t i = 0; i < v->nnodes; i++)
        if (cps__ring_gone(v, &v->nodes[i], c->id))
            cps__tp_peer_drop(c->tp, v->nodes[i].id);
    if (cps__coll_view(a->coll, v->epoch, a->members, n, v->num_workers > 1, cps__now_ms()) != 0)
        return;
    a->nmembers = n;
    a->epoch_fed = v->epoch;
    if (cps__coll_running(a->coll))
        cps__log(CPS_LOG_INFO, "allreduce", "view epoch %llu: the ring re-forms over %u workers",
                 (unsigned long long)v->epoch, n);
    perform(c);
}

/* A refusal's word: a replacement that never held a state says so, and an asker that finds
 * only such replacements alive knows nobody holds one (ring_fetch.h). */
static uint64_t refusal_step(const cps__ar *a, int status, int has_result)
{
    return cps__fetch_refusal_step(status, a->joiner, a->share_gen > 0 || a->fetched || has_result);
}

/* A replacement asks for our shared buffer: answer at once (we are inside a call, so the owner
 * is not writing it). The answer in parts, from the value the request names: every part carries the
 * answer's identity (ring_fetch.h), and the result always goes after the shared values. */
static void serve_parts(cps_client *c, const cps__msg_hdr *req)
{
    cps__ar *a = c->ar;
    cps__msg_hdr h = {.type = CPS_MSG_COLL,
                      .sender = c->id,
                      .epoch = c->view->epoch,
                      .req_worker = c->id,
                      .range = KIND_STATE_PART,
                      .req_seq = req->req_seq};
    const float *res = NULL;
    uint64_t rseq = 0, rn = 0, total = 0, from = req->step & ~CPS_FETCH_IN_PARTS;
    int has = cps__coll_last_result(a->coll, &rseq, &res, &rn);
    h.status = cps__fetch_serve_parts(a->share_buf ? a->share_len : 0, req->aux, a->share_seq, has,
                                      rseq, rn, from, &total);
    if (h.status != 0) {
        h.step = refusal_step(a, h.status, has);
        int rc = cps__msg_send(c->tp, req->sender, &h, NULL, 0);
        if (rc != 0)
            cps__log(CPS_LOG_WARN, "allreduce", "cannot answer worker %u's state request: %s",
                     req->sender, cps_strerror(rc));
        return;
    }
    h.step = a->share_step;
    h.aux = a->share_seq + 1; /* the collective that follows the shared state */
    cps__fetch_part p = {.gen = a->share_gen, .step = h.step, .next = h.aux, .total = total};
    uint64_t len = a->share_len, sent = 0, now = cps__now_ms();
    /* A re-ask from inside the window we are still sending that asker: those parts are queued
     * already, and another copy would only double what the asker's link carries. */
    if (!cps__fetch_serve_again(a->served, req->sender, a->share_gen, from, now))
        return;
    for (uint32_t k = 0; cps__fetch_part_at(from, total, a->part_values, CPS_FETCH_WINDOW, k,
                                            &p.off, &p.count, &p.last);
         k++) {
        size_t bytes = CPS_FETCH_PART_HDR + p.count * sizeof(float);
        char *buf = cps__msg_reserve(c->tp, req->sender, &h, bytes);
        if (!buf) {
            cps__log(CPS_LOG_WARN, "allreduce", "out of memory for a %zu-byte answer part", bytes);
            return; /* the asker asks again from the first value it lacks */
        }
        cps__fetch_part_encode(buf + CPS_WIRE_HDR_SIZE, &p);
        /* The part's values, straight from the shared state and the result into the message (the
         * MAC computed as they are copied, where the message is sealed whole). */
        uint64_t nstate, roff;
        cps__fetch_part_split(p.off, p.count, len, &nstate, &roff);
        size_t o = CPS_WIRE_HDR_SIZE + CPS_FETCH_PART_HDR;
        int rc = 0;
        if (nstate)
            rc = cps__tp_fill(c->tp, buf, o, a->share_buf + p.off, nstate * sizeof(float));
        if (rc == 0 && p.count > nstate)
            rc = cps__tp_fill(c->tp, buf, o + nstate * sizeof(float), res + roff,
                              (p.count - nstate) * sizeof(float));
        if (rc == 0)
            rc = cps__tp_send(c->tp, req->sender, buf, CPS_WIRE_HDR_SIZE + bytes);
        if (rc != 0) {
            cps__tp_unreserve(c->tp, buf);
            cps__log(CPS_LOG_WARN, "allreduce", "cannot answer worker %u's state request: %s",
                     req->sender, cps_strerror(rc));
            return;
        }
        sent += p.count;
    }
    cps__fetch_served_note(a->served, req->sender, a->share_gen, from, from + sent, now);
    cps__log(CPS_LOG_INFO, "allreduce",
             "sent values %llu..%llu of %llu (%llu shared, step %llu) to worker %u",
             (unsigned long long)from, (unsigned long long)(from + sent), (unsigned long long)total,
             (unsigned long long)len, (unsigned long long)h.step, req->sender);
}

/* An older asker's request: one message, the result only when both fit (ring_fetch.h). */
static void serve_state(cps_client *c, const cps__msg_hdr *req)
{
    cps__ar *a = c->ar;
    cps__msg_hdr h = {.type = CPS_MSG_COLL,
                      .sender = c->id,
                      .epoch = c->view->epoch,
                      .req_worker = c->id,
                      .range = KIND_STATE,
                      .req_seq = req->req_seq};
    const float *vals = NULL, *res = NULL;
    uint64_t n = 0, rseq = 0, rn = 0;
    int has = cps__coll_last_result(a->coll, &rseq, &res, &rn), with_result;
    h.status = cps__fetch_serve(a->share_buf ? a->share_len : 0, req->aux, a->share_seq, has, rseq,
                                rn, &with_result);
    h.step = refusal_step(a, h.status, has);
    if (h.status == 0) {
        vals = a->share_buf;
        n = a->share_len;
        h.step = a->share_step;
        h.aux = a->share_seq + 1; /* the collective that follows the shared state */
    }
    if (!with_result)
        rn = 0;
    int rc;
    if (rn == 0) {
        rc = cps__msg_send(c->tp, req->sender, &h, vals, n * sizeof(float));
    } else {
        /* The shared values, then the result: the asker knows the first length. */
        void *buf = cps__msg_alloc(&h, (n + rn) * sizeof(float));
        rc = CPS_ENOMEM;
        if (buf) {
            memcpy((char *)buf + CPS_WIRE_HDR_SIZE, vals, n * sizeof(float));
            memcpy((char *)buf + CPS_WIRE_HDR_SIZE + n * sizeof(float), res, rn * sizeof(float));
            rc =
                cps__tp_send(c->tp, req->sender, buf, CPS_WIRE_HDR_SIZE + (n + rn) * sizeof(float));
            if (rc != 0)
                cps__tp_free(buf);
        }
    }
    if (rc != 0)
        cps__log(CPS_LOG_WARN, "allreduce", "cannot answer worker %u's state request: %s",
                 req->sender, cps_strerror(rc));
    else
        cps__log(CPS_LOG_INFO, "allreduce", "sent %llu shared values (step %llu) to worker %u",
                 (unsigned long long)n, (unsigned long long)h.step, req->sender);
}

/* A fetch is complete: the ring's next collective, and the result of the one before it (if
 * sent: `rn` values): an older sharer sends neither, and the sequence is then guessed
 * (joining). */
static void adopt_fetched(cps_client *c, uint64_t next, const float *res, uint64_t rn)
{
    cps__ar *a = c->ar;
    int rc = cps__coll_set_next_seq(a->coll, next, a->head != NULL);
    if (rc != 0) {
        /* cps_allreduce_fetch refuses to start under a call, so this is not expected: say so
         * rather than leave the replacement guessing unnoticed. */
        cps__log(CPS_LOG_WARN, "allreduce", "the fetched sequence %llu is not taken: %s",
                 (unsigned long long)next, cps_strerror(rc));
        return;
    }
    perform(c);
    if (rn && cps__coll_adopt_result(a->coll, next - 1, res, rn) == 0)
        perform(c);
}

/* A part of the answer we asked for: copied where it belongs (the caller's buffer, then the
 * result's); nothing is adopted before the last part is in. */
static void on_part(cps_client *c, const cps__rx *rx)
{
    cps__ar *a = c->ar;
    const cps__msg_hdr *h = &rx->hdr;
    cps__fetch_part p = {0};
    const float *vals = NULL;
    p.step = h->step; /* a refusal's word (CPS_FETCH_NEVER_HELD); a part's decode sets it too */
    if (h->status == 0 &&
        cps__fetch_part_decode(rx->payload, rx->len, h->step, h->aux, &p, &vals) != 0) {
        cps__log(CPS_LOG_WARN, "allreduce", "malformed answer part from worker %u dropped",
                 h->sender);
        return;
    }
    if (!a->fetch_buf)
        return;
    uint64_t len = a->fetch.len;
    /* Room for the result before the part is taken, so a taken part is always stored; only for
     * a part of our fetch whose total we could hold (a forged or stray total grows nothing). */
    if (h->status == 0 && cps__fetch_part_wanted(&a->fetch, h->sender, h->req_seq, &p) &&
        p.total > len && a->fetch_res_cap < p.total - len) {
        float *r = realloc(a->fetch_res, (p.total - len) * sizeof(float));
        if (!r) {
            cps__log(CPS_LOG_WARN, "allreduce", "out of memory for a fetched result");
            return; /* asked again after the re-send delay */
        }
        a->fetch_res = r;
        a->fetch_res_cap = p.total - len;
    }
    if (!cps__fetch_part_take(&a->fetch, h->sender, h->req_seq, h->status, &p, cps__now_ms()))
        return;
    uint64_t nstate, roff;
    cps__fetch_part_split(p.off, p.count, len, &nstate, &roff);
    if (nstate)
        memcpy(a->fetch_buf + p.off, vals, nstate * sizeof(float));
    if (p.count > nstate)
        memcpy(a->fetch_res + roff, vals + nstate, (p.count - nstate) * sizeof(float));
    if (a->fetch.answered && a->fetch.result == 1)
        adopt_fetched(c, a->fetch.next, a->fetch_res, a->fetch.total - len);
}

/* A ring message; `placed`: its values are in the ring's buffer already (cps__coll_place). */
static void on_coll(cps_client *c, const cps__rx *rx, const float *placed)
{
    cps__ar *a;
    if (ar_get(c, &a) != 0)
        return;
    cps__ar_on_view(c); /* the WELCOME that named us may have come after the view */
    const cps__msg_hdr *h = &rx->hdr;
    if (rx->len % sizeof(float) != 0 || h->req_worker != h->sender) {
        cps__log(CPS_LOG_WARN, "allreduce", "malformed collective message from node %u dropped",
                 h->sender);
        return;
    }
    if (h->range == KIND_STATE_REQ) {
        /* Before our first view we do not know whether we replace a dead worker, so our refusal
         * would say the wrong thing: the asker asks again after CPS_FETCH_RESEND_MS. */
        if (a->epoch_fed == 0)
            return;
        if (h->step & CPS_FETCH_IN_PARTS)
            serve_parts(c, h);
        else
            serve_state(c, h);
        return;
    }
    if (h->range == KIND_STATE) {
        uint64_t count = rx->len / sizeof(float), len = a->fetch.len;
        if (a->fetch_buf &&
            cps__fetch_answer(&a->fetch, h->sender, h->req_seq, h->status, count, h->step)) {
            memcpy(a->fetch_buf, rx->payload, len * sizeof(float));
            adopt_fetched(c, h->aux, (const float *)rx->payload + len, count - len);
        }
        return;
    }
    if (h->range == KIND_STATE_PART) {
        on_part(c, rx);
        return;
    }
    cps__coll_msg m = {.from = h->sender,
                       .kind = h->range,
                       .epoch = h->epoch,
                       .seq = h->req_seq,
                       .index = h->step,
                       .n = h->aux,
                       .vals = placed ? placed : rx->payload,
                       .count = rx->len / sizeof(float)};
    cps__coll_step(a->coll, &m, cps__now_ms());
    perform(c);
}

void cps__ar_on_msg(cps_client *c, const cps__rx *rx)
{
    on_coll(c, rx, NULL);
}

void cps__ar_on_pending(cps_client *c, cps__tp_pending *pm)
{
    cps__ar *a;
    size_t len;
    const unsigned char *b = cps__tp_pending_peek(pm, &len);
    cps__msg_hdr h;
    if (ar_get(c, &a) != 0 || cps__wire_hdr_decode(b, len, &h) != 0 || (h.flags & CPS_WF_SNAPPY) ||
        h.req_worker != h.sender || h.range != CPS_COLL_DATA || h.payload_len % sizeof(float) != 0)
        return; /* declined: checked by the transport, then on_coll as any message */
    /* A newer view restarts the ring, which rewrites its buffer: taken before the place is
     * asked for, so nothing changes the ring between place and step (on_coll's call is then a
     * no-op). */
    cps__ar_on_view(c);
    cps__coll_msg m = {.from = h.sender,
                       .kind = h.range,
                       .epoch = h.epoch,
                       .seq = h.req_seq,
                       .index = h.step,
                       .n = h.aux,
                       .count = h.payload_len / sizeof(float)};
    float *dst = cps__coll_place(a->coll, &m);
    if (!dst)
        return;
    /* Refused (a forgery, a replay, a byte damaged on the path): the transport counted and
     * logged it; the span holds bytes that nothing reads before the genuine chunk rewrites them
     * (cps__coll_place). Nothing re-sends a chunk: if this was the genuine one, the ring gets its
     * result from a member that completed it (cps__coll_lost); if it was a forgery, the genuine
     * chunk still comes and the answers, the same bits, are dropped as stale. */
    if (cps__tp_pending_open_copy(pm, CPS_WIRE_HDR_SIZE, dst, h.payload_len) != 0) {
        uint64_t now = cps__now_ms();
        if (!a->lost_logged_ms || now - a->lost_logged_ms >= 1000) {
            cps__log(CPS_LOG_WARN, "allreduce",
                     "a ring chunk of all-reduce %llu (index %llu) was refused: asking the "
                     "members for its result (%llu more refused since the last such line)",
                     (unsigned long long)h.req_seq, (unsigned long long)h.step,
                     (unsigned long long)a->lost_unlogged);
            a->lost_logged_ms = now;
            a->lost_unlogged = 0;
        } else {
            a->lost_unlogged++;
        }
        cps__coll_lost(a->coll, now);
        perform(c);
        return;
    }
    void *buf;
    cps__rx rx;
    if (cps__tp_pending_take(pm, &buf, &len) != 0 || cps__rx_parse(&rx, buf, len) != 0)
        return;
    on_coll(c, &rx, dst);
    cps__rx_free(&rx);
}

void cps__ar_tick(cps_client *c)
{
    if (!c->ar)
        return;
    cps__ar_on_view(c);
    cps__coll_tick(c->ar->coll, cps__now_ms());
    perform(c);
}

void cps__ar_free(cps_client *c)
{
    cps__ar *a = c->ar;
    if (!a)
        return;
    while (a->head) {
        cps_allreduce_handle *h = a->head;
        a->head = h->next;
        free(h);
    }
    cps__coll_destroy(a->coll);
    free(a->members);
    free(a);
    c->ar = NULL;
}

/* ---- public API ---- */

static int enqueue(cps_client *c, float *buf, uint64_t len, cps_reduce_op op,
                   cps_allreduce_handle **out)
{
    if (!c || !buf || len == 0 || len >= (1ull << 32) ||
        (op != CPS_REDUCE_SUM && op != CPS_REDUCE_MEAN))
        return CPS_EINVAL;
    cps_allreduce_handle *h = calloc(1, sizeof *h);
    if (!h)
        return CPS_ENOMEM;
    h->c = c;
    h->buf = buf;
    h->len = len;
    h->op = op == CPS_REDUCE_MEAN ? CPS_COLL_MEAN : CPS_COLL_SUM;
    cps__ar *a;
    int rc = ar_get(c, &a);
    if (rc != 0) {
        free(h);
        return rc;
    }
    if (a->tail)
        a->tail->next = h;
    else
        a->head = h;
    a->tail = h;
    start_next(c);
    *out = h;
    return 0;
}

/* Under c->lock: drive the loop until h completes or timeout_ms passes. 1: still running. */
static int wait_locked(cps_client *c, cps_allreduce_handle *h, int timeout_ms)
{
    uint64_t deadline = timeout_ms < 0 ? UINT64_MAX : cps__now_ms() + (uint64_t)timeout_ms;
    while (!h->done) {
        uint64_t now = cps__now_ms();
        if (cps__sess_shutdown(c->sess)) {
            cps__log(CPS_LOG_ERROR, "allreduce", "the job ended during an all-reduce");
            return CPS_ESHUTDOWN; /* h stays queued; cps_close frees it */
        }
        if (now >= deadline)
            return 1;
        uint64_t left = deadline - now;
        int rc = cps__client_progress(c, left > 50 ? 50 : (int)left);
        if (rc < 0)
            return rc;
    }
    int result = h->result;
    if (result != 0 && h->why[0])
        cps__why_set(h->why);
    free(h);
    return result;
}

int cps_allreduce_async(cps_client *c, float *buf, uint64_t len, cps_reduce_op op,
                        cps_allreduce_handle **h)
{
    cps__why_clear();
    if (!h)
        return CPS_EINVAL;
    *h = NULL;
    if (!c)
        return CPS_EINVAL;
    pthread_mutex_lock(&c->lock);
    int rc = enqueue(c, buf, len, op, h);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int cps_allreduce_wait(cps_allreduce_handle *h, int timeout_ms)
{
    cps__why_clear();
    if (!h)
        return CPS_EINVAL;
    cps_client *c = h->c;
    pthread_mutex_lock(&c->lock);
    int rc = wait_locked(c, h, timeout_ms);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int cps_allreduce(cps_client *c, float *buf, uint64_t len, cps_reduce_op op)
{
    cps__why_clear();
    if (!c)
        return CPS_EINVAL;
    pthread_mutex_lock(&c->lock);
    cps_allreduce_handle *h;
    int rc = enqueue(c, buf, len, op, &h);
    if (rc == 0)
        rc = wait_locked(c, h, -1);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int cps_allreduce_share(cps_client *c, const float *buf, uint64_t len, uint64_t step)
{
    cps__why_clear();
    if (!c || (buf && len == 0))
        return CPS_EINVAL;
    pthread_mutex_lock(&c->lock);
    cps__ar *a;
    int rc = ar_get(c, &a);
    if (rc == 0) {
        a->share_buf = buf;
        a->share_len = buf ? len : 0;
        a->share_step = step;
        a->share_gen++;
        /* The buffer holds what the collectives up to this one made: a replacement that fetches
         * it runs the next one (cps__coll_set_next_seq), however the job's end races it. */
        a->share_seq = cps__coll_seq(a->coll) - (cps__coll_running(a->coll) ? 1 : 0);
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int cps_allreduce_fetch(cps_client *c, float *buf, uint64_t len, uint64_t *step)
{
    cps__why_clear();
    if (!c || !buf || len == 0 || len >= (1ull << 32))
        return CPS_EINVAL;
    pthread_mutex_lock(&c->lock);
    cps__ar *a;
    int rc = ar_get(c, &a);
    if (rc != 0 || !a->joiner) {
        pthread_mutex_unlock(&c->lock);
        return rc;
    }
    if (a->head || cps__coll_running(a->coll)) {
        /* The fetch sets where our all-reduces join the ring's: not under one already running. */
        pthread_mutex_unlock(&c->lock);
        return CPS_EBUSY;
    }
    a->fetch_buf = buf;
    cps__fetch_start(&a->fetch, len, cps__now_ms(), c->cfg.unavailable_timeout_ms);
    for (;;) {
        uint32_t to;
        uint64_t req;
        int what = cps__fetch_next(&a->fetch, c->view, a->members, a->nmembers, c->id,
                                   cps__sess_shutdown(c->sess), cps__sess_workers_settled(c->sess),
                                   cps__now_ms(), &to, &req, &rc);
        if (what == CPS_FETCH_DONE)
            break;
        if (what == CPS_FETCH_SEND) {
            cps__msg_hdr h = {.type = CPS_MSG_COLL,
                              .sender = c->id,
                              .epoch = c->view->epoch,
                              .req_worker = c->id,
                              .range = KIND_STATE_REQ,
                              .req_seq = req,
                              .step = CPS_FETCH_IN_PARTS | a->fetch.ask,
                              .aux = len};
            cps__msg_send(c->tp, to, &h, NULL, 0);
        } else if ((rc = cps__client_progress(c, 50)) < 0) {
            cps__fetch_stop(&a->fetch);
            break;
        }
    }
    if (rc == 1) {
        a->fetched = 1;
        if (step)
            *step = a->fetch.step;
        cps__log(CPS_LOG_INFO, "allreduce",
                 "replacement: %llu values (step %llu) fetched from worker %u",
                 (unsigned long long)len, (unsigned long long)a->fetch.step, a->fetch.from);
    }
    if (rc == CPS_ESHUTDOWN)
        cps__log(CPS_LOG_INFO, "allreduce", "replacement: the job has ended%s",
                 cps__sess_shutdown(c->sess) ? ""
                                             : " (the other workers finished their work and left)");
    else if (rc < 0)
        cps__log(CPS_LOG_ERROR, "allreduce", "replacement: cannot fetch the shared values: %s",
                 cps_strerror(rc));
    a->fetch_buf = NULL;
    free(a->fetch_res);
    a->fetch_res = NULL;
    a->fetch_res_cap = 0;
    pthread_mutex_unlock(&c->lock);
    return rc;
}

void cps_allreduce_stats_get(cps_client *c, cps_allreduce_stats *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (!c)
        return;
    pthread_mutex_lock(&c->lock);
    if (c->ar) {
        cps__coll_stats st;
        cps__coll_stats_get(c->ar->coll, &st);
        out->completed = st.completed;
        out->failed = st.failed;
        out->restarts = st.restarts;
        out->results_taken = st.results_taken;
        out->bytes_sent = c->ar->bytes_sent;
    }
    pthread_mutex_unlock(&c->lock);
}
