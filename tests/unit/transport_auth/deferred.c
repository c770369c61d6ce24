/* unit.transport_auth: a deferred check riding on the receiver's own copy. */
#include "fixture.h"

/* ---- checks made during the receiver's copy (cps__tp_defer_check) ---- */
enum { DEFER_COPY, DEFER_DECLINE, DEFER_COPY_NO_TAKE, DEFER_PAST_END };

typedef struct defer_rx {
    int mode;
    int calls;   /* the pending callback ran */
    int open_rc; /* what open_copy answered */
    int taken;   /* taken by the callback, whole and checked */
    size_t taken_len;
    unsigned char dst[BODY];
    inbox plain; /* what reached the ordinary callback */
} defer_rx;

static void on_pending(void *ctx, cps__tp_pending *m)
{
    defer_rx *d = ctx;
    d->calls++;
    size_t len;
    const unsigned char *b = cps__tp_pending_peek(m, &len);
    assert_int_equal(len, BODY);
    assert_int_equal(b[5], CPS_MSG_VALUES); /* only the declared type comes here */
    if (d->mode == DEFER_DECLINE)
        return;
    if (d->mode == DEFER_PAST_END) {
        d->open_rc = cps__tp_pending_open_copy(m, 64, d->dst, BODY - 63);
        return; /* CPS_EINVAL, nothing checked: declined, the transport checks it */
    }
    d->open_rc = cps__tp_pending_open_copy(m, 64, d->dst, BODY - 64);
    if (d->open_rc != 0 || d->mode == DEFER_COPY_NO_TAKE)
        return;
    void *buf;
    assert_int_equal(cps__tp_pending_take(m, &buf, &d->taken_len), 0);
    d->taken++;
    cps__tp_free(buf);
}

/* A VALUES-typed message of BODY bytes (64-byte header, then 'v' bytes), sealed with `key`,
 * with byte `flip` changed after sealing (BODY: none), sent on raw socket s. */
static void send_typed(int s, cps__auth *seal, uint8_t type, size_t flip)
{
    unsigned char m[BODY + CPS_AUTH_TRAILER];
    cps__msg_hdr h = {.type = type,
                      .flags = CPS_WF_REPLY,
                      .payload_len = BODY - 64,
                      .raw_len = BODY - 64,
                      .step = 7};
    cps__wire_hdr_encode(m, &h);
    memset(m + 64, 'v', BODY - 64);
    cps__auth_seal(seal, m, BODY);
    if (flip < BODY)
        m[flip] ^= 1;
    assert_int_equal(nn_send(s, m, sizeof m, 0), (int)sizeof m);
}

/* Wait until rcv delivered or refused `want` messages in all. */
static void defer_pump(cps__tp *rcv, defer_rx *d, uint64_t dropped0, int want)
{
    uint64_t end = now_ms() + WAIT_MS;
    while ((uint64_t)d->plain.n + d->taken + (cps__tp_auth_dropped(rcv) - dropped0) <
               (uint64_t)want &&
           now_ms() < end)
        cps__tp_poll(rcv, 10, keep, &d->plain, 0);
}

/* A declared type reaches the pending callback unchecked, and its bytes come out only checked:
 * checked during the callback's copy (a true message's copy is exact and it is taken whole; a
 * byte changed in the values or in the header after sealing, or a replay, is refused there,
 * counted, and reaches no one), or, when the callback declines (does nothing, or copies past the
 * end), checked by the transport and delivered to the ordinary callback. A message checked
 * during the copy and not taken is delivered without a second check (which would refuse it as
 * a replay). Other types never reach the pending callback. */
void deferred_check_rides_on_the_copy(void **state)
{
    (void)state;
    cps__tp *rcv;
    uint16_t port = 0;
    assert_int_equal(cps__tp_create(KEY, &rcv), 0);
    assert_int_equal(cps__tp_bind(rcv, HOST, 0, &port), 0);
    char url[64];
    snprintf(url, sizeof url, "tcp://" HOST ":%u", port);
    defer_rx d = {0};
    cps__tp_defer_check(rcv, CPS_MSG_VALUES, on_pending, &d);
    cps__auth *seal, *other;
    assert_int_equal(cps__auth_create(KEY, &seal), 0);
    assert_int_equal(cps__auth_create(OTHER, &other), 0);
    int s = nn_socket(AF_SP, NN_PUSH);
    assert_true(s >= 0);
    assert_true(nn_connect(s, url) >= 0);
    unsigned char want[BODY - 64];
    memset(want, 'v', sizeof want);

    /* True: copied exactly, taken, nothing for the ordinary callback. */
    send_typed(s, seal, CPS_MSG_VALUES, BODY);
    defer_pump(rcv, &d, 0, 1);
    assert_int_equal(d.calls, 1);
    assert_int_equal(d.open_rc, 0);
    assert_int_equal(d.taken, 1);
    assert_int_equal(d.taken_len, BODY);
    assert_memory_equal(d.dst, want, sizeof want);
    assert_int_equal(d.plain.n, 0);
    assert_int_equal(cps__tp_auth_dropped(rcv), 0);

    /* Changed after sealing: a value, a header byte (the step), or sealed under another key. */
    size_t flips[] = {64 + 17, 41, BODY};
    for (int i = 0; i < 3; i++) {
        uint64_t dropped = cps__tp_auth_dropped(rcv);
        send_typed(s, i == 2 ? other : seal, CPS_MSG_VALUES, flips[i]);
        defer_pump(rcv, &d, dropped, d.taken + d.plain.n + 1);
        assert_int_equal(d.calls, 2 + i);
        assert_int_equal(d.open_rc, CPS_EPROTO);
        assert_int_equal(cps__tp_auth_dropped(rcv), dropped + 1);
        assert_int_equal(d.taken, 1);
        assert_int_equal(d.plain.n, 0);
    }

    /* Declined: checked by the transport, delivered to the ordinary callback; a forgery
     * declined is refused all the same. */
    d.mode = DEFER_DECLINE;
    send_typed(s, seal, CPS_MSG_VALUES, BODY);
    defer_pump(rcv, &d, 3, 2);
    assert_int_equal(d.plain.n, 1);
    assert_int_equal(d.plain.last_len, BODY);
    send_typed(s, seal, CPS_MSG_VALUES, 64 + 3);
    defer_pump(rcv, &d, 3, 3);
    assert_int_equal(cps__tp_auth_dropped(rcv), 4);
    assert_int_equal(d.plain.n, 1);
    d.mode = DEFER_PAST_END;
    send_typed(s, seal, CPS_MSG_VALUES, BODY);
    defer_pump(rcv, &d, 4, 3);
    assert_int_equal(d.open_rc, CPS_EINVAL);
    assert_int_equal(d.plain.n, 2);
    assert_int_equal(cps__tp_auth_dropped(rcv), 4);

    /* Checked during the copy, not taken: delivered, not refused as its own replay. */
    d.mode = DEFER_COPY_NO_TAKE;
    send_typed(s, seal, CPS_MSG_VALUES, BODY);
    defer_pump(rcv, &d, 4, 4);
    assert_int_equal(d.open_rc, 0);
    assert_int_equal(d.plain.n, 3);
    assert_int_equal(cps__tp_auth_dropped(rcv), 4);

    /* A replay of a true message is refused during the copy. */
    d.mode = DEFER_COPY;
    unsigned char m[BODY + CPS_AUTH_TRAILER];
    cps__msg_hdr h = {.type = CPS_MSG_VALUES, .payload_len = BODY - 64, .raw_len = BODY - 64};
    cps__wire_hdr_encode(m, &h);
    memset(m + 64, 'v', BODY - 64);
    cps__auth_seal(seal, m, BODY);
    for (int copy = 0; copy < 2; copy++)
        assert_int_equal(nn_send(s, m, sizeof m, 0), (int)sizeof m);
    defer_pump(rcv, &d, 4, 5);
    assert_int_equal(d.taken, 2);
    assert_int_equal(d.open_rc, CPS_EPROTO);
    assert_int_equal(cps__tp_auth_dropped(rcv), 5);

    /* Another type is checked first and goes to the ordinary callback. */
    int calls = d.calls;
    send_typed(s, seal, CPS_MSG_ACK, BODY);
    defer_pump(rcv, &d, 5, 6);
    assert_int_equal(d.calls, calls);
    assert_int_equal(d.plain.n, 4);
    /* Undeclared: VALUES goes the ordinary way too. */
    cps__tp_defer_check(rcv, 0, NULL, NULL);
    send_typed(s, seal, CPS_MSG_VALUES, BODY);
    defer_pump(rcv, &d, 5, 7);
    assert_int_equal(d.calls, calls);
    assert_int_equal(d.plain.n, 5);

    nn_close(s);
    cps__auth_destroy(seal);
    cps__auth_destroy(other);
    cps__tp_destroy(rcv);
}
