/* Chain replication, state transfer: the tail's shadow (a joining replica that receives every
 * update while it copies the range), the joiner's side (updates held until its snapshot is in,
 * then applied in order) and the new tail's read gate (MARK). See chain.h. Pure: no I/O, no
 * clock. */
#include <stdlib.h>
#include <string.h>

#include "chain_int.h"
#include "chainps/error.h"

int cps__chain_add_shadow(cps__chain *c, uint32_t r, uint32_t node, uint64_t join_id, uint64_t now)
{
    cps__chain_begin_call(c);
    c->now = now;
    if (!cps__chain_is_tail(c, r) || node == c->cfg.self || node == 0)
        return CPS_EINVAL;
    /* A late SNAP_REQ of a join the scheduler has since replaced (sent, say, by a node before it
     * was fenced, and delivered after it came back): taken, it would replace the shadow of the
     * current join and drop what we held for it, and that joiner, whose snapshot may already be
     * on its way, would report CAUGHT_UP lacking updates we acknowledged (simulator seed
     * 10010). */
    if (join_id < c->ranges[r].shadow_join)
        return CPS_ESTALE_EPOCH;
    /* A late SNAP_REQ of a node our view already counts dead: it would stay our shadow (only a
     * view change clears one), and we would hold and re-send its updates for ever (simulator
     * seed 123). */
    const cps__node_info *n = cps__view_node(&c->view, node);
    if (!n || !n->alive)
        return CPS_EINVAL;
    int rc = cps__chain_load_range(c, r);
    if (rc != 0)
        return rc;
    range_st *rs = &c->ranges[r];
    /* A repeated request of the current join (a duplicate, or the joiner asking again): what
     * we hold for it is still owed to it, whichever snapshot it installs. */
    if (rs->shadow == node && rs->shadow_join == join_id)
        return 0;
    /* A shadow replaced by another (a retried join): what the old one did not ack is moot. */
    cps__chain_drop_acked(rs, UINT64_MAX);
    rs->shadow = node;
    rs->shadow_join = join_id;
    return 0;
}

int cps__chain_begin_join(cps__chain *c, uint32_t r, uint32_t source)
{
    cps__chain_begin_call(c);
    if (r >= c->nranges || cps__chain_position(c, r) >= 0 || source == 0)
        return CPS_EINVAL;
    range_st *rs = &c->ranges[r];
    cps__chain_forget_range(
        c, rs); /* whatever old state we had for the range is about to be replaced */
    rs->joining = 1;
    rs->join_ready = 0;
    rs->join_source = source;
    rs->pred = source;
    rs->pred_epoch = c->have_view ? c->view.epoch : 0;
    return 0;
}

void cps__chain_join_abort(cps__chain *c, uint32_t r)
{
    cps__chain_begin_call(c);
    if (r < c->nranges && c->ranges[r].joining) {
        cps__chain_forget_range(c, &c->ranges[r]);
    }
}

/* Apply the held FWDs (the range's one buffer of FWDs held ahead: chain_int.h) in order from
 * applied + 1, each once; what the snapshot already holds is let go. One pass: they are held in
 * ascending order without gaps, so a front that does not follow on means the source re-sends
 * from there, and the rest goes with it. */
static int replay_held(cps__chain *c, uint32_t r)
{
    range_st *rs = &c->ranges[r];
    int rc = 0;
    uint32_t done = 0;
    while (rc == 0 && done < rs->nahead && rs->ahead[done].seq <= rs->applied + 1) {
        ahead_entry *e = &rs->ahead[done++];
        if (e->seq <= rs->applied) {
            cps__chain_release_ahead(c, e);
            continue;
        }
        cps__chain_update u;
        rc = cps__chain_decode_fwd(c, e->payload, e->len, &u);
        if (rc == 0)
            rc = cps__chain_note_applied(c, r, &u);
        cps__chain_action *a = rc == 0 ? cps__chain_act(c, CPS_CA_APPLY, r) : NULL;
        /* The APPLY points into the FWD: a copy lives with this call's scratch, a caller's
         * message until the caller's next call (drop_cookie). */
        if (a && e->copy && (rc = cps__chain_scratch_keep(c, e->copy)) == 0)
            e->copy = NULL;
        if (!a || rc != 0) {
            cps__chain_release_ahead(c, e);
            rc = rc ? rc : CPS_ENOMEM;
            break;
        }
        a->seq = e->seq;
        a->upd = u;
        rs->applied = rs->committed = e->seq;
        cps__chain_release_ahead(c, e);
    }
    cps__chain_ahead_consumed(c, rs, done);
    return rc;
}

int cps__chain_on_join_fwd(cps__chain *c, const cps__msg_hdr *h, const void *payload, size_t len,
                           void *owner, int *kept)
{
    uint32_t r = h->range;
    range_st *rs = &c->ranges[r];
    if (rs->join_ready && h->req_seq <= rs->applied)
        return cps__chain_send_ack(c, r, h->sender, rs->applied);
    /* Before the snapshot is in we cannot apply it, after it we apply in order. Held in
     * ascending order without gaps (the source forwards and re-sends in order): one that does
     * not follow the last held (or, once ready, what we applied) is a duplicate or comes after
     * a loss, and the source's re-send brings it again. */
    uint64_t last = rs->nahead ? rs->ahead[rs->nahead - 1].seq : rs->applied;
    if ((rs->nahead || rs->join_ready) && h->req_seq != last + 1)
        return 0;
    int rc = cps__chain_hold_ahead(c, rs, h->req_seq, payload, len, owner, kept);
    if (rc != 0 || !rs->join_ready)
        return rc;
    uint64_t before = rs->applied;
    rc = replay_held(c, r);
    if (rc == 0 && rs->applied > before)
        rc = cps__chain_send_ack(c, r, rs->join_source, rs->applied);
    return rc;
}

int cps__chain_join_ready(cps__chain *c, uint32_t r, uint64_t snap_seq, uint64_t now)
{
    cps__chain_begin_call(c);
    c->now = now;
    if (r >= c->nranges || !c->ranges[r].joining)
        return CPS_EINVAL;
    range_st *rs = &c->ranges[r];
    /* The store now holds the snapshot: caches start afresh from it. */
    free(rs->hw);
    rs->hw = NULL;
    free(rs->aggs);
    rs->aggs = NULL;
    rs->naggs = rs->aggs_cap = 0;
    rs->applied = rs->committed = snap_seq;
    rs->loaded = 1;
    rs->join_ready = 1;
    int rc = replay_held(c, r);
    if (rc == 0)
        rc = cps__chain_send_ack(c, r, rs->join_source, rs->applied);
    return rc;
}

int cps__chain_can_serve_pull(cps__chain *c, uint32_t r)
{
    if (!cps__chain_is_tail(c, r))
        return 0;
    range_st *rs = &c->ranges[r];
    if (rs->gated && rs->mark_known && rs->applied >= rs->mark)
        rs->gated = 0;
    return !rs->gated;
}

/* ---- the new tail's read gate: MARK ---- */

static int send_mark(cps__chain *c, uint32_t r, uint32_t to, uint64_t seq)
{
    return cps__chain_send_control(c, r, to, CPS_MSG_CHAIN_MARK, seq, 0);
}

/* The MARK to hand a new successor: what we applied, or, if we joined and have not caught up
 * with our own predecessor yet, what it had (its MARK), since that is what may have been
 * acknowledged. 0 while we wait for our own MARK (simulator seed 416: a second replica joined
 * from a tail that was itself still catching up, and served reads older than acknowledged). */
static int mark_value(const range_st *rs, uint64_t *v)
{
    *v = rs->applied;
    if (!rs->gated)
        return 1;
    if (!rs->mark_known)
        return 0;
    if (rs->mark > *v)
        *v = rs->mark;
    return 1;
}

int cps__chain_mark_send(cps__chain *c, uint32_t r, uint32_t succ, uint64_t now)
{
    range_st *rs = &c->ranges[r];
    if (!rs->mark_pending || !mark_value(rs, &rs->mark_to_send))
        return 0;
    rs->mark_sent_ms = now;
    return send_mark(c, r, succ, rs->mark_to_send);
}

int cps__chain_on_mark(cps__chain *c, const cps__msg_hdr *h, int pos)
{
    range_st *rs = &c->ranges[h->range];
    if (pos == 0 || cps__chain_neighbour(c, h->range, pos - 1) != h->sender)
        return CPS_ESTALE_EPOCH;
    if (!rs->mark_known || h->req_seq > rs->mark)
        rs->mark = h->req_seq;
    rs->mark_known = 1;
    /* Acknowledge the MARK, so the predecessor stops repeating it. The ack carries what
     * is committed here: a MARK may now come to a middle replica too, whose applied
     * updates are not committed (at the tail the two are equal). */
    return cps__chain_send_control(c, h->range, h->sender, CPS_MSG_CHAIN_ACK, rs->committed,
                                   CPS_CHAIN_ACK_OF_MARK);
}
