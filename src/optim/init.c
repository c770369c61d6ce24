/* Parameter initialisers: a counter-based generator, so element i of a tensor gets the same
 * value whichever server creates it and however the tensor is cut into keys.
 *
 * Element i draws from splitmix64's output function applied to key + (2i+k+1)*gamma (k = 0, 1),
 * with key = a mix of the seed: that is splitmix64's stream read at position 2i+k, so it can be
 * evaluated at any index without walking the stream. Each element owns two positions (the two
 * uniforms of Box-Muller), which is why the counter is 2i+k.
 *
 * The normal transform needs log and cos. They are computed here with polynomials in double
 * using only +, -, *, / and exact frexp, rather than with libm: glibc selects different
 * (FMA / non-FMA) implementations of log and cos by CPU at run time, and replicas on different
 * machines must create identical bits. */
#include "optim/optim.h"

#include <math.h>

#include "chainps/chainps.h"

#define GOLDEN_GAMMA 0x9E3779B97F4A7C15ull
#define SEED_SALT    0x6A09E667F3BCC909ull /* sqrt(2) fraction bits: keeps seed 0 off the origin */
#define INV_2_53     (1.0 / 9007199254740992.0)
#define LN2          0.693147180559945309417
#define SQRT1_2      0.707106781186547524401
#define TWO_PI       6.28318530717958647693

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t draw(uint64_t key, uint64_t i, unsigned k)
{
    return mix64(key + (2 * i + k + 1) * GOLDEN_GAMMA);
}

/* Natural log of x in (0, 1]: x = m*2^e with m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(s),
 * s = (m-1)/(m+1), |s| < 0.172; 16 terms of the atanh series are far below double precision. */
static double det_log(double x)
{
    int e;
    double m = frexp(x, &e);
    if (m < SQRT1_2) {
        m *= 2.0;
        e--;
    }
    double s = (m - 1.0) / (m + 1.0), s2 = s * s, sum = 0.0;
    for (int k = 15; k >= 0; k--)
        sum = sum * s2 + 1.0 / (double)(2 * k + 1);
    return 2.0 * s * sum + (double)e * LN2;
}

/* Taylor series for |x| <= pi/4 (11 terms: error below 1e-20). */
static double det_sin(double x)
{
    double x2 = x * x, term = x, sum = x;
    for (int k = 1; k <= 11; k++) {
        term = -term * x2 / (double)((2 * k) * (2 * k + 1));
        sum += term;
    }
    return sum;
}

static double det_cos(double x)
{
    double x2 = x * x, term = 1.0, sum = 1.0;
    for (int k = 1; k <= 11; k++) {
        term = -term * x2 / (double)((2 * k - 1) * (2 * k));
        sum += term;
    }
    return sum;
}

/* cos(2*pi*u) for u in [0, 1). The folds below are exact subtractions (Sterbenz), so the
 * argument handed to the series is as accurate as 2*pi*w itself. */
static double det_cos2pi(double u)
{
    double w = u > 0.5 ? 1.0 - u : u; /* cos is even and 1-periodic in u */
    double sign = 1.0;
    if (w > 0.25) {
        w = 0.5 - w; /* cos(pi - x) = -cos x */
        sign = -1.0;
    }
    if (w > 0.125)
        return sign * det_sin(TWO_PI * (0.25 - w)); /* cos x = sin(pi/2 - x) */
    return sign * det_cos(TWO_PI * w);
}

static float uniform_at(uint64_t key, uint64_t i, float a, float b)
{
    if (!(b > a))
        return a;
    double u = (double)(draw(key, i, 0) >> 11) * INV_2_53; /* [0, 1) */
    float v = (float)((double)a + ((double)b - (double)a) * u);
    /* Rounding to float can land on b itself; the interval is half-open. */
    if (v >= b)
        v = nextafterf(b, a);
    return v;
}

static float normal_at(uint64_t key, uint64_t i, float mean, float sd)
{
    double u1 = (double)((draw(key, i, 0) >> 11) + 1) * INV_2_53; /* (0, 1]: log is finite */
    double u2 = (double)(draw(key, i, 1) >> 11) * INV_2_53;       /* [0, 1) */
    double z = sqrt(-2.0 * det_log(u1)) * det_cos2pi(u2);
    return (float)((double)mean + (double)sd * z);
}

void cps__init_fill(const cps__param_spec *spec, uint64_t offset, float *out, size_t n)
{
    const uint64_t key = mix64(spec->init_seed ^ SEED_SALT);
    switch (spec->init_kind) {
    case CPS_W_INIT_CONSTANT:
        for (size_t j = 0; j < n; j++)
            out[j] = spec->init_a;
        break;
    case CPS_W_INIT_UNIFORM:
        for (size_t j = 0; j < n; j++)
            out[j] = uniform_at(key, offset + j, spec->init_a, spec->init_b);
        break;
    case CPS_W_INIT_NORMAL:
        for (size_t j = 0; j < n; j++)
            out[j] = normal_at(key, offset + j, spec->init_a, spec->init_b);
        break;
    default: /* zeros, and anything unknown: this function never fails */
        for (size_t j = 0; j < n; j++)
            out[j] = 0.0f;
        break;
    }
}

void cps_init_values(const cps_init *init, uint64_t offset, float *out, size_t n)
{
    cps__param_spec spec = {0};
    if (init) {
        switch (init->kind) {
        case CPS_INIT_CONSTANT:
            spec.init_kind = CPS_W_INIT_CONSTANT;
            break;
        case CPS_INIT_UNIFORM:
            spec.init_kind = CPS_W_INIT_UNIFORM;
            break;
        case CPS_INIT_NORMAL:
            spec.init_kind = CPS_W_INIT_NORMAL;
            break;
        default:
            spec.init_kind = CPS_W_INIT_ZEROS;
            break;
        }
        spec.init_a = init->a;
        spec.init_b = init->b;
        spec.init_seed = init->seed;
    }
    cps__init_fill(&spec, offset, out, n);
}
