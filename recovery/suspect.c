/* Failure detection through the data path: see suspect.h. */
#include "suspect.h"

#include <stdlib.h>

#include "chainps/error.h"
#include "core/array.h"

typedef struct watched {
    uint32_t node;
    uint64_t probed; /* the nonce of the round it was probed in (0: none) */
    int answered;    /* it answered that probe */
} watched;

/* Milliseconds since `since`, 0 if `now` is earlier: callers may pass a `now` read before the
 * one that started a round (the scheduler's loop takes its clock once per turn, while a report
 * handled in that turn read it later), and an unsigned `now - since` would then wrap to ~2^64:
 * the round would be over at once and every server not yet answering declared dead (issue 26's
 * soak: three servers of a 4-server job declared dead 1 ms after a probe, "unanswered for
 * 18446744073709551615 ms"). */
static uint64_t elapsed(uint64_t now, uint64_t since)
{
    return now > since ? now - since : 0;
}

struct cps__suspect {
    cps__suspect_config cfg;
    uint64_t epoch;
    watched *w;
    size_t n, cap;
    uint64_t nonce;    /* the current (or last) round's; rounds count from 1 */
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
    s->w[s->n++] = (watched){node, 0, 0};
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
    if (s->probing || (s->nonce && elapsed(now, s->round_ms) < s->cfg.probe_ms))
        return CPS_SUS_PROBING; /* one round at a time, at most one per probe_ms */
    s->nonce++;
    s->probing = 1;
    s->round_ms = now;
    s->round_by = in->reporter;
    /* Every server, not only the one named: the reporter sees where its requests stop being
     * answered, which is the head even when the head waits on a successor that is cut off. */
    for (size_t i = 0; i < s->n; i++) {
        s->w[i].probed = s->nonce;
        s->w[i].answered = 0;
        s->acts[s->nacts++] =
            (cps__suspect_action){CPS_SUS_PROBE, s->w[i].node, s->nonce, 0, in->reporter};
    }
    return CPS_SUS_PROBING;
}

void cps__suspect_answered(cps__suspect *s, uint32_t node, uint64_t nonce)
{
    watched *w = find(s, node);
    if (w && nonce != 0 && w->probed == nonce)
        w->answered = 1;
}

void cps__suspect_tick(cps__suspect *s, uint64_t now)
{
    s->nacts = 0;
    if (!s->probing)
        return;
    int waiting = 0;
    for (size_t i = 0; i < s->n; i++)
        waiting |= s->w[i].probed == s->nonce && !s->w[i].answered;
    if (!waiting) {
        s->probing = 0; /* everyone answered: the reporters' silence is explained elsewhere */
        return;
    }
    if (elapsed(now, s->round_ms) < s->cfg.probe_ms)
        return;
    s->probing = 0;
    for (size_t i = 0; i < s->n;) {
        watched *w = &s->w[i];
        if (w->probed == s->nonce && !w->answered) {
            s->acts[s->nacts++] = (cps__suspect_action){CPS_SUS_DEAD, w->node, s->nonce,
                                                        elapsed(now, s->round_ms), s->round_by};
            *w = s->w[--s->n]; /* reported once; the caller declares it dead */
        } else {
            i++;
        }
    }
}

void cps__suspect_refresh(cps__suspect *s, uint64_t now)
{
    if (s->probing && now > s->round_ms)
        s->round_ms = now;
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
