/* The server's data-path protocol as one state machine (replica.h).
 *
 * A worker's declare or push arrives at the head of its range. It is checked (epoch, role, keys
 * against the store), then the chain (chain.c) decides whether it is new, a retry of something
 * applied, or out of order. New async pushes are submitted at once; sync pushes wait until every
 * live worker's gradient for the step is here and are summed in rank order (sync.c), then
 * submitted as one update. The chain's actions become the ready list: APPLY a WRITE with the
 * records this file lays out, SEND a message (CHAIN_ACKs held a moment by ackhold.c), REPLY an
 * answer. Pulls are served by the tail; in SSP mode they wait for the slowest worker (ssp.c). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "core/log.h"
#include "replication/replica_int.h"

/* ---- requests ---- */

static uint32_t worker_rank(const cps__replica *r, uint32_t id)
{
    const cps__node_info *n = cps__view_node(&r->view, id);
    return (n && n->role == CPS_ROLE_WORKER) ? n->rank : UINT32_MAX;
}

/* Is the request for our view, a range that exists, and us as its head (updates) or tail
 * (pulls)? Answers and returns non-zero when not. */
static int check_request(cps__replica *r, const cps__msg_hdr *h)
{
    if (worker_rank(r, h->sender) == UINT32_MAX) {
        /* Unknown node: we cannot even reply. A newer view may name it; ask for one. */
        cps__rp_say(r, CPS_LOG_WARN, "request type %u from unknown node %u dropped", h->type,
                    h->sender);
        cps__rp_ask_view(r);
        r->ctr.msgs_bad++;
        return CPS_EUNKNOWN_NODE;
    }
    if (h->epoch < r->view.epoch) {
        cps__rp_reply_error(r, h, CPS_ESTALE_EPOCH, "request epoch %llu < view epoch %llu",
                            (unsigned long long)h->epoch, (unsigned long long)r->view.epoch);
        return CPS_ESTALE_EPOCH;
    }
    if (h->epoch > r->view.epoch) {
        /* The worker saw a newer view than we did: catch up, the worker will re-send. */
        cps__rp_ask_view(r);
        cps__rp_reply_error(r, h, CPS_EAGAIN, "server has not seen epoch %llu yet",
                            (unsigned long long)h->epoch);
        return CPS_EAGAIN;
    }
    if (h->range >= r->view.nranges) {
        cps__rp_reply_error(r, h, CPS_EINVAL, "range %u does not exist (%u ranges)", h->range,
                            r->view.nranges);
        return CPS_EINVAL;
    }
    const cps__range *rg = &r->view.ranges[h->range];
    uint32_t want = h->type == CPS_MSG_PULL ? rg->chain[rg->chain_len - 1] : rg->chain[0];
    if (rg->chain_len == 0 || want != r->cfg.self) {
        cps__rp_reply_error(r, h, CPS_ESTALE_EPOCH, "this server is not the %s of range %u",
                            h->type == CPS_MSG_PULL ? "tail" : "head", h->range);
        return CPS_ESTALE_EPOCH;
    }
    return 0;
}

static int keys_in_range(const cps__replica *r, uint32_t range, const cps__kv *kv)
{
    const cps__range *rg = &r->view.ranges[range];
    /* Keys are sorted (the decoder checked), so the ends suffice. */
    return kv->keys[0] >= rg->lo && kv->keys[kv->nkeys - 1] <= rg->hi;
}

/* Check kv against the store; on a refusal, say why in why[n] and return the error. `spec`: a
 * declare's definition, NULL for a push. */
static int bad_keys(cps__replica *r, const cps__kv *kv, const cps__param_spec *spec, char *why,
                    size_t n)
{
    uint64_t bad = 0;
    uint32_t have = 0;
    int rc = r->env.check_keys(r->env.ctx, kv, spec, &bad, &have);
    if (rc == CPS_ENOTFOUND)
        snprintf(why, n, "key %016llx was never declared", (unsigned long long)bad);
    else if (rc == CPS_ESIZE)
        snprintf(why, n, "key %016llx holds %u values, not %u", (unsigned long long)bad, have,
                 kv->lens[0]);
    else if (rc == CPS_EEXIST)
        snprintf(why, n, "key %016llx exists with %u values", (unsigned long long)bad, have);
    else if (rc != 0)
        snprintf(why, n, "store read failed");
    return rc;
}

/* Refuse at once: for requests that hold no number of the worker's push sequence (declares,
 * sync pushes), so nothing must be replicated first. */
static int refuse_bad_keys(cps__replica *r, const cps__msg_hdr *h, const cps__kv *kv,
                           const cps__param_spec *spec)
{
    char why[96];
    int rc = bad_keys(r, kv, spec, why, sizeof why);
    if (rc != 0)
        cps__rp_reply_error(r, h, rc, "%s", why);
    return rc;
}

/* Hand the request to the chain; returns 1 if it took p (a retry: answered by a REPLY action,
 * now or once committed). `refused`: 0, or the error the head refuses this push with. */
static int admit(cps__replica *r, rmsg *p, uint64_t sig, int refused, int *verdict, uint64_t now)
{
    const cps__msg_hdr *h = &p->m.hdr;
    cps__chain_req q = {h->sender, h->type, (h->flags & CPS_WF_NOAGG) ? 1 : 0, h->req_seq};
    p->refused = refused;
    int v = cps__chain_admit(r->chain, h->range, &q, h->step, sig, p);
    if (v == CPS_ADMIT_NEW && cps__rp_values_wait(r, h->range)) {
        /* A push-pull's values wait until the range's commit point reaches our store
         * (cps__rp_answer_values): a new update would move the store on again. */
        cps__rp_reply_error(r, h, CPS_EAGAIN, "range %u: a read waits for the commit point",
                            h->range);
        *verdict = CPS_ADMIT_BUSY;
        return 0;
    }
    *verdict = v;
    if (v == CPS_ADMIT_DUP) {
        cps__rp_run_chain(r, now); /* may answer (and release) p now */
        return 1;
    }
    if (v == CPS_ADMIT_NOT_HEAD)
        cps__rp_reply_error(r, h, CPS_ESTALE_EPOCH, "not the head of range %u", h->range);
    else if (v == CPS_ADMIT_BUSY)
        cps__rp_reply_error(r, h, CPS_EAGAIN, "range %u has too many updates in flight", h->range);
    else if (v == CPS_ADMIT_GAP)
        cps__rp_say(r, CPS_LOG_DEBUG, "push %llu from node %u out of order: dropped",
                    (unsigned long long)h->req_seq, h->sender);
    else if (v < 0)
        cps__rp_reply_error(r, h, v, "exactly-once record unreadable");
    return 0;
}

static void on_declare(cps__replica *r, rmsg *p, uint64_t now)
{
    cps__kv kv;
    const uint64_t *offsets;
    cps__param_spec spec;
    int verdict = -1;
    const cps__msg_hdr *h = &p->m.hdr;
    int rc = cps__wire_declare_decode(p->m.payload, p->m.len, &kv, &offsets, &spec);
    if (rc != 0) {
        cps__rp_reply_error(r, h, rc, "malformed DECLARE payload");
    } else if (!keys_in_range(r, h->range, &kv)) {
        cps__rp_reply_error(r, h, CPS_EINVAL, "keys outside range %u", h->range);
    } else if (refuse_bad_keys(r, h, &kv, &spec) == 0) {
        if (admit(r, p, 0, 0, &verdict, now))
            return; /* taken */
        if (verdict == CPS_ADMIT_NEW) {
            cps__chain_req q = {h->sender, CPS_MSG_DECLARE, 0, h->req_seq};
            cps__chain_update u = {CPS_UPD_DECLARE, 0, 0, 1, &q, p->m.payload, p->m.len};
            cps__rp_submit(r, h->range, &u, now);
        }
    }
    cps__rp_rmsg_done(r, p);
}

/* ---- sync aggregation (sync.c decides; this sums and submits) ---- */

/* The sum runs in rank order, so every run computes the same bits; replicas apply the sum the
 * head sends them. The lowest rank's message is ours: the others are added into its values in
 * place, so the aggregate costs no copy, and its payload is the update's body as it stands. */
static void sync_submit(cps__replica *r, const cps__sync_action *a, uint64_t now)
{
    rmsg *p0 = NULL;
    cps__chain_req *reqs = calloc(a->count, sizeof *reqs);
    uint32_t nreq = 0;
    for (uint32_t k = 0; reqs && k < a->nranks; k++) {
        rmsg *p = a->by_rank[k].cookie;
        if (!p)
            continue;
        if (!p0)
            p0 = p;
        else
            r->env.add(r->env.ctx, (float *)(uintptr_t)p0->kv.vals, p->kv.vals, p->kv.nvals);
        reqs[nreq++] =
            (cps__chain_req){a->by_rank[k].worker, a->by_rank[k].type, 0, a->by_rank[k].req_seq};
    }
    if (!reqs) {
        cps__rp_say(r, CPS_LOG_ERROR, "no memory to aggregate step %llu of range %u",
                    (unsigned long long)a->step, a->range);
    } else {
        cps__chain_update u = {CPS_UPD_PUSH, a->step, a->sig, nreq, reqs, p0->m.payload, p0->m.len};
        cps__rp_submit(r, a->range, &u, now);
        cps__rp_say(r, CPS_LOG_DEBUG, "range %u step %llu: aggregate of %u workers submitted",
                    a->range, (unsigned long long)a->step, nreq);
    }
    free(reqs);
    for (uint32_t k = 0; k < a->nranks; k++)
        cps__rp_rmsg_done(r, a->by_rank[k].cookie);
}

/* A step that cannot complete is said out loud: the live workers it waits for have not pushed
 * this key set for this step. Either they are slow or stopped (they will be dropped once
 * declared dead), or they push other keys (ps-lite-style jobs), which sync mode never
 * completes. */
static void sync_report_stuck(cps__replica *r, const cps__sync_action *a, uint64_t now)
{
    char waiting[256], have[256];
    size_t wo = 0, ho = 0;
    waiting[0] = have[0] = 0;
    for (uint32_t k = 0; k < r->view.nnodes; k++) {
        const cps__node_info *n = &r->view.nodes[k];
        if (n->role != CPS_ROLE_WORKER || !n->alive || n->rank >= a->nranks)
            continue;
        int got = a->by_rank[n->rank].cookie != NULL;
        char *b = got ? have : waiting;
        size_t *o = got ? &ho : &wo;
        if (*o < sizeof waiting - 12)
            *o += (size_t)snprintf(b + *o, sizeof waiting - *o, "%s%u", *o ? ", " : "", n->rank);
    }
    cps__rp_say(
        r, CPS_LOG_WARN,
        "range %u: sync step %llu has waited %.0f s for worker rank(s) %s (rank(s) %s pushed): "
        "they are slow or stopped, or push other keys; a sync step needs every live worker to "
        "push the same keys (workers that push different keys need --mode async)",
        a->range, (unsigned long long)a->step, (now > a->since_ms ? now - a->since_ms : 0) / 1000.0,
        waiting[0] ? waiting : "none", have[0] ? have : "none");
}

static void run_sync(cps__replica *r, uint64_t now, uint64_t stuck_now)
{
    const cps__sync_action *acts;
    size_t n = cps__sync_actions(r->sync, &acts);
    for (size_t i = 0; i < n; i++) {
        if (acts[i].kind == CPS_SA_SUBMIT)
            sync_submit(r, &acts[i], now);
        else if (acts[i].kind == CPS_SA_STUCK)
            sync_report_stuck(r, &acts[i], stuck_now);
    }
}

/* Backup workers: is this push of a step that closed without it? Returns cps__sync_check's
 * verdict or CPS_ENOMEM. The record is what every replica stores with each aggregate (the key
 * set's last step, each included worker's last request), read from our store, so a head that
 * took over after a failover knows the steps the old one closed and who made them. A late push
 * is marked (CPS_WF_LATE and the closed step in aux, on our copy of the request only): the chain
 * takes it as the duplicate of a closed step it is, and its cps__rp_reply, once that step is
 * committed, says it was dropped (reply_retry). */
static int sync_mark_late(cps__replica *r, rmsg *p, uint64_t sig)
{
    cps__msg_hdr *h = &p->m.hdr;
    if (!r->sync && cps__sync_create(cps__rp_drop_cookie, r, &r->sync) != 0)
        return CPS_ENOMEM;
    uint64_t closed = 0;
    cps__sync_member m = {h->sender, 0};
    cps__rp_agg_step_now(r, h->range, sig, &closed);
    r->env.dedup(r->env.ctx, h->range, h->sender, &m.req_seq);
    int rc = cps__sync_record(r->sync, h->range, sig, closed, 1, &m);
    if (rc != 0)
        return rc;
    rc = cps__sync_check(r->sync, h->range, sig, h->step, h->sender, h->req_seq, &closed);
    if (rc == CPS_SYNC_LATE || rc == CPS_SYNC_STALE) {
        h->flags |= CPS_WF_LATE;
        h->aux = closed;
    }
    return rc;
}

static void push_sync(cps__replica *r, rmsg *p, uint64_t now)
{
    cps__msg_hdr *h = &p->m.hdr;
    const cps__kv *kv = &p->kv;
    uint32_t rank = worker_rank(r, h->sender);
    if (rank >= r->view.num_workers) {
        cps__rp_reply_error(r, h, CPS_EUNKNOWN_NODE, "worker rank %u out of range", rank);
        cps__rp_rmsg_done(r, p);
        return;
    }
    uint64_t sig = cps__rp_keyset_sig(kv);
    int verdict;
    int late = r->view.backup_workers > 0 ? sync_mark_late(r, p, sig) : CPS_SYNC_OPEN;
    if (late < 0 || late == CPS_SYNC_STALE) {
        /* STALE: an old copy of a push the worker has finished (a later one of its pushes is in
         * an aggregate): answered at once, without a claim and uncounted; only a worker that
         * gave it up still waits for an answer. */
        if (late < 0)
            cps__rp_reply_error(r, h, late, "no memory for the step record");
        else
            cps__rp_reply(r, h, h->step, NULL, h->aux, CPS_WF_LATE);
        cps__rp_rmsg_done(r, p);
        return;
    }
    if (admit(r, p, sig, 0, &verdict, now))
        return; /* a retry of an applied step, or a late push: answered by the chain */
    if (verdict != CPS_ADMIT_NEW) {
        cps__rp_rmsg_done(r, p);
        return;
    }
    int v = CPS_ENOMEM;
    if (r->sync || cps__sync_create(cps__rp_drop_cookie, r, &r->sync) == 0) {
        cps__sync_contrib c = {h->sender, h->type, h->req_seq,
                               kv->nvals, p,       (h->flags & CPS_WF_FIRST) != 0};
        v = cps__sync_push(r->sync, &r->view, h->range, sig, h->step, rank, &c, now);
    }
    if (v == CPS_SYNC_TAKEN) {
        run_sync(r, now, 0);
        return;
    }
    const cps__kv *pkv = h->type == CPS_MSG_PUSH_PULL ? kv : NULL;
    if (v == CPS_SYNC_LATE || v == CPS_SYNC_APPLIED || v == CPS_SYNC_STALE) {
        /* Closed in our record though the chain admitted it: answer as the chain would. */
        uint64_t closed = 0;
        cps__sync_check(r->sync, h->range, sig, h->step, h->sender, h->req_seq, &closed);
        h->aux = closed;
        if (pkv && v != CPS_SYNC_STALE) {
            /* Values, read from committed updates only: as a retry's (reply_retry). */
            h->flags =
                (uint16_t)(v == CPS_SYNC_LATE ? h->flags | CPS_WF_LATE : h->flags & ~CPS_WF_LATE);
            cps__rp_answer_values(r, p);
            return;
        }
        if (v == CPS_SYNC_LATE)
            cps__rp_reply_late(r, h, pkv);
        else if (v == CPS_SYNC_STALE)
            cps__rp_reply(r, h, h->step, NULL, closed, CPS_WF_LATE);
        else
            cps__rp_reply(r, h, h->step, pkv, 0, 0);
    } else if (v == CPS_SYNC_SIZE) {
        cps__rp_reply_error(r, h, CPS_ESIZE,
                            "gradient length differs between workers for step %llu",
                            (unsigned long long)h->step);
    } else if (v < 0) {
        cps__rp_reply_error(r, h, v, "no memory for an aggregation slot");
    }
    /* CPS_SYNC_RETRY: a retry while the step is still being gathered; the reply comes when it
     * completes. */
    cps__rp_rmsg_done(r, p);
}

static void on_push(cps__replica *r, rmsg *p, uint64_t now)
{
    cps__msg_hdr *h = &p->m.hdr;
    r->ctr.pushes++;
    r->ctr.pulls += h->type == CPS_MSG_PUSH_PULL;
    int rc = cps__wire_kv_decode(p->m.payload, p->m.len, 1, &p->kv);
    if (rc != 0) {
        cps__rp_reply_error(r, h, rc, "malformed push payload");
        cps__rp_rmsg_done(r, p);
        return;
    }
    if (!keys_in_range(r, h->range, &p->kv)) {
        cps__rp_reply_error(r, h, CPS_EINVAL, "keys outside range %u", h->range);
        cps__rp_rmsg_done(r, p);
        return;
    }
    int sync = r->view.mode == CPS_MODE_SYNC && !(h->flags & CPS_WF_NOAGG);
    if (sync && refuse_bad_keys(r, h, &p->kv, NULL) != 0) {
        cps__rp_rmsg_done(r, p);
        return;
    }
    r->ctr.push_raw_bytes += h->raw_len;
    r->ctr.push_wire_bytes += h->payload_len;
    if (sync) {
        push_sync(r, p, now);
        return;
    }
    /* A push refused here (unknown key, wrong length) still uses up its number of the worker's
     * sequence: the worker's later pushes follow it. The used-up number is replicated as a SKIP
     * update and the refusal answered only once that is committed (at the tail, as any
     * cps__rp_reply): answered before, a head failing right after would leave a new head that takes
     * the worker's next push for a gap for ever (simulator seeds 6 and 55 with --refusals). A retry
     * is a duplicate then, answered with the refusal once committed. */
    char why[96];
    int refused = bad_keys(r, &p->kv, NULL, why, sizeof why);
    int verdict;
    if (admit(r, p, 0, refused, &verdict, now))
        return;
    if (verdict == CPS_ADMIT_NEW) {
        cps__chain_req q = {h->sender, h->type, (h->flags & CPS_WF_NOAGG) ? 1 : 0, h->req_seq};
        if (refused) {
            cps__rp_say(
                r, CPS_LOG_WARN,
                "push %llu of node %u on range %u refused: %s: %s (answered once replicated)",
                (unsigned long long)h->req_seq, h->sender, h->range, cps_err_name(refused), why);
            uint64_t *status = cps__rp_scratch(r, sizeof *status); /* the body: 8-byte aligned */
            if (status) {
                cps__le64_put(status, (uint64_t)(int64_t)refused);
                cps__chain_update u = {CPS_UPD_SKIP, h->step, 0, 1, &q, status, sizeof *status};
                cps__rp_submit(r, h->range, &u, now);
            }
        } else {
            cps__chain_update u = {CPS_UPD_PUSH, h->step, 0, 1, &q, p->m.payload, p->m.len};
            cps__rp_submit(r, h->range, &u, now);
        }
    }
    cps__rp_rmsg_done(r, p);
}

static void on_pull(cps__replica *r, rmsg *p)
{
    const cps__msg_hdr *h = &p->m.hdr;
    r->ctr.pulls++;
    int rc = cps__wire_kv_decode(p->m.payload, p->m.len, 0, &p->kv);
    if (rc != 0) {
        cps__rp_reply_error(r, h, rc, "malformed pull payload");
    } else if (!keys_in_range(r, h->range, &p->kv)) {
        cps__rp_reply_error(r, h, CPS_EINVAL, "keys outside range %u", h->range);
    } else if (!cps__chain_can_serve_pull(r->chain, h->range)) {
        /* A new tail that has not yet applied everything its predecessor acknowledged. */
        cps__rp_reply_error(r, h, CPS_EAGAIN, "range %u: new tail catching up", h->range);
    } else if (!cps__rp_pull_may_proceed(r, h->range, h->aux, h->sender)) {
        if (cps__rp_park_pull(r, p, h->aux) == 0)
            return; /* kept */
        cps__rp_reply_error(r, h, CPS_ENOMEM, "no memory to park a pull");
    } else {
        cps__rp_reply(r, h, h->step, &p->kv, 0, 0);
    }
    cps__rp_rmsg_done(r, p);
}

static void on_chain(cps__replica *r, rmsg *p, uint64_t now)
{
    const cps__msg_hdr *h = &p->m.hdr;
    int kept = 0;
    int rc = cps__chain_on_message_owned(r->chain, h, p->m.payload, p->m.len, p, &kept, now);
    if (rc == CPS_EAGAIN) {
        cps__rp_ask_view(r);
    } else if (rc == CPS_ESTALE_EPOCH) {
        cps__rp_say(r, CPS_LOG_DEBUG, "chain message from node %u (epoch %llu) fenced", h->sender,
                    (unsigned long long)h->epoch);
    } else if (rc != 0) {
        r->ctr.msgs_bad++;
        cps__rp_say(r, CPS_LOG_ERROR, "bad chain message from node %u dropped: %s", h->sender,
                    cps_strerror(rc));
    }
    cps__rp_run_chain(r, now);
    /* WRITE bodies point into it: released at the next call. A FWD held ahead of its sender's
     * write is the chain's until it gives it back (cps__rp_drop_cookie). */
    if (!kept)
        cps__rp_rmsg_done(r, p);
}

static int is_chain_msg(uint8_t type)
{
    return type == CPS_MSG_FWD || type == CPS_MSG_CHAIN_ACK || type == CPS_MSG_CHAIN_MARK;
}

/* A message tagged with a newer epoch than ours: hold it and ask for the view. 1 if held. */
static int hold_future(cps__replica *r, rmsg *p)
{
    if (!r->have_view || p->m.hdr.epoch <= r->view.epoch)
        return 0;
    if (r->future.n >= r->cfg.max_held) {
        cps__rp_rmsg_done(r, r->future.v[0]); /* the oldest goes: its sender re-sends it */
        memmove(r->future.v, r->future.v + 1, (r->future.n - 1) * sizeof *r->future.v);
        r->future.n--;
    }
    if (cps__rp_rlist_push(&r->future, p) != 0)
        return 0;
    cps__rp_ask_view(r);
    return 1;
}

static void dispatch(cps__replica *r, rmsg *p, uint64_t now)
{
    if (!r->chain) {
        cps__rp_rmsg_done(r, p); /* no view yet: nothing to serve with */
        return;
    }
    uint8_t type = p->m.hdr.type;
    if (is_chain_msg(type)) {
        on_chain(r, p, now);
        return;
    }
    if (check_request(r, &p->m.hdr) != 0) {
        cps__rp_rmsg_done(r, p);
        return;
    }
    if (type == CPS_MSG_DECLARE)
        on_declare(r, p, now);
    else if (type == CPS_MSG_PULL)
        on_pull(r, p);
    else
        on_push(r, p, now);
}

static rmsg *take(cps__replica *r, cps__replica_msg *m)
{
    rmsg *p = calloc(1, sizeof *p);
    if (!p) {
        r->env.release(r->env.ctx, m->owner);
        cps__rp_say(r, CPS_LOG_ERROR, "no memory: message from node %u dropped", m->hdr.sender);
        return NULL;
    }
    p->m = *m;
    return p;
}

/* ---- the interface ---- */

static int make_chain(cps__replica *r)
{
    cps__chain_config cc = {r->cfg.self, r->cfg.resend_ms, r->cfg.max_unacked};
    return r->chain ? 0 : cps__chain_create(&cc, &cps__rp_chain_ops, r, &r->chain);
}

int cps__replica_create(const cps__replica_config *cfg, const cps__replica_env *env,
                        cps__replica **out)
{
    if (!cfg || !env || !out || !env->range_seq || !env->dedup || !env->agg_step ||
        !env->check_keys || !env->scan_dedup || !env->add || !env->release || !env->msg_alloc)
        return CPS_EINVAL;
    cps__replica *r = calloc(1, sizeof *r);
    if (!r)
        return CPS_ENOMEM;
    r->cfg = *cfg;
    if (!r->cfg.resend_ms)
        r->cfg.resend_ms = 200;
    if (!r->cfg.max_unacked)
        r->cfg.max_unacked = 1024;
    if (!r->cfg.max_held)
        r->cfg.max_held = 1024;
    r->env = *env;
    cps__view_init(&r->view);
    /* Our id known: the chain exists before the first view (it answers questions, empty). */
    if (cps__fence_create(r->cfg.dead_after_ms, r->cfg.start_ms, &r->fence) != 0 ||
        (r->cfg.self && make_chain(r) != 0)) {
        cps__fence_destroy(r->fence);
        free(r);
        return CPS_ENOMEM;
    }
    *out = r;
    return 0;
}

static void free_list(cps__replica *r, rlist *l)
{
    for (uint32_t i = 0; i < l->n; i++)
        cps__rp_rmsg_free(r, l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

void cps__replica_destroy(cps__replica *r)
{
    if (!r)
        return;
    cps__rp_begin(r);
    r->destroying = 1;
    cps__chain_destroy(r->chain);
    cps__sync_destroy(r->sync);
    cps__ssp_destroy(r->ssp);
    /* Held acks and MARKs are dropped: the chain state they came from is gone. */
    cps__ackhold_destroy(r->acks);
    free(r->marks);
    cps__joiner_destroy(r->joiner);
    cps__rp_rmsg_free(r, r->join_snap);
    free(r->snaps);
    free_list(r, &r->early);
    free_list(r, &r->future);
    free_list(r, &r->queue);
    free_list(r, &r->values);
    free_list(r, &r->dispose);
    free(r->scratch);
    free(r->out);
    cps__view_fini(&r->view);
    cps__fence_destroy(r->fence);
    free(r);
}

static int chain_has(const cps__range *rg, uint32_t id)
{
    for (uint32_t j = 0; j < rg->chain_len; j++)
        if (rg->chain[j] == id)
            return 1;
    return 0;
}

/* Created at the first view, with the SSP gate of its ranges, whose clocks start where the
 * store has them (a restarted server holds the pushes it applied). */

static int first_view(cps__replica *r)
{
    int rc = r->ssp ? 0 : cps__ssp_create(cps__rp_drop_cookie, r, &r->ssp);
    for (uint32_t k = 0; rc == 0 && k < r->view.nranges; k++)
        rc = cps__rp_ssp_load(r, k);
    return rc ? rc : make_chain(r);
}

static int install_view(cps__replica *r, const cps__view *v, uint32_t self, int fresh,
                        uint64_t now);

/* The fence judges (replica_fence.c); let in, the ranges the view does not give us are stale
 * here, staying in, those it took from us moved: either way dropped (DROP_RANGE). */
int cps__replica_view(cps__replica *r, const cps__view *v, uint32_t self, uint64_t now)
{
    cps__rp_begin(r);
    now = cps__rp_clock(r, now);
    int fresh = 0;
    int verdict = cps__rp_fence_install(r, v, self, &fresh);
    if (verdict != CPS_RV_INSTALLED)
        return verdict;
    int rc = install_view(r, v, self, fresh, now);
    return rc ? rc : CPS_RV_INSTALLED;
}

int cps__replica_set_view(cps__replica *r, const cps__view *v, uint32_t self, int fresh,
                          uint64_t now)
{
    cps__rp_begin(r);
    now = cps__rp_clock(r, now);
    cps__fence_view(r->fence, v->epoch, 1, 1);
    cps__fence_install(r->fence, v->epoch, 1, 1);
    return install_view(r, v, self, fresh, now);
}

static int install_view(cps__replica *r, const cps__view *v, uint32_t self, int fresh, uint64_t now)
{
    if (!r->chain)
        r->cfg.self = self;
    /* Held acks and MARKs go out under the view they were made in, as if sent at once. */
    cps__rp_flush_acks(r, now, 1);
    cps__rp_flush_marks(r);
    cps__view nv;
    cps__view_init(&nv);
    int rc = cps__view_copy(&nv, v);
    if (rc != 0)
        return rc;
    /* Ranges we leave while staying in the job (a move: rebalancing, a drain), or, let in
     * (started, or rejoining after a fence), ranges whose chain does not name us: what our store
     * holds of those is stale (repaired elsewhere meanwhile), and joining later copies it afresh
     * anyway: dropped now, so the bytes a server holds are the ranges it serves. */
    int moved = !fresh && r->have_view && r->view.nranges == nv.nranges;
    uint8_t *left = calloc(nv.nranges ? nv.nranges : 1, 1);
    if (!left) {
        cps__view_fini(&nv);
        return CPS_ENOMEM;
    }
    for (uint32_t k = 0; (moved || fresh) && k < nv.nranges; k++)
        left[k] = !((moved && !chain_has(&r->view.ranges[k], r->cfg.self)) ||
                    chain_has(&nv.ranges[k], r->cfg.self));
    int first = !r->have_view;
    cps__view_fini(&r->view);
    r->view = nv;
    r->have_view = 1;
    rc = first ? first_view(r) : 0;
    if (rc == 0)
        rc = cps__chain_set_view(r->chain, &r->view, now);
    if (rc != 0)
        cps__rp_say(r, CPS_LOG_ERROR, "chain view change failed: %s", cps_strerror(rc));
    if (r->chain)
        cps__rp_run_chain(r, now);
    if (r->sync && cps__sync_set_view(r->sync, &r->view) == 0)
        run_sync(r, now, 0);
    if (cps__ssp_parked(r->ssp))
        cps__rp_wake_parked(r);
    for (uint32_t k = 0; k < r->view.nranges; k++) {
        if (!left[k])
            continue;
        cps__sync_forget_range(r->sync, k);
        if (r->ssp)
            cps__ssp_forget_range(r->ssp, k);
        cps__replica_out *o = cps__rp_emit(r, CPS_RO_DROP_RANGE, k);
        if (o)
            o->moved = moved;
    }
    free(left);
    /* Requests that came before our first view, then messages our view now covers. */
    for (uint32_t i = 0; i < r->early.n; i++)
        if (cps__rp_rlist_push(&r->queue, r->early.v[i]) != 0)
            cps__rp_rmsg_done(r, r->early.v[i]);
    r->early.n = 0;
    uint32_t kept = 0;
    for (uint32_t i = 0; i < r->future.n; i++) {
        rmsg *p = r->future.v[i];
        if (p->m.hdr.epoch > r->view.epoch)
            r->future.v[kept++] = p;
        else if (cps__rp_rlist_push(&r->queue, p) != 0)
            cps__rp_rmsg_done(r, p);
    }
    r->future.n = kept;
    /* The joiner learns of it last: a join may end now that the chain has the view. */
    if (rc == 0)
        cps__rp_joiner_view(r, now); /* a failure is logged: joins wait for the next view */
    return rc;
}

static void defer(cps__replica *r, rmsg *p);

int cps__replica_step(cps__replica *r, cps__replica_msg *m, uint64_t now)
{
    cps__rp_begin(r);
    now = cps__rp_clock(r, now);
    rmsg *p = take(r, m);
    if (!p)
        return 0;
    int standing = cps__rp_standing(r, &p->m.hdr, 0, now);
    if (standing == CPS_FENCE_EARLY) {
        defer(r, p); /* a worker heard its WELCOME before we heard ours */
        return 0;
    }
    if (standing != CPS_FENCE_SERVE) {
        cps__rp_rmsg_done(r, p);
        return 0;
    }
    uint8_t type = p->m.hdr.type;
    if (type == CPS_MSG_JOIN_RANGE || type == CPS_MSG_SNAP_REQ || type == CPS_MSG_SNAP) {
        /* Never held for a view: the joiner judges an order's epoch itself, and a tail asks
         * for the view a SNAP_REQ names (the joiner asks again). */
        cps__rp_on_transfer(r, p, now);
        return 0;
    }
    if (hold_future(r, p))
        return 0;
    dispatch(r, p, now);
    return 0;
}

void cps__replica_defer(cps__replica *r, cps__replica_msg *m)
{
    cps__rp_begin(r);
    rmsg *p = take(r, m);
    if (p)
        defer(r, p);
}

static void defer(cps__replica *r, rmsg *p)
{
    if (r->early.n >= MAX_EARLY || cps__rp_rlist_push(&r->early, p) != 0) {
        cps__rp_say(r, CPS_LOG_WARN, "request before the job started dropped");
        cps__rp_rmsg_done(r, p);
    }
}

int cps__replica_next(cps__replica *r, uint64_t now)
{
    cps__rp_begin(r);
    now = cps__rp_clock(r, now);
    if (r->queue.n == 0)
        return 0;
    rmsg *p = r->queue.v[0];
    memmove(r->queue.v, r->queue.v + 1, (r->queue.n - 1) * sizeof *r->queue.v);
    r->queue.n--;
    /* A message released for one view may meet a newer one: held again if need be. */
    if (!hold_future(r, p))
        dispatch(r, p, now);
    return 1;
}

int cps__replica_tick(cps__replica *r, uint64_t now, int force_acks)
{
    cps__rp_begin(r);
    now = cps__rp_clock(r, now);
    cps__rp_flush_acks(r, now, force_acks);
    cps__rp_flush_marks(r); /* the loop turn ended */
    if (r->chain && cps__chain_tick(r->chain, now) == 0) {
        r->in_tick = 1; /* a tick only re-sends */
        cps__rp_run_chain(r, now);
        r->in_tick = 0;
    }
    if (cps__sync_pending(r->sync) && cps__sync_tick(r->sync, now) == 0)
        run_sync(r, now, now);
    return 0;
}

int cps__replica_wait_ms(const cps__replica *r, uint64_t now, int max_ms)
{
    if (r->marks_held)
        return 0;
    return cps__ackhold_wait_ms(r->acks, now > r->now_max ? now : r->now_max, max_ms);
}

int cps__replica_put(cps__replica *r, uint32_t range, uint64_t req_seq, const void *entries,
                     size_t len, uint64_t now)
{
    cps__rp_begin(r);
    now = cps__rp_clock(r, now);
    if (!r->chain)
        return CPS_ADMIT_NOT_HEAD;
    cps__chain_req q = {UINT32_MAX, CPS_MSG_PUT, 0, req_seq};
    int v = cps__chain_admit(r->chain, range, &q, 0, 0, NULL);
    if (v != CPS_ADMIT_NEW)
        return v;
    cps__chain_update u = {CPS_UPD_PUT, 0, 0, 1, &q, entries, len};
    int rc = cps__chain_submit(r->chain, range, &u, now);
    if (rc != 0)
        return rc;
    cps__rp_run_chain(r, now);
    return CPS_ADMIT_NEW;
}

int cps__replica_put_verdict(const cps__replica *r, uint32_t range)
{
    if (!r->chain || !cps__chain_is_head(r->chain, range))
        return CPS_ADMIT_NOT_HEAD;
    return cps__chain_unacked(r->chain, range) >= r->cfg.max_unacked ? CPS_ADMIT_BUSY
                                                                     : CPS_ADMIT_NEW;
}

size_t cps__replica_ready(const cps__replica *r, const cps__replica_out **out)
{
    *out = r->out;
    return r->nout;
}

const cps__chain *cps__replica_chain(const cps__replica *r)
{
    return r->chain;
}

const cps__replica_counters *cps__replica_counts(const cps__replica *r)
{
    return &r->ctr;
}

uint32_t cps__replica_held(const cps__replica *r)
{
    return r->early.n + r->future.n + r->queue.n;
}
