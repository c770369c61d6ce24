/* cps__blas_end_pool (node/roles.h): BLAS keeps computing on the calling thread and leaves no
 * pool of idle threads behind, whose spin in sched_yield() cost every server tens of ms of CPU
 * at its start (issue 30). */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cblas.h>
#include <cmocka.h>

#include "node/roles.h"

/* Threads of this process, from /proc/self/task. */
static int threads(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* y += x over n values, through BLAS, checked against the same sum done here. */
static void saxpy_right(int n)
{
    static float x[1 << 16], y[1 << 16];
    for (int i = 0; i < n; i++) {
        x[i] = (float)(i % 97);
        y[i] = (float)(i % 13);
    }
    cblas_saxpy(n, 1.0f, x, 1, y, 1);
    for (int i = 0; i < n; i++)
        assert_true(y[i] == (float)(i % 97) + (float)(i % 13));
}

static void ends_the_pool_and_blas_still_computes(void **state)
{
    (void)state;
    /* The pool as a server had it (started when OpenBLAS was loaded or by
     * openblas_set_num_threads): the probe must see it, or this machine's BLAS has none (one
     * core, an OpenMP or serial build). This test runs no thread of its own. */
    openblas_set_num_threads(2);
    if (openblas_get_parallel() != 1) {
        printf("skip: this OpenBLAS is not its pthread build (parallel mode %d): the pool is "
               "left alone there\n",
               openblas_get_parallel());
        skip();
    }
    if (threads() <= 1) {
        printf("skip: OpenBLAS starts no thread pool here (%d cores)\n", openblas_get_num_procs());
        skip();
    }
    cps__blas_end_pool();
    assert_int_equal(threads(), 1);
    assert_int_equal(openblas_get_num_threads(), 1);
    saxpy_right(1 << 16);
    assert_int_equal(threads(), 1);
    /* Asked for threads again, OpenBLAS makes its pool anew, and it computes right; ended again
     * as before. */
    openblas_set_num_threads(2);
    saxpy_right(1 << 16);
    cps__blas_end_pool();
    assert_int_equal(threads(), 1);
    saxpy_right(1000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ends_the_pool_and_blas_still_computes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
