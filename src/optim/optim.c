/* Server-side optimizers and the vector helpers used to aggregate gradients.
 *
 * Determinism: replicas of a chain apply the same updates with this code and must end up with
 * the same bits. So every rule below uses only IEEE-754 +, -, *, / and sqrtf (all correctly
 * rounded), evaluated element by element in a fixed order; the build disables FMA contraction
 * (-ffp-contract=off), and nothing here reduces across elements, so neither vectorisation, the
 * alignment of the buffers nor a thread count can change a result. No libm transcendental is
 * called: glibc picks FMA or non-FMA variants of pow/exp at run time by CPU, which would let two
 * replicas on different machines disagree. */
#include "optim/optim.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#include "chainps/error.h"

/* Defaults for hyper-parameters left at 0 by the caller (cps_optim documents "0 means the
 * default"). They are resolved in exactly one place, cps__optim_spec_defaults(), which
 * cps__optim_apply() calls on its own copy of the spec; the store also applies it before it
 * persists a spec so that "declared with 0" and "declared with the default" compare equal. */
#define DEF_BETA1       0.9f
#define DEF_BETA2       0.999f
#define DEF_EPS         1e-8f
#define DEF_EPS_ADAGRAD 1e-10f
#define DEF_RHO         0.9f

uint32_t cps__optim_state_slots(uint32_t opt_kind)
{
    switch (opt_kind) {
    case CPS_W_OPT_MOMENTUM:
    case CPS_W_OPT_ADAGRAD:
    case CPS_W_OPT_RMSPROP:
        return 1;
    case CPS_W_OPT_ADAM:
        return 2;
    default:
        return 0;
    }
}

void cps__optim_spec_defaults(cps__param_spec *s)
{
    switch (s->opt_kind) {
    case CPS_W_OPT_ADAM:
        if (s->beta1 == 0.0f)
            s->beta1 = DEF_BETA1;
        if (s->beta2 == 0.0f)
            s->beta2 = DEF_BETA2;
        if (s->eps == 0.0f)
            s->eps = DEF_EPS;
        break;
    case CPS_W_OPT_ADAGRAD:
        if (s->eps == 0.0f)
            s->eps = DEF_EPS_ADAGRAD;
        break;
    case CPS_W_OPT_RMSPROP:
        if (s->rho == 0.0f)
            s->rho = DEF_RHO;
        if (s->eps == 0.0f)
            s->eps = DEF_EPS;
        break;
    default:
        break;
    }
}

/* b^t by repeated squaring in double: exact enough for any t and, unlike pow(), the same bits on
 * every machine. */
static double powi(double b, uint64_t t)
{
    double r = 1.0;
    while (t) {
        if (t & 1)
            r *= b;
        b *= b;
        t >>= 1;
    }
    return r;
}

/* g = grad + wd*p. The branch keeps wd == 0 from turning an infinite parameter into NaN through
 * 0*inf, which would make "no weight decay" differ from plain SGD. */
static inline float decayed(float g, float p, float wd)
{
    return wd != 0.0f ? g + wd * p : g;
}

static void apply_sgd(const cps__param_spec *s, float *restrict p, const float *restrict g,
                      size_t n)
{
    const float lr = s->lr, wd = s->weight_decay;
    for (size_t i = 0; i < n; i++)
        p[i] -= lr * decayed(g[i], p[i], wd);
}

/* SGD out of place: one pass over the values instead of a copy and an update. */
static void apply_sgd_copy(const cps__param_spec *s, const float *restrict src, float *restrict dst,
                           const float *restrict g, size_t n)
{
    const float lr = s->lr, wd = s->weight_decay;
    for (size_t i = 0; i < n; i++)
        dst[i] = src[i] - lr * decayed(g[i], src[i], wd);
}

static void apply_momentum(const cps__param_spec *s, float *restrict p, float *restrict v,
                           const float *restrict g, size_t n)
{
    const float lr = s->lr, wd = s->weight_decay, mu = s->momentum;
    for (size_t i = 0; i < n; i++) {
        float gi = decayed(g[i], p[i], wd);
        v[i] = mu * v[i] + gi;
        p[i] -= s->nesterov ? lr * (gi + mu * v[i]) : lr * v[i];
    }
}

static void apply_adagrad(const cps__param_spec *s, float *restrict p, float *restrict h,
                          const float *restrict g, size_t n)
{
    const float lr = s->lr, wd = s->weight_decay, eps = s->eps;
    for (size_t i = 0; i < n; i++) {
        float gi = decayed(g[i], p[i], wd);
        h[i] += gi * gi;
        p[i] -= lr * gi / (sqrtf(h[i]) + eps);
    }
}

static void apply_adam(const cps__param_spec *s, float *restrict p, float *restrict m,
                       float *restrict v, const float *restrict g, size_t n, uint64_t t)
{
    const float lr = s->lr, wd = s->weight_decay, eps = s->eps;
    const float b1 = s->beta1, b2 = s->beta2;
    const float c1 = 1.0f - b1, c2 = 1.0f - b2;
    /* The bias corrections are computed once per call in double, then rounded to float, so they
     * are the same for every element and every replica. */
    const float bc1 = (float)(1.0 - powi(b1, t));
    const float bc2 = (float)(1.0 - powi(b2, t));
    for (size_t i = 0; i < n; i++) {
        float gi = decayed(g[i], p[i], wd);
        m[i] = b1 * m[i] + c1 * gi;
        v[i] = b2 * v[i] + c2 * gi * gi;
        float mhat = m[i] / bc1;
        float vhat = v[i] / bc2;
        p[i] -= lr * mhat / (sqrtf(vhat) + eps);
    }
}

static void apply_rmsprop(const cps__param_spec *s, float *restrict p, float *restrict sq,
                          const float *restrict g, size_t n)
{
    const float lr = s->lr, wd = s->weight_decay, eps = s->eps, rho = s->rho;
    const float c = 1.0f - rho;
    for (size_t i = 0; i < n; i++) {
        float gi = decayed(g[i], p[i], wd);
        sq[i] = rho * sq[i] + c * gi * gi;
        p[i] -= lr * gi / (sqrtf(sq[i]) + eps);
    }
}

/* Resolve the defaults of *spec into *s and check the arguments. */
static int apply_prepare(const cps__param_spec *spec, cps__param_spec *s, int have_state, size_t n,
                         uint64_t t)
{
    *s = *spec;
    cps__optim_spec_defaults(s);
    if (s->opt_kind > CPS_W_OPT_RMSPROP)
        return CPS_EINVAL;
    if (cps__optim_state_slots(s->opt_kind) > 0 && !have_state && n > 0)
        return CPS_EINVAL;
    /* t is 1-based: t == 0 would divide by a zero bias correction. */
    if (s->opt_kind == CPS_W_OPT_ADAM && t == 0)
        return CPS_EINVAL;
    return 0;
}

/* One step on n elements whose state slot k starts at state + k*stride. */
static void apply_kind(const cps__param_spec *s, float *param, float *state, size_t stride,
                       const float *grad, size_t n, uint64_t t)
{
    switch (s->opt_kind) {
    case CPS_W_OPT_SGD:
        apply_sgd(s, param, grad, n);
        break;
    case CPS_W_OPT_MOMENTUM:
        apply_momentum(s, param, state, grad, n);
        break;
    case CPS_W_OPT_ADAGRAD:
        apply_adagrad(s, param, state, grad, n);
        break;
    case CPS_W_OPT_ADAM:
        apply_adam(s, param, state, state + stride, grad, n, t);
        break;
    case CPS_W_OPT_RMSPROP:
        apply_rmsprop(s, param, state, grad, n);
        break;
    default:
        break;
    }
}

int cps__optim_apply(const cps__param_spec *spec, float *param, float *state, const float *grad,
                     size_t n, uint64_t t)
{
    cps__param_spec s;
    int rc = apply_prepare(spec, &s, state != NULL, n, t);
    if (rc == 0)
        apply_kind(&s, param, state, n, grad, n, t);
    return rc;
}

/* Elements per block of cps__optim_apply_copy: a block of every array (values, up to two state
 * slots, gradient) stays in L1/L2 between its copy and its update. */
#define APPLY_BLOCK 2048

int cps__optim_apply_copy(const cps__param_spec *spec, const float *src, float *dst,
                          const float *grad, size_t n, uint64_t t)
{
    cps__param_spec s;
    int rc = apply_prepare(spec, &s, 1, n, t);
    if (rc != 0)
        return rc;
    if (s.opt_kind == CPS_W_OPT_SGD) {
        apply_sgd_copy(&s, src, dst, grad, n);
        return 0;
    }
    size_t slots = cps__optim_state_slots(s.opt_kind);
    /* Every rule is elementwise, so updating block by block computes the same bits as one call
     * over all n elements. */
    for (size_t i = 0; i < n; i += APPLY_BLOCK) {
        size_t k = n - i < APPLY_BLOCK ? n - i : APPLY_BLOCK;
        for (size_t a = 0; a <= slots; a++)
            memcpy(dst + a * n + i, src + a * n + i, k * sizeof(float));
        apply_kind(&s, dst + i, dst + n + i, n, grad + i, k, t);
    }
    return 0;
}

/* BLAS lengths are `blasint` (int in this build): feed long vectors in chunks. */
#define BLAS_CHUNK ((size_t)1 << 30)

void cps__vec_add(float *acc, const float *x, size_t n)
{
    /* alpha == 1 makes the product exact, so whether OpenBLAS's kernel fuses the multiply-add
     * (its AVX2 saxpy does, its scalar tail does not) cannot change a single bit: every element
     * is round(acc + x). Elements are independent, so threads would not matter either (servers
     * still pin OpenBLAS to one thread to share cores). */
    while (n > 0) {
        size_t k = n < BLAS_CHUNK ? n : BLAS_CHUNK;
        cblas_saxpy((blasint)k, 1.0f, x, 1, acc, 1);
        acc += k, x += k, n -= k;
    }
}

void cps__vec_scale(float *acc, float a, size_t n)
{
    while (n > 0) {
        size_t k = n < BLAS_CHUNK ? n : BLAS_CHUNK;
        cblas_sscal((blasint)k, a, acc, 1);
        acc += k, n -= k;
    }
}
