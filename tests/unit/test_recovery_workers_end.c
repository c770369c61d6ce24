/* The scheduler's rules for the end of a job's workers (recovery/workers_end.c): when a barrier
 * releases, and whether every worker rank is accounted for (the word CPS_VIEW_WORKERS_SETTLED),
 * over a list of worker records as the coordinator and sim_collective give them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "recovery/workers_end.h"

/* Records; rank UINT32_MAX marks another node's (a server's). */
typedef struct list {
    cps__worker_mark w[8];
    uint32_t n;
} list;

static int at(const void *ctx, uint32_t i, cps__worker_mark *out)
{
    const list *l = ctx;
    if (l->w[i].rank == UINT32_MAX)
        return 0;
    *out = l->w[i];
    return 1;
}

/* Issue 29's job: 5 ranks, 3 and 4 killed in the last all-reduce, 0 to 2 completed it. */
static void two_kills_in_the_last_all_reduce(void **state)
{
    (void)state;
    unsigned char held[5];
    list l = {.n = 6,
              .w = {{.rank = 0, .alive = 1, .in_barrier = 1},
                    {.rank = UINT32_MAX},
                    {.rank = 1, .alive = 1, .in_barrier = 1},
                    {.rank = 2, .alive = 1},
                    {.rank = 3, .alive = 0},
                    {.rank = 4, .alive = 0}}};
    /* Rank 2 still computes: the barrier waits for it; the dead do not hold it up. */
    assert_int_equal(cps__workers_barrier_releases(l.n, at, &l), 0);
    l.w[3].in_barrier = 1;
    assert_int_equal(cps__workers_barrier_releases(l.n, at, &l), 1);
    /* Ranks 3 and 4 await replacements: not settled, the lowest is named. */
    assert_int_equal(cps__workers_unfinished_dead_rank(l.n, at, &l, 5, held), 3);
    /* The survivors leave (goodbye: done, no longer alive); rank 3's replacement joins. */
    for (uint32_t i = 0; i < 4; i++)
        l.w[i] = (cps__worker_mark){.rank = l.w[i].rank, .done = 1};
    l.w[l.n++] = (cps__worker_mark){.rank = 3, .alive = 1};
    assert_int_equal(cps__workers_unfinished_dead_rank(l.n, at, &l, 5, held), 4);
    /* A live replacement not in the barrier holds it up. */
    assert_int_equal(cps__workers_barrier_releases(l.n, at, &l), 0);
    l.w[l.n++] = (cps__worker_mark){.rank = 4, .alive = 1};
    assert_int_equal(cps__workers_unfinished_dead_rank(l.n, at, &l, 5, held), UINT32_MAX);
    /* Nobody live and unfinished: no barrier to release. */
    list none = {.n = 2, .w = {{.rank = 0, .done = 1}, {.rank = 1, .alive = 0}}};
    assert_int_equal(cps__workers_barrier_releases(none.n, at, &none), 0);
    /* A rank past num_workers counts for nothing. */
    list over = {.n = 1, .w = {{.rank = 7, .alive = 1}}};
    assert_int_equal(cps__workers_unfinished_dead_rank(over.n, at, &over, 1, held), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(two_kills_in_the_last_all_reduce),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
