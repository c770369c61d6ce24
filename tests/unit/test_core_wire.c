#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "core/wire.h"

/* Decoders require 8-byte alignment; a static aligned arena keeps every test honest about it. */
static _Alignas(8) unsigned char arena[1 << 16];

static cps__msg_hdr sample_hdr(void)
{
    cps__msg_hdr h = {0};
    h.type = CPS_MSG_PUSH;
    h.flags = CPS_WF_REPLY;
    h.sender = 7;
    h.status = CPS_ESTALE_EPOCH;
    h.epoch = 0x0102030405060708ull;
    h.req_worker = 3;
    h.range = 11;
    h.req_seq = 0xfffffffffffffff0ull;
    h.step = 42;
    h.payload_len = 16;
    h.raw_len = 16;
    h.aux = 0xdeadbeefcafef00dull;
    return h;
}

/* ---- header ---- */

static void hdr_round_trip(void **state)
{
    (void)state;
    cps__msg_hdr h = sample_hdr(), g;
    cps__wire_hdr_encode(arena, &h);
    assert_int_equal(cps__le32_get(arena), CPS_WIRE_MAGIC);
    assert_int_equal(arena[4], CPS_WIRE_VERSION);
    assert_int_equal(cps__le64_get(arena + 16), h.epoch);
    assert_int_equal(cps__le32_get(arena + 48), 16);
    assert_int_equal(cps__wire_hdr_decode(arena, 64 + 16, &g), 0);
    assert_int_equal(g.version, CPS_WIRE_VERSION);
    assert_int_equal(g.type, h.type);
    assert_int_equal(g.flags, h.flags);
    assert_int_equal(g.sender, h.sender);
    assert_int_equal(g.status, h.status);
    assert_true(g.epoch == h.epoch && g.req_seq == h.req_seq && g.aux == h.aux);
    assert_int_equal(g.req_worker, 3);
    assert_int_equal(g.range, 11);
    assert_int_equal(g.step, 42);
    assert_int_equal(g.payload_len, 16);
    assert_int_equal(g.raw_len, 16);
}

static void hdr_every_known_type_accepted(void **state)
{
    (void)state;
    for (int t = 0; t < 256; t++) {
        cps__msg_hdr h = sample_hdr(), g;
        h.type = (uint8_t)t;
        h.payload_len = h.raw_len = 0;
        cps__wire_hdr_encode(arena, &h);
        int known =
            /* 28..34: chain and state transfer; 35..43: checkpoints; 44..45: data-path
             * failure evidence; 46: drain; 47: collectives among workers; 48: a worker's
             * local tensors for a checkpoint */
            (t >= 1 && t <= 11) || (t >= 20 && t <= 48);
        assert_int_equal(cps__wire_hdr_decode(arena, 64, &g), known ? 0 : CPS_EPROTO);
    }
}

/* SUSPECT payloads: round trip; a list that is empty, too long, unordered, with a zero time or
 * a non-zero pad, or of the wrong length, is refused. */
static void suspects_round_trip_and_refusals(void **state)
{
    (void)state;
    cps__suspect_entry in[2] = {{3, 1600}, {9, 2}}, out[CPS_SUSPECT_MAX];
    unsigned char b[8 + 8 * (CPS_SUSPECT_MAX + 1)];
    uint32_t n = 0;
    size_t len = cps__wire_suspects_encode(b, sizeof b, in, 2);
    assert_int_equal(len, 24);
    assert_int_equal(cps__wire_suspects_decode(b, len, out, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(out[0].node, 3);
    assert_int_equal(out[1].unanswered_ms, 2);
    assert_int_equal(cps__wire_suspects_decode(b, len - 1, out, &n), CPS_ESIZE);
    assert_int_equal(cps__wire_suspects_decode(b, 7, out, &n), CPS_ESIZE);
    assert_int_equal(cps__wire_suspects_encode(b, 23, in, 2), 0);
    assert_int_equal(cps__wire_suspects_encode(b, sizeof b, in, 0), 0);
    cps__suspect_entry swapped[2] = {{9, 5}, {3, 5}}, dup[2] = {{3, 5}, {3, 5}}, zero[1] = {{3, 0}};
    cps__wire_suspects_encode(b, sizeof b, swapped, 2);
    assert_int_equal(cps__wire_suspects_decode(b, 24, out, &n), CPS_EPROTO);
    cps__wire_suspects_encode(b, sizeof b, dup, 2);
    assert_int_equal(cps__wire_suspects_decode(b, 24, out, &n), CPS_EPROTO);
    cps__wire_suspects_encode(b, sizeof b, zero, 1);
    assert_int_equal(cps__wire_suspects_decode(b, 16, out, &n), CPS_EPROTO);
    cps__wire_suspects_encode(b, sizeof b, in, 2);
    b[5] = 1; /* the pad */
    assert_int_equal(cps__wire_suspects_decode(b, 24, out, &n), CPS_EPROTO);
    cps__le32_put(b, CPS_SUSPECT_MAX + 1);
    b[5] = 0;
    assert_int_equal(cps__wire_suspects_decode(b, sizeof b, out, &n), CPS_EPROTO);
    cps__le32_put(b, 0);
    assert_int_equal(cps__wire_suspects_decode(b, 8, out, &n), CPS_EPROTO);
}

static int decode_mutated(size_t off, uint8_t byte, size_t len)
{
    cps__msg_hdr h = sample_hdr(), g;
    cps__wire_hdr_encode(arena, &h);
    arena[off] = byte;
    return cps__wire_hdr_decode(arena, len, &g);
}

static void hdr_bad_fields(void **state)
{
    (void)state;
    assert_int_equal(decode_mutated(0, 'X', 80), CPS_EPROTO); /* magic */
    assert_int_equal(decode_mutated(3, 0x32, 80), CPS_EPROTO);
    assert_int_equal(decode_mutated(4, 0, 80), CPS_EPROTO); /* version */
    assert_int_equal(decode_mutated(4, 1, 80), CPS_EPROTO); /* FNV-1a key layout */
    assert_int_equal(decode_mutated(4, CPS_WIRE_VERSION + 1, 80), CPS_EPROTO);
    /* every flag bit is either known (accepted) or refused */
    for (int bit = 0; bit < 16; bit++) {
        cps__msg_hdr h = sample_hdr(), g;
        h.flags = (uint16_t)(1u << bit);
        cps__wire_hdr_encode(arena, &h);
        /* CPS_WF_LATE: only on a reply (below) */
        int want = (h.flags & CPS_WF_KNOWN_) && h.flags != CPS_WF_LATE ? 0 : CPS_EPROTO;
        assert_int_equal(cps__wire_hdr_decode(arena, 80, &g), want);
    }
    /* A late push's answer: an ACK or VALUES reply, nothing else */
    static const uint8_t late_types[] = {CPS_MSG_ACK, CPS_MSG_VALUES, CPS_MSG_PUSH, CPS_MSG_PULL};
    for (size_t i = 0; i < sizeof late_types; i++)
        for (int reply = 0; reply < 2; reply++) {
            cps__msg_hdr h = sample_hdr(), g;
            h.type = late_types[i];
            h.flags = (uint16_t)(CPS_WF_LATE | (reply ? CPS_WF_REPLY : 0));
            cps__wire_hdr_encode(arena, &h);
            assert_int_equal(cps__wire_hdr_decode(arena, 80, &g), reply && i < 2 ? 0 : CPS_EPROTO);
        }
    assert_int_equal(decode_mutated(7, 0x80, 80), CPS_EPROTO);
    assert_int_equal(decode_mutated(15, 0x00, 80), CPS_EPROTO); /* status > 0 */

    cps__msg_hdr h = sample_hdr(), g;
    assert_int_equal(cps__wire_hdr_decode(NULL, 80, &g), CPS_EINVAL);
    cps__wire_hdr_encode(arena, &h);
    assert_int_equal(cps__wire_hdr_decode(arena, 80, NULL), CPS_EINVAL);
}

static void hdr_bad_lengths(void **state)
{
    (void)state;
    cps__msg_hdr h = sample_hdr(), g;
    cps__wire_hdr_encode(arena, &h);
    for (size_t len = 0; len < 64; len++)
        assert_int_equal(cps__wire_hdr_decode(arena, len, &g), CPS_ESIZE);
    assert_int_equal(cps__wire_hdr_decode(arena, 79, &g), CPS_ESIZE); /* truncated payload */
    assert_int_equal(cps__wire_hdr_decode(arena, 81, &g), CPS_ESIZE); /* trailing bytes */
    assert_int_equal(cps__wire_hdr_decode(arena, 64, &g), CPS_ESIZE);

    /* The decoder reads only the header, so a lying `len` can stand for a huge message. */
    h.payload_len = h.raw_len = CPS_WIRE_MAX_PAYLOAD + 1u;
    cps__wire_hdr_encode(arena, &h);
    assert_int_equal(cps__wire_hdr_decode(arena, 64 + (size_t)CPS_WIRE_MAX_PAYLOAD + 1, &g),
                     CPS_ESIZE);
    h.payload_len = h.raw_len = CPS_WIRE_MAX_PAYLOAD;
    cps__wire_hdr_encode(arena, &h);
    assert_int_equal(cps__wire_hdr_decode(arena, 64 + (size_t)CPS_WIRE_MAX_PAYLOAD, &g), 0);

    /* raw_len must equal payload_len when not compressed */
    h = sample_hdr();
    h.raw_len = 17;
    cps__wire_hdr_encode(arena, &h);
    assert_int_equal(cps__wire_hdr_decode(arena, 80, &g), CPS_ESIZE);
}

static void hdr_snappy_raw_len(void **state)
{
    (void)state;
    cps__msg_hdr h = sample_hdr(), g;
    h.flags = CPS_WF_SNAPPY;
    h.payload_len = 100;
    uint32_t cases[][2] = {{0, CPS_ESIZE},
                           {1, 0},
                           {100, 0},
                           {2200, 0},
                           {2201, CPS_ESIZE}, /* no snappy stream expands that much */
                           {CPS_WIRE_MAX_PAYLOAD + 1u, CPS_ESIZE},
                           {UINT32_MAX, CPS_ESIZE}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        h.raw_len = cases[i][0];
        cps__wire_hdr_encode(arena, &h);
        assert_int_equal(cps__wire_hdr_decode(arena, 164, &g), (int)cases[i][1]);
    }
    h.raw_len = 5000;
    h.payload_len = 1000;
    cps__wire_hdr_encode(arena, &h);
    assert_int_equal(cps__wire_hdr_decode(arena, 1064, &g), 0);
    assert_int_equal(g.raw_len, 5000);
    assert_int_equal(g.flags, CPS_WF_SNAPPY);
}

/* ---- kv ---- */

static const uint64_t K3[] = {1, 1000, UINT64_MAX};
static const uint32_t L3[] = {2, 1, 3};
static const float V6[] = {1.5f, -2.0f, 0.0f, 3.25f, -0.0f, 1e30f};

static void kv_round_trip_with_values(void **state)
{
    (void)state;
    size_t n = cps__wire_kv_size(3, 6);
    assert_int_equal(n, 8 + 24 + 12 + 4 + 24); /* 44 padded to 48, then 6 floats */
    assert_int_equal(cps__wire_kv_encode(arena, sizeof arena, 3, K3, L3, V6, 6), n);
    cps__kv kv;
    assert_int_equal(cps__wire_kv_decode(arena, n, 1, &kv), 0);
    assert_int_equal(kv.nkeys, 3);
    assert_int_equal(kv.nvals, 6);
    assert_memory_equal(kv.keys, K3, sizeof K3);
    assert_memory_equal(kv.lens, L3, sizeof L3);
    assert_memory_equal(kv.vals, V6, sizeof V6);
    assert_ptr_equal(kv.keys, arena + 8);
    assert_ptr_equal(kv.vals, arena + 48);
    assert_int_equal(cps__wire_kv_decode(arena, n, -1, &kv), 0);
    assert_int_equal(cps__wire_kv_decode(arena, n, 0, &kv), CPS_EPROTO);
}

static void kv_round_trip_without_values(void **state)
{
    (void)state;
    for (uint32_t nk = 1; nk <= 9; nk++) {
        uint64_t keys[9];
        uint32_t lens[9];
        for (uint32_t i = 0; i < nk; i++)
            keys[i] = (uint64_t)i * 77 + 5, lens[i] = i + 1;
        size_t n = cps__wire_kv_size(nk, 0);
        assert_int_equal(n % 8, 0);
        assert_int_equal(cps__wire_kv_encode(arena, n, nk, keys, lens, NULL, 0), n);
        cps__kv kv;
        assert_int_equal(cps__wire_kv_decode(arena, n, 0, &kv), 0);
        assert_int_equal(kv.nkeys, nk);
        assert_int_equal(kv.nvals, 0);
        assert_null(kv.vals);
        assert_memory_equal(kv.keys, keys, nk * 8);
        assert_memory_equal(kv.lens, lens, nk * 4);
        assert_int_equal(cps__wire_kv_decode(arena, n, -1, &kv), 0);
        assert_int_equal(cps__wire_kv_decode(arena, n, 1, &kv), CPS_EPROTO);
    }
}

static void kv_encode_limits(void **state)
{
    (void)state;
    size_t n = cps__wire_kv_size(3, 6);
    assert_int_equal(cps__wire_kv_encode(arena, n - 1, 3, K3, L3, V6, 6), 0);
    assert_int_equal(cps__wire_kv_encode(arena, n, 3, K3, L3, NULL, 6), 0);
    assert_true(cps__wire_kv_size(1, (uint64_t)UINT32_MAX + 1) == SIZE_MAX);
    assert_int_equal(
        cps__wire_kv_encode(arena, sizeof arena, 1, K3, L3, V6, (uint64_t)UINT32_MAX + 1), 0);
}

static size_t enc3(void)
{
    return cps__wire_kv_encode(arena, sizeof arena, 3, K3, L3, V6, 6);
}

static void kv_bad_arguments(void **state)
{
    (void)state;
    cps__kv kv;
    size_t n = enc3();
    assert_int_equal(cps__wire_kv_decode(arena, n, 2, &kv), CPS_EINVAL);
    assert_int_equal(cps__wire_kv_decode(NULL, n, 1, &kv), CPS_EINVAL);
    assert_int_equal(cps__wire_kv_decode(arena, n, 1, NULL), CPS_EINVAL);
    memmove(arena + 4, arena, n);
    assert_int_equal(cps__wire_kv_decode(arena + 4, n, 1, &kv), CPS_EINVAL); /* misaligned */
}

static void kv_protocol_errors(void **state)
{
    (void)state;
    cps__kv kv;
    size_t n;

    n = enc3();
    cps__le32_put(arena, 0); /* nkeys 0 */
    assert_int_equal(cps__wire_kv_decode(arena, n, 1, &kv), CPS_EPROTO);

    n = enc3();
    cps__le64_put(arena + 8 + 8, 0); /* keys 1, 0, MAX: unsorted */
    assert_int_equal(cps__wire_kv_decode(arena, n, 1, &kv), CPS_EPROTO);

    n = enc3();
    cps__le64_put(arena + 8 + 8, 1); /* duplicate key */
    assert_int_equal(cps__wire_kv_decode(arena, n, 1, &kv), CPS_EPROTO);

    /* zero len (nvals kept equal to the sum so only the zero is wrong) */
    uint32_t lz[] = {2, 0, 4};
    n = cps__wire_kv_encode(arena, sizeof arena, 3, K3, lz, V6, 6);
    assert_int_equal(cps__wire_kv_decode(arena, n, 1, &kv), CPS_EPROTO);

    n = enc3();
    arena[47] = 1; /* padding after lens */
    assert_int_equal(cps__wire_kv_decode(arena, n, 1, &kv), CPS_EPROTO);
    n = enc3();
    arena[44] = 0x80;
    assert_int_equal(cps__wire_kv_decode(arena, n, 1, &kv), CPS_EPROTO);
}

/* CPS_WF_LOSSY: only on pushes; the keys part as a kv payload's, the block after the padding. */
static void lossy_push(void **state)
{
    (void)state;
    cps__msg_hdr h = sample_hdr(), g;
    h.flags = CPS_WF_LOSSY;
    static const uint8_t types[] = {CPS_MSG_PUSH,   CPS_MSG_PUSH_PULL, CPS_MSG_PULL,
                                    CPS_MSG_VALUES, CPS_MSG_FWD,       CPS_MSG_DECLARE};
    for (size_t i = 0; i < sizeof types; i++) {
        h.type = types[i];
        cps__wire_hdr_encode(arena, &h);
        assert_int_equal(cps__wire_hdr_decode(arena, 80, &g), i < 2 ? 0 : CPS_EPROTO);
    }
    uint64_t keys[3] = {4, 9, 11};
    uint32_t lens[3] = {3, 1, 1};
    size_t pre = cps__wire_kv_size(3, 0); /* 8 + 24 + 12, padded to 48 */
    memset(arena, 0, pre + 16);
    cps__wire_kv_encode(arena, pre, 3, keys, lens, NULL, 0);
    cps__le32_put(arena + 4, 5);
    memset(arena + pre, 0xab, 12);
    cps__kv kv;
    const void *blk;
    size_t blen;
    assert_int_equal(cps__wire_kv_decode_lossy(arena, pre + 12, &kv, &blk, &blen), 0);
    assert_int_equal(kv.nkeys, 3);
    assert_int_equal(kv.nvals, 5);
    assert_null(kv.vals);
    assert_ptr_equal(blk, arena + pre);
    assert_int_equal(blen, 12);
    /* Not a plain kv payload (12 bytes are not 5 floats), and the reverse. */
    assert_int_equal(cps__wire_kv_decode(arena, pre + 12, 1, &kv), CPS_ESIZE);
    assert_int_equal(cps__wire_kv_decode_lossy(arena, pre, &kv, &blk, &blen), CPS_ESIZE);
    cps__le32_put(arena + 4, 6); /* nvals != sum of lens */
    assert_int_equal(cps__wire_kv_decode_lossy(arena, pre + 12, &kv, &blk, &blen), CPS_ESIZE);
    cps__le32_put(arena + 4, 0); /* a lossy push stands for values */
    assert_int_equal(cps__wire_kv_decode_lossy(arena, pre + 12, &kv, &blk, &blen), CPS_EPROTO);
    cps__le32_put(arena + 4, 5);
    arena[pre - 1] = 1; /* padding */
    assert_int_equal(cps__wire_kv_decode_lossy(arena, pre + 12, &kv, &blk, &blen), CPS_EPROTO);
    arena[pre - 1] = 0;
    assert_int_equal(cps__wire_kv_decode_lossy(arena + 4, pre + 8, &kv, &blk, &blen), CPS_EINVAL);
    assert_int_equal(cps__wire_kv_decode_lossy(arena, 4, &kv, &blk, &blen), CPS_ESIZE);
}

static void kv_size_errors(void **state)
{
    (void)state;
    cps__kv kv;
    size_t n = enc3();
    for (size_t len = 0; len < n; len++)
        assert_int_equal(cps__wire_kv_decode(arena, len, -1, &kv), CPS_ESIZE);
    assert_int_equal(cps__wire_kv_decode(arena, n + 4, 1, &kv), CPS_ESIZE);
    assert_int_equal(cps__wire_kv_decode(arena, n + 8, 1, &kv), CPS_ESIZE);

    cps__le32_put(arena + 4, 5); /* nvals lies (sum of lens is 6), length consistent */
    assert_int_equal(cps__wire_kv_decode(arena, n - 4, 1, &kv), CPS_ESIZE);
    n = enc3();
    cps__le32_put(arena + 4, UINT32_MAX); /* nvals lies about the length */
    assert_int_equal(cps__wire_kv_decode(arena, n, 1, &kv), CPS_ESIZE);
    n = enc3();
    cps__le32_put(arena, UINT32_MAX); /* nkeys lies: 12*nkeys must not wrap */
    assert_int_equal(cps__wire_kv_decode(arena, n, 1, &kv), CPS_ESIZE);
    cps__le32_put(arena, 0x15555556u); /* 12*n wraps 32 bits to a small number */
    assert_int_equal(cps__wire_kv_decode(arena, n, 1, &kv), CPS_ESIZE);

    /* one key larger than any message can carry */
    uint64_t k = 9;
    uint32_t big = CPS_WIRE_MAX_PAYLOAD / 4 + 1;
    n = cps__wire_kv_encode(arena, sizeof arena, 1, &k, &big, NULL, 0);
    assert_int_equal(cps__wire_kv_decode(arena, n, 0, &kv), CPS_ESIZE);
    big--;
    n = cps__wire_kv_encode(arena, sizeof arena, 1, &k, &big, NULL, 0);
    assert_int_equal(cps__wire_kv_decode(arena, n, 0, &kv), 0);
    assert_int_equal(cps__wire_kv_decode(arena, (size_t)CPS_WIRE_MAX_PAYLOAD + 8, 0, &kv),
                     CPS_ESIZE);
}

/* ---- spec ---- */

static cps__param_spec good_spec(uint32_t opt)
{
    cps__param_spec s = {0};
    s.init_kind = CPS_W_INIT_UNIFORM;
    s.init_a = -0.1f;
    s.init_b = 0.1f;
    s.init_seed = 0x123456789abcdef0ull;
    s.opt_kind = opt;
    s.lr = 0.01f;
    s.weight_decay = 1e-4f;
    s.momentum = 0.9f;
    s.nesterov = opt == CPS_W_OPT_MOMENTUM;
    s.beta1 = 0.9f;
    s.beta2 = 0.999f;
    s.eps = 1e-8f;
    s.rho = 0.9f;
    return s;
}

/* Field by field: the struct has padding that memcmp would read. */
static void assert_spec_equal(const cps__param_spec *a, const cps__param_spec *b)
{
    assert_int_equal(a->init_kind, b->init_kind);
    assert_int_equal(a->opt_kind, b->opt_kind);
    assert_int_equal(a->nesterov, b->nesterov);
    assert_true(a->init_seed == b->init_seed);
    const float fa[] = {a->init_a, a->init_b, a->lr,  a->weight_decay, a->momentum,
                        a->beta1,  a->beta2,  a->eps, a->rho};
    const float fb[] = {b->init_a, b->init_b, b->lr,  b->weight_decay, b->momentum,
                        b->beta1,  b->beta2,  b->eps, b->rho};
    assert_memory_equal(fa, fb, sizeof fa);
}

static void spec_round_trip(void **state)
{
    (void)state;
    for (uint32_t opt = 0; opt <= CPS_W_OPT_RMSPROP; opt++) {
        cps__param_spec s = good_spec(opt), g;
        memset(arena, 0xaa, 64);
        cps__wire_spec_encode(arena, &s);
        assert_int_equal(cps__wire_spec_decode(arena, &g), 0);
        assert_spec_equal(&g, &s);
    }
    /* Hyper-parameters the optimizer does not use may be left zero. */
    cps__param_spec s = {0}, g;
    s.lr = 0.5f;
    s.init_kind = CPS_W_INIT_CONSTANT;
    s.init_a = 3.0f;
    cps__wire_spec_encode(arena, &s);
    assert_int_equal(cps__wire_spec_decode(arena, &g), 0);
    assert_true(g.init_a == 3.0f && g.lr == 0.5f);
    s.init_kind = CPS_W_INIT_NORMAL;
    s.init_b = 0.0f;
    cps__wire_spec_encode(arena, &s);
    assert_int_equal(cps__wire_spec_decode(arena, &g), 0);
}

#define BAD_SPEC(opt, field, value)                                                                \
    do {                                                                                           \
        cps__param_spec s_ = good_spec(opt), g_;                                                   \
        s_.field = (value);                                                                        \
        cps__wire_spec_encode(arena, &s_);                                                         \
        assert_int_equal(cps__wire_spec_decode(arena, &g_), CPS_EPROTO);                           \
    } while (0)

static void spec_bad_hyper_parameters(void **state)
{
    (void)state;
    BAD_SPEC(CPS_W_OPT_SGD, init_kind, 4);
    BAD_SPEC(CPS_W_OPT_SGD, opt_kind, 5);
    BAD_SPEC(CPS_W_OPT_SGD, lr, 0.0f);
    BAD_SPEC(CPS_W_OPT_SGD, lr, -1.0f);
    BAD_SPEC(CPS_W_OPT_SGD, lr, NAN);
    BAD_SPEC(CPS_W_OPT_SGD, lr, INFINITY);
    BAD_SPEC(CPS_W_OPT_SGD, weight_decay, -1e-6f);
    BAD_SPEC(CPS_W_OPT_SGD, init_a, NAN);
    BAD_SPEC(CPS_W_OPT_SGD, init_b, -0.1f); /* uniform low == high */
    BAD_SPEC(CPS_W_OPT_SGD, init_b, -1.0f); /* uniform low > high */
    BAD_SPEC(CPS_W_OPT_SGD, nesterov, 1);   /* nesterov without momentum */
    BAD_SPEC(CPS_W_OPT_MOMENTUM, nesterov, 2);
    BAD_SPEC(CPS_W_OPT_MOMENTUM, momentum, 1.0f);
    BAD_SPEC(CPS_W_OPT_MOMENTUM, momentum, -0.1f);
    BAD_SPEC(CPS_W_OPT_ADAM, beta1, 0.0f);
    BAD_SPEC(CPS_W_OPT_ADAM, beta1, 1.0f);
    BAD_SPEC(CPS_W_OPT_ADAM, beta2, 1.5f);
    BAD_SPEC(CPS_W_OPT_ADAM, eps, 0.0f);
    BAD_SPEC(CPS_W_OPT_ADAGRAD, eps, -1.0f);
    BAD_SPEC(CPS_W_OPT_RMSPROP, rho, 1.0f);
    BAD_SPEC(CPS_W_OPT_RMSPROP, rho, 0.0f);
    BAD_SPEC(CPS_W_OPT_RMSPROP, eps, NAN);
    /* unused by SGD, but neither zero nor valid: the ends disagree */
    BAD_SPEC(CPS_W_OPT_SGD, beta1, 5.0f);
    BAD_SPEC(CPS_W_OPT_SGD, rho, -1.0f);
    BAD_SPEC(CPS_W_OPT_SGD, momentum, NAN);

    cps__param_spec s = good_spec(CPS_W_OPT_SGD), g;
    s.init_kind = CPS_W_INIT_NORMAL;
    s.init_b = -1.0f; /* negative stddev */
    cps__wire_spec_encode(arena, &s);
    assert_int_equal(cps__wire_spec_decode(arena, &g), CPS_EPROTO);

    s = good_spec(CPS_W_OPT_SGD);
    cps__wire_spec_encode(arena, &s);
    arena[60] = 1; /* reserved */
    assert_int_equal(cps__wire_spec_decode(arena, &g), CPS_EPROTO);
    assert_int_equal(cps__wire_spec_decode(NULL, &g), CPS_EINVAL);
}

/* ---- DECLARE ---- */

static const uint64_t OFF3[] = {0, 2, 3};

static size_t enc_declare(const cps__param_spec *s)
{
    return cps__wire_declare_encode(arena, sizeof arena, 3, K3, L3, OFF3, s);
}

static void declare_round_trip(void **state)
{
    (void)state;
    cps__param_spec s = good_spec(CPS_W_OPT_ADAM), g;
    size_t n = enc_declare(&s);
    assert_int_equal(n, cps__wire_declare_size(3));
    assert_int_equal(n, 48 + 24 + 64);
    cps__kv kv;
    const uint64_t *offs;
    assert_int_equal(cps__wire_declare_decode(arena, n, &kv, &offs, &g), 0);
    assert_int_equal(kv.nkeys, 3);
    assert_int_equal(kv.nvals, 0);
    assert_memory_equal(kv.keys, K3, sizeof K3);
    assert_memory_equal(kv.lens, L3, sizeof L3);
    assert_memory_equal(offs, OFF3, sizeof OFF3);
    assert_spec_equal(&g, &s);
    assert_int_equal(cps__wire_declare_encode(arena, n - 1, 3, K3, L3, OFF3, &s), 0);
}

static void declare_errors(void **state)
{
    (void)state;
    cps__param_spec s = good_spec(CPS_W_OPT_SGD), g;
    cps__kv kv;
    const uint64_t *offs;
    size_t n = enc_declare(&s);

    for (size_t len = 0; len < n; len += 3)
        assert_int_equal(cps__wire_declare_decode(arena, len, &kv, &offs, &g), CPS_ESIZE);
    assert_int_equal(cps__wire_declare_decode(arena, n + 8, &kv, &offs, &g), CPS_ESIZE);
    assert_int_equal(cps__wire_declare_decode(arena + 8, n, &kv, &offs, &g), CPS_ESIZE);
    assert_int_equal(cps__wire_declare_decode(arena + 1, n, &kv, &offs, &g), CPS_EINVAL);

    cps__le32_put(arena + 4, 6); /* values are not allowed in a DECLARE */
    assert_int_equal(cps__wire_declare_decode(arena, n, &kv, &offs, &g), CPS_ESIZE);

    n = enc_declare(&s);
    cps__le32_put(arena, 0);
    assert_int_equal(cps__wire_declare_decode(arena, n, &kv, &offs, &g), CPS_EPROTO);

    n = enc_declare(&s);
    cps__le64_put(arena + 8, 2000); /* unsorted */
    assert_int_equal(cps__wire_declare_decode(arena, n, &kv, &offs, &g), CPS_EPROTO);

    n = enc_declare(&s);
    cps__le64_put(arena + 48 + 16, UINT64_MAX - 2); /* offset + len 3 runs past 2^64-1 */
    assert_int_equal(cps__wire_declare_decode(arena, n, &kv, &offs, &g), CPS_EPROTO);
    cps__le64_put(arena + 48 + 16, UINT64_MAX - 3);
    assert_int_equal(cps__wire_declare_decode(arena, n, &kv, &offs, &g), 0);

    s.lr = -1.0f;
    n = enc_declare(&s);
    assert_int_equal(cps__wire_declare_decode(arena, n, &kv, &offs, &g), CPS_EPROTO);
}

static void tensor_desc_round_trip_and_errors(void **state)
{
    (void)state;
    cps__tensor_desc d = {.kind = 1, .cols = 8, .length = 80, .rows = 10};
    d.spec.opt_kind = CPS_W_OPT_ADAM;
    d.spec.lr = 0.01f;
    d.spec.beta1 = 0.9f;
    d.spec.beta2 = 0.999f;
    d.spec.eps = 1e-8f;
    snprintf(d.name, sizeof d.name, "emb/table");
    unsigned char buf[512];
    size_t n = cps__wire_tensor_desc_encode(buf, sizeof buf, &d);
    assert_int_equal(n, cps__wire_tensor_desc_size(&d));
    assert_int_equal(n % 8, 0);
    cps__tensor_desc g;
    size_t used;
    assert_int_equal(cps__wire_tensor_desc_decode(buf, n, &g, &used), 0);
    assert_int_equal(used, n);
    assert_string_equal(g.name, "emb/table");
    assert_int_equal(g.rows, 10);
    assert_int_equal(g.cols, 8);
    assert_int_equal(g.spec.opt_kind, CPS_W_OPT_ADAM);
    /* Every truncation is refused. */
    for (size_t k = 0; k < n; k++)
        assert_int_not_equal(cps__wire_tensor_desc_decode(buf, k, &g, &used), 0);
    /* A table whose shape does not multiply out, a dense tensor with rows, an empty name. */
    unsigned char bad[512];
    memcpy(bad, buf, n);
    cps__le64_put(bad + 8, 81);
    assert_int_equal(cps__wire_tensor_desc_decode(bad, n, &g, &used), CPS_EPROTO);
    memcpy(bad, buf, n);
    cps__le32_put(bad, 0);
    assert_int_equal(cps__wire_tensor_desc_decode(bad, n, &g, &used), CPS_EPROTO);
    memcpy(bad, buf, n);
    cps__le32_put(bad + 32 + CPS_WIRE_SPEC_SIZE, 0);
    assert_int_equal(cps__wire_tensor_desc_decode(bad, n, &g, &used), CPS_EPROTO);
    /* A NUL inside the name. */
    memcpy(bad, buf, n);
    bad[32 + CPS_WIRE_SPEC_SIZE + 8 + 3] = 0;
    assert_int_equal(cps__wire_tensor_desc_decode(bad, n, &g, &used), CPS_EPROTO);
}

/* A shape travels after the name; it must multiply out to the length, have no zero dimension,
 * and, for a table, be [rows, cols]. A description without one (ndim 0) still decodes. */
static void tensor_desc_shape(void **state)
{
    (void)state;
    cps__tensor_desc d = {.kind = 0, .length = 2 * 3 * 5 * 7, .ndim = 4, .dims = {2, 3, 5, 7}};
    d.spec.lr = 0.1f;
    snprintf(d.name, sizeof d.name, "conv1.weight");
    unsigned char buf[512], bad[512];
    size_t n = cps__wire_tensor_desc_encode(buf, sizeof buf, &d), used;
    assert_int_equal(n, cps__wire_tensor_desc_size(&d));
    assert_int_equal(n, 32 + CPS_WIRE_SPEC_SIZE + 8 + 16 + 4 * 8);
    cps__tensor_desc g;
    assert_int_equal(cps__wire_tensor_desc_decode(buf, n, &g, &used), 0);
    assert_int_equal(used, n);
    assert_int_equal(g.ndim, 4);
    assert_memory_equal(g.dims, d.dims, 4 * sizeof *d.dims);
    uint64_t dims[CPS_MAX_NDIM];
    assert_int_equal(cps__tensor_desc_shape(&g, dims), 4);
    assert_int_equal(dims[3], 7);
    for (size_t k = 0; k < n; k++)
        assert_int_not_equal(cps__wire_tensor_desc_decode(buf, k, &g, &used), 0);
    size_t dims_at = n - 4 * 8;
    memcpy(bad, buf, n); /* the product is not the length */
    cps__le64_put(bad + dims_at + 8, 4);
    assert_int_equal(cps__wire_tensor_desc_decode(bad, n, &g, &used), CPS_EPROTO);
    memcpy(bad, buf, n); /* a zero dimension */
    cps__le64_put(bad + dims_at, 0);
    assert_int_equal(cps__wire_tensor_desc_decode(bad, n, &g, &used), CPS_EPROTO);
    memcpy(bad, buf, n); /* too many dimensions */
    cps__le32_put(bad + 36 + CPS_WIRE_SPEC_SIZE, CPS_MAX_NDIM + 1);
    assert_int_not_equal(cps__wire_tensor_desc_decode(bad, sizeof bad, &g, &used), 0);
    /* No shape recorded: dense [length]. */
    d.ndim = 0;
    n = cps__wire_tensor_desc_encode(buf, sizeof buf, &d);
    assert_int_equal(cps__wire_tensor_desc_decode(buf, n, &g, &used), 0);
    assert_int_equal(cps__tensor_desc_shape(&g, dims), 1);
    assert_int_equal(dims[0], d.length);
    /* A table's shape is [rows, cols]; [cols, rows] is refused. */
    cps__tensor_desc t = {.kind = 1, .cols = 4, .length = 12, .rows = 3, .ndim = 2, .dims = {3, 4}};
    t.spec.lr = 0.1f;
    snprintf(t.name, sizeof t.name, "emb");
    n = cps__wire_tensor_desc_encode(buf, sizeof buf, &t);
    assert_int_equal(cps__wire_tensor_desc_decode(buf, n, &g, &used), 0);
    t.dims[0] = 4;
    t.dims[1] = 3;
    n = cps__wire_tensor_desc_encode(buf, sizeof buf, &t);
    assert_int_equal(cps__wire_tensor_desc_decode(buf, n, &g, &used), CPS_EPROTO);
    assert_int_equal(cps__shape_matches(2, t.dims, 12), 1);
    assert_int_equal(cps__shape_matches(0, t.dims, 12), 0);
    uint64_t huge[2] = {UINT64_C(1) << 40, UINT64_C(1) << 40};
    assert_int_equal(cps__shape_matches(2, huge, 0), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hdr_round_trip),
        cmocka_unit_test(hdr_every_known_type_accepted),
        cmocka_unit_test(suspects_round_trip_and_refusals),
        cmocka_unit_test(tensor_desc_round_trip_and_errors),
        cmocka_unit_test(tensor_desc_shape),
        cmocka_unit_test(hdr_bad_fields),
        cmocka_unit_test(hdr_bad_lengths),
        cmocka_unit_test(hdr_snappy_raw_len),
        cmocka_unit_test(kv_round_trip_with_values),
        cmocka_unit_test(kv_round_trip_without_values),
        cmocka_unit_test(kv_encode_limits),
        cmocka_unit_test(kv_bad_arguments),
        cmocka_unit_test(kv_protocol_errors),
        cmocka_unit_test(kv_size_errors),
        cmocka_unit_test(lossy_push),
        cmocka_unit_test(spec_round_trip),
        cmocka_unit_test(spec_bad_hyper_parameters),
        cmocka_unit_test(declare_round_trip),
        cmocka_unit_test(declare_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
