/* Fashion-MNIST example: every layer's and both models' gradients against central finite
 * differences, the order and contract of the per-parameter gradient callback (what overlaps
 * push-pulls with backward), the local optimizers against their documented formulas, and the IDX
 * loader on good and malformed files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <unistd.h>

#include <cmocka.h>
#include <cblas.h>
#include <zlib.h>

#include "data.h"
#include "model.h"

/* ------------------------------------------------------------------ helpers */

static uint64_t rng_state = 12345;

static double urand(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

static void fill(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((urand() * 2.0 - 1.0) * scale);
}

/* Values in (-1,-0.1] U [0.1,1) with distinct magnitudes: no ReLU kink and no max-pool tie lies
 * within a finite-difference step of any input. */
static void fill_away_from_kinks(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float v = (float)(0.1 + 0.9 * urand()) + (float)i * 1e-4f;
        x[i] = urand() < 0.5 ? -v : v;
    }
}

static double dot(const float *a, const float *b, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)a[i] * (double)b[i];
    return s;
}

/* Compare an analytic gradient with a numerical one. The forward passes run in float, so the
 * tolerance is loose relative to double but tight enough to catch a wrong index or a missing
 * term (those give errors of order of the gradient itself). */
static void expect_close(double analytic, double numeric, const char *what, size_t i)
{
    double tol = 1e-3 + 1e-2 * (fabs(analytic) + fabs(numeric));
    if (fabs(analytic - numeric) > tol)
        fail_msg("%s[%zu]: analytic %.6g vs numeric %.6g", what, i, analytic, numeric);
}

/* L = sum(y * r) for a fixed random r, so dL/dy = r. */
typedef double (*objective_fn)(void *ctx);

static void check_fd(float *v, const float *grad, size_t n, objective_fn f, void *ctx, float h,
                     const char *what)
{
    for (size_t i = 0; i < n; i++) {
        float keep = v[i];
        v[i] = keep + h;
        double lp = f(ctx);
        v[i] = keep - h;
        double lm = f(ctx);
        v[i] = keep;
        expect_close(grad[i], (lp - lm) / (2.0 * (double)h), what, i);
    }
}

/* ------------------------------------------------------------------ dense */

typedef struct dense_ctx {
    int batch, in, out;
    float *x, *w, *b, *y, *r;
} dense_ctx;

static double dense_obj(void *p)
{
    dense_ctx *c = p;
    fm_dense_forward(c->x, c->w, c->b, c->y, c->batch, c->in, c->out);
    return dot(c->y, c->r, (size_t)c->batch * c->out);
}

static void dense_matches_finite_differences(void **state)
{
    (void)state;
    dense_ctx c = {.batch = 3, .in = 5, .out = 4};
    size_t nx = 15, nw = 20, ny = 12;
    float x[15], w[20], b[4], y[12], r[12], dx[15], dw[20], db[4];
    c.x = x, c.w = w, c.b = b, c.y = y, c.r = r;
    fill(x, nx, 1.0f), fill(w, nw, 1.0f), fill(b, 4, 1.0f), fill(r, ny, 1.0f);
    fm_dense_forward(x, w, b, y, c.batch, c.in, c.out);
    /* A hand-computed element guards the layout, not just self-consistency. */
    double y01 = b[1];
    for (int i = 0; i < 5; i++)
        y01 += (double)x[i] * w[5 + i];
    assert_float_equal(y[1], y01, 1e-5);
    fm_dense_backward(x, w, r, dx, dw, db, c.batch, c.in, c.out);
    check_fd(x, dx, nx, dense_obj, &c, 1e-2f, "dense dx");
    check_fd(w, dw, nw, dense_obj, &c, 1e-2f, "dense dw");
    check_fd(b, db, 4, dense_obj, &c, 1e-2f, "dense db");
}

/* ------------------------------------------------------------------ relu */

typedef struct relu_ctx {
    float *x, *y, *r;
    size_t n;
} relu_ctx;

static double relu_obj(void *p)
{
    relu_ctx *c = p;
    fm_relu_forward(c->x, c->y, c->n);
    return dot(c->y, c->r, c->n);
}

static void relu_matches_finite_differences(void **state)
{
    (void)state;
    float x[20], y[20], r[20], dx[20];
    relu_ctx c = {x, y, r, 20};
    fill_away_from_kinks(x, 20);
    fill(r, 20, 1.0f);
    fm_relu_forward(x, y, 20);
    for (int i = 0; i < 20; i++)
        assert_true(y[i] == (x[i] > 0 ? x[i] : 0.0f));
    fm_relu_backward(y, r, dx, 20);
    check_fd(x, dx, 20, relu_obj, &c, 1e-2f, "relu dx");
}

/* ------------------------------------------------------------------ conv */

typedef struct conv_ctx {
    int cin, cout, batch, h, w, k, pad;
    float *x, *wt, *b, *y, *col, *r;
    size_t ny;
} conv_ctx;

static double conv_obj(void *p)
{
    conv_ctx *c = p;
    fm_conv_forward(c->x, c->wt, c->b, c->y, c->col, c->cin, c->cout, c->batch, c->h, c->w, c->k,
                    c->pad);
    return dot(c->y, c->r, c->ny);
}

/* Direct convolution in double, the definition im2col + sgemm must agree with. */
static double conv_direct(const conv_ctx *c, int co, int b, int oy, int ox)
{
    double s = c->b[co];
    for (int ci = 0; ci < c->cin; ci++)
        for (int ky = 0; ky < c->k; ky++)
            for (int kx = 0; kx < c->k; kx++) {
                int iy = oy + ky - c->pad, ix = ox + kx - c->pad;
                if (iy < 0 || iy >= c->h || ix < 0 || ix >= c->w)
                    continue;
                double xv = c->x[((ci * c->batch + b) * c->h + iy) * c->w + ix];
                s += xv * c->wt[((co * c->cin + ci) * c->k + ky) * c->k + kx];
            }
    return s;
}

static void run_conv_case(int pad)
{
    conv_ctx c = {.cin = 2, .cout = 3, .batch = 2, .h = 6, .w = 5, .k = 3, .pad = pad};
    int oh = fm_conv_out(c.h, c.k, pad), ow = fm_conv_out(c.w, c.k, pad);
    size_t nx = (size_t)c.cin * c.batch * c.h * c.w, nw = (size_t)c.cout * c.cin * c.k * c.k;
    size_t ncol = (size_t)c.cin * c.k * c.k * c.batch * oh * ow;
    c.ny = (size_t)c.cout * c.batch * oh * ow;
    c.x = malloc(nx * sizeof(float)), c.wt = malloc(nw * sizeof(float));
    c.b = malloc(3 * sizeof(float)), c.y = malloc(c.ny * sizeof(float));
    c.r = malloc(c.ny * sizeof(float)), c.col = malloc(ncol * sizeof(float));
    float *dx = malloc(nx * sizeof(float)), *dw = malloc(nw * sizeof(float));
    float *dcol = malloc(ncol * sizeof(float)), db[3];
    fill(c.x, nx, 1.0f), fill(c.wt, nw, 1.0f), fill(c.b, 3, 1.0f), fill(c.r, c.ny, 1.0f);

    conv_obj(&c);
    for (int co = 0; co < c.cout; co++)
        for (int b = 0; b < c.batch; b++)
            for (int oy = 0; oy < oh; oy++)
                for (int ox = 0; ox < ow; ox++)
                    assert_float_equal(c.y[((co * c.batch + b) * oh + oy) * ow + ox],
                                       conv_direct(&c, co, b, oy, ox), 1e-4);
    fm_conv_backward(c.col, c.wt, c.r, dcol, dx, dw, db, c.cin, c.cout, c.batch, c.h, c.w, c.k,
                     pad);
    check_fd(c.x, dx, nx, conv_obj, &c, 1e-2f, "conv dx");
    check_fd(c.wt, dw, nw, conv_obj, &c, 1e-2f, "conv dw");
    check_fd(c.b, db, 3, conv_obj, &c, 1e-2f, "conv db");
    free(c.x), free(c.wt), free(c.b), free(c.y), free(c.r), free(c.col);
    free(dx), free(dw), free(dcol);
}

static void conv_matches_direct_and_finite_differences(void **state)
{
    (void)state;
    run_conv_case(0);
    run_conv_case(1);
    run_conv_case(2);
}

/* <col2im(a), x> == <a, im2col(x)>: col2im must be the exact adjoint. */
static void col2im_is_adjoint_of_im2col(void **state)
{
    (void)state;
    const int c = 2, b = 2, h = 5, w = 4, k = 3, pad = 1;
    size_t nx = (size_t)c * b * h * w;
    size_t ncol = (size_t)c * k * k * b * fm_conv_out(h, k, pad) * fm_conv_out(w, k, pad);
    float *x = malloc(nx * sizeof *x), *col = malloc(ncol * sizeof *col);
    float *a = malloc(ncol * sizeof *a), *ax = malloc(nx * sizeof *ax);
    fill(x, nx, 1.0f), fill(a, ncol, 1.0f);
    fm_im2col(x, c, b, h, w, k, pad, col);
    fm_col2im(a, c, b, h, w, k, pad, ax);
    assert_float_equal(dot(ax, x, nx), dot(a, col, ncol), 1e-4);
    free(x), free(col), free(a), free(ax);
}

/* ------------------------------------------------------------------ maxpool, flatten */

typedef struct pool_ctx {
    float *x, *y, *r;
    int32_t *arg;
    int planes, h, w;
} pool_ctx;

static double pool_obj(void *p)
{
    pool_ctx *c = p;
    fm_maxpool2_forward(c->x, c->y, c->arg, c->planes, c->h, c->w);
    return dot(c->y, c->r, (size_t)c->planes * (c->h / 2) * (c->w / 2));
}

static void maxpool_matches_finite_differences(void **state)
{
    (void)state;
    enum { P = 3, H = 4, W = 6, N = P * H * W, M = P * (H / 2) * (W / 2) };
    float x[N], y[M], r[M], dx[N];
    int32_t arg[M];
    pool_ctx c = {x, y, r, arg, P, H, W};
    fill_away_from_kinks(x, N);
    fill(r, M, 1.0f);
    pool_obj(&c);
    for (int p = 0; p < P; p++) {
        /* Output (1,1) pools input rows 2..3, columns 2..3. */
        float m = x[p * H * W + 2 * W + 2];
        m = fmaxf(m, x[p * H * W + 2 * W + 3]);
        m = fmaxf(m, x[p * H * W + 3 * W + 2]);
        m = fmaxf(m, x[p * H * W + 3 * W + 3]);
        assert_true(y[p * 6 + 1 * 3 + 1] == m);
    }
    fm_maxpool2_backward(r, arg, dx, P, H, W);
    check_fd(x, dx, N, pool_obj, &c, 1e-3f, "maxpool dx");
}

static void flatten_round_trips(void **state)
{
    (void)state;
    float x[24], rows[24], back[24];
    for (int i = 0; i < 24; i++)
        x[i] = (float)i;
    fm_cbhw_to_rows(x, rows, 3, 2, 4); /* c=3, batch=2, hw=4 */
    /* sample 1, channel 2, pixel 3 sits at x[(2*2+1)*4+3] and rows[(1*3+2)*4+3]. */
    assert_true(rows[(1 * 3 + 2) * 4 + 3] == x[(2 * 2 + 1) * 4 + 3]);
    fm_rows_to_cbhw(rows, back, 3, 2, 4);
    assert_memory_equal(x, back, sizeof x);
}

/* ------------------------------------------------------------------ softmax CE */

typedef struct xent_ctx {
    float *z;
    uint8_t *labels;
    int batch, classes;
} xent_ctx;

static double xent_obj(void *p)
{
    xent_ctx *c = p;
    return fm_softmax_xent(c->z, c->labels, c->batch, c->classes, NULL, NULL);
}

static void softmax_xent_matches_finite_differences(void **state)
{
    (void)state;
    float z[4 * 10], dz[4 * 10];
    uint8_t labels[4] = {3, 0, 9, 3};
    xent_ctx c = {z, labels, 4, 10};
    fill(z, 40, 3.0f);
    int correct = -1;
    double loss = fm_softmax_xent(z, labels, 4, 10, dz, &correct);
    assert_true(loss > 0.0);
    assert_in_range(correct, 0, 4);
    check_fd(z, dz, 40, xent_obj, &c, 1e-3f, "softmax-ce dz");
    /* Uniform logits: loss is log(classes) and stays finite for huge logits. */
    for (int i = 0; i < 40; i++)
        z[i] = 1e4f;
    assert_float_equal(fm_softmax_xent(z, labels, 4, 10, dz, NULL), log(10.0), 1e-6);
    z[3] = 2e4f;
    assert_true(isfinite(fm_softmax_xent(z, labels, 4, 10, dz, NULL)));
}

/* ------------------------------------------------------------------ whole models */

typedef struct model_ctx {
    fm_model *m;
    const float *x;
    const uint8_t *y;
    int batch;
} model_ctx;

static double model_obj(void *p)
{
    model_ctx *c = p;
    return fm_model_evaluate(c->m, c->x, c->y, c->batch, NULL);
}

/* Loss at the current parameters, and the kink signature of that forward pass. */
static double model_loss_sig(model_ctx *c, uint64_t *sig)
{
    double l = model_obj(c);
    *sig = fm_model_kink_signature(c->m);
    return l;
}

/* Random parameters at He-like scale; every gradient element of small tensors, a strided sample
 * of the big ones (the MLP's first layer alone has 200k weights).
 *
 * A step that carries a hidden unit across its ReLU kink or changes a max-pool winner makes the
 * difference quotient meaningless, and with hundreds of units that happens often. So a point is
 * compared only where +h, 0 and -h share one kink signature (the loss is then smooth between
 * them and the central difference is accurate to float noise); elsewhere smaller steps are tried,
 * and the few elements still next to a kink are skipped, at most one in eight. */
static void check_model(fm_model_kind kind, const char *const *names, int nnames)
{
    const int batch = 2; /* few samples: fewer units that a step can push across a kink */
    fm_model *m = NULL;
    assert_int_equal(fm_model_create(kind, batch, 7, &m), 0);
    assert_int_equal(fm_model_num_params(m), nnames);
    for (int i = 0; i < nnames; i++) {
        fm_param *p = fm_model_param(m, i);
        assert_string_equal(p->name, names[i]);
        size_t fan = p->len > 1000 ? 784 : 30;
        fill(p->value, p->len, (float)sqrt(3.0 / (double)fan));
    }
    float *x = malloc((size_t)batch * FM_PIXELS * sizeof *x);
    fill(x, (size_t)batch * FM_PIXELS, 1.0f);
    uint8_t y[2] = {1, 7};
    model_ctx c = {m, x, y, batch};
    double loss = fm_model_forward_backward(m, x, y, batch, NULL);
    uint64_t sig0;
    assert_true(isfinite(loss) && loss > 0.0);
    assert_float_equal(loss, model_loss_sig(&c, &sig0), 1e-6);

    int checked = 0, skipped = 0;
    for (int i = 0; i < fm_model_num_params(m); i++) {
        fm_param *p = fm_model_param(m, i);
        size_t stride = p->len > 400 ? p->len / 97 + 1 : 1;
        int checked_here = 0;
        for (size_t j = 0; j < p->len; j += stride) {
            static const float steps[] = {1e-2f, 2e-3f, 5e-4f, 1e-4f};
            int done = 0;
            for (size_t s = 0; s < 4 && !done; s++) {
                float keep = p->value[j], h = steps[s];
                uint64_t sp, sm;
                p->value[j] = keep + h;
                double lp = model_loss_sig(&c, &sp);
                p->value[j] = keep - h;
                double lm = model_loss_sig(&c, &sm);
                p->value[j] = keep;
                if (sp != sig0 || sm != sig0)
                    continue;
                double num = (lp - lm) / (2.0 * h);
                /* Float rounding of the two losses, amplified by 1/2h, plus a relative term. */
                double tol = 5e-7 / h + 1e-3 * (fabs(p->grad[j]) + fabs(num));
                if (fabs(p->grad[j] - num) > tol)
                    fail_msg("%s[%zu]: analytic %.6g vs numeric %.6g (h %g)", p->name, j,
                             p->grad[j], num, (double)h);
                done = 1;
            }
            checked += done, skipped += !done, checked_here += done;
        }
        if (checked_here == 0)
            fail_msg("%s: no element away from a kink", p->name);
    }
    if (skipped * 8 > checked + skipped)
        fail_msg("%d of %d elements skipped next to kinks", skipped, checked + skipped);
    free(x);
    fm_model_destroy(m);
}

static void mlp_matches_finite_differences(void **state)
{
    (void)state;
    static const char *const names[] = {"fc1.weight", "fc1.bias",   "fc2.weight",
                                        "fc2.bias",   "fc3.weight", "fc3.bias"};
    check_model(FM_MODEL_MLP, names, 6);
}

static void cnn_matches_finite_differences(void **state)
{
    (void)state;
    static const char *const names[] = {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
                                        "fc1.weight",   "fc1.bias",   "fc2.weight",   "fc2.bias",
                                        "fc3.weight",   "fc3.bias"};
    check_model(FM_MODEL_CNN, names, 10);
}

static void models_have_expected_sizes_and_inits(void **state)
{
    (void)state;
    fm_model *m = NULL, *m2 = NULL;
    assert_int_equal(fm_model_create(FM_MODEL_MLP, 8, 1, &m), 0);
    assert_int_equal(fm_model_size(m), 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
    fm_param *w1 = fm_model_param(m, 0), *b1 = fm_model_param(m, 1), *w3 = fm_model_param(m, 4);
    assert_int_equal(w1->init.kind, CPS_INIT_NORMAL);
    assert_float_equal(w1->init.b, sqrtf(2.0f / 784.0f), 1e-7);
    assert_int_equal(b1->init.kind, CPS_INIT_ZEROS);
    assert_int_equal(w3->init.kind, CPS_INIT_UNIFORM);
    assert_true(w1->init.seed != w3->init.seed);
    assert_null(fm_model_param(m, 6));
    assert_int_equal(fm_model_create(FM_MODEL_CNN, 8, 1, &m2), 0);
    assert_int_equal(fm_model_size(m2),
                     12 * 25 + 12 + 32 * 300 + 32 + 800 * 120 + 120 + 120 * 84 + 84 + 84 * 10 + 10);
    fm_model_destroy(m);
    fm_model_destroy(m2);
    assert_int_not_equal(fm_model_create(FM_MODEL_MLP, 0, 1, &m), 0);
}

/* ------------------------------------------------------------------ gradient callbacks */

/* What fm_model_forward_backward_cb's callback saw: the order of the calls, each parameter's
 * gradient at its call, and (to prove the pass no longer reads a parameter once it is called)
 * NaN written over the parameter's value there. */
typedef struct ready_log {
    fm_model *m;
    int order[FM_MAX_PARAMS];
    int n;
    float *grad_at_call[FM_MAX_PARAMS];
} ready_log;

static void log_ready(void *ctx, int i)
{
    ready_log *log = ctx;
    fm_param *p = fm_model_param(log->m, i);
    assert_true(log->n < FM_MAX_PARAMS);
    log->order[log->n++] = i;
    log->grad_at_call[i] = malloc(p->len * sizeof(float));
    assert_non_null(log->grad_at_call[i]);
    memcpy(log->grad_at_call[i], p->grad, p->len * sizeof(float));
    for (size_t j = 0; j < p->len; j++)
        p->value[j] = NAN;
}

/* Each parameter is handed over once, last layer first, with its final gradient: the same bits
 * as a pass without callback, although every value handed over was overwritten meanwhile. */
static void check_ready_order(fm_model_kind kind, const int *want, int nwant)
{
    const int batch = 4;
    fm_model *a = NULL, *b = NULL;
    assert_int_equal(fm_model_create(kind, batch, 3, &a), 0);
    assert_int_equal(fm_model_create(kind, batch, 3, &b), 0);
    assert_int_equal(fm_model_num_params(a), nwant);
    for (int i = 0; i < nwant; i++) {
        fm_param *pa = fm_model_param(a, i), *pb = fm_model_param(b, i);
        fill(pa->value, pa->len, 0.05f);
        memcpy(pb->value, pa->value, pa->len * sizeof(float));
    }
    float *x = malloc((size_t)batch * FM_PIXELS * sizeof *x);
    assert_non_null(x);
    fill(x, (size_t)batch * FM_PIXELS, 1.0f);
    const uint8_t y[4] = {0, 3, 9, 3};
    double la = fm_model_forward_backward(a, x, y, batch, NULL);
    ready_log log = {.m = b};
    double lb = fm_model_forward_backward_cb(b, x, y, batch, NULL, log_ready, &log);
    assert_true(isfinite(la));
    assert_memory_equal(&la, &lb, sizeof la);
    assert_int_equal(log.n, nwant);
    for (int k = 0; k < nwant; k++) {
        int i = log.order[k];
        fm_param *pa = fm_model_param(a, i), *pb = fm_model_param(b, i);
        if (i != want[k])
            fail_msg("call %d handed over %s, expected %s", k, pb->name,
                     fm_model_param(b, want[k])->name);
        assert_memory_equal(log.grad_at_call[i], pa->grad, pa->len * sizeof(float));
        assert_memory_equal(pb->grad, pa->grad, pa->len * sizeof(float));
        free(log.grad_at_call[i]);
    }
    /* A diverged loss hands nothing over. */
    ready_log none = {.m = b};
    double ln = fm_model_forward_backward_cb(b, x, y, batch, NULL, log_ready, &none);
    assert_false(isfinite(ln)); /* every value is NaN now */
    assert_int_equal(none.n, 0);
    free(x);
    fm_model_destroy(a);
    fm_model_destroy(b);
}

static void grads_are_handed_over_last_layer_first(void **state)
{
    (void)state;
    /* MLP: fc1.weight fc1.bias fc2.weight fc2.bias fc3.weight fc3.bias. */
    static const int mlp[] = {4, 5, 2, 3, 0, 1};
    check_ready_order(FM_MODEL_MLP, mlp, 6);
    /* CNN: conv1, conv2, fc1, fc2, fc3 (weight, bias each). */
    static const int cnn[] = {8, 9, 6, 7, 4, 5, 2, 3, 0, 1};
    check_ready_order(FM_MODEL_CNN, cnn, 10);
}

/* ------------------------------------------------------------------ optimizers */

static void optimizers_follow_the_documented_formulas(void **state)
{
    (void)state;
    float p[2], st[4], g[2] = {0.5f, -2.0f};
    /* SGD with weight decay: p -= lr*(g + wd*p). */
    cps_optim o = {.kind = CPS_OPTIM_SGD, .lr = 0.1f, .weight_decay = 0.01f};
    p[0] = 1.0f, p[1] = -1.0f;
    fm_optim_apply(&o, p, NULL, g, 2, 1);
    assert_float_equal(p[0], 1.0f - 0.1f * (0.5f + 0.01f), 1e-7);
    /* Momentum: two steps, v = mu v + g. */
    o = (cps_optim){.kind = CPS_OPTIM_MOMENTUM, .lr = 0.1f, .momentum = 0.9f};
    p[0] = 1.0f, p[1] = -1.0f;
    memset(st, 0, sizeof st);
    fm_optim_apply(&o, p, st, g, 2, 1);
    fm_optim_apply(&o, p, st, g, 2, 2);
    assert_float_equal(st[0], 0.5f * 1.9f, 1e-6);
    assert_float_equal(p[0], 1.0f - 0.1f * 0.5f - 0.1f * 0.95f, 1e-6);
    /* Adam, defaults: the first step moves every parameter by ~lr*sign(g). */
    o = (cps_optim){.kind = CPS_OPTIM_ADAM, .lr = 0.01f};
    p[0] = 1.0f, p[1] = -1.0f;
    memset(st, 0, sizeof st);
    assert_int_equal(fm_optim_state_slots(CPS_OPTIM_ADAM), 2);
    fm_optim_apply(&o, p, st, g, 2, 1);
    assert_float_equal(p[0], 0.99f, 1e-6);
    assert_float_equal(p[1], -0.99f, 1e-6);
    assert_float_equal(st[2], 0.001f * 0.25f, 1e-7); /* v of element 0 sits in slot 1 */
    assert_int_equal(fm_optim_state_slots(CPS_OPTIM_SGD), 0);
}

static void hash64_is_xxh3(void **state)
{
    (void)state;
    /* XXH3-64 of "" and "a" with seed 0, as the xxhsum tool prints them. */
    assert_true(fm_hash64(0, "", 0) == 0x2d06800538d394c2ull);
    assert_true(fm_hash64(0, "a", 1) == 0xe6c632b61e964e1full);
    /* Chaining depends on the order of the buffers. */
    assert_true(fm_hash64(fm_hash64(0, "foo", 3), "bar", 3) !=
                fm_hash64(fm_hash64(0, "bar", 3), "foo", 3));
}

/* ------------------------------------------------------------------ IDX files */

static char tmpdir[4096];

static int make_tmpdir(void **state)
{
    (void)state;
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/fmnist-idx-XXXXXX", base && *base ? base : "/tmp");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int remove_tmpdir(void **state)
{
    (void)state;
    static const char *const names[] = {"good-img.gz", "good-lab.gz", "magic.gz", "trunc.gz",
                                        "dims.gz",     "count.gz",    "trail.gz", "badlab.gz",
                                        "raw.idx",     "corrupt.gz",  "hdr.gz"};
    char p[4200];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", tmpdir, names[i]);
        unlink(p);
    }
    return rmdir(tmpdir);
}

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8), p[3] = (unsigned char)v;
}

/* Write an IDX file (gzip) with the given header words and `ndata` payload bytes (value i%251). */
static const char *write_idx(const char *name, const uint32_t *hdr, int nhdr, size_t ndata)
{
    static char path[4200];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    gzFile f = gzopen(path, "wb");
    assert_non_null(f);
    for (int i = 0; i < nhdr; i++) {
        unsigned char b[4];
        put_be32(b, hdr[i]);
        assert_int_equal(gzwrite(f, b, 4), 4);
    }
    for (size_t i = 0; i < ndata; i++) {
        unsigned char v = (unsigned char)(i % 251);
        if (hdr[0] == FM_IDX_MAGIC_LABELS)
            v = (unsigned char)(i % 10);
        assert_int_equal(gzwrite(f, &v, 1), 1);
    }
    assert_int_equal(gzclose(f), Z_OK);
    return path;
}

static void expect_error(int rc, int want, const char *err, const char *needle, const char *file)
{
    if (rc != want)
        fail_msg("got %d, want %d (%s)", rc, want, err);
    if (!strstr(err, needle))
        fail_msg("message '%s' lacks '%s'", err, needle);
    if (!strstr(err, file))
        fail_msg("message '%s' does not name %s", err, file);
}

static void idx_good_files_load(void **state)
{
    (void)state;
    char err[8192] = "";
    uint32_t ih[] = {FM_IDX_MAGIC_IMAGES, 3, 28, 28}, lh[] = {FM_IDX_MAGIC_LABELS, 3};
    char ip[4200], lp[4200];
    snprintf(ip, sizeof ip, "%s", write_idx("good-img.gz", ih, 4, 3 * 784));
    snprintf(lp, sizeof lp, "%s", write_idx("good-lab.gz", lh, 2, 3));
    uint8_t *pix = NULL;
    size_t n = 0;
    assert_int_equal(fm_idx_read_images(ip, &pix, &n, err, sizeof err), FM_DATA_OK);
    assert_int_equal(n, 3);
    assert_int_equal(pix[1000], 1000 % 251);
    free(pix);
    fm_dataset ds;
    assert_int_equal(fm_dataset_load(&ds, ip, lp, err, sizeof err), FM_DATA_OK);
    assert_int_equal(ds.n, 3);
    assert_int_equal(ds.labels[2], 2);
    assert_int_equal(ds.pixels[784 + 5], (784 + 5) % 251);
    /* Standardised with the training set's mean and deviation: 0 -> -mean/std. */
    float fx[2];
    fm_pixels_to_float((const uint8_t *)"\x00\xff", 2, fx);
    assert_float_equal(fx[0], -0.2860f / 0.3530f, 1e-5);
    assert_float_equal(fx[1], (1.0f - 0.2860f) / 0.3530f, 1e-5);
    fm_dataset_fini(&ds);
    assert_null(ds.pixels);

    /* An uncompressed IDX file is read too (gzopen passes plain files through). */
    char rp[4200];
    snprintf(rp, sizeof rp, "%s/raw.idx", tmpdir);
    FILE *f = fopen(rp, "wb");
    unsigned char raw[8 + 4];
    put_be32(raw, FM_IDX_MAGIC_LABELS), put_be32(raw + 4, 4);
    memcpy(raw + 8, "\x01\x02\x03\x09", 4);
    assert_int_equal(fwrite(raw, 1, sizeof raw, f), sizeof raw);
    fclose(f);
    uint8_t *lab = NULL;
    assert_int_equal(fm_idx_read_labels(rp, &lab, &n, err, sizeof err), FM_DATA_OK);
    assert_int_equal(n, 4);
    assert_int_equal(lab[3], 9);
    free(lab);
}

static void idx_malformed_files_are_refused(void **state)
{
    (void)state;
    char err[8192];
    uint8_t *buf = (uint8_t *)"x";
    size_t n = 99;
    const char *p;

    p = "/nonexistent-dir/train-images-idx3-ubyte.gz";
    expect_error(fm_idx_read_images(p, &buf, &n, err, sizeof err), FM_DATA_EOPEN, err,
                 "No such file", p);
    assert_null(buf);
    assert_int_equal(n, 0);

    uint32_t magic[] = {FM_IDX_MAGIC_LABELS, 2, 28, 28};
    p = write_idx("magic.gz", magic, 4, 2 * 784);
    expect_error(fm_idx_read_images(p, &buf, &n, err, sizeof err), FM_DATA_EMAGIC, err,
                 "bad magic 0x00000801", p);

    uint32_t trunc[] = {FM_IDX_MAGIC_IMAGES, 2, 28, 28};
    p = write_idx("trunc.gz", trunc, 4, 784 + 100);
    expect_error(fm_idx_read_images(p, &buf, &n, err, sizeof err), FM_DATA_ETRUNC, err, "truncated",
                 p);

    uint32_t hdr[] = {FM_IDX_MAGIC_IMAGES, 2};
    p = write_idx("hdr.gz", hdr, 2, 0);
    expect_error(fm_idx_read_images(p, &buf, &n, err, sizeof err), FM_DATA_ETRUNC, err, "header",
                 p);

    uint32_t dims[] = {FM_IDX_MAGIC_IMAGES, 2, 32, 32};
    p = write_idx("dims.gz", dims, 4, 2 * 1024);
    expect_error(fm_idx_read_images(p, &buf, &n, err, sizeof err), FM_DATA_EDIMS, err, "32x32", p);

    uint32_t trail[] = {FM_IDX_MAGIC_LABELS, 5};
    p = write_idx("trail.gz", trail, 2, 6);
    expect_error(fm_idx_read_labels(p, &buf, &n, err, sizeof err), FM_DATA_ETRAILING, err, "longer",
                 p);

    char bp[4200];
    snprintf(bp, sizeof bp, "%s/badlab.gz", tmpdir);
    gzFile f = gzopen(bp, "wb");
    unsigned char lb[8 + 2];
    put_be32(lb, FM_IDX_MAGIC_LABELS), put_be32(lb + 4, 2);
    lb[8] = 3, lb[9] = 12;
    gzwrite(f, lb, sizeof lb);
    gzclose(f);
    expect_error(fm_idx_read_labels(bp, &buf, &n, err, sizeof err), FM_DATA_ELABEL, err, "label 12",
                 bp);
    assert_null(buf);

    /* Images and labels disagree on the count: the message names both files. */
    uint32_t ih[] = {FM_IDX_MAGIC_IMAGES, 3, 28, 28}, lh[] = {FM_IDX_MAGIC_LABELS, 2};
    char ip[4200];
    snprintf(ip, sizeof ip, "%s", write_idx("good-img.gz", ih, 4, 3 * 784));
    p = write_idx("count.gz", lh, 2, 2);
    fm_dataset ds;
    expect_error(fm_dataset_load(&ds, ip, p, err, sizeof err), FM_DATA_ECOUNT, err, "2 labels", ip);
    assert_null(ds.pixels);

    /* A gzip file cut in the middle of its compressed stream. */
    char cp[4200];
    snprintf(cp, sizeof cp, "%s/corrupt.gz", tmpdir);
    FILE *src = fopen(ip, "rb");
    unsigned char gz[8192];
    size_t len = fread(gz, 1, sizeof gz, src);
    fclose(src);
    FILE *dst = fopen(cp, "wb");
    fwrite(gz, 1, len / 2, dst);
    fclose(dst);
    int rc = fm_idx_read_images(cp, &buf, &n, err, sizeof err);
    if (rc != FM_DATA_ETRUNC && rc != FM_DATA_ECORRUPT)
        fail_msg("cut gzip: got %d (%s)", rc, err);
    assert_non_null(strstr(err, cp));
}

int main(void)
{
    openblas_set_num_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dense_matches_finite_differences),
        cmocka_unit_test(relu_matches_finite_differences),
        cmocka_unit_test(conv_matches_direct_and_finite_differences),
        cmocka_unit_test(col2im_is_adjoint_of_im2col),
        cmocka_unit_test(maxpool_matches_finite_differences),
        cmocka_unit_test(flatten_round_trips),
        cmocka_unit_test(softmax_xent_matches_finite_differences),
        cmocka_unit_test(mlp_matches_finite_differences),
        cmocka_unit_test(cnn_matches_finite_differences),
        cmocka_unit_test(models_have_expected_sizes_and_inits),
        cmocka_unit_test(grads_are_handed_over_last_layer_first),
        cmocka_unit_test(optimizers_follow_the_documented_formulas),
        cmocka_unit_test(hash64_is_xxh3),
        cmocka_unit_test_setup_teardown(idx_good_files_load, make_tmpdir, remove_tmpdir),
        cmocka_unit_test_setup_teardown(idx_malformed_files_are_refused, make_tmpdir,
                                        remove_tmpdir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
