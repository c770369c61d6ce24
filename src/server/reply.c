/* What every part of the server answers and asks with: error replies to a request and asking
 * the scheduler for the view. (Which requests are refused is the replica's decision.) */
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
