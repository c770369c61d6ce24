/* ckpt_worker: the training program of bench/run_ckpt_cluster.sh (checkpoint export/restore
 * against a running job, project issue 6).
 *
 *   ckpt_worker [--params N] [--steps T] [--lr X] [--stop-file PATH] [--crc] [--end-crc]
 *               [--hold PATH]
 *   ckpt_worker --now
 *
 * Declares one dense float32 tensor "bench/w" of N elements (default 100 M = 400 MB; initialised
 * normal(0, 0.05) on the servers, so the bytes are not trivially compressible) with SGD (no
 * optimizer state), then runs T steps (default 1000) of cps_push_pull with a synthetic gradient:
 * uniform noise in [-1, 1), generated once and pushed every step (cheap: the worker's CPU goes to
 * the transport, not to computing gradients; and, like a real gradient, it does not compress).
 * The loop starts at cps_tensor_step(), so a job restored from a checkpoint resumes where the
 * export cut it; T counts the steps run by this process, not the absolute step number.
 *
 * One line per step, flushed at once (the driver reads them while the job runs):
 *   step S t_ms END dur_ms D
 * S is the absolute step number the push completes (the resume step + the steps done before),
 * END the CLOCK_MONOTONIC time in ms when cps_push_pull returned and D its duration in ms (the
 * step ran from END - D to END). `--now` prints the CLOCK_MONOTONIC time in ms and exits, so a
 * script can stamp events on the same clock.
 *
 * --stop-file PATH: stop after the step during which PATH appeared. --crc: before the first step,
 * pull the tensor and print "values crc32:xxxxxxxx at step S" (zlib's CRC-32 of the float bytes,
 * as a checkpoint's metadata states it), to check a restore against the file it came from.
 * --end-crc: after the last step, print "end values crc32:xxxxxxxx at step S" of the values that
 * step returned. --hold PATH: after the steps, wait (up to 120 s) for PATH to appear before
 * leaving the job, which stays at that step meanwhile (tests/integration/ckpt_dense.sh exports
 * it and compares the file with the values the worker holds).
 * Ends with "done: T steps, at step S". Exit status 0, 1 on an error (printed).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "chainps/chainps.h"
#include "bench.h"
#include "flags.h"

/* zlib's crc32_z takes a size_t length but may not exist in old zlibs: feed 1 GiB at a time. */
static uint32_t crc_floats(const float *v, uint64_t n)
{
    const unsigned char *b = (const unsigned char *)v;
    uint64_t left = n * sizeof(float);
    uLong crc = crc32(0L, Z_NULL, 0);
    while (left > 0) {
        uInt k = left > (1u << 30) ? (1u << 30) : (uInt)left;
        crc = crc32(crc, b, k);
        b += k;
        left -= k;
    }
    return (uint32_t)crc;
}

int main(int argc, char **argv)
{
    uint64_t params = 100000000ULL, steps = 1000;
    double lr = 0.001;
    const char *stop_file = NULL;
    int want_crc = 0, end_crc = 0;
    const char *hold = NULL;
    int now = 0;
    const tc_flag flags[] = {{"--now", TC_SWITCH, &now},
                             {"--params", TC_U64, &params},
                             {"--steps", TC_U64, &steps},
                             {"--lr", TC_DOUBLE, &lr},
                             {"--stop-file", TC_STR, &stop_file},
                             {"--crc", TC_SWITCH, &want_crc},
                             {"--end-crc", TC_SWITCH, &end_crc},
                             {"--hold", TC_STR, &hold},
                             {NULL, 0, NULL}};
    if (tc_flags_parse(argc, argv, flags) != 0)
        return 2;
    if (now) { /* the scripts' clock: the one the step times below are on */
        printf("%.3f\n", tc_now_s() * 1e3);
        return 0;
    }
    if (params == 0 || !(lr > 0)) {
        fprintf(stderr, "ckpt_worker: --params and --lr must be positive\n");
        return 2;
    }
    float *grad = malloc(params * sizeof(float));
    float *vals = malloc(params * sizeof(float));
    if (!grad || !vals) {
        fprintf(stderr, "ckpt_worker: out of memory for %llu parameters\n",
                (unsigned long long)params);
        free(grad), free(vals);
        return 1;
    }
    uint64_t x = 0x9e3779b97f4a7c15ULL; /* xorshift64: the same gradient in every run */
    for (uint64_t i = 0; i < params; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        grad[i] = (float)((double)(x >> 11) / 4503599627370496.0 - 1.0);
    }

    cps_client *c;
    int rc = cps_open(&c);
    if (rc != 0) {
        fprintf(stderr, "ckpt_worker: cps_open: %s\n", cps_strerror(rc));
        free(grad), free(vals);
        return 1;
    }
    cps_init init = {.kind = CPS_INIT_NORMAL, .a = 0.0f, .b = 0.05f, .seed = 1};
    cps_optim opt = cps_optim_sgd((float)lr);
    cps_tensor *t = NULL;
    double t0 = tc_now_s() * 1e3;
    rc = cps_tensor_declare(c, "bench/w", params, &init, &opt, &t);
    if (rc != 0) {
        fprintf(stderr, "ckpt_worker: declaring %llu parameters: %s\n", (unsigned long long)params,
                cps_strerror(rc));
        cps_close(c);
        free(grad), free(vals);
        return 1;
    }
    uint64_t first = cps_tensor_step(t);
    printf("declared bench/w: %llu float32 (%.1f MB), SGD lr %g, at step %llu, in %.0f ms\n",
           (unsigned long long)params, (double)params * 4 / 1e6, lr, (unsigned long long)first,
           tc_now_s() * 1e3 - t0);
    fflush(stdout);
    if (want_crc) {
        t0 = tc_now_s() * 1e3;
        rc = cps_pull(c, t, vals, params);
        if (rc != 0) {
            fprintf(stderr, "ckpt_worker: pull: %s\n", cps_strerror(rc));
        } else {
            printf("values crc32:%08x at step %llu (pull %.0f ms)\n", crc_floats(vals, params),
                   (unsigned long long)first, tc_now_s() * 1e3 - t0);
            fflush(stdout);
        }
    }
    uint64_t done = 0;
    for (; rc == 0 && done < steps; done++) {
        double a = tc_now_s() * 1e3;
        rc = cps_push_pull(c, t, grad, vals, params);
        double b = tc_now_s() * 1e3;
        if (rc != 0) {
            fprintf(stderr, "ckpt_worker: push_pull at step %llu: %s\n",
                    (unsigned long long)(first + done), cps_strerror(rc));
            break;
        }
        printf("step %llu t_ms %.1f dur_ms %.1f\n", (unsigned long long)(first + done + 1), b,
               b - a);
        fflush(stdout);
        if (stop_file && access(stop_file, F_OK) == 0) {
            done++;
            break;
        }
    }
    if (rc == 0 && end_crc && done > 0) {
        printf("end values crc32:%08x at step %llu\n", crc_floats(vals, params),
               (unsigned long long)(first + done));
        fflush(stdout);
    }
    for (int i = 0; rc == 0 && hold && access(hold, F_OK) != 0 && i < 2400; i++)
        usleep(50000);
    if (rc == 0) {
        printf("done: %llu steps, at step %llu\n", (unsigned long long)done,
               (unsigned long long)cps_tensor_step(t));
        fflush(stdout);
    }
    int close_rc = cps_close(c);
    free(grad), free(vals);
    return rc != 0 || close_rc != 0 ? 1 : 0;
}
