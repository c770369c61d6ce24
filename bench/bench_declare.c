/* Declare benchmark: a worker program (run by bench/run_declare.sh under a scheduler and one
 * server started by hand, so that the script knows the server's PID) that declares one dense
 * float32 tensor of --params values (normal init, SGD) and reports how long cps_tensor_declare
 * took; then it pushes --pushes gradients of the whole tensor (the apply's copy-on-write is what
 * the server's resident memory and its data file grow with), writes "declare_s=... push_s=..." to
 * --out, and waits for --stop-file before closing, so that the script can read the server's RSS
 * and its data file's size while the job is still up.
 *
 *   bench_declare --params N --out FILE --stop-file FILE [--pushes K]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chainps/chainps.h"
#include "bench.h"
#include "flags.h"

static void check(int rc, const char *what)
{
    if (rc != 0) {
        fprintf(stderr, "bench_declare: %s: %s\n", what, cps_strerror(rc));
        exit(1);
    }
}

int main(int argc, char **argv)
{
    double params = 1e8;
    long pushes = 2;
    const char *out_path = NULL, *stop_file = NULL;
    const tc_flag flags[] = {{"--params", TC_DOUBLE, &params},
                             {"--pushes", TC_LONG, &pushes},
                             {"--out", TC_STR, &out_path},
                             {"--stop-file", TC_STR, &stop_file},
                             {NULL, 0, NULL}};
    if (tc_flags_parse(argc, argv, flags) != 0 || !out_path || !stop_file || params < 1 ||
        params > 1e9 || pushes < 0) {
        fprintf(stderr, "usage: bench_declare --params N --out FILE --stop-file FILE "
                        "[--pushes K]\n");
        return 2;
    }
    uint64_t n = (uint64_t)params;
    cps_client *c;
    check(cps_open(&c), "cps_open");
    cps_init init = {CPS_INIT_NORMAL, 0.0f, 0.05f, 7};
    cps_optim opt = cps_optim_sgd(0.01f);
    cps_tensor *t;
    double t0 = tc_now_s();
    check(cps_tensor_declare(c, "bench/declare", n, &init, &opt, &t), "declare");
    double declare_s = tc_now_s() - t0;
    float *g = calloc(n, sizeof *g);
    if (!g)
        check(CPS_ENOMEM, "gradient buffer");
    for (uint64_t i = 0; i < n; i++)
        g[i] = (float)((i % 13) * 1e-3);
    t0 = tc_now_s();
    for (long i = 0; i < pushes; i++)
        check(cps_push(c, t, g, n), "push");
    double push_s = tc_now_s() - t0;
    free(g);
    FILE *f = fopen(out_path, "w");
    if (!f)
        check(CPS_EINVAL, out_path);
    fprintf(f, "declare_s=%.3f push_s=%.3f\n", declare_s, push_s);
    fclose(f);
    printf("bench_declare: %llu params declared in %.3f s, %ld pushes in %.3f s\n",
           (unsigned long long)n, declare_s, pushes, push_s);
    fflush(stdout);
    while (access(stop_file, F_OK) != 0)
        usleep(20000);
    check(cps_close(c), "cps_close");
    return 0;
}
