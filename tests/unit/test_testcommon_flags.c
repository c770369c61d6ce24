/* The flag parser the test and benchmark programs share (tests/common/flags.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "flags.h"

typedef struct vals {
    int n, on;
    long l;
    uint64_t u;
    double d;
    const char *s;
} vals;

static int parse(vals *v, int argc, char **argv)
{
    const tc_flag flags[] = {
        {"--n", TC_INT, &v->n}, {"--on", TC_SWITCH, &v->on}, {"--l", TC_LONG, &v->l},
        {"--u", TC_U64, &v->u}, {"--d", TC_DOUBLE, &v->d},   {"--s", TC_STR, &v->s},
        {NULL, 0, NULL}};
    return tc_flags_parse(argc, argv, flags);
}

static void values_and_defaults(void **state)
{
    (void)state;
    vals v = {.n = 7, .s = "default"};
    char *argv[] = {"prog", "--n", "-3",  "--on", "--u", "18446744073709551615",
                    "--d",  "2.5", "--l", "9",    NULL};
    assert_int_equal(parse(&v, 10, argv), 0);
    assert_int_equal(v.n, -3);
    assert_int_equal(v.on, 1);
    assert_true(v.u == UINT64_MAX);
    assert_true(v.d == 2.5);
    assert_int_equal(v.l, 9);
    assert_string_equal(v.s, "default"); /* not given: left alone */
    char *again[] = {"prog", "--s", "x", "--s", "y", NULL};
    assert_int_equal(parse(&v, 5, again), 0);
    assert_string_equal(v.s, "y"); /* the last one counts */
}

static void errors_leave_the_value(void **state)
{
    (void)state;
    vals v = {.n = 7, .u = 5};
    char *unknown[] = {"prog", "--nope", NULL};
    assert_int_equal(parse(&v, 2, unknown), -1);
    char *missing[] = {"prog", "--n", NULL};
    assert_int_equal(parse(&v, 2, missing), -1);
    char *junk[] = {"prog", "--n", "1o", NULL};
    assert_int_equal(parse(&v, 3, junk), -1);
    char *big[] = {"prog", "--n", "4294967296", NULL};
    assert_int_equal(parse(&v, 3, big), -1);
    char *neg[] = {"prog", "--u", "-1", NULL};
    assert_int_equal(parse(&v, 3, neg), -1);
    char *empty[] = {"prog", "--d", "", NULL};
    assert_int_equal(parse(&v, 3, empty), -1);
    assert_int_equal(v.n, 7);
    assert_true(v.u == 5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(values_and_defaults),
        cmocka_unit_test(errors_leave_the_value),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
