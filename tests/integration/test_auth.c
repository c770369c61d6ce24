/* Only the job's own processes get in (issue 12): every message carries a MAC under the job's
 * secret, and a process without it, or with another job's, can neither join, push, read,
 * export, restore nor end the job. Real processes on 127.0.0.1:
 *  - a reference run (sync, 3 servers in chains of 2, 2 workers) is exported at step 20 with the
 *    right secret (the tools work when they have it);
 *  - the same job again, attacked while it trains by every tool and by forged frames with a
 *    wrong secret and with none: each attack fails, the logs say why, and the job ends with the
 *    reference run's parameters, bit for bit;
 *  - a job started without a secret refuses to start; with --insecure it runs and warns. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cmocka.h>

#include "core/view.h"
#include "core/wire.h"
#include "cluster.h"
#include "node/msg.h"
#include "transport/auth.h"
#include "transport/transport.h"

#define RUN_MS  120000
#define WAIT_MS 30000

/* The training program, sleeping `step_ms` a step (pacing changes no value: the runs compare
 * bitwise). The reference needs only to outlast its export (5 ms a step); the
 * attacked run, every attack: two rounds of tools that each wait up to 5 s (12 ms a step,
 * 18 s in all). */
static char *const *lsq_argv(const char *step_ms)
{
    static char *av[] = {LSQ_BIN, "--dim", "4000", "--steps", "1500",  "--step-ms",
                         NULL,    "--tol", "100",  "--lr",    "0.002", NULL};
    av[6] = (char *)step_ms;
    return av;
}

static pid_t launch(const char *name, int port, const char *step_ms)
{
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", port);
    char *av[40] = {CHAINPS_BIN, "launch", "--servers", "3",   "--replicas", "2", "--workers", "2",
                    "--port",    port_s,   "--timeout", "100", "--",         NULL};
    int k = 13;
    for (char *const *p = lsq_argv(step_ms); *p; p++)
        av[k++] = *p;
    av[k] = NULL;
    return h_spawn(name, av, NULL, NULL);
}

static int final_checksum(pid_t pid, char out[17])
{
    char *log = h_read_log(pid);
    const char *p = strstr(log, "final: rank 0");
    p = p ? strstr(p, "checksum ") : NULL;
    int ok = p && sscanf(p, "checksum %16s", out) == 1;
    free(log);
    return ok ? 0 : -1;
}

/* The frames that ended or hijacked a job before messages were authenticated: a BYE and a
 * SHUTDOWN claiming every plausible node id, a HELLO re-pointing node ids at our inbox, and a
 * STATUS; each sealed with `key` (NULL: a zeroed trailer, as an --insecure node sends) and sent
 * through a real nanomsg socket, then the same bytes once more by hand. */
static void forge(int sched_port, const unsigned char *key)
{
    cps__tp *tp;
    assert_int_equal(cps__tp_create(key, &tp), 0);
    char url[64];
    snprintf(url, sizeof url, "tcp://%s:%d", H_HOST, sched_port);
    assert_int_equal(cps__tp_peer_set(tp, 0, url), 0);
    char hello[16 + CPS_ADDR_MAX];
    size_t hn = cps__hello_encode(hello, sizeof hello, CPS_ROLE_WORKER, 0, 0, "tcp://127.0.0.1:9");
    cps__auth *seal;
    assert_int_equal(cps__auth_create(key, &seal), 0);
    for (uint32_t id = 1; id <= 8; id++) {
        const uint8_t types[] = {CPS_MSG_BYE, CPS_MSG_SHUTDOWN, CPS_MSG_HELLO, CPS_MSG_STATUS};
        for (size_t t = 0; t < sizeof types; t++) {
            cps__msg_hdr h = {.type = types[t], .sender = id, .epoch = 1, .req_worker = id};
            const void *payload =
                types[t] == CPS_MSG_HELLO || types[t] == CPS_MSG_STATUS ? hello : NULL;
            size_t plen = payload ? hn : 0;
            assert_int_equal(cps__msg_send(tp, 0, &h, payload, plen), 0);
            unsigned char raw[CPS_WIRE_HDR_SIZE + sizeof hello + CPS_AUTH_TRAILER];
            h.payload_len = h.raw_len = (uint32_t)plen;
            cps__wire_hdr_encode(raw, &h);
            if (plen)
                memcpy(raw + CPS_WIRE_HDR_SIZE, payload, plen);
            cps__auth_seal(seal, raw, CPS_WIRE_HDR_SIZE + plen);
            h_sp_send(sched_port, raw, CPS_WIRE_HDR_SIZE + plen + CPS_AUTH_TRAILER,
                      CPS_WIRE_HDR_SIZE + plen + CPS_AUTH_TRAILER);
        }
    }
    uint64_t end = h_now_ms() + 2000;
    while (cps__tp_queued(tp) && h_now_ms() < end)
        cps__tp_poll(tp, 20, NULL, NULL, 0);
    cps__auth_destroy(seal);
    cps__tp_destroy(tp);
}

static void outsiders_change_nothing(void **state)
{
    (void)state;
    const char *dir = h_dir();
    char ckpt[600], stolen[600], wrong[600], sched[64], wrong_env[700];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
    snprintf(stolen, sizeof stolen, "%s/stolen", dir);
    snprintf(wrong, sizeof wrong, "%s/other-job.secret", dir);
    snprintf(wrong_env, sizeof wrong_env, "CHAINPS_SECRET_FILE=%s", wrong);
    const char *mk[] = {CHAINPS_BIN, "secret", wrong, NULL};
    assert_int_equal(h_run("make-wrong-secret", (char *const *)mk, NULL, 10000, NULL), 0);
    unsigned char wrong_key[32];
    char err[768];
    assert_int_equal(cps__auth_load_file(wrong, wrong_key, err, sizeof err), 0);

    /* 1. The reference run, exported by a tool that has the job's secret, at the next step
     * boundary: the attackers' restore below only needs a valid file. A fixed step (200, 1 s
     * in) was once passed before an ASan export reached a loaded machine's job. */
    int port = cps__free_port();
    snprintf(sched, sizeof sched, "127.0.0.1:%d", port);
    pid_t ref = launch("reference", port, "5");
    assert_true(h_wait_log(ref, "tensor lsq/w registered", 1, WAIT_MS));
    const char *ex[] = {CHAINPS_BIN, "checkpoint", "export", "--scheduler",
                        sched,       "--out",      ckpt,     NULL};
    assert_int_equal(h_run("export-ok", (char *const *)ex, NULL, 60000, NULL), 0);
    const char *st_ok[] = {CHAINPS_BIN, "status", "--scheduler", sched, NULL};
    assert_int_equal(h_run("status-ok", (char *const *)st_ok, NULL, 10000, NULL), 0);
    assert_true(h_wait_exit(ref, RUN_MS, NULL));
    assert_int_equal(h_exit_code(ref), 0);
    char want[17];
    assert_int_equal(final_checksum(ref, want), 0);

    /* 2. The same job, attacked while it trains. */
    port = cps__free_port();
    snprintf(sched, sizeof sched, "127.0.0.1:%d", port);
    pid_t run = launch("attacked", port, "12");
    assert_true(h_wait_log(run, "tensor lsq/w registered", 1, WAIT_MS));
    char *wrong_secret[] = {wrong_env, NULL};
    char *no_secret[] = {"CHAINPS_INSECURE=1", NULL};
    char *const *who[] = {wrong_secret, no_secret};
    const char *end[] = {CHAINPS_BIN, "status", "--scheduler", sched, "--end", NULL};
    const char *steal[] = {CHAINPS_BIN, "checkpoint", "export",    "--scheduler", sched,
                           "--out",     stolen,       "--timeout", "5",           NULL};
    const char *put[] = {CHAINPS_BIN, "checkpoint", "restore",   "--scheduler", sched,
                         "--from",    ckpt,         "--timeout", "5",           NULL};
    char sched_env[128];
    snprintf(sched_env, sizeof sched_env, "CHAINPS_SCHEDULER=%s", sched);
    for (int w = 0; w < 2; w++) {
        const char *tag = w ? "none" : "wrong";
        char name[64];
        pid_t p[4];
        snprintf(name, sizeof name, "end-%s", tag);
        p[0] = h_spawn(name, (char *const *)end, who[w], NULL);
        snprintf(name, sizeof name, "export-%s", tag);
        p[1] = h_spawn(name, (char *const *)steal, who[w], NULL);
        snprintf(name, sizeof name, "restore-%s", tag);
        p[2] = h_spawn(name, (char *const *)put, who[w], NULL);
        /* A third worker (the job has two): it gets no answer and gives up. */
        char *wenv[] = {who[w][0],
                        sched_env,
                        "CHAINPS_ROLE=worker",
                        "CHAINPS_RANK=1",
                        "CHAINPS_JOIN_TIMEOUT_MS=3000",
                        NULL};
        snprintf(name, sizeof name, "worker-%s", tag);
        p[3] = h_spawn(name, lsq_argv("12"), wenv, NULL);
        forge(port, w ? NULL : wrong_key);
        for (int i = 0; i < 4; i++) {
            assert_true(h_wait_exit(p[i], 60000, NULL));
            assert_int_not_equal(h_exit_code(p[i]), 0);
        }
        if (w == 0) {
            assert_true(h_log_count(p[0], "no answer from the scheduler") > 0);
            assert_true(h_log_count(p[3], "no job secret") == 0);
        } else {
            /* Without a secret, a tool says so when it has none and is not told --insecure;
             * told so, it is refused by the job like any stranger. */
            assert_true(h_log_count(p[0], "no answer from the scheduler") > 0);
        }
        struct stat st;
        assert_int_not_equal(stat(stolen, &st), 0); /* nothing was written */
    }
    /* The job says what it dropped, and why. */
    assert_true(h_log_count(run, "failed authentication") > 0);
    assert_true(h_log_count(run, "wrong MAC") > 0);
    assert_true(h_log_count(run, "no MAC") > 0);
    /* It is still the job's: the right secret still works, then training ends unchanged. */
    assert_true(h_alive(run));
    const char *st2[] = {CHAINPS_BIN, "status", "--scheduler", sched, NULL};
    assert_int_equal(h_run("status-ok-2", (char *const *)st2, NULL, 10000, NULL), 0);
    assert_true(h_wait_exit(run, RUN_MS, NULL));
    assert_int_equal(h_exit_code(run), 0);
    char got[17];
    assert_int_equal(final_checksum(run, got), 0);
    assert_string_equal(got, want);
}

static void no_secret_no_job(void **state)
{
    (void)state;
    /* Every role refuses to start without a secret unless told --insecure, naming the fix. */
    const char *sched[] = {CHAINPS_BIN, "scheduler", "--servers", "1", "--workers", "1", NULL};
    char *empty[] = {"CHAINPS_SECRET_FILE=", NULL};
    pid_t pid;
    assert_int_equal(h_run("sched-empty", (char *const *)sched, empty, 10000, &pid), 2);
    /* Empty is unset, as for every variable: no secret, and not told --insecure. */
    assert_true(h_log_count(pid, "no job secret: give --secret-file FILE") > 0);
    char missing[700], missing_env[760];
    snprintf(missing, sizeof missing, "%s/nowhere.secret", h_dir());
    snprintf(missing_env, sizeof missing_env, "CHAINPS_SECRET_FILE=%s", missing);
    char *gone[] = {missing_env, NULL};
    assert_int_equal(h_run("sched-missing", (char *const *)sched, gone, 10000, &pid), 2);
    assert_true(h_log_count(pid, "cannot open the secret file") > 0);
    char *unset[] = {"CHAINPS_INSECURE=0", NULL};
    assert_int_equal(h_run("sched-none", (char *const *)sched, unset, 10000, &pid), 2);
    assert_true(h_log_count(pid, "no job secret: give --secret-file FILE") > 0);
    /* A launch without any secret makes one; with --insecure it makes none and warns. */
    int port = cps__free_port();
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", port);
    const char *ins[] = {CHAINPS_BIN, "launch",  "--servers",  "1",         "--workers", "1",
                         "--port",    port_s,    "--insecure", "--timeout", "60",        "--",
                         LSQ_BIN,     "--steps", "200",        "--tol",     "100",       NULL};
    char *insecure_env[] = {"CHAINPS_INSECURE=1", NULL};
    int rc = h_run("launch-insecure", (char *const *)ins, insecure_env, 90000, &pid);
    if (rc != 0) {
        char *log = h_read_log(pid);
        fprintf(stderr, "launch --insecure exited %d:\n%s\n", rc, log);
        free(log);
    }
    assert_int_equal(rc, 0);
    assert_true(h_log_count(pid, "running without a job secret") > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        H_TEST(outsiders_change_nothing, "auth", 280),
        H_TEST(no_secret_no_job, "auth", 280),
    };
    if (getenv("CPS_TEST_FILTER"))
        cmocka_set_test_filter(getenv("CPS_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
