/* The Prometheus text rendering of /metrics (core/prom.h): exact text of families, samples and
 * histograms, and every line of a page in the 0.0.4 grammar. */
#include <ctype.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "core/prom.h"
#include "core/wire.h"

static int name_ok(const char *s, size_t n)
{
    if (n == 0 || !(isalpha((unsigned char)s[0]) || s[0] == '_' || s[0] == ':'))
        return 0;
    for (size_t i = 1; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == ':'))
            return 0;
    return 1;
}

/* 1 if `line` (no newline) is a HELP, TYPE or sample line of the text format. */
static int line_ok(const char *line)
{
    if (!strncmp(line, "# HELP ", 7)) {
        const char *sp = strchr(line + 7, ' ');
        return sp && name_ok(line + 7, (size_t)(sp - line - 7));
    }
    if (!strncmp(line, "# TYPE ", 7)) {
        const char *sp = strchr(line + 7, ' ');
        if (!sp || !name_ok(line + 7, (size_t)(sp - line - 7)))
            return 0;
        return !strcmp(sp + 1, "counter") || !strcmp(sp + 1, "gauge") ||
               !strcmp(sp + 1, "histogram");
    }
    size_t n = strcspn(line, "{ ");
    if (!name_ok(line, n))
        return 0;
    const char *p = line + n;
    if (*p == '{') { /* label="value"(,label="value")* } */
        p++;
        for (;;) {
            size_t ln = strcspn(p, "=");
            if (!name_ok(p, ln) || p[ln + 1] != '"')
                return 0;
            p += ln + 2;
            while (*p && *p != '"')
                p += *p == '\\' ? 2 : 1;
            if (*p != '"')
                return 0;
            p++;
            if (*p == '}')
                break;
            if (*p++ != ',')
                return 0;
        }
        p++;
    }
    if (*p++ != ' ')
        return 0;
    if (!strcmp(p, "+Inf") || !strcmp(p, "-Inf") || !strcmp(p, "NaN"))
        return 1;
    char *end;
    strtod(p, &end);
    return end != p && *end == '\0';
}

/* Every line of the page parses, and it ends with a newline. */
static void assert_page_parses(const cps__prom *p)
{
    assert_int_equal(cps__prom_status(p), 0);
    assert_true(p->len > 0 && p->buf[p->len - 1] == '\n');
    char *copy = strdup(p->buf);
    assert_non_null(copy);
    for (char *save = NULL, *l = strtok_r(copy, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        if (!line_ok(l))
            fail_msg("not a line of the text format: '%s'", l);
    }
    free(copy);
}

static void families_and_samples(void **state)
{
    (void)state;
    cps__prom p;
    cps__prom_init(&p);
    assert_int_equal(cps__prom_family(&p, "chainps_x_total", "counter", "Pushes\\n and \\ more"),
                     0);
    assert_int_equal(cps__prom_u64(&p, "chainps_x_total", NULL, 18446744073709551615ull), 0);
    assert_int_equal(cps__prom_family(&p, "chainps_g", "gauge", "A gauge."), 0);
    assert_int_equal(cps__prom_u64(&p, "chainps_g", "range=\"3\"", 7), 0);
    assert_int_equal(cps__prom_f64(&p, "chainps_g", "range=\"4\",role=\"head\"", 0.5), 0);
    assert_int_equal(cps__prom_f64(&p, "chainps_g", "", INFINITY), 0);
    assert_int_equal(cps__prom_f64(&p, "chainps_g", NULL, NAN), 0);
    assert_string_equal(p.buf, "# HELP chainps_x_total Pushes\\\\n and \\\\ more\n"
                               "# TYPE chainps_x_total counter\n"
                               "chainps_x_total 18446744073709551615\n"
                               "# HELP chainps_g A gauge.\n"
                               "# TYPE chainps_g gauge\n"
                               "chainps_g{range=\"3\"} 7\n"
                               "chainps_g{range=\"4\",role=\"head\"} 0.5\n"
                               "chainps_g +Inf\n"
                               "chainps_g NaN\n");
    assert_page_parses(&p);
    /* A newline in HELP text is escaped, so the page keeps one line per item. */
    cps__prom_reset(&p);
    assert_int_equal(p.len, 0);
    cps__prom_family(&p, "a", "gauge", "two\nlines");
    assert_string_equal(p.buf, "# HELP a two\\nlines\n# TYPE a gauge\n");
    assert_int_equal(cps__prom_family(&p, NULL, "gauge", ""), CPS_EINVAL);
    assert_int_equal(cps__prom_status(&p), CPS_EINVAL); /* sticky */
    assert_int_equal(cps__prom_u64(&p, "a", NULL, 1), CPS_EINVAL);
    cps__prom_fini(&p);
}

static void histogram_is_cumulative(void **state)
{
    (void)state;
    cps__prom_hist h;
    memset(&h, 0, sizeof h);
    cps__prom_hist_observe(&h, 0.000005); /* first bucket */
    cps__prom_hist_observe(&h, 0.00001);  /* on a bound: that bucket (le) */
    cps__prom_hist_observe(&h, 0.003);
    cps__prom_hist_observe(&h, 5.0); /* above every bound: +Inf only */
    cps__prom_hist_observe(&h, -1);  /* counts as 0 */
    assert_int_equal(h.count, 5);
    assert_int_equal(h.counts[0], 3);
    assert_int_equal(h.counts[CPS_PROM_HIST_BUCKETS], 1);
    cps__prom p;
    cps__prom_init(&p);
    assert_int_equal(cps__prom_histogram(&p, "chainps_lat_seconds", "Latency.", "rank=\"1\"", &h),
                     0);
    assert_page_parses(&p);
    assert_non_null(strstr(p.buf, "# TYPE chainps_lat_seconds histogram\n"));
    assert_non_null(strstr(p.buf, "chainps_lat_seconds_bucket{rank=\"1\",le=\"1e-05\"} 3\n"));
    assert_non_null(strstr(p.buf, "chainps_lat_seconds_bucket{rank=\"1\",le=\"0.001\"} 3\n"));
    assert_non_null(strstr(p.buf, "chainps_lat_seconds_bucket{rank=\"1\",le=\"0.0025\"} 3\n"));
    assert_non_null(strstr(p.buf, "chainps_lat_seconds_bucket{rank=\"1\",le=\"0.01\"} 4\n"));
    assert_non_null(strstr(p.buf, "chainps_lat_seconds_bucket{rank=\"1\",le=\"1\"} 4\n"));
    assert_non_null(strstr(p.buf, "chainps_lat_seconds_bucket{rank=\"1\",le=\"+Inf\"} 5\n"));
    assert_non_null(strstr(p.buf, "chainps_lat_seconds_count{rank=\"1\"} 5\n"));
    assert_non_null(strstr(p.buf, "chainps_lat_seconds_sum{rank=\"1\"} 5.00301"));
    /* Without labels: no braces on sum and count, only le on buckets. */
    cps__prom_reset(&p);
    cps__prom_histogram(&p, "h", "", NULL, &h);
    assert_page_parses(&p);
    assert_non_null(strstr(p.buf, "h_bucket{le=\"+Inf\"} 5\nh_sum 5.00301"));
    assert_non_null(strstr(p.buf, "\nh_count 5\n"));
    cps__prom_fini(&p);
}

static void bounds_increase(void **state)
{
    (void)state;
    for (int i = 1; i < CPS_PROM_HIST_BUCKETS; i++)
        assert_true(cps__prom_hist_bounds[i] > cps__prom_hist_bounds[i - 1]);
}

static void large_page_grows(void **state)
{
    (void)state;
    cps__prom p;
    cps__prom_init(&p);
    cps__prom_family(&p, "chainps_range_replicas", "gauge", "Replicas per range.");
    for (unsigned r = 0; r < 5000; r++) {
        char l[32];
        snprintf(l, sizeof l, "range=\"%u\"", r);
        assert_int_equal(cps__prom_u64(&p, "chainps_range_replicas", l, r % 4), 0);
    }
    assert_page_parses(&p);
    assert_int_equal(strlen(p.buf), p.len);
    cps__prom_fini(&p);
}

/* The checkpoint record the scheduler keeps and `chainps status` shows (core/wire.h). */
static void ckpt_note_round_trip(void **state)
{
    (void)state;
    cps__ckpt_note n = {7, 1200, 1764000000123ull, 5000, "ckpt/step-1200/model.safetensors"}, m;
    unsigned char b[CPS_CKPT_NOTE_FIXED + CPS_CKPT_NOTE_PATH_MAX];
    size_t len = cps__ckpt_note_encode(b, sizeof b, &n), used = 0;
    assert_int_equal(len, cps__ckpt_note_size(&n));
    assert_int_equal(cps__ckpt_note_encode(b, len - 1, &n), 0);
    assert_int_equal(cps__ckpt_note_decode(b, len, &m, &used), 0);
    assert_int_equal(used, len);
    assert_int_equal(m.id, 7);
    assert_int_equal(m.step, 1200);
    assert_int_equal(m.unix_ms, 1764000000123ull);
    assert_int_equal(m.age_ms, 5000);
    assert_string_equal(m.path, n.path);
    assert_int_equal(cps__ckpt_note_decode(b, len - 1, &m, NULL), CPS_ESIZE);
    assert_int_equal(cps__ckpt_note_decode(b, 10, &m, NULL), CPS_ESIZE);
    b[CPS_CKPT_NOTE_FIXED + 3] = 0; /* a NUL inside the path */
    assert_int_equal(cps__ckpt_note_decode(b, len, &m, NULL), CPS_EPROTO);
    memset(b + 32, 0, 4); /* empty path */
    assert_int_equal(cps__ckpt_note_decode(b, len, &m, NULL), CPS_EPROTO);
    memset(b + 32, 0xff, 4); /* longer than any path */
    assert_int_equal(cps__ckpt_note_decode(b, sizeof b, &m, NULL), CPS_EPROTO);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(families_and_samples), cmocka_unit_test(histogram_is_cumulative),
        cmocka_unit_test(bounds_increase),      cmocka_unit_test(large_page_grows),
        cmocka_unit_test(ckpt_note_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
