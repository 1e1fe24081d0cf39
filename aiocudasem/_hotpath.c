/*
 * The steps of every await that are not the loop's or the driver's: finding the running loop's
 * notifier, updating the stream's wait history, and the wait algorithm of
 * Stream.wait_complete() (its checkpoint, first query, spin and the decision to park). In
 * Python they cost more than the rest of an await of finished work put together (see
 * docs/architecture.md, "The hot path in C"); here they are a few field reads, one call of the
 * loop's own lookup and one of the driver's query. And, on asyncio, the one callback of the
 * loop that wakes a finished crowd of parked tasks (see "Waking a crowd" there).
 *
 * Nothing here blocks. Every object is an ordinary Python object, and C calls Python only
 * through the documented names of the contract (the driver's, the notifier's public methods,
 * a WaitState's hooks).
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
    {"wait_complete", _acs_wait_complete, METH_O,
     "wait_complete(state, /) -> Coroutine: Stream.wait_complete(), the wait algorithm on the "
     "stream of `state` (a WaitState): see docs/architecture.md, \"The hot path in C\"."},
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

/* Each file's part of the module, in this order: wake_in_turn() hands on to itself, so the
 * crowd's comes once the functions are in the module. */
static int hotpath_init(PyObject *m) {
    if (_acs_loopcheck_init(m) < 0 || _acs_finder_init(m) < 0 || _acs_history_init(m) < 0 ||
        _acs_state_init(m) < 0 || _acs_wait_init(m) < 0 || _acs_spin_init(m) < 0 ||
        _acs_crowd_init(m) < 0)
        return -1;
    return 0;
}

ACS_MODULE(_hotpath,
           "The await's own steps in C: the running loop's notifier, the wait history, and the "
           "one callback that wakes a crowd of asyncio futures.",
           module_methods, hotpath_init)
