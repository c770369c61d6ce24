/* Small things every benchmark program wants the same way: one clock for its timings, a median,
 * and one way to give up on an error of the chainps API. */
#ifndef CPS_TESTS_COMMON_BENCH_H
#define CPS_TESTS_COMMON_BENCH_H

#include <stddef.h>

/* Seconds on CLOCK_MONOTONIC (not wall time: immune to clock steps during a run). */
double tc_now_s(void);
/* This thread's CPU seconds: on a machine shared with other work the wall clock counts the time
 * other processes held the core, the thread's CPU time mostly does not. */
double tc_thread_cpu_s(void);

/* Parse a comma-separated list of sizes in bytes ("64,4096,1048576") into sizes[0, max), each at
 * least `min`. Returns how many, or -1 (not a number, below min, or more than max). */
int tc_sizes_parse(const char *list, size_t *sizes, int max, size_t min);

/* The median of v[0, n) (n >= 1); sorts v in place. */
double tc_median(double *v, int n);

/* rc != 0 (a CPS_E... code): print "PROG: WHAT: <cps_strerror(rc)>" and exit(1). The program
 * links the chainps library. */
void tc_check(int rc, const char *what);

#endif
