/* The cluster simulator's shared types: see sim.c for what it models. Everything is owned by the
 * `sim` of one run and freed by sim_run before it returns. */
#ifndef CPS_TESTS_SIM_H
#define CPS_TESTS_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "core/config.h"
#include "core/view.h"
#include "recovery/coordinator.h"
#include "recovery/joiner.h"
#include "recovery/session.h"
#include "replication/chain.h"
#include "replication/replica.h"

#define SIM_MAX_SERVERS 16
#define SIM_MAX_WORKERS 16
#define SIM_MAX_EPOCHS  512
#define SIM_MAX_RANGES  256
/* Faults stop once the scheduler reached this epoch: the rest is room for repairs. */
#define SIM_FAULT_EPOCHS   384
#define SIM_MAX_NODES      (1 + SIM_MAX_SERVERS + SIM_MAX_WORKERS)
#define SIM_TRACE_LINES    40
#define SIM_TRACE_LEN      200
#define SIM_WORKER_TICK_MS 10
/* After the network heals, everything must finish within this many events. */
#define SIM_HEAL_EVENTS 400000u
/* Invariant 17's liveness half: an accepted drain ends (the server let go) within this much
 * virtual time of the scheduler's ACK. Its ranges move by joins, each a snapshot that may linger
 * CPS_REPLICA_SNAP_LINGER_MS after a lost chunk, with faults between. */
#define SIM_DRAIN_END_MS 180000u

/* SIM_SSP: bounded staleness (--mode ssp:N), drawn from a seed only with --push-pull, so the
 * seeds of sim.seeds keep their runs. */
enum { SIM_SYNC = 0, SIM_ASYNC = 1, SIM_SSP = 2 };
/* Scheduler-side timers of state transfer, in virtual ms (production: 120 s; scaled down). */
#define SIM_REPAIR_MS 100
/* The coordinator's tick (production: 20 ms) and its batching of joiners (production: 100). */
#define SIM_SCHED_TICK_MS 20
#define SIM_BATCH_MS      100
#define SIM_SCHED_BLOBS   6
/* After the job ended, messages still on their way get this long before stores are compared. */
#define SIM_END_SETTLE_MS   3000
#define SIM_JOIN_GIVE_UP_MS 3000
#define SIM_JOIN_TIMEOUT_MS 2500
/* A joiner re-sends SNAP_REQ this often until the snapshot comes (the server's: 1 s, unscaled:
 * it stands for a lost request, not for the size of a snapshot). */
#define SIM_SNAP_RETRY_MS 1000
#define SIM_HELLO_MS      100
#define SIM_BEAT_MS       200
/* A server silent this long is declared dead (CHAINPS_DEAD_AFTER_MS, 4 heartbeats;
 * 3 here, so that drops and long delays sometimes make a live server look dead). */
#define SIM_DEAD_AFTER_MS 600

/* Fault kinds. restart: crashes, then restarts on the same store or an empty one; partition:
 * servers cut off from the scheduler, from peers or from workers for a while; join: a cps__server
 * holding nothing at the start, and crashes (repairs copy ranges onto the survivors); all: every
 * kind mixed, with drops. Every kind runs the scheduler's repair (state transfer). */
enum {
    SIM_F_NONE = 0,
    SIM_F_DROPS,
    SIM_F_CRASH,
    SIM_F_PAUSE,
    SIM_F_ALL,
    SIM_F_RESTART,
    SIM_F_PARTITION,
    SIM_F_JOIN,
    /* scale: the scheduler balances (moves ranges onto servers that hold fewer), servers are
     * drained (their ranges moved off, then they exit) and started again later, with crashes,
     * restarts and drops; never drawn from a seed, so the other seeds keep their runs. */
    SIM_F_SCALE,
    SIM_F_COUNT_
};
/* SRV_HELLO: (re)started or fenced, asking the scheduler to let it in; serves nothing. */
enum { SRV_UP = 0, SRV_PAUSED, SRV_CRASHED, SRV_HELLO };
enum {
    EV_DELIVER = 1,
    EV_TICK,
    EV_WTICK,
    EV_RESUME,
    EV_RESTART,
    EV_HEAL_CUT,
    EV_REPAIR,
    EV_SNAPSHOT,
    EV_ACKS,
    EV_SCHED_RESTART /* the operator restarts the scheduler (with --allow-rollback) */
};
/* PHASE_END: the workers wait in a barrier, then say goodbye; the job ends (sim_sched.c). */
enum { PHASE_FAULTS = 0, PHASE_HEAL, PHASE_DRAIN, PHASE_END };
enum { REQ_DENSE = 0, REQ_SPARSE, REQ_DECLARE, REQ_PULL };

typedef struct sim_params {
    uint64_t seed;
    uint32_t servers, workers, replicas, ranges;
    int mode;           /* SIM_SYNC / SIM_ASYNC / SIM_SSP */
    uint32_t ssp_bound; /* SIM_SSP: the staleness bound */
    uint32_t backup;    /* SIM_SYNC: backup workers (--backup-workers), never drawn */
    int push_pull;   /* --push-pull: SSP steps and some async pushes are PUSH_PULL, never drawn */
    int faults;      /* SIM_F_* */
    uint64_t events; /* length of the fault phase, in events */
    uint32_t window; /* requests a worker keeps in flight */
    uint32_t tick_ms, resend_ms, max_unacked;
    uint32_t timeout_ms;             /* a worker's request timeout */
    uint32_t unavailable_timeout_ms; /* a worker gives up a range without a replica this long */
    uint32_t drop_per_mille, dup_per_mille, long_per_mille;
    uint32_t bad_per_mille; /* pushes the head refuses (unknown key) */
    int verbose;
    int spare;                    /* the last server holds no range at the start */
    uint32_t restart_per_mille;   /* crashes followed by a restart */
    uint32_t wipe_per_mille;      /* restarts on an empty store (a replaced disk) */
    uint32_t partition_per_mille; /* faults that are partitions */
    /* Faults that bump the epoch with the same chains: the scheduler restarts (resumes from what
     * it persisted), this often; else nothing happens. */
    uint32_t sched_restart_per_mille;
    /* --views-unordered: a later view may overtake an earlier one at a node (a view lost and
     * fetched again, a slow connection); never drawn. The default keeps one connection's order. */
    int views_unordered;
    /* Crash points between a FWD sent ahead of its WRITE (forward before apply) and that WRITE:
     * the server stops there this often, where a crash fault could strike it (--fwd-crashes). */
    uint32_t fwd_crash_per_mille;
    /* --allow-rollback: the scheduler's flag (a range whose last replica came back empty goes
     * to the server that left it last, losing what was acknowledged since): the invariants must
     * catch it (sim.rollback_catches). The flag holds only for ranges stranded as a scheduler
     * resumes, so the operator answers a stranded range with a fallback by restarting the
     * scheduler (sim_rollback_restart), as the ERROR says. */
    int allow_rollback;
    /* --wipe-sole: a restart may be on an empty store even for a range's only replica (its
     * disk died with the updates it acknowledged alone); never drawn, so that other tests' seeds
     * keep their runs. The coordinator keeps the range unavailable until the old disk is back
     * (sim_old_disk_back), or with allow_rollback gives it to the server that left it last. */
    int wipe_sole;
    /* --single-probe: the coordinator declares a server dead after one unanswered probe
     * (recovery/suspect.h), so false deaths of slow servers are common; never drawn. */
    int single_probe;
    /* --fence-faults: the fence's hard cases made common (never drawn, so that other tests' seeds
     * keep their runs): a server's new life (restarted, or rejoining after a fence) gets a late
     * copy of the WELCOME its previous life was let in by, half of the time. */
    int fence_faults;
    /* --drains: the operator stops servers with SIGTERM, and each asks the scheduler to drain it
     * first (the server's side of a drain, sim_drain.c); never drawn. */
    int drains;
    /* --snap-gaps: nanomsg's reconnect under a snapshot stream (never drawn, so that other tests'
     * seeds keep their runs): a stream loses one chunk before its last and the later chunks still
     * arrive, over the connection nanomsg opened again. The joiner must see the gap in the chunks'
     * numbers and give the join up; invariant 3 fails an install that lacks the lost chunk. */
    int snap_gaps;
} sim_params;

typedef struct sim_summary {
    uint64_t events, acked, views, faults, drops, virt_ms;
    uint64_t fenced, zombie_writes; /* chain messages fenced by epoch; writes at removed heads */
    uint64_t restarts, wipes, disks_back, partitions, joins, rejoins, gated, ssp_parked;
    uint64_t moves, drains;
    uint64_t unavailable;  /* requests workers gave up with CPS_EUNAVAILABLE */
    uint64_t false_deaths; /* servers the detector declared dead though up and reachable */
    uint64_t late;         /* backup workers: sync pushes answered as late (dropped) */
    /* Servers stopped between a FWD and its WRITE: at a head, at a middle. */
    uint64_t fwd_crashes[2];
    uint64_t stale_welcomes; /* late WELCOMEs sent to a later life (--fence-faults) */
    uint64_t sigterms;       /* servers stopped with SIGTERM (--drains) */
    uint64_t snap_gaps;      /* snapshot chunks lost with later ones arriving (--snap-gaps) */
} sim_summary;

typedef struct sim_rng {
    uint64_t s[4];
} sim_rng;

typedef struct sim_msg {
    uint32_t from, to;
    uint32_t inc; /* the sending server's incarnation (lost with it if it crashes) */
    int wire;     /* on the wire: arrives though its sender crashed (sim.c's lost_with_sender) */
    /* 1: a snapshot's chunk on its own connection (in order, never dropped or doubled alone);
     * 2: one its paused receiver's inbox holds (sim.c's deliver). */
    int stream;
    size_t len;
    _Alignas(8) uint8_t buf[]; /* whole wire message; 8-byte aligned payload after the header */
} sim_msg;

typedef struct sim_event {
    uint64_t t, n;
    int type;
    uint32_t node;
    sim_msg *m;
} sim_event;

/* Requests a replica applied, (dedup id, req_seq) -> sequence number of the update. */
typedef struct sim_applied_ent {
    uint32_t id, used;
    uint64_t req_seq, seq;
} sim_applied_ent;

typedef struct sim_agg {
    uint64_t sig, step;
} sim_agg;

/* What the store of one server holds for one range (the server writes the same to LMDB). */
typedef struct sim_rstore {
    uint64_t applied;
    uint64_t *log; /* log[s - 1]: hash of update s (body and requests) */
    uint64_t log_cap;
    /* SSP: part of the values, as the log: truth[(s - 1) * SIM_MAX_WORKERS + rank] = the clock
     * of worker `rank` once updates 1..s are applied (the highest step of its dense pushes). */
    uint64_t *truth;
    uint64_t truth_cap;               /* rows */
    uint64_t hw[2 * SIM_MAX_WORKERS]; /* last applied request seq: dense by rank, then sparse */
    sim_agg *aggs;
    uint32_t naggs, aggs_cap;
    sim_applied_ent *set;
    uint32_t set_n, set_cap;
    /* SSP: each worker's clock (by rank), as the replica stores it under CPS_DEDUP_CLOCK_BIT. */
    uint64_t clock[SIM_MAX_WORKERS];
} sim_rstore;

/* A pull parked by the replica's SSP gate. */
typedef struct sim_cookie {
    uint32_t worker, range;
    uint64_t req_seq;
    uint64_t clock; /* the clock it reads at */
} sim_cookie;

/* Backup workers: a request answered as late (never to be applied), and the requests a step's
 * aggregate included once committed (invariants 12 and 13). */
typedef struct sim_late {
    uint32_t range, worker;
    uint64_t req_seq;
} sim_late;

typedef struct sim_step_set {
    uint32_t range;
    uint64_t step, hash;
} sim_step_set;

/* A snapshot's values come in this many key groups per range: chunk i of a stream of n carries
 * groups [i * G / n, (i + 1) * G / n) as its read found them, as production's chunks carry the
 * records of one range slice by slice. */
#define SIM_SNAP_GROUPS 8
/* One read of one range of a tail's store (production's read transaction), referenced by the SNAP
 * chunks streamed from it (payload: its index in sim.snaps, the chunk's index and count). The
 * last chunk also carries the read's sequence number, exactly-once records and SSP clocks. */
typedef struct sim_snap {
    uint32_t range, source;
    uint32_t chunks;
    sim_rstore st;
} sim_snap;

/* A replica appended to a chain by a join: until it holds what the rest of the chain holds, it
 * may lack acknowledged updates (it serves no read meanwhile: CHAIN_MARK gating). */
typedef struct sim_lag {
    uint32_t node;
    uint64_t epoch;
} sim_lag;

struct sim;

typedef struct sim_server {
    struct sim *sm;
    uint32_t id;
    int state; /* SRV_* */
    uint64_t resume_at;
    cps__replica *rep;       /* the production replica (replication/replica.h), as src/server's */
    const cps__chain *chain; /* its chain state machine, for questions (cps__replica_chain) */
    uint64_t acks_at;        /* an EV_ACKS is queued for then (held CHAIN_ACKs), or 0 */
    uint64_t epoch;
    const cps__view *view; /* borrowed from sim.views */
    sim_rstore *rs;        /* per range */
    sim_cookie *parked;    /* the pulls the replica's SSP gate holds, for invariant 11 */
    uint32_t nparked, parked_cap;
    uint32_t inc;  /* crash incarnation: messages of an earlier one are lost */
    uint32_t boot; /* grows on every restart and fenced rejoin; sent in HELLO */
    uint64_t hello_at, beat_at;
    uint64_t seen_view; /* the newest VIEW heard while not let in */
    int ticking;        /* an EV_TICK of this server is queued */
    int wiped;          /* restarted on an empty store, not yet let in: no longer a replica */
    int restart_due;    /* crashed as a range's last replica: a restart is on its way */
    /* The disk a wipe replaced, kept on the shelf (per range; NULL: none), and whether the
     * operator is putting it back (a range stranded on our empty store: the next restart is on
     * it, see sim_old_disk_back). */
    sim_rstore *old_rs;
    int disk_back;
    uint8_t *copying; /* per range: holds a snapshot, not yet a member */
    /* Per range and key group (SIM_SNAP_GROUPS), the read (1 + index in sim.snaps) whose chunk
     * last wrote the group's values into this store during a join, 0: none since JOIN_CLEAR. */
    uint32_t *groups;
    /* Snapshot chunks its inbox holds while paused (later ones queue behind them), and when the
     * last held one is due. */
    uint32_t held_chunks;
    uint64_t held_until;
    /* The WELCOME (its epoch, and the life it answered) the server was last let in by: a late
     * copy of it may reach its next life (--fence-faults). Epoch 0: none yet. */
    uint64_t welcome_epoch;
    uint32_t welcome_life;
    /* --drains: stop signals received, the drain conversation's state (CPS_DRAIN_*), when the
     * DRAIN was sent, the fault count and the epoch then, and the ranges held when signalled
     * (invariant 17). */
    int stop_signals, drain;
    uint64_t drain_asked, drain_accepted, drain_faults, drain_epoch;
    uint8_t *drain_held;
    /* Snapshots sent whose sockets production keeps open until the replica lets them close
     * (cps__replica_snapshot_may_close, asked at every turn of the server's loop); until then the
     * replica ignores the joiner's repeated requests of that join. */
    struct sim_linger {
        uint32_t range, joiner;
        uint64_t join_id, ended_ms;
    } * lingers;
    uint32_t nlingers, lingers_cap;
} sim_server;

/* One request of the application (an operation with one part): the worker's session
 * (recovery/session.c) decides where and when it goes; this is what it carries and what its
 * answer is checked against. */
typedef struct sim_req {
    cps__sess_op so; /* first: the session's part of it (sim_worker.c's req_of) */
    uint8_t type, noagg;
    uint8_t bad;      /* names an undeclared key: the head refuses it */
    uint8_t detached; /* given up, still sent (cps__sess_detach): no longer the application's */
    uint32_t range;
    uint64_t seq, step, grad;
    uint64_t floor;              /* pull: the highest seq of the range seen before it was sent */
    uint64_t clock;              /* SSP pull: the clock it reads at (header aux) */
    int ssp_step;                /* SSP pull: the one that ends the worker's step of the range */
    struct sim_req *prev, *next; /* the worker's requests not yet over */
} sim_req;

typedef struct sim_worker {
    uint32_t id;
    cps__sess *sess;         /* the worker's protocol (recovery/session.c) */
    cps__sess_clock *clocks; /* sync, SSP: per range, its step (the session's; a "tensor") */
    int *sync_busy;          /* sync: a dense push of the range is in flight; SSP: or its pull */
    uint64_t *read_seq;      /* highest sequence number read or acknowledged, per range */
    sim_req *live;           /* every request the session holds (its ops), to free at the end */
    uint64_t issued, acked;
    uint64_t unavailable; /* requests given up with CPS_EUNAVAILABLE */
    uint64_t late;        /* backup workers: pushes answered as late */
} sim_worker;

typedef struct sim_acked {
    uint32_t range, id; /* id: dedup id (worker, with CPS_DEDUP_SPARSE_BIT) or declare id */
    uint64_t req_seq;
} sim_acked;

typedef struct sim {
    sim_params p;
    sim_rng rng;
    uint64_t now, nevents;
    int failed, phase, lossy;
    uint32_t nranges;
    sim_event *ev;
    size_t nev, ev_cap;
    uint64_t ev_counter;
    cps__view *views; /* views[e] for e = 1..epoch */
    uint64_t epoch;   /* the scheduler's current epoch */
    /* The last server a fault struck, until it is declared dead or comes back: one fault at a
     * time. */
    uint32_t pending_victim;
    /* The scheduler: the production coordinator (sim_sched.c), what it persisted, and its config.
     * Its failure detector hears every message a node sends the scheduler; faults are not
     * reported to it: it finds them, or takes a slow or lossy server for a dead one, as
     * production's does. */
    cps__coord *coord;
    cps__config sched_cfg;
    uint8_t *sched_blob[SIM_SCHED_BLOBS];
    size_t sched_blob_len[SIM_SCHED_BLOBS];
    uint64_t sched_restarts, worker_beat_at;
    int rollback_due; /* a scheduler restart with --allow-rollback is on its way */
    /* PHASE_END, per worker rank: 1 waits in the barrier, 2 released and said BYE, 3 its BYE
     * acknowledged. */
    uint8_t end_state[SIM_MAX_WORKERS];
    uint8_t told_exit[SIM_MAX_SERVERS + 1]; /* the job ended: its SHUTDOWN reached the server */
    uint64_t ended_at;                      /* when the job's end was complete */
    /* The scheduler's views reach each node in the order sent (one TCP connection): a message
     * net_send schedules is delivered no earlier than net_floor; net_last_due is when the last
     * one will be; view_due[node] when the last view sent to it will. */
    uint64_t net_floor, net_last_due;
    uint64_t view_due[SIM_MAX_NODES];
    uint64_t false_deaths;
    uint8_t cut[SIM_MAX_NODES][SIM_MAX_NODES]; /* partition: messages from -> to dropped */
    int cut_active;
    sim_lag *lag;        /* per range */
    uint64_t *acked_seq; /* per range: the highest sequence number acknowledged to a worker */
    sim_snap **snaps;
    uint32_t nsnaps, snaps_cap;
    /* The snapshot streams' own draws (chunk counts and spacing, their connection's delays and
     * breaks), so that they leave the run's other draws where they were. */
    sim_rng snap_rng;
    sim_rng gap_rng; /* --snap-gaps: which chunk a stream loses, from a stream of its own */
    uint64_t snap_gaps;
    uint64_t moves, drains;
    uint64_t restarts, wipes, disks_back, partitions, joins, rejoins, gated, ssp_parked;
    uint64_t stale_welcomes;
    uint64_t sigterms;
    uint32_t *heads; /* [range][epoch]: the server that accepted writes */
    uint64_t *sync_target;
    sim_server *servers;
    sim_worker *workers;
    sim_acked *acked;
    uint64_t nacked, acked_cap;
    uint64_t sent, drops, nfaults, fenced, zombie_writes;
    uint64_t fwd_crashes[2]; /* sim_summary's */
    int on_wire;             /* net_send marks what it sends now as on the wire (sim_msg.wire) */
    sim_late *lates;
    uint64_t nlates, lates_cap;
    sim_step_set *step_sets;
    uint64_t nstep_sets, step_sets_cap;
    char trace[SIM_TRACE_LINES][SIM_TRACE_LEN];
    uint64_t trace_pos;
} sim;

/* sim.c */
void sim_rng_seed(sim_rng *r, uint64_t seed);
uint64_t sim_rng_next(sim_rng *r);
void sim_trace(sim *sm, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sim_fail(sim *sm, const char *inv, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
const cps__view *sim_cur_view(const sim *sm);
int sim_is_member(const sim *sm, uint32_t r, uint32_t id);
/* One whole run; returns 1 on a violation (already printed), else 0. */
int sim_run(const sim_params *p, sim_summary *out);

/* sim.c's network, events, seeded choices and memory, for sim_replica.c and sim_worker.c */
uint64_t sim_rnd(sim *sm, uint64_t n);
int sim_chance(sim *sm, uint32_t per_mille);
void sim_push_restart(sim *sm, uint32_t id, uint64_t after);
void sim_send_reliable(sim *sm, uint32_t from, uint32_t to, const cps__msg_hdr *h);
int sim_node_alive(const cps__view *v, uint32_t id);
int sim_in_chain(const cps__range *rg, uint32_t id);
void sim_restart_last_replica(sim *sm, uint32_t id);
/* A crash fault may strike server s now (forward before apply: it sent a FWD ahead of the
 * WRITE it is about to perform). 1 if s crashed: it performs nothing more. */
int sim_fwd_crash_point(sim *sm, sim_server *s, int middle);

/* sim_sched.c: the scheduler, the production coordinator behind the simulated network */
void sim_sched_setup(sim *sm);
void sim_sched_teardown(sim *sm);
void sim_sched_deliver(sim *sm, const sim_msg *m);
int sim_sched_to_server(sim *sm, sim_server *s, const sim_msg *m);
void sim_sched_tick(sim *sm);
void sim_sched_restart(sim *sm);
void sim_sched_drain(sim *sm);
int sim_sched_removable(const sim *sm, uint32_t id);
uint32_t sim_sched_joiner(const sim *sm, uint32_t r, uint32_t *source);
int sim_sched_to_worker(sim *sm, sim_worker *w, const sim_msg *m);
void sim_sched_end(sim *sm);
int sim_sched_ended(sim *sm);
void sim_ev_push(sim *sm, uint64_t t, int type, uint32_t node, sim_msg *m);
/* The earliest event (by time, then insertion); the queue must not be empty. */
sim_event sim_ev_pop(sim *sm);
void sim_net_send(sim *sm, uint32_t from, uint32_t to, const void *buf, size_t len, uint64_t extra);
void sim_send_hdr(sim *sm, uint32_t from, uint32_t to, const cps__msg_hdr *h, const void *pl,
                  size_t plen, uint64_t extra);
void *sim_xmalloc(size_t n);
void *sim_xcalloc(size_t n, size_t size);
const char *sim_msg_name(uint8_t type);

/* sim_replica.c: the servers, each the production replica behind a shell */
void sim_server_start(sim *sm, sim_server *s, const cps__view *v);
void sim_server_free(sim *sm, sim_server *s);
/* A restarted process, or a fenced server's rejoin: a fresh replica, no joins, no
 * view; the store stays as it is. It asks the scheduler to let it in (HELLO). */
void sim_server_reset(sim *sm, sim_server *s);
void sim_server_deliver(sim *sm, sim_server *s, const sim_msg *m);
void sim_server_tick(sim *sm, sim_server *s);
void sim_server_acks_due(sim *sm, sim_server *s);
/* The snapshot thread's next step: read the store (the first), send one chunk. */
void sim_snapshot_run(sim *sm, sim_msg *m);

/* sim_drain.c: the server's side of a drain (--drains) */
void sim_drain_sigterm(sim *sm);
void sim_drain_turn(sim *sm, sim_server *s);
int sim_drain_answer(sim *sm, sim_server *s, uint8_t type);
void sim_drain_shutdown(sim *sm, sim_server *s);
void sim_drain_check_end(sim *sm);
/* The coordinator's record of node `id`, or NULL (sim_sched.c). */
const cps__coord_node *sim_coord_node(const sim *sm, uint32_t id);

/* sim_worker.c: the workers, each the production session (recovery/session.c) */
void sim_worker_init(sim *sm, sim_worker *w, uint32_t id, const cps__view *v);
void sim_worker_fini(sim_worker *w);
void sim_worker_tick(sim *sm, sim_worker *w);
void sim_worker_deliver(sim *sm, sim_worker *w, const sim_msg *m);
uint32_t sim_worker_pending(const sim_worker *w);
uint64_t sim_worker_step(const sim_worker *w, uint32_t r);

/* check.c: the in-memory store and the invariants */
int sim_op_range_seq(void *ctx, uint32_t range, uint64_t *seq);
int sim_op_dedup(void *ctx, uint32_t range, uint32_t worker, uint64_t *seq);
int sim_op_agg_step(void *ctx, uint32_t range, uint64_t sig, uint64_t *step);
void sim_store_write(sim *sm, sim_server *s, const cps__replica_out *a);
/* The sequence number of the update that applied request q in server s's range r (0: none). */
uint64_t sim_store_seq_of(const sim_server *s, uint32_t r, const cps__chain_req *q);
void sim_store_free(sim *sm, sim_server *s);
void sim_rstore_clear(sim_rstore *st);
/* The coordinator keeps server `id` out: its empty store is the only replica of a range. The
 * operator reads the ERROR and restarts it on its old disk (the one a wipe replaced). */
void sim_old_disk_back(sim *sm, uint32_t id);
void sim_rollback_restart(sim *sm);
void sim_rstore_copy(sim_rstore *dst, const sim_rstore *src);
void sim_check_snapshot(sim *sm, sim_server *s, uint32_t r);
void sim_check_copy_source(sim *sm, const sim_server *s, uint32_t r, uint32_t joiner);
void sim_check_fresh_read(sim *sm, sim_server *s, uint32_t r, uint64_t seq);
void sim_check_read(sim *sm, sim_server *s, uint32_t r, uint64_t seq, uint64_t hash);
void sim_check_acked(sim *sm, sim_worker *w, const sim_req *q);
void sim_check_reply(sim *sm, sim_server *s, uint32_t r, const cps__chain_req *q);
void sim_check_ssp_read(sim *sm, sim_server *s, uint32_t r, uint32_t worker, uint64_t clock);
void sim_check_ssp_parked(sim *sm, sim_server *s);
void sim_check_late(sim *sm, sim_server *s, uint32_t r, uint32_t worker, uint64_t req_seq);
void sim_check_event(sim *sm);
void sim_check_final(sim *sm);

#endif
