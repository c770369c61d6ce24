/* chainps.Error and chainps.TimeoutError raised from a CPS_E... code (see binding.h). */
#include "binding.h"

#include <string.h>

/* Raise chainps.Error (chainps.TimeoutError for CPS_ETIMEDOUT) for code `rc`, with the context
 * (which call, which tensor) in front of cps_strerror's text and the library's reason after it
 * (`why`: cps_last_error_message() of the failed call, NULL or "" when it gave none), e.g.
 * "chainps.init: bad configuration (CPS_ECONFIG): no job secret: give --secret-file FILE (...)".
 * The exception has .code, .name and .reason (the `why` text, "" if none). Returns NULL. */
PyObject *cpy_raise_cps_why(int rc, const char *call, const char *tensor, const char *why)
{
    PyObject *type = rc == CPS_ETIMEDOUT ? cpy_TimeoutErr : cpy_Error;
    if (!why)
        why = "";
    PyObject *head =
        tensor ? PyUnicode_FromFormat("%s(%s)", call, tensor) : PyUnicode_FromString(call);
    if (!head)
        return NULL;
    PyObject *msg = PyUnicode_FromFormat("%U: %s (%s)%s%s", head, cps_strerror(rc),
                                         cps_err_name(rc), why[0] ? ": " : "", why);
    Py_DECREF(head);
    if (!msg)
        return NULL;
    PyObject *exc = PyObject_CallOneArg(type, msg);
    Py_DECREF(msg);
    if (!exc)
        return NULL;
    PyObject *code = PyLong_FromLong(rc), *name = PyUnicode_FromString(cps_err_name(rc));
    /* The library's text is bytes it formatted from paths and names: never fail on its UTF-8. */
    PyObject *reason = PyUnicode_DecodeUTF8(why, (Py_ssize_t)strlen(why), "replace");
    if (code && name && reason) {
        PyObject_SetAttrString(exc, "code", code);
        PyObject_SetAttrString(exc, "name", name);
        PyObject_SetAttrString(exc, "reason", reason);
    }
    Py_XDECREF(code);
    Py_XDECREF(name);
    Py_XDECREF(reason);
    PyErr_SetObject(type, exc);
    Py_DECREF(exc);
    return NULL;
}

/* cpy_raise_cps_why with the reason of the chainps call this thread made last: call it right after
 * the failed call, before any other chainps call on this thread. */
PyObject *cpy_raise_cps(int rc, const char *call, const char *tensor)
{
    return cpy_raise_cps_why(rc, call, tensor, cps_last_error_message());
}
