/* sim_collective: a replacement's fetch of the shared state over the network, in parts
 * (replication/ring_fetch.c), and the sharers' answers (collective.h). */
#include "collective.h"

/* The shared state of a worker that completed collective `k`: its parameters, the same on every
 * worker that completed k. An assembled fetch holds one k's values throughout, or it mixed. */
static float state_value(uint64_t seed, uint64_t k, uint32_t j)
{
    return input_value(seed, 999, 5000 + k, j);
}

static void fetch_done(model *m, uint32_t wi, int result)
{
    worker *w = &m->w[wi];
    w->fetching = 0;
    uint64_t at = 0, rn = 0;
    if (result == 1) {
        m->fetches++;
        uint64_t next = w->fetched_next ? w->fetched_next : w->fetch.next;
        rn = w->fetch.total - m->slen;
        at = next - 1;
        for (uint32_t j = 0; j < m->slen; j++)
            if (w->fstate[j] != state_value(m->seed, at, j)) {
                sim_fail(&m->v,
                         "replacement %u fetched a state that is not collective %" PRIu64
                         "'s (value %u): parts of two answers mixed",
                         w->id, at, j);
                return;
            }
        if (cps__coll_set_next_seq(w->c, next, w->running) != 0) {
            sim_fail(&m->v, "replacement %u: cps__coll_set_next_seq failed", w->id);
            return;
        }
        perform(m, wi);
        if (rn && cps__coll_adopt_result(w->c, at, w->fres, rn) != 0) {
            sim_fail(&m->v, "replacement %u: cps__coll_adopt_result failed", w->id);
            return;
        }
        perform(m, wi);
    } else if (result == CPS_ETIMEDOUT) {
        sim_fail(&m->v, "replacement %u's fetch hung", w->id);
        return;
    } else if (result == CPS_ESHUTDOWN) {
        /* The job's end: right only when its work is done, i.e. some worker completed the last
         * collective and finished. The program closes the client and exits 0. */
        if (!others_finished(m)) {
            sim_fail(&m->v, "replacement %u told the job has ended while its work is not done",
                     w->id);
            return;
        }
        /* ... and only when every live worker it could ask is a replacement that never held a
         * state (docs/collective.md): one that shares, fetched or completed the last collective
         * holds the final state and would have given it. */
        for (uint32_t i = 0; i < m->nw; i++) {
            const worker *o = &m->w[i];
            if (i != wi && o->alive && m->in_view[i] &&
                (o->sharing || o->fetched || o->completed >= m->seqs)) {
                sim_fail(&m->v,
                         "replacement %u told the job has ended while worker %u holds a state "
                         "(sharing %d, fetched %d, completed %" PRIu64 ")",
                         w->id, o->id, o->sharing, o->fetched, o->completed);
                return;
            }
        }
        if (m->verbose)
            printf("  t=%" PRIu64 " replacement %u: the job has ended\n", m->now, w->id);
        m->job_ends++;
        w->ended = w->done = 1;
        post(m, link_at(m, wi, SCHED), (event){.type = EV_BYE, .to = wi});
        return;
    } else if (result == CPS_ENOPEER && !m->end_kills) {
        /* Nobody to fetch from until the deadline: a dead worker's replacement never came (the
         * model replaces some only). The documented error; the program ends on it. */
        m->enopeer++;
        w->done = 1;
        w->alive = 0;
        post(m, m->now + 5 + rnd(m, 300), (event){.type = EV_DECLARE, .to = wi, .from = 1});
        return;
    } else if (m->end_kills) {
        /* Killed in the last collective while others complete it: the replacement gets the
         * final state or the job's end; anything else fails the job. */
        sim_fail(&m->v, "replacement %u's fetch failed %s (the job would fail)", w->id,
                 cps_strerror(result));
        return;
    }
    /* Otherwise nobody shares anything (CPS_ENOTFOUND): the sequence is guessed. */
    if (m->verbose)
        printf("  t=%" PRIu64 " replacement %u fetched (%s): next collective %" PRIu64 ", %" PRIu64
               " values of result\n",
               m->now, w->id, result == 1 ? "ok" : cps_strerror(result), at + 1, rn);
    if (result == 1) {
        w->fetched = 1;
        m->final_fetches += at >= m->seqs;
        if (at >= m->seqs)
            maybe_kill_replacement(m, wi);
    }
    if (result == 1 && m->share_after_fetch) {
        w->sharing = 1; /* allreduce_app shares what it fetched before its loop */
        w->shared = at;
        w->ever_shared = 1;
    }
    if (at >= m->seqs || (result != 1 && others_finished(m)))
        enter_barrier(m, wi);
    else
        post(m, m->now + 1 + rnd(m, 20), (event){.type = EV_START, .to = wi});
}

/* cps_allreduce_fetch's loop: ask, wait, ask again, until the fetch ends. */
void fetch_drive(model *m, uint32_t wi)
{
    worker *w = &m->w[wi];
    if (!w->alive || !w->fetching)
        return;
    const view *v = &m->views[w->epoch];
    cps__node_info nodes[MAX_W];
    for (uint32_t i = 0; i < v->n; i++)
        nodes[i] = (cps__node_info){.id = v->members[i], .role = CPS_ROLE_WORKER, .alive = 1};
    cps__view cv = {.epoch = w->epoch, .num_workers = m->norig, .nnodes = v->n, .nodes = nodes};
    for (;;) {
        uint32_t to;
        uint64_t req;
        int result;
        int what = cps__fetch_next(&w->fetch, &cv, v->members, v->n, w->id, 0, v->settled, m->now,
                                   &to, &req, &result);
        if (what == CPS_FETCH_DONE) {
            fetch_done(m, wi, result);
            return;
        }
        if (what == CPS_FETCH_WAIT)
            break;
        int ti = worker_of(m, to);
        if (ti < 0) {
            sim_fail(&m->v, "replacement %u asks unknown node %u", w->id, to);
            return;
        }
        event e = {.type = EV_FREQ, .from = wi, .to = (uint32_t)ti};
        if (m->verbose > 1)
            printf("  t=%" PRIu64 " %u -> %u: fetch request %" PRIu64 " from value %" PRIu64 "\n",
                   m->now, w->id, to, req, w->fetch.ask);
        e.m.seq = req;
        e.m.index = w->fetch.ask;
        post(m, link_at(m, wi, (uint32_t)ti), e);
    }
    if (!w->ftick_pending) {
        w->ftick_pending = 1;
        post(m, m->now + 50, (event){.type = EV_FTICK, .to = wi});
    }
}

/* The sharer (any live worker, done or not): its answer (replication/ring_fetch.c), over its
 * pipe to the asker, in parts; with --old-peers in one message, the result left out when the two
 * exceed a message. */
void fetch_serve(model *m, uint32_t si, uint32_t ri, uint64_t req, uint64_t from)
{
    worker *s = &m->w[si];
    uint64_t rseq = 0, rn = 0, total = 0;
    const float *rvals = NULL;
    int has = cps__coll_last_result(s->c, &rseq, &rvals, &rn);
    uint64_t k = s->shared, share = s->sharing ? m->slen : 0;
    event e = {.type = EV_FPART, .from = si, .to = ri};
    e.m.seq = req;
    if (!m->old_peers && !cps__fetch_serve_again(s->served, m->w[ri].id, k, from, m->now))
        return; /* that window is still on its way: the shell sends nothing again */
    float vals[MAX_S + MAX_N];
    for (uint32_t j = 0; j < m->slen; j++)
        vals[j] = state_value(m->seed, k, j);
    if (has)
        memcpy(vals + m->slen, rvals, rn * sizeof(float));
    e.part = (cps__fetch_part){.gen = k, .step = k, .next = k + 1};
    if (m->old_peers) {
        int with = 0;
        e.whole = 1;
        e.status = cps__fetch_serve(share, m->slen, k, has, rseq, rn, &with);
        with = with && m->slen + rn <= m->msg_limit;
        e.part.count = e.status == 0 ? m->slen + (with ? rn : 0) : 0;
    } else {
        e.status = cps__fetch_serve_parts(share, m->slen, k, has, rseq, rn, from, &total);
    }
    if (e.status != 0) {
        /* The refusal's word, as the shell decides it (src/worker/collective.c: it held a state
         * when it shared one, fetched one or completed a collective); an older sharer's is 0. */
        int held = s->ever_shared || s->fetched || has;
        e.part.step = m->old_peers ? 0 : cps__fetch_refusal_step(e.status, s->repl, held);
    }
    if (e.status != 0 || e.whole) {
        e.vals = malloc((e.part.count + 1) * sizeof(float));
        if (!e.vals) {
            fprintf(stderr, "sim_collective: out of memory\n");
            exit(2);
        }
        memcpy(e.vals, vals, e.part.count * sizeof(float));
        post(m, link_at(m, si, ri), e);
        return;
    }
    e.part.total = total;
    for (uint32_t i = 0; cps__fetch_part_at(from, total, m->part, m->window, i, &e.part.off,
                                            &e.part.count, &e.part.last);
         i++) {
        event p = e;
        p.vals = malloc(p.part.count * sizeof(float));
        if (!p.vals) {
            fprintf(stderr, "sim_collective: out of memory\n");
            exit(2);
        }
        memcpy(p.vals, vals + p.part.off, p.part.count * sizeof(float));
        uint64_t at = link_at(m, si, ri);
        if (m->part_ms) {
            /* --slow-parts: the part's bytes take their time on the pipe, and the next part
             * leaves after them. */
            at += m->part_ms * p.part.count / m->part;
            m->link_last[si][ri] = at;
        }
        if (m->verbose > 1)
            printf("  t=%" PRIu64 " %u -> %u: part %" PRIu64 "+%" PRIu64 " of %" PRIu64
                   " (request %" PRIu64 ") arrives at t=%" PRIu64 "\n",
                   m->now, s->id, m->w[ri].id, p.part.off, p.part.count, total, req, at);
        post(m, at, p);
        cps__fetch_served_note(s->served, m->w[ri].id, k, from, p.part.off + p.part.count, m->now);
    }
}

/* A part (or a whole answer) reaches the fetching replacement: the shell's copy. */
void fetch_receive(model *m, uint32_t ri, const event *e)
{
    worker *w = &m->w[ri];
    if (!w->alive || !w->fetching)
        return;
    uint32_t from = m->w[e->from].id;
    const cps__fetch_part *p = &e->part;
    if (e->whole) {
        if (cps__fetch_answer(&w->fetch, from, e->m.seq, e->status, p->count, p->step)) {
            memcpy(w->fstate, e->vals, m->slen * sizeof(float));
            memcpy(w->fres, e->vals + m->slen, (p->count - m->slen) * sizeof(float));
            w->fetched_next = p->next;
            w->fetch.total = p->count; /* past slen: the result */
        }
    } else if (cps__fetch_part_take(&w->fetch, from, e->m.seq, e->status, p, m->now)) {
        m->fetch_parts++;
        uint64_t nstate, roff;
        cps__fetch_part_split(p->off, p->count, m->slen, &nstate, &roff);
        memcpy(w->fstate + p->off, e->vals, nstate * sizeof(float));
        memcpy(w->fres + roff, e->vals + nstate, (p->count - nstate) * sizeof(float));
    }
    fetch_drive(m, ri);
}
