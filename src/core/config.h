/* Node configuration from the environment and from command-line flags.
 *
 * Environment (first found wins within a row; two set to different values is an error naming
 * both variables):
 *   role        CHAINPS_ROLE (scheduler|server|worker), DMLC_ROLE (scheduler|server|worker),
 *               MS_ROLE (MS_SCHED|MS_PSERVER|MS_WORKER)
 *   scheduler   CHAINPS_SCHEDULER (host:port); DMLC_PS_ROOT_URI + DMLC_PS_ROOT_PORT;
 *               MS_SCHED_HOST + MS_SCHED_PORT
 *   servers     CHAINPS_NUM_SERVERS, DMLC_NUM_SERVER, MS_SERVER_NUM
 *   workers     CHAINPS_NUM_WORKERS, DMLC_NUM_WORKER, MS_WORKER_NUM
 *   data dir    CHAINPS_DATA_DIR
 *   verbosity   CHAINPS_VERBOSE, PS_VERBOSE (0..3)
 *   mode        CHAINPS_MODE (sync|async|ssp:N), CHAINPS_BACKUP_WORKERS (sync: a step closes
 *               with the first live workers minus this many pushes; default 0)
 *   replicas    CHAINPS_REPLICAS
 *   rank        CHAINPS_RANK (requested worker/server rank; set by `chainps launch`)
 *   bind/adv.   CHAINPS_BIND (host to bind), CHAINPS_ADVERTISE / DMLC_NODE_HOST (host others use)
 *   port        CHAINPS_PORT (inbox port of this node; 0 = pick a free one)
 *   timeouts    CHAINPS_JOIN_TIMEOUT_MS, CHAINPS_REQUEST_TIMEOUT_MS
 *   failures    CHAINPS_HEARTBEAT_MS (interval), CHAINPS_DEAD_AFTER_MS (silence before a node is
 *               declared dead; > the interval), CHAINPS_UNAVAILABLE_TIMEOUT_MS (how long a call
 *               waits for a range with no live replica before failing with CPS_EUNAVAILABLE),
 *               CHAINPS_WORKER_DEAD_AFTER_MS (silence before a worker is declared dead)
 *   compress    CHAINPS_COMPRESS: a comma-separated list of 0|1 (snappy off/on) and a lossy
 *               gradient codec (none|fp16|bf16|topk:R) every worker tensor starts with, e.g.
 *               "1", "fp16", "0,topk:0.01" (what is not named keeps its default)
 *   sync        CHAINPS_SYNC (0|1: fsync every commit)
 *   secret      CHAINPS_SECRET_FILE (the job's secret: every message carries a MAC under it),
 *               CHAINPS_INSECURE (0|1: run without one; refused otherwise)
 */
#ifndef CPS_CORE_CONFIG_H
#define CPS_CORE_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "core/gradcodec.h"
#include "core/view.h"

typedef struct cps__config {
    int role;                      /* cps__role; CPS_ROLE_NONE if unset */
    char sched_host[CPS_ADDR_MAX]; /* default "127.0.0.1" */
    uint16_t sched_port;           /* default 9091 */
    uint32_t num_servers;          /* 0 = unset */
    uint32_t num_workers;          /* 0 = unset */
    char data_dir[512];            /* default "./chainps-data" */
    int reset_data;                /* server --reset-data: wipe the store before joining */
    int data_dir_given;            /* 1 if set by --data or CHAINPS_DATA_DIR: a server then uses
                                      it as it is, else the first free DIR/server-N */
    int verbose;                   /* 0 quiet .. 3 debug; default 0 (INFO logs still shown) */
    uint32_t mode;                 /* cps_mode; default CPS_MODE_SYNC */
    uint32_t ssp_bound;            /* for CPS_MODE_SSP */
    uint32_t backup_workers;       /* CPS_MODE_SYNC: backup workers b (0 = wait for all) */
    uint32_t replicas;             /* 0 = default (min(3, servers)) */
    uint32_t num_ranges;           /* key ranges of the job; 0 = default (one per server) */
    uint32_t rank;                 /* UINT32_MAX = any */
    char bind_host[CPS_ADDR_MAX];  /* default "0.0.0.0" for the scheduler, else advertise host */
    char advertise_host[CPS_ADDR_MAX]; /* default: the local address facing the scheduler */
    uint16_t port;                     /* default 0 (pick), scheduler: sched_port */
    uint32_t join_timeout_ms;          /* default 60000 */
    uint32_t request_timeout_ms;       /* default 5000 (a request is re-sent after this) */
    uint32_t heartbeat_ms;             /* default 100 (loopback; a data center wants ~1000) */
    uint32_t dead_after_ms;            /* default 400 (loopback; a data center wants ~5000) */
    uint32_t worker_dead_after_ms;     /* default 5000: a worker dropped too early changes a sync
                                          job's result, one noticed late only delays a step */
    uint32_t unavailable_timeout_ms;   /* default 30000 */
    uint32_t scheduler_timeout_ms;     /* server: exit once the scheduler has been unreachable
                                          this long; default 300000 */
    uint32_t max_tensor_mb;            /* worker: refuse to declare a tensor (or table) of more
                                          float32 bytes than this; default 65536 (64 GiB) */
    int compress;                      /* snappy; default 1 */
    cps__gradcodec grad_codec;         /* workers' default lossy codec; default none */
    int sync_every_commit;             /* default 0 */
    int hold_workers;                  /* scheduler: welcome no worker until a RELEASE (a
                                          checkpoint is being restored: --restore-from) */
    int hold;                          /* scheduler: keep servers up after the workers finish,
                                          until `chainps status --end` (flag --hold) */
    int await_replacements;            /* scheduler: the job does not end while a dead worker's
                                          rank has no worker that finished it: a replacement is
                                          coming (flag --await-replacements; launch
                                          --restart-workers sets it and ends the job itself if
                                          it gives up on one) */
    int allow_rollback;                /* scheduler: a range whose only replica is down with a
                                          fallback as the scheduler resumes goes to the server
                                          that left it last, should that replica come back
                                          empty, losing the updates acknowledged since (flag
                                          --allow-rollback; once per range; default: it waits) */
    /* Checkpoints taken by the scheduler's process (src/cli/ckpt_jobs.c). */
    uint64_t ckpt_every;    /* 0: none; steps, or seconds if ckpt_every_seconds */
    int ckpt_every_seconds; /* --checkpoint-every 30s */
    char ckpt_dir[512];     /* --checkpoint-dir (default DATA/checkpoints) */
    uint32_t ckpt_keep;     /* --keep: newest checkpoints kept (0: all) */
    char restore_from[512]; /* --restore-from: load this checkpoint before the workers */
    char restore_optim[64]; /* --restore-optimizer KIND:LR for tensors without a description */
    /* Prometheus metrics (node/metrics.h): the scheduler's or server's HTTP port (0: none) and
     * the address it listens on ("": 127.0.0.1). */
    uint16_t metrics_port;
    char metrics_bind[CPS_ADDR_MAX];
    /* The job's secret (src/transport/auth.h). cps__config_load_secret() reads secret_file into
     * secret_key; without a file a node refuses to start unless `insecure` says so. */
    char secret_file[512];
    int insecure;
    int secret_loaded;
    unsigned char secret_key[32];
} cps__config;

/* Fill every field with its default. */
void cps__config_defaults(cps__config *cfg);

/* Overlay the environment onto cfg. On a bad or conflicting value returns CPS_ECONFIG and writes
 * a message naming the variable(s) into err (capacity errlen). */
int cps__config_from_env(cps__config *cfg, char *err, size_t errlen);

/* Parse helpers shared with the CLI; each returns CPS_ECONFIG with a message naming `what`. */
int cps__config_parse_u32(const char *what, const char *s, uint32_t min, uint32_t max,
                          uint32_t *out, char *err, size_t errlen);
int cps__config_parse_hostport(const char *what, const char *s, char host[CPS_ADDR_MAX],
                               uint16_t *port, char *err, size_t errlen);
/* "sync" | "async" | "ssp:N" (N 0..1000000). */
int cps__config_parse_mode(const char *what, const char *s, uint32_t *mode, uint32_t *bound,
                           char *err, size_t errlen);
/* A backup-worker count (0..CPS_MAX_NODES-1); the job's limit is checked by
 * cps__config_check_backup once every flag is in. */
int cps__config_parse_backup(const char *what, const char *s, uint32_t *out, char *err,
                             size_t errlen);
/* The backup workers against the rest of cfg: b > 0 needs sync mode and b < num_workers (a step
 * needs at least one gradient). Returns 0, or CPS_EINVAL with a message naming --backup-workers
 * and CHAINPS_BACKUP_WORKERS in err. */
int cps__config_check_backup(const cps__config *cfg, char *err, size_t errlen);
/* CHAINPS_COMPRESS's value: comma-separated "0"/"1" (snappy) and at most one codec spec
 * (core/gradcodec.h), applied to cfg->compress / cfg->grad_codec. */
int cps__config_parse_compress(const char *what, const char *s, cps__config *cfg, char *err,
                               size_t errlen);
/* The CHAINPS_COMPRESS value that stands for cfg's snappy and codec settings into buf. */
const char *cps__config_compress_str(const cps__config *cfg, char *buf, size_t len);
/* "scheduler"|"server"|"worker" plus MS_SCHED/MS_PSERVER/MS_WORKER. */
int cps__config_parse_role(const char *what, const char *s, int *role, char *err, size_t errlen);

/* "sync", "async" or "ssp:N" into buf. */
const char *cps__config_mode_str(uint32_t mode, uint32_t bound, char *buf, size_t len);
const char *cps__config_role_str(int role);

/* Set CHAINPS_* environment variables describing cfg (for `chainps launch` children).
 * Returns 0 or CPS_ENOMEM. */
int cps__config_export_env(const cps__config *cfg);

#endif
