/* What both simulators that run the production coordinator (sim_sched.c, restore_sched.c) read
 * off its output alike. */
#ifndef CPS_SIM_COORD_OUT_H
#define CPS_SIM_COORD_OUT_H

#include <stddef.h>

#include "recovery/coordinator.h"

/* 1 if encoding i of o->views answers a tool (a REPLY action names it: a STATUS or REGISTRY
 * reply), 0 if it is a view the coordinator publishes. */
static inline int sim_co_is_reply(const cps__coord_out *o, size_t i)
{
    for (size_t k = 0; k < o->n; k++)
        if (o->a[k].kind == CPS_CO_REPLY && o->a[k].view == i)
            return 1;
    return 0;
}

#endif
