/* Push/pull benchmark of a chainps cluster: a worker program, run under `chainps launch`
 * (bench/run_bench.sh runs it for 1 and 2 servers, compression on and off, and prints the
 * combined table).
 *
 * For each tensor size and each kind of gradient data it measures
 *   - round-trip latency of the blocking calls cps_push / cps_pull / cps_push_pull: p50 and p99
 *     in microseconds over the operations of one run;
 *   - throughput of the asynchronous calls with `depth` operations in flight (cps_*_async +
 *     cps_wait, oldest first): MB/s of tensor bytes (10^6 bytes), push+pull counting the bytes of
 *     both directions;
 * each for `reps` runs of about `ms` milliseconds (the operation count is calibrated once per
 * case), reporting the median of the runs. The kinds of data:
 *   dense   random normal floats (scale 1e-3): what a dense layer's gradient looks like, and
 *           incompressible to snappy;
 *   sparse  the same with 90% of the elements zero at random positions (ReLU / embedding-like
 *           gradients): compressible, so the wire ratio of the compression column shows.
 * The wire ratio is push payload bytes before / after compression (cps_client_stats).
 *
 * --ops N fixes the operation count of every run (and of the warm-ups) instead of calibrating
 * it from a timed warm-up: in sync mode with several workers every worker must push the same
 * number of times, or the step aggregates of one worker's later pushes wait for the others.
 * --lo-bytes samples the loopback interface's byte counter (/proc/net/dev, "lo" received bytes:
 * every byte any process sends over 127.0.0.1, IP and TCP headers included) around every
 * pipelined run and reports bytes per operation = delta / (ops x workers): every byte the job
 * moves for one operation, worker <-> servers and server <-> server (chain FWDs and acks). Valid
 * when all workers run the same operations at the same time (--ops, sync mode's lockstep, or
 * one worker) and nothing else uses the loopback meanwhile; run_replication.sh checks that.
 *
 * --loop pslite runs ps-lite's benchmark loop instead (bench/run_pslite.sh runs it beside
 * bench/pslite_bench.cc, its counterpart on ps-lite): per size one dense tensor and, after a
 * warm-up of a tenth of the iterations (at least 3), N times {cps_push; cps_pull}, each blocking:
 * push and pull latency p50/p99, and GB/s (10^9 B/s) counting the pushed and the pulled bytes
 * over the wall time of the N iterations. N is --ops, else 1 GiB / size within [60, 2000] (the
 * same rule as pslite_bench.cc). One line per size: "pslite_loop system=chainps ... key=value".
 *
 * usage (as a worker): bench_ps [--out FILE] [--reps N] [--ms MS] [--sizes a,b,...]
 *                               [--depth D] [--data dense|sparse|both] [--only push|pull|pp[,...]]
 *                               [--no-lat]   (pipelined runs only: for profiling)
 *                               [--ops N] [--lo-bytes]
 *                      bench_ps --loop pslite [--out FILE] [--sizes a,b,...] [--ops N]
 * Results: one key=value line per case appended to FILE; a table on stdout.
 * Only the public API (chainps.h) is used.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "chainps/chainps.h"
#include "bench.h"
#include "flags.h"

#define MAX_DEPTH 64
#define MAX_REPS  50

enum { K_PUSH, K_PULL, K_PP, K_N };
static const char *const kind_name[K_N] = {"push", "pull", "pp"};

typedef struct opts {
    const char *out;
    int reps;
    double ms;
    size_t sizes[16];
    int nsizes;
    int depth; /* 0: by size */
    int dense, sparse;
    int only;   /* bit k set: run kind k (all three by default) */
    int no_lat; /* skip the blocking (latency) runs: for profiling the pipelined path */
    int ops;    /* > 0: fixed operation count of every run (no calibration) */
    int lo;     /* measure loopback bytes per pipelined operation */
} opts;

/* Bytes received on the loopback interface so far (/proc/net/dev), or -1 if unreadable. */
static double lo_bytes(void)
{
    FILE *f = fopen("/proc/net/dev", "r");
    if (!f)
        return -1;
    char line[512];
    double v = -1;
    while (fgets(line, sizeof line, f)) {
        char *p = line;
        while (*p == ' ')
            p++;
        if (strncmp(p, "lo:", 3) == 0) {
            v = strtod(p + 3, NULL);
            break;
        }
    }
    fclose(f);
    return v;
}

/* CPU seconds of this process (all threads: the caller's and nanomsg's I/O thread). */
static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
           ((double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_usec) * 1e-6;
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static double rng_unit(uint64_t *s)
{
    return ((double)(rng_next(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* Normal(0, 1e-3) values; with `sparse`, 90% of them zero. */
static void fill_grad(float *g, size_t n, int sparse, uint64_t seed)
{
    uint64_t s = seed | 1;
    for (size_t i = 0; i < n; i++) {
        if (sparse && rng_unit(&s) < 0.9) {
            g[i] = 0.0f;
            continue;
        }
        double u1 = rng_unit(&s), u2 = rng_unit(&s);
        g[i] = (float)(1e-3 * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[(int)(p * (n - 1) + 0.5)];
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct bench {
    cps_client *c;
    cps_tensor *t;
    uint64_t len; /* floats */
    const float *grad;
    float *outs[MAX_DEPTH];
    int depth;
} bench;

static int blocking_op(bench *b, int kind)
{
    switch (kind) {
    case K_PUSH:
        return cps_push(b->c, b->t, b->grad, b->len);
    case K_PULL:
        return cps_pull(b->c, b->t, b->outs[0], b->len);
    default:
        return cps_push_pull(b->c, b->t, b->grad, b->outs[0], b->len);
    }
}

static int start_op(bench *b, int kind, float *out, cps_handle **h)
{
    switch (kind) {
    case K_PUSH:
        return cps_push_async(b->c, b->t, b->grad, b->len, h);
    case K_PULL:
        return cps_pull_async(b->c, b->t, out, b->len, h);
    default:
        return cps_push_pull_async(b->c, b->t, b->grad, out, b->len, h);
    }
}

/* n blocking round trips; latencies in microseconds into lat. */
static void run_lat(bench *b, int kind, int n, double *lat)
{
    for (int i = 0; i < n; i++) {
        double t0 = tc_now_s();
        tc_check(blocking_op(b, kind), kind_name[kind]);
        lat[i] = (tc_now_s() - t0) * 1e6;
    }
}

/* n operations with up to b->depth in flight, completed oldest first; MB/s. */
static double run_pipe(bench *b, int kind, int n)
{
    cps_handle *h[MAX_DEPTH];
    double t0 = tc_now_s();
    for (int i = 0; i < n; i++) {
        int slot = i % b->depth;
        if (i >= b->depth)
            tc_check(cps_wait(h[slot], -1), "cps_wait");
        tc_check(start_op(b, kind, b->outs[slot], &h[slot]), kind_name[kind]);
    }
    int first = n > b->depth ? n - b->depth : 0;
    for (int i = first; i < n; i++)
        tc_check(cps_wait(h[i % b->depth], -1), "cps_wait");
    double dt = tc_now_s() - t0;
    double bytes = (double)n * (double)b->len * sizeof(float) * (kind == K_PP ? 2 : 1);
    return bytes / dt / 1e6;
}

/* Operations for about ms milliseconds, from a timed warm-up (which also warms the caches). */
static int calibrate(bench *b, int kind, int pipelined, double ms, int lo, int hi, int fixed)
{
    int w = pipelined ? 2 * b->depth : 4;
    double t0 = tc_now_s();
    if (pipelined) {
        run_pipe(b, kind, w);
    } else {
        double tmp[4];
        run_lat(b, kind, w, tmp);
    }
    if (fixed > 0)
        return fixed;
    double per = (tc_now_s() - t0) / w;
    double n = ms * 1e-3 / (per > 1e-9 ? per : 1e-9);
    return n < lo ? lo : n > hi ? hi : (int)n;
}

typedef struct result {
    double mbps[K_N], p50[K_N], p99[K_N];
    double wire_ratio;
    double cpu_us_per_op;  /* worker CPU per operation over the measured runs */
    double lo_per_op[K_N]; /* loopback bytes per operation (all workers), median of the runs */
} result;

static void run_case(cps_client *c, const opts *o, size_t size, int sparse, result *res)
{
    char name[64];
    snprintf(name, sizeof name, "bench/%s/%zu", sparse ? "sparse" : "dense", size);
    bench b = {.c = c, .len = size / sizeof(float)};
    cps_optim sgd = cps_optim_sgd(1e-3f);
    tc_check(cps_tensor_declare(c, name, b.len, NULL, &sgd, &b.t), "declare");
    float *g = malloc(size);
    if (!g) {
        fprintf(stderr, "bench_ps: out of memory\n");
        exit(1);
    }
    fill_grad(g, b.len, sparse, 0x1234567 + size);
    b.grad = g;
    /* Enough in flight to cover a round trip, capped at 32 MiB of tensors in flight. */
    int depth = (int)((32u << 20) / size);
    b.depth = o->depth ? o->depth : depth < 2 ? 2 : depth > 16 ? 16 : depth;
    for (int i = 0; i < b.depth; i++) {
        b.outs[i] = malloc(size);
        if (!b.outs[i]) {
            fprintf(stderr, "bench_ps: out of memory\n");
            exit(1);
        }
    }
    cps_client_stats s0, s1;
    cps_client_stats_get(c, &s0);

    int n_lat[K_N] = {0}, n_pipe[K_N] = {0};
    for (int k = 0; k < K_N; k++) {
        if (!(o->only >> k & 1))
            continue;
        n_lat[k] = o->no_lat ? 0 : calibrate(&b, k, 0, o->ms, 10, 20000, o->ops);
        n_pipe[k] = calibrate(&b, k, 1, o->ms, 2 * b.depth, 100000, o->ops);
    }
    int nmax = 0;
    for (int k = 0; k < K_N; k++)
        if ((o->only >> k & 1) && n_lat[k] > nmax)
            nmax = n_lat[k];
    double *lat = malloc(sizeof *lat * (size_t)(nmax ? nmax : 1));
    double p50[K_N][MAX_REPS], p99[K_N][MAX_REPS], mbps[K_N][MAX_REPS], lob[K_N][MAX_REPS];
    int W = cps_num_workers(c);
    double cpu0 = cpu_s(), ops = 0;
    /* Reps outermost, so a slow phase of the machine hits every metric alike. */
    for (int r = 0; r < o->reps; r++) {
        for (int k = 0; k < K_N; k++) {
            if (!(o->only >> k & 1))
                continue;
            if (!o->no_lat) {
                run_lat(&b, k, n_lat[k], lat);
                p50[k][r] = pct(lat, n_lat[k], 0.50);
                p99[k][r] = pct(lat, n_lat[k], 0.99);
                ops += n_lat[k];
            }
            double l0 = o->lo ? lo_bytes() : 0;
            mbps[k][r] = run_pipe(&b, k, n_pipe[k]);
            double l1 = o->lo ? lo_bytes() : 0;
            lob[k][r] = o->lo && l0 >= 0 && l1 >= 0 ? (l1 - l0) / ((double)n_pipe[k] * W) : NAN;
            ops += n_pipe[k];
        }
    }
    res->cpu_us_per_op = (cpu_s() - cpu0) / ops * 1e6;
    cps_client_stats_get(c, &s1);
    for (int k = 0; k < K_N; k++) {
        int on = o->only >> k & 1;
        res->p50[k] = on && !o->no_lat ? median(p50[k], o->reps) : NAN;
        res->p99[k] = on && !o->no_lat ? median(p99[k], o->reps) : NAN;
        res->mbps[k] = on ? median(mbps[k], o->reps) : NAN;
        res->lo_per_op[k] = on && o->lo ? median(lob[k], o->reps) : NAN;
    }
    uint64_t raw = s1.push_raw_bytes - s0.push_raw_bytes;
    uint64_t wire = s1.push_wire_bytes - s0.push_wire_bytes;
    res->wire_ratio = wire ? (double)raw / (double)wire : NAN;
    free(lat);
    for (int i = 0; i < b.depth; i++)
        free(b.outs[i]);
    free(g);
}

/* ps-lite's loop: see the header. Lines to stdout and to out (if any). */
static void run_pslite_loop(cps_client *c, const opts *o, FILE *out)
{
    int S = cps_num_servers(c), W = cps_num_workers(c), rank = cps_rank(c);
    for (int s = 0; s < o->nsizes; s++) {
        size_t size = o->sizes[s];
        uint64_t len = size / sizeof(float);
        size_t per = (1u << 30) / size;
        int n = o->ops > 0 ? o->ops : per < 60 ? 60 : per > 2000 ? 2000 : (int)per;
        int warm = n / 10 < 3 ? 3 : n / 10;
        char name[64];
        snprintf(name, sizeof name, "pslite/%zu", size);
        cps_tensor *t;
        cps_optim sgd = cps_optim_sgd(1e-3f);
        tc_check(cps_tensor_declare(c, name, len, NULL, &sgd, &t), "declare");
        float *g = malloc(size), *back = malloc(size);
        double *push = malloc(sizeof *push * (size_t)n), *pull = malloc(sizeof *pull * (size_t)n);
        if (!g || !back || !push || !pull) {
            fprintf(stderr, "bench_ps: out of memory\n");
            exit(1);
        }
        fill_grad(g, len, 0, 0x1234567 + size);
        for (int i = 0; i < warm; i++) {
            tc_check(cps_push(c, t, g, len), "push");
            tc_check(cps_pull(c, t, back, len), "pull");
        }
        double t0 = tc_now_s();
        for (int i = 0; i < n; i++) {
            double a = tc_now_s();
            tc_check(cps_push(c, t, g, len), "push");
            double b = tc_now_s();
            tc_check(cps_pull(c, t, back, len), "pull");
            push[i] = (b - a) * 1e6;
            pull[i] = (tc_now_s() - b) * 1e6;
        }
        double gbps = 2.0 * (double)n * (double)size / (tc_now_s() - t0) / 1e9;
        char line[512];
        snprintf(line, sizeof line,
                 "pslite_loop system=chainps servers=%d workers=%d rank=%d size=%zu iters=%d "
                 "push_p50_us=%.1f push_p99_us=%.1f pull_p50_us=%.1f pull_p99_us=%.1f "
                 "pp_gbps=%.3f\n",
                 S, W, rank, size, n, pct(push, n, 0.50), pct(push, n, 0.99), pct(pull, n, 0.50),
                 pct(pull, n, 0.99), gbps);
        fputs(line, stdout);
        fflush(stdout);
        if (out) {
            fputs(line, out);
            fflush(out);
        }
        free(push);
        free(pull);
        free(back);
        free(g);
    }
}

static int parse_sizes(const char *arg, opts *o)
{
    o->nsizes = 0;
    for (const char *p = arg; *p;) {
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p || v < 4 || v % 4 || v > (256ull << 20) || o->nsizes == 16)
            return -1;
        o->sizes[o->nsizes++] = (size_t)v;
        if (*end == ',')
            end++;
        else if (*end)
            return -1;
        p = end;
    }
    return o->nsizes ? 0 : -1;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: bench_ps [--out FILE] [--reps N] [--ms MS] [--sizes a,b,...] "
            "[--depth D] [--data dense|sparse|both] [--only push|pull|pp|all[,...]] [--no-lat] "
            "[--ops N] [--lo-bytes]\n"
            "       bench_ps --loop pslite [--out FILE] [--sizes a,b,...] [--ops N]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    opts o = {.reps = 5, .ms = 40, .dense = 1, .sparse = 1, .only = 7};
    parse_sizes("4096,65536,1048576,16777216", &o);
    const char *sizes = NULL, *data = "both", *only = "all", *loop = NULL;
    const tc_flag flags[] = {
        {"--no-lat", TC_SWITCH, &o.no_lat}, {"--lo-bytes", TC_SWITCH, &o.lo},
        {"--out", TC_STR, &o.out},          {"--reps", TC_INT, &o.reps},
        {"--ms", TC_DOUBLE, &o.ms},         {"--ops", TC_INT, &o.ops},
        {"--depth", TC_INT, &o.depth},      {"--sizes", TC_STR, &sizes},
        {"--data", TC_STR, &data},          {"--only", TC_STR, &only},
        {"--loop", TC_STR, &loop},          {NULL, 0, NULL},
    };
    if (tc_flags_parse(argc, argv, flags) != 0 || (sizes && parse_sizes(sizes, &o)))
        usage();
    o.dense = strcmp(data, "sparse") != 0;
    o.sparse = strcmp(data, "dense") != 0;
    o.only = 0;
    char buf[64];
    snprintf(buf, sizeof buf, "%s", only);
    for (char *save = NULL, *w = strtok_r(buf, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
        int bit = !strcmp(w, "push")   ? 1 << K_PUSH
                  : !strcmp(w, "pull") ? 1 << K_PULL
                  : !strcmp(w, "pp")   ? 1 << K_PP
                  : !strcmp(w, "all")  ? 7
                                       : 0;
        if (!bit)
            usage();
        o.only |= bit;
    }
    if (!o.only || (loop && strcmp(loop, "pslite") != 0))
        usage();
    if (o.reps < 1 || o.reps > MAX_REPS || o.ms <= 0 || o.depth < 0 || o.depth > MAX_DEPTH ||
        o.ops < 0)
        usage();

    cps_client *c;
    tc_check(cps_open(&c), "cps_open");
    const char *cz = getenv("CHAINPS_COMPRESS");
    int compress = !cz || strcmp(cz, "0") != 0;
    int S = cps_num_servers(c);
    FILE *out = o.out ? fopen(o.out, "a") : NULL;
    if (o.out && !out) {
        perror(o.out);
        return 1;
    }
    if (loop) {
        run_pslite_loop(c, &o, out);
        if (out)
            fclose(out);
        tc_check(cps_close(c), "cps_close");
        return 0;
    }
    double t0 = tc_now_s();
    printf("bench_ps: %d servers, compression %s, %d reps of ~%.0f ms per metric\n", S,
           compress ? "on" : "off", o.reps, o.ms);
    printf("%-6s %9s %9s %9s %9s %8s %8s %8s %8s %8s %8s %6s %9s\n", "data", "size", "push MB/s",
           "pull MB/s", "pp MB/s", "push p50", "push p99", "pull p50", "pull p99", "pp p50",
           "pp p99", "wire", "cpu us/op");
    for (int s = 0; s < o.nsizes; s++) {
        for (int sp = 0; sp < 2; sp++) {
            if ((sp && !o.sparse) || (!sp && !o.dense))
                continue;
            result r;
            run_case(c, &o, o.sizes[s], sp, &r);
            const char *data = sp ? "sparse" : "dense";
            printf("%-6s %9zu %9.0f %9.0f %9.0f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %6.2f %9.1f\n",
                   data, o.sizes[s], r.mbps[K_PUSH], r.mbps[K_PULL], r.mbps[K_PP], r.p50[K_PUSH],
                   r.p99[K_PUSH], r.p50[K_PULL], r.p99[K_PULL], r.p50[K_PP], r.p99[K_PP],
                   r.wire_ratio, r.cpu_us_per_op);
            fflush(stdout);
            if (out) {
                fprintf(out,
                        "ps servers=%d compress=%d data=%s size=%zu push_mbps=%.1f "
                        "pull_mbps=%.1f pp_mbps=%.1f push_p50=%.2f push_p99=%.2f "
                        "pull_p50=%.2f pull_p99=%.2f pp_p50=%.2f pp_p99=%.2f wire_ratio=%.3f "
                        "worker_cpu_us_per_op=%.1f rank=%d workers=%d push_lo_bytes=%.0f "
                        "pull_lo_bytes=%.0f pp_lo_bytes=%.0f\n",
                        S, compress, data, o.sizes[s], r.mbps[K_PUSH], r.mbps[K_PULL], r.mbps[K_PP],
                        r.p50[K_PUSH], r.p99[K_PUSH], r.p50[K_PULL], r.p99[K_PULL], r.p50[K_PP],
                        r.p99[K_PP], r.wire_ratio, r.cpu_us_per_op, cps_rank(c), cps_num_workers(c),
                        r.lo_per_op[K_PUSH], r.lo_per_op[K_PULL], r.lo_per_op[K_PP]);
                fflush(out);
            }
        }
    }
    printf("bench_ps: done in %.1f s\n", tc_now_s() - t0);
    if (out)
        fclose(out);
    tc_check(cps_close(c), "cps_close");
    return 0;
}
