/* Float32 and uint64 views of Python objects without a copy: anything with the buffer protocol
 * (numpy arrays, memoryview, array.array) and torch CPU tensors, which have no buffer protocol
 * but expose their storage through data_ptr(). */
#ifndef CHAINPS_PY_BUFFERS_H
#define CHAINPS_PY_BUFFERS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* A borrowed view. `obj` holds a reference for as long as the view is in use (an asynchronous
 * operation keeps it until the C side is done with the memory). */
typedef struct cpy_buf {
    PyObject *obj;
    Py_buffer view;
    int has_view; /* view came from PyObject_GetBuffer and must be released */
    void *ptr;
    Py_ssize_t n; /* elements */
} cpy_buf;

enum cpy_elem { CPY_F32 = 0, CPY_U64 = 1 };

/* Fill *b from `o`: C-contiguous elements of the kind `elem` (for CPY_U64, int64 is taken too:
 * row ids are never negative, and the C side checks their range), writable when `writable`.
 * `what` ("gradient", "out", "rows") and `tensor` (may be NULL) name the argument in errors.
 * Returns 0, or -1 with TypeError (not a buffer, wrong dtype, CUDA) or ValueError
 * (non-contiguous, read-only) set. */
int cpy_buf_get(PyObject *o, int elem, int writable, const char *what, const char *tensor,
                cpy_buf *b);
/* Release a view filled by cpy_buf_get (no-op on a zeroed one). Needs the GIL. */
void cpy_buf_release(cpy_buf *b);

#endif
