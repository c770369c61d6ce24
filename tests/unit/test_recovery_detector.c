#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "recovery/detector.h"

static cps__detector *make(uint32_t dead_after, uint32_t grace)
{
    cps__detector_config cfg = {dead_after, grace};
    cps__detector *d = NULL;
    assert_int_equal(cps__detector_create(&cfg, &d), 0);
    return d;
}

static void silent_node_is_declared_dead_once(void **state)
{
    (void)state;
    cps__detector *d = make(300, 0);
    uint32_t dead[4];
    assert_int_equal(cps__detector_watch(d, 1, 1000), 0);
    assert_int_equal(cps__detector_watch(d, 2, 1000), 0);
    assert_int_equal(cps__detector_tick(d, 1300, dead, 4), 0); /* exactly at the limit: alive */
    cps__detector_heard(d, 2, 1250);
    assert_int_equal(cps__detector_tick(d, 1301, dead, 4), 1);
    assert_int_equal(dead[0], 1);
    assert_int_equal(cps__detector_tick(d, 5000, dead, 4), 1); /* node 1 not reported again */
    assert_int_equal(dead[0], 2);
    assert_int_equal(cps__detector_tick(d, 9000, dead, 4), 0);
    cps__detector_destroy(d);
}

static void heartbeats_keep_a_node_alive(void **state)
{
    (void)state;
    cps__detector *d = make(300, 0);
    uint32_t dead[4];
    cps__detector_watch(d, 7, 0);
    for (uint64_t t = 100; t < 10000; t += 100) {
        cps__detector_heard(d, 7, t);
        assert_int_equal(cps__detector_tick(d, t + 50, dead, 4), 0);
    }
    assert_int_equal(cps__detector_silence(d, 7, 10000), 100);
    /* Heard out of order (an old heartbeat delivered late) never moves the clock back. */
    cps__detector_heard(d, 7, 50);
    assert_int_equal(cps__detector_silence(d, 7, 10000), 100);
    cps__detector_destroy(d);
}

/* A node whose process is known gone is dead at the next tick, silence and grace aside; a node
 * watched again (it came back) starts clean. */
static void gone_node_is_dead_at_once(void **state)
{
    (void)state;
    cps__detector *d = make(3000, 5000);
    uint32_t dead[4];
    cps__detector_watch(d, 1, 1000);
    cps__detector_watch(d, 2, 1000);
    cps__detector_restart(d, 1000); /* in grace, too */
    cps__detector_heard(d, 1, 1040);
    cps__detector_gone(d, 1);
    cps__detector_gone(d, 9); /* not watched: nothing */
    assert_int_equal(cps__detector_tick(d, 1050, dead, 4), 1);
    assert_int_equal(dead[0], 1);
    assert_int_equal(cps__detector_tick(d, 1060, dead, 4), 0);
    cps__detector_watch(d, 1, 2000);
    assert_int_equal(cps__detector_tick(d, 2100, dead, 4), 0);
    cps__detector_destroy(d);
}

static void restart_grants_grace(void **state)
{
    (void)state;
    cps__detector *d = make(300, 2000);
    uint32_t dead[4];
    cps__detector_watch(d, 1, 0);
    cps__detector_restart(d, 10000);
    assert_int_equal(cps__detector_tick(d, 11500, dead, 4), 0); /* within grace */
    assert_int_equal(cps__detector_tick(d, 12001, dead, 4), 1);
    cps__detector_destroy(d);
}

static void refresh_after_our_own_stall(void **state)
{
    (void)state;
    cps__detector *d = make(300, 5000);
    uint32_t dead[4];
    cps__detector_watch(d, 1, 0);
    cps__detector_watch(d, 2, 0);
    cps__detector_heard(d, 2, 900);
    /* We were stopped from 100 to 1000: nobody is to blame for that silence. */
    cps__detector_refresh(d, 1000);
    assert_int_equal(cps__detector_tick(d, 1300, dead, 4), 0);
    /* No grace beyond the normal timeout: a node that stays silent is still caught. */
    assert_int_equal(cps__detector_tick(d, 1301, dead, 4), 2);
    cps__detector_destroy(d);
}

static void forget_and_cap(void **state)
{
    (void)state;
    cps__detector *d = make(10, 0);
    uint32_t dead[2];
    for (uint32_t i = 1; i <= 5; i++)
        cps__detector_watch(d, i, 0);
    cps__detector_forget(d, 3);
    cps__detector_forget(d, 99);
    assert_int_equal(cps__detector_silence(d, 3, 5), UINT64_MAX);
    size_t total = 0;
    total += cps__detector_tick(d, 100, dead, 2);
    total += cps__detector_tick(d, 100, dead, 2);
    total += cps__detector_tick(d, 100, dead, 2);
    assert_int_equal(total, 4);
    cps__detector_config bad = {0, 0};
    cps__detector *x;
    assert_int_equal(cps__detector_create(&bad, &x), CPS_EINVAL);
    cps__detector_destroy(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(silent_node_is_declared_dead_once),
        cmocka_unit_test(heartbeats_keep_a_node_alive),
        cmocka_unit_test(restart_grants_grace),
        cmocka_unit_test(gone_node_is_dead_at_once),
        cmocka_unit_test(refresh_after_our_own_stall),
        cmocka_unit_test(forget_and_cap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
