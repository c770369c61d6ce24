#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "recovery/incarnation.h"

/* Before the job runs there are no chains: any HELLO is let in as it is. */
static void before_the_job_every_hello_is_admitted(void **state)
{
    (void)state;
    assert_int_equal(cps__incarnation_hello(0, 1, 0, 7), CPS_INC_ADMIT);
    assert_int_equal(cps__incarnation_hello(0, 1, 5, 7), CPS_INC_ADMIT);
    assert_int_equal(cps__incarnation_hello(0, 0, 0, 7), CPS_INC_ADMIT);
}

/* A server counted dead is out of every chain already: it comes back (a revival). */
static void a_dead_server_is_revived(void **state)
{
    (void)state;
    assert_int_equal(cps__incarnation_hello(1, 0, 5, 7), CPS_INC_ADMIT);
    assert_int_equal(cps__incarnation_hello(1, 0, 0, 7), CPS_INC_ADMIT);
    assert_int_equal(cps__incarnation_hello(1, 0, 7, 7), CPS_INC_ADMIT);
}

/* The life we let in repeats its HELLO (our WELCOME was slow): nothing changes. */
static void the_welcomed_life_repeating_its_hello_keeps_its_place(void **state)
{
    (void)state;
    assert_int_equal(cps__incarnation_hello(1, 1, 7, 7), CPS_INC_SAME);
}

/* Another life of a server counted alive: it restarted before the detector saw it. */
static void another_life_of_a_live_server_is_a_death(void **state)
{
    (void)state;
    assert_int_equal(cps__incarnation_hello(1, 1, 5, 7), CPS_INC_NEW_LIFE);
}

/* Issue 26 (chaos seed 11 on fmnist): the scheduler restarted, then a server restarted before it
 * was declared dead. The restarted scheduler had not kept the server's boot id (0: unknown) and
 * took the new life's HELLO for "a node moved": the fresh replica kept its chain positions with
 * none of the FWDs the old life owed its successor, which dropped every later FWD as a gap, and
 * the workers' push on that range went unanswered for good. A life we cannot tell from a new one
 * is a new one. */
static void an_unknown_life_of_a_live_server_is_a_death(void **state)
{
    (void)state;
    assert_int_equal(cps__incarnation_hello(1, 1, 0, 7), CPS_INC_NEW_LIFE);
    /* and a HELLO that names no life cannot be the one we let in */
    assert_int_equal(cps__incarnation_hello(1, 1, 0, 0), CPS_INC_NEW_LIFE);
    assert_int_equal(cps__incarnation_hello(1, 1, 7, 0), CPS_INC_NEW_LIFE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(before_the_job_every_hello_is_admitted),
        cmocka_unit_test(a_dead_server_is_revived),
        cmocka_unit_test(the_welcomed_life_repeating_its_hello_keeps_its_place),
        cmocka_unit_test(another_life_of_a_live_server_is_a_death),
        cmocka_unit_test(an_unknown_life_of_a_live_server_is_a_death),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
