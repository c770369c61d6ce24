/* Parameter store over LMDB. See store.h for the databases and the transaction rules.
 *
 * Param record layout (little-endian header, then raw native f32 arrays):
 *    0 u16 record format version (REC_VERSION)   2 u8 optimizer kind   3 u8 init kind
 *    4 u32 len (number of values)                8 u64 optimizer steps applied (Adam's t)
 *   16 u64 init seed   24 f32 init_a   28 f32 init_b   32 f32 lr   36 f32 weight_decay
 *   40 f32 momentum    44 f32 beta1    48 f32 beta2    52 f32 eps  56 f32 rho
 *   60 u8 nesterov     61..63 zero
 *   64 f32 vals[len]   then f32 state[slots*len] (slot-major, as cps__optim_apply wants)
 * The wire's 64-byte spec block cannot be reused here: with the version, length and step it
 * would not fit the 64-byte header, so the record packs the same fields itself (and does not
 * depend on the wire module).
 *
 * LMDB returns data 2-byte aligned at best, so values are always copied (memcpy) between the
 * map and float buffers; the store's scratch buffer is the aligned side of those copies. */
#include "store/store.h"

#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include <xxhash.h>

#include "chainps/error.h"
#include "core/log.h"
#include "optim/optim.h"

#define SUB               "store"
#define REC_VERSION       1
#define REC_HDR           64
#define DEFAULT_MAP_BYTES ((size_t)64 << 20)
/* Growth is doubling, so 24 growths in one write take even a 1 MiB map past any real need;
 * the cap stops a runaway caller (e.g. one that writes garbage sizes) from eating the disk. */
#define MAX_GROWTHS   24
#define MAX_MAP_BYTES ((size_t)1 << 40)
/* ensure_room: the room beyond the live pages that updates may take while a checkpoint's read
 * view pins the pages they free, at least ROOM_MIN_FREE and ROOM_PER_LIVE times the live data
 * (a few whole-store steps). The room is reserved on disk, so it follows the live data, never
 * the highest page once written: sizing from that mark fed on itself (a view held through many
 * steps raised it to the map's end, and the next checkpoint grew the map 8 times again: a 2 MB
 * model's data directory reached 9 GB in a 10-minute soak). When the room is used up, the views
 * are closed (before_grow) and the update reuses the pages they pinned; the map grows only for
 * live data. */
#define ROOM_MIN_FREE ((size_t)256 << 20)
#define ROOM_PER_LIVE 4
/* cps__store_reserve: beyond the bytes asked, room for the transaction's own bookkeeping (the
 * freelist and meta records, the branch pages it copies), and the unit the map grows by. */
#define RESERVE_SLACK ((size_t)8 << 20)
#define RESERVE_ROUND ((size_t)16 << 20)
/* LMDB sizes its lock file for MAX_READERS slots of one cache line each (~8 KiB): reserve a
 * generous bound before LMDB creates and maps it (see reserve_lock_file). */
#define LOCK_RESERVE ((off_t)64 << 10)
#define MIB          ((double)(1 << 20))
/* Readers are the event loop plus a few off-loop jobs (checkpoint export, state transfer,
 * status); MDB_NOTLS ties a slot to each open read txn, not to a thread. */
#define MAX_READERS    126
#define META_MAX_BYTES 4096
#define META_MAX_NAME  255

struct cps__store {
    MDB_env *env;
    MDB_dbi params, ranges, dedup, meta;
    int poisoned;
    /* mdb_env_set_mapsize() remaps the file: no transaction of this process may be open then
     * (LMDB does not check). Every txn holds this lock shared; growing takes it exclusive. */
    pthread_rwlock_t map_lock;
    float *scratch; /* 64-byte aligned; only the writer thread uses it */
    int (*before_grow)(void *ctx);
    void *grow_ctx;
    size_t room_min; /* ROOM_MIN_FREE unless the options say */
    size_t scratch_floats;
    cps__store_stats stats; /* written by the writer thread only (syncs: see nsyncs) */
    /* The background flusher (cps__store_sync_async): mdb_env_sync may run on another thread,
     * but not while mdb_env_set_mapsize remaps the map it msyncs: sync_mu is held by each
     * flush and by each remap. flush_cv wakes the flusher (flush_want) and whoever waits for
     * it to be idle (cps__store_sync_wait). */
    pthread_mutex_t sync_mu, flush_mu;
    pthread_cond_t flush_cv;
    pthread_t flusher;
    int flusher_on, flush_want, flush_busy, flush_stop;
    atomic_uint_fast64_t nsyncs, nsync_fails;
    int lock_fd; /* DIR/chainps.lock, flock'ed for the store's life */
    int guard;   /* slot in the SIGBUS guard table, -1 if none */
    char dir[512];
};

struct cps__txn {
    cps__store *s;
    MDB_txn *t;
    /* The record cps__store_param_write (or _reset) last made writable in this txn: further
     * slices of it are written in place, without copying the record again. Any other write to
     * the params database forgets it. */
    uint64_t wkey;
    unsigned char *wrec;
    size_t wsize;
    int map_full; /* some operation hit MDB_MAP_FULL: the whole txn is retried after growing */
    int failed;   /* some LMDB operation failed: never commit this txn */
};

/* ---- errors ---- */

static int lmdb_fail(cps__txn *tx, const char *op, uint64_t key, int rc)
{
    if (rc == MDB_MAP_FULL && tx) {
        /* Expected: cps__store_write grows the map and runs the txn again. */
        tx->map_full = 1;
        tx->failed = 1;
        cps__log(CPS_LOG_DEBUG, SUB, "%s key %llu: map full, will grow", op,
                 (unsigned long long)key);
        return CPS_ESTORE;
    }
    if (tx)
        tx->failed = 1;
    cps__log(CPS_LOG_ERROR, SUB, "%s key %llu in %s: %s", op, (unsigned long long)key,
             tx ? tx->s->dir : "?", mdb_strerror(rc));
    return CPS_ESTORE;
}

static int env_fail(cps__store *s, const char *op, int rc)
{
    cps__log(CPS_LOG_ERROR, SUB, "%s in %s: %s", op, s->dir, mdb_strerror(rc));
    return CPS_ESTORE;
}

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

static int reserve_map(cps__store *s, size_t bytes, int level)
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
static int reserve_lock_file(const char *dir)
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
static void guard_install(void)
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
static void guard_update(cps__store *s)
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

static void guard_remove(cps__store *s)
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

static void poison(cps__store *s, const char *op, int rc)
{
    s->poisoned = 1;
    cps__log(CPS_LOG_ERROR, SUB,
             "POISONED: %s in %s failed (%s); the store's state is unknown, every later call "
             "fails with CPS_EPOISONED until the node restarts",
             op, s->dir, mdb_strerror(rc));
}

/* ---- record header ---- */

static void f32_put(unsigned char *p, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    cps__le32_put(p, u);
}

static float f32_get(const unsigned char *p)
{
    uint32_t u = cps__le32_get(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void hdr_encode(unsigned char *h, uint32_t len, uint64_t step, const cps__param_spec *sp)
{
    memset(h, 0, REC_HDR);
    h[0] = (unsigned char)REC_VERSION;
    h[1] = (unsigned char)(REC_VERSION >> 8);
    h[2] = (unsigned char)sp->opt_kind;
    h[3] = (unsigned char)sp->init_kind;
    cps__le32_put(h + 4, len);
    cps__le64_put(h + 8, step);
    cps__le64_put(h + 16, sp->init_seed);
    f32_put(h + 24, sp->init_a);
    f32_put(h + 28, sp->init_b);
    f32_put(h + 32, sp->lr);
    f32_put(h + 36, sp->weight_decay);
    f32_put(h + 40, sp->momentum);
    f32_put(h + 44, sp->beta1);
    f32_put(h + 48, sp->beta2);
    f32_put(h + 52, sp->eps);
    f32_put(h + 56, sp->rho);
    h[60] = sp->nesterov ? 1 : 0;
}

static int kinds_valid(const cps__param_spec *sp)
{
    return sp->opt_kind <= CPS_W_OPT_RMSPROP && sp->init_kind <= CPS_W_INIT_NORMAL;
}

static size_t rec_size(uint32_t len, uint32_t opt_kind)
{
    return REC_HDR + ((size_t)1 + cps__optim_state_slots(opt_kind)) * len * sizeof(float);
}

/* Decode and check a stored record; `out` borrows from `d`. */
static int rec_decode(const MDB_val *d, uint64_t key, cps__param_rec *out)
{
    const unsigned char *h = d->mv_data;
    const char *why = NULL;
    if (d->mv_size < REC_HDR) {
        why = "shorter than its header";
    } else if ((unsigned)h[0] + ((unsigned)h[1] << 8) != REC_VERSION) {
        why = "unknown format version";
    } else {
        memset(out, 0, sizeof *out);
        out->spec.opt_kind = h[2];
        out->spec.init_kind = h[3];
        out->len = cps__le32_get(h + 4);
        out->opt_step = cps__le64_get(h + 8);
        out->spec.init_seed = cps__le64_get(h + 16);
        out->spec.init_a = f32_get(h + 24);
        out->spec.init_b = f32_get(h + 28);
        out->spec.lr = f32_get(h + 32);
        out->spec.weight_decay = f32_get(h + 36);
        out->spec.momentum = f32_get(h + 40);
        out->spec.beta1 = f32_get(h + 44);
        out->spec.beta2 = f32_get(h + 48);
        out->spec.eps = f32_get(h + 52);
        out->spec.rho = f32_get(h + 56);
        out->spec.nesterov = h[60];
        if (!kinds_valid(&out->spec) || h[60] > 1)
            why = "unknown optimizer or init kind";
        else if (out->len == 0 || rec_size(out->len, out->spec.opt_kind) != d->mv_size)
            why = "length does not match the value size";
    }
    if (why) {
        cps__log(CPS_LOG_ERROR, SUB, "corrupt param record, key %llu (%zu bytes): %s",
                 (unsigned long long)key, d->mv_size, why);
        return CPS_ECORRUPT;
    }
    out->vals = (const float *)(h + REC_HDR);
    out->state = cps__optim_state_slots(out->spec.opt_kind)
                     ? (const float *)(h + REC_HDR + (size_t)out->len * sizeof(float))
                     : NULL;
    return 0;
}

/* The canonical form of a spec, as stored and compared: defaults resolved, nesterov 0/1. */
static cps__param_spec spec_canon(const cps__param_spec *sp)
{
    cps__param_spec c = *sp;
    cps__optim_spec_defaults(&c);
    c.nesterov = c.nesterov ? 1 : 0;
    return c;
}

static int spec_equal(const cps__param_spec *a, const cps__param_spec *b)
{
    unsigned char ha[REC_HDR], hb[REC_HDR];
    cps__param_spec ca = spec_canon(a), cb = spec_canon(b);
    hdr_encode(ha, 0, 0, &ca);
    hdr_encode(hb, 0, 0, &cb);
    return memcmp(ha, hb, REC_HDR) == 0;
}

static int scratch_reserve(cps__store *s, size_t nfloats)
{
    if (nfloats <= s->scratch_floats)
        return 0;
    size_t want = s->scratch_floats ? s->scratch_floats : 1024;
    while (want < nfloats)
        want *= 2;
    /* aligned_alloc wants a size that is a multiple of the alignment. */
    size_t bytes = (want * sizeof(float) + 63) & ~(size_t)63;
    float *p = aligned_alloc(64, bytes);
    if (!p) {
        cps__log(CPS_LOG_ERROR, SUB, "scratch of %zu bytes: out of memory", bytes);
        return CPS_ENOMEM;
    }
    free(s->scratch);
    s->scratch = p;
    s->scratch_floats = want;
    return 0;
}

/* ---- environment ---- */

static int mkdir_p(const char *dir)
{
    char path[512];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof path)
        return -1;
    memcpy(path, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (path[i] == '/' || path[i] == '\0') {
            char c = path[i];
            path[i] = '\0';
            if (mkdir(path, 0775) != 0 && errno != EEXIST)
                return -1;
            path[i] = c;
        }
    }
    return 0;
}

static int open_dbis(cps__store *s)
{
    MDB_txn *t;
    int rc = mdb_txn_begin(s->env, NULL, 0, &t);
    if (rc)
        return env_fail(s, "mdb_txn_begin (open)", rc);
    const struct {
        const char *name;
        unsigned flags;
        MDB_dbi *dbi;
    } dbs[] = {
        {"params", MDB_CREATE | MDB_INTEGERKEY, &s->params},
        {"ranges", MDB_CREATE | MDB_INTEGERKEY, &s->ranges},
        {"dedup", MDB_CREATE | MDB_INTEGERKEY, &s->dedup},
        {"meta", MDB_CREATE, &s->meta},
    };
    for (size_t i = 0; i < sizeof dbs / sizeof dbs[0]; i++) {
        rc = mdb_dbi_open(t, dbs[i].name, dbs[i].flags, dbs[i].dbi);
        if (rc) {
            mdb_txn_abort(t);
            cps__log(CPS_LOG_ERROR, SUB, "mdb_dbi_open %s in %s: %s", dbs[i].name, s->dir,
                     mdb_strerror(rc));
            return CPS_ESTORE;
        }
    }
    rc = mdb_txn_commit(t);
    return rc ? env_fail(s, "mdb_txn_commit (open)", rc) : 0;
}

/* One store, one process: two LMDB writers on one environment (two servers started from one
 * directory) would apply every update twice. flock() is per open file, so a second store in
 * the same process is refused too; the holder's pid is written in the file for the message. */
static int lock_dir(const char *dir, int quiet_busy, int *fd_out)
{
    char path[600];
    snprintf(path, sizeof path, "%s/chainps.lock", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        cps__log(CPS_LOG_ERROR, SUB, "cannot open %s: %s", path, strerror(errno));
        return CPS_ESTORE;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        char pid[32] = "";
        ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
        pid[n > 0 ? n : 0] = 0;
        pid[strcspn(pid, "\n")] = 0;
        close(fd);
        if (e == EWOULDBLOCK) {
            cps__log(quiet_busy ? CPS_LOG_DEBUG : CPS_LOG_ERROR, SUB,
                     "data directory %s is in use by process %s (another chainps server or "
                     "scheduler): two servers must not share a store; give each its own --data",
                     dir, pid[0] ? pid : "?");
            return CPS_EBUSY;
        }
        cps__log(CPS_LOG_ERROR, SUB, "cannot lock %s: %s", path, strerror(e));
        return CPS_ESTORE;
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n)
        cps__log(CPS_LOG_WARN, SUB, "cannot record our pid in %s: %s", path, strerror(errno));
    *fd_out = fd;
    return 0;
}

int cps__store_open(const char *dir, const cps__store_opts *opts, cps__store **out)
{
    if (!dir || !out || !*dir || strlen(dir) >= sizeof((cps__store *)0)->dir)
        return CPS_EINVAL;
    *out = NULL;
    if (mkdir_p(dir) != 0) {
        cps__log(CPS_LOG_ERROR, SUB, "cannot create directory %s: %s", dir, strerror(errno));
        return CPS_ESTORE;
    }
    int lock_fd;
    int lrc = lock_dir(dir, opts && opts->quiet_busy, &lock_fd);
    if (lrc != 0)
        return lrc;
    cps__store *s = calloc(1, sizeof *s);
    if (!s) {
        close(lock_fd);
        return CPS_ENOMEM;
    }
    s->lock_fd = lock_fd;
    s->guard = -1;
    snprintf(s->dir, sizeof s->dir, "%s", dir);
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    /* A steady stream of readers must not starve a map growth (and so the writer). */
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&s->map_lock, &attr);
    pthread_rwlockattr_destroy(&attr);
    pthread_mutex_init(&s->sync_mu, NULL);
    pthread_mutex_init(&s->flush_mu, NULL);
    pthread_cond_init(&s->flush_cv, NULL);

    size_t map = opts && opts->initial_map_bytes ? opts->initial_map_bytes : DEFAULT_MAP_BYTES;
    if (opts) {
        s->before_grow = opts->before_grow;
        s->grow_ctx = opts->grow_ctx;
    }
    s->room_min = opts && opts->room_min_bytes ? opts->room_min_bytes : ROOM_MIN_FREE;
    /* MDB_WRITEMAP: dirty pages are written in the map itself, so a commit does no writev of
     * every page (measured: ~10% of server CPU for 1 MB updates, ~5 us per small commit). */
    unsigned flags = MDB_NOTLS | MDB_WRITEMAP;
    int err = CPS_ESTORE; /* what a failure below returns */
    if (!(opts && opts->sync_every_commit))
        flags |= MDB_NOSYNC;
    int rc = mdb_env_create(&s->env);
    if (rc) {
        env_fail(s, "mdb_env_create", rc);
        s->env = NULL;
        goto fail;
    }
    if ((rc = mdb_env_set_maxdbs(s->env, 8)) ||
        (rc = mdb_env_set_maxreaders(s->env, MAX_READERS)) ||
        (rc = mdb_env_set_mapsize(s->env, map))) {
        env_fail(s, "mdb_env_set_*", rc);
        goto fail;
    }
    if ((err = reserve_lock_file(dir)) != 0)
        goto fail;
    err = CPS_ESTORE;
    if ((rc = mdb_env_open(s->env, dir, flags, 0664))) {
        /* A new environment's meta pages are written with write(2): a full disk says so. */
        if (rc == ENOSPC || rc == EDQUOT) {
            cps__log(CPS_LOG_ERROR, SUB, "store %s: disk full (mdb_env_open: %s)", dir,
                     strerror(rc));
            err = CPS_ENOSPC;
        } else {
            env_fail(s, "mdb_env_open", rc);
        }
        goto fail;
    }
    MDB_envinfo info;
    if ((rc = mdb_env_info(s->env, &info))) {
        env_fail(s, "mdb_env_info", rc);
        goto fail;
    }
    map = info.me_mapsize; /* an existing environment keeps the larger map it grew to */
    guard_install();
    if ((err = reserve_map(s, map, CPS_LOG_ERROR)) != 0)
        goto fail;
    err = CPS_ESTORE;
    if (open_dbis(s) != 0)
        goto fail;
    guard_update(s);
    cps__log(CPS_LOG_DEBUG, SUB, "opened %s (map %zu bytes, %s)", dir, map,
             (flags & MDB_NOSYNC) ? "nosync" : "sync every commit");
    *out = s;
    return 0;
fail:
    if (s->env)
        mdb_env_close(s->env);
    pthread_rwlock_destroy(&s->map_lock);
    pthread_mutex_destroy(&s->sync_mu);
    pthread_mutex_destroy(&s->flush_mu);
    pthread_cond_destroy(&s->flush_cv);
    close(s->lock_fd);
    free(s);
    return err;
}

/* One flush, from whichever thread: never during a remap (see sync_mu). */
static int flush(cps__store *s)
{
    pthread_mutex_lock(&s->sync_mu);
    int rc = mdb_env_sync(s->env, 1);
    pthread_mutex_unlock(&s->sync_mu);
    if (rc) {
        atomic_fetch_add(&s->nsync_fails, 1);
        return env_fail(s, "mdb_env_sync", rc);
    }
    atomic_fetch_add(&s->nsyncs, 1);
    return 0;
}

static void *flusher_main(void *arg)
{
    cps__store *s = arg;
    pthread_mutex_lock(&s->flush_mu);
    for (;;) {
        while (!s->flush_want && !s->flush_stop)
            pthread_cond_wait(&s->flush_cv, &s->flush_mu);
        if (s->flush_stop)
            break;
        s->flush_want = 0; /* requests made during this flush make one more */
        s->flush_busy = 1;
        pthread_mutex_unlock(&s->flush_mu);
        flush(s);
        pthread_mutex_lock(&s->flush_mu);
        s->flush_busy = 0;
        pthread_cond_broadcast(&s->flush_cv);
    }
    pthread_mutex_unlock(&s->flush_mu);
    return NULL;
}

static void flusher_stop(cps__store *s)
{
    if (!s->flusher_on)
        return;
    pthread_mutex_lock(&s->flush_mu);
    s->flush_stop = 1;
    pthread_cond_broadcast(&s->flush_cv);
    pthread_mutex_unlock(&s->flush_mu);
    pthread_join(s->flusher, NULL);
    s->flusher_on = 0;
}

void cps__store_close(cps__store *s)
{
    if (!s)
        return;
    flusher_stop(s); /* a flush in flight ends first; the one below covers everything */
    if (!s->poisoned)
        flush(s);
    guard_remove(s);
    mdb_env_close(s->env);
    pthread_rwlock_destroy(&s->map_lock);
    pthread_mutex_destroy(&s->sync_mu);
    pthread_mutex_destroy(&s->flush_mu);
    pthread_cond_destroy(&s->flush_cv);
    free(s->scratch);
    close(s->lock_fd); /* after the environment: the next owner finds it closed */
    free(s);
}

int cps__store_sync(cps__store *s)
{
    if (s->poisoned)
        return CPS_EPOISONED;
    return flush(s);
}

int cps__store_sync_async(cps__store *s)
{
    if (s->poisoned)
        return CPS_EPOISONED;
    if (!s->flusher_on) {
        if (pthread_create(&s->flusher, NULL, flusher_main, s) != 0) {
            cps__log(CPS_LOG_WARN, SUB, "%s: no thread for background flushes: flushing here",
                     s->dir);
            return flush(s);
        }
        s->flusher_on = 1;
    }
    pthread_mutex_lock(&s->flush_mu);
    s->flush_want = 1;
    pthread_cond_signal(&s->flush_cv);
    pthread_mutex_unlock(&s->flush_mu);
    return 0;
}

void cps__store_sync_wait(cps__store *s)
{
    if (!s->flusher_on)
        return;
    pthread_mutex_lock(&s->flush_mu);
    while (s->flush_want || s->flush_busy)
        pthread_cond_wait(&s->flush_cv, &s->flush_mu);
    pthread_mutex_unlock(&s->flush_mu);
}

/* Grow the map to `want` bytes (0: double it). Called with no txn of ours open; waits for
 * other threads' read txns. `ahead`: growing ahead of need (ensure_room), where a full disk is
 * no error of the write path: logged as a warning, and the growth stops short of the
 * filesystem's last free half. */
static int grow_map(cps__store *s, size_t want, int ahead)
{
    MDB_envinfo info;
    int rc = mdb_env_info(s->env, &info);
    if (rc)
        return env_fail(s, "mdb_env_info", rc);
    if (want == 0)
        want = info.me_mapsize * 2;
    if (want <= info.me_mapsize)
        return 0;
    if (want > MAX_MAP_BYTES) {
        cps__log(CPS_LOG_ERROR, SUB, "%s: map full at %zu bytes, refusing to grow past %zu", s->dir,
                 info.me_mapsize, (size_t)MAX_MAP_BYTES);
        return CPS_ESTORE;
    }
    if (ahead) {
        /* Room ahead of a checkpoint is worth having, not worth filling the disk for: keep at
         * least as much free as the growth takes. */
        struct statvfs v;
        mdb_filehandle_t fd;
        if (mdb_env_get_fd(s->env, &fd) == 0 && fstatvfs(fd, &v) == 0 &&
            (double)v.f_bavail * v.f_frsize < 2.0 * (double)(want - info.me_mapsize)) {
            cps__log(CPS_LOG_WARN, SUB,
                     "store %s: not growing the map ahead from %.0f to %.0f MiB: only %.0f MiB "
                     "free on its filesystem",
                     s->dir, info.me_mapsize / MIB, want / MIB,
                     (double)v.f_bavail * v.f_frsize / MIB);
            return CPS_ENOSPC;
        }
    }
    /* Blocks first (no remap, readers may go on): a full disk leaves the map as it was. */
    if ((rc = reserve_map(s, want, ahead ? CPS_LOG_WARN : CPS_LOG_ERROR)) != 0)
        return rc;
    if (s->before_grow)
        (void)s->before_grow(s->grow_ctx);
    pthread_rwlock_wrlock(&s->map_lock);
    pthread_mutex_lock(&s->sync_mu); /* a background flush msyncs the old map: let it end */
    rc = mdb_env_set_mapsize(s->env, want);
    pthread_mutex_unlock(&s->sync_mu);
    pthread_rwlock_unlock(&s->map_lock);
    if (rc)
        return env_fail(s, "mdb_env_set_mapsize", rc);
    guard_update(s);
    s->stats.grows++;
    cps__log(CPS_LOG_INFO, SUB, "%s: map grown from %zu to %zu bytes", s->dir, info.me_mapsize,
             want);
    return 0;
}

/* The map's size and its high-water mark of used pages (the freelist below it counts as used,
 * so whatever is sized from it errs on the side of room). */
static int map_usage(cps__store *s, MDB_envinfo *info, size_t *used)
{
    MDB_stat st;
    int rc = mdb_env_info(s->env, info);
    if (rc == 0)
        rc = mdb_env_stat(s->env, &st);
    if (rc)
        return env_fail(s, "mdb_env_info", rc);
    *used = (info->me_last_pgno + 1) * (size_t)st.ms_psize;
    return 0;
}

static size_t db_pages(MDB_txn *t, MDB_dbi dbi)
{
    MDB_stat st;
    if (mdb_stat(t, dbi, &st) != 0)
        return 0;
    return st.ms_branch_pages + st.ms_leaf_pages + st.ms_overflow_pages;
}

/* Bytes of the pages the databases hold now (the freelist's own pages and the two meta pages
 * included): what a copy of the store would take, unlike the high-water mark of map_usage. */
static int live_bytes(cps__store *s, size_t *live)
{
    MDB_txn *t;
    MDB_stat st;
    pthread_rwlock_rdlock(&s->map_lock);
    int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &t);
    if (rc == 0) {
        const MDB_dbi dbis[] = {0 /* freelist */, 1 /* main */, s->params,
                                s->ranges,        s->dedup,     s->meta};
        size_t pages = 2;
        for (size_t i = 0; i < sizeof dbis / sizeof dbis[0]; i++)
            pages += db_pages(t, dbis[i]);
        rc = mdb_env_stat(s->env, &st);
        *live = pages * (size_t)st.ms_psize;
        mdb_txn_abort(t);
    }
    pthread_rwlock_unlock(&s->map_lock);
    return rc ? env_fail(s, "mdb_txn_begin (live bytes)", rc) : 0;
}

int cps__store_room_target(cps__store *s, size_t *target)
{
    size_t live;
    int rc = live_bytes(s, &live);
    if (rc)
        return rc;
    size_t room = live > s->room_min / ROOM_PER_LIVE ? live * ROOM_PER_LIVE : s->room_min;
    *target = (live + room + RESERVE_SLACK + RESERVE_ROUND - 1) / RESERVE_ROUND * RESERVE_ROUND;
    return 0;
}

int cps__store_ensure_room(cps__store *s)
{
    MDB_envinfo info;
    size_t target;
    int rc = cps__store_room_target(s, &target);
    if (rc == 0 && (rc = mdb_env_info(s->env, &info)) != 0)
        rc = env_fail(s, "mdb_env_info", rc);
    /* Pages free below the high-water mark count as room: those freed before a view opens
     * are reused while it is open. */
    if (rc == 0 && info.me_mapsize < target)
        rc = grow_map(s, target, 1);
    return rc;
}

/* Map bytes one record of `size` bytes takes: a large record is a run of overflow pages of its
 * own (a 16-byte page header), a small one shares leaf pages, which may be only half full. */
static uint64_t rec_map_bytes(size_t size, size_t psize)
{
    if (size > psize / 4)
        return ((size + 16 + psize - 1) / psize) * psize;
    return 2 * (size + 32);
}

uint64_t cps__store_create_bytes(uint32_t len, uint32_t opt_kind)
{
    /* LMDB's pages are the OS page size. The record itself, its node in a leaf page and a
     * share of the branch pages above. */
    long page = sysconf(_SC_PAGESIZE);
    return rec_map_bytes(rec_size(len, opt_kind), page > 0 ? (size_t)page : 4096) + 64;
}

int cps__store_reserve(cps__store *s, uint64_t bytes)
{
    if (s->poisoned)
        return CPS_EPOISONED;
    MDB_envinfo info;
    size_t used;
    int rc = map_usage(s, &info, &used);
    if (rc)
        return rc;
    if (bytes > MAX_MAP_BYTES || used + bytes + RESERVE_SLACK <= info.me_mapsize)
        return bytes > MAX_MAP_BYTES ? CPS_EINVAL : 0;
    /* A modest margin, not a doubling: the file takes the map's size on disk. */
    size_t want = used + bytes + RESERVE_SLACK;
    want = (want + RESERVE_ROUND - 1) / RESERVE_ROUND * RESERVE_ROUND;
    return grow_map(s, want, 0);
}

void cps__store_stats_get(cps__store *s, cps__store_stats *out)
{
    *out = s->stats;
    out->syncs = atomic_load(&s->nsyncs);
    out->sync_fails = atomic_load(&s->nsync_fails);
}

int cps__store_write(cps__store *s, cps__txn_fn fn, void *arg)
{
    int released = 0;
    for (int growths = 0;; growths++) {
        if (s->poisoned)
            return CPS_EPOISONED;
        cps__txn tx = {.s = s};
        pthread_rwlock_rdlock(&s->map_lock);
        int rc = mdb_txn_begin(s->env, NULL, 0, &tx.t);
        if (rc) {
            pthread_rwlock_unlock(&s->map_lock);
            if (rc == MDB_PANIC) {
                poison(s, "mdb_txn_begin", rc);
                return CPS_EPOISONED;
            }
            return env_fail(s, "mdb_txn_begin", rc);
        }
        int frc = fn(&tx, arg);
        if (tx.map_full || frc != 0 || tx.failed) {
            mdb_txn_abort(tx.t);
            pthread_rwlock_unlock(&s->map_lock);
            if (!tx.map_full)
                return frc != 0 ? frc : CPS_ESTORE; /* an LMDB error fn chose to ignore */
        } else {
            rc = mdb_txn_commit(tx.t); /* frees the txn, success or not */
            pthread_rwlock_unlock(&s->map_lock);
            if (rc == 0)
                return 0;
            if (rc != MDB_MAP_FULL) {
                poison(s, "mdb_txn_commit", rc);
                return CPS_EPOISONED;
            }
        }
        /* MDB_MAP_FULL from a put or from the commit: nothing was written; grow and rerun. */
        if (growths >= MAX_GROWTHS) {
            cps__log(CPS_LOG_ERROR, SUB, "%s: still map full after %d growths", s->dir, growths);
            return CPS_ESTORE;
        }
        s->stats.reruns++;
        /* Read views pin the pages updates free: once they are closed, those pages are reused
         * and the map need not grow (the views' room is ensure_room's). */
        if (!released && s->before_grow && s->before_grow(s->grow_ctx) > 0) {
            released = 1;
            s->stats.pin_releases++;
            growths--;
            continue;
        }
        if ((rc = grow_map(s, 0, 0)) != 0)
            return rc;
    }
}

int cps__store_read(cps__store *s, cps__txn_fn fn, void *arg)
{
    if (s->poisoned)
        return CPS_EPOISONED;
    cps__txn tx = {.s = s};
    pthread_rwlock_rdlock(&s->map_lock);
    int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &tx.t);
    if (rc) {
        pthread_rwlock_unlock(&s->map_lock);
        return env_fail(s, "mdb_txn_begin (read)", rc);
    }
    rc = fn(&tx, arg);
    mdb_txn_abort(tx.t);
    pthread_rwlock_unlock(&s->map_lock);
    return rc;
}

/* ---- parameters ---- */

static int param_lookup(cps__txn *tx, uint64_t key, MDB_val *d, cps__param_rec *rec, const char *op)
{
    MDB_val k = {sizeof key, &key};
    int rc = mdb_get(tx->t, tx->s->params, &k, d);
    if (rc == MDB_NOTFOUND)
        return CPS_ENOTFOUND;
    if (rc)
        return lmdb_fail(tx, op, key, rc);
    return rec_decode(d, key, rec);
}

int cps__store_param_get(cps__txn *tx, uint64_t key, cps__param_rec *out)
{
    MDB_val d;
    return param_lookup(tx, key, &d, out, "param_get");
}

/* Reserve the record's space in the map and write its header; values follow at +REC_HDR. */
static int rec_reserve(cps__txn *tx, uint64_t key, uint32_t len, uint64_t step,
                       const cps__param_spec *spec, unsigned char **data, const char *op)
{
    MDB_val k = {sizeof key, &key};
    MDB_val d = {rec_size(len, spec->opt_kind), NULL};
    tx->wrec = NULL;
    int rc = mdb_put(tx->t, tx->s->params, &k, &d, MDB_RESERVE);
    if (rc)
        return lmdb_fail(tx, op, key, rc);
    *data = d.mv_data;
    hdr_encode(*data, len, step, spec);
    return 0;
}

int cps__store_param_create(cps__txn *tx, uint64_t key, uint32_t len, uint64_t offset,
                            const cps__param_spec *spec)
{
    if (len == 0 || !spec || !kinds_valid(spec))
        return CPS_EINVAL;
    cps__param_rec old;
    MDB_val d;
    int rc = param_lookup(tx, key, &d, &old, "param_create");
    if (rc == 0) {
        if (old.len == len && spec_equal(&old.spec, spec))
            return 0;
        cps__log(CPS_LOG_WARN, SUB, "param_create key %llu: exists with len %u, asked len %u%s",
                 (unsigned long long)key, old.len, len,
                 old.len == len ? " and a different spec" : "");
        return CPS_EEXIST;
    }
    if (rc != CPS_ENOTFOUND)
        return rc;

    cps__param_spec c = spec_canon(spec);
    size_t slots = cps__optim_state_slots(c.opt_kind);
    unsigned char *p;
    if ((rc = rec_reserve(tx, key, len, 0, &c, &p, "param_create")) != 0)
        return rc;
    if (((uintptr_t)(p + REC_HDR) & (sizeof(float) - 1)) == 0) {
        /* Straight into the map (a large record is on pages of its own, so aligned): no
         * scratch copy of the whole tensor, which stayed in the server's memory after. */
        cps__init_fill(&c, offset, (float *)(void *)(p + REC_HDR), len);
    } else {
        /* A small record inside a leaf page may be misaligned: fill in aligned scratch. */
        if ((rc = scratch_reserve(tx->s, len)) != 0)
            return rc;
        cps__init_fill(&c, offset, tx->s->scratch, len);
        memcpy(p + REC_HDR, tx->s->scratch, (size_t)len * sizeof(float));
    }
    memset(p + REC_HDR + (size_t)len * sizeof(float), 0, slots * len * sizeof(float));
    return 0;
}

int cps__store_param_apply(cps__txn *tx, uint64_t key, const float *grad, uint32_t glen)
{
    cps__param_rec rec;
    MDB_val d;
    int rc = param_lookup(tx, key, &d, &rec, "param_apply");
    if (rc)
        return rc;
    if (glen != rec.len) {
        cps__log(CPS_LOG_WARN, SUB, "param_apply key %llu: gradient of %u values for %u",
                 (unsigned long long)key, glen, rec.len);
        return CPS_ESIZE;
    }
    size_t n = rec.len, slots = cps__optim_state_slots(rec.spec.opt_kind);
    size_t nfloats = (1 + slots) * n;
    const unsigned char *old = (const unsigned char *)d.mv_data + REC_HDR;
    unsigned char *p;
    if ((rc = rec_reserve(tx, key, rec.len, rec.opt_step + 1, &rec.spec, &p, "param_apply")))
        return rc;
    float *dst = (float *)(void *)(p + REC_HDR);
    if (((uintptr_t)dst & (sizeof(float) - 1)) == 0) {
        /* Update straight into the reserved record. LMDB is copy-on-write: a record not yet
         * written in this transaction keeps its old pages intact until commit, so `old` is
         * still readable after the reserve and does not overlap `dst` (when LMDB reuses the
         * same dirty space, old == dst and the update is in place). An aligned `old` is read
         * by the optimizer itself, so the values cross memory once (no copy pass first). */
        uint64_t t = rec.opt_step + 1;
        if ((const unsigned char *)dst != old && ((uintptr_t)old & (sizeof(float) - 1)) == 0) {
            rc = cps__optim_apply_copy(&rec.spec, (const void *)old, dst, grad, n, t);
        } else {
            if ((const unsigned char *)dst != old)
                memcpy(dst, old, nfloats * sizeof(float));
            rc = cps__optim_apply(&rec.spec, dst, slots ? dst + n : NULL, grad, n, t);
        }
    } else {
        /* A small record inside a leaf page may be misaligned for floats: go through scratch
         * (`old` is still intact, as above). */
        if ((rc = scratch_reserve(tx->s, nfloats)) != 0)
            return rc;
        float *buf = tx->s->scratch;
        memcpy(buf, old, nfloats * sizeof(float));
        rc = cps__optim_apply(&rec.spec, buf, slots ? buf + n : NULL, grad, n, rec.opt_step + 1);
        if (rc == 0)
            memcpy(p + REC_HDR, buf, nfloats * sizeof(float));
    }
    if (rc) {
        cps__log(CPS_LOG_ERROR, SUB, "param_apply key %llu: optimizer %u refused: %s",
                 (unsigned long long)key, rec.spec.opt_kind, cps_strerror(rc));
        return rc;
    }
    return 0;
}

int cps__store_param_read(cps__txn *tx, uint64_t key, uint32_t len, const float **vals)
{
    cps__param_rec rec;
    MDB_val d;
    int rc = param_lookup(tx, key, &d, &rec, "param_read");
    if (rc)
        return rc;
    if (len != rec.len)
        return CPS_ESIZE;
    *vals = rec.vals;
    return 0;
}

int cps__store_param_put(cps__txn *tx, uint64_t key, const cps__param_rec *rec)
{
    if (!rec || rec->len == 0 || !rec->vals || !kinds_valid(&rec->spec))
        return CPS_EINVAL;
    cps__param_spec c = spec_canon(&rec->spec);
    size_t slots = cps__optim_state_slots(c.opt_kind);
    if (slots && !rec->state)
        return CPS_EINVAL;
    unsigned char *p;
    int rc = rec_reserve(tx, key, rec->len, rec->opt_step, &c, &p, "param_put");
    if (rc)
        return rc;
    size_t nb = (size_t)rec->len * sizeof(float);
    memcpy(p + REC_HDR, rec->vals, nb);
    if (slots)
        memcpy(p + REC_HDR + nb, rec->state, slots * nb);
    return 0;
}

int cps__store_param_reset(cps__txn *tx, uint64_t key, uint32_t len, uint64_t opt_step,
                           const cps__param_spec *spec)
{
    if (len == 0 || !spec || !kinds_valid(spec))
        return CPS_EINVAL;
    cps__param_spec c = spec_canon(spec);
    unsigned char *p;
    int rc = rec_reserve(tx, key, len, opt_step, &c, &p, "param_reset");
    if (rc)
        return rc;
    memset(p + REC_HDR, 0, rec_size(len, c.opt_kind) - REC_HDR);
    tx->wkey = key;
    tx->wrec = p;
    tx->wsize = rec_size(len, c.opt_kind);
    return 0;
}

int cps__store_param_write(cps__txn *tx, uint64_t key, uint32_t slot, uint64_t first,
                           const float *vals, uint64_t n)
{
    cps__param_rec rec;
    MDB_val d;
    int rc = param_lookup(tx, key, &d, &rec, "param_write");
    if (rc)
        return rc;
    size_t slots = cps__optim_state_slots(rec.spec.opt_kind);
    if (slot > slots || first > rec.len || n > rec.len - first)
        return CPS_ESIZE;
    if (!tx->wrec || tx->wkey != key || tx->wsize != d.mv_size) {
        /* Make the record writable: put it again (MDB_RESERVE) with its own bytes. LMDB is
         * copy-on-write, so the old bytes stay readable until the put returns new space, but
         * that space may be the same dirty pages: copy through scratch. */
        size_t size = d.mv_size;
        if ((rc = scratch_reserve(tx->s, (size + 3) / 4)) != 0)
            return rc;
        memcpy(tx->s->scratch, d.mv_data, size);
        MDB_val k = {sizeof key, &key};
        MDB_val w = {size, NULL};
        tx->wrec = NULL;
        if ((rc = mdb_put(tx->t, tx->s->params, &k, &w, MDB_RESERVE)) != 0)
            return lmdb_fail(tx, "param_write", key, rc);
        memcpy(w.mv_data, tx->s->scratch, size);
        tx->wkey = key;
        tx->wrec = w.mv_data;
        tx->wsize = size;
    }
    memcpy(tx->wrec + REC_HDR + ((size_t)slot * rec.len + first) * sizeof(float), vals,
           n * sizeof(float));
    return 0;
}

int cps__store_snapshot_begin(cps__store *s, cps__txn **out)
{
    if (s->poisoned)
        return CPS_EPOISONED;
    cps__txn *tx = calloc(1, sizeof *tx);
    if (!tx)
        return CPS_ENOMEM;
    tx->s = s;
    pthread_rwlock_rdlock(&s->map_lock);
    int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &tx->t);
    if (rc) {
        pthread_rwlock_unlock(&s->map_lock);
        free(tx);
        return env_fail(s, "mdb_txn_begin (snapshot)", rc);
    }
    *out = tx;
    return 0;
}

void cps__store_snapshot_end(cps__txn *tx)
{
    if (!tx)
        return;
    mdb_txn_abort(tx->t);
    pthread_rwlock_unlock(&tx->s->map_lock);
    free(tx);
}

int cps__store_param_scan(cps__txn *tx, uint64_t lo, uint64_t hi, cps__param_iter_fn fn, void *arg)
{
    if (lo > hi)
        return 0;
    MDB_cursor *cur;
    int rc = mdb_cursor_open(tx->t, tx->s->params, &cur);
    if (rc)
        return lmdb_fail(tx, "param_scan (cursor)", lo, rc);
    MDB_val k = {sizeof lo, &lo}, d;
    int ret = 0;
    for (rc = mdb_cursor_get(cur, &k, &d, MDB_SET_RANGE); rc == 0;
         rc = mdb_cursor_get(cur, &k, &d, MDB_NEXT)) {
        uint64_t key;
        if (k.mv_size != sizeof key) {
            cps__log(CPS_LOG_ERROR, SUB, "param_scan: key of %zu bytes", k.mv_size);
            ret = CPS_ECORRUPT;
            break;
        }
        memcpy(&key, k.mv_data, sizeof key);
        if (key > hi)
            break;
        cps__param_rec rec;
        if ((ret = rec_decode(&d, key, &rec)) != 0)
            break;
        if ((ret = fn(arg, key, &rec)) != 0)
            break;
    }
    if (ret == 0 && rc != 0 && rc != MDB_NOTFOUND)
        ret = lmdb_fail(tx, "param_scan", lo, rc);
    mdb_cursor_close(cur);
    return ret;
}

/* ---- ranges, dedup, meta ---- */

int cps__store_range_get(cps__txn *tx, uint32_t range, cps__range_meta *out)
{
    MDB_val k = {sizeof range, &range}, d;
    int rc = mdb_get(tx->t, tx->s->ranges, &k, &d);
    if (rc == MDB_NOTFOUND) {
        out->seq = out->step = 0;
        return 0;
    }
    if (rc)
        return lmdb_fail(tx, "range_get", range, rc);
    if (d.mv_size != 16) {
        cps__log(CPS_LOG_ERROR, SUB, "corrupt range meta, range %u (%zu bytes)", range, d.mv_size);
        return CPS_ECORRUPT;
    }
    out->seq = cps__le64_get(d.mv_data);
    out->step = cps__le64_get((const unsigned char *)d.mv_data + 8);
    return 0;
}

int cps__store_range_put(cps__txn *tx, uint32_t range, const cps__range_meta *m)
{
    unsigned char v[16];
    cps__le64_put(v, m->seq);
    cps__le64_put(v + 8, m->step);
    MDB_val k = {sizeof range, &range}, d = {sizeof v, v};
    int rc = mdb_put(tx->t, tx->s->ranges, &k, &d, 0);
    return rc ? lmdb_fail(tx, "range_put", range, rc) : 0;
}

/* One u64 key per (range, worker), range in the high half: a range's entries are adjacent. */
static uint64_t dedup_key(uint32_t range, uint32_t worker)
{
    return (uint64_t)range << 32 | worker;
}

int cps__store_dedup_get(cps__txn *tx, uint32_t range, uint32_t worker, uint64_t *seq)
{
    uint64_t key = dedup_key(range, worker);
    MDB_val k = {sizeof key, &key}, d;
    int rc = mdb_get(tx->t, tx->s->dedup, &k, &d);
    if (rc == MDB_NOTFOUND) {
        *seq = 0;
        return 0;
    }
    if (rc)
        return lmdb_fail(tx, "dedup_get", key, rc);
    if (d.mv_size != 8) {
        cps__log(CPS_LOG_ERROR, SUB, "corrupt dedup entry, range %u worker %u", range, worker);
        return CPS_ECORRUPT;
    }
    *seq = cps__le64_get(d.mv_data);
    return 0;
}

int cps__store_dedup_put(cps__txn *tx, uint32_t range, uint32_t worker, uint64_t seq)
{
    uint64_t key = dedup_key(range, worker);
    unsigned char v[8];
    cps__le64_put(v, seq);
    MDB_val k = {sizeof key, &key}, d = {sizeof v, v};
    int rc = mdb_put(tx->t, tx->s->dedup, &k, &d, 0);
    return rc ? lmdb_fail(tx, "dedup_put", key, rc) : 0;
}

static int meta_name(const char *name, MDB_val *k);

int cps__store_dedup_scan(cps__txn *tx, uint32_t range, cps__dedup_iter_fn fn, void *arg)
{
    uint64_t lo = dedup_key(range, 0), hi = dedup_key(range, UINT32_MAX);
    MDB_cursor *cur;
    int rc = mdb_cursor_open(tx->t, tx->s->dedup, &cur);
    if (rc)
        return lmdb_fail(tx, "dedup_scan (cursor)", lo, rc);
    MDB_val k = {sizeof lo, &lo}, d;
    int ret = 0;
    for (rc = mdb_cursor_get(cur, &k, &d, MDB_SET_RANGE); rc == 0;
         rc = mdb_cursor_get(cur, &k, &d, MDB_NEXT)) {
        uint64_t key;
        if (k.mv_size != sizeof key || d.mv_size != 8) {
            ret = CPS_ECORRUPT;
            break;
        }
        memcpy(&key, k.mv_data, sizeof key);
        if (key > hi)
            break;
        if ((ret = fn(arg, (uint32_t)key, cps__le64_get(d.mv_data))) != 0)
            break;
    }
    if (ret == 0 && rc != 0 && rc != MDB_NOTFOUND)
        ret = lmdb_fail(tx, "dedup_scan", lo, rc);
    mdb_cursor_close(cur);
    return ret;
}

/* Delete every u64 key lo..hi of dbi. */
static int delete_span(cps__txn *tx, MDB_dbi dbi, uint64_t lo, uint64_t hi, const char *op)
{
    tx->wrec = NULL;
    MDB_cursor *cur;
    int rc = mdb_cursor_open(tx->t, dbi, &cur);
    if (rc)
        return lmdb_fail(tx, op, lo, rc);
    for (;;) {
        /* Position afresh after each delete: MDB_GET_CURRENT after deleting the last key of
         * the database answers EINVAL, not MDB_NOTFOUND. */
        uint64_t from = lo;
        MDB_val k = {sizeof from, &from}, d;
        rc = mdb_cursor_get(cur, &k, &d, MDB_SET_RANGE);
        if (rc != 0)
            break;
        uint64_t key;
        if (k.mv_size != sizeof key)
            break;
        memcpy(&key, k.mv_data, sizeof key);
        if (key > hi)
            break;
        if ((rc = mdb_cursor_del(cur, 0)) != 0)
            break;
    }
    mdb_cursor_close(cur);
    return (rc == 0 || rc == MDB_NOTFOUND) ? 0 : lmdb_fail(tx, op, lo, rc);
}

int cps__store_range_clear(cps__txn *tx, uint32_t range, uint64_t lo, uint64_t hi,
                           const char *meta_prefix)
{
    int rc = delete_span(tx, tx->s->params, lo, hi, "range_clear (params)");
    if (rc == 0)
        rc = delete_span(tx, tx->s->dedup, dedup_key(range, 0), dedup_key(range, UINT32_MAX),
                         "range_clear (dedup)");
    if (rc == 0) {
        MDB_val k = {sizeof range, &range}; /* the ranges database has u32 keys */
        int drc = mdb_del(tx->t, tx->s->ranges, &k, NULL);
        if (drc != 0 && drc != MDB_NOTFOUND)
            rc = lmdb_fail(tx, "range_clear (range)", range, drc);
    }
    while (rc == 0 && meta_prefix) {
        /* Delete one at a time: a cursor walk while deleting by name is simpler this way. */
        char first[META_MAX_NAME + 1] = "";
        MDB_cursor *cur;
        if ((rc = mdb_cursor_open(tx->t, tx->s->meta, &cur)) != 0)
            return lmdb_fail(tx, "range_clear (meta)", range, rc);
        size_t plen = strlen(meta_prefix);
        MDB_val k = {plen, (void *)meta_prefix}, d;
        int grc = mdb_cursor_get(cur, &k, &d, MDB_SET_RANGE);
        if (grc == 0 && k.mv_size >= plen && k.mv_size <= META_MAX_NAME &&
            memcmp(k.mv_data, meta_prefix, plen) == 0)
            memcpy(first, k.mv_data, k.mv_size);
        mdb_cursor_close(cur);
        if (!first[0])
            break;
        rc = cps__store_meta_del(tx, first);
    }
    return rc;
}

int cps__store_meta_scan(cps__txn *tx, const char *prefix, cps__meta_iter_fn fn, void *arg)
{
    size_t plen = prefix ? strlen(prefix) : 0;
    MDB_cursor *cur;
    int rc = mdb_cursor_open(tx->t, tx->s->meta, &cur);
    if (rc)
        return lmdb_fail(tx, "meta_scan (cursor)", 0, rc);
    MDB_val k = {plen, (void *)prefix}, d;
    int ret = 0;
    for (rc = plen ? mdb_cursor_get(cur, &k, &d, MDB_SET_RANGE)
                   : mdb_cursor_get(cur, &k, &d, MDB_FIRST);
         rc == 0; rc = mdb_cursor_get(cur, &k, &d, MDB_NEXT)) {
        if (k.mv_size < plen || memcmp(k.mv_data, prefix, plen) != 0)
            break;
        char name[META_MAX_NAME + 1];
        if (k.mv_size > META_MAX_NAME) {
            ret = CPS_ECORRUPT;
            break;
        }
        memcpy(name, k.mv_data, k.mv_size);
        name[k.mv_size] = 0;
        if ((ret = fn(arg, name, d.mv_data, d.mv_size)) != 0)
            break;
    }
    if (ret == 0 && rc != 0 && rc != MDB_NOTFOUND)
        ret = lmdb_fail(tx, "meta_scan", 0, rc);
    mdb_cursor_close(cur);
    return ret;
}

int cps__store_wipe(cps__txn *tx)
{
    MDB_dbi dbs[4] = {tx->s->params, tx->s->ranges, tx->s->dedup, tx->s->meta};
    for (int i = 0; i < 4; i++) {
        int rc = mdb_drop(tx->t, dbs[i], 0);
        if (rc != 0)
            return lmdb_fail(tx, "mdb_drop", 0, rc);
    }
    return 0;
}

int cps__store_meta_del(cps__txn *tx, const char *name)
{
    MDB_val k;
    if (meta_name(name, &k) != 0)
        return CPS_EINVAL;
    int rc = mdb_del(tx->t, tx->s->meta, &k, NULL);
    return (rc == 0 || rc == MDB_NOTFOUND) ? 0 : lmdb_fail(tx, "meta_del", 0, rc);
}

static int meta_name(const char *name, MDB_val *k)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > META_MAX_NAME)
        return CPS_EINVAL;
    k->mv_size = n;
    k->mv_data = (void *)name;
    return 0;
}

#define BLOB_MAX_BYTES (64u << 20)

int cps__store_blob_put(cps__txn *tx, const char *name, const void *buf, size_t len)
{
    MDB_val k, d = {len, (void *)buf};
    if (meta_name(name, &k) != 0 || len > BLOB_MAX_BYTES || (len && !buf))
        return CPS_EINVAL;
    int rc = mdb_put(tx->t, tx->s->meta, &k, &d, 0);
    return rc ? lmdb_fail(tx, "blob_put", 0, rc) : 0;
}

int cps__store_blob_get(cps__txn *tx, const char *name, const void **buf, size_t *len)
{
    MDB_val k, d;
    if (!buf || !len || meta_name(name, &k) != 0)
        return CPS_EINVAL;
    int rc = mdb_get(tx->t, tx->s->meta, &k, &d);
    if (rc == MDB_NOTFOUND)
        return CPS_ENOTFOUND;
    if (rc)
        return lmdb_fail(tx, "blob_get", 0, rc);
    *buf = d.mv_data;
    *len = d.mv_size;
    return 0;
}

int cps__store_meta_get(cps__txn *tx, const char *name, void *buf, size_t *len)
{
    MDB_val k, d;
    if (!len || meta_name(name, &k) != 0)
        return CPS_EINVAL;
    int rc = mdb_get(tx->t, tx->s->meta, &k, &d);
    if (rc == MDB_NOTFOUND)
        return CPS_ENOTFOUND;
    if (rc)
        return lmdb_fail(tx, "meta_get", 0, rc);
    size_t cap = *len;
    *len = d.mv_size;
    if (d.mv_size > cap)
        return CPS_ESIZE;
    if (d.mv_size)
        memcpy(buf, d.mv_data, d.mv_size);
    return 0;
}

int cps__store_meta_put(cps__txn *tx, const char *name, const void *buf, size_t len)
{
    MDB_val k;
    if (meta_name(name, &k) != 0 || len > META_MAX_BYTES || (len && !buf))
        return CPS_EINVAL;
    MDB_val d = {len, (void *)buf};
    int rc = mdb_put(tx->t, tx->s->meta, &k, &d, 0);
    return rc ? lmdb_fail(tx, "meta_put", 0, rc) : 0;
}

/* ---- checksum and counters ---- */

/* One streaming XXH3 over every key and its values: `status --verify` runs it on the server's
 * loop over the whole range, so its speed is the loop's stall (bench_store: 18 GB/s, against
 * 1.1 GB/s for the FNV-1a it replaced). Only replicas of one build compare sums. */
static int checksum_one(void *arg, uint64_t key, const cps__param_rec *rec)
{
    XXH3_state_t *st = arg;
    unsigned char kb[8];
    cps__le64_put(kb, key); /* little-endian so the sum does not depend on the host */
    if (XXH3_64bits_update(st, kb, sizeof kb) != XXH_OK ||
        XXH3_64bits_update(st, rec->vals, (size_t)rec->len * sizeof(float)) != XXH_OK)
        return CPS_EINVAL;
    return 0;
}

int cps__store_checksum(cps__txn *tx, uint64_t lo, uint64_t hi, uint64_t *out)
{
    XXH3_state_t *st = XXH3_createState();
    if (!st)
        return CPS_ENOMEM;
    int rc = XXH3_64bits_reset(st) == XXH_OK ? 0 : CPS_EINVAL;
    if (rc == 0)
        rc = cps__store_param_scan(tx, lo, hi, checksum_one, st);
    if (rc == 0)
        *out = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return rc;
}

static int count_one(void *arg, uint64_t key, const cps__param_rec *rec)
{
    (void)key;
    *(uint64_t *)arg += rec->len;
    return 0;
}

int cps__store_count(cps__txn *tx, uint64_t *keys, uint64_t *values)
{
    MDB_stat st;
    int rc = mdb_stat(tx->t, tx->s->params, &st);
    if (rc)
        return lmdb_fail(tx, "count (stat)", 0, rc);
    uint64_t v = 0;
    if ((rc = cps__store_param_scan(tx, 0, UINT64_MAX, count_one, &v)) != 0)
        return rc;
    if (keys)
        *keys = st.ms_entries;
    if (values)
        *values = v;
    return 0;
}
