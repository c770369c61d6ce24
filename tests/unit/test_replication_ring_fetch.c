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
    o.what = cps__fetch_next(f, v, m, n, ME, shutdown, now, &o.to, &o.req, &o.result);
    return o;
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
    cps__fetch_start(&f, 100, 0, 5000);
    step_out o = next(&f, &v, ring, 4, 0, 0);
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

    cps__fetch_start(&f, 100, 0, 5000);
    o = next(&f, &v, ring, 4, 0, 0);
    assert_int_equal(cps__fetch_answer(&f, 10, o.req, CPS_ESIZE, 0, 0), 0);
    o = next(&f, &v, ring, 4, 0, 1);
    assert_int_equal(o.what, CPS_FETCH_DONE);
    assert_int_equal(o.result, CPS_ESIZE);

    cps__fetch_start(&f, 100, 0, 5000);
    o = next(&f, &v, ring, 4, 0, 0);
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

    const uint32_t alone[] = {ME};
    cps__fetch_start(&f, 100, 0, 1000);
    o = next(&f, &v, alone, 1, 0, 0);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(asks_the_first_member_resends_and_takes_the_answer),
        cmocka_unit_test(a_member_sharing_nothing_passes_to_the_next),
        cmocka_unit_test(a_dead_member_is_replaced_and_the_fetch_gives_up_in_time),
        cmocka_unit_test(the_sharer_answers_with_what_it_holds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
