/* Framed messages: a large authenticated message between hosts travels as a stream of frames,
 * each sealed on its own (transport/auth.h), so that the sender seals frame k+1 while frame k is
 * on the wire and the receiver checks frame k while frame k+1 arrives.
 *
 * A frame is one nanomsg message on the peer's PUSH socket (so frames of one message arrive in
 * order, on one connection), with its own MAC trailer after:
 *
 *    0 u32 magic     CPS_FRAME_MAGIC ("CPSF"), never a wire header's magic
 *    4 u8  version   CPS_WIRE_VERSION
 *    5 u8  zero[3]
 *    8 u64 msg_id    per sending transport, 1, 2, ...
 *   16 u64 total     bytes of the whole message (header and payload, no trailer)
 *   24 u64 offset    where this frame's bytes go in it
 *   32 ...           the bytes: total - offset of them at most, at least one
 *
 * The receiver keeps, per sender (the salt of its trailers, which the MAC covers), one message
 * being assembled, and takes a frame only after its tag is checked and only if it continues that
 * message exactly (same msg_id, offset where the last frame ended; offset 0 starts a new one).
 * Anything else drops the message being assembled, whole: a forged or corrupted frame fails its
 * MAC and is dropped, so the next genuine frame leaves a gap, and nothing of that message is
 * delivered. A message is delivered only when its last byte arrived checked.
 *
 * Both copies that framing costs carry the MAC (auth.h, cps__auth_seal_copy / _open_copy): the
 * sender seals a frame as it copies the bytes in, and the receiver checks a frame that continues
 * the message in progress as it copies its bytes into place. A continuation that fails the check
 * has then written past the checked part; the message stays undelivered until checked frames
 * have written every byte up to its end, over those. A first frame is checked before anything is
 * allocated for its message. Messages up to
 * the frame size travel as before, unframed.
 */
#ifndef CPS_TRANSPORT_FRAME_H
#define CPS_TRANSPORT_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define CPS_FRAME_MAGIC 0x46535043u /* "CPSF" little-endian */
#define CPS_FRAME_HDR   32

typedef struct cps__frame {
    uint64_t msg_id;
    uint64_t total;
    uint64_t offset;
    const unsigned char *data; /* into the decoded buffer */
    size_t len;                /* bytes of data */
} cps__frame;

/* 1 if buf[0, len) starts with a frame's magic (then it is a frame or a bad one, never a wire
 * message). */
int cps__frame_is(const unsigned char *buf, size_t len);

/* Decode and validate a frame (without its trailer). Checks the version, the zero bytes, a
 * message id above 0, total within the wire's limits, 0 < len and offset + len <= total.
 * Returns 0 or CPS_EPROTO. */
int cps__frame_decode(const unsigned char *buf, size_t len, cps__frame *out);

/* Write the 32-byte header of a frame into hdr. */
void cps__frame_encode_hdr(unsigned char hdr[CPS_FRAME_HDR], uint64_t msg_id, uint64_t total,
                           uint64_t offset);

#endif
