/* In-flight operations of a Python client (see ops.h). Every list change happens with the GIL
 * held; only cps_wait_result runs without it, on an operation marked busy so that no other
 * thread touches that handle meanwhile (a completed handle is freed by the C library). */
#include "ops.h"

#include <time.h>

/* Long enough to cost nothing, short enough that Ctrl-C feels immediate. */
#define SLICE_MS 100

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

cpy_op *cpy_op_new(cpy_ops *ops, cps_handle *h, cpy_buf *bufs, int nbufs)
{
    cpy_op *op = PyMem_Calloc(1, sizeof *op);
    if (!op) {
        PyErr_NoMemory();
        return NULL;
    }
    op->h = h;
    op->nbufs = nbufs;
    for (int i = 0; i < nbufs; i++) {
        op->bufs[i] = bufs[i];
        memset(&bufs[i], 0, sizeof bufs[i]);
    }
    op->next = ops->head;
    if (ops->head)
        ops->head->prev = op;
    ops->head = op;
    return op;
}

static void unlink_op(cpy_ops *ops, cpy_op *op)
{
    if (op->prev)
        op->prev->next = op->next;
    else if (ops->head == op)
        ops->head = op->next;
    if (op->next)
        op->next->prev = op->prev;
    op->prev = op->next = NULL;
}

/* `why`: the library's reason for a failed result (copied), NULL or "" if none. */
static void complete(cpy_ops *ops, cpy_op *op, int result, const char *why)
{
    op->h = NULL;
    op->done = 1;
    op->result = result;
    snprintf(op->why, sizeof op->why, "%s", result != 0 && why ? why : "");
    for (int i = 0; i < op->nbufs; i++)
        cpy_buf_release(&op->bufs[i]);
    unlink_op(ops, op);
    if (op->orphan)
        PyMem_Free(op);
}

/* One bounded wait with the GIL released. Returns 1 when op completed (op may be freed if
 * orphaned), 0 otherwise. */
static int wait_slice(cpy_ops *ops, cpy_op *op, int ms)
{
    int result = 0, rc;
    cps_handle *h = op->h;
    op->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = cps_wait_result(h, ms, &result);
    Py_END_ALLOW_THREADS
    op->busy = 0;
    if (rc == 0)
        return 0;
    /* Read on the thread that called cps_wait_result, right after it: its reason. */
    complete(ops, op, rc == 1 ? result : rc, cps_last_error_message());
    return 1;
}

int cpy_op_wait(cpy_ops *ops, cpy_op *op, double timeout_s)
{
    double deadline = timeout_s < 0 ? 0 : now_s() + timeout_s;
    while (!op->done) {
        int ms = SLICE_MS;
        if (timeout_s >= 0) {
            double left = deadline - now_s();
            if (left <= 0)
                ms = 0;
            else if (left * 1000 < ms)
                ms = (int)(left * 1000) + 1;
        }
        if (op->busy) {
            /* Another thread waits on this handle: let it finish, then look again. */
            Py_BEGIN_ALLOW_THREADS
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
            Py_END_ALLOW_THREADS
        } else if (wait_slice(ops, op, ms)) {
            return 1;
        }
        if (PyErr_CheckSignals() < 0)
            return -1;
        if (timeout_s >= 0 && now_s() >= deadline)
            return op->done;
    }
    return 1;
}

void cpy_op_orphan(cpy_ops *ops, cpy_op *op)
{
    (void)ops;
    if (op->done)
        PyMem_Free(op);
    else
        op->orphan = 1;
}

void cpy_ops_reap(cpy_ops *ops)
{
    cpy_op *op = ops->head;
    while (op) {
        cpy_op *next = op->next;
        if (op->orphan && !op->busy && !op->done)
            wait_slice(ops, op, 0);
        op = next;
    }
}

void cpy_ops_drain(cpy_ops *ops, double budget_s)
{
    double deadline = now_s() + budget_s;
    while (ops->head && now_s() < deadline) {
        cpy_op *op = ops->head;
        if (op->busy) {
            Py_BEGIN_ALLOW_THREADS
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
            Py_END_ALLOW_THREADS
            continue;
        }
        wait_slice(ops, op, SLICE_MS);
    }
}

void cpy_ops_close_all(cpy_ops *ops, int result)
{
    while (ops->head)
        complete(ops, ops->head, result, NULL);
}
