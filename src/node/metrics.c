/* The /metrics endpoint (metrics.h) on libmicrohttpd's internal polling thread. */
#include "node/metrics.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "core/log.h"
#include "core/prom.h"

#define METRICS_MAX_CONNECTIONS 16
#define METRICS_IDLE_TIMEOUT_S  10

struct cps__metrics {
    struct MHD_Daemon *daemon;
    pthread_mutex_t lock; /* guards page/len: written by the role, read by the HTTP thread */
    char *page;
    size_t len;
};

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *type,
                             void *body, size_t len, enum MHD_ResponseMemoryMode mode)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
    if (!r) {
        if (mode == MHD_RESPMEM_MUST_FREE)
            free(body);
        return MHD_NO; /* MHD closes the connection */
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **state)
{
    (void)version, (void)upload_data;
    cps__metrics *m = cls;
    /* The first call for a request comes when its headers are in; answering right then would
     * leave a body (a POST's) unread, so mark the request and answer on the next call. */
    static int seen;
    if (*state == NULL) {
        *state = &seen;
        return MHD_YES;
    }
    if (*upload_data_size) {
        *upload_data_size = 0; /* a body is read and ignored */
        return MHD_YES;
    }
    static char not_found[] = "not found: the metrics are at /metrics\n";
    static char not_allowed[] = "method not allowed: GET /metrics\n";
    int get = !strcmp(method, MHD_HTTP_METHOD_GET) || !strcmp(method, MHD_HTTP_METHOD_HEAD);
    if (!get)
        return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain", not_allowed,
                     sizeof not_allowed - 1, MHD_RESPMEM_PERSISTENT);
    if (strcmp(url, "/metrics") != 0)
        return reply(c, MHD_HTTP_NOT_FOUND, "text/plain", not_found, sizeof not_found - 1,
                     MHD_RESPMEM_PERSISTENT);
    /* A copy of the page, so the role may publish the next one while this one is sent. */
    pthread_mutex_lock(&m->lock);
    size_t len = m->len;
    char *body = malloc(len ? len : 1);
    if (body && len)
        memcpy(body, m->page, len);
    pthread_mutex_unlock(&m->lock);
    if (!body)
        return MHD_NO;
    return reply(c, MHD_HTTP_OK, CPS_PROM_CONTENT_TYPE, body, len, MHD_RESPMEM_MUST_FREE);
}

int cps__metrics_start(const char *bind_addr, uint16_t port, const char *who, cps__metrics **out)
{
    if (!out || port == 0)
        return CPS_EINVAL;
    *out = NULL;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    const char *host = bind_addr && *bind_addr ? bind_addr : "127.0.0.1";
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        cps__log(CPS_LOG_ERROR, who, "--metrics-bind %s: not an IPv4 address", host);
        return CPS_ECONFIG;
    }
    cps__metrics *m = calloc(1, sizeof *m);
    if (!m)
        return CPS_ENOMEM;
    pthread_mutex_init(&m->lock, NULL);
    /* One internal thread polls every connection: scrapes are rare and small, and the role's
     * own thread never runs HTTP code. */
    m->daemon = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL, port, NULL, NULL,
                                 on_request, m, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                                 MHD_OPTION_CONNECTION_LIMIT, (unsigned)METRICS_MAX_CONNECTIONS,
                                 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)METRICS_IDLE_TIMEOUT_S,
                                 MHD_OPTION_END);
    if (!m->daemon) {
        cps__log(CPS_LOG_ERROR, who,
                 "cannot serve metrics on http://%s:%u/metrics (port in use, or not a local "
                 "address?)",
                 host, port);
        pthread_mutex_destroy(&m->lock);
        free(m);
        return CPS_ETRANSPORT;
    }
    cps__log(CPS_LOG_INFO, who, "metrics at http://%s:%u/metrics", host, port);
    *out = m;
    return 0;
}

int cps__metrics_publish(cps__metrics *m, const char *text, size_t len)
{
    if (!m)
        return 0;
    char *copy = malloc(len ? len : 1);
    if (!copy)
        return CPS_ENOMEM;
    memcpy(copy, text, len);
    pthread_mutex_lock(&m->lock);
    char *old = m->page;
    m->page = copy;
    m->len = len;
    pthread_mutex_unlock(&m->lock);
    free(old);
    return 0;
}

void cps__metrics_publish_page(cps__metrics *m, const struct cps__prom *page, const char *who)
{
    int rc = cps__prom_status(page);
    if (rc == 0)
        rc = cps__metrics_publish(m, page->buf, page->len);
    if (rc != 0)
        cps__log(CPS_LOG_WARN, who, "metrics page not updated: %s", cps_strerror(rc));
}

void cps__metrics_stop(cps__metrics *m)
{
    if (!m)
        return;
    MHD_stop_daemon(m->daemon);
    pthread_mutex_destroy(&m->lock);
    free(m->page);
    free(m);
}
