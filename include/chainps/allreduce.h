/**
 * @file allreduce.h
 * @brief AllReduce among the workers of a job (hybrid training: dense tensors all-reduced,
 * large and sparse ones on the servers). Included by chainps.h.
 *
 * The workers taking part are the live workers of the scheduler's view, in rank order: no second
 * rendezvous. Messages travel worker to worker over the job's transport (authenticated with the
 * job's secret, like every other message). The reduction order is fixed by the members, so every
 * worker gets the same bits, and a run with the same workers gets them again (docs/collective.md).
 *
 * Every worker must call the collectives in the same order with the same lengths (as with MPI or
 * NCCL). A worker that dies in the middle of one is dropped by the next view; the collective is
 * then redone among the live workers under that view, and a result never mixes contributions of
 * two views.
 *
 * Progress: the collective advances while this client waits in any call (cps_allreduce_wait,
 * cps_allreduce, cps_wait, the blocking pushes and pulls): there is no background thread.
 */
#ifndef CHAINPS_ALLREDUCE_H
#define CHAINPS_ALLREDUCE_H

#include <stdint.h>

#include "chainps/export.h"

#ifdef __cplusplus
extern "C" {
#endif

struct cps_client;

/** An all-reduce started by cps_allreduce_async(), until cps_allreduce_wait() completes it. */
typedef struct cps_allreduce_handle cps_allreduce_handle;

/** What the workers' values combine into. */
typedef enum cps_reduce_op {
    CPS_REDUCE_SUM = 0, /**< the sum over the live workers */
    CPS_REDUCE_MEAN = 1 /**< the sum divided by the number of workers that took part */
} cps_reduce_op;

/**
 * @brief All-reduce `len` float32 values in place, blocking until every live worker has them.
 * @param[in,out] buf this worker's values in; the result out (the same bits on every worker).
 *        Untouched when the call fails.
 * @return 0, or CPS_EINVAL (NULL, len 0 or >= 2^32), CPS_ENOPEER (the job has more than one
 *         worker and none but this one has been alive for the unavailable timeout: nobody to
 *         reduce with, and no replacement came), CPS_ETIMEDOUT (no
 *         progress for the unavailable timeout, CHAINPS_UNAVAILABLE_TIMEOUT_MS), CPS_ESTALE_EPOCH
 *         (this worker was dropped from the view), CPS_ESHUTDOWN, CPS_ENOMEM.
 */
CPS_API int cps_allreduce(struct cps_client *c, float *buf, uint64_t len, cps_reduce_op op);

/**
 * @brief Start an all-reduce and return at once. Several may be outstanding: they run one after
 * another, in the order they were started (the same order on every worker).
 * @param[in,out] buf must stay valid and unmodified until cps_allreduce_wait() completes it.
 * @param[out] h the handle, owned by the caller until cps_allreduce_wait() completes (frees) it.
 * @return 0, or CPS_EINVAL, CPS_ENOMEM (nothing started).
 */
CPS_API int cps_allreduce_async(struct cps_client *c, float *buf, uint64_t len, cps_reduce_op op,
                                cps_allreduce_handle **h);

/**
 * @brief Wait for an asynchronous all-reduce.
 * @param[in] timeout_ms -1 waits until it completes or fails, 0 only checks.
 * @return 1 if it is still running after timeout_ms (the handle stays valid: wait again);
 *         otherwise its result (0 or an error of cps_allreduce()), and the handle is freed.
 *         CPS_EINVAL for a NULL handle.
 */
CPS_API int cps_allreduce_wait(cps_allreduce_handle *h, int timeout_ms);

/**
 * @brief Offer `buf` (the all-reduced parameters, say) to workers that replace a dead one: a
 * replacement's cps_allreduce_fetch() receives a copy, with `step`. The buffer is borrowed, not
 * copied: it must stay valid and hold a consistent state whenever this client is inside a call
 * (requests are served there), e.g. updated after each optimizer step. NULL withdraws it.
 * Call it again whenever the contents change (after every step): a replacement may fetch a large
 * buffer over several requests, and each call starts a new version, so it never assembles parts
 * of two.
 * Call it after the step's all-reduces: the all-reduces completed by then are the ones a
 * replacement that fetches this buffer counts as done (its first all-reduce is the next one).
 * @return 0, CPS_EINVAL (NULL client, or buf with len 0).
 */
CPS_API int cps_allreduce_share(struct cps_client *c, const float *buf, uint64_t len,
                                uint64_t step);

/**
 * @brief In a worker that replaces a dead one (`chainps launch --restart-workers`): copy the
 * buffer a live worker shares (cps_allreduce_share) into `buf`, before the first all-reduce.
 * Asks the live worker of the lowest rank, and another if that one dies. The answer also sets
 * where this worker's all-reduces join the others' (the one after the sharer's last) and leaves
 * it the result of that last one, which it gives to survivors that redo it, so that the job's
 * end cannot leave them waiting for a worker that never ran it. Without a fetch, a replacement
 * guesses that place from the chunks it receives. The answer comes in parts (any size: the
 * result always travels); nothing of it is used before all of it has arrived, but `buf` is
 * written as parts arrive, so after an error its contents are unspecified.
 * @param[out] step the step the live worker shared with its buffer (may be NULL).
 * @return 1: fetched; 0: this worker started with the job (nothing to fetch, buf untouched);
 *         CPS_ESHUTDOWN: the job has ended for this worker: the scheduler ended it, or the other
 *         workers finished their work without the one this worker replaces (it died in their
 *         last all-reduce) and left, as the scheduler says, so nobody will all-reduce with it
 *         (the only live workers left are replacements like this one, holding no state): a
 *         clean end, close the client and exit successfully;
 *         CPS_ESIZE (the shared buffer has another length), CPS_ENOTFOUND (the live worker
 *         shares nothing, or every worker died and was replaced: nobody holds a state),
 *         CPS_ENOPEER (after waiting CHAINPS_UNAVAILABLE_TIMEOUT_MS: no live worker holds a
 *         state, and a dead worker's replacement, which the fetch waited for, never came),
 *         CPS_ETIMEDOUT, CPS_EINVAL, CPS_EBUSY (an all-reduce of this client is running or
 *         queued: call it before the first).
 */
CPS_API int cps_allreduce_fetch(struct cps_client *c, float *buf, uint64_t len, uint64_t *step);

/** Counters of this client's all-reduces. */
typedef struct cps_allreduce_stats {
    uint64_t completed, failed;
    uint64_t restarts;      /**< collectives redone under a new view */
    uint64_t results_taken; /**< completed by a result another worker had already */
    uint64_t bytes_sent;    /**< payload bytes sent to other workers */
} cps_allreduce_stats;

/** @brief Copy the counters into *out (zeros before the first all-reduce, or for a NULL client).
 * Never fails; does nothing if out is NULL. */
CPS_API void cps_allreduce_stats_get(struct cps_client *c, cps_allreduce_stats *out);

#ifdef __cplusplus
}
#endif
#endif
