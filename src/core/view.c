/* Cluster view: copy, lookup, ring placement and its wire encoding.
 *
 * View encoding (little-endian, offsets in bytes; fixed-size records so that every length is
 * known from two counts and can be checked against the buffer before anything is read):
 *    0 u32 magic 'CPSV' (0x56535043), so a payload of another type is not taken for a view
 *    4 u32 mode      8 u64 epoch     16 u32 mode_arg    20 u32 num_workers
 *      mode_arg: the staleness bound (ssp_bound) in SSP mode, the backup workers in sync mode
 *      (0 in async mode); one field, so a view without backup workers encodes as before
 *   24 u32 num_servers   28 u32 replicas   32 u32 nnodes   36 u32 nranges
 *   40 nnodes node records of 140 bytes:
 *        0 u32 id   4 u8 role   5 u8 alive   6 u16 zero   8 u32 rank
 *       12 char addr[128]: NUL-terminated, zero after the NUL
 *   then nranges range records of 52 bytes:
 *        0 u64 lo   8 u64 hi   16 u32 chain_len   20 u32 chain[8] (unused slots zero)
 * Total: 40 + 140*nnodes + 52*nranges, exactly. Only this canonical form decodes (zero padding,
 * zero unused slots), so decode then encode gives back the same bytes.
 *
 * A view with no ranges is valid: it is what the scheduler has before enough servers joined to
 * place any. Once there are ranges they must cover the whole key space.
 */
#include "core/view.h"

#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "core/wire.h"

#define VIEW_MAGIC      0x56535043u
#define VIEW_HDR_SIZE   40
#define VIEW_NODE_SIZE  (12 + CPS_ADDR_MAX)
#define VIEW_RANGE_SIZE (20 + 4 * CPS_MAX_REPLICAS)
/* Far more ranges than any cluster of CPS_MAX_NODES servers wants; bounds what a view may make
 * us allocate. */
#define VIEW_MAX_RANGES (1u << 20)

void cps__view_init(cps__view *v)
{
    memset(v, 0, sizeof *v);
}

void cps__view_fini(cps__view *v)
{
    free(v->nodes);
    free(v->ranges);
    cps__view_init(v);
}

int cps__view_copy(cps__view *dst, const cps__view *src)
{
    cps__node_info *nodes = NULL;
    cps__range *ranges = NULL;

    if (dst == src)
        return 0;
    /* Allocate both before touching dst, so a failure leaves dst as it was. */
    if (src->nnodes) {
        nodes = malloc(sizeof *nodes * src->nnodes);
        if (!nodes)
            return CPS_ENOMEM;
        memcpy(nodes, src->nodes, sizeof *nodes * src->nnodes);
    }
    if (src->nranges) {
        ranges = malloc(sizeof *ranges * src->nranges);
        if (!ranges) {
            free(nodes);
            return CPS_ENOMEM;
        }
        memcpy(ranges, src->ranges, sizeof *ranges * src->nranges);
    }
    cps__view_fini(dst);
    *dst = *src;
    dst->nodes = nodes;
    dst->ranges = ranges;
    return 0;
}

uint32_t cps__view_range_of(const cps__view *v, uint64_t key)
{
    /* Last range whose lo <= key; ranges[0].lo == 0, so there always is one. */
    uint32_t lo = 0, hi = v->nranges;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (v->ranges[mid].lo <= key)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

const cps__node_info *cps__view_node(const cps__view *v, uint32_t id)
{
    /* Linear: at most CPS_MAX_NODES entries, and the view is not kept sorted by id. */
    for (uint32_t i = 0; i < v->nnodes; i++)
        if (v->nodes[i].id == id)
            return &v->nodes[i];
    return NULL;
}

int cps__node_supersedes(const cps__node_info *o, const cps__node_info *w)
{
    return w->role == CPS_ROLE_WORKER && !w->alive && o->role == CPS_ROLE_WORKER &&
           o->id != w->id && o->rank == w->rank && (o->alive || o->id > w->id);
}

int cps__view_superseded(const cps__view *v, const cps__node_info *w)
{
    for (uint32_t i = 0; i < v->nnodes; i++)
        if (cps__node_supersedes(&v->nodes[i], w))
            return 1;
    return 0;
}

int cps__view_place_ranges(cps__view *v, uint32_t n, const uint32_t *servers, uint32_t nservers,
                           uint32_t replicas)
{
    if (!v || n == 0 || replicas == 0 || replicas > nservers || replicas > CPS_MAX_REPLICAS ||
        !servers)
        return CPS_EINVAL;
    /* A chain naming one server twice would replicate onto itself. */
    for (uint32_t i = 0; i < nservers; i++) {
        if (servers[i] == 0)
            return CPS_EINVAL;
        for (uint32_t j = 0; j < i; j++)
            if (servers[i] == servers[j])
                return CPS_EINVAL;
    }
    cps__range *r = calloc(n, sizeof *r);
    if (!r)
        return CPS_ENOMEM;
    const unsigned __int128 space = (unsigned __int128)1 << 64;
    for (uint32_t i = 0; i < n; i++) {
        /* ceil(i * 2^64 / n): ranges differ in size by at most one key. */
        unsigned __int128 lo = (i * space + n - 1) / n;
        unsigned __int128 next = ((i + (unsigned __int128)1) * space + n - 1) / n;
        r[i].lo = (uint64_t)lo;
        r[i].hi = (uint64_t)(next - 1);
        r[i].chain_len = replicas;
        for (uint32_t k = 0; k < replicas; k++)
            r[i].chain[k] = servers[(uint32_t)(((uint64_t)i + k) % nservers)];
    }
    free(v->ranges);
    v->ranges = r;
    v->nranges = n;
    v->replicas = replicas;
    return 0;
}

size_t cps__view_encoded_size(const cps__view *v)
{
    return VIEW_HDR_SIZE + (size_t)VIEW_NODE_SIZE * v->nnodes +
           (size_t)VIEW_RANGE_SIZE * v->nranges;
}

size_t cps__view_encode(const cps__view *v, void *buf, size_t cap)
{
    unsigned char *b = buf;
    size_t need = cps__view_encoded_size(v);

    if (!buf || need > cap)
        return 0;
    cps__le32_put(b + 0, VIEW_MAGIC);
    cps__le32_put(b + 4, v->mode);
    cps__le64_put(b + 8, v->epoch);
    cps__le32_put(b + 16, v->mode == CPS_MODE_SYNC ? v->backup_workers : v->ssp_bound);
    cps__le32_put(b + 20, v->num_workers);
    cps__le32_put(b + 24, v->num_servers);
    cps__le32_put(b + 28, v->replicas);
    cps__le32_put(b + 32, v->nnodes);
    cps__le32_put(b + 36, v->nranges);
    b += VIEW_HDR_SIZE;
    for (uint32_t i = 0; i < v->nnodes; i++, b += VIEW_NODE_SIZE) {
        const cps__node_info *n = &v->nodes[i];
        size_t alen = strnlen(n->addr, CPS_ADDR_MAX);
        cps__le32_put(b, n->id);
        b[4] = n->role;
        b[5] = n->alive;
        b[6] = b[7] = 0;
        cps__le32_put(b + 8, n->rank);
        /* An unterminated addr is encoded as is, and the receiver refuses it. */
        memset(b + 12, 0, CPS_ADDR_MAX);
        memcpy(b + 12, n->addr, alen);
    }
    for (uint32_t i = 0; i < v->nranges; i++, b += VIEW_RANGE_SIZE) {
        const cps__range *r = &v->ranges[i];
        cps__le64_put(b, r->lo);
        cps__le64_put(b + 8, r->hi);
        cps__le32_put(b + 16, r->chain_len);
        for (uint32_t k = 0; k < CPS_MAX_REPLICAS; k++)
            cps__le32_put(b + 20 + 4 * k, k < r->chain_len ? r->chain[k] : 0);
    }
    return need;
}

/* Addresses end up in logs and in nn_connect(): printable ASCII without spaces only. */
static int addr_char_ok(unsigned char c)
{
    return c > 0x20 && c < 0x7f;
}

static int decode_addr(const unsigned char *p, char out[CPS_ADDR_MAX])
{
    size_t n = 0;
    while (n < CPS_ADDR_MAX && p[n])
        if (!addr_char_ok(p[n++]))
            return CPS_EPROTO;
    if (n == 0 || n == CPS_ADDR_MAX)
        return CPS_EPROTO;
    for (size_t i = n; i < CPS_ADDR_MAX; i++)
        if (p[i])
            return CPS_EPROTO;
    memcpy(out, p, n + 1);
    memset(out + n + 1, 0, CPS_ADDR_MAX - n - 1);
    return 0;
}

static int decode_node(const unsigned char *b, cps__node_info *n)
{
    n->id = cps__le32_get(b);
    n->role = b[4];
    n->alive = b[5];
    n->rank = cps__le32_get(b + 8);
    if (b[6] || b[7] || n->alive > 1)
        return CPS_EPROTO;
    if (n->role < CPS_ROLE_SCHEDULER || n->role > CPS_ROLE_WORKER)
        return CPS_EPROTO;
    /* Id 0 is reserved for the scheduler and the scheduler has no other. */
    if ((n->id == 0) != (n->role == CPS_ROLE_SCHEDULER))
        return CPS_EPROTO;
    return decode_addr(b + 12, n->addr);
}

typedef struct id_role {
    uint32_t id;
    uint32_t role;
} id_role;

static int cmp_id_role(const void *a, const void *b)
{
    uint32_t x = ((const id_role *)a)->id, y = ((const id_role *)b)->id;
    return (x > y) - (x < y);
}

static int decode_range(const unsigned char *b, const id_role *ids, uint32_t nids, cps__range *r)
{
    r->lo = cps__le64_get(b);
    r->hi = cps__le64_get(b + 8);
    r->chain_len = cps__le32_get(b + 16);
    if (r->lo > r->hi || r->chain_len == 0 || r->chain_len > CPS_MAX_REPLICAS)
        return CPS_EPROTO;
    for (uint32_t k = 0; k < CPS_MAX_REPLICAS; k++) {
        r->chain[k] = cps__le32_get(b + 20 + 4 * k);
        if (k >= r->chain_len) {
            if (r->chain[k])
                return CPS_EPROTO;
            continue;
        }
        id_role key = {r->chain[k], 0};
        const id_role *hit = nids ? bsearch(&key, ids, nids, sizeof *ids, cmp_id_role) : NULL;
        if (!hit || hit->role != CPS_ROLE_SERVER)
            return CPS_EPROTO;
        for (uint32_t j = 0; j < k; j++)
            if (r->chain[j] == r->chain[k])
                return CPS_EPROTO;
    }
    return 0;
}

/* Checks the header and that the counts it gives fit in `len` (exactly, unless `prefix`). */
static int decode_header(const unsigned char *b, size_t len, int prefix, cps__view *v)
{
    if (len < VIEW_HDR_SIZE)
        return CPS_ESIZE;
    if (cps__le32_get(b) != VIEW_MAGIC)
        return CPS_EPROTO;
    v->mode = cps__le32_get(b + 4);
    v->epoch = cps__le64_get(b + 8);
    uint32_t arg = cps__le32_get(b + 16);
    v->ssp_bound = v->mode == CPS_MODE_SYNC ? 0 : arg;
    v->backup_workers = v->mode == CPS_MODE_SYNC ? arg : 0;
    v->num_workers = cps__le32_get(b + 20);
    v->num_servers = cps__le32_get(b + 24);
    v->replicas = cps__le32_get(b + 28);
    v->nnodes = cps__le32_get(b + 32);
    v->nranges = cps__le32_get(b + 36);
    if (v->mode > CPS_MODE_SSP || v->num_workers > CPS_MAX_NODES ||
        v->backup_workers > CPS_MAX_NODES || v->num_servers > CPS_MAX_NODES ||
        v->replicas > CPS_MAX_REPLICAS || v->nnodes > CPS_MAX_NODES || v->nranges > VIEW_MAX_RANGES)
        return CPS_EPROTO;
    uint64_t need = VIEW_HDR_SIZE + (uint64_t)VIEW_NODE_SIZE * v->nnodes +
                    (uint64_t)VIEW_RANGE_SIZE * v->nranges;
    return need == len || (prefix && need < len) ? 0 : CPS_ESIZE;
}

static int decode_body(const unsigned char *b, cps__view *v, id_role *ids)
{
    int rc;
    b += VIEW_HDR_SIZE;
    for (uint32_t i = 0; i < v->nnodes; i++, b += VIEW_NODE_SIZE) {
        if ((rc = decode_node(b, &v->nodes[i])))
            return rc;
        ids[i].id = v->nodes[i].id;
        ids[i].role = v->nodes[i].role;
    }
    if (v->nnodes > 1)
        qsort(ids, v->nnodes, sizeof *ids, cmp_id_role);
    for (uint32_t i = 1; i < v->nnodes; i++)
        if (ids[i].id == ids[i - 1].id)
            return CPS_EPROTO;
    for (uint32_t i = 0; i < v->nranges; i++, b += VIEW_RANGE_SIZE) {
        cps__range *r = &v->ranges[i];
        if ((rc = decode_range(b, ids, v->nnodes, r)))
            return rc;
        /* Contiguous from 0: each range starts right after the previous one ends. */
        if (i == 0 ? r->lo != 0
                   : (v->ranges[i - 1].hi == UINT64_MAX || r->lo != v->ranges[i - 1].hi + 1))
            return CPS_EPROTO;
    }
    if (v->nranges && v->ranges[v->nranges - 1].hi != UINT64_MAX)
        return CPS_EPROTO;
    return 0;
}

static int view_decode(const void *buf, size_t len, int prefix, cps__view *out)
{
    cps__view v;
    id_role *ids = NULL;
    int rc;

    if (!buf || !out)
        return CPS_EINVAL;
    cps__view_init(&v);
    if ((rc = decode_header(buf, len, prefix, &v)))
        return rc;
    uint32_t nn = v.nnodes, nr = v.nranges;
    v.nodes = nn ? calloc(nn, sizeof *v.nodes) : NULL;
    v.ranges = nr ? calloc(nr, sizeof *v.ranges) : NULL;
    ids = nn ? malloc(nn * sizeof *ids) : NULL;
    if ((nn && (!v.nodes || !ids)) || (nr && !v.ranges)) {
        rc = CPS_ENOMEM;
    } else {
        rc = decode_body(buf, &v, ids);
    }
    free(ids);
    if (rc) {
        cps__view_fini(&v);
        return rc;
    }
    cps__view_fini(out);
    *out = v;
    return 0;
}

int cps__view_decode(const void *buf, size_t len, cps__view *out)
{
    return view_decode(buf, len, 0, out);
}

int cps__view_decode_prefix(const void *buf, size_t len, cps__view *out, size_t *used)
{
    if (!used)
        return CPS_EINVAL;
    int rc = view_decode(buf, len, 1, out);
    if (rc == 0)
        *used = cps__view_encoded_size(out);
    return rc;
}

/* ---- stats ---- */

void cps__stats_encode(void *buf, const cps__node_stats *s)
{
    const uint64_t f[9] = {s->msgs_in,         s->msgs_bad,      s->push_raw_bytes,
                           s->push_wire_bytes, s->pull_bytes,    s->updates_applied,
                           s->keys_stored,     s->values_stored, s->step};
    for (int i = 0; i < 9; i++)
        cps__le64_put((unsigned char *)buf + 8 * i, f[i]);
}

void cps__stats_decode(const void *buf, cps__node_stats *s)
{
    uint64_t *f[9] = {&s->msgs_in,         &s->msgs_bad,      &s->push_raw_bytes,
                      &s->push_wire_bytes, &s->pull_bytes,    &s->updates_applied,
                      &s->keys_stored,     &s->values_stored, &s->step};
    for (int i = 0; i < 9; i++)
        *f[i] = cps__le64_get((const unsigned char *)buf + 8 * i);
}

/* ---- hello ---- */

size_t cps__hello_encode(void *buf, size_t cap, uint32_t role, uint32_t want_rank, uint32_t prev_id,
                         const char *addr)
{
    unsigned char *b = buf;
    if (!buf || !addr)
        return 0;
    size_t alen = strnlen(addr, CPS_ADDR_MAX);
    if (alen == 0 || alen == CPS_ADDR_MAX || 16 + alen > cap)
        return 0;
    cps__le32_put(b, role);
    cps__le32_put(b + 4, want_rank);
    cps__le32_put(b + 8, prev_id);
    cps__le32_put(b + 12, (uint32_t)alen);
    memcpy(b + 16, addr, alen);
    return 16 + alen;
}

int cps__hello_decode(const void *buf, size_t len, uint32_t *role, uint32_t *want_rank,
                      uint32_t *prev_id, char addr[CPS_ADDR_MAX], uint32_t *flags)
{
    const unsigned char *b = buf;
    if (!buf || !role || !want_rank || !prev_id || !addr)
        return CPS_EINVAL;
    if (len < 16)
        return CPS_ESIZE;
    uint32_t r = cps__le32_get(b), wr = cps__le32_get(b + 4), alen = cps__le32_get(b + 12);
    int flagged = (uint64_t)alen + 20 == len;
    if ((uint64_t)alen + 16 != len && !flagged)
        return CPS_ESIZE;
    /* The flags word is sent only when not 0: one encoding per HELLO. */
    if (flagged && cps__le32_get(b + 16 + alen) == 0)
        return CPS_EPROTO;
    /* Servers and workers join; CPS_ROLE_NONE is an observer (`chainps status` sends its
     * address this way). A rank is dense, so it is below CPS_MAX_NODES or "any". */
    if ((r != CPS_ROLE_NONE && r != CPS_ROLE_SERVER && r != CPS_ROLE_WORKER) ||
        (wr != UINT32_MAX && wr >= CPS_MAX_NODES))
        return CPS_EPROTO;
    if (alen == 0 || alen >= CPS_ADDR_MAX)
        return CPS_EPROTO;
    for (uint32_t i = 0; i < alen; i++)
        if (!addr_char_ok(b[16 + i]))
            return CPS_EPROTO;
    *role = r;
    *want_rank = wr;
    *prev_id = cps__le32_get(b + 8);
    memcpy(addr, b + 16, alen);
    memset(addr + alen, 0, CPS_ADDR_MAX - alen);
    if (flags)
        *flags = flagged ? cps__le32_get(b + 16 + alen) : 0;
    return 0;
}

size_t cps__hello_add_flags(void *buf, size_t cap, size_t len, uint32_t flags)
{
    if (flags == 0)
        return len;
    if (!buf || len == 0 || len + 4 > cap)
        return 0;
    cps__le32_put((unsigned char *)buf + len, flags);
    return len + 4;
}
