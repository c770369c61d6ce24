/* A worker's exporters' requests for its local tensors (cps_local_add; checkpoint export): the
 * decisions. Which request is answered at once and with what, which one waits for its training
 * step's boundary and in which slot, which one gives way when all slots are taken, and what a
 * committed boundary (cps_local_commit) answers. src/worker/localset.c keeps each slot's
 * exporter address, encodes the blob and sends. Pure: no I/O, no clock.
 *
 * Each call fills an ordered list of actions for the shell, performed in that order. */
#ifndef CPS_REPLICATION_LOCAL_QUEUE_H
#define CPS_REPLICATION_LOCAL_QUEUE_H

#include <stddef.h>
#include <stdint.h>

#define CPS_LQ_SLOTS   8          /* requests held at once, from different exporters */
#define CPS_LQ_NO_STEP UINT64_MAX /* no boundary committed yet */

enum { CPS_LQ_FREE, CPS_LQ_WAITING, CPS_LQ_SENDING };

typedef struct cps__lq_slot {
    int state; /* CPS_LQ_* */
    int any;   /* the exporter takes the next boundary, whatever its step */
    uint64_t want, req_seq;
    uint64_t arrival; /* orders the requests: the oldest waiting one gives way */
} cps__lq_slot;

typedef struct cps__lq {
    cps__lq_slot q[CPS_LQ_SLOTS];
    uint64_t arrivals;
    uint64_t last; /* the last committed boundary, CPS_LQ_NO_STEP before the first */
} cps__lq;

/* Empty, no boundary committed. */
void cps__lq_init(cps__lq *q);

enum {
    CPS_LQ_STATUS = 1, /* answer request `req_seq` (of slot `slot`, or the new one when slot is
                          -1) with `status` and the boundary `step`, no blob */
    CPS_LQ_HOLD,       /* keep the new request in slot `slot` (its exporter's address with it) */
    CPS_LQ_BLOB        /* answer the request of slot `slot` with the blob of boundary `step`;
                          the slot stays taken until cps__lq_sent */
};
typedef struct cps__lq_act {
    int kind;
    int slot;
    uint64_t req_seq;
    int status;
    uint64_t step;
    uint64_t want; /* the boundary that request waited for (STATUS of a slot) */
} cps__lq_act;

/* An exporter's request `req_seq` for boundary `want` (`any`: the next one, whatever its step)
 * to a worker holding `ntensors` local tensors. Fills `acts` (at most 2) and returns how many:
 *  - STATUS of the new request (slot -1): CPS_ENOTFOUND (no local tensors), CPS_EPAST (the
 *    boundary is past; `step` says where we are), CPS_EAGAIN (every slot is being answered);
 *  - or HOLD in a free slot; when none is free, the oldest waiting request gives way first:
 *    STATUS CPS_EAGAIN of its slot, then HOLD in that slot (an exporter that died waiting for a
 *    far step must not block the later ones for ever). */
size_t cps__lq_request(cps__lq *q, uint64_t req_seq, uint64_t want, int any, size_t ntensors,
                       cps__lq_act acts[2]);

/* Boundary `step` committed. Fills `acts` (at most CPS_LQ_SLOTS) in slot order and returns how
 * many: STATUS CPS_EPAST for a waiting request of an earlier boundary (its slot is free again),
 * BLOB for one of this boundary or of any. Waiting requests of later boundaries wait on. */
size_t cps__lq_commit(cps__lq *q, uint64_t step, cps__lq_act acts[CPS_LQ_SLOTS]);

/* The BLOB of `slot` was sent (or could not be): the slot is free. */
void cps__lq_sent(cps__lq *q, int slot);

#endif
