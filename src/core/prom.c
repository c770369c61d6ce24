/* Prometheus text exposition format (prom.h). */
#include "core/prom.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"

/* Buckets from 10 us (a small update's LMDB commit without fsync) to 1 s (an fsync'd commit on
 * a slow disk, a large optimizer step): the range an apply actually takes. */
const double cps__prom_hist_bounds[CPS_PROM_HIST_BUCKETS] = {
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.01, 0.05, 0.25, 1.0};

void cps__prom_init(cps__prom *p)
{
    memset(p, 0, sizeof *p);
}

void cps__prom_fini(cps__prom *p)
{
    free(p->buf);
    memset(p, 0, sizeof *p);
}

void cps__prom_reset(cps__prom *p)
{
    p->len = 0;
    p->rc = 0;
    if (p->buf)
        p->buf[0] = '\0';
}

int cps__prom_status(const cps__prom *p)
{
    return p->rc;
}

/* Append printf-style text, growing the buffer. */
__attribute__((format(printf, 2, 3))) static int put(cps__prom *p, const char *fmt, ...)
{
    if (p->rc)
        return p->rc;
    for (;;) {
        size_t room = p->cap - p->len;
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(p->buf ? p->buf + p->len : NULL, p->buf ? room : 0, fmt, ap);
        va_end(ap);
        if (n < 0)
            return p->rc = CPS_EINVAL;
        if (p->buf && (size_t)n < room) {
            p->len += (size_t)n;
            return 0;
        }
        size_t cap = p->cap ? p->cap : 4096;
        while (cap - p->len <= (size_t)n)
            cap *= 2;
        char *grown = realloc(p->buf, cap);
        if (!grown)
            return p->rc = CPS_ENOMEM;
        p->buf = grown;
        p->cap = cap;
    }
}

int cps__prom_family(cps__prom *p, const char *name, const char *type, const char *help)
{
    if (!name || !type)
        return p->rc ? p->rc : (p->rc = CPS_EINVAL);
    put(p, "# HELP %s ", name);
    /* HELP text escapes only backslash and newline (format 0.0.4). */
    for (const char *c = help ? help : ""; *c; c++) {
        if (*c == '\\')
            put(p, "\\\\");
        else if (*c == '\n')
            put(p, "\\n");
        else
            put(p, "%c", *c);
    }
    return put(p, "\n# TYPE %s %s\n", name, type);
}

static int head(cps__prom *p, const char *name, const char *labels)
{
    if (labels && *labels)
        return put(p, "%s{%s} ", name, labels);
    return put(p, "%s ", name);
}

int cps__prom_u64(cps__prom *p, const char *name, const char *labels, uint64_t value)
{
    head(p, name, labels);
    return put(p, "%llu\n", (unsigned long long)value);
}

static int value(cps__prom *p, double v)
{
    if (isnan(v))
        return put(p, "NaN");
    if (isinf(v))
        return put(p, v > 0 ? "+Inf" : "-Inf");
    return put(p, "%.17g", v);
}

int cps__prom_f64(cps__prom *p, const char *name, const char *labels, double v)
{
    head(p, name, labels);
    value(p, v);
    return put(p, "\n");
}

void cps__prom_hist_observe(cps__prom_hist *h, double seconds)
{
    if (!(seconds > 0))
        seconds = 0;
    size_t i = 0;
    while (i < CPS_PROM_HIST_BUCKETS && seconds > cps__prom_hist_bounds[i])
        i++;
    h->counts[i]++;
    h->count++;
    h->sum += seconds;
}

int cps__prom_histogram(cps__prom *p, const char *name, const char *help, const char *labels,
                        const cps__prom_hist *h)
{
    cps__prom_family(p, name, "histogram", help);
    const char *sep = labels && *labels ? "," : "";
    uint64_t cum = 0;
    for (size_t i = 0; i <= CPS_PROM_HIST_BUCKETS; i++) {
        cum += h->counts[i];
        put(p, "%s_bucket{%s%sle=\"", name, labels ? labels : "", sep);
        if (i < CPS_PROM_HIST_BUCKETS)
            put(p, "%g", cps__prom_hist_bounds[i]);
        else
            put(p, "+Inf");
        put(p, "\"} %llu\n", (unsigned long long)cum);
    }
    put(p, "%s_sum", name);
    if (labels && *labels)
        put(p, "{%s}", labels);
    put(p, " ");
    value(p, h->sum);
    put(p, "\n%s_count", name);
    if (labels && *labels)
        put(p, "{%s}", labels);
    return put(p, " %llu\n", (unsigned long long)h->count);
}
