/* Private to src/transport: the transport's state, shared by the files that make it up.
 *
 *   transport.c  the object's life (create, runtime directory, bind, destroy) and the poll loop
 *   sock.c       nanomsg sockets with our options
 *   peer.c       the peer table: connect and reconnect, per-peer backlog queues, connection state
 *   send.c       the send paths: plain, framed, through our ring, and reserved buffers
 *   recv.c       the receive path: one message at a time, frames, ring descriptors, deferred checks
 */
#ifndef CPS_TRANSPORT_INT_H
#define CPS_TRANSPORT_INT_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/un.h>
#include <time.h>

#include "transport/auth.h"
#include "transport/ring.h"
#include "transport/transport.h"

#define TP_QUEUE_MAX   4096u /* per-peer backlog before senders see CPS_EAGAIN */
#define TP_URL_MAX     512
#define TP_AUTH_LOG_MS 1000 /* at most one line a second about refused messages */
#define TP_ASM_MAX     64   /* senders with a framed message being assembled, as auth's */

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

static inline int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A message that goes as frames (send_framed) rather than sealed whole. */
static inline int framed(const cps__tp *tp, size_t len)
{
    return tp->frame_size && len > tp->frame_size && cps__auth_keyed(tp->auth);
}

/* ---- sock.c ---- */

/* Log the pending nanomsg error; CPS_EINVAL or CPS_ETRANSPORT. */
int cps__tp_nn_fail(const char *op, const char *target);
/* nn_setsockopt of an int; 0 or an error (logged, `name` in the line). */
int cps__tp_set_opt(int s, int level, int opt, int val, const char *name);
/* nn_close, again while EINTR. */
void cps__tp_close_sock(int s);
/* A socket of nanomsg protocol `proto` with our options; 0 or an error (logged). */
int cps__tp_open_sock(int proto, int *out);
/* The socket's NN_RCVFD or NN_SNDFD (`opt`) in *fd. */
int cps__tp_get_fd(int s, int opt, int *fd);

/* ---- peer.c ---- */

/* Peer `id`, or NULL when unknown. */
tp_peer *cps__tp_peer_find(const cps__tp *tp, uint32_t id);
/* Closes p's socket and frees it with its backlog (not removed from the table). */
void cps__tp_peer_free(cps__tp *tp, tp_peer *p);
/* nanomsg statistic `stat` of p's socket, 0 when unavailable. */
uint64_t cps__tp_peer_stat(const tp_peer *p, int stat);
/* Takes back our ring's slots held for peer `id`; how many it held (see there). */
size_t cps__tp_ring_reclaim(cps__tp *tp, uint32_t id, uint64_t tag, const char *why);
/* Appends a sealed buffer to p's backlog (taking it); CPS_EAGAIN when the backlog is full. */
int cps__tp_queue_push(cps__tp *tp, tp_peer *p, void *buf, size_t len);
/* 1 sent (nanomsg owns buf), 0 not now, or a negative error. */
int cps__tp_try_send(tp_peer *p, void *buf);
/* Hands p's backlog to nanomsg, oldest first, until it pushes back. */
int cps__tp_queue_flush(cps__tp *tp, tp_peer *p);

/* ---- recv.c ---- */

/* Delivers what the inboxes hold now, up to `max` messages; how many, or an error. */
int cps__tp_drain_inbox(cps__tp *tp, cps__tp_recv_fn fn, void *ctx, int max);

#endif
