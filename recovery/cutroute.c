/* A checkpoint export's read views across view changes (cutroute.h). */
#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "recovery/cutroute.h"

/* Replicas one range may have been asked: a chain, and as many that replaced its members. */
#define CR_PEERS (2 * CPS_MAX_REPLICAS)

enum { P_ASKED = 1, P_OPEN, P_REFUSED, P_GONE };

typedef struct cr_peer {
    uint32_t node;
    uint8_t state;
    uint8_t in_chain; /* in the range's chain in the last view */
    uint64_t asked;   /* P_ASKED: the view epoch it was last asked under */
    uint64_t seq;
    char url[CPS_ADDR_MAX];
} cr_peer;

typedef struct cr_range {
    uint8_t need, lost, has_seq;
    uint32_t chain_len; /* in the last view */
    uint64_t seq;
    uint32_t reader;
    int last_err; /* the last refusal: what a range all of whose replicas refused reports */
    uint64_t last_step;
    uint32_t np;
    cr_peer p[CR_PEERS];
} cr_range;

struct cps__cutroute {
    uint32_t nranges;
    int all_replicas;
    cr_range *r;
    cps__cr_action *act;
    size_t nact, capact;
};

int cps__cutroute_create(uint32_t nranges, const unsigned char *need, int all_replicas,
                         cps__cutroute **out)
{
    if (!need || !out || nranges == 0 || nranges > CPS_MAX_RANGES)
        return CPS_EINVAL;
    cps__cutroute *cr = calloc(1, sizeof *cr);
    if (!cr || !(cr->r = calloc(nranges, sizeof *cr->r))) {
        free(cr);
        return CPS_ENOMEM;
    }
    cr->nranges = nranges;
    cr->all_replicas = all_replicas;
    for (uint32_t i = 0; i < nranges; i++)
        cr->r[i].need = need[i] != 0;
    *out = cr;
    return 0;
}

void cps__cutroute_destroy(cps__cutroute *cr)
{
    if (!cr)
        return;
    free(cr->r);
    free(cr->act);
    free(cr);
}

static int emit(cps__cutroute *cr, uint8_t kind, uint32_t range, uint32_t node, int err,
                uint64_t step)
{
    if (cr->nact == cr->capact) {
        size_t cap = cr->capact ? cr->capact * 2 : 16;
        cps__cr_action *a = realloc(cr->act, cap * sizeof *a);
        if (!a)
            return CPS_ENOMEM;
        cr->act = a;
        cr->capact = cap;
    }
    cr->act[cr->nact++] = (cps__cr_action){kind, range, node, err, step};
    return 0;
}

static int done(cps__cutroute *cr, int rc, const cps__cr_action **act)
{
    *act = cr->act;
    return rc ? rc : (int)cr->nact;
}

static cr_peer *peer_of(cr_range *g, uint32_t node)
{
    for (uint32_t i = 0; i < g->np; i++)
        if (g->p[i].node == node)
            return &g->p[i];
    return NULL;
}

/* A slot for a new ask: a free one, else one of a replica that left or refused. */
static cr_peer *peer_add(cr_range *g, uint32_t node)
{
    cr_peer *p = NULL;
    if (g->np < CR_PEERS)
        p = &g->p[g->np++];
    for (uint32_t i = 0; !p && i < g->np; i++)
        if (g->p[i].state == P_GONE || g->p[i].state == P_REFUSED)
            p = &g->p[i];
    if (p)
        *p = (cr_peer){.node = node, .state = P_ASKED, .in_chain = 1};
    return p;
}

/* After any change to range r: choose a reader, or declare the range lost once no replica in its
 * chain can still give the cut. */
static int settle(cps__cutroute *cr, uint32_t r)
{
    cr_range *g = &cr->r[r];
    if (!g->need || g->lost || g->reader)
        return 0;
    int pending = 0;
    for (uint32_t i = 0; i < g->np; i++) {
        cr_peer *p = &g->p[i];
        if (!p->in_chain)
            continue;
        if (p->state == P_OPEN && g->has_seq && p->seq == g->seq) {
            g->reader = p->node;
            return emit(cr, CPS_CR_READ_FROM, r, p->node, 0, 0);
        }
        pending |= p->state == P_ASKED;
    }
    /* A replica asked and not yet answered may still open at the cut: wait for it. One that
     * refused for a stale view was forgotten and is asked again with the next view. */
    if (pending)
        return 0;
    int err = 0;
    uint64_t step = 0;
    if (g->chain_len == 0) {
        err = CPS_EUNAVAILABLE;
    } else if (g->has_seq) {
        err = CPS_EAGAIN; /* the views at the cut's sequence number are gone */
    } else {
        int asked_all = 1;
        for (uint32_t i = 0; i < g->np; i++)
            asked_all &= !g->p[i].in_chain || g->p[i].state == P_REFUSED;
        if (!asked_all || !g->last_err)
            return 0; /* a member not asked yet (its ask was refused as stale): the next view */
        err = g->last_err;
        step = g->last_step;
    }
    g->lost = 1;
    return emit(cr, CPS_CR_LOST, r, 0, err, step);
}

static int is_asked(const cps__cutroute *cr, const cr_range *g, const cps__range *c, uint32_t k)
{
    /* Once the range has its sequence number, replicas that joined since are not asked: they
     * copied their state after the cut, so theirs cannot be the same. */
    return !g->has_seq && (cr->all_replicas || k + 1 == c->chain_len);
}

int cps__cutroute_view(cps__cutroute *cr, const cps__view *v, const cps__cr_action **act)
{
    cr->nact = 0;
    if (!v || v->nranges != cr->nranges)
        return done(cr, CPS_EINVAL, act);
    int rc = 0;
    for (uint32_t r = 0; rc == 0 && r < cr->nranges; r++) {
        cr_range *g = &cr->r[r];
        const cps__range *c = &v->ranges[r];
        if (!g->need || g->lost)
            continue;
        g->chain_len = c->chain_len;
        for (uint32_t i = 0; i < g->np; i++)
            g->p[i].in_chain = 0;
        for (uint32_t k = 0; rc == 0 && k < c->chain_len; k++) {
            cr_peer *p = peer_of(g, c->chain[k]);
            if (p && p->state == P_GONE && is_asked(cr, g, c, k)) {
                /* It left the chain and is back (a restarted server rejoins under its id): its
                 * ask went with its process, and nothing else would ask it again, so a range
                 * whose other replicas are gone waited for it until the export's timeout. */
                *p = (cr_peer){
                    .node = c->chain[k], .state = P_ASKED, .in_chain = 1, .asked = v->epoch};
                rc = emit(cr, CPS_CR_ASK, r, c->chain[k], 0, 0);
            } else if (p && p->state == P_ASKED && v->epoch > p->asked) {
                /* Still unanswered under a newer view: ask again. Its process may have died
                 * and come back between two views we looked at (the view that dropped it
                 * unseen), taking the ask along; a server that holds the ask takes this one
                 * as a repeat. */
                p->in_chain = 1;
                p->asked = v->epoch;
                rc = emit(cr, CPS_CR_ASK, r, c->chain[k], 0, 0);
            } else if (p) {
                p->in_chain = 1;
            } else if (is_asked(cr, g, c, k)) {
                if (!(p = peer_add(g, c->chain[k])))
                    continue; /* every slot holds a live ask: this one waits for a later view */
                p->asked = v->epoch;
                rc = emit(cr, CPS_CR_ASK, r, c->chain[k], 0, 0);
            }
        }
        for (uint32_t i = 0; i < g->np; i++) {
            cr_peer *p = &g->p[i];
            if (!p->in_chain && (p->state == P_OPEN || p->state == P_ASKED))
                p->state = P_GONE;
            if (!p->in_chain && g->reader == p->node)
                g->reader = 0;
        }
        if (rc == 0)
            rc = settle(cr, r);
    }
    return done(cr, rc, act);
}

static cr_range *range_at(cps__cutroute *cr, uint32_t range)
{
    return range < cr->nranges && cr->r[range].need ? &cr->r[range] : NULL;
}

int cps__cutroute_opened(cps__cutroute *cr, uint32_t range, uint32_t node, uint64_t seq,
                         const char *url, const cps__cr_action **act)
{
    cr->nact = 0;
    cr_range *g = range_at(cr, range);
    cr_peer *p = g ? peer_of(g, node) : NULL;
    if (!url || strlen(url) >= CPS_ADDR_MAX)
        return done(cr, CPS_EINVAL, act);
    if (!p || p->state != P_ASKED) /* not asked, or left the chain: its view serves nobody */
        return done(cr, emit(cr, CPS_CR_CLOSE, range, node, 0, 0), act);
    if (!g->has_seq && !g->lost) {
        g->has_seq = 1;
        g->seq = seq;
    }
    if (g->lost || seq != g->seq) {
        p->state = P_REFUSED;
        return done(cr, emit(cr, CPS_CR_CLOSE, range, node, 0, 0), act);
    }
    p->state = P_OPEN;
    p->seq = seq;
    strcpy(p->url, url);
    return done(cr, settle(cr, range), act);
}

int cps__cutroute_refused(cps__cutroute *cr, uint32_t range, uint32_t node, int err, uint64_t step,
                          const cps__cr_action **act)
{
    cr->nact = 0;
    cr_range *g = range_at(cr, range);
    cr_peer *p = g ? peer_of(g, node) : NULL;
    if (!p || p->state != P_ASKED)
        return done(cr, 0, act);
    if (err == CPS_ESTALE_EPOCH) {
        *p = g->p[--g->np]; /* forgotten: asked again if a later view has it in the chain */
    } else {
        p->state = P_REFUSED;
        g->last_err = err ? err : CPS_EPROTO;
        g->last_step = step > g->last_step ? step : g->last_step;
    }
    return done(cr, settle(cr, range), act);
}

int cps__cutroute_closed(cps__cutroute *cr, uint32_t range, uint32_t node,
                         const cps__cr_action **act)
{
    cr->nact = 0;
    cr_range *g = range_at(cr, range);
    cr_peer *p = g ? peer_of(g, node) : NULL;
    if (!p)
        return done(cr, 0, act);
    p->state = P_GONE;
    if (g->reader == node)
        g->reader = 0;
    return done(cr, settle(cr, range), act);
}

uint32_t cps__cutroute_reader(const cps__cutroute *cr, uint32_t range)
{
    return range < cr->nranges ? cr->r[range].reader : 0;
}

const char *cps__cutroute_url(const cps__cutroute *cr, uint32_t range, uint32_t node)
{
    if (range >= cr->nranges)
        return NULL;
    const cr_range *g = &cr->r[range];
    for (uint32_t i = 0; i < g->np; i++)
        if (g->p[i].node == node && g->p[i].state == P_OPEN)
            return g->p[i].url;
    return NULL;
}

uint64_t cps__cutroute_seq(const cps__cutroute *cr, uint32_t range)
{
    return range < cr->nranges ? cr->r[range].seq : 0;
}

int cps__cutroute_ready(const cps__cutroute *cr)
{
    for (uint32_t r = 0; r < cr->nranges; r++)
        if (cr->r[r].need && (cr->r[r].lost || !cr->r[r].reader))
            return 0;
    return 1;
}

void cps__cutroute_each_open(const cps__cutroute *cr,
                             void (*fn)(void *ctx, uint32_t range, uint32_t node), void *ctx)
{
    for (uint32_t r = 0; r < cr->nranges; r++)
        for (uint32_t i = 0; i < cr->r[r].np; i++)
            if (cr->r[r].p[i].state == P_OPEN)
                fn(ctx, r, cr->r[r].p[i].node);
}
