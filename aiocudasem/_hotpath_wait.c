/*
 * wait_complete() and settle(), with Tally.
 *
 * Stream.wait_complete() on a stream other than the default ones, as one object that the loop
 * drives directly: no coroutine of Python runs for an await whose work is done by its first
 * query, the common case of short work. It finds the running loop's notifier, passes the
 * loop's checkpoint (asyncio: one bare yield, as asyncio.sleep(0) makes; another loop: its
 * checkpoint coroutine, here delegated to as `yield from` does), then settles: the stream must
 * still be open (its history says), one query, and for an idle stream the history learns how
 * long the wait took and the notifier's tally counts a completed wait. A stream still busy
 * goes on in Python, in the coroutine of stream._wait_busy(notifier, started), delegated to
 * in the same way; an error of the first query goes through stream._query_failed(exc), which
 * raises what the await raises.
 *
 * It is a coroutine as collections.abc.Coroutine defines one (send(), throw(), close(),
 * __await__()), so that asyncio.create_task(), anyio's and trio's task spawning take it. Like
 * a coroutine it is awaited once: a second await raises RuntimeError.
 *
 * It is made for asyncio's bare yield. In a thread whose last wait found a loop with a
 * checkpoint coroutine (trio), wait_complete() returns stream._wait_generic() instead, the
 * same steps as a Python coroutine (see below).
 */
#include "_hotpath.h"

static PyObject *str__closed_error, *str_bare_yield, *str_checkpoint, *str__tally,
    *str__wait_busy, *str__query_failed, *str_throw, *str_close, *str__wait_generic;

/* ------------------------------------------------------------------ the first query */

/* What Stream.wait_complete() does after its first checkpoint, on a stream other than the
 * default ones: the stream must still be open (its history says), then one query; if the
 * stream is idle, its history learns how long the wait took. The Python around it counts the
 * completed wait and handles the query's errors and the busy stream (_stream.py). Python's
 * own attribute reads are faster than the C API's generic ones, so the state read here is in
 * the history's C fields. */

/* stream._closed_error() raised: always -1. */
static int raise_closed(PyObject *stream) {
    PyObject *exc = PyObject_CallMethodNoArgs(stream, str__closed_error);
    if (exc == NULL) return -1;
    if (PyExceptionInstance_Check(exc))
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    else
        PyErr_Format(PyExc_TypeError, "_closed_error() returned %R, not an exception", exc);
    Py_DECREF(exc);
    return -1;
}

/* 1: idle, and learnt; 0: still busy; -1: an exception is set. */
static int settle(PyObject *stream, PyObject *query, PyObject *handle, HistoryObject *history,
                  double started) {
    if (history->closed) return raise_closed(stream); /* by another task, in the checkpoint */
    PyObject *args[1] = {handle};
    PyObject *r = PyObject_Vectorcall(query, args, 1, NULL);
    if (r == NULL) return -1;
    int done = r == Py_True ? 1 : r == Py_False ? 0 : PyObject_IsTrue(r);
    Py_DECREF(r);
    if (done > 0) _acs_learn(history, _acs_perf_counter() - started);
    return done;
}

static int settle_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want,
                       const char *name) {
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s() takes %zd positional arguments, got %zd", name, want,
                     nargs);
        return -1;
    }
    if (!PyCallable_Check(args[1])) {
        PyErr_Format(PyExc_TypeError, "%s(): query must be callable", name);
        return -1;
    }
    if (!Py_IS_TYPE(args[3], &_acs_HistoryType.type)) {
        PyErr_Format(PyExc_TypeError, "%s(): history must be a History, not %.100s", name,
                     Py_TYPE(args[3])->tp_name);
        return -1;
    }
    return 0;
}

/* settle(stream, query, handle, history, started) -> bool, after a checkpoint that the caller
 * passed (any loop). */
PyObject *_acs_settle(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    if (settle_args(args, nargs, 5, "settle") < 0) return NULL;
    double started = PyFloat_AsDouble(args[4]);
    if (started == -1.0 && PyErr_Occurred()) return NULL;
    int done = settle(args[0], args[1], args[2], (HistoryObject *)args[3], started);
    if (done < 0) return NULL;
    return PyBool_FromLong(done);
}

/* ------------------------------------------------------------------ Tally */

typedef struct {
    PyObject_HEAD
    Py_ssize_t completed;
} TallyObject;

static PyMemberDef Tally_members[] = {
    {"completed", T_PYSSIZET, offsetof(TallyObject, completed), 0,
     "Waits that found their work complete."},
    {NULL, 0, 0, 0, NULL},
};

static PyObject *Tally_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, ":Tally", kwlist)) return NULL;
    TallyObject *t = (TallyObject *)type->tp_alloc(type, 0);
    if (t != NULL) t->completed = 0;
    return (PyObject *)t;
}

static PyTypeObject TallyType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aiocudasem._hotpath.Tally",
    .tp_basicsize = sizeof(TallyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Tally()\n--\n\nA notifier's counts that wait_complete() keeps from C.",
    .tp_new = Tally_new,
    .tp_members = Tally_members,
};

/* ------------------------------------------------------------------ WaitComplete */

enum { WAIT_NEW = 0, WAIT_CHECKPOINT = 1, WAIT_BUSY = 2, WAIT_DONE = 3 };

typedef struct {
    AcsAwait head; /* state: WAIT_NEW, ...; executing: inside a call of Python, where a step,
                    * throw() or close() refuses */
    PyObject *stream, *query, *handle, *history, *finder;
    PyObject *notifier; /* found at the first step */
    PyObject *tally;    /* the notifier's */
    PyObject *sub;      /* what the wait delegates to: a loop's checkpoint, or the busy path */
    double started;
} WaitObject;

static AcsType WaitType;

/* wait_complete(stream, query, handle, history, finder) */
PyObject *_acs_wait_complete(PyObject *Py_UNUSED(module), PyObject *const *args,
                             Py_ssize_t nargs) {
    if (settle_args(args, nargs, 5, "wait_complete") < 0) return NULL;
    if (!Py_IS_TYPE(args[4], &_acs_FinderType.type)) {
        PyErr_Format(PyExc_TypeError, "wait_complete(): finder must be a Finder, not %.100s",
                     Py_TYPE(args[4])->tp_name);
        return NULL;
    }
    /* A thread whose last wait ran on a loop with a checkpoint coroutine (trio) gets the Python
     * coroutine: from C, each step of that checkpoint would enter the interpreter anew, which
     * costs more than the Python frame it saves (Python 3.12 runs an await of a coroutine by
     * a coroutine inline). Either one serves any loop: this only picks the faster. */
    FinderObject *f = (FinderObject *)args[4];
    if (f->seen != NULL && !f->seen_bare && f->seen == f->last &&
        f->ident == PyThreadState_GetID(PyThreadState_Get()))
        return PyObject_CallMethodNoArgs(args[0], str__wait_generic);
    WaitObject *c = PyObject_GC_New(WaitObject, &WaitType.type);
    if (c == NULL) return NULL;
    c->stream = Py_NewRef(args[0]);
    c->query = Py_NewRef(args[1]);
    c->handle = Py_NewRef(args[2]);
    c->history = Py_NewRef(args[3]);
    c->finder = Py_NewRef(args[4]);
    c->notifier = c->tally = c->sub = NULL;
    c->started = 0.0;
    c->head.state = WAIT_NEW;
    c->head.executing = 0;
    PyObject_GC_Track(c);
    return (PyObject *)c;
}

static const Py_ssize_t Wait_refs[] = {
    offsetof(WaitObject, stream),   offsetof(WaitObject, query),  offsetof(WaitObject, handle),
    offsetof(WaitObject, history),  offsetof(WaitObject, finder), offsetof(WaitObject, notifier),
    offsetof(WaitObject, tally),    offsetof(WaitObject, sub),    0,
};

/* Dropped without ever being awaited: warned about as a coroutine is. */
static void Wait_finalize(PyObject *self) {
    WaitObject *c = (WaitObject *)self;
    if (c->head.state != WAIT_NEW) return;
    c->head.state = WAIT_DONE;
    PyObject *exc = acs_err_take();
    if (PyErr_WarnEx(PyExc_RuntimeWarning, "coroutine 'Stream.wait_complete' was never awaited",
                     1) < 0)
        PyErr_WriteUnraisable(self);
    acs_err_give(exc);
}

/* The wait is over: nothing is kept. */
static void finish(WaitObject *c) {
    c->head.state = WAIT_DONE;
    acs_clear((PyObject *)c);
}

/* The iterator to delegate to for an awaitable, as `await` finds it. */
static PyObject *awaitable_iter(PyObject *o) {
    if (PyCoro_CheckExact(o)) return Py_NewRef(o);
    PyTypeObject *t = Py_TYPE(o);
    if (t->tp_as_async != NULL && t->tp_as_async->am_await != NULL) {
        PyObject *it = t->tp_as_async->am_await(o);
        if (it != NULL && !PyIter_Check(it)) {
            PyErr_Format(PyExc_TypeError, "__await__() returned non-iterator of type '%.100s'",
                         Py_TYPE(it)->tp_name);
            Py_CLEAR(it);
        }
        return it;
    }
    PyErr_Format(PyExc_TypeError, "object %.100s can't be used in 'await' expression",
                 t->tp_name);
    return NULL;
}

/* Start delegating to the awaitable `aw` (a new reference, or NULL with an error set): its
 * first step. */
static PySendResult delegate(WaitObject *c, PyObject *aw, PyObject **result) {
    if (aw == NULL) {
        *result = NULL;
        return PYGEN_ERROR;
    }
    c->head.executing = 1;
    c->sub = awaitable_iter(aw);
    c->head.executing = 0;
    Py_DECREF(aw);
    if (c->sub == NULL) {
        *result = NULL;
        return PYGEN_ERROR;
    }
    c->head.executing = 1;
    PySendResult s = PyIter_Send(c->sub, Py_None, result);
    c->head.executing = 0;
    return s;
}

/* The notifier's checkpoint kind and tally (a new reference), read once per notifier and
 * remembered in the finder (see FinderObject). They are handed out before the finder lets go
 * of the notifier it remembered: that release can run Python code, even another wait that
 * changes what the finder remembers. */
static int know_notifier(FinderObject *f, PyObject *n, int *is_bare, PyObject **tally) {
    if (n == f->seen) {
        *is_bare = f->seen_bare;
        *tally = Py_NewRef(f->seen_tally);
        return 0;
    }
    PyObject *bare = PyObject_GetAttr(n, str_bare_yield);
    if (bare == NULL) return -1;
    int b = PyObject_IsTrue(bare);
    Py_DECREF(bare);
    if (b < 0) return -1;
    PyObject *t = PyObject_GetAttr(n, str__tally);
    if (t == NULL) return -1;
    if (!Py_IS_TYPE(t, &TallyType)) {
        PyErr_Format(PyExc_TypeError, "a notifier's _tally must be a Tally, not %.100s",
                     Py_TYPE(t)->tp_name);
        Py_DECREF(t);
        return -1;
    }
    *is_bare = b;
    *tally = Py_NewRef(t);
    PyObject *old = f->seen, *old_tally = f->seen_tally;
    f->seen = Py_NewRef(n);
    f->seen_bare = b;
    f->seen_tally = t;
    Py_XDECREF(old);
    Py_XDECREF(old_tally);
    return 0;
}

/* After the checkpoint: the first query, then done, or on to the busy path. */
static PySendResult Wait_query(WaitObject *c, PyObject **result) {
    c->head.executing = 1;
    int done = settle(c->stream, c->query, c->handle, (HistoryObject *)c->history, c->started);
    if (done < 0) {
        PyObject *exc = acs_err_take();
        PyObject *r = PyObject_CallMethodOneArg(c->stream, str__query_failed, exc);
        Py_DECREF(exc);
        if (r != NULL) { /* it always raises */
            Py_DECREF(r);
            PyErr_SetString(PyExc_SystemError, "_query_failed() returned instead of raising");
        }
        c->head.executing = 0;
        finish(c);
        *result = NULL;
        return PYGEN_ERROR;
    }
    c->head.executing = 0;
    if (done) {
        ((TallyObject *)c->tally)->completed++;
        finish(c);
        *result = Py_NewRef(Py_None);
        return PYGEN_RETURN;
    }
    c->head.state = WAIT_BUSY;
    PyObject *started = PyFloat_FromDouble(c->started);
    PyObject *aw = NULL;
    if (started != NULL) {
        c->head.executing = 1;
        aw = PyObject_CallMethodObjArgs(c->stream, str__wait_busy, c->notifier, started, NULL);
        c->head.executing = 0;
        Py_DECREF(started);
    }
    /* The busy path has what it needs: nothing else is kept while it runs. */
    Py_CLEAR(c->query);
    Py_CLEAR(c->handle);
    Py_CLEAR(c->history);
    Py_CLEAR(c->finder);
    Py_CLEAR(c->notifier);
    Py_CLEAR(c->tally);
    Py_CLEAR(c->stream);
    return delegate(c, aw, result);
}

/* The first step: the notifier, then the checkpoint. */
static PySendResult Wait_begin(WaitObject *c, PyObject **result) {
    HistoryObject *history = (HistoryObject *)c->history;
    if (history->closed) { /* settle()'s test, before the checkpoint too */
        raise_closed(c->stream);
        finish(c);
        *result = NULL;
        return PYGEN_ERROR;
    }
    FinderObject *f = (FinderObject *)c->finder;
    int is_bare = 0;
    PyObject *tally = NULL;
    c->head.executing = 1;
    PyObject *n = _acs_find_notifier(c->finder, NULL, 0, NULL);
    int ok = n != NULL && know_notifier(f, n, &is_bare, &tally) == 0;
    c->head.executing = 0;
    if (!ok) {
        Py_XDECREF(n);
        finish(c);
        *result = NULL;
        return PYGEN_ERROR;
    }
    c->notifier = n;
    c->tally = tally;
    c->started = _acs_perf_counter();
    c->head.state = WAIT_CHECKPOINT;
    if (is_bare) {
        *result = Py_NewRef(Py_None);
        return PYGEN_NEXT;
    }
    /* Read each time, not remembered: it is the notifier's to replace. */
    c->head.executing = 1;
    PyObject *aw = PyObject_CallMethodNoArgs(n, str_checkpoint);
    c->head.executing = 0;
    return delegate(c, aw, result);
}

/* After a step of the delegate that did not yield: PYGEN_RETURN with its value ends the
 * checkpoint (on to the query) or the busy path (the await's value); PYGEN_ERROR ends all. */
static PySendResult Wait_after_sub(WaitObject *c, PySendResult s, PyObject **result) {
    if (s == PYGEN_NEXT) return s;
    if (s == PYGEN_RETURN && c->head.state == WAIT_CHECKPOINT) {
        Py_DECREF(*result);
        Py_CLEAR(c->sub);
        return Wait_query(c, result);
    }
    finish(c);
    return s;
}

static PySendResult Wait_step(PyObject *self, PyObject *value, PyObject **result) {
    WaitObject *c = (WaitObject *)self;
    if (acs_refuse_reentry(self) < 0) {
        *result = NULL;
        return PYGEN_ERROR;
    }
    PySendResult s;
    if ((c->head.state == WAIT_NEW || c->head.state == WAIT_CHECKPOINT) ?
            (c->stream == NULL || c->history == NULL) :
            (c->head.state == WAIT_BUSY && c->sub == NULL)) {
        /* cleared by the collector while suspended */
        finish(c);
        PyErr_SetString(PyExc_RuntimeError, "a cleared wait_complete() was resumed");
        *result = NULL;
        return PYGEN_ERROR;
    }
    switch (c->head.state) {
    case WAIT_NEW:
        s = Wait_begin(c, result);
        if (c->head.state == WAIT_CHECKPOINT && c->sub != NULL) s = Wait_after_sub(c, s, result);
        else if (s == PYGEN_ERROR) finish(c);
        break;
    case WAIT_CHECKPOINT:
        if (c->sub == NULL) {
            s = Wait_query(c, result);
        } else {
            c->head.executing = 1;
            s = PyIter_Send(c->sub, value, result);
            c->head.executing = 0;
            s = Wait_after_sub(c, s, result);
        }
        break;
    case WAIT_BUSY:
        c->head.executing = 1;
        s = PyIter_Send(c->sub, value, result);
        c->head.executing = 0;
        if (s != PYGEN_NEXT) finish(c);
        break;
    default:
        PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited wait_complete()");
        *result = NULL;
        return PYGEN_ERROR;
    }
    /* The busy path's first step can end the wait too */
    if (s == PYGEN_NEXT) return s;
    if (c->head.state == WAIT_BUSY) finish(c);
    if (s == PYGEN_ERROR) acs_stop_iteration_to_runtime_error();
    return s;
}

/* close(), past the reentry check: what the wait delegates to is closed too. */
static int Wait_end(PyObject *self) {
    WaitObject *c = (WaitObject *)self;
    PyObject *sub = c->sub;
    c->sub = NULL;
    finish(c);
    if (sub != NULL) {
        c->head.executing = 1;
        PyObject *r = PyObject_CallMethodNoArgs(sub, str_close);
        c->head.executing = 0;
        Py_DECREF(sub);
        if (r == NULL) return -1;
        Py_DECREF(r);
    }
    return 0;
}

/* throw(exc) or throw(type[, value[, traceback]]): thrown into what the wait delegates to (the
 * loop's checkpoint, or the busy path), where there is one; else the wait ends with it. */
static PyObject *Wait_thrown(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    WaitObject *c = (WaitObject *)self;
    if (c->head.state == WAIT_DONE) {
        PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited wait_complete()");
        return NULL;
    }
    if (c->sub == NULL) { /* not started, or at the bare yield: raised here */
        finish(c);
        acs_raise_thrown(args, nargs);
        acs_stop_iteration_to_runtime_error();
        return NULL;
    }
    if (PyExceptionClass_Check(args[0]) ?
            PyErr_GivenExceptionMatches(args[0], PyExc_GeneratorExit) :
            PyObject_TypeCheck(args[0], (PyTypeObject *)PyExc_GeneratorExit)) {
        /* as `yield from` has it: the delegate is closed, then it is raised here */
        if (Wait_end(self) < 0) return NULL;
        return acs_raise_thrown(args, nargs);
    }
    PyObject *meth = PyObject_GetAttr(c->sub, str_throw);
    if (meth == NULL) { /* no throw(): closed, then raised here, as `yield from` does */
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            finish(c);
            return NULL;
        }
        PyErr_Clear();
        c->head.executing = 1;
        PyObject *r = PyObject_CallMethodNoArgs(c->sub, str_close);
        c->head.executing = 0;
        finish(c);
        if (r == NULL) return NULL;
        Py_DECREF(r);
        return acs_raise_thrown(args, nargs);
    }
    c->head.executing = 1;
    PyObject *r = PyObject_Vectorcall(meth, args, nargs, NULL);
    c->head.executing = 0;
    Py_DECREF(meth);
    if (r != NULL) return r; /* the delegate yielded */
    PyObject *value = acs_stop_value();
    if (value == NULL) { /* the delegate raised */
        finish(c);
        return NULL;
    }
    PySendResult s = Wait_after_sub(c, PYGEN_RETURN, &value);
    if (s != PYGEN_NEXT && c->head.state != WAIT_DONE) finish(c); /* the busy path ended at once */
    return acs_await_ended(self, s, value, 1);
}

static const AcsAwaitHooks Wait_hooks = {
    .name = "wait_complete()",
    .strict_send = 1,
    .end = Wait_end,
    .thrown = Wait_thrown,
};

static PyMethodDef Wait_methods[] = {
    {"send", acs_await_send, METH_O,
     "send(value): the next step; the value goes to what the wait delegates to."},
    {"throw", (PyCFunction)(void (*)(void))acs_await_throw, METH_FASTCALL,
     "throw(exc): raise exc where the wait is suspended."},
    {"close", acs_await_close, METH_NOARGS, "close(): end the wait now."},
    {NULL, NULL, 0, NULL},
};

/* __await__(): awaited while another await of it is suspended, it refuses, as a coroutine
 * does (a finished one is refused at its next step). */
static PyObject *Wait_await(WaitObject *c) {
    if (c->head.state == WAIT_CHECKPOINT || c->head.state == WAIT_BUSY) {
        PyErr_SetString(PyExc_RuntimeError, "wait_complete() is being awaited already");
        return NULL;
    }
    return Py_NewRef(c);
}

static PyObject *Wait_get_name(WaitObject *Py_UNUSED(c), void *Py_UNUSED(closure)) {
    return PyUnicode_FromString("wait_complete");
}

static PyObject *Wait_get_qualname(WaitObject *Py_UNUSED(c), void *Py_UNUSED(closure)) {
    return PyUnicode_FromString("Stream.wait_complete");
}

static PyGetSetDef Wait_getset[] = {
    {"__name__", (getter)Wait_get_name, NULL, "The coroutine's name, as a coroutine has it.", NULL},
    {"__qualname__", (getter)Wait_get_qualname, NULL, "Its qualified name.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyAsyncMethods Wait_async = {
    .am_await = (unaryfunc)Wait_await,
    .am_send = Wait_step,
};

static AcsType WaitType = {
    .type = {
        PyVarObject_HEAD_INIT(NULL, 0)
        .tp_name = "aiocudasem._hotpath.WaitComplete",
        .tp_basicsize = sizeof(WaitObject),
        .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
        .tp_doc = "The coroutine of Stream.wait_complete() (see wait_complete()).",
        .tp_as_async = &Wait_async,
        .tp_iter = acs_return_self,
        .tp_iternext = acs_await_next,
        .tp_methods = Wait_methods,
        .tp_getset = Wait_getset,
        .tp_traverse = acs_traverse,
        .tp_clear = acs_clear,
        .tp_dealloc = acs_dealloc,
        .tp_finalize = Wait_finalize,
    },
    .refs = Wait_refs,
    .await = &Wait_hooks,
};

int _acs_wait_init(PyObject *module) {
    const AcsName names[] = {
        {&str__closed_error, "_closed_error"},
        {&str_bare_yield, "bare_yield"},
        {&str_checkpoint, "checkpoint"},
        {&str__tally, "_tally"},
        {&str__wait_busy, "_wait_busy"},
        {&str__query_failed, "_query_failed"},
        {&str_throw, "throw"},
        {&str_close, "close"},
        {&str__wait_generic, "_wait_generic"},
        {NULL, NULL},
    };
    if (_acs_intern(names) < 0 || _acs_add_type(module, "Tally", &TallyType) < 0) return -1;
    return _acs_add_type(module, NULL, &WaitType.type);
}
