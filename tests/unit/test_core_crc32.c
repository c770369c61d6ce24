/* cps__crc32 against zlib's CRC-32 (the checkpoint checksum Python's zlib.crc32 verifies):
 * every length around the folding's block sizes, every alignment, chained calls split anywhere,
 * and the standard check value. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/crc32.h"

static unsigned char *random_bytes(size_t n, uint64_t seed)
{
    unsigned char *b = malloc(n ? n : 1);
    assert_non_null(b);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        b[i] = (unsigned char)(seed >> 56);
    }
    return b;
}

static void check_value(void **state)
{
    (void)state;
    assert_int_equal(cps__crc32(0, "123456789", 9), 0xcbf43926u);
    assert_int_equal(cps__crc32(0, NULL, 0), 0);
    /* 1 MB of zeros: long enough for the folded path, a value zlib also gives. */
    unsigned char *z = calloc(1, 1 << 20);
    assert_non_null(z);
    assert_int_equal(cps__crc32(0, z, 1 << 20), cps__crc32_portable(0, z, 1 << 20));
    free(z);
}

static void every_length_and_alignment(void **state)
{
    (void)state;
    const size_t max = 4096 + 64;
    unsigned char *b = random_bytes(max + 16, 1);
    for (size_t off = 0; off < 16; off++)
        for (size_t n = 0; n + off <= max; n += (n < 1100 ? 1 : 61))
            assert_int_equal(cps__crc32(0x12345678u, b + off, n),
                             cps__crc32_portable(0x12345678u, b + off, n));
    free(b);
}

static void chained_calls(void **state)
{
    (void)state;
    const size_t n = (3u << 20) + 77;
    unsigned char *b = random_bytes(n, 2);
    uint32_t whole = cps__crc32_portable(0, b, n);
    assert_int_equal(cps__crc32(0, b, n), whole);
    size_t cuts[] = {1, 63, 64, 255, 256, 257, 4096, 65535, 1u << 20, n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        uint32_t c = cps__crc32(0, b, cuts[i]);
        assert_int_equal(cps__crc32(c, b + cuts[i], n - cuts[i]), whole);
    }
    /* Pieces of odd sizes, as the checkpoint writer feeds it. */
    uint32_t c = 0;
    for (size_t at = 0, k = 1; at < n; at += k, k = k * 7 % 100003 + 1)
        c = cps__crc32(c, b + at, at + k <= n ? k : n - at);
    assert_int_equal(c, whole);
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(check_value),
        cmocka_unit_test(every_length_and_alignment),
        cmocka_unit_test(chained_calls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
