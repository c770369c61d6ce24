/* Parameter store: one LMDB environment per server, under its data directory.
 *
 * Databases inside the environment:
 *   "params" : u64 key (native-endian, MDB_INTEGERKEY) -> param record: a 64-byte header
 *              (format version, value length n, optimizer kind, optimizer step count t, the
 *              cps__param_spec) followed by n f32 parameter values and k*n f32 optimizer state
 *              values (k = cps__optim_state_slots(kind)).
 *   "ranges" : u32 range id -> range meta (update sequence number, last applied training step).
 *   "dedup"  : (u32 range, u32 worker) -> last applied request sequence number (worker with
 *              CPS_DEDUP_SPARSE_BIT: of its sparse pushes; with CPS_DEDUP_CLOCK_BIT: not a
 *              sequence number but its SSP clock in the range).
 *   "meta"   : small named values (node id, job identity).
 * The update of a range (records, its sequence number, the dedup entries) is written in ONE
 * write transaction, so a crash leaves all or nothing.
 *
 * Durability: MDB_NOSYNC by default; cps__store_sync() flushes, cps__store_sync_async() on a
 * background thread (the server asks for one periodically; the close flushes everything);
 * `sync_every_commit` makes every commit durable (~130 us vs ~3 us here). The map grows (doubling)
 * when a write transaction hits MDB_MAP_FULL: cps__store_write retries the whole transaction
 * function after growing, so that function must depend only on its inputs. A writer that knows its
 * size ahead (a declare) grows the map once first: cps__store_reserve.
 *
 * Disk space: the data file's blocks are allocated (posix_fallocate) for the whole map when it is
 * opened and before it grows, because LMDB writes through a shared map of a sparse file, where a
 * full disk is a SIGBUS. A full disk is therefore CPS_ENOSPC from the open or from the write
 * whose growth failed (nothing of it committed, the store stays usable), logged as
 * "store DIR: disk full (...)". The data file takes its map size on disk. A SIGBUS that still
 * hits the store's maps (a filesystem without fallocate) ends the process with one message
 * naming DIR and exit status 1.
 *
 * Thread-safety: one writer thread; read transactions may be used from other threads (MDB_NOTLS);
 * background flushes run on the store's own thread.
 */
#ifndef CPS_STORE_H
#define CPS_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "core/wire.h"

typedef struct cps__store cps__store;
typedef struct cps__txn cps__txn;

typedef struct cps__store_opts {
    size_t initial_map_bytes; /* 0: 64 MiB */
    int sync_every_commit;    /* 1: fsync on every commit */
    /* Called on the writer's thread when a write finds the map full, and before the map grows
     * (which must wait for every read transaction of this process to end): the owner of
     * long-lived snapshots ends them here (a snapshot waiting on that same thread would never
     * end) and returns how many it ended. If it ended any, the write is run again first without
     * growing: the pages the snapshots pinned are free again. May be NULL. */
    int (*before_grow)(void *ctx);
    void *grow_ctx;
    size_t room_min_bytes; /* 0: 256 MiB; the least room cps__store_ensure_room keeps */
    int quiet_busy; /* a held directory is expected (the caller tries the next): no ERROR log */
} cps__store_opts;

/* Open (creating if needed) the environment in directory `dir` (created if missing), holding an
 * exclusive lock on DIR/chainps.lock until cps__store_close.
 * Errors: CPS_EINVAL, CPS_EBUSY (another store, in this or another process, holds the
 * directory: the message names its pid), CPS_ENOSPC (no room for the map on DIR's filesystem),
 * CPS_ESTORE (LMDB error text is logged), CPS_ENOMEM. */
int cps__store_open(const char *dir, const cps__store_opts *opts, cps__store **out);
/* Sync and close. NULL is a no-op. */
void cps__store_close(cps__store *s);
/* Flush committed transactions to disk. Errors: CPS_ESTORE. */
int cps__store_sync(cps__store *s);
/* The same on the store's background thread (started at the first call), so that the caller's
 * thread (the server's event loop) does not wait for the msync (27-37 ms under 16 MB pushes).
 * Returns at once; requests made while a flush runs make one more flush after it. A growth of
 * the map waits for a flush in flight (the remap must not pull the map from under its msync);
 * cps__store_close stops the thread and flushes everything. A failed background flush is logged
 * and counted (stats.sync_fails). Errors: CPS_EPOISONED; without a thread the flush is done
 * here (cps__store_sync's errors). */
int cps__store_sync_async(cps__store *s);
/* Wait until no background flush is asked for or running (tests). */
void cps__store_sync_wait(cps__store *s);

/* A parameter record as seen through the store. Pointers are borrowed from LMDB (read txn) or
 * from the store's scratch (write txn); valid until the next write or the end of the txn. They
 * may be unaligned: use memcpy or the store's helpers. */
typedef struct cps__param_rec {
    uint32_t len;      /* number of parameter values */
    uint64_t opt_step; /* optimizer steps applied so far (Adam's t) */
    cps__param_spec spec;
    const float *vals;  /* len values */
    const float *state; /* slots*len values (NULL if the optimizer keeps no state) */
} cps__param_rec;

/* Run `fn` inside one write transaction and commit it. If fn returns non-zero the txn is aborted
 * and that value returned. MDB_MAP_FULL: abort, grow the map, run fn again.
 * Errors: fn's error, CPS_ESTORE, CPS_ENOSPC (the map had to grow and the disk is full: nothing
 * was written), CPS_EPOISONED (an earlier commit failed: state unknown). */
typedef int (*cps__txn_fn)(cps__txn *txn, void *arg);
int cps__store_write(cps__store *s, cps__txn_fn fn, void *arg);
/* Same for a read-only transaction (never retried, never commits). */
int cps__store_read(cps__store *s, cps__txn_fn fn, void *arg);

/* Read key's record. Errors: CPS_ENOTFOUND, CPS_ECORRUPT (bad record), CPS_ESTORE. */
int cps__store_param_get(cps__txn *txn, uint64_t key, cps__param_rec *out);
/* Create key with `len` values initialised from spec (see cps__init_fill) at tensor offset
 * `offset`, zero optimizer state, step 0. If the key exists with the same len and spec: no-op,
 * returns 0. Different: CPS_EEXIST. */
int cps__store_param_create(cps__txn *txn, uint64_t key, uint32_t len, uint64_t offset,
                            const cps__param_spec *spec);
/* Apply one gradient to key with its optimizer, in place (read, update, write).
 * Errors: CPS_ENOTFOUND, CPS_ESIZE (glen != len), CPS_ESTORE. */
int cps__store_param_apply(cps__txn *txn, uint64_t key, const float *grad, uint32_t glen);
/* Key's `len` parameter values, where they lie in the store (*vals, valid until txn ends; may be
 * misaligned for floats, so copy them with memcpy): a pull's read, which asks for a length.
 * Errors: those of cps__store_param_get, CPS_ESIZE (the record holds another number). */
int cps__store_param_read(cps__txn *txn, uint64_t key, uint32_t len, const float **vals);
/* Overwrite a whole record (state transfer, checkpoint restore). rec->vals / rec->state used. */
int cps__store_param_put(cps__txn *txn, uint64_t key, const cps__param_rec *rec);

/* Create or replace key's record with `len` zero values and zero optimizer state, optimizer
 * step `opt_step` (checkpoint restore: the data follows with cps__store_param_write).
 * Errors: CPS_EINVAL, CPS_ESTORE. */
int cps__store_param_reset(cps__txn *txn, uint64_t key, uint32_t len, uint64_t opt_step,
                           const cps__param_spec *spec);
/* Write n values into key's record at element `first` of slot `slot` (0: the parameters, 1..k:
 * optimizer state slot k-1). Errors: CPS_ENOTFOUND, CPS_ESIZE (out of bounds), CPS_ESTORE. */
int cps__store_param_write(cps__txn *txn, uint64_t key, uint32_t slot, uint64_t first,
                           const float *vals, uint64_t n);

/* A read-only transaction kept open across calls, e.g. by a checkpoint's reader thread: it sees
 * the store as it was at begin, however long it stays open. Meanwhile the map cannot grow: a
 * writer that needs more room waits until the snapshot ends, so keep it short.
 * Errors: CPS_ESTORE, CPS_ENOMEM, CPS_EPOISONED. */
int cps__store_snapshot_begin(cps__store *s, cps__txn **out);
/* End it (from any thread). NULL is a no-op. */
void cps__store_snapshot_end(cps__txn *txn);
/* Grow the map to cps__store_room_target, so that updates applied while a snapshot is open need
 * not grow it. The target follows the live data, not the highest page ever written, so a data
 * directory stays a bounded multiple of the model. The room is reserved on disk, so
 * the growth stops (CPS_ENOSPC, a warning) rather than take the filesystem's last free half.
 * Call with no transaction of this process open.
 * Errors: CPS_ESTORE, CPS_ENOSPC. */
int cps__store_ensure_room(cps__store *s);
/* The map size ensure_room grows to: the live pages plus room for updates while a snapshot is
 * open (at least the options' room_min_bytes, or 4 times the live data), rounded up. Errors:
 * CPS_ESTORE. */
int cps__store_room_target(cps__store *s, size_t *target);

/* Map bytes that creating a record of `len` values with optimizer `opt_kind` takes (pages
 * included): what a caller sums for cps__store_reserve. */
uint64_t cps__store_create_bytes(uint32_t len, uint32_t opt_kind);
/* Grow the map once, if needed, so that `bytes` more fit beyond what is in use (plus a small
 * slack), rather than let the write that needs them hit MDB_MAP_FULL and run again after each
 * doubling (a declare of 100 M parameters ran 5 times). The map grows to the need, not to a
 * power of two: the data file takes the map's size on disk. Call with no transaction of this
 * process open (as for a growth, before_grow runs first).
 * Errors: CPS_EINVAL (absurd size), CPS_ENOSPC (the disk cannot hold it: nothing changed; the
 * write may still fit), CPS_ESTORE, CPS_EPOISONED. */
int cps__store_reserve(cps__store *s, uint64_t bytes);

typedef struct cps__store_stats {
    uint64_t grows;        /* map growths, by any cause */
    uint64_t reruns;       /* write transactions run again after MDB_MAP_FULL */
    uint64_t pin_releases; /* ... of them after before_grow ended snapshots, without growing */
    uint64_t syncs;        /* flushes done (here or in the background) */
    uint64_t sync_fails;   /* flushes that failed */
} cps__store_stats;
/* Counters since the open (tests and status). Call on the writer's thread. */
void cps__store_stats_get(cps__store *s, cps__store_stats *out);

/* Iterate records with lo <= key <= hi in key order; fn returns non-zero to stop (returned). */
typedef int (*cps__param_iter_fn)(void *arg, uint64_t key, const cps__param_rec *rec);
int cps__store_param_scan(cps__txn *txn, uint64_t lo, uint64_t hi, cps__param_iter_fn fn,
                          void *arg);

typedef struct cps__range_meta {
    uint64_t seq;  /* update sequence number of the last update applied to the range */
    uint64_t step; /* last training step applied (sync mode) */
} cps__range_meta;
/* Missing range reads as zeros (returns 0). */
int cps__store_range_get(cps__txn *txn, uint32_t range, cps__range_meta *out);
int cps__store_range_put(cps__txn *txn, uint32_t range, const cps__range_meta *m);

/* Exactly-once record: last applied request seq of `worker` in `range` (0 if none). */
int cps__store_dedup_get(cps__txn *txn, uint32_t range, uint32_t worker, uint64_t *seq);
int cps__store_dedup_put(cps__txn *txn, uint32_t range, uint32_t worker, uint64_t seq);

/* Every exactly-once record of `range`, in worker order; fn returns non-zero to stop. */
typedef int (*cps__dedup_iter_fn)(void *arg, uint32_t worker, uint64_t seq);
int cps__store_dedup_scan(cps__txn *txn, uint32_t range, cps__dedup_iter_fn fn, void *arg);

/* Forget range `range` (keys lo..hi): its parameter records, exactly-once records, sequence
 * number, and the named values starting with `meta_prefix` (may be NULL). Used before a
 * replica receives the range afresh (state transfer). */
int cps__store_range_clear(cps__txn *txn, uint32_t range, uint64_t lo, uint64_t hi,
                           const char *meta_prefix);

/* Named values whose name starts with `prefix`, in name order; fn returns non-zero to stop.
 * name is NUL-terminated (borrowed), val borrowed until the next write. */
typedef int (*cps__meta_iter_fn)(void *arg, const char *name, const void *val, size_t len);
int cps__store_meta_scan(cps__txn *txn, const char *prefix, cps__meta_iter_fn fn, void *arg);
/* Delete a named value (absent: 0). */
int cps__store_meta_del(cps__txn *txn, const char *name);
/* Empty the store: parameters, range sequence numbers, exactly-once records and metadata
 * (`chainps server --reset-data`). Errors: CPS_ESTORE. */
int cps__store_wipe(cps__txn *txn);

/* Small named values (<= 4 KiB). get: CPS_ENOTFOUND if absent; *len in: capacity, out: size. */
int cps__store_meta_get(cps__txn *txn, const char *name, void *buf, size_t *len);
int cps__store_meta_put(cps__txn *txn, const char *name, const void *buf, size_t len);

/* Larger named values (<= 64 MiB; e.g. the scheduler's view). blob_get returns a borrowed
 * pointer valid until the next write or the end of the txn. Errors: CPS_ENOTFOUND, CPS_EINVAL. */
int cps__store_blob_put(cps__txn *txn, const char *name, const void *buf, size_t len);
int cps__store_blob_get(cps__txn *txn, const char *name, const void **buf, size_t *len);

/* XXH3-64 over the parameter values (not optimizer state) of keys lo..hi, in key order, mixed
 * with each key: equal on two replicas iff they hold the same bits. */
int cps__store_checksum(cps__txn *txn, uint64_t lo, uint64_t hi, uint64_t *out);

/* Counters for status. */
int cps__store_count(cps__txn *txn, uint64_t *keys, uint64_t *values);

#endif
