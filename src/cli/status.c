/* `chainps status`: ask the scheduler for the view and the nodes' counters, print them. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "chainps/error.h"
#include "cli.h"
#include "core/config.h"
#include "core/view.h"
#include "core/wire.h"
#include "node/msg.h"
#include "node/roles.h"
#include "transport/transport.h"

#define STATUS_TIMEOUT_MS 3000
/* Ranges whose copy under way the status shows (a view has far fewer). */
#define CPS_MAX_RANGES_STATUS 4096

static const char status_usage[] =
    "usage: chainps status [--scheduler HOST:PORT] [--secret-file F] [--json] [--watch[=SECS]]\n"
    "                      [--count N] [--verify] [--end]\n"
    "\n"
    "Show a running job: its step, its nodes (role, rank, address, when the scheduler last heard\n"
    "from them; a worker's clock, the last step it pushed, and how far it trails the fastest),\n"
    "every key range with its chain of servers and the copy under way to bring it back to R\n"
    "replicas, the last completed checkpoint (number, step, time, age, path), and the traffic\n"
    "counters (push bytes before and after compression, pull bytes, updates applied); with\n"
    "--watch, also steps/s, push and pull MB/s and updates/s.\n"
    "\n"
    "  --scheduler H:P    the scheduler (default 127.0.0.1:9091; env CHAINPS_SCHEDULER, ...)\n"
    "  --json             print the same as one JSON object (one per refresh with --watch)\n"
    "  --watch[=SECS]     refresh every SECS seconds (default 2, 0.1 .. 3600) until interrupted,\n"
    "                     with rates measured between refreshes\n"
    "  --count N          with --watch: stop after N refreshes\n"
    "  --end              end the job: the scheduler tells the servers to stop (for a job\n"
    "                     whose scheduler runs with --hold)\n"
    "  --verify           ask every replica of every range for a checksum of its values at its\n"
    "                     sequence number and compare replicas at equal sequence numbers;\n"
    "                     exits 1 on a mismatch, 3 if replicas never stood at the same\n"
    "                     sequence number while asked (training kept them "
    "moving)\n" CPS_CLI_SECRET_HELP "  -h, --help         this text\n";

static const struct option status_opts[] = {{"scheduler", required_argument, 0, CLI_OPT_SCHEDULER},
                                            {"verify", no_argument, 0, CLI_OPT_VERIFY},
                                            {"json", no_argument, 0, CLI_OPT_JSON},
                                            {"watch", optional_argument, 0, CLI_OPT_WATCH},
                                            {"count", required_argument, 0, CLI_OPT_COUNT},
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
    cps__view view;
    int started;
    uint32_t n;
    uint32_t ids[CPS_MAX_NODES];
    uint32_t age_ms[CPS_MAX_NODES];
    cps__node_stats stats[CPS_MAX_NODES];
    uint32_t njoins;                        /* ranges the join info covers (0: none sent) */
    uint32_t joiner[CPS_MAX_RANGES_STATUS]; /* per range: the server copying it, or 0 */
    uint32_t source[CPS_MAX_RANGES_STATUS]; /* and the replica it copies from */
    sum_answer *sums;                       /* nranges x CPS_MAX_REPLICAS */
    cps__ckpt_note ckpt;                    /* the last checkpoint; id 0: none (or an older
                                               scheduler, which does not know) */
    /* per range: the empty server kept out as its only replica (0: none), and its fallback */
    uint32_t stranded[CPS_MAX_RANGES_STATUS];
    uint32_t fallback[CPS_MAX_RANGES_STATUS];
} reply;

/* The stranded ranges at p (len bytes), if that is where they are: bytes used, or 0. */
static size_t stranded_decode(reply *r, const unsigned char *p, size_t len)
{
    if (len < 8 || cps__le32_get(p) != CPS_STATUS_STRANDED_TAG)
        return 0;
    uint32_t n = cps__le32_get(p + 4);
    if (n > CPS_MAX_RANGES_STATUS || len < 8 + 12 * (size_t)n)
        return 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t g = cps__le32_get(p + 8 + 12 * i);
        if (g < CPS_MAX_RANGES_STATUS) {
            r->stranded[g] = cps__le32_get(p + 12 + 12 * i);
            r->fallback[g] = cps__le32_get(p + 16 + 12 * i);
        }
    }
    return 8 + 12 * (size_t)n;
}

static void on_msg(void *ctx, void *buf, size_t len)
{
    reply *r = ctx;
    cps__rx rx;
    if (cps__rx_parse(&rx, buf, len) != 0)
        return;
    if (rx.hdr.type == CPS_MSG_CHECKSUM && r->sums && rx.hdr.range < r->view.nranges) {
        const cps__range *rg = &r->view.ranges[rx.hdr.range];
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
                /* Then the copies under way (absent from an older scheduler's answer). */
                size_t off = vlen + 4 + (size_t)n * (8 + CPS_STATS_SIZE);
                uint32_t nr = off + 4 <= rx.len ? cps__le32_get(p) : 0;
                if (nr <= CPS_MAX_RANGES_STATUS && off + 4 + (size_t)nr * 8 <= rx.len) {
                    for (uint32_t g = 0; g < nr; g++) {
                        r->joiner[g] = cps__le32_get(p + 4 + 8 * g);
                        r->source[g] = cps__le32_get(p + 8 + 8 * g);
                    }
                    r->njoins = nr;
                    /* Then the last checkpoint, when there was one. */
                    size_t at = off + 4 + (size_t)nr * 8, used = 0;
                    const unsigned char *tail = (const unsigned char *)rx.payload;
                    if (at < rx.len && !stranded_decode(r, tail + at, rx.len - at)) {
                        if (cps__ckpt_note_decode(tail + at, rx.len - at, &r->ckpt, &used) != 0)
                            r->ckpt.id = 0;
                        else
                            stranded_decode(r, tail + at + used, rx.len - at - used);
                    }
                }
            }
        }
    }
    cps__rx_free(&rx);
}

static const cps__node_stats *stats_of(const reply *r, uint32_t id, uint32_t *age)
{
    for (uint32_t i = 0; i < r->n; i++)
        if (r->ids[i] == id) {
            *age = r->age_ms[i];
            return &r->stats[i];
        }
    return NULL;
}

/* What the status shows beyond the raw reply: totals over the servers, the job's step, the
 * fastest worker's clock, and rates against the previous poll (--watch). */
typedef struct summary {
    uint64_t raw, wire, pull, applied, bad, step, fastest;
    uint64_t at_ms;
    int have_rates;
    double steps_s, push_mb_s, pull_mb_s, updates_s;
} summary;

static void summarize(const reply *r, const summary *prev, uint64_t now, summary *out)
{
    memset(out, 0, sizeof *out);
    out->at_ms = now;
    const cps__view *v = &r->view;
    for (uint32_t i = 0; i < v->nnodes; i++) {
        uint32_t age = 0;
        const cps__node_stats *s = stats_of(r, v->nodes[i].id, &age);
        if (!s)
            continue;
        if (v->nodes[i].role == CPS_ROLE_SERVER) {
            out->raw += s->push_raw_bytes;
            out->wire += s->push_wire_bytes;
            out->pull += s->pull_bytes;
            out->applied += s->updates_applied;
            out->bad += s->msgs_bad;
            if (s->step > out->step)
                out->step = s->step;
        } else if (v->nodes[i].role == CPS_ROLE_WORKER && s->step > out->fastest) {
            out->fastest = s->step;
        }
    }
    if (prev && prev->at_ms && now > prev->at_ms) {
        /* Counters of a server that restarted start over: a rate is never negative. */
        double dt = (double)(now - prev->at_ms) / 1000.0;
#define RATE(a, b) ((a) > (b) ? (double)((a) - (b)) / dt : 0.0)
        out->steps_s = RATE(out->step, prev->step);
        out->push_mb_s = RATE(out->raw, prev->raw) / 1e6;
        out->pull_mb_s = RATE(out->pull, prev->pull) / 1e6;
        out->updates_s = RATE(out->applied, prev->applied);
#undef RATE
        out->have_rates = 1;
    }
}

static void print_status(const reply *r, const summary *sm)
{
    const cps__view *v = &r->view;
    char mode[32];
    if (!r->started) {
        printf("job: waiting for nodes (%u joined so far)\n", r->n);
    } else {
        char backup[48] = "";
        if (v->backup_workers)
            snprintf(backup, sizeof backup, " (%u backup worker%s)", v->backup_workers,
                     v->backup_workers == 1 ? "" : "s");
        printf("job: running, view epoch %" PRIu64 ", mode %s%s, %u workers, %u servers, "
               "%u ranges, %u replica(s); step %" PRIu64 "\n",
               v->epoch, cps__config_mode_str(v->mode, v->ssp_bound, mode, sizeof mode), backup,
               v->num_workers, v->num_servers, v->nranges, v->replicas, sm->step);
    }
    if (sm->have_rates)
        printf("rates: %.2f steps/s, push %.2f MB/s, pull %.2f MB/s, %.1f updates/s\n", sm->steps_s,
               sm->push_mb_s, sm->pull_mb_s, sm->updates_s);
    printf("\nnodes:\n  %-5s %-7s %-5s %-28s %-10s %-5s %s\n", "id", "role", "rank", "address",
           "heard", "alive", "clock (lag)");
    for (uint32_t i = 0; i < v->nnodes; i++) {
        const cps__node_info *n = &v->nodes[i];
        uint32_t age = 0;
        const cps__node_stats *s = stats_of(r, n->id, &age);
        char heard[32], clock[48] = "";
        snprintf(heard, sizeof heard, "%.1f s ago", age / 1000.0);
        if (s && n->role == CPS_ROLE_WORKER)
            snprintf(clock, sizeof clock, "%" PRIu64 " (%" PRIu64 ")", s->step,
                     sm->fastest - s->step);
        printf("  %-5u %-7s %-5u %-28s %-10s %-5s %s\n", n->id, cps__config_role_str(n->role),
               n->rank, n->addr, heard, n->alive ? "yes" : "no", clock);
    }
    if (v->nranges) {
        printf("\nranges:\n  %-6s %-35s %s\n", "range", "keys", "chain (head .. tail)");
        for (uint32_t i = 0; i < v->nranges; i++) {
            const cps__range *rg = &v->ranges[i];
            char chain[384] = "";
            size_t off = 0;
            for (uint32_t j = 0; j < rg->chain_len && off < sizeof chain; j++)
                off += (size_t)snprintf(chain + off, sizeof chain - off, "%s%u", j ? " -> " : "",
                                        rg->chain[j]);
            if (i < r->njoins && r->joiner[i] && off < sizeof chain)
                off += (size_t)snprintf(chain + off, sizeof chain - off,
                                        "   (node %u copying it from node %u)", r->joiner[i],
                                        r->source[i]);
            if (i < CPS_MAX_RANGES_STATUS && r->stranded[i] && off < sizeof chain)
                snprintf(chain + off, sizeof chain - off,
                         "   UNAVAILABLE: server %u, its only replica, came back with an empty "
                         "store and is kept out (fallback: %s%.0u; see the scheduler's ERROR)",
                         r->stranded[i], r->fallback[i] ? "server " : "none", r->fallback[i]);
            printf("  %-6u %016" PRIx64 "-%016" PRIx64 " %s\n", i, rg->lo, rg->hi, chain);
        }
    }
    if (r->ckpt.id) {
        char when[64] = "?";
        time_t t = (time_t)(r->ckpt.unix_ms / 1000);
        struct tm tm;
        if (gmtime_r(&t, &tm))
            strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tm);
        printf("last checkpoint: #%" PRIu64 " at step %" PRIu64 ", %s (%.1f s ago), %s\n",
               r->ckpt.id, r->ckpt.step, when, r->ckpt.age_ms / 1000.0, r->ckpt.path);
    } else {
        printf("last checkpoint: none\n");
    }
    printf("\nservers' traffic: push %.2f MB raw, %.2f MB on the wire (compression ratio %.3f), "
           "pull %.2f MB, %" PRIu64 " updates applied, %" PRIu64 " bad messages\n",
           sm->raw / 1e6, sm->wire / 1e6, sm->wire ? (double)sm->raw / (double)sm->wire : 1.0,
           sm->pull / 1e6, sm->applied, sm->bad);
}

/* A JSON string of an address: printable ASCII only (the view decoder checked), quotes and
 * backslashes escaped. */
static void json_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            putchar('\\');
        if ((unsigned char)*s >= 0x20 && (unsigned char)*s < 0x7f)
            putchar(*s);
    }
    putchar('"');
}

static void print_json(const reply *r, const summary *sm)
{
    const cps__view *v = &r->view;
    char mode[32];
    printf("{\"running\":%s,\"epoch\":%" PRIu64 ",\"mode\":\"%s\",\"workers\":%u,"
           "\"servers\":%u,\"replicas\":%u,\"step\":%" PRIu64,
           r->started ? "true" : "false", v->epoch,
           cps__config_mode_str(v->mode, v->ssp_bound, mode, sizeof mode), v->num_workers,
           v->num_servers, v->replicas, sm->step);
    if (v->backup_workers)
        printf(",\"backup_workers\":%u", v->backup_workers);
    if (sm->have_rates)
        printf(",\"rates\":{\"steps_per_s\":%.3f,\"push_mb_per_s\":%.3f,\"pull_mb_per_s\":%.3f,"
               "\"updates_per_s\":%.3f}",
               sm->steps_s, sm->push_mb_s, sm->pull_mb_s, sm->updates_s);
    printf(",\"nodes\":[");
    for (uint32_t i = 0; i < v->nnodes; i++) {
        const cps__node_info *n = &v->nodes[i];
        uint32_t age = 0;
        const cps__node_stats *s = stats_of(r, n->id, &age);
        printf("%s{\"id\":%u,\"role\":\"%s\",\"rank\":%u,\"address\":", i ? "," : "", n->id,
               cps__config_role_str(n->role), n->rank);
        json_str(n->addr);
        printf(",\"alive\":%s,\"heard_ms_ago\":%u", n->alive ? "true" : "false", age);
        if (s)
            printf(",\"step\":%" PRIu64 ",\"push_bytes\":%" PRIu64 ",\"pull_bytes\":%" PRIu64
                   ",\"updates_applied\":%" PRIu64 ",\"bad_messages\":%" PRIu64,
                   s->step, s->push_raw_bytes, s->pull_bytes, s->updates_applied, s->msgs_bad);
        if (s && n->role == CPS_ROLE_WORKER)
            printf(",\"lag\":%" PRIu64, sm->fastest - s->step);
        if (s && n->role == CPS_ROLE_SERVER)
            printf(",\"keys\":%" PRIu64 ",\"values\":%" PRIu64, s->keys_stored, s->values_stored);
        putchar('}');
    }
    printf("],\"ranges\":[");
    for (uint32_t i = 0; i < v->nranges; i++) {
        const cps__range *rg = &v->ranges[i];
        printf("%s{\"range\":%u,\"lo\":\"%016" PRIx64 "\",\"hi\":\"%016" PRIx64 "\",\"chain\":[",
               i ? "," : "", i, rg->lo, rg->hi);
        for (uint32_t j = 0; j < rg->chain_len; j++)
            printf("%s%u", j ? "," : "", rg->chain[j]);
        putchar(']');
        if (i < r->njoins && r->joiner[i])
            printf(",\"copying\":{\"node\":%u,\"from\":%u}", r->joiner[i], r->source[i]);
        if (i < CPS_MAX_RANGES_STATUS && r->stranded[i])
            printf(",\"stranded\":{\"empty\":%u,\"fallback\":%u}", r->stranded[i], r->fallback[i]);
        putchar('}');
    }
    printf("],\"last_checkpoint\":");
    if (r->ckpt.id) {
        printf("{\"id\":%" PRIu64 ",\"step\":%" PRIu64 ",\"unix_ms\":%" PRIu64
               ",\"age_s\":%.3f,\"path\":",
               r->ckpt.id, r->ckpt.step, r->ckpt.unix_ms, r->ckpt.age_ms / 1000.0);
        json_str(r->ckpt.path);
        putchar('}');
    } else {
        printf("null");
    }
    printf(",\"traffic\":{\"push_bytes\":%" PRIu64 ",\"push_wire_bytes\":%" PRIu64
           ",\"pull_bytes\":%" PRIu64 ",\"updates_applied\":%" PRIu64 ",\"bad_messages\":%" PRIu64
           "}}\n",
           sm->raw, sm->wire, sm->pull, sm->applied, sm->bad);
    fflush(stdout);
}

/* Ask every replica of every range for its checksum until, for each range, all replicas
 * answer at the same sequence number. Returns 0 (all agree), 1 (mismatch), 3 (inconclusive). */
static int verify(reply *r, cps__tp *tp, const char *me)
{
    const cps__view *v = &r->view;
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
                cps__msg_hdr h = {.type = CPS_MSG_CHECKSUM, .sender = UINT32_MAX, .range = g};
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

/* Ask the scheduler once; 1 if it answered within STATUS_TIMEOUT_MS. */
static int fetch(reply *r, cps__tp *tp, const char *me)
{
    cps__view_fini(&r->view);
    cps__view_init(&r->view);
    r->got = 0;
    r->n = 0;
    r->njoins = 0;
    r->ckpt.id = 0;
    char payload[16 + CPS_ADDR_MAX];
    size_t n = cps__hello_encode(payload, sizeof payload, CPS_ROLE_NONE, UINT32_MAX, 0, me);
    cps__msg_hdr h = {.type = CPS_MSG_STATUS, .sender = UINT32_MAX};
    if (cps__msg_send(tp, 0, &h, payload, n) != 0)
        return 0;
    uint64_t deadline = cps__now_ms() + STATUS_TIMEOUT_MS;
    while (!r->got && cps__now_ms() < deadline)
        cps__tp_poll(tp, 100, on_msg, r, 0);
    return r->got;
}

int cps__cli_status(int argc, char **argv)
{
    cps__config cfg;
    if (cps__cli_config(&cfg) != 0)
        return 2;
    int opt, want_verify = 0, want_end = 0, json = 0, watch = 0;
    uint32_t count = 0, every_ms = 2000;
    char err[256];
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
        if (opt == CLI_OPT_JSON) {
            json = 1;
            continue;
        }
        if (opt == CLI_OPT_WATCH) {
            watch = 1;
            if (optarg) {
                char *end;
                double secs = strtod(optarg, &end);
                if (end == optarg || *end || !(secs >= 0.1 && secs <= 3600))
                    return cps__cli_usage_error("status",
                                                "--watch=%s: seconds between refreshes, "
                                                "0.1 .. 3600",
                                                optarg);
                every_ms = (uint32_t)(secs * 1000.0 + 0.5);
            }
            continue;
        }
        if (opt == CLI_OPT_COUNT) {
            if (cps__config_parse_u32("--count", optarg, 1, 1000000000, &count, err, sizeof err))
                return cps__cli_usage_error("status", "%s", err);
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
    if (watch && (want_verify || want_end))
        return cps__cli_usage_error("status", "--watch does not go with --verify or --end");
    if (count && !watch)
        return cps__cli_usage_error("status", "--count needs --watch");
    if (json && want_verify)
        return cps__cli_usage_error("status", "--json does not go with --verify");
    cps__config_finalize(&cfg, CPS_ROLE_NONE);
    if (cps__node_load_secret(&cfg, "status") != 0)
        return 2;

    reply *r = calloc(1, sizeof *r);
    cps__tp *tp = NULL;
    if (!r)
        return 1;
    cps__view_init(&r->view);
    char url[CPS_ADDR_MAX + 16], me[CPS_ADDR_MAX];
    int rc = cps__cli_tool_open(&cfg, &tp, url, sizeof url, me);
    int exit_code = 0, tty = isatty(STDOUT_FILENO);
    summary prev = {0}, cur;
    for (uint32_t k = 0; exit_code == 0 && (!count || k < count); k++) {
        if (k)
            cps__tp_poll(tp, (int)every_ms, NULL, NULL, 0);
        if (rc != 0 || !fetch(r, tp, me)) {
            fprintf(stderr,
                    "chainps status: no answer from the scheduler at %s within %.1f s%s%s (is it "
                    "running, and is this the job's secret? a job drops messages it cannot "
                    "authenticate)\n",
                    url, STATUS_TIMEOUT_MS / 1000.0, rc ? ": " : "", rc ? cps_strerror(rc) : "");
            exit_code = 1;
            break;
        }
        summarize(r, &prev, cps__now_ms(), &cur);
        prev = cur;
        if (json) {
            print_json(r, &cur);
        } else {
            if (watch && tty)
                fputs("\033[H\033[2J", stdout); /* a refreshing screen, as watch(1) */
            print_status(r, &cur);
            fflush(stdout);
        }
        if (!watch)
            break;
    }
    if (exit_code == 0 && !watch) {
        if (want_verify)
            exit_code = r->started ? verify(r, tp, me) : 3;
        if (want_end) {
            cps__msg_hdr e = {.type = CPS_MSG_SHUTDOWN, .sender = UINT32_MAX};
            if (cps__msg_send(tp, 0, &e, NULL, 0) == 0) {
                cps__tp_poll(tp, 200, NULL, NULL, 0); /* let it leave before we close */
                if (!json)
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
