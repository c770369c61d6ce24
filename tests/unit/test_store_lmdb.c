/* unit.store_lmdb: the LMDB parameter store (src/store/store.h), one executable whose tests are in
 * tests/unit/store_lmdb/, one file per topic: records, map growth, persistence and damage,
 * checkpoint restore and snapshots, a full disk. Every test gets a fresh directory under $TMPDIR
 * and removes it afterwards. */
#include "store_lmdb/fixture.h"

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_create_get_apply_read),
        T(test_create_idempotent),
        T(test_errors),
        T(test_ranges_dedup_meta),
        T(test_scan),
        T(test_checksum),
        T(test_map_growth),
        T(test_reserve_once),
        T(test_background_sync),
        T(test_reopen),
        T(test_corrupt),
        T(test_open_errors),
        T(test_reset_and_write_slices),
        T(test_snapshot_sees_its_moment),
        T(test_room_follows_live_data),
        T(test_disk_full_growth),
        T(test_disk_full_open),
        T(test_sigbus_guard),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
