/* The coordinator's output and the view it publishes (see coordinator.h for the order a shell
 * performs an output in): actions appended by the policies, views encoded as sent, a save asked
 * before a publish, and what a failed save holds back. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "core/array.h"
#include "core/log.h"
#include "core/wire.h"
#include "recovery/coordinator_out.h"

/* ---- the output ---- */

/* A log action's code: the line of a publish, written once the save's result is known. */
#define PUBLISH_LINE 1

/* Where an action goes when the output cannot grow: written, then never performed. */
static cps__coord_action scratch;

cps__coord_action *cps__co_push(cps__coord *c, int kind, uint32_t peer)
{
    cps__coord_out *o = &c->out;
    void *items = o->a;
    if (cps__array_reserve(&items, &o->cap, o->n + 1, sizeof *o->a, 32) != 0) {
        memset(&scratch, 0, sizeof scratch);
        return &scratch;
    }
    o->a = items;
    cps__coord_action *a = &o->a[o->n++];
    memset(a, 0, sizeof *a);
    a->kind = kind;
    a->peer = peer;
    return a;
}

void cps__co_log(cps__coord *c, int level, const char *fmt, ...)
{
    cps__coord_action *a = cps__co_push(c, CPS_CO_LOG, 0);
    a->level = level;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a->text, sizeof a->text, fmt, ap);
    va_end(ap);
}

uint32_t cps__co_payload(cps__coord *c, void *buf, size_t len)
{
    cps__coord_out *o = &c->out;
    void *items = o->views;
    if (cps__array_reserve(&items, &o->views_cap, o->nviews + 1, sizeof *o->views, 4) != 0) {
        free(buf);
        return UINT32_MAX;
    }
    o->views = items;
    o->views[o->nviews].data = buf;
    o->views[o->nviews].len = len;
    return (uint32_t)o->nviews++;
}

/* The index of the view's encoding in the output: the last one if the view is unchanged since,
 * else a new one. UINT32_MAX when out of memory. */
static uint32_t view_blob(cps__coord *c)
{
    cps__coord_out *o = &c->out;
    size_t len = cps__view_encoded_size(&c->view);
    void *buf = malloc(len ? len : 1);
    if (!buf)
        return UINT32_MAX;
    cps__view_encode(&c->view, buf, len);
    if (o->nviews && o->views[o->nviews - 1].len == len &&
        memcmp(o->views[o->nviews - 1].data, buf, len) == 0) {
        free(buf);
        return (uint32_t)(o->nviews - 1);
    }
    return cps__co_payload(c, buf, len);
}

void cps__co_send_view(cps__coord *c, uint32_t peer, uint8_t type, int settled)
{
    if (c->unsaved)
        return; /* sent once saved; nodes ask again meanwhile */
    const cps__coord_node *n = cps__co_find(c, peer);
    /* Workers held back (a checkpoint is being restored) learn of the job only at RELEASE. */
    if (n && n->info.role == CPS_ROLE_WORKER && c->cfg.hold_workers)
        return;
    if (n && cps__co_superseded(c, n))
        return; /* its peer is gone: it is sent nothing */
    uint32_t v = view_blob(c);
    if (v == UINT32_MAX)
        return;
    cps__coord_action *a = cps__co_push(c, CPS_CO_VIEW, peer);
    a->view = v;
    a->hdr.type = type;
    a->hdr.sender = CPS_COORD_SELF;
    a->hdr.epoch = c->view.epoch;
    a->hdr.req_worker = peer;
    /* A WELCOME names the incarnation whose HELLO it answers: a server lets itself in only by
     * its own (recovery/fence.h). */
    if (type == CPS_MSG_WELCOME)
        a->hdr.req_seq = n ? n->boot_id : 0;
    /* Whether the workers not live in it finished rather than died: a replacement alone in the
     * view then knows the job's work is done (issue 29). Only workers read it. */
    if (n && n->info.role == CPS_ROLE_WORKER && settled)
        a->hdr.step = CPS_VIEW_WORKERS_SETTLED;
}

void cps__co_send_simple(cps__coord *c, uint32_t peer, uint8_t type, const cps__msg_hdr *req)
{
    cps__coord_action *a = cps__co_push(c, CPS_CO_MSG, peer);
    a->hdr.type = type;
    a->hdr.sender = CPS_COORD_SELF;
    a->hdr.epoch = c->view.epoch;
    if (req) {
        a->hdr.flags = CPS_WF_REPLY;
        a->hdr.req_worker = req->req_worker;
        a->hdr.req_seq = req->req_seq;
        a->hdr.step = req->step;
    }
}

void cps__co_reply_error(cps__coord *c, const cps__msg_hdr *req, uint32_t peer, int code,
                         const char *text)
{
    cps__coord_action *a = cps__co_push(c, CPS_CO_ERROR, peer);
    a->hdr = *req;
    a->hdr.sender = peer;
    a->code = code;
    snprintf(a->text, sizeof a->text, "%s", text);
}

/* Ask the shell to write the view and the job's progress before anything of this output goes
 * out. A failed save holds every view (cps__coord_persisted) until a retry succeeds: a view some
 * node saw but the disk did not could be lost by a restart, and the restarted scheduler would
 * publish another view under the same epoch. Failover waits meanwhile. */
void cps__co_save(cps__coord *c)
{
    if (c->started)
        c->out.persist |= CPS_CO_P_STATE;
}

static void publish_lines(cps__coord *c, int held);

cps__coord_out *cps__coord_ready(cps__coord *c)
{
    return &c->out;
}

void cps__coord_persisted(cps__coord *c, int rc, uint64_t now)
{
    if (rc != 0) {
        if (!c->unsaved)
            cps__co_log(c, CPS_LOG_ERROR,
                        "cannot save view epoch %llu: %s; no node is sent it until it is saved "
                        "(failover waits), retrying every %u ms",
                        (unsigned long long)c->view.epoch, cps_strerror(rc), c->save_retry_ms);
        if (!c->unsaved && !c->held_type)
            c->held_type = CPS_MSG_VIEW;
        /* What was to go out with it waits for the save, and goes as held_type then. */
        for (size_t i = 0; i < c->out.n; i++)
            if (c->out.a[i].kind == CPS_CO_VIEW)
                c->out.a[i].kind = 0;
        c->unsaved = 1;
        publish_lines(c, 1);
        c->failed_saves++;
        c->save_retry_at = now + c->save_retry_ms;
        c->out.persist = 0;
        return;
    }
    publish_lines(c, !(c->out.persist & CPS_CO_P_STATE) && c->unsaved);
    if (c->out.persist & CPS_CO_P_STATE) {
        if (c->unsaved) {
            c->unsaved = 0;
            cps__co_log(c, CPS_LOG_INFO,
                        "saved view epoch %llu after %u failed tries: sending it to every node",
                        (unsigned long long)c->view.epoch, c->failed_saves);
            /* First in the output: the log then tells the save before what it let out. */
            if (c->out.n > 1) {
                cps__coord_action line = c->out.a[c->out.n - 1];
                memmove(c->out.a + 1, c->out.a, (c->out.n - 1) * sizeof *c->out.a);
                c->out.a[0] = line;
            }
            c->failed_saves = 0;
            int settled = cps__co_workers_settled(c);
            for (uint32_t i = 0; i < c->nnodes; i++)
                if (!c->nodes[i].done)
                    cps__co_send_view(c, c->nodes[i].info.id, c->held_type, settled);
        }
        c->held_type = 0;
    }
    c->out.persist = 0;
}

void cps__coord_done(cps__coord *c)
{
    for (size_t i = 0; i < c->out.nviews; i++)
        free((void *)c->out.views[i].data);
    c->out.nviews = 0;
    c->out.n = 0;
    c->out.persist = 0;
}

int cps__coord_unsent(cps__coord *c, const cps__msg_hdr *hdr)
{
    if (hdr->type == CPS_MSG_JOIN_RANGE && c->repair)
        cps__repair_join_unsent(c->repair, hdr->range, hdr->step);
    return hdr->type == CPS_MSG_PROBE ? CPS_LOG_DEBUG : CPS_LOG_WARN;
}

/* Rebuild the view's node list from the members (ranges are placed once, at start). */
int cps__co_sync_view_nodes(cps__coord *c)
{
    cps__node_info *nodes = calloc(c->nnodes ? c->nnodes : 1, sizeof *nodes);
    if (!nodes)
        return CPS_ENOMEM;
    for (uint32_t i = 0; i < c->nnodes; i++)
        nodes[i] = c->nodes[i].info;
    free(c->view.nodes);
    c->view.nodes = nodes;
    c->view.nnodes = c->nnodes;
    if (c->started) {
        uint32_t S = 0; /* servers that joined later count; drained ones do not */
        for (uint32_t i = 0; i < c->nnodes; i++)
            S += c->nodes[i].info.role == CPS_ROLE_SERVER && !c->nodes[i].left;
        c->view.num_servers = S;
    }
    return 0;
}

/* Our peers follow the members: a superseded worker's socket is closed (the soak found one fd,
 * and a queue of up to the transport's limit of views, kept per worker replacement), and a node
 * that is no longer superseded (a worker taken back alive) gets its peer again. */
static void sync_peers(cps__coord *c)
{
    for (uint32_t i = 0; i < c->nnodes; i++) {
        const cps__coord_node *n = &c->nodes[i];
        if (cps__co_superseded(c, n)) {
            cps__co_push(c, CPS_CO_PEER_DROP, n->info.id);
        } else if (n->info.addr[0]) {
            cps__coord_action *a = cps__co_push(c, CPS_CO_PEER_SET, n->info.id);
            snprintf(a->addr, sizeof a->addr, "%s", n->info.addr);
        }
    }
}

/* A new epoch of the view, saved, then sent to every member (the dead too: a node declared dead
 * that is in fact alive learns from it that it is out). */
void cps__co_publish(cps__coord *c, const char *why)
{
    if (!c->started)
        return;
    cps__co_sync_view_nodes(c);
    sync_peers(c);
    c->view.epoch++;
    cps__co_save(c);
    /* A finished worker has closed its inbox: a view for it would wait in its queue for ever,
     * and the scheduler only exits once every queue is empty. */
    int settled = cps__co_workers_settled(c);
    for (uint32_t i = 0; i < c->nnodes; i++)
        if (!c->nodes[i].done && !c->nodes[i].left)
            cps__co_send_view(c, c->nodes[i].info.id, CPS_MSG_VIEW, settled);
    /* Whether it went out is known once the shell saved it: the line is written then. */
    cps__coord_action *a = cps__co_push(c, CPS_CO_LOG, 0);
    a->level = CPS_LOG_INFO;
    a->code = PUBLISH_LINE;
    a->hdr.epoch = c->view.epoch;
    snprintf(a->text, sizeof a->text, "%s", why);
}

/* The publish lines of the output, now that the save's result is known. */
static void publish_lines(cps__coord *c, int held)
{
    for (size_t i = 0; i < c->out.n; i++) {
        cps__coord_action *a = &c->out.a[i];
        if (a->kind != CPS_CO_LOG || a->code != PUBLISH_LINE)
            continue;
        char why[sizeof a->text];
        snprintf(why, sizeof why, "%s", a->text);
        snprintf(a->text, sizeof a->text, "view epoch %llu %s (%.180s)",
                 (unsigned long long)a->hdr.epoch, held ? "held until saved" : "published", why);
        a->code = 0;
    }
}
