/*
 * WaitState and Counters: the two objects through which the wait in C and the Python around it
 * meet (see docs/architecture.md, "The hot path in C", for the contract).
 *
 * A WaitState is made once per Stream and holds what each of its waits needs: the driver, the
 * device, the handle, the pool of free events, the history, the hooks (the Python that C may
 * call, by the names below) and the finder. It is read-only once made. Counters are a
 * notifier's counts that C keeps; the notifier reads them (statistics(), may_spin()).
 */
#include "_hotpath.h"

/* ------------------------------------------------------------------ WaitState */

PyDoc_STRVAR(WaitState_doc, "WaitState(driver, device, handle, pool, history, hooks, finder, *, "
             "record_first=False)\n--\n\nWhat the waits of one stream share: wait_complete() "
             "takes it.");
static PyObject *WaitState_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"driver", "device",  "handle",       "pool", "history",
                             "hooks",  "finder", "record_first", NULL};
    PyObject *driver, *device, *handle, *pool, *history, *hooks, *finder;
    int record_first = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO!O!OO!|$p:WaitState", kwlist, &driver,
                                     &device, &handle, &PyList_Type, &pool,
                                     &_acs_HistoryType.type, &history, &hooks,
                                     &_acs_FinderType.type, &finder, &record_first))
        return NULL;
    WaitStateObject *s = (WaitStateObject *)type->tp_alloc(type, 0);
    if (s == NULL) return NULL;
    s->driver = Py_NewRef(driver);
    s->device = Py_NewRef(device);
    s->handle = Py_NewRef(handle);
    s->pool = Py_NewRef(pool);
    s->history = Py_NewRef(history);
    s->hooks = Py_NewRef(hooks);
    s->finder = Py_NewRef(finder);
    s->record_first = record_first;
    return (PyObject *)s;
}

#define STATE_MEMBER(name, doc)                                                                 \
    {#name, T_OBJECT, offsetof(WaitStateObject, name), READONLY, doc}

static PyMemberDef WaitState_members[] = {
    STATE_MEMBER(driver, "The stream's driver."),
    STATE_MEMBER(device, "The stream's device ordinal."),
    STATE_MEMBER(handle, "The stream's handle."),
    STATE_MEMBER(pool, "The device's free events (a list)."),
    STATE_MEMBER(history, "The stream's History."),
    STATE_MEMBER(hooks, "What the wait calls back: closed_error(), query_failed(), drive()."),
    STATE_MEMBER(finder, "current_notifier()."),
    {"record_first", T_BOOL, offsetof(WaitStateObject, record_first), READONLY,
     "A default stream: its event is recorded before the checkpoint, and queried."},
    {NULL, 0, 0, 0, NULL},
};

static const Py_ssize_t WaitState_refs[] = {
    offsetof(WaitStateObject, driver),  offsetof(WaitStateObject, device),
    offsetof(WaitStateObject, handle),  offsetof(WaitStateObject, pool),
    offsetof(WaitStateObject, history), offsetof(WaitStateObject, hooks),
    offsetof(WaitStateObject, finder),  0,
};

AcsType _acs_WaitStateType = {
    .type = {
        ACS_TYPE_HEAD("_hotpath.WaitState", WaitStateObject, Py_TPFLAGS_HAVE_GC),
        .tp_doc = WaitState_doc,
        .tp_new = WaitState_new,
        .tp_members = WaitState_members,
        ACS_GC_SLOTS,
    },
    .refs = WaitState_refs,
};

/* ------------------------------------------------------------------ Counters */

static PyObject *Counters_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (acs_no_args("Counters", args, kwds) < 0) return NULL;
    return type->tp_alloc(type, 0); /* zeroed */
}

static PyMemberDef Counters_members[] = {
    {"completed", T_PYSSIZET, offsetof(CountersObject, completed), 0,
     "Waits that returned normally, counted by wait_complete()."},
    {"spinning", T_PYSSIZET, offsetof(CountersObject, spinning), 0,
     "Waits that spin now (max_spinners)."},
    {NULL, 0, 0, 0, NULL},
};

AcsType _acs_CountersType = {
    .type = {
        ACS_TYPE_HEAD("_hotpath.Counters", CountersObject, 0),
        .tp_doc = "Counters()\n--\n\nA notifier's counts that wait_complete() keeps.",
        .tp_new = Counters_new,
        .tp_members = Counters_members,
    },
};

int _acs_state_init(PyObject *module) {
    const AcsTypeEntry types[] = {
        {"WaitState", &_acs_WaitStateType.type},
        {"Counters", &_acs_CountersType.type},
        {NULL, NULL},
    };
    return acs_add_types(module, types);
}
