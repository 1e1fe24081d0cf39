/*
 * Atomic access to a 64-bit word of host memory that a GPU also reads and writes: the value of
 * a host timeline (aiocudasem.HostTimeline).
 *
 * The GPU waits on the word with cuStreamWaitValue64 and writes it with cuStreamWriteValue64;
 * the host reads it with an acquire load and signals it with a release store, so that whatever
 * a producer thread wrote before signalling is visible to anyone who sees the new value. A
 * host signal only moves the value forward: advance() is a compare-and-swap loop that refuses
 * to lower it, so two host signallers cannot move a timeline back.
 *
 * The address is the caller's to keep valid (the timeline keeps its mapping until it is
 * released); these functions check only that it is non-NULL and 8-byte aligned. None of them
 * blocks, and none releases the GIL: each is a single atomic instruction or a short loop.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static int as_word(PyObject *o, uint64_t **out) {
    if (!PyLong_Check(o) || PyBool_Check(o)) {
        PyErr_Format(PyExc_TypeError, "an address is an int, not %.100s", Py_TYPE(o)->tp_name);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    if (v == 0 || (v & 7) != 0) {
        PyErr_Format(PyExc_ValueError, "address %llu is NULL or not 8-byte aligned", v);
        return -1;
    }
    *out = (uint64_t *)(uintptr_t)v;
    return 0;
}

static int as_value(PyObject *o, uint64_t *out) {
    if (!PyLong_Check(o) || PyBool_Check(o)) {
        PyErr_Format(PyExc_TypeError, "a value is an int, not %.100s", Py_TYPE(o)->tp_name);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *out = (uint64_t)v;
    return 0;
}

static int check_nargs(const char *name, Py_ssize_t nargs, Py_ssize_t want) {
    if (nargs == want) return 0;
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", name, want, nargs);
    return -1;
}

static PyObject *hw_load(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs) {
    uint64_t *word;
    if (check_nargs("load", nargs, 1) < 0 || as_word(args[0], &word) < 0) return NULL;
    return PyLong_FromUnsignedLongLong(__atomic_load_n(word, __ATOMIC_ACQUIRE));
}

static PyObject *hw_store(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs) {
    uint64_t *word, value;
    if (check_nargs("store", nargs, 2) < 0 || as_word(args[0], &word) < 0 ||
        as_value(args[1], &value) < 0)
        return NULL;
    __atomic_store_n(word, value, __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

static PyObject *hw_advance(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs) {
    /* advance(address, value) -> previous: store value unless the word holds more already.
     * Returns the value found; the store happened if and only if that is <= value. */
    uint64_t *word, value;
    if (check_nargs("advance", nargs, 2) < 0 || as_word(args[0], &word) < 0 ||
        as_value(args[1], &value) < 0)
        return NULL;
    uint64_t seen = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    while (seen <= value) {
        if (seen == value) break; /* already there: nothing to store */
        if (__atomic_compare_exchange_n(word, &seen, value, 1, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
            break;
    }
    return PyLong_FromUnsignedLongLong(seen);
}

static PyMethodDef methods[] = {
    {"load", (PyCFunction)(void (*)(void))hw_load, METH_FASTCALL,
     "load(address) -> int: the word at address (an acquire load)."},
    {"store", (PyCFunction)(void (*)(void))hw_store, METH_FASTCALL,
     "store(address, value) -> None: set the word (a release store)."},
    {"advance", (PyCFunction)(void (*)(void))hw_advance, METH_FASTCALL,
     "advance(address, value) -> int: set the word to value unless it holds more; return the "
     "value found (a compare-and-swap loop)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef hostword_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "aiocudasem._hostword",
    .m_doc = "Atomic loads and stores of a 64-bit word of host memory shared with the GPU.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__hostword(void) { return PyModule_Create(&hostword_module); }
