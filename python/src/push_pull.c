/* Client's whole-tensor calls (push, pull, push_pull, blocking or returning a Handle), row
 * push/pull on tables, and push compression. */
#include "binding.h"

#include <stdint.h>
#include <string.h>

/* The tensor argument of a call on an open client: a Tensor declared on this client. */
static TensorObject *tensor_arg(ClientObject *self, PyObject *o, const char *call)
{
    if (client_open(self, call))
        return NULL;
    if (!PyObject_TypeCheck(o, &cpy_TensorType)) {
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
        cpy_raise_cps(rc, call, *tname);
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
        cpy_raise_cps_why(result, call_names[kind], tname, op->why);
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
    HandleObject *h = PyObject_New(HandleObject, &cpy_HandleType);
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
    PyObject *cpy_client_##name(ClientObject *self, PyObject *args)                                \
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
        return cpy_raise_cps(rc, call, tn);
    Py_RETURN_NONE;
fail:
    cpy_buf_release(&rb);
    PyMem_Free(tmp);
    return NULL;
}

PyObject *cpy_client_rows_push(ClientObject *self, PyObject *args)
{
    return rows_call(self, args, 1);
}
PyObject *cpy_client_rows_pull(ClientObject *self, PyObject *args)
{
    return rows_call(self, args, 0);
}

PyObject *cpy_client_compress(ClientObject *self, PyObject *args)
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
        return cpy_raise_cps(rc, "compress", tn);
    Py_RETURN_NONE;
}
