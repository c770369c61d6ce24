/* Ring AllReduce state machine (collective.h). */
#include "replication/collective.h"

#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "core/array.h"

#define DEFAULT_CHUNK (256u * 1024u)
/* Largest collective: its index arithmetic and the wire's u32 payload lengths stay in range. */
#define MAX_VALUES (1ull << 32)

typedef struct stashed {
    cps__coll_msg m; /* m.vals points to vals */
    float *vals;
} stashed;

struct cps__coll {
    uint32_t me;
    uint64_t chunk;
    uint64_t timeout_ms;
    /* the view */
    uint64_t epoch;
    uint32_t *members;
    uint32_t nmembers;
    int need_peers;
    int joining; /* cps__coll_set_joining, until the first completion */
    int alone;   /* running with no peer: waiting for a view with one */
    int listen;  /* a joiner restarted by a view: waiting for its predecessor's seq */
    /* While listening: which members said they listen too (CPS_COLL_LISTEN, by position), how
     * many, the highest seq they named, and the highest a pinned one named (0: none pinned). */
    uint8_t *heard;
    uint32_t nheard;
    uint64_t heard_max;
    uint64_t heard_pinned;
    int seq_given; /* cps__coll_set_next_seq: our sequence came from a member's completed one */
    /* A joiner that reduced its own segment of its running collective (this seq; 0: not yet):
     * its input may be in that collective's result at a peer now, so its call never moves to a
     * later seq (that would count its input twice); a peer that completed it answers our
     * restart with the result. */
    uint64_t pinned;
    /* Helping: our running collective (this seq) is set aside while we run an earlier one that
     * the ring redoes and we skipped (see help()); 0: not helping. */
    uint64_t help_for;
    /* While helping, our contribution: zeros (help()), one chunk's worth (no message spans
     * more), read for every chunk. Grown to the largest chunk helped. */
    float *zeros;
    uint64_t zeros_cap;
    /* the running collective */
    int running;
    uint64_t seq; /* the running one's, else the last started */
    int op;
    float *data; /* the caller's: input until DONE, then the result */
    uint64_t n;
    uint32_t pos, p;  /* our position in the ring, ring size */
    uint64_t nchunks; /* C: chunks per segment */
    uint64_t next_in; /* index of the message expected from our predecessor */
    uint64_t last_progress;
    /* Working buffers: reductions land here, so the caller's input stays intact for a restart.
     * Collective seq uses buf[seq & 1]; after DONE that buffer holds its result, kept through
     * the next collective for members that restart the one we completed (they cannot be two
     * behind: starting seq+2 needs our part of seq+1, given only after we completed seq). */
    float *buf[2];
    uint64_t cap[2];
    float *work;       /* buf[seq & 1] of the running collective */
    uint64_t done_seq; /* 0: none */
    uint64_t done_n;
    uint64_t bcast_epoch; /* epoch under which done_seq's result was last sent to all */
    /* The (epoch, seq) we last asked the members for (CPS_COLL_ASK): one ask per pair. */
    uint64_t asked_epoch, asked_seq;
    /* cps__coll_lost: a message of the running collective (this epoch and seq) was refused;
     * its result is asked for again every CPS_COLL_LOST_ASK_MS from lost_ask_ms. */
    uint64_t lost_epoch, lost_seq, lost_ask_ms;
    stashed *stash;
    size_t nstash, stash_cap;
    int draining, redrain; /* drain_stash is running; a nested call asked it to rescan */
    cps__coll_act *out;
    size_t nout, out_cap;
    cps__coll_out_fn out_fn; /* cps__coll_set_out */
    void *out_ctx;
    cps__coll_written_fn written_fn; /* cps__coll_set_written */
    cps__coll_stats stats;
};

void cps__coll_segment(uint64_t n, uint32_t p, uint32_t s, uint64_t *lo, uint64_t *hi)
{
    /* n < 2^32 and s <= p <= 2^10, so the products fit in 64 bits. */
    *lo = (uint64_t)s * n / p;
    *hi = (uint64_t)(s + 1) * n / p;
}

uint64_t cps__coll_chunks(uint64_t n, uint32_t p, uint64_t chunk)
{
    uint64_t longest = (n + p - 1) / p; /* no segment is longer than ceil(n/p) */
    uint64_t c = (longest + chunk - 1) / chunk;
    return c ? c : 1;
}

int cps__coll_create(uint32_t me, uint64_t chunk, uint64_t timeout_ms, cps__coll **out)
{
    if (!out || timeout_ms == 0)
        return CPS_EINVAL;
    cps__coll *c = calloc(1, sizeof *c);
    if (!c)
        return CPS_ENOMEM;
    c->me = me;
    c->chunk = chunk ? chunk : DEFAULT_CHUNK;
    c->timeout_ms = timeout_ms;
    *out = c;
    return 0;
}

static void stash_free_all(cps__coll *c)
{
    for (size_t i = 0; i < c->nstash; i++)
        free(c->stash[i].vals);
    c->nstash = 0;
}

void cps__coll_destroy(cps__coll *c)
{
    if (!c)
        return;
    stash_free_all(c);
    free(c->stash);
    free(c->members);
    free(c->heard);
    free(c->buf[0]);
    free(c->buf[1]);
    free(c->zeros);
    free(c->out);
    free(c);
}

size_t cps__coll_actions(const cps__coll *c, const cps__coll_act **out)
{
    *out = c->out;
    return c->nout;
}

int cps__coll_running(const cps__coll *c)
{
    return c->running;
}

void cps__coll_stats_get(const cps__coll *c, cps__coll_stats *out)
{
    *out = c->stats;
}

/* Actions are few per call (C sends at most, at a start); growth failing leaves the collective
 * to its timeout rather than losing order, so it is reported through `oom`. */
static cps__coll_act *act_add(cps__coll *c, int kind)
{
    void *o = c->out;
    if (cps__array_reserve(&o, &c->out_cap, c->nout + 1, sizeof *c->out, 16) != 0)
        return NULL;
    c->out = o;
    cps__coll_act *a = &c->out[c->nout++];
    memset(a, 0, sizeof *a);
    a->kind = kind;
    return a;
}

static void finish(cps__coll *c, int status)
{
    if (c->help_for) {
        c->seq = c->help_for; /* what failed is our own call */
        c->help_for = 0;
    }
    cps__coll_act *a = act_add(c, status == 0 ? CPS_COLL_DONE : CPS_COLL_FAILED);
    if (a) {
        a->seq = c->seq;
        a->status = status;
        a->epoch = c->epoch;
    }
    c->running = 0;
    c->data = NULL;
    c->lost_seq = 0;
    if (status == 0) {
        c->stats.completed++;
        c->joining = 0;
    } else {
        c->stats.failed++;
    }
}

static uint32_t mod_p(int64_t x, uint32_t p)
{
    int64_t r = x % (int64_t)p;
    return (uint32_t)(r < 0 ? r + p : r);
}

/* Values [lo, hi) of message `index` in the running collective, and which segment. */
static void chunk_span(const cps__coll *c, uint64_t index, int sending, uint64_t *lo, uint64_t *hi)
{
    uint64_t k = index / c->nchunks, ch = index % c->nchunks;
    /* Step k sends segment pos-k and receives segment pos-k-1 (both phases). */
    uint32_t s = mod_p((int64_t)c->pos - (int64_t)k - (sending ? 0 : 1), c->p);
    uint64_t slo, shi;
    cps__coll_segment(c->n, c->p, s, &slo, &shi);
    uint64_t a = slo + ch * c->chunk, b = a + c->chunk;
    if (a > shi)
        a = shi;
    if (b > shi)
        b = shi;
    *lo = a;
    *hi = b;
}

static cps__coll_act *send_index(cps__coll *c, uint64_t index)
{
    uint64_t lo, hi;
    chunk_span(c, index, 1, &lo, &hi);
    cps__coll_act *a = act_add(c, CPS_COLL_SEND);
    if (!a)
        return NULL;
    a->to = c->members[(c->pos + 1) % c->p];
    a->msg.from = c->me;
    a->msg.kind = CPS_COLL_DATA;
    a->msg.epoch = c->epoch;
    a->msg.seq = c->seq;
    a->msg.index = index;
    a->msg.n = c->n;
    /* Step 0 sends our own input (zeros while helping: help()); later steps forward what the
     * last step reduced or copied. */
    if (index >= c->nchunks)
        a->msg.vals = c->work + lo;
    else
        a->msg.vals = c->help_for ? c->zeros : c->data + lo;
    a->msg.count = hi - lo;
    return a;
}

void cps__coll_set_out(cps__coll *c, cps__coll_out_fn fn, void *ctx)
{
    c->out_fn = fn;
    c->out_ctx = ctx;
}

void cps__coll_set_written(cps__coll *c, cps__coll_written_fn fn)
{
    c->written_fn = fn;
}

/* The payload of forwarded message a, from the out hook, or NULL (then a points at c->work). */
static float *out_payload(cps__coll *c, cps__coll_act *a)
{
    if (!a || !c->out_fn || !a->msg.count)
        return NULL;
    cps__coll_msg m = a->msg;
    m.vals = NULL;
    float *p = c->out_fn(c->out_ctx, a->to, &m);
    if (p) {
        a->msg.vals = p;
        a->built = 1;
    }
    return p;
}

/* The reduction of a chunk, in + own (divided by div when `mean`), written to d1 and to d2 when
 * not NULL: one expression for every destination, so the bits are the same wherever they land. */
static void reduce_into(float *restrict d1, float *restrict d2, const float *restrict in,
                        const float *restrict own, uint64_t cnt, int mean, float div)
{
    if (mean) {
        if (d2)
            for (uint64_t j = 0; j < cnt; j++)
                d1[j] = d2[j] = (in[j] + own[j]) / div;
        else
            for (uint64_t j = 0; j < cnt; j++)
                d1[j] = (in[j] + own[j]) / div;
    } else if (d2) {
        for (uint64_t j = 0; j < cnt; j++)
            d1[j] = d2[j] = in[j] + own[j];
    } else {
        for (uint64_t j = 0; j < cnt; j++)
            d1[j] = in[j] + own[j];
    }
}

static int member_pos(const cps__coll *c, uint32_t id, uint32_t *pos)
{
    for (uint32_t i = 0; i < c->nmembers; i++)
        if (c->members[i] == id) {
            *pos = i;
            return 1;
        }
    return 0;
}

static void drain_stash(cps__coll *c, uint64_t now);
static void begin(cps__coll *c, uint64_t now);

/* The running collective's result is in c->work: hand it to the caller, or, when we were only
 * helping the ring through an earlier collective, keep it (to give to members that restart it)
 * and go back to our own call, restarted from its untouched input. */
static void complete(cps__coll *c, uint64_t now)
{
    c->done_seq = c->seq;
    c->done_n = c->n;
    if (!c->help_for) {
        memcpy(c->data, c->work, c->n * sizeof(float));
        finish(c, 0);
        return;
    }
    uint64_t own = c->help_for;
    c->help_for = 0;
    if ((own & 1) == (c->seq & 1))
        c->done_seq = 0; /* our own call reuses that buffer */
    c->seq = own;
    c->stats.restarts++;
    begin(c, now);
}

/* A member whose sequence was given (a replacement) runs collective `own`, and a peer sends a
 * chunk of an earlier one, `seq`, which the member we fetched from had completed and we therefore
 * skipped; the survivors redo it under this view, and only we are missing. No member of this
 * view holds its result unless it completed it, and then the ring cannot complete without that
 * member and takes its result instead (CPS_COLL_RESULT): either way everyone gets the same bits,
 * all of one epoch. We take part with zeros: we have no contribution to `seq` (our state came
 * from a member that had completed it), and the caller's buffer is our contribution to `own`,
 * which would otherwise count twice (in `seq` and again in `own`). A mean still divides by the
 * view's members, us included (no member knows we gave nothing). We keep the result out of the
 * caller's buffer, then restart `own` from its untouched input. */
static void help(cps__coll *c, uint64_t seq, uint64_t now)
{
    /* No message carries more than a chunk, nor more than the whole collective. */
    uint64_t need = c->chunk < c->n ? c->chunk : c->n;
    if (need > c->zeros_cap) {
        float *z = calloc(need, sizeof *z);
        if (!z) {
            finish(c, CPS_ENOMEM);
            return;
        }
        free(c->zeros);
        c->zeros = z;
        c->zeros_cap = need;
    }
    c->help_for = c->seq;
    c->seq = seq;
    if (c->done_seq && (c->done_seq & 1) == (seq & 1))
        c->done_seq = 0; /* its buffer is about to hold the helped collective's work */
    c->stats.helped++;
    begin(c, now);
}

/* (Re)start the running collective among the current members, from the caller's input. */
static void begin(cps__coll *c, uint64_t now)
{
    c->last_progress = now;
    c->alone = 0;
    c->listen = 0;
    unsigned b = (unsigned)(c->seq & 1);
    if (c->n > c->cap[b]) {
        float *w = realloc(c->buf[b], c->n * sizeof *w);
        if (!w) {
            finish(c, CPS_ENOMEM);
            return;
        }
        c->buf[b] = w;
        c->cap[b] = c->n;
    }
    c->work = c->buf[b];
    if (!member_pos(c, c->me, &c->pos)) {
        finish(c, CPS_ESTALE_EPOCH);
        return;
    }
    c->p = c->nmembers;
    if (c->p == 1) {
        if (c->need_peers) {
            /* Every peer gone: wait for a view with one (a replacement) until the timeout,
             * which then names the cause. */
            c->alone = 1;
            return;
        }
        /* Alone by design: the sum is our input; the mean is input / 1, the same bits. */
        if (c->help_for)
            memset(c->work, 0, c->n * sizeof(float));
        else
            memcpy(c->work, c->data, c->n * sizeof(float));
        c->bcast_epoch = 0;
        complete(c, now);
        return;
    }
    c->nchunks = cps__coll_chunks(c->n, c->p, c->chunk);
    c->next_in = 0;
    for (uint64_t i = 0; i < c->nchunks; i++)
        send_index(c, i);
    drain_stash(c, now);
}

void cps__coll_set_joining(cps__coll *c)
{
    c->joining = 1;
}

void cps__coll_set_me(cps__coll *c, uint32_t me)
{
    if (!c->members)
        c->me = me;
}

int cps__coll_view(cps__coll *c, uint64_t epoch, const uint32_t *members, uint32_t nmembers,
                   int need_peers, uint64_t now)
{
    c->nout = 0;
    if (epoch <= c->epoch && c->members)
        return 0;
    uint32_t *m = malloc((nmembers ? nmembers : 1) * sizeof *m);
    if (!m)
        return CPS_ENOMEM;
    if (nmembers)
        memcpy(m, members, nmembers * sizeof *m);
    free(c->members);
    c->members = m;
    c->nmembers = nmembers;
    c->need_peers = need_peers;
    c->epoch = epoch;
    uint32_t pos;
    if (c->running && c->joining && nmembers > 1 && member_pos(c, c->me, &pos)) {
        /* A joiner's seq came from a member that may be gone now, ahead of the others: its
         * restarted chunks of that seq would sit in a peer that must first end an earlier one,
         * which needs us, and meet our input of another call there. Send nothing until the new
         * predecessor's first chunk says which collective the ring is in (sim_collective). */
        c->stats.restarts++;
        c->listen = 1;
        c->alone = 0;
        c->last_progress = now;
        /* A ring of joiners only would listen for ever: say so to every member; when all have
         * said it, each takes the highest seq named (the same on all). Evidence, not a timer: a
         * predecessor merely slow sends its chunk later, and we join its collective then. */
        uint8_t *h = calloc(nmembers, 1);
        free(c->heard);
        c->heard = h;
        c->nheard = 0;
        c->heard_max = c->seq;
        c->heard_pinned = c->pinned;
        for (uint32_t i = 0; i < nmembers; i++) {
            if (members[i] == c->me)
                continue;
            cps__coll_act *a = act_add(c, CPS_COLL_SEND);
            if (!a)
                break;
            a->to = members[i];
            a->msg.from = c->me;
            a->msg.kind = CPS_COLL_LISTEN;
            a->msg.epoch = epoch;
            /* Pinned, our seq is the one every member must take (index 1 says so). */
            a->msg.seq = c->pinned ? c->pinned : c->seq;
            a->msg.index = c->pinned ? 1 : 0;
        }
        drain_stash(c, now);
    } else if (c->running) {
        c->stats.restarts++;
        begin(c, now);
    } else {
        drain_stash(c, now);
    }
    return 0;
}

int cps__coll_start(cps__coll *c, float *data, uint64_t n, int op, uint64_t now, uint64_t *seq)
{
    c->nout = 0;
    if (!data || n == 0 || n >= MAX_VALUES || (op != CPS_COLL_SUM && op != CPS_COLL_MEAN) || !seq)
        return CPS_EINVAL;
    if (c->running)
        return CPS_EBUSY;
    if (!c->members)
        return CPS_EINVAL; /* no view yet */
    c->seq++;
    if (c->joining)
        for (size_t i = 0; i < c->nstash; i++)
            if (c->stash[i].m.epoch == c->epoch && c->stash[i].m.kind == CPS_COLL_DATA &&
                c->stash[i].m.seq > c->seq)
                c->seq = c->stash[i].m.seq;
    c->running = 1;
    c->pinned = 0;
    c->data = data;
    c->n = n;
    c->op = op;
    *seq = c->seq;
    begin(c, now);
    return 0;
}

static void stash_add(cps__coll *c, const cps__coll_msg *m)
{
    /* Bounded: a peer can be ahead of us by less than one collective, (P-1) * C messages. */
    size_t limit = (size_t)4 * (c->nmembers + 1) * (c->nchunks + 1) + 64;
    if (c->nstash >= limit) {
        c->stats.dropped_bad++;
        return;
    }
    void *grown = c->stash;
    if (cps__array_reserve(&grown, &c->stash_cap, c->nstash + 1, sizeof *c->stash, 16) != 0)
        return;
    c->stash = grown;
    float *v = malloc((m->count ? m->count : 1) * sizeof *v);
    if (!v)
        return;
    if (m->count)
        memcpy(v, m->vals, m->count * sizeof *v);
    stashed *s = &c->stash[c->nstash++];
    s->m = *m;
    s->m.vals = v;
    s->vals = v;
    c->stats.stashed++;
}

/* `only`: sent to this member alone (index 1), so its receiver does not take it that every
 * member got it (index 0: a broadcast). */
static void send_result(cps__coll *c, uint32_t to, int only)
{
    cps__coll_act *a = act_add(c, CPS_COLL_SEND);
    if (!a)
        return;
    a->to = to;
    a->msg.from = c->me;
    a->msg.kind = CPS_COLL_RESULT;
    a->msg.epoch = c->epoch;
    a->msg.seq = c->done_seq;
    a->msg.index = only ? 1 : 0;
    a->msg.n = c->done_n;
    a->msg.vals = c->buf[c->done_seq & 1];
    a->msg.count = c->done_n;
}

static void send_result_to_all(cps__coll *c)
{
    for (uint32_t i = 0; i < c->nmembers; i++)
        if (c->members[i] != c->me)
            send_result(c, c->members[i], 0);
    c->bcast_epoch = c->epoch;
    c->stats.results_sent++;
}

/* Member `from` (re)runs or asks for the collective we completed (done_seq): give everyone our
 * result, once per view; after that, only to one that still asks (a replacement that skipped it
 * and was not running it when the broadcast came, see help()). `first`: the message is one a
 * member sends once per (re)start, so a resend does not repeat per chunk. */
static void answer_done(cps__coll *c, uint32_t from, int first)
{
    if (c->bcast_epoch != c->epoch) {
        send_result_to_all(c);
    } else if (first) {
        send_result(c, from, 1);
        c->stats.results_sent++;
    }
}

/* A result of collective `m->seq`, which we are not running: a member whose sequence was given
 * keeps it when it is later than what it holds (it skipped that collective and may yet be asked
 * for it: it then answers with it instead of joining a ring that already completed). */
static void keep_result(cps__coll *c, const cps__coll_msg *m)
{
    unsigned b = (unsigned)(m->seq & 1);
    if (!c->seq_given || m->seq <= c->done_seq || m->count != m->n || m->n == 0 ||
        (c->running && b == (c->seq & 1)))
        return;
    if (m->n > c->cap[b]) {
        float *w = realloc(c->buf[b], m->n * sizeof *w);
        if (!w)
            return;
        c->buf[b] = w;
        c->cap[b] = m->n;
    }
    memcpy(c->buf[b], m->vals, m->n * sizeof(float));
    c->done_seq = m->seq;
    c->done_n = m->n;
    c->bcast_epoch = m->index == 0 ? c->epoch : 0; /* a broadcast: everyone got it */
    c->stats.results_taken++;
}

/* A peer runs collective `seq`, which the ring already completed (our sequence is past it: it was
 * set from a member that completed it, cps__coll_set_next_seq) but whose result we do not hold:
 * we cannot take part, and staying silent would leave the ring stuck at us. Ask every member to
 * send its result of `seq` to all (handle: CPS_COLL_ASK); the result is wholly one epoch's. */
static void ask_result(cps__coll *c, uint64_t seq)
{
    if (c->asked_epoch == c->epoch && c->asked_seq == seq)
        return;
    for (uint32_t i = 0; i < c->nmembers; i++) {
        if (c->members[i] == c->me)
            continue;
        cps__coll_act *a = act_add(c, CPS_COLL_SEND);
        if (!a)
            return;
        a->to = c->members[i];
        a->msg.from = c->me;
        a->msg.kind = CPS_COLL_ASK;
        a->msg.epoch = c->epoch;
        a->msg.seq = seq;
    }
    c->asked_epoch = c->epoch;
    c->asked_seq = seq;
    c->stats.asks_sent++;
}

/* What to do with a message of the current epoch: 1 consumed (or dropped), 0 keep for later. */
static int handle(cps__coll *c, const cps__coll_msg *m, uint64_t now)
{
    uint32_t from_pos;
    if (!member_pos(c, m->from, &from_pos) || m->from == c->me) {
        c->stats.dropped_bad++;
        return 1;
    }
    if (m->kind == CPS_COLL_ASK) {
        /* Never a reason to join or restart: it names a collective the asker's ring completed. */
        if (c->done_seq && m->seq == c->done_seq)
            answer_done(c, m->from, 1);
        return 1;
    }
    if (m->kind == CPS_COLL_LISTEN) {
        /* A listener in a collective we completed (its pin, or its guess) waits for a chunk that
         * may never come: we are past it, and so may be every other member (the job's last
         * collective). Our result answers it, as it answers a restart. */
        if (c->done_seq && m->seq == c->done_seq)
            answer_done(c, m->from, 1);
        /* Only a listener cares: anyone else sends its chunks, which is evidence enough. */
        if (c->listen && c->running && c->heard && !c->heard[from_pos]) {
            c->heard[from_pos] = 1;
            c->nheard++;
            if (m->seq > c->heard_max)
                c->heard_max = m->seq;
            if (m->index == 1 && m->seq > c->heard_pinned)
                c->heard_pinned = m->seq;
            if (c->nheard + 1 == c->nmembers) {
                /* Every member is new: all take the same seq. A pinned member cannot move off
                 * its pin (its input may be in that collective's result), so when one named a
                 * pin, that seq wins over the highest named, on every member alike. */
                c->seq = c->pinned ? c->pinned : c->heard_pinned ? c->heard_pinned : c->heard_max;
                begin(c, now);
            }
        }
        return 1;
    }
    if (c->listen && c->running) {
        uint32_t mine = 0;
        member_pos(c, c->me, &mine); /* a member: the view that set listen checked it */
        /* A completed collective's result also says where the ring is: when every other member
         * had completed it, no chunk would ever come (the job's last collective, its result
         * broadcast to answer a restart), and we would wait out the timeout. A joiner that is
         * not pinned takes it as its call's result, as it would after a chunk of that
         * collective, but never one below its guess (an old result re-sent to a late member
         * would move the guess backwards); a pinned one only its own collective's. */
        int result_here =
            m->kind == CPS_COLL_RESULT && (c->pinned ? m->seq == c->pinned : m->seq >= c->seq);
        if (!result_here &&
            (m->kind != CPS_COLL_DATA || from_pos != (mine + c->nmembers - 1) % c->nmembers))
            return 0; /* kept until we know our collective */
        /* Pinned: every member of the view where we reduced our segment ran that collective
         * (the segment came round through all of them), so the ring is there or past it (then a
         * peer that completed it answers our restart with the result); a predecessor in another
         * one is a new joiner that guessed. */
        c->seq = c->pinned ? c->pinned : m->seq;
        begin(c, now);
        if (!c->running)
            return 0;
    }
    if (c->joining && c->running && !c->pinned && m->seq > c->seq) {
        c->seq = m->seq;
        c->stats.restarts++;
        begin(c, now);
        if (!c->running)
            return 0;
    }
    if (m->kind == CPS_COLL_RESULT) {
        if (!c->running || m->seq != c->seq) {
            if (m->seq > c->seq)
                return 0;
            keep_result(c, m);
            c->stats.dropped_stale++;
            return 1;
        }
        if (m->n != c->n || m->count != c->n) {
            c->stats.dropped_bad++;
            return 1;
        }
        memcpy(c->work, m->vals, c->n * sizeof(float));
        c->bcast_epoch = m->index == 0 ? c->epoch : 0; /* a broadcast: everyone got it */
        c->stats.results_taken++;
        complete(c, now);
        return 1;
    }
    if (m->kind != CPS_COLL_DATA) {
        c->stats.dropped_bad++;
        return 1;
    }
    if (!c->running || m->seq != c->seq) {
        if (c->done_seq && m->seq == c->done_seq) {
            /* A member restarted a collective we completed: give everyone our result. */
            answer_done(c, m->from, m->index == 0);
            return 1;
        }
        if (m->seq > c->seq || (!c->running && m->seq == c->seq + 1)) {
            /* A joiner that guesses and runs nothing yet: the chunk may be of a collective the
             * others completed under an older view, restarted by a member that lost its last
             * chunk to the fence, with us as its only successor; if our program never runs
             * that collective (the job ended), nobody else would tell the restarter. Members that
             * completed it answer our ask with the result, to all (one epoch's bits); the rest
             * ignore it, and when our call comes the chunk is still here to join by. */
            if (c->joining && !c->running && !c->seq_given && m->kind == CPS_COLL_DATA)
                ask_result(c, m->seq);
            return 0;
        }
        /* Only before our own call took a chunk in this view: a predecessor already in it
         * completed `seq`, holds its result and answers our ask with it. */
        if (c->seq_given && c->running && !c->help_for && !c->alone && c->next_in == 0 &&
            m->n == c->n) {
            help(c, m->seq, now);
            return c->running ? handle(c, m, now) : 1; /* the chunk is the helped one's */
        }
        if (c->seq_given)
            ask_result(c, m->seq);
        c->stats.dropped_stale++;
        return 1;
    }
    if (from_pos != (c->pos + c->p - 1) % c->p || m->n != c->n) {
        c->stats.dropped_bad++;
        return 1;
    }
    if (m->index != c->next_in)
        return m->index > c->next_in ? 0 : (c->stats.dropped_stale++, 1);
    uint64_t lo, hi;
    chunk_span(c, m->index, 0, &lo, &hi);
    if (m->count != hi - lo) {
        c->stats.dropped_bad++;
        return 1;
    }
    uint64_t k = m->index / c->nchunks;
    uint64_t total = 2 * (uint64_t)(c->p - 1) * c->nchunks, cnt = hi - lo;
    /* The chunk goes on to our successor as the next step's message (the same span), except at
     * the last step: its action comes first, so that the chunk is written straight into the
     * message's payload (out_payload), not into c->work and then copied. c->work keeps only
     * what the result needs: the chunks of the last reduce-scatter step and of the all-gather. */
    cps__coll_act *fwd =
        m->index + c->nchunks < total ? send_index(c, m->index + c->nchunks) : NULL;
    float *out = out_payload(c, fwd), *w = c->work + lo;
    if (k < c->p - 1) {
        /* Reduce-scatter: what came round the ring so far, plus ours, in that order (zeros
         * while helping: a message spans at most one chunk, the zero buffer's length). */
        const float *in = m->vals, *own = c->help_for ? c->zeros : c->data + lo;
        int mean = k == c->p - 2 && c->op == CPS_COLL_MEAN;
        if (!out)
            reduce_into(w, NULL, in, own, cnt, mean, (float)c->p);
        else
            /* In pieces, each handed to the written hook (the MAC) while in L1. The reduction
             * is elementwise, so the bits are those of one pass. */
            for (uint64_t o = 0; o < cnt; o += CPS_COLL_PIECE) {
                uint64_t np = cnt - o < CPS_COLL_PIECE ? cnt - o : CPS_COLL_PIECE;
                reduce_into(out + o, k == c->p - 2 ? w + o : NULL, in + o, own + o, np, mean,
                            (float)c->p);
                if (c->written_fn)
                    c->written_fn(c->out_ctx, out, o + np);
            }
    } else if (cnt) {
        /* All-gather: the result's chunk, kept and passed on. The second copy reads the first,
         * still in cache, rather than the sender's memory again. A chunk the shell placed
         * (cps__coll_place) is in w already. */
        if (m->vals != w)
            memcpy(w, m->vals, cnt * sizeof(float));
        if (out)
            for (uint64_t o = 0; o < cnt; o += CPS_COLL_PIECE) {
                uint64_t np = cnt - o < CPS_COLL_PIECE ? cnt - o : CPS_COLL_PIECE;
                memcpy(out + o, w + o, np * sizeof(float));
                if (c->written_fn)
                    c->written_fn(c->out_ctx, out, o + np);
            }
    }
    c->last_progress = now;
    c->next_in++;
    /* Our segment's reduction (step P-2) is the first point where a peer can complete this
     * collective with our input in it: no peer holds that segment's sum before we make it.
     * Earlier, the predecessor may itself be a joiner that guessed wrong, and the ring's
     * collective is still to be found. */
    if (c->joining && !c->help_for && k + 2 >= c->p)
        c->pinned = c->seq;
    if (c->next_in == total) {
        c->bcast_epoch = 0;
        complete(c, now);
    }
    return 1;
}

static void dispatch(cps__coll *c, const cps__coll_msg *m, uint64_t now, int from_stash, int *keep)
{
    *keep = 0;
    if (m->epoch < c->epoch) {
        c->stats.dropped_stale++;
        return;
    }
    if (m->epoch > c->epoch || !c->members) {
        *keep = 1;
        if (!from_stash) {
            cps__coll_act *a = act_add(c, CPS_COLL_NEED_VIEW);
            if (a)
                a->epoch = m->epoch;
        }
        return;
    }
    *keep = !handle(c, m, now);
}

static void drain_stash(cps__coll *c, uint64_t now)
{
    /* A stashed message can restart the collective (a joiner taking a higher seq), and begin()
     * drains: nested, that drain would free the very message this loop holds and move the stash
     * under it (a double free). It only asks this loop to scan again from the start instead. */
    if (c->draining) {
        c->redrain = 1;
        return;
    }
    c->draining = 1;
    /* Stashed messages of one sender are in arrival order; retry them until none is taken. */
    int progress = 1;
    while (progress) {
        progress = 0;
        for (size_t i = 0; i < c->nstash; i++) {
            int keep;
            stashed s = c->stash[i];
            c->redrain = 0;
            dispatch(c, &s.m, now, 1, &keep);
            if (keep && c->redrain) {
                progress = 1; /* restarted: earlier entries may fit the new collective */
                break;
            }
            if (keep)
                continue;
            free(s.vals);
            memmove(&c->stash[i], &c->stash[i + 1], (c->nstash - i - 1) * sizeof *c->stash);
            c->nstash--;
            progress = 1;
            break;
        }
    }
    c->draining = 0;
}

void cps__coll_step(cps__coll *c, const cps__coll_msg *m, uint64_t now)
{
    c->nout = 0;
    int keep;
    dispatch(c, m, now, 0, &keep);
    if (keep)
        stash_add(c, m);
    else
        drain_stash(c, now);
}

float *cps__coll_place(cps__coll *c, const cps__coll_msg *m)
{
    uint32_t from_pos;
    /* The conditions under which handle() goes straight to the all-gather copy, and no path
     * before it (a restart, a join, a view) can rewrite the working buffer first. */
    if (m->kind != CPS_COLL_DATA || !c->members || !c->running || c->listen || c->help_for ||
        c->joining || c->alone || m->epoch != c->epoch || m->seq != c->seq || m->n != c->n ||
        m->index != c->next_in || m->from == c->me || !member_pos(c, m->from, &from_pos) ||
        from_pos != (c->pos + c->p - 1) % c->p || m->index / c->nchunks < c->p - 1 ||
        m->index >= 2 * (uint64_t)(c->p - 1) * c->nchunks)
        return NULL;
    uint64_t lo, hi;
    chunk_span(c, m->index, 0, &lo, &hi);
    if (hi == lo || m->count != hi - lo)
        return NULL;
    return c->work + lo;
}

uint64_t cps__coll_seq(const cps__coll *c)
{
    return c->seq;
}

int cps__coll_last_result(const cps__coll *c, uint64_t *seq, const float **vals, uint64_t *n)
{
    if (!c->done_seq)
        return 0;
    *seq = c->done_seq;
    *vals = c->buf[c->done_seq & 1];
    *n = c->done_n;
    return 1;
}

int cps__coll_adopt_result(cps__coll *c, uint64_t seq, const float *vals, uint64_t n)
{
    c->nout = 0;
    if (c->running || seq == 0 || seq != c->seq || !vals || n == 0 || n >= MAX_VALUES)
        return CPS_EINVAL;
    /* index 1: nobody else got it from us, so the first member to ask gets a broadcast. */
    cps__coll_msg m = {
        .kind = CPS_COLL_RESULT, .seq = seq, .index = 1, .n = n, .vals = vals, .count = n};
    if (c->done_seq == seq)
        return 0; /* a member's broadcast of it came first: the same bits */
    uint64_t taken = c->stats.results_taken;
    keep_result(c, &m);
    if (c->stats.results_taken == taken)
        return CPS_ENOMEM;
    drain_stash(c, 0); /* a survivor's restart of `seq` may be waiting for it */
    return 0;
}

int cps__coll_set_next_seq(cps__coll *c, uint64_t next, int calls_queued)
{
    c->nout = 0;
    if (c->running || calls_queued || next == 0)
        return CPS_EBUSY;
    c->seq = next - 1;
    c->done_seq = 0;
    /* The ring's sequence is known now: a joiner stops taking it from the messages it sees. */
    c->joining = 0;
    c->listen = 0;
    c->seq_given = 1;
    /* Messages kept while our sequence was unknown may concern a collective we now skip. */
    drain_stash(c, 0);
    return 0;
}

/* The running collective lost a message: ask for its result, past the one-ask-per-pair rule
 * (an ask sent before any member completed it went unanswered). */
static void lost_ask(cps__coll *c, uint64_t now)
{
    c->asked_epoch = 0;
    ask_result(c, c->seq);
    c->lost_ask_ms = now;
}

static int lost_running(const cps__coll *c)
{
    return c->running && !c->alone && !c->listen && !c->help_for && c->lost_seq == c->seq &&
           c->lost_epoch == c->epoch;
}

void cps__coll_lost(cps__coll *c, uint64_t now)
{
    c->nout = 0;
    if (!c->running || c->alone || c->listen || c->help_for)
        return;
    c->lost_epoch = c->epoch;
    c->lost_seq = c->seq;
    lost_ask(c, now);
}

void cps__coll_tick(cps__coll *c, uint64_t now)
{
    c->nout = 0;
    if (lost_running(c) && now >= c->lost_ask_ms + CPS_COLL_LOST_ASK_MS)
        lost_ask(c, now);
    if (c->running && now > c->last_progress && now - c->last_progress >= c->timeout_ms)
        finish(c, c->alone ? CPS_ENOPEER : CPS_ETIMEDOUT);
}
