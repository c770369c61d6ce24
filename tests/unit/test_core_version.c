/* The library's version answers agree with the public headers' macros, and the integer macros
 * order versions as the string does. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "chainps/chainps.h"
#include "core/wire.h"

static void string_matches_the_macros(void **state)
{
    (void)state;
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", CHAINPS_VERSION_MAJOR, CHAINPS_VERSION_MINOR,
             CHAINPS_VERSION_PATCH);
    assert_string_equal(cps_version(), want);
}

static void number_matches_the_macros(void **state)
{
    (void)state;
    assert_int_equal(cps_version_number(), CHAINPS_VERSION);
    assert_int_equal(CHAINPS_VERSION, CHAINPS_VERSION_MAJOR * 10000 + CHAINPS_VERSION_MINOR * 100 +
                                          CHAINPS_VERSION_PATCH);
    /* The string parsed back gives the same integer: the two queries cannot drift apart. */
    int maj = -1, min = -1, pat = -1;
    assert_int_equal(sscanf(cps_version(), "%d.%d.%d", &maj, &min, &pat), 3);
    assert_int_equal(maj * 10000 + min * 100 + pat, cps_version_number());
}

static void at_least_orders_versions(void **state)
{
    (void)state;
    assert_true(CHAINPS_VERSION_AT_LEAST(CHAINPS_VERSION_MAJOR, CHAINPS_VERSION_MINOR,
                                         CHAINPS_VERSION_PATCH));
    assert_true(CHAINPS_VERSION_AT_LEAST(0, 0, 0));
    assert_false(CHAINPS_VERSION_AT_LEAST(CHAINPS_VERSION_MAJOR, CHAINPS_VERSION_MINOR,
                                          CHAINPS_VERSION_PATCH + 1));
    assert_false(CHAINPS_VERSION_AT_LEAST(CHAINPS_VERSION_MAJOR + 1, 0, 0));
#if !CHAINPS_VERSION_AT_LEAST(0, 1, 0)
    fail_msg("CHAINPS_VERSION_AT_LEAST is not usable in #if");
#endif
}

static void wire_version_matches_the_codec(void **state)
{
    (void)state;
    assert_int_equal(cps_wire_version(), CHAINPS_WIRE_VERSION);
    assert_int_equal(cps_wire_version(), CPS_WIRE_VERSION);
    /* What the encoder really writes into byte 4 of a header. */
    uint8_t hdr[CPS_WIRE_HDR_SIZE];
    cps__msg_hdr h;
    memset(&h, 0, sizeof h);
    h.type = CPS_MSG_HEARTBEAT;
    cps__wire_hdr_encode(hdr, &h);
    assert_int_equal(hdr[4], cps_wire_version());
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(string_matches_the_macros),
        cmocka_unit_test(number_matches_the_macros),
        cmocka_unit_test(at_least_orders_versions),
        cmocka_unit_test(wire_version_matches_the_codec),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
