#include "detector.h"

#include <stdlib.h>

#include "chainps/error.h"
#include "core/array.h"

typedef struct watched {
    uint32_t node;
    uint64_t last_ms;
    uint64_t not_before_ms; /* grace: no verdict before this */
    int gone;               /* its process is known to have ended: dead at the next tick */
} watched;

struct cps__detector {
    cps__detector_config cfg;
    watched *w;
    size_t n, cap;
};

int cps__detector_create(const cps__detector_config *cfg, cps__detector **out)
{
    if (!cfg || !out || cfg->dead_after_ms == 0)
        return CPS_EINVAL;
    cps__detector *d = calloc(1, sizeof *d);
    if (!d)
        return CPS_ENOMEM;
    d->cfg = *cfg;
    *out = d;
    return 0;
}

void cps__detector_destroy(cps__detector *d)
{
    if (d) {
        free(d->w);
        free(d);
    }
}

static watched *find(const cps__detector *d, uint32_t node)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->w[i].node == node)
            return &d->w[i];
    return NULL;
}

int cps__detector_watch(cps__detector *d, uint32_t node, uint64_t now)
{
    watched *w = find(d, node);
    if (!w) {
        void *p = d->w;
        int rc = cps__array_reserve(&p, &d->cap, d->n + 1, sizeof *d->w, 16);
        d->w = p;
        if (rc != 0)
            return rc;
        w = &d->w[d->n++];
        w->node = node;
    }
    w->last_ms = now;
    w->not_before_ms = 0;
    w->gone = 0;
    return 0;
}

void cps__detector_gone(cps__detector *d, uint32_t node)
{
    watched *w = find(d, node);
    if (w)
        w->gone = 1;
}

void cps__detector_forget(cps__detector *d, uint32_t node)
{
    watched *w = find(d, node);
    if (w)
        *w = d->w[--d->n];
}

void cps__detector_heard(cps__detector *d, uint32_t node, uint64_t now)
{
    watched *w = find(d, node);
    if (w && now > w->last_ms)
        w->last_ms = now;
}

void cps__detector_restart(cps__detector *d, uint64_t now)
{
    for (size_t i = 0; i < d->n; i++) {
        d->w[i].last_ms = now;
        d->w[i].not_before_ms = now + d->cfg.grace_ms;
    }
}

void cps__detector_refresh(cps__detector *d, uint64_t now)
{
    for (size_t i = 0; i < d->n; i++)
        if (now > d->w[i].last_ms)
            d->w[i].last_ms = now;
}

size_t cps__detector_tick(cps__detector *d, uint64_t now, uint32_t *dead, size_t cap)
{
    size_t k = 0;
    for (size_t i = 0; i < d->n && k < cap;) {
        watched *w = &d->w[i];
        if (w->gone || (now >= w->not_before_ms && now > w->last_ms &&
                        now - w->last_ms > d->cfg.dead_after_ms)) {
            dead[k++] = w->node;
            *w = d->w[--d->n]; /* reported once; the caller decides what comes next */
        } else {
            i++;
        }
    }
    return k;
}

uint64_t cps__detector_silence(const cps__detector *d, uint32_t node, uint64_t now)
{
    const watched *w = find(d, node);
    if (!w)
        return UINT64_MAX;
    return now > w->last_ms ? now - w->last_ms : 0;
}
