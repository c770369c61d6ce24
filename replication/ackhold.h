/* Held CHAIN_ACKs: when an acknowledgement goes out, as a pure state machine.
 *
 * A tail (or a middle replica passing an ack up) acknowledges every update to its predecessor.
 * Sent at once, that ack is one more message per update (one in four of a push with 2
 * replicas), and for small updates its send, wake-ups and receive are a good part of what the
 * update itself costs the two servers. The acks only let the predecessors drop what they keep
 * for re-sending (and answer retried requests once they are committed), so each is held for up
 * to CPS_ACK_HOLD_MS, and a later ack of the same range replaces it: CHAIN_ACK(seq) covers
 * every update up to seq (bench_ps, 4 KB pushes, 2 servers: +30% pushes per second). For the
 * protocol this is a network that delays acks a little and loses the superseded ones, which it
 * tolerates (the simulator's network does both); CPS_ACK_HOLD_MS is far below the FWD re-send
 * time (200 ms). Acks with a flag (the answer to a MARK) and everything else go out at once.
 *
 * The caller sends what the calls hand back (cps__ackhold_sends). Pure: no I/O, no clock (time
 * arrives as `now`). Not thread-safe.
 */
#ifndef CPS_REPLICATION_ACKHOLD_H
#define CPS_REPLICATION_ACKHOLD_H

#include <stddef.h>
#include <stdint.h>

#include "core/wire.h"

#define CPS_ACK_HOLD_MS 2

typedef struct cps__ackhold cps__ackhold;

/* An ack to send now: the header of a CHAIN_ACK without payload, to node `to`. */
typedef struct cps__ackhold_send {
    uint32_t to;
    cps__msg_hdr hdr;
} cps__ackhold_send;

/* Errors: CPS_ENOMEM. */
int cps__ackhold_create(cps__ackhold **out);
/* Free the state; acks still held are dropped (the chain state they came from is gone). NULL
 * is a no-op. */
void cps__ackhold_destroy(cps__ackhold *h);

/* The chain wants to send CHAIN_ACK `hdr` to node `to`; `nranges` is the current view's range
 * count. Returns 1 if it is held (sent later by cps__ackhold_due), 0 if the caller must send it
 * now (it has a flag or a payload, its range is out of bounds, or no memory to hold it). Held
 * acks it displaces (one of another link, epoch or a higher seq; all of them when the range
 * count changed) are in cps__ackhold_sends, to go out before `hdr`. */
int cps__ackhold_offer(cps__ackhold *h, uint32_t nranges, uint32_t to, const cps__msg_hdr *hdr,
                       uint64_t now);

/* Hand every held ack to cps__ackhold_sends when the oldest has waited CPS_ACK_HOLD_MS, or at
 * once when `force` (a view is about to be installed, the server stops). */
void cps__ackhold_due(cps__ackhold *h, uint64_t now, int force);

/* Milliseconds until held acks are due, at most max_ms (max_ms if none is held). */
int cps__ackhold_wait_ms(const cps__ackhold *h, uint64_t now, int max_ms);

/* Acks held now. */
uint32_t cps__ackhold_held(const cps__ackhold *h);

/* The acks the last call handed back, in the order to send them; valid until the next call. */
size_t cps__ackhold_sends(cps__ackhold *h, const cps__ackhold_send **out);

#endif
