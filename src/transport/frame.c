/* Framed messages (see frame.h). */
#include "transport/frame.h"

#include <string.h>

#include "chainps/error.h"
#include "core/wire.h"

int cps__frame_is(const unsigned char *buf, size_t len)
{
    return len >= 4 && cps__le32_get(buf) == CPS_FRAME_MAGIC;
}

int cps__frame_decode(const unsigned char *buf, size_t len, cps__frame *out)
{
    if (len <= CPS_FRAME_HDR || !cps__frame_is(buf, len) || buf[4] != CPS_WIRE_VERSION || buf[5] ||
        buf[6] || buf[7])
        return CPS_EPROTO;
    uint64_t id = cps__le64_get(buf + 8), total = cps__le64_get(buf + 16),
             off = cps__le64_get(buf + 24);
    uint64_t n = len - CPS_FRAME_HDR;
    if (id == 0 || total > (uint64_t)CPS_WIRE_HDR_SIZE + CPS_WIRE_MAX_PAYLOAD || off >= total ||
        n > total - off)
        return CPS_EPROTO;
    *out = (cps__frame){id, total, off, buf + CPS_FRAME_HDR, (size_t)n};
    return 0;
}

void cps__frame_encode_hdr(unsigned char hdr[CPS_FRAME_HDR], uint64_t msg_id, uint64_t total,
                           uint64_t offset)
{
    cps__le32_put(hdr, CPS_FRAME_MAGIC);
    hdr[4] = CPS_WIRE_VERSION;
    hdr[5] = hdr[6] = hdr[7] = 0;
    cps__le64_put(hdr + 8, msg_id);
    cps__le64_put(hdr + 16, total);
    cps__le64_put(hdr + 24, offset);
}
