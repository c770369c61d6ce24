/* Private to src/store: what the files behind store.h (the store's face) share: its state,
 * the failure reports, and the calls one file makes into another.
 *
 *   env.c      the environment: open (directory lock, LMDB environment, databases), close, flushes
 *   txn.c      write transactions (rerun after MDB_MAP_FULL), read transactions, snapshots
 *   growth.c   the map's size: growth, room ahead of snapshots and of known writes, counters
 *   disk.c     a full disk: blocks reserved ahead of the map, the SIGBUS guard
 *   params.c   parameter records: create, apply, read, write, scan, checksum, counts
 *   tables.c   range meta, exactly-once records, named values and blobs; clear, wipe
 *   record.c   the parameter record's byte layout and its checks
 * Calls run downward only: env.c calls disk.c; txn.c calls growth.c, which calls disk.c and
 * record.c; params.c calls record.c; tables.c calls none of them. The failure reports below
 * (lmdb_fail, env_fail) are shared by all. */
#ifndef CPS_STORE_INT_H
#define CPS_STORE_INT_H

#include <lmdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "chainps/error.h"
#include "core/log.h"
#include "store/store.h"

#define SUB     "store"
#define REC_HDR 64
/* ensure_room: the room beyond the live pages that updates may take while a checkpoint's read
 * view pins the pages they free, at least ROOM_MIN_FREE and ROOM_PER_LIVE times the live data
 * (a few whole-store steps). The room is reserved on disk, so it follows the live data, never
 * the highest page once written: sizing from that mark fed on itself (a view held through many
 * steps raised it to the map's end, and the next checkpoint grew the map 8 times again: a 2 MB
 * model's data directory reached 9 GB in a 10-minute soak). When the room is used up, the views
 * are closed (before_grow) and the update reuses the pages they pinned; the map grows only for
 * live data. */
#define ROOM_MIN_FREE ((size_t)256 << 20)
#define ROOM_PER_LIVE 4
#define MIB           ((double)(1 << 20))

struct cps__store {
    MDB_env *env;
    MDB_dbi params, ranges, dedup, meta;
    int poisoned;
    /* mdb_env_set_mapsize() remaps the file: no transaction of this process may be open then
     * (LMDB does not check). Every txn holds this lock shared; growing takes it exclusive. */
    pthread_rwlock_t map_lock;
    float *scratch; /* 64-byte aligned; only the writer thread uses it */
    int (*before_grow)(void *ctx);
    void *grow_ctx;
    size_t room_min; /* ROOM_MIN_FREE unless the options say */
    size_t scratch_floats;
    cps__store_stats stats; /* written by the writer thread only (syncs: see nsyncs) */
    /* The background flusher (cps__store_sync_async): mdb_env_sync may run on another thread,
     * but not while mdb_env_set_mapsize remaps the map it msyncs: sync_mu is held by each
     * flush and by each remap. flush_cv wakes the flusher (flush_want) and whoever waits for
     * it to be idle (cps__store_sync_wait). */
    pthread_mutex_t sync_mu, flush_mu;
    pthread_cond_t flush_cv;
    pthread_t flusher;
    int flusher_on, flush_want, flush_busy, flush_stop;
    atomic_uint_fast64_t nsyncs, nsync_fails;
    int lock_fd; /* DIR/chainps.lock, flock'ed for the store's life */
    int guard;   /* slot in the SIGBUS guard table, -1 if none */
    char dir[512];
};

struct cps__txn {
    cps__store *s;
    MDB_txn *t;
    /* The record cps__store_param_write (or _reset) last made writable in this txn: further
     * slices of it are written in place, without copying the record again. Any other write to
     * the params database forgets it. */
    uint64_t wkey;
    unsigned char *wrec;
    size_t wsize;
    int map_full; /* some operation hit MDB_MAP_FULL: the whole txn is retried after growing */
    int failed;   /* some LMDB operation failed: never commit this txn */
};

/* ---- errors ----
 * Inline, not in a file of their own: the compiler must see that they never return 0, or the
 * callers' "if (rc) return lmdb_fail(...)" paths leave outputs it takes for uninitialized.
 * lmdb_fail also marks the txn failed (never committed), or map_full for cps__store_write to
 * grow the map and rerun, whichever operation met MDB_MAP_FULL. */

static inline int lmdb_fail(cps__txn *tx, const char *op, uint64_t key, int rc)
{
    if (rc == MDB_MAP_FULL && tx) {
        /* Expected: cps__store_write grows the map and runs the txn again. */
        tx->map_full = 1;
        tx->failed = 1;
        cps__log(CPS_LOG_DEBUG, SUB, "%s key %llu: map full, will grow", op,
                 (unsigned long long)key);
        return CPS_ESTORE;
    }
    if (tx)
        tx->failed = 1;
    cps__log(CPS_LOG_ERROR, SUB, "%s key %llu in %s: %s", op, (unsigned long long)key,
             tx ? tx->s->dir : "?", mdb_strerror(rc));
    return CPS_ESTORE;
}

static inline int env_fail(cps__store *s, const char *op, int rc)
{
    cps__log(CPS_LOG_ERROR, SUB, "%s in %s: %s", op, s->dir, mdb_strerror(rc));
    return CPS_ESTORE;
}

/* disk.c */
/* Allocate the data file's blocks for a map of `bytes` (a full disk logged at `level`).
 * Errors: CPS_ENOSPC, CPS_ESTORE. */
int cps__st_reserve_map(cps__store *s, size_t bytes, int level);
/* Allocate blocks for DIR/lock.mdb before LMDB creates and maps it. Errors: CPS_ENOSPC,
 * CPS_ESTORE. */
int cps__st_reserve_lock_file(const char *dir);
/* Install the SIGBUS handler if the process left SIGBUS at its default. */
void cps__st_guard_install(void);
/* Publish s's mappings to the handler (after the open and every growth; no txn open). */
void cps__st_guard_update(cps__store *s);
/* Take s's mappings out of the handler's table (at close). */
void cps__st_guard_remove(cps__store *s);

/* growth.c */
/* Grow the map to `want` bytes (0: double it); `ahead`: before need (see there). Call with no
 * txn of this process open. Errors: CPS_ESTORE, CPS_ENOSPC. */
int cps__st_grow_map(cps__store *s, size_t want, int ahead);

/* record.c */
/* Write a record's REC_HDR-byte header for `len` values, optimizer step `step`, spec `sp`. */
void cps__st_hdr_encode(unsigned char *h, uint32_t len, uint64_t step, const cps__param_spec *sp);
/* Whether sp's optimizer and init kinds are known. */
int cps__st_kinds_valid(const cps__param_spec *sp);
/* Bytes of a record of `len` values under optimizer `opt_kind`. */
size_t cps__st_rec_size(uint32_t len, uint32_t opt_kind);
/* Decode and check a stored record; `out` borrows from `d`. Errors: CPS_ECORRUPT (logged). */
int cps__st_rec_decode(const MDB_val *d, uint64_t key, cps__param_rec *out);
/* The canonical form of a spec, as stored and compared. */
cps__param_spec cps__st_spec_canon(const cps__param_spec *sp);
/* Whether two specs are the same once canonical. */
int cps__st_spec_equal(const cps__param_spec *a, const cps__param_spec *b);

#endif
