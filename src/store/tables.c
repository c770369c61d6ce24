/* The small tables beside the parameters: range meta (sequence number, step), the exactly-once
 * records, named values and blobs; clearing a range and wiping the whole store. */
#include <lmdb.h>
#include <stdint.h>
#include <string.h>

#include "chainps/error.h"
#include "core/log.h"
#include "store/store_int.h"

#define META_MAX_BYTES 4096
#define META_MAX_NAME  255

/* ---- ranges, dedup, meta ---- */

int cps__store_range_get(cps__txn *tx, uint32_t range, cps__range_meta *out)
{
    MDB_val k = {sizeof range, &range}, d;
    int rc = mdb_get(tx->t, tx->s->ranges, &k, &d);
    if (rc == MDB_NOTFOUND) {
        out->seq = out->step = 0;
        return 0;
    }
    if (rc)
        return lmdb_fail(tx, "range_get", range, rc);
    if (d.mv_size != 16) {
        cps__log(CPS_LOG_ERROR, SUB, "corrupt range meta, range %u (%zu bytes)", range, d.mv_size);
        return CPS_ECORRUPT;
    }
    out->seq = cps__le64_get(d.mv_data);
    out->step = cps__le64_get((const unsigned char *)d.mv_data + 8);
    return 0;
}

int cps__store_range_put(cps__txn *tx, uint32_t range, const cps__range_meta *m)
{
    unsigned char v[16];
    cps__le64_put(v, m->seq);
    cps__le64_put(v + 8, m->step);
    MDB_val k = {sizeof range, &range}, d = {sizeof v, v};
    int rc = mdb_put(tx->t, tx->s->ranges, &k, &d, 0);
    return rc ? lmdb_fail(tx, "range_put", range, rc) : 0;
}

/* One u64 key per (range, worker), range in the high half: a range's entries are adjacent. */
static uint64_t dedup_key(uint32_t range, uint32_t worker)
{
    return (uint64_t)range << 32 | worker;
}

int cps__store_dedup_get(cps__txn *tx, uint32_t range, uint32_t worker, uint64_t *seq)
{
    uint64_t key = dedup_key(range, worker);
    MDB_val k = {sizeof key, &key}, d;
    int rc = mdb_get(tx->t, tx->s->dedup, &k, &d);
    if (rc == MDB_NOTFOUND) {
        *seq = 0;
        return 0;
    }
    if (rc)
        return lmdb_fail(tx, "dedup_get", key, rc);
    if (d.mv_size != 8) {
        cps__log(CPS_LOG_ERROR, SUB, "corrupt dedup entry, range %u worker %u", range, worker);
        return CPS_ECORRUPT;
    }
    *seq = cps__le64_get(d.mv_data);
    return 0;
}

int cps__store_dedup_put(cps__txn *tx, uint32_t range, uint32_t worker, uint64_t seq)
{
    uint64_t key = dedup_key(range, worker);
    unsigned char v[8];
    cps__le64_put(v, seq);
    MDB_val k = {sizeof key, &key}, d = {sizeof v, v};
    int rc = mdb_put(tx->t, tx->s->dedup, &k, &d, 0);
    return rc ? lmdb_fail(tx, "dedup_put", key, rc) : 0;
}

static int meta_name(const char *name, MDB_val *k);

int cps__store_dedup_scan(cps__txn *tx, uint32_t range, cps__dedup_iter_fn fn, void *arg)
{
    uint64_t lo = dedup_key(range, 0), hi = dedup_key(range, UINT32_MAX);
    MDB_cursor *cur;
    int rc = mdb_cursor_open(tx->t, tx->s->dedup, &cur);
    if (rc)
        return lmdb_fail(tx, "dedup_scan (cursor)", lo, rc);
    MDB_val k = {sizeof lo, &lo}, d;
    int ret = 0;
    for (rc = mdb_cursor_get(cur, &k, &d, MDB_SET_RANGE); rc == 0;
         rc = mdb_cursor_get(cur, &k, &d, MDB_NEXT)) {
        uint64_t key;
        if (k.mv_size != sizeof key || d.mv_size != 8) {
            ret = CPS_ECORRUPT;
            break;
        }
        memcpy(&key, k.mv_data, sizeof key);
        if (key > hi)
            break;
        if ((ret = fn(arg, (uint32_t)key, cps__le64_get(d.mv_data))) != 0)
            break;
    }
    if (ret == 0 && rc != 0 && rc != MDB_NOTFOUND)
        ret = lmdb_fail(tx, "dedup_scan", lo, rc);
    mdb_cursor_close(cur);
    return ret;
}

/* Delete every u64 key lo..hi of dbi. */
static int delete_span(cps__txn *tx, MDB_dbi dbi, uint64_t lo, uint64_t hi, const char *op)
{
    tx->wrec = NULL;
    MDB_cursor *cur;
    int rc = mdb_cursor_open(tx->t, dbi, &cur);
    if (rc)
        return lmdb_fail(tx, op, lo, rc);
    for (;;) {
        /* Position afresh after each delete: MDB_GET_CURRENT after deleting the last key of
         * the database answers EINVAL, not MDB_NOTFOUND. */
        uint64_t from = lo;
        MDB_val k = {sizeof from, &from}, d;
        rc = mdb_cursor_get(cur, &k, &d, MDB_SET_RANGE);
        if (rc != 0)
            break;
        uint64_t key;
        if (k.mv_size != sizeof key)
            break;
        memcpy(&key, k.mv_data, sizeof key);
        if (key > hi)
            break;
        if ((rc = mdb_cursor_del(cur, 0)) != 0)
            break;
    }
    mdb_cursor_close(cur);
    return (rc == 0 || rc == MDB_NOTFOUND) ? 0 : lmdb_fail(tx, op, lo, rc);
}

int cps__store_range_clear(cps__txn *tx, uint32_t range, uint64_t lo, uint64_t hi,
                           const char *meta_prefix)
{
    int rc = delete_span(tx, tx->s->params, lo, hi, "range_clear (params)");
    if (rc == 0)
        rc = delete_span(tx, tx->s->dedup, dedup_key(range, 0), dedup_key(range, UINT32_MAX),
                         "range_clear (dedup)");
    if (rc == 0) {
        MDB_val k = {sizeof range, &range}; /* the ranges database has u32 keys */
        int drc = mdb_del(tx->t, tx->s->ranges, &k, NULL);
        if (drc != 0 && drc != MDB_NOTFOUND)
            rc = lmdb_fail(tx, "range_clear (range)", range, drc);
    }
    while (rc == 0 && meta_prefix) {
        /* Delete one at a time: a cursor walk while deleting by name is simpler this way. */
        char first[META_MAX_NAME + 1] = "";
        MDB_cursor *cur;
        if ((rc = mdb_cursor_open(tx->t, tx->s->meta, &cur)) != 0)
            return lmdb_fail(tx, "range_clear (meta)", range, rc);
        size_t plen = strlen(meta_prefix);
        MDB_val k = {plen, (void *)meta_prefix}, d;
        int grc = mdb_cursor_get(cur, &k, &d, MDB_SET_RANGE);
        if (grc == 0 && k.mv_size >= plen && k.mv_size <= META_MAX_NAME &&
            memcmp(k.mv_data, meta_prefix, plen) == 0)
            memcpy(first, k.mv_data, k.mv_size);
        mdb_cursor_close(cur);
        if (!first[0])
            break;
        rc = cps__store_meta_del(tx, first);
    }
    return rc;
}

int cps__store_meta_scan(cps__txn *tx, const char *prefix, cps__meta_iter_fn fn, void *arg)
{
    size_t plen = prefix ? strlen(prefix) : 0;
    MDB_cursor *cur;
    int rc = mdb_cursor_open(tx->t, tx->s->meta, &cur);
    if (rc)
        return lmdb_fail(tx, "meta_scan (cursor)", 0, rc);
    MDB_val k = {plen, (void *)prefix}, d;
    int ret = 0;
    for (rc = plen ? mdb_cursor_get(cur, &k, &d, MDB_SET_RANGE)
                   : mdb_cursor_get(cur, &k, &d, MDB_FIRST);
         rc == 0; rc = mdb_cursor_get(cur, &k, &d, MDB_NEXT)) {
        if (k.mv_size < plen || memcmp(k.mv_data, prefix, plen) != 0)
            break;
        char name[META_MAX_NAME + 1];
        if (k.mv_size > META_MAX_NAME) {
            ret = CPS_ECORRUPT;
            break;
        }
        memcpy(name, k.mv_data, k.mv_size);
        name[k.mv_size] = 0;
        if ((ret = fn(arg, name, d.mv_data, d.mv_size)) != 0)
            break;
    }
    if (ret == 0 && rc != 0 && rc != MDB_NOTFOUND)
        ret = lmdb_fail(tx, "meta_scan", 0, rc);
    mdb_cursor_close(cur);
    return ret;
}

int cps__store_wipe(cps__txn *tx)
{
    MDB_dbi dbs[4] = {tx->s->params, tx->s->ranges, tx->s->dedup, tx->s->meta};
    for (int i = 0; i < 4; i++) {
        int rc = mdb_drop(tx->t, dbs[i], 0);
        if (rc != 0)
            return lmdb_fail(tx, "mdb_drop", 0, rc);
    }
    return 0;
}

int cps__store_meta_del(cps__txn *tx, const char *name)
{
    MDB_val k;
    if (meta_name(name, &k) != 0)
        return CPS_EINVAL;
    int rc = mdb_del(tx->t, tx->s->meta, &k, NULL);
    return (rc == 0 || rc == MDB_NOTFOUND) ? 0 : lmdb_fail(tx, "meta_del", 0, rc);
}

static int meta_name(const char *name, MDB_val *k)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > META_MAX_NAME)
        return CPS_EINVAL;
    k->mv_size = n;
    k->mv_data = (void *)name;
    return 0;
}

#define BLOB_MAX_BYTES (64u << 20)

int cps__store_blob_put(cps__txn *tx, const char *name, const void *buf, size_t len)
{
    MDB_val k, d = {len, (void *)buf};
    if (meta_name(name, &k) != 0 || len > BLOB_MAX_BYTES || (len && !buf))
        return CPS_EINVAL;
    int rc = mdb_put(tx->t, tx->s->meta, &k, &d, 0);
    return rc ? lmdb_fail(tx, "blob_put", 0, rc) : 0;
}

int cps__store_blob_get(cps__txn *tx, const char *name, const void **buf, size_t *len)
{
    MDB_val k, d;
    if (!buf || !len || meta_name(name, &k) != 0)
        return CPS_EINVAL;
    int rc = mdb_get(tx->t, tx->s->meta, &k, &d);
    if (rc == MDB_NOTFOUND)
        return CPS_ENOTFOUND;
    if (rc)
        return lmdb_fail(tx, "blob_get", 0, rc);
    *buf = d.mv_data;
    *len = d.mv_size;
    return 0;
}

int cps__store_meta_get(cps__txn *tx, const char *name, void *buf, size_t *len)
{
    MDB_val k, d;
    if (!len || meta_name(name, &k) != 0)
        return CPS_EINVAL;
    int rc = mdb_get(tx->t, tx->s->meta, &k, &d);
    if (rc == MDB_NOTFOUND)
        return CPS_ENOTFOUND;
    if (rc)
        return lmdb_fail(tx, "meta_get", 0, rc);
    size_t cap = *len;
    *len = d.mv_size;
    if (d.mv_size > cap)
        return CPS_ESIZE;
    if (d.mv_size)
        memcpy(buf, d.mv_data, d.mv_size);
    return 0;
}

int cps__store_meta_put(cps__txn *tx, const char *name, const void *buf, size_t len)
{
    MDB_val k;
    if (meta_name(name, &k) != 0 || len > META_MAX_BYTES || (len && !buf))
        return CPS_EINVAL;
    MDB_val d = {len, (void *)buf};
    int rc = mdb_put(tx->t, tx->s->meta, &k, &d, 0);
    return rc ? lmdb_fail(tx, "meta_put", 0, rc) : 0;
}
