/* sim_collective: seeded model of the ring all-reduce (replication/collective.c) among 2..6
 * workers while workers are killed -9 and replaced.
 *
 * Every worker runs the production state machine (cps__coll); the model fakes only what its shell
 * (src/worker/collective.c) and the rest of the job provide: the network, the clock, and the
 * scheduler's views.
 * - Network: the real transport keeps one NN_PUSH pipe per ordered pair of nodes (transport.h),
 *   so messages from one node to another arrive in the order they were sent, after a random delay;
 *   messages of different pairs interleave freely. Nothing is lost while both ends live. A node
 *   killed -9 loses what its pipes had not delivered yet: the model delivers a random prefix of
 *   each of its pipes and drops the rest; messages to a dead node go nowhere.
 * - Scheduler: it declares a killed worker dead a random while after the kill (its connection
 *   closed) and publishes a view without it; with some seeds it then adds a replacement of the
 *   same rank (--restart-workers), which the shell marks as joining. Each worker receives each
 *   view at its own moment (one pipe from the scheduler, in order), and a worker whose ring saw a
 *   newer epoch asks for the latest view (CPS_COLL_NEED_VIEW), as the shell does.
 * - Clock: simulated milliseconds; every running worker ticks every TICK_MS.
 *
 * Checked on every seed: all live workers that complete collective k hold bitwise the same
 * result; that result is bitwise the fixed-order reduction of the inputs of exactly the members of
 * one view epoch (inputs differ per worker and per collective, so a mix of two epochs matches no
 * epoch); every worker's input counts in one collective at most (a replacement may give zeros
 * instead, to a collective it skipped: cps__coll helps the ring through it so); a collective
 * completes, or fails CPS_ENOPEER when the failing worker's view holds no
 * peer (CPS_ETIMEDOUT, a hang, is a failure of the seed); and a second run of the seed gives the
 * same results and the same event count (determinism). Nothing else is accepted: a replacement
 * gets the ring's next sequence number and the last result from the worker it fetches from, as
 * cps_allreduce_fetch does, so the job's end racing a replacement must complete too.
 *
 * The fetch goes over the network like the ring's messages: requests, and answers in parts
 * (replication/ring_fetch.c) of at most half the shared state, 1 to 3 parts per request, so
 * every fetch takes several parts and a sharer that completes a collective between two requests
 * answers with another identity; parts lost with a killed sharer are asked again. An assembled
 * state must be one collective's throughout.
 * --guess-seq: replacements fetch nothing and guess the ring's sequence (cps__coll_set_joining);
 * the job's end can then still race them (7 seeds of 20,000 hang: known, documented).
 * --no-adopt: the state and the result exceed one message; in parts the result travels anyway.
 * --old-peers: answers in one message, as between workers that predate parts; with --no-adopt the
 * result then stays behind and replacements help with zeros (sim.collective_oldpeers).
 * --slow-parts: a part's time on its pipe grows with its values, a whole part's up to three
 * times CPS_FETCH_RESEND_MS (a large part over a slow link), so parts arrive after their request
 * was sent again and must still count (sim.collective_slowparts).
 * The sharer sends a window once per asker (cps__fetch_serve_again), as the shell does.
 * Programs: the shell reads its inbox (ring messages, views, fetch requests) only inside a call:
 * while a collective runs, while it fetches, in cps_open and in cps_barrier after the last
 * collective. Between calls (the program computing) messages wait and are read, in order, once
 * the next call has started its collective. A sharer answers with what it last shared
 * (cps_allreduce_share), which the program calls between calls, so a request read in the loop
 * turn that completed a collective (0-2 ms past it) gets the state before it, without its
 * result. Per seed (a stream of their own) programs share their initial state before the first
 * collective (allreduce_app) or only after it (chainps.torch), and a replacement shares what it
 * fetched at once or only after its first collective; before its first share a worker answers
 * CPS_ENOTFOUND.
 * The job's end: workers past their last collective wait in cps_barrier, which releases by the
 * coordinator's rule (recovery/workers_end.c), and then leave (goodbye); views carry the
 * scheduler's word (settled, by the same file's rule), which a replacement's fetch reads. A fetch
 * that says the job has ended (CPS_ESHUTDOWN) is right only once some worker completed the last
 * collective and finished, and while no live worker holds a state (shares one, fetched one or
 * completed the last collective): the asker saw only replacements that never held one.
 * --end-kills: one worker, or two of 4 or more, killed inside the last collective, every one
 * replaced; and, a third of the time, a replacement that fetched the final state or completed
 * the last collective is killed up to 80 ms later and replaced in turn (while the model has a
 * slot for its replacement; a stream of its own, so only the draws after such a kill move):
 * each replacement must fetch the final state or be told the job has ended; any other end of
 * its fetch fails the seed (sim.collective_end; with --old-peers, whose refusals carry no
 * word, seeds must fail: sim.collective_end_catches).
 * --slow: one worker stalls once (its messages leave late, none is lost) for up to 90% of the
 * timeout, moved onto the predecessor of a replacement that a view made listen when there is
 * one; the same checks hold (sim.collective_slow).
 *
 * With --mix-epochs the shell's fencing is undone: a message of an older epoch than the
 * receiver's is relabelled with the receiver's epoch before delivery. Seeds must then fail.
 *
 * usage: sim_collective [--seed N] [--seeds K] [--mix-epochs] [--guess-seq] [--no-adopt]
 * [--old-peers] [--slow] [--slow-parts] [--end-kills]
 * [-v]   (-v with SIM_TRACE=1 in the environment also prints every message delivered)
 */
#include "collective.h"

static uint64_t total_slowed;               /* over all seeds (printed with --slow) */
static uint64_t total_fetches, total_parts; /* replacements' fetches done, parts they took */
/* messages that waited for their receiver's next call, fetch requests among them, and answers
 * given in a completion's loop turn before the share */
static uint64_t total_held, total_held_reqs, total_tail;

/* ---- the checks at the end of a seed ---- */

/* Replacement members of view `v`, as a mask of positions. */
static uint32_t repl_positions(const model *m, const view *v)
{
    uint32_t mask = 0;
    for (uint32_t i = 0; i < v->n; i++) {
        int wi = worker_of(m, v->members[i]);
        if (wi >= 0 && m->w[wi].repl)
            mask |= 1u << i;
    }
    return mask;
}

static void check(model *m)
{
    float ref[MAX_N];
    /* The collective each replacement call's input counted in (0: none yet), by worker and call:
     * one contribution per member, so a call's input may count in one collective only. */
    static uint64_t counted_in[MAX_W][MAX_SEQ + 2];
    memset(counted_in, 0, sizeof counted_in);
    for (uint32_t i = 0; i < m->nrec && !m->v.failed; i++) {
        const record *r = &m->rec[i];
        for (uint32_t k = 0; k < i && !m->w[r->w].killed; k++)
            if (m->rec[k].seq == r->seq && !m->w[m->rec[k].w].killed) {
                if (memcmp(m->rec[k].out, r->out, m->n * sizeof(float)) != 0)
                    sim_fail(&m->v, "collective %" PRIu64 ": workers %u and %u hold different bits",
                             r->seq, m->w[m->rec[k].w].id, m->w[r->w].id);
                break;
            }
        /* Which views' reductions match, with which replacements giving zeros. The workers
         * (by index) whose input of their call counts in every match: their input surely went
         * into this result (a tiny input lost in rounding can match both ways: not counted). */
        int found = 0;
        uint32_t surely = ~0u; /* worker indices, as bits */
        for (uint32_t e = 1; e <= m->nviews; e++) {
            const view *v = &m->views[e];
            uint32_t rp = repl_positions(m, v);
            for (uint32_t z = 0; z <= rp; z++) {
                if ((z & ~rp) || !reference(m, v, r->seq, z, ref) ||
                    memcmp(ref, r->out, m->n * sizeof(float)) != 0)
                    continue;
                found = 1;
                uint32_t used = 0;
                for (uint32_t p = 0; p < v->n; p++)
                    if (((rp & ~z) >> p) & 1)
                        used |= 1u << worker_of(m, v->members[p]);
                surely &= used;
            }
        }
        if (!found && !m->v.failed) {
            sim_fail(&m->v,
                     "worker %u's result of collective %" PRIu64
                     " is no epoch's reduction of its members' inputs",
                     m->w[r->w].id, r->seq);
            break;
        }
        for (uint32_t wi = 0; wi < m->nw && !m->v.failed; wi++) {
            if (!((surely >> wi) & 1) || r->seq > MAX_SEQ)
                continue;
            uint64_t call = m->w[wi].repl_call[r->seq];
            if (call > MAX_SEQ + 1)
                continue;
            if (counted_in[wi][call] && counted_in[wi][call] != r->seq)
                sim_fail(&m->v,
                         "replacement %u's input of its call %" PRIu64
                         " counts in collectives %" PRIu64 " and %" PRIu64 " (twice)",
                         m->w[wi].id, call, counted_in[wi][call], r->seq);
            counted_in[wi][call] = r->seq;
        }
    }
    for (uint32_t i = 0; i < m->nw && !m->v.failed; i++) {
        const worker *w = &m->w[i];
        if (w->exists && w->alive && !w->done)
            sim_fail(&m->v, "worker %u never ended collective %" PRIu64 " (t=%" PRIu64 ")", w->id,
                     w->calls, m->now);
    }
}

static int no_adopt, old_peers, slow_parts, end_kills;
static uint64_t total_job_ends, total_final_fetches, total_left, total_repl_kills;

static int run_seed(uint64_t seed, int mix, int guess, int slow, int verbose, uint64_t *hash,
                    char *why, size_t why_len)
{
    model *m = calloc(1, sizeof *m);
    if (!m)
        return -1;
    m->seed = seed;
    m->rng = seed * 0x2545f4914f6cdd1dull + 7;
    m->mix = mix;
    m->guess = guess;
    m->no_adopt = no_adopt;
    m->old_peers = old_peers;
    m->verbose = verbose;
    m->norig = m->nw = 2 + (uint32_t)rnd(m, MAX_ORIG - 1);
    m->n = 1 + (uint32_t)rnd(m, MAX_N);
    m->chunk = 1 + (uint32_t)rnd(m, rnd(m, 2) ? 4 : MAX_N);
    m->seqs = 2 + (uint32_t)rnd(m, MAX_SEQ - 1);
    m->op = rnd(m, 2) ? CPS_COLL_SUM : CPS_COLL_MEAN;
    uint32_t kills = (uint32_t)rnd(m, m->norig);
    if (end_kills) {
        /* Only the last collective's kills (arm_end_kills): one, or two when two or more
         * others remain to complete it. Drawn from a stream of their own. */
        uint64_t erng = sim_mix64(seed ^ 0xe2d6ull);
        m->end_kills = 1;
        m->end_n = m->norig >= 4 ? 1 + (uint32_t)sim_draw(&erng, 2) : 1;
        m->erng = erng; /* then the kills of replacements (maybe_kill_replacement) */
        kills = 0;
    }
    /* The shared state and its answer: parts of at most half the state, so every fetch comes in
     * several parts, and windows of 1 to 3 parts. Drawn from a stream of their own, so the seeds
     * of --guess-seq (no fetch) run as they did before the fetch was modelled. */
    uint64_t frng = sim_mix64(seed ^ 0xfe7c4ull);
    m->slen = 2 + (uint32_t)sim_draw(&frng, MAX_S - 1);
    m->part = 1 + (uint32_t)sim_draw(&frng, m->slen / 2);
    m->window = 1 + (uint32_t)sim_draw(&frng, 3);
    m->msg_limit = no_adopt ? m->slen + (uint32_t)sim_draw(&frng, m->n) : MAX_S + MAX_N;
    /* The programs around the shells, from a stream of their own. */
    m->prng = sim_mix64(seed ^ 0x9a0c7ull);
    m->share_at_start = (int)sim_draw(&m->prng, 2);
    m->share_after_fetch = (int)sim_draw(&m->prng, 2);
    /* Half the programs compute for up to 3 re-send delays between calls, so that a request
     * waits for the sharer's next call and is asked again meanwhile. */
    m->compute_ms = sim_draw(&m->prng, 2) ? 3 * CPS_FETCH_RESEND_MS : 0;
    if (slow_parts) {
        /* A whole part's time on the pipe: up to 3 re-send delays (a 64 MiB part over 1 GbE
         * takes ~0.54 s), so a part often arrives after its request was sent again. A stream
         * of its own, so the other draws stay as they were. */
        uint64_t prng = sim_mix64(seed ^ 0x5a7f5ull);
        m->part_ms = 1 + sim_draw(&prng, 3 * CPS_FETCH_RESEND_MS);
        /* ... but the whole answer within a third of the fetch's timeout. */
        uint64_t parts = (m->slen + m->n + m->part - 1) / m->part;
        if (m->part_ms * parts > TIMEOUT_MS / 3)
            m->part_ms = TIMEOUT_MS / 3 / parts;
    }
    if (verbose)
        printf("seed %" PRIu64 ": %u workers, %u values, chunk %u, %u collectives, %s, %u kills\n",
               seed, m->norig, m->n, m->chunk, m->seqs, m->op == CPS_COLL_SUM ? "sum" : "mean",
               kills);
    for (uint32_t i = 0; i < m->norig; i++) {
        worker *w = &m->w[i];
        w->id = 10 + i;
        w->rank = i;
        w->exists = w->alive = 1;
        m->in_view[i] = 1;
        if (cps__coll_create(w->id, m->chunk, TIMEOUT_MS, &w->c) != 0) {
            free(m);
            return -1;
        }
    }
    /* View 1, known to all at the start, as the job's first view is. */
    m->nviews = 1;
    m->views[1].n = m->norig;
    for (uint32_t i = 0; i < m->norig; i++)
        m->views[1].members[i] = m->w[i].id;
    for (uint32_t i = 0; i < m->norig; i++) {
        deliver_view(m, i, 1);
        post(m, rnd(m, 30), (event){.type = EV_START, .to = i});
    }
    /* Kills fall anywhere in the job: before, inside (any ring step, any chunk) or between
     * collectives. A ring step takes about 11 ms here. */
    uint64_t span = (uint64_t)m->seqs * 2 * m->norig * 12 * (1 + m->n / (m->chunk * m->norig)) +
                    m->seqs * m->compute_ms / 2;
    uint32_t order[MAX_ORIG];
    for (uint32_t i = 0; i < m->norig; i++)
        order[i] = i;
    for (uint32_t i = m->norig - 1; i > 0; i--) {
        uint32_t j = (uint32_t)rnd(m, i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (uint32_t k = 0; k < kills; k++)
        post(m, rnd(m, span), (event){.type = EV_KILL, .to = order[k]});
    if (slow) {
        /* One worker (an original, or the first replacement) stalls once, anywhere in the
         * job, for up to 90% of the ring's timeout: slow, not dead, so every collective must
         * still end with one epoch's inputs. Long stalls cross the joiner's half-timeout. */
        m->slow = 1;
        m->slow_w = (uint32_t)rnd(m, m->norig + 1);
        m->slow_from = rnd(m, span + 2000);
        m->slow_until = m->slow_from + rnd(m, TIMEOUT_MS * 9 / 10);
        if (verbose)
            printf("  worker index %u stalls from t=%" PRIu64 " to t=%" PRIu64 "\n", m->slow_w,
                   m->slow_from, m->slow_until);
    }
    event e;
    while (!m->v.failed && pop(m, &e)) {
        if (e.t > TIME_LIMIT) {
            sim_fail(&m->v, "simulated time passed %d ms", TIME_LIMIT);
            free(e.vals);
            break;
        }
        m->now = e.t;
        m->events++;
        worker *w = e.type >= 0 && e.to < MAX_W ? &m->w[e.to] : NULL;
        switch (e.type) {
        case EV_MSG:
        case EV_VIEW:
        case EV_FREQ:
            deliver(m, &e); /* now, or at the next call's start */
            break;
        case EV_GETVIEW:
            if (m->in_view[e.from])
                post(m, link_at(m, SCHED, e.from),
                     (event){.type = EV_VIEW, .to = e.from, .epoch = m->nviews});
            break;
        case EV_START:
            start_call(m, e.to);
            break;
        case EV_TICK:
            w->tick_pending = 0;
            if (w->alive && w->running) {
                cps__coll_tick(w->c, m->now);
                perform(m, e.to);
                if (w->running)
                    schedule_tick(m, e.to);
            }
            break;
        case EV_KILL:
            on_kill(m, e.to);
            break;
        case EV_DECLARE:
            on_declare(m, e.to, e.from == 1);
            break;
        case EV_JOIN:
            on_join(m, e.to);
            break;
        case EV_FPART:
            fetch_receive(m, e.to, &e);
            break;
        case EV_FTICK:
            w->ftick_pending = 0;
            fetch_drive(m, e.to);
            break;
        case EV_BARRIER:
            enter_barrier(m, e.to);
            break;
        case EV_BYE:
            on_bye(m, e.to);
            break;
        default:
            break; /* a message that died with its sender */
        }
        free(e.vals);
    }
    while (pop(m, &e))
        free(e.vals);
    if (!m->v.failed)
        check(m);
    for (uint32_t i = 0; i < m->nw; i++) {
        for (uint32_t k = 0; k < m->w[i].nheld; k++)
            free(m->w[i].held[k].vals);
        free(m->w[i].held);
        cps__coll_stats st = {0};
        if (m->w[i].c) {
            cps__coll_stats_get(m->w[i].c, &st);
            m->results_taken += (uint32_t)st.results_taken;
            cps__coll_destroy(m->w[i].c);
        }
    }
    if (verbose)
        printf("  %" PRIu64 " events, %u views, %u results taken from a peer, %u ENOPEER, %u"
               " messages held by a stall\n",
               m->events, m->nviews, m->results_taken, m->enopeer, m->slow_delayed);
    *hash = sim_mix64(m->hash ^ m->events);
    total_slowed += m->slow_delayed;
    total_parts += m->fetch_parts;
    total_fetches += m->fetches;
    total_held += m->held_msgs;
    total_held_reqs += m->held_reqs;
    total_tail += m->tail_answers;
    total_job_ends += m->job_ends;
    total_final_fetches += m->final_fetches;
    total_left += m->left;
    total_repl_kills += m->repl_kills;
    int failed = m->v.failed;
    if (failed)
        snprintf(why, why_len, "%s", m->v.why);
    free(m->heap);
    free(m);
    return failed;
}

int main(int argc, char **argv)
{
    /* This model's own switches beside the shared command line's variant (--mix-epochs). */
    int guess = 0, slow = 0, kept = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--guess-seq"))
            guess = 1;
        else if (!strcmp(argv[i], "--slow"))
            slow = 1;
        else if (!strcmp(argv[i], "--no-adopt"))
            no_adopt = 1;
        else if (!strcmp(argv[i], "--old-peers"))
            old_peers = 1;
        else if (!strcmp(argv[i], "--slow-parts"))
            slow_parts = 1;
        else if (!strcmp(argv[i], "--end-kills"))
            end_kills = 1;
        else
            argv[kept++] = argv[i];
    }
    argc = kept;
    sim_seed_args a;
    if (sim_seed_args_parse(argc, argv, "sim_collective", "--mix-epochs", &a) != 0) {
        fprintf(stderr,
                "  sim_collective also takes --guess-seq, --no-adopt, --old-peers, --slow,\n"
                "  --slow-parts and --end-kills\n");
        return 2;
    }
    sim_seed_tally t = {0, 0};
    for (uint64_t s = a.seed; s < a.seed + a.seeds; s++) {
        char why[512] = "";
        uint64_t h1 = 0, h2 = 0;
        int rc = run_seed(s, a.variant, guess, slow, a.verbose + (a.verbose && getenv("SIM_TRACE")),
                          &h1, why, sizeof why);
        if (rc == 0) {
            /* Determinism: the same seed again gives the same bits at the same moments. */
            rc = run_seed(s, a.variant, guess, slow, 0, &h2, why, sizeof why);
            if (rc == 0 && h1 != h2) {
                snprintf(why, sizeof why,
                         "a second run gave other results (%016" PRIx64 " then %016" PRIx64 ")", h1,
                         h2);
                rc = 1;
            }
        }
        if (sim_seed_count(&t, "sim_collective", s, rc, why) < 0)
            return 1;
    }
    sim_seed_summary(&t, "sim_collective", &a, "--mix-epochs");
    if (slow)
        printf("; %" PRIu64 " messages held back by stalls (both runs)", total_slowed);
    if (!guess)
        printf("; %" PRIu64 " fetches brought a state, in %" PRIu64 " parts (both runs)",
               total_fetches, total_parts);
    printf("; %" PRIu64 " messages waited for a call (%" PRIu64 " fetch requests), %" PRIu64
           " answers before a share (both runs)",
           total_held, total_held_reqs, total_tail);
    printf("; %" PRIu64 " workers left through the barrier, %" PRIu64
           " replacements told the job ended, %" PRIu64 " fetched the final state (both runs)",
           total_left, total_job_ends, total_final_fetches);
    if (end_kills)
        printf("; %" PRIu64 " replacements killed holding the final state (both runs)",
               total_repl_kills);
    return sim_seed_end(&t, &a, "--mix-epochs");
}
