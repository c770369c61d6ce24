/* Jobs configured the way ps-lite (DMLC_*) and MindSpore (MS_*) launch scripts do it: the same
 * training program is started in every role, cps_open() runs the scheduler or server role and
 * exits 0 when the job ends. Also: conflicting variables are refused naming both, and a
 * scheduler whose nodes never all arrive gives up after --join-timeout instead of hanging. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "cluster.h"

#define JOB_MS 60000

/* Start lsq_worker once per role: the role variable `role_var`, the scheduler port in `port_var`
 * and `vars` (NAME=value, NULL-terminated). Each server runs in its own working directory (the
 * default data dir is ./chainps-data, and ps-lite scripts set nothing else). Returns 1 when the
 * scheduler could not listen (the port was taken meanwhile: try again), else checks that every
 * process exits 0 and returns 0. */
static int try_job(const char *tag, const char *role_var, const char *port_var,
                   const char *const values[3], char *const vars[])
{
    const char *roles[5] = {values[0], values[1], values[1], values[2], values[2]};
    char *argv[] = {LSQ_BIN, "--tol", "1e-3", NULL};
    pid_t pids[5];
    int rc = h_start_role_job(tag, role_var, roles, port_var, vars, argv, 0, JOB_MS, pids);
    assert_int_not_equal(rc, -1);
    if (rc == 1)
        return 1;
    for (int i = 3; i < 5; i++) {
        assert_true(h_wait_exit(pids[i], JOB_MS, NULL));
        if (h_exit_code(pids[i]) != 0)
            h_wait_log(pids[i], "final: rank", 1, 0); /* prints the log */
        assert_int_equal(h_exit_code(pids[i]), 0);
        assert_int_equal(h_log_count(pids[i], "final: rank"), 1);
    }
    /* The scheduler role ends the job when both workers said BYE; servers follow. */
    for (int i = 0; i < 3; i++) {
        assert_true(h_wait_exit(pids[i], 15000, NULL));
        assert_int_equal(h_exit_code(pids[i]), 0);
    }
    assert_int_equal(h_log_count(pids[0], "all workers finished"), 1);
    assert_int_equal(h_log_count(pids[1], "the scheduler ended the job"), 1);
    return 0;
}

static void run_job(const char *tag, const char *role_var, const char *port_var,
                    const char *const values[3], char *const vars[])
{
    /* Each attempt has its own logs and dirs: a retry must not read the last one's lines. */
    char name[32];
    for (int attempt = 0;; attempt++) {
        assert_true(attempt < 3);
        snprintf(name, sizeof name, "%s%d", tag, attempt);
        if (try_job(name, role_var, port_var, values, vars) == 0)
            break;
    }
}

static void test_pslite_vars(void **state)
{
    (void)state;
    /* CHAINPS_BIND: a ps-lite scheduler binds every interface; tests stay on loopback. */
    char *vars[] = {"DMLC_PS_ROOT_URI=" H_HOST, "DMLC_NUM_SERVER=2", "DMLC_NUM_WORKER=2",
                    "CHAINPS_BIND=" H_HOST, NULL};
    const char *const values[3] = {"scheduler", "server", "worker"};
    run_job("dmlc", "DMLC_ROLE", "DMLC_PS_ROOT_PORT", values, vars);
}

static void test_mindspore_vars(void **state)
{
    (void)state;
    char *vars[] = {"MS_SCHED_HOST=" H_HOST, "MS_SERVER_NUM=2", "MS_WORKER_NUM=2",
                    "CHAINPS_BIND=" H_HOST, NULL};
    const char *const values[3] = {"MS_SCHED", "MS_PSERVER", "MS_WORKER"};
    run_job("ms", "MS_ROLE", "MS_SCHED_PORT", values, vars);
}

static void test_conflicting_role(void **state)
{
    (void)state;
    char *env[] = {"CHAINPS_ROLE=worker", "DMLC_ROLE=server", "CHAINPS_SCHEDULER=" H_HOST ":1",
                   NULL};
    char *argv[] = {LSQ_BIN, NULL};
    pid_t pid;
    int code = h_run("conflict", argv, env, 10000, &pid);
    assert_true(code != 0 && code != -1000);
    char *log = h_read_log(pid);
    /* One line names both variables, so the user sees which two disagree. */
    const char *line = strstr(log, "CHAINPS_ROLE");
    assert_non_null(line);
    const char *eol = strchr(line, '\n');
    const char *other = strstr(line, "DMLC_ROLE");
    assert_non_null(other);
    assert_true(!eol || other < eol);
    free(log);
}

static void test_join_timeout(void **state)
{
    (void)state;
    h_cluster c;
    memset(&c, 0, sizeof c);
    const char *extra[] = {"--join-timeout", "2", NULL};
    assert_int_equal(h_start_scheduler(&c, 1, 2, "sync", extra), 0);
    assert_true(h_start_server(&c, 0) > 0);
    char sched[96];
    snprintf(sched, sizeof sched, "CHAINPS_SCHEDULER=%s", c.sched_addr);
    char *env[] = {"CHAINPS_ROLE=worker", sched, "CHAINPS_NUM_SERVERS=1", "CHAINPS_NUM_WORKERS=2",
                   NULL};
    char *argv[] = {LSQ_BIN, NULL};
    pid_t w = h_spawn("lonely-worker", argv, env, NULL);
    assert_true(w > 0);
    uint64_t t0 = h_now_ms();
    assert_true(h_wait_exit(c.sched, 15000, NULL));
    assert_true(h_now_ms() - t0 < 10000);
    assert_int_equal(h_exit_code(c.sched), 1);
    assert_int_equal(h_log_count(c.sched, "1 of 2 workers arrived within 2.0 s; giving up"), 1);
    /* The nodes that did arrive are told the job is off instead of waiting a minute. */
    assert_true(h_wait_exit(c.servers[0], 10000, NULL));
    assert_true(h_wait_exit(w, 10000, NULL));
    assert_true(h_exit_code(w) != 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        H_TEST(test_pslite_vars, "env", 60),
        H_TEST(test_mindspore_vars, "env", 60),
        H_TEST(test_conflicting_role, "env", 60),
        H_TEST(test_join_timeout, "env", 60),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
