/* The parameter record: its bytes in the "params" database, written and checked here only.
 *
 * Param record layout (little-endian header, then raw native f32 arrays):
 *    0 u16 record format version (REC_VERSION)   2 u8 optimizer kind   3 u8 init kind
 *    4 u32 len (number of values)                8 u64 optimizer steps applied (Adam's t)
 *   16 u64 init seed   24 f32 init_a   28 f32 init_b   32 f32 lr   36 f32 weight_decay
 *   40 f32 momentum    44 f32 beta1    48 f32 beta2    52 f32 eps  56 f32 rho
 *   60 u8 nesterov     61..63 zero
 *   64 f32 vals[len]   then f32 state[slots*len] (slot-major, as cps__optim_apply wants)
 * The wire's 64-byte spec block cannot be reused here: with the version, length and step it
 * would not fit the 64-byte header, so the record packs the same fields itself (and does not
 * depend on the wire module).
 * REC_HDR (store_int.h) is this header's size: params.c writes the values after it. */
#include <lmdb.h>
#include <string.h>

#include "chainps/error.h"
#include "core/log.h"
#include "optim/optim.h"
#include "store/store_int.h"

#define REC_VERSION 1

static void f32_put(unsigned char *p, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    cps__le32_put(p, u);
}

static float f32_get(const unsigned char *p)
{
    uint32_t u = cps__le32_get(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void cps__st_hdr_encode(unsigned char *h, uint32_t len, uint64_t step, const cps__param_spec *sp)
{
    memset(h, 0, REC_HDR);
    h[0] = (unsigned char)REC_VERSION;
    h[1] = (unsigned char)(REC_VERSION >> 8);
    h[2] = (unsigned char)sp->opt_kind;
    h[3] = (unsigned char)sp->init_kind;
    cps__le32_put(h + 4, len);
    cps__le64_put(h + 8, step);
    cps__le64_put(h + 16, sp->init_seed);
    f32_put(h + 24, sp->init_a);
    f32_put(h + 28, sp->init_b);
    f32_put(h + 32, sp->lr);
    f32_put(h + 36, sp->weight_decay);
    f32_put(h + 40, sp->momentum);
    f32_put(h + 44, sp->beta1);
    f32_put(h + 48, sp->beta2);
    f32_put(h + 52, sp->eps);
    f32_put(h + 56, sp->rho);
    h[60] = sp->nesterov ? 1 : 0;
}

int cps__st_kinds_valid(const cps__param_spec *sp)
{
    return sp->opt_kind <= CPS_W_OPT_RMSPROP && sp->init_kind <= CPS_W_INIT_NORMAL;
}

size_t cps__st_rec_size(uint32_t len, uint32_t opt_kind)
{
    return REC_HDR + ((size_t)1 + cps__optim_state_slots(opt_kind)) * len * sizeof(float);
}

/* Decode and check a stored record; `out` borrows from `d`. */
int cps__st_rec_decode(const MDB_val *d, uint64_t key, cps__param_rec *out)
{
    const unsigned char *h = d->mv_data;
    const char *why = NULL;
    if (d->mv_size < REC_HDR) {
        why = "shorter than its header";
    } else if ((unsigned)h[0] + ((unsigned)h[1] << 8) != REC_VERSION) {
        why = "unknown format version";
    } else {
        memset(out, 0, sizeof *out);
        out->spec.opt_kind = h[2];
        out->spec.init_kind = h[3];
        out->len = cps__le32_get(h + 4);
        out->opt_step = cps__le64_get(h + 8);
        out->spec.init_seed = cps__le64_get(h + 16);
        out->spec.init_a = f32_get(h + 24);
        out->spec.init_b = f32_get(h + 28);
        out->spec.lr = f32_get(h + 32);
        out->spec.weight_decay = f32_get(h + 36);
        out->spec.momentum = f32_get(h + 40);
        out->spec.beta1 = f32_get(h + 44);
        out->spec.beta2 = f32_get(h + 48);
        out->spec.eps = f32_get(h + 52);
        out->spec.rho = f32_get(h + 56);
        out->spec.nesterov = h[60];
        if (!cps__st_kinds_valid(&out->spec) || h[60] > 1)
            why = "unknown optimizer or init kind";
        else if (out->len == 0 || cps__st_rec_size(out->len, out->spec.opt_kind) != d->mv_size)
            why = "length does not match the value size";
    }
    if (why) {
        cps__log(CPS_LOG_ERROR, SUB, "corrupt param record, key %llu (%zu bytes): %s",
                 (unsigned long long)key, d->mv_size, why);
        return CPS_ECORRUPT;
    }
    out->vals = (const float *)(h + REC_HDR);
    out->state = cps__optim_state_slots(out->spec.opt_kind)
                     ? (const float *)(h + REC_HDR + (size_t)out->len * sizeof(float))
                     : NULL;
    return 0;
}

/* The canonical form of a spec, as stored and compared: defaults resolved, nesterov 0/1. */
cps__param_spec cps__st_spec_canon(const cps__param_spec *sp)
{
    cps__param_spec c = *sp;
    cps__optim_spec_defaults(&c);
    c.nesterov = c.nesterov ? 1 : 0;
    return c;
}

int cps__st_spec_equal(const cps__param_spec *a, const cps__param_spec *b)
{
    unsigned char ha[REC_HDR], hb[REC_HDR];
    cps__param_spec ca = cps__st_spec_canon(a), cb = cps__st_spec_canon(b);
    cps__st_hdr_encode(ha, 0, 0, &ca);
    cps__st_hdr_encode(hb, 0, 0, &cb);
    return memcmp(ha, hb, REC_HDR) == 0;
}
