/* The event loop (src/node/loop.c): timers fire in deadline order (ties in arming order),
 * periodic timers re-arm, a callback can remove a timer (its own or another) and reschedule
 * one, the before-sleep hook runs every turn, a pipe's read end wakes the loop, a callback's
 * error and cps__loop_stop end cps__loop_run, and a transport on the loop delivers messages
 * and flushes its backlog. Time is real, so every wait is short and every bound generous. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "core/log.h"
#include "core/port.h"
#include "node/loop.h"
#include "node/msg.h"

typedef struct rec {
    uint64_t ids[64];
    uint64_t at[64];
    int n;
    cps__loop *l;
    uint64_t victim; /* timer to remove from inside a callback (0: none) */
    int stop_after;  /* stop the loop after this many firings (0: never) */
} rec;

static int on_timer(cps__loop *l, uint64_t id, void *ctx, uint64_t now)
{
    rec *r = ctx;
    if (r->n < 64) {
        r->ids[r->n] = id;
        r->at[r->n] = now;
    }
    r->n++;
    if (r->victim) {
        assert_int_equal(cps__loop_timer_del(l, r->victim), 0);
        r->victim = 0;
    }
    if (r->stop_after && r->n >= r->stop_after)
        cps__loop_stop(l);
    return 0;
}

/* Turn until `n` timers fired or `ms` passed. */
static void turn_until(cps__loop *l, rec *r, int n, int ms)
{
    uint64_t end = cps__loop_clock_ms() + (uint64_t)ms;
    while (r->n < n && cps__loop_clock_ms() < end)
        assert_true(cps__loop_run_once(l, 10) >= 0);
}

static void timers_fire_in_deadline_order(void **state)
{
    (void)state;
    cps__loop *l;
    assert_int_equal(cps__loop_create(&l), 0);
    rec r = {0};
    /* Armed out of order; 4 and 5 share a deadline, so they fire in arming order. */
    assert_int_equal(cps__loop_timer_add(l, 3, 60, 0, on_timer, &r), 0);
    assert_int_equal(cps__loop_timer_add(l, 1, 20, 0, on_timer, &r), 0);
    assert_int_equal(cps__loop_timer_add(l, 2, 40, 0, on_timer, &r), 0);
    uint64_t when;
    assert_int_equal(cps__loop_timer_armed(l, 2, &when), 1);
    assert_int_equal(cps__loop_timer_at(l, 5, when + 40), CPS_ENOTFOUND);
    assert_int_equal(cps__loop_timer_add(l, 4, 0, 0, on_timer, &r), 0);
    assert_int_equal(cps__loop_timer_add(l, 5, 0, 0, on_timer, &r), 0);
    /* Rescheduling 4 keeps one timer 4, at its new deadline, now after 5 and 1. */
    assert_int_equal(cps__loop_timer_add(l, 4, 30, 0, on_timer, &r), 0);
    assert_int_equal(cps__loop_timer_at(l, 5, when - 35), 0);
    uint64_t t0 = cps__loop_clock_ms();
    turn_until(l, &r, 5, 2000);
    turn_until(l, &r, 6, 100); /* nothing more: one-shots are gone */
    assert_int_equal(r.n, 5);
    uint64_t want[5] = {5, 1, 4, 2, 3};
    for (int i = 0; i < 5; i++)
        assert_int_equal(r.ids[i], want[i]);
    assert_true(r.at[1] >= t0 + 20); /* none early */
    assert_true(r.at[4] >= t0 + 60);
    assert_int_equal(cps__loop_timer_armed(l, 3, NULL), 0);
    cps__loop_destroy(l);
}

static void periodic_timer_rearms(void **state)
{
    (void)state;
    cps__loop *l;
    assert_int_equal(cps__loop_create(&l), 0);
    rec r = {0};
    assert_int_equal(cps__loop_timer_add(l, 9, 0, 15, on_timer, &r), 0);
    turn_until(l, &r, 4, 2000);
    assert_int_equal(r.n, 4);
    for (int i = 1; i < 4; i++)
        assert_true(r.at[i] - r.at[i - 1] >= 15);
    assert_int_equal(cps__loop_timer_armed(l, 9, NULL), 1);
    assert_int_equal(cps__loop_timer_del(l, 9), 0);
    assert_int_equal(cps__loop_timer_del(l, 9), CPS_ENOTFOUND);
    turn_until(l, &r, 5, 60);
    assert_int_equal(r.n, 4);
    cps__loop_destroy(l);
}

static int remove_self(cps__loop *l, uint64_t id, void *ctx, uint64_t now)
{
    (void)now;
    rec *r = ctx;
    r->n++;
    return cps__loop_timer_del(l, id); /* a periodic timer is armed while its callback runs */
}

static void callback_removes_timers(void **state)
{
    (void)state;
    cps__loop *l;
    assert_int_equal(cps__loop_create(&l), 0);
    rec r = {0}, self = {0};
    /* 1 fires first and removes 2, which was due in the same turn. */
    r.victim = 2;
    assert_int_equal(cps__loop_timer_add(l, 1, 5, 0, on_timer, &r), 0);
    assert_int_equal(cps__loop_timer_add(l, 2, 5, 0, on_timer, &r), 0);
    assert_int_equal(cps__loop_timer_add(l, 3, 10, 10, remove_self, &self), 0);
    usleep(20 * 1000);
    assert_true(cps__loop_run_once(l, 0) >= 2);
    turn_until(l, &r, 2, 80);
    assert_int_equal(r.n, 1);
    assert_int_equal(r.ids[0], 1);
    assert_int_equal(self.n, 1);
    assert_int_equal(cps__loop_timer_armed(l, 2, NULL), 0);
    assert_int_equal(cps__loop_timer_armed(l, 3, NULL), 0);
    cps__loop_destroy(l);
}

static int count_hook(cps__loop *l, void *ctx, uint64_t now)
{
    (void)l, (void)now;
    ++*(int *)ctx;
    return 0;
}

static void before_sleep_every_turn(void **state)
{
    (void)state;
    cps__loop *l;
    assert_int_equal(cps__loop_create(&l), 0);
    int hooks = 0;
    cps__loop_before_sleep(l, count_hook, &hooks);
    for (int i = 0; i < 7; i++)
        assert_int_equal(cps__loop_run_once(l, 0), 0);
    assert_int_equal(hooks, 7);
    /* The hook also runs in cps__loop_run, before the turn a timer stops it in. */
    rec r = {.stop_after = 3};
    assert_int_equal(cps__loop_timer_add(l, 1, 0, 5, on_timer, &r), 0);
    assert_int_equal(cps__loop_run(l), 0);
    assert_int_equal(r.n, 3);
    assert_true(hooks >= 7 + 3);
    assert_int_equal(cps__loop_timer_del(l, 1), 0);
    cps__loop_before_sleep(l, NULL, NULL);
    assert_int_equal(cps__loop_run_once(l, 0), 0);
    assert_true(hooks >= 10);
    int before = hooks;
    assert_int_equal(cps__loop_run_once(l, 0), 0);
    assert_int_equal(hooks, before);
    cps__loop_destroy(l);
}

typedef struct pipe_ctx {
    int reads;
    char got[16];
    size_t len;
} pipe_ctx;

static int on_pipe(cps__loop *l, int fd, void *ctx, uint64_t now)
{
    (void)l, (void)now;
    pipe_ctx *p = ctx;
    ssize_t n = read(fd, p->got + p->len, sizeof p->got - p->len);
    if (n > 0)
        p->len += (size_t)n;
    p->reads++;
    return 0;
}

static void pipe_wakes_the_loop(void **state)
{
    (void)state;
    cps__loop *l;
    assert_int_equal(cps__loop_create(&l), 0);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pipe_ctx p = {0};
    assert_int_equal(cps__loop_fd_add(l, fds[0], on_pipe, &p), 0);
    /* Nothing written: a turn waits out its limit and calls nothing. */
    uint64_t t0 = cps__loop_clock_ms();
    assert_int_equal(cps__loop_run_once(l, 30), 0);
    assert_true(cps__loop_clock_ms() - t0 >= 25);
    assert_int_equal(p.reads, 0);
    /* Written: the next turn returns at once (long before its 5 s limit) with the data. */
    assert_int_equal(write(fds[1], "hi", 2), 2);
    t0 = cps__loop_clock_ms();
    assert_int_equal(cps__loop_run_once(l, 5000), 1);
    assert_true(cps__loop_clock_ms() - t0 < 2500);
    assert_int_equal(p.reads, 1);
    assert_memory_equal(p.got, "hi", 2);
    /* Removed: data waiting is no longer seen. */
    assert_int_equal(write(fds[1], "x", 1), 1);
    assert_int_equal(cps__loop_fd_del(l, fds[0]), 0);
    assert_int_equal(cps__loop_fd_del(l, fds[0]), CPS_ENOTFOUND);
    assert_int_equal(cps__loop_run_once(l, 20), 0);
    assert_int_equal(p.reads, 1);
    assert_int_equal(cps__loop_fd_add(l, -1, on_pipe, &p), CPS_EINVAL);
    close(fds[0]);
    close(fds[1]);
    cps__loop_destroy(l);
}

typedef struct order_ctx {
    int seen[4];
    int n;
} order_ctx;

static int on_ordered(cps__loop *l, int fd, void *ctx, uint64_t now)
{
    (void)l, (void)now;
    order_ctx *o = ctx;
    char c;
    if (read(fd, &c, 1) == 1 && o->n < 4)
        o->seen[o->n++] = c;
    return 0;
}

/* Several fds ready in one turn: those added "first" are served before the others, whatever
 * the order they were registered in. */
static void first_fds_are_served_first(void **state)
{
    (void)state;
    cps__loop *l;
    assert_int_equal(cps__loop_create(&l), 0);
    int a[2], b[2];
    assert_int_equal(pipe(a), 0);
    assert_int_equal(pipe(b), 0);
    order_ctx o = {0};
    assert_int_equal(cps__loop_fd_add(l, a[0], on_ordered, &o), 0);
    assert_int_equal(cps__loop_fd_add_first(l, b[0], on_ordered, &o), 0);
    assert_int_equal(write(a[1], "a", 1), 1);
    assert_int_equal(write(b[1], "b", 1), 1);
    assert_int_equal(cps__loop_run_once(l, 1000), 2);
    assert_int_equal(o.n, 2);
    assert_int_equal(o.seen[0], 'b');
    assert_int_equal(o.seen[1], 'a');
    for (int i = 0; i < 2; i++) {
        close(a[i]);
        close(b[i]);
    }
    cps__loop_destroy(l);
}

static int fail_timer(cps__loop *l, uint64_t id, void *ctx, uint64_t now)
{
    (void)l, (void)id, (void)now;
    ++*(int *)ctx;
    return CPS_EPROTO;
}

static void stop_and_errors_end_the_run(void **state)
{
    (void)state;
    cps__loop *l;
    assert_int_equal(cps__loop_create(&l), 0);
    /* A stop from before the run: it returns at once. */
    cps__loop_stop(l);
    assert_int_equal(cps__loop_stopped(l), 1);
    assert_int_equal(cps__loop_run(l), 0);
    cps__loop_resume(l);
    assert_int_equal(cps__loop_stopped(l), 0);
    /* A stop from a timer, while another periodic timer keeps the loop busy. */
    rec busy = {0}, stopper = {.stop_after = 1};
    assert_int_equal(cps__loop_timer_add(l, 1, 0, 1, on_timer, &busy), 0);
    assert_int_equal(cps__loop_timer_add(l, 2, 40, 0, on_timer, &stopper), 0);
    uint64_t t0 = cps__loop_clock_ms();
    assert_int_equal(cps__loop_run(l), 0);
    assert_true(cps__loop_clock_ms() - t0 >= 40);
    assert_int_equal(stopper.n, 1);
    assert_true(busy.n >= 2);
    cps__loop_resume(l);
    /* An error from a callback ends the run with that error. */
    int fails = 0;
    assert_int_equal(cps__loop_timer_add(l, 3, 5, 0, fail_timer, &fails), 0);
    assert_int_equal(cps__loop_run(l), CPS_EPROTO);
    assert_int_equal(fails, 1);
    cps__loop_destroy(l);
}

/* ---- a transport on the loop ---- */

typedef struct inbox {
    int n;
    uint64_t last_seq;
} inbox;

static void on_msg(void *ctx, void *buf, size_t len)
{
    inbox *in = ctx;
    cps__rx rx;
    if (cps__rx_parse(&rx, buf, len) == 0) {
        in->n++;
        in->last_seq = rx.hdr.req_seq;
        cps__rx_free(&rx);
    }
}

static void transport_on_the_loop(void **state)
{
    (void)state;
    cps__tp *rx, *tx;
    /* The receiver binds only after the sends: with it listening from the start, the connection
     * could be up before them and nothing would queue (it raced under ASan). */
    int free_port = cps__free_port();
    assert_true(free_port > 0);
    uint16_t port = (uint16_t)free_port, bound = 0;
    assert_int_equal(cps__tp_create(NULL, &rx), 0);
    assert_int_equal(cps__tp_create(NULL, &tx), 0);
    cps__loop *l;
    assert_int_equal(cps__loop_create(&l), 0);
    inbox in = {0}, unused = {0};
    cps__loop_tp arx, atx;
    assert_int_equal(cps__loop_tp_attach(&atx, l, tx, on_msg, &unused, 0), 0);
    char url[64];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%u", port);
    assert_int_equal(cps__tp_peer_set(tx, 1, url), 0);
    /* Sent before the connection is up: they queue, and the loop's NN_SNDFD watch flushes
     * them once it is. */
    enum { N = 40 };
    for (int i = 1; i <= N; i++) {
        cps__msg_hdr h = {.type = CPS_MSG_HEARTBEAT, .sender = 2, .req_seq = (uint64_t)i};
        assert_int_equal(cps__msg_send(tx, 1, &h, NULL, 0), 0);
    }
    assert_true(cps__tp_queued(tx) > 0);
    assert_int_equal(cps__tp_bind(rx, "127.0.0.1", port, &bound), 0);
    assert_int_equal(bound, port);
    assert_int_equal(cps__loop_tp_attach(&arx, l, rx, on_msg, &in, 4), 0);
    uint64_t end = cps__loop_clock_ms() + 5000;
    int turns = 0;
    while (in.n < N && cps__loop_clock_ms() < end) {
        int before = in.n;
        assert_true(cps__loop_run_once(l, 50) >= 0);
        assert_true(in.n - before <= 4); /* max_msgs per turn */
        turns++;
    }
    assert_int_equal(in.n, N);
    assert_int_equal(in.last_seq, N);
    assert_int_equal(cps__tp_queued(tx), 0);
    assert_true(turns >= N / 4);
    cps__loop_tp_detach(&atx);
    cps__loop_tp_detach(&arx);
    cps__loop_tp_detach(&arx); /* twice: a no-op */
    /* Detached: the inbox is no longer watched. */
    cps__msg_hdr h = {.type = CPS_MSG_HEARTBEAT, .sender = 2, .req_seq = 99};
    assert_int_equal(cps__msg_send(tx, 1, &h, NULL, 0), 0);
    assert_int_equal(cps__loop_run_once(l, 100), 0);
    assert_int_equal(in.n, N);
    cps__loop_destroy(l);
    cps__tp_destroy(tx);
    cps__tp_destroy(rx);
}

static void quiet_sink(void *ctx, int level, const char *subsystem, const char *line)
{
    (void)ctx, (void)level, (void)subsystem, (void)line;
}

int main(void)
{
    cps__log_set_sink(quiet_sink, NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(timers_fire_in_deadline_order),
        cmocka_unit_test(periodic_timer_rearms),
        cmocka_unit_test(callback_removes_timers),
        cmocka_unit_test(before_sleep_every_turn),
        cmocka_unit_test(pipe_wakes_the_loop),
        cmocka_unit_test(first_fds_are_served_first),
        cmocka_unit_test(stop_and_errors_end_the_run),
        cmocka_unit_test(transport_on_the_loop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
