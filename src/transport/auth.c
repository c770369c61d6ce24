/* Message authentication with OpenSSL's ChaCha20-Poly1305 used as a MAC (see auth.h for the
 * format and the reasons). */
#include "transport/auth.h"

#include <ctype.h>
#include <stdarg.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include "chainps/error.h"
#include "core/wire.h"

#define NONCE_LEN     12
#define REPLAY_WINDOW 1024u
#define SENDERS_MAX   64
#define SECRET_LABEL  "chainps job secret v1"
/* v2: ChaCha20-Poly1305 keys (v1 keyed AES-128-GCM with the first half of the same hash). A new
 * label, so that no subkey ever serves two algorithms. */
#define SUBKEY_LABEL "chainps message key v2"

typedef struct sender {
    unsigned char salt[CPS_AUTH_SALT];
    EVP_CIPHER_CTX *ctx;               /* keyed with this sender's subkey */
    uint64_t max;                      /* highest counter taken */
    uint64_t seen[REPLAY_WINDOW / 64]; /* bit (c % WINDOW) for counters max-WINDOW+1..max */
    uint64_t used;                     /* for least-recently-heard eviction */
    int live;
} sender;

struct cps__auth {
    int keyed;
    unsigned char key[CPS_AUTH_KEY_SIZE];
    unsigned char salt[CPS_AUTH_SALT];
    uint64_t counter;
    EVP_CIPHER_CTX *own;   /* our sending subkey */
    EVP_CIPHER_CTX *spare; /* checks a sender not yet in the table */
    /* The one message MACed while it is built (cps__auth_stream_begin), on a context of its own
     * so that seals in between leave it be: its counter (0: none) and the bytes MACed so far. */
    EVP_CIPHER_CTX *stream;
    uint64_t stream_ctr;
    size_t stream_fed;
    sender senders[SENDERS_MAX];
    uint64_t tick;
};

const char *cps__auth_verdict_str(int v)
{
    switch (v) {
    case CPS_AUTH_OK:
        return "ok";
    case CPS_AUTH_SHORT:
        return "too short to carry a MAC";
    case CPS_AUTH_UNSIGNED:
        return "no MAC (the sender runs without a secret: --insecure?)";
    case CPS_AUTH_BAD_TAG:
        return "wrong MAC (another job's secret, a forgery or a corrupted message)";
    case CPS_AUTH_REPLAY:
        return "replayed (this sender's counter was taken already)";
    case CPS_AUTH_TOO_OLD:
        return "older than the replay window";
    case CPS_AUTH_VERSION:
        return "sent by another version of chainps (another wire protocol and MAC): run one "
               "version in the whole job";
    case CPS_AUTH_NOMEM:
        return "out of memory while checking";
    }
    return "?";
}

/* ---- secret files ---- */

__attribute__((format(printf, 4, 5))) static int fail(char *err, size_t errlen, int rc,
                                                      const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

static int sha256_parts(const void *a, size_t alen, const void *b, size_t blen, const void *c,
                        size_t clen, unsigned char out[32])
{
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    unsigned int n = 0;
    int ok = md && EVP_DigestInit_ex(md, EVP_sha256(), NULL) == 1 &&
             EVP_DigestUpdate(md, a, alen) == 1 && (!blen || EVP_DigestUpdate(md, b, blen) == 1) &&
             (!clen || EVP_DigestUpdate(md, c, clen) == 1) && EVP_DigestFinal_ex(md, out, &n) == 1;
    EVP_MD_CTX_free(md);
    return ok && n == 32 ? 0 : CPS_ENOMEM;
}

int cps__auth_load_file(const char *path, unsigned char key[CPS_AUTH_KEY_SIZE], char *err,
                        size_t errlen)
{
    if (!path || !*path)
        return fail(err, errlen, CPS_ECONFIG, "no secret file named");
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return fail(err, errlen, CPS_ECONFIG, "cannot open the secret file %s: %s", path,
                    strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return fail(err, errlen, CPS_ECONFIG, "the secret file %s is not a regular file", path);
    }
    if (st.st_mode & 077) {
        close(fd);
        return fail(err, errlen, CPS_ECONFIG,
                    "the secret file %s is open to other users (mode %04o): chmod 600 it", path,
                    (unsigned)(st.st_mode & 07777));
    }
    unsigned char buf[CPS_SECRET_MAX + 1];
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, sizeof buf - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            OPENSSL_cleanse(buf, sizeof buf);
            return fail(err, errlen, CPS_ECONFIG, "cannot read the secret file %s: %s", path,
                        strerror(e));
        }
        if (r == 0 || (n += (size_t)r) == sizeof buf)
            break;
    }
    close(fd);
    while (n > 0 && isspace(buf[n - 1]))
        n--;
    int rc = n < CPS_SECRET_MIN || n > CPS_SECRET_MAX
                 ? CPS_ECONFIG
                 : sha256_parts(SECRET_LABEL, sizeof SECRET_LABEL, buf, n, NULL, 0, key);
    OPENSSL_cleanse(buf, sizeof buf);
    if (n > CPS_SECRET_MAX)
        return fail(err, errlen, rc, "the secret file %s is longer than 4096 bytes", path);
    if (n < CPS_SECRET_MIN)
        return fail(err, errlen, rc,
                    "the secret file %s holds fewer than 16 bytes (`chainps secret %s` makes one)",
                    path, path);
    return rc ? fail(err, errlen, rc, "cannot hash the secret file %s", path) : 0;
}

int cps__auth_create_file(const char *path, char *err, size_t errlen)
{
    unsigned char raw[32];
    char hex[2 * sizeof raw + 2];
    if (RAND_bytes(raw, sizeof raw) != 1)
        return fail(err, errlen, CPS_EIO, "no randomness for a secret for %s", path);
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(hex + 2 * i, 3, "%02x", raw[i]);
    hex[2 * sizeof raw] = '\n';
    hex[2 * sizeof raw + 1] = 0;
    OPENSSL_cleanse(raw, sizeof raw);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        int e = errno;
        OPENSSL_cleanse(hex, sizeof hex);
        return fail(err, errlen, e == EEXIST ? CPS_EEXIST : CPS_EIO,
                    "cannot create the secret file %s: %s", path, strerror(e));
    }
    size_t len = 2 * sizeof raw + 1;
    int ok = write(fd, hex, len) == (ssize_t)len && fsync(fd) == 0;
    int e = errno;
    OPENSSL_cleanse(hex, sizeof hex);
    if (close(fd) != 0 || !ok) {
        unlink(path);
        return fail(err, errlen, CPS_EIO, "cannot write the secret file %s: %s", path, strerror(e));
    }
    return 0;
}

/* ---- sealing and checking ---- */

/* On a Xeon with AVX-512 (IFMA), OpenSSL 3.0's ChaCha20-Poly1305 returns from its final step
 * (EVP_EncryptFinal_ex, whatever the length) with the upper halves of the vector registers in use
 * and no vzeroupper; with its AVX-512 paths masked (OPENSSL_ia32cap) it does not. Until the thread
 * next runs a vzeroupper, every legacy SSE instruction it executes pays the transition penalty:
 * all scalar float and double code built for baseline x86-64 (libm, the optimizer, the
 * application's own loops). A scalar loop after one 64-byte MAC ran 21 times slower (175 against
 * 8 ms), and in a push+pull job the MAC cost several times its own arithmetic
 * (bench/results/transport.md §9). So every call into OpenSSL's cipher ends with a vzeroupper:
 * about a cycle, also where OpenSSL leaves the state clean. Only where the CPU and the operating
 * system support AVX (the instruction faults otherwise); the clobbers tell the compiler that the
 * vector registers change. */
static void vec_clean(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    /* libgcc fills the CPU model in a constructor: one load here, no race between threads. */
    if (__builtin_cpu_supports("avx"))
        __asm__ volatile("vzeroupper" ::
                             : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7",
                               "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15",
                               "memory");
#endif
}

static EVP_CIPHER_CTX *mac_new(void)
{
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    if (c && EVP_EncryptInit_ex(c, EVP_chacha20_poly1305(), NULL, NULL, NULL) != 1) {
        EVP_CIPHER_CTX_free(c);
        c = NULL;
    }
    return c;
}

/* Key `c` with the subkey of `salt` under the job key (all 32 bytes: a ChaCha20 key). */
static int mac_key(const cps__auth *a, EVP_CIPHER_CTX *c, const unsigned char *salt)
{
    unsigned char sub[32];
    int rc = sha256_parts(SUBKEY_LABEL, sizeof SUBKEY_LABEL, a->key, sizeof a->key, salt,
                          CPS_AUTH_SALT, sub);
    if (rc == 0 && EVP_EncryptInit_ex(c, NULL, NULL, sub, NULL) != 1)
        rc = CPS_ENOMEM;
    OPENSSL_cleanse(sub, sizeof sub);
    vec_clean();
    return rc;
}

/* Piece size of a copy that the MAC rides on: small enough that a piece copied is still in L1
 * when Poly1305 reads it. */
#define COPY_PIECE (16u << 10)

static int mac_update(EVP_CIPHER_CTX *c, const unsigned char *data, size_t len)
{
    int outl;
    while (len > 0) {
        int part = len > (1u << 30) ? (1 << 30) : (int)len;
        if (EVP_EncryptUpdate(c, NULL, &outl, data, part) != 1) {
            vec_clean();
            return -1;
        }
        data += part;
        len -= (size_t)part;
    }
    vec_clean();
    return 0;
}

/* data[0, n) copied from (seal: to data) or to (open: from data) `other`, piece by piece, each
 * piece MACed right after (seal) or before (open) its copy, so the MAC reads it from L1 rather
 * than making a pass of its own over memory. */
static int copy_mac(EVP_CIPHER_CTX *c, unsigned char *data, size_t n, unsigned char *other,
                    int seal)
{
    for (size_t off = 0; off < n; off += COPY_PIECE) {
        size_t part = n - off < COPY_PIECE ? n - off : COPY_PIECE;
        if (seal)
            memcpy(data + off, other + off, part);
        if (mac_update(c, data + off, part) != 0)
            return -1;
        if (!seal)
            memcpy(other + off, data + off, part);
    }
    return 0;
}

static int mac_start(EVP_CIPHER_CTX *c, uint64_t counter)
{
    unsigned char nonce[NONCE_LEN] = {0};
    cps__le64_put(nonce, counter);
    int rc = EVP_EncryptInit_ex(c, NULL, NULL, NULL, nonce) == 1 ? 0 : -1;
    vec_clean();
    return rc;
}

static int mac_finish(EVP_CIPHER_CTX *c, unsigned char tag[CPS_AUTH_TAG])
{
    int outl;
    unsigned char none[16];
    int rc = EVP_EncryptFinal_ex(c, none, &outl) == 1 &&
                     EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_GET_TAG, CPS_AUTH_TAG, tag) == 1
                 ? 0
                 : -1;
    vec_clean();
    return rc;
}

/* The tag of data[0, len) (len >= 24: it ends with the salt and the counter): ChaCha20-Poly1305
 * with the data as additional data and no plaintext, so the tag is Poly1305 over the data under
 * the one-time key that ChaCha20 derives from the subkey and the nonce. The receiver computes it
 * with this same function and compares with CRYPTO_memcmp, in constant time as a decrypting
 * context's final step would; one code path for both ends keeps them from ever disagreeing.
 *
 * With n > 0, data[at, at + n) is also copied on the way (copy_mac). The tag is the same either
 * way. */
static int mac_copy(EVP_CIPHER_CTX *c, uint64_t counter, const unsigned char *data, size_t len,
                    size_t at, size_t n, unsigned char *other, int seal,
                    unsigned char tag[CPS_AUTH_TAG])
{
    /* data is the caller's writable message when sealing (cps__auth_seal_copy). */
    if (mac_start(c, counter) != 0 || mac_update(c, data, at) != 0 ||
        copy_mac(c, (unsigned char *)data + at, n, other, seal) != 0 ||
        mac_update(c, data + at + n, len - at - n) != 0 || mac_finish(c, tag) != 0)
        return -1;
    return 0;
}

int cps__auth_create(const unsigned char *key, cps__auth **out)
{
    cps__auth *a = calloc(1, sizeof *a);
    if (!a)
        return CPS_ENOMEM;
    if (key) {
        a->keyed = 1;
        memcpy(a->key, key, sizeof a->key);
        if (RAND_bytes(a->salt, sizeof a->salt) != 1) {
            cps__auth_destroy(a);
            return CPS_EIO;
        }
        a->own = mac_new();
        a->spare = mac_new();
        if (!a->own || !a->spare || mac_key(a, a->own, a->salt) != 0) {
            cps__auth_destroy(a);
            return CPS_ENOMEM;
        }
    }
    *out = a;
    return 0;
}

void cps__auth_destroy(cps__auth *a)
{
    if (!a)
        return;
    EVP_CIPHER_CTX_free(a->own);
    EVP_CIPHER_CTX_free(a->spare);
    EVP_CIPHER_CTX_free(a->stream);
    for (size_t i = 0; i < SENDERS_MAX; i++)
        EVP_CIPHER_CTX_free(a->senders[i].ctx);
    OPENSSL_cleanse(a, sizeof *a);
    free(a);
}

int cps__auth_keyed(const cps__auth *a)
{
    return a && a->keyed;
}

void cps__auth_seal_copy(cps__auth *a, unsigned char *msg, size_t len, size_t at, const void *src,
                         size_t n)
{
    unsigned char *t = msg + len;
    if (!a->keyed) {
        if (n)
            memcpy(msg + at, src, n);
        memset(t, 0, CPS_AUTH_TRAILER);
        return;
    }
    uint64_t ctr = ++a->counter;
    memcpy(t, a->salt, CPS_AUTH_SALT);
    cps__le64_put(t + CPS_AUTH_SALT, ctr);
    /* A context that fails here (OpenSSL out of memory) leaves a zero tag, which every receiver
     * refuses: the message is lost like a dropped packet, and the protocol re-sends. */
    if (mac_copy(a->own, ctr, msg, len + CPS_AUTH_SALT + 8, at, n, (unsigned char *)src, 1,
                 t + CPS_AUTH_SALT + 8) != 0)
        memset(t + CPS_AUTH_SALT + 8, 0, CPS_AUTH_TAG);
}

void cps__auth_seal(cps__auth *a, unsigned char *msg, size_t len)
{
    cps__auth_seal_copy(a, msg, len, 0, NULL, 0);
}

uint64_t cps__auth_stream_begin(cps__auth *a)
{
    a->stream_ctr = 0;
    if (!a->keyed)
        return 0;
    if (!a->stream) {
        a->stream = mac_new();
        if (!a->stream || mac_key(a, a->stream, a->salt) != 0) {
            EVP_CIPHER_CTX_free(a->stream);
            a->stream = NULL;
            return 0;
        }
    }
    uint64_t ctr = ++a->counter;
    if (mac_start(a->stream, ctr) != 0)
        return 0;
    a->stream_ctr = ctr;
    a->stream_fed = 0;
    return ctr;
}

int cps__auth_stream_copy(cps__auth *a, uint64_t s, unsigned char *msg, size_t at, const void *src,
                          size_t n)
{
    if (s && s == a->stream_ctr && at >= a->stream_fed &&
        mac_update(a->stream, msg + a->stream_fed, at - a->stream_fed) == 0 &&
        copy_mac(a->stream, msg + at, n, (unsigned char *)src, 1) == 0) {
        a->stream_fed = at + n;
        return 0;
    }
    /* Not (or no longer) the stream: a plain copy, and the message is sealed whole at send. A
     * MAC that failed part way has copied part of src already; the rest is copied again. */
    if (s && s == a->stream_ctr)
        a->stream_ctr = 0;
    if (n)
        memcpy(msg + at, src, n);
    return -1;
}

int cps__auth_stream_seal(cps__auth *a, uint64_t s, unsigned char *msg, size_t len)
{
    if (!s || s != a->stream_ctr || len < a->stream_fed)
        return -1;
    a->stream_ctr = 0;
    unsigned char *t = msg + len;
    memcpy(t, a->salt, CPS_AUTH_SALT);
    cps__le64_put(t + CPS_AUTH_SALT, s);
    size_t fed = a->stream_fed;
    return mac_update(a->stream, msg + fed, len + CPS_AUTH_SALT + 8 - fed) == 0 &&
                   mac_finish(a->stream, t + CPS_AUTH_SALT + 8) == 0
               ? 0
               : -1;
}

static int all_zero(const unsigned char *p, size_t n)
{
    unsigned char acc = 0;
    for (size_t i = 0; i < n; i++)
        acc |= p[i];
    return acc == 0;
}

static int window_bit(const sender *s, uint64_t c)
{
    return (int)(s->seen[(c % REPLAY_WINDOW) / 64] >> (c % 64) & 1u);
}

static void window_set(sender *s, uint64_t c)
{
    s->seen[(c % REPLAY_WINDOW) / 64] |= 1ull << (c % 64);
}

/* Take counter c from s, or say why not. Only called once the tag is right, so a forger cannot
 * move the window. */
static int window_take(sender *s, uint64_t c)
{
    if (c > s->max) {
        if (c - s->max >= REPLAY_WINDOW) {
            memset(s->seen, 0, sizeof s->seen);
        } else {
            for (uint64_t x = s->max + 1; x < c; x++)
                s->seen[(x % REPLAY_WINDOW) / 64] &= ~(1ull << (x % 64));
        }
        s->max = c;
        window_set(s, c);
        return CPS_AUTH_OK;
    }
    if (s->max - c >= REPLAY_WINDOW)
        return CPS_AUTH_TOO_OLD;
    if (window_bit(s, c))
        return CPS_AUTH_REPLAY;
    window_set(s, c);
    return CPS_AUTH_OK;
}

int cps__auth_open_local(const unsigned char *msg, size_t len, size_t *body_len)
{
    if (len < CPS_AUTH_TRAILER)
        return CPS_AUTH_SHORT;
    size_t body = len - CPS_AUTH_TRAILER;
    *body_len = body;
    if (body >= 5 && cps__le32_get(msg) == CPS_WIRE_MAGIC && msg[4] != CPS_WIRE_VERSION)
        return CPS_AUTH_VERSION;
    return CPS_AUTH_OK;
}

int cps__auth_open_copy(cps__auth *a, const unsigned char *msg, size_t len, size_t *body_len,
                        size_t at, void *dst, size_t n)
{
    /* The header's version says which trailer the sender wrote (GMAC before version 4), so a
     * process of another version is told apart from a forger, keyed or not: without this its
     * messages would fail as wrong tags, or as bad headers further up. Unauthenticated, like
     * every refusal: it only picks the words of the log line. */
    int shape = cps__auth_open_local(msg, len, body_len);
    if (shape == CPS_AUTH_OK && (at > *body_len || n > *body_len - at))
        shape = CPS_AUTH_SHORT;
    if (shape != CPS_AUTH_OK)
        return shape;
    if (!a->keyed) {
        if (n)
            memcpy(dst, msg + at, n);
        return CPS_AUTH_OK;
    }
    size_t body = *body_len;
    const unsigned char *t = msg + body;
    uint64_t ctr = cps__le64_get(t + CPS_AUTH_SALT);
    if (ctr == 0 && all_zero(t, CPS_AUTH_SALT))
        return CPS_AUTH_UNSIGNED;

    sender *s = NULL;
    for (size_t i = 0; i < SENDERS_MAX && !s; i++)
        if (a->senders[i].live && memcmp(a->senders[i].salt, t, CPS_AUTH_SALT) == 0)
            s = &a->senders[i];
    /* A sender not in the table is checked with the spare context and only enters the table once
     * its tag is right, so forged salts cannot push real senders out. */
    EVP_CIPHER_CTX *c = s ? s->ctx : a->spare;
    if (!c || (!s && mac_key(a, c, t) != 0))
        return CPS_AUTH_NOMEM;
    unsigned char tag[CPS_AUTH_TAG];
    if (mac_copy(c, ctr, msg, body + CPS_AUTH_SALT + 8, at, n, dst, 0, tag) != 0)
        return CPS_AUTH_NOMEM;
    if (CRYPTO_memcmp(tag, t + CPS_AUTH_SALT + 8, CPS_AUTH_TAG) != 0)
        return CPS_AUTH_BAD_TAG;
    if (!s) {
        /* A new sender takes a free slot, else the one heard from least recently. */
        s = &a->senders[0];
        for (size_t i = 0; i < SENDERS_MAX && s->live; i++)
            if (!a->senders[i].live || a->senders[i].used < s->used)
                s = &a->senders[i];
        EVP_CIPHER_CTX *old = s->ctx;
        memset(s, 0, sizeof *s);
        memcpy(s->salt, t, CPS_AUTH_SALT);
        s->ctx = a->spare;
        s->live = 1;
        s->max = ctr;
        window_set(s, ctr);
        s->used = ++a->tick;
        /* Without a spare (out of memory) the next new sender gets CPS_AUTH_NOMEM. */
        a->spare = old ? old : mac_new();
        return CPS_AUTH_OK;
    }
    s->used = ++a->tick;
    return window_take(s, ctr);
}

int cps__auth_open(cps__auth *a, const unsigned char *msg, size_t len, size_t *body_len)
{
    return cps__auth_open_copy(a, msg, len, body_len, 0, NULL, 0);
}
