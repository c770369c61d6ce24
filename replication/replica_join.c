/* State transfer inside the replica (replica.h): both sides of a join.
 *
 * At the tail: a SNAP_REQ makes the joiner a shadow successor (chain_join.c: every update the
 * tail applies from now on goes to it too), then a SNAPSHOT order tells the shell to stream the
 * range from its store. At the joiner: recovery/joiner.c decides (orders, chunks, deadlines,
 * views); this file performs its actions on the chain and turns those that touch the store into
 * ready items. BEGIN and INSTALL need the store's outcome before the join goes on: each is the
 * last item of its ready list, and the shell answers it with cps__replica_join_result. READY
 * only reads the store (the snapshot's SSP clocks) and runs the chain, so it is done here. */
#include <stdlib.h>

#include "chainps/error.h"
#include "core/log.h"
#include "replication/cut_view.h"
#include "replication/replica_int.h"

#define JOIN_TIMEOUT_MS 120000
#define SNAP_RETRY_MS   1000

int cps__rp_joiner_new(cps__replica *r)
{
    if (r->joiner)
        return 0;
    cps__joiner_config cfg = {
        .self = r->cfg.self,
        .nranges = r->view.nranges,
        .timeout_ms = r->cfg.join_timeout_ms ? r->cfg.join_timeout_ms : JOIN_TIMEOUT_MS,
        .snap_retry_ms = r->cfg.snap_retry_ms ? r->cfg.snap_retry_ms : SNAP_RETRY_MS,
        /* Ignoring a stale or early order is safe over one in-order
         * connection too, and covers orders from a scheduler's earlier
         * life still queued. */
        .orders_may_reorder = 1};
    return cps__joiner_create(&cfg, &r->joiner);
}

/* READY: the snapshot's SSP clocks, before the updates after it move them further; then the
 * updates the source forwarded since the snapshot. */
static int join_ready(cps__replica *r, uint32_t range, uint64_t snap_seq, uint64_t now,
                      uint64_t *applied)
{
    int rc = cps__rp_ssp_load(r, range);
    if (rc == 0) {
        rc = cps__chain_join_ready(r->chain, range, snap_seq, now);
        cps__rp_run_chain(r, now);
    }
    *applied = cps__chain_applied(r->chain, range);
    if (rc == 0)
        cps__rp_say(r, CPS_LOG_INFO,
                    "range %u: snapshot at seq %llu installed (%.1f MB), caught up to seq %llu",
                    range, (unsigned long long)snap_seq, cps__joiner_bytes(r->joiner, range) / 1e6,
                    (unsigned long long)*applied);
    return rc;
}

/* Perform the joiner's actions. BEGIN and INSTALL end the ready list (the shell answers them);
 * READY's outcome is known here and hands back the next batch at once. */
static void run_joiner(cps__replica *r, uint64_t now)
{
    const cps__joiner_action *a;
    size_t n = r->joiner ? cps__joiner_actions(r->joiner, &a) : 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t range = a[i].range;
        cps__replica_out *o;
        int rc;
        uint64_t value = 0;
        switch (a[i].kind) {
        case CPS_JA_SEND:
            if ((o = cps__rp_emit(r, CPS_RO_SEND, range)) != NULL) {
                o->to = a[i].to;
                o->hdr = a[i].hdr;
            }
            continue;
        case CPS_JA_ASK_VIEW:
            cps__rp_ask_view(r);
            continue;
        case CPS_JA_ABORT:
            cps__chain_join_abort(r->chain, range);
            if (a[i].why)
                cps__rp_say(r, CPS_LOG_ERROR,
                            "range %u: joining failed (%s: %s); the scheduler will try again",
                            range, a[i].why, cps_strerror(a[i].status));
            continue;
        case CPS_JA_BEGIN:
            /* Forget our copy of the range: the chain's state here, the store's there. */
            rc = cps__chain_begin_join(r->chain, range, a[i].source);
            if (rc == 0)
                cps__rp_say(r, CPS_LOG_INFO,
                            "range %u: joining (join %llu); copying it from node %u", range,
                            (unsigned long long)a[i].seq, a[i].source);
            if (rc == 0 && (o = cps__rp_emit(r, CPS_RO_JOIN_CLEAR, range)) != NULL) {
                o->seq = a[i].seq;
                o->to = a[i].source;
                r->join_wait = 1;
                return;
            }
            rc = rc ? rc : CPS_ENOMEM;
            break;
        case CPS_JA_INSTALL:
            if (r->join_snap && (o = cps__rp_emit(r, CPS_RO_JOIN_INSTALL, range)) != NULL) {
                o->req = r->join_snap->m.hdr;
                o->upd.body = r->join_snap->m.payload;
                o->upd.body_len = r->join_snap->m.len;
                o->last = a[i].last;
                r->join_wait = 1;
                return;
            }
            rc = CPS_ENOMEM;
            break;
        case CPS_JA_READY:
            rc = join_ready(r, range, a[i].seq, now, &value);
            break;
        default:
            continue;
        }
        cps__joiner_result(r->joiner, range, rc, value, now);
        n = cps__joiner_actions(r->joiner, &a);
        i = (size_t)-1; /* the next batch, from its start */
    }
}

int cps__replica_join_result(cps__replica *r, uint32_t range, int rc, uint64_t value, uint64_t now)
{
    cps__rp_begin(r);
    now = cps__rp_clock(r, now);
    if (!r->join_wait || !r->joiner)
        return CPS_EINVAL;
    r->join_wait = 0;
    /* The chunk was written (or not): the message goes back at the next call. */
    cps__rp_rmsg_done(r, r->join_snap);
    r->join_snap = NULL;
    if (cps__joiner_result(r->joiner, range, rc, value, now) > 0)
        run_joiner(r, now);
    return 0;
}

int cps__rp_joiner_view(cps__replica *r, uint64_t now)
{
    int rc = cps__rp_joiner_new(r);
    if (rc != 0) {
        cps__rp_say(r, CPS_LOG_ERROR, "cannot keep track of joins: %s", cps_strerror(rc));
        return rc;
    }
    if (cps__joiner_view(r->joiner, &r->view, now) > 0)
        run_joiner(r, now);
    return 0;
}

struct snap_order {
    uint32_t range, joiner;
    uint64_t join_id;
};

/* The index of the snapshot of join `join_id` of `range` to `joiner` under way, or -1. */
static int64_t snap_find(const cps__replica *r, uint32_t range, uint32_t joiner, uint64_t join_id)
{
    for (uint32_t i = 0; i < r->nsnaps; i++)
        if (r->snaps[i].range == range && r->snaps[i].joiner == joiner &&
            r->snaps[i].join_id == join_id)
            return i;
    return -1;
}

static int snap_remember(cps__replica *r, uint32_t range, uint32_t joiner, uint64_t join_id)
{
    if (r->nsnaps == r->snaps_cap) {
        uint32_t cap = r->snaps_cap ? 2 * r->snaps_cap : 4;
        struct snap_order *grown = realloc(r->snaps, cap * sizeof *grown);
        if (!grown)
            return CPS_ENOMEM;
        r->snaps = grown;
        r->snaps_cap = cap;
    }
    r->snaps[r->nsnaps++] = (struct snap_order){range, joiner, join_id};
    return 0;
}

void cps__replica_snapshot_closed(cps__replica *r, uint32_t range, uint32_t joiner,
                                  uint64_t join_id)
{
    int64_t i = r ? snap_find(r, range, joiner, join_id) : -1;
    if (i >= 0)
        r->snaps[i] = r->snaps[--r->nsnaps];
}

/* SNAP_REQ at the tail: make the joiner a shadow successor, then order the snapshot. */
static void on_snap_req(cps__replica *r, const cps__msg_hdr *h, uint64_t now)
{
    uint32_t range = h->range;
    if (h->epoch > r->view.epoch) {
        /* The joiner runs a newer view: an older one we install next may count it dead and
         * clear the shadow (with what we held for it), while its snapshot still goes out and
         * it reports CAUGHT_UP lacking those updates (simulator seed 5596). Fetch the view;
         * the joiner asks again. */
        cps__rp_ask_view(r);
        return;
    }
    const cps__node_info *joiner = cps__view_node(&r->view, h->sender);
    if (range >= r->view.nranges || !joiner || joiner->role != CPS_ROLE_SERVER || !r->chain ||
        !cps__chain_is_tail(r->chain, range)) {
        cps__rp_say(r, CPS_LOG_WARN,
                    "snapshot request for range %u from node %u refused (not the tail, or not "
                    "a server)",
                    range, h->sender);
        return;
    }
    /* From here on the joiner also receives every update this tail applies; the snapshot,
     * taken a moment later, is at that sequence number or beyond: the joiner skips what the
     * snapshot already holds. */
    int rc = cps__chain_add_shadow(r->chain, range, joiner->id, h->step, now);
    if (rc == CPS_ESTALE_EPOCH) {
        /* A late request of a join the scheduler has replaced since (e.g. sent by the node in
         * an earlier life): serving it would displace the current joiner. */
        cps__rp_say(r, CPS_LOG_WARN,
                    "range %u: snapshot request of node %u for join %llu refused: a later join "
                    "of the range is under way",
                    range, joiner->id, (unsigned long long)h->step);
        return;
    }
    /* A repeat of a join whose snapshot is under way (the joiner asked again before the chunks
     * came, or the network doubled the request): one read transaction streams it already. A
     * second stream carries the same join id, so the joiner could not tell their chunks apart:
     * records of two read transactions would be installed under one's sequence number. */
    if (rc == 0 && snap_find(r, range, joiner->id, h->step) >= 0)
        return;
    if (rc == 0)
        rc = snap_remember(r, range, joiner->id, h->step);
    cps__replica_out *o = rc == 0 ? cps__rp_emit(r, CPS_RO_SNAPSHOT, range) : NULL;
    if (!o) {
        if (rc == 0)
            r->nsnaps--; /* never ordered */
        cps__rp_say(r, CPS_LOG_ERROR, "range %u: cannot start a snapshot for node %u: %s", range,
                    joiner->id, cps_strerror(rc ? rc : CPS_ENOMEM));
        return;
    }
    o->to = joiner->id;
    o->seq = h->step;
    o->req = *h;
}

void cps__rp_on_transfer(cps__replica *r, rmsg *p, uint64_t now)
{
    const cps__msg_hdr *h = &p->m.hdr;
    uint32_t range = h->range;
    if (h->type == CPS_MSG_SNAP_REQ) {
        on_snap_req(r, h, now);
    } else if (!r->joiner) {
        /* No view yet: no joins. */
    } else if (h->type == CPS_MSG_JOIN_RANGE) {
        cps__joiner_order(r->joiner, &r->view, range, (uint32_t)h->aux, h->step, h->epoch, now);
        run_joiner(r, now); /* an order ignored may still ask for the view */
    } else if (h->type == CPS_MSG_SNAP) {
        int joining = range < r->view.nranges && cps__chain_joining(r->chain, range);
        if (cps__joiner_snap(r->joiner, h->sender, range, h->step, h->req_worker, h->req_seq,
                             h->aux == 1, p->m.len, joining, now) > 0) {
            r->join_snap = p; /* INSTALL points into it */
            run_joiner(r, now);
            if (r->join_wait)
                return;
            r->join_snap = NULL;
        }
    }
    cps__rp_rmsg_done(r, p);
}

static int can_serve(void *ctx, uint32_t range)
{
    return cps__chain_can_serve_pull(ctx, range);
}

int cps__replica_join_tick(cps__replica *r, uint64_t now)
{
    cps__rp_begin(r);
    now = cps__rp_clock(r, now);
    if (r->joiner && r->chain && cps__joiner_tick(r->joiner, now, can_serve, r->chain) > 0)
        run_joiner(r, now);
    return 0;
}

int cps__replica_is_tail(const cps__replica *r, uint32_t range)
{
    return r->chain && cps__chain_is_tail(r->chain, range);
}

int cps__replica_joining(const cps__replica *r, uint32_t range)
{
    return r->chain && cps__chain_joining(r->chain, range);
}

uint64_t cps__replica_waiting_since(const cps__replica *r, uint32_t node)
{
    return r->chain ? cps__chain_waiting_since(r->chain, node) : 0;
}

int cps__replica_snapshot_may_close(const cps__replica *r, uint32_t range, uint32_t joiner,
                                    int status, uint64_t ended_ms, uint64_t now)
{
    if (status != 0 || now - ended_ms > CPS_REPLICA_SNAP_LINGER_MS)
        return 1;
    if (!r || range >= r->view.nranges)
        return 0;
    if (cps__cut_holds(&r->view, joiner, range))
        return 1;
    const cps__node_info *n = cps__view_node(&r->view, joiner);
    return !n || !n->alive;
}
