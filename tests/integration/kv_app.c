/* A port of ps-lite's tests/test_kv_app.cc check to chainps's ps-lite-shaped calls: every worker
 * declares the same keys, pushes the same values `repeat` times, waits for the others and pulls;
 * with SGD at lr 1 from zeros each value must be exactly -(value x repeat x workers). Started in
 * every role from one working directory with DMLC_* variables only (ps-lite's local.sh layout),
 * it also exercises the default data directories and the DMLC_* default mode.
 * With --disjoint, worker r pushes only the keys i with i % workers == r (ps-lite's tests push
 * different keys per worker): each value is then -(value x repeat).
 * Exits 0 when every value is exact, 1 otherwise (printing the first difference). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/chainps.h"

#define NKEYS  1000
#define REPEAT 20

int main(int argc, char **argv)
{
    int disjoint = argc > 1 && strcmp(argv[1], "--disjoint") == 0;
    cps_client *c;
    int rc = cps_open(&c);
    if (rc != 0) {
        fprintf(stderr, "kv_app: cps_open: %s\n", cps_strerror(rc));
        return 1;
    }
    static uint64_t keys[NKEYS];
    static uint32_t lens[NKEYS];
    static float vals[NKEYS], got[NKEYS];
    for (int i = 0; i < NKEYS; i++) {
        keys[i] = (uint64_t)i * 7919; /* spread over the key space, as ps-lite's test does */
        lens[i] = 1;
        vals[i] = (float)(i % 100 + 1);
    }
    cps_optim sgd = cps_optim_sgd(1.0f);
    rc = cps_raw_declare(c, keys, NKEYS, lens, NULL, &sgd);
    int W = cps_num_workers(c), me = cps_rank(c);
    /* This worker's keys: all of them, or (--disjoint) every W-th. */
    static uint64_t mk[NKEYS];
    static float mv[NKEYS];
    size_t nm = 0;
    for (int i = 0; i < NKEYS; i++)
        if (!disjoint || i % W == me) {
            mk[nm] = keys[i];
            mv[nm++] = vals[i];
        }
    for (int r = 0; rc == 0 && r < REPEAT; r++)
        rc = cps_raw_push(c, mk, nm, mv, lens);
    if (rc == 0)
        rc = cps_barrier(c);
    if (rc == 0)
        rc = cps_raw_pull(c, keys, NKEYS, got, lens);
    int bad = -1;
    float want = 0;
    cps_mode mode;
    cps_mode_get(c, &mode, NULL);
    for (int i = 0; rc == 0 && i < NKEYS && bad < 0; i++) {
        want = -vals[i] * REPEAT * (disjoint ? 1.0f : (float)W);
        if (got[i] != want)
            bad = i;
    }
    if (rc != 0)
        fprintf(stderr, "kv_app: %s\n", cps_strerror(rc));
    else if (bad >= 0)
        printf("kv_app: key %llu: value %g, expected %g\n", (unsigned long long)keys[bad], got[bad],
               -vals[bad] * REPEAT * (float)W);
    else
        printf("kv_app: rank %d: %d keys exact after %d pushes by %d workers (mode %s)\n",
               cps_rank(c), NKEYS, REPEAT, W,
               mode == CPS_MODE_ASYNC  ? "async"
               : mode == CPS_MODE_SYNC ? "sync"
                                       : "ssp");
    cps_close(c);
    return rc == 0 && bad < 0 ? 0 : 1;
}
