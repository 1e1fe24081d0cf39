/*
 * What the C files of aiocudasem._hotpath share (one extension module, several files by
 * concern; see _hotpath.c for the module itself):
 *
 *   _hotpath_loopcheck.c  LoopCheck: is the running loop still the one of a token?
 *   _hotpath_finder.c     Finder: current_notifier()
 *   _hotpath_history.c    History: a stream's wait times and its spin window
 *   _hotpath_wait.c       wait_complete() and settle(), with Tally
 *   _hotpath_spin.c       spin_recorded(): the asyncio event path's spin
 *   _hotpath_crowd.c      wake_in_turn() and in_park_order(): waking parked sleepers
 *
 * Each file keeps to itself what the others do not need (its interned names included) and
 * has an init function that the module's calls. The names that cross files start with
 * `_acs_` and are not exported from the shared object.
 */
#ifndef AIOCUDASEM_HOTPATH_H
#define AIOCUDASEM_HOTPATH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <time.h>

#include "_acs.h"

#pragma GCC visibility push(hidden)

/* time.perf_counter(), the same double: CLOCK_MONOTONIC in nanoseconds, converted as CPython
 * converts it (_PyTime_AsSecondsDouble), so that the start it hands back compares exactly with
 * the Python clock's readings. */
static inline double _acs_perf_counter(void) {
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

/* Interns each name into its slot, up to the {NULL, NULL} that ends `names`: 0, or -1 with an
 * error set. */
typedef struct {
    PyObject **slot;
    const char *text;
} AcsName;

int _acs_intern(const AcsName *names);

/* PyType_Ready(), then the type as the module's attribute `name` (NULL: not added). */
int _acs_add_type(PyObject *module, const char *name, PyTypeObject *type);

/* ------------------------------------------------------------------ LoopCheck */

typedef struct LoopCheckObject LoopCheckObject;
extern AcsType _acs_LoopCheckType;
/* 1: the running loop is the check's token's; 0: it is not; -1: an exception is set. */
int _acs_loop_check(LoopCheckObject *c);
int _acs_loopcheck_init(PyObject *module);

/* ------------------------------------------------------------------ Finder */

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

extern AcsType _acs_FinderType;
PyObject *_acs_find_notifier(PyObject *self, PyObject *const *args, size_t nargsf,
                             PyObject *kwnames);
int _acs_finder_init(PyObject *module);

/* ------------------------------------------------------------------ History */

#define PROBE_EVERY 16 /* a stream whose waits are long still spins on one wait in this many */

typedef struct {
    PyObject_HEAD
    PyObject *newest; /* the newest point a wait_complete() parked on, or None */
    double recent;    /* a moving average of the wait times in seconds; < 0: none yet */
    int unspun;       /* waits that did not spin since the last that did */
    char closed;      /* the stream is closed (Stream._claim()): settle() raises */
} HistoryObject;

extern AcsType _acs_HistoryType;
/* A wait that took `took` seconds, learnt (History.learn()). */
void _acs_learn(HistoryObject *h, double took);
/* How long the next wait may spin (History.spin_window()). */
double _acs_spin_window(HistoryObject *h);
PyObject *_acs_set_spin_limit(PyObject *module, PyObject *arg);
PyObject *_acs_get_spin_limit(PyObject *module, PyObject *ignored);
int _acs_history_init(PyObject *module);

/* ------------------------------------------------------------------ wait_complete() */

PyObject *_acs_settle(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *_acs_wait_complete(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
int _acs_wait_init(PyObject *module);

/* ------------------------------------------------------------------ spin_recorded() */

PyObject *_acs_spin_recorded(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *_acs_set_pool_limit(PyObject *module, PyObject *arg);
int _acs_spin_init(PyObject *module);

/* ------------------------------------------------------------------ waking sleepers */

PyObject *_acs_wake_in_turn(PyObject *module, PyObject *futures);
PyObject *_acs_in_park_order(PyObject *module, PyObject *batches);
/* After the module's functions are in it: wake_in_turn() hands on to itself. */
int _acs_crowd_init(PyObject *module);

#pragma GCC visibility pop

#endif
