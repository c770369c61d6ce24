/* Message authentication (src/transport/auth.c): the MAC trailer, replays, other jobs' keys and
 * unsigned senders, on buffers and through real sockets on 127.0.0.1. */
#include "transport_auth/fixture.h"

int main(void)
{
    cps__log_set_level(CPS_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sealed_opens_and_every_changed_byte_fails),
        cmocka_unit_test(trailer_is_the_documented_construction),
        cmocka_unit_test(fused_copy_is_the_same_mac),
        cmocka_unit_test(fill_macs_as_it_copies),
        cmocka_unit_test(other_key_and_unsigned_are_refused),
        cmocka_unit_test(other_wire_version_is_named),
        cmocka_unit_test(replays_are_refused_reordering_is_not),
        cmocka_unit_test(many_senders),
        cmocka_unit_test(secret_files),
        cmocka_unit_test(sockets_deliver_ours_drop_the_rest),
        cmocka_unit_test(forwarded_buffer_is_resealed),
        cmocka_unit_test(deferred_check_rides_on_the_copy),
        cmocka_unit_test(old_version_peer_is_logged_as_such),
        cmocka_unit_test(mac_leaves_vector_state_clean),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
