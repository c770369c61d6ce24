#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "chainps/error.h"

static void every_code_has_a_distinct_name_and_text(void **state)
{
    (void)state;
    static const int codes[] = {
#define CODE_(name, val, msg) CPS_##name,
        CPS_ERRNO_MAP(CODE_)
#undef CODE_
    };
    size_t n = sizeof codes / sizeof codes[0];
    for (size_t i = 0; i < n; i++) {
        assert_true(codes[i] < 0);
        assert_string_not_equal(cps_strerror(codes[i]), "unknown error");
        assert_string_not_equal(cps_err_name(codes[i]), "CPS_E?");
        for (size_t j = i + 1; j < n; j++) {
            assert_int_not_equal(codes[i], codes[j]);
            assert_string_not_equal(cps_err_name(codes[i]), cps_err_name(codes[j]));
        }
    }
}

static void unknown_and_ok_codes(void **state)
{
    (void)state;
    assert_string_equal(cps_strerror(0), "success");
    assert_string_equal(cps_err_name(0), "CPS_OK");
    assert_string_equal(cps_strerror(-9999), "unknown error");
    assert_string_equal(cps_err_name(12345), "CPS_E?");
    assert_string_equal(cps_err_name(CPS_ETIMEDOUT), "CPS_ETIMEDOUT");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_code_has_a_distinct_name_and_text),
        cmocka_unit_test(unknown_and_ok_codes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
