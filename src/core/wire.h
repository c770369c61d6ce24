/* Wire protocol: a fixed 64-byte little-endian header followed by a payload.
 *
 * Everything is encoded and decoded by the explicit functions below, never by casting a struct
 * onto a buffer. Decoders validate every field and length before anything is used and return
 * CPS_EPROTO / CPS_ESIZE / CPS_ECORRUPT naming nothing they did not check. All pointers returned
 * by decoders are borrowed from the input buffer and live as long as it does.
 *
 * Header layout (offsets in bytes, all little-endian):
 *    0 u32 magic 'CPS1' (0x31535043)   4 u8 version (6)    5 u8 type    6 u16 flags
 *    8 u32 sender node id             12 i32 status (0 or CPS_E... in replies)
 *   16 u64 view epoch                 24 u32 request worker id   28 u32 range id
 *   32 u64 request sequence number    40 u64 training step
 *   48 u32 payload length on the wire 52 u32 payload length uncompressed (== payload length
 *                                           unless CPS_WF_SNAPPY)
 *   56 u64 aux (type-specific: e.g. the worker's clock on a pull, a checksum seq)
 */
#ifndef CPS_CORE_WIRE_H
#define CPS_CORE_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "chainps/chainps.h" /* CPS_MAX_NDIM */

#define CPS_WIRE_MAGIC 0x31535043u
/* 6: SNAP chunks are numbered (req_worker: 0, 1, 2, ... within a stream) and a joiner takes only
 * the next number; a joiner of version 6 behind a tail of version 5 would see every chunk as
 * number 0 (a repeat) and never finish a join of more than one chunk, and a joiner of version 5
 * would still install a stream that lost a chunk. 5: chains forward before they apply (a FWD's aux
 * is how far its sender applied, a CHAIN_MARK with CPS_CHAIN_MARK_APPLIED says it applied; a
 * successor of version 4 would apply FWDs its predecessor had not), FWDs to a shadow flagged
 * CPS_WF_SHADOW, and a HELLO may end with a flags word (CPS_HELLO_EMPTY) that a scheduler of
 * version 4 refuses by its size. 4: the MAC trailer (src/transport/auth.h) is ChaCha20-Poly1305
 * instead of GMAC; the transport refuses another version's messages before checking their MAC, and
 * says why. 3: dense tensors cut into chunks of at most 128 Ki values. 2: tensor keys and key-set
 * signatures hashed with XXH3 instead of FNV-1a. Nodes of two versions would place the same tensor
 * on different keys, so they must not talk. */
#define CPS_WIRE_VERSION  6
#define CPS_WIRE_HDR_SIZE 64
/* Hard cap on one message's payload (compressed or not); larger is refused as CPS_ESIZE. */
#define CPS_WIRE_MAX_PAYLOAD (1u << 30)

/* Message types. Values are on the wire: never renumber. */
enum cps__msg_type {
    CPS_MSG_HELLO = 1,         /* node -> scheduler: join (payload: hello) */
    CPS_MSG_WELCOME = 2,       /* scheduler -> node: id + rank assigned (payload: view) */
    CPS_MSG_VIEW = 3,          /* scheduler -> all: a new view (payload: view) */
    CPS_MSG_GET_VIEW = 4,      /* node -> scheduler: send me the current view */
    CPS_MSG_HEARTBEAT = 5,     /* node -> scheduler (payload: stats) */
    CPS_MSG_BARRIER = 6,       /* worker -> scheduler; reply BARRIER_DONE when all arrived */
    CPS_MSG_BARRIER_DONE = 7,  /* scheduler -> worker */
    CPS_MSG_BYE = 8,           /* worker -> scheduler: this worker finished */
    CPS_MSG_SHUTDOWN = 9,      /* scheduler -> all: the job is over, exit */
    CPS_MSG_STATUS = 10,       /* anyone -> scheduler: status request */
    CPS_MSG_STATUS_REPLY = 11, /* payload: view, then per-node stats */
    CPS_MSG_DECLARE = 20,      /* worker -> server: create keys if absent (payload: kv + spec) */
    CPS_MSG_PUSH = 21,         /* worker -> server: gradients (payload: kv with values) */
    CPS_MSG_PULL = 22,         /* worker -> server: read (payload: kv without values) */
    CPS_MSG_PUSH_PULL = 23,    /* push, then reply with the new values */
    CPS_MSG_ACK = 24,          /* server -> worker: request done (no payload) */
    CPS_MSG_VALUES = 25,       /* server -> worker: reply to PULL / PUSH_PULL (payload: kv) */
    CPS_MSG_ERROR = 26,        /* reply with status < 0; payload: UTF-8 text, may be empty */
    CPS_MSG_CHECKSUM = 27,     /* request/reply: checksum of a range (aux = value) */
    CPS_MSG_FWD = 28,          /* chain: predecessor -> successor, one update (seq in req_seq) */
    CPS_MSG_CHAIN_ACK = 29,    /* chain: successor -> predecessor, committed up to req_seq */
    CPS_MSG_JOIN_RANGE = 30,   /* scheduler -> server: copy `range` from node `aux`, then join */
    CPS_MSG_SNAP_REQ = 31,     /* joiner -> tail: send me a snapshot of `range` */
    CPS_MSG_SNAP = 32,         /* tail -> joiner: snapshot records (req_seq = snapshot seq;
                                  step = join id; aux = 1 on the last chunk; req_worker = the
                                  chunk's number in its stream, from 0) */
    CPS_MSG_CAUGHT_UP = 33,    /* joiner -> scheduler: `range` copied, applied up to req_seq */
    CPS_MSG_CHAIN_MARK = 34,   /* ex-tail -> its new successor: I had applied up to req_seq */
    /* Checkpoints (src/server/cut.c, src/checkpoint/cluster_*.c). A tool that is not a member of
     * the job sends these with a hello payload naming its inbox (as STATUS does). */
    CPS_MSG_PUT = 35,       /* restore tool -> head: install records (payload: snapshot entries
                               of src/server/transfer.c), replicated as one CPS_UPD_PUT; reply:
                               req_seq = range seq, aux echoed (the tool puts its req_seq there) */
    CPS_MSG_CUT_PROBE = 36, /* tool -> tail: `range`'s applied steps (reply: step = lowest sync
                               step of its key sets, aux = highest, req_seq = range seq) */
    CPS_MSG_CUT_OPEN = 37,  /* tool -> tail: open read view `aux` of `range` at step boundary
                               `step` (0: now); reply: step, req_seq = seq, payload = the address
                               of the thread serving CUT_READ */
    CPS_MSG_CUT_READ = 38,  /* tool -> cut thread: read a span of records (cut.c) */
    CPS_MSG_CUT_CLOSE = 39, /* tool -> cut thread: done with read view `aux` */
    CPS_MSG_REGISTER = 40,  /* worker -> scheduler: a tensor's description (tensor_desc) */
    CPS_MSG_REGISTRY = 41,  /* tool -> scheduler: reply = view, u32 count, descriptions */
    CPS_MSG_RELEASE = 42,   /* tool -> scheduler: restore done, admit the held workers */
    CPS_MSG_CKPT_DONE = 43, /* tool -> scheduler: a checkpoint was written (payload: ckpt_note) */
    /* Data-path failure evidence (recovery/suspect.h). */
    CPS_MSG_SUSPECT = 44, /* node -> scheduler: servers that left our requests unanswered
                             (payload: suspect list below) */
    CPS_MSG_PROBE = 45,   /* scheduler -> server, sent to its inbox like any request; the server's
                             loop answers it (CPS_WF_REPLY, same req_seq) */
    CPS_MSG_DRAIN = 46,   /* tool -> scheduler: drain server of rank `aux` (payload as STATUS);
                             server -> scheduler: drain me (SIGTERM). Reply ACK or ERROR */
    /* Collectives among workers (replication/collective.h, docs/collective.md). */
    CPS_MSG_COLL = 47,  /* worker -> worker: a ring chunk or a completed result (range = kind,
                           req_seq = collective seq, step = message index, aux = length) */
    CPS_MSG_LOCAL = 48, /* tool <-> worker: the local tensors at a step boundary (worker/localset.h)
                         */
    CPS_MSG_TYPE_MAX_ = 49
};

/* Header flags. */
#define CPS_WF_SNAPPY 0x0001u /* payload is snappy-compressed; raw_len is its decoded size */
#define CPS_WF_REPLY  0x0002u /* message is a reply to a request with the same request id */
/* Apply this push on arrival even in sync mode: sparse row pushes, whose key sets differ between
 * workers, so there is no per-step aggregate to wait for. They carry their own sequence space. */
#define CPS_WF_NOAGG 0x0004u
/* PUSH / PUSH_PULL only: the values of the kv payload are a lossy gradient codec's block
 * (cps__wire_kv_decode_lossy below; the block's format, codec id and count are in
 * core/gradcodec.h). The head decodes it to float32 before anything else, so a lossy push never
 * goes further: FWD updates, the store and checkpoints hold plain floats. Snappy, when it pays,
 * applies to the payload as usual (CPS_WF_SNAPPY then describes the bytes on the wire, and the
 * decompressed payload is this one). A message without the flag decodes exactly as before, and
 * a server that predates it refuses the flag as unknown rather than misreading the values. */
#define CPS_WF_LOSSY 0x0008u
/* Replies (ACK / VALUES) to a sync push only: the push came late, after its step had closed
 * with the first W-b gradients (backup workers), and was dropped, not applied. aux = the key
 * set's last closed step in the range: the worker continues after it. */
#define CPS_WF_LATE 0x0010u
/* PUSH / PUSH_PULL only: the worker's first push of this key set since it joined the job. It
 * has no push of a lower step to come, so a sync step below this one stops waiting for it
 * (replication/sync.c, pushed_later): a worker joining a running job starts after every range's
 * last step, and the ranges that had not closed that step yet close it without it. */
#define CPS_WF_FIRST 0x0020u
/* FWD only: sent by a tail to its shadow (a joiner copying the range), after the tail applied
 * it; aux is then the join's id, not how far the sender applied (replication/chain.c). */
#define CPS_WF_SHADOW 0x0040u
#define CPS_WF_KNOWN_                                                                              \
    (CPS_WF_SNAPPY | CPS_WF_REPLY | CPS_WF_NOAGG | CPS_WF_LOSSY | CPS_WF_LATE | CPS_WF_FIRST |     \
     CPS_WF_SHADOW)

/* VIEW and WELCOME from the scheduler (aux: the job's id): header `step` bit 0 says that no
 * worker rank awaits a replacement: each is held by a live worker of the view or its worker
 * finished and said goodbye. So a worker not live in it left cleanly, and a replacement alone
 * in the view has nobody to wait for: the job's work is done (replication/ring_fetch.h). A
 * scheduler that predates it sends 0 (the replacement then fails CPS_ENOPEER, as it did), and a
 * worker that predates it ignores `step` on a view: no version change. */
#define CPS_VIEW_WORKERS_SETTLED 1u

/* Request sequence spaces (header req_seq): dense pushes count 1, 2, ... per (worker, range);
 * sparse-row pushes (CPS_WF_NOAGG) have CPS_SEQ_SPARSE set and their own count; every other
 * request (declare, pull) has CPS_SEQ_OTHER set, so it can never leave a gap in a push space. */
#define CPS_SEQ_SPARSE (1ull << 62)
#define CPS_SEQ_OTHER  (1ull << 63)
/* A worker's sparse pushes have their exactly-once record under its id with this bit. */
#define CPS_DEDUP_SPARSE_BIT 0x80000000u
/* In SSP mode a worker's clock in a range (the highest step of its dense pushes applied there,
 * replication/ssp.h) is kept under its id with this bit, next to its exactly-once records: it is
 * written in the same transaction as the update that moves it and travels in a state-transfer
 * snapshot with them, so a restarted server or a new tail gates pulls on the same clocks as the
 * replicas that applied those pushes. */
#define CPS_DEDUP_CLOCK_BIT 0x40000000u

typedef struct cps__msg_hdr {
    uint8_t version;
    uint8_t type;
    uint16_t flags;
    uint32_t sender;
    int32_t status;
    uint64_t epoch;
    uint32_t req_worker;
    uint32_t range;
    uint64_t req_seq;
    uint64_t step;
    uint32_t payload_len;
    uint32_t raw_len;
    uint64_t aux;
} cps__msg_hdr;

/* Little-endian load/store helpers (unaligned-safe). */
static inline void cps__le32_put(void *p, uint32_t v)
{
    unsigned char *b = p;
    b[0] = (unsigned char)v, b[1] = (unsigned char)(v >> 8), b[2] = (unsigned char)(v >> 16),
    b[3] = (unsigned char)(v >> 24);
}
static inline uint32_t cps__le32_get(const void *p)
{
    const unsigned char *b = p;
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}
static inline void cps__le64_put(void *p, uint64_t v)
{
    cps__le32_put(p, (uint32_t)v);
    cps__le32_put((unsigned char *)p + 4, (uint32_t)(v >> 32));
}
static inline uint64_t cps__le64_get(const void *p)
{
    return (uint64_t)cps__le32_get(p) | (uint64_t)cps__le32_get((const unsigned char *)p + 4) << 32;
}

/* Write `h` into the first CPS_WIRE_HDR_SIZE bytes of `buf` (magic and version are filled in). */
void cps__wire_hdr_encode(void *buf, const cps__msg_hdr *h);

/* Parse and validate a header from a whole message of `len` bytes: magic, version, known type,
 * known flags (CPS_WF_LOSSY only on PUSH / PUSH_PULL), status <= 0, payload_len == len - 64,
 * payload_len <= CPS_WIRE_MAX_PAYLOAD, raw_len
 * == payload_len unless CPS_WF_SNAPPY (then 0 < raw_len <= CPS_WIRE_MAX_PAYLOAD and raw_len <=
 * 22 * payload_len, the most snappy can expand: so raw_len is safe to allocate).
 * Returns 0, CPS_EPROTO (bad magic/version/type/flags/status) or CPS_ESIZE (lengths). */
int cps__wire_hdr_decode(const void *buf, size_t len, cps__msg_hdr *out);

/* ---- key/value payload (DECLARE, PUSH, PULL, PUSH_PULL, VALUES) ----
 *   u32 nkeys, u32 nvals (sum of lens when values are present, else 0)
 *   u64 keys[nkeys]        strictly increasing
 *   u32 lens[nkeys]        each > 0
 *   zero padding to a multiple of 8 bytes from the payload start
 *   f32 vals[nvals]        little-endian IEEE-754
 * nkeys >= 1. A payload without values has nvals == 0 and ends after the padding. */
typedef struct cps__kv {
    uint32_t nkeys;
    uint64_t nvals;       /* 0 when the payload carries no values */
    const uint64_t *keys; /* borrowed; 8-byte aligned when the payload is */
    const uint32_t *lens; /* borrowed */
    const float *vals;    /* borrowed; NULL when nvals == 0 */
} cps__kv;

/* Bytes needed for a kv payload with `nkeys` keys and `nvals` values (0 for none); SIZE_MAX when
 * nvals > UINT32_MAX, which has no encoding. */
size_t cps__wire_kv_size(uint32_t nkeys, uint64_t nvals);
/* Encode into `buf` (capacity `cap`). `vals` may be NULL when nvals == 0. Returns bytes written
 * or 0 if cap is too small. Does not validate ordering (the decoder does). */
size_t cps__wire_kv_encode(void *buf, size_t cap, uint32_t nkeys, const uint64_t *keys,
                           const uint32_t *lens, const float *vals, uint64_t nvals);
/* Decode and validate a kv payload. `need_vals`: 1 values required, 0 values forbidden,
 * -1 either. Requires `buf` 8-byte aligned (returns CPS_EINVAL otherwise; the transport's buffers
 * are). Errors: CPS_EPROTO (nkeys 0, unsorted keys, zero len, bad padding), CPS_ESIZE (sizes). */
int cps__wire_kv_decode(const void *buf, size_t len, int need_vals, cps__kv *out);

/* ---- lossy push payload (CPS_WF_LOSSY) ----
 *   u32 nkeys, u32 nvals (> 0: the number of float values the block stands for, == sum of lens)
 *   u64 keys[nkeys], u32 lens[nkeys], zero padding to 8   (exactly as in a kv payload)
 *   codec block (core/gradcodec.h) to the end of the payload, >= 1 byte
 * Decodes and validates the keys part like cps__wire_kv_decode (out->vals is NULL) and returns
 * the block, borrowed from buf; the caller decodes it with cps__gradcodec_decode(nvals).
 * Errors: CPS_EINVAL (NULL, misaligned), CPS_EPROTO (as kv, or nvals 0), CPS_ESIZE. */
int cps__wire_kv_decode_lossy(const void *buf, size_t len, cps__kv *out, const void **block,
                              size_t *block_len);

/* ---- parameter spec (DECLARE: follows the kv payload, 8-byte aligned) ----
 * For each key: u64 offset of its first element within the whole tensor (so initial values are
 * the same whatever the chunking), then one fixed 64-byte spec block. */
enum cps__init_kind_w {
    CPS_W_INIT_ZEROS = 0,
    CPS_W_INIT_CONSTANT,
    CPS_W_INIT_UNIFORM,
    CPS_W_INIT_NORMAL
};
enum cps__opt_kind_w {
    CPS_W_OPT_SGD = 0,
    CPS_W_OPT_MOMENTUM,
    CPS_W_OPT_ADAGRAD,
    CPS_W_OPT_ADAM,
    CPS_W_OPT_RMSPROP
};

typedef struct cps__param_spec {
    uint32_t init_kind; /* cps__init_kind_w */
    float init_a;       /* constant value / uniform low / normal mean */
    float init_b;       /* uniform high / normal stddev */
    uint64_t init_seed;
    uint32_t opt_kind; /* cps__opt_kind_w */
    uint32_t nesterov; /* 0 or 1, momentum only */
    float lr, weight_decay, momentum, beta1, beta2, eps, rho;
} cps__param_spec;

#define CPS_WIRE_SPEC_SIZE 64
void cps__wire_spec_encode(void *buf, const cps__param_spec *s);
/* Validates kinds and finite, sane hyper-parameters (lr > 0, 0 <= momentum < 1, 0 < beta < 1,
 * eps > 0, 0 < rho < 1, weight_decay >= 0, uniform low < high, stddev >= 0). A hyper-parameter
 * the chosen optimizer does not use must be 0 or valid; nesterov is 0 unless momentum.
 * Errors: CPS_EPROTO naming nothing; the caller logs which key. */
int cps__wire_spec_decode(const void *buf, cps__param_spec *out);

/* DECLARE payload = kv (no values) + u64 offsets[nkeys] + spec block (one for all keys). */
size_t cps__wire_declare_size(uint32_t nkeys);
size_t cps__wire_declare_encode(void *buf, size_t cap, uint32_t nkeys, const uint64_t *keys,
                                const uint32_t *lens, const uint64_t *offsets,
                                const cps__param_spec *spec);
/* `offsets` is borrowed from buf (8-byte aligned). */
int cps__wire_declare_decode(const void *buf, size_t len, cps__kv *kv, const uint64_t **offsets,
                             cps__param_spec *spec);

/* ---- tensor description (REGISTER, REGISTRY): what a checkpoint needs to name the keys ----
 *   u32 kind (0 dense, 1 table), u32 cols (tables; 0 for dense), u64 length (elements), u64 rows
 *   (tables; 0 for dense), u64 0, spec block [64], u32 name_len (1..255), u32 ndim (0..8), name,
 *   zero pad to 8, u64 dims[ndim].
 * ndim 0 is a description from before shapes were recorded (a scheduler's saved registry): its
 * shape is [length] (dense) or [rows, cols] (table). A table's shape, when given, is [rows, cols];
 * a dense tensor's dims multiply to its length. */
#define CPS_TENSOR_NAME_MAX 255
/* kind 2: no keys on the servers; a worker registers it so that exports know the job has local
 * tensors to ask the workers for (worker/localset.h). Laid out like a dense description. */
#define CPS_DESC_LOCAL 2u
typedef struct cps__tensor_desc {
    uint32_t kind; /* 0 dense, 1 table, 2 held by the workers (CPS_DESC_LOCAL) */
    uint32_t cols;
    uint64_t length;
    uint64_t rows;
    cps__param_spec spec;
    uint32_t ndim; /* 0: not recorded */
    uint64_t dims[CPS_MAX_NDIM];
    char name[CPS_TENSOR_NAME_MAX + 1];
} cps__tensor_desc;

/* The shape a description stands for: its recorded dims, or the implied ones when ndim is 0.
 * Writes at most CPS_MAX_NDIM dims; returns their count (>= 1). */
uint32_t cps__tensor_desc_shape(const cps__tensor_desc *d, uint64_t *dims);
/* 1 if dims[0..ndim) are each >= 1 and multiply to `length` without overflow, else 0. */
int cps__shape_matches(uint32_t ndim, const uint64_t *dims, uint64_t length);

size_t cps__wire_tensor_desc_size(const cps__tensor_desc *d);
/* Returns bytes written, 0 if cap is too small. */
size_t cps__wire_tensor_desc_encode(void *buf, size_t cap, const cps__tensor_desc *d);
/* Decode one description at buf (len bytes available); *used receives its size. Validates the
 * kind, the shape (table: length == rows * cols), the spec and the name (no NUL inside).
 * Errors: CPS_ESIZE (truncated), CPS_EPROTO. */
int cps__wire_tensor_desc_decode(const void *buf, size_t len, cps__tensor_desc *out, size_t *used);

/* A completed checkpoint: what the tool that wrote it tells the scheduler (CKPT_DONE) and what
 * the scheduler tells `chainps status` (the tail of STATUS_REPLY) and keeps in its store.
 * Encoded as u64 id, u64 step, u64 unix_ms, u64 age_ms, u32 path length, path bytes (no NUL). */
#define CPS_CKPT_NOTE_PATH_MAX 1024
typedef struct cps__ckpt_note {
    uint64_t id;      /* the scheduler's count of this job's checkpoints (1, 2, ...); 0: none */
    uint64_t step;    /* the training step of the cut */
    uint64_t unix_ms; /* wall clock (ms since 1970) when it was complete, by the writer's clock */
    uint64_t age_ms;  /* STATUS_REPLY only: its age by the scheduler's clock (0 elsewhere) */
    char path[CPS_CKPT_NOTE_PATH_MAX]; /* what a reader opens, as the writer named it */
} cps__ckpt_note;

/* STATUS_REPLY's last part (after the checkpoint note, or in its place when there is none):
 * the ranges held unavailable because their only replica came back empty. u32 this tag, u32
 * count, then per range u32 range, u32 the empty server kept out, u32 the fallback (0: none).
 * Older tools ignore it (where they look for a note, it does not decode as one). A note starts
 * with its id, a count of the job's checkpoints from 1, never this tag's 1.1e9. */
#define CPS_STATUS_STRANDED_TAG 0x44525453u /* "STRD" */

#define CPS_CKPT_NOTE_FIXED 36
/* Bytes the encoding of n takes. */
size_t cps__ckpt_note_size(const cps__ckpt_note *n);
/* Returns bytes written, 0 if cap is too small. */
size_t cps__ckpt_note_encode(void *buf, size_t cap, const cps__ckpt_note *n);
/* Decode one note at buf (len bytes available; more may follow); *used (may be NULL) receives
 * its size. Errors: CPS_ESIZE (truncated), CPS_EPROTO (path empty, too long or holding a NUL). */
int cps__ckpt_note_decode(const void *buf, size_t len, cps__ckpt_note *out, size_t *used);

/* ---- suspect list (SUSPECT) ----
 *   u32 count (1..CPS_SUSPECT_MAX), u32 0, then count x { u32 node, u32 unanswered_ms }
 * node: a server the sender has requests out to and heard nothing from for unanswered_ms
 * (>= 1); nodes distinct and strictly increasing, so one list has one encoding. */
#define CPS_SUSPECT_MAX 64
typedef struct cps__suspect_entry {
    uint32_t node;
    uint32_t unanswered_ms;
} cps__suspect_entry;

size_t cps__wire_suspects_size(uint32_t count);
/* Returns bytes written; 0 if cap is too small or count is 0 or above CPS_SUSPECT_MAX. Does not
 * check the order (the decoder does). */
size_t cps__wire_suspects_encode(void *buf, size_t cap, const cps__suspect_entry *e,
                                 uint32_t count);
/* Decodes into out[0..CPS_SUSPECT_MAX). Errors: CPS_ESIZE (length is not 8 + 8 * count),
 * CPS_EPROTO (count 0 or too large, padding not 0, nodes not increasing, unanswered_ms 0). */
int cps__wire_suspects_decode(const void *buf, size_t len, cps__suspect_entry *out,
                              uint32_t *count);

#endif
