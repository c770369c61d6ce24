/* The scheduler's state machine: its life cycle, what it persists and resumes from, and the
 * dispatch of messages and ticks (see coordinator.h). The top of recovery/coordinator*.c: the
 * parts it dispatches to never call back into it. Membership, deaths, repairs, drains, barriers
 * and the end of the job are in coordinator_membership.c; tools and the tensor registry in
 * coordinator_tools.c; the output and the view it publishes in coordinator_out.c; the state and
 * its read-only views, below them all, in coordinator_state.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "core/log.h"
#include "recovery/coordinator.h"
#include "recovery/coordinator_membership.h"
#include "recovery/coordinator_out.h"
#include "recovery/coordinator_tools.h"

/* ---- life cycle ---- */

int cps__coord_create(const cps__coord_config *cfg, cps__coord **out)
{
    if (!cfg || !cfg->cfg || !out || !cfg->repair_every_ms || !cfg->join_give_up_ms)
        return CPS_EINVAL;
    cps__coord *c = calloc(1, sizeof *c);
    if (!c)
        return CPS_ENOMEM;
    c->cfg = *cfg->cfg;
    c->repair_every_ms = cfg->repair_every_ms;
    c->batch_ms = cfg->batch_ms;
    c->join_give_up_ms = cfg->join_give_up_ms;
    c->save_retry_ms = cfg->save_retry_ms ? cfg->save_retry_ms : 200;
    c->id_limit = cfg->id_limit ? cfg->id_limit : UINT32_MAX;
    c->next_id = 1;
    c->last_detect_ms = cfg->now;
    c->join_deadline = cfg->now + c->cfg.join_timeout_ms + 1;
    cps__view_init(&c->view);
    c->nodes = calloc(CPS_MAX_NODES, sizeof *c->nodes);
    c->former = calloc(CPS_MAX_RANGES, sizeof *c->former);
    c->former_epoch = calloc(CPS_MAX_RANGES, sizeof *c->former_epoch);
    c->rollback_ok = calloc(CPS_MAX_RANGES, 1);
    c->rank_held = calloc(c->cfg.num_workers ? c->cfg.num_workers : 1, 1);
    cps__detector_config dc = {c->cfg.dead_after_ms, 2 * c->cfg.dead_after_ms};
    int rc = c->nodes && c->former && c->former_epoch && c->rollback_ok && c->rank_held
                 ? cps__detector_create(&dc, &c->detector)
                 : CPS_ENOMEM;
    cps__suspect_config sc = {cps__suspect_evidence_ms(c->cfg.dead_after_ms),
                              cps__suspect_probe_ms(c->cfg.dead_after_ms), cfg->single_probe};
    if (rc == 0)
        rc = cps__suspect_create(&sc, &c->suspect);
    if (rc != 0) {
        cps__coord_destroy(c);
        return rc;
    }
    *out = c;
    return 0;
}

void cps__coord_destroy(cps__coord *c)
{
    if (!c)
        return;
    cps__coord_done(c);
    free(c->out.a);
    free(c->out.views);
    cps__detector_destroy(c->detector);
    cps__suspect_destroy(c->suspect);
    cps__repair_destroy(c->repair);
    cps__view_fini(&c->view);
    free(c->nodes);
    free(c->former);
    free(c->former_epoch);
    free(c->rollback_ok);
    free(c->rank_held);
    free(c->blob_buf);
    cps__registry_fini(&c->reg);
    free(c);
}

/* ---- persistence: sched/view (the encoded view) and sched/state ----
 * state: u32 version 1, u32 finished, u32 next_id, u32 workers_done, u32 servers, u32 workers,
 * u32 n, then n u32 ids of workers that said BYE.
 * scale: u32 count, then per server draining or drained: u32 id, u32 1 draining / 2 drained.
 * boots: u32 count, then per server whose life we let in: u32 id, u32 0, u64 boot id. A
 * restarted scheduler tells a server's new life from the one it let in by it
 * (recovery/incarnation.h).
 * former: u32 count, then per range with a fallback (c->former): u32 range, u32 node, u64 the
 * epoch it left in. Absent from stores of earlier builds: none.
 * unconfirmed: u32 count, then per range whose tail has not confirmed it caught up
 * (recovery/repair.h): u32 range, u32 node, u32 its predecessor, u32 0, u64 the join id its
 * confirmation echoes. Absent from stores of earlier builds: see load_unconfirmed. */
int cps__coord_blobs(cps__coord *c, const char *names[CPS_COORD_BLOBS],
                     cps__coord_blob blobs[CPS_COORD_BLOBS])
{
    size_t vlen = cps__view_encoded_size(&c->view);
    size_t need = vlen + 28 + 4 * (size_t)c->nnodes + 4 + 8 * (size_t)c->nnodes + 4 +
                  16 * (size_t)c->nnodes + 4 + 16 * (size_t)c->view.nranges + 4 +
                  24 * (size_t)c->view.nranges;
    if (need > c->blob_cap) {
        unsigned char *b = realloc(c->blob_buf, need);
        if (!b)
            return CPS_ENOMEM;
        c->blob_buf = b;
        c->blob_cap = need;
    }
    unsigned char *v = c->blob_buf, *st = v + vlen;
    cps__view_encode(&c->view, v, vlen);
    uint32_t ndone = 0;
    for (uint32_t i = 0; i < c->nnodes; i++)
        if (c->nodes[i].done)
            cps__le32_put(st + 28 + 4 * ndone++, c->nodes[i].info.id);
    cps__le32_put(st, 1);
    cps__le32_put(st + 4, (uint32_t)c->finished);
    cps__le32_put(st + 8, c->next_id);
    cps__le32_put(st + 12, c->counts.workers_done);
    cps__le32_put(st + 16, c->cfg.num_servers);
    cps__le32_put(st + 20, c->cfg.num_workers);
    cps__le32_put(st + 24, ndone);
    unsigned char *sc = st + 28 + 4 * (size_t)ndone;
    uint32_t nsc = 0;
    for (uint32_t i = 0; i < c->nnodes; i++)
        if (c->nodes[i].draining || c->nodes[i].left) {
            cps__le32_put(sc + 4 + 8 * nsc, c->nodes[i].info.id);
            cps__le32_put(sc + 8 + 8 * nsc, c->nodes[i].left ? 2u : 1u);
            nsc++;
        }
    cps__le32_put(sc, nsc);
    unsigned char *bt = sc + 4 + 8 * (size_t)nsc;
    uint32_t nbt = 0;
    for (uint32_t i = 0; i < c->nnodes; i++)
        if (c->nodes[i].boot_id) {
            cps__le32_put(bt + 4 + 16 * nbt, c->nodes[i].info.id);
            cps__le32_put(bt + 8 + 16 * nbt, 0);
            cps__le64_put(bt + 12 + 16 * nbt, c->nodes[i].boot_id);
            nbt++;
        }
    cps__le32_put(bt, nbt);
    unsigned char *fm = bt + 4 + 16 * (size_t)nbt;
    uint32_t nfm = 0;
    for (uint32_t r = 0; r < c->view.nranges; r++)
        if (c->former[r]) {
            cps__le32_put(fm + 4 + 16 * nfm, r);
            cps__le32_put(fm + 8 + 16 * nfm, c->former[r]);
            cps__le64_put(fm + 12 + 16 * nfm, c->former_epoch[r]);
            nfm++;
        }
    cps__le32_put(fm, nfm);
    unsigned char *uc = fm + 4 + 16 * (size_t)nfm;
    uint32_t nuc = 0;
    for (uint32_t r = 0; c->repair && r < c->view.nranges; r++) {
        uint32_t pred;
        uint64_t id;
        uint32_t node = cps__repair_unconfirmed_of(c->repair, r, &pred, &id);
        if (!node)
            continue;
        cps__le32_put(uc + 4 + 24 * nuc, r);
        cps__le32_put(uc + 8 + 24 * nuc, node);
        cps__le32_put(uc + 12 + 24 * nuc, pred);
        cps__le32_put(uc + 16 + 24 * nuc, 0);
        cps__le64_put(uc + 20 + 24 * nuc, id);
        nuc++;
    }
    cps__le32_put(uc, nuc);
    names[0] = "sched/view", blobs[0] = (cps__coord_blob){v, vlen};
    names[1] = "sched/state", blobs[1] = (cps__coord_blob){st, 28 + 4 * (size_t)ndone};
    names[2] = "sched/scale", blobs[2] = (cps__coord_blob){sc, 4 + 8 * (size_t)nsc};
    names[3] = "sched/boots", blobs[3] = (cps__coord_blob){bt, 4 + 16 * (size_t)nbt};
    names[4] = "sched/former", blobs[4] = (cps__coord_blob){fm, 4 + 16 * (size_t)nfm};
    names[5] = "sched/unconfirmed", blobs[5] = (cps__coord_blob){uc, 4 + 24 * (size_t)nuc};
    return CPS_COORD_BLOBS;
}

static int load_marks(cps__coord *c, cps__coord_get_fn get, void *ctx)
{
    const void *b;
    size_t len;
    if (get(ctx, "sched/scale", &b, &len) == 0) {
        const unsigned char *sc = b;
        if (len < 4 || len != 4 + 8 * (size_t)cps__le32_get(sc))
            return CPS_ECORRUPT;
        for (uint32_t j = 0; j < cps__le32_get(sc); j++) {
            cps__coord_node *n = cps__co_find(c, cps__le32_get(sc + 4 + 8 * j));
            uint32_t what = cps__le32_get(sc + 8 + 8 * j);
            if (n && what == 1)
                n->draining = 1;
            if (n && what == 2)
                n->left = 1;
        }
    }
    if (get(ctx, "sched/boots", &b, &len) == 0) {
        const unsigned char *bt = b;
        if (len < 4 || len != 4 + 16 * (size_t)cps__le32_get(bt))
            return CPS_ECORRUPT;
        for (uint32_t j = 0; j < cps__le32_get(bt); j++) {
            cps__coord_node *n = cps__co_find(c, cps__le32_get(bt + 4 + 16 * j));
            if (n)
                n->boot_id = cps__le64_get(bt + 12 + 16 * j);
        }
    }
    if (get(ctx, "sched/former", &b, &len) == 0) {
        const unsigned char *fm = b;
        if (len < 4 || len != 4 + 16 * (size_t)cps__le32_get(fm))
            return CPS_ECORRUPT;
        for (uint32_t j = 0; j < cps__le32_get(fm); j++) {
            uint32_t r = cps__le32_get(fm + 4 + 16 * j), id = cps__le32_get(fm + 8 + 16 * j);
            if (r >= c->view.nranges || !cps__co_find(c, id))
                return CPS_ECORRUPT;
            c->former[r] = id;
            c->former_epoch[r] = cps__le64_get(fm + 12 + 16 * j);
        }
    }
    return 0;
}

/* The unconfirmed tails of the life before (sched/unconfirmed), into the repair state (the
 * caller made it). Forgotten, such a tail counts as a full replica: it may be copied from, and
 * its predecessor's death leaves the range to it without the acknowledged updates it lacks. A
 * mark naming a server no longer in the range's chain (or its only member) is stale (the
 * repair drops such marks lazily) and skipped. A store of an earlier build has no such blob and
 * cannot tell a tail that joined a moment ago from one that has been there since the job began;
 * taking none for unconfirmed reopens that hole, so every tail of a chain of two or more is taken
 * for one: each gets the probation of a fresh join, no confirmation can match it (its join id is
 * unknown), so each leaves its chain and the range is copied again. An upgrade restart costs one
 * copy per range, once, and never an acknowledged update. */
static int load_unconfirmed(cps__coord *c, cps__coord_get_fn get, void *ctx, uint64_t now)
{
    const void *b;
    size_t len;
    int rc = get(ctx, "sched/unconfirmed", &b, &len);
    if (rc == CPS_ENOTFOUND) {
        uint32_t n = 0;
        for (uint32_t r = 0; r < c->view.nranges; r++) {
            const cps__range *rg = &c->view.ranges[r];
            if (rg->chain_len < 2)
                continue;
            cps__repair_restore_unconfirmed(c->repair, r, rg->chain[rg->chain_len - 1],
                                            rg->chain[rg->chain_len - 2], 0, now);
            n++;
        }
        if (n)
            cps__co_log(c, CPS_LOG_WARN,
                        "the store predates sched/unconfirmed: the tails of %u range(s) are taken "
                        "for joiners that have not confirmed they caught up; they leave their "
                        "chains in %u ms and those ranges are copied again",
                        n, c->join_give_up_ms);
        return 0;
    }
    if (rc != 0)
        return rc;
    const unsigned char *uc = b;
    if (len < 4 || len != 4 + 24 * (size_t)cps__le32_get(uc))
        return CPS_ECORRUPT;
    for (uint32_t j = 0; j < cps__le32_get(uc); j++) {
        const unsigned char *e = uc + 4 + 24 * (size_t)j;
        uint32_t r = cps__le32_get(e), node = cps__le32_get(e + 4), pred = cps__le32_get(e + 8);
        if (r >= c->view.nranges || !cps__co_find(c, node) || (pred && !cps__co_find(c, pred)))
            return CPS_ECORRUPT;
        const cps__range *rg = &c->view.ranges[r];
        int in = 0;
        for (uint32_t k = 0; k < rg->chain_len; k++)
            in |= rg->chain[k] == node;
        if (!in || rg->chain_len < 2)
            continue;
        cps__repair_restore_unconfirmed(c->repair, r, node, pred, cps__le64_get(e + 16), now);
    }
    return 0;
}

static int load(cps__coord *c, cps__coord_get_fn get, void *ctx, uint64_t now)
{
    const void *vb, *sb;
    size_t vlen, slen;
    int rc = get(ctx, "sched/state", &sb, &slen);
    if (rc == CPS_ENOTFOUND)
        return 0;
    if (rc == 0)
        rc = get(ctx, "sched/view", &vb, &vlen);
    if (rc != 0)
        return rc;
    const unsigned char *st = sb;
    if (slen < 28 || cps__le32_get(st) != 1 || slen != 28 + 4 * (size_t)cps__le32_get(st + 24))
        return CPS_ECORRUPT;
    if (cps__le32_get(st + 4))
        return 0; /* that job finished: start a new one */
    const void *cb;
    size_t clen;
    if (get(ctx, "sched/ckpt", &cb, &clen) == 0 &&
        cps__ckpt_note_decode(cb, clen, &c->ckpt, NULL) != 0)
        memset(&c->ckpt, 0, sizeof c->ckpt); /* unreadable: shown as none, not fatal */
    if (cps__le32_get(st + 16) != c->cfg.num_servers ||
        cps__le32_get(st + 20) != c->cfg.num_workers) {
        cps__co_log(c, CPS_LOG_ERROR,
                    "the data directory holds an unfinished job of %u servers and %u workers, "
                    "not %u and %u: use another --data to start a new job",
                    cps__le32_get(st + 16), cps__le32_get(st + 20), c->cfg.num_servers,
                    c->cfg.num_workers);
        return CPS_ECONFIG;
    }
    cps__view v;
    cps__view_init(&v);
    if ((rc = cps__view_decode(vb, vlen, &v)) != 0) {
        cps__view_fini(&v);
        return rc;
    }
    cps__view_fini(&c->view);
    c->view = v;
    c->next_id = cps__le32_get(st + 8);
    c->counts.workers_done = cps__le32_get(st + 12);
    c->nnodes = 0;
    for (uint32_t i = 0; i < v.nnodes && i < CPS_MAX_NODES; i++) {
        cps__coord_node *n = &c->nodes[c->nnodes++];
        memset(n, 0, sizeof *n);
        n->info = v.nodes[i];
        n->last_seen_ms = now;
        for (uint32_t j = 0; j < cps__le32_get(st + 24); j++)
            n->done |= cps__le32_get(st + 28 + 4 * j) == n->info.id;
    }
    rc = load_marks(c, get, ctx);
    return rc ? rc : 1;
}

/* --allow-rollback (cfg.allow_rollback) is the operator's answer to the ERROR in front of them,
 * not a policy for this life's later incidents: it holds for the ranges whose only replica is
 * down with a fallback now, as this life resumes, and for no other (c->rollback_ok). */
static void consent_to_rollback(cps__coord *c)
{
    if (!c->cfg.allow_rollback)
        return;
    char list[160] = "";
    size_t off = 0;
    uint32_t n = 0;
    for (uint32_t r = 0; r < c->view.nranges; r++) {
        const cps__range *rg = &c->view.ranges[r];
        const cps__coord_node *only = rg->chain_len == 1 ? cps__co_find(c, rg->chain[0]) : NULL;
        if (!only || only->info.alive || !c->former[r])
            continue;
        c->rollback_ok[r] = 1;
        if (n++ < 16 && off < sizeof list)
            off += (size_t)snprintf(list + off, sizeof list - off, "%s%u", off ? ", " : "", r);
    }
    if (n)
        cps__co_log(c, CPS_LOG_WARN,
                    "--allow-rollback: %u range(s) (%s%s) go to their fallback if their only "
                    "replica comes back empty; for no other range in this life",
                    n, list, n > 16 ? ", ..." : "");
    else
        cps__co_log(c, CPS_LOG_WARN,
                    "--allow-rollback: no range's only replica is down with a fallback: the flag "
                    "has no effect in this life");
}

int cps__coord_resume(cps__coord *c, cps__coord_get_fn get, void *ctx, uint64_t now)
{
    int rc = cps__co_registry_load(c, get, ctx);
    if (rc == 0)
        rc = load(c, get, ctx, now);
    if (rc <= 0)
        return rc;
    if ((rc = cps__co_begin_running(c, now)) != 0 || (rc = load_unconfirmed(c, get, ctx, now)) != 0)
        return rc;
    for (uint32_t i = 0; i < c->nnodes; i++) {
        const cps__coord_node *n = &c->nodes[i];
        if (cps__co_superseded(c, n))
            continue;
        cps__coord_action *a = cps__co_push(c, CPS_CO_PEER_SET, n->info.id);
        snprintf(a->addr, sizeof a->addr, "%s", n->info.addr);
    }
    consent_to_rollback(c);
    /* Nobody is declared dead for our own absence: everyone gets a fresh grace period. */
    cps__detector_restart(c->detector, now);
    c->last_detect_ms = now;
    cps__co_log(c, CPS_LOG_INFO,
                "resumed the job from view epoch %llu (%u nodes, %u of %u workers finished)",
                (unsigned long long)c->view.epoch, c->nnodes, c->counts.workers_done,
                c->cfg.num_workers);
    /* Everyone learns we are back (and anyone who missed a view gets it now). */
    c->view.epoch++;
    cps__co_save(c);
    int settled = cps__co_workers_settled(c);
    for (uint32_t i = 0; i < c->nnodes; i++)
        if (!c->nodes[i].done)
            cps__co_send_view(c, c->nodes[i].info.id, CPS_MSG_VIEW, settled);
    return 1;
}

/* ---- messages ---- */

/* CKPT_DONE from a checkpoint tool (or our own periodic exports): the job's last checkpoint. */
static void ckpt_done(cps__coord *c, const void *pl, size_t len)
{
    cps__ckpt_note n;
    int rc = cps__ckpt_note_decode(pl, len, &n, NULL);
    if (rc != 0) {
        cps__co_log(c, CPS_LOG_WARN, "malformed CKPT_DONE dropped: %s", cps_strerror(rc));
        return;
    }
    n.id = c->ckpt.id + 1;
    n.age_ms = 0;
    c->ckpt = n;
    cps__co_log(c, CPS_LOG_INFO, "checkpoint %llu at step %llu: %s", (unsigned long long)n.id,
                (unsigned long long)n.step, n.path);
    c->out.persist |= CPS_CO_P_CKPT;
}

static void worker_bye(cps__coord *c, cps__coord_node *n, const cps__msg_hdr *h, const void *pl,
                       size_t len)
{
    if (n->info.role == CPS_ROLE_WORKER && !n->done) {
        n->done = 1;
        cps__detector_forget(c->detector, n->info.id);
        if (len >= CPS_STATS_SIZE)
            cps__stats_decode(pl, &n->stats);
        c->counts.workers_done++;
        cps__co_log(c, CPS_LOG_INFO, "worker %u (rank %u) finished (%u of %u)", n->info.id,
                    n->info.rank, c->counts.workers_done, c->cfg.num_workers);
        cps__co_release_barrier(c);
    }
    cps__co_send_simple(c, n->info.id, CPS_MSG_ACK, h);
    if (c->counts.workers_done < c->cfg.num_workers && n->info.alive) {
        /* The others may be waiting for its gradient in a sync step: a view without it lets
         * the servers complete the step with the workers that are left. */
        n->info.alive = 0;
        cps__co_publish(c, "a worker finished");
    }
    cps__co_end_job(c);
}

/* A message of a member. */
static int member_msg(cps__coord *c, const cps__msg_hdr *h, const void *pl, size_t len,
                      uint64_t now)
{
    cps__coord_node *n = cps__co_find(c, h->sender);
    if (!n) {
        cps__co_log(c, CPS_LOG_WARN, "message type %u from unknown node %u dropped", h->type,
                    h->sender);
        return CPS_ENOTFOUND;
    }
    n->last_seen_ms = now;
    if (n->left) {
        /* Drained, and still talking (our SHUTDOWN is on its way, or was lost). */
        if (h->type == CPS_MSG_HEARTBEAT || h->type == CPS_MSG_GET_VIEW)
            cps__co_send_simple(c, n->info.id, CPS_MSG_SHUTDOWN, NULL);
        return 0;
    }
    cps__detector_heard(c->detector, n->info.id, now);
    if (!n->info.alive && n->info.role == CPS_ROLE_WORKER && !n->done && c->started &&
        h->type == CPS_MSG_HEARTBEAT)
        cps__co_worker_heartbeat(c, n, now);
    if (!n->info.alive && n->info.role == CPS_ROLE_SERVER && c->started &&
        h->type != CPS_MSG_GET_VIEW) {
        /* Declared dead but still talking (paused, partitioned): show it the view (a server's
         * carries no settled word). */
        cps__co_send_view(c, n->info.id, CPS_MSG_VIEW, 0);
        return 0;
    }
    switch (h->type) {
    case CPS_MSG_HEARTBEAT:
        if (len >= CPS_STATS_SIZE)
            cps__stats_decode(pl, &n->stats);
        /* A server whose copy of a VIEW was lost, and that gets no request of a newer epoch,
         * would run the old one for good: its heartbeat names the epoch it runs, and an old one
         * gets the view (the simulator found runs that never finished, e.g. seed 1485 --faults
         * drops). Not a worker's: it names the epoch of its last push, and asks by itself. */
        if (c->started && n->info.role == CPS_ROLE_SERVER && h->epoch < c->view.epoch)
            cps__co_send_view(c, n->info.id, CPS_MSG_VIEW, 0);
        break;
    case CPS_MSG_CAUGHT_UP:
        cps__co_caught_up(c, n, h, now);
        break;
    case CPS_MSG_GET_VIEW:
        if (c->started)
            cps__co_send_view(c, n->info.id, CPS_MSG_VIEW, cps__co_workers_settled(c));
        break;
    case CPS_MSG_BARRIER:
        if (n->info.role == CPS_ROLE_WORKER) {
            n->in_barrier = 1;
            n->barrier_seq = h->req_seq;
            cps__co_release_barrier(c);
        }
        break;
    case CPS_MSG_REGISTER:
        cps__co_register(c, n, h, pl, len);
        break;
    case CPS_MSG_SUSPECT:
        cps__co_suspect(c, n, h, pl, len, now);
        break;
    case CPS_MSG_PROBE:
        if (h->flags & CPS_WF_REPLY)
            cps__suspect_answered(c->suspect, n->info.id, h->req_seq);
        break;
    case CPS_MSG_BYE:
        worker_bye(c, n, h, pl, len);
        break;
    default:
        cps__co_log(c, CPS_LOG_WARN, "unexpected message type %u from node %u", h->type, h->sender);
    }
    return 0;
}

int cps__coord_step(cps__coord *c, const cps__msg_hdr *h, const void *pl, size_t len,
                    uint32_t reply_to, uint64_t now)
{
    switch (h->type) {
    case CPS_MSG_HELLO:
        cps__co_hello(c, h, pl, len, now);
        return 0;
    case CPS_MSG_DRAIN:
        cps__co_drain(c, h, reply_to, now);
        return 0;
    case CPS_MSG_RELEASE:
        cps__co_release(c, h, reply_to);
        return 0;
    case CPS_MSG_STATUS:
        cps__co_status(c, h, reply_to, now);
        return 0;
    case CPS_MSG_REGISTRY:
        cps__co_registry(c, h, reply_to);
        return 0;
    default:
        break;
    }
    if (h->sender == UINT32_MAX && h->type == CPS_MSG_SHUTDOWN) {
        /* `chainps status --end`: end a held job (or any job, on purpose). */
        cps__co_log(c, CPS_LOG_INFO, "asked to end the job");
        cps__co_shutdown(c);
        return 0;
    }
    if (h->sender == UINT32_MAX && h->type == CPS_MSG_CKPT_DONE) {
        ckpt_done(c, pl, len);
        return 0;
    }
    return member_msg(c, h, pl, len, now);
}

void cps__coord_tick(cps__coord *c, uint64_t now, const uint32_t *gone, size_t ngone)
{
    if (!c->started && !c->gave_up && !c->finished && now >= c->join_deadline) {
        cps__co_log(c, CPS_LOG_ERROR,
                    "only %u of %u servers and %u of %u workers arrived within %.1f s; giving up",
                    cps__co_count_role(c, CPS_ROLE_SERVER), c->cfg.num_servers,
                    cps__co_count_role(c, CPS_ROLE_WORKER), c->cfg.num_workers,
                    c->cfg.join_timeout_ms / 1000.0);
        cps__co_shutdown(c);
        /* Workers wait in cps_open() too: tell them now, not after their own timeout. */
        for (uint32_t i = 0; i < c->nnodes; i++)
            if (c->nodes[i].info.role == CPS_ROLE_WORKER)
                cps__co_send_simple(c, c->nodes[i].info.id, CPS_MSG_SHUTDOWN, NULL);
        c->gave_up = CPS_ETIMEDOUT;
        return;
    }
    if (c->unsaved && now >= c->save_retry_at) {
        c->save_retry_at = now + c->save_retry_ms;
        cps__co_save(c);
    }
    cps__co_detect(c, now, gone, ngone);
    if ((c->batch_at && now >= c->batch_at) || now >= c->next_repair_at) {
        if (now >= c->next_repair_at)
            c->next_repair_at = now + c->repair_every_ms;
        cps__co_repair(c, now);
    }
}

void cps__coord_stop(cps__coord *c)
{
    cps__co_shutdown(c);
}
