/* The simulator's scheduler: the production coordinator (recovery/coordinator.h) itself, fed the
 * simulated network's messages and ticks, its output performed as a shell performs it: persist
 * (to memory), then send (through the simulated network, a view with a random delay per node).
 * Only the network, the store and the clock are fake. Its view of each epoch is recorded in
 * sm->views, which nodes read by the epoch a VIEW names; changes between epochs are observed for
 * the invariants (joined tails that may lag) and the run's counters.
 *
 * Also here: what the scheduler's peers do that only the scheduler sees: the workers' heartbeats
 * and their reports of unanswered requests (recovery/suspect.h), a server's answer to a probe,
 * a server obeying SHUTDOWN, and the faults aimed at the scheduler (a restart that resumes from
 * what it persisted, a drain asked by the operator's tool). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "core/view.h"
#include "core/wire.h"
#include "recovery/coordinator.h"
#include "recovery/suspect.h"

#include "sim.h"
#include "coord_out.h"

/* The operator's tool (DRAIN): a peer id no node has. */
#define SIM_TOOL 0x40000001u

static const char *const blob_names[SIM_SCHED_BLOBS] = {
    "sched/view", "sched/state", "sched/scale", "sched/boots", "sched/former", "sched/unconfirmed"};

static void oom(void)
{
    fprintf(stderr, "sim: out of memory\n");
    exit(2);
}

const cps__coord_node *sim_coord_node(const sim *sm, uint32_t id)
{
    uint32_t n;
    const cps__coord_node *nodes = cps__coord_nodes(sm->coord, &n);
    for (uint32_t i = 0; i < n; i++)
        if (nodes[i].info.id == id)
            return &nodes[i];
    return NULL;
}

/* ---- recording the views ---- */

/* What changed from view `a` to the next one `b`: deaths (one the fault injector caused is no
 * longer pending; a live, reachable server taken for dead is counted), revivals, tails appended
 * by a join (they may lag until they caught up: invariant checks skip them), members trimmed. */
static void observe(sim *sm, const cps__view *a, const cps__view *b)
{
    if (!sm->servers)
        return; /* setup: nothing runs yet */
    for (uint32_t id = 1; id <= sm->p.servers; id++) {
        int was = sim_node_alive(a, id), is = sim_node_alive(b, id);
        const cps__coord_node *cn = sim_coord_node(sm, id);
        int left = cn && cn->left;
        if (was && !is) {
            if (sm->pending_victim == id)
                sm->pending_victim = 0;
            const sim_server *s = &sm->servers[id - 1];
            if (!left && s->state == SRV_UP && !(sm->cut_active && sm->cut[id][0]))
                sm->false_deaths++; /* its beats were lost or late */
            if (!left)
                sim_restart_last_replica(sm, id);
        } else if (!was && is && sm->pending_victim == id) {
            sm->pending_victim = 0;
        }
    }
    for (uint32_t r = 0; r < b->nranges && r < a->nranges; r++) {
        const cps__range *ra = &a->ranges[r], *rb = &b->ranges[r];
        for (uint32_t j = 0; j < ra->chain_len; j++) {
            uint32_t m = ra->chain[j];
            if (sim_in_chain(rb, m))
                continue;
            if (sm->lag[r].node == m)
                sm->lag[r].node = 0;
            if (sim_node_alive(b, m) && sim_node_alive(a, m))
                sm->moves++; /* trimmed: a move's old member */
        }
        for (uint32_t j = 0; j < rb->chain_len; j++)
            if (!sim_in_chain(ra, rb->chain[j]) && sim_node_alive(b, rb->chain[j])) {
                sm->lag[r] = (sim_lag){rb->chain[j], b->epoch};
                sm->joins++;
            }
    }
}

/* Record view `v` (decoded from what the coordinator sends) as sm->views[v->epoch]. Epochs it
 * published but sent nobody (two changes in one step) are recorded as the view that followed
 * them: no node ever names them. Takes v. */
static void record(sim *sm, cps__view *v)
{
    if (v->epoch <= sm->epoch) {
        cps__view_fini(v);
        return;
    }
    if (v->epoch > SIM_MAX_EPOCHS) {
        sim_fail(sm, "sim", "more than %d views", SIM_MAX_EPOCHS);
        cps__view_fini(v);
        return;
    }
    while (sm->epoch + 1 < v->epoch) {
        cps__view *g = &sm->views[sm->epoch + 1];
        cps__view_init(g);
        if (cps__view_copy(g, v) != 0)
            oom();
        g->epoch = ++sm->epoch;
        observe(sm, &sm->views[sm->epoch - 1], g);
    }
    sm->views[v->epoch] = *v;
    sm->epoch = v->epoch;
    if (sm->epoch > 1)
        observe(sm, &sm->views[sm->epoch - 1], &sm->views[sm->epoch]);
}

static void record_current(sim *sm)
{
    if (cps__coord_epoch(sm->coord) <= sm->epoch)
        return;
    cps__view v;
    cps__view_init(&v);
    if (cps__view_copy(&v, cps__coord_view(sm->coord)) != 0)
        oom();
    record(sm, &v);
}

/* ---- performing the coordinator's output ---- */

static void persist(sim *sm)
{
    const char *names[SIM_SCHED_BLOBS];
    cps__coord_blob b[SIM_SCHED_BLOBS];
    if (cps__coord_blobs(sm->coord, names, b) != SIM_SCHED_BLOBS)
        oom();
    for (int i = 0; i < SIM_SCHED_BLOBS; i++) {
        free(sm->sched_blob[i]);
        sm->sched_blob[i] = malloc(b[i].len ? b[i].len : 1);
        if (!sm->sched_blob[i])
            oom();
        memcpy(sm->sched_blob[i], b[i].data, b[i].len);
        sm->sched_blob_len[i] = b[i].len;
    }
}

static uint64_t publish_delay(sim *sm)
{
    /* Now and then a node hears of the view very late: it keeps acting in the old epoch. */
    return sim_chance(sm, 100) ? sim_rnd(sm, 2500) : sim_rnd(sm, 300);
}

static int is_node(const sim *sm, uint32_t id)
{
    return id >= 1 && id <= sm->p.servers + sm->p.workers;
}

/* A STATUS reply, as `chainps status` reads it, must say what the coordinator holds: its view,
 * whether the job runs, each member's age since last heard, each range's copy under way. */
static void check_status(sim *sm, const cps__coord_out *o, const cps__coord_action *a)
{
    if (a->hdr.type != CPS_MSG_STATUS_REPLY)
        return;
    const cps__coord_blob *b = &o->views[a->view];
    const uint8_t *p = b->data, *end = p + b->len;
    cps__view v;
    cps__view_init(&v);
    size_t used = 0;
    const cps__view *cur = cps__coord_view(sm->coord);
    uint32_t nn;
    const cps__coord_node *nodes = cps__coord_nodes(sm->coord, &nn);
    int bad = cps__view_decode_prefix(p, b->len, &v, &used) != 0 || v.epoch != cur->epoch ||
              v.nnodes != cur->nnodes || a->hdr.aux != (uint64_t)cps__coord_started(sm->coord);
    p += used;
    bad = bad || end - p < 4 || cps__le32_get(p) != nn;
    p += 4;
    for (uint32_t i = 0; !bad && i < nn; i++, p += 8 + CPS_STATS_SIZE) {
        uint64_t age = sm->now > nodes[i].last_seen_ms ? sm->now - nodes[i].last_seen_ms : 0;
        bad = end - p < 8 + CPS_STATS_SIZE || cps__le32_get(p) != nodes[i].info.id ||
              cps__le32_get(p + 4) != (age > UINT32_MAX ? UINT32_MAX : age);
    }
    bad = bad || end - p < 4 || cps__le32_get(p) != cur->nranges;
    p += 4;
    for (uint32_t r = 0; !bad && r < cur->nranges; r++, p += 8) {
        uint32_t source = 0, joiner = cps__coord_joiner(sm->coord, r, &source);
        bad = end - p < 8 || cps__le32_get(p) != joiner || cps__le32_get(p + 4) != source;
    }
    /* Then the last checkpoint's note, which the sim never makes; then the stranded ranges. */
    uint32_t nstranded = 0;
    for (uint32_t r = 0; r < cur->nranges; r++)
        nstranded += cps__coord_stranded(sm->coord, r, NULL, NULL) != 0;
    if (!bad && nstranded) {
        bad = end - p < 8 + 12 * (ptrdiff_t)nstranded ||
              cps__le32_get(p) != CPS_STATUS_STRANDED_TAG || cps__le32_get(p + 4) != nstranded;
        p += 8;
        for (uint32_t r = 0; !bad && r < cur->nranges; r++) {
            uint32_t fallback, id = cps__coord_stranded(sm->coord, r, &fallback, NULL);
            if (!id)
                continue;
            bad = cps__le32_get(p) != r || cps__le32_get(p + 4) != id ||
                  cps__le32_get(p + 8) != fallback;
            p += 12;
        }
    }
    bad = bad || p != end;
    cps__view_fini(&v);
    if (bad)
        sim_fail(sm, "status", "a STATUS reply disagrees with the coordinator (view epoch %llu)",
                 (unsigned long long)cur->epoch);
}

static void perform(sim *sm, int send);

/* `chainps status` asks, as the shell passes it on (the coordinator says it is a tool's). */
static void status_query(sim *sm)
{
    cps__msg_hdr q = {.type = CPS_MSG_STATUS, .sender = UINT32_MAX, .req_seq = 3};
    cps__coord_step(sm->coord, &q, NULL, 0, cps__coord_tool_request(&q) ? SIM_TOOL : q.sender,
                    sm->now);
    perform(sm, 1);
}

/* The output, in its order: persist, then the actions. `send`: 0 in setup, where every node
 * starts at the first view without being told. */
static void perform(sim *sm, int send)
{
    cps__coord_out *o = cps__coord_ready(sm->coord);
    if (o->persist & CPS_CO_P_STATE)
        persist(sm);
    if (o->persist)
        cps__coord_persisted(sm->coord, 0, sm->now);
    for (size_t i = 0; i < o->nviews && !sm->failed; i++) {
        if (sim_co_is_reply(o, i))
            continue; /* a tool's answer (STATUS), checked below */
        cps__view v;
        cps__view_init(&v);
        if (cps__view_decode(o->views[i].data, o->views[i].len, &v) != 0) {
            sim_fail(sm, "wire", "the coordinator sent a view that does not decode");
            return;
        }
        record(sm, &v);
    }
    record_current(sm);
    size_t nviews = 0;
    for (size_t i = 0; i < o->n; i++)
        nviews += o->a[i].kind == CPS_CO_VIEW;
    for (size_t i = 0; send && i < o->n && !sm->failed; i++) {
        const cps__coord_action *a = &o->a[i];
        cps__msg_hdr h = a->hdr;
        switch (a->kind) {
        case CPS_CO_VIEW:
            if (!is_node(sm, a->peer))
                break;
            /* A publish reaches each node after its own delay; an answer to one node at once;
             * and a node gets its views in the order they were sent (one connection): a later
             * view overtaking an earlier one hid a joiner's death from a tail, which then kept
             * forwarding to it for ever (seeds 4312 --faults scale, 9673). */
            sm->net_floor =
                sm->view_due[a->peer] && !sm->p.views_unordered ? sm->view_due[a->peer] + 1 : 0;
            sm->net_last_due = 0;
            sim_send_hdr(sm, 0, a->peer, &h, NULL, 0,
                         nviews > 1 && h.type == CPS_MSG_VIEW ? publish_delay(sm) : 0);
            if (sm->net_last_due > sm->view_due[a->peer])
                sm->view_due[a->peer] = sm->net_last_due;
            sm->net_floor = 0;
            break;
        case CPS_CO_MSG:
            /* A lost probe would be a death (it has no retry); over TCP it is not lost, nor is
             * the answer to a server's DRAIN (only with --drains: other seeds keep their runs). */
            if (is_node(sm, a->peer) &&
                (h.type == CPS_MSG_PROBE ||
                 (sm->p.drains && h.type == CPS_MSG_ACK && a->peer <= sm->p.servers)))
                sim_send_reliable(sm, 0, a->peer, &h);
            else if (is_node(sm, a->peer))
                sim_send_hdr(sm, 0, a->peer, &h, NULL, 0, 0);
            else
                cps__coord_unsent(sm->coord, &a->hdr); /* no such peer: the send fails */
            break;
        case CPS_CO_ERROR:
            if (h.type == CPS_MSG_DRAIN && is_node(sm, a->peer)) {
                /* A server's DRAIN refused: the answer goes back on its connection. */
                cps__msg_hdr e = {.type = CPS_MSG_ERROR,
                                  .flags = CPS_WF_REPLY,
                                  .status = a->code,
                                  .epoch = h.epoch,
                                  .req_seq = h.req_seq};
                sim_send_reliable(sm, 0, a->peer, &e);
                break;
            }
            /* fall through */
        case CPS_CO_TO_ADDR:
            if (is_node(sm, a->peer) || a->kind == CPS_CO_TO_ADDR)
                sim_fail(sm, "scheduler", "the coordinator refused a node: %s", a->text);
            break;
        case CPS_CO_LOG:
            sim_trace(sm, "scheduler: %s", a->text);
            break;
        case CPS_CO_REPLY:
            check_status(sm, o, a);
            break;
        default:
            break; /* peers: the sim's network needs none */
        }
    }
    cps__coord_done(sm->coord);
}

/* ---- the scheduler's life ---- */

static void create(sim *sm)
{
    cps__coord_config cc = {
        &sm->sched_cfg, SIM_REPAIR_MS, SIM_BATCH_MS,      SIM_JOIN_GIVE_UP_MS, 200,
        SIM_TOOL,       sm->now,       sm->p.single_probe};
    if (cps__coord_create(&cc, &sm->coord) != 0)
        oom();
}

static void hello(sim *sm, uint32_t id, uint64_t boot)
{
    int server = id <= sm->p.servers;
    char addr[32];
    uint8_t pl[64];
    snprintf(addr, sizeof addr, "sim://%u", id);
    size_t len = cps__hello_encode(pl, sizeof pl, server ? CPS_ROLE_SERVER : CPS_ROLE_WORKER,
                                   server ? id - 1 : id - 1 - sm->p.servers, id, addr);
    /* A restart on an empty store (a replaced disk) says so, as a server finding no node id in
     * its store does. */
    len = cps__hello_add_flags(pl, sizeof pl, len,
                               server && sm->servers && sm->servers[id - 1].wiped ? CPS_HELLO_EMPTY
                                                                                  : 0);
    cps__msg_hdr h = {.type = CPS_MSG_HELLO, .sender = id, .aux = boot, .raw_len = (uint32_t)len};
    cps__coord_step(sm->coord, &h, pl, len, id, sm->now);
    for (uint32_t r = 0; server && r < sm->nranges; r++) {
        uint32_t fallback;
        if (cps__coord_stranded(sm->coord, r, &fallback, NULL) != id)
            continue;
        if (sm->p.allow_rollback && fallback)
            sim_rollback_restart(sm);
        else
            sim_old_disk_back(sm, id);
        break;
    }
}

void sim_sched_setup(sim *sm)
{
    const sim_params *p = &sm->p;
    cps__config *c = &sm->sched_cfg;
    cps__config_defaults(c);
    /* A spare server holds nothing at the start: it says HELLO once the job runs, and repairs
     * copy ranges onto it. */
    int spare = p->spare && p->servers > p->replicas;
    c->num_servers = spare ? p->servers - 1 : p->servers;
    c->num_workers = p->workers;
    c->replicas = p->replicas;
    c->num_ranges = sm->nranges;
    c->mode = p->mode == SIM_SYNC  ? CPS_MODE_SYNC
              : p->mode == SIM_SSP ? CPS_MODE_SSP
                                   : CPS_MODE_ASYNC;
    c->ssp_bound = p->mode == SIM_SSP ? p->ssp_bound : 0;
    c->backup_workers = p->mode == SIM_SYNC ? p->backup : 0;
    c->dead_after_ms = SIM_DEAD_AFTER_MS;
    /* Workers never die here: their heartbeats cross the lossy network, and the sim's workers do
     * not model being declared dead. */
    c->worker_dead_after_ms = 100 * SIM_DEAD_AFTER_MS;
    c->join_timeout_ms = SIM_JOIN_TIMEOUT_MS;
    c->allow_rollback = p->allow_rollback;
    create(sm);
    for (uint32_t id = 1; id <= p->servers + p->workers; id++)
        if (!(spare && id == p->servers))
            hello(sm, id, 0);
    if (!cps__coord_started(sm->coord)) {
        fprintf(stderr, "sim: the coordinator did not start the job\n");
        exit(2);
    }
    if (spare)
        hello(sm, p->servers, 0);
    perform(sm, 0);
}

void sim_sched_teardown(sim *sm)
{
    cps__coord_destroy(sm->coord);
    sm->coord = NULL;
    for (int i = 0; i < SIM_SCHED_BLOBS; i++)
        free(sm->sched_blob[i]);
}

static int get_blob(void *ctx, const char *name, const void **data, size_t *len)
{
    sim *sm = ctx;
    for (int i = 0; i < SIM_SCHED_BLOBS; i++)
        if (strcmp(blob_names[i], name) == 0 && sm->sched_blob[i]) {
            *data = sm->sched_blob[i];
            *len = sm->sched_blob_len[i];
            return 0;
        }
    return CPS_ENOTFOUND;
}

/* The scheduler restarts (kill -9, then started again on its data directory): everything it
 * held in memory is gone (joins under way, the detector's clocks, probes), it resumes from what
 * it persisted, and announces a new epoch with the same chains. */
void sim_sched_restart(sim *sm)
{
    sim_trace(sm, "scheduler restarts at e%" PRIu64, sm->epoch);
    cps__coord_destroy(sm->coord);
    create(sm);
    int rc = cps__coord_resume(sm->coord, get_blob, sm, sm->now);
    if (rc != 1) {
        sim_fail(sm, "scheduler", "a restarted coordinator did not resume: %s",
                 rc < 0 ? cps_strerror(rc) : "nothing saved");
        return;
    }
    sm->sched_restarts++;
    perform(sm, 1);
}

/* The operator drains a live server when the others can still hold R replicas of every range
 * (`chainps drain`, as the tool sends it). */
void sim_sched_drain(sim *sm)
{
    const cps__view *v = sim_cur_view(sm);
    uint32_t cand[SIM_MAX_SERVERS], nc = 0, active = 0;
    for (uint32_t id = 1; id <= sm->p.servers; id++) {
        const cps__coord_node *cn = sim_coord_node(sm, id);
        int ok =
            sim_node_alive(v, id) && cn && !cn->draining && sm->servers[id - 1].state == SRV_UP;
        active += ok;
        if (ok)
            cand[nc++] = id;
    }
    if (nc == 0 || active - 1 < v->replicas)
        return;
    uint32_t id = cand[sim_rnd(sm, nc)];
    sim_trace(sm, "operator: drain s%u", id);
    cps__msg_hdr h = {.type = CPS_MSG_DRAIN, .sender = UINT32_MAX, .aux = id - 1, .req_seq = 1};
    /* As the shell: a tool's request is answered at the peer its hello names (SIM_TOOL). */
    uint32_t reply_to = cps__coord_tool_request(&h) ? SIM_TOOL : h.sender;
    cps__coord_step(sm->coord, &h, NULL, 0, reply_to, sm->now);
    perform(sm, 1);
}

/* Can `id` leave every chain and still leave each range a replica? */
int sim_sched_removable(const sim *sm, uint32_t id)
{
    const cps__view *v = sim_cur_view(sm);
    for (uint32_t r = 0; r < v->nranges; r++) {
        /* A joined replica still catching up, or not yet confirmed to the scheduler, leaves
         * with its predecessor (recovery/repair.c). */
        uint32_t others = 0, unconfirmed = cps__coord_unconfirmed(sm->coord, r);
        for (uint32_t j = 0; j < v->ranges[r].chain_len; j++) {
            uint32_t m = v->ranges[r].chain[j];
            others += m != id && m != sm->lag[r].node && m != unconfirmed;
        }
        if (sim_in_chain(&v->ranges[r], id) && others == 0)
            return 0;
    }
    return 1;
}

uint32_t sim_sched_joiner(const sim *sm, uint32_t r, uint32_t *source)
{
    if (cps__coord_finished(sm->coord))
        return 0; /* the job ended: a copy under way no longer matters */
    return cps__coord_joiner(sm->coord, r, source);
}

/* ---- messages and ticks ---- */

void sim_sched_deliver(sim *sm, const sim_msg *m)
{
    cps__msg_hdr h;
    if (cps__wire_hdr_decode(m->buf, m->len, &h) != 0 || m->from == 0) {
        sim_fail(sm, "wire", "scheduler got a bad message from %u", m->from);
        return;
    }
    const uint8_t *pl = m->buf + CPS_WIRE_HDR_SIZE;
    size_t len = h.payload_len;
    if (h.type == CPS_MSG_HELLO && m->from <= sm->p.servers) {
        /* The sim's servers say HELLO by their boot alone; the rest is what a server process adds.
         */
        hello(sm, m->from, h.aux);
    } else {
        cps__coord_step(sm->coord, &h, pl, len, m->from, sm->now);
    }
    perform(sm, 1);
}

/* A message of the scheduler to a running server that only the server's shell handles: the
 * probe is answered (if its inbox is reached at all), and SHUTDOWN (drained, or the job ended)
 * stops the process. 1 if handled. */
int sim_sched_to_server(sim *sm, sim_server *s, const sim_msg *m)
{
    cps__msg_hdr h;
    if (cps__wire_hdr_decode(m->buf, m->len, &h) != 0)
        return 0;
    if (h.type == CPS_MSG_PROBE) {
        /* A server process answers whatever its standing (let in or not): a question of whether its
         * inbox is served. */
        sim_trace(sm, "s%u(e%" PRIu64 ") <- 0 PROBE %" PRIx64 ": answered", s->id, s->epoch,
                  h.req_seq);
        cps__msg_hdr a = {
            .type = CPS_MSG_PROBE, .flags = CPS_WF_REPLY, .epoch = s->epoch, .req_seq = h.req_seq};
        sim_send_reliable(sm, s->id, 0, &a);
        return 1;
    }
    if (sm->p.drains && (h.type == CPS_MSG_ACK || h.type == CPS_MSG_ERROR))
        return sim_drain_answer(sm, s, h.type);
    if (h.type != CPS_MSG_SHUTDOWN)
        return 0;
    const cps__coord_node *cn = sim_coord_node(sm, s->id);
    if (!(cn && cn->left) && !cps__coord_finished(sm->coord))
        return 1; /* an old one, to an earlier life that was drained */
    if (!(cn && cn->left)) {
        /* The job ended: the run ends once replication is quiet (a late copy of a request may
         * still be on its way down a chain); the stores are compared then. */
        sim_trace(sm, "s%u told to exit: the job ended", s->id);
        sm->told_exit[s->id] = 1;
        return 1;
    }
    if (s->stop_signals) {
        sm->drains++;
        sim_drain_shutdown(sm, s);
        return 1;
    }
    sim_trace(sm, "s%u told to exit: it stops", s->id);
    s->state = SRV_CRASHED;
    s->inc++;
    if (cn && cn->left) {
        sm->drains++;
        if (sm->p.restart_per_mille > 0)
            sim_push_restart(sm, s->id, 100 + sim_rnd(sm, 3000));
    }
    return 1;
}

/* Every SIM_SCHED_TICK_MS: the workers' heartbeat threads (with their reports of servers that
 * leave requests unanswered, as src/node/msg.c builds them), then the coordinator's tick. */
void sim_sched_tick(sim *sm)
{
    uint32_t evidence = cps__suspect_evidence_ms(SIM_DEAD_AFTER_MS);
    for (uint32_t k = 0; k < sm->p.workers && sm->now - sm->worker_beat_at >= SIM_BEAT_MS; k++) {
        const sim_worker *w = &sm->workers[k];
        const cps__view *wv = cps__sess_view(w->sess);
        cps__msg_hdr b = {.type = CPS_MSG_HEARTBEAT, .epoch = wv->epoch};
        sim_send_hdr(sm, w->id, 0, &b, NULL, 0, 0);
        cps__suspect_entry e[6];
        uint32_t n = 0;
        for (uint32_t id = 1; id <= sm->p.servers && n < 6; id++)
            if (sim_node_alive(wv, id)) {
                uint64_t heard = 0, since = cps__sess_waiting(w->sess, id, &heard);
                cps__suspect_list_add(e, &n, id, since, heard, sm->now, evidence);
            }
        if (n) {
            uint8_t pl[64];
            size_t len = cps__wire_suspects_encode(pl, sizeof pl, e, n);
            cps__msg_hdr su = {.type = CPS_MSG_SUSPECT, .epoch = wv->epoch};
            sim_send_hdr(sm, w->id, 0, &su, pl, len, 0);
        }
    }
    int beat = sm->now - sm->worker_beat_at >= SIM_BEAT_MS;
    if (beat)
        sm->worker_beat_at = sm->now;
    cps__coord_tick(sm->coord, sm->now, NULL, 0);
    perform(sm, 1);
    if (beat && !sm->failed)
        status_query(sm); /* reads only: the run goes on as without it */
}

/* ---- the end of the job: a barrier, then goodbyes (as a training script ends) ---- */

static uint32_t worker_index(const sim *sm, uint32_t id)
{
    return id - 1 - sm->p.servers;
}

/* Every worker waits in a barrier. */
void sim_sched_end(sim *sm)
{
    sim_trace(sm, "the workers wait in a barrier, then say goodbye");
    for (uint32_t k = 0; k < sm->p.workers; k++) {
        const sim_worker *w = &sm->workers[k];
        sm->end_state[k] = 1;
        cps__msg_hdr b = {.type = CPS_MSG_BARRIER,
                          .epoch = cps__sess_view(w->sess)->epoch,
                          .req_worker = w->id,
                          .req_seq = 7};
        sim_send_hdr(sm, w->id, 0, &b, NULL, 0, 0);
    }
}

/* What the scheduler answers a worker at the end: BARRIER_DONE (only once every worker waits:
 * then it says BYE), the ACK of its BYE. 1 if handled. */
int sim_sched_to_worker(sim *sm, sim_worker *w, const sim_msg *m)
{
    cps__msg_hdr h;
    if (cps__wire_hdr_decode(m->buf, m->len, &h) != 0)
        return 0;
    uint32_t k = worker_index(sm, w->id);
    if (h.type == CPS_MSG_BARRIER_DONE) {
        for (uint32_t j = 0; j < sm->p.workers; j++)
            if (sm->end_state[j] == 0)
                sim_fail(sm, "barrier", "worker %u released before worker %u entered", w->id,
                         sm->workers[j].id);
        if (h.req_seq != 7 || sm->end_state[k] != 1)
            sim_fail(sm, "barrier", "worker %u: a release it did not wait for", w->id);
        sm->end_state[k] = 2;
        if (sm->p.mode == SIM_SSP) {
            /* No goodbyes under SSP: a finished worker's stale pull copy stays parked on a tail
             * (replication/ssp.c parks a dead puller's pull; invariant 11 wants it released:
             * seed 657 --servers 5 --workers 3 --replicas 3 --mode ssp:0 --faults all), a
             * question for the server's side. */
            sm->end_state[k] = 3;
            return 1;
        }
        cps__msg_hdr b = {.type = CPS_MSG_BYE,
                          .epoch = cps__sess_view(w->sess)->epoch,
                          .req_worker = w->id,
                          .req_seq = 8};
        sim_send_hdr(sm, w->id, 0, &b, NULL, 0, 0);
        return 1;
    }
    if (h.type == CPS_MSG_ACK && (h.flags & CPS_WF_REPLY) && h.req_seq == 8) {
        sm->end_state[k] = 3;
        return 1;
    }
    return 0;
}

/* The job is over once every worker's BYE is acknowledged and every server stopped; it must
 * not end before every worker said BYE. */
int sim_sched_ended(sim *sm)
{
    int all_bye = 1;
    for (uint32_t k = 0; k < sm->p.workers; k++)
        all_bye &= sm->end_state[k] >= 2;
    if (cps__coord_finished(sm->coord) && !all_bye) {
        sim_fail(sm, "job end", "the job ended before every worker said goodbye");
        return 1;
    }
    for (uint32_t k = 0; k < sm->p.workers; k++)
        if (sm->end_state[k] != 3)
            return 0;
    if (sm->p.mode == SIM_SSP)
        return 1;
    for (uint32_t i = 0; i < sm->p.servers; i++)
        if (sm->servers[i].state != SRV_CRASHED && !sm->told_exit[i + 1])
            return 0;
    if (!cps__coord_finished(sm->coord))
        return 0;
    /* Then what is still on its way down a chain (a late copy of a request) gets there: the
     * stores are compared once it had the time (a move under way when the job ended never
     * completes, so the chains are not waited for). */
    if (!sm->ended_at)
        sm->ended_at = sm->now;
    return sm->now >= sm->ended_at + SIM_END_SETTLE_MS;
}
