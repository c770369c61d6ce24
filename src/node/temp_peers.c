#include "temp_peers.h"

uint32_t cps__temp_peer_add(cps_temp_peers *t, cps_tp *tp, const char *addr, uint64_t now)
{
    uint32_t i = t->next++ % CPS_TEMP_PEERS;
    uint32_t id = CPS_TEMP_PEER_BASE + i;
    if (cps__tp_peer_set(tp, id, addr) != 0)
        return 0;
    t->slot[i].id = id;
    t->slot[i].drop_at_ms = now + CPS_TEMP_PEER_LINGER_MS;
    return id;
}

void cps__temp_peers_expire(cps_temp_peers *t, cps_tp *tp, uint64_t now)
{
    for (uint32_t i = 0; i < CPS_TEMP_PEERS; i++) {
        if (t->slot[i].id && now >= t->slot[i].drop_at_ms) {
            cps__tp_peer_drop(tp, t->slot[i].id);
            t->slot[i].id = 0;
        }
    }
}
