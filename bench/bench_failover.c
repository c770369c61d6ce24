/* Failover benchmark (project issue 5): how long do pushes stall when the head of a chain dies?
 *
 * A worker program (bench/run_failover.sh starts the scheduler and the servers by hand, so it
 * knows every PID, and runs this with CHAINPS_ROLE=worker and the scheduler's address in the
 * environment). It
 *   1. declares an embedding table of as many rows as there are servers (default 1024 floats =
 *      4 KB per row): row i lives in range (h + i) mod S, so a whole-table push touches every
 *      key range, and whichever server is killed is the head of one range the push goes to
 *      (with chains of 3 on 3 servers, also the middle of one and the tail of another);
 *   2. pushes the whole table with SGD in a steady loop (one push in flight, each waited for
 *      with a bound), recording when every push started and was acknowledged;
 *   3. from a second thread, SIGKILLs --kill-pid (the server of rank 0) --kill-after-ms plus a
 *      uniform random 0..--kill-jitter-ms after the first push, noting the time just before
 *      kill(2). The jitter (give it the heartbeat interval) spreads the kill over the phase of
 *      the victim's heartbeats: without it every run kills at the same point of that phase,
 *      because all nodes start their heartbeats when the job starts;
 *   4. keeps pushing until --after-ms after the first push acknowledged after the kill, then
 *      pulls the table and checks exactly-once: the gradient is all ones and the learning rate
 *      2^-10, so after N acknowledged pushes every value must be exactly -N/1024 (a push applied
 *      twice, or acknowledged and lost, shows as a difference of a multiple of 1/1024).
 *
 * Failover time = acknowledgement of the first push *started* at or after the kill, minus the
 * kill time: a push already past the head when the kill lands is acknowledged by the tail as
 * usual and says nothing about the failover; the next push needs the new chain. This is the
 * outage a training loop sees, plus one push round trip (~0.3 ms here). Also reported: the
 * longest gap between consecutive acknowledgements (stall) and the client's retry count.
 *
 * usage: bench_failover --kill-pid PID [--kill-after-ms 1000] [--kill-jitter-ms 0]
 *                       [--after-ms 500] [--cols 1024]
 *                       [--deadline-ms 15000] [--out FILE] [--tag TEXT]
 * Prints one human line and appends one key=value line ("fo ...") to FILE. Exit status: 0 ok,
 * 3 no push acknowledged within --deadline-ms of the kill, 4 exactly-once check failed, 1 other
 * errors. On status 3 it exits without cps_close (the caller ends the cluster).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "chainps/chainps.h"
#include "bench.h"
#include "flags.h"

#define LR (1.0f / 1024.0f)

typedef struct killer {
    pid_t pid;
    double at;            /* monotonic time to kill at */
    double killed;        /* monotonic time just before kill(2); 0 until then */
    struct timespec wall; /* CLOCK_REALTIME at the same moment (to compare with the logs) */
    int err;
    pthread_mutex_t mu;
} killer;

static void *killer_main(void *arg)
{
    killer *k = arg;
    for (;;) {
        double left = k->at - tc_now_s();
        if (left <= 0)
            break;
        struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
        nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&k->mu);
    clock_gettime(CLOCK_REALTIME, &k->wall);
    k->killed = tc_now_s();
    if (kill(k->pid, SIGKILL) != 0)
        k->err = errno;
    pthread_mutex_unlock(&k->mu);
    return NULL;
}

static double killed_at(killer *k)
{
    pthread_mutex_lock(&k->mu);
    double t = k->killed;
    pthread_mutex_unlock(&k->mu);
    return t;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: bench_failover --kill-pid PID [--kill-after-ms MS] [--after-ms MS] "
            "[--kill-jitter-ms MS] [--cols N] [--deadline-ms MS] [--out FILE] [--tag TEXT]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    long kill_pid = 0;
    double kill_after = 1000, jitter = 0, after = 500, deadline = 15000;
    long cols = 1024;
    const char *out_path = NULL, *tag = "";
    const tc_flag flags[] = {{"--kill-pid", TC_LONG, &kill_pid},
                             {"--kill-after-ms", TC_DOUBLE, &kill_after},
                             {"--kill-jitter-ms", TC_DOUBLE, &jitter},
                             {"--after-ms", TC_DOUBLE, &after},
                             {"--deadline-ms", TC_DOUBLE, &deadline},
                             {"--cols", TC_LONG, &cols},
                             {"--out", TC_STR, &out_path},
                             {"--tag", TC_STR, &tag},
                             {NULL, 0, NULL}};
    if (tc_flags_parse(argc, argv, flags) != 0)
        usage();
    if (kill_pid <= 1 || kill_after < 0 || jitter < 0 || after < 0 || deadline <= 0 || cols < 1 ||
        cols > (1 << 20))
        usage();

    cps_client *c;
    tc_check(cps_open(&c), "cps_open");
    uint64_t rows = (uint64_t)cps_num_servers(c);
    uint64_t len = rows * (uint64_t)cols;
    cps_optim sgd = cps_optim_sgd(LR);
    cps_tensor *t;
    tc_check(cps_table_declare(c, "bench/failover", rows, (uint32_t)cols, NULL, &sgd, &t),
             "declare");
    float *grad = malloc(len * sizeof *grad), *vals = malloc(len * sizeof *vals);
    size_t cap = 1 << 16;
    double *t_start = malloc(cap * sizeof *t_start), *t_done = malloc(cap * sizeof *t_done);
    if (!grad || !vals || !t_start || !t_done) {
        fprintf(stderr, "bench_failover: out of memory\n");
        return 1;
    }
    for (uint64_t i = 0; i < len; i++)
        grad[i] = 1.0f;
    tc_check(cps_pull(c, t, vals, len), "pull"); /* warm the connections to every tail */
    cps_client_stats s0;
    cps_client_stats_get(c, &s0);
    printf("bench_failover: pushing %llu x %ld floats; killing pid %ld in %.0f ms\n",
           (unsigned long long)rows, cols, kill_pid, kill_after);
    fflush(stdout);

    struct timespec seed;
    clock_gettime(CLOCK_REALTIME, &seed);
    srand((unsigned)(seed.tv_nsec ^ getpid()));
    kill_after += jitter * ((double)rand() / ((double)RAND_MAX + 1.0));
    double first = tc_now_s();
    killer k = {.pid = (pid_t)kill_pid, .at = first + kill_after * 1e-3};
    pthread_mutex_init(&k.mu, NULL);
    pthread_t th;
    if (pthread_create(&th, NULL, killer_main, &k) != 0) {
        fprintf(stderr, "bench_failover: pthread_create failed\n");
        return 1;
    }
    size_t n = 0;
    double recovered = 0; /* ack time of the first push started after the kill */
    int timed_out = 0;
    for (;;) {
        double t0 = tc_now_s();
        double tk = killed_at(&k);
        if (recovered > 0 && t0 >= recovered + after * 1e-3)
            break;
        cps_handle *h;
        tc_check(cps_push_async(c, t, grad, len, &h), "push");
        double limit = (tk > 0 ? tk : k.at) + deadline * 1e-3;
        int rc;
        do {
            int ms = (int)((limit - tc_now_s()) * 1e3);
            rc = cps_wait(h, ms > 0 ? ms : 0);
        } while (rc == CPS_ETIMEDOUT && tc_now_s() < limit);
        if (rc == CPS_ETIMEDOUT) {
            timed_out = 1;
            break;
        }
        tc_check(rc, "push");
        double t1 = tc_now_s();
        if (n == cap) {
            cap *= 2;
            t_start = realloc(t_start, cap * sizeof *t_start);
            t_done = realloc(t_done, cap * sizeof *t_done);
            if (!t_start || !t_done) {
                fprintf(stderr, "bench_failover: out of memory\n");
                return 1;
            }
        }
        t_start[n] = t0;
        t_done[n] = t1;
        n++;
        tk = killed_at(&k);
        if (tk > 0 && recovered == 0 && t0 >= tk)
            recovered = t1;
    }
    pthread_join(th, NULL);
    if (k.err) {
        fprintf(stderr, "bench_failover: kill(%ld): %s\n", kill_pid, strerror(k.err));
        return 1;
    }
    struct tm tm;
    localtime_r(&k.wall.tv_sec, &tm);
    char wall[32];
    snprintf(wall, sizeof wall, "%02d:%02d:%02d.%03ld", tm.tm_hour, tm.tm_min, tm.tm_sec,
             k.wall.tv_nsec / 1000000);
    const char *hb = getenv("CHAINPS_HEARTBEAT_MS"), *dead = getenv("CHAINPS_DEAD_AFTER_MS");
    FILE *out = out_path ? fopen(out_path, "a") : NULL;
    if (timed_out) {
        printf("bench_failover: no push acknowledged within %.0f ms of the kill\n", deadline);
        if (out) {
            fprintf(out,
                    "fo %s hb=%s dead=%s kill_wall=%s failover_ms=inf stall_ms=inf "
                    "pushes=%zu exact=unknown\n",
                    tag, hb ? hb : "default", dead ? dead : "default", wall, n);
            fclose(out);
        }
        fflush(stdout);
        _exit(3);
    }

    /* Longest gap between acknowledgements (from the first push's start). */
    double stall = 0, prev = first;
    size_t before = 0;
    double lat_before = 0;
    for (size_t i = 0; i < n; i++) {
        if (t_done[i] - prev > stall)
            stall = t_done[i] - prev;
        prev = t_done[i];
        if (t_done[i] < k.killed) {
            before++;
            lat_before += t_done[i] - t_start[i];
        }
    }
    cps_client_stats s1;
    cps_client_stats_get(c, &s1);

    tc_check(cps_pull(c, t, vals, len), "pull");
    float want = -(float)n * LR;
    uint64_t bad = 0;
    float seen = want;
    for (uint64_t i = 0; i < len; i++)
        if (vals[i] != want) {
            if (!bad)
                seen = vals[i];
            bad++;
        }
    double fo_ms = (recovered - k.killed) * 1e3;
    printf("bench_failover: %s killed pid %ld at %s; first push after it acknowledged %.1f ms "
           "later; longest gap between acks %.1f ms; %zu pushes (%zu before the kill, %.0f us "
           "each), %llu retries; exactly-once %s",
           tag, kill_pid, wall, fo_ms, stall * 1e3, n, before,
           before ? lat_before / (double)before * 1e6 : 0.0,
           (unsigned long long)(s1.retries - s0.retries), bad ? "FAILED" : "ok");
    if (bad)
        printf(" (%llu values differ, e.g. %.6f = %.1f pushes instead of %zu)",
               (unsigned long long)bad, seen, -seen / LR, n);
    printf("\n");
    if (out) {
        fprintf(out,
                "fo %s hb=%s dead=%s kill_wall=%s failover_ms=%.2f stall_ms=%.2f pushes=%zu "
                "before=%zu push_us=%.0f retries=%llu exact=%s\n",
                tag, hb ? hb : "default", dead ? dead : "default", wall, fo_ms, stall * 1e3, n,
                before, before ? lat_before / (double)before * 1e6 : 0.0,
                (unsigned long long)(s1.retries - s0.retries), bad ? "FAILED" : "ok");
        fclose(out);
    }
    free(grad);
    free(vals);
    free(t_start);
    free(t_done);
    tc_check(cps_close(c), "cps_close");
    return bad ? 4 : 0;
}
