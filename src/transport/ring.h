/* Shared-memory rings: a large message between two processes of a job on one host travels as a
 * copy in the sender's ring, a file in the job's private runtime directory (transport/local.h)
 * that both map, and only a small descriptor goes over the ipc:// socket. A Unix socket copies
 * every byte twice through the kernel; the ring costs one copy, by the sender.
 *
 * The ring file (mode 0600, created afresh by its owner: a restarted sender unlinks the old one,
 * so receivers that still map the old inode keep valid bytes) holds a header and then a data
 * area of slots. A slot is a 64-byte header (the live word: the slot's sequence number while the
 * receiver holds it, 0 once released; the length; the receiving peer) and the payload. The
 * sender allocates slots first in, first out around the area; a receiver releases its slot by
 * compare-and-swap of the live word from the sequence it was given to 0. A slot whose receiver
 * never releases it stops the ring; the sender then sends inline, as below the size threshold,
 * and takes the slots of a peer back when the peer is dropped, moved or gone, or those it sent
 * before the peer's connection last broke (a receiver restarted on its address). A slot taken
 * back that its receiver had not released may still be read (a receiver counted dead by
 * mistake, a connection that only reconnected), so its bytes are never written again: the
 * sender retires the whole ring instead (marks the file retired, unlinks it, unmaps it and makes
 * a new file of a new generation under the same name; if another process has put its own file
 * under that name, none: the ring stops and the sender sends inline). Receivers keep reading the
 * old pages through their own mappings and drop them once their last buffer from it is released (or
 * a descriptor of the new generation arrives). Descriptors of the old generation still in flight
 * resolve through a receiver's existing mapping of it; one that had none refuses them.
 *
 * Rings belong in memory: cps__ring_dir_in_memory tells whether a directory is on tmpfs (the
 * transport sends inline otherwise, as a shared mapping of a disk file is written back).
 *
 * A descriptor (one ipc message, with the usual zeroed trailer after it):
 *
 *    0 u32 magic     CPS_RING_MAGIC ("CPSR"), never a wire header's or a frame's magic
 *    4 u8  version   CPS_WIRE_VERSION
 *    5 u8  zero[3]
 *    8 u64 ring      the ring's name: its file is <dir>/r<ring as 16 hex digits>.ring
 *   16 u64 gen       the ring file's generation (random, not 0): which incarnation of the sender
 *   24 u64 offset    of the slot in the data area, a multiple of 64
 *   32 u64 len       of the payload, at least 1
 *   40 u64 seq       the slot's sequence number (not 0)
 *
 * The receiver refuses, with a named reason (cps__ring_why_str), a malformed descriptor, one whose
 * ring file is missing or not private, one of another generation than the file's (a sender that
 * restarted: its old descriptors are dropped), one outside the data area, and one whose slot does
 * not hold that sequence and length. A refused descriptor whose slot holds its sequence (and
 * is not one we already hold) is given back, so that the FIFO ring does not stay blocked
 * behind it (counted: cps__ring_peers_returned). A received payload is a pointer into the mapped
 * ring that cps__ring_release (through cps__tp_free) gives back; the mapping lives until the last
 * such buffer is released, even after its transport is destroyed.
 *
 * The sender side (cps__ring) belongs to one thread; the receiver side's registry is locked, so
 * buffers can be released from any thread.
 */
#ifndef CPS_TRANSPORT_RING_H
#define CPS_TRANSPORT_RING_H

#include <stddef.h>
#include <stdint.h>

#define CPS_RING_MAGIC    0x52535043u /* "CPSR" little-endian */
#define CPS_RING_DESC     48
#define CPS_RING_SLOT_HDR 64

typedef struct cps__ring_desc {
    uint64_t ring, gen, offset, len, seq;
} cps__ring_desc;

/* Why a descriptor was refused (cps__ring_desc_decode, cps__ring_resolve). */
enum cps__ring_why {
    CPS_RING_OK = 0,
    CPS_RING_MALFORMED,    /* not a descriptor: magic, version, zero bytes, 0 fields, alignment */
    CPS_RING_NO_RING,      /* no ring file by that name, or not a private regular file of ours */
    CPS_RING_STALE_GEN,    /* the ring file is of another generation: its sender restarted */
    CPS_RING_OUT_OF_RANGE, /* the slot does not lie in the ring's data area */
    CPS_RING_STALE_SLOT    /* the slot does not hold this sequence and length (taken back or
                              replayed while lent out) */
};
/* A name for a cps__ring_why ("stale generation", ...); never NULL. */
const char *cps__ring_why_str(int why);

/* ---- descriptors ---- */
/* 1 if buf[0, len) starts with a descriptor's magic (then it is one or a bad one). */
int cps__ring_desc_is(const unsigned char *buf, size_t len);
/* Decode and check a descriptor of exactly CPS_RING_DESC bytes: version, zero bytes, gen, seq
 * and len not 0, offset a multiple of 64, offset and len within the wire's limits. Returns 0, or
 * CPS_EPROTO with *why (may be NULL) CPS_RING_MALFORMED. */
int cps__ring_desc_decode(const unsigned char *buf, size_t len, cps__ring_desc *out, int *why);
/* Write `d` as CPS_RING_DESC bytes into out. */
void cps__ring_desc_encode(unsigned char out[CPS_RING_DESC], const cps__ring_desc *d);

/* ---- the sender's ring ---- */
typedef struct cps__ring cps__ring;

/* The ring file of ring `id` in `dir`, into out[cap]. Returns 0 or CPS_EINVAL (does not fit). */
int cps__ring_path(const char *dir, uint64_t id, char *out, size_t cap);
/* Create this process's ring `id` with a data area of `cap` bytes (rounded up to 64) in `dir`:
 * any old file of that name is unlinked first (a crashed predecessor's), the new one is made
 * exclusively, mode 0600, and mapped; its generation is fresh randomness. Errors: CPS_EINVAL,
 * CPS_EIO (the file could not be made or mapped; errno kept), CPS_ENOMEM. */
int cps__ring_create(const char *dir, uint64_t id, size_t cap, cps__ring **out);
/* Unmap the ring (receivers keep their own mappings) and unlink its file if `unlink_file` and
 * the name is still the file this ring made (device and inode as at creation: a successor on
 * the same address replaces it with its own). NULL is a no-op. */
void cps__ring_destroy(cps__ring *r, int unlink_file);
/* How many times the ring was retired for a new generation (see above). */
uint64_t cps__ring_retired(const cps__ring *r);
/* 1 if `dir` lies on a memory file system (tmpfs, ramfs), else 0 (also on error). */
int cps__ring_dir_in_memory(const char *dir);
/* Reserve a slot of `len` bytes for peer `peer`, noting `tag` with it (the transport's count of
 * that peer's broken connections, see cps__ring_reclaim_before): first takes back, oldest first,
 * the slots their receivers released. On success *data points at the payload (the caller copies the
 * message there), *d describes it, and the slot is live until its receiver releases it or
 * cps__ring_abandon / cps__ring_reclaim_peer. CPS_EAGAIN: no room now (send inline);
 * CPS_EINVAL: len 0 or larger than the ring; CPS_EIO: a retired ring's new file could not be
 * made (send inline from now on). */
int cps__ring_alloc(cps__ring *r, uint32_t peer, uint64_t tag, size_t len, cps__ring_desc *d,
                    unsigned char **data);
/* Reserve a slot of `len` bytes for peer `peer` that the caller builds its message in before
 * sending it: as cps__ring_alloc, but the slot stays the caller's (unsent) until
 * cps__ring_commit, and while unsent it is not taken back by cps__ring_reclaim_peer /
 * cps__ring_reclaim_before (no receiver has its descriptor). If the ring is retired meanwhile
 * (another peer's slots were taken back while lent), the old file stays mapped, so *data stays
 * writable, until the slot is abandoned; its commit then fails and the caller sends a copy.
 * Errors as cps__ring_alloc. */
int cps__ring_reserve(cps__ring *r, uint32_t peer, size_t len, cps__ring_desc *d,
                      unsigned char **data);
/* Mark a reserved slot sent to `peer` (it may differ from the one reserved for), with the
 * peer's `tag` now (see cps__ring_alloc) and the message's length `len` (1 to d->len: a message
 * that came out shorter than reserved, e.g. compressed); d->len becomes len. The caller then
 * sends the descriptor. Errors: CPS_ENOTFOUND (not an unsent slot of the current generation:
 * the ring was retired since; the bytes are still readable at the reserved pointer until
 * cps__ring_abandon), CPS_EINVAL (len 0 or above the reserved length). */
int cps__ring_commit(cps__ring *r, cps__ring_desc *d, uint32_t peer, uint64_t tag, size_t len);
/* Undo cps__ring_commit when its descriptor could not be sent: the slot is unsent again. */
void cps__ring_uncommit(cps__ring *r, const cps__ring_desc *d);
/* Give back a slot that was reserved but not sent (no receiver saw it: reused at once). For a
 * slot reserved in a file retired since, that file is unmapped once its last reserved slot is
 * abandoned. */
void cps__ring_abandon(cps__ring *r, const cps__ring_desc *d);
/* Take back every slot held for `peer` (it was dropped, moved or is gone). Returns how many
 * were still held; if any, the ring was retired (all slots, every peer's, start afresh in a new
 * generation; cps__ring_gen changes). */
size_t cps__ring_reclaim_peer(cps__ring *r, uint32_t peer);
/* Take back the slots held for `peer` that were reserved with a tag below `tag`: those sent
 * before the connection to the peer last broke, which a receiver that restarted on the same
 * address will never release. Returns how many were still held; if any, the ring was retired
 * as by cps__ring_reclaim_peer. */
size_t cps__ring_reclaim_before(cps__ring *r, uint32_t peer, uint64_t tag);
/* The peer and tag of the oldest live slot into *peer and *tag (may be NULL); 0, or
 * CPS_ENOTFOUND when no slot is live (after taking back the released ones). */
int cps__ring_oldest_peer(cps__ring *r, uint32_t *peer, uint64_t *tag);
/* Slots reserved and not yet taken back. */
size_t cps__ring_live(const cps__ring *r);
/* Retired files still mapped because slots reserved in them are not yet sent or abandoned. */
size_t cps__ring_retired_held(const cps__ring *r);
/* This ring's generation and id. */
uint64_t cps__ring_gen(const cps__ring *r);

/* ---- the receiver's side ---- */
typedef struct cps__ring_peers cps__ring_peers;

/* A table of the senders' rings a transport has mapped, looked up in `dir` (copied). Errors:
 * CPS_ENOMEM, CPS_EINVAL. */
int cps__ring_peers_create(const char *dir, cps__ring_peers **out);
/* Slots of refused descriptors that `t` gave back to their senders. */
uint64_t cps__ring_peers_returned(const cps__ring_peers *t);
/* Forget the table; mappings still lent out (buffers not released) stay until their last
 * release. NULL is a no-op. */
void cps__ring_peers_destroy(cps__ring_peers *t);
/* The payload descriptor `d` names: maps the sender's ring file on first use (and again when a
 * descriptor of a newer generation arrives), checks the slot, and lends it out. *buf then
 * points at d->len bytes the caller owns until cps__ring_release(*buf). Returns 0, or CPS_EPROTO
 * with *why the named reason (see enum cps__ring_why). */
int cps__ring_resolve(cps__ring_peers *t, const cps__ring_desc *d, void **buf, int *why);
/* 1 if `buf` lies in a mapped ring (a buffer from cps__ring_resolve), else 0. A buffer outside
 * the bound of all mappings (cps__ring_bounds) is answered without a lock. */
int cps__ring_owns(const void *buf);
/* Release a buffer from cps__ring_resolve: its slot goes back to the sender. Returns 1 if buf
 * was a ring buffer (released, or already released: then nothing happens), 0 if not (then it
 * is the caller's to free some other way). Any thread. */
int cps__ring_release(void *buf);
/* The bound [*lo, *hi) of every mapped ring of this process (either may be NULL); returns 1 if
 * there is any mapping, 0 if none (then the bound is empty). */
int cps__ring_bounds(uintptr_t *lo, uintptr_t *hi);

#endif
