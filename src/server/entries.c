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

/* A named value that may travel with `range`: only that range's aggregation records
 * ("agg/<range>/<key set>"), a name of at most 63 bytes, a value of at most 4 KiB. The one rule
 * for SNAP chunks and restores alike. */
static int named_ok(uint32_t range, const cps__ent *e)
{
    char prefix[32];
    int pl = snprintf(prefix, sizeof prefix, "agg/%" PRIu32 "/", range);
    return e->name_len < 64 && e->value_len <= 4096 && e->name_len > (size_t)pl &&
           memcmp(e->name, prefix, (size_t)pl) == 0;
}

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
    const cps__range *rg = &io->s->view.ranges[io->range];
    io->have_range = 0;
    io->records = 0;
    while (p < end) {
        cps__ent e;
        int rc = cps__ent_next(p, (size_t)(end - p), &e);
        if (rc != 0)
            return rc;
        p += e.size;
        if (e.tag == CPS_ENT_PARAM) {
            if (e.slots != cps__optim_state_slots(e.spec.opt_kind) || e.key < rg->lo ||
                e.key > rg->hi)
                return CPS_EPROTO;
            cps__param_rec rec;
            memset(&rec, 0, sizeof rec);
            rec.len = e.len;
            rec.opt_step = e.opt_step;
            rec.spec = e.spec;
            rec.vals = e.vals;
            rec.state = e.slots ? e.vals + e.len : NULL;
            rc = cps__store_param_put(txn, e.key, &rec);
            io->records++;
        } else if (e.tag == CPS_ENT_DEDUP) {
            rc = cps__store_dedup_put(txn, io->range, e.worker, e.seq);
        } else if (e.tag == CPS_ENT_NAMED) {
            char name[64];
            if (!named_ok(io->range, &e))
                return CPS_EPROTO;
            memcpy(name, e.name, e.name_len);
            name[e.name_len] = 0;
            rc = cps__store_meta_put(txn, name, e.value, e.value_len);
        } else if (e.tag == CPS_ENT_CREATE) {
            if (e.key < rg->lo || e.key > rg->hi)
                return CPS_EPROTO;
            rc = cps__store_param_reset(txn, e.key, e.len, e.opt_step, &e.spec);
            io->records++;
        } else if (e.tag == CPS_ENT_SLICE) {
            rc = cps__store_param_write(txn, e.key, e.slot, e.first, e.vals, e.n);
            if (rc == CPS_ENOTFOUND || rc == CPS_ESIZE)
                rc = CPS_EPROTO; /* a slice of a record the message did not create */
        } else {                 /* CPS_ENT_RANGE */
            if (!io->last)
                return CPS_EPROTO;
            cps__range_meta m = {e.seq, e.step};
            rc = cps__store_range_put(txn, io->range, &m);
            io->seq = m.seq;
            io->step = m.step;
            io->have_range = 1;
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
        cps__ent e;
        if (cps__ent_next(p, (size_t)(end - p), &e) != 0) {
            uint32_t tag = end - p >= 4 ? cps__le32_get(p) : 0;
            if (tag == CPS_ENT_CREATE || tag == CPS_ENT_SLICE || tag == CPS_ENT_NAMED)
                return check_fail(c, "malformed or truncated entry at key %016llx",
                                  end - p >= 16 ? cps__le64_get(p + 8) : 0);
            return check_fail(c, "entry type %llu does not belong in a restore", tag);
        }
        p += e.size;
        if (e.tag == CPS_ENT_CREATE) {
            if (e.key < rg->lo || e.key > rg->hi)
                return check_fail(c, "key %016llx is outside the range", e.key);
            c->keys[c->n] = e.key;
            c->lens[c->n] = e.len;
            c->slots[c->n++] = (uint32_t)cps__optim_state_slots(e.spec.opt_kind);
        } else if (e.tag == CPS_ENT_SLICE) {
            uint32_t len = 0, slots = 0;
            int found = 0;
            for (size_t i = c->n; i-- > 0 && !found;)
                if (c->keys[i] == e.key)
                    found = 1, len = c->lens[i], slots = c->slots[i];
            if (!found) {
                cps__param_rec rec;
                if (cps__store_param_get(txn, e.key, &rec) != 0)
                    return check_fail(c, "slice of key %016llx, which does not exist", e.key);
                len = rec.len;
                slots = (uint32_t)cps__optim_state_slots(rec.spec.opt_kind);
            }
            if (e.slot > slots || e.first > len || e.n > len - e.first)
                return check_fail(c, "slice out of bounds of key %016llx", e.key);
        } else if (e.tag == CPS_ENT_NAMED) {
            if (!named_ok(c->range, &e))
                return check_fail(c, "bad named value%.0llu", 0);
        } else {
            return check_fail(c, "entry type %llu does not belong in a restore", e.tag);
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
