/* The all-reduce ring's test fixture (tests/unit/test_replication_collective.c): an in-memory
 * ring of N members driven from one seed, the out hook, and single nodes built by hand. */
#ifndef CPS_TEST_REPLICATION_COLLECTIVE_FIXTURE_H
#define CPS_TEST_REPLICATION_COLLECTIVE_FIXTURE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "chainps/error.h"
#include "replication/collective.h"

/* ---- an in-memory ring: N endpoints, one FIFO pipe per ordered pair, random interleaving,
 * kills and late views, all from one seed ---- */
#define MAXN   6
#define MAXSEQ 4

typedef struct qmsg {
    uint32_t from, to;
    cps__coll_msg m;
    float *vals;
} qmsg;

typedef struct node {
    cps__coll *c;
    uint32_t id;
    int alive;
    uint64_t view_epoch;
    float *data[MAXSEQ]; /* input, then result, of each collective */
    int status[MAXSEQ];  /* 1 running, 0 done, < 0 failed, 2 not started */
    uint64_t seqno[MAXSEQ];
    int next; /* collectives started */
} node;

typedef struct net {
    node nodes[MAXN];
    uint32_t n;
    qmsg *q;
    size_t nq, capq;
    uint64_t rng;
    uint64_t now;
    uint64_t epoch;
    uint32_t members[MAXN];
    uint32_t nmembers;
    uint64_t len; /* values per collective */
    uint32_t chunk;
    int op;
    uint64_t hook_rng;
} net;

/* The out hook (cps__coll_set_out) the shell installs, as a test double: 0 none (the ring copies
 * from its own buffer), 1 every forwarded chunk gets a payload of its own, 2 one in three asks
 * finds no memory (the copy path for that chunk). Payloads start as NaNs: a value the ring did
 * not write shows in the result. */
extern int hook_mode;

extern long hook_out; /* payloads given and not yet sent or dropped */
/* The shell's check-while-copying path (cps__coll_place), as a test double: 1 every all-gather
 * chunk the ring would place is first "refused" (its values with a forged piece in the middle
 * copied to the place, no step, as a refused cps__tp_pending_open_copy leaves it), then taken
 * genuine (copied there again, stepped with vals at the place). */
extern int place_mode;
/* chunks placed; written hook calls (cps__coll_set_written); all-gather chunks delivered */
extern long placed, written_calls, gather_seen;
extern uint64_t kill_seeds; /* test_kill_any_phase's seeds (fewer with the hook: time) */

uint64_t rnd(net *t);

node *by_id(net *t, uint32_t id);

void perform(net *t, node *nd);

void net_init(net *t, uint32_t n, uint64_t len, uint32_t chunk, int op, uint64_t seed);

void net_fini(net *t);

void start(net *t, node *nd, int k);

/* Deliver one message: a random one among those at the head of their pipe. 0 if none. */
/* Take the next message off the queue (a random pipe, its first message). t->nq > 0. */
qmsg take_next(net *t);
int deliver_one(net *t);

void kill_node(net *t, node *nd);

void fill_inputs(net *t, int exact);

/* The sum in the ring's order over members[0..p) (positions), as collective.h states. */
void reference(net *t, float **inputs, uint32_t p, float *out);

/* A failed test leaves the hook off for the next. */
int hook_off(void **state);

/* Node 9 (chunks of any size, a 1000 ms timeout) in view `epoch` of `members`: a joiner when
 * `joining` (it fetched nothing), told the ring's next seq when `next_seq` is not 0. */
cps__coll *node9(uint64_t epoch, const uint32_t *members, uint32_t n, int joining,
                 uint64_t next_seq);

/* A message of a 2-value collective from `from`, chunk 0, carrying `count` values at `vals`. */
cps__coll_msg msg2(uint32_t from, uint32_t kind, uint64_t epoch, uint64_t seq, const float *vals,
                   uint64_t count);

/* Node 9, a joiner, running its first call over x[0..2) in the ring 10 -> 9 -> 11 (view 1). */
cps__coll *joiner_started(float *x);

/* The tests, by file. */
/* ring.c */
void test_chunking(void **state);
void test_ring_bits(void **state);
void test_ring_bits_built(void **state);
void test_late_starter_and_sequence(void **state);
void test_kill_any_phase(void **state);
void test_kill_any_phase_built(void **state);
void test_replacement_joins(void **state);
void test_alone_and_errors(void **state);
/* place.c */
void test_written_pieces_and_placed_chunks(void **state);
void test_place_only_the_plain_case(void **state);
/* joiners.c */
void test_next_seq_waits_for_no_calls(void **state);
void test_epochs(void **state);
void test_joiner_restart_in_drain(void **state);
void test_joiner_listens_after_view(void **state);
void test_given_seq_asks_and_keeps(void **state);
void test_adopted_result_answers_restart(void **state);
void test_given_seq_helps_skipped(void **state);
void test_joiner_stays_where_its_input_went(void **state);
/* listeners.c */
void test_listeners_agree(void **state);
void test_listeners_follow_pin(void **state);
void test_idle_joiner_asks_for_a_restart(void **state);
void test_listening_joiner_takes_a_result(void **state);
void test_listener_ignores_an_older_result(void **state);
void test_listen_in_a_completed_collective_gets_the_result(void **state);
/* lost.c */
void test_lost_chunk_taken_from_a_result(void **state);
void test_lost_when_idle_asks_nothing(void **state);

#endif
