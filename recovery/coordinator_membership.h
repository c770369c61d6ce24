/* The coordinator's policies (coordinator_membership.c): admission, deaths, repairs and moves,
 * drains, barriers, the end of the job, probes. Called by coordinator_dispatch.c. Private to
 * recovery/coordinator*.c. */
#ifndef CPS_RECOVERY_COORDINATOR_MEMBERSHIP_H
#define CPS_RECOVERY_COORDINATOR_MEMBERSHIP_H

#include "recovery/coordinator_out.h"

int cps__co_begin_running(cps__coord *c, uint64_t now);
void cps__co_hello(cps__coord *c, const cps__msg_hdr *h, const void *pl, size_t len, uint64_t now);
void cps__co_declare_dead(cps__coord *c, uint32_t id, uint64_t silence_ms, uint64_t now);
void cps__co_repair(cps__coord *c, uint64_t now);
void cps__co_caught_up(cps__coord *c, const cps__coord_node *n, const cps__msg_hdr *h,
                       uint64_t now);
void cps__co_drain(cps__coord *c, const cps__msg_hdr *h, uint32_t reply_to, uint64_t now);
void cps__co_release_barrier(cps__coord *c);
void cps__co_end_job(cps__coord *c);
void cps__co_shutdown(cps__coord *c);
void cps__co_suspect(cps__coord *c, const cps__coord_node *n, const cps__msg_hdr *h, const void *pl,
                     size_t len, uint64_t now);
void cps__co_detect(cps__coord *c, uint64_t now, const uint32_t *gone, size_t ngone);
void cps__co_worker_heartbeat(cps__coord *c, cps__coord_node *n, uint64_t now);

#endif
