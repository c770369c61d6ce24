/* Message authentication: every message of a job carries a MAC under the job's secret.
 *
 * Each message ends with a 40-byte trailer that the transport adds on send and checks (and strips)
 * on receipt, so nothing above the transport ever sees a message that failed the check:
 *
 *    0 u8  salt[16]   random per sending transport (per process and thread that sends)
 *   16 u64 counter    little-endian, 1, 2, ... per sending transport
 *   24 u8  tag[16]    ChaCha20-Poly1305 with the message as additional data, no plaintext
 *
 * The tag covers every byte before it: the 64-byte header, the payload and the salt and counter.
 * Its key is a subkey of the job's key for that salt (SHA-256 of a label, the job key and the
 * salt: 32 bytes, a ChaCha20 key), and its 96-bit nonce is the counter, so a nonce is never used
 * twice under one key whatever the number of processes (two salts collide with probability
 * 2^-128). Poly1305's one-time key is ChaCha20's first block under that key and nonce, as RFC 8439
 * builds the AEAD; with no plaintext nothing else of ChaCha20 runs.
 *
 * Replays: a receiver remembers, per sender salt, the highest counter it took and a window of
 * the 1024 below it, and drops a counter it took already or one older than the window. It keeps
 * 64 senders (the least recently heard is forgotten first); the protocol's own defences (view
 * epochs, the exactly-once record of every push, per-request ids) stand behind that.
 *
 * Why ChaCha20-Poly1305: the MAC is one pass over every byte each way, and with GMAC (AES-128-GCM
 * with the message as additional data, wire versions up to 3) it was a fifth of each side's CPU
 * for 1 MB pushes. Sealing one message, per bench/bench_auth (thread CPU time, OpenSSL 3.0 on an
 * AVX-512 EPYC; opening costs the same): 64 B 0.33 us against GMAC's 0.17, 4 KB 0.66 against
 * 0.64, 64 KB 5.5 against 7.7, 1 MiB 83 against 119 us, 16 MiB 1.34 against 1.95 ms (12.5 against
 * 8.6 GB/s), from cache or from memory alike. Below a few KB it costs more, and not for want of
 * reusing the context (the key is set once per sender; a message only sets the nonce): the
 * construction spends a ChaCha20 block per message on Poly1305's one-time key where GCM spends one
 * AES block, so a 64-byte ack pays 0.16 us more per pass, lost in a round trip of tens of us.
 * HMAC-SHA256 (2.1 GB/s) and keyed BLAKE2b (1.5 GB/s) are slower still. The tag is compared in
 * constant time (CRYPTO_memcmp). On a Xeon with AVX-512 IFMA, VAES and VPCLMULQDQ (1 MiB, hot)
 * the tag took 90 us (11.6 GB/s) against GMAC's 79 (13.3): not enough to change the wire.
 *
 * Every call into OpenSSL's cipher here ends with a vzeroupper (auth.c, vec_clean): on a CPU
 * with AVX-512 its final step returns with the upper vector state in use, and the thread's
 * legacy SSE code (scalar float and double: libm, the optimizer, the application) then ran up to
 * 21 times slower until its next vzeroupper, which made the MAC cost several times its
 * arithmetic in a job (bench/results/transport.md §9).
 *
 * A copy that happens anyway can carry the MAC (cps__auth_seal_copy, cps__auth_open_copy): each
 * 16 KiB piece is MACed while the copy has it in L1, so the MAC makes no pass of its own over
 * memory. On a loaded 2-core VM (load 12-15; bench_auth's copy rows, cold rings) this took
 * 11-17% off the copy and the MAC at 1 MiB, 27-32% at 16 MiB, 3-4% at 64 KiB; an earlier
 * measurement on a quieter machine found 1-5% at 1 MiB, Poly1305 being bound by arithmetic more
 * than by memory there. The
 * transport uses it where it owns the copy: framed messages (frame.h), sealing each frame as its
 * bytes are copied in and checking each as its bytes are copied into the message being
 * assembled (frame.h says why no unchecked byte is delivered). A copy made by the message's
 * builder (the worker's push values, the server's pull reply read from LMDB) carries it through
 * cps__tp_fill, on the streamed MAC below (cps__auth_stream_begin). On receipt, a copy the
 * receiver makes anyway (the worker's pull reply into the caller's buffer) carries the check
 * through cps__tp_defer_check (transport.h): that message type reaches its receiver unchecked,
 * as a handle whose bytes come out only checked.
 *
 * Versions: the wire header's version byte names the trailer's construction (4: this one). A
 * message whose header bears another version is refused as CPS_AUTH_VERSION before any MAC is
 * computed, with or without a key, so a job that mixes builds says so rather than reporting
 * forgeries.
 *
 * Without a key (a job run with --insecure) the trailer is sent zeroed and not checked.
 */
#ifndef CPS_TRANSPORT_AUTH_H
#define CPS_TRANSPORT_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define CPS_AUTH_KEY_SIZE 32
#define CPS_AUTH_SALT     16
#define CPS_AUTH_TAG      16
#define CPS_AUTH_TRAILER  (CPS_AUTH_SALT + 8 + CPS_AUTH_TAG)

/* Smallest and largest secret file accepted (after trailing whitespace is removed). */
#define CPS_SECRET_MIN 16
#define CPS_SECRET_MAX 4096

/* Read the secret file `path` and derive the job key from its contents (trailing whitespace,
 * such as a final newline, is ignored). The file must be a regular file of CPS_SECRET_MIN..
 * CPS_SECRET_MAX bytes that neither group nor others may read or write (as ssh asks of a key).
 * Errors (message in err): CPS_ECONFIG (missing, unreadable, too short or long, open to others),
 * CPS_ENOMEM. */
int cps__auth_load_file(const char *path, unsigned char key[CPS_AUTH_KEY_SIZE], char *err,
                        size_t errlen);

/* Create `path` (which must not exist) with mode 0600 holding 32 random bytes in hex and a
 * newline. Errors: CPS_EEXIST (the file exists), CPS_EIO (message in err). */
int cps__auth_create_file(const char *path, char *err, size_t errlen);

/* Why a message was refused (cps__auth_open). */
enum cps__auth_verdict {
    CPS_AUTH_OK = 0,
    CPS_AUTH_SHORT,    /* shorter than a trailer */
    CPS_AUTH_UNSIGNED, /* zeroed trailer: the sender runs without a secret (--insecure) */
    CPS_AUTH_BAD_TAG,  /* wrong tag: another job's secret, a forgery or a corrupted message */
    CPS_AUTH_REPLAY,   /* a counter already taken from this sender */
    CPS_AUTH_TOO_OLD,  /* older than the replay window: cannot tell, so refused */
    CPS_AUTH_VERSION,  /* a wire header of another protocol version (another MAC), keyed or not */
    CPS_AUTH_NOMEM
};
const char *cps__auth_verdict_str(int verdict);

typedef struct cps__auth cps__auth;

/* A sealer and checker for one transport (one thread). `key` NULL: no secret (the trailer is
 * zeroed on send and ignored on receipt). Errors: CPS_ENOMEM, CPS_EIO (no randomness). */
int cps__auth_create(const unsigned char *key, cps__auth **out);
void cps__auth_destroy(cps__auth *a);
/* 1 if this sealer has a key. */
int cps__auth_keyed(const cps__auth *a);

/* Write the trailer for msg[0, len) into msg[len, len + CPS_AUTH_TRAILER). */
void cps__auth_seal(cps__auth *a, unsigned char *msg, size_t len);
/* cps__auth_seal that also copies src[0, n) into msg[at, at + n) (at + n <= len) on the way, in
 * pieces that the MAC reads while the copy has them in cache: one pass over the bytes instead of
 * a copy and then a MAC. msg[at, at + n) need not be initialised; the trailer is as
 * cps__auth_seal's, so any receiver checks it the usual way. */
void cps__auth_seal_copy(cps__auth *a, unsigned char *msg, size_t len, size_t at, const void *src,
                         size_t n);
/* A MAC that runs while a message is built, so that the bytes copied into it are MACed in the
 * same pass (the transport's cps__tp_fill): begin, copy pieces in at increasing offsets, seal.
 * The tag is cps__auth_seal's, so any receiver checks it the usual way. One stream at a time:
 * beginning another ends the one before (its copies and seal then return -1, and its message
 * must be sealed whole with cps__auth_seal). The stream takes its counter at begin, so messages
 * sealed meanwhile carry higher counters: the receiver's replay window (1024) takes them out of
 * order, as long as few are sent between a stream's begin and its seal.
 *
 * Begin: the stream's id (its counter, nonzero), or 0 (no key, or OpenSSL out of memory: then
 * seal the message whole). */
uint64_t cps__auth_stream_begin(cps__auth *a);
/* Copy src[0, n) into msg[at, at + n), MACing first msg[f, at) (the bytes since the previous
 * copy's end f, or since 0: the caller wrote them already and must not change them again) and
 * then each piece as it is copied. Always copies. 0: stream s took the bytes; -1: s is not the
 * current stream, `at` is before its end so far, or OpenSSL failed (the stream is then ended). */
int cps__auth_stream_copy(cps__auth *a, uint64_t s, unsigned char *msg, size_t at, const void *src,
                          size_t n);
/* End stream s: write the trailer for msg[0, len) into msg[len, len + CPS_AUTH_TRAILER), MACing
 * the bytes after the last copy. msg[0, f) must be the bytes the stream MACed. 0 sealed; -1 not
 * (not the current stream, len short of its last copy, or OpenSSL failed): seal it whole. */
int cps__auth_stream_seal(cps__auth *a, uint64_t s, unsigned char *msg, size_t len);
/* Check a received message of `len` bytes (trailer included). Returns CPS_AUTH_OK and the length
 * without the trailer in *body_len, or the verdict. Without a key every message of at least a
 * trailer and of this wire version is CPS_AUTH_OK. */
int cps__auth_open(cps__auth *a, const unsigned char *msg, size_t len, size_t *body_len);
/* cps__auth_open that also copies msg[at, at + n) to dst[0, n) while checking, in the same pass
 * (see cps__auth_seal_copy). The bytes land in dst before the tag is compared: unless the verdict
 * is CPS_AUTH_OK the caller must throw dst[0, n) away unused (a verdict decided before the MAC,
 * such as CPS_AUTH_SHORT, CPS_AUTH_VERSION or CPS_AUTH_UNSIGNED, leaves dst untouched). at + n
 * beyond the body (the message without its trailer) is CPS_AUTH_SHORT. */
int cps__auth_open_copy(cps__auth *a, const unsigned char *msg, size_t len, size_t *body_len,
                        size_t at, void *dst, size_t n);
/* The check of a message that came over a same-host ipc:// channel (transport/local.h), whose
 * trailer is zeroed and not checked: only its length and wire version count. Returns CPS_AUTH_OK
 * and *body_len, CPS_AUTH_SHORT or CPS_AUTH_VERSION. */
int cps__auth_open_local(const unsigned char *msg, size_t len, size_t *body_len);

#endif
