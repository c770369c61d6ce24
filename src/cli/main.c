/* chainps: run a scheduler or a server, launch a local job, or show a job's status. */
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "chainps/chainps.h"
#include "cli.h"
#include "core/log.h"
#include "node/roles.h"

static const char usage[] =
    "usage: chainps <command> [options]\n"
    "\n"
    "A parameter server for distributed training: servers keep parameters in LMDB, workers\n"
    "push gradients and pull parameters through libchainps.\n"
    "\n"
    "commands:\n"
    "  scheduler   run the job's scheduler (admits nodes, owns the key-range map)\n"
    "  server      run a parameter server\n"
    "  launch      run a scheduler, S servers and W copies of a training program locally\n"
    "  status      show a running job: nodes, ranks, key ranges, liveness, traffic\n"
    "  drain       move a server's key ranges to the others, then let it exit\n"
    "  checkpoint  export a running job's checkpoint, restore one, inspect and verify one\n"
    "  chaos       run a local job while killing, pausing and restarting its processes,\n"
    "              then check that nothing was lost\n"
    "  secret      create a job secret file (every process of a job is given the same one)\n"
    "\n"
    "`chainps <command> --help` describes each command. Configuration also comes from the\n"
    "environment (CHAINPS_*, ps-lite's DMLC_*, MindSpore's MS_*): see the README.\n";

/* ---- scheduler ---- */

static const char scheduler_usage[] =
    "usage: chainps scheduler --servers S --workers W [options]\n"
    "\n"
    "Run the scheduler of a job: it waits for S servers and W workers, assigns ranks, hands\n"
    "out the key-range map and ends the job when every worker has finished.\n"
    "Exit status: 0 when the job ended, 2 on a usage or configuration error, 3 when it refuses\n"
    "the job for good (a --restore-from it cannot read or restore, a data directory another\n"
    "process holds: a restart would be refused again), 1 on other errors.\n"
    "\n"
    "  --servers S        number of servers (env CHAINPS_NUM_SERVERS, DMLC_NUM_SERVER)\n"
    "  --workers W        number of workers (env CHAINPS_NUM_WORKERS, DMLC_NUM_WORKER)\n"
    "  --port P           port to listen on (default 9091; env CHAINPS_SCHEDULER port)\n"
    "  --bind ADDR        address to listen on (default: the scheduler's own address as the\n"
    "                     job names it, 127.0.0.1 unless CHAINPS_SCHEDULER / --advertise say\n"
    "                     otherwise; 0.0.0.0 listens on every interface)\n"
    "  --advertise ADDR   address other nodes use to reach the scheduler (informational)\n"
    "  --mode M           sync (default), async or ssp:N (bounded staleness N)\n"
    "  --backup-workers B sync mode: each step closes with the first W-B gradients to\n"
    "                     arrive (W live workers, 0 <= B < W; env CHAINPS_BACKUP_WORKERS);\n"
    "                     a late gradient is dropped and counted. Default 0: wait for all\n"
    "  --replicas R       servers in each key range's chain (default 3, or S if fewer)\n"
    "  --ranges N         key ranges of the job (default: one per server; env CHAINPS_RANGES):\n"
    "                     more ranges than servers let servers that join later take a fair\n"
    "                     share (see `chainps drain` for the way out)\n"
    "  --join-timeout S   give up if the nodes have not all arrived after S seconds (60)\n"
    "  --data DIR         keep the view in DIR/scheduler (default ./chainps-data): a scheduler\n"
    "                     restarted on the same DIR resumes an unfinished job\n"
    "  --hold             when the workers are done, keep the servers up (to inspect them)\n"
    "                     until `chainps status --end`\n"
    "  --await-replacements  a worker that died holds the job's end until a new worker has\n"
    "                     taken its rank and finished (chainps launch --restart-workers sets\n"
    "                     it); without it the job ends when the live workers are done, and a\n"
    "                     worker arriving later is refused (the job has ended)\n"
    "  --allow-rollback   on resuming a job (same --data): each range whose only replica is\n"
    "                     down with a fallback goes to the server that left it last, should\n"
    "                     that replica come back with an empty store (a new disk), LOSING\n"
    "                     the updates acknowledged since (logged at ERROR). Once per range,\n"
    "                     for the ranges waiting as this scheduler resumes, never for a\n"
    "                     later incident; keep the fallback server stopped until 'ROLLED\n"
    "                     BACK' is logged. Default: the range stays unavailable and the\n"
    "                     empty server is kept out until its old disk is back or a\n"
    "                     checkpoint is restored (docs/operations.md)\n" CPS_CLI_CKPT_HELP
        CPS_CLI_METRICS_HELP CPS_CLI_SECRET_HELP
    "  -v, --verbose      more logging (twice: debug)\n"
    "  -h, --help         this text\n";

static const struct option scheduler_opts[] = {
    {"checkpoint-every", required_argument, 0, CLI_OPT_CKPT_EVERY},
    {"checkpoint-dir", required_argument, 0, CLI_OPT_CKPT_DIR},
    {"keep", required_argument, 0, CLI_OPT_KEEP},
    {"restore-from", required_argument, 0, CLI_OPT_RESTORE_FROM},
    {"restore-optimizer", required_argument, 0, CLI_OPT_RESTORE_OPTIM},
    {"data", required_argument, 0, CLI_OPT_DATA},
    {"hold", no_argument, 0, CLI_OPT_HOLD},
    {"await-replacements", no_argument, 0, CLI_OPT_AWAIT_REPLACEMENTS},
    {"allow-rollback", no_argument, 0, CLI_OPT_ALLOW_ROLLBACK},
    {"servers", required_argument, 0, CLI_OPT_SERVERS},
    {"workers", required_argument, 0, CLI_OPT_WORKERS},
    {"port", required_argument, 0, CLI_OPT_PORT},
    {"bind", required_argument, 0, CLI_OPT_BIND},
    {"advertise", required_argument, 0, CLI_OPT_ADVERTISE},
    {"mode", required_argument, 0, CLI_OPT_MODE},
    {"backup-workers", required_argument, 0, CLI_OPT_BACKUP_WORKERS},
    {"replicas", required_argument, 0, CLI_OPT_REPLICAS},
    {"ranges", required_argument, 0, CLI_OPT_RANGES},
    {"join-timeout", required_argument, 0, CLI_OPT_JOIN_TIMEOUT},
    CPS_CLI_METRICS_OPTS,
    CPS_CLI_SECRET_OPTS,
    {"verbose", no_argument, 0, 'v'},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0}};

int cps__cli_scheduler(int argc, char **argv)
{
    cps__config cfg;
    if (cps__cli_config(&cfg) != 0)
        return 2;
    cfg.role = CPS_ROLE_SCHEDULER;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "vh", scheduler_opts, NULL)) != -1) {
        if (opt == 'h') {
            fputs(scheduler_usage, stdout);
            return 0;
        }
        if (opt == CLI_OPT_PORT) {
            char err[256];
            uint32_t v;
            if (cps__config_parse_u32("--port", optarg, 1, 65535, &v, err, sizeof err) != 0) {
                fprintf(stderr, "chainps scheduler: %s\n", err);
                return 2;
            }
            cfg.sched_port = (uint16_t)v;
            continue;
        }
        int rc = cps__cli_common_flag("scheduler", opt, optarg, &cfg);
        if (rc == 2)
            return 2;
        if (rc == 1)
            return cps__cli_usage_error("scheduler", "unknown option");
    }
    if (optind < argc)
        return cps__cli_usage_error("scheduler", "unexpected argument '%s'", argv[optind]);
    if (cfg.num_servers == 0 || cfg.num_workers == 0)
        return cps__cli_usage_error("scheduler", "--servers and --workers are required");
    if ((cfg.ckpt_dir[0] || cfg.ckpt_keep) && !cfg.ckpt_every)
        return cps__cli_usage_error("scheduler", "--checkpoint-dir and --keep need "
                                                 "--checkpoint-every");
    char berr[256];
    if (cps__config_check_backup(&cfg, berr, sizeof berr) != 0)
        return cps__cli_usage_error("scheduler", "%s", berr);
    cps__role_install_signals();
    if (cfg.restore_optim[0] && !cfg.restore_from[0])
        return cps__cli_usage_error("scheduler", "--restore-optimizer needs --restore-from");
    cfg.hold_workers = cfg.restore_from[0] != 0;
    /* Before the checkpoint threads, which talk to the scheduler with the same key. */
    if (cps__node_load_secret(&cfg, "scheduler") != 0)
        return 2;
    char err[1024];
    if (cfg.restore_from[0] && cps__cli_check_restore(cfg.restore_from, err, sizeof err) != 0) {
        /* Before listening: the workers could never be admitted. */
        cps__log(CPS_LOG_ERROR, "scheduler", "--restore-from %s: %s", cfg.restore_from, err);
        return CPS_CLI_EXIT_REFUSED;
    }
    if (cps__cli_ckpt_threads_start(&cfg) != 0)
        return 1;
    int rc = cps__scheduler_run(&cfg);
    if (cps__cli_restore_failed())
        return CPS_CLI_EXIT_REFUSED;
    /* A data directory another process holds, or a configuration it rejects: a restart on the
     * same directory and flags is refused the same way. */
    if (rc == CPS_EBUSY || rc == CPS_ECONFIG)
        return CPS_CLI_EXIT_REFUSED;
    return rc == 0 ? 0 : 1;
}

/* ---- server ---- */

static const char server_usage[] =
    "usage: chainps server [--scheduler HOST:PORT] [options]\n"
    "\n"
    "Run a parameter server: it joins the scheduler, keeps its key ranges in LMDB under the\n"
    "data directory, applies pushed gradients with each tensor's optimizer, serves pulls, and\n"
    "exits when the scheduler ends the job. Restarted on the same data directory, it comes\n"
    "back with its parameters.\n"
    "\n"
    "  --scheduler H:P    the scheduler (default 127.0.0.1:9091; env CHAINPS_SCHEDULER,\n"
    "                     DMLC_PS_ROOT_URI + DMLC_PS_ROOT_PORT, MS_SCHED_HOST + MS_SCHED_PORT)\n"
    "  --data DIR         LMDB directory, used by this server alone (env CHAINPS_DATA_DIR);\n"
    "                     default: the first of ./chainps-data/server-0, server-1, ... that\n"
    "                     no other process holds\n"
    "  --port P           inbox port (default: a free one)\n"
    "  --bind ADDR        address to bind (default: the advertised address)\n"
    "  --advertise ADDR   address others use to reach this server (default: the local\n"
    "                     address facing the scheduler)\n"
    "  --rank R           ask for server rank R (e.g. to come back as the same server)\n"
    "  --reset-data       empty the data directory's store first: needed to reuse the\n"
    "                     directory of another job, which is otherwise refused\n"
    "  --sync             fsync every commit (~130 us each here instead of ~3 us); by default\n"
    "                     commits are flushed every second and on exit\n"
    "  --join-timeout S   give up if the scheduler does not answer within S seconds "
    "(60)\n" CPS_CLI_METRICS_HELP CPS_CLI_SECRET_HELP
    "  -v, --verbose      more logging (twice: debug)\n"
    "  -h, --help         this text\n";

static const struct option server_opts[] = {
    {"scheduler", required_argument, 0, CLI_OPT_SCHEDULER},
    {"data", required_argument, 0, CLI_OPT_DATA},
    {"port", required_argument, 0, CLI_OPT_PORT},
    {"bind", required_argument, 0, CLI_OPT_BIND},
    {"advertise", required_argument, 0, CLI_OPT_ADVERTISE},
    {"rank", required_argument, 0, CLI_OPT_RANK},
    {"sync", no_argument, 0, CLI_OPT_SYNC},
    {"reset-data", no_argument, 0, CLI_OPT_RESET_DATA},
    {"join-timeout", required_argument, 0, CLI_OPT_JOIN_TIMEOUT},
    CPS_CLI_METRICS_OPTS,
    CPS_CLI_SECRET_OPTS,
    {"verbose", no_argument, 0, 'v'},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0}};

int cps__cli_server(int argc, char **argv)
{
    cps__config cfg;
    if (cps__cli_config(&cfg) != 0)
        return 2;
    cfg.role = CPS_ROLE_SERVER;
    int opt, bind_given = 0;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "vh", server_opts, NULL)) != -1) {
        if (opt == 'h') {
            fputs(server_usage, stdout);
            return 0;
        }
        bind_given |= opt == CLI_OPT_BIND;
        int rc = cps__cli_common_flag("server", opt, optarg, &cfg);
        if (rc == 2)
            return 2;
        if (rc == 1)
            return cps__cli_usage_error("server", "unknown option");
    }
    if (optind < argc)
        return cps__cli_usage_error("server", "unexpected argument '%s'", argv[optind]);
    (void)bind_given;
    cps__role_install_signals();
    return cps__server_run(&cfg) == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    /* A file size limit reached while writing (a checkpoint, LMDB) must come back as EFBIG, an
     * error we report with the file's name, not as a signal that kills the process. */
    signal(SIGXFSZ, SIG_IGN);
    /* No OpenSSL teardown at exit: the scheduler's checkpoint threads are detached and may be
     * sealing a message (RAND_bytes, the MAC) while the main thread returns, and a cleanup run by
     * exit() under them crashed one (a SEGV in RAND_bytes, seen under ASan after a job ended).
     * The memory goes back with the process anyway. */
    OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, NULL);
    if (argc < 2) {
        fputs(usage, stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        fputs(usage, stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("chainps %d.%d\n", CHAINPS_VERSION_MAJOR, CHAINPS_VERSION_MINOR);
        return 0;
    }
    if (!strcmp(cmd, "scheduler"))
        return cps__cli_scheduler(argc - 1, argv + 1);
    if (!strcmp(cmd, "server"))
        return cps__cli_server(argc - 1, argv + 1);
    if (!strcmp(cmd, "launch"))
        return cps__cli_launch(argc - 1, argv + 1);
    if (!strcmp(cmd, "status"))
        return cps__cli_status(argc - 1, argv + 1);
    if (!strcmp(cmd, "drain"))
        return cps__cli_drain(argc - 1, argv + 1);
    if (!strcmp(cmd, "checkpoint"))
        return cps__cli_checkpoint(argc - 1, argv + 1);
    if (!strcmp(cmd, "chaos"))
        return cps__cli_chaos(argc - 1, argv + 1);
    if (!strcmp(cmd, "secret"))
        return cps__cli_secret(argc - 1, argv + 1);
    fprintf(stderr, "chainps: unknown command '%s'\n\n%s", cmd, usage);
    return 2;
}
