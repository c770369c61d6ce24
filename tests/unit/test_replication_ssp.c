#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "replication/ssp.h"

/* One server (id 1) and up to four workers: ids 10.. with ranks 0..; two ranges. */
static cps__node_info nodes[5];

static void make_view(cps__view *v, uint32_t mode, uint32_t bound, uint32_t workers)
{
    memset(v, 0, sizeof *v);
    memset(nodes, 0, sizeof nodes);
    v->epoch = 2;
    v->mode = mode;
    v->ssp_bound = bound;
    v->num_workers = workers;
    v->nranges = 2;
    v->nnodes = 1 + workers;
    v->nodes = nodes;
    nodes[0] = (cps__node_info){.id = 1, .role = CPS_ROLE_SERVER, .alive = 1};
    for (uint32_t r = 0; r < workers; r++)
        nodes[1 + r] =
            (cps__node_info){.id = 10 + r, .role = CPS_ROLE_WORKER, .alive = 1, .rank = r};
}

static void drop(void *ctx, void *cookie)
{
    (*(int *)ctx)++;
    (*(int *)cookie)++;
}

static cps__ssp *new_gate(int *dropped)
{
    *dropped = 0;
    cps__ssp *g;
    assert_int_equal(cps__ssp_create(drop, dropped, &g), 0);
    return g;
}

static size_t released(cps__ssp *g, void *const **out)
{
    return cps__ssp_released(g, out);
}

static void pull_beyond_the_bound_waits_for_the_slowest_clock(void **state)
{
    (void)state;
    cps__view v;
    make_view(&v, CPS_MODE_SSP, 2, 3);
    int dropped, pull = 0;
    cps__ssp *g = new_gate(&dropped);
    assert_int_equal(cps__ssp_pushed(g, &v, 0, 10, 5), 0);
    /* Workers 11 and 12 are at 0: worker 10 reading at 5 is 5 ahead, the bound is 2. */
    assert_false(cps__ssp_may_proceed(g, &v, 0, 5, 10));
    assert_true(cps__ssp_may_proceed(g, &v, 0, 2, 10));
    assert_int_equal(cps__ssp_park(g, 0, 10, 5, &pull), 0);
    assert_int_equal(cps__ssp_parked(g), 1);
    void *const *out;
    cps__ssp_wake(g, &v);
    assert_int_equal(released(g, &out), 0);
    assert_int_equal(cps__ssp_pushed(g, &v, 0, 11, 4), 0);
    assert_int_equal(cps__ssp_pushed(g, &v, 0, 12, 2), 0);
    cps__ssp_wake(g, &v); /* slowest 2: 2 + 2 < 5 */
    assert_int_equal(released(g, &out), 0);
    /* Another range's clock does not count. */
    assert_int_equal(cps__ssp_pushed(g, &v, 1, 12, 9), 0);
    cps__ssp_wake(g, &v);
    assert_int_equal(released(g, &out), 0);
    assert_int_equal(cps__ssp_pushed(g, &v, 0, 12, 3), 0);
    cps__ssp_wake(g, &v); /* slowest 3: 3 + 2 >= 5 */
    assert_int_equal(released(g, &out), 1);
    assert_ptr_equal(out[0], &pull);
    assert_int_equal(cps__ssp_parked(g), 0);
    cps__ssp_destroy(g);
    assert_int_equal(dropped, 0);
}

static void own_clock_never_holds_back_own_pull(void **state)
{
    (void)state;
    cps__view v;
    make_view(&v, CPS_MODE_SSP, 1, 2);
    int dropped;
    cps__ssp *g = new_gate(&dropped);
    assert_int_equal(cps__ssp_pushed(g, &v, 0, 11, 5), 0);
    /* Worker 10 is at 0 (its push still on the way): its pull at 6 is within 1 of worker 11. */
    assert_true(cps__ssp_may_proceed(g, &v, 0, 6, 10));
    assert_false(cps__ssp_may_proceed(g, &v, 0, 7, 10));
    /* Worker 11's pull is held back by worker 10. */
    assert_false(cps__ssp_may_proceed(g, &v, 0, 5, 11));
    cps__ssp_destroy(g);
}

static void other_modes_never_hold_a_pull(void **state)
{
    (void)state;
    uint32_t modes[] = {CPS_MODE_SYNC, CPS_MODE_ASYNC};
    for (int i = 0; i < 2; i++) {
        cps__view v;
        make_view(&v, modes[i], 0, 2);
        int dropped;
        cps__ssp *g = new_gate(&dropped);
        assert_true(cps__ssp_may_proceed(g, &v, 0, 1000, 10));
        /* A replacement's DECLARE moves no clock outside SSP. */
        assert_int_equal(cps__ssp_pushed(g, &v, 0, 11, 7), 0);
        nodes[1].alive = 0; /* worker 10 (rank 0) died, worker 20 took rank 0 */
        nodes[3] = (cps__node_info){.id = 20, .role = CPS_ROLE_WORKER, .alive = 1, .rank = 0};
        v.nnodes = 4;
        cps__ssp_declared(g, &v, 0, 20);
        assert_int_equal(cps__ssp_clock(g, &v, 0, 20), 0);
        assert_int_equal(cps__ssp_declare_step(g, &v, 0, 20), 0);
        cps__ssp_destroy(g);
    }
}

static void dead_worker_is_not_waited_for(void **state)
{
    (void)state;
    cps__view v;
    make_view(&v, CPS_MODE_SSP, 0, 3);
    int dropped, pull = 0;
    cps__ssp *g = new_gate(&dropped);
    assert_int_equal(cps__ssp_pushed(g, &v, 0, 11, 4), 0);
    assert_int_equal(cps__ssp_park(g, 0, 10, 4, &pull), 0);
    cps__ssp_wake(g, &v);
    void *const *out;
    assert_int_equal(released(g, &out), 0); /* worker 12 is at 0 */
    nodes[3].alive = 0;
    cps__ssp_wake(g, &v);
    assert_int_equal(released(g, &out), 1);
    /* With no other live worker a pull always proceeds. */
    nodes[2].alive = 0;
    assert_true(cps__ssp_may_proceed(g, &v, 0, 1000, 10));
    cps__ssp_destroy(g);
}

/* Worker 10 (rank 0) died; worker 13 took rank 0. */
static void replace_rank0(cps__view *v)
{
    nodes[1].alive = 0;
    nodes[4] = (cps__node_info){.id = 13, .role = CPS_ROLE_WORKER, .alive = 1, .rank = 0};
    v->nnodes = 5;
}

static void replacement_starts_at_the_slowest_clock(void **state)
{
    (void)state;
    cps__view v;
    make_view(&v, CPS_MODE_SSP, 1, 3);
    int dropped;
    cps__ssp *g = new_gate(&dropped);
    assert_int_equal(cps__ssp_pushed(g, &v, 0, 10, 3), 0);
    assert_int_equal(cps__ssp_pushed(g, &v, 0, 11, 8), 0);
    assert_int_equal(cps__ssp_pushed(g, &v, 0, 12, 6), 0);
    replace_rank0(&v);
    /* Before its DECLARE is applied the replacement has no clock and holds nobody back. */
    assert_true(cps__ssp_may_proceed(g, &v, 0, 7, 11));
    assert_int_equal(cps__ssp_declare_step(g, &v, 0, 13), 0);
    cps__ssp_declared(g, &v, 0, 13);
    assert_int_equal(cps__ssp_clock(g, &v, 0, 13), 6);
    assert_int_equal(cps__ssp_declare_step(g, &v, 0, 13), 6);
    assert_false(cps__ssp_may_proceed(g, &v, 0, 8, 11));
    /* A repeated DECLARE does not move a clock that is running. */
    assert_int_equal(cps__ssp_pushed(g, &v, 0, 13, 7), 0);
    assert_int_equal(cps__ssp_pushed(g, &v, 0, 12, 9), 0);
    cps__ssp_declared(g, &v, 0, 13);
    assert_int_equal(cps__ssp_clock(g, &v, 0, 13), 7);
    /* A worker that started with the job answers its DECLARE with 0. */
    assert_int_equal(cps__ssp_declare_step(g, &v, 0, 11), 0);
    cps__ssp_destroy(g);
}

/* The others finished (not alive) while rank 0 was being replaced: the replacement starts at the
 * furthest clock the job reached there, not at 0 (it would train the whole job again alone). */
static void late_replacement_starts_where_the_job_got_to(void **state)
{
    (void)state;
    cps__view v;
    make_view(&v, CPS_MODE_SSP, 1, 3);
    int dropped;
    cps__ssp *g = new_gate(&dropped);
    assert_int_equal(cps__ssp_pushed(g, &v, 0, 10, 3), 0);
    assert_int_equal(cps__ssp_pushed(g, &v, 0, 11, 9), 0);
    assert_int_equal(cps__ssp_pushed(g, &v, 0, 12, 8), 0);
    nodes[2].alive = 0;
    nodes[3].alive = 0;
    replace_rank0(&v);
    cps__ssp_declared(g, &v, 0, 13);
    assert_int_equal(cps__ssp_clock(g, &v, 0, 13), 9);
    cps__ssp_destroy(g);
}

static void an_applied_update_moves_the_clocks_of_its_dense_pushes(void **state)
{
    (void)state;
    cps__view v;
    make_view(&v, CPS_MODE_SSP, 1, 3);
    int dropped;
    cps__ssp *g = new_gate(&dropped);
    assert_int_equal(cps__ssp_pushed(g, &v, 0, 11, 4), 0);
    /* A sync aggregate of workers 10 and 11 at step 6, a sparse push and a restore of 12. */
    cps__chain_req reqs[] = {{10, CPS_MSG_PUSH, 0, 1},
                             {11, CPS_MSG_PUSH_PULL, 0, 2},
                             {12, CPS_MSG_PUSH, 1, 3},
                             {12, CPS_MSG_PUT, 0, 4}};
    cps__chain_update u = {CPS_UPD_PUSH, 6, 0x5, 4, reqs, NULL, 0};
    assert_int_equal(cps__ssp_applied(g, &v, 0, &u), 0);
    assert_int_equal(cps__ssp_clock(g, &v, 0, 10), 6);
    assert_int_equal(cps__ssp_clock(g, &v, 0, 11), 6);
    assert_int_equal(cps__ssp_clock(g, &v, 0, 12), 0);
    assert_int_equal(cps__ssp_clock(g, &v, 1, 10), 0);
    /* A DECLARE of a replacement of worker 12 places it at the slowest of the others (6). */
    nodes[3].alive = 0;
    nodes[4] = (cps__node_info){.id = 13, .role = CPS_ROLE_WORKER, .alive = 1, .rank = 2};
    v.nnodes = 5;
    cps__chain_req d = {13, CPS_MSG_DECLARE, 0, 1};
    cps__chain_update du = {CPS_UPD_DECLARE, 0, 0, 1, &d, NULL, 0};
    assert_int_equal(cps__ssp_applied(g, &v, 0, &du), 0);
    assert_int_equal(cps__ssp_clock(g, &v, 0, 13), 6);
    cps__ssp_destroy(g);
}

static void clocks_only_move_forward_and_reset_with_the_range_count(void **state)
{
    (void)state;
    cps__view v;
    make_view(&v, CPS_MODE_SSP, 1, 2);
    int dropped;
    cps__ssp *g = new_gate(&dropped);
    assert_int_equal(cps__ssp_pushed(g, &v, 1, 10, 5), 0);
    assert_int_equal(cps__ssp_pushed(g, &v, 1, 10, 3), 0); /* a late, older update */
    assert_int_equal(cps__ssp_clock(g, &v, 1, 10), 5);
    assert_int_equal(cps__ssp_pushed(g, &v, 2, 10, 1), CPS_EINVAL);
    assert_int_equal(cps__ssp_pushed(g, &v, 0, CPS_MAX_NODES, 1), CPS_EINVAL);
    v.nranges = 3;
    assert_int_equal(cps__ssp_clock(g, &v, 1, 10), 0);
    cps__ssp_destroy(g);
}

/* A replica copied again forgets the range's clocks (then loads the snapshot's); others stay. */
static void forget_range_clears_only_that_range(void **state)
{
    (void)state;
    cps__view v;
    make_view(&v, CPS_MODE_SSP, 1, 2);
    int dropped;
    cps__ssp *g = new_gate(&dropped);
    cps__ssp_forget_range(g, 0); /* no clocks yet: nothing to forget */
    assert_int_equal(cps__ssp_pushed(g, &v, 0, 10, 5), 0);
    assert_int_equal(cps__ssp_pushed(g, &v, 1, 10, 7), 0);
    cps__ssp_forget_range(g, 0);
    cps__ssp_forget_range(g, 9); /* out of bounds: ignored */
    assert_int_equal(cps__ssp_clock(g, &v, 0, 10), 0);
    assert_int_equal(cps__ssp_clock(g, &v, 1, 10), 7);
    assert_int_equal(cps__ssp_pushed(g, &v, 0, 10, 4), 0); /* loaded from a snapshot */
    assert_int_equal(cps__ssp_clock(g, &v, 0, 10), 4);
    cps__ssp_destroy(g);
}

static void wake_keeps_order_and_destroy_drops_what_is_parked(void **state)
{
    (void)state;
    cps__view v;
    make_view(&v, CPS_MODE_SSP, 0, 2);
    int dropped, p[40] = {0};
    cps__ssp *g = new_gate(&dropped);
    /* Worker 10 parks pulls at clocks 1..20 alternating ranges; worker 11 reaches 10 in range 0. */
    for (int i = 0; i < 40; i++)
        assert_int_equal(cps__ssp_park(g, (uint32_t)(i % 2), 10, (uint64_t)(i / 2 + 1), &p[i]), 0);
    assert_int_equal(cps__ssp_park(g, 0, 10, 1, NULL), CPS_EINVAL);
    assert_int_equal(cps__ssp_pushed(g, &v, 0, 11, 10), 0);
    cps__ssp_wake(g, &v);
    void *const *out;
    size_t n = released(g, &out);
    assert_int_equal(n, 10);
    for (size_t k = 0; k < n; k++)
        assert_ptr_equal(out[k], &p[2 * k]); /* range 0, clocks 1..10, in park order */
    assert_int_equal(cps__ssp_parked(g), 30);
    assert_int_equal(cps__ssp_pushed(g, &v, 1, 11, 1), 0);
    cps__ssp_wake(g, &v);
    n = released(g, &out);
    assert_int_equal(n, 1);
    assert_ptr_equal(out[0], &p[1]);
    cps__ssp_destroy(g);
    assert_int_equal(dropped, 29);
    for (int i = 0; i < 40; i++)
        assert_int_equal(p[i], (i % 2 == 0 && i < 20) || i == 1 ? 0 : 1);
    cps__ssp_destroy(NULL);
    assert_int_equal(cps__ssp_parked(NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pull_beyond_the_bound_waits_for_the_slowest_clock),
        cmocka_unit_test(own_clock_never_holds_back_own_pull),
        cmocka_unit_test(other_modes_never_hold_a_pull),
        cmocka_unit_test(dead_worker_is_not_waited_for),
        cmocka_unit_test(replacement_starts_at_the_slowest_clock),
        cmocka_unit_test(late_replacement_starts_where_the_job_got_to),
        cmocka_unit_test(an_applied_update_moves_the_clocks_of_its_dense_pushes),
        cmocka_unit_test(clocks_only_move_forward_and_reset_with_the_range_count),
        cmocka_unit_test(forget_range_clears_only_that_range),
        cmocka_unit_test(wake_keeps_order_and_destroy_drops_what_is_parked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
