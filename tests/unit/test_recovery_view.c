#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "recovery/view_change.h"

/* A view of 4 servers (ids 1..4) and one worker (id 9), 4 ranges on chains of `R`. */
static void make_view(cps__view *v, uint32_t R)
{
    static const uint32_t servers[] = {1, 2, 3, 4};
    cps__view_init(v);
    v->epoch = 5;
    v->nnodes = 5;
    v->nodes = calloc(5, sizeof *v->nodes);
    for (uint32_t i = 0; i < 5; i++) {
        v->nodes[i].id = i < 4 ? i + 1 : 9;
        v->nodes[i].role = i < 4 ? CPS_ROLE_SERVER : CPS_ROLE_WORKER;
        v->nodes[i].alive = 1;
        v->nodes[i].rank = i < 4 ? i : 0;
        snprintf(v->nodes[i].addr, sizeof v->nodes[i].addr, "tcp://127.0.0.1:%u", 2000 + i);
    }
    v->num_servers = 4;
    v->num_workers = 1;
    v->replicas = R;
    assert_int_equal(cps__view_place_ranges(v, 4, servers, 4, R), 0);
}

static void dead_server_leaves_every_chain_in_order(void **state)
{
    (void)state;
    cps__view v, w;
    make_view(&v, 3);
    cps__view_init(&w);
    uint32_t lost = 99;
    assert_int_equal(cps__view_without(&v, 2, &w, &lost), 0);
    assert_int_equal(w.epoch, 6);
    assert_int_equal(lost, 0);
    assert_false(cps__view_node(&w, 2)->alive);
    for (uint32_t r = 0; r < w.nranges; r++) {
        /* Every chain lost node 2 if it had it, and kept the others in their order. */
        uint32_t k = 0;
        for (uint32_t j = 0; j < v.ranges[r].chain_len; j++)
            if (v.ranges[r].chain[j] != 2)
                assert_int_equal(w.ranges[r].chain[k++], v.ranges[r].chain[j]);
        assert_int_equal(w.ranges[r].chain_len, k);
    }
    /* Range 1 was 2 -> 3 -> 4: its head died, the successor is head. */
    assert_int_equal(w.ranges[1].chain[0], 3);
    /* Range 0 was 1 -> 2 -> 3: the middle died; 1 now links to 3. */
    assert_int_equal(w.ranges[0].chain[0], 1);
    assert_int_equal(w.ranges[0].chain[1], 3);
    cps__view_fini(&v);
    cps__view_fini(&w);
}

static void last_replica_stays_and_range_is_reported_lost(void **state)
{
    (void)state;
    cps__view v, w;
    make_view(&v, 1);
    cps__view_init(&w);
    uint32_t lost = 0;
    assert_int_equal(cps__view_without(&v, 3, &w, &lost), 0);
    assert_int_equal(lost, 1);
    assert_int_equal(w.ranges[2].chain_len, 1);
    assert_int_equal(w.ranges[2].chain[0], 3);
    assert_false(cps__view_range_available(&w, 2));
    assert_true(cps__view_range_available(&w, 1));
    assert_int_equal(cps__view_without(&v, 77, &w, NULL), CPS_ENOTFOUND);
    cps__view_fini(&v);
    cps__view_fini(&w);
}

static void dead_worker_keeps_chains(void **state)
{
    (void)state;
    cps__view v, w;
    make_view(&v, 2);
    cps__view_init(&w);
    assert_int_equal(cps__view_without(&v, 9, &w, NULL), 0);
    assert_false(cps__view_node(&w, 9)->alive);
    for (uint32_t r = 0; r < w.nranges; r++)
        assert_int_equal(w.ranges[r].chain_len, 2);
    cps__view_fini(&v);
    cps__view_fini(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dead_server_leaves_every_chain_in_order),
        cmocka_unit_test(last_replica_stays_and_range_is_reported_lost),
        cmocka_unit_test(dead_worker_keeps_chains),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
