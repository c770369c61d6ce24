/* The server's side of a drain (--drains): the operator stops a server with SIGTERM, and the
 * server, as production's does, asks the scheduler to move its ranges away (DRAIN from its own
 * id), keeps serving until the scheduler lets it go (SHUTDOWN), and stops at once on a refusal
 * or when no answer comes. Every decision is the production
 * pure part's (replication/standing.h: cps__drain_decide, cps__drain_on_answer,
 * cps__drain_held); this file only performs them. Checked when such a server stops (17): each
 * range it held when signalled keeps a replica holding every acknowledged update, and R of them
 * when no fault struck and no server was declared dead while it drained; and an accepted drain
 * ends within SIM_DRAIN_END_MS of its ACK, and is still the scheduler's when the job ends. */
#include <inttypes.h>
#include <stdlib.h>

#include "core/wire.h"
#include "recovery/fence.h"
#include "replication/standing.h"

#include "sim.h"

/* The operator sends SIGTERM to a live server let in, when the others can still hold R
 * replicas of every range. */
void sim_drain_sigterm(sim *sm)
{
    const cps__view *v = sim_cur_view(sm);
    uint32_t cand[SIM_MAX_SERVERS], nc = 0, up = 0;
    for (uint32_t id = 1; id <= sm->p.servers; id++) {
        const sim_server *s = &sm->servers[id - 1];
        int live = s->state == SRV_UP && sim_node_alive(v, id);
        up += live;
        if (live && !s->stop_signals)
            cand[nc++] = id;
    }
    if (nc == 0 || up - 1 < v->replicas)
        return;
    sim_server *s = &sm->servers[cand[sim_rnd(sm, nc)] - 1];
    sim_trace(sm, "operator: SIGTERM to s%u", s->id);
    s->stop_signals = 1;
    s->drain_faults = sm->nfaults;
    s->drain_epoch = sm->epoch;
    if (!s->drain_held)
        s->drain_held = sim_xcalloc(sm->nranges, sizeof *s->drain_held);
    for (uint32_t r = 0; r < sm->nranges; r++)
        s->drain_held[r] = sim_is_member(sm, r, s->id);
    sm->sigterms++;
}

/* 1 if a view after `epoch` declared a server dead that held a range (a drained server leaves
 * the view holding none). */
static int deaths_since(const sim *sm, uint64_t epoch)
{
    for (uint64_t e = epoch + 1; e <= sm->epoch; e++)
        for (uint32_t id = 1; id <= sm->p.servers; id++)
            if (sim_node_alive(&sm->views[e - 1], id) && !sim_node_alive(&sm->views[e], id) &&
                cps__drain_held(&sm->views[e - 1], id) > 0)
                return 1;
    return 0;
}

/* Invariant 17, when a server that was signalled stops: what it held is still held. */
static void check_leave(sim *sm, const sim_server *s)
{
    const cps__view *v = sim_cur_view(sm);
    /* Calm: no fault struck and no server was declared dead while it drained (a death, false
     * or not, may leave a range short until it is repaired). */
    int calm = sm->nfaults == s->drain_faults && !deaths_since(sm, s->drain_epoch);
    for (uint32_t r = 0; r < sm->nranges && s->drain == CPS_DRAIN_ACCEPTED; r++) {
        if (!s->drain_held[r])
            continue;
        const cps__range *rg = &v->ranges[r];
        uint32_t holders = 0;
        for (uint32_t j = 0; j < rg->chain_len; j++) {
            const sim_server *o = &sm->servers[rg->chain[j] - 1];
            /* A store counts, whatever its process does meanwhile (kill -9 keeps LMDB). */
            holders += o != s && !o->wiped && o->rs[r].applied >= sm->acked_seq[r];
        }
        uint32_t need = calm ? v->replicas : 1;
        if (holders < need) {
            sim_fail(sm, "(17) a drained server's ranges keep their replicas",
                     "server %u leaves after its drain was accepted; range %u, which it held, has "
                     "%u other replica(s) with every acknowledged update (seq %" PRIu64
                     "), %u needed",
                     s->id, r, holders, sm->acked_seq[r], need);
            return;
        }
    }
}

/* The server process ends (a drain done, refused or unanswered): the sim's exit. */
static void leave(sim *sm, sim_server *s, const char *why)
{
    sim_trace(sm, "s%u exits: %s", s->id, why);
    check_leave(sm, s);
    s->state = SRV_CRASHED;
    s->inc++;
    s->stop_signals = 0;
    s->drain = CPS_DRAIN_NONE;
    /* A server that stopped holding ranges is a crash to the rest of the cluster; the operator
     * starts it again later, as a scale-up would. */
    sim_push_restart(sm, s->id, 100 + sim_rnd(sm, 3000));
}

/* Every turn of a signalled server's loop (before it sleeps), as production's server does. */
void sim_drain_turn(sim *sm, sim_server *s)
{
    if (!s->stop_signals || s->state == SRV_CRASHED)
        return;
    const cps__fence *f = cps__replica_fence(s->rep);
    int joined = s->state != SRV_HELLO && cps__fence_joined(f);
    uint32_t held = s->view ? cps__drain_held(s->view, s->id) : 0;
    int d = cps__drain_decide(s->drain, s->stop_signals, joined, cps__fence_fenced(f), held,
                              s->drain_asked, sm->now, CPS_DRAIN_ANSWER_MS);
    if (d == CPS_DRAIN_STOP) {
        leave(sm, s, "stop signal");
        return;
    }
    if (s->drain == CPS_DRAIN_ACCEPTED && sm->now - s->drain_accepted > SIM_DRAIN_END_MS) {
        sim_fail(sm, "(17) an accepted drain ends",
                 "server %u's drain, accepted at %" PRIu64 " ms, has not ended %u ms later (it "
                 "still holds %u range(s) in its view)",
                 s->id, s->drain_accepted, SIM_DRAIN_END_MS, held);
        return;
    }
    if (d != CPS_DRAIN_ASK)
        return;
    cps__msg_hdr h = {.type = CPS_MSG_DRAIN, .epoch = s->epoch, .req_seq = 1};
    sim_send_reliable(sm, s->id, 0, &h); /* over the scheduler's connection */
    s->drain = CPS_DRAIN_ASKED;
    s->drain_asked = sm->now;
    sim_trace(sm, "s%u asks to be drained of %u range(s)", s->id, held);
}

/* An ACK or ERROR of the scheduler: 1 if it answered our DRAIN (or was one for a drain). */
int sim_drain_answer(sim *sm, sim_server *s, uint8_t type)
{
    int next = cps__drain_on_answer(s->drain, type, 1);
    if (next < 0) {
        leave(sm, s, "the scheduler cannot drain it");
        return 1;
    }
    if (next != s->drain) {
        sim_trace(sm, "s%u draining: the scheduler accepted", s->id);
        if (next == CPS_DRAIN_ACCEPTED)
            s->drain_accepted = sm->now;
    }
    s->drain = next;
    return 1;
}

/* SHUTDOWN of a drained server (the scheduler let it go). */
void sim_drain_shutdown(sim *sm, sim_server *s)
{
    leave(sm, s, "drained");
}

/* At the job's end: a server whose drain was accepted may still be draining (the job does not
 * wait for a drain), but the scheduler must still know it as draining (or let go): one that
 * forgot the drain (a restart of it, say) would never let the server go, and the server, signalled,
 * would serve until its operator kills it. */
void sim_drain_check_end(sim *sm)
{
    for (uint32_t id = 1; id <= sm->p.servers && !sm->failed; id++) {
        const sim_server *s = &sm->servers[id - 1];
        if (s->state == SRV_CRASHED || !s->stop_signals || s->drain != CPS_DRAIN_ACCEPTED)
            continue;
        const cps__coord_node *cn = sim_coord_node(sm, id);
        if (!cn || !(cn->draining || cn->left))
            sim_fail(sm, "(17) an accepted drain ends",
                     "server %u's drain, accepted at %" PRIu64 " ms, is unknown to the scheduler "
                     "when the job ends at %" PRIu64 " ms",
                     id, s->drain_accepted, sm->now);
    }
}
