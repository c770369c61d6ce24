/* In-flight operations of a Python client: each started C operation (a cps_handle) with the
 * buffers it reads or writes, kept alive until the C side is done with them, whoever stops
 * waiting for it (a Handle dropped early, a call interrupted by Ctrl-C, a closing client). */
#ifndef CHAINPS_PY_OPS_H
#define CHAINPS_PY_OPS_H

#include "buffers.h"
#include "chainps/chainps.h"

/* Room for cps_last_error_message()'s text (two log lines of up to 511 bytes and "; "). */
#define CPY_WHY_MAX 1040

typedef struct cpy_op {
    cps_handle *h; /* NULL once completed */
    cpy_buf bufs[2];
    int nbufs;
    int done;
    int result; /* the operation's result once done */
    int busy;   /* a thread is inside cps_wait_result on h (with the GIL released) */
    int orphan; /* no Handle refers to it any more: freed when it completes */
    struct cpy_op *prev, *next;
    /* Why it failed (cps_last_error_message() as it completed), or "". */
    char why[CPY_WHY_MAX];
} cpy_op;

typedef struct cpy_ops {
    cpy_op *head;
} cpy_ops;

/* A new operation record (buffers moved in: the caller's cpy_buf are zeroed), linked into
 * `ops`. NULL with MemoryError set. */
cpy_op *cpy_op_new(cpy_ops *ops, cps_handle *h, cpy_buf *bufs, int nbufs);
/* Wait for op until it completes or `timeout_s` passes (< 0: no limit), in slices with the GIL
 * released, checking for signals between them. Returns 1 (done: op->result holds the result,
 * buffers released, unlinked from `ops`), 0 (still running), -1 (a signal handler raised,
 * e.g. KeyboardInterrupt; the operation keeps running). */
int cpy_op_wait(cpy_ops *ops, cpy_op *op, double timeout_s);
/* The Handle that owned op is gone: free op now if complete, else when it completes. */
void cpy_op_orphan(cpy_ops *ops, cpy_op *op);
/* Check orphaned operations without blocking; free those that completed. */
void cpy_ops_reap(cpy_ops *ops);
/* Before the client closes: wait up to `budget_s` for every operation to end by itself (a sync
 * push may wait for other workers for ever, so the wait is bounded). Signals are not checked. */
void cpy_ops_drain(cpy_ops *ops, double budget_s);
/* After cps_close() returned: the library writes into no buffer any more, so every operation
 * still listed ends now with `result` (CPS_ECLOSED); its buffers are released. Their cps_handle
 * memory is left behind on purpose: a handle of a closed client must not be touched. */
void cpy_ops_close_all(cpy_ops *ops, int result);

#endif
