/* sim_collective: rnd, the event queue, the pipes' delays, each worker's inputs and the
 * reference sums they must give (collective.h). */
#include "collective.h"

uint64_t rnd(model *m, uint64_t n)
{
    return sim_draw(&m->rng, n);
}

/* ---- the event queue: a binary heap on (t, order) ---- */
static int ev_less(const event *a, const event *b)
{
    return a->t < b->t || (a->t == b->t && a->order < b->order);
}

void post(model *m, uint64_t at, event e)
{
    if (m->nheap == m->capheap) {
        size_t cap = m->capheap ? 2 * m->capheap : 256;
        event *h = realloc(m->heap, cap * sizeof *h);
        if (!h) {
            fprintf(stderr, "sim_collective: out of memory\n");
            exit(2);
        }
        m->heap = h;
        m->capheap = cap;
    }
    e.t = at;
    e.order = m->order++;
    size_t i = m->nheap++;
    while (i > 0 && ev_less(&e, &m->heap[(i - 1) / 2])) {
        m->heap[i] = m->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    m->heap[i] = e;
}

int pop(model *m, event *out)
{
    if (m->nheap == 0)
        return 0;
    *out = m->heap[0];
    event last = m->heap[--m->nheap];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, best = i;
        const event *b = &last;
        if (l < m->nheap && ev_less(&m->heap[l], b))
            best = l, b = &m->heap[l];
        if (l + 1 < m->nheap && ev_less(&m->heap[l + 1], b))
            best = l + 1;
        if (best == i)
            break;
        m->heap[i] = m->heap[best];
        i = best;
    }
    if (m->nheap)
        m->heap[i] = last;
    return 1;
}

/* One pipe per ordered pair: a message never overtakes an earlier one of the same pair. */
uint64_t link_at(model *m, uint32_t from, uint32_t to)
{
    uint64_t at = m->now + 1 + rnd(m, 20);
    /* --slow: what a stalled worker sends leaves when the stall ends (descheduled, swapping, a
     * long GC pause): late, never lost; the pipe stays in order. */
    if (m->slow && from == m->slow_w && m->now >= m->slow_from && m->now < m->slow_until) {
        at = m->slow_until + rnd(m, 20);
        m->slow_delayed++;
    }
    if (at <= m->link_last[from][to])
        at = m->link_last[from][to] + rnd(m, 2);
    m->link_last[from][to] = at;
    return at;
}

/* ---- inputs and the reference reduction ---- */

/* Worker `id`'s contribution to collective `key`: values with varied exponents, so the order of
 * the additions shows in the bits, and a value from another worker or collective is noticed. */
float input_value(uint64_t seed, uint32_t id, uint64_t key, uint32_t j)
{
    uint64_t h =
        sim_mix64(seed * 0x9e3779b97f4a7c15ull ^ sim_mix64(((uint64_t)id << 40) ^ (key << 20) ^ j));
    int32_t mant = (int32_t)(h & 0xffffff) - 0x800000;
    return ldexpf((float)mant, -(int)((h >> 32) % 24));
}

int worker_of(const model *m, uint32_t id)
{
    for (uint32_t i = 0; i < m->nw; i++)
        if (m->w[i].id == id)
            return (int)i;
    return -1;
}

/* The input of node `id` to collective `seq`, or NULL if unknown (a replacement that never
 * completed `seq`: its buffer's identity with that seq is not known). A replacement with
 * `zero` gives zeros: it helps the ring through a collective it skipped (its state came from a
 * member that completed it), and its buffer belongs to its own call. */
static const float *input_of(const model *m, uint32_t id, uint64_t seq, int zero, float *tmp)
{
    int wi = worker_of(m, id);
    if (wi < 0)
        return NULL;
    const worker *w = &m->w[wi];
    if (w->repl && zero) {
        memset(tmp, 0, m->n * sizeof(float));
        return tmp;
    }
    if (w->repl)
        return seq <= MAX_SEQ && w->repl_known[seq] ? w->repl_in[seq] : NULL;
    for (uint32_t j = 0; j < m->n; j++)
        tmp[j] = input_value(m->seed, id, seq, j);
    return tmp;
}

/* The documented order: segment s is ((x[s] + x[s+1]) + ...) + x[s-1] over ring positions, the
 * last addition divided by P for a mean. 1 if view `v`'s reduction of `seq` is computable.
 * Member positions in `zmask` (replacements only) give zeros (input_of). */
int reference(const model *m, const view *v, uint64_t seq, uint32_t zmask, float *out)
{
    static float in[MAX_W][MAX_N];
    uint32_t p = v->n;
    if (p < 2)
        return 0;
    for (uint32_t i = 0; i < p; i++) {
        const float *x = input_of(m, v->members[i], seq, (zmask >> i) & 1, in[i]);
        if (!x)
            return 0;
        if (x != in[i])
            memcpy(in[i], x, m->n * sizeof(float));
    }
    for (uint32_t s = 0; s < p; s++) {
        uint64_t lo, hi;
        cps__coll_segment(m->n, p, s, &lo, &hi);
        for (uint64_t j = lo; j < hi; j++) {
            float acc = in[s][j];
            for (uint32_t k = 1; k < p; k++) {
                float own = in[(s + k) % p][j];
                if (k == p - 1 && m->op == CPS_COLL_MEAN)
                    acc = (acc + own) / (float)p;
                else
                    acc = acc + own;
            }
            out[j] = acc;
        }
    }
    return 1;
}
