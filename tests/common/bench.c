#include "bench.h"

#include <errno.h> /* program_invocation_short_name */
#include <stdio.h>
#include <stdlib.h>

#include "chainps/error.h"

void tc_check(int rc, const char *what)
{
    if (rc != 0) {
        fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, what, cps_strerror(rc));
        exit(1);
    }
}
