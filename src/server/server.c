/* A parameter server process: joins the scheduler, keeps its key ranges in LMDB, and serves
 * declare/push/pull requests from workers until the scheduler ends the job. */
#include "server.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chainps/error.h"
#include "core/log.h"
#include "core/wire.h"
#include "node/roles.h"
#include "recovery/suspect.h"
#include "replication/standing.h"

#define HELLO_RETRY_MS 500
#define SYNC_EVERY_MS  1000
#define SCHED_PEER     0u
/* Messages handled per loop turn: under a steady stream of pushes the loop must still come
 * round to its timers (held acks, re-sends, joins) and tell the heartbeat thread it turned. */
#define MSGS_PER_TURN 64
/* Heartbeats pause once the loop has not turned for this long (or 4x the failure timeout, if
 * that is longer): far above any honest turn, and a wedged server is still failed over. */
#define BEAT_STALL_LIMIT_MS 30000u
/* Format of the keys a data directory holds, kept in its meta under "key_layout". 3: dense
 * chunks of at most 128 Ki values (src/worker/layout.c). 2: keys and key-set signatures from XXH3
 * (cps__hash64), one chunk per range however large. 1, unmarked: FNV-1a. Another layout's keys
 * for a tensor are not this build's, so such a directory is refused, not misread. */
#define CPS_KEY_LAYOUT 3u
/* The longest one loop turn waits, joined or not: the per-turn work (chain re-sends, sync
 * timeouts, snapshot and cut threads, join deadlines, and telling the heartbeat thread that we
 * turn) runs at least this often. */
#define TURN_MAX_MS          20
#define TURN_MAX_UNJOINED_MS 100

/* The event loop's timers (node/loop.h). */
enum {
    T_HELLO = 1, /* periodic HELLO_RETRY_MS until the scheduler welcomes us */
    T_JOIN,      /* one-shot join_timeout_ms: the scheduler never answered */
    T_SYNC,      /* periodic SYNC_EVERY_MS once joined: key counts, and msync unless every commit
                    syncs */
    T_ACKS,      /* one-shot: the held CHAIN_ACKs are due */
    T_TURN,      /* one-shot, re-armed every turn: TURN_MAX_MS (TURN_MAX_UNJOINED_MS) */
    T_METRICS,   /* periodic METRICS_EVERY_MS with --metrics-port: publish the /metrics page */
};

/* How often the /metrics page is rendered: scrapes come every 10-60 s, so a page at most this
 * old is fresh enough, and rendering never costs the data path more than ~0.1% of a core. */
#define METRICS_EVERY_MS 250

static int check_job(cps__server *s, uint64_t job);

/* A WELCOME or VIEW from the scheduler: decoded here, judged by the replica (replica_fence.c),
 * which says whether it lets us in (then the job is checked and our id taken from the welcome),
 * and installs it; the transport learns the view's peers. */
static void install_view(cps__server *s, const cps__rx *rx, int welcome)
{
    cps__view v;
    cps__view_init(&v);
    int rc = cps__view_decode(rx->payload, rx->len, &v);
    if (rc != 0) {
        cps__log(CPS_LOG_ERROR, "server", "bad view from the scheduler dropped: %s",
                 cps_strerror(rc));
        cps__view_fini(&v);
        return;
    }
    int news = cps__replica_view_news(s->replica, &v, s->id, welcome);
    cps__server_perform(s);
    if (news == CPS_RV_DONE) {
        cps__view_fini(&v);
        return;
    }
    if (news == CPS_RV_LET_IN) {
        if ((rc = check_job(s, rx->hdr.aux)) != 0) {
            s->refused = rc;
            s->shutdown = 1;
            cps__view_fini(&v);
            return;
        }
        s->id = rx->hdr.req_worker;
        const cps__node_info *me = cps__view_node(&v, s->id);
        if (!me || me->role != CPS_ROLE_SERVER) {
            cps__log(CPS_LOG_ERROR, "server", "welcome names node %u, not a server of the view",
                     s->id);
            cps__view_fini(&v);
            return;
        }
        s->rank = me->rank;
        char tag[32];
        snprintf(tag, sizeof tag, "server %u", s->rank);
        cps__log_set_tag(tag);
    }
    for (uint32_t i = 0; i < v.nnodes; i++) {
        if (v.nodes[i].id == s->id)
            continue;
        if (cps__view_superseded(&v, &v.nodes[i])) {
            /* A dead worker another took the place of: no socket (one leaked per replacement,
             * found by the soak). A reply still owed to it fails as to any unknown peer. */
            cps__tp_peer_drop(s->tp, v.nodes[i].id);
            continue;
        }
        rc = cps__tp_peer_set(s->tp, v.nodes[i].id, v.nodes[i].addr);
        if (rc != 0)
            cps__log(CPS_LOG_WARN, "server", "cannot reach node %u at %s: %s", v.nodes[i].id,
                     v.nodes[i].addr, cps_strerror(rc));
    }
    /* Fenced, the loop drops our chain state and rejoins (cps__fence_fenced). */
    cps__server_view_changed(s, &v);
    cps__view_fini(&v); /* empty once installed */
    cps__server_run_held(s);
}

typedef struct checksum_io {
    uint32_t range;
    uint64_t lo, hi;
    uint64_t seq, sum;
} checksum_io;

static int checksum_txn(cps__txn *txn, void *arg)
{
    checksum_io *c = arg;
    cps__range_meta m;
    int rc = cps__store_range_get(txn, c->range, &m);
    c->seq = m.seq;
    /* One read transaction: the checksum and the sequence number describe the same state. */
    return rc ? rc : cps__store_checksum(txn, c->lo, c->hi, &c->sum);
}

/* `chainps status --verify`: checksum of one range's values at its current sequence number. */
static void handle_checksum(cps__server *s, const cps__rx *rx)
{
    uint32_t peer = 0;
    if (!cps__standing_checksum(cps__fence_joined(s->fence), &s->view, rx->hdr.range) ||
        cps__temp_peer_from_hello(&s->temps, s->tp, rx->payload, rx->len, cps__now_ms(), &peer,
                                  NULL) != 0) {
        cps__log(CPS_LOG_WARN, "server", "malformed checksum request dropped");
        return;
    }
    if (!peer)
        return;
    const cps__range *r = &s->view.ranges[rx->hdr.range];
    checksum_io c = {rx->hdr.range, r->lo, r->hi, 0, 0};
    int rc = cps__store_read(s->store, checksum_txn, &c);
    cps__msg_hdr h = {0};
    h.type = CPS_MSG_CHECKSUM;
    h.flags = CPS_WF_REPLY;
    h.sender = s->id;
    h.status = rc;
    h.epoch = s->view.epoch;
    h.range = rx->hdr.range;
    h.req_seq = c.seq;
    h.aux = c.sum;
    cps__msg_send(s->tp, peer, &h, NULL, 0);
}

/* An ERROR or ACK that may answer our DRAIN (replication/standing.h decides). Returns 1 if it
 * did. */
static int on_drain_answer(cps__server *s, const cps__rx *rx)
{
    int next = cps__drain_on_answer(s->drain, rx->hdr.type, rx->hdr.sender == SCHED_PEER);
    if (next < 0) {
        cps__log(CPS_LOG_WARN, "server", "the scheduler cannot drain us: %.*s; stopping now",
                 (int)(rx->len < 200 ? rx->len : 200), (const char *)rx->payload);
        s->shutdown = 1;
        return 1;
    }
    if (next == s->drain)
        return 0;
    s->drain = next;
    cps__log(CPS_LOG_INFO, "server",
             "draining: our ranges move to the other servers, then the scheduler lets "
             "us exit (SIGTERM again to stop now)");
    return 1;
}

static void handle_msg(void *ctx, void *buf, size_t len)
{
    cps__server *s = ctx;
    cps__rx rx;
    s->stats.msgs_in++;
    uint64_t rx_ms = cps__now_ms();
    int rc = cps__rx_parse(&rx, buf, len);
    if (rc != 0) {
        s->stats.msgs_bad++;
        cps__log(CPS_LOG_ERROR, "server",
                 "bad message (%zu bytes, type %u, from node %u) dropped: %s", len, rx.hdr.type,
                 rx.hdr.sender, cps_strerror(rc));
        /* The header decoded: the sender can be told (e.g. corrupt snappy payload). */
        if (cps__standing_tell_bad(rx.hdr.type, rx.hdr.flags, cps__fence_joined(s->fence),
                                   cps__server_worker_rank(s, rx.hdr.sender) != UINT32_MAX))
            cps__server_reply_error(s, &rx.hdr, rc, "payload rejected");
        return;
    }
    if (rx.hdr.sender == SCHED_PEER)
        s->sched_seen_ms = rx_ms; /* proof of life, beside the connection (scheduler_gone) */
    if (cps__standing_probe(rx.hdr.type, rx.hdr.sender == SCHED_PEER)) {
        /* The scheduler asks whether traffic to our inbox is served (recovery/suspect.h): a
         * liveness question, answered whatever our standing, from this loop (the one that
         * serves requests), not from the heartbeat thread. */
        cps__msg_hdr h = {.type = CPS_MSG_PROBE,
                          .flags = CPS_WF_REPLY,
                          .sender = s->id,
                          .epoch = s->view.epoch,
                          .req_seq = rx.hdr.req_seq};
        cps__msg_send(s->tp, SCHED_PEER, &h, NULL, 0);
        cps__rx_free(&rx);
        return;
    }
    /* The replica's messages: it admits them itself (replica_fence.c). */
    switch (rx.hdr.type) {
    case CPS_MSG_FWD:
    case CPS_MSG_CHAIN_ACK:
    case CPS_MSG_CHAIN_MARK:
    case CPS_MSG_DECLARE:
    case CPS_MSG_PUSH:
    case CPS_MSG_PUSH_PULL:
    case CPS_MSG_PULL:
    case CPS_MSG_JOIN_RANGE:
    case CPS_MSG_SNAP_REQ:
    case CPS_MSG_SNAP:
        cps__server_take(s, &rx);
        return; /* the replica took rx */
    default:
        break;
    }
    if (!cps__server_admit(s, &rx.hdr, rx_ms)) {
        cps__rx_free(&rx);
        return;
    }
    switch (rx.hdr.type) {
    case CPS_MSG_WELCOME:
    case CPS_MSG_VIEW:
        install_view(s, &rx, rx.hdr.type == CPS_MSG_WELCOME);
        break;
    case CPS_MSG_SHUTDOWN:
        cps__log(CPS_LOG_INFO, "server", "the scheduler ended the job");
        s->shutdown = 1;
        break;
    case CPS_MSG_ERROR:
        if (!on_drain_answer(s, &rx))
            cps__log(CPS_LOG_ERROR, "server", "error from node %u: %s", rx.hdr.sender,
                     cps_strerror(rx.hdr.status));
        break;
    case CPS_MSG_ACK:
        on_drain_answer(s, &rx);
        break;
    case CPS_MSG_CHECKSUM:
        handle_checksum(s, &rx);
        break;
    case CPS_MSG_CUT_PROBE:
        cps__server_on_cut_probe(s, &rx);
        break;
    case CPS_MSG_CUT_OPEN:
        cps__server_on_cut_open(s, &rx);
        break;
    case CPS_MSG_PUT:
        cps__server_on_put(s, &rx);
        return; /* taken */
    default:
        s->stats.msgs_bad++;
        cps__log(CPS_LOG_WARN, "server", "unexpected message type %u from node %u dropped",
                 rx.hdr.type, rx.hdr.sender);
    }
    cps__rx_free(&rx);
}

static void rejoin(cps__server *s)
{
    if (cps__fence_unsure(s->fence))
        cps__log(CPS_LOG_INFO, "server",
                 "%llu messages that came while we were unsure of our standing were dropped "
                 "unanswered (none was answered under view epoch %llu)",
                 (unsigned long long)cps__fence_dropped(s->fence),
                 (unsigned long long)s->view.epoch);
    cps__server_reap_snapshots(s, 1);
    cps__server_cuts_tick(s, cps__now_ms(), 1);
    cps__server_data_fini(s);
    if (cps__server_replica_new(s) != 0)
        s->poisoned = 1; /* no memory for a fresh replica: leave */
    cps__view_fini(&s->view);
    cps__view_init(&s->view);
    /* A fresh replica is a new incarnation: a late WELCOME of the old one must not let it in. */
    s->boot_id = cps__splitmix64(s->boot_id ^ cps__now_ms()) | 1;
}

static int send_hello(cps__server *s, const char *addr, uint32_t prev_id)
{
    char payload[20 + CPS_ADDR_MAX];
    size_t n =
        cps__hello_encode(payload, sizeof payload, CPS_ROLE_SERVER, s->cfg.rank, prev_id, addr);
    /* No node id in the store: it never held a range of this job (a new or replaced disk,
     * --reset-data), whatever an earlier life at this address did. */
    n = cps__hello_add_flags(payload, sizeof payload, n, prev_id ? 0 : CPS_HELLO_EMPTY);
    /* aux: this incarnation, so a restart the scheduler had not noticed is not mistaken for
     * the same process continuing with its old chain state. */
    cps__msg_hdr h = {.type = CPS_MSG_HELLO, .sender = UINT32_MAX, .aux = s->boot_id};
    return cps__msg_send(s->tp, SCHED_PEER, &h, payload, n);
}

typedef struct meta_io {
    uint32_t id;
} meta_io;

static int load_id(cps__txn *txn, void *arg)
{
    meta_io *m = arg;
    unsigned char b[4];
    size_t len = sizeof b;
    if (cps__store_meta_get(txn, "node_id", b, &len) == 0 && len == 4)
        m->id = cps__le32_get(b);
    return 0;
}

static int save_id(cps__txn *txn, void *arg)
{
    unsigned char b[4];
    cps__le32_put(b, ((meta_io *)arg)->id);
    return cps__store_meta_put(txn, "node_id", b, sizeof b);
}

typedef struct job_io {
    uint64_t job, stored;
    int verdict;
} job_io;

/* Record the job this directory belongs to, or report the one it already belongs to. */
static int job_txn(cps__txn *txn, void *arg)
{
    job_io *j = arg;
    unsigned char b[8];
    size_t len = sizeof b;
    j->stored = cps__store_meta_get(txn, "job_id", b, &len) == 0 && len == 8 ? cps__le64_get(b) : 0;
    int store;
    j->verdict = cps__standing_job(j->job, j->stored, &store);
    if (!store)
        return 0;
    cps__le64_put(b, j->job);
    return cps__store_meta_put(txn, "job_id", b, sizeof b);
}

typedef struct layout_io {
    uint32_t stored; /* 0: no mark */
    uint64_t keys;
} layout_io;

/* Mark an empty directory with this build's key layout, or report the mark it has. */
static int layout_txn(cps__txn *txn, void *arg)
{
    layout_io *l = arg;
    unsigned char b[4];
    size_t len = sizeof b;
    int rc = cps__store_meta_get(txn, "key_layout", b, &len);
    if (rc == 0 && len == 4) {
        l->stored = cps__le32_get(b);
        return 0;
    }
    if (rc != 0 && rc != CPS_ENOTFOUND)
        return rc;
    if ((rc = cps__store_count(txn, &l->keys, NULL)) != 0 || l->keys)
        return rc; /* keys but no mark: written by a build before the mark */
    cps__le32_put(b, CPS_KEY_LAYOUT);
    l->stored = CPS_KEY_LAYOUT;
    return cps__store_meta_put(txn, "key_layout", b, sizeof b);
}

/* Returns 0 to go on, or CPS_EEXIST (logged) for a directory of another key layout. Run after
 * every wipe too: --reset-data drops the meta with the keys. */
static int check_layout(cps__server *s)
{
    layout_io l = {0, 0};
    int rc = cps__store_write(s->store, layout_txn, &l);
    if (rc != 0)
        return rc;
    if (l.stored != CPS_KEY_LAYOUT) {
        cps__log(
            CPS_LOG_ERROR, "server",
            "data directory %s holds %llu keys in key layout %u (1: FNV-1a, chainps before "
            "XXH3; 2: unbounded chunks), not %u: refusing it. To keep the parameters, export a "
            "checkpoint with "
            "the build that wrote it (chainps checkpoint export) and restore it with this one; or "
            "--reset-data to empty it",
            s->cfg.data_dir, (unsigned long long)l.keys, l.stored ? l.stored : 1u, CPS_KEY_LAYOUT);
        return CPS_EEXIST;
    }
    return 0;
}

/* A directory that holds another job's parameters is refused: joining would mix two models
 * (and two jobs' node ids). Returns 0 to go on, or CPS_EEXIST (logged). */
static int check_job(cps__server *s, uint64_t job)
{
    job_io j = {job, 0, 0};
    int rc = cps__store_write(s->store, job_txn, &j);
    if (rc != 0)
        return rc;
    if (j.verdict != 0) {
        cps__log(CPS_LOG_ERROR, "server",
                 "data directory %s belongs to job %016llx, not to this job (%016llx): refusing "
                 "it; give this server another --data, or --reset-data to empty it",
                 s->cfg.data_dir, (unsigned long long)j.stored, (unsigned long long)job);
        return CPS_EEXIST;
    }
    return 0;
}

static int wipe_txn(cps__txn *txn, void *arg)
{
    (void)arg;
    return cps__store_wipe(txn);
}

static int count_keys(cps__txn *txn, void *arg)
{
    cps__server *s = arg;
    return cps__store_count(txn, &s->stats.keys_stored, &s->stats.values_stored);
}

/* Every loop turn: what the heartbeat thread sends, and that the loop turned. */
static void beat_publish(cps__server *s, uint64_t now)
{
    cps__heartbeat_publish(s->beat, cps__fence_beating(s->fence), s->id, s->view.epoch, &s->stats,
                           now);
}

/* The server's store: the directory it was given, or by default the first DIR/server-N that
 * no other process holds, so that servers started from one working directory (ps-lite's
 * local.sh does that) never share an environment. s->cfg.data_dir becomes the one in use. */
static int open_store(cps__server *s, const cps__store_opts *so)
{
    if (s->cfg.data_dir_given)
        return cps__store_open(s->cfg.data_dir, so, &s->store);
    char base[sizeof s->cfg.data_dir];
    snprintf(base, sizeof base, "%s", s->cfg.data_dir);
    cps__store_opts quiet = *so;
    quiet.quiet_busy = 1;
    for (int n = 0; n < CPS_MAX_NODES; n++) {
        if (snprintf(s->cfg.data_dir, sizeof s->cfg.data_dir, "%s/server-%d", base, n) >=
            (int)sizeof s->cfg.data_dir)
            return CPS_EINVAL;
        int rc = cps__store_open(s->cfg.data_dir, &quiet, &s->store);
        if (rc != CPS_EBUSY) {
            if (rc == 0 && n > 0)
                cps__log(CPS_LOG_INFO, "server",
                         "%s/server-0..%d are held by other processes: using %s", base, n - 1,
                         s->cfg.data_dir);
            return rc;
        }
    }
    return CPS_EBUSY;
}

/* ---- the /metrics page (node/metrics.h) ---- */

/* Ranges whose chain holds us, by position. */
static void count_roles(const cps__server *s, uint32_t *head, uint32_t *middle, uint32_t *tail)
{
    *head = *middle = *tail = 0;
    for (uint32_t r = 0; r < s->view.nranges; r++) {
        const cps__range *rg = &s->view.ranges[r];
        for (uint32_t j = 0; j < rg->chain_len; j++) {
            if (rg->chain[j] != s->id)
                continue;
            if (j == 0)
                ++*head;
            else if (j + 1 == rg->chain_len)
                ++*tail;
            else
                ++*middle;
        }
    }
}

/* Render the page from the loop's own state and hand it to the HTTP thread. */
static void publish_metrics(cps__server *s)
{
    cps__prom *p = &s->page;
    const cps__node_stats *st = &s->stats;
    const cps__server_counters *c = &s->ctr;
    char labels[48];
    cps__prom_reset(p);
    snprintf(labels, sizeof labels, "rank=\"%u\"", s->rank);
#define COUNTER(name, help, v)                                                                     \
    cps__prom_family(p, name, "counter", help);                                                    \
    cps__prom_u64(p, name, labels, v)
#define GAUGE(name, help, v)                                                                       \
    cps__prom_family(p, name, "gauge", help);                                                      \
    cps__prom_u64(p, name, labels, v)
    COUNTER("chainps_server_pushes_total", "Push and push-pull requests received.", c->pushes);
    COUNTER("chainps_server_pulls_total", "Pull and push-pull requests received.", c->pulls);
    COUNTER("chainps_server_push_bytes_total", "Push payload bytes after decompression.",
            st->push_raw_bytes);
    COUNTER("chainps_server_received_push_bytes_total",
            "Push payload bytes as received (after snappy and lossy compression).",
            st->push_wire_bytes);
    COUNTER("chainps_server_pull_bytes_total", "Value bytes sent in replies to pulls.",
            st->pull_bytes);
    COUNTER("chainps_server_updates_applied_total",
            "Updates applied to the store (as head, middle or tail of a chain).",
            st->updates_applied);
    COUNTER("chainps_server_forwards_total", "Updates forwarded to a chain successor (FWDs sent).",
            c->forwards);
    COUNTER("chainps_server_forward_retries_total",
            "FWDs sent again because the successor had not acknowledged them in time.",
            c->forward_retries);
    COUNTER("chainps_server_late_gradients_total",
            "Sync gradients dropped because their step had closed without them (backup workers).",
            c->late_gradients);
    COUNTER("chainps_server_messages_total", "Messages received.", st->msgs_in);
    COUNTER("chainps_server_bad_messages_total", "Messages dropped as malformed or unexpected.",
            st->msgs_bad);
    GAUGE("chainps_server_step", "Highest training step this server applied.", st->step);
    GAUGE("chainps_server_keys", "Keys in this server's store.", st->keys_stored);
    GAUGE("chainps_view_epoch", "View epoch this server has installed.", s->view.epoch);
    GAUGE("chainps_server_joined", "1 while this server is a member of the job.",
          (uint64_t)cps__fence_joined(s->fence));
#undef COUNTER
#undef GAUGE
    uint32_t head, middle, tail;
    count_roles(s, &head, &middle, &tail);
    cps__prom_family(p, "chainps_server_ranges", "gauge",
                     "Key ranges this server holds, by its place in their chain.");
    const char *pos[3] = {"head", "middle", "tail"};
    uint32_t n[3] = {head, middle, tail};
    for (int i = 0; i < 3; i++) {
        char l[64];
        snprintf(l, sizeof l, "%s,position=\"%s\"", labels, pos[i]);
        cps__prom_u64(p, "chainps_server_ranges", l, n[i]);
    }
    cps__prom_histogram(p, "chainps_server_apply_latency_seconds",
                        "Time to apply one update to the store (one LMDB write transaction).",
                        labels, &c->apply);
    cps__metrics_publish_page(s->metrics, p, "server");
}

static int on_metrics(cps__loop *l, uint64_t id, void *ctx, uint64_t now)
{
    (void)l, (void)id, (void)now;
    publish_metrics(ctx);
    return 0;
}

/* ---- the event loop's timers and hook ---- */

static int on_hello(cps__loop *l, uint64_t id, void *ctx, uint64_t now)
{
    (void)now;
    cps__server *s = ctx;
    if (cps__fence_joined(s->fence)) {
        cps__loop_timer_del(l, id);
        return 0;
    }
    send_hello(s, s->addr, s->saved_id);
    return 0;
}

static int on_join_timeout(cps__loop *l, uint64_t id, void *ctx, uint64_t now)
{
    (void)id, (void)now;
    cps__server *s = ctx;
    if (cps__fence_joined(s->fence))
        return 0;
    cps__log(CPS_LOG_ERROR, "server", "no answer from the scheduler at %s within %.1f s",
             s->sched_url, s->cfg.join_timeout_ms / 1000.0);
    s->result = CPS_ETIMEDOUT;
    s->join_failed = 1;
    cps__loop_stop(l);
    return 0;
}

/* A server of a job whose scheduler is gone for good would otherwise serve no one for ever and
 * hold its data directory: once the scheduler has been unreachable (no connection to it and no
 * message from it) for CHAINPS_SCHEDULER_TIMEOUT_MS, leave with CPS_ESCHEDULER. The limit is far
 * above a scheduler's restart, which the job rides through (it is not on the data path). */
static int scheduler_gone(cps__server *s, uint64_t now)
{
    if (!cps__standing_sched_gone(cps__tp_peer_connected(s->tp, SCHED_PEER), &s->sched_seen_ms, now,
                                  s->cfg.scheduler_timeout_ms))
        return 0;
    cps__log(CPS_LOG_ERROR, "server",
             "leaving the job: the scheduler at %s has been unreachable for %.1f s "
             "(CHAINPS_SCHEDULER_TIMEOUT_MS=%u)",
             s->sched_url, (now - s->sched_seen_ms) / 1000.0, s->cfg.scheduler_timeout_ms);
    s->result = CPS_ESCHEDULER;
    return 1;
}

static int on_sync(cps__loop *l, uint64_t id, void *ctx, uint64_t now)
{
    (void)id;
    cps__server *s = ctx;
    if (!cps__fence_joined(s->fence))
        return 0;
    if (scheduler_gone(s, now)) {
        cps__loop_stop(l);
        return 0;
    }
    cps__store_read(s->store, count_keys, s); /* for status, once a second */
    /* In the background: an msync of a map busy with 16 MB pushes took 27-37 ms of the loop. */
    if (!s->cfg.sync_every_commit && cps__store_sync_async(s->store) != 0)
        cps__log(CPS_LOG_WARN, "server", "periodic sync failed");
    return 0;
}

static int on_acks_due(cps__loop *l, uint64_t id, void *ctx, uint64_t now)
{
    (void)l, (void)id;
    cps__server *s = ctx;
    if (cps__fence_joined(s->fence))
        cps__server_tick(s, now, 0);
    return 0;
}

/* Nothing to do itself: it only bounds the poll, so that before_sleep runs again. */
static int on_turn(cps__loop *l, uint64_t id, void *ctx, uint64_t now)
{
    (void)l, (void)id, (void)ctx, (void)now;
    return 0;
}

static uint64_t waiting_at(void *ctx, uint32_t node, uint64_t *heard)
{
    *heard = 0; /* an ack that makes progress restarts the wait (cps__chain_waiting_since) */
    const cps__server *s = ctx;
    return s->replica ? cps__replica_waiting_since(s->replica, node) : 0;
}

/* Every CPS_SUSPECT_REPORT_MS: tell the scheduler which successors have left our FWDs unacked
 * for the evidence time (recovery/suspect.h). Its probe decides; we only say where we wait. */
static void report_suspects(cps__server *s, uint64_t now)
{
    if (now - s->suspects_checked_ms < CPS_SUSPECT_REPORT_MS)
        return;
    s->suspects_checked_ms = now;
    cps__msg_report_suspects(s->tp, s->id, &s->view, cps__suspect_evidence_ms(s->cfg.dead_after_ms),
                             waiting_at, s, now);
}

/* (Re)start asking the scheduler to let us in: HELLO now and every HELLO_RETRY_MS, and give up
 * after join_timeout_ms. */
static int start_joining(cps__server *s)
{
    s->join_start_ms = cps__now_ms();
    s->sched_seen_ms = s->join_start_ms;
    cps__loop_timer_del(s->loop, T_SYNC);
    int rc = cps__loop_timer_add(s->loop, T_HELLO, 0, HELLO_RETRY_MS, on_hello, s);
    if (rc == 0)
        rc = cps__loop_timer_add(s->loop, T_JOIN, (uint64_t)s->cfg.join_timeout_ms + 1, 0,
                                 on_join_timeout, s);
    return rc;
}

/* Every turn, before the poll: first what follows the previous turn's messages (held acks,
 * the state machines' timeouts, finished threads, deadlines), then whether to go on, then what
 * precedes the next poll. */

/* SIGTERM while we hold ranges of a running job: ask the scheduler to move them away first and
 * keep serving until it tells us to exit (SHUTDOWN), so no replica is lost to a routine stop. A
 * second signal, a refusal or no answer stops us at once. Returns 1 while we keep serving. */
static int keep_serving_to_drain(cps__server *s, uint64_t now)
{
    uint32_t held = cps__drain_held(&s->view, s->id);
    int d = cps__drain_decide(s->drain, cps__role_stop_signals(), cps__fence_joined(s->fence),
                              cps__fence_fenced(s->fence), held, s->drain_asked_ms, now,
                              CPS_DRAIN_ANSWER_MS);
    if (d != CPS_DRAIN_ASK)
        return d == CPS_DRAIN_SERVE;
    cps__msg_hdr h = {.type = CPS_MSG_DRAIN, .sender = s->id, .epoch = s->view.epoch, .req_seq = 1};
    if (cps__msg_send(s->tp, SCHED_PEER, &h, NULL, 0) != 0)
        return 0;
    s->drain = CPS_DRAIN_ASKED;
    s->drain_asked_ms = now;
    cps__log(CPS_LOG_INFO, "server",
             "SIGTERM: asking the scheduler to move our %u range(s) to other servers before we "
             "exit",
             held);
    return 1;
}

static int before_sleep(cps__loop *l, void *ctx, uint64_t now)
{
    cps__server *s = ctx;
    if (cps__fence_joined(s->fence)) {
        cps__server_tick(s, now, 0);
        cps__server_reap_snapshots(s, 0);
        cps__server_cuts_tick(s, now, 0);
        cps__server_check_joins(s, now);
        report_suspects(s, now);
    }
    cps__temp_peers_expire(&s->temps, s->tp, now);
    if (s->disk_full) {
        /* Heartbeats stop with us: the scheduler fails our ranges over within its failure
         * timeout, and a restart once there is room rejoins them by state transfer. */
        cps__log(CPS_LOG_ERROR, "server",
                 "leaving the job: disk full in %s (the update it could not store is not "
                 "acknowledged); free space there and restart this server to rejoin",
                 s->cfg.data_dir);
        s->result = CPS_ENOSPC;
        cps__loop_stop(l);
        return 0;
    }
    if (s->poisoned) {
        cps__log(CPS_LOG_ERROR, "server",
                 "leaving the job: a store write failed, so this "
                 "replica's state is unknown");
        s->result = CPS_EPOISONED;
        cps__loop_stop(l);
        return 0;
    }
    now = cps__now_ms();
    int draining = !s->shutdown && cps__role_stop_requested() && keep_serving_to_drain(s, now);
    if (!draining && (s->shutdown || cps__role_stop_requested())) {
        cps__loop_stop(l);
        return 0;
    }
    if (cps__fence_fenced(s->fence)) {
        /* Start over as a new replica: the scheduler revives us, and state transfer gives us
         * ranges again; what our store holds for other ranges is cleared when we join them.
         * Silence the heartbeats first: a beat from a server the view lists as dead earns it
         * a VIEW that the rejoin would take for its WELCOME. */
        beat_publish(s, now);
        rejoin(s);
        int rc = start_joining(s);
        if (rc != 0)
            return rc;
    }
    cps__server_turned(s, now);
    beat_publish(s, now);
    if (cps__fence_joined(s->fence)) {
        if (s->saved_id != s->id) {
            meta_io m = {s->id};
            cps__store_write(s->store, save_id, &m);
            s->saved_id = s->id;
        }
        if (!cps__loop_timer_armed(l, T_SYNC, NULL)) {
            int rc = cps__loop_timer_add(l, T_SYNC, 0, SYNC_EVERY_MS, on_sync, s);
            if (rc != 0)
                return rc;
        }
        int wait = cps__server_ack_wait_ms(s, now, TURN_MAX_MS);
        if (wait < TURN_MAX_MS) {
            int rc = cps__loop_timer_add(l, T_ACKS, (uint64_t)wait, 0, on_acks_due, s);
            if (rc != 0)
                return rc;
        }
    }
    return cps__loop_timer_add(
        l, T_TURN, cps__fence_joined(s->fence) ? TURN_MAX_MS : TURN_MAX_UNJOINED_MS, 0, on_turn, s);
}

int cps__server_run(const cps__config *cfg)
{
    cps__server s;
    memset(&s, 0, sizeof s);
    s.cfg = *cfg;
    cps__config_finalize(&s.cfg, CPS_ROLE_SERVER);
    cfg = &s.cfg;
    cps__log_set_tag("server");
    if (cps__node_load_secret(&s.cfg, "server") != 0)
        return CPS_ECONFIG;
    cps__view_init(&s.view);
    s.boot_id = cps__splitmix64(cps__now_ms() ^ ((uint64_t)getpid() << 32)) | 1;
    /* Servers share the machine's cores with workers: BLAS must not spawn threads. */
    cps__blas_end_pool();
    cps__tune_malloc();

    cps__store_opts so = {.initial_map_bytes = 0,
                          .sync_every_commit = cfg->sync_every_commit,
                          .before_grow = cps__server_cuts_before_grow,
                          .grow_ctx = &s};
    int rc = open_store(&s, &so);
    if (rc != 0) {
        cps__log(CPS_LOG_ERROR, "server", "cannot open the store in %s: %s", cfg->data_dir,
                 cps_strerror(rc));
        return rc;
    }
    if (cfg->reset_data) {
        rc = cps__store_write(s.store, wipe_txn, NULL);
        if (rc != 0) {
            cps__log(CPS_LOG_ERROR, "server", "cannot empty %s: %s", cfg->data_dir,
                     cps_strerror(rc));
            cps__store_close(s.store);
            return rc;
        }
        cps__log(CPS_LOG_INFO, "server", "emptied the store in %s (--reset-data)", cfg->data_dir);
    }
    if ((rc = check_layout(&s)) != 0) {
        cps__store_close(s.store);
        return rc;
    }
    meta_io prev = {0};
    cps__store_read(s.store, load_id, &prev);
    cps__store_read(s.store, count_keys, &s);
    if (prev.id)
        cps__log(CPS_LOG_INFO, "server", "store %s holds %llu keys (%llu values) from node %u",
                 cfg->data_dir, (unsigned long long)s.stats.keys_stored,
                 (unsigned long long)s.stats.values_stored, prev.id);

    rc = cps__tp_create(cps__node_key(cfg), &s.tp);
    uint16_t port = 0;
    if (rc == 0)
        rc = cps__tp_bind(s.tp, cfg->bind_host, cfg->port, &port);
    char url[CPS_ADDR_MAX + 16];
    snprintf(url, sizeof url, "tcp://%s:%u", cfg->sched_host, cfg->sched_port);
    if (rc == 0)
        rc = cps__tp_peer_set(s.tp, SCHED_PEER, url);
    if (rc != 0) {
        cps__log(CPS_LOG_ERROR, "server", "transport setup failed: %s", cps_strerror(rc));
        goto out;
    }
    char addr[CPS_ADDR_MAX];
    rc = cps__make_url(addr, cfg->advertise_host, port);
    if (rc != 0)
        goto out;
    cps__log(CPS_LOG_INFO, "server", "inbox %s (bound on %s), data in %s, scheduler %s", addr,
             cfg->bind_host, cfg->data_dir, url);

    uint32_t stall_ms =
        4 * cfg->dead_after_ms > BEAT_STALL_LIMIT_MS ? 4 * cfg->dead_after_ms : BEAT_STALL_LIMIT_MS;
    rc = cps__heartbeat_start(url, cps__node_key(cfg), cfg->heartbeat_ms, stall_ms, "server",
                              &s.beat);
    if (rc != 0)
        goto out;
    snprintf(s.sched_url, sizeof s.sched_url, "%s", url);
    snprintf(s.addr, sizeof s.addr, "%s", addr);
    s.saved_id = prev.id;
    s.after_apply = cps__server_cuts_after_apply;
    rc = cps__server_replica_new(&s);
    if (rc == 0)
        rc = cps__loop_create(&s.loop);
    if (rc == 0)
        rc = cps__loop_tp_attach(&s.inbox, s.loop, s.tp, handle_msg, &s, MSGS_PER_TURN);
    if (rc == 0)
        rc = start_joining(&s);
    if (rc == 0 && cfg->metrics_port) {
        cps__prom_init(&s.page);
        rc = cps__metrics_start(cfg->metrics_bind, cfg->metrics_port, "server", &s.metrics);
        if (rc == 0)
            rc = cps__loop_timer_add(s.loop, T_METRICS, 0, METRICS_EVERY_MS, on_metrics, &s);
    }
    if (rc != 0)
        goto out;
    cps__loop_before_sleep(s.loop, before_sleep, &s);
    rc = cps__loop_run(s.loop);
    if (rc == 0)
        rc = s.result;
    if (s.join_failed)
        goto out;
    rc = rc < 0 ? rc : 0;
    if (!s.poisoned)
        cps__server_tick(&s, cps__now_ms(), 1); /* held acks go out */
    if (s.ctr.late_gradients)                   /* backup workers: said only when there were any */
        cps__log(CPS_LOG_INFO, "server",
                 "stopping: %llu updates applied, %llu bad messages, %llu late gradients dropped",
                 (unsigned long long)s.stats.updates_applied, (unsigned long long)s.stats.msgs_bad,
                 (unsigned long long)s.ctr.late_gradients);
    else
        cps__log(CPS_LOG_INFO, "server", "stopping: %llu updates applied, %llu bad messages",
                 (unsigned long long)s.stats.updates_applied, (unsigned long long)s.stats.msgs_bad);
out:
    cps__metrics_stop(s.metrics);
    cps__prom_fini(&s.page);
    cps__loop_tp_detach(&s.inbox);
    cps__loop_destroy(s.loop);
    s.loop = NULL;
    cps__heartbeat_stop(s.beat);
    cps__server_reap_snapshots(&s, 1);
    cps__server_cuts_tick(&s, cps__now_ms(), 1);
    cps__cut_book_fini(&s.cut_book);
    cps__server_data_fini(&s);
    cps__tp_destroy(s.tp);
    cps__store_close(s.store);
    cps__view_fini(&s.view);
    return s.refused ? s.refused : rc;
}
