#include "temp_peers.h"

#include "chainps/error.h"
#include "core/view.h"

#include <stdio.h>
#include <string.h>

uint32_t cps__temp_peer_add(cps__temp_peers *t, cps__tp *tp, const char *addr, uint64_t now)
{
    uint32_t free_slot = CPS_TEMP_PEERS;
    for (uint32_t k = 0; k < CPS_TEMP_PEERS; k++) {
        /* Round robin from t->next: a dropped id is not reused at once. */
        uint32_t i = (t->next + k) % CPS_TEMP_PEERS;
        int live = t->slot[i].id && now < t->slot[i].drop_at_ms;
        if (live && strcmp(t->slot[i].addr, addr) == 0) {
            t->slot[i].drop_at_ms = now + CPS_TEMP_PEER_LINGER_MS;
            return t->slot[i].id;
        }
        if (!live && free_slot == CPS_TEMP_PEERS)
            free_slot = i;
    }
    if (free_slot == CPS_TEMP_PEERS)
        return 0;
    uint32_t id = CPS_TEMP_PEER_BASE + free_slot;
    if (cps__tp_peer_set(tp, id, addr) != 0)
        return 0;
    t->next = free_slot + 1;
    t->slot[free_slot].id = id;
    t->slot[free_slot].drop_at_ms = now + CPS_TEMP_PEER_LINGER_MS;
    snprintf(t->slot[free_slot].addr, sizeof t->slot[free_slot].addr, "%s", addr);
    return id;
}

void cps__temp_peer_touch(cps__temp_peers *t, uint32_t id, uint64_t now)
{
    uint32_t i = id - CPS_TEMP_PEER_BASE;
    if (i < CPS_TEMP_PEERS && t->slot[i].id == id)
        t->slot[i].drop_at_ms = now + CPS_TEMP_PEER_LINGER_MS;
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
