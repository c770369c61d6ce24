/* `chainps launch`: a whole job on this machine. Starts a scheduler and S servers on loopback,
 * runs the training program W times as workers, streams every process's output prefixed with
 * its role and rank, and ends every process it started (by PID) before it returns. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
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
#include "node/msg.h"

#define STOP_GRACE_MS 10000
#define KILL_GRACE_MS 3000

static const char launch_usage[] =
    "usage: chainps launch --servers S --workers W [options] -- PROGRAM [ARGS...]\n"
    "\n"
    "Run a whole job on this machine: a scheduler and S servers on 127.0.0.1, and W copies of\n"
    "PROGRAM as workers (with CHAINPS_ROLE=worker, CHAINPS_SCHEDULER, CHAINPS_RANK, ... set).\n"
    "Every line a process prints is shown prefixed by its role and rank. When the workers are\n"
    "done the job ends and every process is stopped. Exits non-zero if any worker failed.\n"
    "\n"
    "  --servers S        number of servers (required)\n"
    "  --workers W        number of workers (required)\n"
    "  --mode M           sync (default), async or ssp:N\n"
    "  --replicas R       servers in each key range's chain (default 3, or S if fewer)\n"
    "  --data DIR         keep the servers' LMDB data in DIR/server-<rank> (kept afterwards;\n"
    "                     a second launch on the same DIR resumes from its parameters);\n"
    "                     default: a fresh temporary directory, removed at the end\n"
    "  --port P           scheduler port (default: a free one)\n"
    "  --timeout SEC      stop the job (and fail) if it runs longer than SEC seconds\n"
    "  --no-compress      never snappy-compress pushes\n"
    "  -v, --verbose      more logging from every process (twice: debug)\n"
    "  -h, --help         this text\n";

static const struct option launch_opts[] = {
    {"servers", required_argument, 0, CLI_OPT_SERVERS},
    {"workers", required_argument, 0, CLI_OPT_WORKERS},
    {"mode", required_argument, 0, CLI_OPT_MODE},
    {"replicas", required_argument, 0, CLI_OPT_REPLICAS},
    {"data", required_argument, 0, CLI_OPT_DATA},
    {"port", required_argument, 0, CLI_OPT_PORT},
    {"timeout", required_argument, 0, CLI_OPT_TIMEOUT},
    {"no-compress", no_argument, 0, CLI_OPT_NO_COMPRESS},
    {"verbose", no_argument, 0, 'v'},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0}};

typedef struct child {
    pid_t pid;
    int fd; /* read end of its stdout+stderr, -1 once closed */
    char tag[32];
    int role;
    int status;
    int exited;
    char line[4096];
    size_t linelen;
} child;

static volatile sig_atomic_t interrupted;

static void on_interrupt(int sig)
{
    (void)sig;
    interrupted = 1;
}

/* A port nobody listens on right now: bind port 0 on loopback, read it back, close. */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static void print_line(child *c, const char *text, size_t n)
{
    /* One write per line so lines of different processes never interleave. */
    char out[4200];
    int k = snprintf(out, sizeof out, "[%s] %.*s\n", c->tag, (int)n, text);
    if (k > 0)
        fwrite(out, 1, (size_t)k < sizeof out ? (size_t)k : sizeof out - 1, stdout);
    fflush(stdout);
}

static void drain(child *c)
{
    char buf[8192];
    ssize_t n = read(c->fd, buf, sizeof buf);
    if (n <= 0) {
        if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
            if (c->linelen)
                print_line(c, c->line, c->linelen);
            c->linelen = 0;
            close(c->fd);
            c->fd = -1;
        }
        return;
    }
    for (ssize_t i = 0; i < n; i++) {
        if (buf[i] == '\n' || c->linelen == sizeof c->line) {
            print_line(c, c->line, c->linelen);
            c->linelen = 0;
            if (buf[i] == '\n')
                continue;
        }
        c->line[c->linelen++] = buf[i];
    }
}

static int spawn(child *c, char *const argv[], char *const env_add[])
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
        static const char *aliases[] = {"DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT",
                                        "DMLC_NUM_SERVER", "DMLC_NUM_WORKER", "MS_ROLE",
                                        "MS_SCHED_HOST", "MS_SCHED_PORT", "MS_SERVER_NUM",
                                        "MS_WORKER_NUM", "CHAINPS_PORT", "CHAINPS_RANK", NULL};
        for (int i = 0; aliases[i]; i++)
            unsetenv(aliases[i]);
        for (int i = 0; env_add && env_add[i]; i++)
            putenv(env_add[i]);
        execvp(argv[0], argv);
        fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(p[1]);
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    fcntl(p[0], F_SETFD, FD_CLOEXEC);
    c->pid = pid;
    c->fd = p[0];
    return 0;
}

static void reap(child *kids, int n)
{
    for (int i = 0; i < n; i++) {
        if (kids[i].exited || kids[i].pid <= 0)
            continue;
        int st;
        if (waitpid(kids[i].pid, &st, WNOHANG) == kids[i].pid) {
            kids[i].exited = 1;
            kids[i].status = st;
        }
    }
}

static void pump(child *kids, int n, int timeout_ms)
{
    struct pollfd pfd[1100];
    int map[1100], k = 0;
    for (int i = 0; i < n && k < 1100; i++) {
        if (kids[i].fd >= 0) {
            pfd[k] = (struct pollfd){.fd = kids[i].fd, .events = POLLIN};
            map[k++] = i;
        }
    }
    if (k == 0) {
        struct timespec ts = {0, (long)timeout_ms * 1000000L};
        nanosleep(&ts, NULL);
    } else if (poll(pfd, (nfds_t)k, timeout_ms) > 0) {
        for (int j = 0; j < k; j++)
            if (pfd[j].revents)
                drain(&kids[map[j]]);
    }
    reap(kids, n);
}

/* Wait for the listed children to exit by themselves, up to ms; then SIGTERM, then SIGKILL. */
static void stop_children(child *kids, int n, int first, int last, int grace_ms)
{
    uint64_t deadline = cps__now_ms() + (uint64_t)grace_ms;
    for (int phase = 0; phase < 3; phase++) {
        for (;;) {
            int alive = 0;
            for (int i = first; i < last; i++)
                alive += !kids[i].exited;
            if (!alive)
                return;
            if (cps__now_ms() >= deadline)
                break;
            pump(kids, n, 50);
        }
        int sig = phase == 0 ? SIGTERM : SIGKILL;
        for (int i = first; i < last; i++)
            if (!kids[i].exited)
                kill(kids[i].pid, sig);
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

static const char *exit_text(int st, char *buf, size_t len)
{
    if (WIFEXITED(st))
        snprintf(buf, len, "exit status %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        snprintf(buf, len, "killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        snprintf(buf, len, "status %d", st);
    return buf;
}

int cps__cli_launch(int argc, char **argv)
{
    cps_config cfg;
    if (cps__cli_config(&cfg) != 0)
        return 2;
    int opt, data_given = 0, sched_port = 0;
    uint32_t timeout_s = 0;
    char err[256];
    optind = 1;
    /* '+': stop at the first non-option, so the program's own flags are left alone. */
    while ((opt = getopt_long(argc, argv, "+vh", launch_opts, NULL)) != -1) {
        if (opt == 'h') {
            fputs(launch_usage, stdout);
            return 0;
        }
        if (opt == CLI_OPT_TIMEOUT) {
            if (cps__config_parse_u32("--timeout", optarg, 1, 604800, &timeout_s, err,
                                      sizeof err) != 0) {
                fprintf(stderr, "chainps launch: %s\n", err);
                return 2;
            }
            continue;
        }
        if (opt == CLI_OPT_PORT) {
            uint32_t v;
            if (cps__config_parse_u32("--port", optarg, 1, 65535, &v, err, sizeof err) != 0) {
                fprintf(stderr, "chainps launch: %s\n", err);
                return 2;
            }
            sched_port = (int)v;
            continue;
        }
        data_given |= opt == CLI_OPT_DATA;
        int rc = cps__cli_common_flag("launch", opt, optarg, &cfg);
        if (rc == 2)
            return 2;
        if (rc == 1)
            return cps__cli_usage_error("launch", "unknown option");
    }
    if (cfg.num_servers == 0 || cfg.num_workers == 0)
        return cps__cli_usage_error("launch", "--servers and --workers are required");
    if (optind >= argc)
        return cps__cli_usage_error("launch", "no program to run (put it after --)");
    if (cfg.replicas > cfg.num_servers)
        return cps__cli_usage_error("launch", "--replicas %u needs at least %u servers",
                                    cfg.replicas, cfg.replicas);
    char **prog = argv + optind;

    char data[512];
    if (data_given) {
        snprintf(data, sizeof data, "%s", cfg.data_dir);
        if (mkdir(data, 0755) != 0 && errno != EEXIST) {
            fprintf(stderr, "chainps launch: cannot create %s: %s\n", data, strerror(errno));
            return 1;
        }
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(data, sizeof data, "%s/chainps-job-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(data)) {
            fprintf(stderr, "chainps launch: cannot create a data directory: %s\n",
                    strerror(errno));
            return 1;
        }
    }
    if (!sched_port)
        sched_port = free_port();
    if (sched_port <= 0) {
        fprintf(stderr, "chainps launch: no free port on 127.0.0.1\n");
        return 1;
    }
    char self[1024];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) {
        fprintf(stderr, "chainps launch: cannot find the chainps executable\n");
        return 1;
    }
    self[sl] = 0;

    struct sigaction sa = {0};
    sa.sa_handler = on_interrupt;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    int S = (int)cfg.num_servers, W = (int)cfg.num_workers, n = 1 + S + W;
    child *kids = calloc((size_t)n, sizeof *kids);
    if (!kids)
        return 1;
    char mode[32], port_s[16], sv_s[16], wk_s[16], sched[64], verbose[8], repl[16];
    snprintf(repl, sizeof repl, "%u", cfg.replicas ? cfg.replicas : (S < 3 ? (uint32_t)S : 3u));
    cps__config_mode_str(cfg.mode, cfg.ssp_bound, mode, sizeof mode);
    snprintf(port_s, sizeof port_s, "%d", sched_port);
    snprintf(sv_s, sizeof sv_s, "%d", S);
    snprintf(wk_s, sizeof wk_s, "%d", W);
    snprintf(sched, sizeof sched, "127.0.0.1:%d", sched_port);
    snprintf(verbose, sizeof verbose, "%d", cfg.verbose);
    printf("launch: scheduler on 127.0.0.1:%d, %d servers, %d workers, mode %s, data in %s\n",
           sched_port, S, W, mode, data);
    fflush(stdout);

    /* Every child gets the job's settings in CHAINPS_* form. */
    static char env_buf[1100][160];
    int env_used = 0;
#define ENV(fmt, ...) (snprintf(env_buf[env_used], sizeof env_buf[0], fmt, __VA_ARGS__), env_buf[env_used++])
    char *common[12];
    int nc = 0;
    common[nc++] = ENV("CHAINPS_SCHEDULER=%s", sched);
    common[nc++] = ENV("CHAINPS_NUM_SERVERS=%d", S);
    common[nc++] = ENV("CHAINPS_NUM_WORKERS=%d", W);
    common[nc++] = ENV("CHAINPS_MODE=%s", mode);
    common[nc++] = ENV("CHAINPS_VERBOSE=%d", cfg.verbose);
    common[nc++] = ENV("CHAINPS_COMPRESS=%d", cfg.compress);
    common[nc++] = ENV("CHAINPS_BIND=%s", "127.0.0.1");
    common[nc++] = ENV("CHAINPS_ADVERTISE=%s", "127.0.0.1");
    common[nc] = NULL;

    int rc = 0;
    {
        char *av[] = {self, "scheduler", "--port", port_s, "--servers", sv_s, "--workers", wk_s,
                      "--mode", mode, "--replicas", repl, "--bind", "127.0.0.1", "--data", data,
                      NULL};
        char *env[16];
        int k = 0;
        for (int i = 0; i < nc; i++)
            env[k++] = common[i];
        env[k++] = ENV("CHAINPS_ROLE=%s", "scheduler");
        env[k] = NULL;
        snprintf(kids[0].tag, sizeof kids[0].tag, "scheduler");
        kids[0].role = CPS_ROLE_SCHEDULER;
        if (spawn(&kids[0], av, env) != 0)
            rc = 1;
    }
    for (int i = 0; i < S && rc == 0; i++) {
        char dir[600], rank[16];
        snprintf(dir, sizeof dir, "%s/server-%d", data, i);
        snprintf(rank, sizeof rank, "%d", i);
        char *av[] = {self, "server", "--scheduler", sched, "--data", dir, "--rank", rank,
                      "--bind", "127.0.0.1", "--advertise", "127.0.0.1", NULL};
        char *env[16];
        int k = 0;
        for (int j = 0; j < nc; j++)
            env[k++] = common[j];
        env[k++] = ENV("CHAINPS_ROLE=%s", "server");
        env[k] = NULL;
        child *c = &kids[1 + i];
        snprintf(c->tag, sizeof c->tag, "server %d", i);
        c->role = CPS_ROLE_SERVER;
        if (spawn(c, av, env) != 0)
            rc = 1;
    }
    for (int i = 0; i < W && rc == 0; i++) {
        char *env[16];
        int k = 0;
        for (int j = 0; j < nc; j++)
            env[k++] = common[j];
        env[k++] = ENV("CHAINPS_ROLE=%s", "worker");
        env[k++] = ENV("CHAINPS_RANK=%d", i);
        env[k] = NULL;
        child *c = &kids[1 + S + i];
        snprintf(c->tag, sizeof c->tag, "worker %d", i);
        c->role = CPS_ROLE_WORKER;
        if (spawn(c, prog, env) != 0)
            rc = 1;
    }
#undef ENV
    if (rc != 0)
        fprintf(stderr, "launch: could not start every process: %s\n", strerror(errno));

    uint64_t start = cps__now_ms();
    const char *why = NULL;
    while (rc == 0) {
        pump(kids, n, 100);
        int workers_left = 0, failed = -1;
        for (int i = 1 + S; i < n; i++) {
            workers_left += !kids[i].exited;
            if (kids[i].exited && !(WIFEXITED(kids[i].status) && WEXITSTATUS(kids[i].status) == 0))
                failed = i;
        }
        if (failed >= 0) {
            char b[96];
            printf("launch: %s failed (%s); stopping the job\n", kids[failed].tag,
                   exit_text(kids[failed].status, b, sizeof b));
            rc = 1;
            break;
        }
        if (!workers_left)
            break;
        if (kids[0].exited) {
            char b[96];
            printf("launch: the scheduler exited (%s) while workers were running; stopping\n",
                   exit_text(kids[0].status, b, sizeof b));
            rc = 1;
            break;
        }
        if (interrupted) {
            why = "interrupted";
            rc = 130;
            break;
        }
        if (timeout_s && cps__now_ms() - start > (uint64_t)timeout_s * 1000) {
            why = "timed out";
            rc = 1;
            break;
        }
    }
    if (why)
        printf("launch: %s; stopping every process\n", why);
    fflush(stdout);
    if (rc != 0) {
        /* Workers first (they may be blocked on a dead job), then the rest. */
        stop_children(kids, n, 1 + S, n, 0);
        stop_children(kids, n, 0, 1 + S, 2000);
    } else {
        /* Normal end: the scheduler tells the servers to stop once every worker said BYE. */
        stop_children(kids, n, 0, 1 + S, STOP_GRACE_MS);
    }
    while (1) {
        int open = 0;
        for (int i = 0; i < n; i++)
            open += kids[i].fd >= 0;
        if (!open)
            break;
        pump(kids, n, 50);
    }
    for (int i = 0; i < n; i++) {
        char b[96];
        if (kids[i].pid > 0 && kids[i].exited && kids[i].role != CPS_ROLE_WORKER &&
            !(WIFEXITED(kids[i].status) && WEXITSTATUS(kids[i].status) == 0) && rc == 0)
            printf("launch: %s ended with %s\n", kids[i].tag,
                   exit_text(kids[i].status, b, sizeof b));
    }
    if (!data_given)
        nftw(data, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    printf("launch: job %s in %.1f s\n", rc == 0 ? "finished" : "FAILED",
           (cps__now_ms() - start) / 1000.0);
    free(kids);
    return rc;
}
