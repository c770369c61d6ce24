/* What the coordinator answers to tools and the tensor registry (coordinator_tools.c), called by
 * coordinator_dispatch.c. Private to recovery/coordinator*.c. */
#ifndef CPS_RECOVERY_COORDINATOR_TOOLS_H
#define CPS_RECOVERY_COORDINATOR_TOOLS_H

#include "recovery/coordinator_out.h"

void cps__co_status(cps__coord *c, const cps__msg_hdr *h, uint32_t reply_to, uint64_t now);
void cps__co_registry(cps__coord *c, const cps__msg_hdr *h, uint32_t reply_to);
void cps__co_register(cps__coord *c, const cps__coord_node *n, const cps__msg_hdr *h,
                      const void *pl, size_t len);
void cps__co_release(cps__coord *c, const cps__msg_hdr *h, uint32_t reply_to);
int cps__co_registry_load(cps__coord *c, cps__coord_get_fn get, void *ctx);

#endif
