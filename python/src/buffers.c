/* Zero-copy views of numpy arrays, memoryviews and torch CPU tensors (see buffers.h). */
#include "buffers.h"

#include <string.h>

/* torch is looked up only once it has been imported by someone: a program without torch never
 * pays for it, and we never import it ourselves. */
static PyTypeObject *torch_tensor_type;
static PyObject *torch_float32, *torch_int64;

static int torch_lookup(void)
{
    if (torch_tensor_type)
        return 1;
    PyObject *name = PyUnicode_FromString("torch");
    if (!name)
        return -1;
    PyObject *mod = PyImport_GetModule(name);
    Py_DECREF(name);
    if (!mod) {
        if (PyErr_Occurred())
            return -1;
        return 0;
    }
    PyObject *t = PyObject_GetAttrString(mod, "Tensor");
    PyObject *f32 = t ? PyObject_GetAttrString(mod, "float32") : NULL;
    PyObject *i64 = f32 ? PyObject_GetAttrString(mod, "int64") : NULL;
    Py_DECREF(mod);
    if (!i64 || !PyType_Check(t)) {
        Py_XDECREF(t);
        Py_XDECREF(f32);
        Py_XDECREF(i64);
        PyErr_Clear();
        return 0;
    }
    torch_tensor_type = (PyTypeObject *)t;
    torch_float32 = f32;
    torch_int64 = i64;
    return 1;
}

static const char *arg_name(const char *tensor)
{
    return tensor ? tensor : "(no tensor)";
}

/* A long from calling o.meth() (no arguments); -1 with an exception on failure. */
static long long call_ll(PyObject *o, const char *meth)
{
    PyObject *r = PyObject_CallMethod(o, meth, NULL);
    if (!r)
        return -1;
    long long v = PyLong_AsLongLong(r);
    Py_DECREF(r);
    return v;
}

static int torch_view(PyObject *o, int elem, const char *what, const char *tensor, cpy_buf *b)
{
    PyObject *dtype = PyObject_GetAttrString(o, "dtype");
    if (!dtype)
        return -1;
    PyObject *want = elem == CPY_F32 ? torch_float32 : torch_int64;
    if (dtype != want) {
        PyObject *s = PyObject_Str(dtype);
        PyErr_Format(PyExc_TypeError, "tensor %s: %s must be torch.%s, not %S", arg_name(tensor),
                     what, elem == CPY_F32 ? "float32" : "int64", s ? s : dtype);
        Py_XDECREF(s);
        Py_DECREF(dtype);
        return -1;
    }
    Py_DECREF(dtype);
    PyObject *dev = PyObject_GetAttrString(o, "device");
    PyObject *dtype_s = dev ? PyObject_GetAttrString(dev, "type") : NULL;
    Py_XDECREF(dev);
    if (!dtype_s)
        return -1;
    int cpu = PyUnicode_Check(dtype_s) && PyUnicode_CompareWithASCIIString(dtype_s, "cpu") == 0;
    if (!cpu) {
        PyErr_Format(PyExc_TypeError,
                     "tensor %s: %s is on device %S; chainps takes CPU tensors only",
                     arg_name(tensor), what, dtype_s);
        Py_DECREF(dtype_s);
        return -1;
    }
    Py_DECREF(dtype_s);
    PyObject *sparse = PyObject_GetAttrString(o, "is_sparse");
    if (!sparse)
        return -1;
    int is_sparse = PyObject_IsTrue(sparse);
    Py_DECREF(sparse);
    PyObject *contig = PyObject_CallMethod(o, "is_contiguous", NULL);
    if (!contig)
        return -1;
    int is_contig = PyObject_IsTrue(contig);
    Py_DECREF(contig);
    if (is_sparse || !is_contig) {
        PyErr_Format(PyExc_ValueError,
                     "tensor %s: %s is not a contiguous dense tensor (use .contiguous())",
                     arg_name(tensor), what);
        return -1;
    }
    long long n = call_ll(o, "numel");
    long long p = n >= 0 ? call_ll(o, "data_ptr") : -1;
    if (PyErr_Occurred())
        return -1;
    b->obj = o;
    Py_INCREF(o);
    b->ptr = (void *)(uintptr_t)p;
    b->n = (Py_ssize_t)n;
    b->has_view = 0;
    return 0;
}

static int format_ok(const Py_buffer *v, int elem)
{
    const char *f = v->format ? v->format : "B";
    size_t len = strlen(f);
    if (len == 0 || len > 2 || (len == 2 && !strchr("@=<", f[0])))
        return 0;
    char c = f[len - 1];
    if (elem == CPY_F32)
        return v->itemsize == 4 && c == 'f';
    return v->itemsize == 8 && strchr("QqLl", c) != NULL;
}

int cpy_buf_get(PyObject *o, int elem, int writable, const char *what, const char *tensor,
                cpy_buf *b)
{
    memset(b, 0, sizeof *b);
    if (PyObject_CheckBuffer(o)) {
        if (PyObject_GetBuffer(o, &b->view, PyBUF_FULL_RO) != 0)
            return -1;
        const char *problem = NULL;
        PyObject *exc = PyExc_ValueError;
        if (!format_ok(&b->view, elem)) {
            exc = PyExc_TypeError;
            problem = elem == CPY_F32 ? "must hold float32 values" : "must hold 64-bit integers";
        } else if (!PyBuffer_IsContiguous(&b->view, 'C')) {
            problem = "is not C-contiguous (use numpy.ascontiguousarray)";
        } else if (writable && b->view.readonly) {
            problem = "is read-only";
        }
        if (problem) {
            PyObject *dt = PyObject_GetAttrString(o, "dtype");
            if (!dt) {
                PyErr_Clear();
                dt = PyUnicode_FromString(b->view.format ? b->view.format : "bytes");
            }
            PyErr_Format(exc, "tensor %s: %s %s (got %S)", arg_name(tensor), what, problem, dt);
            Py_XDECREF(dt);
            PyBuffer_Release(&b->view);
            return -1;
        }
        b->has_view = 1;
        b->obj = o;
        Py_INCREF(o);
        b->ptr = b->view.buf;
        b->n = b->view.len / b->view.itemsize;
        return 0;
    }
    int t = torch_lookup();
    if (t < 0)
        return -1;
    if (t && PyObject_TypeCheck(o, torch_tensor_type))
        return torch_view(o, elem, what, tensor, b);
    PyErr_Format(PyExc_TypeError,
                 "tensor %s: %s must be a numpy array, a torch CPU tensor or another buffer of "
                 "%s, not %.100s",
                 arg_name(tensor), what, elem == CPY_F32 ? "float32" : "int64",
                 Py_TYPE(o)->tp_name);
    return -1;
}

void cpy_buf_release(cpy_buf *b)
{
    if (b->has_view)
        PyBuffer_Release(&b->view);
    b->has_view = 0;
    Py_CLEAR(b->obj);
}
