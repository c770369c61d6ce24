#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "core/gradcodec.h"
#include "core/wire.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- conversions ---- */

/* Every half that is not NaN survives half -> float -> half bit for bit; NaNs stay NaN. */
static void f16_exact_on_representable(void **state)
{
    (void)state;
    for (uint32_t h = 0; h <= 0xffff; h++) {
        float f = cps__f16_to_f32((uint16_t)h);
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) {
            assert_true(isnan(f));
            uint16_t back = cps__f32_to_f16(f);
            assert_true((back & 0x7c00) == 0x7c00 && (back & 0x3ff));
            continue;
        }
        assert_int_equal(cps__f32_to_f16(f), h);
    }
    assert_true(cps__f16_to_f32(0x3c00) == 1.0f);
    assert_true(cps__f16_to_f32(0x7bff) == 65504.0f);
    assert_true(cps__f16_to_f32(0x0001) == 0x1p-24f); /* smallest subnormal */
    assert_true(cps__f16_to_f32(0x0400) == 0x1p-14f); /* smallest normal */
}

static void bf16_exact_on_representable(void **state)
{
    (void)state;
    for (uint32_t b = 0; b <= 0xffff; b++) {
        float f = cps__bf16_to_f32((uint16_t)b);
        if ((b & 0x7f80) == 0x7f80 && (b & 0x7f)) {
            assert_true(isnan(f));
            assert_true(isnan(cps__bf16_to_f32(cps__f32_to_bf16(f))));
            continue;
        }
        assert_int_equal(cps__f32_to_bf16(f), b);
    }
}

/* Between each pair of neighbouring finite values of the format: the midpoint goes to the even
 * one, anything a float ulp off it to the nearer one. Covers normals, subnormals, the carry into
 * the next binade and the step from the largest finite value to infinity. */
static void check_rne(uint16_t (*to)(float), float (*from)(uint16_t), uint16_t last_finite)
{
    for (uint32_t h = 0; h <= last_finite; h++) {
        float a = from((uint16_t)h);
        /* Past the largest finite value, the limit is where the next value would be if the
         * format went on: half an ulp (of the last binade) above it. */
        double ulp = h == last_finite ? (double)a - (double)from((uint16_t)(h - 1))
                                      : (double)from((uint16_t)(h + 1)) - (double)a;
        float mid = (float)((double)a + ulp / 2);
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        uint16_t up = (uint16_t)(h + 1);
        assert_int_equal(to(mid), even);
        assert_int_equal(to(nextafterf(mid, 0)), h);
        assert_int_equal(to(nextafterf(mid, INFINITY)), up);
        assert_int_equal(to(-mid), even | 0x8000);
        assert_int_equal(to(-nextafterf(mid, 0)), h | 0x8000);
    }
}

static void f16_round_to_nearest_even(void **state)
{
    (void)state;
    check_rne(cps__f32_to_f16, cps__f16_to_f32, 0x7bff);
    assert_int_equal(cps__f32_to_f16(65519.996f), 0x7bff);
    assert_int_equal(cps__f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(cps__f32_to_f16(1e10f), 0x7c00);
    assert_int_equal(cps__f32_to_f16(0x1p-25f), 0x0000);                /* tie to even: 0 */
    assert_int_equal(cps__f32_to_f16(nextafterf(0x1p-25f, 1)), 0x0001); /* just above: up */
    assert_int_equal(cps__f32_to_f16(0x1.8p-24f), 0x0002);              /* 1.5 units: to 2 */
    assert_int_equal(cps__f32_to_f16(1e-30f), 0x0000);
    assert_int_equal(cps__f32_to_f16(-1e-30f), 0x8000);
#ifdef __FLT16_MAX__
    /* The compiler's own conversion (IEEE, round to nearest even) as an oracle. */
    for (int i = 0; i < 2000000; i++) {
        float f = u2f((uint32_t)rnd());
        if (isnan(f))
            continue;
        _Float16 o = (_Float16)f;
        uint16_t ob;
        memcpy(&ob, &o, 2);
        assert_int_equal(cps__f32_to_f16(f), ob);
    }
#endif
}

static void bf16_round_to_nearest_even(void **state)
{
    (void)state;
    check_rne(cps__f32_to_bf16, cps__bf16_to_f32, 0x7f7f);
    /* A float subnormal keeps its value as a bf16 subnormal when representable. */
    assert_int_equal(cps__f32_to_bf16(u2f(0x00010000u)), 0x0001);
    assert_int_equal(cps__f32_to_bf16(u2f(0x00008000u)), 0x0000); /* tie to even */
    assert_int_equal(cps__f32_to_bf16(u2f(0x00018000u)), 0x0002); /* tie to even, up */
    assert_int_equal(cps__f32_to_bf16(3.4028235e38f), 0x7f80);    /* FLT_MAX rounds up */
}

static void specials(void **state)
{
    (void)state;
    assert_int_equal(cps__f32_to_f16(INFINITY), 0x7c00);
    assert_int_equal(cps__f32_to_f16(-INFINITY), 0xfc00);
    assert_int_equal(cps__f32_to_f16(-0.0f), 0x8000);
    assert_true(isnan(cps__f16_to_f32(cps__f32_to_f16(NAN))));
    assert_true(isnan(cps__f16_to_f32(cps__f32_to_f16(u2f(0x7f800001u))))); /* lowest payload */
    assert_true(isnan(cps__f16_to_f32(cps__f32_to_f16(u2f(0xff800001u)))));
    assert_int_equal(cps__f32_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(cps__f32_to_bf16(-INFINITY), 0xff80);
    assert_int_equal(cps__f32_to_bf16(-0.0f), 0x8000);
    assert_true(isnan(cps__bf16_to_f32(cps__f32_to_bf16(u2f(0x7f800001u)))));
    assert_true(isnan(cps__bf16_to_f32(cps__f32_to_bf16(u2f(0x7fffffffu))))); /* no carry */
    assert_true(signbit(cps__f16_to_f32(0x8000)));
}

/* The encoder's inline fast paths against the reference conversions, value by value, over every
 * exponent (random bit patterns: normals, subnormals of both formats, the limits, specials). */
static void encoder_matches_conversions(void **state)
{
    (void)state;
    enum { N = 4096 };
    static float acc[N], x[N];
    static unsigned char out[8 + 2 * N];
    for (int bf = 0; bf < 2; bf++) {
        cps__gradcodec gc = {bf ? CPS_GC_BF16 : CPS_GC_FP16, 0};
        for (int round = 0; round < 200; round++) {
            for (int i = 0; i < N; i++) {
                uint32_t u = (uint32_t)rnd();
                if (i % 4 == 1) /* bias towards the fp16 range and its edges */
                    u = (u & 0x807fffffu) | ((uint32_t)(100 + rnd() % 45) << 23);
                x[i] = acc[i] = u2f(u);
            }
            x[0] = acc[0] = 65519.998f, x[1] = acc[1] = 0x1.fefffep127f;
            x[2] = acc[2] = -0x1.ff8p-15f, x[3] = acc[3] = 65520.0f;
            size_t len;
            assert_int_equal(cps__gradcodec_encode(&gc, acc, N, out, sizeof out, &len, NULL), 0);
            for (int i = 0; i < N; i++) {
                uint16_t h = (uint16_t)(out[8 + 2 * i] | out[9 + 2 * i] << 8);
                float v = x[i], max = bf ? 0x1.fep127f : 65504.0f;
                if (isnan(v)) {
                    assert_true(isnan(bf ? cps__bf16_to_f32(h) : cps__f16_to_f32(h)));
                    assert_true(acc[i] == 0);
                    continue;
                }
                float c = isfinite(v) ? fminf(fmaxf(v, -max), max) : v;
                uint16_t want = bf ? cps__f32_to_bf16(c) : cps__f32_to_f16(c);
                assert_int_equal(h, want);
                float back = bf ? cps__bf16_to_f32(h) : cps__f16_to_f32(h);
                assert_true(f2u(acc[i]) == f2u(isfinite(v) ? v - back : 0.0f));
            }
        }
    }
}

/* ---- specs ---- */

static void parse_specs(void **state)
{
    (void)state;
    cps__gradcodec gc;
    char buf[CPS_GC_SPEC_MAX];
    assert_int_equal(cps__gradcodec_parse("fp16", &gc), 0);
    assert_int_equal(gc.kind, CPS_GC_FP16);
    assert_int_equal(cps__gradcodec_parse("bf16", &gc), 0);
    assert_int_equal(gc.kind, CPS_GC_BF16);
    assert_int_equal(cps__gradcodec_parse("none", &gc), 0);
    assert_int_equal(gc.kind, CPS_GC_NONE);
    assert_int_equal(cps__gradcodec_parse("topk:0.01", &gc), 0);
    assert_int_equal(gc.kind, CPS_GC_TOPK);
    assert_true(gc.ratio == 0.01);
    assert_string_equal(cps__gradcodec_format(&gc, buf, sizeof buf), "topk:0.01");
    cps__gradcodec again;
    assert_int_equal(cps__gradcodec_parse(buf, &again), 0);
    assert_true(again.ratio == gc.ratio);
    assert_int_equal(cps__gradcodec_parse("topk:1", &gc), 0);
    static const char *const bad[] = {"",         "fp32",     "FP16",     "topk",     "topk:",
                                      "topk:0",   "topk:1.5", "topk:-.1", "topk:abc", "topk: 0.1",
                                      "topk:nan", "topk:inf", "topk:0x1", "fp16 ",    "topk:0.1x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        gc.kind = 99;
        assert_int_equal(cps__gradcodec_parse(bad[i], &gc), CPS_EINVAL);
        assert_int_equal(gc.kind, 99); /* untouched */
    }
}

static void topk_k_formula(void **state)
{
    (void)state;
    assert_int_equal(cps__gradcodec_topk_k(0.01, 1), 1);
    assert_int_equal(cps__gradcodec_topk_k(0.01, 99), 1);
    assert_int_equal(cps__gradcodec_topk_k(0.01, 1000), 10);
    assert_int_equal(cps__gradcodec_topk_k(0.01, 1001), 11);
    assert_int_equal(cps__gradcodec_topk_k(1.0, 777), 777);
    assert_int_equal(cps__gradcodec_topk_k(0.5, 7), 4);
    assert_int_equal(cps__gradcodec_topk_k(0.1, 50), 5);   /* not 6, as a float 0.1 would give */
    assert_int_equal(cps__gradcodec_topk_k(0.07, 100), 7); /* 0.07 * 100 = 7.000000000000001 */
    assert_int_equal(cps__gradcodec_topk_k(0.0700001, 100000), 7001);
    cps__gradcodec gc = {CPS_GC_TOPK, 0.01};
    assert_int_equal(cps__gradcodec_size(&gc, 1000), 8 + 80);
    gc.kind = CPS_GC_FP16;
    assert_int_equal(cps__gradcodec_size(&gc, 1000), 8 + 2000);
    assert_int_equal(cps__gradcodec_size(&gc, 0), 0);
    assert_int_equal(cps__gradcodec_size(&gc, (uint64_t)UINT32_MAX + 1), 0);
    gc.kind = CPS_GC_NONE;
    assert_int_equal(cps__gradcodec_size(&gc, 10), 0);
}

/* ---- top-k ---- */

typedef struct ref_ent {
    uint32_t mag;
    uint32_t idx;
} ref_ent;

/* Larger magnitude first, then the lower index: the order the encoder promises. */
static int cmp_ref(const void *a, const void *b)
{
    const ref_ent *x = a, *y = b;
    if (x->mag != y->mag)
        return x->mag > y->mag ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static void check_topk_against_sort(const float *g, uint64_t n, double ratio)
{
    cps__gradcodec gc = {CPS_GC_TOPK, ratio};
    uint64_t k = cps__gradcodec_topk_k(ratio, n);
    size_t cap = cps__gradcodec_size(&gc, n), len = 0;
    unsigned char *out = malloc(cap);
    float *acc = malloc(n * sizeof *acc), *dec = malloc(n * sizeof *dec);
    ref_ent *ref = malloc(n * sizeof *ref);
    char *want = calloc(n, 1);
    assert_non_null(out);
    assert_non_null(acc);
    assert_non_null(dec);
    assert_non_null(ref);
    assert_non_null(want);
    memcpy(acc, g, n * sizeof *acc);
    assert_int_equal(cps__gradcodec_encode(&gc, acc, n, out, cap, &len, NULL), 0);
    assert_int_equal(len, cap);
    assert_int_equal(cps__le32_get(out + 4), k);
    for (uint64_t i = 0; i < n; i++)
        ref[i] = (ref_ent){f2u(g[i]) & 0x7fffffffu, (uint32_t)i};
    qsort(ref, n, sizeof *ref, cmp_ref);
    for (uint64_t j = 0; j < k; j++)
        want[ref[j].idx] = 1;
    assert_int_equal(cps__gradcodec_decode(out, len, n, dec), 0);
    for (uint64_t i = 0; i < n; i++) {
        /* Kept: sent exactly, residual 0. Not kept: decoded 0, the residual is the value. */
        if (want[i]) {
            assert_true(f2u(dec[i]) == f2u(g[i]));
            assert_true(acc[i] == 0);
        } else {
            assert_true(dec[i] == 0);
            assert_true(f2u(acc[i]) == f2u(g[i]));
        }
    }
    /* The same input gives the same bytes. */
    unsigned char *again = malloc(cap);
    assert_non_null(again);
    memcpy(acc, g, n * sizeof *acc);
    assert_int_equal(cps__gradcodec_encode(&gc, acc, n, again, cap, &len, NULL), 0);
    assert_memory_equal(out, again, cap);
    free(again);
    free(out);
    free(acc);
    free(dec);
    free(ref);
    free(want);
}

static void topk_keeps_the_k_largest(void **state)
{
    (void)state;
    static const uint64_t sizes[] = {1, 2, 3, 10, 100, 1000, 4097, 100000};
    static const double ratios[] = {0.01, 0.1, 0.5, 1.0, 0.001};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        uint64_t n = sizes[s];
        float *g = malloc(n * sizeof *g);
        assert_non_null(g);
        for (int kind = 0; kind < 4; kind++) {
            for (uint64_t i = 0; i < n; i++) {
                double u = (double)(rnd() >> 11) / 9007199254740992.0 - 0.5;
                if (kind == 0) /* distinct values */
                    g[i] = (float)u;
                else if (kind == 1) /* a few magnitudes, both signs: ties everywhere */
                    g[i] = (float)((int)(rnd() % 7) - 3) * 0.25f;
                else if (kind == 2) /* mostly zeros */
                    g[i] = rnd() % 10 ? 0.0f : (float)u;
                else /* sorted ascending: a bad case for naive pivots */
                    g[i] = (float)i;
            }
            for (size_t r = 0; r < sizeof ratios / sizeof *ratios; r++)
                check_topk_against_sort(g, n, ratios[r]);
        }
        free(g);
    }
}

/* Large inputs are cut down by a sampled threshold first (gradcodec.c topk_threshold): a sample
 * that sees only the largest values keeps fewer than k candidates, and the encoder must fall
 * back to selecting over everything. Here every sampled position (multiples of n / 1024) holds
 * 100 and every other value is smaller. */
static void topk_unlucky_sample(void **state)
{
    (void)state;
    enum { N = 32768 };
    static float g[N];
    for (int i = 0; i < N; i++)
        g[i] = i % (N / 1024) == 0 ? 100.0f : (float)(i % 97) * 0.01f;
    check_topk_against_sort(g, N, 0.1); /* k = 3277 > the 1024 sampled */
    check_topk_against_sort(g, N, 0.01);
}

static void topk_non_finite(void **state)
{
    (void)state;
    float g[6] = {1, NAN, -INFINITY, 2, INFINITY, 3};
    cps__gradcodec gc = {CPS_GC_TOPK, 0.3}; /* k = 2 */
    unsigned char out[64];
    size_t len;
    assert_int_equal(cps__gradcodec_encode(&gc, g, 6, out, sizeof out, &len, NULL), 0);
    assert_int_equal(cps__le32_get(out + 4), 2);
    assert_int_equal(cps__le32_get(out + 8), 1);  /* NaN ranks first */
    assert_int_equal(cps__le32_get(out + 12), 2); /* -inf before +inf: lower index */
    /* The infinity not sent leaves no residual; finite ones are carried. */
    assert_true(g[4] == 0 && g[0] == 1 && g[3] == 2 && g[5] == 3 && g[1] == 0 && g[2] == 0);
}

/* ---- error feedback ---- */

/* Steps of gradients through one codec with error feedback: every decoded value plus the last
 * residual adds up to the sum of the raw gradients. With `dyadic` gradients (multiples of 2^-10
 * below 64 in magnitude) every sum and difference involved is exact in float32 (the 16-bit
 * formats' grids there are multiples of 2^-10 too, and the residual x - round(x) is exact by
 * Sterbenz's lemma), so equality is exact. With arbitrary floats, g + residual is rounded once per
 * step: the gap is at most half an ulp of |g + residual| per step. */
static void ef_run(const cps__gradcodec *gc, int dyadic)
{
    enum { N = 1000, T = 60 };
    float g[N], acc[N], resid[N], dec[N];
    double sum_raw[N], sum_dec[N], bound[N];
    unsigned char out[8 + 8 * N];
    memset(resid, 0, sizeof resid);
    memset(sum_raw, 0, sizeof sum_raw);
    memset(sum_dec, 0, sizeof sum_dec);
    memset(bound, 0, sizeof bound);
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < N; i++) {
            if (dyadic)
                g[i] = (float)((int64_t)(rnd() % 131072) - 65536) * 0x1p-10f;
            else
                g[i] = (float)(((double)(rnd() >> 11) / 9007199254740992.0 - 0.5) *
                               pow(10, (double)(rnd() % 8) - 6));
            acc[i] = g[i] + resid[i];
            bound[i] += fabs((double)acc[i]) * 0x1p-24;
            sum_raw[i] += g[i];
        }
        size_t len;
        assert_int_equal(cps__gradcodec_encode(gc, acc, N, out, sizeof out, &len, NULL), 0);
        assert_int_equal(cps__gradcodec_decode(out, len, N, dec), 0);
        for (int i = 0; i < N; i++) {
            sum_dec[i] += dec[i];
            resid[i] = acc[i];
        }
    }
    for (int i = 0; i < N; i++) {
        double got = sum_dec[i] + resid[i];
        if (dyadic)
            assert_true(got == sum_raw[i]);
        else
            assert_true(fabs(got - sum_raw[i]) <= bound[i]);
    }
}

static void error_feedback_sums_to_the_total(void **state)
{
    (void)state;
    static const cps__gradcodec codecs[] = {
        {CPS_GC_FP16, 0}, {CPS_GC_BF16, 0}, {CPS_GC_TOPK, 0.01}, {CPS_GC_TOPK, 0.3}};
    for (size_t c = 0; c < sizeof codecs / sizeof *codecs; c++) {
        ef_run(&codecs[c], 1);
        ef_run(&codecs[c], 0);
    }
}

/* A finite gradient beyond fp16's range is sent as 65504 and the excess carried, not sent as an
 * infinity that would ruin the parameter. */
static void fp16_saturates(void **state)
{
    (void)state;
    cps__gradcodec gc = {CPS_GC_FP16, 0};
    float acc[2] = {100000.0f, -1e30f};
    unsigned char out[16];
    float dec[2];
    size_t len;
    assert_int_equal(cps__gradcodec_encode(&gc, acc, 2, out, sizeof out, &len, NULL), 0);
    assert_int_equal(cps__gradcodec_decode(out, len, 2, dec), 0);
    assert_true(dec[0] == 65504.0f && dec[1] == -65504.0f);
    assert_true(acc[0] == 100000.0f - 65504.0f);
    assert_true(acc[1] == -1e30f + 65504.0f);
    float nf[2] = {INFINITY, NAN};
    assert_int_equal(cps__gradcodec_encode(&gc, nf, 2, out, sizeof out, &len, NULL), 0);
    assert_int_equal(cps__gradcodec_decode(out, len, 2, dec), 0);
    assert_true(isinf(dec[0]) && isnan(dec[1]) && nf[0] == 0 && nf[1] == 0);
}

/* ---- bad input ---- */

static void decoder_rejects_malformed(void **state)
{
    (void)state;
    enum { N = 50 };
    float g[N], out[N], keep[N];
    for (int i = 0; i < N; i++)
        g[i] = (float)i - 20.5f;
    unsigned char blk[8 + 8 * N + 8], bad[sizeof blk];
    size_t len;
    cps__gradcodec top = {CPS_GC_TOPK, 0.1}; /* k = 5 */
    for (int i = 0; i < N; i++)
        keep[i] = 7.0f;
    memcpy(out, keep, sizeof out);
    float acc[N];
    memcpy(acc, g, sizeof acc);
    assert_int_equal(cps__gradcodec_encode(&top, acc, N, blk, sizeof blk, &len, NULL), 0);
    assert_int_equal(len, 8 + 8 * 5);
#define REFUSED(buf, l, n, code)                                                                   \
    do {                                                                                           \
        assert_int_equal(cps__gradcodec_decode(buf, l, n, out), code);                             \
        assert_memory_equal(out, keep, sizeof out);                                                \
    } while (0)
    REFUSED(blk, len - 1, N, CPS_ESIZE);
    REFUSED(blk, len + 1, N, CPS_ESIZE);
    REFUSED(blk, 7, N, CPS_ESIZE);
    REFUSED(blk, len, 4, CPS_EPROTO); /* k > n */
    memcpy(bad, blk, len);
    bad[0] = 4; /* unknown codec */
    REFUSED(bad, len, N, CPS_EPROTO);
    bad[0] = 0;
    REFUSED(bad, len, N, CPS_EPROTO);
    memcpy(bad, blk, len);
    bad[2] = 1; /* reserved byte */
    REFUSED(bad, len, N, CPS_EPROTO);
    memcpy(bad, blk, len);
    cps__le32_put(bad + 4, 0); /* k = 0 */
    REFUSED(bad, 8, N, CPS_EPROTO);
    memcpy(bad, blk, len);
    cps__le32_put(bad + 8 + 4, cps__le32_get(bad + 8)); /* a repeated index */
    REFUSED(bad, len, N, CPS_EPROTO);
    memcpy(bad, blk, len);
    uint32_t i0 = cps__le32_get(bad + 8), i1 = cps__le32_get(bad + 12);
    cps__le32_put(bad + 8, i1); /* descending */
    cps__le32_put(bad + 12, i0);
    REFUSED(bad, len, N, CPS_EPROTO);
    memcpy(bad, blk, len);
    cps__le32_put(bad + 8 + 4 * 4, N); /* last index out of range */
    REFUSED(bad, len, N, CPS_EPROTO);
    /* fp16 / bf16: the count must be n, the length 8 + 2n. */
    cps__gradcodec half = {CPS_GC_FP16, 0};
    memcpy(acc, g, sizeof acc);
    assert_int_equal(cps__gradcodec_encode(&half, acc, N, blk, sizeof blk, &len, NULL), 0);
    assert_int_equal(len, 8 + 2 * N);
    REFUSED(blk, len, N - 1, CPS_EPROTO);
    REFUSED(blk, len - 2, N, CPS_ESIZE);
    memcpy(bad, blk, len);
    bad[0] = CPS_GC_BF16; /* another codec over the same bytes is still well-formed */
    assert_int_equal(cps__gradcodec_decode(bad, len, N, out), 0);
    memcpy(out, keep, sizeof out);
    assert_int_equal(cps__gradcodec_decode(NULL, len, N, out), CPS_EINVAL);
    assert_int_equal(cps__gradcodec_decode(blk, len, 0, out), CPS_EINVAL);
    /* Encoder arguments. */
    assert_int_equal(cps__gradcodec_encode(&half, acc, N, blk, len - 1, &len, NULL), CPS_EINVAL);
    cps__gradcodec none = {CPS_GC_NONE, 0};
    assert_int_equal(cps__gradcodec_encode(&none, acc, N, blk, sizeof blk, &len, NULL), CPS_EINVAL);
#undef REFUSED
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(f16_exact_on_representable),
        cmocka_unit_test(bf16_exact_on_representable),
        cmocka_unit_test(f16_round_to_nearest_even),
        cmocka_unit_test(bf16_round_to_nearest_even),
        cmocka_unit_test(specials),
        cmocka_unit_test(encoder_matches_conversions),
        cmocka_unit_test(parse_specs),
        cmocka_unit_test(topk_k_formula),
        cmocka_unit_test(topk_keeps_the_k_largest),
        cmocka_unit_test(topk_unlucky_sample),
        cmocka_unit_test(topk_non_finite),
        cmocka_unit_test(error_feedback_sums_to_the_total),
        cmocka_unit_test(fp16_saturates),
        cmocka_unit_test(decoder_rejects_malformed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
