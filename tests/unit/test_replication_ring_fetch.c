/* A replacement's fetch of a shared buffer and the sharer's answer (replication/ring_fetch.c):
 * who is asked, when a request goes again, which answers count, and how the fetch ends. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "core/wire.h"
#include "replication/ring_fetch.h"

#define ME 12u

/* Workers 10, 11, ME, 13 (ring order), alive unless named in `dead`. */
static void make(cps__view *v, uint32_t dead)
{
    cps__view_init(v);
    v->nnodes = 4;
    v->nodes = calloc(4, sizeof *v->nodes);
    assert_non_null(v->nodes);
    for (uint32_t i = 0; i < 4; i++)
        v->nodes[i] = (cps__node_info){
            .id = 10 + i, .role = CPS_ROLE_WORKER, .rank = i, .alive = 10 + i != dead};
}

static const uint32_t ring[] = {10, 11, ME, 13};

typedef struct step_out {
    int what, result;
    uint32_t to;
    uint64_t req;
} step_out;

static step_out next(cps__fetch *f, const cps__view *v, const uint32_t *m, uint32_t n, int shutdown,
                     uint64_t now)
{
    step_out o = {0};
    o.what = cps__fetch_next(f, v, m, n, ME, shutdown, 0, now, &o.to, &o.req, &o.result);
    return o;
}

/* As next(), with the scheduler's word that no worker rank awaits a replacement. */
static step_out next_settled(cps__fetch *f, const cps__view *v, const uint32_t *m, uint32_t n,
                             uint64_t now)
{
    step_out o = {0};
    o.what = cps__fetch_next(f, v, m, n, ME, 0, 1, now, &o.to, &o.req, &o.result);
    return o;
}
/* A fetch of 100 values begun over `ring` at time 0 (deadline 5000 ms): its first step, the
 * request to the first member. */
static step_out begin(cps__fetch *f, const cps__view *v)
{
    cps__fetch_start(f, 100, 0, 5000);
    return next(f, v, ring, 4, 0, 0);
}

/* The first member is asked at once, again every CPS_FETCH_RESEND_MS with a new number, and its
 * answer to the latest request ends the fetch with the values. */
static void asks_the_first_member_resends_and_takes_the_answer(void **state)
{
    (void)state;
    cps__view v;
    make(&v, 0);
    cps__fetch f = {0};
    cps__fetch_start(&f, 100, 1000, 5000);
    step_out o = next(&f, &v, ring, 4, 0, 1000);
    assert_int_equal(o.what, CPS_FETCH_SEND);
    assert_int_equal(o.to, 10);
    uint64_t first = o.req;
    assert_int_equal(next(&f, &v, ring, 4, 0, 1000 + CPS_FETCH_RESEND_MS - 1).what, CPS_FETCH_WAIT);
    o = next(&f, &v, ring, 4, 0, 1000 + CPS_FETCH_RESEND_MS);
    assert_int_equal(o.what, CPS_FETCH_SEND);
    assert_int_equal(o.to, 10);
    assert_int_equal(o.req, first + 1);
    /* The answer to the earlier request, or one from another worker: not taken. */
    assert_int_equal(cps__fetch_answer(&f, 10, first, 0, 100, 7), 0);
    assert_int_equal(cps__fetch_answer(&f, 11, first + 1, 0, 100, 7), 0);
    assert_int_equal(next(&f, &v, ring, 4, 0, 1400).what, CPS_FETCH_WAIT);
    assert_int_equal(cps__fetch_answer(&f, 10, first + 1, 0, 120, 7), 1);
    assert_int_equal(f.step, 7);
    /* Taken once: the same answer again is ignored. */
    assert_int_equal(cps__fetch_answer(&f, 10, first + 1, 0, 120, 9), 0);
    o = next(&f, &v, ring, 4, 0, 1401);
    assert_int_equal(o.what, CPS_FETCH_DONE);
    assert_int_equal(o.result, 1);
    assert_int_equal(f.step, 7);
    /* Over: nothing counts any more, and the next fetch's numbers go on growing. */
    assert_int_equal(cps__fetch_answer(&f, 10, first + 1, 0, 120, 7), 0);
    cps__fetch_start(&f, 100, 2000, 5000);
    o = next(&f, &v, ring, 4, 0, 2000);
    assert_int_equal(o.req, first + 2);
    cps__view_fini(&v);
}

/* CPS_ENOTFOUND moves on in ring order, skipping us; past the last member the fetch ends with
 * CPS_ENOTFOUND. Another refusal ends it with that refusal; a short answer with CPS_ESIZE. */
static void a_member_sharing_nothing_passes_to_the_next(void **state)
{
    (void)state;
    cps__view v;
    make(&v, 0);
    cps__fetch f = {0};
    step_out o = begin(&f, &v);
    assert_int_equal(o.to, 10);
    assert_int_equal(cps__fetch_answer(&f, 10, o.req, CPS_ENOTFOUND, 0, 0), 0);
    o = next(&f, &v, ring, 4, 0, 1); /* at once, not after the re-send delay */
    assert_int_equal(o.what, CPS_FETCH_SEND);
    assert_int_equal(o.to, 11);
    assert_int_equal(cps__fetch_answer(&f, 11, o.req, CPS_ENOTFOUND, 0, 0), 0);
    o = next(&f, &v, ring, 4, 0, 2);
    assert_int_equal(o.to, 13); /* not ME */
    assert_int_equal(cps__fetch_answer(&f, 13, o.req, CPS_ENOTFOUND, 0, 0), 0);
    o = next(&f, &v, ring, 4, 0, 3);
    assert_int_equal(o.what, CPS_FETCH_DONE);
    assert_int_equal(o.result, CPS_ENOTFOUND);

    o = begin(&f, &v);
    assert_int_equal(cps__fetch_answer(&f, 10, o.req, CPS_ESIZE, 0, 0), 0);
    o = next(&f, &v, ring, 4, 0, 1);
    assert_int_equal(o.what, CPS_FETCH_DONE);
    assert_int_equal(o.result, CPS_ESIZE);

    o = begin(&f, &v);
    assert_int_equal(cps__fetch_answer(&f, 10, o.req, 0, 99, 0), 0);
    o = next(&f, &v, ring, 4, 0, 1);
    assert_int_equal(o.result, CPS_ESIZE);
    cps__view_fini(&v);
}

/* The member asked died: the re-send goes to the first live member. Nobody left: CPS_ENOPEER.
 * The deadline and the job's end stop it. */
static void a_dead_member_is_replaced_and_the_fetch_gives_up_in_time(void **state)
{
    (void)state;
    cps__view v, dead10;
    make(&v, 0);
    make(&dead10, 10);
    const uint32_t later[] = {11, ME, 13};
    cps__fetch f = {0};
    cps__fetch_start(&f, 100, 0, 1000);
    step_out o = next(&f, &v, ring, 4, 0, 0);
    assert_int_equal(o.to, 10);
    o = next(&f, &dead10, later, 3, 0, CPS_FETCH_RESEND_MS);
    assert_int_equal(o.what, CPS_FETCH_SEND);
    assert_int_equal(o.to, 11);
    o = next(&f, &dead10, later, 3, 0, 2 * CPS_FETCH_RESEND_MS - 1);
    assert_int_equal(o.what, CPS_FETCH_WAIT);
    o = next(&f, &dead10, later, 3, 0, 999);
    assert_int_equal(o.what, CPS_FETCH_SEND);
    assert_int_equal(o.to, 11); /* alive: asked again */
    o = next(&f, &dead10, later, 3, 0, 1000);
    assert_int_equal(o.what, CPS_FETCH_DONE);
    assert_int_equal(o.result, CPS_ETIMEDOUT);

    /* Nobody left, and some rank awaits its replacement: wait for it, asking nobody, until the
     * deadline, then CPS_ENOPEER. */
    const uint32_t alone[] = {ME};
    cps__fetch_start(&f, 100, 0, 1000);
    o = next(&f, &v, alone, 1, 0, 0);
    assert_int_equal(o.what, CPS_FETCH_WAIT);
    o = next(&f, &v, alone, 1, 0, 999);
    assert_int_equal(o.what, CPS_FETCH_WAIT);
    o = next(&f, &v, alone, 1, 0, 1000);
    assert_int_equal(o.what, CPS_FETCH_DONE);
    assert_int_equal(o.result, CPS_ENOPEER);

    cps__fetch_start(&f, 100, 0, 1000);
    o = next(&f, &v, ring, 4, 1, 0);
    assert_int_equal(o.result, CPS_ESHUTDOWN);
    /* Stopped by the shell: an answer no longer counts. */
    cps__fetch_start(&f, 100, 0, 1000);
    o = next(&f, &v, ring, 4, 0, 0);
    cps__fetch_stop(&f);
    assert_int_equal(cps__fetch_answer(&f, 10, o.req, 0, 100, 1), 0);
    cps__view_fini(&v);
    cps__view_fini(&dead10);
}

/* The sharer: nothing shared, another length, or the values with the result of the shared
 * state's own collective when both fit in a message. */
/* The worker we replace died in the job's last all-reduce; the others completed it without
 * it, passed the barrier and left (issue 29). With nobody left to ask, the scheduler's word
 * decides: every other worker finished -> the job's work is done (CPS_ESHUTDOWN, a clean end);
 * some died -> CPS_ENOPEER (their replacements may come). A live member is asked whatever the
 * word, and the sharer leaving under the fetch ends it so too. */
static void nobody_left_because_all_finished_is_the_jobs_end(void **state)
{
    (void)state;
    cps__view v;
    make(&v, 0);
    const uint32_t alone[] = {ME};
    cps__fetch f = {0};
    cps__fetch_start(&f, 100, 0, 1000);
    step_out o = next_settled(&f, &v, alone, 1, 0);
    assert_int_equal(o.what, CPS_FETCH_DONE);
    assert_int_equal(o.result, CPS_ESHUTDOWN);
    assert_int_equal(f.active, 0);

    cps__fetch_start(&f, 100, 0, 1000);
    o = next(&f, &v, alone, 1, 0, 0);
    assert_int_equal(o.what, CPS_FETCH_WAIT); /* some rank awaits its replacement */
    o = next_settled(&f, &v, alone, 1, 1);    /* the word comes: every rank is accounted for */
    assert_int_equal(o.what, CPS_FETCH_DONE);
    assert_int_equal(o.result, CPS_ESHUTDOWN);

    /* Settled, with a live member: it is asked (the word alone ends nothing). */
    cps__fetch_start(&f, 100, 0, 1000);
    o = next_settled(&f, &v, ring, 4, 0);
    assert_int_equal(o.what, CPS_FETCH_SEND);
    assert_int_equal(o.to, 10);
    /* It finished and left before answering (a view without it, and the others): the job's end. */
    cps__view gone;
    make(&gone, 10);
    o = next_settled(&f, &gone, alone, 1, CPS_FETCH_RESEND_MS);
    assert_int_equal(o.what, CPS_FETCH_DONE);
    assert_int_equal(o.result, CPS_ESHUTDOWN);
    /* Its answer, late, no longer counts. */
    assert_int_equal(cps__fetch_answer(&f, 10, o.req, 0, 100, 1), 0);
    cps__view_fini(&gone);
    cps__view_fini(&v);
}

/* A job of `workers` ranks whose live workers are ids 10 + i for the bits i of `alive` (rank i):
 * the others finished or died (the view does not tell them apart; the scheduler's word does). */
static void make_job(cps__view *v, uint32_t alive, uint32_t workers)
{
    make(v, 0);
    v->num_workers = workers;
    for (uint32_t i = 0; i < 4; i++)
        v->nodes[i].alive = (alive >> i) & 1;
}

/* A refusal CPS_ENOTFOUND of `from` to the last request: with the replacement's word or not. */
static void refuse(cps__fetch *f, uint32_t from, uint64_t req, int never_held)
{
    assert_int_equal(
        cps__fetch_answer(f, from, req, CPS_ENOTFOUND, 0, never_held ? CPS_FETCH_NEVER_HELD : 0),
        0);
}

/* The sharer's word: only a replacement that never held a state says it never held one. */
static void only_an_empty_replacement_says_it_never_held_a_state(void **state)
{
    (void)state;
    assert_int_equal(cps__fetch_refusal_step(CPS_ENOTFOUND, 1, 0), CPS_FETCH_NEVER_HELD);
    assert_int_equal(cps__fetch_refusal_step(CPS_ENOTFOUND, 1, 1), 0); /* fetched or shared */
    assert_int_equal(cps__fetch_refusal_step(CPS_ENOTFOUND, 0, 0), 0); /* nothing shared yet */
    assert_int_equal(cps__fetch_refusal_step(CPS_ESIZE, 1, 0), 0);
    assert_int_equal(cps__fetch_refusal_step(0, 1, 0), 0);
}

/* Issue 29: workers ME (rank 2) and 13 (rank 3) of a 5-rank job killed in its last all-reduce;
 * ranks 0, 1 and 4 completed it, passed the barrier and left. ME's replacement comes first:
 * nobody to ask, rank 3 awaits its replacement (no word), so it waits instead of failing. Then
 * 13's replacement is live (the word comes with its view): asked, it says it never held a state,
 * and nobody else is left: the job's work is done. */
static void two_replacements_of_the_last_all_reduce_see_the_jobs_end(void **state)
{
    (void)state;
    cps__view only_me, both;
    make_job(&only_me, 1u << 2, 5);
    make_job(&both, (1u << 2) | (1u << 3), 5);
    const uint32_t alone[] = {ME}, two[] = {ME, 13};
    cps__fetch f = {0};
    cps__fetch_start(&f, 100, 0, 5000);
    step_out o = next(&f, &only_me, alone, 1, 0, 0);
    assert_int_equal(o.what, CPS_FETCH_WAIT);
    o = next(&f, &only_me, alone, 1, 0, CPS_FETCH_RESEND_MS); /* asks again: nobody */
    assert_int_equal(o.what, CPS_FETCH_WAIT);
    /* 13's replacement, alive, before the word: asked at the next round. */
    o = next(&f, &both, two, 2, 0, 2 * CPS_FETCH_RESEND_MS - 1);
    assert_int_equal(o.what, CPS_FETCH_WAIT);
    o = next(&f, &both, two, 2, 0, 2 * CPS_FETCH_RESEND_MS);
    assert_int_equal(o.what, CPS_FETCH_SEND);
    assert_int_equal(o.to, 13);
    refuse(&f, 13, o.req, 1);
    o = next(&f, &both, two, 2, 0, 2 * CPS_FETCH_RESEND_MS + 1);
    assert_int_equal(o.what, CPS_FETCH_WAIT); /* no word yet: ask again later */
    o = next(&f, &both, two, 2, 0, 3 * CPS_FETCH_RESEND_MS + 1);
    assert_int_equal(o.what, CPS_FETCH_SEND);
    assert_int_equal(o.to, 13);
    refuse(&f, 13, o.req, 1);
    o = next_settled(&f, &both, two, 2, 3 * CPS_FETCH_RESEND_MS + 2);
    assert_int_equal(o.what, CPS_FETCH_DONE);
    assert_int_equal(o.result, CPS_ESHUTDOWN);

    /* The word already there when the pass ends: at once. */
    cps__fetch_start(&f, 100, 0, 5000);
    o = next_settled(&f, &both, two, 2, 0);
    assert_int_equal(o.to, 13);
    refuse(&f, 13, o.req, 1);
    o = next_settled(&f, &both, two, 2, 1);
    assert_int_equal(o.what, CPS_FETCH_DONE);
    assert_int_equal(o.result, CPS_ESHUTDOWN);

    /* The word coming while we wait: everybody live is asked again at once, then the end. */
    cps__fetch_start(&f, 100, 0, 5000);
    o = next(&f, &only_me, alone, 1, 0, 0);
    assert_int_equal(o.what, CPS_FETCH_WAIT);
    o = next_settled(&f, &both, two, 2, 1);
    assert_int_equal(o.what, CPS_FETCH_SEND);
    assert_int_equal(o.to, 13);
    refuse(&f, 13, o.req, 1);
    o = next_settled(&f, &both, two, 2, 2);
    assert_int_equal(o.result, CPS_ESHUTDOWN);

    /* Without the word, the wait ends at the deadline: CPS_ENOPEER (a replacement that never
     * came), not a hang. */
    cps__fetch_start(&f, 100, 0, 1000);
    o = next(&f, &both, two, 2, 0, 0);
    refuse(&f, 13, o.req, 1);
    o = next(&f, &both, two, 2, 0, 1);
    assert_int_equal(o.what, CPS_FETCH_WAIT);
    o = next(&f, &both, two, 2, 0, 1000);
    assert_int_equal(o.what, CPS_FETCH_DONE);
    assert_int_equal(o.result, CPS_ENOPEER);
    cps__view_fini(&only_me);
    cps__view_fini(&both);
}

/* What the replacement's word must not turn into the job's end. A member that has shared
 * nothing yet (no word: an older sharer, or a worker before its first share) ends the fetch
 * CPS_ENOTFOUND as before; so do empty replacements holding every rank (every worker died:
 * nobody finished, and the state is lost). A live member holding the state after an empty
 * replacement gives it. The word also comes in a part's refusal. */
static void the_word_ends_the_job_only_when_some_worker_finished(void **state)
{
    (void)state;
    cps__view v, all4;
    make_job(&v, (1u << 2) | (1u << 3), 5);
    make_job(&all4, 0xf, 4);
    const uint32_t two[] = {ME, 13};
    cps__fetch f = {0};
    cps__fetch_start(&f, 100, 0, 5000);
    step_out o = next_settled(&f, &v, two, 2, 0);
    refuse(&f, 13, o.req, 0);
    o = next_settled(&f, &v, two, 2, 1);
    assert_int_equal(o.what, CPS_FETCH_DONE);
    assert_int_equal(o.result, CPS_ENOTFOUND);

    /* Every rank live, all replacements that never held a state. */
    cps__fetch_start(&f, 100, 0, 5000);
    o = next_settled(&f, &all4, ring, 4, 0);
    for (uint32_t k = 0; k < 3; k++) {
        assert_int_equal(o.what, CPS_FETCH_SEND);
        refuse(&f, o.to, o.req, 1);
        o = next_settled(&f, &all4, ring, 4, 1 + k);
    }
    assert_int_equal(o.what, CPS_FETCH_DONE);
    assert_int_equal(o.result, CPS_ENOTFOUND);

    /* 10 an empty replacement, 11 a survivor with the state. */
    cps__fetch_start(&f, 100, 0, 5000);
    o = next_settled(&f, &all4, ring, 4, 0);
    assert_int_equal(o.to, 10);
    refuse(&f, 10, o.req, 1);
    o = next_settled(&f, &all4, ring, 4, 1);
    assert_int_equal(o.to, 11);
    assert_int_equal(cps__fetch_answer(&f, 11, o.req, 0, 100, 9), 1);
    o = next_settled(&f, &all4, ring, 4, 2);
    assert_int_equal(o.result, 1);

    /* In parts: a refusal carries the word in its header step. */
    cps__fetch_start(&f, 100, 0, 5000);
    o = next_settled(&f, &v, two, 2, 0);
    cps__fetch_part w = {.step = CPS_FETCH_NEVER_HELD};
    assert_int_equal(cps__fetch_part_take(&f, 13, o.req, CPS_ENOTFOUND, &w, 1), 0);
    o = next_settled(&f, &v, two, 2, 1);
    assert_int_equal(o.result, CPS_ESHUTDOWN);
    cps__fetch_start(&f, 100, 0, 5000);
    o = next_settled(&f, &v, two, 2, 0);
    w.step = 0;
    assert_int_equal(cps__fetch_part_take(&f, 13, o.req, CPS_ENOTFOUND, &w, 1), 0);
    o = next_settled(&f, &v, two, 2, 1);
    assert_int_equal(o.result, CPS_ENOTFOUND);

    /* The empty replacement asked left the ring before we moved on (it ended the job itself):
     * a new pass over who is left, nobody, and the word: the end. */
    cps__view me_only;
    make_job(&me_only, 1u << 2, 5);
    const uint32_t alone[] = {ME};
    cps__fetch_start(&f, 100, 0, 5000);
    o = next_settled(&f, &v, two, 2, 0);
    refuse(&f, 13, o.req, 1);
    o = next_settled(&f, &me_only, alone, 1, 1);
    assert_int_equal(o.result, CPS_ESHUTDOWN);
    cps__view_fini(&me_only);
    cps__view_fini(&v);
    cps__view_fini(&all4);
}

static void the_sharer_answers_with_what_it_holds(void **state)
{
    (void)state;
    int with = -1;
    assert_int_equal(cps__fetch_serve(0, 100, 4, 1, 4, 100, &with), CPS_ENOTFOUND);
    assert_int_equal(with, 0);
    assert_int_equal(cps__fetch_serve(100, 99, 4, 1, 4, 100, &with), CPS_ESIZE);
    assert_int_equal(with, 0);
    assert_int_equal(cps__fetch_serve(100, 100, 4, 1, 4, 100, &with), 0);
    assert_int_equal(with, 1);
    assert_int_equal(cps__fetch_serve(100, 100, 4, 1, 3, 100, &with), 0); /* another one's */
    assert_int_equal(with, 0);
    assert_int_equal(cps__fetch_serve(100, 100, 4, 0, 4, 100, &with), 0);
    assert_int_equal(with, 0);
    uint64_t fits = CPS_WIRE_MAX_PAYLOAD / sizeof(float) - 100;
    assert_int_equal(cps__fetch_serve(100, 100, 4, 1, 4, fits, &with), 0);
    assert_int_equal(with, 1);
    assert_int_equal(cps__fetch_serve(100, 100, 4, 1, 4, fits + 1, &with), 0);
    assert_int_equal(with, 0);
}

/* A part of gen `gen` (step 7, next collective 5) at `off`, `count` values of `total`. */
static cps__fetch_part part(uint64_t gen, uint64_t off, uint64_t count, uint64_t total, int last)
{
    return (cps__fetch_part){
        .gen = gen, .step = 7, .next = 5, .off = off, .count = count, .total = total, .last = last};
}

/* The sharer cuts an answer of 100 shared values and a 60-value result into parts of 30, 4 per
 * request; the asker takes them in order, asks for the next window as soon as the last part of
 * one is in, and is done only when it holds all 160 values: never before. */
static void a_multi_part_answer_is_assembled(void **state)
{
    (void)state;
    uint64_t total = 0;
    assert_int_equal(cps__fetch_serve_parts(100, 100, 4, 1, 4, 60, 0, &total), 0);
    assert_int_equal(total, 160);
    uint64_t off, count;
    int last;
    uint64_t want_off[] = {0, 30, 60, 90};
    for (uint32_t k = 0; k < 4; k++) {
        assert_int_equal(cps__fetch_part_at(0, total, 30, CPS_FETCH_WINDOW, k, &off, &count, &last),
                         1);
        assert_int_equal(off, want_off[k]);
        assert_int_equal(count, 30);
        assert_int_equal(last, k == 3);
    }
    assert_int_equal(cps__fetch_part_at(0, total, 30, CPS_FETCH_WINDOW, 4, &off, &count, &last), 0);

    cps__view v;
    make(&v, 0);
    cps__fetch f = {0};
    step_out o = begin(&f, &v);
    assert_int_equal(o.what, CPS_FETCH_SEND);
    assert_int_equal(f.ask, 0);
    for (uint32_t k = 0; k < 4; k++) {
        cps__fetch_part p = part(1, 30 * k, 30, 160, k == 3);
        /* Through the wire's prefix and back. */
        unsigned char wire[CPS_FETCH_PART_HDR + 30 * sizeof(float)] = {0};
        cps__fetch_part_encode(wire, &p);
        cps__fetch_part q;
        const float *vals;
        assert_int_equal(cps__fetch_part_decode(wire, sizeof wire, 7, 5, &q, &vals), 0);
        assert_int_equal(q.gen, 1);
        assert_int_equal(q.off, 30 * k);
        assert_int_equal(q.count, 30);
        assert_int_equal(q.total, 160);
        assert_int_equal(q.last, k == 3);
        assert_ptr_equal(vals, (const float *)(wire + CPS_FETCH_PART_HDR));
        assert_int_equal(cps__fetch_part_take(&f, 10, o.req, 0, &q, 10 + k), 1);
        if (k < 3)
            assert_int_equal(next(&f, &v, ring, 4, 0, 10 + k).what, CPS_FETCH_WAIT);
    }
    /* The window is in: the next request goes at once, from value 120, with a new number. */
    step_out o2 = next(&f, &v, ring, 4, 0, 14);
    assert_int_equal(o2.what, CPS_FETCH_SEND);
    assert_int_equal(o2.to, 10);
    assert_int_equal(o2.req, o.req + 1);
    assert_int_equal(f.ask, 120);
    assert_int_equal(cps__fetch_serve_parts(100, 100, 4, 1, 4, 60, 120, &total), 0);
    assert_int_equal(cps__fetch_part_at(120, total, 30, CPS_FETCH_WINDOW, 1, &off, &count, &last),
                     1);
    assert_int_equal(off, 150);
    assert_int_equal(count, 10);
    assert_int_equal(last, 1);
    cps__fetch_part p = part(1, 120, 30, 160, 0);
    assert_int_equal(cps__fetch_part_take(&f, 10, o2.req, 0, &p, 15), 1);
    assert_int_equal(next(&f, &v, ring, 4, 0, 15).what, CPS_FETCH_WAIT); /* 10 values short */
    p = part(1, 150, 10, 160, 1);
    assert_int_equal(cps__fetch_part_take(&f, 10, o2.req, 0, &p, 16), 1);
    o = next(&f, &v, ring, 4, 0, 16);
    assert_int_equal(o.what, CPS_FETCH_DONE);
    assert_int_equal(o.result, 1);
    assert_int_equal(f.step, 7);
    assert_int_equal(f.next, 5);
    assert_int_equal(f.total, 160);
    /* Over: a part again is not taken. */
    assert_int_equal(cps__fetch_part_take(&f, 10, o2.req, 0, &p, 17), 0);
    cps__view_fini(&v);
}

/* Parts of two answers never mix: the sharer shared again between two requests (another gen), or
 * the asker moved to another sharer; what it held is dropped and the answer asked from value 0. */
static void parts_of_two_answers_never_mix(void **state)
{
    (void)state;
    cps__view v, dead10;
    make(&v, 0);
    make(&dead10, 10);
    cps__fetch f = {0};
    step_out o = begin(&f, &v);
    cps__fetch_part p = part(1, 0, 30, 160, 0);
    assert_int_equal(cps__fetch_part_take(&f, 10, o.req, 0, &p, 1), 1);
    p = part(1, 30, 30, 160, 0);
    assert_int_equal(cps__fetch_part_take(&f, 10, o.req, 0, &p, 2), 1);
    /* The rest was lost; asked again from 60, the sharer answers from its new share. */
    o = next(&f, &v, ring, 4, 0, 2 + CPS_FETCH_RESEND_MS);
    assert_int_equal(o.what, CPS_FETCH_SEND);
    assert_int_equal(f.ask, 60);
    p = part(2, 60, 30, 160, 0);
    assert_int_equal(cps__fetch_part_take(&f, 10, o.req, 0, &p, 400), 0);
    /* Asked again at once, from 0. */
    o = next(&f, &v, ring, 4, 0, 400);
    assert_int_equal(o.what, CPS_FETCH_SEND);
    assert_int_equal(f.ask, 0);
    /* Each identity field counts: another step, next collective or total is another answer. */
    p = part(2, 0, 30, 160, 0);
    assert_int_equal(cps__fetch_part_take(&f, 10, o.req, 0, &p, 401), 1);
    p = part(2, 30, 30, 160, 0);
    p.step = 8;
    assert_int_equal(cps__fetch_part_take(&f, 10, o.req, 0, &p, 402), 0);
    o = next(&f, &v, ring, 4, 0, 402);
    assert_int_equal(f.ask, 0);
    p = part(2, 0, 30, 160, 0);
    p.next = 6;
    assert_int_equal(cps__fetch_part_take(&f, 10, o.req, 0, &p, 403), 1);
    p = part(2, 30, 30, 160, 0); /* next 5 again: not the answer held */
    assert_int_equal(cps__fetch_part_take(&f, 10, o.req, 0, &p, 404), 0);
    o = next(&f, &v, ring, 4, 0, 404);
    p = part(3, 0, 100, 100, 1); /* no result this time: another total */
    assert_int_equal(cps__fetch_part_take(&f, 10, o.req, 0, &p, 405), 1);
    o = next(&f, &v, ring, 4, 0, 405);
    assert_int_equal(o.what, CPS_FETCH_DONE);
    assert_int_equal(o.result, 1);
    assert_int_equal(f.gen, 3);
    assert_int_equal(f.total, 100);

    /* Another sharer: 10 died after two parts; 11 is asked from 0, and a late part of 10's is
     * not taken. */
    o = begin(&f, &v);
    uint64_t first = o.req;
    p = part(1, 0, 30, 160, 0);
    assert_int_equal(cps__fetch_part_take(&f, 10, first, 0, &p, 1), 1);
    const uint32_t later[] = {11, ME, 13};
    o = next(&f, &dead10, later, 3, 0, 1 + CPS_FETCH_RESEND_MS);
    assert_int_equal(o.what, CPS_FETCH_SEND);
    assert_int_equal(o.to, 11);
    assert_int_equal(f.ask, 0);
    p = part(1, 30, 30, 160, 0);
    assert_int_equal(cps__fetch_part_take(&f, 10, first, 0, &p, 302), 0);
    p = part(1, 0, 160, 160, 1); /* 11's gen 1 is not 10's */
    assert_int_equal(cps__fetch_part_take(&f, 11, o.req, 0, &p, 303), 1);
    assert_int_equal(next(&f, &dead10, later, 3, 0, 304).result, 1);
    /* A sharer that has gone silent since it refused: the next one starts from 0 too. */
    o = begin(&f, &v);
    p = part(1, 0, 30, 160, 0);
    assert_int_equal(cps__fetch_part_take(&f, 10, o.req, 0, &p, 1), 1);
    assert_int_equal(cps__fetch_part_take(&f, 10, o.req, CPS_ENOTFOUND, &p, 2), 0);
    o = next(&f, &v, ring, 4, 0, 3);
    assert_int_equal(o.to, 11);
    assert_int_equal(f.ask, 0);
    cps__view_fini(&v);
    cps__view_fini(&dead10);
}

/* A part lost (its sharer's pipe cut, or a window sent while the asker was out of memory) leaves
 * a gap: later parts are not taken, and after CPS_FETCH_RESEND_MS without progress the request
 * goes again from the first value missing. A part of the earlier request to the same sharer
 * still counts (the same answer, the same offset: the same values); the re-ask's copy of it is
 * then a duplicate. */
static void a_missing_part_is_asked_again(void **state)
{
    (void)state;
    cps__view v;
    make(&v, 0);
    cps__fetch f = {0};
    step_out o = begin(&f, &v);
    uint64_t first = o.req;
    cps__fetch_part p = part(1, 0, 30, 160, 0);
    assert_int_equal(cps__fetch_part_take(&f, 10, first, 0, &p, 100), 1);
    p = part(1, 60, 30, 160, 0); /* 30..59 lost */
    assert_int_equal(cps__fetch_part_take(&f, 10, first, 0, &p, 101), 0);
    /* Progress at 100 restarted the re-send delay. */
    assert_int_equal(next(&f, &v, ring, 4, 0, 100 + CPS_FETCH_RESEND_MS - 1).what, CPS_FETCH_WAIT);
    o = next(&f, &v, ring, 4, 0, 100 + CPS_FETCH_RESEND_MS);
    assert_int_equal(o.what, CPS_FETCH_SEND);
    assert_int_equal(o.req, first + 1);
    assert_int_equal(f.ask, 30);
    p = part(1, 30, 30, 160, 0);
    assert_int_equal(cps__fetch_part_take(&f, 11, o.req, 0, &p, 500), 0); /* not asked */
    assert_int_equal(cps__fetch_part_take(&f, 10, first, 0, &p, 500), 1); /* the old request's */
    assert_int_equal(cps__fetch_part_take(&f, 10, o.req, 0, &p, 500), 0); /* its copy */
    p = part(1, 60, 100, 160, 1);
    assert_int_equal(cps__fetch_part_take(&f, 10, o.req, 0, &p, 501), 1);
    assert_int_equal(next(&f, &v, ring, 4, 0, 502).result, 1);
    /* A refusal in a part ends the fetch with it; a total below the length is CPS_ESIZE. */
    o = begin(&f, &v);
    assert_int_equal(cps__fetch_part_take(&f, 10, o.req, CPS_ESIZE, &p, 1), 0);
    assert_int_equal(next(&f, &v, ring, 4, 0, 1).result, CPS_ESIZE);
    o = begin(&f, &v);
    p = part(1, 0, 99, 99, 1);
    assert_int_equal(cps__fetch_part_take(&f, 10, o.req, 0, &p, 1), 0);
    assert_int_equal(next(&f, &v, ring, 4, 0, 1).result, CPS_ESIZE);
    cps__view_fini(&v);
}

/* In parts the result goes with the state whatever the size (in one message it stays behind
 * past CPS_WIRE_MAX_PAYLOAD); only the shared state's own result goes. */
static void in_parts_the_result_always_travels(void **state)
{
    (void)state;
    uint64_t big = CPS_WIRE_MAX_PAYLOAD / sizeof(float), total = 0;
    int with = -1;
    assert_int_equal(cps__fetch_serve(100, 100, 4, 1, 4, big, &with), 0);
    assert_int_equal(with, 0);
    assert_int_equal(cps__fetch_serve_parts(100, 100, 4, 1, 4, big, 0, &total), 0);
    assert_int_equal(total, 100 + big);
    assert_int_equal(cps__fetch_serve_parts(100, 100, 4, 1, 3, big, 0, &total), 0);
    assert_int_equal(total, 100);
    assert_int_equal(cps__fetch_serve_parts(100, 100, 4, 0, 4, big, 0, &total), 0);
    assert_int_equal(total, 100);
    assert_int_equal(cps__fetch_serve_parts(0, 100, 4, 1, 4, 10, 0, &total), CPS_ENOTFOUND);
    assert_int_equal(cps__fetch_serve_parts(100, 99, 4, 1, 4, 10, 0, &total), CPS_ESIZE);
    assert_int_equal(cps__fetch_serve_parts(100, 100, 4, 1, 4, 10, 110, &total), CPS_EINVAL);
    /* A part never exceeds the message limit at the default size. */
    assert_true(CPS_FETCH_PART_HDR + CPS_FETCH_PART_VALUES * sizeof(float) <= CPS_WIRE_MAX_PAYLOAD);
}

/* The decoder refuses every prefix it cannot trust. */
static void a_bad_part_is_refused(void **state)
{
    (void)state;
    unsigned char w[CPS_FETCH_PART_HDR + 8] = {0};
    cps__fetch_part p = part(1, 2, 2, 4, 1), q;
    const float *vals;
    cps__fetch_part_encode(w, &p);
    assert_int_equal(cps__fetch_part_decode(w, sizeof w, 0, 0, &q, &vals), 0);
    assert_int_equal(cps__fetch_part_decode(w, CPS_FETCH_PART_HDR - 1, 0, 0, &q, &vals),
                     CPS_EPROTO);
    assert_int_equal(cps__fetch_part_decode(w, sizeof w - 1, 0, 0, &q, &vals), CPS_EPROTO);
    assert_int_equal(cps__fetch_part_decode(w, CPS_FETCH_PART_HDR, 0, 0, &q, &vals), CPS_EPROTO);
    p.total = 3; /* off + count past total */
    cps__fetch_part_encode(w, &p);
    assert_int_equal(cps__fetch_part_decode(w, sizeof w, 0, 0, &q, &vals), CPS_EPROTO);
    p = part(1, UINT64_MAX - 1, 2, UINT64_MAX, 0); /* wraps */
    cps__fetch_part_encode(w, &p);
    assert_int_equal(cps__fetch_part_decode(w, sizeof w, 0, 0, &q, &vals), CPS_EPROTO);
    p = part(1, 2, 2, 4, 1);
    cps__fetch_part_encode(w, &p);
    w[24] |= 2; /* unknown flag */
    assert_int_equal(cps__fetch_part_decode(w, sizeof w, 0, 0, &q, &vals), CPS_EPROTO);
    cps__fetch_part_encode(w, &p);
    w[31] = 1; /* reserved word */
    assert_int_equal(cps__fetch_part_decode(w, sizeof w, 0, 0, &q, &vals), CPS_EPROTO);
}

/* A part that takes longer than CPS_FETCH_RESEND_MS to arrive (64 MiB over 1 GbE: ~0.54 s)
 * still counts after the request went again, so the fetch progresses at the link's pace; the
 * last part of an old request's window asks nothing more while a newer request is out; a part
 * of a request to the sharer asked before the current one never counts. */
static void a_slow_part_of_an_earlier_request_counts(void **state)
{
    (void)state;
    cps__view v;
    make(&v, 0);
    cps__fetch f = {0};
    cps__fetch_start(&f, 100, 0, 60000);
    step_out o = next(&f, &v, ring, 4, 0, 0);
    uint64_t first = o.req;
    uint64_t t = 0;
    /* Three silences: three re-asks, all from value 0. */
    for (int i = 1; i <= 3; i++) {
        t += CPS_FETCH_RESEND_MS;
        o = next(&f, &v, ring, 4, 0, t);
        assert_int_equal(o.what, CPS_FETCH_SEND);
        assert_int_equal(o.req, first + (uint64_t)i);
    }
    /* The first request's window (2 parts) arrives at last. */
    cps__fetch_part p = part(1, 0, 50, 160, 0);
    assert_int_equal(cps__fetch_part_take(&f, 10, first, 0, &p, t + 1), 1);
    p = part(1, 50, 50, 160, 1);
    assert_int_equal(cps__fetch_part_take(&f, 10, first, 0, &p, t + 2), 1);
    /* That window's end is the old request's: the latest is still out, no new ask. */
    assert_int_equal(next(&f, &v, ring, 4, 0, t + 3).what, CPS_FETCH_WAIT);
    /* The latest request's window (from 0) brings the rest. */
    p = part(1, 0, 50, 160, 0);
    assert_int_equal(cps__fetch_part_take(&f, 10, o.req, 0, &p, t + 4), 0); /* a duplicate */
    p = part(1, 100, 60, 160, 1);
    assert_int_equal(cps__fetch_part_take(&f, 10, o.req, 0, &p, t + 5), 1);
    assert_int_equal(next(&f, &v, ring, 4, 0, t + 6).result, 1);
    /* Another sharer: requests to the one asked before it no longer count. */
    cps__view dead10;
    make(&dead10, 10);
    const uint32_t later[] = {11, ME, 13};
    cps__fetch_start(&f, 100, 0, 60000);
    o = next(&f, &v, ring, 4, 0, 0);
    first = o.req;
    o = next(&f, &dead10, later, 3, 0, CPS_FETCH_RESEND_MS);
    assert_int_equal(o.to, 11);
    p = part(1, 0, 50, 160, 0);
    assert_int_equal(cps__fetch_part_take(&f, 11, first, 0, &p, 400), 0);
    assert_int_equal(cps__fetch_part_take(&f, 10, first, 0, &p, 400), 0);
    assert_int_equal(cps__fetch_part_take(&f, 11, o.req, 0, &p, 400), 1);
    /* A refusal counts only as the answer to the latest request. */
    uint64_t second = o.req;
    o = next(&f, &dead10, later, 3, 0, 400 + CPS_FETCH_RESEND_MS);
    assert_int_equal(o.req, second + 1);
    assert_int_equal(cps__fetch_part_take(&f, 11, second, CPS_ENOTFOUND, &p, 800), 0);
    assert_int_equal(next(&f, &dead10, later, 3, 0, 801).what, CPS_FETCH_WAIT);
    cps__view_fini(&v);
    cps__view_fini(&dead10);
}

/* A total the asker could never hold (2^32 values or more past its length: a forged or corrupt
 * part) is refused before anything is sized by it, and a stray part is not wanted. */
static void an_impossible_total_is_refused(void **state)
{
    (void)state;
    cps__view v;
    make(&v, 0);
    cps__fetch f = {0};
    step_out o = begin(&f, &v);
    cps__fetch_part p = part(1, 0, 1, 100 + (1ull << 62) + 1, 0);
    assert_int_equal(cps__fetch_part_wanted(&f, 10, o.req, &p), 0);
    p.total = 100 + (1ull << 32);
    assert_int_equal(cps__fetch_part_wanted(&f, 10, o.req, &p), 0);
    p.total = 100 + (1ull << 32) - 1;
    assert_int_equal(cps__fetch_part_wanted(&f, 10, o.req, &p), 1);
    assert_int_equal(cps__fetch_part_wanted(&f, 11, o.req, &p), 0);
    assert_int_equal(cps__fetch_part_wanted(&f, 10, o.req + 1, &p), 0);
    p.total = 99;
    assert_int_equal(cps__fetch_part_wanted(&f, 10, o.req, &p), 0);
    p.total = 100 + (1ull << 62) + 1;
    assert_int_equal(cps__fetch_part_take(&f, 10, o.req, 0, &p, 1), 0);
    assert_int_equal(next(&f, &v, ring, 4, 0, 2).result, CPS_EPROTO);
    cps__view_fini(&v);
}

/* A part's values split at the state's end: the state's first, then the result's. */
static void a_part_splits_at_the_state_end(void **state)
{
    (void)state;
    uint64_t ns = 9, ro = 9;
    cps__fetch_part_split(0, 30, 100, &ns, &ro); /* all state */
    assert_int_equal(ns, 30);
    assert_int_equal(ro, 0);
    cps__fetch_part_split(90, 30, 100, &ns, &ro); /* across */
    assert_int_equal(ns, 10);
    assert_int_equal(ro, 0);
    cps__fetch_part_split(100, 30, 100, &ns, &ro); /* all result */
    assert_int_equal(ns, 0);
    assert_int_equal(ro, 0);
    cps__fetch_part_split(130, 30, 100, &ns, &ro);
    assert_int_equal(ns, 0);
    assert_int_equal(ro, 30);
    cps__fetch_part_split(70, 30, 100, &ns, &ro); /* ends at the state's end */
    assert_int_equal(ns, 30);
    assert_int_equal(ro, 0);
    cps__fetch_part_split(UINT64_MAX - 5, 5, 100, &ns, &ro); /* no wrap */
    assert_int_equal(ns, 0);
    assert_int_equal(ro, UINT64_MAX - 105);
    cps__fetch_part_split(5, 10, UINT64_MAX, &ns, &ro);
    assert_int_equal(ns, 10);
}

/* A request resumed from value 60 of an answer that the sharer replaced with a shorter one (50
 * values: a new state whose result is not its own) is refused CPS_EINVAL: the asker starts the
 * new answer over from 0 instead of giving up. */
static void a_resume_past_a_shorter_answer_starts_over(void **state)
{
    (void)state;
    cps__view v;
    make(&v, 0);
    cps__fetch f = {0};
    cps__fetch_start(&f, 50, 0, 5000);
    step_out o = next(&f, &v, ring, 4, 0, 0);
    cps__fetch_part p = part(1, 0, 60, 110, 1); /* the state and a 60-value result, window 1 */
    assert_int_equal(cps__fetch_part_take(&f, 10, o.req, 0, &p, 1), 1);
    o = next(&f, &v, ring, 4, 0, 2);
    assert_int_equal(o.what, CPS_FETCH_SEND);
    assert_int_equal(f.ask, 60);
    uint64_t total = 0;
    /* The sharer shared again; its new state's result is not its own: 50 values. */
    assert_int_equal(cps__fetch_serve_parts(50, 50, 5, 1, 4, 60, f.ask, &total), CPS_EINVAL);
    assert_int_equal(cps__fetch_part_take(&f, 10, o.req, CPS_EINVAL, &p, 3), 0);
    o = next(&f, &v, ring, 4, 0, 4);
    assert_int_equal(o.what, CPS_FETCH_SEND);
    assert_int_equal(f.ask, 0);
    p = part(2, 0, 50, 50, 1);
    assert_int_equal(cps__fetch_part_take(&f, 10, o.req, 0, &p, 5), 1);
    assert_int_equal(next(&f, &v, ring, 4, 0, 6).result, 1);
    assert_int_equal(f.total, 50);
    /* From value 0 CPS_EINVAL is a refusal like any other. */
    cps__fetch_start(&f, 50, 0, 5000);
    o = next(&f, &v, ring, 4, 0, 0);
    assert_int_equal(cps__fetch_part_take(&f, 10, o.req, CPS_EINVAL, &p, 1), 0);
    assert_int_equal(next(&f, &v, ring, 4, 0, 2).result, CPS_EINVAL);
    cps__view_fini(&v);
}

/* After a restart (the sharer shared again), a late first part of the dropped answer, answering
 * a request older than the restart, does not begin another assembly of that answer. */
static void a_dropped_answer_does_not_begin_again(void **state)
{
    (void)state;
    cps__view v;
    make(&v, 0);
    cps__fetch f = {0};
    step_out o = begin(&f, &v);
    uint64_t first = o.req;
    cps__fetch_part p = part(1, 0, 30, 160, 0);
    assert_int_equal(cps__fetch_part_take(&f, 10, first, 0, &p, 1), 1);
    o = next(&f, &v, ring, 4, 0, 1 + CPS_FETCH_RESEND_MS); /* the rest lost: asked from 30 */
    assert_int_equal(f.ask, 30);
    p = part(2, 30, 30, 160, 0); /* shared again meanwhile: the parts held are dropped */
    assert_int_equal(cps__fetch_part_take(&f, 10, o.req, 0, &p, 400), 0);
    p = part(1, 0, 30, 160, 0); /* the first request's part, again (a re-sent copy, late) */
    assert_int_equal(cps__fetch_part_take(&f, 10, first, 0, &p, 401), 0);
    assert_false(f.has_id);
    cps__view_fini(&v);
}

/* The sharer sends a window once per asker: a re-ask from inside it is skipped until it is past
 * or CPS_FETCH_SERVING_MS old; askers are remembered apart, the oldest forgotten first. */
static void a_window_on_its_way_is_not_sent_again(void **state)
{
    (void)state;
    cps__fetch_served s[CPS_FETCH_SERVED_ASKERS] = {{0}};
    assert_int_equal(cps__fetch_serve_again(s, 20, 1, 0, 0), 1);
    cps__fetch_served_note(s, 20, 1, 0, 120, 10);
    assert_int_equal(cps__fetch_serve_again(s, 20, 1, 0, 300), 0);
    assert_int_equal(cps__fetch_serve_again(s, 20, 1, 119, 300), 0);
    assert_int_equal(cps__fetch_serve_again(s, 20, 1, 120, 300), 1); /* the next window */
    assert_int_equal(cps__fetch_serve_again(s, 20, 2, 0, 300), 1);   /* another answer */
    assert_int_equal(cps__fetch_serve_again(s, 21, 1, 0, 300), 1);   /* another asker */
    assert_int_equal(cps__fetch_serve_again(s, 20, 1, 0, 10 + CPS_FETCH_SERVING_MS), 1);
    for (uint32_t i = 0; i < CPS_FETCH_SERVED_ASKERS - 1; i++)
        cps__fetch_served_note(s, 30 + i, 1, 0, 120, 20 + i);
    assert_int_equal(cps__fetch_serve_again(s, 20, 1, 0, 300), 0);
    assert_int_equal(cps__fetch_serve_again(s, 30, 1, 0, 300), 0);
    cps__fetch_served_note(s, 20, 1, 120, 240, 40); /* its entry, not a new one */
    assert_int_equal(cps__fetch_serve_again(s, 30, 1, 0, 300), 0);
    cps__fetch_served_note(s, 1000, 1, 0, 120, 50); /* one asker too many: 30, the oldest, goes */
    assert_int_equal(cps__fetch_serve_again(s, 30, 1, 0, 300), 1);
    assert_int_equal(cps__fetch_serve_again(s, 20, 1, 130, 300), 0);
}

/* Issue 29, review: the member asked dies, and the pass begins again from the first member
 * without what the old pass counted. 10, before its last share, refused plainly; 11, asked
 * next, died; 10 then finished and left. The new pass finds only 13, an empty replacement:
 * with the word and a rank finished, the job's end (a plain refusal carried over from the old
 * pass made it CPS_ENOTFOUND, and the job failed). */
static void a_refusal_before_a_dying_member_does_not_outlive_the_pass(void **state)
{
    (void)state;
    cps__view all4, after;
    make_job(&all4, 0xf, 4);
    make_job(&after, (1u << 2) | (1u << 3), 4); /* 10 finished, 11 died */
    const uint32_t two[] = {ME, 13};
    cps__fetch f = {0};
    cps__fetch_start(&f, 100, 0, 5000);
    step_out o = next_settled(&f, &all4, ring, 4, 0);
    assert_int_equal(o.to, 10);
    refuse(&f, 10, o.req, 0);
    o = next_settled(&f, &all4, ring, 4, 1);
    assert_int_equal(o.what, CPS_FETCH_SEND);
    assert_int_equal(o.to, 11);
    o = next_settled(&f, &after, two, 2, 1 + CPS_FETCH_RESEND_MS);
    assert_int_equal(o.what, CPS_FETCH_SEND);
    assert_int_equal(o.to, 13);
    refuse(&f, 13, o.req, 1);
    o = next_settled(&f, &after, two, 2, 2 + CPS_FETCH_RESEND_MS);
    assert_int_equal(o.what, CPS_FETCH_DONE);
    assert_int_equal(o.result, CPS_ESHUTDOWN);

    /* The same with 11 gone from the view altogether. */
    cps__view gone;
    make_job(&gone, (1u << 2) | (1u << 3), 4);
    gone.nodes[1].id = 99;
    cps__fetch_start(&f, 100, 0, 5000);
    o = next_settled(&f, &all4, ring, 4, 0);
    refuse(&f, 10, o.req, 0);
    o = next_settled(&f, &all4, ring, 4, 1);
    assert_int_equal(o.to, 11);
    o = next_settled(&f, &gone, two, 2, 1 + CPS_FETCH_RESEND_MS);
    assert_int_equal(o.to, 13);
    refuse(&f, 13, o.req, 1);
    o = next_settled(&f, &gone, two, 2, 2 + CPS_FETCH_RESEND_MS);
    assert_int_equal(o.result, CPS_ESHUTDOWN);

    /* While 10 is still in the ring, its plain refusal in the new pass still ends the fetch
     * CPS_ENOTFOUND (it will share; nothing to wait for). */
    cps__view no11;
    make_job(&no11, 0xd, 4);
    const uint32_t three[] = {10, ME, 13};
    cps__fetch_start(&f, 100, 0, 5000);
    o = next_settled(&f, &all4, ring, 4, 0);
    refuse(&f, 10, o.req, 0);
    o = next_settled(&f, &all4, ring, 4, 1);
    o = next_settled(&f, &no11, three, 3, 1 + CPS_FETCH_RESEND_MS);
    assert_int_equal(o.to, 10);
    refuse(&f, 10, o.req, 0);
    o = next_settled(&f, &no11, three, 3, 2 + CPS_FETCH_RESEND_MS);
    assert_int_equal(o.to, 13);
    refuse(&f, 13, o.req, 1);
    o = next_settled(&f, &no11, three, 3, 3 + CPS_FETCH_RESEND_MS);
    assert_int_equal(o.result, CPS_ENOTFOUND);
    cps__view_fini(&all4);
    cps__view_fini(&after);
    cps__view_fini(&gone);
    cps__view_fini(&no11);
}

/* Issue 29, review: a pass ended with only empty replacements and no word (a rank awaited its
 * replacement), so the fetch waited. A later pass reaches a member that answers otherwise; if
 * the fetch then runs out of time, that member's silence is the cause: CPS_ETIMEDOUT, not
 * CPS_ENOPEER (which says the awaited replacement never came). */
static void a_member_answering_after_a_wait_owns_the_deadline(void **state)
{
    (void)state;
    cps__view both, three_live;
    make_job(&both, (1u << 2) | (1u << 3), 5);
    make_job(&three_live, (1u << 0) | (1u << 2) | (1u << 3), 5);
    const uint32_t two[] = {ME, 13}, three[] = {10, ME, 13};

    /* 13 said it never held a state; asked again, it fetched one meanwhile and answers in parts,
     * then falls silent. */
    cps__fetch f = {0};
    cps__fetch_start(&f, 100, 0, 1000);
    step_out o = next(&f, &both, two, 2, 0, 0);
    refuse(&f, 13, o.req, 1);
    o = next(&f, &both, two, 2, 0, 1);
    assert_int_equal(o.what, CPS_FETCH_WAIT);
    o = next(&f, &both, two, 2, 0, 1 + CPS_FETCH_RESEND_MS);
    assert_int_equal(o.what, CPS_FETCH_SEND);
    assert_int_equal(o.to, 13);
    cps__fetch_part p = part(1, 0, 50, 100, 0);
    assert_int_equal(cps__fetch_part_take(&f, 13, o.req, 0, &p, 2 + CPS_FETCH_RESEND_MS), 1);
    o = next(&f, &both, two, 2, 0, 1000);
    assert_int_equal(o.what, CPS_FETCH_DONE);
    assert_int_equal(o.result, CPS_ETIMEDOUT);

    /* 10 joins the ring and refuses plainly (it will share); 13, asked next, is silent. */
    cps__fetch_start(&f, 100, 0, 1000);
    o = next(&f, &both, two, 2, 0, 0);
    refuse(&f, 13, o.req, 1);
    o = next(&f, &both, two, 2, 0, 1);
    o = next(&f, &three_live, three, 3, 0, 1 + CPS_FETCH_RESEND_MS);
    assert_int_equal(o.to, 10);
    refuse(&f, 10, o.req, 0);
    o = next(&f, &three_live, three, 3, 0, 2 + CPS_FETCH_RESEND_MS);
    assert_int_equal(o.to, 13);
    o = next(&f, &three_live, three, 3, 0, 1000);
    assert_int_equal(o.result, CPS_ETIMEDOUT);

    /* Only never-held refusals since the wait: still the replacement that never came. */
    cps__fetch_start(&f, 100, 0, 1000);
    o = next(&f, &both, two, 2, 0, 0);
    refuse(&f, 13, o.req, 1);
    o = next(&f, &both, two, 2, 0, 1);
    o = next(&f, &both, two, 2, 0, 1 + CPS_FETCH_RESEND_MS);
    assert_int_equal(o.to, 13);
    refuse(&f, 13, o.req, 1);
    o = next(&f, &both, two, 2, 0, 2 + CPS_FETCH_RESEND_MS);
    assert_int_equal(o.what, CPS_FETCH_WAIT);
    o = next(&f, &both, two, 2, 0, 1000);
    assert_int_equal(o.result, CPS_ENOPEER);
    cps__view_fini(&both);
    cps__view_fini(&three_live);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(asks_the_first_member_resends_and_takes_the_answer),
        cmocka_unit_test(a_member_sharing_nothing_passes_to_the_next),
        cmocka_unit_test(a_dead_member_is_replaced_and_the_fetch_gives_up_in_time),
        cmocka_unit_test(nobody_left_because_all_finished_is_the_jobs_end),
        cmocka_unit_test(only_an_empty_replacement_says_it_never_held_a_state),
        cmocka_unit_test(two_replacements_of_the_last_all_reduce_see_the_jobs_end),
        cmocka_unit_test(the_word_ends_the_job_only_when_some_worker_finished),
        cmocka_unit_test(the_sharer_answers_with_what_it_holds),
        cmocka_unit_test(a_multi_part_answer_is_assembled),
        cmocka_unit_test(parts_of_two_answers_never_mix),
        cmocka_unit_test(a_missing_part_is_asked_again),
        cmocka_unit_test(in_parts_the_result_always_travels),
        cmocka_unit_test(a_bad_part_is_refused),
        cmocka_unit_test(a_slow_part_of_an_earlier_request_counts),
        cmocka_unit_test(an_impossible_total_is_refused),
        cmocka_unit_test(a_part_splits_at_the_state_end),
        cmocka_unit_test(a_resume_past_a_shorter_answer_starts_over),
        cmocka_unit_test(a_window_on_its_way_is_not_sent_again),
        cmocka_unit_test(a_dropped_answer_does_not_begin_again),
        cmocka_unit_test(a_refusal_before_a_dying_member_does_not_outlive_the_pass),
        cmocka_unit_test(a_member_answering_after_a_wait_owns_the_deadline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
