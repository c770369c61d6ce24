/* Would the server's check of a push pay riding on the apply (issue 30, "check pending")? The
 * server checks a push's MAC in a pass of its own (src/transport/recv.c) and then applies it
 * (src/store: the optimizer reads the gradient and the old record and writes the new one). The
 * alternative checks each 16 KiB piece of the gradient right before the optimizer reads it,
 * while the piece is in L1, as the transport's fused copies do (auth.c, copy_mac). This measures
 * the server's CPU per push both ways, in one process, without the store's lookups and commit
 * (the same in both):
 *
 *   apply   the optimizer alone (what an unauthenticated server does);
 *   check   the MAC over the whole message, the tag compared, then the optimizer (today);
 *   fused   the MAC of each piece, then the optimizer over that piece, the tag compared at the
 *           end (what the server would do if the check rode on the apply).
 *
 * The MAC is the transport's construction (ChaCha20-Poly1305, the message as additional data,
 * auth.h), through OpenSSL directly, since auth.c offers no check that hands each checked piece
 * to a caller; like auth.c, every call into the cipher ends with a vzeroupper. Before each push
 * its message is written afresh (untimed) as nanomsg's receive leaves it: by another thread
 * (nanomsg's I/O thread reads the socket), pinned to another CPU where there is one, so the
 * server's first touch of the message finds it in the shared L3 or that CPU's cache, not in its
 * own (--same-thread: written by the timing thread itself, which flatters the separate pass).
 * The parameter record rotates among three copies, as LMDB's copy-on-write pages do.
 * Times are the thread's CPU time per push, median of `reps` batches, the cases interleaved.
 *
 * The optimizer is SGD, as bench_ps declares: a stateful rule's record keeps its state after all
 * the parameters, so a piece of it is no contiguous slice of the record.
 *
 * usage: bench_check_apply [--reps N] [--sizes BYTES,...] [--same-thread] [--out FILE] */
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "bench.h"
#include "core/wire.h"
#include "flags.h"
#include "optim/optim.h"

#define MAX_SIZES 8
#define PIECE     (16u << 10)
#define HDR       (CPS_WIRE_HDR_SIZE + 24) /* wire header, then a one-key kv header */
#define NCASES    3

/* As auth.c after every call into the cipher: OpenSSL's Poly1305 may return with the upper vector
 * state in use, which would slow the optimizer's SSE code that follows. */
__attribute__((target("avx"))) static void upper_clean(void)
{
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx"))
        _mm256_zeroupper();
#endif
}

static int aad(EVP_CIPHER_CTX *c, const unsigned char *p, size_t n)
{
    int outl, ok = n == 0 || EVP_EncryptUpdate(c, NULL, &outl, p, (int)n) == 1;
    upper_clean();
    return ok ? 0 : -1;
}

static int tag_begin(EVP_CIPHER_CTX *c, uint64_t ctr)
{
    unsigned char nonce[12] = {0};
    memcpy(nonce, &ctr, sizeof ctr);
    int ok = EVP_EncryptInit_ex(c, NULL, NULL, NULL, nonce) == 1;
    upper_clean();
    return ok ? 0 : -1;
}

static int tag_end(EVP_CIPHER_CTX *c, unsigned char tag[16])
{
    unsigned char none[16];
    int outl, ok = EVP_EncryptFinal_ex(c, none, &outl) == 1 &&
                   EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_GET_TAG, 16, tag) == 1;
    upper_clean();
    return ok ? 0 : -1;
}

typedef struct push_case {
    EVP_CIPHER_CTX *mac;
    cps__param_spec spec;
    size_t size;              /* message bytes, the trailer's salt and counter included */
    size_t n;                 /* gradient floats */
    unsigned char *msg;       /* the received message */
    const unsigned char *src; /* what "arrives" in it */
    float *rec[3];            /* the record's copies: params then optimizer state */
    unsigned step;
    unsigned char want[16]; /* the tag the sender computed */
} push_case;

static size_t rec_floats(const push_case *p)
{
    return p->n * (1 + cps__optim_state_slots(p->spec.opt_kind));
}

/* One push of case k (0 apply, 1 check, 2 fused). Returns -1 on a wrong tag or OpenSSL error. */
static int push_one(push_case *p, int k)
{
    const float *old = p->rec[p->step % 3];
    float *dst = p->rec[(p->step + 1) % 3];
    uint64_t t = ++p->step;
    const float *g = (const float *)(const void *)(p->msg + HDR);
    unsigned char tag[16];
    if (k == 0)
        return cps__optim_apply_copy(&p->spec, old, dst, g, p->n, t) == 0 ? 0 : -1;
    if (k == 1) {
        if (tag_begin(p->mac, 1) || aad(p->mac, p->msg, p->size) || tag_end(p->mac, tag) ||
            CRYPTO_memcmp(tag, p->want, 16) != 0)
            return -1;
        return cps__optim_apply_copy(&p->spec, old, dst, g, p->n, t) == 0 ? 0 : -1;
    }
    if (tag_begin(p->mac, 1) || aad(p->mac, p->msg, HDR))
        return -1;
    size_t per = PIECE / sizeof(float);
    for (size_t at = 0; at < p->n; at += per) {
        size_t m = p->n - at < per ? p->n - at : per;
        if (aad(p->mac, (const unsigned char *)(g + at), m * sizeof(float)) != 0)
            return -1;
        if (cps__optim_apply_copy(&p->spec, old + at, dst + at, g + at, m, t) != 0)
            return -1;
    }
    size_t tail = p->size - HDR - p->n * sizeof(float);
    if (aad(p->mac, p->msg + HDR + p->n * sizeof(float), tail) || tag_end(p->mac, tag))
        return -1;
    return CRYPTO_memcmp(tag, p->want, 16) == 0 ? 0 : -1;
}

/* The receive: nanomsg's I/O thread writes the message, on another CPU where there is one. */
static void *arrive(void *arg)
{
    push_case *p = arg;
    memcpy(p->msg, p->src, p->size);
    return NULL;
}

static int receive(push_case *p, int same_thread)
{
    if (same_thread) {
        memcpy(p->msg, p->src, p->size);
        return 0;
    }
    pthread_attr_t at;
    pthread_t th;
    cpu_set_t other;
    CPU_ZERO(&other);
    int ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN), me = sched_getcpu();
    CPU_SET(ncpu > 1 ? (me + 1) % ncpu : 0, &other);
    int ok = pthread_attr_init(&at) == 0;
    if (ok)
        pthread_attr_setaffinity_np(&at, sizeof other, &other);
    ok = ok && pthread_create(&th, &at, arrive, p) == 0 && pthread_join(th, NULL) == 0;
    pthread_attr_destroy(&at);
    return ok ? 0 : -1;
}

/* ns per push of each case at `bytes` of gradient, median of reps. */
static int run_size(size_t bytes, int reps, int same_thread, const cps__param_spec *spec,
                    double out[NCASES])
{
    static const unsigned char key[32] = "bench_check_apply: a key, 32 B";
    push_case p = {.spec = *spec, .n = bytes / sizeof(float)};
    p.size = HDR + p.n * sizeof(float) + 24;
    int per = (int)((256u << 20) / (bytes + 1));
    if (per < 4)
        per = 4;
    double *ts = calloc((size_t)reps * NCASES, sizeof *ts);
    p.mac = EVP_CIPHER_CTX_new();
    p.msg = aligned_alloc(64, (p.size + 63) & ~(size_t)63);
    unsigned char *src = aligned_alloc(64, (p.size + 63) & ~(size_t)63);
    int ok = ts && p.mac && p.msg && src &&
             EVP_EncryptInit_ex(p.mac, EVP_chacha20_poly1305(), NULL, key, NULL) == 1;
    for (int i = 0; ok && i < 3; i++) {
        p.rec[i] = aligned_alloc(64, (rec_floats(&p) * sizeof(float) + 63) & ~(size_t)63);
        ok = p.rec[i] != NULL;
        if (ok)
            memset(p.rec[i], 0, rec_floats(&p) * sizeof(float));
    }
    if (ok) {
        for (size_t i = 0; i < p.size; i++)
            src[i] = (unsigned char)(i * 131u + (i >> 12));
        /* Small finite gradients: bytes taken as floats could be NaNs or denormals. */
        float *g = (float *)(void *)(src + HDR);
        for (size_t i = 0; i < p.n; i++)
            g[i] = (float)((i * 2654435761u) % 1000u) * 1e-6f;
        p.src = src;
        ok =
            tag_begin(p.mac, 1) == 0 && aad(p.mac, src, p.size) == 0 && tag_end(p.mac, p.want) == 0;
    }
    for (int r = -1; ok && r < reps; r++) { /* r == -1: warm-up */
        for (int j = 0; ok && j < NCASES; j++) {
            int k = (j + (r < 0 ? 0 : r)) % NCASES;
            double busy = 0;
            for (int i = 0; ok && i < per; i++) {
                ok = receive(&p, same_thread) == 0; /* untimed */
                double t0 = tc_thread_cpu_s();
                ok = push_one(&p, k) == 0;
                busy += tc_thread_cpu_s() - t0;
            }
            if (r >= 0)
                ts[k * reps + r] = busy * 1e9 / per;
        }
    }
    for (int k = 0; ok && k < NCASES; k++)
        out[k] = tc_median(ts + k * reps, reps);
    EVP_CIPHER_CTX_free(p.mac);
    free(p.msg), free(src), free(ts);
    for (int i = 0; i < 3; i++)
        free(p.rec[i]);
    return ok ? 0 : -1;
}

int main(int argc, char **argv)
{
    int reps = 9, same_thread = 0;
    const char *outp = NULL, *list = "1048576,16777216";
    const tc_flag flags[] = {{"--reps", TC_INT, &reps},
                             {"--out", TC_STR, &outp},
                             {"--sizes", TC_STR, &list},
                             {"--same-thread", TC_SWITCH, &same_thread},
                             {NULL}};
    size_t sizes[MAX_SIZES];
    int ok = tc_flags_parse(argc, argv, flags) == 0 && reps >= 1;
    int nsizes = ok ? tc_sizes_parse(list, sizes, MAX_SIZES, sizeof(float)) : -1;
    cps__param_spec spec = {0};
    spec.opt_kind = CPS_W_OPT_SGD;
    spec.lr = 1e-3f;
    if (nsizes <= 0) {
        fprintf(stderr, "usage: %s [--reps N] [--sizes BYTES,...] [--same-thread] [--out FILE]\n",
                argv[0]);
        return 2;
    }
    cps__optim_spec_defaults(&spec);
    FILE *out = outp ? fopen(outp, "a") : NULL;
    if (outp && !out) {
        perror(outp);
        return 1;
    }
    printf("%-10s %12s %12s %12s %10s %10s   (SGD, thread CPU ns per push; received %s)\n", "size",
           "apply", "check+apply", "fused", "MAC", "saved",
           same_thread ? "by this thread" : "by another thread");
    for (int s = 0; s < nsizes; s++) {
        double v[NCASES];
        if (run_size(sizes[s], reps, same_thread, &spec, v) != 0) {
            fprintf(stderr, "bench_check_apply: failed at %zu bytes\n", sizes[s]);
            return 1;
        }
        printf("%-10zu %12.0f %12.0f %12.0f %10.0f %10.0f\n", sizes[s], v[0], v[1], v[2],
               v[1] - v[0], v[1] - v[2]);
        if (out)
            fprintf(out,
                    "check_apply size=%zu same_thread=%d apply_ns=%.1f check_ns=%.1f "
                    "fused_ns=%.1f\n",
                    sizes[s], same_thread, v[0], v[1], v[2]);
    }
    if (out)
        fclose(out);
    return 0;
}
