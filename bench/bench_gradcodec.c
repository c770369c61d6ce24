/* Encode / decode speed of the lossy gradient codecs (src/core/gradcodec.c), in one process: no
 * network. For each size and codec, `reps` timed runs of each direction over a gradient of
 * normal(0, 1e-3) floats (a dense layer's gradient), reporting the median GB/s counted in float32
 * bytes (what the codec takes in or gives back). Encoding includes error feedback's updates of
 * the residual, as the worker runs it (the accumulation of gradient into residual is not in it:
 * the worker does that while gathering the values of a part).
 *
 * usage: bench_gradcodec [--reps N] [--sizes BYTES,...] [--out FILE]
 * Results: one key=value line per case appended to FILE; a table on stdout. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chainps/error.h"
#include "bench.h"
#include "core/gradcodec.h"

static void fill(float *g, size_t n, uint64_t s)
{
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        double u1 = ((double)(s >> 11) + 0.5) / 9007199254740992.0;
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        double u2 = ((double)(s >> 11) + 0.5) / 9007199254740992.0;
        g[i] = (float)(1e-3 * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
    }
}

int main(int argc, char **argv)
{
    int reps = 9;
    size_t sizes[8] = {1 << 20, 16 << 20};
    int nsizes = 2;
    const char *outp = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            outp = argv[++i];
        } else if (!strcmp(argv[i], "--sizes") && i + 1 < argc) {
            nsizes = 0;
            for (char *p = argv[++i]; *p && nsizes < 8; p += *p == ',')
                sizes[nsizes++] = strtoull(p, &p, 10);
        } else {
            fprintf(stderr, "usage: bench_gradcodec [--reps N] [--sizes BYTES,...] [--out FILE]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > 101)
        reps = 9;
    FILE *out = outp ? fopen(outp, "a") : NULL;
    static const char *const codecs[] = {"fp16", "bf16", "topk:0.01", "topk:0.1"};
    printf("%-10s %9s %10s %10s %9s\n", "codec", "size", "enc GB/s", "dec GB/s", "bytes");
    for (int s = 0; s < nsizes; s++) {
        size_t n = sizes[s] / 4;
        float *g = malloc(n * sizeof *g), *acc = malloc(n * sizeof *acc);
        float *dec = malloc(n * sizeof *dec);
        uint32_t *scratch = malloc(n * sizeof *scratch);
        unsigned char *blk = malloc(8 + 8 * n);
        if (!g || !acc || !dec || !scratch || !blk) {
            fprintf(stderr, "bench_gradcodec: out of memory\n");
            return 1;
        }
        fill(g, n, 0x9e3779b97f4a7c15ull);
        for (size_t c = 0; c < sizeof codecs / sizeof *codecs; c++) {
            cps__gradcodec gc;
            cps__gradcodec_parse(codecs[c], &gc);
            size_t cap = cps__gradcodec_size(&gc, n), len = 0;
            double enc[101], decs[101];
            for (int r = 0; r < reps + 1; r++) {
                memcpy(acc, g, n * sizeof *acc);
                double t0 = tc_now_s();
                int rc = cps__gradcodec_encode(&gc, acc, n, blk, cap, &len, scratch);
                double t1 = tc_now_s();
                rc = rc ? rc : cps__gradcodec_decode(blk, len, n, dec);
                double t2 = tc_now_s();
                if (rc != 0) {
                    fprintf(stderr, "bench_gradcodec: %s: %s\n", codecs[c], cps_strerror(rc));
                    return 1;
                }
                if (r > 0) { /* the first run warms the pages up */
                    enc[r - 1] = (double)(n * 4) / (t1 - t0) / 1e9;
                    decs[r - 1] = (double)(n * 4) / (t2 - t1) / 1e9;
                }
            }
            double e = tc_median(enc, reps), d = tc_median(decs, reps);
            printf("%-10s %9zu %10.2f %10.2f %9zu\n", codecs[c], n * 4, e, d, len);
            if (out)
                fprintf(out, "codec name=%s size=%zu enc_gbps=%.3f dec_gbps=%.3f bytes=%zu\n",
                        codecs[c], n * 4, e, d, len);
        }
        free(g);
        free(acc);
        free(dec);
        free(scratch);
        free(blk);
    }
    if (out)
        fclose(out);
    return 0;
}
