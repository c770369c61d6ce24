/* Snappy payload compression. Gradients are mostly incompressible floats, so compression is
 * attempted only on payloads big enough to pay for it and kept only when it saves at least 10%:
 * otherwise the receiver would spend CPU decompressing for nothing. */
#include "core/codec.h"

#include <snappy-c.h>
#include <stdint.h>

#include "chainps/error.h"

size_t cps__codec_bound(size_t len)
{
    return snappy_max_compressed_length(len);
}

size_t cps__codec_compress(const void *in, size_t len, void *out, size_t cap)
{
    if (!in || !out || len < CPS_CODEC_MIN_BYTES || cap < cps__codec_bound(len))
        return 0;
    size_t clen = cap;
    if (snappy_compress(in, len, out, &clen) != SNAPPY_OK)
        return 0;
    /* 128-bit so that raw * 90 cannot wrap whatever size_t holds. */
    if ((unsigned __int128)clen * 100 > (unsigned __int128)len * CPS_CODEC_KEEP_PCT)
        return 0;
    return clen;
}

int cps__codec_decompress(const void *in, size_t len, void *out, size_t raw_len)
{
    size_t claimed = 0;

    if (!in || (!out && raw_len))
        return CPS_EINVAL;
    /* The length preamble is cheap to read: refuse a lie before walking the whole stream. */
    if (snappy_uncompressed_length(in, len, &claimed) != SNAPPY_OK || claimed != raw_len)
        return CPS_ECORRUPT;
    /* No separate validation pass: snappy_uncompress into a buffer of exactly raw_len bytes is
     * itself bounds-checked and refuses corrupt input, and the pass cost a third of the
     * server's decompression time (bench/profile.sh). The fuzz target covers this path. */
    size_t got = raw_len;
    if (snappy_uncompress(in, len, out, &got) != SNAPPY_OK || got != raw_len)
        return CPS_ECORRUPT;
    return 0;
}
