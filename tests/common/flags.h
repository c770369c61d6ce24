/* Command-line flags of the test and benchmark programs (bench/, tests/integration/lsq_worker):
 * "--name value" options and bare "--name" switches, described by a table, so a program lists
 * its flags and defaults instead of writing the parsing loop once more. Numbers are checked
 * whole ("--steps 1o" is an error, not 1), which atoi never did. */
#ifndef CPS_TESTS_COMMON_FLAGS_H
#define CPS_TESTS_COMMON_FLAGS_H

#include <stdint.h>

typedef enum tc_flag_kind {
    TC_SWITCH, /* no value: *(int *)dst = 1 */
    TC_INT,    /* int */
    TC_LONG,   /* long */
    TC_U64,    /* uint64_t, decimal */
    TC_DOUBLE, /* double */
    TC_STR,    /* const char *, borrowed from argv */
} tc_flag_kind;

typedef struct tc_flag {
    const char *name; /* with its dashes: "--steps" */
    tc_flag_kind kind;
    void *dst; /* left as it is (the default) unless the flag is given */
} tc_flag;

/* Parse argv[1..argc-1] against `flags`, a table ended by {NULL}; a later flag overrides an
 * earlier one. Returns 0, or -1 after printing "PROG: REASON" to stderr (an unknown argument, a
 * missing value, a value that is not a number of the flag's kind): the caller prints its usage
 * and exits. */
int tc_flags_parse(int argc, char **argv, const tc_flag *flags);

#endif
