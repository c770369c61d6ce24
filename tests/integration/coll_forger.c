/* coll_forger: an outsider's all-reduce ring chunks (CPS_MSG_COLL), for auth.coll_forge
 * (coll_forge.sh). Sends to a worker's inbox, through a real nanomsg socket, one all-gather chunk
 * (CPS_COLL_DATA) of `count` values for every claimed sender id in [1, senders] and sequence
 * number in [seq_from, seq_to], under view epoch `epoch` and message index `index`: headers a
 * worker's ring would take, so that one naming the running collective's next chunk reaches its
 * check-while-copying path (cps__coll_place). Every value is 1e30, which would show in any
 * result that took one. Sealed with the secret in KEYFILE (another job's), or, with "none",
 * with a zeroed trailer as an --insecure node sends.
 *
 * usage: coll_forger URL KEYFILE|none N COUNT SENDERS EPOCH SEQ_FROM SEQ_TO INDEX
 * Exits 0 once every message left (or 10 s passed), 2 on bad arguments, 1 on a local failure. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/wire.h"
#include "node/msg.h"
#include "replication/collective.h"
#include "transport/auth.h"
#include "transport/transport.h"

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int arg_u64(const char *s, uint64_t *out)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *end)
        return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    uint64_t n, count, senders, epoch, from, to, index;
    if (argc != 10 || arg_u64(argv[3], &n) || arg_u64(argv[4], &count) ||
        arg_u64(argv[5], &senders) || arg_u64(argv[6], &epoch) || arg_u64(argv[7], &from) ||
        arg_u64(argv[8], &to) || arg_u64(argv[9], &index) || count == 0 || count > n ||
        count > (1u << 26) || senders == 0 || from > to) {
        fprintf(stderr, "usage: coll_forger URL KEYFILE|none N COUNT SENDERS EPOCH SEQ_FROM "
                        "SEQ_TO INDEX\n");
        return 2;
    }
    unsigned char key[CPS_AUTH_KEY_SIZE];
    int keyed = strcmp(argv[2], "none") != 0;
    char err[768];
    if (keyed && cps__auth_load_file(argv[2], key, err, sizeof err) != 0) {
        fprintf(stderr, "coll_forger: %s\n", err);
        return 1;
    }
    float *vals = malloc(count * sizeof *vals);
    cps__tp *tp;
    if (!vals || cps__tp_create(keyed ? key : NULL, &tp) != 0) {
        fprintf(stderr, "coll_forger: no memory or no transport\n");
        return 1;
    }
    for (uint64_t j = 0; j < count; j++)
        vals[j] = 1e30f;
    int rc = cps__tp_peer_set(tp, 0, argv[1]);
    uint64_t sent = 0;
    for (uint32_t id = 1; rc == 0 && id <= senders; id++)
        for (uint64_t seq = from; rc == 0 && seq <= to; seq++) {
            cps__msg_hdr h = {.type = CPS_MSG_COLL,
                              .sender = id,
                              .epoch = epoch,
                              .req_worker = id,
                              .req_seq = seq,
                              .range = CPS_COLL_DATA,
                              .step = index,
                              .aux = n};
            rc = cps__msg_send(tp, 0, &h, vals, count * sizeof *vals);
            sent += rc == 0;
        }
    uint64_t end = now_ms() + 10000;
    while (cps__tp_queued(tp) && now_ms() < end)
        cps__tp_poll(tp, 20, NULL, NULL, 0);
    printf("coll_forger: %llu COLL messages of %llu values sent to %s (%s), %zu still queued\n",
           (unsigned long long)sent, (unsigned long long)count, argv[1],
           keyed ? "another job's secret" : "no MAC", cps__tp_queued(tp));
    cps__tp_destroy(tp);
    free(vals);
    return rc == 0 ? 0 : 1;
}
