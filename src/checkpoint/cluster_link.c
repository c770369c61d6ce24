/* Export and restore, talking to the cluster: the link to the scheduler and the servers, and the
 * layout of a registered tensor (cluster_int.h). */
#include "checkpoint/cluster_int.h"

/* ---- talking to the cluster ---- */

void cps__cl_on_msg(void *ctx, void *buf, size_t len)
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

int cps__cl_take(link *l, match_fn match, const void *arg, uint64_t deadline, cps__rx *out)
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
        int rc = cps__tp_poll(l->tp, wait > 100 ? 100 : (int)wait, cps__cl_on_msg, l, 0);
        if (rc < 0)
            return rc;
    }
}

void cps__cl_link_close(link *l)
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

int cps__cl_link_open(link *l, const char *scheduler, const char *bind, const char *advertise,
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
        rc = cps__cl_take(l, match_registry, NULL, until < deadline ? until : deadline, rx);
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
int cps__cl_link_refresh_view(link *l)
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
int cps__cl_link_registry(link *l, const char *scheduler)
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

int cps__cl_tensor_layout(const link *l, const cps__tensor_desc *d, cps_tensor *t)
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

static int piece_cmp(const void *a, const void *b)
{
    const piece *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

piece *cps__cl_tensor_pieces(const cps_tensor *t, size_t *n)
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
