/* The server's data path: declare, push (async: apply on arrival; sync: aggregate one step of
 * every live worker in rank order, then apply once), pull (SSP: wait for the slowest worker).
 *
 * Every update of a range is one LMDB transaction holding the new values, the range's update
 * sequence number and the exactly-once records, so a crash keeps all of it or none. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "core/log.h"
#include "optim/optim.h"
#include "server.h"

/* ---- helpers ---- */

static int keys_in_range(const server *s, uint32_t range, const cps_kv *kv)
{
    const cps_range *r = &s->view.ranges[range];
    /* Keys are sorted (the decoder checked), so the ends suffice. */
    return kv->keys[0] >= r->lo && kv->keys[kv->nkeys - 1] <= r->hi;
}

static uint64_t keyset_sig(const cps_kv *kv)
{
    uint64_t h = cps__fnv1a(CPS_FNV_INIT, kv->keys, (size_t)kv->nkeys * 8);
    return cps__fnv1a(h, kv->lens, (size_t)kv->nkeys * 4);
}

static void agg_meta_name(char *buf, size_t len, uint32_t range, uint64_t sig)
{
    snprintf(buf, len, "agg/%" PRIu32 "/%016" PRIx64, range, sig);
}

static uint64_t *dedup_slot(server *s, uint32_t range, uint32_t worker)
{
    if (s->dedup_ranges != s->view.nranges) {
        free(s->dedup);
        s->dedup_ranges = s->view.nranges;
        size_t n = (size_t)s->dedup_ranges * 2 * CPS_MAX_NODES;
        s->dedup = malloc(n * sizeof *s->dedup);
        if (!s->dedup) {
            s->dedup_ranges = 0;
            return NULL;
        }
        memset(s->dedup, 0xff, n * sizeof *s->dedup);
    }
    /* Dense and sparse-row pushes of a worker have separate records (CPS_DEDUP_SPARSE_BIT). */
    uint32_t slot = worker & ~CPS_DEDUP_SPARSE_BIT;
    if (range >= s->dedup_ranges || slot >= CPS_MAX_NODES)
        return NULL;
    if (worker & CPS_DEDUP_SPARSE_BIT)
        slot += CPS_MAX_NODES;
    return &s->dedup[(size_t)range * 2 * CPS_MAX_NODES + slot];
}

typedef struct dedup_io {
    uint32_t range, worker;
    uint64_t seq;
} dedup_io;

static int dedup_load(cps_txn *txn, void *arg)
{
    dedup_io *d = arg;
    return cps__store_dedup_get(txn, d->range, d->worker, &d->seq);
}

/* Last applied per-range request seq of `worker` (cached; loaded from LMDB on first use). */
static int dedup_get(server *s, uint32_t range, uint32_t worker, uint64_t *out)
{
    uint64_t *slot = dedup_slot(s, range, worker);
    if (slot && *slot != UINT64_MAX) {
        *out = *slot;
        return 0;
    }
    dedup_io d = {range, worker, 0};
    int rc = cps__store_read(s->store, dedup_load, &d);
    if (rc != 0)
        return rc;
    if (slot)
        *slot = d.seq;
    *out = d.seq;
    return 0;
}

/* ---- replies ---- */

/* Reply to `req` with the current values of kv's keys. */
typedef struct read_io {
    const cps_kv *kv;
    float *out;
} read_io;

static int read_values(cps_txn *txn, void *arg)
{
    read_io *r = arg;
    float *p = r->out;
    for (uint32_t i = 0; i < r->kv->nkeys; i++) {
        int rc = cps__store_param_read(txn, r->kv->keys[i], p, r->kv->lens[i]);
        if (rc != 0)
            return rc;
        p += r->kv->lens[i];
    }
    return 0;
}

static void reply_values(server *s, const cps_msg_hdr *req, const cps_kv *kv)
{
    uint64_t nvals = 0;
    for (uint32_t i = 0; i < kv->nkeys; i++)
        nvals += kv->lens[i];
    size_t len = cps__wire_kv_size(kv->nkeys, nvals);
    cps_msg_hdr h = {0};
    h.type = CPS_MSG_VALUES;
    h.flags = CPS_WF_REPLY;
    h.sender = s->id;
    h.epoch = s->view.epoch;
    h.req_worker = req->req_worker;
    h.req_seq = req->req_seq;
    h.range = req->range;
    h.step = req->step;
    void *buf = cps__msg_alloc(&h, len);
    if (!buf) {
        cps__server_reply_error(s, req, CPS_ENOMEM, "no memory for a %zu-byte reply", len);
        return;
    }
    char *payload = (char *)buf + CPS_WIRE_HDR_SIZE;
    /* Encode keys and lens; values are read from LMDB straight into the message. */
    cps__wire_kv_encode(payload, len, kv->nkeys, kv->keys, kv->lens, NULL, 0);
    size_t voff = cps__wire_kv_size(kv->nkeys, 0);
    cps__le32_put(payload + 4, (uint32_t)nvals);
    read_io r = {kv, (float *)(void *)(payload + voff)};
    int rc = cps__store_read(s->store, read_values, &r);
    if (rc != 0) {
        cps__tp_free(buf);
        cps__server_reply_error(s, req, rc, "reading %u keys failed", kv->nkeys);
        return;
    }
    s->stats.pull_bytes += nvals * 4;
    rc = cps__tp_send(s->tp, req->sender, buf, CPS_WIRE_HDR_SIZE + len);
    if (rc != 0) {
        cps__tp_free(buf);
        cps_log(CPS_LOG_WARN, "server", "reply to node %u failed: %s", req->sender,
                cps_strerror(rc));
    }
}

static void reply_done(server *s, const cps_msg_hdr *req, const cps_kv *kv)
{
    if (req->type == CPS_MSG_PUSH_PULL)
        reply_values(s, req, kv);
    else
        cps__server_reply_ack(s, req);
}

/* ---- declare ---- */

typedef struct declare_io {
    const cps_kv *kv;
    const uint64_t *offsets;
    const cps_param_spec *spec;
    uint64_t bad_key;
} declare_io;

static int declare_txn(cps_txn *txn, void *arg)
{
    declare_io *d = arg;
    for (uint32_t i = 0; i < d->kv->nkeys; i++) {
        int rc = cps__store_param_create(txn, d->kv->keys[i], d->kv->lens[i], d->offsets[i],
                                         d->spec);
        if (rc != 0) {
            d->bad_key = d->kv->keys[i];
            return rc;
        }
    }
    return 0;
}

void cps__server_on_declare(server *s, cps_rx *rx)
{
    cps_kv kv;
    const uint64_t *offsets;
    cps_param_spec spec;
    int rc = cps__wire_declare_decode(rx->payload, rx->len, &kv, &offsets, &spec);
    if (rc != 0) {
        cps__server_reply_error(s, &rx->hdr, rc, "malformed DECLARE payload");
    } else if (!keys_in_range(s, rx->hdr.range, &kv)) {
        cps__server_reply_error(s, &rx->hdr, CPS_EINVAL, "keys outside range %u", rx->hdr.range);
    } else {
        declare_io d = {&kv, offsets, &spec, 0};
        rc = cps__store_write(s->store, declare_txn, &d);
        if (rc == CPS_EEXIST)
            cps__server_reply_error(s, &rx->hdr, rc,
                                    "key %016" PRIx64 " exists with another length or optimizer",
                                    d.bad_key);
        else if (rc != 0)
            cps__server_reply_error(s, &rx->hdr, rc, "declare of %u keys failed", kv.nkeys);
        else
            cps__server_reply_ack(s, &rx->hdr);
    }
    cps__rx_free(rx);
}

/* ---- apply ---- */

typedef struct apply_io {
    uint32_t range;
    const cps_kv *kv;
    const float *grad;
    uint64_t step;
    /* exactly-once records written in the same transaction */
    uint32_t nreq;
    const uint32_t *workers;
    const uint64_t *seqs;
    const char *agg_name; /* sync: name of the applied-step record, else NULL */
    uint64_t bad_key;
} apply_io;

static int apply_txn(cps_txn *txn, void *arg)
{
    apply_io *a = arg;
    const float *g = a->grad;
    for (uint32_t i = 0; i < a->kv->nkeys; i++) {
        int rc = cps__store_param_apply(txn, a->kv->keys[i], g, a->kv->lens[i]);
        if (rc != 0) {
            a->bad_key = a->kv->keys[i];
            return rc;
        }
        g += a->kv->lens[i];
    }
    cps_range_meta m;
    int rc = cps__store_range_get(txn, a->range, &m);
    if (rc != 0)
        return rc;
    m.seq++;
    if (a->step > m.step)
        m.step = a->step;
    rc = cps__store_range_put(txn, a->range, &m);
    for (uint32_t i = 0; rc == 0 && i < a->nreq; i++)
        rc = cps__store_dedup_put(txn, a->range, a->workers[i], a->seqs[i]);
    if (rc == 0 && a->agg_name) {
        unsigned char b[8];
        cps__le64_put(b, a->step);
        rc = cps__store_meta_put(txn, a->agg_name, b, sizeof b);
    }
    return rc;
}

/* Apply and report; returns 0 or the error already sent to nobody (the caller replies). */
static int apply_update(server *s, apply_io *a)
{
    int rc = cps__store_write(s->store, apply_txn, a);
    if (rc == 0) {
        s->stats.updates_applied++;
        for (uint32_t i = 0; i < a->nreq; i++) {
            uint64_t *slot = dedup_slot(s, a->range, a->workers[i]);
            if (slot)
                *slot = a->seqs[i];
        }
    }
    return rc;
}

static void report_apply_error(server *s, const cps_msg_hdr *req, int rc, const apply_io *a)
{
    if (rc == CPS_ENOTFOUND)
        cps__server_reply_error(s, req, rc, "key %016" PRIx64 " was never declared", a->bad_key);
    else if (rc == CPS_ESIZE)
        cps__server_reply_error(s, req, rc, "gradient length does not match key %016" PRIx64,
                                a->bad_key);
    else
        cps__server_reply_error(s, req, rc, "update of range %u failed", a->range);
}

/* ---- SSP clocks and parked pulls ---- */

static uint64_t *clock_slot(server *s, uint32_t range, uint32_t worker)
{
    if (!s->clock || s->clock_ranges != s->view.nranges) {
        /* The range map changed: clocks restart from the pushes seen from now on. */
        free(s->clock);
        s->clock_ranges = s->view.nranges;
        s->clock = calloc((size_t)s->view.nranges * CPS_MAX_NODES, sizeof *s->clock);
        if (!s->clock)
            return NULL;
    }
    if (range >= s->view.nranges || worker >= CPS_MAX_NODES)
        return NULL;
    return &s->clock[(size_t)range * CPS_MAX_NODES + worker];
}

static uint64_t min_live_clock(server *s, uint32_t range)
{
    uint64_t m = UINT64_MAX;
    for (uint32_t i = 0; i < s->view.nnodes; i++) {
        const cps_node_info *n = &s->view.nodes[i];
        if (n->role != CPS_ROLE_WORKER || !n->alive)
            continue;
        uint64_t *c = clock_slot(s, range, n->id);
        uint64_t v = c ? *c : 0;
        if (v < m)
            m = v;
    }
    return m;
}

static int pull_may_proceed(server *s, uint32_t range, uint64_t clock)
{
    if (s->view.mode != CPS_MODE_SSP)
        return 1;
    uint64_t m = min_live_clock(s, range);
    return m == UINT64_MAX || m + s->view.ssp_bound >= clock;
}

static void wake_parked(server *s)
{
    uint32_t kept = 0;
    for (uint32_t i = 0; i < s->nparked; i++) {
        parked_pull *p = &s->parked[i];
        if (pull_may_proceed(s, p->rx.hdr.range, p->clock)) {
            reply_values(s, &p->rx.hdr, &p->kv);
            cps__rx_free(&p->rx);
        } else {
            s->parked[kept++] = *p;
        }
    }
    s->nparked = kept;
}

/* ---- push ---- */

static void push_async(server *s, cps_rx *rx, const cps_kv *kv)
{
    const cps_msg_hdr *h = &rx->hdr;
    uint32_t worker = h->sender;
    uint64_t last;
    if (h->flags & CPS_WF_NOAGG) {
        worker |= CPS_DEDUP_SPARSE_BIT;
        if (!(h->req_seq & CPS_SEQ_SPARSE)) {
            cps__server_reply_error(s, h, CPS_EPROTO, "sparse push without a sparse sequence");
            return;
        }
    }
    int rc = dedup_get(s, h->range, worker, &last);
    if (rc != 0) {
        cps__server_reply_error(s, h, rc, "exactly-once record unreadable");
        return;
    }
    if (last == 0 && (h->flags & CPS_WF_NOAGG))
        last = CPS_SEQ_SPARSE;
    if (h->req_seq <= last) {
        /* A retry of an applied push: acknowledge again, never apply twice. */
        reply_done(s, h, kv);
        return;
    }
    if (h->req_seq != last + 1) {
        /* An earlier request of this worker was lost; it will re-send both in order. */
        cps_log(CPS_LOG_DEBUG, "server", "push %llu from node %u waits for %llu: dropped",
                (unsigned long long)h->req_seq, h->sender, (unsigned long long)last + 1);
        return;
    }
    apply_io a = {h->range, kv, kv->vals, h->step, 1, &worker, &h->req_seq, NULL, 0};
    rc = apply_update(s, &a);
    if (rc != 0) {
        report_apply_error(s, h, rc, &a);
        return;
    }
    uint64_t *c = clock_slot(s, h->range, h->sender);
    if (c && !(h->flags & CPS_WF_NOAGG) && h->step > *c)
        *c = h->step;
    reply_done(s, h, kv);
    if (s->nparked)
        wake_parked(s);
}

static agg_slot *find_slot(server *s, uint32_t range, uint64_t sig, uint64_t step, int create)
{
    agg_slot *free_slot = NULL;
    for (uint32_t i = 0; i < s->nslots; i++) {
        agg_slot *a = &s->slots[i];
        if (a->used && a->range == range && a->sig == sig && a->step == step)
            return a;
        if (!a->used && !free_slot)
            free_slot = a;
    }
    if (!create)
        return NULL;
    uint32_t W = s->view.num_workers;
    if (!free_slot) {
        agg_slot *grown = realloc(s->slots, (s->nslots + 8) * sizeof *grown);
        if (!grown)
            return NULL;
        memset(grown + s->nslots, 0, 8 * sizeof *grown);
        s->slots = grown;
        free_slot = &s->slots[s->nslots];
        s->nslots += 8;
    }
    free_slot->by_rank = calloc(W, sizeof *free_slot->by_rank);
    free_slot->kv_by_rank = calloc(W, sizeof *free_slot->kv_by_rank);
    if (!free_slot->by_rank || !free_slot->kv_by_rank) {
        free(free_slot->by_rank);
        free(free_slot->kv_by_rank);
        return NULL;
    }
    free_slot->used = 1;
    free_slot->range = range;
    free_slot->sig = sig;
    free_slot->step = step;
    free_slot->count = 0;
    return free_slot;
}

static void slot_release(server *s, agg_slot *a)
{
    for (uint32_t r = 0; r < s->view.num_workers; r++)
        if (a->by_rank[r].buf)
            cps__rx_free(&a->by_rank[r]);
    free(a->by_rank);
    free(a->kv_by_rank);
    memset(a, 0, sizeof *a);
}

/* Apply a slot if every live worker has contributed. Sums in rank order: the same bits on every
 * run and every replica. */
static void slot_try_complete(server *s, agg_slot *a)
{
    uint32_t W = s->view.num_workers;
    for (uint32_t i = 0; i < s->view.nnodes; i++) {
        const cps_node_info *n = &s->view.nodes[i];
        if (n->role == CPS_ROLE_WORKER && n->alive && n->rank < W && !a->by_rank[n->rank].buf)
            return;
    }
    if (a->count == 0)
        return;
    const cps_kv *kv0 = NULL;
    uint32_t nreq = 0;
    uint32_t workers[CPS_MAX_NODES];
    uint64_t seqs[CPS_MAX_NODES];
    for (uint32_t r = 0; r < W; r++) {
        if (!a->by_rank[r].buf)
            continue;
        const cps_kv *kv = &a->kv_by_rank[r];
        if (!kv0) {
            kv0 = kv;
            if (s->sum_cap < kv->nvals) {
                float *grown = realloc(s->sum, kv->nvals * sizeof *grown);
                if (!grown) {
                    cps_log(CPS_LOG_ERROR, "server", "no memory to aggregate %llu values",
                            (unsigned long long)kv->nvals);
                    return;
                }
                s->sum = grown;
                s->sum_cap = kv->nvals;
            }
            memcpy(s->sum, kv->vals, kv->nvals * sizeof(float));
        } else {
            cps__vec_add(s->sum, kv->vals, kv->nvals);
        }
        workers[nreq] = a->by_rank[r].hdr.sender;
        seqs[nreq] = a->by_rank[r].hdr.req_seq;
        nreq++;
    }
    char name[64];
    agg_meta_name(name, sizeof name, a->range, a->sig);
    apply_io io = {a->range, kv0, s->sum, a->step, nreq, workers, seqs, name, 0};
    int rc = apply_update(s, &io);
    for (uint32_t r = 0; r < W; r++) {
        if (!a->by_rank[r].buf)
            continue;
        if (rc == 0)
            reply_done(s, &a->by_rank[r].hdr, &a->kv_by_rank[r]);
        else
            report_apply_error(s, &a->by_rank[r].hdr, rc, &io);
    }
    cps_log(CPS_LOG_DEBUG, "server", "range %u step %llu: aggregate of %u workers applied",
            a->range, (unsigned long long)a->step, nreq);
    slot_release(s, a);
}

typedef struct agg_io {
    const char *name;
    uint64_t step;
    int found;
} agg_io;

static int agg_load(cps_txn *txn, void *arg)
{
    agg_io *g = arg;
    unsigned char b[8];
    size_t len = sizeof b;
    int rc = cps__store_meta_get(txn, g->name, b, &len);
    if (rc == CPS_ENOTFOUND)
        return 0;
    if (rc == 0 && len == 8) {
        g->step = cps__le64_get(b);
        g->found = 1;
    }
    return rc;
}

static void push_sync(server *s, cps_rx *rx, const cps_kv *kv)
{
    const cps_msg_hdr *h = &rx->hdr;
    uint32_t rank = cps__server_worker_rank(s, h->sender);
    if (rank >= s->view.num_workers) {
        cps__server_reply_error(s, h, CPS_EUNKNOWN_NODE, "worker rank %u out of range", rank);
        cps__rx_free(rx);
        return;
    }
    uint64_t sig = keyset_sig(kv);
    char name[64];
    agg_meta_name(name, sizeof name, h->range, sig);
    agg_io g = {name, 0, 0};
    int rc = cps__store_read(s->store, agg_load, &g);
    if (rc != 0) {
        cps__server_reply_error(s, h, rc, "aggregation record unreadable");
        cps__rx_free(rx);
        return;
    }
    if (g.found && h->step <= g.step) {
        /* This step's aggregate is applied already (our ack was lost): acknowledge again. */
        reply_done(s, h, kv);
        cps__rx_free(rx);
        return;
    }
    agg_slot *a = find_slot(s, h->range, sig, h->step, 1);
    if (!a) {
        cps__server_reply_error(s, h, CPS_ENOMEM, "no memory for an aggregation slot");
        cps__rx_free(rx);
        return;
    }
    if (a->by_rank[rank].buf) {
        /* A retry while the step is still being gathered: the reply comes when it completes. */
        cps__rx_free(rx);
        return;
    }
    if (a->count > 0) {
        /* All contributions share the key set (it is in the signature); lengths too. */
        for (uint32_t r = 0; r < s->view.num_workers; r++) {
            if (a->by_rank[r].buf && a->kv_by_rank[r].nvals != kv->nvals) {
                cps__server_reply_error(s, h, CPS_ESIZE, "gradient length differs between "
                                        "workers for step %llu", (unsigned long long)h->step);
                cps__rx_free(rx);
                return;
            }
        }
    }
    a->by_rank[rank] = *rx;
    a->kv_by_rank[rank] = *kv;
    a->count++;
    slot_try_complete(s, a);
}

void cps__server_on_push(server *s, cps_rx *rx)
{
    cps_kv kv;
    int rc = cps__wire_kv_decode(rx->payload, rx->len, 1, &kv);
    if (rc != 0) {
        cps__server_reply_error(s, &rx->hdr, rc, "malformed push payload");
        cps__rx_free(rx);
        return;
    }
    if (!keys_in_range(s, rx->hdr.range, &kv)) {
        cps__server_reply_error(s, &rx->hdr, CPS_EINVAL, "keys outside range %u", rx->hdr.range);
        cps__rx_free(rx);
        return;
    }
    s->stats.push_raw_bytes += rx->hdr.raw_len;
    s->stats.push_wire_bytes += rx->hdr.payload_len;
    if (s->view.mode == CPS_MODE_SYNC && !(rx->hdr.flags & CPS_WF_NOAGG)) {
        push_sync(s, rx, &kv); /* takes rx */
        return;
    }
    push_async(s, rx, &kv);
    cps__rx_free(rx);
}

void cps__server_on_pull(server *s, cps_rx *rx)
{
    cps_kv kv;
    int rc = cps__wire_kv_decode(rx->payload, rx->len, 0, &kv);
    if (rc != 0) {
        cps__server_reply_error(s, &rx->hdr, rc, "malformed pull payload");
    } else if (!keys_in_range(s, rx->hdr.range, &kv)) {
        cps__server_reply_error(s, &rx->hdr, CPS_EINVAL, "keys outside range %u", rx->hdr.range);
    } else if (!pull_may_proceed(s, rx->hdr.range, rx->hdr.aux)) {
        if (s->nparked == s->parked_cap) {
            uint32_t cap = s->parked_cap ? s->parked_cap * 2 : 16;
            parked_pull *grown = realloc(s->parked, cap * sizeof *grown);
            if (!grown) {
                cps__server_reply_error(s, &rx->hdr, CPS_ENOMEM, "no memory to park a pull");
                cps__rx_free(rx);
                return;
            }
            s->parked = grown;
            s->parked_cap = cap;
        }
        s->parked[s->nparked++] = (parked_pull){*rx, kv, rx->hdr.aux};
        return; /* kept */
    } else {
        reply_values(s, &rx->hdr, &kv);
    }
    cps__rx_free(rx);
}

void cps__server_view_changed(server *s)
{
    for (uint32_t i = 0; i < s->nslots; i++)
        if (s->slots[i].used)
            slot_try_complete(s, &s->slots[i]);
    if (s->nparked)
        wake_parked(s);
}

void cps__server_data_fini(server *s)
{
    for (uint32_t i = 0; i < s->nslots; i++)
        if (s->slots[i].used)
            slot_release(s, &s->slots[i]);
    free(s->slots);
    for (uint32_t i = 0; i < s->nparked; i++)
        cps__rx_free(&s->parked[i].rx);
    free(s->parked);
    free(s->sum);
    free(s->clock);
    free(s->dedup);
    s->slots = NULL;
    s->parked = NULL;
    s->sum = NULL;
    s->clock = NULL;
    s->dedup = NULL;
}
