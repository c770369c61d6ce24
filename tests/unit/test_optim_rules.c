/* Optimizer update rules and initialisers.
 *
 * Expected values are recomputed here in double straight from the formulas in optim.h (and a few
 * are worked out by hand as literals), never by calling the code under test, so a wrong rule in
 * optim.c cannot also be "expected". The implementation computes in float, hence tolerances. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "chainps/chainps.h"
#include "chainps/error.h"
#include "optim/optim.h"

#define N     5
#define STEPS 3

static const float P0[N] = {1.0f, -2.0f, 0.5f, 3.0f, 0.0f};
static const float G[STEPS][N] = {
    {0.5f, -1.0f, 0.25f, 2.0f, 0.0f},
    {-0.3f, 0.7f, 1.5f, -2.5f, 0.1f},
    {0.05f, -0.2f, -1.0f, 0.75f, -0.4f},
};

static cps__param_spec spec_of(uint32_t kind, float lr)
{
    cps__param_spec s;
    memset(&s, 0, sizeof s);
    s.opt_kind = kind;
    s.lr = lr;
    return s;
}

/* Reference rules, double precision, element by element, from the header's formulas. */
static void ref_run(const cps__param_spec *s, double *p, int steps)
{
    double v[N] = {0}, m[N] = {0};
    double b1 = s->beta1, b2 = s->beta2, eps = s->eps, rho = s->rho;
    for (int t = 1; t <= steps; t++) {
        for (int i = 0; i < N; i++) {
            double g = (double)G[t - 1][i] + (double)s->weight_decay * p[i];
            double lr = s->lr, mu = s->momentum;
            switch (s->opt_kind) {
            case CPS_W_OPT_SGD:
                p[i] -= lr * g;
                break;
            case CPS_W_OPT_MOMENTUM:
                v[i] = mu * v[i] + g;
                p[i] -= s->nesterov ? lr * (g + mu * v[i]) : lr * v[i];
                break;
            case CPS_W_OPT_ADAGRAD:
                v[i] += g * g;
                p[i] -= lr * g / (sqrt(v[i]) + eps);
                break;
            case CPS_W_OPT_ADAM: {
                m[i] = b1 * m[i] + (1 - b1) * g;
                v[i] = b2 * v[i] + (1 - b2) * g * g;
                double mh = m[i] / (1 - pow(b1, t)), vh = v[i] / (1 - pow(b2, t));
                p[i] -= lr * mh / (sqrt(vh) + eps);
                break;
            }
            case CPS_W_OPT_RMSPROP:
                v[i] = rho * v[i] + (1 - rho) * g * g;
                p[i] -= lr * g / (sqrt(v[i]) + eps);
                break;
            }
        }
    }
}

static void impl_run(const cps__param_spec *s, float *p, int steps)
{
    float state[2 * N] = {0};
    memcpy(p, P0, sizeof P0);
    for (int t = 1; t <= steps; t++)
        assert_int_equal(cps__optim_apply(s, p, state, G[t - 1], N, (uint64_t)t), 0);
}

static void check_against_ref(const cps__param_spec *s)
{
    double ref[N];
    float got[N];
    for (int i = 0; i < N; i++)
        ref[i] = P0[i];
    ref_run(s, ref, STEPS);
    impl_run(s, got, STEPS);
    for (int i = 0; i < N; i++) {
        double tol = 1e-6 + 1e-5 * fabs(ref[i]);
        if (fabs((double)got[i] - ref[i]) > tol)
            fail_msg("kind %u elem %d: got %.9g want %.9g", s->opt_kind, i, got[i], ref[i]);
    }
}

static void test_state_slots(void **st)
{
    (void)st;
    assert_int_equal(cps__optim_state_slots(CPS_W_OPT_SGD), 0);
    assert_int_equal(cps__optim_state_slots(CPS_W_OPT_MOMENTUM), 1);
    assert_int_equal(cps__optim_state_slots(CPS_W_OPT_ADAGRAD), 1);
    assert_int_equal(cps__optim_state_slots(CPS_W_OPT_ADAM), 2);
    assert_int_equal(cps__optim_state_slots(CPS_W_OPT_RMSPROP), 1);
}

static void test_sgd(void **st)
{
    (void)st;
    cps__param_spec s = spec_of(CPS_W_OPT_SGD, 0.1f);
    float p[N];
    impl_run(&s, p, 1);
    /* By hand: 1 - 0.1*0.5, -2 - 0.1*(-1), 0.5 - 0.1*0.25, 3 - 0.1*2, 0. */
    assert_float_equal(p[0], 0.95, 1e-6);
    assert_float_equal(p[1], -1.9, 1e-6);
    assert_float_equal(p[2], 0.475, 1e-6);
    assert_float_equal(p[3], 2.8, 1e-6);
    assert_float_equal(p[4], 0.0, 0.0);
    check_against_ref(&s);
}

static void test_momentum(void **st)
{
    (void)st;
    cps__param_spec s = spec_of(CPS_W_OPT_MOMENTUM, 0.1f);
    s.momentum = 0.9f;
    float p[N];
    impl_run(&s, p, 2);
    /* By hand, element 0: v1 = 0.5, p1 = 0.95; v2 = 0.45 - 0.3 = 0.15, p2 = 0.95 - 0.015. */
    assert_float_equal(p[0], 0.935, 1e-6);
    check_against_ref(&s);
}

static void test_nesterov(void **st)
{
    (void)st;
    cps__param_spec s = spec_of(CPS_W_OPT_MOMENTUM, 0.1f);
    s.momentum = 0.9f;
    s.nesterov = 1;
    float p[N];
    impl_run(&s, p, 2);
    /* Element 0: v1 = 0.5, p1 = 1 - 0.1*(0.5 + 0.45) = 0.905;
     * v2 = 0.15, p2 = 0.905 - 0.1*(-0.3 + 0.135) = 0.9215. */
    assert_float_equal(p[0], 0.9215, 1e-6);
    check_against_ref(&s);
}

static void test_adagrad(void **st)
{
    (void)st;
    cps__param_spec s = spec_of(CPS_W_OPT_ADAGRAD, 0.5f);
    s.eps = 1e-10f;
    float p[N];
    impl_run(&s, p, 1);
    /* First step moves every non-zero-gradient element by lr*sign(g) (h = g^2). */
    assert_float_equal(p[0], 0.5, 1e-6);
    assert_float_equal(p[1], -1.5, 1e-6);
    assert_float_equal(p[4], 0.0, 0.0);
    check_against_ref(&s);
}

static void test_adam(void **st)
{
    (void)st;
    cps__param_spec s = spec_of(CPS_W_OPT_ADAM, 0.01f);
    s.beta1 = 0.9f;
    s.beta2 = 0.999f;
    s.eps = 1e-8f;
    float p[N];
    impl_run(&s, p, 1);
    /* Bias-corrected first step: mhat = g, vhat = g^2, so p -= lr*sign(g). */
    assert_float_equal(p[0], 0.99, 1e-6);
    assert_float_equal(p[1], -1.99, 1e-6);
    assert_float_equal(p[3], 2.99, 1e-6);
    check_against_ref(&s);
}

static void test_rmsprop(void **st)
{
    (void)st;
    cps__param_spec s = spec_of(CPS_W_OPT_RMSPROP, 0.01f);
    s.rho = 0.9f;
    s.eps = 1e-8f;
    float p[N];
    impl_run(&s, p, 1);
    /* s1 = 0.1*g^2, so the step is lr*g/(sqrt(0.1)|g|) = lr/sqrt(0.1) * sign(g). */
    assert_float_equal(p[0], 1.0 - 0.01 / sqrt(0.1), 1e-6);
    check_against_ref(&s);
}

static void test_weight_decay(void **st)
{
    (void)st;
    cps__param_spec s = spec_of(CPS_W_OPT_SGD, 0.1f);
    s.weight_decay = 0.5f;
    float p[N];
    impl_run(&s, p, 1);
    /* Element 0: g = 0.5 + 0.5*1 = 1, p = 0.9. Element 4: g = 0 + 0, stays 0. */
    assert_float_equal(p[0], 0.9, 1e-6);
    assert_float_equal(p[4], 0.0, 0.0);
    check_against_ref(&s);
    uint32_t kinds[] = {CPS_W_OPT_MOMENTUM, CPS_W_OPT_ADAGRAD, CPS_W_OPT_ADAM, CPS_W_OPT_RMSPROP};
    for (size_t k = 0; k < 4; k++) {
        cps__param_spec w = spec_of(kinds[k], 0.05f);
        w.weight_decay = 0.1f;
        w.momentum = 0.5f;
        w.beta1 = 0.8f;
        w.beta2 = 0.99f;
        w.eps = 1e-6f;
        w.rho = 0.95f;
        check_against_ref(&w);
    }
}

static void same_bits(const cps__param_spec *a, const cps__param_spec *b)
{
    float pa[N], pb[N];
    impl_run(a, pa, STEPS);
    impl_run(b, pb, STEPS);
    assert_memory_equal(pa, pb, sizeof pa);
}

static void test_defaults(void **st)
{
    (void)st;
    cps__param_spec z = spec_of(CPS_W_OPT_ADAM, 0.01f), d = z;
    d.beta1 = 0.9f, d.beta2 = 0.999f, d.eps = 1e-8f;
    same_bits(&z, &d);
    check_against_ref(&d);

    z = spec_of(CPS_W_OPT_ADAGRAD, 0.1f), d = z;
    d.eps = 1e-10f;
    same_bits(&z, &d);

    z = spec_of(CPS_W_OPT_RMSPROP, 0.01f), d = z;
    d.rho = 0.9f, d.eps = 1e-8f;
    same_bits(&z, &d);

    cps__param_spec r = spec_of(CPS_W_OPT_RMSPROP, 0.01f);
    cps__optim_spec_defaults(&r);
    assert_true(r.rho == 0.9f && r.eps == 1e-8f && r.beta1 == 0.0f);
    r = spec_of(CPS_W_OPT_SGD, 0.01f);
    cps__optim_spec_defaults(&r);
    assert_true(r.eps == 0.0f && r.beta1 == 0.0f && r.rho == 0.0f);
}

static void test_errors(void **st)
{
    (void)st;
    float p[2] = {1, 2}, g[2] = {1, 1}, s[4] = {0};
    cps__param_spec a = spec_of(CPS_W_OPT_ADAM, 0.1f);
    assert_int_equal(cps__optim_apply(&a, p, s, g, 2, 0), CPS_EINVAL);
    assert_int_equal(cps__optim_apply(&a, p, NULL, g, 2, 1), CPS_EINVAL);
    cps__param_spec bad = spec_of(99, 0.1f);
    assert_int_equal(cps__optim_apply(&bad, p, s, g, 2, 1), CPS_EINVAL);
    cps__param_spec sgd = spec_of(CPS_W_OPT_SGD, 0.1f);
    assert_int_equal(cps__optim_apply(&sgd, p, NULL, g, 2, 1), 0);
}

/* The same update on buffers at different alignments and lengths must give the same bits:
 * replicas do not share allocators, and vectorised loops treat heads and tails differently. */
static void test_alignment_independent(void **st)
{
    (void)st;
    enum { M = 67 };
    static float pa[M + 8], pb[M + 8], sa[2 * M + 8], sb[2 * M + 8], g[M + 8], gb[M + 8];
    for (uint32_t kind = 0; kind <= CPS_W_OPT_RMSPROP; kind++) {
        cps__param_spec s = spec_of(kind, 0.01f);
        s.momentum = 0.9f;
        s.weight_decay = 0.01f;
        memset(sa, 0, sizeof sa);
        memset(sb, 0, sizeof sb);
        for (int i = 0; i < M; i++) {
            pa[i] = pb[i + 3] = (float)sin(i * 0.37) * 2.0f;
            g[i] = gb[i + 1] = (float)cos(i * 1.3);
        }
        for (uint64_t t = 1; t <= 3; t++) {
            assert_int_equal(cps__optim_apply(&s, pa, sa, g, M, t), 0);
            /* The same vectors at other (misaligned for SIMD) offsets. */
            assert_int_equal(cps__optim_apply(&s, pb + 3, sb + 1, gb + 1, M, t), 0);
        }
        assert_memory_equal(pa, pb + 3, M * sizeof(float));
    }
    /* Split: elements are independent, so two calls over halves equal one call (SGD, no state
     * layout issue). */
    cps__param_spec s = spec_of(CPS_W_OPT_SGD, 0.01f);
    for (int i = 0; i < M; i++)
        pa[i] = pb[i] = (float)i;
    assert_int_equal(cps__optim_apply(&s, pa, NULL, g, M, 1), 0);
    assert_int_equal(cps__optim_apply(&s, pb, NULL, g, 13, 1), 0);
    assert_int_equal(cps__optim_apply(&s, pb + 13, NULL, g + 13, M - 13, 1), 0);
    assert_memory_equal(pa, pb, M * sizeof(float));
}

/* The out-of-place step (the store's path for records that LMDB moves) gives bitwise what a
 * copy followed by the in-place step gives, for every rule, over several blocks and a tail; the
 * source record is left alone. */
static void test_apply_copy(void **st)
{
    (void)st;
    enum { M = 5000 }; /* more than two blocks, not a multiple of one */
    float *src = malloc(3 * M * sizeof(float)), *ref = malloc(3 * M * sizeof(float));
    float *dst = malloc(3 * M * sizeof(float)), *keep = malloc(3 * M * sizeof(float));
    float *g = malloc(M * sizeof(float));
    assert_non_null(src && ref && dst && keep && g);
    for (uint32_t kind = 0; kind <= CPS_W_OPT_RMSPROP; kind++) {
        cps__param_spec s = spec_of(kind, 0.01f);
        s.momentum = 0.9f;
        s.weight_decay = 0.01f;
        s.nesterov = kind == CPS_W_OPT_MOMENTUM;
        size_t slots = cps__optim_state_slots(kind);
        for (int i = 0; i < 3 * M; i++)
            src[i] = i < M ? (float)sin(i * 0.37) * 2.0f : (float)fabs(cos(i * 0.11));
        for (int i = 0; i < M; i++)
            g[i] = (float)cos(i * 1.3);
        size_t bytes = (1 + slots) * M * sizeof(float);
        memcpy(ref, src, bytes);
        memcpy(keep, src, bytes);
        assert_int_equal(cps__optim_apply(&s, ref, slots ? ref + M : NULL, g, M, 3), 0);
        assert_int_equal(cps__optim_apply_copy(&s, src, dst, g, M, 3), 0);
        assert_memory_equal(dst, ref, bytes);
        assert_memory_equal(src, keep, bytes);
    }
    cps__param_spec a = spec_of(CPS_W_OPT_ADAM, 0.1f);
    assert_int_equal(cps__optim_apply_copy(&a, src, dst, g, M, 0), CPS_EINVAL);
    cps__param_spec bad = spec_of(99, 0.1f);
    assert_int_equal(cps__optim_apply_copy(&bad, src, dst, g, M, 1), CPS_EINVAL);
    free(src);
    free(ref);
    free(dst);
    free(keep);
    free(g);
}

static void test_vec_ops(void **st)
{
    (void)st;
    enum { M = 1003 };
    float *buf = malloc((M + 4) * sizeof(float)), *x = malloc((M + 4) * sizeof(float));
    float *ref = malloc(M * sizeof(float));
    assert_non_null(buf);
    assert_non_null(x);
    assert_non_null(ref);
    for (int off = 0; off < 3; off++) {
        for (int i = 0; i < M; i++) {
            buf[off + i] = (float)sin(i * 0.11) * 1e3f;
            x[i + 1] = (float)cos(i * 0.07) * 1e-2f;
            ref[i] = buf[off + i] + x[i + 1];
        }
        cps__vec_add(buf + off, x + 1, M);
        assert_memory_equal(buf + off, ref, M * sizeof(float));
        for (int i = 0; i < M; i++)
            ref[i] = buf[off + i] * 0.25f;
        cps__vec_scale(buf + off, 0.25f, M);
        assert_memory_equal(buf + off, ref, M * sizeof(float));
    }
    cps__vec_add(buf, x, 0);
    cps__vec_scale(buf, 2.0f, 0);
    free(buf);
    free(x);
    free(ref);
}

/* ---- init ---- */

static cps__param_spec init_spec(uint32_t kind, float a, float b, uint64_t seed)
{
    cps__param_spec s = spec_of(CPS_W_OPT_SGD, 0.1f);
    s.init_kind = kind;
    s.init_a = a;
    s.init_b = b;
    s.init_seed = seed;
    return s;
}

/* The normal fill runs in vector lanes (8 wide with AVX-512): its bits must stay those of the
 * scalar formula, on every machine and in every version, or replicas (each creates its own
 * copy at declare) and cps_init_values would disagree. 40 values = two whole blocks of lanes
 * plus a scalar tail; the expected bits were computed by the one-element-at-a-time code. */
static void test_init_normal_bits(void **st)
{
    (void)st;
    cps__param_spec s = init_spec(CPS_W_INIT_NORMAL, -1.0f, 2.0f, 12345);
    float v[40];
    cps__init_fill(&s, 1000000000000ull, v, 40);
    uint32_t h = 0, u[3];
    for (int i = 0; i < 40; i++) {
        uint32_t b;
        memcpy(&b, &v[i], sizeof b);
        h = h * 31 + b;
        if (i < 3)
            u[i] = b;
    }
    assert_int_equal(u[0], 0xc0a86429u);
    assert_int_equal(u[1], 0xbf91e0bdu);
    assert_int_equal(u[2], 0xbf190d1bu);
    assert_int_equal(h, 0x334d6ca8u);
}

static void test_init_chunking(void **st)
{
    (void)st;
    enum { M = 1000 };
    float whole[M], pieces[M];
    for (uint32_t kind = CPS_W_INIT_UNIFORM; kind <= CPS_W_INIT_NORMAL; kind++) {
        cps__param_spec s = init_spec(kind, -1.0f, 2.0f, 12345);
        cps__init_fill(&s, 0, whole, M);
        for (size_t off = 0; off < M;) {
            size_t k = 1 + (off * 7) % 13;
            if (off + k > M)
                k = M - off;
            cps__init_fill(&s, off, pieces + off, k);
            off += k;
        }
        assert_memory_equal(whole, pieces, sizeof whole);
        /* A later slice of a big tensor: element 10^12 + j is the same either way. */
        float far1[4], far2[2];
        cps__init_fill(&s, 1000000000000ull, far1, 4);
        cps__init_fill(&s, 1000000000002ull, far2, 2);
        assert_memory_equal(far1 + 2, far2, sizeof far2);

        /* Public mirror gives the same values. */
        cps_init pub = {kind == CPS_W_INIT_UNIFORM ? CPS_INIT_UNIFORM : CPS_INIT_NORMAL, -1.0f,
                        2.0f, 12345};
        cps_init_values(&pub, 0, pieces, M);
        assert_memory_equal(whole, pieces, sizeof whole);

        /* Another seed gives other values. */
        cps__param_spec o = init_spec(kind, -1.0f, 2.0f, 12346);
        cps__init_fill(&o, 0, pieces, M);
        int same = 0;
        for (int i = 0; i < M; i++)
            same += whole[i] == pieces[i];
        assert_true(same < 5);
    }
}

static void test_init_uniform(void **st)
{
    (void)st;
    enum { M = 100000 };
    float *v = malloc(M * sizeof(float));
    assert_non_null(v);
    cps__param_spec s = init_spec(CPS_W_INIT_UNIFORM, -0.5f, 0.25f, 7);
    cps__init_fill(&s, 0, v, M);
    double sum = 0, lo = 1, hi = -1;
    int low_q = 0;
    for (int i = 0; i < M; i++) {
        assert_true(v[i] >= -0.5f && v[i] < 0.25f);
        sum += v[i];
        lo = fmin(lo, v[i]);
        hi = fmax(hi, v[i]);
        low_q += v[i] < -0.3125f; /* first quarter of the interval */
    }
    assert_float_equal(sum / M, -0.125, 0.005);
    assert_true(lo < -0.499 && hi > 0.249);
    assert_float_equal((double)low_q / M, 0.25, 0.01);

    /* A one-ulp interval still never returns the excluded upper bound. */
    s = init_spec(CPS_W_INIT_UNIFORM, 1.0f, nextafterf(1.0f, 2.0f), 3);
    cps__init_fill(&s, 0, v, 1000);
    for (int i = 0; i < 1000; i++)
        assert_true(v[i] == 1.0f);
    free(v);
}

static void test_init_normal(void **st)
{
    (void)st;
    enum { M = 100000 };
    float *v = malloc(M * sizeof(float));
    assert_non_null(v);
    cps__param_spec s = init_spec(CPS_W_INIT_NORMAL, 2.0f, 3.0f, 99);
    cps__init_fill(&s, 0, v, M);
    double sum = 0, sq = 0;
    int within1 = 0, within2 = 0;
    for (int i = 0; i < M; i++) {
        assert_true(isfinite(v[i]));
        sum += v[i];
        within1 += fabs(v[i] - 2.0) < 3.0;
        within2 += fabs(v[i] - 2.0) < 6.0;
    }
    double mean = sum / M;
    for (int i = 0; i < M; i++)
        sq += (v[i] - mean) * (v[i] - mean);
    double sd = sqrt(sq / (M - 1));
    /* Standard errors: mean 3/sqrt(1e5) = 0.0095, sd about 0.0067; allow ~5 of them. */
    assert_float_equal(mean, 2.0, 0.05);
    assert_float_equal(sd, 3.0, 0.035);
    assert_float_equal((double)within1 / M, 0.6827, 0.01);
    assert_float_equal((double)within2 / M, 0.9545, 0.005);
    free(v);
}

static void test_init_zeros_constant(void **st)
{
    (void)st;
    float v[33];
    cps__param_spec s = init_spec(CPS_W_INIT_CONSTANT, 0.125f, 0, 1);
    cps__init_fill(&s, 5, v, 33);
    for (int i = 0; i < 33; i++)
        assert_true(v[i] == 0.125f);
    s = init_spec(CPS_W_INIT_ZEROS, 4.0f, 5.0f, 1);
    cps__init_fill(&s, 5, v, 33);
    for (int i = 0; i < 33; i++)
        assert_true(v[i] == 0.0f);
    memset(v, 0xff, sizeof v);
    cps_init_values(NULL, 0, v, 33);
    for (int i = 0; i < 33; i++)
        assert_true(v[i] == 0.0f);
    cps_init c = {CPS_INIT_CONSTANT, -3.5f, 0, 0};
    cps_init_values(&c, 100, v, 33);
    for (int i = 0; i < 33; i++)
        assert_true(v[i] == -3.5f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_state_slots),
        cmocka_unit_test(test_sgd),
        cmocka_unit_test(test_momentum),
        cmocka_unit_test(test_nesterov),
        cmocka_unit_test(test_adagrad),
        cmocka_unit_test(test_adam),
        cmocka_unit_test(test_rmsprop),
        cmocka_unit_test(test_weight_decay),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_alignment_independent),
        cmocka_unit_test(test_apply_copy),
        cmocka_unit_test(test_vec_ops),
        cmocka_unit_test(test_init_chunking),
        cmocka_unit_test(test_init_normal_bits),
        cmocka_unit_test(test_init_uniform),
        cmocka_unit_test(test_init_normal),
        cmocka_unit_test(test_init_zeros_constant),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
