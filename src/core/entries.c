/* Range entries: the format is in entries.h. */
#include "core/entries.h"

#include <string.h>

#include "chainps/error.h"

size_t cps__ent_param_size(uint32_t len, uint32_t slots)
{
    return 32 + CPS_WIRE_SPEC_SIZE + cps__pad8((1 + (size_t)slots) * len * sizeof(float));
}

size_t cps__ent_named_size(size_t name_len, size_t value_len)
{
    return 16 + cps__pad8(name_len) + cps__pad8(value_len);
}

size_t cps__ent_slice_size(uint64_t n)
{
    return 32 + cps__pad8((size_t)n * sizeof(float));
}

/* Padding must be zero, so that an entry has one encoding: replicas that compare bytes, and the
 * fuzzer that re-encodes what was accepted, see the same thing. */
static int zero_between(const unsigned char *p, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++)
        if (p[i] != 0)
            return 0;
    return 1;
}

int cps__ent_next(const void *buf, size_t avail, cps__ent *e)
{
    const unsigned char *p = buf;
    memset(e, 0, sizeof *e);
    if (avail < 16)
        return CPS_EPROTO;
    e->tag = cps__le32_get(p);
    switch (e->tag) {
    case CPS_ENT_PARAM:
        if (avail < 32 + CPS_WIRE_SPEC_SIZE)
            return CPS_EPROTO;
        e->len = cps__le32_get(p + 4);
        e->key = cps__le64_get(p + 8);
        e->opt_step = cps__le64_get(p + 16);
        e->slots = cps__le32_get(p + 24);
        /* Bounding slots and len by what is readable first keeps the size's product small. */
        if (e->len == 0 || e->slots > 16 || cps__le32_get(p + 28) != 0 ||
            e->len > (avail - 32 - CPS_WIRE_SPEC_SIZE) / sizeof(float) ||
            cps__wire_spec_decode(p + 32, &e->spec) != 0)
            return CPS_EPROTO;
        e->size = cps__ent_param_size(e->len, e->slots);
        e->vals = (const float *)(const void *)(p + 32 + CPS_WIRE_SPEC_SIZE);
        break;
    case CPS_ENT_DEDUP:
        e->worker = cps__le32_get(p + 4);
        e->seq = cps__le64_get(p + 8);
        e->size = CPS_ENT_DEDUP_SIZE;
        break;
    case CPS_ENT_NAMED:
        e->name_len = cps__le32_get(p + 4);
        e->value_len = cps__le32_get(p + 8);
        if (e->name_len == 0 || cps__le32_get(p + 12) != 0 || e->name_len > avail ||
            e->value_len > avail)
            return CPS_EPROTO;
        e->size = cps__ent_named_size(e->name_len, e->value_len);
        e->name = (const char *)p + 16;
        e->value = p + 16 + cps__pad8(e->name_len);
        break;
    case CPS_ENT_RANGE:
        if (avail < CPS_ENT_RANGE_SIZE || cps__le32_get(p + 4) != 0)
            return CPS_EPROTO;
        e->seq = cps__le64_get(p + 8);
        e->step = cps__le64_get(p + 16);
        e->size = CPS_ENT_RANGE_SIZE;
        break;
    case CPS_ENT_CREATE:
        if (avail < CPS_ENT_CREATE_SIZE)
            return CPS_EPROTO;
        e->len = cps__le32_get(p + 4);
        e->key = cps__le64_get(p + 8);
        e->opt_step = cps__le64_get(p + 16);
        if (e->len == 0 || cps__le64_get(p + 24) != 0 ||
            cps__wire_spec_decode(p + 32, &e->spec) != 0)
            return CPS_EPROTO;
        e->size = CPS_ENT_CREATE_SIZE;
        break;
    case CPS_ENT_SLICE:
        if (avail < 32)
            return CPS_EPROTO;
        e->slot = cps__le32_get(p + 4);
        e->key = cps__le64_get(p + 8);
        e->first = cps__le64_get(p + 16);
        e->n = cps__le64_get(p + 24);
        if (e->n > (avail - 32) / sizeof(float))
            return CPS_EPROTO;
        e->size = cps__ent_slice_size(e->n);
        e->vals = (const float *)(const void *)(p + 32);
        break;
    default:
        return CPS_EPROTO;
    }
    if (e->size > avail)
        return CPS_EPROTO;
    switch (e->tag) {
    case CPS_ENT_PARAM: {
        size_t data = 32 + CPS_WIRE_SPEC_SIZE + (1 + (size_t)e->slots) * e->len * sizeof(float);
        return zero_between(p, data, e->size) ? 0 : CPS_EPROTO;
    }
    case CPS_ENT_NAMED:
        return zero_between(p, 16 + e->name_len, 16 + cps__pad8(e->name_len)) &&
                       zero_between(p, 16 + cps__pad8(e->name_len) + e->value_len, e->size)
                   ? 0
                   : CPS_EPROTO;
    case CPS_ENT_SLICE:
        return zero_between(p, 32 + (size_t)e->n * sizeof(float), e->size) ? 0 : CPS_EPROTO;
    default:
        return 0;
    }
}

size_t cps__ent_put_param(void *buf, uint64_t key, uint32_t len, uint64_t opt_step,
                          const cps__param_spec *spec, uint32_t slots, const float *vals,
                          const float *state)
{
    unsigned char *p = buf;
    size_t size = cps__ent_param_size(len, slots);
    memset(p, 0, size);
    cps__le32_put(p, CPS_ENT_PARAM);
    cps__le32_put(p + 4, len);
    cps__le64_put(p + 8, key);
    cps__le64_put(p + 16, opt_step);
    cps__le32_put(p + 24, slots);
    cps__wire_spec_encode(p + 32, spec);
    memcpy(p + 32 + CPS_WIRE_SPEC_SIZE, vals, (size_t)len * sizeof(float));
    if (slots)
        memcpy(p + 32 + CPS_WIRE_SPEC_SIZE + (size_t)len * sizeof(float), state,
               (size_t)slots * len * sizeof(float));
    return size;
}

size_t cps__ent_put_dedup(void *buf, uint32_t worker, uint64_t seq)
{
    unsigned char *p = buf;
    cps__le32_put(p, CPS_ENT_DEDUP);
    cps__le32_put(p + 4, worker);
    cps__le64_put(p + 8, seq);
    return CPS_ENT_DEDUP_SIZE;
}

size_t cps__ent_put_named(void *buf, const char *name, size_t name_len, const void *value,
                          size_t value_len)
{
    unsigned char *p = buf;
    size_t size = cps__ent_named_size(name_len, value_len);
    memset(p, 0, size);
    cps__le32_put(p, CPS_ENT_NAMED);
    cps__le32_put(p + 4, (uint32_t)name_len);
    cps__le32_put(p + 8, (uint32_t)value_len);
    memcpy(p + 16, name, name_len);
    memcpy(p + 16 + cps__pad8(name_len), value, value_len);
    return size;
}

size_t cps__ent_put_range(void *buf, uint64_t seq, uint64_t step)
{
    unsigned char *p = buf;
    cps__le32_put(p, CPS_ENT_RANGE);
    cps__le32_put(p + 4, 0);
    cps__le64_put(p + 8, seq);
    cps__le64_put(p + 16, step);
    return CPS_ENT_RANGE_SIZE;
}

size_t cps__ent_put_create(void *buf, uint64_t key, uint32_t len, uint64_t opt_step,
                           const cps__param_spec *spec)
{
    unsigned char *p = buf;
    cps__le32_put(p, CPS_ENT_CREATE);
    cps__le32_put(p + 4, len);
    cps__le64_put(p + 8, key);
    cps__le64_put(p + 16, opt_step);
    cps__le64_put(p + 24, 0);
    cps__wire_spec_encode(p + 32, spec);
    return CPS_ENT_CREATE_SIZE;
}

size_t cps__ent_put_slice(void *buf, uint32_t slot, uint64_t key, uint64_t first, uint64_t n,
                          const float *vals)
{
    unsigned char *p = buf;
    size_t size = cps__ent_slice_size(n);
    cps__le32_put(p, CPS_ENT_SLICE);
    cps__le32_put(p + 4, slot);
    cps__le64_put(p + 8, key);
    cps__le64_put(p + 16, first);
    cps__le64_put(p + 24, n);
    memcpy(p + 32, vals, (size_t)n * sizeof(float));
    memset(p + 32 + (size_t)n * sizeof(float), 0, size - 32 - (size_t)n * sizeof(float));
    return size;
}
