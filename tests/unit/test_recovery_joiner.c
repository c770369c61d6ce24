#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "recovery/joiner.h"

#define SELF     4
#define TIMEOUT  5000
#define RETRY    1000
#define NRANGES  2
#define JOIN_ID  10
#define SNAP_SEQ 42

/* Servers 1..4 and one worker (id 9); both ranges have the chain 1 -> 2 -> 3, so server 3 is the
 * tail every join copies from and SELF (4) holds nothing. */
static void make_view(cps__view *v, uint64_t epoch)
{
    cps__view_init(v);
    v->epoch = epoch;
    v->replicas = 3;
    v->num_servers = 4;
    v->num_workers = 1;
    v->nnodes = 5;
    v->nodes = calloc(v->nnodes, sizeof *v->nodes);
    assert_non_null(v->nodes);
    for (uint32_t i = 0; i < v->nnodes; i++) {
        cps__node_info *n = &v->nodes[i];
        n->id = i < 4 ? i + 1 : 9;
        n->role = i < 4 ? CPS_ROLE_SERVER : CPS_ROLE_WORKER;
        n->rank = i < 4 ? i : 0;
        n->alive = 1;
        snprintf(n->addr, sizeof n->addr, "tcp://127.0.0.1:%u", 3000 + i);
    }
    v->nranges = NRANGES;
    v->ranges = calloc(NRANGES, sizeof *v->ranges);
    assert_non_null(v->ranges);
    for (uint32_t r = 0; r < NRANGES; r++) {
        v->ranges[r].lo = r == 0 ? 0 : UINT64_MAX / 2;
        v->ranges[r].hi = r == 0 ? UINT64_MAX / 2 - 1 : UINT64_MAX;
        for (uint32_t k = 0; k < 3; k++)
            v->ranges[r].chain[v->ranges[r].chain_len++] = k + 1;
    }
}

static cps__joiner *make_joiner(int reorder)
{
    cps__joiner_config cfg = {SELF, NRANGES, TIMEOUT, RETRY, reorder};
    cps__joiner *j = NULL;
    assert_int_equal(cps__joiner_create(&cfg, &j), 0);
    return j;
}

typedef struct fixture {
    cps__view v;
    cps__joiner *j;
} fixture;

/* Most tests: view 7 installed in a joiner of the in-order kind (production's). */
static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    make_view(&f->v, 7);
    f->j = make_joiner(0);
    assert_int_equal(cps__joiner_view(f->j, &f->v, 0), 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    cps__joiner_destroy(f->j);
    cps__view_fini(&f->v);
    free(f);
    return 0;
}

static const cps__joiner_action *only(cps__joiner *j, int kind)
{
    const cps__joiner_action *a;
    assert_int_equal(cps__joiner_actions(j, &a), 1);
    assert_int_equal(a[0].kind, kind);
    return &a[0];
}

static void expect_send(const cps__joiner_action *a, uint32_t to, uint8_t type, uint64_t step,
                        uint64_t aux)
{
    assert_int_equal(a->kind, CPS_JA_SEND);
    assert_int_equal(a->to, to);
    assert_int_equal(a->hdr.type, type);
    assert_int_equal(a->hdr.sender, SELF);
    assert_int_equal(a->hdr.step, step);
    assert_int_equal(a->hdr.aux, aux);
}

/* The join was given up: ABORT with `status`, then CAUGHT_UP aux 2 for join `id`. */
static void expect_gave_up(cps__joiner *j, uint32_t range, int status, uint64_t id)
{
    const cps__joiner_action *a;
    assert_int_equal(cps__joiner_actions(j, &a), 2);
    assert_int_equal(a[0].kind, CPS_JA_ABORT);
    assert_int_equal(a[0].range, range);
    assert_int_equal(a[0].status, status);
    assert_non_null(a[0].why);
    expect_send(&a[1], 0, CPS_MSG_CAUGHT_UP, id, 2);
    assert_int_equal(cps__joiner_active(j, range), 0);
}

/* Order join `id` of range 0 from server 3 and perform BEGIN: SNAP_REQ goes to the source. */
static void start_join(cps__joiner *j, const cps__view *v, uint64_t id, uint64_t now)
{
    assert_int_equal(cps__joiner_order(j, v, 0, 3, id, v->epoch, now), CPS_JOINER_TAKEN);
    const cps__joiner_action *a = only(j, CPS_JA_BEGIN);
    assert_int_equal(a->source, 3);
    assert_int_equal(a->seq, id);
    assert_int_equal(cps__joiner_result(j, 0, 0, 0, now), 1);
    a = only(j, CPS_JA_SEND);
    expect_send(a, 3, CPS_MSG_SNAP_REQ, id, 0);
    assert_int_equal(a->hdr.epoch, v->epoch);
    assert_int_equal(cps__joiner_active(j, 0), 1);
}

/* Take the last chunk of join `id` (number `num`), install it and replay: CAUGHT_UP aux 0 at
 * `applied`. */
static void finish_join(cps__joiner *j, uint64_t id, uint32_t num, uint64_t applied, uint64_t now)
{
    assert_int_equal(cps__joiner_snap(j, 3, 0, id, num, SNAP_SEQ, 1, 100, 1, now),
                     CPS_JOINER_TAKEN);
    assert_int_equal(only(j, CPS_JA_INSTALL)->last, 1);
    assert_int_equal(cps__joiner_result(j, 0, 0, SNAP_SEQ, now), 1);
    assert_int_equal(only(j, CPS_JA_READY)->seq, SNAP_SEQ);
    assert_int_equal(cps__joiner_result(j, 0, 0, applied, now), 1);
    const cps__joiner_action *a = only(j, CPS_JA_SEND);
    expect_send(a, 0, CPS_MSG_CAUGHT_UP, id, 0);
    assert_int_equal(a->hdr.req_seq, applied);
    assert_int_equal(cps__joiner_active(j, 0), 0);
}

static int serve_yes(void *ctx, uint32_t range)
{
    (void)ctx;
    (void)range;
    return 1;
}

static int serve_no(void *ctx, uint32_t range)
{
    (void)ctx;
    (void)range;
    return 0;
}

static void test_snapshot_in_order(void **state)
{
    fixture *f = *state;
    cps__joiner *j = f->j;
    cps__view *v = &f->v;
    start_join(j, v, JOIN_ID, 0);
    /* Two chunks before the last: each written, nothing else. */
    for (int k = 0; k < 2; k++) {
        assert_int_equal(cps__joiner_snap(j, 3, 0, JOIN_ID, (uint32_t)k, SNAP_SEQ, 0, 4096, 1, 10),
                         CPS_JOINER_TAKEN);
        assert_int_equal(only(j, CPS_JA_INSTALL)->last, 0);
        assert_int_equal(cps__joiner_result(j, 0, 0, 0, 10), 0);
    }
    finish_join(j, JOIN_ID, 2, 50, 20);
    assert_int_equal(cps__joiner_bytes(j, 0), 2 * 4096 + 100);
    /* The other range was never touched. */
    assert_int_equal(cps__joiner_active(j, 1), 0);
    /* No outcome is awaited any more. */
    assert_int_equal(cps__joiner_result(j, 0, 0, 0, 30), CPS_EINVAL);
}

static void test_stale_chunks_ignored(void **state)
{
    fixture *f = *state;
    cps__joiner *j = f->j;
    cps__view *v = &f->v;
    start_join(j, v, JOIN_ID, 0);
    /* A chunk of an earlier join of the range, from the same tail: its shadow may be gone. */
    assert_int_equal(cps__joiner_snap(j, 3, 0, JOIN_ID - 1, 0, SNAP_SEQ, 1, 10, 1, 5),
                     CPS_JOINER_IGNORED);
    assert_int_equal(cps__joiner_actions(j, NULL), 0);
    /* From another server than the source, or for a range we do not copy. */
    assert_int_equal(cps__joiner_snap(j, 2, 0, JOIN_ID, 0, SNAP_SEQ, 1, 10, 1, 5),
                     CPS_JOINER_IGNORED);
    assert_int_equal(cps__joiner_snap(j, 3, 1, JOIN_ID, 0, SNAP_SEQ, 1, 10, 1, 5),
                     CPS_JOINER_IGNORED);
    assert_int_equal(cps__joiner_snap(j, 3, NRANGES, JOIN_ID, 0, SNAP_SEQ, 1, 10, 1, 5),
                     CPS_JOINER_IGNORED);
    /* The join goes on as if nothing came. */
    assert_int_equal(cps__joiner_active(j, 0), 1);
    finish_join(j, JOIN_ID, 0, SNAP_SEQ, 6);
}

/* Take chunk `num` (not the last) of join `id` and write it. */
static void take_chunk(cps__joiner *j, uint64_t id, uint32_t num, uint64_t now)
{
    assert_int_equal(cps__joiner_snap(j, 3, 0, id, num, SNAP_SEQ, 0, 4096, 1, now),
                     CPS_JOINER_TAKEN);
    assert_int_equal(only(j, CPS_JA_INSTALL)->last, 0);
    assert_int_equal(cps__joiner_result(j, 0, 0, 0, now), 0);
}

static void test_numbered_chunks_install(void **state)
{
    fixture *f = *state;
    start_join(f->j, &f->v, JOIN_ID, 0);
    take_chunk(f->j, JOIN_ID, 0, 1);
    take_chunk(f->j, JOIN_ID, 1, 2);
    finish_join(f->j, JOIN_ID, 2, SNAP_SEQ, 3);
    assert_int_equal(cps__joiner_bytes(f->j, 0), 2 * 4096 + 100);
}

/* nanomsg reconnected under the stream and chunk 1 was lost with the old connection: the last
 * chunk must not be installed over a copy lacking chunk 1's records, and the scheduler hears at
 * once that the join is over, so it orders another. */
static void test_chunk_gap_gives_up(void **state)
{
    fixture *f = *state;
    cps__joiner *j = f->j;
    start_join(j, &f->v, JOIN_ID, 0);
    take_chunk(j, JOIN_ID, 0, 1);
    assert_int_equal(cps__joiner_snap(j, 3, 0, JOIN_ID, 2, SNAP_SEQ, 1, 100, 1, 2),
                     CPS_JOINER_TAKEN);
    expect_gave_up(j, 0, CPS_EPROTO, JOIN_ID);
    assert_int_equal(cps__joiner_result(j, 0, 0, SNAP_SEQ, 2), CPS_EINVAL); /* no INSTALL */
    /* What still comes of that stream finds the join over. */
    assert_int_equal(cps__joiner_snap(j, 3, 0, JOIN_ID, 3, SNAP_SEQ, 1, 100, 1, 3),
                     CPS_JOINER_IGNORED);
    assert_int_equal(cps__joiner_snap(j, 3, 0, JOIN_ID, 1, SNAP_SEQ, 0, 100, 1, 3),
                     CPS_JOINER_IGNORED);
    assert_int_equal(cps__joiner_tick(j, 4, serve_yes, NULL), 0); /* nothing to confirm */
    /* The next join counts its own stream from 0. */
    start_join(j, &f->v, JOIN_ID + 1, 10);
    finish_join(j, JOIN_ID + 1, 0, SNAP_SEQ, 11);
}

static void test_repeated_chunk_ignored(void **state)
{
    fixture *f = *state;
    cps__joiner *j = f->j;
    start_join(j, &f->v, JOIN_ID, 0);
    take_chunk(j, JOIN_ID, 0, 1);
    take_chunk(j, JOIN_ID, 1, 2);
    assert_int_equal(cps__joiner_snap(j, 3, 0, JOIN_ID, 1, SNAP_SEQ, 0, 4096, 1, 3),
                     CPS_JOINER_IGNORED);
    assert_int_equal(cps__joiner_actions(j, NULL), 0);
    assert_int_equal(cps__joiner_active(j, 0), 1);
    finish_join(j, JOIN_ID, 2, SNAP_SEQ, 4);
    assert_int_equal(cps__joiner_bytes(j, 0), 2 * 4096 + 100);
}

/* The source served a repeat of our SNAP_REQ with a new read once its first stream was over
 * (that one broke for good after chunk 1): the new stream's chunks are written from its chunk 0
 * on, none of them skipped as a repeat of the first stream's, so the install is one read's. */
static void test_second_stream_starts_over(void **state)
{
    fixture *f = *state;
    cps__joiner *j = f->j;
    start_join(j, &f->v, JOIN_ID, 0);
    take_chunk(j, JOIN_ID, 0, 1);
    take_chunk(j, JOIN_ID, 1, 2);
    take_chunk(j, JOIN_ID, 0, 3);
    take_chunk(j, JOIN_ID, 1, 4);
    finish_join(j, JOIN_ID, 2, SNAP_SEQ, 5);
}

/* Chunk `num` of the read at `seq` (not the last) is dropped: nothing written. */
static void drop_chunk(cps__joiner *j, uint32_t num, uint64_t seq, uint64_t now)
{
    assert_int_equal(cps__joiner_snap(j, 3, 0, JOIN_ID, num, seq, 0, 7, 1, now),
                     CPS_JOINER_IGNORED);
    assert_int_equal(cps__joiner_actions(j, NULL), 0);
}

/* Stream A (an earlier read, cut short while its chunks were on the wire) and stream B of the
 * same join interleave as A0, B0, A1, B1, A2, B2: every chunk of A after B0 is dropped and B's
 * own chunks are all taken, so what is installed is B's read alone. */
static void test_cut_stream_not_mixed(void **state)
{
    fixture *f = *state;
    cps__joiner *j = f->j;
    start_join(j, &f->v, JOIN_ID, 0);
    const uint64_t a = SNAP_SEQ - 2;
    assert_int_equal(cps__joiner_snap(j, 3, 0, JOIN_ID, 0, a, 0, 7, 1, 1), CPS_JOINER_TAKEN);
    assert_int_equal(cps__joiner_result(j, 0, 0, 0, 1), 0);
    take_chunk(j, JOIN_ID, 0, 2); /* B0: a new stream, counted from 0 */
    drop_chunk(j, 1, a, 3);       /* A1 is not B1 */
    take_chunk(j, JOIN_ID, 1, 4);
    drop_chunk(j, 2, a, 5);
    finish_join(j, JOIN_ID, 2, SNAP_SEQ, 6);
    assert_int_equal(cps__joiner_bytes(j, 0), 7 + 2 * 4096 + 100);
}

/* A0 comes late, after B0: it restarts nothing, and B goes on to its end. */
static void test_late_first_chunk_dropped(void **state)
{
    fixture *f = *state;
    cps__joiner *j = f->j;
    start_join(j, &f->v, JOIN_ID, 0);
    take_chunk(j, JOIN_ID, 0, 1);
    drop_chunk(j, 0, SNAP_SEQ - 1, 2);
    take_chunk(j, JOIN_ID, 1, 3);
    drop_chunk(j, 1, SNAP_SEQ - 1, 4);
    finish_join(j, JOIN_ID, 2, SNAP_SEQ, 5);
    assert_int_equal(cps__joiner_bytes(j, 0), 2 * 4096 + 100);
}

/* A chunk of another join is judged by its join id before its number: one whose number would be
 * a gap in ours ends nothing, and one whose number is ours next is not taken. */
static void test_other_join_chunk_ignored(void **state)
{
    fixture *f = *state;
    cps__joiner *j = f->j;
    start_join(j, &f->v, JOIN_ID, 0);
    take_chunk(j, JOIN_ID, 0, 1);
    assert_int_equal(cps__joiner_snap(j, 3, 0, JOIN_ID - 1, 5, SNAP_SEQ, 1, 10, 1, 2),
                     CPS_JOINER_IGNORED);
    assert_int_equal(cps__joiner_snap(j, 3, 0, JOIN_ID + 1, 1, SNAP_SEQ, 1, 10, 1, 2),
                     CPS_JOINER_IGNORED);
    assert_int_equal(cps__joiner_actions(j, NULL), 0);
    assert_int_equal(cps__joiner_active(j, 0), 1);
    finish_join(j, JOIN_ID, 1, SNAP_SEQ, 3);
}

static void test_duplicates_after_done(void **state)
{
    fixture *f = *state;
    cps__joiner *j = f->j;
    cps__view *v = &f->v;
    start_join(j, v, JOIN_ID, 0);
    finish_join(j, JOIN_ID, 0, SNAP_SEQ, 1);
    /* The last chunk again: the join is over, nothing is written or reported twice. */
    assert_int_equal(cps__joiner_snap(j, 3, 0, JOIN_ID, 0, SNAP_SEQ, 1, 100, 1, 2),
                     CPS_JOINER_IGNORED);
    assert_int_equal(cps__joiner_actions(j, NULL), 0);
    /* The order again: clearing the copy just reported would lose it. */
    assert_int_equal(cps__joiner_order(j, v, 0, 3, JOIN_ID, 7, 3), CPS_JOINER_IGNORED);
    assert_int_equal(cps__joiner_actions(j, NULL), 0);
    /* A repeat of the order under way is no new join either. */
    start_join(j, v, JOIN_ID + 1, 4);
    assert_int_equal(cps__joiner_order(j, v, 0, 3, JOIN_ID + 1, 7, 5), CPS_JOINER_IGNORED);
    assert_int_equal(cps__joiner_actions(j, NULL), 0);
}

static void test_caught_up_confirmed_once(void **state)
{
    fixture *f = *state;
    cps__joiner *j = f->j;
    cps__view *v = &f->v;
    start_join(j, v, JOIN_ID, 0);
    finish_join(j, JOIN_ID, 0, SNAP_SEQ, 1);
    /* Not yet holding what the predecessor acknowledged: no second report. */
    assert_int_equal(cps__joiner_tick(j, 100, serve_no, NULL), 0);
    assert_int_equal(cps__joiner_tick(j, 200, NULL, NULL), 0);
    /* The scheduler appends us (view 8); once we may serve reads, CAUGHT_UP aux 1, once. */
    v->epoch = 8;
    v->ranges[0].chain[v->ranges[0].chain_len++] = SELF;
    assert_int_equal(cps__joiner_view(j, v, 300), 0);
    assert_int_equal(cps__joiner_tick(j, 400, serve_yes, NULL), 1);
    const cps__joiner_action *a = only(j, CPS_JA_SEND);
    expect_send(a, 0, CPS_MSG_CAUGHT_UP, JOIN_ID, 1);
    assert_int_equal(a->hdr.epoch, 8);
    assert_int_equal(cps__joiner_tick(j, 500, serve_yes, NULL), 0);
    assert_int_equal(cps__joiner_tick(j, 10 * TIMEOUT, serve_yes, NULL), 0);
}

static void test_view_makes_member(void **state)
{
    fixture *f = *state;
    cps__joiner *j = f->j;
    cps__view *v = &f->v;
    start_join(j, v, JOIN_ID, 0);
    /* A view counts us in the chain before our snapshot is in: the join ends, and the chunks
     * that still come are not written into a store the chain serves from. */
    v->epoch = 8;
    v->ranges[0].chain[v->ranges[0].chain_len++] = SELF;
    assert_int_equal(cps__joiner_view(j, v, 10), 2);
    expect_gave_up(j, 0, CPS_ESTALE_EPOCH, JOIN_ID);
    assert_int_equal(cps__joiner_snap(j, 3, 0, JOIN_ID, 0, SNAP_SEQ, 1, 10, 1, 11),
                     CPS_JOINER_IGNORED);
    /* Nothing to confirm: no CAUGHT_UP was sent for it. */
    assert_int_equal(cps__joiner_tick(j, 12, serve_yes, NULL), 0);
}

static void test_chain_not_joining(void **state)
{
    fixture *f = *state;
    cps__joiner *j = f->j;
    cps__view *v = &f->v;
    start_join(j, v, JOIN_ID, 0);
    /* The chain's join ended (cps__chain_joining is 0): the chunk must not be written. */
    assert_int_equal(cps__joiner_snap(j, 3, 0, JOIN_ID, 0, SNAP_SEQ, 1, 10, 0, 5),
                     CPS_JOINER_TAKEN);
    expect_gave_up(j, 0, CPS_ESTALE_EPOCH, JOIN_ID);
}

static void test_source_leaves(void **state)
{
    fixture *f = *state;
    cps__joiner *j = f->j;
    cps__view *v = &f->v;
    start_join(j, v, JOIN_ID, 0);
    /* The source (3) dies: view 8 has 1 -> 2, and the scheduler abandoned that join. */
    v->epoch = 8;
    v->nodes[2].alive = 0;
    v->ranges[0].chain_len = 2;
    v->ranges[1].chain_len = 2;
    assert_int_equal(cps__joiner_view(j, v, 10), 2);
    expect_gave_up(j, 0, CPS_ESTALE_EPOCH, JOIN_ID);
    /* Its next order names the new tail (2): the copy starts again from it. */
    assert_int_equal(cps__joiner_order(j, v, 0, 2, JOIN_ID + 1, 8, 20), CPS_JOINER_TAKEN);
    assert_int_equal(only(j, CPS_JA_BEGIN)->source, 2);
    assert_int_equal(cps__joiner_result(j, 0, 0, 0, 20), 1);
    const cps__joiner_action *a = only(j, CPS_JA_SEND);
    expect_send(a, 2, CPS_MSG_SNAP_REQ, JOIN_ID + 1, 0);
    assert_int_equal(a->hdr.epoch, 8);
    assert_int_equal(cps__joiner_source(j, 0), 2);
    /* A late chunk of the old source is not taken. */
    assert_int_equal(cps__joiner_snap(j, 3, 0, JOIN_ID, 0, SNAP_SEQ, 1, 10, 1, 21),
                     CPS_JOINER_IGNORED);
}

static void test_retry_and_give_up(void **state)
{
    fixture *f = *state;
    cps__joiner *j = f->j;
    cps__view *v = &f->v;
    start_join(j, v, JOIN_ID, 1000);
    assert_int_equal(cps__joiner_tick(j, 1000 + RETRY, NULL, NULL), 0);
    /* No chunk after snap_retry_ms: SNAP_REQ again (lost, or the tail lagged a view). */
    assert_int_equal(cps__joiner_tick(j, 1001 + RETRY, NULL, NULL), 1);
    expect_send(only(j, CPS_JA_SEND), 3, CPS_MSG_SNAP_REQ, JOIN_ID, 0);
    assert_int_equal(cps__joiner_tick(j, 1002 + RETRY, NULL, NULL), 0);
    /* A chunk came: no more re-sends, but the deadline still holds. */
    assert_int_equal(cps__joiner_snap(j, 3, 0, JOIN_ID, 0, SNAP_SEQ, 0, 10, 1, 2500),
                     CPS_JOINER_TAKEN);
    assert_int_equal(cps__joiner_result(j, 0, 0, 0, 2500), 0);
    assert_int_equal(cps__joiner_tick(j, 1000 + TIMEOUT, NULL, NULL), 0);
    assert_int_equal(cps__joiner_tick(j, 1001 + TIMEOUT, NULL, NULL), 2);
    expect_gave_up(j, 0, CPS_ETIMEDOUT, JOIN_ID);
    assert_int_equal(cps__joiner_tick(j, 2 * TIMEOUT, NULL, NULL), 0);
}

static void test_failed_steps(void **state)
{
    fixture *f = *state;
    cps__joiner *j = f->j;
    cps__view *v = &f->v;
    /* Clearing the old copy fails: given up, reported under the new join's id. */
    assert_int_equal(cps__joiner_order(j, v, 0, 3, JOIN_ID, 7, 0), CPS_JOINER_TAKEN);
    assert_int_equal(cps__joiner_result(j, 0, CPS_ENOSPC, 0, 0), 2);
    expect_gave_up(j, 0, CPS_ENOSPC, JOIN_ID);
    /* Replaying fails after the snapshot: given up too, nothing to confirm. */
    start_join(j, v, JOIN_ID + 1, 10);
    assert_int_equal(cps__joiner_snap(j, 3, 0, JOIN_ID + 1, 0, SNAP_SEQ, 1, 10, 1, 11),
                     CPS_JOINER_TAKEN);
    assert_int_equal(cps__joiner_result(j, 0, 0, SNAP_SEQ, 11), 1);
    assert_int_equal(cps__joiner_result(j, 0, CPS_EPROTO, 0, 11), 2);
    expect_gave_up(j, 0, CPS_EPROTO, JOIN_ID + 1);
    assert_int_equal(cps__joiner_tick(j, 12, serve_yes, NULL), 0);
}

static void test_newer_order_replaces(void **state)
{
    fixture *f = *state;
    cps__joiner *j = f->j;
    cps__view *v = &f->v;
    start_join(j, v, JOIN_ID, 0);
    assert_int_equal(cps__joiner_order(j, v, 0, 3, JOIN_ID + 5, 7, 10), CPS_JOINER_TAKEN);
    const cps__joiner_action *a;
    assert_int_equal(cps__joiner_actions(j, &a), 2);
    assert_int_equal(a[0].kind, CPS_JA_ABORT);
    assert_null(a[0].why); /* replaced, not failed: nothing to log or report */
    assert_int_equal(a[1].kind, CPS_JA_BEGIN);
}

static void test_reordered_orders(void **state)
{
    (void)state;
    cps__view v;
    make_view(&v, 7);
    /* In order (production): an order of a view we have not installed goes ahead. */
    cps__joiner *j = make_joiner(0);
    cps__joiner_view(j, &v, 0);
    assert_int_equal(cps__joiner_order(j, &v, 0, 3, JOIN_ID, 8, 0), CPS_JOINER_TAKEN);
    cps__joiner_destroy(j);
    /* Reordering network (the sim): it asks for the view instead, and a late order of an
     * earlier join than one seen is dropped. */
    j = make_joiner(1);
    cps__joiner_view(j, &v, 0);
    assert_int_equal(cps__joiner_order(j, &v, 0, 3, JOIN_ID, 8, 0), CPS_JOINER_IGNORED);
    only(j, CPS_JA_ASK_VIEW);
    start_join(j, &v, JOIN_ID, 1);
    assert_int_equal(cps__joiner_order(j, &v, 0, 3, JOIN_ID - 1, 7, 2), CPS_JOINER_IGNORED);
    assert_int_equal(cps__joiner_actions(j, NULL), 0);
    /* An unknown source or range is never taken. */
    assert_int_equal(cps__joiner_order(j, &v, 1, 77, JOIN_ID + 1, 7, 3), CPS_JOINER_IGNORED);
    assert_int_equal(cps__joiner_order(j, &v, NRANGES, 3, JOIN_ID + 1, 7, 3), CPS_JOINER_IGNORED);
    cps__joiner_destroy(j);
    cps__view_fini(&v);
}

static void test_bad_config(void **state)
{
    (void)state;
    cps__joiner *j = NULL;
    cps__joiner_config cfg = {SELF, NRANGES, 0, RETRY, 0};
    assert_int_equal(cps__joiner_create(&cfg, &j), CPS_EINVAL);
    cfg.timeout_ms = TIMEOUT;
    cfg.snap_retry_ms = 0;
    assert_int_equal(cps__joiner_create(&cfg, &j), CPS_EINVAL);
    assert_int_equal(cps__joiner_create(NULL, &j), CPS_EINVAL);
    cps__joiner_destroy(NULL);
    /* A view of another range count is refused. */
    j = make_joiner(0);
    cps__view v;
    make_view(&v, 7);
    v.nranges = 1;
    assert_int_equal(cps__joiner_view(j, &v, 0), CPS_EINVAL);
    v.nranges = NRANGES;
    cps__joiner_destroy(j);
    cps__view_fini(&v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_snapshot_in_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stale_chunks_ignored, setup, teardown),
        cmocka_unit_test_setup_teardown(test_numbered_chunks_install, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chunk_gap_gives_up, setup, teardown),
        cmocka_unit_test_setup_teardown(test_repeated_chunk_ignored, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_join_chunk_ignored, setup, teardown),
        cmocka_unit_test_setup_teardown(test_second_stream_starts_over, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cut_stream_not_mixed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_late_first_chunk_dropped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_duplicates_after_done, setup, teardown),
        cmocka_unit_test_setup_teardown(test_caught_up_confirmed_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_view_makes_member, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chain_not_joining, setup, teardown),
        cmocka_unit_test_setup_teardown(test_source_leaves, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retry_and_give_up, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_steps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_newer_order_replaces, setup, teardown),
        cmocka_unit_test(test_reordered_orders),
        cmocka_unit_test(test_bad_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
