/*
 * The CUDA driver calls of the wait path, called from C: record an event, query an event or a
 * stream, make a stream wait for an event, launch a host function.
 *
 * Every await makes one to four of these calls. Through the Python bindings each costs a
 * Python-level call with argument conversion, and a "not ready" answer costs a raised and caught
 * exception. Here each is one METH_FASTCALL call: the queries return a bool, the others None,
 * and a failure calls the error factory given to bind() (the real driver's, in
 * _driver/_cuda.py), which raises the library's error. The real driver binds these functions
 * as its methods, so an await makes no Python-level call for them at all.
 *
 * The function pointers come from the driver itself (cuGetProcAddress, through the bindings,
 * pinned to the CUDA 12.0 ABI of each function), so this module links to nothing and works with
 * whichever libcuda the bindings loaded. Until bind() is called, and after unbind() (which the
 * real driver calls in a forked child), every call raises.
 *
 * The calls that enqueue work (record, wait, launch) release the GIL: the driver can block in
 * them (a full push buffer), and a host function of another library may be waiting for the GIL
 * on the driver's thread. The queries return at once and keep it.
 */
#include <stdint.h>

#include "_acs.h"

typedef int cu_result;
typedef void (*host_fn_t)(void *);

static cu_result (*p_event_record)(void *event, void *stream);
static cu_result (*p_event_query)(void *event);
static cu_result (*p_stream_query)(void *stream);
static cu_result (*p_stream_wait_event)(void *stream, void *event, unsigned int flags);
static cu_result (*p_launch_host_func)(void *stream, host_fn_t fn, void *user_data);
static PyObject *fail_factory; /* fail(status, what): raises the library's error */
static PyObject *refusal;      /* refuse(): raises why the calls are unbound, after unbind() */

#define NOT_READY 600 /* CUDA_ERROR_NOT_READY */

static PyObject *fail(cu_result r, const char *what) {
    /* bind() may replace it during the call, and unbind() clear it: the enqueuing calls
     * release the GIL, so the factory that check_args() saw may be gone. */
    PyObject *factory = fail_factory;
    if (!factory) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s failed (%d) and the CUDA driver calls were unbound meanwhile", what,
                     (int)r);
        return NULL;
    }
    Py_INCREF(factory);
    PyObject *out = PyObject_CallFunction(factory, "is", (int)r, what);
    Py_DECREF(factory);
    if (out) {
        Py_DECREF(out);
        PyErr_Format(PyExc_RuntimeError, "%s failed (%d) and the error factory returned", what,
                     (int)r);
    }
    return NULL;
}

static PyObject *done_or_fail(cu_result r, const char *what) {
    if (r == 0) Py_RETURN_NONE;
    return fail(r, what);
}

static PyObject *ready_or_fail(cu_result r, const char *what) {
    if (r == 0) Py_RETURN_TRUE;
    if (r == NOT_READY) Py_RETURN_FALSE;
    return fail(r, what);
}

static int as_handle(PyObject *o, void **out) {
    /* A CUDA handle is a non-negative int (0 is the default stream). */
    unsigned long long v;
    if (acs_as_u64(o, "a CUDA handle", &v) < 0) return -1;
    *out = (void *)(uintptr_t)v;
    return 0;
}

static int check_args(const char *name, Py_ssize_t nargs, Py_ssize_t want, const void *fn) {
    if (acs_check_nargs(name, nargs, want) < 0) return -1;
    if (!fn || !fail_factory) {
        if (refusal) {
            /* unbind(refuse): refuse() raises the reason (a forked child, say). */
            PyObject *out = PyObject_CallNoArgs(refusal);
            if (!out) return -1;
            Py_DECREF(out);
        }
        PyErr_SetString(PyExc_RuntimeError, "the CUDA driver calls are not bound (bind() first)");
        return -1;
    }
    return 0;
}

static PyObject *cu_event_record(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs) {
    void *event, *stream;
    if (check_args("event_record", nargs, 2, p_event_record) < 0) return NULL;
    if (as_handle(args[0], &event) < 0 || as_handle(args[1], &stream) < 0) return NULL;
    cu_result (*call)(void *, void *) = p_event_record; /* read with the GIL held */
    cu_result r;
    Py_BEGIN_ALLOW_THREADS
    r = call(event, stream);
    Py_END_ALLOW_THREADS
    return done_or_fail(r, "cuEventRecord");
}

static PyObject *cu_event_query(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs) {
    void *event;
    if (check_args("event_query", nargs, 1, p_event_query) < 0) return NULL;
    if (as_handle(args[0], &event) < 0) return NULL;
    return ready_or_fail(p_event_query(event), "cuEventQuery");
}

static PyObject *cu_stream_query(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs) {
    void *stream;
    if (check_args("stream_query", nargs, 1, p_stream_query) < 0) return NULL;
    if (as_handle(args[0], &stream) < 0) return NULL;
    return ready_or_fail(p_stream_query(stream), "cuStreamQuery");
}

static PyObject *cu_stream_wait_event(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs) {
    void *stream, *event;
    if (check_args("stream_wait_event", nargs, 2, p_stream_wait_event) < 0) return NULL;
    if (as_handle(args[0], &stream) < 0 || as_handle(args[1], &event) < 0) return NULL;
    cu_result (*call)(void *, void *, unsigned int) = p_stream_wait_event;
    cu_result r;
    Py_BEGIN_ALLOW_THREADS
    r = call(stream, event, 0);
    Py_END_ALLOW_THREADS
    return done_or_fail(r, "cuStreamWaitEvent");
}

static PyObject *cu_launch_host_func(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs) {
    void *stream, *fn, *user_data;
    if (check_args("launch_host_func", nargs, 3, p_launch_host_func) < 0) return NULL;
    if (as_handle(args[0], &stream) < 0 || as_handle(args[1], &fn) < 0 ||
        as_handle(args[2], &user_data) < 0)
        return NULL;
    if (!fn) {
        PyErr_SetString(PyExc_ValueError, "the host function is NULL");
        return NULL;
    }
    cu_result (*call)(void *, host_fn_t, void *) = p_launch_host_func;
    cu_result r;
    Py_BEGIN_ALLOW_THREADS
    r = call(stream, (host_fn_t)fn, user_data);
    Py_END_ALLOW_THREADS
    return done_or_fail(r, "cuLaunchHostFunc");
}

static PyObject *cu_bind(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs) {
    /* bind(record, query, stream_query, stream_wait_event, launch_host_func, fail): the
     * addresses of cuEventRecord, cuEventQuery, cuStreamQuery, cuStreamWaitEvent and
     * cuLaunchHostFunc, and fail(status, what), which raises the error for a failed call. */
    void *p[5];
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "bind() takes 5 addresses and a callable (%zd given)",
                     nargs);
        return NULL;
    }
    for (int i = 0; i < 5; i++) {
        if (as_handle(args[i], &p[i]) < 0) return NULL;
        if (!p[i]) {
            PyErr_SetString(PyExc_ValueError, "bind(): a driver function's address is NULL");
            return NULL;
        }
    }
    if (!PyCallable_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "bind(): the error factory is not callable");
        return NULL;
    }
    Py_INCREF(args[5]);
    Py_XSETREF(fail_factory, args[5]);
    Py_CLEAR(refusal);
    p_event_record = (cu_result(*)(void *, void *))p[0];
    p_event_query = (cu_result(*)(void *))p[1];
    p_stream_query = (cu_result(*)(void *))p[2];
    p_stream_wait_event = (cu_result(*)(void *, void *, unsigned int))p[3];
    p_launch_host_func = (cu_result(*)(void *, host_fn_t, void *))p[4];
    Py_RETURN_NONE;
}

static PyObject *cu_unbind(PyObject *Py_UNUSED(m), PyObject *refuse) {
    /* unbind(refuse): forget the driver's addresses (in a forked child they mean nothing);
     * from now on every call raises what refuse() raises. */
    if (!PyCallable_Check(refuse)) {
        PyErr_SetString(PyExc_TypeError, "unbind(): refuse is not callable");
        return NULL;
    }
    p_event_record = NULL;
    p_event_query = NULL;
    p_stream_query = NULL;
    p_stream_wait_event = NULL;
    p_launch_host_func = NULL;
    Py_CLEAR(fail_factory);
    Py_INCREF(refuse);
    Py_XSETREF(refusal, refuse);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"unbind", (PyCFunction)cu_unbind, METH_O,
     "unbind(refuse): forget the addresses; every call then raises what refuse() raises."},
    {"bind", (PyCFunction)(void (*)(void))cu_bind, METH_FASTCALL,
     "bind(record, query, stream_query, stream_wait_event, launch_host_func, fail): the "
     "driver's function addresses and the error factory."},
    {"event_record", (PyCFunction)(void (*)(void))cu_event_record, METH_FASTCALL,
     "event_record(event, stream) -> None (cuEventRecord; releases the GIL)."},
    {"event_query", (PyCFunction)(void (*)(void))cu_event_query, METH_FASTCALL,
     "event_query(event) -> bool (cuEventQuery: True done, False not ready)."},
    {"stream_query", (PyCFunction)(void (*)(void))cu_stream_query, METH_FASTCALL,
     "stream_query(stream) -> bool (cuStreamQuery: True idle, False busy)."},
    {"stream_wait_event", (PyCFunction)(void (*)(void))cu_stream_wait_event, METH_FASTCALL,
     "stream_wait_event(stream, event) -> None (cuStreamWaitEvent; releases the GIL)."},
    {"launch_host_func", (PyCFunction)(void (*)(void))cu_launch_host_func, METH_FASTCALL,
     "launch_host_func(stream, fn, user_data) -> None (cuLaunchHostFunc; releases the GIL)."},
    {NULL, NULL, 0, NULL},
};

ACS_MODULE(_cucalls, "The CUDA driver calls of the wait path; a failure raises the driver's error.",
           methods, NULL)
