/**
 * @file localstate.h
 * @brief Tensors the workers hold (hybrid training's all-reduced parameters and their local
 * optimizer's state) in the job's checkpoints. Included by chainps.h.
 *
 * A worker lists its local tensors (cps_local_add, borrowed buffers) and marks every step
 * boundary (cps_local_commit). An export (`chainps checkpoint export`, periodic checkpoints)
 * tells the live worker of the lowest rank the step it cuts the servers at; at that boundary the
 * worker copies its listed tensors to the exporter, which writes them into the same safetensors
 * export as the servers' tensors, marked `kind/<name>` = "local" in its metadata
 * (docs/checkpoints.md). In a sync job every worker holds the same bits of its all-reduced
 * tensors, so one worker's copy is every worker's. In a sync job with no dense server tensor
 * (every tensor all-reduced, or only row-pushed tables on the servers, which then have no step
 * boundary) the committed steps are the job's: the export (and `--checkpoint-every N`) cuts at
 * the boundary the worker commits. In async jobs the worker gives the state of its next boundary
 * after the servers' cut ("local/step" records it).
 *
 * Several exports may wait at once (up to 8 per worker; a ninth makes the oldest waiting one
 * fail with CPS_EAGAIN). The tensors travel in chunks of CHAINPS_LOCAL_CHUNK bytes (default
 * 8 MiB, 64 bytes to 256 MiB), so their total size is not limited by a message's.
 *
 * A job restored from an export (`chainps launch --restore-from PATH` hands PATH to the workers as
 * CHAINPS_RESTORE_FROM) gives every worker the same tensors back through cps_local_fetch.
 *
 * Thread-safety: as every call on a client (its lock). The listed buffers are read only inside
 * cps_local_commit, which copies them without holding the client's lock (other threads' calls on
 * the client go on meanwhile; they must not withdraw or re-point a tensor during the commit).
 */
#ifndef CHAINPS_LOCALSTATE_H
#define CHAINPS_LOCALSTATE_H

#include <stdint.h>

#include "chainps/export.h"

#ifdef __cplusplus
extern "C" {
#endif

struct cps_client;

/**
 * @brief List (or re-point, or with buf NULL withdraw) a local float32 tensor for checkpoints.
 * @param[in] name 1..255 bytes, unique among the job's tensors (server tensors included: an
 *            export refuses a name both hold). Copied.
 * @param[in] buf  borrowed: must stay valid, and hold the state of the step last given to
 *            cps_local_commit whenever cps_local_commit is called, until withdrawn or cps_close.
 * @param[in] ndim 1..8; shape[0..ndim) each >= 1 (copied).
 * @return 0; CPS_EINVAL (NULL client or name, bad name or shape), CPS_ENOMEM, CPS_ECONFIG
 *         (CHAINPS_LOCAL_CHUNK is not a number of bytes from 64 to 256 MiB: logged naming it), or
 *         the error of telling the scheduler that this job has local tensors (first call only:
 *         an export learns it from the scheduler's registry).
 */
CPS_API int cps_local_add(struct cps_client *c, const char *name, const float *buf, uint32_t ndim,
                          const uint64_t *shape);

/**
 * @brief Set a metadata string written with the local tensors as "local/meta/<key>" (e.g. a
 * torch optimizer's param_groups as JSON). Both copied; value NULL removes the key.
 * @return 0; CPS_EINVAL (NULL client or key, key of 0 or more than 200 bytes), CPS_ENOMEM.
 */
CPS_API int cps_local_meta(struct cps_client *c, const char *key, const char *value);

/**
 * @brief Mark a step boundary: every listed buffer now holds the state after `step` steps (the
 * step a resumed job starts its loop at). If an export waits for this step, the tensors are
 * copied (once for every export waiting for it) and sent here, in chunks; otherwise nothing is
 * read. Cheap: call it after every step. An export waiting for an earlier step is told this
 * worker is past it (it cuts again later, or fails with CPS_EPAST when asked for that step).
 * @return 0; CPS_EINVAL (NULL client); CPS_ENOMEM (the copy; the exports are told and fail).
 *         A failed send is logged and the export times out; the call still returns 0 (training
 *         goes on).
 */
CPS_API int cps_local_commit(struct cps_client *c, uint64_t step);

/**
 * @brief In a job restored from an export (CHAINPS_RESTORE_FROM, set by `chainps launch
 * --restore-from`): copy local tensor `name` of that export into buf (len values). Every worker
 * gets the same bits. The file's checksums are verified.
 * @param[out] step the step of the export's local tensors (may be NULL): where the restored
 *            loop starts. In a job whose servers hold no dense tensor it is the only record of
 *            the step (cps_start_step knows the servers' steps only, and says 0 there).
 * @return 1: copied; 0: not a restored job (CHAINPS_RESTORE_FROM unset or empty; buf untouched);
 *         CPS_ENOTFOUND (the export has no local tensor of that name: logged, naming it and the
 *         file), CPS_ESIZE (it has another number of values), CPS_ECORRUPT (a checksum or the
 *         file's structure is wrong: logged with the file and tensor), CPS_EIO, CPS_EINVAL,
 *         CPS_ENOMEM.
 */
CPS_API int cps_local_fetch(struct cps_client *c, const char *name, float *buf, uint64_t len,
                            uint64_t *step);

#ifdef __cplusplus
}
#endif
#endif
