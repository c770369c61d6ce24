/* unit.transport_auth: through real sockets on 127.0.0.1: ours delivered, the rest dropped;
 * forwarded buffers resealed; an old peer logged as such. */
#include "fixture.h"

void sockets_deliver_ours_drop_the_rest(void **state)
{
    (void)state;
    cps__tp *rcv, *good, *bad, *open_tp;
    uint16_t port = 0;
    assert_int_equal(cps__tp_create(KEY, &rcv), 0);
    assert_int_equal(cps__tp_bind(rcv, HOST, 0, &port), 0);
    char url[64];
    snprintf(url, sizeof url, "tcp://" HOST ":%u", port);
    assert_int_equal(cps__tp_create(KEY, &good), 0);
    assert_int_equal(cps__tp_create(OTHER, &bad), 0);
    assert_int_equal(cps__tp_create(NULL, &open_tp), 0);
    cps__tp *senders[] = {bad, open_tp, good};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(cps__tp_peer_set(senders[i], 1, url), 0);
        unsigned char *m = cps__tp_alloc(BODY);
        memset(m, 'a' + i, BODY);
        assert_int_equal(cps__tp_send(senders[i], 1, m, BODY), 0);
    }
    inbox ib = {0};
    uint64_t end = now_ms() + WAIT_MS;
    while ((ib.n < 1 || cps__tp_auth_dropped(rcv) < 2) && now_ms() < end) {
        for (int i = 0; i < 3; i++)
            cps__tp_poll(senders[i], 0, NULL, NULL, 0);
        cps__tp_poll(rcv, 10, keep, &ib, 0);
    }
    pump(NULL, rcv, &ib, 2, 200); /* nothing more may come */
    assert_int_equal(ib.n, 1);
    assert_int_equal(ib.last_len, BODY);
    assert_int_equal(ib.last[0], 'c');
    assert_int_equal(cps__tp_auth_dropped(rcv), 2);

    /* A captured message replayed byte for byte, through a plain nanomsg socket: the first
     * copy is taken, the replay is dropped and counted. */
    cps__auth *seal;
    assert_int_equal(cps__auth_create(KEY, &seal), 0);
    unsigned char wire[BODY + CPS_AUTH_TRAILER];
    memset(wire, 'r', BODY);
    cps__auth_seal(seal, wire, BODY);
    int raw = nn_socket(AF_SP, NN_PUSH);
    assert_true(raw >= 0);
    assert_true(nn_connect(raw, url) >= 0);
    for (int copy = 0; copy < 2; copy++)
        assert_int_equal(nn_send(raw, wire, sizeof wire, 0), (int)sizeof wire);
    pump(NULL, rcv, &ib, 2, WAIT_MS);
    end = now_ms() + WAIT_MS;
    while (cps__tp_auth_dropped(rcv) < 3 && now_ms() < end)
        cps__tp_poll(rcv, 10, keep, &ib, 0);
    assert_int_equal(ib.n, 2);
    assert_int_equal(ib.last[0], 'r');
    assert_int_equal(cps__tp_auth_dropped(rcv), 3);
    nn_close(raw);
    cps__auth_destroy(seal);

    for (int i = 0; i < 3; i++)
        cps__tp_destroy(senders[i]);
    cps__tp_destroy(rcv);
}

/* Keeps the one buffer delivered, to send it on as it is. */
typedef struct hold {
    void *buf;
    size_t len;
} hold;

static void take(void *ctx, void *buf, size_t len)
{
    hold *h = ctx;
    h->buf = buf;
    h->len = len;
}

/* A message received and sent on as it is (a server forwarding a buffer) is sealed afresh by
 * the sender: the trailer after `len` bytes belongs to the transport. */
void forwarded_buffer_is_resealed(void **state)
{
    (void)state;
    cps__tp *a, *b, *c;
    uint16_t pb = 0, pc = 0;
    assert_int_equal(cps__tp_create(KEY, &a), 0);
    assert_int_equal(cps__tp_create(KEY, &b), 0);
    assert_int_equal(cps__tp_create(KEY, &c), 0);
    assert_int_equal(cps__tp_bind(b, HOST, 0, &pb), 0);
    assert_int_equal(cps__tp_bind(c, HOST, 0, &pc), 0);
    char ub[64], uc[64];
    snprintf(ub, sizeof ub, "tcp://" HOST ":%u", pb);
    snprintf(uc, sizeof uc, "tcp://" HOST ":%u", pc);
    assert_int_equal(cps__tp_peer_set(a, 2, ub), 0);
    assert_int_equal(cps__tp_peer_set(b, 3, uc), 0);

    unsigned char *m = cps__tp_alloc(BODY);
    memset(m, 'f', BODY);
    assert_int_equal(cps__tp_send(a, 2, m, BODY), 0);
    hold got = {0};
    uint64_t end = now_ms() + WAIT_MS;
    while (!got.buf && now_ms() < end) {
        cps__tp_poll(a, 0, NULL, NULL, 0);
        cps__tp_poll(b, 10, take, &got, 1);
    }
    assert_non_null(got.buf);
    assert_int_equal(got.len, BODY);
    assert_int_equal(cps__tp_send(b, 3, got.buf, got.len), 0);
    inbox ic = {0};
    pump(b, c, &ic, 1, WAIT_MS);
    assert_int_equal(ic.n, 1);
    assert_int_equal(ic.last[BODY - 1], 'f');
    assert_int_equal(cps__tp_auth_dropped(c), 0);
    cps__tp_destroy(a);
    cps__tp_destroy(b);
    cps__tp_destroy(c);
}

/* Captures the last WARN line logged. */
static void last_warning(void *ctx, int level, const char *subsystem, const char *line)
{
    (void)subsystem;
    if (level == CPS_LOG_WARN)
        snprintf(ctx, 512, "%s", line);
}

/* A process of wire version 3 (GMAC) sending to this one through a socket: its message is
 * dropped, and the log line says a process of another version sent it, with both versions. */
void old_version_peer_is_logged_as_such(void **state)
{
    (void)state;
    cps__tp *rcv;
    uint16_t port = 0;
    assert_int_equal(cps__tp_create(KEY, &rcv), 0);
    assert_int_equal(cps__tp_bind(rcv, HOST, 0, &port), 0);
    char url[64], line[512] = "";
    snprintf(url, sizeof url, "tcp://" HOST ":%u", port);
    unsigned char wire[BODY + CPS_AUTH_TRAILER];
    memset(wire, 'o', BODY);
    header(wire, 3);
    seal_v3(wire, BODY, KEY, 1);
    cps__log_set_level(CPS_LOG_WARN);
    cps__log_set_sink(last_warning, line);
    int raw = nn_socket(AF_SP, NN_PUSH);
    assert_true(raw >= 0);
    assert_true(nn_connect(raw, url) >= 0);
    assert_int_equal(nn_send(raw, wire, sizeof wire, 0), (int)sizeof wire);
    inbox ib = {0};
    uint64_t end = now_ms() + WAIT_MS;
    while (cps__tp_auth_dropped(rcv) < 1 && now_ms() < end)
        cps__tp_poll(rcv, 10, keep, &ib, 0);
    cps__log_set_sink(NULL, NULL);
    cps__log_set_level(CPS_LOG_ERROR);
    assert_int_equal(ib.n, 0);
    assert_int_equal(cps__tp_auth_dropped(rcv), 1);
    assert_non_null(strstr(line, "another version of chainps"));
    char want[64];
    snprintf(want, sizeof want, "wire version 3 (ours %d)", CPS_WIRE_VERSION);
    assert_non_null(strstr(line, want));
    nn_close(raw);
    cps__tp_destroy(rcv);
}
