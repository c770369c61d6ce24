/* What the coordinator answers to tools (`chainps status`, `chainps drain`, the checkpoint
 * tools) and the tensor registry the workers declare: which requests are a tool's, what STATUS
 * and REGISTRY report, what a RELEASE means, and who may declare a tensor. The shell only makes
 * the tool's temporary peer and sends the replies (see coordinator.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "core/log.h"
#include "recovery/coordinator_membership.h"
#include "recovery/coordinator_tools.h"

int cps__coord_tool_request(const cps__msg_hdr *h)
{
    switch (h->type) {
    case CPS_MSG_STATUS:
    case CPS_MSG_REGISTRY:
        return 1;
    case CPS_MSG_DRAIN:
    case CPS_MSG_RELEASE:
        /* A member's (a test's, the simulator's operator) is answered at the member. */
        return h->sender == UINT32_MAX;
    default:
        return 0;
    }
}

void cps__coord_set_wall(cps__coord *c, uint64_t wall_ms)
{
    c->wall_ms = wall_ms;
}

/* A reply to a tool: the view, then `extra` bytes for the caller to fill; aux says whether the
 * job runs. NULL if out of memory (the tool asks again). */
static unsigned char *view_reply(cps__coord *c, size_t extra, size_t *len)
{
    size_t vlen = cps__view_encoded_size(&c->view);
    *len = vlen + extra;
    unsigned char *buf = malloc(*len ? *len : 1);
    if (buf)
        cps__view_encode(&c->view, buf, vlen);
    return buf;
}

static void reply(cps__coord *c, const cps__msg_hdr *req, uint32_t to, uint8_t type,
                  unsigned char *buf, size_t len)
{
    uint32_t p = cps__co_payload(c, buf, len);
    if (p == UINT32_MAX)
        return;
    cps__coord_action *a = cps__co_push(c, CPS_CO_REPLY, to);
    a->view = p;
    a->hdr = (cps__msg_hdr){.type = type,
                            .flags = CPS_WF_REPLY,
                            .sender = CPS_COORD_SELF,
                            .epoch = c->view.epoch,
                            .req_seq = req->req_seq,
                            .aux = (uint64_t)c->started};
}

/* STATUS: the view, u32 count, then per node u32 id, u32 age_ms (since its last message), stats
 * block; then u32 ranges and per range u32 joiner, u32 source (0, 0: no copy under way); then
 * the last checkpoint (absent when there was none; older tools ignore it); then the stranded ranges
 * (CPS_STATUS_STRANDED_TAG, u32 count, per range u32 range, u32 empty server, u32 fallback;
 * absent when none). */
void cps__co_status(cps__coord *c, const cps__msg_hdr *h, uint32_t reply_to, uint64_t now)
{
    if (!reply_to)
        return;
    uint32_t nn = c->nnodes, nranges = c->view.nranges;
    cps__ckpt_note note = c->ckpt;
    size_t len, note_len = note.id ? cps__ckpt_note_size(&note) : 0;
    if (note.id)
        note.age_ms = c->wall_ms > note.unix_ms ? c->wall_ms - note.unix_ms : 0;
    /* Room for every range stranded; the reply is cut to those that are. */
    unsigned char *buf = view_reply(c,
                                    4 + (size_t)nn * (8 + CPS_STATS_SIZE) + 4 +
                                        (size_t)nranges * 8 + note_len + 8 + 12 * (size_t)nranges,
                                    &len);
    if (!buf)
        return;
    unsigned char *p = buf + cps__view_encoded_size(&c->view);
    cps__le32_put(p, nn);
    p += 4;
    for (uint32_t i = 0; i < nn; i++) {
        const cps__coord_node *n = &c->nodes[i];
        uint64_t age = now > n->last_seen_ms ? now - n->last_seen_ms : 0;
        cps__le32_put(p, n->info.id);
        cps__le32_put(p + 4, age > UINT32_MAX ? UINT32_MAX : (uint32_t)age);
        cps__stats_encode(p + 8, &n->stats);
        p += 8 + CPS_STATS_SIZE;
    }
    cps__le32_put(p, nranges);
    p += 4;
    for (uint32_t r = 0; r < nranges; r++, p += 8) {
        uint32_t source = 0, joiner = cps__coord_joiner(c, r, &source);
        cps__le32_put(p, joiner);
        cps__le32_put(p + 4, source);
    }
    if (note_len)
        cps__ckpt_note_encode(p, note_len, &note);
    p += note_len;
    uint32_t nstranded = 0;
    for (uint32_t r = 0; r < nranges; r++) {
        uint32_t fallback, id = cps__coord_stranded(c, r, &fallback, NULL);
        if (!id)
            continue;
        unsigned char *e = p + 8 + 12 * (size_t)nstranded++;
        cps__le32_put(e, r);
        cps__le32_put(e + 4, id);
        cps__le32_put(e + 8, fallback);
    }
    if (nstranded) { /* absent when none */
        cps__le32_put(p, CPS_STATUS_STRANDED_TAG);
        cps__le32_put(p + 4, nstranded);
        p += 8 + 12 * (size_t)nstranded;
    }
    reply(c, h, reply_to, CPS_MSG_STATUS_REPLY, buf, (size_t)(p - buf));
}

/* REGISTRY: the view, then (8-byte aligned) u32 count, u32 0, and the descriptions. */
void cps__co_registry(cps__coord *c, const cps__msg_hdr *h, uint32_t reply_to)
{
    if (!reply_to)
        return;
    size_t len, vlen = cps__view_encoded_size(&c->view);
    unsigned char *buf = view_reply(c, 8 + c->reg.len, &len);
    if (!buf)
        return;
    memset(buf + vlen, 0, 8);
    cps__le32_put(buf + vlen, c->reg.count);
    if (c->reg.len)
        memcpy(buf + vlen + 8, c->reg.reg, c->reg.len);
    reply(c, h, reply_to, CPS_MSG_REGISTRY, buf, len);
}

/* REGISTER from a member: only a worker declares tensors. A name declared again with another
 * shape or optimizer is refused (a checkpoint could not name its keys), as is a malformed one. */
void cps__co_register(cps__coord *c, const cps__coord_node *n, const cps__msg_hdr *h,
                      const void *pl, size_t len)
{
    char text[CPS_TENSOR_NAME_MAX + 64] = "", name[CPS_TENSOR_NAME_MAX + 1] = "";
    int rc = n->info.role == CPS_ROLE_WORKER
                 ? cps__registry_add(&c->reg, pl, len, text, sizeof text, name, sizeof name)
                 : CPS_EPROTO;
    if (rc == 1) {
        cps__co_log(c, CPS_LOG_INFO, "%s", text);
        c->out.persist |= CPS_CO_P_REGISTRY;
        rc = 0;
    }
    if (rc == CPS_EEXIST) {
        cps__co_log(c, CPS_LOG_ERROR,
                    "worker %u declared tensor %s with another shape or optimizer than before",
                    h->sender, name);
        cps__co_reply_error(c, h, h->sender, rc, text);
    } else if (rc != 0) {
        cps__co_log(c, CPS_LOG_WARN, "tensor registration from node %u dropped: %s", h->sender,
                    cps_strerror(rc));
        cps__co_reply_error(c, h, h->sender, rc, text[0] ? text : "malformed tensor description");
    } else {
        cps__co_send_simple(c, h->sender, CPS_MSG_REGISTER, h);
    }
}

/* RELEASE: a restore is complete; the held workers are let in. Acknowledged to a tool (a repeat
 * too): the restore tool sends RELEASE until it hears this, as a message sent just before its
 * transport closes can be lost. */
void cps__co_release(cps__coord *c, const cps__msg_hdr *h, uint32_t reply_to)
{
    if (c->cfg.hold_workers) {
        c->cfg.hold_workers = 0;
        cps__co_log(c, CPS_LOG_INFO, "checkpoint restored: admitting the workers");
        int settled = cps__co_workers_settled(c);
        for (uint32_t i = 0; i < c->nnodes; i++)
            if (c->nodes[i].info.role == CPS_ROLE_WORKER && c->started)
                cps__co_send_view(c, c->nodes[i].info.id, CPS_MSG_WELCOME, settled);
    }
    if (reply_to && reply_to != h->sender) {
        cps__coord_action *a = cps__co_push(c, CPS_CO_MSG, reply_to);
        a->hdr = (cps__msg_hdr){.type = CPS_MSG_RELEASE,
                                .flags = CPS_WF_REPLY,
                                .sender = CPS_COORD_SELF,
                                .epoch = c->view.epoch,
                                .req_seq = h->req_seq};
    }
}

int cps__co_registry_load(cps__coord *c, cps__coord_get_fn get, void *ctx)
{
    const void *b;
    size_t len;
    if (get(ctx, "sched/registry", &b, &len) != 0)
        return 0; /* none saved (or unreadable): workers declare their tensors again */
    return cps__registry_load(&c->reg, b, len);
}

unsigned char *cps__coord_registry_blob(const cps__coord *c, size_t *len)
{
    return cps__registry_blob(&c->reg, len);
}

cps__coord_summary cps__coord_summarize(const cps__coord *c)
{
    cps__coord_summary m = {.running = c->started && !c->finished};
    for (uint32_t i = 0; i < c->nnodes; i++) {
        const cps__coord_node *n = &c->nodes[i];
        m.draining += n->draining != 0;
        if (n->info.role == CPS_ROLE_SERVER) {
            m.live_servers += n->info.alive != 0;
            m.push_raw_bytes += n->stats.push_raw_bytes;
            m.push_wire_bytes += n->stats.push_wire_bytes;
            m.pull_bytes += n->stats.pull_bytes;
            m.updates_applied += n->stats.updates_applied;
            m.step = n->stats.step > m.step ? n->stats.step : m.step;
        } else if (n->info.role == CPS_ROLE_WORKER) {
            m.live_workers += n->info.alive && !n->done;
        }
    }
    for (uint32_t r = 0; r < c->view.nranges; r++)
        m.stranded += cps__coord_stranded(c, r, NULL, NULL) != 0;
    return m;
}

int cps__coord_shows_clock(const cps__coord *c, uint32_t i)
{
    const cps__coord_node *n = i < c->nnodes ? &c->nodes[i] : NULL;
    return n && n->info.role == CPS_ROLE_WORKER && (n->info.alive || n->done);
}
