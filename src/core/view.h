/* The cluster view: who is in the job, and which chain of servers holds each key range.
 * The scheduler owns it; every other node holds a copy tagged with its epoch. A view with a
 * higher epoch always replaces a lower one; messages tagged with an older epoch are fenced. */
#ifndef CPS_CORE_VIEW_H
#define CPS_CORE_VIEW_H

#include <stddef.h>
#include <stdint.h>

#include "chainps/chainps.h" /* cps_mode */

#define CPS_MAX_NODES    1024
#define CPS_MAX_REPLICAS 8
/* Key ranges a job may have (--ranges): finer than servers, so servers added later get a share. */
#define CPS_MAX_RANGES 4096
#define CPS_ADDR_MAX   128

enum cps__role {
    CPS_ROLE_NONE = 0,
    CPS_ROLE_SCHEDULER = 1,
    CPS_ROLE_SERVER = 2,
    CPS_ROLE_WORKER = 3
};

typedef struct cps__node_info {
    uint32_t id;             /* >= 1; 0 is the scheduler */
    uint8_t role;            /* cps__role */
    uint8_t alive;           /* 1 while the scheduler believes it is */
    uint32_t rank;           /* dense per role: worker ranks 0..W-1, server ranks 0..S-1 */
    char addr[CPS_ADDR_MAX]; /* "tcp://host:port" of its inbox */
} cps__node_info;

typedef struct cps__range {
    uint64_t lo, hi; /* keys lo..hi inclusive */
    uint32_t chain_len;
    uint32_t chain[CPS_MAX_REPLICAS]; /* node ids, head first, tail last */
} cps__range;

typedef struct cps__view {
    uint64_t epoch;
    uint32_t mode;           /* cps_mode */
    uint32_t ssp_bound;      /* staleness bound for CPS_MODE_SSP */
    uint32_t backup_workers; /* CPS_MODE_SYNC: a step closes with the first live - b pushes */
    uint32_t num_workers;    /* expected / live workers */
    uint32_t num_servers;
    uint32_t replicas;
    uint32_t nnodes;
    cps__node_info *nodes; /* owned by the view */
    uint32_t nranges;
    cps__range *ranges; /* owned by the view; sorted by lo, covering 0..UINT64_MAX */
} cps__view;

void cps__view_init(cps__view *v);
void cps__view_fini(cps__view *v);
/* Deep copy; returns CPS_ENOMEM. dst must be initialised (its old content is freed). */
int cps__view_copy(cps__view *dst, const cps__view *src);

/* Range index holding `key` (binary search over ranges). The view must have nranges >= 1. */
uint32_t cps__view_range_of(const cps__view *v, uint64_t key);
/* Node with this id, or NULL. */
const cps__node_info *cps__view_node(const cps__view *v, uint32_t id);
/* 1 if worker `w` is superseded by node `o`: `w` is dead (or finished) and `o` is another worker
 * of its rank that is alive, or that joined after it (a larger id: ids only grow). Nobody needs a
 * socket to a superseded worker: the scheduler and the servers drop their peer for it (its
 * record stays in the view: the pushes it made still count, and sync rounds, SSP clocks and
 * fences name it). A worker whose rank is free again (its replacement died too) keeps its peer
 * only if it is the latest holder of the rank; one taken back alive is superseded by nobody, and
 * its peer is made again with the next view. */
int cps__node_supersedes(const cps__node_info *o, const cps__node_info *w);
/* 1 if some node of `v` supersedes `w` (cps__node_supersedes). */
int cps__view_superseded(const cps__view *v, const cps__node_info *w);

/* Split the whole u64 key space into `n` equal contiguous ranges and place each on a ring chain:
 * range r lives on servers (r, r+1, ..., r+R-1) mod S, with `servers` listing the server ids in
 * rank order. So each server is head of some ranges, middle of others and tail of others.
 * Returns CPS_EINVAL (n == 0, R == 0, R > S, R > CPS_MAX_REPLICAS) or CPS_ENOMEM. */
int cps__view_place_ranges(cps__view *v, uint32_t n, const uint32_t *servers, uint32_t nservers,
                           uint32_t replicas);

/* Serialized size and encoding (little-endian, see view.c). */
size_t cps__view_encoded_size(const cps__view *v);
size_t cps__view_encode(const cps__view *v, void *buf, size_t cap);
/* Validates counts, roles, addresses (NUL-terminated, non-empty), ranges (sorted, contiguous,
 * covering the key space, chains naming known server nodes; or no ranges before placement).
 * out must be initialised; it is replaced on success and untouched on error.
 * Errors: CPS_EPROTO, CPS_ESIZE, CPS_ENOMEM. */
int cps__view_decode(const void *buf, size_t len, cps__view *out);
/* Same, for a view followed by more data (STATUS_REPLY: view, then per-node stats): the view may
 * end before `len`; *used receives its encoded size. Errors as cps__view_decode, CPS_EINVAL. */
int cps__view_decode_prefix(const void *buf, size_t len, cps__view *out, size_t *used);

/* Per-node counters, carried by heartbeats and shown by `chainps status`. */
typedef struct cps__node_stats {
    uint64_t msgs_in, msgs_bad;
    uint64_t push_raw_bytes, push_wire_bytes; /* push payloads before / after compression */
    uint64_t pull_bytes;
    uint64_t updates_applied;
    uint64_t keys_stored;
    uint64_t values_stored;
    /* Training step: a server's highest applied (sync: the aggregated step; async and SSP: the
     * pushing worker's), a worker's last pushed (its clock). */
    uint64_t step;
} cps__node_stats;
#define CPS_STATS_SIZE 72
void cps__stats_encode(void *buf, const cps__node_stats *s);
void cps__stats_decode(const void *buf, cps__node_stats *s);

/* HELLO payload: u32 role, u32 requested rank (UINT32_MAX: any), u32 previous id (0: new),
 * u32 addr length, addr bytes (no NUL), then optionally u32 flags (CPS_HELLO_*; present only
 * when not 0, so a HELLO that says nothing new is the shorter form every earlier build reads).
 * Also the STATUS request payload, with CPS_ROLE_NONE. The decoder accepts roles NONE, SERVER
 * and WORKER (the caller checks which it expects), an address of 1..CPS_ADDR_MAX-1 printable
 * non-space ASCII bytes, a rank < CPS_MAX_NODES or UINT32_MAX, and a flags word that is not 0
 * (unknown bits are kept). `flags` (may be NULL) receives the flags word, 0 when none was sent
 * (as by earlier builds): the one place it is parsed. Errors: CPS_ESIZE (lengths), CPS_EPROTO
 * (fields). */
size_t cps__hello_encode(void *buf, size_t cap, uint32_t role, uint32_t want_rank, uint32_t prev_id,
                         const char *addr);
int cps__hello_decode(const void *buf, size_t len, uint32_t *role, uint32_t *want_rank,
                      uint32_t *prev_id, char addr[CPS_ADDR_MAX], uint32_t *flags);

/* HELLO flags. A server whose store lost its data (a new or replaced disk, --reset-data) says so:
 * the scheduler must not count it as holding the ranges an earlier life of it held, and above
 * all not as the last replica of one (recovery/coordinator_membership.c). */
#define CPS_HELLO_EMPTY 1u
/* Append `flags` to the HELLO of `len` bytes encoded in buf (cap bytes). Returns the new
 * length: len itself when flags is 0, 0 when buf has no room. */
size_t cps__hello_add_flags(void *buf, size_t cap, size_t len, uint32_t flags);

#endif
