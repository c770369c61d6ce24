/* Client's local tensors: buffers listed to be written with checkpoints, with their metadata. */
#include "binding.h"

#include <stdint.h>
#include <string.h>

PyObject *cpy_client_local_add(ClientObject *self, PyObject *args)
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
        return cpy_raise_cps(rc, "local_add", name);
    Py_RETURN_NONE;
}

/* local_meta(key, value): a string written with the local tensors ("local/meta/<key>"). */
PyObject *cpy_client_local_meta(ClientObject *self, PyObject *args)
{
    const char *key, *value = NULL;
    if (!PyArg_ParseTuple(args, "sz", &key, &value))
        return NULL;
    if (client_open(self, "local_meta"))
        return NULL;
    int rc = cps_local_meta(self->c, key, value);
    if (rc != 0)
        return cpy_raise_cps(rc, "local_meta", key);
    Py_RETURN_NONE;
}

/* local_commit(step): the listed buffers hold the state after `step` steps. */
PyObject *cpy_client_local_commit(ClientObject *self, PyObject *args)
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
        return cpy_raise_cps(rc, "local_commit", NULL);
    Py_RETURN_NONE;
}

/* allreduce_fetch(buf) -> the sharer's step, or None when this worker started with the job. */
