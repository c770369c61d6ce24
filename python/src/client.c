/* The Client type: open and close, the job's facts, declare, barrier and stats, and the method
 * table that names the calls the other files define (binding.h). */
#include "binding.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* close() lets operations in flight finish for this long before it leaves the job anyway (a
 * sync push interrupted by Ctrl-C may wait for workers that never push). */
#define CLOSE_DRAIN_S 5.0

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
        cpy_raise_cps(rc, "chainps.init", NULL);
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
        return cpy_raise_cps(rc, "close", NULL);
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
        return cpy_raise_cps(rc, fact_names[f], NULL);
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
int cpy_parse_init(PyObject *o, cps_init *init, const cps_init **out)
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
    TensorObject *to = PyObject_New(TensorObject, &cpy_TensorType);
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
    if (!cname || cpy_parse_init(io, &init, &ip) || parse_optim(oo, &opt, &op))
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
        return cpy_raise_cps(rc, call, cname);
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
        return cpy_raise_cps(rc, "barrier", NULL);
    Py_RETURN_NONE;
}

/* allreduce(buf, op="sum"): in place over the live workers (chainps/allreduce.h). */
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

static PyMethodDef Client_methods[] = {
    {"declare", (PyCFunction)(void (*)(void))Client_declare, METH_VARARGS | METH_KEYWORDS,
     "declare(name, shape, init=None, optim=None) -> Tensor"},
    {"declare_table", (PyCFunction)(void (*)(void))Client_declare_table,
     METH_VARARGS | METH_KEYWORDS, "declare_table(name, rows, cols, init=None, optim=None)"},
    {"push", (PyCFunction)cpy_client_push, METH_VARARGS, "push(tensor, grad)"},
    {"pull", (PyCFunction)cpy_client_pull, METH_VARARGS, "pull(tensor, out)"},
    {"push_pull", (PyCFunction)cpy_client_push_pull, METH_VARARGS, "push_pull(tensor, grad, out)"},
    {"push_async", (PyCFunction)cpy_client_push_async, METH_VARARGS, "push_async(tensor, grad)"},
    {"pull_async", (PyCFunction)cpy_client_pull_async, METH_VARARGS, "pull_async(tensor, out)"},
    {"push_pull_async", (PyCFunction)cpy_client_push_pull_async, METH_VARARGS,
     "push_pull_async(tensor, grad, out) -> Handle"},
    {"rows_push", (PyCFunction)cpy_client_rows_push, METH_VARARGS, "rows_push(table, rows, grads)"},
    {"rows_pull", (PyCFunction)cpy_client_rows_pull, METH_VARARGS, "rows_pull(table, rows, out)"},
    {"compress", (PyCFunction)cpy_client_compress, METH_VARARGS,
     "compress(tensor, spec): lossy push compression, 'fp16', 'bf16', 'topk:R' or 'none'"},
    {"barrier", (PyCFunction)Client_barrier, METH_NOARGS, "barrier()"},
    {"allreduce_share", (PyCFunction)cpy_client_allreduce_share, METH_VARARGS,
     "allreduce_share(buf, step=0): offer buf (kept alive by the caller) to replacement workers"},
    {"local_add", (PyCFunction)cpy_client_local_add, METH_VARARGS,
     "local_add(name, buf, shape=None): list buf (kept alive by the caller) as a local tensor for "
     "checkpoints; buf None withdraws it"},
    {"local_meta", (PyCFunction)cpy_client_local_meta, METH_VARARGS,
     "local_meta(key, value): a string written with the local tensors; value None removes it"},
    {"local_commit", (PyCFunction)cpy_client_local_commit, METH_VARARGS,
     "local_commit(step): the local tensors hold the state after step steps"},
    {"allreduce_fetch", (PyCFunction)cpy_client_allreduce_fetch, METH_VARARGS,
     "allreduce_fetch(buf) -> step or None: a replacement copies a live worker's shared buf"},
    {"allreduce", (PyCFunction)(void (*)(void))cpy_client_allreduce, METH_VARARGS | METH_KEYWORDS,
     "allreduce(buf, op='sum'): float32 buf all-reduced in place over the live workers; every "
     "worker gets the same bits"},
    {"stats", (PyCFunction)Client_stats, METH_NOARGS, "stats() -> dict"},
    {"freq", (PyCFunction)(void (*)(void))cpy_client_freq, METH_VARARGS | METH_KEYWORDS,
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

PyTypeObject cpy_ClientType = {
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
