#include "joiner.h"

#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"

/* The outcome a range waits for (the caller reports it before any other event). */
enum { WAIT_NONE = 0, WAIT_BEGIN, WAIT_INSTALL, WAIT_READY };

typedef struct join_range {
    int active; /* ordered, snapshot not complete */
    int wait;   /* WAIT_* */
    int got_snap;
    int last_chunk;      /* the chunk being installed is the last one: READY follows */
    uint32_t next_chunk; /* the number of the chunk to take next (0 at each new join) */
    uint64_t stream_seq; /* the read of the stream taken (its chunk 0's), once next_chunk > 0 */
    uint32_t source;
    uint64_t id;      /* the last join ordered (under way or not): CAUGHT_UP echoes it */
    uint64_t done_id; /* the last join installed: a repeat of its order must not clear the copy */
    uint64_t deadline_ms;
    uint64_t snap_req_ms; /* when SNAP_REQ last went out */
    uint64_t bytes;
    uint64_t confirm; /* installed, not yet reported as serving (CAUGHT_UP aux 1): its id */
} join_range;

struct cps__joiner {
    cps__joiner_config cfg;
    uint64_t epoch; /* of the last view: what we send goes under it */
    join_range *ranges;
    /* At most three per range per call (a tick: abort and give-up report, or a confirmation). */
    cps__joiner_action *actions;
    size_t nactions, cap;
};

int cps__joiner_create(const cps__joiner_config *cfg, cps__joiner **out)
{
    if (!cfg || !out || cfg->timeout_ms == 0 || cfg->snap_retry_ms == 0)
        return CPS_EINVAL;
    cps__joiner *j = calloc(1, sizeof *j);
    if (!j)
        return CPS_ENOMEM;
    j->cfg = *cfg;
    size_t n = cfg->nranges ? cfg->nranges : 1;
    j->cap = 3 * n + 2;
    j->ranges = calloc(n, sizeof *j->ranges);
    j->actions = calloc(j->cap, sizeof *j->actions);
    if (!j->ranges || !j->actions) {
        cps__joiner_destroy(j);
        return CPS_ENOMEM;
    }
    *out = j;
    return 0;
}

void cps__joiner_destroy(cps__joiner *j)
{
    if (j) {
        free(j->ranges);
        free(j->actions);
        free(j);
    }
}

static cps__joiner_action *act(cps__joiner *j, int kind, uint32_t range)
{
    cps__joiner_action *a = &j->actions[j->nactions++];
    memset(a, 0, sizeof *a);
    a->kind = kind;
    a->range = range;
    return a;
}

static void send_hdr(cps__joiner *j, uint32_t to, uint8_t type, uint32_t range, uint64_t step,
                     uint64_t aux, uint64_t req_seq)
{
    cps__joiner_action *a = act(j, CPS_JA_SEND, range);
    a->to = to;
    a->hdr.type = type;
    a->hdr.sender = j->cfg.self;
    a->hdr.epoch = j->epoch;
    a->hdr.range = range;
    a->hdr.step = step;
    a->hdr.aux = aux;
    a->hdr.req_seq = req_seq;
}

static void snap_req(cps__joiner *j, uint32_t r, uint64_t now)
{
    join_range *jr = &j->ranges[r];
    jr->snap_req_ms = now;
    send_hdr(j, jr->source, CPS_MSG_SNAP_REQ, r, jr->id, 0, 0);
}

/* Give the join of r up and tell the scheduler now (aux 2), rather than let it wait out its
 * own deadline before it orders another. */
static void give_up(cps__joiner *j, uint32_t r, const char *why, int status)
{
    join_range *jr = &j->ranges[r];
    cps__joiner_action *a = act(j, CPS_JA_ABORT, r);
    a->why = why;
    a->status = status;
    jr->active = 0;
    jr->wait = WAIT_NONE;
    send_hdr(j, 0, CPS_MSG_CAUGHT_UP, r, jr->id, 2, 0);
}

static int in_chain(const cps__range *rg, uint32_t id)
{
    for (uint32_t k = 0; k < rg->chain_len; k++)
        if (rg->chain[k] == id)
            return 1;
    return 0;
}

int cps__joiner_view(cps__joiner *j, const cps__view *v, uint64_t now)
{
    (void)now;
    j->nactions = 0;
    if (!v || v->nranges != j->cfg.nranges)
        return CPS_EINVAL;
    j->epoch = v->epoch;
    for (uint32_t r = 0; r < v->nranges; r++) {
        join_range *jr = &j->ranges[r];
        if (!jr->active)
            continue;
        const cps__node_info *src = cps__view_node(v, jr->source);
        if (in_chain(&v->ranges[r], j->cfg.self))
            give_up(j, r, "a view counts us in the chain before the snapshot is in",
                    CPS_ESTALE_EPOCH);
        else if (!src || !src->alive || !in_chain(&v->ranges[r], jr->source))
            give_up(j, r, "the source left the range's chain", CPS_ESTALE_EPOCH);
    }
    return (int)j->nactions;
}

int cps__joiner_order(cps__joiner *j, const cps__view *v, uint32_t range, uint32_t source,
                      uint64_t join_id, uint64_t epoch, uint64_t now)
{
    j->nactions = 0;
    if (!v || range >= j->cfg.nranges || !cps__view_node(v, source))
        return CPS_JOINER_IGNORED;
    join_range *jr = &j->ranges[range];
    if ((jr->active && jr->id == join_id) || (jr->done_id && jr->done_id == join_id))
        return CPS_JOINER_IGNORED; /* a repeat: under way, or done (do not clear the copy) */
    if (j->cfg.orders_may_reorder) {
        if (join_id <= jr->id)
            return CPS_JOINER_IGNORED; /* a late duplicate of a join replaced since */
        if (epoch > v->epoch) {
            act(j, CPS_JA_ASK_VIEW, range);
            return CPS_JOINER_IGNORED;
        }
    }
    if (jr->active) {
        act(j, CPS_JA_ABORT, range); /* a newer join of the range replaces it: nothing to log */
        jr->active = 0;
    }
    jr->active = 1;
    jr->wait = WAIT_BEGIN;
    jr->got_snap = 0;
    jr->next_chunk = 0;
    jr->source = source;
    jr->id = join_id;
    jr->deadline_ms = now + j->cfg.timeout_ms;
    jr->bytes = 0;
    jr->confirm = 0;
    cps__joiner_action *a = act(j, CPS_JA_BEGIN, range);
    a->source = source;
    a->seq = join_id;
    return CPS_JOINER_TAKEN;
}

int cps__joiner_snap(cps__joiner *j, uint32_t from, uint32_t range, uint64_t join_id, uint32_t num,
                     uint64_t read_seq, int last, size_t len, int chain_joining, uint64_t now)
{
    (void)now;
    j->nactions = 0;
    if (range >= j->cfg.nranges)
        return CPS_JOINER_IGNORED;
    join_range *jr = &j->ranges[range];
    if (!jr->active || jr->wait != WAIT_NONE || jr->source != from || jr->id != join_id)
        return CPS_JOINER_IGNORED; /* from an earlier join, after the last chunk, or not ours */
    if (jr->next_chunk > 0 && (num == 0 ? read_seq < jr->stream_seq : read_seq != jr->stream_seq))
        /* An earlier stream of this join cut short while its chunks were still on the wire: a
         * late chunk 0, or any later chunk of a read other than the one taken, would mix two
         * reads' records (two reads at one sequence number hold the same records). */
        return CPS_JOINER_IGNORED;
    if (num == 0 && jr->next_chunk > 0) {
        /* A new stream of this join: the source served a repeated SNAP_REQ with a new read once
         * the earlier stream was over (its send failed, or its socket lingered out). Its chunks
         * write the range again from the start; counted on from the earlier stream's, they
         * would install the chunks of two reads. (Chunk 0 itself comes once per connection.) */
        jr->next_chunk = 0;
    } else if (num < jr->next_chunk) {
        return CPS_JOINER_IGNORED; /* a repeat: its records are in already */
    }
    if (!chain_joining) {
        /* A view since made us a member of the range, or took it from us: a snapshot written
         * now would overwrite a store the chain already serves from. */
        give_up(j, range, "the chain is no longer joining", CPS_ESTALE_EPOCH);
        return CPS_JOINER_TAKEN;
    }
    if (num > jr->next_chunk) {
        /* A chunk of this stream never came (its connection broke while it was on the wire and
         * nanomsg reconnected for the next): the records it carried are nowhere else, so what
         * follows must not be installed as a whole snapshot. */
        give_up(j, range, "a snapshot chunk was lost", CPS_EPROTO);
        return CPS_JOINER_TAKEN;
    }
    if (num == 0)
        jr->stream_seq = read_seq;
    jr->next_chunk++;
    jr->got_snap = 1;
    jr->bytes += len;
    jr->wait = WAIT_INSTALL;
    jr->last_chunk = last != 0;
    act(j, CPS_JA_INSTALL, range)->last = jr->last_chunk;
    return CPS_JOINER_TAKEN;
}

int cps__joiner_result(cps__joiner *j, uint32_t range, int rc, uint64_t value, uint64_t now)
{
    j->nactions = 0;
    if (range >= j->cfg.nranges || j->ranges[range].wait == WAIT_NONE)
        return CPS_EINVAL;
    join_range *jr = &j->ranges[range];
    int wait = jr->wait;
    jr->wait = WAIT_NONE;
    if (rc != 0) {
        give_up(j, range,
                wait == WAIT_BEGIN     ? "clearing the old copy"
                : wait == WAIT_INSTALL ? "installing the snapshot"
                                       : "replaying updates",
                rc);
        return (int)j->nactions;
    }
    if (wait == WAIT_BEGIN) {
        snap_req(j, range, now);
    } else if (wait == WAIT_INSTALL) {
        if (jr->last_chunk) {
            jr->wait = WAIT_READY;
            act(j, CPS_JA_READY, range)->seq = value;
        }
    } else {
        jr->active = 0;
        jr->done_id = jr->id;
        jr->confirm = jr->id;
        send_hdr(j, 0, CPS_MSG_CAUGHT_UP, range, jr->id, 0, value);
    }
    return (int)j->nactions;
}

int cps__joiner_tick(cps__joiner *j, uint64_t now, int (*can_serve)(void *ctx, uint32_t range),
                     void *ctx)
{
    j->nactions = 0;
    for (uint32_t r = 0; r < j->cfg.nranges; r++) {
        join_range *jr = &j->ranges[r];
        if (jr->active && jr->wait == WAIT_NONE && now > jr->deadline_ms)
            give_up(j, r, "no snapshot in time", CPS_ETIMEDOUT);
        else if (jr->active && jr->wait == WAIT_NONE && !jr->got_snap &&
                 now - jr->snap_req_ms > j->cfg.snap_retry_ms)
            snap_req(j, r, now);
        if (!jr->active && jr->confirm && can_serve && can_serve(ctx, r)) {
            /* We hold everything the old tail acknowledged: from now on a full replica, no
             * longer one that must leave the chain with its predecessor. */
            send_hdr(j, 0, CPS_MSG_CAUGHT_UP, r, jr->confirm, 1, 0);
            jr->confirm = 0;
        }
    }
    return (int)j->nactions;
}

int cps__joiner_active(const cps__joiner *j, uint32_t range)
{
    return range < j->cfg.nranges && j->ranges[range].active;
}

uint32_t cps__joiner_source(const cps__joiner *j, uint32_t range)
{
    return range < j->cfg.nranges ? j->ranges[range].source : 0;
}

uint64_t cps__joiner_bytes(const cps__joiner *j, uint32_t range)
{
    return range < j->cfg.nranges ? j->ranges[range].bytes : 0;
}

size_t cps__joiner_actions(const cps__joiner *j, const cps__joiner_action **out)
{
    if (out)
        *out = j->actions;
    return j->nactions;
}
