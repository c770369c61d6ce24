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
#include <string.h>

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

/* The normal transform of LANES consecutive elements at once, branch-free: the same operations
 * in the same order as normal_at (so the same bits: -ffp-contract=off, no reassociation), laid
 * out so that the elements' long dependency chains (a division per series term) run side by
 * side, in vector lanes or at least out of order. One element at a time, 100 M normal values
 * took 5.7 s, most of it waiting on the chain of divisions; declaring them must take < 2 s. */
#define LANES 16

/* 1/(2k+1), as det_log divides it: a division of constants rounds the same wherever it runs. */
static const double inv_odd[16] = {1.0 / 1,  1.0 / 3,  1.0 / 5,  1.0 / 7,  1.0 / 9,  1.0 / 11,
                                   1.0 / 13, 1.0 / 15, 1.0 / 17, 1.0 / 19, 1.0 / 21, 1.0 / 23,
                                   1.0 / 25, 1.0 / 27, 1.0 / 29, 1.0 / 31};

/* Where the CPU has AVX-512 (DQ: 64-bit multiplies and u64 -> double conversions, so splitmix64
 * vectorizes too) the same lanes run 8 wide: 3.5x less CPU here than SSE2. IEEE operations give
 * the same bits in any lane width (no FMA: -ffp-contract=off), which the test of the fill checks
 * against a scalar reference. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define NORMAL_CLONES __attribute__((target_clones("arch=x86-64-v4", "default")))
#else
#define NORMAL_CLONES
#endif

NORMAL_CLONES
static void normal_lanes(uint64_t key, uint64_t first, float mean, float sd, float *out)
{
    double u1[LANES], u2[LANES], m[LANES], e[LANES], s[LANES], s2[LANES], sum[LANES];
    double x2[LANES], term[LANES], ser[LANES], sign[LANES], sn[LANES];
    for (int l = 0; l < LANES; l++) {
        u1[l] = (double)((draw(key, first + (uint64_t)l, 0) >> 11) + 1) * INV_2_53;
        u2[l] = (double)(draw(key, first + (uint64_t)l, 1) >> 11) * INV_2_53;
    }
    for (int l = 0; l < LANES; l++) {
        /* u1 in (0, 1] is a normal double: frexp is its exponent and mantissa bits. */
        uint64_t b;
        memcpy(&b, &u1[l], sizeof b);
        int64_t ex = (int64_t)((b >> 52) & 0x7ff) - 1022;
        b = (b & ((1ull << 52) - 1)) | (1022ull << 52);
        double mm;
        memcpy(&mm, &b, sizeof mm);
        double small = mm < SQRT1_2 ? 1.0 : 0.0;
        m[l] = mm + small * mm; /* mm * 2 when small, exactly */
        e[l] = (double)ex - small;
    }
    for (int l = 0; l < LANES; l++) {
        s[l] = (m[l] - 1.0) / (m[l] + 1.0);
        s2[l] = s[l] * s[l];
        sum[l] = 0.0;
    }
    for (int k = 15; k >= 0; k--)
        for (int l = 0; l < LANES; l++)
            sum[l] = sum[l] * s2[l] + inv_odd[k];
    for (int l = 0; l < LANES; l++) {
        double w = u2[l] > 0.5 ? 1.0 - u2[l] : u2[l];
        sign[l] = w > 0.25 ? -1.0 : 1.0;
        w = w > 0.25 ? 0.5 - w : w;
        sn[l] = w > 0.125 ? 1.0 : 0.0; /* sin(pi/2 - x) instead of cos x */
        double x = w > 0.125 ? TWO_PI * (0.25 - w) : TWO_PI * w;
        x2[l] = x * x;
        term[l] = w > 0.125 ? x : 1.0;
        ser[l] = term[l];
    }
    for (int k = 1; k <= 11; k++) {
        /* Small integers: dcos + sn * (dsin - dcos) is exactly one of the two. */
        double dsin = (double)((2 * k) * (2 * k + 1)), dcos = (double)((2 * k - 1) * (2 * k));
        for (int l = 0; l < LANES; l++) {
            term[l] = -term[l] * x2[l] / (dcos + sn[l] * (dsin - dcos));
            ser[l] += term[l];
        }
    }
    for (int l = 0; l < LANES; l++) {
        double lg = 2.0 * s[l] * sum[l] + e[l] * LN2;
        double z = sqrt(-2.0 * lg) * (sign[l] * ser[l]);
        out[l] = (float)((double)mean + (double)sd * z);
    }
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
    case CPS_W_INIT_NORMAL: {
        size_t j = 0;
        for (; j + LANES <= n; j += LANES)
            normal_lanes(key, offset + j, spec->init_a, spec->init_b, out + j);
        for (; j < n; j++)
            out[j] = normal_at(key, offset + j, spec->init_a, spec->init_b);
        break;
    }
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
