/* bench_ckpt: checkpoint export/restore throughput against the raw disk, in the same run.
 *
 *   bench_ckpt [--params N] [--dir DIR] [--reps R] [--no-optim]
 *
 * Export: N float32 parameters (default 100 M = 400 MB) in 4 tensors, from memory, through the
 * checkpoint writer (temporary file, CRC-32, fsync, rename). Restore: open + validate the
 * header, read every tensor into memory and verify its CRC-32, cold (the file's pages dropped
 * from the page cache with POSIX_FADV_DONTNEED after it was synced) and warm. Variant: the same
 * parameters plus Adam's 2 state slots streamed through the fill callback (3x the bytes).
 * Baseline: `dd if=/dev/zero of=FILE bs=1M count=<MB> conv=fsync`, started as a child, waited
 * for by its PID (killed by PID after 300 s), file removed. Every figure is the median of R
 * runs (default 3). Files go to DIR (default $TMPDIR or /tmp) and are removed.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "chainps/error.h"
#include "checkpoint/ckpt.h"
#include "core/log.h"
#include "bench.h"
#include "flags.h"

#define NT 4

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Seconds dd takes to write mb MiB with conv=fsync, or -1. */
static double run_dd(const char *dir, uint64_t mb)
{
    char of[4200], count[32];
    snprintf(of, sizeof of, "of=%s/bench_ckpt_dd.bin", dir);
    snprintf(count, sizeof count, "count=%llu", (unsigned long long)mb);
    double t0 = tc_now_s();
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0)
            dup2(null, 2);
        execlp("dd", "dd", "if=/dev/zero", of, "bs=1M", count, "conv=fsync", (char *)NULL);
        _exit(127);
    }
    int st = 0;
    for (;;) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid)
            break;
        if (w < 0 && errno != EINTR)
            return -1;
        if (tc_now_s() - t0 > 300) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            st = 1;
            break;
        }
        usleep(2000);
    }
    double dt = tc_now_s() - t0;
    unlink(of + 3);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? dt : -1;
}

typedef struct slot_fill {
    const float *src;
    float scale;
} slot_fill;

/* Optimizer state as the store would hand it over: computed piecewise, never all in memory. */
static int fill_state(void *arg, uint64_t first, void *buf, size_t n)
{
    const slot_fill *f = arg;
    float *o = buf;
    for (size_t i = 0; i < n; i++)
        o[i] = f->src[first + i] * f->scale;
    return 0;
}

static int export_ckpt(const char *path, float *const *t, uint64_t per, int optim, slot_fill *fills)
{
    cps__ckpt_writer *w;
    int rc = cps__ckpt_writer_open(path, 0, &w);
    if (rc)
        return rc;
    for (int i = 0; i < NT && !rc; i++) {
        char name[64];
        snprintf(name, sizeof name, "layer%d.weight", i);
        uint64_t shape[2] = {per / 1000, 1000};
        rc = cps__ckpt_writer_add(w, name, CPS_CKPT_F32, 2, shape, t[i]);
        for (uint32_t s = 0; optim && s < 2 && !rc; s++) {
            char on[128];
            cps__ckpt_optim_tensor_name(on, sizeof on, CPS_W_OPT_ADAM, s, name);
            fills[i * 2 + s] = (slot_fill){t[i], s ? 1e-3f : 0.1f};
            rc = cps__ckpt_writer_add_stream(w, on, CPS_CKPT_F32, 2, shape, fill_state,
                                             &fills[i * 2 + s]);
        }
    }
    if (!rc)
        rc = cps__ckpt_writer_set_meta(w, "step", "1000");
    if (rc) {
        cps__ckpt_writer_abort(w);
        return rc;
    }
    return cps__ckpt_writer_commit(w, NULL, 0);
}

static void drop_cache(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        fdatasync(fd);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
}

/* Open, validate, read and verify every tensor into buf (only parameters are kept: a restore
 * writes them into the store piecewise). Returns bytes read or 0 on error. */
static uint64_t restore_ckpt(const char *path, float *buf, size_t cap)
{
    cps__ckpt_reader *r;
    if (cps__ckpt_reader_open(path, &r))
        return 0;
    uint64_t total = 0;
    for (size_t i = 0; i < cps__ckpt_reader_count(r); i++) {
        const cps__ckpt_tensor *t = cps__ckpt_reader_tensor(r, i);
        if (cps__ckpt_reader_read(r, t, buf, cap)) {
            cps__ckpt_reader_close(r);
            return 0;
        }
        total += t->nbytes;
    }
    cps__ckpt_reader_close(r);
    return total;
}

int main(int argc, char **argv)
{
    uint64_t params = 100000000;
    int reps = 3, optim = 1;
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir)
        dir = "/tmp";
    int no_optim = 0;
    const tc_flag flags[] = {{"--params", TC_U64, &params},
                             {"--dir", TC_STR, &dir},
                             {"--reps", TC_INT, &reps},
                             {"--no-optim", TC_SWITCH, &no_optim},
                             {NULL, 0, NULL}};
    if (tc_flags_parse(argc, argv, flags) != 0) {
        fprintf(stderr, "usage: bench_ckpt [--params N] [--dir DIR] [--reps R] [--no-optim]\n");
        return 2;
    }
    optim = !no_optim;
    if (reps < 1 || reps > 50 || params < NT * 1000)
        return 2;
    cps__log_set_level(CPS_LOG_WARN);
    uint64_t per = params / NT / 1000 * 1000;
    params = per * NT;
    uint64_t bytes = params * 4;
    float *t[NT];
    for (int i = 0; i < NT; i++) {
        t[i] = malloc(per * 4);
        if (!t[i])
            return 1;
        for (uint64_t k = 0; k < per; k++)
            t[i][k] = (float)(k % 1000003) * 1e-6f - 0.5f + (float)i;
    }
    float *rbuf = malloc(per * 4);
    slot_fill fills[NT * 2];
    char path[4200];
    snprintf(path, sizeof path, "%s/bench_ckpt_%d.safetensors", dir, (int)getpid());
    double dd[50], wr[50], cold[50], warm[50], wro[50], coldo[50];
    int ok = rbuf != NULL;
    for (int r = 0; r < reps && ok; r++) {
        dd[r] = run_dd(dir, (bytes + (1 << 20) - 1) >> 20);
        double t0 = tc_now_s();
        ok = ok && dd[r] > 0 && export_ckpt(path, t, per, 0, fills) == 0;
        wr[r] = tc_now_s() - t0;
        drop_cache(path);
        t0 = tc_now_s();
        ok = ok && restore_ckpt(path, rbuf, per * 4) == bytes;
        cold[r] = tc_now_s() - t0;
        t0 = tc_now_s();
        ok = ok && restore_ckpt(path, rbuf, per * 4) == bytes;
        warm[r] = tc_now_s() - t0;
        ok = ok && memcmp(rbuf, t[NT - 1], per * 4) == 0;
        unlink(path);
        if (optim && ok) {
            t0 = tc_now_s();
            ok = export_ckpt(path, t, per, 1, fills) == 0;
            wro[r] = tc_now_s() - t0;
            drop_cache(path);
            t0 = tc_now_s();
            ok = ok && restore_ckpt(path, rbuf, per * 4) == 3 * bytes;
            coldo[r] = tc_now_s() - t0;
            unlink(path);
        }
    }
    unlink(path);
    if (!ok) {
        fprintf(stderr, "bench_ckpt: a run failed (see the log above)\n");
        return 1;
    }
    double mdd = median(dd, reps), mwr = median(wr, reps), mcold = median(cold, reps);
    double mwarm = median(warm, reps);
    double mb = (double)bytes / 1e6;
    printf("bench_ckpt: %llu float32 parameters (%.0f MB) in %d tensors, dir %s, median of %d\n",
           (unsigned long long)params, mb, NT, dir, reps);
    printf("%-44s %10s %9s %10s\n", "what", "MB/s", "seconds", "vs dd");
    printf("%-44s %10.0f %9.2f %10s\n", "raw disk: dd bs=1M conv=fsync", mb / mdd, mdd, "1.00");
    printf("%-44s %10.0f %9.2f %10.2f\n", "export params (write+crc+fsync+rename)", mb / mwr, mwr,
           mdd / mwr);
    printf("%-44s %10.0f %9.2f %10.2f\n", "restore params, cold cache (read+crc)", mb / mcold,
           mcold, mdd / mcold);
    printf("%-44s %10.0f %9.2f %10.2f\n", "restore params, warm cache (read+crc)", mb / mwarm,
           mwarm, mdd / mwarm);
    if (optim) {
        double mwo = median(wro, reps), mco = median(coldo, reps);
        printf("%-44s %10.0f %9.2f %10.2f\n", "export params + Adam m,v (3x bytes, streamed)",
               3 * mb / mwo, mwo, mdd / (mwo / 3));
        printf("%-44s %10.0f %9.2f %10.2f\n", "restore params + Adam m,v, cold cache", 3 * mb / mco,
               mco, mdd / (mco / 3));
    }
    for (int i = 0; i < NT; i++)
        free(t[i]);
    free(rbuf);
    return 0;
}
