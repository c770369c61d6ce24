/* The store on a full disk: blocks reserved ahead of the map, and the SIGBUS guard for what the
 * reservations cannot cover (store.h, "Disk space"). */
#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "chainps/error.h"
#include "core/log.h"
#include "store/store_int.h"

/* LMDB sizes its lock file for MAX_READERS slots of one cache line each (~8 KiB): reserve a
 * generous bound before LMDB creates and maps it (see cps__st_reserve_lock_file). */
#define LOCK_RESERVE ((off_t)64 << 10)

/* ---- disk space ----
 *
 * With MDB_WRITEMAP LMDB extends the data file with ftruncate (a sparse file) and writes pages
 * through the memory map: a page the filesystem has no block for raises SIGBUS in whichever
 * thread touches it, instead of an ENOSPC anyone could handle. So the file's blocks are
 * allocated whenever the map is set or grown, before LMDB may write there: a full disk then
 * fails the open, or the growth, at a point where nothing is half written (the write
 * transaction that needed the room was aborted and returns CPS_ENOSPC). The cost is real disk
 * use equal to the map size (see ensure_room) and the time of the allocation. */

static void log_disk_full(const char *dir, int fd, const char *what, off_t bytes, int e, int level)
{
    struct statvfs v;
    struct stat st;
    double avail = fstatvfs(fd, &v) == 0 ? (double)v.f_bavail * v.f_frsize / MIB : -1;
    double have = fstat(fd, &st) == 0 ? (double)st.st_blocks * 512 / MIB : 0;
    double need = (double)bytes / MIB - have;
    cps__log(level, SUB,
             "store %s: disk full (%s of %.0f MiB: %s; %.1f MiB more needed, %.1f MiB free): "
             "free space, then restart the server",
             dir, what, (double)bytes / MIB, strerror(e), need > 0 ? need : 0, avail);
}

/* Allocate blocks for bytes [0, bytes) of fd (keep_size: without changing the file's size).
 * A filesystem that cannot allocate ahead is used as before, with one warning.
 * Errors: CPS_ENOSPC (logged at `level`), CPS_ESTORE. */
static int reserve_fd(const char *dir, int fd, const char *what, off_t bytes, int keep_size,
                      int level)
{
    static atomic_int warned;
    int e = keep_size ? (fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, bytes) == 0 ? 0 : errno)
                      : posix_fallocate(fd, 0, bytes);
    if (e == 0)
        return 0;
    if (e == ENOSPC || e == EDQUOT) {
        log_disk_full(dir, fd, what, bytes, e, level);
        return CPS_ENOSPC;
    }
    if (e == EOPNOTSUPP || e == ENOSYS) {
        if (!atomic_exchange(&warned, 1))
            cps__log(CPS_LOG_WARN, SUB,
                     "store %s: the filesystem cannot allocate space ahead (%s: %s): a full disk "
                     "will stop the server with a SIGBUS message instead of an error",
                     dir, what, strerror(e));
        return 0;
    }
    cps__log(CPS_LOG_ERROR, SUB, "store %s: %s of %.0f MiB failed: %s", dir, what,
             (double)bytes / MIB, strerror(e));
    return CPS_ESTORE;
}

int cps__st_reserve_map(cps__store *s, size_t bytes, int level)
{
    mdb_filehandle_t fd;
    int rc = mdb_env_get_fd(s->env, &fd);
    if (rc)
        return env_fail(s, "mdb_env_get_fd", rc);
    return reserve_fd(s->dir, fd, "posix_fallocate", (off_t)bytes, 0, level);
}

/* LMDB creates DIR/lock.mdb with ftruncate and writes its reader table through a shared map:
 * the same SIGBUS on a full disk. Blocks allocated beyond the end (KEEP_SIZE) before LMDB
 * opens it are the ones its ftruncate then covers. */
int cps__st_reserve_lock_file(const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/lock.mdb", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0664);
    if (fd < 0)
        return 0; /* mdb_env_open meets the same problem and names it */
    int rc = reserve_fd(dir, fd, "fallocate of lock.mdb", LOCK_RESERVE, 1, CPS_LOG_ERROR);
    close(fd);
    return rc;
}

/* ---- SIGBUS guard ----
 *
 * The last line of defence, for what the reservations cannot cover (a filesystem without
 * fallocate, a copy-on-write filesystem that needs new blocks on every write, a data file
 * truncated by someone else): a SIGBUS on an address inside a store's mapped files is turned
 * into one message naming the directory and exit status 1, never continued. Any other SIGBUS
 * keeps the default action (a core dump tells more about a real bug). Installed only if the
 * process left SIGBUS at its default. The table is written by store threads under guard_mu
 * and read by the handler through atomics only. */
#define MAX_GUARDED 16
#define GUARD_MAPS  2 /* data.mdb and lock.mdb */

static struct {
    atomic_uintptr_t lo[GUARD_MAPS], hi[GUARD_MAPS];
    atomic_int used;
    char dir[512];
} guarded[MAX_GUARDED];
static pthread_mutex_t guard_mu = PTHREAD_MUTEX_INITIALIZER;

static size_t str_put(char *dst, size_t at, size_t cap, const char *src)
{
    while (*src && at + 1 < cap)
        dst[at++] = *src++;
    return at;
}

static void on_sigbus(int sig, siginfo_t *si, void *uctx)
{
    (void)uctx;
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < MAX_GUARDED; i++) {
        if (!atomic_load(&guarded[i].used))
            continue;
        for (int m = 0; m < GUARD_MAPS; m++) {
            if (a < atomic_load(&guarded[i].lo[m]) || a >= atomic_load(&guarded[i].hi[m]))
                continue;
            char msg[800];
            size_t n = str_put(msg, 0, sizeof msg, "ERROR store: store ");
            n = str_put(msg, n, sizeof msg, guarded[i].dir);
            n = str_put(msg, n, sizeof msg,
                        ": SIGBUS writing its memory-mapped files: disk full (or a data file "
                        "truncated behind the server's back); exiting, free space and restart "
                        "the server\n");
            ssize_t w = write(STDERR_FILENO, msg, n);
            (void)w;
            _exit(1);
        }
    }
    /* Not ours: return with the default action, so that the access faults again and the
     * process dies of the signal as it would have without this handler. */
    signal(sig, SIG_DFL);
}

/* Checked at every open, not once: a process may reset SIGBUS to its default later. */
void cps__st_guard_install(void)
{
    struct sigaction old;
    if (sigaction(SIGBUS, NULL, &old) != 0 || (old.sa_flags & SA_SIGINFO) ||
        old.sa_handler != SIG_DFL)
        return;
    struct sigaction sa = {0};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
}

/* Find the mappings of DIR/data.mdb and DIR/lock.mdb in /proc/self/maps (by device and inode:
 * LMDB does not tell where it mapped them) and publish them for the handler. Called after the
 * open and after every growth (which may move the map), with no transaction open. */
void cps__st_guard_update(cps__store *s)
{
    static const char *names[GUARD_MAPS] = {"data.mdb", "lock.mdb"};
    struct stat st[GUARD_MAPS];
    for (int m = 0; m < GUARD_MAPS; m++) {
        char path[600];
        snprintf(path, sizeof path, "%s/%s", s->dir, names[m]);
        if (stat(path, &st[m]) != 0)
            st[m].st_ino = 0;
    }
    uintptr_t lo[GUARD_MAPS] = {0}, hi[GUARD_MAPS] = {0};
    FILE *f = fopen("/proc/self/maps", "r");
    char line[1024];
    while (f && fgets(line, sizeof line, f)) {
        unsigned long long a, b, off, ino;
        unsigned maj, mnr;
        if (sscanf(line, "%llx-%llx %*s %llx %x:%x %llu", &a, &b, &off, &maj, &mnr, &ino) != 6)
            continue;
        for (int m = 0; m < GUARD_MAPS; m++) {
            if (st[m].st_ino && ino == st[m].st_ino && maj == major(st[m].st_dev) &&
                mnr == minor(st[m].st_dev) && (lo[m] == 0 || a < lo[m])) {
                lo[m] = (uintptr_t)a;
                hi[m] = (uintptr_t)b > hi[m] ? (uintptr_t)b : hi[m];
            }
        }
    }
    if (f)
        fclose(f);
    pthread_mutex_lock(&guard_mu);
    if (s->guard < 0) {
        for (int i = 0; i < MAX_GUARDED && s->guard < 0; i++)
            if (!atomic_load(&guarded[i].used)) {
                s->guard = i;
                snprintf(guarded[i].dir, sizeof guarded[i].dir, "%s", s->dir);
            }
    }
    if (s->guard >= 0) {
        for (int m = 0; m < GUARD_MAPS; m++) {
            atomic_store(&guarded[s->guard].hi[m], 0); /* never a half-updated range */
            atomic_store(&guarded[s->guard].lo[m], lo[m]);
            atomic_store(&guarded[s->guard].hi[m], hi[m]);
        }
        atomic_store(&guarded[s->guard].used, 1);
    }
    pthread_mutex_unlock(&guard_mu);
}

void cps__st_guard_remove(cps__store *s)
{
    if (s->guard < 0)
        return;
    pthread_mutex_lock(&guard_mu);
    atomic_store(&guarded[s->guard].used, 0);
    for (int m = 0; m < GUARD_MAPS; m++)
        atomic_store(&guarded[s->guard].hi[m], 0);
    pthread_mutex_unlock(&guard_mu);
    s->guard = -1;
}
