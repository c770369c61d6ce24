/* Client's allreduce (chainps/allreduce.h) and the buffer a worker shares with replacements. */
#include "binding.h"

#include <stdint.h>
#include <string.h>

PyObject *cpy_client_allreduce(ClientObject *self, PyObject *args, PyObject *kwargs)
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
        return cpy_raise_cps(rc, "allreduce", NULL);
    Py_RETURN_NONE;
}

/* allreduce_share(buf, step): offer buf to replacements (borrowed: keep it alive and
 * unresized; None withdraws it). */
PyObject *cpy_client_allreduce_share(ClientObject *self, PyObject *args)
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
        return cpy_raise_cps(rc, "allreduce_share", NULL);
    Py_RETURN_NONE;
}

/* local_add(name, buf, shape): list buf (borrowed: the caller keeps it alive and in place) as a
 * local tensor for checkpoints; buf None withdraws it. */
PyObject *cpy_client_allreduce_fetch(ClientObject *self, PyObject *args)
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
        return cpy_raise_cps(rc, "allreduce_fetch", NULL);
    if (rc == 0)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(step);
}
