/* The coordinator's output helpers (coordinator_out.c: actions, views as sent, saves,
 * publishing), which the policies and the dispatch use. Private to recovery/coordinator*.c. */
#ifndef CPS_RECOVERY_COORDINATOR_OUT_H
#define CPS_RECOVERY_COORDINATOR_OUT_H

#include "recovery/coordinator_state.h"

/* coordinator_out.c */
void cps__co_log(cps__coord *c, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
cps__coord_action *cps__co_push(cps__coord *c, int kind, uint32_t peer);
/* The view to `peer` as `type` (VIEW or WELCOME); `settled`: cps__co_workers_settled, computed
 * once by the caller for every view of its round. */
void cps__co_send_view(cps__coord *c, uint32_t peer, uint8_t type, int settled);
void cps__co_send_simple(cps__coord *c, uint32_t peer, uint8_t type, const cps__msg_hdr *req);
void cps__co_reply_error(cps__coord *c, const cps__msg_hdr *req, uint32_t peer, int code,
                         const char *text);
void cps__co_save(cps__coord *c);
void cps__co_publish(cps__coord *c, const char *why);
int cps__co_sync_view_nodes(cps__coord *c);
/* Take `buf` (malloc'd, `len` bytes) into the output as payload number N (the return value) for a
 * CPS_CO_VIEW or CPS_CO_REPLY action; freed by cps__coord_done. UINT32_MAX (buf freed) when the
 * output cannot grow. */
uint32_t cps__co_payload(cps__coord *c, void *buf, size_t len);

#endif
