/* chainps._chainps: the CPython binding of libchainps's worker API.
 *
 * Buffers are passed without a copy (buffers.c); every call that waits releases the GIL and
 * waits in slices so Ctrl-C gets through (ops.c); every CPS_E... becomes chainps.Error carrying
 * the code, its name and cps_strerror's text. The Python-level API (Init, optimizers, docs)
 * lives in chainps/__init__.py on top of these types. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <structmember.h>
#include <stdio.h>
#include <string.h>

#include "buffers.h"
#include "chainps/chainps.h"
#include "ops.h"

static PyObject *Error, *TimeoutErr;

/* close() lets operations in flight finish for this long before it leaves the job anyway (a
 * sync push interrupted by Ctrl-C may wait for workers that never push). */
#define CLOSE_DRAIN_S 5.0

/* Raise chainps.Error (chainps.TimeoutError for CPS_ETIMEDOUT) for code `rc`, with the context
 * (which call, which tensor) in front of cps_strerror's text and the library's reason after it
 * (`why`: cps_last_error_message() of the failed call, NULL or "" when it gave none), e.g.
 * "chainps.init: bad configuration (CPS_ECONFIG): no job secret: give --secret-file FILE (...)".
 * The exception has .code, .name and .reason (the `why` text, "" if none). Returns NULL. */
static PyObject *raise_cps_why(int rc, const char *call, const char *tensor, const char *why)
{
    PyObject *type = rc == CPS_ETIMEDOUT ? TimeoutErr : Error;
    if (!why)
        why = "";
    PyObject *head =
        tensor ? PyUnicode_FromFormat("%s(%s)", call, tensor) : PyUnicode_FromString(call);
    if (!head)
        return NULL;
    PyObject *msg = PyUnicode_FromFormat("%U: %s (%s)%s%s", head, cps_strerror(rc),
                                         cps_err_name(rc), why[0] ? ": " : "", why);
    Py_DECREF(head);
    if (!msg)
        return NULL;
    PyObject *exc = PyObject_CallOneArg(type, msg);
    Py_DECREF(msg);
    if (!exc)
        return NULL;
    PyObject *code = PyLong_FromLong(rc), *name = PyUnicode_FromString(cps_err_name(rc));
    /* The library's text is bytes it formatted from paths and names: never fail on its UTF-8. */
    PyObject *reason = PyUnicode_DecodeUTF8(why, (Py_ssize_t)strlen(why), "replace");
    if (code && name && reason) {
        PyObject_SetAttrString(exc, "code", code);
        PyObject_SetAttrString(exc, "name", name);
        PyObject_SetAttrString(exc, "reason", reason);
    }
    Py_XDECREF(code);
    Py_XDECREF(name);
    Py_XDECREF(reason);
    PyErr_SetObject(type, exc);
    Py_DECREF(exc);
    return NULL;
}

/* raise_cps_why with the reason of the chainps call this thread made last: call it right after
 * the failed call, before any other chainps call on this thread. */
static PyObject *raise_cps(int rc, const char *call, const char *tensor)
{
    return raise_cps_why(rc, call, tensor, cps_last_error_message());
}

/* ---- Client ------------------------------------------------------------------------------ */

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

static PyTypeObject ClientType, TensorType, HandleType, FreqType;

static int client_open(ClientObject *self, const char *call)
{
    if (self->c)
        return 0;
    PyErr_Format(PyExc_ValueError, "%s: chainps client is closed", call);
    return -1;
}

/* Flush Python's own buffers: a scheduler or server role ends the process with exit() inside
 * cps_open, which knows nothing of sys.stdout. */
static void flush_std(void)
{
    const char *names[] = {"stdout", "stderr"};
    for (int i = 0; i < 2; i++) {
        PyObject *f = PySys_GetObject(names[i]); /* borrowed */
        if (f && f != Py_None) {
            PyObject *r = PyObject_CallMethod(f, "flush", NULL);
            if (!r)
                PyErr_Clear();
            Py_XDECREF(r);
        }
    }
}

static int Client_init(ClientObject *self, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, ":Client", kw))
        return -1;
    if (self->c) {
        PyErr_SetString(PyExc_RuntimeError, "Client already joined");
        return -1;
    }
    flush_std();
    int rc;
    cps_client *c = NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = cps_open(&c);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        raise_cps(rc, "chainps.init", NULL);
        return -1;
    }
    self->c = c;
    return 0;
}

static int close_client(ClientObject *self)
{
    if (!self->c)
        return 0;
    cpy_ops_drain(&self->ops, CLOSE_DRAIN_S);
    cps_client *c = self->c;
    self->c = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = cps_close(c);
    Py_END_ALLOW_THREADS
    cpy_ops_close_all(&self->ops, CPS_ECLOSED);
    return rc;
}

static void Client_dealloc(ClientObject *self)
{
    if (self->c) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        close_client(self);
        PyErr_Restore(et, ev, tb);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Client_close(ClientObject *self, PyObject *unused)
{
    (void)unused;
    int rc = close_client(self);
    if (rc != 0)
        return raise_cps(rc, "close", NULL);
    Py_RETURN_NONE;
}

static PyObject *Client_enter(ClientObject *self, PyObject *unused)
{
    (void)unused;
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *Client_exit(ClientObject *self, PyObject *args)
{
    (void)args;
    PyObject *r = Client_close(self, NULL);
    if (!r)
        return NULL;
    Py_DECREF(r);
    Py_RETURN_FALSE; /* exceptions of the with-block propagate */
}

/* The job facts a client reads from the library, one getter for all (the closure picks). */
enum { F_RANK, F_NUM_WORKERS, F_NUM_SERVERS, F_START_STEP, F_MODE, F_STALENESS };
static const char *const fact_names[] = {"rank",       "num_workers", "num_servers",
                                         "start_step", "mode",        "staleness"};

static PyObject *Client_get_fact(ClientObject *self, void *closure)
{
    int f = (int)(intptr_t)closure;
    if (client_open(self, fact_names[f]))
        return NULL;
    switch (f) {
    case F_RANK:
        return PyLong_FromLong(cps_rank(self->c));
    case F_NUM_WORKERS:
        return PyLong_FromLong(cps_num_workers(self->c));
    case F_NUM_SERVERS:
        return PyLong_FromLong(cps_num_servers(self->c));
    case F_START_STEP:
        return PyLong_FromUnsignedLongLong(cps_start_step(self->c));
    default:
        break;
    }
    cps_mode m;
    uint32_t staleness;
    int rc = cps_mode_get(self->c, &m, &staleness);
    if (rc != 0)
        return raise_cps(rc, fact_names[f], NULL);
    if (f == F_STALENESS)
        return PyLong_FromUnsignedLong(staleness);
    return PyUnicode_FromString(m == CPS_MODE_SYNC    ? "sync"
                                : m == CPS_MODE_ASYNC ? "async"
                                                      : "ssp");
}

static PyObject *Client_get_closed(ClientObject *self, void *unused)
{
    (void)unused;
    return PyBool_FromLong(self->c == NULL);
}

/* init: None or (kind, a, b, seed); optim: None or (kind, lr, weight_decay, momentum, nesterov,
 * beta1, beta2, eps, rho). chainps/__init__.py builds these from Init and the optimizers. */
static int parse_init(PyObject *o, cps_init *init, const cps_init **out)
{
    *out = NULL;
    if (o == Py_None)
        return 0;
    int kind;
    unsigned long long seed;
    if (!PyArg_ParseTuple(o, "iffK;init must be (kind, a, b, seed)", &kind, &init->a, &init->b,
                          &seed))
        return -1;
    init->kind = (cps_init_kind)kind;
    init->seed = seed;
    *out = init;
    return 0;
}

static int parse_optim(PyObject *o, cps_optim *opt, const cps_optim **out)
{
    *out = NULL;
    if (o == Py_None)
        return 0;
    int kind, nesterov;
    memset(opt, 0, sizeof *opt);
    if (!PyArg_ParseTuple(o,
                          "ifffpffff;optim must be (kind, lr, weight_decay, momentum, nesterov, "
                          "beta1, beta2, eps, rho)",
                          &kind, &opt->lr, &opt->weight_decay, &opt->momentum, &nesterov,
                          &opt->beta1, &opt->beta2, &opt->eps, &opt->rho))
        return -1;
    opt->kind = (cps_optim_kind)kind;
    opt->nesterov = nesterov;
    *out = opt;
    return 0;
}

static PyObject *make_tensor(ClientObject *self, cps_tensor *t, PyObject *name, int is_table)
{
    TensorObject *to = PyObject_New(TensorObject, &TensorType);
    if (!to)
        return NULL;
    uint32_t nd = cps_tensor_ndim(t);
    to->shape = PyTuple_New(nd);
    if (!to->shape) {
        to->client = NULL;
        to->name = NULL;
        Py_DECREF(to);
        return NULL;
    }
    for (uint32_t i = 0; i < nd; i++)
        PyTuple_SET_ITEM(to->shape, i, PyLong_FromUnsignedLongLong(cps_tensor_dim(t, i)));
    to->client = self;
    Py_INCREF(self);
    to->t = t;
    to->name = name;
    Py_INCREF(name);
    to->numel = (Py_ssize_t)cps_tensor_length(t);
    to->is_table = is_table;
    to->cols = is_table && nd == 2 ? (Py_ssize_t)cps_tensor_dim(t, 1) : 0;
    return (PyObject *)to;
}

static int parse_shape(PyObject *shape, uint64_t *dims, uint32_t *ndim)
{
    PyObject *seq = NULL;
    if (PyLong_Check(shape)) {
        long long v = PyLong_AsLongLong(shape);
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (v < 1) {
            PyErr_Format(PyExc_ValueError, "shape (%lld,): every dimension must be >= 1", v);
            return -1;
        }
        dims[0] = (uint64_t)v;
        *ndim = 1;
        return 0;
    }
    seq = PySequence_Fast(shape, "shape must be an int or a sequence of ints");
    if (!seq)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || n > CPS_MAX_NDIM) {
        PyErr_Format(PyExc_ValueError, "shape %R: a tensor has 1 to %d dimensions", shape,
                     CPS_MAX_NDIM);
        Py_DECREF(seq);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
        if (v < 1) {
            PyErr_Format(PyExc_ValueError, "shape %R: every dimension must be >= 1", shape);
            Py_DECREF(seq);
            return -1;
        }
        dims[i] = (uint64_t)v;
    }
    *ndim = (uint32_t)n;
    Py_DECREF(seq);
    return 0;
}

/* Declare a dense tensor of shape dims[0..nd) or (is_table) a table of dims[0] rows of dims[1]
 * values, with the init and optim tuples io/oo (None for the defaults). */
static PyObject *declare(ClientObject *self, const char *call, PyObject *name, int is_table,
                         uint32_t nd, const uint64_t *dims, PyObject *io, PyObject *oo)
{
    if (client_open(self, call))
        return NULL;
    if (self->ops.head)
        cpy_ops_reap(&self->ops);
    cps_init init;
    cps_optim opt;
    const cps_init *ip;
    const cps_optim *op;
    const char *cname = PyUnicode_AsUTF8(name);
    if (!cname || parse_init(io, &init, &ip) || parse_optim(oo, &opt, &op))
        return NULL;
    if (is_table && dims[1] > UINT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s(%s): cols must be below 2^32", call, cname);
        return NULL;
    }
    cps_tensor *t = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = is_table ? cps_table_declare(self->c, cname, dims[0], (uint32_t)dims[1], ip, op, &t)
                  : cps_tensor_declare_shape(self->c, cname, nd, dims, ip, op, &t);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return raise_cps(rc, call, cname);
    return make_tensor(self, t, name, is_table);
}

static PyObject *Client_declare(ClientObject *self, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"name", "shape", "init", "optim", NULL};
    PyObject *name, *shape, *io = Py_None, *oo = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "UO|OO:declare", kw, &name, &shape, &io, &oo))
        return NULL;
    uint64_t dims[CPS_MAX_NDIM];
    uint32_t nd;
    if (parse_shape(shape, dims, &nd))
        return NULL;
    return declare(self, "declare", name, 0, nd, dims, io, oo);
}

static PyObject *Client_declare_table(ClientObject *self, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"name", "rows", "cols", "init", "optim", NULL};
    PyObject *name, *io = Py_None, *oo = Py_None;
    unsigned long long rows, cols;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "UKK|OO:declare_table", kw, &name, &rows, &cols,
                                     &io, &oo))
        return NULL;
    uint64_t dims[2] = {rows, cols};
    return declare(self, "declare_table", name, 1, 2, dims, io, oo);
}

/* The tensor argument of a call on an open client: a Tensor declared on this client. */
static TensorObject *tensor_arg(ClientObject *self, PyObject *o, const char *call)
{
    if (client_open(self, call))
        return NULL;
    if (!PyObject_TypeCheck(o, &TensorType)) {
        PyErr_Format(PyExc_TypeError, "%s: the first argument must be a chainps.Tensor, not %.100s",
                     call, Py_TYPE(o)->tp_name);
        return NULL;
    }
    TensorObject *t = (TensorObject *)o;
    if (t->client != self) {
        PyErr_Format(PyExc_ValueError, "%s: tensor %U was declared on another client", call,
                     t->name);
        return NULL;
    }
    return t;
}

/* Views of the gradient and/or output buffers of a whole-tensor call, checked against the
 * tensor's length. Returns the number of views (1 or 2) or -1 with an exception. */
static int tensor_bufs(TensorObject *t, PyObject *grad, PyObject *out, cpy_buf *bufs)
{
    const char *tn = PyUnicode_AsUTF8(t->name);
    int n = 0;
    PyObject *objs[2] = {grad, out};
    const char *what[2] = {"gradient", "out"};
    for (int i = 0; i < 2; i++) {
        if (!objs[i])
            continue;
        if (cpy_buf_get(objs[i], CPY_F32, i == 1, what[i], tn, &bufs[n]) != 0)
            goto fail;
        if (bufs[n].n != t->numel) {
            PyErr_Format(PyExc_ValueError, "tensor %s: %s has %zd values, the tensor has %zd", tn,
                         what[i], bufs[n].n, t->numel);
            cpy_buf_release(&bufs[n]);
            goto fail;
        }
        n++;
    }
    return n;
fail:
    for (int i = 0; i < n; i++)
        cpy_buf_release(&bufs[i]);
    return -1;
}

enum { K_PUSH, K_PULL, K_PUSH_PULL };
static const char *const call_names[] = {"push", "pull", "push_pull"};

/* Start a whole-tensor operation; returns its op record (buffers moved into it) or NULL. */
static cpy_op *start_op(ClientObject *self, int kind, PyObject *args, const char **tname)
{
    const char *call = call_names[kind];
    PyObject *to, *a = NULL, *b = NULL;
    if (kind == K_PUSH_PULL) {
        if (!PyArg_ParseTuple(args, "OOO", &to, &a, &b))
            return NULL;
    } else if (!PyArg_ParseTuple(args, "OO", &to, &a)) {
        return NULL;
    }
    TensorObject *t = tensor_arg(self, to, call);
    if (!t)
        return NULL;
    if (self->ops.head)
        cpy_ops_reap(&self->ops);
    *tname = PyUnicode_AsUTF8(t->name);
    cpy_buf bufs[2];
    int nb = tensor_bufs(t, kind == K_PULL ? NULL : a, kind == K_PULL ? a : b, bufs);
    if (nb < 0)
        return NULL;
    cps_handle *h = NULL;
    uint64_t len = (uint64_t)t->numel;
    int rc;
    if (kind == K_PUSH)
        rc = cps_push_async(self->c, t->t, bufs[0].ptr, len, &h);
    else if (kind == K_PULL)
        rc = cps_pull_async(self->c, t->t, bufs[0].ptr, len, &h);
    else
        rc = cps_push_pull_async(self->c, t->t, bufs[0].ptr, bufs[1].ptr, len, &h);
    if (rc != 0) {
        for (int i = 0; i < nb; i++)
            cpy_buf_release(&bufs[i]);
        raise_cps(rc, call, *tname);
        return NULL;
    }
    cpy_op *op = cpy_op_new(&self->ops, h, bufs, nb);
    if (!op) {
        /* No record to keep the buffers alive: the operation must end before we return. */
        int result;
        Py_BEGIN_ALLOW_THREADS
        cps_wait_result(h, -1, &result);
        Py_END_ALLOW_THREADS
        for (int i = 0; i < nb; i++)
            cpy_buf_release(&bufs[i]);
    }
    return op;
}

static PyObject *blocking(ClientObject *self, int kind, PyObject *args)
{
    const char *tname = NULL;
    cpy_op *op = start_op(self, kind, args, &tname);
    if (!op)
        return NULL;
    int w = cpy_op_wait(&self->ops, op, -1);
    if (w < 0) {
        cpy_op_orphan(&self->ops, op); /* interrupted: it finishes (or fails) on its own */
        return NULL;
    }
    int result = op->result;
    if (result != 0) {
        raise_cps_why(result, call_names[kind], tname, op->why);
        PyMem_Free(op);
        return NULL;
    }
    PyMem_Free(op);
    Py_RETURN_NONE;
}

static PyObject *asynchronous(ClientObject *self, int kind, PyObject *args)
{
    const char *tname = NULL;
    cpy_op *op = start_op(self, kind, args, &tname);
    if (!op)
        return NULL;
    HandleObject *h = PyObject_New(HandleObject, &HandleType);
    if (!h) {
        cpy_op_orphan(&self->ops, op);
        return NULL;
    }
    h->client = self;
    Py_INCREF(self);
    h->op = op;
    h->tensor_name = PyUnicode_FromString(tname);
    h->call = call_names[kind];
    if (!h->tensor_name) {
        Py_DECREF(h);
        return NULL;
    }
    return (PyObject *)h;
}

/* CPython's method table has no closure: one trampoline per call, generated. */
#define CPY_TENSOR_CALLS(X)                                                                        \
    X(push, blocking, K_PUSH)                                                                      \
    X(pull, blocking, K_PULL)                                                                      \
    X(push_pull, blocking, K_PUSH_PULL)                                                            \
    X(push_async, asynchronous, K_PUSH)                                                            \
    X(pull_async, asynchronous, K_PULL)                                                            \
    X(push_pull_async, asynchronous, K_PUSH_PULL)
#define CPY_TRAMPOLINE_(name, how, kind)                                                           \
    static PyObject *Client_##name(ClientObject *self, PyObject *args)                             \
    {                                                                                              \
        return how(self, kind, args);                                                              \
    }
CPY_TENSOR_CALLS(CPY_TRAMPOLINE_)
#undef CPY_TRAMPOLINE_

/* Row ids: a 64-bit integer buffer as it is, or any sequence of ints copied into `tmp`. */
static int rows_arg(PyObject *o, const char *tn, cpy_buf *b, uint64_t **tmp, Py_ssize_t *n)
{
    *tmp = NULL;
    if (PyObject_CheckBuffer(o) || !PySequence_Check(o)) {
        if (cpy_buf_get(o, CPY_U64, 0, "rows", tn, b) != 0)
            return -1;
        *n = b->n;
        return 0;
    }
    memset(b, 0, sizeof *b);
    PyObject *seq = PySequence_Fast(o, "rows must be a sequence of ints");
    if (!seq)
        return -1;
    *n = PySequence_Fast_GET_SIZE(seq);
    *tmp = PyMem_Malloc((size_t)(*n ? *n : 1) * sizeof **tmp);
    if (!*tmp) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if ((v == -1 && PyErr_Occurred()) || v < 0) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "tensor %s: row id %lld is negative", tn, v);
            PyMem_Free(*tmp);
            *tmp = NULL;
            Py_DECREF(seq);
            return -1;
        }
        (*tmp)[i] = (uint64_t)v;
    }
    Py_DECREF(seq);
    b->ptr = *tmp;
    return 0;
}

static PyObject *rows_call(ClientObject *self, PyObject *args, int push)
{
    const char *call = push ? "rows_push" : "rows_pull";
    PyObject *to, *ro, *vo;
    if (!PyArg_ParseTuple(args, "OOO", &to, &ro, &vo))
        return NULL;
    TensorObject *t = tensor_arg(self, to, call);
    if (!t)
        return NULL;
    const char *tn = PyUnicode_AsUTF8(t->name);
    if (!t->is_table) {
        PyErr_Format(PyExc_TypeError, "%s: tensor %s is not a table (declare_table)", call, tn);
        return NULL;
    }
    cpy_buf rb, vb;
    uint64_t *tmp;
    Py_ssize_t nrows;
    if (rows_arg(ro, tn, &rb, &tmp, &nrows) != 0)
        return NULL;
    if (cpy_buf_get(vo, CPY_F32, !push, push ? "gradients" : "out", tn, &vb) != 0)
        goto fail;
    if (vb.n != nrows * t->cols) {
        PyErr_Format(PyExc_ValueError, "tensor %s: %zd rows of %zd values need %zd values, got %zd",
                     tn, nrows, t->cols, nrows * t->cols, vb.n);
        cpy_buf_release(&vb);
        goto fail;
    }
    int rc;
    const uint64_t *rows = rb.ptr;
    Py_BEGIN_ALLOW_THREADS
    rc = push ? cps_rows_push(self->c, t->t, rows, (size_t)nrows, vb.ptr)
              : cps_rows_pull(self->c, t->t, rows, (size_t)nrows, vb.ptr);
    Py_END_ALLOW_THREADS
    cpy_buf_release(&vb);
    cpy_buf_release(&rb);
    PyMem_Free(tmp);
    if (rc != 0)
        return raise_cps(rc, call, tn);
    Py_RETURN_NONE;
fail:
    cpy_buf_release(&rb);
    PyMem_Free(tmp);
    return NULL;
}

static PyObject *Client_rows_push(ClientObject *self, PyObject *args)
{
    return rows_call(self, args, 1);
}
static PyObject *Client_rows_pull(ClientObject *self, PyObject *args)
{
    return rows_call(self, args, 0);
}

static PyObject *Client_compress(ClientObject *self, PyObject *args)
{
    PyObject *to;
    const char *spec;
    if (!PyArg_ParseTuple(args, "Os:compress", &to, &spec))
        return NULL;
    TensorObject *t = tensor_arg(self, to, "compress");
    if (!t)
        return NULL;
    const char *tn = PyUnicode_AsUTF8(t->name);
    /* No wait involved: the choice only applies to the next push. */
    int rc = cps_tensor_compress(self->c, t->t, spec);
    if (rc == CPS_EINVAL) {
        PyErr_Format(PyExc_ValueError,
                     "compress(%s): '%s' is not a gradient codec (fp16, bf16, topk:R with "
                     "0 < R <= 1, or none)",
                     tn, spec);
        return NULL;
    }
    if (rc != 0)
        return raise_cps(rc, "compress", tn);
    Py_RETURN_NONE;
}

static PyObject *Client_barrier(ClientObject *self, PyObject *unused)
{
    (void)unused;
    if (client_open(self, "barrier"))
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = cps_barrier(self->c);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return raise_cps(rc, "barrier", NULL);
    Py_RETURN_NONE;
}

/* allreduce(buf, op="sum"): in place over the live workers (chainps/allreduce.h). */
static PyObject *Client_allreduce(ClientObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"buf", "op", NULL};
    PyObject *obj;
    const char *opname = "sum";
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|s", kw, &obj, &opname))
        return NULL;
    if (client_open(self, "allreduce"))
        return NULL;
    cps_reduce_op op;
    if (strcmp(opname, "sum") == 0) {
        op = CPS_REDUCE_SUM;
    } else if (strcmp(opname, "mean") == 0) {
        op = CPS_REDUCE_MEAN;
    } else {
        PyErr_Format(PyExc_ValueError, "allreduce: op must be 'sum' or 'mean', not '%s'", opname);
        return NULL;
    }
    cpy_buf b = {0};
    if (cpy_buf_get(obj, CPY_F32, 1, "buf", NULL, &b) != 0)
        return NULL;
    int rc = CPS_EINVAL;
    if (b.n > 0) {
        Py_BEGIN_ALLOW_THREADS
        rc = cps_allreduce(self->c, (float *)b.ptr, (uint64_t)b.n, op);
        Py_END_ALLOW_THREADS
    }
    cpy_buf_release(&b);
    if (rc != 0)
        return raise_cps(rc, "allreduce", NULL);
    Py_RETURN_NONE;
}

/* allreduce_share(buf, step): offer buf to replacements (borrowed: keep it alive and
 * unresized; None withdraws it). */
static PyObject *Client_allreduce_share(ClientObject *self, PyObject *args)
{
    PyObject *obj;
    unsigned long long step = 0;
    if (!PyArg_ParseTuple(args, "O|K", &obj, &step))
        return NULL;
    if (client_open(self, "allreduce_share"))
        return NULL;
    int rc;
    if (obj == Py_None) {
        rc = cps_allreduce_share(self->c, NULL, 0, 0);
    } else {
        cpy_buf b = {0};
        if (cpy_buf_get(obj, CPY_F32, 0, "buf", NULL, &b) != 0)
            return NULL;
        rc = b.n > 0 ? cps_allreduce_share(self->c, (const float *)b.ptr, (uint64_t)b.n, step)
                     : CPS_EINVAL;
        cpy_buf_release(&b);
    }
    if (rc != 0)
        return raise_cps(rc, "allreduce_share", NULL);
    Py_RETURN_NONE;
}

/* local_add(name, buf, shape): list buf (borrowed: the caller keeps it alive and in place) as a
 * local tensor for checkpoints; buf None withdraws it. */
static PyObject *Client_local_add(ClientObject *self, PyObject *args)
{
    const char *name;
    PyObject *obj, *shape_obj = Py_None;
    if (!PyArg_ParseTuple(args, "sO|O", &name, &obj, &shape_obj))
        return NULL;
    if (client_open(self, "local_add"))
        return NULL;
    int rc;
    if (obj == Py_None) {
        rc = cps_local_add(self->c, name, NULL, 0, NULL);
    } else {
        uint64_t dims[8];
        Py_ssize_t nd = shape_obj == Py_None ? 0 : PySequence_Length(shape_obj);
        if (nd < 0)
            return NULL;
        if (nd > 8) {
            PyErr_SetString(PyExc_ValueError, "local_add: at most 8 dimensions");
            return NULL;
        }
        for (Py_ssize_t i = 0; i < nd; i++) {
            PyObject *d = PySequence_GetItem(shape_obj, i);
            unsigned long long v = d ? PyLong_AsUnsignedLongLong(d) : 0;
            Py_XDECREF(d);
            if (PyErr_Occurred())
                return NULL;
            dims[i] = v;
        }
        cpy_buf b = {0};
        if (cpy_buf_get(obj, CPY_F32, 0, "buf", NULL, &b) != 0)
            return NULL;
        if (nd == 0) {
            dims[0] = (uint64_t)b.n;
            nd = 1;
        }
        uint64_t numel = 1;
        for (Py_ssize_t i = 0; i < nd; i++)
            numel *= dims[i];
        rc = b.n > 0 && numel == (uint64_t)b.n
                 ? cps_local_add(self->c, name, (const float *)b.ptr, (uint32_t)nd, dims)
                 : CPS_EINVAL;
        cpy_buf_release(&b);
    }
    if (rc != 0)
        return raise_cps(rc, "local_add", name);
    Py_RETURN_NONE;
}

/* local_meta(key, value): a string written with the local tensors ("local/meta/<key>"). */
static PyObject *Client_local_meta(ClientObject *self, PyObject *args)
{
    const char *key, *value = NULL;
    if (!PyArg_ParseTuple(args, "sz", &key, &value))
        return NULL;
    if (client_open(self, "local_meta"))
        return NULL;
    int rc = cps_local_meta(self->c, key, value);
    if (rc != 0)
        return raise_cps(rc, "local_meta", key);
    Py_RETURN_NONE;
}

/* local_commit(step): the listed buffers hold the state after `step` steps. */
static PyObject *Client_local_commit(ClientObject *self, PyObject *args)
{
    unsigned long long step;
    if (!PyArg_ParseTuple(args, "K", &step))
        return NULL;
    if (client_open(self, "local_commit"))
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = cps_local_commit(self->c, step);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return raise_cps(rc, "local_commit", NULL);
    Py_RETURN_NONE;
}

/* allreduce_fetch(buf) -> the sharer's step, or None when this worker started with the job. */
static PyObject *Client_allreduce_fetch(ClientObject *self, PyObject *args)
{
    PyObject *obj;
    if (!PyArg_ParseTuple(args, "O", &obj))
        return NULL;
    if (client_open(self, "allreduce_fetch"))
        return NULL;
    cpy_buf b = {0};
    if (cpy_buf_get(obj, CPY_F32, 1, "buf", NULL, &b) != 0)
        return NULL;
    uint64_t step = 0;
    int rc = CPS_EINVAL;
    if (b.n > 0) {
        Py_BEGIN_ALLOW_THREADS
        rc = cps_allreduce_fetch(self->c, (float *)b.ptr, (uint64_t)b.n, &step);
        Py_END_ALLOW_THREADS
    }
    cpy_buf_release(&b);
    if (rc < 0)
        return raise_cps(rc, "allreduce_fetch", NULL);
    if (rc == 0)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(step);
}

static PyObject *Client_stats(ClientObject *self, PyObject *unused)
{
    (void)unused;
    if (client_open(self, "stats"))
        return NULL;
    cps_client_stats s;
    cps_client_stats_get(self->c, &s);
    cps_allreduce_stats a;
    cps_allreduce_stats_get(self->c, &a);
    return Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "pushes", (unsigned long long)s.pushes, "pulls",
        (unsigned long long)s.pulls, "push_raw_bytes", (unsigned long long)s.push_raw_bytes,
        "push_wire_bytes", (unsigned long long)s.push_wire_bytes, "pull_bytes",
        (unsigned long long)s.pull_bytes, "retries", (unsigned long long)s.retries, "late_pushes",
        (unsigned long long)s.late_pushes, "allreduces", (unsigned long long)a.completed,
        "allreduce_bytes_sent", (unsigned long long)a.bytes_sent);
}

static PyObject *Client_freq(ClientObject *self, PyObject *args, PyObject *kwds);

static PyMethodDef Client_methods[] = {
    {"declare", (PyCFunction)(void (*)(void))Client_declare, METH_VARARGS | METH_KEYWORDS,
     "declare(name, shape, init=None, optim=None) -> Tensor"},
    {"declare_table", (PyCFunction)(void (*)(void))Client_declare_table,
     METH_VARARGS | METH_KEYWORDS, "declare_table(name, rows, cols, init=None, optim=None)"},
    {"push", (PyCFunction)Client_push, METH_VARARGS, "push(tensor, grad)"},
    {"pull", (PyCFunction)Client_pull, METH_VARARGS, "pull(tensor, out)"},
    {"push_pull", (PyCFunction)Client_push_pull, METH_VARARGS, "push_pull(tensor, grad, out)"},
    {"push_async", (PyCFunction)Client_push_async, METH_VARARGS, "push_async(tensor, grad)"},
    {"pull_async", (PyCFunction)Client_pull_async, METH_VARARGS, "pull_async(tensor, out)"},
    {"push_pull_async", (PyCFunction)Client_push_pull_async, METH_VARARGS,
     "push_pull_async(tensor, grad, out) -> Handle"},
    {"rows_push", (PyCFunction)Client_rows_push, METH_VARARGS, "rows_push(table, rows, grads)"},
    {"rows_pull", (PyCFunction)Client_rows_pull, METH_VARARGS, "rows_pull(table, rows, out)"},
    {"compress", (PyCFunction)Client_compress, METH_VARARGS,
     "compress(tensor, spec): lossy push compression, 'fp16', 'bf16', 'topk:R' or 'none'"},
    {"barrier", (PyCFunction)Client_barrier, METH_NOARGS, "barrier()"},
    {"allreduce_share", (PyCFunction)Client_allreduce_share, METH_VARARGS,
     "allreduce_share(buf, step=0): offer buf (kept alive by the caller) to replacement workers"},
    {"local_add", (PyCFunction)Client_local_add, METH_VARARGS,
     "local_add(name, buf, shape=None): list buf (kept alive by the caller) as a local tensor for "
     "checkpoints; buf None withdraws it"},
    {"local_meta", (PyCFunction)Client_local_meta, METH_VARARGS,
     "local_meta(key, value): a string written with the local tensors; value None removes it"},
    {"local_commit", (PyCFunction)Client_local_commit, METH_VARARGS,
     "local_commit(step): the local tensors hold the state after step steps"},
    {"allreduce_fetch", (PyCFunction)Client_allreduce_fetch, METH_VARARGS,
     "allreduce_fetch(buf) -> step or None: a replacement copies a live worker's shared buf"},
    {"allreduce", (PyCFunction)(void (*)(void))Client_allreduce, METH_VARARGS | METH_KEYWORDS,
     "allreduce(buf, op='sum'): float32 buf all-reduced in place over the live workers; every "
     "worker gets the same bits"},
    {"stats", (PyCFunction)Client_stats, METH_NOARGS, "stats() -> dict"},
    {"freq", (PyCFunction)(void (*)(void))Client_freq, METH_VARARGS | METH_KEYWORDS,
     "freq(grads, state=None, sync_every=1, warmup_steps=0, start_step=0, servers=False) -> "
     "Freq: when the gradient buffers travel (chainps/freq.h); the buffers are borrowed"},
    {"close", (PyCFunction)Client_close, METH_NOARGS, "close()"},
    {"__enter__", (PyCFunction)Client_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Client_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Client_getset[] = {
    {"rank", (getter)Client_get_fact, NULL, "this worker's rank", (void *)F_RANK},
    {"num_workers", (getter)Client_get_fact, NULL, "workers in the job", (void *)F_NUM_WORKERS},
    {"num_servers", (getter)Client_get_fact, NULL, "servers in the job", (void *)F_NUM_SERVERS},
    {"start_step", (getter)Client_get_fact, NULL,
     "the step a training loop starts at once every tensor is declared (cps_start_step): 0 for "
     "a new job, the job's step for a replacement worker or a restored job",
     (void *)F_START_STEP},
    {"mode", (getter)Client_get_fact, NULL, "'sync', 'async' or 'ssp'", (void *)F_MODE},
    {"staleness", (getter)Client_get_fact, NULL, "N of ssp:N (0 otherwise)", (void *)F_STALENESS},
    {"closed", (getter)Client_get_closed, NULL, "True after close()", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject ClientType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "chainps._chainps.Client",
    .tp_basicsize = sizeof(ClientObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "A worker's connection to a chainps job (see chainps.init).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Client_init,
    .tp_dealloc = (destructor)Client_dealloc,
    .tp_methods = Client_methods,
    .tp_getset = Client_getset,
};

/* ---- Tensor ------------------------------------------------------------------------------ */

static void Tensor_dealloc(TensorObject *self)
{
    Py_XDECREF(self->name);
    Py_XDECREF(self->shape);
    Py_XDECREF(self->client);
    PyObject_Free(self);
}

static PyObject *Tensor_get_step(TensorObject *self, void *unused)
{
    (void)unused;
    if (client_open(self->client, "step"))
        return NULL;
    return PyLong_FromUnsignedLongLong(cps_tensor_step(self->t));
}

static PyObject *Tensor_repr(TensorObject *self)
{
    return PyUnicode_FromFormat("<chainps.Tensor %U shape=%R%s>", self->name, self->shape,
                                self->is_table ? " table" : "");
}

static PyMemberDef Tensor_members[] = {
    {"name", T_OBJECT_EX, offsetof(TensorObject, name), READONLY, "declared name"},
    {"shape", T_OBJECT_EX, offsetof(TensorObject, shape), READONLY, "declared shape"},
    {"numel", T_PYSSIZET, offsetof(TensorObject, numel), READONLY, "number of float32 values"},
    {"is_table", T_BOOL, offsetof(TensorObject, is_table), READONLY, "declared by declare_table"},
    {NULL, 0, 0, 0, NULL}};

static PyGetSetDef Tensor_getset[] = {
    {"step", (getter)Tensor_get_step, NULL, "the sync step / SSP clock (cps_tensor_step)", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject TensorType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "chainps._chainps.Tensor",
    .tp_basicsize = sizeof(TensorObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A declared tensor (Client.declare / declare_table).",
    .tp_dealloc = (destructor)Tensor_dealloc,
    .tp_repr = (reprfunc)Tensor_repr,
    .tp_members = Tensor_members,
    .tp_getset = Tensor_getset,
};

/* ---- Handle ------------------------------------------------------------------------------ */

static void Handle_dealloc(HandleObject *self)
{
    if (self->op && self->client)
        cpy_op_orphan(&self->client->ops, self->op);
    Py_XDECREF(self->tensor_name);
    Py_XDECREF(self->client);
    PyObject_Free(self);
}

static PyObject *Handle_wait(HandleObject *self, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"timeout", NULL};
    PyObject *to = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:wait", kw, &to))
        return NULL;
    double timeout = -1;
    if (to != Py_None) {
        timeout = PyFloat_AsDouble(to);
        if (timeout == -1 && PyErr_Occurred())
            return NULL;
        if (timeout < 0) {
            PyErr_SetString(PyExc_ValueError, "wait: timeout must be >= 0 or None");
            return NULL;
        }
    }
    if (!self->op->done) {
        int w = cpy_op_wait(&self->client->ops, self->op, timeout);
        if (w < 0)
            return NULL;
        if (w == 0) /* still running: the handle stays valid */
            return raise_cps_why(CPS_ETIMEDOUT, "wait", PyUnicode_AsUTF8(self->tensor_name),
                                 "the operation is still running (wait again)");
    }
    if (self->op->result != 0)
        return raise_cps_why(self->op->result, self->call, PyUnicode_AsUTF8(self->tensor_name),
                             self->op->why);
    Py_RETURN_NONE;
}

static PyObject *Handle_done(HandleObject *self, PyObject *unused)
{
    (void)unused;
    if (!self->op->done && !self->op->busy)
        cpy_op_wait(&self->client->ops, self->op, 0);
    if (PyErr_Occurred())
        return NULL;
    return PyBool_FromLong(self->op->done);
}

static PyMethodDef Handle_methods[] = {
    {"wait", (PyCFunction)(void (*)(void))Handle_wait, METH_VARARGS | METH_KEYWORDS,
     "wait(timeout=None): None when the operation succeeded; raises chainps.Error if it failed, "
     "chainps.TimeoutError if it is still running after `timeout` seconds."},
    {"done", (PyCFunction)Handle_done, METH_NOARGS, "done() -> bool, without blocking"},
    {NULL, NULL, 0, NULL}};

static PyTypeObject HandleType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "chainps._chainps.Handle",
    .tp_basicsize = sizeof(HandleObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An asynchronous push, pull or push-pull in flight.",
    .tp_dealloc = (destructor)Handle_dealloc,
    .tp_methods = Handle_methods,
};

/* ---- Freq (chainps/freq.h) --------------------------------------------------------------- */

/* Views of every float32 buffer of `seq` (a sequence; None is empty) into b[*at..] and fb[..]:
 * writable, contiguous, not empty. Returns the number taken, or -1 with an exception set. */
static Py_ssize_t freq_bufs(PyObject *seq, const char *what, cpy_buf *b, Py_ssize_t *at,
                            cps_freq_buf *fb)
{
    if (seq == Py_None)
        return 0;
    PyObject *fast = PySequence_Fast(seq, "freq: grads and state must be sequences of buffers");
    if (!fast)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    for (Py_ssize_t i = 0; i < n; i++) {
        cpy_buf *v = &b[*at];
        if (cpy_buf_get(PySequence_Fast_GET_ITEM(fast, i), CPY_F32, 1, what, NULL, v) != 0) {
            Py_DECREF(fast);
            return -1;
        }
        (*at)++;
        if (v->n == 0) {
            PyErr_Format(PyExc_ValueError, "freq: %s buffer %zd is empty", what, i);
            Py_DECREF(fast);
            return -1;
        }
        fb[i] = (cps_freq_buf){(float *)v->ptr, (uint64_t)v->n};
    }
    Py_DECREF(fast);
    return n;
}

static void Freq_dealloc(FreqObject *self)
{
    cps_freq_destroy(self->f);
    for (Py_ssize_t i = 0; i < self->nbufs; i++)
        cpy_buf_release(&self->bufs[i]);
    PyMem_Free(self->bufs);
    Py_XDECREF(self->client);
    PyObject_Free(self);
}

/* freq(grads, state=None, sync_every=1, warmup_steps=0, start_step=0, servers=False) -> Freq:
 * cps_freq_create over borrowed buffers (kept alive, and in place, by the Freq). */
static PyObject *Client_freq(ClientObject *self, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"grads",      "state",   "sync_every", "warmup_steps",
                         "start_step", "servers", NULL};
    PyObject *grads, *state = Py_None;
    long long k = 1, warmup = 0;
    unsigned long long start = 0;
    int servers = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|OLLKp:freq", kw, &grads, &state, &k, &warmup,
                                     &start, &servers))
        return NULL;
    if (client_open(self, "freq"))
        return NULL;
    Py_ssize_t ng = PySequence_Size(grads);
    Py_ssize_t ns = state == Py_None ? 0 : PySequence_Size(state);
    if (ng < 0 || ns < 0)
        return NULL;
    FreqObject *fo = PyObject_New(FreqObject, &FreqType);
    if (!fo)
        return NULL;
    fo->f = NULL;
    fo->nbufs = 0;
    fo->client = self;
    Py_INCREF(self);
    fo->bufs = PyMem_Calloc((size_t)(ng + ns + 1), sizeof *fo->bufs);
    cps_freq_buf *fb = PyMem_Calloc((size_t)(ng + ns + 1), sizeof *fb);
    if (!fo->bufs || !fb) {
        PyMem_Free(fb);
        Py_DECREF(fo);
        return PyErr_NoMemory();
    }
    Py_ssize_t got_g = freq_bufs(grads, "gradient", fo->bufs, &fo->nbufs, fb);
    Py_ssize_t got_s = got_g < 0 ? -1 : freq_bufs(state, "state", fo->bufs, &fo->nbufs, fb + ng);
    if (got_g < 0 || got_s < 0) {
        PyMem_Free(fb);
        Py_DECREF(fo);
        return NULL;
    }
    cps_freq_config cfg = {.sync_every = k,
                           .warmup_steps = warmup,
                           .start_step = start,
                           .target = servers ? CPS_FREQ_SERVERS : CPS_FREQ_RING};
    int rc = cps_freq_create(self->c, &cfg, fb, (size_t)got_g, got_s ? fb + ng : NULL,
                             (size_t)got_s, &fo->f);
    PyMem_Free(fb);
    if (rc == CPS_EINVAL) {
        /* Bad settings are the caller's values: ValueError with the library's reason. */
        const char *why = cps_last_error_message();
        PyErr_Format(PyExc_ValueError,
                     "freq: sync_every must be 1 .. %d and warmup_steps 0 .. "
                     "%lld: %s",
                     CPS_FREQ_MAX_SYNC_EVERY, (long long)CPS_FREQ_MAX_WARMUP,
                     why && *why ? why : "refused");
        Py_DECREF(fo);
        return NULL;
    }
    if (rc != 0) {
        raise_cps(rc, "freq", NULL);
        Py_DECREF(fo);
        return NULL;
    }
    return (PyObject *)fo;
}

static int freq_open(FreqObject *self, const char *call)
{
    return client_open(self->client, call);
}

/* grad() -> True (step the optimizer with the gradient buffers) or False (held). */
static PyObject *Freq_grad(FreqObject *self, PyObject *unused)
{
    (void)unused;
    if (freq_open(self, "freq.grad"))
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = cps_freq_grad(self->f);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return raise_cps(rc, "freq.grad", NULL);
    return PyBool_FromLong(rc == CPS_FREQ_APPLY);
}

/* step_end() -> True when it averaged the state (the warm-up's end). */
static PyObject *Freq_step_end(FreqObject *self, PyObject *unused)
{
    (void)unused;
    if (freq_open(self, "freq.step_end"))
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = cps_freq_step_end(self->f);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return raise_cps(rc, "freq.step_end", NULL);
    return PyBool_FromLong(rc);
}

static PyObject *Freq_stats(FreqObject *self, PyObject *unused)
{
    (void)unused;
    cps_freq_stats st;
    cps_freq_stats_get(self->f, &st);
    return Py_BuildValue("{s:K,s:K,s:K,s:K}", "steps", (unsigned long long)st.steps, "syncs",
                         (unsigned long long)st.syncs, "held", (unsigned long long)st.held,
                         "averaged", (unsigned long long)st.averaged);
}

static PyObject *Freq_get_step(FreqObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromUnsignedLongLong(cps_freq_step(self->f));
}

static PyMethodDef Freq_methods[] = {
    {"grad", (PyCFunction)Freq_grad, METH_NOARGS,
     "grad() -> bool: this step's gradients are in the buffers; True: step the optimizer with "
     "them (cps_freq_grad)"},
    {"step_end", (PyCFunction)Freq_step_end, METH_NOARGS,
     "step_end() -> bool: end the step; True when the warm-up's average was made now"},
    {"stats", (PyCFunction)Freq_stats, METH_NOARGS,
     "stats() -> dict(steps, syncs, held, averaged)"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Freq_getset[] = {
    {"step", (getter)Freq_get_step, NULL, "the job's step the next grad() belongs to", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject FreqType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "chainps._chainps.Freq",
    .tp_basicsize = sizeof(FreqObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Communication frequency and warm-up of all-reduced buffers (Client.freq).",
    .tp_dealloc = (destructor)Freq_dealloc,
    .tp_methods = Freq_methods,
    .tp_getset = Freq_getset,
};

/* ---- module ------------------------------------------------------------------------------ */

static PyObject *mod_init_values(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *io;
    unsigned long long offset;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OKn:init_values", &io, &offset, &n))
        return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "init_values: n must be >= 0");
        return NULL;
    }
    cps_init init;
    const cps_init *ip;
    if (parse_init(io, &init, &ip))
        return NULL;
    PyObject *ba = PyByteArray_FromStringAndSize(NULL, n * 4);
    if (!ba)
        return NULL;
    float *out = (float *)PyByteArray_AS_STRING(ba);
    Py_BEGIN_ALLOW_THREADS
    cps_init_values(ip, offset, out, (size_t)n);
    Py_END_ALLOW_THREADS
    return ba;
}

static PyObject *mod_strerror(PyObject *m, PyObject *arg)
{
    (void)m;
    long code = PyLong_AsLong(arg);
    if (code == -1 && PyErr_Occurred())
        return NULL;
    return Py_BuildValue("(ss)", cps_err_name((int)code), cps_strerror((int)code));
}

static PyMethodDef mod_methods[] = {
    {"init_values", mod_init_values, METH_VARARGS,
     "init_values(init, offset, n) -> bytearray of n float32 (the servers' initial values)"},
    {"strerror", mod_strerror, METH_O, "strerror(code) -> (name, text)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT,
                                    "chainps._chainps",
                                    "The C binding of libchainps (use the chainps package).",
                                    -1,
                                    mod_methods,
                                    NULL,
                                    NULL,
                                    NULL,
                                    NULL};

PyMODINIT_FUNC PyInit__chainps(void)
{
    if (PyType_Ready(&ClientType) < 0 || PyType_Ready(&TensorType) < 0 ||
        PyType_Ready(&HandleType) < 0 || PyType_Ready(&FreqType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (!m)
        return NULL;
    Error = PyErr_NewExceptionWithDoc(
        "chainps.Error", "A chainps call failed: .code (negative CPS_E... value), .name, text.",
        PyExc_RuntimeError, NULL);
    PyObject *bases = Error ? PyTuple_Pack(2, Error, PyExc_TimeoutError) : NULL;
    TimeoutErr = bases ? PyErr_NewExceptionWithDoc("chainps.TimeoutError",
                                                   "A chainps call or wait timed out.", bases, NULL)
                       : NULL;
    Py_XDECREF(bases);
    if (!TimeoutErr || PyModule_AddObjectRef(m, "Error", Error) < 0 ||
        PyModule_AddObjectRef(m, "TimeoutError", TimeoutErr) < 0 ||
        PyModule_AddObjectRef(m, "Client", (PyObject *)&ClientType) < 0 ||
        PyModule_AddObjectRef(m, "Tensor", (PyObject *)&TensorType) < 0 ||
        PyModule_AddObjectRef(m, "Handle", (PyObject *)&HandleType) < 0 ||
        PyModule_AddObjectRef(m, "Freq", (PyObject *)&FreqType) < 0 ||
        PyModule_AddStringConstant(m, "version", cps_version()) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#define ADD_ERR_(name, val, msg)                                                                   \
    if (PyModule_AddIntConstant(m, "CPS_" #name, val) < 0) {                                       \
        Py_DECREF(m);                                                                              \
        return NULL;                                                                               \
    }
    CPS_ERRNO_MAP(ADD_ERR_)
#undef ADD_ERR_
    return m;
}
