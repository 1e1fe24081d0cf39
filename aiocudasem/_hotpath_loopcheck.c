/*
 * LoopCheck: is the running loop still the one of `token`? At least as strict as sniffio's
 * detection, as _loop._running_check() explains:
 *   asyncio: sniffio's thread-local name is unset, its context variable names asyncio or
 *            nothing, and asyncio's running loop is the token;
 *   trio:    sniffio's thread-local name is "trio" and trio's current token is the token
 *            (outside trio.run it raises RuntimeError: not the loop).
 * Without sniffio, `local` and `cvar` are None and only the probe decides.
 */
#include "_hotpath.h"

#define NAMES(X) X(name) X(__dict__) X(runner) X(asyncio) X(trio)
ACS_NAMES(NAMES)

enum { KIND_ASYNCIO = 0, KIND_TRIO = 1 };

struct LoopCheckObject {
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
};

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
        PyObject *d = PyObject_GetAttr(local, str.__dict__);
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
    PyObject *d = PyObject_GetAttr((PyObject *)t, str.name);
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
    if (c->generic) return PyObject_GetAttr(c->local, str.name);
    PyObject *d = thread_dict(c->local, &c->ldict, &c->tsid);
    if (d == NULL) {
        if (PyErr_Occurred()) return NULL;
        c->generic = 1;
        return PyObject_GetAttr(c->local, str.name);
    }
    PyObject *v = PyDict_GetItemWithError(d, str.name); /* borrowed */
    if (v == NULL) {
        if (PyErr_Occurred()) return NULL;
        v = class_name(c);
        if (v == NULL) {
            if (PyErr_Occurred()) return NULL;
            c->generic = 1;
            return PyObject_GetAttr(c->local, str.name);
        }
    }
    return Py_NewRef(v);
}

/* 1: it is the token's loop; 0: it is not; -1: an exception is set. */
int _acs_loop_check(LoopCheckObject *c) {
    if (c->local != Py_None) {
        PyObject *name = local_name(c);
        if (name == NULL) return -1;
        int ok = c->kind == KIND_ASYNCIO ? name == Py_None : is_str(name, str.trio);
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
        int ok = v == Py_None || is_str(v, str.asyncio);
        Py_XDECREF(v);
        if (!ok) return 0;
    }
    if (c->runner != NULL) {
        PyObject *d = thread_dict(c->context, &c->cdict, &c->ctsid);
        if (d != NULL) {
            PyObject *runner = PyDict_GetItemWithError(d, str.runner); /* borrowed */
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
    int ok = _acs_loop_check((LoopCheckObject *)self);
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
    if (PyUnicode_Compare(library, str.asyncio) == 0) {
        kind = KIND_ASYNCIO;
    } else if (PyUnicode_Compare(library, str.trio) == 0) {
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

static const Py_ssize_t LoopCheck_refs[] = {
    offsetof(LoopCheckObject, token),   offsetof(LoopCheckObject, probe),
    offsetof(LoopCheckObject, local),   offsetof(LoopCheckObject, cvar),
    offsetof(LoopCheckObject, ldict),   offsetof(LoopCheckObject, default_name),
    offsetof(LoopCheckObject, context), offsetof(LoopCheckObject, runner),
    offsetof(LoopCheckObject, cdict),   0,
};

/* Cleared, the local's name is read the generic way: there is no cached dict to read. */
static int LoopCheck_clear(PyObject *self) {
    ((LoopCheckObject *)self)->generic = 1;
    return acs_clear(self);
}

AcsType _acs_LoopCheckType = {
    .type = {
        ACS_TYPE_HEAD("_hotpath.LoopCheck", LoopCheckObject,
                      Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL),
        .tp_doc = "LoopCheck(library, token, probe, local, cvar, *, context=None, runner=None)"
                  "\n--\n\n"
                  "Called with no arguments, True while the running loop is the token's ('asyncio' "
                  "or 'trio'; see _loop._running_check()). For trio, `context` and `runner`: the "
                  "thread-local that holds the running Runner, and the token's, read instead of "
                  "calling the probe.",
        .tp_new = LoopCheck_new,
        ACS_VECTORCALL_SLOTS(LoopCheckObject),
        .tp_traverse = acs_traverse,
        .tp_clear = LoopCheck_clear,
        .tp_dealloc = acs_dealloc,
    },
    .refs = LoopCheck_refs,
};

int _acs_loopcheck_init(PyObject *module) {
    if (acs_intern_names() < 0) return -1;
    if ((thread_local_type = acs_import_type("_thread", "_local")) == NULL) return -1;
    return acs_add_type(module, "LoopCheck", &_acs_LoopCheckType.type);
}

