/* Where a tensor's values live: which keys, in which ranges.
 *
 * A dense tensor is cut into one chunk per range, or more when the chunks would exceed CHUNK_MAX
 * values (chunks of at least CHUNK_MIN values, so small tensors stay whole), and chunk i goes to
 * range (h + i) mod n, where h is the hash of the tensor's name: a large tensor uses every
 * server, and small tensors spread over the servers instead of piling onto one. A table puts row
 * i where a dense tensor puts chunk i. Within a range, keys are base(h) + i / n, so they are
 * distinct, sorted by i, and clear of other tensors (base is a hash-chosen offset inside the
 * range with 2^40 keys of room). */
#include <stdlib.h>
#include <string.h>

#include "layout.h"
#include "node/msg.h"

#define CHUNK_MIN 16384u
/* The largest chunk (key) of a dense tensor, and the most values one request carries (unless
 * one table row is longer). A large tensor goes out as several requests per range, so that
 * sealing, sending, checking and applying one piece overlaps with the next: one 16 MB message
 * went through each of those stages after the other, at half the rate of 1 MB ones pipelined
 * (issue 14). 512 KB measured best against ps-lite's loop (bench/run_pslite.sh): 256 KB chunks
 * cost 16 MB pushes a quarter of their rate in per-message work, 1 MB chunks left 1 MB pushes
 * unpipelined. */
#ifndef CHUNK_MAX
#define CHUNK_MAX (1u << 17)
#endif
#ifndef SEG_VALS
#define SEG_VALS CHUNK_MAX
#endif
#define KEY_ROOM (1ull << 40)

static uint64_t range_base(const cps__view *v, uint32_t r, uint64_t h)
{
    const cps__range *rg = &v->ranges[r];
    uint64_t span = rg->hi - rg->lo; /* width - 1 */
    uint64_t room = span > 2 * KEY_ROOM ? span - KEY_ROOM : 1;
    return rg->lo + cps__splitmix64(h) % room;
}

/* Key of item i (chunk or row) and its range. */
static uint64_t item_key(const cps__view *v, uint64_t h, uint64_t i, uint32_t *range)
{
    uint32_t n = v->nranges;
    uint32_t r = (uint32_t)((h % n + i % n) % n);
    *range = r;
    return range_base(v, r, h) + i / n;
}

void cps__parts_free(cps__part *parts, uint32_t nparts)
{
    if (!parts)
        return;
    for (uint32_t i = 0; i < nparts; i++) {
        free(parts[i].keys);
        free(parts[i].lens);
        free(parts[i].src_off);
        free(parts[i].init_off);
        free(parts[i].resid);
    }
    free(parts);
}

static int part_reserve(cps__part *p, uint32_t n)
{
    p->keys = calloc(n ? n : 1, sizeof *p->keys);
    p->lens = calloc(n ? n : 1, sizeof *p->lens);
    p->src_off = calloc(n ? n : 1, sizeof *p->src_off);
    p->init_off = calloc(n ? n : 1, sizeof *p->init_off);
    return (p->keys && p->lens && p->src_off && p->init_off) ? 0 : CPS_ENOMEM;
}

int cps__layout_tensor(cps_tensor *t, const cps__view *v)
{
    uint32_t n = v->nranges;
    if (n == 0)
        return CPS_EINVAL;
    uint64_t items, item_len;
    if (t->rows) {
        items = t->rows;
        item_len = t->cols;
    } else {
        uint64_t want = (t->length + CHUNK_MIN - 1) / CHUNK_MIN;
        items = want < n ? want : n;
        if (items == 0)
            items = 1;
        uint64_t need = (t->length + CHUNK_MAX - 1) / CHUNK_MAX;
        if (items < need)
            items = need;
        item_len = (t->length + items - 1) / items;
        items = (t->length + item_len - 1) / item_len;
    }
    if (item_len > UINT32_MAX || item_len == 0)
        return CPS_EINVAL;
    /* Items i, i+n, i+2n... share a range (the `r`-th range used holds the items with
     * i % n == r); each range's items go out in requests of `per` items. */
    uint32_t used = items < n ? (uint32_t)items : n;
    uint64_t per = SEG_VALS / item_len ? SEG_VALS / item_len : 1;
    uint64_t most = (items + n - 1) / n; /* items of the fullest range */
    uint64_t segs = (most + per - 1) / per;
    uint64_t total = 0;
    for (uint32_t r = 0; r < used; r++)
        total += ((items - r + n - 1) / n + per - 1) / per;
    if (total > UINT32_MAX)
        return CPS_EINVAL;
    uint32_t nparts = (uint32_t)total;
    cps__part *parts = calloc(nparts, sizeof *parts);
    if (!parts)
        return CPS_ENOMEM;
    /* Segment-major order: the first request of every range goes out before any range's second,
     * so every server has work from the start of a push. */
    uint32_t p = 0;
    for (uint64_t sg = 0; sg < segs; sg++) {
        for (uint32_t r = 0; r < used; r++) {
            uint64_t count = (items - r + n - 1) / n;
            uint64_t first = sg * per;
            if (first >= count)
                continue;
            uint64_t k = count - first < per ? count - first : per;
            if (part_reserve(&parts[p], (uint32_t)k) != 0) {
                cps__parts_free(parts, nparts);
                return CPS_ENOMEM;
            }
            parts[p].nkeys = (uint32_t)k;
            for (uint64_t j = 0; j < k; j++) {
                uint64_t i = r + (first + j) * n;
                uint64_t off = i * item_len;
                uint64_t len =
                    t->rows ? item_len : (t->length - off < item_len ? t->length - off : item_len);
                parts[p].keys[j] = item_key(v, t->hash, i, &parts[p].range);
                parts[p].lens[j] = (uint32_t)len;
                parts[p].src_off[j] = off;
                parts[p].init_off[j] = off;
                parts[p].nvals += len;
            }
            p++;
        }
    }
    t->parts = parts;
    t->nparts = nparts;
    return 0;
}

uint64_t cps__layout_row_key(const cps_tensor *t, const cps__view *v, uint64_t row)
{
    uint32_t r;
    return item_key(v, t->hash, row, &r);
}

int cps__layout_raw(const cps__view *v, const uint64_t *keys, size_t nkeys, const uint32_t *lens,
                    cps__part **out, uint32_t *nout)
{
    if (nkeys == 0 || nkeys > UINT32_MAX)
        return CPS_EINVAL;
    for (size_t i = 0; i < nkeys; i++)
        if (lens[i] == 0 || (i > 0 && keys[i] <= keys[i - 1]))
            return CPS_EINVAL;
    /* Sorted keys: each range's keys are one contiguous run. */
    uint32_t nparts = 0;
    uint32_t prev = UINT32_MAX;
    for (size_t i = 0; i < nkeys; i++) {
        uint32_t r = cps__view_range_of(v, keys[i]);
        nparts += r != prev;
        prev = r;
    }
    cps__part *parts = calloc(nparts, sizeof *parts);
    if (!parts)
        return CPS_ENOMEM;
    size_t i = 0;
    uint64_t off = 0;
    for (uint32_t p = 0; p < nparts; p++) {
        uint32_t r = cps__view_range_of(v, keys[i]);
        size_t j = i;
        while (j < nkeys && cps__view_range_of(v, keys[j]) == r)
            j++;
        if (part_reserve(&parts[p], (uint32_t)(j - i)) != 0) {
            cps__parts_free(parts, nparts);
            return CPS_ENOMEM;
        }
        parts[p].range = r;
        parts[p].nkeys = (uint32_t)(j - i);
        for (size_t k = i; k < j; k++) {
            parts[p].keys[k - i] = keys[k];
            parts[p].lens[k - i] = lens[k];
            parts[p].src_off[k - i] = off;
            parts[p].init_off[k - i] = 0;
            parts[p].nvals += lens[k];
            off += lens[k];
        }
        i = j;
    }
    *out = parts;
    *nout = nparts;
    return 0;
}
