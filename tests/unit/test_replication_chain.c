/* The chain state machine's state transfer at the tail (cps__chain_add_shadow). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* The first message the last call of `c` sent to node `to`, copied into buf (header in *h). */
static size_t take_send(cps__chain *c, uint32_t to, cps__msg_hdr *h, uint8_t *buf, size_t cap)
{
    const cps__chain_action *a;
    size_t n = cps__chain_actions(c, &a);
    for (size_t i = 0; i < n; i++) {
        if (a[i].kind != CPS_CA_SEND || a[i].to != to)
            continue;
        assert_true(a[i].len <= cap);
        memcpy(buf, a[i].msg, a[i].len);
        assert_int_equal(cps__wire_hdr_decode(buf, a[i].len, h), 0);
        return a[i].len;
    }
    fail_msg("no message to node %u", to);
    return 0;
}

/* Deliver msg (len bytes, header h) to chain c. */
static int deliver(cps__chain *c, const cps__msg_hdr *h, const uint8_t *msg, size_t len,
                   uint64_t now)
{
    return cps__chain_on_message(c, h, msg + CPS_WIRE_HDR_SIZE, len - CPS_WIRE_HDR_SIZE, now);
}

/* Simulator seeds 4312 and 9673: a joiner gave its join up (or restarted) while the tail's views
 * still showed it alive (a later view had overtaken the one with its death), and the tail kept it
 * as its shadow, forwarding it every update for ever. A FWD to a shadow names the join; a node
 * not copying the range from its sender answers it with a refusal of that join, and the tail
 * forgets the shadow. A refusal of an earlier join (late, after the node asked again) does not
 * touch the current one, and a node copying the range again takes the FWDs. */
static void a_joiner_that_gave_up_stops_being_forwarded_to(void **state)
{
    (void)state;
    cps__view v;
    make_view(&v);
    cps__chain_config cfg1 = {1, 200, 1024}, cfg3 = {3, 200, 1024};
    cps__chain *tail = NULL, *joiner = NULL;
    assert_int_equal(cps__chain_create(&cfg1, &ops, NULL, &tail), 0);
    assert_int_equal(cps__chain_create(&cfg3, &ops, NULL, &joiner), 0);
    assert_int_equal(cps__chain_set_view(tail, &v, 0), 0);
    assert_int_equal(cps__chain_set_view(joiner, &v, 0), 0);
    uint8_t fwd[256], ack[256];
    cps__msg_hdr fh, ah;

    /* Join 8 of server 3, given up (no snapshot in time) after the tail took its request. */
    assert_int_equal(cps__chain_begin_join(joiner, 0, 1), 0);
    assert_int_equal(cps__chain_add_shadow(tail, 0, 3, 8, 1), 0);
    cps__chain_join_abort(joiner, 0);
    submit(tail, 1, 2);
    size_t flen = take_send(tail, 3, &fh, fwd, sizeof fwd);
    assert_int_equal(fh.aux, 8); /* the FWD names the join */
    assert_int_equal(deliver(joiner, &fh, fwd, flen, 3), 0);
    size_t alen = take_send(joiner, 1, &ah, ack, sizeof ack);
    assert_int_equal(ah.type, CPS_MSG_CHAIN_ACK);
    assert_int_equal(ah.step, 8);
    assert_int_equal(ah.req_seq, 0); /* it acknowledges no update */

    /* The refusal of an earlier join leaves join 8 alone. */
    cps__msg_hdr old = ah;
    old.step = 7;
    uint8_t oldmsg[CPS_WIRE_HDR_SIZE];
    cps__wire_hdr_encode(oldmsg, &old);
    assert_int_equal(deliver(tail, &old, oldmsg, sizeof oldmsg, 4), 0);
    assert_int_equal(cps__chain_unacked(tail, 0), 1);
    assert_int_equal(deliver(tail, &ah, ack, alen, 5), 0);
    assert_int_equal(cps__chain_unacked(tail, 0), 0);
    submit(tail, 2, 6);
    assert_int_equal(sent_to(tail), 0); /* nothing for server 3 any more */
    assert_int_equal(cps__chain_tick(tail, 1000), 0);
    assert_int_equal(sent_to(tail), 0);

    /* Server 3 asks again (join 9): the tail forwards to it, and it takes the FWDs. */
    assert_int_equal(cps__chain_begin_join(joiner, 0, 1), 0);
    assert_int_equal(cps__chain_add_shadow(tail, 0, 3, 9, 1001), 0);
    submit(tail, 3, 1002);
    flen = take_send(tail, 3, &fh, fwd, sizeof fwd);
    assert_int_equal(fh.aux, 9);
    assert_int_equal(deliver(joiner, &fh, fwd, flen, 1003), 0);
    assert_int_equal(sent_to(joiner), 0); /* held for the snapshot: no refusal */
    assert_int_equal(deliver(tail, &ah, ack, alen, 1004), 0); /* join 8's refusal, late */
    assert_int_equal(cps__chain_unacked(tail, 0), 1);
    cps__chain_destroy(tail);
    cps__chain_destroy(joiner);
    cps__view_fini(&v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_late_request_of_an_earlier_join_keeps_the_current_shadow),
        cmocka_unit_test(a_view_that_makes_the_joiner_a_member_ends_the_join),
        cmocka_unit_test(a_joiner_that_gave_up_stops_being_forwarded_to),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
