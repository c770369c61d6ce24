/* Payload compression with snappy: used only when it saves enough to be worth the CPU. */
#ifndef CPS_CORE_CODEC_H
#define CPS_CORE_CODEC_H

#include <stddef.h>

/* Payloads smaller than this are never compressed (the header cost dominates). */
#define CPS_CODEC_MIN_BYTES 512
/* Compression is kept only if compressed <= raw * CPS_CODEC_KEEP_PCT / 100 (saves >= 10%). */
#define CPS_CODEC_KEEP_PCT 90

/* Worst-case output size for cps__codec_compress of `len` bytes. */
size_t cps__codec_bound(size_t len);

/* Try to compress `in[0..len)` into `out` (capacity >= cps__codec_bound(len)). Returns the
 * compressed length if it is worth keeping, 0 if the caller should send the raw bytes. */
size_t cps__codec_compress(const void *in, size_t len, void *out, size_t cap);

/* Decompress exactly `raw_len` bytes into `out` (capacity >= raw_len). The input is validated
 * first; a corrupt or lying payload never writes past `out`.
 * Errors: CPS_ECORRUPT (invalid snappy data or decoded size != raw_len). */
int cps__codec_decompress(const void *in, size_t len, void *out, size_t raw_len);

#endif
