/* Peers that are not members of the job (e.g. `chainps status`): they tell us their inbox in
 * the request, get a short-lived peer id from a small table, and are dropped after a linger long
 * enough for the reply to leave. A peer id is never pointed at another inbox while its linger
 * runs: that would drop what the transport still queues for it (and take back its ring slots),
 * cutting off a reply on its way. */
#ifndef CPS_NODE_TEMP_PEERS_H
#define CPS_NODE_TEMP_PEERS_H

#include <stdint.h>

#include "core/view.h"
#include "transport/transport.h"

#define CPS_TEMP_PEER_BASE      0x40000000u
#define CPS_TEMP_PEERS          64
#define CPS_TEMP_PEER_LINGER_MS 5000

typedef struct cps__temp_peers {
    struct {
        uint32_t id;
        uint64_t drop_at_ms;
        char addr[CPS_ADDR_MAX];
    } slot[CPS_TEMP_PEERS];
    uint32_t next;
} cps__temp_peers;

/* Register `addr` and return its peer id (the one it already has if its linger runs, which starts
 * again), or 0 if it cannot be reached or every id lingers for another inbox. */
uint32_t cps__temp_peer_add(cps__temp_peers *t, cps__tp *tp, const char *addr, uint64_t now);
/* A request from a tool whose payload is a hello naming its inbox (STATUS, CHECKSUM,
 * REGISTRY, checkpoint requests): register that inbox. Returns CPS_EPROTO if the hello does not
 * decode (the caller logs what it dropped), else 0 with *peer the id to answer at (0 if the
 * inbox cannot be reached) and, if addr is not NULL, the inbox's address. */
int cps__temp_peer_from_hello(cps__temp_peers *t, cps__tp *tp, const void *hello, size_t len,
                              uint64_t now, uint32_t *peer, char *addr);

/* Start peer `id`'s linger again (after sending it more). */
void cps__temp_peer_touch(cps__temp_peers *t, uint32_t id, uint64_t now);

/* Drop the peers whose linger is over. */
void cps__temp_peers_expire(cps__temp_peers *t, cps__tp *tp, uint64_t now);

#endif
