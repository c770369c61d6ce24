/* A worker that runs cps_allreduce in a loop, for tests/integration/allreduce_test.sh and
 * bench/allreduce.sh.
 *
 * usage: allreduce_app --len N --iters K [--mean] [--out DIR] [--async] [--step-ms MS]
 *                      [--warmup W] [--bench]
 * Iteration i all-reduces values that depend only on (rank, i), so every run with the same
 * workers must print the same results. Each completed iteration appends
 * "<i> <xxh3 of the result's bytes> <CLOCK_REALTIME ms>" to DIR/rank<R>.txt (with --out): the
 * test compares the hashes across workers and runs, and the kill bench reads the times.
 * --bench: prints "bench len=N workers=P p50_us=.. gbps=.. cpu_us=.." from iterations after the
 * warm-up (cpu_us: the median of the process's CPU time, all threads, within each all-reduce).
 * --train: a model w of N values trained by the mean of all-reduced gradients that depend on w;
 * w is shared after every step (cps_allreduce_share), and a replacement of a dead worker starts
 * from a live worker's w and step (cps_allreduce_fetch). Prints "final w <hash>" at the end.
 * --ckpt (with --train): w listed as the local tensor "w" (cps_local_add), committed after every
 * step (cps_local_commit), so that exports hold it: a job whose every tensor is all-reduced, whose
 * steps are the workers' commits. --server-tensor adds a server tensor "s" pushed every step (the
 * servers' sync step boundary is then the cut's). Prints "commit <step> <xxh3 of w> <fnv1a-64 of
 * w>" after every step; in a job restored from an export (CHAINPS_RESTORE_FROM) w comes back
 * through cps_local_fetch and the worker prints "restored w <hash> at step <step>" and starts
 * there. Exits 0 when every iteration completed, or when a replacement's fetch says the job has
 * ended (CPS_ESHUTDOWN: the others finished without it; it prints "the job has ended"), 1 on the
 * first error (printed with its name).
 * --busy-fetch (with --train): a replacement that fetched starts its first all-reduce
 * asynchronously and calls cps_allreduce_fetch again while it runs: that call must fail CPS_EBUSY
 * and write nothing (its buffer and step stay as they were), and the all-reduce must complete
 * as usual (the workers' final w shows it joined the ring where the first fetch put it). Prints
 * "busy fetch refused" when so. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "chainps/chainps.h"
#include "flags.h"

static uint64_t now_us(int clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void fill(float *v, int len, int rank, int iter)
{
    uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(rank + 1) + (uint64_t)iter * 1315423911u;
    for (int j = 0; j < len; j++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        /* Values of mixed magnitude, so that the order of the additions shows in the bits. */
        v[j] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5) * (float)(1 + (j % 7) * 100);
    }
}

/* FNV-1a 64 of w's bytes: a hash a test's Python computes from an export without xxhash. */
static uint64_t fnv1a(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* --busy-fetch: a fetch under a running or queued all-reduce. 0 when it failed CPS_EBUSY and left
 * its buffer and step untouched; else 1, the failure printed. */
static int busy_fetch_refused(cps_client *c, int len, int rank)
{
    float *scratch = malloc((size_t)len * sizeof *scratch);
    if (!scratch)
        return 1;
    for (int j = 0; j < len; j++)
        scratch[j] = -7.0f; /* a value no fetched w holds: any write shows */
    uint64_t step = 12345;
    int rc = cps_allreduce_fetch(c, scratch, (uint64_t)len, &step), bad = 0;
    for (int j = 0; j < len && !bad; j++)
        bad = scratch[j] != -7.0f;
    free(scratch);
    if (rc != CPS_EBUSY || bad || step != 12345) {
        fprintf(stderr, "rank %d: fetch under a running all-reduce: %s, buffer %s, step %llu\n",
                rank,
                rc < 0    ? cps_err_name(rc)
                : rc == 1 ? "fetched"
                          : "nothing to fetch",
                bad ? "written" : "untouched", (unsigned long long)step);
        return 1;
    }
    printf("rank %d: busy fetch refused\n", rank);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    int len = 1000, iters = 10, mean = 0, async = 0, step_ms = 0, warmup = 3, bench = 0, train = 0,
        ckpt = 0, server_tensor = 0, busy_fetch = 0, fetched = 0;
    const char *out = NULL;
    const tc_flag flags[] = {{"--len", TC_INT, &len},
                             {"--iters", TC_INT, &iters},
                             {"--mean", TC_SWITCH, &mean},
                             {"--async", TC_SWITCH, &async},
                             {"--step-ms", TC_INT, &step_ms},
                             {"--warmup", TC_INT, &warmup},
                             {"--bench", TC_SWITCH, &bench},
                             {"--train", TC_SWITCH, &train},
                             {"--out", TC_STR, &out},
                             {"--ckpt", TC_SWITCH, &ckpt},
                             {"--server-tensor", TC_SWITCH, &server_tensor},
                             {"--busy-fetch", TC_SWITCH, &busy_fetch},
                             {NULL, 0, NULL}};
    if (tc_flags_parse(argc, argv, flags) != 0 || len <= 0 || iters <= 0)
        return 2;
    cps_client *c;
    int rc = cps_open(&c);
    if (rc != 0) {
        fprintf(stderr, "cps_open: %s\n", cps_err_name(rc));
        return 1;
    }
    int rank = cps_rank(c);
    FILE *log = NULL;
    if (out) {
        char path[4096];
        snprintf(path, sizeof path, "%s/rank%d.txt", out, rank);
        log = fopen(path, "a");
        if (!log) {
            perror(path);
            return 1;
        }
        setvbuf(log, NULL, _IOLBF, 0);
    }
    float *v = malloc((size_t)len * sizeof *v);
    uint64_t *lat = calloc((size_t)iters, sizeof *lat), *cpu = calloc((size_t)iters, sizeof *cpu);
    if (!v || !lat || !cpu)
        return 1;
    cps_reduce_op op = mean || train ? CPS_REDUCE_MEAN : CPS_REDUCE_SUM;
    int status = 0, measured = 0, first = 0;
    float *w = calloc((size_t)len, sizeof *w);
    if (!w)
        return 1;
    if (train) {
        uint64_t step = 0;
        rc = cps_allreduce_fetch(c, w, (uint64_t)len, &step);
        if (rc == CPS_ESHUTDOWN) {
            /* The others completed the last step without the worker we replace and left: the
             * job's work is done, and so is ours. */
            printf("rank %d: the job has ended before this replacement could join\n", rank);
            fflush(stdout);
            free(v);
            free(w);
            free(lat);
            free(cpu);
            if (log)
                fclose(log);
            return cps_close(c) != 0;
        }
        if (rc < 0) {
            fprintf(stderr, "rank %d: fetch: %s\n", rank, cps_err_name(rc));
            return 1;
        }
        if (rc == 1) {
            printf("rank %d: replacement starts at step %llu\n", rank, (unsigned long long)step);
            first = (int)step;
            fetched = 1;
        }
        if (ckpt && rc == 0) {
            uint64_t at = 0;
            rc = cps_local_fetch(c, "w", w, (uint64_t)len, &at);
            if (rc < 0) {
                fprintf(stderr, "rank %d: cps_local_fetch: %s\n", rank, cps_err_name(rc));
                return 1;
            }
            if (rc == 1) {
                first = (int)at;
                printf("restored w %016llx at step %llu\n",
                       (unsigned long long)XXH3_64bits(w, (size_t)len * sizeof *w),
                       (unsigned long long)at);
                fflush(stdout);
            }
        }
        cps_allreduce_share(c, w, (uint64_t)len, (uint64_t)first);
    }
    cps_tensor *stensor = NULL;
    float sv[16] = {0}, sg[16] = {0};
    if (ckpt) {
        uint64_t shape[1] = {(uint64_t)len};
        cps_optim sgd = cps_optim_sgd(0.1f);
        rc = 0;
        if (server_tensor)
            rc = cps_tensor_declare(c, "s", 16, NULL, &sgd, &stensor);
        if (rc == 0)
            rc = cps_local_add(c, "w", w, 1, shape);
        if (rc == 0)
            rc = cps_local_commit(c, (uint64_t)first);
        if (rc != 0) {
            fprintf(stderr, "rank %d: ckpt setup: %s\n", rank, cps_err_name(rc));
            return 1;
        }
    }
    for (int i = first; i < iters; i++) {
        fill(v, len, rank, i);
        if (train) /* a gradient that depends on the model: a wrong w shows in every later step */
            for (int j = 0; j < len; j++)
                v[j] = v[j] * 1e-3f + 0.01f * w[j];
        uint64_t c0 = now_us(CLOCK_PROCESS_CPUTIME_ID), t0 = now_us(CLOCK_MONOTONIC);
        int busy_now = busy_fetch && fetched && i == first;
        if (async || busy_now) {
            cps_allreduce_handle *h;
            rc = cps_allreduce_async(c, v, (uint64_t)len, op, &h);
            /* On a failure h stays queued: cps_close frees it. */
            if (rc == 0 && busy_now)
                rc = busy_fetch_refused(c, len, rank) ? CPS_EBUSY : 0;
            if (rc == 0)
                while ((rc = cps_allreduce_wait(h, 20)) == 1)
                    ;
        } else {
            rc = cps_allreduce(c, v, (uint64_t)len, op);
        }
        uint64_t t1 = now_us(CLOCK_MONOTONIC), c1 = now_us(CLOCK_PROCESS_CPUTIME_ID);
        if (rc != 0) {
            fprintf(stderr, "rank %d: allreduce %d failed: %s (%s)\n", rank, i, cps_err_name(rc),
                    cps_last_error_message());
            status = 1;
            break;
        }
        if (train) {
            for (int j = 0; j < len; j++)
                w[j] -= 0.1f * v[j];
            cps_allreduce_share(c, w, (uint64_t)len, (uint64_t)i + 1);
        }
        if (ckpt) {
            for (int j = 0; j < 16; j++)
                sg[j] = v[j] * 1e-3f;
            rc = stensor ? cps_push_pull(c, stensor, sg, sv, 16) : 0;
            if (rc == 0)
                rc = cps_local_commit(c, (uint64_t)i + 1);
            if (rc != 0) {
                fprintf(stderr, "rank %d: step %d: %s\n", rank, i, cps_err_name(rc));
                status = 1;
                break;
            }
            printf("commit %d %016llx %016llx\n", i + 1,
                   (unsigned long long)XXH3_64bits(w, (size_t)len * sizeof *w),
                   (unsigned long long)fnv1a(w, (size_t)len * sizeof *w));
            fflush(stdout); /* whole lines: launch interleaves the workers' output by line */
        }
        if (i >= warmup) {
            cpu[measured] = c1 - c0;
            lat[measured++] = t1 - t0;
        }
        if (log)
            fprintf(log, "%d %016llx %llu\n", i,
                    (unsigned long long)XXH3_64bits(v, (size_t)len * sizeof(float)),
                    (unsigned long long)(now_us(CLOCK_REALTIME) / 1000));
        if (step_ms)
            usleep((useconds_t)step_ms * 1000);
    }
    if (bench && measured > 0) {
        qsort(lat, (size_t)measured, sizeof *lat, cmp_u64);
        qsort(cpu, (size_t)measured, sizeof *cpu, cmp_u64);
        uint64_t p50 = lat[measured / 2];
        /* Algorithm bandwidth: the tensor's bytes over the time of one all-reduce. */
        double gbps = (double)len * 4.0 / ((double)p50 * 1e-6) / 1e9;
        printf("bench len=%d workers=%d p50_us=%llu gbps=%.3f cpu_us=%llu\n", len,
               cps_num_workers(c), (unsigned long long)p50, gbps,
               (unsigned long long)cpu[measured / 2]);
    }
    /* A collective ends with every worker: one that leaves right after its last all-reduce would
     * look like a death to a peer still waiting for that collective's last chunk. */
    if (status == 0 && (rc = cps_barrier(c)) != 0) {
        fprintf(stderr, "rank %d: barrier: %s\n", rank, cps_err_name(rc));
        status = 1;
    }
    if (train)
        printf("final w %016llx\n", (unsigned long long)XXH3_64bits(w, (size_t)len * sizeof *w));
    cps_allreduce_stats st;
    cps_allreduce_stats_get(c, &st);
    printf("rank %d: %llu all-reduces, %llu restarts, %llu results taken\n", rank,
           (unsigned long long)st.completed, (unsigned long long)st.restarts,
           (unsigned long long)st.results_taken);
    if (log)
        fclose(log);
    free(v);
    free(w);
    free(lat);
    free(cpu);
    int crc = cps_close(c);
    return status ? status : crc != 0;
}
