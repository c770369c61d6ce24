/* The heartbeat thread (src/node/heartbeat.c) against a stand-in scheduler inbox on 127.0.0.1:
 * beats go on while the node's loop is in one long turn, stop once nothing was published for the
 * stall limit, resume when the loop turns again, never go out before joining or once fenced, and
 * without a stall limit never stop. Every wait is a poll loop with a deadline. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "chainps/error.h"

static const unsigned char KEY[32] = "chainps heartbeat unit test key";
#include "core/log.h"
#include "node/msg.h"
#include "node/heartbeat.h"
#include "transport/transport.h"

typedef struct beats {
    unsigned n;      /* heartbeats from node 7 */
    unsigned other;  /* anything else */
    uint64_t epoch;  /* of the last heartbeat */
    uint64_t pushes; /* stats.msgs_in of the last heartbeat */
} beats;

static void on_msg(void *ctx, void *buf, size_t len)
{
    beats *b = ctx;
    cps__rx rx;
    if (cps__rx_parse(&rx, buf, len) != 0) {
        b->other++;
        return;
    }
    if (rx.hdr.type == CPS_MSG_HEARTBEAT && rx.hdr.sender == 7 && rx.len >= CPS_STATS_SIZE) {
        cps__node_stats st;
        cps__stats_decode(rx.payload, &st);
        b->n++;
        b->epoch = rx.hdr.epoch;
        b->pushes = st.msgs_in;
    } else {
        b->other++;
    }
    cps__rx_free(&rx);
}

/* Count what arrives over the next `ms` milliseconds. */
static beats listen_for(cps__tp *tp, uint64_t ms)
{
    beats b = {0};
    uint64_t end = cps__now_ms() + ms;
    for (uint64_t now = cps__now_ms(); now < end; now = cps__now_ms())
        cps__tp_poll(tp, (int)(end - now), on_msg, &b, 0);
    return b;
}

static void quiet_sink(void *ctx, int level, const char *subsystem, const char *line)
{
    (void)ctx, (void)level, (void)subsystem, (void)line;
}

/* An inbox on 127.0.0.1 playing the scheduler; its URL into url[64]. */
static cps__tp *stand_in_scheduler(char *url)
{
    cps__tp *sched = NULL;
    uint16_t port = 0;
    assert_int_equal(cps__tp_create(KEY, &sched), 0);
    assert_int_equal(cps__tp_bind(sched, "127.0.0.1", 0, &port), 0);
    snprintf(url, 64, "tcp://127.0.0.1:%u", port);
    return sched;
}

static void beats_follow_the_loop(void **state)
{
    (void)state;
    char url[64];
    cps__tp *sched = stand_in_scheduler(url);

    cps__node_stats st;
    memset(&st, 0, sizeof st);
    st.msgs_in = 11;
    cps__heartbeat *hb = NULL;
    assert_int_equal(cps__heartbeat_start(url, KEY, 20, 600, "server", &hb), 0);

    /* Not joined yet: nothing is sent. */
    cps__heartbeat_publish(hb, 0, 7, 3, &st, cps__now_ms());
    beats b = listen_for(sched, 300);
    assert_int_equal(b.n, 0);

    /* Joined, then one long turn (no publish) past a 100 ms failure timeout, short of the stall
     * limit: the scheduler keeps hearing from us, with what the loop handed over. */
    cps__heartbeat_publish(hb, 1, 7, 3, &st, cps__now_ms());
    b = listen_for(sched, 350);
    assert_true(b.n >= 3);
    assert_int_equal(b.epoch, 3);
    assert_int_equal(b.pushes, 11);

    /* Past the stall limit (600 ms since the last turn): the beats stop. */
    listen_for(sched, 400);
    b = listen_for(sched, 400);
    assert_int_equal(b.n, 0);

    /* The loop turns again, with a new view: the beats resume and carry it. */
    st.msgs_in = 12;
    cps__heartbeat_publish(hb, 1, 7, 4, &st, cps__now_ms());
    b = listen_for(sched, 300);
    assert_true(b.n >= 2);
    assert_int_equal(b.epoch, 4);
    assert_int_equal(b.pushes, 12);

    /* Fenced (declared dead): silent again, even while the loop turns. */
    cps__heartbeat_publish(hb, 0, 7, 4, &st, cps__now_ms());
    listen_for(sched, 100);
    b = listen_for(sched, 200);
    assert_int_equal(b.n, 0);
    assert_int_equal(b.other, 0);

    cps__heartbeat_stop(hb);
    cps__heartbeat_stop(NULL); /* a no-op */
    cps__tp_destroy(sched);
}

/* A worker's: no stall limit, so one publish keeps it beating however long the caller computes. */
static void no_limit_beats_on(void **state)
{
    (void)state;
    char url[64];
    cps__tp *sched = stand_in_scheduler(url);
    cps__heartbeat *hb = NULL;
    assert_int_equal(cps__heartbeat_start(url, KEY, 20, 0, "worker", &hb), 0);
    cps__heartbeat_publish(hb, 1, 7, 0, NULL, cps__now_ms());
    listen_for(sched, 700);
    beats b = listen_for(sched, 300);
    assert_true(b.n >= 3);
    assert_int_equal(b.pushes, 0);
    cps__heartbeat_stop(hb);
    cps__tp_destroy(sched);
}

int main(void)
{
    cps__log_set_sink(quiet_sink, NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(beats_follow_the_loop),
        cmocka_unit_test(no_limit_beats_on),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
