/* Parameter records: create, apply a gradient, read, overwrite, write in slices, scan, and the
 * checksum and counters over a range of keys. The byte layout is record.c's.
 *
 * LMDB returns data 2-byte aligned at best, so values are always copied (memcpy) between the
 * map and float buffers; the store's scratch buffer is the aligned side of those copies. */
#include <lmdb.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "chainps/error.h"
#include "core/log.h"
#include "optim/optim.h"
#include "store/store_int.h"

static int scratch_reserve(cps__store *s, size_t nfloats)
{
    if (nfloats <= s->scratch_floats)
        return 0;
    size_t want = s->scratch_floats ? s->scratch_floats : 1024;
    while (want < nfloats)
        want *= 2;
    /* aligned_alloc wants a size that is a multiple of the alignment. */
    size_t bytes = (want * sizeof(float) + 63) & ~(size_t)63;
    float *p = aligned_alloc(64, bytes);
    if (!p) {
        cps__log(CPS_LOG_ERROR, SUB, "scratch of %zu bytes: out of memory", bytes);
        return CPS_ENOMEM;
    }
    free(s->scratch);
    s->scratch = p;
    s->scratch_floats = want;
    return 0;
}

/* ---- parameters ---- */

static int param_lookup(cps__txn *tx, uint64_t key, MDB_val *d, cps__param_rec *rec, const char *op)
{
    MDB_val k = {sizeof key, &key};
    int rc = mdb_get(tx->t, tx->s->params, &k, d);
    if (rc == MDB_NOTFOUND)
        return CPS_ENOTFOUND;
    if (rc)
        return lmdb_fail(tx, op, key, rc);
    return cps__st_rec_decode(d, key, rec);
}

int cps__store_param_get(cps__txn *tx, uint64_t key, cps__param_rec *out)
{
    MDB_val d;
    return param_lookup(tx, key, &d, out, "param_get");
}

/* Reserve the record's space in the map and write its header; values follow at +REC_HDR. */
static int rec_reserve(cps__txn *tx, uint64_t key, uint32_t len, uint64_t step,
                       const cps__param_spec *spec, unsigned char **data, const char *op)
{
    MDB_val k = {sizeof key, &key};
    MDB_val d = {cps__st_rec_size(len, spec->opt_kind), NULL};
    tx->wrec = NULL;
    int rc = mdb_put(tx->t, tx->s->params, &k, &d, MDB_RESERVE);
    if (rc)
        return lmdb_fail(tx, op, key, rc);
    *data = d.mv_data;
    cps__st_hdr_encode(*data, len, step, spec);
    return 0;
}

int cps__store_param_create(cps__txn *tx, uint64_t key, uint32_t len, uint64_t offset,
                            const cps__param_spec *spec)
{
    if (len == 0 || !spec || !cps__st_kinds_valid(spec))
        return CPS_EINVAL;
    cps__param_rec old;
    MDB_val d;
    int rc = param_lookup(tx, key, &d, &old, "param_create");
    if (rc == 0) {
        if (old.len == len && cps__st_spec_equal(&old.spec, spec))
            return 0;
        cps__log(CPS_LOG_WARN, SUB, "param_create key %llu: exists with len %u, asked len %u%s",
                 (unsigned long long)key, old.len, len,
                 old.len == len ? " and a different spec" : "");
        return CPS_EEXIST;
    }
    if (rc != CPS_ENOTFOUND)
        return rc;

    cps__param_spec c = cps__st_spec_canon(spec);
    size_t slots = cps__optim_state_slots(c.opt_kind);
    unsigned char *p;
    if ((rc = rec_reserve(tx, key, len, 0, &c, &p, "param_create")) != 0)
        return rc;
    if (((uintptr_t)(p + REC_HDR) & (sizeof(float) - 1)) == 0) {
        /* Straight into the map (a large record is on pages of its own, so aligned): no
         * scratch copy of the whole tensor, which stayed in the server's memory after. */
        cps__init_fill(&c, offset, (float *)(void *)(p + REC_HDR), len);
    } else {
        /* A small record inside a leaf page may be misaligned: fill in aligned scratch. */
        if ((rc = scratch_reserve(tx->s, len)) != 0)
            return rc;
        cps__init_fill(&c, offset, tx->s->scratch, len);
        memcpy(p + REC_HDR, tx->s->scratch, (size_t)len * sizeof(float));
    }
    memset(p + REC_HDR + (size_t)len * sizeof(float), 0, slots * len * sizeof(float));
    return 0;
}

int cps__store_param_apply(cps__txn *tx, uint64_t key, const float *grad, uint32_t glen)
{
    cps__param_rec rec;
    MDB_val d;
    int rc = param_lookup(tx, key, &d, &rec, "param_apply");
    if (rc)
        return rc;
    if (glen != rec.len) {
        cps__log(CPS_LOG_WARN, SUB, "param_apply key %llu: gradient of %u values for %u",
                 (unsigned long long)key, glen, rec.len);
        return CPS_ESIZE;
    }
    size_t n = rec.len, slots = cps__optim_state_slots(rec.spec.opt_kind);
    size_t nfloats = (1 + slots) * n;
    const unsigned char *old = (const unsigned char *)d.mv_data + REC_HDR;
    unsigned char *p;
    if ((rc = rec_reserve(tx, key, rec.len, rec.opt_step + 1, &rec.spec, &p, "param_apply")))
        return rc;
    float *dst = (float *)(void *)(p + REC_HDR);
    if (((uintptr_t)dst & (sizeof(float) - 1)) == 0) {
        /* Update straight into the reserved record. LMDB is copy-on-write: a record not yet
         * written in this transaction keeps its old pages intact until commit, so `old` is
         * still readable after the reserve and does not overlap `dst` (when LMDB reuses the
         * same dirty space, old == dst and the update is in place). An aligned `old` is read
         * by the optimizer itself, so the values cross memory once (no copy pass first). */
        uint64_t t = rec.opt_step + 1;
        if ((const unsigned char *)dst != old && ((uintptr_t)old & (sizeof(float) - 1)) == 0) {
            rc = cps__optim_apply_copy(&rec.spec, (const void *)old, dst, grad, n, t);
        } else {
            if ((const unsigned char *)dst != old)
                memcpy(dst, old, nfloats * sizeof(float));
            rc = cps__optim_apply(&rec.spec, dst, slots ? dst + n : NULL, grad, n, t);
        }
    } else {
        /* A small record inside a leaf page may be misaligned for floats: go through scratch
         * (`old` is still intact, as above). */
        if ((rc = scratch_reserve(tx->s, nfloats)) != 0)
            return rc;
        float *buf = tx->s->scratch;
        memcpy(buf, old, nfloats * sizeof(float));
        rc = cps__optim_apply(&rec.spec, buf, slots ? buf + n : NULL, grad, n, rec.opt_step + 1);
        if (rc == 0)
            memcpy(p + REC_HDR, buf, nfloats * sizeof(float));
    }
    if (rc) {
        cps__log(CPS_LOG_ERROR, SUB, "param_apply key %llu: optimizer %u refused: %s",
                 (unsigned long long)key, rec.spec.opt_kind, cps_strerror(rc));
        return rc;
    }
    return 0;
}

int cps__store_param_read(cps__txn *tx, uint64_t key, uint32_t len, const float **vals)
{
    cps__param_rec rec;
    MDB_val d;
    int rc = param_lookup(tx, key, &d, &rec, "param_read");
    if (rc)
        return rc;
    if (len != rec.len)
        return CPS_ESIZE;
    *vals = rec.vals;
    return 0;
}

int cps__store_param_put(cps__txn *tx, uint64_t key, const cps__param_rec *rec)
{
    if (!rec || rec->len == 0 || !rec->vals || !cps__st_kinds_valid(&rec->spec))
        return CPS_EINVAL;
    cps__param_spec c = cps__st_spec_canon(&rec->spec);
    size_t slots = cps__optim_state_slots(c.opt_kind);
    if (slots && !rec->state)
        return CPS_EINVAL;
    unsigned char *p;
    int rc = rec_reserve(tx, key, rec->len, rec->opt_step, &c, &p, "param_put");
    if (rc)
        return rc;
    size_t nb = (size_t)rec->len * sizeof(float);
    memcpy(p + REC_HDR, rec->vals, nb);
    if (slots)
        memcpy(p + REC_HDR + nb, rec->state, slots * nb);
    return 0;
}

int cps__store_param_reset(cps__txn *tx, uint64_t key, uint32_t len, uint64_t opt_step,
                           const cps__param_spec *spec)
{
    if (len == 0 || !spec || !cps__st_kinds_valid(spec))
        return CPS_EINVAL;
    cps__param_spec c = cps__st_spec_canon(spec);
    unsigned char *p;
    int rc = rec_reserve(tx, key, len, opt_step, &c, &p, "param_reset");
    if (rc)
        return rc;
    memset(p + REC_HDR, 0, cps__st_rec_size(len, c.opt_kind) - REC_HDR);
    tx->wkey = key;
    tx->wrec = p;
    tx->wsize = cps__st_rec_size(len, c.opt_kind);
    return 0;
}

int cps__store_param_write(cps__txn *tx, uint64_t key, uint32_t slot, uint64_t first,
                           const float *vals, uint64_t n)
{
    cps__param_rec rec;
    MDB_val d;
    int rc = param_lookup(tx, key, &d, &rec, "param_write");
    if (rc)
        return rc;
    size_t slots = cps__optim_state_slots(rec.spec.opt_kind);
    if (slot > slots || first > rec.len || n > rec.len - first)
        return CPS_ESIZE;
    if (!tx->wrec || tx->wkey != key || tx->wsize != d.mv_size) {
        /* Make the record writable: put it again (MDB_RESERVE) with its own bytes. LMDB is
         * copy-on-write, so the old bytes stay readable until the put returns new space, but
         * that space may be the same dirty pages: copy through scratch. */
        size_t size = d.mv_size;
        if ((rc = scratch_reserve(tx->s, (size + 3) / 4)) != 0)
            return rc;
        memcpy(tx->s->scratch, d.mv_data, size);
        MDB_val k = {sizeof key, &key};
        MDB_val w = {size, NULL};
        tx->wrec = NULL;
        if ((rc = mdb_put(tx->t, tx->s->params, &k, &w, MDB_RESERVE)) != 0)
            return lmdb_fail(tx, "param_write", key, rc);
        memcpy(w.mv_data, tx->s->scratch, size);
        tx->wkey = key;
        tx->wrec = w.mv_data;
        tx->wsize = size;
    }
    memcpy(tx->wrec + REC_HDR + ((size_t)slot * rec.len + first) * sizeof(float), vals,
           n * sizeof(float));
    return 0;
}

int cps__store_param_scan(cps__txn *tx, uint64_t lo, uint64_t hi, cps__param_iter_fn fn, void *arg)
{
    if (lo > hi)
        return 0;
    MDB_cursor *cur;
    int rc = mdb_cursor_open(tx->t, tx->s->params, &cur);
    if (rc)
        return lmdb_fail(tx, "param_scan (cursor)", lo, rc);
    MDB_val k = {sizeof lo, &lo}, d;
    int ret = 0;
    for (rc = mdb_cursor_get(cur, &k, &d, MDB_SET_RANGE); rc == 0;
         rc = mdb_cursor_get(cur, &k, &d, MDB_NEXT)) {
        uint64_t key;
        if (k.mv_size != sizeof key) {
            cps__log(CPS_LOG_ERROR, SUB, "param_scan: key of %zu bytes", k.mv_size);
            ret = CPS_ECORRUPT;
            break;
        }
        memcpy(&key, k.mv_data, sizeof key);
        if (key > hi)
            break;
        cps__param_rec rec;
        if ((ret = cps__st_rec_decode(&d, key, &rec)) != 0)
            break;
        if ((ret = fn(arg, key, &rec)) != 0)
            break;
    }
    if (ret == 0 && rc != 0 && rc != MDB_NOTFOUND)
        ret = lmdb_fail(tx, "param_scan", lo, rc);
    mdb_cursor_close(cur);
    return ret;
}

/* ---- checksum and counters ---- */

/* One streaming XXH3 over every key and its values: `status --verify` runs it on the server's
 * loop over the whole range, so its speed is the loop's stall (bench_store: 18 GB/s, against
 * 1.1 GB/s for the FNV-1a it replaced). Only replicas of one build compare sums. */
static int checksum_one(void *arg, uint64_t key, const cps__param_rec *rec)
{
    XXH3_state_t *st = arg;
    unsigned char kb[8];
    cps__le64_put(kb, key); /* little-endian so the sum does not depend on the host */
    if (XXH3_64bits_update(st, kb, sizeof kb) != XXH_OK ||
        XXH3_64bits_update(st, rec->vals, (size_t)rec->len * sizeof(float)) != XXH_OK)
        return CPS_EINVAL;
    return 0;
}

int cps__store_checksum(cps__txn *tx, uint64_t lo, uint64_t hi, uint64_t *out)
{
    XXH3_state_t *st = XXH3_createState();
    if (!st)
        return CPS_ENOMEM;
    int rc = XXH3_64bits_reset(st) == XXH_OK ? 0 : CPS_EINVAL;
    if (rc == 0)
        rc = cps__store_param_scan(tx, lo, hi, checksum_one, st);
    if (rc == 0)
        *out = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return rc;
}

static int count_one(void *arg, uint64_t key, const cps__param_rec *rec)
{
    (void)key;
    *(uint64_t *)arg += rec->len;
    return 0;
}

int cps__store_count(cps__txn *tx, uint64_t *keys, uint64_t *values)
{
    MDB_stat st;
    int rc = mdb_stat(tx->t, tx->s->params, &st);
    if (rc)
        return lmdb_fail(tx, "count (stat)", 0, rc);
    uint64_t v = 0;
    if ((rc = cps__store_param_scan(tx, 0, UINT64_MAX, count_one, &v)) != 0)
        return rc;
    if (keys)
        *keys = st.ms_entries;
    if (values)
        *values = v;
    return 0;
}
