/* The simulator's command line:
 *
 *   sim --seed N [--seeds K] [--servers S] [--workers W] [--replicas R] [--ranges N]
 *       [--mode sync|async|ssp|ssp:N] [--faults
 * none|drops|crash|pause|restart|partition|join|scale|all]
 *       [--events N] [--refusals] [--sched-restarts] [--push-pull] [--views-unordered]
 *       [--fwd-crashes] [--single-probe] [--fence-faults] [--drains] [--snap-gaps] [-v]
 *   sim --regressions FILE
 *
 * Parameters not given are drawn from the seed, from a stream of their own, in a fixed order:
 * so a replay line naming some of them reproduces the run exactly. With --seeds K, seeds
 * N..N+K-1 run until the first failure, which prints one "replay:" line. A regressions file
 * holds such lines (and # comments); every line must pass. Exit status: 0 all passed,
 * 1 a violation, 2 bad usage.
 *
 * --mode ssp:N runs bounded staleness with bound N (`ssp`: N drawn from the seed, 0..3). The mode
 * is drawn as sync or async only, so SSP runs are asked for (sim.seeds_ssp) and the seeds of
 * sim.seeds keep their runs; with --push-pull (no suite ran it before) it is drawn among the
 * three. In SSP mode workers run steps of a push and a pull at its clock, and every pull
 * answered is checked against the bound (invariant 10) and every apply against the range's
 * clocks (invariant 9).
 *
 * Workers run the production worker session (recovery/session.c, tests/sim/sim_worker.c); they
 * give requests up when their range has no live replica for the unavailable timeout (a
 * given-up push stays in the table, detached, and is still sent). Servers run the chain, the
 * joiner and the fencing of replication/ and recovery/; the scheduler is the production
 * coordinator (recovery/coordinator.h), configured as production configures it: the sim fakes
 * only the network, the stores, the clock and the processes. --refusals lets the head refuse some
 * pushes (unknown keys: a SKIP update); --sched-restarts makes some faults restarts of the
 * scheduler (it resumes from what it persisted); --single-probe makes the coordinator declare a
 * server dead after one unanswered probe (false deaths of slow servers become common);
 * --fence-faults sends a server's new life late copies of the WELCOME that let its previous life
 * in (sim.h); --drains has the operator stop servers with SIGTERM, each asking to be drained first
 * (sim_drain.c); --snap-gaps has snapshot streams lose a chunk before their last while the later
 * ones arrive (nanomsg reconnecting under them: sim.h). Fault kinds: see sim.h; `all` mixes every
 * kind. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

typedef struct cli {
    uint64_t seed, seeds;
    int have_seed;
    /* Explicit values; 0 / -1 when drawn from the seed. */
    uint32_t servers, workers, replicas, ranges;
    int mode, faults;
    int ssp_bound;   /* --mode ssp:N; -1 when drawn */
    uint32_t backup; /* --backup-workers B: sync mode, at least B+1 workers */
    uint64_t events;
    int verbose, refusals, sched_restarts, push_pull, views_unordered, fwd_crashes, allow_rollback,
        wipe_sole, single_probe, fence_faults, drains, snap_gaps;
    const char *regressions;
} cli;

static const char *mode_names[] = {"sync", "async", "ssp"};
static const char *fault_names[] = {"none",    "drops",     "crash", "pause", "all",
                                    "restart", "partition", "join",  "scale"};

static void usage(void)
{
    fprintf(stderr,
            "usage: sim --seed N [--seeds K] [--servers S] [--workers W] [--replicas R]\n"
            "           [--ranges N] [--mode sync|async|ssp|ssp:N]\n"
            "           [--faults none|drops|crash|pause|restart|partition|join|scale|all]\n"
            "           [--events N] [--refusals] [--sched-restarts] [--push-pull]\n"
            "           [--views-unordered] [--allow-rollback] [--wipe-sole]\n"
            "           [--backup-workers B] [--fwd-crashes] [--single-probe]\n"
            "           [--fence-faults] [--drains] [--snap-gaps] [-v]\n"
            "       sim --regressions FILE\n");
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    if (!s || !*s)
        return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end)
        return -1;
    *out = v;
    return 0;
}

static int parse_name(const char *s, const char **names, int n)
{
    for (int i = 0; s && i < n; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

static int parse_args(int argc, char **argv, cli *c)
{
    memset(c, 0, sizeof *c);
    c->mode = c->faults = c->ssp_bound = -1;
    c->seeds = 1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t x = 0;
        if (strcmp(a, "-v") == 0) {
            c->verbose = 1;
            continue;
        }
        if (strcmp(a, "--refusals") == 0) {
            c->refusals = 1;
            continue;
        }
        if (strcmp(a, "--sched-restarts") == 0) {
            c->sched_restarts = 1;
            continue;
        }
        if (strcmp(a, "--push-pull") == 0) {
            c->push_pull = 1;
            continue;
        }
        if (strcmp(a, "--views-unordered") == 0) {
            c->views_unordered = 1;
            continue;
        }
        if (strcmp(a, "--fwd-crashes") == 0) {
            c->fwd_crashes = 1;
            continue;
        }
        if (strcmp(a, "--allow-rollback") == 0) {
            c->allow_rollback = 1;
            continue;
        }
        if (strcmp(a, "--wipe-sole") == 0) {
            c->wipe_sole = 1;
            continue;
        }
        if (strcmp(a, "--single-probe") == 0) {
            c->single_probe = 1;
            continue;
        }
        if (strcmp(a, "--fence-faults") == 0) {
            c->fence_faults = 1;
            continue;
        }
        if (strcmp(a, "--drains") == 0) {
            c->drains = 1;
            continue;
        }
        if (strcmp(a, "--snap-gaps") == 0) {
            c->snap_gaps = 1;
            continue;
        }
        i++;
        if (strcmp(a, "--regressions") == 0 && v) {
            c->regressions = v;
        } else if (strcmp(a, "--mode") == 0 && v && strncmp(v, "ssp:", 4) == 0) {
            if (parse_u64(v + 4, &x) != 0 || x > 1000)
                return -1;
            c->mode = SIM_SSP;
            c->ssp_bound = (int)x;
        } else if (strcmp(a, "--mode") == 0) {
            if ((c->mode = parse_name(v, mode_names, 3)) < 0)
                return -1;
        } else if (strcmp(a, "--faults") == 0) {
            if ((c->faults = parse_name(v, fault_names, SIM_F_COUNT_)) < 0)
                return -1;
        } else if (parse_u64(v, &x) != 0) {
            return -1;
        } else if (strcmp(a, "--seed") == 0) {
            c->seed = x;
            c->have_seed = 1;
        } else if (strcmp(a, "--seeds") == 0 && x > 0) {
            c->seeds = x;
        } else if (strcmp(a, "--servers") == 0 && x >= 1 && x <= SIM_MAX_SERVERS) {
            c->servers = (uint32_t)x;
        } else if (strcmp(a, "--workers") == 0 && x >= 1 && x <= SIM_MAX_WORKERS) {
            c->workers = (uint32_t)x;
        } else if (strcmp(a, "--replicas") == 0 && x >= 1 && x <= CPS_MAX_REPLICAS) {
            c->replicas = (uint32_t)x;
        } else if (strcmp(a, "--ranges") == 0 && x >= 1 && x <= SIM_MAX_RANGES) {
            c->ranges = (uint32_t)x;
        } else if (strcmp(a, "--events") == 0 && x >= 100) {
            c->events = x;
        } else if (strcmp(a, "--backup-workers") == 0 && x >= 1 && x < SIM_MAX_WORKERS) {
            c->backup = (uint32_t)x;
        } else {
            return -1;
        }
    }
    return 0;
}

/* Draw every parameter from the seed, then apply what the command line fixed. */
static int make_params(const cli *c, uint64_t seed, sim_params *p)
{
    sim_rng g;
    sim_rng_seed(&g, seed ^ 0x9a7a3e7e75eedull);
    uint64_t d[22];
    for (int i = 0; i < 22; i++)
        d[i] = sim_rng_next(&g);
    static const int drawn_faults[] = {SIM_F_DROPS,     SIM_F_CRASH, SIM_F_PAUSE, SIM_F_RESTART,
                                       SIM_F_PARTITION, SIM_F_JOIN,  SIM_F_ALL,   SIM_F_ALL,
                                       SIM_F_ALL,       SIM_F_ALL};
    memset(p, 0, sizeof *p);
    p->seed = seed;
    p->servers = c->servers ? c->servers : 1 + (uint32_t)(d[0] % 5);
    p->workers = c->workers ? c->workers : 1 + (uint32_t)(d[1] % 4);
    /* Backup workers: sync, and more workers than backups (W-B >= 1 close a step). */
    if (c->backup) {
        p->backup = c->backup;
        if (!c->workers)
            p->workers = c->backup + 1 + (uint32_t)(d[1] % 3);
        if (p->workers <= p->backup) {
            fprintf(stderr, "sim: --backup-workers %u needs more than %u workers\n", p->backup,
                    p->workers);
            return -1;
        }
    }
    uint32_t rmax = p->servers < 3 ? p->servers : 3;
    p->replicas = c->replicas ? c->replicas : 1 + (uint32_t)(d[2] % rmax);
    p->mode = c->mode >= 0 ? c->mode : (int)(d[3] % (c->push_pull ? 3 : 2));
    if (c->backup)
        p->mode = SIM_SYNC;
    p->ssp_bound = c->ssp_bound >= 0 ? (uint32_t)c->ssp_bound : (uint32_t)(d[21] % 4);
    p->faults = c->faults >= 0 ? c->faults : drawn_faults[d[4] % 10];
    p->events = c->events ? c->events : 2000 + d[5] % 8000;
    p->ranges = c->ranges ? c->ranges : 1 + (uint32_t)(d[6] % (2 * p->servers));
    p->window = 1 + (uint32_t)(d[7] % 6);
    p->tick_ms = 20 + (uint32_t)(d[8] % 60);
    p->resend_ms = 50 + (uint32_t)(d[9] % 300);
    p->timeout_ms = 150 + (uint32_t)(d[10] % 600);
    /* The library's default is 6 request timeouts; from 2 to 10 here, so that a sole replica's
     * restart sometimes outlasts it (the request is given up) and sometimes not. */
    p->unavailable_timeout_ms = p->timeout_ms * (2 + (uint32_t)(d[20] % 9));
    p->max_unacked = 2 + (uint32_t)(d[11] % 30);
    p->drop_per_mille = 20 + (uint32_t)(d[12] % 60);
    p->dup_per_mille = 10 + (uint32_t)(d[13] % 40);
    p->long_per_mille = 10 + (uint32_t)(d[14] % 40);
    /* Off unless asked: a refused push followed by a head failover hangs the worker (seed 6,
     * see regressions.txt) until refusals are replicated. */
    p->bad_per_mille = c->refusals ? 1 + (uint32_t)(d[15] % 30) : 0;
    int all = p->faults == SIM_F_ALL;
    int scale = p->faults == SIM_F_SCALE;
    p->restart_per_mille =
        (all || scale || p->faults == SIM_F_RESTART) ? 300 + (uint32_t)(d[16] % 700) : 0;
    p->wipe_per_mille = p->restart_per_mille ? (uint32_t)(d[17] % 600) : 0;
    p->partition_per_mille = p->faults == SIM_F_PARTITION ? 700 : all ? (uint32_t)(d[18] % 400) : 0;
    p->spare = p->faults == SIM_F_JOIN || scale || (all && d[19] % 2);
    /* Off unless asked (sim.seeds_sched_restarts), so that the other tests' seeds keep their
     * runs: a restarted scheduler forgets the joins under way and resumes from what it
     * persisted. */
    p->sched_restart_per_mille = c->sched_restarts ? 300 : 0;
    p->verbose = c->verbose;
    p->push_pull = c->push_pull;
    p->views_unordered = c->views_unordered;
    p->allow_rollback = c->allow_rollback;
    p->wipe_sole = c->wipe_sole;
    /* Off unless asked (sim.seeds_fwd_crash), so that the other tests' seeds keep their runs:
     * where crash faults are drawn, a server may stop between a FWD it sent ahead of its WRITE
     * and that WRITE, at 1 in 50 of those points while no other fault is pending. */
    p->fwd_crash_per_mille = c->fwd_crashes ? 20 : 0;
    /* Off unless asked: without the second probe, false deaths of slow servers are common (the
     * protocol must survive them), and the runs of the other tests' seeds stay as they were. */
    p->single_probe = c->single_probe;
    /* Off unless asked (sim.seeds_fence), so that the other tests' seeds keep their runs. */
    p->fence_faults = c->fence_faults;
    p->drains = c->drains;       /* off unless asked (sim.seeds_drain), as the others */
    p->snap_gaps = c->snap_gaps; /* off unless asked (sim.seeds_snap_gaps), as the others */
    if (p->replicas > p->servers) {
        fprintf(stderr, "sim: --replicas %u > --servers %u\n", p->replicas, p->servers);
        return -1;
    }
    return 0;
}

static void print_replay(const char *prog, const cli *c, const sim_params *p)
{
    char mode[32];
    if (p->mode == SIM_SSP)
        snprintf(mode, sizeof mode, "ssp:%u", p->ssp_bound);
    else
        snprintf(mode, sizeof mode, "%s", mode_names[p->mode]);
    printf("replay: %s --seed %" PRIu64 " --servers %u --workers %u --replicas %u --mode %s "
           "--faults %s",
           prog, p->seed, p->servers, p->workers, p->replicas, mode, fault_names[p->faults]);
    if (c->ranges)
        printf(" --ranges %u", p->ranges);
    if (c->events)
        printf(" --events %" PRIu64, p->events);
    if (c->refusals)
        printf(" --refusals");
    if (c->sched_restarts)
        printf(" --sched-restarts");
    if (c->push_pull)
        printf(" --push-pull");
    if (c->views_unordered)
        printf(" --views-unordered");
    if (c->fwd_crashes)
        printf(" --fwd-crashes");
    if (c->allow_rollback)
        printf(" --allow-rollback");
    if (c->wipe_sole)
        printf(" --wipe-sole");
    if (c->single_probe)
        printf(" --single-probe");
    if (c->fence_faults)
        printf(" --fence-faults");
    if (c->drains)
        printf(" --drains");
    if (c->snap_gaps)
        printf(" --snap-gaps");
    if (c->backup)
        printf(" --backup-workers %u", c->backup);
    printf("\n");
}

static int run_cli(const char *prog, const cli *c)
{
    uint64_t events = 0, acked = 0, views = 0, faults = 0, fenced = 0, zombie = 0;
    uint64_t restarts = 0, wipes = 0, disks_back = 0, parts = 0, joins = 0, rejoins = 0, gated = 0,
             parked = 0;
    uint64_t unavailable = 0, false_deaths = 0, moves = 0, drains = 0, late = 0;
    uint64_t fwd_crashes[2] = {0, 0}, stale_welcomes = 0, sigterms = 0, snap_gaps = 0;
    for (uint64_t i = 0; i < c->seeds; i++) {
        sim_params p;
        if (make_params(c, c->seed + i, &p) != 0)
            return 2;
        sim_summary s;
        if (c->verbose || c->seeds == 1)
            printf("seed %" PRIu64 ": %u servers, %u workers, %u replicas, %u ranges, %s, "
                   "faults %s, %" PRIu64 " fault-phase events\n",
                   p.seed, p.servers, p.workers, p.replicas, p.ranges, mode_names[p.mode],
                   fault_names[p.faults], p.events);
        if (sim_run(&p, &s) != 0) {
            print_replay(prog, c, &p);
            fflush(stdout);
            return 1;
        }
        if (c->verbose || c->seeds == 1)
            printf("seed %" PRIu64 ": ok, %" PRIu64 " events, %" PRIu64 " requests acknowledged, "
                   "%" PRIu64 " views, %" PRIu64 " servers failed, %" PRIu64
                   " messages dropped, %" PRIu64 " ms virtual; %" PRIu64 " restarts (%" PRIu64
                   " on an empty store, %" PRIu64 " old disks put back), %" PRIu64
                   " partitions, %" PRIu64 " fenced rejoins, %" PRIu64 " joins, %" PRIu64
                   " reads gated, %" PRIu64 " pulls parked (SSP), %" PRIu64
                   " requests given up (no replica), %" PRIu64 " false deaths\n",
                   p.seed, s.events, s.acked, s.views, s.faults, s.drops, s.virt_ms, s.restarts,
                   s.wipes, s.disks_back, s.partitions, s.rejoins, s.joins, s.gated, s.ssp_parked,
                   s.unavailable, s.false_deaths);
        events += s.events;
        acked += s.acked;
        views += s.views;
        faults += s.faults;
        fenced += s.fenced;
        zombie += s.zombie_writes;
        restarts += s.restarts;
        wipes += s.wipes;
        disks_back += s.disks_back;
        parts += s.partitions;
        joins += s.joins;
        rejoins += s.rejoins;
        gated += s.gated;
        parked += s.ssp_parked;
        unavailable += s.unavailable;
        false_deaths += s.false_deaths;
        moves += s.moves;
        drains += s.drains;
        late += s.late;
        fwd_crashes[0] += s.fwd_crashes[0];
        fwd_crashes[1] += s.fwd_crashes[1];
        stale_welcomes += s.stale_welcomes;
        sigterms += s.sigterms;
        snap_gaps += s.snap_gaps;
    }
    printf("sim: %" PRIu64 " seeds from %" PRIu64 " passed: %" PRIu64 " events, %" PRIu64
           " requests acknowledged, %" PRIu64 " views, %" PRIu64 " servers failed, %" PRIu64
           " chain messages fenced, %" PRIu64 " writes taken by removed heads; %" PRIu64
           " restarts (%" PRIu64 " on an empty store, %" PRIu64
           " on an old disk put back), %" PRIu64 " partitions, %" PRIu64 " fenced rejoins, %" PRIu64
           " joins by state transfer, %" PRIu64 " reads gated, %" PRIu64
           " pulls parked (SSP), %" PRIu64 " requests given up (no replica), %" PRIu64
           " servers declared dead though up (false deaths)\n",
           c->seeds, c->seed, events, acked, views, faults, fenced, zombie, restarts, wipes,
           disks_back, parts, rejoins, joins, gated, parked, unavailable, false_deaths);
    if (moves || drains)
        printf("sim: %" PRIu64 " ranges moved (balance and drains), %" PRIu64 " servers drained\n",
               moves, drains);
    if (c->fwd_crashes)
        printf("sim: %" PRIu64 " servers stopped between a FWD and its WRITE at a head, %" PRIu64
               " at a middle\n",
               fwd_crashes[0], fwd_crashes[1]);
    if (c->fence_faults)
        printf("sim: %" PRIu64 " late WELCOMEs sent to a later life of their server\n",
               stale_welcomes);
    if (c->drains)
        printf("sim: %" PRIu64 " servers stopped with SIGTERM (each asked to be drained)\n",
               sigterms);
    if (c->drains && c->seeds > 1 && drains == 0) {
        /* Every seed passed, but no drain ever ended: the seeds did not test drains. */
        printf("sim: FAIL: --drains over %" PRIu64 " seeds, and no server was drained\n", c->seeds);
        return 1;
    }
    if (c->snap_gaps)
        printf("sim: %" PRIu64 " snapshot chunks lost with later ones arriving\n", snap_gaps);
    if (c->snap_gaps && c->seeds > 1 && snap_gaps == 0) {
        printf("sim: FAIL: --snap-gaps over %" PRIu64 " seeds, and no chunk was lost\n", c->seeds);
        return 1;
    }
    if (c->backup)
        printf("sim: %" PRIu64 " sync pushes answered as late (backup workers %u)\n", late,
               c->backup);
    return 0;
}

/* Run every "replay:" line of a regressions file (the program path on the line is ignored). */
static int run_regressions(const char *prog, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "sim: cannot open %s\n", path);
        return 2;
    }
    char line[1024];
    int n = 0, rc = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        char *s = line;
        while (*s == ' ' || *s == '\t')
            s++;
        if (*s == '#' || *s == '\n' || *s == 0)
            continue;
        if (strncmp(s, "replay:", 7) != 0) {
            fprintf(stderr, "sim: %s: not a replay line: %s", path, line);
            rc = 2;
            break;
        }
        char *argv[64];
        int argc = 0;
        for (char *tok = strtok(s + 7, " \t\r\n"); tok && argc < 64; tok = strtok(NULL, " \t\r\n"))
            argv[argc++] = tok;
        cli c;
        if (argc < 1 || parse_args(argc - 1, argv + 1, &c) != 0 || !c.have_seed) {
            fprintf(stderr, "sim: %s: bad replay line\n", path);
            rc = 2;
            break;
        }
        rc = run_cli(prog, &c);
        n++;
    }
    fclose(f);
    if (rc == 0)
        printf("sim: %d regression seeds passed\n", n);
    return rc;
}

int main(int argc, char **argv)
{
    cli c;
    if (parse_args(argc - 1, argv + 1, &c) != 0) {
        usage();
        return 2;
    }
    if (c.regressions)
        return run_regressions(argv[0], c.regressions);
    if (!c.have_seed) {
        usage();
        return 2;
    }
    return run_cli(argv[0], &c);
}
