/* Framed messages (transport/frame.h): the frame decoder's checks, large authenticated messages
 * between two transports over tcp:// as frames, and a forged frame in the middle of a large
 * message: refused, and nothing of that message delivered. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <nanomsg/nn.h>
#include <nanomsg/pipeline.h>

#include "chainps/error.h"
#include "core/log.h"
#include "core/wire.h"
#include "transport/auth.h"
#include "transport/frame.h"
#include "transport/transport.h"
#include "transport_test.h"

static const unsigned char KEY[32] = "chainps frame unit test key ....";

#define HOST     "127.0.0.1"
#define WAIT_MS  5000
#define FRAME_KB 64

typedef struct got {
    size_t n;
    void *last;
    size_t last_len;
} got;

static void keep_fn(void *ctx, void *buf, size_t len)
{
    got *g = ctx;
    g->n++;
    cps__tp_free(g->last);
    g->last = buf;
    g->last_len = len;
}

static void fill(unsigned char *b, size_t len, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < len; i++) {
        x = x * 1664525u + 1013904223u;
        b[i] = (unsigned char)(x >> 24);
    }
}

static int same(const void *buf, size_t len, uint32_t seed)
{
    unsigned char *ref = malloc(len);
    fill(ref, len, seed);
    int eq = memcmp(buf, ref, len) == 0;
    free(ref);
    return eq;
}

static void decode_checks(void **state)
{
    (void)state;
    unsigned char f[CPS_FRAME_HDR + 8] = {0};
    cps__frame fr;
    cps__frame_encode_hdr(f, 7, 100, 92);
    assert_true(cps__frame_is(f, sizeof f));
    assert_int_equal(cps__frame_decode(f, sizeof f, &fr), 0);
    assert_int_equal(fr.msg_id, 7);
    assert_int_equal(fr.total, 100);
    assert_int_equal(fr.offset, 92);
    assert_int_equal(fr.len, 8);
    assert_ptr_equal(fr.data, f + CPS_FRAME_HDR);
    /* past the end of the message */
    cps__frame_encode_hdr(f, 7, 99, 92);
    assert_int_equal(cps__frame_decode(f, sizeof f, &fr), CPS_EPROTO);
    /* offset at the end, id 0, too large a message, no data */
    cps__frame_encode_hdr(f, 7, 100, 100);
    assert_int_equal(cps__frame_decode(f, sizeof f, &fr), CPS_EPROTO);
    cps__frame_encode_hdr(f, 0, 100, 0);
    assert_int_equal(cps__frame_decode(f, sizeof f, &fr), CPS_EPROTO);
    cps__frame_encode_hdr(f, 1, (uint64_t)CPS_WIRE_HDR_SIZE + CPS_WIRE_MAX_PAYLOAD + 1, 0);
    assert_int_equal(cps__frame_decode(f, sizeof f, &fr), CPS_EPROTO);
    cps__frame_encode_hdr(f, 1, 100, 0);
    assert_int_equal(cps__frame_decode(f, CPS_FRAME_HDR, &fr), CPS_EPROTO);
    /* offset + len overflowing 64 bits */
    cps__frame_encode_hdr(f, 1, 100, UINT64_MAX - 2);
    assert_int_equal(cps__frame_decode(f, sizeof f, &fr), CPS_EPROTO);
    /* another version, a padding byte set */
    cps__frame_encode_hdr(f, 1, 100, 0);
    f[4]++;
    assert_int_equal(cps__frame_decode(f, sizeof f, &fr), CPS_EPROTO);
    cps__frame_encode_hdr(f, 1, 100, 0);
    f[6] = 1;
    assert_int_equal(cps__frame_decode(f, sizeof f, &fr), CPS_EPROTO);
    /* a wire header is never a frame */
    unsigned char h[CPS_WIRE_HDR_SIZE] = {0};
    cps__le32_put(h, CPS_WIRE_MAGIC);
    assert_false(cps__frame_is(h, sizeof h));
}

static cps__tp *bound(uint16_t *port)
{
    cps__tp *tp = NULL;
    assert_int_equal(cps__tp_create(KEY, &tp), 0);
    assert_int_equal(cps__tp_set_runtime_dir(tp, NULL), 0);
    assert_int_equal(cps__tp_bind(tp, HOST, 0, port), 0);
    return tp;
}

static void wait_for(cps__tp *snd, cps__tp *rcv, got *g, size_t want)
{
    int64_t deadline = now_ms() + WAIT_MS;
    while (g->n < want && now_ms() < deadline) {
        if (snd)
            assert_true(cps__tp_poll(snd, 0, NULL, NULL, 0) >= 0);
        assert_true(cps__tp_poll(rcv, 10, keep_fn, g, 0) >= 0);
    }
}

/* Messages above the frame size arrive whole and intact (as frames); one at it goes as before. */
static void large_messages_whole(void **state)
{
    (void)state;
    uint16_t pa, pb;
    cps__tp *a = bound(&pa), *b = bound(&pb);
    char url[64];
    snprintf(url, sizeof url, "tcp://" HOST ":%u", (unsigned)pb);
    assert_int_equal(cps__tp_peer_set(a, 2, url), 0);
    const size_t lens[] = {(FRAME_KB << 10), (FRAME_KB << 10) + 1, (1u << 20) + 17, 5u << 20};
    got g = {0};
    for (size_t i = 0; i < 4; i++) {
        unsigned char *m = cps__tp_alloc(lens[i]);
        fill(m, lens[i], (uint32_t)i);
        assert_int_equal(cps__tp_send(a, 2, m, lens[i]), 0);
        wait_for(a, b, &g, i + 1);
        assert_int_equal(g.n, i + 1);
        assert_int_equal(g.last_len, lens[i]);
        assert_true(same(g.last, lens[i], (uint32_t)i));
    }
    assert_int_equal(cps__tp_auth_dropped(b), 0);
    cps__tp_free(g.last);
    cps__tp_destroy(a);
    cps__tp_destroy(b);
}

/* Frames of one message, sealed by `auth`, as the transport sends them. */
static unsigned char **make_frames(cps__auth *auth, uint64_t id, const unsigned char *msg,
                                   size_t len, size_t fs, size_t *nframes, size_t **flens)
{
    size_t n = (len + fs - 1) / fs;
    unsigned char **f = calloc(n, sizeof *f);
    *flens = calloc(n, sizeof **flens);
    for (size_t k = 0; k < n; k++) {
        size_t off = k * fs, clen = len - off < fs ? len - off : fs;
        f[k] = malloc(CPS_FRAME_HDR + clen + CPS_AUTH_TRAILER);
        cps__frame_encode_hdr(f[k], id, len, off);
        memcpy(f[k] + CPS_FRAME_HDR, msg + off, clen);
        cps__auth_seal(auth, f[k], CPS_FRAME_HDR + clen);
        (*flens)[k] = CPS_FRAME_HDR + clen + CPS_AUTH_TRAILER;
    }
    *nframes = n;
    return f;
}

static void raw_send(int sock, const void *buf, size_t len)
{
    assert_int_equal(nn_send(sock, buf, len, 0), (int)len);
}

/* A forged frame in place of the middle one of a large authenticated message: the forgery is
 * refused by its MAC, the genuine frames after it no longer continue the message, and nothing of
 * it reaches the receiver's callback. The same sender's next message arrives whole. A forged
 * frame slipped in between two genuine ones (not replacing one, even one longer than the genuine
 * frame at its offset) is refused and the message still arrives whole and exact, since no frame
 * of it is missing. */
static void forged_middle_frame(void **state)
{
    (void)state;
    uint16_t pb;
    cps__tp *b = bound(&pb);
    char url[64];
    snprintf(url, sizeof url, "tcp://" HOST ":%u", (unsigned)pb);
    int raw = nn_socket(AF_SP, NN_PUSH);
    assert_true(raw >= 0);
    int big = 64 << 20;
    assert_true(nn_setsockopt(raw, NN_SOL_SOCKET, NN_SNDBUF, &big, sizeof big) >= 0);
    assert_true(nn_connect(raw, url) >= 0);
    cps__auth *auth;
    assert_int_equal(cps__auth_create(KEY, &auth), 0);

    const size_t len = (1u << 20) + 100, fs = 128u << 10;
    unsigned char *msg = malloc(len);
    fill(msg, len, 42);
    cps__le32_put(msg, CPS_WIRE_MAGIC);
    msg[4] = CPS_WIRE_VERSION;
    size_t n, *fl;
    unsigned char **f = make_frames(auth, 1, msg, len, fs, &n, &fl);
    assert_true(n >= 8);
    /* Frame 4 replaced: same header, one byte of its data changed after sealing. */
    f[4][CPS_FRAME_HDR + 10] ^= 1;
    for (size_t k = 0; k < n; k++)
        raw_send(raw, f[k], fl[k]);
    got g = {0};
    int64_t deadline = now_ms() + WAIT_MS;
    while (cps__tp_auth_dropped(b) < 2 && now_ms() < deadline)
        assert_true(cps__tp_poll(b, 10, keep_fn, &g, 0) >= 0);
    /* Drain whatever else arrived: the frames after the gap are dropped too. */
    for (int i = 0; i < 20; i++)
        assert_true(cps__tp_poll(b, 10, keep_fn, &g, 0) >= 0);
    assert_int_equal(g.n, 0);
    /* the forgery; the frame after the gap, and the message dropped whole with it; each later
     * frame of it (no message in progress) */
    assert_int_equal(cps__tp_auth_dropped(b), 1 + 2 + (n - 6));
    for (size_t k = 0; k < n; k++)
        free(f[k]);
    free(f);
    free(fl);

    /* The next message of that sender, with a forged frame slipped in (not replacing any). */
    f = make_frames(auth, 2, msg, len, fs, &n, &fl);
    unsigned char *extra = malloc(fl[3]);
    memcpy(extra, f[3], fl[3]);
    extra[CPS_FRAME_HDR] ^= 0x80;
    uint64_t dropped = cps__tp_auth_dropped(b);
    for (size_t k = 0; k < n; k++) {
        raw_send(raw, f[k], fl[k]);
        if (k == 2)
            raw_send(raw, extra, fl[3]);
    }
    wait_for(NULL, b, &g, 1);
    assert_int_equal(g.n, 1);
    assert_int_equal(g.last_len, len);
    assert_memory_equal(g.last, msg, len);
    assert_int_equal(cps__tp_auth_dropped(b), dropped + 1);
    for (size_t k = 0; k < n; k++)
        free(f[k]);
    free(f);
    free(fl);
    free(extra);

    /* A replayed frame (a genuine one sent twice) is refused by the replay window; the message
     * arrives once. */
    f = make_frames(auth, 3, msg, len, fs, &n, &fl);
    for (size_t k = 0; k < n; k++) {
        raw_send(raw, f[k], fl[k]);
        if (k == 1)
            raw_send(raw, f[k], fl[k]);
    }
    wait_for(NULL, b, &g, 2);
    assert_int_equal(g.n, 2);
    assert_memory_equal(g.last, msg, len);
    for (int i = 0; i < 10; i++)
        assert_true(cps__tp_poll(b, 5, keep_fn, &g, 0) >= 0);
    assert_int_equal(g.n, 2);
    for (size_t k = 0; k < n; k++)
        free(f[k]);
    free(f);
    free(fl);

    /* The first frame forged: no message starts, and each later frame of it is dropped. */
    f = make_frames(auth, 4, msg, len, fs, &n, &fl);
    f[0][CPS_FRAME_HDR + 1] ^= 4;
    dropped = cps__tp_auth_dropped(b);
    for (size_t k = 0; k < n; k++)
        raw_send(raw, f[k], fl[k]);
    deadline = now_ms() + WAIT_MS;
    while (cps__tp_auth_dropped(b) < dropped + n && now_ms() < deadline)
        assert_true(cps__tp_poll(b, 10, keep_fn, &g, 0) >= 0);
    assert_int_equal(cps__tp_auth_dropped(b), dropped + n);
    assert_int_equal(g.n, 2);
    for (size_t k = 0; k < n; k++)
        free(f[k]);
    free(f);
    free(fl);

    /* A forged continuation twice as long as the genuine frame at its offset: the receiver
     * copies its bytes into the message being assembled while checking it (frame.h), past the
     * checked part, and refuses it; the genuine frames then write over every one of them, and
     * the message arrives whole and exact. */
    f = make_frames(auth, 5, msg, len, fs, &n, &fl);
    size_t dlen = fl[3] - CPS_FRAME_HDR - CPS_AUTH_TRAILER, elen = fl[3] + dlen;
    extra = malloc(elen);
    memcpy(extra, f[3], CPS_FRAME_HDR);
    memset(extra + CPS_FRAME_HDR, 0xee, 2 * dlen);
    memcpy(extra + CPS_FRAME_HDR + 2 * dlen, f[3] + CPS_FRAME_HDR + dlen, CPS_AUTH_TRAILER);
    dropped = cps__tp_auth_dropped(b);
    for (size_t k = 0; k < n; k++) {
        if (k == 3)
            raw_send(raw, extra, elen);
        raw_send(raw, f[k], fl[k]);
    }
    wait_for(NULL, b, &g, 3);
    assert_int_equal(g.n, 3);
    assert_int_equal(g.last_len, len);
    assert_memory_equal(g.last, msg, len);
    assert_int_equal(cps__tp_auth_dropped(b), dropped + 1);
    for (size_t k = 0; k < n; k++)
        free(f[k]);
    free(f);
    free(fl);
    free(extra);

    free(msg);
    cps__tp_free(g.last);
    cps__auth_destroy(auth);
    nn_close(raw);
    cps__tp_destroy(b);
}

int main(void)
{
    cps__log_set_sink(quiet_sink, NULL);
    setenv("CHAINPS_FRAME_KB", "64", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(decode_checks),
        cmocka_unit_test(large_messages_whole),
        cmocka_unit_test(forged_middle_frame),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
