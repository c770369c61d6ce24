/* Transport over nanomsg: one NN_PULL inbox, one NN_PUSH socket per peer (see transport.h).
 *
 * Why PUSH/PULL: a PUSH socket with a single connected pipe is an ordered, fire-and-forget stream
 * to one peer, and any number of requests can be in flight (REQ/REP allows one). Replies travel
 * the same way, on the replier's own PUSH socket to the requester's inbox.
 *
 * Why a queue of our own: nn_send(NN_DONTWAIT) on PUSH fails with EAGAIN while the peer is not
 * connected yet or while the previous message is still being written. Blocking there would stall
 * the event loop behind one slow peer, so the message waits in a per-peer FIFO instead and
 * cps__tp_poll() feeds it to nanomsg when the peer's NN_SNDFD says it can take more.
 */

#include "transport/transport_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nanomsg/nn.h>
#include <nanomsg/pipeline.h>

#include "chainps/error.h"
#include "core/log.h"
#include "transport/local.h"

#define TP_BIND_TRIES       64
#define TP_PORT_LO          20000u
#define TP_PORT_HI          59999u
#define TP_DESTROY_FLUSH_MS 200
/* Authenticated messages over tcp:// longer than this go as frames (frame.h); 0: none do.
 * CHAINPS_FRAME_KB sets it. Off by default, by measurement (bench/run_frames.sh, two network
 * namespaces on the 2-core test machine, docs/benchmarks.md): the copy into frames on each side
 * costs more CPU than the overlap saves when no core is idle to overlap into; unframed beat 64,
 * 256 and 1024 KiB frames at 1 and 16 MB. Every receiver takes frames whatever its own setting. */
#define TP_FRAME_DEFAULT 0u
/* Messages to a same-host peer of at least this many bytes go through this process's shared-
 * memory ring (ring.h), smaller ones inline on the ipc socket; CHAINPS_RING_MIN_KB sets it in
 * KiB, 0 turns rings off. By measurement (bench/README.md, "Shared-memory rings"). */
#define TP_RING_MIN_DEFAULT (256u << 10)
/* The ring's data area; CHAINPS_RING_MB sets it. A full ring sends inline. */
#define TP_RING_CAP_DEFAULT (64u << 20)

int cps__tp_create(const unsigned char *key, cps__tp **out)
{
    if (!out)
        return CPS_EINVAL;
    cps__tp *tp = calloc(1, sizeof *tp);
    if (!tp)
        return CPS_ENOMEM;
    int rc = cps__auth_create(key, &tp->auth);
    if (rc != 0) {
        free(tp);
        return rc;
    }
    tp->inbox = -1;
    tp->rcvfd = -1;
    tp->local_inbox = -1;
    tp->local_rcvfd = -1;
    tp->extra_fd = -1;
    tp->frame_size = TP_FRAME_DEFAULT;
    const char *fkb = getenv("CHAINPS_FRAME_KB");
    if (fkb && *fkb) {
        char *end;
        unsigned long kb = strtoul(fkb, &end, 10);
        if (*end || kb > (1ul << 20))
            cps__log(CPS_LOG_WARN, SUB, "CHAINPS_FRAME_KB=%s: not a size in KiB, ignored", fkb);
        else
            tp->frame_size = (size_t)kb << 10;
    }
    tp->ring_min = TP_RING_MIN_DEFAULT;
    tp->ring_cap = TP_RING_CAP_DEFAULT;
    const char *rkb = getenv("CHAINPS_RING_MIN_KB"), *rmb = getenv("CHAINPS_RING_MB");
    if (rkb && *rkb) {
        char *end;
        unsigned long kb = strtoul(rkb, &end, 10);
        if (*end || kb > (1ul << 20))
            cps__log(CPS_LOG_WARN, SUB, "CHAINPS_RING_MIN_KB=%s: not a size in KiB, ignored", rkb);
        else
            tp->ring_min = (size_t)kb << 10;
    }
    if (rmb && *rmb) {
        char *end;
        unsigned long mb = strtoul(rmb, &end, 10);
        if (*end || mb < 1 || mb > 4096)
            cps__log(CPS_LOG_WARN, SUB, "CHAINPS_RING_MB=%s: not a size in MiB (1..4096), ignored",
                     rmb);
        else
            tp->ring_cap = (size_t)mb << 20;
    }
    const char *dir = getenv("CHAINPS_RUNTIME_DIR");
    if (dir && *dir && cps__tp_set_runtime_dir(tp, dir) != 0)
        cps__log(CPS_LOG_WARN, SUB, "CHAINPS_RUNTIME_DIR too long: every channel stays tcp://");
    *out = tp;
    return 0;
}

int cps__tp_set_runtime_dir(cps__tp *tp, const char *dir)
{
    if (!tp || tp->inbox >= 0 || (dir && strlen(dir) >= sizeof tp->rundir - 32))
        return CPS_EINVAL;
    tp->rundir[0] = 0;
    tp->host_id[0] = 0;
    if (!dir || !dir[0])
        return 0;
    /* Without a host identity nothing can prove a peer shares our kernel and namespace. */
    if (cps__tp_local_host_id(tp->host_id, sizeof tp->host_id) != 0) {
        cps__log(CPS_LOG_WARN, SUB, "no boot id or network namespace in /proc: no ipc channels");
        return 0;
    }
    snprintf(tp->rundir, sizeof tp->rundir, "%s", dir);
    return 0;
}

static uint64_t seed_rng(const void *salt)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^ ((uint64_t)getpid() << 16) ^
                 (uint64_t)(uintptr_t)salt;
    return x ? x : 0x9e3779b97f4a7c15ull;
}

static uint64_t xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static int valid_host(const char *host)
{
    if (!host || !host[0] || strlen(host) >= TP_URL_MAX - 32)
        return 0;
    for (const char *c = host; *c; c++)
        if (*c == '/' || *c == '[' || *c == ']' || *c <= ' ')
            return 0;
    return 1;
}

static void format_url(char *buf, size_t cap, const char *host, unsigned port)
{
    /* An IPv6 literal needs brackets to keep its colons apart from the port. */
    if (strchr(host, ':'))
        snprintf(buf, cap, "tcp://[%s]:%u", host, port);
    else
        snprintf(buf, cap, "tcp://%s:%u", host, port);
}

/* The ipc:// inbox beside tcp `url`, in the runtime directory. */
static int bind_local(cps__tp *tp, const char *url)
{
    char err[TP_URL_MAX + 160];
    if (cps__tp_local_dir_check(tp->rundir, err, sizeof err) != 0) {
        cps__log(CPS_LOG_ERROR, SUB, "%s (CHAINPS_RUNTIME_DIR)", err);
        return CPS_ECONFIG;
    }
    char path[sizeof tp->local_path], ipc[sizeof path + 8];
    if (cps__tp_local_path(tp->rundir, tp->host_id, url, path, sizeof path) != 0) {
        /* Only speed is lost: every channel stays tcp:// with a MAC. */
        cps__log(CPS_LOG_WARN, SUB,
                 "runtime directory %s: its path is too long for a Unix socket (%zu bytes): no "
                 "ipc channels",
                 tp->rundir, sizeof path);
        tp->rundir[0] = 0;
        return 0;
    }
    if (unlink(path) != 0 && errno != ENOENT)
        cps__log(CPS_LOG_WARN, SUB, "cannot remove stale %s: %s", path, strerror(errno));
    snprintf(ipc, sizeof ipc, "ipc://%s", path);
    int s, rc = cps__tp_open_sock(NN_PULL, &s);
    if (rc)
        return rc;
    if (nn_bind(s, ipc) < 0)
        rc = cps__tp_nn_fail("nn_bind", ipc);
    if (!rc)
        rc = cps__tp_get_fd(s, NN_RCVFD, &tp->local_rcvfd);
    if (rc) {
        cps__tp_close_sock(s);
        tp->local_rcvfd = -1;
        return rc;
    }
    tp->local_inbox = s;
    snprintf(tp->local_path, sizeof tp->local_path, "%s", path);
    if (cps__ring_peers_create(tp->rundir, &tp->ring_peers) != 0)
        cps__log(CPS_LOG_WARN, SUB,
                 "no table of rings: same-host peers' ring descriptors are refused");
    return 0;
}

int cps__tp_bind(cps__tp *tp, const char *host, uint16_t port, uint16_t *port_out)
{
    if (!tp || !valid_host(host))
        return CPS_EINVAL;
    if (tp->inbox >= 0) {
        cps__log(CPS_LOG_ERROR, SUB, "inbox already bound to %s", tp->inbox_url);
        return CPS_EINVAL;
    }
    int s, rc = cps__tp_open_sock(NN_PULL, &s);
    if (rc)
        return rc;
    if (strchr(host, ':'))
        rc = cps__tp_set_opt(s, NN_SOL_SOCKET, NN_IPV4ONLY, 0, "NN_IPV4ONLY");

    /* Port 0: nanomsg has no "any port" for tcp, so pick one ourselves. Its tcp bind is
     * synchronous and reports EADDRINUSE, so a taken port is simply skipped; choosing at random
     * keeps nodes started together from racing for the same ports. */
    uint64_t rng = seed_rng(tp);
    int tries = port ? 1 : TP_BIND_TRIES;
    unsigned chosen = port;
    char url[TP_URL_MAX];
    int bound = 0;
    for (int t = 0; !rc && t < tries && !bound; t++) {
        if (!port)
            chosen = TP_PORT_LO + (unsigned)(xorshift(&rng) % (TP_PORT_HI - TP_PORT_LO + 1));
        format_url(url, sizeof url, host, chosen);
        if (nn_bind(s, url) >= 0) {
            bound = 1;
        } else if (port || nn_errno() != EADDRINUSE) {
            rc = cps__tp_nn_fail("nn_bind", url);
        }
    }
    if (!rc && !bound) {
        cps__log(CPS_LOG_ERROR, SUB, "nn_bind %s: no free port after %d tries in %u..%u", host,
                 tries, TP_PORT_LO, TP_PORT_HI);
        rc = CPS_ETRANSPORT;
    }
    if (!rc)
        rc = cps__tp_get_fd(s, NN_RCVFD, &tp->rcvfd);
    if (rc) {
        cps__tp_close_sock(s);
        tp->rcvfd = -1;
        return rc;
    }
    /* After the tcp:// bind, whose port no other process holds now: so the ipc file named after
     * it is no live node's, and a stale one (a crashed process's) can go. */
    if (tp->rundir[0])
        rc = bind_local(tp, url);
    if (rc) {
        cps__tp_close_sock(s);
        tp->rcvfd = -1;
        return rc;
    }
    tp->inbox = s;
    snprintf(tp->inbox_url, sizeof tp->inbox_url, "%s", url);
    if (port_out)
        *port_out = (uint16_t)chosen;
    cps__log(CPS_LOG_DEBUG, SUB, "inbox bound to %s%s%s", url,
             tp->local_path[0] ? " and ipc://" : "", tp->local_path);
    return 0;
}

void cps__tp_poll_extra(cps__tp *tp, int fd)
{
    if (tp)
        tp->extra_fd = fd;
}

static int pfd_reserve(cps__tp *tp, size_t n)
{
    if (n <= tp->pfd_cap)
        return 0;
    size_t ncap = tp->pfd_cap ? tp->pfd_cap : 8;
    while (ncap < n)
        ncap *= 2;
    struct pollfd *np = realloc(tp->pfds, ncap * sizeof *np);
    if (!np)
        return CPS_ENOMEM;
    tp->pfds = np;
    tp_peer **pp = realloc(tp->pfd_peer, ncap * sizeof *pp);
    if (!pp)
        return CPS_ENOMEM;
    tp->pfd_peer = pp;
    tp->pfd_cap = ncap;
    return 0;
}

static void pfd_add(cps__tp *tp, size_t *n, int fd, tp_peer *p)
{
    tp->pfds[*n] = (struct pollfd){.fd = fd, .events = POLLIN};
    tp->pfd_peer[*n] = p;
    (*n)++;
}

enum { WAKE_INBOX = 1, WAKE_EXTRA = 2, WAKE_FLUSH = 4 };

/* One poll(2): wait up to wait_ms on the inbox (if want_inbox), the extra fd and the NN_SNDFD of
 * every peer with a backlog; flush the backlogs that became sendable. Returns WAKE_* bits or a
 * negative error; 0 on timeout or EINTR. */
static int wait_once(cps__tp *tp, int wait_ms, int want_inbox)
{
    size_t n = 0, inbox_at = SIZE_MAX, extra_at = SIZE_MAX;
    if (pfd_reserve(tp, tp->npeers + 3))
        return CPS_ENOMEM;
    if (want_inbox && tp->inbox >= 0) {
        inbox_at = n;
        pfd_add(tp, &n, tp->rcvfd, NULL);
        if (tp->local_inbox >= 0)
            pfd_add(tp, &n, tp->local_rcvfd, NULL);
    }
    if (tp->extra_fd >= 0) {
        extra_at = n;
        pfd_add(tp, &n, tp->extra_fd, NULL);
    }
    for (size_t i = 0; i < tp->npeers; i++)
        if (tp->peers[i]->qlen)
            pfd_add(tp, &n, tp->peers[i]->sndfd, tp->peers[i]);

    int rc = poll(tp->pfds, (nfds_t)n, wait_ms);
    if (rc < 0) {
        if (errno == EINTR)
            return 0;
        cps__log(CPS_LOG_ERROR, SUB, "poll: %s", strerror(errno));
        return CPS_ETRANSPORT;
    }
    int wake = 0;
    for (size_t i = 0; rc > 0 && i < n; i++) {
        if (!tp->pfds[i].revents)
            continue;
        if (i == inbox_at || (inbox_at != SIZE_MAX && i == inbox_at + 1 && tp->local_inbox >= 0)) {
            wake |= WAKE_INBOX;
        } else if (i == extra_at) {
            wake |= WAKE_EXTRA;
        } else {
            wake |= WAKE_FLUSH;
            int frc = cps__tp_queue_flush(tp, tp->pfd_peer[i]);
            if (frc < 0)
                return frc;
        }
    }
    return wake;
}

int cps__tp_poll(cps__tp *tp, int timeout_ms, cps__tp_recv_fn fn, void *ctx, int max_msgs)
{
    if (!tp)
        return CPS_EINVAL;
    /* Without a callback there is no one to hand messages to, so the inbox is left alone and the
     * call only waits for and flushes peer backlogs. */
    int want_inbox = fn != NULL;
    int64_t deadline = timeout_ms > 0 ? now_ms() + timeout_ms : 0;
    int wait_ms = timeout_ms;
    for (;;) {
        int wake = wait_once(tp, wait_ms, want_inbox);
        if (wake < 0)
            return wake;
        int delivered = 0;
        if (wake & WAKE_INBOX) {
            delivered = cps__tp_drain_inbox(tp, fn, ctx, max_msgs);
            if (delivered < 0)
                return delivered;
        }
        /* Only a flush happened: nothing for the caller yet, so keep waiting out the timeout
         * rather than handing the event loop a spurious wake-up. */
        if (delivered || (wake & WAKE_EXTRA) || !(wake & WAKE_FLUSH) || timeout_ms == 0)
            return delivered;
        if (!want_inbox && tp->queued == 0 && tp->extra_fd < 0)
            return 0;
        if (timeout_ms > 0) {
            int64_t left = deadline - now_ms();
            if (left <= 0)
                return 0;
            wait_ms = (int)left;
        }
    }
}

int cps__tp_inbox_fd(const cps__tp *tp)
{
    return tp && tp->inbox >= 0 ? tp->rcvfd : -1;
}

int cps__tp_inbox_local_fd(const cps__tp *tp)
{
    return tp && tp->local_inbox >= 0 ? tp->local_rcvfd : -1;
}

void cps__tp_destroy(cps__tp *tp)
{
    if (!tp)
        return;
    /* The loop that watched our backlogs may be gone already. */
    tp->backlog_fn = NULL;
    /* Give backlogs a short, bounded chance to reach nanomsg: a node that sends its last words
     * (a leave notice, a final ack) and exits should not lose them just because the connection
     * was still coming up. Messages nanomsg has accepted may still be lost at close. */
    int64_t deadline = now_ms() + TP_DESTROY_FLUSH_MS;
    tp->extra_fd = -1;
    while (tp->queued) {
        int64_t left = deadline - now_ms();
        if (left <= 0 || wait_once(tp, (int)left, 0) < 0)
            break;
    }
    for (size_t i = 0; i < tp->npeers; i++)
        cps__tp_peer_free(tp, tp->peers[i]);
    free(tp->peers);
    if (tp->inbox >= 0)
        cps__tp_close_sock(tp->inbox);
    if (tp->local_inbox >= 0) {
        cps__tp_close_sock(tp->local_inbox);
        unlink(tp->local_path);
    }
    for (size_t i = 0; i < TP_ASM_MAX; i++)
        if (tp->asms[i].buf)
            nn_freemsg(tp->asms[i].buf);
    /* At INFO, one line per process that used rings: the ipc tests read it to tell that the
     * rings carried the messages (ring_sent) and that no descriptor was lost (ring_refused). */
    if (tp->ring || tp->ring_recv || tp->ring_refused)
        cps__log(
            CPS_LOG_INFO, SUB,
            "%s: ring counters: ring_sent=%llu ring_recv=%llu ring_inline_full=%llu "
            "ring_refused=%llu ring_returned=%llu retired=%llu ring_built=%llu",
            tp->inbox_url, (unsigned long long)tp->ring_sent, (unsigned long long)tp->ring_recv,
            (unsigned long long)tp->ring_inline_full, (unsigned long long)tp->ring_refused,
            (unsigned long long)cps__ring_peers_returned(tp->ring_peers),
            (unsigned long long)cps__ring_retired(tp->ring), (unsigned long long)tp->ring_built);
    /* Reserved buffers never sent: a slot goes with the ring, a fallback buffer here. */
    for (size_t i = 0; i < tp->nresv; i++)
        if (!tp->resv[i].slot)
            nn_freemsg(tp->resv[i].buf);
    free(tp->resv);
    /* Receivers keep their own mappings of our ring; the file goes with us. */
    cps__ring_destroy(tp->ring, 1);
    cps__ring_peers_destroy(tp->ring_peers);
    free(tp->pfds);
    free(tp->pfd_peer);
    cps__auth_destroy(tp->auth);
    free(tp);
}
