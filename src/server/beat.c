/* A server's heartbeats, sent by a thread of their own.
 *
 * Why not from the event loop: one loop turn can take longer than the failure timeout without
 * anything being wrong (a 64 MB restore message applied in one transaction, a periodic sync
 * flushing many dirty pages, a machine whose two cores are shared by six processes under a
 * sanitizer), and the scheduler would declare a working server dead and move its chains on.
 * Why the loop still matters: a server whose loop is wedged serves nothing, so the thread stops
 * beating once the loop has not turned for BEAT_STALL_LIMIT_MS, and the scheduler then fails the
 * server over as if it had died. A process that is killed, paused (SIGSTOP) or cut off stops
 * beating at once, as before.
 *
 * The thread has its own transport (a cps_tp belongs to one thread) with the scheduler as its
 * only peer; what it sends (node id, view epoch, counters) is copied in by the loop each turn. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chainps/error.h"
#include "core/log.h"
#include "server.h"

#define SCHED_PEER          0u
#define BEAT_STALL_LIMIT_MS 30000u

struct server_beat {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    pthread_t thread;
    int stop;
    char sched_url[CPS_ADDR_MAX + 16];
    uint32_t period_ms;
    uint32_t stall_limit_ms;
    /* Copied in by the loop (cps__server_beat_publish), under lock. */
    int joined;
    uint32_t id;
    uint64_t epoch;
    uint64_t turn_ms; /* when the loop last turned */
    cps_node_stats stats;
};

static void deadline_after(struct timespec *ts, uint32_t ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    uint64_t ns = (uint64_t)ts->tv_nsec + (uint64_t)ms * 1000000u;
    ts->tv_sec += (time_t)(ns / 1000000000u);
    ts->tv_nsec = (long)(ns % 1000000000u);
}

static void *beat_main(void *arg)
{
    server_beat *b = arg;
    cps_tp *tp = NULL;
    if (cps__tp_create(&tp) != 0 || cps__tp_peer_set(tp, SCHED_PEER, b->sched_url) != 0) {
        /* Without heartbeats the scheduler declares us dead: say why loudly. */
        cps_log(CPS_LOG_ERROR, "server", "heartbeat thread cannot reach the scheduler at %s",
                b->sched_url);
        cps__tp_destroy(tp);
        return NULL;
    }
    int stalled = 0;
    pthread_mutex_lock(&b->lock);
    while (!b->stop) {
        uint64_t now = cps__now_ms();
        uint64_t idle = now > b->turn_ms ? now - b->turn_ms : 0;
        if (b->joined && idle <= b->stall_limit_ms) {
            if (stalled)
                cps_log(CPS_LOG_WARN, "server", "event loop turning again: heartbeats resume");
            stalled = 0;
            unsigned char payload[CPS_STATS_SIZE];
            cps__stats_encode(payload, &b->stats);
            cps_msg_hdr h = {.type = CPS_MSG_HEARTBEAT, .sender = b->id, .epoch = b->epoch};
            pthread_mutex_unlock(&b->lock);
            cps__msg_send(tp, SCHED_PEER, &h, payload, sizeof payload);
            cps__tp_poll(tp, 0, NULL, NULL, 0); /* flush one that had to queue */
            pthread_mutex_lock(&b->lock);
        } else if (b->joined && !stalled) {
            stalled = 1;
            cps_log(CPS_LOG_ERROR, "server",
                    "event loop has not turned for %llu ms: heartbeats stop, so the scheduler "
                    "fails this server over",
                    (unsigned long long)idle);
        }
        struct timespec ts;
        deadline_after(&ts, b->period_ms);
        while (!b->stop && pthread_cond_timedwait(&b->cond, &b->lock, &ts) != ETIMEDOUT)
            ;
    }
    pthread_mutex_unlock(&b->lock);
    cps__tp_destroy(tp);
    return NULL;
}

int cps__server_beat_start(server *s, const char *sched_url, uint32_t stall_limit_ms)
{
    server_beat *b = calloc(1, sizeof *b);
    if (!b)
        return CPS_ENOMEM;
    snprintf(b->sched_url, sizeof b->sched_url, "%s", sched_url);
    b->period_ms = s->cfg.heartbeat_ms;
    /* A loop stalled longer than the failure timeout is already suspect to itself (server.c);
     * the limit only has to be far above any honest turn. */
    uint32_t floor = 4 * s->cfg.dead_after_ms;
    if (!stall_limit_ms)
        stall_limit_ms = BEAT_STALL_LIMIT_MS > floor ? BEAT_STALL_LIMIT_MS : floor;
    b->stall_limit_ms = stall_limit_ms;
    b->turn_ms = cps__now_ms();
    pthread_condattr_t ca;
    int rc = pthread_condattr_init(&ca);
    if (rc == 0) {
        rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        rc = rc ? rc : pthread_cond_init(&b->cond, &ca);
        pthread_condattr_destroy(&ca);
    }
    if (rc != 0) {
        free(b);
        return CPS_ENOMEM;
    }
    pthread_mutex_init(&b->lock, NULL);
    /* SIGINT and SIGTERM are for the event loop (it stops the server cleanly): the thread is
     * created with them blocked, so they are never delivered to it. */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    rc = pthread_create(&b->thread, NULL, beat_main, b);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        pthread_cond_destroy(&b->cond);
        pthread_mutex_destroy(&b->lock);
        free(b);
        cps_log(CPS_LOG_ERROR, "server", "cannot start the heartbeat thread");
        return CPS_ENOMEM;
    }
    s->beat = b;
    return 0;
}

void cps__server_beat_publish(server *s, uint64_t now)
{
    server_beat *b = s->beat;
    if (!b)
        return;
    pthread_mutex_lock(&b->lock);
    b->joined = s->joined && !s->fenced;
    b->id = s->id;
    b->epoch = s->view.epoch;
    b->turn_ms = now;
    b->stats = s->stats;
    pthread_mutex_unlock(&b->lock);
}

void cps__server_beat_stop(server *s)
{
    server_beat *b = s->beat;
    if (!b)
        return;
    pthread_mutex_lock(&b->lock);
    b->stop = 1;
    pthread_cond_signal(&b->cond);
    pthread_mutex_unlock(&b->lock);
    pthread_join(b->thread, NULL);
    pthread_cond_destroy(&b->cond);
    pthread_mutex_destroy(&b->lock);
    free(b);
    s->beat = NULL;
}
