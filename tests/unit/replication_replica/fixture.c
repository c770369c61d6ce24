/* The replica tests' fixture (fixture.h). */
#include "fixture.h"

/* The ready list's growth fails once when armed (linked with --wrap=cps__array_reserve): an item
 * that cannot be allocated, as when out of memory. */
int __real_cps__array_reserve(void **items, size_t *cap, size_t need, size_t size, size_t first);
int __wrap_cps__array_reserve(void **items, size_t *cap, size_t need, size_t size, size_t first);
int fail_next_item;

int __wrap_cps__array_reserve(void **items, size_t *cap, size_t need, size_t size, size_t first)
{
    if (fail_next_item && size == sizeof(cps__replica_out)) {
        fail_next_item = 0;
        return CPS_ENOMEM;
    }
    return __real_cps__array_reserve(items, cap, need, size, first);
}

int f_seq(void *ctx, uint32_t range, uint64_t *seq)
{
    *seq = ((fake *)ctx)->seq[range];
    return 0;
}

uint64_t *rec(fake *f, uint32_t range, uint32_t id, int add)
{
    for (uint32_t i = 0; i < f->nrec[range]; i++)
        if (f->ids[range][i] == id)
            return &f->vals[range][i];
    if (!add)
        return NULL;
    assert_true(f->nrec[range] < 16);
    f->ids[range][f->nrec[range]] = id;
    return &f->vals[range][f->nrec[range]++];
}

int f_dedup(void *ctx, uint32_t range, uint32_t id, uint64_t *seq)
{
    uint64_t *v = rec(ctx, range, id, 0);
    *seq = v ? *v : 0;
    return 0;
}

int f_agg(void *ctx, uint32_t range, uint64_t sig, uint64_t *step)
{
    fake *f = ctx;
    *step = f->agg_sig[range] == sig ? f->agg_step[range] : 0;
    return 0;
}

int f_check(void *ctx, const cps__kv *kv, const cps__param_spec *spec, uint64_t *bad,
            uint32_t *have)
{
    fake *f = ctx;
    *bad = kv->keys[0];
    *have = f->declared ? 2 : 0;
    if (spec)
        return 0;
    if (!f->declared)
        return CPS_ENOTFOUND;
    return kv->lens[0] == 2 ? 0 : CPS_ESIZE;
}

int f_scan(void *ctx, uint32_t range, int (*fn)(void *arg, uint32_t id, uint64_t value), void *arg)
{
    fake *f = ctx;
    for (uint32_t i = 0; i < f->nrec[range]; i++)
        fn(arg, f->ids[range][i], f->vals[range][i]);
    return 0;
}

void f_add(void *ctx, float *acc, const float *x, size_t n)
{
    (void)ctx;
    for (size_t i = 0; i < n; i++)
        acc[i] += x[i];
}

void f_release(void *ctx, void *owner)
{
    ((fake *)ctx)->released++;
    free(owner);
}

void *f_alloc(void *ctx, uint32_t to, size_t len)
{
    (void)to;
    ((fake *)ctx)->msgs++;
    return malloc(len);
}

cps__replica *new_replica(fake *f)
{
    cps__replica_env env = {f, f_seq, f_dedup, f_agg, f_check, f_scan, f_add, f_release, f_alloc};
    cps__replica_config cfg = {.self = SELF};
    cps__replica *r;
    assert_int_equal(cps__replica_create(&cfg, &env, &r), 0);
    return r;
}

void make_view(cps__view *v, uint64_t epoch, uint32_t mode, uint32_t nranges, int moved)
{
    cps__view_init(v);
    v->epoch = epoch;
    v->mode = mode;
    v->nnodes = 4;
    v->nodes = calloc(4, sizeof *v->nodes);
    const uint32_t ids[4] = {1, 2, W1, W2};
    for (uint32_t i = 0; i < 4; i++) {
        v->nodes[i].id = ids[i];
        v->nodes[i].role = i < 2 ? CPS_ROLE_SERVER : CPS_ROLE_WORKER;
        v->nodes[i].alive = 1;
        v->nodes[i].rank = i % 2;
    }
    v->num_servers = 2;
    v->num_workers = 2;
    v->replicas = 1;
    v->nranges = nranges;
    v->ranges = calloc(nranges, sizeof *v->ranges);
    for (uint32_t k = 0; k < nranges; k++) {
        v->ranges[k].lo = k == 0 ? 0 : 1000;
        v->ranges[k].hi = k + 1 == nranges ? UINT64_MAX : 999;
        v->ranges[k].chain_len = 1;
        v->ranges[k].chain[0] = moved && k == 1 ? 2 : SELF;
    }
}

void set_view(cps__replica *r, uint64_t epoch, uint32_t mode, uint32_t nranges, int moved,
              int fresh)
{
    cps__view v;
    make_view(&v, epoch, mode, nranges, moved);
    assert_int_equal(cps__replica_set_view(r, &v, SELF, fresh, 0), 0);
    cps__view_fini(&v);
}

cps__replica_msg request_of(fake *f, uint8_t type, uint32_t from, uint64_t epoch, uint64_t req,
                            uint64_t step, float a, float b, uint64_t key, uint32_t range)
{
    uint32_t len = 2;
    float vals[2] = {a, b};
    int with = type != CPS_MSG_PULL;
    size_t n = cps__wire_kv_size(1, with ? 2 : 0);
    uint64_t *buf = calloc(1, (n + 7) & ~(size_t)7);
    assert_true(cps__wire_kv_encode(buf, n, 1, &key, &len, with ? vals : NULL, with ? 2 : 0) > 0);
    cps__replica_msg m = {.payload = buf, .len = n, .owner = buf};
    m.hdr.type = type;
    m.hdr.sender = from;
    m.hdr.req_worker = from;
    m.hdr.epoch = epoch;
    m.hdr.req_seq = req;
    m.hdr.step = step;
    m.hdr.aux = step; /* a pull reads at the worker's clock */
    m.hdr.range = range;
    f->owners++;
    return m;
}

cps__replica_msg request(fake *f, uint8_t type, uint32_t from, uint64_t epoch, uint64_t req,
                         uint64_t step, float a, float b)
{
    return request_of(f, type, from, epoch, req, step, a, b, KEY, 0);
}

const char *perform(cps__replica *r, fake *f)
{
    static char kinds[64];
    const cps__replica_out *o;
    size_t n = cps__replica_ready(r, &o), k = 0;
    for (size_t i = 0; i < n && k < sizeof kinds - 1; i++) {
        if (o[i].kind == CPS_RO_LOG)
            continue;
        kinds[k++] = "?WSRADLPCI"[o[i].kind];
        if (o[i].kind == CPS_RO_WRITE) {
            f->seq[o[i].range] = o[i].seq;
            for (uint32_t j = 0; j < o[i].nrecs; j++)
                *rec(f, o[i].range, o[i].recs[j].id, 1) = o[i].recs[j].value;
            if (o[i].upd.sig) {
                f->agg_sig[o[i].range] = o[i].upd.sig;
                f->agg_step[o[i].range] = o[i].upd.step;
            }
        }
        if (o[i].kind == CPS_RO_SEND && o[i].msg) {
            f->msgs_freed++;
            free(o[i].msg);
        }
    }
    kinds[k] = 0;
    return kinds;
}

const cps__replica_out *item(cps__replica *r, int kind, size_t nth)
{
    const cps__replica_out *o;
    size_t n = cps__replica_ready(r, &o);
    for (size_t i = 0; i < n; i++)
        if (o[i].kind == kind && nth-- == 0)
            return &o[i];
    fail_msg("no item of kind %d", kind);
    return NULL;
}

void finish(cps__replica *r, fake *f)
{
    cps__replica_destroy(r);
    assert_int_equal(f->released, f->owners); /* every message given back once */
}
