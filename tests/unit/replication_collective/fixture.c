/* unit.replication_collective's fixture: the in-memory ring and the nodes built by hand. */
#include "fixture.h"

/* The out hook (cps__coll_set_out) the shell installs, as a test double: 0 none (the ring copies
 * from its own buffer), 1 every forwarded chunk gets a payload of its own, 2 one in three asks
 * finds no memory (the copy path for that chunk). Payloads start as NaNs: a value the ring did
 * not write shows in the result. */
int hook_mode;
long hook_out;             /* payloads given and not yet sent or dropped */
uint64_t kill_seeds = 400; /* test_kill_any_phase's seeds (fewer with the hook: time) */
int place_mode;
long placed, written_calls, gather_seen;

/* The payload last given (a new one starts its pieces at 0) and how far it was written. */
static const float *last;
static uint64_t last_done;

/* The written hook: pieces in order, each final and written (no NaN left from hook_payload). */
static void hook_written(void *ctx, float *payload, uint64_t done)
{
    (void)ctx;
    uint64_t from = payload == last ? last_done : 0;
    assert_true(done > from && done - from <= CPS_COLL_PIECE);
    assert_true(from % CPS_COLL_PIECE == 0);
    for (uint64_t j = from; j < done; j++)
        assert_false(payload[j] != payload[j]);
    last = payload;
    last_done = done;
    written_calls++;
}

static float *hook_payload(void *ctx, uint32_t to, const cps__coll_msg *m)
{
    uint64_t *rng = ctx;
    (void)to;
    assert_null(m->vals);
    assert_true(m->count > 0);
    *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
    if (hook_mode == 2 && (*rng >> 33) % 3 == 0)
        return NULL;
    float *p = malloc(m->count * sizeof *p);
    assert_non_null(p);
    for (uint64_t j = 0; j < m->count; j++)
        p[j] = __builtin_nanf("");
    hook_out++;
    last = NULL;
    return p;
}

uint64_t rnd(net *t)
{
    /* splitmix64 */
    uint64_t z = (t->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

node *by_id(net *t, uint32_t id)
{
    for (uint32_t i = 0; i < t->n; i++)
        if (t->nodes[i].id == id)
            return &t->nodes[i];
    return NULL;
}

void perform(net *t, node *nd)
{
    const cps__coll_act *a;
    size_t na = cps__coll_actions(nd->c, &a);
    for (size_t i = 0; i < na; i++) {
        if (a[i].kind == CPS_COLL_SEND) {
            node *to = by_id(t, a[i].to);
            assert_non_null(to);
            /* A built payload is the shell's to send or give back, whatever happens. */
            float *built = a[i].built ? (float *)(uintptr_t)a[i].msg.vals : NULL;
            assert_true(!built || hook_mode);
            if (!to->alive || !nd->alive) {
                if (built) {
                    free(built);
                    hook_out--;
                }
                continue;
            }
            if (t->nq == t->capq) {
                t->capq = t->capq ? 2 * t->capq : 64;
                t->q = realloc(t->q, t->capq * sizeof *t->q);
                assert_non_null(t->q);
            }
            qmsg *q = &t->q[t->nq++];
            q->from = nd->id;
            q->to = a[i].to;
            q->m = a[i].msg;
            q->vals = malloc((a[i].msg.count + 1) * sizeof(float));
            if (a[i].msg.count)
                memcpy(q->vals, a[i].msg.vals, a[i].msg.count * sizeof(float));
            q->m.vals = q->vals;
            if (built) {
                free(built);
                hook_out--;
            }
        } else if (a[i].kind == CPS_COLL_DONE || a[i].kind == CPS_COLL_FAILED) {
            int k;
            for (k = 0; k < nd->next; k++)
                if (nd->status[k] == 1)
                    break;
            assert_true(k < nd->next);
            nd->status[k] = a[i].kind == CPS_COLL_DONE ? 0 : a[i].status;
            nd->seqno[k] = a[i].seq;
        }
    }
}

void net_init(net *t, uint32_t n, uint64_t len, uint32_t chunk, int op, uint64_t seed)
{
    memset(t, 0, sizeof *t);
    t->n = n;
    t->rng = seed;
    t->len = len;
    t->chunk = chunk;
    t->op = op;
    t->epoch = 5;
    t->nmembers = n;
    t->hook_rng = seed;
    for (uint32_t i = 0; i < n; i++) {
        node *nd = &t->nodes[i];
        nd->id = 100 + 7 * i; /* ids unrelated to positions */
        nd->alive = 1;
        t->members[i] = nd->id;
        assert_int_equal(cps__coll_create(nd->id, chunk, 10000, &nd->c), 0);
        if (hook_mode) {
            cps__coll_set_out(nd->c, hook_payload, &t->hook_rng);
            cps__coll_set_written(nd->c, hook_written);
        }
        for (int k = 0; k < MAXSEQ; k++) {
            nd->data[k] = malloc(len * sizeof(float));
            nd->status[k] = 2;
        }
    }
    for (uint32_t i = 0; i < n; i++) {
        node *nd = &t->nodes[i];
        assert_int_equal(cps__coll_view(nd->c, t->epoch, t->members, n, 1, 0), 0);
        nd->view_epoch = t->epoch;
    }
}

void net_fini(net *t)
{
    for (uint32_t i = 0; i < t->n; i++) {
        cps__coll_destroy(t->nodes[i].c);
        for (int k = 0; k < MAXSEQ; k++)
            free(t->nodes[i].data[k]);
    }
    for (size_t i = 0; i < t->nq; i++)
        free(t->q[i].vals);
    free(t->q);
    assert_int_equal(hook_out, 0); /* every payload the ring asked for was sent */
}

void start(net *t, node *nd, int k)
{
    uint64_t seq;
    nd->status[k] = 1;
    nd->next = k + 1;
    assert_int_equal(cps__coll_start(nd->c, nd->data[k], t->len, t->op, t->now, &seq), 0);
    perform(t, nd);
}

/* Deliver one message: a random one among those at the head of their pipe. 0 if none. */
qmsg take_next(net *t)
{
    size_t pick = rnd(t) % t->nq;
    /* The first message of the picked one's pipe. */
    for (size_t i = 0; i < pick; i++)
        if (t->q[i].from == t->q[pick].from && t->q[i].to == t->q[pick].to) {
            pick = i;
            break;
        }
    qmsg q = t->q[pick];
    memmove(&t->q[pick], &t->q[pick + 1], (t->nq - pick - 1) * sizeof *t->q);
    t->nq--;
    return q;
}

int deliver_one(net *t)
{
    if (t->nq == 0)
        return 0;
    qmsg q = take_next(t);
    node *to = by_id(t, q.to);
    if (to->alive) {
        q.m.from = q.from;
        float *dst = place_mode ? cps__coll_place(to->c, &q.m) : NULL;
        uint64_t nch = cps__coll_chunks(t->len, t->nmembers, t->chunk);
        gather_seen += q.m.kind == CPS_COLL_DATA && q.m.count && q.m.index / nch + 1 >= t->nmembers;
        if (dst) {
            /* Refused: a forged piece in the middle, the rest genuine; never stepped. */
            uint64_t mid = q.m.count / 2,
                     end = mid + CPS_COLL_PIECE < q.m.count ? mid + CPS_COLL_PIECE : q.m.count;
            memcpy(dst, q.m.vals, q.m.count * sizeof(float));
            for (uint64_t j = mid; j < end; j++)
                dst[j] = 1e30f;
            /* The genuine one: the same place (nothing changed), values copied there. */
            assert_ptr_equal(cps__coll_place(to->c, &q.m), dst);
            memcpy(dst, q.m.vals, q.m.count * sizeof(float));
            q.m.vals = dst;
            placed++;
        }
        cps__coll_step(to->c, &q.m, t->now);
        perform(t, to);
    }
    free(q.vals);
    return 1;
}

void kill_node(net *t, node *nd)
{
    nd->alive = 0;
    for (size_t i = 0; i < t->nq;) {
        if (t->q[i].from == nd->id || t->q[i].to == nd->id) {
            free(t->q[i].vals);
            memmove(&t->q[i], &t->q[i + 1], (t->nq - i - 1) * sizeof *t->q);
            t->nq--;
        } else {
            i++;
        }
    }
    uint32_t m = 0;
    for (uint32_t i = 0; i < t->nmembers; i++)
        if (t->members[i] != nd->id)
            t->members[m++] = t->members[i];
    t->nmembers = m;
    t->epoch++;
}

void fill_inputs(net *t, int exact)
{
    for (uint32_t i = 0; i < t->n; i++)
        for (int k = 0; k < MAXSEQ; k++)
            for (uint64_t j = 0; j < t->len; j++) {
                if (exact) /* the sum names who contributed: bit i per worker */
                    t->nodes[i].data[k][j] = (float)(1u << i);
                else
                    t->nodes[i].data[k][j] =
                        (float)((double)(rnd(t) % 2000001) / 1000.0 - 1000.0) * 1.37f;
            }
}

/* The sum in the ring's order over members[0..p) (positions), as collective.h states. */
void reference(net *t, float **inputs, uint32_t p, float *out)
{
    for (uint32_t s = 0; s < p; s++) {
        uint64_t lo, hi;
        cps__coll_segment(t->len, p, s, &lo, &hi);
        for (uint64_t j = lo; j < hi; j++) {
            float acc = inputs[s][j];
            for (uint32_t d = 1; d < p; d++)
                acc = acc + inputs[(s + d) % p][j];
            if (t->op == CPS_COLL_MEAN)
                acc = acc / (float)p;
            out[j] = acc;
        }
    }
}

/* A failed test leaves the hook off for the next. */
int hook_off(void **state)
{
    (void)state;
    hook_mode = 0;
    hook_out = 0;
    place_mode = 0;
    kill_seeds = 400;
    return 0;
}

/* Node 9 (chunks of any size, a 1000 ms timeout) in view `epoch` of `members`: a joiner when
 * `joining` (it fetched nothing), told the ring's next seq when `next_seq` is not 0. */
cps__coll *node9(uint64_t epoch, const uint32_t *members, uint32_t n, int joining,
                 uint64_t next_seq)
{
    cps__coll *c;
    assert_int_equal(cps__coll_create(9, 0, 1000, &c), 0);
    if (joining)
        cps__coll_set_joining(c);
    assert_int_equal(cps__coll_view(c, epoch, members, n, 1, 0), 0);
    if (next_seq)
        assert_int_equal(cps__coll_set_next_seq(c, next_seq, 0), 0);
    return c;
}

/* A message of a 2-value collective from `from`, chunk 0, carrying `count` values at `vals`. */
cps__coll_msg msg2(uint32_t from, uint32_t kind, uint64_t epoch, uint64_t seq, const float *vals,
                   uint64_t count)
{
    return (cps__coll_msg){.from = from,
                           .kind = kind,
                           .epoch = epoch,
                           .seq = seq,
                           .index = 0,
                           .n = 2,
                           .vals = vals,
                           .count = count};
}

/* Node 9, a joiner, running its first call over x[0..2) in the ring 10 -> 9 -> 11 (view 1). */
cps__coll *joiner_started(float *x)
{
    uint64_t seq;
    uint32_t three[3] = {10, 9, 11};
    cps__coll *c = node9(1, three, 3, 1, 0);
    assert_int_equal(cps__coll_start(c, x, 2, CPS_COLL_SUM, 0, &seq), 0);
    return c;
}
