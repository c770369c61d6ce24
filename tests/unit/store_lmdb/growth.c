/* unit.store_lmdb: the map grows under writes (once, to its need, for a write of known size) and
 * under background flushes. */
#include "fixture.h"

#include <sys/stat.h>

/* Keys from, from+step, ... below to hold the initialiser's values (key k at offset k*len). */
static void assert_init_values(cps__store *s, const cps__param_spec *sp, uint32_t len,
                               uint64_t from, uint64_t to, uint64_t step)
{
    float *got = malloc(len * sizeof(float)), *want = malloc(len * sizeof(float));
    assert_non_null(got);
    assert_non_null(want);
    for (uint64_t k = from; k < to; k += step) {
        assert_int_equal(read_vals(s, k, got, len), 0);
        cps__init_fill(sp, k * len, want, len);
        assert_memory_equal(got, want, len * sizeof(float));
    }
    free(got);
    free(want);
}

void test_map_growth(void **state)
{
    fixture *f = *state;
    open_store(f, 1 << 20);
    /* 64K floats = 256 KiB per record, 4 per transaction, 50 transactions: 50 MiB through a
     * map that starts at 1 MiB; the first transaction alone already needs a growth. */
    bulk b = {.nkeys = 4, .len = 65536, .spec = spec_of(CPS_W_OPT_SGD, CPS_W_INIT_UNIFORM, 0.1f)};
    for (int t = 0; t < 50; t++) {
        b.first = (uint64_t)t * 4;
        assert_int_equal(cps__store_write(f->s, do_bulk_create, &b), 0);
    }
    /* One transaction larger than the whole current map at once (growths inside one write). */
    bulk big = b;
    big.first = 1000;
    big.nkeys = 64; /* 16 MiB */
    assert_int_equal(cps__store_write(f->s, do_bulk_create, &big), 0);

    float *got = malloc(65536 * sizeof(float)), *want = malloc(65536 * sizeof(float));
    assert_non_null(got);
    assert_non_null(want);
    for (uint64_t k = 0; k < 200; k += 13) {
        assert_int_equal(read_vals(f->s, k, got, 65536), 0);
        cps__init_fill(&b.spec, k * 65536, want, 65536);
        assert_memory_equal(got, want, 65536 * sizeof(float));
    }
    assert_int_equal(read_vals(f->s, 1063, got, 65536), 0);
    uint64_t kv[2];
    assert_int_equal(cps__store_read(f->s, do_count, kv), 0);
    assert_int_equal(kv[0], 264);
    free(got);
    free(want);
    cps__store_stats st; /* without cps__store_reserve, writes were run again after growing */
    cps__store_stats_get(f->s, &st);
    assert_true(st.reruns > 0);
    assert_int_equal(st.reruns, st.grows);
}

/* A write whose size is known ahead (a declare) grows the map once, to its need, and is not run
 * again: before, each MDB_MAP_FULL reran it (initialising every value again) after a doubling. */
void test_reserve_once(void **state)
{
    fixture *f = *state;
    open_store(f, 1 << 20);
    /* Adam (2 state slots) and normal init: 32 records of 256 KiB values = 24 MiB in all. */
    bulk b = {.nkeys = 32, .len = 65536, .spec = spec_of(CPS_W_OPT_ADAM, CPS_W_INIT_NORMAL, 0.1f)};
    uint64_t need = 0;
    for (int i = 0; i < b.nkeys; i++)
        need += cps__store_create_bytes(b.len, b.spec.opt_kind);
    assert_true(need >= 32ull * 3 * 65536 * sizeof(float));
    assert_int_equal(cps__store_reserve(f->s, need), 0);
    cps__store_stats st;
    cps__store_stats_get(f->s, &st);
    assert_int_equal(st.grows, 1);
    assert_int_equal(cps__store_reserve(f->s, need), 0); /* room already there */
    assert_int_equal(cps__store_write(f->s, do_bulk_create, &b), 0);
    cps__store_stats_get(f->s, &st);
    assert_int_equal(st.grows, 1);
    assert_int_equal(st.reruns, 0);
    /* The map (= the data file, allocated on disk) is the need plus a modest margin. */
    char path[600];
    struct stat sb;
    snprintf(path, sizeof path, "%s/data.mdb", f->dir);
    assert_int_equal(stat(path, &sb), 0);
    assert_true((uint64_t)sb.st_size < need + (32u << 20));
    /* Values filled straight into the map are those of the initialiser. */
    assert_init_values(f->s, &b.spec, 65536, 0, 32, 7);
    /* Absurd sizes are refused, and change nothing. */
    assert_int_equal(cps__store_reserve(f->s, UINT64_MAX / 2), CPS_EINVAL);
}

/* Background flushes while the writer goes on and the map grows under them (under ASan/TSan-like
 * scrutiny in the sanitizer build): every flush completes, none fails, the data is intact, and
 * the close (which stops the flusher and flushes) leaves a store that reopens with it all. */
void test_background_sync(void **state)
{
    fixture *f = *state;
    open_store(f, 1 << 20);
    bulk b = {.nkeys = 4, .len = 16384, .spec = spec_of(CPS_W_OPT_SGD, CPS_W_INIT_UNIFORM, 0.1f)};
    for (int t = 0; t < 40; t++) {
        b.first = (uint64_t)t * 4;
        assert_int_equal(cps__store_sync_async(f->s), 0);
        assert_int_equal(cps__store_write(f->s, do_bulk_create, &b), 0); /* grows: MAP_FULL */
        if (t % 8 == 0) /* and grows on purpose, with a flush likely in flight */
            assert_int_equal(cps__store_reserve(f->s, (uint64_t)(t + 1) << 21), 0);
    }
    cps__store_sync_wait(f->s);
    cps__store_stats st;
    cps__store_stats_get(f->s, &st);
    assert_true(st.syncs >= 1);
    assert_int_equal(st.sync_fails, 0);
    assert_true(st.grows >= 2);
    cps__store_close(f->s);
    f->s = NULL;
    open_store(f, 1 << 20);
    assert_init_values(f->s, &b.spec, 16384, 0, 160, 11);
}
