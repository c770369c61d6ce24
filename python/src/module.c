/* chainps._chainps: the CPython binding of libchainps's worker API.
 *
 * Buffers are passed without a copy (buffers.c); every call that waits releases the GIL and
 * waits in slices so Ctrl-C gets through (ops.c); every CPS_E... becomes chainps.Error carrying
 * the code, its name and cps_strerror's text. The Python-level API (Init, optimizers, docs)
 * lives in chainps/__init__.py on top of these types. */
#include "binding.h"

#include <stdint.h>

PyObject *cpy_Error, *cpy_TimeoutErr;

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
    if (cpy_parse_init(io, &init, &ip))
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
    if (PyType_Ready(&cpy_ClientType) < 0 || PyType_Ready(&cpy_TensorType) < 0 ||
        PyType_Ready(&cpy_HandleType) < 0 || PyType_Ready(&cpy_FreqType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (!m)
        return NULL;
    cpy_Error = PyErr_NewExceptionWithDoc(
        "chainps.Error", "A chainps call failed: .code (negative CPS_E... value), .name, text.",
        PyExc_RuntimeError, NULL);
    PyObject *bases = cpy_Error ? PyTuple_Pack(2, cpy_Error, PyExc_TimeoutError) : NULL;
    cpy_TimeoutErr =
        bases ? PyErr_NewExceptionWithDoc("chainps.TimeoutError",
                                          "A chainps call or wait timed out.", bases, NULL)
              : NULL;
    Py_XDECREF(bases);
    if (!cpy_TimeoutErr || PyModule_AddObjectRef(m, "Error", cpy_Error) < 0 ||
        PyModule_AddObjectRef(m, "TimeoutError", cpy_TimeoutErr) < 0 ||
        PyModule_AddObjectRef(m, "Client", (PyObject *)&cpy_ClientType) < 0 ||
        PyModule_AddObjectRef(m, "Tensor", (PyObject *)&cpy_TensorType) < 0 ||
        PyModule_AddObjectRef(m, "Handle", (PyObject *)&cpy_HandleType) < 0 ||
        PyModule_AddObjectRef(m, "Freq", (PyObject *)&cpy_FreqType) < 0 ||
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
