/* Config: defaults, environment aliases and conflicts, parse helpers, export round trip.
 * Every test starts from an environment with none of the variables set and the log level at its
 * default, and the group teardown puts back whatever the process started with. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "core/config.h"
#include "core/log.h"

static const char *const VARS[] = {
    "CHAINPS_ROLE",
    "DMLC_ROLE",
    "MS_ROLE",
    "CHAINPS_SCHEDULER",
    "DMLC_PS_ROOT_URI",
    "DMLC_PS_ROOT_PORT",
    "MS_SCHED_HOST",
    "MS_SCHED_PORT",
    "CHAINPS_NUM_SERVERS",
    "DMLC_NUM_SERVER",
    "MS_SERVER_NUM",
    "CHAINPS_NUM_WORKERS",
    "DMLC_NUM_WORKER",
    "MS_WORKER_NUM",
    "CHAINPS_DATA_DIR",
    "CHAINPS_VERBOSE",
    "PS_VERBOSE",
    "CHAINPS_MODE",
    "CHAINPS_BACKUP_WORKERS",
    "CHAINPS_REPLICAS",
    "CHAINPS_RANK",
    "CHAINPS_BIND",
    "CHAINPS_ADVERTISE",
    "DMLC_NODE_HOST",
    "CHAINPS_PORT",
    "CHAINPS_JOIN_TIMEOUT_MS",
    "CHAINPS_REQUEST_TIMEOUT_MS",
    "CHAINPS_SCHEDULER_TIMEOUT_MS",
    "CHAINPS_MAX_TENSOR_MB",
    "CHAINPS_COMPRESS",
    "CHAINPS_SYNC",
};
#define NVARS (sizeof VARS / sizeof VARS[0])

static char *saved[NVARS];

static void clear_env(void)
{
    for (size_t i = 0; i < NVARS; i++)
        unsetenv(VARS[i]);
}

static int group_setup(void **state)
{
    (void)state;
    for (size_t i = 0; i < NVARS; i++) {
        const char *v = getenv(VARS[i]);
        saved[i] = v ? strdup(v) : NULL;
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    clear_env();
    for (size_t i = 0; i < NVARS; i++) {
        if (saved[i])
            setenv(VARS[i], saved[i], 1);
        free(saved[i]);
    }
    cps__log_set_level(CPS_LOG_INFO);
    return 0;
}

static int each_setup(void **state)
{
    (void)state;
    clear_env();
    cps__log_set_level(CPS_LOG_INFO);
    return 0;
}

static int each_teardown(void **state)
{
    (void)state;
    clear_env();
    cps__log_set_level(CPS_LOG_INFO);
    return 0;
}

/* Load the environment over defaults; returns the status and leaves the message in err. */
static int load(cps__config *c, char *err, size_t len)
{
    cps__config_defaults(c);
    return cps__config_from_env(c, err, len);
}

/* The message must mention every named variable. */
static void expect_error(const char *a, const char *b)
{
    cps__config c;
    char err[256] = "";
    assert_int_equal(load(&c, err, sizeof err), CPS_ECONFIG);
    if (!strstr(err, a) || (b && !strstr(err, b)))
        fail_msg("error '%s' should name %s%s%s", err, a, b ? " and " : "", b ? b : "");
}

/* A server's limit on an unreachable scheduler: milliseconds, at least 1, named when bad. */
static void scheduler_timeout_from_env(void **state)
{
    (void)state;
    cps__config c;
    char err[256];
    setenv("CHAINPS_SCHEDULER_TIMEOUT_MS", "2500", 1);
    assert_int_equal(load(&c, err, sizeof err), 0);
    assert_int_equal(c.scheduler_timeout_ms, 2500);
    setenv("CHAINPS_SCHEDULER_TIMEOUT_MS", "0", 1);
    expect_error("CHAINPS_SCHEDULER_TIMEOUT_MS", NULL);
    setenv("CHAINPS_SCHEDULER_TIMEOUT_MS", "5m", 1);
    expect_error("CHAINPS_SCHEDULER_TIMEOUT_MS", NULL);
    unsetenv("CHAINPS_SCHEDULER_TIMEOUT_MS");
    /* The largest tensor a worker declares, in MB: at least 1, named when bad. */
    setenv("CHAINPS_MAX_TENSOR_MB", "12", 1);
    assert_int_equal(load(&c, err, sizeof err), 0);
    assert_int_equal(c.max_tensor_mb, 12);
    setenv("CHAINPS_MAX_TENSOR_MB", "0", 1);
    expect_error("CHAINPS_MAX_TENSOR_MB", NULL);
    setenv("CHAINPS_MAX_TENSOR_MB", "1e3", 1);
    expect_error("CHAINPS_MAX_TENSOR_MB", NULL);
    unsetenv("CHAINPS_MAX_TENSOR_MB");
}

/* Field by field: struct copies need not preserve padding bytes. */
static void assert_same_config(const cps__config *a, const cps__config *b)
{
    assert_int_equal(a->role, b->role);
    assert_string_equal(a->sched_host, b->sched_host);
    assert_int_equal(a->sched_port, b->sched_port);
    assert_int_equal(a->num_servers, b->num_servers);
    assert_int_equal(a->num_workers, b->num_workers);
    assert_string_equal(a->data_dir, b->data_dir);
    assert_int_equal(a->verbose, b->verbose);
    assert_int_equal(a->mode, b->mode);
    assert_int_equal(a->ssp_bound, b->ssp_bound);
    assert_int_equal(a->replicas, b->replicas);
    assert_int_equal(a->rank, b->rank);
    assert_string_equal(a->bind_host, b->bind_host);
    assert_string_equal(a->advertise_host, b->advertise_host);
    assert_int_equal(a->port, b->port);
    assert_int_equal(a->join_timeout_ms, b->join_timeout_ms);
    assert_int_equal(a->request_timeout_ms, b->request_timeout_ms);
    assert_int_equal(a->compress, b->compress);
    assert_int_equal(a->grad_codec.kind, b->grad_codec.kind);
    assert_true(a->grad_codec.ratio == b->grad_codec.ratio);
    assert_int_equal(a->sync_every_commit, b->sync_every_commit);
}

static void defaults(void **state)
{
    (void)state;
    cps__config c;
    char err[128];
    assert_int_equal(load(&c, err, sizeof err), 0);
    assert_int_equal(c.role, CPS_ROLE_NONE);
    assert_string_equal(c.sched_host, "127.0.0.1");
    assert_int_equal(c.sched_port, 9091);
    assert_int_equal(c.num_servers, 0);
    assert_int_equal(c.num_workers, 0);
    assert_string_equal(c.data_dir, "./chainps-data");
    assert_int_equal(c.verbose, 0);
    assert_int_equal(c.mode, CPS_MODE_SYNC);
    assert_int_equal(c.ssp_bound, 0);
    assert_int_equal(c.replicas, 0);
    assert_int_equal(c.rank, UINT32_MAX);
    assert_string_equal(c.bind_host, "");
    assert_string_equal(c.advertise_host, "");
    assert_int_equal(c.port, 0);
    assert_int_equal(c.join_timeout_ms, 60000);
    assert_int_equal(c.request_timeout_ms, 5000);
    assert_int_equal(c.scheduler_timeout_ms, 300000);
    assert_int_equal(c.max_tensor_mb, 65536);
    assert_int_equal(c.compress, 1);
    assert_int_equal(c.sync_every_commit, 0);
    assert_int_equal(cps__log_level, CPS_LOG_INFO);
}

static void role_aliases(void **state)
{
    (void)state;
    static const struct {
        const char *var, *val;
        int role;
    } cases[] = {
        {"CHAINPS_ROLE", "scheduler", CPS_ROLE_SCHEDULER},
        {"CHAINPS_ROLE", "server", CPS_ROLE_SERVER},
        {"CHAINPS_ROLE", "worker", CPS_ROLE_WORKER},
        {"DMLC_ROLE", "scheduler", CPS_ROLE_SCHEDULER},
        {"DMLC_ROLE", "server", CPS_ROLE_SERVER},
        {"DMLC_ROLE", "worker", CPS_ROLE_WORKER},
        {"MS_ROLE", "MS_SCHED", CPS_ROLE_SCHEDULER},
        {"MS_ROLE", "MS_PSERVER", CPS_ROLE_SERVER},
        {"MS_ROLE", "MS_WORKER", CPS_ROLE_WORKER},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        clear_env();
        setenv(cases[i].var, cases[i].val, 1);
        cps__config c;
        char err[128];
        assert_int_equal(load(&c, err, sizeof err), 0);
        assert_int_equal(c.role, cases[i].role);
    }
}

/* ps-lite's semantics for a ps-lite job: DMLC_ROLE alone means async; a chainps or MindSpore
 * role, or CHAINPS_MODE, keeps the chainps default (sync) or what it says. The data directory
 * counts as given only when a variable or flag gives it. */
static void pslite_jobs_default_to_async(void **state)
{
    (void)state;
    cps__config c;
    char err[128];
    clear_env();
    setenv("DMLC_ROLE", "server", 1);
    assert_int_equal(load(&c, err, sizeof err), 0);
    assert_int_equal(c.mode, CPS_MODE_ASYNC);
    assert_int_equal(c.data_dir_given, 0);
    setenv("CHAINPS_MODE", "sync", 1);
    assert_int_equal(load(&c, err, sizeof err), 0);
    assert_int_equal(c.mode, CPS_MODE_SYNC);
    clear_env();
    setenv("DMLC_ROLE", "worker", 1);
    setenv("CHAINPS_ROLE", "worker", 1);
    assert_int_equal(load(&c, err, sizeof err), 0);
    assert_int_equal(c.mode, CPS_MODE_SYNC);
    clear_env();
    assert_int_equal(load(&c, err, sizeof err), 0);
    assert_int_equal(c.mode, CPS_MODE_SYNC);
    setenv("CHAINPS_DATA_DIR", "/tmp/x", 1);
    assert_int_equal(load(&c, err, sizeof err), 0);
    assert_int_equal(c.data_dir_given, 1);
    clear_env();
}

static void role_conflicts(void **state)
{
    (void)state;
    setenv("DMLC_ROLE", "server", 1);
    setenv("CHAINPS_ROLE", "worker", 1);
    expect_error("DMLC_ROLE", "CHAINPS_ROLE");

    clear_env();
    setenv("MS_ROLE", "MS_WORKER", 1);
    setenv("DMLC_ROLE", "scheduler", 1);
    expect_error("MS_ROLE", "DMLC_ROLE");

    /* Agreeing aliases in different spellings are fine. */
    clear_env();
    setenv("CHAINPS_ROLE", "server", 1);
    setenv("DMLC_ROLE", "server", 1);
    setenv("MS_ROLE", "MS_PSERVER", 1);
    cps__config c;
    char err[128];
    assert_int_equal(load(&c, err, sizeof err), 0);
    assert_int_equal(c.role, CPS_ROLE_SERVER);

    clear_env();
    setenv("DMLC_ROLE", "boss", 1);
    expect_error("DMLC_ROLE", "boss");
    clear_env();
    setenv("MS_ROLE", "MS_SERVER", 1);
    expect_error("MS_ROLE", NULL);
}

static void empty_value_is_unset(void **state)
{
    (void)state;
    setenv("CHAINPS_ROLE", "", 1);
    setenv("DMLC_ROLE", "worker", 1);
    setenv("CHAINPS_NUM_SERVERS", "", 1);
    cps__config c;
    char err[128];
    assert_int_equal(load(&c, err, sizeof err), 0);
    assert_int_equal(c.role, CPS_ROLE_WORKER);
    assert_int_equal(c.num_servers, 0);
}

static void scheduler_aliases(void **state)
{
    (void)state;
    cps__config c;
    char err[160];
    setenv("CHAINPS_SCHEDULER", "10.1.2.3:7000", 1);
    assert_int_equal(load(&c, err, sizeof err), 0);
    assert_string_equal(c.sched_host, "10.1.2.3");
    assert_int_equal(c.sched_port, 7000);

    clear_env();
    setenv("DMLC_PS_ROOT_URI", "10.0.0.9", 1);
    setenv("DMLC_PS_ROOT_PORT", "8000", 1);
    assert_int_equal(load(&c, err, sizeof err), 0);
    assert_string_equal(c.sched_host, "10.0.0.9");
    assert_int_equal(c.sched_port, 8000);

    clear_env();
    setenv("MS_SCHED_HOST", "sched.example", 1);
    setenv("MS_SCHED_PORT", "8118", 1);
    assert_int_equal(load(&c, err, sizeof err), 0);
    assert_string_equal(c.sched_host, "sched.example");
    assert_int_equal(c.sched_port, 8118);

    /* all three agreeing */
    setenv("CHAINPS_SCHEDULER", "sched.example:8118", 1);
    setenv("DMLC_PS_ROOT_URI", "sched.example", 1);
    setenv("DMLC_PS_ROOT_PORT", "8118", 1);
    assert_int_equal(load(&c, err, sizeof err), 0);
    assert_int_equal(c.sched_port, 8118);
}

static void scheduler_errors(void **state)
{
    (void)state;
    setenv("DMLC_PS_ROOT_URI", "10.0.0.9", 1);
    expect_error("DMLC_PS_ROOT_PORT", NULL);

    clear_env();
    setenv("DMLC_PS_ROOT_PORT", "8000", 1);
    expect_error("DMLC_PS_ROOT_URI", NULL);

    clear_env();
    setenv("MS_SCHED_HOST", "h", 1);
    expect_error("MS_SCHED_PORT", NULL);

    clear_env();
    setenv("MS_SCHED_PORT", "1", 1);
    expect_error("MS_SCHED_HOST", NULL);

    clear_env();
    setenv("DMLC_PS_ROOT_URI", "10.0.0.9", 1);
    setenv("DMLC_PS_ROOT_PORT", "http", 1);
    expect_error("DMLC_PS_ROOT_PORT", NULL);

    clear_env();
    setenv("MS_SCHED_HOST", "h", 1);
    setenv("MS_SCHED_PORT", "70000", 1);
    expect_error("MS_SCHED_PORT", NULL);

    clear_env();
    setenv("CHAINPS_SCHEDULER", "10.0.0.1:9000", 1);
    setenv("DMLC_PS_ROOT_URI", "10.0.0.2", 1);
    setenv("DMLC_PS_ROOT_PORT", "9000", 1);
    expect_error("CHAINPS_SCHEDULER", "DMLC_PS_ROOT_URI");

    clear_env();
    setenv("DMLC_PS_ROOT_URI", "10.0.0.1", 1);
    setenv("DMLC_PS_ROOT_PORT", "9000", 1);
    setenv("MS_SCHED_HOST", "10.0.0.1", 1);
    setenv("MS_SCHED_PORT", "9001", 1);
    expect_error("DMLC_PS_ROOT_PORT", "MS_SCHED_PORT");

    clear_env();
    setenv("CHAINPS_SCHEDULER", "10.0.0.1", 1);
    expect_error("CHAINPS_SCHEDULER", NULL);
}

typedef struct count_case {
    const char *var;
    uint32_t *(*field)(cps__config *);
} count_case;

static uint32_t *f_servers(cps__config *c)
{
    return &c->num_servers;
}
static uint32_t *f_workers(cps__config *c)
{
    return &c->num_workers;
}

static void counts(void **state)
{
    (void)state;
    static const count_case cases[] = {
        {"CHAINPS_NUM_SERVERS", f_servers}, {"DMLC_NUM_SERVER", f_servers},
        {"MS_SERVER_NUM", f_servers},       {"CHAINPS_NUM_WORKERS", f_workers},
        {"DMLC_NUM_WORKER", f_workers},     {"MS_WORKER_NUM", f_workers},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        clear_env();
        cps__config c;
        char err[128];
        setenv(cases[i].var, "7", 1);
        assert_int_equal(load(&c, err, sizeof err), 0);
        assert_int_equal(*cases[i].field(&c), 7);
        static const char *const bad[] = {"x",  "-1",   "0",           "4x",
                                          " 3", "1025", "99999999999", "0x10"};
        for (size_t j = 0; j < sizeof bad / sizeof bad[0]; j++) {
            setenv(cases[i].var, bad[j], 1);
            expect_error(cases[i].var, NULL);
        }
    }
    setenv("CHAINPS_NUM_SERVERS", "3", 1);
    setenv("DMLC_NUM_SERVER", "3", 1);
    setenv("MS_SERVER_NUM", "4", 1);
    expect_error("CHAINPS_NUM_SERVERS", "MS_SERVER_NUM");
    clear_env();
    setenv("DMLC_NUM_WORKER", "2", 1);
    setenv("CHAINPS_NUM_WORKERS", "5", 1);
    expect_error("CHAINPS_NUM_WORKERS", "DMLC_NUM_WORKER");
}

static void verbosity(void **state)
{
    (void)state;
    static const struct {
        const char *val;
        int level;
    } cases[] = {
        {"0", CPS_LOG_INFO}, {"1", CPS_LOG_INFO}, {"2", CPS_LOG_DEBUG}, {"3", CPS_LOG_DEBUG}};
    const char *vars[] = {"CHAINPS_VERBOSE", "PS_VERBOSE"};
    for (size_t v = 0; v < 2; v++) {
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            clear_env();
            cps__log_set_level(CPS_LOG_WARN);
            setenv(vars[v], cases[i].val, 1);
            cps__config c;
            char err[128];
            assert_int_equal(load(&c, err, sizeof err), 0);
            assert_int_equal(c.verbose, cases[i].val[0] - '0');
            assert_int_equal(cps__log_level, cases[i].level);
        }
        setenv(vars[v], "4", 1);
        expect_error(vars[v], NULL);
        setenv(vars[v], "loud", 1);
        expect_error(vars[v], NULL);
    }
    /* Unset verbosity leaves the log level alone. */
    clear_env();
    cps__log_set_level(CPS_LOG_WARN);
    cps__config c;
    char err[128];
    assert_int_equal(load(&c, err, sizeof err), 0);
    assert_int_equal(cps__log_level, CPS_LOG_WARN);

    setenv("CHAINPS_VERBOSE", "2", 1);
    setenv("PS_VERBOSE", "1", 1);
    expect_error("CHAINPS_VERBOSE", "PS_VERBOSE");
    assert_int_equal(cps__log_level, CPS_LOG_WARN); /* a failed load changes nothing */
}

static void single_variables(void **state)
{
    (void)state;
    cps__config c;
    char err[160];
    setenv("CHAINPS_DATA_DIR", "/tmp/cps data", 1);
    setenv("CHAINPS_MODE", "ssp:4", 1);
    setenv("CHAINPS_REPLICAS", "2", 1);
    setenv("CHAINPS_RANK", "0", 1);
    setenv("CHAINPS_BIND", "0.0.0.0", 1);
    setenv("CHAINPS_ADVERTISE", "node-7.cluster", 1);
    setenv("CHAINPS_PORT", "0", 1);
    setenv("CHAINPS_JOIN_TIMEOUT_MS", "1500", 1);
    setenv("CHAINPS_REQUEST_TIMEOUT_MS", "250", 1);
    setenv("CHAINPS_COMPRESS", "0", 1);
    setenv("CHAINPS_SYNC", "1", 1);
    assert_int_equal(load(&c, err, sizeof err), 0);
    assert_string_equal(c.data_dir, "/tmp/cps data");
    assert_int_equal(c.mode, CPS_MODE_SSP);
    assert_int_equal(c.ssp_bound, 4);
    assert_int_equal(c.replicas, 2);
    assert_int_equal(c.rank, 0);
    assert_string_equal(c.bind_host, "0.0.0.0");
    assert_string_equal(c.advertise_host, "node-7.cluster");
    assert_int_equal(c.port, 0);
    assert_int_equal(c.join_timeout_ms, 1500);
    assert_int_equal(c.request_timeout_ms, 250);
    assert_int_equal(c.compress, 0);
    assert_int_equal(c.sync_every_commit, 1);

    setenv("CHAINPS_PORT", "65535", 1);
    setenv("CHAINPS_MODE", "async", 1);
    assert_int_equal(load(&c, err, sizeof err), 0);
    assert_int_equal(c.port, 65535);
    assert_int_equal(c.mode, CPS_MODE_ASYNC);

    clear_env();
    setenv("DMLC_NODE_HOST", "10.9.8.7", 1);
    assert_int_equal(load(&c, err, sizeof err), 0);
    assert_string_equal(c.advertise_host, "10.9.8.7");
    setenv("CHAINPS_ADVERTISE", "10.9.8.7", 1);
    assert_int_equal(load(&c, err, sizeof err), 0);
    setenv("CHAINPS_ADVERTISE", "10.9.8.6", 1);
    expect_error("CHAINPS_ADVERTISE", "DMLC_NODE_HOST");
}

static void bad_single_values(void **state)
{
    (void)state;
    static const struct {
        const char *var, *val;
    } cases[] = {
        {"CHAINPS_MODE", "fast"},
        {"CHAINPS_MODE", "ssp:"},
        {"CHAINPS_REPLICAS", "0"},
        {"CHAINPS_REPLICAS", "9"},
        {"CHAINPS_REPLICAS", "two"},
        {"CHAINPS_RANK", "-1"},
        {"CHAINPS_RANK", "1024"},
        {"CHAINPS_BIND", "0.0.0.0:80"},
        {"CHAINPS_BIND", "a b"},
        {"CHAINPS_ADVERTISE", "tcp://x"},
        {"DMLC_NODE_HOST", "h/1"},
        {"CHAINPS_PORT", "65536"},
        {"CHAINPS_PORT", "p"},
        {"CHAINPS_JOIN_TIMEOUT_MS", "0"},
        {"CHAINPS_JOIN_TIMEOUT_MS", "1s"},
        {"CHAINPS_REQUEST_TIMEOUT_MS", "0"},
        {"CHAINPS_REQUEST_TIMEOUT_MS", "86400001"},
        {"CHAINPS_COMPRESS", "yes"},
        {"CHAINPS_COMPRESS", "2"},
        {"CHAINPS_SYNC", "true"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        clear_env();
        setenv(cases[i].var, cases[i].val, 1);
        expect_error(cases[i].var, NULL);
    }
    clear_env();
    char longdir[600];
    memset(longdir, 'd', sizeof longdir - 1);
    longdir[sizeof longdir - 1] = '\0';
    setenv("CHAINPS_DATA_DIR", longdir, 1);
    expect_error("CHAINPS_DATA_DIR", NULL);
}

static void failure_leaves_config_untouched(void **state)
{
    (void)state;
    cps__config c, before;
    char err[128];
    cps__config_defaults(&c);
    setenv("CHAINPS_NUM_WORKERS", "4", 1);
    setenv("CHAINPS_SYNC", "maybe", 1);
    before = c;
    assert_int_equal(cps__config_from_env(&c, err, sizeof err), CPS_ECONFIG);
    assert_same_config(&c, &before);
    /* NULL / zero-size error buffers are allowed */
    assert_int_equal(cps__config_from_env(&c, NULL, 0), CPS_ECONFIG);
    /* a short buffer is truncated, still terminated */
    char tiny[8];
    assert_int_equal(cps__config_from_env(&c, tiny, sizeof tiny), CPS_ECONFIG);
    assert_true(strlen(tiny) < sizeof tiny);
}

static void hostport(void **state)
{
    (void)state;
    char host[CPS_ADDR_MAX], err[160];
    uint16_t port = 0;
    assert_int_equal(
        cps__config_parse_hostport("X", "127.0.0.1:9091", host, &port, err, sizeof err), 0);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 9091);
    assert_int_equal(cps__config_parse_hostport("X", "a-b.c_d:1", host, &port, err, sizeof err), 0);
    assert_string_equal(host, "a-b.c_d");
    assert_int_equal(port, 1);
    assert_int_equal(cps__config_parse_hostport("X", "h:65535", host, &port, err, sizeof err), 0);
    assert_int_equal(port, 65535);

    static const char *const bad[] = {
        "127.0.0.1", "127.0.0.1:", ":80", "h:0",    "h:65536", "h:junk",    "h:80x",
        "h:-1",      "h: 80",      "",    "::1:80", "a b:1",   "tcp://h:1",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        strcpy(host, "unchanged");
        if (cps__config_parse_hostport("THE_VAR", bad[i], host, &port, err, sizeof err) !=
            CPS_ECONFIG)
            fail_msg("'%s' accepted", bad[i]);
        assert_non_null(strstr(err, "THE_VAR"));
        assert_string_equal(host, "unchanged");
    }
    assert_int_equal(cps__config_parse_hostport("X", NULL, host, &port, err, sizeof err),
                     CPS_ECONFIG);
    char big[CPS_ADDR_MAX + 10];
    memset(big, 'h', sizeof big);
    strcpy(big + CPS_ADDR_MAX, ":80");
    assert_int_equal(cps__config_parse_hostport("X", big, host, &port, err, sizeof err),
                     CPS_ECONFIG);
}

static void mode(void **state)
{
    (void)state;
    uint32_t m = 99, b = 99;
    char err[128], buf[32];
    assert_int_equal(cps__config_parse_mode("M", "sync", &m, &b, err, sizeof err), 0);
    assert_int_equal(m, CPS_MODE_SYNC);
    assert_int_equal(b, 0);
    assert_int_equal(cps__config_parse_mode("M", "async", &m, &b, err, sizeof err), 0);
    assert_int_equal(m, CPS_MODE_ASYNC);
    assert_int_equal(cps__config_parse_mode("M", "ssp:3", &m, &b, err, sizeof err), 0);
    assert_int_equal(m, CPS_MODE_SSP);
    assert_int_equal(b, 3);
    assert_string_equal(cps__config_mode_str(m, b, buf, sizeof buf), "ssp:3");
    assert_int_equal(cps__config_parse_mode("M", "ssp:0", &m, &b, err, sizeof err), 0);
    assert_int_equal(b, 0);
    assert_int_equal(cps__config_parse_mode("M", "ssp:1000000", &m, &b, err, sizeof err), 0);
    assert_int_equal(b, 1000000);
    assert_string_equal(cps__config_mode_str(CPS_MODE_SYNC, 0, buf, sizeof buf), "sync");
    assert_string_equal(cps__config_mode_str(CPS_MODE_ASYNC, 0, buf, sizeof buf), "async");

    static const char *const bad[] = {"ssp:", "ssp:x", "ssp:-1", "ssp:1000001", "SYNC",
                                      "ssp",  "sync ", "",       "ssp:3:4"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        m = b = 77;
        err[0] = '\0';
        if (cps__config_parse_mode("MODE_VAR", bad[i], &m, &b, err, sizeof err) != CPS_ECONFIG)
            fail_msg("'%s' accepted", bad[i]);
        assert_non_null(strstr(err, "MODE_VAR"));
        assert_int_equal(m, 77);
        assert_int_equal(b, 77);
    }
    assert_int_equal(cps__config_parse_mode("M", NULL, &m, &b, err, sizeof err), CPS_ECONFIG);
}

static void role_strings(void **state)
{
    (void)state;
    int r = -1;
    char err[128];
    assert_string_equal(cps__config_role_str(CPS_ROLE_SCHEDULER), "scheduler");
    assert_string_equal(cps__config_role_str(CPS_ROLE_SERVER), "server");
    assert_string_equal(cps__config_role_str(CPS_ROLE_WORKER), "worker");
    assert_string_equal(cps__config_role_str(CPS_ROLE_NONE), "none");
    assert_string_equal(cps__config_role_str(42), "none");
    for (int role = CPS_ROLE_SCHEDULER; role <= CPS_ROLE_WORKER; role++) {
        assert_int_equal(
            cps__config_parse_role("R", cps__config_role_str(role), &r, err, sizeof err), 0);
        assert_int_equal(r, role);
    }
    assert_int_equal(cps__config_parse_role("ROLE_VAR", "Server", &r, err, sizeof err),
                     CPS_ECONFIG);
    assert_non_null(strstr(err, "ROLE_VAR"));
    assert_int_equal(cps__config_parse_role("R", NULL, &r, err, sizeof err), CPS_ECONFIG);
}

static void parse_u32(void **state)
{
    (void)state;
    uint32_t v = 5;
    char err[128];
    assert_int_equal(cps__config_parse_u32("N", "0", 0, 10, &v, err, sizeof err), 0);
    assert_int_equal(v, 0);
    assert_int_equal(cps__config_parse_u32("N", "4294967295", 0, UINT32_MAX, &v, err, sizeof err),
                     0);
    assert_int_equal(v, UINT32_MAX);
    assert_int_equal(cps__config_parse_u32("N", "007", 0, 10, &v, err, sizeof err), 0);
    assert_int_equal(v, 7);
    static const char *const bad[] = {"4294967296", "11", "", "+1", "1.5", "1e3"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        uint32_t max = i == 0 ? UINT32_MAX : 10;
        assert_int_equal(cps__config_parse_u32("NUM_VAR", bad[i], 0, max, &v, err, sizeof err),
                         CPS_ECONFIG);
        assert_non_null(strstr(err, "NUM_VAR"));
    }
    assert_int_equal(cps__config_parse_u32("N", "2", 3, 10, &v, err, sizeof err), CPS_ECONFIG);
    assert_int_equal(v, 7);
}

static void export_round_trip(void **state)
{
    (void)state;
    cps__config a, b;
    char err[160];
    cps__config_defaults(&a);
    a.role = CPS_ROLE_SERVER;
    snprintf(a.sched_host, sizeof a.sched_host, "10.3.4.5");
    a.sched_port = 12345;
    a.num_servers = 5;
    a.num_workers = 9;
    snprintf(a.data_dir, sizeof a.data_dir, "/var/lib/chainps/s1");
    a.verbose = 2;
    a.mode = CPS_MODE_SSP;
    a.ssp_bound = 6;
    a.replicas = 3;
    a.rank = 4;
    snprintf(a.bind_host, sizeof a.bind_host, "0.0.0.0");
    snprintf(a.advertise_host, sizeof a.advertise_host, "10.3.4.6");
    a.port = 23456;
    a.join_timeout_ms = 1234;
    a.request_timeout_ms = 567;
    a.compress = 0;
    a.grad_codec = (cps__gradcodec){CPS_GC_TOPK, 0.015};
    a.sync_every_commit = 1;

    /* Stale aliases from the parent would otherwise conflict in the child. */
    setenv("DMLC_ROLE", "worker", 1);
    setenv("MS_SCHED_HOST", "elsewhere", 1);
    setenv("PS_VERBOSE", "0", 1);

    assert_int_equal(cps__config_export_env(&a), 0);
    assert_null(getenv("DMLC_ROLE"));
    assert_string_equal(getenv("CHAINPS_ROLE"), "server");
    assert_string_equal(getenv("CHAINPS_SCHEDULER"), "10.3.4.5:12345");
    assert_string_equal(getenv("CHAINPS_MODE"), "ssp:6");
    assert_int_equal(load(&b, err, sizeof err), 0);
    assert_same_config(&a, &b);

    /* defaults survive a round trip too, unset fields included */
    setenv("CHAINPS_RANK", "3", 1);
    cps__config_defaults(&a);
    assert_int_equal(cps__config_export_env(&a), 0);
    assert_null(getenv("CHAINPS_RANK"));
    assert_null(getenv("CHAINPS_ROLE"));
    assert_int_equal(load(&b, err, sizeof err), 0);
    assert_same_config(&a, &b);
}

/* CHAINPS_COMPRESS: snappy's 0|1 as before, a lossy codec, or both; a bad value names it. */
static void compress_values(void **state)
{
    (void)state;
    static const struct {
        const char *val;
        int snappy;
        uint32_t kind;
        double ratio;
    } ok[] = {{"0", 0, CPS_GC_NONE, 0},
              {"1", 1, CPS_GC_NONE, 0},
              {"fp16", 1, CPS_GC_FP16, 0},
              {"0,bf16", 0, CPS_GC_BF16, 0},
              {"topk:0.01,0", 0, CPS_GC_TOPK, 0.01},
              {"1,none", 1, CPS_GC_NONE, 0}};
    cps__config c;
    char err[256];
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        setenv("CHAINPS_COMPRESS", ok[i].val, 1);
        assert_int_equal(load(&c, err, sizeof err), 0);
        assert_int_equal(c.compress, ok[i].snappy);
        assert_int_equal(c.grad_codec.kind, ok[i].kind);
        assert_true(c.grad_codec.ratio == ok[i].ratio);
        char buf[64];
        cps__config d;
        cps__config_defaults(&d);
        assert_int_equal(cps__config_parse_compress("x",
                                                    cps__config_compress_str(&c, buf, sizeof buf),
                                                    &d, err, sizeof err),
                         0);
        assert_int_equal(d.compress, c.compress);
        assert_int_equal(d.grad_codec.kind, c.grad_codec.kind);
    }
    static const char *const bad[] = {"2",         "fp32", "topk:0", "topk:2",
                                      "fp16,bf16", ",",    "1,",     "yes"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        setenv("CHAINPS_COMPRESS", bad[i], 1);
        expect_error("CHAINPS_COMPRESS", NULL);
    }
}

/* --backup-workers / CHAINPS_BACKUP_WORKERS: a number, then checked against the job. */
static void backup_workers(void **state)
{
    (void)state;
    cps__config c;
    char err[256] = "";
    assert_int_equal(load(&c, err, sizeof err), 0);
    assert_int_equal(c.backup_workers, 0);
    assert_int_equal(cps__config_check_backup(&c, err, sizeof err), 0);
    setenv("CHAINPS_BACKUP_WORKERS", "1", 1);
    setenv("CHAINPS_NUM_WORKERS", "3", 1);
    assert_int_equal(load(&c, err, sizeof err), 0);
    assert_int_equal(c.backup_workers, 1);
    assert_int_equal(cps__config_check_backup(&c, err, sizeof err), 0);
    static const char *const bad[] = {"x", "-1", "1.5", "", " 2", "1024"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        if (!*bad[i])
            continue; /* empty is unset */
        setenv("CHAINPS_BACKUP_WORKERS", bad[i], 1);
        expect_error("CHAINPS_BACKUP_WORKERS", NULL);
        uint32_t b = 7;
        err[0] = 0;
        assert_int_equal(cps__config_parse_backup("--backup-workers", bad[i], &b, err, sizeof err),
                         CPS_ECONFIG);
        assert_int_equal(b, 7);
        assert_non_null(strstr(err, "--backup-workers"));
    }
    /* b >= W: refused by name once the worker count is known. */
    cps__config_defaults(&c);
    c.num_workers = 3;
    for (uint32_t b = 3; b <= 5; b++) {
        c.backup_workers = b;
        err[0] = 0;
        assert_int_equal(cps__config_check_backup(&c, err, sizeof err), CPS_EINVAL);
        assert_non_null(strstr(err, "--backup-workers"));
        assert_non_null(strstr(err, "below the 3 workers"));
    }
    c.backup_workers = 2;
    assert_int_equal(cps__config_check_backup(&c, err, sizeof err), 0);
    /* Only sync mode has steps to close. */
    c.mode = CPS_MODE_ASYNC;
    assert_int_equal(cps__config_check_backup(&c, err, sizeof err), CPS_EINVAL);
    assert_non_null(strstr(err, "needs --mode sync"));
    /* Exported for launch's children, and read back. */
    c.mode = CPS_MODE_SYNC;
    assert_int_equal(cps__config_export_env(&c), 0);
    assert_string_equal(getenv("CHAINPS_BACKUP_WORKERS"), "2");
    c.backup_workers = 0;
    assert_int_equal(cps__config_export_env(&c), 0);
    assert_null(getenv("CHAINPS_BACKUP_WORKERS"));
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, each_setup, each_teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(defaults),
        T(compress_values),
        T(scheduler_timeout_from_env),
        T(role_aliases),
        T(role_conflicts),
        T(pslite_jobs_default_to_async),
        T(empty_value_is_unset),
        T(scheduler_aliases),
        T(scheduler_errors),
        T(counts),
        T(verbosity),
        T(single_variables),
        T(bad_single_values),
        T(failure_leaves_config_untouched),
        T(hostport),
        T(mode),
        T(backup_workers),
        T(role_strings),
        T(parse_u32),
        T(export_round_trip),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
