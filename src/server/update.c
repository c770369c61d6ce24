/* The server's data path: the I/O side of replication/replica.c.
 *
 * The replica decides everything (what a request becomes, which records an update writes, what
 * is sent and answered); this file reads the store for it (cps__replica_env) and performs its
 * ready list in order: WRITE (one LMDB transaction with the update's data, the range's sequence
 * number and the records the replica laid out), SEND (FWD / CHAIN_ACK / CHAIN_MARK to a
 * neighbour), REPLY (ACK, ERROR, or values read from LMDB straight into the message). The order
 * is the replica's: a FWD that comes before its WRITE (forward before apply) is handed to the
 * transport first, whose I/O thread sends it while this thread writes.
 *
 * Why a push's MAC is still checked by the transport before the replica sees it, rather than
 * during the FWD's copy or the apply's pass over the values (which would save the MAC's pass
 * over memory, not its arithmetic): the replica's step changes its state on the push before
 * either copy happens (the chain's record of each worker's last request, the range's next
 * sequence number, the forwarded-but-unacked list, a sync step's contributions), so a tag
 * found wrong at the copy or in the write would leave a replica that counts as applied a push
 * that never was: the genuine retry would be acknowledged as a duplicate and lost, or the
 * server would have to leave (poisoned) on any forged message. Checking there needs the replica
 * to hold a push as "check pending" and take it back whole, and the chain a FWD that its
 * successor holds until confirmed or cancelled.
 *
 * Measured, that would not pay (issue 30; docs/security.md, bench/results/check_pending.md): a
 * check that rides on a copy saves only the MAC's own pass over memory, not Poly1305's
 * arithmetic, which stays on this thread. bench/bench_check_apply (the check of each 16 KiB
 * piece right before the optimizer reads it, against the check and then the apply) saves 2-6%
 * of the server's CPU for that push at 1 MiB and 6-13% at 16 MiB, 0.5-2% and 2-4.5% of the
 * server's whole CPU per push+pull in a job; removing the check outright, which no design may,
 * would save about a quarter. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chainps/error.h"
#include "core/gradcodec.h"
#include "core/log.h"
#include "optim/optim.h"
#include "entries.h"
#include "server.h"

/* ---- store reads for the replica (cps__replica_env) ---- */

static void agg_meta_name(char *buf, size_t len, uint32_t range, uint64_t sig)
{
    snprintf(buf, len, "agg/%" PRIu32 "/%016" PRIx64, range, sig);
}

typedef struct meta_read {
    uint32_t range, worker;
    uint64_t sig;
    uint64_t value;
} meta_read;

static int read_range_seq(cps__txn *txn, void *arg)
{
    meta_read *m = arg;
    cps__range_meta rm;
    int rc = cps__store_range_get(txn, m->range, &rm);
    m->value = rc == 0 ? rm.seq : 0;
    return rc;
}

static int read_dedup(cps__txn *txn, void *arg)
{
    meta_read *m = arg;
    return cps__store_dedup_get(txn, m->range, m->worker, &m->value);
}

static int read_agg(cps__txn *txn, void *arg)
{
    meta_read *m = arg;
    char name[64];
    unsigned char b[8];
    size_t len = sizeof b;
    agg_meta_name(name, sizeof name, m->range, m->sig);
    int rc = cps__store_meta_get(txn, name, b, &len);
    m->value = (rc == 0 && len == 8) ? cps__le64_get(b) : 0;
    return rc == CPS_ENOTFOUND ? 0 : rc;
}

static int env_range_seq(void *ctx, uint32_t range, uint64_t *seq)
{
    meta_read m = {.range = range};
    int rc = cps__store_read(((cps__server *)ctx)->store, read_range_seq, &m);
    *seq = m.value;
    return rc;
}

static int env_dedup(void *ctx, uint32_t range, uint32_t worker, uint64_t *seq)
{
    meta_read m = {.range = range, .worker = worker};
    int rc = cps__store_read(((cps__server *)ctx)->store, read_dedup, &m);
    *seq = m.value;
    return rc;
}

static int env_agg_step(void *ctx, uint32_t range, uint64_t sig, uint64_t *step)
{
    meta_read m = {.range = range, .sig = sig};
    int rc = cps__store_read(((cps__server *)ctx)->store, read_agg, &m);
    *step = m.value;
    return rc;
}

typedef struct check_io {
    const cps__kv *kv;
    const cps__param_spec *spec; /* declare: the requested definition */
    uint64_t bad_key;
    uint32_t have_len;
} check_io;

static int check_keys(cps__txn *txn, void *arg)
{
    check_io *c = arg;
    for (uint32_t i = 0; i < c->kv->nkeys; i++) {
        cps__param_rec rec;
        int rc = cps__store_param_get(txn, c->kv->keys[i], &rec);
        if (c->spec) {
            if (rc == CPS_ENOTFOUND)
                continue;
            if (rc == 0 && (rec.len != c->kv->lens[i]))
                rc = CPS_EEXIST;
        } else if (rc == 0 && rec.len != c->kv->lens[i]) {
            rc = CPS_ESIZE;
        }
        if (rc != 0) {
            c->bad_key = c->kv->keys[i];
            c->have_len = rc == CPS_ENOTFOUND ? 0 : rec.len;
            return rc;
        }
    }
    return 0;
}

static int env_check_keys(void *ctx, const cps__kv *kv, const cps__param_spec *spec,
                          uint64_t *bad_key, uint32_t *have_len)
{
    check_io c = {kv, spec, 0, 0};
    int rc = cps__store_read(((cps__server *)ctx)->store, check_keys, &c);
    *bad_key = c.bad_key;
    *have_len = c.have_len;
    return rc;
}

typedef struct scan_io {
    uint32_t range;
    int (*fn)(void *arg, uint32_t id, uint64_t value);
    void *arg;
} scan_io;

static int scan_txn(cps__txn *txn, void *arg)
{
    scan_io *sc = arg;
    return cps__store_dedup_scan(txn, sc->range, sc->fn, sc->arg);
}

static int env_scan_dedup(void *ctx, uint32_t range,
                          int (*fn)(void *arg, uint32_t id, uint64_t value), void *arg)
{
    scan_io sc = {range, fn, arg};
    return cps__store_read(((cps__server *)ctx)->store, scan_txn, &sc);
}

static void env_add(void *ctx, float *acc, const float *x, size_t n)
{
    (void)ctx;
    cps__vec_add(acc, x, n);
}

/* A message's owner: the heap copy of its cps__rx (cps__server_take). */
static void env_release(void *ctx, void *owner)
{
    (void)ctx;
    cps__rx_free(owner);
    free(owner);
}

static void *env_msg_alloc(void *ctx, uint32_t to, size_t len)
{
    return cps__tp_reserve(((cps__server *)ctx)->tp, to, len);
}

int cps__server_replica_new(cps__server *s)
{
    cps__replica_env env = {
        s,       env_range_seq, env_dedup,    env_agg_step, env_check_keys, env_scan_dedup,
        env_add, env_release,   env_msg_alloc};
    /* Our id comes with the first view (a rejoin may be given another). */
    cps__replica_config cfg = {.self = 0,
                               .resend_ms = 200,
                               .max_unacked = 1024,
                               .dead_after_ms = s->cfg.dead_after_ms,
                               .start_ms = cps__now_ms()};
    cps__replica_destroy(s->replica);
    s->replica = NULL;
    s->fence = NULL;
    int rc = cps__replica_create(&cfg, &env, &s->replica);
    if (rc == 0)
        s->fence = cps__replica_fence(s->replica); /* a new one: a fresh replica is not joined */
    return rc;
}

/* ---- REPLY ---- */

typedef struct read_io {
    cps__tp *tp;
    void *msg;  /* the reply, from cps__tp_reserve */
    size_t off; /* where the values start in it */
    const cps__kv *kv;
} read_io;

/* The values go from LMDB into the reply through cps__tp_fill: to a tcp:// worker the reply's
 * MAC is computed as they are copied (one pass over them instead of the copy and then the seal
 * at send); elsewhere it is the plain copy it always was. */
static int read_values(cps__txn *txn, void *arg)
{
    read_io *r = arg;
    size_t off = r->off;
    for (uint32_t i = 0; i < r->kv->nkeys; i++) {
        const float *vals;
        size_t n = (size_t)r->kv->lens[i] * sizeof(float);
        int rc = cps__store_param_read(txn, r->kv->keys[i], r->kv->lens[i], &vals);
        if (rc == 0)
            rc = cps__tp_fill(r->tp, r->msg, off, vals, n);
        if (rc != 0)
            return rc;
        off += n;
    }
    return 0;
}

/* Send `worker` the current values of kv's keys as the reply to its request. */
static void reply_values(cps__server *s, const cps__msg_hdr *rh, const cps__kv *kv)
{
    uint64_t nvals = 0;
    for (uint32_t i = 0; i < kv->nkeys; i++)
        nvals += kv->lens[i];
    size_t len = cps__wire_kv_size(kv->nkeys, nvals);
    cps__msg_hdr h = *rh;
    /* rh is our reply, sent by us: an error goes to the worker it was for. */
    cps__msg_hdr req = *rh;
    req.sender = rh->req_worker;
    /* Reserved for the worker: to a same-host one the values go from LMDB straight into the
     * ring, written once. */
    void *buf = cps__msg_reserve(s->tp, rh->req_worker, &h, len);
    if (!buf) {
        cps__server_reply_error(s, &req, CPS_ENOMEM, "no memory for a %zu-byte reply", len);
        return;
    }
    char *payload = (char *)buf + CPS_WIRE_HDR_SIZE;
    /* Keys and lens first; the values are read from LMDB straight into the message. */
    cps__wire_kv_encode(payload, len, kv->nkeys, kv->keys, kv->lens, NULL, 0);
    cps__le32_put(payload + 4, (uint32_t)nvals);
    read_io r = {s->tp, buf, CPS_WIRE_HDR_SIZE + cps__wire_kv_size(kv->nkeys, 0), kv};
    int rc = cps__store_read(s->store, read_values, &r);
    if (rc != 0) {
        cps__tp_unreserve(s->tp, buf);
        cps__server_reply_error(s, &req, rc, "reading %u keys failed", kv->nkeys);
        return;
    }
    s->stats.pull_bytes += nvals * 4;
    rc = cps__tp_send(s->tp, rh->req_worker, buf, CPS_WIRE_HDR_SIZE + len);
    if (rc != 0) {
        cps__tp_unreserve(s->tp, buf);
        cps__log(CPS_LOG_WARN, "server", "reply to node %u failed: %s", rh->req_worker,
                 cps_strerror(rc));
    }
}

static void do_reply(cps__server *s, const cps__replica_out *o)
{
    if (o->status < 0) {
        cps__server_reply_error(s, &o->req, o->status, "%s", o->text);
        return;
    }
    cps__msg_hdr h = o->hdr;
    h.sender = s->id;
    h.epoch = s->view.epoch;
    if (h.type == CPS_MSG_VALUES) {
        reply_values(s, &h, &o->kv);
        return;
    }
    int rc = cps__msg_send(s->tp, o->to, &h, NULL, 0);
    if (rc != 0)
        cps__log(CPS_LOG_WARN, "server", "ack to node %u failed: %s", o->to, cps_strerror(rc));
}

/* ---- WRITE: the update's write set in one transaction ---- */

typedef struct apply_io {
    cps__server *server;
    const cps__replica_out *w;
    uint64_t bad_key;
} apply_io;

static int apply_txn(cps__txn *txn, void *arg)
{
    apply_io *io = arg;
    const cps__replica_out *w = io->w;
    const cps__chain_update *u = &w->upd;
    cps__kv kv;
    int rc = 0; /* CPS_UPD_SKIP: nothing but the records below */
    if (u->kind == CPS_UPD_DECLARE) {
        const uint64_t *offsets;
        cps__param_spec spec;
        rc = cps__wire_declare_decode(u->body, u->body_len, &kv, &offsets, &spec);
        for (uint32_t i = 0; rc == 0 && i < kv.nkeys; i++) {
            rc = cps__store_param_create(txn, kv.keys[i], kv.lens[i], offsets[i], &spec);
            if (rc == CPS_EEXIST)
                rc = 0; /* the head checked; a conflicting re-declare leaves the first */
            if (rc != 0)
                io->bad_key = kv.keys[i];
        }
    } else if (u->kind == CPS_UPD_PUT) {
        rc = cps__server_install_entries(txn, io->server, w->range, u->body, u->body_len, 0, NULL);
    } else if (u->kind == CPS_UPD_PUSH) {
        rc = cps__wire_kv_decode(u->body, u->body_len, 1, &kv);
        const float *g = kv.vals;
        for (uint32_t i = 0; rc == 0 && i < kv.nkeys; i++) {
            rc = cps__store_param_apply(txn, kv.keys[i], g, kv.lens[i]);
            if (rc != 0)
                io->bad_key = kv.keys[i];
            g += kv.lens[i];
        }
    }
    if (rc != 0)
        return rc;
    cps__range_meta m;
    if ((rc = cps__store_range_get(txn, w->range, &m)) != 0)
        return rc;
    m.seq = w->seq;
    if (u->step > m.step)
        m.step = u->step;
    rc = cps__store_range_put(txn, w->range, &m);
    for (uint32_t i = 0; rc == 0 && i < w->nrecs; i++)
        rc = cps__store_dedup_put(txn, w->range, w->recs[i].id, w->recs[i].value);
    if (rc == 0 && u->sig) {
        char name[64];
        unsigned char b[8];
        agg_meta_name(name, sizeof name, w->range, u->sig);
        cps__le64_put(b, u->step);
        rc = cps__store_meta_put(txn, name, b, sizeof b);
    }
    return rc;
}

/* Copies of a record the map must hold: every push rewrites a record whole (copy-on-write), and
 * LMDB reuses the pages a commit frees only two commits later (the other meta page still
 * points at them): the live copy and the two before it. */
#define COW_COPIES 3

/* A declare's records go in at once: grow the map to hold them (and the copies the pushes that
 * follow will make) before the write, rather than have the write hit MAP_FULL and initialise
 * every value again after each doubling (17-37 s for 100 M parameters). Should the growth fail,
 * the write finds out for itself (and reports the full disk). */
typedef struct declare_need {
    cps__kv kv;
    cps__param_spec spec;
    uint64_t bytes;
} declare_need;

/* Only the keys not there yet: every worker declares the same tensors, and only the first
 * declare creates them. */
static int declare_need_txn(cps__txn *txn, void *arg)
{
    declare_need *d = arg;
    for (uint32_t i = 0; i < d->kv.nkeys; i++) {
        cps__param_rec rec;
        if (cps__store_param_get(txn, d->kv.keys[i], &rec) == CPS_ENOTFOUND)
            d->bytes += cps__store_create_bytes(d->kv.lens[i], d->spec.opt_kind);
    }
    return 0;
}

static void reserve_declare(cps__server *s, const cps__chain_update *u)
{
    declare_need d = {0};
    const uint64_t *offsets;
    if (cps__wire_declare_decode(u->body, u->body_len, &d.kv, &offsets, &d.spec) != 0 ||
        cps__store_read(s->store, declare_need_txn, &d) != 0 || d.bytes == 0)
        return;
    uint64_t bytes = d.bytes;
    int rc = cps__store_reserve(s->store, bytes * COW_COPIES);
    if (rc != 0)
        cps__log(CPS_LOG_WARN, "server", "cannot grow the store for a declare of %.1f MB: %s",
                 bytes / 1e6, cps_strerror(rc));
}

static void do_apply(cps__server *s, const cps__replica_out *w)
{
    apply_io io = {s, w, 0};
    if (w->upd.kind == CPS_UPD_DECLARE)
        reserve_declare(s, &w->upd);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = cps__store_write(s->store, apply_txn, &io);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    cps__prom_hist_observe(&s->ctr.apply,
                           (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
    if (rc != 0) {
        cps__log(CPS_LOG_ERROR, "server",
                 "range %u: applying update %llu failed at key "
                 "%016" PRIx64 ": %s",
                 w->range, (unsigned long long)w->seq, io.bad_key, cps_strerror(rc));
        /* Nothing of this update was committed (CPS_ENOSPC aborts the txn), but the replica
         * counts it as applied here and our successors and the worker's ack wait on it: the
         * server leaves, and poisoned stops every later item (no ack, no further forward). Its
         * own FWD may have gone already (forward before apply, replica.h): we leave as a server
         * stopped between that FWD and the write does. */
        s->poisoned = 1;
        s->disk_full = rc == CPS_ENOSPC;
        return;
    }
    s->stats.updates_applied++;
    if (w->upd.step > s->stats.step)
        s->stats.step = w->upd.step;
    if (s->cuts && s->after_apply)
        s->after_apply(s, w->range);
}

static void do_send(cps__server *s, const cps__replica_out *o)
{
    if (!o->msg) {
        /* A held CHAIN_ACK, or a joiner's SNAP_REQ or CAUGHT_UP: cps__msg_send fills in the
         * header. */
        cps__msg_hdr h = o->hdr;
        int rc = cps__msg_send(s->tp, o->to, &h, NULL, 0);
        if (rc != 0)
            cps__log(h.type == CPS_MSG_CHAIN_ACK ? CPS_LOG_DEBUG : CPS_LOG_WARN, "server",
                     "message type %u for range %u to node %u not sent: %s", h.type, o->range,
                     o->to, cps_strerror(rc));
        return;
    }
    if (o->hdr.type == CPS_MSG_FWD) {
        s->ctr.forwards++;
        s->ctr.forward_retries += o->resend != 0;
    }
    int rc = cps__tp_send(s->tp, o->to, o->msg, o->len);
    if (rc != 0) {
        cps__tp_unreserve(s->tp, o->msg);
        cps__log(CPS_LOG_DEBUG, "server", "chain message to node %u not sent: %s", o->to,
                 cps_strerror(rc));
    }
}

typedef struct clear_io {
    uint32_t range;
    uint64_t lo, hi;
} clear_io;

static int clear_txn(cps__txn *txn, void *arg)
{
    clear_io *c = arg;
    char prefix[32];
    snprintf(prefix, sizeof prefix, "agg/%" PRIu32 "/", c->range);
    return cps__store_range_clear(txn, c->range, c->lo, c->hi, prefix);
}

int cps__server_clear_range(cps__server *s, uint32_t r)
{
    clear_io c = {r, s->view.ranges[r].lo, s->view.ranges[r].hi};
    return cps__store_write(s->store, clear_txn, &c);
}

/* DROP_RANGE: the view took range r from us while we stay in the job (moved), or we were just
 * let in and it does not name us (what we hold of it is stale). */
static void drop_range(cps__server *s, uint32_t r, int moved)
{
    int rc = cps__server_clear_range(s, r);
    if (rc != 0)
        cps__log(CPS_LOG_WARN, "server", "range %u: not in its chain, but cannot drop our copy: %s",
                 r, cps_strerror(rc));
    else if (moved)
        cps__log(CPS_LOG_INFO, "server",
                 "range %u moved to other servers: left its chain and dropped our copy", r);
    else
        cps__log(CPS_LOG_DEBUG, "server", "range %u: not in its chain: dropped what we held of it",
                 r);
}

/* The replica's counters, carried into the server's (they outlive a replica: a rejoin makes a
 * new one). */
static void add_counts(cps__server *s)
{
    const cps__replica_counters *c = cps__replica_counts(s->replica);
    cps__replica_counters *seen = &s->counted;
    s->ctr.pushes += c->pushes - seen->pushes;
    s->ctr.pulls += c->pulls - seen->pulls;
    s->ctr.late_gradients += c->late_gradients - seen->late_gradients;
    s->stats.msgs_bad += c->msgs_bad - seen->msgs_bad;
    s->stats.push_raw_bytes += c->push_raw_bytes - seen->push_raw_bytes;
    s->stats.push_wire_bytes += c->push_wire_bytes - seen->push_wire_bytes;
    *seen = *c;
}

/* Perform one ready list. A JOIN_CLEAR or JOIN_INSTALL ends it: 1 then, with the store's
 * outcome in *rc and *value for the replica. */
static int perform_list(cps__server *s, uint32_t *range, int *rc, uint64_t *value)
{
    const cps__replica_out *out;
    size_t n = cps__replica_ready(s->replica, &out);
    int answer = 0;
    for (size_t i = 0; i < n; i++) {
        const cps__replica_out *o = &out[i];
        if (s->poisoned) {
            if (o->kind == CPS_RO_SEND)
                cps__tp_unreserve(s->tp, o->msg); /* reserved for it, never sent */
            continue;
        }
        switch (o->kind) {
        case CPS_RO_WRITE:
            do_apply(s, o);
            break;
        case CPS_RO_SEND:
            do_send(s, o);
            break;
        case CPS_RO_REPLY:
            do_reply(s, o);
            break;
        case CPS_RO_ASK_VIEW:
            cps__server_ask_view(s);
            break;
        case CPS_RO_DROP_RANGE:
            drop_range(s, o->range, o->moved);
            break;
        case CPS_RO_LOG:
            cps__log(o->level, "server", "%s", o->text);
            break;
        case CPS_RO_SNAPSHOT:
            cps__server_start_snapshot(s, o);
            break;
        case CPS_RO_JOIN_CLEAR:
            *rc = cps__server_clear_range(s, o->range);
            *range = o->range;
            answer = 1;
            break;
        case CPS_RO_JOIN_INSTALL:
            *rc = cps__server_join_install(s, o, value);
            *range = o->range;
            answer = 1;
            break;
        }
    }
    add_counts(s);
    return answer;
}

void cps__server_perform(cps__server *s)
{
    uint32_t range = 0;
    int rc = 0;
    uint64_t value = 0;
    while (perform_list(s, &range, &rc, &value)) {
        /* A full disk does not clear itself: joining again would fail again, unseen. */
        if (rc == CPS_ENOSPC)
            s->disk_full = 1;
        cps__replica_join_result(s->replica, range, rc, value, cps__now_ms());
        rc = 0;
        value = 0;
    }
}

void cps__server_check_joins(cps__server *s, uint64_t now)
{
    cps__replica_join_tick(s->replica, now);
    cps__server_perform(s);
}

/* ---- entry points ---- */

/* A lossy push (CPS_WF_LOSSY) becomes an ordinary one here, before anything else looks at it:
 * its codec block is decoded into float32 values in a plain kv payload that replaces rx's, so
 * admission, sync aggregation, the chain (FWD carries the update's body), the store and
 * checkpoints only see floats, and a retry, decoded again from the same bytes, is the same push.
 * A malformed block is refused with the decoder's error. raw_len then counts the float bytes,
 * so the servers' traffic figures show what the codec saved. */
static int unpack_lossy(cps__server *s, cps__rx *rx)
{
    cps__kv kv;
    const void *blk;
    size_t blen;
    int rc = cps__wire_kv_decode_lossy(rx->payload, rx->len, &kv, &blk, &blen);
    const char *what = rc ? "keys" : "codec block";
    size_t pre = rc ? 0 : cps__wire_kv_size(kv.nkeys, 0);
    size_t n = rc ? 0 : cps__wire_kv_size(kv.nkeys, kv.nvals);
    /* The decoded push must fit in a message: it is forwarded down the chain as it is. */
    if (rc == 0 && n > CPS_WIRE_MAX_PAYLOAD)
        rc = CPS_ESIZE;
    unsigned char *plain = NULL;
    if (rc == 0 && !(plain = aligned_alloc(16, (n + 15) & ~(size_t)15)))
        rc = CPS_ENOMEM;
    if (rc == 0) {
        cps__wire_kv_encode(plain, pre, kv.nkeys, kv.keys, kv.lens, NULL, 0);
        cps__le32_put(plain + 4, (uint32_t)kv.nvals);
        rc = cps__gradcodec_decode(blk, blen, kv.nvals, (float *)(void *)(plain + pre));
    }
    if (rc != 0) {
        free(plain);
        s->stats.msgs_bad++;
        cps__server_reply_error(s, &rx->hdr, rc,
                                "malformed lossy-compressed push (%s of a %zu-byte payload)", what,
                                rx->len);
        return rc;
    }
    cps__rx_free(rx);
    rx->owned = plain;
    rx->payload = plain;
    rx->len = n;
    rx->hdr.flags &= (uint16_t)~CPS_WF_LOSSY;
    rx->hdr.raw_len = (uint32_t)n;
    return 0;
}

/* A heap copy of rx: the owner the replica gives back through env_release. */
static int to_msg(cps__server *s, cps__rx *rx, cps__replica_msg *m)
{
    cps__rx *own = malloc(sizeof *own);
    if (!own) {
        cps__server_reply_error(s, &rx->hdr, CPS_ENOMEM, "no memory");
        cps__rx_free(rx);
        return CPS_ENOMEM;
    }
    *own = *rx;
    *m = (cps__replica_msg){own->hdr, own->payload, own->len, own};
    return 0;
}

/* A request as the replica takes it: a lossy push decoded first (whenever it is stepped), then
 * a heap copy of rx. Returns 0, or an error with rx answered and freed. */
static int prepare(cps__server *s, cps__rx *rx, cps__replica_msg *m)
{
    if ((rx->hdr.flags & CPS_WF_LOSSY) && unpack_lossy(s, rx) != 0) {
        cps__rx_free(rx);
        return CPS_EPROTO;
    }
    return to_msg(s, rx, m);
}

void cps__server_take(cps__server *s, cps__rx *rx)
{
    cps__replica_msg m;
    if (prepare(s, rx, &m) != 0)
        return;
    cps__replica_step(s->replica, &m, cps__now_ms());
    cps__server_perform(s);
}

int cps__server_admit(cps__server *s, const cps__msg_hdr *h, uint64_t now)
{
    int verdict = cps__replica_admit(s->replica, h, s->boot_id, now);
    cps__server_perform(s);
    return verdict == CPS_FENCE_SERVE;
}

void cps__server_turned(cps__server *s, uint64_t now)
{
    cps__replica_turned(s->replica, now);
    cps__server_perform(s);
}

void cps__server_view_changed(cps__server *s, cps__view *v)
{
    int rc = cps__replica_view(s->replica, v, s->id, cps__now_ms());
    if (rc == CPS_RV_INSTALLED) {
        cps__view_fini(&s->view);
        s->view = *v; /* ours now */
        cps__view_init(v);
    }
    if (rc < 0) {
        /* The shell installed the view and the replica did not: serving under two views would
         * answer from the wrong chain. Leave, as on a failed rejoin. */
        cps__log(CPS_LOG_ERROR, "server", "view change failed: %s; leaving", cps_strerror(rc));
        s->poisoned = 1;
    }
    cps__server_perform(s);
}

void cps__server_run_held(cps__server *s)
{
    while (cps__replica_next(s->replica, cps__now_ms()))
        cps__server_perform(s);
}

void cps__server_tick(cps__server *s, uint64_t now, int force_acks)
{
    cps__replica_tick(s->replica, now, force_acks);
    cps__server_perform(s);
}

int cps__server_ack_wait_ms(const cps__server *s, uint64_t now, int max_ms)
{
    return cps__replica_wait_ms(s->replica, now, max_ms);
}

void cps__server_data_fini(cps__server *s)
{
    cps__replica_destroy(s->replica);
    s->replica = NULL;
    memset(&s->counted, 0, sizeof s->counted);
}
