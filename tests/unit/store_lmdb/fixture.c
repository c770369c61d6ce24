/* unit.store_lmdb's fixture (fixture.h): a fresh store directory per test, and the transaction
 * bodies the tests run through cps__store_write and cps__store_read. */
#include "fixture.h"

#include <ftw.h>
#include <sys/mount.h>
#include <sys/stat.h>

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    const char *tmp = getenv("TMPDIR");
    snprintf(f->dir, sizeof f->dir, "%s/cps_store_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!f->dir[0] || !mkdtemp(f->dir))
        return -1;
    /* A subdirectory that does not exist yet: open must create it (mkdir -p). */
    strncat(f->dir, "/a/b", sizeof f->dir - strlen(f->dir) - 1);
    *state = f;
    return 0;
}

int teardown(void **state)
{
    fixture *f = *state;
    cps__store_close(f->s);
    if (f->mnt[0] && umount2(f->mnt, MNT_DETACH) != 0)
        fprintf(stderr, "cannot unmount %s: %s\n", f->mnt, strerror(errno));
    char *cut = strstr(f->dir, "/a/b");
    if (cut)
        *cut = '\0';
    nftw(f->dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    free(f);
    return 0;
}

void open_store(fixture *f, size_t map)
{
    cps__store_opts o = {.initial_map_bytes = map};
    assert_int_equal(cps__store_open(f->dir, &o, &f->s), 0);
}

cps__param_spec spec_of(uint32_t opt, uint32_t init, float lr)
{
    cps__param_spec s;
    memset(&s, 0, sizeof s);
    s.opt_kind = opt;
    s.init_kind = init;
    s.init_a = -1.0f;
    s.init_b = 1.0f;
    s.init_seed = 77;
    s.lr = lr;
    return s;
}

int do_create(cps__txn *t, void *a)
{
    op *o = a;
    int rc = cps__store_param_create(t, o->key, o->len, o->offset, &o->spec);
    return rc ? rc : o->fail_after;
}

int do_apply(cps__txn *t, void *a)
{
    op *o = a;
    return cps__store_param_apply(t, o->key, o->grad, o->len);
}

int do_read(cps__txn *t, void *a)
{
    op *o = a;
    const float *vals;
    int rc = cps__store_param_read(t, o->key, o->len, &vals);
    if (rc == 0)
        memcpy(o->out, vals, (size_t)o->len * sizeof(float));
    return rc;
}

int do_get(cps__txn *t, void *a)
{
    op *o = a;
    int rc = cps__store_param_get(t, o->key, &o->rec);
    if (rc == 0 && o->copy)
        memcpy(o->copy, o->rec.vals, o->rec.len * sizeof(float));
    if (rc == 0 && o->copy_state && o->rec.state)
        memcpy(o->copy_state, o->rec.state,
               cps__optim_state_slots(o->rec.spec.opt_kind) * o->rec.len * sizeof(float));
    return rc;
}

int do_put(cps__txn *t, void *a)
{
    op *o = a;
    return cps__store_param_put(t, o->key, &o->rec);
}

int create(cps__store *s, uint64_t key, uint32_t len, uint64_t off, const cps__param_spec *sp)
{
    op o = {.key = key, .len = len, .offset = off, .spec = *sp};
    return cps__store_write(s, do_create, &o);
}

int apply(cps__store *s, uint64_t key, const float *g, uint32_t len)
{
    op o = {.key = key, .len = len, .grad = g};
    return cps__store_write(s, do_apply, &o);
}

int read_vals(cps__store *s, uint64_t key, float *out, uint32_t len)
{
    op o = {.key = key, .len = len, .out = out};
    return cps__store_read(s, do_read, &o);
}

int do_misc_put(cps__txn *t, void *a)
{
    (void)a;
    cps__range_meta m = {.seq = 123456789012ull, .step = 77};
    int rc = cps__store_range_put(t, 3, &m);
    rc = rc ? rc : cps__store_dedup_put(t, 1, 2, 5);
    rc = rc ? rc : cps__store_dedup_put(t, 1, 3, 7);
    rc = rc ? rc : cps__store_dedup_put(t, 2, 2, UINT64_MAX);
    rc = rc ? rc : cps__store_meta_put(t, "node_id", "server-3", 8);
    rc = rc ? rc : cps__store_meta_put(t, "empty", "", 0);
    return rc;
}

int do_misc_get(cps__txn *t, void *a)
{
    misc *x = a;
    cps__range_meta z;
    assert_int_equal(cps__store_range_get(t, 4, &z), 0);
    assert_true(z.seq == 0 && z.step == 0);
    assert_int_equal(cps__store_range_get(t, 3, &x->m), 0);
    assert_int_equal(cps__store_dedup_get(t, 1, 2, &x->seq[0]), 0);
    assert_int_equal(cps__store_dedup_get(t, 1, 3, &x->seq[1]), 0);
    assert_int_equal(cps__store_dedup_get(t, 2, 2, &x->seq[2]), 0);
    assert_int_equal(cps__store_dedup_get(t, 2, 3, &x->seq[3]), 0);
    x->len = sizeof x->buf;
    x->rc[0] = cps__store_meta_get(t, "node_id", x->buf, &x->len);
    size_t small = 3;
    x->rc[1] = cps__store_meta_get(t, "node_id", x->buf + 32, &small);
    assert_int_equal(small, 8);
    size_t n = 10;
    x->rc[2] = cps__store_meta_get(t, "absent", x->buf, &n);
    n = 10;
    assert_int_equal(cps__store_meta_get(t, "empty", x->buf + 40, &n), 0);
    assert_int_equal(n, 0);
    n = 10;
    x->rc[3] = cps__store_meta_get(t, "", x->buf, &n);
    return 0;
}

static int scan_cb(void *arg, uint64_t key, const cps__param_rec *rec)
{
    scan *sc = arg;
    sc->keys[sc->n] = key;
    sc->lens[sc->n] = rec->len;
    sc->n++;
    return sc->n == sc->stop_at ? 1234 : 0;
}

int do_scan(cps__txn *t, void *a)
{
    scan *sc = a;
    sc->n = 0;
    sc->rc = cps__store_param_scan(t, sc->lo, sc->hi, scan_cb, sc);
    return 0;
}

int do_count(cps__txn *t, void *a)
{
    uint64_t *kv = a;
    return cps__store_count(t, &kv[0], &kv[1]);
}

int do_csum(cps__txn *t, void *a)
{
    csum *c = a;
    return cps__store_checksum(t, c->lo, c->hi, &c->h);
}

int do_bulk_create(cps__txn *t, void *a)
{
    bulk *b = a;
    for (int i = 0; i < b->nkeys; i++) {
        uint64_t key = b->first + (uint64_t)i;
        int rc = cps__store_param_create(t, key, b->len, key * b->len, &b->spec);
        if (rc)
            return rc;
    }
    return 0;
}
