/* Huge-page buffers (core/bigbuf.c): what the export's write ring and its heap warm-up rely on.
 * Whether the kernel gave huge pages is its choice (a hint); what must hold either way: the
 * alignment O_DIRECT needs, zeroed memory all of whose bytes are ours, and a heap that still
 * works, with nothing outside the warm-up's own blocks touched (ASan checks that in its pass). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/bigbuf.h"

static void bigbuf_is_aligned_zeroed_and_ours(void **state)
{
    (void)state;
    const size_t sizes[] = {1, 4096, (8u << 20) + 123, 3u << 20};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        unsigned char *p = cps__bigbuf_alloc(sizes[k]);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % (2u << 20), 0);
        for (size_t i = 0; i < sizes[k]; i += 4096)
            assert_int_equal(p[i], 0);
        assert_int_equal(p[sizes[k] - 1], 0);
        memset(p, 0xa5, sizes[k]);
        assert_int_equal(p[sizes[k] - 1], 0xa5);
        cps__bigbuf_free(p, sizes[k]);
    }
    cps__bigbuf_free(NULL, 0); /* allowed, like free(NULL) */
}

static void prewarm_leaves_a_working_heap(void **state)
{
    (void)state;
    /* Blocks alive across the warm-up keep their contents. */
    unsigned char *keep = malloc(1 << 20);
    assert_non_null(keep);
    memset(keep, 0x3c, 1 << 20);
    cps__heap_prewarm((size_t)24 << 20);
    cps__heap_prewarm(0); /* nothing to do */
    for (size_t i = 0; i < 1 << 20; i += 997)
        assert_int_equal(keep[i], 0x3c);
    /* Blocks of the size the warm-up served, taken and written whole, then freed. */
    unsigned char *b[6];
    for (int i = 0; i < 6; i++) {
        b[i] = malloc(8u << 20);
        assert_non_null(b[i]);
        memset(b[i], i + 1, 8u << 20);
    }
    for (int i = 0; i < 6; i++) {
        assert_int_equal(b[i][0], i + 1);
        assert_int_equal(b[i][(8u << 20) - 1], i + 1);
        free(b[i]);
    }
    free(keep);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bigbuf_is_aligned_zeroed_and_ours),
        cmocka_unit_test(prewarm_leaves_a_working_heap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
