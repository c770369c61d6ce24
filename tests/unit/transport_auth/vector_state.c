/* unit.transport_auth: a MAC leaves the vector registers' upper halves clean (auth.c, vec_clean).
 *
 * OpenSSL's Poly1305 for AVX-512 IFMA returns with them in use, and until the thread runs a
 * vzeroupper every legacy SSE instruction it executes pays a transition penalty (scalar double
 * code ran 21 times slower). The processor says which state components are in use: XGETBV with
 * ECX = 1 (XINUSE), bit 2 for the upper halves of ymm0-15 and bit 6 for those of zmm0-15. */
#include "fixture.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>

#define UPPER_IN_USE ((1u << 2) | (1u << 6))

/* XCR0 (XGETBV with ECX = 0): the state components the OS saves and so lets a thread use. */
static unsigned xcr0(void)
{
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    return lo;
}

/* 1 if XGETBV with ECX = 1 works here and the probe's ymm instruction may run: the OS enabled
 * XSAVE and the SSE and AVX state (XCR0 bits 1 and 2: without them a ymm instruction faults,
 * SIGILL, however the CPU reports AVX), the CPU has AVX and XINUSE. */
static int xinuse_readable(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE) || !(c & bit_AVX))
        return 0;
    if ((xcr0() & 6) != 6)
        return 0;
    if (!__get_cpuid_count(0xd, 1, &a, &b, &c, &d))
        return 0;
    return (a & (1u << 2)) != 0;
}

static unsigned xinuse(void)
{
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(1));
    (void)hi;
    return lo;
}

/* The probe itself: dirtied by a 256-bit instruction, cleaned by vzeroupper. */
static int probe_works(void)
{
    __asm__ volatile("vpcmpeqd %%ymm0, %%ymm0, %%ymm0" ::: "xmm0");
    unsigned dirty = xinuse();
    __asm__ volatile("vzeroupper" ::: "xmm0");
    unsigned clean = xinuse();
    return (dirty & UPPER_IN_USE) && !(clean & UPPER_IN_USE);
}

#define CLEAN_AFTER(what)                                                                          \
    do {                                                                                           \
        unsigned x_ = xinuse();                                                                    \
        if (x_ & UPPER_IN_USE)                                                                     \
            fail_msg("upper vector state in use (XINUSE %#x) after %s", x_, what);                 \
    } while (0)

void mac_leaves_vector_state_clean(void **state)
{
    (void)state;
    if (!xinuse_readable() || !probe_works())
        skip();
    size_t sizes[] = {64, 4096, 1u << 20};
    cps__auth *tx, *rx;
    assert_int_equal(cps__auth_create(KEY, &tx), 0);
    CLEAN_AFTER("create");
    assert_int_equal(cps__auth_create(KEY, &rx), 0);
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        size_t n = sizes[i], body = 0;
        unsigned char *m = malloc(n + CPS_AUTH_TRAILER), *dst = malloc(n);
        assert_true(m && dst);
        for (size_t j = 0; j < n; j++)
            m[j] = (unsigned char)(j * 31u + 7);
        cps__auth_seal(tx, m, n);
        CLEAN_AFTER("seal");
        assert_int_equal(cps__auth_open(rx, m, n + CPS_AUTH_TRAILER, &body), CPS_AUTH_OK);
        CLEAN_AFTER("open");
        /* A refused tag runs the same arithmetic. */
        m[n / 2] ^= 1;
        assert_int_equal(cps__auth_open(rx, m, n + CPS_AUTH_TRAILER, &body), CPS_AUTH_BAD_TAG);
        CLEAN_AFTER("a refused open");
        m[n / 2] ^= 1;
        memcpy(dst, m, n);
        cps__auth_seal_copy(tx, m, n, 0, dst, n);
        CLEAN_AFTER("seal_copy");
        assert_int_equal(cps__auth_open_copy(rx, m, n + CPS_AUTH_TRAILER, &body, 0, dst, n),
                         CPS_AUTH_OK);
        CLEAN_AFTER("open_copy");
        uint64_t s = cps__auth_stream_begin(tx);
        assert_true(s != 0);
        CLEAN_AFTER("stream_begin");
        assert_int_equal(cps__auth_stream_copy(tx, s, m, n / 2, dst + n / 2, n - n / 2), 0);
        CLEAN_AFTER("stream_copy");
        assert_int_equal(cps__auth_stream_seal(tx, s, m, n), 0);
        CLEAN_AFTER("stream_seal");
        assert_int_equal(cps__auth_open(rx, m, n + CPS_AUTH_TRAILER, &body), CPS_AUTH_OK);
        CLEAN_AFTER("open of a streamed seal");
        free(m);
        free(dst);
    }
    cps__auth_destroy(tx);
    cps__auth_destroy(rx);
}
#else
void mac_leaves_vector_state_clean(void **state)
{
    (void)state;
    skip();
}
#endif
