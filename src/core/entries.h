/* Range entries: the one encoding of a key range's contents as it travels, in SNAP messages
 * (state transfer to a joiner, src/server/transfer.c) and in PUT messages (a checkpoint restore's
 * records, src/checkpoint/cluster_restore.c), read back by src/server/entries.c. Every writer and
 * reader of the format goes through this file, so the layout is written down once.
 *
 * A payload is a sequence of 8-byte-aligned entries, little-endian:
 *   1 param:  u32 1, u32 len, u64 key, u64 opt_step, u32 slots, u32 0, spec[64],
 *             f32 values[len], f32 state[slots*len], zero padding to 8
 *   2 dedup:  u32 2, u32 worker, u64 seq   (worker | CPS_DEDUP_CLOCK_BIT: its SSP clock)
 *   3 named:  u32 3, u32 name_len, u32 value_len, u32 0, name, pad to 8, value, pad to 8
 *   4 range:  u32 4, u32 0, u64 seq, u64 step            (a SNAP's last chunk only)
 * and, in checkpoint restores only (PUT), whole records sent in slices:
 *   5 create: u32 5, u32 len, u64 key, u64 opt_step, u64 0, spec[64]   (zero values and state)
 *   6 slice:  u32 6, u32 slot, u64 key, u64 first, u64 n, f32 values[n], zero padding to 8
 *             (slot 0: parameters, 1..k: optimizer state slot k-1) */
#ifndef CPS_CORE_ENTRIES_H
#define CPS_CORE_ENTRIES_H

#include <stddef.h>
#include <stdint.h>

#include "core/wire.h"

enum {
    CPS_ENT_PARAM = 1,
    CPS_ENT_DEDUP = 2,
    CPS_ENT_NAMED = 3,
    CPS_ENT_RANGE = 4,
    CPS_ENT_CREATE = 5,
    CPS_ENT_SLICE = 6
};

static inline size_t cps__pad8(size_t n)
{
    return (n + 7) & ~(size_t)7;
}

/* One decoded entry. Pointers point into the payload it was read from (no copy; the values are
 * 8-byte aligned there if the payload is). Which fields are set depends on the tag. */
typedef struct cps__ent {
    uint32_t tag;
    size_t size;          /* bytes the entry takes, padding included */
    uint64_t key;         /* param, create, slice */
    uint32_t len;         /* param, create: the record's length in floats */
    uint64_t opt_step;    /* param, create */
    uint32_t slots;       /* param: optimizer state slots that follow the values */
    uint32_t slot;        /* slice: 0 values, k > 0 optimizer state slot k-1 */
    cps__param_spec spec; /* param, create */
    const float *vals;    /* param: len values then slots*len state; slice: n values */
    uint64_t first, n;    /* slice */
    uint32_t worker;      /* dedup */
    uint64_t seq;         /* dedup, range */
    uint64_t step;        /* range */
    const char *name;     /* named: not NUL-terminated */
    size_t name_len;
    const void *value; /* named */
    size_t value_len;
} cps__ent;

/* Decode the entry at p, of which avail bytes are readable, into *e. Checks the layout only:
 * the entry fits, lengths are non-zero where they must be, the reserved words are zero, the
 * spec decodes. Whether a key, a name or a slot belongs where it arrives is the reader's call.
 * Errors: CPS_EPROTO (truncated, unknown tag or malformed). */
int cps__ent_next(const void *p, size_t avail, cps__ent *e);

/* Sizes of the entries the writers below produce. */
size_t cps__ent_param_size(uint32_t len, uint32_t slots);
size_t cps__ent_named_size(size_t name_len, size_t value_len);
size_t cps__ent_slice_size(uint64_t n);
#define CPS_ENT_DEDUP_SIZE  16
#define CPS_ENT_RANGE_SIZE  24
#define CPS_ENT_CREATE_SIZE (32 + CPS_WIRE_SPEC_SIZE)

/* Writers: each fills exactly its size (above) at p, zero padding included, and returns it. The
 * caller owns p and makes room. state may be NULL when slots is 0. */
size_t cps__ent_put_param(void *p, uint64_t key, uint32_t len, uint64_t opt_step,
                          const cps__param_spec *spec, uint32_t slots, const float *vals,
                          const float *state);
size_t cps__ent_put_dedup(void *p, uint32_t worker, uint64_t seq);
size_t cps__ent_put_named(void *p, const char *name, size_t name_len, const void *value,
                          size_t value_len);
size_t cps__ent_put_range(void *p, uint64_t seq, uint64_t step);
size_t cps__ent_put_create(void *p, uint64_t key, uint32_t len, uint64_t opt_step,
                           const cps__param_spec *spec);
size_t cps__ent_put_slice(void *p, uint32_t slot, uint64_t key, uint64_t first, uint64_t n,
                          const float *vals);

#endif
