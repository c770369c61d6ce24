/* The checkpoint cut's decisions on a server (src/server/cut.c performs them): who may open a
 * read view of a range and at which step, when a pending view opens or is refused, which reads
 * of an open view are served, and what a restore's PUT is told when the chain does not take it.
 * Pure: no I/O, no clock, no store; the shell reads the store and hands the figures in.
 * (A separate object rather than part of cps__replica: the read views live beside the chain,
 * on threads of their own, and nothing here needs the replica's state but "are we the tail".) */
#ifndef CPS_REPLICATION_CUT_VIEW_H
#define CPS_REPLICATION_CUT_VIEW_H

#include <stddef.h>
#include <stdint.h>

#include "core/view.h"

/* A range as the store holds it, read in one transaction: the steps of its sync key sets
 * (n of them, lowest lo, highest hi; n == 0 when none was pushed) and its range entry. */
typedef struct cps__cut_span {
    uint64_t lo, hi;
    uint32_t n;
    uint64_t seq, step;
} cps__cut_span;

/* 1 if node `self` is in the chain of `range` under `v` (0 also for a range `v` lacks). */
int cps__cut_holds(const cps__view *v, uint32_t self, uint32_t range);

/* 1 if `self` may open a cut of `range` at `step`. At a step boundary (sync jobs, step > 0) any
 * replica of the range may, since every replica passes through that same state; "now" (step 0,
 * async and SSP) only the tail (`is_tail`), whose state is what has been acknowledged. */
int cps__cut_may_open(const cps__view *v, uint32_t self, int is_tail, uint32_t range,
                      uint64_t step);

/* Whether a cut wanted at `step` opens on the store state `sp`: 1 now, 0 not yet (wait for the
 * next applied update), CPS_EPAST if the range is past that step (sp->hi says where). */
int cps__cut_ready(uint64_t step, const cps__cut_span *sp);

/* The step an opened view shows: the sync key sets' step, else the range entry's. */
uint64_t cps__cut_at_step(const cps__cut_span *sp);

/* 1 if a pending (not yet open) cut is to be dropped at the loop's turn: the server stops
 * (`stop_all`), or, under a view (`v->nranges` != 0), it may no longer open it; the tool asks
 * again, at the new tail if that moved. */
int cps__cut_pending_drop(const cps__view *v, uint32_t self, int is_tail, uint32_t range,
                          uint64_t step, int stop_all);

/* The tool's answer when cps__replica_put returned `verdict` (not CPS_ADMIT_NEW): not the head
 * (CPS_ESTALE_EPOCH: it asks the new head), busy (CPS_EAGAIN: it sends again), an error as it
 * is, anything else CPS_EPROTO. */
int cps__cut_put_status(int verdict);

/* A PUT's payload (len bytes): u32 hello_len, u32 0, hello, zero pad to 8, entries. Sets
 * *hello_len (the hello starts at byte 8). Errors: CPS_EPROTO (no room for the hello): drop it,
 * there is no one to answer. */
int cps__cut_put_hello(const void *payload, size_t len, size_t *hello_len);
/* Where a PUT's entries start (*off), after a hello of hello_len bytes: 0, or CPS_EPROTO (no
 * entries, or `range` is not one of the view's `nranges`): refuse it. */
int cps__cut_put_entries(size_t len, size_t hello_len, uint32_t range, uint32_t nranges,
                         size_t *off);

/* A CUT_READ request: keys lo..hi, slot (0: values, 1..k: optimizer slot k-1), elements
 * first..first+count-1 of each. */
typedef struct cps__cut_read {
    uint64_t lo, hi, first, count;
    uint32_t slot;
} cps__cut_read;

/* Decode and bound a CUT_READ payload (40 bytes: u64 lo, u64 hi, u32 slot, u32 0, u64 first,
 * u64 count). max_bytes bounds the values of one reply, max_keys its keys. Errors: CPS_EPROTO
 * (malformed), CPS_ESIZE (hi < lo, or a reply over the bounds). */
int cps__cut_read_parse(const void *payload, size_t len, size_t max_bytes, uint64_t max_keys,
                        cps__cut_read *q);

/* Whether a key of `rec_len` elements and `slots` optimizer state slots has what q reads:
 * 0, or CPS_ESIZE. */
int cps__cut_read_fits(const cps__cut_read *q, uint32_t slots, uint32_t rec_len);

/* What an open view's own socket does with a message of `type` naming view `id` of `range`
 * (the header's aux and range) when the view is `view_id` of `view_range`. A message for
 * another view is ignored and does not count as the exporter's activity. */
enum {
    CPS_CUT_IGNORE = 0,
    CPS_CUT_READ,  /* serve it (cps__cut_read_parse) */
    CPS_CUT_CLOSE, /* close the view */
    CPS_CUT_ALIVE  /* the exporter's, of no use to us: it only keeps the view open */
};
int cps__cut_view_msg(uint8_t type, uint64_t id, uint32_t range, uint64_t view_id,
                      uint32_t view_range);

/* The cuts a server was asked to open, each named by the tool's view id and its range: pending
 * ones (waiting for their step, with a deadline) and open ones. It decides which CUT_OPENs are
 * repeats and when a pending cut has waited long enough; the shell keeps the read views
 * themselves and performs what it says. A zeroed book is empty; cps__cut_book_fini frees it. */
#define CPS_CUT_PENDING_MS (10 * 60 * 1000) /* how long a cut may wait for its step */
typedef struct cps__cut_entry {
    uint64_t id;
    uint32_t range;
    int open;
    uint64_t deadline; /* while pending */
} cps__cut_entry;
typedef struct cps__cut_book {
    cps__cut_entry *e;
    size_t n, cap;
} cps__cut_book;
void cps__cut_book_fini(cps__cut_book *b);
enum { CPS_CUT_NEW = 1, CPS_CUT_REPEAT = 2 };
/* A CUT_OPEN of view `id` of `range` at `now` (one the server may open, cps__cut_may_open):
 * CPS_CUT_NEW (recorded as pending until now + CPS_CUT_PENDING_MS: open or refuse it), or
 * CPS_CUT_REPEAT (that view is pending or open already: its first request is being answered,
 * ignore this one). Errors: CPS_ENOMEM (nothing recorded). */
int cps__cut_book_ask(cps__cut_book *b, uint64_t id, uint32_t range, uint64_t now);
/* View `id` of `range` opened: it waits for no deadline any more. Unknown ones: no effect. */
void cps__cut_book_opened(cps__cut_book *b, uint64_t id, uint32_t range);
/* The shell dropped view `id` of `range` (refused, closed, or pending no longer): a later
 * CUT_OPEN of it is new. Unknown ones: no effect. */
void cps__cut_book_forget(cps__cut_book *b, uint64_t id, uint32_t range);
/* A pending cut whose step did not come by its deadline at `now`: 1 with its *id and *range
 * (forgotten already: the shell drops it, and the tool asks again), or 0 when none is due. */
int cps__cut_book_expired(cps__cut_book *b, uint64_t now, uint64_t *id, uint32_t *range);

#endif
