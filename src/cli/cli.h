/* The `chainps` command: one subcommand per file. */
#ifndef CPS_CLI_H
#define CPS_CLI_H

#include <stdint.h>

#include "core/config.h"
#include "core/wire.h"

/* Exit status of a scheduler or server that refuses the job for a reason a restart cannot
 * change (a checkpoint to restore that cannot be read, a data directory held by another process,
 * a bad configuration), as opposed to a crash: `chainps launch` ends the job at once on it (and
 * on 2, a usage error) instead of restarting the scheduler. */
#define CPS_CLI_EXIT_REFUSED 3

int cps__cli_scheduler(int argc, char **argv);
int cps__cli_server(int argc, char **argv);
int cps__cli_launch(int argc, char **argv);
int cps__cli_status(int argc, char **argv);
int cps__cli_drain(int argc, char **argv);
int cps__cli_checkpoint(int argc, char **argv);
int cps__cli_chaos(int argc, char **argv);
int cps__cli_secret(int argc, char **argv);

/* Parse launch's job arguments (`--servers S --workers W ... -- PROGRAM ARGS`) into cfg.
 * Returns 0, 2 (usage error, printed), or -1 (--help was printed). */
int cps__cli_job_args(const char *cmd, int argc, char **argv, cps__config *cfg, int *data_given,
                      int *port, uint32_t *timeout_s, uint32_t *kill_at_s, char ***prog);
/* 1 if the last cps__cli_job_args saw --restart-workers (chaos honours it as launch does). */
int cps__cli_job_restart_workers(void);

/* Check what a job is given before anything starts (preflight.c): --restore-from is a readable
 * checkpoint, --secret-file passes the nodes' rule, prog[0] resolves to an executable as execvp
 * would. Returns 0, or 2 with one line "chainps <cmd>: <flag> ...: <problem>" on stderr. */
int cps__cli_job_check(const char *cmd, const cps__config *cfg, char *const *prog);
/* 0 if `path` exists, is readable and opens as a checkpoint (structure only); else -1 with the
 * reason in err (len bytes). The reader's own log line is folded into err, not printed. */
int cps__cli_check_restore(const char *path, char *err, size_t len);

/* Defaults + environment into cfg; prints the error and returns 2 on a bad variable. */
int cps__cli_config(cps__config *cfg);
/* Print "chainps <cmd>: <msg>" to stderr and return 2 (usage errors). */
int cps__cli_usage_error(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Apply one of the flags shared by several subcommands (value in optarg); returns 0 if handled,
 * 1 if not a shared flag, 2 on a bad value (message printed). */
int cps__cli_common_flag(const char *cmd, int opt, const char *optarg_, cps__config *cfg);

/* A tool's side of talking to the scheduler (status, drain): a transport keyed by the job's
 * secret, bound to an ephemeral port, with the scheduler as peer 0. url (url_len bytes)
 * receives the scheduler's address, me (CPS_ADDR_MAX bytes) ours for its replies. *tp is the
 * caller's to destroy, even on error (it may be NULL). Returns the transport's error. */
struct cps__tp;
int cps__cli_tool_open(const cps__config *cfg, struct cps__tp **tp, char *url, size_t url_len,
                       char *me);

/* getopt_long codes of the shared flags. */
enum {
    CLI_OPT_PORT = 1000,
    CLI_OPT_BIND,
    CLI_OPT_ADVERTISE,
    CLI_OPT_SCHEDULER,
    CLI_OPT_SERVERS,
    CLI_OPT_WORKERS,
    CLI_OPT_MODE,
    CLI_OPT_REPLICAS,
    CLI_OPT_DATA,
    CLI_OPT_RANK,
    CLI_OPT_JOIN_TIMEOUT,
    CLI_OPT_SYNC,
    CLI_OPT_NO_COMPRESS,
    CLI_OPT_TIMEOUT,
    CLI_OPT_KEEP_DATA,
    CLI_OPT_VERIFY,
    CLI_OPT_HOLD,
    CLI_OPT_AWAIT_REPLACEMENTS,
    CLI_OPT_ALLOW_ROLLBACK,
    CLI_OPT_END,
    CLI_OPT_JSON,
    CLI_OPT_WATCH,
    CLI_OPT_COUNT,
    CLI_OPT_KILL_AT,
    CLI_OPT_KILL_SERVER,
    CLI_OPT_CKPT_EVERY,
    CLI_OPT_CKPT_DIR,
    CLI_OPT_KEEP,
    CLI_OPT_RESTORE_FROM,
    CLI_OPT_RESTORE_OPTIM,
    CLI_OPT_RESTART_WORKERS,
    CLI_OPT_RESET_DATA,
    CLI_OPT_SECRET_FILE,
    CLI_OPT_INSECURE,
    CLI_OPT_COMPRESS,
    CLI_OPT_METRICS_PORT,
    CLI_OPT_METRICS_BIND,
    CLI_OPT_RANGES,
    CLI_OPT_SERVER,
    CLI_OPT_NO_WAIT,
    CLI_OPT_BACKUP_WORKERS,
};

/* The job-secret flags every subcommand takes, for its struct option table and its help. */
#define CPS_CLI_SECRET_OPTS                                                                        \
    {"secret-file", required_argument, 0, CLI_OPT_SECRET_FILE},                                    \
    {                                                                                              \
        "insecure", no_argument, 0, CLI_OPT_INSECURE                                               \
    }
#define CPS_CLI_SECRET_HELP                                                                        \
    "  --secret-file F    the job's secret (env CHAINPS_SECRET_FILE): every message carries a\n"   \
    "                     MAC under it; `chainps secret F` makes one\n"                            \
    "  --insecure         run without a secret (env CHAINPS_INSECURE=1): anyone who reaches\n"     \
    "                     the job's ports can join, read, overwrite or end it\n"

/* The metrics flags of `scheduler` and `server` (node/metrics.h), for option tables and help. */
#define CPS_CLI_METRICS_OPTS                                                                       \
    {"metrics-port", required_argument, 0, CLI_OPT_METRICS_PORT},                                  \
    {                                                                                              \
        "metrics-bind", required_argument, 0, CLI_OPT_METRICS_BIND                                 \
    }
#define CPS_CLI_METRICS_HELP                                                                       \
    "  --metrics-port P   serve Prometheus metrics at http://ADDR:P/metrics (0, the default:\n"    \
    "                     none); see the README for the metric names\n"                            \
    "  --metrics-bind ADDR  the IPv4 address the metrics listen on (default 127.0.0.1)\n"

/* Help text of the checkpoint flags of `scheduler` and `launch`. */
#define CPS_CLI_CKPT_HELP                                                                          \
    "  --checkpoint-every N|Ns  export a checkpoint every N training steps (sync jobs: exactly\n"  \
    "                     at steps N, 2N, ...) or every N seconds (`30s`)\n"                       \
    "  --checkpoint-dir DIR     where: DIR/step-<step>/ each, written under a temporary\n"         \
    "                     name and renamed when complete (default: DATA/checkpoints for\n"         \
    "                     `scheduler`, ./chainps-checkpoints for `launch`)\n"                      \
    "  --keep K           keep the newest K checkpoints (default: all)\n"                          \
    "  --restore-from PATH      load this checkpoint (any server count: keys are re-sharded)\n"    \
    "                     before the workers start; they resume at its step\n"                     \
    "  --restore-optimizer KIND:LR  for tensors of a file written elsewhere (no optimizer\n"       \
    "                     description in it), e.g. sgd:0.1 or adam:0.001\n"

/* Checkpoint threads of the scheduler's process: the periodic export, and the restore that
 * runs before the workers are let in. Both talk to the scheduler at 127.0.0.1:cfg->sched_port.
 * Return 0 or an error (logged). */
int cps__cli_ckpt_threads_start(const cps__config *cfg);
/* 1 once the --restore-from thread has failed for good: it then asked the scheduler to stop
 * (cps__role_request_stop), since it can never admit the workers. */
int cps__cli_restore_failed(void);
/* The optimizer description "KIND:LR" (or KIND and LR apart: pass lr_text NULL to split at ':')
 * into spec, with the library's defaults for everything else. Returns 0, or -1 (bad kind or
 * learning rate). */
int cps__cli_parse_optim(const char *kind, const char *lr_text, cps__param_spec *spec);

#endif
