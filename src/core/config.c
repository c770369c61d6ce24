/* Node configuration: defaults, environment overlay, parse helpers (see config.h).
 *
 * Jobs launched by ps-lite (DMLC_*) or MindSpore (MS_*) tooling should run unchanged, so each
 * setting is read from every alias in its row. When two aliases are both set they must agree
 * (compared after parsing, so DMLC_ROLE=server and MS_ROLE=MS_PSERVER agree); a disagreement is an
 * error naming both variables, because silently preferring one hides a launch-script bug that
 * otherwise shows up as a node joining with the wrong role or the wrong scheduler.
 *
 * An empty variable counts as unset: `export CHAINPS_ROLE=` is how shells clear a value.
 */
#include "core/config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "core/log.h"

#define SSP_BOUND_MAX  1000000u
#define TIMEOUT_MS_MAX 86400000u /* a day; anything longer is a typo */
#define DATA_DIR_MAX   sizeof(((cps__config *)0)->data_dir)

static int fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return CPS_ECONFIG;
}

void cps__config_defaults(cps__config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->role = CPS_ROLE_NONE;
    snprintf(cfg->sched_host, sizeof cfg->sched_host, "127.0.0.1");
    cfg->sched_port = 9091;
    snprintf(cfg->data_dir, sizeof cfg->data_dir, "./chainps-data");
    cfg->mode = CPS_MODE_SYNC;
    cfg->rank = UINT32_MAX;
    /* bind_host, advertise_host empty and port 0 mean "decide at startup": the right values
     * depend on the role and on which interface faces the scheduler, which only the node
     * process can find out. */
    cfg->join_timeout_ms = 60000;
    cfg->request_timeout_ms = 5000;
    /* Loopback defaults: a kill is noticed within ~0.4 s. Across a data center, where a GC
     * pause or a busy NIC can silence a node for a second, raise both (e.g. 1000 / 5000). */
    cfg->heartbeat_ms = 100;
    cfg->dead_after_ms = 2000;
    cfg->worker_dead_after_ms = 5000;
    cfg->unavailable_timeout_ms = 30000;
    /* Far above a scheduler restart (launch brings one back in ~1 s, an operator or an
     * orchestrator in well under a minute; servers must serve through it), yet a server of a
     * job whose scheduler is gone for good does not linger for ever holding its data dir. */
    cfg->scheduler_timeout_ms = 300000;
    /* A declaration is refused on the worker above this, naming the tensor: a typo of a few
     * orders of magnitude (2^40 values) otherwise spent minutes laying out millions of chunks
     * and then made every server try to initialise terabytes. 64 GiB of values is past any
     * one tensor this project's jobs hold, and a job that means it raises the limit. */
    cfg->max_tensor_mb = 65536;
    cfg->compress = 1;
}

/* ---- parse helpers ---- */

int cps__config_parse_u32(const char *what, const char *s, uint32_t min, uint32_t max,
                          uint32_t *out, char *err, size_t errlen)
{
    /* strtoul would accept leading blanks, a sign and "0x"; a config value is plain decimal. */
    if (!s || !*s)
        return fail(err, errlen, "%s: empty value, expected a number", what);
    uint64_t v = 0;
    for (const char *c = s; *c; c++) {
        if (*c < '0' || *c > '9')
            return fail(err, errlen, "%s: '%s' is not a number", what, s);
        v = v * 10 + (uint64_t)(*c - '0');
        if (v > UINT32_MAX)
            return fail(err, errlen, "%s: %s is out of range %u..%u", what, s, min, max);
    }
    if (v < min || v > max)
        return fail(err, errlen, "%s: %s is out of range %u..%u", what, s, min, max);
    *out = (uint32_t)v;
    return 0;
}

/* Host names and IPv4 literals only: an address ends up inside "tcp://host:port", where a bare
 * IPv6 literal would be ambiguous. */
static int check_host(const char *what, const char *host, size_t len, char *err, size_t errlen)
{
    if (len == 0)
        return fail(err, errlen, "%s: missing host", what);
    if (len >= CPS_ADDR_MAX)
        return fail(err, errlen, "%s: host longer than %d characters", what, CPS_ADDR_MAX - 1);
    for (size_t i = 0; i < len; i++) {
        char c = host[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '-' || c == '_' || c == '*';
        if (!ok)
            return fail(err, errlen, "%s: host '%.*s' contains '%c'", what, (int)len, host, c);
    }
    return 0;
}

int cps__config_parse_hostport(const char *what, const char *s, char host[CPS_ADDR_MAX],
                               uint16_t *port, char *err, size_t errlen)
{
    if (!s || !*s)
        return fail(err, errlen, "%s: empty value, expected host:port", what);
    const char *colon = strrchr(s, ':');
    if (!colon)
        return fail(err, errlen, "%s: '%s' has no port, expected host:port", what, s);
    int rc = check_host(what, s, (size_t)(colon - s), err, errlen);
    if (rc)
        return rc;
    uint32_t p;
    rc = cps__config_parse_u32(what, colon + 1, 1, 65535, &p, err, errlen);
    if (rc)
        return rc;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    *port = (uint16_t)p;
    return 0;
}

int cps__config_parse_mode(const char *what, const char *s, uint32_t *mode, uint32_t *bound,
                           char *err, size_t errlen)
{
    if (s && strcmp(s, "sync") == 0) {
        *mode = CPS_MODE_SYNC;
        *bound = 0;
        return 0;
    }
    if (s && strcmp(s, "async") == 0) {
        *mode = CPS_MODE_ASYNC;
        *bound = 0;
        return 0;
    }
    if (s && strncmp(s, "ssp:", 4) == 0) {
        uint32_t b;
        if (cps__config_parse_u32(what, s + 4, 0, SSP_BOUND_MAX, &b, NULL, 0))
            return fail(err, errlen, "%s: '%s' needs a staleness bound, ssp:N with N in 0..%u",
                        what, s, SSP_BOUND_MAX);
        *mode = CPS_MODE_SSP;
        *bound = b;
        return 0;
    }
    return fail(err, errlen, "%s: '%s' is not a mode (sync, async or ssp:N)", what, s ? s : "");
}

int cps__config_parse_backup(const char *what, const char *s, uint32_t *out, char *err,
                             size_t errlen)
{
    uint32_t b;
    if (cps__config_parse_u32(what, s, 0, CPS_MAX_NODES - 1, &b, NULL, 0) != 0)
        return fail(err, errlen,
                    "%s: '%s' is not a number of backup workers (0..%u, below the workers)", what,
                    s ? s : "", CPS_MAX_NODES - 1);
    *out = b;
    return 0;
}

int cps__config_check_backup(const cps__config *cfg, char *err, size_t errlen)
{
    char mode[32];
    if (cfg->backup_workers == 0)
        return 0;
    if (cfg->mode != CPS_MODE_SYNC)
        snprintf(err, errlen,
                 "--backup-workers (CHAINPS_BACKUP_WORKERS) %u needs --mode sync, not %s",
                 cfg->backup_workers,
                 cps__config_mode_str(cfg->mode, cfg->ssp_bound, mode, sizeof mode));
    else if (cfg->num_workers && cfg->backup_workers >= cfg->num_workers)
        snprintf(err, errlen,
                 "--backup-workers (CHAINPS_BACKUP_WORKERS) %u must be below the %u workers: a "
                 "step needs at least one gradient",
                 cfg->backup_workers, cfg->num_workers);
    else
        return 0;
    return CPS_EINVAL;
}

int cps__config_parse_role(const char *what, const char *s, int *role, char *err, size_t errlen)
{
    static const struct {
        const char *name;
        int role;
    } names[] = {
        {"scheduler", CPS_ROLE_SCHEDULER}, {"server", CPS_ROLE_SERVER},
        {"worker", CPS_ROLE_WORKER},       {"MS_SCHED", CPS_ROLE_SCHEDULER},
        {"MS_PSERVER", CPS_ROLE_SERVER},   {"MS_WORKER", CPS_ROLE_WORKER},
    };
    for (size_t i = 0; s && i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(s, names[i].name) == 0) {
            *role = names[i].role;
            return 0;
        }
    }
    return fail(err, errlen, "%s: '%s' is not a role (scheduler, server or worker)", what,
                s ? s : "");
}

const char *cps__config_mode_str(uint32_t mode, uint32_t bound, char *buf, size_t len)
{
    switch (mode) {
    case CPS_MODE_SYNC:
        snprintf(buf, len, "sync");
        break;
    case CPS_MODE_ASYNC:
        snprintf(buf, len, "async");
        break;
    case CPS_MODE_SSP:
        snprintf(buf, len, "ssp:%u", bound);
        break;
    default:
        snprintf(buf, len, "mode?%u", mode);
        break;
    }
    return buf;
}

const char *cps__config_role_str(int role)
{
    switch (role) {
    case CPS_ROLE_SCHEDULER:
        return "scheduler";
    case CPS_ROLE_SERVER:
        return "server";
    case CPS_ROLE_WORKER:
        return "worker";
    default:
        return "none";
    }
}

/* ---- environment ---- */

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* One setting as read from one alias (or alias pair), kept to report a conflict. */
typedef struct found {
    const char *name; /* variable(s), e.g. "DMLC_PS_ROOT_URI+DMLC_PS_ROOT_PORT"; NULL if unset */
    char text[CPS_ADDR_MAX + 16];
} found;

static int conflict(const found *first, const char *name, const char *text, char *err,
                    size_t errlen)
{
    return fail(err, errlen, "%s=%s conflicts with %s=%s", first->name, first->text, name, text);
}

/* Row of numeric aliases; *set tells whether any was present. */
static int env_u32(const char *const *names, uint32_t min, uint32_t max, uint32_t *out, int *set,
                   char *err, size_t errlen)
{
    found f = {0};
    uint32_t val = 0;
    for (const char *const *n = names; *n; n++) {
        const char *s = env(*n);
        if (!s)
            continue;
        uint32_t v;
        int rc = cps__config_parse_u32(*n, s, min, max, &v, err, errlen);
        if (rc)
            return rc;
        if (f.name && v != val)
            return conflict(&f, *n, s, err, errlen);
        if (!f.name) {
            f.name = *n;
            snprintf(f.text, sizeof f.text, "%s", s);
            val = v;
        }
    }
    if (f.name)
        *out = val;
    if (set)
        *set = f.name != NULL;
    return 0;
}

static int env_role(cps__config *cfg, char *err, size_t errlen)
{
    static const char *const names[] = {"CHAINPS_ROLE", "DMLC_ROLE", "MS_ROLE", NULL};
    found f = {0};
    int role = CPS_ROLE_NONE;
    for (const char *const *n = names; *n; n++) {
        const char *s = env(*n);
        if (!s)
            continue;
        int r = CPS_ROLE_NONE;
        int rc = cps__config_parse_role(*n, s, &r, err, errlen);
        if (rc)
            return rc;
        if (f.name && r != role)
            return conflict(&f, *n, s, err, errlen);
        if (!f.name) {
            f.name = *n;
            snprintf(f.text, sizeof f.text, "%s", s);
            role = r;
        }
    }
    if (f.name)
        cfg->role = role;
    return 0;
}

/* A host and a port given as two variables: both or neither. */
static int env_host_port_pair(const char *hname, const char *pname, char *host, uint16_t *port,
                              int *set, char *err, size_t errlen)
{
    const char *h = env(hname), *p = env(pname);
    *set = 0;
    if (!h && !p)
        return 0;
    if (!p)
        return fail(err, errlen, "%s is set but %s is not", hname, pname);
    if (!h)
        return fail(err, errlen, "%s is set but %s is not", pname, hname);
    int rc = check_host(hname, h, strlen(h), err, errlen);
    if (rc)
        return rc;
    uint32_t v;
    rc = cps__config_parse_u32(pname, p, 1, 65535, &v, err, errlen);
    if (rc)
        return rc;
    snprintf(host, CPS_ADDR_MAX, "%s", h);
    *port = (uint16_t)v;
    *set = 1;
    return 0;
}

static int env_scheduler(cps__config *cfg, char *err, size_t errlen)
{
    struct {
        const char *label;
        char host[CPS_ADDR_MAX];
        uint16_t port;
        int set;
    } src[3] = {{.label = "CHAINPS_SCHEDULER"},
                {.label = "DMLC_PS_ROOT_URI+DMLC_PS_ROOT_PORT"},
                {.label = "MS_SCHED_HOST+MS_SCHED_PORT"}};
    const char *s = env("CHAINPS_SCHEDULER");
    if (s) {
        int rc = cps__config_parse_hostport("CHAINPS_SCHEDULER", s, src[0].host, &src[0].port, err,
                                            errlen);
        if (rc)
            return rc;
        src[0].set = 1;
    }
    int rc = env_host_port_pair("DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", src[1].host, &src[1].port,
                                &src[1].set, err, errlen);
    if (!rc)
        rc = env_host_port_pair("MS_SCHED_HOST", "MS_SCHED_PORT", src[2].host, &src[2].port,
                                &src[2].set, err, errlen);
    if (rc)
        return rc;
    int first = -1;
    for (int i = 0; i < 3; i++) {
        if (!src[i].set)
            continue;
        if (first < 0) {
            first = i;
        } else if (strcmp(src[i].host, src[first].host) != 0 || src[i].port != src[first].port) {
            return fail(err, errlen, "%s=%s:%u conflicts with %s=%s:%u", src[first].label,
                        src[first].host, src[first].port, src[i].label, src[i].host, src[i].port);
        }
    }
    if (first >= 0) {
        snprintf(cfg->sched_host, sizeof cfg->sched_host, "%s", src[first].host);
        cfg->sched_port = src[first].port;
    }
    return 0;
}

static int env_host_row(const char *const *names, char *dst, char *err, size_t errlen)
{
    found f = {0};
    const char *val = NULL;
    for (const char *const *n = names; *n; n++) {
        const char *s = env(*n);
        if (!s)
            continue;
        int rc = check_host(*n, s, strlen(s), err, errlen);
        if (rc)
            return rc;
        if (f.name && strcmp(s, val) != 0)
            return conflict(&f, *n, s, err, errlen);
        if (!f.name) {
            f.name = *n;
            snprintf(f.text, sizeof f.text, "%s", s);
            val = s;
        }
    }
    if (val) /* check_host() bounded its length */
        snprintf(dst, CPS_ADDR_MAX, "%.*s", CPS_ADDR_MAX - 1, val);
    return 0;
}

static int env_flag(const char *name, int *dst, char *err, size_t errlen)
{
    const char *s = env(name);
    if (!s)
        return 0;
    if (strcmp(s, "0") && strcmp(s, "1"))
        return fail(err, errlen, "%s: '%s' is not 0 or 1", name, s);
    *dst = s[0] == '1';
    return 0;
}

int cps__config_parse_compress(const char *what, const char *s, cps__config *cfg, char *err,
                               size_t errlen)
{
    int snappy = cfg->compress, codecs = 0;
    cps__gradcodec gc = cfg->grad_codec;
    char item[64];
    const char *p = s;
    do {
        size_t n = strcspn(p, ",");
        if (n == 0 || n >= sizeof item)
            return fail(err, errlen, "%s: '%s' has an empty or overlong item", what, s);
        memcpy(item, p, n);
        item[n] = 0;
        if (!strcmp(item, "0") || !strcmp(item, "1")) {
            snappy = item[0] == '1';
        } else if (cps__gradcodec_parse(item, &gc) != 0 || ++codecs > 1) {
            return fail(err, errlen,
                        "%s: '%s' is not 0 or 1 (snappy) and one lossy gradient codec (none, "
                        "fp16, bf16, topk:R with 0 < R <= 1), comma-separated",
                        what, s);
        }
        p += n;
    } while (*p++ == ',');
    cfg->compress = snappy;
    cfg->grad_codec = gc;
    return 0;
}

const char *cps__config_compress_str(const cps__config *cfg, char *buf, size_t len)
{
    char spec[CPS_GC_SPEC_MAX];
    if (cfg->grad_codec.kind == CPS_GC_NONE)
        snprintf(buf, len, "%d", cfg->compress ? 1 : 0);
    else
        snprintf(buf, len, "%d,%s", cfg->compress ? 1 : 0,
                 cps__gradcodec_format(&cfg->grad_codec, spec, sizeof spec));
    return buf;
}

static int env_misc(cps__config *cfg, char *err, size_t errlen)
{
    const char *s = env("CHAINPS_DATA_DIR");
    if (s) {
        if (strlen(s) >= DATA_DIR_MAX)
            return fail(err, errlen, "CHAINPS_DATA_DIR: longer than %zu characters",
                        DATA_DIR_MAX - 1);
        snprintf(cfg->data_dir, sizeof cfg->data_dir, "%s", s);
        cfg->data_dir_given = 1;
    }
    s = env("CHAINPS_MODE");
    if (s) {
        int rc =
            cps__config_parse_mode("CHAINPS_MODE", s, &cfg->mode, &cfg->ssp_bound, err, errlen);
        if (rc)
            return rc;
    } else if (env("DMLC_ROLE") && !env("CHAINPS_ROLE") && !env("MS_ROLE")) {
        /* A job set up for ps-lite gets ps-lite's semantics: each push applied as it arrives.
         * Its workers may push different keys, which a sync step would wait for forever. */
        cfg->mode = CPS_MODE_ASYNC;
    }
    s = env("CHAINPS_BACKUP_WORKERS");
    if (s) {
        int rc = cps__config_parse_backup("CHAINPS_BACKUP_WORKERS", s, &cfg->backup_workers, err,
                                          errlen);
        if (rc)
            return rc;
    }
    s = env("CHAINPS_PORT");
    if (s) {
        uint32_t v;
        int rc = cps__config_parse_u32("CHAINPS_PORT", s, 0, 65535, &v, err, errlen);
        if (rc)
            return rc;
        cfg->port = (uint16_t)v;
    }
    s = env("CHAINPS_BIND");
    if (s) {
        int rc = check_host("CHAINPS_BIND", s, strlen(s), err, errlen);
        if (rc)
            return rc;
        snprintf(cfg->bind_host, sizeof cfg->bind_host, "%s", s);
    }
    s = env("CHAINPS_SECRET_FILE");
    if (s) {
        if (!*s || strlen(s) >= sizeof cfg->secret_file)
            return fail(err, errlen, "CHAINPS_SECRET_FILE: empty or longer than %zu characters",
                        sizeof cfg->secret_file - 1);
        snprintf(cfg->secret_file, sizeof cfg->secret_file, "%s", s);
    }
    s = env("CHAINPS_COMPRESS");
    int rc = s ? cps__config_parse_compress("CHAINPS_COMPRESS", s, cfg, err, errlen) : 0;
    if (!rc)
        rc = env_flag("CHAINPS_SYNC", &cfg->sync_every_commit, err, errlen);
    if (!rc)
        rc = env_flag("CHAINPS_INSECURE", &cfg->insecure, err, errlen);
    return rc;
}

int cps__config_from_env(cps__config *cfg, char *err, size_t errlen)
{
    static const char *const servers[] = {"CHAINPS_NUM_SERVERS", "DMLC_NUM_SERVER", "MS_SERVER_NUM",
                                          NULL};
    static const char *const workers[] = {"CHAINPS_NUM_WORKERS", "DMLC_NUM_WORKER", "MS_WORKER_NUM",
                                          NULL};
    static const char *const verbose[] = {"CHAINPS_VERBOSE", "PS_VERBOSE", NULL};
    static const char *const replicas[] = {"CHAINPS_REPLICAS", NULL};
    static const char *const ranges[] = {"CHAINPS_RANGES", NULL};
    static const char *const rank[] = {"CHAINPS_RANK", NULL};
    static const char *const join[] = {"CHAINPS_JOIN_TIMEOUT_MS", NULL};
    static const char *const request[] = {"CHAINPS_REQUEST_TIMEOUT_MS", NULL};
    static const char *const heartbeat[] = {"CHAINPS_HEARTBEAT_MS", NULL};
    static const char *const dead_after[] = {"CHAINPS_DEAD_AFTER_MS", NULL};
    static const char *const unavailable[] = {"CHAINPS_UNAVAILABLE_TIMEOUT_MS", NULL};
    static const char *const sched_gone[] = {"CHAINPS_SCHEDULER_TIMEOUT_MS", NULL};
    static const char *const worker_dead[] = {"CHAINPS_WORKER_DEAD_AFTER_MS", NULL};
    static const char *const max_tensor[] = {"CHAINPS_MAX_TENSOR_MB", NULL};
    static const char *const advertise[] = {"CHAINPS_ADVERTISE", "DMLC_NODE_HOST", NULL};

    if (err && errlen)
        err[0] = '\0';
    /* Work on a copy so a failure leaves cfg exactly as the caller passed it. */
    cps__config c = *cfg;
    uint32_t verb = 0;
    int verb_set = 0;
    int rc = env_role(&c, err, errlen);
    if (!rc)
        rc = env_scheduler(&c, err, errlen);
    if (!rc)
        rc = env_u32(servers, 1, CPS_MAX_NODES, &c.num_servers, NULL, err, errlen);
    if (!rc)
        rc = env_u32(workers, 1, CPS_MAX_NODES, &c.num_workers, NULL, err, errlen);
    if (!rc)
        rc = env_u32(verbose, 0, 3, &verb, &verb_set, err, errlen);
    if (!rc)
        rc = env_u32(replicas, 1, CPS_MAX_REPLICAS, &c.replicas, NULL, err, errlen);
    if (!rc)
        rc = env_u32(ranges, 1, CPS_MAX_RANGES, &c.num_ranges, NULL, err, errlen);
    if (!rc)
        rc = env_u32(rank, 0, CPS_MAX_NODES - 1, &c.rank, NULL, err, errlen);
    if (!rc)
        rc = env_u32(join, 1, TIMEOUT_MS_MAX, &c.join_timeout_ms, NULL, err, errlen);
    if (!rc)
        rc = env_u32(request, 1, TIMEOUT_MS_MAX, &c.request_timeout_ms, NULL, err, errlen);
    if (!rc)
        rc = env_u32(heartbeat, 1, TIMEOUT_MS_MAX, &c.heartbeat_ms, NULL, err, errlen);
    if (!rc)
        rc = env_u32(dead_after, 2, TIMEOUT_MS_MAX, &c.dead_after_ms, NULL, err, errlen);
    if (!rc)
        rc = env_u32(unavailable, 1, TIMEOUT_MS_MAX, &c.unavailable_timeout_ms, NULL, err, errlen);
    if (!rc)
        rc = env_u32(sched_gone, 1, TIMEOUT_MS_MAX, &c.scheduler_timeout_ms, NULL, err, errlen);
    if (!rc)
        rc = env_u32(worker_dead, 2, TIMEOUT_MS_MAX, &c.worker_dead_after_ms, NULL, err, errlen);
    if (!rc)
        rc = env_u32(max_tensor, 1, UINT32_MAX, &c.max_tensor_mb, NULL, err, errlen);
    if (!rc && c.dead_after_ms <= c.heartbeat_ms) {
        snprintf(err, errlen,
                 "CHAINPS_DEAD_AFTER_MS (%u) must be larger than "
                 "CHAINPS_HEARTBEAT_MS (%u)",
                 c.dead_after_ms, c.heartbeat_ms);
        rc = CPS_ECONFIG;
    }
    if (!rc)
        rc = env_host_row(advertise, c.advertise_host, err, errlen);
    if (!rc)
        rc = env_misc(&c, err, errlen);
    if (rc)
        return rc;
    if (verb_set) {
        c.verbose = (int)verb;
        /* ps-lite's PS_VERBOSE: 1 logs connections (INFO, shown anyway), 2 every message. */
        cps__log_set_level(verb >= 2 ? CPS_LOG_DEBUG : CPS_LOG_INFO);
    }
    *cfg = c;
    return 0;
}

/* ---- export ---- */

static int put(const char *name, const char *val)
{
    /* The names are ours and valid, so the only way these fail is running out of memory. */
    return (val ? setenv(name, val, 1) : unsetenv(name)) == 0 ? 0 : CPS_ENOMEM;
}

static int put_u32(const char *name, uint32_t v)
{
    char buf[16];
    snprintf(buf, sizeof buf, "%u", v);
    return put(name, buf);
}

int cps__config_export_env(const cps__config *cfg)
{
    /* The aliases go: a child started by `chainps launch` inherits our environment, and a stale
     * DMLC_ROLE=worker next to the CHAINPS_ROLE=server we set would be reported as a conflict. */
    static const char *const aliases[] = {
        "DMLC_ROLE",       "MS_ROLE",       "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT",
        "MS_SCHED_HOST",   "MS_SCHED_PORT", "DMLC_NUM_SERVER",  "MS_SERVER_NUM",
        "DMLC_NUM_WORKER", "MS_WORKER_NUM", "PS_VERBOSE",       "DMLC_NODE_HOST",
    };
    char buf[CPS_ADDR_MAX + 16];
    int rc = 0;
    for (size_t i = 0; !rc && i < sizeof aliases / sizeof aliases[0]; i++)
        rc = put(aliases[i], NULL);

    /* Unset fields are unset in the environment too, so the child sees the same defaults. */
    if (!rc)
        rc = put("CHAINPS_ROLE",
                 cfg->role == CPS_ROLE_NONE ? NULL : cps__config_role_str(cfg->role));
    snprintf(buf, sizeof buf, "%s:%u", cfg->sched_host, cfg->sched_port);
    if (!rc)
        rc = put("CHAINPS_SCHEDULER", buf);
    if (!rc)
        rc = cfg->num_servers ? put_u32("CHAINPS_NUM_SERVERS", cfg->num_servers)
                              : put("CHAINPS_NUM_SERVERS", NULL);
    if (!rc)
        rc = cfg->num_workers ? put_u32("CHAINPS_NUM_WORKERS", cfg->num_workers)
                              : put("CHAINPS_NUM_WORKERS", NULL);
    if (!rc)
        rc = put("CHAINPS_DATA_DIR", cfg->data_dir);
    if (!rc)
        rc = put_u32("CHAINPS_VERBOSE", (uint32_t)cfg->verbose);
    if (!rc)
        rc = put("CHAINPS_MODE", cps__config_mode_str(cfg->mode, cfg->ssp_bound, buf, sizeof buf));
    if (!rc)
        rc = cfg->backup_workers ? put_u32("CHAINPS_BACKUP_WORKERS", cfg->backup_workers)
                                 : put("CHAINPS_BACKUP_WORKERS", NULL);
    if (!rc)
        rc = cfg->replicas ? put_u32("CHAINPS_REPLICAS", cfg->replicas)
                           : put("CHAINPS_REPLICAS", NULL);
    if (!rc)
        rc = cfg->num_ranges ? put_u32("CHAINPS_RANGES", cfg->num_ranges)
                             : put("CHAINPS_RANGES", NULL);
    if (!rc)
        rc = cfg->rank != UINT32_MAX ? put_u32("CHAINPS_RANK", cfg->rank)
                                     : put("CHAINPS_RANK", NULL);
    if (!rc)
        rc = put("CHAINPS_BIND", cfg->bind_host[0] ? cfg->bind_host : NULL);
    if (!rc)
        rc = put("CHAINPS_ADVERTISE", cfg->advertise_host[0] ? cfg->advertise_host : NULL);
    if (!rc)
        rc = put_u32("CHAINPS_PORT", cfg->port);
    if (!rc)
        rc = put_u32("CHAINPS_JOIN_TIMEOUT_MS", cfg->join_timeout_ms);
    if (!rc)
        rc = put_u32("CHAINPS_REQUEST_TIMEOUT_MS", cfg->request_timeout_ms);
    if (!rc)
        rc = put_u32("CHAINPS_HEARTBEAT_MS", cfg->heartbeat_ms);
    if (!rc)
        rc = put_u32("CHAINPS_DEAD_AFTER_MS", cfg->dead_after_ms);
    if (!rc)
        rc = put_u32("CHAINPS_UNAVAILABLE_TIMEOUT_MS", cfg->unavailable_timeout_ms);
    if (!rc)
        rc = put_u32("CHAINPS_SCHEDULER_TIMEOUT_MS", cfg->scheduler_timeout_ms);
    if (!rc)
        rc = put_u32("CHAINPS_WORKER_DEAD_AFTER_MS", cfg->worker_dead_after_ms);
    if (!rc)
        rc = put_u32("CHAINPS_MAX_TENSOR_MB", cfg->max_tensor_mb);
    if (!rc)
        rc = put("CHAINPS_COMPRESS", cps__config_compress_str(cfg, buf, sizeof buf));
    if (!rc)
        rc = put("CHAINPS_SYNC", cfg->sync_every_commit ? "1" : "0");
    if (!rc)
        rc = put("CHAINPS_SECRET_FILE", cfg->secret_file[0] ? cfg->secret_file : NULL);
    if (!rc)
        rc = put("CHAINPS_INSECURE", cfg->insecure ? "1" : NULL);
    return rc;
}
