/* The scheduler: admits nodes, assigns ids and ranks, publishes the view (address book and
 * key-range chains), runs barriers, collects heartbeat statistics and ends the job when every
 * worker has finished. It is not on the data path. */
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
#include "recovery/incarnation.h"
#include "recovery/detector.h"
#include "recovery/suspect.h"
#include "recovery/repair.h"
#include "recovery/view_change.h"
#include "store/store.h"
#include "transport/transport.h"

#define SCHED_ID           0u
#define REPAIR_EVERY_MS    500
#define SAVE_RETRY_MS      200
#define JOIN_GIVE_UP_MS    120000
#define SHUTDOWN_LINGER_MS 300
/* How long the ended job waits for queued messages (SHUTDOWN to a server still connecting). */
#define SHUTDOWN_DRAIN_MAX_MS 3000
/* The failure detector's tick: how stale a death may be noticed, and how often we check that
 * we ourselves ran (see on_tick). */
#define DETECT_EVERY_MS 20
/* Inbox messages handled per loop turn, so a flood still lets the timers run. */
#define MSGS_PER_TURN 256

/* The event loop's timers (node/loop.h). */
enum {
    T_DETECT = 1, /* periodic DETECT_EVERY_MS: the failure detector */
    T_REPAIR,     /* periodic REPAIR_EVERY_MS, and at once after a death */
    T_SAVE,       /* one-shot SAVE_RETRY_MS after a failed save of the view */
    T_JOIN,       /* one-shot join_timeout_ms: give up on nodes that never arrived */
    T_FINISH,     /* the job ended: linger, then wait (bounded) for queues to drain */
    T_STOP,       /* a stop was requested: linger, then stop */
    T_METRICS,    /* periodic METRICS_EVERY_MS with --metrics-port: publish the /metrics page */
    T_BATCH,      /* one-shot BATCH_MS after a joiner caught up: its chain changes, in one view */
};

/* Joiners that catch up (appended as tails) and moves that complete (their old member trimmed)
 * within this long go out in one view: every view makes the workers re-send what they have in
 * flight under it, which for a large model is most of a step. */
#define BATCH_MS 100

/* How often the /metrics page is rendered (scrapes come every 10-60 s). */
#define METRICS_EVERY_MS 250

typedef struct sched_node {
    cps__node_info info;
    uint64_t boot_id; /* the incarnation that said HELLO (servers) */
    uint64_t last_seen_ms;
    cps__node_stats stats;
    int done;       /* worker said BYE */
    int draining;   /* server: its ranges are being moved away (`chainps drain`, SIGTERM) */
    int left;       /* server: drained and told to exit; no longer a member */
    int in_barrier; /* worker waiting in the current barrier */
    uint64_t barrier_seq;
    uint64_t shutdown_sent_ms; /* superseded worker still talking: when we last told it to go */
} sched_node;

typedef struct cps__sched {
    cps__config cfg;
    uint64_t job_id; /* made once per scheduler data directory; servers record it */
    cps__tp *tp;
    sched_node *nodes;
    uint32_t nnodes;
    uint32_t next_id;
    cps__view view;
    int started;
    uint64_t start_ms;
    uint32_t workers_done;
    cps__temp_peers temps;
    cps__detector *detector;
    cps__suspect *suspect; /* data-path evidence: reports of unanswered requests, probes */
    cps__repair *repair;   /* joins under way; made when the job runs */
    cps__store *store;     /* the view and the job's progress, so a restarted scheduler resumes */
    cps__loop *loop;
    cps__loop_tp inbox;
    uint64_t last_detect_ms; /* when the detector last ticked (a pause of ours shows there) */
    uint64_t finish_at;      /* when the ended job's linger is over */
    int stopping;            /* a stop was requested and is lingering */
    int result;              /* what cps__scheduler_run returns once the loop stops */
    /* The view in memory is newer than the saved one: no node is sent it until it is saved
     * (persist before publish), so a restarted scheduler never resumes an epoch older than one
     * some node has seen. Retried every SAVE_RETRY_MS. */
    int unsaved;
    uint8_t held_type; /* what the held view goes out as once saved: WELCOME or VIEW */
    uint32_t failed_saves;
    const char *dir;
    /* Test-only fault injection (CHAINPS_FAILPOINT_SCHED_SAVE=FIRST:COUNT): saves number FIRST
     * .. FIRST+COUNT-1 (counted from 1) fail as a full disk would. */
    uint32_t saves, fail_first, fail_count;
    int ending_held; /* every worker is done, but cfg.hold keeps the servers up */
    int finished;
    /* Tensor registry: the encoded descriptions the workers registered (tensor_desc in
     * core/wire.h), so a checkpoint can name the keys. Saved as sched/registry. */
    unsigned char *reg;
    size_t reg_len, reg_cap;
    uint32_t reg_count;
    /* Deaths declared, by role: counters of the /metrics page. */
    uint64_t deaths_server, deaths_worker;
    uint64_t moves, drained; /* ranges moved (trims), servers drained: /metrics counters */
    /* The last checkpoint a tool reported complete (CKPT_DONE); id 0: none. Saved as
     * sched/ckpt, so a restarted scheduler still knows it. */
    cps__ckpt_note ckpt;
    /* Joiners appended as tails in the next view (CPS_REPAIR_APPEND verdicts since the last
     * one): the view in memory stays the one published until then. */
    struct {
        uint32_t range, node;
    } appends[64];
    uint32_t nappends;
    cps__metrics *metrics; /* --metrics-port; NULL when off */
    cps__prom page;        /* the page last rendered (buffer reused) */
} cps__sched;

static const char *role_name(int role)
{
    return cps__config_role_str(role);
}

static uint32_t count_role(const cps__sched *s, int role)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->nnodes; i++)
        n += s->nodes[i].info.role == role;
    return n;
}

static sched_node *find_node(cps__sched *s, uint32_t id)
{
    for (uint32_t i = 0; i < s->nnodes; i++)
        if (s->nodes[i].info.id == id)
            return &s->nodes[i];
    return NULL;
}

/* A worker that died (not one that finished) leaves its rank to a worker joining later. */
static int rank_reusable(const sched_node *n)
{
    return n->info.role == CPS_ROLE_WORKER && !n->info.alive && !n->done;
}

static int rank_taken(const cps__sched *s, int role, uint32_t rank)
{
    for (uint32_t i = 0; i < s->nnodes; i++)
        if (s->nodes[i].info.role == role && s->nodes[i].info.rank == rank &&
            !(s->started && rank_reusable(&s->nodes[i])))
            return 1;
    return 0;
}

/* Members of a role that hold a place in the job (once it runs, dead workers do not). */
static uint32_t count_places(const cps__sched *s, int role)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->nnodes; i++)
        n += s->nodes[i].info.role == role && !(s->started && rank_reusable(&s->nodes[i]));
    return n;
}

static uint32_t free_rank(const cps__sched *s, int role, uint32_t want, uint32_t limit)
{
    if (want != UINT32_MAX && want < limit && !rank_taken(s, role, want))
        return want;
    for (uint32_t r = 0; r < limit; r++)
        if (!rank_taken(s, role, r))
            return r;
    return UINT32_MAX;
}

/* A dead (or finished) worker whose rank another worker took (cps__node_supersedes): it is
 * kept as a member, but nobody sends it anything. */
static int superseded(const cps__sched *s, const sched_node *n)
{
    for (uint32_t i = 0; i < s->nnodes; i++)
        if (cps__node_supersedes(&s->nodes[i].info, &n->info))
            return 1;
    return 0;
}

/* Our peers follow the members: a superseded worker's socket is closed (the soak found one fd,
 * and a queue of up to the transport's limit of views, kept per worker replacement), and a node
 * that is no longer superseded (a worker taken back alive) gets its peer again. */
static void sync_peers(cps__sched *s)
{
    for (uint32_t i = 0; i < s->nnodes; i++) {
        const sched_node *n = &s->nodes[i];
        if (superseded(s, n))
            cps__tp_peer_drop(s->tp, n->info.id);
        else if (!cps__tp_peer_known(s->tp, n->info.id) && n->info.addr[0] &&
                 cps__tp_peer_set(s->tp, n->info.id, n->info.addr) != 0)
            cps__log(CPS_LOG_WARN, "scheduler", "cannot reach node %u at %s", n->info.id,
                     n->info.addr);
    }
}

/* Rebuild the view's node list from the members (ranges are placed once, at start). */
static int sync_view_nodes(cps__sched *s)
{
    cps__node_info *nodes = calloc(s->nnodes ? s->nnodes : 1, sizeof *nodes);
    if (!nodes)
        return CPS_ENOMEM;
    for (uint32_t i = 0; i < s->nnodes; i++)
        nodes[i] = s->nodes[i].info;
    free(s->view.nodes);
    s->view.nodes = nodes;
    s->view.nnodes = s->nnodes;
    if (s->started) {
        uint32_t S = 0; /* servers that joined later count; drained ones do not */
        for (uint32_t i = 0; i < s->nnodes; i++)
            S += s->nodes[i].info.role == CPS_ROLE_SERVER && !s->nodes[i].left;
        s->view.num_servers = S;
    }
    return 0;
}

static int send_view(cps__sched *s, uint32_t peer, uint8_t type)
{
    if (s->unsaved)
        return CPS_EAGAIN; /* sent once saved (save_retry); nodes ask again meanwhile */
    /* Workers held back (a checkpoint is being restored) learn of the job only at RELEASE. */
    const sched_node *n = find_node(s, peer);
    if (n && n->info.role == CPS_ROLE_WORKER && s->cfg.hold_workers)
        return 0;
    if (n && superseded(s, n))
        return 0; /* its peer is gone (sync_peers): it is sent nothing */
    size_t len = cps__view_encoded_size(&s->view);
    cps__msg_hdr h = {0};
    h.type = type;
    h.sender = SCHED_ID;
    h.epoch = s->view.epoch;
    h.req_worker = peer;
    h.aux = s->job_id; /* servers refuse a data directory of another job */
    /* A WELCOME names the incarnation whose HELLO it answers: a server lets itself in only by
     * its own (recovery/fence.h). */
    if (type == CPS_MSG_WELCOME) {
        const sched_node *w = find_node(s, peer);
        h.req_seq = w ? w->boot_id : 0;
    }
    void *buf = cps__msg_alloc(&h, len);
    if (!buf)
        return CPS_ENOMEM;
    cps__view_encode(&s->view, (char *)buf + CPS_WIRE_HDR_SIZE, len);
    int rc = cps__tp_send(s->tp, peer, buf, CPS_WIRE_HDR_SIZE + len);
    if (rc != 0) {
        cps__tp_free(buf);
        cps__log(CPS_LOG_WARN, "scheduler", "could not send view to node %u: %s", peer,
                 cps_strerror(rc));
    }
    return rc;
}

static void send_simple(cps__sched *s, uint32_t peer, uint8_t type, const cps__msg_hdr *req)
{
    cps__msg_hdr h = {0};
    h.type = type;
    h.sender = SCHED_ID;
    h.epoch = s->view.epoch;
    if (req) {
        h.flags = CPS_WF_REPLY;
        h.req_worker = req->req_worker;
        h.req_seq = req->req_seq;
        h.step = req->step;
    }
    int rc = cps__msg_send(s->tp, peer, &h, NULL, 0);
    if (rc != 0)
        cps__log(CPS_LOG_WARN, "scheduler", "send to node %u failed: %s", peer, cps_strerror(rc));
}

static int save(cps__sched *s);
static int on_save_retry(cps__loop *l, uint64_t id, void *ctx, uint64_t now);

/* The job runs (fresh, or resumed after a restart): join bookkeeping, and the failure detector
 * watches every live member. */
static int begin_running(cps__sched *s)
{
    /* Join ids grow across our restarts (see cps__repair_config): each life starts its ids at
     * (its first epoch) << 32, above the saved epoch of any earlier life, since a life saves the
     * epoch it starts at before it issues a join; none issues 2^32 joins. */
    cps__repair_config rcfg = {s->view.nranges, JOIN_GIVE_UP_MS, (s->view.epoch + 1) << 32, 1};
    int err = cps__repair_create(&rcfg, &s->repair);
    if (err != 0)
        return err;
    s->started = 1;
    uint64_t now = cps__now_ms();
    for (uint32_t i = 0; i < s->nnodes; i++) {
        if (s->nodes[i].info.alive && !s->nodes[i].done)
            cps__detector_watch(s->detector, s->nodes[i].info.id, now);
        if (s->nodes[i].draining)
            cps__repair_set_draining(s->repair, s->nodes[i].info.id, 1);
    }
    return 0;
}

static int start_job(cps__sched *s)
{
    uint32_t S = count_role(s, CPS_ROLE_SERVER);
    uint32_t *servers = calloc(S, sizeof *servers);
    if (!servers)
        return CPS_ENOMEM;
    for (uint32_t i = 0; i < s->nnodes; i++)
        if (s->nodes[i].info.role == CPS_ROLE_SERVER)
            servers[s->nodes[i].info.rank] = s->nodes[i].info.id;
    s->view.epoch = 1;
    s->view.mode = s->cfg.mode;
    s->view.ssp_bound = s->cfg.ssp_bound;
    s->view.backup_workers = s->cfg.mode == CPS_MODE_SYNC ? s->cfg.backup_workers : 0;
    s->view.num_workers = s->cfg.num_workers;
    s->view.num_servers = S;
    /* Default: chains of 3 (or every server, when there are fewer). */
    s->view.replicas = s->cfg.replicas ? s->cfg.replicas : (S < 3 ? S : 3);
    /* More ranges than servers (--ranges) let servers added later take a share of them. */
    uint32_t nranges = s->cfg.num_ranges ? s->cfg.num_ranges : S;
    int rc = cps__view_place_ranges(&s->view, nranges, servers, S, s->view.replicas);
    free(servers);
    if (rc == 0)
        rc = sync_view_nodes(s);
    if (rc != 0)
        return rc;
    int rc2 = begin_running(s);
    if (rc2 != 0)
        return rc2;
    char mode[32];
    cps__log(CPS_LOG_INFO, "scheduler",
             "connected %u workers and %u servers; view epoch %llu, %u ranges, %u replica(s), "
             "mode %s, %u backup worker(s)",
             s->cfg.num_workers, S, (unsigned long long)s->view.epoch, s->view.nranges,
             s->view.replicas,
             cps__config_mode_str(s->cfg.mode, s->cfg.ssp_bound, mode, sizeof mode),
             s->view.backup_workers);
    s->held_type = CPS_MSG_WELCOME;
    save(s);
    for (uint32_t i = 0; i < s->nnodes; i++)
        send_view(s, s->nodes[i].info.id, CPS_MSG_WELCOME);
    if (s->cfg.hold_workers)
        cps__log(CPS_LOG_INFO, "scheduler",
                 "holding the workers back until the checkpoint is "
                 "restored");
    return 0;
}

static void publish_view(cps__sched *s, const char *why);
static void maybe_release_barrier(cps__sched *s);
static void maybe_end_job(cps__sched *s);
static void declare_dead(cps__sched *s, uint32_t id, uint64_t silence_ms);
static void on_suspect(cps__sched *s, sched_node *n, const cps__rx *rx);

static void handle_hello(cps__sched *s, const cps__rx *rx)
{
    uint32_t role, want_rank, prev_id;
    char addr[CPS_ADDR_MAX];
    int rc = cps__hello_decode(rx->payload, rx->len, &role, &want_rank, &prev_id, addr);
    if (rc != 0) {
        cps__log(CPS_LOG_ERROR, "scheduler", "malformed HELLO dropped: %s", cps_strerror(rc));
        return;
    }
    if (role != CPS_ROLE_SERVER && role != CPS_ROLE_WORKER) {
        cps__log(CPS_LOG_ERROR, "scheduler", "HELLO from %s with role %u refused", addr, role);
        return;
    }
    /* A HELLO repeated because our WELCOME was slow, or a restarted node asking for its id. */
    sched_node *n = NULL;
    for (uint32_t i = 0; i < s->nnodes && !n; i++) {
        sched_node *c = &s->nodes[i];
        if (c->info.role == role &&
            (strcmp(c->info.addr, addr) == 0 || (prev_id != 0 && c->info.id == prev_id)))
            n = c;
    }
    if (!n) {
        uint32_t limit = role == CPS_ROLE_SERVER ? s->cfg.num_servers : s->cfg.num_workers;
        /* A server arriving once the job runs is added to it: the balance gives it a share
         * of the ranges (more ranges than servers, --ranges, make that share fair). */
        if (role == CPS_ROLE_SERVER && s->started && !s->finished)
            limit = CPS_MAX_NODES;
        /* A worker arriving after the job ended (one that was to replace a dead worker, too
         * late) would wait for servers that are gone: tell it. */
        int ended = s->finished && role == CPS_ROLE_WORKER;
        if (ended || count_places(s, (int)role) >= limit) {
            if (ended)
                cps__log(CPS_LOG_ERROR, "scheduler", "refused a worker at %s: the job has ended",
                         addr);
            else
                cps__log(CPS_LOG_ERROR, "scheduler",
                         "refused a %s at %s: the job already has its %u %ss", role_name((int)role),
                         addr, limit, role_name((int)role));
            uint32_t tmp = cps__temp_peer_add(&s->temps, s->tp, addr, cps__now_ms());
            if (tmp) {
                cps__msg_hdr h = {0};
                h.sender = tmp; /* the error reply goes to whoever sent this HELLO */
                cps__msg_reply_error(s->tp, SCHED_ID, s->view.epoch, &h,
                                     ended ? CPS_ESHUTDOWN : CPS_ECONFIG,
                                     ended ? "the job has ended" : "job is full");
            }
            return;
        }
        if (s->nnodes >= CPS_MAX_NODES) {
            /* Records are never reused (the view names every node that ever joined). */
            cps__log(CPS_LOG_ERROR, "scheduler",
                     "refused a %s at %s: the job has had %u nodes, the most it can name",
                     role_name((int)role), addr, (unsigned)CPS_MAX_NODES);
            return;
        }
        uint32_t rank = free_rank(s, (int)role, want_rank, limit);
        n = &s->nodes[s->nnodes++];
        memset(n, 0, sizeof *n);
        n->info.rank = rank;
        n->info.id = (prev_id != 0 && !find_node(s, prev_id) && prev_id < CPS_TEMP_PEER_BASE)
                         ? prev_id
                         : s->next_id;
        if (n->info.id >= s->next_id)
            s->next_id = n->info.id + 1;
        n->info.role = (uint8_t)role;
        cps__log(CPS_LOG_INFO, "scheduler", "%s %u (rank %u) joined from %s", role_name((int)role),
                 n->info.id, n->info.rank, addr);
    }
    if (n->left) {
        /* A drained server started again: a member once more, with no ranges until the
         * balance gives it some. */
        n->left = 0;
        n->info.alive = 0; /* revived below */
        cps__log(CPS_LOG_INFO, "scheduler", "server %u (rank %u), drained earlier, is back",
                 n->info.id, n->info.rank);
    }
    uint64_t boot = rx->hdr.aux;
    if (n->info.role == CPS_ROLE_SERVER &&
        cps__incarnation_hello(s->started, n->info.alive, n->boot_id, boot) == CPS_INC_NEW_LIFE) {
        /* Another life of a server we still count alive (recovery/incarnation.h): it restarted
         * (or was fenced) before we noticed, or we restarted since it said HELLO and cannot tell
         * it from one that did. It holds no chain state: first take the old life out of every
         * chain, as for any death, then let the new one in like a server coming back. Taken
         * for "a node moved" after a scheduler restart (the boot id was not kept), a restarted
         * middle kept its chain positions without the FWDs it owed its successor (issue 26). */
        cps__log(CPS_LOG_WARN, "scheduler",
                 "server %u restarted before it was declared dead%s: "
                 "treating it as dead, then as coming back",
                 n->info.id, n->boot_id ? "" : " (or we did, and do not know its life)");
        declare_dead(s, n->info.id, 0);
    }
    if (boot)
        n->boot_id = boot;
    int moved = strcmp(n->info.addr, addr) != 0 && n->info.addr[0];
    if (moved)
        cps__log(CPS_LOG_INFO, "scheduler", "%s %u (rank %u) came back at %s", role_name((int)role),
                 n->info.id, n->info.rank, addr);
    snprintf(n->info.addr, sizeof n->info.addr, "%s", addr);
    int revived = !n->info.alive && s->started;
    n->info.alive = 1;
    if (s->started)
        cps__detector_watch(s->detector, n->info.id, cps__now_ms());
    n->last_seen_ms = cps__now_ms();
    rc = cps__tp_peer_set(s->tp, n->info.id, addr);
    if (rc != 0) {
        cps__log(CPS_LOG_ERROR, "scheduler", "cannot reach %s: %s", addr, cps_strerror(rc));
        return;
    }
    if (s->started) {
        sync_view_nodes(s);
        if (moved || revived)
            publish_view(s, revived ? "a node came back" : "a node moved");
        send_view(s, n->info.id, CPS_MSG_WELCOME);
        return;
    }
    if (count_role(s, CPS_ROLE_SERVER) == s->cfg.num_servers &&
        count_role(s, CPS_ROLE_WORKER) == s->cfg.num_workers) {
        rc = start_job(s);
        if (rc != 0)
            cps__log(CPS_LOG_ERROR, "scheduler", "cannot start the job: %s", cps_strerror(rc));
    }
}

/* A new epoch of the view, sent to every member (the dead too: a node declared dead that is
 * in fact alive learns from it that it is out). */
/* ---- persistence: sched/view (the encoded view) and sched/state ----
 * state: u32 version 1, u32 finished, u32 next_id, u32 workers_done, u32 servers, u32 workers,
 * u32 n, then n u32 ids of workers that said BYE. */
typedef struct save_io {
    cps__sched *s;
    void *view;
    size_t view_len;
} save_io;

static int save_txn(cps__txn *txn, void *arg)
{
    save_io *io = arg;
    cps__sched *s = io->s;
    uint32_t ndone = 0;
    unsigned char st[28 + 4 * CPS_MAX_NODES];
    for (uint32_t i = 0; i < s->nnodes; i++)
        if (s->nodes[i].done)
            cps__le32_put(st + 28 + 4 * ndone++, s->nodes[i].info.id);
    cps__le32_put(st, 1);
    cps__le32_put(st + 4, (uint32_t)s->finished);
    cps__le32_put(st + 8, s->next_id);
    cps__le32_put(st + 12, s->workers_done);
    cps__le32_put(st + 16, s->cfg.num_servers);
    cps__le32_put(st + 20, s->cfg.num_workers);
    cps__le32_put(st + 24, ndone);
    int rc = cps__store_blob_put(txn, "sched/view", io->view, io->view_len);
    if (rc == 0)
        rc = cps__store_blob_put(txn, "sched/state", st, 28 + 4 * (size_t)ndone);
    /* sched/scale: u32 count, then per server draining or drained: u32 id, u32 1 draining / 2
     * drained (left). */
    unsigned char sc[4 + 8 * CPS_MAX_NODES];
    uint32_t nsc = 0;
    for (uint32_t i = 0; i < s->nnodes; i++)
        if (s->nodes[i].draining || s->nodes[i].left) {
            cps__le32_put(sc + 4 + 8 * nsc, s->nodes[i].info.id);
            cps__le32_put(sc + 8 + 8 * nsc, s->nodes[i].left ? 2u : 1u);
            nsc++;
        }
    cps__le32_put(sc, nsc);
    if (rc == 0)
        rc = cps__store_blob_put(txn, "sched/scale", sc, 4 + 8 * (size_t)nsc);
    /* sched/boots: u32 count, then per server whose life we let in: u32 id, u32 0, u64 boot id.
     * A restarted scheduler tells a server's new life from the one it let in by it
     * (recovery/incarnation.h). */
    unsigned char bt[4 + 16 * CPS_MAX_NODES];
    uint32_t nbt = 0;
    for (uint32_t i = 0; i < s->nnodes; i++)
        if (s->nodes[i].boot_id) {
            cps__le32_put(bt + 4 + 16 * nbt, s->nodes[i].info.id);
            cps__le32_put(bt + 8 + 16 * nbt, 0);
            cps__le64_put(bt + 12 + 16 * nbt, s->nodes[i].boot_id);
            nbt++;
        }
    cps__le32_put(bt, nbt);
    return rc ? rc : cps__store_blob_put(txn, "sched/boots", bt, 4 + 16 * (size_t)nbt);
}

/* Write the view and the job's progress. On failure (a full disk, an I/O error) the view is
 * held: send_view sends nothing until a retry succeeds, because a view some node saw but the
 * disk did not could be lost by a scheduler restart, and the restarted one would publish another
 * view under the same epoch. Failover waits meanwhile; that is the price of not losing it. */
static int save(cps__sched *s)
{
    if (!s->store || !s->started)
        return 0;
    save_io io = {s, NULL, cps__view_encoded_size(&s->view)};
    io.view = malloc(io.view_len ? io.view_len : 1);
    int rc = io.view ? 0 : CPS_ENOMEM;
    s->saves++;
    if (rc == 0 && s->saves >= s->fail_first && s->saves - s->fail_first < s->fail_count)
        rc = CPS_ENOSPC; /* the failpoint */
    if (rc == 0) {
        cps__view_encode(&s->view, io.view, io.view_len);
        rc = cps__store_write(s->store, save_txn, &io);
    }
    free(io.view);
    if (rc != 0) {
        if (!s->unsaved)
            cps__log(CPS_LOG_ERROR, "scheduler",
                     "cannot save view epoch %llu in %s: %s; no node is sent it until it is "
                     "saved (failover waits), retrying every %d ms",
                     (unsigned long long)s->view.epoch, s->dir ? s->dir : "?", cps_strerror(rc),
                     SAVE_RETRY_MS);
        if (!s->unsaved && !s->held_type)
            s->held_type = CPS_MSG_VIEW;
        s->unsaved = 1;
        s->failed_saves++;
        int trc = cps__loop_timer_add(s->loop, T_SAVE, SAVE_RETRY_MS, 0, on_save_retry, s);
        if (trc != 0)
            cps__log(CPS_LOG_ERROR, "scheduler", "cannot arm the save retry: %s",
                     cps_strerror(trc));
        return rc;
    }
    if (s->unsaved) {
        s->unsaved = 0;
        cps__loop_timer_del(s->loop, T_SAVE);
        cps__log(CPS_LOG_INFO, "scheduler",
                 "saved view epoch %llu after %u failed tries: sending it to every node",
                 (unsigned long long)s->view.epoch, s->failed_saves);
        s->failed_saves = 0;
        for (uint32_t i = 0; i < s->nnodes; i++)
            if (!s->nodes[i].done)
                send_view(s, s->nodes[i].info.id, s->held_type);
    }
    s->held_type = 0;
    return 0;
}

static int on_save_retry(cps__loop *l, uint64_t id, void *ctx, uint64_t now)
{
    (void)l, (void)id, (void)now;
    cps__sched *s = ctx;
    if (s->unsaved)
        save(s);
    return 0;
}

typedef struct load_io {
    cps__sched *s;
    int found;
    int rc;
} load_io;

static int load_txn(cps__txn *txn, void *arg)
{
    load_io *io = arg;
    cps__sched *s = io->s;
    const void *vb, *sb;
    size_t vlen, slen;
    int rc = cps__store_blob_get(txn, "sched/state", &sb, &slen);
    if (rc == CPS_ENOTFOUND)
        return 0;
    if (rc == 0)
        rc = cps__store_blob_get(txn, "sched/view", &vb, &vlen);
    if (rc != 0)
        return rc;
    const unsigned char *st = sb;
    if (slen < 28 || cps__le32_get(st) != 1 || slen != 28 + 4 * (size_t)cps__le32_get(st + 24))
        return CPS_ECORRUPT;
    if (cps__le32_get(st + 4))
        return 0; /* that job finished: start a new one */
    io->found = 1;
    const void *cb;
    size_t clen;
    if (cps__store_blob_get(txn, "sched/ckpt", &cb, &clen) == 0 &&
        cps__ckpt_note_decode(cb, clen, &s->ckpt, NULL) != 0)
        memset(&s->ckpt, 0, sizeof s->ckpt); /* unreadable: shown as none, not fatal */
    const void *rb;
    size_t rlen;
    if (cps__store_blob_get(txn, "sched/registry", &rb, &rlen) == 0 && rlen > 4) {
        s->reg = malloc(rlen - 4);
        if (!s->reg)
            return CPS_ENOMEM;
        memcpy(s->reg, (const unsigned char *)rb + 4, rlen - 4);
        s->reg_len = s->reg_cap = rlen - 4;
        s->reg_count = cps__le32_get(rb);
    }
    if (cps__le32_get(st + 16) != s->cfg.num_servers ||
        cps__le32_get(st + 20) != s->cfg.num_workers) {
        cps__log(CPS_LOG_ERROR, "scheduler",
                 "the data directory holds an unfinished job of %u "
                 "servers and %u workers, not %u and %u: use another --data to start a new job",
                 cps__le32_get(st + 16), cps__le32_get(st + 20), s->cfg.num_servers,
                 s->cfg.num_workers);
        return CPS_ECONFIG;
    }
    cps__view v;
    cps__view_init(&v);
    if ((rc = cps__view_decode(vb, vlen, &v)) != 0) {
        cps__view_fini(&v);
        return rc;
    }
    cps__view_fini(&s->view);
    s->view = v;
    s->next_id = cps__le32_get(st + 8);
    s->workers_done = cps__le32_get(st + 12);
    s->nnodes = 0;
    uint64_t now = cps__now_ms();
    for (uint32_t i = 0; i < v.nnodes && i < CPS_MAX_NODES; i++) {
        sched_node *n = &s->nodes[s->nnodes++];
        memset(n, 0, sizeof *n);
        n->info = v.nodes[i];
        n->last_seen_ms = now;
        for (uint32_t j = 0; j < cps__le32_get(st + 24); j++)
            n->done |= cps__le32_get(st + 28 + 4 * j) == n->info.id;
    }
    const void *scb;
    size_t sclen;
    if (cps__store_blob_get(txn, "sched/scale", &scb, &sclen) == 0) {
        const unsigned char *sc = scb;
        if (sclen < 4 || sclen != 4 + 8 * (size_t)cps__le32_get(sc))
            return CPS_ECORRUPT;
        for (uint32_t j = 0; j < cps__le32_get(sc); j++) {
            sched_node *n = find_node(s, cps__le32_get(sc + 4 + 8 * j));
            uint32_t what = cps__le32_get(sc + 8 + 8 * j);
            if (n && what == 1)
                n->draining = 1;
            if (n && what == 2)
                n->left = 1;
        }
    }
    const void *btb;
    size_t btlen;
    if (cps__store_blob_get(txn, "sched/boots", &btb, &btlen) == 0) {
        const unsigned char *bt = btb;
        if (btlen < 4 || btlen != 4 + 16 * (size_t)cps__le32_get(bt))
            return CPS_ECORRUPT;
        for (uint32_t j = 0; j < cps__le32_get(bt); j++) {
            sched_node *n = find_node(s, cps__le32_get(bt + 4 + 16 * j));
            if (n)
                n->boot_id = cps__le64_get(bt + 12 + 16 * j);
        }
    }
    return 0;
}

/* Resume an unfinished job from the data directory. Returns 0 (resumed or nothing to resume)
 * or an error (a different job is there, or the files are corrupt). */
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

static int resume(cps__sched *s)
{
    load_io io = {s, 0, 0};
    int rc = cps__store_read(s->store, load_txn, &io);
    if (rc != 0 || !io.found)
        return rc;
    if ((rc = begin_running(s)) != 0)
        return rc;
    uint64_t now = cps__now_ms();
    for (uint32_t i = 0; i < s->nnodes; i++) {
        sched_node *n = &s->nodes[i];
        if (superseded(s, n))
            continue; /* sync_peers */
        if (cps__tp_peer_set(s->tp, n->info.id, n->info.addr) != 0)
            cps__log(CPS_LOG_WARN, "scheduler", "cannot reach node %u at %s", n->info.id,
                     n->info.addr);
    }
    /* Nobody is declared dead for our own absence: everyone gets a fresh grace period. */
    cps__detector_restart(s->detector, now);
    cps__log(CPS_LOG_INFO, "scheduler",
             "resumed the job from view epoch %llu (%u nodes, %u of "
             "%u workers finished)",
             (unsigned long long)s->view.epoch, s->nnodes, s->workers_done, s->cfg.num_workers);
    /* Everyone learns we are back (and anyone who missed a view gets it now). */
    s->view.epoch++;
    if (save(s) == 0)
        for (uint32_t i = 0; i < s->nnodes; i++)
            if (!s->nodes[i].done)
                send_view(s, s->nodes[i].info.id, CPS_MSG_VIEW);
    return 0;
}

static void publish_view(cps__sched *s, const char *why)
{
    if (!s->started)
        return;
    sync_view_nodes(s);
    sync_peers(s);
    s->view.epoch++;
    int rc = save(s);
    /* A finished worker has closed its inbox: a view for it would wait in its queue for ever,
     * and the scheduler only exits once every queue is empty. */
    for (uint32_t i = 0; rc == 0 && i < s->nnodes; i++)
        if (!s->nodes[i].done && !s->nodes[i].left)
            send_view(s, s->nodes[i].info.id, CPS_MSG_VIEW);
    cps__log(CPS_LOG_INFO, "scheduler", "view epoch %llu %s (%s)",
             (unsigned long long)s->view.epoch, rc == 0 ? "published" : "held until saved", why);
}

static void log_chains(const cps__sched *s)
{
    for (uint32_t r = 0; r < s->view.nranges; r++) {
        const cps__range *rg = &s->view.ranges[r];
        char chain[128] = "";
        size_t off = 0;
        for (uint32_t j = 0; j < rg->chain_len && off < sizeof chain; j++)
            off += (size_t)snprintf(chain + off, sizeof chain - off, "%s%u", j ? " -> " : "",
                                    rg->chain[j]);
        cps__log(CPS_LOG_INFO, "scheduler", "  range %u: %s%s", r, chain,
                 cps__view_range_available(&s->view, r) ? "" : " (NO LIVE REPLICA)");
    }
}

static void finish_drains(cps__sched *s);
static int on_repair(cps__loop *l, uint64_t id, void *ctx, uint64_t now);
static uint32_t tool_peer(cps__sched *s, const cps__rx *rx, const char *what);

/* Take `node` out of range r's chain (order kept). */
static void chain_remove(cps__range *rg, uint32_t node)
{
    uint32_t k = 0;
    for (uint32_t j = 0; j < rg->chain_len; j++)
        if (rg->chain[j] != node)
            rg->chain[k++] = rg->chain[j];
    rg->chain_len = k;
}

/* Put the joiners that caught up into the view in memory (the caller publishes it). Returns how
 * many. */
static uint32_t apply_appends(cps__sched *s)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->nappends; i++) {
        cps__range *rg = &s->view.ranges[s->appends[i].range];
        uint32_t node = s->appends[i].node;
        int in = 0;
        for (uint32_t j = 0; j < rg->chain_len; j++)
            in |= rg->chain[j] == node;
        if (in || rg->chain_len >= CPS_MAX_REPLICAS)
            continue;
        rg->chain[rg->chain_len++] = node;
        cps__log(CPS_LOG_INFO, "scheduler", "server %u joined range %u as its tail", node,
                 s->appends[i].range);
        n++;
    }
    s->nappends = 0;
    cps__loop_timer_del(s->loop, T_BATCH);
    return n;
}

/* Bring every range back to R live replicas, and move ranges for balance and drains:
 * recovery/repair.c decides who copies which range from whom; the joiner reports CAUGHT_UP; a
 * move's leaving member is trimmed once the joiner is confirmed. */
static void repair(cps__sched *s, uint64_t now)
{
    if (!s->started || s->finished || !s->repair)
        return;
    uint32_t appended = apply_appends(s);
    int n = cps__repair_tick(s->repair, &s->view, now);
    const cps__repair_action *a;
    size_t na = n > 0 ? cps__repair_actions(s->repair, &a) : 0;
    uint32_t trims = 0;
    char why[128] = "";
    for (size_t i = 0; i < na; i++) {
        if (a[i].kind == CPS_RA_TIMED_OUT) {
            cps__log(CPS_LOG_WARN, "scheduler",
                     "range %u: node %u did not catch up in time; "
                     "trying again",
                     a[i].range, a[i].node);
            continue;
        }
        if (a[i].kind == CPS_RA_TRIM) {
            chain_remove(&s->view.ranges[a[i].range], a[i].node);
            s->moves++;
            cps__log(CPS_LOG_INFO, "scheduler",
                     "range %u: server %u leaves its chain (%u replicas are enough)", a[i].range,
                     a[i].node, s->view.replicas);
            if (!trims++)
                snprintf(why, sizeof why, "server %u left range %u", a[i].node, a[i].range);
            continue;
        }
        if (a[i].kind != CPS_RA_JOIN)
            continue;
        cps__msg_hdr h = {.type = CPS_MSG_JOIN_RANGE,
                          .sender = SCHED_ID,
                          .epoch = s->view.epoch,
                          .range = a[i].range,
                          .aux = a[i].source,
                          .step = a[i].join_id};
        if (cps__msg_send(s->tp, a[i].node, &h, NULL, 0) != 0) {
            cps__repair_join_unsent(s->repair, a[i].range, a[i].join_id);
            continue;
        }
        if (a[i].leaving)
            cps__log(CPS_LOG_INFO, "scheduler",
                     "range %u moves from server %u to server %u (%s): it copies the range from "
                     "the tail, server %u",
                     a[i].range, a[i].leaving, a[i].node,
                     cps__repair_draining(s->repair, a[i].leaving) ? "drain" : "balance",
                     a[i].source);
        else
            cps__log(CPS_LOG_INFO, "scheduler",
                     "range %u has %u of %u replicas: server %u copies "
                     "it from the tail, server %u",
                     a[i].range, a[i].live, s->view.replicas, a[i].node, a[i].source);
    }
    if (trims || appended) {
        if (trims + appended > 1 || !trims)
            snprintf(why, sizeof why, "%u joiner(s) became tails, %u move(s) completed", appended,
                     trims);
        publish_view(s, why);
        log_chains(s);
    }
    finish_drains(s);
}

/* A draining server that holds, copies and serves nothing any more is done: it is told to
 * exit and leaves the job (a member no longer: not a death). */
static void finish_drains(cps__sched *s)
{
    for (uint32_t i = 0; i < s->nnodes; i++) {
        sched_node *n = &s->nodes[i];
        if (!n->draining || n->left || cps__repair_load(s->repair, &s->view, n->info.id) != 0)
            continue;
        n->draining = 0;
        n->left = 1;
        s->drained++;
        n->info.alive = 0;
        cps__repair_set_draining(s->repair, n->info.id, 0);
        cps__detector_forget(s->detector, n->info.id);
        /* Before the view: a view counting it out would send it rejoining. */
        send_simple(s, n->info.id, CPS_MSG_SHUTDOWN, NULL);
        cps__log(CPS_LOG_INFO, "scheduler",
                 "server %u (rank %u) is drained: it holds no range; told to exit", n->info.id,
                 n->info.rank);
        char why[64];
        snprintf(why, sizeof why, "server %u drained", n->info.id);
        publish_view(s, why);
    }
}

/* Drain server `n`: its ranges move to the other servers, then it exits. 0, or an error with
 * `err` saying why. */
static int start_drain(cps__sched *s, sched_node *n, char *err, size_t errlen)
{
    if (!s->started || s->finished || !s->repair) {
        snprintf(err, errlen, "the job is not running");
        return CPS_EAGAIN;
    }
    if (n->info.role != CPS_ROLE_SERVER || n->left || !n->info.alive) {
        snprintf(err, errlen, "node %u is not a live server of the job", n->info.id);
        return CPS_ENOTFOUND;
    }
    if (n->draining)
        return 0;
    uint32_t others = 0;
    for (uint32_t i = 0; i < s->nnodes; i++) {
        const sched_node *o = &s->nodes[i];
        others +=
            o != n && o->info.role == CPS_ROLE_SERVER && o->info.alive && !o->left && !o->draining;
    }
    if (others < s->view.replicas) {
        snprintf(err, errlen,
                 "cannot drain server %u: chains of %u need %u other live servers, and %u are "
                 "left (add a server first)",
                 n->info.id, s->view.replicas, s->view.replicas, others);
        return CPS_ECONFIG;
    }
    int rc = cps__repair_set_draining(s->repair, n->info.id, 1);
    if (rc != 0) {
        snprintf(err, errlen, "%s", cps_strerror(rc));
        return rc;
    }
    n->draining = 1;
    cps__log(CPS_LOG_INFO, "scheduler",
             "draining server %u (rank %u): its %u range(s) move to the other servers", n->info.id,
             n->info.rank, cps__repair_load(s->repair, &s->view, n->info.id));
    save(s);
    repair(s, cps__now_ms());
    return 0;
}

/* DRAIN: from `chainps drain` (sender UINT32_MAX, aux = the server's rank, payload as STATUS),
 * or from a server asking to leave (SIGTERM): its own id. Answered with ACK or ERROR. */
static void handle_drain(cps__sched *s, const cps__rx *rx)
{
    const cps__msg_hdr *h = &rx->hdr;
    uint32_t peer = h->sender;
    sched_node *n = NULL;
    if (h->sender == UINT32_MAX) {
        peer = tool_peer(s, rx, "DRAIN");
        if (!peer)
            return;
        for (uint32_t i = 0; i < s->nnodes && !n; i++)
            if (s->nodes[i].info.role == CPS_ROLE_SERVER && s->nodes[i].info.rank == h->aux &&
                !s->nodes[i].left)
                n = &s->nodes[i];
    } else {
        n = find_node(s, h->sender);
        if (!n)
            return;
    }
    char err[192] = "";
    int rc = CPS_ENOTFOUND;
    if (!n)
        snprintf(err, sizeof err, "no server of rank %llu in the job", (unsigned long long)h->aux);
    else
        rc = start_drain(s, n, err, sizeof err);
    cps__msg_hdr req = *h;
    req.sender = peer;
    if (rc != 0) {
        cps__log(CPS_LOG_WARN, "scheduler", "drain refused: %s", err);
        cps__msg_reply_error(s->tp, SCHED_ID, s->view.epoch, &req, rc, err);
        return;
    }
    cps__msg_hdr ok = {.type = CPS_MSG_ACK,
                       .flags = CPS_WF_REPLY,
                       .sender = SCHED_ID,
                       .epoch = s->view.epoch,
                       .req_seq = h->req_seq,
                       .aux = n->info.id};
    int src = cps__msg_send(s->tp, peer, &ok, NULL, 0);
    if (src != 0)
        cps__log(CPS_LOG_WARN, "scheduler", "cannot answer the drain request: %s",
                 cps_strerror(src));
}

static void on_caught_up(cps__sched *s, const sched_node *n, const cps__msg_hdr *h)
{
    if (!s->repair)
        return;
    uint32_t r = h->range;
    int verdict =
        cps__repair_caught_up(s->repair, &s->view, n->info.id, r, h->step, h->aux, cps__now_ms());
    if (verdict == CPS_REPAIR_RETRY)
        cps__log(CPS_LOG_WARN, "scheduler",
                 "range %u: server %u could not copy it; trying "
                 "again",
                 r, n->info.id);
    if (verdict == CPS_REPAIR_APPEND) {
        if (s->nappends == sizeof s->appends / sizeof s->appends[0])
            repair(s, cps__now_ms()); /* full: publish what is held first */
        s->appends[s->nappends].range = r;
        s->appends[s->nappends++].node = n->info.id;
    }
    /* A tail to append, or a move whose old member can leave: in a view shortly, together with
     * the others that come meanwhile (repair applies both). */
    if ((verdict == CPS_REPAIR_APPEND || verdict == CPS_REPAIR_CONFIRMED) &&
        !cps__loop_timer_armed(s->loop, T_BATCH, NULL)) {
        int rc = cps__loop_timer_add(s->loop, T_BATCH, BATCH_MS, 0, on_repair, s);
        if (rc != 0)
            repair(s, cps__now_ms());
    }
}

/* A node went silent: take it out of the view and tell everyone. */
static void declare_dead(cps__sched *s, uint32_t id, uint64_t silence_ms)
{
    sched_node *n = find_node(s, id);
    if (!n || !n->info.alive)
        return;
    if (n->info.role == CPS_ROLE_WORKER && n->done)
        return; /* finished workers stop heartbeating: not a failure */
    /* Joiners that caught up before the death join first, as they would have, had their view
     * gone out at once: the repair state counts them tails already. */
    apply_appends(s);
    n->info.alive = 0;
    if (n->info.role == CPS_ROLE_SERVER)
        s->deaths_server++;
    else
        s->deaths_worker++;
    sync_view_nodes(s);
    cps__view nv;
    cps__view_init(&nv);
    uint32_t lost = 0;
    int rc = s->repair ? cps__repair_declare_dead(s->repair, &s->view, id, &nv, &lost)
                       : cps__view_without(&s->view, id, &nv, &lost);
    if (rc != 0) {
        cps__log(CPS_LOG_ERROR, "scheduler", "cannot build a view without node %u", id);
        cps__view_fini(&nv);
        return;
    }
    nv.epoch = s->view.epoch; /* publish_view bumps it */
    const cps__repair_action *a;
    size_t na = s->repair ? cps__repair_actions(s->repair, &a) : 0;
    for (size_t i = 0; i < na; i++)
        if (a[i].kind == CPS_RA_EVICTED)
            cps__log(CPS_LOG_WARN, "scheduler",
                     "range %u: server %u had not caught up with "
                     "server %u; it leaves the chain and will copy the range again",
                     a[i].range, a[i].node, a[i].source);
    cps__view_fini(&s->view);
    s->view = nv;
    cps__log(CPS_LOG_WARN, "scheduler", "%s %u (rank %u) silent for %llu ms: declared dead",
             role_name(n->info.role), id, n->info.rank, (unsigned long long)silence_ms);
    publish_view(s, n->info.role == CPS_ROLE_SERVER ? "a server died" : "a worker died");
    if (n->info.role == CPS_ROLE_SERVER) {
        log_chains(s);
        if (lost)
            cps__log(CPS_LOG_ERROR, "scheduler",
                     "%u range(s) have no live replica: their calls "
                     "wait for a server to come back",
                     lost);
    } else {
        maybe_release_barrier(s);
        maybe_end_job(s);
    }
}

static void maybe_release_barrier(cps__sched *s)
{
    uint32_t waiting = 0, live = 0;
    for (uint32_t i = 0; i < s->nnodes; i++) {
        sched_node *n = &s->nodes[i];
        if (n->info.role != CPS_ROLE_WORKER || n->done || !n->info.alive)
            continue; /* finished or dead workers do not hold a barrier up */
        live++;
        waiting += n->in_barrier;
    }
    if (live == 0 || waiting < live)
        return;
    for (uint32_t i = 0; i < s->nnodes; i++) {
        sched_node *n = &s->nodes[i];
        if (n->info.role == CPS_ROLE_WORKER && n->in_barrier) {
            cps__msg_hdr req = {0};
            req.req_worker = n->info.id;
            req.req_seq = n->barrier_seq;
            send_simple(s, n->info.id, CPS_MSG_BARRIER_DONE, &req);
            n->in_barrier = 0;
        }
    }
    cps__log(CPS_LOG_DEBUG, "scheduler", "barrier released (%u workers)", live);
}

static void shutdown_job(cps__sched *s);

/* A worker rank that no live worker holds and none finished (its worker died and no other
 * took its place yet), or UINT32_MAX. */
static uint32_t unfinished_dead_rank(const cps__sched *s)
{
    for (uint32_t r = 0; r < s->cfg.num_workers; r++) {
        int held = 0;
        for (uint32_t i = 0; i < s->nnodes && !held; i++) {
            const sched_node *n = &s->nodes[i];
            held =
                n->info.role == CPS_ROLE_WORKER && n->info.rank == r && (n->done || n->info.alive);
        }
        if (!held)
            return r;
    }
    return UINT32_MAX;
}

/* Every worker finished or died: the job is over (unless held for inspection, or a dead
 * worker's replacement is awaited). */
static void maybe_end_job(cps__sched *s)
{
    if (!s->started || s->finished || s->ending_held)
        return;
    uint32_t left = 0;
    for (uint32_t i = 0; i < s->nnodes; i++) {
        const sched_node *n = &s->nodes[i];
        left += n->info.role == CPS_ROLE_WORKER && !n->done && n->info.alive;
    }
    if (left)
        return;
    uint32_t dead_rank = s->cfg.await_replacements ? unfinished_dead_rank(s) : UINT32_MAX;
    if (dead_rank != UINT32_MAX) {
        /* Ending now would leave the worker that takes its place (chainps launch
         * --restart-workers starts one) without servers: it could only fail. Whoever started
         * us with --await-replacements ends the job if it gives up on that worker. */
        cps__log(CPS_LOG_INFO, "scheduler",
                 "the live workers finished; the job stays open for the worker that takes dead "
                 "rank %u's place",
                 dead_rank);
        return;
    }
    if (s->cfg.hold) {
        s->ending_held = 1;
        cps__log(CPS_LOG_INFO, "scheduler",
                 "all workers finished; holding the servers until "
                 "`chainps status --end`");
        return;
    }
    cps__log(CPS_LOG_INFO, "scheduler",
             "all workers finished (%u of %u said goodbye); ending "
             "the job",
             s->workers_done, s->cfg.num_workers);
    shutdown_job(s);
}

static void shutdown_job(cps__sched *s)
{
    for (uint32_t i = 0; i < s->nnodes; i++)
        if (s->nodes[i].info.role == CPS_ROLE_SERVER && !s->nodes[i].left)
            send_simple(s, s->nodes[i].info.id, CPS_MSG_SHUTDOWN, NULL);
    s->finished = 1;
    save(s); /* a finished job is not resumed */
}

/* A request from a tool that is not a member (its payload is a hello naming its inbox): the
 * temporary peer id to answer it at, or 0 (logged) if the request is malformed. */
static uint32_t tool_peer(cps__sched *s, const cps__rx *rx, const char *what)
{
    uint32_t peer;
    if (cps__temp_peer_from_hello(&s->temps, s->tp, rx->payload, rx->len, cps__now_ms(), &peer,
                                  NULL) != 0)
        cps__log(CPS_LOG_WARN, "scheduler", "malformed %s request dropped", what);
    return peer;
}

/* A reply to a tool: the view, then `extra` bytes for the caller to fill; aux says whether the
 * job runs. *len receives the payload length. NULL if out of memory. */
static unsigned char *view_reply(cps__sched *s, const cps__rx *rx, uint8_t type, size_t extra,
                                 size_t *len)
{
    size_t vlen = cps__view_encoded_size(&s->view);
    *len = vlen + extra;
    cps__msg_hdr h = {0};
    h.type = type;
    h.flags = CPS_WF_REPLY;
    h.sender = SCHED_ID;
    h.epoch = s->view.epoch;
    h.req_seq = rx->hdr.req_seq;
    h.aux = s->started;
    unsigned char *buf = cps__msg_alloc(&h, *len);
    if (buf)
        cps__view_encode(&s->view, buf + CPS_WIRE_HDR_SIZE, vlen);
    return buf;
}

static uint64_t wall_ms(void);

static void handle_status(cps__sched *s, const cps__rx *rx)
{
    uint32_t tmp = tool_peer(s, rx, "STATUS");
    if (!tmp)
        return;
    /* Payload: view, u32 count, then per node u32 id, u32 age_ms, stats block; then u32 ranges
     * and per range u32 joiner, u32 source (0, 0: no copy under way). */
    size_t len;
    uint32_t nranges = s->view.nranges;
    /* Then the last checkpoint (absent when there was none; older tools ignore it). */
    cps__ckpt_note note = s->ckpt;
    size_t note_len = note.id ? cps__ckpt_note_size(&note) : 0;
    if (note.id) {
        uint64_t wall = wall_ms();
        note.age_ms = wall > note.unix_ms ? wall - note.unix_ms : 0;
    }
    unsigned char *buf = view_reply(
        s, rx, CPS_MSG_STATUS_REPLY,
        4 + (size_t)s->nnodes * (8 + CPS_STATS_SIZE) + 4 + (size_t)nranges * 8 + note_len, &len);
    if (!buf)
        return;
    unsigned char *p = buf + CPS_WIRE_HDR_SIZE + cps__view_encoded_size(&s->view);
    cps__le32_put(p, s->nnodes);
    p += 4;
    uint64_t now = cps__now_ms();
    for (uint32_t i = 0; i < s->nnodes; i++) {
        uint64_t age = now - s->nodes[i].last_seen_ms;
        cps__le32_put(p, s->nodes[i].info.id);
        cps__le32_put(p + 4, age > UINT32_MAX ? UINT32_MAX : (uint32_t)age);
        cps__stats_encode(p + 8, &s->nodes[i].stats);
        p += 8 + CPS_STATS_SIZE;
    }
    cps__le32_put(p, nranges);
    p += 4;
    for (uint32_t r = 0; r < nranges; r++, p += 8) {
        uint32_t source = 0;
        uint32_t joiner = s->repair ? cps__repair_joiner(s->repair, r, &source) : 0;
        cps__le32_put(p, joiner);
        cps__le32_put(p + 4, joiner ? source : 0);
    }
    if (note_len)
        cps__ckpt_note_encode(p, note_len, &note);
    if (cps__tp_send(s->tp, tmp, buf, CPS_WIRE_HDR_SIZE + len) != 0)
        cps__tp_free(buf);
}

/* Milliseconds since 1970 by this machine's clock: checkpoint times are wall-clock times. */
static uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int save_ckpt_txn(cps__txn *txn, void *arg)
{
    const cps__ckpt_note *n = arg;
    unsigned char b[CPS_CKPT_NOTE_FIXED + CPS_CKPT_NOTE_PATH_MAX];
    size_t len = cps__ckpt_note_encode(b, sizeof b, n);
    return cps__store_blob_put(txn, "sched/ckpt", b, len);
}

static void publish_metrics(cps__sched *s);

/* CKPT_DONE from a checkpoint tool (or our own periodic exports): the job's last checkpoint. */
static void handle_ckpt_done(cps__sched *s, const cps__rx *rx)
{
    cps__ckpt_note n;
    int rc = cps__ckpt_note_decode(rx->payload, rx->len, &n, NULL);
    if (rc != 0) {
        cps__log(CPS_LOG_WARN, "scheduler", "malformed CKPT_DONE dropped: %s", cps_strerror(rc));
        return;
    }
    n.id = s->ckpt.id + 1;
    n.age_ms = 0;
    s->ckpt = n;
    cps__log(CPS_LOG_INFO, "scheduler", "checkpoint %llu at step %llu: %s",
             (unsigned long long)n.id, (unsigned long long)n.step, n.path);
    if (s->store && (rc = cps__store_write(s->store, save_ckpt_txn, &s->ckpt)) != 0)
        cps__log(CPS_LOG_WARN, "scheduler", "cannot save the last checkpoint's record: %s",
                 cps_strerror(rc));
    if (s->metrics)
        publish_metrics(s); /* now, so /metrics agrees with `chainps status` at once */
}

/* ---- the /metrics page (node/metrics.h) ---- */

static void publish_metrics(cps__sched *s)
{
    cps__prom *p = &s->page;
    cps__prom_reset(p);
    uint32_t live_servers = 0, live_workers = 0;
    uint64_t raw = 0, wire = 0, pull = 0, applied = 0, step = 0;
    for (uint32_t i = 0; i < s->nnodes; i++) {
        const sched_node *n = &s->nodes[i];
        if (n->info.role == CPS_ROLE_SERVER) {
            live_servers += n->info.alive;
            raw += n->stats.push_raw_bytes;
            wire += n->stats.push_wire_bytes;
            pull += n->stats.pull_bytes;
            applied += n->stats.updates_applied;
            step = n->stats.step > step ? n->stats.step : step;
        } else if (n->info.role == CPS_ROLE_WORKER) {
            live_workers += n->info.alive && !n->done;
        }
    }
#define FAMILY(name, type, help, v)                                                                \
    cps__prom_family(p, name, type, help);                                                         \
    cps__prom_u64(p, name, NULL, v)
    FAMILY("chainps_view_epoch", "gauge", "The view epoch the scheduler published last.",
           s->view.epoch);
    FAMILY("chainps_job_running", "gauge", "1 once every node joined and until the job ends.",
           (uint64_t)(s->started && !s->finished));
    FAMILY("chainps_job_step", "gauge", "The job's step: the highest any server applied.", step);
    FAMILY("chainps_live_servers", "gauge", "Servers the view counts alive.", live_servers);
    FAMILY("chainps_live_workers", "gauge", "Workers alive and not finished.", live_workers);
    FAMILY("chainps_workers_finished", "gauge", "Workers that said goodbye.", s->workers_done);
    /* The servers' counters as their heartbeats report them: a restarted server's start over,
     * which Prometheus's rate() takes for a counter reset. */
    FAMILY("chainps_job_push_bytes_total", "counter",
           "Push payload bytes the servers received, after decompression (from heartbeats).", raw);
    FAMILY("chainps_job_received_push_bytes_total", "counter",
           "Push payload bytes the servers received, as sent (from heartbeats).", wire);
    FAMILY("chainps_job_pull_bytes_total", "counter",
           "Value bytes the servers sent to pulls (from heartbeats).", pull);
    FAMILY("chainps_job_updates_applied_total", "counter",
           "Updates the servers applied, every replica counted (from heartbeats).", applied);
    FAMILY("chainps_checkpoints_total", "counter", "Checkpoints completed in this job.",
           s->ckpt.id);
    uint64_t draining = 0;
    for (uint32_t i = 0; i < s->nnodes; i++)
        draining += s->nodes[i].draining;
    FAMILY("chainps_servers_draining", "gauge", "Servers whose ranges are being moved away.",
           draining);
    FAMILY("chainps_servers_drained_total", "counter", "Servers drained and let go since start.",
           s->drained);
    FAMILY("chainps_range_moves_total", "counter",
           "Ranges moved to another server (balance, drains) since this scheduler started.",
           s->moves);
#undef FAMILY
    cps__prom_family(p, "chainps_declared_deaths_total", "counter",
                     "Nodes the scheduler declared dead, by role.");
    cps__prom_u64(p, "chainps_declared_deaths_total", "role=\"server\"", s->deaths_server);
    cps__prom_u64(p, "chainps_declared_deaths_total", "role=\"worker\"", s->deaths_worker);
    char l[48];
    if (s->view.nranges) {
        cps__prom_family(p, "chainps_range_replicas", "gauge",
                         "Servers in each key range's chain (the target is the job's replicas).");
        for (uint32_t r = 0; r < s->view.nranges; r++) {
            snprintf(l, sizeof l, "range=\"%u\"", r);
            cps__prom_u64(p, "chainps_range_replicas", l, s->view.ranges[r].chain_len);
        }
    }
    int any_worker = 0;
    for (uint32_t i = 0; i < s->nnodes; i++) {
        const sched_node *n = &s->nodes[i];
        if (n->info.role != CPS_ROLE_WORKER || !(n->info.alive || n->done))
            continue;
        if (!any_worker++)
            cps__prom_family(p, "chainps_worker_clock", "gauge",
                             "Each worker's last pushed step (its SSP clock), by rank.");
        snprintf(l, sizeof l, "rank=\"%u\"", n->info.rank);
        cps__prom_u64(p, "chainps_worker_clock", l, n->stats.step);
    }
    if (s->ckpt.id) {
        uint64_t wall = wall_ms();
        cps__prom_family(p, "chainps_checkpoint_last_id", "gauge",
                         "Number of the last completed checkpoint (1, 2, ... in this job).");
        cps__prom_u64(p, "chainps_checkpoint_last_id", NULL, s->ckpt.id);
        cps__prom_family(p, "chainps_checkpoint_last_step", "gauge",
                         "Training step of the last completed checkpoint.");
        cps__prom_u64(p, "chainps_checkpoint_last_step", NULL, s->ckpt.step);
        cps__prom_family(p, "chainps_checkpoint_last_timestamp_seconds", "gauge",
                         "When the last checkpoint completed (Unix time).");
        cps__prom_f64(p, "chainps_checkpoint_last_timestamp_seconds", NULL,
                      (double)s->ckpt.unix_ms / 1000.0);
        cps__prom_family(p, "chainps_checkpoint_age_seconds", "gauge",
                         "Seconds since the last checkpoint completed.");
        cps__prom_f64(p, "chainps_checkpoint_age_seconds", NULL,
                      wall > s->ckpt.unix_ms ? (double)(wall - s->ckpt.unix_ms) / 1000.0 : 0.0);
    }
    cps__metrics_publish_page(s->metrics, p, "scheduler");
}

static int on_metrics(cps__loop *l, uint64_t id, void *ctx, uint64_t now)
{
    (void)l, (void)id, (void)now;
    publish_metrics(ctx);
    return 0;
}

/* ---- tensor registry ---- */

static int save_registry_txn(cps__txn *txn, void *arg)
{
    cps__sched *s = arg;
    unsigned char *b = malloc(4 + s->reg_len);
    if (!b)
        return CPS_ENOMEM;
    cps__le32_put(b, s->reg_count);
    memcpy(b + 4, s->reg, s->reg_len);
    int rc = cps__store_blob_put(txn, "sched/registry", b, 4 + s->reg_len);
    free(b);
    return rc;
}

/* 1: same name and definition registered; 0: new name; 2: registered before shapes were
 * recorded (ndim 0), same otherwise: its entry at *at takes the shape; CPS_EEXIST: same name,
 * other shape or optimizer. */
static int registry_find(const cps__sched *s, const cps__tensor_desc *d, size_t *at)
{
    size_t off = 0, used;
    cps__tensor_desc e;
    while (off < s->reg_len &&
           cps__wire_tensor_desc_decode(s->reg + off, s->reg_len - off, &e, &used) == 0) {
        *at = off;
        off += used;
        if (strcmp(e.name, d->name) != 0)
            continue;
        /* Specs compare as their wire blocks: struct padding holds no meaning. */
        unsigned char a[CPS_WIRE_SPEC_SIZE], b[CPS_WIRE_SPEC_SIZE];
        cps__wire_spec_encode(a, &e.spec);
        cps__wire_spec_encode(b, &d->spec);
        if (!(e.kind == d->kind && e.length == d->length && e.rows == d->rows &&
              e.cols == d->cols && memcmp(a, b, sizeof a) == 0))
            return CPS_EEXIST;
        if (e.ndim == 0 && d->ndim != 0)
            return 2;
        return (d->ndim == 0 ||
                (e.ndim == d->ndim && memcmp(e.dims, d->dims, d->ndim * sizeof *d->dims) == 0))
                   ? 1
                   : CPS_EEXIST;
    }
    return 0;
}

/* Room for `extra` more bytes of registry. Errors: CPS_ENOMEM. */
static int registry_reserve(cps__sched *s, size_t extra)
{
    size_t need = s->reg_len + extra;
    if (need <= s->reg_cap)
        return 0;
    size_t cap = need * 2;
    unsigned char *grown = realloc(s->reg, cap);
    if (!grown)
        return CPS_ENOMEM;
    s->reg = grown;
    s->reg_cap = cap;
    return 0;
}

static void on_register(cps__sched *s, sched_node *n, const cps__rx *rx)
{
    cps__tensor_desc d;
    size_t used;
    int rc = n->info.role == CPS_ROLE_WORKER
                 ? cps__wire_tensor_desc_decode(rx->payload, rx->len, &d, &used)
                 : CPS_EPROTO;
    if (rc == 0 && used != rx->len)
        rc = CPS_EPROTO;
    size_t at = 0;
    if (rc == 0)
        rc = registry_find(s, &d, &at);
    if ((rc == 0 || rc == 2) && registry_reserve(s, cps__wire_tensor_desc_size(&d)) != 0) {
        cps__msg_reply_error(s->tp, SCHED_ID, s->view.epoch, &rx->hdr, CPS_ENOMEM,
                             "no memory for the tensor registry");
        return;
    }
    if (rc == 2) {
        /* The entry grows by its dims: move what follows it, then write it again in place. */
        cps__tensor_desc e;
        size_t old_size;
        cps__wire_tensor_desc_decode(s->reg + at, s->reg_len - at, &e, &old_size);
        size_t new_size = cps__wire_tensor_desc_size(&d);
        memmove(s->reg + at + new_size, s->reg + at + old_size, s->reg_len - at - old_size);
        cps__wire_tensor_desc_encode(s->reg + at, new_size, &d);
        s->reg_len += new_size - old_size;
        cps__log(CPS_LOG_INFO, "scheduler", "tensor %s: its shape is now recorded", d.name);
    } else if (rc == 0) {
        s->reg_len +=
            cps__wire_tensor_desc_encode(s->reg + s->reg_len, s->reg_cap - s->reg_len, &d);
        s->reg_count++;
        cps__log(CPS_LOG_INFO, "scheduler", "tensor %s registered (%s, %llu values)", d.name,
                 d.kind ? "table" : "dense", (unsigned long long)d.length);
    }
    if (rc == 0 || rc == 2) {
        if (s->store && (rc = cps__store_write(s->store, save_registry_txn, s)) != 0)
            cps__log(CPS_LOG_ERROR, "scheduler", "cannot save the tensor registry: %s",
                     cps_strerror(rc));
        rc = 0;
    } else if (rc == 1) {
        rc = 0;
    }
    if (rc == CPS_EEXIST) {
        cps__log(CPS_LOG_ERROR, "scheduler",
                 "worker %u declared tensor %s with another shape or optimizer than before",
                 n->info.id, d.name);
        char text[CPS_TENSOR_NAME_MAX + 64];
        snprintf(text, sizeof text, "tensor %s is registered with another definition", d.name);
        cps__msg_reply_error(s->tp, SCHED_ID, s->view.epoch, &rx->hdr, rc, text);
    } else if (rc != 0) {
        cps__log(CPS_LOG_WARN, "scheduler", "malformed REGISTER from node %u dropped: %s",
                 n->info.id, cps_strerror(rc));
        cps__msg_reply_error(s->tp, SCHED_ID, s->view.epoch, &rx->hdr, rc,
                             "malformed tensor description");
    } else {
        send_simple(s, n->info.id, CPS_MSG_REGISTER, &rx->hdr);
    }
}

/* REGISTRY from a tool: reply with the view, the tensor count and the descriptions. */
static void handle_registry(cps__sched *s, cps__rx *rx)
{
    uint32_t tmp = tool_peer(s, rx, "REGISTRY");
    if (!tmp)
        return;
    size_t len;
    unsigned char *buf = view_reply(s, rx, CPS_MSG_REGISTRY, 8 + s->reg_len, &len);
    if (!buf)
        return;
    size_t vlen = cps__view_encoded_size(&s->view);
    unsigned char *p = buf + CPS_WIRE_HDR_SIZE;
    /* The descriptions start 8-byte aligned after the view. */
    memset(p + vlen, 0, 8);
    cps__le32_put(p + vlen, s->reg_count);
    if (s->reg_len)
        memcpy(p + vlen + 8, s->reg, s->reg_len);
    if (cps__tp_send(s->tp, tmp, buf, CPS_WIRE_HDR_SIZE + len) != 0)
        cps__tp_free(buf);
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
    if (h->type == CPS_MSG_HELLO) {
        handle_hello(s, &rx);
    } else if (h->type == CPS_MSG_SHUTDOWN && h->sender == UINT32_MAX) {
        /* `chainps status --end`: end a held job (or any job, on purpose). */
        cps__log(CPS_LOG_INFO, "scheduler", "asked to end the job");
        shutdown_job(s);
    } else if (h->type == CPS_MSG_STATUS) {
        handle_status(s, &rx);
    } else if (h->type == CPS_MSG_DRAIN) {
        handle_drain(s, &rx);
    } else if (h->type == CPS_MSG_REGISTRY) {
        handle_registry(s, &rx);
    } else if (h->type == CPS_MSG_CKPT_DONE && h->sender == UINT32_MAX) {
        handle_ckpt_done(s, &rx);
    } else if (h->type == CPS_MSG_RELEASE) {
        if (s->cfg.hold_workers) {
            s->cfg.hold_workers = 0;
            cps__log(CPS_LOG_INFO, "scheduler", "checkpoint restored: admitting the workers");
            for (uint32_t i = 0; i < s->nnodes; i++)
                if (s->nodes[i].info.role == CPS_ROLE_WORKER && s->started)
                    send_view(s, s->nodes[i].info.id, CPS_MSG_WELCOME);
        }
    } else {
        sched_node *n = find_node(s, h->sender);
        if (!n) {
            cps__log(CPS_LOG_WARN, "scheduler", "message type %u from unknown node %u dropped",
                     h->type, h->sender);
            cps__rx_free(&rx);
            return;
        }
        n->last_seen_ms = cps__now_ms();
        if (n->left) {
            /* Drained, and still talking (our SHUTDOWN is on its way, or was lost). */
            if (h->type == CPS_MSG_HEARTBEAT || h->type == CPS_MSG_GET_VIEW)
                send_simple(s, n->info.id, CPS_MSG_SHUTDOWN, NULL);
            cps__rx_free(&rx);
            return;
        }
        cps__detector_heard(s->detector, n->info.id, n->last_seen_ms);
        if (!n->info.alive && n->info.role == CPS_ROLE_WORKER && !n->done && s->started &&
            h->type == CPS_MSG_HEARTBEAT) {
            /* A worker declared dead is alive after all (it was starved, not dead): take it
             * back, unless a new worker has its place. */
            int taken = 0;
            for (uint32_t i = 0; i < s->nnodes; i++)
                taken |= s->nodes[i].info.role == CPS_ROLE_WORKER && s->nodes[i].info.alive &&
                         s->nodes[i].info.rank == n->info.rank;
            if (taken) {
                /* Its peer was dropped (sync_peers): answer at a short-lived one, once a second
                 * at most (the ring of those is shared with the tools). */
                uint64_t now = cps__now_ms();
                if (now - n->shutdown_sent_ms >= 1000) {
                    uint32_t tmp = cps__temp_peer_add(&s->temps, s->tp, n->info.addr, now);
                    if (tmp)
                        send_simple(s, tmp, CPS_MSG_SHUTDOWN, NULL);
                    n->shutdown_sent_ms = now;
                }
            } else {
                n->info.alive = 1;
                cps__detector_watch(s->detector, n->info.id, n->last_seen_ms);
                cps__log(CPS_LOG_WARN, "scheduler",
                         "worker %u (rank %u) declared dead is alive: "
                         "taking it back",
                         n->info.id, n->info.rank);
                publish_view(s, "a worker came back");
            }
        }
        if (!n->info.alive && n->info.role == CPS_ROLE_SERVER && s->started &&
            h->type != CPS_MSG_GET_VIEW) {
            /* Declared dead but still talking (paused, partitioned): show it the view. */
            send_view(s, n->info.id, CPS_MSG_VIEW);
            cps__rx_free(&rx);
            return;
        }
        switch (h->type) {
        case CPS_MSG_HEARTBEAT:
            if (rx.len >= CPS_STATS_SIZE)
                cps__stats_decode(rx.payload, &n->stats);
            break;
        case CPS_MSG_CAUGHT_UP:
            on_caught_up(s, n, h);
            break;
        case CPS_MSG_GET_VIEW:
            if (s->started)
                send_view(s, n->info.id, CPS_MSG_VIEW);
            break;
        case CPS_MSG_BARRIER:
            if (n->info.role == CPS_ROLE_WORKER) {
                n->in_barrier = 1;
                n->barrier_seq = h->req_seq;
                maybe_release_barrier(s);
            }
            break;
        case CPS_MSG_REGISTER:
            on_register(s, n, &rx);
            break;
        case CPS_MSG_SUSPECT:
            on_suspect(s, n, &rx);
            break;
        case CPS_MSG_PROBE:
            if (h->flags & CPS_WF_REPLY)
                cps__suspect_answered(s->suspect, n->info.id, h->req_seq);
            break;
        case CPS_MSG_BYE:
            if (n->info.role == CPS_ROLE_WORKER && !n->done) {
                n->done = 1;
                cps__detector_forget(s->detector, n->info.id);
                if (rx.len >= CPS_STATS_SIZE)
                    cps__stats_decode(rx.payload, &n->stats);
                s->workers_done++;
                cps__log(CPS_LOG_INFO, "scheduler", "worker %u (rank %u) finished (%u of %u)",
                         n->info.id, n->info.rank, s->workers_done, s->cfg.num_workers);
                maybe_release_barrier(s);
            }
            send_simple(s, n->info.id, CPS_MSG_ACK, h);
            if (s->workers_done < s->cfg.num_workers && n->info.alive) {
                /* The others may be waiting for its gradient in a sync step: a view without
                 * it lets the servers complete the step with the workers that are left. */
                n->info.alive = 0;
                publish_view(s, "a worker finished");
            }
            maybe_end_job(s);
            break;
        default:
            cps__log(CPS_LOG_WARN, "scheduler", "unexpected message type %u from node %u", h->type,
                     h->sender);
        }
    }
    cps__rx_free(&rx);
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

/* The servers the data-path detector may probe and declare dead: the live ones, under the
 * current epoch (reports of older ones are fenced). Cheap: a few servers, every detector tick. */
static void sync_suspects(cps__sched *s)
{
    cps__suspect_epoch(s->suspect, s->view.epoch);
    for (uint32_t i = 0; i < s->nnodes; i++) {
        const sched_node *n = &s->nodes[i];
        if (n->info.role != CPS_ROLE_SERVER)
            continue;
        if (n->info.alive && s->started && !s->finished)
            cps__suspect_watch(s->suspect, n->info.id); /* out of memory: not probed, no harm */
        else
            cps__suspect_forget(s->suspect, n->info.id);
    }
}

/* A worker or server reports servers that left its requests unanswered (recovery/suspect.h):
 * the report may start a probe round of every server; the probes decide, never the report. */
static void on_suspect(cps__sched *s, sched_node *n, const cps__rx *rx)
{
    cps__suspect_entry e[CPS_SUSPECT_MAX];
    uint32_t count = 0;
    int rc = cps__wire_suspects_decode(rx->payload, rx->len, e, &count);
    if (rc != 0) {
        cps__log(CPS_LOG_WARN, "scheduler", "bad suspect list from node %u dropped: %s", n->info.id,
                 cps_strerror(rc));
        return;
    }
    sync_suspects(s);
    /* The loop's clock of this turn, which the detect timer's ticks also read: a fresher read
     * here could start a round "after" a tick later in the same turn (see recovery/suspect.c). */
    uint64_t now = cps__loop_now(s->loop);
    for (uint32_t i = 0; i < count; i++) {
        cps__suspect_report_in in = {n->info.id, n->info.alive && !n->done, rx->hdr.epoch,
                                     e[i].node, e[i].unanswered_ms};
        int was = cps__suspect_probing(s->suspect);
        int v = cps__suspect_report(s->suspect, &in, now);
        const cps__suspect_action *a;
        size_t na = cps__suspect_actions(s->suspect, &a);
        if (v == CPS_SUS_PROBING && !was)
            cps__log(CPS_LOG_INFO, "scheduler",
                     "%s %u has had requests to server %u unanswered for %u ms: probing %zu "
                     "server(s)",
                     role_name(n->info.role), n->info.id, e[i].node, e[i].unanswered_ms, na);
        for (size_t k = 0; k < na; k++) {
            cps__msg_hdr h = {.type = CPS_MSG_PROBE,
                              .sender = SCHED_ID,
                              .epoch = s->view.epoch,
                              .req_seq = a[k].nonce};
            int src = cps__msg_send(s->tp, a[k].node, &h, NULL, 0);
            if (src != 0)
                cps__log(CPS_LOG_DEBUG, "scheduler", "probe to server %u not sent: %s", a[k].node,
                         cps_strerror(src));
        }
    }
}

/* ---- the event loop's timers and hook ---- */

static int on_repair(cps__loop *l, uint64_t id, void *ctx, uint64_t now);
static int linger_then_stop(cps__sched *s);

/* Failure detection, every DETECT_EVERY_MS. */
static int on_detect(cps__loop *l, uint64_t id, void *ctx, uint64_t now)
{
    (void)id;
    cps__sched *s = ctx;
    if (now - s->last_detect_ms > s->cfg.dead_after_ms / 2) {
        /* We ourselves did not run (descheduled, paused): the silence we would now see is
         * ours, not the nodes'. Give everyone a fresh deadline instead of declaring all of
         * them dead at once. */
        cps__log(CPS_LOG_WARN, "scheduler",
                 "did not run for %llu ms: not counting that "
                 "against the nodes",
                 (unsigned long long)(now - s->last_detect_ms));
        cps__detector_refresh(s->detector, now);
        cps__suspect_refresh(s->suspect, now);
    }
    s->last_detect_ms = now;
    /* A server whose connection closed and whose address now refuses connections was killed
     * (or crashed): no need to wait out its silence. */
    for (uint32_t i = 0; !s->finished && i < s->nnodes; i++) {
        sched_node *n = &s->nodes[i];
        if (n->info.role != CPS_ROLE_SERVER || !n->info.alive ||
            !cps__tp_peer_gone(s->tp, n->info.id))
            continue;
        if (cps__detector_silence(s->detector, n->info.id, now) != UINT64_MAX) {
            cps__log(CPS_LOG_INFO, "scheduler",
                     "server %u (rank %u): connection closed and refused since (%llu ms after its "
                     "last message): its process is gone",
                     n->info.id, n->info.rank,
                     (unsigned long long)cps__detector_silence(s->detector, n->info.id, now));
            cps__detector_gone(s->detector, n->info.id);
        }
    }
    /* The same for a worker (a killed one, not one that finished: declare_dead skips those): the
     * ring of an all-reduce (replication/collective.h) waits on it, so its death is told at once
     * rather than after CHAINPS_WORKER_DEAD_AFTER_MS of silence. */
    for (uint32_t i = 0; !s->finished && i < s->nnodes; i++) {
        sched_node *n = &s->nodes[i];
        if (n->info.role == CPS_ROLE_WORKER && n->info.alive &&
            cps__tp_peer_gone(s->tp, n->info.id)) {
            cps__log(CPS_LOG_INFO, "scheduler",
                     "worker %u (rank %u): connection closed and refused since: its process is "
                     "gone",
                     n->info.id, n->info.rank);
            declare_dead(s, n->info.id, now > n->last_seen_ms ? now - n->last_seen_ms : 0);
        }
    }
    uint32_t dead[16];
    /* Once the job is ending, servers leave on purpose: not failures. */
    size_t nd = s->finished ? 0 : cps__detector_tick(s->detector, now, dead, 16);
    for (size_t i = 0; i < nd; i++) {
        sched_node *dn = find_node(s, dead[i]);
        if (!dn)
            continue;
        if (dn->info.role == CPS_ROLE_WORKER &&
            now - dn->last_seen_ms <= s->cfg.worker_dead_after_ms) {
            /* Workers get longer (CHAINPS_WORKER_DEAD_AFTER_MS): keep watching. */
            cps__detector_watch(s->detector, dn->info.id, dn->last_seen_ms);
            continue;
        }
        declare_dead(s, dead[i], now - dn->last_seen_ms);
    }
    /* Data-path evidence: servers that left the scheduler's probe unanswered. */
    sync_suspects(s);
    cps__suspect_tick(s->suspect, now);
    const cps__suspect_action *sa;
    size_t ns = s->finished ? 0 : cps__suspect_actions(s->suspect, &sa);
    for (size_t i = 0; i < ns; i++) {
        sched_node *dn = find_node(s, sa[i].node);
        if (!dn || !dn->info.alive)
            continue;
        /* last_seen_ms is read from a fresher clock than this turn's `now`. */
        uint64_t hb_age = now > dn->last_seen_ms ? now - dn->last_seen_ms : 0;
        cps__log(CPS_LOG_WARN, "scheduler",
                 "server %u (rank %u) left our probe unanswered for %llu ms after node %u "
                 "reported its requests unanswered (its heartbeats are %llu ms old): its inbox "
                 "is cut off",
                 dn->info.id, dn->info.rank, (unsigned long long)sa[i].silent_ms, sa[i].reported_by,
                 (unsigned long long)hb_age);
        cps__detector_forget(s->detector, dn->info.id);
        declare_dead(s, dn->info.id, hb_age);
        nd++;
    }
    if (nd) {
        /* Re-form the chains now, not at the next periodic repair. */
        repair(s, now);
        return cps__loop_timer_add(l, T_REPAIR, REPAIR_EVERY_MS, REPAIR_EVERY_MS, on_repair, s);
    }
    return 0;
}

static int on_repair(cps__loop *l, uint64_t id, void *ctx, uint64_t now)
{
    (void)l, (void)id;
    repair(ctx, now);
    return 0;
}

/* Not every node arrived within join_timeout_ms. */
static int on_join_timeout(cps__loop *l, uint64_t id, void *ctx, uint64_t now)
{
    (void)l, (void)id, (void)now;
    cps__sched *s = ctx;
    if (s->started || s->stopping)
        return 0;
    cps__log(CPS_LOG_ERROR, "scheduler",
             "only %u of %u servers and %u of %u workers arrived within %.1f s; giving up",
             count_role(s, CPS_ROLE_SERVER), s->cfg.num_servers, count_role(s, CPS_ROLE_WORKER),
             s->cfg.num_workers, s->cfg.join_timeout_ms / 1000.0);
    shutdown_job(s);
    /* Workers wait in cps_open() too: tell them now, not after their own timeout. */
    for (uint32_t i = 0; i < s->nnodes; i++)
        if (s->nodes[i].info.role == CPS_ROLE_WORKER)
            send_simple(s, s->nodes[i].info.id, CPS_MSG_SHUTDOWN, NULL);
    s->result = CPS_ETIMEDOUT;
    return linger_then_stop(s);
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

/* Every turn, before the poll. */
static int before_sleep(cps__loop *l, void *ctx, uint64_t now)
{
    cps__sched *s = ctx;
    if (cps__role_stop_requested() && !s->stopping) {
        cps__log(CPS_LOG_INFO, "scheduler", "stop requested; telling servers to shut down");
        shutdown_job(s);
        int rc = linger_then_stop(s);
        if (rc != 0)
            return rc;
    }
    cps__temp_peers_expire(&s->temps, s->tp, now);
    if (s->finished && !s->stopping && !cps__loop_timer_armed(l, T_FINISH, NULL)) {
        s->finish_at = now + SHUTDOWN_LINGER_MS;
        return cps__loop_timer_add(l, T_FINISH, SHUTDOWN_LINGER_MS, DETECT_EVERY_MS, on_finish, s);
    }
    return 0;
}

int cps__scheduler_run(const cps__config *cfg)
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
    cps__sched s;
    memset(&s, 0, sizeof s);
    s.cfg = *cfg;
    cps__config_finalize(&s.cfg, CPS_ROLE_SCHEDULER);
    cfg = &s.cfg;
    if (cps__node_load_secret(&s.cfg, "scheduler") != 0)
        return CPS_ECONFIG;
    s.next_id = 1;
    cps__view_init(&s.view);
    s.nodes = calloc(CPS_MAX_NODES, sizeof *s.nodes);
    cps__detector_config dc = {cfg->dead_after_ms, 2 * cfg->dead_after_ms};
    int rc = s.nodes ? cps__detector_create(&dc, &s.detector) : CPS_ENOMEM;
    cps__suspect_config sc = {cps__suspect_evidence_ms(cfg->dead_after_ms),
                              cps__suspect_probe_ms(cfg->dead_after_ms)};
    if (rc == 0)
        rc = cps__suspect_create(&sc, &s.suspect);
    if (rc == 0)
        rc = cps__loop_create(&s.loop);
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
    cps__store_opts so = {.initial_map_bytes = 8u << 20, .sync_every_commit = 1};
    rc = cps__store_open(dir, &so, &s.store);
    if (rc == 0)
        rc = job_id_load(&s);
    if (rc == 0)
        rc = resume(&s);
    if (rc != 0) {
        cps__log(CPS_LOG_ERROR, "scheduler", "cannot use %s: %s", dir, cps_strerror(rc));
        goto out;
    }
    if (!s.started)
        cps__log(CPS_LOG_INFO, "scheduler",
                 "listening on %s:%u, waiting for %u servers and %u "
                 "workers (state in %s)",
                 cfg->bind_host, cfg->sched_port, cfg->num_servers, cfg->num_workers, dir);
    s.start_ms = cps__now_ms();
    s.last_detect_ms = s.start_ms;
    cps__loop_before_sleep(s.loop, before_sleep, &s);
    rc = cps__loop_tp_attach(&s.inbox, s.loop, s.tp, handle_msg, &s, MSGS_PER_TURN);
    if (rc == 0)
        rc = cps__loop_timer_add(s.loop, T_DETECT, DETECT_EVERY_MS, DETECT_EVERY_MS, on_detect, &s);
    if (rc == 0)
        rc = cps__loop_timer_add(s.loop, T_REPAIR, 0, REPAIR_EVERY_MS, on_repair, &s);
    if (rc == 0 && !s.started)
        rc = cps__loop_timer_add(s.loop, T_JOIN, cfg->join_timeout_ms + 1, 0, on_join_timeout, &s);
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
    cps__detector_destroy(s.detector);
    cps__suspect_destroy(s.suspect);
    cps__store_close(s.store);
    cps__repair_destroy(s.repair);
    cps__view_fini(&s.view);
    free(s.reg);
    free(s.nodes);
    return rc;
}
