/* Failure detection through the data path: see suspect.h. */
#include "suspect.h"

#include <stdlib.h>

#include "chainps/error.h"
#include "core/array.h"

typedef struct watched {
    uint32_t node;
    uint64_t probed;  /* the nonce of its outstanding probe, the current one (0: none) */
    uint64_t first;   /* the nonce of the round's probe, still proof of life when asked again */
    int answered;     /* it answered a probe of this round */
    int tries;        /* 1: the round's probe; 2: asked again after leaving it unanswered */
    uint64_t sent_ms; /* when the current probe went out */
} watched;

struct cps__suspect {
    cps__suspect_config cfg;
    uint64_t epoch;
    watched *w;
    size_t n, cap;
    uint64_t nonce;    /* the last probe's; every probe has its own */
    int rounds;        /* a round was started */
    int probing;       /* a round is under way */
    uint64_t round_ms; /* when it started */
    uint32_t round_by; /* the reporter that started it */
    cps__suspect_action *acts;
    size_t nacts, acts_cap;
};

int cps__suspect_create(const cps__suspect_config *cfg, cps__suspect **out)
{
    if (!cfg || !out || cfg->evidence_ms == 0 || cfg->probe_ms == 0)
        return CPS_EINVAL;
    cps__suspect *s = calloc(1, sizeof *s);
    if (!s)
        return CPS_ENOMEM;
    s->cfg = *cfg;
    *out = s;
    return 0;
}

void cps__suspect_destroy(cps__suspect *s)
{
    if (s) {
        free(s->w);
        free(s->acts);
        free(s);
    }
}

static watched *find(const cps__suspect *s, uint32_t node)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->w[i].node == node)
            return &s->w[i];
    return NULL;
}

int cps__suspect_watch(cps__suspect *s, uint32_t node)
{
    if (find(s, node))
        return 0;
    void *p = s->w;
    int rc = cps__array_reserve(&p, &s->cap, s->n + 1, sizeof *s->w, 8);
    s->w = p;
    if (rc != 0)
        return rc;
    /* Room for one action per watched server, reserved here so no other call needs memory. */
    p = s->acts;
    rc = cps__array_reserve(&p, &s->acts_cap, s->n + 1, sizeof *s->acts, 8);
    s->acts = p;
    if (rc != 0)
        return rc;
    /* Not probed in a round under way: it is judged from the next one. */
    s->w[s->n++] = (watched){node, 0, 0, 0, 0, 0};
    return 0;
}

void cps__suspect_forget(cps__suspect *s, uint32_t node)
{
    watched *w = find(s, node);
    if (w)
        *w = s->w[--s->n];
}

void cps__suspect_epoch(cps__suspect *s, uint64_t epoch)
{
    if (epoch > s->epoch)
        s->epoch = epoch;
}

/* Time since the probe round started. The caller's clocks need not agree to the millisecond:
 * the scheduler starts a round at a report's arrival and ticks with its loop's time, which can
 * be read a few ms earlier. A round started "later" than now has waited 0 ms (unsigned
 * now - round_ms wrapped there, and a round that had just sent its probes declared every server
 * that had not answered yet dead at once: issue 26, chaos on fmnist, three servers and a range
 * with no replica). */
static uint64_t since(uint64_t then, uint64_t now)
{
    return now > then ? now - then : 0;
}

static uint64_t since_round(const cps__suspect *s, uint64_t now)
{
    return since(s->round_ms, now);
}

/* A probe's nonce: never one an earlier probe had, in this life or an earlier one of the
 * scheduler (whose epochs are older: a restarted scheduler starts at a newer one), so an answer
 * counts only for the probe it answers. */
static uint64_t next_nonce(cps__suspect *s)
{
    uint64_t floor = s->epoch << 32;
    s->nonce = s->nonce + 1 > floor ? s->nonce + 1 : floor + 1;
    return s->nonce;
}

int cps__suspect_report(cps__suspect *s, const cps__suspect_report_in *in, uint64_t now)
{
    s->nacts = 0;
    if (in->epoch != s->epoch)
        return CPS_SUS_STALE_EPOCH;
    if (!in->reporter_live)
        return CPS_SUS_REPORTER;
    if (in->suspect == in->reporter || !find(s, in->suspect))
        return CPS_SUS_UNKNOWN;
    if (in->unanswered_ms < s->cfg.evidence_ms)
        return CPS_SUS_WEAK;
    if (s->probing || (s->rounds && since_round(s, now) < s->cfg.probe_ms))
        return CPS_SUS_PROBING; /* one round at a time, at most one per probe_ms */
    s->rounds = 1;
    s->probing = 1;
    s->round_ms = now;
    s->round_by = in->reporter;
    /* Every server, not only the one named: the reporter sees where its requests stop being
     * answered, which is the head even when the head waits on a successor that is cut off. */
    uint64_t nonce = next_nonce(s); /* the round's; a probe asked again gets its own */
    for (size_t i = 0; i < s->n; i++) {
        s->w[i] = (watched){s->w[i].node, nonce, nonce, 0, 1, now};
        s->acts[s->nacts++] =
            (cps__suspect_action){CPS_SUS_PROBE, s->w[i].node, s->w[i].probed, 0, in->reporter};
    }
    return CPS_SUS_PROBING;
}

void cps__suspect_answered(cps__suspect *s, uint32_t node, uint64_t nonce)
{
    watched *w = find(s, node);
    /* Either probe of the round: an answer to the first one, however late, was sent by a server
     * that got our message in this round, which is all the round asks. A nonce of an earlier
     * round or life is neither. */
    if (w && nonce != 0 && w->probed && (w->probed == nonce || w->first == nonce))
        w->answered = 1;
}

/* How long a server's current probe may go unanswered: the round's probe probe_ms; the one
 * asked again, half that (a fresh message on a link that served the first one late). */
static uint64_t probe_limit(const cps__suspect *s, const watched *w)
{
    uint64_t half = s->cfg.probe_ms / 2;
    return w->tries > 1 ? (half ? half : 1) : s->cfg.probe_ms;
}

void cps__suspect_tick(cps__suspect *s, uint64_t now)
{
    s->nacts = 0;
    if (!s->probing)
        return;
    int waiting = 0;
    for (size_t i = 0; i < s->n;) {
        watched *w = &s->w[i];
        if (!w->probed || w->answered) {
            i++;
            continue;
        }
        if (since(w->sent_ms, now) < probe_limit(s, w)) {
            waiting = 1;
            i++;
        } else if (w->tries == 1 && !s->cfg.single_probe) {
            /* One late message is not a death: ask again. The first probe's answer still counts
             * if it comes (the message held back may be the probe or its answer). */
            *w = (watched){w->node, next_nonce(s), w->first, 0, 2, now};
            s->acts[s->nacts++] =
                (cps__suspect_action){CPS_SUS_PROBE, w->node, w->probed, 0, s->round_by};
            waiting = 1;
            i++;
        } else {
            s->acts[s->nacts++] = (cps__suspect_action){CPS_SUS_DEAD, w->node, w->probed,
                                                        since_round(s, now), s->round_by};
            *w = s->w[--s->n]; /* reported once; the caller declares it dead */
        }
    }
    /* Everyone answered (or is judged): the reporters' silence is explained elsewhere. */
    if (!waiting)
        s->probing = 0;
}

void cps__suspect_refresh(cps__suspect *s, uint64_t now)
{
    if (!s->probing)
        return;
    if (now > s->round_ms)
        s->round_ms = now;
    for (size_t i = 0; i < s->n; i++)
        if (s->w[i].probed && now > s->w[i].sent_ms)
            s->w[i].sent_ms = now;
}

size_t cps__suspect_actions(const cps__suspect *s, const cps__suspect_action **out)
{
    *out = s->acts;
    return s->nacts;
}

int cps__suspect_probing(const cps__suspect *s)
{
    return s->probing;
}

int cps__suspect_list_add(cps__suspect_entry *e, uint32_t *n, uint32_t node, uint64_t waiting_since,
                          uint64_t heard, uint64_t now, uint32_t evidence_ms)
{
    uint64_t from = heard > waiting_since ? heard : waiting_since;
    if (!waiting_since || now <= from || now - from < evidence_ms || *n >= CPS_SUSPECT_MAX)
        return 0;
    uint32_t at = (*n)++;
    while (at > 0 && e[at - 1].node > node) {
        e[at] = e[at - 1];
        at--;
    }
    e[at].node = node;
    e[at].unanswered_ms = now - from > UINT32_MAX ? UINT32_MAX : (uint32_t)(now - from);
    return 1;
}
