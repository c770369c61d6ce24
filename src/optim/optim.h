/* Server-side optimizers and parameter initialisers. Deterministic: the same inputs give the
 * same bits on every replica (no reductions whose order could vary, no FMA contraction). */
#ifndef CPS_OPTIM_H
#define CPS_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "core/wire.h"

/* How many f32 state values per parameter the optimizer keeps (SGD 0, momentum 1, AdaGrad 1,
 * Adam 2, RMSProp 1). */
uint32_t cps__optim_state_slots(uint32_t opt_kind);

/* Replace hyper-parameters left at 0 by their defaults, in place: Adam beta1 0.9, beta2 0.999,
 * eps 1e-8; AdaGrad eps 1e-10; RMSProp rho 0.9, eps 1e-8. Other fields are left alone. The one
 * place defaults are resolved: cps__optim_apply() calls it on a copy of its spec, the store
 * before persisting a spec, and a client should call it before encoding a DECLARE (the wire
 * decoder refuses zero betas/eps/rho). */
void cps__optim_spec_defaults(cps__param_spec *spec);

/* Apply one step: `grad` (n values) to `param` (n) with `state` (slots*n, slot-major: slot s of
 * element i at state[s*n + i]). `t` is the 1-based step number of this update (Adam's bias
 * correction). Weight decay adds weight_decay*param to the gradient (L2, as torch.optim does).
 * Update rules (g = grad + wd*param):
 *   SGD:       p -= lr*g
 *   momentum:  v = mu*v + g;  p -= lr*v            (nesterov: p -= lr*(g + mu*v))
 *   AdaGrad:   h += g*g;      p -= lr*g/(sqrt(h)+eps)
 *   Adam:      m = b1*m+(1-b1)g; v = b2*v+(1-b2)g*g; p -= lr*(m/(1-b1^t)) / (sqrt(v/(1-b2^t))+eps)
 *   RMSProp:   s = rho*s+(1-rho)g*g; p -= lr*g/(sqrt(s)+eps)
 * Hyper-parameters left at 0 take their defaults (cps__optim_spec_defaults).
 * Errors: CPS_EINVAL (unknown kind, t == 0 for Adam, NULL state for a stateful kind). */
int cps__optim_apply(const cps__param_spec *spec, float *param, float *state, const float *grad,
                     size_t n, uint64_t t);

/* The same step out of place: dst = src after the step, where src and dst each hold a record's
 * values, n params then the slots*n state values (slot-major, as above). SGD reads src and
 * writes dst in one pass; the stateful rules copy and update block by block while the block is
 * in cache. Either way the values cross memory once instead of being copied and then updated in
 * a second pass, and the result is bitwise that of copying src to dst and calling
 * cps__optim_apply. src and dst must not overlap. Errors: as cps__optim_apply. */
int cps__optim_apply_copy(const cps__param_spec *spec, const float *src, float *dst,
                          const float *grad, size_t n, uint64_t t);

/* Fill out[0..n) with the initial values of tensor elements offset..offset+n-1, from a
 * counter-based generator keyed by (seed, element index): so values do not depend on how the
 * tensor is cut into keys or on which server creates them. */
void cps__init_fill(const cps__param_spec *spec, uint64_t offset, float *out, size_t n);

/* acc[i] += x[i] (OpenBLAS saxpy). Summation order is the caller's: sum in rank order. */
void cps__vec_add(float *acc, const float *x, size_t n);
/* acc[i] *= a */
void cps__vec_scale(float *acc, float a, size_t n);

#endif
