/* The wire description of a declaration (cps__spec_make): the public initializer and optimizer
 * checked and their defaults filled in. Below the client and the API: the API's declarations,
 * the local tensors' registration (localset.c) and a restore's --optimizer (src/cli) all build
 * their spec here. */
#include <math.h>
#include <string.h>

#include "client.h"
#include "core/log.h"

cps_optim cps_optim_sgd(float lr)
{
    cps_optim o;
    memset(&o, 0, sizeof o);
    o.kind = CPS_OPTIM_SGD;
    o.lr = lr;
    return o;
}

/* Turn the public init/optimizer description into the wire spec, resolving defaults and
 * refusing nonsense with a log line that names the parameter. */
int cps__spec_make(const char *name, const cps_init *init, const cps_optim *optim,
                   cps__param_spec *spec)
{
    memset(spec, 0, sizeof *spec);
    if (init) {
        if ((unsigned)init->kind > CPS_INIT_NORMAL || !isfinite(init->a) || !isfinite(init->b) ||
            (init->kind == CPS_INIT_UNIFORM && !(init->a < init->b)) ||
            (init->kind == CPS_INIT_NORMAL && init->b < 0)) {
            cps__log(CPS_LOG_ERROR, "worker", "tensor %s: bad initializer (kind %d, a %g, b %g)",
                     name, (int)init->kind, init->a, init->b);
            return CPS_EINVAL;
        }
        spec->init_kind = (uint32_t)init->kind;
        spec->init_a = init->a;
        spec->init_b = init->b;
        spec->init_seed = init->seed;
    }
    cps_optim o = optim ? *optim : cps_optim_sgd(0.01f);
    const char *bad = NULL;
    if ((unsigned)o.kind > CPS_OPTIM_RMSPROP)
        bad = "optimizer kind";
    else if (!(o.lr > 0) || !isfinite(o.lr))
        bad = "learning rate (must be > 0)";
    else if (!(o.weight_decay >= 0) || !isfinite(o.weight_decay))
        bad = "weight decay (must be >= 0)";
    else if (!(o.momentum >= 0 && o.momentum < 1))
        bad = "momentum (must be in [0, 1))";
    else if (o.beta1 != 0 && !(o.beta1 > 0 && o.beta1 < 1))
        bad = "beta1 (must be in (0, 1))";
    else if (o.beta2 != 0 && !(o.beta2 > 0 && o.beta2 < 1))
        bad = "beta2 (must be in (0, 1))";
    else if (o.eps != 0 && !(o.eps > 0 && isfinite(o.eps)))
        bad = "eps (must be > 0)";
    else if (o.rho != 0 && !(o.rho > 0 && o.rho < 1))
        bad = "rho (must be in (0, 1))";
    if (bad) {
        cps__log(CPS_LOG_ERROR, "worker", "tensor %s: bad %s", name, bad);
        return CPS_EINVAL;
    }
    spec->opt_kind = (uint32_t)o.kind;
    spec->nesterov = (o.kind == CPS_OPTIM_MOMENTUM && o.nesterov) ? 1 : 0;
    spec->lr = o.lr;
    spec->weight_decay = o.weight_decay;
    spec->momentum = o.momentum;
    spec->beta1 = o.beta1 ? o.beta1 : 0.9f;
    spec->beta2 = o.beta2 ? o.beta2 : 0.999f;
    spec->eps = o.eps ? o.eps : (o.kind == CPS_OPTIM_ADAGRAD ? 1e-10f : 1e-8f);
    spec->rho = o.rho ? o.rho : 0.9f;
    return 0;
}
