#include "log.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "chainps/error.h"

int cps__log_level = CPS_LOG_INFO;

static cps__log_sink_fn sink_fn;
static void *sink_ctx;
static char tag[64];
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

/* The ERROR lines of the public call running on this thread (cps_last_error_message): its
 * first, usually the cause ("no job secret: ..."), and, when it logged more, "; " and its latest,
 * usually what it gave up on ("declaring tensor w failed: ..."). Lines in between are in the log
 * only: a long wait can log many, and the first and last are what a caller needs. */
static _Thread_local struct {
    char text[CPS__WHY_MAX * 2 + 2];
    size_t first_len; /* length of the first line in text; text[0] == 0: none yet */
} why;

void cps__why_clear(void)
{
    why.text[0] = '\0';
    why.first_len = 0;
}

const char *cps__why_latest(void)
{
    return why.text[why.first_len] ? why.text + why.first_len + 2 : why.text;
}

static void why_record(const char *line)
{
    if (!why.text[0]) {
        snprintf(why.text, CPS__WHY_MAX, "%.*s", CPS__WHY_MAX - 1, line);
        why.first_len = strlen(why.text);
    } else if (strncmp(cps__why_latest(), line, CPS__WHY_MAX - 1) != 0) {
        /* A line repeated (the same retry failing again) is not a new reason. */
        snprintf(why.text + why.first_len, sizeof why.text - why.first_len, "; %.*s",
                 CPS__WHY_MAX - 1, line);
    }
}

void cps__why_set(const char *text)
{
    cps__why_clear();
    if (text && text[0])
        why_record(text);
}

const char *cps_last_error_message(void)
{
    return why.text;
}

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
    if (level == CPS_LOG_ERROR)
        why_record(line);

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
