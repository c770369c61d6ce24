/* Store functions used by state transfer: scanning and clearing one range. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "store/store.h"

static char dir[256];

static int setup(void **state)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/store-transfer-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    assert_non_null(mkdtemp(dir));
    cps__store *s = NULL;
    assert_int_equal(cps__store_open(dir, NULL, &s), 0);
    *state = s;
    return 0;
}

static int teardown(void **state)
{
    cps__store_close(*state);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static cps__param_spec sgd(void)
{
    cps__param_spec sp;
    memset(&sp, 0, sizeof sp);
    sp.opt_kind = CPS_W_OPT_SGD;
    sp.lr = 0.1f;
    return sp;
}

static int fill(cps__txn *t, void *arg)
{
    (void)arg;
    cps__param_spec sp = sgd();
    for (uint64_t k = 1; k <= 20; k++) {
        int rc = cps__store_param_create(t, k * 100, 4, 0, &sp);
        if (rc)
            return rc;
    }
    cps__range_meta m = {42, 7};
    int rc = cps__store_range_put(t, 1, &m);
    rc = rc ? rc : cps__store_range_put(t, 2, &m);
    for (uint32_t w = 1; w <= 3 && !rc; w++) {
        rc = cps__store_dedup_put(t, 1, w, 10 + w);
        rc = rc ? rc : cps__store_dedup_put(t, 2, w, 20 + w);
    }
    /* SSP clocks and sparse records live beside them: a range's snapshot scans them with its
     * exactly-once records, and clearing the range drops them too. */
    rc = rc ? rc : cps__store_dedup_put(t, 1, 2 | CPS_DEDUP_CLOCK_BIT, 9);
    rc = rc ? rc : cps__store_dedup_put(t, 1, 2 | CPS_DEDUP_SPARSE_BIT, 5);
    rc = rc ? rc : cps__store_dedup_put(t, 2, 3 | CPS_DEDUP_CLOCK_BIT, 8);
    unsigned char b[8] = {1};
    rc = rc ? rc : cps__store_meta_put(t, "agg/1/a", b, 8);
    rc = rc ? rc : cps__store_meta_put(t, "agg/1/b", b, 8);
    rc = rc ? rc : cps__store_meta_put(t, "agg/10/a", b, 8);
    rc = rc ? rc : cps__store_meta_put(t, "agg/2/a", b, 8);
    return rc;
}

static int count_dedup(void *arg, uint32_t worker, uint64_t seq)
{
    /* The range's SSP clock records come back under their bit, with their value. */
    if (worker & CPS_DEDUP_CLOCK_BIT)
        assert_true(seq == ((worker & ~CPS_DEDUP_CLOCK_BIT) == 2 ? 9 : 8));
    (*(int *)arg)++;
    return 0;
}

static int count_meta(void *arg, const char *name, const void *val, size_t len)
{
    (void)name;
    (void)val;
    (void)len;
    (*(int *)arg)++;
    return 0;
}

static int count_params(void *arg, uint64_t key, const cps__param_rec *rec)
{
    (void)key;
    (void)rec;
    (*(int *)arg)++;
    return 0;
}

typedef struct counts {
    int params, dedup1, dedup2, meta1, meta_all;
    cps__range_meta r1, r2;
} counts;

static int count_all(cps__txn *t, void *arg)
{
    counts *c = arg;
    memset(c, 0, sizeof *c);
    int rc = cps__store_param_scan(t, 0, UINT64_MAX, count_params, &c->params);
    rc = rc ? rc : cps__store_dedup_scan(t, 1, count_dedup, &c->dedup1);
    rc = rc ? rc : cps__store_dedup_scan(t, 2, count_dedup, &c->dedup2);
    rc = rc ? rc : cps__store_meta_scan(t, "agg/1/", count_meta, &c->meta1);
    rc = rc ? rc : cps__store_meta_scan(t, "agg/", count_meta, &c->meta_all);
    rc = rc ? rc : cps__store_range_get(t, 1, &c->r1);
    rc = rc ? rc : cps__store_range_get(t, 2, &c->r2);
    return rc;
}

static int clear_range1(cps__txn *t, void *arg)
{
    (void)arg;
    /* Range 1 holds keys 500..1000. */
    return cps__store_range_clear(t, 1, 500, 1000, "agg/1/");
}

static int clear_last(cps__txn *t, void *arg)
{
    (void)arg;
    return cps__store_range_clear(t, 3, 1500, UINT64_MAX, NULL);
}

static void scan_then_clear_one_range(void **state)
{
    cps__store *s = *state;
    counts c;
    assert_int_equal(cps__store_write(s, fill, NULL), 0);
    assert_int_equal(cps__store_read(s, count_all, &c), 0);
    assert_int_equal(c.params, 20);
    assert_int_equal(c.dedup1, 5);
    assert_int_equal(c.dedup2, 4);
    assert_int_equal(c.meta1, 2); /* "agg/10/a" is not range 1's */
    assert_int_equal(c.meta_all, 4);
    assert_int_equal(cps__store_write(s, clear_range1, NULL), 0);
    assert_int_equal(cps__store_read(s, count_all, &c), 0);
    assert_int_equal(c.params, 14); /* keys 500..1000 gone: 6 of them */
    assert_int_equal(c.dedup1, 0);
    assert_int_equal(c.dedup2, 4);
    assert_int_equal(c.meta1, 0);
    assert_int_equal(c.meta_all, 2);
    assert_int_equal(c.r1.seq, 0);
    assert_int_equal(c.r2.seq, 42);
    /* Clearing an empty span or the last keys is fine too. */
    assert_int_equal(cps__store_write(s, clear_range1, NULL), 0);
    assert_int_equal(cps__store_write(s, clear_last, NULL), 0); /* regression: EINVAL */
    assert_int_equal(cps__store_read(s, count_all, &c), 0);
    assert_int_equal(c.params, 8); /* keys 1500..2000 (six) were the last ones */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(scan_then_clear_one_range, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
