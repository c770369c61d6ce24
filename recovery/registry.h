/* The scheduler's tensor registry: the encoded descriptions the workers registered (tensor_desc
 * in core/wire.h), so a checkpoint can name the keys. The coordinator holds it (who may declare,
 * what a REGISTRY query returns); the scheduler's shell saves it as sched/registry (u32 count,
 * then the descriptions). No view depends on it. Pure: no I/O. */
#ifndef CPS_RECOVERY_REGISTRY_H
#define CPS_RECOVERY_REGISTRY_H

#include <stddef.h>
#include <stdint.h>

#include "core/wire.h"

typedef struct cps__registry {
    unsigned char *reg; /* owned */
    size_t len, cap;
    uint32_t count;
} cps__registry;

/* Take the description in `payload`. Returns 0 (unchanged: registered before), 1 (added or its
 * shape recorded: save it), or an error with `text` saying why: CPS_EEXIST (same name, another
 * definition), CPS_EPROTO (malformed), CPS_ENOMEM. */
int cps__registry_add(cps__registry *r, const void *payload, size_t len, char *text, size_t textlen,
                      char *name, size_t namelen);
/* Load the saved blob (replaces the content). Errors: CPS_ENOMEM. */
int cps__registry_load(cps__registry *r, const void *blob, size_t len);
/* The blob to save: malloc'd (the caller frees), *len set; NULL when out of memory. */
unsigned char *cps__registry_blob(const cps__registry *r, size_t *len);
void cps__registry_fini(cps__registry *r);

#endif
