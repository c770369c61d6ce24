/* unit.replication_collective: the workers' all-reduce ring (replication/collective.h), one
 * executable whose tests are in tests/unit/replication_collective/, one file per topic. */
#include "replication_collective/fixture.h"

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunking),
        cmocka_unit_test(test_ring_bits),
        cmocka_unit_test_teardown(test_ring_bits_built, hook_off),
        cmocka_unit_test(test_late_starter_and_sequence),
        cmocka_unit_test(test_kill_any_phase),
        cmocka_unit_test_teardown(test_kill_any_phase_built, hook_off),
        cmocka_unit_test(test_replacement_joins),
        cmocka_unit_test(test_alone_and_errors),
        cmocka_unit_test_teardown(test_written_pieces_and_placed_chunks, hook_off),
        cmocka_unit_test_teardown(test_place_only_the_plain_case, hook_off),
        cmocka_unit_test(test_epochs),
        cmocka_unit_test(test_joiner_restart_in_drain),
        cmocka_unit_test(test_joiner_listens_after_view),
        cmocka_unit_test(test_given_seq_asks_and_keeps),
        cmocka_unit_test(test_next_seq_waits_for_no_calls),
        cmocka_unit_test(test_adopted_result_answers_restart),
        cmocka_unit_test(test_given_seq_helps_skipped),
        cmocka_unit_test(test_joiner_stays_where_its_input_went),
        cmocka_unit_test(test_listeners_agree),
        cmocka_unit_test(test_listeners_follow_pin),
        cmocka_unit_test(test_idle_joiner_asks_for_a_restart),
        cmocka_unit_test(test_listening_joiner_takes_a_result),
        cmocka_unit_test(test_listener_ignores_an_older_result),
        cmocka_unit_test(test_listen_in_a_completed_collective_gets_the_result),
        cmocka_unit_test(test_lost_chunk_taken_from_a_result),
        cmocka_unit_test(test_lost_when_idle_asks_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
