/* unit.store_lmdb: a full disk (a small tmpfs: these tests need root and skip without it), and the
 * SIGBUS guard on the store's map. */
#include "fixture.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/log.h"

static char error_logs[8192];
static void capture_all(void *ctx, int level, const char *sub, const char *line)
{
    (void)ctx, (void)sub;
    if (level <= CPS_LOG_WARN)
        strncat(error_logs, line, sizeof error_logs - strlen(error_logs) - 2),
            strcat(error_logs, "\n");
}

/* Mount a tmpfs of `mib` MiB on the fixture's top directory (the store goes in a/b under it).
 * 0, or skips the test when it cannot (not root, no tmpfs). */
static int mount_small(fixture *f, const char *size)
{
    char *cut = strstr(f->dir, "/a/b");
    snprintf(f->mnt, sizeof f->mnt, "%.*s", (int)(cut - f->dir), f->dir);
    if (geteuid() != 0 || mount("tmpfs", f->mnt, "tmpfs", 0, size) != 0) {
        printf("skipped: cannot mount a tmpfs on %s (%s)\n", f->mnt,
               geteuid() != 0 ? "not root" : strerror(errno));
        f->mnt[0] = '\0';
        return -1;
    }
    return 0;
}

static int do_count_only(cps__txn *t, void *a)
{
    uint64_t *kv = a;
    return cps__store_count(t, &kv[0], &kv[1]);
}

/* A growth the filesystem cannot hold: a named error from the write that needed it, nothing of
 * that write committed, the store still usable; room given back, the same write succeeds. */
void test_disk_full_growth(void **state)
{
    fixture *f = *state;
    if (mount_small(f, "size=3m") != 0)
        skip();
    cps__log_set_sink(capture_all, NULL);
    error_logs[0] = '\0';
    open_store(f, 1 << 20); /* 1 MiB reserved at once, a growth to 2 MiB fits, 4 MiB does not */
    bulk b = {.nkeys = 1, .len = 16384, .spec = spec_of(CPS_W_OPT_SGD, CPS_W_INIT_UNIFORM, 0.1f)};
    int rc = 0, t = 0;
    for (; t < 64 && rc == 0; t++) { /* 64 KiB a write: 3 MiB cannot hold 64 of them */
        b.first = (uint64_t)t;
        rc = cps__store_write(f->s, do_bulk_create, &b);
    }
    assert_int_equal(rc, CPS_ENOSPC);
    assert_true(t > 10); /* the first MiB and the growth to 2 MiB worked */
    assert_non_null(strstr(error_logs, "disk full (posix_fallocate of 4 MiB"));
    assert_non_null(strstr(error_logs, f->dir));
    uint64_t kv[2];
    assert_int_equal(cps__store_read(f->s, do_count_only, kv), 0);
    assert_int_equal(kv[0], (uint64_t)(t - 1)); /* the failed write left nothing */
    float v[16384], want[16384];
    assert_int_equal(read_vals(f->s, 3, v, 16384), 0);
    cps__init_fill(&b.spec, 3 * 16384, want, 16384);
    assert_memory_equal(v, want, sizeof v);
    /* Not poisoned: an update still fails with the same named error (copy-on-write needs new
     * pages, the map is full), not with CPS_EPOISONED, and reads go on. */
    float g[16384] = {0};
    assert_int_equal(apply(f->s, 3, g, 16384), CPS_ENOSPC);

    /* Space is back (the tmpfs grows): the same write succeeds, in the same process. */
    assert_int_equal(mount("tmpfs", f->mnt, "tmpfs", MS_REMOUNT, "size=16m"), 0);
    assert_int_equal(cps__store_write(f->s, do_bulk_create, &b), 0);
    assert_int_equal(apply(f->s, 3, g, 16384), 0);
    cps__log_set_sink(NULL, NULL);
}

/* A store opened on a full filesystem: CPS_ENOSPC and a message, no SIGBUS. */
void test_disk_full_open(void **state)
{
    fixture *f = *state;
    if (mount_small(f, "size=2m") != 0)
        skip();
    char filler[600];
    snprintf(filler, sizeof filler, "%s/filler", f->mnt);
    int fd = open(filler, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    static char chunk[65536];
    while (write(fd, chunk, sizeof chunk) > 0)
        ;
    close(fd);
    cps__log_set_sink(capture_all, NULL);
    error_logs[0] = '\0';
    cps__store_opts o = {.initial_map_bytes = 1 << 20};
    assert_int_equal(cps__store_open(f->dir, &o, &f->s), CPS_ENOSPC);
    assert_null(f->s);
    assert_non_null(strstr(error_logs, "disk full"));
    /* Once the filler is gone the same directory opens. */
    assert_int_equal(unlink(filler), 0);
    assert_int_equal(cps__store_open(f->dir, &o, &f->s), 0);
    cps__log_set_sink(NULL, NULL);
}

/* The last line of defence: a SIGBUS on the store's map (here: the data file truncated behind
 * its back) ends the process with a message naming the directory and status 1. */
void test_sigbus_guard(void **state)
{
    fixture *f = *state;
    char errpath[600];
    snprintf(errpath, sizeof errpath, "%.*s/stderr", (int)(strstr(f->dir, "/a/b") - f->dir),
             f->dir);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || dup2(fd, STDERR_FILENO) < 0)
            _exit(10);
        signal(SIGBUS, SIG_DFL); /* whatever the test framework installed */
        cps__store_opts o = {.initial_map_bytes = 1 << 20};
        cps__store *s;
        if (cps__store_open(f->dir, &o, &s) != 0)
            _exit(11);
        char data[600];
        snprintf(data, sizeof data, "%s/data.mdb", f->dir);
        if (truncate(data, 0) != 0)
            _exit(12);
        bulk b = {.nkeys = 1, .len = 64, .spec = spec_of(CPS_W_OPT_SGD, CPS_W_INIT_UNIFORM, 1)};
        cps__store_write(s, do_bulk_create, &b);
        _exit(13); /* not reached: the map's pages are gone */
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 1);
    FILE *e = fopen(errpath, "r");
    assert_non_null(e);
    char msg[2048] = "";
    size_t n = fread(msg, 1, sizeof msg - 1, e);
    msg[n] = '\0';
    fclose(e);
    assert_non_null(strstr(msg, "SIGBUS"));
    assert_non_null(strstr(msg, f->dir));
}
