/* sim_cutroute: rnd, the event queue (a binary heap on (t, order)) and the network's delays
 * (cutroute.h). */
#include "cutroute.h"

uint64_t rnd(model *m, uint64_t n)
{
    return sim_draw(&m->rng, n);
}

static int ev_less(const event *a, const event *b)
{
    return a->t < b->t || (a->t == b->t && a->order < b->order);
}

void post(model *m, uint64_t delay, event e)
{
    if (m->nev == MAX_EVENTS) {
        sim_fail(&m->v, "event queue full");
        return;
    }
    e.t = m->now + delay;
    e.order = m->order++;
    uint32_t i = m->nev++;
    while (i > 0 && ev_less(&e, &m->ev[(i - 1) / 2])) {
        m->ev[i] = m->ev[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    m->ev[i] = e;
}

int pop(model *m, event *out)
{
    if (m->nev == 0)
        return 0;
    *out = m->ev[0];
    event last = m->ev[--m->nev];
    uint32_t i = 0;
    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= m->nev)
            break;
        if (c + 1 < m->nev && ev_less(&m->ev[c + 1], &m->ev[c]))
            c++;
        if (!ev_less(&m->ev[c], &last))
            break;
        m->ev[i] = m->ev[c];
        i = c;
    }
    if (m->nev)
        m->ev[i] = last;
    return 1;
}

uint64_t net(model *m)
{
    return 1 + rnd(m, 8);
}

/* Between the exporter and one server messages keep their order (one TCP connection each way). */
uint64_t fifo_last[MAX_SERVERS + 1][2];

uint64_t fifo(model *m, uint32_t node, int dir)
{
    uint64_t at = m->now + net(m);
    if (at <= fifo_last[node][dir])
        at = fifo_last[node][dir] + 1;
    fifo_last[node][dir] = at;
    return at - m->now;
}
