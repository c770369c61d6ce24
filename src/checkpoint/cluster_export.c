/* Export: the workers' local tensors and the export itself (cluster.h, cluster_int.h). */
#include "checkpoint/cluster_int.h"

/* ---- the workers' local tensors (worker/localset.h) ---- */

typedef struct local_cut {
    uint32_t node, rank; /* the worker asked */
    uint64_t req;
    int have;            /* rx and blob hold its answer */
    int any;             /* asked for its next boundary, not the cut's step */
    int stepped;         /* its boundary is the cut's step (a job without dense server tensors) */
    cps__lset_asm as;    /* the blob's chunks so far; the blob once complete */
    cps__lset_blob blob; /* decoded from as.buf */
} local_cut;

static void local_reset(local_cut *lc)
{
    cps__lset_blob_fini(&lc->blob);
    cps__lset_asm_fini(&lc->as);
    memset(lc, 0, sizeof *lc);
}

/* The live worker of the lowest rank: in a sync job every worker holds the same bits of its
 * all-reduced tensors, so any one will do, and the lowest is the one the docs name. */
static const cps__node_info *local_worker(const link *l)
{
    const cps__node_info *best = NULL;
    for (uint32_t i = 0; i < l->view.nnodes; i++) {
        const cps__node_info *n = &l->view.nodes[i];
        if (n->role == CPS_ROLE_WORKER && n->alive && (!best || n->rank < best->rank))
            best = n;
    }
    return best;
}

/* 1 if every server tensor is a table (row pushes: no per-step aggregate on the servers). */
static int all_tables(const link *l)
{
    for (uint32_t i = 0; i < l->ndescs; i++)
        if (l->descs[i].kind != 1)
            return 0;
    return 1;
}

/* Ask that worker for its local tensors at boundary `step` (any: its next boundary). */
static int local_ask(link *l, local_cut *lc, uint64_t step, int any)
{
    local_reset(lc);
    const cps__node_info *w = local_worker(l);
    if (!w) {
        cps__log(CPS_LOG_ERROR, SUB,
                 "the job has local (all-reduced) tensors but no live worker to give them");
        return CPS_EUNAVAILABLE;
    }
    lc->node = w->id;
    lc->rank = w->rank;
    lc->any = any;
    lc->req = ++l->next_req;
    int rc = cps__tp_peer_set(l->tp, w->id, w->addr);
    cps__msg_hdr h = {.type = CPS_MSG_LOCAL,
                      .sender = UINT32_MAX,
                      .req_seq = lc->req,
                      .step = step,
                      .aux = any ? 1 : 0};
    if (rc == 0)
        rc = cps__msg_send(l->tp, w->id, &h, l->hello, l->hello_len);
    if (rc != 0)
        cps__log(CPS_LOG_ERROR, SUB, "cannot ask worker %u (rank %u) for its local tensors: %s",
                 w->id, w->rank, cps_strerror(rc));
    return rc;
}

static int match_local(const cps__rx *rx, const void *arg)
{
    const local_cut *lc = arg;
    return rx->hdr.type == CPS_MSG_LOCAL && (rx->hdr.flags & CPS_WF_REPLY) &&
           rx->hdr.req_seq == lc->req;
}

/* Wait for the worker's answer. A worker that dies meanwhile is replaced by the next live one,
 * asked for the same boundary. *past: the worker's boundary when it was past `step`. */
static int local_take(link *l, local_cut *lc, uint64_t step, int any, uint64_t *past)
{
    uint64_t deadline = cps__now_ms() + (uint64_t)l->timeout_ms;
    int rc = 0;
    while (rc == 0 && !lc->have) {
        uint64_t now = cps__now_ms();
        if (now >= deadline) {
            cps__log(CPS_LOG_ERROR, SUB,
                     "worker %u (rank %u) did not give its local tensors of step %" PRIu64
                     " within %.0f s (%" PRIu64 " bytes of them came)",
                     lc->node, lc->rank, step, l->timeout_ms / 1000.0, lc->as.got);
            return CPS_ETIMEDOUT;
        }
        cps__rx rx;
        rc = cps__cl_take(l, match_local, lc, now + LOOK_MS < deadline ? now + LOOK_MS : deadline,
                          &rx);
        if (rc == CPS_ETIMEDOUT) {
            rc = 0;
            if (!cps__tp_peer_gone(l->tp, lc->node))
                continue;
            if ((rc = cps__cl_link_refresh_view(l)) == 0) {
                const cps__node_info *w = local_worker(l);
                if (!w || w->id != lc->node)
                    rc = local_ask(l, lc, step, any);
            }
            continue;
        }
        if (rc != 0)
            break;
        int st = rx.hdr.status, done = 0;
        uint64_t at = rx.hdr.step;
        if (st == 0) {
            done = cps__lset_asm_put(&lc->as, rx.hdr.step, rx.payload, rx.len);
            if (done < 0)
                cps__log(CPS_LOG_ERROR, SUB,
                         "worker %u (rank %u): a bad chunk of its local tensors (%zu bytes at "
                         "%" PRIu64 " of step %" PRIu64 "): %s",
                         lc->node, lc->rank, rx.len, lc->as.got, rx.hdr.step,
                         done == CPS_ESIZE    ? "truncated or past the announced length"
                         : done == CPS_EPROTO ? "lost, repeated or out of order, or of another step"
                                              : cps_strerror(done));
        }
        cps__rx_free(&rx);
        if (st == 0 && done == 0)
            continue;
        if (st == 0 && done == 1) {
            rc = cps__lset_blob_decode(lc->as.buf, (size_t)lc->as.total, &lc->blob);
            if (rc == 0 && !any && lc->blob.step != step) {
                cps__log(CPS_LOG_ERROR, SUB,
                         "worker %u (rank %u) gave its local tensors of step %" PRIu64
                         ", not of step %" PRIu64,
                         lc->node, lc->rank, lc->blob.step, step);
                rc = CPS_EPROTO;
            } else if (rc != 0) {
                cps__log(CPS_LOG_ERROR, SUB,
                         "worker %u (rank %u): malformed local tensors of step %" PRIu64 ": %s",
                         lc->node, lc->rank, step, cps_strerror(rc));
            }
            if (rc == 0) {
                lc->have = 1;
                break;
            }
        } else if (st == 0) {
            rc = done;
        } else if (st == CPS_EPAST) {
            *past = at;
            rc = st;
        } else {
            if (st == CPS_ENOTFOUND)
                cps__log(CPS_LOG_ERROR, SUB,
                         "worker %u (rank %u) lists no local tensors, though the job registered "
                         "some",
                         lc->node, lc->rank);
            else
                cps__log(CPS_LOG_ERROR, SUB,
                         "worker %u (rank %u) could not give its local tensors of step %" PRIu64
                         ": %s",
                         lc->node, lc->rank, step, cps_strerror(st));
            rc = st;
        }
        cps__lset_blob_fini(&lc->blob);
        cps__lset_asm_fini(&lc->as);
    }
    return rc;
}

/* The local tensors into the checkpoint, beside the servers', marked kind/<name> = "local". */
static int local_write(const link *l, const local_cut *lc, cps__ckpt_writer *w)
{
    const cps__lset_blob *b = &lc->blob;
    char key[CPS_CKPT_NAME_MAX], val[32];
    int rc = 0;
    for (uint32_t i = 0; rc == 0 && i < b->ntensors; i++) {
        const cps__lset_tensor *t = &b->tensors[i];
        for (uint32_t j = 0; rc == 0 && j < l->ndescs; j++)
            if (!strcmp(l->descs[j].name, t->name)) {
                cps__log(CPS_LOG_ERROR, SUB,
                         "tensor %s is both on the servers and a worker's local tensor", t->name);
                rc = CPS_EEXIST;
            }
        if (rc == 0)
            rc = cps__ckpt_writer_add(w, t->name, CPS_CKPT_F32, t->ndim, t->dims, t->data);
        snprintf(key, sizeof key, "kind/%s", t->name);
        if (rc == 0)
            rc = cps__ckpt_writer_set_meta(w, key, "local");
    }
    for (uint32_t i = 0; rc == 0 && i < b->nmeta; i++) {
        snprintf(key, sizeof key, "local/meta/%s", b->keys[i]);
        rc = cps__ckpt_writer_set_meta(w, key, b->values[i]);
    }
    snprintf(val, sizeof val, "%" PRIu64, b->step);
    if (rc == 0)
        rc = cps__ckpt_writer_set_meta(w, "local/step", val);
    snprintf(val, sizeof val, "%u", lc->rank);
    if (rc == 0)
        rc = cps__ckpt_writer_set_meta(w, "local/rank", val);
    snprintf(val, sizeof val, "%u", b->ntensors);
    if (rc == 0)
        rc = cps__ckpt_writer_set_meta(w, "local/tensors", val);
    if (rc == 0)
        rc = cps__ckpt_writer_set_meta(w, "local/cut",
                                       lc->stepped ? "the job's step boundary (the workers')"
                                       : lc->any   ? "the worker's next step boundary after the cut"
                                                   : "the servers' step boundary");
    return rc;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(((const cps__tensor_desc *)a)->name, ((const cps__tensor_desc *)b)->name);
}

/* Tell the scheduler the checkpoint is complete, so `chainps status` and /metrics show it. A
 * scheduler that misses it only shows an older checkpoint: the export itself succeeded. */
static int note_done(link *l, const char *path, uint64_t step)
{
    cps__ckpt_note n;
    memset(&n, 0, sizeof n);
    n.step = step;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    n.unix_ms = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
    snprintf(n.path, sizeof n.path, "%s", path);
    unsigned char b[CPS_CKPT_NOTE_FIXED + CPS_CKPT_NOTE_PATH_MAX];
    size_t len = cps__ckpt_note_encode(b, sizeof b, &n);
    cps__msg_hdr h = {.type = CPS_MSG_CKPT_DONE, .sender = UINT32_MAX, .step = step};
    int rc = cps__msg_send(l->tp, SCHED, &h, b, len);
    if (rc != 0)
        cps__log(CPS_LOG_WARN, SUB, "could not tell the scheduler of the checkpoint: %s",
                 cps_strerror(rc));
    return rc;
}

int cps__ckpt_announce(const cps__export_opts *o, const char *path, uint64_t step)
{
    if (!o || !path || !*path)
        return CPS_EINVAL;
    link l;
    int rc = cps__cl_link_open(&l, o->scheduler, o->bind_host, o->advertise, o->key, o->timeout_ms);
    if (rc == 0)
        rc = note_done(&l, path, step);
    cps__cl_link_close(&l); /* waits (bounded) for the note to leave */
    return rc;
}

/* The answers (8 MB each, 64 MB in flight) are allocated by nanomsg's receiving thread and freed
 * by ours. glibc's defaults gave each a fresh mmap or let a trimmed heap fault its pages in
 * again: page faults and zeroing were a third of the export's CPU (perf). Keeping blocks up to
 * 32 MB in the heap, and 256 MB of free heap before giving it back, reuses the same pages. The
 * setting is the process's (the scheduler's, for periodic exports): it only keeps freed memory
 * longer. */
static void keep_heap(void)
{
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
    /* A fresh export process still touched all those pages once, 4 KB at a time: a fault and a
     * zeroing each, a third of its CPU on a VM (perf). warm_heap faults the heap's first pages in
     * as huge pages instead, and nanomsg's thread, which receives some of the answers, allocates
     * from this same heap rather than an arena of its own (it is created after this in an export
     * process). */
    mallopt(M_ARENA_MAX, 1);
}

/* The heap's first pages faulted in as huge pages, once per process, as many as this export will
 * have in flight: READ_TOTAL answers and one more (72 MB), or the whole model with its
 * optimizer state when that is less. A fixed 72 MB cost every export of a small model up to 0.1
 * CPU s of zeroing, which at a low priority on a busy host is seconds of waiting (integration
 * .ckpt_fast, exports at nice 19 beside four busy loops: 2 exports took 23.6 s, now 9.4). */
static void warm_heap(const link *l)
{
    static atomic_int warmed;
    uint64_t bytes = 0, cap = (uint64_t)(READ_TOTAL + 1) * READ_BYTES;
    for (uint32_t i = 0; i < l->ndescs && bytes < cap; i++) {
        const cps__tensor_desc *d = &l->descs[i];
        uint64_t slots = cps__optim_state_slots(d->spec.opt_kind);
        bytes += d->length * sizeof(float) * (1 + slots);
    }
    if (bytes >= PREWARM_MIN_BYTES && !atomic_exchange(&warmed, 1))
        cps__heap_prewarm((size_t)(bytes < cap ? bytes : cap));
}

typedef struct tensor_job {
    cps_tensor t;
    piece *pieces;
    size_t npieces;
    export_ctx ctx[1 + 2 + 1]; /* values, up to two optimizer slots, step counts */
} tensor_job;

static void jobs_free(tensor_job *jobs, uint32_t n)
{
    for (uint32_t i = 0; jobs && i < n; i++) {
        for (size_t k = 0; k < sizeof jobs[i].ctx / sizeof *jobs[i].ctx; k++)
            cps__cl_dense_free(&jobs[i].ctx[k]);
        cps__parts_free(jobs[i].t.parts, jobs[i].t.nparts);
        free(jobs[i].pieces);
    }
    free(jobs);
}

int cps__ckpt_export(const cps__export_opts *o, const char *out, cps__export_result *res)
{
    if (!o || !out || !res)
        return CPS_EINVAL;
    memset(res, 0, sizeof *res);
    static pthread_once_t heap_once = PTHREAD_ONCE_INIT;
    pthread_once(&heap_once, keep_heap);
    uint64_t t0 = cps__now_ms();
    link l;
    cut c = {0};
    local_cut lc = {0};
    tensor_job *jobs = NULL;
    cps__ckpt_writer *w = NULL;
    int rc = cps__cl_link_open(&l, o->scheduler, o->bind_host, o->advertise, o->key, o->timeout_ms);
    if (rc == 0)
        rc = cps__cl_link_registry(&l, o->scheduler);
    uint64_t wait_until = t0 + (uint64_t)(o->timeout_ms > 0 ? o->timeout_ms : 120000);
    while (o->wait_start && (rc == CPS_EUNAVAILABLE || (rc == 0 && !l.ndescs && !l.has_local)) &&
           cps__now_ms() < wait_until) {
        struct timespec pause = {0, 100 * 1000 * 1000};
        nanosleep(&pause, NULL);
        rc = cps__cl_link_registry(&l, o->scheduler);
    }
    if (rc == 0 && l.ndescs == 0 && !l.has_local) {
        cps__log(o->quiet_until_ready ? CPS_LOG_DEBUG : CPS_LOG_ERROR, SUB,
                 "the job has no tensors yet (workers register them when "
                 "they declare them): nothing to export");
        rc = CPS_ENOTFOUND;
    }
    uint32_t n = l.view.nranges;
    if (rc == 0) {
        c.nranges = n;
        size_t nn = n ? n : 1;
        c.open = calloc(nn, sizeof *c.open);
        c.seq = calloc(nn, sizeof *c.seq);
        c.at_step = calloc(nn, sizeof *c.at_step);
        c.gen = calloc(nn, sizeof *c.gen);
        c.node = calloc(nn, sizeof *c.node);
        if (!c.open || !c.seq || !c.at_step || !c.gen || !c.node)
            rc = CPS_ENOMEM;
    }
    /* The cut: sync jobs at a step boundary, the others now. */
    int sync = l.view.mode == CPS_MODE_SYNC;
    /* A sync job with no dense server tensor (every tensor all-reduced, or row-pushed tables
     * beside them) has no step boundary on the servers: their sync steps never advance. Its
     * steps are the workers' (cps_local_commit), so the cut's step comes from the worker asked
     * for the local tensors: exactly at_step (periodic checkpoints), or its next boundary. The
     * tables are then cut as they are when that boundary's tensors have arrived: their pushes
     * are not aligned to steps anyway. Chosen over the rows' push counts, which count pushes,
     * not steps: a table's rows are pushed a varying number of times per step. */
    int local_steps = sync && l.has_local && all_tables(&l);
    if (rc == 0 && sync && o->at_step && !l.has_local && all_tables(&l)) {
        /* Nothing counts this job's steps yet: the workers register their local tensors after
         * declaring the table (a periodic export asks again), or have none (a job of tables
         * alone: no step boundary anywhere; `--checkpoint-every Ns` works). */
        cps__log(o->quiet_until_ready ? CPS_LOG_DEBUG : CPS_LOG_ERROR, SUB,
                 "the job has no dense server tensor and no worker-held tensors (yet): no step "
                 "boundary to cut at step %" PRIu64 " at",
                 o->at_step);
        rc = CPS_ENOTFOUND;
    }
    uint64_t step = 0;
    aim a = {0};
    if (rc == 0 && local_steps) {
        step = o->at_step;
    } else if (rc == 0 && sync) {
        if (o->at_step)
            step = o->at_step;
        else if ((rc = cps__cl_aim_measure(&l, &a)) == 0)
            step = cps__cl_aim_step(&a, 0);
    }
    uint64_t past = 0;
    unsigned char *need = rc == 0 ? calloc(n ? n : 1, 1) : NULL;
    if (rc == 0 && !need)
        rc = CPS_ENOMEM;
    if (rc == 0)
        rc = cps__cl_needed_ranges(&l, need);
    int attempt = 0, cut_try = 0;
again:
    for (; rc == 0; attempt++) {
        /* The workers' local tensors: in a sync job with a dense server tensor, at the cut's
         * step (asked before the cut opens: the workers reach it after the servers, whose acks
         * they wait for); in async jobs at the worker's next step boundary after the cut; in a
         * sync job without a dense server tensor the worker's boundary is the cut's step. */
        if (local_steps) {
            rc = local_ask(&l, &lc, step, step == 0);
            if (rc == 0)
                rc = local_take(&l, &lc, step, step == 0, &past);
            if (rc == 0) {
                step = lc.blob.step;
                lc.stepped = 1;
            }
            if (rc == 0 && l.ndescs)
                rc = cps__cl_open_cut(&l, &c, 0, need, sync, &past);
            break;
        }
        int local_any = !sync;
        if (l.has_local && !local_any)
            rc = local_ask(&l, &lc, step, 0);
        if (rc == 0)
            rc = cps__cl_open_cut(&l, &c, sync ? (step ? step : 0) : 0, need, sync, &past);
        if (rc == 0 && l.has_local && local_any)
            rc = local_ask(&l, &lc, 0, 1);
        if (rc == 0 && l.has_local)
            rc = local_take(&l, &lc, step, local_any, &past);
        if (rc != CPS_EPAST || o->at_step || attempt + 1 >= OPEN_TRIES)
            break;
        /* Training got there first: measure again and aim twice as far ahead. */
        cps__cl_close_cut(&l, &c);
        double lead = a.lead_ms * 2;
        if ((rc = cps__cl_aim_measure(&l, &a)) != 0)
            break;
        a.lead_ms = lead > a.lead_ms ? lead : a.lead_ms;
        a.hi = past > a.hi ? past : a.hi;
        cps__log(CPS_LOG_INFO, SUB,
                 "the job was past step %" PRIu64 " when the cut reached it (at %" PRIu64
                 ", about %.0f steps/s); cutting at step %" PRIu64 " instead (%.0f ms ahead)",
                 step, past, a.rate, cps__cl_aim_step(&a, 1), a.lead_ms);
        step = cps__cl_aim_step(&a, 1);
    }
    if (rc == CPS_EPAST && o->at_step) {
        cps__log(CPS_LOG_ERROR, SUB, "the job is already past step %" PRIu64 " (at %" PRIu64 ")",
                 step, past);
        step = past; /* reported in res->step */
    } else if (rc == CPS_EPAST) {
        cps__log(CPS_LOG_ERROR, SUB,
                 "the job ran past the step the cut aimed at in each of %d tries (the last: step "
                 "%" PRIu64 ", %.0f ms ahead; the job was at %" PRIu64
                 ", about %.0f steps/s, probes taking %.1f ms): the cut's messages reach its "
                 "servers more slowly than the job steps; try again, or give --step",
                 attempt + 1, step, a.lead_ms, past, a.rate, a.rtt_ms);
        step = past;
    }
    uint64_t t_cut = cps__now_ms();
    /* The registry again, now that the cut is open: a cut that waited for its step must hold the
     * tensors declared meanwhile (workers declare while the exporter waits at a job's start). */
    if (rc == 0)
        rc = cps__cl_link_registry(&l, o->scheduler);
    if (rc == 0 && (rc = cps__cl_needed_ranges(&l, need)) == 0)
        for (uint32_t r = 0; r < n; r++)
            if (need[r] && !c.open[r]) {
                /* A tensor declared meanwhile has keys in a range the cut skipped: the export
                 * fails now and is tried again (the periodic thread does) with every range. */
                cps__log(CPS_LOG_WARN, SUB,
                         "range %u got keys while the cut was opened; export again", r);
                rc = CPS_EAGAIN;
                break;
            }
    if (rc == 0 && !sync)
        for (uint32_t r = 0; r < n; r++)
            step = c.at_step[r] > step ? c.at_step[r] : step;
    /* The checkpoint. */
    if (rc == 0)
        warm_heap(&l);
    if (rc == 0)
        rc = cps__ckpt_writer_open(out, o->max_shard_bytes, &w);
    if (rc == 0) {
        qsort(l.descs, l.ndescs, sizeof *l.descs, name_cmp);
        jobs = calloc(l.ndescs, sizeof *jobs);
        if (!jobs)
            rc = CPS_ENOMEM;
    }
    char key[CPS_CKPT_NAME_MAX], val[1024];
    for (uint32_t i = 0; rc == 0 && i < l.ndescs; i++) {
        const cps__tensor_desc *d = &l.descs[i];
        tensor_job *j = &jobs[i];
        if ((rc = cps__cl_tensor_layout(&l, d, &j->t)) != 0)
            break;
        if (!(j->pieces = cps__cl_tensor_pieces(&j->t, &j->npieces))) {
            rc = CPS_ENOMEM;
            break;
        }
        /* The declared shape, so torch's load_state_dict takes the file as it is; optimizer
         * slots have their parameter's shape, as in torch.optim's state. */
        uint64_t shape[CPS_MAX_NDIM];
        uint32_t ndim = cps__tensor_desc_shape(d, shape);
        uint32_t slots = (uint32_t)cps__optim_state_slots(d->spec.opt_kind);
        for (uint32_t k = 0; k <= slots + 1 && rc == 0; k++) {
            export_ctx *x = &j->ctx[k];
            *x = (export_ctx){&l,        &c, d,   j->pieces, j->npieces, k <= slots ? k : 0,
                              k > slots, 0,  NULL};
            if (k == 0) {
                rc = cps__ckpt_writer_add_stream(w, d->name, CPS_CKPT_F32, ndim, shape,
                                                 cps__cl_export_fill, x);
            } else if (k <= slots) {
                if ((rc = cps__ckpt_optim_tensor_name(key, sizeof key, d->spec.opt_kind, k - 1,
                                                      d->name)) == 0)
                    rc = cps__ckpt_writer_add_stream(w, key, CPS_CKPT_F32, ndim, shape,
                                                     cps__cl_export_fill, x);
            } else {
                uint64_t sshape[1] = {d->kind ? d->rows : 1};
                snprintf(key, sizeof key, "%sstep/%s", CPS_CKPT_OPTIM_PREFIX, d->name);
                rc = cps__ckpt_writer_add_stream(w, key, CPS_CKPT_U64, 1, sshape,
                                                 cps__cl_export_fill, x);
            }
        }
        if (rc == 0 && cps__ckpt_spec_to_json(&d->spec, val, sizeof val) > 0) {
            snprintf(key, sizeof key, "%s%s", CPS_CKPT_META_HPARAM, d->name);
            rc = cps__ckpt_writer_set_meta(w, key, val);
        }
        if (rc == 0) {
            snprintf(key, sizeof key, "kind/%s", d->name);
            rc = cps__ckpt_writer_set_meta(w, key, d->kind ? "table" : "dense");
        }
        res->bytes += d->length * 4 * (1 + slots);
    }
    if (rc == 0) {
        char mode[32];
        snprintf(val, sizeof val, "%" PRIu64, step);
        rc = cps__ckpt_writer_set_meta(w, CPS_CKPT_META_STEP, val);
        snprintf(mode, sizeof mode, "%s",
                 sync                          ? "sync"
                 : l.view.mode == CPS_MODE_SSP ? "ssp"
                                               : "async");
        if (rc == 0)
            rc = cps__ckpt_writer_set_meta(w, "mode", mode);
        if (rc == 0)
            rc = cps__ckpt_writer_set_meta(w, "cut",
                                           local_steps ? "the workers' step boundary"
                                           : sync      ? "step boundary"
                                                       : "per-range sequence number");
        for (uint32_t r = 0; rc == 0 && r < n; r++) {
            snprintf(key, sizeof key, "cut/seq/%u", r);
            snprintf(val, sizeof val, "%" PRIu64, c.seq[r]);
            rc = cps__ckpt_writer_set_meta(w, key, val);
        }
        if (rc == 0 && lc.have)
            rc = local_write(&l, &lc, w);
        if (rc == 0 && l.ndescs == 1 && cps__ckpt_optim_kind_name(l.descs[0].spec.opt_kind))
            rc = cps__ckpt_writer_set_meta(w, CPS_CKPT_META_OPTIM,
                                           cps__ckpt_optim_kind_name(l.descs[0].spec.opt_kind));
    }
    if (rc == 0) {
        rc = cps__ckpt_writer_commit(w, res->path, sizeof res->path);
        w = NULL;
    }
    if (rc == CPS_EAGAIN && c.lost == CPS_EAGAIN && !o->at_step && ++cut_try < CUT_TRIES) {
        /* Every replica that held a range's view at the cut died (a chain of one, or all of
         * it): what was written is dropped, and the job is cut again at a later step. */
        cps__ckpt_writer_abort(w);
        w = NULL;
        jobs_free(jobs, l.ndescs);
        jobs = NULL;
        res->bytes = 0;
        rc = sync && !local_steps ? cps__cl_aim_measure(&l, &a) : 0;
        if (rc == 0) {
            step = sync && !local_steps ? cps__cl_aim_step(&a, 1) : 0;
            cps__log(CPS_LOG_INFO, SUB, "cutting again (try %d of %d)%s", cut_try + 1, CUT_TRIES,
                     sync ? ", at a later step" : "");
            goto again;
        }
    }
    if (rc == CPS_EAGAIN && c.lost == CPS_EAGAIN && o->at_step)
        cps__log(CPS_LOG_ERROR, SUB,
                 "range %u: the replicas that held its read view at step %" PRIu64
                 " are gone, and no other one is at that step",
                 c.lost_range, step);
    if (rc == 0) {
        uint64_t t1 = cps__now_ms();
        cps__log(CPS_LOG_INFO, SUB,
                 "export: cut open after %.2f s; reading and writing %.2f s, of which %.2f s "
                 "waiting for the servers' answers",
                 (t_cut - t0) / 1000.0, (t1 - t_cut) / 1000.0, l.read_wait_us / 1e6);
    }
    if (rc == 0 && !o->no_announce)
        note_done(&l, res->path, step);
    cps__ckpt_writer_abort(w);
    if (c.open)
        cps__cl_close_cut(&l, &c);
    cps__cutroute_destroy(c.route);
    jobs_free(jobs, l.ndescs);
    res->tensors = l.ndescs;
    for (uint32_t i = 0; lc.have && rc == 0 && i < lc.blob.ntensors; i++)
        res->bytes += 4 * lc.blob.tensors[i].numel;
    for (uint32_t i = 0; lc.have && i < lc.blob.ntensors; i++)
        res->tensors += strncmp(lc.blob.tensors[i].name, CPS_CKPT_OPTIM_PREFIX,
                                strlen(CPS_CKPT_OPTIM_PREFIX)) != 0;
    local_reset(&lc);
    res->step = step;
    res->seconds = (double)(cps__now_ms() - t0) / 1000.0;
    free(need);
    free(c.open);
    free(c.seq);
    free(c.at_step);
    free(c.gen);
    free(c.node);
    cps__cl_link_close(&l);
    return rc;
}
