/* Large messages between two transports of one runtime directory, through the ring, with a full
 * ring falling back to inline; reserved and filled buffers. Every wait has a deadline. */
#include "fixture.h"

/* ---- through the transport ---- */

typedef struct got {
    size_t n, from_ring;
    void *keep[16];
    size_t nkeep;
    int hold; /* keep buffers instead of freeing them */
    uint64_t sum;
    size_t bytes;
} got;

static void got_fn(void *ctx, void *buf, size_t len)
{
    got *g = ctx;
    g->n++;
    g->from_ring += (size_t)cps__ring_owns(buf);
    const unsigned char *b = buf;
    for (size_t i = 0; i < len; i += 4093)
        g->sum += b[i] * (i + 1);
    g->bytes += len;
    if (g->hold && g->nkeep < 16)
        g->keep[g->nkeep++] = buf;
    else
        cps__tp_free(buf);
}

static int wait_for(cps__tp *snd, cps__tp *rcv, got *g, size_t want)
{
    int64_t deadline = now_ms() + WAIT_MS;
    while (g->n < want && now_ms() < deadline) {
        assert_true(cps__tp_poll(snd, 0, NULL, NULL, 0) >= 0);
        assert_true(cps__tp_poll(rcv, 10, got_fn, g, 0) >= 0);
    }
    return g->n >= want;
}

static void *pattern(size_t len, unsigned seed, uint64_t *sum)
{
    unsigned char *b = cps__tp_alloc(len);
    assert_non_null(b);
    for (size_t i = 0; i < len; i++)
        b[i] = (unsigned char)(i * 131 + seed);
    for (size_t i = 0; i < len; i += 4093)
        *sum += b[i] * (i + 1);
    return b;
}

static cps__tp *bound_in(const char *dir, uint16_t *port)
{
    cps__tp *tp = NULL;
    assert_int_equal(cps__tp_create(NULL, &tp), 0);
    assert_int_equal(cps__tp_set_runtime_dir(tp, dir), 0);
    assert_int_equal(cps__tp_bind(tp, HOST, 0, port), 0);
    return tp;
}

/* Large messages to a same-host peer arrive from the ring, smaller ones inline, and with the
 * receiver holding every buffer the ring fills and the rest go inline, all bytes equal; the
 * receiver forwards a ring buffer on (a copy goes), and releases. */
void transport_ring_and_fallback(void **state)
{
    fixture *f = *state;
    if (!cps__ring_dir_in_memory(f->dir))
        skip(); /* no tmpfs on this machine: transports make no ring */
    setenv("CHAINPS_RING_MB", "4", 1);
    unsetenv("CHAINPS_RING_MIN_KB");
    uint16_t pa, pb;
    cps__tp *a = bound_in(f->dir, &pa), *b = bound_in(f->dir, &pb);
    unsetenv("CHAINPS_RING_MB");
    char url[64];
    snprintf(url, sizeof url, "tcp://" HOST ":%u", (unsigned)pb);
    assert_int_equal(cps__tp_peer_set(a, 2, url), 0);
    snprintf(url, sizeof url, "tcp://" HOST ":%u", (unsigned)pa);
    assert_int_equal(cps__tp_peer_set(b, 1, url), 0);
    assert_true(cps__tp_peer_local(a, 2));

    got g = {.hold = 1};
    uint64_t want = 0;
    const size_t big = 1 << 20;
    /* 6 x 1 MiB into a 4 MiB ring, all held: 3 from the ring (a slot is 1 MiB and a header),
     * the rest inline; one small one inline. */
    for (unsigned i = 0; i < 6; i++)
        assert_int_equal(cps__tp_send(a, 2, pattern(big, i, &want), big), 0);
    assert_int_equal(cps__tp_send(a, 2, pattern(1000, 99, &want), 1000), 0);
    assert_true(wait_for(a, b, &g, 7));
    assert_int_equal(g.from_ring, 3);
    assert_int_equal(g.sum, want);
    assert_int_equal(g.bytes, 6 * big + 1000);

    /* Forward the first ring buffer back to a: a copy travels (through b's own ring), and
     * b's slot in a's ring comes back. */
    got back = {0};
    void *fwd = g.keep[0];
    uint64_t fsum = 0;
    for (size_t i = 0; i < big; i += 4093)
        fsum += ((unsigned char *)fwd)[i] * (i + 1);
    assert_true(cps__ring_owns(fwd));
    assert_int_equal(cps__tp_send(b, 1, fwd, big), 0);
    assert_true(wait_for(b, a, &back, 1));
    assert_int_equal(back.sum, fsum);
    assert_int_equal(back.from_ring, 1);
    for (size_t i = 1; i < g.nkeep; i++)
        cps__tp_free(g.keep[i]);
    g = (got){0};
    /* All released: the ring takes 1 MiB messages again. */
    want = 0;
    for (unsigned i = 0; i < 3; i++)
        assert_int_equal(cps__tp_send(a, 2, pattern(big, 10 + i, &want), big), 0);
    assert_true(wait_for(a, b, &g, 3));
    assert_int_equal(g.from_ring, 3);
    assert_int_equal(g.sum, want);

    /* a restarts (a new transport on the same address, so the same ring name): b maps the new
     * file and takes its messages. */
    cps__tp_destroy(a);
    cps__tp *a2 = NULL;
    setenv("CHAINPS_RING_MB", "4", 1);
    assert_int_equal(cps__tp_create(NULL, &a2), 0);
    unsetenv("CHAINPS_RING_MB");
    assert_int_equal(cps__tp_set_runtime_dir(a2, f->dir), 0);
    assert_int_equal(cps__tp_bind(a2, HOST, pa, NULL), 0);
    snprintf(url, sizeof url, "tcp://" HOST ":%u", (unsigned)pb);
    assert_int_equal(cps__tp_peer_set(a2, 2, url), 0);
    g = (got){0};
    want = 0;
    assert_int_equal(cps__tp_send(a2, 2, pattern(big, 42, &want), big), 0);
    assert_true(wait_for(a2, b, &g, 1));
    assert_int_equal(g.from_ring, 1);
    assert_int_equal(g.sum, want);

    /* b fills a2's ring (holding three buffers) and restarts on the same address without
     * releasing them: a2 sees the connection break and takes those slots back when its ring is
     * full, so the new b gets ring messages again. */
    g = (got){.hold = 1};
    want = 0;
    for (unsigned i = 0; i < 4; i++)
        assert_int_equal(cps__tp_send(a2, 2, pattern(big, 50 + i, &want), big), 0);
    assert_true(wait_for(a2, b, &g, 4));
    assert_int_equal(g.from_ring, 3);
    uint64_t held_sum = 0;
    for (size_t k = 0; k < g.nkeep; k++)
        for (size_t i = 0; i < big; i += 4093)
            held_sum += ((unsigned char *)g.keep[k])[i] * (i + 1);
    assert_int_equal(held_sum, want);
    cps__tp_destroy(b);
    cps__tp *b2 = NULL;
    assert_int_equal(cps__tp_create(NULL, &b2), 0);
    assert_int_equal(cps__tp_set_runtime_dir(b2, f->dir), 0);
    assert_int_equal(cps__tp_bind(b2, HOST, pb, NULL), 0);
    int64_t deadline = now_ms() + WAIT_MS;
    while (!cps__tp_peer_connected(a2, 2) && now_ms() < deadline)
        assert_true(cps__tp_poll(a2, 10, NULL, NULL, 0) >= 0);
    assert_true(cps__tp_peer_connected(a2, 2));
    got g2 = {0};
    want = 0;
    assert_int_equal(cps__tp_send(a2, 2, pattern(big, 60, &want), big), 0);
    assert_true(wait_for(a2, b2, &g2, 1));
    assert_int_equal(g2.from_ring, 1);
    assert_int_equal(g2.sum, want);
    /* The old b's buffers (maybe a b counted gone by mistake and still reading) kept their
     * bytes: a2 retired its ring rather than reuse their slots. Released late, they leave the
     * new b's slots alone. */
    uint64_t held_after = 0;
    for (size_t k = 0; k < g.nkeep; k++)
        for (size_t i = 0; i < big; i += 4093)
            held_after += ((unsigned char *)g.keep[k])[i] * (i + 1);
    assert_int_equal(held_after, held_sum);
    for (size_t i = 0; i < g.nkeep; i++)
        cps__tp_free(g.keep[i]);
    cps__tp_destroy(a2);
    cps__tp_destroy(b2);
}

/* A message built in a reserved slot arrives from the ring, at the length sent (shorter than
 * reserved); an unreserved slot does not hold the ring; with the ring full the reservation is
 * a plain buffer and goes inline; a slot reserved for a peer that then moves off this host
 * goes there as a copy. */
void transport_reserve(void **state)
{
    fixture *f = *state;
    if (!cps__ring_dir_in_memory(f->dir))
        skip(); /* no tmpfs on this machine: transports make no ring */
    setenv("CHAINPS_RING_MB", "4", 1);
    unsetenv("CHAINPS_RING_MIN_KB");
    uint16_t pa, pb, pc;
    cps__tp *a = bound_in(f->dir, &pa), *b = bound_in(f->dir, &pb);
    unsetenv("CHAINPS_RING_MB");
    cps__tp *c = NULL; /* no runtime directory: reached over tcp:// */
    assert_int_equal(cps__tp_create(NULL, &c), 0);
    assert_int_equal(cps__tp_bind(c, HOST, 0, &pc), 0);
    char url[64];
    snprintf(url, sizeof url, "tcp://" HOST ":%u", (unsigned)pb);
    assert_int_equal(cps__tp_peer_set(a, 2, url), 0);
    assert_true(cps__tp_peer_local(a, 2));
    const size_t big = 1 << 20;

    /* Built in place, sent 100 bytes shorter than reserved. */
    got g = {0};
    unsigned char *m = cps__tp_reserve(a, 2, big);
    assert_non_null(m);
    assert_int_equal((uintptr_t)m % 64, 0);
    uint64_t want = 0;
    for (size_t i = 0; i < big - 100; i++)
        m[i] = (unsigned char)(i * 7 + 3);
    for (size_t i = 0; i < big - 100; i += 4093)
        want += m[i] * (i + 1);
    assert_int_equal(cps__tp_send(a, 2, m, big + 1), CPS_EINVAL); /* still reserved */
    assert_int_equal(cps__tp_send(a, 2, m, big - 100), 0);
    assert_true(wait_for(a, b, &g, 1));
    assert_int_equal(g.from_ring, 1);
    assert_int_equal(g.bytes, big - 100);
    assert_int_equal(g.sum, want);

    /* Reserved and given back: the 4 MiB ring still takes three 1 MiB messages held by b. */
    cps__tp_unreserve(a, cps__tp_reserve(a, 2, big));
    g = (got){.hold = 1};
    want = 0;
    for (unsigned i = 0; i < 3; i++)
        assert_int_equal(cps__tp_send(a, 2, pattern(big, 20 + i, &want), big), 0);
    assert_true(wait_for(a, b, &g, 3));
    assert_int_equal(g.from_ring, 3);
    assert_int_equal(g.sum, want);

    /* The ring is full (b holds them): the reservation is a plain buffer, sent inline, also
     * when it is sent shorter than reserved (cut in place). Each counts once as inline for
     * want of room: its send does not try the ring again. */
    cps__tp_ring_stats st0, st;
    cps__tp_ring_stats_get(a, &st0);
    got g2 = {0};
    m = cps__tp_reserve(a, 2, big);
    assert_non_null(m);
    assert_false(cps__ring_owns(m));
    memset(m, 0x11, big);
    assert_int_equal(cps__tp_send(a, 2, m, big), 0);
    m = cps__tp_reserve(a, 2, big);
    assert_non_null(m);
    memset(m, 0x22, big);
    assert_int_equal(cps__tp_send(a, 2, m, big - 100), 0); /* a copy, too big for the room left */
    assert_true(wait_for(a, b, &g2, 2));
    assert_int_equal(g2.from_ring, 0);
    assert_int_equal(g2.bytes, 2 * big - 100);
    cps__tp_ring_stats_get(a, &st);
    assert_int_equal(st.inline_full - st0.inline_full, 2);
    assert_int_equal(st.sent, st0.sent);
    for (size_t i = 0; i < g.nkeep; i++)
        cps__tp_free(g.keep[i]);

    /* Reserved for peer 2 in the ring, then peer 2 moves to c, which is not on this host's
     * runtime directory: the bytes go to c over tcp:// as a copy, and the slot comes back. */
    m = cps__tp_reserve(a, 2, big);
    assert_non_null(m);
    memset(m, 0x33, big);
    snprintf(url, sizeof url, "tcp://" HOST ":%u", (unsigned)pc);
    assert_int_equal(cps__tp_peer_set(a, 2, url), 0);
    assert_false(cps__tp_peer_local(a, 2));
    got g3 = {0};
    assert_int_equal(cps__tp_send(a, 2, m, big), 0);
    assert_true(wait_for(a, c, &g3, 1));
    assert_int_equal(g3.from_ring, 0);
    assert_int_equal(g3.bytes, big);
    /* Reserved for the tcp:// peer (a plain buffer) and sent shorter: cut in place. */
    m = cps__tp_reserve(a, 2, big);
    assert_non_null(m);
    g3 = (got){0};
    want = 0;
    for (size_t k = 0; k < big - 5000; k++)
        m[k] = (unsigned char)(k * 11 + 1);
    for (size_t k = 0; k < big - 5000; k += 4093)
        want += m[k] * (k + 1);
    assert_int_equal(cps__tp_send(a, 2, m, big - 5000), 0);
    assert_true(wait_for(a, c, &g3, 1));
    assert_int_equal(g3.bytes, big - 5000);
    assert_int_equal(g3.sum, want);
    /* And back to b: the ring has all its room again (the moved slot was given back). */
    snprintf(url, sizeof url, "tcp://" HOST ":%u", (unsigned)pb);
    assert_int_equal(cps__tp_peer_set(a, 2, url), 0);
    g = (got){.hold = 1};
    want = 0;
    for (unsigned i = 0; i < 3; i++) {
        m = cps__tp_reserve(a, 2, big);
        assert_non_null(m);
        assert_true(m != NULL);
        for (size_t k = 0; k < big; k++)
            m[k] = (unsigned char)(k * 131 + 30 + i);
        for (size_t k = 0; k < big; k += 4093)
            want += m[k] * (k + 1);
        assert_int_equal(cps__tp_send(a, 2, m, big), 0);
    }
    assert_true(wait_for(a, b, &g, 3));
    assert_int_equal(g.from_ring, 3);
    assert_int_equal(g.sum, want);
    for (size_t i = 0; i < g.nkeep; i++)
        cps__tp_free(g.keep[i]);
    /* Unknown peer: refused, still the caller's. */
    m = cps__tp_reserve(a, 2, big);
    assert_int_equal(cps__tp_send(a, 9, m, big), CPS_ENOTFOUND);
    assert_int_equal(cps__tp_unreserve(a, m), 0);

    /* Given back twice, or sent already: a slot pointer of ours (shared memory, no nanomsg
     * chunk) is refused, not freed; so is a buffer that was never reserved. */
    assert_int_equal(cps__tp_unreserve(a, m), CPS_EINVAL);
    m = cps__tp_reserve(a, 2, big);
    memset(m, 0x44, big);
    g = (got){0};
    assert_int_equal(cps__tp_send(a, 2, m, big), 0);
    assert_true(wait_for(a, b, &g, 1));
    assert_int_equal(cps__tp_unreserve(a, m), CPS_EINVAL);
    void *plain = cps__tp_alloc(100);
    assert_int_equal(cps__tp_unreserve(a, plain), CPS_EINVAL);
    cps__tp_free(plain);

    /* The ring is retired under a reservation (peer 3, dropped, held a slot): the slot's file
     * stays mapped for its builder, the send goes as a copy (into the new generation), and
     * the old file goes once the reservation is done with. */
    uint16_t p3;
    cps__tp *b3 = bound_in(f->dir, &p3);
    snprintf(url, sizeof url, "tcp://" HOST ":%u", (unsigned)p3);
    assert_int_equal(cps__tp_peer_set(a, 3, url), 0);
    got gh = {.hold = 1};
    want = 0;
    assert_int_equal(cps__tp_send(a, 3, pattern(big, 70, &want), big), 0);
    assert_true(wait_for(a, b3, &gh, 1));
    assert_int_equal(gh.from_ring, 1);
    cps__tp_ring_stats_get(a, &st0);
    m = cps__tp_reserve(a, 2, big);
    assert_non_null(m);
    cps__tp_ring_stats_get(a, &st);
    assert_int_equal(st.live, st0.live + 1); /* a slot */
    want = 0;
    for (size_t k = 0; k < big - 100; k++)
        m[k] = (unsigned char)(k * 17 + 9);
    for (size_t k = 0; k < big - 100; k += 4093)
        want += m[k] * (k + 1);
    cps__tp_peer_drop(a, 3);
    cps__tp_ring_stats_get(a, &st);
    assert_int_equal(st.retired, st0.retired + 1);
    assert_int_equal(st.retired_held, 1);
    assert_int_equal(st.live, 0);
    g = (got){0};
    assert_int_equal(cps__tp_send(a, 2, m, big - 100), 0);
    assert_true(wait_for(a, b, &g, 1));
    assert_int_equal(g.bytes, big - 100);
    assert_int_equal(g.sum, want);
    cps__tp_ring_stats_get(a, &st);
    assert_int_equal(st.retired_held, 0); /* the old file unmapped */
    assert_int_equal(st.live, 0);         /* b released the copy */
    assert_int_equal(st.built, st0.built);
    for (size_t i = 0; i < gh.nkeep; i++)
        cps__tp_free(gh.keep[i]);
    cps__tp_destroy(b3);

    /* A descriptor that cannot be sent (peer 4's receiver is gone and its queue is full): the
     * commit is undone, the slot is the caller's again, and given back it leaves no slot live. */
    uint16_t p4;
    cps__tp *b4 = bound_in(f->dir, &p4);
    snprintf(url, sizeof url, "tcp://" HOST ":%u", (unsigned)p4);
    assert_int_equal(cps__tp_peer_set(a, 4, url), 0);
    assert_true(cps__tp_peer_local(a, 4));
    cps__tp_destroy(b4);
    int full = 0;
    for (int i = 0; i < 200000 && !full; i++) {
        void *s = cps__tp_alloc(8);
        assert_non_null(s);
        memset(s, 0, 8);
        int rc = cps__tp_send(a, 4, s, 8);
        if (rc == CPS_EAGAIN) {
            cps__tp_free(s);
            full = 1;
        } else {
            assert_int_equal(rc, 0);
        }
    }
    assert_true(full);
    cps__tp_ring_stats_get(a, &st0);
    m = cps__tp_reserve(a, 4, big);
    assert_non_null(m);
    memset(m, 0x55, big);
    assert_int_equal(cps__tp_send(a, 4, m, big), CPS_EAGAIN);
    cps__tp_ring_stats_get(a, &st);
    assert_int_equal(st.live, st0.live + 1);
    assert_int_equal(st.sent, st0.sent);
    cps__tp_peer_drop(a, 4); /* unsent: not taken back with the peer, the ring not retired */
    cps__tp_ring_stats_get(a, &st);
    assert_int_equal(st.retired, st0.retired);
    assert_int_equal(cps__tp_unreserve(a, m), 0);
    cps__tp_ring_stats_get(a, &st);
    assert_int_equal(st.live, st0.live);
    /* The slot's room is back: a message to b goes through the ring. */
    g = (got){0};
    want = 0;
    assert_int_equal(cps__tp_send(a, 2, pattern(big, 80, &want), big), 0);
    assert_true(wait_for(a, b, &g, 1));
    assert_int_equal(g.from_ring, 1);
    assert_int_equal(g.sum, want);
    /* One left unsent at destroy is freed with the transport (ASan/LSan would say otherwise). */
    assert_non_null(cps__tp_reserve(a, 9, 1000));
    cps__tp_destroy(a);
    cps__tp_destroy(b);
    cps__tp_destroy(c);
}

/* cps__tp_fill into a buffer for a same-host peer is a plain copy, with a key too: a ring slot
 * (large) or an inline buffer (small) arrives with the bytes filled, unsealed as local
 * messages go. */
void transport_fill_local(void **state)
{
    fixture *f = *state;
    if (!cps__ring_dir_in_memory(f->dir))
        skip(); /* no tmpfs on this machine: transports make no ring */
    static const unsigned char key[32] = "ring fill test job key, 32 byte";
    setenv("CHAINPS_RING_MB", "4", 1);
    unsetenv("CHAINPS_RING_MIN_KB");
    cps__tp *tp[2];
    uint16_t port[2];
    for (int i = 0; i < 2; i++) {
        assert_int_equal(cps__tp_create(key, &tp[i]), 0);
        assert_int_equal(cps__tp_set_runtime_dir(tp[i], f->dir), 0);
        assert_int_equal(cps__tp_bind(tp[i], HOST, 0, &port[i]), 0);
    }
    unsetenv("CHAINPS_RING_MB");
    char url[64];
    snprintf(url, sizeof url, "tcp://" HOST ":%u", (unsigned)port[1]);
    assert_int_equal(cps__tp_peer_set(tp[0], 2, url), 0);
    assert_true(cps__tp_peer_local(tp[0], 2));
    const size_t sizes[] = {1 << 20, 1000};
    for (int k = 0; k < 2; k++) {
        size_t len = sizes[k];
        unsigned char *src = malloc(len);
        assert_non_null(src);
        uint64_t want = 0;
        for (size_t i = 0; i < len; i++)
            src[i] = (unsigned char)(i * 29 + 5 + (unsigned)k);
        unsigned char *m = cps__tp_reserve(tp[0], 2, len);
        assert_non_null(m);
        memcpy(m, src, 64);
        assert_int_equal(cps__tp_fill(tp[0], m, 64, src + 64, len / 2 - 64), 0);
        assert_int_equal(cps__tp_fill(tp[0], m, len / 2, src + len / 2, len - len / 2), 0);
        for (size_t i = 0; i < len; i += 4093)
            want += src[i] * (i + 1);
        got g = {0};
        assert_int_equal(cps__tp_send(tp[0], 2, m, len), 0);
        assert_true(wait_for(tp[0], tp[1], &g, 1));
        assert_int_equal(g.from_ring, k == 0);
        assert_int_equal(g.bytes, len);
        assert_int_equal(g.sum, want);
        assert_int_equal(cps__tp_auth_dropped(tp[1]), 0);
        free(src);
    }
    cps__tp_destroy(tp[0]);
    cps__tp_destroy(tp[1]);
}

/* A runtime directory on a disk file system: no ring (its pages would be written back), the
 * large message goes inline. */
void transport_inline_off_tmpfs(void **state)
{
    (void)state;
    char dir[] = "./cps-ring-disk-XXXXXX";
    assert_non_null(mkdtemp(dir));
    if (cps__ring_dir_in_memory(dir)) {
        rmdir(dir);
        skip(); /* the working directory is on tmpfs: nothing to show */
    }
    char abs[512];
    assert_non_null(realpath(dir, abs));
    uint16_t pa, pb;
    cps__tp *a = bound_in(abs, &pa), *b = bound_in(abs, &pb);
    char url[64];
    snprintf(url, sizeof url, "tcp://" HOST ":%u", (unsigned)pb);
    assert_int_equal(cps__tp_peer_set(a, 2, url), 0);
    assert_true(cps__tp_peer_local(a, 2));
    got g = {0};
    uint64_t want = 0;
    assert_int_equal(cps__tp_send(a, 2, pattern(1 << 20, 7, &want), 1 << 20), 0);
    assert_true(wait_for(a, b, &g, 1));
    assert_int_equal(g.from_ring, 0);
    assert_int_equal(g.sum, want);
    char path[600];
    struct stat st;
    assert_int_equal(cps__ring_path(abs, 1, path, sizeof path), 0);
    cps__tp_destroy(a);
    cps__tp_destroy(b);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", abs);
    assert_int_equal(system(cmd), 0);
    (void)st;
}
