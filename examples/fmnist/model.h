/* Fashion-MNIST models on OpenBLAS: layers with forward and backward passes, the two networks
 * (an MLP and a widened LeNet-5-style CNN) built from them, their parameters as a list of named
 * tensors, and a local copy of the server-side optimizers for the single-process baseline.
 *
 * Layouts: dense layers work on row-major [batch, features]. Convolution, ReLU and pooling in the
 * CNN keep activations as [channel][batch][h][w] ("CBHW"): then one sgemm covers the whole batch
 * (output [cout, batch*h*w] is already CBHW) and no transpose is needed between conv layers. A
 * 1-channel image batch [batch][28*28] is the same bytes in both layouts.
 *
 * Not thread-safe: a model owns scratch buffers used by every pass.
 */
#ifndef FMNIST_MODEL_H
#define FMNIST_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "chainps/chainps.h"

#define FM_MAX_PARAMS 16
#define FM_MAX_LAYERS 16
#define FM_NAME_MAX   32

typedef enum fm_model_kind { FM_MODEL_MLP = 0, FM_MODEL_CNN = 1 } fm_model_kind;

/* One named tensor. value and grad are owned by the model; a training program fills value (from
 * cps_init_values or a pull) and reads grad after fm_model_forward_backward. */
typedef struct fm_param {
    char name[FM_NAME_MAX];
    size_t len;
    uint32_t ndim;    /* shape as torch lays it out: [out, in], [out, in, k, k] or [out] */
    uint64_t dims[4]; /* so a checkpoint loads into the same model in torch as it is */
    cps_init init;    /* how the servers initialise it: He normal, Glorot uniform or zeros */
    float *value;
    float *grad;
} fm_param;

typedef struct fm_model fm_model;

/* Build a model for batches of up to max_batch images. Parameter values start at zero; `seed`
 * only goes into each parameter's cps_init (each tensor gets its own derived seed, because
 * initial values depend only on (seed, index) and equal seeds would make tensors correlated).
 * Returns 0 or -1 (out of memory, bad arguments); *out is freed with fm_model_destroy. */
int fm_model_create(fm_model_kind kind, int max_batch, uint64_t seed, fm_model **out);
void fm_model_destroy(fm_model *m);

int fm_model_num_params(const fm_model *m);
/* Borrowed pointer, valid until fm_model_destroy. */
fm_param *fm_model_param(fm_model *m, int i);
/* Total number of float parameters. */
size_t fm_model_size(const fm_model *m);
int fm_model_max_batch(const fm_model *m);
const char *fm_model_kind_name(fm_model_kind kind);

/* Forward and backward on x ([batch][784], standardised pixels) with labels y: overwrites every
 * param->grad with the gradient of the mean cross-entropy (unless that loss is not finite) and
 * returns that loss. `correct` (optional) receives the number of argmax hits.
 * 1 <= batch <= max_batch. */
double fm_model_forward_backward(fm_model *m, const float *x, const uint8_t *y, int batch,
                                 int *correct);

/* Called during the backward pass as soon as parameter `param`'s gradient is final. Backward runs
 * from the last layer to the first, so the last layers' parameters come first (weight, then
 * bias). From the call on, the pass neither reads that parameter's value nor writes its grad:
 * the callee may send the gradient (and must leave grad unchanged until it is sent), update the
 * value, or let an asynchronous pull overwrite it, while the pass goes on with earlier layers. */
typedef void (*fm_grad_ready_fn)(void *ctx, int param);

/* fm_model_forward_backward, calling ready(ctx, i) once for every parameter i as its gradient
 * becomes final (see fm_grad_ready_fn). The gradients are the same bits as without callback. If
 * the loss is not finite, the backward pass is skipped: ready is never called and the gradients
 * keep their old contents. */
double fm_model_forward_backward_cb(fm_model *m, const float *x, const uint8_t *y, int batch,
                                    int *correct, fm_grad_ready_fn ready, void *ctx);

/* Forward only: mean loss, and the number of correct predictions in *correct (optional). */
double fm_model_evaluate(fm_model *m, const float *x, const uint8_t *y, int batch, int *correct);

/* A hash of which ReLUs were active and which max-pool inputs won in the last forward pass.
 * Between two points with the same signature the network is one smooth function of its
 * parameters, which is what a finite-difference check needs to be meaningful. */
uint64_t fm_model_kink_signature(const fm_model *m);

/* ---- Layers (exposed for the finite-difference tests). All buffers are the caller's. ---- */

/* y[b,o] = sum_i x[b,i] * w[o,i] + bias[o]; w is [out][in]. */
void fm_dense_forward(const float *x, const float *w, const float *bias, float *y, int batch,
                      int in, int out);
/* dw = dy^T x, dbias = column sums of dy, dx = dy w (dx may be NULL: first layer). */
void fm_dense_backward(const float *x, const float *w, const float *dy, float *dx, float *dw,
                       float *dbias, int batch, int in, int out);

void fm_relu_forward(const float *x, float *y, size_t n);
/* Uses the forward output y (y > 0 where the input was). dx may alias dy. */
void fm_relu_backward(const float *y, const float *dy, float *dx, size_t n);

/* Output height/width of a k x k stride-1 convolution with `pad` zeros on each side. */
static inline int fm_conv_out(int size, int k, int pad)
{
    return size + 2 * pad - k + 1;
}
/* CBHW x [c][batch][h][w] -> col [c*k*k][batch*oh*ow]; out-of-image taps are zero. */
void fm_im2col(const float *x, int c, int batch, int h, int w, int k, int pad, float *col);
/* The adjoint of fm_im2col: dx (overwritten) = sum of col entries that read each pixel. */
void fm_col2im(const float *col, int c, int batch, int h, int w, int k, int pad, float *dx);
/* y [cout][batch][oh][ow] = w [cout][cin*k*k] * im2col(x) + bias; col is scratch of
 * cin*k*k*batch*oh*ow floats and keeps im2col(x) for the backward pass. */
void fm_conv_forward(const float *x, const float *w, const float *bias, float *y, float *col,
                     int cin, int cout, int batch, int h, int wd, int k, int pad);
/* col: as left by fm_conv_forward; dcol: scratch of the same size (unused when dx is NULL). */
void fm_conv_backward(const float *col, const float *w, const float *dy, float *dcol, float *dx,
                      float *dw, float *dbias, int cin, int cout, int batch, int h, int wd, int k,
                      int pad);

/* 2x2 max pooling, stride 2, over `planes` contiguous h x w planes (h, w even). arg records the
 * winning input index of each output for the backward pass (first maximum on ties). */
void fm_maxpool2_forward(const float *x, float *y, int32_t *arg, int planes, int h, int w);
void fm_maxpool2_backward(const float *dy, const int32_t *arg, float *dx, int planes, int h, int w);

/* CBHW [c][batch][hw] <-> rows [batch][c*hw] (PyTorch's flatten order: channel, then pixel). */
void fm_cbhw_to_rows(const float *x, float *y, int c, int batch, int hw);
void fm_rows_to_cbhw(const float *x, float *y, int c, int batch, int hw);

/* Mean softmax cross-entropy of logits [batch][classes] against labels; dlogits (optional)
 * receives its gradient (softmax - onehot) / batch; correct (optional) the argmax hits. */
double fm_softmax_xent(const float *logits, const uint8_t *labels, int batch, int classes,
                       float *dlogits, int *correct);

/* ---- Optimizers: the server-side update rules of src/optim/optim.h, for --local. ---- */

/* f32 state values per parameter (SGD 0, momentum 1, AdaGrad 1, Adam 2, RMSProp 1). */
size_t fm_optim_state_slots(cps_optim_kind kind);
/* One update of n parameters; state is slot-major (slot s of element i at state[s*n + i]) and
 * starts zeroed; t is the 1-based update number (Adam's bias correction). Unset (0) Adam
 * betas/eps and RMSProp rho take the documented defaults, as on the servers. */
void fm_optim_apply(const cps_optim *o, float *param, float *state, const float *grad, size_t n,
                    uint64_t t);

/* XXH3-64 of a buffer seeded with h, chained: h = fm_hash64(0, ...) then feed further buffers
 * (each seeded with the hash so far, so the order of the buffers counts). */
uint64_t fm_hash64(uint64_t h, const void *data, size_t n);

/* A deterministic 64-bit mixer (splitmix64's finaliser): seeds for shuffles and tensors. */
uint64_t fm_mix64(uint64_t x);

#endif
