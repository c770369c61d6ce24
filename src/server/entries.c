/* Range entries: writing a SNAP chunk or a restore's records into the store, and checking a
 * restore's records before they are replicated. The format is in entries.h. */
#include "entries.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "core/log.h"
#include "optim/optim.h"

typedef struct install_io {
    cps__server *s;
    uint32_t range;
    const unsigned char *p;
    size_t len;
    int last;
    uint64_t seq, step;
    int have_range;
    uint64_t records;
} install_io;

static int install(cps__txn *txn, install_io *io)
{
    const unsigned char *p = io->p, *end = io->p + io->len;
    io->have_range = 0;
    io->records = 0;
    while (p < end) {
        if (end - p < 16)
            return CPS_EPROTO;
        uint32_t tag = cps__le32_get(p);
        int rc = 0;
        if (tag == ENT_PARAM) {
            if (end - p < 32 + CPS_WIRE_SPEC_SIZE)
                return CPS_EPROTO;
            cps__param_rec rec;
            memset(&rec, 0, sizeof rec);
            rec.len = cps__le32_get(p + 4);
            uint64_t key = cps__le64_get(p + 8);
            rec.opt_step = cps__le64_get(p + 16);
            uint32_t slots = cps__le32_get(p + 24);
            if (cps__wire_spec_decode(p + 32, &rec.spec) != 0 || rec.len == 0 ||
                slots != cps__optim_state_slots(rec.spec.opt_kind) ||
                key < io->s->view.ranges[io->range].lo || key > io->s->view.ranges[io->range].hi)
                return CPS_EPROTO;
            size_t data = (1 + (size_t)slots) * rec.len * sizeof(float);
            if ((size_t)(end - p) < 32 + CPS_WIRE_SPEC_SIZE + pad8(data))
                return CPS_EPROTO;
            rec.vals = (const float *)(const void *)(p + 32 + CPS_WIRE_SPEC_SIZE);
            rec.state = slots ? rec.vals + rec.len : NULL;
            rc = cps__store_param_put(txn, key, &rec);
            p += 32 + CPS_WIRE_SPEC_SIZE + pad8(data);
            io->records++;
        } else if (tag == ENT_DEDUP) {
            rc = cps__store_dedup_put(txn, io->range, cps__le32_get(p + 4), cps__le64_get(p + 8));
            p += 16;
        } else if (tag == ENT_NAMED) {
            size_t nlen = cps__le32_get(p + 4), vlen = cps__le32_get(p + 8);
            char name[64];
            char prefix[32];
            snprintf(prefix, sizeof prefix, "agg/%" PRIu32 "/", io->range);
            if (nlen == 0 || nlen >= sizeof name || vlen > 4096 ||
                (size_t)(end - p) < 16 + pad8(nlen) + pad8(vlen))
                return CPS_EPROTO;
            memcpy(name, p + 16, nlen);
            name[nlen] = 0;
            if (strncmp(name, prefix, strlen(prefix)) != 0)
                return CPS_EPROTO; /* only this range's aggregation records travel */
            rc = cps__store_meta_put(txn, name, p + 16 + pad8(nlen), vlen);
            p += 16 + pad8(nlen) + pad8(vlen);
        } else if (tag == ENT_CREATE) {
            cps__param_spec spec;
            uint32_t len = cps__le32_get(p + 4);
            uint64_t key = cps__le64_get(p + 8);
            if (end - p < 32 + CPS_WIRE_SPEC_SIZE || len == 0 || cps__le64_get(p + 24) != 0 ||
                cps__wire_spec_decode(p + 32, &spec) != 0 ||
                key < io->s->view.ranges[io->range].lo || key > io->s->view.ranges[io->range].hi)
                return CPS_EPROTO;
            rc = cps__store_param_reset(txn, key, len, cps__le64_get(p + 16), &spec);
            p += 32 + CPS_WIRE_SPEC_SIZE;
            io->records++;
        } else if (tag == ENT_SLICE) {
            if (end - p < 32)
                return CPS_EPROTO;
            uint64_t key = cps__le64_get(p + 8), n = cps__le64_get(p + 24);
            if (n > (uint64_t)(end - p - 32) / sizeof(float) ||
                (size_t)(end - p) < 32 + pad8(n * sizeof(float)))
                return CPS_EPROTO;
            rc = cps__store_param_write(txn, key, cps__le32_get(p + 4), cps__le64_get(p + 16),
                                        (const float *)(const void *)(p + 32), n);
            if (rc == CPS_ENOTFOUND || rc == CPS_ESIZE)
                rc = CPS_EPROTO; /* a slice of a record the message did not create */
            p += 32 + pad8(n * sizeof(float));
        } else if (tag == ENT_RANGE) {
            if (end - p < 24 || !io->last)
                return CPS_EPROTO;
            cps__range_meta m = {cps__le64_get(p + 8), cps__le64_get(p + 16)};
            rc = cps__store_range_put(txn, io->range, &m);
            io->seq = m.seq;
            io->step = m.step;
            io->have_range = 1;
            p += 24;
        } else {
            return CPS_EPROTO;
        }
        if (rc != 0)
            return rc;
    }
    return (io->last && !io->have_range) ? CPS_EPROTO : 0;
}

/* ---- checking a restore's records before they are replicated ---- */

typedef struct put_check {
    cps__server *s;
    uint32_t range;
    const unsigned char *p;
    size_t len;
    /* records created by this message: key, len, state slots */
    uint64_t *keys;
    uint32_t *lens, *slots;
    size_t n;
    char what[160];
} put_check;

static int check_fail(put_check *c, const char *fmt, uint64_t key)
{
    snprintf(c->what, sizeof c->what, fmt, (unsigned long long)key);
    return CPS_EPROTO;
}

static int put_check_txn(cps__txn *txn, void *arg)
{
    put_check *c = arg;
    const unsigned char *p = c->p, *end = c->p + c->len;
    const cps__range *rg = &c->s->view.ranges[c->range];
    while (p < end) {
        if (end - p < 16)
            return check_fail(c, "truncated entry%.0llu", 0);
        uint32_t tag = cps__le32_get(p);
        if (tag == ENT_CREATE) {
            cps__param_spec spec;
            uint64_t key = cps__le64_get(p + 8);
            uint32_t len = cps__le32_get(p + 4);
            if (end - p < 32 + CPS_WIRE_SPEC_SIZE || len == 0 || cps__le64_get(p + 24) != 0 ||
                cps__wire_spec_decode(p + 32, &spec) != 0)
                return check_fail(c, "malformed record for key %016llx", key);
            if (key < rg->lo || key > rg->hi)
                return check_fail(c, "key %016llx is outside the range", key);
            c->keys[c->n] = key;
            c->lens[c->n] = len;
            c->slots[c->n++] = (uint32_t)cps__optim_state_slots(spec.opt_kind);
            p += 32 + CPS_WIRE_SPEC_SIZE;
        } else if (tag == ENT_SLICE) {
            if (end - p < 32)
                return check_fail(c, "truncated slice%.0llu", 0);
            uint64_t key = cps__le64_get(p + 8), first = cps__le64_get(p + 16);
            uint64_t n = cps__le64_get(p + 24);
            uint32_t slot = cps__le32_get(p + 4);
            if (n > (uint64_t)(end - p - 32) / sizeof(float) ||
                (size_t)(end - p) < 32 + pad8(n * sizeof(float)))
                return check_fail(c, "slice of key %016llx longer than the message", key);
            uint32_t len = 0, slots = 0;
            int found = 0;
            for (size_t i = c->n; i-- > 0 && !found;)
                if (c->keys[i] == key)
                    found = 1, len = c->lens[i], slots = c->slots[i];
            if (!found) {
                cps__param_rec rec;
                if (cps__store_param_get(txn, key, &rec) != 0)
                    return check_fail(c, "slice of key %016llx, which does not exist", key);
                len = rec.len;
                slots = (uint32_t)cps__optim_state_slots(rec.spec.opt_kind);
            }
            if (slot > slots || first > len || n > len - first)
                return check_fail(c, "slice out of bounds of key %016llx", key);
            p += 32 + pad8(n * sizeof(float));
        } else if (tag == ENT_NAMED) {
            size_t nlen = cps__le32_get(p + 4), vlen = cps__le32_get(p + 8);
            char prefix[32];
            int pl = snprintf(prefix, sizeof prefix, "agg/%" PRIu32 "/", c->range);
            if (nlen == 0 || nlen >= 64 || vlen > 4096 ||
                (size_t)(end - p) < 16 + pad8(nlen) + pad8(vlen) ||
                memcmp(p + 16, prefix, (size_t)pl < nlen ? (size_t)pl : nlen) != 0 ||
                nlen <= (size_t)pl)
                return check_fail(c, "bad named value%.0llu", 0);
            p += 16 + pad8(nlen) + pad8(vlen);
        } else {
            return check_fail(c, "entry type %llu does not belong in a restore", tag);
        }
    }
    return 0;
}

int cps__server_check_put(cps__server *s, uint32_t range, const void *buf, size_t len, char *why,
                          size_t cap)
{
    size_t most = len / (32 + CPS_WIRE_SPEC_SIZE) + 1;
    put_check c = {s, range, buf, len, calloc(most, 8), calloc(most, 4), calloc(most, 4), 0, ""};
    int rc =
        c.keys && c.lens && c.slots ? cps__store_read(s->store, put_check_txn, &c) : CPS_ENOMEM;
    snprintf(why, cap, "%s", c.what[0] ? c.what : cps_strerror(rc));
    free(c.keys);
    free(c.lens);
    free(c.slots);
    return rc;
}

int cps__server_install_entries(cps__txn *txn, cps__server *s, uint32_t range, const void *buf,
                                size_t len, int last, uint64_t *seq)
{
    install_io io = {s, range, buf, len, last, 0, 0, 0, 0};
    int rc = install(txn, &io);
    if (seq)
        *seq = io.seq;
    return rc;
}
