/* Small things every benchmark program wants the same way: one clock for its timings, a median,
 * and one way to give up on an error of the chainps API. */
#ifndef CPS_TESTS_COMMON_BENCH_H
#define CPS_TESTS_COMMON_BENCH_H

/* Seconds on CLOCK_MONOTONIC (not wall time: immune to clock steps during a run). */
double tc_now_s(void);

/* The median of v[0, n) (n >= 1); sorts v in place. */
double tc_median(double *v, int n);

/* rc != 0 (a CPS_E... code): print "PROG: WHAT: <cps_strerror(rc)>" and exit(1). The program
 * links the chainps library. */
void tc_check(int rc, const char *what);

#endif
