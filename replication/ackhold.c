/* Held CHAIN_ACKs: see ackhold.h. */
#include "ackhold.h"

#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"

typedef struct held {
    int used;
    uint32_t to;
    cps__msg_hdr hdr;
} held;

struct cps__ackhold {
    held *acks; /* one per range: acks are cumulative, the latest covers the earlier ones */
    uint32_t nranges, nheld;
    uint64_t since; /* when the oldest one was held */
    /* As many as acks: no call hands back more than every held ack and one more. */
    cps__ackhold_send *sends;
    size_t nsends;
};

int cps__ackhold_create(cps__ackhold **out)
{
    cps__ackhold *h = calloc(1, sizeof *h);
    if (!h)
        return CPS_ENOMEM;
    *out = h;
    return 0;
}

void cps__ackhold_destroy(cps__ackhold *h)
{
    if (!h)
        return;
    free(h->acks);
    free(h->sends);
    free(h);
}

static void release(cps__ackhold *h, held *a)
{
    h->sends[h->nsends++] = (cps__ackhold_send){a->to, a->hdr};
    a->used = 0;
    h->nheld--;
}

static void release_all(cps__ackhold *h)
{
    for (uint32_t r = 0; r < h->nranges && h->nheld; r++)
        if (h->acks[r].used)
            release(h, &h->acks[r]);
}

int cps__ackhold_offer(cps__ackhold *h, uint32_t nranges, uint32_t to, const cps__msg_hdr *hdr,
                       uint64_t now)
{
    h->nsends = 0;
    if (hdr->aux != 0 || hdr->payload_len != 0 || hdr->range >= nranges)
        return 0;
    if (h->nranges != nranges) {
        /* Acks of the old range layout go out now, before anything of the new one. */
        size_t cap = (size_t)(nranges > h->nranges ? nranges : h->nranges) + 1;
        held *acks = calloc(nranges, sizeof *acks);
        cps__ackhold_send *sends = calloc(cap, sizeof *sends);
        if (!acks || !sends) {
            free(acks);
            free(sends);
            release_all(h);
            return 0;
        }
        free(h->sends);
        h->sends = sends;
        release_all(h);
        free(h->acks);
        h->acks = acks;
        h->nranges = nranges;
    }
    held *a = &h->acks[hdr->range];
    /* Only a later ack on the same link and epoch covers the held one. */
    if (a->used && (a->to != to || a->hdr.epoch != hdr->epoch || a->hdr.req_seq > hdr->req_seq))
        release(h, a);
    if (!a->used && h->nheld++ == 0)
        h->since = now;
    a->used = 1;
    a->to = to;
    a->hdr = *hdr;
    return 1;
}

void cps__ackhold_due(cps__ackhold *h, uint64_t now, int force)
{
    h->nsends = 0;
    if (h->nheld == 0 || (!force && now - h->since < CPS_ACK_HOLD_MS))
        return;
    release_all(h);
}

int cps__ackhold_wait_ms(const cps__ackhold *h, uint64_t now, int max_ms)
{
    if (!h || h->nheld == 0)
        return max_ms;
    uint64_t due = h->since + CPS_ACK_HOLD_MS;
    int wait = now >= due ? 0 : (int)(due - now);
    return wait < max_ms ? wait : max_ms;
}

uint32_t cps__ackhold_held(const cps__ackhold *h)
{
    return h ? h->nheld : 0;
}

size_t cps__ackhold_sends(cps__ackhold *h, const cps__ackhold_send **out)
{
    *out = h->sends;
    return h->nsends;
}
