/* Replies are checked against the view epoch (issue 12).
 *
 *  - reply_of_another_epoch_is_not_taken: the test process is a real worker (cps_open) whose
 *    scheduler and only server are played by a thread of the test, holding the job's key. That
 *    server answers each of two pushes and two pulls first with a forged reply under another
 *    epoch than the request was sent under (an older one, then a newer one that the scheduler
 *    then publishes), with wrong values in the forged VALUES; only after the worker has sent the
 *    same request again under its current view does it get the true answer. The worker must
 *    re-send every one of them and return the true values; each push is applied once. No timing
 *    luck: the fake server sees, in order, either the re-send or the worker moving on.
 *  - paused_head_answers_nothing_queued: a real cluster (3 servers, chains of 2); the test joins
 *    as its only worker with a hand-driven transport. It SIGSTOPs the head of one range (also the
 *    tail of another), sends it a push and a pull, waits for the view that declares it dead and
 *    SIGCONTs it: nothing comes back from it for the requests it held, and nothing under the
 *    epoch it was paused in; the push, re-sent to the new chain, is applied exactly once; the
 *    paused server says it stalled and what it dropped; every process exits 0 at the end.
 *  - paused_head_during_training: two lsq_worker processes train in sync mode on 3 servers in
 *    chains of 3; the head of range 0 is SIGSTOPped until the scheduler declares it dead, then
 *    woken: it says it stalled and what it dropped, and the job ends with the parameters of an
 *    undisturbed run, bit for bit. */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "chainps/chainps.h"
#include "chainps/error.h"
#include "core/log.h"
#include "core/view.h"
#include "core/wire.h"
#include "cluster.h"
#include "node/msg.h"
#include "transport/auth.h"
#include "transport/transport.h"

#include <nanomsg/nn.h>
#include <nanomsg/pipeline.h>

#define WAIT_MS 30000

/* ---- part 1: a fake scheduler and server ---- */

#define NK         4
#define FAKE_SRV   1u /* the fake server's node id (the scheduler is 0) */
#define FAKE_WRK   2u /* the id the worker is given */
#define EPOCH0     5u
#define FORGED_VAL 999.0f

typedef struct fake {
    cps__tp *tp;
    char url[64];
    char worker_addr[CPS_ADDR_MAX];
    int have_worker;
    uint64_t epoch;   /* the view the fake scheduler publishes */
    float vals[NK];   /* the fake server's parameters: the sum of the pushes */
    int declared;     /* keys declared */
    uint64_t applied; /* last push sequence applied (range 0) */
    int applications[8];
    int pushes_seen, pulls_seen; /* distinct requests */
    uint64_t last_pull;          /* req_seq of the last pull seen */
    uint64_t expect_resend;      /* req_seq whose forged reply is out: next must be its re-send */
    uint64_t expect_epoch;       /* ...sent under this epoch */
    int forged, resent;
    /* forged_pull_reply_is_asked_again: the first send of each of the first two pulls is
     * answered under the right epoch and sealed with the job's key, then one byte is changed
     * on the way (a value, then a header field): the MAC must refuse it. */
    int mac_forge;
    int raw;           /* a plain nanomsg socket to the worker's inbox, for the altered bytes */
    cps__auth *sealer; /* the job's key */
    int bye;
    volatile int stop;
    char failure[256];
} fake;

static const uint64_t KEYS[NK] = {10, 20, 30, 40};
static const uint32_t LENS[NK] = {1, 1, 1, 1};

static void fake_fail(fake *f, const char *fmt, ...)
{
    if (f->failure[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->failure, sizeof f->failure, fmt, ap);
    va_end(ap);
}

static void fake_send_view(fake *f, uint8_t type)
{
    cps__view v;
    cps__view_init(&v);
    v.epoch = f->epoch;
    v.mode = CPS_MODE_ASYNC;
    v.num_workers = 1;
    v.num_servers = 1;
    v.replicas = 1;
    v.nnodes = 2;
    v.nodes = calloc(2, sizeof *v.nodes);
    if (!v.nodes) {
        fake_fail(f, "out of memory");
        return;
    }
    v.nodes[0] = (cps__node_info){.id = FAKE_SRV, .role = CPS_ROLE_SERVER, .alive = 1, .rank = 0};
    snprintf(v.nodes[0].addr, sizeof v.nodes[0].addr, "%s", f->url);
    v.nodes[1] = (cps__node_info){.id = FAKE_WRK, .role = CPS_ROLE_WORKER, .alive = 1, .rank = 0};
    snprintf(v.nodes[1].addr, sizeof v.nodes[1].addr, "%s", f->worker_addr);
    uint32_t servers[1] = {FAKE_SRV};
    if (cps__view_place_ranges(&v, 1, servers, 1, 1) != 0) {
        fake_fail(f, "cannot place ranges");
        cps__view_fini(&v);
        return;
    }
    size_t len = cps__view_encoded_size(&v);
    void *buf = malloc(len);
    if (buf) {
        cps__view_encode(&v, buf, len);
        cps__msg_hdr h = {.type = type, .sender = 0, .epoch = f->epoch, .req_worker = FAKE_WRK};
        cps__msg_send(f->tp, FAKE_WRK, &h, buf, len);
    }
    free(buf);
    cps__view_fini(&v);
}

/* A reply from the fake server to request `req`, under `epoch`; VALUES carry `vals`. */
static void fake_reply(fake *f, const cps__msg_hdr *req, uint8_t type, uint64_t epoch,
                       const float *vals)
{
    cps__msg_hdr h = {.type = type,
                      .flags = CPS_WF_REPLY,
                      .sender = FAKE_SRV,
                      .epoch = epoch,
                      .req_worker = req->req_worker,
                      .req_seq = req->req_seq,
                      .range = req->range,
                      .step = req->step};
    uint64_t payload[64];
    size_t len = 0;
    if (type == CPS_MSG_VALUES)
        len = cps__wire_kv_encode(payload, sizeof payload, NK, KEYS, LENS, vals, NK);
    cps__msg_send(f->tp, FAKE_WRK, &h, len ? payload : NULL, len);
}

/* The forged answer to the first send of a request: under an older epoch for the first push and
 * the first pull, under a newer one (then published by the scheduler) for the second of each. */
static void forge(fake *f, const cps__msg_hdr *req, uint8_t type, int nth)
{
    float wrong[NK];
    for (int i = 0; i < NK; i++)
        wrong[i] = FORGED_VAL;
    uint64_t epoch = nth == 1 ? f->epoch - 1 : f->epoch + 1;
    fake_reply(f, req, type, epoch, wrong);
    f->forged++;
    f->expect_resend = req->req_seq;
    if (nth == 2) {
        /* A server already answers under the next view: the scheduler publishes it. */
        f->epoch++;
        fake_send_view(f, CPS_MSG_VIEW);
    }
    f->expect_epoch = f->epoch;
}

/* The true answer to `req`, sealed with the job's key, with byte `at` changed after sealing:
 * what a network in the way that changes bytes delivers. */
static void forge_mac(fake *f, const cps__msg_hdr *req, size_t at)
{
    cps__msg_hdr h = {.type = CPS_MSG_VALUES,
                      .flags = CPS_WF_REPLY,
                      .sender = FAKE_SRV,
                      .epoch = f->epoch,
                      .req_worker = req->req_worker,
                      .req_seq = req->req_seq,
                      .range = req->range,
                      .step = req->step};
    size_t plen = cps__wire_kv_size(NK, NK);
    unsigned char m[CPS_WIRE_HDR_SIZE + 256 + CPS_AUTH_TRAILER];
    h.payload_len = h.raw_len = (uint32_t)plen;
    cps__wire_hdr_encode(m, &h);
    cps__wire_kv_encode(m + CPS_WIRE_HDR_SIZE, plen, NK, KEYS, LENS, f->vals, NK);
    cps__auth_seal(f->sealer, m, CPS_WIRE_HDR_SIZE + plen);
    m[at] ^= 0x40;
    if (f->raw < 0) {
        f->raw = nn_socket(AF_SP, NN_PUSH);
        if (f->raw < 0 || nn_connect(f->raw, f->worker_addr) < 0) {
            fake_fail(f, "no raw socket to the worker");
            return;
        }
    }
    size_t len = CPS_WIRE_HDR_SIZE + plen + CPS_AUTH_TRAILER;
    if (nn_send(f->raw, m, len, 0) != (int)len)
        fake_fail(f, "cannot send the altered reply");
    f->forged++;
    f->expect_resend = req->req_seq;
    f->expect_epoch = f->epoch;
}

static void fake_request(fake *f, const cps__rx *rx)
{
    const cps__msg_hdr *h = &rx->hdr;
    if (h->epoch != f->epoch)
        return; /* a re-send under a view we replaced: wait for the one under the new view */
    if (f->expect_resend && h->req_seq == f->expect_resend) {
        f->expect_resend = 0;
        f->resent++;
    } else if (f->expect_resend) {
        fake_fail(f,
                  "the worker sent request %llx (type %u) instead of re-sending %llx: it took "
                  "the reply forged under another epoch",
                  (unsigned long long)h->req_seq, h->type, (unsigned long long)f->expect_resend);
        f->expect_resend = 0;
    }
    /* A repeat (re-send) of a request already seen gets the true answer; the push was applied
     * at its first arrival. */
    if (h->type == CPS_MSG_PUSH && h->req_seq <= f->applied) {
        fake_reply(f, h, CPS_MSG_ACK, f->epoch, NULL);
        return;
    }
    if (h->type == CPS_MSG_PULL && h->req_seq == f->last_pull) {
        fake_reply(f, h, CPS_MSG_VALUES, f->epoch, f->vals);
        return;
    }
    switch (h->type) {
    case CPS_MSG_DECLARE:
        f->declared = 1;
        fake_reply(f, h, CPS_MSG_ACK, f->epoch, NULL);
        break;
    case CPS_MSG_PUSH: {
        cps__kv kv;
        if (cps__wire_kv_decode(rx->payload, rx->len, 1, &kv) != 0 || kv.nkeys != NK) {
            fake_fail(f, "bad push payload");
            return;
        }
        if (h->req_seq == f->applied + 1) {
            for (int i = 0; i < NK; i++)
                f->vals[i] += kv.vals[i];
            f->applied = h->req_seq;
            if (h->req_seq < 8)
                f->applications[h->req_seq]++;
        } else if (h->req_seq > f->applied) {
            fake_fail(f, "push %llu after %llu: a gap", (unsigned long long)h->req_seq,
                      (unsigned long long)f->applied);
        }
        int nth = ++f->pushes_seen;
        if (nth <= 2 && !f->mac_forge)
            forge(f, h, CPS_MSG_ACK, nth);
        else
            fake_reply(f, h, CPS_MSG_ACK, f->epoch, NULL);
        break;
    }
    case CPS_MSG_PULL: {
        f->last_pull = h->req_seq;
        int nth = ++f->pulls_seen;
        if (nth <= 2 && f->mac_forge)
            /* A value's byte, then the step's in the header. */
            forge_mac(f, h, nth == 1 ? CPS_WIRE_HDR_SIZE + cps__wire_kv_size(NK, 0) + 5 : 41);
        else if (nth <= 2)
            forge(f, h, CPS_MSG_VALUES, nth);
        else
            fake_reply(f, h, CPS_MSG_VALUES, f->epoch, f->vals);
        break;
    }
    default:
        fake_fail(f, "unexpected request type %u", h->type);
    }
}

static void fake_msg(void *ctx, void *buf, size_t len)
{
    fake *f = ctx;
    cps__rx rx;
    if (cps__rx_parse(&rx, buf, len) != 0) {
        fake_fail(f, "unparsable message");
        return;
    }
    const cps__msg_hdr *h = &rx.hdr;
    switch (h->type) {
    case CPS_MSG_HELLO: {
        uint32_t role, rank, prev;
        if (cps__hello_decode(rx.payload, rx.len, &role, &rank, &prev, f->worker_addr, NULL) != 0 ||
            role != CPS_ROLE_WORKER) {
            fake_fail(f, "bad HELLO");
            break;
        }
        if (!f->have_worker && cps__tp_peer_set(f->tp, FAKE_WRK, f->worker_addr) != 0) {
            fake_fail(f, "cannot reach the worker at %s", f->worker_addr);
            break;
        }
        f->have_worker = 1;
        fake_send_view(f, CPS_MSG_WELCOME);
        break;
    }
    case CPS_MSG_GET_VIEW:
        fake_send_view(f, CPS_MSG_VIEW);
        break;
    case CPS_MSG_HEARTBEAT:
        break;
    case CPS_MSG_BYE: {
        cps__msg_hdr a = {.type = CPS_MSG_ACK, .sender = 0, .epoch = f->epoch};
        cps__msg_send(f->tp, FAKE_WRK, &a, NULL, 0);
        f->bye = 1;
        break;
    }
    case CPS_MSG_DECLARE:
    case CPS_MSG_PUSH:
    case CPS_MSG_PULL:
        fake_request(f, &rx);
        break;
    default:
        fake_fail(f, "unexpected message type %u", h->type);
    }
    cps__rx_free(&rx);
}

static void *fake_main(void *arg)
{
    fake *f = arg;
    while (!f->stop)
        cps__tp_poll(f->tp, 20, fake_msg, f, 0);
    /* Let the BYE's ACK go out. */
    uint64_t end = h_now_ms() + 2000;
    while (cps__tp_queued(f->tp) && h_now_ms() < end)
        cps__tp_poll(f->tp, 20, NULL, NULL, 0);
    return NULL;
}

/* Start the fake scheduler and server in a thread, and make this process its worker. */
static void fake_start(fake *f, int mac_forge, pthread_t *th)
{
    memset(f, 0, sizeof *f);
    f->epoch = EPOCH0;
    f->mac_forge = mac_forge;
    f->raw = -1;
    if (mac_forge)
        assert_int_equal(cps__auth_create(h_key(), &f->sealer), 0);
    assert_int_equal(cps__tp_create(h_key(), &f->tp), 0);
    uint16_t port = 0;
    assert_int_equal(cps__tp_bind(f->tp, H_HOST, 0, &port), 0);
    snprintf(f->url, sizeof f->url, "tcp://%s:%u", H_HOST, port);
    assert_int_equal(pthread_create(th, NULL, fake_main, f), 0);
    char sched[64];
    snprintf(sched, sizeof sched, "%s:%u", H_HOST, port);
    h_become_worker(sched, 1, 1);
    setenv("CHAINPS_REQUEST_TIMEOUT_MS", "300", 1);
    setenv("CHAINPS_JOIN_TIMEOUT_MS", "10000", 1);
}

static void fake_stop(fake *f, pthread_t th)
{
    f->stop = 1;
    pthread_join(th, NULL);
    cps__tp_destroy(f->tp);
    if (f->raw >= 0)
        nn_close(f->raw);
    cps__auth_destroy(f->sealer);
    if (f->failure[0])
        fprintf(stderr, "fake server: %s\n", f->failure);
}

static void reply_of_another_epoch_is_not_taken(void **state)
{
    (void)state;
    static fake f;
    pthread_t th;
    fake_start(&f, 0, &th);
    cps__log_set_level(CPS_LOG_DEBUG); /* the "ignored" lines, for whoever reads the output */
    cps_client *c = NULL;
    int rc = cps_open(&c);
    float a[NK] = {1, 2, 3, 4}, b[NK] = {0.5f, 0.25f, 0.125f, 0.0625f}, got[NK];
    cps_optim sgd = cps_optim_sgd(1.0f);
    if (rc == 0)
        rc = cps_raw_declare(c, KEYS, NK, LENS, NULL, &sgd);
    int push1 = rc == 0 ? cps_raw_push(c, KEYS, NK, a, LENS) : rc;
    int push2 = push1 == 0 ? cps_raw_push(c, KEYS, NK, b, LENS) : push1;
    float pulled[2][NK];
    int pull1 = push2 == 0 ? cps_raw_pull(c, KEYS, NK, pulled[0], LENS) : push2;
    int pull2 = pull1 == 0 ? cps_raw_pull(c, KEYS, NK, pulled[1], LENS) : pull1;
    cps_client_stats st = {0};
    cps_client_stats_get(c, &st);
    int closed = c ? cps_close(c) : -1;
    cps__log_set_level(CPS_LOG_INFO);
    fake_stop(&f, th);
    assert_string_equal(f.failure, "");
    assert_int_equal(rc, 0);
    assert_int_equal(push1, 0);
    assert_int_equal(push2, 0);
    assert_int_equal(pull1, 0);
    assert_int_equal(pull2, 0);
    assert_int_equal(closed, 0);
    /* Every forged reply was followed by a re-send under the current view. */
    assert_int_equal(f.forged, 4);
    assert_int_equal(f.resent, 4);
    assert_true(st.retries >= 4);
    assert_int_equal(f.epoch, EPOCH0 + 2);
    /* Each push applied once, and the pulls return the true values, not the forged ones. */
    assert_int_equal(f.applied, 2);
    assert_int_equal(f.applications[1], 1);
    assert_int_equal(f.applications[2], 1);
    for (int i = 0; i < NK; i++) {
        got[i] = a[i] + b[i];
        assert_true(pulled[0][i] == got[i]);
        assert_true(pulled[1][i] == got[i]);
    }
    assert_true(f.bye);
}

/* A pull reply whose bytes were changed on the way (tcp, a job with a secret): the worker checks
 * its MAC while copying its values into the caller's buffer (transport.h, cps__tp_defer_check),
 * refuses it, and asks again as for a lost reply; the call returns the true values. The fake
 * server answers the first send of each of two pulls with the true reply altered after sealing,
 * in a value, then in the header's step: both refused (counted in values_refused, so the check
 * made during the copy is the one that refused them), both re-sent, and the pulls return the
 * true sums. Fails if the altered reply is taken (the worker would not re-send, and the fake
 * says so) or if the check made during the copy is not the one used (values_refused 0). */
static void forged_pull_reply_is_asked_again(void **state)
{
    (void)state;
    static fake f;
    pthread_t th;
    fake_start(&f, 1, &th);
    cps_client *c = NULL;
    int rc = cps_open(&c);
    float a[NK] = {1, 2, 3, 4}, pulled[2][NK];
    cps_optim sgd = cps_optim_sgd(1.0f);
    if (rc == 0)
        rc = cps_raw_declare(c, KEYS, NK, LENS, NULL, &sgd);
    int push = rc == 0 ? cps_raw_push(c, KEYS, NK, a, LENS) : rc;
    int pull1 = push == 0 ? cps_raw_pull(c, KEYS, NK, pulled[0], LENS) : push;
    int pull2 = pull1 == 0 ? cps_raw_pull(c, KEYS, NK, pulled[1], LENS) : pull1;
    cps_client_stats st = {0};
    cps_client_stats_get(c, &st);
    int closed = c ? cps_close(c) : -1;
    fake_stop(&f, th);
    assert_string_equal(f.failure, "");
    assert_int_equal(rc, 0);
    assert_int_equal(push, 0);
    assert_int_equal(pull1, 0);
    assert_int_equal(pull2, 0);
    assert_int_equal(closed, 0);
    assert_int_equal(f.forged, 2);
    assert_int_equal(f.resent, 2);
    assert_int_equal(st.values_refused, 2);
    assert_true(st.retries >= 2);
    for (int i = 0; i < NK; i++) {
        assert_true(pulled[0][i] == a[i]);
        assert_true(pulled[1][i] == a[i]);
    }
    assert_true(f.bye);
}

/* ---- part 2: a paused head ---- */

typedef struct witness {
    cps__tp *tp;
    char addr[CPS_ADDR_MAX];
    uint32_t id;
    cps__view view;
    uint32_t victim;       /* node id of the paused server */
    uint64_t dead_epoch;   /* first view in which the victim is dead (0: not yet) */
    uint64_t paused_epoch; /* the view the victim had when paused */
    uint64_t held[4];      /* requests sent to the victim while it was paused */
    int nheld;
    int violations;
    int resent; /* the held push was sent again by us after the wake */
    /* The reply awaited by wait_reply. */
    uint32_t want_range;
    uint64_t want_seq;
    int got;
    cps__msg_hdr got_hdr;
    float got_val;
} witness;

static witness W;

static void w_install(witness *w, const cps__rx *rx)
{
    cps__view v;
    cps__view_init(&v);
    if (cps__view_decode(rx->payload, rx->len, &v) != 0) {
        cps__view_fini(&v);
        return;
    }
    if (w->view.nranges && v.epoch <= w->view.epoch) {
        cps__view_fini(&v);
        return;
    }
    for (uint32_t i = 0; i < v.nnodes; i++)
        if (v.nodes[i].id != w->id && v.nodes[i].role == CPS_ROLE_SERVER)
            cps__tp_peer_set(w->tp, v.nodes[i].id, v.nodes[i].addr);
    const cps__node_info *victim = w->victim ? cps__view_node(&v, w->victim) : NULL;
    if (victim && !victim->alive && !w->dead_epoch)
        w->dead_epoch = v.epoch;
    cps__view_fini(&w->view);
    w->view = v;
}

static void w_msg(void *ctx, void *buf, size_t len)
{
    witness *w = ctx;
    cps__rx rx;
    if (cps__rx_parse(&rx, buf, len) != 0)
        return;
    const cps__msg_hdr *h = &rx.hdr;
    if (h->sender == 0 && (h->type == CPS_MSG_WELCOME || h->type == CPS_MSG_VIEW)) {
        if (h->type == CPS_MSG_WELCOME && !w->id)
            w->id = h->req_worker;
        w_install(w, &rx);
    } else if (h->sender != 0 && (h->flags & CPS_WF_REPLY) &&
               (h->type == CPS_MSG_ACK || h->type == CPS_MSG_VALUES || h->type == CPS_MSG_ERROR)) {
        int held = 0;
        for (int i = 0; i < w->nheld; i++)
            held |= h->req_seq == w->held[i];
        /* Once we re-send the held push ourselves, the woken server may take it legitimately
         * under a newer view: the balance can make it that range's head again. */
        if (h->sender == w->victim && w->paused_epoch &&
            ((held && !w->resent) || h->epoch <= w->paused_epoch)) {
            w->violations++;
            fprintf(stderr,
                    "the paused server (node %u) answered request %llx (type %u reply) under "
                    "epoch %llu (it was paused in epoch %llu, declared dead in %llu)\n",
                    h->sender, (unsigned long long)h->req_seq, h->type,
                    (unsigned long long)h->epoch, (unsigned long long)w->paused_epoch,
                    (unsigned long long)w->dead_epoch);
        }
        if (h->range == w->want_range && h->req_seq == w->want_seq && !w->got) {
            w->got = 1;
            w->got_hdr = *h;
            cps__kv kv;
            if (h->type == CPS_MSG_VALUES && cps__wire_kv_decode(rx.payload, rx.len, 1, &kv) == 0)
                w->got_val = kv.vals[0];
        }
    }
    cps__rx_free(&rx);
}

static void w_poll(witness *w, int ms)
{
    uint64_t end = h_now_ms() + (uint64_t)ms;
    do
        cps__tp_poll(w->tp, 20, w_msg, w, 0);
    while (h_now_ms() < end);
}

static void w_get_view(witness *w)
{
    cps__msg_hdr g = {.type = CPS_MSG_GET_VIEW, .sender = w->id, .epoch = w->view.epoch};
    cps__msg_send(w->tp, 0, &g, NULL, 0);
}

/* Send request `type` for `key` (with value `val` for a push) to the head (the tail for a pull)
 * of its range under our view, or to `to` if nonzero. */
static void w_send(witness *w, uint8_t type, uint64_t key, float val, uint64_t seq, uint32_t to)
{
    uint32_t r = cps__view_range_of(&w->view, key);
    const cps__range *rg = &w->view.ranges[r];
    uint32_t dst = to ? to : type == CPS_MSG_PULL ? rg->chain[rg->chain_len - 1] : rg->chain[0];
    uint32_t one = 1;
    uint64_t payload[32];
    size_t len;
    if (type == CPS_MSG_DECLARE) {
        cps__param_spec spec = {.init_kind = CPS_W_INIT_ZEROS, .opt_kind = CPS_W_OPT_SGD, .lr = 1};
        uint64_t off = 0;
        len = cps__wire_declare_encode(payload, sizeof payload, 1, &key, &one, &off, &spec);
    } else {
        len = cps__wire_kv_encode(payload, sizeof payload, 1, &key, &one,
                                  type == CPS_MSG_PUSH ? &val : NULL, type == CPS_MSG_PUSH);
    }
    cps__msg_hdr h = {.type = type,
                      .sender = w->id,
                      .epoch = w->view.epoch,
                      .req_worker = w->id,
                      .req_seq = seq,
                      .range = r,
                      .step = seq & ~CPS_SEQ_OTHER};
    assert_int_equal(cps__msg_send(w->tp, dst, &h, payload, len), 0);
}

/* Send until answered with ACK/VALUES (re-sending under the newest view every 500 ms). */
static int w_call(witness *w, uint8_t type, uint64_t key, float val, uint64_t seq)
{
    uint64_t end = h_now_ms() + WAIT_MS;
    while (h_now_ms() < end) {
        w->want_range = cps__view_range_of(&w->view, key);
        w->want_seq = seq;
        w->got = 0;
        w_send(w, type, key, val, seq, 0);
        uint64_t next = h_now_ms() + 500;
        while (!w->got && h_now_ms() < next)
            w_poll(w, 20);
        if (w->got && w->got_hdr.type != CPS_MSG_ERROR)
            return 0;
        w_get_view(w);
        w_poll(w, 100);
    }
    return -1;
}

static void paused_head_answers_nothing_queued(void **state)
{
    (void)state;
    h_cluster C;
    memset(&C, 0, sizeof C);
    const char *extra[] = {"--replicas", "2", NULL};
    char *env[] = {"CHAINPS_WORKER_DEAD_AFTER_MS=120000", NULL};
    assert_int_equal(h_start_scheduler_env(&C, 3, 1, "async", extra, env), 0);
    C.nservers = 3;
    for (int i = 0; i < 3; i++)
        assert_true(h_start_server(&C, i) > 0);

    witness *w = &W;
    memset(w, 0, sizeof *w);
    cps__view_init(&w->view);
    assert_int_equal(cps__tp_create(h_key(), &w->tp), 0);
    uint16_t port = 0;
    assert_int_equal(cps__tp_bind(w->tp, H_HOST, 0, &port), 0);
    snprintf(w->addr, sizeof w->addr, "tcp://%s:%u", H_HOST, port);
    char url[80];
    snprintf(url, sizeof url, "tcp://%s", C.sched_addr);
    assert_int_equal(cps__tp_peer_set(w->tp, 0, url), 0);
    char hello[16 + CPS_ADDR_MAX];
    size_t hn = cps__hello_encode(hello, sizeof hello, CPS_ROLE_WORKER, 0, 0, w->addr);
    uint64_t end = h_now_ms() + WAIT_MS;
    while ((!w->id || !w->view.nranges) && h_now_ms() < end) {
        cps__msg_hdr h = {.type = CPS_MSG_HELLO, .sender = UINT32_MAX};
        cps__msg_send(w->tp, 0, &h, hello, hn);
        w_poll(w, 300);
    }
    assert_true(w->id != 0 && w->view.nranges > 0);

    /* The victim: server rank 0, head of one range and tail of another. */
    for (uint32_t i = 0; i < w->view.nnodes; i++)
        if (w->view.nodes[i].role == CPS_ROLE_SERVER && w->view.nodes[i].rank == 0)
            w->victim = w->view.nodes[i].id;
    assert_true(w->victim != 0);
    uint64_t k_head = UINT64_MAX, k_tail = UINT64_MAX;
    for (uint32_t r = 0; r < w->view.nranges; r++) {
        const cps__range *rg = &w->view.ranges[r];
        if (rg->chain[0] == w->victim && k_head == UINT64_MAX)
            k_head = rg->lo + 1;
        if (rg->chain[rg->chain_len - 1] == w->victim && k_tail == UINT64_MAX)
            k_tail = rg->lo + 1;
    }
    assert_true(k_head != UINT64_MAX && k_tail != UINT64_MAX);

    /* Declare both keys and push 1 to the victim's range: w = -1 (SGD, lr 1, from zeros). */
    uint64_t other = CPS_SEQ_OTHER;
    assert_int_equal(w_call(w, CPS_MSG_DECLARE, k_head, 0, ++other), 0);
    assert_int_equal(w_call(w, CPS_MSG_DECLARE, k_tail, 0, ++other), 0);
    assert_int_equal(w_call(w, CPS_MSG_PUSH, k_head, 1.0f, 1), 0);
    assert_int_equal(w_call(w, CPS_MSG_PULL, k_tail, 0, ++other), 0);
    assert_true(w->got_val == 0.0f);

    /* Late repeats of answers to requests re-sent above arrive now, before the pause. */
    w_poll(w, 200);
    /* Pause it, and send it a push (as its head) and a pull (as its tail) under its view. */
    pid_t victim_pid = C.servers[0];
    assert_int_equal(kill(victim_pid, SIGSTOP), 0);
    w->paused_epoch = w->view.epoch;
    w_send(w, CPS_MSG_PUSH, k_head, 2.0f, 2, w->victim);
    w->held[w->nheld++] = 2;
    w_send(w, CPS_MSG_PULL, k_tail, 0, ++other, w->victim);
    w->held[w->nheld++] = other;
    end = h_now_ms() + WAIT_MS;
    while (!w->dead_epoch && h_now_ms() < end)
        w_poll(w, 50);
    int declared_dead = w->dead_epoch != 0;
    /* A little longer: the chain has moved on well before it wakes. */
    w_poll(w, 300);
    kill(victim_pid, SIGCONT);
    assert_true(declared_dead);

    /* It wakes to find its queue: it must answer none of it under the view it had. */
    w_poll(w, 2000);
    assert_int_equal(w->violations, 0);
    assert_true(h_wait_log(victim_pid, "did not run for", 1, WAIT_MS));
    assert_true(h_wait_log(victim_pid, "dropped unanswered", 1, WAIT_MS));

    /* The push, re-sent to the new chain, is applied once: w = -(1 + 2). */
    w->resent = 1;
    assert_int_equal(w_call(w, CPS_MSG_PUSH, k_head, 2.0f, 2), 0);
    assert_int_equal(w_call(w, CPS_MSG_PULL, k_head, 0, ++other), 0);
    assert_true(w->got_val == -3.0f);
    assert_int_equal(w->violations, 0);
    char *log = h_read_log(victim_pid);
    const char *p = strstr(log, "did not run for");
    fprintf(stderr, "paused server: %.*s\n", p ? (int)strcspn(p, "\n") : 0, p ? p : "");
    p = strstr(log, "dropped unanswered");
    while (p && p > log && p[-1] != '\n')
        p--;
    fprintf(stderr, "paused server: %.*s\n", p ? (int)strcspn(p, "\n") : 0, p ? p : "");
    free(log);

    /* The job ends with its only worker: every process exits 0. */
    unsigned char stats[CPS_STATS_SIZE] = {0};
    cps__msg_hdr bye = {.type = CPS_MSG_BYE, .sender = w->id, .epoch = w->view.epoch};
    cps__msg_send(w->tp, 0, &bye, stats, sizeof stats);
    end = h_now_ms() + WAIT_MS;
    while (h_alive(C.sched) && h_now_ms() < end)
        w_poll(w, 100);
    assert_true(h_wait_exit(C.sched, WAIT_MS, NULL));
    assert_int_equal(h_exit_code(C.sched), 0);
    for (int i = 0; i < 3; i++) {
        assert_true(h_wait_exit(C.servers[i], WAIT_MS, NULL));
        assert_int_equal(h_exit_code(C.servers[i]), 0);
    }
    cps__tp_destroy(w->tp);
    cps__view_fini(&w->view);
}

/* ---- part 3: a paused head during training ---- */

static pid_t spawn_lsq(const h_cluster *c, int rank, const char *tag)
{
    char sched[96], rk[32], name[64];
    snprintf(sched, sizeof sched, "CHAINPS_SCHEDULER=%s", c->sched_addr);
    snprintf(rk, sizeof rk, "CHAINPS_RANK=%d", rank);
    snprintf(name, sizeof name, "%s-worker-%d", tag, rank);
    char *env[] = {"CHAINPS_ROLE=worker",   sched, "CHAINPS_NUM_SERVERS=3",
                   "CHAINPS_NUM_WORKERS=2", rk,    NULL};
    /* About 4 s of training: the pause lands in the middle of it. */
    char *argv[] = {LSQ_BIN, "--steps", "400", "--step-ms", "10", "--tol", "1e-2", NULL};
    return h_spawn(name, argv, env, NULL);
}

static void idle(int ms)
{
    uint64_t end = h_now_ms() + (uint64_t)ms;
    while (h_now_ms() < end) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* One sync job of 3 servers and 2 lsq workers; with `pause`, server rank 0 (the head of range 0)
 * is SIGSTOPped a second into training until the scheduler declares it dead. Returns rank 0's
 * final checksum in `sum`; every process must exit 0. */
static void train(const char *tag, int pause, char sum[17])
{
    h_cluster C;
    memset(&C, 0, sizeof C);
    char data[700];
    snprintf(data, sizeof data, "%s/%s-scheduler", h_dir(), tag);
    const char *extra[] = {"--data", data, NULL};
    assert_int_equal(h_start_scheduler(&C, 3, 2, "sync", extra), 0);
    C.nservers = 3;
    for (int i = 0; i < 3; i++)
        assert_true(h_start_server(&C, i) > 0);
    pid_t w[2];
    for (int i = 0; i < 2; i++)
        w[i] = spawn_lsq(&C, i, tag);
    if (pause) {
        assert_true(h_wait_log(C.sched, "tensor lsq/w registered", 1, WAIT_MS));
        idle(1000);
        assert_true(h_alive(w[0]) && h_alive(w[1])); /* still training */
        assert_int_equal(kill(C.servers[0], SIGSTOP), 0);
        int dead = h_wait_log(C.sched, "(rank 0) silent for", 1, WAIT_MS);
        idle(300);
        kill(C.servers[0], SIGCONT);
        assert_true(dead);
    }
    for (int i = 0; i < 2; i++) {
        assert_true(h_wait_exit(w[i], 120000, NULL));
        assert_int_equal(h_exit_code(w[i]), 0);
    }
    assert_true(h_wait_exit(C.sched, WAIT_MS, NULL));
    assert_int_equal(h_exit_code(C.sched), 0);
    for (int i = 0; i < 3; i++) {
        assert_true(h_wait_exit(C.servers[i], WAIT_MS, NULL));
        assert_int_equal(h_exit_code(C.servers[i]), 0);
    }
    if (pause) {
        /* It noticed its pause and answered nothing before learning it had been replaced. */
        assert_true(h_log_count(C.servers[0], "did not run for") > 0);
        assert_true(h_log_count(C.servers[0], "dropped unanswered") > 0);
    }
    char *log = h_read_log(w[0]);
    const char *p = strstr(log, "final: rank 0");
    p = p ? strstr(p, "checksum ") : NULL;
    int ok = p && sscanf(p, "checksum %16s", sum) == 1;
    free(log);
    assert_true(ok);
    /* The next job gets fresh server directories (the harness names them by rank). */
    for (int i = 0; i < 3; i++) {
        char to[700];
        snprintf(to, sizeof to, "%s/%s-server-%d", h_dir(), tag, i);
        assert_int_equal(rename(C.data[i], to), 0);
    }
}

static void paused_head_during_training(void **state)
{
    (void)state;
    char want[17] = "", got[17] = "";
    train("reference", 0, want);
    train("paused", 1, got);
    assert_string_equal(got, want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        H_TEST(reply_of_another_epoch_is_not_taken, "epoch", 280),
        H_TEST(forged_pull_reply_is_asked_again, "epoch", 280),
        H_TEST(paused_head_answers_nothing_queued, "epoch", 280),
        H_TEST(paused_head_during_training, "epoch", 280),
    };
    if (getenv("CPS_TEST_FILTER"))
        cmocka_set_test_filter(getenv("CPS_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
