/* fmnist's command line: the options a run takes, their defaults and their checks. */
#ifndef FMNIST_OPTIONS_H
#define FMNIST_OPTIONS_H

#include <stdint.h>

#include "chainps/chainps.h"
#include "model.h"

typedef struct fm_opts {
    fm_model_kind model;
    int epochs, batch, log_every, local;
    int no_overlap;          /* start the step's push-pulls after the whole backward pass */
    int allreduce;           /* every parameter on every worker, gradients all-reduced (cps_freq) */
    long sync_every, warmup; /* --allreduce: cps_freq's k and n */
    int cosine;              /* --schedule cosine (1) or constant (0) */
    long steps;              /* 0: no limit */
    float lr;                /* 0: the optimizer's default */
    float wd;                /* L2 weight decay, applied by the optimizer */
    uint64_t seed;
    cps_optim_kind optim;
    const char *csv, *plot, *out, *data;
} fm_opts;

/* Fills *o from argv (every field: the defaults, then the flags). Returns 0 to run, 2 on a bad
 * flag (a message naming it and the usage on stderr), -1 after --help (the usage on stdout).
 * The strings in *o point into argv or are static. */
int fm_parse_opts(int argc, char **argv, fm_opts *o);

/* The name --optimizer takes for k ("sgd", "momentum", ...), "?" for an unknown kind; static. */
const char *fm_optim_name(cps_optim_kind k);

#endif
