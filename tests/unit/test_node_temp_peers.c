/* Temporary peers (tools, exporters): an id is never pointed at another inbox while its linger
 * runs, since re-pointing drops what the transport still queues for it (an export's answer two
 * exporters apart was cut off that way). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "node/temp_peers.h"

static const unsigned char KEY[32] = {1};

static void an_inbox_keeps_its_id_while_it_lingers(void **state)
{
    (void)state;
    cps__tp *tp;
    assert_int_equal(cps__tp_create(KEY, &tp), 0);
    cps__temp_peers t = {0};
    uint32_t a = cps__temp_peer_add(&t, tp, "tcp://127.0.0.1:40001", 1000);
    assert_int_not_equal(a, 0);
    /* The same inbox asking again gets the same id: nothing queued for it is dropped. */
    assert_int_equal(cps__temp_peer_add(&t, tp, "tcp://127.0.0.1:40001", 2000), a);
    uint32_t b = cps__temp_peer_add(&t, tp, "tcp://127.0.0.1:40002", 2000);
    assert_int_not_equal(b, 0);
    assert_int_not_equal(b, a);
    cps__tp_destroy(tp);
}

static void a_lingering_id_is_not_taken_by_another_inbox(void **state)
{
    (void)state;
    cps__tp *tp;
    assert_int_equal(cps__tp_create(KEY, &tp), 0);
    cps__temp_peers t = {0};
    uint32_t first = 0;
    char addr[64];
    for (uint32_t i = 0; i < CPS_TEMP_PEERS; i++) {
        snprintf(addr, sizeof addr, "tcp://127.0.0.1:%u", 41000 + i);
        uint32_t id = cps__temp_peer_add(&t, tp, addr, 1000);
        assert_int_not_equal(id, 0);
        if (i == 0)
            first = id;
    }
    /* Every id lingers: a new inbox is refused rather than given one of them. */
    assert_int_equal(cps__temp_peer_add(&t, tp, "tcp://127.0.0.1:42000", 1000 + 10), 0);
    /* A send to the first one starts its linger again: once the others' lingers are over, the
     * first keeps its id and the new inbox gets another. */
    cps__temp_peer_touch(&t, first, 1000 + CPS_TEMP_PEER_LINGER_MS - 1);
    uint64_t later = 1000 + CPS_TEMP_PEER_LINGER_MS + 1;
    cps__temp_peers_expire(&t, tp, later);
    uint32_t id = cps__temp_peer_add(&t, tp, "tcp://127.0.0.1:42000", later);
    assert_int_not_equal(id, 0);
    assert_int_not_equal(id, first);
    assert_int_equal(cps__temp_peer_add(&t, tp, "tcp://127.0.0.1:41000", later), first);
    cps__tp_destroy(tp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(an_inbox_keeps_its_id_while_it_lingers),
        cmocka_unit_test(a_lingering_id_is_not_taken_by_another_inbox),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
