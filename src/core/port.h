/* A TCP port free on loopback right now, for `chainps launch` (its scheduler's port), the tests'
 * clusters and the benchmarks: one picker, so they all pick the same way. */
#ifndef CPS_CORE_PORT_H
#define CPS_CORE_PORT_H

/* Binds port 0 on 127.0.0.1, reads the port the kernel gave, closes. Another process may take it
 * before the caller binds it: callers that must not fail retry with a new one. -1 on error. */
int cps__free_port(void);

#endif
