/* The coordinator's test fixture (tests/unit/test_recovery_coordinator.c): a job of 4 servers
 * and 2 workers made, stepped and ticked, and what the tests read back. */
#ifndef CPS_TEST_RECOVERY_COORDINATOR_FIXTURE_H
#define CPS_TEST_RECOVERY_COORDINATOR_FIXTURE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "core/config.h"
#include "core/log.h"
#include "core/wire.h"
#include "recovery/coordinator.h"
#include "recovery/view_change.h"

/* A job of 4 servers (ids 1..4, ranks 0..3), chains of 3 over 4 ranges, and 2 workers (ids 5, 6);
 * heartbeats declared missing after 400 ms. */
#define DEAD_MS 400

/* Server 1 of a job of 4 servers and 2 workers dies at t; the nj joiners that replace it become
 * tails (their joins and peers), and the first of them confirms it caught up at t + 200. */
typedef struct joined {
    cps__msg_hdr joins[8];
    uint32_t peers[8];
    uint64_t t;
    uint32_t nj;
} joined;

typedef struct store {
    const char *names[CPS_COORD_BLOBS];
    cps__coord_blob b[CPS_COORD_BLOBS];
    unsigned char *copy[CPS_COORD_BLOBS];
    int n; /* blobs the store holds: fewer, a store of an earlier build */
} store;

extern cps__config cfg;
extern int hold; /* the next make() holds the workers back until a RELEASE (--restore-from) */
extern uint32_t replicas;      /* the chains' length of the next make() */
extern int allow_rollback;     /* the next make() runs with --allow-rollback */
extern int await_replacements; /* the next make() runs with --await-replacements */

cps__coord *make(uint32_t servers, uint32_t workers);

/* Count the actions of `kind` (and of message type `type`, 0: any) in the output. */
size_t count(cps__coord *c, int kind, uint8_t type);

const cps__coord_action *find(cps__coord *c, int kind, uint8_t type, uint32_t peer);

/* How many lines of the output's log hold `what` (at `level`; -1: any). */
/* A tool's request `q` (from its temporary peer `tool`) at `now`: the reply of type `reply`. */
const cps__coord_action *ask(cps__coord *c, const cps__msg_hdr *q, uint8_t reply, uint32_t tool,
                             uint64_t now);

int logged_at(cps__coord *c, int level, const char *what);

int logged(cps__coord *c, const char *what);

/* The shell's part: persist (succeeding or failing with `rc`), then empty the output. */
void perform(cps__coord *c, int rc, uint64_t now);

void done(cps__coord *c);

/* A HELLO with CPS_HELLO_* flags (a server that found its store empty). */
void hello_flags(cps__coord *c, uint32_t role, uint32_t port, uint64_t boot, uint32_t flags,
                 uint64_t now);

void hello(cps__coord *c, uint32_t role, uint32_t port, uint64_t boot, uint64_t now);

void msg(cps__coord *c, uint8_t type, uint32_t from, uint64_t now);

/* Server 1 goes silent while nodes 2..6 beat, until the view changes: the time it did. */
uint64_t silence_server_1(cps__coord *c);

/* Servers 1..servers (ports 7000.., lives 100..), then workers (ports 8000..) say HELLO at 0. */
void all_say_hello(cps__coord *c, uint32_t servers, uint32_t workers);

/* Every node says HELLO; the job starts. */
cps__coord *running(uint32_t servers, uint32_t workers);

/* running(), with chains of two. */
cps__coord *running_in_pairs(uint32_t servers, uint32_t workers);

/* A job of 4 servers and 2 workers whose server 1 fell silent and was declared dead at *t: the
 * repair that follows is performed. */
cps__coord *server_1_silenced(uint64_t *t);

/* Server 1 of running(4, 2) went silent at t; the joiners that repair its ranges report their
 * snapshots installed within the batch window and become tails in one view (not one each) at
 * t + 120. Returns how many (joins[k], peers[k]: the orders and whom they went to). */
uint32_t joiners_become_tails(cps__coord *c, uint64_t t, cps__msg_hdr joins[8], uint32_t peers[8]);

/* Joiner peers[k] says it holds everything its predecessor acknowledged (CAUGHT_UP, aux 1) for
 * the join joins[k], at `now`. */
void confirm(cps__coord *c, const cps__msg_hdr *joins, const uint32_t *peers, uint32_t k,
             uint64_t now);

cps__coord *first_joiner_confirmed(joined *jt);

/* Servers 1 and 2 hold every range; server 1 goes silent and is declared dead (each chain: 2).
 * Returns the coordinator with that view out. */
cps__coord *two_servers_one_dead(void);

int get(void *ctx, const char *name, const void **data, size_t *len);

/* The tests, by file. */
/* membership.c */
void the_job_starts_with_a_persisted_view_then_welcomes(void **state);
void a_view_that_cannot_be_saved_is_held(void **state);
void a_silent_server_leaves_every_chain_and_repairs_start(void **state);
void joiners_caught_up_together_go_out_in_one_view(void **state);
void a_tail_that_never_confirms_leaves_its_chain(void **state);
void a_barrier_waits_for_every_live_worker(void **state);
void the_job_ends_when_every_worker_finished(void **state);
void views_say_whether_the_missing_workers_finished(void **state);
void a_drain_needs_room_and_moves_the_ranges(void **state);
void a_new_life_is_a_death_then_a_return(void **state);
/* deaths.c */
void an_unanswered_probe_is_a_death(void **state);
void a_late_probe_answer_is_asked_again_not_a_death(void **state);
void an_empty_last_replica_is_kept_out_not_rolled_back(void **state);
void a_kept_out_empty_server_is_not_logged_on_every_retry(void **state);
void an_empty_last_replica_with_no_fallback_is_kept_out(void **state);
/* restart.c */
void a_restarted_coordinator_resumes_from_its_blobs(void **state);
void a_restarted_coordinator_remembers_the_fallback(void **state);
void allow_rollback_gives_the_range_to_its_fallback_and_says_so(void **state);
void allow_rollback_is_no_consent_for_a_later_incident(void **state);
void an_empty_fallback_is_no_fallback(void **state);
void the_fallback_stays_until_the_joiner_confirms(void **state);
void a_restarted_coordinator_keeps_unconfirmed_tails(void **state);
/* tools.c */
void a_job_short_of_nodes_gives_up(void **state);
void a_restore_releases_the_held_workers_and_is_acknowledged(void **state);
void a_gone_worker_is_dead_unless_it_finished(void **state);
void tools_are_told_from_members(void **state);
void status_reports_the_view_ages_and_the_checkpoint(void **state);
void workers_declare_tensors_and_tools_list_them(void **state);
void an_unsent_join_is_retried_at_the_next_repair(void **state);
void metrics_count_what_the_view_holds(void **state);
void status_names_each_copy_and_its_source(void **state);

#endif
