/* The /metrics endpoint of a scheduler or server (`--metrics-port`): Prometheus text format
 * (core/prom.h) over HTTP, served by Debian's libmicrohttpd from a thread of its own.
 *
 * Race-free by construction: the role's event loop owns every counter, and hands this module a
 * finished page (cps__metrics_publish) a few times a second; the HTTP thread only copies the
 * last published page, under a mutex, into its response. So a scrape never reads the role's
 * state, and a slow or hostile client never blocks the event loop (the loop waits at most for
 * one memcpy of the page).
 *
 * GET (or HEAD) /metrics: 200 with the page (CPS_PROM_CONTENT_TYPE). Any other method: 405;
 * any other path: 404. A request libmicrohttpd cannot parse gets its 400 (505 for an unknown
 * HTTP version), or, when not even a request line can be read from it, the connection is
 * closed; either way the endpoint keeps serving. At most 16 connections at a time, each closed
 * after 10 s idle, so clients that connect and say nothing cannot pile up.
 */
#ifndef CPS_NODE_METRICS_H
#define CPS_NODE_METRICS_H

#include <stddef.h>
#include <stdint.h>

typedef struct cps__metrics cps__metrics;

/* Listen on bind_addr:port (an IPv4 address; NULL or "": 127.0.0.1, since metrics name the
 * job's nodes and should not reach every network by default) and serve until stopped. Until
 * the first publish the page is empty. `who` names the role in the log.
 * Errors: CPS_EINVAL (port 0, out NULL), CPS_ECONFIG (not an IPv4 address), CPS_ETRANSPORT
 * (cannot listen: the port is taken, the address is not local; logged), CPS_ENOMEM. */
int cps__metrics_start(const char *bind_addr, uint16_t port, const char *who, cps__metrics **out);

/* Replace the page served with a copy of text[0..len). Called from the role's thread. A copy
 * that cannot be allocated keeps the previous page (and returns CPS_ENOMEM). NULL m: no-op. */
int cps__metrics_publish(cps__metrics *m, const char *text, size_t len);

/* Publish a rendered page (core/prom.h): when rendering failed (cps__prom_status), or the copy
 * cannot be made, the previous page stays and a warning names `who`. */
struct cps__prom;
void cps__metrics_publish_page(cps__metrics *m, const struct cps__prom *page, const char *who);

/* Stop serving (waits for the HTTP thread) and free. NULL is a no-op. */
void cps__metrics_stop(cps__metrics *m);

#endif
