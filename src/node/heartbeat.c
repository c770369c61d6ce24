/* Heartbeats from a thread of their own (see heartbeat.h). */
#include "node/heartbeat.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chainps/error.h"
#include "core/log.h"
#include "core/wire.h"
#include "node/msg.h"
#include "transport/transport.h"

#define SCHED_PEER 0u

struct cps_heartbeat {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    pthread_t thread;
    int stop;
    char sched_url[CPS_ADDR_MAX + 16];
    char who[16];
    unsigned char key[32];
    int keyed;
    uint32_t period_ms;
    uint32_t stall_limit_ms;
    /* Handed over by cps__heartbeat_publish, under lock. */
    int beating;
    uint32_t id;
    uint64_t epoch;
    uint64_t published_ms;
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
    cps_heartbeat *b = arg;
    cps_tp *tp = NULL;
    if (cps__tp_create(b->keyed ? b->key : NULL, &tp) != 0 ||
        cps__tp_peer_set(tp, SCHED_PEER, b->sched_url) != 0) {
        /* Without heartbeats the scheduler declares us dead: say why loudly. */
        cps_log(CPS_LOG_ERROR, b->who, "heartbeat thread cannot reach the scheduler at %s",
                b->sched_url);
        cps__tp_destroy(tp);
        return NULL;
    }
    int stalled = 0;
    pthread_mutex_lock(&b->lock);
    while (!b->stop) {
        uint64_t now = cps__now_ms();
        uint64_t idle = now > b->published_ms ? now - b->published_ms : 0;
        if (b->beating && (!b->stall_limit_ms || idle <= b->stall_limit_ms)) {
            if (stalled)
                cps_log(CPS_LOG_WARN, b->who, "event loop turning again: heartbeats resume");
            stalled = 0;
            unsigned char payload[CPS_STATS_SIZE];
            cps__stats_encode(payload, &b->stats);
            cps_msg_hdr h = {.type = CPS_MSG_HEARTBEAT, .sender = b->id, .epoch = b->epoch};
            pthread_mutex_unlock(&b->lock);
            cps__msg_send(tp, SCHED_PEER, &h, payload, sizeof payload);
            cps__tp_poll(tp, 0, NULL, NULL, 0); /* flush one that had to queue */
            pthread_mutex_lock(&b->lock);
        } else if (b->beating && !stalled) {
            stalled = 1;
            cps_log(CPS_LOG_ERROR, b->who,
                    "event loop has not turned for %llu ms: heartbeats stop, so the scheduler "
                    "fails this node over",
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

int cps__heartbeat_start(const char *sched_url, const unsigned char *key, uint32_t period_ms,
                         uint32_t stall_limit_ms, const char *who, cps_heartbeat **out)
{
    cps_heartbeat *b = calloc(1, sizeof *b);
    if (!b)
        return CPS_ENOMEM;
    if (key) {
        memcpy(b->key, key, sizeof b->key);
        b->keyed = 1;
    }
    snprintf(b->sched_url, sizeof b->sched_url, "%s", sched_url);
    snprintf(b->who, sizeof b->who, "%s", who);
    b->period_ms = period_ms;
    b->stall_limit_ms = stall_limit_ms;
    b->published_ms = cps__now_ms();
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
    /* SIGINT and SIGTERM are for the node's own thread (it stops cleanly): this one is created
     * with them blocked, so they are never delivered to it. */
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
        cps_log(CPS_LOG_ERROR, who, "cannot start the heartbeat thread");
        return CPS_ENOMEM;
    }
    *out = b;
    return 0;
}

void cps__heartbeat_publish(cps_heartbeat *b, int beating, uint32_t id, uint64_t epoch,
                            const cps_node_stats *stats, uint64_t now)
{
    if (!b)
        return;
    pthread_mutex_lock(&b->lock);
    b->beating = beating;
    b->id = id;
    b->epoch = epoch;
    b->published_ms = now;
    if (stats)
        b->stats = *stats;
    else
        memset(&b->stats, 0, sizeof b->stats);
    pthread_mutex_unlock(&b->lock);
}

void cps__heartbeat_stop(cps_heartbeat *b)
{
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
}
