/* `chainps launch`: a whole job on this machine. Starts a scheduler and S servers on loopback,
 * runs the training program W times as workers, streams every process's output prefixed with
 * its role and rank, and ends every process it started (by PID) before it returns. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <sys/wait.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "job.h"
#include "node/msg.h"

#define STOP_GRACE_MS 10000
/* How long workers may take to exit after the job ended, unless --timeout says otherwise. */
#define FINISH_WAIT_MS 600000
/* Restarts: a worker with --restart-workers, the scheduler always (bounded, so a scheduler that
 * cannot start ends the job instead of looping). */
#define MAX_WORKER_RESTARTS 3
#define MAX_SCHED_RESTARTS  3
#define SCHED_RESTART_MS    1000

static const char launch_usage[] =
    "usage: chainps launch --servers S --workers W [options] -- PROGRAM [ARGS...]\n"
    "\n"
    "Run a whole job on this machine: a scheduler and S servers on 127.0.0.1, and W copies of\n"
    "PROGRAM as workers (with CHAINPS_ROLE=worker, CHAINPS_SCHEDULER, CHAINPS_RANK, ... set).\n"
    "Every line a process prints is shown prefixed by its role and rank. When the workers are\n"
    "done the job ends and every process is stopped.\n"
    "\n"
    "As resilient as a cluster started by hand: a server that dies is failed over (restart it\n"
    "yourself or see --kill-at); a worker killed by a signal is dropped (or restarted with\n"
    "--restart-workers); a scheduler that dies is restarted on its data directory and port\n"
    "(up to 3 times) and resumes the job, but one that refuses the job for good (exit status\n"
    "3: a checkpoint it cannot restore, a data directory another process holds) ends it at\n"
    "once with its reason. --restore-from, --secret-file and PROGRAM are checked before any\n"
    "process starts. Exits 0 when the job finished; non-zero when an input is bad, a\n"
    "worker exited with an error (the program failed: the job is stopped), every worker died,\n"
    "the scheduler refused the job or could not be brought back, or --timeout passed.\n"
    "\n"
    "  --servers S        number of servers (required)\n"
    "  --workers W        number of workers (required)\n"
    "  --mode M           sync (default), async or ssp:N\n"
    "  --backup-workers B sync mode: each step closes with the first W-B gradients to\n"
    "                     arrive (W live workers, 0 <= B < W; env CHAINPS_BACKUP_WORKERS);\n"
    "                     a late gradient is dropped and counted. Default 0: wait for all\n"
    "  --replicas R       servers in each key range's chain (default 3, or S if fewer)\n"
    "  --ranges N         key ranges (default S): more than S lets servers started later\n"
    "                     against this job (`chainps server --scheduler ...`) take a share\n"
    "  --data DIR         keep the servers' LMDB data in DIR/server-<rank> (kept afterwards;\n"
    "                     a second launch on the same DIR resumes from its parameters);\n"
    "                     default: a fresh temporary directory, removed at the end\n"
    "  --port P           scheduler port (default: a free one)\n"
    "  --timeout SEC      stop the job (and fail) if it runs longer than SEC seconds;\n"
    "                     workers still exiting after the job ended (saving a model, an\n"
    "                     interpreter shutting down) are waited for within it (or 600 s)\n"
    "  --no-compress      never snappy-compress pushes\n"
    "  --compress SPEC    lossy gradient compression of every worker tensor's pushes: fp16,\n"
    "                     bf16 or topk:R (the largest R fraction of the values, 0 < R <= 1),\n"
    "                     with error feedback (what is not sent is added to the next push);\n"
    "                     a program may choose per tensor (cps_tensor_compress). Default none\n"
    "  --kill-at SEC      a demonstration of failover: SIGKILL server 0 (the head of range 0)\n"
    "                     SEC seconds in, restart it 2 s later (it copies its ranges back);\n"
    "                     the workers see CHAINPS_KILL_AT_S=SEC (fmnist marks it on its plot)\n"
    "  --kill-server R    kill server rank R instead (with ring placement, rank 1 is the\n"
    "                     middle and rank R-1 the tail of range 0)\n"
    "  --restart-workers  a worker that dies (killed by a signal) is started again with its\n"
    "                     rank, once the scheduler has declared it dead, up to 3 times; it\n"
    "                     joins at the step the others are on. Without it, a dead worker\n"
    "                     is dropped and the job goes on with the others\n"
    "  --metrics-port BASE  Prometheus metrics on 127.0.0.1: the scheduler's at port BASE,\n"
    "                     server i's at BASE+1+i "
    "(http://127.0.0.1:PORT/metrics)\n" CPS_CLI_CKPT_HELP
    "  --secret-file F    the job's secret (env CHAINPS_SECRET_FILE); default: a new one made\n"
    "                     for this job, handed to every process as CHAINPS_SECRET_FILE\n"
    "  --insecure         no secret: messages are not authenticated (env CHAINPS_INSECURE=1)\n"
    "  -v, --verbose      more logging from every process (twice: debug)\n"
    "  -h, --help         this text\n";

static const struct option launch_opts[] = {
    {"checkpoint-every", required_argument, 0, CLI_OPT_CKPT_EVERY},
    {"checkpoint-dir", required_argument, 0, CLI_OPT_CKPT_DIR},
    {"keep", required_argument, 0, CLI_OPT_KEEP},
    {"restore-from", required_argument, 0, CLI_OPT_RESTORE_FROM},
    {"restore-optimizer", required_argument, 0, CLI_OPT_RESTORE_OPTIM},
    {"servers", required_argument, 0, CLI_OPT_SERVERS},
    {"workers", required_argument, 0, CLI_OPT_WORKERS},
    {"mode", required_argument, 0, CLI_OPT_MODE},
    {"backup-workers", required_argument, 0, CLI_OPT_BACKUP_WORKERS},
    {"replicas", required_argument, 0, CLI_OPT_REPLICAS},
    {"ranges", required_argument, 0, CLI_OPT_RANGES},
    {"data", required_argument, 0, CLI_OPT_DATA},
    {"port", required_argument, 0, CLI_OPT_PORT},
    {"timeout", required_argument, 0, CLI_OPT_TIMEOUT},
    {"no-compress", no_argument, 0, CLI_OPT_NO_COMPRESS},
    {"compress", required_argument, 0, CLI_OPT_COMPRESS},
    {"kill-at", required_argument, 0, CLI_OPT_KILL_AT},
    {"kill-server", required_argument, 0, CLI_OPT_KILL_SERVER},
    {"restart-workers", no_argument, 0, CLI_OPT_RESTART_WORKERS},
    {"metrics-port", required_argument, 0, CLI_OPT_METRICS_PORT},
    CPS_CLI_SECRET_OPTS,
    {"verbose", no_argument, 0, 'v'},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0}};

static volatile sig_atomic_t interrupted;

static void on_interrupt(int sig)
{
    (void)sig;
    interrupted = 1;
}

/* The restarted server's catch-up, on the wall clock, for the workers (fmnist's plot):
 * "caught_up_unix_ms=N" in the file CHAINPS_LAUNCH_EVENTS names. */
static void write_caught_up(const char *path, uint64_t at_ms, uint64_t now_ms)
{
    if (!path[0])
        return;
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    unsigned long long unix_ms = (unsigned long long)wall.tv_sec * 1000ull +
                                 (unsigned long long)wall.tv_nsec / 1000000ull - (now_ms - at_ms);
    FILE *f = fopen(path, "a");
    if (!f) {
        fprintf(stderr, "launch: cannot write %s: %s\n", path, strerror(errno));
        return;
    }
    fprintf(f, "caught_up_unix_ms=%llu\n", unix_ms);
    fclose(f);
}

/* Server rank that --kill-at kills (launch only). */
static uint32_t kill_server;
/* --restart-workers (launch, and chaos through cps__cli_job_restart_workers). */
static int restart_workers;

int cps__cli_job_restart_workers(void)
{
    return restart_workers;
}

int cps__cli_job_args(const char *cmd, int argc, char **argv, cps__config *cfg, int *data_given,
                      int *port, uint32_t *timeout_s, uint32_t *kill_at_s, char ***prog)
{
    int opt;
    char err[256];
    *data_given = *port = 0;
    *timeout_s = *kill_at_s = 0;
    optind = 1;
    /* '+': stop at the first non-option, so the program's own flags are left alone. */
    while ((opt = getopt_long(argc, argv, "+vh", launch_opts, NULL)) != -1) {
        if (opt == 'h') {
            fputs(launch_usage, stdout);
            return -1;
        }
        if (opt == CLI_OPT_TIMEOUT) {
            if (cps__config_parse_u32("--timeout", optarg, 1, 604800, timeout_s, err, sizeof err) !=
                0) {
                fprintf(stderr, "chainps %s: %s\n", cmd, err);
                return 2;
            }
            continue;
        }
        if (opt == CLI_OPT_RESTART_WORKERS) {
            restart_workers = 1;
            continue;
        }
        if (opt == CLI_OPT_KILL_SERVER) {
            if (cps__config_parse_u32("--kill-server", optarg, 0, 1023, &kill_server, err,
                                      sizeof err) != 0) {
                fprintf(stderr, "chainps %s: %s\n", cmd, err);
                return 2;
            }
            continue;
        }
        if (opt == CLI_OPT_KILL_AT) {
            if (cps__config_parse_u32("--kill-at", optarg, 1, 604800, kill_at_s, err, sizeof err) !=
                0) {
                fprintf(stderr, "chainps %s: %s\n", cmd, err);
                return 2;
            }
            continue;
        }
        if (opt == CLI_OPT_PORT) {
            uint32_t v;
            if (cps__config_parse_u32("--port", optarg, 1, 65535, &v, err, sizeof err) != 0) {
                fprintf(stderr, "chainps %s: %s\n", cmd, err);
                return 2;
            }
            *port = (int)v;
            continue;
        }
        *data_given |= opt == CLI_OPT_DATA;
        int rc = cps__cli_common_flag(cmd, opt, optarg, cfg);
        if (rc == 2)
            return 2;
        if (rc == 1)
            return cps__cli_usage_error(cmd, "unknown option");
    }
    if (cfg->num_servers == 0 || cfg->num_workers == 0)
        return cps__cli_usage_error(cmd, "--servers and --workers are required");
    if (optind >= argc)
        return cps__cli_usage_error(cmd, "no program to run (put it after --)");
    if (cps__config_check_backup(cfg, err, sizeof err) != 0)
        return cps__cli_usage_error(cmd, "%s", err);
    if (cfg->replicas > cfg->num_servers)
        return cps__cli_usage_error(cmd, "--replicas %u needs at least %u servers", cfg->replicas,
                                    cfg->replicas);
    if ((cfg->ckpt_dir[0] || cfg->ckpt_keep) && !cfg->ckpt_every)
        return cps__cli_usage_error(cmd, "--checkpoint-dir and --keep need --checkpoint-every");
    if (cfg->restore_optim[0] && !cfg->restore_from[0])
        return cps__cli_usage_error(cmd, "--restore-optimizer needs --restore-from");
    if (cfg->metrics_port && (uint32_t)cfg->metrics_port + cfg->num_servers > 65535)
        return cps__cli_usage_error(cmd, "--metrics-port %u: the servers' ports would pass 65535",
                                    cfg->metrics_port);
    if (kill_server >= cfg->num_servers)
        return cps__cli_usage_error(cmd, "--kill-server %u: there are only %u servers", kill_server,
                                    cfg->num_servers);
    *prog = argv + optind;
    /* Before the job's directories are made and any process starts. */
    return cps__cli_job_check(cmd, cfg, *prog);
}

/* What launch knows of its workers beyond their processes: per worker, when a restart is due
 * (0: none pending), how often it was restarted, and whether it was dropped for good. */
typedef struct supervisor {
    uint64_t *restart_at;
    int *restarts;
    unsigned char *dropped;
    int ndropped, nrestarts;
} supervisor;

/* One look at every worker: start the restarts that are due, and decide about workers that
 * ended. A worker killed by a signal before the job ended is a death the job survives: it is
 * dropped, or (--restart-workers) started again with its rank once the scheduler has declared
 * it dead (CHAINPS_WORKER_DEAD_AFTER_MS). One that exited with an error is the program's own
 * failure: its index is returned (else -1). *left counts workers running or due back,
 * *finished those that exited 0. */
static int supervise_workers(supervisor *sup, cps__job *job, uint64_t now, uint64_t start,
                             int job_ended, int *left, int *finished)
{
    int failed = -1;
    for (int i = 1 + job->S; i < job->n; i++) {
        cps__child *k = &job->kids[i];
        char b[96];
        if (sup->restart_at[i]) {
            ++*left;
            if (now >= sup->restart_at[i] && cps__job_start(job, i) == 0) {
                sup->restart_at[i] = 0;
                printf("launch: +%.1f s: restarted %s (pid %d); it takes its place at the step "
                       "the others are on\n",
                       (now - start) / 1000.0, k->tag, (int)k->pid);
                fflush(stdout);
            }
            continue;
        }
        if (!k->exited) {
            ++*left;
            continue;
        }
        if (sup->dropped[i])
            continue;
        if (cps__job_ok(job, i)) {
            ++*finished;
            continue;
        }
        if (!WIFSIGNALED(k->status) || job_ended) {
            failed = i;
            continue;
        }
        if (restart_workers && sup->restarts[i] < MAX_WORKER_RESTARTS) {
            uint64_t wait = (uint64_t)job->cfg.worker_dead_after_ms + 1000;
            sup->restart_at[i] = now + wait;
            sup->restarts[i]++;
            sup->nrestarts++;
            ++*left;
            printf("launch: +%.1f s: %s died (%s); restarting it in %.1f s, once the scheduler "
                   "has declared it dead\n",
                   (now - start) / 1000.0, k->tag, cps__job_exit_text(k->status, b, sizeof b),
                   wait / 1000.0);
        } else {
            sup->dropped[i] = 1;
            sup->ndropped++;
            printf("launch: +%.1f s: %s died (%s); the job goes on without it%s\n",
                   (now - start) / 1000.0, k->tag, cps__job_exit_text(k->status, b, sizeof b),
                   restart_workers ? " (restarted too often)" : "");
        }
        fflush(stdout);
    }
    return failed;
}

int cps__cli_launch(int argc, char **argv)
{
    cps__config cfg;
    if (cps__cli_config(&cfg) != 0)
        return 2;
    int data_given, sched_port;
    uint32_t timeout_s, kill_at_s;
    char **prog;
    int prc = cps__cli_job_args("launch", argc, argv, &cfg, &data_given, &sched_port, &timeout_s,
                                &kill_at_s, &prog);
    if (prc != 0)
        return prc < 0 ? 0 : prc;

    cps__job job;
    if (cps__job_init(&job, &cfg, data_given, sched_port, prog) != 0)
        return 1;
    /* A worker we restart must find the job still running: the scheduler keeps it open while
     * a dead worker's rank is unfinished, and we end it ourselves if we give up on one. */
    job.await_replacements = restart_workers;
    char kill_env[64], kill_unix_env[64], events_path[600] = "", events_env[640];
    if (kill_at_s) {
        snprintf(kill_env, sizeof kill_env, "CHAINPS_KILL_AT_S=%u", kill_at_s);
        putenv(kill_env); /* inherited by every child */
        /* The same moment on the wall clock, for a worker that counts its time from elsewhere
         * (fmnist's plot counts from its first step). */
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        unsigned long long kill_ms = (unsigned long long)now.tv_sec * 1000ull +
                                     (unsigned long long)now.tv_nsec / 1000000ull +
                                     (unsigned long long)kill_at_s * 1000ull;
        snprintf(kill_unix_env, sizeof kill_unix_env, "CHAINPS_KILL_AT_UNIX_MS=%llu", kill_ms);
        putenv(kill_unix_env);
        /* Where we write when the restarted server has caught up (fmnist marks it). */
        snprintf(events_path, sizeof events_path, "%s/launch-events", job.data);
        snprintf(events_env, sizeof events_env, "CHAINPS_LAUNCH_EVENTS=%s", events_path);
        putenv(events_env);
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_interrupt;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    char backup[40] = "";
    if (cfg.backup_workers)
        snprintf(backup, sizeof backup, " (%u backup worker%s)", cfg.backup_workers,
                 cfg.backup_workers == 1 ? "" : "s");
    printf("launch: scheduler on 127.0.0.1:%d, %d servers (chains of %s), %d workers, mode %s%s, "
           "data in %s\n",
           job.port, job.S, job.repl, job.W, job.mode, backup, job.data);
    if (cfg.metrics_port)
        printf("launch: metrics at http://127.0.0.1:%u/metrics (scheduler) and ports %u..%u "
               "(servers 0..%d)\n",
               cfg.metrics_port, cfg.metrics_port + 1u, cfg.metrics_port + (unsigned)job.S,
               job.S - 1);
    fflush(stdout);

    int rc = cps__job_start_all(&job);
    int S = job.S, n = job.n;
    cps__child *kids = job.kids;
    uint64_t catchup_from = 0;
    uint64_t start = cps__now_ms(), restart_at = 0, job_ended_at = 0, sched_back_at = 0;
    int killed = 0, sched_restarts = 0;
    /* How long the servers get to exit on their own once the job failed: the scheduler tells
     * them to, unless it is the one that is gone (it refused the job). */
    int servers_grace_ms = 2000;
    supervisor sup = {0};
    sup.restart_at = calloc((size_t)n, sizeof *sup.restart_at);
    sup.restarts = calloc((size_t)n, sizeof *sup.restarts);
    sup.dropped = calloc((size_t)n, 1);
    if (!sup.restart_at || !sup.restarts || !sup.dropped)
        rc = 1;
    const char *why = NULL;
    while (rc == 0) {
        cps__job_pump(&job, 100);
        uint64_t now = cps__now_ms();
        cps__child *victim = &kids[1 + kill_server];
        if (kill_at_s && !killed && now - start >= (uint64_t)kill_at_s * 1000 && !victim->exited) {
            printf("launch: +%.1f s: SIGKILL server %u (pid %d) to show failover; it restarts "
                   "in 2 s\n",
                   (now - start) / 1000.0, kill_server, (int)victim->pid);
            fflush(stdout);
            kill(victim->pid, SIGKILL);
            killed = 1;
            restart_at = now + 2000;
        }
        if (restart_at && now >= restart_at && victim->exited) {
            restart_at = 0;
            if (cps__job_start(&job, 1 + (int)kill_server) == 0) {
                printf("launch: +%.1f s: restarted server %u (pid %d); it copies its ranges "
                       "back from their tails\n",
                       (now - start) / 1000.0, kill_server, (int)victim->pid);
                catchup_from = now;
                job.repaired_ms = 0;
            }
            fflush(stdout);
        }
        if (catchup_from && job.repaired_ms >= catchup_from) {
            printf("launch: +%.1f s: server %u caught up: every range is back to its replicas "
                   "(%.1f s after its restart)\n",
                   (job.repaired_ms - start) / 1000.0, kill_server,
                   (job.repaired_ms - catchup_from) / 1000.0);
            fflush(stdout);
            write_caught_up(events_path, job.repaired_ms, now);
            catchup_from = 0;
        }
        int workers_left = 0, finished = 0;
        int failed =
            supervise_workers(&sup, &job, now, start, job_ended_at != 0, &workers_left, &finished);
        if (failed >= 0) {
            char b[96];
            printf("launch: %s failed (%s); stopping the job\n", kids[failed].tag,
                   cps__job_exit_text(kids[failed].status, b, sizeof b));
            rc = 1;
            break;
        }
        if (!workers_left) {
            if (!finished) {
                printf("launch: every worker died; stopping the job\n");
                rc = 1;
            }
            break;
        }
        if (kids[0].exited && cps__job_ok(&job, 0)) {
            /* Every worker said goodbye and the job ended; some are still exiting (saving a
             * model, an interpreter shutting down). Wait for them, within bounds. */
            uint64_t limit = timeout_s ? UINT64_MAX : FINISH_WAIT_MS; /* --timeout bounds it */
            if (!job_ended_at) {
                job_ended_at = now;
                printf("launch: the job ended; waiting for %d worker%s still exiting\n",
                       workers_left, workers_left == 1 ? "" : "s");
                fflush(stdout);
            } else if (now - job_ended_at > limit) {
                printf("launch: %d worker%s still running %.0f s after the job ended; stopping\n",
                       workers_left, workers_left == 1 ? "" : "s", limit / 1000.0);
                rc = 1;
                break;
            }
        } else if (kids[0].exited && !sched_back_at) {
            char b[96];
            if (cps__job_refused(&job, 0)) {
                /* Not a crash: a restart on the same directory and flags is refused again. */
                printf("launch: the scheduler refused the job (%s): %s; stopping\n",
                       cps__job_exit_text(kids[0].status, b, sizeof b),
                       kids[0].first_error[0] ? kids[0].first_error : "see its log above");
                servers_grace_ms = 0;
                rc = 1;
                break;
            }
            if (sched_restarts >= MAX_SCHED_RESTARTS) {
                printf("launch: the scheduler exited (%s) and was restarted %d times already; "
                       "stopping\n",
                       cps__job_exit_text(kids[0].status, b, sizeof b), sched_restarts);
                rc = 1;
                break;
            }
            /* It is not on the data path: training goes on while it is down, and a new one on
             * the same data directory resumes the job. */
            sched_back_at = now + SCHED_RESTART_MS;
            printf("launch: +%.1f s: the scheduler exited (%s); restarting it on its data "
                   "directory\n",
                   (now - start) / 1000.0, cps__job_exit_text(kids[0].status, b, sizeof b));
            fflush(stdout);
        } else if (sched_back_at && now >= sched_back_at) {
            sched_back_at = 0;
            sched_restarts++;
            if (cps__job_start(&job, 0) == 0)
                printf("launch: +%.1f s: restarted the scheduler (pid %d)\n",
                       (now - start) / 1000.0, (int)kids[0].pid);
            fflush(stdout);
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
    free(sup.restart_at);
    free(sup.restarts);
    free(sup.dropped);
    if (why)
        printf("launch: %s; stopping every process\n", why);
    fflush(stdout);
    if (rc != 0) {
        /* Workers first (they may be blocked on a dead job), then the rest. */
        cps__job_stop(&job, 1 + S, n, 0);
        cps__job_stop(&job, 0, 1 + S, servers_grace_ms);
    } else {
        /* Normal end: the scheduler tells the servers to stop once every worker said BYE. But
         * one that awaits the replacement of a worker we dropped (restarted too often) waits
         * for nothing: end it now (SIGTERM: it tells the servers to stop). */
        if (job.await_replacements && sup.ndropped && kids[0].pid > 0 && !kids[0].exited)
            kill(kids[0].pid, SIGTERM);
        cps__job_stop(&job, 0, 1 + S, STOP_GRACE_MS);
    }
    for (int i = 0; i <= S; i++) {
        char b[96];
        if (kids[i].pid > 0 && kids[i].exited && !cps__job_ok(&job, i) && rc == 0 &&
            !(i == 1 + (int)kill_server && killed && restart_at))
            printf("launch: %s ended with %s\n", kids[i].tag,
                   cps__job_exit_text(kids[i].status, b, sizeof b));
    }
    cps__job_fini(&job);
    printf("launch: job %s in %.1f s", rc == 0 ? "finished" : "FAILED",
           (cps__now_ms() - start) / 1000.0);
    if (sup.ndropped || sup.nrestarts || sched_restarts)
        printf(" (%d worker%s dropped, %d worker restart%s, %d scheduler restart%s)", sup.ndropped,
               sup.ndropped == 1 ? "" : "s", sup.nrestarts, sup.nrestarts == 1 ? "" : "s",
               sched_restarts, sched_restarts == 1 ? "" : "s");
    printf("\n");
    return rc;
}
