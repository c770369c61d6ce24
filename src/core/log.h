/* Logging: cps__log(level, subsystem, fmt, ...) checks the level before formatting.
 * The sink is replaceable so tests can capture or silence output. */
#ifndef CPS_CORE_LOG_H
#define CPS_CORE_LOG_H

#include <stdarg.h>

enum cps__log_severity { CPS_LOG_ERROR = 0, CPS_LOG_WARN = 1, CPS_LOG_INFO = 2, CPS_LOG_DEBUG = 3 };

/* Receives one formatted line (no trailing newline). `ctx` is the pointer given to set_sink. */
typedef void (*cps__log_sink_fn)(void *ctx, int level, const char *subsystem, const char *line);

extern int cps__log_level; /* lines above this level are not even formatted */

/* Set the level; default CPS_LOG_INFO. CHAINPS_VERBOSE / PS_VERBOSE map onto it (config.c). */
void cps__log_set_level(int level);
/* Replace the sink; NULL restores the default (stderr, with a timestamp and the node tag). */
void cps__log_set_sink(cps__log_sink_fn fn, void *ctx);
/* Tag printed in front of every default-sink line, e.g. "server 3" (copied). */
void cps__log_set_tag(const char *tag);

void cps__log_emit(int level, const char *subsystem, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Why the running public call failed, for cps_last_error_message() (error.h): every ERROR line
 * is recorded per thread as well as logged. A public call that can fail calls cps__why_clear()
 * first, so that what the caller reads after it belongs to that call. */
#define CPS__WHY_MAX 512 /* bytes kept of one line, with its terminating NUL */
void cps__why_clear(void);
/* The latest ERROR line recorded on this thread since the clear ("" if none): what an operation
 * that fails right after it was logged keeps as its reason. Valid until the next log line. */
const char *cps__why_latest(void);
/* Make `text` (copied; NULL or "" clears) this thread's reason: cps_wait gives the caller the
 * reason an asynchronous operation kept when it failed, maybe on another thread. */
void cps__why_set(const char *text);

#define cps__log(level, subsystem, ...)                                                            \
    do {                                                                                           \
        if ((level) <= cps__log_level)                                                             \
            cps__log_emit((level), (subsystem), __VA_ARGS__);                                      \
    } while (0)

#endif
