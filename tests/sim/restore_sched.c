/* sim_restore's scheduler: the production coordinator (recovery/coordinator.h), by default
 * (restore.c's small model, declare and send_view, only with --model).
 *
 * The shell here does what src/scheduler does with the coordinator, over the simulated network:
 * the servers say HELLO and the coordinator's first view is the job's (its chains, not the
 * model's); every server's heartbeat thread beats every BEAT_MS while its process lives (a paused
 * server's too, unless the pause stalled it); the coordinator ticks every SCHED_TICK_MS, told which
 * members' connections refuse (a killed server, once the transport notices: the model's declare
 * time); its output is performed in its order (persist: to memory, which never fails; then views
 * and messages). So deaths are declared by the production detector, and the views, their epochs
 * and the repairs after a death are the coordinator's. The tool asks for the view as
 * src/checkpoint/cluster_link.c does (REGISTRY, answered with the view first).
 *
 * Joins are performed as src/server performs them (restore_join.c), so the coordinator's repairs
 * copy ranges onto live servers while the restore streams into them; a killed server comes back
 * on its store in half the kills (after 1-4 s), and a fenced one at once, each with a new replica
 * saying HELLO in a new life until its WELCOME lets it in (then repairs copy ranges onto it). */
#include "restore.h"

#include "recovery/coordinator.h"
#include "coord_out.h"

#define BEAT_MS         100
#define SCHED_TICK_MS   20
#define REPAIR_MS       100
#define BATCH_MS        100
#define JOIN_GIVE_UP_MS 3000
#define SCHED_ID_LIMIT  0x40000000u

static void oom(void)
{
    fprintf(stderr, "sim_restore: out of memory\n");
    exit(2);
}

/* View v, decoded from what the coordinator sends, as w->views[epoch] (the world's storage);
 * epochs it made but sent nobody (two changes in one step) are recorded as the view that followed:
 * no node names them. */
static void record(world *w, const cps__view *v)
{
    if (v->epoch <= w->epoch)
        return;
    if (v->epoch > MAX_EPOCHS || v->nnodes > MAX_SERVERS || v->nranges != w->nranges) {
        sim_fail(&w->v,
                 "a view the restore simulator cannot hold (epoch %" PRIu64
                 ", %u nodes, %u ranges)",
                 v->epoch, v->nnodes, v->nranges);
        return;
    }
    for (uint64_t e = w->epoch + 1; e <= v->epoch; e++) {
        cps__view *d = &w->views[e];
        *d = *v;
        d->epoch = e;
        d->nodes = w->vnodes[e];
        d->ranges = w->vranges[e];
        memcpy(d->nodes, v->nodes, v->nnodes * sizeof *v->nodes);
        memcpy(d->ranges, v->ranges, v->nranges * sizeof *v->ranges);
    }
    w->epoch = v->epoch;
    trace(w, "scheduler: view %" PRIu64, w->epoch);
}

static void record_encoded(world *w, const cps__coord_blob *b, int prefix)
{
    cps__view v;
    cps__view_init(&v);
    size_t used = 0;
    int rc = prefix ? cps__view_decode_prefix(b->data, b->len, &v, &used)
                    : cps__view_decode(b->data, b->len, &v);
    if (rc != 0)
        sim_fail(&w->v, "the coordinator sent a view that does not decode (%s)", cps_err_name(rc));
    else
        record(w, &v);
    cps__view_fini(&v);
}

static int is_server(const world *w, uint32_t id)
{
    return id >= 1 && id <= w->nservers;
}

/* The coordinator's output, in its order: persist (memory), then the actions. `send`: 0 at the
 * start, where every server begins at the first view without being told (as restore.c's setup). */
static void perform(world *w, int send)
{
    cps__coord_out *o = cps__coord_ready(w->coord);
    if (o->persist)
        cps__coord_persisted(w->coord, 0, w->now);
    for (size_t i = 0; i < o->nviews && !w->v.failed; i++)
        if (!sim_co_is_reply(o, i))
            record_encoded(w, &o->views[i], 0);
    size_t nviews = 0;
    for (size_t i = 0; i < o->n; i++)
        nviews += o->a[i].kind == CPS_CO_VIEW;
    for (size_t i = 0; send && i < o->n && !w->v.failed; i++) {
        const cps__coord_action *a = &o->a[i];
        cps__msg_hdr h = a->hdr;
        switch (a->kind) {
        case CPS_CO_VIEW:
            if (!is_server(w, a->peer))
                break;
            /* The servers read a view by the epoch it names (restore.c's on_view). A publish
             * reaches each server up to view_ms late; an answer to one server at once. */
            h.aux = h.epoch; /* WELCOME's req_seq names the life it answers */
            /* Only a broadcast VIEW is late; a WELCOME answers one server's HELLO. */
            view_post(w, a->peer, &h, nviews > 1 && h.type == CPS_MSG_VIEW);
            break;
        case CPS_CO_MSG:
            if (is_server(w, a->peer))
                net_send(w, 0, a->peer, &h, NULL, 0, 1);
            else
                cps__coord_unsent(w->coord, &a->hdr);
            break;
        case CPS_CO_REPLY:
            /* The tool's REGISTRY: the view first (cluster_link.c reads only that here). */
            if (a->peer == TOOL && h.type == CPS_MSG_REGISTRY) {
                record_encoded(w, &o->views[a->view], 1);
                cps__msg_hdr v = {.type = CPS_MSG_VIEW, .flags = CPS_WF_REPLY, .aux = w->epoch};
                net_send(w, 0, TOOL, &v, NULL, 0, 1);
            }
            break;
        case CPS_CO_ERROR:
        case CPS_CO_TO_ADDR:
            sim_fail(&w->v, "the coordinator refused a node: %s", a->text);
            break;
        case CPS_CO_LOG:
            trace(w, "scheduler: %s", a->text);
            break;
        default:
            break; /* peers: the simulated network needs none */
        }
    }
    cps__coord_done(w->coord);
}

/* Server id's HELLO in life `boot` (kept on its id and rank: a restart on its store). */
static size_t hello_of(uint32_t id, uint32_t boot, uint8_t *pl, size_t cap, cps__msg_hdr *h)
{
    char addr[32];
    snprintf(addr, sizeof addr, "sim://%u", id);
    size_t len = cps__hello_encode(pl, cap, CPS_ROLE_SERVER, id - 1, id, addr);
    *h = (cps__msg_hdr){.type = CPS_MSG_HELLO, .sender = id, .aux = boot, .raw_len = (uint32_t)len};
    return len;
}

void rsched_setup(world *w)
{
    cps__config c;
    cps__config_defaults(&c);
    c.num_servers = w->nservers;
    c.num_workers = 0; /* a restore holds the workers back; none is modelled */
    c.replicas = w->replicas;
    c.num_ranges = w->nranges;
    c.mode = CPS_MODE_ASYNC;
    c.dead_after_ms = DEAD_AFTER;
    c.join_timeout_ms = 60000;
    cps__coord_config cc = {.cfg = &c,
                            .repair_every_ms = REPAIR_MS,
                            .batch_ms = BATCH_MS,
                            .join_give_up_ms = JOIN_GIVE_UP_MS,
                            .save_retry_ms = 200,
                            .id_limit = SCHED_ID_LIMIT,
                            .now = w->now};
    if (cps__coord_create(&cc, &w->coord) != 0)
        oom();
    w->epoch = 0;
    for (uint32_t id = 1; id <= w->nservers; id++) {
        uint8_t pl[64];
        cps__msg_hdr h;
        size_t len = hello_of(id, 1, pl, sizeof pl, &h);
        cps__coord_step(w->coord, &h, pl, len, id, w->now);
    }
    perform(w, 0);
    const cps__view *v = &w->views[1];
    int ok = cps__coord_started(w->coord) && w->epoch == 1 && v->nnodes == w->nservers;
    for (uint32_t k = 0; ok && k < v->nnodes; k++)
        ok = v->nodes[k].id == k + 1;
    if (!ok) {
        fprintf(stderr, "sim_restore: the coordinator did not start the job as expected\n");
        exit(2);
    }
    ev_push(w, SCHED_TICK_MS, EV_STICK, 0, 0, NULL);
}

void rsched_teardown(world *w)
{
    cps__coord_destroy(w->coord);
    w->coord = NULL;
}

/* A message to the scheduler: the tool's GET_VIEW is asked as the tool asks (REGISTRY). */
void rsched_deliver(world *w, msg *m)
{
    if (m->from == TOOL) {
        cps__msg_hdr q = {.type = CPS_MSG_REGISTRY, .sender = UINT32_MAX};
        cps__coord_step(w->coord, &q, NULL, 0, cps__coord_tool_request(&q) ? TOOL : 0, w->now);
    } else {
        cps__msg_hdr h = m->h;
        h.sender = m->from;
        h.raw_len = (uint32_t)m->len;
        cps__coord_step(w->coord, &h, m->pl, m->len, m->from, w->now);
    }
    perform(w, 1);
}

/* The coordinator's tick, told which members' connections refuse (killed, and noticed). */
void rsched_tick(world *w)
{
    uint32_t gone[MAX_SERVERS], n = 0;
    for (uint32_t id = 1; id <= w->nservers; id++)
        if (w->srv[id].state == SRV_DEAD && w->srv[id].gone)
            gone[n++] = id;
    cps__coord_tick(w->coord, w->now, gone, n);
    perform(w, 1);
    ev_push(w, w->now + SCHED_TICK_MS, EV_STICK, 0, 0, NULL);
}

/* A server's heartbeat thread, at its loop's tick: it beats while the process lives, a paused
 * one too unless the pause stalled it. */
void rsched_beat(world *w, server *s)
{
    if (s->state == SRV_HELLO) { /* restarted: HELLO again until let in */
        if (w->now < s->hello_at)
            return;
        s->hello_at = w->now + 300;
        uint8_t pl[64];
        cps__msg_hdr h;
        size_t len = hello_of(s->id, s->boot, pl, sizeof pl, &h);
        net_send(w, s->id, 0, &h, pl, len, 1);
        return;
    }
    if (w->now < s->beat_at || s->state == SRV_DEAD || s->state == SRV_FENCED ||
        (s->state == SRV_PAUSED && s->hb_stalled))
        return;
    s->beat_at = w->now + BEAT_MS;
    cps__msg_hdr h = {
        .type = CPS_MSG_HEARTBEAT, .sender = s->id, .epoch = s->view ? s->view->epoch : 0};
    net_send(w, s->id, 0, &h, NULL, 0, 1);
}
