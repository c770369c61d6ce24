#include "log.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

int cps__log_level = CPS_LOG_INFO;

static cps__log_sink_fn sink_fn;
static void *sink_ctx;
static char tag[64];
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *level_name(int level)
{
    static const char *names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
    return (level >= 0 && level <= CPS_LOG_DEBUG) ? names[level] : "?";
}

void cps__log_set_level(int level)
{
    cps__log_level = level;
}

void cps__log_set_sink(cps__log_sink_fn fn, void *ctx)
{
    pthread_mutex_lock(&log_lock);
    sink_fn = fn;
    sink_ctx = ctx;
    pthread_mutex_unlock(&log_lock);
}

void cps__log_set_tag(const char *t)
{
    pthread_mutex_lock(&log_lock);
    snprintf(tag, sizeof tag, "%s", t ? t : "");
    pthread_mutex_unlock(&log_lock);
}

void cps__log_emit(int level, const char *subsystem, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);

    pthread_mutex_lock(&log_lock);
    if (sink_fn) {
        sink_fn(sink_ctx, level, subsystem, line);
    } else {
        struct timespec ts;
        struct tm tm;
        clock_gettime(CLOCK_REALTIME, &ts);
        gmtime_r(&ts.tv_sec, &tm);
        /* One fprintf per line so lines from processes sharing a terminal stay whole. */
        fprintf(stderr, "%02d:%02d:%02d.%03ld %s%s%-5s %s: %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
                ts.tv_nsec / 1000000, tag, tag[0] ? " " : "", level_name(level), subsystem, line);
    }
    pthread_mutex_unlock(&log_lock);
}
