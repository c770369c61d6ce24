/* The coordinator's policies: admission (HELLO: ids, ranks, a server's new life), deaths
 * (heartbeat silence, data-path probes), repairs and moves (joiners batched into one view),
 * drains, barriers and the end of the job. See coordinator.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "core/log.h"
#include "recovery/coordinator_membership.h"
#include "recovery/incarnation.h"
#include "recovery/view_change.h"
#include "recovery/workers_end.h"

/* ---- ranks ---- */

/* A worker that died (not one that finished) leaves its rank to a worker joining later. */
static int rank_reusable(const cps__coord_node *n)
{
    return n->info.role == CPS_ROLE_WORKER && !n->info.alive && !n->done;
}

static int rank_taken(const cps__coord *c, int role, uint32_t rank)
{
    for (uint32_t i = 0; i < c->nnodes; i++)
        if (c->nodes[i].info.role == role && c->nodes[i].info.rank == rank &&
            !(c->started && rank_reusable(&c->nodes[i])))
            return 1;
    return 0;
}

/* Members of a role that hold a place in the job (once it runs, dead workers do not). */
static uint32_t count_places(const cps__coord *c, int role)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < c->nnodes; i++)
        n += c->nodes[i].info.role == role && !(c->started && rank_reusable(&c->nodes[i]));
    return n;
}

static uint32_t free_rank(const cps__coord *c, int role, uint32_t want, uint32_t limit)
{
    if (want != UINT32_MAX && want < limit && !rank_taken(c, role, want))
        return want;
    for (uint32_t r = 0; r < limit; r++)
        if (!rank_taken(c, role, r))
            return r;
    return UINT32_MAX;
}

/* ---- the job starts ---- */

/* The job runs (fresh, or resumed after a restart): join bookkeeping, and the failure detector
 * watches every live member. */
int cps__co_begin_running(cps__coord *c, uint64_t now)
{
    /* Join ids grow across our restarts (see cps__repair_config): each life starts its ids at
     * (its first epoch) << 32, above the saved epoch of any earlier life, since a life saves the
     * epoch it starts at before it issues a join; none issues 2^32 joins. */
    cps__repair_config rcfg = {c->view.nranges, c->join_give_up_ms, (c->view.epoch + 1) << 32, 1};
    int err = cps__repair_create(&rcfg, &c->repair);
    if (err != 0)
        return err;
    c->started = 1;
    for (uint32_t i = 0; i < c->nnodes; i++) {
        if (c->nodes[i].info.alive && !c->nodes[i].done)
            cps__detector_watch(c->detector, c->nodes[i].info.id, now);
        if (c->nodes[i].draining)
            cps__repair_set_draining(c->repair, c->nodes[i].info.id, 1);
    }
    return 0;
}

static int start_job(cps__coord *c, uint64_t now)
{
    uint32_t S = cps__co_count_role(c, CPS_ROLE_SERVER);
    uint32_t *servers = calloc(S, sizeof *servers);
    if (!servers)
        return CPS_ENOMEM;
    for (uint32_t i = 0; i < c->nnodes; i++)
        if (c->nodes[i].info.role == CPS_ROLE_SERVER)
            servers[c->nodes[i].info.rank] = c->nodes[i].info.id;
    c->view.epoch = 1;
    c->view.mode = c->cfg.mode;
    c->view.ssp_bound = c->cfg.ssp_bound;
    c->view.backup_workers = c->cfg.mode == CPS_MODE_SYNC ? c->cfg.backup_workers : 0;
    c->view.num_workers = c->cfg.num_workers;
    c->view.num_servers = S;
    /* Default: chains of 3 (or every server, when there are fewer). */
    c->view.replicas = c->cfg.replicas ? c->cfg.replicas : (S < 3 ? S : 3);
    /* More ranges than servers (--ranges) let servers added later take a share of them. */
    uint32_t nranges = c->cfg.num_ranges ? c->cfg.num_ranges : S;
    int rc = cps__view_place_ranges(&c->view, nranges, servers, S, c->view.replicas);
    free(servers);
    if (rc == 0)
        rc = cps__co_sync_view_nodes(c);
    if (rc == 0)
        rc = cps__co_begin_running(c, now);
    if (rc != 0)
        return rc;
    char mode[32];
    cps__co_log(c, CPS_LOG_INFO,
                "connected %u workers and %u servers; view epoch %llu, %u ranges, %u replica(s), "
                "mode %s, %u backup worker(s)",
                c->cfg.num_workers, S, (unsigned long long)c->view.epoch, c->view.nranges,
                c->view.replicas,
                cps__config_mode_str(c->cfg.mode, c->cfg.ssp_bound, mode, sizeof mode),
                c->view.backup_workers);
    c->held_type = CPS_MSG_WELCOME;
    cps__co_save(c);
    int settled = cps__co_workers_settled(c);
    for (uint32_t i = 0; i < c->nnodes; i++)
        cps__co_send_view(c, c->nodes[i].info.id, CPS_MSG_WELCOME, settled);
    if (c->cfg.hold_workers)
        cps__co_log(c, CPS_LOG_INFO, "holding the workers back until the checkpoint is restored");
    return 0;
}

/* ---- admission ---- */

static int emptied(cps__coord *c, cps__coord_node *n, uint64_t boot, uint64_t now);
static int in_chain(const cps__range *rg, uint32_t node);

/* A HELLO that names no member: a new node, if the job has room for it. NULL: refused. */
static cps__coord_node *admit(cps__coord *c, uint32_t role, uint32_t want_rank, uint32_t prev_id,
                              const char *addr)
{
    uint32_t limit = role == CPS_ROLE_SERVER ? c->cfg.num_servers : c->cfg.num_workers;
    /* A server arriving once the job runs is added to it: the balance gives it a share of the
     * ranges (more ranges than servers, --ranges, make that share fair). */
    if (role == CPS_ROLE_SERVER && c->started && !c->finished)
        limit = CPS_MAX_NODES;
    /* A worker arriving after the job ended (one that was to replace a dead worker, too late)
     * would wait for servers that are gone: tell it. */
    int ended = c->finished && role == CPS_ROLE_WORKER;
    if (ended || count_places(c, (int)role) >= limit) {
        if (ended)
            cps__co_log(c, CPS_LOG_ERROR, "refused a worker at %s: the job has ended", addr);
        else
            cps__co_log(c, CPS_LOG_ERROR, "refused a %s at %s: the job already has its %u %ss",
                        cps__co_role((int)role), addr, limit, cps__co_role((int)role));
        /* The error reply goes to whoever sent this HELLO. */
        cps__coord_action *a = cps__co_push(c, CPS_CO_TO_ADDR, 0);
        snprintf(a->addr, sizeof a->addr, "%s", addr);
        a->hdr.epoch = c->view.epoch;
        a->code = ended ? CPS_ESHUTDOWN : CPS_ECONFIG;
        snprintf(a->text, sizeof a->text, "%s", ended ? "the job has ended" : "job is full");
        return NULL;
    }
    if (c->nnodes >= CPS_MAX_NODES) {
        /* Records are never reused (the view names every node that ever joined). */
        cps__co_log(c, CPS_LOG_ERROR,
                    "refused a %s at %s: the job has had %u nodes, the most it can name",
                    cps__co_role((int)role), addr, (unsigned)CPS_MAX_NODES);
        return NULL;
    }
    uint32_t rank = free_rank(c, (int)role, want_rank, limit);
    cps__coord_node *n = &c->nodes[c->nnodes++];
    memset(n, 0, sizeof *n);
    n->info.rank = rank;
    n->info.id =
        (prev_id != 0 && !cps__co_find(c, prev_id) && prev_id < c->id_limit) ? prev_id : c->next_id;
    if (n->info.id >= c->next_id)
        c->next_id = n->info.id + 1;
    n->info.role = (uint8_t)role;
    cps__co_log(c, CPS_LOG_INFO, "%s %u (rank %u) joined from %s", cps__co_role((int)role),
                n->info.id, n->info.rank, addr);
    return n;
}

void cps__co_hello(cps__coord *c, const cps__msg_hdr *h, const void *pl, size_t len, uint64_t now)
{
    uint32_t role, want_rank, prev_id, flags;
    char addr[CPS_ADDR_MAX];
    int rc = cps__hello_decode(pl, len, &role, &want_rank, &prev_id, addr, &flags);
    if (rc != 0) {
        cps__co_log(c, CPS_LOG_ERROR, "malformed HELLO dropped: %s", cps_strerror(rc));
        return;
    }
    if (role != CPS_ROLE_SERVER && role != CPS_ROLE_WORKER) {
        cps__co_log(c, CPS_LOG_ERROR, "HELLO from %s with role %u refused", addr, role);
        return;
    }
    /* A HELLO repeated because our WELCOME was slow, or a restarted node asking for its id. */
    cps__coord_node *n = NULL;
    for (uint32_t i = 0; i < c->nnodes && !n; i++) {
        cps__coord_node *o = &c->nodes[i];
        if (o->info.role == role &&
            (strcmp(o->info.addr, addr) == 0 || (prev_id != 0 && o->info.id == prev_id)))
            n = o;
    }
    if (!n && !(n = admit(c, role, want_rank, prev_id, addr)))
        return;
    if (n->left) {
        /* A drained server started again: a member once more, with no ranges until the balance
         * gives it some. */
        n->left = 0;
        n->info.alive = 0; /* revived below */
        cps__co_log(c, CPS_LOG_INFO, "server %u (rank %u), drained earlier, is back", n->info.id,
                    n->info.rank);
    }
    uint64_t boot = h->aux;
    if (n->info.role == CPS_ROLE_SERVER &&
        cps__incarnation_hello(c->started, n->info.alive, n->boot_id, boot) == CPS_INC_NEW_LIFE) {
        /* Another life of a server we still count alive (recovery/incarnation.h): it restarted
         * (or was fenced) before we noticed, or we restarted since it said HELLO and cannot tell
         * it from one that did. It holds no chain state: first take the old life out of every
         * chain, as for any death, then let the new one in like a server coming back. Taken
         * for "a node moved" after a scheduler restart (the boot id was not kept), a restarted
         * middle kept its chain positions without the FWDs it owed its successor (issue 26). */
        cps__co_log(c, CPS_LOG_WARN,
                    "server %u restarted before it was declared dead%s: treating it as dead, "
                    "then as coming back",
                    n->info.id, n->boot_id ? "" : " (or we did, and do not know its life)");
        cps__co_declare_dead(c, n->info.id, 0, now);
    }
    if (boot)
        n->boot_id = boot;
    if (n->info.role == CPS_ROLE_SERVER && c->started && !n->info.alive) {
        /* A server let in drops every range whose chain does not name it (replication/replica.h,
         * `fresh`), so it is nobody's fallback any more; one that lost its store holds nothing
         * its chains may be served from. Keeping a fallback's copy while it serves other ranges
         * would need the view to name, per range, a member that holds it without serving it: a
         * change of the view's encoding and of every server's `fresh` rule, not done. So a
         * fallback that comes back before the range's empty last replica leaves only the old
         * disk or a checkpoint as ways out (emptied() then finds no fallback and says so). */
        if ((flags & CPS_HELLO_EMPTY) && emptied(c, n, boot, now) != 0)
            return;
        n->empty_kept = 0;
        for (uint32_t r = 0; r < c->view.nranges; r++) {
            if (c->former[r] == n->info.id)
                c->former[r] = 0;
            /* Its only replica is back on its disk: the incident the consent was for is over. */
            if (in_chain(&c->view.ranges[r], n->info.id))
                c->rollback_ok[r] = 0;
        }
    }
    int moved = strcmp(n->info.addr, addr) != 0 && n->info.addr[0];
    if (moved)
        cps__co_log(c, CPS_LOG_INFO, "%s %u (rank %u) came back at %s", cps__co_role(n->info.role),
                    n->info.id, n->info.rank, addr);
    snprintf(n->info.addr, sizeof n->info.addr, "%s", addr);
    int revived = !n->info.alive && c->started;
    n->info.alive = 1;
    if (c->started)
        cps__detector_watch(c->detector, n->info.id, now);
    n->last_seen_ms = now;
    cps__coord_action *a = cps__co_push(c, CPS_CO_PEER_SET, n->info.id);
    snprintf(a->addr, sizeof a->addr, "%s", addr);
    a->force = 1;
    if (c->started) {
        cps__co_sync_view_nodes(c);
        if (moved || revived)
            cps__co_publish(c, revived ? "a node came back" : "a node moved");
        cps__co_send_view(c, n->info.id, CPS_MSG_WELCOME, cps__co_workers_settled(c));
        return;
    }
    if (cps__co_count_role(c, CPS_ROLE_SERVER) == c->cfg.num_servers &&
        cps__co_count_role(c, CPS_ROLE_WORKER) == c->cfg.num_workers &&
        (rc = start_job(c, now)) != 0)
        cps__co_log(c, CPS_LOG_ERROR, "cannot start the job: %s", cps_strerror(rc));
}

/* A worker declared dead is alive after all (it was starved, not dead): take it back, unless a
 * new worker has its place. */
void cps__co_worker_heartbeat(cps__coord *c, cps__coord_node *n, uint64_t now)
{
    int taken = 0;
    for (uint32_t i = 0; i < c->nnodes; i++)
        taken |= c->nodes[i].info.role == CPS_ROLE_WORKER && c->nodes[i].info.alive &&
                 c->nodes[i].info.rank == n->info.rank;
    if (taken) {
        /* Its peer was dropped: answer at a short-lived one, once a second at most (the ring of
         * those is shared with the tools). */
        if (now - n->shutdown_sent_ms >= 1000) {
            cps__coord_action *a = cps__co_push(c, CPS_CO_TO_ADDR, n->info.id);
            snprintf(a->addr, sizeof a->addr, "%s", n->info.addr);
            a->hdr.type = CPS_MSG_SHUTDOWN;
            a->hdr.sender = CPS_COORD_SELF;
            a->hdr.epoch = c->view.epoch;
            n->shutdown_sent_ms = now;
        }
        return;
    }
    n->info.alive = 1;
    cps__detector_watch(c->detector, n->info.id, n->last_seen_ms);
    cps__co_log(c, CPS_LOG_WARN, "worker %u (rank %u) declared dead is alive: taking it back",
                n->info.id, n->info.rank);
    cps__co_publish(c, "a worker came back");
}

/* ---- chains ---- */

static void log_chains(cps__coord *c)
{
    for (uint32_t r = 0; r < c->view.nranges; r++) {
        const cps__range *rg = &c->view.ranges[r];
        char chain[128] = "";
        size_t off = 0;
        for (uint32_t j = 0; j < rg->chain_len && off < sizeof chain; j++)
            off += (size_t)snprintf(chain + off, sizeof chain - off, "%s%u", j ? " -> " : "",
                                    rg->chain[j]);
        cps__co_log(c, CPS_LOG_INFO, "  range %u: %s%s", r, chain,
                    cps__view_range_available(&c->view, r) ? "" : " (NO LIVE REPLICA)");
    }
}

/* Take `node` out of range r's chain (order kept). */
static void chain_remove(cps__range *rg, uint32_t node)
{
    uint32_t k = 0;
    for (uint32_t j = 0; j < rg->chain_len; j++)
        if (rg->chain[j] != node)
            rg->chain[k++] = rg->chain[j];
    rg->chain_len = k;
}

static int in_chain(const cps__range *rg, uint32_t node)
{
    for (uint32_t j = 0; j < rg->chain_len; j++)
        if (rg->chain[j] == node)
            return 1;
    return 0;
}

/* How often a server kept out for an empty store hears its refusal logged again: its HELLO comes
 * every half second, and one line per life says it all. */
#define EMPTY_RELOG_MS 600000u

/* Range r's only replica, server n, came back empty: give the range to its fallback f, which
 * holds it as of the epoch it left in. The operator chose this (--allow-rollback): updates n
 * acknowledged alone since are lost, and said so. */
static void roll_back(cps__coord *c, uint32_t r, const cps__coord_node *n, const cps__coord_node *f)
{
    c->view.ranges[r].chain[0] = f->info.id;
    cps__co_log(c, CPS_LOG_ERROR,
                "range %u ROLLED BACK (--allow-rollback): server %u, its only replica, came back "
                "empty; server %u, which left the range at epoch %llu, takes it as it held it "
                "then: updates acknowledged since are lost (it waits for it)",
                r, n->info.id, f->info.id, (unsigned long long)c->former_epoch[r]);
    c->former[r] = 0;
    c->rollback_ok[r] = 0; /* the consent was for this once */
}

/* Server n, not alive, says HELLO from an empty store (CPS_HELLO_EMPTY: a replaced disk) in life
 * `boot`. A chain may still name it: as the last replica of a range, which a death leaves in its
 * place (recovery/repair.h) for the range to wait for it. Its copy is gone: it must never serve
 * such a range. Ranges it shares with others just lose it (it copies them again as any joiner).
 * A range it is the only replica of has acknowledged updates on no live disk: the member a death
 * took out of it when it left n alone (c->former) holds it only as of then, and giving it the
 * range rolls the job back unseen. As a serious store does (Kafka's unclean leader election is
 * off by default), the range stays unavailable and n is kept out, until n returns on its old
 * disk or the operator restores a checkpoint; rolling back is the operator's decision
 * (cfg.allow_rollback, scheduler --allow-rollback), logged as such. The coordinator cannot know
 * that nothing was acknowledged since the fallback left (no per-range sequence reaches it; a
 * server's heartbeat counts updates of every range, and lags), so it never falls back on its
 * own. Returns 0 when n may be let in, CPS_EAGAIN when it is kept out (it asks again). */
static int emptied(cps__coord *c, cps__coord_node *n, uint64_t boot, uint64_t now)
{
    uint32_t id = n->info.id, changed = 0, kept = 0;
    int say = !n->empty_kept || n->empty_boot != boot || now - n->empty_logged_ms >= EMPTY_RELOG_MS;
    /* Its store is gone whether or not it is let in: it is nobody's fallback any more (issue
     * 28: a fallback kept out on an empty disk was still offered, and rolled back to). */
    for (uint32_t r = 0; r < c->view.nranges; r++)
        if (c->former[r] == id)
            c->former[r] = 0;
    for (uint32_t r = 0; r < c->view.nranges; r++) {
        cps__range *rg = &c->view.ranges[r];
        if (!in_chain(rg, id))
            continue;
        if (rg->chain_len > 1) {
            chain_remove(rg, id);
            changed++;
            cps__co_log(c, CPS_LOG_WARN,
                        "range %u: server %u came back with an empty store: it leaves the chain "
                        "and will copy the range",
                        r, id);
            continue;
        }
        const cps__coord_node *f = c->former[r] ? cps__co_find(c, c->former[r]) : NULL;
        if (f && (f == n || f->info.role != CPS_ROLE_SERVER || f->left))
            f = NULL;
        if (f && c->cfg.allow_rollback && c->rollback_ok[r]) {
            roll_back(c, r, n, f);
            changed++;
            continue;
        }
        kept++;
        if (!say)
            continue;
        /* Two lines, what happened and the ways out: a log line holds 232 bytes. */
        if (f) {
            cps__co_log(c, CPS_LOG_ERROR,
                        "range %u is UNAVAILABLE: server %u, its only replica, came back with an "
                        "empty store and is kept out; the updates it acknowledged since epoch "
                        "%llu are on no other server",
                        r, id, (unsigned long long)c->former_epoch[r]);
            /* Started first, the fallback is let in and drops the range: the last copy. */
            cps__co_log(c, CPS_LOG_ERROR,
                        "range %u: ways out: start server %u on its old disk, or restore a "
                        "checkpoint, or (losing those updates) keep server %u stopped, restart "
                        "the scheduler with --allow-rollback, then start server %u once 'ROLLED "
                        "BACK' is logged",
                        r, id, f->info.id, f->info.id);
        } else {
            cps__co_log(c, CPS_LOG_ERROR,
                        "range %u is UNAVAILABLE: server %u, its only replica, came back with an "
                        "empty store, and no other server holds the range: server %u is kept out",
                        r, id, id);
            cps__co_log(c, CPS_LOG_ERROR,
                        "range %u: ways out: start server %u on its old disk, or restore a "
                        "checkpoint",
                        r, id);
        }
    }
    if (kept && say)
        n->empty_logged_ms = now;
    n->empty_kept = kept != 0;
    n->empty_boot = boot;
    if (kept && changed)
        cps__co_publish(c, "a server came back with an empty store");
    return kept ? CPS_EAGAIN : 0;
}

/* Put the joiners that caught up into the view in memory (the caller publishes it). Returns how
 * many. */
static uint32_t apply_appends(cps__coord *c)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < c->nappends; i++) {
        cps__range *rg = &c->view.ranges[c->appends[i].range];
        uint32_t node = c->appends[i].node;
        int in = 0;
        for (uint32_t j = 0; j < rg->chain_len; j++)
            in |= rg->chain[j] == node;
        if (in || rg->chain_len >= CPS_MAX_REPLICAS)
            continue;
        /* The fallback stays until the tail confirms (cps__co_caught_up): evicted or dead
         * before, it leaves the range with one holder again. */
        rg->chain[rg->chain_len++] = node;
        cps__co_log(c, CPS_LOG_INFO, "server %u joined range %u as its tail", node,
                    c->appends[i].range);
        n++;
    }
    c->nappends = 0;
    c->batch_at = 0;
    return n;
}

/* A draining server that holds, copies and serves nothing any more is done: it is told to exit
 * and leaves the job (a member no longer: not a death). */
static void finish_drains(cps__coord *c)
{
    for (uint32_t i = 0; i < c->nnodes; i++) {
        cps__coord_node *n = &c->nodes[i];
        if (!n->draining || n->left || cps__repair_load(c->repair, &c->view, n->info.id) != 0)
            continue;
        n->draining = 0;
        n->left = 1;
        c->counts.drained++;
        n->info.alive = 0;
        cps__repair_set_draining(c->repair, n->info.id, 0);
        cps__detector_forget(c->detector, n->info.id);
        /* Before the view: a view counting it out would send it rejoining. */
        cps__co_send_simple(c, n->info.id, CPS_MSG_SHUTDOWN, NULL);
        cps__co_log(c, CPS_LOG_INFO,
                    "server %u (rank %u) is drained: it holds no range; told to exit", n->info.id,
                    n->info.rank);
        char why[64];
        snprintf(why, sizeof why, "server %u drained", n->info.id);
        cps__co_publish(c, why);
    }
}

/* Bring every range back to R live replicas, and move ranges for balance and drains:
 * recovery/repair.c decides who copies which range from whom; the joiner reports CAUGHT_UP; a
 * move's leaving member is trimmed once the joiner is confirmed. */
void cps__co_repair(cps__coord *c, uint64_t now)
{
    if (!c->started || c->finished || !c->repair)
        return;
    uint32_t appended = apply_appends(c);
    int n = cps__repair_tick(c->repair, &c->view, now);
    const cps__repair_action *a;
    size_t na = n > 0 ? cps__repair_actions(c->repair, &a) : 0;
    uint32_t trims = 0, evicted = 0;
    char why[128] = "";
    for (size_t i = 0; i < na; i++) {
        if (a[i].kind == CPS_RA_TIMED_OUT) {
            cps__co_log(c, CPS_LOG_WARN, "range %u: node %u did not catch up in time; trying again",
                        a[i].range, a[i].node);
            continue;
        }
        if (a[i].kind == CPS_RA_TRIM) {
            chain_remove(&c->view.ranges[a[i].range], a[i].node);
            c->counts.moves++;
            cps__co_log(c, CPS_LOG_INFO,
                        "range %u: server %u leaves its chain (%u replicas are enough)", a[i].range,
                        a[i].node, c->view.replicas);
            if (!trims++)
                snprintf(why, sizeof why, "server %u left range %u", a[i].node, a[i].range);
            continue;
        }
        if (a[i].kind == CPS_RA_EVICTED) {
            chain_remove(&c->view.ranges[a[i].range], a[i].node);
            evicted++;
            cps__co_log(c, CPS_LOG_WARN,
                        "range %u: server %u did not confirm in time that it caught up with "
                        "server %u; it leaves the chain and will copy the range again",
                        a[i].range, a[i].node, a[i].source);
            continue;
        }
        if (a[i].kind != CPS_RA_JOIN)
            continue;
        cps__coord_action *m = cps__co_push(c, CPS_CO_MSG, a[i].node);
        m->hdr = (cps__msg_hdr){.type = CPS_MSG_JOIN_RANGE,
                                .sender = CPS_COORD_SELF,
                                .epoch = c->view.epoch,
                                .range = a[i].range,
                                .aux = a[i].source,
                                .step = a[i].join_id};
        if (a[i].leaving)
            cps__co_log(c, CPS_LOG_INFO,
                        "range %u moves from server %u to server %u (%s): it copies the range "
                        "from the tail, server %u",
                        a[i].range, a[i].leaving, a[i].node,
                        cps__repair_draining(c->repair, a[i].leaving) ? "drain" : "balance",
                        a[i].source);
        else
            cps__co_log(c, CPS_LOG_INFO,
                        "range %u has %u of %u replicas: server %u copies it from the tail, "
                        "server %u",
                        a[i].range, a[i].live, c->view.replicas, a[i].node, a[i].source);
    }
    if (trims || appended || evicted) {
        if (evicted)
            snprintf(why, sizeof why,
                     "%u joiner(s) became tails, %u move(s) completed, %u unconfirmed tail(s) left",
                     appended, trims, evicted);
        else if (trims + appended > 1 || !trims)
            snprintf(why, sizeof why, "%u joiner(s) became tails, %u move(s) completed", appended,
                     trims);
        cps__co_publish(c, why);
        log_chains(c);
    }
    finish_drains(c);
}

void cps__co_caught_up(cps__coord *c, const cps__coord_node *n, const cps__msg_hdr *h, uint64_t now)
{
    if (!c->repair)
        return;
    uint32_t r = h->range;
    int verdict = cps__repair_caught_up(c->repair, &c->view, n->info.id, r, h->step, h->aux, now);
    /* A restarted scheduler must not find the mark again (sched/unconfirmed): a stale one costs
     * the range a copy, as its confirmation is sent once. */
    if (verdict == CPS_REPAIR_CONFIRMED)
        cps__co_save(c);
    if (verdict == CPS_REPAIR_RETRY)
        cps__co_log(c, CPS_LOG_WARN, "range %u: server %u could not copy it; trying again", r,
                    n->info.id);
    if (verdict == CPS_REPAIR_CONFIRMED)
        c->former[r] = 0; /* updates acknowledged by two from now on */
    if (verdict == CPS_REPAIR_APPEND) {
        if (c->nappends == sizeof c->appends / sizeof c->appends[0])
            cps__co_repair(c, now); /* full: publish what is held first */
        c->appends[c->nappends].range = r;
        c->appends[c->nappends++].node = n->info.id;
    }
    /* A tail to append, or a move whose old member can leave: in a view shortly, together with
     * the others that come meanwhile (repair applies both). */
    if ((verdict == CPS_REPAIR_APPEND || verdict == CPS_REPAIR_CONFIRMED) && !c->batch_at)
        c->batch_at = now + c->batch_ms;
}

/* ---- deaths ---- */

/* A node went silent (or is otherwise gone): take it out of the view and tell everyone. */
void cps__co_declare_dead(cps__coord *c, uint32_t id, uint64_t silence_ms, uint64_t now)
{
    cps__coord_node *n = cps__co_find(c, id);
    if (!n || !n->info.alive)
        return;
    if (n->info.role == CPS_ROLE_WORKER && n->done)
        return; /* finished workers stop heartbeating: not a failure */
    /* Joiners that caught up before the death join first, as they would have, had their view
     * gone out at once: the repair state counts them tails already. */
    apply_appends(c);
    n->info.alive = 0;
    if (n->info.role == CPS_ROLE_SERVER)
        c->counts.deaths_server++;
    else
        c->counts.deaths_worker++;
    cps__co_sync_view_nodes(c);
    /* The ranges it is a full member of (not a joiner that may lack acknowledged updates):
     * where its death leaves one member, it is the range's fallback (c->former). */
    unsigned char *full = calloc(c->view.nranges ? c->view.nranges : 1, 1);
    for (uint32_t r = 0; full && r < c->view.nranges; r++)
        full[r] = in_chain(&c->view.ranges[r], id) && cps__coord_unconfirmed(c, r) != id;
    cps__view nv;
    cps__view_init(&nv);
    uint32_t lost = 0;
    int rc = c->repair ? cps__repair_declare_dead(c->repair, &c->view, id, &nv, &lost)
                       : cps__view_without(&c->view, id, &nv, &lost);
    if (rc != 0) {
        cps__co_log(c, CPS_LOG_ERROR, "cannot build a view without node %u", id);
        cps__view_fini(&nv);
        free(full);
        return;
    }
    for (uint32_t r = 0; r < nv.nranges; r++) {
        const cps__range *rg = &nv.ranges[r];
        /* Only a full member's death changes the fallback: an unconfirmed tail's leaves the
         * one it had (the range is as it was before the tail joined). */
        if (full && full[r] && !in_chain(rg, id)) {
            uint32_t u = cps__coord_unconfirmed(c, r);
            c->former[r] = rg->chain_len - (u && in_chain(rg, u)) == 1 ? id : 0;
        }
        if (c->former[r] == id)
            c->former_epoch[r] = c->view.epoch + 1; /* the view cps__co_publish sends below */
    }
    free(full);
    nv.epoch = c->view.epoch; /* publish bumps it */
    const cps__repair_action *a;
    size_t na = c->repair ? cps__repair_actions(c->repair, &a) : 0;
    for (size_t i = 0; i < na; i++)
        if (a[i].kind == CPS_RA_EVICTED)
            cps__co_log(c, CPS_LOG_WARN,
                        "range %u: server %u had not caught up with server %u; it leaves the "
                        "chain and will copy the range again",
                        a[i].range, a[i].node, a[i].source);
    cps__view_fini(&c->view);
    c->view = nv;
    cps__co_log(c, CPS_LOG_WARN, "%s %u (rank %u) silent for %llu ms: declared dead",
                cps__co_role(n->info.role), id, n->info.rank, (unsigned long long)silence_ms);
    cps__co_publish(c, n->info.role == CPS_ROLE_SERVER ? "a server died" : "a worker died");
    if (n->info.role == CPS_ROLE_SERVER) {
        log_chains(c);
        if (lost)
            cps__co_log(c, CPS_LOG_ERROR,
                        "%u range(s) have no live replica: their calls wait for a server to "
                        "come back",
                        lost);
    } else {
        cps__co_release_barrier(c);
        cps__co_end_job(c);
    }
    (void)now;
}

/* ---- drains ---- */

/* Drain server `n`: its ranges move to the other servers, then it exits. 0, or an error with
 * `err` saying why. */
static int start_drain(cps__coord *c, cps__coord_node *n, char *err, size_t errlen, uint64_t now)
{
    if (!c->started || c->finished || !c->repair) {
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
    for (uint32_t i = 0; i < c->nnodes; i++) {
        const cps__coord_node *o = &c->nodes[i];
        others +=
            o != n && o->info.role == CPS_ROLE_SERVER && o->info.alive && !o->left && !o->draining;
    }
    if (others < c->view.replicas) {
        snprintf(err, errlen,
                 "cannot drain server %u: chains of %u need %u other live servers, and %u are "
                 "left (add a server first)",
                 n->info.id, c->view.replicas, c->view.replicas, others);
        return CPS_ECONFIG;
    }
    int rc = cps__repair_set_draining(c->repair, n->info.id, 1);
    if (rc != 0) {
        snprintf(err, errlen, "%s", cps_strerror(rc));
        return rc;
    }
    n->draining = 1;
    cps__co_log(c, CPS_LOG_INFO,
                "draining server %u (rank %u): its %u range(s) move to the other servers",
                n->info.id, n->info.rank, cps__repair_load(c->repair, &c->view, n->info.id));
    cps__co_save(c);
    cps__co_repair(c, now);
    return 0;
}

/* DRAIN: from `chainps drain` (sender UINT32_MAX, aux = the server's rank), or from a server
 * asking to leave (SIGTERM): its own id. Answered with ACK or ERROR at `reply_to`. */
void cps__co_drain(cps__coord *c, const cps__msg_hdr *h, uint32_t reply_to, uint64_t now)
{
    cps__coord_node *n = NULL;
    if (h->sender == UINT32_MAX) {
        if (!reply_to)
            return;
        for (uint32_t i = 0; i < c->nnodes && !n; i++)
            if (c->nodes[i].info.role == CPS_ROLE_SERVER && c->nodes[i].info.rank == h->aux &&
                !c->nodes[i].left)
                n = &c->nodes[i];
    } else if (!(n = cps__co_find(c, h->sender))) {
        return;
    }
    char err[192] = "";
    int rc = CPS_ENOTFOUND;
    if (!n)
        snprintf(err, sizeof err, "no server of rank %llu in the job", (unsigned long long)h->aux);
    else
        rc = start_drain(c, n, err, sizeof err, now);
    if (rc != 0) {
        cps__co_log(c, CPS_LOG_WARN, "drain refused: %s", err);
        cps__co_reply_error(c, h, reply_to, rc, err);
        return;
    }
    cps__coord_action *a = cps__co_push(c, CPS_CO_MSG, reply_to);
    a->hdr = (cps__msg_hdr){.type = CPS_MSG_ACK,
                            .flags = CPS_WF_REPLY,
                            .sender = CPS_COORD_SELF,
                            .epoch = c->view.epoch,
                            .req_seq = h->req_seq,
                            .aux = n->info.id};
}

/* ---- barriers and the end of the job ---- */

void cps__co_release_barrier(cps__coord *c)
{
    if (!cps__workers_barrier_releases(c->nnodes, cps__co_worker_at, c))
        return;
    uint32_t live = 0;
    for (uint32_t i = 0; i < c->nnodes; i++) {
        cps__coord_node *n = &c->nodes[i];
        if (n->info.role == CPS_ROLE_WORKER && n->in_barrier) {
            cps__msg_hdr req = {.req_worker = n->info.id, .req_seq = n->barrier_seq};
            cps__co_send_simple(c, n->info.id, CPS_MSG_BARRIER_DONE, &req);
            n->in_barrier = 0;
            live += !n->done && n->info.alive;
        }
    }
    cps__co_log(c, CPS_LOG_DEBUG, "barrier released (%u workers)", live);
}

/* Every worker finished or died: the job is over (unless held for inspection, or a dead
 * worker's replacement is awaited). */
void cps__co_end_job(cps__coord *c)
{
    if (!c->started || c->finished || c->ending_held)
        return;
    for (uint32_t i = 0; i < c->nnodes; i++) {
        const cps__coord_node *n = &c->nodes[i];
        if (n->info.role == CPS_ROLE_WORKER && !n->done && n->info.alive)
            return;
    }
    uint32_t dead_rank = c->cfg.await_replacements ? cps__co_unfinished_dead_rank(c) : UINT32_MAX;
    if (dead_rank != UINT32_MAX) {
        /* Ending now would leave the worker that takes its place (chainps launch
         * --restart-workers starts one) without servers: it could only fail. Whoever started us
         * with --await-replacements ends the job if it gives up on that worker. */
        cps__co_log(c, CPS_LOG_INFO,
                    "the live workers finished; the job stays open for the worker that takes "
                    "dead rank %u's place",
                    dead_rank);
        return;
    }
    if (c->cfg.hold) {
        c->ending_held = 1;
        cps__co_log(c, CPS_LOG_INFO,
                    "all workers finished; holding the servers until `chainps status --end`");
        return;
    }
    cps__co_log(c, CPS_LOG_INFO, "all workers finished (%u of %u said goodbye); ending the job",
                c->counts.workers_done, c->cfg.num_workers);
    cps__co_shutdown(c);
}

void cps__co_shutdown(cps__coord *c)
{
    for (uint32_t i = 0; i < c->nnodes; i++)
        if (c->nodes[i].info.role == CPS_ROLE_SERVER && !c->nodes[i].left)
            cps__co_send_simple(c, c->nodes[i].info.id, CPS_MSG_SHUTDOWN, NULL);
    c->finished = 1;
    cps__co_save(c); /* a finished job is not resumed */
}

/* ---- failure detection ---- */

/* The servers the data-path detector may probe and declare dead: the live ones, under the
 * current epoch (reports of older ones are fenced). */
static void sync_suspects(cps__coord *c)
{
    cps__suspect_epoch(c->suspect, c->view.epoch);
    for (uint32_t i = 0; i < c->nnodes; i++) {
        const cps__coord_node *n = &c->nodes[i];
        if (n->info.role != CPS_ROLE_SERVER)
            continue;
        if (n->info.alive && c->started && !c->finished)
            cps__suspect_watch(c->suspect, n->info.id); /* out of memory: not probed, no harm */
        else
            cps__suspect_forget(c->suspect, n->info.id);
    }
}

static void send_probe(cps__coord *c, const cps__suspect_action *a)
{
    cps__coord_action *m = cps__co_push(c, CPS_CO_MSG, a->node);
    m->hdr = (cps__msg_hdr){.type = CPS_MSG_PROBE,
                            .sender = CPS_COORD_SELF,
                            .epoch = c->view.epoch,
                            .req_seq = a->nonce};
}

/* A worker or server reports servers that left its requests unanswered (recovery/suspect.h):
 * the report may start a probe round of every server; the probes decide, never the report.
 * `now` must be the clock the ticks read too (see recovery/suspect.c). */
void cps__co_suspect(cps__coord *c, const cps__coord_node *n, const cps__msg_hdr *h, const void *pl,
                     size_t len, uint64_t now)
{
    cps__suspect_entry e[CPS_SUSPECT_MAX];
    uint32_t count = 0;
    int rc = cps__wire_suspects_decode(pl, len, e, &count);
    if (rc != 0) {
        cps__co_log(c, CPS_LOG_WARN, "bad suspect list from node %u dropped: %s", n->info.id,
                    cps_strerror(rc));
        return;
    }
    sync_suspects(c);
    for (uint32_t i = 0; i < count; i++) {
        cps__suspect_report_in in = {n->info.id, n->info.alive && !n->done, h->epoch, e[i].node,
                                     e[i].unanswered_ms};
        int was = cps__suspect_probing(c->suspect);
        int v = cps__suspect_report(c->suspect, &in, now);
        const cps__suspect_action *a;
        size_t na = cps__suspect_actions(c->suspect, &a);
        if (v == CPS_SUS_PROBING && !was)
            cps__co_log(c, CPS_LOG_INFO,
                        "%s %u has had requests to server %u unanswered for %u ms: probing %zu "
                        "server(s)",
                        cps__co_role(n->info.role), n->info.id, e[i].node, e[i].unanswered_ms, na);
        for (size_t k = 0; k < na; k++)
            send_probe(c, &a[k]);
    }
}

void cps__co_detect(cps__coord *c, uint64_t now, const uint32_t *gone, size_t ngone)
{
    if (now - c->last_detect_ms > c->cfg.dead_after_ms / 2) {
        /* We ourselves did not run (descheduled, paused): the silence we would now see is ours,
         * not the nodes'. Give everyone a fresh deadline instead of declaring all of them dead
         * at once. */
        cps__co_log(c, CPS_LOG_WARN, "did not run for %llu ms: not counting that against the nodes",
                    (unsigned long long)(now - c->last_detect_ms));
        cps__detector_refresh(c->detector, now);
        cps__suspect_refresh(c->suspect, now);
    }
    c->last_detect_ms = now;
    /* A server whose connection closed and whose address now refuses connections was killed
     * (or crashed): no need to wait out its silence. */
    for (size_t i = 0; !c->finished && i < ngone; i++) {
        const cps__coord_node *n = cps__co_find(c, gone[i]);
        if (!n || !n->info.alive)
            continue;
        if (n->info.role == CPS_ROLE_WORKER && n->done)
            continue; /* finished: it closed its connection on purpose */
        if (n->info.role == CPS_ROLE_WORKER) {
            /* A killed worker (declare_dead skips one that finished): the ring of an all-reduce
             * (replication/collective.h) waits on it, so its death is told at once rather than
             * after CHAINPS_WORKER_DEAD_AFTER_MS of silence. */
            cps__co_log(c, CPS_LOG_INFO,
                        "worker %u (rank %u): connection closed and refused since: its process "
                        "is gone",
                        n->info.id, n->info.rank);
            cps__co_declare_dead(c, n->info.id, now > n->last_seen_ms ? now - n->last_seen_ms : 0,
                                 now);
            continue;
        }
        if (n->info.role != CPS_ROLE_SERVER)
            continue;
        uint64_t silence = cps__detector_silence(c->detector, n->info.id, now);
        if (silence != UINT64_MAX) {
            cps__co_log(c, CPS_LOG_INFO,
                        "server %u (rank %u): connection closed and refused since (%llu ms after "
                        "its last message): its process is gone",
                        n->info.id, n->info.rank, (unsigned long long)silence);
            cps__detector_gone(c->detector, n->info.id);
        }
    }
    uint32_t dead[16];
    /* Once the job is ending, servers leave on purpose: not failures. */
    size_t nd = c->finished ? 0 : cps__detector_tick(c->detector, now, dead, 16);
    for (size_t i = 0; i < nd; i++) {
        cps__coord_node *dn = cps__co_find(c, dead[i]);
        if (!dn)
            continue;
        if (dn->info.role == CPS_ROLE_WORKER &&
            now - dn->last_seen_ms <= c->cfg.worker_dead_after_ms) {
            /* Workers get longer (CHAINPS_WORKER_DEAD_AFTER_MS): keep watching. */
            cps__detector_watch(c->detector, dn->info.id, dn->last_seen_ms);
            continue;
        }
        cps__co_declare_dead(c, dead[i], now - dn->last_seen_ms, now);
    }
    /* Data-path evidence: servers that left the scheduler's probe unanswered. */
    sync_suspects(c);
    cps__suspect_tick(c->suspect, now);
    const cps__suspect_action *sa;
    size_t ns = c->finished ? 0 : cps__suspect_actions(c->suspect, &sa);
    for (size_t i = 0; i < ns; i++) {
        if (sa[i].kind == CPS_SUS_PROBE) {
            cps__co_log(c, CPS_LOG_INFO,
                        "server %u left our probe unanswered for %u ms: asking it again",
                        sa[i].node, cps__suspect_probe_ms(c->cfg.dead_after_ms));
            send_probe(c, &sa[i]);
            continue;
        }
        cps__coord_node *dn = cps__co_find(c, sa[i].node);
        if (!dn || !dn->info.alive)
            continue;
        uint64_t hb_age = now > dn->last_seen_ms ? now - dn->last_seen_ms : 0;
        cps__co_log(c, CPS_LOG_WARN,
                    "server %u (rank %u) left our probe unanswered for %llu ms after node %u "
                    "reported its requests unanswered (its heartbeats are %llu ms old): its "
                    "inbox is cut off",
                    dn->info.id, dn->info.rank, (unsigned long long)sa[i].silent_ms,
                    sa[i].reported_by, (unsigned long long)hb_age);
        cps__detector_forget(c->detector, dn->info.id);
        cps__co_declare_dead(c, dn->info.id, hb_age, now);
        nd++;
    }
    if (nd) {
        /* Re-form the chains now, not at the next periodic repair. */
        cps__co_repair(c, now);
        c->next_repair_at = now + c->repair_every_ms;
    }
}
