#include "job.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "core/port.h"
#include "node/msg.h"
#include "node/roles.h"
#include "transport/auth.h"
#include "transport/ring.h"

#define KILL_GRACE_MS 3000

/* The job's secret: the user's (--secret-file, CHAINPS_SECRET_FILE), or a new one in a private
 * directory removed at the end, unless the job runs --insecure. */
static int make_secret(cps__job *j)
{
    if (!j->cfg.secret_file[0] && !j->cfg.insecure) {
        const char *tmp = getenv("TMPDIR");
        snprintf(j->secret_dir, sizeof j->secret_dir, "%s/chainps-secret-XXXXXX",
                 tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(j->secret_dir)) {
            fprintf(stderr, "chainps: cannot create a directory for the job's secret: %s\n",
                    strerror(errno));
            j->secret_dir[0] = 0;
            return 1;
        }
        char err[768];
        snprintf(j->cfg.secret_file, sizeof j->cfg.secret_file, "%.400s/job.secret", j->secret_dir);
        if (cps__auth_create_file(j->cfg.secret_file, err, sizeof err) != 0) {
            fprintf(stderr, "chainps: %s\n", err);
            return 1;
        }
    }
    /* Loaded here too: the file is checked once, before any process starts, and chaos's own
     * requests carry the key. */
    if (cps__node_load_secret(&j->cfg, "launch") != 0)
        return 1;
    if ((j->cfg.secret_file[0] ? setenv("CHAINPS_SECRET_FILE", j->cfg.secret_file, 1)
                               : unsetenv("CHAINPS_SECRET_FILE")) != 0 ||
        (j->cfg.insecure ? setenv("CHAINPS_INSECURE", "1", 1) : unsetenv("CHAINPS_INSECURE")))
        return 1;
    return 0;
}

/* Where the job's runtime directory goes. Memory first: the shared-memory rings (large same-host
 * messages, transport/ring.h) are made only on a memory file system, since on a disk the kernel
 * writes the hot rings back. So an explicit TMPDIR on tmpfs, then $XDG_RUNTIME_DIR, then
 * /dev/shm, then TMPDIR or /tmp wherever they are. The sockets' paths must fit a Unix socket
 * address (108 bytes with the 22 of their names), and the directory must be ours to write. */
static const char *run_dir_parent(void)
{
    const char *tmp = getenv("TMPDIR"), *xdg = getenv("XDG_RUNTIME_DIR");
    const struct {
        const char *dir;
        int memory_only;
    } cands[] = {{tmp, 1}, {xdg, 1}, {"/dev/shm", 1}, {tmp, 0}};
    for (size_t i = 0; i < sizeof cands / sizeof cands[0]; i++) {
        const char *d = cands[i].dir;
        if (!d || !*d || strlen(d) + sizeof "/chainps-run-XXXXXX" + 22 > 108 ||
            access(d, W_OK | X_OK) != 0)
            continue;
        if (!cands[i].memory_only || cps__ring_dir_in_memory(d))
            return d;
    }
    return "/tmp";
}

/* The job's private runtime directory (mode 0700) for its same-host ipc:// sockets
 * (transport/local.h) and rings, handed to every process as CHAINPS_RUNTIME_DIR. A
 * CHAINPS_RUNTIME_DIR in our environment is the batch scheduler's (or the user's) and is kept as
 * it is; set empty, it turns ipc off, and every channel is tcp://. */
static int make_run_dir(cps__job *j)
{
    if (getenv("CHAINPS_RUNTIME_DIR"))
        return 0;
    snprintf(j->run_dir, sizeof j->run_dir, "%.300s/chainps-run-XXXXXX", run_dir_parent());
    if (!mkdtemp(j->run_dir)) {
        fprintf(stderr, "chainps: cannot create the job's runtime directory: %s\n",
                strerror(errno));
        j->run_dir[0] = 0;
        return 1;
    }
    return setenv("CHAINPS_RUNTIME_DIR", j->run_dir, 1) != 0;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw);

/* The directories the job made for itself (not a --data DIR it was given). */
static void remove_own_dirs(cps__job *j)
{
    if (!j->data_given && j->data[0])
        nftw(j->data, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    if (j->secret_dir[0])
        nftw(j->secret_dir, rm_entry, 4, FTW_DEPTH | FTW_PHYS);
    if (j->run_dir[0]) {
        nftw(j->run_dir, rm_entry, 4, FTW_DEPTH | FTW_PHYS);
        unsetenv("CHAINPS_RUNTIME_DIR");
    }
    j->data[0] = j->secret_dir[0] = j->run_dir[0] = 0;
}

/* An error after the job's directories were made: take them away again, so a job that never
 * started leaves no chainps-job-* or chainps-secret-* behind. Returns 1 (job_init's error). */
static int init_failed(cps__job *j)
{
    remove_own_dirs(j);
    return 1;
}

int cps__job_init(cps__job *j, const cps__config *cfg, int data_given, int port, char **prog)
{
    memset(j, 0, sizeof *j);
    j->cfg = *cfg;
    j->S = (int)cfg->num_servers;
    j->W = (int)cfg->num_workers;
    j->prog = prog;
    j->data_given = data_given;
    j->prefix = "";
    if (data_given) {
        snprintf(j->data, sizeof j->data, "%s", cfg->data_dir);
        if (mkdir(j->data, 0755) != 0 && errno != EEXIST) {
            fprintf(stderr, "chainps: cannot create %s: %s\n", j->data, strerror(errno));
            return 1;
        }
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(j->data, sizeof j->data, "%s/chainps-job-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(j->data)) {
            fprintf(stderr, "chainps: cannot create a data directory: %s\n", strerror(errno));
            return 1;
        }
    }
    if (make_secret(j) != 0 || make_run_dir(j) != 0)
        return init_failed(j);
    j->port = port ? port : cps__free_port();
    if (j->port <= 0) {
        fprintf(stderr, "chainps: no free port on 127.0.0.1\n");
        return init_failed(j);
    }
    ssize_t sl = readlink("/proc/self/exe", j->self, sizeof j->self - 1);
    if (sl <= 0) {
        fprintf(stderr, "chainps: cannot find the chainps executable\n");
        return init_failed(j);
    }
    j->self[sl] = 0;
    cps__config_mode_str(cfg->mode, cfg->ssp_bound, j->mode, sizeof j->mode);
    snprintf(j->repl, sizeof j->repl, "%u",
             cfg->replicas ? cfg->replicas : (j->S < 3 ? (uint32_t)j->S : 3u));
    j->n = 1 + j->S + j->W;
    j->kids = calloc((size_t)j->n, sizeof *j->kids);
    if (!j->kids)
        return init_failed(j);
    for (int i = 0; i < j->n; i++) {
        cps__child *c = &j->kids[i];
        c->fd = -1;
        if (i == 0) {
            snprintf(c->tag, sizeof c->tag, "scheduler");
            c->role = CPS_ROLE_SCHEDULER;
        } else if (i <= j->S) {
            snprintf(c->tag, sizeof c->tag, "server %d", i - 1);
            c->role = CPS_ROLE_SERVER;
        } else {
            snprintf(c->tag, sizeof c->tag, "worker %d", i - 1 - j->S);
            c->role = CPS_ROLE_WORKER;
        }
    }
    return 0;
}

/* Copy the token after the last `key` in text[0..n) into out: lowercase hex digits, or a lone
 * "-" when dash_ok. Leaves out alone where key does not occur. */
static void note_hex(char *out, size_t cap, const char *key, int dash_ok, const char *text,
                     size_t n)
{
    size_t klen = strlen(key);
    for (size_t i = 0; i + klen < n; i++) {
        if (memcmp(text + i, key, klen) != 0)
            continue;
        size_t k = 0, p = i + klen;
        if (dash_ok && text[p] == '-') {
            out[k++] = '-';
        } else {
            while (p < n && k + 1 < cap &&
                   ((text[p] >= '0' && text[p] <= '9') || (text[p] >= 'a' && text[p] <= 'f')))
                out[k++] = text[p++];
        }
        out[k] = 0;
    }
}

/* Remember the last checksum and trajectory a worker printed: chaos compares runs with them. */
static void note_checksum(cps__child *c, const char *text, size_t n)
{
    note_hex(c->last_checksum, sizeof c->last_checksum, "checksum ", 0, text, n);
    note_hex(c->last_trajectory, sizeof c->last_trajectory, "trajectory ", 1, text, n);
}

/* Keep the first ERROR line of a chainps process (the log's "... ERROR subsystem: text"): when
 * the scheduler refuses a job, it is the reason launch reports. */
static void note_error(cps__child *c, const char *text, size_t n)
{
    static const char key[] = " ERROR ";
    if (c->first_error[0] || c->role == CPS_ROLE_WORKER)
        return;
    for (size_t i = 0; i + sizeof key - 1 <= n; i++) {
        if (memcmp(text + i, key, sizeof key - 1) != 0)
            continue;
        size_t from = i + sizeof key - 1;
        snprintf(c->first_error, sizeof c->first_error, "%.*s", (int)(n - from), text + from);
        return;
    }
}

/* The number after `key` in text[0..n), or -1. */
static long number_after(const char *text, size_t n, const char *key)
{
    size_t k = strlen(key);
    for (size_t i = 0; i + k < n; i++) {
        if (memcmp(text + i, key, k) != 0)
            continue;
        long v = 0;
        size_t d = i + k;
        if (d >= n || text[d] < '0' || text[d] > '9')
            return -1;
        for (; d < n && text[d] >= '0' && text[d] <= '9' && v < 100000; d++)
            v = v * 10 + (text[d] - '0');
        return v;
    }
    return -1;
}

static void note_repair(cps__job *j, const cps__child *c, const char *text, size_t n)
{
    if (c->role != CPS_ROLE_SCHEDULER)
        return;
    long r = number_after(text, n, "scheduler: range ");
    if (r >= 0 && r < 256 && number_after(text, n, " has ") >= 0 &&
        memmem(text, n, " replicas: server ", strlen(" replicas: server "))) {
        j->short_ranges[r / 64] |= UINT64_C(1) << (r % 64);
        j->repairing = 1;
        return;
    }
    if (!memmem(text, n, " as its tail", strlen(" as its tail")))
        return;
    r = number_after(text, n, " joined range ");
    if (r < 0 || r >= 256)
        return;
    j->short_ranges[r / 64] &= ~(UINT64_C(1) << (r % 64));
    if (j->repairing &&
        !(j->short_ranges[0] | j->short_ranges[1] | j->short_ranges[2] | j->short_ranges[3])) {
        j->repairing = 0;
        j->repaired_ms = cps__now_ms();
    }
}

static void print_line(cps__job *j, cps__child *c, const char *text, size_t n)
{
    note_checksum(c, text, n);
    note_error(c, text, n);
    note_repair(j, c, text, n);
    if (j->quiet)
        return;
    /* One write per line so lines of different processes never interleave. */
    char out[4300];
    int k = snprintf(out, sizeof out, "%s[%s] %.*s\n", j->prefix, c->tag, (int)n, text);
    if (k > 0)
        fwrite(out, 1, (size_t)k < sizeof out ? (size_t)k : sizeof out - 1, stdout);
    fflush(stdout);
}

static void drain(cps__job *j, cps__child *c)
{
    char buf[8192];
    ssize_t n = read(c->fd, buf, sizeof buf);
    if (n <= 0) {
        if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
            if (c->linelen)
                print_line(j, c, c->line, c->linelen);
            c->linelen = 0;
            close(c->fd);
            c->fd = -1;
        }
        return;
    }
    for (ssize_t i = 0; i < n; i++) {
        if (buf[i] == '\n' || c->linelen == sizeof c->line) {
            print_line(j, c, c->line, c->linelen);
            c->linelen = 0;
            if (buf[i] == '\n')
                continue;
        }
        c->line[c->linelen++] = buf[i];
    }
}

static int spawn(cps__child *c, char *const argv[], char *const env_add[])
{
    int p[2];
    if (pipe(p) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(p[1], 1);
        dup2(p[1], 2);
        close(p[0]);
        close(p[1]);
        /* The job's own variables win over anything a ps-lite or MindSpore script exported. */
        static const char *aliases[] = {"DMLC_ROLE",
                                        "DMLC_PS_ROOT_URI",
                                        "DMLC_PS_ROOT_PORT",
                                        "DMLC_NUM_SERVER",
                                        "DMLC_NUM_WORKER",
                                        "MS_ROLE",
                                        "MS_SCHED_HOST",
                                        "MS_SCHED_PORT",
                                        "MS_SERVER_NUM",
                                        "MS_WORKER_NUM",
                                        "CHAINPS_PORT",
                                        "CHAINPS_RANK",
                                        NULL};
        for (int i = 0; aliases[i]; i++)
            unsetenv(aliases[i]);
        for (int i = 0; env_add && env_add[i]; i++)
            putenv(env_add[i]);
        execvp(argv[0], argv);
        fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(p[1]);
    if (c->fd >= 0)
        close(c->fd); /* a restart: the old pipe's reader goes */
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    fcntl(p[0], F_SETFD, FD_CLOEXEC);
    c->pid = pid;
    c->fd = p[0];
    c->exited = 0;
    c->status = 0;
    c->linelen = 0;
    c->first_error[0] = 0;
    c->starts++;
    return 0;
}

int cps__job_start(cps__job *j, int i)
{
    /* Each child's environment: the job's settings in CHAINPS_* form. Kept in the job so the
     * strings outlive putenv in the child (the child copies them on exec anyway). */
    static char env[12][200];
    static char restore_env[PATH_MAX + 32];
    char sched[64], port_s[16], sv_s[16], wk_s[16];
    snprintf(sched, sizeof sched, "127.0.0.1:%d", j->port);
    snprintf(port_s, sizeof port_s, "%d", j->port);
    snprintf(sv_s, sizeof sv_s, "%d", j->S);
    snprintf(wk_s, sizeof wk_s, "%d", j->W);
    int k = 0;
    snprintf(env[k++], sizeof env[0], "CHAINPS_SCHEDULER=%s", sched);
    snprintf(env[k++], sizeof env[0], "CHAINPS_NUM_SERVERS=%d", j->S);
    snprintf(env[k++], sizeof env[0], "CHAINPS_NUM_WORKERS=%d", j->W);
    snprintf(env[k++], sizeof env[0], "CHAINPS_MODE=%s", j->mode);
    if (j->cfg.backup_workers) /* the scheduler puts it in the view */
        snprintf(env[k++], sizeof env[0], "CHAINPS_BACKUP_WORKERS=%u", j->cfg.backup_workers);
    snprintf(env[k++], sizeof env[0], "CHAINPS_VERBOSE=%d", j->cfg.verbose);
    char compress[48];
    snprintf(env[k++], sizeof env[0], "CHAINPS_COMPRESS=%s",
             cps__config_compress_str(&j->cfg, compress, sizeof compress));
    snprintf(env[k++], sizeof env[0], "CHAINPS_BIND=127.0.0.1");
    snprintf(env[k++], sizeof env[0], "CHAINPS_ADVERTISE=127.0.0.1");
    cps__child *c = &j->kids[i];
    if (c->role == CPS_ROLE_SCHEDULER)
        snprintf(env[k++], sizeof env[0], "CHAINPS_ROLE=scheduler");
    else if (c->role == CPS_ROLE_SERVER)
        snprintf(env[k++], sizeof env[0], "CHAINPS_ROLE=server");
    else {
        snprintf(env[k++], sizeof env[0], "CHAINPS_ROLE=worker");
        snprintf(env[k++], sizeof env[0], "CHAINPS_RANK=%d", i - 1 - j->S);
        /* Where the workers take their local tensors back from (cps_local_fetch). */
        char abs[PATH_MAX];
        if (j->cfg.restore_from[0])
            snprintf(restore_env, sizeof restore_env, "CHAINPS_RESTORE_FROM=%s",
                     realpath(j->cfg.restore_from, abs) ? abs : j->cfg.restore_from);
    }
    char *envp[14];
    for (int e = 0; e < k; e++)
        envp[e] = env[e];
    if (c->role == CPS_ROLE_WORKER && restore_env[0])
        envp[k++] = restore_env;
    envp[k] = NULL;
    if (c->role == CPS_ROLE_SCHEDULER) {
        char every[32], keep[16];
        char *av[32] = {j->self,     "scheduler", "--port", port_s,  "--servers",  sv_s,
                        "--workers", wk_s,        "--mode", j->mode, "--replicas", j->repl,
                        "--bind",    "127.0.0.1", "--data", j->data};
        int a = 16;
        if (j->cfg.num_ranges) {
            snprintf(j->ranges, sizeof j->ranges, "%u", j->cfg.num_ranges);
            av[a++] = "--ranges";
            av[a++] = j->ranges;
        }
        if (j->hold)
            av[a++] = "--hold";
        if (j->await_replacements)
            av[a++] = "--await-replacements";
        if (j->cfg.ckpt_every) {
            snprintf(every, sizeof every, "%llu%s", (unsigned long long)j->cfg.ckpt_every,
                     j->cfg.ckpt_every_seconds ? "s" : "");
            av[a++] = "--checkpoint-every";
            av[a++] = every;
            /* Not under the data directory: a launch without --data removes that at the end. */
            av[a++] = "--checkpoint-dir";
            av[a++] = j->cfg.ckpt_dir[0] ? j->cfg.ckpt_dir : "chainps-checkpoints";
            if (j->cfg.ckpt_keep) {
                snprintf(keep, sizeof keep, "%u", j->cfg.ckpt_keep);
                av[a++] = "--keep";
                av[a++] = keep;
            }
        }
        /* A scheduler restarted by chaos resumes its job: the restore ran already. */
        if (j->cfg.restore_from[0] && !c->starts) {
            av[a++] = "--restore-from";
            av[a++] = j->cfg.restore_from;
            if (j->cfg.restore_optim[0]) {
                av[a++] = "--restore-optimizer";
                av[a++] = j->cfg.restore_optim;
            }
        }
        char mport[16];
        if (j->cfg.metrics_port) {
            snprintf(mport, sizeof mport, "%u", j->cfg.metrics_port);
            av[a++] = "--metrics-port";
            av[a++] = mport;
        }
        av[a] = NULL;
        return spawn(c, av, envp);
    }
    if (c->role == CPS_ROLE_SERVER) {
        char dir[600], rank[16], mport[16];
        snprintf(dir, sizeof dir, "%s/server-%d", j->data, i - 1);
        snprintf(rank, sizeof rank, "%d", i - 1);
        /* Server i at BASE+1+i: fixed per rank, so a restarted server is scraped where it was. */
        snprintf(mport, sizeof mport, "%u",
                 j->cfg.metrics_port ? j->cfg.metrics_port + (unsigned)i : 0u);
        char *av[] = {j->self,          "server",    "--scheduler", sched,
                      "--data",         dir,         "--rank",      rank,
                      "--bind",         "127.0.0.1", "--advertise", "127.0.0.1",
                      "--metrics-port", mport,       NULL};
        return spawn(c, av, envp);
    }
    return spawn(c, j->prog, envp);
}

int cps__job_start_all(cps__job *j)
{
    for (int i = 0; i < j->n; i++)
        if (cps__job_start(j, i) != 0) {
            fprintf(stderr, "chainps: could not start %s: %s\n", j->kids[i].tag, strerror(errno));
            return 1;
        }
    return 0;
}

static void reap(cps__job *j)
{
    for (int i = 0; i < j->n; i++) {
        cps__child *c = &j->kids[i];
        if (c->exited || c->pid <= 0)
            continue;
        int st;
        if (waitpid(c->pid, &st, WNOHANG) == c->pid) {
            c->exited = 1;
            c->status = st;
        }
    }
}

void cps__job_pump(cps__job *j, int timeout_ms)
{
    struct pollfd pfd[1100];
    int map[1100], k = 0;
    for (int i = 0; i < j->n && k < 1100; i++) {
        if (j->kids[i].fd >= 0) {
            pfd[k] = (struct pollfd){.fd = j->kids[i].fd, .events = POLLIN};
            map[k++] = i;
        }
    }
    if (k == 0) {
        struct timespec ts = {0, (long)timeout_ms * 1000000L};
        nanosleep(&ts, NULL);
    } else if (poll(pfd, (nfds_t)k, timeout_ms) > 0) {
        for (int q = 0; q < k; q++)
            if (pfd[q].revents)
                drain(j, &j->kids[map[q]]);
    }
    reap(j);
}

void cps__job_stop(cps__job *j, int first, int last, int grace_ms)
{
    uint64_t deadline = cps__now_ms() + (uint64_t)grace_ms;
    for (int phase = 0; phase < 3; phase++) {
        for (;;) {
            int alive = 0;
            for (int i = first; i < last; i++)
                alive += j->kids[i].pid > 0 && !j->kids[i].exited;
            if (!alive)
                return;
            if (cps__now_ms() >= deadline)
                break;
            cps__job_pump(j, 50);
        }
        int sig = phase == 0 ? SIGTERM : SIGKILL;
        for (int i = first; i < last; i++) {
            cps__child *c = &j->kids[i];
            if (c->pid > 0 && !c->exited) {
                kill(c->pid, SIGCONT); /* a paused process cannot act on SIGTERM */
                kill(c->pid, sig);
            }
        }
        deadline = cps__now_ms() + KILL_GRACE_MS;
    }
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

void cps__job_fini(cps__job *j)
{
    for (;;) {
        int open = 0;
        for (int i = 0; i < j->n; i++)
            open += j->kids[i].fd >= 0;
        if (!open)
            break;
        cps__job_pump(j, 50);
    }
    remove_own_dirs(j);
    free(j->kids);
    j->kids = NULL;
}

const char *cps__job_exit_text(int st, char *buf, size_t len)
{
    if (WIFEXITED(st))
        snprintf(buf, len, "exit status %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        snprintf(buf, len, "killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        snprintf(buf, len, "status %d", st);
    return buf;
}

int cps__job_refused(const cps__job *j, int i)
{
    const cps__child *c = &j->kids[i];
    return c->exited && WIFEXITED(c->status) &&
           (WEXITSTATUS(c->status) == CPS_CLI_EXIT_REFUSED || WEXITSTATUS(c->status) == 2);
}

int cps__job_ok(const cps__job *j, int i)
{
    const cps__child *c = &j->kids[i];
    return c->exited && WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0;
}
