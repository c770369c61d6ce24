/* unit.transport_ring: shared-memory rings (transport/ring.h): descriptors, slots around the
 * ring, refusals of stale and out-of-range descriptors, a sender's restart, and large messages
 * between two transports of one runtime directory arriving from the ring, with a full ring
 * falling back to inline. Every wait has a deadline. The tests are in tests/unit/transport_ring/:
 * ring.c the ring alone, two_transports.c through two transports. */
#include "transport_ring/fixture.h"

int main(void)
{
    cps__log_set_sink(quiet_sink, NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(desc_round_trip_and_refusals),
        cmocka_unit_test_setup_teardown(ring_file_private, setup, teardown),
        cmocka_unit_test_setup_teardown(wrap_around, setup, teardown),
        cmocka_unit_test_setup_teardown(full_ring, setup, teardown),
        cmocka_unit_test_setup_teardown(reclaim_before_a_break, setup, teardown),
        cmocka_unit_test_setup_teardown(refused_slot_given_back, setup, teardown),
        cmocka_unit_test_setup_teardown(destroy_spares_successor, setup, teardown),
        cmocka_unit_test_setup_teardown(bounds_of_mappings, setup, teardown),
        cmocka_unit_test_setup_teardown(stale_generation_and_restart, setup, teardown),
        cmocka_unit_test_setup_teardown(transport_ring_and_fallback, setup, teardown),
        cmocka_unit_test_setup_teardown(transport_inline_off_tmpfs, setup, teardown),
        cmocka_unit_test_setup_teardown(reserve_commit_abandon, setup, teardown),
        cmocka_unit_test_setup_teardown(transport_reserve, setup, teardown),
        cmocka_unit_test_setup_teardown(transport_fill_local, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
