/* The transport's peers (see transport_int.h): a table sorted by id, each peer's NN_PUSH socket
 * connected to its inbox (over ipc:// when it shares our host), its backlog queue, and whether its
 * connection is up. */

#include "transport/transport_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <nanomsg/nn.h>
#include <nanomsg/pipeline.h>

#include "chainps/error.h"
#include "core/array.h"
#include "core/log.h"
#include "transport/local.h"

/* A peer's queue went from empty to not (on) or back. */
static void backlog_note(cps__tp *tp, const tp_peer *p, int on)
{
    if (tp->backlog_fn)
        tp->backlog_fn(tp->backlog_ctx, p->sndfd, on);
}

/* Index of `id` in tp->peers, or the insertion point with *found = 0. */
static size_t peer_index(const cps__tp *tp, uint32_t id, int *found)
{
    size_t lo = 0, hi = tp->npeers;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (tp->peers[mid]->id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = lo < tp->npeers && tp->peers[lo]->id == id;
    return lo;
}

tp_peer *cps__tp_peer_find(const cps__tp *tp, uint32_t id)
{
    int found;
    size_t i = peer_index(tp, id, &found);
    return found ? tp->peers[i] : NULL;
}

static void queue_clear(cps__tp *tp, tp_peer *p)
{
    if (p->qlen)
        backlog_note(tp, p, 0);
    for (size_t i = 0; i < p->qlen; i++)
        nn_freemsg(p->q[(p->qhead + i) % p->qcap].buf);
    tp->queued -= p->qlen;
    p->qlen = 0;
    p->qhead = 0;
    p->qbytes = 0;
}

void cps__tp_peer_free(cps__tp *tp, tp_peer *p)
{
    if (p->qlen)
        cps__log(CPS_LOG_WARN, SUB, "peer %u (%s): dropping %zu queued messages (%zu bytes)", p->id,
                 p->url, p->qlen, p->qbytes);
    queue_clear(tp, p);
    cps__tp_close_sock(p->sock);
    free(p->q);
    free(p->url);
    free(p);
}

int cps__tp_queue_push(cps__tp *tp, tp_peer *p, void *buf, size_t len)
{
    if (p->qlen >= TP_QUEUE_MAX)
        return CPS_EAGAIN;
    if (p->qlen == p->qcap) {
        size_t ncap = p->qcap ? p->qcap * 2 : 16;
        tp_msg *nq = malloc(ncap * sizeof *nq);
        if (!nq)
            return CPS_ENOMEM;
        for (size_t i = 0; i < p->qlen; i++)
            nq[i] = p->q[(p->qhead + i) % p->qcap];
        free(p->q);
        p->q = nq;
        p->qcap = ncap;
        p->qhead = 0;
    }
    p->q[(p->qhead + p->qlen) % p->qcap] = (tp_msg){buf, len};
    if (p->qlen++ == 0)
        backlog_note(tp, p, 1);
    p->qbytes += len;
    tp->queued++;
    return 0;
}

/* 1 sent (nanomsg owns buf now), 0 not now, or a negative error. */
int cps__tp_try_send(tp_peer *p, void *buf)
{
    for (;;) {
        void *m = buf;
        if (nn_send(p->sock, &m, NN_MSG, NN_DONTWAIT) >= 0)
            return 1;
        int e = nn_errno();
        if (e == EAGAIN)
            return 0;
        if (e != EINTR) {
            cps__log(CPS_LOG_ERROR, SUB, "nn_send to peer %u (%s): %s", p->id, p->url,
                     nn_strerror(e));
            return CPS_ETRANSPORT;
        }
    }
}

/* Hand queued messages to nanomsg, oldest first, until it pushes back. */
int cps__tp_queue_flush(cps__tp *tp, tp_peer *p)
{
    if (!p->qlen)
        return 0;
    while (p->qlen) {
        tp_msg *m = &p->q[p->qhead];
        int rc = cps__tp_try_send(p, m->buf);
        if (rc <= 0)
            return rc;
        p->qbytes -= m->len;
        p->qhead = (p->qhead + 1) % p->qcap;
        p->qlen--;
        tp->queued--;
    }
    p->qhead = 0;
    backlog_note(tp, p, 0);
    return 0;
}

static int valid_url(const char *url)
{
    if (!url)
        return 0;
    size_t n = strnlen(url, TP_URL_MAX);
    const char *sep = strstr(url, "://");
    return n > 0 && n < TP_URL_MAX && sep && sep != url && sep[3] != '\0';
}

/* The ipc:// address of the peer whose inbox is tcp `url`, into out, when it shares our host,
 * namespace and runtime directory (its socket file is there) and the directory is still private;
 * 0 if so, else -1 (then tcp://). */
static int local_url(const cps__tp *tp, const char *url, char *out, size_t cap)
{
    char path[sizeof tp->local_path];
    struct stat st;
    if (!tp->rundir[0] || strncmp(url, "tcp://", 6) != 0 ||
        cps__tp_local_path(tp->rundir, tp->host_id, url, path, sizeof path) != 0 ||
        lstat(path, &st) != 0 || !S_ISSOCK(st.st_mode))
        return -1;
    char err[TP_URL_MAX + 160];
    if (cps__tp_local_dir_check(tp->rundir, err, sizeof err) != 0) {
        cps__log(CPS_LOG_ERROR, SUB, "%s: not using ipc to %s (tcp:// with a MAC instead)", err,
                 url);
        return -1;
    }
    snprintf(out, cap, "ipc://%s", path);
    return 0;
}

static int peer_open(const cps__tp *tp, uint32_t id, const char *url, tp_peer **out)
{
    tp_peer *p = calloc(1, sizeof *p);
    if (!p)
        return CPS_ENOMEM;
    p->id = id;
    p->url = strdup(url);
    if (!p->url) {
        free(p);
        return CPS_ENOMEM;
    }
    int rc = cps__tp_open_sock(NN_PUSH, &p->sock);
    if (rc) {
        free(p->url);
        free(p);
        return rc;
    }
    /* nn_connect only validates the address; the TCP connection is made (and remade) in the
     * background, which is what lets a send precede the peer's bind. */
    char ipc[TP_URL_MAX + 8];
    p->local = local_url(tp, url, ipc, sizeof ipc) == 0;
    const char *target = p->local ? ipc : url;
    if (nn_connect(p->sock, target) < 0)
        rc = cps__tp_nn_fail("nn_connect", target);
    if (!rc)
        rc = cps__tp_get_fd(p->sock, NN_SNDFD, &p->sndfd);
    if (rc) {
        cps__tp_close_sock(p->sock);
        free(p->url);
        free(p);
        return rc;
    }
    *out = p;
    return 0;
}

/* Take back our ring's slots held for peer `id` (all, or those reserved with a tag below
 * `tag`). Slots it still held retire the ring (ring.h): logged, as its receivers' mappings of
 * the old file stay until they release them. Returns how many it held. */
size_t cps__tp_ring_reclaim(cps__tp *tp, uint32_t id, uint64_t tag, const char *why)
{
    if (!tp->ring)
        return 0;
    size_t n = tag == UINT64_MAX ? cps__ring_reclaim_peer(tp->ring, id)
                                 : cps__ring_reclaim_before(tp->ring, id, tag);
    if (n)
        cps__log(CPS_LOG_INFO, SUB,
                 "%s: peer %u %s holding %zu ring slot(s): ring retired, new generation %016llx",
                 tp->inbox_url, id, why, n, (unsigned long long)cps__ring_gen(tp->ring));
    return n;
}

int cps__tp_peer_set(cps__tp *tp, uint32_t id, const char *url)
{
    if (!tp || !valid_url(url))
        return CPS_EINVAL;
    int found;
    size_t i = peer_index(tp, id, &found);
    if (found && strcmp(tp->peers[i]->url, url) == 0)
        return 0;
    /* Open the new socket before touching the old one so a failure leaves the peer as it was. */
    tp_peer *p;
    int rc = peer_open(tp, id, url, &p);
    if (rc)
        return rc;
    if (found) {
        cps__log(CPS_LOG_INFO, SUB, "peer %u moved %s -> %s", id, tp->peers[i]->url, url);
        cps__tp_ring_reclaim(tp, id, UINT64_MAX, "moved");
        cps__tp_peer_free(tp, tp->peers[i]);
        tp->peers[i] = p;
        return 0;
    }
    void *np = tp->peers;
    int grown = cps__array_reserve(&np, &tp->peers_cap, tp->npeers + 1, sizeof *tp->peers, 8);
    tp->peers = np;
    if (grown != 0) {
        cps__tp_peer_free(tp, p);
        return grown;
    }
    memmove(&tp->peers[i + 1], &tp->peers[i], (tp->npeers - i) * sizeof *tp->peers);
    tp->peers[i] = p;
    tp->npeers++;
    cps__log(CPS_LOG_DEBUG, SUB, "peer %u at %s%s", id, url, p->local ? " (over ipc)" : "");
    return 0;
}

void cps__tp_peer_drop(cps__tp *tp, uint32_t id)
{
    if (!tp)
        return;
    int found;
    size_t i = peer_index(tp, id, &found);
    if (!found)
        return;
    cps__tp_ring_reclaim(tp, id, UINT64_MAX, "dropped");
    cps__tp_peer_free(tp, tp->peers[i]);
    memmove(&tp->peers[i], &tp->peers[i + 1], (tp->npeers - i - 1) * sizeof *tp->peers);
    tp->npeers--;
}

uint64_t cps__tp_peer_stat(const tp_peer *p, int stat)
{
    uint64_t v = nn_get_statistic(p->sock, stat);
    return v == (uint64_t)-1 ? 0 : v;
}

int cps__tp_peer_gone(cps__tp *tp, uint32_t id)
{
    tp_peer *p = tp ? cps__tp_peer_find(tp, id) : NULL;
    if (!p)
        return 0;
    uint64_t breaks = cps__tp_peer_stat(p, NN_STAT_BROKEN_CONNECTIONS);
    uint64_t errors = cps__tp_peer_stat(p, NN_STAT_CONNECT_ERRORS);
    uint64_t current = cps__tp_peer_stat(p, NN_STAT_CURRENT_CONNECTIONS);
    if (breaks > p->breaks_seen) {
        /* The baseline is the count when the connection was last seen up, not now: a connect
         * fails only while there is no connection, so every error since came after the break,
         * including a refusal that happened before this look (the caller did not run for a
         * reconnect interval). Taking today's count would wait for the next attempt, 100, 200,
         * 400 ms later by nanomsg's back-off. */
        p->breaks_seen = breaks;
        p->errors_at_break = p->errors_up;
        p->down = 1;
    }
    if (current > 0) {
        p->down = 0;
        p->errors_up = errors;
    }
    return p->down && current == 0 && errors > p->errors_at_break;
}

int cps__tp_peer_connected(cps__tp *tp, uint32_t id)
{
    tp_peer *p = tp ? cps__tp_peer_find(tp, id) : NULL;
    return p && cps__tp_peer_stat(p, NN_STAT_CURRENT_CONNECTIONS) > 0;
}

int cps__tp_peer_local(const cps__tp *tp, uint32_t id)
{
    const tp_peer *p = tp ? cps__tp_peer_find(tp, id) : NULL;
    return p && p->local;
}

int cps__tp_peer_known(const cps__tp *tp, uint32_t id)
{
    return tp && cps__tp_peer_find(tp, id) != NULL;
}

size_t cps__tp_queued(const cps__tp *tp)
{
    return tp ? tp->queued : 0;
}

void cps__tp_set_backlog_fn(cps__tp *tp, cps__tp_backlog_fn fn, void *ctx)
{
    if (!tp)
        return;
    for (size_t i = 0; i < tp->npeers; i++)
        if (tp->peers[i]->qlen)
            backlog_note(tp, tp->peers[i], 0);
    tp->backlog_fn = fn;
    tp->backlog_ctx = ctx;
    for (size_t i = 0; i < tp->npeers; i++)
        if (tp->peers[i]->qlen)
            backlog_note(tp, tp->peers[i], 1);
}

int cps__tp_flush_fd(cps__tp *tp, int fd)
{
    if (!tp)
        return CPS_EINVAL;
    /* Only peers with a backlog are watched, and few have one: a scan is cheap. */
    for (size_t i = 0; i < tp->npeers; i++)
        if (tp->peers[i]->sndfd == fd && tp->peers[i]->qlen)
            return cps__tp_queue_flush(tp, tp->peers[i]);
    return 0;
}
