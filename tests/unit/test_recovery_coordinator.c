/* unit.recovery_coordinator: the scheduler's whole protocol (recovery/coordinator.h), one
 * executable whose tests are in tests/unit/recovery_coordinator/, one file per topic. */
#include "recovery_coordinator/fixture.h"

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_job_starts_with_a_persisted_view_then_welcomes),
        cmocka_unit_test(a_view_that_cannot_be_saved_is_held),
        cmocka_unit_test(a_silent_server_leaves_every_chain_and_repairs_start),
        cmocka_unit_test(joiners_caught_up_together_go_out_in_one_view),
        cmocka_unit_test(a_tail_that_never_confirms_leaves_its_chain),
        cmocka_unit_test(a_barrier_waits_for_every_live_worker),
        cmocka_unit_test(the_job_ends_when_every_worker_finished),
        cmocka_unit_test(views_say_whether_the_missing_workers_finished),
        cmocka_unit_test(a_gone_worker_is_dead_unless_it_finished),
        cmocka_unit_test(a_drain_needs_room_and_moves_the_ranges),
        cmocka_unit_test(a_new_life_is_a_death_then_a_return),
        cmocka_unit_test(an_unanswered_probe_is_a_death),
        cmocka_unit_test(a_late_probe_answer_is_asked_again_not_a_death),
        cmocka_unit_test(an_empty_last_replica_is_kept_out_not_rolled_back),
        cmocka_unit_test(a_kept_out_empty_server_is_not_logged_on_every_retry),
        cmocka_unit_test(an_empty_last_replica_with_no_fallback_is_kept_out),
        cmocka_unit_test(a_restarted_coordinator_resumes_from_its_blobs),
        cmocka_unit_test(a_restarted_coordinator_remembers_the_fallback),
        cmocka_unit_test(allow_rollback_gives_the_range_to_its_fallback_and_says_so),
        cmocka_unit_test(allow_rollback_is_no_consent_for_a_later_incident),
        cmocka_unit_test(an_empty_fallback_is_no_fallback),
        cmocka_unit_test(the_fallback_stays_until_the_joiner_confirms),
        cmocka_unit_test(a_restarted_coordinator_keeps_unconfirmed_tails),
        cmocka_unit_test(a_job_short_of_nodes_gives_up),
        cmocka_unit_test(a_restore_releases_the_held_workers_and_is_acknowledged),
        cmocka_unit_test(tools_are_told_from_members),
        cmocka_unit_test(status_reports_the_view_ages_and_the_checkpoint),
        cmocka_unit_test(workers_declare_tensors_and_tools_list_them),
        cmocka_unit_test(an_unsent_join_is_retried_at_the_next_repair),
        cmocka_unit_test(metrics_count_what_the_view_holds),
        cmocka_unit_test(status_names_each_copy_and_its_source),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
