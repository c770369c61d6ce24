/* Sync-mode aggregation slots: see sync.h. */
#include "sync.h"

#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "core/array.h"

typedef struct slot {
    int used;
    uint32_t range;
    uint64_t sig, step;
    uint32_t count;
    int ready; /* complete, held until every earlier step of its key set is submitted */
    uint64_t since_ms, warned_ms;
    /* Kept when the slot is released: a SUBMIT's by_rank points here until the next call, and
     * the next step of the key set reuses it without an allocation. */
    cps__sync_contrib *by_rank;
    uint32_t nranks, cap;
} slot;

/* Backup workers: the last closed step of a key set, and the last request of a worker that an
 * aggregate included, per range. */
typedef struct closed_rec {
    uint32_t range;
    uint64_t sig, step;
} closed_rec;

typedef struct member_rec {
    uint32_t range, worker;
    uint64_t req_seq;
} member_rec;

struct cps__sync {
    slot *slots;
    uint32_t nslots;
    closed_rec *closed;
    size_t nclosed, closed_cap;
    member_rec *members;
    size_t nmembers, members_cap;
    void (*drop)(void *ctx, void *cookie);
    void *ctx;
    cps__sync_action *acts;
    size_t nacts, acts_cap;
};

int cps__sync_create(void (*drop)(void *ctx, void *cookie), void *ctx, cps__sync **out)
{
    cps__sync *a = calloc(1, sizeof *a);
    if (!a)
        return CPS_ENOMEM;
    a->drop = drop;
    a->ctx = ctx;
    *out = a;
    return 0;
}

void cps__sync_destroy(cps__sync *a)
{
    if (!a)
        return;
    for (uint32_t i = 0; i < a->nslots; i++) {
        slot *s = &a->slots[i];
        for (uint32_t r = 0; s->used && a->drop && r < s->nranks; r++)
            if (s->by_rank[r].cookie)
                a->drop(a->ctx, s->by_rank[r].cookie);
        free(s->by_rank);
    }
    free(a->slots);
    free(a->closed);
    free(a->members);
    free(a->acts);
    free(a);
}

void cps__sync_forget_range(cps__sync *a, uint32_t range)
{
    for (uint32_t i = 0; a && i < a->nslots; i++) {
        slot *s = &a->slots[i];
        if (!s->used || s->range != range)
            continue;
        for (uint32_t r = 0; a->drop && r < s->nranks; r++)
            if (s->by_rank[r].cookie)
                a->drop(a->ctx, s->by_rank[r].cookie);
        memset(s->by_rank, 0, sizeof *s->by_rank * s->cap);
        s->used = 0;
        s->ready = 0;
    }
}

static int emit(cps__sync *a, int kind, const slot *s)
{
    void *acts = a->acts;
    if (cps__array_reserve(&acts, &a->acts_cap, a->nacts + 1, sizeof *a->acts, 8) != 0)
        return CPS_ENOMEM;
    a->acts = acts;
    a->acts[a->nacts++] = (cps__sync_action){kind,        s->range, s->sig,    s->step,
                                             s->since_ms, s->count, s->nranks, s->by_rank};
    return 0;
}

static slot *find_slot(cps__sync *a, uint32_t range, uint64_t sig, uint64_t step, uint32_t nranks,
                       uint64_t now)
{
    slot *free_slot = NULL;
    for (uint32_t i = 0; i < a->nslots; i++) {
        slot *s = &a->slots[i];
        if (s->used && s->range == range && s->sig == sig && s->step == step)
            return s;
        if (!s->used && !free_slot)
            free_slot = s;
    }
    if (!free_slot) {
        void *slots = a->slots;
        size_t cap = a->nslots;
        if (cps__array_reserve(&slots, &cap, cap + 1, sizeof *a->slots, 8) != 0)
            return NULL;
        a->slots = slots;
        memset(a->slots + a->nslots, 0, (cap - a->nslots) * sizeof *a->slots);
        free_slot = &a->slots[a->nslots];
        a->nslots = (uint32_t)cap;
    }
    if (free_slot->cap < nranks) {
        cps__sync_contrib *b = realloc(free_slot->by_rank, nranks * sizeof *b);
        if (!b)
            return NULL;
        free_slot->by_rank = b;
        free_slot->cap = nranks;
    }
    if (nranks)
        memset(free_slot->by_rank, 0, nranks * sizeof *free_slot->by_rank);
    free_slot->used = 1;
    free_slot->range = range;
    free_slot->sig = sig;
    free_slot->step = step;
    free_slot->count = 0;
    free_slot->ready = 0;
    free_slot->nranks = nranks;
    free_slot->since_ms = now;
    free_slot->warned_ms = 0;
    return free_slot;
}

/* Rank `rank` has made its first push of s's key set since it joined the job (the push's
 * CPS_WF_FIRST), at a later step than s's: it has no push of s's step to come, so s does not
 * wait for it. That is a worker that joined a running job (a replacement): its declare told it
 * the step each range of a tensor had applied, and where the heads of the ranges learnt of it
 * at different moments relative to the other workers' pushes, one range had closed step t
 * without it and another waits for it at t (fmnist, issue 26: a deadlock in 6 of 6 runs). The
 * worker starts after the highest of those steps, and its first push excuses it from the steps
 * below on every range, so every range closes them with the same workers. Only the first push
 * says so: later pushes of a worker may be pipelined and overtake each other. */
static int pushed_later(const cps__sync *a, const slot *s, uint32_t rank)
{
    for (uint32_t i = 0; i < a->nslots; i++) {
        const slot *o = &a->slots[i];
        if (o->used && o->range == s->range && o->sig == s->sig && o->step > s->step &&
            rank < o->nranks && o->by_rank[rank].cookie && o->by_rank[rank].first)
            return 1;
    }
    return 0;
}

/* Complete once no live worker is missing (a worker that pushed a later step is not missing:
 * pushed_later); a slot nobody pushed to (only a retry's lookup opened it) never completes on
 * its own. */
static int slot_complete(const cps__sync *a, const slot *s, const cps__view *v)
{
    uint32_t live = 0, missing = 0;
    for (uint32_t i = 0; i < v->nnodes; i++) {
        const cps__node_info *n = &v->nodes[i];
        if (n->role != CPS_ROLE_WORKER || !n->alive)
            continue;
        live++;
        if (n->rank < s->nranks && !s->by_rank[n->rank].cookie && !pushed_later(a, s, n->rank))
            missing++;
    }
    if (missing == 0 || s->count == 0)
        return s->count > 0;
    /* Backup workers: the first max(1, W - b) pushes make the step. */
    uint32_t need = live > v->backup_workers ? live - v->backup_workers : 1;
    return v->backup_workers > 0 && s->count >= need;
}

/* An earlier step of s's key set that someone pushed to and that is not submitted yet. */
static int earlier_step_open(const cps__sync *a, const slot *s)
{
    for (uint32_t i = 0; i < a->nslots; i++) {
        const slot *o = &a->slots[i];
        if (o->used && o->count > 0 && o->range == s->range && o->sig == s->sig &&
            o->step < s->step)
            return 1;
    }
    return 0;
}

static closed_rec *find_closed(const cps__sync *a, uint32_t range, uint64_t sig)
{
    for (size_t i = 0; i < a->nclosed; i++)
        if (a->closed[i].range == range && a->closed[i].sig == sig)
            return &a->closed[i];
    return NULL;
}

static member_rec *find_member(const cps__sync *a, uint32_t range, uint32_t worker)
{
    for (size_t i = 0; i < a->nmembers; i++)
        if (a->members[i].range == range && a->members[i].worker == worker)
            return &a->members[i];
    return NULL;
}

int cps__sync_record(cps__sync *a, uint32_t range, uint64_t sig, uint64_t step, uint32_t nmembers,
                     const cps__sync_member *members)
{
    closed_rec *c = sig ? find_closed(a, range, sig) : NULL;
    if (sig && !c) {
        void *p = a->closed;
        if (cps__array_reserve(&p, &a->closed_cap, a->nclosed + 1, sizeof *a->closed, 8) != 0)
            return CPS_ENOMEM;
        a->closed = p;
        c = &a->closed[a->nclosed++];
        *c = (closed_rec){range, sig, 0};
    }
    if (c && step > c->step)
        c->step = step;
    for (uint32_t i = 0; i < nmembers; i++) {
        member_rec *m = find_member(a, range, members[i].worker);
        if (!m) {
            void *p = a->members;
            if (cps__array_reserve(&p, &a->members_cap, a->nmembers + 1, sizeof *a->members, 8) !=
                0)
                return CPS_ENOMEM;
            a->members = p;
            m = &a->members[a->nmembers++];
            *m = (member_rec){range, members[i].worker, 0};
        }
        if (members[i].req_seq > m->req_seq)
            m->req_seq = members[i].req_seq;
    }
    return 0;
}

int cps__sync_check(const cps__sync *a, uint32_t range, uint64_t sig, uint64_t step,
                    uint32_t worker, uint64_t req_seq, uint64_t *closed)
{
    const closed_rec *c = find_closed(a, range, sig);
    uint64_t last = c ? c->step : 0;
    if (closed)
        *closed = last;
    if (step > last)
        return CPS_SYNC_OPEN;
    const member_rec *m = find_member(a, range, worker);
    if (!m || req_seq > m->req_seq)
        return CPS_SYNC_LATE;
    return req_seq == m->req_seq ? CPS_SYNC_APPLIED : CPS_SYNC_STALE;
}

/* Submit ready slots, each only once no earlier step of its key set is open. Why the order:
 * the head takes a push of a step at or below the last one applied as a duplicate, so a later
 * step applied first would answer an earlier step's missing pushes as applied though they are
 * in no update (a worker with two steps in flight whose first push was lost, or a step given up
 * and re-sent detached: simulator seed 576 with --give-up). */
static int release_ready(cps__sync *a)
{
    for (;;) {
        slot *next = NULL;
        for (uint32_t i = 0; i < a->nslots; i++) {
            slot *s = &a->slots[i];
            if (s->used && s->ready && !earlier_step_open(a, s)) {
                next = s;
                break;
            }
        }
        if (!next)
            return 0;
        int rc = emit(a, CPS_SA_SUBMIT, next);
        if (rc != 0)
            return rc;  /* still ready: released at the next call */
        next->used = 0; /* by_rank stays allocated for the action and the next step */
    }
}

static int try_complete(cps__sync *a, slot *s, const cps__view *v)
{
    if (slot_complete(a, s, v))
        s->ready = 1;
    return release_ready(a);
}

/* A push of `s`'s step may complete the key set's earlier slots (pushed_later). */
static void mark_earlier_ready(cps__sync *a, const slot *s, const cps__view *v)
{
    for (uint32_t i = 0; i < a->nslots; i++) {
        slot *o = &a->slots[i];
        if (o != s && o->used && !o->ready && o->range == s->range && o->sig == s->sig &&
            o->step < s->step && slot_complete(a, o, v))
            o->ready = 1;
    }
}

int cps__sync_push(cps__sync *a, const cps__view *v, uint32_t range, uint64_t sig, uint64_t step,
                   uint32_t rank, const cps__sync_contrib *c, uint64_t now)
{
    a->nacts = 0;
    if (rank >= v->num_workers || !c->cookie)
        return CPS_EINVAL;
    /* A closed step never opens a slot again: it would wait for pushes that already made the
     * step, and hold back every later step of the key set behind it. */
    int closed = v->backup_workers > 0
                     ? cps__sync_check(a, range, sig, step, c->worker, c->req_seq, NULL)
                     : CPS_SYNC_OPEN;
    if (closed != CPS_SYNC_OPEN)
        return closed;
    slot *s = find_slot(a, range, sig, step, v->num_workers, now);
    if (!s)
        return CPS_ENOMEM;
    if (rank >= s->nranks)
        return CPS_EINVAL; /* the slot was opened under a view with fewer workers */
    if (s->by_rank[rank].cookie)
        return CPS_SYNC_RETRY;
    for (uint32_t r = 0; r < s->nranks; r++)
        if (s->by_rank[r].cookie && s->by_rank[r].nvals != c->nvals)
            return CPS_SYNC_SIZE;
    /* Emit room first: once taken, the cookie must not be lost to a failed emit. */
    if (a->nacts == a->acts_cap && emit(a, CPS_SA_SUBMIT, s) != 0)
        return CPS_ENOMEM;
    a->nacts = 0;
    s->by_rank[rank] = *c;
    s->count++;
    mark_earlier_ready(a, s, v);
    try_complete(a, s, v);
    return CPS_SYNC_TAKEN;
}

int cps__sync_set_view(cps__sync *a, const cps__view *v)
{
    a->nacts = 0;
    int rc = 0;
    for (uint32_t i = 0; i < a->nslots && rc == 0; i++)
        if (a->slots[i].used)
            rc = try_complete(a, &a->slots[i], v);
    return rc;
}

static uint64_t ms_since(uint64_t now, uint64_t then)
{
    return now > then ? now - then : 0;
}

int cps__sync_tick(cps__sync *a, uint64_t now)
{
    a->nacts = 0;
    for (uint32_t i = 0; i < a->nslots; i++) {
        slot *s = &a->slots[i];
        /* A ready slot waits for an earlier step, which is reported itself. The shell's clock
         * for a tick can be read a little before the push that opened a slot was stamped: a
         * slot opened "later" than now has waited 0 ms (unsigned now - since would wrap and
         * report it stuck at once, for 18446744073709552 s). */
        if (!s->used || s->ready || ms_since(now, s->since_ms) < CPS_SYNC_STUCK_MS ||
            (s->warned_ms && ms_since(now, s->warned_ms) < CPS_SYNC_STUCK_REPEAT_MS))
            continue;
        int rc = emit(a, CPS_SA_STUCK, s);
        if (rc != 0)
            return rc;
        s->warned_ms = now;
    }
    return 0;
}

uint32_t cps__sync_pending(const cps__sync *a)
{
    uint32_t n = 0;
    for (uint32_t i = 0; a && i < a->nslots; i++)
        n += a->slots[i].used != 0;
    return n;
}

size_t cps__sync_actions(cps__sync *a, const cps__sync_action **out)
{
    *out = a->acts;
    return a->nacts;
}
