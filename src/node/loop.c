/* The roles' event loop: see loop.h. Timers live in a binary min-heap ordered by deadline, ties
 * broken by arming order so that timers due together fire in the order they were armed (the
 * unit tests and the roles rely on that determinism). A role has a handful of timers, so finding
 * one by id is a linear scan of the heap; the heap keeps the per-turn cost (the earliest
 * deadline) O(1). */
#include "loop.h"

#include <errno.h>
#include <nanomsg/nn.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chainps/error.h"
#include "core/array.h"
#include "core/log.h"

typedef struct loop_timer {
    uint64_t when, period, id;
    uint64_t order; /* arming order: ties on `when` fire oldest first */
    uint64_t turn;  /* the turn it was armed in: see fire_timers */
    cps__loop_timer_fn fn;
    void *ctx;
} loop_timer;

typedef struct loop_fd {
    int fd;
    cps__loop_fd_fn fn;
    void *ctx;
    int first; /* served before the others (cps__loop_fd_add_first) */
} loop_fd;

struct cps__loop {
    loop_timer *heap;
    size_t ntimers, timers_cap;
    uint64_t next_order;
    loop_fd *fds;
    size_t nfds, fds_cap;
    /* The poll set, rebuilt from fds only when a registration changed (`dirty`): most turns
     * change nothing. */
    struct pollfd *pfds;
    size_t npfds, pfds_cap;
    int dirty;
    cps__loop_hook_fn hook;
    void *hook_ctx;
    uint64_t now, turn;
    int stop;
    int error; /* a callback's failure, returned by the turn it happened in */
};

uint64_t cps__loop_clock_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

int cps__loop_create(cps__loop **out)
{
    if (!out)
        return CPS_EINVAL;
    *out = calloc(1, sizeof **out);
    if (!*out)
        return CPS_ENOMEM;
    (*out)->now = cps__loop_clock_ms();
    return 0;
}

void cps__loop_destroy(cps__loop *l)
{
    if (!l)
        return;
    free(l->heap);
    free(l->fds);
    free(l->pfds);
    free(l);
}

/* ---- timers ---- */

static int timer_before(const loop_timer *a, const loop_timer *b)
{
    return a->when < b->when || (a->when == b->when && a->order < b->order);
}

static void timer_swap(cps__loop *l, size_t i, size_t j)
{
    loop_timer t = l->heap[i];
    l->heap[i] = l->heap[j];
    l->heap[j] = t;
}

static void sift_up(cps__loop *l, size_t i)
{
    while (i > 0 && timer_before(&l->heap[i], &l->heap[(i - 1) / 2])) {
        timer_swap(l, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
}

static void sift_down(cps__loop *l, size_t i)
{
    for (;;) {
        size_t m = i, a = 2 * i + 1, b = 2 * i + 2;
        if (a < l->ntimers && timer_before(&l->heap[a], &l->heap[m]))
            m = a;
        if (b < l->ntimers && timer_before(&l->heap[b], &l->heap[m]))
            m = b;
        if (m == i)
            return;
        timer_swap(l, i, m);
        i = m;
    }
}

/* After heap[i] changed its key: restore the heap order around it. */
static void timer_fix(cps__loop *l, size_t i)
{
    sift_up(l, i);
    sift_down(l, i);
}

static size_t timer_find(const cps__loop *l, uint64_t id)
{
    for (size_t i = 0; i < l->ntimers; i++)
        if (l->heap[i].id == id)
            return i;
    return SIZE_MAX;
}

static void timer_remove_at(cps__loop *l, size_t i)
{
    l->ntimers--;
    if (i == l->ntimers)
        return;
    l->heap[i] = l->heap[l->ntimers];
    timer_fix(l, i);
}

/* Set heap[i]'s deadline; a re-armed timer counts as newly armed for ordering and firing. */
static void timer_set(cps__loop *l, size_t i, uint64_t when)
{
    l->heap[i].when = when;
    l->heap[i].order = l->next_order++;
    l->heap[i].turn = l->turn;
    timer_fix(l, i);
}

int cps__loop_timer_add(cps__loop *l, uint64_t id, uint64_t delay_ms, uint64_t period_ms,
                        cps__loop_timer_fn fn, void *ctx)
{
    if (!l || !fn)
        return CPS_EINVAL;
    /* Measured from the clock, not from the turn's start: a timer armed late in a long turn
     * must not fire early. */
    uint64_t when = cps__loop_clock_ms() + delay_ms;
    size_t i = timer_find(l, id);
    if (i == SIZE_MAX) {
        void *h = l->heap;
        int rc = cps__array_reserve(&h, &l->timers_cap, l->ntimers + 1, sizeof *l->heap, 8);
        if (rc != 0)
            return rc;
        l->heap = h;
        i = l->ntimers++;
        l->heap[i].id = id;
    }
    l->heap[i].period = period_ms;
    l->heap[i].fn = fn;
    l->heap[i].ctx = ctx;
    timer_set(l, i, when);
    return 0;
}

int cps__loop_timer_at(cps__loop *l, uint64_t id, uint64_t when_ms)
{
    size_t i = l ? timer_find(l, id) : SIZE_MAX;
    if (i == SIZE_MAX)
        return CPS_ENOTFOUND;
    timer_set(l, i, when_ms);
    return 0;
}

int cps__loop_timer_del(cps__loop *l, uint64_t id)
{
    size_t i = l ? timer_find(l, id) : SIZE_MAX;
    if (i == SIZE_MAX)
        return CPS_ENOTFOUND;
    timer_remove_at(l, i);
    return 0;
}

int cps__loop_timer_armed(const cps__loop *l, uint64_t id, uint64_t *when_ms)
{
    size_t i = l ? timer_find(l, id) : SIZE_MAX;
    if (i == SIZE_MAX)
        return 0;
    if (when_ms)
        *when_ms = l->heap[i].when;
    return 1;
}

/* Fire what is due at `now`. Only timers armed before this turn's firing began: one that a
 * callback arms due at once (or re-arms with a zero period) waits for the next turn, after a
 * poll, so timers can neither starve the fds nor loop here for ever. */
static int fire_timers(cps__loop *l, uint64_t now)
{
    int fired = 0;
    uint64_t turn = l->turn++;
    while (l->ntimers && l->heap[0].when <= now && l->heap[0].turn <= turn && !l->error) {
        loop_timer t = l->heap[0];
        if (t.period)
            timer_set(l, 0, now + t.period); /* from now: a stall does not bring a burst */
        else
            timer_remove_at(l, 0);
        int rc = t.fn(l, t.id, t.ctx, now);
        fired++;
        if (rc < 0)
            l->error = rc;
    }
    return fired;
}

/* ---- file events ---- */

static size_t fd_find(const cps__loop *l, int fd)
{
    for (size_t i = 0; i < l->nfds; i++)
        if (l->fds[i].fd == fd)
            return i;
    return SIZE_MAX;
}

static int fd_add(cps__loop *l, int fd, cps__loop_fd_fn fn, void *ctx, int first)
{
    if (!l || fd < 0 || !fn)
        return CPS_EINVAL;
    size_t i = fd_find(l, fd);
    if (i == SIZE_MAX) {
        void *p = l->fds;
        int rc = cps__array_reserve(&p, &l->fds_cap, l->nfds + 1, sizeof *l->fds, 8);
        if (rc != 0)
            return rc;
        l->fds = p;
        i = l->nfds++;
        l->dirty = 1;
    }
    if (l->fds[i].first != first || l->fds[i].fd != fd)
        l->dirty = 1; /* the poll set's order changes */
    l->fds[i] = (loop_fd){fd, fn, ctx, first};
    return 0;
}

int cps__loop_fd_add(cps__loop *l, int fd, cps__loop_fd_fn fn, void *ctx)
{
    return fd_add(l, fd, fn, ctx, 0);
}

int cps__loop_fd_add_first(cps__loop *l, int fd, cps__loop_fd_fn fn, void *ctx)
{
    return fd_add(l, fd, fn, ctx, 1);
}

int cps__loop_nn_add(cps__loop *l, int sock, int which, cps__loop_fd_fn fn, void *ctx, int *fd_out)
{
    if (!l || (which != NN_RCVFD && which != NN_SNDFD))
        return CPS_EINVAL;
    int fd = -1;
    size_t sz = sizeof fd;
    if (nn_getsockopt(sock, NN_SOL_SOCKET, which, &fd, &sz) < 0) {
        cps__log(CPS_LOG_ERROR, "loop", "nn_getsockopt(%s): %s",
                 which == NN_RCVFD ? "NN_RCVFD" : "NN_SNDFD", nn_strerror(nn_errno()));
        return CPS_ETRANSPORT;
    }
    int rc = cps__loop_fd_add(l, fd, fn, ctx);
    if (rc == 0 && fd_out)
        *fd_out = fd;
    return rc;
}

int cps__loop_fd_del(cps__loop *l, int fd)
{
    size_t i = l ? fd_find(l, fd) : SIZE_MAX;
    if (i == SIZE_MAX)
        return CPS_ENOTFOUND;
    l->fds[i] = l->fds[--l->nfds];
    l->dirty = 1;
    return 0;
}

static int pfds_rebuild(cps__loop *l)
{
    void *p = l->pfds;
    int rc = cps__array_reserve(&p, &l->pfds_cap, l->nfds, sizeof *l->pfds, 8);
    if (rc != 0)
        return rc;
    l->pfds = p;
    /* Ready fds are served in poll-set order: the `first` ones go in front. */
    size_t n = 0;
    for (int pass = 1; pass >= 0; pass--)
        for (size_t i = 0; i < l->nfds; i++)
            if (l->fds[i].first == pass)
                l->pfds[n++] = (struct pollfd){.fd = l->fds[i].fd, .events = POLLIN};
    l->npfds = n;
    l->dirty = 0;
    return 0;
}

/* Call the callbacks of the fds poll reported. The poll set is a snapshot: each ready fd is
 * looked up again, so one that an earlier callback removed is skipped. */
static int dispatch_fds(cps__loop *l, uint64_t now)
{
    int ran = 0;
    for (size_t i = 0; i < l->npfds && !l->error; i++) {
        if (!l->pfds[i].revents)
            continue;
        size_t at = fd_find(l, l->pfds[i].fd);
        if (at == SIZE_MAX)
            continue;
        int rc = l->fds[at].fn(l, l->pfds[i].fd, l->fds[at].ctx, now);
        ran++;
        if (rc < 0)
            l->error = rc;
    }
    return ran;
}

/* ---- turns ---- */

void cps__loop_before_sleep(cps__loop *l, cps__loop_hook_fn fn, void *ctx)
{
    if (!l)
        return;
    l->hook = fn;
    l->hook_ctx = ctx;
}

int cps__loop_run_once(cps__loop *l, int max_wait_ms)
{
    if (!l)
        return CPS_EINVAL;
    l->error = 0;
    l->now = cps__loop_clock_ms();
    if (l->hook) {
        int rc = l->hook(l, l->hook_ctx, l->now);
        if (rc < 0)
            return rc;
    }
    if (l->dirty) {
        int rc = pfds_rebuild(l);
        if (rc != 0)
            return rc;
    }
    /* The hook may have taken time (a flush, an msync): measure the wait from after it. */
    uint64_t now = cps__loop_clock_ms();
    int wait = max_wait_ms;
    if (l->stop) {
        wait = 0;
    } else if (l->ntimers) {
        uint64_t due = l->heap[0].when;
        uint64_t left = due > now ? due - now : 0;
        if (wait < 0 || left < (uint64_t)wait)
            wait = left > INT32_MAX ? INT32_MAX : (int)left;
    }
    int n = poll(l->pfds, (nfds_t)l->npfds, wait);
    if (n < 0) {
        if (errno == EINTR)
            return 0; /* a signal: let the caller look at its flags */
        cps__log(CPS_LOG_ERROR, "loop", "poll: %s", strerror(errno));
        return CPS_EIO;
    }
    l->now = cps__loop_clock_ms();
    int ran = n > 0 ? dispatch_fds(l, l->now) : 0;
    ran += fire_timers(l, l->now);
    return l->error ? l->error : ran;
}

int cps__loop_run(cps__loop *l)
{
    if (!l)
        return CPS_EINVAL;
    while (!l->stop) {
        int rc = cps__loop_run_once(l, -1);
        if (rc < 0)
            return rc;
    }
    return 0;
}

void cps__loop_stop(cps__loop *l)
{
    if (l)
        l->stop = 1;
}

void cps__loop_resume(cps__loop *l)
{
    if (l)
        l->stop = 0;
}

int cps__loop_stopped(const cps__loop *l)
{
    return l && l->stop;
}

uint64_t cps__loop_now(const cps__loop *l)
{
    return l ? l->now : cps__loop_clock_ms();
}

/* ---- a transport on the loop ---- */

/* A backlog the loop could not watch (no memory) fails the next transport callback: the
 * peer's queue would otherwise sit unflushed. */
static int tp_hook_error(cps__loop_tp *a)
{
    int rc = a->error;
    a->error = 0;
    return rc;
}

static int on_inbox(cps__loop *l, int fd, void *ctx, uint64_t now_ms)
{
    (void)l, (void)fd, (void)now_ms;
    cps__loop_tp *a = ctx;
    int n = cps__tp_drain(a->tp, a->fn, a->ctx, a->max_msgs);
    return n < 0 ? n : tp_hook_error(a);
}

static int on_sendable(cps__loop *l, int fd, void *ctx, uint64_t now_ms)
{
    (void)l, (void)now_ms;
    cps__loop_tp *a = ctx;
    int rc = cps__tp_flush_fd(a->tp, fd);
    return rc < 0 ? rc : tp_hook_error(a);
}

/* The transport's peer `fd` got a backlog (on) or lost it. */
static void on_backlog(void *ctx, int fd, int on)
{
    cps__loop_tp *a = ctx;
    /* Flushing first, as the transport's own poll did: it is cheap, and the replies it sends
     * should not wait behind a batch of requests (64 pushes of 1 MB take milliseconds). */
    int rc =
        on ? cps__loop_fd_add_first(a->loop, fd, on_sendable, a) : cps__loop_fd_del(a->loop, fd);
    if (rc != 0 && rc != CPS_ENOTFOUND && !a->error) {
        cps__log(CPS_LOG_ERROR, "loop", "cannot watch a peer's backlog: %s", cps_strerror(rc));
        a->error = rc;
    }
}

int cps__loop_tp_attach(cps__loop_tp *a, cps__loop *l, cps__tp *tp, cps__tp_recv_fn fn, void *ctx,
                        int max_msgs)
{
    if (!a || !l || !tp)
        return CPS_EINVAL;
    /* Without a callback there is no one to hand messages to: only the backlogs are watched. */
    *a = (cps__loop_tp){l,
                        tp,
                        fn,
                        ctx,
                        max_msgs,
                        fn ? cps__tp_inbox_fd(tp) : -1,
                        fn ? cps__tp_inbox_local_fd(tp) : -1,
                        0};
    if (a->inbox_fd >= 0) {
        int rc = cps__loop_fd_add(l, a->inbox_fd, on_inbox, a);
        if (rc != 0)
            return rc;
    }
    /* Either inbox's fd wakes the same drain, which reads both. */
    if (a->local_inbox_fd >= 0) {
        int rc = cps__loop_fd_add(l, a->local_inbox_fd, on_inbox, a);
        if (rc != 0) {
            if (a->inbox_fd >= 0)
                cps__loop_fd_del(l, a->inbox_fd);
            return rc;
        }
    }
    cps__tp_set_backlog_fn(tp, on_backlog, a);
    int rc = tp_hook_error(a);
    if (rc != 0)
        cps__loop_tp_detach(a);
    return rc;
}

void cps__loop_tp_detach(cps__loop_tp *a)
{
    if (!a || !a->loop || !a->tp)
        return;
    cps__tp_set_backlog_fn(a->tp, NULL, NULL);
    if (a->inbox_fd >= 0)
        cps__loop_fd_del(a->loop, a->inbox_fd);
    if (a->local_inbox_fd >= 0)
        cps__loop_fd_del(a->loop, a->local_inbox_fd);
    a->loop = NULL;
    a->tp = NULL;
}
