/* recovery/restore: the restore's loop as one machine. Each test pins one rule: the pass and
 * its pacing, the window, the silent-head rule and its hard limit, the looks at the view, the
 * tails' confirmation, the pass limit, a refusal. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "recovery/restore.h"

static const cps__rs_cfg CFG = {.look_ms = 500,
                                .refresh_ms = 2000,
                                .silent_ms = 15000,
                                .timeout_ms = 120000,
                                .gap_ms = 250,
                                .gap_max_ms = 2000,
                                .budget_ms = 750, /* gaps of 250 and 500: 3 passes */
                                .probe_ms = 1000,
                                .retry_ms = 20};

typedef struct fixture {
    cps__view v[5];
    cps__range g[5][2];
    cps__node_info nodes[5][2];
    cps__restore m;
    cps__rs_ready o;
    uint64_t seq;
} fixture;

/* View k: epoch k + 1, nodes 1 and 2, two ranges on chains 1 -> 2 and 2 -> 1 (k 0); k 1: node 1
 * gone; k 2: node 2 gone too (no replica left: empty chains); k 3: chains 1 and 2, node 1 dead
 * (the coordinator keeps a dead last replica); k 4: as k 3, node 1 restarted on its data. */
static void views(fixture *f)
{
    memset(f, 0, sizeof *f);
    for (int k = 0; k < 5; k++) {
        f->v[k].epoch = (uint64_t)k + 1;
        f->v[k].nranges = 2;
        f->v[k].ranges = f->g[k];
        f->v[k].nodes = f->nodes[k];
        f->v[k].nnodes = 2;
        for (uint32_t i = 0; i < 2; i++)
            f->nodes[k][i].id = i + 1, f->nodes[k][i].alive = 1;
    }
    f->g[0][0].chain[0] = 1, f->g[0][0].chain[1] = 2, f->g[0][0].chain_len = 2;
    f->g[0][1].chain[0] = 2, f->g[0][1].chain[1] = 1, f->g[0][1].chain_len = 2;
    f->g[1][0].chain[0] = 2, f->g[1][0].chain_len = 1;
    f->g[1][1].chain[0] = 2, f->g[1][1].chain_len = 1;
    f->nodes[1][0].alive = 0;
    f->nodes[2][0].alive = f->nodes[2][1].alive = 0;
    for (int k = 3; k < 5; k++) {
        f->g[k][0].chain[0] = 1, f->g[k][0].chain_len = 1;
        f->g[k][1].chain[0] = 2, f->g[k][1].chain_len = 1;
    }
    f->nodes[3][0].alive = 0;
}

static int step(fixture *f, int kind, uint64_t now, uint32_t range)
{
    cps__rs_event e = {.kind = kind, .now = now, .range = range};
    if (kind == CPS_RS_READY)
        e.seq = ++f->seq;
    return cps__rs_step(&f->m, &e, &f->o);
}

static int view(fixture *f, int k, uint64_t now)
{
    cps__rs_event e = {.kind = CPS_RS_VIEW, .now = now, .view = &f->v[k]};
    return cps__rs_step(&f->m, &e, &f->o);
}

static int answer(fixture *f, uint32_t r, uint32_t sender, uint64_t put_seq, uint64_t now)
{
    cps__rs_event e = {.kind = CPS_RS_ANSWER, .now = now, .range = r, .seq = put_seq};
    e.ans = (cps__rr_answer){.sender = sender, .put_seq = put_seq};
    return cps__rs_step(&f->m, &e, &f->o);
}

static int probe_from(fixture *f, uint32_t r, uint32_t from, uint64_t tail_seq, uint64_t now)
{
    cps__rs_event e = {
        .kind = CPS_RS_PROBE, .now = now, .range = r, .from = from, .ok = 1, .seq = tail_seq};
    return cps__rs_step(&f->m, &e, &f->o);
}

/* The probed tail's answer. */
static int probe(fixture *f, uint32_t r, uint64_t tail_seq, uint64_t now)
{
    return probe_from(f, r, f->m.probe_to, tail_seq, now);
}

/* The only output of the last step is of this kind (and returns it). */
static const cps__rs_out *only(const fixture *f, int kind)
{
    assert_int_equal(f->o.n, 1);
    assert_int_equal(f->o.out[0].kind, kind);
    return &f->o.out[0];
}

static void start(fixture *f)
{
    views(f);
    assert_int_equal(cps__rs_init(&f->m, &CFG, &f->v[0], 2, 1000), 0);
    assert_int_equal(step(f, CPS_RS_TICK, 1000, 0), 0);
    only(f, CPS_RS_STREAM);
}

/* Fill range r's window (CPS_RR_WINDOW PUTs to its head) at `now`. */
static void fill(fixture *f, uint32_t r, uint64_t now)
{
    for (int i = 0; i < CPS_RR_WINDOW; i++) {
        assert_int_equal(step(f, CPS_RS_READY, now, r), 0);
        assert_int_equal(only(f, CPS_RS_PUT)->range, r);
    }
}

static void test_a_pass_sends_to_the_heads_and_ends_when_the_tails_confirm(void **state)
{
    (void)state;
    fixture f;
    start(&f);
    assert_int_equal(step(&f, CPS_RS_READY, 1000, 1), 0);
    const cps__rs_out *p = only(&f, CPS_RS_PUT);
    assert_int_equal(p->to, 2);
    assert_int_equal(p->seq, f.seq);
    assert_int_equal(p->epoch, 1);
    assert_int_equal(step(&f, CPS_RS_STREAMED, 1001, 0), 0);
    assert_int_equal(f.o.n, 0); /* range 1's PUT is unanswered: no tail is asked yet */
    assert_int_equal(answer(&f, 1, 2, f.seq, 1002), 0);
    /* Range 0 had nothing: its tail (2) confirms it at any number; then range 1's tail (1). An
     * answer from a node not probed (a tail before a look moved it) counts for nothing. */
    assert_int_equal(only(&f, CPS_RS_PROBE_TAIL)->to, 2);
    assert_int_equal(probe_from(&f, 0, 1, 0, 1003), 0);
    assert_int_equal(f.o.n, 0);
    assert_false(cps__rr_open(&f.m.book, 0) == 0);
    assert_int_equal(probe(&f, 0, 0, 1003), 0);
    assert_int_equal(only(&f, CPS_RS_PROBE_TAIL)->to, 1);
    assert_int_equal(probe(&f, 1, f.seq, 1004), 0);
    only(&f, CPS_RS_DONE);
    assert_true(cps__rs_ended(&f.m));
    assert_int_equal(f.m.rc, 0);
    cps__rs_fini(&f.m);
}

static void test_a_tail_behind_is_probed_again(void **state)
{
    (void)state;
    fixture f;
    start(&f);
    assert_int_equal(step(&f, CPS_RS_READY, 1000, 0), 0);
    assert_int_equal(step(&f, CPS_RS_STREAMED, 1000, 0), 0);
    cps__rs_event e = {.kind = CPS_RS_ANSWER, .now = 1001, .range = 0, .seq = 7};
    e.ans = (cps__rr_answer){.sender = 1, .put_seq = f.seq};
    assert_int_equal(cps__rs_step(&f.m, &e, &f.o), 0); /* the head is at 7 */
    assert_int_equal(only(&f, CPS_RS_PROBE_TAIL)->range, 0);
    assert_int_equal(probe(&f, 0, 6, 1002), 0); /* the tail is not there yet */
    assert_int_equal(f.o.n, 0);
    assert_int_equal(cps__rs_deadline(&f.m), 1002 + CFG.retry_ms);
    assert_int_equal(step(&f, CPS_RS_TICK, 1002 + CFG.retry_ms, 0), 0);
    assert_int_equal(only(&f, CPS_RS_PROBE_TAIL)->range, 0);
    assert_int_equal(probe(&f, 0, 7, 1030), 0);
    assert_int_equal(only(&f, CPS_RS_PROBE_TAIL)->range, 1);
    cps__rs_fini(&f.m);
}

static void test_a_full_window_holds_the_put_until_an_answer(void **state)
{
    (void)state;
    fixture f;
    start(&f);
    fill(&f, 0, 1000);
    uint64_t first = f.seq - CPS_RR_WINDOW + 1;
    assert_int_equal(step(&f, CPS_RS_READY, 1001, 0), 0);
    assert_int_equal(f.o.n, 0);
    assert_true(cps__rs_held(&f.m));
    /* Another range's READY may not come while one is held: the shell waits. */
    assert_int_equal(step(&f, CPS_RS_READY, 1001, 1), CPS_EINVAL);
    assert_int_equal(answer(&f, 0, 1, first, 1002), 0);
    const cps__rs_out *p = only(&f, CPS_RS_PUT);
    assert_int_equal(p->seq, f.seq - 1); /* the held one (the refused READY took a number) */
    assert_false(cps__rs_held(&f.m));
    cps__rs_fini(&f.m);
}

static void test_a_silent_head_has_its_range_streamed_again(void **state)
{
    (void)state;
    fixture f;
    start(&f);
    fill(&f, 0, 1000);
    assert_int_equal(step(&f, CPS_RS_READY, 1000, 0), 0);
    assert_true(cps__rs_held(&f.m));
    /* Looks at the view meanwhile (every refresh_ms) show nothing new. */
    uint64_t t = 1000;
    while (t < 1000 + CFG.silent_ms) {
        t = cps__rs_deadline(&f.m);
        assert_int_equal(step(&f, CPS_RS_TICK, t, 0), 0);
        if (f.o.n && f.o.out[f.o.n - 1].kind == CPS_RS_GET_VIEW)
            assert_int_equal(view(&f, 0, t), 0);
        if (t < 1000 + CFG.silent_ms)
            assert_true(cps__rs_held(&f.m));
    }
    /* Silent for silent_ms: the held PUT is dropped, no wait for the timeout. */
    assert_false(cps__rs_held(&f.m));
    assert_int_equal(f.o.out[0].kind, CPS_RS_DISCARD);
    assert_false(cps__rs_ended(&f.m));
    assert_int_equal(cps__rr_stopped(&f.m.book), 1);
    cps__rs_fini(&f.m);
}

static int streamed(const fixture *f)
{
    for (uint32_t i = 0; i < f->o.n; i++)
        if (f->o.out[i].kind == CPS_RS_STREAM)
            return 1;
    return 0;
}

/* Drive one pass of range 0 whose head never answers, up to the silence that stops it (or the
 * next pass, begun at once when its gap passed). */
static uint64_t silent_pass(fixture *f, uint64_t t)
{
    assert_int_equal(step(f, CPS_RS_READY, t, 0), 0);
    assert_int_equal(only(f, CPS_RS_PUT)->range, 0);
    assert_int_equal(step(f, CPS_RS_STREAMED, t, 0), 0);
    for (int guard = 0; !cps__rs_ended(&f->m) && cps__rr_stopped(&f->m.book) == 0 && !streamed(f);
         guard++) {
        assert_true(guard < 1000);
        t = cps__rs_deadline(&f->m);
        assert_int_equal(step(f, CPS_RS_TICK, t, 0), 0);
        if (f->o.n && f->o.out[f->o.n - 1].kind == CPS_RS_GET_VIEW)
            assert_int_equal(view(f, 0, t), 0);
    }
    return t;
}

/* Range 1 is confirmed (its tail at 0) once range 0 stopped, then the next pass is paced. */
static uint64_t next_pass(fixture *f, uint64_t t)
{
    for (int guard = 0; !cps__rs_ended(&f->m) && !streamed(f); guard++) {
        assert_true(guard < 100);
        uint64_t due = cps__rs_deadline(&f->m);
        if (f->o.n && f->o.out[f->o.n - 1].kind == CPS_RS_PROBE_TAIL) {
            assert_int_equal(probe(f, f->o.out[f->o.n - 1].range, 0, t), 0);
            continue;
        }
        if (f->o.n && f->o.out[f->o.n - 1].kind == CPS_RS_GET_VIEW) {
            assert_int_equal(view(f, 0, t), 0);
            continue;
        }
        t = due > t ? due : t;
        assert_int_equal(step(f, CPS_RS_TICK, t, 0), 0);
    }
    return t;
}

static void test_passes_wait_for_the_gap(void **state)
{
    (void)state;
    fixture f;
    start(&f);
    assert_int_equal(step(&f, CPS_RS_READY, 1000, 0), 0);
    /* "not head" at once: the range goes again, but only gap_ms after the pass began. */
    cps__rs_event e = {.kind = CPS_RS_ANSWER, .now = 1001, .range = 0};
    e.ans = (cps__rr_answer){.sender = 1, .error = 1, .status = CPS_ESTALE_EPOCH, .put_seq = f.seq};
    assert_int_equal(step(&f, CPS_RS_STREAMED, 1001, 0), 0);
    assert_int_equal(cps__rs_step(&f.m, &e, &f.o), 0);
    assert_int_equal(only(&f, CPS_RS_PROBE_TAIL)->range, 1);
    assert_int_equal(probe(&f, 1, 0, 1002), 0);
    assert_int_equal(f.o.n, 0); /* pacing */
    assert_int_equal(cps__rs_deadline(&f.m), 1000 + CFG.gap_ms);
    assert_int_equal(step(&f, CPS_RS_TICK, 1000 + CFG.gap_ms - 1, 0), 0);
    assert_int_equal(f.o.n, 0);
    assert_int_equal(step(&f, CPS_RS_TICK, 1000 + CFG.gap_ms, 0), 0);
    only(&f, CPS_RS_GET_VIEW);
    /* Nothing but the view's answer is taken now. */
    assert_int_equal(step(&f, CPS_RS_TICK, 1000 + CFG.gap_ms, 0), CPS_EINVAL);
    assert_int_equal(view(&f, 1, 1000 + CFG.gap_ms), 0);
    only(&f, CPS_RS_STREAM);
    assert_true(cps__rs_open(&f.m, 0));
    assert_false(cps__rs_open(&f.m, 1)); /* confirmed: done for good */
    assert_int_equal(step(&f, CPS_RS_READY, 1000 + CFG.gap_ms, 0), 0);
    assert_int_equal(only(&f, CPS_RS_PUT)->to, 2); /* the new view's head */
    assert_int_equal(f.m.resent, 1);
    cps__rs_fini(&f.m);
}

static void test_a_head_silent_through_every_pass_fails_by_name(void **state)
{
    (void)state;
    fixture f;
    start(&f);
    cps__rs_cfg cfg = CFG;
    cfg.budget_ms = 1000000;
    f.m.cfg = cfg; /* the limit follows: the machine keeps no copy of it */
    assert_true(cps__rs_pass_limit(&cfg) > 100);
    uint64_t t = 1000;
    for (int guard = 0; !cps__rs_ended(&f.m); guard++) {
        assert_true(guard < 100);
        t = silent_pass(&f, t);
        if (cps__rs_ended(&f.m))
            break;
        t = next_pass(&f, t);
    }
    assert_int_equal(f.m.rc, CPS_ETIMEDOUT);
    assert_int_equal(f.m.why, CPS_RS_WHY_SILENT);
    assert_int_equal(f.m.bad, 0);
    assert_true(t >= 1000 + CFG.timeout_ms && t < 1000 + CFG.timeout_ms + CFG.silent_ms);
    cps__rs_fini(&f.m);
}

static void test_the_pass_limit_fails_the_restore(void **state)
{
    (void)state;
    fixture f;
    start(&f);
    uint64_t t = 1000;
    assert_int_equal(cps__rs_pass_limit(&CFG), 3);
    for (uint32_t p = 1; !cps__rs_ended(&f.m); p++) {
        assert_true(p <= 3);
        t = silent_pass(&f, t);
        t = next_pass(&f, t);
    }
    assert_int_equal(f.m.book.pass, 3);
    assert_int_equal(f.m.rc, CPS_EUNAVAILABLE);
    assert_int_equal(f.m.why, CPS_RS_WHY_PASSES);
    cps__rs_fini(&f.m);
}

/* Drive a restore under cfg whose range r's head answers "not head" (a view late at the new head,
 * a scheduler slow to publish it) to every PUT before accept[r], and takes them from then on;
 * each tail confirms what its head took. begun[]: when each pass began (at most max). */
static uint32_t refused_each(fixture *f, const cps__rs_cfg *cfg, const uint64_t accept[2],
                             uint64_t *begun, uint32_t max)
{
    views(f);
    assert_int_equal(cps__rs_init(&f->m, cfg, &f->v[0], 2, 1000), 0);
    assert_int_equal(step(f, CPS_RS_TICK, 1000, 0), 0);
    uint64_t t = 1000;
    uint32_t n = 0;
    while (!cps__rs_ended(&f->m)) {
        only(f, CPS_RS_STREAM);
        assert_true(n < max);
        begun[n++] = t;
        uint32_t head[2] = {0, 0};
        uint64_t seq[2] = {0, 0};
        for (uint32_t r = 0; r < 2; r++)
            if (cps__rs_open(&f->m, r)) {
                assert_int_equal(step(f, CPS_RS_READY, t, r), 0);
                head[r] = only(f, CPS_RS_PUT)->to;
                seq[r] = f->seq;
            }
        assert_int_equal(step(f, CPS_RS_STREAMED, t, 0), 0);
        for (uint32_t r = 0; r < 2; r++) {
            if (!head[r])
                continue;
            cps__rs_event e = {.kind = CPS_RS_ANSWER, .now = t, .range = r, .seq = seq[r]};
            e.ans = (cps__rr_answer){.sender = head[r], .put_seq = seq[r]};
            if (t < accept[r])
                e.ans.error = 1, e.ans.status = CPS_ESTALE_EPOCH;
            assert_int_equal(cps__rs_step(&f->m, &e, &f->o), 0);
            if (f->o.n && f->o.out[f->o.n - 1].kind == CPS_RS_GET_VIEW)
                assert_int_equal(view(f, 1, t), 0);
        }
        for (int guard = 0; !cps__rs_ended(&f->m) && !streamed(f); guard++) {
            assert_true(guard < 100);
            const cps__rs_out *last = f->o.n ? &f->o.out[f->o.n - 1] : NULL;
            if (last && last->kind == CPS_RS_PROBE_TAIL) {
                assert_int_equal(probe(f, last->range, f->seq, t), 0);
            } else if (last && last->kind == CPS_RS_GET_VIEW) {
                assert_int_equal(view(f, 1, t), 0); /* node 2 is the head now */
            } else {
                uint64_t due = cps__rs_deadline(&f->m);
                t = due > t ? due : t;
                assert_int_equal(step(f, CPS_RS_TICK, t, 0), 0);
            }
        }
    }
    return n;
}

/* Range 0 refused until accept_at; range 1 taken and confirmed in the first pass. */
static uint32_t refused_until(fixture *f, const cps__rs_cfg *cfg, uint64_t accept_at,
                              uint64_t *begun, uint32_t max)
{
    const uint64_t accept[2] = {accept_at, 0};
    return refused_each(f, cfg, accept, begun, max);
}

static void test_passes_back_off_within_the_budget(void **state)
{
    (void)state;
    fixture f;
    cps__rs_cfg cfg;
    cps__rs_cfg_defaults(&cfg, 120000);
    /* Production's back-off: 250 ms doubling to 2 s, within 15 s: 10 passes. */
    static const uint64_t gap[] = {250, 500, 1000, 2000, 2000, 2000, 2000, 2000, 2000};
    for (uint32_t p = 1; p <= 9; p++)
        assert_int_equal(cps__rs_gap(&cfg, p), gap[p - 1]);
    assert_int_equal(cfg.budget_ms, CPS_RS_BUDGET_MS);
    assert_true(CPS_RS_BUDGET_MS >= 15000);
    assert_int_equal(cps__rs_pass_limit(&cfg), 10);
    cps__rs_cfg odd = cfg;
    odd.budget_ms = 0; /* not even pass 2's gap: one pass */
    assert_int_equal(cps__rs_pass_limit(&odd), 1);
    odd.gap_max_ms = UINT64_MAX; /* no cap: the doubling stops before it wraps */
    assert_true(cps__rs_gap(&odd, 100) >= cps__rs_gap(&odd, 99));
    assert_true(cps__rs_gap(&odd, 100) > 0);
    uint64_t begun[16];
    uint32_t n = refused_until(&f, &cfg, UINT64_MAX, begun, 16);
    assert_int_equal(n, 10);
    for (uint32_t p = 1; p < n; p++)
        assert_int_equal(begun[p] - begun[p - 1], gap[p - 1]);
    assert_int_equal(begun[n - 1] - begun[0], 13750);
    assert_int_equal(f.m.rc, CPS_EUNAVAILABLE);
    assert_int_equal(f.m.why, CPS_RS_WHY_PASSES);
    cps__rs_fini(&f.m);
}

static void test_a_head_refusing_for_13_s_is_waited_out(void **state)
{
    (void)state;
    fixture f;
    cps__rs_cfg cfg;
    cps__rs_cfg_defaults(&cfg, 120000);
    uint64_t begun[16];
    /* The new head installs the view 13 s after the restore began: the old pacing (8 passes
     * 500 ms apart) gave up after 3.5 s. */
    uint32_t n = refused_until(&f, &cfg, 1000 + 13000, begun, 16);
    assert_int_equal(n, 10);
    assert_int_equal(f.m.rc, 0);
    only(&f, CPS_RS_DONE);
    cps__rs_fini(&f.m);
}

static void test_a_view_without_the_head_drops_the_held_put(void **state)
{
    (void)state;
    fixture f;
    start(&f);
    fill(&f, 0, 1000);
    assert_int_equal(step(&f, CPS_RS_READY, 1000, 0), 0);
    /* Node 1 looks gone: the view is asked after look_ms, not refresh_ms. */
    cps__rs_event e = {.kind = CPS_RS_TICK, .now = 1000 + CFG.look_ms, .gone = 1};
    assert_int_equal(cps__rs_step(&f.m, &e, &f.o), 0);
    only(&f, CPS_RS_GET_VIEW);
    assert_int_equal(view(&f, 1, 1000 + CFG.look_ms), 0);
    only(&f, CPS_RS_DISCARD);
    assert_false(cps__rs_held(&f.m));
    assert_false(cps__rs_open(&f.m, 0));
    cps__rs_fini(&f.m);
}

static void test_no_look_before_refresh_ms_when_nothing_is_gone(void **state)
{
    (void)state;
    fixture f;
    start(&f);
    fill(&f, 0, 1000);
    assert_int_equal(step(&f, CPS_RS_READY, 1000, 0), 0);
    assert_int_equal(step(&f, CPS_RS_TICK, 1000 + CFG.look_ms, 0), 0);
    assert_int_equal(f.o.n, 0);
    assert_int_equal(step(&f, CPS_RS_TICK, 1000 + CFG.refresh_ms, 0), 0);
    only(&f, CPS_RS_GET_VIEW);
    cps__rs_fini(&f.m);
}

static void test_a_range_without_a_replica_fails_by_name(void **state)
{
    (void)state;
    fixture f;
    start(&f);
    fill(&f, 1, 1000);
    assert_int_equal(step(&f, CPS_RS_READY, 1000, 1), 0);
    cps__rs_event e = {.kind = CPS_RS_TICK, .now = 1000 + CFG.look_ms, .gone = 1};
    assert_int_equal(cps__rs_step(&f.m, &e, &f.o), 0);
    only(&f, CPS_RS_GET_VIEW);
    assert_int_equal(view(&f, 2, 1000 + CFG.look_ms), 0);
    const cps__rs_out *x = only(&f, CPS_RS_FAILED);
    assert_int_equal(x->rc, CPS_EUNAVAILABLE);
    assert_int_equal(x->why, CPS_RS_WHY_NO_REPLICA);
    assert_int_equal(x->range, 0);
    cps__rs_fini(&f.m);
}

static void test_a_refusal_of_the_records_fails_at_once(void **state)
{
    (void)state;
    fixture f;
    start(&f);
    assert_int_equal(step(&f, CPS_RS_READY, 1000, 1), 0);
    assert_int_equal(step(&f, CPS_RS_STREAMED, 1000, 0), 0);
    cps__rs_event e = {.kind = CPS_RS_ANSWER, .now = 1001, .range = 1};
    e.ans = (cps__rr_answer){.sender = 2, .error = 1, .status = CPS_EPROTO, .put_seq = f.seq};
    assert_int_equal(cps__rs_step(&f.m, &e, &f.o), 0);
    const cps__rs_out *x = only(&f, CPS_RS_FAILED);
    assert_int_equal(x->rc, CPS_EPROTO);
    assert_int_equal(x->why, CPS_RS_WHY_FATAL);
    assert_int_equal(x->range, 1);
    assert_int_equal(step(&f, CPS_RS_TICK, 1002, 0), 0);
    assert_int_equal(f.o.n, 0); /* ended: nothing more */
    cps__rs_fini(&f.m);
}

static void test_a_later_incident_gets_the_whole_budget(void **state)
{
    (void)state;
    fixture f;
    cps__rs_cfg cfg;
    cps__rs_cfg_defaults(&cfg, 120000);
    /* Both ranges refused for 9 s (8 passes, 9.75 s of gaps), then range 1 taken and confirmed;
     * range 0 refused 13 s more: the back-off starts again, so it is waited out. */
    const uint64_t accept[2] = {10750 + 13000, 1000 + 9000};
    uint64_t begun[32];
    uint32_t n = refused_each(&f, &cfg, accept, begun, 32);
    assert_int_equal(f.m.rc, 0);
    only(&f, CPS_RS_DONE);
    assert_int_equal(n, 17);
    assert_int_equal(begun[7], 10750);             /* range 1 confirmed in pass 8 */
    assert_int_equal(begun[8] - begun[7], 250);    /* the back-off again from gap_ms */
    assert_int_equal(begun[16] - begun[7], 13750); /* ... with its whole budget */
    assert_int_equal(f.m.waited_ms, 9750 + 13750);
    cps__rs_fini(&f.m);
}

static void test_a_zero_cap_is_refused(void **state)
{
    (void)state;
    fixture f;
    views(&f);
    cps__rs_cfg cfg = CFG;
    cfg.gap_max_ms = 0; /* a zeroed cfg: every gap would be 1 ms */
    assert_int_equal(cps__rs_init(&f.m, &cfg, &f.v[0], 2, 1000), CPS_EINVAL);
    cps__rs_fini(&f.m);
}

/* Range 0 taken and confirmed, range 1 refused: the pass ends pacing. */
static uint64_t confirm_0_refuse_1(fixture *f)
{
    start(f);
    assert_int_equal(step(f, CPS_RS_READY, 1000, 0), 0);
    uint64_t s0 = f->seq;
    assert_int_equal(step(f, CPS_RS_READY, 1000, 1), 0);
    assert_int_equal(step(f, CPS_RS_STREAMED, 1000, 0), 0);
    assert_int_equal(answer(f, 0, 1, s0, 1001), 0);
    cps__rs_event e = {.kind = CPS_RS_ANSWER, .now = 1001, .range = 1};
    e.ans =
        (cps__rr_answer){.sender = 2, .error = 1, .status = CPS_ESTALE_EPOCH, .put_seq = f->seq};
    assert_int_equal(cps__rs_step(&f->m, &e, &f->o), 0);
    assert_int_equal(only(f, CPS_RS_PROBE_TAIL)->range, 0);
    assert_int_equal(probe(f, 0, s0, 1002), 0);
    assert_int_equal(f->o.n, 0); /* pacing */
    assert_false(cps__rs_ended(&f->m));
    return 1000 + CFG.gap_ms;
}

static void test_a_range_done_is_not_failed_by_a_later_view(void **state)
{
    (void)state;
    fixture f;
    uint64_t t = confirm_0_refuse_1(&f);
    assert_int_equal(step(&f, CPS_RS_TICK, t, 0), 0);
    only(&f, CPS_RS_GET_VIEW);
    /* Range 0's only replica is dead now, and range 0 is done: the restore goes on. */
    assert_int_equal(view(&f, 3, t), 0);
    only(&f, CPS_RS_STREAM);
    assert_false(cps__rs_open(&f.m, 0));
    assert_true(cps__rs_open(&f.m, 1));
    assert_int_equal(step(&f, CPS_RS_READY, t, 1), 0);
    const cps__rs_out *p = only(&f, CPS_RS_PUT);
    assert_int_equal(p->to, 2);
    uint64_t s1 = p->seq;
    assert_int_equal(step(&f, CPS_RS_STREAMED, t, 0), 0);
    /* ... even when its chain is empty. */
    f.g[3][0].chain_len = 0;
    f.v[3].epoch = 10;
    assert_int_equal(step(&f, CPS_RS_TICK, t + CFG.refresh_ms, 0), 0);
    only(&f, CPS_RS_GET_VIEW);
    assert_int_equal(view(&f, 3, t + CFG.refresh_ms), 0);
    assert_false(cps__rs_ended(&f.m));
    assert_int_equal(answer(&f, 1, 2, s1, t + CFG.refresh_ms), 0);
    assert_int_equal(only(&f, CPS_RS_PROBE_TAIL)->range, 1);
    assert_int_equal(probe(&f, 1, s1, t + CFG.refresh_ms), 0);
    only(&f, CPS_RS_DONE);
    cps__rs_fini(&f.m);
}

/* Range 1 waits on view k (its chain's only member dead in k 3): passes until the view is k 4
 * from `back` on (UINT64_MAX: never). */
static void dead_replica(fixture *f, uint64_t back)
{
    views(f);
    /* Range 1's only replica (node 1 in k 3) is dead when the restore begins. */
    f->g[3][0].chain[0] = 2, f->g[3][1].chain[0] = 1;
    f->g[4][0].chain[0] = 2, f->g[4][1].chain[0] = 1;
    assert_int_equal(cps__rs_init(&f->m, &CFG, &f->v[3], 2, 1000), 0);
    uint64_t t = 1000;
    assert_int_equal(step(f, CPS_RS_TICK, t, 0), 0);
    for (int guard = 0; !cps__rs_ended(&f->m); guard++) {
        assert_true(guard < 100);
        const cps__rs_out *last = f->o.n ? &f->o.out[f->o.n - 1] : NULL;
        if (last && last->kind == CPS_RS_STREAM) {
            for (uint32_t r = 0; r < 2; r++) {
                if (r == 0 && !cps__rs_open(&f->m, 0))
                    continue; /* done */
                assert_int_equal(step(f, CPS_RS_READY, t, r), 0);
                if (r == 1 && t < back) {
                    only(f, CPS_RS_DISCARD); /* not streamed to a dead node */
                } else if (f->o.n) {
                    const cps__rs_out *p = only(f, CPS_RS_PUT);
                    assert_int_equal(answer(f, r, p->to, p->seq, t), 0);
                }
            }
            assert_int_equal(step(f, CPS_RS_STREAMED, t, 0), 0);
        } else if (last && last->kind == CPS_RS_PROBE_TAIL) {
            assert_int_equal(probe(f, last->range, f->seq, t), 0);
        } else if (last && last->kind == CPS_RS_GET_VIEW) {
            assert_int_equal(view(f, t < back ? 3 : 4, t), 0);
        } else {
            uint64_t due = cps__rs_deadline(&f->m);
            t = due > t ? due : t;
            assert_int_equal(step(f, CPS_RS_TICK, t, 0), 0);
        }
    }
}

static void test_a_dead_last_replica_is_waited_for(void **state)
{
    (void)state;
    fixture f;
    dead_replica(&f, 1000 + CFG.gap_ms); /* node 1 restarted on its data before pass 2 */
    assert_int_equal(f.m.rc, 0);
    only(&f, CPS_RS_DONE);
    assert_int_equal(f.m.book.pass, 2);
    cps__rs_fini(&f.m);
}

static void test_a_replica_dead_past_the_budget_fails_by_name(void **state)
{
    (void)state;
    fixture f;
    dead_replica(&f, UINT64_MAX);
    const cps__rs_out *x = only(&f, CPS_RS_FAILED);
    assert_int_equal(x->rc, CPS_EUNAVAILABLE);
    assert_int_equal(x->why, CPS_RS_WHY_NO_REPLICA);
    assert_int_equal(x->range, 1);
    assert_int_equal(f.m.book.pass, 3); /* CFG's budget: 3 passes */
    cps__rs_fini(&f.m);
}

static void test_a_tail_answering_from_a_newer_view_is_no_confirmation(void **state)
{
    (void)state;
    fixture f;
    start(&f);
    assert_int_equal(step(&f, CPS_RS_STREAMED, 1000, 0), 0);
    assert_int_equal(only(&f, CPS_RS_PROBE_TAIL)->to, 2); /* range 0's tail in view 0 */
    /* Node 2 answers from view 3 (epoch 4): a joiner may be the tail there, lacking records. */
    cps__rs_event e = {
        .kind = CPS_RS_PROBE, .now = 1001, .range = 0, .from = 2, .ok = 1, .seq = 0, .epoch = 4};
    assert_int_equal(cps__rs_step(&f.m, &e, &f.o), 0);
    assert_false(f.m.book.g[0].skip);
    only(&f, CPS_RS_GET_VIEW);
    assert_int_equal(view(&f, 3, 1001), 0); /* range 0: node 1's alone, node 1 dead: waits */
    e.epoch = 1;
    assert_int_equal(cps__rs_step(&f.m, &e, &f.o), 0);
    assert_false(f.m.book.g[0].skip);
    cps__rs_fini(&f.m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_pass_sends_to_the_heads_and_ends_when_the_tails_confirm),
        cmocka_unit_test(test_a_tail_behind_is_probed_again),
        cmocka_unit_test(test_a_full_window_holds_the_put_until_an_answer),
        cmocka_unit_test(test_a_silent_head_has_its_range_streamed_again),
        cmocka_unit_test(test_passes_wait_for_the_gap),
        cmocka_unit_test(test_a_head_silent_through_every_pass_fails_by_name),
        cmocka_unit_test(test_the_pass_limit_fails_the_restore),
        cmocka_unit_test(test_passes_back_off_within_the_budget),
        cmocka_unit_test(test_a_head_refusing_for_13_s_is_waited_out),
        cmocka_unit_test(test_a_view_without_the_head_drops_the_held_put),
        cmocka_unit_test(test_no_look_before_refresh_ms_when_nothing_is_gone),
        cmocka_unit_test(test_a_range_without_a_replica_fails_by_name),
        cmocka_unit_test(test_a_refusal_of_the_records_fails_at_once),
        cmocka_unit_test(test_a_later_incident_gets_the_whole_budget),
        cmocka_unit_test(test_a_zero_cap_is_refused),
        cmocka_unit_test(test_a_range_done_is_not_failed_by_a_later_view),
        cmocka_unit_test(test_a_dead_last_replica_is_waited_for),
        cmocka_unit_test(test_a_replica_dead_past_the_budget_fails_by_name),
        cmocka_unit_test(test_a_tail_answering_from_a_newer_view_is_no_confirmation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
