#include "temp_peers.h"

#include "chainps/error.h"
#include "core/view.h"

#include <string.h>

uint32_t cps__temp_peer_add(cps__temp_peers *t, cps__tp *tp, const char *addr, uint64_t now)
{
    uint32_t i = t->next++ % CPS_TEMP_PEERS;
    uint32_t id = CPS_TEMP_PEER_BASE + i;
    if (cps__tp_peer_set(tp, id, addr) != 0)
        return 0;
    t->slot[i].id = id;
    t->slot[i].drop_at_ms = now + CPS_TEMP_PEER_LINGER_MS;
    return id;
}

void cps__temp_peers_expire(cps__temp_peers *t, cps__tp *tp, uint64_t now)
{
    for (uint32_t i = 0; i < CPS_TEMP_PEERS; i++) {
        if (t->slot[i].id && now >= t->slot[i].drop_at_ms) {
            cps__tp_peer_drop(tp, t->slot[i].id);
            t->slot[i].id = 0;
        }
    }
}

int cps__temp_peer_from_hello(cps__temp_peers *t, cps__tp *tp, const void *hello, size_t len,
                              uint64_t now, uint32_t *peer, char *addr)
{
    uint32_t role, want_rank, prev_id;
    char a[CPS_ADDR_MAX];
    *peer = 0;
    if (cps__hello_decode(hello, len, &role, &want_rank, &prev_id, a, NULL) != 0)
        return CPS_EPROTO;
    if (addr)
        memcpy(addr, a, CPS_ADDR_MAX);
    *peer = cps__temp_peer_add(t, tp, a, now);
    return 0;
}
