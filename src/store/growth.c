/* The map's size: growth when a write finds it full (cps__st_grow_map, run by txn.c), room ahead
 * of a snapshot (ensure_room) and ahead of a known write (reserve). Growing remaps the file, so
 * it takes the map lock exclusive and waits for a background flush (store_int.h). */
#include <lmdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "chainps/error.h"
#include "core/log.h"
#include "store/store_int.h"

/* No map grows past this, however many growths (txn.c's MAX_GROWTHS) a write asks: a runaway
 * caller (e.g. one that writes garbage sizes) must not eat the disk. */
#define MAX_MAP_BYTES ((size_t)1 << 40)
/* cps__store_reserve: beyond the bytes asked, room for the transaction's own bookkeeping (the
 * freelist and meta records, the branch pages it copies), and the unit the map grows by. */
#define RESERVE_SLACK ((size_t)8 << 20)
#define RESERVE_ROUND ((size_t)16 << 20)

/* Grow the map to `want` bytes (0: double it). Called with no txn of ours open; waits for
 * other threads' read txns. `ahead`: growing ahead of need (ensure_room), where a full disk is
 * no error of the write path: logged as a warning, and the growth stops short of the
 * filesystem's last free half. */
int cps__st_grow_map(cps__store *s, size_t want, int ahead)
{
    MDB_envinfo info;
    int rc = mdb_env_info(s->env, &info);
    if (rc)
        return env_fail(s, "mdb_env_info", rc);
    if (want == 0)
        want = info.me_mapsize * 2;
    if (want <= info.me_mapsize)
        return 0;
    if (want > MAX_MAP_BYTES) {
        cps__log(CPS_LOG_ERROR, SUB, "%s: map full at %zu bytes, refusing to grow past %zu", s->dir,
                 info.me_mapsize, (size_t)MAX_MAP_BYTES);
        return CPS_ESTORE;
    }
    if (ahead) {
        /* Room ahead of a checkpoint is worth having, not worth filling the disk for: keep at
         * least as much free as the growth takes. */
        struct statvfs v;
        mdb_filehandle_t fd;
        if (mdb_env_get_fd(s->env, &fd) == 0 && fstatvfs(fd, &v) == 0 &&
            (double)v.f_bavail * v.f_frsize < 2.0 * (double)(want - info.me_mapsize)) {
            cps__log(CPS_LOG_WARN, SUB,
                     "store %s: not growing the map ahead from %.0f to %.0f MiB: only %.0f MiB "
                     "free on its filesystem",
                     s->dir, info.me_mapsize / MIB, want / MIB,
                     (double)v.f_bavail * v.f_frsize / MIB);
            return CPS_ENOSPC;
        }
    }
    /* Blocks first (no remap, readers may go on): a full disk leaves the map as it was. */
    if ((rc = cps__st_reserve_map(s, want, ahead ? CPS_LOG_WARN : CPS_LOG_ERROR)) != 0)
        return rc;
    if (s->before_grow)
        (void)s->before_grow(s->grow_ctx);
    pthread_rwlock_wrlock(&s->map_lock);
    pthread_mutex_lock(&s->sync_mu); /* a background flush msyncs the old map: let it end */
    rc = mdb_env_set_mapsize(s->env, want);
    pthread_mutex_unlock(&s->sync_mu);
    pthread_rwlock_unlock(&s->map_lock);
    if (rc)
        return env_fail(s, "mdb_env_set_mapsize", rc);
    cps__st_guard_update(s);
    s->stats.grows++;
    cps__log(CPS_LOG_INFO, SUB, "%s: map grown from %zu to %zu bytes", s->dir, info.me_mapsize,
             want);
    return 0;
}

/* The map's size and its high-water mark of used pages (the freelist below it counts as used,
 * so whatever is sized from it errs on the side of room). */
static int map_usage(cps__store *s, MDB_envinfo *info, size_t *used)
{
    MDB_stat st;
    int rc = mdb_env_info(s->env, info);
    if (rc == 0)
        rc = mdb_env_stat(s->env, &st);
    if (rc)
        return env_fail(s, "mdb_env_info", rc);
    *used = (info->me_last_pgno + 1) * (size_t)st.ms_psize;
    return 0;
}

static size_t db_pages(MDB_txn *t, MDB_dbi dbi)
{
    MDB_stat st;
    if (mdb_stat(t, dbi, &st) != 0)
        return 0;
    return st.ms_branch_pages + st.ms_leaf_pages + st.ms_overflow_pages;
}

/* Bytes of the pages the databases hold now (the freelist's own pages and the two meta pages
 * included): what a copy of the store would take, unlike the high-water mark of map_usage. */
static int live_bytes(cps__store *s, size_t *live)
{
    MDB_txn *t;
    MDB_stat st;
    pthread_rwlock_rdlock(&s->map_lock);
    int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &t);
    if (rc == 0) {
        const MDB_dbi dbis[] = {0 /* freelist */, 1 /* main */, s->params,
                                s->ranges,        s->dedup,     s->meta};
        size_t pages = 2;
        for (size_t i = 0; i < sizeof dbis / sizeof dbis[0]; i++)
            pages += db_pages(t, dbis[i]);
        rc = mdb_env_stat(s->env, &st);
        *live = pages * (size_t)st.ms_psize;
        mdb_txn_abort(t);
    }
    pthread_rwlock_unlock(&s->map_lock);
    return rc ? env_fail(s, "mdb_txn_begin (live bytes)", rc) : 0;
}

int cps__store_room_target(cps__store *s, size_t *target)
{
    size_t live;
    int rc = live_bytes(s, &live);
    if (rc)
        return rc;
    size_t room = live > s->room_min / ROOM_PER_LIVE ? live * ROOM_PER_LIVE : s->room_min;
    *target = (live + room + RESERVE_SLACK + RESERVE_ROUND - 1) / RESERVE_ROUND * RESERVE_ROUND;
    return 0;
}

int cps__store_ensure_room(cps__store *s)
{
    MDB_envinfo info;
    size_t target;
    int rc = cps__store_room_target(s, &target);
    if (rc == 0 && (rc = mdb_env_info(s->env, &info)) != 0)
        rc = env_fail(s, "mdb_env_info", rc);
    /* Pages free below the high-water mark count as room: those freed before a view opens
     * are reused while it is open. */
    if (rc == 0 && info.me_mapsize < target)
        rc = cps__st_grow_map(s, target, 1);
    return rc;
}

/* Map bytes one record of `size` bytes takes: a large record is a run of overflow pages of its
 * own (a 16-byte page header), a small one shares leaf pages, which may be only half full. */
static uint64_t rec_map_bytes(size_t size, size_t psize)
{
    if (size > psize / 4)
        return ((size + 16 + psize - 1) / psize) * psize;
    return 2 * (size + 32);
}

uint64_t cps__store_create_bytes(uint32_t len, uint32_t opt_kind)
{
    /* LMDB's pages are the OS page size. The record itself, its node in a leaf page and a
     * share of the branch pages above. */
    long page = sysconf(_SC_PAGESIZE);
    return rec_map_bytes(cps__st_rec_size(len, opt_kind), page > 0 ? (size_t)page : 4096) + 64;
}

int cps__store_reserve(cps__store *s, uint64_t bytes)
{
    if (s->poisoned)
        return CPS_EPOISONED;
    MDB_envinfo info;
    size_t used;
    int rc = map_usage(s, &info, &used);
    if (rc)
        return rc;
    if (bytes > MAX_MAP_BYTES || used + bytes + RESERVE_SLACK <= info.me_mapsize)
        return bytes > MAX_MAP_BYTES ? CPS_EINVAL : 0;
    /* A modest margin, not a doubling: the file takes the map's size on disk. */
    size_t want = used + bytes + RESERVE_SLACK;
    want = (want + RESERVE_ROUND - 1) / RESERVE_ROUND * RESERVE_ROUND;
    return cps__st_grow_map(s, want, 0);
}

void cps__store_stats_get(cps__store *s, cps__store_stats *out)
{
    *out = s->stats;
    out->syncs = atomic_load(&s->nsyncs);
    out->sync_fails = atomic_load(&s->nsync_fails);
}
