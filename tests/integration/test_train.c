/* End-to-end training: `chainps launch` with 2 servers and 2 lsq_worker workers must recover the
 * true least-squares weights in sync, async and bounded-staleness mode; in sync mode the result
 * is deterministic (both workers and two whole runs end with bitwise the same weights). Also the
 * worker's snappy backoff on gradients that do not compress. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cluster.h"

#define JOB_TIMEOUT_MS 60000

typedef struct run_result {
    int exit_code;
    int nfinal;
    double err[2];
    char checksum[2][32];
    char trajectory[2][32]; /* "-" outside sync mode */
} run_result;

/* Run one launch job and collect each worker's "final:" line. */
static void run_job(const char *name, const char *mode, run_result *r)
{
    memset(r, 0, sizeof *r);
    const char *argv[] = {CHAINPS_BIN, "launch", "--servers", "2",         "--workers",
                          "2",         "--mode", mode,        "--timeout", "50",
                          "--",        LSQ_BIN,  "--tol",     "1e-3",      NULL};
    pid_t pid;
    r->exit_code = h_run(name, (char *const *)argv, NULL, JOB_TIMEOUT_MS, &pid);
    char *log = h_read_log(pid);
    for (const char *p = log; (p = strstr(p, "final: rank ")) != NULL; p++) {
        int rank;
        double err;
        char sum[32], traj[32];
        if (sscanf(p, "final: rank %d max |w - w*| = %lf, trajectory %31[^,], checksum %31s", &rank,
                   &err, traj, sum) == 4 &&
            rank >= 0 && rank < 2) {
            r->err[rank] = err;
            snprintf(r->checksum[rank], sizeof r->checksum[rank], "%s", sum);
            snprintf(r->trajectory[rank], sizeof r->trajectory[rank], "%s", traj);
            r->nfinal++;
        }
    }
    if (r->exit_code != 0 || r->nfinal != 2)
        fprintf(stderr, "---- %s ----\n%s\n", name, log);
    free(log);
}

static void check_trained(const run_result *r)
{
    assert_int_equal(r->exit_code, 0);
    assert_int_equal(r->nfinal, 2);
    for (int i = 0; i < 2; i++)
        assert_true(r->err[i] <= 1e-3);
}

static void test_sync_deterministic(void **state)
{
    (void)state;
    run_result a, b;
    run_job("launch-sync-1", "sync", &a);
    check_trained(&a);
    /* Sync SGD applies one aggregate per step, summed in rank order: both workers pull the same
     * bits, and a rerun from the same start computes the same bits again. */
    assert_string_equal(a.checksum[0], a.checksum[1]);
    /* So does every step's pull before the last (the trajectory hash: 16 hex digits). */
    assert_int_equal(strlen(a.trajectory[0]), 16);
    assert_string_equal(a.trajectory[0], a.trajectory[1]);
    run_job("launch-sync-2", "sync", &b);
    check_trained(&b);
    assert_string_equal(b.checksum[0], b.checksum[1]);
    assert_string_equal(a.checksum[0], b.checksum[0]);
    assert_string_equal(b.trajectory[0], b.trajectory[1]);
    assert_string_equal(a.trajectory[0], b.trajectory[0]);
}

static void test_async(void **state)
{
    (void)state;
    run_result r;
    run_job("launch-async", "async", &r);
    check_trained(&r);
    /* Pushes apply in arrival order: no trajectory to compare with another run's. */
    assert_string_equal(r.trajectory[0], "-");
    assert_string_equal(r.trajectory[1], "-");
}

static void test_ssp(void **state)
{
    (void)state;
    run_result r;
    run_job("launch-ssp2", "ssp:2", &r);
    check_trained(&r);
    assert_string_equal(r.trajectory[0], "-");
}

/* The same job with every process started on its own (no launch): scheduler, two servers with
 * their data dirs, two workers with CHAINPS_* variables. */
static void test_separate_processes(void **state)
{
    (void)state;
    h_cluster c;
    assert_int_equal(h_start_cluster(&c, 2, 2, "sync"), 0);
    char sched[96];
    snprintf(sched, sizeof sched, "CHAINPS_SCHEDULER=%s", c.sched_addr);
    pid_t w[2];
    for (int i = 0; i < 2; i++) {
        char rank[32], name[32];
        snprintf(rank, sizeof rank, "CHAINPS_RANK=%d", i);
        snprintf(name, sizeof name, "worker-%d", i);
        char *env[] = {"CHAINPS_ROLE=worker",   sched, "CHAINPS_NUM_SERVERS=2",
                       "CHAINPS_NUM_WORKERS=2", rank,  NULL};
        char *argv[] = {LSQ_BIN, "--tol", "1e-3", NULL};
        w[i] = h_spawn(name, argv, env, NULL);
        assert_true(w[i] > 0);
    }
    for (int i = 0; i < 2; i++) {
        assert_true(h_wait_exit(w[i], JOB_TIMEOUT_MS, NULL));
        assert_int_equal(h_exit_code(w[i]), 0);
        assert_int_equal(h_log_count(w[i], "final: rank"), 1);
    }
    /* Every worker said BYE: the scheduler ends the job and the servers exit cleanly. */
    assert_true(h_wait_exit(c.sched, 15000, NULL));
    assert_int_equal(h_exit_code(c.sched), 0);
    for (int i = 0; i < 2; i++) {
        assert_true(h_wait_exit(c.servers[i], 15000, NULL));
        assert_int_equal(h_exit_code(c.servers[i]), 0);
    }
}

/* ssp:2 with rank 1 sleeping 10 ms a step and rank 0 not at all: push-pulls hold rank 0 within 2
 * steps of rank 1, so its own 150 steps take about as long as rank 1's (1.5 s), not the few
 * milliseconds they take unbounded; both still end trained. */
static void test_ssp_bound_holds_push_pull(void **state)
{
    (void)state;
    run_result r;
    const char *argv[] = {CHAINPS_BIN, "launch", "--servers", "2",  "--workers",   "2",
                          "--mode",    "ssp:2",  "--timeout", "50", "--",          LSQ_BIN,
                          "--steps",   "150",    "--step-ms", "10", "--slow-rank", "1",
                          "--tol",     "1e-2",   NULL};
    pid_t pid;
    memset(&r, 0, sizeof r);
    r.exit_code = h_run("launch-ssp-slow", (char *const *)argv, NULL, JOB_TIMEOUT_MS, &pid);
    char *log = h_read_log(pid);
    double fast = -1, slow = -1;
    for (const char *p = log; (p = strstr(p, "[worker ")) != NULL; p++) {
        int rank, n;
        double secs;
        if (sscanf(p, "[worker %d] trained %d steps in %lf s", &rank, &n, &secs) == 3)
            *(rank == 0 ? &fast : &slow) = secs;
    }
    if (r.exit_code != 0 || fast < 0 || slow < 0 || fast < 0.8 * slow)
        fprintf(stderr, "---- launch-ssp-slow ----\n%s\n", log);
    free(log);
    assert_int_equal(r.exit_code, 0);
    assert_true(slow >= 1.4);
    assert_true(fast >= 0.8 * slow);
}

static pid_t spawn_lsq_mode(const h_cluster *c, int rank, const char *name, const char *steps,
                            const char *mode)
{
    char sched[96], rk[32], md[48];
    snprintf(sched, sizeof sched, "CHAINPS_SCHEDULER=%s", c->sched_addr);
    snprintf(rk, sizeof rk, "CHAINPS_RANK=%d", rank);
    snprintf(md, sizeof md, "CHAINPS_MODE=%s", mode);
    char *env[] = {"CHAINPS_ROLE=worker",
                   sched,
                   "CHAINPS_NUM_SERVERS=2",
                   "CHAINPS_NUM_WORKERS=2",
                   rk,
                   md,
                   NULL};
    char *argv[] = {LSQ_BIN, "--steps", (char *)steps, "--step-ms", "2", "--tol", "1e-3", NULL};
    return h_spawn(name, argv, env, NULL);
}

static pid_t spawn_lsq(const h_cluster *c, int rank, const char *name, const char *steps)
{
    return spawn_lsq_mode(c, rank, name, steps, "ssp:2");
}

/* The checksum of a worker's "final:" line into sum (""): compared across workers. */
static void final_checksum(pid_t w, char *sum, size_t len)
{
    char *log = h_read_log(w);
    const char *p = strstr(log, "checksum ");
    snprintf(sum, len, "%.16s", p ? p + strlen("checksum ") : "");
    free(log);
}

/* A worker killed near the end of a job, and its replacement started only after the other worker
 * finished (as `chainps launch --restart-workers` does when the kill comes late): with
 * --await-replacements the scheduler keeps the job open for it, so the replacement finishes too,
 * and then the job ends. Without it the job ended under the replacement, which then waited for
 * servers that were gone until launch's --timeout (issue 12: the replaced worker that hung the
 * job). It joins where the job got to (sync: the last step; ssp: the finished worker's clock, not
 * 0, which would train the whole job again on its shard alone), so it has nothing left to push
 * and pulls what rank 0 pulled. */
static void replacement_after_the_others_finished(const char *mode)
{
    h_cluster c;
    char *fast_death[] = {"CHAINPS_WORKER_DEAD_AFTER_MS=1000", NULL};
    const char *extra[] = {"--await-replacements", NULL};
    assert_int_equal(h_start_scheduler_env(&c, 2, 2, mode, extra, fast_death), 0);
    for (int i = 0; i < 2; i++)
        assert_true(h_start_server(&c, i) > 0);
    pid_t w0 = spawn_lsq_mode(&c, 0, "worker-0", "800", mode);
    pid_t w1 = spawn_lsq_mode(&c, 1, "worker-1", "800", mode);
    assert_true(w0 > 0 && w1 > 0);
    assert_true(h_wait_log(c.sched, "connected 2 workers", 1, 30000));
    usleep(200 * 1000);
    h_kill_hard(w1);
    /* Rank 0 goes on alone (sync: once rank 1 is declared dead), and finishes. */
    assert_true(h_wait_exit(w0, JOB_TIMEOUT_MS, NULL));
    assert_int_equal(h_exit_code(w0), 0);
    assert_int_equal(h_log_count(w0, "final: rank 0"), 1);
    assert_true(
        h_wait_log(c.sched, "stays open for the worker that takes dead rank 1's place", 1, 5000));
    assert_true(h_alive(c.sched));
    pid_t w2 = spawn_lsq_mode(&c, 1, "worker-1b", "800", mode);
    assert_true(w2 > 0);
    assert_true(h_wait_exit(w2, JOB_TIMEOUT_MS, NULL));
    if (h_exit_code(w2) != 0 || h_log_count(w2, "resuming at step 800") != 1) {
        char *log = h_read_log(w2);
        fprintf(stderr, "---- worker-1b ----\n%s\n", log);
        free(log);
    }
    assert_int_equal(h_exit_code(w2), 0);
    assert_int_equal(h_log_count(w2, "final: rank 1"), 1);
    assert_int_equal(h_log_count(w2, "resuming at step 800"), 1);
    char s0[32], s2[32];
    final_checksum(w0, s0, sizeof s0);
    final_checksum(w2, s2, sizeof s2);
    assert_true(s0[0] != 0);
    assert_string_equal(s0, s2);
    /* Then the job ends by itself. */
    assert_true(h_wait_log(c.sched, "ending the job", 1, 10000));
    assert_true(h_wait_exit(c.sched, 15000, NULL));
    assert_int_equal(h_exit_code(c.sched), 0);
}

static void test_sync_replacement_after_the_others_finished(void **state)
{
    (void)state;
    replacement_after_the_others_finished("sync");
}

static void test_ssp_replacement_after_the_others_finished(void **state)
{
    (void)state;
    replacement_after_the_others_finished("ssp:2");
}

/* Bounded staleness with a worker killed and another started in its place: the newcomer starts
 * at the clock of the slowest worker still running (not at step 0, which would hold the other
 * worker's pulls back until it had pushed its way up alone), and both finish trained. */
static void test_ssp_worker_replaced(void **state)
{
    (void)state;
    h_cluster c;
    char *fast_death[] = {"CHAINPS_WORKER_DEAD_AFTER_MS=1000", NULL};
    assert_int_equal(h_start_scheduler_env(&c, 2, 2, "ssp:2", NULL, fast_death), 0);
    for (int i = 0; i < 2; i++)
        assert_true(h_start_server(&c, i) > 0);
    /* Every worker runs the same number of steps: under a staleness bound a worker that has
     * stopped pushing (here: waiting in the final barrier) holds the others at its clock + N. */
    pid_t w0 = spawn_lsq(&c, 0, "worker-0", "2000");
    pid_t w1 = spawn_lsq(&c, 1, "worker-1", "2000");
    assert_true(w0 > 0 && w1 > 0);
    assert_true(h_wait_log(c.sched, "connected 2 workers", 1, 30000));
    usleep(1000 * 1000); /* a few hundred steps in */
    h_kill_hard(w1);
    assert_true(h_wait_log(c.sched, "(a worker died)", 1, 15000));
    pid_t w2 = spawn_lsq(&c, 1, "worker-1b", "2000");
    assert_true(w2 > 0);
    assert_true(h_wait_exit(w2, JOB_TIMEOUT_MS, NULL));
    assert_true(h_wait_exit(w0, JOB_TIMEOUT_MS, NULL));
    char *log = h_read_log(w2);
    int first = 0;
    const char *p = strstr(log, "resuming at step ");
    if (p)
        first = atoi(p + strlen("resuming at step "));
    if (!p || first < 50 || h_exit_code(w2) != 0 || h_exit_code(w0) != 0) {
        fprintf(stderr, "---- worker-1b ----\n%s\n", log);
        char *sl = h_read_log(c.sched);
        fprintf(stderr, "---- scheduler ----\n%s\n", sl);
        free(sl);
    }
    free(log);
    assert_non_null(p);
    assert_true(first >= 50);
    assert_int_equal(h_exit_code(w0), 0);
    assert_int_equal(h_exit_code(w2), 0);
    assert_int_equal(h_log_count(w0, "final: rank 0"), 1);
    assert_int_equal(h_log_count(w2, "final: rank 1"), 1);
}

/* The bytes one push of t put on the wire, and the float bytes it carried. */
static void push_bytes(cps_client *c, cps_tensor *t, const float *g, uint64_t n, uint64_t *wire,
                       uint64_t *raw)
{
    cps_client_stats s0, s1;
    cps_client_stats_get(c, &s0);
    assert_int_equal(cps_push(c, t, g, n), 0);
    cps_client_stats_get(c, &s1);
    *wire = s1.push_wire_bytes - s0.push_wire_bytes;
    *raw = s1.push_raw_bytes - s0.push_raw_bytes;
}

/* Snappy on pushes backs off on incompressible gradients and comes back: a gradient of zeros is
 * compressed on every push; after pushes of float noise (which snappy cannot shrink) the worker
 * stops trying for a while (a compressible push right after goes out whole), and after at most
 * 64 pushes sent whole it compresses again. */
static void test_snappy_backs_off(void **state)
{
    (void)state;
    h_cluster cl;
    assert_int_equal(h_start_cluster(&cl, 1, 1, "async"), 0);
    h_become_worker(cl.sched_addr, 1, 1);
    cps_client *c = NULL;
    assert_int_equal(cps_open(&c), 0);
    enum { N = 65536 };
    float *zeros = calloc(N, sizeof *zeros), *noise = malloc(N * sizeof *noise);
    assert_non_null(zeros);
    assert_non_null(noise);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < N; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        noise[i] = (float)(x >> 40) * 1e-7f - 0.8f;
    }
    cps_optim opt = cps_optim_sgd(1e-3f);
    cps_tensor *t = NULL;
    assert_int_equal(cps_tensor_declare(c, "zip/w", N, NULL, &opt, &t), 0);
    uint64_t wire, raw;
    for (int i = 0; i < 10; i++) {
        push_bytes(c, t, zeros, N, &wire, &raw);
        assert_true(wire * 10 < raw); /* zeros: every push compressed */
    }
    for (int i = 0; i < 20; i++) {
        push_bytes(c, t, noise, N, &wire, &raw);
        assert_true(wire >= raw); /* noise: never smaller */
    }
    push_bytes(c, t, zeros, N, &wire, &raw);
    assert_true(wire >= raw); /* backing off: not even tried */
    int whole = 1;
    while (wire >= raw) {
        assert_true(++whole <= 65); /* at most 64 pushes skip the attempt */
        push_bytes(c, t, zeros, N, &wire, &raw);
    }
    assert_true(wire * 10 < raw);
    free(zeros);
    free(noise);
    assert_int_equal(cps_close(c), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        H_TEST(test_sync_deterministic, "train", 60),
        H_TEST(test_async, "train", 60),
        H_TEST(test_ssp, "train", 60),
        H_TEST(test_separate_processes, "train", 60),
        H_TEST(test_ssp_worker_replaced, "train", 60),
        H_TEST(test_sync_replacement_after_the_others_finished, "train", 60),
        H_TEST(test_ssp_replacement_after_the_others_finished, "train", 60),
        H_TEST(test_ssp_bound_holds_push_pull, "train", 60),
        H_TEST(test_snappy_backs_off, "train", 60),
    };
    if (getenv("CPS_TEST_FILTER"))
        cmocka_set_test_filter(getenv("CPS_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
