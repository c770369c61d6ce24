#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "replication/ackhold.h"

static cps__msg_hdr ack(uint32_t range, uint64_t epoch, uint64_t seq)
{
    cps__msg_hdr h = {0};
    h.type = CPS_MSG_CHAIN_ACK;
    h.range = range;
    h.epoch = epoch;
    h.req_seq = seq;
    return h;
}

static size_t sends(cps__ackhold *h, const cps__ackhold_send **out)
{
    return cps__ackhold_sends(h, out);
}

static cps__ackhold *new_hold(void)
{
    cps__ackhold *h;
    assert_int_equal(cps__ackhold_create(&h), 0);
    return h;
}

static void a_later_ack_of_a_range_replaces_the_held_one(void **state)
{
    (void)state;
    cps__ackhold *h = new_hold();
    const cps__ackhold_send *out;
    cps__msg_hdr a = ack(1, 4, 10), b = ack(1, 4, 11), c = ack(0, 4, 3);
    assert_int_equal(cps__ackhold_offer(h, 2, 7, &a, 100), 1);
    assert_int_equal(sends(h, &out), 0);
    assert_int_equal(cps__ackhold_offer(h, 2, 7, &b, 101), 1);
    assert_int_equal(sends(h, &out), 0); /* superseded: never sent */
    assert_int_equal(cps__ackhold_offer(h, 2, 7, &c, 101), 1);
    assert_int_equal(cps__ackhold_held(h), 2);
    /* Due CPS_ACK_HOLD_MS after the oldest was held, not after the latest. */
    cps__ackhold_due(h, 100 + CPS_ACK_HOLD_MS - 1, 0);
    assert_int_equal(sends(h, &out), 0);
    cps__ackhold_due(h, 100 + CPS_ACK_HOLD_MS, 0);
    assert_int_equal(sends(h, &out), 2);
    assert_int_equal(out[0].hdr.range, 0);
    assert_int_equal(out[0].hdr.req_seq, 3);
    assert_int_equal(out[1].to, 7);
    assert_int_equal(out[1].hdr.range, 1);
    assert_int_equal(out[1].hdr.req_seq, 11);
    assert_int_equal(cps__ackhold_held(h), 0);
    cps__ackhold_due(h, 1000, 1);
    assert_int_equal(sends(h, &out), 0);
    cps__ackhold_destroy(h);
}

static void flagged_or_out_of_range_acks_go_at_once(void **state)
{
    (void)state;
    cps__ackhold *h = new_hold();
    const cps__ackhold_send *out;
    cps__msg_hdr mark = ack(0, 1, 5), data = ack(0, 1, 5), far = ack(3, 1, 5);
    mark.aux = 1;
    data.payload_len = 8;
    assert_int_equal(cps__ackhold_offer(h, 2, 7, &mark, 0), 0);
    assert_int_equal(cps__ackhold_offer(h, 2, 7, &data, 0), 0);
    assert_int_equal(cps__ackhold_offer(h, 2, 7, &far, 0), 0);
    assert_int_equal(sends(h, &out), 0);
    assert_int_equal(cps__ackhold_held(h), 0);
    cps__ackhold_destroy(h);
}

static void only_a_later_ack_on_the_same_link_and_epoch_covers(void **state)
{
    (void)state;
    cps__ackhold *h = new_hold();
    const cps__ackhold_send *out;
    cps__msg_hdr a = ack(0, 4, 10), other_epoch = ack(0, 5, 11), older = ack(0, 5, 9);
    assert_int_equal(cps__ackhold_offer(h, 1, 7, &a, 0), 1);
    /* Another predecessor: the held one goes first. */
    assert_int_equal(cps__ackhold_offer(h, 1, 8, &a, 0), 1);
    assert_int_equal(sends(h, &out), 1);
    assert_int_equal(out[0].to, 7);
    assert_int_equal(cps__ackhold_offer(h, 1, 8, &other_epoch, 0), 1);
    assert_int_equal(sends(h, &out), 1);
    assert_int_equal(out[0].hdr.epoch, 4);
    assert_int_equal(cps__ackhold_offer(h, 1, 8, &older, 0), 1);
    assert_int_equal(sends(h, &out), 1);
    assert_int_equal(out[0].hdr.req_seq, 11);
    assert_int_equal(cps__ackhold_held(h), 1);
    cps__ackhold_due(h, 0, 1);
    assert_int_equal(sends(h, &out), 1);
    assert_int_equal(out[0].hdr.req_seq, 9);
    cps__ackhold_destroy(h);
}

static void a_new_range_count_releases_every_held_ack(void **state)
{
    (void)state;
    cps__ackhold *h = new_hold();
    const cps__ackhold_send *out;
    for (uint32_t r = 0; r < 4; r++) {
        cps__msg_hdr a = ack(r, 2, 1);
        assert_int_equal(cps__ackhold_offer(h, 4, 7, &a, 0), 1);
    }
    cps__msg_hdr b = ack(0, 3, 2);
    assert_int_equal(cps__ackhold_offer(h, 2, 7, &b, 50), 1);
    assert_int_equal(sends(h, &out), 4);
    for (uint32_t r = 0; r < 4; r++)
        assert_int_equal(out[r].hdr.range, r);
    assert_int_equal(cps__ackhold_held(h), 1);
    assert_int_equal(cps__ackhold_wait_ms(h, 50, 100), CPS_ACK_HOLD_MS);
    cps__ackhold_destroy(h);
}

static void wait_is_bounded_by_the_oldest_held_ack(void **state)
{
    (void)state;
    cps__ackhold *h = new_hold();
    assert_int_equal(cps__ackhold_wait_ms(h, 0, 100), 100);
    assert_int_equal(cps__ackhold_wait_ms(NULL, 0, 100), 100);
    cps__msg_hdr a = ack(0, 1, 1);
    assert_int_equal(cps__ackhold_offer(h, 1, 7, &a, 1000), 1);
    assert_int_equal(cps__ackhold_wait_ms(h, 1000, 100), CPS_ACK_HOLD_MS);
    assert_int_equal(cps__ackhold_wait_ms(h, 1000, 1), 1);
    assert_int_equal(cps__ackhold_wait_ms(h, 1000 + CPS_ACK_HOLD_MS + 5, 100), 0);
    cps__ackhold_destroy(h);
    cps__ackhold_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_later_ack_of_a_range_replaces_the_held_one),
        cmocka_unit_test(flagged_or_out_of_range_acks_go_at_once),
        cmocka_unit_test(only_a_later_ack_on_the_same_link_and_epoch_covers),
        cmocka_unit_test(a_new_range_count_releases_every_held_ack),
        cmocka_unit_test(wait_is_bounded_by_the_oldest_held_ack),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
