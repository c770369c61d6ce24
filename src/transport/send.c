/* The transport's send paths (see transport_int.h): a sealed message handed to nanomsg or queued,
 * a large one as frames, one to a same-host peer through our shared-memory ring, and buffers
 * reserved by the caller and filled in place (cps__tp_reserve, cps__tp_fill). */

#include "transport/transport_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <nanomsg/nn.h>

#include "chainps/error.h"
#include "core/array.h"
#include "core/log.h"
#include "transport/frame.h"
#include "transport/local.h"

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
        int rc = cps__tp_queue_flush(tp, p);
        if (rc < 0)
            return rc;
    }
    if (!p->qlen) {
        int rc = cps__tp_try_send(p, buf);
        if (rc != 0)
            return rc > 0 ? 0 : rc;
    }
    int rc = cps__tp_queue_push(tp, p, buf, len);
    if (rc == CPS_EAGAIN)
        cps__log(CPS_LOG_DEBUG, SUB, "peer %u (%s): queue full (%zu messages)", p->id, p->url,
                 p->qlen);
    return rc;
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
    tp_peer *o = cps__tp_peer_find(tp, oldest);
    if (!o || cps__tp_peer_gone(tp, oldest))
        return cps__tp_ring_reclaim(tp, oldest, UINT64_MAX, "gone");
    return cps__tp_ring_reclaim(tp, oldest, cps__tp_peer_stat(o, NN_STAT_BROKEN_CONNECTIONS),
                                "reconnected");
}

/* A slot of `len` bytes in ring r for local peer p, sent at once (reserve 0) or reserved for the
 * caller to build in (1). A full ring first takes back the slots of a receiver that died. 0, or
 * an error (then send inline). */
static int ring_slot(cps__tp *tp, cps__ring *r, tp_peer *p, size_t len, int reserve,
                     cps__ring_desc *d, unsigned char **slot)
{
    uint64_t tag = cps__tp_peer_stat(p, NN_STAT_BROKEN_CONNECTIONS);
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
    tp_peer *p = cps__tp_peer_find(tp, id);
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
        if (cps__ring_commit(tp->ring, &d, p->id, cps__tp_peer_stat(p, NN_STAT_BROKEN_CONNECTIONS),
                             len) == 0) {
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
        const tp_peer *p = cps__tp_peer_find(tp, e->peer);
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
    tp_peer *p = cps__tp_peer_find(tp, id);
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
