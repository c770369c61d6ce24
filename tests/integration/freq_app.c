/* A worker that trains a vector w by all-reduced gradients under a cps_freq schedule (issue 29's
 * communication frequency and warm-up), for tests/integration/freq_test.sh.
 *
 * usage: freq_app --out DIR [--len N] [--steps S] [--sync-every K] [--warmup N] [--servers]
 * The gradient of step t depends on (rank, t) and on w, so every worker's w moves differently
 * during the warm-up and a wrong w would show in every later step. The local optimizer is SGD
 * with momentum (state: w, then the velocity v). After every step "<step> <xxh3 of w>" goes to
 * DIR/rank<R>.txt. Every window's gradients as cps_freq_grad hands them back are checked against
 * the mean this program computes itself (over the window's steps, and over every worker's
 * gradient on the ring). At the end: "rank R: final w HASH sent BYTES syncs S held H averaged A
 * checked C" (C: windows checked).
 * --servers: w lives on the servers instead (a tensor with a momentum optimizer there), and the
 * schedule's target is CPS_FREQ_SERVERS: a step whose verdict is CPS_FREQ_APPLY push-pulls the
 * window's mean gradient; BYTES are then the push bytes (before compression) of the loop.
 * Before training it checks that cps_freq refuses bad settings (k 0, -1, 2^40, 2^20 + 1; warm-up
 * -1 or 2^33; a warm-up without state or with the servers' target; an unknown target;
 * cps_freq_grad twice in a step), printing
 * "rank R: bad settings refused". Exits 0, or 1 with the failure printed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "chainps/chainps.h"
#include "flags.h"

static void grad_of(float *g, const float *w, int len, int rank, int step)
{
    uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(rank + 1) + (uint64_t)step * 2654435761u;
    for (int j = 0; j < len; j++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        float noise = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5);
        g[j] = 0.05f * w[j] + noise * (float)(1 + j % 5);
    }
}

/* Every bad setting must be refused with CPS_EINVAL and create nothing. */
static int check_refusals(cps_client *c, cps_freq_buf *g, cps_freq_buf *st)
{
    static const struct {
        int64_t k, n;
        int nstate, target;
    } bad[] = {{0, 0, 2, 0},
               {-1, 0, 2, 0},
               {INT64_C(1) << 40, 0, 2, 0},
               {CPS_FREQ_MAX_SYNC_EVERY + 1, 0, 2, 0},
               {1, -1, 2, 0},
               {1, CPS_FREQ_MAX_WARMUP + 1, 2, 0},
               {4, 10, 0, 0},
               {4, 10, 2, CPS_FREQ_SERVERS},
               {4, 0, 2, 7}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cps_freq_config cfg = {.sync_every = bad[i].k,
                               .warmup_steps = bad[i].n,
                               .target = (cps_freq_target)bad[i].target};
        cps_freq *f = (cps_freq *)&cfg; /* must be reset to NULL */
        int rc =
            cps_freq_create(c, &cfg, g, 1, bad[i].nstate ? st : NULL, (size_t)bad[i].nstate, &f);
        if (rc != CPS_EINVAL || f != NULL) {
            fprintf(stderr, "k %lld warm-up %lld state %d: got %s, not CPS_EINVAL\n",
                    (long long)bad[i].k, (long long)bad[i].n, bad[i].nstate, cps_err_name(rc));
            return -1;
        }
    }
    cps_freq_config ok = {.sync_every = 2};
    cps_freq *f;
    if (cps_freq_create(c, &ok, g, 1, NULL, 0, &f) != 0)
        return -1;
    int r1 = cps_freq_grad(f), r2 = cps_freq_grad(f);
    int r3 = cps_freq_step_end(f), r4 = cps_freq_step_end(f);
    cps_freq_destroy(f);
    if (r1 != CPS_FREQ_HOLD || r2 != CPS_EINVAL || r3 != 0 || r4 != CPS_EINVAL) {
        fprintf(stderr, "out-of-order calls: %d %d %d %d\n", r1, r2, r3, r4);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    int len = 4096, steps = 64, k = 1, warmup = 0, servers = 0;
    const char *out = NULL;
    const tc_flag flags[] = {{"--len", TC_INT, &len},
                             {"--steps", TC_INT, &steps},
                             {"--sync-every", TC_INT, &k},
                             {"--warmup", TC_INT, &warmup},
                             {"--out", TC_STR, &out},
                             {"--servers", TC_SWITCH, &servers},
                             {NULL, 0, NULL}};
    if (tc_flags_parse(argc, argv, flags) != 0 || len <= 0 || steps <= 0 || !out)
        return 2;
    cps_client *c;
    int rc = cps_open(&c);
    if (rc != 0) {
        fprintf(stderr, "cps_open: %s\n", cps_err_name(rc));
        return 1;
    }
    int rank = cps_rank(c);
    char path[4096];
    snprintf(path, sizeof path, "%s/rank%d.txt", out, rank);
    FILE *log = fopen(path, "w");
    float *w = calloc((size_t)len, sizeof *w), *v = calloc((size_t)len, sizeof *v);
    float *g = malloc((size_t)len * sizeof *g);
    if (!log || !w || !v || !g)
        return 1;
    for (int j = 0; j < len; j++)
        w[j] = 1.0f + (float)(j % 13) * 0.25f; /* the same start on every worker */
    cps_freq_buf gb = {g, (uint64_t)len}, state[2] = {{w, (uint64_t)len}, {v, (uint64_t)len}};
    if (check_refusals(c, &gb, state) != 0)
        return 1;
    printf("rank %d: bad settings refused\n", rank);

    cps_tensor *wt = NULL;
    if (servers) {
        cps_init init = {.kind = CPS_INIT_CONSTANT, .a = 1.0f};
        cps_optim mom = {.kind = CPS_OPTIM_MOMENTUM, .lr = 0.01f, .momentum = 0.9f};
        rc = cps_tensor_declare(c, "w", (uint64_t)len, &init, &mom, &wt);
        if (rc == 0)
            rc = cps_pull(c, wt, w, (uint64_t)len);
        if (rc != 0) {
            fprintf(stderr, "declare/pull: %s\n", cps_err_name(rc));
            return 1;
        }
    }
    cps_freq_config cfg = {.sync_every = k,
                           .warmup_steps = warmup,
                           .target = servers ? CPS_FREQ_SERVERS : CPS_FREQ_RING};
    cps_freq *f;
    rc = cps_freq_create(c, &cfg, &gb, 1, state, 2, &f);
    if (rc != 0) {
        fprintf(stderr, "cps_freq_create: %s (%s)\n", cps_err_name(rc), cps_last_error_message());
        return 1;
    }
    cps_allreduce_stats before;
    cps_allreduce_stats_get(c, &before);
    cps_client_stats pbefore;
    cps_client_stats_get(c, &pbefore);
    /* What a window's verdict must hand back, computed here in double: the mean over the window's
     * steps and (on the ring) over the workers' gradients, each worker's computable from the
     * shared w (equal on every worker after the warm-up; w does not move inside a window). */
    double *want = calloc((size_t)len, sizeof *want);
    float *tmp = malloc((size_t)len * sizeof *tmp);
    if (!want || !tmp)
        return 1;
    int status = 0, nw = cps_num_workers(c);
    uint64_t checked = 0;
    for (int t = 0; t < steps && status == 0; t++) {
        grad_of(g, w, len, rank, t);
        for (int r = servers ? rank : 0; t >= warmup && r < (servers ? rank + 1 : nw); r++) {
            grad_of(tmp, w, len, r, t);
            for (int j = 0; j < len; j++)
                want[j] += tmp[j];
        }
        rc = cps_freq_grad(f);
        if (rc == CPS_FREQ_APPLY && t >= warmup) {
            double div = (double)k * (servers ? 1 : nw);
            for (int j = 0; j < len; j++) {
                double e = want[j] / div;
                if (fabs((double)g[j] - e) > 1e-5 * fabs(e) + 1e-6) {
                    fprintf(stderr, "rank %d step %d: gradient %d is %g, not the mean %g\n", rank,
                            t, j, (double)g[j], e);
                    status = 1;
                    break;
                }
            }
            memset(want, 0, (size_t)len * sizeof *want);
            checked++;
        }
        if (rc == CPS_FREQ_APPLY && servers) {
            /* Sync mode: the servers sum the workers' pushes, so each sends its share. */
            for (int j = 0; j < len; j++)
                g[j] /= (float)cps_num_workers(c);
            rc = cps_push_pull(c, wt, g, w, (uint64_t)len);
        } else if (rc == CPS_FREQ_APPLY) {
            for (int j = 0; j < len; j++) {
                v[j] = 0.9f * v[j] + g[j];
                w[j] -= 0.01f * v[j];
            }
        }
        if (rc >= 0)
            rc = cps_freq_step_end(f);
        if (rc < 0) {
            fprintf(stderr, "rank %d step %d: %s (%s)\n", rank, t, cps_err_name(rc),
                    cps_last_error_message());
            status = 1;
        }
        fprintf(log, "%d %016llx\n", t,
                (unsigned long long)XXH3_64bits(w, (size_t)len * sizeof *w));
    }
    fclose(log);
    if (status == 0 && (rc = cps_barrier(c)) != 0) {
        fprintf(stderr, "rank %d: barrier: %s\n", rank, cps_err_name(rc));
        status = 1;
    }
    cps_allreduce_stats st;
    cps_allreduce_stats_get(c, &st);
    cps_client_stats ps;
    cps_client_stats_get(c, &ps);
    if (servers) {
        st.bytes_sent = ps.push_raw_bytes;
        before.bytes_sent = pbefore.push_raw_bytes;
    }
    cps_freq_stats fs;
    cps_freq_stats_get(f, &fs);
    printf("rank %d: final w %016llx sent %llu syncs %llu held %llu averaged %llu checked %llu\n",
           rank, (unsigned long long)XXH3_64bits(w, (size_t)len * sizeof *w),
           (unsigned long long)(st.bytes_sent - before.bytes_sent), (unsigned long long)fs.syncs,
           (unsigned long long)fs.held, (unsigned long long)fs.averaged,
           (unsigned long long)checked);
    cps_freq_destroy(f);
    free(w);
    free(v);
    free(g);
    free(want);
    free(tmp);
    int crc = cps_close(c);
    return status ? status : crc != 0;
}
