/* The simulator's clock and dice: the event queue that says what happens next, and the random
 * streams every choice of a run is drawn from, so that a seed replays a run exactly. */
#include <stdio.h>
#include <stdlib.h>

#include "sim.h"

/* ---- PRNG: splitmix64 seeds xoshiro256** (Blackman & Vigna) ---- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void sim_rng_seed(sim_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t sim_rng_next(sim_rng *r)
{
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

/* ---- event queue: a binary heap ordered by (time, insertion number) ---- */

static int ev_less(const sim_event *a, const sim_event *b)
{
    return a->t < b->t || (a->t == b->t && a->n < b->n);
}

void sim_ev_push(sim *sm, uint64_t t, int type, uint32_t node, sim_msg *m)
{
    if (sm->nev == sm->ev_cap) {
        sm->ev_cap = sm->ev_cap ? sm->ev_cap * 2 : 1024;
        sm->ev = realloc(sm->ev, sm->ev_cap * sizeof *sm->ev);
        if (!sm->ev) {
            fprintf(stderr, "sim: out of memory\n");
            exit(2);
        }
    }
    sim_event e = {t, sm->ev_counter++, type, node, m};
    size_t i = sm->nev++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!ev_less(&e, &sm->ev[parent]))
            break;
        sm->ev[i] = sm->ev[parent];
        i = parent;
    }
    sm->ev[i] = e;
}

sim_event sim_ev_pop(sim *sm)
{
    sim_event top = sm->ev[0];
    sim_event last = sm->ev[--sm->nev];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const sim_event *best = &last;
        if (l < sm->nev && ev_less(&sm->ev[l], best))
            m = l, best = &sm->ev[l];
        if (r < sm->nev && ev_less(&sm->ev[r], best))
            m = r;
        if (m == i)
            break;
        sm->ev[i] = sm->ev[m];
        i = m;
    }
    if (sm->nev > 0)
        sm->ev[i] = last;
    return top;
}
