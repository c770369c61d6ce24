/* sim_restore's servers: the production replica (replication/replica.h) behind a small shell that
 * does what src/server does with a restore's messages, and the checkpoint's records as their
 * stores hold them (restore.c describes the model). */
#include "restore.h"

/* ---- the checkpoint's records ---- */

static void rec_decode(const uint64_t *p, int *kind, uint32_t *key, uint64_t *val)
{
    *kind = (int)(p[0] >> 56);
    *key = (uint32_t)(p[0] & 0xffffffffu);
    *val = p[1];
}

/* The shell's check of a PUT's records (src/server's cps__server_check_put): a slice of a key
 * neither in the store nor created earlier in the PUT is refused. */
static int check_records(const rstore *st, const void *entries, size_t len)
{
    uint8_t made[MAX_KEYS];
    memcpy(made, st->exists, sizeof made);
    const uint64_t *p = entries;
    for (size_t i = 0; i + 16 <= len; i += 16, p += 2) {
        int kind;
        uint32_t key;
        uint64_t val;
        rec_decode(p, &kind, &key, &val);
        if (key >= MAX_KEYS || (kind != REC_CREATE && kind != REC_SLICE))
            return CPS_EPROTO;
        if (kind == REC_CREATE)
            made[key] = 1;
        else if (!made[key])
            return CPS_EPROTO;
    }
    return 0;
}

static void apply_records(rstore *st, const void *entries, size_t len)
{
    const uint64_t *p = entries;
    for (size_t i = 0; i + 16 <= len; i += 16, p += 2) {
        int kind;
        uint32_t key;
        uint64_t val;
        rec_decode(p, &kind, &key, &val);
        if (kind == REC_CREATE) {
            st->exists[key] = 1;
            st->version[key] = val;
            st->value[key] = 0;
        } else {
            st->value[key] = val;
        }
    }
}

/* The range as the checkpoint has it: every key, its version and value, nothing else. */
int rsrv_holds_whole(const world *w, const rstore *st, uint32_t r)
{
    for (uint32_t k = 0; k < MAX_KEYS; k++) {
        int want = k < w->nkeys[r];
        if (st->exists[k] != want)
            return 0;
        if (want && (st->version[k] != w->version[r][k] || st->value[k] != w->value[r][k]))
            return 0;
    }
    return 1;
}

/* ---- the servers: the production replica behind a shell ---- */

static int env_range_seq(void *ctx, uint32_t range, uint64_t *seq)
{
    server *s = ctx;
    *seq = range < MAX_RANGES ? s->rs[range].applied : 0;
    return 0;
}

static int env_zero(void *ctx, uint32_t range, uint32_t id, uint64_t *v)
{
    (void)ctx, (void)range, (void)id;
    *v = 0;
    return 0;
}

static int env_agg(void *ctx, uint32_t range, uint64_t sig, uint64_t *step)
{
    (void)ctx, (void)range, (void)sig;
    *step = 0;
    return 0;
}

static int env_keys(void *ctx, const cps__kv *kv, const cps__param_spec *spec, uint64_t *bad,
                    uint32_t *have)
{
    (void)ctx, (void)kv, (void)spec;
    *bad = 0;
    *have = 0;
    return 0;
}

static int env_scan(void *ctx, uint32_t range, int (*fn)(void *, uint32_t, uint64_t), void *arg)
{
    (void)ctx, (void)range, (void)fn, (void)arg;
    return 0;
}

static void env_add(void *ctx, float *acc, const float *x, size_t n)
{
    (void)ctx;
    for (size_t i = 0; i < n; i++)
        acc[i] += x[i];
}

static void env_release(void *ctx, void *owner)
{
    (void)ctx;
    free(owner);
}

static void *env_alloc(void *ctx, uint32_t to, size_t len)
{
    (void)ctx, (void)to;
    return malloc(len);
}

/* Perform the ready list, in order; a JOIN_CLEAR or JOIN_INSTALL ends it: 1 then, with its
 * outcome for cps__replica_join_result. */
static int perform_list(world *w, server *s, uint32_t *range, int *rc, uint64_t *value)
{
    const cps__replica_out *out;
    size_t n = cps__replica_ready(s->rep, &out);
    int answer = 0;
    for (size_t i = 0; i < n; i++) {
        const cps__replica_out *o = &out[i];
        switch (o->kind) {
        case CPS_RO_WRITE:
            if (o->upd.kind != CPS_UPD_PUT) {
                sim_fail(&w->v, "server %u: a WRITE of kind %u (only PUTs here)", s->id,
                         o->upd.kind);
                break;
            }
            apply_records(&s->rs[o->range], o->upd.body, o->upd.body_len);
            s->rs[o->range].applied = o->seq;
            trace(w, "s%u applies r%u seq %" PRIu64, s->id, o->range, o->seq);
            break;
        case CPS_RO_SEND:
            if (o->msg) {
                cps__msg_hdr h;
                if (cps__wire_hdr_decode(o->msg, o->len, &h) == 0)
                    net_send(w, s->id, o->to, &h, (const uint8_t *)o->msg + CPS_WIRE_HDR_SIZE,
                             o->len - CPS_WIRE_HDR_SIZE, o->to == 0);
                free(o->msg);
            } else {
                /* To the scheduler (a CAUGHT_UP): its connection; else a lossy chain link. */
                net_send(w, s->id, o->to, &o->hdr, NULL, 0, o->to == 0);
            }
            break;
        case CPS_RO_SNAPSHOT:
            rjoin_snapshot(w, s, o);
            break;
        case CPS_RO_JOIN_CLEAR:
        case CPS_RO_JOIN_INSTALL:
            *range = o->range;
            *rc = rjoin_take(w, s, o, value);
            answer = 1;
            break;
        case CPS_RO_ASK_VIEW: {
            cps__msg_hdr g = {.type = CPS_MSG_GET_VIEW, .sender = s->id};
            net_send(w, s->id, 0, &g, NULL, 0, 1);
            break;
        }
        case CPS_RO_DROP_RANGE:
            memset(&s->rs[o->range], 0, sizeof s->rs[o->range]);
            break;
        case CPS_RO_LOG:
            trace(w, "s%u: %s", s->id, o->text);
            break;
        default:
            sim_fail(&w->v, "server %u: ready item %d in a restore", s->id, o->kind);
        }
    }
    return answer && !w->v.failed;
}

/* Perform the ready list, and answer a join step's outcome until none is owed. */
void rsrv_perform(world *w, server *s)
{
    uint32_t range = 0;
    int rc = 0;
    uint64_t value = 0;
    while (perform_list(w, s, &range, &rc, &value))
        cps__replica_join_result(s->rep, range, rc, value, w->now);
}

void rsrv_perform_all(world *w, server *s)
{
    rsrv_perform(w, s);
    while (s->state == SRV_UP && cps__replica_next(s->rep, w->now))
        rsrv_perform(w, s);
}

static void reply(world *w, server *s, const cps__msg_hdr *q, int status, uint64_t seq,
                  uint64_t aux, int whole)
{
    cps__msg_hdr h = {0};
    h.type = status ? CPS_MSG_ERROR : q->type;
    h.flags = CPS_WF_REPLY;
    h.sender = s->id;
    h.status = status;
    h.epoch = s->view ? s->view->epoch : 0;
    h.range = q->range;
    h.req_seq = status ? q->req_seq : seq;
    h.aux = aux;
    msg *m = net_send(w, s->id, TOOL, &h, NULL, 0, 1);
    m->whole = whole; /* the sim's note on the answer (never on the wire) */
}

static void on_put(world *w, server *s, msg *m)
{
    const cps__msg_hdr *h = &m->h;
    if (h->range >= w->nranges || !m->len || m->len % 16) {
        reply(w, s, h, CPS_EPROTO, 0, 0, 0);
        return;
    }
    int v = cps__replica_put_verdict(s->rep, h->range);
    if (v != CPS_ADMIT_NEW) {
        reply(w, s, h, cps__cut_put_status(v), 0, 0, 0);
        return;
    }
    int rc = check_records(&s->rs[h->range], m->pl, m->len);
    if (rc != 0) {
        reply(w, s, h, rc, 0, 0, 0);
        return;
    }
    v = cps__replica_put(s->rep, h->range, h->req_seq, m->pl, m->len, w->now);
    rsrv_perform_all(w, s);
    if (v != CPS_ADMIT_NEW) {
        reply(w, s, h, cps__cut_put_status(v), 0, 0, 0);
        return;
    }
    reply(w, s, h, 0, s->rs[h->range].applied, h->aux, 0);
}

static void on_view(world *w, server *s, uint64_t epoch)
{
    const cps__view *v = &w->views[epoch];
    int verdict = cps__replica_view_news(s->rep, v, s->id, 0);
    rsrv_perform(w, s);
    if (verdict != CPS_RV_NEWER && verdict != CPS_RV_LET_IN)
        return;
    verdict = cps__replica_view(s->rep, v, s->id, w->now);
    if (verdict == CPS_RV_FENCED) {
        trace(w, "s%u fenced by view %" PRIu64 ": it stops%s", s->id, epoch,
              w->coord_on ? ", then rejoins in a new life" : " (no rejoin here)");
        s->state = SRV_FENCED;
        s->down_at = w->now;
        if (w->coord_on)
            ev_push(w, w->now + 100 + rnd(w, 500), EV_RESTART, s->id, 0, NULL);
        return;
    }
    if (verdict == CPS_RV_INSTALLED)
        s->view = v;
    rsrv_perform_all(w, s);
}

void rsrv_deliver(world *w, server *s, msg *m)
{
    const cps__msg_hdr *h = &m->h;
    switch (h->type) {
    case CPS_MSG_JOIN_RANGE: /* the coordinator's only (not --model) */
    case CPS_MSG_SNAP_REQ:
    case CPS_MSG_SNAP:
    case CPS_MSG_FWD:
    case CPS_MSG_CHAIN_ACK:
    case CPS_MSG_CHAIN_MARK: {
        cps__replica_msg rm = {*h, m->pl, m->len, m->pl};
        m->pl = NULL; /* the replica's now (env_release) */
        cps__replica_step(s->rep, &rm, w->now);
        rsrv_perform_all(w, s);
        return;
    }
    default:
        break;
    }
    if (w->coord_on && m->from == 0 && h->type == CPS_MSG_PROBE) {
        /* A server process answers the coordinator's probe whatever its standing. */
        cps__msg_hdr a = {.type = CPS_MSG_PROBE,
                          .flags = CPS_WF_REPLY,
                          .sender = s->id,
                          .epoch = s->view ? s->view->epoch : 0,
                          .req_seq = h->req_seq};
        net_send(w, s->id, 0, &a, NULL, 0, 1);
        return;
    }
    if (w->coord_on && m->from == 0 && h->type == CPS_MSG_SHUTDOWN)
        return; /* the job's end: not modelled (the run ends with the restore) */
    if (s->state == SRV_HELLO) {
        /* Not let in yet: the replica's fence lets only this life's WELCOME in. */
        int ok = h->type == CPS_MSG_VIEW || h->type == CPS_MSG_WELCOME;
        if (ok)
            ok = cps__replica_admit(s->rep, h, s->boot, w->now) == CPS_FENCE_SERVE;
        rsrv_perform(w, s);
        if (!ok)
            return;
        if (h->type != CPS_MSG_WELCOME || h->req_seq != s->boot) {
            sim_fail(
                &w->v, "server %u (life %u) let in by a %s of epoch %" PRIu64 " for life %" PRIu64,
                s->id, s->boot, h->type == CPS_MSG_VIEW ? "VIEW" : "WELCOME", h->epoch, h->req_seq);
            return;
        }
        trace(w, "s%u let in at view %" PRIu64, s->id, h->aux);
        s->state = SRV_UP;
        on_view(w, s, h->aux);
        return;
    }
    int ok = cps__replica_admit(s->rep, h, s->boot, w->now) == CPS_FENCE_SERVE;
    rsrv_perform(w, s);
    if (!ok) {
        trace(w, "s%u drops %s r%u req %" PRIu64 " (standing)", s->id,
              h->type == CPS_MSG_PUT ? "PUT" : "message", h->range, h->req_seq);
        return;
    }
    if (h->type == CPS_MSG_VIEW || h->type == CPS_MSG_WELCOME) {
        on_view(w, s, h->aux);
    } else if (h->type == CPS_MSG_PUT) {
        on_put(w, s, m);
    } else if (h->type == CPS_MSG_CUT_PROBE) {
        if (!s->view || !cps__cut_holds(s->view, s->id, h->range))
            reply(w, s, h, CPS_ESTALE_EPOCH, 0, 0, 0);
        else
            reply(w, s, h, 0, s->rs[h->range].applied, 0,
                  rsrv_holds_whole(w, &s->rs[h->range], h->range));
    } else {
        sim_fail(&w->v, "server %u: unexpected message type %u", s->id, h->type);
    }
}

void rsrv_tick(world *w, server *s)
{
    cps__replica_turned(s->rep, w->now);
    rsrv_perform(w, s);
    cps__replica_tick(s->rep, w->now, 0);
    rsrv_perform_all(w, s);
    if (w->coord_on && s->state == SRV_UP) {
        rjoin_reap(w, s);
        cps__replica_join_tick(s->rep, w->now);
        rsrv_perform_all(w, s);
    }
}

void rsrv_new(world *w, server *s)
{
    cps__replica_env env = {s,        env_range_seq, env_zero,    env_agg,  env_keys,
                            env_scan, env_add,       env_release, env_alloc};
    cps__replica_config cfg = {.self = s->id,
                               .resend_ms = RESEND_MS,
                               .max_unacked = 1024,
                               .max_held = 1024,
                               .join_timeout_ms = 120000,
                               .snap_retry_ms = 1000,
                               .dead_after_ms = DEAD_AFTER,
                               .start_ms = w->now};
    if (cps__replica_create(&cfg, &env, &s->rep) != 0) {
        fprintf(stderr, "sim_restore: replica setup failed\n");
        exit(2);
    }
}

/* Not --model: a killed or fenced server starts again, on its store, in a new life: a new
 * replica (its joins, lingering snapshots and pending messages went with the old process) that
 * says HELLO until its WELCOME lets it in. */
void rsrv_restart(world *w, server *s)
{
    if (s->state != SRV_DEAD && s->state != SRV_FENCED)
        return;
    cps__replica_destroy(s->rep);
    rsrv_new(w, s);
    for (msg *m = s->pend, *n; m; m = n) {
        n = m->next;
        msg_free(m);
    }
    s->pend = s->pend_tail = NULL;
    s->state = SRV_HELLO;
    s->boot++;
    s->view = NULL;
    s->nlingers = 0;
    s->gone = 0;
    s->hb_stalled = 0;
    s->beat_at = s->hello_at = 0;
    trace(w, "server %u restarts (life %u)", s->id, s->boot);
    ev_push(w, w->now + 1, EV_TICK, s->id, 0, NULL);
}
