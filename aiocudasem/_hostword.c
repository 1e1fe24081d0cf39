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
#include <stdint.h>

#include "_acs.h"

static int as_word(PyObject *o, uint64_t **out) {
    unsigned long long v;
    if (acs_as_u64(o, "an address", &v) < 0) return -1;
    if (v == 0 || (v & 7) != 0) {
        PyErr_Format(PyExc_ValueError, "address %llu is NULL or not 8-byte aligned", v);
        return -1;
    }
    *out = (uint64_t *)(uintptr_t)v;
    return 0;
}

static int as_value(PyObject *o, uint64_t *out) {
    unsigned long long v;
    if (acs_as_u64(o, "a value", &v) < 0) return -1;
    *out = (uint64_t)v;
    return 0;
}

static PyObject *hw_load(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs) {
    uint64_t *word;
    if (acs_check_nargs("load", nargs, 1) < 0 || as_word(args[0], &word) < 0) return NULL;
    return PyLong_FromUnsignedLongLong(__atomic_load_n(word, __ATOMIC_ACQUIRE));
}

static PyObject *hw_store(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs) {
    uint64_t *word, value;
    if (acs_check_nargs("store", nargs, 2) < 0 || as_word(args[0], &word) < 0 ||
        as_value(args[1], &value) < 0)
        return NULL;
    __atomic_store_n(word, value, __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

static PyObject *hw_advance(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs) {
    /* advance(address, value) -> previous: store value unless the word holds more already.
     * Returns the value found; the store happened if and only if that is <= value. */
    uint64_t *word, value;
    if (acs_check_nargs("advance", nargs, 2) < 0 || as_word(args[0], &word) < 0 ||
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

ACS_MODULE(_hostword,
           "Atomic loads and stores of a 64-bit word of host memory shared with the GPU.",
           methods, NULL)
