/* Deterministic stand-in for libFuzzer, built with any compiler and run by CTest: feeds
 * LLVMFuzzerTestOneInput a corpus of valid messages of every payload kind, then seeded random
 * mutations of them (bit flips, byte stores, truncations, extensions, length fields that lie,
 * damage inside a payload that is then compressed). A failure is an abort naming the check; the
 * seed and iteration are printed first so it can be replayed.
 *
 * usage: fuzz_wire_replay [ITERATIONS [SEED]]
 *        fuzz_wire_replay --write-corpus DIR   (seed files for the libFuzzer target)
 */
#include "fuzz_wire.h"
#include "fuzz_rng.h"

#include <snappy-c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/entries.h"
#include "core/gradcodec.h"
#include "core/view.h"
#include "core/wire.h"
#include "replication/ring_fetch.h"
#include "transport/frame.h"
#include "transport/ring.h"

typedef struct seed {
    const char *name;
    uint8_t type;
    int compress;
    uint16_t flags;         /* header flags besides CPS_WF_SNAPPY (CPS_WF_LOSSY) */
    unsigned char *payload; /* raw (uncompressed) payload */
    size_t len;
} seed;

#define MAX_SEEDS 24
static seed seeds[MAX_SEEDS];
static int nseeds;

static size_t below(size_t n)
{
    return n ? (size_t)(rnd() % n) : 0;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "fuzz_wire_replay: out of memory\n");
        exit(2);
    }
    return p;
}

static void add_seed(const char *name, uint8_t type, int compress, void *payload, size_t len)
{
    seeds[nseeds++] = (seed){name, type, compress, 0, payload, len};
}

static void make_kv_seeds(void)
{
    uint64_t keys[5] = {3, 17, 1u << 20, (uint64_t)1 << 40, UINT64_MAX - 1};
    uint32_t lens[5] = {4, 1, 64, 7, 300};
    uint64_t nvals = 4 + 1 + 64 + 7 + 300;
    float *vals = xmalloc(nvals * 4);
    for (uint64_t i = 0; i < nvals; i++)
        vals[i] = (float)(i % 8) * 0.25f - 1.0f; /* repetitive: compresses */
    size_t n = cps__wire_kv_size(5, nvals);
    unsigned char *p = xmalloc(n);
    cps__wire_kv_encode(p, n, 5, keys, lens, vals, nvals);
    add_seed("push", CPS_MSG_PUSH, 0, p, n);
    unsigned char *q = xmalloc(n);
    memcpy(q, p, n);
    add_seed("push-snappy", CPS_MSG_PUSH, 1, q, n);

    n = cps__wire_kv_size(3, 0);
    p = xmalloc(n);
    cps__wire_kv_encode(p, n, 3, keys, lens, NULL, 0);
    add_seed("pull", CPS_MSG_PULL, 0, p, n);

    cps__param_spec s = {0};
    s.init_kind = CPS_W_INIT_NORMAL;
    s.init_b = 0.05f;
    s.init_seed = 42;
    s.opt_kind = CPS_W_OPT_ADAM;
    s.lr = 1e-3f;
    s.beta1 = 0.9f;
    s.beta2 = 0.999f;
    s.eps = 1e-8f;
    uint64_t offs[5] = {0, 4, 5, 69, 76};
    n = cps__wire_declare_size(5);
    p = xmalloc(n);
    cps__wire_declare_encode(p, n, 5, keys, lens, offs, &s);
    add_seed("declare", CPS_MSG_DECLARE, 0, p, n);
    free(vals);
}

/* Lossy pushes (CPS_WF_LOSSY): the keys of a kv payload, then a gradient codec block. */
static void make_lossy_seeds(void)
{
    static const struct {
        const char *name;
        const char *codec;
        uint8_t type;
        int compress;
    } kinds[] = {{"push-fp16", "fp16", CPS_MSG_PUSH, 0},
                 {"push-bf16-snappy", "bf16", CPS_MSG_PUSH, 1},
                 {"push-topk", "topk:0.05", CPS_MSG_PUSH, 0},
                 {"push_pull-topk-snappy", "topk:0.3", CPS_MSG_PUSH_PULL, 1}};
    uint64_t keys[3] = {8, 9, (uint64_t)1 << 33};
    uint32_t lens[3] = {5, 100, 20};
    uint64_t nvals = 125;
    for (size_t c = 0; c < sizeof kinds / sizeof *kinds; c++) {
        cps__gradcodec gc;
        if (cps__gradcodec_parse(kinds[c].codec, &gc) != 0)
            exit(2);
        float acc[125];
        for (uint64_t i = 0; i < nvals; i++)
            acc[i] = (float)((int)(i * 37 % 23) - 11) * 0.125f;
        size_t pre = cps__wire_kv_size(3, 0), blen = cps__gradcodec_size(&gc, nvals), used;
        unsigned char *p = xmalloc(pre + blen);
        cps__wire_kv_encode(p, pre, 3, keys, lens, NULL, 0);
        cps__le32_put(p + 4, (uint32_t)nvals);
        if (cps__gradcodec_encode(&gc, acc, nvals, p + pre, blen, &used, NULL) != 0)
            exit(2);
        add_seed(kinds[c].name, kinds[c].type, kinds[c].compress, p, pre + blen);
        seeds[nseeds - 1].flags = CPS_WF_LOSSY;
    }
}

static void make_view_seeds(void)
{
    cps__view v;
    cps__view_init(&v);
    v.epoch = 9;
    v.mode = CPS_MODE_SYNC;
    v.num_servers = 4;
    v.num_workers = 2;
    v.nnodes = 7;
    v.nodes = calloc(7, sizeof *v.nodes);
    uint32_t servers[4];
    for (uint32_t i = 0; i < 7; i++) {
        cps__node_info *n = &v.nodes[i];
        n->id = i == 0 ? 0 : (i <= 4 ? 10 + i : 100 + i);
        n->role = i == 0 ? CPS_ROLE_SCHEDULER : (i <= 4 ? CPS_ROLE_SERVER : CPS_ROLE_WORKER);
        n->alive = 1;
        n->rank = i == 0 ? 0 : (i <= 4 ? i - 1 : i - 5);
        snprintf(n->addr, CPS_ADDR_MAX, "tcp://127.0.0.1:%u", 7000 + i);
        if (i >= 1 && i <= 4)
            servers[i - 1] = n->id;
    }
    size_t n = cps__view_encoded_size(&v);
    unsigned char *p = xmalloc(n);
    cps__view_encode(&v, p, n);
    add_seed("welcome", CPS_MSG_WELCOME, 0, p, n);

    if (cps__view_place_ranges(&v, 6, servers, 4, 3) != 0)
        exit(2);
    n = cps__view_encoded_size(&v);
    p = xmalloc(n);
    cps__view_encode(&v, p, n);
    add_seed("view", CPS_MSG_VIEW, 0, p, n);
    unsigned char *q = xmalloc(n);
    memcpy(q, p, n);
    add_seed("view-snappy", CPS_MSG_VIEW, 1, q, n);

    /* STATUS_REPLY: the view, u32 count, then per node u32 id, u32 age_ms, stats block */
    size_t per = 8 + CPS_STATS_SIZE, sn = n + 4 + v.nnodes * per;
    unsigned char *r = xmalloc(sn);
    memcpy(r, p, n);
    cps__le32_put(r + n, v.nnodes);
    for (uint32_t i = 0; i < v.nnodes; i++) {
        cps__node_stats st = {i, 0, 1000 * i, 900 * i, 0, 3, 2, 50, 7 * i};
        unsigned char *e = r + n + 4 + i * per;
        cps__le32_put(e, v.nodes[i].id);
        cps__le32_put(e + 4, 250);
        cps__stats_encode(e + 8, &st);
    }
    add_seed("status-reply", CPS_MSG_STATUS_REPLY, 0, r, sn);
    cps__view_fini(&v);
}

static void make_other_seeds(void)
{
    unsigned char *p = xmalloc(64);
    size_t n = cps__hello_encode(p, 64, CPS_ROLE_WORKER, 1, 0, "tcp://10.1.2.3:5555");
    add_seed("hello", CPS_MSG_HELLO, 0, p, n);

    p = xmalloc(64);
    n = cps__hello_encode(p, 64, CPS_ROLE_SERVER, 0, 0, "tcp://10.1.2.5:7000");
    n = cps__hello_add_flags(p, 64, n, CPS_HELLO_EMPTY);
    add_seed("hello-empty", CPS_MSG_HELLO, 0, p, n);

    p = xmalloc(64);
    n = cps__hello_encode(p, 64, CPS_ROLE_NONE, UINT32_MAX, 0, "tcp://10.1.2.4:6000");
    add_seed("status", CPS_MSG_STATUS, 0, p, n);

    cps__node_stats st = {100, 2, 1 << 20, 1 << 18, 1 << 22, 77, 12, 1 << 16, 42};
    p = xmalloc(CPS_STATS_SIZE);
    cps__stats_encode(p, &st);
    add_seed("heartbeat", CPS_MSG_HEARTBEAT, 0, p, CPS_STATS_SIZE);

    const char *msg = "stale view epoch 3 < 4";
    p = xmalloc(strlen(msg));
    memcpy(p, msg, strlen(msg));
    add_seed("error", CPS_MSG_ERROR, 0, p, strlen(msg));
    add_seed("ack", CPS_MSG_ACK, 0, xmalloc(0), 0);

    cps__suspect_entry sus[3] = {{2, 1500}, {5, 1200}, {9, 4000}};
    p = xmalloc(cps__wire_suspects_size(3));
    n = cps__wire_suspects_encode(p, cps__wire_suspects_size(3), sus, 3);
    add_seed("suspect", CPS_MSG_SUSPECT, 0, p, n);

    /* A SNAP payload with one entry of each kind (core/entries.h). */
    cps__param_spec spec = {0};
    spec.lr = 0.1f;
    float v[6] = {1, 2, 3, 4, 5, 6};
    unsigned char step[8] = {7};
    size_t cap = cps__ent_param_size(3, 0) + CPS_ENT_DEDUP_SIZE + cps__ent_named_size(12, 8) +
                 CPS_ENT_CREATE_SIZE + cps__ent_slice_size(3) + CPS_ENT_RANGE_SIZE;
    p = xmalloc(cap);
    n = cps__ent_put_param(p, 40, 3, 9, &spec, 0, v, NULL);
    n += cps__ent_put_dedup(p + n, 2, 77);
    n += cps__ent_put_named(p + n, "agg/0/0123ab", 12, step, 8);
    n += cps__ent_put_create(p + n, 41, 3, 0, &spec);
    n += cps__ent_put_slice(p + n, 0, 41, 0, 3, v + 3);
    n += cps__ent_put_range(p + n, 12, 3);
    add_seed("snap", CPS_MSG_SNAP, 0, p, n);

    /* A part of a replacement's fetch answer (replication/ring_fetch.h): 3 values of 10. */
    cps__fetch_part fp = {.gen = 5, .off = 4, .count = 3, .total = 10, .last = 1};
    p = xmalloc(CPS_FETCH_PART_HDR + 3 * sizeof(float));
    cps__fetch_part_encode(p, &fp);
    memcpy(p + CPS_FETCH_PART_HDR, v, 3 * sizeof(float));
    add_seed("fetch-part", CPS_MSG_COLL, 0, p, CPS_FETCH_PART_HDR + 3 * sizeof(float));
}

/* Header + payload, compressed with snappy when the seed asks (whether or not it pays, so the
 * compressed path is always exercised). Returns a malloc'd message. */
static unsigned char *build(const seed *s, const unsigned char *payload, size_t len, size_t *out)
{
    cps__msg_hdr h = {0};
    h.type = s->type;
    h.sender = 3;
    h.status = s->type == CPS_MSG_ERROR ? -4 : 0;
    h.epoch = 5;
    h.req_worker = 1;
    h.req_seq = 99;
    h.step = 12;
    h.raw_len = (uint32_t)len;
    h.flags = s->flags;
    size_t cap = CPS_WIRE_HDR_SIZE + snappy_max_compressed_length(len);
    unsigned char *m = xmalloc(cap);
    size_t plen = len;
    if (s->compress && len > 0) {
        plen = cap - CPS_WIRE_HDR_SIZE;
        if (snappy_compress((const char *)payload, len, (char *)m + CPS_WIRE_HDR_SIZE, &plen) !=
            SNAPPY_OK)
            exit(2);
        h.flags |= CPS_WF_SNAPPY;
    } else {
        memcpy(m + CPS_WIRE_HDR_SIZE, payload, len);
    }
    h.payload_len = (uint32_t)plen;
    cps__wire_hdr_encode(m, &h);
    *out = CPS_WIRE_HDR_SIZE + plen;
    return m;
}

static uint32_t lie(uint32_t old)
{
    switch (below(9)) {
    case 0:
        return 0;
    case 1:
        return 1;
    case 2:
        return UINT32_MAX;
    case 3:
        return 0x80000000u;
    case 4:
        return 0x15555556u; /* 12 * this wraps 32 bits */
    case 5:
        return old + 1;
    case 6:
        return old - 1;
    case 7:
        return old * 2;
    default:
        return (uint32_t)rnd();
    }
}

/* Damage `b[0..*len)` (capacity `cap`) in one of several ways. `fields` lists offsets of u32
 * length/count fields worth lying in. */
static void mutate(unsigned char *b, size_t *len, size_t cap, const size_t *fields, int nfields)
{
    switch (below(6)) {
    case 0: /* bit flips */
        for (int k = 0, n = 1 + (int)below(8); k < n && *len; k++)
            b[below(*len)] ^= (unsigned char)(1u << below(8));
        break;
    case 1: { /* interesting byte */
        static const unsigned char v[] = {0, 0xff, 0x7f, 0x80, 0x01, 0x20};
        if (*len)
            b[below(*len)] = v[below(sizeof v)];
        break;
    }
    case 2: /* truncation */
        *len = below(*len + 1);
        break;
    case 3: { /* extension with junk or zeros */
        size_t add = 1 + below(16), zero = below(2);
        for (size_t i = 0; i < add && *len < cap; i++)
            b[(*len)++] = zero ? 0 : (unsigned char)rnd();
        break;
    }
    default: { /* a length or count field that lies */
        size_t off = fields[below((size_t)nfields)];
        if (off + 4 <= *len)
            cps__le32_put(b + off, lie(cps__le32_get(b + off)));
        break;
    }
    }
}

/* Length/count fields of a payload, by kind: where a lie hurts most. */
static int payload_fields(const seed *s, size_t *f)
{
    int n = 0;
    f[n++] = 0;
    f[n++] = 4;
    if (s->type == CPS_MSG_VIEW || s->type == CPS_MSG_WELCOME || s->type == CPS_MSG_STATUS_REPLY) {
        f[n++] = 28, f[n++] = 32, f[n++] = 36;
        f[n++] = 40 + 140 + 140 * below(6); /* a node's id in the middle of the list */
    }
    if (s->type == CPS_MSG_HELLO || s->type == CPS_MSG_STATUS)
        f[n++] = 12;
    if (s->type == CPS_MSG_SUSPECT)
        f[n++] = 8 + 8 * below(3) + 4 * below(2); /* a node or its unanswered time */
    if ((s->type == CPS_MSG_PUSH || s->type == CPS_MSG_DECLARE) && !s->flags)
        f[n++] = 8 + 5 * 8 + 4 * below(5); /* a len */
    if (s->type == CPS_MSG_COLL) {
        f[n++] = 8 + 4 * below(3); /* off, total, or their high halves */
        f[n++] = 16 + 4 * below(2);
        f[n++] = 24 + 4 * below(2); /* flags, reserved */
    }
    if (s->flags & CPS_WF_LOSSY) {
        f[n++] = 8 + 3 * 8 + 4 * below(3); /* a len */
        f[n++] = 48;                       /* the block's codec and count */
        f[n++] = 52;
        f[n++] = 56 + 4 * below(6); /* a top-k index */
    }
    return n;
}

static void one_case(const seed *s)
{
    size_t plen = s->len, cap = s->len + 64;
    unsigned char *pl = xmalloc(cap);
    memcpy(pl, s->payload, plen);
    size_t fields[8];
    int nf = payload_fields(s, fields);
    /* Damage inside the payload first, so that compressed seeds still reach the decoders. */
    if (below(3) == 0) {
        for (int k = 0, n = 1 + (int)below(3); k < n; k++)
            mutate(pl, &plen, cap, fields, nf);
    }
    size_t mlen;
    unsigned char *m = build(s, pl, plen, &mlen);
    if (below(2) == 0) {
        static const size_t hdr_fields[] = {48, 52, 48, 52, 0, 4, 12};
        size_t mcap = mlen + 32;
        unsigned char *big = xmalloc(mcap);
        memcpy(big, m, mlen);
        free(m);
        m = big;
        mutate(m, &mlen, mcap, hdr_fields, 7);
        /* Half the time make the header agree again with the damaged length, so the damage is
         * judged by the payload decoders rather than by the header check alone. */
        if (below(2) == 0 && mlen >= CPS_WIRE_HDR_SIZE) {
            uint32_t pl2 = (uint32_t)(mlen - CPS_WIRE_HDR_SIZE);
            cps__le32_put(m + 48, pl2);
            if (!(cps__le32_get(m + 6) & CPS_WF_SNAPPY))
                cps__le32_put(m + 52, pl2);
        }
    }
    /* An exact-size heap copy, so ASan sees any read past the message. */
    unsigned char *exact = xmalloc(mlen);
    memcpy(exact, m, mlen);
    LLVMFuzzerTestOneInput(exact, mlen);
    free(exact);
    free(m);
    free(pl);
}

/* A frame (transport/frame.h) of a random place in a random message, damaged half the time in
 * its header's fields (u32 halves of msg_id, total and offset) or anywhere. */
static void frame_case(void)
{
    size_t len = 1 + below(200), cap = CPS_FRAME_HDR + len + 32, flen = CPS_FRAME_HDR + len;
    unsigned char *f = xmalloc(cap);
    uint64_t total = len + below(1000), off = below(total - len + 1);
    cps__frame_encode_hdr(f, 1 + below(1000), total, off);
    for (size_t i = 0; i < len; i++)
        f[CPS_FRAME_HDR + i] = (unsigned char)rnd();
    if (below(2) == 0) {
        static const size_t fields[] = {8, 12, 16, 20, 24, 28, 4};
        mutate(f, &flen, cap, fields, 7);
    }
    unsigned char *exact = xmalloc(flen);
    memcpy(exact, f, flen);
    LLVMFuzzerTestOneInput(exact, flen);
    free(exact);
    free(f);
}

/* A ring descriptor (transport/ring.h) with fields near their limits, damaged half the time in
 * its fields' u32 halves, its version and pad bytes, or anywhere. */
static void ring_case(void)
{
    size_t cap = CPS_RING_DESC + 32, len = CPS_RING_DESC;
    unsigned char *b = xmalloc(cap);
    cps__ring_desc d = {rnd(), 1 + below(3), below(1u << 20) * 64, 1 + below(1u << 30),
                        1 + below(1000)};
    cps__ring_desc_encode(b, &d);
    if (below(2) == 0) {
        static const size_t fields[] = {8, 16, 20, 24, 28, 32, 36, 40, 44, 4, 5};
        mutate(b, &len, cap, fields, 11);
    }
    unsigned char *exact = xmalloc(len);
    memcpy(exact, b, len);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    free(b);
}

static int write_corpus(const char *dir)
{
    for (int i = 0; i < nseeds; i++) {
        char path[4096];
        size_t mlen;
        unsigned char *m = build(&seeds[i], seeds[i].payload, seeds[i].len, &mlen);
        snprintf(path, sizeof path, "%s/seed-%s", dir, seeds[i].name);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(m, 1, mlen, f) != mlen || fclose(f) != 0) {
            perror(path);
            return 1;
        }
        free(m);
    }
    printf("wrote %d seeds to %s\n", nseeds, dir);
    return 0;
}

int main(int argc, char **argv)
{
    make_kv_seeds();
    make_lossy_seeds();
    make_view_seeds();
    make_other_seeds();
    if (argc == 3 && strcmp(argv[1], "--write-corpus") == 0)
        return write_corpus(argv[2]);

    long iters = argc > 1 ? atol(argv[1]) : 200000;
    rng = argc > 2 ? strtoull(argv[2], NULL, 0) : 0x5eed5eed5eedull;
    if (rng == 0)
        rng = 1;
    printf("fuzz_wire_replay: %d seeds, %ld mutations, seed 0x%llx\n", nseeds, iters,
           (unsigned long long)rng);

    /* every seed must decode cleanly before we trust the mutations built on it */
    for (int i = 0; i < nseeds; i++) {
        size_t mlen;
        unsigned char *m = build(&seeds[i], seeds[i].payload, seeds[i].len, &mlen);
        uint64_t before = fuzz_wire_n.hdr_ok;
        LLVMFuzzerTestOneInput(m, mlen);
        if (fuzz_wire_n.hdr_ok != before + 1) {
            fprintf(stderr, "seed %s does not decode\n", seeds[i].name);
            return 1;
        }
        free(m);
    }
    fuzz_wire_counts base = fuzz_wire_n;
    if (base.kv_ok < 3 || base.declare_ok != 1 || base.view_ok != 3 || base.hello_ok != 3 ||
        base.lossy_ok != 4 || base.suspects_ok < 1 || base.entries_ok < 6 || base.part_ok < 1) {
        fprintf(stderr, "seeds did not reach their decoders\n");
        return 1;
    }
    for (long it = 0; it < iters; it++) {
        size_t pick = below(16);
        if (pick < 2)
            frame_case();
        else if (pick == 2)
            ring_case();
        else
            one_case(&seeds[below((size_t)nseeds)]);
    }
    if (fuzz_wire_n.frame_ok == 0) {
        fprintf(stderr, "no frame reached the frame decoder\n");
        return 1;
    }
    if (fuzz_wire_n.ring_ok == 0) {
        fprintf(stderr, "no ring descriptor reached its decoder\n");
        return 1;
    }

    fuzz_wire_counts c = fuzz_wire_n;
    printf("inputs %llu: header ok %llu, snappy ok %llu, kv ok %llu, declare ok %llu, "
           "view ok %llu (as prefix %llu), hello ok %llu, spec ok %llu, lossy ok %llu, suspects ok "
           "%llu, frames ok %llu, range entries ok %llu, ring descriptors ok %llu, fetch parts ok "
           "%llu (taken %llu)\n",
           (unsigned long long)c.inputs, (unsigned long long)c.hdr_ok,
           (unsigned long long)c.snappy_ok, (unsigned long long)c.kv_ok,
           (unsigned long long)c.declare_ok, (unsigned long long)c.view_ok,
           (unsigned long long)c.view_prefix_ok, (unsigned long long)c.hello_ok,
           (unsigned long long)c.spec_ok, (unsigned long long)c.lossy_ok,
           (unsigned long long)c.suspects_ok, (unsigned long long)c.frame_ok,
           (unsigned long long)c.entries_ok, (unsigned long long)c.ring_ok,
           (unsigned long long)c.part_ok, (unsigned long long)c.part_taken);
    for (int i = 0; i < nseeds; i++)
        free(seeds[i].payload);
    if (fuzz_wire_n.part_taken == 0) {
        fprintf(stderr, "no fetch part was taken and split\n");
        return 1;
    }
    return 0;
}
