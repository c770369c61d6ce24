/* The checkpoint cut's decisions (replication/cut_view.h). */
#include "replication/cut_view.h"

#include <stdlib.h>

#include "chainps/error.h"
#include "core/array.h"
#include "core/entries.h"
#include "core/wire.h"
#include "replication/chain.h"

int cps__cut_holds(const cps__view *v, uint32_t self, uint32_t range)
{
    if (range >= v->nranges)
        return 0;
    const cps__range *r = &v->ranges[range];
    for (uint32_t i = 0; i < r->chain_len; i++)
        if (r->chain[i] == self)
            return 1;
    return 0;
}

int cps__cut_may_open(const cps__view *v, uint32_t self, int is_tail, uint32_t range, uint64_t step)
{
    /* A head's "now" holds updates that may still be lost with it: only the tail's is safe. */
    return step ? cps__cut_holds(v, self, range) : is_tail != 0;
}

int cps__cut_ready(uint64_t step, const cps__cut_span *sp)
{
    if (step == 0)
        return 1;
    if (sp->n == 0) /* no sync key set has been pushed yet (or only sparse tables) */
        return sp->step >= step;
    if (sp->hi > step)
        return CPS_EPAST;
    /* Every key set applied `step` and none applied step + 1: exactly the state after it. */
    return sp->lo == step && sp->hi == step;
}

uint64_t cps__cut_at_step(const cps__cut_span *sp)
{
    return sp->n ? sp->hi : sp->step;
}

int cps__cut_pending_drop(const cps__view *v, uint32_t self, int is_tail, uint32_t range,
                          uint64_t step, int stop_all)
{
    return stop_all || (v->nranges && !cps__cut_may_open(v, self, is_tail, range, step));
}

int cps__cut_put_status(int verdict)
{
    if (verdict == CPS_ADMIT_NOT_HEAD)
        return CPS_ESTALE_EPOCH;
    if (verdict == CPS_ADMIT_BUSY)
        return CPS_EAGAIN;
    return verdict < 0 ? verdict : CPS_EPROTO;
}

int cps__cut_read_parse(const void *payload, size_t len, size_t max_bytes, uint64_t max_keys,
                        cps__cut_read *q)
{
    const char *p = payload;
    if (len != 40 || cps__le32_get(p + 20) != 0)
        return CPS_EPROTO;
    q->lo = cps__le64_get(p);
    q->hi = cps__le64_get(p + 8);
    q->slot = cps__le32_get(p + 16);
    q->first = cps__le64_get(p + 24);
    q->count = cps__le64_get(p + 32);
    uint64_t nkeys = q->hi - q->lo + 1;
    uint64_t max_vals = max_bytes / sizeof(float);
    if (q->hi < q->lo || nkeys > max_keys || q->count > max_vals || nkeys * q->count > max_vals)
        return CPS_ESIZE;
    return 0;
}

int cps__cut_read_fits(const cps__cut_read *q, uint32_t slots, uint32_t rec_len)
{
    if (q->slot > slots || q->first > rec_len || q->count > rec_len - q->first)
        return CPS_ESIZE;
    return 0;
}

int cps__cut_put_hello(const void *payload, size_t len, size_t *hello_len)
{
    if (len < 8 || cps__le32_get(payload) > len - 8)
        return CPS_EPROTO;
    *hello_len = cps__le32_get(payload);
    return 0;
}

int cps__cut_put_entries(size_t len, size_t hello_len, uint32_t range, uint32_t nranges,
                         size_t *off)
{
    *off = cps__pad8(8 + hello_len);
    return *off >= len || range >= nranges ? CPS_EPROTO : 0;
}

int cps__cut_view_msg(uint8_t type, uint64_t id, uint32_t range, uint64_t view_id,
                      uint32_t view_range)
{
    if (id != view_id || range != view_range)
        return CPS_CUT_IGNORE;
    if (type == CPS_MSG_CUT_READ)
        return CPS_CUT_READ;
    return type == CPS_MSG_CUT_CLOSE ? CPS_CUT_CLOSE : CPS_CUT_ALIVE;
}

static cps__cut_entry *book_find(cps__cut_book *b, uint64_t id, uint32_t range)
{
    for (size_t i = 0; i < b->n; i++)
        if (b->e[i].id == id && b->e[i].range == range)
            return &b->e[i];
    return NULL;
}

void cps__cut_book_fini(cps__cut_book *b)
{
    free(b->e);
    b->e = NULL;
    b->n = b->cap = 0;
}

int cps__cut_book_ask(cps__cut_book *b, uint64_t id, uint32_t range, uint64_t now)
{
    if (book_find(b, id, range))
        return CPS_CUT_REPEAT;
    void *e = b->e;
    if (cps__array_reserve(&e, &b->cap, b->n + 1, sizeof *b->e, 8) != 0)
        return CPS_ENOMEM;
    b->e = e;
    b->e[b->n++] = (cps__cut_entry){.id = id, .range = range, .deadline = now + CPS_CUT_PENDING_MS};
    return CPS_CUT_NEW;
}

void cps__cut_book_opened(cps__cut_book *b, uint64_t id, uint32_t range)
{
    cps__cut_entry *e = book_find(b, id, range);
    if (e)
        e->open = 1;
}

void cps__cut_book_forget(cps__cut_book *b, uint64_t id, uint32_t range)
{
    cps__cut_entry *e = book_find(b, id, range);
    if (e)
        *e = b->e[--b->n];
}

int cps__cut_book_expired(cps__cut_book *b, uint64_t now, uint64_t *id, uint32_t *range)
{
    for (size_t i = 0; i < b->n; i++)
        if (!b->e[i].open && now >= b->e[i].deadline) {
            *id = b->e[i].id;
            *range = b->e[i].range;
            b->e[i] = b->e[--b->n];
            return 1;
        }
    return 0;
}
