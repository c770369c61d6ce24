/**
 * @file error.h
 * @brief chainps status codes: one table, one convention.
 *
 * Every fallible chainps function returns an `int`: 0 (CPS_OK) on success or a
 * negative `CPS_E...` code. cps_strerror() and cps_err_name() turn a code into
 * text. Codes are stable and also travel on the wire in error replies.
 */
#ifndef CHAINPS_ERROR_H
#define CHAINPS_ERROR_H

#include "chainps/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, value, message). Values are part of the wire protocol: never renumber. */
#define CPS_ERRNO_MAP(X)                                                                           \
    X(EINVAL, -1, "invalid argument")                                                              \
    X(ENOMEM, -2, "out of memory")                                                                 \
    X(ETIMEDOUT, -3, "timed out")                                                                  \
    X(ESTALE_EPOCH, -4, "stale view epoch")                                                        \
    X(ENOTFOUND, -5, "not found")                                                                  \
    X(ESTORE, -6, "storage error")                                                                 \
    X(ETRANSPORT, -7, "transport error")                                                           \
    X(EUNAVAILABLE, -8, "no replica available")                                                    \
    X(EPROTO, -9, "malformed or unexpected message")                                               \
    X(ECORRUPT, -10, "corrupt data")                                                               \
    X(ESIZE, -11, "length mismatch")                                                               \
    X(EEXIST, -12, "already exists with a different definition")                                   \
    X(EUNKNOWN_NODE, -13, "message from an unknown node")                                          \
    X(ECONFIG, -14, "bad configuration")                                                           \
    X(EPOISONED, -15, "node poisoned by an earlier fatal error")                                   \
    X(ECLOSED, -16, "closed")                                                                      \
    X(EAGAIN, -17, "try again")                                                                    \
    X(EIO, -18, "input/output error")                                                              \
    X(ENOTSUP, -19, "not supported")                                                               \
    X(ESHUTDOWN, -20, "job is shutting down")                                                      \
    X(EPAST, -21, "already past the requested training step")                                      \
    X(EBUSY, -22, "in use by another process")                                                     \
    X(ENOSPC, -23, "disk full")                                                                    \
    X(ESCHEDULER, -24, "the scheduler is gone")                                                    \
    X(ENOPEER, -25, "no live peer worker to take part")

/** Status codes. CPS_OK is 0; every error is negative. */
enum cps_err {
    CPS_OK = 0,
#define CPS_ERR_ENUM_(name, val, msg) CPS_##name = (val),
    CPS_ERRNO_MAP(CPS_ERR_ENUM_)
#undef CPS_ERR_ENUM_
};

/**
 * @brief Human-readable text of a status code.
 * @param[in] err a status code (any int).
 * @return a static string; never NULL ("unknown error" for unknown codes).
 */
CPS_API const char *cps_strerror(int err);

/**
 * @brief Symbolic name of a status code, e.g. "CPS_ETIMEDOUT".
 * @param[in] err a status code (any int).
 * @return a static string; never NULL ("CPS_E?" for unknown codes).
 */
CPS_API const char *cps_err_name(int err);

/**
 * @brief Why the last failing chainps call on this thread failed, in the log's words.
 *
 * The code says what kind of failure (CPS_ECONFIG); this says why, with the same text the call
 * logged at ERROR level, e.g. "no job secret: give --secret-file FILE (or
 * CHAINPS_SECRET_FILE=FILE; ...)". A call that logs several ERROR lines gives its first (usually
 * the cause) and, after "; ", its latest (usually what it gave up on). Every call of the worker
 * API that returns an error code (cps_open, cps_close, cps_mode_get, the declares,
 * cps_tensor_compress, the pushes and pulls, cps_wait, cps_wait_result, cps_barrier, the raw and
 * rows calls) starts by clearing it, so read it right after the call that failed, on the same
 * thread. cps_wait and cps_wait_result of a failed asynchronous operation give the reason the
 * operation kept when it failed, whichever thread's call noticed. Some failures log nothing (a NULL
 * argument: CPS_EINVAL): then it is "".
 *
 * @return a thread-local NUL-terminated string owned by the library (never NULL, "" when the
 *         call logged no error), valid until the next chainps call on this thread. Thread-safe.
 */
CPS_API const char *cps_last_error_message(void);

#ifdef __cplusplus
}
#endif
#endif
