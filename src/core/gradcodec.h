/* Lossy gradient codecs with error feedback: fp16, bf16 and top-k. Pure: no I/O, no clock.
 *
 * A worker encodes a dense gradient before it pushes it; the head of the range decodes it back to
 * float32 before anything else sees it (src/server/update.c), so aggregation, the chain, the
 * store and checkpoints only ever hold ordinary float updates. What an encoding loses is not
 * dropped: the worker keeps it as a residual and adds it to the next gradient of the same values
 * (error feedback), so over many steps the server receives everything the worker computed.
 *
 * Encoded block (the values part of a push's kv payload when CPS_WF_LOSSY is set, see wire.h),
 * little-endian:
 *    0 u8 codec (CPS_GC_FP16 | CPS_GC_BF16 | CPS_GC_TOPK)   1 u8 0   2 u16 0
 *    4 u32 count: fp16/bf16: n (every value); topk: k, 1 <= k <= n
 *    8 fp16/bf16: u16 bits[n]                    (exactly 8 + 2n bytes)
 *      topk:      u32 index[k], strictly increasing, each < n; then f32 value[k]
 *                                                (exactly 8 + 8k bytes)
 * The decoder accepts exactly these bytes and nothing else (one encoding per value). */
#ifndef CPS_CORE_GRADCODEC_H
#define CPS_CORE_GRADCODEC_H

#include <stddef.h>
#include <stdint.h>

/* Codec ids: on the wire, never renumber. */
enum cps__gc_kind { CPS_GC_NONE = 0, CPS_GC_FP16 = 1, CPS_GC_BF16 = 2, CPS_GC_TOPK = 3 };

#define CPS_GC_HDR_SIZE 8
/* Longest text of a spec cps__gradcodec_format writes, with its NUL ("topk:" + a %g ratio). */
#define CPS_GC_SPEC_MAX 32

typedef struct cps__gradcodec {
    uint32_t kind; /* cps__gc_kind */
    /* topk: fraction of the values sent, in (0, 1]; 0 for the others (a double: a float 0.1 is
     * 0.10000000149, and k of 50 values would be 6). */
    double ratio;
} cps__gradcodec;

/* Parse "none", "fp16", "bf16" or "topk:R" (0 < R <= 1, a decimal number) into *out.
 * Returns 0 or CPS_EINVAL (anything else, including an empty string). */
int cps__gradcodec_parse(const char *spec, cps__gradcodec *out);
/* The canonical text of gc into buf (capacity len >= CPS_GC_SPEC_MAX); returns buf. */
const char *cps__gradcodec_format(const cps__gradcodec *gc, char *buf, size_t len);

/* IEEE-754 conversions with round-to-nearest-even. Infinities stay infinite, NaNs stay NaN
 * (quiet, the sign kept), subnormals of both formats are produced and read, and a finite value
 * beyond the format's range rounds to infinity as IEEE says (the encoder below saturates before
 * converting, see cps__gradcodec_encode). */
uint16_t cps__f32_to_f16(float f);
float cps__f16_to_f32(uint16_t h);
uint16_t cps__f32_to_bf16(float f);
float cps__bf16_to_f32(uint16_t b);

/* Top-k's k for n values: max(1, ceil(ratio * n)), at most n, where a product within a relative
 * 1e-9 above an integer counts as that integer (decimal ratios are inexact in binary). n >= 1. */
uint64_t cps__gradcodec_topk_k(double ratio, uint64_t n);

/* Bytes cps__gradcodec_encode writes for n values (it writes exactly this many): depends only
 * on the codec and n. 0 when gc is CPS_GC_NONE, n is 0 or n > UINT32_MAX (no encoding). */
size_t cps__gradcodec_size(const cps__gradcodec *gc, uint64_t n);

/* Encode with error feedback. `acc[0..n)` holds, on entry, the gradient plus the residual carried
 * from the previous step (the caller adds them: a worker's gradient is scattered over keys); on
 * return it holds what this encoding lost, acc - decode(out): the residual to carry into the next
 * step. Writes cps__gradcodec_size(gc, n) bytes into out (capacity cap) and that count into
 * *out_len.
 *   fp16/bf16: each value rounded to nearest even; a finite value beyond the format's largest
 *     finite one is sent as that largest one (not as infinity), the excess stays in the residual.
 *   topk: the k largest |values| (k = cps__gradcodec_topk_k), ties broken towards the lower
 *     index, so one input always gives the same bytes; found in O(n) average time with a
 *     quickselect over a scratch copy.
 * A value that is not finite (inf, NaN) is sent as it is (fp16/bf16; topk ranks NaN above inf)
 * and leaves a residual of 0: carried on, it would poison every later step.
 * `scratch`: topk's working space, n uint32 the caller lends (so that an encode that must not
 * fail half-way can allocate everything first), or NULL to have it allocated here; unused by
 * the other codecs.
 * Errors: CPS_EINVAL (NULL pointers, CPS_GC_NONE, n 0 or > UINT32_MAX, cap too small),
 * CPS_ENOMEM (topk's scratch, when not lent). On error acc and out are unchanged. */
int cps__gradcodec_encode(const cps__gradcodec *gc, float *acc, uint64_t n, void *out, size_t cap,
                          size_t *out_len, uint32_t *scratch);

/* Decode a block of exactly `len` bytes standing for n values into out[0..n) (topk: zeros where
 * nothing was sent). Validates everything first: the codec id, the zero bytes, the count (n for
 * fp16/bf16, 1..n for topk), the length, and topk's indices (strictly increasing, < n).
 * Errors: CPS_EINVAL (NULL pointers, n 0), CPS_EPROTO (unknown codec, bad reserved bytes, count,
 * indices), CPS_ESIZE (len does not match the count). On error out is left unchanged. */
int cps__gradcodec_decode(const void *buf, size_t len, uint64_t n, float *out);

#endif
