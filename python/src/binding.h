/* Private to python/src (binding.h): the binding's Python object types and what its files share.
 *
 *   module.c         the module: its functions, its exceptions and types registered (PyInit)
 *   errors.c         chainps.Error / chainps.TimeoutError raised from a CPS_E... code
 *   client.c         Client: open and close, job facts, declare, barrier, stats, its method table
 *   push_pull.c      Client's whole-tensor push/pull (blocking and async), rows, compression
 *   allreduce.c      Client's allreduce and the buffer shared with replacement workers
 *   local_tensors.c  Client's local tensors written with checkpoints
 *   tensor.c, handle.c, freq.c   the Tensor, Handle and Freq types
 */
#ifndef CHAINPS_PY_BINDING_H
#define CHAINPS_PY_BINDING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "buffers.h"
#include "chainps/chainps.h"
#include "ops.h"

typedef struct {
    PyObject_HEAD cps_client *c;
    cpy_ops ops;
} ClientObject;

typedef struct {
    PyObject_HEAD ClientObject *client;
    cps_tensor *t;
    PyObject *name;
    PyObject *shape;
    Py_ssize_t numel;
    int is_table;
    Py_ssize_t cols;
} TensorObject;

typedef struct {
    PyObject_HEAD ClientObject *client;
    cpy_op *op;
    PyObject *tensor_name;
    const char *call;
} HandleObject;

typedef struct {
    PyObject_HEAD ClientObject *client;
    cps_freq *f;
    cpy_buf *bufs; /* the gradient then the state buffers, borrowed by f: their views stay held */
    Py_ssize_t nbufs;
} FreqObject;

extern PyTypeObject cpy_ClientType, cpy_TensorType, cpy_HandleType, cpy_FreqType;
/* chainps.Error and chainps.TimeoutError (a subclass), made by PyInit__chainps. */
extern PyObject *cpy_Error, *cpy_TimeoutErr;

static inline int client_open(ClientObject *self, const char *call)
{
    if (self->c)
        return 0;
    PyErr_Format(PyExc_ValueError, "%s: chainps client is closed", call);
    return -1;
}

/* ---- errors.c: each returns NULL with the exception set ---- */

/* chainps.Error (TimeoutError for CPS_ETIMEDOUT) for `rc` in `call` (on `tensor`, or NULL),
 * with the library's reason `why` (NULL or "": none). */
PyObject *cpy_raise_cps_why(int rc, const char *call, const char *tensor, const char *why);
/* cpy_raise_cps_why with cps_last_error_message(): call it right after the failed call. */
PyObject *cpy_raise_cps(int rc, const char *call, const char *tensor);

/* ---- client.c ---- */

/* init: None or (kind, a, b, seed): *out NULL or init. 0, or -1 with an exception. */
int cpy_parse_init(PyObject *o, cps_init *init, const cps_init **out);

/* ---- Client's methods, by file (their Python signatures are in client.c's table) ---- */

/* push_pull.c */
PyObject *cpy_client_push(ClientObject *self, PyObject *args);
PyObject *cpy_client_pull(ClientObject *self, PyObject *args);
PyObject *cpy_client_push_pull(ClientObject *self, PyObject *args);
PyObject *cpy_client_push_async(ClientObject *self, PyObject *args);
PyObject *cpy_client_pull_async(ClientObject *self, PyObject *args);
PyObject *cpy_client_push_pull_async(ClientObject *self, PyObject *args);
PyObject *cpy_client_rows_push(ClientObject *self, PyObject *args);
PyObject *cpy_client_rows_pull(ClientObject *self, PyObject *args);
PyObject *cpy_client_compress(ClientObject *self, PyObject *args);
/* allreduce.c */
PyObject *cpy_client_allreduce(ClientObject *self, PyObject *args, PyObject *kwargs);
PyObject *cpy_client_allreduce_share(ClientObject *self, PyObject *args);
PyObject *cpy_client_allreduce_fetch(ClientObject *self, PyObject *args);
/* local_tensors.c */
PyObject *cpy_client_local_add(ClientObject *self, PyObject *args);
PyObject *cpy_client_local_meta(ClientObject *self, PyObject *args);
PyObject *cpy_client_local_commit(ClientObject *self, PyObject *args);
/* freq.c */
PyObject *cpy_client_freq(ClientObject *self, PyObject *args, PyObject *kwds);

#endif
