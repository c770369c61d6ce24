/* `chainps status`: ask the scheduler for the view and the nodes' counters, print them. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chainps/error.h"
#include "cli.h"
#include "core/view.h"
#include "core/wire.h"
#include "node/msg.h"
#include "node/roles.h"
#include "transport/transport.h"

#define STATUS_TIMEOUT_MS 3000

static const char status_usage[] =
    "usage: chainps status [--scheduler HOST:PORT] [--secret-file F] [--verify] [--end]\n"
    "\n"
    "Show a running job: its nodes (role, rank, address, when the scheduler last heard from\n"
    "them), every key range and its chain of servers, and the traffic counters (push bytes\n"
    "before and after compression, pull bytes, updates applied).\n"
    "\n"
    "  --scheduler H:P    the scheduler (default 127.0.0.1:9091; env CHAINPS_SCHEDULER, ...)\n"
    "  --end              end the job: the scheduler tells the servers to stop (for a job\n"
    "                     whose scheduler runs with --hold)\n"
    "  --verify           ask every replica of every range for a checksum of its values at its\n"
    "                     sequence number and compare replicas at equal sequence numbers;\n"
    "                     exits 1 on a mismatch, 3 if replicas never stood at the same\n"
    "                     sequence number while asked (training kept them "
    "moving)\n" CPS_CLI_SECRET_HELP "  -h, --help         this text\n";

static const struct option status_opts[] = {{"scheduler", required_argument, 0, CLI_OPT_SCHEDULER},
                                            {"verify", no_argument, 0, CLI_OPT_VERIFY},
                                            {"end", no_argument, 0, CLI_OPT_END},
                                            CPS_CLI_SECRET_OPTS,
                                            {"help", no_argument, 0, 'h'},
                                            {0, 0, 0, 0}};

#define VERIFY_TRIES   40
#define VERIFY_WAIT_MS 250

/* One replica's answer to a checksum request. */
typedef struct sum_answer {
    int got;
    int status;
    uint64_t seq, sum;
} sum_answer;

typedef struct reply {
    int got;
    cps_view view;
    int started;
    uint32_t n;
    uint32_t ids[CPS_MAX_NODES];
    uint32_t age_ms[CPS_MAX_NODES];
    cps_node_stats stats[CPS_MAX_NODES];
    sum_answer *sums; /* nranges x CPS_MAX_REPLICAS */
} reply;

static void on_msg(void *ctx, void *buf, size_t len)
{
    reply *r = ctx;
    cps_rx rx;
    if (cps__rx_parse(&rx, buf, len) != 0)
        return;
    if (rx.hdr.type == CPS_MSG_CHECKSUM && r->sums && rx.hdr.range < r->view.nranges) {
        const cps_range *rg = &r->view.ranges[rx.hdr.range];
        for (uint32_t j = 0; j < rg->chain_len; j++) {
            if (rg->chain[j] == rx.hdr.sender) {
                sum_answer *a = &r->sums[rx.hdr.range * CPS_MAX_REPLICAS + j];
                *a = (sum_answer){1, rx.hdr.status, rx.hdr.req_seq, rx.hdr.aux};
            }
        }
    }
    if (rx.hdr.type == CPS_MSG_STATUS_REPLY && !r->got) {
        size_t vlen = 0;
        if (cps__view_decode_prefix(rx.payload, rx.len, &r->view, &vlen) == 0 &&
            vlen + 4 <= rx.len) {
            const char *p = (const char *)rx.payload + vlen;
            uint32_t n = cps__le32_get(p);
            p += 4;
            if (n <= CPS_MAX_NODES && vlen + 4 + (size_t)n * (8 + CPS_STATS_SIZE) <= rx.len) {
                for (uint32_t i = 0; i < n; i++, p += 8 + CPS_STATS_SIZE) {
                    r->ids[i] = cps__le32_get(p);
                    r->age_ms[i] = cps__le32_get(p + 4);
                    cps__stats_decode(p + 8, &r->stats[i]);
                }
                r->n = n;
                r->started = rx.hdr.aux != 0;
                r->got = 1;
            }
        }
    }
    cps__rx_free(&rx);
}

static const cps_node_stats *stats_of(const reply *r, uint32_t id, uint32_t *age)
{
    for (uint32_t i = 0; i < r->n; i++)
        if (r->ids[i] == id) {
            *age = r->age_ms[i];
            return &r->stats[i];
        }
    return NULL;
}

static void print_status(const reply *r)
{
    const cps_view *v = &r->view;
    char mode[32];
    if (!r->started) {
        printf("job: waiting for nodes (%u joined so far)\n", r->n);
    } else {
        printf("job: running, view epoch %" PRIu64 ", mode %s, %u workers, %u servers, "
               "%u ranges, %u replica(s)\n",
               v->epoch, cps__config_mode_str(v->mode, v->ssp_bound, mode, sizeof mode),
               v->num_workers, v->num_servers, v->nranges, v->replicas);
    }
    printf("\nnodes:\n  %-5s %-7s %-5s %-28s %-10s %s\n", "id", "role", "rank", "address", "heard",
           "alive");
    uint64_t raw = 0, wire = 0, pull = 0, applied = 0, bad = 0;
    for (uint32_t i = 0; i < v->nnodes; i++) {
        const cps_node_info *n = &v->nodes[i];
        uint32_t age = 0;
        const cps_node_stats *s = stats_of(r, n->id, &age);
        char heard[32];
        snprintf(heard, sizeof heard, "%.1f s ago", age / 1000.0);
        printf("  %-5u %-7s %-5u %-28s %-10s %s\n", n->id, cps__config_role_str(n->role), n->rank,
               n->addr, heard, n->alive ? "yes" : "no");
        if (s && n->role == CPS_ROLE_SERVER) {
            raw += s->push_raw_bytes;
            wire += s->push_wire_bytes;
            pull += s->pull_bytes;
            applied += s->updates_applied;
            bad += s->msgs_bad;
        }
    }
    if (v->nranges) {
        printf("\nranges:\n  %-6s %-35s %s\n", "range", "keys", "chain (head .. tail)");
        for (uint32_t i = 0; i < v->nranges; i++) {
            const cps_range *rg = &v->ranges[i];
            char chain[128] = "";
            size_t off = 0;
            for (uint32_t j = 0; j < rg->chain_len && off < sizeof chain; j++)
                off += (size_t)snprintf(chain + off, sizeof chain - off, "%s%u", j ? " -> " : "",
                                        rg->chain[j]);
            printf("  %-6u %016" PRIx64 "-%016" PRIx64 " %s\n", i, rg->lo, rg->hi, chain);
        }
    }
    printf("\nservers' traffic: push %.2f MB raw, %.2f MB on the wire (compression ratio %.3f), "
           "pull %.2f MB, %" PRIu64 " updates applied, %" PRIu64 " bad messages\n",
           raw / 1e6, wire / 1e6, wire ? (double)raw / (double)wire : 1.0, pull / 1e6, applied,
           bad);
}

/* Ask every replica of every range for its checksum until, for each range, all replicas
 * answer at the same sequence number. Returns 0 (all agree), 1 (mismatch), 3 (inconclusive). */
static int verify(reply *r, cps_tp *tp, const char *me)
{
    const cps_view *v = &r->view;
    r->sums = calloc((size_t)v->nranges * CPS_MAX_REPLICAS, sizeof *r->sums);
    if (!r->sums)
        return 1;
    for (uint32_t i = 0; i < v->nnodes; i++)
        if (v->nodes[i].role == CPS_ROLE_SERVER)
            cps__tp_peer_set(tp, v->nodes[i].id, v->nodes[i].addr);
    char payload[16 + CPS_ADDR_MAX];
    size_t plen = cps__hello_encode(payload, sizeof payload, CPS_ROLE_NONE, UINT32_MAX, 0, me);
    int settled = 0;
    for (int attempt = 0; attempt < VERIFY_TRIES && !settled; attempt++) {
        memset(r->sums, 0, (size_t)v->nranges * CPS_MAX_REPLICAS * sizeof *r->sums);
        for (uint32_t g = 0; g < v->nranges; g++) {
            for (uint32_t j = 0; j < v->ranges[g].chain_len; j++) {
                cps_msg_hdr h = {.type = CPS_MSG_CHECKSUM, .sender = UINT32_MAX, .range = g};
                cps__msg_send(tp, v->ranges[g].chain[j], &h, payload, plen);
            }
        }
        uint64_t deadline = cps__now_ms() + 2000;
        int missing = 1;
        while (missing && cps__now_ms() < deadline) {
            cps__tp_poll(tp, 50, on_msg, r, 0);
            missing = 0;
            for (uint32_t g = 0; g < v->nranges; g++)
                for (uint32_t j = 0; j < v->ranges[g].chain_len; j++)
                    missing |= !r->sums[g * CPS_MAX_REPLICAS + j].got;
        }
        settled = !missing;
        for (uint32_t g = 0; settled && g < v->nranges; g++)
            for (uint32_t j = 1; j < v->ranges[g].chain_len; j++)
                settled &=
                    r->sums[g * CPS_MAX_REPLICAS + j].seq == r->sums[g * CPS_MAX_REPLICAS].seq;
        if (!settled)
            cps__tp_poll(tp, VERIFY_WAIT_MS, on_msg, r, 0);
    }
    int mismatch = 0;
    printf("\nverify:\n  %-6s %-6s %-12s %-18s %s\n", "range", "node", "seq", "checksum", "");
    for (uint32_t g = 0; g < v->nranges; g++) {
        const sum_answer *a0 = &r->sums[g * CPS_MAX_REPLICAS];
        for (uint32_t j = 0; j < v->ranges[g].chain_len; j++) {
            const sum_answer *a = &r->sums[g * CPS_MAX_REPLICAS + j];
            const char *verdict = !a->got             ? "no answer"
                                  : a->status         ? cps_strerror(a->status)
                                  : a->seq != a0->seq ? "other seq"
                                  : a->sum != a0->sum ? "MISMATCH"
                                                      : "ok";
            mismatch |= a->got && !a->status && a->seq == a0->seq && a->sum != a0->sum;
            printf("  %-6u %-6u %-12" PRIu64 " %016" PRIx64 "   %s\n", g, v->ranges[g].chain[j],
                   a->seq, a->sum, verdict);
        }
    }
    if (mismatch) {
        printf("verify: FAIL: replicas differ at equal sequence numbers\n");
        return 1;
    }
    if (!settled) {
        printf("verify: INCONCLUSIVE: replicas never answered at one sequence number\n");
        return 3;
    }
    printf("verify: OK: every range's replicas are identical at their sequence number\n");
    return 0;
}

int cps__cli_status(int argc, char **argv)
{
    cps_config cfg;
    if (cps__cli_config(&cfg) != 0)
        return 2;
    int opt, want_verify = 0, want_end = 0;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "h", status_opts, NULL)) != -1) {
        if (opt == 'h') {
            fputs(status_usage, stdout);
            return 0;
        }
        if (opt == CLI_OPT_VERIFY) {
            want_verify = 1;
            continue;
        }
        if (opt == CLI_OPT_END) {
            want_end = 1;
            continue;
        }
        int rc = cps__cli_common_flag("status", opt, optarg, &cfg);
        if (rc == 2)
            return 2;
        if (rc == 1)
            return cps__cli_usage_error("status", "unknown option");
    }
    if (optind < argc)
        return cps__cli_usage_error("status", "unexpected argument '%s'", argv[optind]);
    cps__config_finalize(&cfg, CPS_ROLE_NONE);
    if (cps__node_load_secret(&cfg, "status") != 0)
        return 2;

    reply *r = calloc(1, sizeof *r);
    cps_tp *tp = NULL;
    if (!r)
        return 1;
    cps__view_init(&r->view);
    uint16_t port = 0;
    char url[CPS_ADDR_MAX + 16], me[CPS_ADDR_MAX];
    snprintf(url, sizeof url, "tcp://%s:%u", cfg.sched_host, cfg.sched_port);
    int rc = cps__tp_create(cps__node_key(&cfg), &tp);
    if (rc == 0)
        rc = cps__tp_bind(tp, cfg.bind_host, 0, &port);
    if (rc == 0)
        rc = cps__tp_peer_set(tp, 0, url);
    if (rc == 0)
        rc = cps__make_url(me, cfg.advertise_host, port);
    char payload[16 + CPS_ADDR_MAX];
    size_t n = cps__hello_encode(payload, sizeof payload, CPS_ROLE_NONE, UINT32_MAX, 0, me);
    cps_msg_hdr h = {.type = CPS_MSG_STATUS, .sender = UINT32_MAX};
    if (rc == 0)
        rc = cps__msg_send(tp, 0, &h, payload, n);
    uint64_t deadline = cps__now_ms() + STATUS_TIMEOUT_MS;
    while (rc == 0 && !r->got && cps__now_ms() < deadline)
        cps__tp_poll(tp, 100, on_msg, r, 0);
    int exit_code = 0;
    if (!r->got) {
        fprintf(stderr,
                "chainps status: no answer from the scheduler at %s within %.1f s%s%s (is it "
                "running, and is this the job's secret? a job drops messages it cannot "
                "authenticate)\n",
                url, STATUS_TIMEOUT_MS / 1000.0, rc ? ": " : "", rc ? cps_strerror(rc) : "");
        exit_code = 1;
    } else {
        print_status(r);
        if (want_verify)
            exit_code = r->started ? verify(r, tp, me) : 3;
        if (want_end) {
            cps_msg_hdr e = {.type = CPS_MSG_SHUTDOWN, .sender = UINT32_MAX};
            if (cps__msg_send(tp, 0, &e, NULL, 0) == 0) {
                cps__tp_poll(tp, 200, NULL, NULL, 0); /* let it leave before we close */
                printf("status: asked the scheduler to end the job\n");
            }
        }
    }
    cps__tp_destroy(tp);
    cps__view_fini(&r->view);
    free(r->sums);
    free(r);
    return exit_code;
}
