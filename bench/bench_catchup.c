/* Catch-up benchmark (project issue 5): how fast does a restarted server copy a large model back
 * from the chains' tails, and how much does that slow down the pushes that keep flowing?
 *
 * A worker program (bench/run_catchup.sh starts the scheduler and the servers by hand, so it
 * knows every PID, kills a server, restarts it with the same --data and --rank, and runs this with
 * CHAINPS_ROLE=worker and the scheduler's address in the environment). It
 *   1. declares the "model": --tensors dense tensors of --tensor-mb MB of float32 each (default
 *      100 x 4 MB = 400 MB), initialised on the servers (normal, so the bytes are not trivially
 *      zero), with SGD (no optimizer state) or --optim adam (two state slots: 3x the bytes on
 *      the servers and in the snapshots). Each tensor is cut into one chunk per range, so every
 *      range holds 1/S of the model;
 *   2. declares a separate "load" tensor of --push-kb KB (default 1 MB; also one chunk per
 *      range, so each push goes to every chain) and pushes it in a steady loop with --depth
 *      pushes in flight (cps_push_async, oldest waited for first), recording the wall-clock
 *      time (CLOCK_REALTIME, as the servers' logs use) each push started and was seen
 *      acknowledged;
 *   3. prints "load running" once --warm-ms of pushes are done (the script waits for that line
 *      before it measures the window before the kill);
 *   4. stops issuing pushes when --stop-file exists (the script creates it once the restarted
 *      server has joined every range back and the window after it has passed) or after --max-s,
 *      waits for the ones in flight, pulls the load tensor and checks exactly-once: the gradient
 *      is all ones and the learning rate 2^-10, so after N acknowledged pushes every value must
 *      be exactly -N/1024;
 *   5. writes every push's start and acknowledgement time (epoch seconds) to --out, for the
 *      script to cut into windows by the times it and the servers logged.
 *
 * usage: bench_catchup --stop-file PATH --out FILE [--tensors 100] [--tensor-mb 4]
 *                      [--optim sgd|adam] [--push-kb 1024] [--depth 4] [--warm-ms 1000]
 *                      [--max-s 300] [--deadline-ms 60000]
 * Exit status: 0 ok, 3 a push not acknowledged within --deadline-ms, 4 exactly-once check
 * failed, 1 other errors. On status 3 it exits without cps_close (the caller ends the cluster).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "chainps/chainps.h"
#include "bench.h"
#include "flags.h"

#define LR        (1.0f / 1024.0f)
#define MAX_DEPTH 64

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void usage(void)
{
    fprintf(stderr, "usage: bench_catchup --stop-file PATH --out FILE [--tensors N] "
                    "[--tensor-mb MB] [--optim sgd|adam] [--push-kb KB] [--depth D] "
                    "[--warm-ms MS] [--max-s S] [--deadline-ms MS]\n");
    exit(2);
}

typedef struct slot {
    cps_handle *h;
    double start;
} slot;

int main(int argc, char **argv)
{
    long tensors = 100, push_kb = 1024, depth = 4;
    double tensor_mb = 4, warm_ms = 1000, max_s = 300, deadline_ms = 60000;
    const char *stop_file = NULL, *out_path = NULL, *optim = "sgd";
    const tc_flag flags[] = {{"--tensors", TC_LONG, &tensors},
                             {"--tensor-mb", TC_DOUBLE, &tensor_mb},
                             {"--optim", TC_STR, &optim},
                             {"--push-kb", TC_LONG, &push_kb},
                             {"--depth", TC_LONG, &depth},
                             {"--warm-ms", TC_DOUBLE, &warm_ms},
                             {"--max-s", TC_DOUBLE, &max_s},
                             {"--deadline-ms", TC_DOUBLE, &deadline_ms},
                             {"--stop-file", TC_STR, &stop_file},
                             {"--out", TC_STR, &out_path},
                             {NULL, 0, NULL}};
    if (tc_flags_parse(argc, argv, flags) != 0)
        usage();
    int adam = !strcmp(optim, "adam");
    if (!stop_file || !out_path || tensors < 0 || tensor_mb <= 0 || tensor_mb > 1024 ||
        push_kb < 1 || push_kb > (1 << 20) || depth < 1 || depth > MAX_DEPTH || warm_ms < 0 ||
        max_s <= 0 || deadline_ms <= 0 || (!adam && strcmp(optim, "sgd")))
        usage();

    cps_client *c;
    tc_check(cps_open(&c), "cps_open");

    /* 1. The model. */
    uint64_t tlen = (uint64_t)(tensor_mb * 1e6 / sizeof(float));
    cps_init init = {CPS_INIT_NORMAL, 0.0f, 0.05f, 7};
    cps_optim opt = adam ? (cps_optim){.kind = CPS_OPTIM_ADAM, .lr = 1e-3f} : cps_optim_sgd(0.01f);
    double d0 = tc_now_s();
    for (long i = 0; i < tensors; i++) {
        char name[64];
        snprintf(name, sizeof name, "bench/catchup/model/%04ld", i);
        cps_tensor *t;
        init.seed = (uint64_t)i + 1;
        tc_check(cps_tensor_declare(c, name, tlen, &init, &opt, &t), "declare model");
    }
    double declare_s = tc_now_s() - d0;
    double model_mb = (double)tensors * (double)tlen * sizeof(float) / 1e6;
    printf("bench_catchup: model of %ld x %llu floats = %.1f MB of parameters (%s: %.1f MB with "
           "optimizer state) on %d servers, declared in %.1f s\n",
           tensors, (unsigned long long)tlen, model_mb, optim, model_mb * (adam ? 3 : 1),
           cps_num_servers(c), declare_s);
    fflush(stdout);

    /* 2. The load. */
    uint64_t len = (uint64_t)push_kb * 1024 / sizeof(float);
    cps_optim sgd = cps_optim_sgd(LR);
    cps_tensor *load;
    tc_check(cps_tensor_declare(c, "bench/catchup/load", len, NULL, &sgd, &load), "declare load");
    float *grad = malloc(len * sizeof *grad), *vals = malloc(len * sizeof *vals);
    size_t cap = 1 << 16, n = 0;
    double *t_start = malloc(cap * sizeof *t_start), *t_done = malloc(cap * sizeof *t_done);
    if (!grad || !vals || !t_start || !t_done) {
        fprintf(stderr, "bench_catchup: out of memory\n");
        return 1;
    }
    for (uint64_t i = 0; i < len; i++)
        grad[i] = 1.0f;
    tc_check(cps_pull(c, load, vals, len), "pull"); /* warm the connections to every tail */
    cps_client_stats s0;
    cps_client_stats_get(c, &s0);

    slot ring[MAX_DEPTH];
    size_t head = 0, inflight = 0;
    double begin = tc_now_s(), last_check = 0;
    int stopping = 0, warm = 0;
    for (;;) {
        double now = tc_now_s();
        if (!stopping && now - last_check >= 0.05) {
            struct stat st;
            last_check = now;
            if (stat(stop_file, &st) == 0 || now - begin > max_s)
                stopping = 1;
        }
        if (!warm && now - begin >= warm_ms * 1e-3) {
            warm = 1;
            printf("bench_catchup: load running: %ld KB pushes, %ld in flight\n", push_kb, depth);
            fflush(stdout);
        }
        while (!stopping && inflight < (size_t)depth) {
            slot *s = &ring[(head + inflight) % MAX_DEPTH];
            s->start = wall_s();
            tc_check(cps_push_async(c, load, grad, len, &s->h), "push");
            inflight++;
        }
        if (inflight == 0)
            break;
        /* Wait for the oldest push, bounded. */
        slot *s = &ring[head];
        double limit = tc_now_s() + deadline_ms * 1e-3;
        int rc;
        do {
            double left = limit - tc_now_s();
            rc = cps_wait(s->h, left > 0 ? (int)(left * 1e3) : 0);
        } while (rc == CPS_ETIMEDOUT && tc_now_s() < limit);
        if (rc == CPS_ETIMEDOUT) {
            printf("bench_catchup: a push was not acknowledged within %.0f ms\n", deadline_ms);
            fflush(stdout);
            _exit(3);
        }
        tc_check(rc, "push");
        if (n == cap) {
            cap *= 2;
            t_start = realloc(t_start, cap * sizeof *t_start);
            t_done = realloc(t_done, cap * sizeof *t_done);
            if (!t_start || !t_done) {
                fprintf(stderr, "bench_catchup: out of memory\n");
                return 1;
            }
        }
        t_start[n] = s->start;
        t_done[n] = wall_s();
        n++;
        head = (head + 1) % MAX_DEPTH;
        inflight--;
    }
    cps_client_stats s1;
    cps_client_stats_get(c, &s1);

    tc_check(cps_pull(c, load, vals, len), "pull");
    float want = -(float)n * LR;
    uint64_t bad = 0;
    float seen = want;
    for (uint64_t i = 0; i < len; i++)
        if (vals[i] != want) {
            if (!bad)
                seen = vals[i];
            bad++;
        }
    FILE *out = fopen(out_path, "w");
    if (!out) {
        fprintf(stderr, "bench_catchup: cannot write %s\n", out_path);
        return 1;
    }
    fprintf(out,
            "info model_mb=%.1f optim=%s state_mb=%.1f declare_s=%.2f push_kb=%ld depth=%ld "
            "pushes=%zu retries=%llu exact=%s\n",
            model_mb, optim, model_mb * (adam ? 3 : 1), declare_s, push_kb, depth, n,
            (unsigned long long)(s1.retries - s0.retries), bad ? "FAILED" : "ok");
    for (size_t i = 0; i < n; i++)
        fprintf(out, "ack %.6f %.6f\n", t_start[i], t_done[i]);
    fclose(out);
    printf("bench_catchup: %zu pushes of %ld KB, %llu retries; exactly-once %s", n, push_kb,
           (unsigned long long)(s1.retries - s0.retries), bad ? "FAILED" : "ok");
    if (bad)
        printf(" (%llu values differ, e.g. %.6f = %.1f pushes instead of %zu)",
               (unsigned long long)bad, seen, -seen / LR, n);
    printf("\n");
    fflush(stdout);
    free(grad);
    free(vals);
    free(t_start);
    free(t_done);
    tc_check(cps_close(c), "cps_close");
    return bad ? 4 : 0;
}
