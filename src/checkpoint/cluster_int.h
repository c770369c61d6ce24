/* Private to src/checkpoint: what the files of export and restore (cluster.h) share.
 *
 *   cluster_link.c     the link to the scheduler and the servers; a tensor's layout and pieces
 *   cluster_read.c     the reads of a cut: tables in windows, dense tensors in streams
 *   cluster_cut.c      opening a cut on every range (probes, aims, routes) and closing it
 *   cluster_export.c   the workers' local tensors and cps__ckpt_export
 *   cluster_restore.c  cps__ckpt_restore, a shell around recovery/restore.h
 * The server side is src/server/cut.c. */
#ifndef CPS_CHECKPOINT_CLUSTER_INT_H
#define CPS_CHECKPOINT_CLUSTER_INT_H

#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chainps/error.h"
#include "checkpoint/ckpt.h"
#include "checkpoint/cluster.h"
#include "core/bigbuf.h"
#include "core/entries.h"
#include "core/log.h"
#include "core/view.h"
#include "node/msg.h"
#include "node/roles.h"
#include "optim/optim.h"
#include "recovery/cutroute.h"
#include "recovery/restore.h"
#include "transport/transport.h"
#include "worker/client.h"
#include "worker/localset.h"

#define SUB           "ckpt"
#define SCHED         0u
#define CUT_PEER_BASE 0x20000000u /* tool-side peer ids of the cut threads: + range */
#define CLOSE_PEER    0x30000000u /* ... of the views closed without being read: + a count */
#define READ_WINDOW   64          /* CUT_READs in flight (tables, step counts) */
/* Dense tensors: one CUT_READ carries up to READ_BYTES of consecutive keys of a range (16
 * chunks of 512 KB), and READ_AHEAD of them are in flight per range across the writer's fills:
 * one 512 KB read per message, drained at the end of every 16 MB fill, left the servers idle
 * between fills and cost a message's overheads per chunk. */
#define READ_BYTES (8u << 20)
/* Below this an export touches too little memory for huge pages to save anything. */
#define PREWARM_MIN_BYTES (4u << 20)
#define READ_AHEAD        4 /* per range, at most; the ranges share READ_TOTAL */
#define READ_TOTAL        8 /* ... reads in flight in all (64 MB), but 2 per range at least */
/* A PUT is one chain update, applied in one transaction on every replica: 8 MB keeps each short
 * (64 MB ones stalled the servers' loops past the failure timeout on a loaded machine, and a
 * restore onto chains of 2 did not finish); 128 MB stay in flight per range. */
#define PUT_BYTES        (8u << 20) /* records per PUT message */
#define OPEN_TRIES       8
#define AIM_GAP_MS       50    /* between the two probes that measure a sync job's step rate */
#define AIM_MIN_MS       20    /* the least time ahead a cut aims (doubled after each miss) */
#define REFRESH_MS       2000  /* waiting for a cut: ask for the view again this often */
#define SILENT_REFRESHES 3     /* ... and give up once the scheduler left that many unanswered */
#define READ_WAIT_MS     30000 /* one read's answer (a tail that died fails the export) */
/* Unanswered this long, the exporter looks at the view again: a reader whose process died is
 * seen sooner (its connection refuses), but one cut off by the network only through the view. */
#define LOOK_MS        500
#define GONE_MS        100 /* a server looks gone but its view still lists it: look again this often */
#define CUT_TRIES      4   /* cuts lost with every replica that held them, cut again this often */
#define CLOSE_GRACE_MS 200 /* closing: a CUT_CLOSE's peer not connected by then is dropped */

typedef struct link {
    int said_not_started; /* "has not started" logged once, however long we wait for it */
    cps__tp *tp;
    char hello[16 + CPS_ADDR_MAX];
    size_t hello_len;
    cps__view view;
    int started;
    cps__tensor_desc *descs;
    uint32_t ndescs;
    int timeout_ms;
    uint64_t next_req;
    /* received, not yet consumed */
    cps__rx *in;
    size_t nin, capin;
    uint64_t read_wait_us; /* export: time spent waiting for read answers */
    uint32_t closes;       /* names the peers CUT_CLOSEs of unused views go to (CLOSE_PEER + k) */
    int has_local;         /* a worker registered local tensors (worker/localset.h) */
} link;

/* Which received message cps__cl_take wants. */
typedef int (*match_fn)(const cps__rx *rx, const void *arg);

/* The pieces of a tensor (one per key), in element order. */
typedef struct piece {
    uint64_t off; /* first element within the tensor */
    uint64_t key;
    uint32_t len;
    uint32_t range;
} piece;

typedef struct cut {
    uint64_t id;
    uint64_t step; /* asked for (0: now) */
    uint32_t nranges;
    int *open;         /* per range: a read view serves it (its reader) */
    uint64_t *seq;     /* per range: its sequence number at the cut */
    uint64_t *at_step; /* per range: the step it reports */
    uint32_t *gen;     /* per range: how many readers it had (reads sent to an older one: again) */
    uint32_t *node;    /* per range: its reader */
    cps__cutroute *route; /* which replica's view each range is read from (recovery/cutroute.h) */
    int lost;             /* a range's cut could not be had: why (cutroute's CPS_CR_LOST) */
    uint32_t lost_range;
    uint64_t lost_step;
} cut;

typedef struct export_ctx {
    link *l;
    cut *c;
    const cps__tensor_desc *d;
    piece *pieces;
    size_t npieces;
    uint32_t slot; /* 0 values, k: optimizer slot k-1 */
    int steps;     /* fill optimizer step counts (U64) instead of values */
    int rc;
    struct dense_stream *ds; /* dense values or state: the reads in flight (NULL before) */
} export_ctx;

/* Where a sync job is and how fast it goes: two probes AIM_GAP_MS apart. The cut goes far enough
 * ahead that the opens reach every tail before the job gets there: an unpaced job of a small
 * model runs thousands of steps a second, and a cut a few steps ahead of it was always late. */
typedef struct aim {
    uint64_t hi;    /* the furthest step a range reported at the last probe */
    double rate;    /* steps per second between the probes */
    double rtt_ms;  /* the last probe's round trip */
    double lead_ms; /* how far ahead the cut aims, in time */
} aim;

/* cluster_link.c */
void cps__cl_on_msg(void *ctx, void *buf, size_t len);
/* Take the first received message `match` accepts, waiting until the deadline. */
int cps__cl_take(link *l, match_fn match, const void *arg, uint64_t deadline, cps__rx *out);
void cps__cl_link_close(link *l);
int cps__cl_link_open(link *l, const char *scheduler, const char *bind, const char *advertise,
                      const unsigned char *key, int timeout_ms);
/* The current view only (the tails may have moved since we asked). */
int cps__cl_link_refresh_view(link *l);
/* The view and the tensor registry, asked again every second until the deadline. */
int cps__cl_link_registry(link *l, const char *scheduler);
int cps__cl_tensor_layout(const link *l, const cps__tensor_desc *d, cps_tensor *t);
/* The pieces of a tensor (one per key), in element order. */
piece *cps__cl_tensor_pieces(const cps_tensor *t, size_t *n);

/* cluster_read.c */
/* need[r] = 1 for every range holding a key of some registered tensor. Errors: CPS_ENOMEM,
 * layout errors. */
int cps__cl_needed_ranges(const link *l, unsigned char *need);
void cps__cl_dense_free(export_ctx *x);
/* Fill elements first..first+n-1 (values or optimizer state), or, with x->steps, the step
 * counts (a cps__ckpt_writer's fill). */
int cps__cl_export_fill(void *arg, uint64_t first, void *buf, size_t n);

/* cluster_cut.c */
int cps__cl_is_probe_reply(const cps__rx *rx);
/* 1 if a server of the chains of the view looks gone (its connection refuses). */
int cps__cl_chain_gone(link *l);
/* The view again, and what it changes for the cut. CPS_ETIMEDOUT: the scheduler did not answer. */
int cps__cl_route_look(link *l, cut *c);
/* Perform what recovery/cutroute decided (n actions, or an error if n < 0). */
int cps__cl_route_do(link *l, cut *c, const cps__cr_action *a, int n);
/* Answers to the cut's opens that came after it was open (the other replicas'). */
int cps__cl_absorb_opens(link *l, cut *c);
/* Close every read view of the cut (the readers' and the others'). */
void cps__cl_close_cut(link *l, cut *c);
int cps__cl_aim_measure(link *l, aim *a);
/* The step to cut at: the furthest range's step plus the steps the job makes in lead_ms, and
 * `least` steps ahead at least. */
uint64_t cps__cl_aim_step(const aim *a, uint64_t least);
/* Open a read view on every range `need` marks at step `step` (0: now); *past receives the
 * highest step reported by a range already past it (CPS_EPAST). */
int cps__cl_open_cut(link *l, cut *c, uint64_t step, const unsigned char *need, int sync,
                     uint64_t *past);

#endif
