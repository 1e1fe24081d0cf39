/*
 * What the C files of aiocudasem._hotpath share (one extension module, several files by
 * concern; see _hotpath.c for the module itself):
 *
 *   _hotpath_loopcheck.c  LoopCheck: is the running loop still the one of a token?
 *   _hotpath_finder.c     Finder: current_notifier()
 *   _hotpath_history.c    History: a stream's wait times and its spin window
 *   _hotpath_state.c      WaitState (what a stream's waits share) and Counters (a notifier's)
 *   _hotpath_wait.c       wait_complete(): the wait algorithm, as a coroutine and as steps
 *   _hotpath_spin.c       the pooled event of a busy stream, and the spin on it
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
    /* For wait_complete(): the notifier whose checkpoint kind and counters were read last
     * (`bare_yield` and `counters` never change for a notifier), and those two. */
    PyObject *seen;
    int seen_bare;
    PyObject *seen_counters;
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
    double expect;    /* the predicted duration of a long wait, in seconds; < 0: none yet */
    double jitter;    /* the mean error of that prediction, in seconds */
    double lead;      /* how long before the predicted end its alarm is set; 0: not learnt */
    double spun;      /* a moving average of the spins after its alarms, in seconds */
    char closed;      /* the stream is closed (Stream._claim()): the wait raises after its checkpoint */
} HistoryObject;

extern AcsType _acs_HistoryType;
/* A wait that took `took` seconds, learnt (History.learn()). */
void _acs_learn(HistoryObject *h, double took);
/* How long the next wait may spin (History.spin_window()). */
double _acs_spin_window(HistoryObject *h);
PyObject *_acs_set_spin_limit(PyObject *module, PyObject *arg);
PyObject *_acs_get_spin_limit(PyObject *module, PyObject *ignored);
int _acs_history_init(PyObject *module);

/* ------------------------------------------------------------------ WaitState, Counters */

/* What every wait of one stream needs, made once with the stream (see docs/architecture.md,
 * "The hot path in C", for the contract). */
typedef struct {
    PyObject_HEAD
    PyObject *driver;  /* its stream_query(), event_query(), event_create(), event_record()
                        * and event_destroy() are called, by those names */
    PyObject *device;  /* an int: event_create(device) */
    PyObject *handle;  /* an int: the stream */
    PyObject *pool;    /* a list: the free events of the device */
    PyObject *history; /* a History */
    PyObject *hooks;   /* closed_error(), query_failed(state, exc), drive(wait) */
    PyObject *finder;  /* a Finder: current_notifier() */
    int record_first;  /* a default stream: its event is recorded before the checkpoint, and
                        * queried instead of the stream */
} WaitStateObject;

extern AcsType _acs_WaitStateType;

/* A notifier's counters that C keeps (Notifier.counters). */
typedef struct {
    PyObject_HEAD
    Py_ssize_t completed; /* waits that returned normally, counted in C */
    Py_ssize_t spinning;  /* waits spinning now (max_spinners) */
} CountersObject;

extern AcsType _acs_CountersType;
int _acs_state_init(PyObject *module);

/* ------------------------------------------------------------------ wait_complete() */

PyObject *_acs_wait_complete(PyObject *module, PyObject *state);
int _acs_wait_init(PyObject *module);

/* ------------------------------------------------------------------ the event and its spin */

#define IDLE_SPIN 20e-6

/* A pooled event (a free one, else driver.event_create(device)) recorded on the stream now:
 * a new reference, or NULL with an error set (the event went back). */
PyObject *_acs_take_recorded(WaitStateObject *s);
/* The event back to the pool, or destroyed if the pool is full (give_back()): 0, or -1 with
 * an error set. Takes the reference over. */
int _acs_give_event_back(WaitStateObject *s, PyObject *event);
/* The event back to the pool past its limit, with no call of the driver (for the ways out
 * that may run in a finalizer), the error that is set kept. Takes the reference over. */
void _acs_put_back(PyObject *pool, PyObject *event);
/* driver.event_query(event) (or stream_query(handle) if `event` is NULL), as 1 (done), 0 or
 * -1 (an error is set). */
int _acs_query(WaitStateObject *s, PyObject *event);
/* Whether a loop with the deque `ready` of ready callbacks (NULL or None: none to read) has
 * nothing else to run now. */
int _acs_loop_idle(PyObject *ready);
PyObject *_acs_set_pool_limit(PyObject *module, PyObject *arg);
int _acs_spin_init(PyObject *module);

/* ------------------------------------------------------------------ waking sleepers */

PyObject *_acs_wake_in_turn(PyObject *module, PyObject *futures);
PyObject *_acs_in_park_order(PyObject *module, PyObject *batches);
/* After the module's functions are in it: wake_in_turn() hands on to itself. */
int _acs_crowd_init(PyObject *module);

#pragma GCC visibility pop

#endif
