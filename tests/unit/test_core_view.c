#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "core/view.h"
#include "core/wire.h"
#include "core/wire.h"

/* Encoding offsets documented in view.c. */
#define HDR   40
#define NODE  140
#define RANGE 52

static unsigned char buf[1 << 16];

/* A view with the scheduler, `s` servers (ids 10..) and `w` workers (ids 100..), placed on
 * `n` ranges with `r` replicas. */
static void make_view(cps__view *v, uint32_t s, uint32_t w, uint32_t n, uint32_t r)
{
    uint32_t ids[64];
    cps__view_init(v);
    v->epoch = 7;
    v->mode = CPS_MODE_SSP;
    v->ssp_bound = 3;
    v->num_workers = w;
    v->num_servers = s;
    v->nnodes = 1 + s + w;
    v->nodes = calloc(v->nnodes, sizeof *v->nodes);
    assert_non_null(v->nodes);
    v->nodes[0].role = CPS_ROLE_SCHEDULER;
    v->nodes[0].alive = 1;
    snprintf(v->nodes[0].addr, CPS_ADDR_MAX, "tcp://10.0.0.1:9000");
    for (uint32_t i = 0; i < s + w; i++) {
        cps__node_info *nd = &v->nodes[1 + i];
        int server = i < s;
        nd->id = server ? 10 + i : 100 + (i - s);
        nd->role = server ? CPS_ROLE_SERVER : CPS_ROLE_WORKER;
        nd->alive = (uint8_t)(i % 3 != 2);
        nd->rank = server ? i : i - s;
        snprintf(nd->addr, CPS_ADDR_MAX, "tcp://127.0.0.1:%u", 20000 + i);
        if (server)
            ids[i] = nd->id;
    }
    if (n)
        assert_int_equal(cps__view_place_ranges(v, n, ids, s, r), 0);
}

static size_t encode(const cps__view *v)
{
    size_t n = cps__view_encode(v, buf, sizeof buf);
    assert_int_equal(n, cps__view_encoded_size(v));
    return n;
}

static void assert_views_equal(const cps__view *a, const cps__view *b)
{
    assert_true(a->epoch == b->epoch);
    assert_int_equal(a->mode, b->mode);
    assert_int_equal(a->ssp_bound, b->ssp_bound);
    assert_int_equal(a->backup_workers, b->backup_workers);
    assert_int_equal(a->num_workers, b->num_workers);
    assert_int_equal(a->num_servers, b->num_servers);
    assert_int_equal(a->replicas, b->replicas);
    assert_int_equal(a->nnodes, b->nnodes);
    assert_int_equal(a->nranges, b->nranges);
    for (uint32_t i = 0; i < a->nnodes; i++) {
        assert_int_equal(a->nodes[i].id, b->nodes[i].id);
        assert_int_equal(a->nodes[i].role, b->nodes[i].role);
        assert_int_equal(a->nodes[i].alive, b->nodes[i].alive);
        assert_int_equal(a->nodes[i].rank, b->nodes[i].rank);
        assert_string_equal(a->nodes[i].addr, b->nodes[i].addr);
    }
    for (uint32_t i = 0; i < a->nranges; i++) {
        assert_true(a->ranges[i].lo == b->ranges[i].lo);
        assert_true(a->ranges[i].hi == b->ranges[i].hi);
        assert_int_equal(a->ranges[i].chain_len, b->ranges[i].chain_len);
        assert_memory_equal(a->ranges[i].chain, b->ranges[i].chain, 4 * a->ranges[i].chain_len);
    }
}

/* ---- init / copy / lookup ---- */

static void init_copy_fini(void **state)
{
    (void)state;
    cps__view a, b;
    make_view(&a, 4, 3, 8, 3);
    cps__view_init(&b);
    assert_int_equal(cps__view_copy(&b, &a), 0);
    assert_views_equal(&a, &b);
    assert_ptr_not_equal(a.nodes, b.nodes);
    assert_ptr_not_equal(a.ranges, b.ranges);
    a.nodes[1].addr[0] = 'X'; /* deep: b is unaffected */
    assert_int_equal(b.nodes[1].addr[0], 't');

    cps__view c;
    make_view(&c, 2, 1, 2, 1);
    assert_int_equal(cps__view_copy(&c, &b), 0); /* old content of c is freed (ASan checks) */
    assert_views_equal(&b, &c);
    assert_int_equal(cps__view_copy(&c, &c), 0);
    assert_views_equal(&b, &c);

    cps__view_fini(&a);
    assert_null(a.nodes);
    assert_int_equal(a.nnodes, 0);
    cps__view_fini(&a); /* twice is harmless */
    cps__view_fini(&b);
    cps__view_fini(&c);
}

static void node_lookup(void **state)
{
    (void)state;
    cps__view v;
    make_view(&v, 3, 2, 0, 0);
    const cps__node_info *n = cps__view_node(&v, 11);
    assert_non_null(n);
    assert_int_equal(n->role, CPS_ROLE_SERVER);
    assert_int_equal(n->rank, 1);
    assert_non_null(cps__view_node(&v, 0));
    assert_int_equal(cps__view_node(&v, 101)->role, CPS_ROLE_WORKER);
    assert_null(cps__view_node(&v, 12345));
    cps__view_fini(&v);
    assert_null(cps__view_node(&v, 0));
}

/* ---- placement ---- */

static void ranges_cover_key_space(void **state)
{
    (void)state;
    uint32_t servers[] = {5};
    for (uint32_t n = 1; n <= 300; n += (n < 40 ? 1 : 37)) {
        cps__view v;
        cps__view_init(&v);
        assert_int_equal(cps__view_place_ranges(&v, n, servers, 1, 1), 0);
        assert_int_equal(v.nranges, n);
        assert_true(v.ranges[0].lo == 0);
        assert_true(v.ranges[n - 1].hi == UINT64_MAX);
        unsigned __int128 min = ~(unsigned __int128)0, max = 0;
        for (uint32_t r = 0; r < n; r++) {
            unsigned __int128 want_lo =
                ((unsigned __int128)r * ((unsigned __int128)1 << 64) + n - 1) / n;
            assert_true(v.ranges[r].lo == (uint64_t)want_lo);
            if (r > 0)
                assert_true(v.ranges[r].lo == v.ranges[r - 1].hi + 1);
            unsigned __int128 size = (unsigned __int128)v.ranges[r].hi - v.ranges[r].lo + 1;
            min = size < min ? size : min;
            max = size > max ? size : max;
        }
        assert_true(max - min <= 1); /* equal up to one key */
        cps__view_fini(&v);
    }
    cps__view v;
    cps__view_init(&v);
    assert_int_equal(cps__view_place_ranges(&v, 3, servers, 1, 1), 0);
    assert_true(v.ranges[1].lo == 6148914691236517206ull); /* ceil(2^64/3) */
    assert_true(v.ranges[0].hi == 6148914691236517205ull);
    assert_true(v.ranges[2].lo == 12297829382473034411ull); /* ceil(2*2^64/3) */
    cps__view_fini(&v);
}

static void ring_placement_roles(void **state)
{
    (void)state;
    const uint32_t S = 5, R = 3, N = 10;
    uint32_t servers[] = {21, 22, 23, 24, 25};
    cps__view v;
    cps__view_init(&v);
    assert_int_equal(cps__view_place_ranges(&v, N, servers, S, R), 0);
    assert_int_equal(v.replicas, R);
    int head[5] = {0}, mid[5] = {0}, tail[5] = {0};
    for (uint32_t r = 0; r < N; r++) {
        assert_int_equal(v.ranges[r].chain_len, R);
        for (uint32_t k = 0; k < R; k++) {
            uint32_t id = v.ranges[r].chain[k];
            assert_int_equal(id, servers[(r + k) % S]);
            int *cnt = k == 0 ? head : (k == R - 1 ? tail : mid);
            cnt[id - 21]++;
        }
    }
    for (uint32_t s = 0; s < S; s++) {
        assert_int_equal(head[s], 2);
        assert_int_equal(mid[s], 2);
        assert_int_equal(tail[s], 2);
    }
    /* placing again replaces the old ranges */
    assert_int_equal(cps__view_place_ranges(&v, 2, servers, 2, 2), 0);
    assert_int_equal(v.nranges, 2);
    assert_int_equal(v.ranges[1].chain[0], 22);
    assert_int_equal(v.ranges[1].chain[1], 21);
    cps__view_fini(&v);
}

static void placement_refused(void **state)
{
    (void)state;
    uint32_t servers[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    uint32_t dup[] = {1, 2, 1};
    uint32_t zero[] = {1, 0};
    cps__view v;
    cps__view_init(&v);
    assert_int_equal(cps__view_place_ranges(&v, 4, servers, 2, 3), CPS_EINVAL); /* R > S */
    assert_int_equal(cps__view_place_ranges(&v, 0, servers, 2, 1), CPS_EINVAL);
    assert_int_equal(cps__view_place_ranges(&v, 4, servers, 2, 0), CPS_EINVAL);
    assert_int_equal(cps__view_place_ranges(&v, 4, servers, 9, 9), CPS_EINVAL);
    assert_int_equal(cps__view_place_ranges(&v, 4, NULL, 2, 1), CPS_EINVAL);
    assert_int_equal(cps__view_place_ranges(&v, 4, dup, 3, 2), CPS_EINVAL);
    assert_int_equal(cps__view_place_ranges(&v, 4, zero, 2, 1), CPS_EINVAL);
    assert_int_equal(v.nranges, 0);
    assert_int_equal(cps__view_place_ranges(&v, 4, servers, 8, 8), 0);
    cps__view_fini(&v);
}

static void range_of_boundaries(void **state)
{
    (void)state;
    uint32_t servers[] = {1, 2, 3};
    for (uint32_t n = 1; n <= 17; n++) {
        cps__view v;
        cps__view_init(&v);
        assert_int_equal(cps__view_place_ranges(&v, n, servers, 3, 2), 0);
        assert_int_equal(cps__view_range_of(&v, 0), 0);
        assert_int_equal(cps__view_range_of(&v, UINT64_MAX), n - 1);
        for (uint32_t r = 0; r < n; r++) {
            assert_int_equal(cps__view_range_of(&v, v.ranges[r].lo), r);
            assert_int_equal(cps__view_range_of(&v, v.ranges[r].hi), r);
            uint64_t mid = v.ranges[r].lo + (v.ranges[r].hi - v.ranges[r].lo) / 2;
            assert_int_equal(cps__view_range_of(&v, mid), r);
            if (r > 0)
                assert_int_equal(cps__view_range_of(&v, v.ranges[r].lo - 1), r - 1);
        }
        cps__view_fini(&v);
    }
}

/* ---- encoding ---- */

/* Sync mode carries the backup workers where SSP carries its bound; b = 0 encodes as before. */
static void view_backup_workers_round_trip(void **state)
{
    (void)state;
    cps__view v, d;
    make_view(&v, 3, 3, 3, 2);
    v.mode = CPS_MODE_SYNC;
    v.ssp_bound = 0;
    v.backup_workers = 1;
    size_t n = encode(&v);
    assert_int_equal(cps__le32_get(buf + 16), 1);
    cps__view_init(&d);
    assert_int_equal(cps__view_decode(buf, n, &d), 0);
    assert_views_equal(&v, &d);
    v.backup_workers = 0;
    n = encode(&v);
    assert_int_equal(cps__le32_get(buf + 16), 0);
    assert_int_equal(cps__view_decode(buf, n, &d), 0);
    assert_int_equal(d.backup_workers, 0);
    /* an SSP view's bound is no backup count */
    v.mode = CPS_MODE_SSP;
    v.ssp_bound = 2;
    n = encode(&v);
    assert_int_equal(cps__view_decode(buf, n, &d), 0);
    assert_int_equal(d.backup_workers, 0);
    assert_int_equal(d.ssp_bound, 2);
    cps__view_fini(&v);
    cps__view_fini(&d);
}

static void view_round_trip(void **state)
{
    (void)state;
    cps__view v, d;
    make_view(&v, 6, 5, 12, 3);
    size_t n = encode(&v);
    assert_int_equal(n, HDR + NODE * 12 + RANGE * 12);
    cps__view_init(&d);
    assert_int_equal(cps__view_decode(buf, n, &d), 0);
    assert_views_equal(&v, &d);
    /* canonical: encoding what was decoded gives the same bytes */
    static unsigned char again[sizeof buf];
    assert_int_equal(cps__view_encode(&d, again, sizeof again), n);
    assert_memory_equal(buf, again, n);
    /* decoding into a used view replaces it */
    assert_int_equal(cps__view_decode(buf, n, &d), 0);
    assert_views_equal(&v, &d);
    assert_int_equal(cps__view_encode(&v, buf, n - 1), 0);
    cps__view_fini(&v);
    cps__view_fini(&d);

    /* before placement: no ranges, still a valid view */
    make_view(&v, 2, 2, 0, 0);
    n = encode(&v);
    cps__view_init(&d);
    assert_int_equal(cps__view_decode(buf, n, &d), 0);
    assert_int_equal(d.nranges, 0);
    assert_null(d.ranges);
    cps__view_fini(&v);
    cps__view_fini(&d);
}

/* Encode the standard view, apply `mutate`, decode: the result must be `want`, and a failed
 * decode must leave the destination untouched. */
static int decode_after(void (*mutate)(unsigned char *b, size_t *len))
{
    cps__view v, d, keep;
    make_view(&v, 4, 2, 4, 2);
    size_t n = encode(&v);
    mutate(buf, &n);
    make_view(&d, 1, 1, 1, 1);
    cps__view_init(&keep);
    assert_int_equal(cps__view_copy(&keep, &d), 0);
    int rc = cps__view_decode(buf, n, &d);
    if (rc)
        assert_views_equal(&keep, &d);
    cps__view_fini(&v);
    cps__view_fini(&d);
    cps__view_fini(&keep);
    return rc;
}

/* Node i of the standard view (0 scheduler, 1..4 servers 10..13, 5..6 workers 100..101). */
#define N_(i) (b + HDR + NODE * (i))
/* Range i (after 7 nodes). */
#define R_(i) (b + HDR + NODE * 7 + RANGE * (i))

static void m_truncate(unsigned char *b, size_t *len)
{
    (void)b, (*len)--;
}
static void m_extend(unsigned char *b, size_t *len)
{
    (void)b, (*len) += 4;
}
static void m_short(unsigned char *b, size_t *len)
{
    (void)b, *len = 39;
}
static void m_magic(unsigned char *b, size_t *len)
{
    (void)len, b[0] ^= 1;
}
static void m_mode(unsigned char *b, size_t *len)
{
    (void)len, cps__le32_put(b + 4, 3);
}
static void m_too_many_nodes(unsigned char *b, size_t *len)
{
    (void)len, cps__le32_put(b + 32, CPS_MAX_NODES + 1);
}
static void m_lying_nnodes(unsigned char *b, size_t *len)
{
    (void)len, cps__le32_put(b + 32, 6);
}
static void m_lying_nranges(unsigned char *b, size_t *len)
{
    (void)len, cps__le32_put(b + 36, 0xffffffffu);
}
static void m_replicas(unsigned char *b, size_t *len)
{
    (void)len, cps__le32_put(b + 28, 9);
}
static void m_role0(unsigned char *b, size_t *len)
{
    (void)len, N_(5)[4] = 0;
}
static void m_role4(unsigned char *b, size_t *len)
{
    (void)len, N_(5)[4] = 4;
}
static void m_id0_worker(unsigned char *b, size_t *len)
{
    (void)len, cps__le32_put(N_(5), 0);
}
static void m_sched_id(unsigned char *b, size_t *len)
{
    (void)len, cps__le32_put(N_(0), 77);
}
static void m_alive2(unsigned char *b, size_t *len)
{
    (void)len, N_(2)[5] = 2;
}
static void m_node_pad(unsigned char *b, size_t *len)
{
    (void)len, N_(2)[7] = 1;
}
static void m_dup_id(unsigned char *b, size_t *len)
{
    (void)len, cps__le32_put(N_(6), 100);
}
static void m_unterminated(unsigned char *b, size_t *len)
{
    (void)len, memset(N_(3) + 12, 'a', CPS_ADDR_MAX);
}
static void m_empty_addr(unsigned char *b, size_t *len)
{
    (void)len, memset(N_(3) + 12, 0, CPS_ADDR_MAX);
}
static void m_addr_trailing(unsigned char *b, size_t *len)
{
    (void)len, N_(3)[12 + 100] = 'x';
}
static void m_addr_space(unsigned char *b, size_t *len)
{
    (void)len, N_(3)[12 + 3] = ' ';
}
static void m_gap(unsigned char *b, size_t *len)
{
    (void)len, cps__le64_put(R_(2), cps__le64_get(R_(2)) + 1);
}
static void m_overlap(unsigned char *b, size_t *len)
{
    (void)len, cps__le64_put(R_(2), cps__le64_get(R_(2)) - 1);
}
static void m_first_lo(unsigned char *b, size_t *len)
{
    (void)len, cps__le64_put(R_(0), 1);
}
static void m_last_hi(unsigned char *b, size_t *len)
{
    (void)len, cps__le64_put(R_(3) + 8, UINT64_MAX - 1);
}
static void m_lo_gt_hi(unsigned char *b, size_t *len)
{
    /* range 1 ends before it starts, range 2 starts right after: only lo > hi is wrong */
    (void)len;
    uint64_t lo = cps__le64_get(R_(1));
    cps__le64_put(R_(1) + 8, lo - 2);
    cps__le64_put(R_(2), lo - 1);
}
static void m_early_max(unsigned char *b, size_t *len)
{
    /* range 1 already reaches UINT64_MAX; range 2 would have to start at 2^64 */
    (void)len;
    cps__le64_put(R_(1) + 8, UINT64_MAX);
    cps__le64_put(R_(2), 0);
}
static void m_chain_len0(unsigned char *b, size_t *len)
{
    (void)len, cps__le32_put(R_(1) + 16, 0);
}
static void m_chain_len9(unsigned char *b, size_t *len)
{
    (void)len, cps__le32_put(R_(1) + 16, 9);
}
static void m_unknown_node(unsigned char *b, size_t *len)
{
    (void)len, cps__le32_put(R_(1) + 20, 999);
}
static void m_worker_in_chain(unsigned char *b, size_t *len)
{
    (void)len, cps__le32_put(R_(1) + 20, 100);
}
static void m_sched_in_chain(unsigned char *b, size_t *len)
{
    (void)len, cps__le32_put(R_(1) + 24, 0);
}
static void m_chain_dup(unsigned char *b, size_t *len)
{
    (void)len, cps__le32_put(R_(1) + 24, cps__le32_get(R_(1) + 20));
}
static void m_unused_slot(unsigned char *b, size_t *len)
{
    (void)len, cps__le32_put(R_(1) + 20 + 4 * 5, 10);
}
static void m_shorter_chain(unsigned char *b, size_t *len)
{
    /* a chain that lost its tail after a failure: valid */
    (void)len;
    cps__le32_put(R_(1) + 16, 1);
    cps__le32_put(R_(1) + 24, 0);
}

static void view_decode_errors(void **state)
{
    (void)state;
    struct {
        void (*m)(unsigned char *, size_t *);
        int rc;
    } cases[] = {
        {m_truncate, CPS_ESIZE},
        {m_extend, CPS_ESIZE},
        {m_short, CPS_ESIZE},
        {m_magic, CPS_EPROTO},
        {m_mode, CPS_EPROTO},
        {m_too_many_nodes, CPS_EPROTO},
        {m_lying_nnodes, CPS_ESIZE},
        {m_lying_nranges, CPS_EPROTO},
        {m_replicas, CPS_EPROTO},
        {m_role0, CPS_EPROTO},
        {m_role4, CPS_EPROTO},
        {m_id0_worker, CPS_EPROTO},
        {m_sched_id, CPS_EPROTO},
        {m_alive2, CPS_EPROTO},
        {m_node_pad, CPS_EPROTO},
        {m_dup_id, CPS_EPROTO},
        {m_unterminated, CPS_EPROTO},
        {m_empty_addr, CPS_EPROTO},
        {m_addr_trailing, CPS_EPROTO},
        {m_addr_space, CPS_EPROTO},
        {m_gap, CPS_EPROTO},
        {m_overlap, CPS_EPROTO},
        {m_first_lo, CPS_EPROTO},
        {m_last_hi, CPS_EPROTO},
        {m_lo_gt_hi, CPS_EPROTO},
        {m_early_max, CPS_EPROTO},
        {m_chain_len0, CPS_EPROTO},
        {m_chain_len9, CPS_EPROTO},
        {m_unknown_node, CPS_EPROTO},
        {m_worker_in_chain, CPS_EPROTO},
        {m_sched_in_chain, CPS_EPROTO},
        {m_chain_dup, CPS_EPROTO},
        {m_unused_slot, CPS_EPROTO},
        {m_shorter_chain, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = decode_after(cases[i].m);
        if (rc != cases[i].rc)
            fail_msg("case %zu: got %s, want %s", i, cps_err_name(rc), cps_err_name(cases[i].rc));
    }
    cps__view d;
    cps__view_init(&d);
    assert_int_equal(cps__view_decode(NULL, 40, &d), CPS_EINVAL);
    assert_int_equal(cps__view_decode(buf, 40, NULL), CPS_EINVAL);
}

static void view_encode_unterminated_addr_is_refused_by_receiver(void **state)
{
    (void)state;
    cps__view v, d;
    make_view(&v, 2, 1, 2, 2);
    memset(v.nodes[1].addr, 'z', CPS_ADDR_MAX);
    size_t n = encode(&v);
    cps__view_init(&d);
    assert_int_equal(cps__view_decode(buf, n, &d), CPS_EPROTO);
    cps__view_fini(&v);
}

/* Regression (found by fuzz_wire_replay under UBSan): chains checked against an empty node
 * list must be refused, not searched with bsearch(NULL, 0). */
static void view_ranges_without_nodes(void **state)
{
    (void)state;
    uint32_t servers[] = {1};
    cps__view v, d;
    cps__view_init(&v);
    assert_int_equal(cps__view_place_ranges(&v, 2, servers, 1, 1), 0);
    size_t n = encode(&v);
    cps__view_init(&d);
    assert_int_equal(cps__view_decode(buf, n, &d), CPS_EPROTO);
    cps__view_fini(&v);
}

/* STATUS_REPLY carries a view followed by stats: only the prefix decoder accepts that. */
static void view_prefix_decode(void **state)
{
    (void)state;
    cps__view v, d;
    make_view(&v, 3, 2, 3, 2);
    size_t n = encode(&v), used = 0;
    memset(buf + n, 0xab, 100);
    cps__view_init(&d);
    assert_int_equal(cps__view_decode(buf, n + 100, &d), CPS_ESIZE);
    assert_int_equal(cps__view_decode_prefix(buf, n + 100, &d, &used), 0);
    assert_int_equal(used, n);
    assert_views_equal(&v, &d);
    assert_int_equal(cps__view_decode_prefix(buf, n, &d, &used), 0);
    assert_int_equal(used, n);
    assert_int_equal(cps__view_decode_prefix(buf, n - 1, &d, &used), CPS_ESIZE);
    assert_int_equal(cps__view_decode_prefix(buf, n, &d, NULL), CPS_EINVAL);
    buf[0] ^= 1;
    assert_int_equal(cps__view_decode_prefix(buf, n + 100, &d, &used), CPS_EPROTO);
    cps__view_fini(&v);
    cps__view_fini(&d);
}

/* ---- stats / hello ---- */

static void stats_round_trip(void **state)
{
    (void)state;
    cps__node_stats s = {1, 2, 3, 4, 5, 6, 7, UINT64_MAX, 9}, g;
    cps__stats_encode(buf, &s);
    assert_true(cps__le64_get(buf + 56) == UINT64_MAX);
    assert_true(cps__le64_get(buf + 64) == 9);
    assert_true(cps__le64_get(buf + 8) == 2);
    cps__stats_decode(buf, &g);
    assert_memory_equal(&s, &g, sizeof s);
}

static void hello_round_trip(void **state)
{
    (void)state;
    uint32_t role, rank, prev;
    char addr[CPS_ADDR_MAX];
    size_t n = cps__hello_encode(buf, sizeof buf, CPS_ROLE_SERVER, 2, 17, "tcp://h:1");
    assert_int_equal(n, 16 + 9);
    assert_int_equal(cps__hello_decode(buf, n, &role, &rank, &prev, addr, NULL), 0);
    assert_int_equal(role, CPS_ROLE_SERVER);
    assert_int_equal(rank, 2);
    assert_int_equal(prev, 17);
    assert_string_equal(addr, "tcp://h:1");

    n = cps__hello_encode(buf, sizeof buf, CPS_ROLE_WORKER, UINT32_MAX, 0, "tcp://w:2");
    assert_int_equal(cps__hello_decode(buf, n, &role, &rank, &prev, addr, NULL), 0);
    assert_int_equal(rank, UINT32_MAX);

    /* an observer (`chainps status`) introduces itself with no role */
    n = cps__hello_encode(buf, sizeof buf, CPS_ROLE_NONE, UINT32_MAX, 0, "tcp://cli:3");
    assert_int_equal(cps__hello_decode(buf, n, &role, &rank, &prev, addr, NULL), 0);
    assert_int_equal(role, CPS_ROLE_NONE);

    char longest[CPS_ADDR_MAX];
    memset(longest, 'a', sizeof longest - 1);
    longest[CPS_ADDR_MAX - 1] = 0;
    n = cps__hello_encode(buf, sizeof buf, CPS_ROLE_WORKER, 0, 0, longest);
    assert_int_equal(n, 16 + CPS_ADDR_MAX - 1);
    assert_int_equal(cps__hello_decode(buf, n, &role, &rank, &prev, addr, NULL), 0);
    assert_string_equal(addr, longest);
}

/* The flags word (CPS_HELLO_EMPTY: a server whose store has no data) follows the address, only
 * when not 0: a HELLO without flags is the form earlier builds send and read. */
static void hello_flags_extend_the_old_form(void **state)
{
    (void)state;
    uint32_t role, rank, prev, flags = 99;
    char addr[CPS_ADDR_MAX];
    size_t old = cps__hello_encode(buf, sizeof buf, CPS_ROLE_SERVER, 1, 0, "tcp://h:1");
    assert_int_equal(cps__hello_add_flags(buf, sizeof buf, old, 0), old);
    assert_int_equal(cps__hello_decode(buf, old, &role, &rank, &prev, addr, &flags), 0);
    assert_int_equal(flags, 0);
    size_t n = cps__hello_add_flags(buf, sizeof buf, old, CPS_HELLO_EMPTY);
    assert_int_equal(n, old + 4);
    assert_int_equal(cps__hello_decode(buf, n, &role, &rank, &prev, addr, &flags), 0);
    assert_int_equal(role, CPS_ROLE_SERVER);
    assert_string_equal(addr, "tcp://h:1");
    assert_int_equal(flags, CPS_HELLO_EMPTY);
    /* Bits this build does not know are kept for the caller to ignore. */
    cps__le32_put(buf + old, CPS_HELLO_EMPTY | 0x80u);
    assert_int_equal(cps__hello_decode(buf, n, &role, &rank, &prev, addr, &flags), 0);
    assert_int_equal(flags, CPS_HELLO_EMPTY | 0x80u);
    /* The flags pointer is optional. */
    assert_int_equal(cps__hello_decode(buf, n, &role, &rank, &prev, addr, NULL), 0);
    /* A flags word of 0 is never sent (one encoding per HELLO); other lengths are refused. */
    cps__le32_put(buf + old, 0);
    assert_int_equal(cps__hello_decode(buf, n, &role, &rank, &prev, addr, NULL), CPS_EPROTO);
    assert_int_equal(cps__hello_decode(buf, old + 2, &role, &rank, &prev, addr, NULL), CPS_ESIZE);
    assert_int_equal(cps__hello_decode(buf, old + 5, &role, &rank, &prev, addr, NULL), CPS_ESIZE);
    /* No room for the word. */
    assert_int_equal(cps__hello_add_flags(buf, old + 3, old, CPS_HELLO_EMPTY), 0);
}

static void hello_errors(void **state)
{
    (void)state;
    uint32_t role, rank, prev;
    char addr[CPS_ADDR_MAX], toolong[CPS_ADDR_MAX + 1];
    memset(toolong, 'a', CPS_ADDR_MAX);
    toolong[CPS_ADDR_MAX] = 0;

    assert_int_equal(cps__hello_encode(buf, 20, CPS_ROLE_WORKER, 0, 0, "tcp://x:1"), 0);
    assert_int_equal(cps__hello_encode(buf, sizeof buf, CPS_ROLE_WORKER, 0, 0, ""), 0);
    assert_int_equal(cps__hello_encode(buf, sizeof buf, CPS_ROLE_WORKER, 0, 0, NULL), 0);
    assert_int_equal(cps__hello_encode(buf, sizeof buf, CPS_ROLE_WORKER, 0, 0, toolong), 0);

    size_t n = cps__hello_encode(buf, sizeof buf, CPS_ROLE_WORKER, 0, 0, "tcp://x:1");
    for (size_t len = 0; len < 16; len++)
        assert_int_equal(cps__hello_decode(buf, len, &role, &rank, &prev, addr, NULL), CPS_ESIZE);
    assert_int_equal(cps__hello_decode(buf, n - 1, &role, &rank, &prev, addr, NULL), CPS_ESIZE);
    assert_int_equal(cps__hello_decode(buf, n + 1, &role, &rank, &prev, addr, NULL), CPS_ESIZE);
    cps__le32_put(buf + 12, UINT32_MAX); /* addr length lies; 16 + it must not wrap */
    assert_int_equal(cps__hello_decode(buf, n, &role, &rank, &prev, addr, NULL), CPS_ESIZE);

    uint32_t bad_roles[] = {CPS_ROLE_SCHEDULER, 4, UINT32_MAX};
    for (size_t i = 0; i < 3; i++) {
        n = cps__hello_encode(buf, sizeof buf, bad_roles[i], 0, 0, "tcp://x:1");
        assert_int_equal(cps__hello_decode(buf, n, &role, &rank, &prev, addr, NULL), CPS_EPROTO);
    }
    n = cps__hello_encode(buf, sizeof buf, CPS_ROLE_SERVER, CPS_MAX_NODES, 0, "tcp://x:1");
    assert_int_equal(cps__hello_decode(buf, n, &role, &rank, &prev, addr, NULL), CPS_EPROTO);

    n = cps__hello_encode(buf, sizeof buf, CPS_ROLE_SERVER, 0, 0, "tcp://x:1");
    buf[20] = 0; /* NUL inside the address */
    assert_int_equal(cps__hello_decode(buf, n, &role, &rank, &prev, addr, NULL), CPS_EPROTO);
    buf[20] = '\n';
    assert_int_equal(cps__hello_decode(buf, n, &role, &rank, &prev, addr, NULL), CPS_EPROTO);

    cps__le32_put(buf + 12, 0); /* empty address */
    assert_int_equal(cps__hello_decode(buf, 16, &role, &rank, &prev, addr, NULL), CPS_EPROTO);
    memset(buf + 16, 'a', CPS_ADDR_MAX);
    cps__le32_put(buf + 12, CPS_ADDR_MAX); /* no room for the NUL */
    assert_int_equal(cps__hello_decode(buf, 16 + CPS_ADDR_MAX, &role, &rank, &prev, addr, NULL),
                     CPS_EPROTO);
    assert_int_equal(cps__hello_decode(NULL, 16, &role, &rank, &prev, addr, NULL), CPS_EINVAL);
}

/* Worker replacement: who keeps a socket to a dead worker (the soak's fd leak). */
static void supersedes_worker_replacement(void **state)
{
    (void)state;
    cps__node_info n[5];
    memset(n, 0, sizeof n);
    /* server 1; worker 2 (rank 0) dead, replaced by worker 4 (alive); worker 3 (rank 1) dead
     * and not replaced; server 6 (rank 1) */
    n[0] = (cps__node_info){.id = 1, .role = CPS_ROLE_SERVER, .alive = 0, .rank = 0};
    n[1] = (cps__node_info){.id = 2, .role = CPS_ROLE_WORKER, .alive = 0, .rank = 0};
    n[2] = (cps__node_info){.id = 3, .role = CPS_ROLE_WORKER, .alive = 0, .rank = 1};
    n[3] = (cps__node_info){.id = 4, .role = CPS_ROLE_WORKER, .alive = 1, .rank = 0};
    n[4] = (cps__node_info){.id = 6, .role = CPS_ROLE_SERVER, .alive = 1, .rank = 1};
    cps__view v;
    cps__view_init(&v);
    v.nodes = n;
    v.nnodes = 4;
    assert_true(cps__node_supersedes(&n[3], &n[1])); /* replaced by a live worker */
    assert_true(cps__view_superseded(&v, &n[1]));
    assert_false(cps__view_superseded(&v, &n[2]));    /* its rank is free: kept */
    assert_false(cps__view_superseded(&v, &n[3]));    /* alive */
    assert_false(cps__view_superseded(&v, &n[0]));    /* servers never */
    assert_false(cps__node_supersedes(&n[4], &n[0])); /* not even by a server of its rank */
    assert_false(cps__node_supersedes(&n[1], &n[1]));
    /* the replacement died too: the latest holder of the rank keeps its peer */
    n[3].alive = 0;
    assert_true(cps__view_superseded(&v, &n[1]));
    assert_false(cps__view_superseded(&v, &n[3]));
    /* the first one taken back alive: superseded by nobody, and it supersedes the later one */
    n[1].alive = 1;
    assert_false(cps__view_superseded(&v, &n[1]));
    assert_true(cps__view_superseded(&v, &n[3]));
    v.nodes = NULL;
    v.nnodes = 0;
    cps__view_fini(&v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(init_copy_fini),
        cmocka_unit_test(node_lookup),
        cmocka_unit_test(ranges_cover_key_space),
        cmocka_unit_test(ring_placement_roles),
        cmocka_unit_test(placement_refused),
        cmocka_unit_test(range_of_boundaries),
        cmocka_unit_test(view_round_trip),
        cmocka_unit_test(view_backup_workers_round_trip),
        cmocka_unit_test(view_decode_errors),
        cmocka_unit_test(view_encode_unterminated_addr_is_refused_by_receiver),
        cmocka_unit_test(view_ranges_without_nodes),
        cmocka_unit_test(view_prefix_decode),
        cmocka_unit_test(stats_round_trip),
        cmocka_unit_test(hello_round_trip),
        cmocka_unit_test(hello_flags_extend_the_old_form),
        cmocka_unit_test(hello_errors),
        cmocka_unit_test(supersedes_worker_replacement),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
