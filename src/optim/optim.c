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

/* ---- the rules ----
 *
 * Each rule is one function of an element: its value, its state and its gradient in, the new
 * value and state out. Two loops drive each rule: in place (the value and state arrays are read
 * and written), and out of place (read from the record LMDB holds, written to the fresh one of
 * the copy-on-write transaction: one pass over memory instead of a copy and then an update,
 * issue 14). The loops differ only in where the element comes from and goes, so both compute
 * the same bits, which test_optim_rules checks. */

typedef struct rule {
    float lr, wd, eps, mu, b1, b2, c1, c2, bc1, bc2, rho, c;
    int nesterov;
} rule;

static rule rule_of(const cps__param_spec *s, uint64_t t)
{
    rule r = {.lr = s->lr,
              .wd = s->weight_decay,
              .eps = s->eps,
              .mu = s->momentum,
              .nesterov = s->nesterov,
              .rho = s->rho,
              .c = 1.0f - s->rho};
    if (s->opt_kind == CPS_W_OPT_ADAM) {
        r.b1 = s->beta1, r.b2 = s->beta2;
        r.c1 = 1.0f - r.b1, r.c2 = 1.0f - r.b2;
        /* The bias corrections are computed once per call in double, then rounded to float, so
         * they are the same for every element and every replica. */
        r.bc1 = (float)(1.0 - powi(r.b1, t));
        r.bc2 = (float)(1.0 - powi(r.b2, t));
    }
    return r;
}

static inline float sgd_step(const rule *r, float p, float g)
{
    return p - r->lr * decayed(g, p, r->wd);
}

static inline float momentum_step(const rule *r, float p, float *v, float g)
{
    float gi = decayed(g, p, r->wd);
    float nv = r->mu * *v + gi;
    *v = nv;
    return p - (r->nesterov ? r->lr * (gi + r->mu * nv) : r->lr * nv);
}

static inline float adagrad_step(const rule *r, float p, float *h, float g)
{
    float gi = decayed(g, p, r->wd);
    float nh = *h + gi * gi;
    *h = nh;
    return p - r->lr * gi / (sqrtf(nh) + r->eps);
}

static inline float adam_step(const rule *r, float p, float *m, float *v, float g)
{
    float gi = decayed(g, p, r->wd);
    float nm = r->b1 * *m + r->c1 * gi;
    float nv = r->b2 * *v + r->c2 * gi * gi;
    *m = nm, *v = nv;
    float mhat = nm / r->bc1;
    float vhat = nv / r->bc2;
    return p - r->lr * mhat / (sqrtf(vhat) + r->eps);
}

static inline float rmsprop_step(const rule *r, float p, float *sq, float g)
{
    float gi = decayed(g, p, r->wd);
    float ns = r->rho * *sq + r->c * gi * gi;
    *sq = ns;
    return p - r->lr * gi / (sqrtf(ns) + r->eps);
}

/* In place: p[i] and the state slots st0[i], st1[i] (st1 for Adam's second moment). */
static void apply_inplace(uint32_t kind, const rule *r, float *restrict p, float *restrict st0,
                          float *restrict st1, const float *restrict g, size_t n)
{
    switch (kind) {
    case CPS_W_OPT_SGD:
        for (size_t i = 0; i < n; i++)
            p[i] = sgd_step(r, p[i], g[i]);
        break;
    case CPS_W_OPT_MOMENTUM:
        for (size_t i = 0; i < n; i++)
            p[i] = momentum_step(r, p[i], &st0[i], g[i]);
        break;
    case CPS_W_OPT_ADAGRAD:
        for (size_t i = 0; i < n; i++)
            p[i] = adagrad_step(r, p[i], &st0[i], g[i]);
        break;
    case CPS_W_OPT_ADAM:
        for (size_t i = 0; i < n; i++)
            p[i] = adam_step(r, p[i], &st0[i], &st1[i], g[i]);
        break;
    case CPS_W_OPT_RMSPROP:
        for (size_t i = 0; i < n; i++)
            p[i] = rmsprop_step(r, p[i], &st0[i], g[i]);
        break;
    default:
        break;
    }
}

/* Out of place: from sp / ss0 / ss1 to dp / ds0 / ds1, which do not overlap them. The state
 * element goes through a local, so the rule sees the same value it would in place. */
static void apply_outofplace(uint32_t kind, const rule *r, const float *restrict sp,
                             const float *restrict ss0, const float *restrict ss1,
                             float *restrict dp, float *restrict ds0, float *restrict ds1,
                             const float *restrict g, size_t n)
{
    switch (kind) {
    case CPS_W_OPT_SGD:
        for (size_t i = 0; i < n; i++)
            dp[i] = sgd_step(r, sp[i], g[i]);
        break;
    case CPS_W_OPT_MOMENTUM:
        for (size_t i = 0; i < n; i++) {
            float v = ss0[i];
            dp[i] = momentum_step(r, sp[i], &v, g[i]);
            ds0[i] = v;
        }
        break;
    case CPS_W_OPT_ADAGRAD:
        for (size_t i = 0; i < n; i++) {
            float h = ss0[i];
            dp[i] = adagrad_step(r, sp[i], &h, g[i]);
            ds0[i] = h;
        }
        break;
    case CPS_W_OPT_ADAM:
        for (size_t i = 0; i < n; i++) {
            float m = ss0[i], v = ss1[i];
            dp[i] = adam_step(r, sp[i], &m, &v, g[i]);
            ds0[i] = m, ds1[i] = v;
        }
        break;
    case CPS_W_OPT_RMSPROP:
        for (size_t i = 0; i < n; i++) {
            float q = ss0[i];
            dp[i] = rmsprop_step(r, sp[i], &q, g[i]);
            ds0[i] = q;
        }
        break;
    default:
        break;
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

int cps__optim_apply(const cps__param_spec *spec, float *param, float *state, const float *grad,
                     size_t n, uint64_t t)
{
    cps__param_spec s;
    int rc = apply_prepare(spec, &s, state != NULL, n, t);
    if (rc != 0 || n == 0)
        return rc;
    rule r = rule_of(&s, t);
    float *st1 = s.opt_kind == CPS_W_OPT_ADAM ? state + n : NULL;
    apply_inplace(s.opt_kind, &r, param, state, st1, grad, n);
    return 0;
}

int cps__optim_apply_copy(const cps__param_spec *spec, const float *src, float *dst,
                          const float *grad, size_t n, uint64_t t)
{
    cps__param_spec s;
    int rc = apply_prepare(spec, &s, 1, n, t);
    if (rc != 0 || n == 0)
        return rc;
    rule r = rule_of(&s, t);
    /* Slot k of the state follows the values at k * n (the record layout). */
    int adam = s.opt_kind == CPS_W_OPT_ADAM;
    apply_outofplace(s.opt_kind, &r, src, src + n, adam ? src + 2 * n : NULL, dst, dst + n,
                     adam ? dst + 2 * n : NULL, grad, n);
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
