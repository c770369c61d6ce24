/* Export: the reads of a cut, tables in windows and dense tensors in streams (cluster_int.h). */
#include "checkpoint/cluster_int.h"

/* need[r] = 1 for every range holding a key of some registered tensor. A range with none (a
 * small model on many servers) never advances its sync step, so a cut must not wait for it;
 * it has nothing to give. Errors: CPS_ENOMEM, layout errors. */
int cps__cl_needed_ranges(const link *l, unsigned char *need)
{
    memset(need, 0, l->view.nranges ? l->view.nranges : 1);
    for (uint32_t i = 0; i < l->ndescs; i++) {
        cps_tensor t;
        int rc = cps__cl_tensor_layout(l, &l->descs[i], &t);
        if (rc != 0)
            return rc;
        for (uint32_t k = 0; k < t.nparts; k++)
            if (t.parts[k].nkeys && t.parts[k].range < l->view.nranges)
                need[t.parts[k].range] = 1;
        cps__parts_free(t.parts, t.nparts);
    }
    return 0;
}

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
        rc =
            cps__cl_take(l, match_req, q, now + GONE_MS < deadline ? now + GONE_MS : deadline, out);
        if (rc == 0 && out->hdr.type == CPS_MSG_ERROR && out->hdr.req_seq == UINT64_MAX) {
            cps__rx_free(out);
            cps__log(CPS_LOG_INFO, SUB, "range %u: node %u closed its read view", r, q->node);
            const cps__cr_action *a;
            int n = cps__cutroute_closed(c->route, r, q->node, &a);
            if ((rc = cps__cl_route_do(l, c, a, n)) != 0)
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
        if ((rc = cps__cl_absorb_opens(l, c)) != 0)
            return rc;
        if (cps__tp_peer_gone(l->tp, CUT_PEER_BASE + r) &&
            cps__cutroute_reader(c->route, r) == q->node) {
            /* Its view went with its process (or its thread): no need to wait for the view. */
            cps__log(CPS_LOG_INFO, SUB, "range %u: node %u's read view is gone", r, q->node);
            const cps__cr_action *a;
            int n = cps__cutroute_closed(c->route, r, q->node, &a);
            if ((rc = cps__cl_route_do(l, c, a, n)) != 0)
                return rc;
        } else if (now >= look) {
            if ((rc = cps__cl_route_look(l, c)) != 0 && rc != CPS_ETIMEDOUT)
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

void cps__cl_dense_free(export_ctx *x)
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
        cps__cl_dense_free(x); /* done (or failed): nothing is left in flight */
    return rc;
}

/* Fill elements first..first+n-1 (values or optimizer state), or, with x->steps, the step
 * counts of rows first..first+n-1 (tables) or of the whole tensor (dense: one element). */
int cps__cl_export_fill(void *arg, uint64_t first, void *buf, size_t n)
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
