/* A worker that trains least squares y = X w* through the parameter server and checks that it
 * recovers the known true weights. Used by the integration tests as the training program.
 *
 * usage: lsq_worker [--dim D] [--samples N] [--steps T] [--lr X] [--tol E]
 *                   [--short-rank R] (rank R stops 10 steps early, as with an uneven shard)
 *                   [--adam] (Adam instead of SGD) [--step-ms MS] (sleep MS per step)
 *                   [--slow-rank R] (only rank R sleeps --step-ms per step)
 *                   [--base-ms MS] (every rank also sleeps MS per step: with --slow-rank, a
 *                   straggler (MS + --step-ms) among workers that are not infinitely fast)
 * Prints "trained N steps in S s" when its own steps are done (before the final barrier), and
 * "rank R: N late pushes dropped (backup workers), of P pushes" when backup workers dropped some
 * of its pushes.
 * A job restored from a checkpoint resumes at the checkpoint's step (cps_tensor_step).
 * Prints "final: rank R max |w - w*| = E, trajectory T, checksum C" and exits 0 if within
 * tolerance. C is XXH3-64 of the final weights. T is a running XXH3-64 over every step's number
 * and the weights pulled at it, from the first pull on. Least squares reaches an exact float
 * fixed point (16 dims, lr 0.1: from step 550 on), and a run that went another way can meet the
 * same bits again: a replica left stale by a lost update may show only in T (docs/testing.md).
 * In sync mode T is the same in every worker and, with the same workers and steps, bitwise the
 * fault-free run's.
 * T is "-" where it cannot be compared: outside sync mode (async/SSP apply the workers' pushes in
 * arrival order), when backup workers dropped a late push of this worker (which ones depends on
 * timing), and in a worker that did not start at step 0 (resumed from a checkpoint, or a
 * replacement joining mid-run: it saw only the tail of the trajectory). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "chainps/chainps.h"
#include "flags.h"

static uint64_t rng_state;
static double uniform(void)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

/* XXH3-64 over the floats' bytes (tests compare it with a checkpoint's tensor). */
static uint64_t hash_floats(const float *v, int n)
{
    return XXH3_64bits(v, (size_t)n * sizeof(float));
}

/* Adds a step's number and the weights pulled at it to the running trajectory hash. */
static void traj_add(XXH3_state_t *traj, int step, const float *w, int n)
{
    uint64_t s = (uint64_t)step;
    XXH3_64bits_update(traj, &s, sizeof s);
    XXH3_64bits_update(traj, w, (size_t)n * sizeof(float));
}

int main(int argc, char **argv)
{
    int dim = 16, samples = 512, steps = 300;
    double lr = 0.1, tol = 1e-3;
    int short_rank = -1, slow_rank = -1, adam = 0, step_ms = 0, base_ms = 0;
    const tc_flag flags[] = {{"--dim", TC_INT, &dim},
                             {"--samples", TC_INT, &samples},
                             {"--steps", TC_INT, &steps},
                             {"--lr", TC_DOUBLE, &lr},
                             {"--tol", TC_DOUBLE, &tol},
                             {"--adam", TC_SWITCH, &adam},
                             {"--step-ms", TC_INT, &step_ms},
                             {"--slow-rank", TC_INT, &slow_rank},
                             {"--base-ms", TC_INT, &base_ms},
                             {"--short-rank", TC_INT, &short_rank},
                             {NULL, 0, NULL}};
    if (tc_flags_parse(argc, argv, flags) != 0)
        return 2;
    cps_client *c;
    int rc = cps_open(&c);
    if (rc != 0) {
        fprintf(stderr, "lsq_worker: cps_open: %s\n", cps_strerror(rc));
        return 1;
    }
    int rank = cps_rank(c), W = cps_num_workers(c);
    /* True weights and data are the same in every worker; each uses its own shard. */
    float *wstar = malloc(sizeof(float) * (size_t)dim);
    float *X = malloc(sizeof(float) * (size_t)dim * (size_t)samples);
    float *y = malloc(sizeof(float) * (size_t)samples);
    float *w = calloc((size_t)dim, sizeof(float));
    float *g = malloc(sizeof(float) * (size_t)dim);
    rng_state = 42;
    for (int j = 0; j < dim; j++)
        wstar[j] = (float)(uniform() * 2 - 1);
    for (int i = 0; i < samples; i++) {
        double acc = 0;
        for (int j = 0; j < dim; j++) {
            X[(size_t)i * dim + j] = (float)(uniform() * 2 - 1);
            acc += X[(size_t)i * dim + j] * wstar[j];
        }
        y[i] = (float)acc;
    }
    cps_optim opt = cps_optim_sgd((float)lr);
    if (adam)
        opt.kind = CPS_OPTIM_ADAM; /* default betas and eps */
    cps_tensor *t;
    rc = cps_tensor_declare(c, "lsq/w", (uint64_t)dim, NULL, &opt, &t);
    if (rc == 0)
        rc = cps_pull(c, t, w, (uint64_t)dim);
    int mine = 0;
    for (int i = rank; i < samples; i += W)
        mine++;
    const char *mode = getenv("CHAINPS_MODE");
    int sync = !mode || !strcmp(mode, "sync");
    if (rank == short_rank)
        steps -= 10;
    int first = rc == 0 ? (int)cps_tensor_step(t) : 0;
    if (first)
        printf("resuming at step %d, values checksum %016llx\n", first,
               (unsigned long long)hash_floats(w, dim));
    if (slow_rank >= 0 && rank != slow_rank)
        step_ms = 0;
    XXH3_state_t *traj = XXH3_createState();
    if (!traj || XXH3_64bits_reset(traj) == XXH_ERROR)
        rc = CPS_ENOMEM;
    if (rc == 0)
        traj_add(traj, first, w, dim);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    /* Counted by the tensor's step, not by iterations: with backup workers a push that came
     * late is dropped and the step moves on to the job's, so a slow worker does fewer. */
    for (int s = first; s < steps && rc == 0; s = (int)cps_tensor_step(t)) {
        if (step_ms + base_ms)
            usleep((useconds_t)(step_ms + base_ms) * 1000);
        memset(g, 0, sizeof(float) * (size_t)dim);
        for (int i = rank; i < samples; i += W) {
            double r = -y[i];
            for (int j = 0; j < dim; j++)
                r += X[(size_t)i * dim + j] * w[j];
            for (int j = 0; j < dim; j++)
                g[j] += (float)(r * X[(size_t)i * dim + j]);
        }
        /* Sync: the servers sum the workers' gradients, so each sends its share of the mean. */
        float scale = sync ? 1.0f / (float)(mine * W) : 1.0f / (float)mine;
        for (int j = 0; j < dim; j++)
            g[j] *= scale;
        rc = cps_push_pull(c, t, g, w, (uint64_t)dim);
        if (rc == 0)
            traj_add(traj, (int)cps_tensor_step(t), w, dim);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    cps_client_stats st;
    cps_client_stats_get(c, &st);
    if (rc == 0)
        printf("trained %d steps in %.3f s\n", steps - first,
               (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);
    if (rc == 0 && st.late_pushes)
        printf("rank %d: %llu late pushes dropped (backup workers), of %llu pushes\n", rank,
               (unsigned long long)st.late_pushes, (unsigned long long)st.pushes);
    if (rc == 0 && short_rank < 0)
        rc = cps_barrier(c);
    if (rc == 0)
        rc = cps_pull(c, t, w, (uint64_t)dim);
    double err = 0;
    for (int j = 0; j < dim; j++) {
        double e = fabs((double)w[j] - wstar[j]);
        if (e > err)
            err = e;
    }
    uint64_t h = hash_floats(w, dim);
    char tr[17] = "-";
    if (sync && first == 0 && st.late_pushes == 0 && traj)
        snprintf(tr, sizeof tr, "%016llx", (unsigned long long)XXH3_64bits_digest(traj));
    XXH3_freeState(traj);
    if (rc != 0)
        fprintf(stderr, "lsq_worker: training failed: %s\n", cps_strerror(rc));
    else
        printf("final: rank %d max |w - w*| = %.3g, trajectory %s, checksum %016llx\n", rank, err,
               tr, (unsigned long long)h);
    int close_rc = cps_close(c);
    free(wstar), free(X), free(y), free(w), free(g);
    if (rc != 0 || close_rc != 0)
        return 1;
    return err <= tol ? 0 : 3;
}
