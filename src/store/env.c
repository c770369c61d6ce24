/* The store's environment: open (directory, lock, LMDB environment, databases), close, and the
 * flushes to disk, here or on the background flusher. See store.h for the databases and the
 * transaction rules; store_int.h lists the files that make up the store. */
#include "store/store.h"

#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chainps/error.h"
#include "core/log.h"
#include "store/store_int.h"

#define DEFAULT_MAP_BYTES ((size_t)64 << 20)
/* Readers are the event loop plus a few off-loop jobs (checkpoint export, state transfer,
 * status); MDB_NOTLS ties a slot to each open read txn, not to a thread. */
#define MAX_READERS 126

static int mkdir_p(const char *dir)
{
    char path[512];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof path)
        return -1;
    memcpy(path, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (path[i] == '/' || path[i] == '\0') {
            char c = path[i];
            path[i] = '\0';
            if (mkdir(path, 0775) != 0 && errno != EEXIST)
                return -1;
            path[i] = c;
        }
    }
    return 0;
}

static int open_dbis(cps__store *s)
{
    MDB_txn *t;
    int rc = mdb_txn_begin(s->env, NULL, 0, &t);
    if (rc)
        return env_fail(s, "mdb_txn_begin (open)", rc);
    const struct {
        const char *name;
        unsigned flags;
        MDB_dbi *dbi;
    } dbs[] = {
        {"params", MDB_CREATE | MDB_INTEGERKEY, &s->params},
        {"ranges", MDB_CREATE | MDB_INTEGERKEY, &s->ranges},
        {"dedup", MDB_CREATE | MDB_INTEGERKEY, &s->dedup},
        {"meta", MDB_CREATE, &s->meta},
    };
    for (size_t i = 0; i < sizeof dbs / sizeof dbs[0]; i++) {
        rc = mdb_dbi_open(t, dbs[i].name, dbs[i].flags, dbs[i].dbi);
        if (rc) {
            mdb_txn_abort(t);
            cps__log(CPS_LOG_ERROR, SUB, "mdb_dbi_open %s in %s: %s", dbs[i].name, s->dir,
                     mdb_strerror(rc));
            return CPS_ESTORE;
        }
    }
    rc = mdb_txn_commit(t);
    return rc ? env_fail(s, "mdb_txn_commit (open)", rc) : 0;
}

/* One store, one process: two LMDB writers on one environment (two servers started from one
 * directory) would apply every update twice. flock() is per open file, so a second store in
 * the same process is refused too; the holder's pid is written in the file for the message. */
static int lock_dir(const char *dir, int quiet_busy, int *fd_out)
{
    char path[600];
    snprintf(path, sizeof path, "%s/chainps.lock", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        cps__log(CPS_LOG_ERROR, SUB, "cannot open %s: %s", path, strerror(errno));
        return CPS_ESTORE;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        char pid[32] = "";
        ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
        pid[n > 0 ? n : 0] = 0;
        pid[strcspn(pid, "\n")] = 0;
        close(fd);
        if (e == EWOULDBLOCK) {
            cps__log(quiet_busy ? CPS_LOG_DEBUG : CPS_LOG_ERROR, SUB,
                     "data directory %s is in use by process %s (another chainps server or "
                     "scheduler): two servers must not share a store; give each its own --data",
                     dir, pid[0] ? pid : "?");
            return CPS_EBUSY;
        }
        cps__log(CPS_LOG_ERROR, SUB, "cannot lock %s: %s", path, strerror(e));
        return CPS_ESTORE;
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n)
        cps__log(CPS_LOG_WARN, SUB, "cannot record our pid in %s: %s", path, strerror(errno));
    *fd_out = fd;
    return 0;
}

int cps__store_open(const char *dir, const cps__store_opts *opts, cps__store **out)
{
    if (!dir || !out || !*dir || strlen(dir) >= sizeof((cps__store *)0)->dir)
        return CPS_EINVAL;
    *out = NULL;
    if (mkdir_p(dir) != 0) {
        cps__log(CPS_LOG_ERROR, SUB, "cannot create directory %s: %s", dir, strerror(errno));
        return CPS_ESTORE;
    }
    int lock_fd;
    int lrc = lock_dir(dir, opts && opts->quiet_busy, &lock_fd);
    if (lrc != 0)
        return lrc;
    cps__store *s = calloc(1, sizeof *s);
    if (!s) {
        close(lock_fd);
        return CPS_ENOMEM;
    }
    s->lock_fd = lock_fd;
    s->guard = -1;
    snprintf(s->dir, sizeof s->dir, "%s", dir);
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    /* A steady stream of readers must not starve a map growth (and so the writer). */
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&s->map_lock, &attr);
    pthread_rwlockattr_destroy(&attr);
    pthread_mutex_init(&s->sync_mu, NULL);
    pthread_mutex_init(&s->flush_mu, NULL);
    pthread_cond_init(&s->flush_cv, NULL);

    size_t map = opts && opts->initial_map_bytes ? opts->initial_map_bytes : DEFAULT_MAP_BYTES;
    if (opts) {
        s->before_grow = opts->before_grow;
        s->grow_ctx = opts->grow_ctx;
    }
    s->room_min = opts && opts->room_min_bytes ? opts->room_min_bytes : ROOM_MIN_FREE;
    /* MDB_WRITEMAP: dirty pages are written in the map itself, so a commit does no writev of
     * every page (measured: ~10% of server CPU for 1 MB updates, ~5 us per small commit). */
    unsigned flags = MDB_NOTLS | MDB_WRITEMAP;
    int err = CPS_ESTORE; /* what a failure below returns */
    if (!(opts && opts->sync_every_commit))
        flags |= MDB_NOSYNC;
    int rc = mdb_env_create(&s->env);
    if (rc) {
        env_fail(s, "mdb_env_create", rc);
        s->env = NULL;
        goto fail;
    }
    if ((rc = mdb_env_set_maxdbs(s->env, 8)) ||
        (rc = mdb_env_set_maxreaders(s->env, MAX_READERS)) ||
        (rc = mdb_env_set_mapsize(s->env, map))) {
        env_fail(s, "mdb_env_set_*", rc);
        goto fail;
    }
    if ((err = cps__st_reserve_lock_file(dir)) != 0)
        goto fail;
    err = CPS_ESTORE;
    if ((rc = mdb_env_open(s->env, dir, flags, 0664))) {
        /* A new environment's meta pages are written with write(2): a full disk says so. */
        if (rc == ENOSPC || rc == EDQUOT) {
            cps__log(CPS_LOG_ERROR, SUB, "store %s: disk full (mdb_env_open: %s)", dir,
                     strerror(rc));
            err = CPS_ENOSPC;
        } else {
            env_fail(s, "mdb_env_open", rc);
        }
        goto fail;
    }
    MDB_envinfo info;
    if ((rc = mdb_env_info(s->env, &info))) {
        env_fail(s, "mdb_env_info", rc);
        goto fail;
    }
    map = info.me_mapsize; /* an existing environment keeps the larger map it grew to */
    cps__st_guard_install();
    if ((err = cps__st_reserve_map(s, map, CPS_LOG_ERROR)) != 0)
        goto fail;
    err = CPS_ESTORE;
    if (open_dbis(s) != 0)
        goto fail;
    cps__st_guard_update(s);
    cps__log(CPS_LOG_DEBUG, SUB, "opened %s (map %zu bytes, %s)", dir, map,
             (flags & MDB_NOSYNC) ? "nosync" : "sync every commit");
    *out = s;
    return 0;
fail:
    if (s->env)
        mdb_env_close(s->env);
    pthread_rwlock_destroy(&s->map_lock);
    pthread_mutex_destroy(&s->sync_mu);
    pthread_mutex_destroy(&s->flush_mu);
    pthread_cond_destroy(&s->flush_cv);
    close(s->lock_fd);
    free(s);
    return err;
}

/* One flush, from whichever thread: never during a remap (see sync_mu). */
static int flush(cps__store *s)
{
    pthread_mutex_lock(&s->sync_mu);
    int rc = mdb_env_sync(s->env, 1);
    pthread_mutex_unlock(&s->sync_mu);
    if (rc) {
        atomic_fetch_add(&s->nsync_fails, 1);
        return env_fail(s, "mdb_env_sync", rc);
    }
    atomic_fetch_add(&s->nsyncs, 1);
    return 0;
}

static void *flusher_main(void *arg)
{
    cps__store *s = arg;
    pthread_mutex_lock(&s->flush_mu);
    for (;;) {
        while (!s->flush_want && !s->flush_stop)
            pthread_cond_wait(&s->flush_cv, &s->flush_mu);
        if (s->flush_stop)
            break;
        s->flush_want = 0; /* requests made during this flush make one more */
        s->flush_busy = 1;
        pthread_mutex_unlock(&s->flush_mu);
        flush(s);
        pthread_mutex_lock(&s->flush_mu);
        s->flush_busy = 0;
        pthread_cond_broadcast(&s->flush_cv);
    }
    pthread_mutex_unlock(&s->flush_mu);
    return NULL;
}

static void flusher_stop(cps__store *s)
{
    if (!s->flusher_on)
        return;
    pthread_mutex_lock(&s->flush_mu);
    s->flush_stop = 1;
    pthread_cond_broadcast(&s->flush_cv);
    pthread_mutex_unlock(&s->flush_mu);
    pthread_join(s->flusher, NULL);
    s->flusher_on = 0;
}

void cps__store_close(cps__store *s)
{
    if (!s)
        return;
    flusher_stop(s); /* a flush in flight ends first; the one below covers everything */
    if (!s->poisoned)
        flush(s);
    cps__st_guard_remove(s);
    mdb_env_close(s->env);
    pthread_rwlock_destroy(&s->map_lock);
    pthread_mutex_destroy(&s->sync_mu);
    pthread_mutex_destroy(&s->flush_mu);
    pthread_cond_destroy(&s->flush_cv);
    free(s->scratch);
    close(s->lock_fd); /* after the environment: the next owner finds it closed */
    free(s);
}

int cps__store_sync(cps__store *s)
{
    if (s->poisoned)
        return CPS_EPOISONED;
    return flush(s);
}

int cps__store_sync_async(cps__store *s)
{
    if (s->poisoned)
        return CPS_EPOISONED;
    if (!s->flusher_on) {
        if (pthread_create(&s->flusher, NULL, flusher_main, s) != 0) {
            cps__log(CPS_LOG_WARN, SUB, "%s: no thread for background flushes: flushing here",
                     s->dir);
            return flush(s);
        }
        s->flusher_on = 1;
    }
    pthread_mutex_lock(&s->flush_mu);
    s->flush_want = 1;
    pthread_cond_signal(&s->flush_cv);
    pthread_mutex_unlock(&s->flush_mu);
    return 0;
}

void cps__store_sync_wait(cps__store *s)
{
    if (!s->flusher_on)
        return;
    pthread_mutex_lock(&s->flush_mu);
    while (s->flush_want || s->flush_busy)
        pthread_cond_wait(&s->flush_cv, &s->flush_mu);
    pthread_mutex_unlock(&s->flush_mu);
}
