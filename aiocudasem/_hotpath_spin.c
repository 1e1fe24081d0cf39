/*
 * spin_recorded(): the asyncio event path's spin.
 *
 * What Stream.wait_complete() does on asyncio when its first query finds the stream busy and
 * no parked point of the stream may be shared (see Notifier.wait_recorded(), whose spin phase
 * this is): take a pooled event and record it on the stream, then query the event between bare
 * yields until it is done or the stream's spin window has passed. The event covers what the
 * stream held at the record, so the wait covers at most the work enqueued during its first
 * checkpoint besides, as with Python's event path. Python counts the spinner (max_spinners)
 * and the completed wait around the await, and parks on the event if the window passes.
 *
 * The wait passed its checkpoint already, so a yield of the spin serves only the loop's other
 * work. Given the loop's queue of ready callbacks (asyncio's `_ready`; None where the loop has
 * none to read, as uvloop), the spin queries again without yielding while that queue is empty,
 * for up to IDLE_SPIN seconds per step: a pass of an idle loop (a selector poll and the task's
 * own step, 1.7-2.3 us on an H200 host) would only delay the query that sees the work done.
 * Anything that becomes ready meanwhile (a callback from another thread, a task woken) makes
 * the spin yield at its next query; I/O and timers are polled at most IDLE_SPIN later.
 */
#include "_hotpath.h"

#define IDLE_SPIN 20e-6

/* The pool's size limit (_EventPool._LIMIT), handed over by _pools as the spin limit is. */
static Py_ssize_t pool_limit = 0;

static PyObject *str_event_create, *str_event_record, *str_event_query, *str_event_destroy;

enum { SPIN_RECORDED = 0, SPIN_SPINNING = 1, SPIN_DONE = 2 };

typedef struct {
    AcsAwait head; /* state: SPIN_RECORDED (not yet stepped), SPIN_SPINNING (yielded) or
                    * SPIN_DONE; executing: inside a step's calls */
    PyObject *driver, *pool, *history, *query, *event;
    PyObject *ready; /* the loop's queue of ready callbacks, or NULL: see IDLE_SPIN */
    double started, recorded, deadline;
} SpinRecordedObject;

static AcsType SpinRecordedType;

/* The event back to its pool, or destroyed if the pool is full (give_back()), once the wait is
 * done: 0, or -1 with an error set. The object no longer holds it either way. */
static int give_event_back(SpinRecordedObject *c) {
    PyObject *event = c->event;
    if (event == NULL) return 0;
    c->event = NULL;
    int rc;
    if (PyList_GET_SIZE(c->pool) < pool_limit) {
        rc = PyList_Append(c->pool, event);
    } else {
        PyObject *r = PyObject_CallMethodOneArg(c->driver, str_event_destroy, event);
        rc = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
    Py_DECREF(event);
    return rc;
}

/* An event back to `pool`, past the pool's limit if need be, and with no call of the driver,
 * which may not be called from a finalizer (the collector can run while this thread holds the
 * driver's lock; see _release.py). Keeps the error that is set; an append that fails (no
 * memory) is reported as unraisable. Takes over the reference to `event`. */
static void put_back(PyObject *pool, PyObject *event) {
    PyObject *exc = acs_err_take();
    if (PyList_Append(pool, event) < 0) PyErr_WriteUnraisable(pool);
    acs_err_give(exc);
    Py_DECREF(event);
}

/* On every other way out (an error, throw(), close(), the finalizer): the event back to its
 * pool (put_back()). */
static void return_event(SpinRecordedObject *c) {
    PyObject *event = c->event;
    if (event == NULL || c->pool == NULL) return;
    c->event = NULL;
    put_back(c->pool, event);
}

static PyTypeObject *deque_type; /* collections.deque */

/* spin_recorded(driver, device, pool, handle, history, started, ready): the event is taken and
 * recorded now, at the call; the awaitable then spins on it. */
PyObject *_acs_spin_recorded(PyObject *Py_UNUSED(module), PyObject *const *args,
                             Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "spin_recorded() takes 7 positional arguments, got %zd",
                     nargs);
        return NULL;
    }
    PyObject *ready = args[6];
    if (ready == Py_None) {
        ready = NULL;
    } else if (!Py_IS_TYPE(ready, deque_type)) {
        PyErr_Format(PyExc_TypeError,
                     "spin_recorded(): ready must be a collections.deque or None, not %.100s",
                     Py_TYPE(ready)->tp_name);
        return NULL;
    }
    PyObject *driver = args[0], *device = args[1], *pool = args[2], *handle = args[3];
    if (!PyList_CheckExact(pool)) {
        PyErr_Format(PyExc_TypeError, "spin_recorded(): pool must be a list, not %.100s",
                     Py_TYPE(pool)->tp_name);
        return NULL;
    }
    if (!Py_IS_TYPE(args[4], &_acs_HistoryType.type)) {
        PyErr_Format(PyExc_TypeError, "spin_recorded(): history must be a History, not %.100s",
                     Py_TYPE(args[4])->tp_name);
        return NULL;
    }
    double started = PyFloat_AsDouble(args[5]);
    if (started == -1.0 && PyErr_Occurred()) return NULL;
    PyObject *query = PyObject_GetAttr(driver, str_event_query);
    if (query == NULL) return NULL;
    /* take_event(): a free one, else a new one */
    PyObject *event;
    Py_ssize_t n = PyList_GET_SIZE(pool);
    if (n > 0) {
        event = Py_NewRef(PyList_GET_ITEM(pool, n - 1));
        if (PyList_SetSlice(pool, n - 1, n, NULL) < 0) {
            Py_DECREF(event);
            Py_DECREF(query);
            return NULL;
        }
    } else {
        event = PyObject_CallMethodOneArg(driver, str_event_create, device);
        if (event == NULL) {
            Py_DECREF(query);
            return NULL;
        }
    }
    PyObject *record_args[3] = {driver, event, handle};
    PyObject *r = PyObject_VectorcallMethod(str_event_record, record_args,
                                            3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (r == NULL) { /* record_pooled(): the event goes back, the error propagates */
        put_back(pool, event);
        Py_DECREF(query);
        return NULL;
    }
    Py_DECREF(r);
    SpinRecordedObject *c = PyObject_GC_New(SpinRecordedObject, &SpinRecordedType.type);
    if (c == NULL) {
        put_back(pool, event);
        Py_DECREF(query);
        return NULL;
    }
    c->driver = Py_NewRef(driver);
    c->pool = Py_NewRef(pool);
    c->history = Py_NewRef(args[4]);
    c->query = query;
    c->event = event;
    c->ready = Py_XNewRef(ready);
    c->head.executing = 0;
    c->started = started;
    c->recorded = _acs_perf_counter(); /* nothing ran since the record: see wait_recorded() */
    c->deadline = started;
    c->head.state = SPIN_RECORDED;
    PyObject_GC_Track(c);
    return (PyObject *)c;
}

static const Py_ssize_t SpinRecorded_refs[] = {
    offsetof(SpinRecordedObject, driver), offsetof(SpinRecordedObject, pool),
    offsetof(SpinRecordedObject, history), offsetof(SpinRecordedObject, query),
    offsetof(SpinRecordedObject, event), offsetof(SpinRecordedObject, ready),
    0,
};

/* Never finished nor closed (dropped half-way, or garbage in a cycle, where the collector runs
 * this before it clears anything): the event goes back. */
static void SpinRecorded_finalize(PyObject *self) {
    return_event((SpinRecordedObject *)self);
}

/* Whether the loop has nothing else ready to run: the spin may query again without yielding
 * (see IDLE_SPIN). Never for a loop whose queue it was not given. */
static int loop_idle(SpinRecordedObject *c) {
    return c->ready != NULL && PyObject_Size(c->ready) == 0;
}

/* The wait ends without its event being done: (event, recorded) for the park, the event now
 * the caller's. */
static PySendResult hand_over(SpinRecordedObject *c, PyObject **result) {
    c->head.state = SPIN_DONE;
    PyObject *recorded = PyFloat_FromDouble(c->recorded);
    if (recorded == NULL) {
        return_event(c);
        *result = NULL;
        return PYGEN_ERROR;
    }
    *result = PyTuple_Pack(2, c->event, recorded);
    Py_DECREF(recorded);
    if (*result == NULL) {
        return_event(c);
        return PYGEN_ERROR;
    }
    Py_CLEAR(c->event);
    return PYGEN_RETURN;
}

/* One step: PYGEN_NEXT with None (a yield), PYGEN_RETURN with None (the event is done, the
 * history learnt how long the wait took, the event went back) or with (event, recorded) (the
 * spin window passed, or there was none), or PYGEN_ERROR (the event went back). */
static PySendResult SpinRecorded_step(PyObject *self, PyObject *Py_UNUSED(value),
                                      PyObject **result) {
    SpinRecordedObject *c = (SpinRecordedObject *)self;
    if (acs_refuse_reentry(self) < 0) {
        *result = NULL;
        return PYGEN_ERROR;
    }
    if (c->head.state == SPIN_DONE) {
        *result = Py_NewRef(Py_None);
        return PYGEN_RETURN;
    }
    if (c->event == NULL || c->history == NULL) { /* cleared by the collector while suspended */
        c->head.state = SPIN_DONE;
        PyErr_SetString(PyExc_RuntimeError, "a cleared spin_recorded() was resumed");
        *result = NULL;
        return PYGEN_ERROR;
    }
    double step = _acs_perf_counter();
    if (c->head.state == SPIN_RECORDED) {
        double window = _acs_spin_window((HistoryObject *)c->history);
        if (!(window > 0.0)) return hand_over(c, result);
        c->deadline = c->started + window;
        c->head.state = SPIN_SPINNING;
        if (!loop_idle(c)) {
            *result = Py_NewRef(Py_None);
            return PYGEN_NEXT;
        }
    }
    for (;;) {
        PyObject *args[1] = {c->event};
        c->head.executing = 1;
        PyObject *r = PyObject_Vectorcall(c->query, args, 1, NULL);
        int done = r == NULL ? -1 : r == Py_True ? 1 : r == Py_False ? 0 : PyObject_IsTrue(r);
        Py_XDECREF(r);
        c->head.executing = 0;
        if (done < 0) {
            c->head.state = SPIN_DONE;
            return_event(c);
            *result = NULL;
            return PYGEN_ERROR;
        }
        double now = _acs_perf_counter();
        if (done) {
            c->head.state = SPIN_DONE;
            _acs_learn((HistoryObject *)c->history, now - c->started);
            c->head.executing = 1;
            int rc = give_event_back(c);
            c->head.executing = 0;
            if (rc < 0) {
                *result = NULL;
                return PYGEN_ERROR;
            }
            *result = Py_NewRef(Py_None);
            return PYGEN_RETURN;
        }
        if (now >= c->deadline) return hand_over(c, result);
        if (now - step >= IDLE_SPIN || !loop_idle(c)) break;
    }
    *result = Py_NewRef(Py_None);
    return PYGEN_NEXT;
}

/* close(), and throw() before it raises: the wait ends, the event goes back. */
static int SpinRecorded_end(PyObject *self) {
    SpinRecordedObject *c = (SpinRecordedObject *)self;
    c->head.state = SPIN_DONE;
    return_event(c);
    return 0;
}

/* The (event, recorded) that the wait handed over could not be returned: the event goes
 * back. */
static void SpinRecorded_lost(PyObject *self, PyObject *value) {
    SpinRecordedObject *c = (SpinRecordedObject *)self;
    c->event = Py_NewRef(PyTuple_GET_ITEM(value, 0));
    return_event(c);
}

static const AcsAwaitHooks SpinRecorded_hooks = {
    .name = "spin_recorded()",
    .end = SpinRecorded_end,
    .lost = SpinRecorded_lost,
};

static PyMethodDef SpinRecorded_methods[] = {
    {"send", acs_await_send, METH_O, "send(value): as next(); the value is ignored."},
    {"throw", (PyCFunction)(void (*)(void))acs_await_throw, METH_FASTCALL,
     "throw(exc): give the event back, and raise exc."},
    {"close", acs_await_close, METH_NOARGS, "close(): end now, giving the event back."},
    {NULL, NULL, 0, NULL},
};

static PyAsyncMethods SpinRecorded_async = {
    .am_await = acs_return_self,
    .am_send = SpinRecorded_step,
};

static AcsType SpinRecordedType = {
    .type = {
        PyVarObject_HEAD_INIT(NULL, 0)
        .tp_name = "aiocudasem._hotpath.SpinRecorded",
        .tp_basicsize = sizeof(SpinRecordedObject),
        .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
        .tp_doc = "An asyncio wait on a pooled event just recorded (see spin_recorded()).",
        .tp_as_async = &SpinRecorded_async,
        .tp_iter = acs_return_self,
        .tp_iternext = acs_await_next,
        .tp_methods = SpinRecorded_methods,
        .tp_traverse = acs_traverse,
        .tp_clear = acs_clear,
        .tp_dealloc = acs_dealloc,
        .tp_finalize = SpinRecorded_finalize,
    },
    .refs = SpinRecorded_refs,
    .await = &SpinRecorded_hooks,
};

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
    const AcsName names[] = {
        {&str_event_create, "event_create"},
        {&str_event_record, "event_record"},
        {&str_event_query, "event_query"},
        {&str_event_destroy, "event_destroy"},
        {NULL, NULL},
    };
    if (_acs_intern(names) < 0) return -1;
    PyObject *collections = PyImport_ImportModule("collections");
    if (collections == NULL) return -1;
    deque_type = (PyTypeObject *)PyObject_GetAttrString(collections, "deque");
    Py_DECREF(collections);
    if (deque_type == NULL) return -1;
    if (!PyType_Check(deque_type)) {
        PyErr_SetString(PyExc_TypeError, "collections.deque is not a type");
        return -1;
    }
    if (_acs_add_type(module, NULL, &SpinRecordedType.type) < 0) return -1;
    return PyModule_AddObject(module, "IDLE_SPIN", PyFloat_FromDouble(IDLE_SPIN));
}
