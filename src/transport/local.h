/* Same-host channels: which peers share our host and how their ipc:// sockets are named.
 *
 * Two processes of a job talk over an ipc:// socket (a Unix socket) instead of TCP when they run
 * under one kernel (the same boot id) and in one network namespace, and the job has a private
 * runtime directory (CHAINPS_RUNTIME_DIR: mode 0700, owned by the job's user, made by
 * `chainps launch` or named by the batch scheduler). Every node binds, beside its tcp:// inbox,
 * an ipc:// inbox in that directory whose file name is a hash of its host identity and its tcp://
 * address; a sender that is given a peer's tcp:// address computes the same name under its own
 * host identity, and finds the file only if the peer shares its kernel, namespace and
 * directory. So the address book stays the one of tcp:// addresses, and a namespace or a host
 * apart never matches.
 *
 * The trust boundary of such a socket is the directory's: only the job's user (and root) can
 * reach it, as only they can read the secret file (0600). So its messages carry no MAC. The
 * directory is checked when the inbox is bound and when a peer is connected: a directory that is
 * a symbolic link, not owned by the effective user, or open to group or others is refused.
 */
#ifndef CPS_TRANSPORT_LOCAL_H
#define CPS_TRANSPORT_LOCAL_H

#include <stddef.h>
#include <stdint.h>

/* This process's host identity ("boot id/network namespace") into out[cap]. Returns 0, or
 * CPS_ENOTFOUND when the platform does not say (no /proc): no ipc then. */
int cps__tp_local_host_id(char *out, size_t cap);

/* Check that `dir` is a directory (not a link to one), owned by geteuid() and with no permission
 * bit for group or others. Returns 0, or CPS_ECONFIG with the reason in err. */
int cps__tp_local_dir_check(const char *dir, char *err, size_t errlen);

/* The 64-bit name of the node whose inbox is `tcp_url` on host `host_id`: its socket file's and
 * (transport/ring.h) its ring's. */
uint64_t cps__tp_local_name(const char *host_id, const char *tcp_url);

/* The ipc socket file of the node whose inbox is `tcp_url` on host `host_id`, in `dir`, into
 * out[cap]. Returns 0, or CPS_EINVAL when it does not fit (a Unix socket path is short). */
int cps__tp_local_path(const char *dir, const char *host_id, const char *tcp_url, char *out,
                       size_t cap);

#endif
