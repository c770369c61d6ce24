#include "flags.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The whole of `v` as a number of `kind`, into dst; -1 (dst untouched) if it is not one. */
static int parse_value(const char *v, tc_flag_kind kind, void *dst)
{
    if (kind == TC_STR) {
        *(const char **)dst = v;
        return 0;
    }
    char *end = NULL;
    errno = 0;
    long l = 0;
    unsigned long long u = 0;
    double d = 0;
    if (kind == TC_DOUBLE)
        d = strtod(v, &end);
    else if (kind == TC_U64 && *v != '-')
        u = strtoull(v, &end, 10);
    else if (kind == TC_INT || kind == TC_LONG)
        l = strtol(v, &end, 10);
    if (!end || end == v || *end || errno)
        return -1;
    if (kind == TC_INT && (l < INT_MIN || l > INT_MAX))
        return -1;
    if (kind == TC_INT)
        *(int *)dst = (int)l;
    else if (kind == TC_LONG)
        *(long *)dst = l;
    else if (kind == TC_U64)
        *(uint64_t *)dst = (uint64_t)u;
    else
        *(double *)dst = d;
    return 0;
}

int tc_flags_parse(int argc, char **argv, const tc_flag *flags)
{
    const char *prog = argc > 0 ? argv[0] : "?";
    const char *slash = strrchr(prog, '/');
    prog = slash ? slash + 1 : prog;
    for (int i = 1; i < argc; i++) {
        const tc_flag *f = flags;
        while (f->name && strcmp(f->name, argv[i]) != 0)
            f++;
        if (!f->name) {
            fprintf(stderr, "%s: unknown argument %s\n", prog, argv[i]);
            return -1;
        }
        if (f->kind == TC_SWITCH) {
            *(int *)f->dst = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "%s: %s needs a value\n", prog, f->name);
            return -1;
        }
        if (parse_value(argv[++i], f->kind, f->dst) != 0) {
            fprintf(stderr, "%s: %s: '%s' is not a number\n", prog, f->name, argv[i]);
            return -1;
        }
    }
    return 0;
}
