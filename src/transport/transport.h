/* Transport: one inbox per node, one outbound pipe per peer, over nanomsg.
 *
 * Every node binds one NN_PULL inbox; to send to a peer it keeps one NN_PUSH socket connected to
 * that peer's inbox. Sends never block: a message that nanomsg will not take now (peer not yet
 * connected, buffers full) waits in a per-peer queue that cps__tp_poll() flushes when the peer's
 * NN_SNDFD becomes writable. Message buffers come from cps__tp_alloc() (nanomsg's allocator) so a
 * send hands the buffer to nanomsg without a copy.
 *
 * NN_RCVMAXSIZE is raised to CPS_WIRE_HDR_SIZE + CPS_WIRE_MAX_PAYLOAD on every socket (nanomsg's
 * default of 1 MiB makes the receiver drop larger messages silently while the sender sees
 * success), and socket buffers are set to 4 MiB.
 *
 * Not thread-safe: one thread owns a cps__tp.
 */
#ifndef CPS_TRANSPORT_H
#define CPS_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

typedef struct cps__tp cps__tp;

/* Create a transport with no inbox yet. `key` is the job's CPS_AUTH_KEY_SIZE-byte key (copied)
 * or NULL for a job without a secret (--insecure): see transport/auth.h. With a key, every
 * message sent carries a MAC and every message received is checked before it is delivered;
 * one that fails is dropped, counted (cps__tp_auth_dropped) and logged at most once a second.
 * Errors: CPS_ENOMEM, CPS_EIO (no randomness for the sender's salt). */
int cps__tp_create(const unsigned char *key, cps__tp **out);
/* Close every socket and free queued messages. NULL is a no-op. */
void cps__tp_destroy(cps__tp *tp);

/* Bind the inbox to `url` ("tcp://host:port"), and the ipc:// inbox with a runtime directory. Port
 * 0 picks a free port in 20000..59999 (tries several at random) and writes the chosen port to
 * *port_out (may be NULL). Errors: CPS_EINVAL (bad url), CPS_ETRANSPORT (bind failed; the nanomsg
 * error is logged), CPS_ECONFIG (the runtime directory is not private to this user; logged). */
int cps__tp_bind(cps__tp *tp, const char *host, uint16_t port, uint16_t *port_out);

/* The job's private runtime directory (transport/local.h), or NULL/"" for none: then every
 * channel is tcp://. Read from CHAINPS_RUNTIME_DIR by cps__tp_create; call before cps__tp_bind.
 * With one, cps__tp_bind also binds an ipc:// inbox in it (refusing, CPS_ECONFIG, a directory
 * that is a link, not ours or open to group or others), and cps__tp_peer_set connects a peer
 * that shares this host, network namespace and directory over ipc://, where messages carry no
 * MAC (a directory too long for a socket's path: a warning, and tcp:// only). Errors: CPS_EINVAL
 * (bound already, or longer than the transport keeps). */
int cps__tp_set_runtime_dir(cps__tp *tp, const char *dir);

/* Register (or re-point) peer `id` at inbox `url`. Idempotent when the url is unchanged; a new
 * url closes the old socket and drops its queue. Errors: CPS_EINVAL, CPS_ETRANSPORT, CPS_ENOMEM. */
int cps__tp_peer_set(cps__tp *tp, uint32_t id, const char *url);
/* Forget a peer: close its socket, free its queue. Unknown id is a no-op. */
void cps__tp_peer_drop(cps__tp *tp, uint32_t id);
/* 1 if the peer's process looks gone: the connection to it broke and at least one reconnect
 * since failed (on a live host, connection refused: nothing listens on its address), with no
 * connection now. 0 otherwise, for an unknown peer too. A peer behind a partition is not gone
 * (its connects time out slowly or not at all): heartbeats judge it. Cheap (socket statistics);
 * call it from the thread that owns the transport. */
int cps__tp_peer_gone(cps__tp *tp, uint32_t id);
/* 1 if the peer is connected over ipc:// (same host and namespace), 0 if over tcp:// or
 * unknown. */
int cps__tp_peer_local(const cps__tp *tp, uint32_t id);
/* 1 if the peer is registered. */
int cps__tp_peer_known(const cps__tp *tp, uint32_t id);
/* 1 if a connection to the peer is up now (nanomsg connects, and reconnects, on its own, whether
 * or not anything is sent). 0 otherwise, for an unknown peer too. Thread as cps__tp_peer_gone. */
int cps__tp_peer_connected(cps__tp *tp, uint32_t id);

/* Allocate a message buffer of `len` bytes (8-byte aligned), with room after them for the
 * authentication trailer. NULL on failure. */
void *cps__tp_alloc(size_t len);
/* Free a buffer from cps__tp_alloc() or one received from the inbox; a received buffer that lies in
 * a same-host sender's shared-memory ring (transport/ring.h) gives its slot back to the sender.
 * Any thread. NULL is a no-op. */
void cps__tp_free(void *buf);

/* Send `buf` (from cps__tp_alloc, `len` bytes) to peer `id`. With a key, over tcp://, a message
 * longer than the frame size (CHAINPS_FRAME_KB, read at create; unset or 0: never) goes as
 * frames sealed one by one (transport/frame.h); the receiver delivers it whole or not at all. Over
 * ipc://, a message of at least CHAINPS_RING_MIN_KB KiB (default 256; 0: never) is copied into
 * this transport's shared-memory ring and only its descriptor is sent (transport/ring.h), or
 * inline when the ring is full. `buf` may also be a buffer received from a ring (forwarded): it
 * is copied (into our ring when the peer is same-host: one copy), and released once the copy is
 * sent. `buf` may be a buffer from cps__tp_reserve: see there (`len` up to the reserved length;
 * on failure it is still reserved and the caller's). On
 * success the transport owns buf (it is sent now or queued); on failure the caller still owns it.
 * Errors: CPS_ENOTFOUND (unknown peer), CPS_EAGAIN (peer queue over its limit), CPS_ETRANSPORT. */
int cps__tp_send(cps__tp *tp, uint32_t id, void *buf, size_t len);

/* Build a message in place: a buffer of `len` bytes for a message to peer `id`, to be passed
 * to cps__tp_send (or given back by cps__tp_unreserve). When the peer is same-host and `len`
 * is at least the ring threshold (CHAINPS_RING_MIN_KB), it is a slot of this transport's
 * shared-memory ring, and sending it sends only its descriptor: the message is written once,
 * by its builder, instead of into a buffer and then copied into the ring. Otherwise (a tcp://
 * peer, an unknown one, a small message, no ring, the ring full) it is a cps__tp_alloc buffer.
 * Either way: writable, 8-byte aligned (a slot: 64), with no room promised after `len`.
 *
 * Ownership: the buffer is the caller's until cps__tp_send succeeds (then the transport's) or
 * cps__tp_unreserve; never cps__tp_free it (a slot is no nanomsg buffer). cps__tp_send may be
 * given a shorter length than reserved (1..len: a message that came out shorter, compressed)
 * and another peer than reserved for. A slot stays valid through anything the transport does
 * meanwhile: while it is unsent no receiver has it, so it is never taken back with a dropped,
 * moved or reconnected peer's slots; if the ring is retired meanwhile (ring.h), the old file
 * stays mapped for it, and its send goes as a copy. A send to a peer no longer same-host is a
 * copy too. A fallback buffer sent shorter than reserved is cut to that length in place (no
 * copy; after a failed send it stays reserved at the shorter length; only with a nanomsg older
 * than 1.1, whose cut may move the chunk, does the failed send free it instead, and a later
 * cps__tp_unreserve refuses it, logged). A reservation left unsent
 * holds its slot, and the ring, first in first out, fills behind it: send or unreserve promptly.
 * Buffers not sent when the transport is destroyed are freed with it (a slot's pointer is then
 * invalid). NULL: out of memory, or `len` 0. Same thread as the rest of the transport. */
void *cps__tp_reserve(cps__tp *tp, uint32_t id, size_t len);
/* Copy src[0, n) into buf[off, off + n), buf being from cps__tp_reserve (and not yet sent):
 * where the message will be sealed whole at send (reserved for a tcp:// peer, with a key, too
 * short for frames), the MAC is computed as the bytes are copied, in one pass over them instead
 * of a copy and later a MAC of its own, and cps__tp_send only finishes it. Elsewhere (a ring
 * slot, an ipc:// or unknown peer, no key, frames) it is a plain memcpy.
 *
 * The MAC runs over the message in order, so: write every byte before `off` (the header, say)
 * before the first fill, fill at increasing offsets, and change no byte before the end of the
 * last fill afterwards (bytes between two fills must be written before the later fill, which
 * MACs them; bytes after the last fill any time before the send). A message sent shorter than
 * reserved has its MAC finished at that length. A fill that breaks the order still copies, and
 * the message is then sealed whole at send, as is one sent to another kind of peer than
 * reserved for, or while another buffer's fills have started since (one MAC runs at a time): the
 * MAC done so far
 * is wasted, never wrong. A change before that end after a fill is not caught: the receiver
 * drops the message as a forgery. Errors: CPS_EINVAL (buf not reserved, or off + n beyond its
 * reserved length: nothing copied). */
int cps__tp_fill(cps__tp *tp, void *buf, size_t off, const void *src, size_t n);
/* Give back a buffer from cps__tp_reserve that will not be sent (a slot is reused at once: no
 * receiver saw it). Only a reserved buffer not yet sent is taken: any other pointer (one sent
 * already, given back already, or never reserved: a slot pointer of ours is shared memory that
 * nn_freemsg would abort on) is logged and left alone, CPS_EINVAL; a buffer that was never
 * reserved is the caller's to cps__tp_free. 0 given back; NULL is a no-op (0). */
int cps__tp_unreserve(cps__tp *tp, void *buf);

/* This transport's shared-memory ring, for tests and diagnostics (all 0 without a ring). */
typedef struct cps__tp_ring_stats {
    uint64_t sent;        /* messages sent as descriptors */
    uint64_t built;       /* of those, built in a reserved slot (no copy) */
    uint64_t inline_full; /* large same-host messages that went inline for want of room */
    uint64_t retired;     /* generations retired (a slot taken back while lent) */
    size_t live;          /* slots lent out or reserved now, in the current generation */
    size_t retired_held;  /* retired files still mapped for slots reserved in them */
} cps__tp_ring_stats;
void cps__tp_ring_stats_get(const cps__tp *tp, cps__tp_ring_stats *out);

/* Called for each received message that passed authentication; `len` excludes the trailer. The
 * callee owns `buf` and must cps__tp_free() it (it may keep
 * it past the call, e.g. to aggregate gradients without a copy). A large message from a same-host
 * peer arrives as a pointer into that peer's shared-memory ring (transport/ring.h): readable and
 * writable, 64-byte aligned, with no room after `len` bytes; keeping it holds the sender's slot
 * (a sender whose ring is full sends inline). */
typedef void (*cps__tp_recv_fn)(void *ctx, void *buf, size_t len);

/* ---- checks made during a copy of the receiver's own ("check pending") ----
 * With a key, a message from a tcp:// peer is normally checked (auth.h) before cps__tp_recv_fn
 * sees it. A receiver that copies some message type out of the message anyway (the worker's pull
 * reply, copied into the caller's buffer) may declare that type with cps__tp_defer_check: such a
 * message is then handed to its cps__tp_pending_fn unchecked, as an opaque cps__tp_pending that
 * gives its bytes out only checked. Messages of other types, unkeyed jobs, same-host (ipc://,
 * ring) messages and framed ones (checked as they are assembled) never take this path.
 *
 * What the pending callback may do, before it returns (the handle dies with the call):
 *  - cps__tp_pending_peek: the bytes, UNAUTHENTICATED, only to plan where a copy goes (as the
 *    framed path reads a frame's header): no state may change on what it says;
 *  - cps__tp_pending_open_copy: check the message while copying part of it into the caller's
 *    memory, in one pass. Refused: the message is dropped, counted and logged as any refused
 *    message, and the destination holds unauthenticated bytes to throw away;
 *  - cps__tp_pending_take: the message, checked (by open_copy before, or now), as a
 *    cps__tp_recv_fn would get it (the callee owns it).
 * A callback that returns without taking or refusing it declines: the transport checks it (if
 * open_copy did not) and delivers it to the ordinary cps__tp_recv_fn. So no path hands out the
 * bytes unchecked, and a type declared but not handled only costs the check it always had. Debug
 * builds assert that a message refused or taken is not taken (again). */
typedef struct cps__tp_pending cps__tp_pending;
typedef void (*cps__tp_pending_fn)(void *ctx, cps__tp_pending *m);
/* Route messages whose header names wire type `type` to `fn` (one fn and ctx per transport: a
 * later call replaces them for every declared type). `fn` NULL: no type is deferred any more.
 * The header's type is read unchecked: a forger who names a declared type only reaches a path
 * that checks too. */
void cps__tp_defer_check(cps__tp *tp, uint8_t type, cps__tp_pending_fn fn, void *ctx);
/* The message's bytes without its trailer (*len), unauthenticated: read only to plan a copy. */
const void *cps__tp_pending_peek(const cps__tp_pending *m, size_t *len);
/* Check the message and copy its bytes [at, at + n) to dst in the same pass. 0: authentic (the
 * copy is of checked bytes; cps__tp_pending_take then hands it out). CPS_EPROTO: refused (a
 * wrong tag, a replay, ...; counted in cps__tp_auth_dropped and logged); dst[0, n) may hold
 * unauthenticated bytes and must not be used; the message is gone. CPS_EINVAL: at + n beyond the
 * message, or checked already (nothing copied; the message is still pending or checked). */
int cps__tp_pending_open_copy(cps__tp_pending *m, size_t at, void *dst, size_t n);
/* The message, checked: *buf and *len as a cps__tp_recv_fn gets them (the caller owns buf and
 * cps__tp_free()s it). Checks it now unless open_copy did. CPS_EPROTO: refused now (counted,
 * logged; the message is gone) or earlier by open_copy. */
int cps__tp_pending_take(cps__tp_pending *m, void **buf, size_t *len);

/* Wait up to `timeout_ms` (-1: forever, 0: just check) for inbox messages, deliver every message
 * already available to `fn` (at most `max_msgs`, 0 for no limit), and flush peer queues that can
 * take data. Returns the number delivered (>= 0) or CPS_ETRANSPORT. Interrupted by a signal:
 * returns 0. Extra fds: `cps__tp_poll_extra` lets the event loop wake on its own fd. */
int cps__tp_poll(cps__tp *tp, int timeout_ms, cps__tp_recv_fn fn, void *ctx, int max_msgs);
/* An extra fd to include in poll for reading (e.g. an eventfd); -1 to clear. When it is readable
 * cps__tp_poll returns (possibly 0 delivered). */
void cps__tp_poll_extra(cps__tp *tp, int fd);

/* ---- for an event loop that owns the poll (node/loop.h) ----
 * The inbox's NN_RCVFD (readable when a message waits), or -1 before cps__tp_bind. */
int cps__tp_inbox_fd(const cps__tp *tp);
/* The ipc:// inbox's NN_RCVFD, or -1 without one. An event loop watches it beside
 * cps__tp_inbox_fd; cps__tp_drain reads both inboxes. */
int cps__tp_inbox_local_fd(const cps__tp *tp);
/* Deliver the inbox messages that are waiting now, at most `max_msgs` (0: all), to `fn`,
 * without waiting. Returns the number delivered or CPS_ETRANSPORT. */
int cps__tp_drain(cps__tp *tp, cps__tp_recv_fn fn, void *ctx, int max_msgs);
/* Told `fd` (a peer's NN_SNDFD) when that peer's queue becomes non-empty (`on` 1: watch fd and
 * call cps__tp_flush_fd when it is readable) and when it empties or the peer is dropped (0:
 * stop watching; the fd is still open during the call). Called from cps__tp_send and the
 * flushes, so the callee must not call back into the transport. */
typedef void (*cps__tp_backlog_fn)(void *ctx, int fd, int on);
/* Install `fn` (NULL: none). The previous one is told `on` 0, and the new one `on` 1, for every
 * peer that has a backlog now. cps__tp_destroy forgets it first, telling it nothing. */
void cps__tp_set_backlog_fn(cps__tp *tp, cps__tp_backlog_fn fn, void *ctx);
/* Hand the backlog of the peer whose NN_SNDFD is `fd` to nanomsg, as far as it takes it.
 * Unknown fd: 0. Returns 0 or CPS_ETRANSPORT. */
int cps__tp_flush_fd(cps__tp *tp, int fd);

/* Number of messages waiting in peer queues (all peers); each frame of a framed message
 * (transport/frame.h) counts as one. */
size_t cps__tp_queued(const cps__tp *tp);
/* Messages refused so far because they failed authentication (or were replayed). */
uint64_t cps__tp_auth_dropped(const cps__tp *tp);

#endif
