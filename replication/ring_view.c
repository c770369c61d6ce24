/* The all-reduce ring's membership under a view (ring_view.h). */
#include "replication/ring_view.h"

uint32_t cps__ring_members(const cps__view *v, uint32_t *members, uint32_t cap)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < v->nnodes && n < cap; i++) {
        const cps__node_info *w = &v->nodes[i];
        if (w->role != CPS_ROLE_WORKER || !w->alive || cps__view_superseded(v, w))
            continue;
        uint32_t j = n++;
        while (j > 0) {
            const cps__node_info *p = cps__view_node(v, members[j - 1]);
            if (p->rank < w->rank || (p->rank == w->rank && p->id < w->id))
                break;
            members[j] = members[j - 1];
            j--;
        }
        members[j] = w->id;
    }
    return n;
}

int cps__ring_replacement(const cps__view *v, uint32_t me)
{
    const cps__node_info *self = cps__view_node(v, me);
    if (!self)
        return 0;
    for (uint32_t i = 0; i < v->nnodes; i++) {
        const cps__node_info *w = &v->nodes[i];
        if (w->role == CPS_ROLE_WORKER && w->id != me && w->rank == self->rank &&
            cps__node_supersedes(self, w))
            return 1;
    }
    return 0;
}

int cps__ring_gone(const cps__view *v, const cps__node_info *w, uint32_t me)
{
    return w->role == CPS_ROLE_WORKER && w->id != me && (!w->alive || cps__view_superseded(v, w));
}
