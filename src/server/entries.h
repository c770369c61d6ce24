/* Range entries, the payload of SNAP messages (state transfer, transfer.c) and of PUT messages
 * (checkpoint restores, cut.c), written into the store by entries.c.
 *
 * SNAP payload: a sequence of 8-byte-aligned entries, little-endian:
 *   1 param:  u32 1, u32 len, u64 key, u64 opt_step, u32 slots, u32 0, spec[64],
 *             f32 values[len], f32 state[slots*len], zero padding to 8
 *   2 dedup:  u32 2, u32 worker, u64 seq   (worker | CPS_DEDUP_CLOCK_BIT: its SSP clock)
 *   3 named:  u32 3, u32 name_len, u32 value_len, u32 0, name, pad to 8, value, pad to 8
 *   4 range:  u32 4, u32 0, u64 seq, u64 step            (last chunk only)
 * and, in checkpoint restores only (PUT), whole records sent in slices:
 *   5 create: u32 5, u32 len, u64 key, u64 opt_step, u64 0, spec[64]   (zero values and state)
 *   6 slice:  u32 6, u32 slot, u64 key, u64 first, u64 n, f32 values[n], zero padding to 8
 *             (slot 0: parameters, 1..k: optimizer state slot k-1) */
#ifndef CPS_SERVER_ENTRIES_H
#define CPS_SERVER_ENTRIES_H

#include <stddef.h>
#include <stdint.h>

#include "server.h"

enum { ENT_PARAM = 1, ENT_DEDUP = 2, ENT_NAMED = 3, ENT_RANGE = 4, ENT_CREATE = 5, ENT_SLICE = 6 };

static inline size_t pad8(size_t n)
{
    return (n + 7) & ~(size_t)7;
}

/* Write the entries of buf[0..len) for `range` in txn: records, exactly-once records,
 * aggregation records; the range entry is expected only when `last` (*seq, if not NULL: the
 * range's sequence number it gave). Errors: CPS_EPROTO (malformed), store errors. */
int cps__server_install_entries(cps__txn *txn, cps__server *s, uint32_t range, const void *buf,
                                size_t len, int last, uint64_t *seq);
/* Check a restore's records (PUT: create, slice and aggregation entries only) against the
 * store without writing: every slice within a record this message creates or the store holds.
 * Errors: CPS_EPROTO (why says which entry), CPS_ESTORE, CPS_ENOMEM. */
int cps__server_check_put(cps__server *s, uint32_t range, const void *buf, size_t len, char *why,
                          size_t cap);

#endif
