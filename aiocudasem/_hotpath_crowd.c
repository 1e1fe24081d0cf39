/*
 * Waking parked sleepers: wake_in_turn(), the one callback of an asyncio loop that wakes a
 * crowd, and in_park_order(), the order in which sleepers are woken.
 *
 * A parked task on asyncio (or uvloop) sleeps on a future of the loop. set_result() on a future
 * marks it done and schedules each of its done callbacks (the task's wake-up) with the loop's
 * call_soon(): a handle of the loop per task, made now and run later, and all of a crowd's
 * handles made before its first task resumes. A crowd of 10,000 futures is woken instead by one
 * callback of the loop, wake_in_turn(), which takes each future in turn: it takes the future's
 * callbacks off, marks it done as set_result() does, and runs those callbacks at once, each in
 * its context, as the loop would have; then the next. The first task resumes as soon as its own
 * future is marked, and no handle is made. The futures are the loop's own, so everything that
 * looks at a task's future (anyio's cancel scopes, wait_all_tasks_blocked(), Task.cancel()) sees
 * a future that is pending until its turn and done after it, as with set_result(): a task
 * cancelled before its turn has its future cancelled, and its turn skips it.
 *
 * A future's callbacks are read from its `_callbacks` attribute: (callback, context) pairs, in
 * both asyncio's C and Python futures since Python 3.7. A future without it, or with anything
 * else there, is woken with plain set_result().
 */
#include "_hotpath.h"

#define NAMES(X)                                                                                \
    X(call_soon) X(_callbacks) X(remove_done_callback) X(set_result) X(done) X(get_loop)        \
    X(add_done_callback)
ACS_NAMES(NAMES)

static PyObject *context_kwnames, *wake_in_turn_fn;

/* getattr(o, name, None) without the exception: 1 and a new reference, 0 and NULL if there
 * is no such attribute, -1 on another error. */
static int optional_attr(PyObject *o, PyObject *name, PyObject **res) {
#if PY_VERSION_HEX >= 0x030D0000
    return PyObject_GetOptionalAttr(o, name, res);
#else
    *res = PyObject_GetAttr(o, name);
    if (*res != NULL) return 1;
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
    PyErr_Clear();
    return 0;
#endif
}

/* self.name(*args, context=context) with one or two positional arguments (`arg2` NULL for
 * one): 0, or -1 with an error set. */
static int call_in_context(PyObject *self, PyObject *name, PyObject *arg1, PyObject *arg2,
                           PyObject *context) {
    PyObject *args[4] = {self, arg1, arg2 != NULL ? arg2 : context, context};
    size_t nargs = arg2 != NULL ? 3 : 2; /* self included; the context follows */
    PyObject *r = PyObject_VectorcallMethod(name, args, nargs, context_kwnames);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* fut.get_loop().call_soon(callback, fut, context=context) */
static int call_soon_on(PyObject *fut, PyObject *callback, PyObject *context) {
    PyObject *loop = PyObject_CallMethodNoArgs(fut, str.get_loop);
    if (loop == NULL) return -1;
    int rc = call_in_context(loop, str.call_soon, callback, fut, context);
    Py_DECREF(loop);
    return rc;
}

/* The (callback, context) pairs of `fut`, as a new list of its own, or NULL with no error set
 * if they cannot be read that way. */
static PyObject *callbacks_of(PyObject *fut) {
    PyObject *cbs;
    if (optional_attr(fut, str._callbacks, &cbs) < 0) return NULL;
    if (cbs == NULL || cbs == Py_None) {
        int none = cbs == Py_None;
        Py_XDECREF(cbs);
        return none ? PyList_New(0) : NULL;
    }
    PyObject *pairs;
    if (PyList_CheckExact(cbs) && Py_REFCNT(cbs) == 1) {
        pairs = cbs; /* a list made for this read (asyncio's C futures build one): ours */
    } else {
        /* a copy: a Python future hands out its live list, which its methods change */
        pairs = PyList_Check(cbs) ? PySequence_List(cbs) : NULL;
        Py_DECREF(cbs);
    }
    if (pairs == NULL) return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(pairs); i++) {
        PyObject *p = PyList_GET_ITEM(pairs, i);
        if (!PyTuple_Check(p) || PyTuple_GET_SIZE(p) != 2 ||
            !PyContext_CheckExact(PyTuple_GET_ITEM(p, 1))) {
            Py_DECREF(pairs);
            return NULL;
        }
    }
    return pairs;
}

/* After an error: fut.set_result(None) if it is not done, which schedules its callbacks as
 * usual; errors are reported as unraisable. Keeps the error that is set. */
static void plain_set_result(PyObject *fut) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    Py_INCREF(fut);
    PyObject *r = PyObject_CallMethodNoArgs(fut, str.done);
    int done = r == NULL ? -1 : PyObject_IsTrue(r);
    Py_XDECREF(r);
    if (done == 0) {
        r = PyObject_CallMethodOneArg(fut, str.set_result, Py_None);
        if (r == NULL) done = -1;
        Py_XDECREF(r);
    }
    if (done < 0) PyErr_WriteUnraisable(fut);
    Py_DECREF(fut);
    PyErr_Restore(type, value, tb);
}

/* The rest of a crowd, from `start` on, to a new call of the loop of `fut`:
 * loop.call_soon(wake_in_turn, rest). If the loop refuses (it is closed), each gets plain
 * set_result(), as far as that goes. Keeps the error that is set, if any. */
static void hand_on(PyObject *futures, Py_ssize_t start, PyObject *fut) {
    if (start >= PyList_GET_SIZE(futures)) return;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *rest = PyList_GetSlice(futures, start, PyList_GET_SIZE(futures));
    PyObject *loop = rest == NULL ? NULL : PyObject_CallMethodNoArgs(fut, str.get_loop);
    PyObject *r = loop == NULL ? NULL
                               : PyObject_CallMethodObjArgs(loop, str.call_soon, wake_in_turn_fn,
                                                            rest, NULL);
    if (r == NULL) {
        PyErr_Clear();
        for (Py_ssize_t j = start; j < PyList_GET_SIZE(futures); j++)
            plain_set_result(PyList_GET_ITEM(futures, j));
    }
    Py_XDECREF(r);
    Py_XDECREF(loop);
    Py_XDECREF(rest);
    PyErr_Restore(type, value, tb);
}

/* After an error while `fut` was being marked (`taken` of its callbacks `pairs` taken off, the
 * future not yet done): it gets back those no longer among its callbacks (found by identity,
 * which runs no Python; if they cannot be read, those whose removal returned), so that it is as
 * it was and cancelling its task still works, then plain set_result(). Keeps the error. */
static void unmark(PyObject *fut, PyObject *pairs, Py_ssize_t taken) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *now = pairs != NULL ? callbacks_of(fut) : NULL;
    if (now == NULL) PyErr_Clear();
    for (Py_ssize_t j = 0; pairs != NULL && j < PyList_GET_SIZE(pairs); j++) {
        PyObject *p = PyList_GET_ITEM(pairs, j), *cb = PyTuple_GET_ITEM(p, 0);
        int gone = now == NULL ? j < taken : 1;
        for (Py_ssize_t q = 0; now != NULL && q < PyList_GET_SIZE(now); q++)
            if (PyTuple_GET_ITEM(PyList_GET_ITEM(now, q), 0) == cb) gone = 0;
        if (gone && call_in_context(fut, str.add_done_callback, cb, NULL, PyTuple_GET_ITEM(p, 1)) < 0)
            PyErr_WriteUnraisable(fut);
    }
    Py_XDECREF(now);
    PyErr_Restore(type, value, tb);
    plain_set_result(fut);
}

PyObject *_acs_wake_in_turn(PyObject *Py_UNUSED(module), PyObject *futures) {
    if (!PyList_CheckExact(futures)) {
        PyErr_Format(PyExc_TypeError, "wake_in_turn() takes a list, not %.200s",
                     Py_TYPE(futures)->tp_name);
        return NULL;
    }
    Py_INCREF(futures);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(futures); i++) {
        PyObject *fut = Py_NewRef(PyList_GET_ITEM(futures, i)), *pairs = NULL;
        Py_ssize_t taken = 0, ran = 0;
        int marked = 0;
        PyObject *r = PyObject_CallMethodNoArgs(fut, str.done);
        int done = r == NULL ? -1 : PyObject_IsTrue(r);
        Py_XDECREF(r);
        if (done > 0) { /* cancelled, or woken otherwise */
            Py_DECREF(fut);
            continue;
        }
        if (done < 0) goto error;
        pairs = callbacks_of(fut);
        if (pairs == NULL) {
            if (PyErr_Occurred()) goto error;
            /* Callbacks that cannot be read that way: plain set_result(), which schedules them. */
            r = PyObject_CallMethodOneArg(fut, str.set_result, Py_None);
            if (r == NULL) goto error;
            Py_DECREF(r);
            Py_DECREF(fut);
            continue;
        }
        for (; taken < PyList_GET_SIZE(pairs); taken++) {
            r = PyObject_CallMethodOneArg(fut, str.remove_done_callback,
                                          PyTuple_GET_ITEM(PyList_GET_ITEM(pairs, taken), 0));
            if (r == NULL) goto error;
            Py_DECREF(r);
        }
        r = PyObject_CallMethodOneArg(fut, str.set_result, Py_None);
        if (r == NULL) goto error;
        Py_DECREF(r);
        marked = 1;
        /* Its wake-ups, now, each in its context, as the loop would run them. */
        while (ran < PyList_GET_SIZE(pairs)) {
            PyObject *p = PyList_GET_ITEM(pairs, ran), *context = PyTuple_GET_ITEM(p, 1);
            if (PyContext_Enter(context) < 0) goto error; /* it did not run */
            r = PyObject_CallOneArg(PyTuple_GET_ITEM(p, 0), fut);
            ran++;
            int exited = PyContext_Exit(context);
            if (r == NULL || exited < 0) {
                Py_XDECREF(r);
                goto error;
            }
            Py_DECREF(r);
        }
        Py_DECREF(pairs);
        Py_DECREF(fut);
        continue;
    error:
        /* Nobody may be lost: this future is woken as set_result() would have woken it (its
         * callbacks that have not run are scheduled), the rest of the crowd is handed to a new
         * call of the loop, and the error propagates. */
        if (!marked) {
            unmark(fut, pairs, taken);
        } else {
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            for (Py_ssize_t j = ran; j < PyList_GET_SIZE(pairs); j++) {
                PyObject *p = PyList_GET_ITEM(pairs, j);
                if (call_soon_on(fut, PyTuple_GET_ITEM(p, 0), PyTuple_GET_ITEM(p, 1)) < 0)
                    PyErr_WriteUnraisable(fut); /* the loop is closed */
            }
            PyErr_Restore(type, value, tb);
        }
        hand_on(futures, i + 1, fut);
        Py_XDECREF(pairs);
        Py_DECREF(fut);
        Py_DECREF(futures);
        return NULL;
    }
    Py_DECREF(futures);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ in_park_order() */

/* in_park_order(batches): the sleepers of one or more dicts {sleeper: place}, in the order of
 * their places (each dict is in that order already; one dict is taken as it is). */
typedef struct {
    long long place;
    PyObject *sleeper;
} Placed;

static int by_place(const void *a, const void *b) {
    long long x = ((const Placed *)a)->place, y = ((const Placed *)b)->place;
    return (x > y) - (x < y);
}

PyObject *_acs_in_park_order(PyObject *Py_UNUSED(module), PyObject *batches) {
    if (!PyList_CheckExact(batches)) {
        PyErr_SetString(PyExc_TypeError, "in_park_order() takes a list of dicts");
        return NULL;
    }
    Py_ssize_t nb = PyList_GET_SIZE(batches), n = 0;
    for (Py_ssize_t b = 0; b < nb; b++) {
        PyObject *d = PyList_GET_ITEM(batches, b);
        if (!PyDict_Check(d)) {
            PyErr_SetString(PyExc_TypeError, "in_park_order() takes a list of dicts");
            return NULL;
        }
        n += PyDict_GET_SIZE(d);
    }
    if (nb == 1) return PyDict_Keys(PyList_GET_ITEM(batches, 0));
    /* Each key is held as it is read (which runs no Python): an allocation may run the
     * collector, and so finalizers, which may change the dicts. */
    Placed *all = PyMem_Malloc((n ? n : 1) * sizeof(Placed));
    if (all == NULL) return PyErr_NoMemory();
    PyObject *order = NULL;
    Py_ssize_t k = 0;
    for (Py_ssize_t b = 0; b < nb; b++) {
        PyObject *d = PyList_GET_ITEM(batches, b), *key, *value;
        Py_ssize_t pos = 0;
        while (k < n && PyDict_Next(d, &pos, &key, &value)) {
            if (!PyLong_CheckExact(value)) {
                PyErr_SetString(PyExc_TypeError, "in_park_order(): a place is not an int");
                goto done;
            }
            long long place = PyLong_AsLongLong(value);
            if (place == -1 && PyErr_Occurred()) goto done;
            all[k].place = place;
            all[k].sleeper = Py_NewRef(key);
            k++;
        }
    }
    qsort(all, (size_t)k, sizeof(Placed), by_place);
    order = PyList_New(k);
    if (order != NULL)
        for (Py_ssize_t i = 0; i < k; i++) {
            PyList_SET_ITEM(order, i, all[i].sleeper); /* the reference moves */
            all[i].sleeper = NULL;
        }
done:
    for (Py_ssize_t i = 0; i < k; i++) Py_XDECREF(all[i].sleeper);
    PyMem_Free(all);
    return order;
}

int _acs_crowd_init(PyObject *module) {
    if (acs_intern_names() < 0) return -1;
    if (!(context_kwnames = Py_BuildValue("(s)", "context"))) return -1;
    wake_in_turn_fn = PyObject_GetAttrString(module, "wake_in_turn");
    return wake_in_turn_fn == NULL ? -1 : 0;
}
