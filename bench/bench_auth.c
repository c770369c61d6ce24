/* What the message MAC (src/transport/auth.c) costs per message, in one process: no network.
 * For each size, cps__auth_seal() on the sender's side and cps__auth_open() on the receiver's
 * (each message opened once, as the replay window wants), timed over batches; the median of
 * `reps` batches as ns per message and GB/s (10^9 B/s of message body).
 *
 * Two cases per size, because a loop over one buffer in cache flatters a MAC: "hot" seals and
 * opens one buffer again and again; "cold" walks a ring of buffers of at least 96 MiB (three
 * times this machine's L3), so each message comes from memory as a large push does in a job.
 * The per-message fixed cost (nonce set-up, the first block, the tag) shows at 64 B and 4 KB.
 * Times are the thread's CPU time, not the wall clock: on a machine shared with other work the
 * wall clock counts the time other processes held the core, the CPU time mostly does not (their
 * cache traffic still shows).
 *
 * Then, per size, the MAC riding on a copy (cps__auth_seal_copy / cps__auth_open_copy) against
 * a copy followed by the MAC, over cold source and destination rings; and the streamed MAC of a
 * message built piece by piece (cps__auth_stream_*: what the transport's cps__tp_fill and send
 * do), its 64-byte header written first and MACed at the fill, the rest copied and MACed.
 *
 * usage: bench_auth [--reps N] [--sizes BYTES,...] [--out FILE]
 * Results: one key=value line per case appended to FILE; a table on stdout. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "flags.h"
#include "transport/auth.h"

#define RING_BYTES   (96u << 20)
#define BATCH_BYTES  (64u << 20)
#define MAX_SIZES    8
#define MIN_PER_RUNS 4

/* One case: `nbuf` buffers of `size` bytes (plus the trailer), `per` messages per batch. */
static int run_case(size_t size, int cold, int reps, double *seal_ns, double *open_ns)
{
    size_t stride = (size + CPS_AUTH_TRAILER + 63) & ~(size_t)63;
    size_t nbuf = cold ? (RING_BYTES + stride - 1) / stride : 1;
    size_t per = BATCH_BYTES / size;
    if (per < MIN_PER_RUNS)
        per = MIN_PER_RUNS;
    if (per > 200000)
        per = 200000;
    /* A buffer sealed twice in one batch would be opened with its second counter twice. */
    if (cold && per > nbuf)
        per = nbuf;
    unsigned char *ring = aligned_alloc(64, nbuf * stride);
    double *ts = malloc(sizeof *ts * (size_t)reps), *to = malloc(sizeof *to * (size_t)reps);
    cps__auth *tx = NULL, *rx = NULL;
    static const unsigned char key[CPS_AUTH_KEY_SIZE] = "bench_auth: a job key, 32 bytes";
    if (!ring || !ts || !to || cps__auth_create(key, &tx) != 0 || cps__auth_create(key, &rx) != 0) {
        free(ring), free(ts), free(to);
        cps__auth_destroy(tx), cps__auth_destroy(rx);
        return -1;
    }
    for (size_t i = 0; i < nbuf * stride; i++)
        ring[i] = (unsigned char)(i * 131u + (i >> 12));
    int bad = 0;
    size_t at = 0;
    for (int r = -1; r < reps; r++) { /* r == -1: a warm-up batch */
        /* Seal a batch, then open the same messages in the same order: a hot buffer is opened
         * right after it is sealed (one message), a cold ring is walked twice. */
        size_t first = at;
        double t0 = tc_thread_cpu_s();
        for (size_t i = 0; i < per; i++) {
            unsigned char *m = ring + ((first + i) % nbuf) * stride;
            cps__auth_seal(tx, m, size);
            if (!cold) {
                size_t body;
                bad |= cps__auth_open(rx, m, size + CPS_AUTH_TRAILER, &body) != CPS_AUTH_OK;
            }
        }
        double t1 = tc_thread_cpu_s();
        if (cold) {
            for (size_t i = 0; i < per; i++) {
                size_t body;
                unsigned char *m = ring + ((first + i) % nbuf) * stride;
                bad |= cps__auth_open(rx, m, size + CPS_AUTH_TRAILER, &body) != CPS_AUTH_OK;
            }
        }
        double t2 = tc_thread_cpu_s();
        at = (first + per) % nbuf;
        if (r < 0)
            continue;
        if (cold) {
            ts[r] = (t1 - t0) * 1e9 / (double)per;
            to[r] = (t2 - t1) * 1e9 / (double)per;
        } else {
            /* Hot: seal and open alternate, so time them apart in a second loop. */
            double u0 = tc_thread_cpu_s();
            for (size_t i = 0; i < per; i++)
                cps__auth_seal(tx, ring, size);
            double u1 = tc_thread_cpu_s();
            ts[r] = (u1 - u0) * 1e9 / (double)per;
            to[r] = (t1 - t0) * 1e9 / (double)per - ts[r];
        }
    }
    *seal_ns = tc_median(ts, reps);
    *open_ns = tc_median(to, reps);
    free(ring), free(ts), free(to);
    cps__auth_destroy(tx), cps__auth_destroy(rx);
    return bad ? -2 : 0;
}

/* A copy that carries the MAC (cps__auth_seal_copy / cps__auth_open_copy) against the copy and
 * then the MAC, both over two cold rings (source and destination): out[0] seal after copy,
 * out[1] fused seal, out[2] open then copy, out[3] fused open, out[4] streamed seal; ns per
 * message, median of reps. */
static int run_copy(size_t size, int reps, double out[5])
{
    size_t stride = (size + CPS_AUTH_TRAILER + 63) & ~(size_t)63;
    size_t nbuf = (RING_BYTES + stride - 1) / stride;
    size_t per = BATCH_BYTES / size;
    per = per < MIN_PER_RUNS ? MIN_PER_RUNS : per > nbuf ? nbuf : per;
    unsigned char *src = aligned_alloc(64, nbuf * stride), *dst = aligned_alloc(64, nbuf * stride);
    double *t = malloc(sizeof *t * 5 * (size_t)reps);
    cps__auth *tx = NULL, *rx = NULL;
    static const unsigned char key[CPS_AUTH_KEY_SIZE] = "bench_auth: a job key, 32 bytes";
    int bad =
        !src || !dst || !t || cps__auth_create(key, &tx) != 0 || cps__auth_create(key, &rx) != 0;
    for (size_t i = 0; !bad && i < nbuf * stride; i++)
        src[i] = dst[i] = (unsigned char)(i * 131u + (i >> 12));
    size_t at = 0;
    for (int r = -1; !bad && r < reps; r++) {
        double v[5];
        for (int k = 0; k < 5; k++) {
            /* k even: seal (src -> dst message); k odd: open (dst message -> src). */
            double t0 = tc_thread_cpu_s();
            for (size_t i = 0; i < per; i++) {
                size_t j = (at + i) % nbuf;
                unsigned char *m = dst + j * stride, *o = src + j * stride;
                size_t body;
                if (k == 0) {
                    memcpy(m, o, size);
                    cps__auth_seal(tx, m, size);
                } else if (k == 1) {
                    bad |= cps__auth_open(rx, m, size + CPS_AUTH_TRAILER, &body) != CPS_AUTH_OK;
                    memcpy(o, m, size);
                } else if (k == 2) {
                    cps__auth_seal_copy(tx, m, size, 0, o, size);
                } else if (k == 4) {
                    size_t h = size < 64 ? size : 64;
                    memcpy(m, o, h);
                    uint64_t st = cps__auth_stream_begin(tx);
                    bad |= cps__auth_stream_copy(tx, st, m, h, o + h, size - h) != 0;
                    bad |= cps__auth_stream_seal(tx, st, m, size) != 0;
                } else {
                    bad |= cps__auth_open_copy(rx, m, size + CPS_AUTH_TRAILER, &body, 0, o, size) !=
                           CPS_AUTH_OK;
                }
            }
            v[k] = (tc_thread_cpu_s() - t0) * 1e9 / (double)per;
        }
        at = (at + per) % nbuf;
        if (r >= 0)
            for (int k = 0; k < 5; k++)
                t[k * reps + r] = v[k];
    }
    static const int order[5] = {0, 2, 1, 3, 4}; /* seal, fused seal, open, fused open, stream */
    for (int k = 0; !bad && k < 5; k++)
        out[k] = tc_median(t + order[k] * reps, reps);
    free(src), free(dst), free(t);
    cps__auth_destroy(tx), cps__auth_destroy(rx);
    return bad ? -2 : 0;
}

int main(int argc, char **argv)
{
    int reps = 7;
    const char *outp = NULL, *list = "64,4096,65536,1048576,16777216";
    const tc_flag flags[] = {
        {"--reps", TC_INT, &reps}, {"--out", TC_STR, &outp}, {"--sizes", TC_STR, &list}, {NULL}};
    size_t sizes[MAX_SIZES];
    int ok = tc_flags_parse(argc, argv, flags) == 0 && reps >= 1;
    int nsizes = ok ? tc_sizes_parse(list, sizes, MAX_SIZES, 1) : -1;
    if (nsizes <= 0) {
        fprintf(stderr, "usage: %s [--reps N] [--sizes BYTES,...] [--out FILE]\n", argv[0]);
        return 2;
    }
    FILE *out = outp ? fopen(outp, "a") : NULL;
    if (outp && !out) {
        perror(outp);
        return 1;
    }
    printf("%-10s %-5s %12s %12s %10s %10s\n", "size", "case", "seal ns", "open ns", "seal GB/s",
           "open GB/s");
    for (int s = 0; s < nsizes; s++) {
        for (int cold = 0; cold <= 1; cold++) {
            double sn, on;
            int rc = run_case(sizes[s], cold, reps, &sn, &on);
            if (rc != 0) {
                fprintf(stderr, "bench_auth: %s at %zu bytes\n",
                        rc == -1 ? "out of memory" : "a sealed message did not open", sizes[s]);
                return 1;
            }
            const char *c = cold ? "cold" : "hot";
            printf("%-10zu %-5s %12.0f %12.0f %10.2f %10.2f\n", sizes[s], c, sn, on,
                   (double)sizes[s] / sn, (double)sizes[s] / on);
            if (out)
                fprintf(out, "auth size=%zu case=%s seal_ns=%.1f open_ns=%.1f\n", sizes[s], c, sn,
                        on);
        }
    }
    printf("\n%-10s %14s %14s %14s %14s %14s   (cold rings, ns per message)\n", "size",
           "copy then seal", "fused seal", "open then copy", "fused open", "streamed seal");
    for (int s = 0; s < nsizes; s++) {
        double v[5];
        if (run_copy(sizes[s], reps, v) != 0) {
            fprintf(stderr, "bench_auth: fused copy failed at %zu bytes\n", sizes[s]);
            return 1;
        }
        printf("%-10zu %14.0f %14.0f %14.0f %14.0f %14.0f\n", sizes[s], v[0], v[1], v[2], v[3],
               v[4]);
        if (out)
            fprintf(out,
                    "auth size=%zu case=copy seal_ns=%.1f fused_seal_ns=%.1f open_ns=%.1f "
                    "fused_open_ns=%.1f stream_seal_ns=%.1f\n",
                    sizes[s], v[0], v[1], v[2], v[3], v[4]);
    }
    if (out)
        fclose(out);
    return 0;
}
