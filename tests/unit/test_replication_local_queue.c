/* Exporters' requests for a worker's local tensors (replication/local_queue.c): which are
 * answered at once, which wait for their boundary, which give way, and what a commit answers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "replication/local_queue.h"

static cps__lq_act one(cps__lq *q, uint64_t req, uint64_t want, int any, size_t ntensors)
{
    cps__lq_act a[2];
    assert_int_equal(cps__lq_request(q, req, want, any, ntensors, a), 1);
    return a[0];
}

/* No tensors: CPS_ENOTFOUND. A boundary already committed (or earlier): CPS_EPAST with where we
 * are. A later one, or "any", waits in a slot. */
static void answered_now_or_held(void **state)
{
    (void)state;
    cps__lq q;
    cps__lq_init(&q);
    cps__lq_act a = one(&q, 1, 5, 0, 0);
    assert_int_equal(a.kind, CPS_LQ_STATUS);
    assert_int_equal(a.slot, -1);
    assert_int_equal(a.status, CPS_ENOTFOUND);
    /* Before any commit, every step waits (step 0 included). */
    a = one(&q, 2, 0, 0, 3);
    assert_int_equal(a.kind, CPS_LQ_HOLD);
    assert_int_equal(a.req_seq, 2);
    cps__lq_act c[CPS_LQ_SLOTS];
    assert_int_equal(cps__lq_commit(&q, 0, c), 1);
    assert_int_equal(c[0].kind, CPS_LQ_BLOB);
    cps__lq_sent(&q, c[0].slot);
    assert_int_equal(cps__lq_commit(&q, 4, c), 0);
    a = one(&q, 3, 4, 0, 3);
    assert_int_equal(a.kind, CPS_LQ_STATUS);
    assert_int_equal(a.status, CPS_EPAST);
    assert_int_equal(a.step, 4);
    a = one(&q, 4, 3, 0, 3);
    assert_int_equal(a.status, CPS_EPAST);
    a = one(&q, 5, 3, 1, 3); /* any: waits for the next */
    assert_int_equal(a.kind, CPS_LQ_HOLD);
    a = one(&q, 6, 5, 0, 3);
    assert_int_equal(a.kind, CPS_LQ_HOLD);
}

/* A commit answers its own boundary's and "any" with the blob, tells the earlier ones EPAST (in
 * slot order), leaves the later ones waiting; a slot being sent is not reused until sent. */
static void a_commit_answers_by_boundary(void **state)
{
    (void)state;
    cps__lq q;
    cps__lq_init(&q);
    int s_early = one(&q, 1, 2, 0, 1).slot, s_now = one(&q, 2, 3, 0, 1).slot,
        s_any = one(&q, 3, 9, 1, 1).slot, s_late = one(&q, 4, 7, 0, 1).slot;
    cps__lq_act c[CPS_LQ_SLOTS];
    size_t n = cps__lq_commit(&q, 3, c);
    assert_int_equal(n, 3);
    int seen_early = 0, blobs = 0;
    for (size_t i = 0; i < n; i++) {
        if (i > 0)
            assert_true(c[i].slot > c[i - 1].slot);
        if (c[i].kind == CPS_LQ_STATUS) {
            assert_int_equal(c[i].slot, s_early);
            assert_int_equal(c[i].status, CPS_EPAST);
            assert_int_equal(c[i].step, 3);
            assert_int_equal(c[i].req_seq, 1);
            seen_early = 1;
        } else {
            assert_int_equal(c[i].kind, CPS_LQ_BLOB);
            assert_true(c[i].slot == s_now || c[i].slot == s_any);
            assert_int_equal(c[i].step, 3);
            blobs++;
        }
    }
    assert_true(seen_early);
    assert_int_equal(blobs, 2);
    /* Sending: a second commit does not answer them again; the late one waits on. */
    assert_int_equal(cps__lq_commit(&q, 5, c), 0);
    n = cps__lq_commit(&q, 7, c);
    assert_int_equal(n, 1);
    assert_int_equal(c[0].slot, s_late);
    assert_int_equal(c[0].kind, CPS_LQ_BLOB);
    cps__lq_sent(&q, s_now);
    cps__lq_sent(&q, s_any);
    cps__lq_sent(&q, s_late);
    assert_int_equal(cps__lq_commit(&q, 8, c), 0);
}

/* All slots taken: the oldest waiting request gives way (told EAGAIN first, with the boundary
 * it waited for); when every slot is being sent, the new one is refused. */
static void the_oldest_waiting_gives_way(void **state)
{
    (void)state;
    cps__lq q;
    cps__lq_init(&q);
    int slot_of[CPS_LQ_SLOTS];
    for (int i = 0; i < CPS_LQ_SLOTS; i++)
        slot_of[i] = one(&q, 100 + (uint64_t)i, 50 + (uint64_t)i, 0, 1).slot;
    /* A ninth: the first, the oldest, gives way. */
    cps__lq_act a[2];
    size_t n = cps__lq_request(&q, 200, 60, 0, 1, a);
    assert_int_equal(n, 2);
    assert_int_equal(a[0].kind, CPS_LQ_STATUS);
    assert_int_equal(a[0].slot, slot_of[0]);
    assert_int_equal(a[0].req_seq, 100);
    assert_int_equal(a[0].want, 50);
    assert_int_equal(a[0].status, CPS_EAGAIN);
    assert_int_equal(a[1].kind, CPS_LQ_HOLD);
    assert_int_equal(a[1].slot, slot_of[0]);
    assert_int_equal(a[1].req_seq, 200);
    /* Now request 101 (slot_of[1]) is the oldest. */
    n = cps__lq_request(&q, 201, 61, 0, 1, a);
    assert_int_equal(n, 2);
    assert_int_equal(a[0].slot, slot_of[1]);
    assert_int_equal(a[0].req_seq, 101);
    /* Every slot being sent (each answers "any"): refused, none evicted. */
    cps__lq r;
    cps__lq_init(&r);
    for (int i = 0; i < CPS_LQ_SLOTS; i++)
        one(&r, (uint64_t)i, 0, 1, 1);
    cps__lq_act c[CPS_LQ_SLOTS];
    assert_int_equal(cps__lq_commit(&r, 1, c), CPS_LQ_SLOTS);
    cps__lq_act x = one(&r, 99, 5, 0, 1);
    assert_int_equal(x.kind, CPS_LQ_STATUS);
    assert_int_equal(x.slot, -1);
    assert_int_equal(x.status, CPS_EAGAIN);
    assert_int_equal(x.step, 1);
    cps__lq_sent(&r, c[3].slot);
    assert_int_equal(one(&r, 100, 5, 0, 1).kind, CPS_LQ_HOLD);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(answered_now_or_held),
        cmocka_unit_test(a_commit_answers_by_boundary),
        cmocka_unit_test(the_oldest_waiting_gives_way),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
