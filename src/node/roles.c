#include "roles.h"

#include <cblas.h>
#include <malloc.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

static volatile sig_atomic_t stop_requested;
static volatile sig_atomic_t stop_signals; /* SIGINT/SIGTERM received */

void cps__role_request_stop(void)
{
    stop_requested = 1;
}

int cps__role_stop_requested(void)
{
    return stop_requested != 0;
}

static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
    if (stop_signals < 1000)
        stop_signals++;
}

int cps__role_stop_signals(void)
{
    return (int)stop_signals;
}

void cps__role_install_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

void cps__tune_malloc(void)
{
    if (getenv("GLIBC_TUNABLES"))
        return;
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
    mallopt(M_MMAP_THRESHOLD, 128 << 20);
}

/* OpenBLAS (pthread builds) exports the shutdown of its pool, which its own fork handler uses, but
 * no public header declares it: weak, so a BLAS without it links and this call is skipped. */
extern int blas_thread_shutdown_(void) __attribute__((weak));

void cps__blas_end_pool(void)
{
    openblas_set_num_threads(1);
    /* Only the pthread build (openblas_get_parallel() == 1): the OpenMP build exports the same
     * name, and its version frees the threads' buffers without a lock. */
    if (blas_thread_shutdown_ && openblas_get_parallel() == 1)
        blas_thread_shutdown_();
}
