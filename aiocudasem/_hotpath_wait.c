/*
 * wait_complete(state): the wait algorithm of Stream.wait_complete(), stated once.
 *
 * One wait is a WaitObject that goes through its states by one function, wait_step(): each call
 * does what the algorithm decides next and says what the loop must do before the next call:
 * nothing (the wait is over), a checkpoint, or an awaitable to await. The steps:
 *
 *   begin       the stream must be open (its history says); find the running loop's notifier;
 *               a default stream records its event now; read the clock; a checkpoint.
 *   first query the stream must still be open; query the stream (a default stream: its
 *               event); idle: the history learns how long the wait took, the notifier's
 *               counters count a completed wait, and it is over. An error of the query goes
 *               through hooks.query_failed(state, exc), which raises what the await raises.
 *   busy        a parked point of the stream that the wait may share (notifier.shared_point())
 *               is awaited (notifier.wait(point)); else a pooled event is recorded now, and if
 *               the notifier lets one more wait spin (notifier.may_spin()) and the history
 *               gives a spin window, the wait spins: it queries the event between
 *               checkpoints, and on asyncio again without yielding while the loop has nothing
 *               else ready (see _hotpath_spin.c), until the event is done (learnt, given back,
 *               counted) or the window has passed; then it parks on the event
 *               (notifier.wait_recorded(...)), which counts the wait itself.
 *
 * Two drivers run these steps. On asyncio, the WaitObject is itself the coroutine: a checkpoint
 * is one bare yield, as asyncio.sleep(0) makes, and an awaitable is delegated to as `yield
 * from` does; an await whose work is done by its first query runs no Python at all. On a loop
 * whose checkpoint is a coroutine (trio), that checkpoint is cheaper awaited from Python, where
 * it runs inline, than delegated to from C, where each of its steps enters the interpreter
 * anew: there hooks.drive(wait) is a thin Python coroutine that calls wait.step() and awaits
 * what it returns until it returns None. Both call wait_step(), so the decisions live here
 * only. The C coroutine serves any loop (it delegates to notifier.checkpoint() where the
 * checkpoint is not a bare yield); wait_complete() picks the Python driver in a thread whose
 * last wait ran on such a loop, as the faster.
 *
 * The coroutine is one as collections.abc.Coroutine defines one (send(), throw(), close(),
 * __await__()), so that asyncio.create_task(), anyio's and trio's task spawning take it; like
 * a coroutine it is awaited once.
 */
#include "_hotpath.h"

#define NAMES(X)                                                                                \
    X(bare_yield) X(counters) X(checkpoint) X(closed_error) X(query_failed) X(drive)            \
    X(shared_point) X(wait) X(wait_recorded) X(may_spin) X(ready_queue) X(throw) X(close)
ACS_NAMES(NAMES)

#define CALL_METHOD(name, args, n)                                                              \
    PyObject_VectorcallMethod((name), (args), (n) | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL)

enum { WAIT_NEW = 0, WAIT_CHECKPOINT, WAIT_SPIN, WAIT_PARK, WAIT_DONE };

/* What wait_step() asks of its driver. */
typedef enum { STEP_DONE, STEP_YIELD, STEP_AWAIT, STEP_ERROR } Step;

typedef struct {
    AcsAwait head; /* state: WAIT_NEW, ...; executing: inside a call of Python, where a step,
                    * throw() or close() refuses */
    WaitStateObject *state;
    PyObject *notifier, *counters; /* found at the first step */
    PyObject *sub;   /* the coroutine's delegate: a loop's checkpoint, or the park */
    PyObject *event; /* the pooled event that the wait holds, or NULL */
    PyObject *ready; /* while spinning: the loop's queue of ready callbacks (or None) */
    int bare;        /* the checkpoint is a bare yield */
    int driven;      /* run by hooks.drive() through step(): a checkpoint is always awaited */
    int spinning;    /* counted in counters.spinning */
    double started, recorded, deadline;
} WaitObject;

static AcsType WaitType;

static const Py_ssize_t Wait_refs[] = {
    offsetof(WaitObject, state), offsetof(WaitObject, notifier), offsetof(WaitObject, counters),
    offsetof(WaitObject, sub),   offsetof(WaitObject, event),    offsetof(WaitObject, ready),
    0,
};

/* ------------------------------------------------------------------ ways out */

/* The wait no longer spins. */
static void stop_spinning(WaitObject *c) {
    if (!c->spinning) return;
    c->spinning = 0;
    ((CountersObject *)c->counters)->spinning--;
    Py_CLEAR(c->ready);
}

/* The wait is over: nothing is kept. */
static void finish(WaitObject *c) {
    c->head.state = WAIT_DONE;
    acs_clear((PyObject *)c);
}

/* The wait ends otherwise than done (an error, throw(), close(), the finalizer): it stops
 * spinning, and its event goes back to the pool (with no call of the driver). */
static void fail(WaitObject *c) {
    stop_spinning(c);
    PyObject *event = c->event;
    c->event = NULL;
    if (event != NULL && c->state != NULL) _acs_put_back(c->state->pool, event);
    else Py_XDECREF(event);
    finish(c);
}

/* hooks.closed_error() raised: always -1. */
static int raise_closed(WaitStateObject *s) {
    PyObject *args[1] = {s->hooks};
    PyObject *exc = CALL_METHOD(str.closed_error, args, 1);
    if (exc == NULL) return -1;
    if (PyExceptionInstance_Check(exc))
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    else
        PyErr_Format(PyExc_TypeError, "closed_error() returned %R, not an exception", exc);
    Py_DECREF(exc);
    return -1;
}

/* The first query raised: hooks.query_failed(state, exc) raises what the await raises. */
static Step query_failed(WaitObject *c) {
    PyObject *exc = acs_err_take();
    PyObject *args[3] = {c->state->hooks, (PyObject *)c->state, exc};
    c->head.executing = 1;
    PyObject *r = CALL_METHOD(str.query_failed, args, 3);
    c->head.executing = 0;
    Py_DECREF(exc);
    if (r != NULL) { /* it always raises */
        Py_DECREF(r);
        PyErr_SetString(PyExc_SystemError, "query_failed() returned instead of raising");
    }
    return STEP_ERROR;
}

/* ------------------------------------------------------------------ the steps */

/* A checkpoint: a bare yield, or notifier.checkpoint() to await. */
static Step checkpoint(WaitObject *c, PyObject **out) {
    if (c->bare && !c->driven) return STEP_YIELD;
    PyObject *args[1] = {c->notifier};
    c->head.executing = 1;
    *out = CALL_METHOD(str.checkpoint, args, 1);
    c->head.executing = 0;
    return *out != NULL ? STEP_AWAIT : STEP_ERROR;
}

/* The event is done at `now`: learnt, given back, counted. */
static Step event_done(WaitObject *c, double now) {
    stop_spinning(c);
    _acs_learn((HistoryObject *)c->state->history, now - c->started);
    PyObject *event = c->event;
    c->event = NULL;
    c->head.executing = 1;
    int rc = _acs_give_event_back(c->state, event);
    c->head.executing = 0;
    if (rc < 0) return STEP_ERROR;
    ((CountersObject *)c->counters)->completed++;
    return STEP_DONE;
}

/* Park on the event: notifier.wait_recorded(driver, device, handle, event, pool, history,
 * started, recorded), which is the event's from then on, to await. */
static Step park(WaitObject *c, PyObject **out) {
    stop_spinning(c);
    WaitStateObject *s = c->state;
    PyObject *started = PyFloat_FromDouble(c->started);
    PyObject *recorded = PyFloat_FromDouble(c->recorded);
    *out = NULL;
    if (started != NULL && recorded != NULL) {
        PyObject *args[9] = {c->notifier, s->driver, s->device, s->handle, c->event,
                             s->pool,     s->history, started,  recorded};
        c->head.executing = 1;
        *out = CALL_METHOD(str.wait_recorded, args, 9);
        c->head.executing = 0;
    }
    Py_XDECREF(started);
    Py_XDECREF(recorded);
    if (*out == NULL) return STEP_ERROR;
    Py_CLEAR(c->event);
    c->head.state = WAIT_PARK;
    return STEP_AWAIT;
}

/* Query the event, again without yielding while the loop is idle (for up to IDLE_SPIN). */
static Step spin(WaitObject *c, PyObject **out) {
    double step = _acs_perf_counter();
    for (;;) {
        c->head.executing = 1;
        int done = _acs_query(c->state, c->event);
        c->head.executing = 0;
        if (done < 0) return STEP_ERROR;
        double now = _acs_perf_counter();
        if (done) return event_done(c, now);
        if (now >= c->deadline) return park(c, out);
        if (now - step >= IDLE_SPIN || !_acs_loop_idle(c->ready)) break;
    }
    return checkpoint(c, out);
}

/* The first query found the stream (or a default stream's event) busy. */
static Step busy(WaitObject *c, PyObject **out) {
    WaitStateObject *s = c->state;
    HistoryObject *h = (HistoryObject *)s->history;
    if (c->event == NULL) {
        if (h->newest != Py_None) {
            PyObject *started = PyFloat_FromDouble(c->started);
            if (started == NULL) return STEP_ERROR;
            PyObject *args[3] = {c->notifier, s->history, started};
            c->head.executing = 1;
            PyObject *point = CALL_METHOD(str.shared_point, args, 3);
            c->head.executing = 0;
            Py_DECREF(started);
            if (point == NULL) return STEP_ERROR;
            if (point != Py_None) {
                PyObject *wargs[2] = {c->notifier, point};
                c->head.executing = 1;
                *out = CALL_METHOD(str.wait, wargs, 2);
                c->head.executing = 0;
                Py_DECREF(point);
                if (*out == NULL) return STEP_ERROR;
                c->head.state = WAIT_PARK;
                return STEP_AWAIT;
            }
            Py_DECREF(point);
        }
        c->head.executing = 1;
        c->event = _acs_take_recorded(s);
        c->head.executing = 0;
        if (c->event == NULL) return STEP_ERROR;
        c->recorded = _acs_perf_counter(); /* nothing ran since: see shared_point() */
    }
    PyObject *args[1] = {c->notifier};
    c->head.executing = 1;
    PyObject *r = CALL_METHOD(str.may_spin, args, 1);
    int may = r == NULL ? -1 : PyObject_IsTrue(r);
    Py_XDECREF(r);
    c->head.executing = 0;
    if (may < 0) return STEP_ERROR;
    double window = may ? _acs_spin_window(h) : 0.0;
    if (!(window > 0.0)) return park(c, out);
    c->head.executing = 1;
    c->ready = PyObject_GetAttr(c->notifier, str.ready_queue);
    c->head.executing = 0;
    if (c->ready == NULL) return STEP_ERROR;
    c->deadline = c->started + window;
    c->spinning = 1;
    ((CountersObject *)c->counters)->spinning++;
    c->head.state = WAIT_SPIN;
    if (_acs_loop_idle(c->ready)) return spin(c, out);
    return checkpoint(c, out);
}

/* After the first checkpoint. */
static Step first_query(WaitObject *c, PyObject **out) {
    WaitStateObject *s = c->state;
    HistoryObject *h = (HistoryObject *)s->history;
    c->head.executing = 1;
    int done;
    if (c->event != NULL) { /* a default stream: its event's errors are raised as they are */
        done = _acs_query(s, c->event);
        c->head.executing = 0;
        if (done < 0) return STEP_ERROR;
        if (done) return event_done(c, _acs_perf_counter());
        return busy(c, out);
    }
    /* closed meanwhile, by another task, in the checkpoint: raised as a query's error */
    done = h->closed ? raise_closed(s) : _acs_query(s, NULL);
    c->head.executing = 0;
    if (done < 0) return query_failed(c);
    if (done) {
        _acs_learn(h, _acs_perf_counter() - c->started);
        ((CountersObject *)c->counters)->completed++;
        return STEP_DONE;
    }
    return busy(c, out);
}

/* The notifier's checkpoint kind and counters (a new reference), read once per notifier and
 * remembered in the finder (see FinderObject). They are handed out before the finder lets go
 * of the notifier it remembered: that release can run Python code, even another wait that
 * changes what the finder remembers. */
static int know_notifier(FinderObject *f, PyObject *n, int *is_bare, PyObject **counters) {
    if (n == f->seen) {
        *is_bare = f->seen_bare;
        *counters = Py_NewRef(f->seen_counters);
        return 0;
    }
    PyObject *bare = PyObject_GetAttr(n, str.bare_yield);
    if (bare == NULL) return -1;
    int b = PyObject_IsTrue(bare);
    Py_DECREF(bare);
    if (b < 0) return -1;
    PyObject *t = PyObject_GetAttr(n, str.counters);
    if (t == NULL) return -1;
    if (!Py_IS_TYPE(t, &_acs_CountersType.type)) {
        PyErr_Format(PyExc_TypeError, "a notifier's counters must be Counters, not %.100s",
                     Py_TYPE(t)->tp_name);
        Py_DECREF(t);
        return -1;
    }
    *is_bare = b;
    *counters = Py_NewRef(t);
    PyObject *old = f->seen, *old_counters = f->seen_counters;
    f->seen = Py_NewRef(n);
    f->seen_bare = b;
    f->seen_counters = t;
    Py_XDECREF(old);
    Py_XDECREF(old_counters);
    return 0;
}

/* The first step. */
static Step begin(WaitObject *c, PyObject **out) {
    WaitStateObject *s = c->state;
    if (((HistoryObject *)s->history)->closed) return raise_closed(s), STEP_ERROR;
    FinderObject *f = (FinderObject *)s->finder;
    int bare = 0;
    PyObject *counters = NULL;
    c->head.executing = 1;
    PyObject *n = _acs_find_notifier((PyObject *)f, NULL, 0, NULL);
    int ok = n != NULL && know_notifier(f, n, &bare, &counters) == 0;
    c->head.executing = 0;
    if (!ok) {
        Py_XDECREF(n);
        return STEP_ERROR;
    }
    c->notifier = n;
    c->counters = counters;
    c->bare = bare;
    if (s->record_first) {
        c->head.executing = 1;
        c->event = _acs_take_recorded(s);
        c->head.executing = 0;
        if (c->event == NULL) return STEP_ERROR;
        c->recorded = _acs_perf_counter();
    }
    c->started = _acs_perf_counter();
    c->head.state = WAIT_CHECKPOINT;
    return checkpoint(c, out);
}

/* What the algorithm does next (see the top of the file). */
static Step wait_step(WaitObject *c, PyObject **out) {
    switch (c->head.state) {
    case WAIT_NEW:
        return begin(c, out);
    case WAIT_CHECKPOINT:
        return first_query(c, out);
    case WAIT_SPIN:
        return spin(c, out);
    default: /* WAIT_PARK: the park counted the wait */
        return STEP_DONE;
    }
}

/* 0, or -1 with an error set if the wait cannot take a step now. */
static int may_step(WaitObject *c) {
    if (acs_refuse_reentry((PyObject *)c) < 0) return -1;
    if (c->head.state == WAIT_DONE) {
        PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited wait_complete()");
        return -1;
    }
    if (c->state == NULL) { /* cleared by the collector while suspended */
        finish(c);
        PyErr_SetString(PyExc_RuntimeError, "a cleared wait_complete() was resumed");
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ the coroutine */

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

/* One send() into the delegate. */
static PySendResult send_sub(WaitObject *c, PyObject *value, PyObject **result) {
    c->head.executing = 1;
    PySendResult s = PyIter_Send(c->sub, value, result);
    c->head.executing = 0;
    if (s != PYGEN_NEXT) Py_CLEAR(c->sub);
    if (s == PYGEN_RETURN) Py_DECREF(*result);
    return s;
}

/* The steps, from where the wait is, to the next yield or the end. */
static PySendResult run(WaitObject *c, PyObject **result) {
    for (;;) {
        PyObject *out = NULL;
        switch (wait_step(c, &out)) {
        case STEP_DONE:
            finish(c);
            *result = Py_NewRef(Py_None);
            return PYGEN_RETURN;
        case STEP_YIELD:
            *result = Py_NewRef(Py_None);
            return PYGEN_NEXT;
        case STEP_ERROR:
            break;
        case STEP_AWAIT:
            c->head.executing = 1;
            c->sub = awaitable_iter(out);
            c->head.executing = 0;
            Py_DECREF(out);
            if (c->sub == NULL) break;
            PySendResult s = send_sub(c, Py_None, result);
            if (s == PYGEN_NEXT) return s;
            if (s == PYGEN_RETURN) continue;
            break;
        }
        fail(c);
        *result = NULL;
        return PYGEN_ERROR;
    }
}

static PySendResult Wait_send(PyObject *self, PyObject *value, PyObject **result) {
    WaitObject *c = (WaitObject *)self;
    if (may_step(c) < 0) {
        *result = NULL;
        return PYGEN_ERROR;
    }
    PySendResult s;
    if (c->sub != NULL) {
        s = send_sub(c, value, result);
        if (s == PYGEN_NEXT) return s;
        if (s == PYGEN_ERROR) {
            fail(c);
            acs_stop_iteration_to_runtime_error();
            return s;
        }
    }
    s = run(c, result);
    if (s == PYGEN_ERROR) acs_stop_iteration_to_runtime_error();
    return s;
}

/* close(), past the reentry check: what the wait delegates to is closed too. */
static int Wait_end(PyObject *self) {
    WaitObject *c = (WaitObject *)self;
    PyObject *sub = c->sub;
    c->sub = NULL;
    fail(c);
    if (sub != NULL) {
        c->head.executing = 1;
        PyObject *r = PyObject_CallMethodNoArgs(sub, str.close);
        c->head.executing = 0;
        Py_DECREF(sub);
        if (r == NULL) return -1;
        Py_DECREF(r);
    }
    return 0;
}

/* throw(exc) or throw(type[, value[, traceback]]): thrown into what the wait delegates to (the
 * loop's checkpoint, or the park), where there is one; else the wait ends with it. */
static PyObject *Wait_thrown(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    WaitObject *c = (WaitObject *)self;
    if (c->head.state == WAIT_DONE) {
        PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited wait_complete()");
        return NULL;
    }
    if (c->sub == NULL) { /* not started, or at a bare yield: raised here */
        fail(c);
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
    PyObject *meth = PyObject_GetAttr(c->sub, str.throw);
    if (meth == NULL) { /* no throw(): closed, then raised here, as `yield from` does */
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            fail(c);
            return NULL;
        }
        PyErr_Clear();
        if (Wait_end(self) < 0) return NULL;
        return acs_raise_thrown(args, nargs);
    }
    c->head.executing = 1;
    PyObject *r = PyObject_Vectorcall(meth, args, nargs, NULL);
    c->head.executing = 0;
    Py_DECREF(meth);
    if (r != NULL) return r; /* the delegate yielded */
    PyObject *value = acs_stop_value();
    Py_CLEAR(c->sub);
    if (value == NULL) { /* the delegate raised */
        fail(c);
        return NULL;
    }
    Py_DECREF(value);
    PySendResult s = run(c, &value);
    return acs_await_ended(self, s, value, 1);
}

/* Dropped without ever being awaited: warned about as a coroutine is (the Python driver's
 * coroutine warns for its own). Dropped half-way: it stops spinning, its event goes back. */
static void Wait_finalize(PyObject *self) {
    WaitObject *c = (WaitObject *)self;
    if (c->head.state == WAIT_DONE) return;
    PyObject *exc = acs_err_take();
    int warn = c->head.state == WAIT_NEW && !c->driven;
    fail(c);
    if (warn && PyErr_WarnEx(PyExc_RuntimeWarning,
                             "coroutine 'Stream.wait_complete' was never awaited", 1) < 0)
        PyErr_WriteUnraisable(self);
    acs_err_give(exc);
}

/* step() -> awaitable | None: the Python driver's step (see the top of the file). */
static PyObject *Wait_step_method(PyObject *self, PyObject *Py_UNUSED(ignored)) {
    WaitObject *c = (WaitObject *)self;
    if (may_step(c) < 0) return NULL;
    c->driven = 1;
    PyObject *out = NULL;
    switch (wait_step(c, &out)) {
    case STEP_DONE:
        finish(c);
        Py_RETURN_NONE;
    case STEP_AWAIT:
        return out;
    default: /* STEP_ERROR: a driven wait never yields bare */
        fail(c);
        acs_stop_iteration_to_runtime_error();
        return NULL;
    }
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
    {"step", Wait_step_method, METH_NOARGS,
     "step() -> Awaitable | None: for a driver in Python, the wait's next step: an awaitable "
     "to await before the next call, or None once the wait is over. close() on any error."},
    {NULL, NULL, 0, NULL},
};

/* __await__(): awaited while another await of it is suspended, it refuses, as a coroutine
 * does (a finished one is refused at its next step). */
static PyObject *Wait_await(WaitObject *c) {
    if (c->head.state != WAIT_NEW && c->head.state != WAIT_DONE) {
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
    .am_send = Wait_send,
};

static AcsType WaitType = {
    .type = {
        ACS_TYPE_HEAD("_hotpath.WaitComplete", WaitObject, Py_TPFLAGS_HAVE_GC),
        .tp_doc = "The coroutine of Stream.wait_complete() (see wait_complete()).",
        .tp_as_async = &Wait_async,
        .tp_iter = acs_return_self,
        .tp_iternext = acs_await_next,
        .tp_methods = Wait_methods,
        .tp_getset = Wait_getset,
        ACS_GC_SLOTS,
        .tp_finalize = Wait_finalize,
    },
    .refs = Wait_refs,
    .await = &Wait_hooks,
};

/* wait_complete(state) */
PyObject *_acs_wait_complete(PyObject *Py_UNUSED(module), PyObject *state) {
    if (!Py_IS_TYPE(state, &_acs_WaitStateType.type)) {
        PyErr_Format(PyExc_TypeError, "wait_complete(): expected a WaitState, not %.100s",
                     Py_TYPE(state)->tp_name);
        return NULL;
    }
    WaitStateObject *s = (WaitStateObject *)state;
    /* A thread whose last wait ran on a loop with a checkpoint coroutine (trio) gets the Python
     * driver (see the top of the file): either serves any loop, this only picks the faster. */
    FinderObject *f = (FinderObject *)s->finder;
    int driven = f->seen != NULL && !f->seen_bare && f->seen == f->last &&
                 f->ident == PyThreadState_GetID(PyThreadState_Get());
    WaitObject *c = PyObject_GC_New(WaitObject, &WaitType.type);
    if (c == NULL) return NULL;
    c->state = (WaitStateObject *)Py_NewRef(state);
    c->notifier = c->counters = c->sub = c->event = c->ready = NULL;
    c->bare = c->spinning = 0;
    c->driven = driven;
    c->started = c->recorded = c->deadline = 0.0;
    c->head.state = WAIT_NEW;
    c->head.executing = 0;
    PyObject_GC_Track(c);
    if (!driven) return (PyObject *)c;
    PyObject *args[2] = {s->hooks, (PyObject *)c};
    PyObject *co = CALL_METHOD(str.drive, args, 2);
    Py_DECREF(c);
    return co;
}

int _acs_wait_init(PyObject *module) {
    if (acs_intern_names() < 0) return -1;
    return acs_add_type(module, "WaitComplete", &WaitType.type);
}
