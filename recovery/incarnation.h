/* Which incarnation of a server says HELLO, as the scheduler must judge it: a pure decision.
 *
 * A server says HELLO only while it holds no chain state: a process just started, or one that a
 * view declared dead and that dropped its chains to rejoin as a fresh replica (recovery/fence.h).
 * Each such life has its own boot id (the HELLO's aux, never 0). A fresh chain state machine
 * takes what its store holds as committed and has no unacknowledged FWDs in memory
 * (replication/chain_state.c, cps__chain_load_range), so it must never be handed the chain
 * positions an earlier life of the same server held: the updates that life had applied but not
 * yet seen acknowledged downstream would never reach its successor, which then drops every later
 * FWD as a gap; and its acks to its predecessor would cover updates the tail never got. Only the
 * life the scheduler let in may hold them; any other life of a server counted alive is a death
 * (out of every chain, as for any failure) and then a server coming back (in no chain; state
 * transfer gives it ranges).
 *
 * The scheduler keeps the boot id of the life it let in, and keeps it across its own restarts
 * (src/scheduler/scheduler.c persists it with the view). When it does not know it (a data
 * directory written before it was persisted), a HELLO of a server counted alive is taken for a
 * new life: wrongly so only for a HELLO the welcomed life repeated before our WELCOME reached it,
 * which costs a state transfer; the other mistake stalled a chain for good (issue 26, chaos seed
 * 11 on fmnist: a scheduler restart, then a server restart, taken for "a node moved").
 *
 * Pure: no I/O, no clock. */
#ifndef CPS_RECOVERY_INCARNATION_H
#define CPS_RECOVERY_INCARNATION_H

#include <stdint.h>

enum {
    CPS_INC_ADMIT = 0,   /* not started yet, or counted dead: let it in as it is (a revival) */
    CPS_INC_SAME = 1,    /* the life we let in repeats its HELLO: welcome it again, nothing else */
    CPS_INC_NEW_LIFE = 2 /* another life of a server counted alive: declare it dead, then admit */
};

/* A server's HELLO with boot id `hello_boot` (0: none given). `started`: the job runs (chains
 * exist); `alive`: the view counts this server alive; `known_boot`: the boot id of the life the
 * scheduler let in (0: unknown). A CPS_INC_* verdict. */
int cps__incarnation_hello(int started, int alive, uint64_t known_boot, uint64_t hello_boot);

#endif
