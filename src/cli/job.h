/* A local job: a scheduler, S servers and W workers as child processes on 127.0.0.1, their
 * output streamed with a role prefix, each one startable again (a restart after a kill), and
 * every one ended by its PID. Used by `chainps launch` and `chainps chaos`. */
#ifndef CPS_CLI_JOB_H
#define CPS_CLI_JOB_H

#include <stdint.h>
#include <sys/types.h>

#include "core/config.h"

typedef struct cps__child {
    pid_t pid;
    int fd; /* read end of its stdout+stderr, -1 once closed */
    char tag[32];
    int role;
    int status;
    int exited;
    int starts; /* how many times it was started */
    char line[4096];
    size_t linelen;
    char last_checksum[40]; /* the last "checksum <hex>" the process printed */
    /* The last "trajectory <hex>" (lsq_worker's hash of every step's pulled weights) or
     * "trajectory -" (not comparable) it printed; "" if none. */
    char last_trajectory[40];
    char first_error[512]; /* its first ERROR log line since it was (re)started, "" if none */
} cps__child;

typedef struct cps__job {
    cps__config cfg;
    int S, W;
    int port;
    char data[512];
    int data_given; /* keep it afterwards */
    char self[1024];
    char **prog; /* the worker's argv (borrowed) */
    char mode[32], repl[16], ranges[16];
    cps__child *kids; /* [0] scheduler, [1..S] servers, [S+1..S+W] workers */
    int n;
    const char *prefix;     /* printed before every streamed line, e.g. "" */
    int quiet;              /* do not stream the children's output */
    int hold;               /* scheduler --hold: servers stay up after the workers finish */
    int await_replacements; /* scheduler --await-replacements: a dead worker's rank holds the
                               job's end until a replacement finished it */
    char secret_dir[400];   /* a directory of our own holding the secret we made; "" if none */
    char run_dir[400];      /* the private runtime directory we made for ipc sockets; "" if none */
    /* The scheduler's repairs, read from its log as it streams: ranges short of replicas ("range
     * N has K of R replicas") until a joiner becomes their tail ("joined range N as its tail").
     * repaired_ms: when the last short range was whole again (0: none yet since the last reset),
     * for launch to say when a restarted server had caught up. */
    uint64_t short_ranges[4]; /* ranges 0..255, one bit each */
    int repairing;
    uint64_t repaired_ms;
} cps__job;

/* Set up (data dir, port, executable path, the job's secret: the one cfg names, or a new one
 * made for this job unless cfg->insecure; exported as CHAINPS_SECRET_FILE / CHAINPS_INSECURE so
 * every child and tool run from here has it). cfg: servers, workers, mode, replicas, compress,
 * verbose; data_dir used when data_given. Returns 0 or 1 (message printed). */
int cps__job_init(cps__job *j, const cps__config *cfg, int data_given, int port, char **prog);
/* Start (or start again) child i. Returns 0 or -1 (errno). */
int cps__job_start(cps__job *j, int i);
/* Start everything: scheduler, servers, workers. */
int cps__job_start_all(cps__job *j);
/* Stream output for up to timeout_ms and reap exits. */
void cps__job_pump(cps__job *j, int timeout_ms);
/* Wait for children first..last-1 to exit, up to grace_ms; then SIGTERM, then SIGKILL. */
void cps__job_stop(cps__job *j, int first, int last, int grace_ms);
/* Drain the remaining output, remove the data dir unless it was given, free. */
void cps__job_fini(cps__job *j);
/* "exit status 3" / "killed by signal 9 (Killed)". */
const char *cps__job_exit_text(int status, char *buf, size_t len);
/* 1 if child i exited with status 0. */
int cps__job_ok(const cps__job *j, int i);
/* 1 if child i exited refusing the job for good (CPS_CLI_EXIT_REFUSED, or 2: a usage error):
 * starting it again the same way would be refused again. */
int cps__job_refused(const cps__job *j, int i);

#endif
