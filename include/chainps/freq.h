/**
 * @file freq.h
 * @brief Communication frequency and warm-up (TensorFlow's parameter-server guide's two knobs;
 * the C side of `chainps.torch.DistributedOptimizer(sync_every=, warmup_steps=)`), for
 * all-reduced parameters and, without the warm-up, for parameters on the servers. Included by
 * chainps.h.
 *
 * A training program that keeps its parameters on every worker and all-reduces their gradients
 * (cps_allreduce) registers the gradient buffers, and the buffers that make up its state
 * (parameters first, then the local optimizer's state), with a cps_freq. Every step it calls
 *
 *     compute the gradients into the registered buffers
 *     if (cps_freq_grad(f) == CPS_FREQ_APPLY) apply the optimizer with them
 *     cps_freq_step_end(f)
 *
 * - `sync_every` = k: gradient accumulation. The gradients of k consecutive steps are summed
 *   locally in a fixed order, divided by k and all-reduced (mean) once: the update is that of a
 *   k times larger batch, every worker gets the same bits, and the ring carries 1/k of the
 *   bytes. On the other k-1 steps cps_freq_grad() returns CPS_FREQ_HOLD: the parameters do not
 *   move. (Not local SGD: averaging parameters that k optimizer steps moved apart lets an
 *   optimizer with state, momentum or Adam, drift apart between averages, and the result is no
 *   longer the large-batch update; docs/collective.md.)
 * - `warmup_steps` = n: for the job's steps 0..n-1 each worker applies its own gradient
 *   (CPS_FREQ_APPLY, the buffers untouched, nothing sent). At the end of step n-1,
 *   cps_freq_step_end() all-reduces (mean) every registered state buffer, so every worker
 *   continues from the same bits. Averaging rather than taking rank 0's values keeps what every
 *   worker learned during its warm-up.
 *
 * Parameters on the servers (cfg.target = CPS_FREQ_SERVERS): the same windows, but
 * cps_freq_grad() all-reduces nothing: at the window's last step it writes the window's sum / k
 * into the gradient buffers and answers CPS_FREQ_APPLY, and the program pushes them
 * (cps_push_pull); on the other steps it answers CPS_FREQ_HOLD and the program sends nothing, so
 * the servers see 1/k of the pushes, each the mean of k steps' gradients. In sync mode the
 * servers still sum the workers' pushes in rank order: the same bits in every run for a given k.
 * A warm-up needs the parameters on the workers, so it is refused in this mode.
 *
 * The step windows are counted from the job's step (cfg.start_step + the steps ended since), so a
 * worker that replaces a dead one (cps_allreduce_fetch) synchronises at the same steps as the
 * others. Every worker must use the same k, n and buffer lengths (as for cps_allreduce). With the
 * same workers and the same k and n, a run gives the same bits again.
 *
 * Threading: a cps_freq is used by one thread at a time (the client it wraps may be shared).
 * Bytes: the all-reduces it makes are counted in cps_allreduce_stats_get().
 */
#ifndef CHAINPS_FREQ_H
#define CHAINPS_FREQ_H

#include <stddef.h>
#include <stdint.h>

#include "chainps/export.h"

#ifdef __cplusplus
extern "C" {
#endif

struct cps_client;

/** The schedule of one set of all-reduced buffers; see the file comment. */
typedef struct cps_freq cps_freq;

/** Largest `sync_every`: a larger k is taken for a mistake (a negative number cast, say). */
#define CPS_FREQ_MAX_SYNC_EVERY (1 << 20)
/** Largest `warmup_steps` (2^32). */
#define CPS_FREQ_MAX_WARMUP (INT64_C(1) << 32)

/** cps_freq_grad()'s verdicts. */
enum {
    CPS_FREQ_HOLD = 0, /**< gradient accumulated: do not step the optimizer */
    CPS_FREQ_APPLY = 1 /**< step the optimizer with the gradient buffers as they are now */
};

/** A float32 buffer, borrowed: it must stay valid until cps_freq_destroy(). */
typedef struct cps_freq_buf {
    float *data;
    uint64_t len; /**< values, >= 1 */
} cps_freq_buf;

/** Where the gradients go once a window is complete. */
typedef enum cps_freq_target {
    CPS_FREQ_RING = 0,   /**< all-reduced (mean) among the workers by cps_freq_grad() */
    CPS_FREQ_SERVERS = 1 /**< left in the buffers for the program to push to the servers */
} cps_freq_target;

typedef struct cps_freq_config {
    int64_t sync_every;     /**< k, 1 .. CPS_FREQ_MAX_SYNC_EVERY (1: all-reduce every step) */
    int64_t warmup_steps;   /**< n, 0 .. CPS_FREQ_MAX_WARMUP (0: no warm-up) */
    uint64_t start_step;    /**< the job's step this worker starts at: 0, or the step
                                 cps_allreduce_fetch() returned to a replacement */
    cps_freq_target target; /**< CPS_FREQ_RING (0, the default) or CPS_FREQ_SERVERS */
} cps_freq_config;

/**
 * @brief Create a schedule over the gradient buffers `grads` and the state buffers `state`.
 * @param[in] c the client whose ring all-reduces (borrowed: outlives the cps_freq).
 * @param[in] cfg copied.
 * @param[in] grads `ngrads` gradient buffers (the array is copied, the buffers borrowed); their
 *        total length must be below 2^32 values (one all-reduce carries them all).
 * @param[in] state `nstate` buffers averaged at the end of the warm-up, in this order (the same
 *        on every worker): the parameters, then the optimizer's state. May be NULL with nstate 0
 *        when warmup_steps is 0.
 * @param[out] out the new schedule, owned by the caller (cps_freq_destroy()).
 * @return 0, or CPS_EINVAL (NULL c, cfg or out; sync_every outside 1..CPS_FREQ_MAX_SYNC_EVERY;
 *         warmup_steps outside 0..CPS_FREQ_MAX_WARMUP; no gradient buffer; a NULL or empty
 *         buffer; gradients of 2^32 values or more; warmup_steps > 0 with no state buffer or with
 *         CPS_FREQ_SERVERS; an unknown target: the
 *         log and cps_last_error_message() name which), CPS_ENOMEM. Nothing is created on error.
 */
CPS_API int cps_freq_create(struct cps_client *c, const cps_freq_config *cfg,
                            const cps_freq_buf *grads, size_t ngrads, const cps_freq_buf *state,
                            size_t nstate, cps_freq **out);

/**
 * @brief This step's gradients are in the gradient buffers: say what to do with them.
 * During the warm-up: CPS_FREQ_APPLY, the buffers untouched. After it: the gradients are added
 * to the window's sum; at the window's last step (every k-th) the sum divided by k is all-reduced
 * (mean; CPS_FREQ_SERVERS: not all-reduced) and written back into the gradient buffers:
 * CPS_FREQ_APPLY; otherwise CPS_FREQ_HOLD, the buffers untouched.
 * @return CPS_FREQ_APPLY, CPS_FREQ_HOLD, or an error of cps_allreduce(), or CPS_EINVAL (NULL, or
 *         called twice without cps_freq_step_end()). After an all-reduce error the schedule is
 *         poisoned: every later call returns CPS_EPOISONED (the window's sum no longer matches
 *         the other workers'); destroy it.
 */
CPS_API int cps_freq_grad(cps_freq *f);

/**
 * @brief End the step (after the optimizer step, if any). At the end of the warm-up's last step,
 * all-reduces (mean) every state buffer so that every worker holds the same bits.
 * @return 1 if it averaged the state now, 0 otherwise, or CPS_EINVAL (NULL, or no
 *         cps_freq_grad() since the last call), CPS_EPOISONED, or an error of cps_allreduce()
 *         (which poisons the schedule).
 */
CPS_API int cps_freq_step_end(cps_freq *f);

/** Counters of a schedule. */
typedef struct cps_freq_stats {
    uint64_t steps;    /**< steps ended (cps_freq_step_end) */
    uint64_t syncs;    /**< windows completed (gradient all-reduces made, or pushes due) */
    uint64_t held;     /**< steps that returned CPS_FREQ_HOLD */
    uint64_t averaged; /**< 1 once the warm-up's state average is done */
} cps_freq_stats;

/** @brief Copy the counters into *out (zeros for a NULL schedule). */
CPS_API void cps_freq_stats_get(const cps_freq *f, cps_freq_stats *out);

/** @brief The job's step the next cps_freq_grad() belongs to (cfg.start_step + steps ended). */
CPS_API uint64_t cps_freq_step(const cps_freq *f);

/** @brief Free the schedule (not the buffers, not the client). NULL is a no-op. */
CPS_API void cps_freq_destroy(cps_freq *f);

#ifdef __cplusplus
}
#endif
#endif
