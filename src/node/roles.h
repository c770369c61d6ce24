/* Entry points of the long-running roles. Each runs its event loop until the job ends, a fatal
 * error occurs, or cps__role_request_stop() is called (SIGINT/SIGTERM handlers call it). */
#ifndef CPS_NODE_ROLES_H
#define CPS_NODE_ROLES_H

#include "core/config.h"

/* Run the scheduler. Returns 0 when every worker finished, CPS_ETIMEDOUT when the expected nodes
 * did not all arrive within cfg->join_timeout_ms, other CPS_E... on fatal errors. */
int cps__scheduler_run(const cps__config *cfg);

/* Run a server. Returns 0 when the scheduler ends the job (or a stop was requested),
 * CPS_ETIMEDOUT if the scheduler never answered, CPS_ESTORE/CPS_EPOISONED on storage failure. */
int cps__server_run(const cps__config *cfg);

/* Async-signal-safe: ask the running role loop to stop after its current iteration. */
void cps__role_request_stop(void);
/* 1 once a stop was requested. */
int cps__role_stop_requested(void);
/* How many SIGINT/SIGTERM arrived (a server drains on the first and stops on the second). */
int cps__role_stop_signals(void);
/* Keep freed message buffers in the heap instead of returning them to the kernel at once:
 * nanomsg allocates every received message afresh, and with glibc's defaults each 1 MB message
 * is an mmap/munmap pair plus page faults (measured: 37% of a server's CPU per 1 MB push+pull).
 * Does nothing when the user set GLIBC_TUNABLES. */
void cps__tune_malloc(void);

/* BLAS on the calling thread only, and no idle BLAS threads. For the server's process only:
 * ending the pool does not wait for BLAS work other threads have queued (a thread inside BLAS at
 * that moment could wait for ever), so it may run only where no other thread can be in BLAS,
 * never in a worker (the user's process: its own threads, torch, numpy). openblas_set_num_threads()
 * alone (OpenBLAS 0.3.21, pthread build) starts the pool of (cores - 1) threads if it is not
 * running, and each of them then spins in sched_yield() for 2^28 TSC ticks (~0.1 s) before it
 * sleeps: an idle `chainps server` took 17-37 ms of CPU and 4,500-76,000 system calls in its first
 * second, against 14-15 ms and 1,100 with the pool ended at once (bench/results/transport.md
 * §10). This sets one thread and ends the pool (OpenBLAS starts it again should a later call
 * ask for more threads). OPENBLAS_NUM_THREADS=1 in the environment avoids the pool altogether. */
void cps__blas_end_pool(void);

/* Install SIGINT/SIGTERM handlers that request a stop, and ignore SIGPIPE. */
void cps__role_install_signals(void);

/* Fill what the environment and flags left open, now that the role is known:
 *  - advertise host: 127.0.0.1 when the scheduler is on loopback, else the local address the
 *    kernel would use to reach the scheduler (a UDP connect, which sends nothing);
 *  - bind host: the address the node is reached at: for the scheduler its own address as the
 *    job names it (CHAINPS_SCHEDULER, DMLC_PS_ROOT_URI, MS_SCHED_HOST) unless it advertises
 *    another, for the others their advertise host; names are resolved to an IPv4 address.
 *    Every interface (0.0.0.0) only when --bind / CHAINPS_BIND says so (behind NAT or a
 *    Kubernetes service, where the advertised address is not local);
 *  - the scheduler's inbox port is the scheduler port. */
void cps__config_finalize(cps__config *cfg, int role);

/* Read the job's secret (cfg->secret_file) into cfg, once; without one, accept running
 * unauthenticated only when cfg->insecure says so (then warn once per process). `who` names the
 * subsystem in the log. Returns 0, or CPS_ECONFIG with the reason and the fix logged. */
int cps__node_load_secret(cps__config *cfg, const char *who);
/* The key to hand cps__tp_create(): NULL for an insecure job. */
const unsigned char *cps__node_key(const cps__config *cfg);

/* "tcp://host:port" into out. Errors: CPS_ECONFIG when it does not fit CPS_ADDR_MAX. */
int cps__make_url(char out[CPS_ADDR_MAX], const char *host, uint16_t port);

#endif
