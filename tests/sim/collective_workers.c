/* sim_collective: each worker's shell around the production ring (cps__coll), and the
 * scheduler's views, kills and replacements (collective.h). */
#include "collective.h"

/* ---- the program around the shell: calls, and the inbox between them ---- */
int in_call(const model *m, uint32_t wi)
{
    const worker *w = &m->w[wi];
    /* epoch 0: still in cps_open, whose loop reads the inbox too */
    return w->alive &&
           (w->epoch == 0 || w->running || w->fetching || w->in_barrier || m->now < w->tail_until);
}

static void hold(model *m, uint32_t wi, event *e)
{
    worker *w = &m->w[wi];
    if (!w->held && !(w->held = malloc(MAX_HELD * sizeof *w->held))) {
        fprintf(stderr, "sim_collective: out of memory\n");
        exit(2);
    }
    if (w->nheld == MAX_HELD) {
        sim_fail(&m->v, "worker %u's inbox holds more than %d messages between calls", w->id,
                 MAX_HELD);
        return;
    }
    w->held[w->nheld++] = *e;
    e->vals = NULL;
}

void deliver(model *m, event *e)
{
    worker *w = &m->w[e->to];
    if (!w->alive)
        return;
    if (!in_call(m, e->to)) {
        m->held_msgs++;
        m->held_reqs += e->type == EV_FREQ;
        hold(m, e->to, e);
        return;
    }
    switch (e->type) {
    case EV_MSG:
        /* --mix-epochs: the fencing undone, an old epoch's message taken as current. */
        if (m->mix && e->m.epoch < w->epoch)
            e->m.epoch = w->epoch;
        if (m->verbose > 1)
            printf("  t=%" PRIu64 " %u -> %u: kind %u epoch %" PRIu64 " seq %" PRIu64
                   " index %" PRIu64 "\n",
                   m->now, e->m.from, w->id, e->m.kind, e->m.epoch, e->m.seq, e->m.index);
        cps__coll_step(w->c, &e->m, m->now);
        perform(m, e->to);
        break;
    case EV_VIEW:
        deliver_view(m, e->to, e->epoch);
        break;
    case EV_FREQ:
        if (!w->running && !w->fetching && !w->in_barrier && w->epoch)
            m->tail_answers++;
        fetch_serve(m, e->to, e->from, e->m.seq, e->m.index);
        break;
    default:
        break;
    }
}

void enter_call(model *m, uint32_t wi)
{
    worker *w = &m->w[wi];
    uint32_t n = w->nheld;
    if (n == 0)
        return;
    event *held = w->held;
    w->held = NULL;
    w->nheld = 0;
    /* In arrival order; once the call is over (a completion among them), the rest waits again. */
    for (uint32_t i = 0; i < n; i++) {
        if (!m->v.failed)
            deliver(m, &held[i]);
        free(held[i].vals);
    }
    if (!w->held)
        w->held = held;
    else
        free(held);
}

void share_now(model *m, uint32_t wi)
{
    worker *w = &m->w[wi];
    /* The state of the last completed step; before the first, the initial parameters for a
     * program that shares them (a replacement's come from its fetch: fetch_done). */
    if (w->completed > 0 || (!w->repl && m->share_at_start)) {
        w->sharing = 1;
        w->shared = w->completed;
        w->ever_shared = 1;
    }
}

int others_finished(const model *m)
{
    for (uint32_t i = 0; i < m->nw; i++)
        if (m->w[i].bye && m->w[i].completed >= m->seqs)
            return 1;
    return 0;
}

void enter_barrier(model *m, uint32_t wi)
{
    worker *w = &m->w[wi];
    if (!w->alive)
        return;
    w->done = w->in_barrier = 1;
    share_now(m, wi);
    enter_call(m, wi);
    barrier_check(m);
}

/* The modelled workers as the scheduler's records (recovery/workers_end.h): a replacement is
 * one from its join on; alive as the scheduler believes (a killed worker until declared dead). */
static int worker_at(const void *ctx, uint32_t i, cps__worker_mark *out)
{
    const model *m = ctx;
    const worker *w = &m->w[i];
    if (!w->exists)
        return 0;
    *out = (cps__worker_mark){
        .rank = w->rank, .alive = m->in_view[i], .done = w->bye, .in_barrier = w->in_barrier};
    return 1;
}

void barrier_check(model *m)
{
    if (!cps__workers_barrier_releases(m->nw, worker_at, m))
        return;
    for (uint32_t i = 0; i < m->nw; i++) {
        worker *w = &m->w[i];
        if (!w->exists || !w->in_barrier || !w->alive)
            continue;
        /* BARRIER_DONE, then the program closes: out of any call from here on. */
        w->in_barrier = 0;
        post(m, link_at(m, SCHED, i), (event){.type = EV_BYE, .to = i});
    }
}

void on_bye(model *m, uint32_t wi)
{
    worker *w = &m->w[wi];
    if (!w->alive)
        return;
    if (m->verbose)
        printf("  t=%" PRIu64 " worker %u says goodbye\n", m->now, w->id);
    w->alive = 0;
    w->bye = 1;
    m->left++;
    for (uint32_t k = 0; k < w->nheld; k++) /* what it never read goes with it */
        free(w->held[k].vals);
    w->nheld = 0;
    m->in_view[wi] = 0;
    /* The scheduler: a finished worker releases the barrier for the others, and a view without
     * it goes out (worker_bye). */
    barrier_check(m);
    publish_view(m);
}

/* ---- the workers' shell ---- */
void schedule_tick(model *m, uint32_t wi)
{
    if (m->w[wi].tick_pending)
        return;
    m->w[wi].tick_pending = 1;
    post(m, m->now + TICK_MS, (event){.type = EV_TICK, .to = wi});
}

static void on_finish(model *m, uint32_t wi, const cps__coll_act *a)
{
    worker *w = &m->w[wi];
    w->running = 0;
    if (a->kind == CPS_COLL_FAILED) {
        const view *v = &m->views[w->epoch];
        if (a->status == CPS_ENOPEER && v->n == 1 && !m->end_kills) {
            m->enopeer++; /* every peer gone: the documented error; the program ends */
        } else {
            /* Among them the job's end racing a replacement (a survivor restarting the last
             * collective with a replacement that ran none of it, or a replacement starting one
             * after the others ended): once accepted, now a failure (cps__coll_set_next_seq,
             * CPS_COLL_ASK). */
            sim_fail(&m->v,
                     "worker %u's collective %" PRIu64 " failed %s under epoch %" PRIu64
                     " (%u members)%s",
                     w->id, a->seq, cps_strerror(a->status), w->epoch, v->n,
                     a->status == CPS_ETIMEDOUT ? ": it hung" : "");
        }
        w->done = 1;
        w->alive = 0;
        /* The process exits: the scheduler sees its connection close (no replacement: a
         * failed program is not restarted). */
        post(m, m->now + 5 + rnd(m, 300), (event){.type = EV_DECLARE, .to = wi, .from = 1});
        return;
    }
    if (!w->repl && a->seq != w->calls) {
        sim_fail(&m->v,
                 "worker %u completed collective %" PRIu64 " while running its call %" PRIu64,
                 w->id, a->seq, w->calls);
        return;
    }
    if (a->seq > m->seqs || m->nrec == MAX_RECORDS) {
        sim_fail(&m->v, "worker %u completed collective %" PRIu64 " (the job runs %u)", w->id,
                 a->seq, m->seqs);
        return;
    }
    if (w->repl) {
        memcpy(w->repl_in[a->seq], w->in, m->n * sizeof(float));
        w->repl_known[a->seq] = 1;
        w->repl_call[a->seq] = w->calls;
    }
    record *r = &m->rec[m->nrec++];
    r->w = wi;
    r->seq = a->seq;
    memcpy(r->out, w->buf, m->n * sizeof(float));
    for (uint32_t j = 0; j < m->n; j++) {
        uint32_t bits;
        memcpy(&bits, &w->buf[j], sizeof bits);
        m->hash = sim_mix64(m->hash ^ bits ^ (a->seq << 32) ^ ((uint64_t)w->id << 48));
    }
    m->hash = sim_mix64(m->hash ^ m->now);
    w->completed = a->seq;
    /* The rest of the loop turn that completed it is still the call: a fetch request read there
     * is answered with the state shared before (the program shares the new one after the
     * call). */
    w->tail_until = m->now + sim_draw(&m->prng, 3);
    if (m->verbose)
        printf("  t=%" PRIu64 " worker %u completes collective %" PRIu64 " under epoch %" PRIu64
               "\n",
               m->now, w->id, a->seq, a->epoch);
    if (a->seq >= m->seqs) {
        w->done = 1; /* then shares and waits in cps_barrier */
        post(m, m->now + 1 + sim_draw(&m->prng, 30), (event){.type = EV_BARRIER, .to = wi});
        maybe_kill_replacement(m, wi);
        return;
    }

    /* compute, then call (a long step with some programs: requests wait for it to end) */
    uint64_t compute = rnd(m, 30) + (m->compute_ms ? sim_draw(&m->prng, m->compute_ms) : 0);
    post(m, m->now + compute, (event){.type = EV_START, .to = wi});
}

void perform(model *m, uint32_t wi)
{
    worker *w = &m->w[wi];
    const cps__coll_act *acts;
    size_t n = cps__coll_actions(w->c, &acts);
    for (size_t i = 0; i < n && !m->v.failed; i++) {
        const cps__coll_act *a = &acts[i];
        switch (a->kind) {
        case CPS_COLL_SEND: {
            int to = worker_of(m, a->to);
            if (to < 0) {
                sim_fail(&m->v, "worker %u sends to unknown node %u", w->id, a->to);
                break;
            }
            event e = {.type = EV_MSG, .from = wi, .to = (uint32_t)to, .m = a->msg};
            e.vals = malloc((a->msg.count ? a->msg.count : 1) * sizeof(float));
            if (!e.vals) {
                fprintf(stderr, "sim_collective: out of memory\n");
                exit(2);
            }
            if (a->msg.count)
                memcpy(e.vals, a->msg.vals, a->msg.count * sizeof(float));
            /* A joining replacement moves its call to the ring's seq: what it sends says which
             * collective its input went into. */
            if (w->repl && a->msg.kind == CPS_COLL_DATA && a->msg.seq <= MAX_SEQ) {
                memcpy(w->repl_in[a->msg.seq], w->in, m->n * sizeof(float));
                w->repl_known[a->msg.seq] = 1;
                w->repl_call[a->msg.seq] = w->calls;
            }
            e.m.vals = e.vals;
            post(m, link_at(m, wi, (uint32_t)to), e);
            break;
        }
        case CPS_COLL_NEED_VIEW:
            post(m, link_at(m, wi, SCHED), (event){.type = EV_GETVIEW, .from = wi});
            break;
        case CPS_COLL_DONE:
        case CPS_COLL_FAILED:
            on_finish(m, wi, a);
            break;
        }
    }
}

void start_call(model *m, uint32_t wi)
{
    worker *w = &m->w[wi];
    if (!w->alive || w->done || w->running)
        return;
    share_now(m, wi); /* the last step's state, shared before the next call */
    w->calls++;
    if (m->end_kills && !m->end_armed && !w->repl && w->calls == m->seqs)
        arm_end_kills(m);
    for (uint32_t j = 0; j < m->n; j++)
        w->in[j] = input_value(m->seed, w->id, w->repl ? 1000 + w->calls : w->calls, j);
    memcpy(w->buf, w->in, m->n * sizeof(float));
    uint64_t seq;
    w->running = 1;
    int rc = cps__coll_start(w->c, w->buf, m->n, m->op, m->now, &seq);
    if (rc != 0) {
        sim_fail(&m->v, "worker %u: cps__coll_start: %s", w->id, cps_strerror(rc));
        return;
    }
    schedule_tick(m, wi);
    perform(m, wi);
    enter_call(m, wi); /* inside cps_allreduce: the inbox is read */
}

void deliver_view(model *m, uint32_t wi, uint64_t epoch)
{
    worker *w = &m->w[wi];
    if (!w->alive || epoch <= w->epoch)
        return;
    const view *v = &m->views[epoch];
    int first = w->epoch == 0;
    if (cps__coll_view(w->c, epoch, v->members, v->n, 1, m->now) != 0) {
        sim_fail(&m->v, "worker %u: cps__coll_view failed", w->id);
        return;
    }
    w->epoch = epoch;
    if (cps__coll_running(w->c))
        m->restarts++;
    if (m->slow && w->repl && !first && cps__coll_running(w->c) && v->n > 1 && !m->slow_aimed) {
        /* --slow, aimed: a running replacement re-formed by a view waits for its predecessor;
         * that predecessor now stalls past half the timeout (a timer there once let the
         * replacement go on with a seq of its own). */
        for (uint32_t i = 0; i < v->n; i++)
            if (v->members[i] == w->id) {
                int p = worker_of(m, v->members[(i + v->n - 1) % v->n]);
                if (p >= 0) {
                    m->slow_aimed = 1;
                    m->slow_w = (uint32_t)p;
                    m->slow_from = m->now;
                    m->slow_until = m->now + TIMEOUT_MS / 2 + rnd(m, TIMEOUT_MS * 3 / 10);
                    if (m->verbose)
                        printf("  t=%" PRIu64 " worker %u stalls until t=%" PRIu64 "\n", m->now,
                               m->w[p].id, m->slow_until);
                }
                break;
            }
    }
    perform(m, wi);
    if (first && w->repl && !m->guess) {
        /* cps_allreduce_fetch, over the network: the first live member that shares something
         * (it completed a collective) answers in parts with its state, the sequence number of
         * the collective that follows it and that collective's predecessor's result. A
         * replacement that arrives after the last collective has nothing to run, but keeps
         * answering the ring (it sits in cps_barrier). With --guess-seq the replacement fetches
         * nothing and guesses the ring's sequence (cps__coll_set_joining). */
        cps__fetch_start(&w->fetch, m->slen, m->now, TIMEOUT_MS);
        w->fetching = 1;
        fetch_drive(m, wi);
    } else if (first && w->repl) {
        /* A program that guesses still ends when the job's collectives are over: one that
         * arrives after the last has nothing to run (it sits in cps_barrier). */
        uint64_t at = 0;
        for (uint32_t rank = 0; rank < m->norig && !at; rank++)
            for (uint32_t i = 0; i < m->nw && !at; i++)
                if (i != wi && m->w[i].alive && m->in_view[i] && m->w[i].rank == rank)
                    at = m->w[i].completed;
        if (at >= m->seqs || others_finished(m))
            enter_barrier(m, wi);
        else
            post(m, m->now + 1 + rnd(m, 20), (event){.type = EV_START, .to = wi});
    }
}

/* ---- the scheduler ---- */
void publish_view(model *m)
{
    if (m->nviews == MAX_VIEWS) {
        sim_fail(&m->v, "too many views");
        return;
    }
    view *v = &m->views[++m->nviews];
    v->n = 0;
    /* Live workers in rank order; a replacement sorts where its dead predecessor stood. */
    for (uint32_t rank = 0; rank < m->norig; rank++)
        for (uint32_t i = 0; i < m->nw; i++)
            if (m->in_view[i] && m->w[i].rank == rank)
                v->members[v->n++] = m->w[i].id;
    /* The word every VIEW and WELCOME carries, by the coordinator's rule. */
    v->settled = cps__workers_unfinished_dead_rank(m->nw, worker_at, m, m->norig,
                                                   m->held_scratch) == UINT32_MAX;
    if (m->verbose) {
        printf("  t=%" PRIu64 " view %u%s:", m->now, m->nviews, v->settled ? " (settled)" : "");
        for (uint32_t i = 0; i < v->n; i++)
            printf(" %u", v->members[i]);
        printf("\n");
    }
    for (uint32_t i = 0; i < m->nw; i++)
        if (m->in_view[i])
            post(m, link_at(m, SCHED, i), (event){.type = EV_VIEW, .to = i, .epoch = m->nviews});
}

/* --end-kills: the first worker to start the last collective arms one or two kills of distinct
 * original workers, falling inside that collective (a ring step takes about 11 ms here). */
void arm_end_kills(model *m)
{
    m->end_armed = 1;
    uint64_t span = 2 * m->norig * 12 * (1 + m->n / (m->chunk * m->norig)) + 40;
    uint32_t first = (uint32_t)rnd(m, m->norig);
    for (uint32_t k = 0; k < m->end_n; k++)
        post(m, m->now + rnd(m, span), (event){.type = EV_KILL, .to = (first + k) % m->norig});
    m->owed += m->end_n;
}

void maybe_kill_replacement(model *m, uint32_t wi)
{
    worker *w = &m->w[wi];
    if (!m->end_kills || !w->repl || !w->alive || m->nw + m->owed >= MAX_W)
        return;
    if (sim_draw(&m->erng, 3) != 0)
        return;
    m->owed++;
    m->repl_kills++;
    /* At once, before its share or inside its barrier: it may have answered a fetch or not. */
    post(m, m->now + sim_draw(&m->erng, 80), (event){.type = EV_KILL, .to = wi});
}

void on_kill(model *m, uint32_t wi)
{
    worker *w = &m->w[wi];
    if (!w->alive) {
        if (m->owed) /* it left before: no replacement comes for this kill */
            m->owed--;
        return;
    }
    w->alive = 0;
    w->killed = 1;
    for (uint32_t k = 0; k < w->nheld; k++) /* its inbox dies with it */
        free(w->held[k].vals);
    w->nheld = 0;
    if (m->verbose)
        printf("  t=%" PRIu64 " worker %u killed -9 (running collective %" PRIu64 ": %d)\n", m->now,
               w->id, w->calls, w->running);
    /* Its pipes deliver a random prefix of what they hold; the rest dies with the process. */
    uint64_t cut[MAX_W];
    for (uint32_t i = 0; i < MAX_W; i++)
        cut[i] = m->now + rnd(m, 10);
    for (size_t i = 0; i < m->nheap; i++) {
        event *e = &m->heap[i];
        if ((e->type == EV_MSG || e->type == EV_FREQ || e->type == EV_FPART) && e->from == wi &&
            e->t > cut[e->to])
            e->type = -1 - e->type; /* dropped: left in the heap, ignored when popped */
    }
    /* The scheduler sees the connection close and declares it dead a while later. */
    post(m, m->now + 5 + rnd(m, 300), (event){.type = EV_DECLARE, .to = wi});
}

void on_declare(model *m, uint32_t wi, int failed)
{
    if (!m->in_view[wi])
        return;
    m->in_view[wi] = 0;
    /* A dead worker does not hold the barrier up. */
    barrier_check(m);
    publish_view(m);
    /* --restart-workers: sometimes a replacement of the same rank comes (with --end-kills,
     * always); a program that failed is not restarted. */
    if (!failed && m->nw < MAX_W && (m->end_kills || rnd(m, 2) == 0)) {
        uint32_t ri = m->nw++;
        worker *r = &m->w[ri];
        memset(r, 0, sizeof *r);
        r->id = REPL_ID_BASE + ri;
        r->rank = m->w[wi].rank;
        r->repl = 1;
        if (m->owed)
            m->owed--;
        post(m, m->now + 20 + rnd(m, 500), (event){.type = EV_JOIN, .to = ri});
    }
}

void on_join(model *m, uint32_t ri)
{
    worker *r = &m->w[ri];
    if (cps__coll_create(r->id, m->chunk, TIMEOUT_MS, &r->c) != 0) {
        fprintf(stderr, "sim_collective: out of memory\n");
        exit(2);
    }
    cps__coll_set_joining(r->c);
    r->exists = r->alive = 1;
    m->in_view[ri] = 1;
    if (m->verbose)
        printf("  t=%" PRIu64 " replacement %u of rank %u joins\n", m->now, r->id, r->rank);
    publish_view(m);
}
