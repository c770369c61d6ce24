/* Where a node listens by default (issue 12): the address it is reached at, never every
 * interface unless asked. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "core/config.h"
#include "node/roles.h"

static cps__config base(void)
{
    cps__config c;
    cps__config_defaults(&c);
    return c;
}

static void scheduler_listens_where_the_job_names_it(void **state)
{
    (void)state;
    cps__config c = base();
    cps__config_finalize(&c, CPS_ROLE_SCHEDULER);
    assert_string_equal(c.bind_host, "127.0.0.1");
    assert_int_equal(c.port, c.sched_port);
    c = base();
    snprintf(c.sched_host, sizeof c.sched_host, "localhost");
    cps__config_finalize(&c, CPS_ROLE_SCHEDULER);
    assert_string_equal(c.bind_host, "127.0.0.1");
    c = base();
    snprintf(c.sched_host, sizeof c.sched_host, "127.0.0.7");
    cps__config_finalize(&c, CPS_ROLE_SCHEDULER);
    assert_string_equal(c.bind_host, "127.0.0.7");
    /* An advertised address wins over the job's name for the scheduler. */
    c = base();
    snprintf(c.advertise_host, sizeof c.advertise_host, "127.0.0.9");
    cps__config_finalize(&c, CPS_ROLE_SCHEDULER);
    assert_string_equal(c.bind_host, "127.0.0.9");
}

static void other_nodes_listen_where_they_advertise(void **state)
{
    (void)state;
    int roles[] = {CPS_ROLE_SERVER, CPS_ROLE_WORKER};
    for (int i = 0; i < 2; i++) {
        cps__config c = base();
        cps__config_finalize(&c, roles[i]);
        assert_string_equal(c.advertise_host, "127.0.0.1");
        assert_string_equal(c.bind_host, "127.0.0.1");
        c = base();
        snprintf(c.advertise_host, sizeof c.advertise_host, "127.0.0.3");
        cps__config_finalize(&c, roles[i]);
        assert_string_equal(c.bind_host, "127.0.0.3"); /* was 0.0.0.0 */
    }
}

static void every_interface_only_when_asked(void **state)
{
    (void)state;
    cps__config c = base();
    snprintf(c.bind_host, sizeof c.bind_host, "0.0.0.0");
    cps__config_finalize(&c, CPS_ROLE_SCHEDULER);
    assert_string_equal(c.bind_host, "0.0.0.0");
    c = base();
    snprintf(c.bind_host, sizeof c.bind_host, "0.0.0.0");
    snprintf(c.advertise_host, sizeof c.advertise_host, "node-7.cluster");
    cps__config_finalize(&c, CPS_ROLE_SERVER);
    assert_string_equal(c.bind_host, "0.0.0.0");
    assert_string_equal(c.advertise_host, "node-7.cluster");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(scheduler_listens_where_the_job_names_it),
        cmocka_unit_test(other_nodes_listen_where_they_advertise),
        cmocka_unit_test(every_interface_only_when_asked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
