/* The LMDB store's test fixture (tests/unit/test_store_lmdb.c): a fresh directory per test under
 * $TMPDIR (a tmpfs mounted there by a disk-full test is unmounted at teardown), and the
 * transaction bodies the tests run: records (op), ranges/dedup/meta (misc), scans and counts,
 * checksums (csum), and many records at once (bulk). */
#ifndef CPS_TEST_STORE_LMDB_FIXTURE_H
#define CPS_TEST_STORE_LMDB_FIXTURE_H

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "optim/optim.h"
#include "store/store.h"

typedef struct fixture {
    char dir[512];
    cps__store *s;
    char mnt[512]; /* a tmpfs mounted for the test (unmounted at teardown), or "" */
} fixture;

typedef struct op {
    uint64_t key;
    uint32_t len;
    uint64_t offset;
    cps__param_spec spec;
    const float *grad;
    float *out;
    cps__param_rec rec;
    float *copy;       /* get: values copied out of the borrowed record */
    float *copy_state; /* get: state copied out */
    int fail_after;    /* create: then return this error (abort) */
} op;

typedef struct misc {
    cps__range_meta m;
    uint64_t seq[4];
    char buf[64];
    size_t len;
    int rc[4];
} misc;

typedef struct scan {
    uint64_t keys[16];
    uint32_t lens[16];
    int n, stop_at;
    uint64_t lo, hi;
    int rc;
} scan;

typedef struct csum {
    uint64_t lo, hi, h;
} csum;

typedef struct bulk {
    uint64_t first;
    int nkeys;
    uint32_t len;
    cps__param_spec spec;
} bulk;

/* cmocka's setup and teardown of every test: state is the fixture. */
int setup(void **state);
int teardown(void **state);

/* Opens f->dir with an initial map of `map` bytes into f->s; fails the test otherwise. */
void open_store(fixture *f, size_t map);

/* A record's spec: optimizer opt, initialiser init (in [-1, 1], seed 77), learning rate lr. */
cps__param_spec spec_of(uint32_t opt, uint32_t init, float lr);

/* Transaction bodies; `a` is the struct of their kind. */
int do_create(cps__txn *t, void *a);
int do_apply(cps__txn *t, void *a);
int do_read(cps__txn *t, void *a);
int do_get(cps__txn *t, void *a);
int do_put(cps__txn *t, void *a);
int do_misc_put(cps__txn *t, void *a);
int do_misc_get(cps__txn *t, void *a);
int do_scan(cps__txn *t, void *a);
int do_count(cps__txn *t, void *a);
int do_csum(cps__txn *t, void *a);
int do_bulk_create(cps__txn *t, void *a);

/* One write or read transaction each: create a record, apply a gradient, read the values. */
int create(cps__store *s, uint64_t key, uint32_t len, uint64_t off, const cps__param_spec *sp);
int apply(cps__store *s, uint64_t key, const float *g, uint32_t len);
int read_vals(cps__store *s, uint64_t key, float *out, uint32_t len);

/* The tests, by file. */
/* records.c */
void test_create_get_apply_read(void **state);
void test_create_idempotent(void **state);
void test_errors(void **state);
void test_ranges_dedup_meta(void **state);
void test_scan(void **state);
void test_checksum(void **state);
/* growth.c */
void test_map_growth(void **state);
void test_reserve_once(void **state);
void test_background_sync(void **state);
/* persistence.c */
void test_reopen(void **state);
void test_corrupt(void **state);
void test_open_errors(void **state);
/* snapshots.c */
void test_reset_and_write_slices(void **state);
void test_snapshot_sees_its_moment(void **state);
void test_room_follows_live_data(void **state);
/* disk.c */
void test_disk_full_growth(void **state);
void test_disk_full_open(void **state);
void test_sigbus_guard(void **state);

#endif
