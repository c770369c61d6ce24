#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "chainps/error.h"
#include "core/log.h"
#include "roles.h"

static int is_loopback(const char *host)
{
    return strcmp(host, "localhost") == 0 || strncmp(host, "127.", 4) == 0;
}

/* The local address the kernel routes toward `host`; connecting a UDP socket sends no packet. */
static int local_addr_toward(const char *host, uint16_t port, char *out, size_t len)
{
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_DGRAM}, *res = NULL;
    char portstr[8];
    snprintf(portstr, sizeof portstr, "%u", port ? port : 9);
    if (getaddrinfo(host, portstr, &hints, &res) != 0 || !res)
        return -1;
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    int rc = -1;
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
        struct sockaddr_in a;
        socklen_t alen = sizeof a;
        if (getsockname(fd, (struct sockaddr *)&a, &alen) == 0 &&
            inet_ntop(AF_INET, &a.sin_addr, out, (socklen_t)len))
            rc = 0;
    }
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
    return rc;
}

/* `host` as a dotted IPv4 address (resolved if it is a name) into out; -1 if it resolves to
 * none. */
static int numeric_ipv4(const char *host, char *out, size_t len)
{
    if (strcmp(host, "localhost") == 0) {
        snprintf(out, len, "127.0.0.1");
        return 0;
    }
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res)
        return -1;
    const struct sockaddr_in *a = (const struct sockaddr_in *)res->ai_addr;
    int rc = inet_ntop(AF_INET, &a->sin_addr, out, (socklen_t)len) ? 0 : -1;
    freeaddrinfo(res);
    return rc;
}

void cps__config_finalize(cps__config *cfg, int role)
{
    int advertise_given = cfg->advertise_host[0] != 0;
    if (!advertise_given) {
        if (is_loopback(cfg->sched_host) ||
            local_addr_toward(cfg->sched_host, cfg->sched_port, cfg->advertise_host,
                              sizeof cfg->advertise_host) != 0) {
            if (!is_loopback(cfg->sched_host))
                cps__log(CPS_LOG_WARN, "config",
                         "cannot tell which local address faces %s; "
                         "advertising 127.0.0.1 (set CHAINPS_ADVERTISE)",
                         cfg->sched_host);
            snprintf(cfg->advertise_host, sizeof cfg->advertise_host, "127.0.0.1");
        }
    }
    if (!cfg->bind_host[0]) {
        /* Listen only where we are reached: the scheduler at the address the job names it by
         * (unless it advertises another), every other node at the one it advertises. Every
         * interface (0.0.0.0) only when --bind says so. nanomsg binds addresses, not names. */
        const char *host =
            role == CPS_ROLE_SCHEDULER && !advertise_given ? cfg->sched_host : cfg->advertise_host;
        if (numeric_ipv4(host, cfg->bind_host, sizeof cfg->bind_host) != 0)
            snprintf(cfg->bind_host, sizeof cfg->bind_host, "%s", host);
    }
    if (role == CPS_ROLE_SCHEDULER)
        cfg->port = cfg->sched_port;
}

int cps__make_url(char out[CPS_ADDR_MAX], const char *host, uint16_t port)
{
    int n = snprintf(out, CPS_ADDR_MAX, "tcp://%.*s:%u", CPS_ADDR_MAX - 16, host, port);
    if (n < 0 || n >= CPS_ADDR_MAX || strlen(host) > CPS_ADDR_MAX - 16) {
        cps__log(CPS_LOG_ERROR, "config", "host name too long: %.40s...", host);
        return CPS_ECONFIG;
    }
    return 0;
}
