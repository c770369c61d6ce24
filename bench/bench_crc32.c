/* CRC-32 throughput: cps__crc32 (carry-less multiply where the CPU has it) against zlib's
 * crc32_z, the checkpoint checksum's two implementations.
 *
 * usage: bench_crc32 [--reps N]   (default 7)
 * Per buffer size, each implementation runs over the same random buffer (warm in the cache for
 * the small sizes, streaming for 64 MB) for about 100 ms, N times; the table gives the median
 * GB/s (10^9 B/s) of each and their ratio. The two must agree on every value, or it exits 1. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/crc32.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef uint32_t (*crc_fn)(uint32_t, const void *, size_t);

/* GB/s of fn over buf for ~100 ms; *out: the last value. */
static double rate(crc_fn fn, const unsigned char *buf, size_t n, uint32_t *out)
{
    size_t iters = ((size_t)256 << 20) / n;
    iters = iters ? iters : 1;
    uint32_t c = 0;
    double t0 = now_s(), t1;
    size_t done = 0;
    do {
        for (size_t i = 0; i < iters; i++)
            c = fn(0, buf, n);
        done += iters;
        t1 = now_s();
    } while (t1 - t0 < 0.1);
    *out = c;
    return (double)n * (double)done / (t1 - t0) / 1e9;
}

int main(int argc, char **argv)
{
    int reps = 7;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: %s [--reps N]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1 || reps > 101) {
        fprintf(stderr, "bench_crc32: --reps must be 1..101\n");
        return 2;
    }
    const size_t sizes[] = {4096, 65536, 1u << 20, 8u << 20, 64u << 20};
    const size_t max = 64u << 20;
    unsigned char *buf = malloc(max);
    if (!buf)
        return 1;
    uint64_t s = 88172645463325252ull;
    for (size_t i = 0; i < max; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        buf[i] = (unsigned char)s;
    }
    printf("CRC-32, median of %d runs; carry-less multiply: %s\n", reps,
           cps__crc32_accelerated() ? "yes" : "no (both columns are zlib)");
    printf("%10s %12s %12s %8s\n", "bytes", "zlib GB/s", "chainps GB/s", "ratio");
    int bad = 0;
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        double z[101], c[101];
        for (int r = 0; r < reps; r++) {
            uint32_t vz, vc;
            z[r] = rate(cps__crc32_portable, buf, sizes[k], &vz);
            c[r] = rate(cps__crc32, buf, sizes[k], &vc);
            bad |= vz != vc;
        }
        qsort(z, (size_t)reps, sizeof *z, cmp_double);
        qsort(c, (size_t)reps, sizeof *c, cmp_double);
        printf("%10zu %12.2f %12.2f %7.2fx\n", sizes[k], z[reps / 2], c[reps / 2],
               c[reps / 2] / z[reps / 2]);
    }
    free(buf);
    if (bad)
        fprintf(stderr, "bench_crc32: the two implementations disagree\n");
    return bad;
}
