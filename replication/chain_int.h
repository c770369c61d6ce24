/* Private to replication/chain*.c: the chain state machine's state and the helpers its files
 * share. chain.c runs the chain (admission, forwarding, acks, views, re-sends); chain_join.c
 * runs state transfer (the tail's shadow, the joiner's held updates, the new tail's MARK gate).
 * Not for use outside replication/. */
#ifndef CPS_REPLICATION_CHAIN_INT_H
#define CPS_REPLICATION_CHAIN_INT_H

#include "chain.h"

#define FWD_FIXED   24u
#define FWD_REQ     16u
#define DEDUP_SLOTS (2u * CPS_MAX_NODES)

/* Re-send timing: resend_ms, plus 1 ms per this many bytes of the oldest held update doubled per
 * unanswered round up to 2^RESEND_MAX_DOUBLINGS times. */
#define RESEND_BYTES_PER_MS  (50u << 10) /* ~50 MB/s: a slow successor applying a big update */
#define RESEND_MAX_DOUBLINGS 4

typedef struct sent_entry {
    uint64_t seq;
    cps__msg_hdr hdr;
    uint8_t *msg; /* whole wire message, header re-stamped on each send */
    size_t len;
    uint64_t sent_ms;
    uint64_t first_ms; /* its first send (cps__chain_waiting_since) */
} sent_entry;

/* A FWD held ahead of our predecessor's WRITE: its payload, in the caller's message (`owner`,
 * given back through ops->drop_cookie) or in a copy of ours. */
typedef struct ahead_entry {
    uint64_t seq;
    const uint8_t *payload;
    size_t len;
    uint8_t *copy;
    void *owner;
} ahead_entry;

typedef struct wait_reply {
    cps__chain_req req;
    uint64_t wait_seq;
    void *cookie;
} wait_reply;

typedef struct agg_rec {
    uint64_t sig, step;
} agg_rec;

typedef struct range_st {
    int loaded;
    uint64_t applied;
    uint64_t committed;
    sent_entry *sent; /* ascending seq */
    uint32_t nsent, sent_cap;
    wait_reply *waits;
    uint32_t nwaits, waits_cap;
    uint64_t *hw; /* DEDUP_SLOTS entries, UINT64_MAX = not loaded */
    agg_rec *aggs;
    uint32_t naggs, aggs_cap;
    /* State transfer. At the tail: a joining replica that also receives every update, and the
     * highest join id a shadow was added for (the scheduler's ids only grow: a lower one is a
     * late request of an abandoned join). */
    uint32_t shadow;
    uint64_t shadow_join;
    /* At the joiner: FWDs from `join_source` are held in `ahead` below until the snapshot is
     * installed, then applied in order. */
    int joining, join_ready;
    uint32_t join_source;
    /* A new tail serves reads only once it applied what its predecessor had (the MARK). */
    int gated;
    uint64_t mark;
    int mark_known;
    /* An ex-tail tells its new successor its applied seq until that successor acks it. */
    uint64_t mark_to_send;
    int mark_pending; /* mark_to_send is to be (re)sent: a MARK of 0 is a MARK too */
    uint64_t mark_sent_ms;
    /* FWDs held ahead, in ascending seq without gaps. Forward before apply, at a successor:
     * FWDs our predecessor sent ahead of its own WRITE (from applied + 1) until it says it
     * applied them, and the highest seq it said so of in this view (a FWD's aux, a CHAIN_MARK
     * with CPS_CHAIN_MARK_APPLIED). At a joiner: its source's FWDs, until the snapshot is in
     * (chain_join.c). */
    ahead_entry *ahead;
    uint32_t nahead, ahead_cap;
    uint64_t up_applied;
    uint32_t backoff;     /* re-send rounds without an ack since the last one (doubles the wait) */
    uint64_t progress_ms; /* the last ack that dropped updates: re-sends wait from then too */
    uint64_t succ_since;  /* when our current successor became it (cps__chain_waiting_since) */
    /* The node our FWDs come from (our predecessor, or the source we copy from while joining)
     * and the epoch of the first view of ours in which it was that: its FWDs and MARKs stamped
     * with an older epoch than ours, but not older than pred_epoch, are taken (chain.c's
     * from_steady_pred). */
    uint32_t pred;
    uint64_t pred_epoch;
} range_st;

struct cps__chain {
    cps__chain_config cfg;
    const cps__chain_store_ops *ops;
    void *ctx;
    cps__view view;
    int have_view;
    range_st *ranges;
    uint32_t nranges;
    cps__chain_action *acts;
    size_t nacts, acts_cap;
    void **scratch; /* buffers owned until the next call */
    size_t nscratch, scratch_cap;
    uint64_t fwd_bytes;
    uint64_t now; /* the time given by the current call */
};

/* aux of a CHAIN_ACK that answers a CHAIN_MARK: the MARK arrived. */
#define CPS_CHAIN_ACK_OF_MARK 1u
/* aux of a CHAIN_ACK that answers a FWD sent to us as a shadow (its aux: the join id) while we
 * are not copying the range from its sender: we gave that join up, or restarted since, or copy
 * from another tail. step is the join id the FWD named; req_seq is 0 (it acknowledges nothing). */
#define CPS_CHAIN_ACK_NOT_JOINING 2u

/* The range state and its helpers (chain_state.c). */
int cps__chain_grow(void **arr, uint32_t *cap, uint32_t need, size_t elem);
/* Starts every entry point: the last call's actions and scratch are released. */
void cps__chain_begin_call(cps__chain *c);
/* Keep buffer b (taken) until the next call: actions may point into it. */
int cps__chain_scratch_keep(cps__chain *c, void *b);
/* A buffer of len bytes that lives until the next call, or NULL. */
void *cps__chain_scratch_alloc(cps__chain *c, size_t len);
/* A new action of `kind` on range r, or NULL (no memory). */
cps__chain_action *cps__chain_act(cps__chain *c, int kind, uint32_t range);
/* This server's position in r's chain (0 head), or -1. */
int cps__chain_position(const cps__chain *c, uint32_t r);
uint32_t cps__chain_chain_len(const cps__chain *c, uint32_t r);
/* The node at position pos of r's chain. */
uint32_t cps__chain_neighbour(const cps__chain *c, uint32_t r, int pos);
/* Read r's sequence numbers from the store once. */
int cps__chain_load_range(cps__chain *c, uint32_t r);
/* Let go of the FWDs held ahead of our predecessor's WRITE, and forget what it said it
 * applied. */
void cps__chain_drop_ahead(cps__chain *c, range_st *rs);
/* Hold a FWD ahead: in the caller's message `owner` when it gave one and ops->drop_cookie
 * exists (*kept: the chain keeps it), else in a copy. */
int cps__chain_hold_ahead(cps__chain *c, range_st *rs, uint64_t seq, const void *payload,
                          size_t len, void *owner, int *kept);
/* Let go of one such FWD: its copy, or its owner back to the caller. */
void cps__chain_release_ahead(cps__chain *c, ahead_entry *e);
/* The first `done` FWDs held ahead were applied (and released): take them out. If the next one
 * does not follow what is applied, drop them all: the sender re-sends what we lack. */
void cps__chain_ahead_consumed(cps__chain *c, range_st *rs, uint32_t done);
/* Drop every piece of state kept for a range. */
void cps__chain_forget_range(cps__chain *c, range_st *rs);
/* The cached exactly-once number of `worker` on r (loaded from the store on first use). */
int cps__chain_hw_slot(cps__chain *c, uint32_t r, uint32_t worker, uint64_t **slot);
/* The cached last sync step of key set `sig` on r (loaded from the store on first use). */
int cps__chain_agg_slot(cps__chain *c, uint32_t r, uint64_t sig, uint64_t **step);
/* Declares and restores (PUT) are idempotent: no exactly-once record, no sequence space. */
int cps__chain_keeps_no_record(uint8_t type);
/* The exactly-once record a request is kept under (sparse-row pushes have their own). */
uint32_t cps__chain_dedup_id(const cps__chain_req *q);
/* Record in memory what an applied update did (exactly-once numbers, sync steps). */
int cps__chain_note_applied(cps__chain *c, uint32_t r, const cps__chain_update *u);
/* A REPLY action for request q of update u (NULL: a duplicate) at seq. */
int cps__chain_emit_reply(cps__chain *c, uint32_t r, uint64_t seq, const cps__chain_update *u,
                          const cps__chain_req *q, void *cookie);
/* A SEND action of msg (kept by the caller until the next call) to node `to`. */
int cps__chain_emit_send(cps__chain *c, uint32_t r, uint32_t to, const void *msg, size_t len);
/* A chain control message (CHAIN_ACK, CHAIN_MARK) of `seq` and `aux` to node `to`. */
int cps__chain_send_control(cps__chain *c, uint32_t r, uint32_t to, uint8_t type, uint64_t seq,
                            uint64_t aux);
int cps__chain_send_ack(cps__chain *c, uint32_t r, uint32_t to, uint64_t seq);
/* Answer the requests that waited for the range to commit up to their seq. */
int cps__chain_wake_waits(cps__chain *c, uint32_t r);
int cps__chain_decode_fwd(cps__chain *c, const void *payload, size_t len, cps__chain_update *u);
/* Release held updates up to seq (UINT64_MAX: all). */
void cps__chain_drop_acked(range_st *rs, uint64_t seq);

/* State transfer (chain_join.c): a FWD for a range this server is joining. */
int cps__chain_on_join_fwd(cps__chain *c, const cps__msg_hdr *h, const void *payload, size_t len,
                           void *owner, int *kept);
/* A view made node `succ` our successor, or a re-send is due: send it the pending MARK, if any
 * (see chain_join.c's mark_value). */
int cps__chain_mark_send(cps__chain *c, uint32_t r, uint32_t succ, uint64_t now);
/* A CHAIN_MARK from our predecessor (we are at `pos`). */
int cps__chain_on_mark(cps__chain *c, const cps__msg_hdr *h, int pos);

#endif
