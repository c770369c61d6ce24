/* `chainps chaos`: a local job under fire. It runs the job once without faults (the
 * reference), then again while killing (SIGKILL), pausing (SIGSTOP/SIGCONT) and restarting its
 * servers — and, when asked, its scheduler and workers — at moments drawn from the seed. At the
 * end it checks that the job finished without a restart, that every range's replicas agree,
 * that (sync) the workers ended with the same parameters, and, in sync mode with no worker
 * killed, that the final parameters are bitwise those of the reference run (no acknowledged
 * update lost or applied twice), and so is the trajectory where the workers print one (the
 * weights pulled at every step: a lost update after the weights froze changes only that). A killed
 * worker is not bitwise-comparable even when replaced: the steps between its death and its
 * replacement's join close without its gradient. */
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "job.h"
#include "node/msg.h"

static const char chaos_usage[] =
    "usage: chainps chaos --seed N [options] -- --servers S --workers W [launch options] \\\n"
    "           -- PROGRAM [ARGS...]\n"
    "\n"
    "Run a local job (as `chainps launch` would) while killing, pausing and restarting its\n"
    "processes at random moments drawn from the seed, logging every event; then check:\n"
    "the job finished without a restart, the replicas of every range agree, (sync mode) every\n"
    "worker ended with the same parameters, and (sync mode, no worker killed) the final\n"
    "parameters are bitwise identical to a fault-free run of the same job, which chaos runs\n"
    "first. The workers must print `checksum <hex>` of their final parameters (as\n"
    "examples/fmnist and tests/integration/lsq_worker do). A worker that also prints\n"
    "`trajectory <hex>` (a hash of the weights it pulled at every step, as lsq_worker does)\n"
    "has it compared too, with the other workers' and (same conditions) the fault-free run's:\n"
    "an update lost or applied twice after the weights stopped changing shows only there.\n"
    "`trajectory -` (or none) is not compared, and the output says so.\n"
    "The last line is `chaos: PASS ...` or `chaos: FAIL <what>`; the exit status 0 or 1.\n"
    "\n"
    "  --seed N           the seed of every random choice (required)\n"
    "  --kill-every MS    mean time between faults (default 1500)\n"
    "  --restart-after MS how long a killed process stays down (default 800)\n"
    "  --pause            also pause servers (SIGSTOP past the failure timeout, then SIGCONT)\n"
    "  --kill-scheduler   also kill and restart the scheduler\n"
    "  --kill-workers     also kill workers (at most W-1 down at once); their shard is skipped\n"
    "                     and the bitwise comparison is skipped. They stay down, unless the\n"
    "                     launch options hold --restart-workers: then each is started again\n"
    "                     with its rank once the scheduler has declared it dead, and resumes\n"
    "                     at the step the others are on (cps_start_step)\n"
    "  --spare-server R   never fault server rank R, so that one server lives as long as the\n"
    "                     job (a soak watches its memory and open files)\n"
    "  --scale            also drain servers (`chainps drain`: their ranges move to the others,\n"
    "                     then they exit 0); a drained server is started again and joins as a\n"
    "                     new member, taking a share of the ranges back (give the job\n"
    "                     --ranges larger than --servers so the shares are fair)\n"
    "  --max-faults N     stop injecting after N faults (default 1000)\n"
    "  --no-reference     skip the fault-free run (and the bitwise comparison)\n"
    "  -h, --help         this text\n";

enum {
    OPT_SEED = 2000,
    OPT_EVERY,
    OPT_RESTART,
    OPT_PAUSE,
    OPT_KSCHED,
    OPT_KWORK,
    OPT_MAXF,
    OPT_NOREF,
    OPT_SCALE,
    OPT_SPARE
};

static const struct option chaos_opts[] = {{"seed", required_argument, 0, OPT_SEED},
                                           {"kill-every", required_argument, 0, OPT_EVERY},
                                           {"restart-after", required_argument, 0, OPT_RESTART},
                                           {"pause", no_argument, 0, OPT_PAUSE},
                                           {"kill-scheduler", no_argument, 0, OPT_KSCHED},
                                           {"kill-workers", no_argument, 0, OPT_KWORK},
                                           {"max-faults", required_argument, 0, OPT_MAXF},
                                           {"scale", no_argument, 0, OPT_SCALE},
                                           {"spare-server", required_argument, 0, OPT_SPARE},
                                           {"no-reference", no_argument, 0, OPT_NOREF},
                                           {"help", no_argument, 0, 'h'},
                                           {0, 0, 0, 0}};

static volatile sig_atomic_t interrupted;

static void on_interrupt(int sig)
{
    (void)sig;
    interrupted = 1;
}

typedef struct chaos {
    uint64_t rng;
    uint32_t every_ms, restart_ms, max_faults;
    int pause, kill_sched, kill_workers, reference, scale;
    int restart_workers; /* launch's --restart-workers: killed workers get a replacement */
    int spare;           /* server rank never faulted, -1 for none */
    uint64_t t0;
    /* per child: when it may be restarted (0: not down), and whether we paused it */
    uint64_t *down_until;
    int *paused, *killed_for_good, *draining;
    int *replaced; /* per worker: replacements we started (not restarts of the job) */
    uint32_t kills, pauses, restarts, drains, replacements;
    int drain_failed; /* a drained server exited with another status than 0 */
} chaos;

static uint64_t next_rand(chaos *c)
{
    c->rng = cps__splitmix64(c->rng);
    return c->rng;
}

static void event(const chaos *c, const char *fmt, ...)
{
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    printf("chaos: +%.3f s %s\n", (cps__now_ms() - c->t0) / 1000.0, line);
    fflush(stdout);
}

static int servers_down(const cps__job *j, const chaos *c)
{
    int n = 0;
    for (int i = 1; i <= j->S; i++)
        n += c->down_until[i] != 0 || c->paused[i] || c->draining[i];
    return n;
}

static int run_status(const cps__job *j, const char *arg1, const char *arg2);

/* `chainps drain --server RANK --no-wait` against the job; its exit status. */
static int run_drain(const cps__job *j, int rank)
{
    char sched[64], r[16];
    snprintf(sched, sizeof sched, "127.0.0.1:%d", j->port);
    snprintf(r, sizeof r, "%d", rank);
    pid_t pid = fork();
    if (pid == 0) {
        char *av[] = {(char *)j->self, "drain", "--scheduler", sched,
                      "--server",      r,       "--no-wait",   NULL};
        execv(j->self, av);
        _exit(127);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* One fault: a random victim among those whose loss the job can survive. */
static void inject(cps__job *j, chaos *c, uint64_t now)
{
    int candidates[1100], k = 0;
    int R = atoi(j->repl);
    /* At most R-1 servers down at once: every range keeps a live replica. */
    if (servers_down(j, c) < R - 1)
        for (int i = 1; i <= j->S; i++)
            if (!c->down_until[i] && !c->paused[i] && !j->kids[i].exited && i - 1 != c->spare)
                candidates[k++] = i;
    if (c->kill_sched && !c->down_until[0] && !j->kids[0].exited)
        candidates[k++] = 0;
    if (c->kill_workers) {
        int alive = 0;
        /* One worker always runs (a replacement pending is not running yet). */
        for (int i = 1 + j->S; i < j->n; i++)
            alive += !j->kids[i].exited && !c->killed_for_good[i] && !c->down_until[i];
        for (int i = 1 + j->S; i < j->n && alive > 1; i++)
            if (!j->kids[i].exited && !c->killed_for_good[i] && !c->down_until[i])
                candidates[k++] = i;
    }
    if (k == 0)
        return;
    int v = candidates[next_rand(c) % (uint64_t)k];
    cps__child *ch = &j->kids[v];
    /* A drain leaves R servers up besides the drained one (and any down): the others hold
     * every range. */
    if (ch->role == CPS_ROLE_SERVER && c->scale && next_rand(c) % 3 == 0 &&
        j->S - servers_down(j, c) - 1 >= R) {
        int rc = run_drain(j, v - 1);
        event(c, "drain %s (pid %d)%s", ch->tag, (int)ch->pid, rc == 0 ? "" : ": refused");
        if (rc == 0) {
            c->draining[v] = 1;
            c->drains++;
        }
        return;
    }
    if (ch->role == CPS_ROLE_SERVER && c->pause && next_rand(c) % 2 == 0) {
        kill(ch->pid, SIGSTOP);
        c->paused[v] = 1;
        /* Past the failure timeout, so the pause is noticed and the server is fenced. */
        c->down_until[v] = now + 2 * j->cfg.dead_after_ms + next_rand(c) % 500;
        c->pauses++;
        event(c, "SIGSTOP %s (pid %d)", ch->tag, (int)ch->pid);
        return;
    }
    kill(ch->pid, SIGKILL);
    c->kills++;
    if (ch->role == CPS_ROLE_WORKER && c->restart_workers) {
        /* As launch does: a replacement that joined before the scheduler declared the old
         * process dead would find its rank still taken. */
        uint64_t wait = (uint64_t)j->cfg.worker_dead_after_ms + 1000;
        c->down_until[v] = now + wait;
        event(c, "SIGKILL %s (pid %d); a replacement starts in %.1f s", ch->tag, (int)ch->pid,
              wait / 1000.0);
        return;
    }
    if (ch->role == CPS_ROLE_WORKER) {
        c->killed_for_good[v] = 1;
        event(c, "SIGKILL %s (pid %d); it stays down, its shard is skipped", ch->tag, (int)ch->pid);
        return;
    }
    c->down_until[v] = now + c->restart_ms;
    event(c, "SIGKILL %s (pid %d)", ch->tag, (int)ch->pid);
}

/* Resume paused processes and restart killed ones whose time has come; a server that left on
 * its own (fenced after a pause) is restarted too. */
static void heal(cps__job *j, chaos *c, uint64_t now, int workers_done)
{
    for (int i = 1 + j->S; i < j->n; i++) {
        cps__child *ch = &j->kids[i];
        if (c->down_until[i] && now >= c->down_until[i] && ch->exited) {
            c->down_until[i] = 0;
            if (cps__job_start(j, i) == 0) {
                c->replacements++;
                c->replaced[i]++;
                event(c, "replacement %s (pid %d) started", ch->tag, (int)ch->pid);
            }
        }
    }
    for (int i = 0; i <= j->S; i++) {
        cps__child *ch = &j->kids[i];
        if (c->paused[i] && now >= c->down_until[i]) {
            kill(ch->pid, SIGCONT);
            c->paused[i] = 0;
            c->down_until[i] = 0;
            event(c, "SIGCONT %s (pid %d)", ch->tag, (int)ch->pid);
            continue;
        }
        if (c->draining[i] && ch->exited) {
            char b[96];
            c->draining[i] = 0;
            int ok = WIFEXITED(ch->status) && WEXITSTATUS(ch->status) == 0;
            event(c, "%s drained and exited (%s); it starts again and joins as a new member",
                  ch->tag, cps__job_exit_text(ch->status, b, sizeof b));
            if (!ok)
                c->drain_failed = 1;
            c->down_until[i] = now + c->restart_ms;
            continue;
        }
        if (c->down_until[i] && now >= c->down_until[i] && ch->exited) {
            c->down_until[i] = 0;
            if (cps__job_start(j, i) == 0) {
                c->restarts++;
                event(c, "restarted %s (pid %d)", ch->tag, (int)ch->pid);
            }
            continue;
        }
        if (!c->down_until[i] && !c->paused[i] && ch->exited && !workers_done) {
            char b[96];
            event(c, "%s exited by itself (%s); restarting it", ch->tag,
                  cps__job_exit_text(ch->status, b, sizeof b));
            c->down_until[i] = now + c->restart_ms;
        }
    }
}

/* Run `chainps status` against the job with extra arguments; returns its exit status. */
static int run_status(const cps__job *j, const char *arg1, const char *arg2)
{
    char sched[64];
    snprintf(sched, sizeof sched, "127.0.0.1:%d", j->port);
    pid_t pid = fork();
    if (pid == 0) {
        char *av[] = {(char *)j->self, "status",     "--scheduler", sched,
                      (char *)arg1,    (char *)arg2, NULL};
        execv(j->self, av);
        _exit(127);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A trajectory hash that can be compared: printed, and not "-". */
static int comparable_traj(const char *t)
{
    return t[0] && strcmp(t, "-") != 0;
}

/* The fault-free run: the workers' final checksums and trajectories. Returns 0 if it
 * succeeded. */
static int reference_run(const cps__config *cfg, char **prog, char sums[][40], char trajs[][40],
                         int W)
{
    cps__job j;
    if (cps__job_init(&j, cfg, 0, 0, prog) != 0)
        return 1;
    j.quiet = 1;
    int rc = cps__job_start_all(&j);
    uint64_t deadline = cps__now_ms() + 1800 * 1000;
    while (rc == 0) {
        cps__job_pump(&j, 100);
        if (interrupted)
            rc = 1;
        int left = 0, failed = -1;
        for (int i = 1 + j.S; i < j.n; i++) {
            left += !j.kids[i].exited;
            if (j.kids[i].exited && !cps__job_ok(&j, i))
                failed = i;
        }
        /* The run is quiet: say which worker failed, or the user sees no reason at all. */
        if (failed >= 0) {
            char b[96];
            printf("chaos: the reference run's %s exited (%s); run the job under `chainps "
                   "launch` to see its output\n",
                   j.kids[failed].tag, cps__job_exit_text(j.kids[failed].status, b, sizeof b));
            rc = 1;
        } else if (cps__now_ms() > deadline) {
            printf("chaos: the reference run did not finish in 1800 s\n");
            rc = 1;
        }
        if (!left)
            break;
    }
    cps__job_stop(&j, 1 + j.S, j.n, rc ? 0 : 5000);
    cps__job_stop(&j, 0, 1 + j.S, 10000);
    for (int w = 0; w < W; w++) {
        snprintf(sums[w], 40, "%s", j.kids[1 + j.S + w].last_checksum);
        snprintf(trajs[w], 40, "%s", j.kids[1 + j.S + w].last_trajectory);
    }
    cps__job_fini(&j);
    return rc;
}

int cps__cli_chaos(int argc, char **argv)
{
    chaos c;
    memset(&c, 0, sizeof c);
    c.every_ms = 1500;
    c.restart_ms = 800;
    c.max_faults = 1000;
    c.reference = 1;
    c.spare = -1;
    int have_seed = 0, opt;
    char err[256];
    optind = 1;
    /* Our own options stop at the first "--"; the rest is launch's. */
    int split = argc;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--")) {
            split = i;
            break;
        }
    while ((opt = getopt_long(split, argv, "h", chaos_opts, NULL)) != -1) {
        uint32_t v = 0;
        switch (opt) {
        case 'h':
            fputs(chaos_usage, stdout);
            return 0;
        case OPT_SEED:
            if (cps__config_parse_u32("--seed", optarg, 0, UINT32_MAX, &v, err, sizeof err)) {
                fprintf(stderr, "chainps chaos: %s\n", err);
                return 2;
            }
            c.rng = v;
            have_seed = 1;
            break;
        case OPT_EVERY:
        case OPT_RESTART:
        case OPT_MAXF:
            if (cps__config_parse_u32(
                    opt == OPT_MAXF ? "--max-faults" : "--kill-every/--restart-after", optarg,
                    opt == OPT_MAXF ? 0 : 50, 3600000, &v, err, sizeof err)) {
                fprintf(stderr, "chainps chaos: %s\n", err);
                return 2;
            }
            if (opt == OPT_EVERY)
                c.every_ms = v;
            else if (opt == OPT_RESTART)
                c.restart_ms = v;
            else
                c.max_faults = v;
            break;
        case OPT_PAUSE:
            c.pause = 1;
            break;
        case OPT_KSCHED:
            c.kill_sched = 1;
            break;
        case OPT_KWORK:
            c.kill_workers = 1;
            break;
        case OPT_NOREF:
            c.reference = 0;
            break;
        case OPT_SCALE:
            c.scale = 1;
            break;
        case OPT_SPARE:
            if (cps__config_parse_u32("--spare-server", optarg, 0, 1023, &v, err, sizeof err)) {
                fprintf(stderr, "chainps chaos: %s\n", err);
                return 2;
            }
            c.spare = (int)v;
            break;
        default:
            return cps__cli_usage_error("chaos", "unknown option");
        }
    }
    if (optind < split)
        return cps__cli_usage_error("chaos", "unexpected argument '%s'", argv[optind]);
    if (!have_seed)
        return cps__cli_usage_error("chaos", "--seed is required");
    if (split >= argc)
        return cps__cli_usage_error("chaos", "the job's launch arguments go after --");

    cps__config cfg;
    if (cps__cli_config(&cfg) != 0)
        return 2;
    int data_given, port;
    uint32_t timeout_s, kill_at_s;
    char **prog;
    int prc = cps__cli_job_args("chaos", argc - split, argv + split, &cfg, &data_given, &port,
                                &timeout_s, &kill_at_s, &prog);
    if (prc != 0)
        return prc < 0 ? 0 : prc;
    c.restart_workers = cps__cli_job_restart_workers();
    if (c.spare >= (int)cfg.num_servers)
        return cps__cli_usage_error("chaos", "--spare-server %d: there are only %u servers",
                                    c.spare, cfg.num_servers);
    if (!timeout_s)
        timeout_s = 1800;
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {0};
    sa.sa_handler = on_interrupt;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    int W = (int)cfg.num_workers;
    char(*ref)[40] = calloc((size_t)W, sizeof *ref);
    char(*ref_traj)[40] = calloc((size_t)W, sizeof *ref_traj);
    if (!ref || !ref_traj) {
        free(ref);
        free(ref_traj);
        return 1;
    }
    uint64_t seed = c.rng;
    c.rng = cps__splitmix64(seed ^ 0x63686171736fULL);
    int compare = c.reference && cfg.mode == CPS_MODE_SYNC;
    if (compare) {
        printf("chaos: seed %llu: fault-free reference run first\n", (unsigned long long)seed);
        fflush(stdout);
        if (reference_run(&cfg, prog, ref, ref_traj, W) != 0) {
            printf("chaos: FAIL the fault-free reference run failed\n");
            free(ref);
            free(ref_traj);
            return 1;
        }
        printf("chaos: reference checksum %s, trajectory %s\n",
               ref[0][0] ? ref[0] : "(none printed)",
               ref_traj[0][0] ? ref_traj[0] : "(none printed)");
    }

    cps__job j;
    if (cps__job_init(&j, &cfg, data_given, port, prog) != 0) {
        free(ref);
        free(ref_traj);
        return 1;
    }
    j.hold = 1; /* keep the servers up at the end, to compare the replicas */
    /* A rank whose replacement is pending holds the job's end, as under launch. */
    j.await_replacements = c.restart_workers;
    c.down_until = calloc((size_t)j.n, sizeof *c.down_until);
    c.paused = calloc((size_t)j.n, sizeof *c.paused);
    c.killed_for_good = calloc((size_t)j.n, sizeof *c.killed_for_good);
    c.draining = calloc((size_t)j.n, sizeof *c.draining);
    c.replaced = calloc((size_t)j.n, sizeof *c.replaced);
    int rc = (c.down_until && c.paused && c.killed_for_good && c.draining && c.replaced)
                 ? cps__job_start_all(&j)
                 : 1;
    c.t0 = cps__now_ms();
    printf("chaos: seed %llu: %d servers (chains of %s), %d workers, mode %s; a fault every "
           "~%u ms\n",
           (unsigned long long)seed, j.S, j.repl, j.W, j.mode, c.every_ms);
    uint64_t next_fault = c.t0 + 1000 + next_rand(&c) % c.every_ms;
    const char *fail = NULL;
    char why[256] = "";
    int workers_done = 0;
    while (rc == 0) {
        cps__job_pump(&j, 50);
        uint64_t now = cps__now_ms();
        int left = 0;
        for (int i = 1 + j.S; i < j.n; i++) {
            cps__child *ch = &j.kids[i];
            if (c.killed_for_good[i])
                continue;
            if (c.down_until[i]) { /* killed by us, its replacement pending */
                left++;
                continue;
            }
            left += !ch->exited;
            if (ch->exited && !cps__job_ok(&j, i) && !fail) {
                char b[96];
                snprintf(why, sizeof why, "%s failed (%s)", ch->tag,
                         cps__job_exit_text(ch->status, b, sizeof b));
                fail = why;
            }
        }
        if (fail)
            break;
        if (!left) {
            workers_done = 1;
            break;
        }
        if (now - c.t0 > (uint64_t)timeout_s * 1000) {
            fail = "the job did not finish in time";
            break;
        }
        if (interrupted) {
            fail = "interrupted";
            break;
        }
        heal(&j, &c, now, 0);
        if (now >= next_fault && c.kills + c.pauses + c.drains < c.max_faults) {
            inject(&j, &c, now);
            next_fault = now + c.every_ms / 2 + next_rand(&c) % c.every_ms;
        }
    }
    /* Let every server come back before checking them. */
    uint64_t settle = cps__now_ms() + 3 * c.restart_ms + 3000;
    while (workers_done && cps__now_ms() < settle) {
        int pending = 0;
        for (int i = 0; i <= j.S; i++)
            pending += c.down_until[i] != 0 || c.paused[i] || c.draining[i];
        if (!pending)
            break;
        heal(&j, &c, cps__now_ms(), 0);
        cps__job_pump(&j, 50);
    }
    int verify = -1;
    if (workers_done && !fail) {
        /* Give joining replicas a moment to catch up, then compare them. */
        for (int attempt = 0; attempt < 20; attempt++) {
            cps__job_pump(&j, 500);
            verify = run_status(&j, "--verify", NULL);
            if (verify == 0)
                break;
        }
    }
    run_status(&j, "--end", NULL);
    cps__job_stop(&j, 1 + j.S, j.n, 0);
    cps__job_stop(&j, 0, 1 + j.S, 10000);

    int restarted_workers = 0, killed_workers = 0, sums_agree = -1;
    for (int i = 1 + j.S; i < j.n; i++) {
        /* Replacements of workers we killed are the fault's cure, not a restart of the job. */
        restarted_workers += j.kids[i].starts > 1 + c.replaced[i];
        killed_workers += c.killed_for_good[i] || c.replaced[i];
    }
    /* Sync: every worker pulls the same final parameters, replacements included. */
    if (cfg.mode == CPS_MODE_SYNC && workers_done && !fail) {
        const char *first = NULL;
        sums_agree = 1;
        for (int i = 1 + j.S; i < j.n; i++) {
            const char *sum = j.kids[i].last_checksum;
            if (c.killed_for_good[i] || !sum[0])
                continue;
            if (first && strcmp(first, sum))
                sums_agree = 0;
            first = first ? first : sum;
        }
        if (!first)
            sums_agree = -1;
    }
    /* Sync: every worker that started at step 0 pulled the same weights at every step. */
    int trajs_agree = -1;
    char traj_skip[160] = "";
    if (cfg.mode == CPS_MODE_SYNC && workers_done && !fail) {
        const char *first = NULL;
        for (int i = 1 + j.S; i < j.n; i++) {
            const char *t = j.kids[i].last_trajectory;
            if (c.killed_for_good[i])
                continue;
            if (!comparable_traj(t)) {
                if (!traj_skip[0])
                    snprintf(traj_skip, sizeof traj_skip, "%s printed %s", j.kids[i].tag,
                             t[0] ? "trajectory -" : "no trajectory");
                continue;
            }
            if (first && strcmp(first, t))
                trajs_agree = 0;
            else if (trajs_agree < 0 && first)
                trajs_agree = 1;
            first = first ? first : t;
        }
    }
    int identical = -1, traj_identical = -1;
    char got[40] = "", got_traj[40] = "", want_traj[40] = "";
    if (compare && !killed_workers && workers_done && !fail) {
        identical = 1;
        for (int w = 0; w < W; w++) {
            const char *sum = j.kids[1 + j.S + w].last_checksum;
            snprintf(got, sizeof got, "%s", sum);
            identical &= sum[0] && !strcmp(sum, ref[w]);
            /* A "-" on either side (e.g. backup workers dropped a late push) is not compared. */
            const char *t = j.kids[1 + j.S + w].last_trajectory;
            if (!comparable_traj(t) || !comparable_traj(ref_traj[w])) {
                const char *side = comparable_traj(t) ? ref_traj[w] : t;
                if (!traj_skip[0])
                    snprintf(traj_skip, sizeof traj_skip, "worker %d printed %s in the %s run", w,
                             side[0] ? "trajectory -" : "no trajectory",
                             comparable_traj(t) ? "fault-free" : "faulted");
                continue;
            }
            if (traj_identical != 0 || strcmp(t, ref_traj[w])) {
                snprintf(got_traj, sizeof got_traj, "%s", t);
                snprintf(want_traj, sizeof want_traj, "%s", ref_traj[w]);
            }
            traj_identical = (traj_identical != 0) && !strcmp(t, ref_traj[w]);
        }
    }
    printf("chaos: %u kills, %u pauses, %u drains, %u restarts, %u worker replacements in "
           "%.1f s\n",
           c.kills, c.pauses, c.drains, c.restarts, c.replacements,
           (cps__now_ms() - c.t0) / 1000.0);
    printf("chaos: job finished without a restart: %s\n",
           workers_done && !fail && !restarted_workers ? "yes" : "NO");
    printf("chaos: replicas agree: %s\n", verify == 0 ? "yes" : verify < 0 ? "not checked" : "NO");
    if (sums_agree >= 0)
        printf("chaos: workers' final checksums agree: %s\n", sums_agree ? "yes" : "NO");
    if (trajs_agree >= 0)
        printf("chaos: workers' trajectories agree: %s\n", trajs_agree ? "yes" : "NO");
    if (identical >= 0)
        printf("chaos: final parameters identical to the fault-free run: %s (%s vs %s)\n",
               identical ? "yes" : "NO", got, ref[0]);
    else
        printf("chaos: final parameters compared with the fault-free run: skipped (%s)\n",
               !compare         ? "not sync mode, or --no-reference"
               : killed_workers ? "a worker was killed"
                                : "the job did not finish");
    if (traj_identical >= 0)
        printf("chaos: trajectory identical to the fault-free run: %s (%s vs %s)\n",
               traj_identical ? "yes" : "NO", got_traj, want_traj);
    if (traj_skip[0])
        printf("chaos: trajectory not comparable: %s%s\n", traj_skip,
               traj_identical >= 0 || trajs_agree >= 0 ? " (the others compared)" : "");
    if (!fail && !workers_done)
        fail = "the job did not finish";
    if (!fail && verify != 0)
        fail = "replicas differ (or could not be compared)";
    if (!fail && sums_agree == 0)
        fail = "workers ended with different parameters";
    if (!fail && trajs_agree == 0)
        fail = "workers pulled different weights along the way (trajectories differ)";
    if (!fail && identical == 0)
        fail = traj_identical == 0
                   ? "final parameters and trajectory differ from the fault-free run"
                   : "final parameters differ from the fault-free run";
    if (!fail && traj_identical == 0)
        fail = "trajectory differs from the fault-free run (final parameters equal)";
    if (!fail && c.drain_failed)
        fail = "a drained server did not exit 0";
    cps__job_fini(&j);
    free(c.down_until);
    free(c.paused);
    free(c.killed_for_good);
    free(c.draining);
    free(c.replaced);
    free(ref);
    free(ref_traj);
    if (fail) {
        printf("chaos: FAIL %s (replay: chainps chaos --seed %llu ...)\n", fail,
               (unsigned long long)seed);
        return 1;
    }
    printf("chaos: PASS seed %llu: %u faults, job finished, replicas agree%s, %s\n",
           (unsigned long long)seed, c.kills + c.pauses + c.drains,
           identical == 1 ? ", parameters bitwise identical to the fault-free run" : "",
           traj_identical == 1 ? "trajectory bitwise the fault-free run's"
           : trajs_agree == 1  ? "trajectories compared across workers only"
                               : "trajectories not compared");
    return 0;
}
