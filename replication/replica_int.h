/* Private to replication/replica*.c: the replica's state and the helpers that build its ready
 * list (replica_ready.c), shared with the request and interface side (replica.c). */
#ifndef CPS_REPLICATION_REPLICA_INT_H
#define CPS_REPLICATION_REPLICA_INT_H

#include "recovery/joiner.h"
#include "replication/ackhold.h"
#include "replication/replica.h"
#include "replication/ssp.h"
#include "replication/sync.h"

/* A message the replica holds: a retry's answer waiting for a commit (chain cookie), a sync
 * contribution, a parked pull, a message of a future epoch. */
typedef struct rmsg {
    cps__replica_msg m;
    cps__kv kv;  /* decoded keys (and values) of a push or pull */
    int refused; /* a retry of a push the head refuses: its error */
    void *own;   /* a buffer of ours the message points into (parked push-pull keys) */
} rmsg;

typedef struct rlist {
    rmsg **v;
    size_t n, cap;
} rlist;

struct cps__replica {
    cps__replica_config cfg;
    uint64_t now_max; /* the latest clock any call brought (replica_clock) */
    cps__replica_env env;
    cps__view view;
    int have_view;
    cps__chain *chain;
    cps__sync *sync;
    cps__ssp *ssp;
    cps__ackhold *acks;
    int in_tick;    /* the chain timer runs: the FWDs sent now are re-sends */
    int destroying; /* cookies dropped now are released at once */
    cps__replica_out *out;
    size_t nout, out_cap;
    void **scratch; /* freed at the next call: texts, records */
    size_t nscratch, scratch_cap;
    rlist dispose; /* released at the next call (the ready list may point into them) */
    rlist early;   /* requests before our first view */
    rlist future;  /* messages of an epoch above our view's */
    rlist queue;   /* released by a view, stepped by cps__replica_next */
    rlist values;  /* push-pull answers waiting for our store to hold committed updates only */
    cps__replica_counters ctr;
    /* State transfer (replica_join.c): the joins of ranges we copy, the SNAP chunk an INSTALL
     * item points into, and whether the shell owes us the outcome of a BEGIN or INSTALL. */
    cps__joiner *joiner;
    rmsg *join_snap;
    int join_wait;
    /* At the tail: the snapshots ordered (SNAPSHOT items) whose end the shell has not reported
     * yet (cps__replica_snapshot_closed). */
    struct snap_order *snaps;
    uint32_t nsnaps, snaps_cap;
    /* CHAIN_MARK(APPLIED)s held until the end of the loop turn (cps__rp_flush_marks) or other
     * work (cps__rp_release_marks), one per range: the latest covers the earlier ones. */
    struct held_mark *marks;
    uint32_t nmarks, marks_held;
    /* Our standing (replica_fence.c). */
    cps__fence *fence;
};

#define MAX_EARLY 4096

/* ---- replica_ready.c ---- */
/* Memory of one call: rmsg_done releases a message at the next call (the ready list may point
 * into it); scratch memory is freed then too; begin starts a call with an empty ready list. */
int cps__rp_rlist_push(rlist *l, rmsg *m);
void cps__rp_rmsg_free(cps__replica *r, rmsg *m);
void cps__rp_rmsg_done(cps__replica *r, rmsg *m);
void *cps__rp_scratch(cps__replica *r, size_t n);
void cps__rp_begin(cps__replica *r);
/* The replica's clock: `now`, never earlier than one an earlier call brought. */
uint64_t cps__rp_clock(cps__replica *r, uint64_t now);
/* Append an item to the ready list (NULL: no memory). */
cps__replica_out *cps__rp_emit(cps__replica *r, int kind, uint32_t range);
void cps__rp_say(cps__replica *r, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void cps__rp_ask_view(cps__replica *r);
void cps__rp_reply_error(cps__replica *r, const cps__msg_hdr *req, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* An ACK, or with kv the values of kv's keys (VALUES), to the request `req` (its sender). */
void cps__rp_reply(cps__replica *r, const cps__msg_hdr *req, uint64_t step, const cps__kv *kv,
                   uint64_t aux, uint16_t flags);
/* The header of the request q of `range` stood for (type, worker, number, NOAGG). */
cps__msg_hdr cps__rp_req_hdr(const cps__chain_req *q, uint32_t range);
void cps__rp_reply_late(cps__replica *r, const cps__msg_hdr *h, const cps__kv *kv);
/* The key set's last step as the store holds it once this call's WRITEs are performed. */
int cps__rp_agg_step_now(cps__replica *r, uint32_t range, uint64_t sig, uint64_t *step);
extern const cps__chain_store_ops cps__rp_chain_ops;
/* Releases a cookie of the chain, the aggregator or the SSP gate (an rmsg). */
void cps__rp_drop_cookie(void *ctx, void *cookie);
uint64_t cps__rp_keyset_sig(const cps__kv *kv);
int cps__rp_ssp_load(cps__replica *r, uint32_t range);
void cps__rp_wake_parked(cps__replica *r);
int cps__rp_park_pull(cps__replica *r, rmsg *p, uint64_t clock);
int cps__rp_pull_may_proceed(cps__replica *r, uint32_t range, uint64_t clock, uint32_t worker);
/* A push-pull's values, read from committed updates only (see replica_ready.c): p->kv holds its
 * keys, CPS_WF_LATE in p's header makes it a late reply (cps__rp_reply_late). Answered now if
 * our store holds only committed updates of the range, else once it does (takes p). */
void cps__rp_answer_values(cps__replica *r, rmsg *p);
/* Answer the push-pulls whose store caught up (at the end of every chain run). */
void cps__rp_wake_values(cps__replica *r);
/* 1 if a push-pull answer waits for the commit point of `range`. */
int cps__rp_values_wait(const cps__replica *r, uint32_t range);
/* The chain's last actions into the ready list. */
void cps__rp_run_chain(cps__replica *r, uint64_t now);
void cps__rp_submit(cps__replica *r, uint32_t range, const cps__chain_update *u, uint64_t now);
void cps__rp_flush_acks(cps__replica *r, uint64_t now, int force);
/* Send the held CHAIN_MARK(APPLIED)s: the loop turn ended (cps__replica_tick), a view comes. */
void cps__rp_flush_marks(cps__replica *r);
/* Send the held CHAIN_MARK(APPLIED)s of every range but `keep` (UINT32_MAX: all of them): work
 * that would not replace them comes next in the ready list. */
void cps__rp_release_marks(cps__replica *r, uint32_t keep);

/* ---- replica_join.c ---- */
/* JOIN_RANGE, SNAP_REQ or SNAP (takes p). */
void cps__rp_on_transfer(cps__replica *r, rmsg *p, uint64_t now);
/* The joiner learns of the view just installed (created at the first). */
int cps__rp_joiner_view(cps__replica *r, uint64_t now);

/* ---- replica_fence.c ---- */
/* What our standing does with a message, a stall measured at `now` first (CPS_FENCE_*). */
int cps__rp_standing(cps__replica *r, const cps__msg_hdr *h, int our_welcome, uint64_t now);
/* What the fence makes of a view the news said to install: CPS_RV_FENCED, CPS_RV_DONE
 * (ignored), or CPS_RV_INSTALLED with *fresh (let in: the first view since we (re)started); the
 * LOG line said. The caller installs it. */
int cps__rp_fence_install(cps__replica *r, const cps__view *v, uint32_t self, int *fresh);

#endif
