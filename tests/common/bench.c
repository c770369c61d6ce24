#include "bench.h"

#include <errno.h> /* program_invocation_short_name */
#include <stdio.h>
#include <stdlib.h>

#include "chainps/error.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double tc_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void tc_check(int rc, const char *what)
{
    if (rc != 0) {
        fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, what, cps_strerror(rc));
        exit(1);
    }
}
