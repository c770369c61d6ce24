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
 * scheduler then publishes a view with the joiner as the range's new tail.
 *
 * SNAP payload: a sequence of 8-byte-aligned entries, little-endian:
 *   1 param:  u32 1, u32 len, u64 key, u64 opt_step, u32 slots, u32 0, spec[64],
 *             f32 values[len], f32 state[slots*len], zero padding to 8
 *   2 dedup:  u32 2, u32 worker, u64 seq   (worker | CPS_DEDUP_CLOCK_BIT: its SSP clock)
 *   3 named:  u32 3, u32 name_len, u32 value_len, u32 0, name, pad to 8, value, pad to 8
 *   4 range:  u32 4, u32 0, u64 seq, u64 step            (last chunk only)
 * and, in checkpoint restores only (PUT), whole records sent in slices:
 *   5 create: u32 5, u32 len, u64 key, u64 opt_step, u64 0, spec[64]   (zero values and state)
 *   6 slice:  u32 6, u32 slot, u64 key, u64 first, u64 n, f32 values[n], zero padding to 8
 *             (slot 0: parameters, 1..k: optimizer state slot k-1) */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "core/log.h"
#include "optim/optim.h"
#include "server.h"

#define SNAP_CHUNK      (4u << 20)
#define SNAP_FLUSH_MS   30000
#define JOIN_TIMEOUT_MS 120000
/* A SNAP_REQ not answered by a SNAP within this is sent again. */
#define SNAP_REQ_RETRY_MS 1000

enum { ENT_PARAM = 1, ENT_DEDUP = 2, ENT_NAMED = 3, ENT_RANGE = 4, ENT_CREATE = 5, ENT_SLICE = 6 };

static size_t pad8(size_t n)
{
    return (n + 7) & ~(size_t)7;
}

/* ---- source side (the range's tail) ---- */

typedef struct snap_job {
    struct snap_job *next;
    cps_store *store;
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
    cps_tp *tp;
    unsigned char *buf;
    size_t used;
    uint64_t seq, step, bytes, records;
} snap_job;

static int job_flush(snap_job *j, int last)
{
    cps_msg_hdr h = {0};
    h.type = CPS_MSG_SNAP;
    h.sender = j->self;
    h.epoch = j->epoch;
    h.range = j->range;
    h.req_seq = j->seq;
    h.step = j->join_id; /* the range's step travels in the range entry */
    h.aux = (uint64_t)last;
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
    if (j->used + need > SNAP_CHUNK && j->used > 0) {
        int rc = job_flush(j, 0);
        if (rc != 0)
            return rc;
    }
    if (need > SNAP_CHUNK) {
        unsigned char *grown = realloc(j->buf, need);
        if (!grown)
            return CPS_ENOMEM;
        j->buf = grown;
    }
    return 0;
}

static int put_param(void *arg, uint64_t key, const cps_param_rec *rec)
{
    snap_job *j = arg;
    size_t slots = cps__optim_state_slots(rec->spec.opt_kind);
    size_t data = (1 + slots) * (size_t)rec->len * sizeof(float);
    size_t need = 32 + CPS_WIRE_SPEC_SIZE + pad8(data);
    int rc = job_room(j, need);
    if (rc != 0)
        return rc;
    unsigned char *p = j->buf + j->used;
    memset(p, 0, need);
    cps__le32_put(p, ENT_PARAM);
    cps__le32_put(p + 4, rec->len);
    cps__le64_put(p + 8, key);
    cps__le64_put(p + 16, rec->opt_step);
    cps__le32_put(p + 24, (uint32_t)slots);
    cps__wire_spec_encode(p + 32, &rec->spec);
    memcpy(p + 32 + CPS_WIRE_SPEC_SIZE, rec->vals, (size_t)rec->len * sizeof(float));
    if (slots)
        memcpy(p + 32 + CPS_WIRE_SPEC_SIZE + (size_t)rec->len * sizeof(float), rec->state,
               slots * rec->len * sizeof(float));
    j->used += need;
    j->records++;
    return 0;
}

static int put_dedup(void *arg, uint32_t worker, uint64_t seq)
{
    snap_job *j = arg;
    int rc = job_room(j, 16);
    if (rc != 0)
        return rc;
    unsigned char *p = j->buf + j->used;
    cps__le32_put(p, ENT_DEDUP);
    cps__le32_put(p + 4, worker);
    cps__le64_put(p + 8, seq);
    j->used += 16;
    return 0;
}

static int put_named(void *arg, const char *name, const void *val, size_t len)
{
    snap_job *j = arg;
    size_t nlen = strlen(name);
    size_t need = 16 + pad8(nlen) + pad8(len);
    int rc = job_room(j, need);
    if (rc != 0)
        return rc;
    unsigned char *p = j->buf + j->used;
    memset(p, 0, need);
    cps__le32_put(p, ENT_NAMED);
    cps__le32_put(p + 4, (uint32_t)nlen);
    cps__le32_put(p + 8, (uint32_t)len);
    memcpy(p + 16, name, nlen);
    memcpy(p + 16 + pad8(nlen), val, len);
    j->used += need;
    return 0;
}

static int snap_txn(cps_txn *txn, void *arg)
{
    snap_job *j = arg;
    cps_range_meta m;
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
    if (rc == 0 && (rc = job_room(j, 24)) == 0) {
        unsigned char *p = j->buf + j->used;
        cps__le32_put(p, ENT_RANGE);
        cps__le32_put(p + 4, 0);
        cps__le64_put(p + 8, m.seq);
        cps__le64_put(p + 16, m.step);
        j->used += 24;
    }
    return rc;
}

static void *snap_main(void *arg)
{
    snap_job *j = arg;
    uint64_t t0 = cps__now_ms();
    j->buf = malloc(SNAP_CHUNK);
    int rc = j->buf ? cps__tp_create(j->keyed ? j->key : NULL, &j->tp) : CPS_ENOMEM;
    if (rc == 0)
        rc = cps__tp_peer_set(j->tp, j->joiner, j->joiner_addr);
    if (rc == 0)
        rc = cps__store_read(j->store, snap_txn, j);
    if (rc == 0)
        rc = job_flush(j, 1);
    uint64_t ms = cps__now_ms() - t0;
    if (rc == 0)
        cps_log(CPS_LOG_INFO, "server",
                "range %u: snapshot at seq %llu sent to node %u: %llu "
                "records, %.1f MB in %llu ms (%.0f MB/s)",
                j->range, (unsigned long long)j->seq, j->joiner, (unsigned long long)j->records,
                j->bytes / 1e6, (unsigned long long)ms, ms ? j->bytes / 1e3 / (double)ms : 0.0);
    else
        cps_log(CPS_LOG_ERROR, "server", "range %u: snapshot for node %u failed: %s", j->range,
                j->joiner, cps_strerror(rc));
    /* The socket stays open: nanomsg drops what has not left yet when a socket closes, and the
     * last chunk may still be in its buffers. The reaper closes it once the joiner is in the
     * chain (so it had everything) or after a while. */
    free(j->buf);
    j->buf = NULL;
    j->rc = rc;
    j->done_ms = cps__now_ms();
    __atomic_store_n(&j->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

void cps__server_on_snap_req(server *s, cps_rx *rx)
{
    uint32_t r = rx->hdr.range;
    const cps_node_info *joiner = cps__view_node(&s->view, rx->hdr.sender);
    if (rx->hdr.epoch > s->view.epoch) {
        /* The joiner knows a newer view: we may no longer be the tail. It asks again. */
        cps__server_ask_view(s);
        cps__rx_free(rx);
        return;
    }
    for (snap_job *q = s->snaps; q; q = q->next)
        if (q->range == r && q->joiner == rx->hdr.sender && q->join_id == rx->hdr.step) {
            cps__rx_free(rx); /* a repeated request for a snapshot already under way */
            return;
        }
    if (r >= s->view.nranges || !joiner || joiner->role != CPS_ROLE_SERVER ||
        !cps_chain_is_tail(s->chain, r)) {
        cps_log(CPS_LOG_WARN, "server",
                "snapshot request for range %u from node %u refused "
                "(not the tail, or not a server)",
                r, rx->hdr.sender);
        cps__rx_free(rx);
        return;
    }
    snap_job *j = calloc(1, sizeof *j);
    if (!j) {
        cps__rx_free(rx);
        return;
    }
    j->store = s->store;
    j->self = s->id;
    j->joiner = joiner->id;
    j->range = r;
    j->join_id = rx->hdr.step;
    j->epoch = s->view.epoch;
    j->lo = s->view.ranges[r].lo;
    j->hi = s->view.ranges[r].hi;
    snprintf(j->joiner_addr, sizeof j->joiner_addr, "%s", joiner->addr);
    j->keyed = s->cfg.secret_loaded;
    memcpy(j->key, s->cfg.secret_key, sizeof j->key);
    /* From here on the joiner also receives every update this tail applies; the snapshot,
     * taken a moment later, is at that sequence number or beyond: the joiner skips what the
     * snapshot already holds. */
    int rc = cps_chain_add_shadow(s->chain, r, joiner->id, j->join_id, cps__now_ms());
    if (rc == CPS_ESTALE_EPOCH) {
        /* A late request of a join the scheduler has replaced since (e.g. sent by the node in
         * an earlier life): serving it would displace the current joiner. */
        cps_log(CPS_LOG_WARN, "server",
                "range %u: snapshot request of node %u for join %llu refused: a later join "
                "of the range is under way",
                r, j->joiner, (unsigned long long)j->join_id);
        free(j);
    } else if (rc == 0 && pthread_create(&j->thread, NULL, snap_main, j) == 0) {
        j->started = 1;
        j->next = s->snaps;
        s->snaps = j;
        cps_log(CPS_LOG_INFO, "server", "range %u: sending a snapshot to node %u", r, j->joiner);
    } else {
        cps_log(CPS_LOG_ERROR, "server", "range %u: cannot start a snapshot for node %u: %s", r,
                j->joiner, cps_strerror(rc ? rc : CPS_ENOMEM));
        free(j);
    }
    cps__rx_free(rx);
}

#define SNAP_SOCKET_LINGER_MS 30000

/* 1 once the joiner of job j is a member of the range's chain: it had the whole snapshot. */
static int joiner_in_chain(const server *s, const snap_job *j)
{
    if (j->range >= s->view.nranges)
        return 0;
    const cps_range *rg = &s->view.ranges[j->range];
    for (uint32_t k = 0; k < rg->chain_len; k++)
        if (rg->chain[k] == j->joiner)
            return 1;
    const cps_node_info *n = cps__view_node(&s->view, j->joiner);
    return !n || !n->alive; /* gone: nothing to wait for */
}

void cps__server_reap_snapshots(server *s, int wait)
{
    snap_job **pp = &s->snaps;
    uint64_t now = cps__now_ms();
    while (*pp) {
        snap_job *j = *pp;
        int done = __atomic_load_n(&j->done, __ATOMIC_ACQUIRE);
        if (wait || (done && (j->rc != 0 || joiner_in_chain(s, j) ||
                              now - j->done_ms > SNAP_SOCKET_LINGER_MS))) {
            pthread_join(j->thread, NULL);
            cps__tp_destroy(j->tp);
            *pp = j->next;
            free(j);
        } else {
            pp = &j->next;
        }
    }
}

/* ---- joiner side ---- */

typedef struct install_io {
    server *s;
    uint32_t range;
    const unsigned char *p;
    size_t len;
    int last;
    uint64_t seq, step;
    int have_range;
    uint64_t records;
} install_io;

static int install(cps_txn *txn, install_io *io);

int cps__server_install_entries(cps_txn *txn, server *s, uint32_t range, const void *buf,
                                size_t len, int last)
{
    install_io io = {s, range, buf, len, last, 0, 0, 0, 0};
    return install(txn, &io);
}

static int install_txn(cps_txn *txn, void *arg)
{
    return install(txn, arg);
}

static int install(cps_txn *txn, install_io *io)
{
    const unsigned char *p = io->p, *end = io->p + io->len;
    io->have_range = 0;
    io->records = 0;
    while (p < end) {
        if (end - p < 16)
            return CPS_EPROTO;
        uint32_t tag = cps__le32_get(p);
        int rc = 0;
        if (tag == ENT_PARAM) {
            if (end - p < 32 + CPS_WIRE_SPEC_SIZE)
                return CPS_EPROTO;
            cps_param_rec rec;
            memset(&rec, 0, sizeof rec);
            rec.len = cps__le32_get(p + 4);
            uint64_t key = cps__le64_get(p + 8);
            rec.opt_step = cps__le64_get(p + 16);
            uint32_t slots = cps__le32_get(p + 24);
            if (cps__wire_spec_decode(p + 32, &rec.spec) != 0 || rec.len == 0 ||
                slots != cps__optim_state_slots(rec.spec.opt_kind) ||
                key < io->s->view.ranges[io->range].lo || key > io->s->view.ranges[io->range].hi)
                return CPS_EPROTO;
            size_t data = (1 + (size_t)slots) * rec.len * sizeof(float);
            if ((size_t)(end - p) < 32 + CPS_WIRE_SPEC_SIZE + pad8(data))
                return CPS_EPROTO;
            rec.vals = (const float *)(const void *)(p + 32 + CPS_WIRE_SPEC_SIZE);
            rec.state = slots ? rec.vals + rec.len : NULL;
            rc = cps__store_param_put(txn, key, &rec);
            p += 32 + CPS_WIRE_SPEC_SIZE + pad8(data);
            io->records++;
        } else if (tag == ENT_DEDUP) {
            rc = cps__store_dedup_put(txn, io->range, cps__le32_get(p + 4), cps__le64_get(p + 8));
            p += 16;
        } else if (tag == ENT_NAMED) {
            size_t nlen = cps__le32_get(p + 4), vlen = cps__le32_get(p + 8);
            char name[64];
            char prefix[32];
            snprintf(prefix, sizeof prefix, "agg/%" PRIu32 "/", io->range);
            if (nlen == 0 || nlen >= sizeof name || vlen > 4096 ||
                (size_t)(end - p) < 16 + pad8(nlen) + pad8(vlen))
                return CPS_EPROTO;
            memcpy(name, p + 16, nlen);
            name[nlen] = 0;
            if (strncmp(name, prefix, strlen(prefix)) != 0)
                return CPS_EPROTO; /* only this range's aggregation records travel */
            rc = cps__store_meta_put(txn, name, p + 16 + pad8(nlen), vlen);
            p += 16 + pad8(nlen) + pad8(vlen);
        } else if (tag == ENT_CREATE) {
            cps_param_spec spec;
            uint32_t len = cps__le32_get(p + 4);
            uint64_t key = cps__le64_get(p + 8);
            if (end - p < 32 + CPS_WIRE_SPEC_SIZE || len == 0 || cps__le64_get(p + 24) != 0 ||
                cps__wire_spec_decode(p + 32, &spec) != 0 ||
                key < io->s->view.ranges[io->range].lo || key > io->s->view.ranges[io->range].hi)
                return CPS_EPROTO;
            rc = cps__store_param_reset(txn, key, len, cps__le64_get(p + 16), &spec);
            p += 32 + CPS_WIRE_SPEC_SIZE;
            io->records++;
        } else if (tag == ENT_SLICE) {
            if (end - p < 32)
                return CPS_EPROTO;
            uint64_t key = cps__le64_get(p + 8), n = cps__le64_get(p + 24);
            if (n > (uint64_t)(end - p - 32) / sizeof(float) ||
                (size_t)(end - p) < 32 + pad8(n * sizeof(float)))
                return CPS_EPROTO;
            rc = cps__store_param_write(txn, key, cps__le32_get(p + 4), cps__le64_get(p + 16),
                                        (const float *)(const void *)(p + 32), n);
            if (rc == CPS_ENOTFOUND || rc == CPS_ESIZE)
                rc = CPS_EPROTO; /* a slice of a record the message did not create */
            p += 32 + pad8(n * sizeof(float));
        } else if (tag == ENT_RANGE) {
            if (end - p < 24 || !io->last)
                return CPS_EPROTO;
            cps_range_meta m = {cps__le64_get(p + 8), cps__le64_get(p + 16)};
            rc = cps__store_range_put(txn, io->range, &m);
            io->seq = m.seq;
            io->step = m.step;
            io->have_range = 1;
            p += 24;
        } else {
            return CPS_EPROTO;
        }
        if (rc != 0)
            return rc;
    }
    return (io->last && !io->have_range) ? CPS_EPROTO : 0;
}

/* ---- checking a restore's records before they are replicated ---- */

typedef struct put_check {
    server *s;
    uint32_t range;
    const unsigned char *p;
    size_t len;
    /* records created by this message: key, len, state slots */
    uint64_t *keys;
    uint32_t *lens, *slots;
    size_t n;
    char what[160];
} put_check;

static int check_fail(put_check *c, const char *fmt, uint64_t key)
{
    snprintf(c->what, sizeof c->what, fmt, (unsigned long long)key);
    return CPS_EPROTO;
}

static int put_check_txn(cps_txn *txn, void *arg)
{
    put_check *c = arg;
    const unsigned char *p = c->p, *end = c->p + c->len;
    const cps_range *rg = &c->s->view.ranges[c->range];
    while (p < end) {
        if (end - p < 16)
            return check_fail(c, "truncated entry%.0llu", 0);
        uint32_t tag = cps__le32_get(p);
        if (tag == ENT_CREATE) {
            cps_param_spec spec;
            uint64_t key = cps__le64_get(p + 8);
            uint32_t len = cps__le32_get(p + 4);
            if (end - p < 32 + CPS_WIRE_SPEC_SIZE || len == 0 || cps__le64_get(p + 24) != 0 ||
                cps__wire_spec_decode(p + 32, &spec) != 0)
                return check_fail(c, "malformed record for key %016llx", key);
            if (key < rg->lo || key > rg->hi)
                return check_fail(c, "key %016llx is outside the range", key);
            c->keys[c->n] = key;
            c->lens[c->n] = len;
            c->slots[c->n++] = (uint32_t)cps__optim_state_slots(spec.opt_kind);
            p += 32 + CPS_WIRE_SPEC_SIZE;
        } else if (tag == ENT_SLICE) {
            if (end - p < 32)
                return check_fail(c, "truncated slice%.0llu", 0);
            uint64_t key = cps__le64_get(p + 8), first = cps__le64_get(p + 16);
            uint64_t n = cps__le64_get(p + 24);
            uint32_t slot = cps__le32_get(p + 4);
            if (n > (uint64_t)(end - p - 32) / sizeof(float) ||
                (size_t)(end - p) < 32 + pad8(n * sizeof(float)))
                return check_fail(c, "slice of key %016llx longer than the message", key);
            uint32_t len = 0, slots = 0;
            int found = 0;
            for (size_t i = c->n; i-- > 0 && !found;)
                if (c->keys[i] == key)
                    found = 1, len = c->lens[i], slots = c->slots[i];
            if (!found) {
                cps_param_rec rec;
                if (cps__store_param_get(txn, key, &rec) != 0)
                    return check_fail(c, "slice of key %016llx, which does not exist", key);
                len = rec.len;
                slots = (uint32_t)cps__optim_state_slots(rec.spec.opt_kind);
            }
            if (slot > slots || first > len || n > len - first)
                return check_fail(c, "slice out of bounds of key %016llx", key);
            p += 32 + pad8(n * sizeof(float));
        } else if (tag == ENT_NAMED) {
            size_t nlen = cps__le32_get(p + 4), vlen = cps__le32_get(p + 8);
            char prefix[32];
            int pl = snprintf(prefix, sizeof prefix, "agg/%" PRIu32 "/", c->range);
            if (nlen == 0 || nlen >= 64 || vlen > 4096 ||
                (size_t)(end - p) < 16 + pad8(nlen) + pad8(vlen) ||
                memcmp(p + 16, prefix, (size_t)pl < nlen ? (size_t)pl : nlen) != 0 ||
                nlen <= (size_t)pl)
                return check_fail(c, "bad named value%.0llu", 0);
            p += 16 + pad8(nlen) + pad8(vlen);
        } else {
            return check_fail(c, "entry type %llu does not belong in a restore", tag);
        }
    }
    return 0;
}

int cps__server_check_put(server *s, uint32_t range, const void *buf, size_t len, char *why,
                          size_t cap)
{
    size_t most = len / (32 + CPS_WIRE_SPEC_SIZE) + 1;
    put_check c = {s, range, buf, len, calloc(most, 8), calloc(most, 4), calloc(most, 4), 0, ""};
    int rc =
        c.keys && c.lens && c.slots ? cps__store_read(s->store, put_check_txn, &c) : CPS_ENOMEM;
    snprintf(why, cap, "%s", c.what[0] ? c.what : cps_strerror(rc));
    free(c.keys);
    free(c.lens);
    free(c.slots);
    return rc;
}

typedef struct clear_io {
    uint32_t range;
    uint64_t lo, hi;
} clear_io;

static int clear_txn(cps_txn *txn, void *arg)
{
    clear_io *c = arg;
    char prefix[32];
    snprintf(prefix, sizeof prefix, "agg/%" PRIu32 "/", c->range);
    return cps__store_range_clear(txn, c->range, c->lo, c->hi, prefix);
}

/* The join of range r is over (done or aborted): its timers go. */
static void join_timers_del(server *s, uint32_t r)
{
    cps__loop_timer_del(s->loop, CPS_SERVER_T_JOIN(r));
    cps__loop_timer_del(s->loop, CPS_SERVER_T_SNAP_REQ(r));
}

static void join_abort(server *s, uint32_t r, const char *why, int rc)
{
    join_timers_del(s, r);
    cps_log(CPS_LOG_ERROR, "server",
            "range %u: joining failed (%s: %s); the scheduler will "
            "try again",
            r, why, cps_strerror(rc));
    cps_chain_join_abort(s->chain, r);
    s->joins[r].active = 0;
    /* Tell the scheduler now (aux 2), rather than let it wait out its own deadline. */
    cps_msg_hdr h = {.type = CPS_MSG_CAUGHT_UP,
                     .sender = s->id,
                     .epoch = s->view.epoch,
                     .range = r,
                     .step = s->joins[r].id,
                     .aux = 2};
    cps__msg_send(s->tp, 0, &h, NULL, 0);
}

static int on_snap_req_due(cps_loop *l, uint64_t id, void *ctx, uint64_t now);

static void send_snap_req(server *s, uint32_t r)
{
    cps_msg_hdr h = {.type = CPS_MSG_SNAP_REQ,
                     .sender = s->id,
                     .epoch = s->view.epoch,
                     .range = r,
                     .step = s->joins[r].id};
    int rc = cps__msg_send(s->tp, s->joins[r].source, &h, NULL, 0);
    if (rc != 0)
        cps_log(CPS_LOG_WARN, "server", "range %u: asking node %u for a snapshot failed: %s", r,
                s->joins[r].source, cps_strerror(rc));
    /* Asked again if no SNAP comes: lost, or the tail had not seen our view yet. */
    rc = cps__loop_timer_add(s->loop, CPS_SERVER_T_SNAP_REQ(r), SNAP_REQ_RETRY_MS + 1, 0,
                             on_snap_req_due, s);
    if (rc != 0)
        cps_log(CPS_LOG_ERROR, "server", "range %u: cannot arm the snapshot re-request: %s", r,
                cps_strerror(rc));
}

/* The range a join timer is for, if that join is still under way. */
static int join_timer_range(server *s, uint64_t id, uint32_t *r)
{
    *r = (uint32_t)id;
    return s->joins && *r < s->view.nranges && s->joins[*r].active;
}

static int on_snap_req_due(cps_loop *l, uint64_t id, void *ctx, uint64_t now)
{
    (void)l, (void)now;
    server *s = ctx;
    uint32_t r;
    if (join_timer_range(s, id, &r) && !s->joins[r].got_snap)
        send_snap_req(s, r);
    return 0;
}

static int on_join_deadline(cps_loop *l, uint64_t id, void *ctx, uint64_t now)
{
    (void)l, (void)now;
    server *s = ctx;
    uint32_t r;
    if (join_timer_range(s, id, &r))
        join_abort(s, r, "no snapshot in time", CPS_ETIMEDOUT);
    return 0;
}

void cps__server_on_join_range(server *s, cps_rx *rx)
{
    uint32_t r = rx->hdr.range, source = (uint32_t)rx->hdr.aux;
    uint64_t id = rx->hdr.step;
    cps__rx_free(rx);
    if (r >= s->view.nranges || !s->joins || !cps__view_node(&s->view, source))
        return;
    if ((s->joins[r].active && s->joins[r].id == id) || s->joins[r].done_id == id)
        return; /* a repeated request: under way, or done (do not clear what we copied) */
    if (s->joins[r].active)
        cps_chain_join_abort(s->chain, r); /* a newer join of the range replaces it */
    clear_io c = {r, s->view.ranges[r].lo, s->view.ranges[r].hi};
    int rc = cps_chain_begin_join(s->chain, r, source);
    if (rc == 0)
        rc = cps__store_write(s->store, clear_txn, &c);
    if (rc != 0) {
        join_abort(s, r, "clearing the old copy", rc);
        if (rc == CPS_ENOSPC)
            s->disk_full = 1;
        return;
    }
    uint64_t done = s->joins[r].done_id;
    s->joins[r] = (join_state){1, source, 0, id, done, 0, 0};
    rc = cps__loop_timer_add(s->loop, CPS_SERVER_T_JOIN(r), JOIN_TIMEOUT_MS + 1, 0,
                             on_join_deadline, s);
    if (rc != 0) {
        join_abort(s, r, "arming its deadline", rc);
        return;
    }
    send_snap_req(s, r);
    cps_log(CPS_LOG_INFO, "server", "range %u: joining (join %llu); copying it from node %u", r,
            (unsigned long long)id, source);
}

void cps__server_on_snap(server *s, cps_rx *rx)
{
    uint32_t r = rx->hdr.range;
    if (r >= s->view.nranges || !s->joins || !s->joins[r].active ||
        s->joins[r].source != rx->hdr.sender || s->joins[r].id != rx->hdr.step) {
        cps__rx_free(rx); /* from an earlier join, or not for us */
        return;
    }
    if (!cps_chain_joining(s->chain, r)) {
        /* A view that came since made us a member of the range, or took it from us: a snapshot
         * written now would overwrite a store the chain already serves from. Messages from the
         * scheduler arrive in order, so this is a guard, not a path the protocol takes. */
        cps__rx_free(rx);
        join_abort(s, r, "the chain is no longer joining", CPS_ESTALE_EPOCH);
        return;
    }
    s->joins[r].got_snap = 1;
    cps__loop_timer_del(s->loop, CPS_SERVER_T_SNAP_REQ(r));
    install_io io = {s, r, rx->payload, rx->len, rx->hdr.aux == 1, 0, 0, 0, 0};
    int rc = cps__store_write(s->store, install_txn, &io);
    s->joins[r].bytes += rx->len;
    cps__rx_free(rx);
    if (rc != 0) {
        join_abort(s, r, "installing the snapshot", rc);
        /* A full disk does not clear itself: joining again would fail again, unseen. */
        if (rc == CPS_ENOSPC)
            s->disk_full = 1;
        return;
    }
    if (!io.last)
        return;
    /* The snapshot's SSP clocks, before the updates after it move them further. */
    rc = cps__server_ssp_load(s, r);
    if (rc != 0) {
        join_abort(s, r, "loading the SSP clocks", rc);
        return;
    }
    rc = cps_chain_join_ready(s->chain, r, io.seq, cps__now_ms());
    cps__server_run_actions(s);
    if (rc != 0) {
        join_abort(s, r, "replaying updates", rc);
        return;
    }
    uint64_t applied = cps_chain_applied(s->chain, r);
    cps_log(CPS_LOG_INFO, "server",
            "range %u: snapshot at seq %llu installed (%.1f MB), caught "
            "up to seq %llu",
            r, (unsigned long long)io.seq, s->joins[r].bytes / 1e6, (unsigned long long)applied);
    s->joins[r].active = 0;
    join_timers_del(s, r);
    s->joins[r].done_id = s->joins[r].id;
    s->joins[r].confirm_pending = 1;
    cps_msg_hdr h = {.type = CPS_MSG_CAUGHT_UP,
                     .sender = s->id,
                     .epoch = s->view.epoch,
                     .range = r,
                     .req_seq = applied,
                     .step = s->joins[r].id};
    cps__msg_send(s->tp, 0, &h, NULL, 0);
}

void cps__server_check_joins(server *s, uint64_t now)
{
    (void)now; /* the joins' deadlines are loop timers */
    for (uint32_t r = 0; s->joins && r < s->view.nranges; r++) {
        join_state *js = &s->joins[r];
        if (js->confirm_pending && cps_chain_can_serve_pull(s->chain, r)) {
            /* We hold everything the old tail acknowledged: from now on we are a full
             * replica, and the scheduler stops treating us as one that must leave with our
             * predecessor. */
            js->confirm_pending = 0;
            cps_msg_hdr h = {.type = CPS_MSG_CAUGHT_UP,
                             .sender = s->id,
                             .epoch = s->view.epoch,
                             .range = r,
                             .step = js->done_id,
                             .aux = 1};
            cps__msg_send(s->tp, 0, &h, NULL, 0);
        }
    }
}
