/* Message authentication (src/transport/auth.c): the MAC trailer, replays, other jobs' keys and
 * unsigned senders, on buffers and through real sockets on 127.0.0.1. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <nanomsg/nn.h>
#include <nanomsg/pipeline.h>
#include <openssl/evp.h>

#include "chainps/error.h"
#include "core/log.h"
#include "core/wire.h"
#include "transport/auth.h"
#include "transport/frame.h"
#include "transport/transport.h"

#define HOST    "127.0.0.1"
#define WAIT_MS 5000
#define BODY    200

static const unsigned char KEY[32] = "chainps auth unit test job key";
static const unsigned char OTHER[32] = "another job's key, not ours!!!";

/* nanomsg before 1.1 moved a chunk it was asked to shorten; the one installed cuts it in place.
 * Linked with --wrap=nn_reallocmsg (tests/CMakeLists.txt), the next call moves the chunk when
 * `realloc_move` is set, as an old nanomsg did, and counts it in `realloc_moved`. */
void *__real_nn_reallocmsg(void *msg, size_t size);
void *__wrap_nn_reallocmsg(void *msg, size_t size);
static int realloc_move, realloc_moved;
void *__wrap_nn_reallocmsg(void *msg, size_t size)
{
    if (!realloc_move)
        return __real_nn_reallocmsg(msg, size);
    realloc_move = 0;
    void *nb = nn_allocmsg(size, 0);
    if (!nb)
        return NULL;
    memcpy(nb, msg, size); /* only ever asked to shorten */
    /* Scribbled over before it is freed: a send of the old chunk would not be byte-exact. */
    memset(msg, 0xee, size);
    nn_freemsg(msg);
    realloc_moved++;
    return nb;
}

/* A message of BODY bytes and room for the trailer. */
static unsigned char *message(uint32_t seed)
{
    unsigned char *m = malloc(BODY + CPS_AUTH_TRAILER);
    assert_non_null(m);
    for (size_t i = 0; i < BODY; i++)
        m[i] = (unsigned char)(seed * 31u + i * 7u);
    return m;
}

static int open_copy(cps__auth *rx, const unsigned char *m, size_t len)
{
    size_t body = 0;
    int v = cps__auth_open(rx, m, len, &body);
    if (v == CPS_AUTH_OK)
        assert_int_equal(body, len - CPS_AUTH_TRAILER);
    return v;
}

static void sealed_opens_and_every_changed_byte_fails(void **state)
{
    (void)state;
    cps__auth *tx, *rx;
    assert_int_equal(cps__auth_create(KEY, &tx), 0);
    unsigned char *m = message(1);
    cps__auth_seal(tx, m, BODY);
    /* Every byte is covered: header, payload, salt, counter and the tag itself. */
    for (size_t at = 0; at < BODY + CPS_AUTH_TRAILER; at += 7) {
        assert_int_equal(cps__auth_create(KEY, &rx), 0);
        m[at] ^= 0x01;
        assert_int_equal(open_copy(rx, m, BODY + CPS_AUTH_TRAILER), CPS_AUTH_BAD_TAG);
        m[at] ^= 0x01;
        assert_int_equal(open_copy(rx, m, BODY + CPS_AUTH_TRAILER), CPS_AUTH_OK);
        cps__auth_destroy(rx);
    }
    /* Cut short: the tag no longer matches (or there is no trailer at all). */
    assert_int_equal(cps__auth_create(KEY, &rx), 0);
    assert_int_equal(open_copy(rx, m, BODY + CPS_AUTH_TRAILER - 1), CPS_AUTH_BAD_TAG);
    assert_int_equal(open_copy(rx, m, CPS_AUTH_TRAILER - 1), CPS_AUTH_SHORT);
    cps__auth_destroy(rx);
    free(m);
    cps__auth_destroy(tx);
}

/* The trailer is the documented construction, computed here straight from OpenSSL: subkey =
 * SHA-256("chainps message key v2\0" | job key | salt), tag = ChaCha20-Poly1305 under it with
 * nonce = counter (le64) | 0000, the message up to the tag as additional data and no plaintext.
 * Pins the wire format, so two builds of one wire version keep understanding each other. */
static void trailer_is_the_documented_construction(void **state)
{
    (void)state;
    cps__auth *a;
    assert_int_equal(cps__auth_create(KEY, &a), 0);
    unsigned char *m = message(9);
    cps__auth_seal(a, m, BODY);
    cps__auth_seal(a, m, BODY); /* counter 2 */
    const unsigned char *t = m + BODY;
    assert_int_equal(cps__le64_get(t + CPS_AUTH_SALT), 2);

    static const char label[] = "chainps message key v2";
    unsigned char sub[32];
    unsigned int sublen = 0;
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    assert_non_null(md);
    assert_int_equal(EVP_DigestInit_ex(md, EVP_sha256(), NULL), 1);
    assert_int_equal(EVP_DigestUpdate(md, label, sizeof label), 1);
    assert_int_equal(EVP_DigestUpdate(md, KEY, sizeof KEY), 1);
    assert_int_equal(EVP_DigestUpdate(md, t, CPS_AUTH_SALT), 1);
    assert_int_equal(EVP_DigestFinal_ex(md, sub, &sublen), 1);
    EVP_MD_CTX_free(md);

    unsigned char nonce[12] = {0}, tag[16], none[16];
    cps__le64_put(nonce, 2);
    int outl;
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    assert_non_null(c);
    assert_int_equal(EVP_EncryptInit_ex(c, EVP_chacha20_poly1305(), NULL, sub, nonce), 1);
    assert_int_equal(EVP_EncryptUpdate(c, NULL, &outl, m, BODY + CPS_AUTH_SALT + 8), 1);
    assert_int_equal(EVP_EncryptFinal_ex(c, none, &outl), 1);
    assert_int_equal(outl, 0);
    assert_int_equal(EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_GET_TAG, 16, tag), 1);
    assert_memory_equal(tag, t + CPS_AUTH_SALT + 8, CPS_AUTH_TAG);

    /* And a receiver's check is the AEAD's own: decrypting nothing with that tag succeeds, and
     * fails with the tag of the first counter (the nonce is part of the construction). */
    unsigned char *m1 = message(9);
    assert_int_equal(EVP_DecryptInit_ex(c, EVP_chacha20_poly1305(), NULL, sub, nonce), 1);
    assert_int_equal(EVP_DecryptUpdate(c, NULL, &outl, m, BODY + CPS_AUTH_SALT + 8), 1);
    assert_int_equal(EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_SET_TAG, 16, tag), 1);
    assert_int_equal(EVP_DecryptFinal_ex(c, none, &outl), 1);
    cps__auth_seal(a, m1, BODY); /* counter 3, same salt */
    assert_int_equal(EVP_DecryptInit_ex(c, NULL, NULL, NULL, nonce), 1);
    assert_int_equal(EVP_DecryptUpdate(c, NULL, &outl, m1, BODY + CPS_AUTH_SALT + 8), 1);
    assert_int_equal(EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_SET_TAG, 16, m1 + BODY + 24), 1);
    assert_int_not_equal(EVP_DecryptFinal_ex(c, none, &outl), 1);
    EVP_CIPHER_CTX_free(c);
    free(m1);
    free(m);
    cps__auth_destroy(a);
}

/* What a chainps of wire version 3 sent: a trailer sealed with GMAC (AES-128-GCM, the message as
 * additional data) under the first 16 bytes of SHA-256("chainps message key v1\0" | job key |
 * salt), nonce = counter (le64) | 0000. */
static void seal_v3(unsigned char *m, size_t len, const unsigned char *key, uint64_t counter)
{
    static const char label[] = "chainps message key v1";
    unsigned char *t = m + len, sub[32], nonce[12] = {0}, none[16];
    memset(t, 0x3c, CPS_AUTH_SALT);
    cps__le64_put(t + CPS_AUTH_SALT, counter);
    unsigned int sublen = 0;
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    assert_non_null(md);
    assert_int_equal(EVP_DigestInit_ex(md, EVP_sha256(), NULL), 1);
    assert_int_equal(EVP_DigestUpdate(md, label, sizeof label), 1);
    assert_int_equal(EVP_DigestUpdate(md, key, CPS_AUTH_KEY_SIZE), 1);
    assert_int_equal(EVP_DigestUpdate(md, t, CPS_AUTH_SALT), 1);
    assert_int_equal(EVP_DigestFinal_ex(md, sub, &sublen), 1);
    EVP_MD_CTX_free(md);
    cps__le64_put(nonce, counter);
    int outl;
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    assert_non_null(c);
    assert_int_equal(EVP_EncryptInit_ex(c, EVP_aes_128_gcm(), NULL, sub, nonce), 1);
    assert_int_equal(EVP_EncryptUpdate(c, NULL, &outl, m, (int)len + CPS_AUTH_SALT + 8), 1);
    assert_int_equal(EVP_EncryptFinal_ex(c, none, &outl), 1);
    assert_int_equal(
        EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, CPS_AUTH_TAG, t + CPS_AUTH_SALT + 8), 1);
    EVP_CIPHER_CTX_free(c);
}

/* A wire header at the start of m (a heartbeat whose payload fills the BODY bytes) of `version`. */
static void header(unsigned char *m, uint8_t version)
{
    cps__msg_hdr h = {0};
    h.type = CPS_MSG_HEARTBEAT;
    h.sender = 7;
    h.payload_len = h.raw_len = BODY - CPS_WIRE_HDR_SIZE;
    cps__wire_hdr_encode(m, &h);
    m[4] = version;
}

/* A process of the previous wire version (GMAC trailers) is refused with a verdict that names the
 * version mismatch, keyed or not, and never taken for a forger or let through; a GMAC trailer
 * under a header of this version is a wrong tag; this version's messages pass. */
static void other_wire_version_is_named(void **state)
{
    (void)state;
    cps__auth *tx, *rx, *open_tx, *open_rx;
    assert_int_equal(cps__auth_create(KEY, &tx), 0);
    assert_int_equal(cps__auth_create(KEY, &rx), 0);
    assert_int_equal(cps__auth_create(NULL, &open_tx), 0);
    assert_int_equal(cps__auth_create(NULL, &open_rx), 0);
    unsigned char *m = message(5);
    assert_int_equal(CPS_WIRE_VERSION, 5);

    header(m, 3);
    seal_v3(m, BODY, KEY, 1);
    assert_int_equal(open_copy(rx, m, BODY + CPS_AUTH_TRAILER), CPS_AUTH_VERSION);
    assert_int_equal(open_copy(open_rx, m, BODY + CPS_AUTH_TRAILER), CPS_AUTH_VERSION);
    header(m, CPS_WIRE_VERSION);
    seal_v3(m, BODY, KEY, 2);
    assert_int_equal(open_copy(rx, m, BODY + CPS_AUTH_TRAILER), CPS_AUTH_BAD_TAG);
    /* An old --insecure process: zeroed trailer, old header. */
    header(m, 3);
    cps__auth_seal(open_tx, m, BODY);
    assert_int_equal(open_copy(rx, m, BODY + CPS_AUTH_TRAILER), CPS_AUTH_VERSION);
    assert_int_equal(open_copy(open_rx, m, BODY + CPS_AUTH_TRAILER), CPS_AUTH_VERSION);
    /* Version 4 (same MAC, chains that applied before forwarding) is refused, however well
     * sealed: its successors would apply FWDs their predecessor had not. */
    header(m, 4);
    cps__auth_seal(tx, m, BODY);
    assert_int_equal(open_copy(rx, m, BODY + CPS_AUTH_TRAILER), CPS_AUTH_VERSION);
    /* A later version too, however well sealed. */
    header(m, CPS_WIRE_VERSION + 1);
    cps__auth_seal(tx, m, BODY);
    assert_int_equal(open_copy(rx, m, BODY + CPS_AUTH_TRAILER), CPS_AUTH_VERSION);
    header(m, CPS_WIRE_VERSION);
    cps__auth_seal(tx, m, BODY);
    assert_int_equal(open_copy(rx, m, BODY + CPS_AUTH_TRAILER), CPS_AUTH_OK);
    cps__auth_seal(open_tx, m, BODY);
    assert_int_equal(open_copy(open_rx, m, BODY + CPS_AUTH_TRAILER), CPS_AUTH_OK);
    assert_non_null(strstr(cps__auth_verdict_str(CPS_AUTH_VERSION), "another version"));
    free(m);
    cps__auth_destroy(tx), cps__auth_destroy(rx);
    cps__auth_destroy(open_tx), cps__auth_destroy(open_rx);
}

static void other_key_and_unsigned_are_refused(void **state)
{
    (void)state;
    cps__auth *ours, *theirs, *none, *rx, *open_rx;
    assert_int_equal(cps__auth_create(KEY, &ours), 0);
    assert_int_equal(cps__auth_create(OTHER, &theirs), 0);
    assert_int_equal(cps__auth_create(NULL, &none), 0);
    assert_int_equal(cps__auth_create(KEY, &rx), 0);
    assert_int_equal(cps__auth_create(NULL, &open_rx), 0);
    assert_false(cps__auth_keyed(none));
    assert_true(cps__auth_keyed(rx));

    unsigned char *a = message(2), *b = message(2), *c = message(2);
    cps__auth_seal(theirs, a, BODY);
    cps__auth_seal(none, b, BODY);
    cps__auth_seal(ours, c, BODY);
    assert_int_equal(open_copy(rx, a, BODY + CPS_AUTH_TRAILER), CPS_AUTH_BAD_TAG);
    assert_int_equal(open_copy(rx, b, BODY + CPS_AUTH_TRAILER), CPS_AUTH_UNSIGNED);
    assert_int_equal(open_copy(rx, c, BODY + CPS_AUTH_TRAILER), CPS_AUTH_OK);
    /* A receiver without a key (an --insecure job) takes anything with a trailer. */
    assert_int_equal(open_copy(open_rx, a, BODY + CPS_AUTH_TRAILER), CPS_AUTH_OK);
    assert_int_equal(open_copy(open_rx, b, BODY + CPS_AUTH_TRAILER), CPS_AUTH_OK);
    /* Forged tags cost the receiver nothing lasting: the real sender still gets through after
     * a flood of forgeries bearing fresh salts (they never enter the sender table). */
    for (int i = 0; i < 500; i++) {
        unsigned char *f = message((uint32_t)i);
        cps__auth_seal(theirs, f, BODY);
        f[i % 16 + BODY] ^= 0x5a; /* another salt */
        assert_int_equal(open_copy(rx, f, BODY + CPS_AUTH_TRAILER), CPS_AUTH_BAD_TAG);
        free(f);
    }
    unsigned char *d = message(3);
    cps__auth_seal(ours, d, BODY);
    assert_int_equal(open_copy(rx, d, BODY + CPS_AUTH_TRAILER), CPS_AUTH_OK);
    free(a), free(b), free(c), free(d);
    cps__auth_destroy(ours), cps__auth_destroy(theirs), cps__auth_destroy(none);
    cps__auth_destroy(rx), cps__auth_destroy(open_rx);
}

static void replays_are_refused_reordering_is_not(void **state)
{
    (void)state;
    cps__auth *tx, *rx;
    assert_int_equal(cps__auth_create(KEY, &tx), 0);
    assert_int_equal(cps__auth_create(KEY, &rx), 0);
    enum { N = 1200 };
    unsigned char **m = calloc(N, sizeof *m);
    assert_non_null(m);
    for (int i = 0; i < N; i++) {
        m[i] = message((uint32_t)i);
        cps__auth_seal(tx, m[i], BODY);
    }
    /* Two pipes to one receiver can interleave: a later message may come first. */
    assert_int_equal(open_copy(rx, m[5], BODY + CPS_AUTH_TRAILER), CPS_AUTH_OK);
    assert_int_equal(open_copy(rx, m[3], BODY + CPS_AUTH_TRAILER), CPS_AUTH_OK);
    assert_int_equal(open_copy(rx, m[4], BODY + CPS_AUTH_TRAILER), CPS_AUTH_OK);
    /* ... but each only once. */
    assert_int_equal(open_copy(rx, m[5], BODY + CPS_AUTH_TRAILER), CPS_AUTH_REPLAY);
    assert_int_equal(open_copy(rx, m[3], BODY + CPS_AUTH_TRAILER), CPS_AUTH_REPLAY);
    /* Far ahead: the window moves, what fell out of it cannot be told from a replay. */
    assert_int_equal(open_copy(rx, m[N - 1], BODY + CPS_AUTH_TRAILER), CPS_AUTH_OK);
    assert_int_equal(open_copy(rx, m[6], BODY + CPS_AUTH_TRAILER), CPS_AUTH_TOO_OLD);
    assert_int_equal(open_copy(rx, m[N - 2], BODY + CPS_AUTH_TRAILER), CPS_AUTH_OK);
    assert_int_equal(open_copy(rx, m[N - 2], BODY + CPS_AUTH_TRAILER), CPS_AUTH_REPLAY);
    assert_int_equal(open_copy(rx, m[N - 1], BODY + CPS_AUTH_TRAILER), CPS_AUTH_REPLAY);
    /* Every message is refused after it was taken once, in any order. */
    for (int i = N - 1000; i < N - 2; i += 3)
        assert_int_equal(open_copy(rx, m[i], BODY + CPS_AUTH_TRAILER), CPS_AUTH_OK);
    for (int i = N - 1000; i < N; i += 3)
        assert_int_equal(open_copy(rx, m[i], BODY + CPS_AUTH_TRAILER), CPS_AUTH_REPLAY);
    for (int i = 0; i < N; i++)
        free(m[i]);
    free(m);
    cps__auth_destroy(tx);
    cps__auth_destroy(rx);
}

static void many_senders(void **state)
{
    (void)state;
    cps__auth *rx;
    assert_int_equal(cps__auth_create(KEY, &rx), 0);
    enum { S = 100 };
    cps__auth *tx[S];
    unsigned char *first[S];
    for (int s = 0; s < S; s++) {
        assert_int_equal(cps__auth_create(KEY, &tx[s]), 0);
        first[s] = message((uint32_t)s);
        cps__auth_seal(tx[s], first[s], BODY);
        assert_int_equal(open_copy(rx, first[s], BODY + CPS_AUTH_TRAILER), CPS_AUTH_OK);
    }
    /* The most recent 64 senders are remembered: their first messages are replays. */
    for (int s = S - 64; s < S; s++)
        assert_int_equal(open_copy(rx, first[s], BODY + CPS_AUTH_TRAILER), CPS_AUTH_REPLAY);
    /* Every sender, remembered or not, still gets new messages through. */
    for (int s = 0; s < S; s++) {
        unsigned char *m = message((uint32_t)s + 1000);
        cps__auth_seal(tx[s], m, BODY);
        assert_int_equal(open_copy(rx, m, BODY + CPS_AUTH_TRAILER), CPS_AUTH_OK);
        free(m);
        free(first[s]);
        cps__auth_destroy(tx[s]);
    }
    cps__auth_destroy(rx);
}

/* ---- secret files ---- */

static void secret_files(void **state)
{
    (void)state;
    char dir[] = "/tmp/cps-secret-test-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256], err[1024];
    unsigned char k1[32], k2[32];
    snprintf(path, sizeof path, "%s/job.secret", dir);
    assert_int_equal(cps__auth_create_file(path, err, sizeof err), 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(st.st_size, 65); /* 64 hex digits and a newline */
    assert_int_equal(cps__auth_create_file(path, err, sizeof err), CPS_EEXIST);
    assert_non_null(strstr(err, path));
    assert_int_equal(cps__auth_load_file(path, k1, err, sizeof err), 0);
    assert_int_equal(cps__auth_load_file(path, k2, err, sizeof err), 0);
    assert_memory_equal(k1, k2, 32);

    /* Open to others: refused, naming the file and the fix. */
    assert_int_equal(chmod(path, 0644), 0);
    assert_int_equal(cps__auth_load_file(path, k1, err, sizeof err), CPS_ECONFIG);
    assert_non_null(strstr(err, "chmod 600"));
    assert_non_null(strstr(err, path));

    /* Too short (trailing whitespace does not count), and missing. */
    char shortp[256];
    snprintf(shortp, sizeof shortp, "%s/short", dir);
    FILE *f = fopen(shortp, "w");
    assert_non_null(f);
    fputs("fifteen bytes!!\n\n   \n", f);
    fclose(f);
    assert_int_equal(chmod(shortp, 0600), 0);
    assert_int_equal(cps__auth_load_file(shortp, k1, err, sizeof err), CPS_ECONFIG);
    assert_non_null(strstr(err, "fewer than 16 bytes"));
    /* A hand-made secret of 16 bytes is enough; its trailing newline is ignored. */
    f = fopen(shortp, "w");
    fputs("sixteen bytes!!!\n", f);
    fclose(f);
    assert_int_equal(cps__auth_load_file(shortp, k1, err, sizeof err), 0);
    f = fopen(shortp, "w");
    fputs("sixteen bytes!!!", f);
    fclose(f);
    assert_int_equal(cps__auth_load_file(shortp, k2, err, sizeof err), 0);
    assert_memory_equal(k1, k2, 32);
    unlink(shortp);
    assert_int_equal(cps__auth_load_file(shortp, k1, err, sizeof err), CPS_ECONFIG);
    assert_non_null(strstr(err, "No such file"));
    assert_int_equal(cps__auth_load_file(dir, k1, err, sizeof err), CPS_ECONFIG);
    unlink(path);
    rmdir(dir);
}

/* ---- through sockets ---- */

typedef struct inbox {
    int n;
    size_t last_len;
    unsigned char last[BODY];
} inbox;

static void keep(void *ctx, void *buf, size_t len)
{
    inbox *ib = ctx;
    ib->n++;
    ib->last_len = len;
    memcpy(ib->last, buf, len < BODY ? len : BODY);
    cps__tp_free(buf);
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Poll rcv (and flush snd) for up to ms; returns what was delivered. */
static void pump(cps__tp *snd, cps__tp *rcv, inbox *ib, int want, int ms)
{
    uint64_t end = now_ms() + (uint64_t)ms;
    while (ib->n < want && now_ms() < end) {
        if (snd)
            cps__tp_poll(snd, 0, NULL, NULL, 0);
        cps__tp_poll(rcv, 10, keep, ib, 0);
    }
}

static void sockets_deliver_ours_drop_the_rest(void **state)
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
static void forwarded_buffer_is_resealed(void **state)
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
static void old_version_peer_is_logged_as_such(void **state)
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
    assert_non_null(strstr(line, "wire version 3 (ours 5)"));
    nn_close(raw);
    cps__tp_destroy(rcv);
}

/* The MAC riding on a copy (cps__auth_seal_copy, cps__auth_open_copy) is the same MAC: what one
 * seals the other opens, the copied bytes arrive intact, and a byte changed anywhere (before,
 * inside or after the copied part, in a piece's first or last byte, in the trailer) is refused. */
static void fused_copy_is_the_same_mac(void **state)
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
static void fill_macs_as_it_copies(void **state)
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
static void deferred_check_rides_on_the_copy(void **state)
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

int main(void)
{
    cps__log_set_level(CPS_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sealed_opens_and_every_changed_byte_fails),
        cmocka_unit_test(trailer_is_the_documented_construction),
        cmocka_unit_test(fused_copy_is_the_same_mac),
        cmocka_unit_test(fill_macs_as_it_copies),
        cmocka_unit_test(other_key_and_unsigned_are_refused),
        cmocka_unit_test(other_wire_version_is_named),
        cmocka_unit_test(replays_are_refused_reordering_is_not),
        cmocka_unit_test(many_senders),
        cmocka_unit_test(secret_files),
        cmocka_unit_test(sockets_deliver_ours_drop_the_rest),
        cmocka_unit_test(forwarded_buffer_is_resealed),
        cmocka_unit_test(deferred_check_rides_on_the_copy),
        cmocka_unit_test(old_version_peer_is_logged_as_such),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
