/* Checkpoint naming conventions, the optimizer description and the checksum. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "checkpoint/ckpt.h"
#include "checkpoint/json.h"
#include "core/crc32.h"
#include "core/log.h"

uint32_t cps__ckpt_crc32(uint32_t crc, const void *buf, size_t len)
{
    return cps__crc32(crc, buf, len);
}

const char *cps__ckpt_slot_name(uint32_t opt_kind, uint32_t slot)
{
    /* torch.optim's state keys, slot order as in src/optim/optim.c (Adam: m then v). */
    switch (opt_kind) {
    case CPS_W_OPT_MOMENTUM:
        return slot == 0 ? "momentum_buffer" : NULL;
    case CPS_W_OPT_ADAGRAD:
        return slot == 0 ? "sum" : NULL;
    case CPS_W_OPT_ADAM:
        return slot == 0 ? "exp_avg" : slot == 1 ? "exp_avg_sq" : NULL;
    case CPS_W_OPT_RMSPROP:
        return slot == 0 ? "square_avg" : NULL;
    default:
        return NULL;
    }
}

int cps__ckpt_optim_tensor_name(char *buf, size_t cap, uint32_t opt_kind, uint32_t slot,
                                const char *tensor)
{
    const char *s = cps__ckpt_slot_name(opt_kind, slot);
    if (!s || !buf || !tensor)
        return CPS_EINVAL;
    int n = snprintf(buf, cap, "%s%s/%s", CPS_CKPT_OPTIM_PREFIX, s, tensor);
    return n < 0 || (size_t)n >= cap ? CPS_EINVAL : 0;
}

static const char *const optim_names[] = {"sgd", "momentum", "adagrad", "adam", "rmsprop"};
static const char *const init_names[] = {"zeros", "constant", "uniform", "normal"};

const char *cps__ckpt_optim_kind_name(uint32_t opt_kind)
{
    return opt_kind < sizeof optim_names / sizeof optim_names[0] ? optim_names[opt_kind] : NULL;
}

/* Shortest decimal that reads back as the same float (lr 0.001, not 0.00100000005). */
static const char *fmt_float(char *out, size_t cap, float v)
{
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(out, cap, "%.*g", prec, (double)v);
        if (strtof(out, NULL) == v)
            break;
    }
    return out;
}

int cps__ckpt_spec_to_json(const cps__param_spec *s, char *buf, size_t cap)
{
    char f[9][32];
    if (!s || !buf)
        return CPS_EINVAL;
    const char *opt = cps__ckpt_optim_kind_name(s->opt_kind);
    const char *init = s->init_kind < 4 ? init_names[s->init_kind] : NULL;
    if (!opt || !init)
        return CPS_EINVAL;
    int n = snprintf(buf, cap,
                     "{\"optimizer\":\"%s\",\"lr\":%s,\"weight_decay\":%s,\"momentum\":%s,"
                     "\"nesterov\":%s,\"beta1\":%s,\"beta2\":%s,\"eps\":%s,\"rho\":%s,"
                     "\"init\":\"%s\",\"init_a\":%s,\"init_b\":%s,\"init_seed\":%llu}",
                     opt, fmt_float(f[0], 32, s->lr), fmt_float(f[1], 32, s->weight_decay),
                     fmt_float(f[2], 32, s->momentum), s->nesterov ? "true" : "false",
                     fmt_float(f[3], 32, s->beta1), fmt_float(f[4], 32, s->beta2),
                     fmt_float(f[5], 32, s->eps), fmt_float(f[6], 32, s->rho), init,
                     fmt_float(f[7], 32, s->init_a), fmt_float(f[8], 32, s->init_b),
                     (unsigned long long)s->init_seed);
    if (n < 0 || (size_t)n >= cap)
        return CPS_ESIZE;
    return n;
}

static int name_index(const char *const *names, size_t n, const char *s)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(names[i], s))
            return (int)i;
    return -1;
}

static int spec_bad(const char *what, const char *json)
{
    cps__log(CPS_LOG_ERROR, "ckpt", "optimizer description: %s in '%.200s'", what, json);
    return CPS_ECORRUPT;
}

int cps__ckpt_spec_from_json(const char *json, cps__param_spec *out)
{
    static const char *const floats[] = {"lr",  "weight_decay", "momentum", "beta1", "beta2",
                                         "eps", "rho",          "init_a",   "init_b"};
    if (!json || !out)
        return CPS_EINVAL;
    cps__json_doc *doc;
    const cps__json *root;
    char err[160];
    if (cps__json_parse(json, strlen(json), &doc, &root, err, sizeof err) != 0)
        return spec_bad(err, json);
    cps__param_spec s;
    memset(&s, 0, sizeof s);
    float *fdst[] = {&s.lr,  &s.weight_decay, &s.momentum, &s.beta1, &s.beta2,
                     &s.eps, &s.rho,          &s.init_a,   &s.init_b};
    int rc = 0;
    const cps__json *v;
    if (root->type != CPS_JSON_OBJECT || root->n != 13) {
        rc = spec_bad("not an object of 13 fields", json);
        goto out;
    }
    v = cps__json_get(root, "optimizer");
    int k = v && v->type == CPS_JSON_STRING ? name_index(optim_names, 5, v->str) : -1;
    v = cps__json_get(root, "init");
    int ik = v && v->type == CPS_JSON_STRING ? name_index(init_names, 4, v->str) : -1;
    if (k < 0 || ik < 0) {
        rc = spec_bad("unknown or missing optimizer/init", json);
        goto out;
    }
    s.opt_kind = (uint32_t)k;
    s.init_kind = (uint32_t)ik;
    for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++) {
        v = cps__json_get(root, floats[i]);
        if (!v || v->type != CPS_JSON_NUMBER) {
            rc = spec_bad("missing or non-numeric hyper-parameter", json);
            goto out;
        }
        *fdst[i] = (float)v->num;
    }
    v = cps__json_get(root, "nesterov");
    if (!v || (v->type != CPS_JSON_TRUE && v->type != CPS_JSON_FALSE)) {
        rc = spec_bad("nesterov is not a boolean", json);
        goto out;
    }
    s.nesterov = v->type == CPS_JSON_TRUE;
    v = cps__json_get(root, "init_seed");
    if (!v || v->type != CPS_JSON_NUMBER || !v->is_uint) {
        rc = spec_bad("init_seed is not an unsigned integer", json);
        goto out;
    }
    s.init_seed = v->u64;
    *out = s;
out:
    cps__json_free(doc);
    return rc;
}
