/**
 * @file ckpt.h
 * @brief Checkpoint files: safetensors shards (+ a Hugging Face style index), written
 * atomically, read with full validation.
 *
 * Format (https://huggingface.co/docs/safetensors): 8-byte little-endian header length N, N
 * bytes of JSON header, then the raw little-endian tensor data. The header maps each tensor name
 * to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the data section) and
 * holds "__metadata__": a map of string to string. Python reads a file with
 * `safetensors.numpy.load_file` or with json + numpy alone (tests/integration/ckpt_reader.py).
 *
 * What chainps puts in a checkpoint:
 *  - parameters under their tensor names; dtype F32; the shape they were declared with ([n]
 *    for a plain declaration, [rows, cols] for a table);
 *  - optimizer state as "optim/<slot>/<tensor>" with torch.optim's state names, so the tensors
 *    map one to one onto a torch optimizer's state_dict (see cps__ckpt_slot_name):
 *      momentum: momentum_buffer;  AdaGrad: sum;  Adam: exp_avg, exp_avg_sq;  RMSProp: square_avg;
 *  - in __metadata__: whatever the caller sets (by convention CPS_CKPT_META_STEP "step",
 *    CPS_CKPT_META_OPTIM "optimizer", and "hparams/<tensor>" = cps__ckpt_spec_to_json), plus
 *    what the writer adds: "format" = "pt" (unless set; transformers checks it),
 *    "checksum/<tensor>" = "crc32:xxxxxxxx" for every tensor, and "checksum/__header__".
 *  - Checksums are CRC-32 (zlib's, the one in Python's zlib.crc32 and in every zip tool), of the
 *    tensor's data bytes, so anyone can verify a tensor without our code. "checksum/__header__"
 *    is the CRC-32 of the header bytes (padding included) with its own 8 hex digits read as
 *    "00000000": together they make every single flipped bit of a file detectable.
 *
 * Sharding (as transformers' save_pretrained does): tensors are packed in the order they were
 * added into shards of at most max_shard_bytes of data (a larger tensor gets a shard of its
 * own). One shard: BASE.safetensors. Several: BASE-00001-of-0000K.safetensors ... plus
 * BASE.safetensors.index.json = {"metadata": {"total_size": bytes, <the metadata strings>},
 * "weight_map": {tensor: shard file name}}.
 *
 * Atomicity: commit writes every shard and the index to "<name>.tmp", fsyncs each, and only then
 * renames them into place (shards first, the index last) and fsyncs the directory. A crash or an
 * error (ENOSPC, EFBIG, EIO, a failing fill callback) before the renames removes the temporaries
 * and leaves every existing file as it was, including an earlier checkpoint of the same name (a
 * crash may leave a "*.tmp", which no reader opens by default). One writer per BASE at a time.
 * Use one directory (or base name) per checkpoint, e.g. DIR/step-000120/: re-using a name
 * replaces that checkpoint shard by shard at publish time, and the reader refuses a mix
 * (metadata and the weight_map must agree across shards).
 *
 * Byte order: data is little-endian in the file and copied as-is; chainps builds only on
 * little-endian hosts (checked at compile time in ckpt.c).
 *
 * Errors are logged (subsystem "ckpt") with the file and the problem before being returned.
 * Thread-safety: a writer or a reader is used by one thread at a time; different ones are
 * independent.
 */
#ifndef CPS_CHECKPOINT_CKPT_H
#define CPS_CHECKPOINT_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "core/wire.h"

#define CPS_CKPT_MAX_DIMS     8            /**< most dims of a tensor, reading and writing */
#define CPS_CKPT_NAME_MAX     1024         /**< bytes of a tensor name or metadata key */
#define CPS_CKPT_HEADER_MAX   (100u << 20) /**< same cap as the safetensors reference */
#define CPS_CKPT_META_STEP    "step"       /**< training step of the cut, decimal */
#define CPS_CKPT_META_OPTIM   "optimizer"  /**< e.g. "adam"; see cps__ckpt_optim_kind_name */
#define CPS_CKPT_META_HPARAM  "hparams/"   /**< + tensor name: cps__ckpt_spec_to_json */
#define CPS_CKPT_OPTIM_PREFIX "optim/"

/** Element types the writer produces. The reader also lists any other safetensors dtype. */
typedef enum cps__ckpt_dtype {
    CPS_CKPT_F32 = 0, /**< parameters and optimizer state */
    CPS_CKPT_U64 = 1, /**< counters, e.g. per-row optimizer step counts */
} cps__ckpt_dtype;

typedef struct cps__ckpt_writer cps__ckpt_writer;
typedef struct cps__ckpt_reader cps__ckpt_reader;

/* ------------------------------------------------------------------------------------------ */
/* Writer                                                                                     */

/**
 * @brief Start a checkpoint. Nothing is written before commit.
 * @param[in] dir_or_path a path ending in ".safetensors" (BASE is that path without the suffix),
 *            or a directory, created if missing (BASE is DIR/model). Copied.
 * @param[in] max_shard_bytes data bytes per shard; 0 means unlimited (one file).
 * @param[out] out the writer; end it with commit or abort.
 * @return 0, CPS_EINVAL (NULL, empty path, path too long), CPS_EIO (directory cannot be
 *         created), CPS_ENOMEM.
 */
int cps__ckpt_writer_open(const char *dir_or_path, uint64_t max_shard_bytes,
                          cps__ckpt_writer **out);

/**
 * @brief Add a tensor whose data sits in memory. `data` is borrowed: it must stay valid and
 * unchanged until commit or abort returns. Names must be 1..CPS_CKPT_NAME_MAX-1 bytes of UTF-8,
 * not start with "__", and be unique in the checkpoint (checked at commit).
 * @param[in] ndim 1..CPS_CKPT_MAX_DIMS; shape[0..ndim) element counts (0 allowed); total bytes <
 * 2^62.
 * @return 0, CPS_EINVAL (bad name, dtype, ndim, shape, NULL data with a non-empty shape),
 *         CPS_ENOMEM.
 */
int cps__ckpt_writer_add(cps__ckpt_writer *w, const char *name, cps__ckpt_dtype dtype,
                         uint32_t ndim, const uint64_t *shape, const void *data);

/**
 * @brief Fill callback for streamed tensors: write elements first..first+n-1 of the tensor into
 * buf (n elements of the tensor's dtype; buf is aligned to the element size and owned by the
 * writer: it is where the bytes go to the disk from). Calls come during commit, in ascending
 * contiguous order covering the tensor exactly once, each for at most 4 Mi elements. Return 0, or a
 * negative CPS_E... code to fail the commit (returned by commit as is; the temporaries are
 * removed).
 */
typedef int (*cps__ckpt_fill_fn)(void *arg, uint64_t first, void *buf, size_t n);

/**
 * @brief Add a tensor produced piecewise at commit time by `fill` (e.g. a scan of an LMDB read
 * transaction), so a 100 M parameter model never needs a second full copy in memory. Same rules
 * as cps__ckpt_writer_add; `arg` is passed to fill and must stay valid until commit returns.
 */
int cps__ckpt_writer_add_stream(cps__ckpt_writer *w, const char *name, cps__ckpt_dtype dtype,
                                uint32_t ndim, const uint64_t *shape, cps__ckpt_fill_fn fill,
                                void *arg);

/**
 * @brief Set metadata key = value (both copied, UTF-8, key 1..CPS_CKPT_NAME_MAX-1 bytes, not
 * starting with "checksum/"). Setting a key again replaces its value.
 * @return 0, CPS_EINVAL, CPS_ENOMEM.
 */
int cps__ckpt_writer_set_meta(cps__ckpt_writer *w, const char *key, const char *value);

/**
 * @brief Write, sync and publish the checkpoint, then free the writer (also on error, like
 * LMDB's mdb_txn_commit). See the file comment for the order of operations.
 * @param[out] path_out if non-NULL, receives the path a reader should open (the .safetensors
 *             file, or the index when sharded); truncated to cap.
 * @return 0; CPS_EEXIST (duplicate tensor name), CPS_EINVAL (no tensors), CPS_EIO (any system
 *         call failed, ENOSPC included: logged with the file name and strerror), CPS_ENOMEM, or
 *         a fill callback's error. On error no temporary is left and no existing file was
 *         replaced.
 */
int cps__ckpt_writer_commit(cps__ckpt_writer *w, char *path_out, size_t cap);

/** @brief Drop a writer without writing anything. NULL is a no-op. */
void cps__ckpt_writer_abort(cps__ckpt_writer *w);

/* ------------------------------------------------------------------------------------------ */
/* Reader                                                                                     */

/** One tensor as described by its shard's header. Strings are owned by the reader. */
typedef struct cps__ckpt_tensor {
    const char *name;
    const char *dtype;  /**< safetensors dtype string, e.g. "F32" */
    uint32_t elem_size; /**< bytes per element */
    uint32_t ndim;
    uint64_t shape[CPS_CKPT_MAX_DIMS];
    uint64_t numel;       /**< product of shape (1 for a scalar) */
    uint64_t nbytes;      /**< numel * elem_size */
    const char *file;     /**< path of the shard holding it */
    uint32_t shard;       /**< index of that shard (cps__ckpt_reader_shard_path) */
    uint64_t data_begin;  /**< data_offsets[0] as in the header (relative to the data section) */
    uint64_t file_offset; /**< absolute offset of the first byte in the file */
    int has_checksum;     /**< 1 if "checksum/<name>" was present */
    uint32_t checksum;    /**< the CRC-32 it states */
} cps__ckpt_tensor;

/**
 * @brief Open a checkpoint and validate its structure (not the tensor data: see verify).
 * @param[in] path a .safetensors file, a .safetensors.index.json index, or a directory holding
 *            model.safetensors or model.safetensors.index.json (not both).
 * Checks: file at least 8 bytes; header length <= CPS_CKPT_HEADER_MAX and within the file;
 * header is strict JSON (UTF-8, no duplicate keys, no trailing bytes other than the spaces
 * safetensors pads with); every entry has a known dtype, a shape of non-negative integers whose
 * product * element size equals end - begin; the data_offsets, sorted, start at 0, do not
 * overlap, leave no gap and end exactly at the end of the file; __metadata__ values are
 * strings; every "checksum/..." is well formed and names a tensor of the shard; the header
 * checksum (when present) matches; index: weight_map names only existing shard files (plain
 * names in the index's directory), every tensor of every shard is mapped to that shard and
 * nothing else, total_size matches, and the metadata strings agree across the index and shards.
 * @return 0; CPS_ECORRUPT (anything malformed: one log line names the file and the problem),
 *         CPS_EIO (cannot open/read a file: logged), CPS_EINVAL, CPS_ENOMEM.
 */
int cps__ckpt_reader_open(const char *path, cps__ckpt_reader **out);
/** @brief Close a reader; every pointer it returned becomes invalid. NULL is a no-op. */
void cps__ckpt_reader_close(cps__ckpt_reader *r);

/** @brief Number of tensors (all shards). */
size_t cps__ckpt_reader_count(const cps__ckpt_reader *r);
/** @brief Tensor i (0 <= i < count), in name order (bytewise). NULL if out of range. */
const cps__ckpt_tensor *cps__ckpt_reader_tensor(const cps__ckpt_reader *r, size_t i);
/** @brief Tensor by name, or NULL. */
const cps__ckpt_tensor *cps__ckpt_reader_find(const cps__ckpt_reader *r, const char *name);
/** @brief Metadata value of key (first shard's, which all shards agree with), or NULL. */
const char *cps__ckpt_reader_meta(const cps__ckpt_reader *r, const char *key);
/** @brief Metadata entries other than "checksum/...", in key order: count, then entry i. */
size_t cps__ckpt_reader_meta_count(const cps__ckpt_reader *r);
int cps__ckpt_reader_meta_at(const cps__ckpt_reader *r, size_t i, const char **key,
                             const char **value);
/** @brief Shards: count and path of shard i (NULL if out of range). The index path, if any. */
size_t cps__ckpt_reader_shard_count(const cps__ckpt_reader *r);
const char *cps__ckpt_reader_shard_path(const cps__ckpt_reader *r, size_t i);
const char *cps__ckpt_reader_index_path(const cps__ckpt_reader *r);

/**
 * @brief Read a whole tensor's bytes into buf (cap >= t->nbytes) and verify its checksum.
 * @return 0; CPS_ESIZE (cap too small), CPS_ECORRUPT (checksum mismatch: logged with the tensor
 *         and file; buf holds the bad bytes), CPS_EIO (read error or the file shrank).
 */
int cps__ckpt_reader_read(cps__ckpt_reader *r, const cps__ckpt_tensor *t, void *buf, size_t cap);

/**
 * @brief Sink for streamed reads: elements first..first+n-1 in buf (borrowed for the call).
 * Return 0 or a negative code to stop (returned as is).
 */
typedef int (*cps__ckpt_sink_fn)(void *arg, uint64_t first, const void *buf, size_t n);

/**
 * @brief Read a tensor in chunks of at most 4 Mi elements, in order, verifying the checksum
 * over the whole; for restores that write straight into the store. The sink sees the data
 * before the checksum is known: on CPS_ECORRUPT the caller must discard what it wrote (e.g.
 * abort its write transaction), or verify first with cps__ckpt_reader_verify.
 * @return 0, CPS_ECORRUPT, CPS_EIO, CPS_ENOMEM, or the sink's error.
 */
int cps__ckpt_reader_stream(cps__ckpt_reader *r, const cps__ckpt_tensor *t, cps__ckpt_sink_fn sink,
                            void *arg);

/**
 * @brief Verify one tensor's checksum by reading its bytes.
 * @return 0 (also when the tensor carries no checksum: see t->has_checksum), CPS_ECORRUPT
 *         (logged), CPS_EIO, CPS_ENOMEM.
 */
int cps__ckpt_reader_verify(cps__ckpt_reader *r, const cps__ckpt_tensor *t);

/**
 * @brief Check a checkpoint against the tensors a job declares: every tensor of the checkpoint
 * must be one of names[0..n) or "optim/<slot>/<one of them>", and every one of names[0..n)
 * must be present.
 * @return 0, CPS_ENOTFOUND (logged: the first tensor the job does not know, or the first job
 *         tensor missing from the checkpoint, with the file).
 */
int cps__ckpt_reader_check_names(const cps__ckpt_reader *r, const char *const *names, size_t n);

/* ------------------------------------------------------------------------------------------ */
/* Naming and optimizer description                                                           */

/**
 * @brief torch.optim's name of optimizer state slot `slot` of optimizer kind `opt_kind`
 * (enum cps__opt_kind_w), i.e. the slot-major state[slot*n + i] of the store.
 * @return a static string, or NULL if the optimizer has no such slot.
 */
const char *cps__ckpt_slot_name(uint32_t opt_kind, uint32_t slot);

/**
 * @brief Write "optim/<slot name>/<tensor>" into buf.
 * @return 0, CPS_EINVAL (no such slot, or does not fit in cap).
 */
int cps__ckpt_optim_tensor_name(char *buf, size_t cap, uint32_t opt_kind, uint32_t slot,
                                const char *tensor);

/** @brief "sgd", "momentum", "adagrad", "adam", "rmsprop", or NULL. */
const char *cps__ckpt_optim_kind_name(uint32_t opt_kind);

/**
 * @brief Describe a spec as one JSON object, e.g. {"optimizer":"adam","lr":0.001,...,
 * "init":"normal","init_a":0,"init_b":0.05,"init_seed":42}. Each float is the shortest decimal
 * (at most 9 digits) that reads back as the same float32 bits. Suitable as a metadata value.
 * @return the length written (excluding NUL), or CPS_ESIZE if cap is too small.
 */
int cps__ckpt_spec_to_json(const cps__param_spec *spec, char *buf, size_t cap);

/**
 * @brief Parse what cps__ckpt_spec_to_json wrote (every field required, nothing else allowed).
 * Does not validate the hyper-parameters: cps__wire_spec_decode does that.
 * @return 0, CPS_ECORRUPT (logged).
 */
int cps__ckpt_spec_from_json(const char *json, cps__param_spec *out);

/** @brief CRC-32 (zlib) of len bytes, continuing from crc (start with 0). */
uint32_t cps__ckpt_crc32(uint32_t crc, const void *buf, size_t len);

#endif
