/*
 * The steps of every await that are not the loop's or the driver's: finding the running loop's
 * notifier, updating the stream's wait history, and, on asyncio, the first checkpoint and query
 * of Stream.wait_complete() with its bookkeeping. In Python they cost more than the rest of an
 * await of finished work put together (see docs/architecture.md, "The hot path in C"); here
 * they are a few field reads, one call of the loop's own lookup and one of the driver's query.
 * And, on asyncio, the one callback of the loop that wakes a finished crowd of parked tasks
 * (see "Waking a crowd" there).
 *
 * Nothing here blocks; the only driver call is the query that Python hands over. Every object
 * is an ordinary Python object: the logic is the one the Python modules describe
 * (_notifier/_loop.py, _notifier/_points.py, _stream.py), moved, not changed.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>

static PyObject *str_name, *str___dict__, *str_runner, *str_notifier, *str_serves, *str_asyncio, *str_trio;

/* ------------------------------------------------------------------ LoopCheck */

/* Is the running loop still the one of `token`? At least as strict as sniffio's detection, as
 * _loop._running_check() explains:
 *   asyncio: sniffio's thread-local name is unset, its context variable names asyncio or
 *            nothing, and asyncio's running loop is the token;
 *   trio:    sniffio's thread-local name is "trio" and trio's current token is the token
 *            (outside trio.run it raises RuntimeError: not the loop).
 * Without sniffio, `local` and `cvar` are None and only the probe decides. */

enum { KIND_ASYNCIO = 0, KIND_TRIO = 1 };

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int kind;
    PyObject *token;
    PyObject *probe; /* asyncio._get_running_loop or trio.lowlevel.current_trio_token */
    PyObject *local; /* sniffio.thread_local, or None */
    PyObject *cvar;  /* sniffio.current_async_library_cvar, or None */
    /* local.name without the thread-local lookup (about 0.15 us of an await): the dict that
     * holds `local`'s attributes in one thread, which stays the same for the thread's life,
     * and the thread state it belongs to, by its id (never reused, unlike a thread ident).
     * A name that the dict lacks is the class's: `default_name`. `generic` (a local that is not a
     * plain threading.local, or a class attribute that is a descriptor): read the name the
     * generic way every time. */
    PyObject *ldict;
    uint64_t tsid;
    PyObject *default_name;
    unsigned int default_tag;
    int generic;
    /* trio, where its run context is known (_loop._trio_run_context()): the thread-local that
     * holds the running trio run's Runner, and this run's. The probe is then a read of that
     * local's dict in this thread (cached as above), not a call of current_trio_token(), whose
     * token belongs to exactly one Runner. NULL: call the probe. */
    PyObject *context;
    PyObject *runner;
    PyObject *cdict;
    uint64_t ctsid;
} LoopCheckObject;

static PyTypeObject LoopCheckType;

static int is_str(PyObject *v, PyObject *s) {
    return PyUnicode_Check(v) && PyUnicode_Compare(v, s) == 0;
}

static PyTypeObject *thread_local_type; /* _thread._local */

/* The dict of a threading.local's attributes in this thread, remembered in *cache with the
 * thread state's id: borrowed, or NULL with an exception set, or NULL without one if the
 * local's __dict__ is not a plain dict. */
static PyObject *thread_dict(PyObject *local, PyObject **cache, uint64_t *tsid) {
    uint64_t id = PyThreadState_GetID(PyThreadState_Get());
    if (*cache == NULL || *tsid != id) {
        PyObject *d = PyObject_GetAttr(local, str___dict__);
        if (d == NULL) return NULL;
        if (!PyDict_CheckExact(d)) {
            Py_DECREF(d);
            return NULL;
        }
        /* The cache is set before the old dict goes: its release can run Python code that
         * calls this check from another thread, which must not find this thread's id on a
         * dict that is not its own. `d` lives on with this thread, whatever the cache holds. */
        PyObject *old = *cache;
        *cache = d;
        *tsid = id;
        Py_XDECREF(old);
        return d;
    }
    return *cache;
}

/* The `name` of the local's class, what a thread that never set one reads: borrowed. It is read
 * again whenever the class changes (its version tag). NULL without an exception: the class
 * has none, or a descriptor supplies it; the caller then reads the name the generic way. */
static PyObject *class_name(LoopCheckObject *c) {
    PyTypeObject *t = Py_TYPE(c->local);
    if (c->default_name != NULL && t->tp_version_tag != 0 && t->tp_version_tag == c->default_tag)
        return c->default_name;
    PyObject *d = PyObject_GetAttr((PyObject *)t, str_name);
    if (d == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return NULL;
        PyErr_Clear();
        return NULL;
    }
    if (Py_TYPE(d)->tp_descr_get != NULL || Py_TYPE(d)->tp_descr_set != NULL) {
        Py_DECREF(d);
        return NULL;
    }
    PyObject *old = c->default_name;
    c->default_name = d;
    c->default_tag = t->tp_version_tag; /* assigned by the lookup above, where it can be */
    Py_XDECREF(old);
    return d;
}

/* local.name for this thread, as getattr() reads it: a new reference, or NULL. */
static PyObject *local_name(LoopCheckObject *c) {
    if (c->generic) return PyObject_GetAttr(c->local, str_name);
    PyObject *d = thread_dict(c->local, &c->ldict, &c->tsid);
    if (d == NULL) {
        if (PyErr_Occurred()) return NULL;
        c->generic = 1;
        return PyObject_GetAttr(c->local, str_name);
    }
    PyObject *v = PyDict_GetItemWithError(d, str_name); /* borrowed */
    if (v == NULL) {
        if (PyErr_Occurred()) return NULL;
        v = class_name(c);
        if (v == NULL) {
            if (PyErr_Occurred()) return NULL;
            c->generic = 1;
            return PyObject_GetAttr(c->local, str_name);
        }
    }
    return Py_NewRef(v);
}

/* 1: it is the token's loop; 0: it is not; -1: an exception is set. */
static int loop_check(LoopCheckObject *c) {
    if (c->local != Py_None) {
        PyObject *name = local_name(c);
        if (name == NULL) return -1;
        int ok = c->kind == KIND_ASYNCIO ? name == Py_None : is_str(name, str_trio);
        Py_DECREF(name);
        if (!ok) return 0;
    }
    if (c->kind == KIND_ASYNCIO && c->cvar != Py_None) {
        PyObject *v = NULL;
        if (PyContextVar_Get(c->cvar, NULL, &v) < 0) return -1;
        if (v == NULL) { /* no value and no default: what cvar.get() raises */
            PyErr_SetObject(PyExc_LookupError, c->cvar);
            return -1;
        }
        int ok = v == Py_None || is_str(v, str_asyncio);
        Py_XDECREF(v);
        if (!ok) return 0;
    }
    if (c->runner != NULL) {
        PyObject *d = thread_dict(c->context, &c->cdict, &c->ctsid);
        if (d != NULL) {
            PyObject *runner = PyDict_GetItemWithError(d, str_runner); /* borrowed */
            if (runner == NULL && PyErr_Occurred()) return -1;
            return runner == c->runner; /* none: not inside trio.run, as the probe says */
        }
        if (PyErr_Occurred()) return -1;
        Py_CLEAR(c->runner); /* not a plain thread-local after all: the probe from now on */
    }
    PyObject *r = PyObject_CallNoArgs(c->probe);
    if (r == NULL) {
        if (c->kind == KIND_TRIO && PyErr_ExceptionMatches(PyExc_RuntimeError)) {
            PyErr_Clear(); /* not inside trio.run */
            return 0;
        }
        return -1;
    }
    int same = r == c->token;
    Py_DECREF(r);
    return same;
}

static PyObject *LoopCheck_vectorcall(PyObject *self, PyObject *const *Py_UNUSED(args),
                                      size_t nargsf, PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) != 0 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "a loop check takes no arguments");
        return NULL;
    }
    int ok = loop_check((LoopCheckObject *)self);
    if (ok < 0) return NULL;
    return PyBool_FromLong(ok);
}

static PyObject *LoopCheck_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"library", "token", "probe", "local", "cvar", "context", "runner",
                             NULL};
    PyObject *library, *token, *probe, *local, *cvar, *context = Py_None, *runner = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "UOOOO|$OO:LoopCheck", kwlist, &library, &token,
                                     &probe, &local, &cvar, &context, &runner))
        return NULL;
    int kind;
    if (PyUnicode_Compare(library, str_asyncio) == 0) {
        kind = KIND_ASYNCIO;
    } else if (PyUnicode_Compare(library, str_trio) == 0) {
        kind = KIND_TRIO;
        if (local == Py_None) {
            PyErr_SetString(PyExc_ValueError, "a trio loop check needs sniffio's thread-local");
            return NULL;
        }
    } else {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "library must be 'asyncio' or 'trio', not %R", library);
        return NULL;
    }
    if (!PyCallable_Check(probe)) {
        PyErr_SetString(PyExc_TypeError, "probe must be callable");
        return NULL;
    }
    if (cvar != Py_None && !PyContextVar_CheckExact(cvar)) {
        PyErr_SetString(PyExc_TypeError, "cvar must be a contextvars.ContextVar or None");
        return NULL;
    }
    if ((context == Py_None) != (runner == Py_None)) {
        PyErr_SetString(PyExc_TypeError, "context and runner go together");
        return NULL;
    }
    if (context != Py_None && (kind != KIND_TRIO || !PyObject_TypeCheck(context, thread_local_type) ||
                               Py_TYPE(context)->tp_getattro != thread_local_type->tp_getattro)) {
        PyErr_SetString(PyExc_TypeError,
                        "context must be a plain threading.local, and only for trio");
        return NULL;
    }
    LoopCheckObject *c = (LoopCheckObject *)type->tp_alloc(type, 0);
    if (c == NULL) return NULL;
    c->vectorcall = LoopCheck_vectorcall;
    c->kind = kind;
    c->token = Py_NewRef(token);
    c->probe = Py_NewRef(probe);
    c->local = Py_NewRef(local);
    c->cvar = Py_NewRef(cvar);
    c->ldict = NULL;
    c->tsid = 0;
    c->default_name = NULL;
    c->default_tag = 0;
    c->generic = 1;
    c->context = context == Py_None ? NULL : Py_NewRef(context);
    c->runner = runner == Py_None ? NULL : Py_NewRef(runner);
    c->cdict = NULL;
    c->ctsid = 0;
    if (local != Py_None && PyObject_TypeCheck(local, thread_local_type) &&
        Py_TYPE(local)->tp_getattro == thread_local_type->tp_getattro) {
        /* A plain threading.local whose class gives `name` as a plain value: read fast. */
        c->generic = 0;
        if (class_name(c) == NULL) {
            if (PyErr_Occurred()) {
                Py_DECREF(c);
                return NULL;
            }
            c->generic = 1;
        }
    }
    return (PyObject *)c;
}

static int LoopCheck_traverse(LoopCheckObject *c, visitproc visit, void *arg) {
    Py_VISIT(c->token);
    Py_VISIT(c->probe);
    Py_VISIT(c->local);
    Py_VISIT(c->cvar);
    Py_VISIT(c->ldict);
    Py_VISIT(c->default_name);
    Py_VISIT(c->context);
    Py_VISIT(c->runner);
    Py_VISIT(c->cdict);
    return 0;
}

static int LoopCheck_clear(LoopCheckObject *c) {
    Py_CLEAR(c->token);
    Py_CLEAR(c->probe);
    Py_CLEAR(c->local);
    Py_CLEAR(c->cvar);
    Py_CLEAR(c->ldict);
    Py_CLEAR(c->default_name);
    Py_CLEAR(c->context);
    Py_CLEAR(c->runner);
    Py_CLEAR(c->cdict);
    c->generic = 1;
    return 0;
}

static void LoopCheck_dealloc(LoopCheckObject *c) {
    PyObject_GC_UnTrack(c);
    LoopCheck_clear(c);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyTypeObject LoopCheckType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aiocudasem._hotpath.LoopCheck",
    .tp_basicsize = sizeof(LoopCheckObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "LoopCheck(library, token, probe, local, cvar, *, context=None, runner=None)\n--\n\n"
              "Called with no arguments, True while the running loop is the token's ('asyncio' "
              "or 'trio'; see _loop._running_check()). For trio, `context` and `runner`: the "
              "thread-local that holds the running Runner, and the token's, read instead of "
              "calling the probe.",
    .tp_new = LoopCheck_new,
    .tp_vectorcall_offset = offsetof(LoopCheckObject, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_traverse = (traverseproc)LoopCheck_traverse,
    .tp_clear = (inquiry)LoopCheck_clear,
    .tp_dealloc = (destructor)LoopCheck_dealloc,
};

/* ------------------------------------------------------------------ Finder */

/* current_notifier(): the notifier that this thread used last (`here.notifier`), if no release
 * waits for a loop (`deferred` is empty) and it serves the running loop; else `slow()`. */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *here;
    PyObject *deferred;
    PyObject *slow;
    /* The notifier found last and the thread that found it: the same as here.notifier for
     * that thread, read without the thread-local lookup (about 0.2 us of an await). The
     * thread is its thread state's id, never reused. Another thread reads here.notifier and
     * takes the slot over. */
    uint64_t ident;
    PyObject *last;
    /* For wait_complete(): the notifier whose checkpoint kind and tally were read last
     * (`bare_yield` and `_tally` never change for a notifier), and those two. */
    PyObject *seen;
    int seen_bare;
    PyObject *seen_tally;
} FinderObject;

/* The slot takes `n` for thread `me`, both before the old notifier goes (its release can run
 * Python code that calls the finder). */
static void remember(FinderObject *f, uint64_t me, PyObject *n) {
    PyObject *old = f->last;
    f->last = Py_NewRef(n);
    f->ident = me;
    Py_XDECREF(old);
}

static PyObject *Finder_vectorcall(PyObject *self, PyObject *const *Py_UNUSED(args),
                                   size_t nargsf, PyObject *kwnames) {
    FinderObject *f = (FinderObject *)self;
    if (PyVectorcall_NARGS(nargsf) != 0 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "current_notifier() takes no arguments");
        return NULL;
    }
    uint64_t me = PyThreadState_GetID(PyThreadState_Get());
    PyObject *n;
    if (f->last != NULL && f->ident == me) {
        n = Py_NewRef(f->last);
    } else {
        n = PyObject_GetAttr(f->here, str_notifier);
        if (n == NULL) return NULL;
    }
    if (n != Py_None) {
        Py_ssize_t pending = PyObject_Length(f->deferred);
        if (pending < 0) goto error;
        if (pending == 0) {
            PyObject *check = PyObject_GetAttr(n, str_serves);
            if (check == NULL) goto error;
            int ok;
            if (Py_IS_TYPE(check, &LoopCheckType)) {
                ok = loop_check((LoopCheckObject *)check);
            } else { /* a closed notifier's _never, or a test's stand-in */
                PyObject *r = PyObject_CallNoArgs(check);
                ok = r == NULL ? -1 : PyObject_IsTrue(r);
                Py_XDECREF(r);
            }
            Py_DECREF(check);
            if (ok < 0) goto error;
            if (ok) {
                if (f->last != n) remember(f, me, n);
                f->ident = me;
                return n;
            }
        }
    }
    Py_DECREF(n);
    n = PyObject_CallNoArgs(f->slow);
    if (n != NULL && n != Py_None) remember(f, me, n);
    return n;
error:
    Py_DECREF(n);
    return NULL;
}

static PyObject *Finder_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"here", "deferred", "slow", NULL};
    PyObject *here, *deferred, *slow;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO:Finder", kwlist, &here, &deferred, &slow))
        return NULL;
    if (!PyCallable_Check(slow)) {
        PyErr_SetString(PyExc_TypeError, "slow must be callable");
        return NULL;
    }
    FinderObject *f = (FinderObject *)type->tp_alloc(type, 0);
    if (f == NULL) return NULL;
    f->vectorcall = Finder_vectorcall;
    f->here = Py_NewRef(here);
    f->deferred = Py_NewRef(deferred);
    f->slow = Py_NewRef(slow);
    f->ident = 0;
    f->last = NULL;
    f->seen = NULL;
    f->seen_bare = 0;
    f->seen_tally = NULL;
    return (PyObject *)f;
}

static int Finder_traverse(FinderObject *f, visitproc visit, void *arg) {
    Py_VISIT(f->here);
    Py_VISIT(f->deferred);
    Py_VISIT(f->slow);
    Py_VISIT(f->last);
    Py_VISIT(f->seen);
    Py_VISIT(f->seen_tally);
    return 0;
}

static int Finder_clear(FinderObject *f) {
    Py_CLEAR(f->here);
    Py_CLEAR(f->deferred);
    Py_CLEAR(f->slow);
    Py_CLEAR(f->last);
    Py_CLEAR(f->seen);
    Py_CLEAR(f->seen_tally);
    return 0;
}

static void Finder_dealloc(FinderObject *f) {
    PyObject_GC_UnTrack(f);
    Finder_clear(f);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

static PyTypeObject FinderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aiocudasem._hotpath.Finder",
    .tp_basicsize = sizeof(FinderObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Finder(here, deferred, slow)\n--\n\nCalled with no arguments, here.notifier if "
              "deferred is empty and the notifier serves the running loop, else slow().",
    .tp_new = Finder_new,
    .tp_vectorcall_offset = offsetof(FinderObject, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_traverse = (traverseproc)Finder_traverse,
    .tp_clear = (inquiry)Finder_clear,
    .tp_dealloc = (destructor)Finder_dealloc,
};

/* ------------------------------------------------------------------ History */

/* The spin limit in force (Tuning.spin_limit): _tuning hands it over when it is imported and
 * whenever configure() changes it, so Tuning's default is the only one. */
static double spin_limit = 0.0;

#define PROBE_EVERY 16 /* a stream whose waits are long still spins on one wait in this many */

typedef struct {
    PyObject_HEAD
    PyObject *newest; /* the newest point a wait_complete() parked on, or None */
    double recent;    /* a moving average of the wait times in seconds; < 0: none yet */
    int unspun;       /* waits that did not spin since the last that did */
    char closed;      /* the stream is closed (Stream._claim()): settle() raises */
} HistoryObject;

static PyObject *History_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "History() takes no arguments");
        return NULL;
    }
    HistoryObject *h = (HistoryObject *)type->tp_alloc(type, 0);
    if (h == NULL) return NULL;
    h->newest = Py_NewRef(Py_None);
    h->recent = -1.0;
    h->unspun = 0;
    h->closed = 0;
    return (PyObject *)h;
}

static void learn(HistoryObject *h, double took) {
    double old = h->recent;
    if (old < 0 || (old > spin_limit && spin_limit >= took))
        h->recent = took;
    else
        h->recent = 0.75 * old + 0.25 * took;
}

static PyObject *History_learn(HistoryObject *h, PyObject *arg) {
    double took = PyFloat_AsDouble(arg);
    if (took == -1.0 && PyErr_Occurred()) return NULL;
    learn(h, took);
    Py_RETURN_NONE;
}

static double spin_window(HistoryObject *h) {
    double limit = spin_limit, recent = h->recent;
    if (recent < 0) return limit;
    if (recent > limit) {
        if (h->unspun < PROBE_EVERY - 1) { /* also for any value set from outside */
            h->unspun++;
            return 0.0;
        }
        h->unspun = 0;
        return limit;
    }
    double window = 2.0 * recent + 20e-6;
    return window < limit ? window : limit;
}

static PyObject *History_spin_window(HistoryObject *h, PyObject *Py_UNUSED(ignored)) {
    return PyFloat_FromDouble(spin_window(h));
}

static int History_traverse(HistoryObject *h, visitproc visit, void *arg) {
    Py_VISIT(h->newest);
    return 0;
}

static int History_clear(HistoryObject *h) {
    Py_CLEAR(h->newest);
    return 0;
}

static void History_dealloc(HistoryObject *h) {
    PyObject_GC_UnTrack(h);
    History_clear(h);
    Py_TYPE(h)->tp_free((PyObject *)h);
}

static PyObject *History_get_newest(HistoryObject *h, void *Py_UNUSED(closure)) {
    return Py_NewRef(h->newest != NULL ? h->newest : Py_None);
}

static int History_set_newest(HistoryObject *h, PyObject *value, void *Py_UNUSED(closure)) {
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "newest cannot be deleted; set it to None");
        return -1;
    }
    Py_XSETREF(h->newest, Py_NewRef(value));
    return 0;
}

static PyMethodDef History_methods[] = {
    {"learn", (PyCFunction)History_learn, METH_O,
     "learn(took): add a wait that took `took` seconds. A moving average, except that a wait "
     "within spin_limit where the average said longer starts it over: a parked wait's time "
     "includes its wake-up, which can cost more than spin_limit itself, and without the reset "
     "one long wait would leave a stream of short work parking for good."},
    {"spin_window", (PyCFunction)History_spin_window, METH_NOARGS,
     "spin_window() -> float: how long the next wait may spin, from its start: up to "
     "spin_limit, about twice what the recent waits took. If they took longer than the limit, "
     "not at all, but for one wait in 16, which spins the whole limit: if it catches the work, "
     "the stream's waits are short again (see learn())."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef History_members[] = {
    {"recent", T_DOUBLE, offsetof(HistoryObject, recent), 0,
     "A moving average of the wait times in seconds; < 0: none yet."},
    {"unspun", T_INT, offsetof(HistoryObject, unspun), 0,
     "Waits that did not spin since the last that did."},
    {"closed", T_BOOL, offsetof(HistoryObject, closed), 0,
     "True once the stream is closed or detached (Stream._claim() sets it): a wait past its "
     "first checkpoint then raises instead of querying the handle (settle()). A plain field, "
     "read in C more cheaply than the stream's own attribute."},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef History_getset[] = {
    {"newest", (getter)History_get_newest, (setter)History_set_newest,
     "The newest point that a wait_complete() parked on, or None: a wait that began before "
     "its event was recorded joins it rather than recording one of its own "
     "(Notifier.shared_point()).",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject HistoryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aiocudasem._hotpath.History",
    .tp_basicsize = sizeof(HistoryObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "History()\n--\n\nHow long the recent waits on one stream took, which sets how long the next one "
              "spins, and the newest point parked on it, which later waits may share.",
    .tp_new = History_new,
    .tp_traverse = (traverseproc)History_traverse,
    .tp_clear = (inquiry)History_clear,
    .tp_dealloc = (destructor)History_dealloc,
    .tp_methods = History_methods,
    .tp_members = History_members,
    .tp_getset = History_getset,
};

/* ------------------------------------------------------------------ the first query */

/* What Stream.wait_complete() does after its first checkpoint, on a stream other than the
 * default ones: the stream must still be open (its history says), then one query; if the
 * stream is idle, its history learns how long the wait took. The Python around it counts the
 * completed wait and handles the query's errors and the busy stream (_stream.py). Python's
 * own attribute reads are faster than the C API's generic ones, so the state read here is in
 * the history's C fields. */

/* time.perf_counter(), the same double: CLOCK_MONOTONIC in nanoseconds, converted as CPython
 * converts it (_PyTime_AsSecondsDouble), so that the start it hands back compares exactly with
 * the Python clock's readings. */
static double perf_counter(void) {
#if PY_VERSION_HEX >= 0x030D0000
    PyTime_t raw;
    if (PyTime_PerfCounterRaw(&raw) == 0) return PyTime_AsSecondsDouble(raw);
#endif
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* cannot fail for this clock on Linux */
    long long t = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    if (t % 1000000000LL == 0) return (double)(t / 1000000000LL);
    return (double)t / 1e9;
}

static PyObject *str__closed_error;

/* 1: idle, and learnt; 0: still busy; -1: an exception is set. */
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

static int settle(PyObject *stream, PyObject *query, PyObject *handle, HistoryObject *history,
                  double started) {
    if (history->closed) return raise_closed(stream); /* by another task, in the checkpoint */
    PyObject *args[1] = {handle};
    PyObject *r = PyObject_Vectorcall(query, args, 1, NULL);
    if (r == NULL) return -1;
    int done = r == Py_True ? 1 : r == Py_False ? 0 : PyObject_IsTrue(r);
    Py_DECREF(r);
    if (done > 0) learn(history, perf_counter() - started);
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
    if (!Py_IS_TYPE(args[3], &HistoryType)) {
        PyErr_Format(PyExc_TypeError, "%s(): history must be a History, not %.100s", name,
                     Py_TYPE(args[3])->tp_name);
        return -1;
    }
    return 0;
}

/* settle(stream, query, handle, history, started) -> bool, after a checkpoint that the caller
 * passed (any loop). */
static PyObject *settle_py(PyObject *Py_UNUSED(module), PyObject *const *args,
                           Py_ssize_t nargs) {
    if (settle_args(args, nargs, 5, "settle") < 0) return NULL;
    double started = PyFloat_AsDouble(args[4]);
    if (started == -1.0 && PyErr_Occurred()) return NULL;
    int done = settle(args[0], args[1], args[2], (HistoryObject *)args[3], started);
    if (done < 0) return NULL;
    return PyBool_FromLong(done);
}

/* A StopIteration that the query raised, as PEP 479 turns one from a generator's body into
 * RuntimeError: through next(), it would otherwise end the await with its value. */
static void stop_iteration_to_runtime_error(void) {
    if (!PyErr_ExceptionMatches(PyExc_StopIteration)) return;
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *cause = PyErr_GetRaisedException();
#else
    PyObject *type, *cause, *tb;
    PyErr_Fetch(&type, &cause, &tb);
    PyErr_NormalizeException(&type, &cause, &tb);
    if (tb != NULL) PyException_SetTraceback(cause, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
#endif
    PyObject *err = PyObject_CallFunction(PyExc_RuntimeError, "s",
                                          "a wait's query raised StopIteration");
    if (err != NULL) {
        PyException_SetCause(err, Py_NewRef(cause));   /* steals */
        PyException_SetContext(err, Py_NewRef(cause)); /* steals */
        PyErr_SetObject(PyExc_RuntimeError, err);
        Py_DECREF(err);
    }
    Py_XDECREF(cause);
}

/* __await__() and __iter__() of the awaitables below: the object itself. */
static PyObject *return_self(PyObject *self) {
    return Py_NewRef(self);
}

/* ------------------------------------------------------------------ the event path (asyncio) */

/* What Stream.wait_complete() does on asyncio when its first query finds the stream busy and
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
 * the spin yield at its next query; I/O and timers are polled at most IDLE_SPIN later. */

#define IDLE_SPIN 20e-6

/* The pool's size limit (_EventPool._LIMIT), handed over by _pools as the spin limit is. */
static Py_ssize_t pool_limit = 0;

static PyObject *str_event_create, *str_event_record, *str_event_query, *str_event_destroy;

typedef struct {
    PyObject_HEAD
    PyObject *driver, *pool, *history, *query, *event;
    PyObject *ready; /* the loop's queue of ready callbacks, or NULL: see IDLE_SPIN */
    double started, recorded, deadline;
    int state;     /* 0: recorded, not yet stepped; 1: spinning (yielded); 2: finished */
    int executing; /* inside a step's calls: close(), throw() and another step refuse */
} SpinRecordedObject;

static PyTypeObject SpinRecordedType;

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
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *exc = PyErr_GetRaisedException();
    if (PyList_Append(pool, event) < 0) PyErr_WriteUnraisable(pool);
    PyErr_SetRaisedException(exc);
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (PyList_Append(pool, event) < 0) PyErr_WriteUnraisable(pool);
    PyErr_Restore(type, value, tb);
#endif
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

static int refuse_if_executing(SpinRecordedObject *c) {
    if (!c->executing) return 0;
    PyErr_SetString(PyExc_ValueError, "spin_recorded() already executing");
    return -1;
}

static PyTypeObject *deque_type; /* collections.deque */

/* spin_recorded(driver, device, pool, handle, history, started, ready): the event is taken and
 * recorded now, at the call; the awaitable then spins on it. */
static PyObject *spin_recorded(PyObject *Py_UNUSED(module), PyObject *const *args,
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
    if (!Py_IS_TYPE(args[4], &HistoryType)) {
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
    SpinRecordedObject *c = PyObject_GC_New(SpinRecordedObject, &SpinRecordedType);
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
    c->executing = 0;
    c->started = started;
    c->recorded = perf_counter(); /* nothing ran since the record: see wait_recorded() */
    c->deadline = started;
    c->state = 0;
    PyObject_GC_Track(c);
    return (PyObject *)c;
}

static int SpinRecorded_traverse(SpinRecordedObject *c, visitproc visit, void *arg) {
    Py_VISIT(c->driver);
    Py_VISIT(c->pool);
    Py_VISIT(c->history);
    Py_VISIT(c->query);
    Py_VISIT(c->event);
    Py_VISIT(c->ready);
    return 0;
}

static int SpinRecorded_clear(SpinRecordedObject *c) {
    Py_CLEAR(c->driver);
    Py_CLEAR(c->pool);
    Py_CLEAR(c->history);
    Py_CLEAR(c->query);
    Py_CLEAR(c->event);
    Py_CLEAR(c->ready);
    return 0;
}

/* Never finished nor closed (dropped half-way, or garbage in a cycle, where the collector runs
 * this before it clears anything): the event goes back. */
static void SpinRecorded_finalize(SpinRecordedObject *c) {
    return_event(c);
}

static void SpinRecorded_dealloc(SpinRecordedObject *c) {
    if (PyObject_CallFinalizerFromDealloc((PyObject *)c) < 0) return; /* resurrected */
    PyObject_GC_UnTrack(c);
    SpinRecorded_clear(c);
    PyObject_GC_Del(c);
}

/* Whether the loop has nothing else ready to run: the spin may query again without yielding
 * (see IDLE_SPIN). Never for a loop whose queue it was not given. */
static int loop_idle(SpinRecordedObject *c) {
    return c->ready != NULL && PyObject_Size(c->ready) == 0;
}

/* The wait ends without its event being done: (event, recorded) for the park, the event now
 * the caller's. */
static PySendResult hand_over(SpinRecordedObject *c, PyObject **result) {
    c->state = 2;
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
static PySendResult SpinRecorded_step(SpinRecordedObject *c, PyObject **result) {
    if (refuse_if_executing(c) < 0) {
        *result = NULL;
        return PYGEN_ERROR;
    }
    if (c->state == 2) {
        *result = Py_NewRef(Py_None);
        return PYGEN_RETURN;
    }
    if (c->event == NULL || c->history == NULL) { /* cleared by the collector while suspended */
        c->state = 2;
        PyErr_SetString(PyExc_RuntimeError, "a cleared spin_recorded() was resumed");
        *result = NULL;
        return PYGEN_ERROR;
    }
    double step = perf_counter();
    if (c->state == 0) {
        double window = spin_window((HistoryObject *)c->history);
        if (!(window > 0.0)) return hand_over(c, result);
        c->deadline = c->started + window;
        c->state = 1;
        if (!loop_idle(c)) {
            *result = Py_NewRef(Py_None);
            return PYGEN_NEXT;
        }
    }
    for (;;) {
        PyObject *args[1] = {c->event};
        c->executing = 1;
        PyObject *r = PyObject_Vectorcall(c->query, args, 1, NULL);
        int done = r == NULL ? -1 : r == Py_True ? 1 : r == Py_False ? 0 : PyObject_IsTrue(r);
        Py_XDECREF(r);
        c->executing = 0;
        if (done < 0) {
            c->state = 2;
            return_event(c);
            *result = NULL;
            return PYGEN_ERROR;
        }
        double now = perf_counter();
        if (done) {
            c->state = 2;
            learn((HistoryObject *)c->history, now - c->started);
            c->executing = 1;
            int rc = give_event_back(c);
            c->executing = 0;
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

static PySendResult SpinRecorded_send(SpinRecordedObject *c, PyObject *Py_UNUSED(arg),
                                      PyObject **result) {
    return SpinRecorded_step(c, result);
}

/* next(), and send(value) as a generator has it: a StopIteration carries the await's value. */
static PyObject *SpinRecorded_next(SpinRecordedObject *c) {
    PyObject *r;
    PySendResult s = SpinRecorded_step(c, &r);
    if (s == PYGEN_NEXT) return r;
    if (s == PYGEN_RETURN) {
        if (r != Py_None) { /* a tuple: wrapped, or StopIteration would take it as its args */
            PyObject *stop = PyObject_CallOneArg(PyExc_StopIteration, r);
            if (stop != NULL) {
                PyErr_SetObject(PyExc_StopIteration, stop);
                Py_DECREF(stop);
            } else { /* the handed-over event would be lost with the tuple: it goes back */
                c->event = Py_NewRef(PyTuple_GET_ITEM(r, 0));
                return_event(c);
            }
        }
        Py_DECREF(r);
    } else {
        stop_iteration_to_runtime_error();
    }
    return NULL;
}

static PyObject *SpinRecorded_send_method(SpinRecordedObject *c, PyObject *Py_UNUSED(value)) {
    PyObject *r = SpinRecorded_next(c);
    if (r == NULL && !PyErr_Occurred()) PyErr_SetNone(PyExc_StopIteration);
    return r;
}

/* The error that throw(exc) or throw(type[, value[, traceback]]) raises, set: always NULL. */
static PyObject *raise_thrown(PyObject *const *args, Py_ssize_t nargs) {
    PyObject *typ = args[0], *val = nargs > 1 ? args[1] : Py_None,
             *tb = nargs > 2 ? args[2] : Py_None;
    if (PyExceptionInstance_Check(typ)) {
        if (val != Py_None) {
            PyErr_SetString(PyExc_TypeError, "instance exception may not have a separate value");
            return NULL;
        }
        val = typ;
        typ = (PyObject *)Py_TYPE(typ);
        PyErr_SetObject(typ, val);
    } else if (PyExceptionClass_Check(typ)) {
        if (val == Py_None)
            PyErr_SetNone(typ);
        else
            PyErr_SetObject(typ, val);
    } else {
        PyErr_Format(PyExc_TypeError,
                     "exceptions must be classes or instances deriving from BaseException, "
                     "not %.100s",
                     Py_TYPE(typ)->tp_name);
        return NULL;
    }
    if (tb != Py_None) {
        if (!PyTraceBack_Check(tb)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "throw() third argument must be a traceback object");
            return NULL;
        }
#if PY_VERSION_HEX >= 0x030C0000
        PyObject *exc = PyErr_GetRaisedException();
        PyException_SetTraceback(exc, tb);
        PyErr_SetRaisedException(exc);
#else
        PyObject *t, *v, *old;
        PyErr_Fetch(&t, &v, &old);
        PyErr_NormalizeException(&t, &v, &old);
        Py_XDECREF(old);
        PyErr_Restore(t, v, Py_NewRef(tb));
#endif
    }
    return NULL;
}

static int throw_args(Py_ssize_t nargs) {
    if (nargs >= 1 && nargs <= 3) return 0;
    PyErr_Format(PyExc_TypeError, "throw() takes 1 to 3 arguments, got %zd", nargs);
    return -1;
}

/* throw(exc) or throw(type[, value[, traceback]]): the wait ends with that error (a
 * cancellation, usually); the event goes back first. */
static PyObject *SpinRecorded_throw(SpinRecordedObject *c, PyObject *const *args,
                                    Py_ssize_t nargs) {
    if (throw_args(nargs) < 0 || refuse_if_executing(c) < 0) return NULL;
    c->state = 2;
    return_event(c);
    return raise_thrown(args, nargs);
}

static PyObject *SpinRecorded_close(SpinRecordedObject *c, PyObject *Py_UNUSED(ignored)) {
    if (refuse_if_executing(c) < 0) return NULL;
    c->state = 2;
    return_event(c);
    Py_RETURN_NONE;
}

static PyMethodDef SpinRecorded_methods[] = {
    {"send", (PyCFunction)SpinRecorded_send_method, METH_O,
     "send(value): as next(); the value is ignored."},
    {"throw", (PyCFunction)(void (*)(void))SpinRecorded_throw, METH_FASTCALL,
     "throw(exc): give the event back, and raise exc."},
    {"close", (PyCFunction)SpinRecorded_close, METH_NOARGS,
     "close(): end now, giving the event back."},
    {NULL, NULL, 0, NULL},
};

static PyAsyncMethods SpinRecorded_async = {
    .am_await = return_self,
    .am_send = (sendfunc)SpinRecorded_send,
};

static PyTypeObject SpinRecordedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aiocudasem._hotpath.SpinRecorded",
    .tp_basicsize = sizeof(SpinRecordedObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "An asyncio wait on a pooled event just recorded (see spin_recorded()).",
    .tp_as_async = &SpinRecorded_async,
    .tp_iter = return_self,
    .tp_iternext = (iternextfunc)SpinRecorded_next,
    .tp_methods = SpinRecorded_methods,
    .tp_traverse = (traverseproc)SpinRecorded_traverse,
    .tp_clear = (inquiry)SpinRecorded_clear,
    .tp_dealloc = (destructor)SpinRecorded_dealloc,
    .tp_finalize = (destructor)SpinRecorded_finalize,
};

/* ------------------------------------------------------------------ wait_complete() */

/* Stream.wait_complete() on a stream other than the default ones, as one object that the loop
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
 * same steps as a Python coroutine (see below). */

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

static PyObject *str_bare_yield, *str_checkpoint, *str__tally, *str__wait_busy,
    *str__query_failed, *str_throw, *str_close, *str__wait_generic;

enum { WAIT_NEW = 0, WAIT_CHECKPOINT = 1, WAIT_BUSY = 2, WAIT_DONE = 3 };

typedef struct {
    PyObject_HEAD
    PyObject *stream, *query, *handle, *history, *finder;
    PyObject *notifier; /* found at the first step */
    PyObject *tally;    /* the notifier's */
    PyObject *sub;      /* what the wait delegates to: a loop's checkpoint, or the busy path */
    double started;
    int state;
    int executing; /* inside a call of Python: a step, throw() or close() from there refuses */
} WaitObject;

static PyTypeObject WaitType;

/* wait_complete(stream, query, handle, history, finder) */
static PyObject *wait_complete(PyObject *Py_UNUSED(module), PyObject *const *args,
                               Py_ssize_t nargs) {
    if (settle_args(args, nargs, 5, "wait_complete") < 0) return NULL;
    if (!Py_IS_TYPE(args[4], &FinderType)) {
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
    WaitObject *c = PyObject_GC_New(WaitObject, &WaitType);
    if (c == NULL) return NULL;
    c->stream = Py_NewRef(args[0]);
    c->query = Py_NewRef(args[1]);
    c->handle = Py_NewRef(args[2]);
    c->history = Py_NewRef(args[3]);
    c->finder = Py_NewRef(args[4]);
    c->notifier = c->tally = c->sub = NULL;
    c->started = 0.0;
    c->state = WAIT_NEW;
    c->executing = 0;
    PyObject_GC_Track(c);
    return (PyObject *)c;
}

static int Wait_traverse(WaitObject *c, visitproc visit, void *arg) {
    Py_VISIT(c->stream);
    Py_VISIT(c->query);
    Py_VISIT(c->handle);
    Py_VISIT(c->history);
    Py_VISIT(c->finder);
    Py_VISIT(c->notifier);
    Py_VISIT(c->tally);
    Py_VISIT(c->sub);
    return 0;
}

static int Wait_clear(WaitObject *c) {
    Py_CLEAR(c->stream);
    Py_CLEAR(c->query);
    Py_CLEAR(c->handle);
    Py_CLEAR(c->history);
    Py_CLEAR(c->finder);
    Py_CLEAR(c->notifier);
    Py_CLEAR(c->tally);
    Py_CLEAR(c->sub);
    return 0;
}

/* Dropped without ever being awaited: warned about as a coroutine is. */
static void Wait_finalize(WaitObject *c) {
    if (c->state != WAIT_NEW) return;
    c->state = WAIT_DONE;
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *exc = PyErr_GetRaisedException();
#else
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
#endif
    if (PyErr_WarnEx(PyExc_RuntimeWarning, "coroutine 'Stream.wait_complete' was never awaited",
                     1) < 0)
        PyErr_WriteUnraisable((PyObject *)c);
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(exc);
#else
    PyErr_Restore(type, exc, tb);
#endif
}

static void Wait_dealloc(WaitObject *c) {
    if (PyObject_CallFinalizerFromDealloc((PyObject *)c) < 0) return; /* resurrected */
    PyObject_GC_UnTrack(c);
    Wait_clear(c);
    PyObject_GC_Del(c);
}

/* The wait is over: nothing is kept. */
static void finish(WaitObject *c) {
    c->state = WAIT_DONE;
    Wait_clear(c);
}

static int refuse_reentry(WaitObject *c) {
    if (!c->executing) return 0;
    PyErr_SetString(PyExc_ValueError, "wait_complete() already executing");
    return -1;
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
    c->executing = 1;
    c->sub = awaitable_iter(aw);
    c->executing = 0;
    Py_DECREF(aw);
    if (c->sub == NULL) {
        *result = NULL;
        return PYGEN_ERROR;
    }
    c->executing = 1;
    PySendResult s = PyIter_Send(c->sub, Py_None, result);
    c->executing = 0;
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
    c->executing = 1;
    int done = settle(c->stream, c->query, c->handle, (HistoryObject *)c->history, c->started);
    if (done < 0) {
#if PY_VERSION_HEX >= 0x030C0000
        PyObject *exc = PyErr_GetRaisedException();
#else
        PyObject *type, *exc, *tb;
        PyErr_Fetch(&type, &exc, &tb);
        PyErr_NormalizeException(&type, &exc, &tb);
        if (tb != NULL) PyException_SetTraceback(exc, tb);
        Py_XDECREF(type);
        Py_XDECREF(tb);
#endif
        PyObject *r = PyObject_CallMethodOneArg(c->stream, str__query_failed, exc);
        Py_DECREF(exc);
        if (r != NULL) { /* it always raises */
            Py_DECREF(r);
            PyErr_SetString(PyExc_SystemError, "_query_failed() returned instead of raising");
        }
        c->executing = 0;
        finish(c);
        *result = NULL;
        return PYGEN_ERROR;
    }
    c->executing = 0;
    if (done) {
        ((TallyObject *)c->tally)->completed++;
        finish(c);
        *result = Py_NewRef(Py_None);
        return PYGEN_RETURN;
    }
    c->state = WAIT_BUSY;
    PyObject *started = PyFloat_FromDouble(c->started);
    PyObject *aw = NULL;
    if (started != NULL) {
        c->executing = 1;
        aw = PyObject_CallMethodObjArgs(c->stream, str__wait_busy, c->notifier, started, NULL);
        c->executing = 0;
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
    c->executing = 1;
    PyObject *n = Finder_vectorcall(c->finder, NULL, 0, NULL);
    int ok = n != NULL && know_notifier(f, n, &is_bare, &tally) == 0;
    c->executing = 0;
    if (!ok) {
        Py_XDECREF(n);
        finish(c);
        *result = NULL;
        return PYGEN_ERROR;
    }
    c->notifier = n;
    c->tally = tally;
    c->started = perf_counter();
    c->state = WAIT_CHECKPOINT;
    if (is_bare) {
        *result = Py_NewRef(Py_None);
        return PYGEN_NEXT;
    }
    /* Read each time, not remembered: it is the notifier's to replace. */
    c->executing = 1;
    PyObject *aw = PyObject_CallMethodNoArgs(n, str_checkpoint);
    c->executing = 0;
    return delegate(c, aw, result);
}

/* After a step of the delegate that did not yield: PYGEN_RETURN with its value ends the
 * checkpoint (on to the query) or the busy path (the await's value); PYGEN_ERROR ends all. */
static PySendResult Wait_after_sub(WaitObject *c, PySendResult s, PyObject **result) {
    if (s == PYGEN_NEXT) return s;
    if (s == PYGEN_RETURN && c->state == WAIT_CHECKPOINT) {
        Py_DECREF(*result);
        Py_CLEAR(c->sub);
        return Wait_query(c, result);
    }
    finish(c);
    return s;
}

static PySendResult Wait_step(WaitObject *c, PyObject *value, PyObject **result) {
    if (refuse_reentry(c) < 0) {
        *result = NULL;
        return PYGEN_ERROR;
    }
    PySendResult s;
    if ((c->state == WAIT_NEW || c->state == WAIT_CHECKPOINT) ?
            (c->stream == NULL || c->history == NULL) :
            (c->state == WAIT_BUSY && c->sub == NULL)) {
        /* cleared by the collector while suspended */
        finish(c);
        PyErr_SetString(PyExc_RuntimeError, "a cleared wait_complete() was resumed");
        *result = NULL;
        return PYGEN_ERROR;
    }
    switch (c->state) {
    case WAIT_NEW:
        s = Wait_begin(c, result);
        if (c->state == WAIT_CHECKPOINT && c->sub != NULL) s = Wait_after_sub(c, s, result);
        else if (s == PYGEN_ERROR) finish(c);
        break;
    case WAIT_CHECKPOINT:
        if (c->sub == NULL) {
            s = Wait_query(c, result);
        } else {
            c->executing = 1;
            s = PyIter_Send(c->sub, value, result);
            c->executing = 0;
            s = Wait_after_sub(c, s, result);
        }
        break;
    case WAIT_BUSY:
        c->executing = 1;
        s = PyIter_Send(c->sub, value, result);
        c->executing = 0;
        if (s != PYGEN_NEXT) finish(c);
        break;
    default:
        PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited wait_complete()");
        *result = NULL;
        return PYGEN_ERROR;
    }
    /* The busy path's first step can end the wait too */
    if (s == PYGEN_NEXT) return s;
    if (c->state == WAIT_BUSY) finish(c);
    if (s == PYGEN_ERROR) stop_iteration_to_runtime_error();
    return s;
}

static PySendResult Wait_send(WaitObject *c, PyObject *value, PyObject **result) {
    return Wait_step(c, value, result);
}

/* A finished step as next() and send() end it: the await's value goes in a StopIteration. */
static PyObject *next_result(PySendResult s, PyObject *r) {
    if (s == PYGEN_NEXT) return r;
    if (s == PYGEN_RETURN) {
        if (r == Py_None) {
            PyErr_SetNone(PyExc_StopIteration);
        } else { /* wrapped: StopIteration would take a tuple as its args */
            PyObject *stop = PyObject_CallOneArg(PyExc_StopIteration, r);
            if (stop != NULL) {
                PyErr_SetObject(PyExc_StopIteration, stop);
                Py_DECREF(stop);
            }
        }
        Py_DECREF(r);
    }
    return NULL;
}

static PyObject *Wait_next(WaitObject *c) {
    PyObject *r;
    PySendResult s = Wait_step(c, Py_None, &r);
    if (s == PYGEN_RETURN && r == Py_None) { /* next() ends with no StopIteration set */
        Py_DECREF(r);
        return NULL;
    }
    return next_result(s, r);
}

static PyObject *Wait_send_method(WaitObject *c, PyObject *value) {
    if (c->state == WAIT_NEW && value != Py_None) {
        PyErr_SetString(PyExc_TypeError,
                        "can't send non-None value to a just-started wait_complete()");
        return NULL;
    }
    PyObject *r;
    PySendResult s = Wait_step(c, value, &r);
    return next_result(s, r);
}

/* The value that ended a delegate with StopIteration (a new reference), the error cleared; or
 * NULL, the error left set, if it was another one. */
static PyObject *stop_value(void) {
    if (!PyErr_ExceptionMatches(PyExc_StopIteration)) return NULL;
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *exc = PyErr_GetRaisedException();
#else
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    PyErr_NormalizeException(&type, &exc, &tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
#endif
    PyObject *v = Py_NewRef(((PyStopIterationObject *)exc)->value);
    Py_DECREF(exc);
    return v;
}

/* throw(exc) or throw(type[, value[, traceback]]): thrown into what the wait delegates to (the
 * loop's checkpoint, or the busy path), where there is one; else the wait ends with it. */
static PyObject *Wait_throw(WaitObject *c, PyObject *const *args, Py_ssize_t nargs) {
    if (throw_args(nargs) < 0 || refuse_reentry(c) < 0) return NULL;
    if (c->state == WAIT_DONE) {
        PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited wait_complete()");
        return NULL;
    }
    if (c->sub == NULL) { /* not started, or at the bare yield: raised here */
        finish(c);
        raise_thrown(args, nargs);
        stop_iteration_to_runtime_error();
        return NULL;
    }
    if (PyExceptionClass_Check(args[0]) ?
            PyErr_GivenExceptionMatches(args[0], PyExc_GeneratorExit) :
            PyObject_TypeCheck(args[0], (PyTypeObject *)PyExc_GeneratorExit)) {
        /* as `yield from` has it: the delegate is closed, then it is raised here */
        PyObject *sub = c->sub;
        c->sub = NULL;
        finish(c);
        c->executing = 1;
        PyObject *r = PyObject_CallMethodNoArgs(sub, str_close);
        c->executing = 0;
        Py_DECREF(sub);
        if (r == NULL) return NULL;
        Py_DECREF(r);
        return raise_thrown(args, nargs);
    }
    PyObject *meth = PyObject_GetAttr(c->sub, str_throw);
    if (meth == NULL) { /* no throw(): closed, then raised here, as `yield from` does */
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            finish(c);
            return NULL;
        }
        PyErr_Clear();
        c->executing = 1;
        PyObject *r = PyObject_CallMethodNoArgs(c->sub, str_close);
        c->executing = 0;
        finish(c);
        if (r == NULL) return NULL;
        Py_DECREF(r);
        return raise_thrown(args, nargs);
    }
    c->executing = 1;
    PyObject *r = PyObject_Vectorcall(meth, args, nargs, NULL);
    c->executing = 0;
    Py_DECREF(meth);
    if (r != NULL) return r; /* the delegate yielded */
    PyObject *value = stop_value();
    if (value == NULL) { /* the delegate raised */
        finish(c);
        return NULL;
    }
    PySendResult s = Wait_after_sub(c, PYGEN_RETURN, &value);
    if (s != PYGEN_NEXT && c->state != WAIT_DONE) finish(c); /* the busy path ended at once */
    if (s == PYGEN_ERROR) stop_iteration_to_runtime_error();
    return next_result(s, value);
}

static PyObject *Wait_close(WaitObject *c, PyObject *Py_UNUSED(ignored)) {
    if (refuse_reentry(c) < 0) return NULL;
    PyObject *sub = c->sub;
    c->sub = NULL;
    finish(c);
    if (sub != NULL) {
        c->executing = 1;
        PyObject *r = PyObject_CallMethodNoArgs(sub, str_close);
        c->executing = 0;
        Py_DECREF(sub);
        if (r == NULL) return NULL;
        Py_DECREF(r);
    }
    Py_RETURN_NONE;
}

static PyMethodDef Wait_methods[] = {
    {"send", (PyCFunction)Wait_send_method, METH_O,
     "send(value): the next step; the value goes to what the wait delegates to."},
    {"throw", (PyCFunction)(void (*)(void))Wait_throw, METH_FASTCALL,
     "throw(exc): raise exc where the wait is suspended."},
    {"close", (PyCFunction)Wait_close, METH_NOARGS, "close(): end the wait now."},
    {NULL, NULL, 0, NULL},
};

/* __await__(): awaited while another await of it is suspended, it refuses, as a coroutine
 * does (a finished one is refused at its next step). */
static PyObject *Wait_await(WaitObject *c) {
    if (c->state == WAIT_CHECKPOINT || c->state == WAIT_BUSY) {
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
    .am_send = (sendfunc)Wait_send,
};

static PyTypeObject WaitType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aiocudasem._hotpath.WaitComplete",
    .tp_basicsize = sizeof(WaitObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The coroutine of Stream.wait_complete() (see wait_complete()).",
    .tp_as_async = &Wait_async,
    .tp_iter = return_self,
    .tp_iternext = (iternextfunc)Wait_next,
    .tp_methods = Wait_methods,
    .tp_getset = Wait_getset,
    .tp_traverse = (traverseproc)Wait_traverse,
    .tp_clear = (inquiry)Wait_clear,
    .tp_dealloc = (destructor)Wait_dealloc,
    .tp_finalize = (destructor)Wait_finalize,
};

static PyObject *set_pool_limit(PyObject *Py_UNUSED(module), PyObject *arg) {
    Py_ssize_t limit = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (limit == -1 && PyErr_Occurred()) return NULL;
    if (limit < 0) {
        PyErr_Format(PyExc_ValueError, "the pool limit must be >= 0, got %R", arg);
        return NULL;
    }
    pool_limit = limit;
    Py_RETURN_NONE;
}

static PyObject *set_spin_limit(PyObject *Py_UNUSED(module), PyObject *arg) {
    double limit = PyFloat_AsDouble(arg);
    if (limit == -1.0 && PyErr_Occurred()) return NULL;
    if (!(limit >= 0.0)) { /* NaN included */
        PyErr_Format(PyExc_ValueError, "the spin limit must be >= 0, got %R", arg);
        return NULL;
    }
    spin_limit = limit;
    Py_RETURN_NONE;
}

static PyObject *get_spin_limit(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored)) {
    return PyFloat_FromDouble(spin_limit);
}

/* ------------------------------------------------------------------ waking a crowd (asyncio) */

/* A parked task on asyncio (or uvloop) sleeps on a future of the loop. set_result() on a future
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
 * else there, is woken with plain set_result(). */

static PyObject *str_call_soon, *str_callbacks, *str_remove_done_callback, *str_set_result,
    *str_done, *str_get_loop, *str_add_done_callback, *context_kwnames, *wake_in_turn_fn;

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
    PyObject *loop = PyObject_CallMethodNoArgs(fut, str_get_loop);
    if (loop == NULL) return -1;
    int rc = call_in_context(loop, str_call_soon, callback, fut, context);
    Py_DECREF(loop);
    return rc;
}

/* The (callback, context) pairs of `fut`, as a new list of its own, or NULL with no error set
 * if they cannot be read that way. */
static PyObject *callbacks_of(PyObject *fut) {
    PyObject *cbs;
    if (optional_attr(fut, str_callbacks, &cbs) < 0) return NULL;
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
    PyObject *r = PyObject_CallMethodNoArgs(fut, str_done);
    int done = r == NULL ? -1 : PyObject_IsTrue(r);
    Py_XDECREF(r);
    if (done == 0) {
        r = PyObject_CallMethodOneArg(fut, str_set_result, Py_None);
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
    PyObject *loop = rest == NULL ? NULL : PyObject_CallMethodNoArgs(fut, str_get_loop);
    PyObject *r = loop == NULL ? NULL
                               : PyObject_CallMethodObjArgs(loop, str_call_soon, wake_in_turn_fn,
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
        if (gone && call_in_context(fut, str_add_done_callback, cb, NULL, PyTuple_GET_ITEM(p, 1)) < 0)
            PyErr_WriteUnraisable(fut);
    }
    Py_XDECREF(now);
    PyErr_Restore(type, value, tb);
    plain_set_result(fut);
}

static PyObject *wake_in_turn(PyObject *Py_UNUSED(module), PyObject *futures) {
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
        PyObject *r = PyObject_CallMethodNoArgs(fut, str_done);
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
            r = PyObject_CallMethodOneArg(fut, str_set_result, Py_None);
            if (r == NULL) goto error;
            Py_DECREF(r);
            Py_DECREF(fut);
            continue;
        }
        for (; taken < PyList_GET_SIZE(pairs); taken++) {
            r = PyObject_CallMethodOneArg(fut, str_remove_done_callback,
                                          PyTuple_GET_ITEM(PyList_GET_ITEM(pairs, taken), 0));
            if (r == NULL) goto error;
            Py_DECREF(r);
        }
        r = PyObject_CallMethodOneArg(fut, str_set_result, Py_None);
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

static PyObject *in_park_order(PyObject *Py_UNUSED(module), PyObject *batches) {
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

/* ------------------------------------------------------------------ module */

static PyMethodDef module_methods[] = {
    {"set_spin_limit", set_spin_limit, METH_O,
     "set_spin_limit(seconds): the spin limit that History uses (configure() calls it)."},
    {"get_spin_limit", get_spin_limit, METH_NOARGS,
     "get_spin_limit() -> float: the spin limit that History uses."},
    {"settle", (PyCFunction)(void (*)(void))settle_py, METH_FASTCALL,
     "settle(stream, query, handle, history, started, /) -> bool: after the first checkpoint "
     "of stream.wait_complete(), which began at `started` (a perf_counter()): raise "
     "stream._closed_error() if the history says the stream was closed meanwhile, else "
     "query(handle); if the stream is idle, have the history learn how long the wait took, "
     "and return True."},
    {"wait_complete", (PyCFunction)(void (*)(void))wait_complete, METH_FASTCALL,
     "wait_complete(stream, query, handle, history, finder, /) -> Coroutine: "
     "Stream.wait_complete() on a stream other than the default ones. Finds the notifier with "
     "`finder`, passes its checkpoint (asyncio: one bare yield; else notifier.checkpoint(), "
     "delegated to), then settle(); idle: counts the completed wait in notifier._tally; busy: "
     "delegates to stream._wait_busy(notifier, started); a failed first query raises through "
     "stream._query_failed(exc). In a thread whose last wait ran on a loop with a checkpoint "
     "coroutine (trio): stream._wait_generic() instead."},
    {"spin_recorded", (PyCFunction)(void (*)(void))spin_recorded, METH_FASTCALL,
     "spin_recorded(driver, device, pool, handle, history, started, ready, /) -> "
     "Awaitable[tuple[int, float] | None]: on asyncio, after the first query of "
     "stream.wait_complete() found the stream busy: take an event from `pool` (or "
     "driver.event_create(device)) and record it on `handle` now; awaited, query it between "
     "bare yields while the history's spin window from `started` lasts, and without yielding "
     "for up to IDLE_SPIN seconds at a time while the deque `ready` (the loop's ready "
     "callbacks; None: never) is empty. None once the event is "
     "done (the history learnt how long the wait took; the event went back); else "
     "(event, recorded), the event now the caller's to park on, recorded at that "
     "perf_counter(). An error or a throw() gives the event back."},
    {"set_pool_limit", set_pool_limit, METH_O,
     "set_pool_limit(n): how many free events a pool keeps (_EventPool._LIMIT)."},
    {"wake_in_turn", wake_in_turn, METH_O,
     "wake_in_turn(futures, /): for each asyncio future of the list that is not done yet, in "
     "order: take its done callbacks off, mark it done as set_result(None) does, and run those "
     "callbacks at once, each in its context (a callback of the loop runs it). A future whose "
     "callbacks cannot be read from `_callbacks` gets plain set_result(None). If anything "
     "raises, that future is woken as set_result() would wake it, the rest go to a new "
     "call_soon(wake_in_turn, rest), and the error propagates."},
    {"in_park_order", in_park_order, METH_O,
     "in_park_order(batches, /) -> list: the sleepers of a list of dicts {sleeper: place}, "
     "in the order of their places."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef hotpath_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "aiocudasem._hotpath",
    .m_doc = "The await's own steps in C: the running loop's notifier, the wait history, and "
             "the one callback that wakes a crowd of asyncio futures.",
    .m_size = -1,
    .m_methods = module_methods,
};

static int add_type(PyObject *m, const char *name, PyTypeObject *type) {
    if (PyType_Ready(type) < 0) return -1;
    Py_INCREF(type);
    if (PyModule_AddObject(m, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__hotpath(void) {
    if (!(str_name = PyUnicode_InternFromString("name"))) return NULL;
    if (!(str___dict__ = PyUnicode_InternFromString("__dict__"))) return NULL;
    if (!(str_runner = PyUnicode_InternFromString("runner"))) return NULL;
    PyObject *thread = PyImport_ImportModule("_thread");
    if (thread == NULL) return NULL;
    thread_local_type = (PyTypeObject *)PyObject_GetAttrString(thread, "_local");
    Py_DECREF(thread);
    if (thread_local_type == NULL) return NULL;
    if (!PyType_Check(thread_local_type)) {
        PyErr_SetString(PyExc_TypeError, "_thread._local is not a type");
        return NULL;
    }
    if (!(str_notifier = PyUnicode_InternFromString("notifier"))) return NULL;
    if (!(str_serves = PyUnicode_InternFromString("_serves_running_loop"))) return NULL;
    if (!(str_asyncio = PyUnicode_InternFromString("asyncio"))) return NULL;
    if (!(str_trio = PyUnicode_InternFromString("trio"))) return NULL;
    if (!(str__closed_error = PyUnicode_InternFromString("_closed_error"))) return NULL;
    if (!(str_call_soon = PyUnicode_InternFromString("call_soon"))) return NULL;
    if (!(str_callbacks = PyUnicode_InternFromString("_callbacks"))) return NULL;
    if (!(str_remove_done_callback = PyUnicode_InternFromString("remove_done_callback")))
        return NULL;
    if (!(str_set_result = PyUnicode_InternFromString("set_result"))) return NULL;
    if (!(str_done = PyUnicode_InternFromString("done"))) return NULL;
    if (!(str_get_loop = PyUnicode_InternFromString("get_loop"))) return NULL;
    if (!(str_add_done_callback = PyUnicode_InternFromString("add_done_callback"))) return NULL;
    if (!(context_kwnames = Py_BuildValue("(s)", "context"))) return NULL;
    PyObject *collections = PyImport_ImportModule("collections");
    if (collections == NULL) return NULL;
    deque_type = (PyTypeObject *)PyObject_GetAttrString(collections, "deque");
    Py_DECREF(collections);
    if (deque_type == NULL) return NULL;
    if (!PyType_Check(deque_type)) {
        PyErr_SetString(PyExc_TypeError, "collections.deque is not a type");
        return NULL;
    }
    if (!(str_event_create = PyUnicode_InternFromString("event_create"))) return NULL;
    if (!(str_event_record = PyUnicode_InternFromString("event_record"))) return NULL;
    if (!(str_event_query = PyUnicode_InternFromString("event_query"))) return NULL;
    if (!(str_event_destroy = PyUnicode_InternFromString("event_destroy"))) return NULL;
    if (!(str_bare_yield = PyUnicode_InternFromString("bare_yield"))) return NULL;
    if (!(str_checkpoint = PyUnicode_InternFromString("checkpoint"))) return NULL;
    if (!(str__tally = PyUnicode_InternFromString("_tally"))) return NULL;
    if (!(str__wait_busy = PyUnicode_InternFromString("_wait_busy"))) return NULL;
    if (!(str__query_failed = PyUnicode_InternFromString("_query_failed"))) return NULL;
    if (!(str_throw = PyUnicode_InternFromString("throw"))) return NULL;
    if (!(str_close = PyUnicode_InternFromString("close"))) return NULL;
    if (!(str__wait_generic = PyUnicode_InternFromString("_wait_generic"))) return NULL;
    PyObject *m = PyModule_Create(&hotpath_module);
    if (m == NULL) return NULL;
    if (add_type(m, "LoopCheck", &LoopCheckType) < 0 || add_type(m, "Finder", &FinderType) < 0 ||
        add_type(m, "History", &HistoryType) < 0 || add_type(m, "Tally", &TallyType) < 0 ||
        PyType_Ready(&WaitType) < 0 ||
        PyType_Ready(&SpinRecordedType) < 0 ||
        PyModule_AddIntConstant(m, "PROBE_EVERY", PROBE_EVERY) < 0 ||
        PyModule_AddObject(m, "IDLE_SPIN", PyFloat_FromDouble(IDLE_SPIN)) < 0 ||
        !(wake_in_turn_fn = PyObject_GetAttrString(m, "wake_in_turn"))) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
