/* `chainps drain`: ask the scheduler to move a server's ranges to the others and let it exit,
 * then (unless --no-wait) follow the move through the view until the server has left. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "cli.h"
#include "core/config.h"
#include "core/view.h"
#include "core/wire.h"
#include "node/msg.h"
#include "node/roles.h"
#include "transport/transport.h"

#define ANSWER_TIMEOUT_MS 3000
#define POLL_EVERY_MS     500

static const char drain_usage[] =
    "usage: chainps drain --server RANK [--scheduler HOST:PORT] [--secret-file F] [--no-wait]\n"
    "                     [--timeout SEC]\n"
    "\n"
    "Drain a server of a running job: every key range it holds is copied to another server\n"
    "(the online state transfer failover uses: training goes on), the copy joins the range's\n"
    "chain, the drained server leaves it, and once it holds nothing the scheduler tells it to\n"
    "exit (status 0). A server given SIGTERM asks for the same. Refused, with the reason, when\n"
    "the others could not hold R replicas of every range.\n"
    "\n"
    "  --server RANK      the server's rank (as `chainps status` shows it)\n"
    "  --scheduler H:P    the scheduler (default 127.0.0.1:9091; env CHAINPS_SCHEDULER, ...)\n"
    "  --no-wait          return once the scheduler accepted the drain\n"
    "  --timeout SEC      with waiting (the default): give up after SEC seconds "
    "(600)\n" CPS_CLI_SECRET_HELP "  -h, --help         this text\n"
    "\n"
    "Exit status: 0 drained (or accepted, with --no-wait), 1 refused or failed, 2 bad usage,\n"
    "3 still draining at --timeout.\n";

static const struct option drain_opts[] = {{"server", required_argument, 0, CLI_OPT_SERVER},
                                           {"scheduler", required_argument, 0, CLI_OPT_SCHEDULER},
                                           {"no-wait", no_argument, 0, CLI_OPT_NO_WAIT},
                                           {"timeout", required_argument, 0, CLI_OPT_TIMEOUT},
                                           CPS_CLI_SECRET_OPTS,
                                           {"help", no_argument, 0, 'h'},
                                           {0, 0, 0, 0}};

typedef struct answer {
    int got;
    int status;         /* the scheduler's verdict on the drain */
    uint32_t server_id; /* the drained server's node id */
    char text[256];
    int view_got;
    cps__view view;
} answer;

static void on_msg(void *ctx, void *buf, size_t len)
{
    answer *a = ctx;
    cps__rx rx;
    if (cps__rx_parse(&rx, buf, len) != 0)
        return;
    if (rx.hdr.type == CPS_MSG_ACK && !a->got) {
        a->got = 1;
        a->status = 0;
        a->server_id = (uint32_t)rx.hdr.aux;
    } else if (rx.hdr.type == CPS_MSG_ERROR && !a->got) {
        a->got = 1;
        a->status = rx.hdr.status ? rx.hdr.status : CPS_EPROTO;
        size_t n = rx.len < sizeof a->text - 1 ? rx.len : sizeof a->text - 1;
        memcpy(a->text, rx.payload, n);
        a->text[n] = '\0';
    } else if (rx.hdr.type == CPS_MSG_STATUS_REPLY && !a->view_got) {
        size_t used;
        if (cps__view_decode_prefix(rx.payload, rx.len, &a->view, &used) == 0)
            a->view_got = 1;
    }
    cps__rx_free(&rx);
}

/* Ranges whose chain names `id`. */
static uint32_t ranges_held(const cps__view *v, uint32_t id)
{
    uint32_t n = 0;
    for (uint32_t r = 0; r < v->nranges; r++)
        for (uint32_t j = 0; j < v->ranges[r].chain_len; j++)
            n += v->ranges[r].chain[j] == id;
    return n;
}

int cps__cli_drain(int argc, char **argv)
{
    cps__config cfg;
    if (cps__cli_config(&cfg) != 0)
        return 2;
    int opt, wait = 1;
    uint32_t rank = UINT32_MAX, timeout_s = 600;
    char err[256];
    optind = 1;
    while ((opt = getopt_long(argc, argv, "h", drain_opts, NULL)) != -1) {
        if (opt == 'h') {
            fputs(drain_usage, stdout);
            return 0;
        }
        if (opt == CLI_OPT_SERVER) {
            if (cps__config_parse_u32("--server", optarg, 0, CPS_MAX_NODES - 1, &rank, err,
                                      sizeof err))
                return cps__cli_usage_error("drain", "%s", err);
            continue;
        }
        if (opt == CLI_OPT_NO_WAIT) {
            wait = 0;
            continue;
        }
        if (opt == CLI_OPT_TIMEOUT) {
            if (cps__config_parse_u32("--timeout", optarg, 1, 86400, &timeout_s, err, sizeof err))
                return cps__cli_usage_error("drain", "%s", err);
            continue;
        }
        int rc = cps__cli_common_flag("drain", opt, optarg, &cfg);
        if (rc == 2)
            return 2;
        if (rc == 1)
            return cps__cli_usage_error("drain", "unknown option");
    }
    if (optind < argc)
        return cps__cli_usage_error("drain", "unexpected argument '%s'", argv[optind]);
    if (rank == UINT32_MAX)
        return cps__cli_usage_error("drain", "--server RANK is required");
    cps__config_finalize(&cfg, CPS_ROLE_NONE);
    if (cps__node_load_secret(&cfg, "drain") != 0)
        return 2;

    answer *a = calloc(1, sizeof *a);
    if (!a)
        return 1;
    cps__view_init(&a->view);
    cps__tp *tp = NULL;
    char url[CPS_ADDR_MAX + 16], me[CPS_ADDR_MAX];
    int rc = cps__cli_tool_open(&cfg, &tp, url, sizeof url, me);
    char payload[16 + CPS_ADDR_MAX];
    size_t plen = cps__hello_encode(payload, sizeof payload, CPS_ROLE_NONE, UINT32_MAX, 0, me);
    cps__msg_hdr h = {.type = CPS_MSG_DRAIN, .sender = UINT32_MAX, .aux = rank, .req_seq = 1};
    if (rc == 0)
        rc = cps__msg_send(tp, 0, &h, payload, plen);
    uint64_t deadline = cps__now_ms() + ANSWER_TIMEOUT_MS;
    while (rc == 0 && !a->got && cps__now_ms() < deadline)
        cps__tp_poll(tp, 100, on_msg, a, 0);
    int exit_code = 0;
    if (rc != 0 || !a->got) {
        fprintf(stderr,
                "chainps drain: no answer from the scheduler at %s within %.1f s%s%s (is it "
                "running, and is this the job's secret?)\n",
                url, ANSWER_TIMEOUT_MS / 1000.0, rc ? ": " : "", rc ? cps_strerror(rc) : "");
        exit_code = 1;
    } else if (a->status != 0) {
        fprintf(stderr, "chainps drain: refused: %s (%s)\n", a->text, cps_strerror(a->status));
        exit_code = 1;
    } else {
        printf("drain: server rank %u (node %u) is draining\n", rank, a->server_id);
        fflush(stdout);
    }
    uint64_t give_up = cps__now_ms() + (uint64_t)timeout_s * 1000;
    uint32_t last_held = UINT32_MAX;
    while (exit_code == 0 && wait) {
        if (cps__now_ms() >= give_up) {
            fprintf(stderr, "chainps drain: server %u still holds ranges after %u s\n",
                    a->server_id, timeout_s);
            exit_code = 3;
            break;
        }
        a->view_got = 0;
        cps__msg_hdr q = {.type = CPS_MSG_STATUS, .sender = UINT32_MAX};
        cps__msg_send(tp, 0, &q, payload, plen);
        uint64_t until = cps__now_ms() + ANSWER_TIMEOUT_MS;
        while (!a->view_got && cps__now_ms() < until)
            cps__tp_poll(tp, 100, on_msg, a, 0);
        if (a->view_got) {
            const cps__node_info *n = cps__view_node(&a->view, a->server_id);
            uint32_t held = ranges_held(&a->view, a->server_id);
            if (held != last_held)
                printf("drain: server %u holds %u range(s)\n", a->server_id, held);
            fflush(stdout);
            last_held = held;
            if (!n || (!n->alive && held == 0)) {
                printf("drain: server %u has left the job\n", a->server_id);
                break;
            }
        }
        cps__tp_poll(tp, POLL_EVERY_MS, NULL, NULL, 0);
    }
    cps__tp_destroy(tp);
    cps__view_fini(&a->view);
    free(a);
    return exit_code;
}
