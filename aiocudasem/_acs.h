/*
 * What the C extensions share: the error helpers that differ between Python versions, the
 * module and type boilerplate (ACS_MODULE(), ACS_TYPE_HEAD(), acs_add_type(), interned names,
 * the checks of a plain int argument), and the skeleton of a hand-written awaitable (an object
 * that is its own iterator, as a coroutine is).
 *
 * The extensions are separate modules, so everything here is `static inline`: each one that
 * includes this header gets its own copy of what it uses.
 *
 * An awaitable's type is an AcsType: a PyTypeObject with what the shared functions need to
 * know of the type after it (the offsets of its object references; its hooks as an
 * awaitable). Such a type must not be subclassable (no Py_TPFLAGS_BASETYPE): the shared
 * functions find that tail behind Py_TYPE(self).
 *
 * An awaitable starts with AcsAwait (its `state`: 0 until its first step, the rest the type's;
 * `executing`: inside a call of Python that the step made). Its step is its am_send, called
 * directly by the loop and by `await`; next(), send(), throw() and close() are the shared
 * functions below, which call it through the type and end as a generator's methods do.
 */
#ifndef AIOCUDASEM_ACS_H
#define AIOCUDASEM_ACS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* ------------------------------------------------------------------ errors */

/* The error that is set, taken (NULL if none): a normalized exception that holds its
 * traceback, as PyErr_GetRaisedException() has it from Python 3.12 on. */
static inline PyObject *acs_err_take(void) {
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    if (type == NULL) return NULL;
    PyErr_NormalizeException(&type, &exc, &tb);
    if (tb != NULL) PyException_SetTraceback(exc, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return exc;
#endif
}

/* Sets `exc` (taken by acs_err_take()) again, taking over the reference; NULL clears. */
static inline void acs_err_give(PyObject *exc) {
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(exc);
#else
    if (exc == NULL) {
        PyErr_Clear();
        return;
    }
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(exc)), exc, PyException_GetTraceback(exc));
#endif
}

/* A StopIteration that a step raised, as PEP 479 turns one from a generator's body into
 * RuntimeError: through next(), it would otherwise end the await with its value. */
static inline void acs_stop_iteration_to_runtime_error(void) {
    if (!PyErr_ExceptionMatches(PyExc_StopIteration)) return;
    PyObject *cause = acs_err_take();
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

/* The value that ended a delegate with StopIteration (a new reference), the error cleared; or
 * NULL, the error left set, if it was another one. */
static inline PyObject *acs_stop_value(void) {
    if (!PyErr_ExceptionMatches(PyExc_StopIteration)) return NULL;
    PyObject *exc = acs_err_take();
    PyObject *v = Py_NewRef(((PyStopIterationObject *)exc)->value);
    Py_DECREF(exc);
    return v;
}

/* throw()'s arguments, counted: 0, or -1 with TypeError set. */
static inline int acs_throw_args(Py_ssize_t nargs) {
    if (nargs >= 1 && nargs <= 3) return 0;
    PyErr_Format(PyExc_TypeError, "throw() takes 1 to 3 arguments, got %zd", nargs);
    return -1;
}

/* The error that throw(exc) or throw(type[, value[, traceback]]) raises, set: always NULL. */
static inline PyObject *acs_raise_thrown(PyObject *const *args, Py_ssize_t nargs) {
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
        PyObject *exc = acs_err_take();
        PyException_SetTraceback(exc, tb);
        acs_err_give(exc);
    }
    return NULL;
}

/* ------------------------------------------------------------------ modules */

/* Makes the module of `def`, then init(module) (0, or -1 with an error set; NULL: none). */
static inline PyObject *acs_module_create(struct PyModuleDef *def, int (*init)(PyObject *)) {
    PyObject *m = PyModule_Create(def);
    if (m != NULL && init != NULL && init(m) < 0) Py_CLEAR(m);
    return m;
}

/* The extension module aiocudasem.<name> (name as `_notify`): its PyModuleDef, with its doc,
 * methods (a PyMethodDef table) and no state, and its PyInit_<name>(), which makes it and calls
 * init(module) (NULL: nothing more to do). */
#define ACS_MODULE(name, doc, methods, init)                                                    \
    static struct PyModuleDef name##_def = {                                                    \
        PyModuleDef_HEAD_INIT,                                                                  \
        .m_name = "aiocudasem." #name,                                                          \
        .m_doc = (doc),                                                                         \
        .m_size = -1,                                                                           \
        .m_methods = (methods),                                                                 \
    };                                                                                          \
    PyMODINIT_FUNC PyInit_##name(void) { return acs_module_create(&name##_def, (init)); }

/* PyType_Ready(type), then the type as the module's attribute `name` (NULL: not added): 0, or
 * -1 with an error set. */
static inline int acs_add_type(PyObject *module, const char *name, PyTypeObject *type) {
    if (PyType_Ready(type) < 0) return -1;
    if (name == NULL) return 0;
    Py_INCREF(type);
    if (PyModule_AddObject(module, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

/* A module's types, ended by {NULL, NULL}, each as acs_add_type() adds it. */
typedef struct {
    const char *name;
    PyTypeObject *type;
} AcsTypeEntry;

static inline int acs_add_types(PyObject *module, const AcsTypeEntry *types) {
    for (; types->type != NULL; types++)
        if (acs_add_type(module, types->name, types->type) < 0) return -1;
    return 0;
}

/* The type `name` of module `module` (a new reference), or NULL with an error set. */
static inline PyTypeObject *acs_import_type(const char *module, const char *name) {
    PyObject *m = PyImport_ImportModule(module);
    if (m == NULL) return NULL;
    PyObject *t = PyObject_GetAttrString(m, name);
    Py_DECREF(m);
    if (t != NULL && !PyType_Check(t)) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not a type", module, name);
        Py_CLEAR(t);
    }
    return (PyTypeObject *)t;
}

/* The names a file looks up (attributes, methods), interned once. A file lists them once,
 *
 *     #define NAMES(X) X(call_soon) X(_callbacks) X(set_result)
 *     ACS_NAMES(NAMES)
 *
 * which declares `str`, a struct with one PyObject * per name (str.call_soon, ...), and
 * acs_intern_names(), for the file's init: 0, or -1 with an error set. */
#define ACS_NAME_SLOT_(name) PyObject *name;
#define ACS_NAME_TEXT_(name) #name "\0"
#define ACS_NAMES(list)                                                                         \
    static struct {                                                                             \
        list(ACS_NAME_SLOT_)                                                                    \
    } str;                                                                                      \
    static int acs_intern_names(void) {                                                         \
        return acs_intern((PyObject **)&str, sizeof str / sizeof(PyObject *),                   \
                          list(ACS_NAME_TEXT_));                                                \
    }

/* Interns the `n` texts that follow each other in `texts` (each ended by a NUL) into `slots`. */
static inline int acs_intern(PyObject **slots, size_t n, const char *texts) {
    for (size_t i = 0; i < n; i++, texts += strlen(texts) + 1)
        if ((slots[i] = PyUnicode_InternFromString(texts)) == NULL) return -1;
    return 0;
}

/* ------------------------------------------------------------------ arguments */

/* 0, or -1 with TypeError set unless a function got `want` positional arguments. */
static inline int acs_check_nargs(const char *name, Py_ssize_t nargs, Py_ssize_t want) {
    if (nargs == want) return 0;
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", name, want, nargs);
    return -1;
}

/* 0, or -1 with TypeError set if the constructor of `type` got any argument. */
static inline int acs_no_args(const char *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) == 0 && (kwds == NULL || PyDict_GET_SIZE(kwds) == 0)) return 0;
    PyErr_Format(PyExc_TypeError, "%s() takes no arguments", type);
    return -1;
}

/* A plain int (not a bool) from 0 to 2**64-1, `what` naming it in the TypeError: 0, or -1 with
 * an error set. */
static inline int acs_as_u64(PyObject *o, const char *what, unsigned long long *out) {
    if (!PyLong_Check(o) || PyBool_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s is an int, not %.100s", what, Py_TYPE(o)->tp_name);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *out = v;
    return 0;
}

/* ------------------------------------------------------------------ the types */

typedef struct {
    /* As the errors name the awaitable: "wait_complete()". */
    const char *name;
    /* send() of a value other than None before the first step raises, as a coroutine's does. */
    int strict_send;
    /* close(), past the reentry check: the wait ends now and lets go of what it holds; 0, or -1
     * with an error set. throw() does it too, before it raises, unless `thrown` is set. */
    int (*end)(PyObject *self);
    /* throw(), past the argument and reentry checks, for an awaitable that delegates: raise
     * where it is suspended. NULL: end(), then raise the thrown error. */
    PyObject *(*thrown)(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
    /* The await's value could not be put in a StopIteration (no memory) and is about to be
     * dropped: for what it holds. NULL: nothing to do. */
    void (*lost)(PyObject *self, PyObject *value);
} AcsAwaitHooks;

typedef struct {
    PyTypeObject type;
    /* The offsets of the object's references (PyObject *, or NULL), ending with 0: what
     * acs_traverse() visits and acs_clear() clears. NULL: none. */
    const Py_ssize_t *refs;
    /* An awaitable's hooks; NULL for another type. */
    const AcsAwaitHooks *await;
} AcsType;

static inline const AcsType *acs_type(PyObject *self) {
    return (const AcsType *)Py_TYPE(self);
}

/* tp_traverse and tp_clear of an AcsType, from its `refs`. */
static inline int acs_traverse(PyObject *self, visitproc visit, void *arg) {
    const Py_ssize_t *off = acs_type(self)->refs;
    for (; off != NULL && *off != 0; off++) Py_VISIT(*(PyObject **)((char *)self + *off));
    return 0;
}

static inline int acs_clear(PyObject *self) {
    const Py_ssize_t *off = acs_type(self)->refs;
    for (; off != NULL && *off != 0; off++) Py_CLEAR(*(PyObject **)((char *)self + *off));
    return 0;
}

/* The head of an extension type's PyTypeObject: its name in the package ("_module.Name"), the
 * struct of its objects, and its flags besides Py_TPFLAGS_DEFAULT. */
#define ACS_TYPE_HEAD(qualname, Struct, flags)                                                 \
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "aiocudasem." qualname,                            \
    .tp_basicsize = sizeof(Struct), .tp_flags = Py_TPFLAGS_DEFAULT | (flags)

/* The collection slots of an AcsType whose references are all in its `refs` (the flags take
 * Py_TPFLAGS_HAVE_GC). */
#define ACS_GC_SLOTS .tp_traverse = acs_traverse, .tp_clear = acs_clear, .tp_dealloc = acs_dealloc

/* The call slots of a type whose objects are called through the field `vectorcall` of `Struct`
 * (the flags take Py_TPFLAGS_HAVE_VECTORCALL). */
#define ACS_VECTORCALL_SLOTS(Struct)                                                            \
    .tp_vectorcall_offset = offsetof(Struct, vectorcall), .tp_call = PyVectorcall_Call

/* tp_dealloc of a collected type: its finalizer first (if it has one and the object survives
 * it, no more), then its tp_clear. */
static inline void acs_dealloc(PyObject *self) {
    PyTypeObject *t = Py_TYPE(self);
    if (t->tp_finalize != NULL && PyObject_CallFinalizerFromDealloc(self) < 0) return;
    PyObject_GC_UnTrack(self);
    t->tp_clear(self);
    t->tp_free(self);
}

/* ------------------------------------------------------------------ awaitables */

typedef struct {
    PyObject_HEAD
    int state;     /* 0: not stepped yet; what follows is the type's */
    int executing; /* inside a call of Python from a step: a step, throw() and close() refuse */
} AcsAwait;

/* __await__() and __iter__(): the object itself. */
static inline PyObject *acs_return_self(PyObject *self) {
    return Py_NewRef(self);
}

/* 0, or -1 with ValueError set if a step of `self` is executing. */
static inline int acs_refuse_reentry(PyObject *self) {
    if (!((AcsAwait *)self)->executing) return 0;
    PyErr_Format(PyExc_ValueError, "%s already executing", acs_type(self)->await->name);
    return -1;
}

/* A step as next() and send() end it: the yielded value; or NULL with the await's value in a
 * StopIteration (for None, only if `stop_none`: next() sets none), or with the step's error,
 * a StopIteration of which turns into RuntimeError. */
static inline PyObject *acs_await_ended(PyObject *self, PySendResult s, PyObject *r,
                                        int stop_none) {
    if (s == PYGEN_NEXT) return r;
    if (s == PYGEN_RETURN) {
        if (r != Py_None) { /* wrapped: StopIteration would take a tuple as its args */
            PyObject *stop = PyObject_CallOneArg(PyExc_StopIteration, r);
            if (stop != NULL) {
                PyErr_SetObject(PyExc_StopIteration, stop);
                Py_DECREF(stop);
            } else if (acs_type(self)->await->lost != NULL) {
                acs_type(self)->await->lost(self, r);
            }
        } else if (stop_none) {
            PyErr_SetNone(PyExc_StopIteration);
        }
        Py_DECREF(r);
    } else {
        acs_stop_iteration_to_runtime_error();
    }
    return NULL;
}

/* tp_iternext. */
static inline PyObject *acs_await_next(PyObject *self) {
    PyObject *r;
    PySendResult s = Py_TYPE(self)->tp_as_async->am_send(self, Py_None, &r);
    return acs_await_ended(self, s, r, 0);
}

/* send(value), a method (METH_O). */
static inline PyObject *acs_await_send(PyObject *self, PyObject *value) {
    const AcsAwaitHooks *hooks = acs_type(self)->await;
    if (hooks->strict_send && ((AcsAwait *)self)->state == 0 && value != Py_None) {
        PyErr_Format(PyExc_TypeError, "can't send non-None value to a just-started %s",
                     hooks->name);
        return NULL;
    }
    PyObject *r;
    PySendResult s = Py_TYPE(self)->tp_as_async->am_send(self, value, &r);
    return acs_await_ended(self, s, r, 1);
}

/* throw(exc) or throw(type[, value[, traceback]]), a method (METH_FASTCALL). */
static inline PyObject *acs_await_throw(PyObject *self, PyObject *const *args,
                                        Py_ssize_t nargs) {
    const AcsAwaitHooks *hooks = acs_type(self)->await;
    if (acs_throw_args(nargs) < 0 || acs_refuse_reentry(self) < 0) return NULL;
    if (hooks->thrown != NULL) return hooks->thrown(self, args, nargs);
    if (hooks->end(self) < 0) return NULL;
    return acs_raise_thrown(args, nargs);
}

/* close(), a method (METH_NOARGS). */
static inline PyObject *acs_await_close(PyObject *self, PyObject *Py_UNUSED(ignored)) {
    if (acs_refuse_reentry(self) < 0 || acs_type(self)->await->end(self) < 0) return NULL;
    Py_RETURN_NONE;
}

#endif
