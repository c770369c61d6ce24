/* Heartbeats from a thread of their own (see heartbeat.h). */
#include "node/heartbeat.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "chainps/error.h"
#include "core/log.h"
#include "core/wire.h"
#include "node/loop.h"
#include "node/msg.h"
#include "transport/transport.h"

#define SCHED_PEER 0u

struct cps__heartbeat {
    pthread_mutex_t lock;
    pthread_t thread;
    int stop;
    int wake[2]; /* a pipe: a byte written wakes the thread's loop to stop */
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
    cps__node_stats stats;
};

/* The thread's loop state: its socket and whether the beats have paused. */
typedef struct beat_ctx {
    cps__heartbeat *b;
    cps__tp *tp;
    int stalled;
} beat_ctx;

/* Every period_ms: beat, unless the node's loop has not turned for the stall limit. */
static int on_beat(cps__loop *l, uint64_t id, void *ctx, uint64_t now)
{
    (void)l, (void)id;
    beat_ctx *t = ctx;
    cps__heartbeat *b = t->b;
    pthread_mutex_lock(&b->lock);
    uint64_t idle = now > b->published_ms ? now - b->published_ms : 0;
    if (b->beating && (!b->stall_limit_ms || idle <= b->stall_limit_ms)) {
        if (t->stalled)
            cps__log(CPS_LOG_WARN, b->who, "event loop turning again: heartbeats resume");
        t->stalled = 0;
        unsigned char payload[CPS_STATS_SIZE];
        cps__stats_encode(payload, &b->stats);
        cps__msg_hdr h = {.type = CPS_MSG_HEARTBEAT, .sender = b->id, .epoch = b->epoch};
        pthread_mutex_unlock(&b->lock);
        /* One that has to queue is flushed by the loop when the socket can take it. */
        cps__msg_send(t->tp, SCHED_PEER, &h, payload, sizeof payload);
        return 0;
    }
    if (b->beating && !t->stalled) {
        t->stalled = 1;
        cps__log(CPS_LOG_ERROR, b->who,
                 "event loop has not turned for %llu ms: heartbeats stop, so the scheduler "
                 "fails this node over",
                 (unsigned long long)idle);
    }
    pthread_mutex_unlock(&b->lock);
    return 0;
}

/* cps__heartbeat_stop wrote to the pipe. */
static int on_wake(cps__loop *l, int fd, void *ctx, uint64_t now)
{
    (void)fd, (void)now;
    cps__heartbeat *b = ctx;
    pthread_mutex_lock(&b->lock);
    if (b->stop)
        cps__loop_stop(l);
    pthread_mutex_unlock(&b->lock);
    return 0;
}

static void *beat_main(void *arg)
{
    cps__heartbeat *b = arg;
    beat_ctx t = {b, NULL, 0};
    cps__loop *l = NULL;
    cps__loop_tp att = {0};
    if (cps__tp_create(b->keyed ? b->key : NULL, &t.tp) != 0 ||
        cps__tp_peer_set(t.tp, SCHED_PEER, b->sched_url) != 0 || cps__loop_create(&l) != 0 ||
        cps__loop_tp_attach(&att, l, t.tp, NULL, NULL, 0) != 0 ||
        cps__loop_fd_add(l, b->wake[0], on_wake, b) != 0 ||
        cps__loop_timer_add(l, 1, 0, b->period_ms, on_beat, &t) != 0) {
        /* Without heartbeats the scheduler declares us dead: say why loudly. */
        cps__log(CPS_LOG_ERROR, b->who, "heartbeat thread cannot reach the scheduler at %s",
                 b->sched_url);
    } else if (cps__loop_run(l) != 0) {
        cps__log(CPS_LOG_ERROR, b->who, "heartbeat thread stopped on an error");
    }
    cps__loop_tp_detach(&att);
    cps__loop_destroy(l);
    cps__tp_destroy(t.tp);
    return NULL;
}

int cps__heartbeat_start(const char *sched_url, const unsigned char *key, uint32_t period_ms,
                         uint32_t stall_limit_ms, const char *who, cps__heartbeat **out)
{
    cps__heartbeat *b = calloc(1, sizeof *b);
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
    if (pipe(b->wake) != 0) {
        cps__log(CPS_LOG_ERROR, who, "cannot make the heartbeat thread's wake-up pipe: %s",
                 strerror(errno));
        free(b);
        return CPS_EIO;
    }
    /* Programs the node starts (a training script's children) must not hold it open. */
    fcntl(b->wake[0], F_SETFD, FD_CLOEXEC);
    fcntl(b->wake[1], F_SETFD, FD_CLOEXEC);
    int rc;
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
        close(b->wake[0]);
        close(b->wake[1]);
        pthread_mutex_destroy(&b->lock);
        free(b);
        cps__log(CPS_LOG_ERROR, who, "cannot start the heartbeat thread");
        return CPS_ENOMEM;
    }
    *out = b;
    return 0;
}

void cps__heartbeat_publish(cps__heartbeat *b, int beating, uint32_t id, uint64_t epoch,
                            const cps__node_stats *stats, uint64_t now)
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

void cps__heartbeat_stop(cps__heartbeat *b)
{
    if (!b)
        return;
    pthread_mutex_lock(&b->lock);
    b->stop = 1;
    pthread_mutex_unlock(&b->lock);
    /* The byte wakes the thread's poll; nothing reads it, the pipe is closed below. */
    while (write(b->wake[1], "s", 1) < 0 && errno == EINTR)
        ;
    pthread_join(b->thread, NULL);
    close(b->wake[0]);
    close(b->wake[1]);
    pthread_mutex_destroy(&b->lock);
    free(b);
}
