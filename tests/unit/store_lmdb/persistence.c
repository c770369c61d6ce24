/* unit.store_lmdb: a store reopened keeps its records; damaged records and bad directories are
 * refused with a named error and a message. */
#include "fixture.h"

#include <fcntl.h>
#include <lmdb.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/log.h"

void test_reopen(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    cps__param_spec sp = spec_of(CPS_W_OPT_RMSPROP, CPS_W_INIT_NORMAL, 0.01f);
    float g[10], before[10], after[10];
    for (int i = 0; i < 10; i++)
        g[i] = (float)i - 4.5f;
    assert_int_equal(create(f->s, 7, 10, 0, &sp), 0);
    assert_int_equal(apply(f->s, 7, g, 10), 0);
    assert_int_equal(apply(f->s, 7, g, 10), 0);
    assert_int_equal(cps__store_write(f->s, do_misc_put, NULL), 0);
    assert_int_equal(cps__store_sync(f->s), 0);
    assert_int_equal(read_vals(f->s, 7, before, 10), 0);
    cps__store_close(f->s);
    f->s = NULL;

    /* Restarted server: a smaller initial map than the data must still open. */
    cps__store_opts o = {.initial_map_bytes = 1 << 16, .sync_every_commit = 1};
    assert_int_equal(cps__store_open(f->dir, &o, &f->s), 0);
    assert_int_equal(read_vals(f->s, 7, after, 10), 0);
    assert_memory_equal(before, after, sizeof before);
    op o2 = {.key = 7};
    assert_int_equal(cps__store_read(f->s, do_get, &o2), 0);
    assert_int_equal(o2.rec.opt_step, 2);
    misc x;
    memset(&x, 0, sizeof x);
    assert_int_equal(cps__store_read(f->s, do_misc_get, &x), 0);
    assert_true(x.m.seq == 123456789012ull && x.seq[1] == 7);
    /* Training continues where it stopped. */
    assert_int_equal(apply(f->s, 7, g, 10), 0);
    assert_int_equal(cps__store_read(f->s, do_get, &o2), 0);
    assert_int_equal(o2.rec.opt_step, 3);
}

static char last_log[1024];
static void capture(void *ctx, int level, const char *sub, const char *line)
{
    (void)ctx, (void)sub;
    if (level == CPS_LOG_ERROR)
        snprintf(last_log, sizeof last_log, "%s", line);
}

/* Damage records behind the store's back, through LMDB itself. */
static void corrupt(const char *dir, uint64_t key, int how)
{
    MDB_env *env;
    MDB_txn *t;
    MDB_dbi dbi;
    assert_int_equal(mdb_env_create(&env), 0);
    assert_int_equal(mdb_env_set_maxdbs(env, 8), 0);
    assert_int_equal(mdb_env_open(env, dir, 0, 0664), 0);
    assert_int_equal(mdb_txn_begin(env, NULL, 0, &t), 0);
    assert_int_equal(mdb_dbi_open(t, "params", MDB_INTEGERKEY, &dbi), 0);
    MDB_val k = {sizeof key, &key}, d;
    assert_int_equal(mdb_get(t, dbi, &k, &d), 0);
    unsigned char buf[4096];
    assert_true(d.mv_size <= sizeof buf);
    memcpy(buf, d.mv_data, d.mv_size);
    MDB_val nd = {d.mv_size, buf};
    if (how == 0)
        buf[0] = 99; /* unknown format version */
    else
        nd.mv_size -= 4; /* one value short */
    assert_int_equal(mdb_put(t, dbi, &k, &nd, 0), 0);
    assert_int_equal(mdb_txn_commit(t), 0);
    mdb_env_close(env);
}

void test_corrupt(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    cps__param_spec sp = spec_of(CPS_W_OPT_ADAM, CPS_W_INIT_UNIFORM, 0.01f);
    for (uint64_t k = 1; k <= 3; k++)
        assert_int_equal(create(f->s, k * 11, 8, 0, &sp), 0);
    cps__store_close(f->s);
    f->s = NULL;
    corrupt(f->dir, 22, 0);
    corrupt(f->dir, 33, 1);
    open_store(f, 0);

    cps__log_set_sink(capture, NULL);
    float v[8], g[8] = {0};
    op o = {.key = 22};
    last_log[0] = '\0';
    assert_int_equal(cps__store_read(f->s, do_get, &o), CPS_ECORRUPT);
    assert_non_null(strstr(last_log, "key 22"));
    assert_int_equal(read_vals(f->s, 33, v, 8), CPS_ECORRUPT);
    assert_non_null(strstr(last_log, "key 33"));
    assert_int_equal(apply(f->s, 33, g, 8), CPS_ECORRUPT);
    assert_int_equal(create(f->s, 22, 8, 0, &sp), CPS_ECORRUPT);
    scan sc = {.lo = 0, .hi = UINT64_MAX};
    cps__store_read(f->s, do_scan, &sc);
    assert_int_equal(sc.rc, CPS_ECORRUPT);
    assert_int_equal(sc.n, 1); /* key 11 is fine and came first */
    csum c = {0, UINT64_MAX, 0};
    assert_int_equal(cps__store_read(f->s, do_csum, &c), CPS_ECORRUPT);
    cps__log_set_sink(NULL, NULL);
    /* The healthy key still works. */
    assert_int_equal(apply(f->s, 11, g, 8), 0);
}

void test_open_errors(void **state)
{
    fixture *f = *state;
    cps__store *s = NULL;
    assert_int_equal(cps__store_open(NULL, NULL, &s), CPS_EINVAL);
    assert_int_equal(cps__store_open("", NULL, &s), CPS_EINVAL);
    cps__log_set_sink(capture, NULL);
    /* A path under a regular file cannot be created. */
    char file[600];
    open_store(f, 0);
    snprintf(file, sizeof file, "%s/data.mdb/x", f->dir);
    assert_int_equal(cps__store_open(file, NULL, &s), CPS_ESTORE);
    cps__log_set_sink(NULL, NULL);
    assert_null(s);
    cps__store_close(NULL);
}
