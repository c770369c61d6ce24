/* nanomsg sockets with the options every transport socket carries (see transport_int.h). */

#include "transport/transport_int.h"

#include <errno.h>

#include <nanomsg/nn.h>
#include <nanomsg/pipeline.h>
#include <nanomsg/tcp.h>

#include "chainps/error.h"
#include "core/log.h"
#include "core/wire.h"

#define TP_SOCKBUF          (4 << 20) /* NN_SNDBUF / NN_RCVBUF */
#define TP_LINGER_MS        100
#define TP_RECONNECT_MS     50
#define TP_RECONNECT_MAX_MS 500

/* Log the pending nanomsg error and translate it at the boundary. */
int cps__tp_nn_fail(const char *op, const char *target)
{
    int e = nn_errno();
    cps__log(CPS_LOG_ERROR, SUB, "%s %s: %s", op, target ? target : "", nn_strerror(e));
    return e == EINVAL ? CPS_EINVAL : CPS_ETRANSPORT;
}

int cps__tp_set_opt(int s, int level, int opt, int val, const char *name)
{
    if (nn_setsockopt(s, level, opt, &val, sizeof val) < 0)
        return cps__tp_nn_fail("nn_setsockopt", name);
    return 0;
}

void cps__tp_close_sock(int s)
{
    /* nanomsg documents EINTR from nn_close as "not fully closed yet, call again". */
    while (nn_close(s) < 0 && nn_errno() == EINTR) {
    }
}

/* A socket with our options applied. The receive limit goes on every socket, not only the inbox,
 * because nanomsg's 1 MiB default silently drops bigger messages on whichever side receives. */
int cps__tp_open_sock(int proto, int *out)
{
    int s = nn_socket(AF_SP, proto);
    if (s < 0)
        return cps__tp_nn_fail("nn_socket", proto == NN_PULL ? "PULL" : "PUSH");
    int rc = cps__tp_set_opt(s, NN_SOL_SOCKET, NN_RCVMAXSIZE,
                             CPS_WIRE_HDR_SIZE + CPS_WIRE_MAX_PAYLOAD, "NN_RCVMAXSIZE");
    if (!rc)
        rc = cps__tp_set_opt(s, NN_SOL_SOCKET, NN_SNDBUF, TP_SOCKBUF, "NN_SNDBUF");
    if (!rc)
        rc = cps__tp_set_opt(s, NN_SOL_SOCKET, NN_RCVBUF, TP_SOCKBUF, "NN_RCVBUF");
    if (!rc)
        rc = cps__tp_set_opt(s, NN_SOL_SOCKET, NN_LINGER, TP_LINGER_MS, "NN_LINGER");
    /* Short reconnect intervals: a restarted peer or one whose inbox is not bound yet should be
     * reached within about half a second, well inside a request timeout. */
    if (!rc)
        rc = cps__tp_set_opt(s, NN_SOL_SOCKET, NN_RECONNECT_IVL, TP_RECONNECT_MS,
                             "NN_RECONNECT_IVL");
    if (!rc)
        rc = cps__tp_set_opt(s, NN_SOL_SOCKET, NN_RECONNECT_IVL_MAX, TP_RECONNECT_MAX_MS,
                             "NN_RECONNECT_IVL_MAX");
    /* Requests are small and latency-bound; Nagle would hold them back behind the previous ack. */
    if (!rc)
        rc = cps__tp_set_opt(s, NN_TCP, NN_TCP_NODELAY, 1, "NN_TCP_NODELAY");
    if (rc) {
        cps__tp_close_sock(s);
        return rc;
    }
    *out = s;
    return 0;
}

int cps__tp_get_fd(int s, int opt, int *fd)
{
    size_t sz = sizeof *fd;
    if (nn_getsockopt(s, NN_SOL_SOCKET, opt, fd, &sz) < 0)
        return cps__tp_nn_fail("nn_getsockopt", opt == NN_RCVFD ? "NN_RCVFD" : "NN_SNDFD");
    return 0;
}
