/* Message authentication's test fixture (tests/unit/test_transport_auth.c): the job keys, sealed
 * messages, a wrapped nn_reallocmsg, and an inbox pumped through real sockets on 127.0.0.1. */
#ifndef CPS_TEST_TRANSPORT_AUTH_FIXTURE_H
#define CPS_TEST_TRANSPORT_AUTH_FIXTURE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include <nanomsg/nn.h>
#include <nanomsg/pipeline.h>
#include <openssl/evp.h>

#include "chainps/error.h"
#include "core/log.h"
#include "core/wire.h"
#include "transport/auth.h"
#include "transport/frame.h"
#include "transport/transport.h"

#define HOST    "127.0.0.1"
#define WAIT_MS 5000
#define BODY    200

/* nanomsg before 1.1 moved a chunk it was asked to shorten; the one installed cuts it in place.
 * Linked with --wrap=nn_reallocmsg (tests/CMakeLists.txt), the next call moves the chunk when
 * `realloc_move` is set, as an old nanomsg did, and counts it in `realloc_moved`. */
void *__real_nn_reallocmsg(void *msg, size_t size);
void *__wrap_nn_reallocmsg(void *msg, size_t size);

/* ---- through sockets ---- */
typedef struct inbox {
    int n;
    size_t last_len;
    unsigned char last[BODY];
} inbox;

extern const unsigned char KEY[32];
extern const unsigned char OTHER[32];
extern int realloc_move, realloc_moved;

/* A message of BODY bytes and room for the trailer. */
unsigned char *message(uint32_t seed);

int open_copy(cps__auth *rx, const unsigned char *m, size_t len);

void keep(void *ctx, void *buf, size_t len);

uint64_t now_ms(void);

/* Poll rcv (and flush snd) for up to ms; returns what was delivered. */
void pump(cps__tp *snd, cps__tp *rcv, inbox *ib, int want, int ms);

/* What a chainps of wire version 3 sent: a trailer sealed with GMAC (AES-128-GCM, the message as
 * additional data) under the first 16 bytes of SHA-256("chainps message key v1\0" | job key |
 * salt), nonce = counter (le64) | 0000. */
void seal_v3(unsigned char *m, size_t len, const unsigned char *key, uint64_t counter);

/* A wire header at the start of m (a heartbeat whose payload fills the BODY bytes) of `version`. */
void header(unsigned char *m, uint8_t version);

/* The tests, by file. */
/* macs.c */
void sealed_opens_and_every_changed_byte_fails(void **state);
void trailer_is_the_documented_construction(void **state);
void other_wire_version_is_named(void **state);
void other_key_and_unsigned_are_refused(void **state);
void replays_are_refused_reordering_is_not(void **state);
void many_senders(void **state);
void secret_files(void **state);
/* sockets.c */
void sockets_deliver_ours_drop_the_rest(void **state);
void forwarded_buffer_is_resealed(void **state);
void old_version_peer_is_logged_as_such(void **state);
/* copies.c */
void fused_copy_is_the_same_mac(void **state);
void fill_macs_as_it_copies(void **state);
/* deferred.c */
void deferred_check_rides_on_the_copy(void **state);
/* vector_state.c */
void mac_leaves_vector_state_clean(void **state);

#endif
