/* unit.store_lmdb: records (create, get, apply, read), idempotent create, errors, ranges with
 * their dedup and meta, scans and checksums. */
#include "fixture.h"

#include <math.h>

void test_create_get_apply_read(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    enum { L = 37 };
    cps__param_spec sp = spec_of(CPS_W_OPT_ADAM, CPS_W_INIT_UNIFORM, 0.01f);
    assert_int_equal(create(f->s, 42, L, 100, &sp), 0);

    float want[L], got[L], st[2 * L], gst[2 * L], grad[L];
    cps__init_fill(&sp, 100, want, L);
    op g = {.key = 42, .copy = got, .copy_state = gst};
    assert_int_equal(cps__store_read(f->s, do_get, &g), 0);
    assert_int_equal(g.rec.len, L);
    assert_int_equal(g.rec.opt_step, 0);
    assert_int_equal(g.rec.spec.opt_kind, CPS_W_OPT_ADAM);
    assert_int_equal(g.rec.spec.init_seed, 77);
    assert_true(g.rec.spec.beta1 == 0.9f && g.rec.spec.beta2 == 0.999f); /* defaults stored */
    assert_memory_equal(got, want, sizeof want);
    memset(st, 0, sizeof st);
    assert_memory_equal(gst, st, sizeof st);

    /* Three applies give exactly the bits of the optimizer run by hand with t = 1, 2, 3. */
    for (int t = 1; t <= 3; t++) {
        for (int i = 0; i < L; i++)
            grad[i] = (float)(i - 18) * 0.01f * (float)t;
        assert_int_equal(apply(f->s, 42, grad, L), 0);
        assert_int_equal(cps__optim_apply(&g.rec.spec, want, st, grad, L, (uint64_t)t), 0);
    }
    assert_int_equal(read_vals(f->s, 42, got, L), 0);
    assert_memory_equal(got, want, sizeof want);
    assert_int_equal(cps__store_read(f->s, do_get, &g), 0);
    assert_int_equal(g.rec.opt_step, 3);
    assert_memory_equal(gst, st, sizeof st);
}

void test_create_idempotent(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    cps__param_spec sp = spec_of(CPS_W_OPT_MOMENTUM, CPS_W_INIT_NORMAL, 0.1f);
    sp.momentum = 0.9f;
    float g[8] = {1, 1, 1, 1, 1, 1, 1, 1}, before[8], after[8];
    assert_int_equal(create(f->s, 1, 8, 0, &sp), 0);
    assert_int_equal(apply(f->s, 1, g, 8), 0);
    assert_int_equal(read_vals(f->s, 1, before, 8), 0);
    /* Same definition (a restarted worker): no-op, trained values kept. */
    assert_int_equal(create(f->s, 1, 8, 0, &sp), 0);
    assert_int_equal(read_vals(f->s, 1, after, 8), 0);
    assert_memory_equal(before, after, sizeof before);
    /* Different length or hyper-parameter: refused. */
    assert_int_equal(create(f->s, 1, 9, 0, &sp), CPS_EEXIST);
    cps__param_spec other = sp;
    other.lr = 0.2f;
    assert_int_equal(create(f->s, 1, 8, 0, &other), CPS_EEXIST);
    other = sp;
    other.nesterov = 1;
    assert_int_equal(create(f->s, 1, 8, 0, &other), CPS_EEXIST);
    /* 0 means "default": declaring with 0 and with the default value is the same tensor. */
    cps__param_spec a0 = spec_of(CPS_W_OPT_ADAM, CPS_W_INIT_ZEROS, 0.01f), ad = a0;
    ad.beta1 = 0.9f, ad.beta2 = 0.999f, ad.eps = 1e-8f;
    assert_int_equal(create(f->s, 2, 4, 0, &a0), 0);
    assert_int_equal(create(f->s, 2, 4, 0, &ad), 0);
    /* Bad arguments. */
    assert_int_equal(create(f->s, 3, 0, 0, &sp), CPS_EINVAL);
    cps__param_spec bad = sp;
    bad.opt_kind = 17;
    assert_int_equal(create(f->s, 3, 4, 0, &bad), CPS_EINVAL);
}

void test_errors(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    float v[4] = {0};
    op g = {.key = 9};
    assert_int_equal(cps__store_read(f->s, do_get, &g), CPS_ENOTFOUND);
    assert_int_equal(read_vals(f->s, 9, v, 4), CPS_ENOTFOUND);
    assert_int_equal(apply(f->s, 9, v, 4), CPS_ENOTFOUND);
    cps__param_spec sp = spec_of(CPS_W_OPT_SGD, CPS_W_INIT_CONSTANT, 0.1f);
    assert_int_equal(create(f->s, 9, 4, 0, &sp), 0);
    assert_int_equal(apply(f->s, 9, v, 3), CPS_ESIZE);
    assert_int_equal(read_vals(f->s, 9, v, 5), CPS_ESIZE);
    /* A transaction function that fails is rolled back, its error returned. */
    op c = {.key = 10, .len = 4, .spec = sp, .fail_after = CPS_EAGAIN};
    assert_int_equal(cps__store_write(f->s, do_create, &c), CPS_EAGAIN);
    assert_int_equal(read_vals(f->s, 10, v, 4), CPS_ENOTFOUND);
}

void test_ranges_dedup_meta(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    assert_int_equal(cps__store_write(f->s, do_misc_put, NULL), 0);
    misc x;
    memset(&x, 0, sizeof x);
    assert_int_equal(cps__store_read(f->s, do_misc_get, &x), 0);
    assert_true(x.m.seq == 123456789012ull && x.m.step == 77);
    assert_true(x.seq[0] == 5 && x.seq[1] == 7 && x.seq[2] == UINT64_MAX && x.seq[3] == 0);
    assert_int_equal(x.rc[0], 0);
    assert_int_equal(x.len, 8);
    assert_memory_equal(x.buf, "server-3", 8);
    assert_int_equal(x.rc[1], CPS_ESIZE);
    assert_int_equal(x.rc[2], CPS_ENOTFOUND);
    assert_int_equal(x.rc[3], CPS_EINVAL);
}

void test_scan(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    /* Integer keys sort numerically (not bytewise): 256 after 3, 2^40 after 1000. */
    const uint64_t keys[] = {1000, 5, 1ull << 40, 256, 3, UINT64_MAX, 1};
    cps__param_spec sp = spec_of(CPS_W_OPT_SGD, CPS_W_INIT_ZEROS, 0.1f);
    for (size_t i = 0; i < 7; i++)
        assert_int_equal(create(f->s, keys[i], (uint32_t)(i + 1), 0, &sp), 0);
    scan sc = {.lo = 0, .hi = UINT64_MAX};
    assert_int_equal(cps__store_read(f->s, do_scan, &sc), 0);
    const uint64_t sorted[] = {1, 3, 5, 256, 1000, 1ull << 40, UINT64_MAX};
    assert_int_equal(sc.n, 7);
    assert_int_equal(sc.rc, 0);
    assert_memory_equal(sc.keys, sorted, sizeof sorted);
    assert_int_equal(sc.lens[0], 7);

    sc = (scan){.lo = 3, .hi = 1000};
    cps__store_read(f->s, do_scan, &sc);
    assert_int_equal(sc.n, 4);
    assert_true(sc.keys[0] == 3 && sc.keys[3] == 1000);
    sc = (scan){.lo = 4, .hi = 255};
    cps__store_read(f->s, do_scan, &sc);
    assert_true(sc.n == 1 && sc.keys[0] == 5);
    sc = (scan){.lo = 6, .hi = 200};
    cps__store_read(f->s, do_scan, &sc);
    assert_int_equal(sc.n, 0);
    sc = (scan){.lo = 10, .hi = 2};
    cps__store_read(f->s, do_scan, &sc);
    assert_int_equal(sc.n, 0);
    sc = (scan){.lo = 0, .hi = UINT64_MAX, .stop_at = 2};
    cps__store_read(f->s, do_scan, &sc);
    assert_int_equal(sc.n, 2);
    assert_int_equal(sc.rc, 1234);

    uint64_t kv[2];
    assert_int_equal(cps__store_read(f->s, do_count, kv), 0);
    assert_int_equal(kv[0], 7);
    assert_int_equal(kv[1], 28);
}

static uint64_t checksum(cps__store *s, uint64_t lo, uint64_t hi)
{
    csum c = {lo, hi, 0};
    assert_int_equal(cps__store_read(s, do_csum, &c), 0);
    return c.h;
}

void test_checksum(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    fixture g;
    int n = snprintf(g.dir, sizeof g.dir, "%s2", f->dir);
    assert_true(n > 0 && (size_t)n < sizeof g.dir);
    assert_int_equal(cps__store_open(g.dir, NULL, &g.s), 0);

    cps__param_spec sp = spec_of(CPS_W_OPT_SGD, CPS_W_INIT_NORMAL, 0.1f);
    /* Same content written in a different order: equal sums (the sum follows key order). */
    for (uint64_t k = 0; k < 10; k++)
        assert_int_equal(create(f->s, k * 3, 16, k * 16, &sp), 0);
    for (uint64_t k = 10; k-- > 0;)
        assert_int_equal(create(g.s, k * 3, 16, k * 16, &sp), 0);
    uint64_t a = checksum(f->s, 0, UINT64_MAX), b = checksum(g.s, 0, UINT64_MAX);
    assert_true(a == b);
    assert_true(checksum(f->s, 3, 9) == checksum(g.s, 3, 9));
    assert_true(checksum(f->s, 3, 9) != a);

    /* One bit of one value flipped on one replica: different. */
    float vals[16];
    op o = {.key = 12, .copy = vals};
    assert_int_equal(cps__store_read(g.s, do_get, &o), 0);
    vals[5] = nextafterf(vals[5], 1e30f); /* lowest mantissa bit */
    o.rec.vals = vals;
    assert_int_equal(cps__store_write(g.s, do_put, &o), 0);
    assert_true(checksum(g.s, 0, UINT64_MAX) != a);
    assert_true(checksum(g.s, 0, 11) == checksum(f->s, 0, 11));
    cps__store_close(g.s); /* its directory sits beside f's: teardown removes both */
}
