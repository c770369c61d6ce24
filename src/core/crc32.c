#include "core/crc32.h"

#include <zlib.h>

uint32_t cps__crc32_portable(uint32_t crc, const void *buf, size_t len)
{
    return (uint32_t)crc32_z(crc, (const Bytef *)buf, len);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define CLMUL_TARGET __attribute__((target("pclmul,sse4.1")))

/* Folding constants of the reflected polynomial, each x^n mod P(x) bit-reflected and shifted one
 * place (the reflected product of two 64-bit values is 127 bits wide):
 *   fold by 512 bits: x^(512+32) and x^(512-32);  fold by 128 bits: x^(128+32) and x^(128-32);
 *   fold 64 -> 32 bits: x^64;  Barrett reduction: P(x) itself and floor(x^64 / P(x)). */
#define K_512_HI 0x1c6e41596ull
#define K_512_LO 0x154442bd4ull
#define K_128_HI 0x0ccaa009eull
#define K_128_LO 0x1751997d0ull
#define K_64     0x163cd6124ull
#define P_REFL   0x1db710641ull
#define MU_REFL  0x1f7011641ull

/* a * k: the low 64 bits of each times the constant of the same half, summed. That is one fold:
 * 128 bits of remainder moved forward over the distance the constants encode. */
CLMUL_TARGET static inline __m128i fold(__m128i a, __m128i k)
{
    return _mm_xor_si128(_mm_clmulepi64_si128(a, k, 0x00), _mm_clmulepi64_si128(a, k, 0x11));
}

/* The raw (uninverted) CRC of n bytes, n a positive multiple of 64. */
CLMUL_TARGET static uint32_t crc_clmul(uint32_t crc, const unsigned char *p, size_t n)
{
    const __m128i k512 = _mm_set_epi64x((long long)K_512_HI, (long long)K_512_LO);
    const __m128i k128 = _mm_set_epi64x((long long)K_128_HI, (long long)K_128_LO);
    __m128i x0 = _mm_loadu_si128((const __m128i *)(const void *)p);
    __m128i x1 = _mm_loadu_si128((const __m128i *)(const void *)(p + 16));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(const void *)(p + 32));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(const void *)(p + 48));
    x0 = _mm_xor_si128(x0, _mm_cvtsi32_si128((int)crc));
    p += 64;
    n -= 64;
    /* Four independent lanes, so the multiplier's latency overlaps. */
    for (; n >= 64; p += 64, n -= 64) {
        x0 = _mm_xor_si128(fold(x0, k512), _mm_loadu_si128((const __m128i *)(const void *)p));
        x1 =
            _mm_xor_si128(fold(x1, k512), _mm_loadu_si128((const __m128i *)(const void *)(p + 16)));
        x2 =
            _mm_xor_si128(fold(x2, k512), _mm_loadu_si128((const __m128i *)(const void *)(p + 32)));
        x3 =
            _mm_xor_si128(fold(x3, k512), _mm_loadu_si128((const __m128i *)(const void *)(p + 48)));
    }
    /* The four lanes into one. */
    __m128i x = _mm_xor_si128(fold(x0, k128), x1);
    x = _mm_xor_si128(fold(x, k128), x2);
    x = _mm_xor_si128(fold(x, k128), x3);
    /* 128 -> 64 bits (with the 32 zero bits a CRC appends): the low half moved onto the high. */
    x = _mm_xor_si128(_mm_clmulepi64_si128(x, k128, 0x10), _mm_srli_si128(x, 8));
    /* 64 -> 32 bits. */
    const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
    __m128i t =
        _mm_clmulepi64_si128(_mm_and_si128(x, mask32), _mm_set_epi64x(0, (long long)K_64), 0x00);
    x = _mm_xor_si128(_mm_srli_si128(x, 4), t);
    /* Barrett reduction to the 32-bit remainder. */
    const __m128i pmu = _mm_set_epi64x((long long)MU_REFL, (long long)P_REFL);
    t = _mm_clmulepi64_si128(_mm_and_si128(x, mask32), pmu, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, mask32), pmu, 0x00);
    x = _mm_xor_si128(x, t);
    return (uint32_t)_mm_extract_epi32(x, 1);
}

/* No cache of its own: the compiler's CPU model is filled in before main, and reading it is a
 * load and a test, from any thread. */
static int have_clmul(void)
{
    return __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
}

int cps__crc32_accelerated(void)
{
    return have_clmul();
}

uint32_t cps__crc32(uint32_t crc, const void *buf, size_t len)
{
    /* Below a few blocks the setup costs more than the table lookups save. */
    if (len < 256 || !have_clmul())
        return cps__crc32_portable(crc, buf, len);
    size_t bulk = len & ~(size_t)63;
    /* zlib's value is the raw remainder of the inverted register, inverted again. */
    uint32_t raw = crc_clmul(~crc, buf, bulk);
    return cps__crc32_portable(~raw, (const unsigned char *)buf + bulk, len - bulk);
}

#else

int cps__crc32_accelerated(void)
{
    return 0;
}

uint32_t cps__crc32(uint32_t crc, const void *buf, size_t len)
{
    return cps__crc32_portable(crc, buf, len);
}

#endif
