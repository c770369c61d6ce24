/* Apart from bench.c: programs that time things without the chainps library (bench_nn) link
 * this object alone. */
#include <time.h>

#include "bench.h"

double tc_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
