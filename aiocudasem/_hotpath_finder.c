/*
 * Finder: current_notifier(), the notifier that this thread used last (`here.notifier`), if no
 * release waits for a loop (`deferred` is empty) and it serves the running loop; else `slow()`.
 */
#include "_hotpath.h"

#define NAMES(X) X(notifier) X(serves_running_loop)
ACS_NAMES(NAMES)

/* The slot takes `n` for thread `me`, both before the old notifier goes (its release can run
 * Python code that calls the finder). */
static void remember(FinderObject *f, uint64_t me, PyObject *n) {
    PyObject *old = f->last;
    f->last = Py_NewRef(n);
    f->ident = me;
    Py_XDECREF(old);
}

PyObject *_acs_find_notifier(PyObject *self, PyObject *const *Py_UNUSED(args), size_t nargsf,
                             PyObject *kwnames) {
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
        n = PyObject_GetAttr(f->here, str.notifier);
        if (n == NULL) return NULL;
    }
    if (n != Py_None) {
        Py_ssize_t pending = PyObject_Length(f->deferred);
        if (pending < 0) goto error;
        if (pending == 0) {
            PyObject *check = PyObject_GetAttr(n, str.serves_running_loop);
            if (check == NULL) goto error;
            int ok;
            if (Py_IS_TYPE(check, &_acs_LoopCheckType.type)) {
                ok = _acs_loop_check((LoopCheckObject *)check);
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
    f->vectorcall = _acs_find_notifier;
    f->here = Py_NewRef(here);
    f->deferred = Py_NewRef(deferred);
    f->slow = Py_NewRef(slow);
    f->ident = 0;
    f->last = NULL;
    f->seen = NULL;
    f->seen_bare = 0;
    f->seen_counters = NULL;
    return (PyObject *)f;
}

static const Py_ssize_t Finder_refs[] = {
    offsetof(FinderObject, here), offsetof(FinderObject, deferred),
    offsetof(FinderObject, slow), offsetof(FinderObject, last),
    offsetof(FinderObject, seen), offsetof(FinderObject, seen_counters),
    0,
};

AcsType _acs_FinderType = {
    .type = {
        ACS_TYPE_HEAD("_hotpath.Finder", FinderObject,
                      Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL),
        .tp_doc = "Finder(here, deferred, slow)\n--\n\nCalled with no arguments, here.notifier if "
                  "deferred is empty and the notifier serves the running loop, else slow().",
        .tp_new = Finder_new,
        ACS_VECTORCALL_SLOTS(FinderObject),
        ACS_GC_SLOTS,
    },
    .refs = Finder_refs,
};

int _acs_finder_init(PyObject *module) {
    if (acs_intern_names() < 0) return -1;
    return acs_add_type(module, "Finder", &_acs_FinderType.type);
}

