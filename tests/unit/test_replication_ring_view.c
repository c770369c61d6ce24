/* The all-reduce ring's membership under a view (replication/ring_view.c): who is in the ring,
 * in which order, and who is a replacement. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "replication/ring_view.h"

/* A view of one server (id 1) and workers given as {id, rank, alive}. */
static void make(cps__view *v, const uint32_t (*w)[3], uint32_t nw)
{
    cps__view_init(v);
    v->nnodes = 1 + nw;
    v->nodes = calloc(v->nnodes, sizeof *v->nodes);
    assert_non_null(v->nodes);
    v->nodes[0] = (cps__node_info){.id = 1, .role = CPS_ROLE_SERVER, .alive = 1};
    for (uint32_t i = 0; i < nw; i++)
        v->nodes[1 + i] = (cps__node_info){
            .id = w[i][0], .role = CPS_ROLE_WORKER, .rank = w[i][1], .alive = w[i][2]};
}

/* Live workers in rank order, whatever their order in the view; a dead one is out, and so is a
 * dead one another took the rank of. Ties of rank go by id. */
static void members_are_the_live_workers_by_rank(void **state)
{
    (void)state;
    const uint32_t w[][3] = {{7, 2, 1}, {5, 0, 1}, {6, 1, 0}, {9, 1, 1}, {8, 3, 1}, {4, 3, 1}};
    cps__view v;
    make(&v, w, 6);
    uint32_t m[8];
    uint32_t n = cps__ring_members(&v, m, 8);
    assert_int_equal(n, 5);
    const uint32_t want[] = {5, 9, 7, 4, 8};
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(m[i], want[i]);
    assert_int_equal(cps__ring_members(&v, m, 2), 2); /* cut at cap */
    /* Worker 6 (dead, rank 1) is superseded by 9: its peer goes; a live one's does not, nor
     * ours, nor a server's. */
    assert_true(cps__ring_gone(&v, &v.nodes[3], 5));
    assert_false(cps__ring_gone(&v, &v.nodes[3], 6));
    assert_false(cps__ring_gone(&v, &v.nodes[1], 5));
    assert_false(cps__ring_gone(&v, &v.nodes[0], 5));
    cps__view_fini(&v);
}

/* A worker that took a dead worker's rank is a replacement; the first of a rank is not, nor a
 * worker the view does not hold. */
static void a_replacement_took_a_dead_workers_rank(void **state)
{
    (void)state;
    const uint32_t w[][3] = {{5, 0, 1}, {6, 1, 0}, {9, 1, 1}};
    cps__view v;
    make(&v, w, 3);
    assert_true(cps__ring_replacement(&v, 9));
    assert_false(cps__ring_replacement(&v, 5));
    assert_false(cps__ring_replacement(&v, 6)); /* the dead one supersedes nobody */
    assert_false(cps__ring_replacement(&v, 42));
    cps__view_fini(&v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(members_are_the_live_workers_by_rank),
        cmocka_unit_test(a_replacement_took_a_dead_workers_rank),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
