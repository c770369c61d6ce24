/* Message plumbing shared by the scheduler, servers and the worker client: building a message
 * into a transport buffer, sending it, and parsing a received one (header validation and snappy
 * decompression) into an aligned payload. */
#ifndef CPS_NODE_MSG_H
#define CPS_NODE_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "core/view.h"
#include "core/wire.h"
#include "transport/transport.h"

/* Monotonic milliseconds. The protocol state machines never call this; the loops do. */
uint64_t cps__now_ms(void);
/* Monotonic microseconds (the same clock), for timing work shorter than a millisecond. */
uint64_t cps__now_us(void);

/* Allocate a transport buffer for a message with `payload_len` payload bytes and write the
 * header (payload_len/raw_len are set here). The payload starts at CPS_WIRE_HDR_SIZE.
 * Returns NULL when out of memory. The caller owns the buffer (send it or cps__tp_free it). */
void *cps__msg_alloc(cps__msg_hdr *h, size_t payload_len);

/* As cps__msg_alloc, for a message to `peer` built in place: the buffer comes from
 * cps__tp_reserve (a slot of the same-host shared-memory ring when large enough, so that the
 * payload is written once). The caller sends it with cps__tp_send or gives it back with
 * cps__tp_unreserve, never cps__tp_free. A message sent shorter than reserved (compressed)
 * must have its header written again (cps__wire_hdr_encode). NULL when out of memory. */
void *cps__msg_reserve(cps__tp *tp, uint32_t peer, cps__msg_hdr *h, size_t payload_len);

/* Build and send a message with a copy of `payload`. Never takes the caller's payload.
 * Errors: CPS_ENOMEM, CPS_ENOTFOUND (unknown peer), CPS_EAGAIN, CPS_ETRANSPORT. */
int cps__msg_send(cps__tp *tp, uint32_t peer, cps__msg_hdr *h, const void *payload, size_t len);

/* Send an error reply to `req`'s sender with status `err` and a short text. */
int cps__msg_reply_error(cps__tp *tp, uint32_t self, uint64_t epoch, const cps__msg_hdr *req,
                         int err, const char *text);

/* Data-path evidence (recovery/suspect.h), the reporters' side shared by workers and servers:
 * for every live server of view v other than `self`, waiting(ctx, node, &heard) says since when a
 * request of ours has waited there (0: none) and sets `heard` to when we last heard from it (0:
 * never); those silent for evidence_ms by `now` go to the scheduler (peer 0) in one SUSPECT under
 * v's epoch. Returns how many were reported (0: none, or the send failed: it is tried again at
 * the next report). */
typedef uint64_t (*cps__waiting_fn)(void *ctx, uint32_t node, uint64_t *heard);
uint32_t cps__msg_report_suspects(cps__tp *tp, uint32_t self, const cps__view *v,
                                  uint32_t evidence_ms, cps__waiting_fn waiting, void *ctx,
                                  uint64_t now);

/* A received message, validated and decompressed. */
typedef struct cps__rx {
    cps__msg_hdr hdr;
    const void *payload; /* 8-byte aligned; hdr.raw_len bytes */
    size_t len;
    void *buf;   /* transport buffer (owned) */
    void *owned; /* malloc'd payload copy when decompressed or realigned (owned) */
} cps__rx;

/* Parse `buf` (taken: on success rx owns it, on error it is freed). On a bad message returns
 * CPS_EPROTO / CPS_ESIZE / CPS_ECORRUPT; rx->hdr is filled as far as it could be decoded
 * (hdr.type == 0 if the header itself was bad) so the caller can log and maybe reply. */
int cps__rx_parse(cps__rx *rx, void *buf, size_t len);
void cps__rx_free(cps__rx *rx);

/* XXH3-64 of bytes (Debian's libxxhash). It decides where a tensor's keys live (its name's
 * hash) and names key sets, both of which a data directory keeps: changing the function is a
 * change of the data directory's format (CPS_KEY_LAYOUT in server.c) and of the wire's. */
uint64_t cps__hash64(const void *p, size_t n);
uint64_t cps__splitmix64(uint64_t x);
/* Signature of the key set of a sync push (its keys and lengths): the servers count each key
 * set's applied steps under it, and a restore writes those counts. Never 0 (0 means "not an
 * aggregate"). */
uint64_t cps__keyset_sig(const uint64_t *keys, const uint32_t *lens, uint32_t n);

#endif
