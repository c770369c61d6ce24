/* chainps: run a scheduler or a server, launch a local job, or show a job's status. */
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    "  checkpoint  export a running job's checkpoint, restore one, inspect and verify one\n"
    "  chaos       run a local job while killing, pausing and restarting its processes,\n"
    "              then check that nothing was lost\n"
    "  secret      create a job secret file (every process of a job is given the same one)\n"
    "\n"
    "`chainps <command> --help` describes each command. Configuration also comes from the\n"
    "environment (CHAINPS_*, ps-lite's DMLC_*, MindSpore's MS_*): see the README.\n";

int cps__cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "chainps %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(see `chainps %s --help`)\n", cmd);
    return 2;
}

int cps__cli_config(cps_config *cfg)
{
    char err[512];
    cps__config_defaults(cfg);
    if (cps__config_from_env(cfg, err, sizeof err) != 0) {
        fprintf(stderr, "chainps: %s\n", err);
        return 2;
    }
    return 0;
}

int cps__cli_common_flag(const char *cmd, int opt, const char *arg, cps_config *cfg)
{
    char err[512];
    uint32_t v;
    int rc = 0;
    switch (opt) {
    case CLI_OPT_PORT:
        rc = cps__config_parse_u32("--port", arg, 0, 65535, &v, err, sizeof err);
        if (rc == 0) {
            cfg->port = (uint16_t)v;
            if (cfg->role == CPS_ROLE_SCHEDULER)
                cfg->sched_port = (uint16_t)v;
        }
        break;
    case CLI_OPT_BIND:
        snprintf(cfg->bind_host, sizeof cfg->bind_host, "%s", arg);
        break;
    case CLI_OPT_ADVERTISE:
        snprintf(cfg->advertise_host, sizeof cfg->advertise_host, "%s", arg);
        break;
    case CLI_OPT_SCHEDULER:
        rc = cps__config_parse_hostport("--scheduler", arg, cfg->sched_host, &cfg->sched_port, err,
                                        sizeof err);
        break;
    case CLI_OPT_SERVERS:
        rc = cps__config_parse_u32("--servers", arg, 1, 512, &cfg->num_servers, err, sizeof err);
        break;
    case CLI_OPT_WORKERS:
        rc = cps__config_parse_u32("--workers", arg, 1, 512, &cfg->num_workers, err, sizeof err);
        break;
    case CLI_OPT_MODE:
        rc = cps__config_parse_mode("--mode", arg, &cfg->mode, &cfg->ssp_bound, err, sizeof err);
        break;
    case CLI_OPT_REPLICAS:
        rc = cps__config_parse_u32("--replicas", arg, 1, 8, &cfg->replicas, err, sizeof err);
        break;
    case CLI_OPT_DATA:
        snprintf(cfg->data_dir, sizeof cfg->data_dir, "%s", arg);
        cfg->data_dir_given = 1;
        break;
    case CLI_OPT_RANK:
        rc = cps__config_parse_u32("--rank", arg, 0, 1023, &cfg->rank, err, sizeof err);
        break;
    case CLI_OPT_JOIN_TIMEOUT:
        rc = cps__config_parse_u32("--join-timeout", arg, 1, 86400, &v, err, sizeof err);
        if (rc == 0)
            cfg->join_timeout_ms = v * 1000;
        break;
    case CLI_OPT_RESET_DATA:
        cfg->reset_data = 1;
        break;
    case CLI_OPT_SECRET_FILE:
        if (!*arg || strlen(arg) >= sizeof cfg->secret_file) {
            snprintf(err, sizeof err, "--secret-file: empty or longer than %zu characters",
                     sizeof cfg->secret_file - 1);
            rc = CPS_ECONFIG;
        } else {
            snprintf(cfg->secret_file, sizeof cfg->secret_file, "%s", arg);
        }
        break;
    case CLI_OPT_INSECURE:
        cfg->insecure = 1;
        break;
    case CLI_OPT_SYNC:
        cfg->sync_every_commit = 1;
        break;
    case CLI_OPT_NO_COMPRESS:
        cfg->compress = 0;
        break;
    case CLI_OPT_HOLD:
        cfg->hold = 1;
        break;
    case CLI_OPT_AWAIT_REPLACEMENTS:
        cfg->await_replacements = 1;
        break;
    case CLI_OPT_CKPT_EVERY: {
        char num[32];
        size_t len = strlen(arg);
        int secs = len > 1 && arg[len - 1] == 's';
        snprintf(num, sizeof num, "%.*s", (int)(secs ? len - 1 : len), arg);
        rc = cps__config_parse_u32("--checkpoint-every", num, 1, 100000000, &v, err, sizeof err);
        if (rc == 0) {
            cfg->ckpt_every = v;
            cfg->ckpt_every_seconds = secs;
        }
        break;
    }
    case CLI_OPT_CKPT_DIR:
        if (!*arg || strlen(arg) >= sizeof cfg->ckpt_dir) {
            snprintf(err, sizeof err, "--checkpoint-dir: empty or too long");
            rc = CPS_ECONFIG;
        } else {
            snprintf(cfg->ckpt_dir, sizeof cfg->ckpt_dir, "%s", arg);
        }
        break;
    case CLI_OPT_KEEP:
        rc = cps__config_parse_u32("--keep", arg, 1, 1000000, &cfg->ckpt_keep, err, sizeof err);
        break;
    case CLI_OPT_RESTORE_OPTIM: {
        cps_param_spec spec;
        if (strlen(arg) >= sizeof cfg->restore_optim || cps__cli_parse_optim(arg, NULL, &spec)) {
            snprintf(err, sizeof err,
                     "--restore-optimizer: '%s' is not KIND:LR (KIND sgd, momentum, adagrad, "
                     "adam or rmsprop; LR > 0)",
                     arg);
            rc = CPS_ECONFIG;
        } else {
            snprintf(cfg->restore_optim, sizeof cfg->restore_optim, "%s", arg);
        }
        break;
    }
    case CLI_OPT_RESTORE_FROM:
        if (!*arg || strlen(arg) >= sizeof cfg->restore_from) {
            snprintf(err, sizeof err, "--restore-from: empty or too long");
            rc = CPS_ECONFIG;
        } else {
            snprintf(cfg->restore_from, sizeof cfg->restore_from, "%s", arg);
        }
        break;
    case 'v':
        cfg->verbose++;
        cps__log_set_level(cfg->verbose >= 2 ? CPS_LOG_DEBUG : CPS_LOG_INFO);
        break;
    default:
        return 1;
    }
    if (rc != 0) {
        fprintf(stderr, "chainps %s: %s\n", cmd, err);
        return 2;
    }
    return 0;
}

/* ---- scheduler ---- */

static const char scheduler_usage[] =
    "usage: chainps scheduler --servers S --workers W [options]\n"
    "\n"
    "Run the scheduler of a job: it waits for S servers and W workers, assigns ranks, hands\n"
    "out the key-range map and ends the job when every worker has finished.\n"
    "\n"
    "  --servers S        number of servers (env CHAINPS_NUM_SERVERS, DMLC_NUM_SERVER)\n"
    "  --workers W        number of workers (env CHAINPS_NUM_WORKERS, DMLC_NUM_WORKER)\n"
    "  --port P           port to listen on (default 9091; env CHAINPS_SCHEDULER port)\n"
    "  --bind ADDR        address to listen on (default: the scheduler's own address as the\n"
    "                     job names it, 127.0.0.1 unless CHAINPS_SCHEDULER / --advertise say\n"
    "                     otherwise; 0.0.0.0 listens on every interface)\n"
    "  --advertise ADDR   address other nodes use to reach the scheduler (informational)\n"
    "  --mode M           sync (default), async or ssp:N (bounded staleness N)\n"
    "  --replicas R       servers in each key range's chain (default 3, or S if fewer)\n"
    "  --join-timeout S   give up if the nodes have not all arrived after S seconds (60)\n"
    "  --data DIR         keep the view in DIR/scheduler (default ./chainps-data): a scheduler\n"
    "                     restarted on the same DIR resumes an unfinished job\n"
    "  --hold             when the workers are done, keep the servers up (to inspect them)\n"
    "                     until `chainps status --end`\n"
    "  --await-replacements  a worker that died holds the job's end until a new worker has\n"
    "                     taken its rank and finished (chainps launch --restart-workers sets\n"
    "                     it); without it the job ends when the live workers are done, and a\n"
    "                     worker arriving later is refused (the job has ended)\n" CPS_CLI_CKPT_HELP
        CPS_CLI_SECRET_HELP "  -v, --verbose      more logging (twice: debug)\n"
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
    {"servers", required_argument, 0, CLI_OPT_SERVERS},
    {"workers", required_argument, 0, CLI_OPT_WORKERS},
    {"port", required_argument, 0, CLI_OPT_PORT},
    {"bind", required_argument, 0, CLI_OPT_BIND},
    {"advertise", required_argument, 0, CLI_OPT_ADVERTISE},
    {"mode", required_argument, 0, CLI_OPT_MODE},
    {"replicas", required_argument, 0, CLI_OPT_REPLICAS},
    {"join-timeout", required_argument, 0, CLI_OPT_JOIN_TIMEOUT},
    CPS_CLI_SECRET_OPTS,
    {"verbose", no_argument, 0, 'v'},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0}};

int cps__cli_scheduler(int argc, char **argv)
{
    cps_config cfg;
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
    cps__role_install_signals();
    if (cfg.restore_optim[0] && !cfg.restore_from[0])
        return cps__cli_usage_error("scheduler", "--restore-optimizer needs --restore-from");
    cfg.hold_workers = cfg.restore_from[0] != 0;
    /* Before the checkpoint threads, which talk to the scheduler with the same key. */
    if (cps__node_load_secret(&cfg, "scheduler") != 0)
        return 2;
    if (cps__cli_ckpt_threads_start(&cfg) != 0)
        return 1;
    return cps__scheduler_run(&cfg) == 0 ? 0 : 1;
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
    "(60)\n" CPS_CLI_SECRET_HELP "  -v, --verbose      more logging (twice: debug)\n"
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
    CPS_CLI_SECRET_OPTS,
    {"verbose", no_argument, 0, 'v'},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0}};

int cps__cli_server(int argc, char **argv)
{
    cps_config cfg;
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
    if (!strcmp(cmd, "checkpoint"))
        return cps__cli_checkpoint(argc - 1, argv + 1);
    if (!strcmp(cmd, "chaos"))
        return cps__cli_chaos(argc - 1, argv + 1);
    if (!strcmp(cmd, "secret"))
        return cps__cli_secret(argc - 1, argv + 1);
    fprintf(stderr, "chainps: unknown command '%s'\n\n%s", cmd, usage);
    return 2;
}
