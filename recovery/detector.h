/* Failure detection by heartbeats, as a pure state machine: the caller reports when it heard from
 * a node and ticks it with the current time; it answers which nodes have now been silent for
 * longer than the timeout. It never reads the clock itself.
 *
 * A node declared dead may be alive and slow: correctness rests on view epochs (fencing), never
 * on this detector being right. */
#ifndef CPS_RECOVERY_DETECTOR_H
#define CPS_RECOVERY_DETECTOR_H

#include <stddef.h>
#include <stdint.h>

typedef struct cps__detector cps__detector;

typedef struct cps__detector_config {
    uint32_t dead_after_ms; /* silent this long: declared dead (> 0) */
    uint32_t grace_ms;      /* after cps__detector_restart, nobody is declared dead before this */
} cps__detector_config;

/* Errors: CPS_EINVAL (dead_after_ms == 0), CPS_ENOMEM. */
int cps__detector_create(const cps__detector_config *cfg, cps__detector **out);
void cps__detector_destroy(cps__detector *d);

/* Start watching `node` as of `now` (a join, or a node coming back). Errors: CPS_ENOMEM. */
int cps__detector_watch(cps__detector *d, uint32_t node, uint64_t now);
/* Stop watching (a node that left or was declared dead). Unknown node: no-op. */
void cps__detector_forget(cps__detector *d, uint32_t node);
/* `node`'s process is known to have ended (its connection closed and reconnecting is refused:
 * nothing listens on its address any more): it is reported dead at the next tick, whatever its
 * silence and any grace. A kill is then noticed in tens of milliseconds, however long the
 * silence timeout that tells a stalled process from a dead one. Unknown node: no-op. */
void cps__detector_gone(cps__detector *d, uint32_t node);
/* We heard from `node` at `now` (a heartbeat or any message). Unknown node: no-op. */
void cps__detector_heard(cps__detector *d, uint32_t node, uint64_t now);
/* The watcher itself restarted (e.g. a scheduler reloaded its view): every watched node gets a
 * fresh deadline from `now` plus the grace period, so no one is declared dead for our absence. */
void cps__detector_restart(cps__detector *d, uint64_t now);

/* We (the watcher) did not run for a while: restart every node's silence from `now`, without
 * the extra grace of cps__detector_restart. */
void cps__detector_refresh(cps__detector *d, uint64_t now);

/* Nodes silent past the timeout at `now`, written to dead[0..cap); each is reported once and
 * then no longer watched. Returns how many (at most cap; the rest are reported next tick). */
size_t cps__detector_tick(cps__detector *d, uint64_t now, uint32_t *dead, size_t cap);

/* Milliseconds since we last heard from node (UINT64_MAX if not watched). */
uint64_t cps__detector_silence(const cps__detector *d, uint32_t node, uint64_t now);

#endif
