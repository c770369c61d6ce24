/* The replica as the server shell drives it, on a store faked in memory: what a message becomes,
 * and in which order the ready list says it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "replication/replica.h"

#define SELF 1u
#define W1   9u
#define W2   10u
#define KEY  5u

/* The fake store: key KEY (2 values) once declared, and what WRITE items leave. */
typedef struct fake {
    int declared;
    uint64_t seq[2];
    uint32_t ids[2][16]; /* exactly-once records: ids[r][i] -> vals[r][i] */
    uint64_t vals[2][16];
    uint32_t nrec[2];
    uint64_t agg_sig[2], agg_step[2];
    int released, owners;
    int msgs, msgs_freed; /* SEND buffers from msg_alloc, and those sent (freed by perform) */
} fake;

/* The ready list's growth fails once when armed (linked with --wrap=cps__array_reserve): an item
 * that cannot be allocated, as when out of memory. */
int __real_cps__array_reserve(void **items, size_t *cap, size_t need, size_t size, size_t first);
int __wrap_cps__array_reserve(void **items, size_t *cap, size_t need, size_t size, size_t first);
static int fail_next_item;

int __wrap_cps__array_reserve(void **items, size_t *cap, size_t need, size_t size, size_t first)
{
    if (fail_next_item && size == sizeof(cps__replica_out)) {
        fail_next_item = 0;
        return CPS_ENOMEM;
    }
    return __real_cps__array_reserve(items, cap, need, size, first);
}

static int f_seq(void *ctx, uint32_t range, uint64_t *seq)
{
    *seq = ((fake *)ctx)->seq[range];
    return 0;
}

static uint64_t *rec(fake *f, uint32_t range, uint32_t id, int add)
{
    for (uint32_t i = 0; i < f->nrec[range]; i++)
        if (f->ids[range][i] == id)
            return &f->vals[range][i];
    if (!add)
        return NULL;
    assert_true(f->nrec[range] < 16);
    f->ids[range][f->nrec[range]] = id;
    return &f->vals[range][f->nrec[range]++];
}

static int f_dedup(void *ctx, uint32_t range, uint32_t id, uint64_t *seq)
{
    uint64_t *v = rec(ctx, range, id, 0);
    *seq = v ? *v : 0;
    return 0;
}

static int f_agg(void *ctx, uint32_t range, uint64_t sig, uint64_t *step)
{
    fake *f = ctx;
    *step = f->agg_sig[range] == sig ? f->agg_step[range] : 0;
    return 0;
}

static int f_check(void *ctx, const cps__kv *kv, const cps__param_spec *spec, uint64_t *bad,
                   uint32_t *have)
{
    fake *f = ctx;
    *bad = kv->keys[0];
    *have = f->declared ? 2 : 0;
    if (spec)
        return 0;
    if (!f->declared)
        return CPS_ENOTFOUND;
    return kv->lens[0] == 2 ? 0 : CPS_ESIZE;
}

static int f_scan(void *ctx, uint32_t range, int (*fn)(void *arg, uint32_t id, uint64_t value),
                  void *arg)
{
    fake *f = ctx;
    for (uint32_t i = 0; i < f->nrec[range]; i++)
        fn(arg, f->ids[range][i], f->vals[range][i]);
    return 0;
}

static void f_add(void *ctx, float *acc, const float *x, size_t n)
{
    (void)ctx;
    for (size_t i = 0; i < n; i++)
        acc[i] += x[i];
}

static void f_release(void *ctx, void *owner)
{
    ((fake *)ctx)->released++;
    free(owner);
}

static void *f_alloc(void *ctx, uint32_t to, size_t len)
{
    (void)to;
    ((fake *)ctx)->msgs++;
    return malloc(len);
}

static cps__replica *new_replica(fake *f)
{
    cps__replica_env env = {f, f_seq, f_dedup, f_agg, f_check, f_scan, f_add, f_release, f_alloc};
    cps__replica_config cfg = {.self = SELF};
    cps__replica *r;
    assert_int_equal(cps__replica_create(&cfg, &env, &r), 0);
    return r;
}

/* Servers 1 and 2, workers 9 and 10 (ranks 0 and 1); `nranges` ranges served by server 1
 * alone, except range 1 by server 2 when `moved`. */
static void make_view(cps__view *v, uint64_t epoch, uint32_t mode, uint32_t nranges, int moved)
{
    cps__view_init(v);
    v->epoch = epoch;
    v->mode = mode;
    v->nnodes = 4;
    v->nodes = calloc(4, sizeof *v->nodes);
    const uint32_t ids[4] = {1, 2, W1, W2};
    for (uint32_t i = 0; i < 4; i++) {
        v->nodes[i].id = ids[i];
        v->nodes[i].role = i < 2 ? CPS_ROLE_SERVER : CPS_ROLE_WORKER;
        v->nodes[i].alive = 1;
        v->nodes[i].rank = i % 2;
    }
    v->num_servers = 2;
    v->num_workers = 2;
    v->replicas = 1;
    v->nranges = nranges;
    v->ranges = calloc(nranges, sizeof *v->ranges);
    for (uint32_t k = 0; k < nranges; k++) {
        v->ranges[k].lo = k == 0 ? 0 : 1000;
        v->ranges[k].hi = k + 1 == nranges ? UINT64_MAX : 999;
        v->ranges[k].chain_len = 1;
        v->ranges[k].chain[0] = moved && k == 1 ? 2 : SELF;
    }
}

static void set_view(cps__replica *r, uint64_t epoch, uint32_t mode, uint32_t nranges, int moved,
                     int fresh)
{
    cps__view v;
    make_view(&v, epoch, mode, nranges, moved);
    assert_int_equal(cps__replica_set_view(r, &v, SELF, fresh, 0), 0);
    cps__view_fini(&v);
}

/* A message from `from` of `key` in `range` with values {a, b} (none for a pull), owned by the
 * replica. */
static cps__replica_msg request_of(fake *f, uint8_t type, uint32_t from, uint64_t epoch,
                                   uint64_t req, uint64_t step, float a, float b, uint64_t key,
                                   uint32_t range)
{
    uint32_t len = 2;
    float vals[2] = {a, b};
    int with = type != CPS_MSG_PULL;
    size_t n = cps__wire_kv_size(1, with ? 2 : 0);
    uint64_t *buf = calloc(1, (n + 7) & ~(size_t)7);
    assert_true(cps__wire_kv_encode(buf, n, 1, &key, &len, with ? vals : NULL, with ? 2 : 0) > 0);
    cps__replica_msg m = {.payload = buf, .len = n, .owner = buf};
    m.hdr.type = type;
    m.hdr.sender = from;
    m.hdr.req_worker = from;
    m.hdr.epoch = epoch;
    m.hdr.req_seq = req;
    m.hdr.step = step;
    m.hdr.aux = step; /* a pull reads at the worker's clock */
    m.hdr.range = range;
    f->owners++;
    return m;
}

/* The same of KEY, in range 0. */
static cps__replica_msg request(fake *f, uint8_t type, uint32_t from, uint64_t epoch, uint64_t req,
                                uint64_t step, float a, float b)
{
    return request_of(f, type, from, epoch, req, step, a, b, KEY, 0);
}

/* Perform the ready list on the fake store; returns the kinds in order as a string (W S R A D L
 * P C I for WRITE SEND REPLY ASK_VIEW DROP_RANGE LOG SNAPSHOT JOIN_CLEAR JOIN_INSTALL, LOG left
 * out). */
static const char *perform(cps__replica *r, fake *f)
{
    static char kinds[64];
    const cps__replica_out *o;
    size_t n = cps__replica_ready(r, &o), k = 0;
    for (size_t i = 0; i < n && k < sizeof kinds - 1; i++) {
        if (o[i].kind == CPS_RO_LOG)
            continue;
        kinds[k++] = "?WSRADLPCI"[o[i].kind];
        if (o[i].kind == CPS_RO_WRITE) {
            f->seq[o[i].range] = o[i].seq;
            for (uint32_t j = 0; j < o[i].nrecs; j++)
                *rec(f, o[i].range, o[i].recs[j].id, 1) = o[i].recs[j].value;
            if (o[i].upd.sig) {
                f->agg_sig[o[i].range] = o[i].upd.sig;
                f->agg_step[o[i].range] = o[i].upd.step;
            }
        }
        if (o[i].kind == CPS_RO_SEND && o[i].msg) {
            f->msgs_freed++;
            free(o[i].msg);
        }
    }
    kinds[k] = 0;
    return kinds;
}

static const cps__replica_out *item(cps__replica *r, int kind, size_t nth)
{
    const cps__replica_out *o;
    size_t n = cps__replica_ready(r, &o);
    for (size_t i = 0; i < n; i++)
        if (o[i].kind == kind && nth-- == 0)
            return &o[i];
    fail_msg("no item of kind %d", kind);
    return NULL;
}

static void finish(cps__replica *r, fake *f)
{
    cps__replica_destroy(r);
    assert_int_equal(f->released, f->owners); /* every message given back once */
}

static void a_push_is_written_before_it_is_acknowledged(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_replica(&f);
    set_view(r, 3, CPS_MODE_ASYNC, 1, 0, 1);
    perform(r, &f);
    cps__replica_msg m = request(&f, CPS_MSG_PUSH, W1, 3, 1, 0, 1, 2);
    cps__replica_step(r, &m, 10);
    const cps__replica_out *w = item(r, CPS_RO_WRITE, 0);
    assert_int_equal(w->upd.kind, CPS_UPD_PUSH);
    assert_int_equal(w->seq, 1);
    assert_int_equal(w->nrecs, 1);
    assert_int_equal(w->recs[0].id, W1);
    assert_int_equal(w->recs[0].value, 1);
    const cps__replica_out *a = item(r, CPS_RO_REPLY, 0);
    assert_int_equal(a->hdr.type, CPS_MSG_ACK);
    assert_int_equal(a->to, W1);
    assert_string_equal(perform(r, &f), "WR");
    /* The same push again: a duplicate, acknowledged and never written twice. */
    m = request(&f, CPS_MSG_PUSH, W1, 3, 1, 0, 1, 2);
    cps__replica_step(r, &m, 11);
    assert_string_equal(perform(r, &f), "R");
    finish(r, &f);
}

/* Forward before apply: the head of a chain of two puts the FWD right before the update's
 * WRITE (the successor receives while the head writes), and at the end of the loop turn (the
 * tick) the CHAIN_MARK that says it is applied, header only; it answers nothing (the tail
 * does). */
static void the_head_forwards_before_it_writes_and_then_says_it_applied(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_replica(&f);
    cps__view v;
    make_view(&v, 3, CPS_MODE_ASYNC, 1, 0);
    v.ranges[0].chain_len = 2;
    v.ranges[0].chain[1] = 2;
    assert_int_equal(cps__replica_set_view(r, &v, SELF, 1, 0), 0);
    cps__view_fini(&v);
    perform(r, &f);
    cps__replica_msg m = request(&f, CPS_MSG_PUSH, W1, 3, 1, 0, 1, 2);
    cps__replica_step(r, &m, 10);
    const cps__replica_out *fwd = item(r, CPS_RO_SEND, 0);
    assert_int_equal(fwd->hdr.type, CPS_MSG_FWD);
    assert_int_equal(fwd->to, 2);
    assert_int_equal(fwd->hdr.req_seq, 1);
    assert_int_equal(fwd->hdr.aux, 0); /* sent before its own write: applied up to 0 */
    assert_int_equal(fwd->resend, 0);
    assert_int_equal(item(r, CPS_RO_WRITE, 0)->seq, 1);
    assert_string_equal(perform(r, &f), "SW");
    assert_int_equal(cps__replica_wait_ms(r, 10, 1000), 0); /* a MARK waits for the tick */
    cps__replica_tick(r, 10, 0);
    const cps__replica_out *mark = item(r, CPS_RO_SEND, 0);
    assert_int_equal(mark->hdr.type, CPS_MSG_CHAIN_MARK);
    assert_int_equal(mark->hdr.aux, CPS_CHAIN_MARK_APPLIED);
    assert_int_equal(mark->hdr.req_seq, 1);
    assert_int_equal(mark->to, 2);
    assert_null(mark->msg);
    assert_string_equal(perform(r, &f), "S");
    assert_int_equal(cps__replica_wait_ms(r, 10, 1000), 1000);
    finish(r, &f);
}

/* An async view of epoch `epoch` with ranges 0 and 1 both on the chain 1 -> 2. */
static void two_chains_view(cps__view *v, uint64_t epoch)
{
    make_view(v, epoch, CPS_MODE_ASYNC, 2, 0);
    for (uint32_t k = 0; k < 2; k++) {
        v->ranges[k].chain_len = 2;
        v->ranges[k].chain[1] = 2;
    }
}

/* A replica at the head of both ranges of two_chains_view (epoch 3). */
static cps__replica *head_of_two_ranges(fake *f)
{
    cps__replica *r = new_replica(f);
    cps__view v;
    two_chains_view(&v, 3);
    assert_int_equal(cps__replica_set_view(r, &v, SELF, 1, 0), 0);
    cps__view_fini(&v);
    perform(r, f);
    return r;
}

/* Several updates of a range in one loop turn: one CHAIN_MARK at its end, with the highest
 * seq (the successor applies every FWD it holds up to it). Its counters: three FWDs and one MARK
 * sent, two MARKs merged. */
static void a_turn_of_updates_sends_one_mark_per_range_with_the_highest_seq(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = head_of_two_ranges(&f);
    cps__view v;
    for (uint64_t q = 1; q <= 3; q++) {
        cps__replica_msg m = request(&f, CPS_MSG_PUSH, W1, 3, q, 0, 1, 2);
        cps__replica_step(r, &m, 10);
        assert_string_equal(perform(r, &f), "SW");
        assert_int_equal(item(r, CPS_RO_WRITE, 0)->seq, q);
    }
    cps__replica_tick(r, 10, 0);
    const cps__replica_out *mark = item(r, CPS_RO_SEND, 0);
    assert_int_equal(mark->hdr.type, CPS_MSG_CHAIN_MARK);
    assert_int_equal(mark->hdr.range, 0);
    assert_int_equal(mark->hdr.req_seq, 3);
    assert_int_equal(mark->hdr.aux, CPS_CHAIN_MARK_APPLIED);
    assert_string_equal(perform(r, &f), "S");
    const cps__replica_counters *c = cps__replica_counts(r);
    assert_int_equal(c->chain_sends, 4);
    assert_int_equal(c->marks_sent, 1);
    assert_int_equal(c->marks_merged, 2);
    /* The next turn starts afresh: nothing held, nothing sent again. */
    cps__replica_tick(r, 11, 0);
    assert_string_equal(perform(r, &f), "");
    /* A view change sends the held MARK first, under the view it was made in. */
    cps__replica_msg m = request(&f, CPS_MSG_PUSH, W1, 3, 4, 0, 1, 2);
    cps__replica_step(r, &m, 12);
    perform(r, &f);
    two_chains_view(&v, 4);
    assert_int_equal(cps__replica_set_view(r, &v, SELF, 0, 12), 0);
    cps__view_fini(&v);
    mark = item(r, CPS_RO_SEND, 0);
    assert_int_equal(mark->hdr.type, CPS_MSG_CHAIN_MARK);
    assert_int_equal(mark->hdr.req_seq, 4);
    assert_int_equal(mark->hdr.epoch, 3);
    perform(r, &f);
    finish(r, &f);
}

/* A held MARK waits only for updates of its own range: the FWD and write of another range's
 * update come after it (a sync step's MARK waited at the end of the turn for the other range's
 * write), while a second update of the range replaces it. */
static void a_held_mark_goes_before_another_ranges_update(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = head_of_two_ranges(&f);
    cps__replica_msg m = request(&f, CPS_MSG_PUSH, W1, 3, 1, 0, 1, 2);
    cps__replica_step(r, &m, 10);
    assert_string_equal(perform(r, &f), "SW"); /* range 0's MARK held */
    m = request_of(&f, CPS_MSG_PUSH, W2, 3, 1, 0, 1, 2, 1005, 1);
    cps__replica_step(r, &m, 10);
    const cps__replica_out *mark = item(r, CPS_RO_SEND, 0);
    assert_int_equal(mark->hdr.type, CPS_MSG_CHAIN_MARK);
    assert_int_equal(mark->hdr.range, 0);
    assert_int_equal(mark->hdr.req_seq, 1);
    assert_int_equal(mark->hdr.aux, CPS_CHAIN_MARK_APPLIED);
    assert_int_equal(item(r, CPS_RO_SEND, 1)->hdr.type, CPS_MSG_FWD);
    assert_int_equal(item(r, CPS_RO_WRITE, 0)->range, 1);
    assert_string_equal(perform(r, &f), "SSW");
    m = request_of(&f, CPS_MSG_PUSH, W2, 3, 2, 0, 1, 2, 1005, 1);
    cps__replica_step(r, &m, 10);
    assert_string_equal(perform(r, &f), "SW"); /* range 1's MARK replaced, not sent */
    cps__replica_tick(r, 10, 0);
    mark = item(r, CPS_RO_SEND, 0);
    assert_int_equal(mark->hdr.type, CPS_MSG_CHAIN_MARK);
    assert_int_equal(mark->hdr.range, 1);
    assert_int_equal(mark->hdr.req_seq, 2);
    assert_string_equal(perform(r, &f), "S");
    const cps__replica_counters *c = cps__replica_counts(r);
    assert_int_equal(c->marks_sent, 2);
    assert_int_equal(c->marks_merged, 1);
    finish(r, &f);
}

/* A refused push still uses up its number: replicated as a SKIP, answered with its error once
 * written, and its record never moves the worker's number back. */
static void an_undeclared_key_becomes_a_skip_answered_with_its_error(void **state)
{
    (void)state;
    fake f = {0};
    cps__replica *r = new_replica(&f);
    set_view(r, 3, CPS_MODE_ASYNC, 1, 0, 1);
    perform(r, &f);
    cps__replica_msg m = request(&f, CPS_MSG_PUSH, W1, 3, 1, 0, 1, 2);
    cps__replica_step(r, &m, 10);
    const cps__replica_out *w = item(r, CPS_RO_WRITE, 0);
    assert_int_equal(w->upd.kind, CPS_UPD_SKIP);
    assert_int_equal(w->nrecs, 1);
    assert_int_equal(w->recs[0].value, 1);
    assert_int_equal(item(r, CPS_RO_REPLY, 0)->status, CPS_ENOTFOUND);
    assert_string_equal(perform(r, &f), "WR");
    finish(r, &f);
}

static void a_message_of_a_future_epoch_waits_for_its_view(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_replica(&f);
    set_view(r, 3, CPS_MODE_ASYNC, 1, 0, 1);
    perform(r, &f);
    cps__replica_msg m = request(&f, CPS_MSG_PUSH, W1, 4, 1, 0, 1, 2);
    cps__replica_step(r, &m, 10);
    assert_string_equal(perform(r, &f), "A");
    assert_int_equal(cps__replica_held(r), 1);
    set_view(r, 4, CPS_MODE_ASYNC, 1, 0, 0);
    assert_string_equal(perform(r, &f), "");
    assert_int_equal(cps__replica_next(r, 20), 1);
    assert_string_equal(perform(r, &f), "WR");
    assert_int_equal(cps__replica_next(r, 20), 0);
    assert_int_equal(cps__replica_held(r), 0);
    finish(r, &f);
}

/* Requests that came before our first view are stepped once it is here, in order. */
static void deferred_requests_are_stepped_after_the_first_view(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_replica(&f);
    cps__replica_msg m = request(&f, CPS_MSG_PUSH, W1, 3, 1, 0, 1, 2);
    cps__replica_defer(r, &m);
    m = request(&f, CPS_MSG_PUSH, W1, 3, 2, 0, 1, 2);
    cps__replica_defer(r, &m);
    assert_string_equal(perform(r, &f), "");
    set_view(r, 3, CPS_MODE_ASYNC, 1, 0, 1);
    perform(r, &f);
    assert_int_equal(cps__replica_next(r, 20), 1);
    assert_string_equal(perform(r, &f), "WR");
    assert_int_equal(cps__replica_next(r, 20), 1);
    assert_int_equal(item(r, CPS_RO_WRITE, 0)->recs[0].value, 2);
    perform(r, &f);
    assert_int_equal(cps__replica_next(r, 20), 0);
    finish(r, &f);
}

/* Sync: one update per step, the sum in rank order, both workers' records in it. */
static void a_sync_step_is_written_once_with_the_sum(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_replica(&f);
    set_view(r, 3, CPS_MODE_SYNC, 1, 0, 1);
    perform(r, &f);
    cps__replica_msg m = request(&f, CPS_MSG_PUSH, W2, 3, 1, 1, 10, 20);
    cps__replica_step(r, &m, 10);
    assert_string_equal(perform(r, &f), "");
    m = request(&f, CPS_MSG_PUSH, W1, 3, 1, 1, 1, 2);
    cps__replica_step(r, &m, 11);
    const cps__replica_out *w = item(r, CPS_RO_WRITE, 0);
    assert_int_equal(w->upd.nreqs, 2);
    assert_int_equal(w->upd.reqs[0].worker, W1); /* rank 0 first */
    assert_true(w->upd.sig != 0);
    cps__kv kv;
    assert_int_equal(cps__wire_kv_decode(w->upd.body, w->upd.body_len, 1, &kv), 0);
    assert_true(kv.vals[0] == 11.0f && kv.vals[1] == 22.0f);
    assert_string_equal(perform(r, &f), "WRR");
    assert_int_equal(f.agg_step[0], 1);
    finish(r, &f);
}

/* SSP, bound 0: a push-pull's push is written at once, its values wait for the other worker. */
static void a_push_pull_reply_waits_for_the_slowest_worker(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_replica(&f);
    set_view(r, 3, CPS_MODE_SSP, 1, 0, 1);
    perform(r, &f);
    cps__replica_msg m = request(&f, CPS_MSG_PUSH_PULL, W1, 3, 1, 1, 1, 2);
    cps__replica_step(r, &m, 10);
    assert_string_equal(perform(r, &f), "W");
    const uint64_t *clock = rec(&f, 0, W1 | CPS_DEDUP_CLOCK_BIT, 0); /* the clock, written */
    assert_non_null(clock);
    assert_int_equal(*clock, 1);
    m = request(&f, CPS_MSG_PUSH, W2, 3, 1, 1, 1, 2);
    cps__replica_step(r, &m, 11);
    const cps__replica_out *v = item(r, CPS_RO_REPLY, 1);
    assert_int_equal(v->hdr.type, CPS_MSG_VALUES);
    assert_int_equal(v->to, W1);
    assert_int_equal(v->kv.nkeys, 1);
    assert_string_equal(perform(r, &f), "WRR");
    finish(r, &f);
}

/* A header-only CHAIN_ACK of range 0 up to `seq` from server 2, owned by the replica. */
static cps__replica_msg chain_ack(fake *f, uint64_t epoch, uint64_t seq)
{
    cps__replica_msg m = {.owner = malloc(1)};
    m.hdr.type = CPS_MSG_CHAIN_ACK;
    m.hdr.sender = 2;
    m.hdr.epoch = epoch;
    m.hdr.req_seq = seq;
    f->owners++;
    return m;
}

/* A replica at the head of range 0's chain 1 -> 2, async, its view performed. */
static cps__replica *head_of_two(fake *f)
{
    cps__replica *r = new_replica(f);
    cps__view v;
    make_view(&v, 3, CPS_MODE_ASYNC, 1, 0);
    v.replicas = 2;
    v.ranges[0].chain_len = 2;
    v.ranges[0].chain[1] = 2;
    assert_int_equal(cps__replica_set_view(r, &v, SELF, 1, 0), 0);
    cps__view_fini(&v);
    perform(r, f);
    return r;
}

/* Async, range 0 on the chain 1 -> 2 (we are its head). A retried push-pull is a duplicate the
 * head answers itself, with values read from its store: not before that store holds committed
 * updates only (simulator --push-pull, seed 4). Answered at its own update's commit point, it
 * read W2's push, which the tail had not applied. */
static void a_retried_push_pull_is_not_answered_before_commit(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = head_of_two(&f);
    cps__replica_msg m = request(&f, CPS_MSG_PUSH_PULL, W1, 3, 1, 1, 1, 2);
    cps__replica_step(r, &m, 10);
    assert_string_equal(perform(r, &f), "SW"); /* forwarded, applied; the tail answers */
    m = request(&f, CPS_MSG_PUSH_PULL, W1, 3, 1, 1, 1, 2); /* the worker's retry */
    cps__replica_step(r, &m, 11);
    assert_string_equal(perform(r, &f), ""); /* a duplicate: waits for seq 1 to commit */
    m = request(&f, CPS_MSG_PUSH, W2, 3, 1, 1, 3, 4);
    cps__replica_step(r, &m, 12);
    assert_string_equal(perform(r, &f), "SW"); /* seq 2: the store now holds W2's push */
    m = chain_ack(&f, 3, 1);
    cps__replica_step(r, &m, 13);
    /* Seq 1 is committed, but the store holds seq 2, which is not: no answer. */
    assert_string_equal(perform(r, &f), "");
    /* Meanwhile new updates of the range wait: the store must stop moving for the answer. */
    m = request(&f, CPS_MSG_PUSH, W2, 3, 2, 2, 5, 6);
    cps__replica_step(r, &m, 14);
    assert_int_equal(item(r, CPS_RO_REPLY, 0)->status, CPS_EAGAIN);
    assert_string_equal(perform(r, &f), "R");
    m = chain_ack(&f, 3, 2);
    cps__replica_step(r, &m, 15);
    const cps__replica_out *o = item(r, CPS_RO_REPLY, 0);
    assert_int_equal(o->hdr.type, CPS_MSG_VALUES);
    assert_int_equal(o->to, W1);
    assert_int_equal(o->hdr.req_seq, 1);
    assert_int_equal(o->kv.nkeys, 1);
    assert_int_equal(o->kv.keys[0], KEY);
    /* The MARK of seq 2, held since its write (no tick here), goes before the values' read. */
    assert_int_equal(item(r, CPS_RO_SEND, 0)->hdr.type, CPS_MSG_CHAIN_MARK);
    assert_int_equal(item(r, CPS_RO_SEND, 0)->hdr.req_seq, 2);
    assert_string_equal(perform(r, &f), "SR");
    assert_int_equal(f.seq[0], 2);
    /* Committed again: W2's re-sent push is taken. */
    m = request(&f, CPS_MSG_PUSH, W2, 3, 2, 2, 5, 6);
    cps__replica_step(r, &m, 16);
    assert_string_equal(perform(r, &f), "SW");
    finish(r, &f);
}

/* A tick whose clock was read before the step it follows was stamped (a shell reads its clock
 * once per loop turn) does not take the forwarded update for one waiting 2^64 ms: no re-send.
 * The chain's re-send comes when the real wait is over. */
static void a_tick_with_an_earlier_clock_does_not_resend(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = head_of_two(&f);
    cps__replica_msg m = request(&f, CPS_MSG_PUSH, W1, 3, 1, 1, 1, 2);
    cps__replica_step(r, &m, 1000);
    assert_string_equal(perform(r, &f), "SW");
    cps__replica_tick(r, 995, 0);
    assert_int_equal(item(r, CPS_RO_SEND, 0)->hdr.type, CPS_MSG_CHAIN_MARK); /* the turn's MARK */
    assert_string_equal(perform(r, &f), "S");
    cps__replica_tick(r, 1000 + 60000, 0);
    assert_true(strchr(perform(r, &f), 'S') != NULL); /* unacknowledged: re-sent in time */
    finish(r, &f);
}

/* A view that moves a range to another server drops our copy of it; the others stay. */
static void a_range_moved_away_is_dropped(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_replica(&f);
    set_view(r, 3, CPS_MODE_ASYNC, 2, 0, 1);
    assert_string_equal(perform(r, &f), "");
    set_view(r, 4, CPS_MODE_ASYNC, 2, 1, 0);
    const cps__replica_out *d = item(r, CPS_RO_DROP_RANGE, 0);
    assert_int_equal(d->range, 1);
    assert_int_equal(d->moved, 1);
    assert_string_equal(perform(r, &f), "D");
    /* Let in afresh by a view that does not give us range 1: what we hold of it is stale. */
    cps__replica_destroy(r);
    r = new_replica(&f);
    set_view(r, 5, CPS_MODE_ASYNC, 2, 1, 1);
    assert_int_equal(item(r, CPS_RO_DROP_RANGE, 0)->moved, 0);
    finish(r, &f);
}

/* A restore's PUT is judged "not head" before its records are: a node that no longer heads the
 * range (or has no view yet) must say so, whatever its store holds. The question changes
 * nothing. */
static void a_put_verdict_says_not_head_before_any_record_is_read(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_replica(&f);
    assert_int_equal(cps__replica_put_verdict(r, 0), CPS_ADMIT_NOT_HEAD); /* no view yet */
    set_view(r, 3, CPS_MODE_ASYNC, 2, 1, 1);
    perform(r, &f);
    const cps__replica_out *o;
    size_t ready = cps__replica_ready(r, &o);
    assert_int_equal(cps__replica_put_verdict(r, 0), CPS_ADMIT_NEW);
    assert_int_equal(cps__replica_put_verdict(r, 1), CPS_ADMIT_NOT_HEAD); /* server 2 heads it */
    assert_int_equal(cps__replica_put_verdict(r, 7), CPS_ADMIT_NOT_HEAD); /* no such range */
    assert_int_equal(cps__replica_ready(r, &o), ready); /* the ready list is untouched */
    finish(r, &f);
}

static void a_request_for_a_stale_epoch_or_another_head_is_refused(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_replica(&f);
    set_view(r, 3, CPS_MODE_ASYNC, 2, 1, 1);
    perform(r, &f);
    cps__replica_msg m = request(&f, CPS_MSG_PUSH, W1, 2, 1, 0, 1, 2);
    cps__replica_step(r, &m, 10);
    assert_int_equal(item(r, CPS_RO_REPLY, 0)->status, CPS_ESTALE_EPOCH);
    assert_string_equal(perform(r, &f), "R");
    m = request(&f, CPS_MSG_PUSH, W1, 3, 1, 0, 1, 2);
    m.hdr.range = 1; /* served by server 2 */
    cps__replica_step(r, &m, 10);
    assert_int_equal(item(r, CPS_RO_REPLY, 0)->status, CPS_ESTALE_EPOCH);
    m = request(&f, CPS_MSG_PUSH, 77, 3, 1, 0, 1, 2); /* no such worker: ask for the view */
    cps__replica_step(r, &m, 10);
    assert_string_equal(perform(r, &f), "A");
    assert_int_equal(cps__replica_counts(r)->msgs_bad, 1);
    finish(r, &f);
}

/* A header-only message of state transfer (payload: `len` zero bytes), owned by the replica. */
static cps__replica_msg transfer_msg(fake *f, uint8_t type, uint32_t from, uint64_t epoch,
                                     uint32_t range, uint64_t step, uint64_t aux, size_t len)
{
    cps__replica_msg m = {.len = len};
    m.owner = calloc(1, len ? len : 1);
    m.payload = m.owner;
    m.hdr.type = type;
    m.hdr.sender = from;
    m.hdr.epoch = epoch;
    m.hdr.range = range;
    m.hdr.step = step;
    m.hdr.aux = aux;
    f->owners++;
    return m;
}

/* The SEND item of message type `type` in the ready list, or NULL. */
static const cps__replica_out *sent(cps__replica *r, uint8_t type)
{
    const cps__replica_out *o;
    size_t n = cps__replica_ready(r, &o);
    for (size_t i = 0; i < n; i++)
        if (o[i].kind == CPS_RO_SEND && o[i].hdr.type == type)
            return &o[i];
    return NULL;
}

/* Out of memory for the FWD's ready-list item: no message buffer is taken from msg_alloc
 * without an item that hands it to the shell (a buffer may be a reserved ring slot the transport
 * must get back), and the chain re-sends the FWD later as if it had been lost. */
static void a_send_without_room_in_the_ready_list_takes_no_buffer(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = head_of_two(&f);
    int before = f.msgs;
    fail_next_item = 1;
    cps__replica_msg m = request(&f, CPS_MSG_PUSH, W1, 3, 1, 1, 1, 2);
    cps__replica_step(r, &m, 1000);
    assert_int_equal(fail_next_item, 0); /* the FWD's item was the one refused */
    assert_int_equal(f.msgs, before);
    assert_string_equal(perform(r, &f), "W");
    assert_int_equal(f.msgs_freed, f.msgs); /* nothing of msg_alloc is left unowned */
    cps__replica_tick(r, 1000 + 60000, 0);
    const cps__replica_out *fwd = sent(r, CPS_MSG_FWD);
    assert_non_null(fwd);
    assert_int_equal(fwd->hdr.req_seq, 1);
    assert_int_equal(fwd->to, 2);
    perform(r, &f);
    assert_int_equal(f.msgs_freed, f.msgs);
    finish(r, &f);
}

/* Both sides of state transfer are the replica's: the shell only clears, writes and streams.
 * Range 1 is server 2's (we copy it); range 0 is ours alone (we are its tail). */
static void a_join_is_decided_by_the_replica_and_performed_by_the_shell(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_replica(&f);
    set_view(r, 3, CPS_MODE_ASYNC, 2, 1, 1);
    assert_string_equal(perform(r, &f), "D"); /* range 1 is not ours: what we hold is stale */
    /* JOIN_RANGE (source 2, join 7): our copy is cleared first, and the shell answers. */
    cps__replica_msg m = transfer_msg(&f, CPS_MSG_JOIN_RANGE, 0, 3, 1, 7, 2, 0);
    cps__replica_step(r, &m, 10);
    assert_string_equal(perform(r, &f), "C");
    const cps__replica_out *c = item(r, CPS_RO_JOIN_CLEAR, 0);
    assert_int_equal(c->range, 1);
    assert_int_equal(c->to, 2);
    assert_int_equal(c->seq, 7);
    assert_true(cps__replica_joining(r, 1));
    assert_int_equal(cps__replica_join_result(r, 1, 0, 0, 10), 0);
    const cps__replica_out *q = sent(r, CPS_MSG_SNAP_REQ);
    assert_non_null(q);
    assert_int_equal(q->to, 2);
    assert_int_equal(q->hdr.step, 7);
    assert_null(q->msg); /* header only: the shell's send fills in the rest */
    assert_string_equal(perform(r, &f), "S");
    /* No outcome is owed now. */
    assert_int_equal(cps__replica_join_result(r, 1, 0, 0, 10), CPS_EINVAL);
    /* The snapshot's one chunk: the shell writes it (the store is at seq 5 after), then the
     * replica reports CAUGHT_UP to the scheduler at that seq. */
    m = transfer_msg(&f, CPS_MSG_SNAP, 2, 3, 1, 7, 1, 16);
    const void *chunk = m.payload;
    cps__replica_step(r, &m, 20);
    assert_string_equal(perform(r, &f), "I");
    const cps__replica_out *in = item(r, CPS_RO_JOIN_INSTALL, 0);
    assert_ptr_equal(in->upd.body, chunk);
    assert_int_equal(in->upd.body_len, 16);
    assert_true(in->last);
    int released = f.released;
    f.seq[1] = 5;
    assert_int_equal(cps__replica_join_result(r, 1, 0, 5, 20), 0);
    const cps__replica_out *up = sent(r, CPS_MSG_CAUGHT_UP);
    assert_non_null(up);
    assert_int_equal(up->to, 0);
    assert_int_equal(up->hdr.req_seq, 5);
    assert_int_equal(up->hdr.aux, 0);
    perform(r, &f);
    cps__replica_tick(r, 30, 1); /* the next call gives the chunk back */
    assert_int_equal(f.released, released + 1);
    /* At the tail of range 0: a SNAP_REQ makes a SNAPSHOT order, unless it names a view we
     * lack (we ask for it; the joiner asks again) or a range we are not the tail of. */
    m = transfer_msg(&f, CPS_MSG_SNAP_REQ, 2, 3, 0, 9, 0, 0);
    cps__replica_step(r, &m, 40);
    const cps__replica_out *p = item(r, CPS_RO_SNAPSHOT, 0);
    assert_int_equal(p->range, 0);
    assert_int_equal(p->to, 2);
    assert_int_equal(p->seq, 9);
    assert_string_equal(perform(r, &f), "P");
    /* Asked again (or doubled by the network) while it is under way: no second snapshot, also
     * after another join's ended; once the shell reports this one over, the next request orders
     * another. */
    for (uint64_t closed = 0; closed <= 9; closed += 8) {
        m = transfer_msg(&f, CPS_MSG_SNAP_REQ, 2, 3, 0, 9, 0, 0);
        cps__replica_step(r, &m, 41);
        assert_string_equal(perform(r, &f), "");
        cps__replica_snapshot_closed(r, 0, 2, closed);
    }
    cps__replica_snapshot_closed(r, 0, 2, 9);
    m = transfer_msg(&f, CPS_MSG_SNAP_REQ, 2, 3, 0, 9, 0, 0);
    cps__replica_step(r, &m, 42);
    assert_int_equal(item(r, CPS_RO_SNAPSHOT, 0)->seq, 9);
    assert_string_equal(perform(r, &f), "P");
    m = transfer_msg(&f, CPS_MSG_SNAP_REQ, 2, 4, 0, 10, 0, 0);
    cps__replica_step(r, &m, 40);
    assert_string_equal(perform(r, &f), "A");
    m = transfer_msg(&f, CPS_MSG_SNAP_REQ, 2, 3, 1, 10, 0, 0);
    cps__replica_step(r, &m, 40);
    assert_string_equal(perform(r, &f), "");
    finish(r, &f);
}

/* ---- the fence, inside the replica (replica_fence.c) ---- */

#define DEAD_AFTER 1000u

static cps__replica *new_fenced_replica(fake *f)
{
    cps__replica_env env = {f, f_seq, f_dedup, f_agg, f_check, f_scan, f_add, f_release, f_alloc};
    cps__replica_config cfg = {.self = SELF, .dead_after_ms = DEAD_AFTER, .start_ms = 0};
    cps__replica *r;
    assert_int_equal(cps__replica_create(&cfg, &env, &r), 0);
    return r;
}

/* A view from the scheduler as the shell hands it over: news first, then the install. Returns
 * cps__replica_view's verdict (or the news' when it says there is nothing to install). */
static int give_view(cps__replica *r, fake *f, uint64_t epoch, uint32_t nranges, int moved,
                     int self_alive, int welcome, uint64_t now)
{
    cps__view v;
    make_view(&v, epoch, CPS_MODE_ASYNC, nranges, moved);
    v.nodes[0].alive = self_alive;
    int rc = cps__replica_view_news(r, &v, SELF, welcome);
    perform(r, f);
    if (rc != CPS_RV_DONE)
        rc = cps__replica_view(r, &v, SELF, now);
    cps__view_fini(&v);
    return rc;
}

static cps__msg_hdr sched_hdr(uint8_t type, uint64_t epoch)
{
    cps__msg_hdr h = {.type = type, .sender = 0, .epoch = epoch};
    return h;
}

/* Not let in yet: only our own WELCOME comes through; a chain message is dropped, a worker's
 * request held until the view; the welcome's view drops the ranges it does not give us. */
static void a_replica_not_let_in_takes_only_its_welcome(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_fenced_replica(&f);
    cps__msg_hdr h = sched_hdr(CPS_MSG_VIEW, 3);
    h.req_seq = 7;
    assert_int_equal(cps__replica_admit(r, &h, 7, 1), CPS_FENCE_DROP); /* only a WELCOME */
    h = sched_hdr(CPS_MSG_WELCOME, 3);
    h.req_seq = 6; /* the WELCOME of the life before ours (boot id 7), late */
    assert_int_equal(cps__replica_admit(r, &h, 7, 1), CPS_FENCE_DROP);
    h.req_seq = 0; /* the scheduler knew no HELLO of ours */
    assert_int_equal(cps__replica_admit(r, &h, 0, 1), CPS_FENCE_DROP);
    h.req_seq = 7;
    assert_int_equal(cps__replica_admit(r, &h, 7, 1), CPS_FENCE_SERVE);
    cps__replica_msg m = request(&f, CPS_MSG_FWD, 2, 3, 1, 0, 1, 2);
    cps__replica_step(r, &m, 2);
    assert_string_equal(perform(r, &f), "");
    assert_int_equal(cps__replica_held(r), 0);
    m = request(&f, CPS_MSG_PUSH, W1, 3, 1, 0, 1, 2);
    cps__replica_step(r, &m, 3);
    assert_int_equal(f.released, 1); /* the FWD was dropped (given back at the next call) */
    assert_int_equal(cps__replica_held(r), 1); /* a worker heard its WELCOME before we did */
    cps__view v;
    make_view(&v, 3, CPS_MODE_ASYNC, 2, 1);
    assert_int_equal(cps__replica_view_news(r, &v, SELF, 1), CPS_RV_LET_IN);
    assert_int_equal(cps__replica_view(r, &v, SELF, 4), CPS_RV_INSTALLED);
    cps__view_fini(&v);
    const cps__replica_out *d = item(r, CPS_RO_DROP_RANGE, 0);
    assert_int_equal(d->range, 1); /* range 1 is server 2's: stale here */
    assert_int_equal(d->moved, 0);
    assert_string_equal(perform(r, &f), "D");
    assert_int_equal(cps__fence_joined(cps__replica_fence(r)), 1);
    assert_int_equal(cps__replica_next(r, 5), 1);
    assert_string_equal(perform(r, &f), "WR");
    finish(r, &f);
}

/* A loop that did not turn for longer than the failure timeout: unsure, it asks for the view,
 * drops requests unanswered, asks again while no answer comes, and serves once the scheduler's
 * view says it is still in. */
static void an_unsure_replica_asks_and_drops_until_confirmed(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_fenced_replica(&f);
    assert_int_equal(give_view(r, &f, 3, 1, 0, 1, 1, 0), CPS_RV_INSTALLED);
    cps__replica_turned(r, 500);
    assert_string_equal(perform(r, &f), "");
    cps__replica_msg m = request(&f, CPS_MSG_PUSH, W1, 3, 1, 0, 1, 2);
    cps__replica_step(r, &m, 500 + DEAD_AFTER + 1);
    assert_string_equal(perform(r, &f), "A"); /* dropped, and the view asked for */
    assert_int_equal(cps__fence_unsure(cps__replica_fence(r)), 1);
    m = request(&f, CPS_MSG_PUSH, W1, 3, 1, 0, 1, 2);
    cps__replica_step(r, &m, 1600);
    assert_string_equal(perform(r, &f), "");
    assert_int_equal(cps__fence_dropped(cps__replica_fence(r)), 2);
    cps__replica_turned(r, 1600 + DEAD_AFTER + 1);
    assert_string_equal(perform(r, &f), "A"); /* no answer: asked again */
    /* A newer view would install; the one we hold, counting us in, confirms. */
    assert_int_equal(give_view(r, &f, 3, 1, 0, 1, 0, 2700), CPS_RV_DONE);
    assert_int_equal(cps__fence_unsure(cps__replica_fence(r)), 0);
    m = request(&f, CPS_MSG_PUSH, W1, 3, 1, 0, 1, 2);
    cps__replica_step(r, &m, 2701);
    assert_string_equal(perform(r, &f), "WR");
    finish(r, &f);
}

/* A view counting us dead fences the replica: nothing installed, nothing served but the
 * scheduler's SHUTDOWN; an older view changes nothing. */
static void a_view_counting_us_dead_fences_the_replica(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_fenced_replica(&f);
    assert_int_equal(give_view(r, &f, 3, 2, 0, 1, 1, 0), CPS_RV_INSTALLED);
    assert_int_equal(give_view(r, &f, 2, 2, 1, 1, 0, 1), CPS_RV_DONE); /* older */
    assert_int_equal(give_view(r, &f, 4, 2, 1, 0, 0, 2), CPS_RV_FENCED);
    assert_string_equal(perform(r, &f), ""); /* no DROP_RANGE: the view is not ours */
    assert_int_equal(cps__fence_fenced(cps__replica_fence(r)), 1);
    assert_int_equal(cps__fence_beating(cps__replica_fence(r)), 0);
    cps__replica_msg m = request(&f, CPS_MSG_PUSH, W1, 3, 1, 0, 1, 2);
    cps__replica_step(r, &m, 3);
    assert_string_equal(perform(r, &f), "");
    cps__msg_hdr h = sched_hdr(CPS_MSG_VIEW, 5);
    assert_int_equal(cps__replica_admit(r, &h, 7, 4), CPS_FENCE_DROP);
    h = sched_hdr(CPS_MSG_SHUTDOWN, 5);
    assert_int_equal(cps__replica_admit(r, &h, 7, 4), CPS_FENCE_SERVE);
    finish(r, &f);
}

/* Staying in, a view that takes a range from us yields its DROP_RANGE (moved); a JOIN_RANGE
 * from anyone but the scheduler is dropped. */
static void a_view_taking_a_range_yields_its_drop(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_fenced_replica(&f);
    assert_int_equal(give_view(r, &f, 3, 2, 0, 1, 1, 0), CPS_RV_INSTALLED);
    cps__view v;
    make_view(&v, 4, CPS_MODE_ASYNC, 2, 1);
    assert_int_equal(cps__replica_view_news(r, &v, SELF, 0), CPS_RV_NEWER);
    assert_int_equal(cps__replica_view(r, &v, SELF, 1), CPS_RV_INSTALLED);
    cps__view_fini(&v);
    const cps__replica_out *d = item(r, CPS_RO_DROP_RANGE, 0);
    assert_int_equal(d->range, 1);
    assert_int_equal(d->moved, 1);
    assert_string_equal(perform(r, &f), "D");
    cps__replica_msg m = request(&f, CPS_MSG_JOIN_RANGE, 2, 4, 1, 0, 1, 2);
    cps__replica_step(r, &m, 2);
    assert_string_equal(perform(r, &f), "");
    assert_int_equal(cps__replica_joining(r, 1), 0);
    finish(r, &f);
}

/* A finished snapshot's socket goes once it holds nothing the joiner needs: the joiner is in the
 * range's chain, dead or gone, the send failed, or it lingered long enough; never earlier. */
static void a_snapshot_socket_closes_only_when_the_joiner_needs_nothing_more(void **state)
{
    (void)state;
    fake f = {.declared = 1};
    cps__replica *r = new_replica(&f);
    set_view(r, 3, CPS_MODE_ASYNC, 2, 1, 1); /* range 0: {SELF}; range 1: {2} */
    const uint64_t end = 5000, in_time = end + CPS_REPLICA_SNAP_LINGER_MS;
    /* Node 2 is alive and not in range 0's chain yet: the last chunk may still be queued. */
    assert_int_equal(cps__replica_snapshot_may_close(r, 0, 2, 0, end, end), 0);
    assert_int_equal(cps__replica_snapshot_may_close(r, 0, 2, 0, end, in_time), 0);
    assert_int_equal(cps__replica_snapshot_may_close(r, 0, 2, 0, end, in_time + 1), 1);
    assert_int_equal(cps__replica_snapshot_may_close(r, 0, 2, CPS_EIO, end, end), 1);
    /* A range we do not know: only failure or lingering end it. */
    assert_int_equal(cps__replica_snapshot_may_close(r, 7, 2, 0, end, end), 0);
    /* In the chain of range 1: it had everything. */
    assert_int_equal(cps__replica_snapshot_may_close(r, 1, 2, 0, end, end), 1);
    /* A node the view does not name: nobody to wait for. */
    assert_int_equal(cps__replica_snapshot_may_close(r, 0, 77, 0, end, end), 1);
    /* Node 2 counted dead. */
    cps__view v;
    make_view(&v, 4, CPS_MODE_ASYNC, 2, 0);
    v.nodes[1].alive = 0;
    assert_int_equal(cps__replica_set_view(r, &v, SELF, 0, 0), 0);
    cps__view_fini(&v);
    assert_int_equal(cps__replica_snapshot_may_close(r, 0, 2, 0, end, end), 1);
    finish(r, &f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_push_is_written_before_it_is_acknowledged),
        cmocka_unit_test(the_head_forwards_before_it_writes_and_then_says_it_applied),
        cmocka_unit_test(a_turn_of_updates_sends_one_mark_per_range_with_the_highest_seq),
        cmocka_unit_test(a_held_mark_goes_before_another_ranges_update),
        cmocka_unit_test(an_undeclared_key_becomes_a_skip_answered_with_its_error),
        cmocka_unit_test(a_message_of_a_future_epoch_waits_for_its_view),
        cmocka_unit_test(deferred_requests_are_stepped_after_the_first_view),
        cmocka_unit_test(a_sync_step_is_written_once_with_the_sum),
        cmocka_unit_test(a_push_pull_reply_waits_for_the_slowest_worker),
        cmocka_unit_test(a_retried_push_pull_is_not_answered_before_commit),
        cmocka_unit_test(a_tick_with_an_earlier_clock_does_not_resend),
        cmocka_unit_test(a_send_without_room_in_the_ready_list_takes_no_buffer),
        cmocka_unit_test(a_range_moved_away_is_dropped),
        cmocka_unit_test(a_request_for_a_stale_epoch_or_another_head_is_refused),
        cmocka_unit_test(a_join_is_decided_by_the_replica_and_performed_by_the_shell),
        cmocka_unit_test(a_replica_not_let_in_takes_only_its_welcome),
        cmocka_unit_test(an_unsure_replica_asks_and_drops_until_confirmed),
        cmocka_unit_test(a_view_counting_us_dead_fences_the_replica),
        cmocka_unit_test(a_view_taking_a_range_yields_its_drop),
        cmocka_unit_test(a_snapshot_socket_closes_only_when_the_joiner_needs_nothing_more),
        cmocka_unit_test(a_put_verdict_says_not_head_before_any_record_is_read),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
