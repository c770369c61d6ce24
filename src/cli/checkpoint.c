/* `chainps checkpoint inspect|export|restore`: checkpoint files (src/checkpoint/ckpt.h). */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "chainps/error.h"
#include "checkpoint/ckpt.h"
#include "checkpoint/cluster.h"
#include "node/roles.h"
#include "worker/client.h"
#include "cli.h"

static const char checkpoint_usage[] =
    "usage: chainps checkpoint <inspect|export|restore> [options]\n"
    "\n"
    "Checkpoints are safetensors files (model.safetensors, or model-0000i-of-0000k.safetensors\n"
    "shards plus model.safetensors.index.json): parameters under their tensor names, optimizer\n"
    "state under optim/<slot>/<tensor>, the step, optimizer and a CRC-32 per tensor in\n"
    "__metadata__.\n"
    "\n"
    "  inspect PATH   list tensors, shapes, dtypes, step and metadata, and verify every\n"
    "                 checksum. PATH: a .safetensors file, an index .json, or a directory.\n"
    "                 Exit status 0 if the checkpoint is whole, 1 if it is corrupt or\n"
    "                 unreadable, 2 on a usage error.\n"
    "      --no-verify  check the structure only (do not read the tensor data)\n"
    "  export --scheduler HOST:PORT --out PATH [--step N] [--shard-mb MB] [--timeout S]\n"
    "                 a consistent cut of a running job: sync jobs exactly at a step boundary\n"
    "                 (the next one every range reaches, or step N), async jobs at each\n"
    "                 range's current sequence number. Training does not pause. PATH: a\n"
    "                 directory (gets model.safetensors) or a .safetensors file; written under\n"
    "                 a temporary name and renamed when complete.\n"
    "  restore --scheduler HOST:PORT --from PATH [--optimizer K --lr X] [--timeout S]\n"
    "                 load a checkpoint into a running cluster of any size (keys are laid out\n"
    "                 for its servers; chains replicate them) and admit workers held back by\n"
    "                 `scheduler --restore-from`. Workers that declare the tensors afterwards\n"
    "                 resume at the checkpoint's step (cps_tensor_step). A file written\n"
    "                 elsewhere without optimizer descriptions needs --optimizer and --lr.\n"
    "  export and restore talk to the job, so they need its secret:\n" CPS_CLI_SECRET_HELP "\n"
    "  -h, --help     this text\n";

static int inspect(const char *path, int verify)
{
    cps__ckpt_reader *r;
    int rc = cps__ckpt_reader_open(path, &r);
    if (rc) {
        fprintf(stderr, "chainps checkpoint inspect: %s: %s (%s)\n", path, cps_strerror(rc),
                rc == CPS_ECORRUPT ? "not a whole checkpoint; see the line above" : "unreadable");
        return 1;
    }
    size_t n = cps__ckpt_reader_count(r), nsh = cps__ckpt_reader_shard_count(r);
    printf("checkpoint: %s\n", path);
    if (cps__ckpt_reader_index_path(r))
        printf("index:      %s\n", cps__ckpt_reader_index_path(r));
    for (size_t i = 0; i < nsh; i++)
        printf("%s %s\n", i ? "           " : "files:     ", cps__ckpt_reader_shard_path(r, i));
    const char *step = cps__ckpt_reader_meta(r, CPS_CKPT_META_STEP);
    printf("step:       %s\n", step ? step : "(none)");
    size_t nm = cps__ckpt_reader_meta_count(r);
    if (nm)
        printf("metadata:\n");
    for (size_t i = 0; i < nm; i++) {
        const char *k, *v;
        cps__ckpt_reader_meta_at(r, i, &k, &v);
        printf("  %s: %s\n", k, v);
    }
    uint64_t total = 0;
    size_t width = 4;
    for (size_t i = 0; i < n; i++) {
        const cps__ckpt_tensor *t = cps__ckpt_reader_tensor(r, i);
        total += t->nbytes;
        width = strlen(t->name) > width ? strlen(t->name) : width;
    }
    width = width > 60 ? 60 : width;
    printf("tensors:    %zu, %.1f MB\n", n, (double)total / 1e6);
    printf("  %-*s  %-5s  %-20s  %12s%s\n", (int)width, "name", "dtype", "shape", "bytes",
           nsh > 1 ? "  shard" : "");
    for (size_t i = 0; i < n; i++) {
        const cps__ckpt_tensor *t = cps__ckpt_reader_tensor(r, i);
        printf("  %-*s  %-5s  ", (int)width, t->name, t->dtype);
        char shape[64] = "";
        size_t at = 0;
        for (uint32_t d = 0; d < t->ndim && at < sizeof shape; d++)
            at += (size_t)snprintf(shape + at, sizeof shape - at, "%s%" PRIu64, d ? ", " : "",
                                   t->shape[d]);
        char br[80];
        snprintf(br, sizeof br, "[%s]", shape);
        printf("%-20s  %12" PRIu64, br, t->nbytes);
        if (nsh > 1)
            printf("  %u", t->shard + 1);
        printf("\n");
    }
    if (!verify) {
        printf("checksums:  not verified (--no-verify)\n");
        cps__ckpt_reader_close(r);
        return 0;
    }
    size_t bad = 0, unchecked = 0, io = 0;
    for (size_t i = 0; i < n; i++) {
        const cps__ckpt_tensor *t = cps__ckpt_reader_tensor(r, i);
        if (!t->has_checksum) {
            unchecked++;
            continue;
        }
        int vrc = cps__ckpt_reader_verify(r, t);
        if (vrc == CPS_ECORRUPT) {
            printf("checksum:   BAD %s (in %s)\n", t->name, t->file);
            bad++;
        } else if (vrc) {
            printf("checksum:   cannot read %s (in %s): %s\n", t->name, t->file, cps_strerror(vrc));
            io++;
        }
    }
    if (!bad && !io && !unchecked)
        printf("checksums:  all %zu verify\n", n);
    else if (!bad && !io)
        printf("checksums:  %zu verify, %zu tensors carry no checksum\n", n - unchecked, unchecked);
    else
        printf("checksums:  %zu of %zu do not verify%s\n", bad + io, n - unchecked,
               io ? " (some could not be read)" : "");
    cps__ckpt_reader_close(r);
    return bad || io ? 1 : 0;
}

static const struct option checkpoint_opts[] = {
    {"no-verify", no_argument, 0, 'n'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};

enum { OPT_SCHED = 1, OPT_OUT, OPT_FROM, OPT_STEP, OPT_SHARD, OPT_TIMEOUT, OPT_OPTIM, OPT_LR };
static const struct option cluster_opts[] = {{"scheduler", required_argument, 0, OPT_SCHED},
                                             {"out", required_argument, 0, OPT_OUT},
                                             {"from", required_argument, 0, OPT_FROM},
                                             {"step", required_argument, 0, OPT_STEP},
                                             {"shard-mb", required_argument, 0, OPT_SHARD},
                                             {"timeout", required_argument, 0, OPT_TIMEOUT},
                                             {"optimizer", required_argument, 0, OPT_OPTIM},
                                             {"lr", required_argument, 0, OPT_LR},
                                             CPS_CLI_SECRET_OPTS,
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};

static int parse_u64(const char *cmd, const char *what, const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *end || errno || s[0] == '-')
        return cps__cli_usage_error(cmd, "%s: '%s' is not a non-negative integer", what, s);
    *out = v;
    return 0;
}

static int cluster_cmd(const char *sub, int argc, char **argv)
{
    char cmd[32];
    snprintf(cmd, sizeof cmd, "checkpoint %s", sub);
    const char *sched = getenv("CHAINPS_SCHEDULER"), *out = NULL, *from = NULL;
    uint64_t step = 0, shard_mb = 0, timeout_s = 0;
    const char *optim = NULL, *lr_text = NULL;
    cps__config cfg; /* for the job's secret */
    if (cps__cli_config(&cfg) != 0)
        return 2;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "h", cluster_opts, NULL)) != -1) {
        int rc = 0;
        switch (opt) {
        case 'h':
            fputs(checkpoint_usage, stdout);
            return 0;
        case OPT_SCHED:
            sched = optarg;
            break;
        case OPT_OUT:
            out = optarg;
            break;
        case OPT_FROM:
            from = optarg;
            break;
        case OPT_STEP:
            rc = parse_u64(cmd, "--step", optarg, &step);
            break;
        case OPT_SHARD:
            rc = parse_u64(cmd, "--shard-mb", optarg, &shard_mb);
            break;
        case OPT_TIMEOUT:
            rc = parse_u64(cmd, "--timeout", optarg, &timeout_s);
            if (rc == 0 && (timeout_s == 0 || timeout_s > 86400))
                rc = cps__cli_usage_error(cmd, "--timeout: 1..86400 seconds");
            break;
        case OPT_OPTIM:
            optim = optarg;
            break;
        case OPT_LR:
            lr_text = optarg;
            break;
        case CLI_OPT_SECRET_FILE:
        case CLI_OPT_INSECURE:
            rc = cps__cli_common_flag(cmd, opt, optarg, &cfg);
            break;
        default:
            return cps__cli_usage_error(cmd, "unknown option");
        }
        if (rc)
            return rc;
    }
    if (optind < argc)
        return cps__cli_usage_error(cmd, "unexpected argument '%s'", argv[optind]);
    if (!sched || !*sched)
        return cps__cli_usage_error(cmd,
                                    "--scheduler HOST:PORT is required (or CHAINPS_SCHEDULER)");
    if (cps__node_load_secret(&cfg, "checkpoint") != 0)
        return 2;
    if (!strcmp(sub, "export")) {
        if (!out || from || optim || lr_text)
            return cps__cli_usage_error(cmd, "export takes --out PATH (not --from, --optimizer, "
                                             "--lr)");
        cps__export_opts o = {.scheduler = sched,
                              .key = cps__node_key(&cfg),
                              .at_step = step,
                              .max_shard_bytes = shard_mb << 20,
                              .timeout_ms = (int)timeout_s * 1000,
                              .wait_start = 1};
        cps__export_result res;
        int rc = cps__ckpt_export(&o, out, &res);
        if (rc != 0) {
            fprintf(stderr, "chainps checkpoint export: %s: %s\n", out,
                    rc == CPS_EUNAVAILABLE ? "the job has not started yet (not every server and "
                                             "worker has joined)"
                                           : cps_strerror(rc));
            return 1;
        }
        printf("exported %u tensors (%.1f MB with optimizer state) at step %" PRIu64
               " in %.2f s: %s\n",
               res.tensors, res.bytes / 1e6, res.step, res.seconds, res.path);
        return 0;
    }
    if (!from || out || step || shard_mb)
        return cps__cli_usage_error(cmd, "restore takes --from PATH (not --out, --step, "
                                         "--shard-mb)");
    cps__param_spec spec;
    if ((optim || lr_text) && (!optim || !lr_text || cps__cli_parse_optim(optim, lr_text, &spec)))
        return cps__cli_usage_error(cmd, "--optimizer sgd|momentum|adagrad|adam|rmsprop and "
                                         "--lr X (> 0) go together");
    cps__restore_opts o = {.scheduler = sched,
                           .key = cps__node_key(&cfg),
                           .timeout_ms = (int)timeout_s * 1000,
                           .default_spec = (optim ? &spec : NULL),
                           .release = 1};
    cps__restore_result res;
    int rc = cps__ckpt_restore(&o, from, &res);
    if (rc != 0) {
        fprintf(stderr, "chainps checkpoint restore: %s: %s\n", from,
                rc == CPS_EUNAVAILABLE && !res.started
                    ? "the job has not started yet (not every server and "
                      "worker has joined)"
                    : cps_strerror(rc));
        return 1;
    }
    printf("restored %u tensors (%.1f MB with optimizer state) at step %" PRIu64 " in %.2f s\n",
           res.tensors, res.bytes / 1e6, res.step, res.seconds);
    return 0;
}

int cps__cli_checkpoint(int argc, char **argv)
{
    if (argc < 2) {
        fputs(checkpoint_usage, stderr);
        return 2;
    }
    const char *sub = argv[1];
    if (!strcmp(sub, "-h") || !strcmp(sub, "--help") || !strcmp(sub, "help")) {
        fputs(checkpoint_usage, stdout);
        return 0;
    }
    if (!strcmp(sub, "export") || !strcmp(sub, "restore"))
        return cluster_cmd(sub, argc - 1, argv + 1);
    if (strcmp(sub, "inspect"))
        return cps__cli_usage_error("checkpoint", "unknown subcommand '%s'", sub);
    int opt, verify = 1;
    optind = 1;
    while ((opt = getopt_long(argc - 1, argv + 1, "h", checkpoint_opts, NULL)) != -1) {
        if (opt == 'h') {
            fputs(checkpoint_usage, stdout);
            return 0;
        }
        if (opt == 'n') {
            verify = 0;
            continue;
        }
        return cps__cli_usage_error("checkpoint", "unknown option");
    }
    if (optind != argc - 2)
        return cps__cli_usage_error("checkpoint", "inspect takes exactly one PATH");
    return inspect(argv[1 + optind], verify);
}
