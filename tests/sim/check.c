/* The simulator's in-memory store (read by the replica through cps__replica_env, written by its
 * WRITE items as the server writes LMDB) and the invariants, checked where the state they talk
 * about changes and after every event.
 *
 * "Live replicas" of a range are the servers in its chain in the scheduler's current view.
 * Views remove servers, and add them at the tail after a join (state transfer). A removed
 * server was live at every earlier moment, so each check below, done when the state changes,
 * holds from then on. A joined replica is the exception while it catches up (sim_lag): it may
 * lack updates its predecessor acknowledged until then, and must serve no read meanwhile
 * (invariant 8); once it holds what the others hold, every acknowledged update is checked on it
 * and it is an ordinary replica. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "sim.h"

/* Set key of a declare: declares are re-applied on a retry by design (create-if-absent), so
 * they are tracked apart from pushes and may appear more than once. */
#define DECLARE_ID_BIT 0x40000000u

/* ---- the store ---- */

/* Hash of what an update changes: kind, step, signature, requests and body. */
static uint64_t upd_hash(const cps__chain_update *u)
{
    /* Each part seeded with the hash of those before it: one hash of the update, in order. */
    uint64_t hdr[4] = {u->kind, u->step, u->sig, u->nreqs};
    uint64_t h = XXH3_64bits(hdr, sizeof hdr);
    for (uint32_t i = 0; i < u->nreqs; i++) {
        uint64_t q[3] = {u->reqs[i].worker, (uint64_t)u->reqs[i].type << 8 | u->reqs[i].noagg,
                         u->reqs[i].req_seq};
        h = XXH3_64bits_withSeed(q, sizeof q, h);
    }
    return XXH3_64bits_withSeed(u->body, u->body_len, h);
}

static uint64_t set_hash(uint32_t id, uint64_t req_seq)
{
    uint64_t x = req_seq * 0x9e3779b97f4a7c15ull ^ ((uint64_t)id << 32 | id);
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    return x ^ (x >> 29);
}

static sim_applied_ent *set_find(const sim_rstore *st, uint32_t id, uint64_t req_seq)
{
    if (!st->set_cap)
        return NULL;
    uint32_t mask = st->set_cap - 1;
    for (uint32_t i = (uint32_t)set_hash(id, req_seq) & mask;; i = (i + 1) & mask) {
        sim_applied_ent *e = &st->set[i];
        if (!e->used)
            return NULL;
        if (e->id == id && e->req_seq == req_seq)
            return e;
    }
}

static void set_put(sim_rstore *st, uint32_t id, uint64_t req_seq, uint64_t seq)
{
    if (2 * (st->set_n + 1) > st->set_cap) {
        sim_applied_ent *old = st->set;
        uint32_t old_cap = st->set_cap;
        st->set_cap = old_cap ? old_cap * 2 : 64;
        st->set = calloc(st->set_cap, sizeof *st->set);
        if (!st->set) {
            fprintf(stderr, "sim: out of memory\n");
            exit(2);
        }
        st->set_n = 0;
        for (uint32_t i = 0; i < old_cap; i++)
            if (old[i].used)
                set_put(st, old[i].id, old[i].req_seq, old[i].seq);
        free(old);
    }
    uint32_t mask = st->set_cap - 1;
    uint32_t i = (uint32_t)set_hash(id, req_seq) & mask;
    while (st->set[i].used)
        i = (i + 1) & mask;
    st->set[i] = (sim_applied_ent){id, 1, req_seq, seq};
    st->set_n++;
}

/* Index of a worker's exactly-once record: dense pushes by rank, sparse ones after them. */
static int hw_index(const sim *sm, uint32_t dedup_id)
{
    uint32_t id = dedup_id & ~CPS_DEDUP_SPARSE_BIT;
    if (id <= sm->p.servers || id > sm->p.servers + sm->p.workers)
        return -1;
    int idx = (int)(id - sm->p.servers - 1);
    return (dedup_id & CPS_DEDUP_SPARSE_BIT) ? idx + SIM_MAX_WORKERS : idx;
}

int sim_op_range_seq(void *ctx, uint32_t range, uint64_t *seq)
{
    sim_server *s = ctx;
    *seq = s->rs[range].applied;
    return 0;
}

int sim_op_dedup(void *ctx, uint32_t range, uint32_t worker, uint64_t *seq)
{
    sim_server *s = ctx;
    int idx = hw_index(s->sm, worker);
    *seq = idx < 0 ? 0 : s->rs[range].hw[idx];
    return 0;
}

int sim_op_agg_step(void *ctx, uint32_t range, uint64_t sig, uint64_t *step)
{
    sim_server *s = ctx;
    const sim_rstore *st = &s->rs[range];
    *step = 0;
    for (uint32_t i = 0; i < st->naggs; i++)
        if (st->aggs[i].sig == sig)
            *step = st->aggs[i].step;
    return 0;
}

static void agg_put(sim_rstore *st, uint64_t sig, uint64_t step)
{
    for (uint32_t i = 0; i < st->naggs; i++)
        if (st->aggs[i].sig == sig) {
            st->aggs[i].step = step;
            return;
        }
    if (st->naggs == st->aggs_cap) {
        st->aggs_cap = st->aggs_cap ? st->aggs_cap * 2 : 4;
        st->aggs = realloc(st->aggs, st->aggs_cap * sizeof *st->aggs);
        if (!st->aggs) {
            fprintf(stderr, "sim: out of memory\n");
            exit(2);
        }
    }
    st->aggs[st->naggs++] = (sim_agg){sig, step};
}

/* ---- backup workers ---- */

/* Room for one more element in the array *p of n of *cap elements of `size` bytes. */
static void grow_for_one(void **p, uint64_t *cap, uint64_t n, size_t size)
{
    if (n < *cap)
        return;
    *cap = *cap ? *cap * 2 : 64;
    *p = realloc(*p, *cap * size);
    if (!*p) {
        fprintf(stderr, "sim: out of memory\n");
        exit(2);
    }
}

static int late_find(const sim *sm, uint32_t r, uint32_t worker, uint64_t req_seq)
{
    for (uint64_t i = 0; i < sm->nlates; i++)
        if (sm->lates[i].range == r && sm->lates[i].worker == worker &&
            sm->lates[i].req_seq == req_seq)
            return 1;
    return 0;
}

/* Hash of the requests an aggregate of a step included (its body is their gradients). */
static uint64_t step_set_hash(const cps__chain_update *u)
{
    uint64_t h = XXH3_64bits(&u->step, sizeof u->step);
    for (uint32_t i = 0; i < u->nreqs; i++) {
        uint64_t q[2] = {u->reqs[i].worker, u->reqs[i].req_seq};
        h = XXH3_64bits_withSeed(q, sizeof q, h);
    }
    return XXH3_64bits_withSeed(u->body, u->body_len, h);
}

/* Invariants 12 and 13 at the APPLY of a sync aggregate: no request in it was answered as late,
 * and once a step's aggregate was applied by a tail (committed: acknowledgements follow), every
 * replica that applies that step, before or after a failover, applies the same requests. */
static void check_step_set(sim *sm, sim_server *s, const cps__replica_out *a)
{
    const cps__chain_update *u = &a->upd;
    /* As invariant 3: a removed head taking a write in its old epoch (fenced, and its store
     * replaced when it rejoins) is no replica. */
    if (!sim_is_member(sm, a->range, s->id) && !(s->copying && s->copying[a->range]))
        return;
    for (uint32_t i = 0; i < u->nreqs; i++)
        if (late_find(sm, a->range, u->reqs[i].worker, u->reqs[i].req_seq)) {
            sim_fail(sm, "(13) a late push is never applied",
                     "server %u range %u seq %" PRIu64 ": step %" PRIu64
                     " applies push (worker %u, req %" PRIx64 "), answered as late before",
                     s->id, a->range, a->seq, u->step, u->reqs[i].worker, u->reqs[i].req_seq);
            return;
        }
    uint64_t h = step_set_hash(u);
    for (uint64_t i = 0; i < sm->nstep_sets; i++) {
        sim_step_set *e = &sm->step_sets[i];
        if (e->range != a->range || e->step != u->step)
            continue;
        if (e->hash != h)
            sim_fail(sm, "(12) a step's gradients are fixed",
                     "server %u range %u seq %" PRIu64 ": step %" PRIu64
                     " applied with other requests (%u) than its committed aggregate",
                     s->id, a->range, a->seq, u->step, u->nreqs);
        return;
    }
    /* Committed: applied by the tail, in its view and in the scheduler's. Before that the head
     * may still lose it, and its step is gathered again. */
    const cps__range *rg = &sim_cur_view(sm)->ranges[a->range];
    if (!cps__chain_is_tail(s->chain, a->range) || rg->chain[rg->chain_len - 1] != s->id)
        return;
    grow_for_one((void **)&sm->step_sets, &sm->step_sets_cap, sm->nstep_sets,
                 sizeof *sm->step_sets);
    sm->step_sets[sm->nstep_sets++] = (sim_step_set){a->range, u->step, h};
}

/* A push answered as late: applied on no live replica now (invariant 13), and nowhere later. A
 * removed head may hold it in an aggregate that never left it (a failover in the middle of the
 * step): that one is lost with it, and the new head gathered the step again without the push. */
void sim_check_late(sim *sm, sim_server *s, uint32_t r, uint32_t worker, uint64_t req_seq)
{
    const cps__range *rg = &sim_cur_view(sm)->ranges[r];
    for (uint32_t i = 0; i < rg->chain_len; i++) {
        const sim_server *o = &sm->servers[rg->chain[i] - 1];
        if (o->wiped || rg->chain[i] == sm->lag[r].node)
            continue;
        if (set_find(&o->rs[r], worker, req_seq)) {
            sim_fail(sm, "(13) a late push is never applied",
                     "range %u: push (worker %u, req %" PRIx64 ") answered as late by server %u "
                     "but applied on live replica %u",
                     r, worker, req_seq, s->id, o->id);
            return;
        }
    }
    if (late_find(sm, r, worker, req_seq))
        return;
    grow_for_one((void **)&sm->lates, &sm->lates_cap, sm->nlates, sizeof *sm->lates);
    sm->lates[sm->nlates++] = (sim_late){r, worker, req_seq};
}

/* SSP: the clocks of the range in store st once its updates 1..seq are applied (seq <= applied). */
static const uint64_t *truth_row(const sim *sm, const sim_rstore *st, uint64_t seq)
{
    static const uint64_t zero[SIM_MAX_WORKERS];
    (void)sm;
    return seq ? &st->truth[(seq - 1) * SIM_MAX_WORKERS] : zero;
}

/* SSP: update a was appended to st's log: its clocks are those after the update before it, moved
 * by the dense pushes it holds (what replication/ssp.h promises, stated again). */
static void truth_append(sim *sm, sim_rstore *st, const cps__replica_out *a)
{
    if (st->truth_cap < st->log_cap) {
        st->truth_cap = st->log_cap;
        st->truth = realloc(st->truth, st->truth_cap * SIM_MAX_WORKERS * sizeof *st->truth);
        if (!st->truth) {
            fprintf(stderr, "sim: out of memory\n");
            exit(2);
        }
    }
    uint64_t *row = &st->truth[(a->seq - 1) * SIM_MAX_WORKERS];
    memcpy(row, truth_row(sm, st, a->seq - 1), SIM_MAX_WORKERS * sizeof *row);
    for (uint32_t i = 0; i < a->upd.nreqs; i++) {
        const cps__chain_req *q = &a->upd.reqs[i];
        int k = hw_index(sm, q->worker);
        if ((q->type == CPS_MSG_PUSH || q->type == CPS_MSG_PUSH_PULL) && !q->noagg && k >= 0 &&
            a->upd.step > row[k])
            row[k] = a->upd.step;
    }
}

/* SSP, at every WRITE: the clocks it stores (what the replica's gate holds once the update is
 * applied: replication/ssp.c) are those its updates imply, and the store keeps them, so a
 * replica that came back on its store, or copied the range, has them too (invariant 9). */
static void ssp_apply(sim *sm, sim_server *s, const cps__replica_out *a)
{
    uint32_t r = a->range;
    truth_append(sm, &s->rs[r], a);
    const uint64_t *want = truth_row(sm, &s->rs[r], a->seq);
    for (uint32_t i = 0; i < a->nrecs; i++) {
        const cps__replica_record *rec = &a->recs[i];
        if (!(rec->id & CPS_DEDUP_CLOCK_BIT))
            continue;
        int k = hw_index(sm, rec->id & ~CPS_DEDUP_CLOCK_BIT);
        if (k < 0 || rec->value != want[k]) {
            sim_fail(sm, "(9) SSP clocks are the range's",
                     "server %u range %u after seq %" PRIu64 ": worker %u's clock is %" PRIu64
                     ", its pushes applied there reach step %" PRIu64,
                     s->id, r, a->seq, rec->id & ~CPS_DEDUP_CLOCK_BIT, rec->value,
                     k < 0 ? 0 : want[k]);
            return;
        }
        s->rs[r].clock[k] = rec->value;
    }
}

/* A WRITE item: one store transaction with the update, the range's sequence number and the
 * records the replica laid out, as the server's store transaction does. Checks invariants 2 and 3.
 */
void sim_store_write(sim *sm, sim_server *s, const cps__replica_out *a)
{
    uint32_t r = a->range;
    sim_rstore *st = &s->rs[r];
    const cps__chain_update *u = &a->upd;
    if (a->seq != st->applied + 1) {
        sim_fail(sm, "apply in order",
                 "server %u range %u: APPLY of seq %" PRIu64 " after seq %" PRIu64, s->id, r,
                 a->seq, st->applied);
        return;
    }
    uint64_t h = upd_hash(u);
    sim_trace(sm, "s%u APPLY r%u seq %" PRIu64 " (%u reqs, step %" PRIu64 ", hash %016" PRIx64 ")",
              s->id, r, a->seq, u->nreqs, u->step, h);
    if (st->applied == st->log_cap) {
        st->log_cap = st->log_cap ? st->log_cap * 2 : 64;
        st->log = realloc(st->log, st->log_cap * sizeof *st->log);
        if (!st->log) {
            fprintf(stderr, "sim: out of memory\n");
            exit(2);
        }
    }
    st->log[st->applied++] = h;
    for (uint32_t i = 0; i < u->nreqs; i++) {
        const cps__chain_req *q = &u->reqs[i];
        if (q->type == CPS_MSG_DECLARE) {
            if (!set_find(st, q->worker | DECLARE_ID_BIT, q->req_seq))
                set_put(st, q->worker | DECLARE_ID_BIT, q->req_seq, a->seq);
            continue;
        }
        uint32_t id = q->noagg ? (q->worker | CPS_DEDUP_SPARSE_BIT) : q->worker;
        int idx = hw_index(sm, id);
        if (idx < 0) {
            sim_fail(sm, "apply", "server %u range %u seq %" PRIu64 ": unknown worker %u", s->id, r,
                     a->seq, q->worker);
            return;
        }
        if (u->kind == CPS_UPD_SKIP)
            continue; /* a refusal applies nothing: only its record (below) */
        /* Invariant 2: no request is ever applied twice on any replica. */
        const sim_applied_ent *e = set_find(st, id, q->req_seq);
        if (e) {
            sim_fail(sm, "(2) applied at most once",
                     "server %u range %u: request (worker %u, req %" PRIx64
                     ") applied at seq %" PRIu64 " and again at seq %" PRIu64,
                     s->id, r, q->worker, q->req_seq, e->seq, a->seq);
            return;
        }
        set_put(st, id, q->req_seq, a->seq);
    }
    /* The exactly-once records the replica writes: a worker's number only moves forward (a
     * refusal replicated again for a retry must not move it back: a re-sent later push would be
     * applied twice). */
    for (uint32_t i = 0; i < a->nrecs; i++) {
        const cps__replica_record *rec = &a->recs[i];
        if (rec->id & CPS_DEDUP_CLOCK_BIT)
            continue; /* SSP clocks: ssp_apply */
        int idx = hw_index(sm, rec->id);
        if (idx < 0 || rec->value < st->hw[idx]) {
            sim_fail(sm, "(2) applied at most once",
                     "server %u range %u seq %" PRIu64 ": the record of %x moves back from %" PRIx64
                     " to %" PRIx64,
                     s->id, r, a->seq, rec->id, idx < 0 ? 0 : st->hw[idx], rec->value);
            return;
        }
        st->hw[idx] = rec->value;
    }
    if (u->sig)
        agg_put(st, u->sig, u->step);
    if (u->sig && sm->p.backup)
        check_step_set(sm, s, a);
    if (sm->failed)
        return;
    if (sm->p.mode == SIM_SSP) {
        ssp_apply(sm, s, a);
        if (sm->failed)
            return;
    }
    /* Invariant 3: live replicas, and replicas copying the range to join it, agree at equal
     * sequence numbers. */
    if (!sim_is_member(sm, r, s->id) && !(s->copying && s->copying[r]))
        return;
    const cps__range *rg = &sim_cur_view(sm)->ranges[r];
    for (uint32_t i = 0; i < rg->chain_len; i++) {
        const sim_rstore *o = &sm->servers[rg->chain[i] - 1].rs[r];
        if (sm->servers[rg->chain[i] - 1].wiped)
            continue; /* a member on an empty store, not yet let in again */
        if (rg->chain[i] != s->id && o->applied >= a->seq && o->log[a->seq - 1] != h) {
            sim_fail(sm, "(3) replicas agree",
                     "range %u seq %" PRIu64 ": server %u applied %016" PRIx64
                     ", server %u holds %016" PRIx64,
                     r, a->seq, s->id, h, rg->chain[i], o->log[a->seq - 1]);
            return;
        }
    }
}

uint64_t sim_store_seq_of(const sim_server *s, uint32_t r, const cps__chain_req *q)
{
    uint32_t id = q->type == CPS_MSG_DECLARE ? q->worker | DECLARE_ID_BIT
                  : q->noagg                 ? q->worker | CPS_DEDUP_SPARSE_BIT
                                             : q->worker;
    const sim_applied_ent *e = set_find(&s->rs[r], id, q->req_seq);
    return e ? e->seq : 0;
}

void sim_rstore_clear(sim_rstore *st)
{
    free(st->log);
    free(st->truth);
    free(st->aggs);
    free(st->set);
    memset(st, 0, sizeof *st);
}

static void *dup_mem(const void *p, size_t n)
{
    if (!n)
        return NULL;
    void *q = malloc(n);
    if (!q) {
        fprintf(stderr, "sim: out of memory\n");
        exit(2);
    }
    memcpy(q, p, n);
    return q;
}

/* dst becomes a copy of src (what a snapshot carries: the values, here the log of update hashes
 * that produced them, the exactly-once records, the aggregation steps and the SSP clocks). */
void sim_rstore_copy(sim_rstore *dst, const sim_rstore *src)
{
    sim_rstore_clear(dst);
    dst->applied = src->applied;
    dst->log_cap = src->applied;
    dst->truth_cap = src->truth ? src->applied : 0;
    dst->log = dup_mem(src->log, src->applied * sizeof *src->log);
    dst->truth = src->truth
                     ? dup_mem(src->truth, src->applied * SIM_MAX_WORKERS * sizeof *dst->truth)
                     : NULL;
    memcpy(dst->hw, src->hw, sizeof dst->hw);
    memcpy(dst->clock, src->clock, sizeof dst->clock);
    dst->naggs = dst->aggs_cap = src->naggs;
    dst->aggs = dup_mem(src->aggs, src->naggs * sizeof *src->aggs);
    dst->set_n = src->set_n;
    dst->set_cap = src->set_cap;
    dst->set = dup_mem(src->set, src->set_cap * sizeof *src->set);
}

void sim_store_free(sim *sm, sim_server *s)
{
    for (uint32_t r = 0; s->rs && r < sm->nranges; r++) {
        free(s->rs[r].log);
        free(s->rs[r].truth);
        free(s->rs[r].aggs);
        free(s->rs[r].set);
    }
    free(s->rs);
    for (uint32_t r = 0; s->old_rs && r < sm->nranges; r++)
        sim_rstore_clear(&s->old_rs[r]);
    free(s->old_rs);
}

/* ---- invariants ---- */

/* Invariant 4: a value a worker reads is committed: every live replica holds it. */
void sim_check_read(sim *sm, sim_server *s, uint32_t r, uint64_t seq, uint64_t hash)
{
    if (seq == 0)
        return;
    const cps__range *rg = &sim_cur_view(sm)->ranges[r];
    for (uint32_t i = 0; i < rg->chain_len; i++) {
        const sim_rstore *o = &sm->servers[rg->chain[i] - 1].rs[r];
        if (sm->servers[rg->chain[i] - 1].wiped)
            continue; /* a member on an empty store, not yet let in again */
        if (rg->chain[i] == sm->lag[r].node && rg->chain[i] != s->id && o->applied < seq)
            continue; /* a joined tail still catching up (if it serves, invariant 8 holds it) */
        if (o->applied < seq || o->log[seq - 1] != hash) {
            sim_fail(sm, "(4) reads are committed",
                     "server %u (epoch %" PRIu64 ") served range %u at seq %" PRIu64
                     " which live replica %u %s",
                     s->id, s->epoch, r, seq, rg->chain[i],
                     o->applied < seq ? "has not applied" : "holds differently");
            return;
        }
    }
}

static void check_acked_on_members(sim *sm, const sim_acked *k, const char *when)
{
    const cps__range *rg = &sim_cur_view(sm)->ranges[k->range];
    for (uint32_t i = 0; i < rg->chain_len; i++) {
        if (rg->chain[i] == sm->lag[k->range].node)
            continue; /* a joined tail still catching up: checked when it has */
        const sim_rstore *o = &sm->servers[rg->chain[i] - 1].rs[k->range];
        if (sm->servers[rg->chain[i] - 1].wiped)
            continue; /* a member on an empty store, not yet let in again */
        if (!set_find(o, k->id, k->req_seq)) {
            sim_fail(sm, "(1) acked is on every replica",
                     "%s: request (id %08x, req %" PRIx64 ") on range %u acknowledged to its "
                     "worker but not applied on live replica %u (applied %" PRIu64 ")",
                     when, k->id, k->req_seq, k->range, rg->chain[i], o->applied);
            return;
        }
    }
}

/* Invariant 1: an acknowledged push is applied (once: invariant 2) on every live replica, so
 * on the tail and on all the replicas of its chain. */
void sim_check_acked(sim *sm, sim_worker *w, const sim_req *q)
{
    sim_acked k;
    k.range = q->range;
    k.req_seq = q->seq;
    if (q->type == CPS_MSG_DECLARE)
        k.id = w->id | DECLARE_ID_BIT;
    else
        k.id = q->noagg ? (w->id | CPS_DEDUP_SPARSE_BIT) : w->id;
    if (sm->nacked == sm->acked_cap) {
        sm->acked_cap = sm->acked_cap ? sm->acked_cap * 2 : 256;
        sm->acked = realloc(sm->acked, sm->acked_cap * sizeof *sm->acked);
        if (!sm->acked) {
            fprintf(stderr, "sim: out of memory\n");
            exit(2);
        }
    }
    sm->acked[sm->nacked++] = k;
    check_acked_on_members(sm, &k, "at ack");
}

/* A REPLY action: the request is on every live replica before the worker is told. */
void sim_check_reply(sim *sm, sim_server *s, uint32_t r, const cps__chain_req *q)
{
    sim_acked k = {r, 0, q->req_seq};
    if (q->type == CPS_MSG_DECLARE)
        k.id = q->worker | DECLARE_ID_BIT;
    else
        k.id = q->noagg ? (q->worker | CPS_DEDUP_SPARSE_BIT) : q->worker;
    char when[64];
    snprintf(when, sizeof when, "at reply by server %u", s->id);
    check_acked_on_members(sm, &k, when);
}

/* Invariant 3 at a joiner's install: the snapshot's chunks it took hold one read's values. Its
 * key groups came from the chunks that last wrote them; a group of a read at another sequence
 * number than the snapshot's (the last chunk's, which the joiner replays forwarded updates
 * after) holds updates it will apply twice, or lacks ones it will never get; a group no chunk
 * wrote lacks its values. Only one stream per join keeps them one read's (the replica's snapshot
 * guard, replication/replica_join.c), and the chunks' numbers keep a stream that lost one from
 * being installed (recovery/joiner.c; --snap-gaps). */
static void check_snapshot_groups(sim *sm, const sim_server *s, uint32_t r)
{
    const sim_rstore *st = &s->rs[r];
    for (uint32_t g = 0; g < SIM_SNAP_GROUPS; g++) {
        uint32_t k = s->groups[(size_t)r * SIM_SNAP_GROUPS + g];
        if (k && sm->snaps[k - 1]->st.applied == st->applied)
            continue;
        if (k)
            sim_fail(sm, "(3) replicas agree",
                     "range %u: snapshot installed at server %u at seq %" PRIu64
                     " holds key group %u as read at seq %" PRIu64 " (chunks of two reads)",
                     r, s->id, st->applied, g, sm->snaps[k - 1]->st.applied);
        else
            sim_fail(sm, "(3) replicas agree",
                     "range %u: snapshot installed at server %u at seq %" PRIu64
                     " lacks key group %u (no chunk carried it)",
                     r, s->id, st->applied, g);
        return;
    }
}

/* A snapshot installed at a joiner is one read's, and agrees with every live replica at equal
 * sequence numbers. */
void sim_check_snapshot(sim *sm, sim_server *s, uint32_t r)
{
    check_snapshot_groups(sm, s, r);
    if (sm->failed)
        return;
    const sim_rstore *st = &s->rs[r];
    const cps__range *rg = &sim_cur_view(sm)->ranges[r];
    for (uint32_t i = 0; i < rg->chain_len; i++) {
        const sim_rstore *o = &sm->servers[rg->chain[i] - 1].rs[r];
        if (sm->servers[rg->chain[i] - 1].wiped)
            continue; /* a member on an empty store, not yet let in again */
        uint64_t n = o->applied < st->applied ? o->applied : st->applied;
        for (uint64_t q = 0; q < n; q++)
            if (o->log[q] != st->log[q]) {
                sim_fail(sm, "(3) replicas agree",
                         "range %u seq %" PRIu64 ": snapshot installed at server %u differs from "
                         "live replica %u",
                         r, q + 1, s->id, rg->chain[i]);
                return;
            }
    }
}

/* Invariant 1 at a copy's source: a member of the range that sends its snapshot to a joiner
 * holds every update acknowledged on the range, or the copy lacks it too, and nobody will send it
 * (simulator seed 8085 without the second probe, at 4bc79e8: a joined tail that never caught up
 * with its predecessor was copied from after its probation; the predecessor's death then left the
 * two of them as the range's holders). Checked when the copy is taken, so that the path fails a
 * seed even when no death follows. */
void sim_check_copy_source(sim *sm, const sim_server *s, uint32_t r, uint32_t joiner)
{
    if (s->wiped || !sim_is_member(sm, r, s->id))
        return; /* not a holder: a copy the coordinator will not let join from it */
    for (uint64_t i = 0; i < sm->nacked; i++) {
        const sim_acked *k = &sm->acked[i];
        if (k->range == r && !set_find(&s->rs[r], k->id, k->req_seq)) {
            sim_fail(sm, "(1) acked is on every replica",
                     "server %u, a member of range %u, sends server %u a copy without request "
                     "(id %08x, req %" PRIx64 "), acknowledged to its worker (applied %" PRIu64 ")",
                     s->id, r, joiner, k->id, k->req_seq, s->rs[r].applied);
            return;
        }
    }
}

/* Invariant 8: a tail of the current epoch never serves a read older than an update already
 * acknowledged to a worker (after a join: CHAIN_MARK gating, cps__chain_can_serve_pull). */
void sim_check_fresh_read(sim *sm, sim_server *s, uint32_t r, uint64_t seq)
{
    const cps__range *rg = &sim_cur_view(sm)->ranges[r];
    if (s->epoch != sm->epoch || rg->chain[rg->chain_len - 1] != s->id)
        return; /* a server of an older view: fenced by the workers' epochs, not by this */
    if (seq < sm->acked_seq[r])
        sim_fail(sm, "(8) a new tail serves no stale read",
                 "server %u, tail of range %u in epoch %" PRIu64 ", served seq %" PRIu64
                 " after seq %" PRIu64 " was acknowledged",
                 s->id, r, s->epoch, seq, sm->acked_seq[r]);
}

/* Invariant 10, the staleness bound: a pull of `worker` reading at `clock` is answered only once
 * every other live worker's clock in the range, as the updates the server applied set it, is at
 * least clock - bound (Ho et al.'s SSP condition). */
/* A live worker other than `worker` whose clock in range r, as server s applied the range, is
 * below clock - bound (its clock in *at), or 0 when none is. */
static uint32_t ssp_behind(const sim *sm, const sim_server *s, uint32_t r, uint32_t worker,
                           uint64_t clock, uint64_t *at)
{
    const uint64_t *row = truth_row(sm, &s->rs[r], s->rs[r].applied);
    const cps__view *v = sim_cur_view(sm);
    for (uint32_t k = 0; k < sm->p.workers; k++) {
        uint32_t id = sm->p.servers + 1 + k;
        const cps__node_info *ni = cps__view_node(v, id);
        if (id != worker && ni && ni->alive && row[k] + sm->p.ssp_bound < clock) {
            *at = row[k];
            return id;
        }
    }
    return 0;
}

void sim_check_ssp_read(sim *sm, sim_server *s, uint32_t r, uint32_t worker, uint64_t clock)
{
    uint64_t at = 0;
    uint32_t slow = ssp_behind(sm, s, r, worker, clock, &at);
    if (slow)
        sim_fail(sm, "(10) staleness bound",
                 "server %u answered worker %u's pull of range %u at clock %" PRIu64
                 " (seq %" PRIu64 ") while worker %u is at %" PRIu64 ", bound %u",
                 s->id, worker, r, clock, s->rs[r].applied, slow, at, sm->p.ssp_bound);
}

/* Invariant 11: a pull stays parked only while the bound holds it back (checked after parking
 * and after every wake): a gate that forgot one would leave it to the worker's re-send. */
void sim_check_ssp_parked(sim *sm, sim_server *s)
{
    for (uint32_t i = 0; i < s->nparked && !sm->failed; i++) {
        const sim_cookie *ck = &s->parked[i];
        uint64_t at = 0;
        if (!ssp_behind(sm, s, ck->range, ck->worker, ck->clock, &at))
            sim_fail(sm, "(11) a parked pull waits only for the bound",
                     "server %u keeps worker %u's pull of range %u at clock %" PRIu64
                     " (seq %" PRIu64 ") parked, yet every other worker is within bound %u",
                     s->id, ck->worker, ck->range, ck->clock, s->rs[ck->range].applied,
                     sm->p.ssp_bound);
    }
}

/* A joined tail has caught up once every other replica runs the view that added it and it holds
 * all they hold: from then on it is checked as any replica. */
static void check_lag(sim *sm, uint32_t r)
{
    sim_lag *lg = &sm->lag[r];
    if (!lg->node)
        return;
    if (!sim_is_member(sm, r, lg->node)) {
        lg->node = 0;
        return;
    }
    const cps__range *rg = &sim_cur_view(sm)->ranges[r];
    uint64_t need = 0;
    for (uint32_t i = 0; i < rg->chain_len; i++) {
        const sim_server *o = &sm->servers[rg->chain[i] - 1];
        if (o->id == lg->node)
            continue;
        /* A wiped member's old disk, on the shelf, may come back (sim_old_disk_back): what it
         * holds is not lost, and a joiner that lacks it has not caught up. */
        if (o->wiped && o->old_rs && o->old_rs[r].applied > need)
            need = o->old_rs[r].applied;
        if (o->wiped)
            continue;
        if (o->state != SRV_UP || o->epoch < lg->epoch)
            return;
        if (o->rs[r].applied > need)
            need = o->rs[r].applied;
    }
    if (sm->servers[lg->node - 1].rs[r].applied < need)
        return;
    lg->node = 0;
    for (uint64_t i = 0; i < sm->nacked && !sm->failed; i++)
        if (sm->acked[i].range == r)
            check_acked_on_members(sm, &sm->acked[i], "when a joined replica caught up");
}

/* After every event: cheap structural checks over all ranges and servers. */
void sim_check_event(sim *sm)
{
    const cps__view *v = sim_cur_view(sm);
    for (uint32_t r = 0; r < v->nranges && !sm->failed; r++)
        check_lag(sm, r);
    for (uint32_t r = 0; r < v->nranges; r++) {
        const cps__range *rg = &v->ranges[r];
        /* (6) Chain prefix: a replica holds everything its successor holds. */
        for (uint32_t i = 0; i + 1 < rg->chain_len; i++) {
            if (sm->servers[rg->chain[i] - 1].wiped || sm->servers[rg->chain[i + 1] - 1].wiped)
                continue;
            uint64_t a = sm->servers[rg->chain[i] - 1].rs[r].applied;
            uint64_t b = sm->servers[rg->chain[i + 1] - 1].rs[r].applied;
            if (a < b) {
                sim_fail(sm, "(6) chain prefix",
                         "range %u: server %u applied %" PRIu64 " < its successor %u's %" PRIu64, r,
                         rg->chain[i], a, rg->chain[i + 1], b);
                return;
            }
        }
    }
    for (uint32_t i = 0; i < sm->p.servers; i++) {
        const sim_server *s = &sm->servers[i];
        if (s->state == SRV_CRASHED || s->state == SRV_HELLO || !s->view)
            continue;
        for (uint32_t r = 0; r < s->view->nranges; r++) {
            const cps__range *rg = &s->view->ranges[r];
            int in = 0;
            for (uint32_t k = 0; k < rg->chain_len; k++)
                in |= rg->chain[k] == s->id;
            /* (7) The state machine's idea of the range matches the store's. */
            if (in && cps__chain_applied(s->chain, r) != s->rs[r].applied) {
                sim_fail(sm, "(7) state machine matches store",
                         "server %u range %u: chain says applied %" PRIu64 ", store %" PRIu64,
                         s->id, r, cps__chain_applied(s->chain, r), s->rs[r].applied);
                return;
            }
            if (in && cps__chain_committed(s->chain, r) > s->rs[r].applied) {
                sim_fail(sm, "(7) state machine matches store",
                         "server %u range %u: committed %" PRIu64 " > applied %" PRIu64, s->id, r,
                         cps__chain_committed(s->chain, r), s->rs[r].applied);
                return;
            }
        }
    }
}

/* At the end of a run: live replicas are identical, and every acknowledged request is on
 * each of them. */
void sim_check_final(sim *sm)
{
    const cps__view *v = sim_cur_view(sm);
    for (uint32_t r = 0; r < v->nranges && !sm->failed; r++) {
        const cps__range *rg = &v->ranges[r];
        const sim_rstore *h = &sm->servers[rg->chain[0] - 1].rs[r];
        for (uint32_t i = 1; i < rg->chain_len; i++) {
            const sim_rstore *o = &sm->servers[rg->chain[i] - 1].rs[r];
            if (o->applied != h->applied ||
                (h->applied && memcmp(o->log, h->log, h->applied * sizeof *h->log) != 0)) {
                sim_fail(sm, "(3) replicas agree", "range %u: servers %u and %u differ at the end",
                         r, rg->chain[0], rg->chain[i]);
                return;
            }
        }
    }
    for (uint64_t i = 0; i < sm->nacked && !sm->failed; i++)
        check_acked_on_members(sm, &sm->acked[i], "at the end");
}
