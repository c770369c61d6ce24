/* unit.store_lmdb: checkpoint restore (reset and slices) and read views (snapshots) held while
 * training rewrites the store. */
#include "fixture.h"

#include <sys/stat.h>

typedef struct slice_op {
    uint64_t key;
    uint32_t len, slot;
    uint64_t opt_step, first, n;
    cps__param_spec spec;
    const float *vals;
    int reset;
} slice_op;

static int do_slice(cps__txn *t, void *a)
{
    slice_op *o = a;
    if (o->reset)
        return cps__store_param_reset(t, o->key, o->len, o->opt_step, &o->spec);
    return cps__store_param_write(t, o->key, o->slot, o->first, o->vals, o->n);
}

void test_reset_and_write_slices(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    cps__param_spec adam = spec_of(CPS_W_OPT_ADAM, CPS_W_INIT_UNIFORM, 0.01f);
    adam.beta1 = 0.9f;
    adam.beta2 = 0.999f;
    adam.eps = 1e-8f;
    slice_op o = {.key = 9, .len = 6, .opt_step = 41, .spec = adam, .reset = 1};
    assert_int_equal(cps__store_write(f->s, do_slice, &o), 0);
    /* Zeros everywhere, the step as given. */
    float v[6], st[12];
    op g = {.key = 9, .copy = v, .copy_state = st};
    assert_int_equal(cps__store_read(f->s, do_get, &g), 0);
    assert_int_equal(g.rec.len, 6);
    assert_int_equal(g.rec.opt_step, 41);
    for (int i = 0; i < 6; i++)
        assert_true(v[i] == 0.0f);
    /* Slices of the values and of the second state slot land where they are aimed. */
    const float a[3] = {1, 2, 3}, b[2] = {7, 8};
    slice_op w1 = {.key = 9, .slot = 0, .first = 2, .n = 3, .vals = a};
    slice_op w2 = {.key = 9, .slot = 2, .first = 4, .n = 2, .vals = b};
    assert_int_equal(cps__store_write(f->s, do_slice, &w1), 0);
    assert_int_equal(cps__store_write(f->s, do_slice, &w2), 0);
    assert_int_equal(cps__store_read(f->s, do_get, &g), 0);
    const float want_v[6] = {0, 0, 1, 2, 3, 0};
    const float want_st[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 8};
    assert_memory_equal(v, want_v, sizeof v);
    assert_memory_equal(st, want_st, sizeof st);
    assert_int_equal(g.rec.opt_step, 41);
    /* Out of bounds, a slot Adam does not have, a key that is not there. */
    slice_op bad1 = {.key = 9, .slot = 0, .first = 5, .n = 2, .vals = a};
    slice_op bad2 = {.key = 9, .slot = 3, .first = 0, .n = 1, .vals = a};
    slice_op bad3 = {.key = 10, .slot = 0, .first = 0, .n = 1, .vals = a};
    assert_int_equal(cps__store_write(f->s, do_slice, &bad1), CPS_ESIZE);
    assert_int_equal(cps__store_write(f->s, do_slice, &bad2), CPS_ESIZE);
    assert_int_equal(cps__store_write(f->s, do_slice, &bad3), CPS_ENOTFOUND);
    assert_int_equal(cps__store_read(f->s, do_get, &g), 0);
    assert_memory_equal(v, want_v, sizeof v);
}

void test_snapshot_sees_its_moment(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    cps__param_spec sgd = spec_of(CPS_W_OPT_SGD, CPS_W_INIT_ZEROS, 1.0f);
    assert_int_equal(create(f->s, 5, 4, 0, &sgd), 0);
    cps__txn *snap;
    assert_int_equal(cps__store_ensure_room(f->s), 0);
    assert_int_equal(cps__store_snapshot_begin(f->s, &snap), 0);
    const float grad[4] = {1, 1, 1, 1};
    for (int i = 0; i < 3; i++)
        assert_int_equal(apply(f->s, 5, grad, 4), 0);
    /* The read view still holds the values of its moment; a fresh read sees the updates. */
    cps__param_rec rec;
    assert_int_equal(cps__store_param_get(snap, 5, &rec), 0);
    assert_int_equal(rec.opt_step, 0);
    float then[4];
    memcpy(then, rec.vals, sizeof then);
    for (int i = 0; i < 4; i++)
        assert_true(then[i] == 0.0f);
    cps__store_snapshot_end(snap);
    float now[4];
    assert_int_equal(read_vals(f->s, 5, now, 4), 0);
    for (int i = 0; i < 4; i++)
        assert_true(now[i] == -3.0f);
    cps__store_snapshot_end(NULL);
}

/* The owner of a snapshot, as the server's checkpoint cuts are: ends it when the store is full. */
typedef struct pin_owner {
    cps__txn *snap;
    int ended;
} pin_owner;

static int end_pin(void *ctx)
{
    pin_owner *o = ctx;
    if (!o->snap)
        return 0;
    cps__store_snapshot_end(o->snap);
    o->snap = NULL;
    o->ended++;
    return 1;
}

/* Checkpoints held open while training rewrites the store, again and again (a soak's exports):
 * the map, which is the data file's size on disk, stays at the live data plus the room, rather
 * than growing each time from the highest page the last snapshot made the writer take (a 2 MB
 * model's directories reached 9 GB that way). Each snapshot that outlives the room is ended and
 * the write reuses the pages it pinned, without growing. */
void test_room_follows_live_data(void **state)
{
    fixture *f = *state;
    pin_owner own = {0};
    cps__store_opts o = {.initial_map_bytes = 1 << 20,
                         .room_min_bytes = 8u << 20,
                         .before_grow = end_pin,
                         .grow_ctx = &own};
    assert_int_equal(cps__store_open(f->dir, &o, &f->s), 0);
    enum { LEN = 1 << 18 }; /* 1 MiB of values */
    cps__param_spec sgd = spec_of(CPS_W_OPT_SGD, CPS_W_INIT_ZEROS, 1.0f);
    assert_int_equal(create(f->s, 5, LEN, 0, &sgd), 0);
    float *grad = calloc(LEN, sizeof *grad);
    assert_non_null(grad);
    for (int i = 0; i < LEN; i++)
        grad[i] = 1.0f;
    size_t target = 0;
    for (int cycle = 0; cycle < 6; cycle++) {
        assert_int_equal(cps__store_ensure_room(f->s), 0);
        assert_int_equal(cps__store_room_target(f->s, &target), 0);
        assert_int_equal(cps__store_snapshot_begin(f->s, &own.snap), 0);
        for (int step = 0; step < 40; step++) /* 40 MiB of rewrites: 5 times the room */
            assert_int_equal(apply(f->s, 5, grad, LEN), 0);
        end_pin(&own);
    }
    cps__store_stats st;
    cps__store_stats_get(f->s, &st);
    assert_true(st.pin_releases >= 6);
    assert_int_equal(own.ended, 6); /* every snapshot outlived the room, and the store ended it */
    /* 1 MiB live + 8 MiB room + slack, rounded: 32 MiB. The old sizing reached gigabytes. */
    assert_true(target <= (32u << 20));
    char path[600];
    struct stat sb;
    snprintf(path, sizeof path, "%s/data.mdb", f->dir);
    assert_int_equal(stat(path, &sb), 0);
    assert_true((size_t)sb.st_size <= target);
    /* The updates all landed: 240 steps of +1 under SGD with lr 1 from zeros. */
    assert_int_equal(read_vals(f->s, 5, grad, LEN), 0);
    assert_true(grad[0] == -240.0f && grad[LEN - 1] == -240.0f);
    free(grad);
}
