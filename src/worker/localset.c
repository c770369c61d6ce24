/* Worker-held tensors in checkpoints: the list, the exchange with an exporter, the blob
 * (localset.h; the public calls are include/chainps/localstate.h). */
#include "worker/localset.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "chainps/localstate.h"
#include "client.h"
#include "core/config.h"
#include "core/log.h"
#include "core/view.h"
#include "node/temp_peers.h"
#include "replication/local_queue.h"
#include "transport/transport.h"

#define SUB        "local"
#define MAGIC      0x4C535043u /* "CPSL" */
#define BLOB_FIXED 24

typedef struct entry {
    char name[CPS_TENSOR_NAME_MAX + 1];
    const float *buf;
    uint32_t ndim;
    uint64_t dims[CPS_MAX_NDIM];
    uint64_t numel;
} entry;

_Static_assert(CPS_LSET_QUEUE == CPS_LQ_SLOTS, "localset.h's queue is replication/local_queue.h's");

struct cps__lset {
    entry *e;
    size_t n, cap;
    char **keys, **values;
    size_t nmeta;
    int registered; /* the scheduler's registry holds our marker */
    size_t chunk;   /* bytes of blob per answer message (CHAINPS_LOCAL_CHUNK) */
    /* Exporters' requests waiting for their boundary, or being answered (commit sends outside
     * the lock, so a slot stays taken, and its peer id pointed at that exporter, until done):
     * replication/local_queue.h decides; addr[k] is where slot k's exporter listens. */
    cps__lq lq;
    char addr[CPS_LSET_QUEUE][CPS_ADDR_MAX];
    /* The exporters we answer, as temporary peers: one id per exporter's inbox, never pointed
     * at another one while an answer to it may still be queued (node/temp_peers.h). */
    cps__temp_peers temps;
};

static size_t pad4(size_t n)
{
    return (n + 3) & ~(size_t)3;
}

/* ---- the blob ---- */

/* What a blob is made of: the list's entries and metadata, or a copy of them taken under the
 * client's lock (commit encodes outside it). */
typedef struct blob_src {
    const entry *e;
    size_t n;
    char *const *keys, *const *values;
    size_t nmeta;
} blob_src;

static size_t blob_size(const blob_src *s)
{
    size_t n = BLOB_FIXED;
    for (size_t i = 0; i < s->n; i++)
        n += 8 + 8 * (size_t)s->e[i].ndim + pad4(strlen(s->e[i].name)) + 4 * s->e[i].numel;
    for (size_t i = 0; i < s->nmeta; i++)
        n += 8 + strlen(s->keys[i]) + strlen(s->values[i]);
    return n;
}

static void blob_encode(const blob_src *s, uint64_t step, unsigned char *p)
{
    cps__le32_put(p, MAGIC);
    cps__le32_put(p + 4, (uint32_t)s->n);
    cps__le32_put(p + 8, (uint32_t)s->nmeta);
    cps__le32_put(p + 12, 0);
    cps__le64_put(p + 16, step);
    p += BLOB_FIXED;
    for (size_t i = 0; i < s->n; i++) {
        const entry *e = &s->e[i];
        size_t nlen = strlen(e->name);
        cps__le32_put(p, (uint32_t)nlen);
        cps__le32_put(p + 4, e->ndim);
        p += 8;
        for (uint32_t d = 0; d < e->ndim; d++, p += 8)
            cps__le64_put(p, e->dims[d]);
        memset(p, 0, pad4(nlen));
        memcpy(p, e->name, nlen);
        p += pad4(nlen);
        memcpy(p, e->buf, 4 * e->numel); /* little-endian hosts only (checkpoint/ckpt.h) */
        p += 4 * e->numel;
    }
    for (size_t i = 0; i < s->nmeta; i++) {
        size_t kl = strlen(s->keys[i]), vl = strlen(s->values[i]);
        cps__le32_put(p, (uint32_t)kl);
        cps__le32_put(p + 4, (uint32_t)vl);
        memcpy(p + 8, s->keys[i], kl);
        memcpy(p + 8 + kl, s->values[i], vl);
        p += 8 + kl + vl;
    }
}

void cps__lset_blob_fini(cps__lset_blob *b)
{
    if (!b)
        return;
    for (uint32_t i = 0; i < b->nmeta; i++) {
        if (b->keys)
            free(b->keys[i]);
        if (b->values)
            free(b->values[i]);
    }
    free(b->keys);
    free(b->values);
    free(b->tensors);
    memset(b, 0, sizeof *b);
}

static char *strndup_checked(const unsigned char *p, size_t n)
{
    if (memchr(p, 0, n))
        return NULL;
    char *s = malloc(n + 1);
    if (s) {
        memcpy(s, p, n);
        s[n] = '\0';
    }
    return s;
}

static int decode_tensor(const unsigned char **pp, size_t *left, cps__lset_tensor *t)
{
    const unsigned char *p = *pp;
    if (*left < 8)
        return CPS_EPROTO;
    uint32_t nlen = cps__le32_get(p), ndim = cps__le32_get(p + 4);
    if (nlen == 0 || nlen > CPS_TENSOR_NAME_MAX || ndim == 0 || ndim > CPS_MAX_NDIM ||
        *left - 8 < 8 * (size_t)ndim + pad4(nlen))
        return CPS_EPROTO;
    p += 8;
    t->ndim = ndim;
    t->numel = 1;
    for (uint32_t d = 0; d < ndim; d++, p += 8) {
        t->dims[d] = cps__le64_get(p);
        if (t->dims[d] == 0 || t->numel > (UINT64_C(1) << 40) / t->dims[d])
            return CPS_EPROTO;
        t->numel *= t->dims[d];
    }
    if (memchr(p, 0, nlen))
        return CPS_EPROTO;
    memcpy(t->name, p, nlen);
    t->name[nlen] = '\0';
    p += pad4(nlen);
    size_t head = 8 + 8 * (size_t)ndim + pad4(nlen);
    if (*left - head < 4 * t->numel)
        return CPS_EPROTO;
    t->data = p;
    *pp = p + 4 * t->numel;
    *left -= head + 4 * t->numel;
    return 0;
}

int cps__lset_blob_decode(const void *buf, size_t len, cps__lset_blob *out)
{
    memset(out, 0, sizeof *out);
    const unsigned char *p = buf;
    if (len < BLOB_FIXED || cps__le32_get(p) != MAGIC || cps__le32_get(p + 12) != 0)
        return CPS_EPROTO;
    uint32_t nt = cps__le32_get(p + 4), nm = cps__le32_get(p + 8);
    size_t left = len - BLOB_FIXED;
    if (nt > left / 12 || nm > left / 8)
        return CPS_EPROTO;
    out->step = cps__le64_get(p + 16);
    out->tensors = calloc(nt ? nt : 1, sizeof *out->tensors);
    out->keys = calloc(nm ? nm : 1, sizeof *out->keys);
    out->values = calloc(nm ? nm : 1, sizeof *out->values);
    if (!out->tensors || !out->keys || !out->values)
        return CPS_ENOMEM;
    p += BLOB_FIXED;
    for (uint32_t i = 0; i < nt; i++) {
        int rc = decode_tensor(&p, &left, &out->tensors[i]);
        if (rc != 0)
            return rc;
        out->ntensors++;
    }
    for (uint32_t i = 0; i < nm; i++) {
        if (left < 8)
            return CPS_EPROTO;
        size_t kl = cps__le32_get(p), vl = cps__le32_get(p + 4);
        if (kl == 0 || kl > CPS_LSET_META_MAX || left - 8 < kl || left - 8 - kl < vl)
            return CPS_EPROTO;
        out->nmeta++;
        out->keys[i] = strndup_checked(p + 8, kl);
        out->values[i] = strndup_checked(p + 8 + kl, vl);
        if (!out->keys[i] || !out->values[i])
            return CPS_EPROTO;
        p += 8 + kl + vl;
        left -= 8 + kl + vl;
    }
    return left == 0 ? 0 : CPS_EPROTO;
}

/* ---- reassembly of a blob sent in chunks (the exporter's side) ---- */

int cps__lset_asm_put(cps__lset_asm *a, uint64_t step, const void *payload, size_t len)
{
    const unsigned char *p = payload;
    if (len < CPS_LSET_CHUNK_HDR)
        return CPS_ESIZE;
    uint64_t total = cps__le64_get(p), off = cps__le64_get(p + 8);
    size_t n = len - CPS_LSET_CHUNK_HDR;
    if (total < BLOB_FIXED || total > CPS_LSET_BLOB_MAX || n == 0 || off > total || n > total - off)
        return CPS_ESIZE;
    if (a->got ? total != a->total || step != a->step : off != 0)
        return CPS_EPROTO;
    if (off != a->got)
        return CPS_EPROTO; /* a chunk lost, repeated or out of order */
    if (a->got + n > a->cap) {
        /* Grown as chunks arrive, not to the length the first one announces. */
        uint64_t cap = a->cap ? 2 * a->cap : n;
        cap = cap < a->got + n ? a->got + n : cap > total ? total : cap;
        unsigned char *b = realloc(a->buf, (size_t)cap);
        if (!b)
            return CPS_ENOMEM;
        a->buf = b;
        a->cap = cap;
    }
    memcpy(a->buf + a->got, p + CPS_LSET_CHUNK_HDR, n);
    a->got += n;
    a->total = total;
    a->step = step;
    return a->got == total;
}

void cps__lset_asm_fini(cps__lset_asm *a)
{
    if (!a)
        return;
    free(a->buf);
    memset(a, 0, sizeof *a);
}

/* ---- the worker's list ---- */

/* CHAINPS_LOCAL_CHUNK: bytes of the blob per answer (default CPS_LSET_CHUNK_DEFAULT). A bad
 * value fails cps_local_add naming the variable rather than falling back silently. */
static int chunk_from_env(size_t *out)
{
    const char *env = getenv("CHAINPS_LOCAL_CHUNK");
    uint32_t v = CPS_LSET_CHUNK_DEFAULT;
    char err[160];
    int rc = 0;
    if (env && *env &&
        (rc = cps__config_parse_u32("CHAINPS_LOCAL_CHUNK", env, CPS_LSET_CHUNK_MIN,
                                    CPS_LSET_CHUNK_MAX, &v, err, sizeof err)) != 0)
        cps__log(CPS_LOG_ERROR, SUB, "%s", err);
    *out = v;
    return rc;
}

static int lset_get(cps_client *c, cps__lset **out)
{
    if (!c->lset) {
        size_t chunk;
        int rc = chunk_from_env(&chunk);
        if (rc != 0)
            return rc;
        c->lset = calloc(1, sizeof *c->lset);
        if (!c->lset)
            return CPS_ENOMEM;
        cps__lq_init(&c->lset->lq);
        c->lset->chunk = chunk;
    }
    *out = c->lset;
    return 0;
}

/* Tell the scheduler's registry that this job has local tensors, so exports ask for them. */
static int lset_register(cps_client *c, cps__lset *s)
{
    if (s->registered)
        return 0;
    cps__tensor_desc d = {.kind = CPS_DESC_LOCAL, .length = 1};
    int rc = cps__spec_make(CPS_LSET_NAME, NULL, NULL, &d.spec);
    snprintf(d.name, sizeof d.name, "%s", CPS_LSET_NAME);
    if (rc == 0)
        rc = cps__client_register(c, &d);
    if (rc == 0)
        s->registered = 1;
    else
        cps__log(CPS_LOG_ERROR, SUB, "cannot tell the scheduler of the local tensors: %s",
                 cps_strerror(rc));
    return rc;
}

int cps_local_add(cps_client *c, const char *name, const float *buf, uint32_t ndim,
                  const uint64_t *shape)
{
    cps__why_clear();
    if (!c || !name)
        return CPS_EINVAL;
    size_t nlen = strlen(name);
    uint64_t numel = 1;
    int bad = nlen == 0 || nlen > CPS_TENSOR_NAME_MAX ||
              (buf && (!shape || ndim == 0 || ndim > CPS_MAX_NDIM));
    for (uint32_t d = 0; !bad && buf && d < ndim; d++) {
        bad = shape[d] == 0 || numel > (UINT64_C(1) << 40) / shape[d];
        numel *= bad ? 1 : shape[d];
    }
    if (bad) {
        cps__log(CPS_LOG_ERROR, SUB, "local tensor %s: bad name or shape", name);
        return CPS_EINVAL;
    }
    pthread_mutex_lock(&c->lock);
    cps__lset *s;
    int rc = lset_get(c, &s);
    size_t i = 0;
    while (rc == 0 && i < s->n && strcmp(s->e[i].name, name) != 0)
        i++;
    if (rc == 0 && !buf) {
        if (i < s->n)
            s->e[i] = s->e[--s->n];
    } else if (rc == 0) {
        if (i == s->n && s->n == s->cap) {
            size_t cap = s->cap ? 2 * s->cap : 16;
            entry *grown = realloc(s->e, cap * sizeof *grown);
            if (grown) {
                s->e = grown;
                s->cap = cap;
            } else {
                rc = CPS_ENOMEM;
            }
        }
        if (rc == 0) {
            entry *e = &s->e[i];
            memcpy(e->name, name, nlen + 1);
            e->buf = buf;
            e->ndim = ndim;
            memcpy(e->dims, shape, ndim * sizeof *shape);
            e->numel = numel;
            s->n += i == s->n;
            rc = lset_register(c, s);
        }
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int cps_local_meta(cps_client *c, const char *key, const char *value)
{
    cps__why_clear();
    if (!c || !key || !*key || strlen(key) > CPS_LSET_META_MAX)
        return CPS_EINVAL;
    pthread_mutex_lock(&c->lock);
    cps__lset *s;
    int rc = lset_get(c, &s);
    size_t i = 0;
    while (rc == 0 && i < s->nmeta && strcmp(s->keys[i], key) != 0)
        i++;
    if (rc == 0 && !value) {
        if (i < s->nmeta) {
            free(s->keys[i]);
            free(s->values[i]);
            s->nmeta--;
            s->keys[i] = s->keys[s->nmeta];
            s->values[i] = s->values[s->nmeta];
        }
    } else if (rc == 0) {
        char *v = strdup(value), *k = i < s->nmeta ? s->keys[i] : strdup(key);
        char **ks = i < s->nmeta ? s->keys : realloc(s->keys, (s->nmeta + 1) * sizeof *ks);
        if (ks)
            s->keys = ks;
        char **vs = i < s->nmeta ? s->values : realloc(s->values, (s->nmeta + 1) * sizeof *vs);
        if (vs)
            s->values = vs;
        if (!v || !k || !ks || !vs) {
            free(v);
            if (i == s->nmeta)
                free(k);
            rc = CPS_ENOMEM;
        } else {
            if (i < s->nmeta)
                free(s->values[i]);
            s->keys[i] = k;
            s->values[i] = v;
            s->nmeta += i == s->nmeta;
        }
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

/* ---- the exchange with an exporter ---- */

/* The peer id of the exporter listening at `addr` (0: it cannot be reached now). */
static uint32_t exporter_peer(cps_client *c, cps__lset *s, const char *addr)
{
    uint64_t now = cps__now_ms();
    cps__temp_peers_expire(&s->temps, c->tp, now);
    uint32_t peer = cps__temp_peer_add(&s->temps, c->tp, addr, now);
    if (!peer)
        cps__log(CPS_LOG_WARN, SUB, "cannot answer the exporter at %s: no peer for it now", addr);
    return peer;
}

/* An answer without a blob: CPS_EPAST (with the boundary we are at), CPS_ENOTFOUND, CPS_EAGAIN,
 * CPS_ENOMEM. */
static void answer_status(cps_client *c, cps__lset *s, const char *addr, uint64_t req_seq,
                          int status, uint64_t step)
{
    uint32_t peer = exporter_peer(c, s, addr);
    if (!peer)
        return;
    cps__msg_hdr h = {.type = CPS_MSG_LOCAL,
                      .flags = CPS_WF_REPLY,
                      .sender = c->id,
                      .status = status,
                      .epoch = c->view ? c->view->epoch : 0,
                      .req_worker = c->id,
                      .req_seq = req_seq,
                      .step = step};
    int rc = cps__msg_send(c->tp, peer, &h, NULL, 0);
    if (rc != 0)
        cps__log(CPS_LOG_WARN, SUB, "cannot answer the exporter: %s", cps_strerror(rc));
}

/* One chunk of the blob to peer `peer`, the exporter of request req_seq; the message owns a
 * copy. */
static int send_chunk(cps_client *c, cps__lset *s, uint64_t req_seq, uint32_t peer, uint64_t step,
                      const unsigned char *blob, uint64_t total, uint64_t off, size_t len)
{
    cps__msg_hdr h = {.type = CPS_MSG_LOCAL,
                      .flags = CPS_WF_REPLY,
                      .sender = c->id,
                      .epoch = c->view ? c->view->epoch : 0,
                      .req_worker = c->id,
                      .req_seq = req_seq,
                      .step = step};
    unsigned char *buf = cps__msg_alloc(&h, CPS_LSET_CHUNK_HDR + len);
    if (!buf)
        return CPS_ENOMEM;
    unsigned char *p = buf + CPS_WIRE_HDR_SIZE;
    cps__le64_put(p, total);
    cps__le64_put(p + 8, off);
    memcpy(p + CPS_LSET_CHUNK_HDR, blob + off, len);
    int rc = cps__tp_send(c->tp, peer, buf, CPS_WIRE_HDR_SIZE + CPS_LSET_CHUNK_HDR + len);
    if (rc != 0)
        cps__tp_free(buf);
    else
        cps__temp_peer_touch(&s->temps, peer, cps__now_ms());
    return rc;
}

void cps__lset_on_msg(cps_client *c, const cps__rx *rx)
{
    if (rx->hdr.flags & CPS_WF_REPLY)
        return;
    uint32_t role, rank, prev;
    char addr[CPS_ADDR_MAX];
    cps__lset *s;
    if (cps__hello_decode(rx->payload, rx->len, &role, &rank, &prev, addr, NULL) != 0 ||
        lset_get(c, &s) != 0) {
        cps__log(CPS_LOG_WARN, SUB, "malformed request for the local tensors dropped");
        return;
    }
    cps__lq_act act[2];
    size_t n = cps__lq_request(&s->lq, rx->hdr.req_seq, rx->hdr.step, rx->hdr.aux == 1, s->n, act);
    for (size_t i = 0; i < n; i++) {
        if (act[i].kind == CPS_LQ_HOLD) {
            snprintf(s->addr[act[i].slot], sizeof s->addr[0], "%s", addr);
            continue;
        }
        if (act[i].slot < 0 && act[i].status == CPS_EAGAIN)
            cps__log(CPS_LOG_WARN, SUB, "%d exports are being answered: a new one is refused",
                     CPS_LSET_QUEUE);
        else if (act[i].slot >= 0)
            cps__log(CPS_LOG_WARN, SUB,
                     "%d exports wait for the local tensors: the oldest (step %" PRIu64
                     ") gives way to a new one",
                     CPS_LSET_QUEUE, act[i].want);
        answer_status(c, s, act[i].slot < 0 ? addr : s->addr[act[i].slot], act[i].req_seq,
                      act[i].status, act[i].step);
    }
}

/* The list and metadata as they are now, for encoding outside the lock. */
typedef struct snapshot {
    entry *e;
    char **keys, **values;
    blob_src src;
} snapshot;

static void snapshot_fini(snapshot *sn)
{
    for (size_t i = 0; i < sn->src.nmeta; i++) {
        free(sn->keys[i]);
        free(sn->values[i]);
    }
    free(sn->keys);
    free(sn->values);
    free(sn->e);
    memset(sn, 0, sizeof *sn);
}

static int snapshot_take(const cps__lset *s, snapshot *sn)
{
    memset(sn, 0, sizeof *sn);
    sn->e = malloc((s->n ? s->n : 1) * sizeof *sn->e);
    sn->keys = calloc(s->nmeta ? s->nmeta : 1, sizeof *sn->keys);
    sn->values = calloc(s->nmeta ? s->nmeta : 1, sizeof *sn->values);
    if (!sn->e || !sn->keys || !sn->values)
        goto oom;
    memcpy(sn->e, s->e, s->n * sizeof *sn->e);
    for (size_t i = 0; i < s->nmeta; i++, sn->src.nmeta++) {
        sn->keys[i] = strdup(s->keys[i]);
        sn->values[i] = strdup(s->values[i]);
        if (!sn->keys[i] || !sn->values[i]) {
            sn->src.nmeta++;
            goto oom;
        }
    }
    sn->src = (blob_src){sn->e, s->n, sn->keys, sn->values, s->nmeta};
    return 0;
oom:
    snapshot_fini(sn);
    return CPS_ENOMEM;
}

/* Answer the requests of slots `which` (CPS_LQ_SENDING) with the blob of boundary `step`, encoded
 * outside the client's lock (the copy of a large model must not hold up the client's loop) and
 * sent in chunks of s->chunk bytes, each under the lock (the transport's owner). Called and
 * returns with the lock held. */
static int answer_blob(cps_client *c, cps__lset *s, const unsigned char *which, uint64_t step)
{
    snapshot sn;
    int rc = snapshot_take(s, &sn);
    size_t chunk = s->chunk;
    unsigned char *blob = NULL;
    uint64_t total = 0, t0 = cps__now_us(), t_copy = t0;
    if (rc == 0) {
        pthread_mutex_unlock(&c->lock);
        total = blob_size(&sn.src);
        blob = malloc(total);
        if (blob)
            blob_encode(&sn.src, step, blob);
        t_copy = cps__now_us();
        pthread_mutex_lock(&c->lock);
        rc = blob ? 0 : CPS_ENOMEM;
    }
    snapshot_fini(&sn);
    for (size_t i = 0; i < CPS_LSET_QUEUE; i++) {
        if (!which[i])
            continue;
        uint64_t req_seq = s->lq.q[i].req_seq;
        uint32_t peer = exporter_peer(c, s, s->addr[i]);
        int src = peer ? rc : CPS_EUNAVAILABLE;
        for (uint64_t off = 0; src == 0 && off < total; off += chunk) {
            size_t len = total - off < chunk ? (size_t)(total - off) : chunk;
            src = send_chunk(c, s, req_seq, peer, step, blob, total, off, len);
            if (src == 0 && off + len < total) {
                /* Let the client's loop (and other threads' calls) in between chunks. */
                pthread_mutex_unlock(&c->lock);
                pthread_mutex_lock(&c->lock);
            }
        }
        if (src == CPS_ENOMEM)
            answer_status(c, s, s->addr[i], req_seq, CPS_ENOMEM, step);
        if (src != 0)
            cps__log(CPS_LOG_ERROR, SUB, "cannot send the local tensors of step %" PRIu64 ": %s",
                     step, cps_strerror(src));
        else
            cps__log(CPS_LOG_INFO, SUB,
                     "local tensors of step %" PRIu64 " sent to an exporter (%" PRIu64
                     " bytes in %" PRIu64 " messages; copied in %.1f ms outside the lock, "
                     "queued after %.1f ms)",
                     step, total, (total + chunk - 1) / chunk, (t_copy - t0) / 1000.0,
                     (cps__now_us() - t0) / 1000.0);
        cps__lq_sent(&s->lq, (int)i);
    }
    free(blob);
    return rc;
}

int cps_local_commit(cps_client *c, uint64_t step)
{
    cps__why_clear();
    if (!c)
        return CPS_EINVAL;
    pthread_mutex_lock(&c->lock);
    cps__lset *s;
    int rc = lset_get(c, &s);
    unsigned char which[CPS_LSET_QUEUE] = {0};
    int any = 0;
    if (rc == 0) {
        cps__lq_act act[CPS_LQ_SLOTS];
        size_t n = cps__lq_commit(&s->lq, step, act);
        for (size_t i = 0; i < n; i++) {
            if (act[i].kind == CPS_LQ_BLOB)
                which[act[i].slot] = any = 1;
            else
                answer_status(c, s, s->addr[act[i].slot], act[i].req_seq, act[i].status,
                              act[i].step);
        }
        if (any)
            rc = answer_blob(c, s, which, step);
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

void cps__lset_free(cps_client *c)
{
    cps__lset *s = c->lset;
    if (!s)
        return;
    for (size_t i = 0; i < s->nmeta; i++) {
        free(s->keys[i]);
        free(s->values[i]);
    }
    free(s->keys);
    free(s->values);
    free(s->e);
    free(s);
    c->lset = NULL;
}
