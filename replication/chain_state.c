/* Chain replication, the range state the protocol files share: the per-call action buffer and
 * scratch, positions in the view, the store-backed caches of sequence numbers, exactly-once
 * records and sync steps, replies and control messages, and the FWD decoder. See chain_int.h.
 * Pure: no I/O, no clock. */
#include <stdlib.h>
#include <string.h>

#include "chain_int.h"
#include "chainps/error.h"
#include "core/array.h"

/* The range state keeps 32-bit capacities: core/array.c's helper with one in between. */
int cps__chain_grow(void **arr, uint32_t *cap, uint32_t need, size_t elem)
{
    size_t c = *cap;
    int rc = cps__array_reserve(arr, &c, need, elem, 8);
    if (rc == 0)
        *cap = c > UINT32_MAX ? UINT32_MAX : (uint32_t)c;
    return rc;
}

void cps__chain_begin_call(cps__chain *c)
{
    for (size_t i = 0; i < c->nscratch; i++)
        free(c->scratch[i]);
    c->nscratch = 0;
    c->nacts = 0;
}

/* Take ownership of b until the next call (freed by begin_call). */
int cps__chain_scratch_keep(cps__chain *c, void *b)
{
    void *p = c->scratch;
    int rc = cps__array_reserve(&p, &c->scratch_cap, c->nscratch + 1, sizeof *c->scratch, 16);
    c->scratch = p;
    if (rc != 0)
        return rc;
    c->scratch[c->nscratch++] = b;
    return 0;
}

void *cps__chain_scratch_alloc(cps__chain *c, size_t len)
{
    void *b = malloc(len ? len : 1);
    if (b && cps__chain_scratch_keep(c, b) != 0) {
        free(b);
        return NULL;
    }
    return b;
}

cps__chain_action *cps__chain_act(cps__chain *c, int kind, uint32_t range)
{
    void *p = c->acts;
    int rc = cps__array_reserve(&p, &c->acts_cap, c->nacts + 1, sizeof *c->acts, 32);
    c->acts = p;
    if (rc != 0)
        return NULL;
    cps__chain_action *a = &c->acts[c->nacts++];
    memset(a, 0, sizeof *a);
    a->kind = kind;
    a->range = range;
    return a;
}

/* Position of this server in range r's chain, or -1. */
int cps__chain_position(const cps__chain *c, uint32_t r)
{
    if (!c->have_view || r >= c->view.nranges)
        return -1;
    const cps__range *rg = &c->view.ranges[r];
    for (uint32_t i = 0; i < rg->chain_len; i++)
        if (rg->chain[i] == c->cfg.self)
            return (int)i;
    return -1;
}

uint32_t cps__chain_chain_len(const cps__chain *c, uint32_t r)
{
    return c->view.ranges[r].chain_len;
}

uint32_t cps__chain_neighbour(const cps__chain *c, uint32_t r, int pos)
{
    return c->view.ranges[r].chain[pos];
}

int cps__chain_load_range(cps__chain *c, uint32_t r)
{
    range_st *rs = &c->ranges[r];
    if (rs->loaded)
        return 0;
    uint64_t seq = 0;
    if (c->ops->range_seq(c->ctx, r, &seq) != 0)
        return CPS_ESTORE;
    rs->applied = seq;
    /* Whatever a server holds when it (re)starts is treated as committed: it has no
     * unacknowledged FWDs in memory, and a restarted server re-enters a chain only through
     * state transfer from the tail. */
    rs->committed = seq;
    rs->loaded = 1;
    return 0;
}

int cps__chain_hold_ahead(cps__chain *c, range_st *rs, uint64_t seq, const void *payload,
                          size_t len, void *owner, int *kept)
{
    if (cps__chain_grow((void **)&rs->ahead, &rs->ahead_cap, rs->nahead + 1, sizeof *rs->ahead) !=
        0)
        return CPS_ENOMEM;
    ahead_entry *e = &rs->ahead[rs->nahead];
    memset(e, 0, sizeof *e);
    e->seq = seq;
    e->len = len;
    if (owner && c->ops->drop_cookie && !*kept) {
        e->payload = payload;
        e->owner = owner;
        *kept = 1;
    } else {
        e->copy = malloc(len ? len : 1);
        if (!e->copy)
            return CPS_ENOMEM;
        memcpy(e->copy, payload, len);
        e->payload = e->copy;
    }
    rs->nahead++;
    return 0;
}

void cps__chain_release_ahead(cps__chain *c, ahead_entry *e)
{
    free(e->copy);
    if (e->owner)
        c->ops->drop_cookie(c->ctx, e->owner);
    memset(e, 0, sizeof *e);
}

void cps__chain_drop_ahead(cps__chain *c, range_st *rs)
{
    for (uint32_t i = 0; i < rs->nahead; i++)
        cps__chain_release_ahead(c, &rs->ahead[i]);
    free(rs->ahead);
    rs->ahead = NULL;
    rs->nahead = rs->ahead_cap = 0;
    rs->up_applied = 0;
}

void cps__chain_ahead_consumed(cps__chain *c, range_st *rs, uint32_t done)
{
    if (done) {
        memmove(rs->ahead, rs->ahead + done, (rs->nahead - done) * sizeof *rs->ahead);
        rs->nahead -= done;
    }
    if (rs->nahead && rs->ahead[0].seq != rs->applied + 1)
        cps__chain_drop_ahead(c, rs); /* out of step: the sender re-sends what we lack */
}

void cps__chain_forget_range(cps__chain *c, range_st *rs)
{
    cps__chain_drop_ahead(c, rs);
    for (uint32_t i = 0; i < rs->nwaits; i++)
        if (c->ops->drop_cookie && rs->waits[i].cookie)
            c->ops->drop_cookie(c->ctx, rs->waits[i].cookie);
    for (uint32_t i = 0; i < rs->nsent; i++)
        free(rs->sent[i].msg);
    free(rs->sent);
    free(rs->waits);
    free(rs->hw);
    free(rs->aggs);
    memset(rs, 0, sizeof *rs);
}

int cps__chain_hw_slot(cps__chain *c, uint32_t r, uint32_t worker, uint64_t **slot)
{
    range_st *rs = &c->ranges[r];
    uint32_t idx = worker & ~CPS_DEDUP_SPARSE_BIT;
    if (idx >= CPS_MAX_NODES)
        return CPS_EINVAL;
    if (worker & CPS_DEDUP_SPARSE_BIT)
        idx += CPS_MAX_NODES;
    if (!rs->hw) {
        rs->hw = malloc(DEDUP_SLOTS * sizeof *rs->hw);
        if (!rs->hw)
            return CPS_ENOMEM;
        memset(rs->hw, 0xff, DEDUP_SLOTS * sizeof *rs->hw);
    }
    if (rs->hw[idx] == UINT64_MAX) {
        uint64_t v = 0;
        if (c->ops->dedup(c->ctx, r, worker, &v) != 0)
            return CPS_ESTORE;
        rs->hw[idx] = v;
    }
    *slot = &rs->hw[idx];
    return 0;
}

int cps__chain_agg_slot(cps__chain *c, uint32_t r, uint64_t sig, uint64_t **step)
{
    range_st *rs = &c->ranges[r];
    for (uint32_t i = 0; i < rs->naggs; i++)
        if (rs->aggs[i].sig == sig) {
            *step = &rs->aggs[i].step;
            return 0;
        }
    uint64_t v = 0;
    if (c->ops->agg_step(c->ctx, r, sig, &v) != 0)
        return CPS_ESTORE;
    if (cps__chain_grow((void **)&rs->aggs, &rs->aggs_cap, rs->naggs + 1, sizeof *rs->aggs) != 0)
        return CPS_ENOMEM;
    rs->aggs[rs->naggs] = (agg_rec){sig, v};
    *step = &rs->aggs[rs->naggs++].step;
    return 0;
}

/* Declares and restores (PUT) are idempotent: no exactly-once record, no sequence space. */
int cps__chain_keeps_no_record(uint8_t type)
{
    return type == CPS_MSG_DECLARE || type == CPS_MSG_PUT;
}

uint32_t cps__chain_dedup_id(const cps__chain_req *q)
{
    return q->noagg ? (q->worker | CPS_DEDUP_SPARSE_BIT) : q->worker;
}

/* Record in memory what an applied update did (the APPLY action writes the same to the store). */
int cps__chain_note_applied(cps__chain *c, uint32_t r, const cps__chain_update *u)
{
    for (uint32_t i = 0; i < u->nreqs; i++) {
        const cps__chain_req *q = &u->reqs[i];
        if (cps__chain_keeps_no_record(q->type))
            continue;
        uint64_t *hw;
        int rc = cps__chain_hw_slot(c, r, cps__chain_dedup_id(q), &hw);
        if (rc != 0)
            return rc;
        if (q->req_seq > *hw || *hw == 0)
            *hw = q->req_seq;
    }
    if (u->sig) {
        uint64_t *st;
        int rc = cps__chain_agg_slot(c, r, u->sig, &st);
        if (rc != 0)
            return rc;
        if (u->step > *st)
            *st = u->step;
    }
    return 0;
}

int cps__chain_emit_reply(cps__chain *c, uint32_t r, uint64_t seq, const cps__chain_update *u,
                          const cps__chain_req *q, void *cookie)
{
    cps__chain_action *a = cps__chain_act(c, CPS_CA_REPLY, r);
    if (!a)
        return CPS_ENOMEM;
    a->seq = seq;
    if (u)
        a->upd = *u;
    a->req = *q;
    a->cookie = cookie;
    return 0;
}

int cps__chain_emit_send(cps__chain *c, uint32_t r, uint32_t to, const void *msg, size_t len)
{
    cps__chain_action *a = cps__chain_act(c, CPS_CA_SEND, r);
    if (!a)
        return CPS_ENOMEM;
    a->to = to;
    a->msg = msg;
    a->len = len;
    return 0;
}

/* A header-only chain message (CHAIN_ACK or CHAIN_MARK) for range r to node `to`. */
int cps__chain_send_control(cps__chain *c, uint32_t r, uint32_t to, uint8_t type, uint64_t seq,
                            uint64_t aux)
{
    cps__msg_hdr h = {0};
    h.type = type;
    h.sender = c->cfg.self;
    h.epoch = c->view.epoch;
    h.range = r;
    h.req_seq = seq;
    h.aux = aux;
    uint8_t *m = cps__chain_scratch_alloc(c, CPS_WIRE_HDR_SIZE);
    if (!m)
        return CPS_ENOMEM;
    cps__wire_hdr_encode(m, &h);
    return cps__chain_emit_send(c, r, to, m, CPS_WIRE_HDR_SIZE);
}

int cps__chain_send_ack(cps__chain *c, uint32_t r, uint32_t to, uint64_t seq)
{
    return cps__chain_send_control(c, r, to, CPS_MSG_CHAIN_ACK, seq, 0);
}

/* Answer the requests that waited for the range to commit up to their seq. */
int cps__chain_wake_waits(cps__chain *c, uint32_t r)
{
    range_st *rs = &c->ranges[r];
    uint32_t kept = 0;
    for (uint32_t i = 0; i < rs->nwaits; i++) {
        wait_reply *w = &rs->waits[i];
        if (w->wait_seq <= rs->committed) {
            int rc = cps__chain_emit_reply(c, r, w->wait_seq, NULL, &w->req, w->cookie);
            if (rc != 0)
                return rc;
        } else {
            rs->waits[kept++] = *w;
        }
    }
    rs->nwaits = kept;
    return 0;
}

/* Parse a FWD payload into an update view (reqs copied to scratch: they may be unaligned). */
int cps__chain_decode_fwd(cps__chain *c, const void *payload, size_t len, cps__chain_update *u)
{
    const uint8_t *p = payload;
    if (len < FWD_FIXED)
        return CPS_EPROTO;
    u->kind = cps__le32_get(p);
    u->nreqs = cps__le32_get(p + 4);
    u->sig = cps__le64_get(p + 8);
    u->step = cps__le64_get(p + 16);
    if (u->kind < CPS_UPD_PUSH || u->kind > CPS_UPD_PUT || u->nreqs > CPS_MAX_NODES ||
        (size_t)u->nreqs * FWD_REQ > len - FWD_FIXED)
        return CPS_EPROTO;
    cps__chain_req *reqs = cps__chain_scratch_alloc(c, (size_t)u->nreqs * sizeof *reqs);
    if (!reqs)
        return CPS_ENOMEM;
    for (uint32_t i = 0; i < u->nreqs; i++) {
        const uint8_t *q = p + FWD_FIXED + (size_t)i * FWD_REQ;
        reqs[i].worker = cps__le32_get(q);
        reqs[i].type = q[4];
        reqs[i].noagg = q[5];
        reqs[i].req_seq = cps__le64_get(q + 8);
        if ((reqs[i].type != CPS_MSG_PUSH && reqs[i].type != CPS_MSG_PUSH_PULL &&
             !cps__chain_keeps_no_record(reqs[i].type)) ||
            reqs[i].noagg > 1 || q[6] || q[7])
            return CPS_EPROTO;
    }
    u->reqs = reqs;
    size_t off = FWD_FIXED + (size_t)u->nreqs * FWD_REQ;
    u->body = p + off;
    u->body_len = len - off;
    return 0;
}

void cps__chain_drop_acked(range_st *rs, uint64_t seq)
{
    uint32_t drop = 0;
    if (rs->nsent && rs->sent[0].seq <= seq)
        rs->backoff = 0; /* progress: the successor is there and keeping up */
    while (drop < rs->nsent && rs->sent[drop].seq <= seq)
        free(rs->sent[drop++].msg);
    if (drop) {
        memmove(rs->sent, rs->sent + drop, (rs->nsent - drop) * sizeof *rs->sent);
        rs->nsent -= drop;
    }
}

/* ---- what the chain.h accessors report ---- */

int cps__chain_is_tail(const cps__chain *c, uint32_t r)
{
    int pos = cps__chain_position(c, r);
    return pos >= 0 && (uint32_t)pos == cps__chain_chain_len(c, r) - 1;
}

int cps__chain_is_head(const cps__chain *c, uint32_t r)
{
    return cps__chain_position(c, r) == 0;
}

int cps__chain_joining(const cps__chain *c, uint32_t r)
{
    return r < c->nranges && c->ranges[r].joining;
}

uint64_t cps__chain_applied(const cps__chain *c, uint32_t r)
{
    return r < c->nranges ? c->ranges[r].applied : 0;
}

uint64_t cps__chain_committed(const cps__chain *c, uint32_t r)
{
    return r < c->nranges ? c->ranges[r].committed : 0;
}

uint32_t cps__chain_unacked(const cps__chain *c, uint32_t r)
{
    return r < c->nranges ? c->ranges[r].nsent : 0;
}

uint64_t cps__chain_fwd_bytes(const cps__chain *c)
{
    return c->fwd_bytes;
}
