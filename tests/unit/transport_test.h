/* Helpers shared by the transport's unit tests (test_transport_*.c): a monotonic clock for
 * deadlines and a log sink that keeps the expected warnings out of the output. */
#ifndef CPS_TESTS_TRANSPORT_TEST_H
#define CPS_TESTS_TRANSPORT_TEST_H

#include <stdint.h>
#include <time.h>

static inline int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline void quiet_sink(void *ctx, int level, const char *subsystem, const char *line)
{
    (void)ctx, (void)level, (void)subsystem, (void)line;
}

#endif
