/* The Tensor type: a declared tensor's name, shape and step. */
#include "binding.h"

#include <structmember.h>

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

PyTypeObject cpy_TensorType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "chainps._chainps.Tensor",
    .tp_basicsize = sizeof(TensorObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A declared tensor (Client.declare / declare_table).",
    .tp_dealloc = (destructor)Tensor_dealloc,
    .tp_repr = (reprfunc)Tensor_repr,
    .tp_members = Tensor_members,
    .tp_getset = Tensor_getset,
};
