/* What the commands share: configuration from the environment, the flags every role takes,
 * usage errors, and parsing an optimizer's name and learning rate. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/chainps.h"
#include "cli.h"
#include "core/log.h"
#include "node/roles.h"
#include "transport/transport.h"
#include "worker/client.h"

int cps__cli_parse_optim(const char *kind, const char *lr_text, cps__param_spec *spec)
{
    static const char *const kinds[] = {"sgd", "momentum", "adagrad", "adam", "rmsprop"};
    char name[32];
    const char *colon = lr_text ? NULL : strchr(kind, ':');
    size_t klen = colon ? (size_t)(colon - kind) : strlen(kind);
    if (!lr_text && !colon)
        return -1;
    snprintf(name, sizeof name, "%.*s", (int)(klen < sizeof name ? klen : sizeof name - 1), kind);
    const char *num = lr_text ? lr_text : colon + 1;
    char *end;
    float lr = strtof(num, &end);
    int k = -1;
    for (int i = 0; i < 5; i++)
        if (!strcmp(name, kinds[i]))
            k = i;
    if (k < 0 || !*num || *end || !(lr > 0) || lr > 1e6f)
        return -1;
    /* Built as a worker's declaration is, so the restored records match it. */
    cps_optim o = {.kind = (cps_optim_kind)k, .lr = lr};
    return cps__spec_make("(restore)", NULL, &o, spec) == 0 ? 0 : -1;
}

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

int cps__cli_config(cps__config *cfg)
{
    char err[512];
    cps__config_defaults(cfg);
    if (cps__config_from_env(cfg, err, sizeof err) != 0) {
        fprintf(stderr, "chainps: %s\n", err);
        return 2;
    }
    return 0;
}

int cps__cli_common_flag(const char *cmd, int opt, const char *arg, cps__config *cfg)
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
    case CLI_OPT_METRICS_PORT:
        rc = cps__config_parse_u32("--metrics-port", arg, 0, 65535, &v, err, sizeof err);
        if (rc == 0)
            cfg->metrics_port = (uint16_t)v;
        break;
    case CLI_OPT_METRICS_BIND:
        if (!*arg || strlen(arg) >= sizeof cfg->metrics_bind) {
            snprintf(err, sizeof err, "--metrics-bind: empty or too long");
            rc = CPS_ECONFIG;
        } else {
            snprintf(cfg->metrics_bind, sizeof cfg->metrics_bind, "%s", arg);
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
    case CLI_OPT_BACKUP_WORKERS:
        rc = cps__config_parse_backup("--backup-workers", arg, &cfg->backup_workers, err,
                                      sizeof err);
        break;
    case CLI_OPT_REPLICAS:
        rc = cps__config_parse_u32("--replicas", arg, 1, 8, &cfg->replicas, err, sizeof err);
        break;
    case CLI_OPT_RANGES:
        rc = cps__config_parse_u32("--ranges", arg, 1, CPS_MAX_RANGES, &cfg->num_ranges, err,
                                   sizeof err);
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
    case CLI_OPT_COMPRESS:
        if (cps__gradcodec_parse(arg, &cfg->grad_codec) != 0) {
            snprintf(err, sizeof err,
                     "--compress: '%s' is not a gradient codec (fp16, bf16, topk:R with "
                     "0 < R <= 1, or none)",
                     arg);
            rc = CPS_ECONFIG;
        }
        break;
    case CLI_OPT_HOLD:
        cfg->hold = 1;
        break;
    case CLI_OPT_AWAIT_REPLACEMENTS:
        cfg->await_replacements = 1;
        break;
    case CLI_OPT_ALLOW_ROLLBACK:
        cfg->allow_rollback = 1;
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
        cps__param_spec spec;
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

int cps__cli_tool_open(const cps__config *cfg, cps__tp **tp, char *url, size_t url_len, char *me)
{
    uint16_t port = 0;
    snprintf(url, url_len, "tcp://%s:%u", cfg->sched_host, cfg->sched_port);
    int rc = cps__tp_create(cps__node_key(cfg), tp);
    if (rc == 0)
        rc = cps__tp_bind(*tp, cfg->bind_host, 0, &port);
    if (rc == 0)
        rc = cps__tp_peer_set(*tp, 0, url);
    if (rc == 0)
        rc = cps__make_url(me, cfg->advertise_host, port);
    return rc;
}
