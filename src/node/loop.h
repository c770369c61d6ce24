/* The event loop every role runs: file events (a readable fd, including nanomsg's NN_RCVFD /
 * NN_SNDFD), timers keyed by id, and a before-sleep hook, over one poll(2) per turn.
 *
 * One turn (cps__loop_run_once): run the before-sleep hook; poll the registered fds for as long
 * as the earliest timer allows (never longer: DESIGN.md, "never spin; block in poll with a
 * timeout from the next timer"); call the callbacks of the fds that are ready; fire the timers
 * that are due. Every callback is handed `now_ms`, read once per turn from CLOCK_MONOTONIC, so
 * the pure state machines the roles feed get their time from one place.
 *
 * Callbacks may add, remove or reschedule any fd or timer, their own included, and may stop the
 * loop. A callback returning a negative CPS_E... code stops the loop, and cps__loop_run (or
 * cps__loop_run_once) returns that code.
 *
 * Not thread-safe: one thread owns a loop. Nothing here is part of the public API.
 */
#ifndef CPS_NODE_LOOP_H
#define CPS_NODE_LOOP_H

#include <stddef.h>
#include <stdint.h>

#include "transport/transport.h"

typedef struct cps__loop cps__loop;

/* A registered fd is readable (or closed: POLLHUP/POLLERR count as readable, so the callback
 * sees the end of file). May be called spuriously: read with non-blocking calls. Return 0, or a
 * negative CPS_E... to stop the loop with that status. */
typedef int (*cps__loop_fd_fn)(cps__loop *l, int fd, void *ctx, uint64_t now_ms);
/* Timer `id` is due. A one-shot timer is already removed when this runs; a periodic one is
 * already re-armed (period after `now_ms`), so the callback may remove or reschedule it. */
typedef int (*cps__loop_timer_fn)(cps__loop *l, uint64_t id, void *ctx, uint64_t now_ms);
/* Before-sleep hook: runs at the start of every turn, before the poll. */
typedef int (*cps__loop_hook_fn)(cps__loop *l, void *ctx, uint64_t now_ms);

/* Milliseconds of CLOCK_MONOTONIC: the loop's clock (same origin as cps__now_ms). */
uint64_t cps__loop_clock_ms(void);

/* Errors: CPS_EINVAL (out NULL), CPS_ENOMEM. */
int cps__loop_create(cps__loop **out);
/* Frees the loop; closes no fd (the callers own them). NULL is a no-op. */
void cps__loop_destroy(cps__loop *l);

/* Watch `fd` for reading. Registering an fd again replaces its callback and context.
 * The fd stays the caller's: unregister it before closing it.
 * Errors: CPS_EINVAL (fd < 0, fn NULL), CPS_ENOMEM. */
int cps__loop_fd_add(cps__loop *l, int fd, cps__loop_fd_fn fn, void *ctx);
/* The same, but when several fds are ready in one turn, those added with this function are
 * served before the others (e.g. flushing queued output before handling a batch of input).
 * Otherwise ready fds are served in no promised order. */
int cps__loop_fd_add_first(cps__loop *l, int fd, cps__loop_fd_fn fn, void *ctx);
/* Watch a nanomsg socket: `which` is NN_RCVFD (a message can be received) or NN_SNDFD (a
 * message can be sent); the fd nanomsg gives for it is registered and written to *fd_out (may
 * be NULL), which is what cps__loop_fd_del takes and what `fn` is called with.
 * Errors: CPS_EINVAL, CPS_ETRANSPORT (nn_getsockopt failed), CPS_ENOMEM. */
int cps__loop_nn_add(cps__loop *l, int sock, int which, cps__loop_fd_fn fn, void *ctx, int *fd_out);
/* Stop watching `fd`. Unknown fds: CPS_ENOTFOUND. */
int cps__loop_fd_del(cps__loop *l, int fd);

/* Arm timer `id` to fire `delay_ms` from now (the loop's clock), then every `period_ms` after
 * each firing (0: once). An id that is armed already is rescheduled (callback, context and
 * period replaced). Errors: CPS_EINVAL (fn NULL), CPS_ENOMEM. */
int cps__loop_timer_add(cps__loop *l, uint64_t id, uint64_t delay_ms, uint64_t period_ms,
                        cps__loop_timer_fn fn, void *ctx);
/* Move armed timer `id` to the absolute time `when_ms` (loop clock); its period is kept.
 * Errors: CPS_ENOTFOUND (not armed). */
int cps__loop_timer_at(cps__loop *l, uint64_t id, uint64_t when_ms);
/* Disarm timer `id`. Errors: CPS_ENOTFOUND (not armed). */
int cps__loop_timer_del(cps__loop *l, uint64_t id);
/* 1 if timer `id` is armed, with its deadline in *when_ms (may be NULL); else 0. */
int cps__loop_timer_armed(const cps__loop *l, uint64_t id, uint64_t *when_ms);

/* Set (or clear, with NULL) the before-sleep hook. */
void cps__loop_before_sleep(cps__loop *l, cps__loop_hook_fn fn, void *ctx);

/* One turn, polling at most `max_wait_ms` (-1: as long as the timers allow, for ever if none).
 * A signal that interrupts the poll ends the turn early. Returns the number of fd and timer
 * callbacks run (>= 0), or a negative CPS_E... (poll failed, or a callback returned one). */
int cps__loop_run_once(cps__loop *l, int max_wait_ms);
/* Turn until cps__loop_stop() is called. Returns 0, or the error that ended it (see
 * cps__loop_run_once). A stop requested before the call returns at once. */
int cps__loop_run(cps__loop *l);
/* Ask cps__loop_run to return after the current turn; a pending poll is not entered (the turn
 * in progress finishes its callbacks). Sticky until cps__loop_resume(). */
void cps__loop_stop(cps__loop *l);
/* Clear a stop, so the loop can run again. */
void cps__loop_resume(cps__loop *l);
/* 1 once cps__loop_stop() was called (and not resumed). */
int cps__loop_stopped(const cps__loop *l);
/* The time this turn started at (loop clock), as handed to the callbacks. */
uint64_t cps__loop_now(const cps__loop *l);

/* ---- a transport on the loop ----
 * The inbox's NN_RCVFD becomes a file event that delivers up to `max_msgs` messages (0: all
 * waiting) to `fn` per turn, so a steady stream still lets the timers run; each peer with
 * messages queued in the transport gets its NN_SNDFD watched until the queue drains (a peer
 * without a backlog can always send, so watching it always would spin). */
typedef struct cps__loop_tp {
    cps__loop *loop;
    cps__tp *tp;
    cps__tp_recv_fn fn;
    void *ctx;
    int max_msgs;
    int inbox_fd;       /* -1 when the transport has no inbox */
    int local_inbox_fd; /* the ipc:// inbox (same-host peers), -1 without one */
    int error;          /* the first failure to (un)watch a backlog, reported by the next turn */
} cps__loop_tp;

/* Put `tp` on loop `l`; `a` is the caller's storage and must outlive the attachment. With `fn`
 * NULL the inbox is not watched (a transport that only sends). Errors: CPS_EINVAL, CPS_ENOMEM. */
int cps__loop_tp_attach(cps__loop_tp *a, cps__loop *l, cps__tp *tp, cps__tp_recv_fn fn, void *ctx,
                        int max_msgs);
/* Take the transport off the loop (before destroying either). Safe on a zeroed `a`. */
void cps__loop_tp_detach(cps__loop_tp *a);

#endif
