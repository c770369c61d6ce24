/* Multi-process test harness (see cluster.h). */
#include "cluster.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "transport/auth.h"

#ifndef CHAINPS_BIN
#error "CHAINPS_BIN must name the chainps executable"
#endif

#define MAX_PROCS 256
#define POLL_MS   10

extern char **environ;

typedef struct proc {
    pid_t pid;
    int exited;
    int status;
    char name[64];
    char log[600];
} proc;

static proc procs[MAX_PROCS];
static int nprocs;
static char secret_path[700];
static char secret_env[760];
static unsigned char secret_key[32];
static char test_dir[512];
static int keep_dir;
static int hooks_installed;

uint64_t h_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void nap(void)
{
    struct timespec ts = {0, POLL_MS * 1000000L};
    nanosleep(&ts, NULL);
}

static proc *find(pid_t pid)
{
    for (int i = 0; i < nprocs; i++)
        if (procs[i].pid == pid)
            return &procs[i];
    return NULL;
}

/* Reap without blocking; 1 if the process has exited. */
static int reap(proc *p)
{
    if (!p)
        return 1;
    if (p->exited)
        return 1;
    int st;
    pid_t r = waitpid(p->pid, &st, WNOHANG);
    if (r == p->pid || (r < 0 && errno == ECHILD)) {
        p->exited = 1;
        p->status = r == p->pid ? st : 0;
    }
    return p->exited;
}

void h_kill_all(void)
{
    /* Only kill() and waitpid() here: this also runs inside a signal handler. The process group
     * goes too, so grandchildren (launch's scheduler, servers, workers) never outlive the test. */
    for (int i = 0; i < nprocs; i++) {
        if (procs[i].exited)
            continue;
        kill(-procs[i].pid, SIGKILL);
        kill(procs[i].pid, SIGKILL);
    }
    for (int i = 0; i < nprocs; i++) {
        if (procs[i].exited)
            continue;
        int st;
        if (waitpid(procs[i].pid, &st, 0) == procs[i].pid) {
            procs[i].exited = 1;
            procs[i].status = st;
        }
    }
}

static void on_signal(int sig)
{
    h_kill_all();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "harness: watchdog: the test is stuck; killing every process\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    h_kill_all();
    _exit(1);
}

void h_watchdog(unsigned seconds)
{
    alarm(seconds);
}

static void install_hooks(void)
{
    if (hooks_installed)
        return;
    hooks_installed = 1;
    atexit(h_kill_all);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, NULL);
    /* A child's inbox closing under a raw socket write must not kill the test. */
    signal(SIGPIPE, SIG_IGN);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

const char *h_test_begin(const char *name)
{
    install_hooks();
    const char *tmp = getenv("TMPDIR");
    snprintf(test_dir, sizeof test_dir, "%s/cps-it-%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", name);
    if (!mkdtemp(test_dir)) {
        fprintf(stderr, "harness: mkdtemp %s: %s\n", test_dir, strerror(errno));
        abort();
    }
    keep_dir = getenv("CHAINPS_IT_KEEP") && !strcmp(getenv("CHAINPS_IT_KEEP"), "1");
    char err[768];
    snprintf(secret_path, sizeof secret_path, "%s/job.secret", test_dir);
    snprintf(secret_env, sizeof secret_env, "CHAINPS_SECRET_FILE=%s", secret_path);
    if (cps__auth_create_file(secret_path, err, sizeof err) != 0 ||
        cps__auth_load_file(secret_path, secret_key, err, sizeof err) != 0) {
        fprintf(stderr, "harness: %s\n", err);
        abort();
    }
    /* For a test that is a worker itself (cps_open in this process). */
    setenv("CHAINPS_SECRET_FILE", secret_path, 1);
    return test_dir;
}

const char *h_secret_file(void)
{
    return secret_path;
}

const unsigned char *h_key(void)
{
    return secret_key;
}

void h_test_keep(void)
{
    keep_dir = 1;
}

const char *h_dir(void)
{
    return test_dir;
}

/* 1 if the log holds an AddressSanitizer, LeakSanitizer or UBSan report. */
static int sanitizer_report(const proc *p)
{
    static const char *marks[] = {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                                  "runtime error:", NULL};
    char *log = h_read_log(p->pid);
    int found = 0;
    for (int i = 0; marks[i] && !found; i++)
        found = strstr(log, marks[i]) != NULL;
    if (found)
        fprintf(stderr, "harness: sanitizer report in %s:\n%s\n", p->log, log);
    free(log);
    return found;
}

float h_dyadic_grad(size_t i, int step)
{
    return (float)((int)((i * 7 + (size_t)step * 3) % 9) - 4) * 0.0625f;
}

int h_push_dyadic(cps_client *c, cps_tensor *t, float *g, float *expect, size_t len, float lr,
                  int step)
{
    for (size_t i = 0; i < len; i++) {
        g[i] = h_dyadic_grad(i, step);
        expect[i] -= lr * g[i];
    }
    return cps_push(c, t, g, len);
}

int h_setup(void **state)
{
    const h_fixture *f = *state;
    h_test_begin(f->name);
    h_watchdog(f->watchdog_s);
    return 0;
}

int h_teardown(void **state)
{
    (void)state;
    return h_test_end() == 0 ? 0 : -1;
}

int h_test_end(void)
{
    alarm(0);
    h_kill_all();
    int reports = 0;
    for (int i = 0; i < nprocs; i++) {
        int dup = 0; /* a restarted process shares its log with the first run */
        for (int j = 0; j < i; j++)
            dup |= !strcmp(procs[j].log, procs[i].log);
        if (!dup)
            reports += sanitizer_report(&procs[i]);
    }
    if (reports)
        keep_dir = 1;
    nprocs = 0;
    if (!test_dir[0])
        return reports;
    if (keep_dir)
        fprintf(stderr, "harness: logs kept in %s\n", test_dir);
    else
        nftw(test_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    test_dir[0] = 0;
    return reports;
}

static int drop_var(const char *kv)
{
    static const char *prefixes[] = {"CHAINPS_", "DMLC_", "MS_", "PS_VERBOSE", NULL};
    for (int i = 0; prefixes[i]; i++)
        if (!strncmp(kv, prefixes[i], strlen(prefixes[i])))
            return 1;
    return 0;
}

pid_t h_spawn(const char *name, char *const argv[], char *const env[], const char *cwd)
{
    install_hooks();
    if (nprocs == MAX_PROCS) {
        fprintf(stderr, "harness: too many processes\n");
        return -1;
    }
    proc *p = &procs[nprocs];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    snprintf(p->log, sizeof p->log, "%s/%s.log", test_dir, name);
    /* Build everything the child needs before fork: the test process may have nanomsg threads,
     * so the child calls only async-signal-safe functions until exec. */
    size_t n = 0, k = 0;
    int own_secret = 0;
    while (environ[n])
        n++;
    for (size_t i = 0; env && env[i]; i++, k++)
        own_secret |= !strncmp(env[i], "CHAINPS_SECRET_FILE=", 20) ||
                      !strncmp(env[i], "CHAINPS_INSECURE=", 17);
    char **envp = calloc(n + k + 2, sizeof *envp);
    if (!envp)
        return -1;
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (!drop_var(environ[i]))
            envp[m++] = environ[i];
    if (!own_secret && secret_path[0])
        envp[m++] = secret_env;
    for (size_t i = 0; i < k; i++)
        envp[m++] = env[i];
    envp[m] = NULL;
    const char *dir = cwd ? cwd : test_dir;
    int fd = open(p->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "harness: open %s: %s\n", p->log, strerror(errno));
        free(envp);
        return -1;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(126);
        /* The test ignores SIGPIPE; the child starts with the default disposition. */
        signal(SIGPIPE, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        dup2(fd, 1);
        dup2(fd, 2);
        if (chdir(dir) != 0)
            _exit(126);
        execve(argv[0], argv, envp);
        static const char msg[] = "harness: exec failed\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
        _exit(127);
    }
    close(fd);
    free(envp);
    if (pid < 0) {
        fprintf(stderr, "harness: fork: %s\n", strerror(errno));
        return -1;
    }
    /* Also from the parent, so a kill(-pid) right after this call cannot miss the group. */
    setpgid(pid, pid);
    p->pid = pid;
    nprocs++;
    return pid;
}

const char *h_log_path(pid_t pid)
{
    proc *p = find(pid);
    return p ? p->log : NULL;
}

char *h_read_log(pid_t pid)
{
    const char *path = h_log_path(pid);
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (!f)
        return calloc(1, 1);
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += r;
        if (cap - len - 1 == 0) {
            char *grown = realloc(buf, cap * 2);
            if (!grown) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = grown;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf)
        buf[len] = 0;
    return buf ? buf : calloc(1, 1);
}

int h_log_count(pid_t pid, const char *needle)
{
    char *log = h_read_log(pid);
    int n = 0;
    size_t nl = strlen(needle);
    for (const char *p = log; nl && (p = strstr(p, needle)) != NULL; p += nl)
        n++;
    free(log);
    return n;
}

static void print_tail(pid_t pid)
{
    char *log = h_read_log(pid);
    size_t len = strlen(log);
    const char *start = len > 3000 ? log + len - 3000 : log;
    proc *p = find(pid);
    fprintf(stderr, "---- tail of %s (pid %d) ----\n%s\n---- end ----\n", p ? p->log : "?",
            (int)pid, start);
    free(log);
}

int h_wait_log(pid_t pid, const char *needle, int count, int timeout_ms)
{
    uint64_t deadline = h_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        int exited = reap(find(pid));
        if (h_log_count(pid, needle) >= count)
            return 1;
        /* Read once more after the exit was seen: the last lines may have landed in between. */
        if (exited || h_now_ms() >= deadline) {
            fprintf(stderr, "harness: %s: '%s' x%d not in the log of pid %d\n",
                    exited ? "process exited" : "timed out", needle, count, (int)pid);
            print_tail(pid);
            return 0;
        }
        nap();
    }
}

int h_wait_exit(pid_t pid, int timeout_ms, int *status)
{
    proc *p = find(pid);
    if (!p)
        return 0;
    uint64_t deadline = h_now_ms() + (uint64_t)timeout_ms;
    while (!reap(p)) {
        if (h_now_ms() >= deadline)
            return 0;
        nap();
    }
    if (status)
        *status = p->status;
    return 1;
}

int h_alive(pid_t pid)
{
    return !reap(find(pid));
}

int h_exit_code(pid_t pid)
{
    proc *p = find(pid);
    if (!p)
        return -1000;
    if (!reap(p))
        return -1000;
    if (WIFEXITED(p->status))
        return WEXITSTATUS(p->status);
    if (WIFSIGNALED(p->status))
        return -1 - WTERMSIG(p->status);
    return -999;
}

void h_kill(pid_t pid, int grace_ms)
{
    proc *p = find(pid);
    if (!p || reap(p))
        return;
    kill(-pid, SIGTERM);
    if (h_wait_exit(pid, grace_ms, NULL))
        return;
    h_kill_hard(pid);
}

void h_kill_hard(pid_t pid)
{
    proc *p = find(pid);
    if (!p || reap(p))
        return;
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    int st;
    if (waitpid(pid, &st, 0) == pid) {
        p->exited = 1;
        p->status = st;
    }
}

int h_run(const char *name, char *const argv[], char *const env[], int timeout_ms, pid_t *pid_out)
{
    pid_t pid = h_spawn(name, argv, env, NULL);
    if (pid_out)
        *pid_out = pid;
    if (pid < 0)
        return -1000;
    if (!h_wait_exit(pid, timeout_ms, NULL)) {
        fprintf(stderr, "harness: %s did not exit within %d ms\n", name, timeout_ms);
        print_tail(pid);
        h_kill(pid, 1000);
        return -1000;
    }
    return h_exit_code(pid);
}

int h_wait_listening(pid_t sched, int timeout_ms)
{
    uint64_t deadline = h_now_ms() + (uint64_t)timeout_ms;
    while (h_now_ms() < deadline) {
        if (h_log_count(sched, "listening on") > 0)
            return 0;
        if (h_log_count(sched, "cannot listen") > 0) {
            h_kill(sched, 1000);
            return 1;
        }
        usleep(20000);
    }
    return -1;
}

int h_start_role_job(const char *tag, const char *role_var, const char *const roles[5],
                     const char *port_var, char *const vars[], char *const argv[], int shared_cwd,
                     int timeout_ms, pid_t pids[5])
{
    char port[64];
    snprintf(port, sizeof port, "%s=%d", port_var, cps__free_port());
    for (int i = 0; i < 5; i++) {
        char name[128], role[64], cwd[700];
        snprintf(name, sizeof name, "%s-%d-%s", tag, i, roles[i]);
        snprintf(role, sizeof role, "%s=%s", role_var, roles[i]);
        snprintf(cwd, sizeof cwd, "%s/%s", h_dir(), shared_cwd ? tag : name);
        mkdir(cwd, 0755);
        char *env[16];
        int k = 0;
        env[k++] = role;
        env[k++] = port;
        for (int j = 0; vars && vars[j] && k < 15; j++)
            env[k++] = vars[j];
        env[k] = NULL;
        pids[i] = h_spawn(name, argv, env, cwd);
        if (pids[i] <= 0)
            return -1;
        /* Nodes retry their HELLO, so only the scheduler has to be up first. */
        if (i == 0) {
            int l = h_wait_listening(pids[0], timeout_ms);
            if (l != 0)
                return l;
        }
    }
    return 0;
}

/* ---- cluster ---- */

int h_start_scheduler(h_cluster *c, int servers, int workers, const char *mode,
                      const char *const extra[])
{
    return h_start_scheduler_env(c, servers, workers, mode, extra, NULL);
}

int h_start_scheduler_env(h_cluster *c, int servers, int workers, const char *mode,
                          const char *const extra[], char *const env[])
{
    char sv[16], wk[16], port[16];
    snprintf(sv, sizeof sv, "%d", servers);
    snprintf(wk, sizeof wk, "%d", workers);
    /* A port found free can be taken before the scheduler binds it: try again then. */
    for (int attempt = 0; attempt < 5; attempt++) {
        c->port = cps__free_port();
        if (c->port <= 0)
            continue;
        snprintf(port, sizeof port, "%d", c->port);
        snprintf(c->sched_addr, sizeof c->sched_addr, H_HOST ":%d", c->port);
        const char *argv[32] = {CHAINPS_BIN, "scheduler", "--port", port, "--servers", sv,
                                "--workers", wk,          "--mode", mode, "--bind",    H_HOST};
        int n = 12;
        for (int i = 0; extra && extra[i] && n < 31; i++)
            argv[n++] = extra[i];
        argv[n] = NULL;
        c->sched = h_spawn("scheduler", (char *const *)argv, env, NULL);
        if (c->sched < 0)
            return -1;
        uint64_t deadline = h_now_ms() + 10000;
        while (h_now_ms() < deadline) {
            if (h_log_count(c->sched, "listening on") > 0)
                return 0;
            if (!h_alive(c->sched))
                break;
            nap();
        }
        if (h_log_count(c->sched, "cannot listen") == 0) {
            fprintf(stderr, "harness: the scheduler did not start\n");
            print_tail(c->sched);
            return -1;
        }
        h_kill(c->sched, 1000);
    }
    return -1;
}

pid_t h_start_server(h_cluster *c, int rank)
{
    char r[16], name[32];
    snprintf(r, sizeof r, "%d", rank);
    snprintf(name, sizeof name, "server-%d", rank);
    snprintf(c->data[rank], sizeof c->data[rank], "%s/server-%d", test_dir, rank);
    const char *argv[] = {
        CHAINPS_BIN, "server", "--scheduler", c->sched_addr, "--data", c->data[rank], "--rank",
        r,           "--bind", H_HOST,        "--advertise", H_HOST,   NULL};
    c->servers[rank] = h_spawn(name, (char *const *)argv, NULL, NULL);
    return c->servers[rank];
}

int h_start_cluster(h_cluster *c, int servers, int workers, const char *mode)
{
    memset(c, 0, sizeof *c);
    if (servers > H_MAX_SERVERS || h_start_scheduler(c, servers, workers, mode, NULL) != 0)
        return -1;
    c->nservers = servers;
    for (int i = 0; i < servers; i++)
        if (h_start_server(c, i) < 0)
            return -1;
    return 0;
}

int h_server_url(pid_t server, char *url, size_t len, int timeout_ms)
{
    if (!h_wait_log(server, "inbox tcp://", 1, timeout_ms))
        return -1;
    char *log = h_read_log(server);
    /* The last one: a restarted server appends to the same log. */
    const char *p = NULL, *q = log;
    while ((q = strstr(q, "inbox tcp://")) != NULL)
        p = q++;
    int rc = -1;
    if (p) {
        p += strlen("inbox ");
        size_t n = strcspn(p, " \n");
        if (n < len) {
            memcpy(url, p, n);
            url[n] = 0;
            rc = 0;
        }
    }
    free(log);
    return rc;
}

void h_become_worker(const char *sched_addr, int servers, int workers)
{
    static const char *foreign[] = {"DMLC_ROLE",         "DMLC_PS_ROOT_URI",
                                    "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER",
                                    "DMLC_NUM_WORKER",   "MS_ROLE",
                                    "MS_SCHED_HOST",     "MS_SCHED_PORT",
                                    "MS_SERVER_NUM",     "MS_WORKER_NUM",
                                    "CHAINPS_RANK",      "CHAINPS_PORT",
                                    "CHAINPS_MODE",      NULL};
    for (int i = 0; foreign[i]; i++)
        unsetenv(foreign[i]);
    char n[16], w[16];
    snprintf(n, sizeof n, "%d", servers);
    snprintf(w, sizeof w, "%d", workers);
    setenv("CHAINPS_ROLE", "worker", 1);
    setenv("CHAINPS_SCHEDULER", sched_addr, 1);
    setenv("CHAINPS_NUM_SERVERS", n, 1);
    setenv("CHAINPS_NUM_WORKERS", w, 1);
}

int h_tcp_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        abort();
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        fprintf(stderr, "harness: connect 127.0.0.1:%d: %s\n", port, strerror(errno));
        abort();
    }
    return fd;
}

void h_sp_send(int port, const void *msg, size_t len, uint64_t claimed)
{
    unsigned char out[256];
    static const unsigned char hello[8] = {0, 'S', 'P', 0, 0x00, 0x50, 0, 0};
    if (len + 16 > sizeof out)
        abort();
    memcpy(out, hello, 8);
    for (int i = 0; i < 8; i++)
        out[8 + i] = (unsigned char)(claimed >> (56 - 8 * i));
    memcpy(out + 16, msg, len);
    int fd = h_tcp_connect(port);
    ssize_t w = send(fd, out, 16 + len, MSG_NOSIGNAL);
    (void)w;
    unsigned char in[8];
    ssize_t r = recv(fd, in, sizeof in, 0);
    (void)r;
    close(fd);
}
