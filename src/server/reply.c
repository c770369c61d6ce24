/* What every part of the server answers and asks with: error and ack replies to a request, a
 * request's checks against the view, and asking the scheduler for the view. */
#include <stdarg.h>
#include <stdio.h>

#include "chainps/error.h"
#include "core/log.h"
#include "core/wire.h"
#include "server.h"

#define SCHED_PEER 0u

void cps__server_reply_error(cps__server *s, const cps__msg_hdr *req, int err, const char *fmt, ...)
{
    char text[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    /* A request of an older epoch is the normal aftermath of a view change (the worker re-sends
     * it under the new one): a burst of them after every move or failover is not a warning. */
    cps__log(err == CPS_ESTALE_EPOCH ? CPS_LOG_DEBUG : CPS_LOG_WARN, "server",
             "request %u:%llu (type %u) from node %u refused: %s: %s", req->req_worker,
             (unsigned long long)req->req_seq, req->type, req->sender, cps_err_name(err), text);
    if (cps__tp_peer_known(s->tp, req->sender))
        cps__msg_reply_error(s->tp, s->id, s->view.epoch, req, err, text);
}

void cps__server_reply_ack(cps__server *s, const cps__msg_hdr *req)
{
    cps__msg_hdr h = {0};
    h.type = CPS_MSG_ACK;
    h.flags = CPS_WF_REPLY;
    h.sender = s->id;
    h.epoch = s->view.epoch;
    h.req_worker = req->req_worker;
    h.req_seq = req->req_seq;
    h.range = req->range;
    h.step = req->step;
    int rc = cps__msg_send(s->tp, req->sender, &h, NULL, 0);
    if (rc != 0)
        cps__log(CPS_LOG_WARN, "server", "ack to node %u failed: %s", req->sender,
                 cps_strerror(rc));
}

void cps__server_ask_view(cps__server *s)
{
    cps__msg_hdr g = {.type = CPS_MSG_GET_VIEW, .sender = s->id, .epoch = s->view.epoch};
    cps__msg_send(s->tp, SCHED_PEER, &g, NULL, 0);
}

uint32_t cps__server_worker_rank(const cps__server *s, uint32_t id)
{
    const cps__node_info *n = cps__view_node(&s->view, id);
    return (n && n->role == CPS_ROLE_WORKER) ? n->rank : UINT32_MAX;
}

uint32_t cps__server_live_workers(const cps__server *s)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->view.nnodes; i++)
        n += s->view.nodes[i].role == CPS_ROLE_WORKER && s->view.nodes[i].alive;
    return n;
}

int cps__server_check_request(cps__server *s, const cps__msg_hdr *h)
{
    if (cps__server_worker_rank(s, h->sender) == UINT32_MAX) {
        /* Unknown node: we cannot even reply. A newer view may name it; ask for one. */
        cps__log(CPS_LOG_WARN, "server", "request type %u from unknown node %u dropped", h->type,
                 h->sender);
        cps__server_ask_view(s);
        s->stats.msgs_bad++;
        return CPS_EUNKNOWN_NODE;
    }
    if (h->epoch < s->view.epoch) {
        cps__server_reply_error(s, h, CPS_ESTALE_EPOCH, "request epoch %llu < view epoch %llu",
                                (unsigned long long)h->epoch, (unsigned long long)s->view.epoch);
        return CPS_ESTALE_EPOCH;
    }
    if (h->epoch > s->view.epoch) {
        /* The worker saw a newer view than we did: catch up, the worker will re-send. */
        cps__server_ask_view(s);
        cps__server_reply_error(s, h, CPS_EAGAIN, "server has not seen epoch %llu yet",
                                (unsigned long long)h->epoch);
        return CPS_EAGAIN;
    }
    if (h->range >= s->view.nranges) {
        cps__server_reply_error(s, h, CPS_EINVAL, "range %u does not exist (%u ranges)", h->range,
                                s->view.nranges);
        return CPS_EINVAL;
    }
    const cps__range *r = &s->view.ranges[h->range];
    uint32_t want = h->type == CPS_MSG_PULL ? r->chain[r->chain_len - 1] : r->chain[0];
    if (r->chain_len == 0 || want != s->id) {
        cps__server_reply_error(s, h, CPS_ESTALE_EPOCH, "this server is not the %s of range %u",
                                h->type == CPS_MSG_PULL ? "tail" : "head", h->range);
        return CPS_ESTALE_EPOCH;
    }
    return 0;
}
