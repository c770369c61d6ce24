/* unit.transport_auth: the MAC trailer on buffers: every changed byte, the documented
 * construction, other wire versions, other keys and unsigned senders, replays, key files. */
#include "fixture.h"

void sealed_opens_and_every_changed_byte_fails(void **state)
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
void trailer_is_the_documented_construction(void **state)
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
void seal_v3(unsigned char *m, size_t len, const unsigned char *key, uint64_t counter)
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
void header(unsigned char *m, uint8_t version)
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
void other_wire_version_is_named(void **state)
{
    (void)state;
    cps__auth *tx, *rx, *open_tx, *open_rx;
    assert_int_equal(cps__auth_create(KEY, &tx), 0);
    assert_int_equal(cps__auth_create(KEY, &rx), 0);
    assert_int_equal(cps__auth_create(NULL, &open_tx), 0);
    assert_int_equal(cps__auth_create(NULL, &open_rx), 0);
    unsigned char *m = message(5);
    assert_int_equal(CPS_WIRE_VERSION, 6);

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
    /* Version 5 too: its SNAP chunks carry no number, so its joiners install a stream that lost
     * a chunk, and behind its tails ours never finish a join. */
    header(m, 5);
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

void other_key_and_unsigned_are_refused(void **state)
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

void replays_are_refused_reordering_is_not(void **state)
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

void many_senders(void **state)
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
void secret_files(void **state)
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
