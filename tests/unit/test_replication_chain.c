/* The chain state machine's state transfer at the tail (cps__chain_add_shadow). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "replication/chain.h"

static int zero_seq(void *ctx, uint32_t range, uint64_t *seq)
{
    (void)ctx;
    (void)range;
    *seq = 0;
    return 0;
}

static int zero_dedup(void *ctx, uint32_t range, uint32_t worker, uint64_t *seq)
{
    (void)ctx;
    (void)range;
    (void)worker;
    *seq = 0;
    return 0;
}

static int zero_agg(void *ctx, uint32_t range, uint64_t sig, uint64_t *step)
{
    (void)ctx;
    (void)range;
    (void)sig;
    *step = 0;
    return 0;
}

static const cps__chain_store_ops ops = {zero_seq, zero_dedup, zero_agg, NULL};

/* Servers 1..3 and worker 9, all alive; one range whose chain is server 1 alone. */
static void make_view(cps__view *v)
{
    cps__view_init(v);
    v->epoch = 12;
    v->nnodes = 4;
    v->nodes = calloc(4, sizeof *v->nodes);
    for (uint32_t i = 0; i < 4; i++) {
        v->nodes[i].id = i < 3 ? i + 1 : 9;
        v->nodes[i].role = i < 3 ? CPS_ROLE_SERVER : CPS_ROLE_WORKER;
        v->nodes[i].alive = 1;
        v->nodes[i].rank = i < 3 ? i : 0;
        snprintf(v->nodes[i].addr, sizeof v->nodes[i].addr, "tcp://127.0.0.1:%u", 2000 + i);
    }
    v->num_servers = 3;
    v->num_workers = 1;
    v->replicas = 3;
    v->nranges = 1;
    v->ranges = calloc(1, sizeof *v->ranges);
    v->ranges[0].lo = 0;
    v->ranges[0].hi = UINT64_MAX;
    v->ranges[0].chain_len = 1;
    v->ranges[0].chain[0] = 1;
}

/* Submit one push of worker 9 with request number `req` at the head (and tail). */
static void submit(cps__chain *c, uint64_t req, uint64_t now)
{
    static const uint64_t body[1] = {0};
    cps__chain_req rq = {9, CPS_MSG_PUSH, 0, req};
    cps__chain_update u = {CPS_UPD_PUSH, req, 0, 1, &rq, body, sizeof body};
    assert_int_equal(cps__chain_admit(c, 0, &rq, req, 0, NULL), CPS_ADMIT_NEW);
    assert_int_equal(cps__chain_submit(c, 0, &u, now), 0);
}

/* The nodes the last call sent something to, as a bit set (bit n: node n). */
static unsigned sent_to(cps__chain *c)
{
    const cps__chain_action *a;
    size_t n = cps__chain_actions(c, &a);
    unsigned to = 0;
    for (size_t i = 0; i < n; i++)
        if (a[i].kind == CPS_CA_SEND)
            to |= 1u << a[i].to;
    return to;
}

/* Simulator seed 10010: a SNAP_REQ a server sent for join 7 before it was fenced reached the
 * tail after it came back, while server 3 was copying the range for join 8. Taken, it replaced
 * server 3 as the shadow and dropped the updates held for it; server 3, its snapshot already
 * on the way, then reported CAUGHT_UP without updates the tail had acknowledged. */
static void a_late_request_of_an_earlier_join_keeps_the_current_shadow(void **state)
{
    (void)state;
    cps__view v;
    make_view(&v);
    cps__chain_config cfg = {1, 200, 1024};
    cps__chain *c = NULL;
    assert_int_equal(cps__chain_create(&cfg, &ops, NULL, &c), 0);
    assert_int_equal(cps__chain_set_view(c, &v, 0), 0);
    assert_int_equal(cps__chain_add_shadow(c, 0, 3, 8, 0), 0);
    submit(c, 1, 1);
    assert_int_equal(sent_to(c), 1u << 3);
    submit(c, 2, 2);
    assert_int_equal(cps__chain_committed(c, 0), 2); /* acknowledged to the worker */
    assert_int_equal(cps__chain_unacked(c, 0), 2);   /* and held until server 3 has them */

    assert_int_equal(cps__chain_add_shadow(c, 0, 2, 7, 3), CPS_ESTALE_EPOCH);
    assert_int_equal(cps__chain_unacked(c, 0), 2);
    assert_int_equal(cps__chain_tick(c, 500), 0);
    assert_int_equal(sent_to(c), 1u << 3); /* still re-sent to the current joiner */
    submit(c, 3, 501);
    assert_int_equal(sent_to(c), 1u << 3);

    /* A repeat of the current join's request, and a later join, are taken. */
    assert_int_equal(cps__chain_add_shadow(c, 0, 3, 8, 502), 0);
    assert_int_equal(cps__chain_unacked(c, 0), 3); /* still owed to server 3 */
    assert_int_equal(cps__chain_add_shadow(c, 0, 2, 9, 503), 0);
    assert_int_equal(cps__chain_unacked(c, 0), 0); /* the replaced join's updates are moot */
    submit(c, 4, 504);
    assert_int_equal(sent_to(c), 1u << 2);
    cps__chain_destroy(c);
    cps__view_fini(&v);
}

/* A joiner stops joining once a view makes it a member of the range: a snapshot arriving after
 * that must not be installed (transfer.c asks cps__chain_joining first). */
static void a_view_that_makes_the_joiner_a_member_ends_the_join(void **state)
{
    (void)state;
    cps__view v;
    make_view(&v);
    cps__chain_config cfg = {3, 200, 1024};
    cps__chain *c = NULL;
    assert_int_equal(cps__chain_create(&cfg, &ops, NULL, &c), 0);
    assert_int_equal(cps__chain_set_view(c, &v, 0), 0);
    assert_false(cps__chain_joining(c, 0));
    assert_int_equal(cps__chain_begin_join(c, 0, 1), 0);
    assert_true(cps__chain_joining(c, 0));
    v.epoch++;
    v.ranges[0].chain[v.ranges[0].chain_len++] = 3;
    assert_int_equal(cps__chain_set_view(c, &v, 1), 0);
    assert_false(cps__chain_joining(c, 0));
    assert_false(cps__chain_joining(c, 5)); /* no such range */
    cps__chain_destroy(c);
    cps__view_fini(&v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_late_request_of_an_earlier_join_keeps_the_current_shadow),
        cmocka_unit_test(a_view_that_makes_the_joiner_a_member_ends_the_join),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
