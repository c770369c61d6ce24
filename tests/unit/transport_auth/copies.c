/* unit.transport_auth: the MAC made during the copy (fused, and as fill copies). */
#include "fixture.h"

/* The MAC riding on a copy (cps__auth_seal_copy, cps__auth_open_copy) is the same MAC: what one
 * seals the other opens, the copied bytes arrive intact, and a byte changed anywhere (before,
 * inside or after the copied part, in a piece's first or last byte, in the trailer) is refused. */
void fused_copy_is_the_same_mac(void **state)
{
    (void)state;
    /* Three full 16 KiB pieces and a partial one, between a 32-byte head and a 100-byte tail. */
    enum { AT = 32, N = 3 * 16384 + 123, LEN = AT + N + 100 };
    unsigned char *src = malloc(N), *m = malloc(LEN + CPS_AUTH_TRAILER), *dst = malloc(N);
    assert_true(src && m && dst);
    for (size_t i = 0; i < N; i++)
        src[i] = (unsigned char)(i * 13u + (i >> 9));
    for (size_t i = 0; i < LEN; i++)
        m[i] = (unsigned char)(i * 7u + 1);
    cps__auth *tx, *rx;
    assert_int_equal(cps__auth_create(KEY, &tx), 0);
    assert_int_equal(cps__auth_create(KEY, &rx), 0);

    /* Sealed while copying: copied exactly, and the plain open takes it. */
    cps__auth_seal_copy(tx, m, LEN, AT, src, N);
    assert_memory_equal(m + AT, src, N);
    assert_int_equal(open_copy(rx, m, LEN + CPS_AUTH_TRAILER), CPS_AUTH_OK);
    /* Sealed the plain way: opened while copying, the bytes arrive. */
    cps__auth_seal(tx, m, LEN);
    size_t body = 0;
    memset(dst, 0, N);
    assert_int_equal(cps__auth_open_copy(rx, m, LEN + CPS_AUTH_TRAILER, &body, AT, dst, N),
                     CPS_AUTH_OK);
    assert_int_equal(body, LEN);
    assert_memory_equal(dst, m + AT, N);
    /* Replays are refused as by the plain open. */
    assert_int_equal(cps__auth_open_copy(rx, m, LEN + CPS_AUTH_TRAILER, &body, AT, dst, N),
                     CPS_AUTH_REPLAY);

    /* One flipped byte anywhere: refused by the fused open (a fresh receiver each time, so the
     * verdict is the tag's, not the replay window's). */
    cps__auth_seal_copy(tx, m, LEN, AT, src, N);
    size_t where[] = {
        0,          AT - 1, AT,      AT + 16383, AT + 16384,          AT + N / 2,
        AT + N - 1, AT + N, LEN - 1, LEN,        LEN + CPS_AUTH_SALT, LEN + CPS_AUTH_TRAILER - 1};
    for (size_t w = 0; w < sizeof where / sizeof *where + LEN / 997; w++) {
        size_t at =
            w < sizeof where / sizeof *where ? where[w] : (w - sizeof where / sizeof *where) * 997;
        cps__auth *fresh;
        assert_int_equal(cps__auth_create(KEY, &fresh), 0);
        m[at] ^= 0x20;
        int v = cps__auth_open_copy(fresh, m, LEN + CPS_AUTH_TRAILER, &body, AT, dst, N);
        m[at] ^= 0x20;
        if (v == CPS_AUTH_OK)
            fail_msg("a flipped byte at %zu of %d was taken", at, LEN + CPS_AUTH_TRAILER);
        cps__auth_destroy(fresh);
    }
    /* Unflipped, the same message still opens. */
    assert_int_equal(cps__auth_open_copy(rx, m, LEN + CPS_AUTH_TRAILER, &body, AT, dst, N),
                     CPS_AUTH_OK);
    assert_memory_equal(dst, src, N);

    /* A copy reaching past the body is refused before anything is copied. */
    memset(dst, 0xa5, N);
    assert_int_equal(cps__auth_open_copy(rx, m, LEN + CPS_AUTH_TRAILER, &body, LEN - N + 1, dst, N),
                     CPS_AUTH_SHORT);
    assert_int_equal(dst[0], 0xa5);
    assert_int_equal(dst[N - 1], 0xa5);

    /* Without a key: copied both ways, the trailer zeroed. */
    cps__auth *ntx, *nrx;
    assert_int_equal(cps__auth_create(NULL, &ntx), 0);
    assert_int_equal(cps__auth_create(NULL, &nrx), 0);
    memset(m + AT, 0, N);
    cps__auth_seal_copy(ntx, m, LEN, AT, src, N);
    assert_memory_equal(m + AT, src, N);
    for (size_t i = 0; i < CPS_AUTH_TRAILER; i++)
        assert_int_equal(m[LEN + i], 0);
    memset(dst, 0, N);
    assert_int_equal(cps__auth_open_copy(nrx, m, LEN + CPS_AUTH_TRAILER, &body, AT, dst, N),
                     CPS_AUTH_OK);
    assert_memory_equal(dst, src, N);
    /* A keyed receiver refuses it as unsigned, leaving dst alone. */
    memset(dst, 0xa5, N);
    assert_int_equal(cps__auth_open_copy(rx, m, LEN + CPS_AUTH_TRAILER, &body, AT, dst, N),
                     CPS_AUTH_UNSIGNED);
    assert_int_equal(dst[0], 0xa5);

    cps__auth_destroy(ntx), cps__auth_destroy(nrx);
    cps__auth_destroy(tx), cps__auth_destroy(rx);
    free(src), free(m), free(dst);
}

/* A raw PULL socket bound on 127.0.0.1 at a free port, to see the bytes a transport sends. */
static int raw_inbox(char *url, size_t cap)
{
    int s = nn_socket(AF_SP, NN_PULL);
    assert_true(s >= 0);
    int big = -1;
    assert_true(nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVMAXSIZE, &big, sizeof big) >= 0);
    srand((unsigned)getpid() ^ (unsigned)now_ms());
    for (int i = 0; i < 64; i++) {
        snprintf(url, cap, "tcp://" HOST ":%d", 20000 + rand() % 40000);
        if (nn_bind(s, url) >= 0)
            return s;
    }
    fail_msg("no free port for a raw inbox");
    return -1;
}

/* The next message on raw socket s, polling `from` so that it connects and flushes. */
static size_t raw_recv(int s, cps__tp *from, unsigned char **msg)
{
    int64_t end = (int64_t)now_ms() + WAIT_MS;
    while ((int64_t)now_ms() < end) {
        int n = nn_recv(s, msg, NN_MSG, NN_DONTWAIT);
        if (n >= 0)
            return (size_t)n;
        cps__tp_poll(from, 10, NULL, NULL, 0);
    }
    fail_msg("nothing arrived");
    return 0;
}

static uint64_t counter_of(const unsigned char *m, size_t n)
{
    return cps__le64_get(m + n - CPS_AUTH_TAG - 8);
}

/* A plain message of BODY bytes sent by tx to peer 7 and received on s; returns its counter. */
static uint64_t send_between(cps__tp *tx, int s)
{
    unsigned char *b = cps__tp_alloc(BODY), *got;
    memset(b, 'b', BODY);
    assert_int_equal(cps__tp_send(tx, 7, b, BODY), 0);
    size_t n = raw_recv(s, tx, &got);
    assert_int_equal(n, BODY + CPS_AUTH_TRAILER);
    uint64_t c = counter_of(got, n);
    nn_freemsg(got);
    return c;
}

/* cps__tp_fill to a tcp:// peer with a key: the values are MACed as they are copied (the
 * message's counter is taken at its first fill, before a message sent in between), the message
 * on the wire is what a plain receiver takes (cps__auth_open, the same wire format), and a byte
 * flipped anywhere in it is refused. Fills out of order, or overtaken by another buffer's fills,
 * still copy, and the message is sealed whole at send. */
void fill_macs_as_it_copies(void **state)
{
    (void)state;
    /* Three full 16 KiB pieces and a partial one, between a header and a tail. */
    enum { HEAD = 64 + 24, N = 3 * 16384 + 123, GAP = 10, LEN = HEAD + N + 100 };
    unsigned char *src = malloc(N), *want = malloc(LEN);
    assert_true(src && want);
    for (size_t i = 0; i < N; i++)
        src[i] = (unsigned char)(i * 13u + (i >> 9));
    char url[64];
    int s = raw_inbox(url, sizeof url);
    cps__tp *tx;
    assert_int_equal(cps__tp_create(KEY, &tx), 0);
    assert_int_equal(cps__tp_peer_set(tx, 7, url), 0);

    for (int round = 0; round < 5; round++) {
        /* round 0: in order, in two fills with bytes written between and after them; 1: the
         * second fill before the first (out of order); 2: another buffer's fill in between;
         * 3: as 0, sent shorter than reserved (the buffer is cut in place, the MAC finished at
         * the shorter length); 4: as 3, the buffer moved by the cut (an older nanomsg). */
        size_t slen = round >= 3 ? HEAD + N : LEN;
        unsigned char *m = cps__tp_reserve(tx, 7, LEN), *other = NULL;
        assert_non_null(m);
        for (size_t i = 0; i < LEN; i++)
            want[i] = (unsigned char)(i * 7u + (unsigned)round);
        memcpy(want + HEAD, src, 1000);
        memcpy(want + HEAD + 1000 + GAP, src + 1000 + GAP, N - 1000 - GAP);
        memcpy(m, want, HEAD);
        if (round == 1)
            assert_int_equal(
                cps__tp_fill(tx, m, HEAD + 1000 + GAP, src + 1000 + GAP, N - 1000 - GAP), 0);
        assert_int_equal(cps__tp_fill(tx, m, HEAD, src, 1000), 0);
        if (round == 2) {
            other = cps__tp_reserve(tx, 7, LEN);
            memcpy(other, want, HEAD);
            assert_int_equal(cps__tp_fill(tx, other, HEAD, src, N), 0);
        }
        memcpy(m + HEAD + 1000, want + HEAD + 1000, GAP);
        if (round != 1)
            assert_int_equal(
                cps__tp_fill(tx, m, HEAD + 1000 + GAP, src + 1000 + GAP, N - 1000 - GAP), 0);
        memcpy(m + HEAD + N, want + HEAD + N, LEN - HEAD - N);
        /* Beyond the reservation: refused, nothing copied. */
        assert_int_equal(cps__tp_fill(tx, m, LEN - 10, src, 11), CPS_EINVAL);
        assert_int_equal(cps__tp_fill(tx, src, 0, src, 1), CPS_EINVAL);

        uint64_t between = send_between(tx, s);
        realloc_move = round == 4;
        assert_int_equal(cps__tp_send(tx, 7, m, slen), 0);
        assert_int_equal(realloc_moved, round == 4);
        unsigned char *got;
        size_t n = raw_recv(s, tx, &got);
        assert_int_equal(n, slen + CPS_AUTH_TRAILER);
        assert_memory_equal(got, want, slen);
        /* MACed at the fill (counter before the message between), or whole at send (after). */
        if (round == 0 || round >= 3)
            assert_true(counter_of(got, n) < between);
        else
            assert_true(counter_of(got, n) > between);
        cps__auth *rx;
        assert_int_equal(cps__auth_create(KEY, &rx), 0);
        assert_int_equal(open_copy(rx, got, n), CPS_AUTH_OK);
        cps__auth_destroy(rx);
        for (size_t at = 0; (round == 0 || round == 4) && at < n;
             at += at < 200 || at > n - 200 ? 1 : 613) {
            assert_int_equal(cps__auth_create(KEY, &rx), 0);
            got[at] ^= 0x04;
            if (open_copy(rx, got, n) == CPS_AUTH_OK)
                fail_msg("a flipped byte at %zu of %zu was taken", at, n);
            got[at] ^= 0x04;
            cps__auth_destroy(rx);
        }
        nn_freemsg(got);
        if (other) {
            /* The buffer whose fill overtook: MACed as it was filled, taken too. */
            memcpy(other + HEAD + N, want + HEAD + N, LEN - HEAD - N);
            assert_int_equal(cps__tp_send(tx, 7, other, LEN), 0);
            n = raw_recv(s, tx, &got);
            assert_int_equal(n, LEN + CPS_AUTH_TRAILER);
            assert_int_equal(cps__auth_create(KEY, &rx), 0);
            assert_int_equal(open_copy(rx, got, n), CPS_AUTH_OK);
            assert_memory_equal(got + HEAD, src, N);
            cps__auth_destroy(rx);
            nn_freemsg(got);
        }
    }

    /* With frames (CHAINPS_FRAME_KB): a plain copy, as each frame is sealed as it is copied
     * when sent; no counter goes to the fill (the message sent between is the first). */
    setenv("CHAINPS_FRAME_KB", "16", 1);
    cps__tp *ftx;
    assert_int_equal(cps__tp_create(KEY, &ftx), 0);
    unsetenv("CHAINPS_FRAME_KB");
    assert_int_equal(cps__tp_peer_set(ftx, 7, url), 0);
    unsigned char *fm = cps__tp_reserve(ftx, 7, LEN);
    assert_non_null(fm);
    memset(fm, 'f', LEN);
    assert_int_equal(cps__tp_fill(ftx, fm, HEAD, src, N), 0);
    assert_int_equal(send_between(ftx, s), 1);
    assert_int_equal(cps__tp_send(ftx, 7, fm, LEN), 0);
    size_t off = 0;
    while (off < LEN) {
        unsigned char *fr;
        size_t n = raw_recv(s, ftx, &fr);
        assert_true(n > CPS_FRAME_HDR + CPS_AUTH_TRAILER);
        cps__auth *rx;
        assert_int_equal(cps__auth_create(KEY, &rx), 0);
        assert_int_equal(open_copy(rx, fr, n), CPS_AUTH_OK);
        cps__auth_destroy(rx);
        size_t part = n - CPS_FRAME_HDR - CPS_AUTH_TRAILER;
        assert_true(off + part <= LEN);
        for (size_t i = 0; i < part; i++)
            assert_int_equal(fr[CPS_FRAME_HDR + i],
                             off + i < HEAD || off + i >= HEAD + N ? 'f' : src[off + i - HEAD]);
        off += part;
        nn_freemsg(fr);
    }
    cps__tp_destroy(ftx);

    /* Without a key: a plain copy, the trailer zeroed. */
    cps__tp *open_tp;
    assert_int_equal(cps__tp_create(NULL, &open_tp), 0);
    assert_int_equal(cps__tp_peer_set(open_tp, 7, url), 0);
    unsigned char *m = cps__tp_reserve(open_tp, 7, LEN);
    assert_non_null(m);
    memset(m, 'h', LEN);
    assert_int_equal(cps__tp_fill(open_tp, m, HEAD, src, N), 0);
    assert_int_equal(cps__tp_send(open_tp, 7, m, LEN), 0);
    unsigned char *got;
    size_t n = raw_recv(s, open_tp, &got);
    assert_int_equal(n, LEN + CPS_AUTH_TRAILER);
    assert_memory_equal(got + HEAD, src, N);
    for (size_t i = 0; i < CPS_AUTH_TRAILER; i++)
        assert_int_equal(got[LEN + i], 0);
    nn_freemsg(got);

    cps__tp_destroy(open_tp);
    cps__tp_destroy(tx);
    nn_close(s);
    free(src), free(want);
}
