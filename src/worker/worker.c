/* The worker client as a whole: cps_open (the configuration, the sockets, the join, the parts'
 * hooks), the receive path that hands each message to its part (the session through client.c,
 * the all-reduce in collective.c, the local tensors in localset.c), and cps_close. The top of
 * src/worker: client.c, the core the parts run on, names none of them. */
#include "client.h"
#include "collective.h"
#include "localset.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/log.h"
#include "node/msg.h"
#include "node/roles.h"

#define HELLO_RETRY_MS  500
#define VIEW_ASK_MIN_MS 200
#define EAGAIN_RETRY_MS 50
#define BYE_WAIT_MS     2000

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
    cps__client_perform(c); /* before rx is freed: answers borrow its payload */
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
 * the caller's buffer (cps_pull says so): the answer that completes the part writes it all. A
 * ring message (CPS_MSG_COLL) goes to the all-reduce's own check (cps__ar_on_pending). */
static void take_checked_values(void *ctx, cps__tp_pending *m)
{
    cps_client *c = ctx;
    size_t len;
    const unsigned char *b = cps__tp_pending_peek(m, &len);
    cps__msg_hdr h;
    cps__sess_op *so;
    uint32_t part;
    size_t at, n;
    if (cps__wire_hdr_decode(b, len, &h) != 0)
        return;
    if (h.type == CPS_MSG_COLL) {
        cps__ar_on_pending(c, m); /* an all-gather chunk, checked as the ring copies it */
        return;
    }
    if ((h.flags & CPS_WF_SNAPPY) || !cps__sess_values_target(c->sess, &h, &so, &part))
        return;
    cps__op *op = cps__op_of(so);
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

static int join(cps_client *c)
{
    char payload[16 + CPS_ADDR_MAX];
    size_t n = cps__hello_encode(payload, sizeof payload, CPS_ROLE_WORKER, c->cfg.rank, 0, c->addr);
    /* Over with our WELCOME, not just any view: a worker joining a running job is in the view
     * the scheduler publishes to everyone as it admits it, which can arrive first. */
    int rc = cps__client_call(c, CPS_MSG_HELLO, payload, n, 100);
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
    cps__client_destroy(c);
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
    /* Workers share the cores with each other: one BLAS thread each unless the user said. The
     * pool is not ended here (cps__blas_end_pool): this is the user's process, where another
     * thread may be inside BLAS. */
    if (!getenv("OPENBLAS_NUM_THREADS"))
        openblas_set_num_threads(1);
    cps_client *c = calloc(1, sizeof *c);
    if (!c)
        return CPS_ENOMEM;
    pthread_mutex_init(&c->lock, NULL);
    c->cfg = cfg;
    c->on_turn = cps__ar_tick; /* the all-reduce's timeouts, after every turn of the loop */
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
    if (rc == 0) {
        cps__tp_defer_check(c->tp, CPS_MSG_VALUES, take_checked_values, c);
        cps__tp_defer_check(c->tp, CPS_MSG_COLL, take_checked_values, c);
    }
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
        cps__client_progress(c, 50);
    result = cps__sess_leave_result(c->sess);
    unsigned char stats[CPS_STATS_SIZE];
    cps__node_stats ns = {0};
    ns.push_raw_bytes = c->stats.push_raw_bytes;
    ns.push_wire_bytes = c->stats.push_wire_bytes;
    ns.pull_bytes = c->stats.pull_bytes;
    cps__stats_encode(stats, &ns);
    /* Unanswered within BYE_WAIT_MS, or the job over: we leave all the same. */
    cps__client_call(c, CPS_MSG_BYE, stats, sizeof stats, 50);
    pthread_mutex_unlock(&c->lock);
    client_free(c);
    return result;
}
