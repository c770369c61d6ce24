/* Export and restore of a running job's checkpoints (cluster.h); the server side is
 * src/server/cut.c. */
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chainps/error.h"
#include "checkpoint/ckpt.h"
#include "checkpoint/cluster.h"
#include "core/bigbuf.h"
#include "core/entries.h"
#include "core/log.h"
#include "core/view.h"
#include "node/msg.h"
#include "node/roles.h"
#include "optim/optim.h"
#include "recovery/cutroute.h"
#include "recovery/restore.h"
#include "transport/transport.h"
#include "worker/client.h"
#include "worker/localset.h"

#define SUB           "ckpt"
#define SCHED         0u
#define CUT_PEER_BASE 0x20000000u /* tool-side peer ids of the cut threads: + range */
#define CLOSE_PEER    0x30000000u /* ... of the views closed without being read: + a count */
#define READ_WINDOW   64          /* CUT_READs in flight (tables, step counts) */
/* Dense tensors: one CUT_READ carries up to READ_BYTES of consecutive keys of a range (16
 * chunks of 512 KB), and READ_AHEAD of them are in flight per range across the writer's fills:
 * one 512 KB read per message, drained at the end of every 16 MB fill, left the servers idle
 * between fills and cost a message's overheads per chunk. */
#define READ_BYTES (8u << 20)
/* Below this an export touches too little memory for huge pages to save anything. */
#define PREWARM_MIN_BYTES (4u << 20)
#define READ_AHEAD        4 /* per range, at most; the ranges share READ_TOTAL */
#define READ_TOTAL        8 /* ... reads in flight in all (64 MB), but 2 per range at least */
/* A PUT is one chain update, applied in one transaction on every replica: 8 MB keeps each short
 * (64 MB ones stalled the servers' loops past the failure timeout on a loaded machine, and a
 * restore onto chains of 2 did not finish); 128 MB stay in flight per range. */
#define PUT_BYTES        (8u << 20) /* records per PUT message */
#define OPEN_TRIES       8
#define AIM_GAP_MS       50    /* between the two probes that measure a sync job's step rate */
#define AIM_MIN_MS       20    /* the least time ahead a cut aims (doubled after each miss) */
#define REFRESH_MS       2000  /* waiting for a cut: ask for the view again this often */
#define SILENT_REFRESHES 3     /* ... and give up once the scheduler left that many unanswered */
#define READ_WAIT_MS     30000 /* one read's answer (a tail that died fails the export) */
/* Unanswered this long, the exporter looks at the view again: a reader whose process died is
 * seen sooner (its connection refuses), but one cut off by the network only through the view. */
#define LOOK_MS        500
#define GONE_MS        100 /* a server looks gone but its view still lists it: look again this often */
#define CUT_TRIES      4   /* cuts lost with every replica that held them, cut again this often */
#define CLOSE_GRACE_MS 200 /* closing: a CUT_CLOSE's peer not connected by then is dropped */

/* ---- talking to the cluster ---- */

typedef struct link {
    int said_not_started; /* "has not started" logged once, however long we wait for it */
    cps__tp *tp;
    char hello[16 + CPS_ADDR_MAX];
    size_t hello_len;
    cps__view view;
    int started;
    cps__tensor_desc *descs;
    uint32_t ndescs;
    int timeout_ms;
    uint64_t next_req;
    /* received, not yet consumed */
    cps__rx *in;
    size_t nin, capin;
    uint64_t read_wait_us; /* export: time spent waiting for read answers */
    uint32_t closes;       /* names the peers CUT_CLOSEs of unused views go to (CLOSE_PEER + k) */
    int has_local;         /* a worker registered local tensors (worker/localset.h) */
} link;

static void on_msg(void *ctx, void *buf, size_t len)
{
    link *l = ctx;
    cps__rx rx;
    if (cps__rx_parse(&rx, buf, len) != 0)
        return;
    if (l->nin == l->capin) {
        size_t cap = l->capin ? l->capin * 2 : 64;
        cps__rx *grown = realloc(l->in, cap * sizeof *grown);
        if (!grown) {
            cps__rx_free(&rx);
            return;
        }
        l->in = grown;
        l->capin = cap;
    }
    l->in[l->nin++] = rx;
}

/* Take the first received message `match` accepts, waiting until the deadline. */
typedef int (*match_fn)(const cps__rx *rx, const void *arg);

static int take(link *l, match_fn match, const void *arg, uint64_t deadline, cps__rx *out)
{
    for (;;) {
        for (size_t i = 0; i < l->nin; i++)
            if (match(&l->in[i], arg)) {
                *out = l->in[i];
                memmove(l->in + i, l->in + i + 1, (l->nin - i - 1) * sizeof *l->in);
                l->nin--;
                return 0;
            }
        uint64_t now = cps__now_ms();
        if (now >= deadline)
            return CPS_ETIMEDOUT;
        uint64_t wait = deadline - now;
        int rc = cps__tp_poll(l->tp, wait > 100 ? 100 : (int)wait, on_msg, l, 0);
        if (rc < 0)
            return rc;
    }
}

static void link_close(link *l)
{
    for (size_t i = 0; i < l->nin; i++)
        cps__rx_free(&l->in[i]);
    free(l->in);
    free(l->descs);
    if (l->tp) {
        /* What still matters is the scheduler's note and the CUT_CLOSEs. A probe or an ask queued
         * for a server that died would hold the drain below for its whole 2 s (every export that
         * rode through a failover took 2 s longer). */
        for (uint32_t i = 0; i < l->view.nnodes; i++)
            if (l->view.nodes[i].role == CPS_ROLE_SERVER)
                cps__tp_peer_drop(l->tp, l->view.nodes[i].id);
        for (uint32_t r = 0; r < l->view.nranges; r++)
            if (cps__tp_peer_gone(l->tp, CUT_PEER_BASE + r))
                cps__tp_peer_drop(l->tp, CUT_PEER_BASE + r);
        /* A CUT_CLOSE to a standby's view on a server that died but that the view still lists
         * goes to a peer that never connects, and is never "gone" either (it never broke): the
         * drain waited its whole 2 s (racing exports' 2.3 s outliers). Such a view died with its
         * process; one on a live server that does not connect within CLOSE_GRACE_MS closes itself
         * when idle (CUT_IDLE_MS). */
        uint64_t t0 = cps__now_ms(), drain = t0 + 2000;
        int grace = 1;
        while (cps__tp_queued(l->tp) > 0 && cps__now_ms() < drain) {
            if (grace && cps__now_ms() >= t0 + CLOSE_GRACE_MS) {
                grace = 0;
                for (uint32_t k = 0; k < l->closes; k++)
                    if (!cps__tp_peer_connected(l->tp, CLOSE_PEER + k))
                        cps__tp_peer_drop(l->tp, CLOSE_PEER + k);
            }
            cps__tp_poll(l->tp, 20, NULL, NULL, 0);
        }
        cps__tp_destroy(l->tp);
    }
    cps__view_fini(&l->view);
    memset(l, 0, sizeof *l);
}

static int link_open(link *l, const char *scheduler, const char *bind, const char *advertise,
                     const unsigned char *key, int timeout_ms)
{
    memset(l, 0, sizeof *l);
    cps__view_init(&l->view);
    l->timeout_ms = timeout_ms > 0 ? timeout_ms : 120000;
    l->next_req = (uint64_t)time(NULL) << 20;
    if (!scheduler || !*scheduler || strlen(scheduler) > CPS_ADDR_MAX - 8) {
        cps__log(CPS_LOG_ERROR, SUB, "no scheduler address (HOST:PORT)");
        return CPS_EINVAL;
    }
    char url[CPS_ADDR_MAX + 8], me[CPS_ADDR_MAX];
    snprintf(url, sizeof url, "tcp://%s", scheduler);
    uint16_t port = 0;
    const char *host = bind && *bind ? bind : "127.0.0.1";
    int rc = cps__tp_create(key, &l->tp);
    if (rc == 0)
        rc = cps__tp_bind(l->tp, host, 0, &port);
    if (rc == 0)
        rc = cps__tp_peer_set(l->tp, SCHED, url);
    if (rc == 0)
        rc = cps__make_url(me, advertise && *advertise ? advertise : host, port);
    if (rc == 0) {
        l->hello_len =
            cps__hello_encode(l->hello, sizeof l->hello, CPS_ROLE_NONE, UINT32_MAX, 0, me);
        if (l->hello_len == 0)
            rc = CPS_EINVAL;
    }
    if (rc != 0)
        cps__log(CPS_LOG_ERROR, SUB, "cannot reach the scheduler at %s: %s", url, cps_strerror(rc));
    return rc;
}

static int match_registry(const cps__rx *rx, const void *arg)
{
    (void)arg;
    return rx->hdr.type == CPS_MSG_REGISTRY && (rx->hdr.flags & CPS_WF_REPLY);
}

/* Ask the scheduler for its REGISTRY answer, again every second until `deadline`. */
static int fetch_registry(link *l, uint64_t deadline, cps__rx *rx)
{
    int rc = CPS_ETIMEDOUT;
    while (cps__now_ms() < deadline) {
        cps__msg_hdr h = {.type = CPS_MSG_REGISTRY, .sender = UINT32_MAX};
        cps__msg_send(l->tp, SCHED, &h, l->hello, l->hello_len);
        uint64_t until = cps__now_ms() + 1000;
        rc = take(l, match_registry, NULL, until < deadline ? until : deadline, rx);
        if (rc == 0)
            break;
    }
    return rc;
}

static int connect_servers(link *l)
{
    int rc = 0;
    for (uint32_t i = 0; rc == 0 && i < l->view.nnodes; i++)
        if (l->view.nodes[i].role == CPS_ROLE_SERVER)
            rc = cps__tp_peer_set(l->tp, l->view.nodes[i].id, l->view.nodes[i].addr);
    return rc;
}

/* The current view only (the tails may have moved since we asked). */
static int link_refresh_view(link *l)
{
    cps__rx rx;
    int rc = fetch_registry(l, cps__now_ms() + 2000, &rx);
    if (rc != 0)
        return rc;
    cps__view v;
    cps__view_init(&v);
    size_t used;
    rc = cps__view_decode_prefix(rx.payload, rx.len, &v, &used);
    cps__rx_free(&rx);
    if (rc == 0 && v.nranges == l->view.nranges) {
        cps__view_fini(&l->view);
        l->view = v;
        return connect_servers(l);
    }
    cps__view_fini(&v);
    return rc ? rc : CPS_EPROTO;
}

/* The view and the tensor registry, asked again every second until the deadline. */
static int link_registry(link *l, const char *scheduler)
{
    cps__rx rx;
    int rc = fetch_registry(l, cps__now_ms() + (uint64_t)l->timeout_ms, &rx);
    if (rc != 0) {
        cps__log(CPS_LOG_ERROR, SUB, "no answer from the scheduler at %s within %.0f s", scheduler,
                 l->timeout_ms / 1000.0);
        return rc;
    }
    size_t used = 0;
    rc = cps__view_decode_prefix(rx.payload, rx.len, &l->view, &used);
    const unsigned char *p = (const unsigned char *)rx.payload + used;
    size_t left = rc == 0 && rx.len >= used + 8 ? rx.len - used - 8 : 0;
    uint32_t n = rc == 0 && rx.len >= used + 8 ? cps__le32_get(p) : 0;
    if (rc == 0 && rx.len < used + 8)
        rc = CPS_EPROTO;
    l->started = (int)rx.hdr.aux;
    free(l->descs);
    l->descs = calloc(n ? n : 1, sizeof *l->descs);
    if (rc == 0 && !l->descs)
        rc = CPS_ENOMEM;
    p += 8;
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        size_t u;
        rc = cps__wire_tensor_desc_decode(p, left, &l->descs[i], &u);
        p += u;
        left -= u;
    }
    l->ndescs = rc == 0 ? n : 0;
    /* The workers' marker is no server tensor: every use of descs below is of the servers'. */
    l->has_local = 0;
    for (uint32_t i = 0; i < l->ndescs;)
        if (l->descs[i].kind == CPS_DESC_LOCAL) {
            l->has_local = 1;
            l->descs[i] = l->descs[--l->ndescs];
        } else {
            i++;
        }
    cps__rx_free(&rx);
    if (rc != 0)
        cps__log(CPS_LOG_ERROR, SUB, "malformed registry from the scheduler: %s", cps_strerror(rc));
    else if (!l->started || l->view.nranges == 0)
        rc = CPS_EUNAVAILABLE;
    if (rc == CPS_EUNAVAILABLE && !l->said_not_started++)
        cps__log(CPS_LOG_INFO, SUB,
                 "the job at %s has not started (its servers are not all "
                 "there yet)",
                 scheduler);
    if (rc == 0)
        rc = connect_servers(l);
    return rc;
}

static int tensor_layout(const link *l, const cps__tensor_desc *d, cps_tensor *t)
{
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", d->name);
    t->length = d->length;
    t->rows = d->kind ? d->rows : 0;
    t->cols = d->kind ? d->cols : 0;
    t->hash = cps__hash64(d->name, strlen(d->name));
    t->spec = d->spec;
    return cps__layout_tensor(t, &l->view);
}

/* The pieces of a tensor (one per key), in element order. */
typedef struct piece {
    uint64_t off; /* first element within the tensor */
    uint64_t key;
    uint32_t len;
    uint32_t range;
} piece;

static int piece_cmp(const void *a, const void *b)
{
    const piece *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

static piece *tensor_pieces(const cps_tensor *t, size_t *n)
{
    size_t total = 0;
    for (uint32_t i = 0; i < t->nparts; i++)
        total += t->parts[i].nkeys;
    piece *p = calloc(total ? total : 1, sizeof *p);
    if (!p)
        return NULL;
    size_t k = 0;
    for (uint32_t i = 0; i < t->nparts; i++)
        for (uint32_t j = 0; j < t->parts[i].nkeys; j++)
            p[k++] = (piece){t->parts[i].src_off[j], t->parts[i].keys[j], t->parts[i].lens[j],
                             t->parts[i].range};
    qsort(p, total, sizeof *p, piece_cmp);
    *n = total;
    return p;
}

/* ---- export ---- */

/* need[r] = 1 for every range holding a key of some registered tensor. A range with none (a
 * small model on many servers) never advances its sync step, so a cut must not wait for it;
 * it has nothing to give. Errors: CPS_ENOMEM, layout errors. */
static int needed_ranges(const link *l, unsigned char *need)
{
    memset(need, 0, l->view.nranges ? l->view.nranges : 1);
    for (uint32_t i = 0; i < l->ndescs; i++) {
        cps_tensor t;
        int rc = tensor_layout(l, &l->descs[i], &t);
        if (rc != 0)
            return rc;
        for (uint32_t k = 0; k < t.nparts; k++)
            if (t.parts[k].nkeys && t.parts[k].range < l->view.nranges)
                need[t.parts[k].range] = 1;
        cps__parts_free(t.parts, t.nparts);
    }
    return 0;
}

typedef struct cut {
    uint64_t id;
    uint64_t step; /* asked for (0: now) */
    uint32_t nranges;
    int *open;         /* per range: a read view serves it (its reader) */
    uint64_t *seq;     /* per range: its sequence number at the cut */
    uint64_t *at_step; /* per range: the step it reports */
    uint32_t *gen;     /* per range: how many readers it had (reads sent to an older one: again) */
    uint32_t *node;    /* per range: its reader */
    cps__cutroute *route; /* which replica's view each range is read from (recovery/cutroute.h) */
    int lost;             /* a range's cut could not be had: why (cutroute's CPS_CR_LOST) */
    uint32_t lost_range;
    uint64_t lost_step;
} cut;

typedef struct export_ctx {
    link *l;
    cut *c;
    const cps__tensor_desc *d;
    piece *pieces;
    size_t npieces;
    uint32_t slot; /* 0 values, k: optimizer slot k-1 */
    int steps;     /* fill optimizer step counts (U64) instead of values */
    int rc;
    struct dense_stream *ds; /* dense values or state: the reads in flight (NULL before) */
} export_ctx;

typedef struct read_req {
    uint64_t req;
    uint32_t range;
    uint64_t lo, hi, first, count;
    size_t dest;      /* element index in the fill buffer of key lo's first value */
    size_t dest_step; /* distance between consecutive keys' values in the buffer */
    uint32_t node;    /* the reader it was sent to */
    uint32_t gen;     /* ... the range's gen then */
} read_req;

static int match_req(const cps__rx *rx, const void *arg)
{
    const read_req *q = arg;
    if (!(rx->hdr.flags & CPS_WF_REPLY) || rx->hdr.range != q->range || rx->hdr.sender != q->node)
        return 0;
    /* A read view the server had to close answers every read that way (req_seq UINT64_MAX). */
    if (rx->hdr.type == CPS_MSG_ERROR && rx->hdr.req_seq == UINT64_MAX)
        return 1;
    return rx->hdr.req_seq == q->req &&
           (rx->hdr.type == CPS_MSG_CUT_READ || rx->hdr.type == CPS_MSG_ERROR);
}

static int route_look(link *l, cut *c);
static int route_do(link *l, cut *c, const cps__cr_action *a, int n);
static int absorb_opens(link *l, cut *c);

static int send_read(export_ctx *x, read_req *q)
{
    unsigned char p[40] = {0};
    cps__le64_put(p, q->lo);
    cps__le64_put(p + 8, q->hi);
    cps__le32_put(p + 16, x->slot);
    cps__le64_put(p + 24, q->first);
    cps__le64_put(p + 32, q->count);
    q->req = ++x->l->next_req;
    q->node = cps__cutroute_reader(x->c->route, q->range);
    q->gen = x->c->gen[q->range];
    cps__msg_hdr h = {.type = CPS_MSG_CUT_READ,
                      .sender = UINT32_MAX,
                      .range = q->range,
                      .req_seq = q->req,
                      .aux = x->c->id};
    return cps__msg_send(x->l->tp, CUT_PEER_BASE + q->range, &h, p, sizeof p);
}

/* The answer to read q. While it has not come the exporter watches the range's reader: one whose
 * process is gone (its connection refuses), or whose view closed, hands the range to another
 * replica's view at the same sequence number (recovery/cutroute.h), and q (with every other read
 * sent to the old reader) goes there again; a range no view is left for fails the export at once
 * (CPS_EAGAIN: cut again; CPS_EUNAVAILABLE: no replica). */
static int read_take(export_ctx *x, read_req *q, cps__rx *out)
{
    link *l = x->l;
    cut *c = x->c;
    uint32_t r = q->range;
    int wait = l->timeout_ms < READ_WAIT_MS ? l->timeout_ms : READ_WAIT_MS;
    uint64_t now = cps__now_ms(), deadline = now + (uint64_t)wait, look = now + LOOK_MS;
    for (;;) {
        int rc = 0;
        if (c->lost)
            return c->lost;
        if (q->gen != c->gen[r] && (rc = send_read(x, q)) != 0)
            return rc;
        rc = take(l, match_req, q, now + GONE_MS < deadline ? now + GONE_MS : deadline, out);
        if (rc == 0 && out->hdr.type == CPS_MSG_ERROR && out->hdr.req_seq == UINT64_MAX) {
            cps__rx_free(out);
            cps__log(CPS_LOG_INFO, SUB, "range %u: node %u closed its read view", r, q->node);
            const cps__cr_action *a;
            int n = cps__cutroute_closed(c->route, r, q->node, &a);
            if ((rc = route_do(l, c, a, n)) != 0)
                return rc;
            now = cps__now_ms();
            continue;
        }
        if (rc != CPS_ETIMEDOUT)
            return rc;
        now = cps__now_ms();
        if (now >= deadline) {
            cps__log(CPS_LOG_ERROR, SUB, "tensor %s: no answer from range %u's read view in %.0f s",
                     x->d->name, r, wait / 1000.0);
            return rc;
        }
        if ((rc = absorb_opens(l, c)) != 0)
            return rc;
        if (cps__tp_peer_gone(l->tp, CUT_PEER_BASE + r) &&
            cps__cutroute_reader(c->route, r) == q->node) {
            /* Its view went with its process (or its thread): no need to wait for the view. */
            cps__log(CPS_LOG_INFO, SUB, "range %u: node %u's read view is gone", r, q->node);
            const cps__cr_action *a;
            int n = cps__cutroute_closed(c->route, r, q->node, &a);
            if ((rc = route_do(l, c, a, n)) != 0)
                return rc;
        } else if (now >= look) {
            if ((rc = route_look(l, c)) != 0 && rc != CPS_ETIMEDOUT)
                return rc;
            look = cps__now_ms() + LOOK_MS;
        }
    }
}

static int finish_read(export_ctx *x, read_req *q, void *buf);
typedef struct window window;
static int window_drain(export_ctx *x, window *w, void *buf);

static int finish_read(export_ctx *x, read_req *q, void *buf)
{
    cps__rx rx;
    int rc = read_take(x, q, &rx);
    if (rc != 0)
        return rc;
    uint64_t nkeys = q->hi - q->lo + 1;
    size_t head = 8 + cps__pad8(nkeys * 12);
    if (rx.hdr.type == CPS_MSG_ERROR) {
        rc = rx.hdr.status ? rx.hdr.status : CPS_EPROTO;
        cps__log(CPS_LOG_ERROR, SUB, "tensor %s: range %u refused a read: %s", x->d->name, q->range,
                 cps_strerror(rc));
    } else if (rx.len != head + nkeys * q->count * sizeof(float) ||
               cps__le32_get(rx.payload) != nkeys) {
        rc = CPS_EPROTO;
        cps__log(CPS_LOG_ERROR, SUB, "tensor %s: malformed read answer from range %u", x->d->name,
                 q->range);
    } else {
        const unsigned char *p = rx.payload;
        for (uint64_t i = 0; i < nkeys; i++) {
            if (x->steps) {
                uint64_t st = cps__le64_get(p + 8 + i * 8);
                memcpy((uint64_t *)buf + q->dest + i * q->dest_step, &st, sizeof st);
            } else {
                memcpy((float *)buf + q->dest + i * q->dest_step,
                       p + head + i * q->count * sizeof(float), q->count * sizeof(float));
            }
        }
    }
    cps__rx_free(&rx);
    return rc;
}

/* Reads in flight, answered oldest first: a new one goes out as soon as the oldest is in, so
 * the servers always have READ_WINDOW to work on (a window drained whole before the next
 * started idled them while its last answers came in). */
struct window {
    read_req q[READ_WINDOW];
    size_t head, n;
};

static int window_drain(export_ctx *x, window *w, void *buf)
{
    int rc = 0;
    /* After the first failure the export is over: do not wait for the other answers. */
    for (; w->n && rc == 0; w->n--, w->head = (w->head + 1) % READ_WINDOW)
        rc = finish_read(x, &w->q[w->head], buf);
    w->n = 0;
    return rc;
}

static int window_add(export_ctx *x, window *w, read_req q, void *buf)
{
    if (w->n == READ_WINDOW) {
        int rc = finish_read(x, &w->q[w->head], buf);
        w->head = (w->head + 1) % READ_WINDOW;
        w->n--;
        if (rc != 0)
            return rc;
    }
    int rc = send_read(x, &q);
    if (rc != 0)
        return rc;
    w->q[(w->head + w->n) % READ_WINDOW] = q;
    w->n++;
    return 0;
}

/* ---- dense tensors: a stream of reads per tensor slot ----
 *
 * Pieces (keys) of a dense tensor alternate between the ranges; within a range they have
 * consecutive keys and one length, so one CUT_READ takes several. Each range keeps READ_AHEAD
 * reads in flight, in its pieces' order; the fills take the answers in element order, copying
 * from each answer straight into the writer's buffer, and send a range its next read as soon as
 * one of its answers is used up, so the servers keep working while the disk writes. */

typedef struct dense_req {
    uint64_t req;
    uint32_t node, gen;    /* as read_req's */
    uint32_t j0, m;        /* its range's pieces j0 .. j0+m-1 (a piece larger than READ_BYTES: m
                            * = 1 and a slice of it) */
    uint64_t first, count; /* elements first..first+count-1 of each of those keys */
    uint32_t k;            /* keys of the answer used up */
    int have;              /* the answer is in rx */
    cps__rx rx;
} dense_req;

typedef struct dense_range {
    uint32_t *rp; /* indices into the pieces of the ones this range holds, in element order */
    uint32_t n;
    uint32_t next;       /* the next piece to ask for */
    uint64_t next_first; /* ... from this element of it (a large piece, in slices) */
    dense_req q[READ_AHEAD];
    uint32_t head, len, ahead; /* ahead: how many this range keeps in flight */
} dense_range;

typedef struct dense_stream {
    dense_range *r; /* per range of the view */
    uint32_t nr;
    size_t ci;    /* the piece holding the next element */
    uint64_t pos; /* the next element a fill asks for */
} dense_stream;

static void dense_free(export_ctx *x)
{
    dense_stream *s = x->ds;
    if (!s)
        return;
    for (uint32_t r = 0; r < s->nr; r++) {
        dense_range *g = &s->r[r];
        for (uint32_t i = 0; i < g->len; i++) {
            dense_req *d = &g->q[(g->head + i) % READ_AHEAD];
            if (d->have)
                cps__rx_free(&d->rx);
        }
        free(g->rp);
    }
    free(s->r);
    free(s);
    x->ds = NULL;
}

/* Keep g->ahead reads in flight for range r (fewer near its end). */
static int dense_issue(export_ctx *x, dense_range *g, uint32_t r)
{
    const uint64_t max = READ_BYTES / sizeof(float);
    while (g->len < g->ahead && g->next < g->n) {
        const piece *p = &x->pieces[g->rp[g->next]];
        dense_req *d = &g->q[(g->head + g->len) % READ_AHEAD];
        memset(d, 0, sizeof *d);
        d->j0 = g->next;
        d->m = 1;
        if (g->next_first > 0 || p->len > max) {
            d->first = g->next_first;
            d->count = p->len - d->first < max ? p->len - d->first : max;
            g->next_first += d->count;
            if (g->next_first == p->len) {
                g->next++;
                g->next_first = 0;
            }
        } else {
            while (g->next + d->m < g->n && (uint64_t)(d->m + 1) * p->len <= max) {
                const piece *q = &x->pieces[g->rp[g->next + d->m]];
                if (q->key != p->key + d->m || q->len != p->len)
                    break;
                d->m++;
            }
            d->count = p->len;
            g->next += d->m;
        }
        read_req q = {0, r, p->key, p->key + d->m - 1, d->first, d->count, 0, 0, 0, 0};
        int rc = send_read(x, &q);
        if (rc != 0)
            return rc;
        d->req = q.req;
        d->node = q.node;
        d->gen = q.gen;
        g->len++;
    }
    return 0;
}

static int dense_open(export_ctx *x)
{
    uint32_t nr = x->l->view.nranges;
    dense_stream *s = calloc(1, sizeof *s);
    if (!s || !(s->r = calloc(nr ? nr : 1, sizeof *s->r))) {
        free(s);
        return CPS_ENOMEM;
    }
    s->nr = nr;
    x->ds = s;
    uint32_t ahead = nr ? READ_TOTAL / nr : READ_AHEAD;
    ahead = ahead < 2 ? 2 : ahead > READ_AHEAD ? READ_AHEAD : ahead;
    for (uint32_t r = 0; r < nr; r++)
        s->r[r].ahead = ahead;
    for (size_t i = 0; i < x->npieces; i++)
        if (x->pieces[i].range >= nr)
            return CPS_EPROTO;
    for (size_t i = 0; i < x->npieces; i++)
        s->r[x->pieces[i].range].n++;
    for (uint32_t r = 0; r < nr; r++) {
        if (!(s->r[r].rp = calloc(s->r[r].n ? s->r[r].n : 1, sizeof *s->r[r].rp)))
            return CPS_ENOMEM;
        s->r[r].n = 0;
    }
    for (size_t i = 0; i < x->npieces; i++) {
        dense_range *g = &s->r[x->pieces[i].range];
        g->rp[g->n++] = (uint32_t)i;
    }
    int rc = 0;
    for (uint32_t r = 0; rc == 0 && r < nr; r++)
        rc = dense_issue(x, &s->r[r], r);
    return rc;
}

/* The answer of range r's oldest read, checked. */
static int dense_take(export_ctx *x, uint32_t r, dense_req *d)
{
    const piece *p = &x->pieces[x->ds->r[r].rp[d->j0]];
    read_req q = {d->req, r, p->key, p->key + d->m - 1, d->first, d->count, 0, 0, d->node, d->gen};
    uint64_t t0 = cps__now_us();
    int rc = read_take(x, &q, &d->rx);
    x->l->read_wait_us += cps__now_us() - t0;
    d->req = q.req;
    d->node = q.node;
    d->gen = q.gen;
    if (rc != 0)
        return rc;
    d->have = 1;
    size_t head = 8 + cps__pad8((size_t)d->m * 12);
    if (d->rx.hdr.type == CPS_MSG_ERROR) {
        rc = d->rx.hdr.status ? d->rx.hdr.status : CPS_EPROTO;
        cps__log(CPS_LOG_ERROR, SUB, "tensor %s: range %u refused a read: %s", x->d->name, r,
                 cps_strerror(rc));
    } else if (d->rx.len != head + (size_t)d->m * d->count * sizeof(float) ||
               cps__le32_get(d->rx.payload) != d->m) {
        rc = CPS_EPROTO;
        cps__log(CPS_LOG_ERROR, SUB, "tensor %s: malformed read answer from range %u", x->d->name,
                 r);
    }
    return rc;
}

/* Elements first..first+n-1 of a dense tensor's values or state (fills come in order). */
static int dense_fill(export_ctx *x, uint64_t first, float *buf, size_t n)
{
    int rc = x->ds ? 0 : dense_open(x);
    dense_stream *s = x->ds;
    if (rc == 0 && first != s->pos)
        rc = CPS_EPROTO;
    uint64_t end = first + n;
    while (rc == 0 && s->pos < end) {
        while (s->ci < x->npieces && x->pieces[s->ci].off + x->pieces[s->ci].len <= s->pos)
            s->ci++;
        const piece *p = s->ci < x->npieces ? &x->pieces[s->ci] : NULL;
        dense_range *g = p ? &s->r[p->range] : NULL;
        dense_req *d = g && g->len ? &g->q[g->head] : NULL;
        /* The layout covers the tensor without gaps, and a range's reads go in its order. */
        if (!d || p->off > s->pos || g->rp[d->j0 + d->k] != s->ci) {
            rc = CPS_EPROTO;
            break;
        }
        if (!d->have && (rc = dense_take(x, p->range, d)) != 0)
            break;
        uint64_t a = p->off + d->first, b = a + d->count; /* this piece's elements in it */
        uint64_t e = b < end ? b : end;
        const unsigned char *src = (const unsigned char *)d->rx.payload + 8 +
                                   cps__pad8((size_t)d->m * 12) +
                                   ((size_t)d->k * d->count + (s->pos - a)) * sizeof(float);
        memcpy(buf + (s->pos - first), src, (e - s->pos) * sizeof(float));
        s->pos = e;
        if (e == b && ++d->k == d->m) {
            cps__rx_free(&d->rx);
            d->have = 0;
            g->head = (g->head + 1) % READ_AHEAD;
            g->len--;
            rc = dense_issue(x, g, p->range);
        }
    }
    if (rc == CPS_EPROTO && x->ds && s->pos < end)
        cps__log(CPS_LOG_ERROR, SUB, "tensor %s: the reads do not cover element %" PRIu64,
                 x->d->name, s->pos);
    if (rc != 0 || (s && s->pos == x->d->length))
        dense_free(x); /* done (or failed): nothing is left in flight */
    return rc;
}

/* Fill elements first..first+n-1 (values or optimizer state), or, with x->steps, the step
 * counts of rows first..first+n-1 (tables) or of the whole tensor (dense: one element). */
static int export_fill(void *arg, uint64_t first, void *buf, size_t n)
{
    export_ctx *x = arg;
    const cps__tensor_desc *d = x->d;
    window w = {.head = 0, .n = 0};
    int rc = 0;
    uint64_t end = first + n;
    if (d->kind == 0 && !x->steps)
        return dense_fill(x, first, buf, n);
    if (d->kind == 0) {
        /* A dense tensor's chunks take every step together: chunk 0 speaks for all. */
        read_req q = {0, x->pieces[0].range, x->pieces[0].key, x->pieces[0].key, 0, 0, 0, 1, 0, 0};
        rc = window_add(x, &w, q, buf);
    } else {
        /* Row i of a table lives in range (h + i) mod nr under key base + i / nr: the rows of
         * one range are every nr-th row, with consecutive keys, read in one request. */
        uint64_t unit = x->steps ? 1 : d->cols; /* buffer elements per row */
        uint64_t count = x->steps ? 0 : d->cols;
        uint32_t nr = x->l->view.nranges;
        uint64_t ra = first / unit, rb = (end + unit - 1) / unit, wa = ra, wb = rb;
        if (first % unit) { /* a row cut by the fill's start */
            const piece *p = &x->pieces[ra];
            uint64_t s0 = first - ra * unit, s1 = end - ra * unit < unit ? end - ra * unit : unit;
            read_req q = {0, p->range, p->key, p->key, s0, s1 - s0, 0, 0, 0, 0};
            rc = window_add(x, &w, q, buf);
            wa = ra + 1;
        }
        if (rc == 0 && end % unit && rb - 1 >= wa) { /* a row cut by its end */
            const piece *p = &x->pieces[rb - 1];
            read_req q = {
                0, p->range, p->key, p->key, 0, end - (rb - 1) * unit, (rb - 1) * unit - first,
                0, 0,        0};
            rc = window_add(x, &w, q, buf);
            wb = rb - 1;
        }
        for (uint32_t m = 0; rc == 0 && m < nr && wa + m < wb; m++) {
            for (uint64_t r0 = wa + m; rc == 0 && r0 < wb;) {
                uint64_t cnt = (wb - r0 + nr - 1) / nr;
                cnt = cnt > 65536 ? 65536 : cnt;
                const piece *p = &x->pieces[r0];
                read_req q = {0,
                              p->range,
                              p->key,
                              p->key + cnt - 1,
                              0,
                              count,
                              r0 * unit - first,
                              (size_t)(nr * unit),
                              0,
                              0};
                rc = window_add(x, &w, q, buf);
                r0 += cnt * nr;
            }
        }
    }
    int rc2 = window_drain(x, &w, buf);
    return rc ? rc : rc2;
}

static int match_open(const cps__rx *rx, const void *arg)
{
    const cut *c = arg;
    return (rx->hdr.flags & CPS_WF_REPLY) && rx->hdr.aux == c->id &&
           (rx->hdr.type == CPS_MSG_CUT_OPEN || rx->hdr.type == CPS_MSG_ERROR);
}

static int is_probe_reply(const cps__rx *rx)
{
    return (rx->hdr.flags & CPS_WF_REPLY) &&
           (rx->hdr.type == CPS_MSG_CUT_PROBE || rx->hdr.type == CPS_MSG_ERROR);
}

/* A probe of the export's round *arg. */
static int match_probe(const cps__rx *rx, const void *arg)
{
    const uint32_t *round = arg;
    return is_probe_reply(rx) && rx->hdr.req_worker == *round;
}

static uint32_t tail_of(const link *l, uint32_t r)
{
    const cps__range *g = &l->view.ranges[r];
    return g->chain_len ? g->chain[g->chain_len - 1] : 0;
}

/* The view again, and what it changes for the cut (a replica gone, one to ask). CPS_ETIMEDOUT:
 * the scheduler did not answer (it may be restarting): the caller looks again later. */
static int route_look(link *l, cut *c)
{
    int rc = link_refresh_view(l);
    if (rc != 0 || !c || !c->route)
        return rc;
    const cps__cr_action *a;
    int n = cps__cutroute_view(c->route, &l->view, &a);
    return route_do(l, c, a, n);
}

/* 1 if a server of the chains of the view looks gone (its connection refuses): the view will
 * change, so look at it again soon. */
static int chain_gone(link *l)
{
    for (uint32_t r = 0; r < l->view.nranges; r++)
        for (uint32_t k = 0; k < l->view.ranges[r].chain_len; k++)
            if (cps__tp_peer_gone(l->tp, l->view.ranges[r].chain[k]))
                return 1;
    return 0;
}

static void send_close(link *l, cut *c, uint32_t peer, uint32_t r, const char *url)
{
    if (url) {
        peer = CLOSE_PEER + l->closes++;
        if (cps__tp_peer_set(l->tp, peer, url) != 0)
            return; /* the view closes itself when idle (CUT_IDLE_MS) */
    }
    cps__msg_hdr h = {.type = CPS_MSG_CUT_CLOSE, .sender = UINT32_MAX, .range = r, .aux = c->id};
    cps__msg_send(l->tp, peer, &h, NULL, 0);
}

/* Answers of range r's reader `node` still queued: they answered reads that go to the next reader
 * again (each read goes to one reader at a time). */
static void purge(link *l, uint32_t r, uint32_t node)
{
    size_t k = 0;
    for (size_t i = 0; i < l->nin; i++) {
        const cps__msg_hdr *h = &l->in[i].hdr;
        if ((h->flags & CPS_WF_REPLY) && h->range == r && h->sender == node &&
            (h->type == CPS_MSG_CUT_READ || h->type == CPS_MSG_ERROR))
            cps__rx_free(&l->in[i]);
        else
            l->in[k++] = l->in[i];
    }
    l->nin = k;
}

/* Perform what recovery/cutroute decided (n actions, or an error if n < 0). Returns c->lost once a
 * range's cut cannot be had. */
static int route_do(link *l, cut *c, const cps__cr_action *a, int n)
{
    if (n < 0)
        return n;
    for (int i = 0; i < n; i++) {
        uint32_t r = a[i].range, node = a[i].node;
        if (a[i].kind == CPS_CR_ASK) {
            cps__msg_hdr h = {.type = CPS_MSG_CUT_OPEN,
                              .sender = UINT32_MAX,
                              .range = r,
                              .step = c->step,
                              .aux = c->id,
                              .req_seq = ++l->next_req};
            cps__msg_send(l->tp, node, &h, l->hello, l->hello_len);
        } else if (a[i].kind == CPS_CR_READ_FROM) {
            const char *url = cps__cutroute_url(c->route, r, node);
            int rc = url ? cps__tp_peer_set(l->tp, CUT_PEER_BASE + r, url) : CPS_EPROTO;
            if (rc != 0) {
                cps__log(CPS_LOG_ERROR, SUB, "range %u: cannot reach node %u's read view: %s", r,
                         node, cps_strerror(rc));
                return rc;
            }
            if (c->gen[r])
                cps__log(CPS_LOG_INFO, SUB,
                         "range %u: reading the cut from node %u's read view now (sequence "
                         "number %" PRIu64 ")",
                         r, node, cps__cutroute_seq(c->route, r));
            purge(l, r, c->node[r]);
            c->node[r] = node;
            c->open[r] = 1;
            c->gen[r]++;
            c->seq[r] = cps__cutroute_seq(c->route, r);
        } else if (a[i].kind == CPS_CR_LOST) {
            c->lost = a[i].err;
            c->lost_range = r;
            c->lost_step = a[i].step;
            if (a[i].err == CPS_EUNAVAILABLE)
                cps__log(CPS_LOG_ERROR, SUB,
                         "range %u has no live replica in view epoch %" PRIu64
                         ": its keys cannot be exported",
                         r, l->view.epoch);
            else if (a[i].err == CPS_EAGAIN)
                cps__log(CPS_LOG_WARN, SUB,
                         "range %u: every replica that held its read view at the cut is gone", r);
            return c->lost;
        }
    }
    return 0;
}

static void close_one(void *ctx, uint32_t r, uint32_t node)
{
    void **z = ctx;
    link *l = z[0];
    cut *c = z[1];
    if (c->open[r] && c->node[r] == node)
        send_close(l, c, CUT_PEER_BASE + r, r, NULL);
    else if (cps__view_node(&l->view, node) && !cps__tp_peer_gone(l->tp, node))
        /* A server gone from the view, or whose connection refuses, took its views along. */
        send_close(l, c, 0, r, cps__cutroute_url(c->route, r, node));
}

/* Close every read view of the cut (the readers' and the others'). */
static void close_cut(link *l, cut *c)
{
    void *z[2] = {l, c};
    if (c->route)
        cps__cutroute_each_open(c->route, close_one, z);
    cps__cutroute_destroy(c->route);
    c->route = NULL;
    memset(c->open, 0, c->nranges * sizeof *c->open);
}

/* The highest step any range reports (sync jobs: the cut goes there or later). A range's tail that
 * dies before answering is asked again at the next tail, as soon as the view names it. */
static int probe_steps(link *l, uint64_t *hi_out)
{
    uint32_t n = l->view.nranges, got = 0, round = (uint32_t)++l->next_req;
    uint32_t *asked = calloc(n ? n : 1, sizeof *asked); /* the node, 0: to ask; UINT32_MAX: done */
    if (!asked)
        return CPS_ENOMEM;
    uint64_t hi = 0, now = cps__now_ms(), deadline = now + (uint64_t)l->timeout_ms,
             look = now + LOOK_MS;
    int rc = 0;
    while (got < n) {
        for (uint32_t r = 0; rc == 0 && r < n; r++) {
            if (asked[r] == UINT32_MAX || (asked[r] && asked[r] == tail_of(l, r)))
                continue;
            if (!tail_of(l, r)) {
                cps__log(CPS_LOG_ERROR, SUB, "range %u has no live replica in view epoch %" PRIu64,
                         r, l->view.epoch);
                rc = CPS_EUNAVAILABLE;
                break;
            }
            asked[r] = tail_of(l, r);
            cps__msg_hdr h = {
                .type = CPS_MSG_CUT_PROBE, .sender = UINT32_MAX, .range = r, .req_worker = round};
            cps__msg_send(l->tp, asked[r], &h, l->hello, l->hello_len);
        }
        if (rc != 0)
            break;
        now = cps__now_ms();
        if (now >= deadline) {
            cps__log(CPS_LOG_ERROR, SUB, "%u of %u ranges did not say where they are", n - got, n);
            rc = CPS_ETIMEDOUT;
            break;
        }
        cps__rx rx;
        rc = take(l, match_probe, &round, now + GONE_MS < deadline ? now + GONE_MS : deadline, &rx);
        if (rc == CPS_ETIMEDOUT) {
            rc = 0;
            int gone = chain_gone(l);
            if (gone || cps__now_ms() >= look) {
                int vrc = route_look(l, NULL);
                if (vrc != 0 && vrc != CPS_ETIMEDOUT) {
                    rc = vrc;
                    break;
                }
                look = cps__now_ms() + (gone ? GONE_MS : LOOK_MS);
            }
            continue;
        }
        if (rc != 0)
            break;
        uint32_t r = rx.hdr.range;
        int err = rx.hdr.type == CPS_MSG_ERROR ? (rx.hdr.status ? rx.hdr.status : CPS_EPROTO) : 0;
        uint64_t at = rx.hdr.aux;
        cps__rx_free(&rx);
        if (r >= n || asked[r] == UINT32_MAX)
            continue; /* a repeat */
        if (err == CPS_ESTALE_EPOCH) {
            asked[r] = 0; /* not there any more: the view, then its tail */
            if ((rc = route_look(l, NULL)) == CPS_ETIMEDOUT)
                rc = 0;
            continue;
        }
        if (err != 0) {
            cps__log(CPS_LOG_ERROR, SUB, "range %u's probe refused: %s", r, cps_strerror(err));
            rc = err;
            break;
        }
        hi = at > hi ? at : hi;
        asked[r] = UINT32_MAX;
        got++;
    }
    free(asked);
    if (rc == 0)
        *hi_out = hi;
    return rc;
}

/* Where a sync job is and how fast it goes: two probes AIM_GAP_MS apart. The cut goes far enough
 * ahead that the opens reach every tail before the job gets there: an unpaced job of a small
 * model runs thousands of steps a second, and a cut a few steps ahead of it was always late. */
typedef struct aim {
    uint64_t hi;    /* the furthest step a range reported at the last probe */
    double rate;    /* steps per second between the probes */
    double rtt_ms;  /* the last probe's round trip */
    double lead_ms; /* how far ahead the cut aims, in time */
} aim;

static int probe_timed(link *l, uint64_t *hi, double *rtt_ms)
{
    uint64_t t0 = cps__now_us();
    int rc = probe_steps(l, hi);
    *rtt_ms = (cps__now_us() - t0) / 1000.0;
    return rc;
}

static int aim_measure(link *l, aim *a)
{
    uint64_t hi0;
    double rtt0;
    uint64_t t0 = cps__now_us();
    int rc = probe_timed(l, &hi0, &rtt0);
    /* Wait without a sleep: answers to anything else keep arriving. */
    for (uint64_t until = cps__now_ms() + AIM_GAP_MS; rc == 0 && cps__now_ms() < until;)
        cps__tp_poll(l->tp, (int)(until - cps__now_ms()), on_msg, l, 0);
    uint64_t t1 = cps__now_us();
    if (rc == 0)
        rc = probe_timed(l, &a->hi, &a->rtt_ms);
    if (rc != 0)
        return rc;
    /* Between the midpoints of the two probes. */
    double secs = ((t1 - t0) + (a->rtt_ms - rtt0) * 500.0) / 1e6;
    a->rate = a->hi > hi0 && secs > 0 ? (double)(a->hi - hi0) / secs : 0;
    /* An open travels like a probe; four round trips of slack, for a loaded host. */
    a->lead_ms = 4 * a->rtt_ms > AIM_MIN_MS ? 4 * a->rtt_ms : AIM_MIN_MS;
    return 0;
}

/* The step to cut at: the furthest range's step plus the steps the job makes in lead_ms, and
 * `least` steps ahead at least. A slow job's furthest range may be at that step's boundary
 * right now (its push done, its workers pulling): a cut there opens at once, where one step
 * further would wait for the whole next step. */
static uint64_t aim_step(const aim *a, uint64_t least)
{
    uint64_t ahead = (uint64_t)(a->rate * a->lead_ms / 1000.0);
    return a->hi + (ahead > least ? ahead : least);
}

/* One answer to the cut's CUT_OPENs (consumed): a replica's read view opened, or its refusal. */
static int on_open_answer(link *l, cut *c, cps__rx *rx, uint64_t *past)
{
    uint32_t r = rx->hdr.range, node = rx->hdr.sender;
    const cps__cr_action *a = NULL;
    int nact = 0;
    if (r >= c->nranges) {
        /* not ours */
    } else if (rx->hdr.type == CPS_MSG_ERROR) {
        int err = rx->hdr.status ? rx->hdr.status : CPS_EPROTO;
        if (err == CPS_EPAST && rx->hdr.step > *past)
            *past = rx->hdr.step;
        nact = cps__cutroute_refused(c->route, r, node, err, rx->hdr.step, &a);
    } else {
        const char *url = rx->payload;
        if (rx->len < 2 || url[rx->len - 1] != 0 || rx->len > CPS_ADDR_MAX) {
            cps__log(CPS_LOG_WARN, SUB, "range %u: malformed read view address from node %u", r,
                     node);
            nact = cps__cutroute_refused(c->route, r, node, CPS_EPROTO, 0, &a);
        } else {
            nact = cps__cutroute_opened(c->route, r, node, rx->hdr.req_seq, url, &a);
            if (!c->at_step[r])
                c->at_step[r] = rx->hdr.step;
            for (int i = 0; i < nact; i++)
                if (a[i].kind == CPS_CR_CLOSE)
                    send_close(l, c, 0, r, url);
        }
    }
    int rc = nact ? route_do(l, c, a, nact) : 0;
    cps__rx_free(rx);
    return rc;
}

/* Open a read view on every range `need` marks at step `step` (0: now): in sync jobs on every
 * replica, which recovery/cutroute.h explains, in the others on the tail. A replica may wait for
 * the step for a long time; meanwhile a server whose connection refuses makes the exporter look at
 * the view at once (every GONE_MS until the view drops it), and the view is looked at every
 * REFRESH_MS anyway: replicas that joined the chains are asked, those that left are forgotten. A
 * range is lost at once when no replica can give it (c->lost; the export cuts again or says
 * why). *past receives the highest step reported by a range that is already past `step`
 * (CPS_EPAST). */
static int open_cut(link *l, cut *c, uint64_t step, const unsigned char *need, int sync,
                    uint64_t *past)
{
    uint32_t n = l->view.nranges;
    close_cut(l, c);
    /* Servers take a second CUT_OPEN of one id as a repeat and answer it no more: two exports
     * started in the same millisecond (the clock and next_req alone) had the same ids, and the
     * second waited out its timeout. Our inbox's address sets them apart. */
    c->id = cps__splitmix64(cps__now_us() ^ cps__hash64(l->hello, l->hello_len) ^ ++l->next_req);
    c->step = step;
    c->lost = 0;
    memset(c->at_step, 0, n * sizeof *c->at_step);
    *past = 0;
    int rc = cps__cutroute_create(n, need, sync, &c->route);
    const cps__cr_action *a;
    if (rc == 0) {
        int nact = cps__cutroute_view(c->route, &l->view, &a);
        rc = route_do(l, c, a, nact);
    }
    uint64_t now = cps__now_ms(), deadline = now + (uint64_t)l->timeout_ms;
    uint64_t look = now + REFRESH_MS;
    int silent = 0;
    while (rc == 0 && !cps__cutroute_ready(c->route)) {
        now = cps__now_ms();
        if (now >= deadline) {
            uint32_t left = 0;
            for (uint32_t r = 0; r < n; r++)
                left += need[r] && !c->open[r];
            cps__log(CPS_LOG_ERROR, SUB,
                     "%u of %u ranges did not open a read view at step %" PRIu64 " within %.0f s",
                     left, n, step, l->timeout_ms / 1000.0);
            rc = CPS_ETIMEDOUT;
            break;
        }
        cps__rx rx;
        rc = take(l, match_open, c, now + GONE_MS < deadline ? now + GONE_MS : deadline, &rx);
        if (rc == CPS_ETIMEDOUT) {
            rc = 0;
            int gone = chain_gone(l);
            if (!gone && cps__now_ms() < look)
                continue;
            int vrc = route_look(l, c);
            /* A job that ended (or whose scheduler is gone) answers nothing more: say so after a
             * few silent asks instead of waiting out the whole timeout. A restarted scheduler
             * answers again within about a second. */
            silent = vrc == CPS_ETIMEDOUT ? silent + 1 : 0;
            if (silent >= SILENT_REFRESHES) {
                cps__log(CPS_LOG_ERROR, SUB,
                         "the scheduler has not answered for %d s while the cut at step %" PRIu64
                         " was not open: the job has ended or its scheduler is down",
                         SILENT_REFRESHES * 2, step);
                rc = CPS_ESHUTDOWN;
                break;
            }
            rc = vrc == CPS_ETIMEDOUT ? 0 : vrc;
            look = cps__now_ms() + (gone ? GONE_MS : REFRESH_MS);
            continue;
        }
        if (rc != 0)
            break;
        if (rx.hdr.type == CPS_MSG_ERROR && rx.hdr.status == CPS_ESTALE_EPOCH)
            look = 0; /* the chain moved: the view, then its replicas */
        rc = on_open_answer(l, c, &rx, past);
    }
    return rc;
}

/* Answers to the cut's opens that came after it was open (the other replicas'): a reader that
 * dies hands its range to one of them. */
static int absorb_opens(link *l, cut *c)
{
    cps__rx rx;
    uint64_t past = 0;
    int rc = 0;
    while (rc == 0 && take(l, match_open, c, 0, &rx) == 0)
        rc = on_open_answer(l, c, &rx, &past);
    return rc;
}

/* ---- the workers' local tensors (worker/localset.h) ---- */

typedef struct local_cut {
    uint32_t node, rank; /* the worker asked */
    uint64_t req;
    int have;            /* rx and blob hold its answer */
    int any;             /* asked for its next boundary, not the cut's step */
    int stepped;         /* its boundary is the cut's step (a job without dense server tensors) */
    cps__lset_asm as;    /* the blob's chunks so far; the blob once complete */
    cps__lset_blob blob; /* decoded from as.buf */
} local_cut;

static void local_reset(local_cut *lc)
{
    cps__lset_blob_fini(&lc->blob);
    cps__lset_asm_fini(&lc->as);
    memset(lc, 0, sizeof *lc);
}

/* The live worker of the lowest rank: in a sync job every worker holds the same bits of its
 * all-reduced tensors, so any one will do, and the lowest is the one the docs name. */
static const cps__node_info *local_worker(const link *l)
{
    const cps__node_info *best = NULL;
    for (uint32_t i = 0; i < l->view.nnodes; i++) {
        const cps__node_info *n = &l->view.nodes[i];
        if (n->role == CPS_ROLE_WORKER && n->alive && (!best || n->rank < best->rank))
            best = n;
    }
    return best;
}

/* 1 if every server tensor is a table (row pushes: no per-step aggregate on the servers). */
static int all_tables(const link *l)
{
    for (uint32_t i = 0; i < l->ndescs; i++)
        if (l->descs[i].kind != 1)
            return 0;
    return 1;
}

/* Ask that worker for its local tensors at boundary `step` (any: its next boundary). */
static int local_ask(link *l, local_cut *lc, uint64_t step, int any)
{
    local_reset(lc);
    const cps__node_info *w = local_worker(l);
    if (!w) {
        cps__log(CPS_LOG_ERROR, SUB,
                 "the job has local (all-reduced) tensors but no live worker to give them");
        return CPS_EUNAVAILABLE;
    }
    lc->node = w->id;
    lc->rank = w->rank;
    lc->any = any;
    lc->req = ++l->next_req;
    int rc = cps__tp_peer_set(l->tp, w->id, w->addr);
    cps__msg_hdr h = {.type = CPS_MSG_LOCAL,
                      .sender = UINT32_MAX,
                      .req_seq = lc->req,
                      .step = step,
                      .aux = any ? 1 : 0};
    if (rc == 0)
        rc = cps__msg_send(l->tp, w->id, &h, l->hello, l->hello_len);
    if (rc != 0)
        cps__log(CPS_LOG_ERROR, SUB, "cannot ask worker %u (rank %u) for its local tensors: %s",
                 w->id, w->rank, cps_strerror(rc));
    return rc;
}

static int match_local(const cps__rx *rx, const void *arg)
{
    const local_cut *lc = arg;
    return rx->hdr.type == CPS_MSG_LOCAL && (rx->hdr.flags & CPS_WF_REPLY) &&
           rx->hdr.req_seq == lc->req;
}

/* Wait for the worker's answer. A worker that dies meanwhile is replaced by the next live one,
 * asked for the same boundary. *past: the worker's boundary when it was past `step`. */
static int local_take(link *l, local_cut *lc, uint64_t step, int any, uint64_t *past)
{
    uint64_t deadline = cps__now_ms() + (uint64_t)l->timeout_ms;
    int rc = 0;
    while (rc == 0 && !lc->have) {
        uint64_t now = cps__now_ms();
        if (now >= deadline) {
            cps__log(CPS_LOG_ERROR, SUB,
                     "worker %u (rank %u) did not give its local tensors of step %" PRIu64
                     " within %.0f s (%" PRIu64 " bytes of them came)",
                     lc->node, lc->rank, step, l->timeout_ms / 1000.0, lc->as.got);
            return CPS_ETIMEDOUT;
        }
        cps__rx rx;
        rc = take(l, match_local, lc, now + LOOK_MS < deadline ? now + LOOK_MS : deadline, &rx);
        if (rc == CPS_ETIMEDOUT) {
            rc = 0;
            if (!cps__tp_peer_gone(l->tp, lc->node))
                continue;
            if ((rc = link_refresh_view(l)) == 0) {
                const cps__node_info *w = local_worker(l);
                if (!w || w->id != lc->node)
                    rc = local_ask(l, lc, step, any);
            }
            continue;
        }
        if (rc != 0)
            break;
        int st = rx.hdr.status, done = 0;
        uint64_t at = rx.hdr.step;
        if (st == 0) {
            done = cps__lset_asm_put(&lc->as, rx.hdr.step, rx.payload, rx.len);
            if (done < 0)
                cps__log(CPS_LOG_ERROR, SUB,
                         "worker %u (rank %u): a bad chunk of its local tensors (%zu bytes at "
                         "%" PRIu64 " of step %" PRIu64 "): %s",
                         lc->node, lc->rank, rx.len, lc->as.got, rx.hdr.step,
                         done == CPS_ESIZE    ? "truncated or past the announced length"
                         : done == CPS_EPROTO ? "lost, repeated or out of order, or of another step"
                                              : cps_strerror(done));
        }
        cps__rx_free(&rx);
        if (st == 0 && done == 0)
            continue;
        if (st == 0 && done == 1) {
            rc = cps__lset_blob_decode(lc->as.buf, (size_t)lc->as.total, &lc->blob);
            if (rc == 0 && !any && lc->blob.step != step) {
                cps__log(CPS_LOG_ERROR, SUB,
                         "worker %u (rank %u) gave its local tensors of step %" PRIu64
                         ", not of step %" PRIu64,
                         lc->node, lc->rank, lc->blob.step, step);
                rc = CPS_EPROTO;
            } else if (rc != 0) {
                cps__log(CPS_LOG_ERROR, SUB,
                         "worker %u (rank %u): malformed local tensors of step %" PRIu64 ": %s",
                         lc->node, lc->rank, step, cps_strerror(rc));
            }
            if (rc == 0) {
                lc->have = 1;
                break;
            }
        } else if (st == 0) {
            rc = done;
        } else if (st == CPS_EPAST) {
            *past = at;
            rc = st;
        } else {
            if (st == CPS_ENOTFOUND)
                cps__log(CPS_LOG_ERROR, SUB,
                         "worker %u (rank %u) lists no local tensors, though the job registered "
                         "some",
                         lc->node, lc->rank);
            else
                cps__log(CPS_LOG_ERROR, SUB,
                         "worker %u (rank %u) could not give its local tensors of step %" PRIu64
                         ": %s",
                         lc->node, lc->rank, step, cps_strerror(st));
            rc = st;
        }
        cps__lset_blob_fini(&lc->blob);
        cps__lset_asm_fini(&lc->as);
    }
    return rc;
}

/* The local tensors into the checkpoint, beside the servers', marked kind/<name> = "local". */
static int local_write(const link *l, const local_cut *lc, cps__ckpt_writer *w)
{
    const cps__lset_blob *b = &lc->blob;
    char key[CPS_CKPT_NAME_MAX], val[32];
    int rc = 0;
    for (uint32_t i = 0; rc == 0 && i < b->ntensors; i++) {
        const cps__lset_tensor *t = &b->tensors[i];
        for (uint32_t j = 0; rc == 0 && j < l->ndescs; j++)
            if (!strcmp(l->descs[j].name, t->name)) {
                cps__log(CPS_LOG_ERROR, SUB,
                         "tensor %s is both on the servers and a worker's local tensor", t->name);
                rc = CPS_EEXIST;
            }
        if (rc == 0)
            rc = cps__ckpt_writer_add(w, t->name, CPS_CKPT_F32, t->ndim, t->dims, t->data);
        snprintf(key, sizeof key, "kind/%s", t->name);
        if (rc == 0)
            rc = cps__ckpt_writer_set_meta(w, key, "local");
    }
    for (uint32_t i = 0; rc == 0 && i < b->nmeta; i++) {
        snprintf(key, sizeof key, "local/meta/%s", b->keys[i]);
        rc = cps__ckpt_writer_set_meta(w, key, b->values[i]);
    }
    snprintf(val, sizeof val, "%" PRIu64, b->step);
    if (rc == 0)
        rc = cps__ckpt_writer_set_meta(w, "local/step", val);
    snprintf(val, sizeof val, "%u", lc->rank);
    if (rc == 0)
        rc = cps__ckpt_writer_set_meta(w, "local/rank", val);
    snprintf(val, sizeof val, "%u", b->ntensors);
    if (rc == 0)
        rc = cps__ckpt_writer_set_meta(w, "local/tensors", val);
    if (rc == 0)
        rc = cps__ckpt_writer_set_meta(w, "local/cut",
                                       lc->stepped ? "the job's step boundary (the workers')"
                                       : lc->any   ? "the worker's next step boundary after the cut"
                                                   : "the servers' step boundary");
    return rc;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(((const cps__tensor_desc *)a)->name, ((const cps__tensor_desc *)b)->name);
}

/* Tell the scheduler the checkpoint is complete, so `chainps status` and /metrics show it. A
 * scheduler that misses it only shows an older checkpoint: the export itself succeeded. */
static int note_done(link *l, const char *path, uint64_t step)
{
    cps__ckpt_note n;
    memset(&n, 0, sizeof n);
    n.step = step;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    n.unix_ms = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
    snprintf(n.path, sizeof n.path, "%s", path);
    unsigned char b[CPS_CKPT_NOTE_FIXED + CPS_CKPT_NOTE_PATH_MAX];
    size_t len = cps__ckpt_note_encode(b, sizeof b, &n);
    cps__msg_hdr h = {.type = CPS_MSG_CKPT_DONE, .sender = UINT32_MAX, .step = step};
    int rc = cps__msg_send(l->tp, SCHED, &h, b, len);
    if (rc != 0)
        cps__log(CPS_LOG_WARN, SUB, "could not tell the scheduler of the checkpoint: %s",
                 cps_strerror(rc));
    return rc;
}

int cps__ckpt_announce(const cps__export_opts *o, const char *path, uint64_t step)
{
    if (!o || !path || !*path)
        return CPS_EINVAL;
    link l;
    int rc = link_open(&l, o->scheduler, o->bind_host, o->advertise, o->key, o->timeout_ms);
    if (rc == 0)
        rc = note_done(&l, path, step);
    link_close(&l); /* waits (bounded) for the note to leave */
    return rc;
}

/* The answers (8 MB each, 64 MB in flight) are allocated by nanomsg's receiving thread and freed
 * by ours. glibc's defaults gave each a fresh mmap or let a trimmed heap fault its pages in
 * again: page faults and zeroing were a third of the export's CPU (perf). Keeping blocks up to
 * 32 MB in the heap, and 256 MB of free heap before giving it back, reuses the same pages. The
 * setting is the process's (the scheduler's, for periodic exports): it only keeps freed memory
 * longer. */
static void keep_heap(void)
{
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
    /* A fresh export process still touched all those pages once, 4 KB at a time: a fault and a
     * zeroing each, a third of its CPU on a VM (perf). warm_heap faults the heap's first pages in
     * as huge pages instead, and nanomsg's thread, which receives some of the answers, allocates
     * from this same heap rather than an arena of its own (it is created after this in an export
     * process). */
    mallopt(M_ARENA_MAX, 1);
}

/* The heap's first pages faulted in as huge pages, once per process, as many as this export will
 * have in flight: READ_TOTAL answers and one more (72 MB), or the whole model with its
 * optimizer state when that is less. A fixed 72 MB cost every export of a small model up to 0.1
 * CPU s of zeroing, which at a low priority on a busy host is seconds of waiting (integration
 * .ckpt_fast, exports at nice 19 beside four busy loops: 2 exports took 23.6 s, now 9.4). */
static void warm_heap(const link *l)
{
    static atomic_int warmed;
    uint64_t bytes = 0, cap = (uint64_t)(READ_TOTAL + 1) * READ_BYTES;
    for (uint32_t i = 0; i < l->ndescs && bytes < cap; i++) {
        const cps__tensor_desc *d = &l->descs[i];
        uint64_t slots = cps__optim_state_slots(d->spec.opt_kind);
        bytes += d->length * sizeof(float) * (1 + slots);
    }
    if (bytes >= PREWARM_MIN_BYTES && !atomic_exchange(&warmed, 1))
        cps__heap_prewarm((size_t)(bytes < cap ? bytes : cap));
}

typedef struct tensor_job {
    cps_tensor t;
    piece *pieces;
    size_t npieces;
    export_ctx ctx[1 + 2 + 1]; /* values, up to two optimizer slots, step counts */
} tensor_job;

static void jobs_free(tensor_job *jobs, uint32_t n)
{
    for (uint32_t i = 0; jobs && i < n; i++) {
        for (size_t k = 0; k < sizeof jobs[i].ctx / sizeof *jobs[i].ctx; k++)
            dense_free(&jobs[i].ctx[k]);
        cps__parts_free(jobs[i].t.parts, jobs[i].t.nparts);
        free(jobs[i].pieces);
    }
    free(jobs);
}

int cps__ckpt_export(const cps__export_opts *o, const char *out, cps__export_result *res)
{
    if (!o || !out || !res)
        return CPS_EINVAL;
    memset(res, 0, sizeof *res);
    static pthread_once_t heap_once = PTHREAD_ONCE_INIT;
    pthread_once(&heap_once, keep_heap);
    uint64_t t0 = cps__now_ms();
    link l;
    cut c = {0};
    local_cut lc = {0};
    tensor_job *jobs = NULL;
    cps__ckpt_writer *w = NULL;
    int rc = link_open(&l, o->scheduler, o->bind_host, o->advertise, o->key, o->timeout_ms);
    if (rc == 0)
        rc = link_registry(&l, o->scheduler);
    uint64_t wait_until = t0 + (uint64_t)(o->timeout_ms > 0 ? o->timeout_ms : 120000);
    while (o->wait_start && (rc == CPS_EUNAVAILABLE || (rc == 0 && !l.ndescs && !l.has_local)) &&
           cps__now_ms() < wait_until) {
        struct timespec pause = {0, 100 * 1000 * 1000};
        nanosleep(&pause, NULL);
        rc = link_registry(&l, o->scheduler);
    }
    if (rc == 0 && l.ndescs == 0 && !l.has_local) {
        cps__log(o->quiet_until_ready ? CPS_LOG_DEBUG : CPS_LOG_ERROR, SUB,
                 "the job has no tensors yet (workers register them when "
                 "they declare them): nothing to export");
        rc = CPS_ENOTFOUND;
    }
    uint32_t n = l.view.nranges;
    if (rc == 0) {
        c.nranges = n;
        size_t nn = n ? n : 1;
        c.open = calloc(nn, sizeof *c.open);
        c.seq = calloc(nn, sizeof *c.seq);
        c.at_step = calloc(nn, sizeof *c.at_step);
        c.gen = calloc(nn, sizeof *c.gen);
        c.node = calloc(nn, sizeof *c.node);
        if (!c.open || !c.seq || !c.at_step || !c.gen || !c.node)
            rc = CPS_ENOMEM;
    }
    /* The cut: sync jobs at a step boundary, the others now. */
    int sync = l.view.mode == CPS_MODE_SYNC;
    /* A sync job with no dense server tensor (every tensor all-reduced, or row-pushed tables
     * beside them) has no step boundary on the servers: their sync steps never advance. Its
     * steps are the workers' (cps_local_commit), so the cut's step comes from the worker asked
     * for the local tensors: exactly at_step (periodic checkpoints), or its next boundary. The
     * tables are then cut as they are when that boundary's tensors have arrived: their pushes
     * are not aligned to steps anyway. Chosen over the rows' push counts, which count pushes,
     * not steps: a table's rows are pushed a varying number of times per step. */
    int local_steps = sync && l.has_local && all_tables(&l);
    if (rc == 0 && sync && o->at_step && !l.has_local && all_tables(&l)) {
        /* Nothing counts this job's steps yet: the workers register their local tensors after
         * declaring the table (a periodic export asks again), or have none (a job of tables
         * alone: no step boundary anywhere; `--checkpoint-every Ns` works). */
        cps__log(o->quiet_until_ready ? CPS_LOG_DEBUG : CPS_LOG_ERROR, SUB,
                 "the job has no dense server tensor and no worker-held tensors (yet): no step "
                 "boundary to cut at step %" PRIu64 " at",
                 o->at_step);
        rc = CPS_ENOTFOUND;
    }
    uint64_t step = 0;
    aim a = {0};
    if (rc == 0 && local_steps) {
        step = o->at_step;
    } else if (rc == 0 && sync) {
        if (o->at_step)
            step = o->at_step;
        else if ((rc = aim_measure(&l, &a)) == 0)
            step = aim_step(&a, 0);
    }
    uint64_t past = 0;
    unsigned char *need = rc == 0 ? calloc(n ? n : 1, 1) : NULL;
    if (rc == 0 && !need)
        rc = CPS_ENOMEM;
    if (rc == 0)
        rc = needed_ranges(&l, need);
    int attempt = 0, cut_try = 0;
again:
    for (; rc == 0; attempt++) {
        /* The workers' local tensors: in a sync job with a dense server tensor, at the cut's
         * step (asked before the cut opens: the workers reach it after the servers, whose acks
         * they wait for); in async jobs at the worker's next step boundary after the cut; in a
         * sync job without a dense server tensor the worker's boundary is the cut's step. */
        if (local_steps) {
            rc = local_ask(&l, &lc, step, step == 0);
            if (rc == 0)
                rc = local_take(&l, &lc, step, step == 0, &past);
            if (rc == 0) {
                step = lc.blob.step;
                lc.stepped = 1;
            }
            if (rc == 0 && l.ndescs)
                rc = open_cut(&l, &c, 0, need, sync, &past);
            break;
        }
        int local_any = !sync;
        if (l.has_local && !local_any)
            rc = local_ask(&l, &lc, step, 0);
        if (rc == 0)
            rc = open_cut(&l, &c, sync ? (step ? step : 0) : 0, need, sync, &past);
        if (rc == 0 && l.has_local && local_any)
            rc = local_ask(&l, &lc, 0, 1);
        if (rc == 0 && l.has_local)
            rc = local_take(&l, &lc, step, local_any, &past);
        if (rc != CPS_EPAST || o->at_step || attempt + 1 >= OPEN_TRIES)
            break;
        /* Training got there first: measure again and aim twice as far ahead. */
        close_cut(&l, &c);
        double lead = a.lead_ms * 2;
        if ((rc = aim_measure(&l, &a)) != 0)
            break;
        a.lead_ms = lead > a.lead_ms ? lead : a.lead_ms;
        a.hi = past > a.hi ? past : a.hi;
        cps__log(CPS_LOG_INFO, SUB,
                 "the job was past step %" PRIu64 " when the cut reached it (at %" PRIu64
                 ", about %.0f steps/s); cutting at step %" PRIu64 " instead (%.0f ms ahead)",
                 step, past, a.rate, aim_step(&a, 1), a.lead_ms);
        step = aim_step(&a, 1);
    }
    if (rc == CPS_EPAST && o->at_step) {
        cps__log(CPS_LOG_ERROR, SUB, "the job is already past step %" PRIu64 " (at %" PRIu64 ")",
                 step, past);
        step = past; /* reported in res->step */
    } else if (rc == CPS_EPAST) {
        cps__log(CPS_LOG_ERROR, SUB,
                 "the job ran past the step the cut aimed at in each of %d tries (the last: step "
                 "%" PRIu64 ", %.0f ms ahead; the job was at %" PRIu64
                 ", about %.0f steps/s, probes taking %.1f ms): the cut's messages reach its "
                 "servers more slowly than the job steps; try again, or give --step",
                 attempt + 1, step, a.lead_ms, past, a.rate, a.rtt_ms);
        step = past;
    }
    uint64_t t_cut = cps__now_ms();
    /* The registry again, now that the cut is open: a cut that waited for its step must hold the
     * tensors declared meanwhile (workers declare while the exporter waits at a job's start). */
    if (rc == 0)
        rc = link_registry(&l, o->scheduler);
    if (rc == 0 && (rc = needed_ranges(&l, need)) == 0)
        for (uint32_t r = 0; r < n; r++)
            if (need[r] && !c.open[r]) {
                /* A tensor declared meanwhile has keys in a range the cut skipped: the export
                 * fails now and is tried again (the periodic thread does) with every range. */
                cps__log(CPS_LOG_WARN, SUB,
                         "range %u got keys while the cut was opened; export again", r);
                rc = CPS_EAGAIN;
                break;
            }
    if (rc == 0 && !sync)
        for (uint32_t r = 0; r < n; r++)
            step = c.at_step[r] > step ? c.at_step[r] : step;
    /* The checkpoint. */
    if (rc == 0)
        warm_heap(&l);
    if (rc == 0)
        rc = cps__ckpt_writer_open(out, o->max_shard_bytes, &w);
    if (rc == 0) {
        qsort(l.descs, l.ndescs, sizeof *l.descs, name_cmp);
        jobs = calloc(l.ndescs, sizeof *jobs);
        if (!jobs)
            rc = CPS_ENOMEM;
    }
    char key[CPS_CKPT_NAME_MAX], val[1024];
    for (uint32_t i = 0; rc == 0 && i < l.ndescs; i++) {
        const cps__tensor_desc *d = &l.descs[i];
        tensor_job *j = &jobs[i];
        if ((rc = tensor_layout(&l, d, &j->t)) != 0)
            break;
        if (!(j->pieces = tensor_pieces(&j->t, &j->npieces))) {
            rc = CPS_ENOMEM;
            break;
        }
        /* The declared shape, so torch's load_state_dict takes the file as it is; optimizer
         * slots have their parameter's shape, as in torch.optim's state. */
        uint64_t shape[CPS_MAX_NDIM];
        uint32_t ndim = cps__tensor_desc_shape(d, shape);
        uint32_t slots = (uint32_t)cps__optim_state_slots(d->spec.opt_kind);
        for (uint32_t k = 0; k <= slots + 1 && rc == 0; k++) {
            export_ctx *x = &j->ctx[k];
            *x = (export_ctx){&l,        &c, d,   j->pieces, j->npieces, k <= slots ? k : 0,
                              k > slots, 0,  NULL};
            if (k == 0) {
                rc = cps__ckpt_writer_add_stream(w, d->name, CPS_CKPT_F32, ndim, shape, export_fill,
                                                 x);
            } else if (k <= slots) {
                if ((rc = cps__ckpt_optim_tensor_name(key, sizeof key, d->spec.opt_kind, k - 1,
                                                      d->name)) == 0)
                    rc = cps__ckpt_writer_add_stream(w, key, CPS_CKPT_F32, ndim, shape, export_fill,
                                                     x);
            } else {
                uint64_t sshape[1] = {d->kind ? d->rows : 1};
                snprintf(key, sizeof key, "%sstep/%s", CPS_CKPT_OPTIM_PREFIX, d->name);
                rc = cps__ckpt_writer_add_stream(w, key, CPS_CKPT_U64, 1, sshape, export_fill, x);
            }
        }
        if (rc == 0 && cps__ckpt_spec_to_json(&d->spec, val, sizeof val) > 0) {
            snprintf(key, sizeof key, "%s%s", CPS_CKPT_META_HPARAM, d->name);
            rc = cps__ckpt_writer_set_meta(w, key, val);
        }
        if (rc == 0) {
            snprintf(key, sizeof key, "kind/%s", d->name);
            rc = cps__ckpt_writer_set_meta(w, key, d->kind ? "table" : "dense");
        }
        res->bytes += d->length * 4 * (1 + slots);
    }
    if (rc == 0) {
        char mode[32];
        snprintf(val, sizeof val, "%" PRIu64, step);
        rc = cps__ckpt_writer_set_meta(w, CPS_CKPT_META_STEP, val);
        snprintf(mode, sizeof mode, "%s",
                 sync                          ? "sync"
                 : l.view.mode == CPS_MODE_SSP ? "ssp"
                                               : "async");
        if (rc == 0)
            rc = cps__ckpt_writer_set_meta(w, "mode", mode);
        if (rc == 0)
            rc = cps__ckpt_writer_set_meta(w, "cut",
                                           local_steps ? "the workers' step boundary"
                                           : sync      ? "step boundary"
                                                       : "per-range sequence number");
        for (uint32_t r = 0; rc == 0 && r < n; r++) {
            snprintf(key, sizeof key, "cut/seq/%u", r);
            snprintf(val, sizeof val, "%" PRIu64, c.seq[r]);
            rc = cps__ckpt_writer_set_meta(w, key, val);
        }
        if (rc == 0 && lc.have)
            rc = local_write(&l, &lc, w);
        if (rc == 0 && l.ndescs == 1 && cps__ckpt_optim_kind_name(l.descs[0].spec.opt_kind))
            rc = cps__ckpt_writer_set_meta(w, CPS_CKPT_META_OPTIM,
                                           cps__ckpt_optim_kind_name(l.descs[0].spec.opt_kind));
    }
    if (rc == 0) {
        rc = cps__ckpt_writer_commit(w, res->path, sizeof res->path);
        w = NULL;
    }
    if (rc == CPS_EAGAIN && c.lost == CPS_EAGAIN && !o->at_step && ++cut_try < CUT_TRIES) {
        /* Every replica that held a range's view at the cut died (a chain of one, or all of
         * it): what was written is dropped, and the job is cut again at a later step. */
        cps__ckpt_writer_abort(w);
        w = NULL;
        jobs_free(jobs, l.ndescs);
        jobs = NULL;
        res->bytes = 0;
        rc = sync && !local_steps ? aim_measure(&l, &a) : 0;
        if (rc == 0) {
            step = sync && !local_steps ? aim_step(&a, 1) : 0;
            cps__log(CPS_LOG_INFO, SUB, "cutting again (try %d of %d)%s", cut_try + 1, CUT_TRIES,
                     sync ? ", at a later step" : "");
            goto again;
        }
    }
    if (rc == CPS_EAGAIN && c.lost == CPS_EAGAIN && o->at_step)
        cps__log(CPS_LOG_ERROR, SUB,
                 "range %u: the replicas that held its read view at step %" PRIu64
                 " are gone, and no other one is at that step",
                 c.lost_range, step);
    if (rc == 0) {
        uint64_t t1 = cps__now_ms();
        cps__log(CPS_LOG_INFO, SUB,
                 "export: cut open after %.2f s; reading and writing %.2f s, of which %.2f s "
                 "waiting for the servers' answers",
                 (t_cut - t0) / 1000.0, (t1 - t_cut) / 1000.0, l.read_wait_us / 1e6);
    }
    if (rc == 0 && !o->no_announce)
        note_done(&l, res->path, step);
    cps__ckpt_writer_abort(w);
    if (c.open)
        close_cut(&l, &c);
    cps__cutroute_destroy(c.route);
    jobs_free(jobs, l.ndescs);
    res->tensors = l.ndescs;
    for (uint32_t i = 0; lc.have && rc == 0 && i < lc.blob.ntensors; i++)
        res->bytes += 4 * lc.blob.tensors[i].numel;
    for (uint32_t i = 0; lc.have && i < lc.blob.ntensors; i++)
        res->tensors += strncmp(lc.blob.tensors[i].name, CPS_CKPT_OPTIM_PREFIX,
                                strlen(CPS_CKPT_OPTIM_PREFIX)) != 0;
    local_reset(&lc);
    res->step = step;
    res->seconds = (double)(cps__now_ms() - t0) / 1000.0;
    free(need);
    free(c.open);
    free(c.seq);
    free(c.at_step);
    free(c.gen);
    free(c.node);
    link_close(&l);
    return rc;
}

/* ---- restore ---- */

typedef struct put_buf {
    unsigned char *buf; /* message: header room + payload */
    size_t used;        /* payload bytes so far (hello prefix included) */
    size_t cap;
} put_buf;

typedef struct restore_ctx {
    link *l;
    put_buf *pb; /* per range */
    size_t base; /* payload offset where entries start */
    int rc;
    /* streaming one tensor's slot */
    piece *pieces;
    size_t npieces;
    uint32_t slot;
    /* Every decision of the restore (passes, targets, answers, silences, looks, tails) is the
     * machine's (recovery/restore.h); this shell reads records, feeds events, performs outputs.
     * tests/sim/restore_tool.c drives the same machine. */
    cps__restore m;
    int stream;     /* the machine said STREAM: a pass's records go out */
    int no_replica; /* failed: a range has no live replica */
} restore_ctx;

static int match_release(const cps__rx *rx, const void *arg)
{
    (void)arg;
    return rx->hdr.type == CPS_MSG_RELEASE && (rx->hdr.flags & CPS_WF_REPLY);
}

/* Tell the scheduler the restore is done, until it says it heard: a message sent just before
 * our transport closes can be lost, and then the held workers waited out their join timeout. */
static int release_workers(link *l)
{
    uint64_t deadline = cps__now_ms() + (uint64_t)l->timeout_ms;
    for (;;) {
        cps__msg_hdr h = {.type = CPS_MSG_RELEASE, .sender = UINT32_MAX, .req_seq = ++l->next_req};
        int rc = cps__msg_send(l->tp, SCHED, &h, l->hello, l->hello_len);
        if (rc != 0 && rc != CPS_EAGAIN)
            return rc;
        cps__rx ack;
        uint64_t now = cps__now_ms(), wait = now + 500 < deadline ? now + 500 : deadline;
        rc = take(l, match_release, NULL, wait, &ack);
        if (rc == 0) {
            cps__rx_free(&ack);
            return 0;
        }
        if (rc != CPS_ETIMEDOUT || cps__now_ms() >= deadline) {
            cps__log(CPS_LOG_ERROR, SUB, "the scheduler did not confirm the workers' release: %s",
                     cps_strerror(rc));
            return rc;
        }
    }
}

static cps__rs_event rs_event(restore_ctx *x, int kind)
{
    cps__rs_event e;
    memset(&e, 0, sizeof e);
    e.kind = kind;
    e.now = cps__now_ms();
    e.gone = chain_gone(x->l);
    return e;
}

/* Send range r's full PUT where the machine says. */
static int send_put(restore_ctx *x, const cps__rs_out *o)
{
    put_buf *b = &x->pb[o->range];
    cps__msg_hdr h = {.type = CPS_MSG_PUT,
                      .sender = UINT32_MAX,
                      .range = o->range,
                      .epoch = o->epoch,
                      .req_seq = o->seq,
                      .payload_len = (uint32_t)b->used,
                      .raw_len = (uint32_t)b->used};
    /* The transport sends whole buffers (nanomsg's zero-copy chunks): one of the exact size. */
    unsigned char *msg = cps__tp_alloc(CPS_WIRE_HDR_SIZE + b->used);
    if (!msg)
        return CPS_ENOMEM;
    /* The head echoes aux in its reply (and req_seq in an ERROR): which PUT it answers. */
    h.aux = h.req_seq;
    cps__wire_hdr_encode(msg, &h);
    memcpy(msg + CPS_WIRE_HDR_SIZE, b->buf + CPS_WIRE_HDR_SIZE, b->used);
    b->used = x->base; /* the hello stays in front */
    int rc = cps__tp_send(x->l->tp, o->to, msg, CPS_WIRE_HDR_SIZE + h.payload_len);
    if (rc != 0) {
        cps__tp_free(msg);
        /* A head whose process is gone: the PUT is lost like those in flight to it, and the
         * range goes again once the view has moved its head. */
        if (!cps__tp_peer_gone(x->l->tp, o->to))
            return rc;
    }
    return 0;
}

static void log_failure(restore_ctx *x, const cps__rs_out *o)
{
    const link *l = x->l;
    switch (o->why) {
    case CPS_RS_WHY_DEADLINE:
        if (o->range == CPS_RR_NONE)
            cps__log(CPS_LOG_ERROR, SUB, "a range head did not take the records within %.0f s",
                     l->timeout_ms / 1000.0);
        else
            cps__log(CPS_LOG_ERROR, SUB,
                     "range %u's tail did not confirm the records within %.0f s", o->range,
                     l->timeout_ms / 1000.0);
        break;
    case CPS_RS_WHY_SILENT:
        cps__log(CPS_LOG_ERROR, SUB,
                 "range %u: node %u left its PUT(s) unanswered for %.0f s (the restore's timeout)",
                 o->range, x->m.book.g[o->range].head, l->timeout_ms / 1000.0);
        break;
    case CPS_RS_WHY_PASSES:
        cps__log(CPS_LOG_ERROR, SUB,
                 "%u range(s) still to stream again after %u passes: the restore gives up",
                 cps__rr_stopped(&x->m.book), x->m.cfg.passes);
        break;
    case CPS_RS_WHY_NO_REPLICA:
        cps__log(CPS_LOG_ERROR, SUB,
                 "range %u has no live replica in view epoch %" PRIu64
                 ": its records cannot be restored",
                 o->range, l->view.epoch);
        x->no_replica = 1;
        break;
    case CPS_RS_WHY_FATAL:
        break; /* logged with the ERROR's text (rs_wait) */
    default:
        cps__log(CPS_LOG_ERROR, SUB, "the restore failed: %s", cps_strerror(o->rc));
        break;
    }
}

/* Feed one event and perform the machine's outputs in order; a GET_VIEW's answer is the next
 * event. Returns the restore's failure (the machine's, or the transport's), 0 otherwise. */
static int rs_feed(restore_ctx *x, cps__rs_event e)
{
    link *l = x->l;
    for (int more = 1; more;) {
        cps__rs_ready o;
        int rc = cps__rs_step(&x->m, &e, &o);
        if (rc != 0)
            return rc;
        more = 0;
        for (uint32_t i = 0; i < o.n; i++) {
            const cps__rs_out *a = &o.out[i];
            switch (a->kind) {
            case CPS_RS_PUT:
                if ((rc = send_put(x, a)) != 0)
                    return rc;
                break;
            case CPS_RS_DISCARD:
                x->pb[a->range].used = x->base; /* what it held goes again in the next pass */
                break;
            case CPS_RS_GET_VIEW: {
                uint64_t epoch = l->view.epoch;
                rc = link_refresh_view(l);
                if (rc == CPS_ETIMEDOUT) { /* off the data path: the answers' deadline decides */
                    e = rs_event(x, CPS_RS_VIEW_NONE);
                } else if (rc != 0) {
                    return rc;
                } else {
                    if (l->view.epoch != epoch)
                        cps__log(CPS_LOG_INFO, SUB, "view epoch %" PRIu64 " during the restore",
                                 l->view.epoch);
                    e = rs_event(x, CPS_RS_VIEW);
                    e.view = &l->view;
                }
                more = 1;
                break;
            }
            case CPS_RS_PROBE_TAIL: {
                cps__msg_hdr h = {
                    .type = CPS_MSG_CUT_PROBE, .sender = UINT32_MAX, .range = a->range};
                cps__msg_send(l->tp, a->to, &h, l->hello, l->hello_len);
                break;
            }
            case CPS_RS_STREAM:
                x->stream = 1;
                break;
            case CPS_RS_FAILED:
                log_failure(x, a);
                return a->rc;
            default:
                break;
            }
        }
    }
    return 0;
}

/* A PUT's answer (a reply; an ERROR naming a PUT of this pass) or a tail probe's (its ERROR
 * carries req_seq 0). */
static int match_answer(const cps__rx *rx, const void *arg)
{
    const uint64_t *seq0 = arg;
    if (!(rx->hdr.flags & CPS_WF_REPLY))
        return 0;
    if (rx->hdr.type == CPS_MSG_PUT || is_probe_reply(rx))
        return rx->hdr.type != CPS_MSG_ERROR || rx->hdr.req_seq == 0 || rx->hdr.req_seq >= *seq0;
    return rx->hdr.type == CPS_MSG_ERROR && rx->hdr.req_seq >= *seq0;
}

/* Wait for what the machine waits for, until its deadline, and feed what came. */
static int rs_wait(restore_ctx *x)
{
    cps__rx rx;
    int rc = take(x->l, match_answer, &x->m.book.seq0, cps__rs_deadline(&x->m), &rx);
    if (rc == CPS_ETIMEDOUT)
        return rs_feed(x, rs_event(x, CPS_RS_TICK));
    if (rc != 0)
        return rc;
    uint32_t r = rx.hdr.range;
    int err = rx.hdr.type == CPS_MSG_ERROR;
    cps__rs_event e;
    if (rx.hdr.type == CPS_MSG_CUT_PROBE || (err && rx.hdr.req_seq == 0)) {
        e = rs_event(x, CPS_RS_PROBE);
        e.ok = !err;
        e.seq = rx.hdr.req_seq;
    } else {
        e = rs_event(x, CPS_RS_ANSWER);
        e.ans =
            (cps__rr_answer){rx.hdr.sender, err, rx.hdr.status, err ? rx.hdr.req_seq : rx.hdr.aux};
        e.seq = err ? 0 : rx.hdr.req_seq;
    }
    e.range = r;
    int open = r < x->m.book.nranges && cps__rr_open(&x->m.book, r);
    rc = rs_feed(x, e);
    if (e.kind == CPS_RS_ANSWER && open && x->m.book.g[r].again)
        cps__log(CPS_LOG_WARN, SUB, "range %u: node %u did not take the records (%s): again", r,
                 rx.hdr.sender, err ? cps_strerror(rx.hdr.status) : "an earlier PUT dropped");
    if (rc != 0 && x->m.why == CPS_RS_WHY_FATAL)
        cps__log(CPS_LOG_ERROR, SUB, "range %u refused the records: %s (%.*s)", r, cps_strerror(rc),
                 (int)(rx.len > 200 ? 200 : rx.len), (const char *)rx.payload);
    cps__rx_free(&rx);
    return rc;
}

/* Range r's message is full, or the pass's records end: the machine sends it, drops it, or
 * holds it until its window has room. */
static int put_flush(restore_ctx *x, uint32_t r)
{
    if (x->pb[r].used <= x->base)
        return 0;
    cps__rs_event e = rs_event(x, CPS_RS_READY);
    e.range = r;
    e.seq = ++x->l->next_req;
    int rc = rs_feed(x, e);
    while (rc == 0 && cps__rs_held(&x->m))
        rc = rs_wait(x);
    return rc;
}

/* Room for `n` more bytes in range r's message. */
static int put_room(restore_ctx *x, uint32_t r, size_t n, unsigned char **at)
{
    put_buf *b = &x->pb[r];
    if (b->used + n > b->cap) {
        int rc = put_flush(x, r);
        if (rc != 0)
            return rc;
    }
    if (b->used + n > b->cap)
        return CPS_ESIZE;
    *at = b->buf + CPS_WIRE_HDR_SIZE + b->used;
    memset(*at, 0, n);
    b->used += n;
    return 0;
}

static int restore_sink(void *arg, uint64_t first, const void *buf, size_t n)
{
    restore_ctx *x = arg;
    const float *v = buf;
    uint64_t end = first + n;
    size_t lo = 0, hi = x->npieces;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (x->pieces[mid].off + x->pieces[mid].len <= first)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (size_t i = lo; i < x->npieces && x->pieces[i].off < end; i++) {
        const piece *p = &x->pieces[i];
        uint64_t s0 = p->off < first ? first : p->off;
        uint64_t s1 = p->off + p->len > end ? end : p->off + p->len;
        while (s0 < s1) {
            /* Slices up to a message's size. */
            uint64_t cnt = s1 - s0, max = (PUT_BYTES - 64) / sizeof(float);
            cnt = cnt > max ? max : cnt;
            unsigned char *at;
            int rc = put_room(x, p->range, cps__ent_slice_size(cnt), &at);
            if (rc != 0)
                return rc;
            cps__ent_put_slice(at, x->slot, p->key, s0 - p->off, cnt, v + (s0 - first));
            s0 += cnt;
        }
    }
    return 0;
}

static const cps__tensor_desc *registry_find(const link *l, const char *name)
{
    for (uint32_t i = 0; i < l->ndescs; i++)
        if (!strcmp(l->descs[i].name, name))
            return &l->descs[i];
    return NULL;
}

/* A worker's local tensor (kind/<name> = "local"): the workers take it back themselves
 * (cps_local_fetch), the servers never hold it. */
static int is_local(const cps__ckpt_reader *rd, const char *name)
{
    char key[CPS_CKPT_NAME_MAX];
    snprintf(key, sizeof key, "kind/%s", name);
    const char *kind = cps__ckpt_reader_meta(rd, key);
    return kind && !strcmp(kind, "local");
}

/* One pass of the restore: every tensor's records to the ranges the machine streams, then
 * STREAMED (the machine then waits for the heads' answers and the tails' confirmation). `bytes`:
 * adds what the checkpoint holds for the servers (NULL: a later pass, which says nothing again). */
static int restore_pass(restore_ctx *x, cps__ckpt_reader *rd, const cps__tensor_desc *want,
                        uint32_t nwant, uint64_t step, const char *from, uint64_t *bytes)
{
    int rc = 0;
    char key[CPS_CKPT_NAME_MAX];
    uint32_t nr = x->l->view.nranges;
    uint64_t *steps = NULL;
    for (uint32_t i = 0; rc == 0 && i < nwant; i++) {
        const cps__tensor_desc *d = &want[i];
        cps_tensor t;
        if ((rc = tensor_layout(x->l, d, &t)) != 0)
            break;
        x->pieces = tensor_pieces(&t, &x->npieces);
        if (!x->pieces)
            rc = CPS_ENOMEM;
        /* Optimizer step counts: per row (tables) or one for the tensor. */
        size_t nsteps = d->kind ? d->rows : 1;
        steps = rc == 0 ? calloc(nsteps, sizeof *steps) : NULL;
        if (rc == 0 && !steps)
            rc = CPS_ENOMEM;
        snprintf(key, sizeof key, "%sstep/%s", CPS_CKPT_OPTIM_PREFIX, d->name);
        const cps__ckpt_tensor *st = rc == 0 ? cps__ckpt_reader_find(rd, key) : NULL;
        if (st)
            rc = cps__ckpt_reader_read(rd, st, steps, nsteps * sizeof *steps);
        /* Create every key (zeros), then stream the values and optimizer state into them. */
        for (size_t k = 0; rc == 0 && k < x->npieces; k++) {
            const piece *p = &x->pieces[k];
            unsigned char *at;
            if ((rc = put_room(x, p->range, CPS_ENT_CREATE_SIZE, &at)) != 0)
                break;
            cps__ent_put_create(at, p->key, p->len, steps[d->kind ? p->off / d->cols : 0],
                                &d->spec);
        }
        uint32_t slots = (uint32_t)cps__optim_state_slots(d->spec.opt_kind);
        for (uint32_t k = 0; rc == 0 && k <= slots; k++) {
            const cps__ckpt_tensor *ct;
            if (k == 0) {
                ct = cps__ckpt_reader_find(rd, d->name);
            } else {
                cps__ckpt_optim_tensor_name(key, sizeof key, d->spec.opt_kind, k - 1, d->name);
                ct = cps__ckpt_reader_find(rd, key);
                if (!ct && bytes)
                    cps__log(CPS_LOG_WARN, SUB, "%s: no %s: that optimizer state starts at zero",
                             from, key);
            }
            x->slot = k;
            if (ct)
                rc = cps__ckpt_reader_stream(rd, ct, restore_sink, x);
        }
        /* Sync jobs: the step the key sets are at, so workers declaring them resume there. */
        for (uint32_t k = 0; rc == 0 && !d->kind && step && k < t.nparts; k++) {
            char name[64];
            int nlen =
                snprintf(name, sizeof name, "agg/%" PRIu32 "/%016" PRIx64, t.parts[k].range,
                         cps__keyset_sig(t.parts[k].keys, t.parts[k].lens, t.parts[k].nkeys));
            unsigned char *at, value[8];
            cps__le64_put(value, step);
            if ((rc = put_room(x, t.parts[k].range, cps__ent_named_size((size_t)nlen, 8), &at)) !=
                0)
                break;
            cps__ent_put_named(at, name, (size_t)nlen, value, 8);
        }
        if (bytes)
            *bytes += d->length * 4 * (1 + slots);
        free(steps);
        steps = NULL;
        free(x->pieces);
        x->pieces = NULL;
        cps__parts_free(t.parts, t.nparts);
    }
    for (uint32_t r = 0; rc == 0 && nwant && r < nr; r++)
        rc = put_flush(x, r);
    if (rc == 0 && nwant)
        rc = rs_feed(x, rs_event(x, CPS_RS_STREAMED));
    return rc;
}

int cps__ckpt_restore(const cps__restore_opts *o, const char *from, cps__restore_result *res)
{
    if (!o || !from || !res)
        return CPS_EINVAL;
    memset(res, 0, sizeof *res);
    uint64_t t0 = cps__now_ms();
    cps__ckpt_reader *rd = NULL;
    link l;
    memset(&l, 0, sizeof l);
    cps__view_init(&l.view);
    restore_ctx x = {0};
    int rc = cps__ckpt_reader_open(from, &rd);
    size_t nt = rc == 0 ? cps__ckpt_reader_count(rd) : 0;
    /* Every checksum first: a corrupt file writes nothing. */
    for (size_t i = 0; rc == 0 && i < nt; i++)
        rc = cps__ckpt_reader_verify(rd, cps__ckpt_reader_tensor(rd, i));
    const char *step_s = rc == 0 ? cps__ckpt_reader_meta(rd, CPS_CKPT_META_STEP) : NULL;
    uint64_t step = step_s ? strtoull(step_s, NULL, 10) : 0;
    /* The parameter tensors and what each needs. */
    cps__tensor_desc *want = rc == 0 ? calloc(nt ? nt : 1, sizeof *want) : NULL;
    uint32_t nwant = 0;
    if (rc == 0 && !want)
        rc = CPS_ENOMEM;
    char key[CPS_CKPT_NAME_MAX];
    for (size_t i = 0; rc == 0 && i < nt; i++) {
        const cps__ckpt_tensor *t = cps__ckpt_reader_tensor(rd, i);
        if (!strncmp(t->name, CPS_CKPT_OPTIM_PREFIX, strlen(CPS_CKPT_OPTIM_PREFIX)) ||
            is_local(rd, t->name))
            continue;
        cps__tensor_desc *d = &want[nwant];
        if (strcmp(t->dtype, "F32") != 0 || t->ndim < 1 || t->ndim > CPS_MAX_NDIM ||
            t->numel == 0 || strlen(t->name) > CPS_TENSOR_NAME_MAX) {
            cps__log(CPS_LOG_ERROR, SUB,
                     "%s: tensor %s is not a non-empty float32 tensor of 1..%d dims with "
                     "a name of at most 255 bytes",
                     t->file, t->name, CPS_MAX_NDIM);
            rc = CPS_EINVAL;
            break;
        }
        snprintf(d->name, sizeof d->name, "%s", t->name);
        snprintf(key, sizeof key, "kind/%s", t->name);
        const char *kind = cps__ckpt_reader_meta(rd, key);
        d->kind = kind && !strcmp(kind, "table") && t->ndim == 2;
        d->length = t->numel;
        d->rows = d->kind ? t->shape[0] : 0;
        d->cols = d->kind ? (uint32_t)t->shape[1] : 0;
        d->ndim = t->ndim;
        memcpy(d->dims, t->shape, t->ndim * sizeof *t->shape);
        snprintf(key, sizeof key, "%s%s", CPS_CKPT_META_HPARAM, t->name);
        const char *hp = cps__ckpt_reader_meta(rd, key);
        if (hp) {
            rc = cps__ckpt_spec_from_json(hp, &d->spec);
            unsigned char blk[CPS_WIRE_SPEC_SIZE];
            if (rc == 0) {
                cps__wire_spec_encode(blk, &d->spec);
                if (cps__wire_spec_decode(blk, &d->spec) != 0) {
                    cps__log(CPS_LOG_ERROR, SUB, "%s: invalid optimizer description for %s: %s",
                             t->file, t->name, hp);
                    rc = CPS_ECORRUPT;
                }
            }
        } else if (o->default_spec) {
            d->spec = *o->default_spec;
        } else {
            cps__log(CPS_LOG_ERROR, SUB,
                     "%s: tensor %s has no optimizer description "
                     "(hparams/%s): give one (--optimizer, --lr)",
                     t->file, t->name, t->name);
            rc = CPS_EINVAL;
        }
        nwant++;
    }
    /* The workers' local tensors are known too: they are theirs to take (cps_local_fetch). */
    const char **names = rc == 0 ? calloc(nt ? nt : 1, sizeof *names) : NULL;
    size_t nnames = 0;
    for (uint32_t i = 0; names && i < nwant; i++)
        names[nnames++] = want[i].name;
    for (size_t i = 0; names && i < nt; i++) {
        const cps__ckpt_tensor *t = cps__ckpt_reader_tensor(rd, i);
        if (is_local(rd, t->name))
            names[nnames++] = t->name;
    }
    if (rc == 0 && !names)
        rc = CPS_ENOMEM;
    if (rc == 0)
        rc = cps__ckpt_reader_check_names(rd, names, nnames);
    /* A job whose every tensor is all-reduced exports only local tensors: nothing for the
     * servers, the workers take them back themselves. */
    if (rc == 0 && nnames == 0) {
        cps__log(CPS_LOG_ERROR, SUB, "%s: no parameter tensors", from);
        rc = CPS_ENOTFOUND;
    }
    /* Optimizer state of an optimizer the tensor does not have is a tensor no one knows. */
    for (size_t i = 0; rc == 0 && i < nt; i++) {
        const cps__ckpt_tensor *t = cps__ckpt_reader_tensor(rd, i);
        if (strncmp(t->name, CPS_CKPT_OPTIM_PREFIX, strlen(CPS_CKPT_OPTIM_PREFIX)) ||
            is_local(rd, t->name))
            continue;
        int known = 0;
        for (uint32_t j = 0; j < nwant && !known; j++) {
            const cps__tensor_desc *d = &want[j];
            uint32_t slots = (uint32_t)cps__optim_state_slots(d->spec.opt_kind);
            for (uint32_t k = 0; k < slots && !known; k++)
                known = cps__ckpt_optim_tensor_name(key, sizeof key, d->spec.opt_kind, k,
                                                    d->name) == 0 &&
                        !strcmp(key, t->name) && t->numel == d->length;
            snprintf(key, sizeof key, "%sstep/%s", CPS_CKPT_OPTIM_PREFIX, d->name);
            known |= !strcmp(key, t->name) && !strcmp(t->dtype, "U64") &&
                     t->numel == (d->kind ? d->rows : 1);
        }
        if (!known) {
            cps__log(CPS_LOG_ERROR, SUB,
                     "%s: tensor %s matches no parameter's optimizer state "
                     "(wrong name, optimizer or size)",
                     t->file, t->name);
            rc = CPS_ENOTFOUND;
        }
    }
    if (rc == 0)
        rc = link_open(&l, o->scheduler, o->bind_host, o->advertise, o->key, o->timeout_ms);
    if (rc == 0)
        rc = link_registry(&l, o->scheduler);
    res->started = rc == 0;
    if (rc == 0 && l.ndescs)
        cps__log(CPS_LOG_WARN, SUB,
                 "the job's workers declared their tensors already: the "
                 "restored values replace what they train on");
    /* A job that already declared tensors must know every one of them, with the same shape. */
    for (uint32_t i = 0; rc == 0 && l.ndescs && i < nwant; i++) {
        const cps__tensor_desc *e = registry_find(&l, want[i].name);
        uint64_t a[CPS_MAX_NDIM], b[CPS_MAX_NDIM];
        uint32_t na = e ? cps__tensor_desc_shape(e, a) : 0,
                 nb = cps__tensor_desc_shape(&want[i], b);
        if (!e || e->length != want[i].length || e->kind != want[i].kind ||
            (e->ndim && (na != nb || memcmp(a, b, na * sizeof *a) != 0))) {
            cps__log(CPS_LOG_ERROR, SUB, "%s: tensor %s %s", from, want[i].name,
                     e ? "has another shape in the running job" : "is not a tensor of the job");
            rc = CPS_ENOTFOUND;
        }
    }
    uint32_t nr = l.view.nranges;
    if (rc == 0) {
        x.l = &l;
        x.base = cps__pad8(8 + l.hello_len);
        x.pb = calloc(nr ? nr : 1, sizeof *x.pb);
        cps__rs_cfg cfg;
        cps__rs_cfg_defaults(&cfg, (uint64_t)l.timeout_ms);
        rc = cps__rs_init(&x.m, &cfg, &l.view, nr, cps__now_ms());
        if (rc == 0 && !x.pb)
            rc = CPS_ENOMEM;
        for (uint32_t r = 0; rc == 0 && r < nr; r++) {
            x.pb[r].cap = PUT_BYTES + x.base;
            x.pb[r].buf = cps__tp_alloc(CPS_WIRE_HDR_SIZE + x.pb[r].cap);
            if (!x.pb[r].buf) {
                rc = CPS_ENOMEM;
                break;
            }
            unsigned char *p = x.pb[r].buf + CPS_WIRE_HDR_SIZE;
            memset(p, 0, x.base);
            cps__le32_put(p, (uint32_t)l.hello_len);
            memcpy(p + 8, l.hello, l.hello_len);
            x.pb[r].used = x.base;
        }
    }
    /* The machine says when a pass streams (STREAM: the first at once, the next ones paced and
     * after a look at the view) and when the restore ends; between passes this waits for what
     * it waits for. Nothing for the servers (only local tensors): nothing to stream. */
    if (rc == 0 && nwant)
        rc = rs_feed(&x, rs_event(&x, CPS_RS_TICK));
    for (uint32_t pass = 0; rc == 0 && nwant && !cps__rs_ended(&x.m);) {
        if (!x.stream) {
            rc = rs_wait(&x);
            continue;
        }
        x.stream = 0;
        uint32_t open = 0;
        for (uint32_t r = 0; r < nr; r++)
            open += cps__rs_open(&x.m, r);
        if (pass > 0)
            cps__log(CPS_LOG_INFO, SUB, "streaming %u range(s) again under view epoch %" PRIu64,
                     open, l.view.epoch);
        rc = restore_pass(&x, rd, want, nwant, step, from, pass++ ? NULL : &res->bytes);
    }
    res->resent = x.m.resent;
    if (rc == 0 && o->release)
        rc = release_workers(&l);
    for (uint32_t r = 0; x.pb && r < nr; r++)
        cps__tp_free(x.pb[r].buf);
    free(x.pb);
    cps__rs_fini(&x.m);
    res->no_replica = x.no_replica;
    free(names);
    free(want);
    res->step = step;
    res->tensors = nwant;
    res->seconds = (double)(cps__now_ms() - t0) / 1000.0;
    cps__ckpt_reader_close(rd);
    link_close(&l);
    return rc;
}
