/*
 * The two steps of every await that are not the loop's or the driver's: finding the running
 * loop's notifier, and updating the stream's wait history. In Python they cost more than the
 * rest of an await of finished work put together (see docs/architecture.md, "The hot path in
 * C"); here they are a few attribute reads and one call of the loop's own lookup.
 *
 * Nothing here calls CUDA or blocks. Every object is an ordinary Python object: the logic is the
 * one the Python modules describe (_notifier/_loop.py, _notifier/_points.py), moved, not
 * changed.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

static PyObject *str_name, *str_notifier, *str_serves, *str_asyncio, *str_trio;

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
} LoopCheckObject;

static PyTypeObject LoopCheckType;

static int is_str(PyObject *v, PyObject *s) {
    return PyUnicode_Check(v) && PyUnicode_Compare(v, s) == 0;
}

/* 1: it is the token's loop; 0: it is not; -1: an exception is set. */
static int loop_check(LoopCheckObject *c) {
    if (c->local != Py_None) {
        PyObject *name = PyObject_GetAttr(c->local, str_name);
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
    static char *kwlist[] = {"library", "token", "probe", "local", "cvar", NULL};
    PyObject *library, *token, *probe, *local, *cvar;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "UOOOO:LoopCheck", kwlist, &library, &token,
                                     &probe, &local, &cvar))
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
    LoopCheckObject *c = (LoopCheckObject *)type->tp_alloc(type, 0);
    if (c == NULL) return NULL;
    c->vectorcall = LoopCheck_vectorcall;
    c->kind = kind;
    c->token = Py_NewRef(token);
    c->probe = Py_NewRef(probe);
    c->local = Py_NewRef(local);
    c->cvar = Py_NewRef(cvar);
    return (PyObject *)c;
}

static int LoopCheck_traverse(LoopCheckObject *c, visitproc visit, void *arg) {
    Py_VISIT(c->token);
    Py_VISIT(c->probe);
    Py_VISIT(c->local);
    Py_VISIT(c->cvar);
    return 0;
}

static int LoopCheck_clear(LoopCheckObject *c) {
    Py_CLEAR(c->token);
    Py_CLEAR(c->probe);
    Py_CLEAR(c->local);
    Py_CLEAR(c->cvar);
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
    .tp_doc = "LoopCheck(library, token, probe, local, cvar)\n--\n\nCalled with no arguments, True "
              "while the running loop is the token's ('asyncio' or 'trio'; see "
              "_loop._running_check()).",
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
} FinderObject;

static PyObject *Finder_vectorcall(PyObject *self, PyObject *const *Py_UNUSED(args),
                                   size_t nargsf, PyObject *kwnames) {
    FinderObject *f = (FinderObject *)self;
    if (PyVectorcall_NARGS(nargsf) != 0 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "current_notifier() takes no arguments");
        return NULL;
    }
    PyObject *n = PyObject_GetAttr(f->here, str_notifier);
    if (n == NULL) return NULL;
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
            if (ok) return n;
        }
    }
    Py_DECREF(n);
    return PyObject_CallNoArgs(f->slow);
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
    return (PyObject *)f;
}

static int Finder_traverse(FinderObject *f, visitproc visit, void *arg) {
    Py_VISIT(f->here);
    Py_VISIT(f->deferred);
    Py_VISIT(f->slow);
    return 0;
}

static int Finder_clear(FinderObject *f) {
    Py_CLEAR(f->here);
    Py_CLEAR(f->deferred);
    Py_CLEAR(f->slow);
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
    return (PyObject *)h;
}

static PyObject *History_learn(HistoryObject *h, PyObject *arg) {
    double took = PyFloat_AsDouble(arg);
    if (took == -1.0 && PyErr_Occurred()) return NULL;
    double old = h->recent;
    if (old < 0 || (old > spin_limit && spin_limit >= took))
        h->recent = took;
    else
        h->recent = 0.75 * old + 0.25 * took;
    Py_RETURN_NONE;
}

static PyObject *History_spin_window(HistoryObject *h, PyObject *Py_UNUSED(ignored)) {
    double limit = spin_limit, recent = h->recent;
    if (recent < 0) return PyFloat_FromDouble(limit);
    if (recent > limit) {
        if (h->unspun < PROBE_EVERY - 1) { /* also for any value set from outside */
            h->unspun++;
            return PyFloat_FromDouble(0.0);
        }
        h->unspun = 0;
        return PyFloat_FromDouble(limit);
    }
    double window = 2.0 * recent + 20e-6;
    return PyFloat_FromDouble(window < limit ? window : limit);
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

/* ------------------------------------------------------------------ module */

static PyMethodDef module_methods[] = {
    {"set_spin_limit", set_spin_limit, METH_O,
     "set_spin_limit(seconds): the spin limit that History uses (configure() calls it)."},
    {"get_spin_limit", get_spin_limit, METH_NOARGS,
     "get_spin_limit() -> float: the spin limit that History uses."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef hotpath_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "aiocudasem._hotpath",
    .m_doc = "The await's own steps in C: the running loop's notifier and the wait history.",
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
    if (!(str_notifier = PyUnicode_InternFromString("notifier"))) return NULL;
    if (!(str_serves = PyUnicode_InternFromString("_serves_running_loop"))) return NULL;
    if (!(str_asyncio = PyUnicode_InternFromString("asyncio"))) return NULL;
    if (!(str_trio = PyUnicode_InternFromString("trio"))) return NULL;
    PyObject *m = PyModule_Create(&hotpath_module);
    if (m == NULL) return NULL;
    if (add_type(m, "LoopCheck", &LoopCheckType) < 0 || add_type(m, "Finder", &FinderType) < 0 ||
        add_type(m, "History", &HistoryType) < 0 ||
        PyModule_AddIntConstant(m, "PROBE_EVERY", PROBE_EVERY) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
