/* Checkpoints of running jobs (issue 6), end to end with real processes on 127.0.0.1:
 *  - a checkpoint exported while a sync job (Adam, 3 servers, chains of 2) trains, restored
 *    into a cluster of another shape (2 servers, no replicas), resumes and ends bitwise equal to
 *    the run that was never interrupted; the exporting run itself is not perturbed;
 *  - a reader no one here wrote (Debian's python3 + numpy) opens the export, and the tensor's
 *    bytes are the ones the restored cluster hands its workers;
 *  - a corrupt checkpoint and one with a tensor the job does not know are refused, naming the
 *    file and the problem, and the running job they were aimed at is untouched;
 *  - periodic checkpoints land at multiples of the period, whole, and only the newest K stay. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <cmocka.h>

#include "checkpoint/ckpt.h"
#include "cluster.h"

#define DIM     "40000" /* three chunks: every range holds a piece */
#define STEPS   "80"
#define RUN_MS  90000
#define WAIT_MS 30000

/* The "checksum <hex>" of the first "final:" line of a log, into out[17]. */
static int final_checksum(pid_t pid, char out[17])
{
    char *log = h_read_log(pid);
    const char *p = strstr(log, "final: rank 0");
    p = p ? strstr(p, "checksum ") : NULL;
    int ok = p && sscanf(p, "checksum %16s", out) == 1;
    free(log);
    return ok ? 0 : -1;
}

static char *const *lsq_argv(const char *extra1, const char *extra2)
{
    static char *av[16];
    int k = 0;
    av[k++] = LSQ_BIN;
    av[k++] = "--dim";
    av[k++] = DIM;
    av[k++] = "--steps";
    av[k++] = STEPS;
    av[k++] = "--adam";
    av[k++] = "--lr";
    av[k++] = "0.01";
    av[k++] = "--tol";
    av[k++] = "100";
    if (extra1)
        av[k++] = (char *)extra1;
    if (extra2)
        av[k++] = (char *)extra2;
    av[k] = NULL;
    return av;
}

/* `chainps launch` with launch flags `flags` (NULL-terminated) and the lsq worker. */
static pid_t launch(const char *name, const char *const flags[], const char *e1, const char *e2)
{
    char *av[40];
    int k = 0;
    av[k++] = CHAINPS_BIN;
    av[k++] = "launch";
    av[k++] = "--workers";
    av[k++] = "2";
    av[k++] = "--timeout";
    av[k++] = "80";
    for (int i = 0; flags[i]; i++)
        av[k++] = (char *)flags[i];
    av[k++] = "--";
    for (char *const *p = lsq_argv(e1, e2); *p; p++)
        av[k++] = *p;
    av[k] = NULL;
    return h_spawn(name, av, NULL, NULL);
}

static int run_cli_within(const char *name, const char *const argv[], int ms, pid_t *pid)
{
    return h_run(name, (char *const *)argv, NULL, ms, pid);
}

static int run_cli(const char *name, const char *const argv[], pid_t *pid)
{
    return run_cli_within(name, argv, WAIT_MS, pid);
}

/* Run an export; returns the step it reports. */
static unsigned long long export_step(const char *name, const char *const argv[])
{
    pid_t pid;
    assert_int_equal(run_cli(name, argv, &pid), 0);
    char *log = h_read_log(pid);
    unsigned long long step = 0;
    const char *at = strstr(log, "at step ");
    assert_non_null(at);
    assert_int_equal(sscanf(at, "at step %llu", &step), 1);
    free(log);
    return step;
}

/* Write a checkpoint with one tensor the lsq job does not have. */
static void write_foreign(const char *path)
{
    static float v[40000];
    uint64_t shape[1] = {40000};
    cps__ckpt_writer *w;
    assert_int_equal(cps__ckpt_writer_open(path, 0, &w), 0);
    assert_int_equal(cps__ckpt_writer_add(w, "other/w", CPS_CKPT_F32, 1, shape, v), 0);
    assert_int_equal(cps__ckpt_writer_set_meta(w, "step", "3"), 0);
    assert_int_equal(cps__ckpt_writer_commit(w, NULL, 0), 0);
}

static void copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    assert_non_null(a);
    assert_non_null(b);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0)
        assert_int_equal(fwrite(buf, 1, n, b), n);
    fclose(a);
    fclose(b);
}

static void flip_bit(const char *path, long at)
{
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, at, SEEK_SET), 0);
    int c = fgetc(f);
    assert_int_equal(fseek(f, at, SEEK_SET), 0);
    fputc(c ^ 0x10, f);
    fclose(f);
}

static void export_restore_resume_bitwise(void **state)
{
    (void)state;
    const char *dir = h_dir();
    char exp[600], bad[700], foreign[700], sched[64], ckdir[700];
    snprintf(exp, sizeof exp, "%s/export", dir);
    snprintf(bad, sizeof bad, "%s/corrupt.safetensors", dir);
    snprintf(foreign, sizeof foreign, "%s/foreign.safetensors", dir);

    /* 1. The uninterrupted run. */
    const char *ref_flags[] = {"--servers", "3", "--replicas", "2", NULL};
    pid_t ref = launch("reference", ref_flags, NULL, NULL);
    assert_true(h_wait_exit(ref, RUN_MS, NULL));
    assert_int_equal(h_exit_code(ref), 0);
    char want[17];
    assert_int_equal(final_checksum(ref, want), 0);

    /* 2. The same job, slowed down, exported while it trains. */
    int port = cps__free_port();
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", port);
    snprintf(sched, sizeof sched, "127.0.0.1:%d", port);
    const char *run_flags[] = {"--servers", "3", "--replicas", "2", "--port", port_s, NULL};
    pid_t run = launch("exported", run_flags, "--step-ms", "15");
    assert_true(h_wait_log(run, "connected 2 workers and 3 servers", 1, WAIT_MS));
    assert_true(h_wait_log(run, "tensor lsq/w registered", 1, WAIT_MS));
    /* Exactly at step 20, which the job has not reached yet: the tails wait for it. */
    const char *ex[] = {CHAINPS_BIN, "checkpoint", "export", "--scheduler", sched,
                        "--out",     exp,          "--step", "20",          NULL};
    assert_int_equal(export_step("export", ex), 20);
    /* At the next step boundary every range reaches (whichever that is, mid-run). */
    char now[700];
    snprintf(now, sizeof now, "%s/now", dir);
    const char *ex_now[] = {CHAINPS_BIN, "checkpoint", "export", "--scheduler",
                            sched,       "--out",      now,      NULL};
    unsigned long long step_now = export_step("export-now", ex_now);
    assert_true(step_now >= 20 && step_now < 80);
    unsigned long long step = 20;

    /* 3. Bad checkpoints aimed at the running job are refused before anything is written. */
    snprintf(ckdir, sizeof ckdir, "%s/model.safetensors", exp);
    copy_file(ckdir, bad);
    flip_bit(bad, 4000);
    const char *r_bad[] = {CHAINPS_BIN, "checkpoint", "restore", "--scheduler",
                           sched,       "--from",     bad,       NULL};
    pid_t bad_pid;
    assert_int_equal(run_cli("restore-corrupt", r_bad, &bad_pid), 1);
    assert_true(h_log_count(bad_pid, "corrupt.safetensors") >= 1);
    assert_true(h_log_count(bad_pid, "checksum") >= 1);
    write_foreign(foreign);
    const char *r_for[] = {CHAINPS_BIN, "checkpoint",  "restore", "--scheduler", sched, "--from",
                           foreign,     "--optimizer", "sgd",     "--lr",        "0.1", NULL};
    pid_t for_pid;
    assert_int_equal(run_cli("restore-foreign", r_for, &for_pid), 1);
    assert_int_equal(h_log_count(for_pid, "tensor other/w is not a tensor of the job"), 1);

    /* A disk that fills up during an export (here a file size limit: EFBIG, as ENOSPC) fails
     * it with the file named, and the earlier checkpoint of the same name is untouched. */
    char shell[1400];
    snprintf(shell, sizeof shell,
             "ulimit -f 100 && exec %s checkpoint export --scheduler %s --out %s", CHAINPS_BIN,
             sched, exp);
    const char *full[] = {"/bin/sh", "-c", shell, NULL};
    pid_t full_pid;
    assert_int_equal(run_cli("export-full", full, &full_pid), 1);
    assert_true(h_log_count(full_pid, "model.safetensors.tmp: write failed") >= 1);
    const char *insp[] = {CHAINPS_BIN, "checkpoint", "inspect", exp, NULL};
    pid_t insp_pid;
    assert_int_equal(run_cli("inspect-after-full", insp, &insp_pid), 0);
    assert_int_equal(h_log_count(insp_pid, "step:       20\n"), 1);

    /* The exporting (and refused) run is not perturbed. */
    assert_true(h_wait_exit(run, RUN_MS, NULL));
    assert_int_equal(h_exit_code(run), 0);
    char got[17];
    assert_int_equal(final_checksum(run, got), 0);
    assert_string_equal(got, want);

    /* 4. Restore into another shape of cluster and resume: bitwise the uninterrupted result. */
    const char *res_flags[] = {"--servers", "2", "--replicas", "1", "--restore-from", exp, NULL};
    pid_t res = launch("restored", res_flags, NULL, NULL);
    assert_true(h_wait_exit(res, RUN_MS, NULL));
    assert_int_equal(h_exit_code(res), 0);
    char resume[64];
    snprintf(resume, sizeof resume, "resuming at step %llu,", step);
    assert_int_equal(h_log_count(res, resume), 2); /* both workers */
    assert_int_equal(final_checksum(res, got), 0);
    assert_string_equal(got, want);

    /* 5. Debian's python reads the export: its lsq/w bytes are the values the restored cluster
     * handed the workers (the XXH3-64 they logged at resume; libxxhash through ctypes,
     * so the test needs no Python binding of it). */
    char *rlog = h_read_log(res);
    const char *cs = strstr(rlog, "values checksum ");
    assert_non_null(cs);
    char seen[17];
    assert_int_equal(sscanf(cs, "values checksum %16s", seen), 1);
    free(rlog);
    char script[1400];
    snprintf(script, sizeof script,
             "import json,struct,sys\n"
             "import numpy as np\n"
             "f=open('%s','rb'); n=struct.unpack('<Q',f.read(8))[0]; h=json.loads(f.read(n))\n"
             "d=f.read(); e=h['lsq/w']; b,end=e['data_offsets']\n"
             "a=np.frombuffer(d[b:end],dtype='<f4'); assert a.shape==(40000,)\n"
             "assert e['dtype']=='F32' and h['__metadata__']['step']=='%llu'\n"
             "import ctypes\n"
             "x=ctypes.CDLL('libxxhash.so.0'); x.XXH3_64bits.restype=ctypes.c_uint64\n"
             "b=a.tobytes(); print('%%016x'%%x.XXH3_64bits(b,ctypes.c_size_t(len(b))))\n",
             ckdir, step);
    const char *py[] = {"/usr/bin/python3", "-c", script, NULL};
    pid_t py_pid;
    assert_int_equal(run_cli("python-reader", py, &py_pid), 0);
    assert_int_equal(h_log_count(py_pid, seen), 1);
}

static int count_entries(const char *dir, const char *prefix, char names[][64], int cap)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (!strncmp(e->d_name, prefix, strlen(prefix))) {
            if (n < cap)
                snprintf(names[n], 64, "%.63s", e->d_name);
            n++;
        }
    closedir(d);
    return n;
}

static void periodic_checkpoints_keep_the_newest(void **state)
{
    (void)state;
    char ckdir[600];
    snprintf(ckdir, sizeof ckdir, "%s/periodic", h_dir());
    const char *flags[] = {
        "--servers", "2", "--checkpoint-every", "15", "--checkpoint-dir", ckdir, "--keep",
        "2",         NULL};
    pid_t run = launch("periodic", flags, "--step-ms", "20");
    assert_true(h_wait_exit(run, RUN_MS, NULL));
    assert_int_equal(h_exit_code(run), 0);
    /* Taken at steps 15, 30, ... 75 (one may be missed on a loaded machine: the next multiple
     * is then aimed at). */
    assert_true(h_log_count(run, "checkpoint at step ") >= 4);
    assert_true(h_log_count(run, "removed old checkpoint") >= 2);
    char names[8][64];
    int n = count_entries(ckdir, "step-", names, 8);
    assert_int_equal(n, 2);
    for (int i = 0; i < n; i++) {
        unsigned long long s;
        assert_int_equal(sscanf(names[i], "step-%llu", &s), 1);
        assert_int_equal(s % 15, 0);
        char path[1200], meta[64];
        snprintf(path, sizeof path, "%s/%s", ckdir, names[i]);
        const char *insp[] = {CHAINPS_BIN, "checkpoint", "inspect", path, NULL};
        pid_t ip;
        char iname[80];
        snprintf(iname, sizeof iname, "inspect-%d", i);
        assert_int_equal(run_cli(iname, insp, &ip), 0);
        snprintf(meta, sizeof meta, "step:       %llu\n", s);
        assert_int_equal(h_log_count(ip, meta), 1);
        assert_int_equal(h_log_count(ip, "checksums:  all 4 verify"), 1);
    }
}

/* A model smaller than the cluster (16 values: one key, so one range of four holds anything):
 * the ranges without keys never reach a step, and a sync cut must not wait for them (issue 12:
 * the export never completed). */
static void sync_export_with_empty_ranges(void **state)
{
    (void)state;
    char ckdir[600];
    snprintf(ckdir, sizeof ckdir, "%s/empty-ranges", h_dir());
    char *av[] = {CHAINPS_BIN,
                  "launch",
                  "--servers",
                  "4",
                  "--workers",
                  "1",
                  "--timeout",
                  "80",
                  "--checkpoint-every",
                  "40",
                  "--checkpoint-dir",
                  ckdir,
                  "--",
                  LSQ_BIN,
                  "--dim",
                  "16",
                  "--steps",
                  "200",
                  "--step-ms",
                  "10",
                  "--tol",
                  "100",
                  NULL};
    pid_t run = h_spawn("empty-ranges", av, NULL, NULL);
    assert_true(h_wait_exit(run, RUN_MS, NULL));
    assert_int_equal(h_exit_code(run), 0);
    assert_true(h_log_count(run, "checkpoint at step ") >= 2);
    char names[8][64];
    assert_true(count_entries(ckdir, "step-", names, 8) >= 2);
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", ckdir, names[0]);
    const char *insp[] = {CHAINPS_BIN, "checkpoint", "inspect", path, NULL};
    pid_t ip;
    assert_int_equal(run_cli("inspect-empty", insp, &ip), 0);
    assert_int_equal(h_log_count(ip, "lsq/w"), 4); /* values, Adam's two slots, its steps */
}

/* Async jobs are cut at each range's current sequence number, recorded in the metadata. */
static void async_export_by_the_clock(void **state)
{
    (void)state;
    char ckdir[600];
    snprintf(ckdir, sizeof ckdir, "%s/async", h_dir());
    const char *flags[] = {"--servers",        "2",   "--mode", "async", "--checkpoint-every", "1s",
                           "--checkpoint-dir", ckdir, NULL};
    pid_t run = launch("async", flags, "--step-ms", "30");
    assert_true(h_wait_exit(run, RUN_MS, NULL));
    assert_int_equal(h_exit_code(run), 0);
    char names[8][64];
    int n = count_entries(ckdir, "step-", names, 8);
    assert_true(n >= 1);
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", ckdir, names[0]);
    const char *insp[] = {CHAINPS_BIN, "checkpoint", "inspect", path, NULL};
    pid_t ip;
    assert_int_equal(run_cli("inspect-async", insp, &ip), 0);
    assert_int_equal(h_log_count(ip, "cut: per-range sequence number"), 1);
    assert_int_equal(h_log_count(ip, "mode: async"), 1);
    assert_int_equal(h_log_count(ip, "cut/seq/1: "), 1);
}

/* A safetensors file written elsewhere (no optimizer description, no chainps metadata but the
 * step) initialises a job: the workers start from its values at its step. */
static void initialise_from_a_foreign_file(void **state)
{
    (void)state;
    char path[700];
    snprintf(path, sizeof path, "%s/pretrained.safetensors", h_dir());
    static float v[40000];
    for (size_t i = 0; i < 40000; i++)
        v[i] = (float)((int)(i % 13) - 6) * 0.125f;
    uint64_t h = XXH3_64bits(v, sizeof v); /* what lsq_worker logs of the values it resumes at */
    uint64_t shape[1] = {40000};
    cps__ckpt_writer *w;
    assert_int_equal(cps__ckpt_writer_open(path, 0, &w), 0);
    assert_int_equal(cps__ckpt_writer_add(w, "lsq/w", CPS_CKPT_F32, 1, shape, v), 0);
    assert_int_equal(cps__ckpt_writer_set_meta(w, "step", "5"), 0);
    assert_int_equal(cps__ckpt_writer_commit(w, NULL, 0), 0);
    /* The workers run SGD with lr 0.1 (no --adam): the same description is given. */
    char *av[] = {CHAINPS_BIN,
                  "launch",
                  "--servers",
                  "2",
                  "--workers",
                  "1",
                  "--timeout",
                  "60",
                  "--restore-from",
                  path,
                  "--restore-optimizer",
                  "sgd:0.1",
                  "--",
                  LSQ_BIN,
                  "--dim",
                  DIM,
                  "--steps",
                  "10",
                  "--lr",
                  "0.1",
                  "--tol",
                  "100",
                  NULL};
    pid_t run;
    assert_int_equal(h_run("foreign", av, NULL, RUN_MS, &run), 0);
    char want[80];
    snprintf(want, sizeof want, "resuming at step 5, values checksum %016llx",
             (unsigned long long)h);
    assert_int_equal(h_log_count(run, want), 1);
    assert_int_equal(h_log_count(run, "final: rank 0"), 1);
}

/* A tail killed while an export waits for its step: the exporter asks the new tail. */
static void export_rides_through_a_failover(void **state)
{
    (void)state;
    int port = cps__free_port();
    char port_s[16], sched[64], out[700];
    snprintf(port_s, sizeof port_s, "%d", port);
    snprintf(sched, sizeof sched, "127.0.0.1:%d", port);
    snprintf(out, sizeof out, "%s/failover", h_dir());
    /* Server 0 (in two of the three chains, the tail of one) dies 2 s in and restarts 2 s
     * later. */
    const char *flags[] = {"--servers", "3",         "--replicas", "2", "--port",
                           port_s,      "--kill-at", "2",          NULL};
    pid_t run = launch("failover", flags, "--step-ms", "100");
    assert_true(h_wait_log(run, "tensor lsq/w registered", 1, WAIT_MS));
    /* Step 70 comes about 5 s after the kill (100 ms a step), so the wait spans the failover,
     * and the exporter, which asks for the view every 2 s, has asked the new tails well before
     * the job's last step (80). At 30 ms a step, step 70 came with the kill and the job could
     * end before the new tails were asked: the export then waited for servers that were gone. */
    const char *ex[] = {CHAINPS_BIN, "checkpoint", "export", "--scheduler", sched, "--out",
                        out,         "--step",     "70",     "--timeout",   "90",  NULL};
    pid_t ex_pid;
    /* Waited for longer than its own --timeout: the export must end by itself, with a result or
     * a named error, and the test must not race that (it killed a slow export at 30 s). Under
     * ASan on a loaded machine a step takes 400-500 ms, so step 70 comes 30-40 s in: a 40 s
     * --timeout failed the suite once; 90 s costs nothing when the export succeeds. */
    int rc = run_cli_within("export-failover", ex, 90000 + WAIT_MS, &ex_pid);
    if (rc == 0) {
        assert_int_equal(h_log_count(ex_pid, "at step 70 in"), 1);
    } else {
        /* The only acceptable failure: the new tail had passed step 70 before it was asked
         * (the old one died with the request). Said plainly, not a hang or a timeout; the
         * next boundary is then exported. */
        assert_int_equal(rc, 1);
        assert_int_equal(h_log_count(ex_pid, "already past the requested training step"), 1);
        /* The next boundary, if the job still runs (80 steps: it may have ended meanwhile).
         * Either way the export ends by itself within its --timeout, exporting or naming why
         * not: an ended job must not make it hang. */
        const char *next[] = {CHAINPS_BIN, "checkpoint", "export",    "--scheduler", sched,
                              "--out",     out,          "--timeout", "10",          NULL};
        rc = run_cli_within("export-failover-next", next, 10000 + WAIT_MS, &ex_pid);
        assert_true(rc == 0 || rc == 1);
        if (rc == 1) {
            char *log = h_read_log(ex_pid);
            assert_non_null(strstr(log, "ckpt:"));
            free(log);
        }
    }
    assert_true(h_wait_exit(run, RUN_MS, NULL));
    assert_int_equal(h_exit_code(run), 0);
    assert_int_equal(h_log_count(run, "SIGKILL server 0"), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        H_TEST(export_restore_resume_bitwise, "ckpt-export", 300),
        H_TEST(periodic_checkpoints_keep_the_newest, "ckpt-periodic", 150),
        H_TEST(async_export_by_the_clock, "ckpt-async", 150),
        H_TEST(sync_export_with_empty_ranges, "ckpt-periodic", 150),
        H_TEST(initialise_from_a_foreign_file, "ckpt-foreign", 120),
        H_TEST(export_rides_through_a_failover, "ckpt-failover", 150),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
