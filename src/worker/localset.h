/* Worker-held tensors in checkpoints (include/chainps/localstate.h): the list a worker keeps,
 * the CPS_MSG_LOCAL exchange with an exporter, and the blob both sides encode and decode.
 *
 * Wire (CPS_MSG_LOCAL): tool -> worker, payload = the tool's hello (where to answer), `step` =
 * the step boundary wanted, `aux` = 1 for "the next boundary, whatever its step" (async jobs),
 * `req_seq` = the request's id. Worker -> tool, CPS_WF_REPLY, same req_seq: status 0 and the blob
 * of the boundary `step`; CPS_EPAST with `step` = the boundary the worker is already at;
 * CPS_ENOTFOUND when it lists no tensor.
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

#define CPS_LSET_NAME     "cps.local" /* the registry's marker (kind CPS_DESC_LOCAL) */
#define CPS_LSET_META_MAX 200         /* bytes of a metadata key */

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

/* Client hooks (client.c), under the client's lock. */
void cps__lset_on_msg(struct cps_client *c, const cps__rx *rx);
void cps__lset_free(struct cps_client *c);

#endif
