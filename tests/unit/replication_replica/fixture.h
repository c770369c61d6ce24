/* The replica's test fixture (tests/unit/test_replication_replica.c): a store faked in memory,
 * views, requests, and the shell's part (perform) done the way the server shell does it. */
#ifndef CPS_TEST_REPLICATION_REPLICA_FIXTURE_H
#define CPS_TEST_REPLICATION_REPLICA_FIXTURE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "replication/replica.h"

#define SELF 1u

#define W1 9u

#define W2 10u

#define KEY 5u

/* The fake store: key KEY (2 values) once declared, and what WRITE items leave. */
typedef struct fake {
    int declared;
    uint64_t seq[2];
    uint32_t ids[2][16]; /* exactly-once records: ids[r][i] -> vals[r][i] */
    uint64_t vals[2][16];
    uint32_t nrec[2];
    uint64_t agg_sig[2], agg_step[2];
    int released, owners;
    int msgs, msgs_freed; /* SEND buffers from msg_alloc, and those sent (freed by perform) */
} fake;

extern int fail_next_item;

int f_seq(void *ctx, uint32_t range, uint64_t *seq);

uint64_t *rec(fake *f, uint32_t range, uint32_t id, int add);

int f_dedup(void *ctx, uint32_t range, uint32_t id, uint64_t *seq);

int f_agg(void *ctx, uint32_t range, uint64_t sig, uint64_t *step);

int f_check(void *ctx, const cps__kv *kv, const cps__param_spec *spec, uint64_t *bad,
            uint32_t *have);

int f_scan(void *ctx, uint32_t range, int (*fn)(void *arg, uint32_t id, uint64_t value), void *arg);

void f_add(void *ctx, float *acc, const float *x, size_t n);

void f_release(void *ctx, void *owner);

void *f_alloc(void *ctx, uint32_t to, size_t len);

cps__replica *new_replica(fake *f);

/* Servers 1 and 2, workers 9 and 10 (ranks 0 and 1); `nranges` ranges served by server 1
 * alone, except range 1 by server 2 when `moved`. */
void make_view(cps__view *v, uint64_t epoch, uint32_t mode, uint32_t nranges, int moved);

void set_view(cps__replica *r, uint64_t epoch, uint32_t mode, uint32_t nranges, int moved,
              int fresh);

/* A message from `from` of `key` in `range` with values {a, b} (none for a pull), owned by the
 * replica. */
cps__replica_msg request_of(fake *f, uint8_t type, uint32_t from, uint64_t epoch, uint64_t req,
                            uint64_t step, float a, float b, uint64_t key, uint32_t range);

/* The same of KEY, in range 0. */
cps__replica_msg request(fake *f, uint8_t type, uint32_t from, uint64_t epoch, uint64_t req,
                         uint64_t step, float a, float b);

/* Perform the ready list on the fake store; returns the kinds in order as a string (W S R A D L
 * P C I for WRITE SEND REPLY ASK_VIEW DROP_RANGE LOG SNAPSHOT JOIN_CLEAR JOIN_INSTALL, LOG left
 * out). */
const char *perform(cps__replica *r, fake *f);

const cps__replica_out *item(cps__replica *r, int kind, size_t nth);

void finish(cps__replica *r, fake *f);

/* The tests, by file. */
/* messages.c */
void a_push_is_written_before_it_is_acknowledged(void **state);
void the_head_forwards_before_it_writes_and_then_says_it_applied(void **state);
void a_turn_of_updates_sends_one_mark_per_range_with_the_highest_seq(void **state);
void a_held_mark_goes_before_another_ranges_update(void **state);
void an_undeclared_key_becomes_a_skip_answered_with_its_error(void **state);
void a_message_of_a_future_epoch_waits_for_its_view(void **state);
void deferred_requests_are_stepped_after_the_first_view(void **state);
void a_sync_step_is_written_once_with_the_sum(void **state);
void a_push_pull_reply_waits_for_the_slowest_worker(void **state);
void a_retried_push_pull_is_not_answered_before_commit(void **state);
void a_tick_with_an_earlier_clock_does_not_resend(void **state);
void a_range_moved_away_is_dropped(void **state);
void a_put_verdict_says_not_head_before_any_record_is_read(void **state);
void a_request_for_a_stale_epoch_or_another_head_is_refused(void **state);
void a_send_without_room_in_the_ready_list_takes_no_buffer(void **state);
void a_join_is_decided_by_the_replica_and_performed_by_the_shell(void **state);
void a_snapshot_stream_with_a_gap_is_not_installed(void **state);
/* fence.c */
void a_replica_not_let_in_takes_only_its_welcome(void **state);
void an_unsure_replica_asks_and_drops_until_confirmed(void **state);
void a_view_counting_us_dead_fences_the_replica(void **state);
void a_view_taking_a_range_yields_its_drop(void **state);
void a_snapshot_socket_closes_only_when_the_joiner_needs_nothing_more(void **state);

#endif
