/* What the seeded models share (sim_replace, sim_cutroute, sim_collective): the command line
 * (--seed N --seeds K, one switch of the model's own that selects its known-bad variant, and -v)
 * and the tally of their seeds' verdicts with its summary line. */
#ifndef CPS_TESTS_SIM_SEED_ARGS_H
#define CPS_TESTS_SIM_SEED_ARGS_H

#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* splitmix64's finalizer: the models' random draws and their hashes of what happened. */
static inline uint64_t sim_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The next draw in [0, n) of the splitmix64 stream whose state is *rng. */
static inline uint64_t sim_draw(uint64_t *rng, uint64_t n)
{
    *rng += 0x9e3779b97f4a7c15ull;
    return sim_mix64(*rng) % n;
}

/* A seed's verdict: the first failure the model met (later ones would only be its echoes). */
typedef struct sim_verdict {
    int failed;
    char why[512];
} sim_verdict;

static inline void sim_fail(sim_verdict *v, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static inline void sim_fail(sim_verdict *v, const char *fmt, ...)
{
    if (v->failed)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->why, sizeof v->why, fmt, ap);
    va_end(ap);
    v->failed = 1;
}

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

typedef struct sim_seed_tally {
    uint64_t failed, first_failed;
} sim_seed_tally;

/* Count seed s's verdict rc: 0 passed, 1 failed (why says how; the first five are printed), < 0
 * out of memory (said on stderr; returns -1: the model stops). */
static inline int sim_seed_count(sim_seed_tally *t, const char *prog, uint64_t s, int rc,
                                 const char *why)
{
    if (rc < 0) {
        fprintf(stderr, "%s: out of memory\n", prog);
        return -1;
    }
    if (rc) {
        if (!t->failed++)
            t->first_failed = s;
        if (t->failed <= 5)
            printf("seed %" PRIu64 " FAILED: %s\n", s, why);
    }
    return 0;
}

/* The start of the summary line: "PROG: K seeds from N (--variant): P passed, F failed". The model
 * may print more of its own, then ends the line with sim_seed_end. */
static inline void sim_seed_summary(const sim_seed_tally *t, const char *prog,
                                    const sim_seed_args *a, const char *variant_flag)
{
    printf("%s: %" PRIu64 " seeds from %" PRIu64 "%s%s%s: %" PRIu64 " passed, %" PRIu64 " failed",
           prog, a->seeds, a->seed, a->variant ? " (" : "", a->variant ? variant_flag : "",
           a->variant ? ")" : "", a->seeds - t->failed, t->failed);
}

/* End the summary line with the first failing seed's command (with the variant's flag when the
 * run had it, so the command replays that seed as it ran); the process's exit status. */
static inline int sim_seed_end(const sim_seed_tally *t, const sim_seed_args *a,
                               const char *variant_flag)
{
    if (t->failed)
        printf(" (first: --seed %" PRIu64 " --seeds 1%s%s -v)", t->first_failed,
               a->variant ? " " : "", a->variant ? variant_flag : "");
    printf("\n");
    return t->failed ? 1 : 0;
}

#endif
