/* unit.replication_collective: the shell's one-pass paths. The written hook (the MAC run over
 * each piece as the reduction writes it) and cps__coll_place (an all-gather chunk checked as it
 * is copied into the ring's buffer): a chunk refused with a forged piece in its middle leaves
 * nothing of it in the result, and the bits are the reference's. */
#include "fixture.h"

/* Every forwarded payload is written piece by piece, in order (hook_written), every all-gather
 * chunk is placed after a refused forgery of it, and every member ends with the reference's
 * bits: chunks of many pieces, of one, and of a few values. */
void test_written_pieces_and_placed_chunks(void **state)
{
    (void)state;
    hook_mode = 1;
    place_mode = 1;
    uint64_t lens[] = {50000, 4096, 7};
    uint32_t chunks[] = {20000, 1024, 2};
    for (uint32_t p = 2; p <= 4; p++)
        for (size_t a = 0; a < 3; a++)
            for (int op = 0; op < 2; op++) {
                net t;
                net_init(&t, p, lens[a], chunks[a], op, 77 * p + 5 * a + (uint64_t)op);
                fill_inputs(&t, 0);
                float *inputs[MAXN];
                for (uint32_t i = 0; i < p; i++) {
                    inputs[i] = malloc(t.len * sizeof(float));
                    memcpy(inputs[i], t.nodes[i].data[0], t.len * sizeof(float));
                }
                float *ref = malloc(t.len * sizeof(float));
                reference(&t, inputs, p, ref);
                placed = written_calls = gather_seen = 0;
                for (uint32_t i = 0; i < p; i++)
                    start(&t, &t.nodes[i], 0);
                while (deliver_one(&t))
                    ;
                for (uint32_t i = 0; i < p; i++) {
                    assert_int_equal(t.nodes[i].status[0], 0);
                    assert_memory_equal(t.nodes[i].data[0], ref, t.len * sizeof(float));
                }
                /* Every all-gather chunk came the placed way: one predecessor, in order, in
                 * the plain case. */
                assert_int_equal(placed, gather_seen);
                assert_true(placed > 0);
                assert_true(written_calls > 0);
                for (uint32_t i = 0; i < p; i++)
                    free(inputs[i]);
                free(ref);
                net_fini(&t);
            }
}

static void take(cps__coll *c, cps__coll_msg m)
{
    cps__coll_step(c, &m, 0);
}

/* Place answers only for the running collective's next all-gather chunk from our predecessor;
 * a refused (forged) copy at the place changes nothing, and the genuine chunk then completes
 * the collective with its own values. */
void test_place_only_the_plain_case(void **state)
{
    (void)state;
    uint32_t three[3] = {10, 9, 11}; /* 10 -> 9 -> 11 -> 10 */
    cps__coll *c = node9(1, three, 3, 0, 0);
    float x[6] = {1, 2, 3, 4, 5, 6}, ten[2] = {10, 10}, seven[2] = {7, 7}, eight[2] = {8, 8};
    uint64_t seq;
    assert_int_equal(cps__coll_start(c, x, 6, CPS_COLL_SUM, 0, &seq), 0);
    cps__coll_msg m = {
        .from = 10, .kind = CPS_COLL_DATA, .epoch = 1, .seq = seq, .n = 6, .count = 2};
    /* The reduce-scatter (steps 0 and 1, one chunk a step): never placed. */
    for (uint64_t i = 0; i < 2; i++) {
        m.index = i;
        assert_null(cps__coll_place(c, &m));
        m.index = 2; /* ahead of the ring: it would be stashed */
        assert_null(cps__coll_place(c, &m));
        m.index = i;
        m.vals = ten;
        take(c, m);
        m.vals = NULL;
    }
    for (uint64_t i = 2; i < 4; i++) {
        m.index = i;
        cps__coll_msg bad = m;
        bad.from = 11; /* not our predecessor */
        assert_null(cps__coll_place(c, &bad));
        bad = m;
        bad.epoch = 2;
        assert_null(cps__coll_place(c, &bad));
        bad = m;
        bad.seq = seq + 1;
        assert_null(cps__coll_place(c, &bad));
        bad = m;
        bad.count = 3;
        assert_null(cps__coll_place(c, &bad));
        bad = m;
        bad.n = 7;
        assert_null(cps__coll_place(c, &bad));
        bad = m;
        bad.kind = CPS_COLL_RESULT;
        assert_null(cps__coll_place(c, &bad));
        float *dst = cps__coll_place(c, &m);
        assert_non_null(dst);
        dst[0] = dst[1] = 1e30f; /* a refused copy: not stepped */
        assert_ptr_equal(cps__coll_place(c, &m), dst);
        memcpy(dst, i == 2 ? seven : eight, sizeof seven);
        m.vals = dst;
        take(c, m);
        m.vals = NULL;
    }
    const cps__coll_act *a;
    size_t n = cps__coll_actions(c, &a);
    int done = 0;
    for (size_t i = 0; i < n; i++)
        done |= a[i].kind == CPS_COLL_DONE;
    assert_true(done);
    int sevens = 0, eights = 0;
    for (int j = 0; j < 6; j++) {
        sevens += x[j] == 7;
        eights += x[j] == 8;
        assert_true(x[j] < 100);
    }
    assert_int_equal(sevens, 2);
    assert_int_equal(eights, 2);
    /* Done: nothing more to place. */
    m.index = 3;
    assert_null(cps__coll_place(c, &m));
    cps__coll_destroy(c);
}
