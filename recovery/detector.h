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

typedef struct cps_detector cps_detector;

typedef struct cps_detector_config {
    uint32_t dead_after_ms; /* silent this long: declared dead (> 0) */
    uint32_t grace_ms;      /* after cps_detector_restart, nobody is declared dead before this */
} cps_detector_config;

/* Errors: CPS_EINVAL (dead_after_ms == 0), CPS_ENOMEM. */
int cps_detector_create(const cps_detector_config *cfg, cps_detector **out);
void cps_detector_destroy(cps_detector *d);

/* Start watching `node` as of `now` (a join, or a node coming back). Errors: CPS_ENOMEM. */
int cps_detector_watch(cps_detector *d, uint32_t node, uint64_t now);
/* Stop watching (a node that left or was declared dead). Unknown node: no-op. */
void cps_detector_forget(cps_detector *d, uint32_t node);
/* We heard from `node` at `now` (a heartbeat or any message). Unknown node: no-op. */
void cps_detector_heard(cps_detector *d, uint32_t node, uint64_t now);
/* The watcher itself restarted (e.g. a scheduler reloaded its view): every watched node gets a
 * fresh deadline from `now` plus the grace period, so no one is declared dead for our absence. */
void cps_detector_restart(cps_detector *d, uint64_t now);

/* We (the watcher) did not run for a while: restart every node's silence from `now`, without
 * the extra grace of cps_detector_restart. */
void cps_detector_refresh(cps_detector *d, uint64_t now);

/* Nodes silent past the timeout at `now`, written to dead[0..cap); each is reported once and
 * then no longer watched. Returns how many (at most cap; the rest are reported next tick). */
size_t cps_detector_tick(cps_detector *d, uint64_t now, uint32_t *dead, size_t cap);

/* Milliseconds since we last heard from node (UINT64_MAX if not watched). */
uint64_t cps_detector_silence(const cps_detector *d, uint32_t node, uint64_t now);

#endif
