/* Worker client internals: tensors are cut into keys spread over the key ranges (layout.h);
 * operations fan out into one request per range and complete when every request has been
 * answered (client.c, the core that the all-reduce and the local tensors run on); worker.c opens
 * the client and hands each message to its part. */
#ifndef CPS_WORKER_CLIENT_H
#define CPS_WORKER_CLIENT_H

#include <pthread.h>
#include <stdint.h>

#include "chainps/chainps.h"
#include "core/config.h"
#include "core/gradcodec.h"
#include "core/log.h"
#include "core/view.h"
#include "core/wire.h"
#include "layout.h"
#include "node/loop.h"
#include "node/heartbeat.h"
#include "recovery/session.h"
#include "transport/transport.h"

#define SCHED_PEER 0u /* the scheduler's peer id in c->tp */

/* The wire description of a declaration: `init` (NULL: zeros) and `optim` (NULL: SGD 0.01)
 * checked, the optimizer's defaults filled in. Whatever else builds a spec a worker must match
 * (a restore's --optimizer) goes through here too. `name` is for the log. Errors: CPS_EINVAL.
 * In spec.c, below the client: localset.c and the command line use it too. */
int cps__spec_make(const char *name, const cps_init *init, const cps_optim *optim,
                   cps__param_spec *spec);

enum op_kind {
    OP_DECLARE = CPS_SS_DECLARE,
    OP_PUSH = CPS_SS_PUSH,
    OP_PULL = CPS_SS_PULL,
    OP_PUSH_PULL = CPS_SS_PUSH_PULL
};

/* One part's values as a lossy codec encoded them (core/gradcodec.h), once, when the push was
 * made: every send of the request, re-sends included, carries these very bytes, so a retry is
 * byte-identical and never re-encoded with a residual that has moved on since. */
typedef struct cps__enc {
    void *buf;
    size_t len;
} cps__enc;

typedef struct cps__op {
    /* What the session (recovery/session.h) keeps of it: kind, parts, pending, result, step,
     * first push, sparse rows. */
    cps__sess_op so;
    const float *grad;
    float *out;
    const cps__param_spec *spec;
    cps__part *parts; /* so.nparts of them, borrowed from the tensor, or owned (own_parts); a
                         send updates each part's snappy backoff (zip_skip, zip_fails) */
    int own_parts;
    float *scratch; /* owned buffer (sparse rows) */
    cps__enc *enc;  /* lossy pushes: nparts encoded blocks, owned (cps__op_enc_free); else NULL */
    struct cps_client *client;
    int in_use; /* handle given to the caller and not yet waited to completion */
    /* The ERROR line logged as `result` was set, maybe in another thread's call: cps_wait gives
     * it to its caller (cps_last_error_message). */
    char why[CPS__WHY_MAX];
} cps__op;

struct cps_handle {
    cps__op op;
};

/* The operation a session op belongs to (NULL: none). */
static inline cps__op *cps__op_of(cps__sess_op *so)
{
    return so ? (cps__op *)(void *)((char *)so - offsetof(cps__op, so)) : NULL;
}

struct cps_client {
    pthread_mutex_t lock;
    cps__config cfg;
    cps__tp *tp;
    cps__loop *loop; /* the event loop the blocking calls run until their condition holds */
    cps__loop_tp inbox;
    uint32_t id; /* ours, once the scheduler welcomed us (cps__sess_id) */
    uint32_t rank;
    /* The worker's protocol: the view, the requests in flight, their ids, the tensors' steps,
     * the calls to the scheduler (recovery/session.h). This file performs what it decides. */
    cps__sess *sess;
    const cps__view *view; /* the session's: cps__sess_view */
    char addr[CPS_ADDR_MAX];
    struct detached_push *detached; /* pushes given up, still sent (see client.c) */
    cps_tensor *tensors;
    uint64_t clock; /* the highest training step pushed (cps__client_publish_step) */
    cps_client_stats stats;
    void *pack; /* scratch for compression */
    size_t pack_cap;
    uint32_t *gc_scratch; /* scratch of lossy top-k encodings (gc_scratch_n entries) */
    uint64_t gc_scratch_n;
    /* Heartbeats come from a thread of their own (with its own socket), so a long compute
     * step between calls never looks like a dead worker. */
    cps__heartbeat *hb;     /* heartbeats from a thread (a long step is no death) */
    struct cps__ar *ar;     /* all-reduce among the workers (collective.c); NULL until first used */
    struct cps__lset *lset; /* local tensors for checkpoints (localset.c); NULL until first used */
    /* The part whose values the reply being handled already copied into the caller's buffer,
     * checking it on the way (client.c, take_checked_values); NULL: none. */
    const struct cps__op *placed_op;
    uint32_t placed_part;
    /* Called after every turn of the loop (cps__client_progress): the all-reduce's timeouts
     * (cps__ar_tick), wired by cps_open (worker.c), so that this core names none of the parts
     * that run on it. NULL: none. */
    void (*on_turn)(struct cps_client *c);
};

/* Start op's requests (op->so.kind and so.nparts set) under `clock`, the tensor's (NULL: a raw
 * pull or declaration; see cps__sess_begin for `mark_first`); with `wait`, run the loop until it
 * completes and return its result. */
int cps__client_run(struct cps_client *c, cps__op *op, cps__sess_clock *clock, int mark_first,
                    int wait);
/* A push of training step `step` went out: the heartbeat carries the worker's counters and its
 * clock (the highest step pushed) to the scheduler, for `chainps status`. Under c->lock. */
void cps__client_publish_step(struct cps_client *c, uint64_t step);
/* Run the loop until op completes or timeout_ms passes (CPS_ETIMEDOUT). */
int cps__client_wait(struct cps_client *c, cps__op *op, int timeout_ms);
/* Encode op's gradient for every part of tensor t with t's lossy codec, adding each part's
 * residual first and keeping what the encoding lost as the new residual (error feedback); fills
 * op->enc. Everything is allocated before any residual changes, so on failure (CPS_ENOMEM)
 * nothing moved and the push can be made again. */
int cps__op_encode(struct cps_client *c, cps_tensor *t, cps__op *op);
/* Free op->enc (NULL is fine). */
void cps__op_enc_free(cps__op *op);
/* One turn of the loop (at most timeout_ms): receive, re-send, report, then c->on_turn. Under
 * c->lock. */
int cps__client_progress(struct cps_client *c, int timeout_ms);
/* Perform what the last call into the session decided, in its order (sends, completions, logs). */
void cps__client_perform(struct cps_client *c);
/* Make a call to the scheduler (recovery/session.h: cps__sess_call) and run the loop until it is
 * over, `turn_ms` at a time. Returns its result, or the loop's error. */
int cps__client_call(struct cps_client *c, uint8_t type, const void *payload, size_t n,
                     int turn_ms);
/* Free what the core holds (loop, tensors, transport, session, detached pushes, scratch) and c;
 * the parts above it (heartbeat, all-reduce, local tensors) are freed first (worker.c). */
void cps__client_destroy(struct cps_client *c);
/* Scheduler barrier. */
int cps__client_barrier(struct cps_client *c);
/* Tell the scheduler a tensor's description (for checkpoints) and wait for its answer.
 * Errors: CPS_EEXIST (registered with another definition), CPS_ESHUTDOWN, transport errors. */
int cps__client_register(struct cps_client *c, const cps__tensor_desc *d);

#endif
