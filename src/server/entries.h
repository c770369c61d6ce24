/* Range entries, the payload of SNAP messages (state transfer, transfer.c) and of PUT messages
 * (checkpoint restores, cut.c), written into the store by entries.c. The format and its one
 * encoder and decoder are core/entries.h. */
#ifndef CPS_SERVER_ENTRIES_H
#define CPS_SERVER_ENTRIES_H

#include <stddef.h>
#include <stdint.h>

#include "core/entries.h"
#include "server.h"

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
