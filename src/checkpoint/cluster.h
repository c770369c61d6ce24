/**
 * @file cluster.h
 * @brief Checkpoints of a running job: export a consistent cut to safetensors, restore one into
 * a cluster (any number of servers and replicas: keys are laid out afresh for its view).
 *
 * Export: asks the scheduler for the view and the tensor registry (every tensor a worker
 * declared), then opens a read view on every range's tail at one training step (src/server/
 * cut.c: in sync mode exactly at a step boundary, the next one the whole job reaches; in async
 * and SSP modes at each range's current sequence number, recorded in the metadata), and streams
 * the tensors from those read views into a checkpoint written under a temporary name and renamed
 * when complete (src/checkpoint/ckpt.h). Training is not paused: the read views are LMDB read
 * transactions served by threads of their own.
 *
 * Failovers (issue 26): a sync cut is opened on every replica of a range, and a reader that dies
 * (its connection refuses, or the view drops it) hands its range to another replica's view at the
 * same sequence number (recovery/cutroute.h); probes and opens left unanswered by a dead server
 * go to the chain the next view names; a restarted scheduler is asked again. A range whose every
 * view is gone is cut again at a later step (or, with at_step, fails at once saying so); a range
 * without a live replica fails the export at once, naming it.
 *
 * Restore: verifies every checksum first, then sends each range's head the records (values,
 * optimizer state and step counts, and the step the job is at) as PUT updates, which the chain
 * replicates; returns once every range's tail holds them. Workers that declare their tensors
 * afterwards find them in place, and cps_tensor_step() tells them the step to resume from.
 *
 * Workers' local tensors (hybrid training's all-reduced parameters, include/chainps/
 * localstate.h): when the registry holds the workers' marker (kind CPS_DESC_LOCAL), the live
 * worker of the lowest rank is asked (CPS_MSG_LOCAL, worker/localset.h) for its listed tensors at
 * the cut's step (sync jobs with a dense server tensor; a worker already past it makes the export
 * cut again later, like a range past it) or at its next step boundary after the cut (async
 * jobs). A sync job without a dense server tensor (every tensor all-reduced, or only row-pushed
 * tables) takes its step from that worker: at_step exactly, or its next boundary, and the tables
 * are cut once that boundary's tensors are in. The worker sends them in chunks (worker/
 * localset.h), reassembled here in order; they go into the same checkpoint under their names,
 * marked "kind/<name>" = "local", with "local/step", "local/rank", "local/tensors" and the
 * worker's "local/meta/<key>" strings. Restore skips them: each worker reads them from the export
 * itself (cps_local_fetch).
 *
 * Not exported: raw keys (cps__raw_*; they have no name). Sparse tables are cut at the same
 * moment as the dense tensors, but sparse pushes are not aligned to steps, so a table may hold
 * rows pushed during the step after the cut (recorded per range as the sequence number).
 */
#ifndef CPS_CHECKPOINT_CLUSTER_H
#define CPS_CHECKPOINT_CLUSTER_H

#include <stddef.h>
#include <stdint.h>

#include "core/wire.h"

typedef struct cps__export_opts {
    const char *scheduler;    /**< "host:port" */
    const char *bind_host;    /**< where this tool listens for answers; NULL: 127.0.0.1 */
    const char *advertise;    /**< the address servers reach us at; NULL: bind_host */
    const unsigned char *key; /**< the job's key (32 bytes, see transport/auth.h); NULL: none */
    uint64_t at_step;         /**< sync jobs: cut exactly at this step (0: the next boundary) */
    uint64_t max_shard_bytes; /**< 0: one file */
    int timeout_ms;           /**< for the cut to open (each read: at most 30 s); 0: 120 s */
    int quiet_until_ready;    /**< log "not started" / "no tensors yet" at debug level only */
    /** A job that has not started or declared no tensor yet is waited for (within timeout_ms)
     * rather than refused: a user who starts a job and exports it at once (`chainps checkpoint
     * export` right after `launch`) gets the export, not "the job has not started yet". */
    int wait_start;
    /** Do not tell the scheduler of the checkpoint when it is complete: the caller moves it
     * elsewhere first, then calls cps__ckpt_announce with its final path. */
    int no_announce;
} cps__export_opts;

typedef struct cps__export_result {
    char path[1024];  /**< what a reader opens */
    uint64_t step;    /**< the step of the cut */
    uint64_t bytes;   /**< tensor data written */
    uint32_t tensors; /**< parameter tensors (optimizer state not counted) */
    double seconds;
} cps__export_result;

/**
 * @brief Export a consistent cut of the running job at opts->scheduler to `out` (a directory,
 * created if missing, receiving model.safetensors; or a path ending in .safetensors).
 * @return 0; CPS_ETIMEDOUT (scheduler or a server did not answer, or the step was not reached
 *         in time), CPS_ENOTFOUND (no tensor registered yet), CPS_EPAST (at_step is behind the
 *         job), CPS_EIO (writing failed: disk full...), CPS_EUNAVAILABLE (a range has no live
 *         replica), CPS_ENOMEM. Every error is logged with what failed. On error no checkpoint
 *         file is left and an earlier one of the same name is untouched.
 */
int cps__ckpt_export(const cps__export_opts *opts, const char *out, cps__export_result *res);

/**
 * @brief Tell the scheduler at opts->scheduler that the checkpoint at `path` (cut at `step`) is
 * complete, so `chainps status` and its /metrics show it as the last checkpoint. Export does
 * this itself unless opts->no_announce. Best effort: a scheduler that misses it shows an older
 * checkpoint. Returns 0, or the error of reaching the scheduler (logged).
 */
int cps__ckpt_announce(const cps__export_opts *opts, const char *path, uint64_t step);

typedef struct cps__restore_opts {
    const char *scheduler;
    const char *bind_host;
    const char *advertise;
    const unsigned char *key; /**< the job's key (32 bytes); NULL: none (an insecure job) */
    int timeout_ms;           /**< for each answer; 0: 120 s */
    /** Tensors of a file written elsewhere carry no optimizer description: use this one. */
    const cps__param_spec *default_spec;
    int release; /**< tell the scheduler to admit the workers it holds back (--hold-workers) */
} cps__restore_opts;

typedef struct cps__restore_result {
    uint64_t step;
    uint64_t bytes;
    uint32_t tensors;
    double seconds;
    int started;     /**< the job had started (CPS_EUNAVAILABLE otherwise: not yet, ask again) */
    int no_replica;  /**< failed because a range had no live replica left (logged by range) */
    uint32_t resent; /**< ranges streamed again (their head left the chain, or lost PUTs) */
} cps__restore_result;

/**
 * @brief Load checkpoint `from` into the cluster at opts->scheduler.
 * @return 0; CPS_ECORRUPT (a checksum or the structure is wrong: nothing was written),
 *         CPS_ENOTFOUND (a tensor the job's registry does not know, or optimizer state for a
 *         tensor that is not there), CPS_EINVAL (no optimizer description and no default),
 *         CPS_ETIMEDOUT, CPS_EIO, CPS_ENOMEM, or a server's refusal. Logged.
 *         CPS_EUNAVAILABLE: the job has not started (res->started 0: ask again later), or a
 *         range lost its last replica during the restore (res->no_replica 1). A server that dies
 *         during the restore is followed through the view: a range whose head changed is
 *         streamed again to its new head (recovery/restore_route.h, res->resent).
 */
int cps__ckpt_restore(const cps__restore_opts *opts, const char *from, cps__restore_result *res);

#endif
