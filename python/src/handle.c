/* The Handle type: an asynchronous push, pull or push-pull in flight. */
#include "binding.h"

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
            return cpy_raise_cps_why(CPS_ETIMEDOUT, "wait", PyUnicode_AsUTF8(self->tensor_name),
                                     "the operation is still running (wait again)");
    }
    if (self->op->result != 0)
        return cpy_raise_cps_why(self->op->result, self->call, PyUnicode_AsUTF8(self->tensor_name),
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

PyTypeObject cpy_HandleType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "chainps._chainps.Handle",
    .tp_basicsize = sizeof(HandleObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An asynchronous push, pull or push-pull in flight.",
    .tp_dealloc = (destructor)Handle_dealloc,
    .tp_methods = Handle_methods,
};
