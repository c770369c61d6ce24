/* Which life of a server says HELLO: see incarnation.h. */
#include "incarnation.h"

int cps__incarnation_hello(int started, int alive, uint64_t known_boot, uint64_t hello_boot)
{
    if (!started || !alive)
        return CPS_INC_ADMIT; /* no chain positions to lose: before the job, or after a death */
    if (hello_boot != 0 && hello_boot == known_boot)
        return CPS_INC_SAME;
    /* A different life, or one we cannot tell from a different life (we restarted since it said
     * HELLO and do not know its boot id; or it gave none): it holds no chain state, so it must
     * not keep the positions the life we counted alive held. */
    return CPS_INC_NEW_LIFE;
}
