#include "view_change.h"

#include "chainps/error.h"

int cps__view_range_available(const cps__view *v, uint32_t r)
{
    const cps__range *rg = &v->ranges[r];
    for (uint32_t j = 0; j < rg->chain_len; j++) {
        const cps__node_info *n = cps__view_node(v, rg->chain[j]);
        if (n && n->alive)
            return 1;
    }
    return 0;
}

int cps__view_without(const cps__view *in, uint32_t node, cps__view *out, uint32_t *lost_ranges)
{
    if (!cps__view_node(in, node))
        return CPS_ENOTFOUND;
    int rc = cps__view_copy(out, in);
    if (rc != 0)
        return rc;
    out->epoch = in->epoch + 1;
    for (uint32_t i = 0; i < out->nnodes; i++)
        if (out->nodes[i].id == node)
            out->nodes[i].alive = 0;
    uint32_t lost = 0;
    for (uint32_t r = 0; r < out->nranges; r++) {
        cps__range *rg = &out->ranges[r];
        uint32_t k = 0;
        for (uint32_t j = 0; j < rg->chain_len; j++)
            if (rg->chain[j] != node)
                rg->chain[k++] = rg->chain[j];
        if (k == 0)
            k = 1; /* it was the only replica: keep it, the range waits for it to return */
        else
            rg->chain_len = k;
        lost += !cps__view_range_available(out, r);
    }
    if (lost_ranges)
        *lost_ranges = lost;
    return 0;
}
