#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "core/array.h"

static void grows_by_doubling_and_keeps_contents(void **state)
{
    (void)state;
    void *p = NULL;
    size_t cap = 0;
    assert_int_equal(cps__array_reserve(&p, &cap, 1, sizeof(int), 4), 0);
    assert_int_equal(cap, 4);
    for (int i = 0; i < 4; i++)
        ((int *)p)[i] = i;
    assert_int_equal(cps__array_reserve(&p, &cap, 4, sizeof(int), 4), 0);
    assert_int_equal(cap, 4); /* enough room: unchanged */
    assert_int_equal(cps__array_reserve(&p, &cap, 5, sizeof(int), 4), 0);
    assert_int_equal(cap, 8);
    assert_int_equal(cps__array_reserve(&p, &cap, 33, sizeof(int), 4), 0);
    assert_int_equal(cap, 64);
    for (int i = 0; i < 4; i++)
        assert_int_equal(((int *)p)[i], i);
    free(p);
}

static void overflow_leaves_the_array_as_it_was(void **state)
{
    (void)state;
    void *p = NULL;
    size_t cap = 0;
    assert_int_equal(cps__array_reserve(&p, &cap, 2, 16, 0), 0);
    assert_int_equal(cap, 2);
    void *before = p;
    assert_int_equal(cps__array_reserve(&p, &cap, SIZE_MAX / 8, 16, 0), CPS_ENOMEM);
    assert_int_equal(cap, 2);
    assert_ptr_equal(p, before);
    free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(grows_by_doubling_and_keeps_contents),
        cmocka_unit_test(overflow_leaves_the_array_as_it_was),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
