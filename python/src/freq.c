/* The Freq type (chainps/freq.h): when the gradient buffers travel. */
#include "binding.h"

#include <stdint.h>
#include <string.h>

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
PyObject *cpy_client_freq(ClientObject *self, PyObject *args, PyObject *kwds)
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
    FreqObject *fo = PyObject_New(FreqObject, &cpy_FreqType);
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
        cpy_raise_cps(rc, "freq", NULL);
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
        return cpy_raise_cps(rc, "freq.grad", NULL);
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
        return cpy_raise_cps(rc, "freq.step_end", NULL);
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

PyTypeObject cpy_FreqType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "chainps._chainps.Freq",
    .tp_basicsize = sizeof(FreqObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Communication frequency and warm-up of all-reduced buffers (Client.freq).",
    .tp_dealloc = (destructor)Freq_dealloc,
    .tp_methods = Freq_methods,
    .tp_getset = Freq_getset,
};
