/* Fuzz target for everything that parses bytes from the network: header, snappy payload, kv,
 * lossy push (keys + gradient codec block), DECLARE, view, hello, spec, stats and checkpoint note
 * decoders, the range entries of SNAP and PUT payloads (core/entries.h), the frames of
 * large messages (transport/frame.h), the descriptors of shared-memory rings
 * (transport/ring.h) and the parts of a replacement's fetch answer (replication/ring_fetch.h).
 *
 * Beyond "no crash, no sanitizer report", it checks that every accepted input is canonical:
 * re-encoding what a decoder accepted must give back the very same bytes. A decoder that
 * accepts two encodings of one value (e.g. ignores a padding byte) would let replicas that
 * compare bytes disagree, so that is a bug too. */
#include "fuzz_wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "core/codec.h"
#include "core/entries.h"
#include "core/gradcodec.h"
#include "core/view.h"
#include "core/wire.h"
#include "replication/ring_fetch.h"
#include "transport/frame.h"
#include "transport/ring.h"

fuzz_wire_counts fuzz_wire_n;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz_wire: check failed at %s:%d: %s\n", __FILE__, __LINE__, #cond);  \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static int is_error(int rc)
{
    return rc == CPS_EPROTO || rc == CPS_ESIZE;
}

/* Re-encodes with `enc_len` bytes into a fresh buffer and compares with the accepted input. */
static void check_same(const unsigned char *in, size_t len, const unsigned char *re, size_t re_len)
{
    CHECK(re_len == len);
    CHECK(memcmp(in, re, len) == 0);
}

static void fuzz_kv(const unsigned char *b, size_t len)
{
    cps__kv kv;
    for (int need = -1; need <= 1; need++) {
        int rc = cps__wire_kv_decode(b, len, need, &kv);
        if (rc) {
            CHECK(is_error(rc));
            continue;
        }
        CHECK(need == -1 || (need == 1) == (kv.nvals != 0));
        if (need != -1)
            continue;
        fuzz_wire_n.kv_ok++;
        size_t n = cps__wire_kv_size(kv.nkeys, kv.nvals);
        unsigned char *re = malloc(n);
        CHECK(re);
        size_t got = cps__wire_kv_encode(re, n, kv.nkeys, kv.keys, kv.lens, kv.vals, kv.nvals);
        check_same(b, len, re, got);
        free(re);
    }
}

/* A lossy push (CPS_WF_LOSSY): the keys part, then the codec block decoded into exactly nvals
 * floats (an exact-size heap buffer, so ASan sees a write past it). An accepted 16-bit block is
 * canonical: every value but a NaN converts back to its bits. An accepted top-k block leaves
 * zeros everywhere but at its indices. */
static void fuzz_lossy(const unsigned char *b, size_t len)
{
    cps__kv kv;
    const void *blk;
    size_t blen;
    int rc = cps__wire_kv_decode_lossy(b, len, &kv, &blk, &blen);
    if (rc) {
        CHECK(is_error(rc));
        return;
    }
    CHECK(kv.nvals > 0 && blen > 0 && (const unsigned char *)blk + blen == b + len);
    if (kv.nvals > (1u << 22))
        return; /* a real head refuses what it cannot hold; keep the fuzzer fast */
    float *out = malloc(kv.nvals * sizeof *out);
    CHECK(out);
    rc = cps__gradcodec_decode(blk, blen, kv.nvals, out);
    if (rc) {
        CHECK(is_error(rc));
        free(out);
        return;
    }
    fuzz_wire_n.lossy_ok++;
    const unsigned char *d = (const unsigned char *)blk + CPS_GC_HDR_SIZE;
    uint32_t kind = ((const unsigned char *)blk)[0];
    if (kind == CPS_GC_FP16 || kind == CPS_GC_BF16) {
        CHECK(blen == CPS_GC_HDR_SIZE + 2 * kv.nvals);
        for (uint64_t i = 0; i < kv.nvals; i++) {
            uint16_t h = (uint16_t)(d[2 * i] | d[2 * i + 1] << 8);
            if (out[i] != out[i])
                continue;
            CHECK((kind == CPS_GC_FP16 ? cps__f32_to_f16(out[i]) : cps__f32_to_bf16(out[i])) == h);
        }
    } else {
        CHECK(kind == CPS_GC_TOPK);
        uint64_t k = cps__le32_get((const unsigned char *)blk + 4), j = 0;
        CHECK(k >= 1 && k <= kv.nvals && blen == CPS_GC_HDR_SIZE + 8 * k);
        for (uint64_t i = 0; i < kv.nvals; i++) {
            if (j < k && cps__le32_get(d + 4 * j) == i)
                j++;
            else
                CHECK(out[i] == 0);
        }
        CHECK(j == k);
    }
    free(out);
}

static void fuzz_declare(const unsigned char *b, size_t len)
{
    cps__kv kv;
    const uint64_t *offs;
    cps__param_spec spec;
    int rc = cps__wire_declare_decode(b, len, &kv, &offs, &spec);
    if (rc) {
        CHECK(is_error(rc));
        return;
    }
    fuzz_wire_n.declare_ok++;
    CHECK(kv.nvals == 0);
    size_t n = cps__wire_declare_size(kv.nkeys);
    unsigned char *re = malloc(n);
    CHECK(re);
    size_t got = cps__wire_declare_encode(re, n, kv.nkeys, kv.keys, kv.lens, offs, &spec);
    check_same(b, len, re, got);
    free(re);
}

/* The prefix decoder must agree with the exact one on the bytes it says it used. */
static void fuzz_view_prefix(const unsigned char *b, size_t len)
{
    cps__view v, w;
    size_t used = 0;
    cps__view_init(&v);
    int rc = cps__view_decode_prefix(b, len, &v, &used);
    if (rc) {
        CHECK(is_error(rc));
        return;
    }
    fuzz_wire_n.view_prefix_ok++;
    CHECK(used <= len);
    cps__view_init(&w);
    CHECK(cps__view_decode(b, used, &w) == 0);
    CHECK(w.nnodes == v.nnodes && w.nranges == v.nranges && w.epoch == v.epoch);
    cps__view_fini(&w);
    cps__view_fini(&v);
}

static void fuzz_view(const unsigned char *b, size_t len)
{
    cps__view v;
    fuzz_view_prefix(b, len);
    cps__view_init(&v);
    int rc = cps__view_decode(b, len, &v);
    if (rc) {
        CHECK(is_error(rc));
        CHECK(v.nodes == NULL && v.ranges == NULL);
        return;
    }
    fuzz_wire_n.view_ok++;
    if (v.nranges) {
        /* every key maps to a range that holds it */
        CHECK(cps__view_range_of(&v, 0) == 0);
        CHECK(cps__view_range_of(&v, UINT64_MAX) == v.nranges - 1);
        for (uint32_t r = 0; r < v.nranges; r++) {
            CHECK(cps__view_range_of(&v, v.ranges[r].lo) == r);
            CHECK(cps__view_range_of(&v, v.ranges[r].hi) == r);
            for (uint32_t k = 0; k < v.ranges[r].chain_len; k++)
                CHECK(cps__view_node(&v, v.ranges[r].chain[k]) != NULL);
        }
    }
    size_t n = cps__view_encoded_size(&v);
    unsigned char *re = malloc(n);
    CHECK(re);
    check_same(b, len, re, cps__view_encode(&v, re, n));
    free(re);

    cps__view copy;
    cps__view_init(&copy);
    CHECK(cps__view_copy(&copy, &v) == 0);
    CHECK(copy.nnodes == v.nnodes && copy.nranges == v.nranges);
    cps__view_fini(&copy);
    cps__view_fini(&v);
}

static void fuzz_hello(const unsigned char *b, size_t len)
{
    uint32_t role, rank, prev, flags;
    char addr[CPS_ADDR_MAX];
    int rc = cps__hello_decode(b, len, &role, &rank, &prev, addr, &flags);
    if (rc) {
        CHECK(is_error(rc));
        return;
    }
    fuzz_wire_n.hello_ok++;
    CHECK(memchr(addr, 0, CPS_ADDR_MAX) != NULL);
    unsigned char re[20 + CPS_ADDR_MAX];
    size_t n = cps__hello_encode(re, sizeof re, role, rank, prev, addr);
    check_same(b, len, re, cps__hello_add_flags(re, sizeof re, n, flags));
}

/* Tensor descriptions (REGISTER, REGISTRY): a run of them, each re-encoding to its bytes. */
static void fuzz_tensor_desc(const unsigned char *b, size_t len)
{
    size_t off = 0, used;
    cps__tensor_desc d;
    while (off < len) {
        int rc = cps__wire_tensor_desc_decode(b + off, len - off, &d, &used);
        if (rc) {
            CHECK(rc == CPS_EPROTO || rc == CPS_ESIZE);
            return;
        }
        CHECK(used > 0 && used <= len - off && strlen(d.name) > 0);
        unsigned char re[512];
        check_same(b + off, used, re, cps__wire_tensor_desc_encode(re, sizeof re, &d));
        off += used;
    }
}

/* A checkpoint note (CKPT_DONE, the tail of STATUS_REPLY, the scheduler's sched/ckpt). */
static void fuzz_ckpt_note(const unsigned char *b, size_t len)
{
    cps__ckpt_note n;
    size_t used = 0;
    int rc = cps__ckpt_note_decode(b, len, &n, &used);
    if (rc) {
        CHECK(rc == CPS_EPROTO || rc == CPS_ESIZE);
        return;
    }
    CHECK(used > CPS_CKPT_NOTE_FIXED && used <= len &&
          strlen(n.path) == used - CPS_CKPT_NOTE_FIXED);
    unsigned char re[CPS_CKPT_NOTE_FIXED + CPS_CKPT_NOTE_PATH_MAX];
    check_same(b, used, re, cps__ckpt_note_encode(re, sizeof re, &n));
}

/* A suspect list (SUSPECT): canonical, nodes increasing. */
static void fuzz_suspects(const unsigned char *b, size_t len)
{
    cps__suspect_entry e[CPS_SUSPECT_MAX];
    uint32_t n = 0;
    int rc = cps__wire_suspects_decode(b, len, e, &n);
    if (rc) {
        CHECK(is_error(rc));
        return;
    }
    fuzz_wire_n.suspects_ok++;
    CHECK(n >= 1 && n <= CPS_SUSPECT_MAX);
    for (uint32_t i = 1; i < n; i++)
        CHECK(e[i].node > e[i - 1].node);
    unsigned char re[8 + 8 * CPS_SUSPECT_MAX];
    check_same(b, len, re, cps__wire_suspects_encode(re, sizeof re, e, n));
}

static void fuzz_fixed(const unsigned char *b, size_t len)
{
    unsigned char re[CPS_WIRE_SPEC_SIZE > CPS_STATS_SIZE ? CPS_WIRE_SPEC_SIZE : CPS_STATS_SIZE];
    if (len < CPS_WIRE_SPEC_SIZE)
        return;
    /* A DECLARE ends with its spec block: decode the tail, where damage to it lands. */
    const unsigned char *tail = b + len - CPS_WIRE_SPEC_SIZE;
    cps__param_spec spec;
    int rc = cps__wire_spec_decode(tail, &spec);
    if (rc == 0) {
        fuzz_wire_n.spec_ok++;
        cps__wire_spec_encode(re, &spec);
        CHECK(memcmp(re, tail, CPS_WIRE_SPEC_SIZE) == 0);
    } else {
        CHECK(rc == CPS_EPROTO);
    }
    if (len < CPS_STATS_SIZE)
        return;
    cps__node_stats st;
    cps__stats_decode(b, &st);
    cps__stats_encode(re, &st);
    CHECK(memcmp(re, b, CPS_STATS_SIZE) == 0);
}

/* Our compressor on fuzzed bytes: whatever it keeps must come back intact. */
static void fuzz_codec(const unsigned char *b, size_t len)
{
    if (len < CPS_CODEC_MIN_BYTES)
        return;
    size_t cap = cps__codec_bound(len);
    unsigned char *c = malloc(cap), *back = malloc(len);
    CHECK(c && back);
    size_t clen = cps__codec_compress(b, len, c, cap);
    if (clen) {
        CHECK(clen * 100 <= (uint64_t)len * CPS_CODEC_KEEP_PCT);
        CHECK(cps__codec_decompress(c, clen, back, len) == 0);
        CHECK(memcmp(back, b, len) == 0);
    }
    free(c);
    free(back);
}

/* A frame of a large message (transport/frame.h): accepted only within its message, and
 * canonical (its header re-encodes to the same bytes). */
static void fuzz_frame(const unsigned char *b, size_t len)
{
    cps__frame fr;
    int rc = cps__frame_decode(b, len, &fr);
    if (rc) {
        CHECK(rc == CPS_EPROTO);
        return;
    }
    fuzz_wire_n.frame_ok++;
    CHECK(cps__frame_is(b, len));
    CHECK(fr.msg_id > 0 && fr.len > 0 && fr.offset < fr.total && fr.len <= fr.total - fr.offset);
    CHECK(fr.total <= (uint64_t)CPS_WIRE_HDR_SIZE + CPS_WIRE_MAX_PAYLOAD);
    CHECK(fr.data == b + CPS_FRAME_HDR && fr.len == len - CPS_FRAME_HDR);
    unsigned char re[CPS_FRAME_HDR];
    cps__frame_encode_hdr(re, fr.msg_id, fr.total, fr.offset);
    CHECK(memcmp(re, b, CPS_FRAME_HDR) == 0);
}

/* A shared-memory ring's descriptor (transport/ring.h): accepted only with its fields in their
 * limits, and canonical. */
static void fuzz_ring_desc(const unsigned char *b, size_t len)
{
    cps__ring_desc d;
    int why = -1;
    int rc = cps__ring_desc_decode(b, len, &d, &why);
    if (rc) {
        CHECK(rc == CPS_EPROTO && why == CPS_RING_MALFORMED);
        return;
    }
    fuzz_wire_n.ring_ok++;
    CHECK(why == CPS_RING_OK && len == CPS_RING_DESC && cps__ring_desc_is(b, len));
    CHECK(d.gen && d.seq && d.len && d.offset % 64 == 0);
    CHECK(d.len <= (uint64_t)CPS_WIRE_HDR_SIZE + CPS_WIRE_MAX_PAYLOAD);
    unsigned char re[CPS_RING_DESC];
    cps__ring_desc_encode(re, &d);
    CHECK(memcmp(re, b, CPS_RING_DESC) == 0);
}

/* The payload read as a part of a fetch answer: accepted only with its values inside its answer,
 * and canonical. */
/* The decoded part through the asker's path, as the shell's on_part: wanted (only then the
 * result buffer is sized by the part's total), taken, split into the state and the result, with
 * every copy inside its buffer. `sel` (header bits) picks the asker's length, sender and
 * request. */
static void fuzz_fetch_take(const cps__fetch_part *p, const float *vals, uint64_t sel)
{
    enum { SMALL = 4096 };
    /* The choices vary with the part as well as the header: a mutation of either moves them. */
    sel ^= (p->gen + p->off * 3 + p->count * 5 + p->total * 7) * 0x9e3779b97f4a7c15ull;
    sel ^= sel >> 29;
    /* Mostly a length the answer can hold (the part is then looked at), sometimes any. */
    uint64_t most = p->total < 64 ? p->total : 64;
    uint64_t len = 1 + sel % ((sel >> 14) % 8 ? most : 64), cap = 0;
    cps__fetch f = {0};
    cps__fetch_start(&f, len, 0, 1000);
    f.from = 7;
    f.req0 = 5;
    f.req = 6;
    f.sent = 1;
    uint32_t from = (sel >> 6) % 4 ? 7 : 8;
    uint64_t req = 4 + (sel >> 8) % 3; /* 4: a request to another sharer */
    int status = (sel >> 10) % 8 ? 0 : CPS_ENOTFOUND;
    if ((sel >> 13) % 4) {
        /* Mid-assembly: the parts before this one taken already. */
        f.has_id = 1;
        f.id_req = 5;
        f.gen = p->gen;
        f.step = p->step;
        f.next = p->next;
        f.total = p->total;
        f.have = p->off;
    }
    float state[64];
    float *res = NULL;
    if (status == 0 && cps__fetch_part_wanted(&f, from, req, p) && p->total > len) {
        cap = p->total - len;
        CHECK(cap < (1ull << 32));
        if (cap <= SMALL) {
            res = malloc(cap * sizeof(float));
            CHECK(res);
        }
    }
    for (int twice = 0; twice < 2; twice++) {
        if (!cps__fetch_part_take(&f, from, req, status, p, 1))
            continue;
        fuzz_wire_n.part_taken++;
        CHECK(status == 0 && cps__fetch_part_wanted(&f, from, req, p) == !f.answered);
        uint64_t nstate, roff;
        cps__fetch_part_split(p->off, p->count, len, &nstate, &roff);
        CHECK(nstate <= p->count);
        CHECK(nstate == 0 || p->off + nstate <= len);
        CHECK(nstate == p->count || roff + (p->count - nstate) <= cap);
        if (nstate)
            memcpy(state + p->off, vals, nstate * sizeof(float));
        if (res)
            memcpy(res + roff, vals + nstate, (p->count - nstate) * sizeof(float));
    }
    free(res);
}

static void fuzz_fetch_part(const unsigned char *b, size_t len, uint64_t step, uint64_t next,
                            uint64_t sel)
{
    cps__fetch_part p;
    const float *vals = NULL;
    int rc = cps__fetch_part_decode(b, len, step, next, &p, &vals);
    if (rc) {
        CHECK(rc == CPS_EPROTO);
        return;
    }
    fuzz_wire_n.part_ok++;
    CHECK(p.count > 0 && p.off <= p.total && p.count <= p.total - p.off);
    CHECK(p.step == step && p.next == next);
    CHECK((const unsigned char *)vals == b + CPS_FETCH_PART_HDR &&
          len == CPS_FETCH_PART_HDR + p.count * sizeof(float));
    unsigned char re[CPS_FETCH_PART_HDR];
    cps__fetch_part_encode(re, &p);
    CHECK(memcmp(re, b, CPS_FETCH_PART_HDR) == 0);
    fuzz_fetch_take(&p, vals, sel);
}

/* The payload read as a run of range entries (a SNAP's, or a PUT's after its header): every
 * accepted entry is canonical, its writer giving back the very bytes. */
static void fuzz_entries(const unsigned char *b, size_t len)
{
    size_t off = 0;
    while (off < len) {
        cps__ent e;
        int rc = cps__ent_next(b + off, len - off, &e);
        if (rc) {
            CHECK(rc == CPS_EPROTO);
            return;
        }
        CHECK(e.size > 0 && e.size % 8 == 0 && e.size <= len - off);
        fuzz_wire_n.entries_ok++;
        unsigned char *re = malloc(e.size);
        CHECK(re);
        size_t n = 0;
        switch (e.tag) {
        case CPS_ENT_PARAM:
            n = cps__ent_put_param(re, e.key, e.len, e.opt_step, &e.spec, e.slots, e.vals,
                                   e.vals + e.len);
            break;
        case CPS_ENT_DEDUP:
            n = cps__ent_put_dedup(re, e.worker, e.seq);
            break;
        case CPS_ENT_NAMED:
            n = cps__ent_put_named(re, e.name, e.name_len, e.value, e.value_len);
            break;
        case CPS_ENT_RANGE:
            n = cps__ent_put_range(re, e.seq, e.step);
            break;
        case CPS_ENT_CREATE:
            n = cps__ent_put_create(re, e.key, e.len, e.opt_step, &e.spec);
            break;
        case CPS_ENT_SLICE:
            n = cps__ent_put_slice(re, e.slot, e.key, e.first, e.n, e.vals);
            break;
        default:
            CHECK(0);
        }
        check_same(b + off, e.size, re, n);
        free(re);
        off += e.size;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cps__msg_hdr h;
    unsigned char re[CPS_WIRE_HDR_SIZE];

    fuzz_wire_n.inputs++;
    fuzz_frame(data, size);
    fuzz_ring_desc(data, size);
    int rc = cps__wire_hdr_decode(data, size, &h);
    if (rc) {
        CHECK(is_error(rc));
        return 0;
    }
    fuzz_wire_n.hdr_ok++;
    cps__wire_hdr_encode(re, &h);
    CHECK(memcmp(re, data, CPS_WIRE_HDR_SIZE) == 0);

    /* Decoders want an 8-byte aligned payload, as the transport's buffers are; malloc's is. A
     * buffer of exactly raw_len bytes lets ASan see any write past it. */
    size_t plen = h.raw_len;
    unsigned char *p = malloc(plen ? plen : 1);
    CHECK(p);
    if (h.flags & CPS_WF_SNAPPY) {
        rc = cps__codec_decompress(data + CPS_WIRE_HDR_SIZE, h.payload_len, p, plen);
        if (rc) {
            CHECK(rc == CPS_ECORRUPT);
            free(p);
            return 0;
        }
        fuzz_wire_n.snappy_ok++;
    } else {
        memcpy(p, data + CPS_WIRE_HDR_SIZE, plen);
    }
    fuzz_kv(p, plen);
    fuzz_lossy(p, plen);
    fuzz_declare(p, plen);
    fuzz_view(p, plen);
    fuzz_hello(p, plen);
    fuzz_tensor_desc(p, plen);
    fuzz_ckpt_note(p, plen);
    fuzz_suspects(p, plen);
    fuzz_fixed(p, plen);
    fuzz_codec(p, plen);
    fuzz_entries(p, plen);
    fuzz_fetch_part(p, plen, h.step, h.aux, h.req_seq ^ h.epoch);
    free(p);
    return 0;
}
