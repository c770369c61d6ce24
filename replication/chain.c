/* Chain replication state machine: see chain.h for the protocol. Pure: no I/O, no clock.
 *
 * FWD payload (little-endian, 8-byte aligned throughout):
 *    0 u32 kind   4 u32 nreqs   8 u64 sig   16 u64 step
 *   24 nreqs x { u32 worker, u8 type, u8 noagg, u16 zero, u64 req_seq }
 *   then the update body (kv payload or DECLARE payload), to the end. */
#include "chain_int.h"

#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "core/array.h"

/* Build a FWD message for update u with sequence seq into a new malloc'd buffer. */
static uint8_t *encode_fwd(cps__chain *c, uint32_t r, uint64_t seq, const cps__chain_update *u,
                           cps__msg_hdr *h, size_t *len_out)
{
    size_t plen = FWD_FIXED + (size_t)u->nreqs * FWD_REQ + u->body_len;
    if (plen > CPS_WIRE_MAX_PAYLOAD)
        return NULL;
    uint8_t *m = malloc(CPS_WIRE_HDR_SIZE + plen);
    if (!m)
        return NULL;
    memset(h, 0, sizeof *h);
    h->type = CPS_MSG_FWD;
    h->sender = c->cfg.self;
    h->epoch = c->view.epoch;
    h->range = r;
    h->req_seq = seq;
    h->step = u->step;
    h->payload_len = (uint32_t)plen;
    h->raw_len = (uint32_t)plen;
    cps__wire_hdr_encode(m, h);
    uint8_t *p = m + CPS_WIRE_HDR_SIZE;
    cps__le32_put(p, u->kind);
    cps__le32_put(p + 4, u->nreqs);
    cps__le64_put(p + 8, u->sig);
    cps__le64_put(p + 16, u->step);
    for (uint32_t i = 0; i < u->nreqs; i++) {
        uint8_t *q = p + FWD_FIXED + (size_t)i * FWD_REQ;
        cps__le32_put(q, u->reqs[i].worker);
        q[4] = u->reqs[i].type;
        q[5] = u->reqs[i].noagg;
        q[6] = q[7] = 0;
        cps__le64_put(q + 8, u->reqs[i].req_seq);
    }
    if (u->body_len)
        memcpy(p + FWD_FIXED + (size_t)u->nreqs * FWD_REQ, u->body, u->body_len);
    *len_out = CPS_WIRE_HDR_SIZE + plen;
    return m;
}

/* Send a held FWD (re-stamped with the current epoch and our id) to the successor. Its aux says
 * how far we applied: all of it when we send it again, one less when it goes ahead of its own
 * APPLY (forward before apply). One to a shadow goes after our APPLY; it is marked
 * CPS_WF_SHADOW and names its join in aux instead, so that a refusal (CPS_CHAIN_ACK_NOT_JOINING)
 * is of that join and a node that got it outside any join can tell it from a chain FWD. */
static int send_held(cps__chain *c, uint32_t r, sent_entry *e, uint32_t to, uint64_t now, int ahead)
{
    const range_st *rs = &c->ranges[r];
    e->hdr.epoch = c->view.epoch;
    e->hdr.sender = c->cfg.self;
    if (rs->shadow && to == rs->shadow) {
        e->hdr.flags |= CPS_WF_SHADOW;
        e->hdr.aux = rs->shadow_join;
    } else {
        e->hdr.flags &= ~CPS_WF_SHADOW;
        e->hdr.aux = ahead ? e->seq - 1 : e->seq;
    }
    cps__wire_hdr_encode(e->msg, &e->hdr);
    e->sent_ms = now;
    c->fwd_bytes += e->len;
    return cps__chain_emit_send(c, r, to, e->msg, e->len);
}

/* Keep update u (seq) for re-sending and send it to node `to`. */
static int forward_to(cps__chain *c, uint32_t r, uint64_t seq, const cps__chain_update *u,
                      uint32_t to, uint64_t now, int ahead)
{
    range_st *rs = &c->ranges[r];
    if (cps__chain_grow((void **)&rs->sent, &rs->sent_cap, rs->nsent + 1, sizeof *rs->sent) != 0)
        return CPS_ENOMEM;
    sent_entry *e = &rs->sent[rs->nsent];
    e->seq = seq;
    e->msg = encode_fwd(c, r, seq, u, &e->hdr, &e->len);
    if (!e->msg)
        return CPS_ENOMEM;
    rs->nsent++;
    e->first_ms = now;
    return send_held(c, r, e, to, now, ahead);
}

static int apply_action(cps__chain *c, uint32_t r, uint64_t seq, const cps__chain_update *u)
{
    cps__chain_action *a = cps__chain_act(c, CPS_CA_APPLY, r);
    if (!a)
        return CPS_ENOMEM;
    a->seq = seq;
    a->upd = *u;
    return 0;
}

/* A replica that is not the tail: keep update u (seq) for re-sending, send it to the successor,
 * then apply it (chain.h, "forward before apply"): the successor receives it while we write.
 * The APPLY is there even when the forward failed: the update is ours (rs->applied counts it)
 * and the caller must write it. */
static int forward_then_apply(cps__chain *c, uint32_t r, uint64_t seq, const cps__chain_update *u,
                              int pos, uint64_t now)
{
    int rc = forward_to(c, r, seq, u, cps__chain_neighbour(c, r, pos + 1), now, 1);
    int arc = apply_action(c, r, seq, u);
    return rc ? rc : arc;
}

/* After the APPLYs of this call: tell the successor how far we applied, so it applies what we
 * forwarded ahead of them. */
static int send_applied(cps__chain *c, uint32_t r, int pos)
{
    return cps__chain_send_control(c, r, cps__chain_neighbour(c, r, pos + 1), CPS_MSG_CHAIN_MARK,
                                   c->ranges[r].applied, CPS_CHAIN_MARK_APPLIED);
}

/* This replica is the tail for seq: everything up to it is committed. Reply and ack upstream. */
static int commit_at_tail(cps__chain *c, uint32_t r, uint64_t seq, const cps__chain_update *u,
                          int pos)
{
    range_st *rs = &c->ranges[r];
    rs->committed = seq;
    for (uint32_t i = 0; u && i < u->nreqs; i++) {
        int rc = cps__chain_emit_reply(c, r, seq, u, &u->reqs[i], NULL);
        if (rc != 0)
            return rc;
    }
    int rc = cps__chain_wake_waits(c, r);
    if (rc == 0 && pos > 0)
        rc = cps__chain_send_ack(c, r, cps__chain_neighbour(c, r, pos - 1), seq);
    /* A replica copying the range gets the update too (committed here regardless). */
    if (rc == 0 && rs->shadow && u)
        rc = forward_to(c, r, seq, u, rs->shadow, c->now, 0);
    return rc;
}

/* ---- public ---- */

int cps__chain_create(const cps__chain_config *cfg, const cps__chain_store_ops *ops, void *ctx,
                      cps__chain **out)
{
    if (!cfg || !ops || !ops->range_seq || !ops->dedup || !ops->agg_step || !out)
        return CPS_EINVAL;
    cps__chain *c = calloc(1, sizeof *c);
    if (!c)
        return CPS_ENOMEM;
    c->cfg = *cfg;
    if (!c->cfg.resend_ms)
        c->cfg.resend_ms = 200;
    if (!c->cfg.max_unacked)
        c->cfg.max_unacked = 1024;
    c->ops = ops;
    c->ctx = ctx;
    cps__view_init(&c->view);
    *out = c;
    return 0;
}

void cps__chain_destroy(cps__chain *c)
{
    if (!c)
        return;
    cps__chain_begin_call(c);
    for (uint32_t r = 0; r < c->nranges; r++)
        cps__chain_forget_range(c, &c->ranges[r]);
    free(c->ranges);
    free(c->acts);
    free(c->scratch);
    cps__view_fini(&c->view);
    free(c);
}

size_t cps__chain_actions(cps__chain *c, const cps__chain_action **out)
{
    *out = c->acts;
    return c->nacts;
}

/* The tail of range r went away and this replica is the new tail: what it holds is on every
 * live replica, so it is committed; answer the workers of every held update. */
static int become_tail(cps__chain *c, uint32_t r, int pos)
{
    range_st *rs = &c->ranges[r];
    for (uint32_t i = 0; i < rs->nsent; i++) {
        cps__chain_update u;
        sent_entry *e = &rs->sent[i];
        if (cps__chain_decode_fwd(c, e->msg + CPS_WIRE_HDR_SIZE, e->len - CPS_WIRE_HDR_SIZE, &u) !=
            0)
            continue;
        for (uint32_t j = 0; j < u.nreqs; j++) {
            int rc = cps__chain_emit_reply(c, r, e->seq, &u, &u.reqs[j], NULL);
            if (rc != 0)
                return rc;
        }
    }
    /* The replies point into the held messages: free them with the next call's scratch. */
    for (uint32_t i = 0; i < rs->nsent; i++) {
        if (cps__chain_scratch_keep(c, rs->sent[i].msg) != 0) {
            /* Keep the rest held rather than leak or free what replies point into. */
            memmove(rs->sent, rs->sent + i, (rs->nsent - i) * sizeof *rs->sent);
            rs->nsent -= i;
            return CPS_ENOMEM;
        }
    }
    rs->nsent = 0;
    rs->committed = rs->applied;
    int rc = cps__chain_wake_waits(c, r);
    if (rc == 0 && pos > 0)
        rc = cps__chain_send_ack(c, r, cps__chain_neighbour(c, r, pos - 1), rs->committed);
    return rc;
}

int cps__chain_set_view(cps__chain *c, const cps__view *v, uint64_t now)
{
    cps__chain_begin_call(c);
    c->now = now;
    if (c->have_view && v->nranges != c->nranges)
        return CPS_EINVAL;
    if (c->have_view && v->epoch <= c->view.epoch)
        return 0;
    if (!c->ranges) {
        c->ranges = calloc(v->nranges ? v->nranges : 1, sizeof *c->ranges);
        if (!c->ranges)
            return CPS_ENOMEM;
        c->nranges = v->nranges;
    }
    /* Old positions, to see what changed. */
    int *old_pos = malloc((v->nranges ? v->nranges : 1) * sizeof *old_pos);
    uint32_t *old_succ = malloc((v->nranges ? v->nranges : 1) * sizeof *old_succ);
    if (!old_pos || !old_succ) {
        free(old_pos);
        free(old_succ);
        return CPS_ENOMEM;
    }
    for (uint32_t r = 0; r < v->nranges; r++) {
        old_pos[r] = c->have_view ? cps__chain_position(c, r) : -1;
        old_succ[r] = (old_pos[r] >= 0 && (uint32_t)old_pos[r] + 1 < cps__chain_chain_len(c, r))
                          ? cps__chain_neighbour(c, r, old_pos[r] + 1)
                          : 0;
    }
    int rc = cps__view_copy(&c->view, v);
    c->have_view = rc == 0;
    for (uint32_t r = 0; rc == 0 && r < v->nranges; r++) {
        range_st *rs = &c->ranges[r];
        int pos = cps__chain_position(c, r);
        if (pos < 0) {
            if (old_pos[r] >= 0)
                cps__chain_forget_range(c, rs);
            continue;
        }
        if (rs->joining) {
            /* We copied the range and are now its tail: the predecessor's MARK tells us when
             * we hold everything it acknowledged, and only then do we serve reads. */
            rs->joining = 0;
            cps__chain_drop_ahead(c, rs);
            rs->gated = 1;
            rs->mark_known = 0;
        }
        if (rs->gated && pos == 0) {
            /* We joined and lost our predecessor before its MARK arrived: no one is left to
             * send one, and what we hold is all the chain holds (simulator seed 262). */
            rs->gated = 0;
        }
        if ((rc = cps__chain_load_range(c, r)) != 0)
            break;
        /* A joiner made tail keeps the epoch its join began in: its source is its predecessor. */
        uint32_t pred = pos > 0 ? cps__chain_neighbour(c, r, pos - 1) : 0;
        if (pred != rs->pred) {
            /* FWDs held ahead of another predecessor: the new one's re-sends (which say it
             * applied them) replace them. With the same predecessor they stay: it sends nothing
             * again until its re-send timer, and its next MARK applies them. */
            cps__chain_drop_ahead(c, rs);
            rs->pred = pred;
            rs->pred_epoch = v->epoch;
        }
        int tail = (uint32_t)pos == cps__chain_chain_len(c, r) - 1;
        uint32_t succ = tail ? 0 : cps__chain_neighbour(c, r, pos + 1);
        if (rs->shadow && succ != rs->shadow &&
            (!cps__view_node(v, rs->shadow) || !cps__view_node(v, rs->shadow)->alive)) {
            /* It is gone. What we held for it is moot; kept, it would never be acknowledged,
             * and at a head it would count against max_unacked for ever (simulator seed 123). */
            rs->shadow = 0;
            if (tail)
                cps__chain_drop_acked(rs, UINT64_MAX);
        }
        if (rs->shadow && succ == rs->shadow)
            rs->shadow = 0; /* it joined as our successor: what it lacks is re-sent below */
        if (tail && old_pos[r] >= 0 && old_succ[r] != 0) {
            rc = become_tail(c, r, pos);
        } else if (!tail && succ != old_succ[r]) {
            /* Hand the new successor a MARK: not only when we were the tail. A joined tail
             * whose predecessor (the ex-tail) is removed before its MARK arrived would wait
             * for it for ever (simulator seed 426); the MARK of its new predecessor, which
             * holds all the ex-tail acknowledged, opens the gate as safely. And a MARK of 0
             * (an empty range) is sent too, or such a tail would never serve. */
            if (old_pos[r] >= 0)
                rs->mark_pending = 1;
            rs->backoff = 0; /* a new successor: its clock starts now */
            rs->succ_since = now;
            for (uint32_t i = 0; rc == 0 && i < rs->nsent; i++)
                rc = send_held(c, r, &rs->sent[i], succ, now, 0);
            if (rc == 0)
                rc = cps__chain_mark_send(c, r, succ, now);
        }
    }
    free(old_pos);
    free(old_succ);
    return rc;
}

uint64_t cps__chain_waiting_since(const cps__chain *c, uint32_t node)
{
    uint64_t oldest = 0;
    for (uint32_t r = 0; c->have_view && r < c->nranges; r++) {
        const range_st *rs = &c->ranges[r];
        int pos = cps__chain_position(c, r);
        if (pos < 0 || rs->nsent == 0 || (uint32_t)pos + 1 >= cps__chain_chain_len(c, r) ||
            cps__chain_neighbour(c, r, pos + 1) != node)
            continue;
        uint64_t since = rs->sent[0].first_ms;
        if (rs->progress_ms > since)
            since = rs->progress_ms;
        if (rs->succ_since > since)
            since = rs->succ_since;
        if (since == 0)
            since = 1; /* something waits: 0 would say nothing does */
        if (!oldest || since < oldest)
            oldest = since;
    }
    return oldest;
}

int cps__chain_admit(cps__chain *c, uint32_t r, const cps__chain_req *q, uint64_t step,
                     uint64_t sig, void *cookie)
{
    cps__chain_begin_call(c);
    if (cps__chain_position(c, r) != 0)
        return CPS_ADMIT_NOT_HEAD;
    int rc = cps__chain_load_range(c, r);
    if (rc != 0)
        return rc;
    range_st *rs = &c->ranges[r];
    if (cps__chain_keeps_no_record(q->type))
        return rs->nsent >= c->cfg.max_unacked ? CPS_ADMIT_BUSY : CPS_ADMIT_NEW;
    int dup;
    if (sig) {
        uint64_t *st;
        if ((rc = cps__chain_agg_slot(c, r, sig, &st)) != 0)
            return rc;
        dup = step <= *st;
    } else {
        uint64_t *hw;
        if ((rc = cps__chain_hw_slot(c, r, cps__chain_dedup_id(q), &hw)) != 0)
            return rc;
        uint64_t last = *hw;
        if (q->noagg && last == 0)
            last = CPS_SEQ_SPARSE;
        dup = q->req_seq <= last;
        if (!dup && q->req_seq != last + 1)
            return CPS_ADMIT_GAP;
    }
    if (!dup)
        return rs->nsent >= c->cfg.max_unacked ? CPS_ADMIT_BUSY : CPS_ADMIT_NEW;
    if (rs->committed >= rs->applied) {
        rc = cps__chain_emit_reply(c, r, rs->applied, NULL, q, cookie);
    } else {
        rc =
            cps__chain_grow((void **)&rs->waits, &rs->waits_cap, rs->nwaits + 1, sizeof *rs->waits);
        if (rc == 0)
            rs->waits[rs->nwaits++] = (wait_reply){*q, rs->applied, cookie};
    }
    return rc == 0 ? CPS_ADMIT_DUP : rc;
}

int cps__chain_submit(cps__chain *c, uint32_t r, const cps__chain_update *u, uint64_t now)
{
    cps__chain_begin_call(c);
    c->now = now;
    int pos = cps__chain_position(c, r);
    if (pos != 0)
        return CPS_EINVAL;
    int rc = cps__chain_load_range(c, r);
    if (rc != 0)
        return rc;
    range_st *rs = &c->ranges[r];
    uint64_t seq = rs->applied + 1;
    if ((rc = cps__chain_note_applied(c, r, u)) != 0)
        return rc;
    rs->applied = seq;
    if (cps__chain_chain_len(c, r) == 1) {
        if ((rc = apply_action(c, r, seq, u)) != 0)
            return rc;
        return commit_at_tail(c, r, seq, u, pos);
    }
    rc = forward_then_apply(c, r, seq, u, pos, now);
    return rc ? rc : send_applied(c, r, pos);
}

/* Apply FWD update u (seq, the next one) here: at the tail, commit it; elsewhere, forward it
 * first (forward before apply). */
static int apply_fwd(cps__chain *c, uint32_t r, uint64_t seq, const cps__chain_update *u, int pos,
                     uint64_t now)
{
    range_st *rs = &c->ranges[r];
    int rc = cps__chain_note_applied(c, r, u);
    if (rc != 0)
        return rc;
    rs->applied = seq;
    if ((uint32_t)pos + 1 < cps__chain_chain_len(c, r))
        return forward_then_apply(c, r, seq, u, pos, now);
    if ((rc = apply_action(c, r, seq, u)) != 0)
        return rc;
    return commit_at_tail(c, r, seq, u, pos);
}

/* Apply the held FWDs our predecessor now says it applied, in order. Each is let go once its
 * APPLY is made: a copy with this call's scratch, a caller's message through drop_cookie (which
 * keeps it until its next call), so the APPLYs may point into them. */
static int drain_ahead(cps__chain *c, uint32_t r, int pos, uint64_t now)
{
    range_st *rs = &c->ranges[r];
    int rc = 0;
    uint32_t done = 0;
    while (rc == 0 && done < rs->nahead && rs->ahead[done].seq <= rs->up_applied) {
        ahead_entry *e = &rs->ahead[done++];
        cps__chain_update u;
        if (e->seq != rs->applied + 1 || cps__chain_decode_fwd(c, e->payload, e->len, &u) != 0 ||
            (e->copy && cps__chain_scratch_keep(c, e->copy) != 0)) {
            /* cannot be: held in order, checked when it came; the predecessor re-sends */
            cps__chain_release_ahead(c, e);
            break;
        }
        e->copy = NULL; /* the scratch's now */
        rc = apply_fwd(c, r, e->seq, &u, pos, now);
        cps__chain_release_ahead(c, e);
    }
    cps__chain_ahead_consumed(c, rs, done);
    return rc;
}

/* A FWD from our predecessor. Applied (and forwarded on) in sequence order, and only once the
 * predecessor applied it: its aux says how far it had when it sent it; one it sent ahead of its
 * own WRITE is held until its CHAIN_MARK (CPS_CHAIN_MARK_APPLIED) or a re-send says so. So no
 * replica ever holds an update its predecessor lacks: a predecessor that stops between the FWD
 * and its WRITE leaves an update no one applied and no one acknowledged. */
static int on_fwd(cps__chain *c, const cps__msg_hdr *h, const void *payload, size_t len,
                  void *owner, int *kept, uint64_t now, int pos)
{
    uint32_t r = h->range;
    range_st *rs = &c->ranges[r];
    if (pos <= 0 || cps__chain_neighbour(c, r, pos - 1) != h->sender)
        return CPS_ESTALE_EPOCH; /* not from our predecessor in this view */
    cps__chain_update u;
    int rc = cps__chain_decode_fwd(c, payload, len, &u);
    if (rc != 0)
        return rc;
    int tail = (uint32_t)pos == cps__chain_chain_len(c, r) - 1;
    if (h->req_seq <= rs->applied) {
        /* A re-sent FWD we hold. If it is committed here, say so again: the ack may be lost. */
        if (rs->committed >= h->req_seq)
            return cps__chain_send_ack(c, r, h->sender, rs->committed);
        return 0;
    }
    uint64_t before = rs->applied;
    uint64_t next = rs->applied + rs->nahead + 1;
    if (h->req_seq > next)
        return 0; /* a gap: the predecessor re-sends in order */
    /* A shadow's FWD (we joined from its sender, who is now our predecessor) went after its
     * sender's APPLY; its aux is the join's id. */
    uint64_t up = (h->flags & CPS_WF_SHADOW) ? h->req_seq : h->aux;
    if (up > rs->up_applied)
        rs->up_applied = up;
    rc = drain_ahead(c, r, pos, now);
    if (rc == 0 && h->req_seq == rs->applied + rs->nahead + 1) {
        if (h->req_seq <= rs->up_applied && rs->nahead == 0)
            rc = apply_fwd(c, r, h->req_seq, &u, pos, now);
        else
            rc = cps__chain_hold_ahead(c, rs, h->req_seq, payload, len, owner, kept);
    }
    if (rc == 0 && !tail && rs->applied > before)
        rc = send_applied(c, r, pos);
    return rc;
}

/* Our predecessor applied up to h->req_seq (CHAIN_MARK with CPS_CHAIN_MARK_APPLIED). */
static int on_applied(cps__chain *c, const cps__msg_hdr *h, int pos, uint64_t now)
{
    uint32_t r = h->range;
    range_st *rs = &c->ranges[r];
    if (pos <= 0 || cps__chain_neighbour(c, r, pos - 1) != h->sender)
        return CPS_ESTALE_EPOCH;
    if (h->req_seq > rs->up_applied)
        rs->up_applied = h->req_seq;
    uint64_t before = rs->applied;
    int rc = drain_ahead(c, r, pos, now);
    if (rc == 0 && (uint32_t)pos + 1 < cps__chain_chain_len(c, r) && rs->applied > before)
        rc = send_applied(c, r, pos);
    return rc;
}

/* Answer a FWD sent to us as a shadow of join h->aux, which we are not copying from its sender. */
static int send_not_joining(cps__chain *c, const cps__msg_hdr *h)
{
    cps__msg_hdr a = {0};
    a.type = CPS_MSG_CHAIN_ACK;
    a.sender = c->cfg.self;
    a.epoch = c->view.epoch;
    a.range = h->range;
    a.step = h->aux;
    a.aux = CPS_CHAIN_ACK_NOT_JOINING;
    uint8_t *m = cps__chain_scratch_alloc(c, CPS_WIRE_HDR_SIZE);
    if (!m)
        return CPS_ENOMEM;
    cps__wire_hdr_encode(m, &a);
    return cps__chain_emit_send(c, h->range, h->sender, m, CPS_WIRE_HDR_SIZE);
}

static int on_ack(cps__chain *c, const cps__msg_hdr *h, int pos, uint64_t now)
{
    uint32_t r = h->range;
    range_st *rs = &c->ranges[r];
    if (h->aux & CPS_CHAIN_ACK_NOT_JOINING) {
        /* Our shadow is not copying the range (any more): it gave the join up, or restarted,
         * while our views kept it alive (one overtaken by a later one hid its death: simulator
         * seeds 4312, 9673). Kept, it would be forwarded every update for ever, and at a head
         * count against max_unacked. Only a refusal of the join we hold counts: one of an
         * earlier join may arrive after the node asked again. */
        if (rs->shadow && h->sender == rs->shadow && h->step == rs->shadow_join) {
            rs->shadow = 0;
            if ((uint32_t)pos + 1 == cps__chain_chain_len(c, r))
                cps__chain_drop_acked(rs, UINT64_MAX);
        }
        return 0;
    }
    if (rs->shadow && h->sender == rs->shadow && (uint32_t)pos + 1 == cps__chain_chain_len(c, r)) {
        /* The joining replica has these: nothing to commit, we are the tail. */
        cps__chain_drop_acked(rs, h->req_seq);
        return 0;
    }
    if ((uint32_t)pos + 1 >= cps__chain_chain_len(c, r) ||
        cps__chain_neighbour(c, r, pos + 1) != h->sender)
        return CPS_ESTALE_EPOCH;
    /* Only the answer to the MARK itself stops its repetition: an ack of updates alone does
     * not tell that the MARK (perhaps sent before the successor had the view) arrived. */
    if (rs->mark_pending && (h->aux & CPS_CHAIN_ACK_OF_MARK))
        rs->mark_pending = 0;
    uint64_t seq = h->req_seq < rs->applied ? h->req_seq : rs->applied;
    if (seq <= rs->committed && rs->nsent == 0)
        return 0;
    if (seq > rs->committed)
        rs->committed = seq;
    uint32_t drop = 0;
    while (drop < rs->nsent && rs->sent[drop].seq <= seq)
        free(rs->sent[drop++].msg);
    if (drop) {
        memmove(rs->sent, rs->sent + drop, (rs->nsent - drop) * sizeof *rs->sent);
        rs->nsent -= drop;
        /* Progress: the successor is there and working through what we sent. */
        rs->backoff = 0;
        rs->progress_ms = now;
    }
    int rc = cps__chain_wake_waits(c, r);
    if (rc == 0 && pos > 0)
        rc = cps__chain_send_ack(c, r, cps__chain_neighbour(c, r, pos - 1), rs->committed);
    return rc;
}

/* 1 if h, stamped with an older epoch than our view's, is a FWD or MARK of the node we have
 * taken the range's updates from (predecessor or join source) since that epoch, as far as our
 * views show. Its sender is simply behind us in views: it re-stamps its re-sends with its own
 * epoch, and while views keep coming it may stay one behind for seconds. Dropped, its FWDs
 * stalled all that time, and an ex-tail died holding an update it had acknowledged, which its
 * joined successor never got (simulator seed 4517). Such a FWD is safe to take: the chain only
 * grows at its tail, so a node that is our predecessor in our view and was at the FWD's epoch,
 * with no view of ours in between showing otherwise, never left it, and its sequence numbers
 * are the chain's. A node that left and came back is after us, unless we left too, and leaving
 * (begin_join, forget_range) resets pred. A removed head's FWDs stay fenced: it is nobody's
 * predecessor in our view. Acks keep the strict check: a behind successor's ack only frees
 * what we hold, and holding longer is safe. */
static int from_steady_pred(const cps__chain *c, const cps__msg_hdr *h)
{
    if ((h->type != CPS_MSG_FWD && h->type != CPS_MSG_CHAIN_MARK) || h->range >= c->nranges)
        return 0;
    const range_st *rs = &c->ranges[h->range];
    return rs->pred != 0 && h->sender == rs->pred && h->epoch >= rs->pred_epoch;
}

int cps__chain_on_message(cps__chain *c, const cps__msg_hdr *h, const void *payload, size_t len,
                          uint64_t now)
{
    int kept = 0;
    return cps__chain_on_message_owned(c, h, payload, len, NULL, &kept, now);
}

int cps__chain_on_message_owned(cps__chain *c, const cps__msg_hdr *h, const void *payload,
                                size_t len, void *owner, int *kept, uint64_t now)
{
    *kept = 0;
    cps__chain_begin_call(c);
    c->now = now;
    if (!c->have_view || (h->epoch < c->view.epoch && !from_steady_pred(c, h)))
        return CPS_ESTALE_EPOCH; /* fenced: a message from an older configuration */
    if (h->epoch > c->view.epoch)
        return CPS_EAGAIN; /* we are behind: the caller fetches the view; the sender re-sends */
    if (h->range >= c->nranges)
        return CPS_EPROTO;
    int pos = cps__chain_position(c, h->range);
    if (pos < 0) {
        range_st *rs = &c->ranges[h->range];
        if (rs->joining && h->type == CPS_MSG_FWD && h->sender == rs->join_source)
            return cps__chain_on_join_fwd(c, h, payload, len, owner, kept);
        if (h->type == CPS_MSG_FWD && (h->flags & CPS_WF_SHADOW)) /* to us as a shadow: no more */
            return send_not_joining(c, h);
        return CPS_ESTALE_EPOCH;
    }
    int rc = cps__chain_load_range(c, h->range);
    if (rc != 0)
        return rc;
    if (h->type == CPS_MSG_FWD)
        return on_fwd(c, h, payload, len, owner, kept, now, pos);
    if (h->type == CPS_MSG_CHAIN_ACK)
        return on_ack(c, h, pos, now);
    if (h->type == CPS_MSG_CHAIN_MARK && (h->aux & CPS_CHAIN_MARK_APPLIED))
        return on_applied(c, h, pos, now);
    if (h->type == CPS_MSG_CHAIN_MARK)
        return cps__chain_on_mark(c, h, pos);
    return CPS_EPROTO;
}

int cps__chain_tick(cps__chain *c, uint64_t now)
{
    cps__chain_begin_call(c);
    c->now = now;
    int rc = 0;
    for (uint32_t r = 0; rc == 0 && r < c->nranges; r++) {
        range_st *rs = &c->ranges[r];
        int pos = cps__chain_position(c, r);
        if (pos < 0)
            continue;
        int tail = (uint32_t)pos + 1 >= cps__chain_chain_len(c, r);
        uint32_t succ = tail ? rs->shadow : cps__chain_neighbour(c, r, pos + 1);
        if (!succ)
            continue;
        if (!tail && now - rs->mark_sent_ms >= c->cfg.resend_ms)
            rc = cps__chain_mark_send(c, r, succ, now);
        /* Re-send in order from the oldest unacknowledged one when it is overdue: after
         * resend_ms, plus time for the successor to take a big update, which doubles with each
         * unanswered round (re-sending a 200 MB update every 200 ms to a successor still
         * applying it piled copies up in the transport). Small updates keep the plain
         * resend_ms, so a lost one is replaced as fast as ever. */
        if (rs->nsent == 0)
            continue;
        uint64_t extra = rs->sent[0].len / RESEND_BYTES_PER_MS;
        uint64_t wait =
            (uint64_t)c->cfg.resend_ms +
            (extra << (rs->backoff < RESEND_MAX_DOUBLINGS ? rs->backoff : RESEND_MAX_DOUBLINGS));
        /* Overdue counts from the last ack that made progress, if later than the send: a burst of
         * chunks of one large push is acknowledged one after the other, and the last of them
         * waits behind all the others, not because it was lost. */
        uint64_t since =
            rs->sent[0].sent_ms > rs->progress_ms ? rs->sent[0].sent_ms : rs->progress_ms;
        if (now - since < wait)
            continue;
        rs->backoff++;
        for (uint32_t i = 0; rc == 0 && i < rs->nsent; i++)
            rc = send_held(c, r, &rs->sent[i], succ, now, 0);
    }
    return rc;
}
