/* The command line the seeded models share (sim_replace, sim_cutroute): --seed N --seeds K, one
 * switch of the model's own that selects its known-bad variant, and -v. */
#ifndef CPS_TESTS_SIM_SEED_ARGS_H
#define CPS_TESTS_SIM_SEED_ARGS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct sim_seed_args {
    uint64_t seed, seeds;
    int variant; /* the model's switch was given */
    int verbose;
} sim_seed_args;

/* Parse argv into *a; on anything else print the usage of `prog` (with `variant_flag`, e.g.
 * "--no-first") and return 2, else 0. */
static inline int sim_seed_args_parse(int argc, char **argv, const char *prog,
                                      const char *variant_flag, sim_seed_args *a)
{
    *a = (sim_seed_args){1, 1, 0, 0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            a->seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--seeds") && i + 1 < argc)
            a->seeds = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], variant_flag))
            a->variant = 1;
        else if (!strcmp(argv[i], "-v"))
            a->verbose = 1;
        else {
            fprintf(stderr, "usage: %s [--seed N] [--seeds K] [%s] [-v]\n", prog, variant_flag);
            return 2;
        }
    }
    return 0;
}

#endif
