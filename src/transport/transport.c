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
#include "transport/transport.h"

#include <assert.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <nanomsg/nn.h>
#include <nanomsg/pipeline.h>
#include <nanomsg/tcp.h>

#include "chainps/error.h"
#include "core/array.h"
#include "core/log.h"
#include "core/wire.h"
#include "transport/auth.h"
#include "transport/frame.h"
#include "transport/local.h"
#include "transport/ring.h"

#define TP_QUEUE_MAX        4096u     /* per-peer backlog before senders see CPS_EAGAIN */
#define TP_SOCKBUF          (4 << 20) /* NN_SNDBUF / NN_RCVBUF */
#define TP_LINGER_MS        100
#define TP_RECONNECT_MS     50
#define TP_RECONNECT_MAX_MS 500
#define TP_BIND_TRIES       64
#define TP_PORT_LO          20000u
#define TP_PORT_HI          59999u
#define TP_DESTROY_FLUSH_MS 200
#define TP_URL_MAX          512
#define TP_AUTH_LOG_MS      1000 /* at most one line a second about refused messages */
#define TP_ASM_MAX          64   /* senders with a framed message being assembled, as auth's */
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

static const char SUB[] = "transport";

/* A framed message being assembled from one sender (frame.h). */
typedef struct tp_asm {
    unsigned char salt[CPS_AUTH_SALT];
    uint64_t msg_id, total, next;
    uint64_t used;       /* tick of the last frame: the least recently heard goes first */
    uint64_t dropped_id; /* the message whose frames are being dropped (logged once) */
    unsigned char *buf;  /* nn_allocmsg(total + trailer); NULL: none in progress */
    int live;
} tp_asm;

typedef struct tp_msg {
    void *buf;
    size_t len;
} tp_msg;

/* A buffer handed out by cps__tp_reserve: a slot of our ring, or a nanomsg buffer (fallback). */
typedef struct tp_resv {
    void *buf;
    size_t cap;       /* bytes reserved */
    cps__ring_desc d; /* the slot's descriptor (slot only) */
    int slot;         /* 1: in our ring; 0: from cps__tp_alloc */
    int ring_full;    /* no slot for it (counted then): its send goes inline, skipping the ring */
    uint32_t peer;    /* reserved for */
    int plain;        /* cps__tp_fill copies without a MAC (see there) */
    uint64_t mac;     /* its MAC so far (cps__auth_stream_begin), 0: none */
    int moved;        /* cut by a nanomsg that moved it: not the caller's pointer any more */
} tp_resv;

typedef struct tp_peer {
    uint32_t id;
    int sock;
    int sndfd;
    int local; /* connected over ipc:// in the job's private directory: messages go unsealed */
    char *url; /* as the caller named it (tcp://...), even when the connection is local */
    tp_msg *q; /* ring buffer: qlen entries starting at qhead */
    size_t qcap, qhead, qlen;
    size_t qbytes;
    /* cps__tp_peer_gone: the connection's breaks seen, the connect errors counted the last time
     * it was seen connected and when the last break was seen, and whether it is down since. */
    uint64_t breaks_seen, errors_up, errors_at_break;
    int down;
} tp_peer;

struct cps__tp {
    int inbox; /* -1 until bound */
    int rcvfd;
    int local_inbox; /* the ipc:// inbox, -1 without a runtime directory */
    int local_rcvfd;
    int drain_turn;          /* which inbox a drain reads first (fairness) */
    char rundir[TP_URL_MAX]; /* the job's private runtime directory, "" for none */
    char host_id[128];       /* boot id and network namespace: who shares our sockets */
    char local_path[sizeof(((struct sockaddr_un *)0)->sun_path)]; /* our ipc inbox's file */
    int extra_fd;
    char inbox_url[TP_URL_MAX];
    tp_peer **peers; /* sorted by id so send() finds a peer by binary search */
    size_t npeers, peers_cap;
    size_t queued; /* sum of qlen over peers */
    struct pollfd *pfds;
    tp_peer **pfd_peer; /* pfd_peer[i] owns pfds[i], NULL for the inbox and extra fd */
    size_t pfd_cap;
    cps__auth *auth;
    uint64_t auth_dropped;  /* messages refused by the MAC check, ever */
    uint64_t auth_unlogged; /* refused since the last log line */
    int64_t auth_logged_ms; /* time of that line */
    size_t frame_size;      /* 0: no framing */
    uint64_t frame_msg_id;  /* the last framed message sent */
    tp_asm asms[TP_ASM_MAX];
    uint64_t asm_tick;
    cps__tp_backlog_fn backlog_fn; /* an event loop watching the peers with a backlog */
    void *backlog_ctx;
    size_t ring_min;                      /* 0: no rings */
    size_t ring_cap;                      /* bytes of our ring's data area */
    cps__ring *ring;                      /* ours, made at the first large send to a local peer */
    int ring_failed;                      /* could not make it: inline from then on */
    cps__ring_peers *ring_peers;          /* the senders' rings we map, with the ipc inbox */
    uint64_t ring_refused;                /* descriptors refused (ring.h) */
    uint64_t ring_sent, ring_inline_full; /* sent through the ring / inline for want of room */
    uint64_t ring_recv;                   /* received through a peer's ring */
    uint64_t ring_built;                  /* sent from a reserved slot, without a copy */
    tp_resv *resv;                        /* buffers out from cps__tp_reserve */
    size_t nresv, resv_cap;
    /* Message types whose check the receiver makes during its own copy (cps__tp_defer_check). */
    uint64_t defer_types[4];
    cps__tp_pending_fn defer_fn;
    void *defer_ctx;
};

/* A message handed to a cps__tp_pending_fn unchecked (transport.h). */
enum { PEND_UNCHECKED, PEND_CHECKED, PEND_TAKEN, PEND_REFUSED };
struct cps__tp_pending {
    cps__tp *tp;
    unsigned char *buf; /* nanomsg's, trailer included */
    size_t n;           /* bytes received */
    size_t body;        /* without the trailer (once checked: as checked) */
    int state;
};

/* A peer's queue went from empty to not (on) or back. */
static void backlog_note(cps__tp *tp, const tp_peer *p, int on)
{
    if (tp->backlog_fn)
        tp->backlog_fn(tp->backlog_ctx, p->sndfd, on);
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Log the pending nanomsg error and translate it at the boundary. */
static int nn_fail(const char *op, const char *target)
{
    int e = nn_errno();
    cps__log(CPS_LOG_ERROR, SUB, "%s %s: %s", op, target ? target : "", nn_strerror(e));
    return e == EINVAL ? CPS_EINVAL : CPS_ETRANSPORT;
}

static int set_opt(int s, int level, int opt, int val, const char *name)
{
    if (nn_setsockopt(s, level, opt, &val, sizeof val) < 0)
        return nn_fail("nn_setsockopt", name);
    return 0;
}

static void close_sock(int s)
{
    /* nanomsg documents EINTR from nn_close as "not fully closed yet, call again". */
    while (nn_close(s) < 0 && nn_errno() == EINTR) {
    }
}

/* A socket with our options applied. The receive limit goes on every socket, not only the inbox,
 * because nanomsg's 1 MiB default silently drops bigger messages on whichever side receives. */
static int open_sock(int proto, int *out)
{
    int s = nn_socket(AF_SP, proto);
    if (s < 0)
        return nn_fail("nn_socket", proto == NN_PULL ? "PULL" : "PUSH");
    int rc = set_opt(s, NN_SOL_SOCKET, NN_RCVMAXSIZE, CPS_WIRE_HDR_SIZE + CPS_WIRE_MAX_PAYLOAD,
                     "NN_RCVMAXSIZE");
    if (!rc)
        rc = set_opt(s, NN_SOL_SOCKET, NN_SNDBUF, TP_SOCKBUF, "NN_SNDBUF");
    if (!rc)
        rc = set_opt(s, NN_SOL_SOCKET, NN_RCVBUF, TP_SOCKBUF, "NN_RCVBUF");
    if (!rc)
        rc = set_opt(s, NN_SOL_SOCKET, NN_LINGER, TP_LINGER_MS, "NN_LINGER");
    /* Short reconnect intervals: a restarted peer or one whose inbox is not bound yet should be
     * reached within about half a second, well inside a request timeout. */
    if (!rc)
        rc = set_opt(s, NN_SOL_SOCKET, NN_RECONNECT_IVL, TP_RECONNECT_MS, "NN_RECONNECT_IVL");
    if (!rc)
        rc = set_opt(s, NN_SOL_SOCKET, NN_RECONNECT_IVL_MAX, TP_RECONNECT_MAX_MS,
                     "NN_RECONNECT_IVL_MAX");
    /* Requests are small and latency-bound; Nagle would hold them back behind the previous ack. */
    if (!rc)
        rc = set_opt(s, NN_TCP, NN_TCP_NODELAY, 1, "NN_TCP_NODELAY");
    if (rc) {
        close_sock(s);
        return rc;
    }
    *out = s;
    return 0;
}

static int get_fd(int s, int opt, int *fd)
{
    size_t sz = sizeof *fd;
    if (nn_getsockopt(s, NN_SOL_SOCKET, opt, fd, &sz) < 0)
        return nn_fail("nn_getsockopt", opt == NN_RCVFD ? "NN_RCVFD" : "NN_SNDFD");
    return 0;
}

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

/* ---- peers ---- */

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

static tp_peer *peer_find(const cps__tp *tp, uint32_t id)
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

static void peer_free(cps__tp *tp, tp_peer *p)
{
    if (p->qlen)
        cps__log(CPS_LOG_WARN, SUB, "peer %u (%s): dropping %zu queued messages (%zu bytes)", p->id,
                 p->url, p->qlen, p->qbytes);
    queue_clear(tp, p);
    close_sock(p->sock);
    free(p->q);
    free(p->url);
    free(p);
}

static int queue_push(cps__tp *tp, tp_peer *p, void *buf, size_t len)
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
static int try_send(tp_peer *p, void *buf)
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
static int queue_flush(cps__tp *tp, tp_peer *p)
{
    if (!p->qlen)
        return 0;
    while (p->qlen) {
        tp_msg *m = &p->q[p->qhead];
        int rc = try_send(p, m->buf);
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
    int rc = open_sock(NN_PUSH, &p->sock);
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
        rc = nn_fail("nn_connect", target);
    if (!rc)
        rc = get_fd(p->sock, NN_SNDFD, &p->sndfd);
    if (rc) {
        close_sock(p->sock);
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
static size_t ring_reclaim(cps__tp *tp, uint32_t id, uint64_t tag, const char *why)
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
        ring_reclaim(tp, id, UINT64_MAX, "moved");
        peer_free(tp, tp->peers[i]);
        tp->peers[i] = p;
        return 0;
    }
    void *np = tp->peers;
    int grown = cps__array_reserve(&np, &tp->peers_cap, tp->npeers + 1, sizeof *tp->peers, 8);
    tp->peers = np;
    if (grown != 0) {
        peer_free(tp, p);
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
    ring_reclaim(tp, id, UINT64_MAX, "dropped");
    peer_free(tp, tp->peers[i]);
    memmove(&tp->peers[i], &tp->peers[i + 1], (tp->npeers - i - 1) * sizeof *tp->peers);
    tp->npeers--;
}

static uint64_t peer_stat(const tp_peer *p, int stat)
{
    uint64_t v = nn_get_statistic(p->sock, stat);
    return v == (uint64_t)-1 ? 0 : v;
}

int cps__tp_peer_gone(cps__tp *tp, uint32_t id)
{
    tp_peer *p = tp ? peer_find(tp, id) : NULL;
    if (!p)
        return 0;
    uint64_t breaks = peer_stat(p, NN_STAT_BROKEN_CONNECTIONS);
    uint64_t errors = peer_stat(p, NN_STAT_CONNECT_ERRORS);
    uint64_t current = peer_stat(p, NN_STAT_CURRENT_CONNECTIONS);
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
    tp_peer *p = tp ? peer_find(tp, id) : NULL;
    return p && peer_stat(p, NN_STAT_CURRENT_CONNECTIONS) > 0;
}

int cps__tp_peer_local(const cps__tp *tp, uint32_t id)
{
    const tp_peer *p = tp ? peer_find(tp, id) : NULL;
    return p && p->local;
}

int cps__tp_peer_known(const cps__tp *tp, uint32_t id)
{
    return tp && peer_find(tp, id) != NULL;
}

/* ---- messages ---- */

void *cps__tp_alloc(size_t len)
{
    /* nanomsg's chunk header keeps the data 8-byte aligned on LP64; a zero-length chunk is legal
     * but some callers treat NULL as failure, so ask for at least one byte. */
    /* Room for the authentication trailer that cps__tp_send() writes after the `len` bytes. */
    return nn_allocmsg(len + CPS_AUTH_TRAILER, 0);
}

void cps__tp_free(void *buf)
{
    if (buf && !cps__ring_release(buf))
        nn_freemsg(buf);
}

/* `len` must be the length given to cps__tp_alloc() (or received): with NN_MSG nanomsg sends the
 * whole chunk, so a shorter `len` would not shorten the message, and the trailer goes right after
 * `len` bytes. The trailer is written here, so a message forwarded as it was received is sealed
 * afresh by this sender. */
/* Hand a sealed buffer to nanomsg, or queue it behind the peer's backlog. */
static int send_sealed(cps__tp *tp, tp_peer *p, void *buf, size_t len)
{
    /* Older messages go first, or the peer would see them out of order. */
    if (p->qlen) {
        int rc = queue_flush(tp, p);
        if (rc < 0)
            return rc;
    }
    if (!p->qlen) {
        int rc = try_send(p, buf);
        if (rc != 0)
            return rc > 0 ? 0 : rc;
    }
    int rc = queue_push(tp, p, buf, len);
    if (rc == CPS_EAGAIN)
        cps__log(CPS_LOG_DEBUG, SUB, "peer %u (%s): queue full (%zu messages)", p->id, p->url,
                 p->qlen);
    return rc;
}

/* A message that goes as frames (send_framed) rather than sealed whole. */
static int framed(const cps__tp *tp, size_t len)
{
    return tp->frame_size && len > tp->frame_size && cps__auth_keyed(tp->auth);
}

/* A large message as frames, each sealed just before it is handed over: while nanomsg's thread
 * writes frame k, this one copies and seals frame k+1 (frame.h). The copy is the price of
 * nanomsg taking whole buffers only; the MAC rides on it (cps__auth_seal_copy). */
static int send_framed(cps__tp *tp, tp_peer *p, void *buf, size_t len)
{
    size_t fs = tp->frame_size, n = (len + fs - 1) / fs;
    if (p->qlen + n > TP_QUEUE_MAX)
        return CPS_EAGAIN;
    uint64_t id = ++tp->frame_msg_id;
    for (size_t k = 0; k < n; k++) {
        size_t off = k * fs, clen = len - off < fs ? len - off : fs;
        unsigned char *f = nn_allocmsg(CPS_FRAME_HDR + clen + CPS_AUTH_TRAILER, 0);
        if (!f)
            return CPS_ENOMEM; /* frames sent already make a message the receiver drops whole */
        cps__frame_encode_hdr(f, id, len, off);
        cps__auth_seal_copy(tp->auth, f, CPS_FRAME_HDR + clen, CPS_FRAME_HDR,
                            (unsigned char *)buf + off, clen);
        int rc = send_sealed(tp, p, f, CPS_FRAME_HDR + clen);
        if (rc) {
            nn_freemsg(f);
            return rc;
        }
    }
    nn_freemsg(buf);
    return 0;
}

/* Our ring, made on first use; NULL when rings are off or it cannot be made. */
static cps__ring *ring_get(cps__tp *tp)
{
    if (tp->ring || tp->ring_failed)
        return tp->ring;
    int rc = CPS_EINVAL;
    if (tp->local_inbox >= 0 && !cps__ring_dir_in_memory(tp->rundir)) {
        /* Each process's ring is tens of MiB written over and over: on a disk file system the
         * kernel writes it back, and the copy through the socket is the cheaper one. */
        tp->ring_failed = 1;
        cps__log(CPS_LOG_WARN, SUB,
                 "runtime directory %s is not on tmpfs: no shared-memory ring, large same-host "
                 "messages go inline (run with $TMPDIR or CHAINPS_RUNTIME_DIR on /dev/shm)",
                 tp->rundir);
        return NULL;
    }
    if (tp->local_inbox >= 0)
        rc = cps__ring_create(tp->rundir, cps__tp_local_name(tp->host_id, tp->inbox_url),
                              tp->ring_cap, &tp->ring);
    if (rc) {
        tp->ring_failed = 1;
        cps__log(CPS_LOG_WARN, SUB,
                 "no shared-memory ring in %s (%s): large same-host messages go inline", tp->rundir,
                 cps_strerror(rc));
    } else {
        cps__log(CPS_LOG_INFO, SUB,
                 "%s: shared-memory ring of %zu MiB: same-host messages of %zu KiB and more go "
                 "through it",
                 tp->inbox_url, tp->ring_cap >> 20, tp->ring_min >> 10);
    }
    return tp->ring;
}

/* A full ring: the oldest slot may be held by a receiver that died (gone, or its connection broke
 * since: one that restarted on the same address never releases what its predecessor held). Its
 * slots come back. Returns how many. */
static size_t ring_unblock(cps__tp *tp, cps__ring *r)
{
    uint32_t oldest;
    uint64_t tag;
    if (cps__ring_oldest_peer(r, &oldest, &tag) != 0)
        return 0;
    tp_peer *o = peer_find(tp, oldest);
    if (!o || cps__tp_peer_gone(tp, oldest))
        return ring_reclaim(tp, oldest, UINT64_MAX, "gone");
    return ring_reclaim(tp, oldest, peer_stat(o, NN_STAT_BROKEN_CONNECTIONS), "reconnected");
}

/* A slot of `len` bytes in ring r for local peer p, sent at once (reserve 0) or reserved for the
 * caller to build in (1). A full ring first takes back the slots of a receiver that died. 0, or
 * an error (then send inline). */
static int ring_slot(cps__tp *tp, cps__ring *r, tp_peer *p, size_t len, int reserve,
                     cps__ring_desc *d, unsigned char **slot)
{
    uint64_t tag = peer_stat(p, NN_STAT_BROKEN_CONNECTIONS);
    int rc = reserve ? cps__ring_reserve(r, p->id, len, d, slot)
                     : cps__ring_alloc(r, p->id, tag, len, d, slot);
    if (rc == CPS_EAGAIN && ring_unblock(tp, r))
        rc = reserve ? cps__ring_reserve(r, p->id, len, d, slot)
                     : cps__ring_alloc(r, p->id, tag, len, d, slot);
    if (rc == CPS_EIO && !tp->ring_failed) {
        /* A retired ring whose new file could not be made: inline from now on. */
        tp->ring_failed = 1;
        cps__log(CPS_LOG_WARN, SUB,
                 "%s: no new shared-memory ring after retiring one (%s): large same-host "
                 "messages go inline",
                 tp->inbox_url, strerror(errno));
    }
    tp->ring_inline_full += rc == CPS_EAGAIN;
    return rc;
}

/* Send a large message to a local peer as a descriptor of its copy in our ring: 1 sent (buf
 * freed), 0 not (no ring or no room: send it inline), or a negative error (buf the caller's). */
static int send_ring(cps__tp *tp, tp_peer *p, void *buf, size_t len)
{
    cps__ring *r = ring_get(tp);
    if (!r)
        return 0;
    cps__ring_desc d;
    unsigned char *slot;
    if (ring_slot(tp, r, p, len, 0, &d, &slot) != 0)
        return 0;
    unsigned char *desc = nn_allocmsg(CPS_RING_DESC + CPS_AUTH_TRAILER, 0);
    if (!desc) {
        cps__ring_abandon(r, &d);
        return CPS_ENOMEM;
    }
    memcpy(slot, buf, len);
    cps__ring_desc_encode(desc, &d);
    memset(desc + CPS_RING_DESC, 0, CPS_AUTH_TRAILER);
    int rc = send_sealed(tp, p, desc, CPS_RING_DESC);
    if (rc) {
        nn_freemsg(desc);
        cps__ring_abandon(r, &d);
        return rc;
    }
    tp->ring_sent++;
    cps__tp_free(buf);
    return 1;
}

/* `len` must be the length given to cps__tp_alloc() (or received): with NN_MSG nanomsg sends the
 * whole chunk, so a shorter `len` would not shorten the message, and the trailer goes right after
 * `len` bytes. The trailer is written here, so a message forwarded as it was received is sealed
 * afresh by this sender. */
static int send_plain(cps__tp *tp, tp_peer *p, void *buf, size_t len, int try_ring)
{
    if (try_ring && p->local && tp->ring_min && len >= tp->ring_min) {
        int rc = send_ring(tp, p, buf, len);
        if (rc)
            return rc < 0 ? rc : 0;
    }
    if (cps__ring_owns(buf)) {
        /* A message received through a peer's ring and forwarded: nanomsg sends only its own
         * buffers. The ring slot goes back only once the copy is on its way. */
        void *copy = cps__tp_alloc(len);
        if (!copy)
            return CPS_ENOMEM;
        memcpy(copy, buf, len);
        int rc = send_plain(tp, p, copy, len, 1);
        if (rc)
            nn_freemsg(copy);
        else
            cps__ring_release(buf);
        return rc;
    }
    /* Sealed now, in sending order: a peer's FIFO keeps each sender's counters increasing. A
     * local peer's trailer goes zeroed, as without a key: its inbox takes no MAC (local.h). */
    if (p->local) {
        memset((unsigned char *)buf + len, 0, CPS_AUTH_TRAILER);
    } else {
        if (framed(tp, len))
            return send_framed(tp, p, buf, len);
        cps__auth_seal(tp->auth, buf, len);
    }
    return send_sealed(tp, p, buf, len);
}

/* ---- reserved buffers ---- */

static tp_resv *resv_find(cps__tp *tp, const void *buf)
{
    for (size_t i = 0; i < tp->nresv; i++)
        if (tp->resv[i].buf == buf)
            return &tp->resv[i];
    return NULL;
}

static void resv_forget(cps__tp *tp, tp_resv *e)
{
    *e = tp->resv[--tp->nresv];
}

void *cps__tp_reserve(cps__tp *tp, uint32_t id, size_t len)
{
    if (!tp || !len)
        return NULL;
    void *nr = tp->resv;
    int grown = cps__array_reserve(&nr, &tp->resv_cap, tp->nresv + 1, sizeof *tp->resv, 8);
    tp->resv = nr;
    if (grown != 0)
        return NULL;
    tp_resv e = {.cap = len, .peer = id};
    tp_peer *p = peer_find(tp, id);
    cps__ring *r = p && p->local && tp->ring_min && len >= tp->ring_min ? ring_get(tp) : NULL;
    unsigned char *slot;
    if (r && ring_slot(tp, r, p, len, 1, &e.d, &slot) == 0) {
        e.buf = slot;
        e.slot = 1;
    } else {
        e.ring_full = r != NULL;
        e.buf = cps__tp_alloc(len);
        if (!e.buf)
            return NULL;
    }
    tp->resv[tp->nresv++] = e;
    return e.buf;
}

int cps__tp_unreserve(cps__tp *tp, void *buf)
{
    if (!tp || !buf)
        return 0;
    tp_resv *e = resv_find(tp, buf);
    if (!e) {
        /* Sent already, given back twice, or never ours: freeing it could hand a slot of our
         * ring (shared memory, no nanomsg chunk) to nn_freemsg, which aborts, or free a buffer
         * that nanomsg owns now. */
        cps__log(CPS_LOG_ERROR, SUB, "%s: unreserve of a buffer %p that is not reserved: ignored",
                 tp->inbox_url, buf);
        return CPS_EINVAL;
    }
    if (e->slot)
        cps__ring_abandon(tp->ring, &e->d);
    else
        nn_freemsg(e->buf);
    resv_forget(tp, e);
    return 0;
}

/* nanomsg sends a chunk whole, so a fallback buffer sent shorter than reserved is cut to `len`
 * (and its trailer). nanomsg 1.1 and later cut a chunk held once in place, so the compressed
 * push to a tcp:// server costs no second buffer and no copy. 0, or CPS_ENOMEM (unchanged). */
static int resv_shrink(tp_resv *e, size_t len)
{
    void *nb = nn_reallocmsg(e->buf, len + CPS_AUTH_TRAILER);
    if (!nb)
        return CPS_ENOMEM;
    if (nb != e->buf) {
        /* An older nanomsg moved it: the caller's pointer is gone, so a failed send cannot
         * leave it reserved (send_reserved frees it). */
        e->moved = 1;
        e->buf = nb;
    }
    e->cap = len;
    return 0;
}

/* Send a reserved buffer (see cps__tp_reserve). A slot goes as its descriptor when the peer is
 * still local and the ring still the slot's; otherwise a copy goes the usual way. A fallback
 * buffer goes itself, cut to `len` when shorter than reserved. */
static int send_reserved(cps__tp *tp, tp_peer *p, tp_resv *e, size_t len)
{
    if (!len || len > e->cap)
        return CPS_EINVAL;
    if (!e->slot) {
        if (len < e->cap && resv_shrink(e, len) != 0)
            return CPS_ENOMEM;
        void *buf = e->buf;
        /* Filled with its MAC running (cps__tp_fill): finish the tag, not a pass of its own. */
        uint64_t mac = e->mac;
        e->mac = 0;
        /* One that found the ring full at its reservation goes inline now: counted once, and
         * the full ring's unblocking is not run twice for one message. */
        int rc = mac && !p->local && !framed(tp, len) &&
                         cps__auth_stream_seal(tp->auth, mac, buf, len) == 0
                     ? send_sealed(tp, p, buf, len)
                     : send_plain(tp, p, buf, len, !e->ring_full);
        if (rc != 0 && e->moved) {
            nn_freemsg(buf);
            resv_forget(tp, e);
        } else if (rc == 0) {
            resv_forget(tp, e);
        }
        return rc;
    }
    if (p->local && tp->ring) {
        unsigned char *desc = nn_allocmsg(CPS_RING_DESC + CPS_AUTH_TRAILER, 0);
        if (!desc)
            return CPS_ENOMEM;
        cps__ring_desc d = e->d;
        if (cps__ring_commit(tp->ring, &d, p->id, peer_stat(p, NN_STAT_BROKEN_CONNECTIONS), len) ==
            0) {
            cps__ring_desc_encode(desc, &d);
            memset(desc + CPS_RING_DESC, 0, CPS_AUTH_TRAILER);
            int rc = send_sealed(tp, p, desc, CPS_RING_DESC);
            if (rc) {
                nn_freemsg(desc);
                cps__ring_uncommit(tp->ring, &d);
                return rc;
            }
            tp->ring_sent++;
            tp->ring_built++;
            resv_forget(tp, e);
            return 0;
        }
        /* The ring was retired since the reservation: the bytes are still mapped, copied. */
        nn_freemsg(desc);
    }
    void *copy = cps__tp_alloc(len);
    if (!copy)
        return CPS_ENOMEM;
    memcpy(copy, e->buf, len);
    int rc = send_plain(tp, p, copy, len, 1);
    if (rc) {
        nn_freemsg(copy);
        return rc;
    }
    cps__ring_abandon(tp->ring, &e->d);
    resv_forget(tp, e);
    return 0;
}

int cps__tp_fill(cps__tp *tp, void *buf, size_t off, const void *src, size_t n)
{
    tp_resv *e = tp && buf ? resv_find(tp, buf) : NULL;
    if (!e || off > e->cap || n > e->cap - off || (n && !src))
        return CPS_EINVAL;
    if (!e->mac && !e->plain) {
        /* MACed as it goes only where the send will seal it whole: a tcp:// peer, with a key,
         * a message too short for frames (sealed frame by frame) and no ring slot. */
        const tp_peer *p = peer_find(tp, e->peer);
        e->mac = !e->slot && p && !p->local && !framed(tp, e->cap)
                     ? cps__auth_stream_begin(tp->auth)
                     : 0;
        e->plain = !e->mac;
    }
    if (e->plain) {
        if (n)
            memcpy((unsigned char *)buf + off, src, n);
    } else if (cps__auth_stream_copy(tp->auth, e->mac, buf, off, src, n) != 0) {
        e->mac = 0; /* copied all the same; sealed whole at send */
        e->plain = 1;
    }
    return 0;
}

int cps__tp_send(cps__tp *tp, uint32_t id, void *buf, size_t len)
{
    if (!tp || !buf)
        return CPS_EINVAL;
    tp_peer *p = peer_find(tp, id);
    if (!p)
        return CPS_ENOTFOUND;
    tp_resv *e = tp->nresv ? resv_find(tp, buf) : NULL;
    return e ? send_reserved(tp, p, e, len) : send_plain(tp, p, buf, len, 1);
}

void cps__tp_ring_stats_get(const cps__tp *tp, cps__tp_ring_stats *out)
{
    if (!out)
        return;
    *out = (cps__tp_ring_stats){0};
    if (!tp)
        return;
    out->sent = tp->ring_sent;
    out->built = tp->ring_built;
    out->inline_full = tp->ring_inline_full;
    out->retired = cps__ring_retired(tp->ring);
    out->live = cps__ring_live(tp->ring);
    out->retired_held = cps__ring_retired_held(tp->ring);
}

size_t cps__tp_queued(const cps__tp *tp)
{
    return tp ? tp->queued : 0;
}

uint64_t cps__tp_auth_dropped(const cps__tp *tp)
{
    return tp ? tp->auth_dropped : 0;
}

/* A message that failed the check: counted, and logged at most once a second. nanomsg does not
 * say which address a message came from, so the line names what the message claims (its header's
 * sender and type, unauthenticated) and the sender instance (salt) it bears. */
static void auth_refused(cps__tp *tp, const unsigned char *m, size_t n, int verdict)
{
    tp->auth_dropped++;
    tp->auth_unlogged++;
    int64_t now = now_ms();
    if (tp->auth_logged_ms && now - tp->auth_logged_ms < TP_AUTH_LOG_MS)
        return;
    uint32_t claimed = n >= 12 ? cps__le32_get(m + 8) : 0;
    unsigned type = n >= 6 ? m[5] : 0;
    unsigned version = n >= 5 ? m[4] : 0;
    unsigned salt = n >= CPS_AUTH_TRAILER ? cps__le32_get(m + n - CPS_AUTH_TRAILER) : 0;
    cps__log(CPS_LOG_WARN, SUB,
             "%s: dropped %llu message(s) that failed authentication (%llu in all); the last: "
             "%zu bytes, %s, claims sender %u, type %u, wire version %u (ours %u), sender instance "
             "%08x",
             tp->inbox_url, (unsigned long long)tp->auth_unlogged,
             (unsigned long long)tp->auth_dropped, n, cps__auth_verdict_str(verdict), claimed, type,
             version, CPS_WIRE_VERSION, salt);
    tp->auth_unlogged = 0;
    tp->auth_logged_ms = now;
}

/* ---- inbox ---- */

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
    int s, rc = open_sock(NN_PULL, &s);
    if (rc)
        return rc;
    if (nn_bind(s, ipc) < 0)
        rc = nn_fail("nn_bind", ipc);
    if (!rc)
        rc = get_fd(s, NN_RCVFD, &tp->local_rcvfd);
    if (rc) {
        close_sock(s);
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
    int s, rc = open_sock(NN_PULL, &s);
    if (rc)
        return rc;
    if (strchr(host, ':'))
        rc = set_opt(s, NN_SOL_SOCKET, NN_IPV4ONLY, 0, "NN_IPV4ONLY");

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
            rc = nn_fail("nn_bind", url);
        }
    }
    if (!rc && !bound) {
        cps__log(CPS_LOG_ERROR, SUB, "nn_bind %s: no free port after %d tries in %u..%u", host,
                 tries, TP_PORT_LO, TP_PORT_HI);
        rc = CPS_ETRANSPORT;
    }
    if (!rc)
        rc = get_fd(s, NN_RCVFD, &tp->rcvfd);
    if (rc) {
        close_sock(s);
        tp->rcvfd = -1;
        return rc;
    }
    /* After the tcp:// bind, whose port no other process holds now: so the ipc file named after
     * it is no live node's, and a stale one (a crashed process's) can go. */
    if (tp->rundir[0])
        rc = bind_local(tp, url);
    if (rc) {
        close_sock(s);
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
            int frc = queue_flush(tp, tp->pfd_peer[i]);
            if (frc < 0)
                return frc;
        }
    }
    return wake;
}

/* A message being assembled from a sender is dropped whole: counted with the refused ones. */
static void asm_drop(cps__tp *tp, tp_asm *a, const char *why)
{
    if (!a->buf)
        return;
    tp->auth_dropped++;
    cps__log(CPS_LOG_WARN, SUB,
             "%s: dropped a framed message whole (%llu of %llu bytes arrived): %s", tp->inbox_url,
             (unsigned long long)a->next, (unsigned long long)a->total, why);
    nn_freemsg(a->buf);
    a->buf = NULL;
    a->dropped_id = a->msg_id;
}

/* The assembly slot of sender `salt`, or a new one (a free slot, else the least recently heard
 * sender's, whose message in progress is dropped). */
static tp_asm *asm_slot(cps__tp *tp, const unsigned char *salt, int create)
{
    tp_asm *lru = &tp->asms[0];
    for (size_t i = 0; i < TP_ASM_MAX; i++) {
        tp_asm *a = &tp->asms[i];
        if (a->live && memcmp(a->salt, salt, CPS_AUTH_SALT) == 0)
            return a;
        if (lru->live && (!a->live || a->used < lru->used))
            lru = a;
    }
    if (!create)
        return NULL;
    asm_drop(tp, lru, "more senders framing at once than kept");
    memset(lru, 0, sizeof *lru);
    memcpy(lru->salt, salt, CPS_AUTH_SALT);
    lru->live = 1;
    return lru;
}

/* 1 and the whole message in *out when a's last byte has arrived, else 0. */
static int asm_done(tp_asm *a, void **out, size_t *out_len)
{
    if (a->next < a->total)
        return 0;
    *out = a->buf;
    *out_len = (size_t)a->total;
    a->buf = NULL;
    return 1;
}

/* A frame whose tag was checked (`salt` its sender's). Returns 1 and the whole message in
 * *out and *out_len when this frame completed one, else 0; buf is consumed either way. */
static int frame_take(cps__tp *tp, void *buf, size_t len, const unsigned char *salt, void **out,
                      size_t *out_len)
{
    cps__frame fr;
    int ok = cps__frame_decode(buf, len, &fr) == 0;
    tp_asm *a = asm_slot(tp, salt, ok);
    if (!ok) {
        tp->auth_dropped++;
        if (a)
            asm_drop(tp, a, "a malformed frame");
        nn_freemsg(buf);
        return 0;
    }
    if (fr.offset == 0) {
        asm_drop(tp, a, "a new message started before its last frame");
        a->buf = nn_allocmsg(fr.total + CPS_AUTH_TRAILER, 0);
        if (!a->buf) {
            cps__log(CPS_LOG_ERROR, SUB, "%s: no memory for a framed message of %llu bytes",
                     tp->inbox_url, (unsigned long long)fr.total);
            nn_freemsg(buf);
            return 0;
        }
        a->msg_id = fr.msg_id;
        a->total = fr.total;
        a->next = 0;
    } else if (!a->buf || a->msg_id != fr.msg_id || a->next != fr.offset || a->total != fr.total) {
        /* A frame that does not continue the message in progress: one before it was lost or
         * refused (a forgery in its place), so nothing of that message may be used. */
        tp->auth_dropped++;
        if (a->buf)
            asm_drop(tp, a, "a frame missing (refused or lost) before this one");
        else if (a->dropped_id != fr.msg_id)
            cps__log(CPS_LOG_WARN, SUB,
                     "%s: dropped a framed message whole (its first frame was refused or lost)",
                     tp->inbox_url);
        a->dropped_id = fr.msg_id;
        nn_freemsg(buf);
        return 0;
    }
    a->used = ++tp->asm_tick;
    memcpy(a->buf + a->next, fr.data, fr.len);
    a->next += fr.len;
    nn_freemsg(buf);
    return asm_done(a, out, out_len);
}

/* A frame that continues the message being assembled from its sender is checked while its bytes
 * are copied into place (cps__auth_open_copy): one pass over them instead of a check and then a
 * copy. Returns -1 when the frame is not such a one (the caller checks it and takes it the
 * usual way: first frames among them, so that no buffer is sized by an unchecked header), else
 * buf is consumed and it returns as recv_one: 1 the message complete (in *out), 2 taken, 0
 * refused. */
static int frame_take_checking(cps__tp *tp, void *buf, size_t n, void **out, size_t *out_len)
{
    if (n < CPS_AUTH_TRAILER)
        return -1;
    size_t body = n - CPS_AUTH_TRAILER;
    cps__frame fr;
    /* Unchecked yet: only says where the bytes would go, and only into a message whose earlier
     * frames were checked. */
    if (cps__frame_decode(buf, body, &fr) != 0 || fr.offset == 0)
        return -1;
    tp_asm *a = asm_slot(tp, (unsigned char *)buf + body, 0);
    if (!a || !a->buf || a->msg_id != fr.msg_id || a->next != fr.offset || a->total != fr.total)
        return -1;
    size_t got;
    int verdict =
        cps__auth_open_copy(tp->auth, buf, n, &got, CPS_FRAME_HDR, a->buf + a->next, fr.len);
    if (verdict != CPS_AUTH_OK) {
        /* Refused as if checked first: its bytes lie past a->next, unchecked, where the
         * genuine frames that must still come to complete the message write over them (a
         * message is delivered only when checked frames have filled it up to its end). */
        auth_refused(tp, buf, n, verdict);
        nn_freemsg(buf);
        return 0;
    }
    a->used = ++tp->asm_tick;
    a->next += fr.len;
    nn_freemsg(buf);
    return asm_done(a, out, out_len) ? 1 : 2;
}

/* A descriptor from the ipc inbox (ring.h): its payload is delivered from the sender's ring.
 * Returns 1 delivered or 0 refused, as recv_one. */
static int ring_take(cps__tp *tp, void *desc, size_t len, cps__tp_recv_fn fn, void *ctx)
{
    cps__ring_desc d;
    void *buf = NULL;
    int why = CPS_RING_NO_RING;
    int rc = tp->ring_peers ? cps__ring_desc_decode(desc, len, &d, &why) : CPS_EPROTO;
    if (!rc)
        rc = cps__ring_resolve(tp->ring_peers, &d, &buf, &why);
    nn_freemsg(desc);
    if (rc) {
        /* Rate-limited with the refused MACs: a restarted sender's old descriptors come in a
         * burst. */
        if (tp->ring_refused++ == 0 || now_ms() - tp->auth_logged_ms >= TP_AUTH_LOG_MS) {
            tp->auth_logged_ms = now_ms();
            cps__log(CPS_LOG_WARN, SUB, "%s: ring descriptor refused: %s (%llu so far)",
                     tp->inbox_url, cps__ring_why_str(why), (unsigned long long)tp->ring_refused);
        }
        return 0;
    }
    tp->ring_recv++;
    fn(ctx, buf, (size_t)d.len);
    return 1;
}

void cps__tp_defer_check(cps__tp *tp, uint8_t type, cps__tp_pending_fn fn, void *ctx)
{
    if (!tp)
        return;
    if (!fn) {
        memset(tp->defer_types, 0, sizeof tp->defer_types);
        tp->defer_fn = NULL;
        tp->defer_ctx = NULL;
        return;
    }
    tp->defer_types[type / 64] |= 1ull << (type % 64);
    tp->defer_fn = fn;
    tp->defer_ctx = ctx;
}

static int deferred(const cps__tp *tp, const unsigned char *m, size_t n)
{
    /* Unchecked: the type only picks which path checks. */
    if (!tp->defer_fn || n < CPS_WIRE_HDR_SIZE + CPS_AUTH_TRAILER ||
        cps__le32_get(m) != CPS_WIRE_MAGIC) /* frames among others: checked as assembled */
        return 0;
    unsigned type = m[5];
    return (int)(tp->defer_types[type / 64] >> (type % 64) & 1u);
}

const void *cps__tp_pending_peek(const cps__tp_pending *m, size_t *len)
{
    *len = m->n - CPS_AUTH_TRAILER; /* deferred() saw at least a header and a trailer */
    return m->buf;
}

static int pending_verdict(cps__tp_pending *m, int verdict)
{
    if (verdict == CPS_AUTH_OK) {
        m->state = PEND_CHECKED;
        return 0;
    }
    auth_refused(m->tp, m->buf, m->n, verdict);
    nn_freemsg(m->buf);
    m->buf = NULL;
    m->state = PEND_REFUSED;
    return CPS_EPROTO;
}

int cps__tp_pending_open_copy(cps__tp_pending *m, size_t at, void *dst, size_t n)
{
    if (m->state != PEND_UNCHECKED || at > m->n - CPS_AUTH_TRAILER ||
        n > m->n - CPS_AUTH_TRAILER - at)
        return CPS_EINVAL;
    return pending_verdict(m, cps__auth_open_copy(m->tp->auth, m->buf, m->n, &m->body, at, dst, n));
}

int cps__tp_pending_take(cps__tp_pending *m, void **buf, size_t *len)
{
    /* A refused message is gone: taking it is a caller that ignored open_copy's answer. */
    assert(m->state != PEND_REFUSED && m->state != PEND_TAKEN);
    if (m->state == PEND_UNCHECKED &&
        pending_verdict(m, cps__auth_open(m->tp->auth, m->buf, m->n, &m->body)) != 0)
        return CPS_EPROTO;
    if (m->state != PEND_CHECKED)
        return CPS_EPROTO;
    m->state = PEND_TAKEN;
    *buf = m->buf;
    *len = m->body;
    m->buf = NULL;
    return 0;
}

/* A message of a deferred type: its callback checks it during its own copy, or declines. Returns
 * as recv_one: 1 delivered (taken, or declined and delivered here), 0 refused. */
static int pending_take(cps__tp *tp, void *buf, size_t n, cps__tp_recv_fn fn, void *ctx)
{
    cps__tp_pending m = {tp, buf, n, 0, PEND_UNCHECKED};
    tp->defer_fn(tp->defer_ctx, &m);
    if (m.state == PEND_REFUSED)
        return 0;
    if (m.state == PEND_TAKEN)
        return 1;
    void *b;
    size_t len;
    if (cps__tp_pending_take(&m, &b, &len) != 0)
        return 0;
    fn(ctx, b, len);
    return 1;
}

/* One message from inbox `sock` (the ipc one if `local`): 1 delivered, 0 refused, 2 a frame
 * taken (no message complete yet), -1 none waiting, or CPS_ETRANSPORT. */
static int recv_one(cps__tp *tp, int sock, int local, cps__tp_recv_fn fn, void *ctx)
{
    for (;;) {
        void *buf = NULL;
        int n = nn_recv(sock, &buf, NN_MSG, NN_DONTWAIT);
        if (n < 0) {
            int e = nn_errno();
            if (e == EINTR)
                continue;
            if (e == EAGAIN)
                return -1;
            cps__log(CPS_LOG_ERROR, SUB, "nn_recv on %s%s: %s", tp->inbox_url,
                     local ? " (ipc)" : "", nn_strerror(e));
            return CPS_ETRANSPORT;
        }
        if (!local && cps__auth_keyed(tp->auth) && cps__frame_is(buf, (size_t)n)) {
            void *whole;
            size_t wlen;
            int rc = frame_take_checking(tp, buf, (size_t)n, &whole, &wlen);
            if (rc == 1)
                fn(ctx, whole, wlen);
            if (rc >= 0)
                return rc;
        }
        if (!local && cps__auth_keyed(tp->auth) && deferred(tp, buf, (size_t)n))
            return pending_take(tp, buf, (size_t)n, fn, ctx);
        size_t body;
        /* The ipc inbox is reached only through the private directory: the operating system
         * vouches for the sender there, so only the trailer's shape and the version count. */
        int verdict = local ? cps__auth_open_local(buf, (size_t)n, &body)
                            : cps__auth_open(tp->auth, buf, (size_t)n, &body);
        if (verdict != CPS_AUTH_OK) {
            auth_refused(tp, buf, (size_t)n, verdict);
            nn_freemsg(buf);
            return 0;
        }
        if (local && cps__ring_desc_is(buf, body))
            return ring_take(tp, buf, body, fn, ctx);
        if (!local && cps__frame_is(buf, body)) {
            void *whole;
            size_t wlen;
            if (!frame_take(tp, buf, body, (unsigned char *)buf + body, &whole, &wlen))
                return 2;
            buf = whole;
            body = wlen;
        }
        fn(ctx, buf, body);
        return 1;
    }
}

/* Deliver what the inboxes hold now, up to `max` (0: all), taking from the tcp and the ipc
 * inbox in turn so that neither starves the other under a limit. */
static int drain_inbox(cps__tp *tp, cps__tp_recv_fn fn, void *ctx, int max)
{
    int delivered = 0, refused = 0;
    int socks[2] = {tp->inbox, tp->local_inbox};
    int empty[2] = {0, tp->local_inbox < 0};
    int turn = tp->drain_turn;
    /* Refused messages end the batch too, after a while: a flood of forgeries must not keep the
     * event loop from its timers. */
    while ((max <= 0 || delivered < max) && refused < 256 && !(empty[0] && empty[1])) {
        turn ^= 1;
        if (empty[turn])
            continue;
        int rc = recv_one(tp, socks[turn], turn, fn, ctx);
        if (rc == CPS_ETRANSPORT)
            return delivered ? delivered : rc;
        if (rc < 0)
            empty[turn] = 1;
        else if (rc == 0)
            refused++;
        else if (rc == 1)
            delivered++;
    }
    tp->drain_turn = turn;
    return delivered;
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
            delivered = drain_inbox(tp, fn, ctx, max_msgs);
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

int cps__tp_drain(cps__tp *tp, cps__tp_recv_fn fn, void *ctx, int max_msgs)
{
    if (!tp || !fn)
        return CPS_EINVAL;
    return tp->inbox >= 0 ? drain_inbox(tp, fn, ctx, max_msgs) : 0;
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
            return queue_flush(tp, tp->peers[i]);
    return 0;
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
        peer_free(tp, tp->peers[i]);
    free(tp->peers);
    if (tp->inbox >= 0)
        close_sock(tp->inbox);
    if (tp->local_inbox >= 0) {
        close_sock(tp->local_inbox);
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
