/* The worker's shell around the pure ring (replication/collective.h): peers from the view,
 * CPS_MSG_COLL messages in and out, the queue of asynchronous all-reduces. Hooked into client.c
 * at four places (message, view, loop turn, free); everything else lives here. All functions run
 * under the client's lock, from the thread driving its loop. */
#ifndef CPS_WORKER_COLLECTIVE_H
#define CPS_WORKER_COLLECTIVE_H

#include "node/msg.h"
#include "transport/transport.h"

struct cps_client;
typedef struct cps__ar cps__ar;

/* A CPS_MSG_COLL message arrived (rx stays the caller's). */
void cps__ar_on_msg(struct cps_client *c, const cps__rx *rx);
/* A CPS_MSG_COLL message over tcp:// with a key, not yet checked (cps__tp_defer_check): an
 * all-gather chunk that the ring would take now is checked while its values are copied into the
 * ring's buffer (one pass instead of the transport's check and then the ring's copy), and
 * stepped only if authentic; a refused one is dropped (the transport counts and logs it) and the
 * ring waits for the genuine one as for a lost one. Any other message is declined: the transport
 * checks it and it comes to cps__ar_on_msg. */
void cps__ar_on_pending(struct cps_client *c, cps__tp_pending *pm);
/* c->view was replaced: re-form the ring (peers, members, restart). */
void cps__ar_on_view(struct cps_client *c);
/* One loop turn passed: timeouts. */
void cps__ar_tick(struct cps_client *c);
/* Free the shell; outstanding handles fail CPS_ECLOSED... they are owned by their callers, who
 * must not wait on them after cps_close. NULL shell is fine. */
void cps__ar_free(struct cps_client *c);

#endif
