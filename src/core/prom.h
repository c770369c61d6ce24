/* Prometheus text exposition format, version 0.0.4: the page a scheduler or server serves at
 * /metrics (node/metrics.h serves it; this module only writes the text, so it stays pure and
 * unit-testable).
 *
 * A page is a sequence of metric families: `# HELP name text`, `# TYPE name counter|gauge|
 * histogram`, then its samples `name{label="v",...} value`, one a line, each line ending in \n.
 * Names must match [a-zA-Z_:][a-zA-Z0-9_:]*; callers pass literal names, checked only by
 * assertions in the unit test. Label sets are passed preformatted (`range="3"`, no braces),
 * since every label value chainps writes is a number or a role name.
 *
 * Errors are sticky: after a failed allocation every call returns CPS_ENOMEM and the text is
 * incomplete, so callers check once, at the end (cps__prom_status).
 */
#ifndef CPS_CORE_PROM_H
#define CPS_CORE_PROM_H

#include <stddef.h>
#include <stdint.h>

typedef struct cps__prom {
    char *buf;  /* NUL-terminated text so far (NULL before the first write) */
    size_t len; /* bytes of text, without the NUL */
    size_t cap;
    int rc; /* 0, or the first error (CPS_ENOMEM, CPS_EINVAL) */
} cps__prom;

/* An empty page. */
void cps__prom_init(cps__prom *p);
/* Free the text. Safe on an initialised page; the page can be reused after cps__prom_init. */
void cps__prom_fini(cps__prom *p);
/* Empty the page, keeping its buffer (a page rendered again every publish reuses it). */
void cps__prom_reset(cps__prom *p);
/* 0, or the first error of any call since init/reset. */
int cps__prom_status(const cps__prom *p);

/* `# HELP` and `# TYPE` lines of a family. type: "counter", "gauge" or "histogram"; help: one
 * line of text (backslashes and newlines are escaped). Errors: CPS_EINVAL (NULL name or type),
 * CPS_ENOMEM. */
int cps__prom_family(cps__prom *p, const char *name, const char *type, const char *help);
/* One sample line: `name{labels} value` (no braces when labels is NULL or empty). Integers are
 * written exactly; doubles with 17 significant digits, +Inf/-Inf/NaN by the format's spelling. */
int cps__prom_u64(cps__prom *p, const char *name, const char *labels, uint64_t value);
int cps__prom_f64(cps__prom *p, const char *name, const char *labels, double value);

/* A latency histogram in seconds with fixed bucket bounds (cps__prom_hist_bounds, 10 us to
 * 1 s). counts[i] holds observations in (bounds[i-1], bounds[i]]; counts[CPS_PROM_HIST_BUCKETS]
 * those above the last bound. Written as cumulative `_bucket{le="..."}` samples, `_sum`,
 * `_count`. Plain data: copied by value into a snapshot. */
#define CPS_PROM_HIST_BUCKETS 12
typedef struct cps__prom_hist {
    uint64_t counts[CPS_PROM_HIST_BUCKETS + 1];
    uint64_t count;
    double sum;
} cps__prom_hist;
extern const double cps__prom_hist_bounds[CPS_PROM_HIST_BUCKETS];

/* Count one observation of `seconds` (negative values count as 0). */
void cps__prom_hist_observe(cps__prom_hist *h, double seconds);
/* The whole family: HELP, TYPE histogram, buckets (with `labels` before `le`), sum, count. */
int cps__prom_histogram(cps__prom *p, const char *name, const char *help, const char *labels,
                        const cps__prom_hist *h);

/* The Content-Type of the page. */
#define CPS_PROM_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

#endif
