#include "msg.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "chainps/error.h"
#include "core/codec.h"
#include "core/log.h"
#include "recovery/suspect.h"

uint64_t cps__now_ms(void)
{
    return cps__now_us() / 1000u;
}

uint64_t cps__now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* The header of a message of payload_len bytes, written at the start of buf (NULL: none). */
static void *put_hdr(void *buf, cps__msg_hdr *h, size_t payload_len)
{
    if (!buf)
        return NULL;
    h->payload_len = (uint32_t)payload_len;
    if (!(h->flags & CPS_WF_SNAPPY))
        h->raw_len = (uint32_t)payload_len;
    cps__wire_hdr_encode(buf, h);
    return buf;
}

void *cps__msg_alloc(cps__msg_hdr *h, size_t payload_len)
{
    if (payload_len > CPS_WIRE_MAX_PAYLOAD)
        return NULL;
    return put_hdr(cps__tp_alloc(CPS_WIRE_HDR_SIZE + payload_len), h, payload_len);
}

void *cps__msg_reserve(cps__tp *tp, uint32_t peer, cps__msg_hdr *h, size_t payload_len)
{
    if (payload_len > CPS_WIRE_MAX_PAYLOAD)
        return NULL;
    return put_hdr(cps__tp_reserve(tp, peer, CPS_WIRE_HDR_SIZE + payload_len), h, payload_len);
}

int cps__msg_send(cps__tp *tp, uint32_t peer, cps__msg_hdr *h, const void *payload, size_t len)
{
    void *buf = cps__msg_alloc(h, len);
    if (!buf)
        return CPS_ENOMEM;
    if (len)
        memcpy((char *)buf + CPS_WIRE_HDR_SIZE, payload, len);
    int rc = cps__tp_send(tp, peer, buf, CPS_WIRE_HDR_SIZE + len);
    if (rc != 0)
        cps__tp_free(buf);
    return rc;
}

int cps__msg_reply_error(cps__tp *tp, uint32_t self, uint64_t epoch, const cps__msg_hdr *req,
                         int err, const char *text)
{
    cps__msg_hdr h = {0};
    h.type = CPS_MSG_ERROR;
    h.flags = CPS_WF_REPLY;
    h.sender = self;
    h.status = err;
    h.epoch = epoch;
    h.req_worker = req->req_worker;
    h.req_seq = req->req_seq;
    h.range = req->range;
    h.step = req->step;
    return cps__msg_send(tp, req->sender, &h, text, text ? strlen(text) : 0);
}

int cps__rx_parse(cps__rx *rx, void *buf, size_t len)
{
    memset(rx, 0, sizeof *rx);
    int rc = cps__wire_hdr_decode(buf, len, &rx->hdr);
    if (rc != 0) {
        rx->hdr.type = 0;
        cps__tp_free(buf);
        return rc;
    }
    rx->buf = buf;
    const char *p = (const char *)buf + CPS_WIRE_HDR_SIZE;
    if (rx->hdr.flags & CPS_WF_SNAPPY) {
        rx->owned = aligned_alloc(16, ((size_t)rx->hdr.raw_len + 15) & ~(size_t)15);
        if (!rx->owned) {
            cps__rx_free(rx);
            return CPS_ENOMEM;
        }
        rc = cps__codec_decompress(p, rx->hdr.payload_len, rx->owned, rx->hdr.raw_len);
        if (rc != 0) {
            cps__rx_free(rx);
            return rc;
        }
        rx->payload = rx->owned;
        rx->len = rx->hdr.raw_len;
    } else if (((uintptr_t)p & 7u) != 0 && rx->hdr.payload_len > 0) {
        /* Decoders hand out typed pointers into the payload: they need it aligned. */
        rx->owned = aligned_alloc(16, ((size_t)rx->hdr.payload_len + 15) & ~(size_t)15);
        if (!rx->owned) {
            cps__rx_free(rx);
            return CPS_ENOMEM;
        }
        memcpy(rx->owned, p, rx->hdr.payload_len);
        rx->payload = rx->owned;
        rx->len = rx->hdr.payload_len;
    } else {
        rx->payload = p;
        rx->len = rx->hdr.payload_len;
    }
    return 0;
}

void cps__rx_free(cps__rx *rx)
{
    if (rx->buf)
        cps__tp_free(rx->buf);
    free(rx->owned);
    rx->buf = NULL;
    rx->owned = NULL;
    rx->payload = NULL;
}

uint64_t cps__hash64(const void *p, size_t n)
{
    return XXH3_64bits(p, n);
}

uint64_t cps__splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

uint64_t cps__keyset_sig(const uint64_t *keys, const uint32_t *lens, uint32_t n)
{
    /* The keys' hash seeds the lengths' hash: one pass over each array, no copy to join them. */
    uint64_t h = XXH3_64bits_withSeed(lens, (size_t)n * 4, XXH3_64bits(keys, (size_t)n * 8));
    return h ? h : 1;
}

uint32_t cps__msg_report_suspects(cps__tp *tp, uint32_t self, const cps__view *v,
                                  uint32_t evidence_ms, cps__waiting_fn waiting, void *ctx,
                                  uint64_t now)
{
    cps__suspect_entry e[CPS_SUSPECT_MAX];
    uint32_t n = 0;
    for (uint32_t i = 0; i < v->nnodes && n < CPS_SUSPECT_MAX; i++) {
        const cps__node_info *ni = &v->nodes[i];
        if (ni->role != CPS_ROLE_SERVER || !ni->alive || ni->id == self)
            continue;
        uint64_t heard = 0, since = waiting(ctx, ni->id, &heard);
        cps__suspect_list_add(e, &n, ni->id, since, heard, now, evidence_ms);
    }
    if (n == 0)
        return 0;
    unsigned char buf[8 + 8 * CPS_SUSPECT_MAX];
    size_t len = cps__wire_suspects_encode(buf, sizeof buf, e, n);
    cps__msg_hdr h = {.type = CPS_MSG_SUSPECT, .sender = self, .epoch = v->epoch};
    cps__log(CPS_LOG_DEBUG, "suspect", "node %u reports %u silent server(s), first %u for %u ms",
             self, n, e[0].node, e[0].unanswered_ms);
    return cps__msg_send(tp, 0, &h, buf, len) == 0 ? n : 0;
}
