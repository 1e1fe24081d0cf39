/*
 * The pooled event of a busy stream, and what the spin on it needs.
 *
 * When the first query of Stream.wait_complete() finds the stream busy and no parked point of
 * the stream may be shared, the wait takes a pooled event and records it on the stream; it then
 * queries the event between checkpoints while the stream's spin window lasts (the spin itself is
 * a state of the wait: _hotpath_wait.c), and parks on it if the window passes. The event covers
 * what the stream held at the record, so the wait covers at most the work enqueued during its
 * first checkpoint besides.
 *
 * A spin's checkpoint serves only the loop's other work. Given the loop's queue of ready
 * callbacks (asyncio's `_ready`; None where the loop has none to read, as uvloop and trio), the
 * spin queries again without yielding while that queue is empty, for up to IDLE_SPIN seconds
 * per step: a pass of an idle loop (a selector poll and the task's own step, 1.7-2.3 us on an
 * H200 host) would only delay the query that sees the work done. Anything that becomes ready
 * meanwhile (a callback from another thread, a task woken) makes the spin yield at its next
 * query; I/O and timers are polled at most IDLE_SPIN later.
 */
#include "_hotpath.h"

/* The pool's size limit (_EventPool._LIMIT), handed over by _pools as the spin limit is. */
static Py_ssize_t pool_limit = 0;

#define NAMES(X) X(event_create) X(event_record) X(event_query) X(event_destroy) X(stream_query)
ACS_NAMES(NAMES)

static PyTypeObject *deque_type; /* collections.deque */

int _acs_give_event_back(WaitStateObject *s, PyObject *event) {
    int rc;
    if (PyList_GET_SIZE(s->pool) < pool_limit) {
        rc = PyList_Append(s->pool, event);
    } else {
        PyObject *args[2] = {s->driver, event};
        PyObject *r = PyObject_VectorcallMethod(str.event_destroy, args,
                                                2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        rc = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
    Py_DECREF(event);
    return rc;
}

void _acs_put_back(PyObject *pool, PyObject *event) {
    PyObject *exc = acs_err_take();
    if (PyList_Append(pool, event) < 0) PyErr_WriteUnraisable(pool);
    acs_err_give(exc);
    Py_DECREF(event);
}

PyObject *_acs_take_recorded(WaitStateObject *s) {
    PyObject *event, *pool = s->pool;
    Py_ssize_t n = PyList_GET_SIZE(pool);
    if (n > 0) { /* take_event(): a free one, else a new one */
        event = Py_NewRef(PyList_GET_ITEM(pool, n - 1));
        if (PyList_SetSlice(pool, n - 1, n, NULL) < 0) {
            Py_DECREF(event);
            return NULL;
        }
    } else {
        PyObject *args[2] = {s->driver, s->device};
        event = PyObject_VectorcallMethod(str.event_create, args,
                                          2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (event == NULL) return NULL;
    }
    PyObject *args[3] = {s->driver, event, s->handle};
    PyObject *r = PyObject_VectorcallMethod(str.event_record, args,
                                            3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (r == NULL) { /* record_pooled(): the event goes back, the error propagates */
        _acs_put_back(pool, event);
        return NULL;
    }
    Py_DECREF(r);
    return event;
}

int _acs_query(WaitStateObject *s, PyObject *event) {
    PyObject *args[2] = {s->driver, event != NULL ? event : s->handle};
    PyObject *r = PyObject_VectorcallMethod(event != NULL ? str.event_query : str.stream_query,
                                            args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (r == NULL) return -1;
    int done = r == Py_True ? 1 : r == Py_False ? 0 : PyObject_IsTrue(r);
    Py_DECREF(r);
    return done;
}

int _acs_loop_idle(PyObject *ready) {
    if (ready == NULL || !Py_IS_TYPE(ready, deque_type)) return 0;
    return PyObject_Size(ready) == 0;
}

PyObject *_acs_set_pool_limit(PyObject *Py_UNUSED(module), PyObject *arg) {
    Py_ssize_t limit = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (limit == -1 && PyErr_Occurred()) return NULL;
    if (limit < 0) {
        PyErr_Format(PyExc_ValueError, "the pool limit must be >= 0, got %R", arg);
        return NULL;
    }
    pool_limit = limit;
    Py_RETURN_NONE;
}

int _acs_spin_init(PyObject *module) {
    if (acs_intern_names() < 0) return -1;
    if ((deque_type = acs_import_type("collections", "deque")) == NULL) return -1;
    return PyModule_AddObject(module, "IDLE_SPIN", PyFloat_FromDouble(IDLE_SPIN));
}
