/*
 * History: how long the recent waits on one stream took, which sets how long the next one
 * spins (the spin window), and the newest point parked on the stream.
 */
#include "_hotpath.h"

/* The spin limit in force (Tuning.spin_limit): _tuning hands it over when it is imported and
 * whenever configure() changes it, so Tuning's default is the only one. */
static double spin_limit = 0.0;

PyDoc_STRVAR(History_doc, "History()\n--\n\nHow long the recent waits on one stream took, which "
             "sets how long the next one spins, and the newest point parked on it, which later "
             "waits may share.");
static PyObject *History_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (acs_no_args("History", args, kwds) < 0) return NULL;
    HistoryObject *h = (HistoryObject *)type->tp_alloc(type, 0);
    if (h == NULL) return NULL;
    h->newest = Py_NewRef(Py_None);
    h->recent = -1.0;
    h->unspun = 0;
    h->expect = -1.0;
    h->jitter = 0.0;
    h->lead = 0.0;
    h->spun = 0.0;
    h->closed = 0;
    return (PyObject *)h;
}

void _acs_learn(HistoryObject *h, double took) {
    double old = h->recent;
    if (old < 0 || (old > spin_limit && spin_limit >= took))
        h->recent = took;
    else
        h->recent = 0.75 * old + 0.25 * took;
}

static PyObject *History_learn(HistoryObject *h, PyObject *arg) {
    double took = PyFloat_AsDouble(arg);
    if (took == -1.0 && PyErr_Occurred()) return NULL;
    _acs_learn(h, took);
    Py_RETURN_NONE;
}

double _acs_spin_window(HistoryObject *h) {
    double limit = spin_limit, recent = h->recent;
    if (recent < 0) return limit;
    if (recent > limit) {
        if (h->unspun < PROBE_EVERY - 1) { /* also for any value set from outside */
            h->unspun++;
            return 0.0;
        }
        h->unspun = 0;
        return limit;
    }
    double window = 2.0 * recent + 20e-6;
    return window < limit ? window : limit;
}

static PyObject *History_spin_window(HistoryObject *h, PyObject *Py_UNUSED(ignored)) {
    return PyFloat_FromDouble(_acs_spin_window(h));
}

static const Py_ssize_t History_refs[] = {offsetof(HistoryObject, newest), 0};

static PyObject *History_get_newest(HistoryObject *h, void *Py_UNUSED(closure)) {
    return Py_NewRef(h->newest != NULL ? h->newest : Py_None);
}

static int History_set_newest(HistoryObject *h, PyObject *value, void *Py_UNUSED(closure)) {
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "newest cannot be deleted; set it to None");
        return -1;
    }
    Py_XSETREF(h->newest, Py_NewRef(value));
    return 0;
}

static PyMethodDef History_methods[] = {
    {"learn", (PyCFunction)History_learn, METH_O,
     "learn(took): add a wait that took `took` seconds. A moving average, except that a wait "
     "within spin_limit where the average said longer starts it over: a parked wait's time "
     "includes its wake-up, which can cost more than spin_limit itself, and without the reset "
     "one long wait would leave a stream of short work parking for good."},
    {"spin_window", (PyCFunction)History_spin_window, METH_NOARGS,
     "spin_window() -> float: how long the next wait may spin, from its start: up to "
     "spin_limit, about twice what the recent waits took. If they took longer than the limit, "
     "not at all, but for one wait in 16, which spins the whole limit: if it catches the work, "
     "the stream's waits are short again (see learn())."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef History_members[] = {
    {"recent", T_DOUBLE, offsetof(HistoryObject, recent), 0,
     "A moving average of the wait times in seconds; < 0: none yet."},
    {"unspun", T_INT, offsetof(HistoryObject, unspun), 0,
     "Waits that did not spin since the last that did."},
    {"expect", T_DOUBLE, offsetof(HistoryObject, expect), 0,
     "The predicted duration of the stream's long waits (those past the spin limit), in "
     "seconds; < 0: none yet. The wake-ahead of parked waits (_notifier/_ahead.py) keeps it."},
    {"jitter", T_DOUBLE, offsetof(HistoryObject, jitter), 0,
     "The mean error of `expect`, in seconds (_notifier/_ahead.py keeps it)."},
    {"lead", T_DOUBLE, offsetof(HistoryObject, lead), 0,
     "How long before the predicted end a parked wait's alarm is set, in seconds; 0: not "
     "learnt yet (_notifier/_ahead.py keeps it)."},
    {"spun", T_DOUBLE, offsetof(HistoryObject, spun), 0,
     "A moving average of how long waits spun after their alarms, in seconds "
     "(_notifier/_ahead.py keeps it)."},
    {"closed", T_BOOL, offsetof(HistoryObject, closed), 0,
     "True once the stream is closed or detached (Stream._claim() sets it): a wait past its "
     "first checkpoint then raises instead of querying the handle (wait_complete()). A plain field, "
     "read in C more cheaply than the stream's own attribute."},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef History_getset[] = {
    {"newest", (getter)History_get_newest, (setter)History_set_newest,
     "The newest point that a wait_complete() parked on, or None: a wait that began before "
     "its event was recorded joins it rather than recording one of its own "
     "(Notifier.shared_point()).",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

AcsType _acs_HistoryType = {
    .type = {
        ACS_TYPE_HEAD("_hotpath.History", HistoryObject, Py_TPFLAGS_HAVE_GC),
        .tp_doc = History_doc,
        .tp_new = History_new,
        ACS_GC_SLOTS,
        .tp_methods = History_methods,
        .tp_members = History_members,
        .tp_getset = History_getset,
    },
    .refs = History_refs,
};

PyObject *_acs_set_spin_limit(PyObject *Py_UNUSED(module), PyObject *arg) {
    double limit = PyFloat_AsDouble(arg);
    if (limit == -1.0 && PyErr_Occurred()) return NULL;
    if (!(limit >= 0.0)) { /* NaN included */
        PyErr_Format(PyExc_ValueError, "the spin limit must be >= 0, got %R", arg);
        return NULL;
    }
    spin_limit = limit;
    Py_RETURN_NONE;
}

PyObject *_acs_get_spin_limit(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored)) {
    return PyFloat_FromDouble(spin_limit);
}

int _acs_history_init(PyObject *module) {
    if (acs_add_type(module, "History", &_acs_HistoryType.type) < 0) return -1;
    return PyModule_AddIntConstant(module, "PROBE_EVERY", PROBE_EVERY);
}
