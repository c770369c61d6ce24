/* Server internals shared by the event loop (server.c) and the data path (update.c). */
#ifndef CPS_SERVER_H
#define CPS_SERVER_H

#include <stdint.h>

#include "core/config.h"
#include "core/prom.h"
#include "replication/chain.h"
#include "replication/replica.h"
#include "core/view.h"
#include "node/heartbeat.h"
#include "node/loop.h"
#include "node/metrics.h"
#include "node/msg.h"
#include "node/temp_peers.h"
#include "recovery/fence.h"
#include "store/store.h"
#include "transport/transport.h"
#include "state.h"

/* Data path (update.c): receive, step the replica, perform its ready list. */
/* Create the replica (at start, and again when we rejoin). Errors: CPS_ENOMEM. */
int cps__server_replica_new(cps__server *s);
/* A request or chain message from a peer (takes rx). */
void cps__server_take(cps__server *s, cps__rx *rx);
/* A view the replica said to install (cps__replica_view_news): the replica decides (fenced,
 * installed: then it becomes s->view, *v left empty) and the ready list is performed. */
void cps__server_view_changed(cps__server *s, cps__view *v);
/* A message the shell serves itself: 1 if our standing lets it through (the replica's
 * cps__replica_admit with our boot id, which tells our WELCOME; its ready list performed). */
int cps__server_admit(cps__server *s, const cps__msg_hdr *h, uint64_t now);
/* The event loop turned: the replica measures stalls (cps__replica_turned). */
void cps__server_turned(cps__server *s, uint64_t now);
/* Step the messages the last view released (held for its epoch, or deferred). */
void cps__server_run_held(cps__server *s);
/* Perform the replica's ready list (after any call into it). */
void cps__server_perform(cps__server *s);
/* Timers: re-sends, held acks that are due (all of them when force_acks), stuck sync steps. */
void cps__server_tick(cps__server *s, uint64_t now, int force_acks);
/* Milliseconds the event loop may sleep before held acks are due (`max_ms` if none). */
int cps__server_ack_wait_ms(const cps__server *s, uint64_t now, int max_ms);
/* Clear our copy of range r from the store (its records, exactly-once and aggregate records).
 * Errors: the store's. */
int cps__server_clear_range(cps__server *s, uint32_t r);
/* Free the replica (with its joins). */
void cps__server_data_fini(cps__server *s);
/* The joins' timer (the replica decides): re-asks, deadlines, confirmations. */
void cps__server_check_joins(cps__server *s, uint64_t now);
/* State transfer (transfer.c): perform the replica's SNAPSHOT item (a thread streams the range
 * to the joiner; its end goes back to the replica), and its JOIN_INSTALL item (*seq: the
 * range's sequence number after the last chunk). Errors of the latter: the store's. */
void cps__server_start_snapshot(cps__server *s, const cps__replica_out *o);
int cps__server_join_install(cps__server *s, const cps__replica_out *o, uint64_t *seq);
/* Join finished snapshot threads (all of them, waiting, when `wait`). */
void cps__server_reap_snapshots(cps__server *s, int wait);
/* Checkpoints (cut.c): requests from a checkpoint tool. on_put takes rx; the others do not. */
void cps__server_on_cut_probe(cps__server *s, cps__rx *rx);
void cps__server_on_cut_open(cps__server *s, cps__rx *rx);
void cps__server_on_put(cps__server *s, cps__rx *rx);
/* After an update of `range` is applied: open the cuts waiting for that range's step. */
void cps__server_cuts_after_apply(cps__server *s, uint32_t range);
/* The store's map is full: end the open cuts now, so that the write reuses the pages they
 * pinned, or the map grows (which waits for every read transaction) without stalling the event
 * loop until they end. Their exports read from another replica or are tried again. ctx is the
 * server. Returns how many cuts were ended. */
int cps__server_cuts_before_grow(void *ctx);
/* Timer: join finished cut threads, drop expired waits; stop_all ends every cut (waiting). */
void cps__server_cuts_tick(cps__server *s, uint64_t now, int stop_all);

/* Reply helpers (reply.c). */
void cps__server_reply_error(cps__server *s, const cps__msg_hdr *req, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Ask the scheduler for the current view (the answer arrives as a VIEW message). */
void cps__server_ask_view(cps__server *s);
/* Rank of worker node `id`, or UINT32_MAX if it is not a worker of the view. */
uint32_t cps__server_worker_rank(const cps__server *s, uint32_t id);

#endif
