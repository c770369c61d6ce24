/* Worker-held tensors in checkpoints (include/chainps/localstate.h): the list a worker keeps,
 * the CPS_MSG_LOCAL exchange with an exporter, and the blob both sides encode and decode.
 *
 * Wire (CPS_MSG_LOCAL): tool -> worker, payload = the tool's hello (where to answer), `step` =
 * the step boundary wanted, `aux` = 1 for "the next boundary, whatever its step" (async jobs),
 * `req_seq` = the request's id. Worker -> tool, CPS_WF_REPLY, same req_seq: status 0 and the blob
 * of the boundary `step` in chunks, in order, each with payload u64 blob length, u64 offset, then
 * at most CHAINPS_LOCAL_CHUNK bytes of the blob (a model of any size, in messages of bounded
 * size); CPS_EPAST with `step` = the boundary the worker is already at; CPS_ENOTFOUND when it lists
 * no tensor; CPS_EAGAIN when CPS_LSET_QUEUE other exports are waiting (the oldest waiting one is
 * told so and gives way) or being answered.
 *
 * A worker holds up to CPS_LSET_QUEUE requests at once, from different exporters (two
 * `chainps checkpoint export` at once, a periodic one beside a manual one) and answers each.
 *
 * Blob (little-endian): u32 magic "CPSL", u32 tensors, u32 metas, u32 0, u64 step; per tensor u32
 * name length (1..255), u32 ndim (1..8), u64 dims[ndim], name, zero pad to 4 bytes, float32
 * values; per meta u32 key length, u32 value length, key, value. */
#ifndef CPS_WORKER_LOCALSET_H
#define CPS_WORKER_LOCALSET_H

#include <stddef.h>
#include <stdint.h>

#include "core/wire.h"
#include "node/msg.h"

struct cps_client;
typedef struct cps__lset cps__lset;

#define CPS_LSET_NAME      "cps.local" /* the registry's marker (kind CPS_DESC_LOCAL) */
#define CPS_LSET_META_MAX  200         /* bytes of a metadata key */
#define CPS_LSET_QUEUE     8           /* exporters' requests a worker holds at once */
#define CPS_LSET_CHUNK_HDR 16          /* u64 blob length, u64 offset */
/* Blob bytes per message: 8 MiB (the exporter's read size) unless CHAINPS_LOCAL_CHUNK says
 * otherwise (CPS_LSET_CHUNK_MIN..MAX bytes; tests use small ones). */
#define CPS_LSET_CHUNK_DEFAULT (8u << 20)
#define CPS_LSET_CHUNK_MIN     64u
#define CPS_LSET_CHUNK_MAX     (256u << 20)
#define CPS_LSET_BLOB_MAX      (UINT64_C(1) << 42) /* what an exporter accepts at most */

typedef struct cps__lset_tensor {
    char name[CPS_TENSOR_NAME_MAX + 1];
    uint32_t ndim;
    uint64_t dims[CPS_MAX_NDIM];
    uint64_t numel;
    const void *data; /* numel float32 values, borrowed from the blob (any alignment) */
} cps__lset_tensor;

typedef struct cps__lset_blob {
    uint64_t step;
    uint32_t ntensors, nmeta;
    cps__lset_tensor *tensors; /* owned */
    char **keys, **values;     /* owned, NUL-terminated copies */
} cps__lset_blob;

/* Decode (and validate every length, name and shape of) a blob; tensors' data stay in `buf`.
 * Errors: CPS_EPROTO (malformed), CPS_ENOMEM. Free with cps__lset_blob_fini, also on error. */
int cps__lset_blob_decode(const void *buf, size_t len, cps__lset_blob *out);
void cps__lset_blob_fini(cps__lset_blob *b);

/* A blob being reassembled from its chunks (zero-initialised). */
typedef struct cps__lset_asm {
    unsigned char *buf; /* owned; the blob once complete */
    uint64_t cap, got, total, step;
} cps__lset_asm;

/* Take one chunk (the payload of a CPS_MSG_LOCAL answer of status 0; `step` its header's step).
 * Returns 1 when the blob is complete (buf[0..total)), 0 when more is to come; CPS_ESIZE (a chunk
 * shorter than its header or empty, a blob length under the fixed part or over
 * CPS_LSET_BLOB_MAX, data past that length), CPS_EPROTO (a chunk lost, repeated or out of order,
 * another length or step than the first chunk's), CPS_ENOMEM. After an error the caller fails the
 * exchange; cps__lset_asm_fini frees in every case. */
int cps__lset_asm_put(cps__lset_asm *a, uint64_t step, const void *payload, size_t len);
void cps__lset_asm_fini(cps__lset_asm *a);

/* Client hooks (client.c), under the client's lock. */
void cps__lset_on_msg(struct cps_client *c, const cps__rx *rx);
void cps__lset_free(struct cps_client *c);

#endif
