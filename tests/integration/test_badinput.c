/* Hostile and broken input against a running scheduler and server: raw TCP garbage, messages
 * with a bad magic, truncated messages, a header whose payload length lies, a push with a corrupt
 * snappy payload, pushes for an unknown key or with the wrong length, and messages from a node
 * id nobody knows. Each is logged and dropped (with an ERROR reply where the sender is known),
 * the processes keep running, and a real worker's parameters are untouched.
 *
 * The test plays two workers: a real cps_client (through the public API), and an "intruder" that
 * joins with its own transport and HELLO so that the server knows its address and can answer
 * it. Also checks `chainps status` and the CLI's --help / bad-flag behaviour. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "chainps/chainps.h"
#include "core/gradcodec.h"
#include "core/view.h"
#include "core/wire.h"
#include "cluster.h"
#include "node/msg.h"
#include "transport/transport.h"

#define WAIT_MS 20000
#define KEY     4242u
#define KLEN    8u

/* Replies the intruder received. */
typedef struct got {
    int n;
    struct {
        uint8_t type;
        int32_t status;
        uint64_t seq;
    } m[64];
    int welcome;
    uint32_t id;
    cps__view view;
} got;

typedef struct intruder {
    cps__tp *tp;
    uint16_t port;
    char url[64];
    got g;
    uint32_t server_id;
    uint64_t epoch;
} intruder;

static h_cluster C;
static intruder I;

static void on_msg(void *ctx, void *buf, size_t len)
{
    got *g = ctx;
    cps__rx rx;
    if (cps__rx_parse(&rx, buf, len) != 0)
        return;
    if (rx.hdr.type == CPS_MSG_WELCOME && rx.hdr.sender == 0 && !g->welcome) {
        if (cps__view_decode(rx.payload, rx.len, &g->view) == 0) {
            g->id = rx.hdr.req_worker;
            g->welcome = 1;
        }
    } else if (g->n < 64) {
        g->m[g->n].type = rx.hdr.type;
        g->m[g->n].status = rx.hdr.status;
        g->m[g->n].seq = rx.hdr.req_seq;
        g->n++;
    }
    cps__rx_free(&rx);
}

static void pump(int ms)
{
    cps__tp_poll(I.tp, ms, on_msg, &I.g, 0);
}

/* Wait for the reply to request `seq`: its type, and its status through *status. The reply is
 * taken from the list, so a number refused and then used again waits for its next reply. */
static int wait_reply(uint64_t seq, int32_t *status)
{
    uint64_t deadline = h_now_ms() + WAIT_MS;
    while (h_now_ms() < deadline) {
        for (int i = 0; i < I.g.n; i++) {
            if (I.g.m[i].seq == seq) {
                *status = I.g.m[i].status;
                int type = I.g.m[i].type;
                memmove(&I.g.m[i], &I.g.m[i + 1], (size_t)(I.g.n - i - 1) * sizeof I.g.m[0]);
                I.g.n--;
                return type;
            }
        }
        pump(20);
    }
    return -1;
}

/* Until its pipe connects a message waits in our queue, which only cps__tp_poll flushes. */
static void drain(void)
{
    uint64_t deadline = h_now_ms() + WAIT_MS;
    while (cps__tp_queued(I.tp) > 0 && h_now_ms() < deadline)
        pump(10);
    assert_int_equal(cps__tp_queued(I.tp), 0);
}

static void send_raw(uint32_t peer, const void *bytes, size_t len)
{
    void *buf = cps__tp_alloc(len ? len : 1);
    assert_non_null(buf);
    memcpy(buf, bytes, len);
    assert_int_equal(cps__tp_send(I.tp, peer, buf, len), 0);
    pump(0);
}

/* A message with a well-formed header for `payload`. */
static void send_msg(uint32_t peer, cps__msg_hdr *h, const void *payload, size_t len)
{
    assert_int_equal(cps__msg_send(I.tp, peer, h, payload, len), 0);
    pump(0);
}

static cps__msg_hdr push_hdr(uint64_t seq)
{
    cps__msg_hdr h = {0};
    h.type = CPS_MSG_PUSH;
    h.sender = I.g.id;
    h.epoch = I.epoch;
    h.req_worker = I.g.id;
    h.req_seq = seq;
    h.step = seq;
    return h;
}

/* Push `len` zero gradients for key `key` as the intruder. */
static void push_kv(uint64_t seq, uint64_t key, uint32_t len)
{
    float vals[64] = {0};
    char payload[512];
    size_t n = cps__wire_kv_encode(payload, sizeof payload, 1, &key, &len, vals, len);
    assert_true(n > 0);
    cps__msg_hdr h = push_hdr(seq);
    send_msg(I.server_id, &h, payload, n);
}

/* Write bytes and close; the peer may reset the connection half-way, which is fine. */
static void tcp_blast(int port, const void *bytes, size_t len)
{
    int fd = h_tcp_connect(port);
    ssize_t w = send(fd, bytes, len, MSG_NOSIGNAL);
    (void)w;
    close(fd);
}

static int server_port(void)
{
    char url[128];
    assert_int_equal(h_server_url(C.servers[0], url, sizeof url, WAIT_MS), 0);
    const char *colon = strrchr(url, ':');
    assert_non_null(colon);
    return atoi(colon + 1);
}

/* Join as a second worker through our own transport (before cps_open, which blocks until every
 * worker is there). */
static void intruder_hello(void)
{
    memset(&I, 0, sizeof I);
    cps__view_init(&I.g.view);
    assert_int_equal(cps__tp_create(h_key(), &I.tp), 0);
    assert_int_equal(cps__tp_bind(I.tp, H_HOST, 0, &I.port), 0);
    snprintf(I.url, sizeof I.url, "tcp://" H_HOST ":%u", I.port);
    char sched[96];
    snprintf(sched, sizeof sched, "tcp://%s", C.sched_addr);
    assert_int_equal(cps__tp_peer_set(I.tp, 0, sched), 0);
    char payload[16 + CPS_ADDR_MAX];
    size_t n = cps__hello_encode(payload, sizeof payload, CPS_ROLE_WORKER, 1, 0, I.url);
    cps__msg_hdr h = {.type = CPS_MSG_HELLO, .sender = UINT32_MAX};
    send_msg(0, &h, payload, n);
    /* Nobody polls this transport while cps_open() blocks. */
    drain();
}

static void intruder_welcome(void)
{
    uint64_t deadline = h_now_ms() + WAIT_MS;
    while (!I.g.welcome && h_now_ms() < deadline)
        pump(20);
    assert_true(I.g.welcome);
    I.epoch = I.g.view.epoch;
    assert_int_equal(I.g.view.nranges, 1);
    I.server_id = I.g.view.ranges[0].chain[0];
    const cps__node_info *s = cps__view_node(&I.g.view, I.server_id);
    assert_non_null(s);
    assert_int_equal(cps__tp_peer_set(I.tp, I.server_id, s->addr), 0);
}

static void become_worker(void)
{
    h_become_worker(C.sched_addr, 1, 2);
    setenv("CHAINPS_RANK", "0", 1);
}

/* Both nodes still run, and the log of `pid` gained `count` more `needle` lines than `before`. */
static void expect_logged(pid_t pid, const char *needle, int before, int count)
{
    assert_true(h_wait_log(pid, needle, before + count, WAIT_MS));
    assert_true(h_alive(C.sched));
    assert_true(h_alive(C.servers[0]));
}

/* A PUT (restore) for range 0: our inbox, then the entries. */
static void send_put(uint64_t seq, const unsigned char *entries, size_t elen, uint32_t lie)
{
    unsigned char buf[1024] = {0};
    char hello[16 + CPS_ADDR_MAX];
    size_t hn = cps__hello_encode(hello, sizeof hello, CPS_ROLE_NONE, UINT32_MAX, 0, I.url);
    size_t off = (8 + hn + 7) & ~(size_t)7;
    cps__le32_put(buf, lie ? lie : (uint32_t)hn);
    memcpy(buf + 8, hello, hn);
    memcpy(buf + off, entries, elen);
    cps__msg_hdr h = {.type = CPS_MSG_PUT, .sender = UINT32_MAX, .epoch = I.epoch, .req_seq = seq};
    send_msg(I.server_id, &h, buf, off + elen);
}

static void bad_checkpoint_messages(pid_t srv, pid_t sch)
{
    int32_t st;
    unsigned char e[256] = {0};
    /* A slice of a key that does not exist. */
    cps__le32_put(e, 6);
    cps__le64_put(e + 8, KEY + 1);
    cps__le64_put(e + 24, 2);
    send_put(9001, e, 40, 0);
    assert_int_equal(wait_reply(9001, &st), CPS_MSG_ERROR);
    assert_int_equal(st, CPS_EPROTO);
    /* A slice past the end of an existing key (KLEN values). */
    cps__le64_put(e + 8, KEY);
    cps__le64_put(e + 16, KLEN - 1);
    send_put(9002, e, 40, 0);
    assert_int_equal(wait_reply(9002, &st), CPS_MSG_ERROR);
    /* A whole-record entry (state transfer only) does not belong in a restore. */
    memset(e, 0, sizeof e);
    cps__le32_put(e, 1);
    send_put(9003, e, 128, 0);
    assert_int_equal(wait_reply(9003, &st), CPS_MSG_ERROR);
    /* An inbox length past the message: dropped with a log line. */
    int before = h_log_count(srv, "malformed PUT dropped");
    send_put(9004, e, 16, 5000);
    expect_logged(srv, "malformed PUT dropped", before, 1);
    /* A read-view request without a readable inbox. */
    before = h_log_count(srv, "malformed checkpoint request (type 37)");
    cps__msg_hdr o = {.type = CPS_MSG_CUT_OPEN, .sender = UINT32_MAX, .aux = 5, .req_seq = 9005};
    send_msg(I.server_id, &o, "junk", 4);
    expect_logged(srv, "malformed checkpoint request (type 37)", before, 1);
    /* The registry: a description that does not parse, and a known name with another shape. */
    cps__msg_hdr r = {
        .type = CPS_MSG_REGISTER, .sender = I.g.id, .epoch = I.epoch, .req_seq = 9006};
    send_msg(0, &r, "not a description", 17);
    assert_int_equal(wait_reply(9006, &st), CPS_MSG_ERROR);
    assert_int_equal(st, CPS_ESIZE); /* shorter than any description */
    cps__tensor_desc d = {.kind = 0, .length = 99};
    d.spec.lr = 0.5f;
    snprintf(d.name, sizeof d.name, "bad/w");
    unsigned char db[512];
    size_t dn = cps__wire_tensor_desc_encode(db, sizeof db, &d);
    r.req_seq = 9007;
    send_msg(0, &r, db, dn);
    assert_int_equal(wait_reply(9007, &st), CPS_MSG_ERROR);
    assert_int_equal(st, CPS_EEXIST);
    char what[80];
    snprintf(what, sizeof what, "malformed request of type %u from a tool dropped",
             (unsigned)CPS_MSG_REGISTRY);
    before = h_log_count(sch, what);
    cps__msg_hdr g = {.type = CPS_MSG_REGISTRY, .sender = UINT32_MAX, .req_seq = 9008};
    send_msg(0, &g, "xx", 2);
    expect_logged(sch, what, before, 1);
}

/* Push a lossy block for KEY as the intruder: the keys part, then `blk` (blen bytes). */
static void push_lossy(uint64_t seq, const unsigned char *blk, size_t blen)
{
    const uint64_t key = KEY;
    const uint32_t klen = KLEN;
    unsigned char payload[256];
    size_t pre = cps__wire_kv_encode(payload, sizeof payload, 1, &key, &klen, NULL, 0);
    cps__le32_put(payload + 4, KLEN);
    memcpy(payload + pre, blk, blen);
    cps__msg_hdr h = push_hdr(seq);
    h.flags = CPS_WF_LOSSY;
    send_msg(I.server_id, &h, payload, pre + blen);
}

/* Encode g[KLEN] with `spec` (no residual carried) and push it as the intruder. */
static void push_encoded(uint64_t seq, const char *spec, const float *g)
{
    cps__gradcodec gc;
    assert_int_equal(cps__gradcodec_parse(spec, &gc), 0);
    float acc[KLEN];
    memcpy(acc, g, sizeof acc);
    unsigned char blk[8 + 8 * KLEN];
    size_t blen;
    assert_int_equal(cps__gradcodec_encode(&gc, acc, KLEN, blk, sizeof blk, &blen, NULL), 0);
    push_lossy(seq, blk, blen);
}

static void lossy_pushes(cps_client *c, pid_t srv)
{
    const uint64_t key = KEY;
    const uint32_t klen = KLEN;
    float was[KLEN], now[KLEN];
    int32_t status = 0;
    assert_int_equal(cps_raw_pull(c, &key, 1, was, &klen), 0);
    /* Malformed blocks, each refused with its error; none takes number 4. */
    unsigned char blk[8 + 8 * KLEN] = {CPS_GC_FP16, 0, 0, 0, KLEN - 1}; /* count != nvals */
    push_lossy(4, blk, 8 + 2 * (KLEN - 1));
    assert_int_equal(wait_reply(4, &status), CPS_MSG_ERROR);
    assert_int_equal(status, CPS_EPROTO);
    blk[0] = 9, blk[4] = KLEN; /* an unknown codec */
    push_lossy(4, blk, 8 + 2 * KLEN);
    assert_int_equal(wait_reply(4, &status), CPS_MSG_ERROR);
    assert_int_equal(status, CPS_EPROTO);
    blk[0] = CPS_GC_TOPK, blk[4] = 2; /* indices 0, 8: the second is out of range */
    cps__le32_put(blk + 8, 0);
    cps__le32_put(blk + 12, KLEN);
    push_lossy(4, blk, 8 + 16);
    assert_int_equal(wait_reply(4, &status), CPS_MSG_ERROR);
    assert_int_equal(status, CPS_EPROTO);
    cps__le32_put(blk + 12, 3);
    push_lossy(4, blk, 8 + 15); /* truncated */
    assert_int_equal(wait_reply(4, &status), CPS_MSG_ERROR);
    assert_int_equal(status, CPS_ESIZE);
    expect_logged(srv, "malformed lossy-compressed push", 0, 4);
    assert_int_equal(cps_raw_pull(c, &key, 1, now, &klen), 0);
    assert_memory_equal(now, was, sizeof was);
    /* Well-formed: fp16 and top-k gradients arrive as the floats they stand for (exact values
     * in both), SGD lr 0.5; each followed by its negation, so KEY ends as it was. */
    float g[KLEN] = {1, -0.5f, 0.25f, 2, 0, -1, 0.125f, 3};
    float neg[KLEN];
    for (int i = 0; i < (int)KLEN; i++)
        neg[i] = -g[i];
    push_encoded(4, "fp16", g);
    assert_int_equal(wait_reply(4, &status), CPS_MSG_ACK);
    assert_int_equal(cps_raw_pull(c, &key, 1, now, &klen), 0);
    for (int i = 0; i < (int)KLEN; i++)
        assert_true(now[i] == was[i] - 0.5f * g[i]);
    push_encoded(5, "fp16", neg);
    assert_int_equal(wait_reply(5, &status), CPS_MSG_ACK);
    push_encoded(6, "topk:0.25", g); /* k = 2: the 3 and the 2 */
    assert_int_equal(wait_reply(6, &status), CPS_MSG_ACK);
    assert_int_equal(cps_raw_pull(c, &key, 1, now, &klen), 0);
    for (int i = 0; i < (int)KLEN; i++)
        assert_true(now[i] == (i == 3 || i == 7 ? was[i] - 0.5f * g[i] : was[i]));
    push_encoded(7, "topk:0.25", neg);
    assert_int_equal(wait_reply(7, &status), CPS_MSG_ACK);
    assert_int_equal(cps_raw_pull(c, &key, 1, now, &klen), 0);
    assert_memory_equal(now, was, sizeof was);
}

/* The real worker's own lossy pushes (cps_tensor_compress) on tensor t, gradient g[100] of
 * values exact in fp16: one fp16 push, then one top-k push of g and zeros until error feedback
 * has sent all of it. Each value then arrived whole twice: w - 0.5 g - 0.5 g. */
static void worker_lossy(cps_client *c, cps_tensor *t, const float *g, const float *before)
{
    float after[100], zero[100] = {0};
    cps_client_stats s0, s1;
    assert_int_equal(cps_tensor_compress(c, t, "fp32"), CPS_EINVAL);
    assert_int_equal(cps_tensor_compress(c, t, "fp16"), 0);
    cps_client_stats_get(c, &s0);
    assert_int_equal(cps_push(c, t, g, 100), 0);
    cps_client_stats_get(c, &s1);
    /* 2 bytes a value instead of 4 (plus the same keys part and an 8-byte block header). */
    assert_true((s1.push_wire_bytes - s0.push_wire_bytes) * 10 <
                (s1.push_raw_bytes - s0.push_raw_bytes) * 6);
    assert_int_equal(cps_tensor_compress(c, t, "topk:0.1"), 0);
    assert_int_equal(cps_push(c, t, g, 100), 0);
    /* g holds 20 values each of 1, 0.75, 0.5 and 0.25 (and 20 zeros): 10 a push, largest first,
     * so 7 more pushes send the rest. Part way, the sum is not all there yet. */
    assert_int_equal(cps_pull(c, t, after, 100), 0);
    assert_true(after[99] == before[99] - 0.5f * g[99]);
    for (int k = 0; k < 7; k++)
        assert_int_equal(cps_push(c, t, zero, 100), 0);
    assert_int_equal(cps_pull(c, t, after, 100), 0);
    for (int i = 0; i < 100; i++)
        assert_true(after[i] == (before[i] - 0.5f * g[i]) - 0.5f * g[i]);
    assert_int_equal(cps_tensor_compress(c, t, "none"), 0);
}

static void test_bad_messages(void **state)
{
    (void)state;
    /* Async: the intruder's pushes must not wait for a sync aggregate with the real worker. */
    assert_int_equal(h_start_cluster(&C, 1, 2, "async"), 0);
    intruder_hello();
    become_worker();
    cps_client *c = NULL;
    assert_int_equal(cps_open(&c), 0);
    intruder_welcome();
    const pid_t srv = C.servers[0], sch = C.sched;
    const int sport = server_port();

    /* The real worker's state: a tensor it trained a little, and a raw key. */
    cps_init init = {.kind = CPS_INIT_UNIFORM, .a = -1.0f, .b = 1.0f, .seed = 3};
    cps_optim opt = cps_optim_sgd(0.5f);
    cps_tensor *t = NULL;
    float g[100], before[100], after[100];
    assert_int_equal(cps_tensor_declare(c, "bad/w", 100, &init, &opt, &t), 0);
    for (int i = 0; i < 100; i++)
        g[i] = (float)(i % 5) * 0.25f;
    for (int s = 0; s < 3; s++)
        assert_int_equal(cps_push(c, t, g, 100), 0);
    assert_int_equal(cps_pull(c, t, before, 100), 0);
    const uint64_t key = KEY;
    const uint32_t klen = KLEN;
    cps_init two = {.kind = CPS_INIT_CONSTANT, .a = 2.0f};
    float kv_before[KLEN], kv_after[KLEN];
    assert_int_equal(cps_raw_declare(c, &key, 1, &klen, &two, &opt), 0);
    assert_int_equal(cps_raw_pull(c, &key, 1, kv_before, &klen), 0);

    int bad_s = h_log_count(srv, "bad message ("), bad_c = h_log_count(sch, "bad message (");

    /* 1. Raw TCP garbage: nanomsg refuses the handshake and closes; nothing reaches the node. */
    unsigned char junk[4096];
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < sizeof junk; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        junk[i] = (unsigned char)x;
    }
    tcp_blast(sport, junk, sizeof junk);
    tcp_blast(C.port, junk, sizeof junk);
    /* A correct SP handshake with a frame length far past the receive limit. */
    h_sp_send(sport, junk, 16, 1ull << 40);
    h_sp_send(C.port, junk, 16, 1ull << 40);

    /* 2. Well-framed nanomsg messages with a bad magic. */
    unsigned char hdr[CPS_WIRE_HDR_SIZE + 16];
    cps__msg_hdr h = push_hdr(100);
    h.payload_len = h.raw_len = 16;
    cps__wire_hdr_encode(hdr, &h);
    memset(hdr + CPS_WIRE_HDR_SIZE, 0, 16);
    unsigned char bad_magic[sizeof hdr];
    memcpy(bad_magic, hdr, sizeof hdr);
    bad_magic[0] ^= 0xff;
    send_raw(I.server_id, bad_magic, sizeof bad_magic);
    send_raw(0, bad_magic, sizeof bad_magic);
    expect_logged(srv, "bad message (", bad_s, 1);
    expect_logged(sch, "bad message (", bad_c, 1);
    /* ... and through a raw TCP connection speaking SP, without the job's MAC: the transport
     * drops it before any decoder sees it, and says so. */
    int auth_s = h_log_count(srv, "failed authentication");
    h_sp_send(sport, bad_magic, sizeof bad_magic, sizeof bad_magic);
    expect_logged(srv, "failed authentication", auth_s, 1);
    expect_logged(srv, "bad message (80 bytes", 0, 1);

    /* 3. Truncated: half a header, and a header cut from its payload. */
    send_raw(I.server_id, hdr, 20);
    send_raw(0, hdr, 20);
    expect_logged(srv, "bad message (20 bytes", 0, 1);
    expect_logged(sch, "bad message (20 bytes", 0, 1);
    send_raw(I.server_id, hdr, CPS_WIRE_HDR_SIZE + 7);
    expect_logged(srv, "bad message (71 bytes", 0, 1);

    /* 4. A header whose payload_len lies (says 1000, 16 bytes follow; says 0, 16 follow). */
    unsigned char liar[sizeof hdr];
    memcpy(liar, hdr, sizeof hdr);
    cps__le32_put(liar + 48, 1000);
    cps__le32_put(liar + 52, 1000);
    send_raw(I.server_id, liar, sizeof liar);
    send_raw(0, liar, sizeof liar);
    cps__le32_put(liar + 48, 0);
    cps__le32_put(liar + 52, 0);
    send_raw(I.server_id, liar, sizeof liar);
    expect_logged(srv, "bad message (80 bytes", 0, 3);
    expect_logged(sch, "bad message (80 bytes", 0, 2);

    /* 5. A push flagged snappy whose payload is junk: the header is fine, so the known sender
     * gets an ERROR reply. */
    int32_t status = 0;
    cps__msg_hdr z = push_hdr(101);
    z.flags = CPS_WF_SNAPPY;
    z.payload_len = 32;
    z.raw_len = 200;
    unsigned char zmsg[CPS_WIRE_HDR_SIZE + 32];
    cps__wire_hdr_encode(zmsg, &z);
    memcpy(zmsg + CPS_WIRE_HDR_SIZE, junk, 32);
    send_raw(I.server_id, zmsg, sizeof zmsg);
    assert_int_equal(wait_reply(101, &status), CPS_MSG_ERROR);
    assert_true(status < 0);
    expect_logged(srv, "bad message (96 bytes, type 21", 0, 1);

    /* 6. A push for a key nobody declared; 7. a push whose length does not match the key.
     * Each consumes one number of the intruder's request sequence (1, 2, 3). */
    push_kv(1, KEY + 1, KLEN);
    assert_int_equal(wait_reply(1, &status), CPS_MSG_ERROR);
    assert_int_equal(status, CPS_ENOTFOUND);
    push_kv(2, KEY, KLEN + 1);
    assert_int_equal(wait_reply(2, &status), CPS_MSG_ERROR);
    assert_int_equal(status, CPS_ESIZE);
    expect_logged(srv, "refused: CPS_ENOTFOUND", 0, 1);
    expect_logged(srv, "refused: CPS_ESIZE", 0, 1);
    /* A correct push after the refused ones is applied (zero gradient: values unchanged). */
    push_kv(3, KEY, KLEN);
    assert_int_equal(wait_reply(3, &status), CPS_MSG_ACK);

    /* 8. Messages from a node id nobody knows: dropped (there is no one to answer). */
    cps__msg_hdr u = push_hdr(102);
    u.type = CPS_MSG_PULL;
    u.sender = 777;
    u.req_worker = 777;
    char pull_payload[64];
    size_t pn = cps__wire_kv_encode(pull_payload, sizeof pull_payload, 1, &key, &klen, NULL, 0);
    send_msg(I.server_id, &u, pull_payload, pn);
    cps__msg_hdr hb = {.type = CPS_MSG_HEARTBEAT, .sender = 777, .epoch = I.epoch};
    send_msg(0, &hb, NULL, 0);
    expect_logged(srv, "from unknown node 777", 0, 1);
    expect_logged(sch, "from unknown node 777", 0, 1);

    /* 9. Lossy pushes (CPS_WF_LOSSY): decoded by the head to floats and applied; a malformed
     * block is refused with the decoder's error before it takes a sequence number, and the
     * server carries on. */
    lossy_pushes(c, srv);

    /* 2. Checkpoint messages gone wrong (src/server/cut.c, the scheduler's registry): each is
     * refused with a reply or a log line, and nothing stored changes. */
    bad_checkpoint_messages(srv, sch);

    /* The real worker sees exactly what it had. */
    assert_int_equal(cps_pull(c, t, after, 100), 0);
    assert_memory_equal(after, before, sizeof before);
    assert_int_equal(cps_raw_pull(c, &key, 1, kv_after, &klen), 0);
    assert_memory_equal(kv_after, kv_before, sizeof kv_before);
    /* ... and keeps training, with its pushes lossy-compressed too. */
    worker_lossy(c, t, g, before);

    /* `chainps status` lists the nodes and the range. */
    const char *argv[] = {CHAINPS_BIN, "status", "--scheduler", C.sched_addr, NULL};
    pid_t st;
    assert_int_equal(h_run("status", (char *const *)argv, NULL, WAIT_MS, &st), 0);
    char *out = h_read_log(st);
    assert_non_null(strstr(out, "job: running"));
    assert_non_null(strstr(out, "nodes:"));
    assert_non_null(strstr(out, "ranges:"));
    assert_non_null(strstr(out, "server"));
    assert_non_null(strstr(out, "worker"));
    assert_non_null(strstr(out, "0000000000000000-ffffffffffffffff"));
    free(out);

    /* The intruder leaves like a worker that dies right after its BYE: its inbox is closed
     * before the BYE is sent (from another socket), so the scheduler's ACK to it can never be
     * delivered. The job must still end when the real worker leaves (it used to wait for ever
     * for that queue to drain). */
    cps__tp_destroy(I.tp);
    I.tp = NULL;
    cps__tp *last = NULL;
    assert_int_equal(cps__tp_create(h_key(), &last), 0);
    I.tp = last; /* freed by the teardown if an assertion fails */
    assert_int_equal(cps__tp_bind(last, H_HOST, 0, NULL), 0);
    char sched_url[96];
    snprintf(sched_url, sizeof sched_url, "tcp://%s", C.sched_addr);
    assert_int_equal(cps__tp_peer_set(last, 0, sched_url), 0);
    cps__msg_hdr bye = {.type = CPS_MSG_BYE, .sender = I.g.id, .epoch = I.epoch, .req_seq = 1};
    send_msg(0, &bye, NULL, 0);
    drain();
    assert_true(h_wait_log(sch, "finished (1 of 2)", 1, WAIT_MS));
    assert_int_equal(cps_close(c), 0);
    assert_true(h_wait_exit(sch, WAIT_MS, NULL));
    assert_int_equal(h_exit_code(sch), 0);
    assert_true(h_wait_exit(srv, WAIT_MS, NULL));
    assert_int_equal(h_exit_code(srv), 0);
}

/* Run `chainps args...`; returns the exit code and the output through *out (freed by caller). */
static int cli(char **out, const char *a1, const char *a2, const char *a3, const char *a4)
{
    const char *argv[] = {CHAINPS_BIN, a1, a2, a3, a4, NULL};
    pid_t pid;
    int code = h_run("cli", (char *const *)argv, NULL, WAIT_MS, &pid);
    *out = h_read_log(pid);
    /* One log per run: the next call appends to a fresh file. */
    unlink(h_log_path(pid));
    return code;
}

static void test_cli(void **state)
{
    (void)state;
    static const char *cmds[] = {"scheduler", "server", "launch", "status", NULL};
    char *out;
    assert_int_equal(cli(&out, "--help", NULL, NULL, NULL), 0);
    assert_non_null(strstr(out, "usage: chainps"));
    free(out);
    assert_int_equal(cli(&out, NULL, NULL, NULL, NULL), 2);
    free(out);
    assert_int_equal(cli(&out, "no-such-command", NULL, NULL, NULL), 2);
    assert_non_null(strstr(out, "unknown command"));
    free(out);
    for (int i = 0; cmds[i]; i++) {
        assert_int_equal(cli(&out, cmds[i], "--help", NULL, NULL), 0);
        assert_non_null(strstr(out, "usage: chainps"));
        assert_non_null(strstr(out, cmds[i]));
        free(out);
        assert_int_equal(cli(&out, cmds[i], "--no-such-flag", NULL, NULL), 2);
        assert_non_null(strstr(out, "chainps"));
        assert_non_null(strstr(out, "--help"));
        free(out);
    }
    /* Bad values name the flag. */
    assert_int_equal(cli(&out, "scheduler", "--servers", "two", NULL), 2);
    assert_non_null(strstr(out, "--servers"));
    free(out);
    assert_int_equal(cli(&out, "server", "--scheduler", "no-port-here", NULL), 2);
    assert_non_null(strstr(out, "--scheduler"));
    free(out);
    assert_int_equal(cli(&out, "launch", "--mode", "sometimes", NULL), 2);
    assert_non_null(strstr(out, "--mode"));
    free(out);
    assert_int_equal(cli(&out, "status", "--scheduler", H_HOST ":99999", NULL), 2);
    assert_non_null(strstr(out, "--scheduler"));
    free(out);
    assert_int_equal(cli(&out, "scheduler", "--servers", "1", NULL), 2);
    assert_non_null(strstr(out, "--workers"));
    free(out);
}

static int teardown(void **state)
{
    (void)state;
    if (I.tp) {
        cps__tp_destroy(I.tp);
        cps__view_fini(&I.g.view);
        I.tp = NULL;
    }
    return h_test_end();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate_setup_teardown(test_bad_messages, h_setup, teardown,
                                                 (&(h_fixture){"badinput", 60})),
        cmocka_unit_test_prestate_setup_teardown(test_cli, h_setup, teardown,
                                                 (&(h_fixture){"badinput", 60})),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
