/* A tensor and its parts: the keys of each range it lives in (layout.c cuts it), which the
 * client (client.h) sends and the API keeps. The lowest file of src/worker. */
#ifndef CPS_WORKER_LAYOUT_H
#define CPS_WORKER_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "chainps/chainps.h"
#include "core/gradcodec.h"
#include "core/view.h"
#include "core/wire.h"
#include "recovery/session.h"

/* The keys of one operation that live in one range, sorted, with where each key's values sit
 * in the caller's buffer. */
typedef struct cps__part {
    uint32_t range;
    uint32_t nkeys;
    uint64_t *keys;
    uint32_t *lens;
    uint64_t *src_off;  /* element offset of key j's values in the caller's buffer */
    uint64_t *init_off; /* element offset of key j within its tensor (declare only) */
    uint64_t nvals;
    /* A tensor's part under a lossy codec: what the encodings of its pushes have lost so far
     * (nvals floats, in the order the part's values are sent), added to the next push's
     * gradient (error feedback). Allocated at the first lossy push, freed with the part. */
    float *resid;
    /* Snappy on this part's pushes (client.c, zip_try/zip_note): pushes still to send without
     * trying, and how many tries in a row saved nothing (the backoff's exponent). */
    uint32_t zip_skip;
    uint32_t zip_fails;
} cps__part;

struct cps_tensor {
    char name[256];
    uint64_t length;
    uint64_t rows; /* tables: rows x cols; dense tensors: rows == 0 */
    uint32_t cols;
    uint32_t ndim; /* shape: dims[0..ndim), row-major; [length] for a plain declaration */
    uint64_t dims[CPS_MAX_NDIM];
    uint64_t hash;
    cps__param_spec spec;
    uint32_t nparts;
    cps__part *parts;      /* the whole tensor, by range */
    cps__sess_clock clock; /* its step, kept by the session (recovery/session.h) */
    cps__gradcodec codec;  /* lossy codec of its dense pushes (cps_tensor_compress); NONE: off */
    struct cps_tensor *next;
};

/* Fill t->parts for a dense tensor (chunks) or a table (rows) under view v.
 * Errors: CPS_ENOMEM, CPS_EINVAL. */
int cps__layout_tensor(cps_tensor *t, const cps__view *v);
/* Key of row `row` of table t under view v. */
uint64_t cps__layout_row_key(const cps_tensor *t, const cps__view *v, uint64_t row);
/* Split sorted raw keys into per-range parts (values contiguous in key order).
 * Errors: CPS_EINVAL (unsorted / duplicate keys, zero len), CPS_ENOMEM. */
int cps__layout_raw(const cps__view *v, const uint64_t *keys, size_t nkeys, const uint32_t *lens,
                    cps__part **parts, uint32_t *nparts);
void cps__parts_free(cps__part *parts, uint32_t nparts);

#endif
