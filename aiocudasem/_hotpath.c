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
 *
 * This file is the module: its functions and its init. The rest is in the files that
 * _hotpath.h lists, by concern.
 */
#include "_hotpath.h"

static PyMethodDef module_methods[] = {
    {"set_spin_limit", _acs_set_spin_limit, METH_O,
     "set_spin_limit(seconds): the spin limit that History uses (configure() calls it)."},
    {"get_spin_limit", _acs_get_spin_limit, METH_NOARGS,
     "get_spin_limit() -> float: the spin limit that History uses."},
    {"settle", (PyCFunction)(void (*)(void))_acs_settle, METH_FASTCALL,
     "settle(stream, query, handle, history, started, /) -> bool: after the first checkpoint "
     "of stream.wait_complete(), which began at `started` (a perf_counter()): raise "
     "stream._closed_error() if the history says the stream was closed meanwhile, else "
     "query(handle); if the stream is idle, have the history learn how long the wait took, "
     "and return True."},
    {"wait_complete", (PyCFunction)(void (*)(void))_acs_wait_complete, METH_FASTCALL,
     "wait_complete(stream, query, handle, history, finder, /) -> Coroutine: "
     "Stream.wait_complete() on a stream other than the default ones. Finds the notifier with "
     "`finder`, passes its checkpoint (asyncio: one bare yield; else notifier.checkpoint(), "
     "delegated to), then settle(); idle: counts the completed wait in notifier._tally; busy: "
     "delegates to stream._wait_busy(notifier, started); a failed first query raises through "
     "stream._query_failed(exc). In a thread whose last wait ran on a loop with a checkpoint "
     "coroutine (trio): stream._wait_generic() instead."},
    {"spin_recorded", (PyCFunction)(void (*)(void))_acs_spin_recorded, METH_FASTCALL,
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
    {"set_pool_limit", _acs_set_pool_limit, METH_O,
     "set_pool_limit(n): how many free events a pool keeps (_EventPool._LIMIT)."},
    {"wake_in_turn", _acs_wake_in_turn, METH_O,
     "wake_in_turn(futures, /): for each asyncio future of the list that is not done yet, in "
     "order: take its done callbacks off, mark it done as set_result(None) does, and run those "
     "callbacks at once, each in its context (a callback of the loop runs it). A future whose "
     "callbacks cannot be read from `_callbacks` gets plain set_result(None). If anything "
     "raises, that future is woken as set_result() would wake it, the rest go to a new "
     "call_soon(wake_in_turn, rest), and the error propagates."},
    {"in_park_order", _acs_in_park_order, METH_O,
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

int _acs_intern(const AcsName *names) {
    for (; names->slot != NULL; names++)
        if (!(*names->slot = PyUnicode_InternFromString(names->text))) return -1;
    return 0;
}

int _acs_add_type(PyObject *module, const char *name, PyTypeObject *type) {
    if (PyType_Ready(type) < 0) return -1;
    if (name == NULL) return 0;
    Py_INCREF(type);
    if (PyModule_AddObject(module, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__hotpath(void) {
    PyObject *m = PyModule_Create(&hotpath_module);
    if (m == NULL) return NULL;
    if (_acs_loopcheck_init(m) < 0 || _acs_finder_init(m) < 0 || _acs_history_init(m) < 0 ||
        _acs_wait_init(m) < 0 || _acs_spin_init(m) < 0 || _acs_crowd_init(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
