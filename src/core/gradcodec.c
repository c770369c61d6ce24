/* Lossy gradient codecs (gradcodec.h): float conversions by bit manipulation, so the result is
 * the same on every machine and compiler (no reliance on _Float16 or the FPU's rounding mode),
 * and a top-k selection whose ties are broken by index, so one gradient always gives the same
 * bytes: a re-sent push must be byte-identical to the first (exactly-once), and replicas compare
 * bytes. */
#include "core/gradcodec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "core/wire.h" /* little-endian helpers */

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- spec ---- */

int cps__gradcodec_parse(const char *spec, cps__gradcodec *out)
{
    if (!spec || !out)
        return CPS_EINVAL;
    cps__gradcodec gc = {CPS_GC_NONE, 0};
    if (!strcmp(spec, "none")) {
        gc.kind = CPS_GC_NONE;
    } else if (!strcmp(spec, "fp16")) {
        gc.kind = CPS_GC_FP16;
    } else if (!strcmp(spec, "bf16")) {
        gc.kind = CPS_GC_BF16;
    } else if (!strncmp(spec, "topk:", 5)) {
        const char *num = spec + 5;
        /* strtod would skip blanks and take "inf", "nan" or hex: only plain decimals here. */
        if (!((*num >= '0' && *num <= '9') || *num == '.'))
            return CPS_EINVAL;
        for (const char *p = num; *p; p++)
            if (!((*p >= '0' && *p <= '9') || *p == '.' || *p == 'e' || *p == 'E' || *p == '-' ||
                  *p == '+'))
                return CPS_EINVAL;
        char *end;
        double r = strtod(num, &end);
        if (*end || !(r > 0) || r > 1)
            return CPS_EINVAL;
        gc.kind = CPS_GC_TOPK;
        gc.ratio = r;
    } else {
        return CPS_EINVAL;
    }
    *out = gc;
    return 0;
}

const char *cps__gradcodec_format(const cps__gradcodec *gc, char *buf, size_t len)
{
    switch (gc ? gc->kind : CPS_GC_NONE) {
    case CPS_GC_FP16:
        snprintf(buf, len, "fp16");
        break;
    case CPS_GC_BF16:
        snprintf(buf, len, "bf16");
        break;
    case CPS_GC_TOPK:
        snprintf(buf, len, "topk:%.15g", gc->ratio);
        break;
    default:
        snprintf(buf, len, "none");
    }
    return buf;
}

/* ---- conversions ---- */

uint16_t cps__f32_to_f16(float f)
{
    uint32_t x = f2u(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) {
        if (x == 0x7f800000u)
            return sign | 0x7c00u;
        /* NaN: quiet, with the top of its payload. */
        return (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x1ffu));
    }
    /* 65520 is halfway between the largest half (65504) and 2^16: it and above round up. */
    if (x >= 0x477ff000u)
        return sign | 0x7c00u;
    if (x < 0x38800000u) { /* below 2^-14: a half subnormal or zero */
        /* 2^-25 is halfway between 0 and the smallest subnormal 2^-24: ties go to even (0). */
        if (x <= 0x33000000u)
            return sign;
        uint32_t e = x >> 23; /* 102 .. 112 */
        uint32_t m = (x & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* value = m * 2^(e-150); in units of 2^-24: m >> (126-e) */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1)))
            r++; /* may carry into the smallest normal (0x400): the right encoding */
        return (uint16_t)(sign | r);
    }
    uint32_t y = x - 0x38000000u; /* rebias the exponent from 127 to 15 */
    uint32_t h = y >> 13, rem = y & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
        h++; /* a carry into the exponent is right too; < 65520 never reaches infinity */
    return (uint16_t)(sign | h);
}

float cps__f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f)
        return u2f(sign | 0x7f800000u | (m << 13)); /* inf, or NaN with its payload */
    if (e == 0) {
        if (m == 0)
            return u2f(sign);
        /* Subnormal: m * 2^-24, exact in float32. */
        float v = (float)m * 0x1p-24f;
        return sign ? -v : v;
    }
    return u2f(sign | ((e + 112) << 23) | (m << 13));
}

uint16_t cps__f32_to_bf16(float f)
{
    uint32_t x = f2u(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u); /* NaN: quiet, never rounded into infinity */
    /* Round to nearest even on the 16 bits dropped; a carry moves into the exponent, up to
     * infinity past the largest bf16, as IEEE rounding does. */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

float cps__bf16_to_f32(uint16_t b)
{
    return u2f((uint32_t)b << 16);
}

/* ---- sizes ---- */

uint64_t cps__gradcodec_topk_k(double ratio, uint64_t n)
{
    /* A decimal ratio is rarely exact in binary (0.07 * 100 = 7.000000000000001): a product a
     * hair above an integer counts as that integer, so k is what the user computed. */
    double p = ratio * (double)n;
    double k = ceil(p - p * 1e-9);
    if (!(k >= 1))
        return 1;
    return k >= (double)n ? n : (uint64_t)k;
}

size_t cps__gradcodec_size(const cps__gradcodec *gc, uint64_t n)
{
    if (!gc || n == 0 || n > UINT32_MAX)
        return 0;
    switch (gc->kind) {
    case CPS_GC_FP16:
    case CPS_GC_BF16:
        return CPS_GC_HDR_SIZE + 2 * (size_t)n;
    case CPS_GC_TOPK:
        return CPS_GC_HDR_SIZE + 8 * (size_t)cps__gradcodec_topk_k(gc->ratio, n);
    default:
        return 0;
    }
}

/* ---- encode ---- */

static void put_hdr(unsigned char *b, uint32_t kind, uint32_t count)
{
    b[0] = (unsigned char)kind;
    b[1] = b[2] = b[3] = 0;
    cps__le32_put(b + 4, count);
}

/* The largest finite value of each 16-bit format: the encoder saturates there, so a large but
 * finite gradient is sent in parts over several steps rather than as an infinity. */
#define F16_MAX  65504.0f
#define BF16_MAX 0x1.fep127f

static void put16(unsigned char *p, uint32_t h)
{
    p[0] = (unsigned char)h;
    p[1] = (unsigned char)(h >> 8);
}

/* One value the fast paths below do not take: saturation, specials, fp16 subnormals. */
static uint16_t encode_one(int bf, float *x)
{
    float max = bf ? BF16_MAX : F16_MAX, v = *x;
    uint16_t h;
    if (isfinite(v)) {
        float c = v > max ? max : v < -max ? -max : v;
        h = bf ? cps__f32_to_bf16(c) : cps__f32_to_f16(c);
        /* Exact (Sterbenz) unless saturated or rounded to zero, where it is x itself. */
        *x = v - (bf ? cps__bf16_to_f32(h) : cps__f16_to_f32(h));
    } else {
        h = bf ? cps__f32_to_bf16(v) : cps__f32_to_f16(v);
        *x = 0;
    }
    return h;
}

/* The common case inline, without a call or a branch per special: a value that is a normal
 * number of the 16-bit format (and rounds to one) is rounded to nearest even by adding below
 * the kept bits, and its decoded value rebuilt from the same bits. The unit tests compare every
 * path with cps__f32_to_f16 / cps__f32_to_bf16. */
static void encode_half(int bf, float *acc, uint64_t n, unsigned char *out)
{
    for (uint64_t i = 0; i < n; i++) {
        uint32_t u = f2u(acc[i]), a = u & 0x7fffffffu, sign = u ^ a;
        if (!bf && a >= 0x38800000u && a < 0x477ff000u) {
            /* [2^-14, 65520): normal halves; rebias 127 -> 15, round, keep 10 bits. */
            uint32_t y = a - 0x38000000u;
            uint32_t h = (y + 0xfffu + ((y >> 13) & 1u)) >> 13;
            put16(out + 2 * i, (sign >> 16) | h);
            acc[i] -= u2f(sign | ((h << 13) + 0x38000000u));
        } else if (bf && a < 0x7f7f8000u) {
            /* Below the largest bf16's rounding limit: no overflow, no NaN. */
            uint32_t h = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
            put16(out + 2 * i, h);
            acc[i] -= u2f(h << 16);
        } else {
            put16(out + 2 * i, encode_one(bf, &acc[i]));
        }
    }
}

/* The k-th largest of a[0..n) (1 <= k <= n), reordering a. Quickselect with a three-way
 * partition (gradients hold many equal magnitudes, zeros above all) and pivots drawn from a
 * fixed-seed generator: O(n) on average whatever the input's order. The result is the same
 * whichever pivots are drawn. */
static uint32_t kth_largest(uint32_t *a, uint64_t n, uint64_t k)
{
    uint64_t lo = 0, hi = n - 1, target = n - k; /* ascending rank of the answer */
    uint64_t rng = 0x9e3779b97f4a7c15ull ^ n;
    while (lo < hi) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        uint32_t p = a[lo + rng % (hi - lo + 1)];
        /* a[lo..lt) < p, a[lt..i) == p, a(gt..hi] > p */
        uint64_t lt = lo, i = lo, gt = hi;
        while (i <= gt) {
            uint32_t v = a[i];
            if (v < p) {
                a[i++] = a[lt];
                a[lt++] = v;
            } else if (v > p) {
                a[i] = a[gt];
                a[gt] = v;
                if (gt == 0)
                    break;
                gt--;
            } else {
                i++;
            }
        }
        if (target < lt)
            hi = lt - 1;
        else if (target > gt)
            lo = gt + 1;
        else
            return p;
    }
    return a[lo];
}

static uint32_t mag_of(float f)
{
    /* For floats without the sign, unsigned order of the bits is numeric order, and NaNs (above
     * infinity's pattern) rank first, so they are sent, not carried. */
    return f2u(f) & 0x7fffffffu;
}

/* The k-th largest magnitude of acc[0..n) (the threshold), and in *above how many are larger.
 * `mag` (n entries) is scratch. Exact whatever path it takes: a large input is first cut down
 * by a threshold a fixed sample says lies below the answer (about 2k candidates survive), so
 * the quickselect runs on those rather than on all n; if fewer than k survive (an unlucky
 * sample), the whole input is selected instead. */
static uint32_t topk_threshold(const float *acc, uint64_t n, uint64_t k, uint32_t *mag,
                               uint64_t *above)
{
    enum { SAMPLE = 1024 };
    uint64_t c = 0;
    uint64_t want = 2 * k * SAMPLE / n + 16; /* sample values the cut keeps, with slack */
    if (n >= 16 * SAMPLE && want < SAMPLE) {
        uint32_t s[SAMPLE];
        for (uint64_t i = 0; i < SAMPLE; i++)
            s[i] = mag_of(acc[i * (n / SAMPLE)]);
        uint32_t lo = kth_largest(s, SAMPLE, want);
        for (uint64_t i = 0; i < n; i++) {
            uint32_t m = mag_of(acc[i]);
            mag[c] = m; /* written always, kept when it passes: no branch to mispredict */
            c += m >= lo;
        }
    }
    if (c < k) {
        for (uint64_t i = 0; i < n; i++)
            mag[i] = mag_of(acc[i]);
        c = n;
    }
    uint32_t t = kth_largest(mag, c, k);
    /* Every value larger than t is among the candidates. */
    uint64_t a = 0;
    for (uint64_t i = 0; i < c; i++)
        a += mag[i] > t;
    *above = a;
    return t;
}

static int encode_topk(const cps__gradcodec *gc, float *acc, uint64_t n, unsigned char *out,
                       uint32_t *scratch)
{
    uint64_t k = cps__gradcodec_topk_k(gc->ratio, n), above;
    uint32_t *mag = scratch ? scratch : malloc(n * sizeof *mag);
    if (!mag)
        return CPS_ENOMEM;
    uint32_t t = topk_threshold(acc, n, k, mag, &above);
    if (!scratch)
        free(mag);
    /* Every value above the threshold, then those equal to it from the lowest index up. What is
     * not sent is carried as it is, except what would poison every later step. */
    uint64_t ties = k - above, j = 0;
    put_hdr(out, CPS_GC_TOPK, (uint32_t)k);
    unsigned char *idx = out + CPS_GC_HDR_SIZE, *val = idx + 4 * k;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t m = mag_of(acc[i]);
        if (m > t || (m == t && ties > 0)) {
            if (m == t)
                ties--;
            cps__le32_put(idx + 4 * j, (uint32_t)i);
            cps__le32_put(val + 4 * j, f2u(acc[i]));
            acc[i] = 0; /* sent whole: nothing left to carry */
            j++;
        } else if (m >= 0x7f800000u) {
            acc[i] = 0;
        }
    }
    return 0;
}

int cps__gradcodec_encode(const cps__gradcodec *gc, float *acc, uint64_t n, void *out, size_t cap,
                          size_t *out_len, uint32_t *scratch)
{
    size_t need = cps__gradcodec_size(gc, n);
    if (!acc || !out || !out_len || need == 0 || cap < need)
        return CPS_EINVAL;
    unsigned char *b = out;
    if (gc->kind == CPS_GC_TOPK) {
        int rc = encode_topk(gc, acc, n, b, scratch);
        if (rc != 0)
            return rc;
    } else {
        put_hdr(b, gc->kind, (uint32_t)n);
        encode_half(gc->kind == CPS_GC_BF16, acc, n, b + CPS_GC_HDR_SIZE);
    }
    *out_len = need;
    return 0;
}

/* ---- decode ---- */

int cps__gradcodec_decode(const void *buf, size_t len, uint64_t n, float *out)
{
    if (!buf || !out || n == 0)
        return CPS_EINVAL;
    if (n > UINT32_MAX)
        return CPS_EPROTO;
    const unsigned char *b = buf;
    if (len < CPS_GC_HDR_SIZE)
        return CPS_ESIZE;
    if (b[1] || b[2] || b[3])
        return CPS_EPROTO;
    uint64_t count = cps__le32_get(b + 4);
    const unsigned char *d = b + CPS_GC_HDR_SIZE;
    switch (b[0]) {
    case CPS_GC_FP16:
    case CPS_GC_BF16:
        if (count != n)
            return CPS_EPROTO;
        if (len - CPS_GC_HDR_SIZE != 2 * n)
            return CPS_ESIZE;
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h = (uint16_t)(d[2 * i] | d[2 * i + 1] << 8);
            out[i] = b[0] == CPS_GC_FP16 ? cps__f16_to_f32(h) : cps__bf16_to_f32(h);
        }
        return 0;
    case CPS_GC_TOPK: {
        if (count == 0 || count > n)
            return CPS_EPROTO;
        if (len - CPS_GC_HDR_SIZE != 8 * count)
            return CPS_ESIZE;
        /* Every index checked before out is touched: a bad block leaves it as it was. */
        for (uint64_t j = 0; j < count; j++) {
            uint32_t i = cps__le32_get(d + 4 * j);
            if (i >= n || (j > 0 && i <= cps__le32_get(d + 4 * (j - 1))))
                return CPS_EPROTO;
        }
        memset(out, 0, n * sizeof *out);
        const unsigned char *v = d + 4 * count;
        for (uint64_t j = 0; j < count; j++)
            out[cps__le32_get(d + 4 * j)] = u2f(cps__le32_get(v + 4 * j));
        return 0;
    }
    default:
        return CPS_EPROTO;
    }
}
