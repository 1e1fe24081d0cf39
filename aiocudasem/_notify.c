/*
 * The completion notifier: a host function that CUDA (or the simulated device) calls from its
 * own thread, plus the queue and the fd it reports through.
 *
 * The host function never takes the GIL and never calls CUDA. It appends the armed node to a
 * queue owned by C, and writes the wake-up fd only when the queue goes from "reported" to
 * "unreported", so a burst of completions costs one write and one loop wake-up.
 *
 * Lifetime: the fd belongs to the event loop and is closed by close(), at once, even while host
 * functions are still outstanding (a cancelled wait on a semaphore that is never signalled
 * leaves one outstanding forever). That is safe because the host function writes the fd only
 * while holding the lock and only if the state is not closed, and close() closes the fd under
 * the same lock: no write can reach an fd number that was closed and reused. The small state
 * struct itself lives until closed AND no armed host function is outstanding; if a host
 * function is never called (a device fault), the struct is leaked on purpose: a leak is better
 * than a write through a dangling pointer.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#endif

#include "_acs.h"

typedef struct state state_t;

typedef struct node {
    struct node *next;
    state_t *st;
    uint64_t token;
} node_t;

struct state {
    pthread_mutex_t lock;
    node_t *head;
    node_t *tail;
    uint64_t pending;  /* armed, not yet returned from the host function */
    uint64_t wakeups;  /* writes to the fd, for tests and statistics */
    uint64_t fired;    /* host functions called */
    int reported;      /* the fd holds a wake-up that drain() has not consumed yet */
    int closed;
    int rfd;
    int wfd;           /* == rfd for an eventfd */
};

static void free_list(node_t *n) {
    while (n) {
        node_t *next = n->next;
        free(n);
        n = next;
    }
}

static void close_fds(state_t *st) {
    /* Called with the lock held, once. */
    close(st->rfd);
    if (st->wfd != st->rfd) close(st->wfd);
    st->rfd = st->wfd = -1;
}

static void state_destroy(state_t *st) {
    /* Closed and nothing outstanding: the fds are already closed. */
    free_list(st->head);
    pthread_mutex_destroy(&st->lock);
    free(st);
}

static void wake_fd(int fd) {
#ifdef __linux__
    uint64_t one = 1;
    while (write(fd, &one, sizeof one) < 0 && errno == EINTR) {
    }
#else
    char one = 1;
    /* EAGAIN: the pipe is full, so a wake-up is already pending. */
    while (write(fd, &one, 1) < 0 && errno == EINTR) {
    }
#endif
}

static void drain_fd(int fd) {
#ifdef __linux__
    uint64_t v;
    while (read(fd, &v, sizeof v) < 0 && errno == EINTR) {
    }
#else
    char buf[64];
    for (;;) {
        ssize_t r = read(fd, buf, sizeof buf);
        if (r > 0) continue;
        if (r < 0 && errno == EINTR) continue;
        break;
    }
#endif
}

/* The CUhostFn. Called on the driver's (or the simulated device's) thread, without the GIL.
 * The fd is written under the lock: close() closes it under the same lock, so a write never
 * reaches a closed (and possibly reused) fd number. eventfd and pipe writes are non-blocking. */
static void host_fn(void *user_data) {
    node_t *n = (node_t *)user_data;
    state_t *st = n->st;
    int destroy;

    pthread_mutex_lock(&st->lock);
    st->fired++;
    if (st->closed) {
        free(n);
    } else {
        n->next = NULL;
        if (st->tail) st->tail->next = n; else st->head = n;
        st->tail = n;
        if (!st->reported) {
            st->reported = 1;
            st->wakeups++;
            wake_fd(st->wfd);
        }
    }
    st->pending--;
    destroy = st->closed && st->pending == 0;
    pthread_mutex_unlock(&st->lock);
    if (destroy) state_destroy(st);
}

/* ---------------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    state_t *st;
} NotifierObject;

static int make_fds(int *rfd, int *wfd) {
#ifdef __linux__
    int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0) return -1;
    *rfd = *wfd = fd;
    return 0;
#else
    int p[2];
    if (pipe(p) < 0) return -1;
    for (int i = 0; i < 2; i++) {
        fcntl(p[i], F_SETFL, fcntl(p[i], F_GETFL) | O_NONBLOCK);
        fcntl(p[i], F_SETFD, FD_CLOEXEC);
    }
    *rfd = p[0];
    *wfd = p[1];
    return 0;
#endif
}

static PyObject *Notifier_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (acs_no_args("Notifier", args, kwds) < 0) return NULL;
    NotifierObject *self = (NotifierObject *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    state_t *st = calloc(1, sizeof *st);
    if (!st) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    if (make_fds(&st->rfd, &st->wfd) < 0) {
        free(st);
        Py_DECREF(self);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    pthread_mutex_init(&st->lock, NULL);
    self->st = st;
    return (PyObject *)self;
}

static void notifier_close(NotifierObject *self) {
    state_t *st = self->st;
    if (!st) return;
    self->st = NULL;
    pthread_mutex_lock(&st->lock);
    st->closed = 1;
    node_t *queued = st->head;
    st->head = st->tail = NULL;
    close_fds(st);
    int destroy = st->pending == 0;
    pthread_mutex_unlock(&st->lock);
    free_list(queued);
    if (destroy) state_destroy(st);
}

static void Notifier_dealloc(NotifierObject *self) {
    notifier_close(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static state_t *open_state(NotifierObject *self) {
    if (!self->st) PyErr_SetString(PyExc_ValueError, "the notifier is closed");
    return self->st;
}

PyDoc_STRVAR(Notifier_arm_doc, "arm(token) -> int: allocate the host function's user data for one "
             "completion.");
static PyObject *Notifier_arm(NotifierObject *self, PyObject *arg) {
    state_t *st = open_state(self);
    if (!st) return NULL;
    unsigned long long token = PyLong_AsUnsignedLongLong(arg);
    if (token == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    node_t *n = malloc(sizeof *n);
    if (!n) return PyErr_NoMemory();
    n->next = NULL;
    n->st = st;
    n->token = token;
    pthread_mutex_lock(&st->lock);
    st->pending++;
    pthread_mutex_unlock(&st->lock);
    return PyLong_FromVoidPtr(n);
}

PyDoc_STRVAR(Notifier_disarm_doc, "disarm(user_data): release user data whose host function was "
             "never enqueued.");
static PyObject *Notifier_disarm(NotifierObject *self, PyObject *arg) {
    /* Undo arm() after the driver refused the launch: the host function will never run. */
    state_t *st = open_state(self);
    if (!st) return NULL;
    node_t *n = (node_t *)PyLong_AsVoidPtr(arg);
    if (!n && PyErr_Occurred()) return NULL;
    if (!n || n->st != st) {
        PyErr_SetString(PyExc_ValueError, "not a node armed by this notifier");
        return NULL;
    }
    free(n);
    pthread_mutex_lock(&st->lock);
    st->pending--;
    pthread_mutex_unlock(&st->lock);
    Py_RETURN_NONE;
}

static void put_back(state_t *st, node_t *n) {
    /* Return taken nodes to the head of the queue and make sure the fd says so. */
    if (!n) return;
    node_t *last = n;
    while (last->next) last = last->next;
    pthread_mutex_lock(&st->lock);
    last->next = st->head;
    st->head = n;
    if (!st->tail) st->tail = last;
    if (!st->reported && !st->closed) {
        st->reported = 1;
        wake_fd(st->wfd);
    }
    pthread_mutex_unlock(&st->lock);
}

PyDoc_STRVAR(Notifier_drain_doc, "drain() -> list[int]: consume the wake-up and return the "
             "completed tokens, oldest first.");
static PyObject *Notifier_drain(NotifierObject *self, PyObject *Py_UNUSED(ignored)) {
    state_t *st = open_state(self);
    if (!st) return NULL;
    /* Consume the fd before taking the queue: a completion queued after the read either lands
     * in the queue we take, or finds reported == 0 and writes the fd again. */
    drain_fd(st->rfd);
    pthread_mutex_lock(&st->lock);
    node_t *n = st->head;
    st->head = st->tail = NULL;
    st->reported = 0;
    pthread_mutex_unlock(&st->lock);

    Py_ssize_t count = 0;
    for (node_t *m = n; m; m = m->next) count++;
    PyObject *out = PyList_New(count);
    if (!out) {
        put_back(st, n); /* rather than lose completions */
        return NULL;
    }
    Py_ssize_t i = 0;
    for (node_t *m = n; m; m = m->next) {
        PyObject *tok = PyLong_FromUnsignedLongLong(m->token);
        if (!tok) {
            Py_DECREF(out);
            put_back(st, n);
            return NULL;
        }
        PyList_SET_ITEM(out, i++, tok);
    }
    free_list(n);
    return out;
}

/* test(st, token) under the lock of an open notifier, as a bool; False if closed (the
 * questions of any thread or loop that holds the GIL: queued(), fired(), kick()). */
static PyObject *locked_test(NotifierObject *self, int (*test)(state_t *, uint64_t),
                             uint64_t token) {
    state_t *st = self->st;
    if (!st) Py_RETURN_FALSE;
    pthread_mutex_lock(&st->lock);
    int yes = test(st, token);
    pthread_mutex_unlock(&st->lock);
    return PyBool_FromLong(yes);
}

/* Whether a completion waits in the queue: lets a coroutine that is not the drainer deliver it
 * without a read() of the fd when there is none (the usual case). */
static int is_queued(state_t *st, uint64_t Py_UNUSED(token)) {
    return st->head != NULL;
}

PyDoc_STRVAR(Notifier_queued_doc, "queued() -> bool: a completion is waiting for drain(); False if "
             "closed.");
static PyObject *Notifier_queued(NotifierObject *self, PyObject *Py_UNUSED(ignored)) {
    return locked_test(self, is_queued, 0);
}

/* Whether the host function armed with `token` has run and its token waits in the queue (not
 * drained yet). Another loop asks, for a point whose owner has not collected it: a scan of the
 * queue, which holds at most the host functions that fired since the owner last drained. */
static int has_fired(state_t *st, uint64_t token) {
    for (node_t *n = st->head; n; n = n->next)
        if (n->token == token) return 1;
    return 0;
}

PyDoc_STRVAR(Notifier_fired_doc, "fired(token) -> bool: its host function ran and the token waits "
             "for drain(); False if closed.");
static PyObject *Notifier_fired(NotifierObject *self, PyObject *arg) {
    unsigned long long token = PyLong_AsUnsignedLongLong(arg);
    if (token == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    return locked_test(self, has_fired, token);
}

/* Wake the loop's fd without a completion (a device fault, a fork). Safe from any thread that
 * holds the GIL; a closed notifier ignores it. */
static int wake_if_open(state_t *st, uint64_t Py_UNUSED(token)) {
    if (st->closed) return 0;
    wake_fd(st->wfd);
    return 1;
}

PyDoc_STRVAR(Notifier_kick_doc, "kick() -> bool: wake the fd without a completion; False if "
             "closed.");
static PyObject *Notifier_kick(NotifierObject *self, PyObject *Py_UNUSED(ignored)) {
    return locked_test(self, wake_if_open, 0);
}

PyDoc_STRVAR(Notifier_fileno_doc, "fileno() -> int: the wake-up fd.");
static PyObject *Notifier_fileno(NotifierObject *self, PyObject *Py_UNUSED(ignored)) {
    state_t *st = open_state(self);
    if (!st) return NULL;
    return PyLong_FromLong(st->rfd);
}

PyDoc_STRVAR(Notifier_close_doc, "close(): idempotent; closes the fd now, frees the state once no "
             "host function is outstanding.");
static PyObject *Notifier_close(NotifierObject *self, PyObject *Py_UNUSED(ignored)) {
    notifier_close(self);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(Notifier_stats_doc, "stats() -> dict: pending, wakeups and fired counters.");
static PyObject *Notifier_stats(NotifierObject *self, PyObject *Py_UNUSED(ignored)) {
    state_t *st = open_state(self);
    if (!st) return NULL;
    pthread_mutex_lock(&st->lock);
    unsigned long long pending = st->pending, wakeups = st->wakeups, fired = st->fired;
    pthread_mutex_unlock(&st->lock);
    return Py_BuildValue("{s:K,s:K,s:K}", "pending", pending, "wakeups", wakeups, "fired", fired);
}

static PyObject *Notifier_get_closed(NotifierObject *self, void *Py_UNUSED(closure)) {
    return PyBool_FromLong(self->st == NULL);
}

static PyMethodDef Notifier_methods[] = {
    {"arm", (PyCFunction)Notifier_arm, METH_O, Notifier_arm_doc},
    {"disarm", (PyCFunction)Notifier_disarm, METH_O, Notifier_disarm_doc},
    {"drain", (PyCFunction)Notifier_drain, METH_NOARGS, Notifier_drain_doc},
    {"queued", (PyCFunction)Notifier_queued, METH_NOARGS, Notifier_queued_doc},
    {"fired", (PyCFunction)Notifier_fired, METH_O, Notifier_fired_doc},
    {"kick", (PyCFunction)Notifier_kick, METH_NOARGS, Notifier_kick_doc},
    {"fileno", (PyCFunction)Notifier_fileno, METH_NOARGS, Notifier_fileno_doc},
    {"close", (PyCFunction)Notifier_close, METH_NOARGS, Notifier_close_doc},
    {"stats", (PyCFunction)Notifier_stats, METH_NOARGS, Notifier_stats_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Notifier_getset[] = {
    {"closed", (getter)Notifier_get_closed, NULL, "True after close().", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject NotifierType = {
    ACS_TYPE_HEAD("_notify.Notifier", NotifierObject, 0),
    .tp_doc = "A completion queue with one wake-up fd, filled by a GIL-free host function.",
    .tp_new = Notifier_new,
    .tp_dealloc = (destructor)Notifier_dealloc,
    .tp_methods = Notifier_methods,
    .tp_getset = Notifier_getset,
};


/* ------------------------------------------------------------------ the alarm */

/* A timer fd (Linux), which the event loop watches like any fd: set() makes it readable after a
 * delay, to the microsecond, where a loop's own timers round up to the millisecond (epoll_wait
 * takes milliseconds). The notifier wakes waits just ahead of their work's predicted end with it
 * (_notifier/_ahead.py). Elsewhere Alarm() raises OSError (ENOSYS) and nothing wakes ahead. */

typedef struct {
    PyObject_HEAD
    int fd; /* -1 once closed */
} AlarmObject;

static PyObject *Alarm_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (acs_no_args("Alarm", args, kwds) < 0) return NULL;
#ifdef __linux__
    int fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (fd < 0) return PyErr_SetFromErrno(PyExc_OSError);
    AlarmObject *self = (AlarmObject *)type->tp_alloc(type, 0);
    if (!self) {
        close(fd);
        return NULL;
    }
    self->fd = fd;
    return (PyObject *)self;
#else
    errno = ENOSYS;
    return PyErr_SetFromErrno(PyExc_OSError);
#endif
}

static void Alarm_dealloc(AlarmObject *self) {
    if (self->fd >= 0) close(self->fd);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int alarm_open(AlarmObject *self) {
    if (self->fd >= 0) return 0;
    PyErr_SetString(PyExc_ValueError, "the alarm is closed");
    return -1;
}

PyDoc_STRVAR(Alarm_set_doc, "set(delay): make the fd readable `delay` seconds from now (a delay "
             "<= 0: at once), replacing any earlier setting; set(None) disarms it. Reading is "
             "clear()'s.");
static PyObject *Alarm_set(AlarmObject *self, PyObject *arg) {
    if (alarm_open(self) < 0) return NULL;
#ifdef __linux__
    struct itimerspec its = {{0, 0}, {0, 0}};
    if (arg != Py_None) {
        double delay = PyFloat_AsDouble(arg);
        if (delay == -1.0 && PyErr_Occurred()) return NULL;
        if (delay != delay) {
            PyErr_SetString(PyExc_ValueError, "the alarm's delay is NaN");
            return NULL;
        }
        if (delay > 86400.0) delay = 86400.0;
        long long ns = delay > 0 ? (long long)(delay * 1e9) : 0;
        if (ns < 1) ns = 1; /* 0 would disarm it */
        its.it_value.tv_sec = (time_t)(ns / 1000000000LL);
        its.it_value.tv_nsec = (long)(ns % 1000000000LL);
    }
    if (timerfd_settime(self->fd, 0, &its, NULL) < 0) return PyErr_SetFromErrno(PyExc_OSError);
#endif
    Py_RETURN_NONE;
}

PyDoc_STRVAR(Alarm_clear_doc, "clear() -> bool: consume the expiry, if any, so that the fd is no "
             "longer readable; whether it had expired. Non-blocking.");
static PyObject *Alarm_clear(AlarmObject *self, PyObject *Py_UNUSED(ignored)) {
    if (alarm_open(self) < 0) return NULL;
    uint64_t n = 0;
    ssize_t r = read(self->fd, &n, sizeof n);
    if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        return PyErr_SetFromErrno(PyExc_OSError);
    return PyBool_FromLong(r == (ssize_t)sizeof n && n > 0);
}

static PyObject *Alarm_fileno(AlarmObject *self, PyObject *Py_UNUSED(ignored)) {
    if (alarm_open(self) < 0) return NULL;
    return PyLong_FromLong(self->fd);
}

static PyObject *Alarm_close(AlarmObject *self, PyObject *Py_UNUSED(ignored)) {
    if (self->fd >= 0) {
        close(self->fd);
        self->fd = -1;
    }
    Py_RETURN_NONE;
}

static PyObject *Alarm_get_closed(AlarmObject *self, void *Py_UNUSED(closure)) {
    return PyBool_FromLong(self->fd < 0);
}

static PyMethodDef Alarm_methods[] = {
    {"set", (PyCFunction)Alarm_set, METH_O, Alarm_set_doc},
    {"clear", (PyCFunction)Alarm_clear, METH_NOARGS, Alarm_clear_doc},
    {"fileno", (PyCFunction)Alarm_fileno, METH_NOARGS, "fileno() -> int: the timer fd."},
    {"close", (PyCFunction)Alarm_close, METH_NOARGS, "close(): close the fd. Idempotent."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Alarm_getset[] = {
    {"closed", (getter)Alarm_get_closed, NULL, "True after close().", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject AlarmType = {
    ACS_TYPE_HEAD("_notify.Alarm", AlarmObject, 0),
    .tp_doc = "A timer fd that an event loop watches: readable after the delay set (Linux).",
    .tp_new = Alarm_new,
    .tp_dealloc = (destructor)Alarm_dealloc,
    .tp_methods = Alarm_methods,
    .tp_getset = Alarm_getset,
};


/* ------------------------------------------------------------------ the asyncio checkpoint */

/* What asyncio.sleep(0) does at its heart: one bare yield, which an asyncio task takes as "run
 * me again on the loop's next pass". yield_once() returns a fresh awaitable that is its own
 * iterator: the first step yields None, the next ends it. Unlike a generator it holds no
 * references, so the garbage collector does not track it: an await that passes a checkpoint
 * leaves nothing for the collector to count or traverse. A task cancelled meanwhile throws into
 * the awaiting coroutine, where the exception is raised at the await (this iterator has no
 * throw() of its own). */

typedef struct {
    AcsAwait head; /* state: 1 once it yielded */
} YieldObject;

static AcsType YieldType;

static PyObject *yield_once(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored)) {
    YieldObject *y = PyObject_New(YieldObject, &YieldType.type);
    if (y != NULL) y->head.state = y->head.executing = 0;
    return (PyObject *)y;
}

/* The step: the yield, then the end (None, the await's value). */
static PySendResult Yield_step(PyObject *self, PyObject *Py_UNUSED(arg), PyObject **result) {
    YieldObject *y = (YieldObject *)self;
    *result = Py_NewRef(Py_None);
    if (y->head.state) return PYGEN_RETURN;
    y->head.state = 1;
    return PYGEN_NEXT;
}

/* close(): no yield left. */
static int Yield_end(PyObject *self) {
    ((YieldObject *)self)->head.state = 1;
    return 0;
}

static const AcsAwaitHooks Yield_hooks = {.name = "yield_once()", .end = Yield_end};

/* send(value) and close(), as a generator has them, for a driver of the awaiting coroutine that
 * sends a value other than None (the interpreter calls send() then) or closes it: the value is
 * ignored, as the bare yield of a generator ignores it. No throw(): an exception thrown into the
 * awaiting coroutine is raised at its await. */
static PyMethodDef Yield_methods[] = {
    {"send", acs_await_send, METH_O, "send(value): as next(); the value is ignored."},
    {"close", acs_await_close, METH_NOARGS, "close(): end without yielding."},
    {NULL, NULL, 0, NULL},
};

static PyAsyncMethods Yield_async = {
    .am_await = acs_return_self,
    .am_send = Yield_step,
};

static AcsType YieldType = {
    .type = {
        ACS_TYPE_HEAD("_notify.Yield", YieldObject, 0),
        .tp_doc = "One bare yield to an asyncio task (see yield_once()).",
        .tp_as_async = &Yield_async,
        .tp_iter = acs_return_self,
        .tp_iternext = acs_await_next,
        .tp_methods = Yield_methods,
    },
    .await = &Yield_hooks,
};

static PyMethodDef module_methods[] = {
    {"yield_once", yield_once, METH_NOARGS,
     "yield_once() -> Awaitable[None]: one bare yield to an asyncio task, as asyncio.sleep(0)."},
    {NULL, NULL, 0, NULL},
};

static int notify_init(PyObject *m) {
    const AcsTypeEntry types[] = {
        {"Notifier", &NotifierType},
        {"Alarm", &AlarmType},
        {NULL, &YieldType.type}, /* only yield_once() makes one */
        {NULL, NULL},
    };
    if (acs_add_types(m, types) < 0) return -1;
    return PyModule_AddObject(m, "HOST_FN", PyLong_FromVoidPtr((void *)host_fn));
}

ACS_MODULE(_notify, "GIL-free CUDA host function and completion queue.", module_methods,
           notify_init)
