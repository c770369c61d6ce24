/* Restore: a checkpoint put back into a running job (cluster.h, cluster_int.h); the decisions
 * are recovery/restore.h's. */
#include "checkpoint/cluster_int.h"

/* ---- restore ---- */

typedef struct put_buf {
    unsigned char *buf; /* message: header room + payload */
    size_t used;        /* payload bytes so far (hello prefix included) */
    size_t cap;
} put_buf;

typedef struct restore_ctx {
    link *l;
    put_buf *pb; /* per range */
    size_t base; /* payload offset where entries start */
    int rc;
    /* streaming one tensor's slot */
    piece *pieces;
    size_t npieces;
    uint32_t slot;
    /* Every decision of the restore (passes, targets, answers, silences, looks, tails) is the
     * machine's (recovery/restore.h); this shell reads records, feeds events, performs outputs.
     * tests/sim/restore_tool.c drives the same machine. */
    cps__restore m;
    int stream;     /* the machine said STREAM: a pass's records go out */
    int no_replica; /* failed: a range has no live replica */
} restore_ctx;

static int match_release(const cps__rx *rx, const void *arg)
{
    (void)arg;
    return rx->hdr.type == CPS_MSG_RELEASE && (rx->hdr.flags & CPS_WF_REPLY);
}

/* Tell the scheduler the restore is done, until it says it heard: a message sent just before
 * our transport closes can be lost, and then the held workers waited out their join timeout. */
static int release_workers(link *l)
{
    uint64_t deadline = cps__now_ms() + (uint64_t)l->timeout_ms;
    for (;;) {
        cps__msg_hdr h = {.type = CPS_MSG_RELEASE, .sender = UINT32_MAX, .req_seq = ++l->next_req};
        int rc = cps__msg_send(l->tp, SCHED, &h, l->hello, l->hello_len);
        if (rc != 0 && rc != CPS_EAGAIN)
            return rc;
        cps__rx ack;
        uint64_t now = cps__now_ms(), wait = now + 500 < deadline ? now + 500 : deadline;
        rc = cps__cl_take(l, match_release, NULL, wait, &ack);
        if (rc == 0) {
            cps__rx_free(&ack);
            return 0;
        }
        if (rc != CPS_ETIMEDOUT || cps__now_ms() >= deadline) {
            cps__log(CPS_LOG_ERROR, SUB, "the scheduler did not confirm the workers' release: %s",
                     cps_strerror(rc));
            return rc;
        }
    }
}

static cps__rs_event rs_event(restore_ctx *x, int kind)
{
    cps__rs_event e;
    memset(&e, 0, sizeof e);
    e.kind = kind;
    e.now = cps__now_ms();
    e.gone = cps__cl_chain_gone(x->l);
    return e;
}

/* Send range r's full PUT where the machine says. */
static int send_put(restore_ctx *x, const cps__rs_out *o)
{
    put_buf *b = &x->pb[o->range];
    cps__msg_hdr h = {.type = CPS_MSG_PUT,
                      .sender = UINT32_MAX,
                      .range = o->range,
                      .epoch = o->epoch,
                      .req_seq = o->seq,
                      .payload_len = (uint32_t)b->used,
                      .raw_len = (uint32_t)b->used};
    /* The transport sends whole buffers (nanomsg's zero-copy chunks): one of the exact size. */
    unsigned char *msg = cps__tp_alloc(CPS_WIRE_HDR_SIZE + b->used);
    if (!msg)
        return CPS_ENOMEM;
    /* The head echoes aux in its reply (and req_seq in an ERROR): which PUT it answers. */
    h.aux = h.req_seq;
    cps__wire_hdr_encode(msg, &h);
    memcpy(msg + CPS_WIRE_HDR_SIZE, b->buf + CPS_WIRE_HDR_SIZE, b->used);
    b->used = x->base; /* the hello stays in front */
    int rc = cps__tp_send(x->l->tp, o->to, msg, CPS_WIRE_HDR_SIZE + h.payload_len);
    if (rc != 0) {
        cps__tp_free(msg);
        /* A head whose process is gone: the PUT is lost like those in flight to it, and the
         * range goes again once the view has moved its head. */
        if (!cps__tp_peer_gone(x->l->tp, o->to))
            return rc;
    }
    return 0;
}

static void log_failure(restore_ctx *x, const cps__rs_out *o)
{
    const link *l = x->l;
    switch (o->why) {
    case CPS_RS_WHY_DEADLINE:
        if (o->range == CPS_RR_NONE)
            cps__log(CPS_LOG_ERROR, SUB, "a range head did not take the records within %.0f s",
                     l->timeout_ms / 1000.0);
        else
            cps__log(CPS_LOG_ERROR, SUB,
                     "range %u's tail did not confirm the records within %.0f s", o->range,
                     l->timeout_ms / 1000.0);
        break;
    case CPS_RS_WHY_SILENT:
        cps__log(CPS_LOG_ERROR, SUB,
                 "range %u: node %u left its PUT(s) unanswered for %.0f s (the restore's timeout)",
                 o->range, x->m.book.g[o->range].head, l->timeout_ms / 1000.0);
        break;
    case CPS_RS_WHY_PASSES:
        cps__log(CPS_LOG_ERROR, SUB,
                 "%u range(s) still to stream again after %u passes, %.2f s of back-off "
                 "waited (%.2f s in this incident, of %.0f s): the restore gives up",
                 cps__rr_stopped(&x->m.book), x->m.book.pass, x->m.waited_ms / 1000.0,
                 x->m.spent_ms / 1000.0, x->m.cfg.budget_ms / 1000.0);
        break;
    case CPS_RS_WHY_NO_REPLICA:
        cps__log(CPS_LOG_ERROR, SUB,
                 "range %u has no live replica in view epoch %" PRIu64
                 " (after %.2f s of back-off): its records cannot be restored",
                 o->range, l->view.epoch, x->m.waited_ms / 1000.0);
        x->no_replica = 1;
        break;
    case CPS_RS_WHY_FATAL:
        break; /* logged with the ERROR's text (rs_wait) */
    default:
        cps__log(CPS_LOG_ERROR, SUB, "the restore failed: %s", cps_strerror(o->rc));
        break;
    }
}

/* Feed one event and perform the machine's outputs in order; a GET_VIEW's answer is the next
 * event. Returns the restore's failure (the machine's, or the transport's), 0 otherwise. */
static int rs_feed(restore_ctx *x, cps__rs_event e)
{
    link *l = x->l;
    for (int more = 1; more;) {
        cps__rs_ready o;
        int rc = cps__rs_step(&x->m, &e, &o);
        if (rc != 0)
            return rc;
        more = 0;
        for (uint32_t i = 0; i < o.n; i++) {
            const cps__rs_out *a = &o.out[i];
            switch (a->kind) {
            case CPS_RS_PUT:
                if ((rc = send_put(x, a)) != 0)
                    return rc;
                break;
            case CPS_RS_DISCARD:
                x->pb[a->range].used = x->base; /* what it held goes again in the next pass */
                break;
            case CPS_RS_GET_VIEW: {
                uint64_t epoch = l->view.epoch;
                rc = cps__cl_link_refresh_view(l);
                if (rc == CPS_ENOMEM)
                    return rc;
                if (rc != 0 && rc != CPS_ETIMEDOUT)
                    cps__log(CPS_LOG_WARN, SUB,
                             "asking the scheduler for the view: %s; going on under epoch %" PRIu64,
                             cps_strerror(rc), l->view.epoch);
                /* A failed look is no view (the answers' deadline decides), unless it replaced
                 * the view before failing: the machine then sees the one it borrows. */
                if (rc != 0 && l->view.epoch == epoch) {
                    e = rs_event(x, CPS_RS_VIEW_NONE);
                    rc = 0;
                } else {
                    rc = 0;
                    if (l->view.epoch != epoch)
                        cps__log(CPS_LOG_INFO, SUB, "view epoch %" PRIu64 " during the restore",
                                 l->view.epoch);
                    e = rs_event(x, CPS_RS_VIEW);
                    e.view = &l->view;
                }
                more = 1;
                break;
            }
            case CPS_RS_PROBE_TAIL: {
                cps__msg_hdr h = {
                    .type = CPS_MSG_CUT_PROBE, .sender = UINT32_MAX, .range = a->range};
                cps__msg_send(l->tp, a->to, &h, l->hello, l->hello_len);
                break;
            }
            case CPS_RS_STREAM:
                x->stream = 1;
                break;
            case CPS_RS_FAILED:
                log_failure(x, a);
                return a->rc;
            default:
                break;
            }
        }
    }
    return 0;
}

/* A PUT's answer (a reply; an ERROR naming a PUT of this pass) or a tail probe's (its ERROR
 * carries req_seq 0). */
static int match_answer(const cps__rx *rx, const void *arg)
{
    const uint64_t *seq0 = arg;
    if (!(rx->hdr.flags & CPS_WF_REPLY))
        return 0;
    if (rx->hdr.type == CPS_MSG_PUT || cps__cl_is_probe_reply(rx))
        return rx->hdr.type != CPS_MSG_ERROR || rx->hdr.req_seq == 0 || rx->hdr.req_seq >= *seq0;
    return rx->hdr.type == CPS_MSG_ERROR && rx->hdr.req_seq >= *seq0;
}

/* Wait for what the machine waits for, until its deadline, and feed what came. */
static int rs_wait(restore_ctx *x)
{
    cps__rx rx;
    int rc = cps__cl_take(x->l, match_answer, &x->m.book.seq0, cps__rs_deadline(&x->m), &rx);
    if (rc == CPS_ETIMEDOUT)
        return rs_feed(x, rs_event(x, CPS_RS_TICK));
    if (rc != 0)
        return rc;
    uint32_t r = rx.hdr.range;
    int err = rx.hdr.type == CPS_MSG_ERROR;
    cps__rs_event e;
    if (rx.hdr.type == CPS_MSG_CUT_PROBE || (err && rx.hdr.req_seq == 0)) {
        e = rs_event(x, CPS_RS_PROBE);
        e.from = rx.hdr.sender;
        e.ok = !err;
        e.seq = rx.hdr.req_seq;
        e.epoch = rx.hdr.epoch;
    } else {
        e = rs_event(x, CPS_RS_ANSWER);
        e.ans =
            (cps__rr_answer){rx.hdr.sender, err, rx.hdr.status, err ? rx.hdr.req_seq : rx.hdr.aux};
        e.seq = err ? 0 : rx.hdr.req_seq;
    }
    e.range = r;
    int open = r < x->m.book.nranges && cps__rr_open(&x->m.book, r);
    rc = rs_feed(x, e);
    if (e.kind == CPS_RS_ANSWER && open && x->m.book.g[r].again)
        cps__log(CPS_LOG_WARN, SUB, "range %u: node %u did not take the records (%s): again", r,
                 rx.hdr.sender, err ? cps_strerror(rx.hdr.status) : "an earlier PUT dropped");
    if (rc != 0 && x->m.why == CPS_RS_WHY_FATAL)
        cps__log(CPS_LOG_ERROR, SUB, "range %u refused the records: %s (%.*s)", r, cps_strerror(rc),
                 (int)(rx.len > 200 ? 200 : rx.len), (const char *)rx.payload);
    cps__rx_free(&rx);
    return rc;
}

/* Range r's message is full, or the pass's records end: the machine sends it, drops it, or
 * holds it until its window has room. */
static int put_flush(restore_ctx *x, uint32_t r)
{
    if (x->pb[r].used <= x->base)
        return 0;
    cps__rs_event e = rs_event(x, CPS_RS_READY);
    e.range = r;
    e.seq = ++x->l->next_req;
    int rc = rs_feed(x, e);
    while (rc == 0 && cps__rs_held(&x->m))
        rc = rs_wait(x);
    return rc;
}

/* Room for `n` more bytes in range r's message. */
static int put_room(restore_ctx *x, uint32_t r, size_t n, unsigned char **at)
{
    put_buf *b = &x->pb[r];
    if (b->used + n > b->cap) {
        int rc = put_flush(x, r);
        if (rc != 0)
            return rc;
    }
    if (b->used + n > b->cap)
        return CPS_ESIZE;
    *at = b->buf + CPS_WIRE_HDR_SIZE + b->used;
    memset(*at, 0, n);
    b->used += n;
    return 0;
}

static int restore_sink(void *arg, uint64_t first, const void *buf, size_t n)
{
    restore_ctx *x = arg;
    const float *v = buf;
    uint64_t end = first + n;
    size_t lo = 0, hi = x->npieces;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (x->pieces[mid].off + x->pieces[mid].len <= first)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (size_t i = lo; i < x->npieces && x->pieces[i].off < end; i++) {
        const piece *p = &x->pieces[i];
        if (!cps__rs_open(&x->m, p->range)) /* done, or not streamed in this pass */
            continue;
        uint64_t s0 = p->off < first ? first : p->off;
        uint64_t s1 = p->off + p->len > end ? end : p->off + p->len;
        while (s0 < s1) {
            /* Slices up to a message's size. */
            uint64_t cnt = s1 - s0, max = (PUT_BYTES - 64) / sizeof(float);
            cnt = cnt > max ? max : cnt;
            unsigned char *at;
            int rc = put_room(x, p->range, cps__ent_slice_size(cnt), &at);
            if (rc != 0)
                return rc;
            cps__ent_put_slice(at, x->slot, p->key, s0 - p->off, cnt, v + (s0 - first));
            s0 += cnt;
        }
    }
    return 0;
}

static const cps__tensor_desc *registry_find(const link *l, const char *name)
{
    for (uint32_t i = 0; i < l->ndescs; i++)
        if (!strcmp(l->descs[i].name, name))
            return &l->descs[i];
    return NULL;
}

/* A worker's local tensor (kind/<name> = "local"): the workers take it back themselves
 * (cps_local_fetch), the servers never hold it. */
static int is_local(const cps__ckpt_reader *rd, const char *name)
{
    char key[CPS_CKPT_NAME_MAX];
    snprintf(key, sizeof key, "kind/%s", name);
    const char *kind = cps__ckpt_reader_meta(rd, key);
    return kind && !strcmp(kind, "local");
}

/* One pass of the restore: every tensor's records to the ranges the machine streams, then
 * STREAMED (the machine then waits for the heads' answers and the tails' confirmation). `bytes`:
 * adds what the checkpoint holds for the servers (NULL: a later pass, which says nothing again). */
static int restore_pass(restore_ctx *x, cps__ckpt_reader *rd, const cps__tensor_desc *want,
                        uint32_t nwant, uint64_t step, const char *from, uint64_t *bytes)
{
    int rc = 0;
    char key[CPS_CKPT_NAME_MAX];
    uint32_t nr = x->l->view.nranges;
    uint64_t *steps = NULL;
    for (uint32_t i = 0; rc == 0 && i < nwant; i++) {
        const cps__tensor_desc *d = &want[i];
        cps_tensor t;
        if ((rc = cps__cl_tensor_layout(x->l, d, &t)) != 0)
            break;
        x->pieces = cps__cl_tensor_pieces(&t, &x->npieces);
        if (!x->pieces)
            rc = CPS_ENOMEM;
        /* Optimizer step counts: per row (tables) or one for the tensor. */
        size_t nsteps = d->kind ? d->rows : 1;
        steps = rc == 0 ? calloc(nsteps, sizeof *steps) : NULL;
        if (rc == 0 && !steps)
            rc = CPS_ENOMEM;
        snprintf(key, sizeof key, "%sstep/%s", CPS_CKPT_OPTIM_PREFIX, d->name);
        const cps__ckpt_tensor *st = rc == 0 ? cps__ckpt_reader_find(rd, key) : NULL;
        if (st)
            rc = cps__ckpt_reader_read(rd, st, steps, nsteps * sizeof *steps);
        /* Create every key (zeros), then stream the values and optimizer state into them; a
         * later pass reads only what the ranges it streams again hold. */
        int streamed = 0;
        for (size_t k = 0; rc == 0 && k < x->npieces; k++) {
            const piece *p = &x->pieces[k];
            unsigned char *at;
            if (!cps__rs_open(&x->m, p->range))
                continue;
            streamed = 1;
            if ((rc = put_room(x, p->range, CPS_ENT_CREATE_SIZE, &at)) != 0)
                break;
            cps__ent_put_create(at, p->key, p->len, steps[d->kind ? p->off / d->cols : 0],
                                &d->spec);
        }
        uint32_t slots = (uint32_t)cps__optim_state_slots(d->spec.opt_kind);
        for (uint32_t k = 0; rc == 0 && (streamed || bytes) && k <= slots; k++) {
            const cps__ckpt_tensor *ct;
            if (k == 0) {
                ct = cps__ckpt_reader_find(rd, d->name);
            } else {
                cps__ckpt_optim_tensor_name(key, sizeof key, d->spec.opt_kind, k - 1, d->name);
                ct = cps__ckpt_reader_find(rd, key);
                if (!ct && bytes)
                    cps__log(CPS_LOG_WARN, SUB, "%s: no %s: that optimizer state starts at zero",
                             from, key);
            }
            x->slot = k;
            if (ct && streamed)
                rc = cps__ckpt_reader_stream(rd, ct, restore_sink, x);
        }
        /* Sync jobs: the step the key sets are at, so workers declaring them resume there. */
        for (uint32_t k = 0; rc == 0 && !d->kind && step && k < t.nparts; k++) {
            if (!cps__rs_open(&x->m, t.parts[k].range))
                continue;
            char name[64];
            int nlen =
                snprintf(name, sizeof name, "agg/%" PRIu32 "/%016" PRIx64, t.parts[k].range,
                         cps__keyset_sig(t.parts[k].keys, t.parts[k].lens, t.parts[k].nkeys));
            unsigned char *at, value[8];
            cps__le64_put(value, step);
            if ((rc = put_room(x, t.parts[k].range, cps__ent_named_size((size_t)nlen, 8), &at)) !=
                0)
                break;
            cps__ent_put_named(at, name, (size_t)nlen, value, 8);
        }
        if (bytes)
            *bytes += d->length * 4 * (1 + slots);
        free(steps);
        steps = NULL;
        free(x->pieces);
        x->pieces = NULL;
        cps__parts_free(t.parts, t.nparts);
    }
    for (uint32_t r = 0; rc == 0 && nwant && r < nr; r++)
        rc = put_flush(x, r);
    if (rc == 0 && nwant)
        rc = rs_feed(x, rs_event(x, CPS_RS_STREAMED));
    return rc;
}

int cps__ckpt_restore(const cps__restore_opts *o, const char *from, cps__restore_result *res)
{
    if (!o || !from || !res)
        return CPS_EINVAL;
    memset(res, 0, sizeof *res);
    uint64_t t0 = cps__now_ms();
    cps__ckpt_reader *rd = NULL;
    link l;
    memset(&l, 0, sizeof l);
    cps__view_init(&l.view);
    restore_ctx x = {0};
    int rc = cps__ckpt_reader_open(from, &rd);
    size_t nt = rc == 0 ? cps__ckpt_reader_count(rd) : 0;
    /* Every checksum first: a corrupt file writes nothing. */
    for (size_t i = 0; rc == 0 && i < nt; i++)
        rc = cps__ckpt_reader_verify(rd, cps__ckpt_reader_tensor(rd, i));
    const char *step_s = rc == 0 ? cps__ckpt_reader_meta(rd, CPS_CKPT_META_STEP) : NULL;
    uint64_t step = step_s ? strtoull(step_s, NULL, 10) : 0;
    /* The parameter tensors and what each needs. */
    cps__tensor_desc *want = rc == 0 ? calloc(nt ? nt : 1, sizeof *want) : NULL;
    uint32_t nwant = 0;
    if (rc == 0 && !want)
        rc = CPS_ENOMEM;
    char key[CPS_CKPT_NAME_MAX];
    for (size_t i = 0; rc == 0 && i < nt; i++) {
        const cps__ckpt_tensor *t = cps__ckpt_reader_tensor(rd, i);
        if (!strncmp(t->name, CPS_CKPT_OPTIM_PREFIX, strlen(CPS_CKPT_OPTIM_PREFIX)) ||
            is_local(rd, t->name))
            continue;
        cps__tensor_desc *d = &want[nwant];
        if (strcmp(t->dtype, "F32") != 0 || t->ndim < 1 || t->ndim > CPS_MAX_NDIM ||
            t->numel == 0 || strlen(t->name) > CPS_TENSOR_NAME_MAX) {
            cps__log(CPS_LOG_ERROR, SUB,
                     "%s: tensor %s is not a non-empty float32 tensor of 1..%d dims with "
                     "a name of at most 255 bytes",
                     t->file, t->name, CPS_MAX_NDIM);
            rc = CPS_EINVAL;
            break;
        }
        snprintf(d->name, sizeof d->name, "%s", t->name);
        snprintf(key, sizeof key, "kind/%s", t->name);
        const char *kind = cps__ckpt_reader_meta(rd, key);
        d->kind = kind && !strcmp(kind, "table") && t->ndim == 2;
        d->length = t->numel;
        d->rows = d->kind ? t->shape[0] : 0;
        d->cols = d->kind ? (uint32_t)t->shape[1] : 0;
        d->ndim = t->ndim;
        memcpy(d->dims, t->shape, t->ndim * sizeof *t->shape);
        snprintf(key, sizeof key, "%s%s", CPS_CKPT_META_HPARAM, t->name);
        const char *hp = cps__ckpt_reader_meta(rd, key);
        if (hp) {
            rc = cps__ckpt_spec_from_json(hp, &d->spec);
            unsigned char blk[CPS_WIRE_SPEC_SIZE];
            if (rc == 0) {
                cps__wire_spec_encode(blk, &d->spec);
                if (cps__wire_spec_decode(blk, &d->spec) != 0) {
                    cps__log(CPS_LOG_ERROR, SUB, "%s: invalid optimizer description for %s: %s",
                             t->file, t->name, hp);
                    rc = CPS_ECORRUPT;
                }
            }
        } else if (o->default_spec) {
            d->spec = *o->default_spec;
        } else {
            cps__log(CPS_LOG_ERROR, SUB,
                     "%s: tensor %s has no optimizer description "
                     "(hparams/%s): give one (--optimizer, --lr)",
                     t->file, t->name, t->name);
            rc = CPS_EINVAL;
        }
        nwant++;
    }
    /* The workers' local tensors are known too: they are theirs to cps__cl_take (cps_local_fetch).
     */
    const char **names = rc == 0 ? calloc(nt ? nt : 1, sizeof *names) : NULL;
    size_t nnames = 0;
    for (uint32_t i = 0; names && i < nwant; i++)
        names[nnames++] = want[i].name;
    for (size_t i = 0; names && i < nt; i++) {
        const cps__ckpt_tensor *t = cps__ckpt_reader_tensor(rd, i);
        if (is_local(rd, t->name))
            names[nnames++] = t->name;
    }
    if (rc == 0 && !names)
        rc = CPS_ENOMEM;
    if (rc == 0)
        rc = cps__ckpt_reader_check_names(rd, names, nnames);
    /* A job whose every tensor is all-reduced exports only local tensors: nothing for the
     * servers, the workers take them back themselves. */
    if (rc == 0 && nnames == 0) {
        cps__log(CPS_LOG_ERROR, SUB, "%s: no parameter tensors", from);
        rc = CPS_ENOTFOUND;
    }
    /* Optimizer state of an optimizer the tensor does not have is a tensor no one knows. */
    for (size_t i = 0; rc == 0 && i < nt; i++) {
        const cps__ckpt_tensor *t = cps__ckpt_reader_tensor(rd, i);
        if (strncmp(t->name, CPS_CKPT_OPTIM_PREFIX, strlen(CPS_CKPT_OPTIM_PREFIX)) ||
            is_local(rd, t->name))
            continue;
        int known = 0;
        for (uint32_t j = 0; j < nwant && !known; j++) {
            const cps__tensor_desc *d = &want[j];
            uint32_t slots = (uint32_t)cps__optim_state_slots(d->spec.opt_kind);
            for (uint32_t k = 0; k < slots && !known; k++)
                known = cps__ckpt_optim_tensor_name(key, sizeof key, d->spec.opt_kind, k,
                                                    d->name) == 0 &&
                        !strcmp(key, t->name) && t->numel == d->length;
            snprintf(key, sizeof key, "%sstep/%s", CPS_CKPT_OPTIM_PREFIX, d->name);
            known |= !strcmp(key, t->name) && !strcmp(t->dtype, "U64") &&
                     t->numel == (d->kind ? d->rows : 1);
        }
        if (!known) {
            cps__log(CPS_LOG_ERROR, SUB,
                     "%s: tensor %s matches no parameter's optimizer state "
                     "(wrong name, optimizer or size)",
                     t->file, t->name);
            rc = CPS_ENOTFOUND;
        }
    }
    if (rc == 0)
        rc = cps__cl_link_open(&l, o->scheduler, o->bind_host, o->advertise, o->key, o->timeout_ms);
    if (rc == 0)
        rc = cps__cl_link_registry(&l, o->scheduler);
    res->started = rc == 0;
    if (rc == 0 && l.ndescs)
        cps__log(CPS_LOG_WARN, SUB,
                 "the job's workers declared their tensors already: the "
                 "restored values replace what they train on");
    /* A job that already declared tensors must know every one of them, with the same shape. */
    for (uint32_t i = 0; rc == 0 && l.ndescs && i < nwant; i++) {
        const cps__tensor_desc *e = registry_find(&l, want[i].name);
        uint64_t a[CPS_MAX_NDIM], b[CPS_MAX_NDIM];
        uint32_t na = e ? cps__tensor_desc_shape(e, a) : 0,
                 nb = cps__tensor_desc_shape(&want[i], b);
        if (!e || e->length != want[i].length || e->kind != want[i].kind ||
            (e->ndim && (na != nb || memcmp(a, b, na * sizeof *a) != 0))) {
            cps__log(CPS_LOG_ERROR, SUB, "%s: tensor %s %s", from, want[i].name,
                     e ? "has another shape in the running job" : "is not a tensor of the job");
            rc = CPS_ENOTFOUND;
        }
    }
    uint32_t nr = l.view.nranges;
    if (rc == 0) {
        x.l = &l;
        x.base = cps__pad8(8 + l.hello_len);
        x.pb = calloc(nr ? nr : 1, sizeof *x.pb);
        cps__rs_cfg cfg;
        cps__rs_cfg_defaults(&cfg, (uint64_t)l.timeout_ms);
        rc = cps__rs_init(&x.m, &cfg, &l.view, nr, cps__now_ms());
        if (rc == 0 && !x.pb)
            rc = CPS_ENOMEM;
        for (uint32_t r = 0; rc == 0 && r < nr; r++) {
            x.pb[r].cap = PUT_BYTES + x.base;
            x.pb[r].buf = cps__tp_alloc(CPS_WIRE_HDR_SIZE + x.pb[r].cap);
            if (!x.pb[r].buf) {
                rc = CPS_ENOMEM;
                break;
            }
            unsigned char *p = x.pb[r].buf + CPS_WIRE_HDR_SIZE;
            memset(p, 0, x.base);
            cps__le32_put(p, (uint32_t)l.hello_len);
            memcpy(p + 8, l.hello, l.hello_len);
            x.pb[r].used = x.base;
        }
    }
    /* The machine says when a pass streams (STREAM: the first at once, the next ones paced and
     * after a look at the view) and when the restore ends; between passes this waits for what
     * it waits for. Nothing for the servers (only local tensors): nothing to stream. */
    if (rc == 0 && nwant)
        rc = rs_feed(&x, rs_event(&x, CPS_RS_TICK));
    for (uint32_t pass = 0; rc == 0 && nwant && !cps__rs_ended(&x.m);) {
        if (!x.stream) {
            rc = rs_wait(&x);
            continue;
        }
        x.stream = 0;
        uint32_t open = 0;
        for (uint32_t r = 0; r < nr; r++)
            open += cps__rs_open(&x.m, r);
        if (pass > 0)
            cps__log(CPS_LOG_INFO, SUB, "streaming %u range(s) again under view epoch %" PRIu64,
                     open, l.view.epoch);
        rc = restore_pass(&x, rd, want, nwant, step, from, pass++ ? NULL : &res->bytes);
    }
    if (rc == 0 && nwant)
        rc = x.m.rc; /* the machine's verdict, whatever outputs said it */
    res->resent = x.m.resent;
    if (rc == 0 && o->release)
        rc = release_workers(&l);
    for (uint32_t r = 0; x.pb && r < nr; r++)
        cps__tp_free(x.pb[r].buf);
    free(x.pb);
    cps__rs_fini(&x.m);
    res->no_replica = x.no_replica;
    free(names);
    free(want);
    res->step = step;
    res->tensors = nwant;
    res->seconds = (double)(cps__now_ms() - t0) / 1000.0;
    cps__ckpt_reader_close(rd);
    cps__cl_link_close(&l);
    return rc;
}
