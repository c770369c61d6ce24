/* The transport's receive path (see transport_int.h): one message at a time from an inbox, its
 * MAC checked, frames assembled, ring descriptors resolved, and the checks a receiver makes
 * during its own copy (cps__tp_defer_check). */

#include "transport/transport_int.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include <nanomsg/nn.h>

#include "chainps/error.h"
#include "core/log.h"
#include "core/wire.h"
#include "transport/frame.h"

/* A message handed to a cps__tp_pending_fn unchecked (transport.h). */
enum { PEND_UNCHECKED, PEND_CHECKED, PEND_TAKEN, PEND_REFUSED };
struct cps__tp_pending {
    cps__tp *tp;
    unsigned char *buf; /* nanomsg's, trailer included */
    size_t n;           /* bytes received */
    size_t body;        /* without the trailer (once checked: as checked) */
    int state;
};

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
int cps__tp_drain_inbox(cps__tp *tp, cps__tp_recv_fn fn, void *ctx, int max)
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

int cps__tp_drain(cps__tp *tp, cps__tp_recv_fn fn, void *ctx, int max_msgs)
{
    if (!tp || !fn)
        return CPS_EINVAL;
    return tp->inbox >= 0 ? cps__tp_drain_inbox(tp, fn, ctx, max_msgs) : 0;
}
