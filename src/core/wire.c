/* Wire protocol encoders and decoders (layouts in wire.h).
 *
 * Decoders are the first code to touch bytes from the network, so they check every count and
 * length against the buffer in 64-bit arithmetic before forming a pointer, and they accept only
 * the canonical encoding (zero padding, zero reserved bytes): then decode(encode(x)) == x and
 * encode(decode(b)) == b, which the fuzz target checks. They never log; the caller knows which
 * peer sent the message and logs that.
 *
 * Parameter spec block (64 bytes, little-endian, offsets in bytes):
 *    0 u32 init_kind   4 f32 init_a   8 f32 init_b   12 u32 opt_kind   16 u64 init_seed
 *   24 u32 nesterov   28 f32 lr      32 f32 weight_decay   36 f32 momentum   40 f32 beta1
 *   44 f32 beta2      48 f32 eps     52 f32 rho     56..63 reserved, zero
 */
#include "core/wire.h"

#include <math.h>
#include <string.h>

#include "chainps/error.h"

/* Keys, lens and values are memcpy'd and handed out as pointers into the buffer: that is only
 * the little-endian wire format on a little-endian host. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "chainps assumes a little-endian host (the wire format is little-endian)"
#endif

_Static_assert(sizeof(float) == 4, "f32 on the wire is a C float");

/* Snappy emits at most 64 bytes per 3-byte copy tag, so a payload of n compressed bytes can
 * never decode to more than 22*n: a larger raw_len is a lie, refused before anyone allocates
 * raw_len bytes on its say-so. */
#define SNAPPY_MAX_RATIO 22u

static int type_known(uint8_t t)
{
    return (t >= CPS_MSG_HELLO && t <= CPS_MSG_STATUS_REPLY) ||
           (t >= CPS_MSG_DECLARE && t < CPS_MSG_TYPE_MAX_);
}

void cps__wire_hdr_encode(void *buf, const cps__msg_hdr *h)
{
    unsigned char *b = buf;
    cps__le32_put(b + 0, CPS_WIRE_MAGIC);
    b[4] = CPS_WIRE_VERSION;
    b[5] = h->type;
    b[6] = (unsigned char)h->flags;
    b[7] = (unsigned char)(h->flags >> 8);
    cps__le32_put(b + 8, h->sender);
    cps__le32_put(b + 12, (uint32_t)h->status);
    cps__le64_put(b + 16, h->epoch);
    cps__le32_put(b + 24, h->req_worker);
    cps__le32_put(b + 28, h->range);
    cps__le64_put(b + 32, h->req_seq);
    cps__le64_put(b + 40, h->step);
    cps__le32_put(b + 48, h->payload_len);
    cps__le32_put(b + 52, h->raw_len);
    cps__le64_put(b + 56, h->aux);
}

int cps__wire_hdr_decode(const void *buf, size_t len, cps__msg_hdr *out)
{
    const unsigned char *b = buf;
    cps__msg_hdr h;

    if (!buf || !out)
        return CPS_EINVAL;
    if (len < CPS_WIRE_HDR_SIZE)
        return CPS_ESIZE;
    if (cps__le32_get(b) != CPS_WIRE_MAGIC || b[4] != CPS_WIRE_VERSION)
        return CPS_EPROTO;
    h.version = b[4];
    h.type = b[5];
    h.flags = (uint16_t)(b[6] | b[7] << 8);
    if (!type_known(h.type) || (h.flags & ~CPS_WF_KNOWN_))
        return CPS_EPROTO;
    if ((h.flags & CPS_WF_LATE) &&
        (!(h.flags & CPS_WF_REPLY) || (h.type != CPS_MSG_ACK && h.type != CPS_MSG_VALUES)))
        return CPS_EPROTO;
    if ((h.flags & (CPS_WF_LOSSY | CPS_WF_FIRST)) && h.type != CPS_MSG_PUSH &&
        h.type != CPS_MSG_PUSH_PULL)
        return CPS_EPROTO;
    h.sender = cps__le32_get(b + 8);
    h.status = (int32_t)cps__le32_get(b + 12);
    /* Status codes are 0 or negative by construction; anything else is garbage. */
    if (h.status > 0)
        return CPS_EPROTO;
    h.epoch = cps__le64_get(b + 16);
    h.req_worker = cps__le32_get(b + 24);
    h.range = cps__le32_get(b + 28);
    h.req_seq = cps__le64_get(b + 32);
    h.step = cps__le64_get(b + 40);
    h.payload_len = cps__le32_get(b + 48);
    h.raw_len = cps__le32_get(b + 52);
    h.aux = cps__le64_get(b + 56);

    if ((uint64_t)len - CPS_WIRE_HDR_SIZE != h.payload_len || h.payload_len > CPS_WIRE_MAX_PAYLOAD)
        return CPS_ESIZE;
    if (h.flags & CPS_WF_SNAPPY) {
        if (h.raw_len == 0 || h.raw_len > CPS_WIRE_MAX_PAYLOAD ||
            (uint64_t)h.raw_len > (uint64_t)h.payload_len * SNAPPY_MAX_RATIO)
            return CPS_ESIZE;
    } else if (h.raw_len != h.payload_len) {
        return CPS_ESIZE;
    }
    *out = h;
    return 0;
}

/* ---- kv payload ---- */

/* Bytes of the kv payload before the values: counts, keys, lens, padding to 8. */
static uint64_t kv_prefix_size(uint64_t nkeys)
{
    return (8 + 12 * nkeys + 7) & ~(uint64_t)7;
}

size_t cps__wire_kv_size(uint32_t nkeys, uint64_t nvals)
{
    /* nvals travels as a u32: a larger count has no encoding, and SIZE_MAX makes any caller's
     * "too big" check or allocation fail instead of silently sizing a short buffer. */
    if (nvals > UINT32_MAX)
        return SIZE_MAX;
    return (size_t)(kv_prefix_size(nkeys) + 4 * nvals);
}

size_t cps__wire_kv_encode(void *buf, size_t cap, uint32_t nkeys, const uint64_t *keys,
                           const uint32_t *lens, const float *vals, uint64_t nvals)
{
    unsigned char *b = buf;
    size_t need = cps__wire_kv_size(nkeys, nvals);
    size_t pre = (size_t)kv_prefix_size(nkeys);

    if (need == SIZE_MAX || need > cap || !buf || (nkeys && (!keys || !lens)) || (nvals && !vals))
        return 0;
    cps__le32_put(b, nkeys);
    cps__le32_put(b + 4, (uint32_t)nvals);
    if (nkeys) {
        memcpy(b + 8, keys, (size_t)nkeys * 8);
        memcpy(b + 8 + (size_t)nkeys * 8, lens, (size_t)nkeys * 4);
    }
    memset(b + 8 + (size_t)nkeys * 12, 0, pre - (8 + (size_t)nkeys * 12));
    if (nvals)
        memcpy(b + pre, vals, (size_t)nvals * 4);
    return need;
}

/* A kv payload's keys part, shared by the plain and the lossy decoders: nkeys, the length
 * (`plain`: exactly the floats of nvals after the padding, checked first as it always was;
 * lossy: at least one byte of codec block), zero padding, keys sorted, lens, their sum. */
static int kv_decode_keys(const unsigned char *b, size_t len, int plain, cps__kv *out,
                          uint64_t *pre_out)
{
    if (len < 8 || len > CPS_WIRE_MAX_PAYLOAD)
        return CPS_ESIZE;
    uint32_t nkeys = cps__le32_get(b);
    uint32_t nvals = cps__le32_get(b + 4);
    if (nkeys == 0)
        return CPS_EPROTO;
    uint64_t pre = kv_prefix_size(nkeys);
    if (plain ? pre + 4 * (uint64_t)nvals != len : pre >= len)
        return CPS_ESIZE;
    for (uint64_t i = 8 + 12 * (uint64_t)nkeys; i < pre; i++)
        if (b[i])
            return CPS_EPROTO;

    const uint64_t *keys = (const uint64_t *)(b + 8);
    const uint32_t *lens = (const uint32_t *)(b + 8 + 8 * (size_t)nkeys);
    uint64_t sum = 0;
    for (uint32_t i = 0; i < nkeys; i++) {
        if (i > 0 && keys[i] <= keys[i - 1])
            return CPS_EPROTO;
        if (lens[i] == 0)
            return CPS_EPROTO;
        /* One key's values must fit in one message, or it could never be pushed or pulled. */
        if (lens[i] > CPS_WIRE_MAX_PAYLOAD / 4)
            return CPS_ESIZE;
        sum += lens[i]; /* < 2^32 keys * 2^28: no overflow */
    }
    if (nvals != 0 && sum != nvals)
        return CPS_ESIZE;

    out->nkeys = nkeys;
    out->nvals = nvals;
    out->keys = keys;
    out->lens = lens;
    out->vals = plain && nvals ? (const float *)(b + pre) : NULL;
    *pre_out = pre;
    return 0;
}

int cps__wire_kv_decode(const void *buf, size_t len, int need_vals, cps__kv *out)
{
    if (!buf || !out || ((uintptr_t)buf & 7) || need_vals < -1 || need_vals > 1)
        return CPS_EINVAL;
    cps__kv kv;
    uint64_t pre;
    int rc = kv_decode_keys(buf, len, 1, &kv, &pre);
    if (rc)
        return rc;
    if ((need_vals == 1 && kv.nvals == 0) || (need_vals == 0 && kv.nvals != 0))
        return CPS_EPROTO;
    *out = kv;
    return 0;
}

int cps__wire_kv_decode_lossy(const void *buf, size_t len, cps__kv *out, const void **block,
                              size_t *block_len)
{
    const unsigned char *b = buf;

    if (!buf || !out || !block || !block_len || ((uintptr_t)buf & 7))
        return CPS_EINVAL;
    cps__kv kv;
    uint64_t pre;
    int rc = kv_decode_keys(b, len, 0, &kv, &pre);
    if (rc)
        return rc;
    if (kv.nvals == 0)
        return CPS_EPROTO;
    *out = kv;
    *block = b + pre;
    *block_len = len - (size_t)pre;
    return 0;
}

/* ---- parameter spec ---- */

static void put_f32(unsigned char *p, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    cps__le32_put(p, u);
}

static float get_f32(const unsigned char *p)
{
    uint32_t u = cps__le32_get(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void cps__wire_spec_encode(void *buf, const cps__param_spec *s)
{
    unsigned char *b = buf;
    cps__le32_put(b + 0, s->init_kind);
    put_f32(b + 4, s->init_a);
    put_f32(b + 8, s->init_b);
    cps__le32_put(b + 12, s->opt_kind);
    cps__le64_put(b + 16, s->init_seed);
    cps__le32_put(b + 24, s->nesterov);
    put_f32(b + 28, s->lr);
    put_f32(b + 32, s->weight_decay);
    put_f32(b + 36, s->momentum);
    put_f32(b + 40, s->beta1);
    put_f32(b + 44, s->beta2);
    put_f32(b + 48, s->eps);
    put_f32(b + 52, s->rho);
    memset(b + 56, 0, 8);
}

static int in_open01(float x)
{
    return x > 0.0f && x < 1.0f;
}

/* A hyper-parameter the chosen optimizer does not use may be left 0 by the sender or filled
 * with its default; anything else means the two ends disagree about the spec, so refuse it. */
static int unused_ok(int used, int valid, float x)
{
    return used ? valid : (valid || x == 0.0f);
}

static int spec_valid(const cps__param_spec *s)
{
    const float f[] = {s->init_a, s->init_b, s->lr,  s->weight_decay, s->momentum,
                       s->beta1,  s->beta2,  s->eps, s->rho};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (!isfinite(f[i]))
            return 0;
    if (s->init_kind > CPS_W_INIT_NORMAL || s->opt_kind > CPS_W_OPT_RMSPROP)
        return 0;
    if (s->init_kind == CPS_W_INIT_UNIFORM && !(s->init_a < s->init_b))
        return 0;
    if (s->init_kind == CPS_W_INIT_NORMAL && !(s->init_b >= 0.0f))
        return 0;
    if (!(s->lr > 0.0f) || !(s->weight_decay >= 0.0f))
        return 0;

    int mom = s->opt_kind == CPS_W_OPT_MOMENTUM, adam = s->opt_kind == CPS_W_OPT_ADAM;
    int rms = s->opt_kind == CPS_W_OPT_RMSPROP;
    int uses_eps = adam || rms || s->opt_kind == CPS_W_OPT_ADAGRAD;
    if (s->nesterov > 1 || (s->nesterov && !mom))
        return 0;
    return unused_ok(mom, s->momentum >= 0.0f && s->momentum < 1.0f, s->momentum) &&
           unused_ok(adam, in_open01(s->beta1), s->beta1) &&
           unused_ok(adam, in_open01(s->beta2), s->beta2) &&
           unused_ok(uses_eps, s->eps > 0.0f, s->eps) && unused_ok(rms, in_open01(s->rho), s->rho);
}

int cps__wire_spec_decode(const void *buf, cps__param_spec *out)
{
    const unsigned char *b = buf;
    cps__param_spec s;

    if (!buf || !out)
        return CPS_EINVAL;
    if (cps__le64_get(b + 56) != 0)
        return CPS_EPROTO;
    s.init_kind = cps__le32_get(b + 0);
    s.init_a = get_f32(b + 4);
    s.init_b = get_f32(b + 8);
    s.opt_kind = cps__le32_get(b + 12);
    s.init_seed = cps__le64_get(b + 16);
    s.nesterov = cps__le32_get(b + 24);
    s.lr = get_f32(b + 28);
    s.weight_decay = get_f32(b + 32);
    s.momentum = get_f32(b + 36);
    s.beta1 = get_f32(b + 40);
    s.beta2 = get_f32(b + 44);
    s.eps = get_f32(b + 48);
    s.rho = get_f32(b + 52);
    if (!spec_valid(&s))
        return CPS_EPROTO;
    *out = s;
    return 0;
}

/* ---- DECLARE ---- */

size_t cps__wire_declare_size(uint32_t nkeys)
{
    return (size_t)(kv_prefix_size(nkeys) + 8 * (uint64_t)nkeys + CPS_WIRE_SPEC_SIZE);
}

size_t cps__wire_declare_encode(void *buf, size_t cap, uint32_t nkeys, const uint64_t *keys,
                                const uint32_t *lens, const uint64_t *offsets,
                                const cps__param_spec *spec)
{
    size_t need = cps__wire_declare_size(nkeys);
    if (need > cap || !buf || !spec || (nkeys && !offsets))
        return 0;
    size_t kvlen = cps__wire_kv_encode(buf, cap, nkeys, keys, lens, NULL, 0);
    if (kvlen == 0)
        return 0;
    unsigned char *b = (unsigned char *)buf + kvlen;
    if (nkeys)
        memcpy(b, offsets, (size_t)nkeys * 8);
    cps__wire_spec_encode(b + (size_t)nkeys * 8, spec);
    return need;
}

int cps__wire_declare_decode(const void *buf, size_t len, cps__kv *kv, const uint64_t **offsets,
                             cps__param_spec *spec)
{
    const unsigned char *b = buf;
    cps__kv k;
    cps__param_spec s;

    if (!buf || !kv || !offsets || !spec || ((uintptr_t)buf & 7))
        return CPS_EINVAL;
    if (len < 8 || len > CPS_WIRE_MAX_PAYLOAD)
        return CPS_ESIZE;
    uint32_t nkeys = cps__le32_get(b);
    if (nkeys == 0)
        return CPS_EPROTO;
    uint64_t kvlen = kv_prefix_size(nkeys);
    if (kvlen + 8 * (uint64_t)nkeys + CPS_WIRE_SPEC_SIZE != len)
        return CPS_ESIZE;
    int rc = cps__wire_kv_decode(buf, (size_t)kvlen, 0, &k);
    if (rc)
        return rc;
    const uint64_t *offs = (const uint64_t *)(b + kvlen);
    for (uint32_t i = 0; i < nkeys; i++)
        if (offs[i] > UINT64_MAX - k.lens[i]) /* offset+len is at most a u64 tensor length */
            return CPS_EPROTO;
    rc = cps__wire_spec_decode(b + kvlen + 8 * (uint64_t)nkeys, &s);
    if (rc)
        return rc;
    *kv = k;
    *offsets = offs;
    *spec = s;
    return 0;
}

/* ---- tensor description ---- */

#define DESC_FIXED (32 + CPS_WIRE_SPEC_SIZE + 8)

int cps__shape_matches(uint32_t ndim, const uint64_t *dims, uint64_t length)
{
    if (ndim < 1 || ndim > CPS_MAX_NDIM)
        return 0;
    uint64_t n = 1;
    for (uint32_t i = 0; i < ndim; i++) {
        if (dims[i] == 0 || n > UINT64_MAX / dims[i])
            return 0;
        n *= dims[i];
    }
    return n == length;
}

uint32_t cps__tensor_desc_shape(const cps__tensor_desc *d, uint64_t *dims)
{
    if (d->ndim) {
        memcpy(dims, d->dims, d->ndim * sizeof *dims);
        return d->ndim;
    }
    if (d->kind) {
        dims[0] = d->rows;
        dims[1] = d->cols;
        return 2;
    }
    dims[0] = d->length;
    return 1;
}

static size_t desc_size(size_t nlen, uint32_t ndim)
{
    return DESC_FIXED + ((nlen + 7) & ~(size_t)7) + 8 * (size_t)ndim;
}

size_t cps__wire_tensor_desc_size(const cps__tensor_desc *d)
{
    return desc_size(strlen(d->name), d->ndim <= CPS_MAX_NDIM ? d->ndim : 0);
}

size_t cps__wire_tensor_desc_encode(void *buf, size_t cap, const cps__tensor_desc *d)
{
    size_t n = cps__wire_tensor_desc_size(d), nlen = strlen(d->name);
    if (cap < n || nlen == 0 || nlen > CPS_TENSOR_NAME_MAX || d->ndim > CPS_MAX_NDIM)
        return 0;
    unsigned char *p = buf;
    memset(p, 0, n);
    cps__le32_put(p, d->kind);
    cps__le32_put(p + 4, d->cols);
    cps__le64_put(p + 8, d->length);
    cps__le64_put(p + 16, d->rows);
    cps__wire_spec_encode(p + 32, &d->spec);
    cps__le32_put(p + 32 + CPS_WIRE_SPEC_SIZE, (uint32_t)nlen);
    cps__le32_put(p + 36 + CPS_WIRE_SPEC_SIZE, d->ndim);
    memcpy(p + DESC_FIXED, d->name, nlen);
    unsigned char *dp = p + DESC_FIXED + ((nlen + 7) & ~(size_t)7);
    for (uint32_t i = 0; i < d->ndim; i++)
        cps__le64_put(dp + 8 * i, d->dims[i]);
    return n;
}

int cps__wire_tensor_desc_decode(const void *buf, size_t len, cps__tensor_desc *out, size_t *used)
{
    const unsigned char *p = buf;
    if (len < DESC_FIXED)
        return CPS_ESIZE;
    memset(out, 0, sizeof *out);
    out->kind = cps__le32_get(p);
    out->cols = cps__le32_get(p + 4);
    out->length = cps__le64_get(p + 8);
    out->rows = cps__le64_get(p + 16);
    uint32_t nlen = cps__le32_get(p + 32 + CPS_WIRE_SPEC_SIZE);
    out->ndim = cps__le32_get(p + 36 + CPS_WIRE_SPEC_SIZE);
    if (out->kind > CPS_DESC_LOCAL || out->length == 0 || cps__le64_get(p + 24) != 0 ||
        out->ndim > CPS_MAX_NDIM || nlen == 0 || nlen > CPS_TENSOR_NAME_MAX)
        return CPS_EPROTO;
    if (out->kind != 1 ? (out->rows != 0 || out->cols != 0)
                       : (out->cols == 0 || out->rows == 0 ||
                          out->length / out->rows != out->cols || out->length % out->rows != 0))
        return CPS_EPROTO;
    size_t pad_end = DESC_FIXED + ((nlen + 7) & ~(size_t)7), n = desc_size(nlen, out->ndim);
    if (len < n)
        return CPS_ESIZE;
    if (cps__wire_spec_decode(p + 32, &out->spec) != 0 || memchr(p + DESC_FIXED, 0, nlen))
        return CPS_EPROTO;
    for (size_t i = DESC_FIXED + nlen; i < pad_end; i++)
        if (p[i] != 0)
            return CPS_EPROTO; /* padding is zero: one encoding per description */
    for (uint32_t i = 0; i < out->ndim; i++)
        out->dims[i] = cps__le64_get(p + pad_end + 8 * i);
    if (out->ndim && (!cps__shape_matches(out->ndim, out->dims, out->length) ||
                      (out->kind == 1 &&
                       (out->ndim != 2 || out->dims[0] != out->rows || out->dims[1] != out->cols))))
        return CPS_EPROTO;
    memcpy(out->name, p + DESC_FIXED, nlen);
    *used = n;
    return 0;
}

/* ---- checkpoint notes ---- */

size_t cps__ckpt_note_size(const cps__ckpt_note *n)
{
    return CPS_CKPT_NOTE_FIXED + strnlen(n->path, sizeof n->path - 1);
}

size_t cps__ckpt_note_encode(void *buf, size_t cap, const cps__ckpt_note *n)
{
    size_t plen = strnlen(n->path, sizeof n->path - 1), size = CPS_CKPT_NOTE_FIXED + plen;
    if (cap < size)
        return 0;
    unsigned char *p = buf;
    cps__le64_put(p, n->id);
    cps__le64_put(p + 8, n->step);
    cps__le64_put(p + 16, n->unix_ms);
    cps__le64_put(p + 24, n->age_ms);
    cps__le32_put(p + 32, (uint32_t)plen);
    memcpy(p + CPS_CKPT_NOTE_FIXED, n->path, plen);
    return size;
}

int cps__ckpt_note_decode(const void *buf, size_t len, cps__ckpt_note *out, size_t *used)
{
    const unsigned char *p = buf;
    if (len < CPS_CKPT_NOTE_FIXED)
        return CPS_ESIZE;
    uint32_t plen = cps__le32_get(p + 32);
    if (plen == 0 || plen >= sizeof out->path)
        return CPS_EPROTO;
    if (len - CPS_CKPT_NOTE_FIXED < plen)
        return CPS_ESIZE;
    if (memchr(p + CPS_CKPT_NOTE_FIXED, 0, plen))
        return CPS_EPROTO;
    out->id = cps__le64_get(p);
    out->step = cps__le64_get(p + 8);
    out->unix_ms = cps__le64_get(p + 16);
    out->age_ms = cps__le64_get(p + 24);
    memcpy(out->path, p + CPS_CKPT_NOTE_FIXED, plen);
    out->path[plen] = '\0';
    if (used)
        *used = CPS_CKPT_NOTE_FIXED + plen;
    return 0;
}

/* ---- suspect lists ---- */

size_t cps__wire_suspects_size(uint32_t count)
{
    return 8 + 8 * (size_t)count;
}

size_t cps__wire_suspects_encode(void *buf, size_t cap, const cps__suspect_entry *e, uint32_t count)
{
    size_t size = cps__wire_suspects_size(count);
    if (count == 0 || count > CPS_SUSPECT_MAX || cap < size)
        return 0;
    unsigned char *p = buf;
    cps__le32_put(p, count);
    cps__le32_put(p + 4, 0);
    for (uint32_t i = 0; i < count; i++) {
        cps__le32_put(p + 8 + 8 * i, e[i].node);
        cps__le32_put(p + 12 + 8 * i, e[i].unanswered_ms);
    }
    return size;
}

int cps__wire_suspects_decode(const void *buf, size_t len, cps__suspect_entry *out, uint32_t *count)
{
    const unsigned char *p = buf;
    if (len < 8)
        return CPS_ESIZE;
    uint32_t n = cps__le32_get(p);
    if (n == 0 || n > CPS_SUSPECT_MAX || cps__le32_get(p + 4) != 0)
        return CPS_EPROTO;
    if (len != cps__wire_suspects_size(n))
        return CPS_ESIZE;
    for (uint32_t i = 0; i < n; i++) {
        out[i].node = cps__le32_get(p + 8 + 8 * i);
        out[i].unanswered_ms = cps__le32_get(p + 12 + 8 * i);
        if (out[i].unanswered_ms == 0 || (i > 0 && out[i].node <= out[i - 1].node))
            return CPS_EPROTO;
    }
    *count = n;
    return 0;
}
