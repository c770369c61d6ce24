/* State transfer: bringing a range's chain back to R replicas.
 *
 * The scheduler picks a live server that does not hold the range and sends it JOIN_RANGE with
 * the range's tail as the source. The joiner forgets whatever old copy of the range it had and
 * asks the tail for a snapshot (SNAP_REQ). The tail registers the joiner as a shadow successor
 * in its chain state machine (every update it applies from now on is also forwarded to the
 * joiner), then a thread of its own streams the range from one LMDB read transaction — the
 * records with their optimizer state, the exactly-once records and the sequence number — so the
 * event loop keeps serving meanwhile. The joiner writes the chunks, then applies the updates
 * that were forwarded to it after the snapshot's sequence number, and reports CAUGHT_UP; the
 * scheduler then publishes a view with the joiner as the range's new tail. Every decision of
 * either side is the replica's (replication/replica_join.c, recovery/joiner.c; the simulator
 * runs the same code); this file performs its SNAPSHOT and JOIN_INSTALL items on LMDB and
 * nanomsg.
 * The SNAP payload's entries: see core/entries.h. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "core/log.h"
#include "optim/optim.h"
#include "entries.h"
#include "server.h"

#define SNAP_CHUNK    (4u << 20) /* bytes per chunk; CHAINPS_SNAP_CHUNK_KB sets fewer (tests) */
#define SNAP_FLUSH_MS 30000

/* ---- source side (the range's tail) ---- */

typedef struct snap_job {
    struct snap_job *next;
    cps__store *store;
    uint32_t self, joiner, range;
    uint64_t join_id;
    uint64_t epoch, lo, hi;
    char joiner_addr[CPS_ADDR_MAX];
    unsigned char key[32]; /* the job's, for this thread's own transport */
    int keyed;
    pthread_t thread;
    int started;
    volatile int done;
    uint64_t done_ms;
    int rc;
    /* the chunk being filled */
    cps__tp *tp;
    unsigned char *buf;
    size_t used, chunk_max; /* bytes in it; the most a chunk holds (one record may hold more) */
    uint64_t seq, step, bytes, records;
    uint32_t chunks; /* sent so far: the next chunk's number */
} snap_job;

/* Bytes per snapshot chunk: SNAP_CHUNK, or CHAINPS_SNAP_CHUNK_KB KiB (1 to 4096), the tests' knob
 * that makes even a small model's snapshot travel as many chunks. A bad value is logged, naming
 * it, and the default used: a snapshot must not fail over a test knob. */
static size_t snap_chunk_bytes(void)
{
    const char *env = getenv("CHAINPS_SNAP_CHUNK_KB");
    uint32_t kb = 0;
    char err[160];
    if (!env || !*env)
        return SNAP_CHUNK;
    if (cps__config_parse_u32("CHAINPS_SNAP_CHUNK_KB", env, 1, SNAP_CHUNK >> 10, &kb, err,
                              sizeof err) != 0) {
        cps__log(CPS_LOG_ERROR, "server", "%s; snapshots use chunks of %u KiB", err,
                 SNAP_CHUNK >> 10);
        return SNAP_CHUNK;
    }
    return (size_t)kb << 10;
}

static int job_flush(snap_job *j, int last)
{
    cps__msg_hdr h = {0};
    h.type = CPS_MSG_SNAP;
    h.sender = j->self;
    h.epoch = j->epoch;
    h.range = j->range;
    h.req_seq = j->seq;
    h.step = j->join_id; /* the range's step travels in the range entry */
    h.aux = (uint64_t)last;
    /* The chunk's number: nanomsg reconnects a broken connection by itself, so a chunk lost on
     * the old one is followed by the next on the new; the joiner gives up at the gap. */
    h.req_worker = j->chunks++;
    int rc = cps__msg_send(j->tp, j->joiner, &h, j->buf, j->used);
    j->bytes += j->used;
    j->used = 0;
    /* Let nanomsg take it before building the next one: bounded memory. */
    uint64_t deadline = cps__now_ms() + SNAP_FLUSH_MS;
    while (rc == 0 && cps__tp_queued(j->tp) > 0 && cps__now_ms() < deadline)
        cps__tp_poll(j->tp, 20, NULL, NULL, 0);
    return rc;
}

static int job_room(snap_job *j, size_t need)
{
    if (j->used + need > j->chunk_max && j->used > 0) {
        int rc = job_flush(j, 0);
        if (rc != 0)
            return rc;
    }
    if (need > j->chunk_max) {
        unsigned char *grown = realloc(j->buf, need);
        if (!grown)
            return CPS_ENOMEM;
        j->buf = grown;
    }
    return 0;
}

static int put_param(void *arg, uint64_t key, const cps__param_rec *rec)
{
    snap_job *j = arg;
    uint32_t slots = (uint32_t)cps__optim_state_slots(rec->spec.opt_kind);
    int rc = job_room(j, cps__ent_param_size(rec->len, slots));
    if (rc != 0)
        return rc;
    j->used += cps__ent_put_param(j->buf + j->used, key, rec->len, rec->opt_step, &rec->spec, slots,
                                  rec->vals, rec->state);
    j->records++;
    return 0;
}

static int put_dedup(void *arg, uint32_t worker, uint64_t seq)
{
    snap_job *j = arg;
    int rc = job_room(j, CPS_ENT_DEDUP_SIZE);
    if (rc != 0)
        return rc;
    j->used += cps__ent_put_dedup(j->buf + j->used, worker, seq);
    return 0;
}

static int put_named(void *arg, const char *name, const void *val, size_t len)
{
    snap_job *j = arg;
    size_t nlen = strlen(name);
    int rc = job_room(j, cps__ent_named_size(nlen, len));
    if (rc != 0)
        return rc;
    j->used += cps__ent_put_named(j->buf + j->used, name, nlen, val, len);
    return 0;
}

static int snap_txn(cps__txn *txn, void *arg)
{
    snap_job *j = arg;
    cps__range_meta m;
    int rc = cps__store_range_get(txn, j->range, &m);
    if (rc != 0)
        return rc;
    j->seq = m.seq;
    j->step = m.step;
    char prefix[32];
    snprintf(prefix, sizeof prefix, "agg/%" PRIu32 "/", j->range);
    rc = cps__store_param_scan(txn, j->lo, j->hi, put_param, j);
    if (rc == 0)
        rc = cps__store_dedup_scan(txn, j->range, put_dedup, j);
    if (rc == 0)
        rc = cps__store_meta_scan(txn, prefix, put_named, j);
    if (rc == 0 && (rc = job_room(j, CPS_ENT_RANGE_SIZE)) == 0)
        j->used += cps__ent_put_range(j->buf + j->used, m.seq, m.step);
    return rc;
}

static void *snap_main(void *arg)
{
    snap_job *j = arg;
    uint64_t t0 = cps__now_ms();
    j->chunk_max = snap_chunk_bytes();
    j->buf = malloc(j->chunk_max);
    int rc = j->buf ? cps__tp_create(j->keyed ? j->key : NULL, &j->tp) : CPS_ENOMEM;
    if (rc == 0)
        rc = cps__tp_peer_set(j->tp, j->joiner, j->joiner_addr);
    if (rc == 0)
        rc = cps__store_read(j->store, snap_txn, j);
    if (rc == 0)
        rc = job_flush(j, 1);
    uint64_t ms = cps__now_ms() - t0;
    if (rc == 0)
        cps__log(CPS_LOG_INFO, "server",
                 "range %u: snapshot at seq %llu sent to node %u: %llu "
                 "records, %.1f MB in %u chunks, %llu ms (%.0f MB/s)",
                 j->range, (unsigned long long)j->seq, j->joiner, (unsigned long long)j->records,
                 j->bytes / 1e6, j->chunks, (unsigned long long)ms,
                 ms ? j->bytes / 1e3 / (double)ms : 0.0);
    else
        cps__log(CPS_LOG_ERROR, "server", "range %u: snapshot for node %u failed: %s", j->range,
                 j->joiner, cps_strerror(rc));
    /* The socket stays open until the replica says it may go (cps__replica_snapshot_may_close):
     * nanomsg drops what has not left yet when a socket closes. */
    free(j->buf);
    j->buf = NULL;
    j->rc = rc;
    j->done_ms = cps__now_ms();
    __atomic_store_n(&j->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

void cps__server_start_snapshot(cps__server *s, const cps__replica_out *o)
{
    uint32_t r = o->range;
    const cps__node_info *joiner = cps__view_node(&s->view, o->to);
    snap_job *j = joiner && r < s->view.nranges ? calloc(1, sizeof *j) : NULL;
    if (!j) {
        cps__replica_snapshot_closed(s->replica, r, o->to, o->seq);
        return;
    }
    j->store = s->store;
    j->self = s->id;
    j->joiner = o->to;
    j->range = r;
    j->join_id = o->seq;
    j->epoch = s->view.epoch;
    j->lo = s->view.ranges[r].lo;
    j->hi = s->view.ranges[r].hi;
    snprintf(j->joiner_addr, sizeof j->joiner_addr, "%s", joiner->addr);
    j->keyed = s->cfg.secret_loaded;
    memcpy(j->key, s->cfg.secret_key, sizeof j->key);
    if (pthread_create(&j->thread, NULL, snap_main, j) == 0) {
        j->started = 1;
        j->next = s->snaps;
        s->snaps = j;
        cps__log(CPS_LOG_INFO, "server", "range %u: sending a snapshot to node %u", r, j->joiner);
    } else {
        cps__log(CPS_LOG_ERROR, "server", "range %u: cannot start a snapshot for node %u: %s", r,
                 j->joiner, cps_strerror(CPS_ENOMEM));
        cps__replica_snapshot_closed(s->replica, r, o->to, o->seq);
        free(j);
    }
}

void cps__server_reap_snapshots(cps__server *s, int wait)
{
    snap_job **pp = &s->snaps;
    uint64_t now = cps__now_ms();
    while (*pp) {
        snap_job *j = *pp;
        int done = __atomic_load_n(&j->done, __ATOMIC_ACQUIRE);
        if (wait || (done && cps__replica_snapshot_may_close(s->replica, j->range, j->joiner, j->rc,
                                                             j->done_ms, now))) {
            pthread_join(j->thread, NULL);
            cps__tp_destroy(j->tp);
            cps__replica_snapshot_closed(s->replica, j->range, j->joiner, j->join_id);
            *pp = j->next;
            free(j);
        } else {
            pp = &j->next;
        }
    }
}

/* ---- joiner side ---- */

/* Write one SNAP chunk (entries.c) in its own transaction; *seq: the range's sequence number
 * when it was the last. */
typedef struct install_io {
    cps__server *s;
    uint32_t range;
    const void *buf;
    size_t len;
    int last;
    uint64_t seq;
} install_io;

static int install_txn(cps__txn *txn, void *arg)
{
    install_io *io = arg;
    return cps__server_install_entries(txn, io->s, io->range, io->buf, io->len, io->last, &io->seq);
}

int cps__server_join_install(cps__server *s, const cps__replica_out *o, uint64_t *seq)
{
    install_io io = {s, o->range, o->upd.body, o->upd.body_len, o->last, 0};
    int rc = cps__store_write(s->store, install_txn, &io);
    *seq = io.seq;
    return rc;
}
