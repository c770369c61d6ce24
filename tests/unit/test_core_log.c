/* cps_last_error_message: the ERROR lines of the running call, per thread. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "core/log.h"

static void silent(void *ctx, int level, const char *subsystem, const char *line)
{
    (void)ctx, (void)level, (void)subsystem, (void)line;
}

static void first_and_latest_error_lines_of_the_call(void **state)
{
    (void)state;
    cps__why_clear();
    assert_string_equal(cps_last_error_message(), "");
    cps__log(CPS_LOG_WARN, "t", "a warning is not a reason");
    cps__log(CPS_LOG_INFO, "t", "nor is news");
    assert_string_equal(cps_last_error_message(), "");
    cps__log(CPS_LOG_ERROR, "t", "no job secret: give %s", "--secret-file");
    assert_string_equal(cps_last_error_message(), "no job secret: give --secret-file");
    assert_string_equal(cps__why_latest(), "no job secret: give --secret-file");
    cps__log(CPS_LOG_ERROR, "t", "middle");
    cps__log(CPS_LOG_ERROR, "t", "gave up");
    cps__log(CPS_LOG_ERROR, "t", "gave up"); /* a repeat is not a new reason */
    assert_string_equal(cps_last_error_message(), "no job secret: give --secret-file; gave up");
    assert_string_equal(cps__why_latest(), "gave up");
    cps__why_clear();
    assert_string_equal(cps_last_error_message(), "");
    cps__why_set("kept by an operation");
    assert_string_equal(cps_last_error_message(), "kept by an operation");
    cps__why_set(NULL);
    assert_string_equal(cps_last_error_message(), "");
}

static void long_lines_are_cut_not_overflowed(void **state)
{
    (void)state;
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    cps__why_clear();
    cps__log(CPS_LOG_ERROR, "t", "%s", big);
    assert_int_equal(strlen(cps_last_error_message()), CPS__WHY_MAX - 1);
    cps__log(CPS_LOG_ERROR, "t", "y%s", big);
    assert_int_equal(strlen(cps_last_error_message()), 2 * (CPS__WHY_MAX - 1) + 2);
    assert_int_equal(cps__why_latest()[0], 'y');
}

static void *other_thread(void *arg)
{
    (void)arg;
    cps__why_clear();
    cps__log(CPS_LOG_ERROR, "t", "another thread's failure");
    return NULL;
}

static void each_thread_has_its_own(void **state)
{
    (void)state;
    cps__why_clear();
    cps__log(CPS_LOG_ERROR, "t", "mine");
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, other_thread, NULL), 0);
    pthread_join(th, NULL);
    assert_string_equal(cps_last_error_message(), "mine");
}

int main(void)
{
    cps__log_set_sink(silent, NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(first_and_latest_error_lines_of_the_call),
        cmocka_unit_test(long_lines_are_cut_not_overflowed),
        cmocka_unit_test(each_thread_has_its_own),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
