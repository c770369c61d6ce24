/* Heartbeats to the scheduler from a thread of their own, for servers and workers.
 *
 * A node's liveness must not depend on how long its own work takes between two calls into the
 * library (a worker's step, a server's large apply or slow sync), so a thread sends them. What it
 * sends (node id, view epoch, counters) is handed over by the node with cps__heartbeat_publish.
 * With a stall limit, the thread stops beating once nothing was published for that long, so a
 * node whose event loop is wedged is still failed over. The thread has its own transport (a
 * cps__tp belongs to one thread) with the scheduler as its only peer. */
#ifndef CPS_NODE_HEARTBEAT_H
#define CPS_NODE_HEARTBEAT_H

#include <stdint.h>

#include "core/view.h"

typedef struct cps__heartbeat cps__heartbeat;

/* Start the thread: a heartbeat to `sched_url` every `period_ms` while beating (nothing is sent
 * until the first publish with beating set), authenticated with `key` (32 bytes, copied; NULL
 * for an insecure job). `stall_limit_ms` 0: no limit; else the beats pause
 * while the last publish is older than that. `who` names the node in the log ("server").
 * Strings are copied. Errors: CPS_ENOMEM (logged). */
int cps__heartbeat_start(const char *sched_url, const unsigned char *key, uint32_t period_ms,
                         uint32_t stall_limit_ms, const char *who, cps__heartbeat **out);
/* Hand the thread what to send, and the time of this call (`now`, cps__now_ms). `beating` 0
 * silences it (not joined yet, fenced). `stats` is copied; NULL sends zeros. */
void cps__heartbeat_publish(cps__heartbeat *hb, int beating, uint32_t id, uint64_t epoch,
                            const cps__node_stats *stats, uint64_t now);
/* Stop and join the thread, free hb. NULL is a no-op. */
void cps__heartbeat_stop(cps__heartbeat *hb);

#endif
