/* fmnist's command line (options.h): usage, flag parsing and the checks between flags. */
#include "options.h"

#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"

const char *fm_optim_name(cps_optim_kind k)
{
    static const char *names[] = {"sgd", "momentum", "adagrad", "adam", "rmsprop"};
    return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "?";
}

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: fmnist [options]\n"
        "Train an MLP or a LeNet-5-style CNN on Fashion-MNIST through chainps.\n"
        "  --model mlp|cnn        network (default mlp)\n"
        "  --epochs N             passes over this worker's shard (default 10)\n"
        "  --batch B              batch size per worker (default 64)\n"
        "  --lr X                 learning rate (default: sgd 0.1, momentum 0.01, adam 0.001)\n"
        "  --optimizer sgd|momentum|adam  server-side optimizer (default momentum 0.9)\n"
        "  --schedule cosine|constant  step size over the run (default cosine, see README)\n"
        "  --weight-decay X       L2 coefficient added to the gradient (default 0)\n"
        "  --seed S               seed of the initial values and the shuffles (default 1)\n"
        "  --steps N              stop after N steps in total (default: no limit)\n"
        "  --log-every N          print the loss every N steps of an epoch (default 100, 0 off)\n"
        "  --local                train in this process, without a parameter server\n"
        "  --no-overlap           push-pull after the whole backward pass, not layer by layer\n"
        "  --allreduce            keep every parameter on every worker and all-reduce the\n"
        "                         gradients (the optimizer runs on each worker, no servers used)\n"
        "  --sync-every K         accumulate K steps' gradients, then all-reduce or push once\n"
        "  --warmup N             --allreduce: N steps on own gradients, then average (default 0)\n"
        "  --data DIR             IDX .gz files (default " FM_DEFAULT_DATA_DIR ")\n"
        "  --out DIR              where the CSV, plot and model go (default fmnist-out)\n"
        "  --csv PATH             CSV of time_s,epoch,step,loss,accuracy (default "
        "OUT/fmnist-MODEL.csv)\n"
        "  --plot PATH.png        plot of loss and accuracy (default OUT/fmnist-MODEL.png)\n"
        "  --help                 this text\n"
        "In parameter-server mode start the same program in every role (CHAINPS_ROLE=...);\n"
        "rank 0 writes the CSV, plot and model.\n");
}

static int bad_flag(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("fmnist: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    usage(stderr);
    return 2;
}

static int parse_long(const char *flag, const char *s, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max)
        return bad_flag("%s: expected an integer in %ld..%ld, got '%s'", flag, min, max, s);
    *out = v;
    return 0;
}

enum {
    OPT_MODEL = 1000,
    OPT_EPOCHS,
    OPT_BATCH,
    OPT_LR,
    OPT_WD,
    OPT_SCHED,
    OPT_SEED,
    OPT_LOCAL,
    OPT_NO_OVERLAP,
    OPT_ALLREDUCE,
    OPT_SYNC_EVERY,
    OPT_WARMUP,
    OPT_OPTIM,
    OPT_LOGEVERY,
    OPT_STEPS,
    OPT_CSV,
    OPT_PLOT,
    OPT_OUT,
    OPT_DATA,
    OPT_HELP
};

static int parse_one(fm_opts *o, int c, const char *arg, const char *flag)
{
    long v = 0; /* set by parse_long on success; initialised for -O3 flow analysis */
    int rc = 0;
    switch (c) {
    case OPT_MODEL:
        if (!strcmp(arg, "mlp"))
            o->model = FM_MODEL_MLP;
        else if (!strcmp(arg, "cnn"))
            o->model = FM_MODEL_CNN;
        else
            rc = bad_flag("--model: expected mlp or cnn, got '%s'", arg);
        break;
    case OPT_SCHED:
        if (!strcmp(arg, "cosine"))
            o->cosine = 1;
        else if (!strcmp(arg, "constant"))
            o->cosine = 0;
        else
            rc = bad_flag("--schedule: expected cosine or constant, got '%s'", arg);
        break;
    case OPT_OPTIM:
        if (!strcmp(arg, "sgd"))
            o->optim = CPS_OPTIM_SGD;
        else if (!strcmp(arg, "momentum"))
            o->optim = CPS_OPTIM_MOMENTUM;
        else if (!strcmp(arg, "adam"))
            o->optim = CPS_OPTIM_ADAM;
        else
            rc = bad_flag("--optimizer: expected sgd, momentum or adam, got '%s'", arg);
        break;
    case OPT_LR:
    case OPT_WD: {
        char *end;
        errno = 0;
        double d = strtod(arg, &end);
        if (c == OPT_LR && (errno || end == arg || *end || !(d > 0.0) || d > 100.0))
            return bad_flag("--lr: expected a number in (0, 100], got '%s'", arg);
        if (c == OPT_WD && (errno || end == arg || *end || !(d >= 0.0) || d > 1.0))
            return bad_flag("--weight-decay: expected a number in [0, 1], got '%s'", arg);
        *(c == OPT_LR ? &o->lr : &o->wd) = (float)d;
        break;
    }
    case OPT_EPOCHS:
        if (!(rc = parse_long(flag, arg, 1, 100000, &v)))
            o->epochs = (int)v;
        break;
    case OPT_BATCH:
        if (!(rc = parse_long(flag, arg, 1, 60000, &v)))
            o->batch = (int)v;
        break;
    case OPT_LOGEVERY:
        if (!(rc = parse_long(flag, arg, 0, 1000000000L, &v)))
            o->log_every = (int)v;
        break;
    case OPT_STEPS:
        if (!(rc = parse_long(flag, arg, 1, 1000000000L, &v)))
            o->steps = v;
        break;
    case OPT_SEED: {
        char *end;
        errno = 0;
        unsigned long long s = strtoull(arg, &end, 0);
        if (errno || end == arg || *end || arg[0] == '-')
            return bad_flag("--seed: expected a non-negative integer, got '%s'", arg);
        o->seed = s;
        break;
    }
    case OPT_LOCAL:
        o->local = 1;
        break;
    case OPT_NO_OVERLAP:
        o->no_overlap = 1;
        break;
    case OPT_ALLREDUCE:
        o->allreduce = 1;
        break;
    /* cps_freq_create checks the range; these bounds only keep the number a long. */
    case OPT_SYNC_EVERY:
        rc = parse_long(flag, arg, -1000000000L, 1000000000L, &o->sync_every);
        break;
    case OPT_WARMUP:
        rc = parse_long(flag, arg, -1000000000L, 1000000000L, &o->warmup);
        break;
    case OPT_CSV:
        o->csv = arg;
        break;
    case OPT_PLOT:
        o->plot = arg;
        break;
    case OPT_OUT:
        o->out = arg;
        break;
    case OPT_DATA:
        o->data = arg;
        break;
    }
    return rc;
}

/* Returns 0 to run, 2 on a bad flag, -1 after --help. */
int fm_parse_opts(int argc, char **argv, fm_opts *o)
{
    static const struct option longopts[] = {
        {"model", required_argument, NULL, OPT_MODEL},
        {"epochs", required_argument, NULL, OPT_EPOCHS},
        {"batch", required_argument, NULL, OPT_BATCH},
        {"lr", required_argument, NULL, OPT_LR},
        {"seed", required_argument, NULL, OPT_SEED},
        {"local", no_argument, NULL, OPT_LOCAL},
        {"no-overlap", no_argument, NULL, OPT_NO_OVERLAP},
        {"allreduce", no_argument, NULL, OPT_ALLREDUCE},
        {"sync-every", required_argument, NULL, OPT_SYNC_EVERY},
        {"warmup", required_argument, NULL, OPT_WARMUP},
        {"optimizer", required_argument, NULL, OPT_OPTIM},
        {"log-every", required_argument, NULL, OPT_LOGEVERY},
        {"steps", required_argument, NULL, OPT_STEPS},
        {"csv", required_argument, NULL, OPT_CSV},
        {"plot", required_argument, NULL, OPT_PLOT},
        {"out", required_argument, NULL, OPT_OUT},
        {"data", required_argument, NULL, OPT_DATA},
        {"weight-decay", required_argument, NULL, OPT_WD},
        {"schedule", required_argument, NULL, OPT_SCHED},
        {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0},
    };
    *o = (fm_opts){.model = FM_MODEL_MLP,
                   .epochs = 10,
                   .batch = 64,
                   .sync_every = 1,
                   .log_every = 100,
                   .cosine = 1,
                   .seed = 1,
                   .optim = CPS_OPTIM_MOMENTUM,
                   .out = "fmnist-out",
                   .data = FM_DEFAULT_DATA_DIR};
    opterr = 0; /* our own messages, followed by the usage */
    for (;;) {
        int idx = -1, prev = optind;
        int c = getopt_long(argc, argv, ":", longopts, &idx);
        if (c == -1)
            break;
        const char *flag = argv[prev];
        if (c == '?')
            return bad_flag("unknown option '%s'", flag);
        if (c == ':')
            return bad_flag("option '%s' needs a value", flag);
        if (c == OPT_HELP) {
            usage(stdout);
            return -1;
        }
        int rc = parse_one(o, c, optarg, idx >= 0 ? longopts[idx].name : flag);
        if (rc)
            return rc;
    }
    if (optind < argc)
        return bad_flag("unexpected argument '%s'", argv[optind]);
    if (o->allreduce && o->local)
        return bad_flag("--allreduce and --local exclude each other");
    if (o->local && (o->sync_every != 1 || o->warmup != 0))
        return bad_flag("--sync-every and --warmup need workers (not --local)");
    if (o->lr == 0.0f)
        o->lr = o->optim == CPS_OPTIM_SGD ? 0.1f : o->optim == CPS_OPTIM_ADAM ? 0.001f : 0.01f;
    return 0;
}
