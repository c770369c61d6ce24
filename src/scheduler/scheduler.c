/* The scheduler's shell: sockets, the LMDB store, the /metrics page and the event loop around
 * recovery/coordinator.h, which decides everything the protocol decides (admission, deaths,
 * repairs, drains, barriers, the end of the job). Here messages are parsed and stepped into the
 * coordinator, and its output is performed in its order: persist, then send. Tools' requests
 * (STATUS, REGISTRY, DRAIN, RELEASE) are answered by the coordinator too; this file only makes the
 * temporary peer a tool is answered at. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "chainps/error.h"
#include "core/config.h"
#include "core/log.h"
#include "core/prom.h"
#include "core/view.h"
#include "core/wire.h"
#include "node/loop.h"
#include "node/metrics.h"
#include "node/msg.h"
#include "node/roles.h"
#include "node/temp_peers.h"
#include "recovery/coordinator.h"
#include "store/store.h"
#include "transport/transport.h"

#define SCHED_ID           0u
#define REPAIR_EVERY_MS    500
#define SAVE_RETRY_MS      200
#define JOIN_GIVE_UP_MS    120000
#define SHUTDOWN_LINGER_MS 300
/* How long the ended job waits for queued messages (SHUTDOWN to a server still connecting). */
#define SHUTDOWN_DRAIN_MAX_MS 3000
/* The coordinator's tick: how stale a death may be noticed, how late a batched view or a save
 * retry may go out, and how often we check that we ourselves ran. */
#define DETECT_EVERY_MS 20
/* Inbox messages handled per loop turn, so a flood still lets the timers run. */
#define MSGS_PER_TURN 256
/* Joiners that catch up (appended as tails) and moves that complete (their old member trimmed)
 * within this long go out in one view: every view makes the workers re-send what they have in
 * flight under it, which for a large model is most of a step. */
#define BATCH_MS 100
/* How often the /metrics page is rendered (scrapes come every 10-60 s). */
#define METRICS_EVERY_MS 250

/* The event loop's timers (node/loop.h). */
enum {
    T_DETECT = 1, /* periodic DETECT_EVERY_MS: the coordinator's tick */
    T_FINISH,     /* the job ended: linger, then wait (bounded) for queues to drain */
    T_STOP,       /* a stop was requested: linger, then stop */
    T_METRICS,    /* periodic METRICS_EVERY_MS with --metrics-port: publish the /metrics page */
};

typedef struct cps__sched {
    cps__config cfg;
    uint64_t job_id; /* made once per scheduler data directory; servers record it */
    cps__tp *tp;
    cps__coord *co;
    cps__temp_peers temps;
    cps__store *store; /* the view and the job's progress, so a restarted scheduler resumes */
    cps__loop *loop;
    cps__loop_tp inbox;
    uint64_t finish_at; /* when the ended job's linger is over */
    int stopping;       /* a stop was requested and is lingering */
    int result;         /* what cps__scheduler_run returns once the loop stops */
    const char *dir;
    /* Test-only fault injection (CHAINPS_FAILPOINT_SCHED_SAVE=FIRST:COUNT): saves number FIRST
     * .. FIRST+COUNT-1 (counted from 1) fail as a full disk would. */
    uint32_t saves, fail_first, fail_count;
    cps__metrics *metrics; /* --metrics-port; NULL when off */
    cps__prom page;        /* the page last rendered (buffer reused) */
} cps__sched;

static void publish_metrics(cps__sched *s);

/* ---- persistence: the coordinator's blobs, the last checkpoint, the tensor registry ---- */

typedef struct blobs_io {
    const char *names[CPS_COORD_BLOBS];
    cps__coord_blob b[CPS_COORD_BLOBS];
    int n;
} blobs_io;

static int save_txn(cps__txn *txn, void *arg)
{
    blobs_io *io = arg;
    int rc = 0;
    for (int i = 0; rc == 0 && i < io->n; i++)
        rc = cps__store_blob_put(txn, io->names[i], io->b[i].data, io->b[i].len);
    return rc;
}

/* Write the view and the job's progress; the coordinator holds its views back if this fails. */
static int save(cps__sched *s)
{
    if (!s->store)
        return 0;
    blobs_io io;
    io.n = cps__coord_blobs(s->co, io.names, io.b);
    int rc = io.n < 0 ? io.n : 0;
    s->saves++;
    if (rc == 0 && s->saves >= s->fail_first && s->saves - s->fail_first < s->fail_count)
        rc = CPS_ENOSPC; /* the failpoint */
    if (rc == 0)
        rc = cps__store_write(s->store, save_txn, &io);
    return rc;
}

static int save_ckpt_txn(cps__txn *txn, void *arg)
{
    const cps__ckpt_note *n = arg;
    unsigned char b[CPS_CKPT_NOTE_FIXED + CPS_CKPT_NOTE_PATH_MAX];
    size_t len = cps__ckpt_note_encode(b, sizeof b, n);
    return cps__store_blob_put(txn, "sched/ckpt", b, len);
}

static int save_registry_txn(cps__txn *txn, void *arg)
{
    cps__sched *s = arg;
    size_t len;
    unsigned char *b = cps__coord_registry_blob(s->co, &len);
    if (!b)
        return CPS_ENOMEM;
    int rc = cps__store_blob_put(txn, "sched/registry", b, len);
    free(b);
    return rc;
}

static int get_blob(void *ctx, const char *name, const void **data, size_t *len)
{
    return cps__store_blob_get(ctx, name, data, len);
}

typedef struct load_io {
    cps__sched *s;
    int rc;
} load_io;

static int load_txn(cps__txn *txn, void *arg)
{
    load_io *io = arg;
    io->rc = cps__coord_resume(io->s->co, get_blob, txn, cps__loop_now(io->s->loop));
    return io->rc < 0 ? io->rc : 0;
}

static int job_id_txn(cps__txn *txn, void *arg)
{
    cps__sched *s = arg;
    const void *have;
    size_t len = 0;
    if (cps__store_blob_get(txn, "sched/job_id", &have, &len) == 0 && len == 8) {
        s->job_id = cps__le64_get(have);
        return 0;
    }
    unsigned char b[8];
    cps__le64_put(b, s->job_id);
    return cps__store_blob_put(txn, "sched/job_id", b, sizeof b);
}

/* The job's id: the one this data directory has, or a new one (a resumed scheduler is the same
 * job; a scheduler on a fresh directory a new one). */
static int job_id_load(cps__sched *s)
{
    s->job_id = cps__splitmix64(cps__now_ms() ^ ((uint64_t)getpid() << 20) ^ (uintptr_t)s) | 1;
    int rc = cps__store_write(s->store, job_id_txn, s);
    if (rc == 0)
        cps__log(CPS_LOG_INFO, "scheduler", "job %016llx", (unsigned long long)s->job_id);
    return rc;
}

/* ---- performing the coordinator's output ---- */

static void send_view(cps__sched *s, const cps__coord_action *a, const cps__coord_blob *v)
{
    cps__msg_hdr h = a->hdr;
    h.aux = s->job_id; /* servers refuse a data directory of another job */
    void *buf = cps__msg_alloc(&h, v->len);
    if (!buf)
        return;
    memcpy((char *)buf + CPS_WIRE_HDR_SIZE, v->data, v->len);
    int rc = cps__tp_send(s->tp, a->peer, buf, CPS_WIRE_HDR_SIZE + v->len);
    if (rc != 0) {
        cps__tp_free(buf);
        cps__log(CPS_LOG_WARN, "scheduler", "could not send view to node %u: %s", a->peer,
                 cps_strerror(rc));
    }
}

static void perform_one(cps__sched *s, const cps__coord_out *o, const cps__coord_action *a)
{
    cps__msg_hdr h = a->hdr;
    int rc = 0;
    switch (a->kind) {
    case CPS_CO_VIEW:
        send_view(s, a, &o->views[a->view]);
        break;
    case CPS_CO_MSG:
        rc = cps__msg_send(s->tp, a->peer, &h, NULL, 0);
        if (rc != 0)
            cps__log(cps__coord_unsent(s->co, &a->hdr), "scheduler", "send to node %u failed: %s",
                     a->peer, cps_strerror(rc));
        break;
    case CPS_CO_ERROR:
        cps__msg_reply_error(s->tp, SCHED_ID, cps__coord_epoch(s->co), &h, a->code, a->text);
        break;
    case CPS_CO_TO_ADDR: {
        uint32_t tmp = cps__temp_peer_add(&s->temps, s->tp, a->addr, cps__now_ms());
        if (!tmp) {
            cps__log(CPS_LOG_WARN, "scheduler",
                     "cannot answer %s: no temporary peer for it now (unreachable, or %d others "
                     "still lingering)",
                     a->addr, CPS_TEMP_PEERS);
            break;
        }
        h.sender = tmp;
        if (a->code)
            cps__msg_reply_error(s->tp, SCHED_ID, cps__coord_epoch(s->co), &h, a->code, a->text);
        else
            cps__msg_send(s->tp, tmp, &h, NULL, 0);
        break;
    }
    case CPS_CO_PEER_SET:
        if (!a->force && cps__tp_peer_known(s->tp, a->peer))
            break;
        if ((rc = cps__tp_peer_set(s->tp, a->peer, a->addr)) != 0)
            cps__log(CPS_LOG_WARN, "scheduler", "cannot reach node %u at %s: %s", a->peer, a->addr,
                     cps_strerror(rc));
        break;
    case CPS_CO_PEER_DROP:
        cps__tp_peer_drop(s->tp, a->peer);
        break;
    case CPS_CO_LOG:
        cps__log(a->level, "scheduler", "%s", a->text);
        break;
    case CPS_CO_REPLY:
        rc = cps__msg_send(s->tp, a->peer, &h, o->views[a->view].data, o->views[a->view].len);
        if (rc != 0)
            cps__log(CPS_LOG_WARN, "scheduler", "reply to tool %u failed: %s", a->peer,
                     cps_strerror(rc));
        break;
    default:
        break; /* withdrawn */
    }
}

/* The coordinator's output in its order: persist, then everything else. */
static void perform(cps__sched *s)
{
    cps__coord_out *o = cps__coord_ready(s->co);
    unsigned persist = o->persist;
    int rc;
    if ((persist & CPS_CO_P_CKPT) && s->store &&
        (rc = cps__store_write(s->store, save_ckpt_txn, (void *)cps__coord_ckpt(s->co))) != 0)
        cps__log(CPS_LOG_WARN, "scheduler", "cannot save the last checkpoint's record: %s",
                 cps_strerror(rc));
    if ((persist & CPS_CO_P_REGISTRY) && s->store &&
        (rc = cps__store_write(s->store, save_registry_txn, s)) != 0)
        cps__log(CPS_LOG_ERROR, "scheduler", "cannot save the tensor registry: %s",
                 cps_strerror(rc));
    if (persist)
        cps__coord_persisted(s->co, (persist & CPS_CO_P_STATE) ? save(s) : 0,
                             cps__loop_now(s->loop));
    for (size_t i = 0; i < o->n; i++)
        perform_one(s, o, &o->a[i]);
    cps__coord_done(s->co);
    if ((persist & CPS_CO_P_CKPT) && s->metrics)
        publish_metrics(s); /* now, so /metrics agrees with `chainps status` at once */
}

/* ---- messages ---- */

/* A request from a tool that is not a member (its payload is a hello naming its inbox): the
 * temporary peer id to answer it at, or 0 (logged) if the request is malformed. */
static uint32_t tool_peer(cps__sched *s, const cps__rx *rx)
{
    uint32_t peer = 0;
    if (cps__temp_peer_from_hello(&s->temps, s->tp, rx->payload, rx->len, cps__now_ms(), &peer,
                                  NULL) != 0)
        cps__log(CPS_LOG_WARN, "scheduler", "malformed request of type %u from a tool dropped",
                 rx->hdr.type);
    return peer;
}

/* Milliseconds since 1970 by this machine's clock: checkpoint times are wall-clock times. */
static uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void handle_msg(void *ctx, void *buf, size_t len)
{
    cps__sched *s = ctx;
    cps__rx rx;
    int rc = cps__rx_parse(&rx, buf, len);
    if (rc != 0) {
        cps__log(CPS_LOG_ERROR, "scheduler", "bad message (%zu bytes) dropped: %s", len,
                 cps_strerror(rc));
        return;
    }
    const cps__msg_hdr *h = &rx.hdr;
    uint32_t reply_to = cps__coord_tool_request(h) ? tool_peer(s, &rx) : h->sender;
    if (h->type == CPS_MSG_STATUS) /* the only reply that reads the wall clock */
        cps__coord_set_wall(s->co, wall_ms());
    /* The loop's clock of this turn, which the ticks also read (see recovery/suspect.c). */
    cps__coord_step(s->co, h, rx.payload, rx.len, reply_to, cps__loop_now(s->loop));
    perform(s);
    cps__rx_free(&rx);
}

/* ---- the /metrics page (node/metrics.h) ---- */

static void publish_metrics(cps__sched *s)
{
    cps__prom *p = &s->page;
    cps__prom_reset(p);
    uint32_t nn;
    const cps__coord_node *nodes = cps__coord_nodes(s->co, &nn);
    const cps__view *v = cps__coord_view(s->co);
    cps__coord_counts k = cps__coord_counters(s->co);
    cps__coord_summary m = cps__coord_summarize(s->co);
    const cps__ckpt_note *ck = cps__coord_ckpt(s->co);
#define FAMILY(name, type, help, v)                                                                \
    cps__prom_family(p, name, type, help);                                                         \
    cps__prom_u64(p, name, NULL, v)
    FAMILY("chainps_view_epoch", "gauge", "The view epoch the scheduler published last.", v->epoch);
    FAMILY("chainps_job_running", "gauge", "1 once every node joined and until the job ends.",
           (uint64_t)m.running);
    FAMILY("chainps_job_step", "gauge", "The job's step: the highest any server applied.", m.step);
    FAMILY("chainps_live_servers", "gauge", "Servers the view counts alive.", m.live_servers);
    FAMILY("chainps_live_workers", "gauge", "Workers alive and not finished.", m.live_workers);
    FAMILY("chainps_workers_finished", "gauge", "Workers that said goodbye.", k.workers_done);
    /* The servers' counters as their heartbeats report them: a restarted server's start over,
     * which Prometheus's rate() takes for a counter reset. */
    FAMILY("chainps_job_push_bytes_total", "counter",
           "Push payload bytes the servers received, after decompression (from heartbeats).",
           m.push_raw_bytes);
    FAMILY("chainps_job_received_push_bytes_total", "counter",
           "Push payload bytes the servers received, as sent (from heartbeats).",
           m.push_wire_bytes);
    FAMILY("chainps_job_pull_bytes_total", "counter",
           "Value bytes the servers sent to pulls (from heartbeats).", m.pull_bytes);
    FAMILY("chainps_job_updates_applied_total", "counter",
           "Updates the servers applied, every replica counted (from heartbeats).",
           m.updates_applied);
    FAMILY("chainps_checkpoints_total", "counter", "Checkpoints completed in this job.", ck->id);
    FAMILY("chainps_servers_draining", "gauge", "Servers whose ranges are being moved away.",
           m.draining);
    FAMILY("chainps_servers_drained_total", "counter", "Servers drained and let go since start.",
           k.drained);
    FAMILY("chainps_range_moves_total", "counter",
           "Ranges moved to another server (balance, drains) since this scheduler started.",
           k.moves);
#undef FAMILY
    cps__prom_family(p, "chainps_declared_deaths_total", "counter",
                     "Nodes the scheduler declared dead, by role.");
    cps__prom_u64(p, "chainps_declared_deaths_total", "role=\"server\"", k.deaths_server);
    cps__prom_u64(p, "chainps_declared_deaths_total", "role=\"worker\"", k.deaths_worker);
    char l[48];
    cps__prom_family(
        p, "chainps_ranges_stranded", "gauge",
        "Ranges held unavailable because their only replica came back with an empty "
        "store (see the scheduler's ERROR: old disk, checkpoint or --allow-rollback).");
    cps__prom_u64(p, "chainps_ranges_stranded", NULL, m.stranded);
    if (v->nranges) {
        cps__prom_family(p, "chainps_range_replicas", "gauge",
                         "Servers in each key range's chain (the target is the job's replicas).");
        for (uint32_t r = 0; r < v->nranges; r++) {
            snprintf(l, sizeof l, "range=\"%u\"", r);
            cps__prom_u64(p, "chainps_range_replicas", l, v->ranges[r].chain_len);
        }
    }
    int any_worker = 0;
    for (uint32_t i = 0; i < nn; i++) {
        const cps__coord_node *n = &nodes[i];
        if (!cps__coord_shows_clock(s->co, i))
            continue;
        if (!any_worker++)
            cps__prom_family(p, "chainps_worker_clock", "gauge",
                             "Each worker's last pushed step (its SSP clock), by rank.");
        snprintf(l, sizeof l, "rank=\"%u\"", n->info.rank);
        cps__prom_u64(p, "chainps_worker_clock", l, n->stats.step);
    }
    if (ck->id) {
        uint64_t wall = wall_ms();
        cps__prom_family(p, "chainps_checkpoint_last_id", "gauge",
                         "Number of the last completed checkpoint (1, 2, ... in this job).");
        cps__prom_u64(p, "chainps_checkpoint_last_id", NULL, ck->id);
        cps__prom_family(p, "chainps_checkpoint_last_step", "gauge",
                         "Training step of the last completed checkpoint.");
        cps__prom_u64(p, "chainps_checkpoint_last_step", NULL, ck->step);
        cps__prom_family(p, "chainps_checkpoint_last_timestamp_seconds", "gauge",
                         "When the last checkpoint completed (Unix time).");
        cps__prom_f64(p, "chainps_checkpoint_last_timestamp_seconds", NULL,
                      (double)ck->unix_ms / 1000.0);
        cps__prom_family(p, "chainps_checkpoint_age_seconds", "gauge",
                         "Seconds since the last checkpoint completed.");
        cps__prom_f64(p, "chainps_checkpoint_age_seconds", NULL,
                      wall > ck->unix_ms ? (double)(wall - ck->unix_ms) / 1000.0 : 0.0);
    }
    cps__metrics_publish_page(s->metrics, p, "scheduler");
}

static int on_metrics(cps__loop *l, uint64_t id, void *ctx, uint64_t now)
{
    (void)l, (void)id, (void)now;
    publish_metrics(ctx);
    return 0;
}

/* CHAINPS_FAILPOINT_SCHED_SAVE=FIRST:COUNT (tests only): see sched.fail_first. */
static int failpoint_parse(cps__sched *s)
{
    const char *v = getenv("CHAINPS_FAILPOINT_SCHED_SAVE");
    if (!v || !*v)
        return 0;
    unsigned first, count;
    char end;
    if (sscanf(v, "%u:%u%c", &first, &count, &end) != 2 || first == 0) {
        cps__log(CPS_LOG_ERROR, "scheduler",
                 "CHAINPS_FAILPOINT_SCHED_SAVE must be FIRST:COUNT (FIRST >= 1), not '%s'", v);
        return -1;
    }
    s->fail_first = first;
    s->fail_count = count;
    cps__log(CPS_LOG_WARN, "scheduler",
             "test failpoint: saves %u to %u of the view fail as on a full disk", first,
             first + count - 1);
    return 0;
}

/* ---- the event loop's timers and hook ---- */

static int on_stop(cps__loop *l, uint64_t id, void *ctx, uint64_t now)
{
    (void)id, (void)ctx, (void)now;
    cps__loop_stop(l);
    return 0;
}

/* Serve messages for SHUTDOWN_LINGER_MS more (the SHUTDOWNs go out), then stop. */
static int linger_then_stop(cps__sched *s)
{
    s->stopping = 1;
    cps__loop_timer_del(s->loop, T_FINISH);
    return cps__loop_timer_add(s->loop, T_STOP, SHUTDOWN_LINGER_MS, 0, on_stop, s);
}

/* Every DETECT_EVERY_MS: the coordinator's tick, told which members' connections look gone (closed,
 * and their address refuses connections); the coordinator judges what that means. */
static int on_detect(cps__loop *l, uint64_t id, void *ctx, uint64_t now)
{
    (void)l, (void)id;
    cps__sched *s = ctx;
    uint32_t nn, gone[CPS_MAX_NODES];
    size_t ng = 0;
    const cps__coord_node *nodes = cps__coord_nodes(s->co, &nn);
    for (uint32_t i = 0; i < nn && ng < CPS_MAX_NODES; i++)
        if (cps__tp_peer_gone(s->tp, nodes[i].info.id))
            gone[ng++] = nodes[i].info.id;
    cps__coord_tick(s->co, now, gone, ng);
    perform(s);
    if (cps__coord_gave_up(s->co) && !s->stopping) {
        s->result = cps__coord_gave_up(s->co);
        return linger_then_stop(s);
    }
    return 0;
}

/* The ended job stops once its messages are on their way: after SHUTDOWN_LINGER_MS, when the
 * queues are empty, or SHUTDOWN_DRAIN_MAX_MS later (a queue for a peer that is gone never
 * drains). Checked every DETECT_EVERY_MS. */
static int on_finish(cps__loop *l, uint64_t id, void *ctx, uint64_t now)
{
    (void)id;
    cps__sched *s = ctx;
    if (cps__tp_queued(s->tp) == 0 || now >= s->finish_at + SHUTDOWN_DRAIN_MAX_MS)
        cps__loop_stop(l);
    return 0;
}

/* Every turn, before the poll. */
static int before_sleep(cps__loop *l, void *ctx, uint64_t now)
{
    cps__sched *s = ctx;
    if (cps__role_stop_requested() && !s->stopping) {
        cps__log(CPS_LOG_INFO, "scheduler", "stop requested; telling servers to shut down");
        cps__coord_stop(s->co);
        perform(s);
        int rc = linger_then_stop(s);
        if (rc != 0)
            return rc;
    }
    cps__temp_peers_expire(&s->temps, s->tp, now);
    if (cps__coord_finished(s->co) && !s->stopping && !cps__loop_timer_armed(l, T_FINISH, NULL)) {
        s->finish_at = now + SHUTDOWN_LINGER_MS;
        return cps__loop_timer_add(l, T_FINISH, SHUTDOWN_LINGER_MS, DETECT_EVERY_MS, on_finish, s);
    }
    return 0;
}

static int check_config(const cps__config *cfg)
{
    if (cfg->num_servers == 0 || cfg->num_workers == 0) {
        cps__log(CPS_LOG_ERROR, "scheduler",
                 "the number of servers and workers must be set (--servers/--workers or "
                 "CHAINPS_NUM_SERVERS/CHAINPS_NUM_WORKERS)");
        return CPS_ECONFIG;
    }
    if (cfg->replicas > cfg->num_servers) {
        cps__log(CPS_LOG_ERROR, "scheduler", "--replicas %u needs at least %u servers, not %u",
                 cfg->replicas, cfg->replicas, cfg->num_servers);
        return CPS_ECONFIG;
    }
    return 0;
}

/* The store: the job's id, and the unfinished job it holds (resumed). */
static int open_store(cps__sched *s, const char *dir)
{
    cps__store_opts so = {.initial_map_bytes = 8u << 20, .sync_every_commit = 1};
    int rc = cps__store_open(dir, &so, &s->store);
    if (rc == 0)
        rc = job_id_load(s);
    load_io io = {s, 0};
    if (rc == 0)
        rc = cps__store_read(s->store, load_txn, &io);
    if (rc == 0 && io.rc < 0)
        rc = io.rc;
    perform(s); /* the resumed job's view: saved, then sent */
    return rc;
}

int cps__scheduler_run(const cps__config *cfg)
{
    int rc = check_config(cfg);
    if (rc != 0)
        return rc;
    cps__sched s;
    memset(&s, 0, sizeof s);
    s.cfg = *cfg;
    cps__config_finalize(&s.cfg, CPS_ROLE_SCHEDULER);
    cfg = &s.cfg;
    if (cps__node_load_secret(&s.cfg, "scheduler") != 0)
        return CPS_ECONFIG;
    rc = cps__loop_create(&s.loop);
    /* One clock for the coordinator: the loop's (ticks and messages of a turn read the same). */
    cps__coord_config cc = {cfg,
                            REPAIR_EVERY_MS,
                            BATCH_MS,
                            JOIN_GIVE_UP_MS,
                            SAVE_RETRY_MS,
                            CPS_TEMP_PEER_BASE,
                            cps__loop_now(s.loop),
                            0};
    if (rc == 0)
        rc = cps__coord_create(&cc, &s.co);
    if (rc == 0)
        rc = cps__tp_create(cps__node_key(cfg), &s.tp);
    if (rc == 0)
        rc = cps__tp_bind(s.tp, cfg->bind_host, cfg->sched_port, NULL);
    if (rc != 0) {
        cps__log(CPS_LOG_ERROR, "scheduler",
                 "cannot listen on %s:%u: %s (is the address local? --bind 0.0.0.0 listens on "
                 "every interface)",
                 cfg->bind_host, cfg->sched_port, cps_strerror(rc));
        goto out;
    }
    cps__log_set_tag("scheduler");
    char dir[600];
    snprintf(dir, sizeof dir, "%s/scheduler", cfg->data_dir);
    s.dir = dir;
    if (failpoint_parse(&s) != 0) {
        rc = CPS_ECONFIG;
        goto out;
    }
    if ((rc = open_store(&s, dir)) != 0) {
        cps__log(CPS_LOG_ERROR, "scheduler", "cannot use %s: %s", dir, cps_strerror(rc));
        goto out;
    }
    if (!cps__coord_started(s.co))
        cps__log(CPS_LOG_INFO, "scheduler",
                 "listening on %s:%u, waiting for %u servers and %u workers (state in %s)",
                 cfg->bind_host, cfg->sched_port, cfg->num_servers, cfg->num_workers, dir);
    cps__loop_before_sleep(s.loop, before_sleep, &s);
    rc = cps__loop_tp_attach(&s.inbox, s.loop, s.tp, handle_msg, &s, MSGS_PER_TURN);
    if (rc == 0)
        rc = cps__loop_timer_add(s.loop, T_DETECT, DETECT_EVERY_MS, DETECT_EVERY_MS, on_detect, &s);
    if (rc == 0 && cfg->metrics_port) {
        cps__prom_init(&s.page);
        rc = cps__metrics_start(cfg->metrics_bind, cfg->metrics_port, "scheduler", &s.metrics);
        if (rc == 0)
            rc = cps__loop_timer_add(s.loop, T_METRICS, 0, METRICS_EVERY_MS, on_metrics, &s);
    }
    if (rc == 0)
        rc = cps__loop_run(s.loop);
    if (rc == 0)
        rc = s.result;
out:
    cps__metrics_stop(s.metrics);
    cps__prom_fini(&s.page);
    cps__loop_tp_detach(&s.inbox);
    cps__loop_destroy(s.loop);
    cps__tp_destroy(s.tp);
    cps__store_close(s.store);
    cps__coord_destroy(s.co);
    return rc;
}
