/* Worker-held tensors in checkpoints: the list, the exchange with an exporter, the blob
 * (localset.h; the public calls are include/chainps/localstate.h). */
#include "worker/localset.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "chainps/localstate.h"
#include "client.h"
#include "core/log.h"
#include "core/view.h"
#include "transport/transport.h"

#define SUB        "local"
#define MAGIC      0x4C535043u /* "CPSL" */
#define TOOL_PEER  0x40000001u /* the exporter that asked, a peer of our transport */
#define NO_STEP    UINT64_MAX  /* no boundary committed yet */
#define BLOB_FIXED 24

typedef struct entry {
    char name[CPS_TENSOR_NAME_MAX + 1];
    const float *buf;
    uint32_t ndim;
    uint64_t dims[CPS_MAX_NDIM];
    uint64_t numel;
} entry;

struct cps__lset {
    entry *e;
    size_t n, cap;
    char **keys, **values;
    size_t nmeta;
    int registered; /* the scheduler's registry holds our marker */
    uint64_t last;  /* the last committed boundary, NO_STEP before the first */
    /* An exporter's request waiting for its boundary. */
    int pending, any;
    uint64_t want, req_seq;
};

static size_t pad4(size_t n)
{
    return (n + 3) & ~(size_t)3;
}

/* ---- the blob ---- */

static size_t blob_size(const cps__lset *s)
{
    size_t n = BLOB_FIXED;
    for (size_t i = 0; i < s->n; i++)
        n += 8 + 8 * (size_t)s->e[i].ndim + pad4(strlen(s->e[i].name)) + 4 * s->e[i].numel;
    for (size_t i = 0; i < s->nmeta; i++)
        n += 8 + strlen(s->keys[i]) + strlen(s->values[i]);
    return n;
}

static void blob_encode(const cps__lset *s, uint64_t step, unsigned char *p)
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

/* ---- the worker's list ---- */

static int lset_get(cps_client *c, cps__lset **out)
{
    if (!c->lset) {
        c->lset = calloc(1, sizeof *c->lset);
        if (!c->lset)
            return CPS_ENOMEM;
        c->lset->last = NO_STEP;
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

static void reply(cps_client *c, cps__lset *s, int status, uint64_t step)
{
    cps__msg_hdr h = {.type = CPS_MSG_LOCAL,
                      .flags = CPS_WF_REPLY,
                      .sender = c->id,
                      .status = status,
                      .epoch = c->view ? c->view->epoch : 0,
                      .req_worker = c->id,
                      .req_seq = s->req_seq,
                      .step = step};
    size_t len = status == 0 ? blob_size(s) : 0;
    if (len > CPS_WIRE_MAX_PAYLOAD) {
        cps__log(CPS_LOG_ERROR, SUB, "the local tensors (%zu bytes) exceed a message", len);
        h.status = CPS_ESIZE;
        len = 0;
    }
    unsigned char *buf = cps__msg_alloc(&h, len);
    if (!buf) {
        h.status = CPS_ENOMEM;
        len = 0;
        buf = cps__msg_alloc(&h, 0);
    }
    if (!buf)
        return;
    if (len)
        blob_encode(s, step, buf + CPS_WIRE_HDR_SIZE);
    int rc = cps__tp_send(c->tp, TOOL_PEER, buf, CPS_WIRE_HDR_SIZE + len);
    if (rc != 0) {
        cps__tp_free(buf);
        cps__log(CPS_LOG_WARN, SUB, "cannot answer the exporter: %s", cps_strerror(rc));
    } else if (h.status == 0) {
        cps__log(CPS_LOG_INFO, SUB, "local tensors of step %llu sent to the exporter (%zu bytes)",
                 (unsigned long long)step, len);
    }
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
    if (cps__tp_peer_set(c->tp, TOOL_PEER, addr) != 0)
        return;
    s->req_seq = rx->hdr.req_seq;
    s->pending = 0;
    s->any = rx->hdr.aux == 1;
    s->want = rx->hdr.step;
    if (s->n == 0)
        reply(c, s, CPS_ENOTFOUND, s->last == NO_STEP ? 0 : s->last);
    else if (!s->any && s->last != NO_STEP && s->want <= s->last)
        reply(c, s, CPS_EPAST, s->last);
    else
        s->pending = 1;
}

int cps_local_commit(cps_client *c, uint64_t step)
{
    cps__why_clear();
    if (!c)
        return CPS_EINVAL;
    pthread_mutex_lock(&c->lock);
    cps__lset *s;
    int rc = lset_get(c, &s);
    if (rc == 0) {
        s->last = step;
        if (s->pending && (s->any || step == s->want)) {
            s->pending = 0;
            reply(c, s, 0, step);
        } else if (s->pending && step > s->want) {
            s->pending = 0;
            reply(c, s, CPS_EPAST, step);
        }
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
