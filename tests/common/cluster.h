/* Multi-process test harness (library cps__testcluster, used by tests/integration): bring up
 * clusters of real chainps processes on 127.0.0.1, watch their logs, and end every one of them
 * by its PID, even when an assertion fails half-way through a test.
 *
 * Each spawned process runs in its own process group (so `chainps launch` and its children die
 * together), with stdout and stderr appended to <test dir>/<name>.log. Every PID is kept in a
 * registry; h_kill_all() runs from each test's teardown, from atexit(), and from SIGTERM/SIGINT
 * handlers (CTest's timeout sends SIGTERM), and children also get PR_SET_PDEATHSIG so they die
 * with the test process even if it is SIGKILLed.
 *
 * Nothing here sleeps for a fixed time: every wait polls its condition every few milliseconds
 * until a deadline.
 *
 * Not thread-safe: call from the test's main thread only.
 */
#ifndef CPS_TESTS_COMMON_CLUSTER_H
#define CPS_TESTS_COMMON_CLUSTER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "chainps/chainps.h"
#include "core/port.h" /* cps__free_port: the ports tests give their processes */

/* Every address a test uses. */
#define H_HOST "127.0.0.1"

/* Make a fresh temp dir for one test (under $TMPDIR, else /tmp) and install the exit/signal
 * hooks. Returns the dir (static storage until h_test_end). Aborts the test on failure. */
const char *h_test_begin(const char *name);
/* Fail the whole test program (killing every child) if it is still running in `seconds`: a
 * blocking call that never returns must not wait for CTest's timeout. h_test_end disarms it. */
void h_watchdog(unsigned seconds);
/* Kill every process still running, and remove the test dir unless CHAINPS_IT_KEEP=1 or
 * h_test_keep() was called. Returns the number of logs holding a sanitizer report (printed to
 * stderr; the dir is then kept): child processes under ASan/UBSan must fail the test too, and
 * one killed by the harness never gets to exit non-zero. Safe to call twice. */
int h_test_end(void);
/* The cmocka fixtures of a test that runs a cluster, so each test program does not write them
 * again: H_TEST(fn, "name", seconds) in the CMUnitTest table runs fn between h_setup
 * (h_test_begin(name), h_watchdog(seconds)) and h_teardown (h_test_end(); a sanitizer report
 * fails the test). The test's `state` points to its h_fixture. */
typedef struct h_fixture {
    const char *name;
    unsigned watchdog_s;
} h_fixture;
int h_setup(void **state);
int h_teardown(void **state);
#define H_TEST(fn, name, seconds)                                                                  \
    cmocka_unit_test_prestate_setup_teardown(fn, h_setup, h_teardown,                              \
                                             (&(h_fixture){(name), (seconds)}))
/* Keep the test dir (logs) at h_test_end; also printed to stderr. */
void h_test_keep(void);
/* The current test dir. */
const char *h_dir(void);
/* The job secret h_test_begin made (<test dir>/job.secret, also set as CHAINPS_SECRET_FILE in
 * this process) and its key: every process h_spawn
 * starts gets CHAINPS_SECRET_FILE naming it, unless its `env` sets CHAINPS_SECRET_FILE or
 * CHAINPS_INSECURE itself; transports the test opens pass h_key() to cps__tp_create. */
const char *h_secret_file(void);
const unsigned char *h_key(void);

/* Start argv[0] (a path) with argv, the parent's environment minus every CHAINPS_, DMLC_, MS_ and
 * PS_ variable, plus CHAINPS_SECRET_FILE (see h_secret_file), plus `env` ("NAME=value" strings,
 * NULL-terminated; may be NULL). `cwd` NULL: the test dir. Output goes to <test dir>/<name>.log
 * (appended: a restarted process keeps one log). Returns the PID, or -1 (and prints why). */
pid_t h_spawn(const char *name, char *const argv[], char *const env[], const char *cwd);

/* Path of the log of a process started by h_spawn (NULL if unknown). */
const char *h_log_path(pid_t pid);
/* Whole log as a NUL-terminated malloc'd string ("" if none); the caller frees it. */
char *h_read_log(pid_t pid);
/* Number of occurrences of `needle` in the log. */
int h_log_count(pid_t pid, const char *needle);
/* Wait until the log holds `needle` at least `count` times. Returns 1 when it does, 0 on timeout
 * or if the process exited without writing it (then the log's tail is printed to stderr). */
int h_wait_log(pid_t pid, const char *needle, int count, int timeout_ms);

/* Wait for the process to exit. Returns 1 and its wait status in *status (may be NULL), or 0 on
 * timeout (the process keeps running). */
int h_wait_exit(pid_t pid, int timeout_ms, int *status);
/* 1 while the process has not exited. */
int h_alive(pid_t pid);
/* Exit code of an exited process, or -1 - signal if killed by a signal, or -1000 if running. */
int h_exit_code(pid_t pid);
/* SIGTERM the process group, wait up to grace_ms, then SIGKILL it; reaps the process. */
void h_kill(pid_t pid, int grace_ms);
/* SIGKILL the process group now and reap it (a crash, as far as the process can tell). */
void h_kill_hard(pid_t pid);
/* Kill every registered process that is still running (async-signal-safe parts only). */
void h_kill_all(void);

/* Run a process to completion (killed after timeout_ms). Returns its exit code as h_exit_code,
 * or -1000 on timeout. The log stays readable through *pid_out (may be NULL). */
int h_run(const char *name, char *const argv[], char *const env[], int timeout_ms, pid_t *pid_out);

/* Make this process a worker of the job at `sched_addr` (host:port) with `servers` servers and
 * `workers` workers, for a test that calls cps_open itself: sets CHAINPS_ROLE, _SCHEDULER,
 * _NUM_SERVERS and _NUM_WORKERS and clears every other role, rank, port and mode variable
 * (CHAINPS_, DMLC_ and MS_) a job script may have left. */
void h_become_worker(const char *sched_addr, int servers, int workers);

/* Gradient element i of `step` for tests that check parameters bit for bit: dyadic values with
 * few significant bits, so lr * g is exact in float and the server's p -= lr * g gives the
 * test's bits whatever the instruction selection. */
float h_dyadic_grad(size_t i, int step);
/* One such step: fills g[0..len) with h_dyadic_grad(i, step), applies SGD with `lr` to
 * expect[] as the servers will, and pushes g. Returns cps_push's code. */
int h_push_dyadic(cps_client *c, cps_tensor *t, float *g, float *expect, size_t len, float lr,
                  int step);

/* A TCP connection to 127.0.0.1:port (aborts the test on failure). */
int h_tcp_connect(int port);
/* What an attacker writes by hand: nanomsg's SP handshake for a PUSH socket, then one frame whose
 * 8-byte length says `claimed` while `len` (<= 240) bytes of `msg` follow, on a fresh
 * connection; waits for the peer's handshake so the frame is read before the close. */
void h_sp_send(int port, const void *msg, size_t len, uint64_t claimed);

/* Milliseconds on a monotonic clock. */
uint64_t h_now_ms(void);

/* ---- a cluster of separately started processes ---- */

#define H_MAX_SERVERS 8

typedef struct h_cluster {
    int port;            /* scheduler port */
    char sched_addr[64]; /* "127.0.0.1:port" */
    pid_t sched;
    int nservers;
    pid_t servers[H_MAX_SERVERS];
    char data[H_MAX_SERVERS][600];
} h_cluster;

/* Start `chainps scheduler` (retrying with another port if the chosen one was taken meanwhile)
 * and wait until it listens. `extra` adds scheduler flags (NULL-terminated, may be NULL).
 * Returns 0 or -1. */
int h_start_scheduler(h_cluster *c, int servers, int workers, const char *mode,
                      const char *const extra[]);
/* The same with `env` ("NAME=value", NULL-terminated, may be NULL) added to its environment. */
int h_start_scheduler_env(h_cluster *c, int servers, int workers, const char *mode,
                          const char *const extra[], char *const env[]);
/* Start server `rank` on <test dir>/server-<rank> (same dir and rank when called again: a
 * restart). Returns its PID or -1. */
pid_t h_start_server(h_cluster *c, int rank);
/* Scheduler plus `servers` servers. Returns 0 or -1. */
int h_start_cluster(h_cluster *c, int servers, int workers, const char *mode);
/* Wait until scheduler `sched` listens. Returns 0; 1 when its port was taken meanwhile (it is
 * killed: start another on a new port); -1 when it neither listened nor failed in timeout_ms. */
int h_wait_listening(pid_t sched, int timeout_ms);
/* A job started the way ps-lite and MindSpore scripts start one: `argv` five times (scheduler,
 * two servers, two workers), each with role_var=roles[i], port_var=<a free port> and `vars`
 * (NAME=value, NULL-terminated, at most 12). Processes are named <tag>-<i>-<role>; all run in
 * <test dir>/<tag> when `shared_cwd`, else each in <test dir>/<its name>. Returns 0 with
 * pids[5]; 1 when the scheduler's port was taken meanwhile (start again); -1 when a process
 * could not be started or the scheduler neither listened nor failed in timeout_ms. */
int h_start_role_job(const char *tag, const char *role_var, const char *const roles[5],
                     const char *port_var, char *const vars[], char *const argv[], int shared_cwd,
                     int timeout_ms, pid_t pids[5]);
/* The inbox URL a server logged ("tcp://127.0.0.1:port") into url; returns 0 or -1. */
int h_server_url(pid_t server, char *url, size_t len, int timeout_ms);

#endif
