/* `chainps launch`: a whole job on this machine. Starts a scheduler and S servers on loopback,
 * runs the training program W times as workers, streams every process's output prefixed with
 * its role and rank, and ends every process it started (by PID) before it returns. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "job.h"
#include "node/msg.h"

#define STOP_GRACE_MS 10000
/* How long workers may take to exit after the job ended, unless --timeout says otherwise. */
#define FINISH_WAIT_MS 600000

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
    "  --timeout SEC      stop the job (and fail) if it runs longer than SEC seconds;\n"
    "                     workers still exiting after the job ended (saving a model, an\n"
    "                     interpreter shutting down) are waited for within it (or 600 s)\n"
    "  --no-compress      never snappy-compress pushes\n"
    "  --kill-at SEC      a demonstration of failover: SIGKILL server 0 (the head of range 0)\n"
    "                     SEC seconds in, restart it 2 s later (it copies its ranges back);\n"
    "                     the workers see CHAINPS_KILL_AT_S=SEC (fmnist marks it on its plot)\n"
    "  --kill-server R    kill server rank R instead (with ring placement, rank 1 is the\n"
    "                     middle and rank R-1 the tail of range 0)\n" CPS_CLI_CKPT_HELP
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
    {"replicas", required_argument, 0, CLI_OPT_REPLICAS},
    {"data", required_argument, 0, CLI_OPT_DATA},
    {"port", required_argument, 0, CLI_OPT_PORT},
    {"timeout", required_argument, 0, CLI_OPT_TIMEOUT},
    {"no-compress", no_argument, 0, CLI_OPT_NO_COMPRESS},
    {"kill-at", required_argument, 0, CLI_OPT_KILL_AT},
    {"kill-server", required_argument, 0, CLI_OPT_KILL_SERVER},
    {"verbose", no_argument, 0, 'v'},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0}};

static volatile sig_atomic_t interrupted;

static void on_interrupt(int sig)
{
    (void)sig;
    interrupted = 1;
}

/* Server rank that --kill-at kills (launch only). */
static uint32_t kill_server;

int cps__cli_job_args(const char *cmd, int argc, char **argv, cps_config *cfg, int *data_given,
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
    if (cfg->replicas > cfg->num_servers)
        return cps__cli_usage_error(cmd, "--replicas %u needs at least %u servers", cfg->replicas,
                                    cfg->replicas);
    if ((cfg->ckpt_dir[0] || cfg->ckpt_keep) && !cfg->ckpt_every)
        return cps__cli_usage_error(cmd, "--checkpoint-dir and --keep need --checkpoint-every");
    if (cfg->restore_optim[0] && !cfg->restore_from[0])
        return cps__cli_usage_error(cmd, "--restore-optimizer needs --restore-from");
    if (kill_server >= cfg->num_servers)
        return cps__cli_usage_error(cmd, "--kill-server %u: there are only %u servers", kill_server,
                                    cfg->num_servers);
    *prog = argv + optind;
    return 0;
}

int cps__cli_launch(int argc, char **argv)
{
    cps_config cfg;
    if (cps__cli_config(&cfg) != 0)
        return 2;
    int data_given, sched_port;
    uint32_t timeout_s, kill_at_s;
    char **prog;
    int prc = cps__cli_job_args("launch", argc, argv, &cfg, &data_given, &sched_port, &timeout_s,
                                &kill_at_s, &prog);
    if (prc != 0)
        return prc < 0 ? 0 : prc;

    cps_job job;
    if (cps__job_init(&job, &cfg, data_given, sched_port, prog) != 0)
        return 1;
    char kill_env[64];
    if (kill_at_s) {
        snprintf(kill_env, sizeof kill_env, "CHAINPS_KILL_AT_S=%u", kill_at_s);
        putenv(kill_env); /* inherited by every child */
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_interrupt;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    printf("launch: scheduler on 127.0.0.1:%d, %d servers (chains of %s), %d workers, mode %s, "
           "data in %s\n",
           job.port, job.S, job.repl, job.W, job.mode, job.data);
    fflush(stdout);

    int rc = cps__job_start_all(&job);
    int S = job.S, n = job.n;
    cps_child *kids = job.kids;
    uint64_t start = cps__now_ms(), restart_at = 0, job_ended_at = 0;
    int killed = 0;
    const char *why = NULL;
    while (rc == 0) {
        cps__job_pump(&job, 100);
        uint64_t now = cps__now_ms();
        cps_child *victim = &kids[1 + kill_server];
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
            if (cps__job_start(&job, 1 + (int)kill_server) == 0)
                printf("launch: +%.1f s: restarted server %u (pid %d); it copies its ranges "
                       "back from their tails\n",
                       (now - start) / 1000.0, kill_server, (int)victim->pid);
            fflush(stdout);
        }
        int workers_left = 0, failed = -1;
        for (int i = 1 + S; i < n; i++) {
            workers_left += !kids[i].exited;
            if (kids[i].exited && !cps__job_ok(&job, i))
                failed = i;
        }
        if (failed >= 0) {
            char b[96];
            printf("launch: %s failed (%s); stopping the job\n", kids[failed].tag,
                   cps__job_exit_text(kids[failed].status, b, sizeof b));
            rc = 1;
            break;
        }
        if (!workers_left)
            break;
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
        } else if (kids[0].exited) {
            char b[96];
            printf("launch: the scheduler exited (%s) while workers were running; stopping\n",
                   cps__job_exit_text(kids[0].status, b, sizeof b));
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
        cps__job_stop(&job, 1 + S, n, 0);
        cps__job_stop(&job, 0, 1 + S, 2000);
    } else {
        /* Normal end: the scheduler tells the servers to stop once every worker said BYE. */
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
    printf("launch: job %s in %.1f s\n", rc == 0 ? "finished" : "FAILED",
           (cps__now_ms() - start) / 1000.0);
    return rc;
}
