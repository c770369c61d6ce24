/**
 * @file chainps.h
 * @brief chainps worker API: what a training program includes.
 *
 * A training program opens a client (cps_open), declares its tensors, and then pushes gradients
 * and pulls parameters. The optimizer runs on the servers. Each key range lives on a chain of
 * servers; a failover is retried inside these calls, so they block rather than fail.
 *
 * Ownership: the caller owns every buffer it passes; calls copy what they need before returning,
 * except the asynchronous variants, whose buffers must stay valid (and unmodified, for pushes)
 * until cps_wait() reports completion. Objects returned through `**out` parameters are owned by
 * the caller and freed by the matching destroy/close call.
 *
 * Threading: a cps_client may be used from several threads; calls are serialized internally by
 * one lock (a call waiting for the network does not hold it while it sleeps in poll, other
 * callers can make progress). cps_tensor handles are immutable after declaration.
 *
 * Errors: every function returns 0 (CPS_OK) or a negative CPS_E... code (see error.h);
 * cps_strerror() describes it, and the library also logs what went wrong.
 *
 * @section caveats Caveats
 *
 * - cps_open() may never return. When the environment names the role `scheduler` or `server`,
 *   it runs that role until the job ends and then calls exit(0) (exit(1) on a fatal error),
 *   after installing handlers for SIGINT and SIGTERM (they stop the role cleanly) and ignoring
 *   SIGPIPE. Code after cps_open() runs in workers only; atexit() handlers do run.
 * - cps_open() of a worker starts one thread, the heartbeat thread, which tells the scheduler
 *   this worker is alive while the program computes between calls; it is created with SIGINT
 *   and SIGTERM blocked and is joined by cps_close(). No other thread is started (all-reduces
 *   progress inside the calls: allreduce.h). A worker that never calls cps_close() keeps
 *   beating until it exits. fork() after cps_open() leaves the child without that thread and
 *   with the parent's sockets: open the client after forking.
 * - cps_open() changes process-wide state: glibc's malloc trim and mmap thresholds (unless
 *   GLIBC_TUNABLES is set), OpenBLAS's thread count (1, unless OPENBLAS_NUM_THREADS is set), and
 *   the log's tag ("worker R").
 * - cps_open() reads its whole configuration from environment variables; an empty variable
 *   counts as unset, and two aliases of one setting that disagree are refused (CPS_ECONFIG,
 *   naming both). The meaning and default of each is in the one table of docs/running.md
 *   (section "Environment"); tests/check_env_doc.sh fails when the sources read a variable
 *   that this list or that table does not name. The library reads:
 *   - the job: CHAINPS_ROLE (aliases DMLC_ROLE, MS_ROLE = MS_SCHED, MS_PSERVER or MS_WORKER),
 *     CHAINPS_SCHEDULER (DMLC_PS_ROOT_URI with DMLC_PS_ROOT_PORT, MS_SCHED_HOST with
 *     MS_SCHED_PORT), CHAINPS_NUM_SERVERS
 *     (DMLC_NUM_SERVER, MS_SERVER_NUM), CHAINPS_NUM_WORKERS (DMLC_NUM_WORKER, MS_WORKER_NUM),
 *     CHAINPS_RANK, CHAINPS_MODE, CHAINPS_BACKUP_WORKERS, CHAINPS_REPLICAS, CHAINPS_RANGES;
 *   - this node: CHAINPS_DATA_DIR, CHAINPS_BIND, CHAINPS_ADVERTISE (DMLC_NODE_HOST),
 *     CHAINPS_PORT, CHAINPS_VERBOSE (PS_VERBOSE), CHAINPS_SYNC;
 *   - security: CHAINPS_SECRET_FILE or CHAINPS_INSECURE, CHAINPS_RUNTIME_DIR;
 *   - timing: CHAINPS_JOIN_TIMEOUT_MS, CHAINPS_REQUEST_TIMEOUT_MS, CHAINPS_HEARTBEAT_MS,
 *     CHAINPS_DEAD_AFTER_MS, CHAINPS_WORKER_DEAD_AFTER_MS, CHAINPS_UNAVAILABLE_TIMEOUT_MS,
 *     CHAINPS_SCHEDULER_TIMEOUT_MS;
 *   - data path: CHAINPS_COMPRESS, CHAINPS_MAX_TENSOR_MB, CHAINPS_FRAME_KB,
 *     CHAINPS_ALLREDUCE_CHUNK, CHAINPS_RING_MIN_KB, CHAINPS_RING_MB;
 *   - checkpoints: CHAINPS_RESTORE_FROM (a worker's all-reduced tensors, cps_local_fetch),
 *     CHAINPS_LOCAL_CHUNK (bytes per message of the local tensors an export takes);
 *   - tests only: CHAINPS_FAILPOINT_SCHED_SAVE (a scheduler fails chosen view saves),
 *     CHAINPS_FETCH_PART (values per part of an answer to cps_allreduce_fetch),
 *     CHAINPS_SNAP_CHUNK_KB (KiB per chunk of a snapshot sent to a joining server);
 *   - not its own: GLIBC_TUNABLES, OPENBLAS_NUM_THREADS (above).
 *   A ps-lite job (DMLC_ROLE without CHAINPS_MODE, CHAINPS_ROLE or MS_ROLE) runs in async mode.
 * - Errors are also logged to stderr; CHAINPS_VERBOSE sets how much else is.
 *
 * @section data_errors Errors of the data calls
 *
 * The calls that talk to the servers (the declares, push, pull and push-pull in every form, the
 * rows and raw calls, and the result cps_wait() gives) fail, besides the argument errors each
 * lists, with:
 * - CPS_EUNAVAILABLE: a key range had no live replica for CHAINPS_UNAVAILABLE_TIMEOUT_MS;
 * - CPS_ESHUTDOWN: the job ended (the scheduler said so) while the call waited;
 * - CPS_ENOMEM;
 * - an error a server answered with, passed on as it is: CPS_ENOTFOUND (a key no declaration
 *   created), CPS_EINVAL or CPS_ESIZE (a request the server refuses), CPS_ESTORE, CPS_ENOSPC or
 *   CPS_ECORRUPT (its store failed, filled up, or failed a check), CPS_EPOISONED (the server hit
 *   a fatal error earlier), CPS_EPROTO (a message it could not parse: often two versions of
 *   chainps in one job). A stale or not-yet-known view (CPS_ESTALE_EPOCH, CPS_EAGAIN) is never
 *   returned: the request is re-sent under the new view.
 * The blocking calls wait as long as the chain needs (failovers included): they do not time out
 * on their own, a cps_wait() with a timeout does.
 */
#ifndef CHAINPS_H
#define CHAINPS_H

#include <stddef.h>
#include <stdint.h>

#include "chainps/allreduce.h" /* cps_allreduce: collectives among the workers */
#include "chainps/error.h"
#include "chainps/export.h"
#include "chainps/freq.h"       /* cps_freq: communication frequency and warm-up of all-reduces */
#include "chainps/localstate.h" /* cps_local_*: worker-held tensors in checkpoints */

#ifdef __cplusplus
extern "C" {
#endif

/* The version of these headers; cps_version() tells the library's at run time. CMake's project
 * version must match (the build checks it). */
#define CHAINPS_VERSION_MAJOR 0
#define CHAINPS_VERSION_MINOR 1
#define CHAINPS_VERSION_PATCH 0

/** The headers' version as one comparable integer: MAJOR * 10000 + MINOR * 100 + PATCH
 * (0.1.0 is 100), so `#if CHAINPS_VERSION >= 200` and integer compares work. */
#define CHAINPS_VERSION                                                                            \
    (CHAINPS_VERSION_MAJOR * 10000 + CHAINPS_VERSION_MINOR * 100 + CHAINPS_VERSION_PATCH)
/** True (1) when these headers are version major.minor.patch or later; usable in `#if`. */
#define CHAINPS_VERSION_AT_LEAST(major, minor, patch)                                              \
    (CHAINPS_VERSION >= (major)*10000 + (minor)*100 + (patch))

/** The wire protocol these headers' library speaks (the version byte of every message). Nodes
 * of different wire versions refuse each other's messages, naming both versions: every process
 * of a job, workers included, must run a library of the same wire version. */
#define CHAINPS_WIRE_VERSION 6

/**
 * @brief The library's version, "MAJOR.MINOR.PATCH" (a static string). A program built against
 * one set of headers can check which library it runs with.
 */
CPS_API const char *cps_version(void);

/**
 * @brief The library's version as one integer, CHAINPS_VERSION of the headers it was built with:
 * compare it with the program's CHAINPS_VERSION to find a library older than the headers.
 * Never fails.
 */
CPS_API int cps_version_number(void);

/**
 * @brief The wire protocol version the library speaks (CHAINPS_WIRE_VERSION of the headers it
 * was built with). Two processes can be in one job only if their answers are equal: a launcher
 * can check this before starting a worker against running servers. Never fails.
 */
CPS_API int cps_wire_version(void);

typedef struct cps_client cps_client;
typedef struct cps_tensor cps_tensor;
typedef struct cps_handle cps_handle;

/**
 * @brief Join the job described by the environment.
 *
 * Reads CHAINPS_ROLE / DMLC_ROLE / MS_ROLE, the scheduler address and the node counts (all of
 * them: Caveats). If the role is `scheduler` or `server`, this call runs that role until the
 * job ends and then calls exit(0) (or exit(1) on a fatal error): the same program can be started
 * in every role, as with ps-lite and MindSpore. If the role is `worker` (the default), it
 * registers with the scheduler, waits until every expected node has joined, and returns a client.
 * It also raises glibc's malloc trim and mmap thresholds (unless GLIBC_TUNABLES is set), so that
 * message buffers are reused instead of being mapped and unmapped for every large message.
 *
 * @param[out] out the new client; the caller closes it with cps_close().
 * @return 0, CPS_EINVAL (NULL out), CPS_ECONFIG (a bad or conflicting variable, or no usable
 *         secret: the message names it), CPS_ETIMEDOUT (the scheduler or other nodes never
 *         arrived within CHAINPS_JOIN_TIMEOUT_MS), CPS_ETRANSPORT (cannot bind or reach the
 *         scheduler's address), CPS_EPROTO (the scheduler's answer does not list this worker),
 *         CPS_ESHUTDOWN (the job ended while joining), CPS_ENOMEM, or the error the scheduler
 *         refused the join with. In the scheduler and server roles it does not return.
 */
CPS_API int cps_open(cps_client **out);

/**
 * @brief Leave the job: waits for outstanding requests, tells the scheduler this worker is done,
 * and frees the client and every tensor handle declared on it. NULL is a no-op.
 * The client is freed whatever the result: do not use it (or its handles) again.
 * @return 0, or CPS_ETIMEDOUT (requests were still unanswered after CHAINPS_REQUEST_TIMEOUT_MS,
 *         pushes given up with CPS_EUNAVAILABLE not counted; their results are lost).
 */
CPS_API int cps_close(cps_client *c);

/** @brief This worker's rank, 0 .. cps_num_workers()-1 (stable for the job); -1 for NULL. */
CPS_API int cps_rank(const cps_client *c);
/** @brief Number of workers in the job (as of the view this client holds); 0 for NULL. */
CPS_API int cps_num_workers(const cps_client *c);
/** @brief Number of servers in the job (as of the view this client holds); 0 for NULL. */
CPS_API int cps_num_servers(const cps_client *c);

/** Training mode of a job (chosen by the scheduler's --mode / CHAINPS_MODE). */
typedef enum cps_mode {
    CPS_MODE_SYNC = 0,  /**< per-step aggregate of every live worker's gradient */
    CPS_MODE_ASYNC = 1, /**< each push applied as it arrives */
    CPS_MODE_SSP = 2    /**< asynchronous, with pulls held within a staleness bound */
} cps_mode;

/**
 * @brief The job's training mode into `*mode`; `*staleness` (if not NULL) receives the bound N of
 * `ssp:N` (0 for the other modes). @return 0, or CPS_EINVAL (NULL client or mode).
 */
CPS_API int cps_mode_get(const cps_client *c, cps_mode *mode, uint32_t *staleness);

/** Initial values of a tensor. Deterministic: element i depends only on (seed, i). */
typedef enum cps_init_kind {
    CPS_INIT_ZEROS = 0,
    CPS_INIT_CONSTANT = 1, /**< every element = a */
    CPS_INIT_UNIFORM = 2,  /**< uniform in [a, b) */
    CPS_INIT_NORMAL = 3    /**< normal with mean a, standard deviation b */
} cps_init_kind;

typedef struct cps_init {
    cps_init_kind kind;
    float a, b;
    uint64_t seed;
} cps_init;

/** Server-side optimizer. */
typedef enum cps_optim_kind {
    CPS_OPTIM_SGD = 0,
    CPS_OPTIM_MOMENTUM = 1,
    CPS_OPTIM_ADAGRAD = 2,
    CPS_OPTIM_ADAM = 3,
    CPS_OPTIM_RMSPROP = 4
} cps_optim_kind;

typedef struct cps_optim {
    cps_optim_kind kind;
    float lr;           /**< learning rate, > 0 */
    float weight_decay; /**< L2 coefficient added to the gradient, >= 0 */
    float momentum;     /**< momentum: mu in [0, 1) */
    int nesterov;       /**< momentum: 1 for Nesterov's variant */
    float beta1, beta2; /**< Adam: in (0, 1); 0 means the defaults 0.9, 0.999 */
    float eps;          /**< AdaGrad/Adam/RMSProp: > 0; 0 means the default 1e-8 (1e-10 AdaGrad) */
    float rho;          /**< RMSProp decay in (0, 1); 0 means the default 0.9 */
} cps_optim;

/**
 * @brief Compute the initial values the servers give elements offset..offset+n-1 of a tensor
 * declared with `init`, into out[0..n). Lets a program reproduce a cluster's initial model
 * locally (e.g. a single-process baseline). `init` NULL means zeros. Never fails.
 */
CPS_API void cps_init_values(const cps_init *init, uint64_t offset, float *out, size_t n);

/** @brief An SGD optimizer with learning rate `lr` and no weight decay. Never fails (a bad `lr`
 * is refused by the declaration that uses it). */
CPS_API cps_optim cps_optim_sgd(float lr);

/**
 * @brief Declare a dense float32 tensor of `length` elements. Every worker declares the same
 * tensors with the same definitions; the first declaration creates the values on the servers,
 * later ones (other workers, a restarted worker) find them and keep the trained values.
 *
 * The tensor is cut into chunks spread over the key ranges, so a large tensor uses every server.
 *
 * @param[in] name  unique name, 1..255 bytes, copied.
 * @param[in] init  initial values (NULL: zeros).
 * @param[in] optim server-side optimizer (NULL: SGD with lr 0.01).
 * @param[out] out  handle, valid until cps_close() (do not free it).
 * @return 0, CPS_EINVAL (bad name/length/hyper-parameter, or more than CHAINPS_MAX_TENSOR_MB
 *         of values: 64 GiB by default; NULL client, name or out), CPS_EEXIST (declared before
 *         with a different length, initializer or optimizer), CPS_ESCHEDULER (the scheduler is
 *         gone, as for cps_barrier), CPS_ESHUTDOWN, and the errors of the data calls (above).
 */
CPS_API int cps_tensor_declare(cps_client *c, const char *name, uint64_t length,
                               const cps_init *init, const cps_optim *optim, cps_tensor **out);

/** Most dimensions a tensor's shape may have (as in safetensors readers: 8). */
#define CPS_MAX_NDIM 8

/**
 * @brief Declare a dense float32 tensor with a shape: `ndim` dimensions `dims[0..ndim)`, row-major
 * (C order, as numpy and torch lay out a contiguous tensor). The length is the product of the
 * dimensions. Behaves exactly like cps_tensor_declare() otherwise; the shape is recorded with the
 * job (the scheduler's tensor registry) and written into checkpoints, so an export loads into a
 * model as it is (torch's `load_state_dict`). Push, pull and push-pull still take flat buffers of
 * cps_tensor_length() values.
 *
 * @param[in] ndim  1..CPS_MAX_NDIM.
 * @param[in] dims  `ndim` sizes, each >= 1, copied; their product must fit in 2^62 elements.
 * @return 0, CPS_EINVAL (bad name, ndim, a zero dimension, an overflowing product, more
 *         than CHAINPS_MAX_TENSOR_MB of values, bad
 *         hyper-parameter), CPS_EEXIST (declared before, by this or another worker, with another
 *         shape, initializer or optimizer: the log names the tensor), CPS_ESCHEDULER,
 *         CPS_ESHUTDOWN, and the errors of the data calls (above).
 */
CPS_API int cps_tensor_declare_shape(cps_client *c, const char *name, uint32_t ndim,
                                     const uint64_t *dims, const cps_init *init,
                                     const cps_optim *optim, cps_tensor **out);

/**
 * @brief Declare an embedding table of `rows` x `cols` float32, addressed by row id for sparse
 * push/pull (cps_rows_push / cps_rows_pull). Each row is one key. Same rules as
 * cps_tensor_declare; whole-table push/pull also work.
 * @return as cps_tensor_declare(); CPS_EINVAL also when rows or cols is 0 or rows * cols
 *         overflows.
 */
CPS_API int cps_table_declare(cps_client *c, const char *name, uint64_t rows, uint32_t cols,
                              const cps_init *init, const cps_optim *optim, cps_tensor **out);

/**
 * @brief The sync step this tensor is at: the number of steps applied to it when it was
 * declared (0 for a new job; the job's step for a worker joining a running job, or the step of
 * the checkpoint the job was restored from), plus the pushes made since. A training program
 * resuming from a checkpoint starts its loop here so its data order and learning-rate schedule
 * continue where they stopped. Thread-safe to read while no push of this tensor is running.
 * @return the step; 0 for NULL.
 */
CPS_API uint64_t cps_tensor_step(const cps_tensor *t);

/**
 * @brief The step this worker's training loop starts at: the highest step any tensor declared on
 * this client was at (0 for a new job; the job's step for a worker that takes a dead worker's
 * place under `chainps launch --restart-workers`, or joins later; the checkpoint's step for a
 * restored job). Every tensor not pushed yet continues from it: its next push is step
 * cps_start_step() + 1, so cps_tensor_step() of each agrees once all are declared.
 *
 * Call it after declaring every tensor and run the loop from there (skip the data of the steps
 * before it): in sync mode a worker that trains more steps than the others pushes a step
 * nobody else will, and the job waits for it at its end. A worker joining a running job
 * learns the step from the servers whether or not it calls this; each tensor's first push tells
 * every range where this worker starts, so all of them close the steps below without it.
 *
 * @return the step (0 for NULL). Thread-safe.
 */
CPS_API uint64_t cps_start_step(cps_client *c);
/** @brief Number of float32 elements of a tensor; 0 for NULL. */
CPS_API uint64_t cps_tensor_length(const cps_tensor *t);
/** @brief The tensor's name as declared (owned by the handle; valid until cps_close()); NULL for
 * NULL. */
CPS_API const char *cps_tensor_name(const cps_tensor *t);
/**
 * @brief Number of dimensions of a tensor's shape: as declared with cps_tensor_declare_shape(),
 * 1 for cps_tensor_declare(), 2 for a table (rows, cols). 0 for NULL.
 */
CPS_API uint32_t cps_tensor_ndim(const cps_tensor *t);
/** @brief Size of dimension `i` (0 .. ndim-1) of a tensor's shape; 0 when i is out of range. */
CPS_API uint64_t cps_tensor_dim(const cps_tensor *t, uint32_t i);

/**
 * @brief Choose how this tensor's gradients are compressed, lossily, on their way to the servers.
 *
 * `spec` is one of
 *  - "fp16": each value rounded to IEEE half precision (to nearest, ties to even): half the
 *    bytes. A finite value beyond +-65504 is sent as +-65504, the rest carried (below).
 *  - "bf16": bfloat16 (float32's range, 8 bits of precision): half the bytes.
 *  - "topk:R", 0 < R <= 1: only the largest R fraction of the values by magnitude (at least one
 *    per key range the tensor spans), with their indices: 8 bytes per value sent, so R < 0.5
 *    saves bytes (topk:0.01 sends about 2% of the bytes).
 *  - "none": plain float32 (the default, unless CHAINPS_COMPRESS names a codec).
 * With every codec the worker keeps what the encoding lost (error feedback): the part of each
 * gradient not sent is added to the next gradient pushed for this tensor, so over the steps
 * the servers receive all of it. The servers decode pushes back to float32 before summing or
 * applying them; pulls are never compressed. Snappy (CHAINPS_COMPRESS=1, the default) still
 * compresses the encoded bytes when that saves at least 10%. Table row pushes
 * (cps_rows_push) and cps_raw_push() are never lossy; whole-table pushes are.
 *
 * Takes effect from the next push; pushes in flight keep the bytes they were encoded to (a
 * re-sent push is byte-identical). Switching between codecs keeps the carried residual;
 * "none" drops it. Servers from before this call refuse lossy pushes (an unknown header flag).
 *
 * @param[in] spec the codec, as above (copied).
 * @return 0, CPS_EINVAL (NULL argument or an unknown spec: the log names it).
 */
CPS_API int cps_tensor_compress(cps_client *c, cps_tensor *t, const char *spec);

/**
 * @brief Push a gradient for the whole tensor; returns when every server has applied it (async)
 * or when the step's aggregate of all workers is applied (sync mode: every worker must push).
 * @param[in] grad `len` values; len must equal the tensor length (else CPS_ESIZE).
 * @return 0, CPS_EINVAL (NULL client, tensor or grad), CPS_ESIZE, CPS_EUNAVAILABLE (every
 *         replica of a range is gone; the push may still be applied, once, if one comes back:
 *         later pushes depend on it; in sync mode the step, and this worker's next push of the
 *         tensor, wait for it), the codec's errors (cps_tensor_compress: CPS_ENOMEM), and the
 *         other errors of the data calls (above).
 */
CPS_API int cps_push(cps_client *c, cps_tensor *t, const float *grad, uint64_t len);

/**
 * @brief Pull the current parameters of the whole tensor into `out` (`len` values).
 * In SSP mode, waits until the slowest worker is within the staleness bound.
 * @return 0, CPS_EINVAL (NULL client, tensor or out), CPS_ESIZE (len is not the tensor's
 *         length), and the errors of the data calls (above). `out` may be partly written when
 *         the call fails.
 *
 * Authentication (a job with a secret, servers on other hosts): a reply's MAC is checked while
 * its values are copied into `out`, in one pass. A reply that fails the check is dropped as a
 * lost one (counted in cps_client_stats.values_refused and logged) and its request is re-sent;
 * the call goes on and returns 0 once a genuine reply arrives, or fails as for a lost reply
 * (CPS_ETIMEDOUT, CPS_EUNAVAILABLE). So while the call runs, and after it fails, `out` may hold
 * bytes of a refused (forged or corrupted) reply; when it returns 0, every value in `out` is
 * from a reply that passed the check. The same holds for the other calls that fill `out`
 * (cps_push_pull, the _async forms until cps_wait gives their result, cps_raw_pull's vals).
 */
CPS_API int cps_pull(cps_client *c, cps_tensor *t, float *out, uint64_t len);

/**
 * @brief Push a gradient and pull the updated parameters in one round trip.
 * @return as cps_push(); CPS_EINVAL also for a NULL out. `out` may be partly written when the
 *         call fails.
 */
CPS_API int cps_push_pull(cps_client *c, cps_tensor *t, const float *grad, float *out,
                          uint64_t len);

/**
 * @brief Asynchronous variants: start the operation and return a handle at once. `grad` and
 * `out` must stay valid until cps_wait() returns something other than CPS_ETIMEDOUT.
 * @return 0 and `*h` set; or, with nothing left in flight and `*h` untouched: CPS_EINVAL (NULL
 *         h, client, tensor, grad or out), CPS_ESIZE, CPS_ENOMEM, or an error of the data calls
 *         found before any request was sent. Errors met later are the result cps_wait() gives.
 */
CPS_API int cps_push_async(cps_client *c, cps_tensor *t, const float *grad, uint64_t len,
                           cps_handle **h);
CPS_API int cps_pull_async(cps_client *c, cps_tensor *t, float *out, uint64_t len, cps_handle **h);
CPS_API int cps_push_pull_async(cps_client *c, cps_tensor *t, const float *grad, float *out,
                                uint64_t len, cps_handle **h);

/**
 * @brief Wait for an asynchronous operation.
 * @param[in] timeout_ms -1 waits forever, 0 only checks.
 * @return CPS_ETIMEDOUT if not done yet (the handle stays valid: wait again); otherwise the
 *         operation's result, and the handle is freed.
 */
CPS_API int cps_wait(cps_handle *h, int timeout_ms);

/**
 * @brief Wait for an asynchronous operation, telling "still running" apart from an operation
 * that failed with CPS_ETIMEDOUT (which cps_wait() reports alike).
 * @param[in] timeout_ms -1 waits forever, 0 only checks.
 * @param[out] result the operation's result (0 or a CPS_E... code) when it completed.
 * @return 1: completed, *result set, the handle is freed; 0: still running after timeout_ms, the
 *         handle stays valid (wait again); CPS_EINVAL: NULL or already completed handle.
 */
CPS_API int cps_wait_result(cps_handle *h, int timeout_ms, int *result);

/**
 * @brief Sparse rows of a table: push gradients for `nrows` rows (ids in any order, duplicates
 * allowed: their gradients are summed) or pull them. `grads`/`out` hold nrows*cols values, row
 * by row in the order of `rows`.
 * @return 0, CPS_EINVAL (not a table, NULL pointers, nrows 0), CPS_ENOTFOUND (a row id >=
 *         rows: nothing sent), CPS_ENOMEM, and the errors of the data calls (above).
 */
CPS_API int cps_rows_push(cps_client *c, cps_tensor *t, const uint64_t *rows, size_t nrows,
                          const float *grads);
CPS_API int cps_rows_pull(cps_client *c, cps_tensor *t, const uint64_t *rows, size_t nrows,
                          float *out);

/**
 * @brief Block until every live worker has called cps_barrier() the same number of times.
 * @return 0, CPS_EINVAL (NULL), CPS_ETIMEDOUT, CPS_ESHUTDOWN, CPS_ESCHEDULER (the scheduler
 *         answered nothing for CHAINPS_UNAVAILABLE_TIMEOUT_MS, at least 3 request timeouts: it
 *         is gone).
 */
CPS_API int cps_barrier(cps_client *c);

/**
 * @brief ps-lite-shaped calls: `nkeys` keys sorted strictly increasing, values concatenated in
 * key order, `lens[i]` values for key i. Keys must have been created (cps_raw_declare).
 * @return 0, CPS_EINVAL (NULL client, keys, lens or values, nkeys 0, keys not strictly
 *         increasing or a len of 0; for cps_raw_declare a bad init or optimizer), CPS_ENOTFOUND
 *         (a key no cps_raw_declare() created), CPS_EEXIST (cps_raw_declare: a key exists with
 *         another length), and the errors of the data calls (above).
 */
CPS_API int cps_raw_declare(cps_client *c, const uint64_t *keys, size_t nkeys, const uint32_t *lens,
                            const cps_init *init, const cps_optim *optim);
CPS_API int cps_raw_push(cps_client *c, const uint64_t *keys, size_t nkeys, const float *vals,
                         const uint32_t *lens);
CPS_API int cps_raw_pull(cps_client *c, const uint64_t *keys, size_t nkeys, float *vals,
                         const uint32_t *lens);

/** Traffic counters of this client (bytes of push payloads before/after compression, ...). */
typedef struct cps_client_stats {
    uint64_t pushes, pulls;
    uint64_t push_raw_bytes;  /**< push payload bytes before compression */
    uint64_t push_wire_bytes; /**< push payload bytes as sent */
    uint64_t pull_bytes;      /**< value bytes received by pulls */
    uint64_t retries;         /**< requests re-sent (timeouts, failovers) */
    uint64_t late_pushes;     /**< sync pushes dropped as late: their step had closed with the
                                   first W-b gradients (--backup-workers); the tensor's step
                                   moved on to the job's */
    uint64_t values_refused;  /**< pull replies from servers on other hosts that failed their
                                   authentication check, made while their values were copied
                                   into the caller's buffer: each was dropped as if lost and
                                   its request re-sent (cps_pull) */
} cps_client_stats;

/** @brief Copy the client's counters into *out. Never fails; does nothing if either is NULL. */
CPS_API void cps_client_stats_get(const cps_client *c, cps_client_stats *out);

#ifdef __cplusplus
}
#endif
#endif
