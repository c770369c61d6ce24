/* Store benchmark: optimizer-apply throughput through LMDB, the replica checksum that
 * `chainps status --verify` has each server compute on its loop, and commit latency.
 *
 * Built by bench/CMakeLists.txt as bench_store (linked against cps__store, which brings
 * cps_optim, cps__core, LMDB and OpenBLAS). Or compile by hand from the repository root, e.g.:
 *   cc -std=c11 -O2 -D_GNU_SOURCE -ffp-contract=off -Iinclude -Isrc -Itests/common \
 *      $(pkg-config --cflags openblas) bench/bench_store.c src/store/[a-z]*.c \
 *      src/optim/optim.c src/optim/init.c src/core/log.c src/core/error.c \
 *      tests/common/clock.c -o /tmp/bench_store $(pkg-config --libs lmdb openblas libxxhash) \
 *      -lm -lpthread
 *   /tmp/bench_store [dir]        (default dir: $TMPDIR/cps__bench_store)
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chainps/error.h"
#include "optim/optim.h"
#include "store/store.h"
#include "bench.h"

typedef struct job {
    uint64_t first;
    int nkeys;
    uint32_t len;
    cps__param_spec spec;
    const float *grad;
} job;

static int do_create(cps__txn *t, void *a)
{
    job *j = a;
    for (int i = 0; i < j->nkeys; i++) {
        int rc = cps__store_param_create(t, j->first + (uint64_t)i, j->len, 0, &j->spec);
        if (rc)
            return rc;
    }
    return 0;
}

static int do_apply(cps__txn *t, void *a)
{
    job *j = a;
    for (int i = 0; i < j->nkeys; i++) {
        int rc = cps__store_param_apply(t, j->first + (uint64_t)i, j->grad, j->len);
        if (rc)
            return rc;
    }
    return 0;
}

static void die(const char *what, int rc)
{
    fprintf(stderr, "%s: %s\n", what, cps_strerror(rc));
    exit(1);
}

/* Apply to `nkeys` records of `len` floats, `keys_per_txn` per transaction, for about `bytes`
 * of parameter values in total; returns MB/s of parameter values updated. */
static double apply_mbps(cps__store *s, uint32_t opt, uint64_t first_key, uint32_t len, int nkeys,
                         int keys_per_txn, size_t bytes)
{
    job j = {.first = first_key, .nkeys = nkeys, .len = len};
    j.spec.opt_kind = opt;
    j.spec.lr = 0.001f;
    j.spec.momentum = 0.9f;
    float *g = malloc(len * sizeof(float));
    for (uint32_t i = 0; i < len; i++)
        g[i] = (float)(i % 17) * 1e-3f;
    j.grad = g;
    int rc = cps__store_write(s, do_create, &j);
    if (rc)
        die("create", rc);
    size_t per_round = (size_t)nkeys * len * sizeof(float);
    int rounds = (int)(bytes / per_round) + 1;
    double t0 = tc_now_s();
    for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < nkeys; k += keys_per_txn) {
            job b = j;
            b.first = j.first + (uint64_t)k;
            b.nkeys = keys_per_txn;
            if ((rc = cps__store_write(s, do_apply, &b)) != 0)
                die("apply", rc);
        }
    }
    double dt = tc_now_s() - t0;
    free(g);
    return (double)rounds * (double)per_round / dt / 1e6;
}

static int do_small(cps__txn *t, void *a)
{
    cps__range_meta m = {.seq = *(uint64_t *)a, .step = 0};
    return cps__store_range_put(t, 1, &m);
}

typedef struct sum_job {
    uint64_t sum, values;
} sum_job;

static int do_checksum(cps__txn *t, void *a)
{
    sum_job *j = a;
    int rc = cps__store_count(t, NULL, &j->values);
    return rc ? rc : cps__store_checksum(t, 0, UINT64_MAX, &j->sum);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median over 7 runs of the checksum of the whole store, in MB/s of parameter values. */
static double checksum_mbps(cps__store *s, uint64_t *sum)
{
    double r[7];
    sum_job j = {0, 0};
    for (int i = 0; i < 7; i++) {
        double t0 = tc_now_s();
        int rc = cps__store_read(s, do_checksum, &j);
        if (rc)
            die("checksum", rc);
        r[i] = (double)j.values * sizeof(float) / (tc_now_s() - t0) / 1e6;
    }
    qsort(r, 7, sizeof r[0], cmp_double);
    *sum = j.sum;
    return r[3];
}

static double commit_us(const char *dir, int sync)
{
    cps__store *s;
    cps__store_opts o = {.sync_every_commit = sync};
    int rc = cps__store_open(dir, &o, &s);
    if (rc)
        die("open", rc);
    int n = sync ? 200 : 20000;
    double t0 = tc_now_s();
    for (uint64_t i = 0; i < (uint64_t)n; i++)
        if ((rc = cps__store_write(s, do_small, &i)) != 0)
            die("commit", rc);
    double dt = tc_now_s() - t0;
    cps__store_close(s);
    return dt / n * 1e6;
}

int main(int argc, char **argv)
{
    /* One optional argument, a directory: anything else (a flag, say) would become a store
     * directory of that name. */
    if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
        fprintf(stderr,
                "usage: %s [DIR]   (a scratch directory for the store; default "
                "$TMPDIR/cps__bench_store)\n",
                argv[0]);
        return 2;
    }
    char dir[512];
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s", argc > 1 ? argv[1] : "");
    if (!dir[0])
        snprintf(dir, sizeof dir, "%s/cps__bench_store", tmp && *tmp ? tmp : "/tmp");
    openblas_set_num_threads(1); /* as servers do */

    cps__store *s;
    int rc = cps__store_open(dir, NULL, &s);
    if (rc)
        die("open", rc);
    static const struct {
        const char *name;
        uint32_t kind;
    } opts[] = {{"sgd", CPS_W_OPT_SGD}, {"momentum", CPS_W_OPT_MOMENTUM}, {"adam", CPS_W_OPT_ADAM}};
    printf("%-10s %12s %14s %14s\n", "optimizer", "record", "keys/txn", "apply MB/s");
    for (size_t o = 0; o < sizeof opts / sizeof opts[0]; o++) {
        /* 4 KiB records: 256 keys, 64 per transaction (a typical sparse push). */
        double a = apply_mbps(s, opts[o].kind, o << 20, 1024, 256, 64, (size_t)256 << 20);
        printf("%-10s %12s %14d %14.0f\n", opts[o].name, "4 KiB", 64, a);
        /* 1 MiB records: 16 keys, one per transaction (a dense layer chunk). */
        double b = apply_mbps(s, opts[o].kind, (o << 20) + 4096, 262144, 16, 1, (size_t)512 << 20);
        printf("%-10s %12s %14d %14.0f\n", opts[o].name, "1 MiB", 1, b);
    }
    uint64_t sum;
    double c = checksum_mbps(s, &sum);
    printf("\n%-24s %12s\n%-24s %12.0f   (sum %016llx)\n", "checksum (whole store)", "MB/s",
           "status --verify's sum", c, (unsigned long long)sum);
    cps__store_close(s);

    char d2[600];
    snprintf(d2, sizeof d2, "%s/commit", dir);
    printf("\n%-24s %12s\n", "commit (tiny txn)", "latency us");
    printf("%-24s %12.1f\n", "MDB_NOSYNC", commit_us(d2, 0));
    printf("%-24s %12.1f\n", "sync every commit", commit_us(d2, 1));
    return 0;
}
