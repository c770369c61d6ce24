/* Apart from bench.c: programs that time things without the chainps library (bench_nn) link
 * this object alone. */
#include <stdlib.h>
#include <time.h>

#include "bench.h"

double tc_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double tc_thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int tc_sizes_parse(const char *list, size_t *sizes, int max, size_t min)
{
    int n = 0;
    for (const char *s = list; *s; s += *s == ',') {
        char *end;
        unsigned long long v = strtoull(s, &end, 10);
        if (end == s || v < min || n == max)
            return -1;
        sizes[n++] = (size_t)v;
        s = end;
    }
    return n;
}
