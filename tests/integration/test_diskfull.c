/* A full disk during training (issue 12): one of three servers keeps its data on a small tmpfs
 * that cannot hold the store's next map growth. That server must log the named error
 * ("store DIR: disk full (...)") and exit with a status, not die of SIGBUS; the scheduler fails
 * its ranges over; the job goes on and ends with exactly the parameters of a fault-free run (no
 * acknowledged update lost). Once the tmpfs is enlarged ("space is back") the same server,
 * restarted on the same directory, rejoins by state transfer.
 *
 * The test process is the worker (as in test_restart.c): sync mode, one worker, and gradients
 * whose products with the learning rate are exact in float, so the expected parameters are
 * computed here bit for bit. Needs root (mount); without it, or without tmpfs, it prints why and
 * exits 77 (SKIP_RETURN_CODE). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "chainps/chainps.h"
#include "cluster.h"

/* The store starts with a 64 MiB map, reserved on disk at once. The first tensor is 48 MB of
 * values and fits; training rewrites it in chunks of 512 KB, copy-on-write, which fits too. A
 * second tensor of 16 MB declared during training does not: the map must grow to 128 MiB, which
 * the 80 MiB tmpfs cannot hold. */
#define LEN       (12u << 20)
#define LEN2      (4u << 20)
#define LR        0.5f
#define TMPFS     "size=80m"
#define TMPFS_BIG "size=512m"
#define FULL_RANK 2
#define WAIT_MS   60000
#define MAX_STEPS 12

static h_cluster C;
static char mnt[700];

static void push_step(cps_client *c, cps_tensor *t, float *g, float *expect, int step)
{
    assert_int_equal(h_push_dyadic(c, t, g, expect, LEN, LR, step), 0);
}

static void pull_and_compare(cps_client *c, cps_tensor *t, float *got, const float *expect)
{
    memset(got, 0, LEN * sizeof *got);
    assert_int_equal(cps_pull(c, t, got, LEN), 0);
    assert_memory_equal(got, expect, LEN * sizeof *got);
}

static void test_disk_fills_during_training(void **state)
{
    (void)state;
    /* Server FULL_RANK's data directory is the mount point (h_start_server's layout). */
    snprintf(mnt, sizeof mnt, "%s/server-%d", h_dir(), FULL_RANK);
    assert_int_equal(mkdir(mnt, 0755), 0);
    assert_int_equal(mount("tmpfs", mnt, "tmpfs", 0, TMPFS), 0);

    memset(&C, 0, sizeof C);
    const char *extra[] = {"--replicas", "3", NULL};
    assert_int_equal(h_start_scheduler(&C, 3, 1, "sync", extra), 0);
    C.nservers = 3;
    for (int i = 0; i < 3; i++)
        assert_true(h_start_server(&C, i) > 0);
    h_become_worker(C.sched_addr, 3, 1);
    cps_client *c = NULL;
    assert_int_equal(cps_open(&c), 0);

    cps_init init = {.kind = CPS_INIT_UNIFORM, .a = -1.0f, .b = 1.0f, .seed = 11};
    cps_optim opt = cps_optim_sgd(LR);
    cps_tensor *t = NULL;
    assert_int_equal(cps_tensor_declare(c, "diskfull/w", LEN, &init, &opt, &t), 0);
    float *expect = malloc(LEN * sizeof *expect), *g = malloc(LEN * sizeof *g);
    float *got = malloc(LEN * sizeof *got);
    assert_non_null(expect);
    assert_non_null(g);
    assert_non_null(got);
    cps_init_values(&init, 0, expect, LEN);

    /* Train, then grow the model past what the full server's disk holds; train until that
     * server has left. Every call must succeed all the same. */
    pid_t full = C.servers[FULL_RANK];
    int step = 0;
    uint64_t t0 = h_now_ms();
    for (int i = 0; i < 2; i++)
        push_step(c, t, g, expect, step++);
    cps_init init2 = {.kind = CPS_INIT_UNIFORM, .a = -2.0f, .b = 2.0f, .seed = 12};
    cps_tensor *t2 = NULL;
    assert_int_equal(cps_tensor_declare(c, "diskfull/w2", LEN2, &init2, &opt, &t2), 0);
    while (h_alive(full) && step < MAX_STEPS)
        push_step(c, t, g, expect, step++);
    int status = 0;
    assert_true(h_wait_exit(full, WAIT_MS, &status));
    printf("server %d left after step %d (%.1f s of training)\n", FULL_RANK, step,
           (h_now_ms() - t0) / 1000.0);
    /* An exit with a status, never a signal (SIGBUS was the bug). */
    assert_int_equal(h_exit_code(full), 1);
    char want[800];
    snprintf(want, sizeof want, "store %s: disk full (posix_fallocate of 128 MiB", mnt);
    assert_int_equal(h_log_count(full, want), 1);
    snprintf(want, sizeof want, "leaving the job: disk full in %s", mnt);
    assert_int_equal(h_log_count(full, want), 1);
    assert_int_equal(h_log_count(full, "SIGBUS"), 0);

    /* Failover: the job goes on with two replicas, and nothing acknowledged was lost. */
    for (int i = 0; i < 3; i++)
        push_step(c, t, g, expect, step++);
    pull_and_compare(c, t, got, expect);

    /* Space is back: the server restarts on the same directory and rejoins. */
    assert_int_equal(mount("tmpfs", mnt, "tmpfs", MS_REMOUNT, TMPFS_BIG), 0);
    pid_t again = h_start_server(&C, FULL_RANK);
    assert_true(again > 0);
    assert_true(h_wait_log(again, "joined as node", 1, WAIT_MS));
    assert_true(h_wait_log(again, "installed", 1, WAIT_MS));
    for (int i = 0; i < 2; i++)
        push_step(c, t, g, expect, step++);
    /* The joiner became the tail of the ranges it joined, and tails answer pulls: this reads
     * the restarted replica's copy. */
    assert_true(h_log_count(C.sched, "came back at") >= 1);
    pull_and_compare(c, t, got, expect);
    /* The tensor whose declaration filled the disk holds its initial values on every copy. */
    cps_init_values(&init2, 0, expect, LEN2);
    memset(got, 0, LEN2 * sizeof *got);
    assert_int_equal(cps_pull(c, t2, got, LEN2), 0);
    assert_memory_equal(got, expect, LEN2 * sizeof *got);

    free(expect), free(g), free(got);
    /* The job ends when the only worker leaves; every node, the restarted one too, exits 0. */
    assert_int_equal(cps_close(c), 0);
    assert_true(h_wait_exit(C.sched, WAIT_MS, NULL));
    assert_int_equal(h_exit_code(C.sched), 0);
    for (int i = 0; i < 3; i++) {
        assert_true(h_wait_exit(C.servers[i], WAIT_MS, NULL));
        assert_int_equal(h_exit_code(C.servers[i]), 0);
    }
}

static int teardown(void **state)
{
    (void)state;
    /* Every process first (one may still have the tmpfs open), then the mount, then the dir. */
    h_kill_all();
    if (mnt[0] && umount2(mnt, MNT_DETACH) != 0 && errno != EINVAL)
        fprintf(stderr, "cannot unmount %s: %s\n", mnt, strerror(errno));
    mnt[0] = '\0';
    return h_test_end();
}

/* Root and tmpfs, or a skip that says which is missing. */
static int can_mount(void)
{
    if (geteuid() != 0) {
        printf("skipped: mounting a small tmpfs needs root\n");
        return 0;
    }
    const char *tmp = getenv("TMPDIR");
    char probe[600];
    snprintf(probe, sizeof probe, "%s/diskfull_probe_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(probe)) {
        printf("skipped: cannot create %s: %s\n", probe, strerror(errno));
        return 0;
    }
    int ok = mount("tmpfs", probe, "tmpfs", 0, "size=1m") == 0;
    if (!ok)
        printf("skipped: cannot mount a tmpfs on %s: %s\n", probe, strerror(errno));
    else
        umount2(probe, MNT_DETACH);
    rmdir(probe);
    return ok;
}

int main(void)
{
    if (!can_mount())
        return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate_setup_teardown(test_disk_fills_during_training, h_setup, teardown,
                                                 (&(h_fixture){"diskfull", 240})),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
