/* unit.replication_replica: the replica as the server shell drives it, on a store faked in
 * memory: what a message becomes, and in which order the ready list says it. The tests are in
 * tests/unit/replication_replica/: messages.c the protocol, fence.c the fence inside it. */
#include "replication_replica/fixture.h"

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_push_is_written_before_it_is_acknowledged),
        cmocka_unit_test(the_head_forwards_before_it_writes_and_then_says_it_applied),
        cmocka_unit_test(a_turn_of_updates_sends_one_mark_per_range_with_the_highest_seq),
        cmocka_unit_test(a_held_mark_goes_before_another_ranges_update),
        cmocka_unit_test(an_undeclared_key_becomes_a_skip_answered_with_its_error),
        cmocka_unit_test(a_message_of_a_future_epoch_waits_for_its_view),
        cmocka_unit_test(deferred_requests_are_stepped_after_the_first_view),
        cmocka_unit_test(a_sync_step_is_written_once_with_the_sum),
        cmocka_unit_test(a_push_pull_reply_waits_for_the_slowest_worker),
        cmocka_unit_test(a_retried_push_pull_is_not_answered_before_commit),
        cmocka_unit_test(a_tick_with_an_earlier_clock_does_not_resend),
        cmocka_unit_test(a_send_without_room_in_the_ready_list_takes_no_buffer),
        cmocka_unit_test(a_range_moved_away_is_dropped),
        cmocka_unit_test(a_request_for_a_stale_epoch_or_another_head_is_refused),
        cmocka_unit_test(a_join_is_decided_by_the_replica_and_performed_by_the_shell),
        cmocka_unit_test(a_snapshot_stream_with_a_gap_is_not_installed),
        cmocka_unit_test(a_replica_not_let_in_takes_only_its_welcome),
        cmocka_unit_test(an_unsure_replica_asks_and_drops_until_confirmed),
        cmocka_unit_test(a_view_counting_us_dead_fences_the_replica),
        cmocka_unit_test(a_view_taking_a_range_yields_its_drop),
        cmocka_unit_test(a_snapshot_socket_closes_only_when_the_joiner_needs_nothing_more),
        cmocka_unit_test(a_put_verdict_says_not_head_before_any_record_is_read),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
