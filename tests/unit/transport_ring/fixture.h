/* The shared-memory ring's test fixture (tests/unit/test_transport_ring.c): a private runtime
 * directory per test, made by setup and removed by teardown. */
#ifndef CPS_TEST_TRANSPORT_RING_FIXTURE_H
#define CPS_TEST_TRANSPORT_RING_FIXTURE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "core/log.h"
#include "core/wire.h"
#include "transport/ring.h"
#include "transport/transport.h"
#include "../transport_test.h"

#define HOST "127.0.0.1"

#define WAIT_MS 5000

#define RING_ID 0x1234abcdull

typedef struct fixture {
    char dir[64];
} fixture;

int setup(void **state);

int teardown(void **state);

/* The tests, by file. */
/* ring.c */
void desc_round_trip_and_refusals(void **state);
void ring_file_private(void **state);
void wrap_around(void **state);
void full_ring(void **state);
void refused_slot_given_back(void **state);
void destroy_spares_successor(void **state);
void bounds_of_mappings(void **state);
void reclaim_before_a_break(void **state);
void stale_generation_and_restart(void **state);
void reserve_commit_abandon(void **state);
/* two_transports.c */
void transport_ring_and_fallback(void **state);
void transport_reserve(void **state);
void transport_fill_local(void **state);
void transport_inline_off_tmpfs(void **state);

#endif
