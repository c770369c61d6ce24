/* Transactions: the write transaction with its rerun after MDB_MAP_FULL, read transactions, and
 * snapshots (read transactions kept open across calls). Each holds the map lock shared, so the
 * map never moves under it. */
#include <lmdb.h>
#include <pthread.h>
#include <stdlib.h>

#include "chainps/error.h"
#include "core/log.h"
#include "store/store_int.h"

/* Growth is doubling, so 24 growths in one write take even a 1 MiB map past any real need;
 * the cap stops a runaway caller (e.g. one that writes garbage sizes) from eating the disk. */
#define MAX_GROWTHS 24

static void poison(cps__store *s, const char *op, int rc)
{
    s->poisoned = 1;
    cps__log(CPS_LOG_ERROR, SUB,
             "POISONED: %s in %s failed (%s); the store's state is unknown, every later call "
             "fails with CPS_EPOISONED until the node restarts",
             op, s->dir, mdb_strerror(rc));
}

int cps__store_write(cps__store *s, cps__txn_fn fn, void *arg)
{
    int released = 0;
    for (int growths = 0;; growths++) {
        if (s->poisoned)
            return CPS_EPOISONED;
        cps__txn tx = {.s = s};
        pthread_rwlock_rdlock(&s->map_lock);
        int rc = mdb_txn_begin(s->env, NULL, 0, &tx.t);
        if (rc) {
            pthread_rwlock_unlock(&s->map_lock);
            if (rc == MDB_PANIC) {
                poison(s, "mdb_txn_begin", rc);
                return CPS_EPOISONED;
            }
            return env_fail(s, "mdb_txn_begin", rc);
        }
        int frc = fn(&tx, arg);
        if (tx.map_full || frc != 0 || tx.failed) {
            mdb_txn_abort(tx.t);
            pthread_rwlock_unlock(&s->map_lock);
            if (!tx.map_full)
                return frc != 0 ? frc : CPS_ESTORE; /* an LMDB error fn chose to ignore */
        } else {
            rc = mdb_txn_commit(tx.t); /* frees the txn, success or not */
            pthread_rwlock_unlock(&s->map_lock);
            if (rc == 0)
                return 0;
            if (rc != MDB_MAP_FULL) {
                poison(s, "mdb_txn_commit", rc);
                return CPS_EPOISONED;
            }
        }
        /* MDB_MAP_FULL from a put or from the commit: nothing was written; grow and rerun. */
        if (growths >= MAX_GROWTHS) {
            cps__log(CPS_LOG_ERROR, SUB, "%s: still map full after %d growths", s->dir, growths);
            return CPS_ESTORE;
        }
        s->stats.reruns++;
        /* Read views pin the pages updates free: once they are closed, those pages are reused
         * and the map need not grow (the views' room is ensure_room's). */
        if (!released && s->before_grow && s->before_grow(s->grow_ctx) > 0) {
            released = 1;
            s->stats.pin_releases++;
            growths--;
            continue;
        }
        if ((rc = cps__st_grow_map(s, 0, 0)) != 0)
            return rc;
    }
}

int cps__store_read(cps__store *s, cps__txn_fn fn, void *arg)
{
    if (s->poisoned)
        return CPS_EPOISONED;
    cps__txn tx = {.s = s};
    pthread_rwlock_rdlock(&s->map_lock);
    int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &tx.t);
    if (rc) {
        pthread_rwlock_unlock(&s->map_lock);
        return env_fail(s, "mdb_txn_begin (read)", rc);
    }
    rc = fn(&tx, arg);
    mdb_txn_abort(tx.t);
    pthread_rwlock_unlock(&s->map_lock);
    return rc;
}

int cps__store_snapshot_begin(cps__store *s, cps__txn **out)
{
    if (s->poisoned)
        return CPS_EPOISONED;
    cps__txn *tx = calloc(1, sizeof *tx);
    if (!tx)
        return CPS_ENOMEM;
    tx->s = s;
    pthread_rwlock_rdlock(&s->map_lock);
    int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &tx->t);
    if (rc) {
        pthread_rwlock_unlock(&s->map_lock);
        free(tx);
        return env_fail(s, "mdb_txn_begin (snapshot)", rc);
    }
    *out = tx;
    return 0;
}

void cps__store_snapshot_end(cps__txn *tx)
{
    if (!tx)
        return;
    mdb_txn_abort(tx->t);
    pthread_rwlock_unlock(&tx->s->map_lock);
    free(tx);
}
