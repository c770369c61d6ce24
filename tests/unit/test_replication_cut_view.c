/* The checkpoint cut's decisions (replication/cut_view.c): who opens a read view, when it
 * opens, which reads it serves, and what a restore's PUT is told. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "core/wire.h"
#include "replication/chain.h"
#include "replication/cut_view.h"

/* Two ranges: 0 on chain 1 -> 2 -> 3, 1 on chain 4 -> 5. */
static void two_ranges(cps__view *v, cps__range rg[2])
{
    cps__view_init(v);
    memset(rg, 0, 2 * sizeof *rg);
    rg[0].chain_len = 3;
    rg[0].chain[0] = 1, rg[0].chain[1] = 2, rg[0].chain[2] = 3;
    rg[1].chain_len = 2;
    rg[1].chain[0] = 4, rg[1].chain[1] = 5;
    v->nranges = 2;
    v->ranges = rg;
}

static void holds_is_chain_membership(void **state)
{
    (void)state;
    cps__view v;
    cps__range rg[2];
    two_ranges(&v, rg);
    assert_true(cps__cut_holds(&v, 2, 0));
    assert_true(cps__cut_holds(&v, 3, 0));
    assert_false(cps__cut_holds(&v, 4, 0));
    assert_true(cps__cut_holds(&v, 5, 1));
    assert_false(cps__cut_holds(&v, 2, 1));
    assert_false(cps__cut_holds(&v, 2, 2)); /* a range the view lacks */
}

/* A step boundary: any replica of the range (the head and a middle too); "now": the tail only,
 * even a tail-to-be the view does not name yet is the replica's call. */
static void who_may_open(void **state)
{
    (void)state;
    cps__view v;
    cps__range rg[2];
    two_ranges(&v, rg);
    assert_true(cps__cut_may_open(&v, 1, 0, 0, 7));  /* head, at a step */
    assert_true(cps__cut_may_open(&v, 2, 0, 0, 7));  /* middle, at a step */
    assert_false(cps__cut_may_open(&v, 4, 0, 0, 7)); /* not a replica of range 0 */
    assert_false(cps__cut_may_open(&v, 1, 0, 0, 0)); /* head, "now": refused */
    assert_false(cps__cut_may_open(&v, 2, 0, 0, 0)); /* middle, "now": refused */
    assert_true(cps__cut_may_open(&v, 3, 1, 0, 0));  /* tail, "now" */
}

static void ready_at_the_step_boundary_only(void **state)
{
    (void)state;
    cps__cut_span sp = {.lo = 4, .hi = 5, .n = 2, .seq = 40, .step = 5};
    assert_int_equal(cps__cut_ready(0, &sp), 1);         /* "now" opens at once */
    assert_int_equal(cps__cut_ready(5, &sp), 0);         /* a key set still lacks step 5 */
    assert_int_equal(cps__cut_ready(4, &sp), CPS_EPAST); /* one applied step 5 already */
    assert_int_equal(cps__cut_ready(6, &sp), 0);
    sp.lo = 5;
    assert_int_equal(cps__cut_ready(5, &sp), 1);
    assert_int_equal(cps__cut_ready(6, &sp), 0);
    /* No sync key set yet: the range entry's step decides. */
    cps__cut_span none = {.n = 0, .seq = 3, .step = 8};
    assert_int_equal(cps__cut_ready(8, &none), 1);
    assert_int_equal(cps__cut_ready(7, &none), 1);
    assert_int_equal(cps__cut_ready(9, &none), 0);
}

static void at_step_prefers_the_key_sets(void **state)
{
    (void)state;
    cps__cut_span sp = {.lo = 5, .hi = 5, .n = 1, .step = 9};
    assert_int_equal(cps__cut_at_step(&sp), 5);
    sp.n = 0;
    assert_int_equal(cps__cut_at_step(&sp), 9);
}

/* A pending cut stays while we may still open it, and while there is no view; it goes when
 * we stop or when the view takes the right away. */
static void pending_drop(void **state)
{
    (void)state;
    cps__view v;
    cps__range rg[2];
    two_ranges(&v, rg);
    assert_false(cps__cut_pending_drop(&v, 3, 1, 0, 0, 0));
    assert_true(cps__cut_pending_drop(&v, 3, 1, 0, 0, 1));
    assert_true(cps__cut_pending_drop(&v, 3, 0, 0, 0, 0)); /* no longer the tail */
    assert_false(cps__cut_pending_drop(&v, 2, 0, 0, 7, 0));
    assert_true(cps__cut_pending_drop(&v, 4, 0, 0, 7, 0)); /* the range moved away */
    cps__view empty;
    cps__view_init(&empty);
    assert_false(cps__cut_pending_drop(&empty, 4, 0, 0, 7, 0));
}

static void put_verdicts_to_errors(void **state)
{
    (void)state;
    assert_int_equal(cps__cut_put_status(CPS_ADMIT_NOT_HEAD), CPS_ESTALE_EPOCH);
    assert_int_equal(cps__cut_put_status(CPS_ADMIT_BUSY), CPS_EAGAIN);
    assert_int_equal(cps__cut_put_status(CPS_ADMIT_DUP), CPS_EPROTO);
    assert_int_equal(cps__cut_put_status(CPS_ADMIT_GAP), CPS_EPROTO);
    assert_int_equal(cps__cut_put_status(CPS_ENOMEM), CPS_ENOMEM);
}

static void put_layout(void **state)
{
    (void)state;
    unsigned char p[32] = {0};
    size_t hlen, off;
    cps__le32_put(p, 5);
    assert_int_equal(cps__cut_put_hello(p, 32, &hlen), 0);
    assert_int_equal(hlen, 5);
    assert_int_equal(cps__cut_put_entries(32, hlen, 1, 2, &off), 0);
    assert_int_equal(off, 16);
    assert_int_equal(cps__cut_put_entries(16, hlen, 1, 2, &off), CPS_EPROTO); /* no entries */
    assert_int_equal(cps__cut_put_entries(32, hlen, 2, 2, &off), CPS_EPROTO); /* no range */
    cps__le32_put(p, 25);
    assert_int_equal(cps__cut_put_hello(p, 32, &hlen), CPS_EPROTO);
    assert_int_equal(cps__cut_put_hello(p, 7, &hlen), CPS_EPROTO);
}

static void read_req(unsigned char p[40], uint64_t lo, uint64_t hi, uint32_t slot, uint64_t first,
                     uint64_t count)
{
    memset(p, 0, 40);
    cps__le64_put(p, lo);
    cps__le64_put(p + 8, hi);
    cps__le32_put(p + 16, slot);
    cps__le64_put(p + 24, first);
    cps__le64_put(p + 32, count);
}

static void read_parse_and_bounds(void **state)
{
    (void)state;
    unsigned char p[40];
    cps__cut_read q;
    read_req(p, 10, 12, 1, 3, 4);
    assert_int_equal(cps__cut_read_parse(p, 40, 1024, 16, &q), 0);
    assert_int_equal(q.lo, 10);
    assert_int_equal(q.hi, 12);
    assert_int_equal(q.slot, 1);
    assert_int_equal(q.first, 3);
    assert_int_equal(q.count, 4);
    assert_int_equal(cps__cut_read_parse(p, 39, 1024, 16, &q), CPS_EPROTO);
    p[20] = 1; /* the reserved word */
    assert_int_equal(cps__cut_read_parse(p, 40, 1024, 16, &q), CPS_EPROTO);
    read_req(p, 12, 10, 0, 0, 1);
    assert_int_equal(cps__cut_read_parse(p, 40, 1024, 16, &q), CPS_ESIZE);
    read_req(p, 0, 16, 0, 0, 1); /* 17 keys */
    assert_int_equal(cps__cut_read_parse(p, 40, 1024, 16, &q), CPS_ESIZE);
    read_req(p, 0, 15, 0, 0, 16); /* 256 values: exactly 1024 bytes */
    assert_int_equal(cps__cut_read_parse(p, 40, 1024, 16, &q), 0);
    read_req(p, 0, 15, 0, 0, 17);
    assert_int_equal(cps__cut_read_parse(p, 40, 1024, 16, &q), CPS_ESIZE);
    read_req(p, 0, 0, 0, 0, 257);
    assert_int_equal(cps__cut_read_parse(p, 40, 1024, 16, &q), CPS_ESIZE);
}

static void read_fits_the_record(void **state)
{
    (void)state;
    cps__cut_read q = {.lo = 0, .hi = 0, .first = 2, .count = 3, .slot = 2};
    assert_int_equal(cps__cut_read_fits(&q, 2, 5), 0);
    assert_int_equal(cps__cut_read_fits(&q, 1, 5), CPS_ESIZE); /* no such slot */
    assert_int_equal(cps__cut_read_fits(&q, 2, 4), CPS_ESIZE); /* past the end */
    q.first = 6;
    q.count = 0;
    assert_int_equal(cps__cut_read_fits(&q, 2, 5), CPS_ESIZE);
}

/* Only the exporter of this very view reads or closes it; anything else it sends keeps the view
 * open, and messages for another view (id or range) are not ours. */
static void view_socket_messages(void **state)
{
    (void)state;
    assert_int_equal(cps__cut_view_msg(CPS_MSG_CUT_READ, 9, 2, 9, 2), CPS_CUT_READ);
    assert_int_equal(cps__cut_view_msg(CPS_MSG_CUT_CLOSE, 9, 2, 9, 2), CPS_CUT_CLOSE);
    assert_int_equal(cps__cut_view_msg(CPS_MSG_CUT_PROBE, 9, 2, 9, 2), CPS_CUT_ALIVE);
    assert_int_equal(cps__cut_view_msg(CPS_MSG_CUT_CLOSE, 8, 2, 9, 2), CPS_CUT_IGNORE);
    assert_int_equal(cps__cut_view_msg(CPS_MSG_CUT_READ, 9, 1, 9, 2), CPS_CUT_IGNORE);
}

/* A CUT_OPEN naming a view already pending or open is a repeat; one for another range, or once
 * the view was dropped, is new. A pending view expires at its deadline, an open one never. */
static void book_repeats_and_deadlines(void **state)
{
    (void)state;
    cps__cut_book b;
    memset(&b, 0, sizeof b);
    const uint64_t t0 = 1000, due = t0 + CPS_CUT_PENDING_MS;
    uint64_t id;
    uint32_t range;
    assert_int_equal(cps__cut_book_ask(&b, 7, 0, t0), CPS_CUT_NEW);
    assert_int_equal(cps__cut_book_ask(&b, 7, 0, t0 + 5), CPS_CUT_REPEAT);
    assert_int_equal(cps__cut_book_ask(&b, 7, 1, t0), CPS_CUT_NEW); /* same id, another range */
    assert_int_equal(cps__cut_book_ask(&b, 8, 0, t0 + 10), CPS_CUT_NEW);
    cps__cut_book_opened(&b, 7, 1);
    assert_int_equal(cps__cut_book_ask(&b, 7, 1, t0 + 20), CPS_CUT_REPEAT); /* open: answered */
    /* Nothing is due before the deadline; at it, the pending (7, 0) goes, not the open (7, 1). */
    assert_int_equal(cps__cut_book_expired(&b, due - 1, &id, &range), 0);
    assert_int_equal(cps__cut_book_expired(&b, due, &id, &range), 1);
    assert_int_equal(id, 7);
    assert_int_equal(range, 0);
    assert_int_equal(cps__cut_book_expired(&b, due, &id, &range), 0);
    assert_int_equal(cps__cut_book_expired(&b, due + 10, &id, &range), 1);
    assert_int_equal(id, 8);
    assert_int_equal(cps__cut_book_expired(&b, 10 * due, &id, &range), 0);
    /* Expired or dropped: the tool's next request of it is new. */
    assert_int_equal(cps__cut_book_ask(&b, 7, 0, due), CPS_CUT_NEW);
    cps__cut_book_forget(&b, 7, 1);
    cps__cut_book_forget(&b, 99, 1); /* unknown: nothing happens */
    assert_int_equal(cps__cut_book_ask(&b, 7, 1, due), CPS_CUT_NEW);
    assert_int_equal(cps__cut_book_ask(&b, 7, 0, due), CPS_CUT_REPEAT);
    /* Many at once grow the book; each is found again. */
    for (uint64_t k = 100; k < 140; k++)
        assert_int_equal(cps__cut_book_ask(&b, k, 3, due), CPS_CUT_NEW);
    for (uint64_t k = 100; k < 140; k++)
        assert_int_equal(cps__cut_book_ask(&b, k, 3, due), CPS_CUT_REPEAT);
    cps__cut_book_fini(&b);
    assert_int_equal(cps__cut_book_ask(&b, 7, 0, due), CPS_CUT_NEW);
    cps__cut_book_fini(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(holds_is_chain_membership),
        cmocka_unit_test(who_may_open),
        cmocka_unit_test(ready_at_the_step_boundary_only),
        cmocka_unit_test(at_step_prefers_the_key_sets),
        cmocka_unit_test(pending_drop),
        cmocka_unit_test(put_verdicts_to_errors),
        cmocka_unit_test(put_layout),
        cmocka_unit_test(read_parse_and_bounds),
        cmocka_unit_test(read_fits_the_record),
        cmocka_unit_test(view_socket_messages),
        cmocka_unit_test(book_repeats_and_deadlines),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
